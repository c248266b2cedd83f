//! What follows a step's command: `on_failure` handlers, and `on_success`/`on_exit_code` steps
//! with the checks after a success.

use crate::message::Message;
use prodigy_compiler::plan::{PlanCommand, PlanStep};
use serde_json::{Value, json};

use crate::exec::Output;
use crate::machine::Outcome;
use crate::runner::Runner;
use crate::step::failed;
use crate::vars::Vars;

impl Runner {
    /// Runs the `on_failure` handler after run RUN failed: whether it succeeded, and what its
    /// commands printed (their stdout, one after the other).
    pub(crate) async fn handle_failure(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        run: u32,
        last: Option<&Output>,
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
        vars.set("error", error);
        vars.set("attempt", json!(run));
        self.record(&crate::events::Event::HandlerStarted {
            step: step.label.clone(),
            run,
            strategy: on_failure.strategy,
        });
        let head_before = if on_failure.commit_required {
            crate::git::head(&self.workdir()).await
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
            && !self
                .made_commit(step, "the handler of ", head_before.as_deref())
                .await
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

    /// Validation, commits and `on_success` after a successful run.
    pub(crate) async fn after_success(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        head_before: Option<String>,
        mut outcome: Outcome,
    ) -> Outcome {
        if let Some(checks) = &step.step_validate
            && !checks.skip
            && !self.step_validate(step, checks, vars).await
        {
            if !checks.ignore_failure {
                return failed(step);
            }
            self.say(Message::step_warning(format!(
                "`step_validate` of `{}` failed; ignored (`ignore_validation_failure`)",
                step.label
            )));
        }
        if let Some(validate) = &step.validate {
            outcome = self.validate(step, validate, vars, outcome).await;
            if !outcome.continues() {
                return outcome;
            }
        }
        if step.auto_commit
            && let Err(why) = self.commit(step, vars, head_before.as_deref()).await
        {
            self.record(&crate::events::Event::StepFailed {
                step: step.label.clone(),
                error: why.clone(),
            });
            self.say(Message::step_error(why.clone()));
            return failed(step);
        }
        if step.commit_required && !self.made_commit(step, "", head_before.as_deref()).await {
            return failed(step);
        }
        if let (Some(id), Some(before)) = (&step.step_id, &head_before)
            && !step.outputs.is_empty()
        {
            let changed = crate::git::changes(&self.workdir(), before).await;
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
