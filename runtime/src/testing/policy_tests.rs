//! Retries, backoff, timeouts, the circuit breaker and the error policy on tokio's paused
//! clock: the timing and ordering these features promise, asserted exactly (start times as
//! virtual time, attempt counts, event order, the DLQ). Each replaces a `workflows/run`
//! fixture that waited for real delays and whose event order could vary under load; one
//! end-to-end fixture per feature stays there (CONTRIBUTING.md, "Tests of timing").

use std::time::Duration;

use super::{FakeExecutor, Harness, Reply, Trace};
use crate::mapreduce::{JobOptions, JobOutcome, JobReport};
use crate::runner::RunOutcome;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn millis(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Items named `1` to `N` in `items.json` of the harness's project.
fn numbered(fake: FakeExecutor, n: usize) -> Harness {
    let harness = Harness::new(fake);
    let items: Vec<serde_json::Value> = (1..=n)
        .map(|i| serde_json::json!({"name": i.to_string()}))
        .collect();
    std::fs::write(
        harness.project.path().join("items.json"),
        serde_json::to_string(&items).unwrap(),
    )
    .unwrap();
    harness
}

/// A MapReduce workflow over `items.json` whose agents run `work NAME`, one at a time,
/// with MAP (more keys of `map:`, indented by four) and the rest of the workflow after.
fn one_at_a_time(map: &str, rest: &str) -> String {
    format!(
        r#"
name: fake-policy
mode: mapreduce
map:
  input: items.json
  json_path: "$[*]"
  max_parallel: 1
{map}  agent_template:
    - name: slow
      shell: "work ${{item.name}}"
{rest}"#
    )
}

async fn run_job(harness: &Harness, yaml: &str) -> (JobReport, Trace) {
    harness.run_job(yaml, JobOptions::default()).await
}

/// What the DLQ of the harness's job holds: each item's id, failure count and error type.
fn dead_letters(harness: &Harness) -> Vec<(String, u32, String)> {
    let layout = crate::layout::Layout {
        home: harness.home.path().to_owned(),
        repo: "demo".into(),
    };
    crate::dlq::Dlq::new(&layout, "job-test")
        .items()
        .unwrap()
        .into_iter()
        .map(|item| {
            let kind = item
                .failure_history
                .last()
                .map(|f| format!("{:?}", f.error_type))
                .unwrap_or_default();
            (item.item_id, item.failure_count, kind)
        })
        .collect()
}

/// The events of TRACE that say what happened to items and the breaker, without the
/// steps' own events: the order the dispatcher promises.
fn item_events(trace: &Trace) -> Vec<String> {
    const SHOWN: [&str; 10] = [
        "agent_started",
        "agent_completed",
        "agent_failed",
        "agent_rejected",
        "item_retry_scheduled",
        "item_skipped",
        "CircuitOpen",
        "CircuitHalfOpen",
        "CircuitClosed",
        "map_finished",
    ];
    trace
        .lines
        .iter()
        .filter(|l| SHOWN.iter().any(|k| l.split(' ').next() == Some(*k)))
        .map(|l| {
            // The kind and the item, enough to read the order.
            let kind = l.split(' ').next().unwrap_or_default();
            let item = l
                .split("\"item_id\":\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or("");
            format!("{kind} {item}").trim_end().to_owned()
        })
        .collect()
}

/// The timing `workflows/run/mapreduce-retry-skip-custom.yml` shows end to end: item 1 fails
/// twice and passes on its third run. A retry that falls due while another item runs goes
/// next; one that falls due with the slot free runs after exactly its delay.
#[tokio::test(start_paused = true)]
async fn a_failed_item_is_retried_after_its_delay_and_goes_next_once_due() {
    let fake = FakeExecutor::new()
        .script(
            "work 1",
            [
                Reply::exit(1).stderr("flaky 1\n").takes(secs(2)),
                Reply::exit(1).stderr("flaky 2\n").takes(secs(2)),
                Reply::ok().stdout("item 1 ok on run 3\n").takes(secs(2)),
            ],
        )
        .rule(|_| Reply::ok().takes(secs(2)));
    let harness = numbered(fake, 4);
    let started = tokio::time::Instant::now();
    let (report, trace) = run_job(
        &harness,
        &one_at_a_time(
            "",
            "error_policy:
  on_item_failure: retry
  retry_config:
    max_attempts: 3
    backoff:
      fixed:
        delay: 5s
",
        ),
    )
    .await;
    assert_eq!(report.outcome, JobOutcome::Completed);
    assert_eq!((report.metrics.successful, report.dlq_count), (4, 0));
    // 1 fails at 2s and is due at 7s, while 4 runs (6s to 8s): it goes next, at 8s. It
    // fails at 10s and, with nothing else to run, starts again when due at 15s.
    assert_eq!(
        harness.fake.starts_of("work 1"),
        [secs(0), secs(8), secs(15)]
    );
    assert_eq!(harness.fake.starts_of("work 2"), [secs(2)]);
    assert_eq!(harness.fake.starts_of("work 4"), [secs(6)]);
    assert_eq!(started.elapsed(), secs(17));
    assert_eq!(
        item_events(&trace),
        [
            "agent_started item_0",
            "agent_failed item_0",
            "item_retry_scheduled item_0",
            "agent_started item_1",
            "agent_completed item_1",
            "agent_started item_2",
            "agent_completed item_2",
            "agent_started item_3",
            "agent_completed item_3",
            "agent_started item_0",
            "agent_failed item_0",
            "item_retry_scheduled item_0",
            "agent_started item_0",
            "agent_completed item_0",
            "map_finished",
        ]
    );
    insta::assert_snapshot!(trace.text());
}

/// An item that fails every run goes to the DLQ once its attempts are spent, with each
/// failure counted; the delays between runs are the exponential schedule.
#[tokio::test(start_paused = true)]
async fn an_item_out_of_retries_goes_to_the_dlq_after_the_exponential_delays() {
    let fake = FakeExecutor::new()
        .script("work 1", [Reply::exit(3).stderr("broken\n").takes(secs(1))])
        .rule(|_| Reply::ok().takes(secs(1)));
    let harness = numbered(fake, 1);
    let (report, trace) = run_job(
        &harness,
        &one_at_a_time(
            "",
            "error_policy:
  on_item_failure: retry
  retry_config:
    max_attempts: 3
    backoff:
      exponential:
        initial: 4s
        multiplier: 2
",
        ),
    )
    .await;
    assert_eq!(report.outcome, JobOutcome::Completed);
    // Runs at 0s, 1s + 4s, 6s + 8s.
    assert_eq!(
        harness.fake.starts_of("work 1"),
        [secs(0), secs(5), secs(14)]
    );
    assert_eq!(report.dlq_count, 1);
    assert_eq!(
        dead_letters(&harness),
        [(
            "item_0".to_owned(),
            3,
            "CommandFailed { exit_code: 3 }".to_owned()
        )]
    );
    let delays = trace.of_kind("item_retry_scheduled");
    assert_eq!(delays.len(), 2, "{delays:?}");
    assert!(delays[0].contains("\"delay_secs\":4.0"), "{delays:?}");
    assert!(delays[1].contains("\"delay_secs\":8.0"), "{delays:?}");
}

/// Was `workflows/run/mapreduce-breaker-recovers.yml`: the breaker's whole cycle. Item 1's
/// failure opens it; 2 and 3 are rejected as `CircuitOpen` without running and retried by
/// the policy; once its 200ms timeout passed, the first retry due is the probe (half-open),
/// passes and closes it, and every item ends up done.
#[tokio::test(start_paused = true)]
async fn the_breaker_recovers_through_one_probe_after_its_timeout() {
    let fake = FakeExecutor::new()
        .script(
            "work 1",
            [
                Reply::exit(1).stderr("down\n").takes(millis(100)),
                Reply::ok().stdout("item 1 ok\n").takes(millis(100)),
            ],
        )
        .rule(|_| Reply::ok().takes(millis(100)));
    let harness = numbered(fake, 3);
    let (report, trace) = run_job(
        &harness,
        &one_at_a_time(
            "",
            "error_policy:
  on_item_failure: retry
  retry_config:
    max_attempts: 3
    backoff:
      fixed:
        delay: 500ms
  circuit_breaker:
    failure_threshold: 1
    success_threshold: 1
    timeout: 200ms
    half_open_requests: 1
",
        ),
    )
    .await;
    assert_eq!(report.outcome, JobOutcome::Completed);
    assert_eq!((report.metrics.successful, report.dlq_count), (3, 0));
    // 2 and 3 never ran while the breaker was open: their only run is after the probe.
    assert_eq!(harness.fake.calls().len(), 4);
    assert_eq!(harness.fake.starts_of("work 1"), [millis(0), millis(600)]);
    assert_eq!(harness.fake.starts_of("work 3"), [millis(700)]);
    assert_eq!(harness.fake.starts_of("work 2"), [millis(800)]);
    assert_eq!(
        item_events(&trace),
        [
            "agent_started item_0",
            "CircuitOpen item_0",
            "agent_failed item_0",
            "item_retry_scheduled item_0",
            "agent_rejected item_1",
            "agent_rejected item_2",
            "agent_failed item_1",
            "item_retry_scheduled item_1",
            "agent_failed item_2",
            "item_retry_scheduled item_2",
            "CircuitHalfOpen item_0",
            "agent_started item_0",
            "CircuitClosed item_0",
            "agent_completed item_0",
            "agent_started item_2",
            "agent_completed item_2",
            "agent_started item_1",
            "agent_completed item_1",
            "map_finished",
        ]
    );
    insta::assert_snapshot!(trace.text());
}

/// Was `workflows/run/mapreduce-timeout-config.yml`: `timeout_config` limits the step named
/// `slow` (`PerCommand`), and `timeout_action: skip` skips the timed-out item instead of
/// dead-lettering it; the job goes on.
#[tokio::test(start_paused = true)]
async fn a_per_command_timeout_skips_the_item_and_the_job_goes_on() {
    let fake = FakeExecutor::new()
        .script("work 2", [Reply::ok().takes(secs(3600))])
        .rule(|_| Reply::ok().takes(millis(100)));
    let harness = numbered(fake, 3);
    let started = tokio::time::Instant::now();
    let (report, trace) = run_job(
        &harness,
        &one_at_a_time(
            "  timeout_config:
    timeout_policy: PerCommand
    command_timeouts:
      slow: 1
    cleanup_grace_period_secs: 1
    timeout_action: skip
",
            "",
        ),
    )
    .await;
    assert_eq!(report.outcome, JobOutcome::Completed);
    assert_eq!(
        (
            report.metrics.successful,
            report.metrics.skipped,
            report.dlq_count
        ),
        (2, 1, 0)
    );
    assert_eq!(report.metrics.error_types.get("Timeout"), Some(&1));
    assert!(dead_letters(&harness).is_empty());
    // 2 starts at 100ms and is stopped at its 1s; 3 runs after it.
    assert_eq!(harness.fake.starts_of("work 3"), [millis(1100)]);
    assert_eq!(started.elapsed(), millis(1200));
    assert_eq!(
        item_events(&trace),
        [
            "agent_started item_0",
            "agent_completed item_0",
            "agent_started item_1",
            "agent_failed item_1",
            "item_skipped item_1",
            "agent_started item_2",
            "agent_completed item_2",
            "map_finished",
        ]
    );
    let timed_out = trace
        .lines
        .iter()
        .find(|l| l.starts_with("agent_failed"))
        .unwrap();
    assert!(
        timed_out.contains("\"error_type\":\"Timeout\""),
        "{timed_out}"
    );
    assert!(timed_out.contains("timed out after 1s"), "{timed_out}");
}

/// A setup phase past its `timeout` is stopped and fails the job before any map work
/// (`workflows/run/mapreduce-setup-timeout.yml` runs it end to end).
#[tokio::test(start_paused = true)]
async fn a_setup_past_its_timeout_fails_the_job_before_any_agent() {
    let fake = FakeExecutor::new()
        .script("prepare", [Reply::ok().takes(secs(3600))])
        .rule(|_| Reply::ok());
    let harness = numbered(fake, 3);
    let started = tokio::time::Instant::now();
    let (report, trace) = run_job(
        &harness,
        r#"
name: fake-setup-timeout
mode: mapreduce
setup:
  commands:
    - shell: prepare
  timeout: 30
map:
  input: items.json
  json_path: "$[*]"
  agent_template:
    - shell: "work ${item.name}"
"#,
    )
    .await;
    assert!(
        matches!(&report.outcome, JobOutcome::Failed { .. }),
        "{:?}",
        report.outcome
    );
    assert_eq!(started.elapsed(), secs(30));
    let ran: Vec<String> = harness.fake.calls().into_iter().map(|c| c.text).collect();
    assert_eq!(ran, ["prepare"]);
    let events = trace.events();
    assert!(!events.contains(&"agent_started"), "{events:?}");
    assert!(!events.contains(&"map_started"), "{events:?}");
}

/// Was the hanging entry of `workflows/run/notify-failed.yml`: a notification that hangs is
/// stopped at its `timeout` and reported, and the run ends as it would have without it (the
/// next notification still runs).
#[tokio::test(start_paused = true)]
async fn a_hung_notification_is_stopped_at_its_timeout_and_the_run_still_fails() {
    let fake = FakeExecutor::new()
        .script("make test", [Reply::exit(2).stderr("tests broke\n")])
        .script("hang", [Reply::ok().takes(secs(3600))])
        .rule(|_| Reply::ok());
    let harness = Harness::new(fake);
    let started = tokio::time::Instant::now();
    let (report, trace) = harness
        .run(
            r#"
name: fake-notify
commands:
  - shell: make test
notify:
  - on: [failed]
    shell: hang
    timeout: 5s
  - on: [failed]
    shell: "echo told ${event.status}"
  - on: [finished]
    shell: "echo never runs"
"#,
        )
        .await;
    assert_eq!(report.outcome, RunOutcome::Failed);
    assert_eq!(harness.fake.starts_of("hang"), [secs(0)]);
    assert_eq!(harness.fake.starts_of("echo told failed"), [secs(5)]);
    assert!(harness.fake.starts_of("echo never runs").is_empty());
    assert_eq!(started.elapsed(), secs(5));
    let notified = trace.of_kind("notification_finished");
    assert_eq!(notified.len(), 2, "{notified:?}");
    assert!(notified[0].contains("\"timed_out\":true"), "{notified:?}");
    assert!(notified[1].contains("\"success\":true"), "{notified:?}");
}

/// `retry_budget` bounds the attempts and delays together: a retry whose delay would cross
/// it is not started, and `on_failure: continue` lets the run go on.
#[tokio::test(start_paused = true)]
async fn a_retry_that_would_cross_the_budget_is_not_started() {
    let fake = FakeExecutor::new()
        .script("fetch", [Reply::exit(1).stderr("busy\n").takes(secs(1))])
        .script("echo after", [Reply::ok()]);
    let harness = Harness::new(fake);
    let (report, _) = harness
        .run(
            r"
- shell: fetch
  retry_config:
    attempts: 5
    backoff: fixed
    initial_delay: 10s
    retry_budget: 25s
    on_failure: continue
- shell: echo after
",
        )
        .await;
    assert_eq!(report.outcome, RunOutcome::Succeeded);
    // 0s, 11s, 22s; a fourth at 33s would cross 25s.
    assert_eq!(
        harness.fake.starts_of("fetch"),
        [secs(0), secs(11), secs(22)]
    );
    assert_eq!(harness.fake.starts_of("echo after"), [secs(23)]);
}

/// An exponential backoff stops growing at `max_delay`; `retry_on` retries only the
/// failures it names, so a 404 under `[server_error]` is not retried.
#[tokio::test(start_paused = true)]
async fn exponential_delays_stop_at_max_delay_and_retry_on_picks_what_is_retried() {
    let fake = FakeExecutor::new()
        .script(
            "upload",
            [
                Reply::exit(1).stderr("HTTP 503\n"),
                Reply::exit(1).stderr("HTTP 503\n"),
                Reply::exit(1).stderr("HTTP 503\n"),
                Reply::ok(),
            ],
        )
        .script("lookup", [Reply::exit(1).stderr("HTTP 404 not found\n")])
        .rule(|_| Reply::ok());
    let harness = Harness::new(fake);
    let (report, _) = harness
        .run(
            r"
- shell: upload
  retry_config:
    attempts: 4
    backoff: exponential
    initial_delay: 10s
    max_delay: 15s
    retry_on: [server_error]
- shell: lookup
  retry_config:
    attempts: 3
    initial_delay: 10s
    retry_on: [server_error]
    on_failure: continue
",
        )
        .await;
    assert_eq!(report.outcome, RunOutcome::Succeeded);
    // Delays 10s, then 20s and 40s capped at 15s.
    assert_eq!(
        harness.fake.starts_of("upload"),
        [secs(0), secs(10), secs(25), secs(40)]
    );
    assert_eq!(harness.fake.starts_of("lookup"), [secs(40)]);
}
