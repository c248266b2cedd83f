//! The state machine of one step: its command runs, retries with backoff, handlers, and the
//! outcome, following the flowchart of the Error Handling guide and docs/language.md §3–§4.
//!
//! Transitions are pure: [`StepMachine::on_event`] takes an event and the current time and
//! returns what to do next. Every `(state, event)` pair is decided explicitly, with no
//! catch-all arm; a pair that cannot happen is [`Action::Invalid`], which the driver reports
//! as an internal error.
//!
//! Two loops compose (docs/language.md §4): `retry_config` retries one *run* of the command
//! (inner attempts, with delays); `on_failure.max_attempts` re-runs the command after the
//! handler (outer attempts). A run is one inner loop.

use std::time::Duration;

use rand::Rng;

use crate::claude::kinds::ErrorKind;

/// What a finished command did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    /// Exit code, if the process exited.
    pub code: Option<i32>,
    /// The step's timeout killed it.
    pub timed_out: bool,
    /// It could not be started.
    pub spawn_error: bool,
    /// Standard output followed by standard error, for `retry_on` matching.
    pub text: String,
    /// Why a Claude call failed, though its CLI may have exited 0.
    pub claude: Option<ErrorKind>,
}

impl Exit {
    /// Whether the command succeeded.
    pub fn success(&self) -> bool {
        self.code == Some(0) && !self.timed_out && !self.spawn_error && self.claude.is_none()
    }
}

pub use prodigy_plan::{Exhausted, HandlerPolicy, Matcher, RetryPolicy};

/// Matching a failure against `retry_config.retry_on`.
trait Matches {
    /// Whether this matcher retries EXIT.
    fn matches(&self, exit: &Exit) -> bool;
}

impl Matches for Matcher {
    /// Whether this matcher retries EXIT: a Claude call by its error kind (529 and 5xx are
    /// also `server_error`), anything else by the words of its output.
    fn matches(&self, exit: &Exit) -> bool {
        let lower = exit.text.to_lowercase();
        let any = |words: &[&str]| words.iter().any(|w| lower.contains(w));
        if let Some(kind) = exit.claude {
            return match self {
                Matcher::Network => kind == ErrorKind::Network,
                Matcher::Timeout => exit.timed_out || kind == ErrorKind::Timeout,
                Matcher::ServerError => {
                    matches!(kind, ErrorKind::ServerError | ErrorKind::Overloaded)
                }
                Matcher::RateLimit => kind == ErrorKind::RateLimit,
                Matcher::Overloaded => kind == ErrorKind::Overloaded,
                Matcher::Auth => kind == ErrorKind::Authentication,
                Matcher::Stalled => kind == ErrorKind::Stalled,
                Matcher::Pattern(re) => re.is_match(&exit.text),
            };
        }
        match self {
            Matcher::Network => any(&["network", "connection", "refused", "unreachable"]),
            Matcher::Timeout => exit.timed_out || any(&["timeout", "timed out"]),
            Matcher::ServerError => any(&["500", "502", "503", "504", "server error"]),
            Matcher::RateLimit => any(&["rate limit", "429", "too many requests"]),
            Matcher::Overloaded => any(&["overloaded", "529"]),
            Matcher::Auth => any(&["authentication", "unauthorized", "401", "not logged in"]),
            // Only a Claude call has a stall watchdog.
            Matcher::Stalled => false,
            Matcher::Pattern(re) => re.is_match(&exit.text),
        }
    }
}

/// DELAY with jitter factor `f`: the delay `d` is capped at MAX first, then drawn uniformly
/// from `[d·(1-f), d·(1+f)]` cut at `0` and at MAX. A delay at the cap is spread below it,
/// over `[max·(1-f), max]`, so retries that reach `max_delay` do not all arrive together
/// (clamping after the draw would put half of them exactly on the cap).
pub fn jitter(delay: Duration, factor: f64, max: Duration, rng: &mut impl Rng) -> Duration {
    let d = delay.min(max).as_secs_f64();
    let cap = max.as_secs_f64();
    let low = (d * (1.0 - factor)).clamp(0.0, cap);
    let high = (d * (1.0 + factor)).min(cap).max(low);
    let value = if high > low {
        rng.random_range(low..=high)
    } else {
        low
    };
    Duration::try_from_secs_f64(value).unwrap_or(max).min(max)
}

/// What the step machine does with a [`RetryPolicy`] from the plan: draw the delays (with
/// jitter from the RNG it is given) and decide which failures are retried.
pub trait Retrying {
    /// The delay before retry `n` (1-based), with jitter when enabled (see [`jitter`]: a
    /// delay at `max_delay` is spread below it).
    fn delay(&self, n: u32, rng: &mut impl Rng) -> Duration;

    /// The delays between the attempts of one run, in order (one fewer than `attempts`).
    fn delays<'a, R: Rng>(&'a self, rng: &'a mut R) -> impl Iterator<Item = Duration> + 'a;

    /// Whether `retry_on` retries EXIT.
    fn retries(&self, exit: &Exit) -> bool;
}

impl Retrying for RetryPolicy {
    fn delay(&self, n: u32, rng: &mut impl Rng) -> Duration {
        let nominal = self.nominal(n);
        match self.jitter {
            Some(factor) => jitter(nominal, factor, self.max_delay, rng),
            None => nominal,
        }
    }

    fn delays<'a, R: Rng>(&'a self, rng: &'a mut R) -> impl Iterator<Item = Duration> + 'a {
        (1..self.attempts).map(move |n| self.delay(n, rng))
    }

    fn retries(&self, exit: &Exit) -> bool {
        match exit.claude {
            // Authentication, billing and invalid requests are retried only when
            // `retry_on` names them.
            Some(kind) if !kind.retried_by_default() => {
                self.retry_on.iter().any(|m| m.matches(exit))
            }
            _ => self.retry_on.is_empty() || self.retry_on.iter().any(|m| m.matches(exit)),
        }
    }
}

/// How a step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The command succeeded.
    Succeeded,
    /// A `strategy: fallback` handler (or `retry_config`'s fallback command) succeeded in
    /// the command's place.
    Recovered,
    /// The step failed and its `on_failure` handler ran, but no run of the command
    /// succeeded; with `fail_workflow: false` a standard workflow goes on, and a map item
    /// fails.
    FailedContinued,
    /// The step failed and the failure is ignored (`on_failure: true`, `allow_failure`,
    /// `retry_config.on_failure: continue`): everything goes on.
    Ignored,
    /// The step failed and so does the workflow.
    Failed,
    /// `when` was false.
    Skipped,
    /// Cancelled by a signal.
    Cancelled,
}

impl Outcome {
    /// Whether the workflow may go on after this step.
    pub fn continues(self) -> bool {
        match self {
            Outcome::Succeeded
            | Outcome::Recovered
            | Outcome::FailedContinued
            | Outcome::Ignored
            | Outcome::Skipped => true,
            Outcome::Failed | Outcome::Cancelled => false,
        }
    }

    /// Whether a map agent goes on after this step: a failure that was only handled fails
    /// the item (it goes where `on_item_failure` says); only a success, a recovery or an
    /// ignored failure lets the agent go on.
    pub fn continues_agent(self) -> bool {
        match self {
            Outcome::Succeeded | Outcome::Recovered | Outcome::Ignored | Outcome::Skipped => true,
            Outcome::FailedContinued | Outcome::Failed | Outcome::Cancelled => false,
        }
    }
}

/// Where a step is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepState {
    /// Not started.
    Pending,
    /// The command is running: outer run `run`, inner attempt `attempt`.
    Running {
        /// On-failure run (1-based).
        run: u32,
        /// Retry attempt within the run (1-based).
        attempt: u32,
        /// When this run started (for the budget).
        run_started: Duration,
    },
    /// Waiting before the next attempt.
    Backoff {
        /// On-failure run.
        run: u32,
        /// The attempt that comes next.
        next: u32,
        /// When the run started.
        run_started: Duration,
    },
    /// The fallback command of `retry_config` is running.
    Fallback {
        /// On-failure run.
        run: u32,
    },
    /// The command of run `run` succeeded; the checks after it (`capture`, `step_validate`,
    /// `validate`, `auto_commit`, `commit_required`) are running. Their failure is a failure
    /// of the run: the handler runs, then the command again while runs remain.
    Checking {
        /// On-failure run.
        run: u32,
    },
    /// The `on_failure` handler is running after run `run` failed.
    Handling {
        /// On-failure run that failed.
        run: u32,
    },
    /// Finished.
    Done(Outcome),
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepEvent {
    /// Start the step.
    Start,
    /// `when` was false.
    Skip,
    /// The command (or the fallback) finished.
    Exited(Exit),
    /// The backoff delay passed.
    TimerFired,
    /// The checks after a successful command finished.
    Checked {
        /// Every check passed.
        ok: bool,
    },
    /// The handler finished.
    HandlerDone {
        /// Every handler command succeeded (or continued on error).
        ok: bool,
    },
    /// A signal: stop now.
    Cancel,
}

/// What the driver must do.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum Action {
    /// Run the command.
    Spawn {
        /// On-failure run.
        run: u32,
        /// Retry attempt within the run.
        attempt: u32,
    },
    /// Wait, then send [`StepEvent::TimerFired`].
    Wait {
        /// How long.
        delay: Duration,
        /// The attempt that comes next.
        next: u32,
    },
    /// Run the `retry_config` fallback command, then send its [`StepEvent::Exited`].
    RunFallback,
    /// Run the checks after a successful command, then send [`StepEvent::Checked`].
    Check,
    /// Run the `on_failure` handler, then send [`StepEvent::HandlerDone`].
    RunHandler {
        /// The run that failed.
        run: u32,
    },
    /// The step is over.
    Finish(Outcome),
    /// Kill what is running; the step ends [`Outcome::Cancelled`].
    Kill,
    /// An event that cannot happen in this state; the driver reports an internal error.
    Invalid,
}

/// One step's machine.
#[derive(Clone, Debug)]
pub struct StepMachine {
    state: StepState,
    retry: RetryPolicy,
    handler: HandlerPolicy,
}

impl StepMachine {
    /// A machine for a step with these policies.
    pub fn new(retry: RetryPolicy, handler: HandlerPolicy) -> Self {
        StepMachine {
            state: StepState::Pending,
            retry,
            handler,
        }
    }

    /// The current state.
    pub fn state(&self) -> &StepState {
        &self.state
    }

    /// Feeds an event at time `now`, drawing jitter from `rng`.
    pub fn on_event(&mut self, event: StepEvent, now: Duration, rng: &mut impl Rng) -> Action {
        let (next, action) = self.transition(event, now, rng);
        if let Some(next) = next {
            self.state = next;
        }
        action
    }

    fn finish(outcome: Outcome) -> (Option<StepState>, Action) {
        (Some(StepState::Done(outcome)), Action::Finish(outcome))
    }

    /// After run `run` failed for good: the handler, another run, or the end.
    fn run_failed(&self, run: u32, now: Duration) -> (Option<StepState>, Action) {
        if self.handler.has_handler {
            return (
                Some(StepState::Handling { run }),
                Action::RunHandler { run },
            );
        }
        self.runs_exhausted_or_rerun(run, false, now)
    }

    fn runs_exhausted_or_rerun(
        &self,
        run: u32,
        handler_ok: bool,
        now: Duration,
    ) -> (Option<StepState>, Action) {
        if run < self.handler.max_attempts {
            let next = run + 1;
            return (
                Some(StepState::Running {
                    run: next,
                    attempt: 1,
                    run_started: now,
                }),
                Action::Spawn {
                    run: next,
                    attempt: 1,
                },
            );
        }
        // A fallback that succeeded stands in for the command; `fail_workflow: true` wins:
        // the workflow fails even after a successful cleanup.
        if handler_ok && self.handler.recovers && !self.handler.fail_workflow {
            return Self::finish(Outcome::Recovered);
        }
        Self::finish(if self.handler.fail_workflow {
            Outcome::Failed
        } else if self.handler.has_handler {
            Outcome::FailedContinued
        } else {
            Outcome::Ignored
        })
    }

    #[expect(
        clippy::match_same_arms,
        reason = "one group of arms per state reads as the transition table"
    )]
    #[expect(
        clippy::too_many_lines,
        reason = "table-shaped: the step machine's pure transition table, one exhaustive arm per (state, event)"
    )]
    fn transition(
        &self,
        event: StepEvent,
        now: Duration,
        rng: &mut impl Rng,
    ) -> (Option<StepState>, Action) {
        use StepEvent as E;
        use StepState as S;
        match (&self.state, event) {
            (S::Pending, E::Start) => (
                Some(S::Running {
                    run: 1,
                    attempt: 1,
                    run_started: now,
                }),
                Action::Spawn { run: 1, attempt: 1 },
            ),
            (S::Pending, E::Skip) => Self::finish(Outcome::Skipped),
            (S::Pending, E::Cancel) => Self::finish(Outcome::Cancelled),
            (
                S::Pending,
                E::Exited(_) | E::TimerFired | E::Checked { .. } | E::HandlerDone { .. },
            ) => (None, Action::Invalid),

            (S::Running { run, .. }, E::Exited(exit)) if exit.success() => {
                (Some(S::Checking { run: *run }), Action::Check)
            }
            (
                S::Running {
                    run,
                    attempt,
                    run_started,
                },
                E::Exited(exit),
            ) => {
                let (run, attempt, run_started) = (*run, *attempt, *run_started);
                if attempt < self.retry.attempts && self.retry.retries(&exit) {
                    let delay = self.retry.delay(attempt, rng);
                    let within_budget = self
                        .retry
                        .budget
                        .is_none_or(|b| now.saturating_sub(run_started).saturating_add(delay) <= b);
                    if within_budget {
                        let next = attempt + 1;
                        return (
                            Some(S::Backoff {
                                run,
                                next,
                                run_started,
                            }),
                            Action::Wait { delay, next },
                        );
                    }
                }
                match &self.retry.exhausted {
                    Exhausted::Stop => self.run_failed(run, now),
                    Exhausted::Continue => Self::finish(Outcome::Ignored),
                    Exhausted::Fallback(_) => (Some(S::Fallback { run }), Action::RunFallback),
                }
            }
            (S::Running { .. }, E::Cancel) => (Some(S::Done(Outcome::Cancelled)), Action::Kill),
            (
                S::Running { .. },
                E::Start | E::Skip | E::TimerFired | E::Checked { .. } | E::HandlerDone { .. },
            ) => (None, Action::Invalid),

            (
                S::Backoff {
                    run,
                    next,
                    run_started,
                },
                E::TimerFired,
            ) => (
                Some(S::Running {
                    run: *run,
                    attempt: *next,
                    run_started: *run_started,
                }),
                Action::Spawn {
                    run: *run,
                    attempt: *next,
                },
            ),
            (S::Backoff { .. }, E::Cancel) => Self::finish(Outcome::Cancelled),
            (
                S::Backoff { .. },
                E::Start | E::Skip | E::Exited(_) | E::Checked { .. } | E::HandlerDone { .. },
            ) => (None, Action::Invalid),

            (S::Fallback { .. }, E::Exited(exit)) if exit.success() => {
                Self::finish(Outcome::Recovered)
            }
            (S::Fallback { run }, E::Exited(_)) => self.run_failed(*run, now),
            (S::Fallback { .. }, E::Cancel) => (Some(S::Done(Outcome::Cancelled)), Action::Kill),
            (
                S::Fallback { .. },
                E::Start | E::Skip | E::TimerFired | E::Checked { .. } | E::HandlerDone { .. },
            ) => (None, Action::Invalid),

            (S::Checking { .. }, E::Checked { ok: true }) => Self::finish(Outcome::Succeeded),
            (S::Checking { run }, E::Checked { ok: false }) => self.run_failed(*run, now),
            (S::Checking { .. }, E::Cancel) => (Some(S::Done(Outcome::Cancelled)), Action::Kill),
            (
                S::Checking { .. },
                E::Start | E::Skip | E::Exited(_) | E::TimerFired | E::HandlerDone { .. },
            ) => (None, Action::Invalid),

            (S::Handling { .. }, E::HandlerDone { ok: false })
                if self.handler.handler_failure_fatal =>
            {
                Self::finish(Outcome::Failed)
            }
            (S::Handling { run }, E::HandlerDone { ok }) => {
                self.runs_exhausted_or_rerun(*run, ok, now)
            }
            (S::Handling { .. }, E::Cancel) => (Some(S::Done(Outcome::Cancelled)), Action::Kill),
            (
                S::Handling { .. },
                E::Start | E::Skip | E::Exited(_) | E::TimerFired | E::Checked { .. },
            ) => (None, Action::Invalid),

            (
                S::Done(_),
                E::Start
                | E::Skip
                | E::Exited(_)
                | E::TimerFired
                | E::Checked { .. }
                | E::HandlerDone { .. }
                | E::Cancel,
            ) => (None, Action::Invalid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `on_failure: true`: a failure is ignored.
    fn ignore() -> HandlerPolicy {
        HandlerPolicy {
            fail_workflow: false,
            ..HandlerPolicy::none()
        }
    }
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn fail() -> Exit {
        Exit {
            code: Some(1),
            timed_out: false,
            spawn_error: false,
            text: "boom".into(),
            claude: None,
        }
    }

    fn ok() -> Exit {
        Exit {
            code: Some(0),
            timed_out: false,
            spawn_error: false,
            text: String::new(),
            claude: None,
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// Drives a machine with a script of events, checking each action.
    #[track_caller]
    fn script(mut m: StepMachine, steps: &[(StepEvent, Action)]) -> StepMachine {
        let mut rng = StdRng::seed_from_u64(7);
        for (i, (event, expect)) in steps.iter().enumerate() {
            let got = m.on_event(event.clone(), secs(i as u64), &mut rng);
            assert_eq!(&got, expect, "step {i}: {event:?} in {:?}", m.state());
        }
        m
    }

    /// `on_failure: {fallback: make clean}`.
    fn fallback_command() -> Exhausted {
        let text = "make clean";
        Exhausted::Fallback(prodigy_plan::Template {
            value: text.to_owned(),
            span: prodigy_plan::support::Span::default(),
            parsed: prodigy_grammar::template::Template::parse(text).unwrap(),
            exact: true,
        })
    }

    fn retry(attempts: u32) -> RetryPolicy {
        RetryPolicy {
            attempts,
            delays: vec![secs(1), secs(2), secs(4)],
            max_delay: secs(30),
            ..RetryPolicy::none()
        }
    }

    /// A handler of the default strategy, `recovery`.
    fn handler(max_attempts: u32, fail_workflow: bool) -> HandlerPolicy {
        HandlerPolicy {
            has_handler: true,
            max_attempts,
            fail_workflow,
            handler_failure_fatal: false,
            recovers: false,
        }
    }

    /// A `strategy: fallback` handler.
    fn fallback(max_attempts: u32, fail_workflow: bool) -> HandlerPolicy {
        HandlerPolicy {
            recovers: true,
            ..handler(max_attempts, fail_workflow)
        }
    }

    #[test]
    fn success_on_the_first_run() {
        script(
            StepMachine::new(RetryPolicy::none(), HandlerPolicy::none()),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(ok()), Action::Check),
                (
                    StepEvent::Checked { ok: true },
                    Action::Finish(Outcome::Succeeded),
                ),
            ],
        );
    }

    #[test]
    fn no_handler_fails_the_workflow_and_on_failure_true_ignores_the_failure() {
        script(
            StepMachine::new(RetryPolicy::none(), HandlerPolicy::none()),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(fail()), Action::Finish(Outcome::Failed)),
            ],
        );
        script(
            StepMachine::new(RetryPolicy::none(), ignore()),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(fail()), Action::Finish(Outcome::Ignored)),
            ],
        );
        assert!(Outcome::Ignored.continues() && Outcome::Ignored.continues_agent());
    }

    #[test]
    fn retries_wait_their_delays_then_stop() {
        script(
            StepMachine::new(retry(3), HandlerPolicy::none()),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (
                    StepEvent::Exited(fail()),
                    Action::Wait {
                        delay: secs(1),
                        next: 2,
                    },
                ),
                (StepEvent::TimerFired, Action::Spawn { run: 1, attempt: 2 }),
                (
                    StepEvent::Exited(fail()),
                    Action::Wait {
                        delay: secs(2),
                        next: 3,
                    },
                ),
                (StepEvent::TimerFired, Action::Spawn { run: 1, attempt: 3 }),
                (StepEvent::Exited(fail()), Action::Finish(Outcome::Failed)),
            ],
        );
    }

    #[test]
    fn claude_failures_are_retried_by_kind_and_credentials_only_when_named() {
        let claude = |kind: ErrorKind| Exit {
            code: Some(1),
            claude: Some(kind),
            text: "API Error".into(),
            ..fail()
        };
        let on = |retry_on: Vec<Matcher>| RetryPolicy {
            retry_on,
            ..retry(3)
        };
        // No `retry_on`: everything transient, but never a refused key.
        assert!(on(vec![]).retries(&claude(ErrorKind::Overloaded)));
        assert!(!on(vec![]).retries(&claude(ErrorKind::Authentication)));
        assert!(!on(vec![]).retries(&claude(ErrorKind::Billing)));
        assert!(!on(vec![]).retries(&claude(ErrorKind::InvalidRequest)));
        // 529 is `overloaded` and a `server_error`; 429 only `rate_limit`.
        assert!(on(vec![Matcher::Overloaded]).retries(&claude(ErrorKind::Overloaded)));
        assert!(on(vec![Matcher::ServerError]).retries(&claude(ErrorKind::Overloaded)));
        assert!(!on(vec![Matcher::Overloaded]).retries(&claude(ErrorKind::RateLimit)));
        assert!(on(vec![Matcher::RateLimit]).retries(&claude(ErrorKind::RateLimit)));
        assert!(on(vec![Matcher::Network]).retries(&claude(ErrorKind::Network)));
        assert!(on(vec![Matcher::Auth]).retries(&claude(ErrorKind::Authentication)));
        // A stall and a timeout are retried by default, and each by its own matcher.
        assert!(on(vec![]).retries(&claude(ErrorKind::Stalled)));
        assert!(on(vec![]).retries(&claude(ErrorKind::Timeout)));
        assert!(on(vec![Matcher::Stalled]).retries(&claude(ErrorKind::Stalled)));
        assert!(!on(vec![Matcher::Stalled]).retries(&claude(ErrorKind::Timeout)));
        assert!(on(vec![Matcher::Timeout]).retries(&claude(ErrorKind::Timeout)));
        assert!(!on(vec![Matcher::Timeout]).retries(&claude(ErrorKind::Stalled)));
        // An exit code of 0 does not make a failed call a success.
        let zero = Exit {
            code: Some(0),
            ..claude(ErrorKind::InvalidRequest)
        };
        assert!(!zero.success());
    }

    #[test]
    fn retry_on_narrows_what_is_retried() {
        let policy = RetryPolicy {
            retry_on: vec![Matcher::Network],
            ..retry(3)
        };
        script(
            StepMachine::new(policy.clone(), HandlerPolicy::none()),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(fail()), Action::Finish(Outcome::Failed)),
            ],
        );
        let refused = Exit {
            text: "connection refused".into(),
            ..fail()
        };
        script(
            StepMachine::new(policy, HandlerPolicy::none()),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (
                    StepEvent::Exited(refused),
                    Action::Wait {
                        delay: secs(1),
                        next: 2,
                    },
                ),
            ],
        );
        let timeouts = RetryPolicy {
            retry_on: vec![Matcher::Timeout],
            ..retry(2)
        };
        let timed_out = Exit {
            code: None,
            timed_out: true,
            ..fail()
        };
        script(
            StepMachine::new(timeouts, HandlerPolicy::none()),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (
                    StepEvent::Exited(timed_out),
                    Action::Wait {
                        delay: secs(1),
                        next: 2,
                    },
                ),
            ],
        );
    }

    #[test]
    fn a_retry_past_the_budget_is_not_started() {
        // Attempt 1 fails at t=1s; the 1s delay would end at 2s > budget 1.5s.
        let policy = RetryPolicy {
            budget: Some(Duration::from_millis(1500)),
            ..retry(3)
        };
        let mut m = StepMachine::new(policy, HandlerPolicy::none());
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(
            m.on_event(StepEvent::Start, secs(0), &mut rng),
            Action::Spawn { run: 1, attempt: 1 }
        );
        assert_eq!(
            m.on_event(StepEvent::Exited(fail()), secs(1), &mut rng),
            Action::Finish(Outcome::Failed)
        );
    }

    #[test]
    fn a_huge_delay_against_a_budget_does_not_overflow() {
        let policy = RetryPolicy {
            delays: vec![Duration::MAX],
            max_delay: Duration::MAX,
            budget: Some(Duration::from_hours(1)),
            ..retry(2)
        };
        let mut m = StepMachine::new(policy, HandlerPolicy::none());
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(
            m.on_event(StepEvent::Start, secs(0), &mut rng),
            Action::Spawn { run: 1, attempt: 1 }
        );
        assert_eq!(
            m.on_event(StepEvent::Exited(fail()), secs(2), &mut rng),
            Action::Finish(Outcome::Failed)
        );
    }

    #[test]
    fn exhausted_retries_continue_or_fall_back() {
        let cont = RetryPolicy {
            exhausted: Exhausted::Continue,
            ..retry(1)
        };
        // `on_failure: continue` ignores the failure, even with a handler.
        script(
            StepMachine::new(cont, handler(1, false)),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(fail()), Action::Finish(Outcome::Ignored)),
            ],
        );
        let fallback = RetryPolicy {
            exhausted: fallback_command(),
            ..retry(1)
        };
        script(
            StepMachine::new(fallback.clone(), HandlerPolicy::none()),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(fail()), Action::RunFallback),
                (StepEvent::Exited(ok()), Action::Finish(Outcome::Recovered)),
            ],
        );
        script(
            StepMachine::new(fallback, HandlerPolicy::none()),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(fail()), Action::RunFallback),
                (StepEvent::Exited(fail()), Action::Finish(Outcome::Failed)),
            ],
        );
    }

    #[test]
    fn the_handler_runs_after_every_failed_run_and_max_attempts_counts_the_first() {
        // docs/language.md §3: `max_attempts: 3` → at most 3 runs, the handler after each failure.
        script(
            StepMachine::new(RetryPolicy::none(), handler(3, false)),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(fail()), Action::RunHandler { run: 1 }),
                (
                    StepEvent::HandlerDone { ok: true },
                    Action::Spawn { run: 2, attempt: 1 },
                ),
                (StepEvent::Exited(fail()), Action::RunHandler { run: 2 }),
                (
                    StepEvent::HandlerDone { ok: true },
                    Action::Spawn { run: 3, attempt: 1 },
                ),
                (StepEvent::Exited(fail()), Action::RunHandler { run: 3 }),
                (
                    StepEvent::HandlerDone { ok: true },
                    Action::Finish(Outcome::FailedContinued),
                ),
            ],
        );
        script(
            StepMachine::new(RetryPolicy::none(), handler(2, true)),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(fail()), Action::RunHandler { run: 1 }),
                (
                    StepEvent::HandlerDone { ok: false },
                    Action::Spawn { run: 2, attempt: 1 },
                ),
                (StepEvent::Exited(ok()), Action::Check),
                (
                    StepEvent::Checked { ok: true },
                    Action::Finish(Outcome::Succeeded),
                ),
            ],
        );
    }

    #[test]
    #[expect(
        clippy::too_many_lines,
        reason = "a test: one scenario read top to bottom"
    )]
    fn a_handled_failure_is_not_recovered_unless_a_fallback_succeeded() {
        // A successful `recovery` handler handles the failure; no run of the command
        // succeeded, so the step failed (and goes on: `fail_workflow` is false).
        let m = script(
            StepMachine::new(RetryPolicy::none(), handler(1, false)),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(fail()), Action::RunHandler { run: 1 }),
                (
                    StepEvent::HandlerDone { ok: true },
                    Action::Finish(Outcome::FailedContinued),
                ),
            ],
        );
        assert_eq!(m.state(), &StepState::Done(Outcome::FailedContinued));
        assert!(
            Outcome::FailedContinued.continues(),
            "a standard workflow goes on"
        );
        assert!(
            !Outcome::FailedContinued.continues_agent(),
            "a map agent's item fails"
        );
        // A fallback that succeeded stands in for the command, after its last run too.
        script(
            StepMachine::new(RetryPolicy::none(), fallback(2, false)),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(fail()), Action::RunHandler { run: 1 }),
                (
                    StepEvent::HandlerDone { ok: true },
                    Action::Spawn { run: 2, attempt: 1 },
                ),
                (StepEvent::Exited(fail()), Action::RunHandler { run: 2 }),
                (
                    StepEvent::HandlerDone { ok: true },
                    Action::Finish(Outcome::Recovered),
                ),
            ],
        );
        // A fallback that failed recovers nothing.
        script(
            StepMachine::new(RetryPolicy::none(), fallback(1, false)),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(fail()), Action::RunHandler { run: 1 }),
                (
                    StepEvent::HandlerDone { ok: false },
                    Action::Finish(Outcome::FailedContinued),
                ),
            ],
        );
        // A later successful run recovers the step.
        script(
            StepMachine::new(RetryPolicy::none(), handler(2, false)),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(fail()), Action::RunHandler { run: 1 }),
                (
                    StepEvent::HandlerDone { ok: true },
                    Action::Spawn { run: 2, attempt: 1 },
                ),
                (StepEvent::Exited(ok()), Action::Check),
                (
                    StepEvent::Checked { ok: true },
                    Action::Finish(Outcome::Succeeded),
                ),
            ],
        );
        // "Still fail workflow after cleanup": an explicit `fail_workflow: true` wins over a
        // fallback.
        script(
            StepMachine::new(RetryPolicy::none(), fallback(1, true)),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(fail()), Action::RunHandler { run: 1 }),
                (
                    StepEvent::HandlerDone { ok: true },
                    Action::Finish(Outcome::Failed),
                ),
            ],
        );
        let cleanup = HandlerPolicy {
            recovers: false,
            ..handler(1, true)
        };
        script(
            StepMachine::new(RetryPolicy::none(), cleanup),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(fail()), Action::RunHandler { run: 1 }),
                (
                    StepEvent::HandlerDone { ok: true },
                    Action::Finish(Outcome::Failed),
                ),
            ],
        );
        let fatal = HandlerPolicy {
            handler_failure_fatal: true,
            ..handler(3, false)
        };
        script(
            StepMachine::new(RetryPolicy::none(), fatal),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(fail()), Action::RunHandler { run: 1 }),
                (
                    StepEvent::HandlerDone { ok: false },
                    Action::Finish(Outcome::Failed),
                ),
            ],
        );
    }

    #[test]
    fn retries_and_handler_runs_compose() {
        // Each run is a retried execution: 2 attempts per run, 2 runs.
        script(
            StepMachine::new(retry(2), handler(2, true)),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (
                    StepEvent::Exited(fail()),
                    Action::Wait {
                        delay: secs(1),
                        next: 2,
                    },
                ),
                (StepEvent::TimerFired, Action::Spawn { run: 1, attempt: 2 }),
                (StepEvent::Exited(fail()), Action::RunHandler { run: 1 }),
                (
                    StepEvent::HandlerDone { ok: true },
                    Action::Spawn { run: 2, attempt: 1 },
                ),
                (
                    StepEvent::Exited(fail()),
                    Action::Wait {
                        delay: secs(1),
                        next: 2,
                    },
                ),
                (StepEvent::TimerFired, Action::Spawn { run: 2, attempt: 2 }),
                (StepEvent::Exited(fail()), Action::RunHandler { run: 2 }),
                (
                    StepEvent::HandlerDone { ok: true },
                    Action::Finish(Outcome::Failed),
                ),
            ],
        );
    }

    #[test]
    fn skip_and_cancel() {
        script(
            StepMachine::new(RetryPolicy::none(), HandlerPolicy::none()),
            &[(StepEvent::Skip, Action::Finish(Outcome::Skipped))],
        );
        script(
            StepMachine::new(retry(3), HandlerPolicy::none()),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Cancel, Action::Kill),
            ],
        );
        script(
            StepMachine::new(retry(3), HandlerPolicy::none()),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (
                    StepEvent::Exited(fail()),
                    Action::Wait {
                        delay: secs(1),
                        next: 2,
                    },
                ),
                (StepEvent::Cancel, Action::Finish(Outcome::Cancelled)),
            ],
        );
    }

    /// A check after a successful command that fails (`commit_required` without a commit)
    /// is a failure of the run: the handler runs, then the command again while runs remain,
    /// and the last failed check ends the step as a failed command would.
    #[test]
    fn a_failed_check_runs_the_handler_and_the_command_again() {
        let m = script(
            StepMachine::new(RetryPolicy::none(), handler(2, false)),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(ok()), Action::Check),
                (
                    StepEvent::Checked { ok: false },
                    Action::RunHandler { run: 1 },
                ),
                (
                    StepEvent::HandlerDone { ok: true },
                    Action::Spawn { run: 2, attempt: 1 },
                ),
                (StepEvent::Exited(ok()), Action::Check),
                (
                    StepEvent::Checked { ok: false },
                    Action::RunHandler { run: 2 },
                ),
                (
                    StepEvent::HandlerDone { ok: true },
                    Action::Finish(Outcome::FailedContinued),
                ),
            ],
        );
        assert_eq!(m.state(), &StepState::Done(Outcome::FailedContinued));
        // Without a handler, a failed check fails the step (or is ignored: `on_failure: true`).
        script(
            StepMachine::new(RetryPolicy::none(), HandlerPolicy::none()),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(ok()), Action::Check),
                (
                    StepEvent::Checked { ok: false },
                    Action::Finish(Outcome::Failed),
                ),
            ],
        );
        script(
            StepMachine::new(RetryPolicy::none(), ignore()),
            &[
                (StepEvent::Start, Action::Spawn { run: 1, attempt: 1 }),
                (StepEvent::Exited(ok()), Action::Check),
                (
                    StepEvent::Checked { ok: false },
                    Action::Finish(Outcome::Ignored),
                ),
            ],
        );
    }

    /// Every (state, event) pair is decided: impossible pairs say `Invalid`, nothing panics.
    #[test]
    fn every_state_event_pair_is_decided() {
        let states = [
            StepState::Pending,
            StepState::Running {
                run: 1,
                attempt: 1,
                run_started: Duration::ZERO,
            },
            StepState::Backoff {
                run: 1,
                next: 2,
                run_started: Duration::ZERO,
            },
            StepState::Fallback { run: 1 },
            StepState::Checking { run: 1 },
            StepState::Handling { run: 1 },
            StepState::Done(Outcome::Succeeded),
        ];
        let events = [
            StepEvent::Start,
            StepEvent::Skip,
            StepEvent::Exited(ok()),
            StepEvent::Exited(fail()),
            StepEvent::TimerFired,
            StepEvent::Checked { ok: true },
            StepEvent::Checked { ok: false },
            StepEvent::HandlerDone { ok: true },
            StepEvent::HandlerDone { ok: false },
            StepEvent::Cancel,
        ];
        let mut rng = StdRng::seed_from_u64(3);
        let mut valid = 0;
        for state in &states {
            for event in &events {
                let mut m = StepMachine::new(
                    RetryPolicy {
                        exhausted: fallback_command(),
                        ..retry(3)
                    },
                    handler(2, true),
                );
                m.state = state.clone();
                let action = m.on_event(event.clone(), secs(1), &mut rng);
                let expect_invalid = matches!(
                    (state, event),
                    (
                        StepState::Pending,
                        StepEvent::Exited(_)
                            | StepEvent::TimerFired
                            | StepEvent::Checked { .. }
                            | StepEvent::HandlerDone { .. }
                    ) | (
                        StepState::Running { .. },
                        StepEvent::Start
                            | StepEvent::Skip
                            | StepEvent::TimerFired
                            | StepEvent::Checked { .. }
                            | StepEvent::HandlerDone { .. }
                    ) | (
                        StepState::Backoff { .. },
                        StepEvent::Start
                            | StepEvent::Skip
                            | StepEvent::Exited(_)
                            | StepEvent::Checked { .. }
                            | StepEvent::HandlerDone { .. }
                    ) | (
                        StepState::Fallback { .. },
                        StepEvent::Start
                            | StepEvent::Skip
                            | StepEvent::TimerFired
                            | StepEvent::Checked { .. }
                            | StepEvent::HandlerDone { .. }
                    ) | (
                        StepState::Checking { .. },
                        StepEvent::Start
                            | StepEvent::Skip
                            | StepEvent::Exited(_)
                            | StepEvent::TimerFired
                            | StepEvent::HandlerDone { .. }
                    ) | (
                        StepState::Handling { .. },
                        StepEvent::Start
                            | StepEvent::Skip
                            | StepEvent::Exited(_)
                            | StepEvent::TimerFired
                            | StepEvent::Checked { .. }
                    ) | (StepState::Done(_), _)
                );
                assert_eq!(
                    action == Action::Invalid,
                    expect_invalid,
                    "{state:?} + {event:?} → {action:?}"
                );
                if action == Action::Invalid {
                    assert_eq!(m.state(), state, "an invalid event leaves the state alone");
                } else {
                    valid += 1;
                }
            }
        }
        // 7 states × 10 events, of which 53 cannot happen.
        assert_eq!(valid, 70 - 53);
    }

    #[test]
    fn jitter_spreads_delays_at_the_cap_below_it() {
        // Exponential 1s, 2s, 4s, ... capped at 4s: retries 3 and 4 sit at the cap. With the
        // old clamp after the draw, half of all draws landed exactly on 4s.
        let policy = RetryPolicy {
            delays: vec![secs(1), secs(2), secs(4), secs(4)],
            max_delay: secs(4),
            jitter: Some(0.5),
            ..retry(5)
        };
        let at_cap: Vec<Duration> = (0..200)
            .map(|seed| policy.delay(4, &mut StdRng::seed_from_u64(seed)))
            .collect();
        let on_the_cap = at_cap.iter().filter(|d| **d == secs(4)).count();
        assert_eq!(on_the_cap, 0, "no retry waits exactly the cap: {at_cap:?}");
        assert!(
            at_cap
                .iter()
                .all(|d| (2.0..=4.0).contains(&d.as_secs_f64())),
            "spread over [max·(1-f), max]: {at_cap:?}"
        );
        let mut distinct = at_cap.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() > 150, "{distinct:?}");
        // Both halves of the window are used: the spread is not squeezed against the cap.
        assert!(at_cap.iter().any(|d| d.as_secs_f64() < 3.0), "{at_cap:?}");
        assert!(at_cap.iter().any(|d| d.as_secs_f64() > 3.5), "{at_cap:?}");
        // A nominal delay above the cap (the error policy's schedule may not be capped) is
        // capped first, then spread the same way.
        let mut rng = StdRng::seed_from_u64(5);
        let d = jitter(secs(60), 0.5, secs(4), &mut rng);
        assert!((2.0..4.0).contains(&d.as_secs_f64()), "{d:?}");
    }

    #[test]
    fn jitter_stays_in_range_and_is_reproducible() {
        let policy = RetryPolicy {
            jitter: Some(0.5),
            ..retry(4)
        };
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            policy.delays(&mut rng).collect::<Vec<_>>()
        };
        assert_eq!(draw(9).len(), 3, "one delay between each pair of attempts");
        assert_eq!(draw(9), draw(9));
        for (n, d) in draw(9).iter().enumerate() {
            let nominal = policy.delays[n].as_secs_f64();
            assert!(
                (nominal * 0.5..=nominal * 1.5).contains(&d.as_secs_f64()),
                "{d:?}"
            );
        }
        // Jitter moves the delays: across seeds they are not all the nominal one.
        let first: Vec<Duration> = (0..20).map(|seed| draw(seed)[0]).collect();
        assert!(first.iter().any(|d| *d != policy.delays[0]), "{first:?}");
        assert!(first.iter().any(|d| *d != first[0]), "{first:?}");
        let plain = retry(4);
        let mut rng = StdRng::seed_from_u64(9);
        assert_eq!(
            plain.delay(2, &mut rng),
            secs(2),
            "no jitter unless enabled"
        );
    }
}
