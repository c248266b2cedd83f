//! The Claude budget end to end (`claude: {max_cost_usd}`, `--max-cost-usd`; docs/language.md,
//! "Claude budgets"), with the recorded Claude transcripts replayed in place of the CLI: a job
//! stops before the item that would pass its budget, exits with its own code, and
//! `resume-job --max-cost-usd` finishes it without running any item twice.

use std::process::Output;

use super::{Scratch, root, stderr};

fn replay() -> String {
    root()
        .join("tests/fixtures/claude/replay")
        .display()
        .to_string()
}

fn job_id(output: &Output) -> String {
    let re = regex::Regex::new("mapreduce-[0-9]+-[0-9a-f]+").unwrap();
    re.find_iter(&stderr(output))
        .last()
        .unwrap_or_else(|| panic!("no job id in:\n{}", stderr(output)))
        .as_str()
        .to_owned()
}

fn lines(path: &std::path::Path) -> Vec<String> {
    let mut lines: Vec<String> = std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

/// Each call of the `ok` transcript costs $0.00026: with a budget of $0.001 and one agent at
/// a time, items 1 to 3 run ($0.00078 spent), and the fourth would pass it.
#[test]
fn a_job_stops_at_its_claude_budget_and_resume_job_with_more_finishes_it_once() {
    let scratch = Scratch::new();
    let ran = scratch.dir.path().join("ran");
    std::fs::write(
        scratch.project().join("job.yml"),
        format!(
            "mode: mapreduce\nclaude:\n  max_cost_usd: 0.001\nmap:\n  input: \"seq 1 6\"\n  max_parallel: 1\n  agent_template:\n    - claude: \"/work on ${{item}}\"\n    - shell: \"echo $ITEM >> {}\"\n",
            ran.display()
        ),
    )
    .unwrap();
    scratch.commit();
    let replay = replay();
    let env = [
        ("PRODIGY_CLAUDE_COMMAND", replay.as_str()),
        ("IS_SANDBOX", "1"),
        ("CLAUDE_REPLAY", "ok"),
    ];
    let output = scratch.run(&["run", "--no-worktree", "job.yml"], &env);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(4), "{text}");
    assert!(
        text.contains("stopping: Claude budget reached ($0.0008 of $0.001); 3 items not started, the running agents finish\n"),
        "{text}"
    );
    assert!(
        text.contains("stopped: Claude budget reached ($0.0008 of $0.001); 3 items not started"),
        "{text}"
    );
    assert!(text.contains("--max-cost-usd"), "{text}");
    assert_eq!(lines(&ran), ["1", "2", "3"]);
    let reached: Vec<_> = scratch
        .events()
        .into_iter()
        .filter(|e| e["event_type"] == "claude_budget_reached")
        .collect();
    assert_eq!(reached.len(), 1, "{reached:?}");
    assert_eq!(reached[0]["limit"], 0.001);
    assert_eq!(reached[0]["not_started"], 3);
    let spent = reached[0]["spent"].as_f64().unwrap();
    assert!((spent - 0.00078).abs() < 1e-9, "{spent}");
    let job = job_id(&output);

    // The budget is the job's: resumed under the same one, it stops again at once.
    let output = scratch.run(&["resume-job", &job], &env);
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    assert_eq!(lines(&ran), ["1", "2", "3"]);

    let output = scratch.run(&["resume-job", &job, "--max-cost-usd", "0.01"], &env);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("completed: 6 succeeded"), "{text}");
    // Nothing ran twice.
    assert_eq!(lines(&ran), ["1", "2", "3", "4", "5", "6"]);
}

/// `--max-cost-usd` caps a standard run too: the Claude step that would pass it does not
/// start, and the run says where a resume starts.
#[test]
fn a_standard_run_stops_before_the_claude_step_that_would_pass_its_budget() {
    let scratch = Scratch::new();
    std::fs::write(
        scratch.project().join("flow.yml"),
        "- claude: \"/first\"\n- claude: \"/second\"\n- shell: \"touch after.txt\"\n",
    )
    .unwrap();
    scratch.commit();
    let replay = replay();
    let env = [
        ("PRODIGY_CLAUDE_COMMAND", replay.as_str()),
        ("IS_SANDBOX", "1"),
        ("CLAUDE_REPLAY", "ok"),
    ];
    let output = scratch.run(
        &[
            "run",
            "--no-worktree",
            "--max-cost-usd",
            "0.0004",
            "flow.yml",
        ],
        &env,
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(4), "{text}");
    assert!(
        text.contains("stopped: Claude budget reached ($0.0003 of $0.0004); raise the budget and resume with: prodigy resume"),
        "{text}"
    );
    assert!(!scratch.project().join("after.txt").exists());
    let calls = |scratch: &Scratch| {
        scratch
            .events()
            .into_iter()
            .filter(|e| e["event_type"] == "claude_finished")
            .count()
    };
    assert_eq!(calls(&scratch), 1);
    let session = regex::Regex::new("session-[0-9]+-[0-9a-f]+")
        .unwrap()
        .find(&text)
        .unwrap()
        .as_str()
        .to_owned();
    // What the session spent is carried: under the same budget it stops again at once.
    let output = scratch.run(&["resume", &session, "--max-cost-usd", "0.0004"], &env);
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    assert_eq!(calls(&scratch), 1);
    let output = scratch.run(&["resume", &session, "--max-cost-usd", "0.01"], &env);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(scratch.project().join("after.txt").exists());
    // The first step did not run again.
    assert_eq!(calls(&scratch), 2);
}

/// A budget of nothing is refused before anything runs.
#[test]
fn max_cost_usd_must_be_a_positive_amount() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join("flow.yml"), "- shell: \"true\"\n").unwrap();
    let output = scratch.run(&["run", "--max-cost-usd", "0", "flow.yml"], &[]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("above 0"), "{}", stderr(&output));
}

/// A stand-in for the Claude CLI in the scratch directory: it reads the prompt, whose last
/// word is the item, and runs the shell CASES (`case $item in ... esac` arms) with `$replay`
/// (the replay stub), `$logs` (the run's Claude logs) and `$dir` (the scratch directory).
fn stand_in(scratch: &Scratch, cases: &str) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = scratch.dir.path();
    let path = dir.join("claude");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nreplay={replay}\nlogs={logs}\ndir={dir}\nfor last; do :; done\nif [ \"$last\" = --version ]; then exec $replay --version; fi\nprompt=$(cat)\nitem=${{prompt##* }}\n# Waits (10 s at most) until item_1's Claude log holds TEXT.\nuntil_item_1() {{\n  i=0\n  until grep -qs \"$1\" \"$logs\"/*/*/item_1/*.jsonl || [ $i -ge 200 ]; do i=$((i + 1)); sleep 0.05; done\n}}\ncase $item in\n{cases}\nesac\n",
            replay = replay(),
            logs = scratch.home().join("logs").display(),
            dir = dir.display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// `on_budget: stop` stops the running agents, but a call that already returned its
/// `result` is kept: stopped while its CLI wound down, it ends as the result says, and its
/// agent, whose last step it was, records its item as succeeded instead of leaving it to
/// run (and be paid for) again.
///
/// Item 2's call returns its result, then its CLI lingers; item 1's ends once item 2's
/// result is in its log. Then one agent at the average ($0.00026) beside item 2's call
/// ($0.00026 so far) would pass the $0.0007: the budget is reached and item 2 stopped.
#[test]
fn on_budget_stop_keeps_a_call_that_returned_its_result() {
    let scratch = Scratch::new();
    let claude = stand_in(
        &scratch,
        "  1) until_item_1 '\"type\":\"result\"'; CLAUDE_REPLAY=ok exec $replay ;;\n  2) echo | CLAUDE_REPLAY=ok $replay; sleep 30 ;;\n  *) CLAUDE_REPLAY=ok exec $replay ;;",
    );
    std::fs::write(
        scratch.project().join("job.yml"),
        "mode: mapreduce\nclaude:\n  max_cost_usd: 0.0007\n  on_budget: stop\nmap:\n  input: \"seq 1 3\"\n  max_parallel: 2\n  agent_template:\n    - claude: \"work on ${item}\"\n",
    )
    .unwrap();
    scratch.commit();
    let env = [
        ("PRODIGY_CLAUDE_COMMAND", claude.as_str()),
        ("IS_SANDBOX", "1"),
    ];
    let output = scratch.run(&["run", "--no-worktree", "job.yml"], &env);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(4), "{text}");
    assert!(
        text.contains("1 item not started, the running agents are stopped"),
        "{text}"
    );
    let events = scratch.events();
    let finished: Vec<_> = events
        .iter()
        .filter(|e| e["event_type"] == "claude_finished")
        .collect();
    assert_eq!(finished.len(), 2, "{finished:?}");
    assert!(
        finished.iter().all(|e| e["success"] == true),
        "{finished:?}"
    );
    let completed: Vec<_> = events
        .iter()
        .filter(|e| e["event_type"] == "agent_completed")
        .map(|e| e["item_id"].clone())
        .collect();
    let item_1: Vec<String> = events
        .iter()
        .filter(|e| e["item_id"] == "item_1")
        .map(|e| format!("{} {}", e["event_type"], e))
        .collect();
    assert_eq!(
        completed.len(),
        2,
        "item_1 is kept: {text}\n{}",
        item_1.join("\n")
    );
    let job = job_id(&output);
    let results = std::fs::read_to_string(
        scratch
            .state()
            .join("mapreduce/jobs")
            .join(&job)
            .join("results.jsonl"),
    )
    .unwrap();
    assert_eq!(
        results.matches("\"status\":\"succeeded\"").count(),
        2,
        "{results}"
    );
}

/// A job stopped at its budget and resumed under the same budget starts nothing: no agent
/// begins only to be stopped, and the user is told the budget is spent and how to raise it.
///
/// Item 2's call is still running (no `result`) when item 1's ends and the budget is
/// reached, and is stopped: $0.00026 is spent, and one more item at the average would still
/// fit the $0.0007, but not two.
#[test]
fn a_resume_under_the_budget_it_stopped_at_starts_no_agent() {
    let scratch = Scratch::new();
    let claude = stand_in(
        &scratch,
        "  1) until_item_1 '\"subtype\":\"init\"'; CLAUDE_REPLAY=ok exec $replay ;;\n  2) echo | CLAUDE_REPLAY=ok $replay | head -n 1; sleep 30 ;;\n  *) CLAUDE_REPLAY=ok exec $replay ;;",
    );
    std::fs::write(
        scratch.project().join("job.yml"),
        "mode: mapreduce\nclaude:\n  max_cost_usd: 0.0007\n  on_budget: stop\nmap:\n  input: \"seq 1 4\"\n  max_parallel: 2\n  agent_template:\n    - claude: \"work on ${item}\"\n",
    )
    .unwrap();
    scratch.commit();
    let env = [
        ("PRODIGY_CLAUDE_COMMAND", claude.as_str()),
        ("IS_SANDBOX", "1"),
    ];
    let output = scratch.run(&["run", "--no-worktree", "job.yml"], &env);
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    let job = job_id(&output);
    let started = |scratch: &Scratch| {
        scratch
            .events()
            .iter()
            .filter(|e| e["event_type"] == "agent_started")
            .count()
    };
    assert_eq!(started(&scratch), 2);
    let output = scratch.run(&["resume-job", &job], &env);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(4), "{text}");
    assert_eq!(started(&scratch), 2, "no agent started: {text}");
    assert!(
        text.contains("Claude budget reached ($0.0003 of $0.0007)"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "prodigy resume-job {job} --max-cost-usd AMOUNT (more than $0.0007)"
        )),
        "{text}"
    );
    // Raised, it goes on.
    let output = scratch.run(
        &["resume-job", &job, "--max-cost-usd", "0.01"],
        &[
            ("PRODIGY_CLAUDE_COMMAND", replay().as_str()),
            ("IS_SANDBOX", "1"),
            ("CLAUDE_REPLAY", "ok"),
        ],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("completed: 4 succeeded"), "{text}");
}
