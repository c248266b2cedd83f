//! What follows a step's command: `on_failure` handlers, and `on_success`/`on_exit_code` steps
//! with the checks after a success.

use crate::message::Message;
use prodigy_plan::{PlanCommand, PlanStep};
use serde_json::{Value, json};

use crate::exec::Output;
use crate::machine::Outcome;
use crate::runner::Runner;
use crate::vars::Vars;

/// How the checks after a successful run ended.
pub(crate) enum Checks {
    /// Every check passed; the step's outcome so far.
    Passed(Outcome),
    /// A check failed the run, for this reason.
    Failed(String),
    /// `validate` ended the step with this outcome.
    Ended(Outcome),
}

impl Runner {
    /// Runs the `on_failure` handler after run RUN failed: whether it succeeded, and what its
    /// commands printed (their stdout, one after the other). CHECK says why a check after a
    /// successful command failed the run (`${error.message}`), when that is how it failed.
    pub(crate) async fn handle_failure(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        run: u32,
        last: Option<&Output>,
        check: Option<&str>,
    ) -> (bool, String) {
        let Some(on_failure) = &step.on_failure else {
            return (true, String::new());
        };
        let error = last.map_or_else(|| json!({}), |o| {
            let mut error = json!({"message": o.failure_message(), "exit_code": o.code.unwrap_or(-1), "step": step.label, "timestamp": crate::store::timestamp()});
            // A `claude` step can fail with no failed call (its call succeeded but a check
            // after it failed): `${error.kind}`, which check promises its handlers, is then
            // `unknown`.
            let claude_step = matches!(step.command, PlanCommand::Claude(_));
            if let Some(kind) = o
                .claude_error()
                .or(claude_step.then_some(crate::claude::ErrorKind::Unknown))
            {
                error["kind"] = json!(kind.name());
                error["type"] = json!(kind.name());
            }
            error
        });
        let mut error = error;
        if let (Some(why), Some(fields)) = (check, error.as_object_mut()) {
            fields.insert("message".to_owned(), json!(why));
        }
        vars.set("error", error);
        vars.set("attempt", json!(run));
        self.record(&crate::events::Event::HandlerStarted {
            step: step.label.clone(),
            run,
            strategy: on_failure.strategy,
        });
        let head_before = if on_failure.commit_required {
            crate::worktree::facts::head(&self.workdir()).await
        } else {
            None
        };
        let mut ok = true;
        let mut combined = String::new();
        for &id in &on_failure.handler {
            let continue_on_error = self.plan.step(id).is_some_and(|s| s.continue_on_error);
            vars.last_output = None;
            let outcome = self.run_step(id, vars, None).await;
            if let Some(output) = &vars.last_output {
                if !combined.is_empty() {
                    combined.push('\n');
                }
                combined.push_str(output);
            }
            if !matches!(
                outcome,
                Outcome::Succeeded | Outcome::Recovered | Outcome::Ignored | Outcome::Skipped
            ) && !continue_on_error
            {
                ok = false;
                break;
            }
        }
        if ok
            && on_failure.commit_required
            && self
                .made_commit(step, "the handler of ", head_before.as_deref())
                .await
                .is_err()
        {
            ok = false;
        }
        for name in &on_failure.capture {
            vars.set(name.clone(), Value::String(combined.clone()));
        }
        vars.values.remove("error");
        self.record(&crate::events::Event::HandlerFinished {
            step: step.label.clone(),
            run,
            success: ok,
        });
        (ok, combined)
    }

    /// The checks after a successful run, on its output OUT: `capture`, `step_validate`,
    /// `validate`, `auto_commit`, `commit_required`, in that order. Each failure is said and
    /// recorded where it happens.
    pub(crate) async fn checks(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        out: &Output,
        head_before: Option<&str>,
        mut outcome: Outcome,
    ) -> Checks {
        if let Err(why) = self.capture(step, vars, out) {
            self.capture_failed(step, &why);
            return Checks::Failed(why.to_string());
        }
        if let Some(checks) = &step.step_validate
            && !checks.skip
            && !self.step_validate(step, checks, vars).await
        {
            if !checks.ignore_failure {
                return Checks::Failed(format!("`step_validate` of `{}` failed", step.label));
            }
            self.say(Message::StepValidateFailed {
                label: step.label.clone(),
                ignored: true,
            });
        }
        if let Some(validate) = &step.validate {
            outcome = self.validate(step, validate, vars, outcome).await;
            if !outcome.continues() {
                return Checks::Ended(outcome);
            }
        }
        if step.auto_commit
            && let Err(why) = self.commit(step, vars, head_before).await
        {
            let why = why.to_string();
            self.record(&crate::events::Event::StepFailed {
                step: step.label.clone(),
                error: why.clone(),
            });
            self.say(Message::CommitFailed(why.clone()));
            return Checks::Failed(why);
        }
        if step.commit_required
            && let Err(why) = self.made_commit(step, "", head_before).await
        {
            return Checks::Failed(why.to_string());
        }
        Checks::Passed(outcome)
    }

    /// Says and records that `capture` failed: WHY.
    pub(crate) fn capture_failed(&self, step: &PlanStep, why: &crate::step::CaptureError) {
        let why = why.to_string();
        self.say(Message::CaptureFailed(why.clone()));
        self.record(&crate::events::Event::CaptureFailed {
            step: step.label.clone(),
            error: why,
        });
    }

    /// What follows a successful run whose checks passed: the `outputs` of its commits and
    /// `on_success`.
    pub(crate) async fn after_checks(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        head_before: Option<String>,
        outcome: Outcome,
    ) -> Outcome {
        if let (Some(id), Some(before)) = (&step.step_id, &head_before)
            && !step.outputs.is_empty()
        {
            let changed = crate::worktree::facts::changes(&self.workdir(), before).await;
            let files: Vec<&str> = changed["files_changed"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut outputs = serde_json::Map::new();
            for output in &step.outputs {
                let matcher = globset::Glob::new(&output.file_pattern.value)
                    .map(|g| g.compile_matcher())
                    .ok();
                let matching: Vec<&str> = files
                    .iter()
                    .copied()
                    .filter(|f| matcher.as_ref().is_some_and(|m| m.is_match(f)))
                    .collect();
                outputs.insert(output.name.value.clone(), json!(matching));
            }
            vars.set(id.clone(), Value::Object(outputs));
        }
        if !step.on_success.is_empty() {
            self.record(&crate::events::Event::SuccessHandlerStarted {
                step: step.label.clone(),
            });
            return self.run_triggered(&step.on_success, vars, outcome).await;
        }
        outcome
    }
}
