//! A standard run's order as a pure state machine: which step starts next, when a
//! checkpoint is written, and how the run ends (docs/language.md §3). The runner's
//! dispatcher for standard runs (`runner/standard.rs`) feeds it what happened ([`SequenceEvent`])
//! and does what it answers ([`Reaction`]); the machine itself does no I/O.
//!
//! ```text
//!  Ready ──cancelled──────────────▶ Ending(interrupted)
//!    │ ──state lost────────────────▶ Ending(failed)
//!    │ ──no step left──────────────▶ Ending(succeeded)
//!    │ ──over the Claude budget────▶ Ending(budget reached, step i next)
//!    ▼ Start(i)
//!  Running(i) ──env failed / step failed──▶ Ending(failed, step i)
//!    │ ──cancelled─────────────────▶ Ending(interrupted)
//!    ▼ step went on: Checkpoint(i+1) and Ready, or Ending(succeeded) after the last
//!  Ending ─Settle─▶ Settled ─SaveLast─▶ Saved ─▶ End(outcome)
//! ```
//! A state write that failed while ending turns a success into a failure; an interrupted
//! run stays interrupted.

use crate::machine::Outcome;
use crate::message::Message;
use crate::store::SessionStatus;

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    /// Every step succeeded or was allowed to fail.
    Succeeded,
    /// A step failed the workflow.
    Failed,
    /// A signal stopped it.
    Interrupted,
    /// The Claude budget was reached before a Claude step ([`crate::claude::budget`]); it is where
    /// a resume starts.
    BudgetReached,
}

impl RunOutcome {
    /// The session status a run that ended so is saved with.
    pub fn status(self) -> crate::store::SessionStatus {
        match self {
            RunOutcome::Succeeded => crate::store::SessionStatus::Completed,
            RunOutcome::Failed => crate::store::SessionStatus::Failed,
            RunOutcome::Interrupted | RunOutcome::BudgetReached => {
                crate::store::SessionStatus::Interrupted
            }
        }
    }
}

/// What the dispatcher tells the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SequenceEvent {
    /// The run may start its next step: whether it was cancelled, and why its state can no
    /// longer be written, if so.
    Ready {
        /// A signal stopped the run.
        cancelled: bool,
        /// The first state write that failed.
        state_lost: Option<String>,
        /// The Claude budget does not let the next step start ([`crate::claude::budget`]).
        over_budget: bool,
    },
    /// The variables of the step about to start could not be refreshed (an env file or an
    /// env `command:`).
    EnvFailed(String),
    /// The step that started ended so.
    StepEnded(Outcome),
    /// The checkpoint in flight landed (or not: why the state is lost).
    Settled(Option<String>),
    /// The last checkpoint landed (or not).
    Saved(Option<String>),
}

/// What the dispatcher does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SequenceAction {
    /// Start the step at this index (refreshing the variables first unless it is the
    /// run's first step), then feed [`SequenceEvent::EnvFailed`] or [`SequenceEvent::StepEnded`].
    Start(usize),
    /// Write a checkpoint whose next step is this one, without waiting for it, then feed
    /// [`SequenceEvent::Ready`].
    Checkpoint(usize),
    /// Wait for the checkpoint in flight, then feed [`SequenceEvent::Settled`].
    Settle,
    /// Write the last checkpoint and wait until it is durable, then feed
    /// [`SequenceEvent::Saved`].
    SaveLast {
        /// The run's status in it.
        status: SessionStatus,
        /// The step a resume starts from.
        next: usize,
    },
    /// The run is over.
    End(Ending),
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ending {
    /// Succeeded, failed or interrupted.
    pub outcome: RunOutcome,
    /// The index of the step that failed the run.
    pub failed_step: Option<usize>,
    /// Why the run's state could not be kept.
    pub state_error: Option<String>,
}

/// The machine's answer: an action, and what to tell the person first.
#[derive(Clone, Debug, PartialEq)]
pub struct Reaction {
    /// Shown before the action.
    pub say: Option<Message>,
    /// What to do.
    pub action: SequenceAction,
}

impl Reaction {
    fn act(action: SequenceAction) -> Self {
        Reaction { say: None, action }
    }

    fn said(say: Message, action: SequenceAction) -> Self {
        Reaction {
            say: Some(say),
            action,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Between steps; NEXT starts next.
    Ready,
    /// The step at NEXT runs.
    Running,
    /// No step starts any more; the in-flight checkpoint is being settled.
    Settling,
    /// The last checkpoint is being written.
    Saving,
    /// Over.
    Ended,
}

/// A standard run's order.
#[derive(Clone, Debug)]
pub struct Sequence {
    state: State,
    /// The step that starts (or runs) now, and where a resume starts from.
    next: usize,
    total: usize,
    outcome: RunOutcome,
    failed_step: Option<usize>,
    state_error: Option<String>,
}

impl Sequence {
    /// A run of TOTAL steps starting at step START (0 for a new run).
    pub fn new(start: usize, total: usize) -> Self {
        Sequence {
            state: State::Ready,
            next: start,
            total,
            outcome: RunOutcome::Succeeded,
            failed_step: None,
            state_error: None,
        }
    }

    /// What follows EVENT. An event the state cannot receive ends the run as failed with
    /// an internal error (it is a bug of the dispatcher, never a crash).
    #[expect(
        clippy::too_many_lines,
        reason = "the run order's transition table: one arm per (state, event)"
    )]
    pub fn on(&mut self, event: SequenceEvent) -> Reaction {
        match (&self.state, event) {
            (
                State::Ready,
                SequenceEvent::Ready {
                    cancelled,
                    state_lost,
                    over_budget,
                },
            ) => {
                if cancelled {
                    self.end(RunOutcome::Interrupted, None)
                } else if let Some(why) = state_lost {
                    let say = Message::StateLost {
                        why: why.clone(),
                        stops: true,
                    };
                    self.state_error = Some(why);
                    let mut reaction = self.end(RunOutcome::Failed, None);
                    reaction.say = Some(say);
                    reaction
                } else if self.next >= self.total {
                    self.end(RunOutcome::Succeeded, None)
                } else if over_budget {
                    // The dispatcher said so; a resume starts from this step.
                    self.end(RunOutcome::BudgetReached, None)
                } else {
                    self.state = State::Running;
                    Reaction::act(SequenceAction::Start(self.next))
                }
            }
            (State::Running, SequenceEvent::EnvFailed(why)) => {
                let mut reaction = self.end(RunOutcome::Failed, Some(self.next));
                reaction.say = Some(Message::EnvFailed(why));
                reaction
            }
            (State::Running, SequenceEvent::StepEnded(outcome)) => match outcome {
                Outcome::Cancelled => self.end(RunOutcome::Interrupted, None),
                Outcome::Failed => self.end(RunOutcome::Failed, Some(self.next)),
                // The step went on (`Outcome::continues`).
                Outcome::Succeeded
                | Outcome::Recovered
                | Outcome::FailedContinued
                | Outcome::Ignored
                | Outcome::Skipped => {
                    self.next += 1;
                    if self.next < self.total {
                        self.state = State::Ready;
                        Reaction::act(SequenceAction::Checkpoint(self.next))
                    } else {
                        self.end(RunOutcome::Succeeded, None)
                    }
                }
            },
            (State::Settling, SequenceEvent::Settled(lost)) => {
                let mut say = None;
                // A run some of whose state was lost does not end as completed.
                if let (None, Some(why)) = (&self.state_error, lost)
                    && self.outcome != RunOutcome::Interrupted
                {
                    say = Some(Message::StateLost {
                        why: why.clone(),
                        stops: false,
                    });
                    self.outcome = RunOutcome::Failed;
                    self.state_error = Some(why);
                }
                self.state = State::Saving;
                Reaction {
                    say,
                    action: SequenceAction::SaveLast {
                        status: self.outcome.status(),
                        next: self.next,
                    },
                }
            }
            (State::Saving, SequenceEvent::Saved(lost)) => {
                let mut say = None;
                // Not durable: resuming runs the steps since the last checkpoint that landed.
                if let (None, Some(why)) = (&self.state_error, lost) {
                    say = Some(Message::StateLost {
                        why: why.clone(),
                        stops: false,
                    });
                    if self.outcome == RunOutcome::Succeeded {
                        self.outcome = RunOutcome::Failed;
                    }
                    self.state_error = Some(why);
                }
                self.state = State::Ended;
                Reaction {
                    say,
                    action: SequenceAction::End(self.ending()),
                }
            }
            (
                State::Ready | State::Running | State::Settling | State::Saving | State::Ended,
                event @ (SequenceEvent::Ready { .. }
                | SequenceEvent::EnvFailed(_)
                | SequenceEvent::StepEnded(_)
                | SequenceEvent::Settled(_)
                | SequenceEvent::Saved(_)),
            ) => {
                let say = Message::Bug(crate::message::Bug::UnexpectedSequenceEvent {
                    event: format!("{event:?}"),
                    state: format!("{:?}", self.state),
                });
                self.outcome = RunOutcome::Failed;
                self.state = State::Ended;
                Reaction::said(say, SequenceAction::End(self.ending()))
            }
        }
    }

    /// No further step starts: the run ends as OUTCOME (STEP failed it), once its state is
    /// settled.
    fn end(&mut self, outcome: RunOutcome, step: Option<usize>) -> Reaction {
        self.outcome = outcome;
        self.failed_step = step;
        self.state = State::Settling;
        Reaction::act(SequenceAction::Settle)
    }

    fn ending(&self) -> Ending {
        Ending {
            outcome: self.outcome,
            failed_step: self.failed_step,
            state_error: self.state_error.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const READY: SequenceEvent = SequenceEvent::Ready {
        cancelled: false,
        state_lost: None,
        over_budget: false,
    };

    /// The Claude budget ends the run before the step that would pass it, without a failed
    /// step; a resume starts from that step.
    #[test]
    fn a_step_over_the_claude_budget_does_not_start_and_is_where_a_resume_starts() {
        let mut run = Sequence::new(0, 3);
        let over = SequenceEvent::Ready {
            cancelled: false,
            state_lost: None,
            over_budget: true,
        };
        let actions = drive(
            &mut run,
            vec![
                READY,
                SequenceEvent::StepEnded(Outcome::Succeeded),
                over,
                SequenceEvent::Settled(None),
                SequenceEvent::Saved(None),
            ],
        );
        assert_eq!(
            actions[2..],
            [
                SequenceAction::Settle,
                SequenceAction::SaveLast {
                    status: SessionStatus::Interrupted,
                    next: 1
                },
                SequenceAction::End(Ending {
                    outcome: RunOutcome::BudgetReached,
                    failed_step: None,
                    state_error: None,
                }),
            ]
        );
    }

    /// Feeds EVENTS in turn and returns the actions.
    fn drive(machine: &mut Sequence, events: Vec<SequenceEvent>) -> Vec<SequenceAction> {
        events.into_iter().map(|e| machine.on(e).action).collect()
    }

    /// Three steps that go on: each starts, a checkpoint follows all but the last, and the
    /// run ends completed with nothing left to resume.
    #[test]
    fn steps_start_in_order_with_a_checkpoint_between_them() {
        let mut run = Sequence::new(0, 3);
        let actions = drive(
            &mut run,
            vec![
                READY,
                SequenceEvent::StepEnded(Outcome::Succeeded),
                READY,
                SequenceEvent::StepEnded(Outcome::Skipped),
                READY,
                SequenceEvent::StepEnded(Outcome::FailedContinued),
                SequenceEvent::Settled(None),
                SequenceEvent::Saved(None),
            ],
        );
        assert_eq!(
            actions,
            [
                SequenceAction::Start(0),
                SequenceAction::Checkpoint(1),
                SequenceAction::Start(1),
                SequenceAction::Checkpoint(2),
                SequenceAction::Start(2),
                SequenceAction::Settle,
                SequenceAction::SaveLast {
                    status: SessionStatus::Completed,
                    next: 3
                },
                SequenceAction::End(Ending {
                    outcome: RunOutcome::Succeeded,
                    failed_step: None,
                    state_error: None,
                }),
            ]
        );
    }

    /// A failed step ends the run at once; a resume starts again from it.
    #[test]
    fn a_failed_step_ends_the_run_and_is_where_a_resume_starts() {
        let mut run = Sequence::new(1, 3);
        let actions = drive(
            &mut run,
            vec![
                READY,
                SequenceEvent::StepEnded(Outcome::Failed),
                SequenceEvent::Settled(None),
                SequenceEvent::Saved(None),
            ],
        );
        assert_eq!(actions[0], SequenceAction::Start(1));
        assert_eq!(
            actions[2],
            SequenceAction::SaveLast {
                status: SessionStatus::Failed,
                next: 1
            }
        );
        assert_eq!(
            actions[3],
            SequenceAction::End(Ending {
                outcome: RunOutcome::Failed,
                failed_step: Some(1),
                state_error: None,
            })
        );
    }

    /// A signal before a step or during one interrupts the run, and a state write that
    /// fails afterwards does not turn it into a failure.
    #[test]
    fn an_interrupted_run_stays_interrupted() {
        for events in [
            vec![SequenceEvent::Ready {
                cancelled: true,
                state_lost: None,
                over_budget: false,
            }],
            vec![READY, SequenceEvent::StepEnded(Outcome::Cancelled)],
        ] {
            let mut run = Sequence::new(0, 2);
            drive(&mut run, events);
            run.on(SequenceEvent::Settled(Some("disk full".into())));
            let end = run.on(SequenceEvent::Saved(None));
            let SequenceAction::End(ending) = end.action else {
                panic!("{end:?}");
            };
            assert_eq!(ending.outcome, RunOutcome::Interrupted);
        }
    }

    /// A state that cannot be written stops the run before its next step, saying so once.
    #[test]
    fn a_lost_state_stops_the_next_step_from_starting() {
        let mut run = Sequence::new(0, 2);
        drive(
            &mut run,
            vec![READY, SequenceEvent::StepEnded(Outcome::Succeeded)],
        );
        let stop = run.on(SequenceEvent::Ready {
            cancelled: false,
            state_lost: Some("cannot write the checkpoint".into()),
            over_budget: false,
        });
        assert_eq!(stop.action, SequenceAction::Settle);
        assert_eq!(
            stop.say,
            Some(Message::StateLost {
                why: "cannot write the checkpoint".into(),
                stops: true,
            })
        );
        // Said once: the later settle does not say it again.
        assert_eq!(run.on(SequenceEvent::Settled(None)).say, None);
        let end = run.on(SequenceEvent::Saved(Some("again".into())));
        assert_eq!(end.say, None);
        let SequenceAction::End(ending) = end.action else {
            panic!("{end:?}");
        };
        assert_eq!(ending.outcome, RunOutcome::Failed);
        assert_eq!(
            ending.state_error.as_deref(),
            Some("cannot write the checkpoint")
        );
    }

    /// A last checkpoint that does not land fails a run that had succeeded.
    #[test]
    fn a_last_checkpoint_that_fails_fails_the_run() {
        let mut run = Sequence::new(0, 1);
        drive(
            &mut run,
            vec![
                READY,
                SequenceEvent::StepEnded(Outcome::Succeeded),
                SequenceEvent::Settled(None),
            ],
        );
        let end = run.on(SequenceEvent::Saved(Some("no space left".into())));
        assert_eq!(
            end.say,
            Some(Message::StateLost {
                why: "no space left".into(),
                stops: false,
            })
        );
        assert!(matches!(
            end.action,
            SequenceAction::End(Ending {
                outcome: RunOutcome::Failed,
                ..
            })
        ));
    }

    /// Variables that cannot be refreshed fail the step about to start.
    #[test]
    fn an_env_that_cannot_be_read_fails_the_step_about_to_start() {
        let mut run = Sequence::new(0, 2);
        drive(
            &mut run,
            vec![READY, SequenceEvent::StepEnded(Outcome::Succeeded), READY],
        );
        let failed = run.on(SequenceEvent::EnvFailed("env file gone".into()));
        assert_eq!(failed.say, Some(Message::EnvFailed("env file gone".into())));
        let actions = drive(
            &mut run,
            vec![SequenceEvent::Settled(None), SequenceEvent::Saved(None)],
        );
        assert_eq!(
            actions[1],
            SequenceAction::End(Ending {
                outcome: RunOutcome::Failed,
                failed_step: Some(1),
                state_error: None,
            })
        );
    }

    /// An event out of turn is an internal error that fails the run, not a crash.
    #[test]
    fn an_event_out_of_turn_is_an_internal_error() {
        let mut run = Sequence::new(0, 2);
        let odd = run.on(SequenceEvent::StepEnded(Outcome::Succeeded));
        assert!(matches!(odd.say, Some(Message::Bug(_))));
        assert!(matches!(
            odd.action,
            SequenceAction::End(Ending {
                outcome: RunOutcome::Failed,
                ..
            })
        ));
    }
}
