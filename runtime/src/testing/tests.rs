//! Whole orchestrations driven by the [`FakeExecutor`] on tokio's paused clock: no process
//! runs and nothing sleeps, and every event trace is a reviewed snapshot.

use std::time::Duration;

use super::{FakeExecutor, Harness, Reply};
use crate::mapreduce::{JobOptions, JobOutcome};
use crate::runner::RunOutcome;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[tokio::test(start_paused = true)]
async fn a_standard_run_retries_with_exponential_backoff_on_the_paused_clock() {
    let fake = FakeExecutor::new()
        .script(
            "make flaky",
            [
                Reply::exit(1).stderr("busy\n").takes(secs(1)),
                Reply::exit(1).stderr("busy\n").takes(secs(1)),
                Reply::ok().stdout("built\n").takes(secs(1)),
            ],
        )
        .script("echo after", [Reply::ok().stdout("after\n")]);
    let harness = Harness::new(fake);
    let started = tokio::time::Instant::now();
    let (report, trace) = harness
        .run(
            r"
- shell: make flaky
  retry_config:
    attempts: 3
    backoff: exponential
    initial_delay: 10s
- shell: echo after
",
        )
        .await;
    assert_eq!(report.outcome, RunOutcome::Succeeded);
    // Each attempt takes 1s; then 10s, then 20s of backoff, observed on the paused clock.
    assert_eq!(
        harness.fake.starts_of("make flaky"),
        [secs(0), secs(11), secs(32)]
    );
    assert_eq!(harness.fake.starts_of("echo after"), [secs(33)]);
    assert_eq!(started.elapsed(), secs(33));
    insta::assert_snapshot!(trace.text());
}

#[tokio::test(start_paused = true)]
async fn a_failed_step_runs_its_handler_and_a_false_when_skips_a_step() {
    let fake = FakeExecutor::new()
        .script("cargo test", [Reply::exit(101).stderr("1 test failed\n")])
        .script("echo fixing: 101", [Reply::ok().stdout("fixing\n")])
        .script("echo last", [Reply::ok()]);
    let harness = Harness::new(fake);
    let (report, trace) = harness
        .run(
            r#"
- shell: cargo test
  on_failure:
    shell: "echo fixing: ${shell.exit_code}"
    fail_workflow: false
- shell: echo never
  when: "1 == 2"
- shell: echo last
"#,
        )
        .await;
    assert_eq!(report.outcome, RunOutcome::Succeeded);
    assert_eq!(report.continued.len(), 1, "{:?}", report.continued);
    let ran: Vec<String> = harness.fake.calls().into_iter().map(|c| c.text).collect();
    assert_eq!(ran, ["cargo test", "echo fixing: 101", "echo last"]);
    let events = trace.events();
    assert!(events.contains(&"step_skipped"), "{events:?}");
    assert!(events.contains(&"step_failed_continued"), "{events:?}");
    insta::assert_snapshot!(trace.text());
}

#[tokio::test(start_paused = true)]
async fn a_step_timeout_stops_the_command_when_it_expires() {
    let fake = FakeExecutor::new()
        .script("sleep forever", [Reply::ok().takes(secs(3600))])
        .script("echo never", [Reply::ok()]);
    let harness = Harness::new(fake);
    let started = tokio::time::Instant::now();
    let (report, trace) = harness
        .run("- shell: sleep forever\n  timeout: 30s\n- shell: echo never\n")
        .await;
    assert_eq!(report.outcome, RunOutcome::Failed);
    assert_eq!(started.elapsed(), secs(30));
    assert!(harness.fake.starts_of("echo never").is_empty());
    insta::assert_snapshot!(trace.text());
}

/// A job over six items, ITEM with NAME `a` … `f`, whose agents run `work NAME`.
fn job(policy: &str) -> String {
    format!(
        r#"
name: fake-job
mode: mapreduce
map:
  input: items.json
  json_path: "$[*]"
  max_parallel: 2
  agent_template:
    - shell: "work ${{item.name}}"
{policy}
"#
    )
}

fn job_harness(fake: FakeExecutor) -> Harness {
    let harness = Harness::new(fake);
    let items: Vec<serde_json::Value> = ["a", "b", "c", "d", "e", "f"]
        .iter()
        .map(|name| serde_json::json!({"name": name}))
        .collect();
    std::fs::write(
        harness.project.path().join("items.json"),
        serde_json::to_string(&items).unwrap(),
    )
    .unwrap();
    harness
}

fn working(fake: FakeExecutor, names: &[&str], reply: &Reply) -> FakeExecutor {
    names.iter().fold(fake, |fake, name| {
        fake.script(&format!("work {name}"), [reply.clone()])
    })
}

#[tokio::test(start_paused = true)]
async fn a_map_phase_keeps_max_parallel_and_sends_a_failed_item_to_the_dlq() {
    let fake = working(
        FakeExecutor::new(),
        &["a", "b", "d", "e", "f"],
        &Reply::ok().stdout("done\n").takes(secs(10)),
    )
    .script(
        "work c",
        [Reply::exit(2).stderr("c broke\n").takes(secs(5))],
    );
    let harness = job_harness(fake);
    let started = tokio::time::Instant::now();
    let (report, trace) = harness.run_job(&job(""), JobOptions::default()).await;
    assert_eq!(report.outcome, JobOutcome::Completed);
    assert_eq!(harness.fake.max_running(), 2);
    assert_eq!(harness.fake.calls().len(), 6);
    assert_eq!((report.metrics.successful, report.metrics.failed), (5, 1));
    assert_eq!(report.dlq_count, 1);
    // Two at a time: a, b at 0s; c at 10s (fails at 15s), d at 10s, e at 15s, f at 20s.
    assert_eq!(harness.fake.starts_of("work f"), [secs(20)]);
    assert_eq!(started.elapsed(), secs(30));
    insta::assert_snapshot!(trace.text());
}

#[tokio::test(start_paused = true)]
async fn the_error_policy_stops_the_job_and_leaves_the_rest_pending() {
    let fake = working(
        FakeExecutor::new(),
        &["a", "b", "c", "d", "e", "f"],
        &Reply::exit(1).stderr("down\n").takes(secs(1)),
    );
    let harness = job_harness(fake);
    let (report, trace) = harness
        .run_job(
            &job("error_policy:\n  max_failures: 2\n"),
            JobOptions::default(),
        )
        .await;
    assert!(
        matches!(&report.outcome, JobOutcome::Stopped(why) if why.contains("max_failures")),
        "{:?}",
        report.outcome
    );
    // a and b fail together at 1s; c starts in a's slot before b's failure, the second,
    // stops the job; c finishes, and d, e and f never start.
    assert_eq!(harness.fake.calls().len(), 3);
    assert_eq!(report.pending, 3);
    insta::assert_snapshot!(trace.text());
}

#[tokio::test(start_paused = true)]
async fn the_circuit_breaker_opens_rejects_then_half_opens_on_its_timer() {
    let fake = working(
        FakeExecutor::new(),
        &["c", "d", "e", "f"],
        &Reply::ok().takes(secs(10)),
    )
    .script(
        "work a",
        [Reply::exit(1).stderr("down\n").takes(secs(1)), Reply::ok()],
    )
    .script(
        "work b",
        [Reply::exit(1).stderr("down\n").takes(secs(1)), Reply::ok()],
    );
    let harness = job_harness(fake);
    let (report, trace) = harness
        .run_job(
            &job("error_policy:
  on_item_failure: retry
  retry_config:
    max_attempts: 2
    backoff:
      fixed:
        delay: 60s
  circuit_breaker:
    failure_threshold: 2
    success_threshold: 1
    timeout: 30s
    half_open_requests: 1
"),
            JobOptions {
                max_parallel: Some(1),
                ..JobOptions::default()
            },
        )
        .await;
    let events = trace.events();
    assert!(events.contains(&"CircuitOpen"), "{events:?}");
    assert!(events.contains(&"agent_rejected"), "{events:?}");
    assert!(events.contains(&"CircuitHalfOpen"), "{events:?}");
    assert!(events.contains(&"CircuitClosed"), "{events:?}");
    assert_eq!(harness.fake.max_running(), 1);
    // a and b fail (the breaker opens at 2s); c to f are rejected without running and
    // retried from 62s; a's retry at 61s is the probe after the 30s timeout, and closes it.
    assert_eq!(harness.fake.starts_of("work a"), [secs(0), secs(61)]);
    // A retry that falls due goes to the front of the queue: of those due together at 62s,
    // the last scheduled runs first.
    let order: Vec<String> = harness.fake.calls().into_iter().map(|c| c.text).collect();
    assert_eq!(
        order[3..],
        ["work b", "work f", "work e", "work d", "work c"]
    );
    assert_eq!(harness.fake.starts_of("work f"), [secs(62)]);
    assert_eq!(harness.fake.starts_of("work c"), [secs(92)]);
    assert_eq!(report.outcome, JobOutcome::Completed);
    assert_eq!((report.metrics.successful, report.dlq_count), (6, 0));
    insta::assert_snapshot!(trace.text());
}

#[tokio::test(start_paused = true)]
async fn an_agent_past_its_timeout_fails_as_a_timeout_and_the_job_goes_on() {
    let fake = working(
        FakeExecutor::new(),
        &["a", "b", "c", "d", "f"],
        &Reply::ok().takes(secs(1)),
    )
    .script("work e", [Reply::ok().takes(secs(3600))]);
    let harness = job_harness(fake);
    let started = tokio::time::Instant::now();
    let (report, trace) = harness
        .run_job(
            &job("").replace(
                "  max_parallel: 2\n",
                "  max_parallel: 2\n  agent_timeout_secs: 60\n",
            ),
            JobOptions::default(),
        )
        .await;
    assert_eq!(report.outcome, JobOutcome::Completed);
    assert_eq!(report.dlq_count, 1);
    assert_eq!(report.metrics.error_types.get("Timeout"), Some(&1));
    // Item e started at 2s and was stopped at its 60s.
    assert_eq!(started.elapsed(), secs(62));
    insta::assert_snapshot!(trace.text());
}

#[tokio::test(start_paused = true)]
async fn a_claude_call_goes_through_the_executor_and_its_stream_decides_the_step() {
    let init = r#"{"type":"system","subtype":"init","session_id":"s-1","model":"m"}"#;
    let fake = FakeExecutor::new()
        .script(
            "/fix the bug",
            [Reply::ok()
                .stdout(&format!(
                    "{init}\n{}\n",
                    r#"{"type":"result","subtype":"success","is_error":true,"num_turns":1,"result":"Not logged in · Please run /login"}"#
                ))
                .takes(secs(4))],
        )
        .script(
            "/explain",
            [Reply::ok().stdout(&format!(
                "{init}\n{}\n",
                r#"{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"Done.","total_cost_usd":0.25}"#
            ))],
        )
        .script("echo Done.", [Reply::ok()]);
    let harness = Harness::new(fake);
    let (report, trace) = harness
        .run(
            r#"
- claude: "/explain"
  capture: answer
- shell: "echo ${answer}"
- claude: "/fix the bug"
"#,
        )
        .await;
    // The process exited 0 both times; the stream's `result` is what failed the second call.
    assert_eq!(report.outcome, RunOutcome::Failed);
    assert_eq!(report.failed_step.as_deref(), Some("/fix the bug"));
    assert_eq!(harness.fake.starts_of("echo Done."), [secs(0)]);
    insta::assert_snapshot!(trace.text());
}

/// A resumed job's preflight looks at the phases it has left: from setup all of them, from
/// map the agents and reduce, from reduce only reduce, and nothing once it completed.
#[test]
fn a_resumed_job_is_checked_from_the_phase_it_stopped_in() {
    use crate::jobstore::{JobPhase, Status};
    use prodigy_plan::StepId;
    let plan = Harness::plan(
        "mode: mapreduce\nsetup:\n  - shell: \"echo setup\"\nmap:\n  input: items.json\n  agent_template:\n    - shell: \"echo ${item}\"\nreduce:\n  - shell: \"echo reduce\"\n",
    );
    let step = |text: &str| {
        plan.steps
            .iter()
            .find(|s| s.label.contains(text))
            .map(|s| s.id)
            .unwrap()
    };
    let (setup, agent, reduce) = (step("setup"), step("item"), step("reduce"));
    let harness = Harness::new(FakeExecutor::new());
    let mut cp = crate::session::new_job_checkpoint("job-1", &harness.options(""));
    cp.status = Status::Failed;
    let roots = |cp: &crate::jobstore::JobCheckpoint| -> Vec<StepId> {
        crate::session::resume::job_roots(&plan, cp)
    };
    cp.phase = JobPhase::Setup;
    assert_eq!(roots(&cp), vec![setup, agent, reduce]);
    cp.phase = JobPhase::Map;
    assert_eq!(roots(&cp), vec![agent, reduce]);
    cp.phase = JobPhase::Reduce;
    assert_eq!(roots(&cp), vec![reduce]);
    cp.status = Status::Completed;
    assert!(roots(&cp).is_empty());
}

/// A Claude call of the fake CLI that costs $0.25 and takes SECS.
fn costly_call(secs_taken: u64) -> Reply {
    let init = r#"{"type":"system","subtype":"init","session_id":"s-1","model":"m"}"#;
    let result = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"Done.","total_cost_usd":0.25}"#;
    Reply::ok()
        .stdout(&format!("{init}\n{result}\n"))
        .takes(secs(secs_taken))
}

/// A Claude call of the fake CLI that has said nothing but its `system/init` and takes
/// SECS: stopped before then, it has no `result`.
fn call_without_result(secs_taken: u64) -> Reply {
    let init = r#"{"type":"system","subtype":"init","session_id":"s-1","model":"m"}"#;
    Reply::ok()
        .stdout(&format!("{init}\n"))
        .takes(secs(secs_taken))
}

/// Six items whose agents make one $0.25 Claude call each, two at a time, under a $1 budget
/// with `on_budget: ON`; b's call takes 15s, the others 10s. The fake prints a call's events
/// as it starts; with `d_says_nothing`, d's call prints no `result` in its 10s.
async fn budget_job(
    on: &str,
    d_says_nothing: bool,
) -> (Harness, crate::mapreduce::JobReport, super::Trace) {
    let fake = ["a", "b", "c", "d", "e", "f"]
        .iter()
        .fold(FakeExecutor::new(), |fake, name| {
            let taken = if *name == "b" { 15 } else { 10 };
            let reply = if *name == "d" && d_says_nothing {
                call_without_result(taken)
            } else {
                costly_call(taken)
            };
            fake.script(&format!("/work {name}"), [reply])
        });
    let harness = job_harness(fake);
    let yaml = format!(
        r#"
name: budget-job
mode: mapreduce
claude:
  max_cost_usd: 1
  on_budget: {on}
map:
  input: items.json
  json_path: "$[*]"
  max_parallel: 2
  agent_template:
    - claude: "/work ${{item.name}}"
"#
    );
    let (report, trace) = harness.run_job(&yaml, JobOptions::default()).await;
    (harness, report, trace)
}

/// The budget counts what was spent, an average for each running call and one for the new
/// one: c starts at 10s ($0.25 + 2 × $0.25), d at 15s ($0.50 + 2 × $0.25 = $1), and at 20s
/// ($0.75 + 2 × $0.25 > $1) e does not; d finishes, e and f stay pending.
#[tokio::test(start_paused = true)]
async fn a_job_starts_no_agent_past_its_claude_budget_and_lets_the_running_one_finish() {
    let started = tokio::time::Instant::now();
    let (harness, report, trace) = budget_job("finish", false).await;
    let JobOutcome::BudgetReached {
        reached,
        not_started,
    } = report.outcome
    else {
        panic!("{:?}", report.outcome);
    };
    assert_eq!((reached.spent, reached.limit), (0.75, 1.0));
    assert_eq!(not_started, 2);
    assert_eq!(harness.fake.starts_of("/work c"), [secs(10)]);
    assert_eq!(harness.fake.starts_of("/work d"), [secs(15)]);
    assert!(harness.fake.starts_of("/work e").is_empty());
    assert_eq!(report.metrics.successful, 4);
    assert_eq!(started.elapsed(), secs(25));
    let reached = trace.of_kind("claude_budget_reached");
    assert_eq!(
        reached,
        [r#"claude_budget_reached {"limit":1.0,"not_started":2,"spent":0.75}"#]
    );
}

/// Under `on_budget: stop` the running agent is stopped when the budget is reached: d,
/// started at 15s, is cancelled at 20s and stays pending with e and f.
#[tokio::test(start_paused = true)]
async fn on_budget_stop_cancels_the_running_agents_and_leaves_their_items_pending() {
    let started = tokio::time::Instant::now();
    let (harness, report, trace) = budget_job("stop", true).await;
    assert!(
        matches!(
            report.outcome,
            JobOutcome::BudgetReached { not_started: 3, .. }
        ),
        "{:?}",
        report.outcome
    );
    assert_eq!(harness.fake.starts_of("/work d"), [secs(15)]);
    assert_eq!(report.metrics.successful, 3);
    assert!(started.elapsed() < secs(25), "{:?}", started.elapsed());
    assert!(
        trace.events().contains(&"agent_cancelled"),
        "{}",
        trace.text()
    );
}

/// Under `on_budget: stop`, a running call that already returned its `result` is kept: d's
/// call, whose events are all out when it is stopped at 20s, ends as its result says, and
/// d, whose only step it was, succeeds instead of staying pending to be paid for again.
#[tokio::test(start_paused = true)]
async fn on_budget_stop_keeps_a_running_call_that_returned_its_result() {
    let started = tokio::time::Instant::now();
    let (harness, report, trace) = budget_job("stop", false).await;
    assert!(
        matches!(
            report.outcome,
            JobOutcome::BudgetReached { not_started: 2, .. }
        ),
        "{:?}",
        report.outcome
    );
    assert_eq!(harness.fake.starts_of("/work d"), [secs(15)]);
    assert_eq!(report.metrics.successful, 4);
    // Stopped at 20s, not left to end at 25s.
    assert!(started.elapsed() < secs(25), "{:?}", started.elapsed());
    assert!(
        !trace.events().contains(&"agent_cancelled"),
        "{}",
        trace.text()
    );
}

/// A standard run checks its budget before each Claude step only: the shell step after the
/// first call runs, the second call ($0.25 spent + $0.25 on average > $0.40) does not.
#[tokio::test(start_paused = true)]
async fn a_standard_run_stops_before_the_claude_step_that_would_pass_its_budget() {
    let fake = FakeExecutor::new()
        .script("/first", [costly_call(3)])
        .script("echo between", [Reply::ok()])
        .script("/second", [costly_call(3)]);
    let harness = Harness::new(fake);
    let (report, trace) = harness
        .run(
            "claude:\n  max_cost_usd: 0.4\ncommands:\n  - claude: \"/first\"\n  - shell: \"echo between\"\n  - claude: \"/second\"\n",
        )
        .await;
    assert_eq!(report.outcome, RunOutcome::BudgetReached);
    assert_eq!(report.budget.map(|r| (r.spent, r.limit)), Some((0.25, 0.4)));
    assert_eq!(harness.fake.starts_of("echo between"), [secs(3)]);
    assert!(harness.fake.starts_of("/second").is_empty());
    assert!(
        trace
            .lines
            .iter()
            .any(|l| l == r#"claude_budget_reached {"limit":0.4,"not_started":1,"spent":0.25}"#),
        "{}",
        trace.text()
    );
}

/// A Claude stream of TURNS assistant messages after its `init`, then a successful result.
fn claude_stream(turns: usize) -> String {
    let mut lines = vec![
        r#"{"type":"system","subtype":"init","session_id":"s-1","model":"claude-sonnet-4-5"}"#
            .to_owned(),
    ];
    for _ in 0..turns {
        lines.push(r#"{"type":"assistant","message":{"content":[{"type":"text","text":"working"}],"usage":{"input_tokens":1000,"output_tokens":100}}}"#.to_owned());
    }
    lines.push(r#"{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"Done.","total_cost_usd":0.25}"#.to_owned());
    lines.join("\n") + "\n"
}

/// `stall_timeout` (the workflow's default, or the step's own) ends a call whose CLI went
/// silent that long, as kind `stalled`, which `retry_on: [stalled]` retries; a call whose
/// events keep coming, however slowly, is never stalled.
#[tokio::test(start_paused = true)]
async fn a_silent_claude_call_is_stopped_as_stalled_and_retried() {
    let fake = FakeExecutor::new()
        .script(
            "/hang",
            [
                // Its first event would come after 45 s: stopped at 30 s.
                Reply::ok().stdout(&claude_stream(1)).paced(secs(45)),
                Reply::ok().stdout(&claude_stream(1)).paced(secs(20)),
            ],
        )
        .script(
            "/slow but alive",
            [Reply::ok().stdout(&claude_stream(2)).paced(secs(50))],
        );
    let harness = Harness::new(fake);
    let (report, trace) = harness
        .run(
            r#"
claude:
  stall_timeout: 30s
commands:
  - claude: "/hang"
    retry_config:
      attempts: 2
      initial_delay: 1s
      retry_on: [stalled]
  - claude:
      prompt: "/slow but alive"
      stall_timeout: 1m
"#,
        )
        .await;
    assert_eq!(report.outcome, RunOutcome::Succeeded);
    // Stopped 30 s after it started (and the grace period of its SIGTERM is not needed by
    // the fake), retried 1 s later, done after its three events 20 s apart.
    assert_eq!(harness.fake.starts_of("/hang"), [secs(0), secs(31)]);
    assert_eq!(harness.fake.starts_of("/slow but alive"), [secs(91)]);
    let finished = trace.of_kind("claude_finished");
    assert!(
        finished[0].contains(r#""error_kind":"stalled""#),
        "{}",
        finished[0]
    );
    assert!(finished[1].contains(r#""success":true"#), "{}", finished[1]);
    assert!(finished[2].contains(r#""success":true"#), "{}", finished[2]);
}

/// A Claude call that its step's `timeout` ends is kind `timeout`, which `${error.kind}`
/// gives the handler.
#[tokio::test(start_paused = true)]
async fn a_timed_out_claude_call_is_kind_timeout() {
    let fake = FakeExecutor::new()
        .script(
            "/long",
            [Reply::ok().stdout(&claude_stream(3)).paced(secs(40))],
        )
        .script("echo timeout", [Reply::ok()]);
    let harness = Harness::new(fake);
    let (report, trace) = harness
        .run(
            r#"
- claude: "/long"
  timeout: 100s
  on_failure:
    shell: "echo ${error.kind}"
"#,
        )
        .await;
    // The handler ran, told the kind, and recovered the step.
    assert_eq!(report.outcome, RunOutcome::Succeeded);
    assert_eq!(harness.fake.starts_of("echo timeout"), [secs(100)]);
    let finished = trace
        .lines
        .iter()
        .find(|l| l.starts_with("claude_finished"))
        .unwrap();
    assert!(finished.contains(r#""error_kind":"timeout""#), "{finished}");
    // No `result` came to state the cost: it is estimated from the one assistant message
    // that came, 1000 tokens in and 100 out on Sonnet ($3 and $15 a million).
    assert!(
        finished.contains(r#""cost_estimated":true,"cost_usd":0.0045,"#),
        "{finished}"
    );
    assert!(
        finished.contains(r#""tokens":{"input":1000,"output":100,"#),
        "{finished}"
    );
}

/// Keeps the counts the map phase shows.
#[derive(Default)]
struct Counts(std::sync::Mutex<Vec<crate::progress::Tally>>);

impl crate::events::Reporter for Counts {
    fn message(&self, _: &crate::message::Message, _: Option<&str>) {}
    fn progress(&self, update: &crate::events::ProgressUpdate) {
        if let crate::events::ProgressUpdate::Counts { tally, .. } = update {
            self.0.lock().unwrap().push(*tally);
        }
    }
}

/// While items wait for a slot, every count shown after an outcome says as many agents run
/// as do: the one that takes the finished agent's slot is counted (a plain progress line,
/// printed at the first count after an outcome, used to show one fewer).
#[tokio::test(start_paused = true)]
async fn the_progress_counts_every_running_agent() {
    let fake = working(
        FakeExecutor::new(),
        &["a", "b", "c", "d", "e", "f"],
        &Reply::ok().takes(secs(10)),
    )
    .script("work b", [Reply::ok().takes(secs(3))]);
    let mut harness = job_harness(fake);
    let counts = std::sync::Arc::new(Counts::default());
    harness.reporter = Some(counts.clone());
    let (report, _) = harness.run_job(&job(""), JobOptions::default()).await;
    assert_eq!(report.outcome, JobOutcome::Completed);
    let shown = counts.0.lock().unwrap().clone();
    // Two run at a time until the last item has started (c at 3 s, d at 10 s, e at 13 s,
    // f at 20 s), so every count with items done and items left to start says 2.
    let before_the_end: Vec<u64> = shown
        .iter()
        .filter(|t| t.done >= 1 && t.done <= 4)
        .map(|t| t.running)
        .collect();
    assert!(!before_the_end.is_empty());
    assert!(before_the_end.iter().all(|&n| n == 2), "{shown:?}");
    assert_eq!(shown.last().map(|t| (t.done, t.running)), Some((6, 0)));
}

/// A Claude stream in session SESSION that fails with `error_max_turns`, costing $0.10.
fn claude_max_turns(session: &str) -> String {
    format!(
        "{{\"type\":\"system\",\"subtype\":\"init\",\"session_id\":\"{session}\",\"model\":\"claude-sonnet-4-5\"}}\n\
         {{\"type\":\"result\",\"subtype\":\"error_max_turns\",\"is_error\":true,\"num_turns\":3,\"result\":\"Reached maximum number of turns (3)\",\"total_cost_usd\":0.1,\"session_id\":\"{session}\"}}\n"
    )
}

/// `claude: {on_retry: continue}` makes a retried call, by `retry_config` or by a handler's
/// `max_attempts`, resume the failed attempt's session with a prompt that says why it failed,
/// and the prompt reads that attempt's `${claude.session_id}` and `${claude.error_kind}`;
/// without it a retry starts a fresh session. Every call's cost is counted.
#[tokio::test(start_paused = true)]
async fn a_continued_retry_resumes_the_failed_session() {
    let failed = crate::claude::Continuation {
        session_id: "s-fix".to_owned(),
        kind: crate::claude::ErrorKind::MaxTurns,
        message: "Reached maximum number of turns (3)".to_owned(),
        sent_back: false,
    };
    let handled = crate::claude::Continuation {
        session_id: "s-build".to_owned(),
        ..failed.clone()
    };
    let fake = FakeExecutor::new()
        .script(
            "/fix [] []",
            [Reply::exit(1)
                .stdout(&claude_max_turns("s-fix"))
                .takes(secs(5))],
        )
        .script(
            &failed.prompt("/fix [s-fix] [max_turns]"),
            [Reply::ok().stdout(&claude_stream(1))],
        )
        .script(
            "/build",
            [Reply::exit(1).stdout(&claude_max_turns("s-build"))],
        )
        .script(
            &handled.prompt("/build"),
            [Reply::ok().stdout(&claude_stream(1))],
        )
        .script("echo handled", [Reply::ok()])
        .script(
            "/fresh",
            [
                Reply::exit(1).stdout(&claude_max_turns("s-fresh")),
                Reply::ok().stdout(&claude_stream(1)),
            ],
        );
    let harness = Harness::new(fake);
    let (report, trace) = harness
        .run(
            r#"
claude:
  on_retry: continue
commands:
  - claude: "/fix [${claude.session_id}] [${claude.error_kind}]"
    retry_config:
      attempts: 2
      initial_delay: 1s
  - claude: "/build"
    on_failure:
      shell: "echo handled"
      max_attempts: 2
  - claude:
      prompt: "/fresh"
      on_retry: fresh
    retry_config:
      attempts: 2
      initial_delay: 1s
"#,
        )
        .await;
    assert_eq!(report.outcome, RunOutcome::Succeeded, "{}", trace.text());
    // The retry came 1 s after the first attempt failed at 5 s, with the continued prompt.
    assert_eq!(harness.fake.starts_of("/fix [] []"), [secs(0)]);
    assert_eq!(
        harness
            .fake
            .starts_of(&failed.prompt("/fix [s-fix] [max_turns]")),
        [secs(6)]
    );
    assert_eq!(harness.fake.starts_of(&handled.prompt("/build")).len(), 1);
    assert_eq!(harness.fake.starts_of("/fresh").len(), 2);
    let started = trace.of_kind("claude_started");
    assert_eq!(started.len(), 6, "{}", trace.text());
    let resumes = |line: &str, id: &str| line.contains(&format!(r#""--resume","{id}""#));
    assert!(!started[0].contains("--resume"), "{}", started[0]);
    assert!(resumes(started[1], "s-fix"), "{}", started[1]);
    assert!(!started[2].contains("--resume"), "{}", started[2]);
    assert!(resumes(started[3], "s-build"), "{}", started[3]);
    // `on_retry: fresh` over the workflow's `continue`: a new session.
    assert!(!started[4].contains("--resume"), "{}", started[4]);
    assert!(!started[5].contains("--resume"), "{}", started[5]);
    // 3 failed calls at $0.10 and 3 that succeeded at $0.25, each counted.
    let finished = trace
        .lines
        .iter()
        .find(|l| l.starts_with("workflow_finished"))
        .unwrap();
    assert!(
        finished.contains(r#""calls":6,"failed":3,"#) && finished.contains(r#""cost_usd":1.05,"#),
        "{finished}"
    );
}

/// A running call is counted by what its stream says it has cost so far when that is more
/// than an average call: a's first message already reports $0.95 of usage, so once b ends
/// ($0.05, the average) c would pass the $1 budget (0.05 + 0.95 + 0.05) and does not start,
/// though by the average alone (0.05 + 0.05 + 0.05) it would have.
#[tokio::test(start_paused = true)]
async fn a_running_call_counts_at_what_its_stream_says_it_has_cost_so_far() {
    let init =
        r#"{"type":"system","subtype":"init","session_id":"s-a","model":"claude-sonnet-4-5"}"#;
    let big = r#"{"type":"assistant","message":{"id":"m-1","model":"claude-sonnet-4-5","content":[{"type":"text","text":"reading"}],"usage":{"input_tokens":250000,"output_tokens":13334}}}"#;
    let idle = r#"{"type":"assistant","message":{"id":"m-2","content":[{"type":"text","text":"."}],"usage":{"input_tokens":0,"output_tokens":0}}}"#;
    let result = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"Done.","total_cost_usd":0.95}"#;
    let mut lines = vec![init, big];
    lines.extend(std::iter::repeat_n(idle, 8));
    lines.push(result);
    let slow = Reply::ok()
        .stdout(&(lines.join("\n") + "\n"))
        .paced(secs(1));
    let cheap = |taken: u64| {
        let result = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"Done.","total_cost_usd":0.05}"#;
        Reply::ok()
            .stdout(&format!("{init}\n{result}\n"))
            .takes(secs(taken))
    };
    let fake = FakeExecutor::new()
        .script("/work a", [slow])
        .script("/work b", [cheap(3)])
        .script("/work c", [cheap(1)]);
    let harness = Harness::new(fake);
    std::fs::write(
        harness.project.path().join("items.json"),
        r#"[{"name": "a"}, {"name": "b"}, {"name": "c"}]"#,
    )
    .unwrap();
    let yaml = r#"
name: budget-running
mode: mapreduce
claude:
  max_cost_usd: 1
map:
  input: items.json
  json_path: "$[*]"
  max_parallel: 2
  agent_template:
    - claude: "/work ${item.name}"
"#;
    let (report, _trace) = harness.run_job(yaml, JobOptions::default()).await;
    assert!(
        matches!(
            report.outcome,
            JobOutcome::BudgetReached { not_started: 1, .. }
        ),
        "{:?}",
        report.outcome
    );
    assert!(harness.fake.starts_of("/work c").is_empty());
    assert_eq!(report.metrics.successful, 2);
}
