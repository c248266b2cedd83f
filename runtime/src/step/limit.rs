//! Claude calls under the run's usage-limit gate (docs/language.md §2, "Claude usage
//! limits"): a call waits while the gate is paused, and a call that ends at the account's
//! usage limit pauses the gate and is made again once it opens. The step's machine sees only
//! the call that counted, so a usage limit is no attempt, no `retry_config` retry, no failure
//! of the breaker or the error policy, and no DLQ entry.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use prodigy_plan::{self as plan, ClaudeLimits, PlanStep};
use tokio::sync::watch;

use crate::claude::ErrorKind;
use crate::claude::governor::{Admit, Answer, Governor};
use crate::claude::limit::{Gate, GateAction, GateEvent, LimitStop, clock_text};
use crate::events::Event;
use crate::exec::{self, Output};
use crate::lock;
use crate::message::Message;
use crate::runner::Runner;
use crate::vars::Vars;

/// The run's gate, the wall clock it reads resets against, and the stop it asked for.
pub(crate) struct ClaudeLimitState {
    gate: Mutex<Gate>,
    /// Sets the run's signal when the run stops for the limit.
    halt: watch::Sender<bool>,
    /// Why the run stopped for the limit, once it did.
    stop: Mutex<Option<LimitStop>>,
    /// The wall clock when the run's clock started: resets are given in seconds since the
    /// epoch, waits are taken on the run's (tokio's) clock.
    wall_at_start: Mutex<SystemTime>,
    /// How many Claude calls may run at once, and the shared back-off.
    governor: Mutex<Governor>,
    /// Wakes the calls waiting for a slot when one ends.
    slot_freed: tokio::sync::Notify,
}

impl ClaudeLimitState {
    pub(crate) fn new(limits: ClaudeLimits, halt: watch::Sender<bool>) -> Self {
        ClaudeLimitState {
            gate: Mutex::new(Gate::new(limits)),
            halt,
            stop: Mutex::new(None),
            wall_at_start: Mutex::new(SystemTime::now()),
            governor: Mutex::new(Governor::default()),
            slot_freed: tokio::sync::Notify::new(),
        }
    }
}

/// The run's signal as its steps see it: OUTER (SIGINT, SIGTERM) forwarded into a channel
/// whose sender the run keeps, so that stopping for the usage limit stops the run the way a
/// signal does (running commands end, pending items stay pending, a checkpoint is written).
/// Outside a tokio runtime nothing is forwarded and OUTER is kept.
pub(crate) fn halting(
    outer: watch::Receiver<bool>,
) -> (watch::Receiver<bool>, watch::Sender<bool>) {
    let (halt, merged) = watch::channel(*outer.borrow());
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return (outer, halt);
    };
    let forward = halt.clone();
    let mut outer = outer;
    handle.spawn(async move {
        exec::cancelled(&mut outer).await;
        forward.send_replace(true);
    });
    (merged, halt)
}

impl Runner {
    /// Runs TEMPLATE as a Claude call under the run's gate: it starts once the gate is
    /// open, and is made again, as the same attempt, when it ends at the usage limit. A call
    /// that cannot start (a signal while waiting, the run stopping for the limit) ends as
    /// cancelled.
    pub(crate) async fn run_claude(
        &self,
        template: &plan::Template,
        step: &PlanStep,
        vars: &Vars,
        timeout: Option<Duration>,
        live: bool,
        resume: Option<&crate::claude::Continuation>,
    ) -> Output {
        // When the call was first refused as rate limited or overloaded (`patience`).
        let mut refused_at: Option<Duration> = None;
        loop {
            if let Err(out) = self.claude_gate(step).await {
                return out;
            }
            if let Err(out) = self.claude_slot().await {
                return out;
            }
            let out = self
                .run_claude_call(template, step, vars, timeout, live, resume)
                .await;
            self.release_slot(&out);
            let Some(limit) = out.claude.as_ref().and_then(|c| c.usage_limit.clone()) else {
                let transient = out
                    .claude
                    .as_ref()
                    .and_then(|c| c.verdict.kind)
                    .filter(|k| matches!(k, ErrorKind::RateLimit | ErrorKind::Overloaded));
                let patience = self.plan.claude_limits.patience;
                let now = self.started.elapsed();
                let since = *refused_at.get_or_insert(now);
                match transient {
                    Some(kind) if now.saturating_sub(since) < patience && !out.cancelled => {
                        self.record(&Event::ClaudeCallRepeated {
                            step: step.label.clone(),
                            error_kind: kind,
                            waited_secs: now.saturating_sub(since).as_secs_f64(),
                        });
                        continue;
                    }
                    Some(_) | None => return out,
                }
            };
            let action = self.on_gate(GateEvent::Limited(limit));
            match action {
                GateAction::Paused {
                    limit_type,
                    resets_at,
                    delay,
                } => {
                    self.record(&Event::ClaudeLimitReached {
                        step: step.label.clone(),
                        limit_type: limit_type.clone(),
                        resets_at: rfc3339(resets_at),
                        action: "wait".to_owned(),
                        wait_secs: Some(delay.as_secs_f64()),
                    });
                    self.say_for_run(Message::ClaudePaused {
                        limit_type,
                        resumes_at: clock_text(resets_at, self.wall_secs()),
                    });
                    self.notify_pending(vars).await;
                }
                GateAction::Stop {
                    limit_type,
                    resets_at,
                } => {
                    self.record(&Event::ClaudeLimitReached {
                        step: step.label.clone(),
                        limit_type: limit_type.clone(),
                        resets_at: rfc3339(resets_at),
                        action: "stop".to_owned(),
                        wait_secs: None,
                    });
                    let limits = self.plan.claude_limits;
                    self.say_for_run(Message::ClaudeLimitStop {
                        limit_type: limit_type.clone(),
                        resets_at: clock_text(resets_at, self.wall_secs()),
                        max_wait: (limits.usage_limit == plan::UsageLimitMode::Wait)
                            .then_some(limits.max_wait),
                    });
                    self.notify_pending(vars).await;
                    *lock(&self.claude_limit.stop) = Some(LimitStop {
                        limit_type,
                        resets_at,
                    });
                    self.claude_limit.halt.send_replace(true);
                    return cancelled();
                }
                // Paused already (a call that started before the pause): wait with the
                // others.
                GateAction::Wait { .. } => {}
                GateAction::Halted => return cancelled(),
                GateAction::Go | GateAction::Lifted => {
                    self.say(Message::Bug(crate::message::Bug::GateOpenedOnLimit));
                    return out;
                }
            }
        }
    }

    /// Waits until the gate lets a Claude call of STEP start; the `Output` of a call that
    /// does not start (cancelled) otherwise.
    async fn claude_gate(&self, step: &PlanStep) -> Result<(), Output> {
        loop {
            let delay = match self.on_gate(GateEvent::Acquire) {
                GateAction::Go => return Ok(()),
                GateAction::Lifted => {
                    self.record(&Event::ClaudeLimitLifted {
                        step: step.label.clone(),
                    });
                    self.say_for_run(Message::ClaudeResumed {
                        limit_type: self.limit_type_lifted(),
                    });
                    return Ok(());
                }
                GateAction::Wait { delay } | GateAction::Paused { delay, .. } => delay,
                GateAction::Stop { .. } | GateAction::Halted => return Err(cancelled()),
            };
            let mut cancel = self.cancel_rx();
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = exec::cancelled(&mut cancel) => return Err(cancelled()),
            }
        }
    }

    /// Waits until the rate governor lets one more Claude call run (a slot, and the shared
    /// back-off over); the `Output` of a call that does not start (cancelled) otherwise.
    async fn claude_slot(&self) -> Result<(), Output> {
        loop {
            let freed = self.claude_limit.slot_freed.notified();
            let mut freed = std::pin::pin!(freed);
            // Registered before asking, so that a slot freed in between is not missed.
            freed.as_mut().enable();
            let admit = lock(&self.claude_limit.governor).admit(self.started.elapsed());
            let mut cancel = self.cancel_rx();
            match admit {
                Admit::Go => return Ok(()),
                Admit::Full => tokio::select! {
                    () = freed => {}
                    () = exec::cancelled(&mut cancel) => return Err(cancelled()),
                },
                // The API answering a running call ends the back-off early: ask again.
                Admit::Wait(delay) => tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = freed => {}
                    () = exec::cancelled(&mut cancel) => return Err(cancelled()),
                },
            }
        }
    }

    /// Gives back the slot of a Claude call that ended with OUT, feeding the governor how the
    /// API answered; records and shows a change of the slots.
    fn release_slot(&self, out: &Output) {
        let answer = match out.claude.as_ref() {
            Some(call) if call.usage_limit.is_some() => Answer::Other,
            Some(call) => match call.verdict.kind {
                None => Answer::Ok {
                    answers_counted: call.api_answers > 0,
                },
                Some(ErrorKind::RateLimit | ErrorKind::Overloaded) => {
                    Answer::RateLimited { retry_after: None }
                }
                Some(_) => Answer::Other,
            },
            None => Answer::Other,
        };
        let change = lock(&self.claude_limit.governor).release(answer, self.started.elapsed());
        self.claude_limit.slot_freed.notify_waiters();
        self.slots_changed(change);
    }

    /// The CLI's own retries in NOTES (`system/api_retry`) of 429 and 529 answers feed the
    /// rate governor as they happen.
    pub(crate) fn api_retries_seen(&self, notes: &[crate::claude::Note]) {
        for note in notes {
            let crate::claude::Note::ApiRetry {
                error, delay_ms, ..
            } = note
            else {
                continue;
            };
            let rate_limited = matches!(
                error.as_str(),
                "rate_limit"
                    | "rate_limit_error"
                    | "429"
                    | "overloaded"
                    | "overloaded_error"
                    | "529"
            );
            if !rate_limited {
                continue;
            }
            let change = lock(&self.claude_limit.governor).retried(
                Some(Duration::from_millis(*delay_ms)),
                self.started.elapsed(),
            );
            self.slots_changed(change);
        }
    }

    /// The API answered a request of a running Claude call: the shared back-off ends and
    /// the slots grow again; the calls waiting for either ask again.
    pub(crate) fn api_answered(&self) {
        let change = lock(&self.claude_limit.governor).answered(self.started.elapsed());
        self.claude_limit.slot_freed.notify_waiters();
        self.slots_changed(change);
    }

    /// Records and shows CHANGE of the slots, if any.
    fn slots_changed(&self, change: Option<crate::claude::governor::Change>) {
        let Some(change) = change else {
            return;
        };
        self.record(&Event::ClaudeSlotsChanged {
            slots: change.slots,
            max: change.max,
            reason: if change.lowered {
                "rate_limited"
            } else {
                "recovered"
            }
            .to_owned(),
        });
        self.say_for_run(Message::ClaudeSlots {
            slots: change.slots,
            max: change.max,
        });
    }

    fn on_gate(&self, event: GateEvent) -> GateAction {
        let now = self.started.elapsed();
        let wall = self.wall_secs();
        lock(&self.claude_limit.gate).on(event, now, wall)
    }

    /// Sleeps TIMEOUT on the run's clock from now, not counting the time the Claude gate is
    /// paused meanwhile (a map agent's timeout, docs/language.md §2 "Claude usage limits").
    pub(crate) async fn sleep_unpaused(&self, timeout: Duration) {
        let start = self.started.elapsed();
        loop {
            let paused = lock(&self.claude_limit.gate).paused_since(start);
            let end = start + timeout + paused;
            match end.checked_sub(self.started.elapsed()) {
                Some(left) if !left.is_zero() => tokio::time::sleep(left).await,
                Some(_) | None => return,
            }
        }
    }

    /// The limit whose pause just ended, for the line that says so.
    fn limit_type_lifted(&self) -> String {
        lock(&self.claude_limit.gate).last_limit().to_owned()
    }

    /// The wall clock, in seconds since the epoch, as the run's clock moves it.
    pub(crate) fn wall_secs(&self) -> u64 {
        let start = *lock(&self.claude_limit.wall_at_start);
        (start + self.started.elapsed())
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    /// The runner with `at_start` as the wall clock when its clock started (tests, whose
    /// clock is paused).
    #[cfg(test)]
    #[must_use]
    pub(crate) fn with_wall_clock(self, at_start: SystemTime) -> Self {
        *lock(&self.claude_limit.wall_at_start) = at_start;
        self
    }

    /// Why the run stopped for the account's usage limit, when it did (`usage_limit: stop`,
    /// or a reset beyond `max_wait`): the binary's last line says when to resume.
    pub fn claude_limit_stop(&self) -> Option<LimitStop> {
        lock(&self.claude_limit.stop).clone()
    }
}

/// A Claude call that did not start, or was not waited for.
fn cancelled() -> Output {
    Output {
        cancelled: true,
        ..Output::default()
    }
}

/// EPOCH seconds as RFC 3339.
fn rfc3339(epoch: u64) -> String {
    humantime::format_rfc3339_seconds(SystemTime::UNIX_EPOCH + Duration::from_secs(epoch))
        .to_string()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::mapreduce::{JobOptions, JobOutcome};
    use crate::runner::RunOutcome;
    use crate::testing::{FakeExecutor, Harness, Reply, WALL_CLOCK};

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    const INIT: &str = r#"{"type":"system","subtype":"init","session_id":"s-1","model":"m"}"#;

    /// What the CLI prints at the usage limit: the limit resets `resets_in` seconds after the
    /// harness's wall clock starts.
    fn limited(resets_in: u64) -> Reply {
        Reply::exit(1).stdout(&format!(
            "{INIT}\n{{\"type\":\"rate_limit_event\",\"rate_limit_info\":{{\"status\":\"rejected\",\"resetsAt\":{},\"rateLimitType\":\"five_hour\"}}}}\n{}\n",
            WALL_CLOCK + resets_in,
            r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":429,"num_turns":1,"result":"You've hit your limit · resets 7:00am (UTC)"}"#
        ))
    }

    fn done() -> Reply {
        Reply::ok().stdout(&format!(
            "{INIT}\n{}\n",
            r#"{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"Done."}"#
        ))
    }

    fn items(harness: &Harness, names: &[&str]) {
        let items: Vec<serde_json::Value> = names
            .iter()
            .map(|name| serde_json::json!({"name": name}))
            .collect();
        std::fs::write(
            harness.project.path().join("items.json"),
            serde_json::to_string(&items).unwrap(),
        )
        .unwrap();
    }

    /// Two agents hit the limit (one while the other's call is running); the third agent's
    /// shell step runs during the pause, its Claude call waits; at the reset (plus the
    /// margin) the interrupted calls run again, and nothing fails, however strict the
    /// error policy, and no agent times out while it waits.
    #[tokio::test(start_paused = true)]
    async fn a_usage_limit_pauses_the_job_and_reruns_the_calls_after_the_reset() {
        let fake = FakeExecutor::new()
            .script("prep a", [Reply::ok()])
            .script("prep b", [Reply::ok()])
            .script("prep c", [Reply::ok().takes(secs(100))])
            .script("/work a", [limited(3600).takes(secs(10)), done()])
            .script("/work b", [limited(3600).takes(secs(20)), done()])
            .script("/work c", [done()]);
        let harness = Harness::new(fake);
        items(&harness, &["a", "b", "c"]);
        let started = tokio::time::Instant::now();
        let (report, trace) = harness
            .run_job(
                r#"
name: limited
mode: mapreduce
map:
  input: items.json
  json_path: "$[*]"
  max_parallel: 3
  agent_timeout_secs: 600
  agent_template:
    - shell: "prep ${item.name}"
    - claude: "/work ${item.name}"
error_policy:
  on_item_failure: dlq
  max_failures: 1
  circuit_breaker:
    failure_threshold: 1
"#,
                JobOptions::default(),
            )
            .await;
        assert_eq!(report.outcome, JobOutcome::Completed);
        assert_eq!(report.dlq_count, 0);
        assert_eq!(report.metrics.failed, 0);
        // The reset is an hour after the start; a's call hit it at 10 s: calls wait until
        // 3600 s plus the 5 s margin.
        assert_eq!(harness.fake.starts_of("/work a"), [secs(0), secs(3605)]);
        assert_eq!(harness.fake.starts_of("/work b"), [secs(0), secs(3605)]);
        assert_eq!(harness.fake.starts_of("/work c"), [secs(3605)]);
        assert_eq!(harness.fake.starts_of("prep c"), [secs(0)]);
        assert_eq!(started.elapsed(), secs(3605));
        let events = trace.events();
        let count = |kind: &str| events.iter().filter(|e| **e == kind).count();
        assert_eq!(count("claude_limit_reached"), 1, "{events:?}");
        assert_eq!(count("claude_limit_lifted"), 1, "{events:?}");
        assert_eq!(count("retry_scheduled"), 0, "{events:?}");
        assert_eq!(count("CircuitOpen"), 0, "{events:?}");
        let reached = trace
            .lines
            .iter()
            .find(|l| l.starts_with("claude_limit_reached"))
            .unwrap();
        assert!(
            reached.contains(r#""action":"wait""#)
                && reached.contains(r#""limit_type":"five_hour""#)
                && reached.contains(r#""resets_at":"2026-11-26T07:00:00Z""#)
                && reached.contains(r#""wait_secs":3595.0"#),
            "{reached}"
        );
    }

    /// Under `usage_limit: stop` the run stops at once, resumably: the step does not fail,
    /// and no later step starts.
    #[tokio::test(start_paused = true)]
    async fn usage_limit_stop_interrupts_the_run_without_failing_the_step() {
        let fake = FakeExecutor::new()
            .script("/work", [limited(3600).takes(secs(10)), done()])
            .script("echo after", [Reply::ok()]);
        let harness = Harness::new(fake);
        let (report, trace) = harness
            .run(
                r#"
claude:
  usage_limit: stop
commands:
  - claude: "/work"
    retry_config:
      attempts: 3
  - shell: "echo after"
"#,
            )
            .await;
        assert_eq!(report.outcome, RunOutcome::Interrupted);
        assert_eq!(report.failed_step, None);
        assert_eq!(harness.fake.starts_of("/work"), [secs(0)]);
        assert!(harness.fake.starts_of("echo after").is_empty());
        let reached = trace
            .lines
            .iter()
            .find(|l| l.starts_with("claude_limit_reached"))
            .unwrap();
        assert!(reached.contains(r#""action":"stop""#), "{reached}");
        assert!(!trace.events().contains(&"retry_scheduled"));
    }

    /// A reset later than `max_wait` stops the run too.
    #[tokio::test(start_paused = true)]
    async fn a_reset_beyond_max_wait_stops_the_run() {
        let fake = FakeExecutor::new().script("/work", [limited(7200), done()]);
        let harness = Harness::new(fake);
        let (report, _) = harness
            .run("claude:\n  max_wait: 1h\ncommands:\n  - claude: \"/work\"\n")
            .await;
        assert_eq!(report.outcome, RunOutcome::Interrupted);
        assert_eq!(harness.fake.starts_of("/work"), [secs(0)]);
    }

    fn refused(status: u16) -> Reply {
        Reply::exit(1).stdout(&format!(
            "{INIT}\n{{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":true,\"api_error_status\":{status},\"num_turns\":1,\"result\":\"API Error: {status}\"}}\n"
        ))
    }

    /// A 429 storm: the four calls running are refused at once; the governor halves the
    /// slots down to one and backs off (1 s, doubled per refusal: until 9 s), `patience`
    /// makes the refused calls again as the same attempts, one at a time; the first success
    /// opens a second slot and the second every slot; nothing fails.
    #[tokio::test(start_paused = true)]
    async fn a_rate_limit_storm_narrows_the_claude_calls_and_patience_repeats_them() {
        let mut fake = FakeExecutor::new();
        for name in ["a", "b", "c", "d"] {
            fake = fake.script(
                &format!("/work {name}"),
                [refused(429).takes(secs(1)), done().takes(secs(10))],
            );
        }
        for name in ["e", "f"] {
            fake = fake.script(&format!("/work {name}"), [done().takes(secs(10))]);
        }
        let harness = Harness::new(fake);
        items(&harness, &["a", "b", "c", "d", "e", "f"]);
        let (report, trace) = harness
            .run_job(
                r#"
name: storm
mode: mapreduce
claude:
  patience: 30m
map:
  input: items.json
  json_path: "$[*]"
  max_parallel: 4
  agent_template:
    - claude: "/work ${item.name}"
error_policy:
  on_item_failure: dlq
  max_failures: 1
"#,
                JobOptions::default(),
            )
            .await;
        assert_eq!(report.outcome, JobOutcome::Completed);
        assert_eq!(report.dlq_count, 0);
        let mut later: Vec<Duration> = harness
            .fake
            .calls()
            .into_iter()
            .map(|c| c.at)
            .filter(|at| *at > Duration::ZERO)
            .collect();
        later.sort();
        // One call from the end of the back-off, two after its success, then the rest.
        assert_eq!(
            later,
            [secs(9), secs(19), secs(19), secs(29), secs(29), secs(29)]
        );
        let changes: Vec<&String> = trace
            .lines
            .iter()
            .filter(|l| l.starts_with("claude_slots_changed"))
            .collect();
        assert_eq!(changes.len(), 4, "{changes:?}");
        assert!(
            changes[0].contains(r#""reason":"rate_limited","slots":2"#),
            "{changes:?}"
        );
        assert!(
            changes[1].contains(r#""reason":"rate_limited","slots":1"#),
            "{changes:?}"
        );
        assert!(
            changes[2].contains(r#""reason":"recovered","slots":2"#),
            "{changes:?}"
        );
        assert!(
            changes[3].contains(r#""max":4,"reason":"recovered","slots":4"#),
            "{changes:?}"
        );
        let events = trace.events();
        let count = |kind: &str| events.iter().filter(|e| **e == kind).count();
        assert_eq!(count("claude_call_repeated"), 4, "{events:?}");
        assert_eq!(count("retry_scheduled"), 0, "{events:?}");
    }

    /// A refused call waits for a slot and then for a long shared back-off (the CLI of the
    /// other call retrying a 429 after 30 s); the API answering that other call (an
    /// `assistant` message) ends both at once, and the refused call starts again then, not
    /// when the back-off would have ended.
    #[tokio::test(start_paused = true)]
    async fn the_api_answering_a_running_call_ends_the_back_off_of_the_waiting_ones() {
        let answered = Reply::ok()
            .stdout(&format!(
                "{INIT}\n{}\n{}\n{}\n",
                r#"{"type":"system","subtype":"api_retry","attempt":1,"max_retries":2,"retry_delay_ms":30000,"error_status":429,"error":"rate_limit"}"#,
                r#"{"type":"assistant","message":{"model":"claude-opus-4-8","content":[{"type":"text","text":"Done."}]}}"#,
                r#"{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"Done."}"#
            ))
            .paced(secs(5));
        let fake = FakeExecutor::new().script("/work a", [answered]).script(
            "/work b",
            [refused(429).takes(secs(1)), done().takes(secs(1))],
        );
        let harness = Harness::new(fake);
        items(&harness, &["a", "b"]);
        let (report, trace) = harness
            .run_job(
                "mode: mapreduce\nclaude:\n  patience: 30m\nmap:\n  input: items.json\n  json_path: \"$[*]\"\n  max_parallel: 2\n  agent_template:\n    - claude: \"/work ${item.name}\"\n",
                JobOptions::default(),
            )
            .await;
        assert_eq!(report.outcome, JobOutcome::Completed);
        // a: its retry at 10 s sets the back-off until 40 s, its answer comes at 15 s.
        assert_eq!(harness.fake.starts_of("/work b"), [secs(0), secs(15)]);
        let changes: Vec<&String> = trace
            .lines
            .iter()
            .filter(|l| l.starts_with("claude_slots_changed"))
            .collect();
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert!(
            changes[1].contains(r#""max":2,"reason":"recovered","slots":2"#),
            "{changes:?}"
        );
    }

    /// The CLI retrying a 429 itself (`system/api_retry`), while two calls run, narrows the
    /// slots to one though both calls succeed.
    #[tokio::test(start_paused = true)]
    async fn the_clis_own_retries_of_a_429_feed_the_governor() {
        let retried = Reply::ok().stdout(&format!(
            "{INIT}\n{}\n{}\n",
            r#"{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,"retry_delay_ms":2000,"error_status":429,"error":"rate_limit"}"#,
            r#"{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"Done."}"#
        ));
        let fake = FakeExecutor::new()
            .script("/work a", [retried.takes(secs(5))])
            .script("/work b", [done().takes(secs(10))]);
        let harness = Harness::new(fake);
        items(&harness, &["a", "b"]);
        let (report, trace) = harness
            .run_job(
                "mode: mapreduce\nmap:\n  input: items.json\n  json_path: \"$[*]\"\n  max_parallel: 2\n  agent_template:\n    - claude: \"/work ${item.name}\"\n",
                JobOptions::default(),
            )
            .await;
        assert_eq!(report.outcome, JobOutcome::Completed);
        let change = trace
            .lines
            .iter()
            .find(|l| l.starts_with("claude_slots_changed"))
            .unwrap();
        assert!(
            change.contains(r#""max":2,"reason":"rate_limited","slots":1"#),
            "{change}"
        );
    }
}
