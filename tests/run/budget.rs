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
