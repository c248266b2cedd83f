//! `notify:` on the events the run fixtures cannot drive (docs/language.md §2,
//! "Notifications"): `paused` at a subscription's usage limit and `budget_reached` at the
//! Claude budget, with the recorded Claude transcripts replayed in place of the CLI.

use super::{Scratch, root, stderr};

fn replay() -> String {
    root()
        .join("tests/fixtures/claude/replay")
        .display()
        .to_string()
}

fn run(scratch: &Scratch, args: &[&str], workflow: &str, env: &[(&str, &str)]) -> super::Output {
    std::fs::write(scratch.project().join("flow.yml"), workflow).unwrap();
    scratch.commit();
    let replay = replay();
    let mut all = vec![
        ("PRODIGY_CLAUDE_COMMAND", replay.as_str()),
        ("IS_SANDBOX", "1"),
    ];
    all.extend_from_slice(env);
    let mut full = vec!["run", "--no-worktree"];
    full.extend_from_slice(args);
    full.push("flow.yml");
    scratch.run(&full, &all)
}

fn read(scratch: &Scratch, name: &str) -> String {
    std::fs::read_to_string(scratch.project().join(name)).unwrap_or_default()
}

/// The usage limit pauses the run: `paused` fires once, with the limit and its reset, while
/// the run waits, and the run then finishes (`finished` fires too).
#[test]
fn a_usage_limit_fires_paused_with_its_reset() {
    let scratch = Scratch::new();
    let queue = scratch.dir.path().join("replay-queue");
    std::fs::write(&queue, "usage-limit\n").unwrap();
    let out = run(
        &scratch,
        &[],
        "commands:\n  - claude: \"Reply briefly.\"\nnotify:\n  - on: [paused]\n    shell: \"echo '${event.name} ${event.status} ${event.limit_type} ${event.reset_at}' >> paused.txt\"\n  - on: [finished]\n    shell: \"echo '${event.name} ${event.status}' > end.txt\"\n",
        &[
            ("CLAUDE_REPLAY_QUEUE", queue.to_str().unwrap()),
            ("CLAUDE_REPLAY_RESETS_IN", "1"),
        ],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let paused = read(&scratch, "paused.txt");
    let lines: Vec<&str> = paused.lines().collect();
    let [line] = lines.as_slice() else {
        panic!("expected one `paused` notification, got {paused:?}\n{text}");
    };
    assert!(line.starts_with("paused wait five_hour 20"), "{line}");
    assert_eq!(read(&scratch, "end.txt").trim(), "finished completed");
}

/// The Claude budget stops a standard run before the step that would pass it:
/// `budget_reached` fires with what was spent and the limit; the run is not `failed`.
#[test]
fn the_claude_budget_fires_budget_reached() {
    let scratch = Scratch::new();
    let out = run(
        &scratch,
        &["--max-cost-usd", "0.0004"],
        "commands:\n  - claude: \"/first\"\n  - claude: \"/second\"\nnotify:\n  - on: [budget_reached]\n    shell: \"echo '${event.name} ${event.spent_usd} of ${event.limit_usd}' > budget.txt\"\n  - on: [failed]\n    shell: \"touch failed.txt\"\n",
        &[("CLAUDE_REPLAY", "ok")],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{text}");
    assert_eq!(
        read(&scratch, "budget.txt").trim(),
        "budget_reached 0.00026 of 0.0004"
    );
    assert!(!scratch.project().join("failed.txt").exists(), "{text}");
}

/// A notification's output is kept among the run's logs: the warning of a failed one says
/// where, `notification_finished` names the file, and `prodigy logs ID` lists it.
#[test]
fn a_notifications_output_is_kept_in_the_runs_logs() {
    let scratch = Scratch::new();
    let out = run(
        &scratch,
        &[],
        "commands:\n  - shell: \"true\"\nnotify:\n  - on: [finished]\n    shell: \"echo 'hook said no'; echo 'refused: 503' >&2; exit 3\"\n",
        &[],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let finished = scratch
        .events()
        .into_iter()
        .find(|e| e["event_type"] == "notification_finished")
        .unwrap();
    let file = std::path::PathBuf::from(finished["output"].as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "hook said no\nrefused: 503\n"
    );
    assert!(
        text.contains(&format!("its output is in {}", file.display())),
        "{text}"
    );
    let id = finished["job_id"].as_str().unwrap().to_owned();
    let logs = scratch.run(&["logs", &id], &[]);
    let listed = String::from_utf8_lossy(&logs.stdout);
    assert!(listed.contains("[notify] "), "{listed}");
}

/// `dlq retry` fires what its own work records and nothing the job fired when it ran: an
/// item that fails again stays in the DLQ without a second `item_dead_lettered`, and the
/// job's end is not `finished` or `failed` again (docs/language.md §2, "Notifications").
#[test]
fn a_dlq_retry_fires_no_second_dead_letter_or_end() {
    let scratch = Scratch::new();
    std::fs::write(
        scratch.project().join("job.yml"),
        "name: retried\nmode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"echo $ITEM >> [runs]; test $ITEM != 2\"\nnotify:\n  - on: [item_dead_lettered, finished, failed]\n    shell: \"echo ${event.name} ${event.item_id} >> [notes]\"\n"
            .replace("[notes]", &scratch.dir.path().join("notes.txt").display().to_string())
            .replace("[runs]", &scratch.dir.path().join("runs.txt").display().to_string()),
    )
    .unwrap();
    scratch.commit();
    let first = scratch.run(&["run", "-y", "job.yml"], &[]);
    let notes = || std::fs::read_to_string(scratch.dir.path().join("notes.txt")).unwrap();
    let fired = notes();
    assert_eq!(
        fired,
        "item_dead_lettered item_1\nfinished\n",
        "{}",
        stderr(&first)
    );
    let job = scratch
        .events()
        .iter()
        .find_map(|e| e["job_id"].as_str().map(str::to_owned))
        .unwrap();
    let retry = scratch.run(&["dlq", "retry", &job, "-y"], &[]);
    assert_eq!(retry.status.code(), Some(1), "{}", stderr(&retry));
    // The retry ran the failed item again (and it failed again): what it did not fire is
    // not for want of running.
    let runs = std::fs::read_to_string(scratch.dir.path().join("runs.txt")).unwrap();
    assert_eq!(runs.lines().filter(|l| *l == "2").count(), 2, "{runs}");
    assert_eq!(notes(), fired, "{}", stderr(&retry));
}
