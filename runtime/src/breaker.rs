//! The circuit breaker of a MapReduce job (docs/language.md §8) as a pure state machine.
//!
//! Closed counts consecutive failures (a success resets the count) and opens at
//! `failure_threshold`. Open rejects agents without starting them until `timeout` has passed;
//! the first agent after that is admitted as a probe and the breaker is half-open. Half-open
//! admits at most `half_open_requests` probes at a time; `success_threshold` successes close
//! it, and any failure opens it again for a fresh `timeout`.
//!
//! Time is the caller's: every event carries `now`, a duration since the job started.

use std::time::Duration;

pub use prodigy_plan::BreakerConfig;

/// Where the breaker is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Agents run; failures in a row so far.
    Closed {
        /// Consecutive failures.
        consecutive_failures: u32,
    },
    /// Agents are rejected until `until`.
    Open {
        /// When probing may start.
        until: Duration,
    },
    /// Probes run.
    HalfOpen {
        /// Probes admitted and not yet finished.
        in_flight: u32,
        /// Probes that succeeded.
        successes: u32,
    },
}

/// What happens to the breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerEvent {
    /// An agent asks to start.
    Admit,
    /// An admitted agent succeeded.
    Success,
    /// An admitted agent failed.
    Failure,
}

/// The breaker's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerAction {
    /// Start the agent.
    Allow,
    /// Start the agent as a half-open probe (the breaker just became half-open, or is).
    Probe,
    /// Do not start the agent: it fails fast as `CircuitOpen`.
    Reject,
    /// Nothing changes that the caller must act on.
    Nothing,
    /// The breaker opened (record `CircuitOpen`).
    Opened,
    /// The breaker closed again (record `CircuitClosed`).
    Closed,
}

/// The breaker.
#[derive(Clone, Debug)]
pub struct Breaker {
    config: BreakerConfig,
    state: BreakerState,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Breaker {
            config,
            state: BreakerState::Closed {
                consecutive_failures: 0,
            },
        }
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// Feeds one event at `now`; returns what the caller must do.
    pub fn on_event(&mut self, event: BreakerEvent, now: Duration) -> BreakerAction {
        let (state, action) = transition(self.config, self.state, event, now);
        self.state = state;
        action
    }
}

/// The transition function.
pub fn transition(
    config: BreakerConfig,
    state: BreakerState,
    event: BreakerEvent,
    now: Duration,
) -> (BreakerState, BreakerAction) {
    use BreakerAction as A;
    use BreakerEvent as E;
    use BreakerState as S;
    let open = || S::Open {
        until: now.saturating_add(config.timeout),
    };
    match (state, event) {
        (S::Closed { .. }, E::Admit) => (state, A::Allow),
        (S::Closed { .. }, E::Success) => (
            S::Closed {
                consecutive_failures: 0,
            },
            A::Nothing,
        ),
        (
            S::Closed {
                consecutive_failures,
            },
            E::Failure,
        ) => {
            let failures = consecutive_failures.saturating_add(1);
            if failures >= config.failure_threshold {
                (open(), A::Opened)
            } else {
                (
                    S::Closed {
                        consecutive_failures: failures,
                    },
                    A::Nothing,
                )
            }
        }
        (S::Open { until }, E::Admit) => {
            if now >= until {
                (
                    S::HalfOpen {
                        in_flight: 1,
                        successes: 0,
                    },
                    A::Probe,
                )
            } else {
                (state, A::Reject)
            }
        }
        // Agents that started before the breaker opened finish while it is open: their
        // results do not move it (the failures already opened it; a late success is no probe).
        (S::Open { .. }, E::Success | E::Failure) => (state, A::Nothing),
        (
            S::HalfOpen {
                in_flight,
                successes,
            },
            E::Admit,
        ) => {
            if in_flight < config.half_open_requests {
                (
                    S::HalfOpen {
                        in_flight: in_flight + 1,
                        successes,
                    },
                    A::Probe,
                )
            } else {
                (state, A::Reject)
            }
        }
        (
            S::HalfOpen {
                in_flight,
                successes,
            },
            E::Success,
        ) => {
            let successes = successes.saturating_add(1);
            if successes >= config.success_threshold {
                (
                    S::Closed {
                        consecutive_failures: 0,
                    },
                    A::Closed,
                )
            } else {
                (
                    S::HalfOpen {
                        in_flight: in_flight.saturating_sub(1),
                        successes,
                    },
                    A::Nothing,
                )
            }
        }
        (S::HalfOpen { .. }, E::Failure) => (open(), A::Opened),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn config() -> BreakerConfig {
        BreakerConfig {
            failure_threshold: 3,
            timeout: secs(30),
            half_open_requests: 2,
            success_threshold: 2,
        }
    }

    /// A breaker that three failures opened at `now`.
    fn opened_at(now: Duration) -> Breaker {
        let mut b = Breaker::new(config());
        for _ in 0..3 {
            b.on_event(BreakerEvent::Failure, now);
        }
        b
    }

    #[test]
    fn closed_opens_after_consecutive_failures_only() {
        let mut b = Breaker::new(config());
        assert_eq!(
            b.on_event(BreakerEvent::Failure, secs(1)),
            BreakerAction::Nothing
        );
        assert_eq!(
            b.on_event(BreakerEvent::Failure, secs(2)),
            BreakerAction::Nothing
        );
        // A success resets the count.
        assert_eq!(
            b.on_event(BreakerEvent::Success, secs(3)),
            BreakerAction::Nothing
        );
        assert_eq!(
            b.state(),
            BreakerState::Closed {
                consecutive_failures: 0
            }
        );
        assert_eq!(
            b.on_event(BreakerEvent::Admit, secs(3)),
            BreakerAction::Allow
        );
        for t in 4..6 {
            assert_eq!(
                b.on_event(BreakerEvent::Failure, secs(t)),
                BreakerAction::Nothing
            );
        }
        assert_eq!(
            b.on_event(BreakerEvent::Failure, secs(6)),
            BreakerAction::Opened
        );
        assert_eq!(b.state(), BreakerState::Open { until: secs(36) });
    }

    #[test]
    fn open_rejects_until_the_timeout_then_probes() {
        let mut b = opened_at(secs(10));
        assert_eq!(
            b.on_event(BreakerEvent::Admit, secs(39)),
            BreakerAction::Reject
        );
        // Late results of agents started before it opened change nothing.
        assert_eq!(
            b.on_event(BreakerEvent::Success, secs(39)),
            BreakerAction::Nothing
        );
        assert_eq!(
            b.on_event(BreakerEvent::Failure, secs(39)),
            BreakerAction::Nothing
        );
        assert_eq!(b.state(), BreakerState::Open { until: secs(40) });
        assert_eq!(
            b.on_event(BreakerEvent::Admit, secs(40)),
            BreakerAction::Probe
        );
        assert_eq!(
            b.state(),
            BreakerState::HalfOpen {
                in_flight: 1,
                successes: 0
            }
        );
    }

    #[test]
    fn half_open_limits_probes_and_closes_on_enough_successes() {
        let mut b = opened_at(secs(0));
        assert_eq!(
            b.on_event(BreakerEvent::Admit, secs(30)),
            BreakerAction::Probe
        );
        assert_eq!(
            b.on_event(BreakerEvent::Admit, secs(30)),
            BreakerAction::Probe
        );
        assert_eq!(
            b.on_event(BreakerEvent::Admit, secs(30)),
            BreakerAction::Reject
        );
        assert_eq!(
            b.on_event(BreakerEvent::Success, secs(31)),
            BreakerAction::Nothing
        );
        // A finished probe frees its slot.
        assert_eq!(
            b.on_event(BreakerEvent::Admit, secs(31)),
            BreakerAction::Probe
        );
        assert_eq!(
            b.on_event(BreakerEvent::Success, secs(32)),
            BreakerAction::Closed
        );
        assert_eq!(
            b.state(),
            BreakerState::Closed {
                consecutive_failures: 0
            }
        );
    }

    #[test]
    fn a_failed_probe_reopens_for_a_fresh_timeout() {
        let mut b = opened_at(secs(0));
        b.on_event(BreakerEvent::Admit, secs(30));
        assert_eq!(
            b.on_event(BreakerEvent::Failure, secs(45)),
            BreakerAction::Opened
        );
        assert_eq!(b.state(), BreakerState::Open { until: secs(75) });
        assert_eq!(
            b.on_event(BreakerEvent::Admit, secs(74)),
            BreakerAction::Reject
        );
    }

    #[test]
    fn every_state_event_pair_has_an_answer() {
        let states = [
            BreakerState::Closed {
                consecutive_failures: 2,
            },
            BreakerState::Open { until: secs(50) },
            BreakerState::HalfOpen {
                in_flight: 2,
                successes: 1,
            },
        ];
        let events = [
            BreakerEvent::Admit,
            BreakerEvent::Success,
            BreakerEvent::Failure,
        ];
        let expected = [
            [
                BreakerAction::Allow,
                BreakerAction::Nothing,
                BreakerAction::Opened,
            ],
            [
                BreakerAction::Reject,
                BreakerAction::Nothing,
                BreakerAction::Nothing,
            ],
            [
                BreakerAction::Reject,
                BreakerAction::Closed,
                BreakerAction::Opened,
            ],
        ];
        for (s, state) in states.iter().enumerate() {
            for (e, event) in events.iter().enumerate() {
                let (_, action) = transition(config(), *state, *event, secs(20));
                assert_eq!(action, expected[s][e], "{state:?} + {event:?}");
            }
        }
    }
}
