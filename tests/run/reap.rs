//! No process outlives its coordinator: after `kill -9` of prodigy while map agents run,
//! nothing they started is alive once the grace period is over (the guard ends it), and
//! `resume-job` never runs an item beside an earlier run of itself (it ends what a
//! coordinator killed together with its guard left, before anything runs).
//!
//! Each kill repeats at fixed offsets (how many agents had started, then a pause), never
//! random ones, so that a failure replays. Every agent holds an advisory lock on a file of
//! its item (`flock`, inherited by everything it starts) and writes `overlap ITEM` when an
//! earlier run of the item still holds it. A shell agent writes `sleeping ITEM` to the log
//! once its sleep was started, and the test waits for that line (`watch::until_changed`).

use std::time::Duration;

use super::{Scratch, interrupt_when, mapreduce::only_job, mapreduce::outcomes, stderr, watch};

/// `--grace`, in seconds.
const GRACE: &str = "1";

/// Where a kill lands: once COUNT lines starting with WHAT are in the log, and PAUSE after.
struct Offset {
    what: &'static str,
    count: usize,
    pause: Duration,
}

const fn at(what: &'static str, count: usize, pause_ms: u64) -> Offset {
    Offset {
        what,
        count,
        pause: Duration::from_millis(pause_ms),
    }
}

/// The offsets of the shell agents' kill: during setup, as the first agent starts, while
/// others are still being started, once all run, and a while after.
const SHELL_OFFSETS: &[Offset] = &[
    at("setup", 1, 0),
    at("start", 1, 0),
    at("start", 3, 0),
    at("start", 4, 0),
    at("start", 4, 700),
];

/// Ends, when dropped, the processes a test started that still run (a failed assertion
/// must not leave them sleeping): those whose command line holds the test's marker.
struct Leftovers(String);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for pid in alive_with(&self.0) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// The live processes whose command line holds TEXT.
fn alive_with(text: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let line = std::fs::read(entry.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&line)
                .replace('\0', " ")
                .contains(text)
                .then_some(pid)
        })
        .collect()
}

/// The processes holding TEXT once they had up to 5 s to go (the grace period, then
/// SIGKILL, on a loaded machine): their ends are waited for, not polled.
fn left_after_grace(text: &str) -> Vec<i32> {
    watch::left_after(Duration::from_secs(5), || alive_with(text))
}

/// The pid of the guard of the run PID (its child running `prodigy guard`).
fn guard_of(pid: u32) -> Option<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .find_map(|entry| {
            let child = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let parent = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
            let line = std::fs::read(entry.path().join("cmdline")).ok()?;
            (parent == pid.to_string() && String::from_utf8_lossy(&line).contains("\0guard\0"))
                .then_some(child)
        })
}

/// A job of four items, all running at once, for the shell tests. Each agent holds its
/// item's lock and sleeps as long as the file `duration` says, in a grandchild, and writes
/// `sleeping ITEM` once that sleep started; item 2's ignores SIGTERM, so only SIGKILL after
/// the grace period ends it. Setup sleeps as long as `setup-duration` says (and writes
/// `sleeping setup`).
fn shell_job(scratch: &Scratch) {
    let dir = scratch.dir.path();
    std::fs::create_dir(dir.join("locks")).unwrap();
    let job = format!(
        "name: reap\nmode: mapreduce\nsetup:\n  - shell: \"echo setup >> {dir}/log; sleep $(cat {dir}/setup-duration) & echo sleeping setup >> {dir}/log; wait\"\nmap:\n  input: \"seq 1 4\"\n  max_parallel: 4\n  agent_template:\n    - shell: \"exec 9>>{dir}/locks/$ITEM; flock -n 9 || echo overlap $ITEM >> {dir}/log; echo start $ITEM >> {dir}/log; if [ $ITEM = 2 ]; then trap '' TERM; fi; sh -c 'sleep $(cat {dir}/duration) & echo sleeping $ITEM >> {dir}/log; wait'; echo end $ITEM >> {dir}/log\"\n",
        dir = dir.display()
    );
    std::fs::write(scratch.project().join("job.yml"), job).unwrap();
}

/// The lines of the log.
fn lines(scratch: &Scratch) -> Vec<String> {
    std::fs::read_to_string(scratch.dir.path().join("log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Lines of the log that start with WHAT.
fn count(scratch: &Scratch, what: &str) -> usize {
    lines(scratch)
        .iter()
        .filter(|l| l.starts_with(what))
        .count()
}

/// Kills the guard of the run PID with SIGKILL.
fn kill_guard(pid: u32) {
    let guard = guard_of(pid).unwrap_or_else(|| panic!("the run has no guard"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(guard),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

/// Starts the shell job, with agents (or setup, at a `setup` offset) sleeping for MARKER
/// seconds, and kills prodigy with SIGKILL at OFFSET; with `guard_too`, its guard first.
/// Returns the job's id and the run's guard as it was before the kill.
fn kill_shell_job(
    scratch: &Scratch,
    marker: &str,
    offset: &Offset,
    guard_too: bool,
) -> (String, Option<i32>) {
    let dir = scratch.dir.path();
    let setup = if offset.what == "setup" { marker } else { "0" };
    std::fs::write(dir.join("setup-duration"), setup).unwrap();
    std::fs::write(dir.join("duration"), marker).unwrap();
    let child = scratch
        .command(&["run", "--no-worktree", "--grace", GRACE, "job.yml"], &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Setup's sleep or an agent's, as OFFSET says, is the one that sleeps for MARKER.
    let setup = offset.what == "setup";
    let mut guard = None;
    let output = interrupt_when(child, nix::sys::signal::Signal::SIGKILL, |_| {
        watch::until_changed(dir, "the offset", || {
            count(scratch, offset.what) >= offset.count
                && lines(scratch).iter().any(|l| {
                    l.strip_prefix("sleeping ")
                        .is_some_and(|who| (who == "setup") == setup)
                })
        });
        // The offset's pause: the kill lands this long after, whatever runs then.
        std::thread::sleep(offset.pause);
        guard = guard_of(pid);
        if guard_too {
            kill_guard(pid);
        }
    });
    assert_eq!(output.status.code(), None, "killed: {}", stderr(&output));
    (only_job(scratch), guard)
}

/// Resumes JOB with quick agents and checks that every item succeeded once, and that no
/// item overlapped an earlier run of itself.
fn resume_quickly(scratch: &Scratch, job: &str) -> String {
    let dir = scratch.dir.path();
    std::fs::write(dir.join("setup-duration"), "0").unwrap();
    std::fs::write(dir.join("duration"), "0.2").unwrap();
    let output = scratch.run(&["resume-job", "--grace", GRACE, job], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    let log = std::fs::read_to_string(dir.join("log")).unwrap();
    assert_eq!(count(scratch, "overlap"), 0, "{log}");
    let mut ids: Vec<String> = outcomes(scratch, job)
        .into_iter()
        .filter(|(_, status)| status == "succeeded")
        .map(|(id, _)| id)
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 4, "{log}");
    text
}

#[test]
fn a_killed_coordinator_takes_its_agents_and_their_children_with_it() {
    for (n, offset) in SHELL_OFFSETS.iter().enumerate() {
        let scratch = Scratch::new();
        shell_job(&scratch);
        let marker = format!("48.{:07}{n}", std::process::id());
        let _leftovers = Leftovers(format!("sleep {marker}"));
        let (job, guard) = kill_shell_job(&scratch, &marker, offset, false);
        let left = left_after_grace(&format!("sleep {marker}"));
        assert!(
            left.is_empty(),
            "offset {n}: processes of the killed run still alive: {left:?}"
        );
        // The guard ends the agents' shells as well as their sleeps (TERM, then KILL after
        // the grace to a shell that ignores TERM): the resumed run comes once it is done, or
        // it would find, and end, what the guard was still ending.
        let guard = guard.unwrap_or_else(|| panic!("offset {n}: the run had no guard"));
        let running = watch::gone_within(&[guard], Duration::from_secs(10));
        assert!(running.is_empty(), "offset {n}: the guard still runs");
        let text = resume_quickly(&scratch, &job);
        // The guard left nothing for the resumed run to end.
        assert!(!text.contains("left running"), "offset {n}: {text}");
    }
}

#[test]
fn resume_job_ends_what_a_coordinator_killed_with_its_guard_left_before_items_run_again() {
    for (n, offset) in [at("start", 1, 0), at("start", 4, 0), at("start", 4, 400)]
        .iter()
        .enumerate()
    {
        let scratch = Scratch::new();
        shell_job(&scratch);
        let marker = format!("49.{:07}{n}", std::process::id());
        let _leftovers = Leftovers(format!("sleep {marker}"));
        let (job, _) = kill_shell_job(&scratch, &marker, offset, true);
        // With the guard gone too, the agents run on.
        std::thread::sleep(Duration::from_millis(300));
        let running = alive_with(&format!("sleep {marker}"));
        assert!(!running.is_empty(), "offset {n}: nothing survived");
        let text = resume_quickly(&scratch, &job);
        assert!(
            text.contains(&format!("that an earlier run of job {job} left running")),
            "offset {n}: {text}"
        );
        assert_eq!(alive_with(&format!("sleep {marker}")), Vec::<i32>::new());
    }
}

/// The Claude CLI, replayed: a wrapper around the replay stub that takes its item's lock
/// (the item is the last word of the prompt, which comes on standard input) and then
/// becomes the stub, given the prompt, whose transcript lines
/// come `CLAUDE_REPLAY_DELAY` seconds apart (each pause a `sleep` of its own).
fn claude_wrapper(scratch: &Scratch) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = scratch.dir.path();
    std::fs::create_dir(dir.join("locks")).unwrap();
    let replay = super::root().join("tests/fixtures/claude/replay");
    let path = dir.join("claude");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nfor last; do :; done\nif [ \"$last\" != --version ]; then\n  prompt=$(cat)\n  item=${{prompt##* }}\n  exec 9>>{dir}/locks/$item\n  flock -n 9 || echo overlap $item >> {dir}/log\n  echo start $item >> {dir}/log\n  exec {replay} \"$@\" <<EOF\n$prompt\nEOF\nfi\nexec {replay} \"$@\"\n",
            dir = dir.display(),
            replay = replay.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn a_killed_coordinator_takes_its_claude_calls_with_it_and_resume_never_doubles_them() {
    for (n, (offset, guard_too)) in [
        (at("start", 1, 0), false),
        (at("start", 3, 300), false),
        (at("start", 3, 0), true),
    ]
    .iter()
    .enumerate()
    {
        let scratch = Scratch::new();
        let claude = claude_wrapper(&scratch);
        // In the prompt, in the stub's command line, and the length of its pauses.
        let marker = format!("47.{:07}{n}", std::process::id());
        let _leftovers = Leftovers(marker.clone());
        std::fs::write(
            scratch.project().join("job.yml"),
            format!("name: reap-claude\nmode: mapreduce\nmap:\n  input: \"seq 1 3\"\n  max_parallel: 3\n  agent_template:\n    - claude: \"work {marker} on ${{item}}\"\n"),
        )
        .unwrap();
        scratch.commit();
        let env = [
            ("PRODIGY_CLAUDE_COMMAND", claude.to_str().unwrap()),
            ("IS_SANDBOX", "1"),
            ("CLAUDE_REPLAY", "ok"),
            ("CLAUDE_REPLAY_DELAY", marker.as_str()),
        ];
        let child = scratch
            .command(&["run", "--grace", GRACE, "job.yml"], &env)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let output = interrupt_when(child, nix::sys::signal::Signal::SIGKILL, |_| {
            watch::until_changed(scratch.dir.path(), "the offset", || {
                count(&scratch, offset.what) >= offset.count
            });
            // Into its transcript's pauses: the replay stub tells no one when a pause
            // begins, so the process table is looked at until one runs.
            let started = std::time::Instant::now();
            while alive_with(&format!("sleep {marker}")).is_empty() {
                assert!(started.elapsed() < watch::PATIENCE, "offset {n}: no pause");
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(offset.pause);
            if *guard_too {
                kill_guard(pid);
            }
        });
        assert_eq!(output.status.code(), None, "killed: {}", stderr(&output));
        if *guard_too {
            std::thread::sleep(Duration::from_millis(300));
            assert!(
                !alive_with(&marker).is_empty(),
                "offset {n}: nothing survived"
            );
        } else {
            let left = left_after_grace(&marker);
            assert!(
                left.is_empty(),
                "offset {n}: Claude calls still alive: {left:?}"
            );
        }
        let job = only_job(&scratch);
        let env = [
            ("PRODIGY_CLAUDE_COMMAND", claude.to_str().unwrap()),
            ("IS_SANDBOX", "1"),
            ("CLAUDE_REPLAY", "ok"),
        ];
        let output = scratch.run(&["resume-job", "-y", "--grace", GRACE, &job], &env);
        let text = stderr(&output);
        assert!(output.status.success(), "offset {n}: {text}");
        let log = std::fs::read_to_string(scratch.dir.path().join("log")).unwrap();
        assert_eq!(count(&scratch, "overlap"), 0, "offset {n}: {log}");
        assert_eq!(
            outcomes(&scratch, &job)
                .iter()
                .filter(|(_, status)| status == "succeeded")
                .count(),
            3,
            "offset {n}: {log}\n{text}"
        );
        if *guard_too {
            assert!(text.contains("left running"), "offset {n}: {text}");
        }
        assert_eq!(alive_with(&marker), Vec::<i32>::new(), "offset {n}");
    }
}

/// The stand-in of [`a_claude_call_running_at_a_kill_counts_in_the_job_spend_after_resume`]:
/// `system/init` and a long `assistant` event, then a pause of MARKER seconds, then the
/// `ok` transcript's `result`.
fn streaming_stand_in(scratch: &Scratch, marker: &str) -> std::path::PathBuf {
    let dir = scratch.dir.path();
    let replay = super::root().join("tests/fixtures/claude/replay");
    let ok = std::fs::read_to_string(super::root().join("tests/fixtures/claude/ok.jsonl")).unwrap();
    let init = ok.lines().next().unwrap();
    let result = ok.lines().last().unwrap();
    let assistant = serde_json::json!({
        "type": "assistant",
        "message": {
            "id": "msg_long", "type": "message", "role": "assistant",
            "model": "claude-opus-4-8",
            "content": [{"type": "text", "text": "The cause is in the parser. ".repeat(150)}],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 12, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0, "output_tokens": 1}
        },
        "parent_tool_use_id": null, "session_id": "s-long"
    });
    std::fs::write(dir.join("streamed.jsonl"), format!("{init}\n{assistant}\n")).unwrap();
    std::fs::write(dir.join("result.jsonl"), format!("{result}\n")).unwrap();
    let claude = dir.join("claude");
    std::fs::write(
        &claude,
        format!(
            "#!/bin/sh\nfor last; do :; done\nif [ \"$last\" = --version ]; then exec {replay} --version; fi\ncat >/dev/null\ncat {dir}/streamed.jsonl\nsleep {marker}\ncat {dir}/result.jsonl\n",
            replay = replay.display(),
            dir = dir.display()
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&claude, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    claude
}

/// A Claude call running when its coordinator is killed with SIGKILL costs what it streamed:
/// `resume-job` prices it from its log and counts it in the job's spend (its checkpoint's
/// `claude_cost_usd`, which the budget reads) and in the resumed run's totals, as a
/// `claude_finished` marked estimated, once.
///
/// The call is a stand-in for the CLI that prints the CLI's `system/init` and one
/// `assistant` event of 4,200 characters of text whose usage, as the real CLI's, is
/// `message_start`'s (`output_tokens: 1`), then waits (MARKER seconds) before its `result`.
#[test]
fn a_claude_call_running_at_a_kill_counts_in_the_job_spend_after_resume() {
    let scratch = Scratch::new();
    let marker = format!("44.{:07}", std::process::id());
    let _leftovers = Leftovers(marker.clone());
    let claude = streaming_stand_in(&scratch, &marker);
    let replay = super::root().join("tests/fixtures/claude/replay");
    std::fs::write(
        scratch.project().join("job.yml"),
        "mode: mapreduce\nmap:\n  input: \"seq 1 1\"\n  agent_template:\n    - claude: \"/work on ${item}\"\n",
    )
    .unwrap();
    scratch.commit();
    let env = [
        ("PRODIGY_CLAUDE_COMMAND", claude.to_str().unwrap()),
        ("IS_SANDBOX", "1"),
    ];
    let child = scratch
        .command(&["run", "--grace", GRACE, "job.yml"], &env)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let logs = scratch.home().join("logs");
    let output = interrupt_when(child, nix::sys::signal::Signal::SIGKILL, |_| {
        // Once the message is in the call's log, as the run read it.
        watch::until_changed_under(&scratch.home(), "the streamed message", || {
            let mut files = Vec::new();
            super::collect_files(&logs, &mut files);
            files
                .iter()
                .any(|f| std::fs::read_to_string(f).is_ok_and(|text| text.contains("msg_long")))
        });
    });
    assert_eq!(output.status.code(), None, "killed: {}", stderr(&output));
    let job = only_job(&scratch);
    let replay = replay.display().to_string();
    let env = [
        ("PRODIGY_CLAUDE_COMMAND", replay.as_str()),
        ("IS_SANDBOX", "1"),
        ("CLAUDE_REPLAY", "ok"),
    ];
    let spent = |scratch: &Scratch| {
        let path = scratch
            .state()
            .join("mapreduce/jobs")
            .join(&job)
            .join("checkpoint.json");
        let checkpoint: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        checkpoint["claude_cost_usd"].as_f64().unwrap_or(0.0)
    };
    let output = scratch.run(&["resume-job", "-y", "--grace", GRACE, &job], &env);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    // Opus: 12 input tokens at $5 and 4,200 bytes, 1,400 output tokens, at $25 a million
    // (the usage the event reported alone would say $0.000085); then the `ok` call's $0.00026.
    let killed = 0.03506;
    assert!(
        (spent(&scratch) - (killed + 0.00026)).abs() < 1e-9,
        "{}",
        spent(&scratch)
    );
    assert!(text.contains("2 Claude calls (1 failed)"), "{text}");
    assert!(text.contains("(1 estimated)"), "{text}");
    let finished: Vec<serde_json::Value> = scratch
        .events()
        .into_iter()
        .filter(|e| e["event_type"] == "claude_finished")
        .collect();
    assert_eq!(finished.len(), 2, "{finished:?}");
    assert_eq!(finished[0]["cost_usd"], killed, "{finished:?}");
    assert_eq!(finished[0]["cost_estimated"], true);
    assert_eq!(finished[0]["item_id"], "item_0");
    assert_eq!(finished[0]["error_kind"], "unknown");
    // Counted once: a resume of the completed job finds nothing more.
    let output = scratch.run(&["resume-job", "-y", &job], &env);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!((spent(&scratch) - (killed + 0.00026)).abs() < 1e-9);
}

/// What a step left running in the background goes when the run ends: nothing outlives
/// prodigy, even after it succeeded.
#[test]
fn a_finished_run_leaves_no_background_process_behind() {
    let scratch = Scratch::new();
    let marker = format!("46.{:07}", std::process::id());
    let _leftovers = Leftovers(format!("sleep {marker}"));
    std::fs::write(
        scratch.project().join("flow.yml"),
        format!("- shell: \"sleep {marker} & echo started\"\n- shell: \"echo second\"\n"),
    )
    .unwrap();
    let output = scratch.run(&["run", "--no-worktree", "--grace", GRACE, "flow.yml"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(alive_with(&format!("sleep {marker}")), Vec::<i32>::new());
}

/// `resume` of a standard run killed with its guard ends what the killed run left before
/// its step runs again.
#[test]
fn resume_ends_what_a_run_killed_with_its_guard_left_before_its_step_runs_again() {
    let scratch = Scratch::new();
    let dir = scratch.dir.path();
    let marker = format!("45.{:07}", std::process::id());
    let _leftovers = Leftovers(format!("sleep {marker}"));
    std::fs::write(dir.join("duration"), &marker).unwrap();
    std::fs::write(
        scratch.project().join("flow.yml"),
        format!(
            "- shell: \"echo first\"\n- shell: \"exec 9>>{dir}/lock; flock -n 9 || echo overlap >> {dir}/log; echo start >> {dir}/log; sleep $(cat {dir}/duration) & echo sleeping >> {dir}/log; wait\"\n",
            dir = dir.display()
        ),
    )
    .unwrap();
    let child = scratch
        .command(&["run", "--no-worktree", "--grace", GRACE, "flow.yml"], &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let output = interrupt_when(child, nix::sys::signal::Signal::SIGKILL, |_| {
        watch::until_changed(dir, "the sleep", || count(&scratch, "sleeping") >= 1);
        // The checkpoint after the first step is written while the second starts.
        let sessions = scratch.state().join("sessions");
        watch::until_changed_under(&scratch.home(), "the checkpoint", || {
            std::fs::read_dir(&sessions)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| e.path().join("checkpoint.json").exists())
        });
        kill_guard(pid);
    });
    assert_eq!(output.status.code(), None, "killed: {}", stderr(&output));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !alive_with(&format!("sleep {marker}")).is_empty(),
        "nothing survived"
    );
    let sessions = scratch.state().join("sessions");
    let session = std::fs::read_dir(sessions)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .unwrap();
    std::fs::write(dir.join("duration"), "0.1").unwrap();
    let output = scratch.run(&["resume", "--grace", GRACE, &session], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "that an earlier run of session {session} left running"
        )),
        "{text}"
    );
    let log = std::fs::read_to_string(dir.join("log")).unwrap();
    assert_eq!(log, "start\nsleeping\nstart\nsleeping\n", "{text}");
    assert_eq!(alive_with(&format!("sleep {marker}")), Vec::<i32>::new());
}

/// `dlq retry` killed with its guard while it retries items: the next `dlq retry` ends
/// what it left before the items run again.
#[test]
fn dlq_retry_ends_what_a_killed_retry_left_before_the_items_run_again() {
    let scratch = Scratch::new();
    let dir = scratch.dir.path();
    std::fs::create_dir(dir.join("locks")).unwrap();
    let marker = format!("44.{:07}", std::process::id());
    let _leftovers = Leftovers(format!("sleep {marker}"));
    std::fs::write(dir.join("mode"), "fail").unwrap();
    std::fs::write(dir.join("duration"), &marker).unwrap();
    std::fs::write(
        scratch.project().join("job.yml"),
        format!(
            "name: reap-dlq\nmode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"exec 9>>{dir}/locks/$ITEM; flock -n 9 || echo overlap $ITEM >> {dir}/log; echo start $ITEM >> {dir}/log; test $(cat {dir}/mode) = ok || exit 1; sleep $(cat {dir}/duration) & echo sleeping $ITEM >> {dir}/log; wait\"\n",
            dir = dir.display()
        ),
    )
    .unwrap();
    let output = scratch.run(&["run", "--no-worktree", "job.yml"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = only_job(&scratch);
    std::fs::write(dir.join("mode"), "ok").unwrap();
    let child = scratch
        .command(&["dlq", "retry", "--grace", GRACE, &job], &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let output = interrupt_when(child, nix::sys::signal::Signal::SIGKILL, |_| {
        watch::until_changed(dir, "the retried items", || {
            count(&scratch, "start") >= 4 && count(&scratch, "sleeping") >= 1
        });
        kill_guard(pid);
    });
    assert_eq!(output.status.code(), None, "killed: {}", stderr(&output));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !alive_with(&format!("sleep {marker}")).is_empty(),
        "nothing survived"
    );
    std::fs::write(dir.join("duration"), "0.1").unwrap();
    let output = scratch.run(&["dlq", "retry", "--grace", GRACE, &job], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains(&format!("that an earlier run of job {job} left running")),
        "{text}"
    );
    let log = std::fs::read_to_string(dir.join("log")).unwrap();
    assert_eq!(count(&scratch, "overlap"), 0, "{log}");
    assert_eq!(count(&scratch, "start"), 6, "{log}");
    assert_eq!(alive_with(&format!("sleep {marker}")), Vec::<i32>::new());
}
