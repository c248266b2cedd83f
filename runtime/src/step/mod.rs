//! The step driver: runs one step as its [`StepMachine`] says, and lists of steps in order.

use crate::message::Message;
use std::time::Duration;

use futures::future::LocalBoxFuture as BoxFuture;
use prodigy_compiler::plan::{Exhausted, OnRetry, PlanCommand, PlanStep, StepId};
use serde_json::json;

use crate::events::Event;
use crate::exec::{self, Output};
use crate::lock;
use crate::machine::{Action, Outcome, StepEvent, StepMachine};
use crate::runner::{Runner, StepFailure, fields};
use crate::step::handlers::Checks;
use crate::vars::Vars;

mod capture;
mod commit;
mod execute;
mod foreach;
mod handlers;
mod limit;
mod validate;

pub(crate) use capture::*;
pub(crate) use limit::{ClaudeLimitState, halting};

impl Runner {
    /// Runs one step to its outcome; its output and how it ended are kept in the run's logs
    /// (docs/running.md, "Logs").
    pub fn run_step<'a>(
        &'a self,
        id: StepId,
        vars: &'a mut Vars,
        index: Option<usize>,
    ) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let Some(step) = self.plan.step(id) else {
                return Outcome::Failed;
            };
            if self.cancelled() {
                return Outcome::Cancelled;
            }
            let began = self.started.elapsed();
            let mut log = self.step_log(step, index);
            let outcome = self.step_body(step, vars, index, log.as_mut()).await;
            if let Some(mut log) = log {
                let outcome_name = serde_json::to_value(outcome)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                let path = log.record_path();
                let error = log.error.take();
                let written =
                    log.finish(&outcome_name, self.started.elapsed().saturating_sub(began));
                if let Some(e) = error.or(written.err()) {
                    self.say(Message::step_warning(format!(
                        "cannot keep the step's output in {}: {e}",
                        path.with_extension("log").display()
                    )));
                }
            }
            outcome
        })
    }

    /// The log of STEP's output in the run's logs, numbered in its owner's directory; none
    /// for a run that keeps nothing (`--dry-run`).
    fn step_log(&self, step: &PlanStep, index: Option<usize>) -> Option<crate::logs::StepLog> {
        if self.session.is_empty() {
            return None;
        }
        let dir = self.log_dir();
        let number = {
            let mut numbers = lock(&self.step_numbers);
            let last = numbers
                .entry(dir.clone())
                .or_insert_with(|| crate::logs::last_step_number(&dir));
            *last += 1;
            *last
        };
        let mut log = crate::logs::StepLog::new(dir, number, step.label.clone());
        let plan = &self.plan;
        let id = step.id;
        let phase = index.and_then(|_| {
            if plan.commands.contains(&id) {
                Some("steps")
            } else if plan.setup.as_ref().is_some_and(|s| s.steps.contains(&id)) {
                Some("setup")
            } else if plan.map.as_ref().is_some_and(|m| m.steps.contains(&id)) {
                Some("map")
            } else if plan.reduce.contains(&id) {
                Some("reduce")
            } else if plan
                .merge
                .as_ref()
                .is_some_and(|m| m.steps.contains(&id) || m.on_conflict.contains(&id))
            {
                Some("merge")
            } else {
                None
            }
        });
        log.place(phase, index);
        Some(log)
    }

    /// Runs STEP to its outcome; LOG keeps what its commands print.
    async fn step_body(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        index: Option<usize>,
        mut log: Option<&mut crate::logs::StepLog>,
    ) -> Outcome {
        let id = step.id;
        {
            // A step of a phase (`index` given): `step.name`/`step.index` describe it; the
            // git fields describe the last one.
            if let Some(index) = index {
                vars.merge("step", fields(json!({"name": step.label, "index": index})));
            }
            if let Some(description) = &step.description {
                self.say(Message::Description(description.clone()));
            }
            self.record(&Event::StepStarted {
                step: step.label.clone(),
                step_index: index,
                step_id: id.0,
                origin: self.origin(step),
            });
            let mut machine =
                StepMachine::new(step.retry_policy().clone(), step.handler_policy.clone());
            if let Some(when) = &step.when {
                match when.parsed.test(vars) {
                    Ok(true) => {}
                    Ok(false) => {
                        self.record(&Event::StepSkipped {
                            step: step.label.clone(),
                            when: when.value.clone(),
                        });
                        self.say(Message::Skipped {
                            when: when.value.clone(),
                            reason: when.parsed.mismatch(vars),
                        });
                        let action = machine.on_event(
                            StepEvent::Skip,
                            self.started.elapsed(),
                            &mut *lock(&self.rng),
                        );
                        return match action {
                            Action::Finish(outcome) => outcome,
                            other => self.invalid(step, &machine, &other),
                        };
                    }
                    Err(e) => {
                        self.record(&Event::StepFailed {
                            step: step.label.clone(),
                            error: format!("when: {e}"),
                        });
                        self.say(Message::step_error(format!(
                            "`when` of `{}`: {e}",
                            step.label
                        )));
                        return Outcome::Failed;
                    }
                }
            }
            let head_before =
                if step.commit_required || step.auto_commit || !step.outputs.is_empty() {
                    crate::git::head(&self.workdir()).await
                } else {
                    None
                };
            let mut last: Option<Output> = None;
            // The output of a `strategy: fallback` handler that succeeded after the last run:
            // when it recovers the step, it stands in for the command's.
            let mut fallback_result: Option<Output> = None;
            // Why the checks after the last successful run failed it, while that is how the
            // step stands (`${error.message}` for the handler, the item's DLQ message).
            let mut check_error: Option<String> = None;
            // The outcome of the checks that passed; whether `capture` already ran on `last`.
            let mut checked: Option<Outcome> = None;
            let mut captured = false;
            let mut action = machine.on_event(
                StepEvent::Start,
                self.started.elapsed(),
                &mut *lock(&self.rng),
            );
            let mut outcome = loop {
                match action {
                    Action::Spawn { run, attempt } => {
                        // A retry: `on_retry: continue` goes on with the failed attempt's
                        // session, and the step's own prompt reads that attempt's `claude.*`
                        // (a handler's calls in between do not change them).
                        let resume = last
                            .as_ref()
                            .and_then(|o| continuation(step, o, check_error.as_deref()));
                        if matches!(step.command, PlanCommand::Claude(_)) {
                            match &last {
                                Some(failed) => set_claude_vars(vars, failed),
                                None => claude_vars_or_empty(vars),
                            }
                        }
                        fallback_result = None;
                        check_error = None;
                        captured = false;
                        self.record(&Event::AttemptStarted {
                            step: step.label.clone(),
                            run,
                            attempt,
                        });
                        let out = self.execute(step, vars, resume.as_ref()).await;
                        if let Some(log) = log.as_deref_mut() {
                            let header = if run > 1 {
                                format!("[prodigy: run {run}, attempt {attempt}]")
                            } else {
                                format!("[prodigy: attempt {attempt}]")
                            };
                            self.keep_output(log, &header, &out);
                        }
                        self.record(&Event::AttemptFinished {
                            step: step.label.clone(),
                            run,
                            attempt,
                            exit_code: out.code,
                            timed_out: out.timed_out,
                            success: out.exit().success(),
                            duration_secs: out.duration.as_secs_f64(),
                        });
                        self.show_output(step, &out);
                        set_last_command(vars, step, &out);
                        let event = if out.cancelled {
                            StepEvent::Cancel
                        } else {
                            StepEvent::Exited(out.exit())
                        };
                        last = Some(out);
                        action =
                            machine.on_event(event, self.started.elapsed(), &mut *lock(&self.rng));
                    }
                    Action::Wait { delay, next } => {
                        self.record(&Event::RetryScheduled {
                            step: step.label.clone(),
                            next_attempt: next,
                            delay_secs: delay.as_secs_f64(),
                        });
                        self.say(Message::Retrying {
                            // Shown to the millisecond.
                            delay: Duration::from_millis(
                                u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                            ),
                            attempt: next,
                        });
                        let mut cancel = self.cancel_rx();
                        let event = tokio::select! {
                            () = tokio::time::sleep(delay) => StepEvent::TimerFired,
                            () = exec::cancelled(&mut cancel) => StepEvent::Cancel,
                        };
                        action =
                            machine.on_event(event, self.started.elapsed(), &mut *lock(&self.rng));
                    }
                    Action::RunFallback => {
                        // The machine asks for it only under `Exhausted::Fallback`.
                        let out = match &step.retry_policy().exhausted {
                            Exhausted::Fallback(t) => {
                                self.record(&Event::FallbackStarted {
                                    step: step.label.clone(),
                                });
                                self.run_command(&exec::shell, t, step, vars, true).await
                            }
                            Exhausted::Stop | Exhausted::Continue => {
                                Output::error("internal error: no fallback command")
                            }
                        };
                        if let Some(log) = log.as_deref_mut() {
                            self.keep_output(log, "[prodigy: fallback command]", &out);
                        }
                        self.show_output(step, &out);
                        set_last_command(vars, step, &out);
                        let event = StepEvent::Exited(out.exit());
                        check_error = None;
                        captured = false;
                        last = Some(out);
                        action =
                            machine.on_event(event, self.started.elapsed(), &mut *lock(&self.rng));
                    }
                    Action::Check => {
                        let Some(out) = &last else {
                            break self.invalid(step, &machine, &Action::Check);
                        };
                        captured = true;
                        let checks = self
                            .checks(step, vars, out, head_before.as_deref(), Outcome::Succeeded)
                            .await;
                        if self.cancelled() {
                            break Outcome::Cancelled;
                        }
                        let ok = match checks {
                            Checks::Passed(outcome) => {
                                checked = Some(outcome);
                                true
                            }
                            Checks::Failed(why) => {
                                check_error = Some(why);
                                false
                            }
                            Checks::Ended(outcome) => break outcome,
                        };
                        action = machine.on_event(
                            StepEvent::Checked { ok },
                            self.started.elapsed(),
                            &mut *lock(&self.rng),
                        );
                    }
                    Action::RunHandler { run } => {
                        let (ok, handler_output) = self
                            .handle_failure(step, vars, run, last.as_ref(), check_error.as_deref())
                            .await;
                        if self.cancelled() {
                            break Outcome::Cancelled;
                        }
                        let fallback = step.handler_policy.recovers;
                        fallback_result = (ok && fallback).then(|| Output {
                            stdout: handler_output,
                            code: Some(0),
                            ..Output::default()
                        });
                        action = machine.on_event(
                            StepEvent::HandlerDone { ok },
                            self.started.elapsed(),
                            &mut *lock(&self.rng),
                        );
                    }
                    Action::Finish(outcome) => break outcome,
                    Action::Kill => break Outcome::Cancelled,
                    Action::Invalid => break self.invalid(step, &machine, &Action::Invalid),
                }
            };
            if let (Outcome::Succeeded, Some(passed)) = (outcome, checked) {
                outcome = passed;
            }
            if outcome == Outcome::Recovered
                && let Some(result) = fallback_result.take()
            {
                last = Some(result);
                captured = false;
            }
            // A recovery (a fallback's output standing in for the command's) is checked as a
            // success is, but a failed check has no run left to fail: the step fails.
            if let (Outcome::Recovered, Some(out)) = (outcome, &last) {
                captured = true;
                outcome = match self
                    .checks(step, vars, out, head_before.as_deref(), outcome)
                    .await
                {
                    Checks::Passed(outcome) | Checks::Ended(outcome) => outcome,
                    Checks::Failed(why) => {
                        check_error = Some(why);
                        failed(step)
                    }
                };
            }
            // The output of a failed run is captured too; a value that does not fit its
            // format is said, and the failure stays what it is.
            if let Some(out) = &last
                && !captured
                && outcome != Outcome::Cancelled
                && let Err(why) = self.capture(step, vars, out)
            {
                self.capture_failed(step, &why);
            }
            if matches!(outcome, Outcome::Succeeded | Outcome::Recovered) {
                outcome = self.after_checks(step, vars, head_before, outcome).await;
            }
            // `on_exit_code` handlers run for the code the command ended with, whether the
            // step goes on or fails (a failed step stays failed).
            if let (Some(out), true) = (&last, outcome != Outcome::Cancelled) {
                for (code, steps) in &step.on_exit_code {
                    if out.code == Some(*code) {
                        self.record(&Event::ExitCodeHandlerStarted {
                            step: step.label.clone(),
                            exit_code: *code,
                        });
                        outcome = self.run_triggered(steps, vars, outcome).await;
                    }
                }
            }
            // A map agent's own steps are the ones run with an index in an agent's scope
            // (`run_agent_steps`); what they trigger runs as a list, without one.
            let agent_step =
                index.is_some() && self.agent().is_some_and(|a| !a.agent_id.is_empty());
            self.record(&Event::StepFinished {
                step: step.label.clone(),
                outcome: crate::events::StepOutcome::of(outcome, agent_step),
                origin: self.origin(step),
            });
            // A failure that fails the workflow, or one that was only handled: in a map agent
            // both fail the item.
            if !outcome.continues_agent() && outcome != Outcome::Cancelled {
                let detail = last
                    .as_ref()
                    .map(|o| {
                        let line = o.failure_message().trim().lines().last().unwrap_or("");
                        match o.claude_error() {
                            Some(kind) => {
                                let advice = kind
                                    .advice()
                                    .map_or_else(String::new, |a| format!(" ({a})"));
                                format!("Claude `{kind}` error: {line}{advice}")
                            }
                            None => line.to_owned(),
                        }
                    })
                    .unwrap_or_default();
                if let Some(a) = self.agent() {
                    *a.failure.borrow_mut() = Some(StepFailure {
                        step: step_text(step),
                        message: check_error.as_deref().map_or_else(
                            || {
                                last.as_ref().map_or_else(
                                    || "the step failed".to_owned(),
                                    |o| tail(o.failure_message(), 20),
                                )
                            },
                            |why| tail(why, 20),
                        ),
                        error_type: error_type(step, last.as_ref()),
                        output: last.as_ref().map(|o| crate::dlq::CommandTail {
                            exit_code: o.code,
                            stdout: tail(&o.stdout, crate::dlq::CommandTail::LINES),
                            stderr: tail(&o.stderr, crate::dlq::CommandTail::LINES),
                        }),
                        log: last
                            .as_ref()
                            .and_then(|o| o.claude.as_ref())
                            .and_then(|c| c.log.clone()),
                    });
                }
                let in_agent = self.agent().is_some_and(|a| !a.agent_id.is_empty());
                self.say(Message::StepFailed {
                    label: step.label.clone(),
                    detail,
                    continued: outcome == Outcome::FailedContinued && !in_agent,
                });
            }
            outcome
        }
    }

    /// Adds what a command of a step printed to the step's LOG, secrets masked.
    fn keep_output(&self, log: &mut crate::logs::StepLog, header: &str, out: &Output) {
        let claude_log = out.claude.as_ref().and_then(|c| c.log.as_deref());
        log.command(header, &self.mask(&out.combined()), claude_log);
    }

    /// A step machine answered what cannot happen: an internal error, recorded and shown,
    /// and the step fails.
    pub(crate) fn invalid(
        &self,
        step: &PlanStep,
        machine: &StepMachine,
        action: &Action,
    ) -> Outcome {
        self.record(&Event::InternalError {
            step: step.label.clone(),
            state: format!("{:?}", machine.state()),
            action: format!("{action:?}"),
        });
        self.say(Message::internal(format!(
            "step `{}` reached a state that cannot happen; please report it",
            step.label
        )));
        Outcome::Failed
    }

    /// Runs the steps of a phase (the `merge` steps) in order, each with its index as
    /// `step.index`: `Succeeded`, or the outcome of the step that ended the list.
    pub(crate) async fn run_phase(&self, steps: &[StepId], vars: &mut Vars) -> Outcome {
        for (index, &id) in steps.iter().enumerate() {
            let outcome = self.run_step(id, vars, Some(index)).await;
            if !outcome.continues() {
                return outcome;
            }
        }
        Outcome::Succeeded
    }

    /// Runs a map agent's template like [`Self::run_phase`], except that a failure that was
    /// only handled (`FailedContinued`) ends the agent: its item fails.
    pub(crate) async fn run_agent_steps(&self, steps: &[StepId], vars: &mut Vars) -> Outcome {
        for (index, &id) in steps.iter().enumerate() {
            let outcome = self.run_step(id, vars, Some(index)).await;
            if !outcome.continues_agent() {
                return outcome;
            }
        }
        Outcome::Succeeded
    }

    /// Runs a list of steps in order: `Succeeded`, or the outcome (`Failed`, `Cancelled`)
    /// of the step that ended the list.
    pub(crate) fn run_list<'a>(
        &'a self,
        steps: &'a [StepId],
        vars: &'a mut Vars,
    ) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            for &id in steps {
                let outcome = self.run_step(id, vars, None).await;
                // A command with `continue_on_error` (validation and `on_incomplete` lists)
                // does not end the list; an interrupt always does.
                let tolerated = outcome != Outcome::Cancelled
                    && self.plan.step(id).is_some_and(|s| s.continue_on_error);
                if !outcome.continues() && !tolerated {
                    return outcome;
                }
            }
            Outcome::Succeeded
        })
    }

    /// Runs the steps a step triggers (`on_success`, `on_exit_code`, `on_incomplete`): a
    /// failure among them fails the step, and an interrupt stays an interrupt.
    pub(crate) async fn run_triggered(
        &self,
        steps: &[StepId],
        vars: &mut Vars,
        outcome: Outcome,
    ) -> Outcome {
        match self.run_list(steps, vars).await {
            Outcome::Cancelled => Outcome::Cancelled,
            ended if ended.continues() => outcome,
            _ => Outcome::Failed,
        }
    }
}

/// The session a retry of STEP continues after the attempt that ended as FAILED (CHECK: why
/// a check after its successful call failed it), when the step asks for it (`claude:
/// {on_retry: continue}`) and that attempt's call started a session.
pub(crate) fn continuation(
    step: &PlanStep,
    failed: &Output,
    check: Option<&str>,
) -> Option<crate::claude::Continuation> {
    let on_retry = step.claude.as_ref().and_then(|c| c.on_retry);
    match on_retry {
        Some(OnRetry::Continue) => {}
        Some(OnRetry::Fresh) | None => return None,
    }
    let call = failed.claude.as_ref()?;
    let session_id = call.session_id.clone().filter(|s| !s.is_empty())?;
    let (kind, message) = match (call.verdict.kind, check) {
        (Some(kind), _) => (kind, call.verdict.message.clone()),
        (None, Some(why)) => (crate::claude::ErrorKind::Unknown, why.to_owned()),
        (None, None) => (
            crate::claude::ErrorKind::Unknown,
            failed.failure_message().to_owned(),
        ),
    };
    Some(crate::claude::Continuation {
        session_id,
        kind,
        message,
    })
}

/// How the DLQ classifies a failed step: by how its command ended, else by the check after
/// it that failed.
pub(crate) fn error_type(step: &PlanStep, last: Option<&Output>) -> crate::dlq::ErrorType {
    use crate::dlq::ErrorType;
    match last {
        Some(o) if o.timed_out => ErrorType::Timeout,
        Some(o) if let Some(kind) = o.claude_error() => ErrorType::ClaudeFailed { kind },
        Some(o) if o.code != Some(0) => ErrorType::CommandFailed {
            exit_code: o.code.unwrap_or(-1),
        },
        _ if step.commit_required => ErrorType::CommitValidationFailed,
        _ if step.validate.is_some() || step.step_validate.is_some() => ErrorType::ValidationFailed,
        _ => ErrorType::Unknown,
    }
}

/// The outcome of a step that failed after its command ran (a capture, a check, a commit):
/// a failure that fails the workflow unless the step may fail: ignored (`allow_failure`,
/// `on_failure: true`), or failed and continued (a handler with `fail_workflow: false`).
pub(crate) fn failed(step: &PlanStep) -> Outcome {
    let policy = &step.handler_policy;
    if policy.fail_workflow {
        Outcome::Failed
    } else if policy.has_handler {
        Outcome::FailedContinued
    } else {
        Outcome::Ignored
    }
}

/// A step as the DLQ names it: `shell: ...`, `claude: ...`.
pub(crate) fn step_text(step: &PlanStep) -> String {
    match &step.command {
        PlanCommand::Shell(t) => format!("shell: {}", t.value),
        PlanCommand::Claude(t) => format!("claude: {}", t.value),
        PlanCommand::WriteFile(w) => format!("write_file: {}", w.path.value),
        PlanCommand::Foreach { .. } => format!("foreach: {}", step.label),
    }
}
