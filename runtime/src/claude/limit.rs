//! The usage limit of a Claude subscription, and the run's Claude gate (docs/language.md §2,
//! "Claude usage limits").
//!
//! When an account reaches its limit, the CLI emits a `rate_limit_event` whose
//! `rate_limit_info.status` is `rejected`, with `resetsAt` (seconds since the epoch) and
//! `rateLimitType` (`five_hour`, `seven_day`, ...), before a failed `result` with
//! `api_error_status: 429` ("You've hit your limit · resets 7:35am (UTC)"). Such a call is
//! not a failure of the step: every other call would be refused the same way until the
//! reset. The [`Gate`] is shared by every Claude call of a run: a call that ends at the
//! limit closes it, no call starts while it is closed, and the call is made again once it
//! opens, without counting as an attempt.

use std::time::Duration;

use prodigy_plan::{ClaudeLimits, UsageLimitMode};
use serde_json::Value;

/// After the reset, before the first call: the account's clock and ours differ a little.
pub const MARGIN: Duration = Duration::from_secs(5);

/// How long to wait when the limit's reset is not known (no `rate_limit_event`, and no time
/// in the CLI's message): the next call then finds out whether it has lifted.
pub const UNKNOWN_RESET: Duration = Duration::from_mins(5);

/// A call ended at the account's usage limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageLimit {
    /// `rateLimitType`: `five_hour`, `seven_day`, ...; `unknown` when the CLI did not say.
    pub limit_type: String,
    /// `resetsAt`, seconds since the epoch, when known.
    pub resets_at: Option<u64>,
}

/// The `rate_limit_info` of a `rate_limit_event`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitInfo {
    /// `allowed`, `allowed_warning` or `rejected`.
    pub status: String,
    /// `rateLimitType`.
    pub limit_type: Option<String>,
    /// `resetsAt`, seconds since the epoch.
    pub resets_at: Option<u64>,
}

impl RateLimitInfo {
    /// The info of a `rate_limit_event` (EVENT, parsed).
    pub fn of(event: &Value) -> Option<Self> {
        let info = event.get("rate_limit_info")?;
        Some(RateLimitInfo {
            status: info.get("status")?.as_str()?.to_owned(),
            limit_type: info
                .get("rateLimitType")
                .and_then(Value::as_str)
                .map(str::to_owned),
            resets_at: info
                .get("resetsAt")
                .and_then(|v| {
                    v.as_u64().or_else(|| {
                        #[expect(
                            clippy::cast_possible_truncation,
                            clippy::cast_sign_loss,
                            reason = "seconds since the epoch, checked to be positive"
                        )]
                        v.as_f64().filter(|f| *f > 0.0).map(|f| f as u64)
                    })
                })
                // A time past the year 9999 (milliseconds, or garbage) is no reset time:
                // the limit is then treated as one whose reset is not known.
                .filter(|at| *at <= LATEST_RESET),
        })
    }
}

/// Whether a failed call (its result's HTTP status STATUS, its message MESSAGE, the last
/// `rate_limit_event`'s INFO) ended at the usage limit, and which: a `rejected` status, or,
/// when no event came, a 429 whose message says the limit is hit (its reset read from the
/// message when it is given in UTC, `resets 7:35am (UTC)`). NOW is the wall clock, in
/// seconds since the epoch.
pub fn usage_limit(
    info: Option<&RateLimitInfo>,
    status: Option<u16>,
    message: &str,
    now: u64,
) -> Option<UsageLimit> {
    if let Some(info) = info.filter(|i| i.status == "rejected") {
        return Some(UsageLimit {
            limit_type: info
                .limit_type
                .clone()
                .unwrap_or_else(|| "unknown".to_owned()),
            resets_at: info.resets_at,
        });
    }
    let lower = message.to_lowercase();
    let says = lower.contains("hit your limit") || lower.contains("usage limit reached");
    (status == Some(429) && says).then(|| UsageLimit {
        limit_type: "unknown".to_owned(),
        resets_at: reset_in_text(&lower, now),
    })
}

/// `resets 7:35am (utc)` (lowercased) as the next such time after NOW, in seconds since the
/// epoch; `None` when the text names no time or another zone.
fn reset_in_text(text: &str, now: u64) -> Option<u64> {
    let rest = &text[text.find("resets ")? + "resets ".len()..];
    let (clock, zone) = rest.split_once(' ')?;
    if !zone.starts_with("(utc)") {
        return None;
    }
    let (clock, pm) = if let Some(c) = clock.strip_suffix("am") {
        (c, false)
    } else {
        (clock.strip_suffix("pm")?, true)
    };
    let (hour, minute) = match clock.split_once(':') {
        Some((h, m)) => (h.parse::<u64>().ok()?, m.parse::<u64>().ok()?),
        None => (clock.parse::<u64>().ok()?, 0),
    };
    if !(1..=12).contains(&hour) || minute > 59 {
        return None;
    }
    let hour = hour % 12 + if pm { 12 } else { 0 };
    let of_day = hour * 3600 + minute * 60;
    let midnight = now - now % 86_400;
    let at = midnight + of_day;
    Some(if at > now { at } else { at + 86_400 })
}

/// The latest reset time read from the CLI (9999-12-31T23:59:59Z): later ones cannot be
/// written as a date, and are not seconds since the epoch.
pub const LATEST_RESET: u64 = 253_402_300_799;

/// `07:35:00 UTC` for EPOCH seconds, with the date before it when it is not the same day as
/// NOW (`2026-11-27 07:35:00 UTC`). To the second: a resume at the printed minute would come
/// before a reset within that minute, and be refused.
pub fn clock_text(epoch: u64, now: u64) -> String {
    let of_day = epoch % 86_400;
    let time = format!(
        "{:02}:{:02}:{:02} UTC",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    );
    if epoch / 86_400 == now / 86_400 {
        return time;
    }
    let date =
        humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(epoch))
            .to_string();
    format!("{} {time}", date.get(..10).unwrap_or(&date))
}

/// The run stopped for the usage limit: resume after `resets_at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitStop {
    /// `five_hour`, `seven_day`, ...
    pub limit_type: String,
    /// When it resets, seconds since the epoch.
    pub resets_at: u64,
}

/// The gate's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateState {
    /// Claude calls start.
    Open,
    /// No Claude call starts before `until` (on the run's clock).
    Paused {
        /// On the run's clock.
        until: Duration,
        /// The limit.
        limit_type: String,
        /// The reset, seconds since the epoch.
        resets_at: u64,
    },
    /// The run stops for the limit; no Claude call starts any more.
    Stopped,
}

/// What happens to the gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateEvent {
    /// A Claude call is about to start.
    Acquire,
    /// A Claude call ended at the usage limit.
    Limited(UsageLimit),
}

/// What the caller does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateAction {
    /// Start the call.
    Go,
    /// The pause is over: record `claude_limit_lifted`, then start the call.
    Lifted,
    /// The limit was reached: record `claude_limit_reached`, say so, and wait DELAY before
    /// asking again.
    Paused {
        /// The limit.
        limit_type: String,
        /// The reset, seconds since the epoch.
        resets_at: u64,
        /// Until the gate opens.
        delay: Duration,
    },
    /// Paused already: wait DELAY before asking again.
    Wait {
        /// Until the gate opens.
        delay: Duration,
    },
    /// Waiting is not wanted (`usage_limit: stop`) or longer than `max_wait`: stop the run
    /// resumably, saying when to resume.
    Stop {
        /// The limit.
        limit_type: String,
        /// The reset, seconds since the epoch.
        resets_at: u64,
    },
    /// The run is stopping for the limit: the call does not start.
    Halted,
}

/// The run's Claude gate: open, or paused until the limit resets.
#[derive(Clone, Debug)]
pub struct Gate {
    limits: ClaudeLimits,
    state: GateState,
    /// The limit of the last pause, for the line that says it lifted.
    last: String,
    /// Every pause, from and until, on the run's clock (the last one may be going on).
    pauses: Vec<(Duration, Duration)>,
}

impl Gate {
    /// An open gate that follows LIMITS (`claude: {usage_limit, max_wait}`).
    pub fn new(limits: ClaudeLimits) -> Self {
        Gate {
            limits,
            state: GateState::Open,
            last: String::new(),
            pauses: Vec::new(),
        }
    }

    /// How long the gate is paused after SINCE (on the run's clock), the pause going on
    /// counted to its planned end: a map agent's timeout does not run while its Claude
    /// calls cannot start.
    pub fn paused_since(&self, since: Duration) -> Duration {
        self.pauses
            .iter()
            .map(|(from, until)| until.saturating_sub((*from).max(since)))
            .sum()
    }

    /// The limit of the last pause.
    pub fn last_limit(&self) -> &str {
        &self.last
    }

    /// Its state.
    pub fn state(&self) -> &GateState {
        &self.state
    }

    /// Feeds EVENT at NOW (the run's clock) and WALL (seconds since the epoch).
    pub fn on(&mut self, event: GateEvent, now: Duration, wall: u64) -> GateAction {
        let (state, action) = match (&self.state, event) {
            (GateState::Open, GateEvent::Acquire) => (GateState::Open, GateAction::Go),
            (GateState::Paused { until, .. }, GateEvent::Acquire) if now >= *until => {
                (GateState::Open, GateAction::Lifted)
            }
            (GateState::Paused { until, .. }, GateEvent::Acquire) => (
                self.state.clone(),
                GateAction::Wait {
                    delay: until.saturating_sub(now),
                },
            ),
            (GateState::Open, GateEvent::Limited(limit)) => {
                let (resets_at, delay) = Self::delay(&limit, wall);
                if self.limits.usage_limit == UsageLimitMode::Stop || delay > self.limits.max_wait {
                    (
                        GateState::Stopped,
                        GateAction::Stop {
                            limit_type: limit.limit_type,
                            resets_at,
                        },
                    )
                } else {
                    (
                        GateState::Paused {
                            until: now + delay,
                            limit_type: limit.limit_type.clone(),
                            resets_at,
                        },
                        GateAction::Paused {
                            limit_type: limit.limit_type,
                            resets_at,
                            delay,
                        },
                    )
                }
            }
            // A call that started before the pause ended at the limit too: the pause lasts
            // until the later reset.
            (
                GateState::Paused {
                    until,
                    limit_type,
                    resets_at,
                },
                GateEvent::Limited(limit),
            ) => {
                let (later, delay) = Self::delay(&limit, wall);
                let until = (*until).max(now + delay);
                if until.saturating_sub(now) > self.limits.max_wait {
                    (
                        GateState::Stopped,
                        GateAction::Stop {
                            limit_type: limit.limit_type,
                            resets_at: later.max(*resets_at),
                        },
                    )
                } else {
                    let (limit_type, resets_at) = if later > *resets_at {
                        (limit.limit_type, later)
                    } else {
                        (limit_type.clone(), *resets_at)
                    };
                    (
                        GateState::Paused {
                            until,
                            limit_type,
                            resets_at,
                        },
                        GateAction::Wait {
                            delay: until.saturating_sub(now),
                        },
                    )
                }
            }
            (GateState::Stopped, GateEvent::Acquire | GateEvent::Limited(_)) => {
                (GateState::Stopped, GateAction::Halted)
            }
        };
        if let GateState::Paused {
            limit_type, until, ..
        } = &state
        {
            limit_type.clone_into(&mut self.last);
            match (&self.state, self.pauses.last_mut()) {
                (GateState::Paused { .. }, Some(last)) => last.1 = *until,
                (GateState::Paused { .. } | GateState::Open | GateState::Stopped, _) => {
                    self.pauses.push((now, *until));
                }
            }
        }
        self.state = state;
        action
    }

    /// When LIMIT resets (seconds since the epoch), and how long from WALL until a call may
    /// start again: the reset plus [`MARGIN`], or [`UNKNOWN_RESET`] when it is not known.
    fn delay(limit: &UsageLimit, wall: u64) -> (u64, Duration) {
        match limit.resets_at {
            Some(at) => (at, Duration::from_secs(at.saturating_sub(wall)) + MARGIN),
            None => (wall + UNKNOWN_RESET.as_secs(), UNKNOWN_RESET),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_hours(1);

    fn limit(resets_at: u64) -> GateEvent {
        GateEvent::Limited(UsageLimit {
            limit_type: "five_hour".into(),
            resets_at: Some(resets_at),
        })
    }

    fn gate(mode: UsageLimitMode, max_wait: Duration) -> Gate {
        Gate::new(ClaudeLimits {
            usage_limit: mode,
            max_wait,
            ..ClaudeLimits::default()
        })
    }

    #[test]
    fn a_limit_pauses_every_call_until_the_reset_and_its_margin() {
        let mut g = gate(UsageLimitMode::Wait, 6 * HOUR);
        let s = Duration::from_secs;
        assert_eq!(g.on(GateEvent::Acquire, s(0), 1000), GateAction::Go);
        // At run time 10 s (wall 1010), the limit resets at wall 4610: an hour away.
        assert_eq!(
            g.on(limit(4610), s(10), 1010),
            GateAction::Paused {
                limit_type: "five_hour".into(),
                resets_at: 4610,
                delay: HOUR + MARGIN
            }
        );
        // Another call asks: it waits for what is left.
        assert_eq!(
            g.on(GateEvent::Acquire, s(610), 1610),
            GateAction::Wait {
                delay: s(3000) + MARGIN
            }
        );
        // A call that was running ends at the limit too: nothing new, the same wait.
        assert_eq!(
            g.on(limit(4610), s(620), 1620),
            GateAction::Wait {
                delay: s(2990) + MARGIN
            }
        );
        let open_at = s(10) + HOUR + MARGIN;
        assert_eq!(g.on(GateEvent::Acquire, open_at, 0), GateAction::Lifted);
        assert_eq!(g.state(), &GateState::Open);
        assert_eq!(g.on(GateEvent::Acquire, open_at, 0), GateAction::Go);
    }

    #[test]
    fn the_time_paused_after_a_moment_counts_every_pause_to_its_end() {
        let mut g = gate(UsageLimitMode::Wait, 6 * HOUR);
        let s = Duration::from_secs;
        assert_eq!(g.paused_since(s(0)), s(0));
        // Paused from 10 s to 10 s + 95 s (a reset 90 s ahead, plus the margin).
        g.on(limit(1100), s(10), 1010);
        assert_eq!(g.paused_since(s(0)), s(95));
        // A later reset lengthens the same pause.
        g.on(limit(1200), s(20), 1020);
        assert_eq!(g.paused_since(s(0)), s(195));
        assert_eq!(g.paused_since(s(100)), s(105));
        assert_eq!(g.on(GateEvent::Acquire, s(205), 0), GateAction::Lifted);
        // A second pause, from 300 s for 5 s.
        g.on(limit(2000), s(300), 2000);
        assert_eq!(g.paused_since(s(0)), s(200));
        assert_eq!(g.paused_since(s(400)), s(0));
    }

    #[test]
    fn stop_mode_and_a_reset_beyond_max_wait_stop_the_run() {
        let mut g = gate(UsageLimitMode::Stop, 6 * HOUR);
        assert_eq!(
            g.on(limit(100), Duration::ZERO, 50),
            GateAction::Stop {
                limit_type: "five_hour".into(),
                resets_at: 100
            }
        );
        assert_eq!(g.on(GateEvent::Acquire, HOUR, 0), GateAction::Halted);
        let mut g = gate(UsageLimitMode::Wait, HOUR);
        // Resets in two hours: more than `max_wait`.
        assert_eq!(
            g.on(limit(7200), Duration::ZERO, 0),
            GateAction::Stop {
                limit_type: "five_hour".into(),
                resets_at: 7200
            }
        );
        // A pause that a later reset would lengthen beyond `max_wait` stops too.
        let mut g = gate(UsageLimitMode::Wait, HOUR);
        assert!(matches!(
            g.on(limit(600), Duration::ZERO, 0),
            GateAction::Paused { .. }
        ));
        assert!(matches!(
            g.on(limit(7200), Duration::ZERO, 0),
            GateAction::Stop {
                resets_at: 7200,
                ..
            }
        ));
    }

    #[test]
    fn an_unknown_reset_is_probed_after_a_while() {
        let mut g = gate(UsageLimitMode::Wait, 6 * HOUR);
        let action = g.on(
            GateEvent::Limited(UsageLimit {
                limit_type: "unknown".into(),
                resets_at: None,
            }),
            Duration::ZERO,
            1000,
        );
        assert_eq!(
            action,
            GateAction::Paused {
                limit_type: "unknown".into(),
                resets_at: 1300,
                delay: UNKNOWN_RESET
            }
        );
    }

    #[test]
    fn a_reset_that_is_no_date_is_an_unknown_reset_and_never_panics() {
        for reset in ["1795678512000", "1.8e19", "18446744073709551615"] {
            let event: Value = serde_json::from_str(&format!(
                r#"{{"type":"rate_limit_event","rate_limit_info":{{"status":"rejected","resetsAt":{reset},"rateLimitType":"five_hour"}}}}"#
            ))
            .unwrap();
            let info = RateLimitInfo::of(&event).unwrap();
            assert_eq!(info.resets_at, None, "{reset}");
            let limit = usage_limit(Some(&info), Some(429), "anything", 0).unwrap();
            assert_eq!(limit.resets_at, None);
        }
        // The latest reset that is a date is still written as one.
        assert!(clock_text(LATEST_RESET, 0).starts_with("9999-12-31 23:59"));
    }

    #[test]
    fn a_rejected_event_or_the_limit_message_is_a_usage_limit() {
        let event: Value = serde_json::from_str(
            r#"{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1795678512,"rateLimitType":"five_hour"}}"#,
        )
        .unwrap();
        let info = RateLimitInfo::of(&event).unwrap();
        assert_eq!(
            usage_limit(Some(&info), Some(429), "anything", 0),
            Some(UsageLimit {
                limit_type: "five_hour".into(),
                resets_at: Some(1_795_678_512)
            })
        );
        let allowed = RateLimitInfo {
            status: "allowed_warning".into(),
            ..info
        };
        // An ordinary 429 is not the usage limit.
        assert_eq!(
            usage_limit(Some(&allowed), Some(429), "API Error: 429", 0),
            None
        );
        // 2026-11-26 06:00 UTC: the message's 7:35am is the same day.
        let now = 1_795_672_800;
        assert_eq!(
            usage_limit(
                None,
                Some(429),
                "You've hit your limit · resets 7:35am (UTC)",
                now
            ),
            Some(UsageLimit {
                limit_type: "unknown".into(),
                resets_at: Some(now + 3600 + 35 * 60)
            })
        );
        // At 08:00, 7:35am is tomorrow; 12pm is noon; another zone is not read.
        assert_eq!(
            reset_in_text("resets 7:35am (utc)", now + 7200),
            Some(now + 86_400 + 5700)
        );
        assert_eq!(
            reset_in_text("resets 12pm (utc)", now),
            Some(now + 6 * 3600)
        );
        assert_eq!(reset_in_text("resets 7:35am (europe/paris)", now), None);
        assert_eq!(clock_text(now + 5700, now), "07:35:00 UTC");
        assert_eq!(clock_text(now + 5742, now), "07:35:42 UTC");
        assert_eq!(clock_text(now + 86_400, now), "2026-11-27 06:00:00 UTC");
    }
}
