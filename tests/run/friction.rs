//! A first hour with prodigy: what a run says when something goes wrong, and where it keeps
//! its files. Each test pins what a user sees: the last lines after a failed merge back or a
//! job with failures, programs checked before anything is made, the state's namespace,
//! `dlq show` and `dlq clear`, setup's uncommitted files, and the hints of `resume-job` and
//! `events --follow`.

use std::path::Path;
use std::process::Output;

use super::{Scratch, stderr};

/// Writes a workflow into the project and commits it.
fn workflow(scratch: &Scratch, name: &str, text: &str) -> String {
    let path = scratch.project().join(name);
    std::fs::write(&path, text).unwrap();
    scratch.commit();
    path.display().to_string()
}

fn last_line(output: &Output) -> String {
    stderr(output).lines().last().unwrap_or_default().to_owned()
}

/// The id (session or job) named in what OUTPUT printed.
fn id_in(output: &Output, prefix: &str) -> String {
    let re = regex::Regex::new(&format!("{prefix}-[0-9]+-[0-9a-f]+")).unwrap();
    re.find_iter(&stderr(output))
        .last()
        .unwrap_or_else(|| panic!("no {prefix} id in:\n{}", stderr(output)))
        .as_str()
        .to_owned()
}

fn branches(scratch: &Scratch) -> Vec<String> {
    scratch
        .git(&["branch", "--format=%(refname:short)"])
        .lines()
        .map(str::to_owned)
        .filter(|b| b.starts_with("prodigy-"))
        .collect()
}

#[test]
fn a_failed_merge_back_ends_with_a_failure_and_what_is_kept() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "flow.yml",
        "commands:\n  - shell: \"echo x > x.txt\"\n    auto_commit: true\nmerge:\n  - shell: \"echo cannot merge >&2; exit 7\"\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(!text.contains("✓ workflow completed"), "{text}");
    let session = id_in(&output, "session");
    let last = last_line(&output);
    let worktree = scratch.worktree(&session);
    assert!(last.starts_with('✗'), "{last}");
    assert!(last.contains("merging it back failed"), "{last}");
    assert!(last.contains(&format!("`prodigy-{session}`")), "{last}");
    assert!(last.contains(&worktree.display().to_string()), "{last}");
    assert!(
        last.contains(&format!("prodigy resume -y {session}")),
        "{last}"
    );
    assert!(worktree.is_dir(), "the worktree is kept");
    assert!(!scratch.project().join("x.txt").exists());

    // Without -y and without a terminal, `resume` does not claim to merge: it says how.
    let output = scratch.run(&["resume", &session], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(!text.contains("merging"), "{text}");
    assert!(text.contains("is not merged back"), "{text}");
    assert!(
        text.contains(&format!("prodigy resume -y {session}")),
        "{text}"
    );
    assert_eq!(branches(&scratch), [format!("prodigy-{session}")]);
}

#[test]
fn a_job_whose_merge_back_fails_does_not_end_with_a_tick() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"echo $ITEM > f-$ITEM.txt\"\n      auto_commit: true\nmerge:\n  - shell: \"exit 7\"\n",
    );
    let output = scratch.run(&["run", "-y", &file], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    let job = id_in(&output, "mapreduce");
    let last = last_line(&output);
    assert!(
        last.starts_with(&format!("✗ merging job {job} back failed")),
        "{last}"
    );
    assert!(
        last.contains(&format!("prodigy resume-job -y {job}")),
        "{last}"
    );
    assert!(!text.contains("✓ job"), "{text}");
}

#[test]
fn a_failed_run_says_to_fix_it_in_the_session_worktree() {
    let scratch = Scratch::new();
    let file = workflow(&scratch, "flow.yml", "- shell: \"exit 3\"\n");
    let output = scratch.run(&["run", &file], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let session = id_in(&output, "session");
    let last = last_line(&output);
    assert!(
        last.contains(&format!(
            "fix it in the run's worktree {} ",
            scratch.worktree(&session).display()
        )),
        "{last}"
    );
    assert!(
        last.ends_with(&format!("prodigy resume -y {session}")),
        "{last}"
    );
}

#[test]
fn a_missing_claude_is_reported_before_any_worktree_or_branch_exists() {
    let scratch = Scratch::new();
    let missing = [("PRODIGY_CLAUDE_COMMAND", "/nonexistent/claude")];
    let standard = workflow(
        &scratch,
        "flow.yml",
        "- shell: \"true\"\n- claude: \"/go\"\n",
    );
    let job = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"true\"\n      on_failure:\n        claude: \"/fix it\"\n",
    );
    for file in [&standard, &job] {
        let output = scratch.run(&["run", file], &missing);
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{text}");
        assert!(
            text.contains("`/nonexistent/claude` is not installed"),
            "{text}"
        );
        assert!(!text.contains("working in worktree"), "{text}");
        assert!(branches(&scratch).is_empty(), "{:?}", branches(&scratch));
        assert!(!scratch.home().join("worktrees").exists());
        assert!(!scratch.home().join("state").exists());
    }
}

#[test]
fn a_claude_command_that_is_not_executable_counts_as_missing() {
    let scratch = Scratch::new();
    let claude = scratch.dir.path().join("claude");
    std::fs::write(&claude, "#!/bin/sh\necho 'Claude Code'\n").unwrap();
    let claude = claude.display().to_string();
    let file = workflow(&scratch, "flow.yml", "- claude: \"/go\"\n");
    let output = scratch.run(&["run", &file], &[("PRODIGY_CLAUDE_COMMAND", &claude)]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("`{claude}` is not installed (or not executable)")),
        "{text}"
    );
    assert!(branches(&scratch).is_empty(), "{:?}", branches(&scratch));
}

#[test]
fn a_missing_git_is_reported_before_the_run_works_in_place() {
    let scratch = Scratch::new();
    let file = workflow(&scratch, "flow.yml", "- shell: \"touch ran\"\n");
    // A PATH with the stubs only: no git.
    let path = scratch.dir.path().join("bin").display().to_string();
    let output = scratch.run(&["run", &file], &[("PATH", &path)]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("`git` is not installed"), "{text}");
    assert!(text.contains("--no-worktree"), "{text}");
    assert!(!scratch.project().join("ran").exists());
    assert!(!scratch.home().join("worktrees").exists());
}

#[test]
fn resume_y_that_only_merges_needs_no_claude() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "flow.yml",
        "- claude: \"/write\"\n- shell: \"echo x > x.txt\"\n  auto_commit: true\n",
    );
    // No terminal and no -y: the run completes and its branch waits.
    let output = scratch.run(&["run", &file], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let session = id_in(&output, "session");
    let output = scratch.run(
        &["resume", "-y", &session],
        &[("PRODIGY_CLAUDE_COMMAND", "/nonexistent/claude")],
    );
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("✓ merged 1 commit from"), "{text}");
    assert!(scratch.project().join("x.txt").is_file());
}

/// The one directory under DIR.
fn only_dir(dir: &Path) -> String {
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    names[0].clone()
}

#[test]
fn state_is_filed_under_the_repository_not_the_directory_run_from() {
    let scratch = Scratch::new();
    std::fs::create_dir(scratch.project().join("sub")).unwrap();
    let file = workflow(&scratch, "sub/flow.yml", "- shell: \"true\"\n");
    let output = scratch
        .command(&["run", &file], &[])
        .current_dir(scratch.project().join("sub"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let first = only_dir(&scratch.home().join("state"));
    assert!(
        regex::Regex::new("^project-[0-9a-f]{8}$")
            .unwrap()
            .is_match(&first),
        "{first}"
    );
    assert_eq!(only_dir(&scratch.home().join("events")), first);

    // Another repository named `project`, elsewhere: its own namespace.
    let other = scratch.dir.path().join("elsewhere/project");
    std::fs::create_dir_all(&other).unwrap();
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["commit", "-q", "--allow-empty", "-m", "initial"],
    ] {
        let status = super::as_test_user(std::process::Command::new("git").args(args))
            .current_dir(&other)
            .status()
            .unwrap();
        assert!(status.success());
    }
    std::fs::write(other.join("flow.yml"), "- shell: \"true\"\n").unwrap();
    let output = scratch
        .command(&["run", "--no-worktree", "flow.yml"], &[])
        .current_dir(&other)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let mut namespaces: Vec<String> = std::fs::read_dir(scratch.home().join("state"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    namespaces.sort();
    assert_eq!(namespaces.len(), 2, "{namespaces:?}");
    assert!(
        namespaces.iter().all(|n| n.starts_with("project-")),
        "{namespaces:?}"
    );
}

/// A job whose item 2 fails with output on both streams: its id and what the run printed.
fn failing_job(scratch: &Scratch) -> (String, Output) {
    let file = workflow(
        scratch,
        "job.yml",
        "mode: mapreduce\nmap:\n  input: \"seq 1 3\"\n  agent_template:\n    - shell: \"test $ITEM != 2 || { echo progress line; echo 'error: the configuration file settings.yaml could not be parsed because it holds a tab' >&2; exit 4; }\"\n",
    );
    let output = scratch.run(&["run", &file], &[]);
    (id_in(&output, "mapreduce"), output)
}

#[test]
fn a_job_with_failures_says_where_to_look_and_dlq_show_tells_why() {
    let scratch = Scratch::new();
    let (job, output) = failing_job(&scratch);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    let lines: Vec<&str> = text.lines().rev().take(2).collect();
    let tail = lines.join("\n");
    assert!(
        tail.contains(&format!("`prodigy dlq show {job}`")),
        "{tail}"
    );
    assert!(
        tail.contains("1 item is in the dead letter queue"),
        "{tail}"
    );
    let events = regex::Regex::new(r"events in (\S+\.jsonl)").unwrap();
    let events = events
        .captures(&tail)
        .unwrap_or_else(|| panic!("no events file in {tail}"));
    assert!(Path::new(&events[1]).is_file(), "{tail}");

    let shown = scratch.run(&["dlq", "show", &job, "item_1"], &[]);
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.contains("exit code: 4"), "{shown}");
    assert!(
        shown.contains("stdout (last 20 lines at most):\n    │ progress line"),
        "{shown}"
    );
    assert!(
        shown.contains("stderr (last 20 lines at most):\n    │ error: the configuration file"),
        "{shown}"
    );
    assert!(shown.contains("item_1: 1 failure,"), "{shown}");
    // The signature keeps whole words (and says where it was cut).
    let item = scratch.run(&["dlq", "show", &job, "item_1", "--format", "json"], &[]);
    let item: serde_json::Value = serde_json::from_slice(&item.stdout).unwrap();
    assert_eq!(
        item["error_signature"],
        "CommandFailed::error: the configuration file settings.yaml could not be parsed because it…"
    );
    assert_eq!(item["failure_history"][0]["command_output"]["exit_code"], 4);
}

#[test]
fn dlq_clear_asks_first_and_has_a_dry_run() {
    let scratch = Scratch::new();
    let (job, _) = failing_job(&scratch);
    let queued = |scratch: &Scratch| {
        let list = scratch.run(&["dlq", "list", &job, "--format", "json"], &[]);
        serde_json::from_slice::<Vec<serde_json::Value>>(&list.stdout)
            .unwrap()
            .len()
    };
    // No terminal, no -y: refused, with the way out.
    let output = scratch.run(&["dlq", "clear", &job], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains("pass -y"), "{text}");
    assert_eq!(queued(&scratch), 1);
    // A dry run lists what would go and removes nothing.
    let output = scratch.run(&["dlq", "clear", "--dry-run", &job], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let listed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(listed.contains("1 item would be removed"), "{listed}");
    assert!(listed.contains("item_1"), "{listed}");
    assert_eq!(queued(&scratch), 1);
    // On a terminal it asks: no keeps them, yes removes them.
    let output = super::worktree::on_a_terminal(&scratch, &format!("dlq clear {job}"), "n\n");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(text.contains("for good? [y/N]"), "{text}");
    assert!(text.contains("nothing was removed"), "{text}");
    assert_eq!(queued(&scratch), 1);
    let output = super::worktree::on_a_terminal(&scratch, &format!("dlq clear {job}"), "y\n");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(text.contains("removed 1 item from"), "{text}");
    assert_eq!(queued(&scratch), 0);
}

#[test]
fn setup_files_agents_cannot_see_are_named_once() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nsetup:\n  - shell: \"mkdir out && echo x > notes.txt\"\nmap:\n  input: \"seq 1 3\"\n  agent_template:\n    - shell: \"true\"\n",
    );
    let output = scratch.run(&["run", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("warning: setup left"))
        .collect();
    assert_eq!(warnings.len(), 1, "{text}");
    let warning = warnings[0];
    assert!(warning.contains("notes.txt"), "{warning}");
    assert!(warning.contains("out/ (empty)"), "{warning}");
    assert!(warning.contains("will not see them"), "{warning}");
    assert!(warning.contains("mkdir -p out"), "{warning}");
}

#[test]
fn events_follow_of_a_job_completed_before_a_dlq_retry_does_not_ask_to_resume_it() {
    let scratch = Scratch::new();
    let (job, _) = failing_job(&scratch);
    let retry = scratch.run(&["dlq", "retry", &job], &[]);
    assert_eq!(retry.status.code(), Some(1), "{}", stderr(&retry));
    let follow = scratch.run(&["events", "--follow", &job], &[]);
    assert!(follow.status.success(), "{}", stderr(&follow));
    assert!(!stderr(&follow).contains("resume"), "{}", stderr(&follow));
    let printed = String::from_utf8_lossy(&follow.stdout).into_owned();
    assert!(printed.contains("dlq_retry_finished"), "{printed}");
}

#[test]
fn resume_job_without_y_does_not_say_it_merges() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "job.yml",
        "mode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"echo $ITEM > f-$ITEM.txt\"\n      auto_commit: true\n",
    );
    let output = scratch.run(&["run", &file], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = id_in(&output, "mapreduce");
    let output = scratch.run(&["resume-job", &job], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(!text.contains("merging"), "{text}");
    assert!(text.contains("is not merged back"), "{text}");
    assert!(
        text.contains(&format!("prodigy resume-job -y {job}")),
        "{text}"
    );
    assert!(!scratch.project().join("f-1.txt").exists());
    let output = scratch.run(&["resume-job", "-y", &job], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(scratch.project().join("f-1.txt").is_file());
}

#[test]
fn a_job_stopped_by_max_failures_is_not_resumed_into_the_same_failures() {
    let scratch = Scratch::new();
    let log = scratch.dir.path().join("runs");
    let file = workflow(
        &scratch,
        "job.yml",
        &format!(
            "mode: mapreduce\nmap:\n  input: \"seq 1 6\"\n  max_parallel: 1\n  agent_template:\n    - shell: \"echo $ITEM >> {}; test $ITEM -lt 2\"\nerror_policy:\n  max_failures: 2\n",
            log.display()
        ),
    );
    let output = scratch.run(&["run", &file], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let job = id_in(&output, "mapreduce");
    let last = last_line(&output);
    assert!(last.contains("raise `max_failures`"), "{last}");
    assert!(
        last.contains(&format!("prodigy resume-job -y --force {job}")),
        "{last}"
    );
    let runs = std::fs::read_to_string(&log).unwrap();

    let output = scratch.run(&["resume-job", &job], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains("raise `max_failures`"), "{text}");
    assert!(text.contains(&format!("prodigy dlq show {job}")), "{text}");
    assert!(text.contains("--force"), "{text}");
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        runs,
        "agents ran again"
    );
    // `--force` goes ahead.
    let output = scratch.run(&["resume-job", "--force", &job], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert_ne!(std::fs::read_to_string(&log).unwrap(), runs);
}

/// A program that exists but cannot be started (not executable) was reported at `-vv` as
/// "ended by a signal": the step says it could not start, naming the program and why.
#[test]
fn a_program_that_cannot_start_is_named_with_the_reason() {
    let scratch = Scratch::new();
    // It answers the preflight's `--version`, then is no longer executable.
    let claude = scratch.dir.path().join("claude-not-executable");
    std::fs::write(&claude, "#!/bin/sh\nchmod -x \"$0\"\necho 1.0\n").unwrap();
    std::fs::set_permissions(&claude, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = workflow(
        &scratch,
        "wf.yml",
        "name: s\ncommands:\n  - claude: \"/do it\"\n",
    );
    let output = scratch.run(
        &["run", "-vv", &path],
        &[("PRODIGY_CLAUDE_COMMAND", claude.to_str().unwrap())],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    let reason = format!("could not start `{}`: Permission denied", claude.display());
    assert!(
        text.contains(&format!("/do it did not run ({reason}")),
        "{text}"
    );
    assert!(
        text.contains(&format!("failed: /do it: {reason}")),
        "{text}"
    );
    assert!(!text.contains("signal"), "{text}");
}

/// Escape sequences a step printed reached the terminal as they were (clearing the screen,
/// retitling the window): prodigy shows them as `\x1b` wherever it echoes output (at `-v`,
/// in the failure line), while what the step printed is kept byte for byte in variables and
/// files.
#[test]
fn escape_sequences_in_step_output_are_shown_not_sent() {
    let scratch = Scratch::new();
    let path = workflow(
        &scratch,
        "wf.yml",
        r#"name: escapes
commands:
  - shell: "printf '\\033[2J\\033]0;pwned\\007hello\\n'"
    capture: painted
  - shell: "printf '%s' \"${painted}\" > raw.txt"
  - shell: "printf '\\033[31mbroken\\033[0m\\n' >&2; exit 3"
"#,
    );
    let output = scratch.run(&["run", "-v", "--no-worktree", &path], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    // The command's output is on stdout (`-v`), escaped there too.
    let out = String::from_utf8_lossy(&output.stdout);
    for shown in [&text[..], &out[..]] {
        assert!(
            !shown.contains('\u{1b}') && !shown.contains('\u{7}'),
            "{shown:?}"
        );
    }
    assert!(out.contains(r"\x1b[2J\x1b]0;pwned\x07hello"), "{out}");
    assert!(
        format!("{text}{out}").contains(r"\x1b[31mbroken\x1b[0m"),
        "{text}{out}"
    );
    let raw = std::fs::read_to_string(scratch.project().join("raw.txt")).unwrap();
    assert_eq!(raw, "\u{1b}[2J\u{1b}]0;pwned\u{7}hello");
}

#[test]
fn resume_and_resume_job_name_the_command_an_id_needs() {
    let scratch = Scratch::new();
    let (job, _) = failing_job(&scratch);
    let file = workflow(&scratch, "flow.yml", "commands:\n  - shell: \"true\"\n");
    let output = scratch.run(&["run", "--no-worktree", &file], &[]);
    let session = id_in(&output, "session");

    let output = scratch.run(&["resume", &job], &[]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(&format!("continue it with `prodigy resume-job -y {job}`")),
        "{}",
        stderr(&output)
    );
    let output = scratch.run(&["resume-job", &session], &[]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(&format!("continue it with `prodigy resume -y {session}`")),
        "{}",
        stderr(&output)
    );
}

#[test]
fn ls_lists_this_repositorys_runs_and_jobs_newest_first() {
    let scratch = Scratch::new();
    let file = workflow(&scratch, "flow.yml", "commands:\n  - shell: \"true\"\n");
    let output = scratch.run(&["run", "--no-worktree", &file], &[]);
    let session = id_in(&output, "session");
    let (job, _) = failing_job(&scratch);

    let listed = scratch.run(&["ls"], &[]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let text = String::from_utf8_lossy(&listed.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("ID "), "{text}");
    // The job ran after the run: it comes first.
    assert!(lines[1].starts_with(&job), "{text}");
    assert!(lines[1].contains("completed"), "{text}");
    assert!(lines[1].contains("2/3 ok, 1 failed"), "{text}");
    assert!(lines[1].ends_with("job.yml"), "{text}");
    assert!(lines[2].starts_with(&session), "{text}");
    assert!(lines[2].contains(" run "), "{text}");

    let json = scratch.run(&["ls", "--json"], &[]);
    let first: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&json.stdout)
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first["id"], job.as_str());
    assert_eq!(first["state"], "completed");
    assert_eq!(first["items"]["failed"], 1);

    // Another repository has none of them, unless `--all`.
    let other = tempfile::tempdir().unwrap();
    let mut elsewhere = scratch.command(&["ls"], &[]);
    let elsewhere = elsewhere.current_dir(other.path()).output().unwrap();
    assert!(String::from_utf8_lossy(&elsewhere.stdout).is_empty());
    assert!(stderr(&elsewhere).contains("no runs or jobs of this repository"));
    let mut all = scratch.command(&["runs", "--all"], &[]);
    let all = all.current_dir(other.path()).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&all.stdout).lines().count(), 3);
}

#[test]
fn a_job_with_items_in_the_dlq_ends_without_a_tick_and_q_keeps_where_they_are() {
    let scratch = Scratch::new();
    let (job, output) = failing_job(&scratch);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(!text.contains('✓'), "{text}");
    assert!(
        text.contains(&format!(
            "⚠ job {job} completed with failures: 2 succeeded, 1 failed"
        )),
        "{text}"
    );
    let file = scratch.project().join("job.yml").display().to_string();
    let quiet = scratch.run(&["run", "-q", &file], &[]);
    let text = stderr(&quiet);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("⚠ job "), "{text}");
    assert!(
        lines[1].starts_with("1 item is in the dead letter queue: see why with `prodigy dlq show"),
        "{text}"
    );
}

/// A captured number decides `when:` as the number it reads as, and a skipped step says so
/// without `-v`, with the reason when a comparison could not compare.
#[test]
fn when_on_a_captured_number_compares_it_and_skips_say_why() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "when.yml",
        "commands:\n  - shell: echo 61\n    capture: n\n  - shell: echo abc\n    capture: word\n  - shell: touch big\n    when: \"${n} > 10\"\n  - shell: touch small\n    when: \"${n} <= 10\"\n  - shell: echo never\n    when: \"${word} > 10\"\n",
    );
    let output = scratch.run(&["run", "-y", "--no-worktree", &file], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(scratch.project().join("big").exists(), "{text}");
    assert!(!scratch.project().join("small").exists(), "{text}");
    assert!(
        text.contains("[4/5] touch small\n  skipped: `when: ${n} <= 10` is false\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "[5/5] echo never\n  skipped: `when: ${word} > 10` is false (\"abc\" is not a number)\n"
        ),
        "{text}"
    );
}

/// The shell's own syntax survives interpolation: `$$` is its process id, `$${` its `${`,
/// and `${f%.rs}` is left for it.
#[test]
fn shell_syntax_reaches_the_shell() {
    let scratch = Scratch::new();
    let file = workflow(
        &scratch,
        "shell.yml",
        "commands:\n  - shell: |\n      echo \"$$\" > pid.txt\n      f=main.rs\n      echo \"$${f%.rs} ${f%.rs} $${g:-none}\" > name.txt\n",
    );
    let output = scratch.run(&["run", "-y", "--no-worktree", &file], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let pid = std::fs::read_to_string(scratch.project().join("pid.txt")).unwrap();
    assert!(
        !pid.trim().is_empty() && pid.trim().chars().all(|c| c.is_ascii_digit()),
        "{pid:?}"
    );
    let name = std::fs::read_to_string(scratch.project().join("name.txt")).unwrap();
    assert_eq!(name, "main main none\n");
}
