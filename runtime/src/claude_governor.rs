//! The run's rate governor for Claude calls (docs/language.md §2, "Claude rate limits"):
//! 429 and 529 answers lower how many Claude calls may run at once (halved, down to 1),
//! successes raise it again (one more per [`RAISE_AFTER`] successful calls, up to the most
//! that ever ran at once), and a call starts only after the shared back-off of the last
//! rate-limited answer, which honours the API's `retry-after`. Pure: time is passed in.

use std::time::Duration;

/// Successful calls, since the last change, that raise the limit by one.
pub const RAISE_AFTER: u32 = 5;
/// The first shared back-off; it doubles with each rate-limited answer in a row.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest shared back-off (a longer `retry-after` is still honoured).
pub const MAX_BACKOFF: Duration = Duration::from_mins(1);

/// How a call ended, as the governor counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// It succeeded.
    Ok,
    /// The API answered 429 or 529 (or the CLI retried such answers), with the delay the
    /// API or the CLI asked for, if any.
    RateLimited {
        /// `retry-after`, or the CLI's `retry_delay_ms`.
        retry_after: Option<Duration>,
    },
    /// Anything else: it changes nothing.
    Other,
}

/// What the governor decided about a call that wants to start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Start it (it holds a slot until [`Governor::release`]).
    Go,
    /// Every slot is taken: wait until a call ends.
    Full,
    /// The shared back-off runs: wait this long.
    Wait(Duration),
}

/// A change of the limit, to record and show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    /// Calls that may run at once now.
    pub slots: usize,
    /// The most that ran at once: the limit it goes back up to.
    pub max: usize,
    /// Whether it went down (a rate-limited answer) or up (successes).
    pub lowered: bool,
}

/// The governor's state.
#[derive(Clone, Debug, Default)]
pub struct Governor {
    /// Calls that may run at once; `None`: no limit (no rate-limited answer yet, or the
    /// limit grew back to the most that ran).
    limit: Option<usize>,
    /// Calls running.
    running: usize,
    /// The most that ran at once.
    peak: usize,
    /// Successful calls since the limit last changed.
    successes: u32,
    /// Rate-limited answers in a row.
    streak: u32,
    /// No call starts before this (the run's clock).
    backoff_until: Duration,
}

impl Governor {
    /// Calls that may run at once, and the most that ran, while limited.
    pub fn limited(&self) -> Option<(usize, usize)> {
        self.limit.map(|l| (l, self.peak))
    }

    /// A call wants to start at NOW.
    pub fn admit(&mut self, now: Duration) -> Admit {
        if let Some(left) = self.backoff_until.checked_sub(now).filter(|d| !d.is_zero()) {
            return Admit::Wait(left);
        }
        match self.limit {
            Some(limit) if self.running >= limit => Admit::Full,
            Some(_) | None => {
                self.running += 1;
                self.peak = self.peak.max(self.running);
                Admit::Go
            }
        }
    }

    /// A call that held a slot ended at NOW with ANSWER; the limit's change, if any.
    pub fn release(&mut self, answer: Answer, now: Duration) -> Option<Change> {
        // The call ran, so it was counted.
        let running_then = self.running;
        self.running = self.running.saturating_sub(1);
        match answer {
            Answer::Ok => {
                self.streak = 0;
                let limit = self.limit?;
                self.successes += 1;
                if self.successes < RAISE_AFTER {
                    return None;
                }
                self.successes = 0;
                let raised = limit + 1;
                self.limit = (raised < self.peak).then_some(raised);
                Some(Change {
                    slots: raised.min(self.peak),
                    max: self.peak,
                    lowered: false,
                })
            }
            Answer::RateLimited { retry_after } => self.refused(retry_after, now, running_then),
            Answer::Other => None,
        }
    }

    /// The CLI, while a call runs, retries an answer of 429 or 529 after `retry_after`: the
    /// same pressure as a refused call, the call keeping its slot.
    pub fn retried(&mut self, retry_after: Option<Duration>, now: Duration) -> Option<Change> {
        self.refused(retry_after, now, self.running)
    }

    /// A rate-limited answer at NOW, RUNNING calls running when it came: the back-off
    /// grows, and the slots are halved.
    fn refused(
        &mut self,
        retry_after: Option<Duration>,
        now: Duration,
        running: usize,
    ) -> Option<Change> {
        self.streak = self.streak.saturating_add(1);
        let doubled = FIRST_BACKOFF.saturating_mul(
            1u32.checked_shl(self.streak.saturating_sub(1).min(16))
                .unwrap_or(u32::MAX),
        );
        let delay = doubled
            .min(MAX_BACKOFF)
            .max(retry_after.unwrap_or_default());
        self.backoff_until = self.backoff_until.max(now + delay);
        self.successes = 0;
        let current = self.limit.unwrap_or(running.max(1));
        let halved = (current / 2).max(1);
        if self.limit == Some(halved) {
            return None;
        }
        self.limit = Some(halved);
        Some(Change {
            slots: halved,
            max: self.peak,
            lowered: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn rate_limits_halve_the_slots_and_successes_raise_them_again() {
        let mut g = Governor::default();
        for _ in 0..8 {
            assert_eq!(g.admit(s(0)), Admit::Go);
        }
        let limited = Answer::RateLimited { retry_after: None };
        // Eight ran at once; one is refused: four may run, and none starts for a second.
        assert_eq!(
            g.release(limited, s(0)),
            Some(Change {
                slots: 4,
                max: 8,
                lowered: true
            })
        );
        assert_eq!(g.admit(s(0)), Admit::Wait(s(1)));
        // Seven still run: no slot until three more end.
        assert_eq!(g.admit(s(1)), Admit::Full);
        assert_eq!(
            g.release(limited, s(1)),
            Some(Change {
                slots: 2,
                max: 8,
                lowered: true
            })
        );
        // The back-off doubled.
        assert_eq!(g.admit(s(2)), Admit::Wait(s(1)));
        g.release(limited, s(3));
        g.release(limited, s(3));
        assert_eq!(g.limited(), Some((1, 8)));
        // The four still running succeed.
        for _ in 0..4 {
            assert_eq!(g.release(Answer::Ok, s(100)), None);
        }
        // One slot: one call runs, the next waits for it.
        assert_eq!(g.admit(s(100)), Admit::Go);
        assert_eq!(g.admit(s(100)), Admit::Full);
        assert_eq!(
            g.release(Answer::Ok, s(100)),
            Some(Change {
                slots: 2,
                max: 8,
                lowered: false
            })
        );
        assert_eq!(g.admit(s(100)), Admit::Go);
        assert_eq!(g.admit(s(100)), Admit::Go);
        assert_eq!(g.admit(s(100)), Admit::Full);
    }

    #[test]
    fn the_cli_retrying_a_429_narrows_the_slots_while_its_call_keeps_its_own() {
        let mut g = Governor::default();
        for _ in 0..4 {
            assert_eq!(g.admit(s(0)), Admit::Go);
        }
        assert_eq!(
            g.retried(Some(s(3)), s(5)),
            Some(Change {
                slots: 2,
                max: 4,
                lowered: true
            })
        );
        assert_eq!(g.admit(s(5)), Admit::Wait(s(3)));
        // All four still run: none ends by the CLI's retry.
        assert_eq!(g.admit(s(8)), Admit::Full);
    }

    #[test]
    fn retry_after_is_honoured_and_the_limit_lifts_at_the_peak() {
        let mut g = Governor::default();
        assert_eq!(g.admit(s(0)), Admit::Go);
        assert_eq!(g.admit(s(0)), Admit::Go);
        let change = g.release(
            Answer::RateLimited {
                retry_after: Some(s(90)),
            },
            s(10),
        );
        assert_eq!(
            change,
            Some(Change {
                slots: 1,
                max: 2,
                lowered: true
            })
        );
        assert_eq!(g.admit(s(10)), Admit::Wait(s(90)));
        assert_eq!(g.admit(s(100)), Admit::Full);
        for _ in 0..RAISE_AFTER {
            g.release(Answer::Ok, s(100));
            assert_eq!(g.admit(s(100)), Admit::Go);
        }
        // Back at the peak of 2: no limit any more.
        assert_eq!(g.limited(), None);
    }
}
