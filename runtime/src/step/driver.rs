//! One step's driver: a small handler per [`Action`] of its [`StepMachine`], and what
//! happens before the first run and after the machine finishes.

use std::ops::ControlFlow;
use std::time::Duration;

use prodigy_plan::{Exhausted, PlanCommand, PlanStep};
use serde_json::json;

use crate::events::Event;
use crate::exec::{self, Output};
use crate::lock;
use crate::logs::StepLog;
use crate::machine::{Action, Outcome, StepEvent, StepMachine};
use crate::message::Message;
use crate::runner::{Runner, StepFailure, fields};
use crate::step::handlers::Checks;
use crate::vars::Vars;

use super::{
    claude_vars_or_empty, continuation, error_type, failed, set_claude_vars, set_last_command,
    step_text, tail,
};

/// What the driver knows of a step's runs so far.
#[derive(Default)]
struct Runs {
    /// The output of the last run: the command's, the fallback command's, or a recovering
    /// handler's.
    last: Option<Output>,
    /// The output of a `strategy: fallback` handler that succeeded after the last run:
    /// when it recovers the step, it stands in for the command's.
    fallback_result: Option<Output>,
    /// Why the checks after the last successful run failed it, while that is how the step
    /// stands (`${error.message}` for the handler, the item's DLQ message).
    check_error: Option<String>,
    /// The outcome of the checks that passed.
    checked: Option<Outcome>,
    /// Whether `capture` already ran on `last`.
    captured: bool,
}

impl Runner {
    /// Runs STEP to its outcome; LOG keeps what its commands print.
    pub(super) async fn step_body(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        index: Option<usize>,
        log: Option<&mut StepLog>,
    ) -> Outcome {
        self.begin_step(step, vars, index, log.as_ref().map(|l| l.number()));
        let mut machine =
            StepMachine::new(step.retry_policy().clone(), step.handler_policy.clone());
        if let Some(outcome) = self.skip_unless_when(step, vars, &mut machine) {
            return outcome;
        }
        let head_before = if step.commit_required || step.auto_commit || !step.outputs.is_empty() {
            crate::worktree::facts::head(&self.workdir()).await
        } else {
            None
        };
        let mut runs = Runs::default();
        let outcome = self
            .drive(
                step,
                vars,
                &mut machine,
                &mut runs,
                head_before.as_deref(),
                log,
            )
            .await;
        let outcome = self
            .settle(step, vars, &mut runs, head_before, outcome)
            .await;
        let outcome = self
            .run_exit_code_handlers(step, vars, runs.last.as_ref(), outcome)
            .await;
        self.finish_step(step, index, &runs, outcome);
        outcome
    }

    /// Feeds EVENT to the step's MACHINE at the run's current time: the next action.
    fn step_event(&self, machine: &mut StepMachine, event: StepEvent) -> Action {
        machine.on_event(event, self.started.elapsed(), &mut *lock(&self.rng))
    }

    /// Says and records that STEP starts; a step of a phase (`index` given) gets its
    /// `step.name`/`step.index` (the git fields describe the last one).
    fn begin_step(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        index: Option<usize>,
        log_number: Option<u32>,
    ) {
        if let Some(index) = index {
            vars.merge("step", fields(json!({"name": step.label, "index": index})));
        }
        if let Some(description) = &step.description {
            self.say(Message::Description(description.clone()));
        }
        self.record(&Event::StepStarted {
            step: step.label.clone(),
            step_index: index,
            step_id: step.id.0,
            log_number,
            origin: self.origin(step),
        });
    }

    /// The outcome of a step its `when` skips (or fails, when it cannot be evaluated); none
    /// when the step runs.
    fn skip_unless_when(
        &self,
        step: &PlanStep,
        vars: &Vars,
        machine: &mut StepMachine,
    ) -> Option<Outcome> {
        let when = step.when.as_ref()?;
        match when.parsed.test(vars) {
            Ok(true) => None,
            Ok(false) => {
                self.record(&Event::StepSkipped {
                    step: step.label.clone(),
                    when: when.value.clone(),
                });
                self.say(Message::Skipped {
                    when: when.value.clone(),
                    reason: when.parsed.mismatch(vars),
                });
                Some(match self.step_event(machine, StepEvent::Skip) {
                    Action::Finish(outcome) => outcome,
                    other => self.invalid(step, machine, &other),
                })
            }
            Err(e) => {
                self.record(&Event::StepFailed {
                    step: step.label.clone(),
                    error: format!("when: {e}"),
                });
                self.say(Message::WhenFailed {
                    label: step.label.clone(),
                    why: e.to_string(),
                });
                Some(Outcome::Failed)
            }
        }
    }

    /// Runs the machine from `Start` to its outcome, one handler per action.
    async fn drive(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        machine: &mut StepMachine,
        runs: &mut Runs,
        head_before: Option<&str>,
        mut log: Option<&mut StepLog>,
    ) -> Outcome {
        let mut action = self.step_event(machine, StepEvent::Start);
        loop {
            let next = match action {
                Action::Spawn { run, attempt } => ControlFlow::Continue(
                    self.start_attempt(step, vars, runs, (run, attempt), log.as_deref_mut())
                        .await,
                ),
                Action::Wait { delay, next } => {
                    ControlFlow::Continue(self.wait_for_retry(step, delay, next).await)
                }
                Action::RunFallback => ControlFlow::Continue(
                    self.run_fallback(step, vars, runs, log.as_deref_mut())
                        .await,
                ),
                Action::Check => self.check_run(step, vars, machine, runs, head_before).await,
                Action::RunHandler { run } => self.run_handler(step, vars, runs, run).await,
                Action::Finish(outcome) => ControlFlow::Break(outcome),
                Action::Kill => ControlFlow::Break(Outcome::Cancelled),
                Action::Invalid => {
                    ControlFlow::Break(self.invalid(step, machine, &Action::Invalid))
                }
            };
            match next {
                ControlFlow::Continue(event) => action = self.step_event(machine, event),
                ControlFlow::Break(outcome) => return outcome,
            }
        }
    }

    /// `Spawn`: runs the step's command once (attempt ATTEMPT of run RUN), keeps and shows
    /// its output; the event is how it exited.
    async fn start_attempt(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        runs: &mut Runs,
        (run, attempt): (u32, u32),
        log: Option<&mut StepLog>,
    ) -> StepEvent {
        // A retry: `on_retry: continue` goes on with the failed attempt's session, and the
        // step's own prompt reads that attempt's `claude.*` (a handler's calls in between do
        // not change them).
        let resume = match &runs.last {
            Some(o) => continuation(step, o, runs.check_error.as_deref()),
            // An item the verified merge queue sent back: its first attempt goes on with
            // the refused run's session.
            None => super::sent_back_continuation(step, self.agent()),
        };
        if matches!(step.command, PlanCommand::Claude(_)) {
            match &runs.last {
                Some(failed) => set_claude_vars(vars, failed),
                None => claude_vars_or_empty(vars),
            }
        }
        runs.fallback_result = None;
        runs.check_error = None;
        runs.captured = false;
        self.record(&Event::AttemptStarted {
            step: step.label.clone(),
            run,
            attempt,
        });
        let out = self.execute(step, vars, resume.as_ref()).await;
        if let Some(log) = log {
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
        runs.last = Some(out);
        event
    }

    /// `Wait`: says the retry and sleeps DELAY before attempt NEXT, or until the run is
    /// cancelled.
    async fn wait_for_retry(&self, step: &PlanStep, delay: Duration, next: u32) -> StepEvent {
        self.record(&Event::RetryScheduled {
            step: step.label.clone(),
            next_attempt: next,
            delay_secs: delay.as_secs_f64(),
        });
        self.say(Message::Retrying {
            // Shown to the millisecond.
            delay: Duration::from_millis(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)),
            attempt: next,
        });
        let mut cancel = self.cancel_rx();
        tokio::select! {
            () = tokio::time::sleep(delay) => StepEvent::TimerFired,
            () = exec::cancelled(&mut cancel) => StepEvent::Cancel,
        }
    }

    /// `RunFallback`: runs the `exhausted: {fallback: ...}` command once retries are spent;
    /// its output becomes the step's.
    async fn run_fallback(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        runs: &mut Runs,
        log: Option<&mut StepLog>,
    ) -> StepEvent {
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
        if let Some(log) = log {
            self.keep_output(log, "[prodigy: fallback command]", &out);
        }
        self.show_output(step, &out);
        set_last_command(vars, step, &out);
        let event = StepEvent::Exited(out.exit());
        runs.check_error = None;
        runs.captured = false;
        runs.last = Some(out);
        event
    }

    /// `Check`: captures and validates the successful run's output; the step ends here when
    /// a check ends it (or the run is cancelled meanwhile).
    async fn check_run(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        machine: &StepMachine,
        runs: &mut Runs,
        head_before: Option<&str>,
    ) -> ControlFlow<Outcome, StepEvent> {
        let Some(out) = &runs.last else {
            return ControlFlow::Break(self.invalid(step, machine, &Action::Check));
        };
        runs.captured = true;
        let checks = self
            .checks(step, vars, out, head_before, Outcome::Succeeded)
            .await;
        // A check cut short by a cancellation does not pass: the step is cancelled. Checks
        // that passed (none, for most steps) leave the command's success standing, so that a
        // call that finished as the job was stopping is kept.
        if self.cancelled() && !matches!(checks, Checks::Passed(_)) {
            return ControlFlow::Break(Outcome::Cancelled);
        }
        let ok = match checks {
            Checks::Passed(outcome) => {
                runs.checked = Some(outcome);
                true
            }
            Checks::Failed(why) => {
                runs.check_error = Some(why);
                false
            }
            Checks::Ended(outcome) => return ControlFlow::Break(outcome),
        };
        ControlFlow::Continue(StepEvent::Checked { ok })
    }

    /// `RunHandler`: runs the step's `on_failure` handler after run RUN failed; a
    /// `strategy: fallback` handler that succeeds keeps its output to stand in for the
    /// command's.
    async fn run_handler(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        runs: &mut Runs,
        run: u32,
    ) -> ControlFlow<Outcome, StepEvent> {
        let (ok, handler_output) = self
            .handle_failure(
                step,
                vars,
                run,
                runs.last.as_ref(),
                runs.check_error.as_deref(),
            )
            .await;
        if self.cancelled() {
            return ControlFlow::Break(Outcome::Cancelled);
        }
        let fallback = step.handler_policy.recovers;
        runs.fallback_result = (ok && fallback).then(|| Output {
            stdout: handler_output,
            code: Some(0),
            ..Output::default()
        });
        ControlFlow::Continue(StepEvent::HandlerDone { ok })
    }

    /// The step's outcome once its machine finished: a recovery checked as a success is,
    /// the output of a failed run captured, and what follows a success (commits, outputs).
    async fn settle(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        runs: &mut Runs,
        head_before: Option<String>,
        mut outcome: Outcome,
    ) -> Outcome {
        if let (Outcome::Succeeded, Some(passed)) = (outcome, runs.checked) {
            outcome = passed;
        }
        if outcome == Outcome::Recovered
            && let Some(result) = runs.fallback_result.take()
        {
            runs.last = Some(result);
            runs.captured = false;
        }
        // A recovery (a fallback's output standing in for the command's) is checked as a
        // success is, but a failed check has no run left to fail: the step fails.
        if let (Outcome::Recovered, Some(out)) = (outcome, &runs.last) {
            runs.captured = true;
            outcome = match self
                .checks(step, vars, out, head_before.as_deref(), outcome)
                .await
            {
                Checks::Passed(outcome) | Checks::Ended(outcome) => outcome,
                Checks::Failed(why) => {
                    runs.check_error = Some(why);
                    failed(step)
                }
            };
        }
        // The output of a failed run is captured too; a value that does not fit its format
        // is said, and the failure stays what it is.
        if let Some(out) = &runs.last
            && !runs.captured
            && outcome != Outcome::Cancelled
            && let Err(why) = self.capture(step, vars, out)
        {
            self.capture_failed(step, &why);
        }
        if matches!(outcome, Outcome::Succeeded | Outcome::Recovered) {
            outcome = self.after_checks(step, vars, head_before, outcome).await;
        }
        outcome
    }

    /// Runs the `on_exit_code` handlers for the code the command ended with (LAST), whether
    /// the step goes on or fails (a failed step stays failed).
    async fn run_exit_code_handlers(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        last: Option<&Output>,
        mut outcome: Outcome,
    ) -> Outcome {
        if let (Some(out), true) = (last, outcome != Outcome::Cancelled) {
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
        outcome
    }

    /// Records how the step finished; a failure that fails the workflow, or one that was
    /// only handled, is said, and in a map agent fails the item.
    fn finish_step(&self, step: &PlanStep, index: Option<usize>, runs: &Runs, outcome: Outcome) {
        // A map agent's own steps are the ones run with an index in an agent's scope
        // (`run_agent_steps`); what they trigger runs as a list, without one.
        let agent_step = index.is_some() && self.agent().is_some_and(|a| !a.agent_id.is_empty());
        self.record(&Event::StepFinished {
            step: step.label.clone(),
            outcome: crate::events::StepOutcome::of(outcome, agent_step),
            origin: self.origin(step),
        });
        if outcome.continues_agent() || outcome == Outcome::Cancelled {
            return;
        }
        if let Some(a) = self.agent() {
            *a.failure.borrow_mut() = Some(item_failure(step, runs));
        }
        let in_agent = self.agent().is_some_and(|a| !a.agent_id.is_empty());
        self.say(Message::StepFailed {
            label: step.label.clone(),
            detail: failure_detail(runs.last.as_ref()),
            continued: outcome == Outcome::FailedContinued && !in_agent,
        });
    }
}

/// The line that says why a step failed: the last line of what its last run printed, and
/// the kind of a Claude error with its advice.
fn failure_detail(last: Option<&Output>) -> String {
    last.map(|o| {
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
    .unwrap_or_default()
}

/// How a failed step failed its map item (the item's DLQ entry).
fn item_failure(step: &PlanStep, runs: &Runs) -> StepFailure {
    let last = runs.last.as_ref();
    StepFailure {
        step: step_text(step),
        message: runs.check_error.as_deref().map_or_else(
            || {
                last.map_or_else(
                    || "the step failed".to_owned(),
                    |o| tail(o.failure_message(), 20),
                )
            },
            |why| tail(why, 20),
        ),
        error_type: error_type(step, last),
        output: last.map(|o| crate::dlq::CommandTail {
            exit_code: o.code,
            stdout: tail(&o.stdout, crate::dlq::CommandTail::LINES),
            stderr: tail(&o.stderr, crate::dlq::CommandTail::LINES),
        }),
        log: last
            .and_then(|o| o.claude.as_ref())
            .and_then(|c| c.log.clone()),
    }
}
