//! Git worktree isolation end to end, against real repositories: the session worktree,
//! agents committing in parallel, a merge conflict parked in the DLQ, the merge back (plain,
//! with `merge:` steps, declined), `prodigy worktree ls|clean`, and runs outside git.

use super::mapreduce::only_job;
use super::{Scratch, corpus, shown, stderr};

/// Writes a workflow into the project and commits it.
fn workflow(scratch: &Scratch, name: &str, text: &str) -> String {
    let path = scratch.project().join(name);
    std::fs::write(&path, text).unwrap();
    scratch.commit();
    path.display().to_string()
}

/// The files of REV in the project's repository.
fn files_at(scratch: &Scratch, rev: &str) -> Vec<String> {
    scratch
        .git(&["ls-tree", "--name-only", rev])
        .lines()
        .map(str::to_owned)
        .collect()
}

fn branches(scratch: &Scratch) -> Vec<String> {
    scratch
        .git(&["branch", "--format=%(refname:short)"])
        .lines()
        .map(str::to_owned)
        .collect()
}

fn worktree_dirs(scratch: &Scratch) -> Vec<String> {
    std::fs::read_dir(scratch.home().join("worktrees").join(scratch.repo()))
        .map(|d| {
            let mut names: Vec<String> = d
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect();
            names.sort();
            names
        })
        .unwrap_or_default()
}

#[test]
fn fifty_agents_commit_in_parallel_and_every_commit_comes_back() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nmap:\n  input: \"seq 1 50\"\n  max_parallel: 8\n  agent_template:\n    - shell: \"echo $ITEM > file-$ITEM.txt && git add file-$ITEM.txt && git commit -q -m \\\"add $ITEM\\\"\"\n      commit_required: true\n",
    );
    let before = files_at(&scratch, "main");
    // No terminal and no -y: the session branch is kept, the user's checkout is untouched.
    let output = scratch.run(&["run", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("50 succeeded, 0 failed"), "{text}");
    let job = only_job(&scratch);
    let session = format!("prodigy-{job}");
    let on_session = files_at(&scratch, &session);
    for n in 1..=50 {
        assert!(
            on_session.contains(&format!("file-{n}.txt")),
            "file-{n}.txt is missing from the session branch"
        );
    }
    assert_eq!(files_at(&scratch, "main"), before, "main is untouched");
    assert!(!scratch.project().join("file-1.txt").exists());
    // Agents' worktrees and branches are gone; the session's stays for the user.
    assert_eq!(worktree_dirs(&scratch), std::slice::from_ref(&job));
    assert_eq!(branches(&scratch), ["main".to_owned(), session.clone()]);
    assert!(
        text.contains(&format!("or with `git merge --no-ff {session}`")),
        "{text}"
    );
    // Doing what the message says brings all 50 files into main.
    scratch.git(&["merge", "-q", "--no-ff", "-m", "merge", &session]);
    for n in 1..=50 {
        assert!(scratch.project().join(format!("file-{n}.txt")).is_file());
    }
    // `worktree clean` removes the session worktree and its now-merged branch.
    let output = scratch.run(&["worktree", "clean"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(worktree_dirs(&scratch).is_empty());
    assert_eq!(branches(&scratch), ["main"]);
}

#[test]
fn two_agents_editing_the_same_line_park_one_merge_conflict() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join("shared.txt"), "base\n").unwrap();
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nmap:\n  input: \"printf 'a\\\\nb\\\\n'\"\n  max_parallel: 2\n  agent_template:\n    - shell: \"echo $ITEM > shared.txt && git commit -q -am \\\"edit $ITEM\\\"\"\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("1 succeeded, 1 failed"), "{text}");
    assert!(text.contains("1 MergeConflict"), "{text}");
    let job = only_job(&scratch);
    let output = scratch.run(&["dlq", "show", &job, "--format", "json"], &[]);
    let items: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let items = items.as_array().unwrap();
    assert_eq!(items.len(), 1, "exactly one conflict: {items:?}");
    let entry = &items[0];
    assert_eq!(entry["failure_history"][0]["error_type"], "MergeConflict");
    let artifacts = &entry["worktree_artifacts"];
    let kept = std::path::PathBuf::from(artifacts["worktree_path"].as_str().unwrap());
    assert!(kept.join("shared.txt").is_file(), "the worktree is kept");
    assert!(
        artifacts["error_logs"]
            .as_str()
            .unwrap()
            .contains("CONFLICT")
    );
    // The winner came back to main under -y; the loser's commit is on its kept branch.
    let merged = std::fs::read_to_string(scratch.project().join("shared.txt")).unwrap();
    let branch = artifacts["branch_name"].as_str().unwrap();
    let loser = scratch.git(&["show", &format!("{branch}:shared.txt")]);
    assert_ne!(merged, loser);
    // The kept worktree holds the losing agent's commit, and nothing of the conflict is
    // left in the checkout the session was merged into.
    let kept_head = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(&kept)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&kept_head.stdout),
        scratch.git(&["rev-parse", branch])
    );
    assert_eq!(
        scratch.git(&["log", "-1", "--format=%s", branch]).trim(),
        format!("edit {}", loser.trim())
    );
    assert_eq!(scratch.git(&["status", "--porcelain"]), "");
    assert!(["a\n", "b\n"].contains(&merged.as_str()), "{merged}");
    // The session worktree was merged and removed; the conflict's is listed.
    let output = scratch.run(&["worktree", "ls"], &[]);
    let listed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(listed.contains(&kept.display().to_string()), "{listed}");
    assert!(!listed.contains(&format!("{job}\n")), "{listed}");
    assert_eq!(listed.matches("branch ").count(), 1, "{listed}");
}

#[test]
fn corpus_minimal_mapreduce_merges_back_to_the_original_branch() {
    let Some(file) = corpus(
        "corpus_minimal_mapreduce_merges_back_to_the_original_branch",
        "workflows/tests/minimal-mapreduce.yml",
    ) else {
        return;
    };
    let scratch = Scratch::new();
    let output = scratch.run(&["run", "-y", "-v", file.to_str().unwrap()], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains("All 3 items were processed successfully"),
        "{text}"
    );
    for name in ["one", "two", "three"] {
        let out = scratch.project().join(format!("output-item-{name}.txt"));
        let content = std::fs::read_to_string(&out).unwrap();
        assert!(content.contains(&format!("item-{name}")), "{content}");
    }
    // Setup's test-items.json was never committed: it is not merged, and the worktree that
    // holds it is kept rather than thrown away.
    assert!(!scratch.project().join("test-items.json").exists());
    assert!(text.contains("1 uncommitted change is left"), "{text}");
    let job = only_job(&scratch);
    assert!(scratch.worktree(&job).join("test-items.json").is_file());
}

#[test]
fn merge_steps_see_the_merge_variables_and_must_merge() {
    let scratch = Scratch::new();
    let merge = "merge:\n  - shell: \"echo 'from ${merge.source_branch} to ${merge.target_branch}: ${merge.commit_count} commits, files ${merge.file_list}'\"\n  - shell: \"cd \\\"$(git rev-parse --path-format=absolute --git-common-dir)/..\\\" && git merge -q --no-ff -m merged ${merge.source_branch}\"\n";
    let file = workflow(
        &scratch,
        "flow.yml",
        &format!(
            "commands:\n  - shell: \"echo hi > hello.txt\"\n    commit_required: true\n    auto_commit: true\n{merge}"
        ),
    );
    let output = scratch.run(&["run", "-y", "-v", &file], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(
        regex::Regex::new(r"from prodigy-session-\S+ to main: 1 commits, files hello.txt")
            .unwrap()
            .is_match(&text),
        "{text}"
    );
    assert!(scratch.project().join("hello.txt").is_file());
    assert!(worktree_dirs(&scratch).is_empty(), "merged and removed");
    assert_eq!(branches(&scratch), ["main"]);
    // `merge` steps that do not merge: the run says so, fails, and keeps the branch.
    let file = workflow(
        &scratch,
        "flow2.yml",
        "commands:\n  - shell: \"echo again > again.txt\"\n    auto_commit: true\nmerge:\n  - shell: \"true\"\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("is not merged into `main`"), "{text}");
    assert!(!scratch.project().join("again.txt").exists());
    assert_eq!(branches(&scratch).len(), 2, "the session branch is kept");
}

#[test]
fn no_worktree_runs_in_place_and_a_failed_run_is_never_merged() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "flow.yml",
        "- shell: \"echo x > made.txt\"\n  auto_commit: true\n",
    );
    std::fs::write(scratch.project().join("scratchpad"), "uncommitted").unwrap();
    let output = scratch.run(&["run", "--no-worktree", &file], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(scratch.project().join("made.txt").is_file());
    assert!(worktree_dirs(&scratch).is_empty());
    // In a worktree, uncommitted changes are pointed out; a failed run merges nothing.
    let file = workflow(
        &scratch,
        "fail.yml",
        "- shell: \"echo y > other.txt\"\n  auto_commit: true\n- shell: \"exit 3\"\n",
    );
    std::fs::write(scratch.project().join("scratchpad"), "changed").unwrap();
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("1 uncommitted change in"), "{text}");
    assert!(text.contains("nothing was merged"), "{text}");
    assert!(!scratch.project().join("other.txt").exists());
    let last = text.lines().last().unwrap();
    assert!(last.contains("resume with: prodigy resume"), "{last}");
}

#[test]
fn outside_git_commit_required_is_refused_before_the_first_step() {
    let scratch = Scratch::new();
    std::fs::remove_dir_all(scratch.project().join(".git")).unwrap();
    let path = scratch.project().join("flow.yml");
    std::fs::write(
        &path,
        "- shell: \"touch started\"\n- shell: \"true\"\n  commit_required: true\n",
    )
    .unwrap();
    let file = path.display().to_string();
    let output = scratch.run(&["run", &file], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("requires a commit"), "{text}");
    assert!(text.contains("not a git repository"), "{text}");
    assert!(!scratch.project().join("started").exists());
    // Without commit_required the run works in place; --worktree insists on git.
    std::fs::write(&path, "- shell: \"touch started\"\n").unwrap();
    let output = scratch.run(&["run", &file], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(scratch.project().join("started").exists());
    let output = scratch.run(&["run", "--worktree", &file], &[]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
}

#[test]
fn agents_auto_commit_and_commit_required_fails_an_agent_that_made_none() {
    let scratch = Scratch::new();
    // Item 2 writes nothing, so auto_commit has nothing to commit and `commit_required`
    // finds no commit.
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nmap:\n  input: \"seq 1 3\"\n  max_parallel: 3\n  agent_template:\n    - shell: \"test $ITEM = 2 || echo $ITEM > out-$ITEM.txt\"\n      auto_commit: true\n      commit_required: true\n      commit_config:\n        message_template: \"agent wrote ${item}\"\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("2 succeeded, 1 failed"), "{text}");
    assert!(text.contains("1 CommitValidationFailed"), "{text}");
    for n in [1, 3] {
        assert!(scratch.project().join(format!("out-{n}.txt")).is_file());
    }
    assert!(!scratch.project().join("out-2.txt").exists());
    let log = scratch.git(&["log", "--format=%s", "main"]);
    assert!(log.contains("agent wrote 1"), "{log}");
    // The failed agent made no commit and left no change: nothing of it is kept.
    assert!(
        worktree_dirs(&scratch).is_empty(),
        "{:?}",
        worktree_dirs(&scratch)
    );
}

#[test]
fn worktree_clean_dry_run_removes_nothing() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "flow.yml",
        "- shell: \"echo x > x.txt\"\n  auto_commit: true\n",
    );
    let output = scratch.run(&["run", &file], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let kept = worktree_dirs(&scratch);
    assert_eq!(kept.len(), 1, "no terminal, no -y: the session is kept");
    let output = scratch.run(&["worktree", "ls", "--json"], &[]);
    let listed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(listed[0]["unmerged_commits"], 1, "{listed}");
    assert_eq!(listed[0]["running"], false, "{listed}");
    let output = scratch.run(&["worktree", "clean", "--dry-run"], &[]);
    assert!(
        stderr(&output).contains("would remove"),
        "{}",
        stderr(&output)
    );
    assert_eq!(worktree_dirs(&scratch), kept);
    // A real clean removes the worktree but keeps the unmerged branch, and says so.
    let output = scratch.run(&["worktree", "clean"], &[]);
    let text = stderr(&output);
    assert!(text.contains("kept: 1 commit is not merged"), "{text}");
    assert!(worktree_dirs(&scratch).is_empty());
    assert_eq!(branches(&scratch).len(), 2);
}

#[test]
fn an_agent_that_rewrote_its_history_does_not_drop_earlier_merges() {
    let scratch = Scratch::new();
    // Item 2 starts after item 1 merged, then resets below where it started.
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  max_parallel: 1\n  agent_template:\n    - shell: \"test $ITEM = 1 || git reset -q --hard HEAD~1; echo $ITEM > f$ITEM.txt && git add f$ITEM.txt && git commit -qm f$ITEM\"\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(scratch.project().join("f1.txt").is_file());
    assert!(scratch.project().join("f2.txt").is_file());
}

#[test]
fn changes_a_successful_agent_did_not_commit_are_kept_not_wiped() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  max_parallel: 1\n  agent_template:\n    - shell: \"test $ITEM = 1 || echo important > notes-$ITEM.txt\"\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains("item_1 left 1 uncommitted change in"),
        "{text}"
    );
    let kept: Vec<_> = worktree_dirs(&scratch)
        .into_iter()
        .filter(|d| {
            scratch
                .home()
                .join("worktrees")
                .join(scratch.repo())
                .join(d)
                .join("notes-2.txt")
                .is_file()
        })
        .collect();
    assert_eq!(kept.len(), 1, "{:?}", worktree_dirs(&scratch));
}

#[test]
fn agents_work_that_cannot_reach_the_session_fails_the_job() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join("base.txt"), "v1\n").unwrap();
    // Setup changes base.txt without committing; the agents commit changes to it too.
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nsetup:\n  - shell: \"echo v2 > base.txt\"\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"echo $ITEM >> base.txt && git commit -qam $ITEM\"\nreduce:\n  - shell: \"echo reduced\"\n",
    );
    let output = scratch.run(&["run", "-y", "-v", &file], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains("cannot bring the agents' merged work"),
        "{text}"
    );
    assert!(!text.contains("reduced"), "reduce must not run:\n{text}");
    assert!(text.contains("nothing was merged"), "{text}");
    assert_eq!(
        std::fs::read_to_string(scratch.project().join("base.txt")).unwrap(),
        "v1\n"
    );
}

#[test]
fn a_merge_back_that_would_conflict_leaves_the_checkout_alone() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join("shared.txt"), "base\n").unwrap();
    // The run changes shared.txt on its branch while main changes it too.
    let file = workflow(
        &scratch,
        "flow.yml",
        "- shell: \"echo run > shared.txt && git commit -qam run\"\n- shell: \"cd \\\"$(git rev-parse --path-format=absolute --git-common-dir)/..\\\" && echo main > shared.txt && git commit -qam main\"\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("conflicts in shared.txt"), "{text}");
    assert_eq!(scratch.git(&["status", "--porcelain"]), "");
    assert_eq!(
        std::fs::read_to_string(scratch.project().join("shared.txt")).unwrap(),
        "main\n"
    );
    assert_eq!(branches(&scratch).len(), 2, "the session branch is kept");
}

/// Runs `prodigy ARGS` on a pseudo-terminal (through `script`, from util-linux), typing
/// ANSWER.
pub(super) fn on_a_terminal(scratch: &Scratch, args: &str, answer: &str) -> std::process::Output {
    use std::io::Write as _;
    let bin = assert_cmd::cargo::cargo_bin("prodigy");
    // The scratch's environment: its PRODIGY_HOME, stubs and git identity.
    let env = scratch.command(&[], &[]);
    let mut child = std::process::Command::new("script")
        .args(["-qec", &format!("{} {args}", bin.display()), "/dev/null"])
        .envs(env.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .current_dir(scratch.project())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("`script` (util-linux) runs the terminal test: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(answer.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn on_a_terminal_the_merge_is_asked_for() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "flow.yml",
        "- shell: \"echo x > x.txt\"\n  auto_commit: true\n",
    );
    let output = on_a_terminal(&scratch, &format!("run {file}"), "n\n");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{text}");
    assert!(text.contains("into `main`? [y/N]"), "{text}");
    assert!(
        text.contains("merge it with `prodigy resume -y session-"),
        "{text}"
    );
    assert!(!scratch.project().join("x.txt").exists());
    let output = on_a_terminal(&scratch, &format!("run {file}"), "y\n");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{text}");
    // On a terminal the outcome marks are coloured (`--color auto`).
    assert!(
        text.contains("\u{1b}[32m✓\u{1b}[0m merged 1 commit from"),
        "{text}"
    );
    assert!(scratch.project().join("x.txt").is_file());
}

#[test]
fn a_mapreduce_job_runs_its_merge_steps_with_the_jobs_variables() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nmap:\n  input: \"seq 1 3\"\n  agent_template:\n    - shell: \"echo $ITEM > m-$ITEM.txt && git add . && git commit -qm m$ITEM\"\nreduce:\n  - shell: \"echo ${map.successful}\"\n    capture: done_count\nmerge:\n  commands:\n    - shell: \"echo 'merging ${merge.file_count} files after ${done_count} items'\"\n    - shell: \"cd \\\"$(git rev-parse --path-format=absolute --git-common-dir)/..\\\" && git merge -q --no-ff -m merged ${merge.source_branch}\"\n  timeout: 60\n",
    );
    let output = scratch.run(&["run", "-y", "-v", &file], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("merging 3 files after 3 items"), "{text}");
    for n in 1..=3 {
        assert!(scratch.project().join(format!("m-{n}.txt")).is_file());
    }
    assert!(
        worktree_dirs(&scratch).is_empty(),
        "{:?}",
        worktree_dirs(&scratch)
    );
}

#[test]
fn a_kept_session_is_merged_later_by_resuming_it_with_yes() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  max_parallel: 1\n  agent_template:\n    - shell: \"echo $ITEM > r-$ITEM.txt && git add . && git commit -qm r$ITEM\"\nmerge:\n  - shell: \"echo 'merge steps: ${merge.commit_count} commits after ${map.successful} items'\"\n  - shell: \"cd \\\"$(git rev-parse --path-format=absolute --git-common-dir)/..\\\" && git merge -q --no-ff -m merged ${merge.source_branch}\"\n",
    );
    // No terminal, no -y: kept, and the hint names the command that merges it.
    let output = scratch.run(&["run", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    let job = only_job(&scratch);
    assert!(
        text.contains(&format!("prodigy resume-job -y {job}")),
        "{text}"
    );
    assert!(!scratch.project().join("r-1.txt").exists());
    let output = scratch.run(&["resume-job", "-y", "-v", &job], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    // Two agent commits, and a merge commit unless the second agent started after the first
    // merged.
    assert!(
        text.contains("merge steps: 3 commits after 2 items")
            || text.contains("merge steps: 2 commits after 2 items"),
        "{text}"
    );
    // One at a time, the second agent starts from the first one's work: fast-forwards.
    assert!(
        text.contains("merge steps: 2 commits after 2 items"),
        "{text}"
    );
    assert!(scratch.project().join("r-1.txt").is_file());
    assert!(scratch.project().join("r-2.txt").is_file());
    let output = scratch.run(&["resume-job", &job], &[]);
    assert!(stderr(&output).contains("already completed"));
}

#[test]
fn ignored_output_that_goes_with_the_worktree_is_mentioned() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join(".gitignore"), "out/\n").unwrap();
    let file = workflow(
        &scratch,
        "flow.yml",
        "- shell: \"mkdir -p out && echo built > out/artifact\"\n",
    );
    let output = scratch.run(&["run", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains("its worktree is removed, with 1 ignored path ("),
        "{text}"
    );
    assert!(worktree_dirs(&scratch).is_empty());
}

#[test]
fn merge_steps_run_under_their_timeout_and_what_they_leave_is_kept() {
    let scratch = Scratch::new();
    let marker = format!("sleep 34.{}", std::process::id());
    let file = workflow(
        &scratch,
        "slow.yml",
        &format!(
            "commands:\n  - shell: \"echo a > a.txt\"\n    auto_commit: true\nmerge:\n  commands:\n    - shell: \"{marker}\"\n  timeout: 1\n"
        ),
    );
    let output = scratch.run(&["run", "-y", "--grace", "1", &file], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains("took longer than their timeout (1s)"),
        "{text}"
    );
    assert!(
        super::survivors(&marker).is_empty(),
        "the merge step was stopped"
    );
    assert!(!scratch.project().join("a.txt").exists());
    assert_eq!(branches(&scratch).len(), 2, "the session branch is kept");
    // `merge` steps that merge but leave a file behind: merged, and the worktree is kept.
    let file = workflow(
        &scratch,
        "litter.yml",
        "commands:\n  - shell: \"echo b > b.txt\"\n    auto_commit: true\nmerge:\n  - shell: \"echo notes > merge-notes.txt\"\n  - shell: \"cd \\\"$(git rev-parse --path-format=absolute --git-common-dir)/..\\\" && git merge -q --no-ff -m merged ${merge.source_branch}\"\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(scratch.project().join("b.txt").is_file());
    assert!(text.contains("1 uncommitted change is left"), "{text}");
    let kept = worktree_dirs(&scratch).into_iter().any(|d| {
        scratch
            .home()
            .join("worktrees")
            .join(scratch.repo())
            .join(d)
            .join("merge-notes.txt")
            .is_file()
    });
    assert!(kept, "{:?}", worktree_dirs(&scratch));
}

#[test]
fn a_failed_agents_worktree_is_kept_with_its_changes_in_the_dlq() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nmap:\n  input: \"seq 1 1\"\n  agent_template:\n    - shell: \"echo done > part.txt && git add part.txt && git commit -qm part && echo draft > draft.txt && exit 5\"\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = only_job(&scratch);
    let shown = scratch.run(&["dlq", "show", &job, "--format", "json"], &[]);
    let items: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    let artifacts = &items[0]["worktree_artifacts"];
    let path = std::path::PathBuf::from(artifacts["worktree_path"].as_str().unwrap());
    assert!(path.join("part.txt").is_file() && path.join("draft.txt").is_file());
    assert_eq!(
        artifacts["uncommitted_changes"], "?? draft.txt",
        "{artifacts}"
    );
    assert_eq!(
        items[0]["failure_history"][0]["error_type"]["CommandFailed"]["exit_code"],
        5
    );
    // Its commit is on its kept branch, not in main.
    assert!(!scratch.project().join("part.txt").exists());
}

/// `merge.on_conflict` resolves an agent's conflicted merge in its worktree: the resolver
/// sees the conflicted files, commits the merge, and the item's work is merged as usual;
/// nothing goes to the DLQ.
#[test]
fn a_conflict_handler_resolves_an_agents_merge() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join("shared.txt"), "base\n").unwrap();
    let seen = scratch.dir.path().join("stub-state/conflicts");
    let file = workflow(
        &scratch,
        "job.yml",
        &format!(
            "mode: mapreduce\nmap:\n  input: \"printf 'a\\\\nb\\\\n'\"\n  max_parallel: 2\n  agent_template:\n    - shell: \"echo $ITEM > shared.txt && git commit -q -am \\\"edit $ITEM\\\"\"\nmerge:\n  on_conflict:\n    - shell: \"echo ${{merge.conflicted_files}} ${{merge.source_branch|shell}} >> {seen} && printf 'a\\\\nb\\\\n' > shared.txt && git add shared.txt && git commit -q --no-edit\"\n",
            seen = seen.display()
        ),
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("2 succeeded, 0 failed"), "{text}");
    assert!(text.contains("running `merge.on_conflict`"), "{text}");
    let seen = std::fs::read_to_string(&seen).unwrap();
    assert!(seen.starts_with("shared.txt prodigy-"), "{seen}");
    assert_eq!(
        std::fs::read_to_string(scratch.project().join("shared.txt")).unwrap(),
        "a\nb\n"
    );
    let job = only_job(&scratch);
    let output = scratch.run(&["dlq", "show", &job, "--format", "json"], &[]);
    let items: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(items.as_array().map(Vec::len), Some(0), "{items}");
    assert_eq!(scratch.git(&["status", "--porcelain"]), "");
}

/// A resolver that leaves the merge unresolved: the item goes to the DLQ as `MergeConflict`
/// with why, and its worktree holds no half merge.
#[test]
fn a_conflict_handler_that_does_not_commit_leaves_the_item_in_the_dlq() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join("shared.txt"), "base\n").unwrap();
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nmap:\n  input: \"printf 'a\\\\nb\\\\n'\"\n  max_parallel: 2\n  agent_template:\n    - shell: \"echo $ITEM > shared.txt && git commit -q -am \\\"edit $ITEM\\\"\"\nmerge:\n  on_conflict:\n    - shell: \"echo looked at it\"\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("1 succeeded, 1 failed"), "{text}");
    let job = only_job(&scratch);
    let output = scratch.run(&["dlq", "show", &job, "--format", "json"], &[]);
    let items: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let entry = &items[0];
    assert_eq!(entry["failure_history"][0]["error_type"], "MergeConflict");
    let logs = entry["worktree_artifacts"]["error_logs"].as_str().unwrap();
    assert!(logs.contains("the merge is not committed"), "{logs}");
    assert!(
        logs.contains("looked at it"),
        "the handler's output: {logs}"
    );
    let kept = std::path::PathBuf::from(
        entry["worktree_artifacts"]["worktree_path"]
            .as_str()
            .unwrap(),
    );
    let status = std::process::Command::new("git")
        .args(["status", "--porcelain"])
        .current_dir(&kept)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&status.stdout), "", "no half merge");
}

/// The same opt-in for the merge back without `merge.commands`: the target's new work is
/// merged into the session branch by the resolver, then the session merges back.
#[test]
fn a_conflict_handler_resolves_the_merge_back() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join("shared.txt"), "base\n").unwrap();
    let file = workflow(
        &scratch,
        "flow.yml",
        "commands:\n  - shell: \"echo run > shared.txt && git commit -qam run\"\n  - shell: \"cd \\\"$(git rev-parse --path-format=absolute --git-common-dir)/..\\\" && echo main > shared.txt && git commit -qam main\"\nmerge:\n  on_conflict:\n    - shell: \"printf 'main\\\\nrun\\\\n' > shared.txt && git add shared.txt && git commit -q --no-edit\"\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert_eq!(
        std::fs::read_to_string(scratch.project().join("shared.txt")).unwrap(),
        "main\nrun\n"
    );
    assert_eq!(scratch.git(&["status", "--porcelain"]), "");
}

/// One slot (`max_parallel: 1`) runs every item in the same worktree, moved from item to
/// item; what an item left that is ignored (a file, a directory with more in it), and what
/// a failed item left, is gone before the next starts.
#[test]
fn an_item_never_sees_what_the_last_item_left_in_its_worktree() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join(".gitignore"), "out/\n*.log\n").unwrap();
    let log = scratch.dir.path().join("dirs.log");
    let file = workflow(
        &scratch,
        "job.yml",
        &format!(
            "mode: mapreduce\nmap:\n  input: \"seq 1 4\"\n  max_parallel: 1\n  agent_template:\n    - shell: \"pwd >> {log}; if [ -e out ] || [ -e junk.log ]; then echo saw the last item; exit 1; fi; mkdir -p out/deep && echo $ITEM > out/deep/f && echo $ITEM > junk.log; if [ $ITEM = 2 ]; then exit 1; fi; echo $ITEM > file-$ITEM.txt && git add file-$ITEM.txt && git commit -q -m \\\"add $ITEM\\\"\"\n      commit_required: true\n",
            log = log.display()
        ),
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(text.contains("3 succeeded, 1 failed"), "{text}");
    assert!(!text.contains("saw the last item"), "{text}");
    let dirs = std::fs::read_to_string(&log).unwrap();
    let dirs: Vec<&str> = dirs.lines().collect();
    assert_eq!(dirs.len(), 4, "{dirs:?}");
    assert!(
        dirs.iter().all(|d| *d == dirs[0]),
        "one worktree for the slot: {dirs:?}"
    );
    for n in [1, 3, 4] {
        assert!(scratch.project().join(format!("file-{n}.txt")).is_file());
    }
}

#[test]
fn commits_a_step_made_on_a_branch_of_its_own_are_merged_when_they_descend_from_the_run() {
    for (how, head) in [
        ("git switch -q -c feature", "branch `feature`"),
        ("git checkout -q --detach", "a detached HEAD"),
    ] {
        let scratch = Scratch::new();
        let step = format!(
            "- shell: \"{how} && echo x > x.txt && git add x.txt && git commit -q -m x\"\n"
        );
        let file = workflow(&scratch, "flow.yml", &step);
        let output = scratch.run(&["run", "-y", &file], &[]);
        let text = stderr(&output);
        assert!(output.status.success(), "{how}: {text}");
        assert!(
            text.contains(&format!("a step left the run's worktree on {head} instead of the run's branch `prodigy-session-")),
            "{how}: {text}"
        );
        assert!(
            text.contains("the 1 commit made there descends from"),
            "{how}: {text}"
        );
        assert!(text.contains("✓ merged 1 commit from"), "{how}: {text}");
        assert!(
            files_at(&scratch, "main").contains(&"x.txt".to_owned()),
            "{how}: {text}"
        );
    }
}

#[test]
fn commits_off_the_run_on_a_detached_head_fail_the_merge_and_keep_a_branch() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "flow.yml",
        "- shell: \"git checkout -q --detach HEAD~1 && echo y > y.txt && git add y.txt && git commit -q -m y\"\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(!output.status.success(), "{text}");
    assert!(
        text.contains("a step left the run's worktree on a detached HEAD, whose commits do not descend from the run's branch `prodigy-session-"),
        "{text}"
    );
    assert!(
        !files_at(&scratch, "main").contains(&"y.txt".to_owned()),
        "{text}"
    );
    // The commit keeps a reference of its own: removing the worktree loses nothing.
    let kept: Vec<String> = branches(&scratch)
        .into_iter()
        .filter(|b| b.ends_with("-detached"))
        .collect();
    assert_eq!(kept.len(), 1, "{text}");
    assert!(
        text.contains(&format!("they are on branch `{}`", kept[0])),
        "{text}"
    );
    assert!(
        files_at(&scratch, &kept[0]).contains(&"y.txt".to_owned()),
        "{text}"
    );
    let clean = scratch.run(&["worktree", "clean", "-y"], &[]);
    assert!(clean.status.success(), "{}", stderr(&clean));
    assert!(files_at(&scratch, &kept[0]).contains(&"y.txt".to_owned()));
}

#[test]
fn what_an_item_left_running_is_ended_before_the_next_item_gets_its_worktree() {
    let scratch = Scratch::new();
    // Item 1 leaves a process behind that writes into its worktree a second later, while
    // item 2 (in the same slot) is still running; item 2 then commits whatever is there.
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  max_parallel: 1\n  agent_template:\n    - shell: |\n        if [ $ITEM = 1 ]; then (sleep 1; echo late > late.txt) >/dev/null 2>&1 & fi\n        if [ $ITEM = 2 ]; then sleep 2; fi\n        echo $ITEM > file-$ITEM.txt && git add -A && git commit -q -m \"add $ITEM\"\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("2 succeeded"), "{text}");
    let files = files_at(&scratch, "main");
    assert!(files.contains(&"file-1.txt".to_owned()), "{files:?}");
    assert!(files.contains(&"file-2.txt".to_owned()), "{files:?}");
    assert!(
        !files.contains(&"late.txt".to_owned()),
        "item 1's background process wrote into item 2's commit: {files:?}"
    );
}

#[test]
fn a_tracked_file_changed_through_a_hard_link_keeps_the_worktree_out_of_the_next_item() {
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join("tracked.txt"), "as committed\n").unwrap();
    let outside = scratch.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    // Item 1 changes a tracked file through a hard link from outside its worktree (no
    // notification in the worktree's directories) and commits only its own file; item 2,
    // in the same slot, commits everything it finds.
    let file = workflow(
        &scratch,
        "job.yml",
        &format!(
            "mode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  max_parallel: 1\n  agent_template:\n    - shell: |\n        if [ $ITEM = 1 ]; then ln tracked.txt {outside}/link && echo changed >> {outside}/link; fi\n        echo $ITEM > file-$ITEM.txt && git add file-$ITEM.txt\n        if [ $ITEM = 2 ]; then git add -A; fi\n        git commit -q -m \"add $ITEM\"\n",
            outside = outside.display()
        ),
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert_eq!(
        scratch.git(&["show", "main:tracked.txt"]).trim(),
        "as committed",
        "item 1's change reached main through item 2: {text}"
    );
    assert!(
        text.contains("left 1 uncommitted change"),
        "the worktree with item 1's change is kept, and said: {text}"
    );
}
