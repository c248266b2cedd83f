//! The step driver: runs one step as its [`StepMachine`] says (`driver`, one handler per
//! action), and lists of steps in order.

use crate::message::Message;

use futures::future::LocalBoxFuture as BoxFuture;
use prodigy_plan::{OnRetry, PlanCommand, PlanStep, StepId};

use crate::events::Event;
use crate::exec::Output;
use crate::lock;
use crate::machine::{Action, Outcome, StepMachine};
use crate::runner::Runner;
use crate::vars::Vars;

mod capture;
mod commit;
mod driver;
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
                let error = log.error.take().map(|e| (log.output_path(), e));
                let records = log.records_path().to_owned();
                let written =
                    log.finish(&outcome_name, self.started.elapsed().saturating_sub(began));
                if let Some((path, e)) = error.or(written.err().map(|e| (records, e))) {
                    self.say(Message::StepLogNotKept {
                        path,
                        why: e.to_string(),
                    });
                }
            }
            outcome
        })
    }

    /// The log of STEP's output in the run's logs, numbered among its owner's steps; none
    /// for a run that keeps nothing (`--dry-run`).
    pub(crate) fn step_log(
        &self,
        step: &PlanStep,
        index: Option<usize>,
    ) -> Option<crate::logs::StepLog> {
        if self.session.is_empty() {
            return None;
        }
        let mut log = lock(&self.step_logs)
            .get_or_insert_with(|| {
                crate::logs::StepLogs::new(self.opts.layout.logs_dir(&self.session))
            })
            .next(self.log_owner(), step.label.clone());
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

    /// Adds what a command of a step printed to the step's LOG, secrets masked.
    pub(crate) fn keep_output(&self, log: &mut crate::logs::StepLog, header: &str, out: &Output) {
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
        self.say(Message::Bug(crate::message::Bug::ImpossibleStepState {
            step: step.label.clone(),
        }));
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
        sent_back: false,
    })
}

/// The session the first attempt of STEP continues in an item the verified merge queue sent
/// back (`merge.redispatch`): the refused run's session of the same step, told why its work
/// came back, when the step asks for it (`claude: {on_retry: continue}`).
pub(crate) fn sent_back_continuation(
    step: &PlanStep,
    agent: Option<&crate::runner::AgentScope>,
) -> Option<crate::claude::Continuation> {
    match step.claude.as_ref().and_then(|c| c.on_retry) {
        Some(OnRetry::Continue) => {}
        Some(OnRetry::Fresh) | None => return None,
    }
    let sent = agent?.sent_back.borrow();
    let (sessions, message) = sent.as_ref()?;
    Some(crate::claude::Continuation {
        session_id: sessions.get(&step.label)?.clone(),
        kind: crate::claude::ErrorKind::Unknown,
        message: message.clone(),
        sent_back: true,
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
