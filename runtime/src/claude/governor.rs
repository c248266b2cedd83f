//! The run's rate governor for Claude calls (docs/language.md §2, "Claude rate limits"):
//! 429 and 529 answers lower how many Claude calls may run at once (halved, down to 1), and a
//! call starts only after the shared back-off of the last rate-limited answer, which honours
//! the API's `retry-after`. The API answering again ends the back-off at once: an outage
//! costs its own length and little more, not the rest of a back-off that grew while the API
//! was down. Each answer doubles the limit, and [`RESTORE_AFTER`] answers in a row lift it
//! (back at the most that ever ran at once): a storm that passed leaves no slow climb behind.
//! Pure: time is passed in.

use std::time::Duration;

/// Successful answers in a row, with no rate-limited one between them, that lift the limit.
pub const RESTORE_AFTER: u32 = 2;
/// The first shared back-off; it doubles with each rate-limited answer in a row.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest shared back-off (a longer `retry-after` is still honoured). Through a long
/// outage this is how often one call asks whether the API is back, so it bounds the time
/// lost after the outage ends; one call every few seconds is no load for the API.
pub const MAX_BACKOFF: Duration = Duration::from_secs(8);

/// How a call ended, as the governor counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// It succeeded.
    Ok {
        /// Its stream reported the API's answers, which were counted as they came
        /// ([`Governor::answered`]); otherwise its success counts as an answer now.
        answers_counted: bool,
    },
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
    /// The shared back-off runs: wait this long, or until the API answers a running call.
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
    /// Successful answers in a row since the last rate-limited one, while limited.
    answers: u32,
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
            Answer::Ok {
                answers_counted: false,
            } => self.answered(now),
            Answer::RateLimited { retry_after } => self.refused(retry_after, now, running_then),
            Answer::Ok {
                answers_counted: true,
            }
            | Answer::Other => None,
        }
    }

    /// The API answered a request of a running call at NOW (or a call succeeded): it is
    /// back, so the shared back-off ends at once, and the limit doubles, or lifts after
    /// [`RESTORE_AFTER`] answers in a row.
    pub fn answered(&mut self, now: Duration) -> Option<Change> {
        self.streak = 0;
        self.backoff_until = self.backoff_until.min(now);
        let limit = self.limit?;
        self.answers = self.answers.saturating_add(1);
        let raised = if self.answers >= RESTORE_AFTER {
            self.peak
        } else {
            limit.saturating_mul(2)
        };
        self.limit = (raised < self.peak).then_some(raised);
        if self.limit.is_none() {
            self.answers = 0;
        }
        Some(Change {
            slots: raised.min(self.peak),
            max: self.peak,
            lowered: false,
        })
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
        self.answers = 0;
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

    const LIMITED: Answer = Answer::RateLimited { retry_after: None };
    /// A success whose stream reported no answer of the API (the replay stub's).
    const OK: Answer = Answer::Ok {
        answers_counted: false,
    };

    #[expect(
        clippy::unnecessary_wraps,
        reason = "compared with what the governor returns"
    )]
    fn raised(slots: usize, max: usize) -> Option<Change> {
        Some(Change {
            slots,
            max,
            lowered: false,
        })
    }

    #[expect(
        clippy::unnecessary_wraps,
        reason = "compared with what the governor returns"
    )]
    fn lowered(slots: usize, max: usize) -> Option<Change> {
        Some(Change {
            slots,
            max,
            lowered: true,
        })
    }

    /// Eight calls run; seven are refused at 0 s, one after the other: one slot of eight,
    /// taken by the call still running, and a back-off until 8 s (its cap).
    fn stormed() -> Governor {
        let mut g = Governor::default();
        for _ in 0..8 {
            assert_eq!(g.admit(s(0)), Admit::Go);
        }
        for _ in 0..7 {
            g.release(LIMITED, s(0));
        }
        assert_eq!(g.limited(), Some((1, 8)));
        g
    }

    #[test]
    fn rate_limits_halve_the_slots_and_successes_raise_them_again() {
        let mut g = Governor::default();
        for _ in 0..8 {
            assert_eq!(g.admit(s(0)), Admit::Go);
        }
        // Eight ran at once; one is refused: four may run, and none starts for a second.
        assert_eq!(g.release(LIMITED, s(0)), lowered(4, 8));
        assert_eq!(g.admit(s(0)), Admit::Wait(s(1)));
        // Seven still run: no slot until three more end.
        assert_eq!(g.admit(s(1)), Admit::Full);
        assert_eq!(g.release(LIMITED, s(1)), lowered(2, 8));
        // The back-off doubled.
        assert_eq!(g.admit(s(2)), Admit::Wait(s(1)));
        g.release(LIMITED, s(3));
        g.release(LIMITED, s(3));
        assert_eq!(g.limited(), Some((1, 8)));
        // The four still running end, refused too: the back-off grows, to its cap.
        for _ in 0..4 {
            g.release(LIMITED, s(3));
        }
        assert_eq!(g.admit(s(3)), Admit::Wait(MAX_BACKOFF));
        // One slot: one call runs, the next waits for it.
        let later = s(3) + MAX_BACKOFF;
        assert_eq!(g.admit(later), Admit::Go);
        assert_eq!(g.admit(later), Admit::Full);
        // It succeeds: two slots, then eight after the second success in a row.
        assert_eq!(g.release(OK, later), raised(2, 8));
        assert_eq!(g.admit(later), Admit::Go);
        assert_eq!(g.admit(later), Admit::Go);
        assert_eq!(g.admit(later), Admit::Full);
        assert_eq!(g.release(OK, later), raised(8, 8));
        assert_eq!(g.limited(), None);
        for _ in 0..7 {
            assert_eq!(g.admit(later), Admit::Go);
        }
    }

    #[test]
    fn the_first_answer_ends_the_shared_back_off_at_once() {
        let mut g = stormed();
        assert_eq!(g.admit(s(1)), Admit::Wait(s(7)));
        // A running call's request is answered at 1 s: the API is back.
        assert_eq!(g.answered(s(1)), raised(2, 8));
        assert_eq!(g.admit(s(1)), Admit::Go);
        // And the next refusal starts the back-off again from its first step.
        assert_eq!(g.release(LIMITED, s(2)), lowered(1, 8));
        assert_eq!(g.admit(s(2)), Admit::Wait(FIRST_BACKOFF));
    }

    #[test]
    fn two_answers_in_a_row_restore_every_slot_and_a_refusal_between_them_does_not() {
        let mut g = stormed();
        assert_eq!(g.answered(s(20)), raised(2, 8));
        // A refusal between two answers: the count of answers in a row starts again.
        assert_eq!(g.retried(None, s(21)), lowered(1, 8));
        assert_eq!(g.answered(s(22)), raised(2, 8));
        assert_eq!(g.answered(s(23)), raised(8, 8));
        assert_eq!(g.limited(), None);
        // No limit: an answer changes nothing.
        assert_eq!(g.answered(s(24)), None);
    }

    #[test]
    fn a_success_whose_answers_were_counted_as_they_came_is_not_counted_again() {
        let mut g = stormed();
        let counted = Answer::Ok {
            answers_counted: true,
        };
        // A call whose last answer came before the storm ends well after it started: it
        // says nothing of the API now.
        assert_eq!(g.release(counted, s(5)), None);
        assert_eq!(g.limited(), Some((1, 8)));
        assert_eq!(g.admit(s(5)), Admit::Wait(s(3)));
    }

    #[test]
    fn through_a_long_outage_one_call_asks_again_within_the_cap() {
        let mut g = Governor::default();
        assert_eq!(g.admit(s(0)), Admit::Go);
        let mut now = s(0);
        // A call refused again and again, each time as soon as the back-off lets it.
        for _ in 0..20 {
            g.release(LIMITED, now);
            let Admit::Wait(wait) = g.admit(now) else {
                panic!("a refusal starts a back-off");
            };
            assert!(wait <= MAX_BACKOFF, "{wait:?}");
            now += wait;
            assert_eq!(g.admit(now), Admit::Go);
        }
        assert_eq!(MAX_BACKOFF, s(8));
    }

    #[test]
    fn the_cli_retrying_a_429_narrows_the_slots_while_its_call_keeps_its_own() {
        let mut g = Governor::default();
        for _ in 0..4 {
            assert_eq!(g.admit(s(0)), Admit::Go);
        }
        assert_eq!(g.retried(Some(s(3)), s(5)), lowered(2, 4));
        assert_eq!(g.admit(s(5)), Admit::Wait(s(3)));
        // All four still run: none ends by the CLI's retry.
        assert_eq!(g.admit(s(8)), Admit::Full);
    }

    #[test]
    fn retry_after_is_honoured_beyond_the_cap_and_the_limit_lifts_at_the_peak() {
        let mut g = Governor::default();
        assert_eq!(g.admit(s(0)), Admit::Go);
        assert_eq!(g.admit(s(0)), Admit::Go);
        let change = g.release(
            Answer::RateLimited {
                retry_after: Some(s(90)),
            },
            s(10),
        );
        assert_eq!(change, lowered(1, 2));
        assert_eq!(g.admit(s(10)), Admit::Wait(s(90)));
        assert_eq!(g.admit(s(100)), Admit::Full);
        // Back at the peak of 2: no limit any more.
        assert_eq!(g.release(OK, s(100)), raised(2, 2));
        assert_eq!(g.limited(), None);
        assert_eq!(g.admit(s(100)), Admit::Go);
        assert_eq!(g.admit(s(100)), Admit::Go);
    }
}
