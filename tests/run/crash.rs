//! Crash safety around merges: an agent's work merged just before a kill is recorded as
//! succeeded on resume (not run again), runs that end together merge into one branch one
//! at a time, and nothing a killed job made is left behind once it completes or is cleaned
//! (`worktree clean`, which asks before it throws uncommitted changes away).

use super::mapreduce::only_job;
use super::{Scratch, stderr};

/// Writes a workflow into the project and commits it.
fn workflow(scratch: &Scratch, name: &str, text: &str) -> String {
    let path = scratch.project().join(name);
    std::fs::write(&path, text).unwrap();
    scratch.commit();
    path.display().to_string()
}

/// The lines of `results.jsonl` of JOB, parsed.
fn results(scratch: &Scratch, job: &str) -> Vec<serde_json::Value> {
    let path = scratch
        .state()
        .join("mapreduce/jobs")
        .join(job)
        .join("results.jsonl");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A job killed (SIGKILL, by the debug-build hook `PRODIGY_FAULT_KILL_AFTER_MERGES`) right
/// after an agent's work was merged and before its outcome was written, at each merge of
/// the job in turn: `resume-job` records that item as succeeded, with its merge commit,
/// and does not run it again (run again, the agent would find nothing to commit and fail
/// with `CommitValidationFailed`).
#[test]
fn work_merged_before_a_kill_is_recorded_as_succeeded_and_not_run_again() {
    for kill_at in 1..=3 {
        let scratch = Scratch::new();
        let runs = scratch.dir.path().join("runs.log");
        let file = workflow(
            &scratch,
            "job.yml",
            &format!(
                "mode: mapreduce\nmap:\n  input: \"seq 1 3\"\n  max_parallel: 1\n  agent_template:\n    - shell: \"echo $ITEM >> {log}; echo $ITEM > file-$ITEM.txt && git add file-$ITEM.txt && git commit -q -m \\\"add $ITEM\\\" || true\"\n      commit_required: true\n",
                log = runs.display()
            ),
        );
        let at = kill_at.to_string();
        let output = scratch.run(
            &["run", "-y", &file],
            &[("PRODIGY_FAULT_KILL_AFTER_MERGES", &at)],
        );
        assert_eq!(output.status.code(), None, "killed: {}", stderr(&output));
        let job = only_job(&scratch);
        let killed = format!("item_{}", kill_at - 1);
        assert!(
            !results(&scratch, &job)
                .iter()
                .any(|r| r["item_id"] == killed.as_str()),
            "killed before {killed}'s outcome was written"
        );
        let output = scratch.run(&["resume-job", "-y", &job], &[]);
        let text = stderr(&output);
        assert!(output.status.success(), "kill at {kill_at}: {text}");
        assert!(text.contains("3 succeeded, 0 failed"), "{text}");
        assert!(
            text.contains(&format!(
                "{killed}: its work was merged before the job stopped"
            )),
            "{text}"
        );
        let log = std::fs::read_to_string(&runs).unwrap();
        let mut ran: Vec<&str> = log.lines().collect();
        ran.sort_unstable();
        assert_eq!(
            ran,
            ["1", "2", "3"],
            "each item ran once (kill at {kill_at})"
        );
        let records = results(&scratch, &job);
        assert_eq!(records.len(), 3, "{records:?}");
        for record in &records {
            assert_eq!(record["status"], "succeeded", "{record}");
            let commit = record["merge_commit"].as_str().unwrap_or_default();
            assert_eq!(commit.len(), 40, "a merge commit is recorded: {record}");
            // The recorded commit holds the item's file.
            let item: usize = record["index"].as_u64().unwrap().try_into().unwrap();
            scratch.git(&["cat-file", "-e", &format!("{commit}:file-{}.txt", item + 1)]);
        }
        for n in 1..=3 {
            assert!(scratch.project().join(format!("file-{n}.txt")).is_file());
        }
    }
}

/// Two runs of one workflow that merge back into the same branch at the same time: the
/// second waits for the first's merge (git's `prepare-commit-msg` hook holds the first
/// open for two seconds, with its `MERGE_HEAD` there), and both land.
#[test]
fn two_runs_ending_together_merge_into_the_branch_one_at_a_time() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "one.yml",
        "- shell: \"f=$(mktemp out-XXXXXX) && echo x > $f && git add $f && git commit -q -m \\\"add $f\\\"\"\n",
    );
    let hook = scratch.project().join(".git/hooks/prepare-commit-msg");
    std::fs::write(
        &hook,
        "#!/bin/sh\nif [ \"$2\" = merge ]; then sleep 2; fi\nexit 0\n",
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let first = scratch.spawn(&["run", "-y", &file]);
    let second = scratch.spawn(&["run", "-y", &file]);
    for child in [first, second] {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
    }
    let merges = scratch.git(&["log", "--merges", "--format=%s", "main"]);
    assert_eq!(merges.lines().count(), 2, "{merges}");
    let files = scratch.git(&["ls-tree", "--name-only", "main"]);
    assert_eq!(
        files.lines().filter(|f| f.starts_with("out-")).count(),
        2,
        "{files}"
    );
    assert!(
        !scratch.project().join(".git/MERGE_HEAD").exists(),
        "no merge is left open"
    );
}

/// The branches of the project's repository.
fn branches(scratch: &Scratch) -> Vec<String> {
    scratch
        .git(&["branch", "--format=%(refname:short)"])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The worktrees git knows under the scratch `PRODIGY_HOME`, by directory name.
fn worktrees(scratch: &Scratch) -> Vec<String> {
    let mut names: Vec<String> = scratch
        .git(&["worktree", "list", "--porcelain"])
        .lines()
        .filter_map(|l| l.strip_prefix("worktree "))
        .filter(|p| p.contains("/home/worktrees/"))
        .filter_map(|p| p.rsplit('/').next())
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

/// A job killed twice (at fixed merges: in the first run, then in the first resume) and
/// resumed to the end leaves none of its agents' worktrees or branches behind, whatever the
/// killed processes had made (a branch's lock file left by an agent's killed `git commit`
/// once kept them all); only the worktree the DLQ names (an item that failed with
/// uncommitted work) and its branch stay.
#[test]
fn a_job_resumed_to_the_end_after_kills_leaves_only_what_the_dlq_keeps() {
    for (first, second) in [(1, 1), (2, 3), (4, 2)] {
        let scratch = Scratch::new();
        let marker = format!("{}-{first}", std::process::id());
        let file = workflow(
            &scratch,
            "job.yml",
            &format!(
                "mode: mapreduce\nmap:\n  input: \"seq 1 8\"\n  max_parallel: 3\n  agent_template:\n    - shell: \": {marker}; if [ $ITEM = 3 ]; then echo wip > wip.txt; exit 1; fi; echo $ITEM > file-$ITEM.txt && git add file-$ITEM.txt && git commit -q -m \\\"add $ITEM\\\"\"\n      commit_required: true\n"
            ),
        );
        let (first, second) = (first.to_string(), second.to_string());
        let output = scratch.run(
            &["run", &file],
            &[("PRODIGY_FAULT_KILL_AFTER_MERGES", &first)],
        );
        assert_eq!(output.status.code(), None, "killed: {}", stderr(&output));
        let left = super::survivors(&format!("sh -c : {marker}"));
        assert!(left.is_empty(), "agents still running: {left:?}");
        let job = only_job(&scratch);
        let output = scratch.run(
            &["resume-job", &job],
            &[("PRODIGY_FAULT_KILL_AFTER_MERGES", &second)],
        );
        let left = super::survivors(&format!("sh -c : {marker}"));
        assert!(left.is_empty(), "agents still running: {left:?}");
        assert_eq!(
            output.status.code(),
            None,
            "killed again: {}",
            stderr(&output)
        );
        let output = scratch.run(&["resume-job", "-y", &job], &[]);
        assert!(output.status.success(), "{}", stderr(&output));
        let dlq = scratch.run(&["dlq", "show", &job, "--format", "json"], &[]);
        let text = String::from_utf8_lossy(&dlq.stdout).into_owned();
        let entries: serde_json::Value = serde_json::from_str(&text).unwrap();
        let kept = entries
            .as_array()
            .and_then(|a| a.first())
            .map(|e| e["worktree_artifacts"].clone())
            .unwrap_or_default();
        let path = kept["worktree_path"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let branch = kept["branch_name"].as_str().unwrap_or_default().to_owned();
        assert!(path.ends_with(|c: char| c.is_ascii_digit()), "{text}");
        assert_eq!(
            worktrees(&scratch),
            [path.rsplit('/').next().unwrap().to_owned()],
            "kills at {first}, {second}"
        );
        assert_eq!(
            branches(&scratch),
            ["main".to_owned(), branch],
            "kills at {first}, {second}"
        );
        assert!(std::path::Path::new(&path).join("wip.txt").is_file());
        for n in [1, 2, 4, 5, 6, 7, 8] {
            assert!(scratch.project().join(format!("file-{n}.txt")).is_file());
        }
    }
}

/// `worktree ls` names the files a kept worktree holds uncommitted; `worktree clean` removes
/// them only when told: it keeps that worktree without a terminal (exit 1), asks on one,
/// and goes ahead with `-y`.
#[test]
fn worktree_clean_asks_before_it_throws_uncommitted_changes_away() {
    let scratch = Scratch::new();
    let file = workflow(&scratch, "notes.yml", "- shell: \"echo x > notes.txt\"\n");
    let output = scratch.run(&["run", &file], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(worktrees(&scratch).len(), 1);
    let output = scratch.run(&["worktree", "ls"], &[]);
    let listed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(listed.contains("1 uncommitted change"), "{listed}");
    assert!(listed.contains("\n      notes.txt\n"), "{listed}");
    let output = scratch.run(&["worktree", "ls", "--json"], &[]);
    let rows: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        rows[0]["uncommitted_files"],
        serde_json::json!(["notes.txt"])
    );
    // No terminal, no -y: kept and named.
    let output = scratch.run(&["worktree", "clean"], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains("kept ") && text.contains("worktree clean -y"),
        "{text}"
    );
    assert_eq!(worktrees(&scratch).len(), 1);
    // Asked on a terminal: no keeps it, yes removes it.
    let output = super::worktree::on_a_terminal(&scratch, "worktree clean", "n\n");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        text.contains("1 worktree holds 1 uncommitted change that no commit has (`prodigy worktree ls` names them); remove it all the same? [y/N]"),
        "{text}"
    );
    assert_eq!(worktrees(&scratch).len(), 1);
    let output = super::worktree::on_a_terminal(&scratch, "worktree clean", "y\n");
    assert!(output.status.success());
    assert!(worktrees(&scratch).is_empty());
    // -y removes without asking.
    let output = scratch.run(&["run", &file], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let output = scratch.run(&["worktree", "clean", "-y"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(worktrees(&scratch).is_empty());
    assert_eq!(branches(&scratch), ["main"]);
}

/// A job killed and never resumed leaves its worktrees and its agents' branches (those
/// merged into its integration ref have no worktree any more): `worktree clean` removes
/// them all, since everything on them is merged into the job's work or has no commit.
#[test]
fn worktree_clean_removes_the_branches_a_killed_job_left() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nmap:\n  input: \"seq 1 4\"\n  max_parallel: 1\n  agent_template:\n    - shell: \"echo $ITEM > file-$ITEM.txt && git add file-$ITEM.txt && git commit -q -m \\\"add $ITEM\\\"\"\n",
    );
    let output = scratch.run(&["run", &file], &[("PRODIGY_FAULT_KILL_AFTER_MERGES", "3")]);
    assert_eq!(output.status.code(), None, "killed: {}", stderr(&output));
    let job = only_job(&scratch);
    let left = branches(&scratch);
    assert!(
        left.contains(&format!("prodigy-{job}-item_0")),
        "a merged agent's branch is left: {left:?}"
    );
    let output = scratch.run(&["worktree", "ls"], &[]);
    let listed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        listed.contains(&format!("    prodigy-{job}-item_0; merged\n")),
        "{listed}"
    );
    let output = scratch.run(&["worktree", "clean"], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(worktrees(&scratch).is_empty(), "{text}");
    assert_eq!(branches(&scratch), ["main"], "{text}");
}

/// A job whose session worktree is kept (its setup left a file uncommitted) says so in its
/// last lines, even under `-q`, which shows only the outcome and what needs attention.
#[test]
fn a_job_whose_session_worktree_is_kept_says_so_even_when_quiet() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nsetup:\n  - shell: \"echo scratch > notes.txt\"\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"echo $ITEM > f-$ITEM.txt && git add f-$ITEM.txt && git commit -qm $ITEM\"\n",
    );
    let output = scratch.run(&["run", "-q", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].contains("1 uncommitted change is left in")
            && lines[0].contains("so it is kept until `prodigy worktree clean`"),
        "{text}"
    );
    assert!(lines[1].starts_with("✓ job "), "{text}");
    assert_eq!(worktrees(&scratch).len(), 1);
}

/// `dlq retry` killed right after a retried item's work was merged, before the item left
/// the queue: the next `dlq retry` records it as succeeded and does not run it again.
#[test]
fn a_retried_item_merged_before_a_kill_leaves_the_dlq_without_running_again() {
    let scratch = Scratch::new();
    let runs = scratch.dir.path().join("runs.log");
    let fixed = scratch.dir.path().join("fixed");
    let file = workflow(
        &scratch,
        "job.yml",
        &format!(
            "mode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  max_parallel: 1\n  agent_template:\n    - shell: \"test $ITEM = 1 || test -f {fixed} || exit 1; echo $ITEM >> {log}; echo $ITEM > file-$ITEM.txt && git add file-$ITEM.txt && git commit -q -m \\\"add $ITEM\\\" || true\"\n      commit_required: true\n",
            fixed = fixed.display(),
            log = runs.display()
        ),
    );
    let output = scratch.run(&["run", &file], &[]);
    assert!(
        stderr(&output).contains("1 succeeded, 1 failed"),
        "{}",
        stderr(&output)
    );
    let job = only_job(&scratch);
    std::fs::write(&fixed, "").unwrap();
    let output = scratch.run(
        &["dlq", "retry", &job],
        &[("PRODIGY_FAULT_KILL_AFTER_MERGES", "1")],
    );
    assert_eq!(output.status.code(), None, "killed: {}", stderr(&output));
    let output = scratch.run(&["dlq", "retry", &job], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains("item_1: its work was merged before the job stopped"),
        "{text}"
    );
    let log = std::fs::read_to_string(&runs).unwrap();
    assert_eq!(log.lines().collect::<Vec<_>>(), ["1", "2"], "each ran once");
    let records = results(&scratch, &job);
    let last = records.iter().rfind(|r| r["item_id"] == "item_1").unwrap();
    assert_eq!(last["status"], "succeeded", "{records:?}");
    assert_eq!(last["merge_commit"].as_str().unwrap_or_default().len(), 40);
    let dlq = scratch.run(&["dlq", "show", &job, "--format", "json"], &[]);
    let queued: serde_json::Value = serde_json::from_slice(&dlq.stdout).unwrap();
    assert_eq!(queued, serde_json::json!([]), "the queue is empty");
}

/// A job killed after its first merge leaves its slot's worktree on that item's branch,
/// with ignored output in it: the resume cleans it and runs the remaining items in it
/// (not in a new checkout), and none of them sees what the killed process's item left.
#[test]
fn a_resumed_job_cleans_and_reuses_the_worktrees_a_kill_left() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join(".gitignore"), "out/\n").unwrap();
    let log = scratch.dir.path().join("dirs.log");
    let file = workflow(
        &scratch,
        "job.yml",
        &format!(
            "mode: mapreduce\nmap:\n  input: \"seq 1 3\"\n  max_parallel: 1\n  agent_template:\n    - shell: \"pwd >> {log}; if [ -e out ]; then echo saw the last item; exit 1; fi; mkdir -p out/deep && echo $ITEM > out/deep/f; echo $ITEM > file-$ITEM.txt && git add file-$ITEM.txt && git commit -q -m \\\"add $ITEM\\\"\"\n      commit_required: true\n",
            log = log.display()
        ),
    );
    let output = scratch.run(
        &["run", "-y", &file],
        &[("PRODIGY_FAULT_KILL_AFTER_MERGES", "1")],
    );
    assert_eq!(output.status.code(), None, "killed: {}", stderr(&output));
    let job = only_job(&scratch);
    assert_eq!(
        worktrees(&scratch).len(),
        2,
        "the session's and one agent's"
    );
    let output = scratch.run(&["resume-job", "-y", &job], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("3 succeeded, 0 failed"), "{text}");
    let dirs = std::fs::read_to_string(&log).unwrap();
    let dirs: Vec<&str> = dirs.lines().collect();
    assert_eq!(dirs.len(), 3, "{dirs:?}");
    assert!(
        dirs.iter().all(|d| *d == dirs[0]),
        "the killed process's worktree is reused: {dirs:?}"
    );
    assert!(worktrees(&scratch).is_empty());
    assert_eq!(branches(&scratch), ["main"]);
    for n in 1..=3 {
        assert!(scratch.project().join(format!("file-{n}.txt")).is_file());
    }
}
