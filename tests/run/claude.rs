//! `claude:` steps against recorded Claude Code transcripts (`tests/fixtures/claude`), replayed
//! by `tests/fixtures/claude/replay` in place of the CLI: how each documented failure is told
//! apart, retried or not, shown, logged and put in the DLQ; and the limit on what a command's
//! output keeps in memory.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::{Scratch, root, stderr};

fn replay() -> String {
    root()
        .join("tests/fixtures/claude/replay")
        .display()
        .to_string()
}

/// Writes WORKFLOW, commits it, and runs it with the replay stub (`IS_SANDBOX=1`: the tests
/// may run as root), plus ENV.
fn run(scratch: &Scratch, args: &[&str], workflow: &str, env: &[(&str, &str)]) -> super::Output {
    std::fs::write(scratch.project().join("flow.yml"), workflow).unwrap();
    scratch.commit();
    let replay = replay();
    let mut all = vec![
        ("PRODIGY_CLAUDE_COMMAND", replay.as_str()),
        ("IS_SANDBOX", "1"),
    ];
    all.extend_from_slice(env);
    let mut full = vec!["run"];
    full.extend_from_slice(args);
    full.push("flow.yml");
    scratch.run(&full, &all)
}

/// The argument lists the stub received, one list per call (the `--version` preflight
/// included).
fn calls(file: &std::path::Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .split("\n\n")
        .filter(|c| !c.trim().is_empty())
        .map(|c| c.lines().map(str::to_owned).collect())
        .collect()
}

fn events_of(scratch: &Scratch, kind: &str) -> Vec<Value> {
    scratch
        .events()
        .into_iter()
        .filter(|e| e["event_type"] == kind)
        .collect()
}

#[test]
fn a_successful_call_gives_its_final_text_and_shows_tools_as_they_run() {
    let scratch = Scratch::new();
    let out = run(
        &scratch,
        &["-v", "--no-worktree"],
        "- claude: \"Run a tool. scenario:tool\"\n  capture: answer\n- shell: 'printf \"%s\" \"$ANSWER\" > answer.txt'\n",
        &[],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("  │ → Bash: echo tool-ran"), "{text}");
    // The capture is the final text, never the raw events.
    let answer = std::fs::read_to_string(scratch.project().join("answer.txt")).unwrap();
    assert!(!answer.contains("\"type\""), "{answer}");
    assert!(!answer.is_empty());
    assert!(text.contains("1 Claude call, "), "{text}");
    let finished = &events_of(&scratch, "claude_finished")[0];
    assert_eq!(finished["success"], true);
    assert!(finished["num_turns"].as_u64().unwrap() >= 2, "{finished}");
    assert!(finished["cost_usd"].as_f64().unwrap() > 0.0, "{finished}");
    // The raw stream is in the call's log, as it arrived.
    let log = PathBuf::from(finished["log"].as_str().unwrap());
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        logged,
        std::fs::read_to_string(root().join("tests/fixtures/claude/tool.jsonl")).unwrap()
    );
    let started = &events_of(&scratch, "claude_started")[0];
    assert_eq!(
        started["cli_version"].as_str().unwrap(),
        std::fs::read_to_string(root().join("tests/fixtures/claude/VERSION.txt"))
            .unwrap()
            .trim()
    );
}

#[test]
fn an_unknown_slash_command_fails_though_the_cli_exits_0() {
    let scratch = Scratch::new();
    let out = run(&scratch, &["--no-worktree"], "- claude: \"/nosuch\"\n", &[]);
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("failed: /nosuch: Claude `invalid_request` error: Unknown command: /nosuch"),
        "{text}"
    );
}

#[test]
fn a_call_that_ends_without_a_result_fails() {
    let scratch = Scratch::new();
    let crash = scratch.dir.path().join("crashing-claude");
    std::fs::write(
        &crash,
        format!(
            "#!/bin/sh\nfor last; do :; done\n[ \"$last\" = --version ] && exec {} --version\nhead -n 2 {}\nexit 0\n",
            replay(),
            root().join("tests/fixtures/claude/ok.jsonl").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&crash, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = run(
        &scratch,
        &["--no-worktree"],
        "- claude: \"Reply briefly.\"\n",
        &[("PRODIGY_CLAUDE_COMMAND", crash.to_str().unwrap())],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("exited without a `result` event"), "{text}");
}

#[test]
fn authentication_failures_are_not_retried_unless_retry_on_names_them() {
    let scratch = Scratch::new();
    let args = scratch.dir.path().join("args");
    let workflow = "- claude: \"Reply. scenario:401\"\n  retry_config:\n    attempts: 3\n    initial_delay: 10ms\n";
    let out = run(
        &scratch,
        &["--no-worktree"],
        workflow,
        &[("CLAUDE_REPLAY_ARGS", args.to_str().unwrap())],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("Claude `authentication` error"), "{text}");
    assert!(
        text.contains("ANTHROPIC_API_KEY"),
        "the fix is named: {text}"
    );
    // The preflight's `--version`, then one call.
    assert_eq!(calls(&args).len(), 2, "{:?}", calls(&args));

    // Named by `retry_on: [auth]`, it is retried: `--version`, then three calls.
    let scratch = Scratch::new();
    let args = scratch.dir.path().join("args");
    let out = run(
        &scratch,
        &["--no-worktree"],
        &format!("{workflow}    retry_on: [auth]\n"),
        &[("CLAUDE_REPLAY_ARGS", args.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(calls(&args).len(), 4, "{:?}", calls(&args));

    // Not logged in is the same kind, from the assistant's `error`.
    let scratch = Scratch::new();
    let out = run(
        &scratch,
        &["--no-worktree"],
        "- claude: \"Reply. scenario:not-logged-in\"\n",
        &[],
    );
    let text = stderr(&out);
    assert!(
        text.contains("Claude `authentication` error: Not logged in"),
        "{text}"
    );
}

#[test]
fn overload_rate_limit_and_max_turns_are_told_apart() {
    for (scenario, kind) in [
        ("529", "overloaded"),
        ("429", "rate_limit"),
        ("500", "server_error"),
        ("maxturns", "max_turns"),
    ] {
        let scratch = Scratch::new();
        let out = run(
            &scratch,
            &["--no-worktree"],
            &format!("- claude: \"Reply. scenario:{scenario}\"\n"),
            &[],
        );
        let text = stderr(&out);
        assert!(
            text.contains(&format!("Claude `{kind}` error")),
            "{scenario}: {text}"
        );
        assert_eq!(
            events_of(&scratch, "claude_finished")[0]["error_kind"],
            kind
        );
    }
}

#[test]
fn transient_failures_are_retried_by_kind() {
    let scratch = Scratch::new();
    let args = scratch.dir.path().join("args");
    // 529 is `server_error` too; 429 is not.
    let workflow = "- claude: \"Reply. scenario:529\"\n  retry_config:\n    attempts: 2\n    initial_delay: 10ms\n    retry_on: [server_error]\n  on_failure: true\n- claude: \"Reply. scenario:429\"\n  retry_config:\n    attempts: 2\n    initial_delay: 10ms\n    retry_on: [server_error]\n";
    let out = run(
        &scratch,
        &["--no-worktree"],
        workflow,
        &[("CLAUDE_REPLAY_ARGS", args.to_str().unwrap())],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    // `--version`, two runs of the 529 step, one of the 429 step.
    assert_eq!(calls(&args).len(), 4, "{text}");
}

#[test]
fn the_cli_retrying_the_api_is_shown_as_it_happens() {
    let scratch = Scratch::new();
    let out = run(
        &scratch,
        &["-v", "--no-worktree"],
        "- claude: \"Reply. scenario:529-retried\"\n",
        &[],
    );
    let text = stderr(&out);
    assert!(
        text.contains("│ API retry 1/2: overloaded, next in "),
        "{text}"
    );
}

#[test]
fn a_quoted_claude_command_keeps_its_words_and_the_prompt() {
    let scratch = Scratch::new();
    let args = scratch.dir.path().join("args");
    let command = format!("{} --append-system-prompt \"be terse\"", replay());
    let out = run(
        &scratch,
        &["--no-worktree"],
        "- claude: \"Reply briefly. scenario:echo\"\n",
        &[
            ("PRODIGY_CLAUDE_COMMAND", &command),
            ("CLAUDE_REPLAY_ARGS", args.to_str().unwrap()),
        ],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let calls = calls(&args);
    assert_eq!(
        calls.last().unwrap(),
        &[
            "--append-system-prompt",
            "be terse",
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--dangerously-skip-permissions",
        ]
    );
    // The prompt reached the CLI on its standard input.
    let finished = &events_of(&scratch, "claude_finished")[0];
    let log = std::fs::read_to_string(finished["log"].as_str().unwrap()).unwrap();
    assert!(
        log.contains("claude: Reply briefly. scenario:echo"),
        "{log}"
    );
    // A command line that cannot be split is refused before anything runs.
    let scratch = Scratch::new();
    let out = run(
        &scratch,
        &["--no-worktree"],
        "- claude: \"x\"\n",
        &[("PRODIGY_CLAUDE_COMMAND", "claude \"oops")],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("an opening quote has no closing quote"),
        "{text}"
    );
}

#[test]
fn as_root_without_is_sandbox_the_run_is_refused_with_the_fix() {
    if !nix_is_root() {
        super::external::skip_line(
            "as_root_without_is_sandbox_the_run_is_refused_with_the_fix",
            "not running as root: the CLI's root check does not apply",
        );
        return;
    }
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join("flow.yml"), "- claude: \"x\"\n").unwrap();
    scratch.commit();
    let out = scratch.run(
        &["run", "flow.yml"],
        &[("PRODIGY_CLAUDE_COMMAND", &replay()), ("IS_SANDBOX", "")],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("set `IS_SANDBOX=1`"), "{text}");
    assert!(
        !scratch.home().join("worktrees").exists(),
        "nothing was made"
    );
}

fn nix_is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

#[test]
fn a_failed_map_item_names_the_claude_error_and_its_log_in_the_dlq() {
    let scratch = Scratch::new();
    let workflow = "name: j\nmode: mapreduce\nmap:\n  input: \"printf 'ok\\\\n401\\\\n'\"\n  agent_template:\n    - claude: \"Reply. scenario:${item}\"\n    - shell: \"echo ${item} > ${item}.txt && git add ${item}.txt && git commit -qm ${item}\"\n";
    let out = run(&scratch, &[], workflow, &[]);
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let mut items = Vec::new();
    super::collect_files(&scratch.home().join("dlq"), &mut items);
    let items: Vec<Value> = items
        .iter()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("items")))
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
        .collect();
    assert_eq!(items.len(), 1, "{text}");
    let failure = &items[0]["failure_history"][0];
    assert_eq!(
        failure["error_type"],
        serde_json::json!({"ClaudeFailed": {"kind": "authentication"}})
    );
    assert!(
        failure["error_message"]
            .as_str()
            .unwrap()
            .contains("Invalid API key"),
        "{failure}"
    );
    let log = failure["json_log_location"].as_str().unwrap();
    assert!(
        std::fs::read_to_string(log)
            .unwrap()
            .contains("authentication_failed")
    );
    // The results carry each item's cost.
    let mut results = Vec::new();
    super::collect_files(&scratch.state(), &mut results);
    let results = results
        .iter()
        .find(|p| p.ends_with("results.jsonl"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .unwrap();
    assert!(results.contains("\"claude\":{\"calls\":1"), "{results}");
    // Each item's record names its Claude sessions and logs, the kind of its last failed
    // call, and the commits merged from it.
    let records: Vec<Value> = results
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let record = |id: &str| records.iter().find(|r| r["item_id"] == id).unwrap();
    let (ok, failed) = (record("item_0"), record("item_1"));
    assert_eq!(ok["claude_sessions"].as_array().unwrap().len(), 1, "{ok}");
    assert!(ok.get("claude_error_kind").is_none(), "{ok}");
    let commits = ok["commits"].as_array().unwrap();
    assert_eq!(commits.len(), 1, "{ok}");
    assert_eq!(
        scratch
            .git(&["log", "-1", "--format=%s", commits[0].as_str().unwrap()])
            .trim(),
        "ok"
    );
    assert_eq!(failed["claude_error_kind"], "authentication", "{failed}");
    assert_eq!(failed["claude_logs"][0].as_str(), Some(log), "{failed}");
    assert!(failed.get("commits").is_none(), "{failed}");

    // `dlq list` and `dlq show` name the Claude error's kind and the call's log.
    let job = regex::Regex::new(r"mapreduce-[0-9]+-[0-9a-f]+")
        .unwrap()
        .find(&text)
        .unwrap()
        .as_str()
        .to_owned();
    let listed = stdout(&scratch.run(&["dlq", "list", &job], &[]));
    assert!(listed.contains("ClaudeFailed (authentication)"), "{listed}");
    assert!(listed.contains(log), "{listed}");
    let shown = stdout(&scratch.run(&["dlq", "show", &job], &[]));
    assert!(
        shown.contains(": ClaudeFailed (authentication) in `"),
        "{shown}"
    );
    assert!(shown.contains(&format!("claude log: {log}")), "{shown}");

    // `prodigy logs` lists the job's calls and shows one; `prodigy events --claude` sums them.
    let listed = stdout(&scratch.run(&["logs", &job], &[]));
    assert!(
        listed.contains("item_0/0001-Reply.-scenario-item.jsonl  ok, 1 turn"),
        "{listed}"
    );
    assert!(
        listed.contains("item_1/0001-Reply.-scenario-item.jsonl  failed (authentication)"),
        "{listed}"
    );
    let shown = stdout(&scratch.run(&["logs", &job, "--item", "item_1", "--show"], &[]));
    assert!(!shown.contains("item_0"), "{shown}");
    assert!(shown.contains("│ Invalid API key"), "{shown}");
    let raw = stdout(&scratch.run(&["logs", &job, "--item", "item_1", "--raw"], &[]));
    assert!(
        raw.lines()
            .all(|l| serde_json::from_str::<Value>(l).is_ok()),
        "{raw}"
    );
    let runs = stdout(&scratch.run(&["logs"], &[]));
    assert!(runs.contains(&format!("{job}  2 logs")), "{runs}");
    let sums = stdout(&scratch.run(&["events", &job, "--claude"], &[]));
    assert!(
        sums.contains("in all: 2 Claude calls (1 failed), 2 turns"),
        "{sums}"
    );
    let missing = scratch.run(&["logs", "no-such-run"], &[]);
    assert_eq!(missing.status.code(), Some(2));
}

fn stdout(output: &super::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn secrets_are_masked_in_the_claude_log() {
    let scratch = Scratch::new();
    let workflow = "secrets:\n  TOKEN: \"${env:SECRET_TOKEN}\"\ncommands:\n  - claude: \"use ${TOKEN} scenario:echo\"\n";
    let out = run(
        &scratch,
        &["--no-worktree"],
        workflow,
        &[("SECRET_TOKEN", "hunter2-very-secret")],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let finished = &events_of(&scratch, "claude_finished")[0];
    let log = std::fs::read_to_string(finished["log"].as_str().unwrap()).unwrap();
    assert!(log.contains("claude: use *** scenario:echo"), "{log}");
    assert!(!log.contains("hunter2"), "{log}");
}

/// A `json` capture of output cut to its tail says so, and names the limit.
#[test]
fn a_json_capture_of_cut_output_says_it_needs_it_whole() {
    let scratch = Scratch::new();
    std::fs::write(
        scratch.project().join("flow.yml"),
        "- shell: \"printf '[' ; i=0; while [ $i -lt 3000 ]; do printf '%s,' $i; i=$((i+1)); done; echo 0]\"\n  capture: list\n  capture_format: json\n",
    )
    .unwrap();
    scratch.commit();
    let out = scratch.run(
        &["run", "--no-worktree", "flow.yml"],
        &[("PRODIGY_OUTPUT_LIMIT", "1K")],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("capture `list`: the output was cut to its last part (PRODIGY_OUTPUT_LIMIT)"),
        "{text}"
    );
    // Under the limit the same capture works.
    let out = scratch.run(&["run", "--no-worktree", "flow.yml"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// A `claude` step that fails without a failed call (here its prompt names a variable nothing
/// sets, so no call is made) still gives its handler `${error.kind}`, as `check` promises:
/// `unknown`.
#[test]
fn a_claude_step_failing_without_a_call_gives_its_handler_an_error_kind() {
    let scratch = Scratch::new();
    let out = run(
        &scratch,
        &["--no-worktree"],
        "- claude: \"Reply about ${PRODIGY_TEST_NEVER_SET}. scenario:echo\"\n  on_failure:\n    shell: 'echo \"kind=${error.kind}\" > kind.txt'\n    fail_workflow: false\n",
        &[],
    );
    let text = stderr(&out);
    let kind = std::fs::read_to_string(scratch.project().join("kind.txt")).unwrap_or_default();
    assert_eq!(kind.trim(), "kind=unknown", "{text}");
}

/// A queue file for the replay stub naming the transcripts of the next calls.
fn queue(scratch: &Scratch, names: &[&str]) -> PathBuf {
    let path = scratch.dir.path().join("replay-queue");
    let mut text = names.join("\n");
    text.push('\n');
    std::fs::write(&path, text).unwrap();
    path
}

/// The recorded usage limit, resetting a second after the call: the run pauses until then
/// (plus the margin), says so, and makes the call again; the step does not fail and is not
/// retried.
#[test]
fn a_usage_limit_pauses_the_run_and_the_call_runs_again_after_the_reset() {
    let scratch = Scratch::new();
    let queue = queue(&scratch, &["usage-limit"]);
    let out = run(
        &scratch,
        &["--no-worktree"],
        "- claude: \"Reply briefly.\"\n- shell: \"echo after\"\n",
        &[
            ("CLAUDE_REPLAY_QUEUE", queue.to_str().unwrap()),
            ("CLAUDE_REPLAY_RESETS_IN", "1"),
        ],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("paused: Claude usage limit (five_hour), resumes at "),
        "{text}"
    );
    assert!(
        text.contains("resumed: Claude usage limit (five_hour) lifted"),
        "{text}"
    );
    assert!(!text.contains("failed"), "{text}");
    assert_eq!(events_of(&scratch, "claude_started").len(), 2);
    assert_eq!(events_of(&scratch, "claude_limit_reached").len(), 1);
    assert_eq!(events_of(&scratch, "claude_limit_lifted").len(), 1);
    assert!(events_of(&scratch, "retry_scheduled").is_empty());
    assert!(events_of(&scratch, "step_failed").is_empty());
    let reached = &events_of(&scratch, "claude_limit_reached")[0];
    assert_eq!(reached["limit_type"], "five_hour");
    assert_eq!(reached["action"], "wait");
}

/// `usage_limit: stop`: the run checkpoints and exits with 75, its last line giving the
/// reset and the exact resume command, which then finishes the run.
#[test]
fn usage_limit_stop_exits_75_with_the_resume_command() {
    let scratch = Scratch::new();
    let queue = queue(&scratch, &["usage-limit"]);
    let out = run(
        &scratch,
        &["--no-worktree"],
        "claude:\n  usage_limit: stop\ncommands:\n  - claude: \"Reply briefly.\"\n  - shell: \"echo after > after.txt\"\n",
        &[
            ("CLAUDE_REPLAY_QUEUE", queue.to_str().unwrap()),
            ("CLAUDE_REPLAY_RESETS_IN", "3600"),
        ],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(75), "{text}");
    assert!(
        text.contains("stopping: Claude usage limit (five_hour) resets at "),
        "{text}"
    );
    let last = text.lines().last().unwrap();
    assert!(
        last.starts_with("paused: Claude usage limit (five_hour) resets at ")
            && last.contains(" UTC; after that, resume with: prodigy resume "),
        "{text}"
    );
    assert!(!text.contains("interrupted"), "{text}");
    assert!(!scratch.project().join("after.txt").exists());
    let id = super::resume_id(&out);
    let out = scratch.run(
        &["resume", &id],
        &[
            ("PRODIGY_CLAUDE_COMMAND", replay().as_str()),
            ("IS_SANDBOX", "1"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(scratch.project().join("after.txt").exists());
}

/// Ctrl-C while the run waits for the limit's reset stops it at once, resumably.
#[test]
fn ctrl_c_during_the_pause_exits_promptly_and_resumably() {
    let scratch = Scratch::new();
    let queue = queue(&scratch, &["usage-limit"]);
    std::fs::write(
        scratch.project().join("flow.yml"),
        "- claude: \"Reply briefly.\"\n",
    )
    .unwrap();
    scratch.commit();
    let child = scratch
        .command(
            &["run", "--no-worktree", "flow.yml"],
            &[
                ("PRODIGY_CLAUDE_COMMAND", replay().as_str()),
                ("IS_SANDBOX", "1"),
                ("CLAUDE_REPLAY_QUEUE", queue.to_str().unwrap()),
                ("CLAUDE_REPLAY_RESETS_IN", "3600"),
            ],
        )
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let out = super::interrupt_when(child, nix::sys::signal::Signal::SIGINT, |run| {
        run.wait_for("paused: Claude usage limit");
    });
    // Well before the hour the reset is away.
    assert!(started.elapsed() < std::time::Duration::from_mins(1));
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(130), "{text}");
    let id = super::resume_id(&out);
    let out = scratch.run(
        &["resume", &id],
        &[
            ("PRODIGY_CLAUDE_COMMAND", replay().as_str()),
            ("IS_SANDBOX", "1"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// The processes under PARENT, by pid (`/proc/PID/stat`'s fourth field is the parent's pid).
fn descendants(parent: u32) -> Vec<u32> {
    let mut children: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // After the command's name, which is in parentheses and may hold spaces.
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        if let Some(ppid) = rest.split(' ').nth(1).and_then(|p| p.parse().ok()) {
            children.push((pid, ppid));
        }
    }
    let mut found = vec![parent];
    let mut i = 0;
    while i < found.len() {
        let of = found[i];
        found.extend(children.iter().filter(|(_, p)| *p == of).map(|(c, _)| *c));
        i += 1;
    }
    found.split_off(1)
}

/// A secret in a prompt is never in the argument list of a process the run starts, where
/// every local user could read it (`/proc/PID/cmdline`) for as long as the call runs: the
/// prompt goes to the CLI's standard input. `-vv` and `claude_started` show the arguments,
/// and `-vv` the prompt, masked.
#[test]
fn a_secret_in_the_prompt_is_never_on_a_command_line() {
    let scratch = Scratch::new();
    let secret = "hunter2-in-argv-never";
    std::fs::write(
        scratch.project().join("flow.yml"),
        "secrets:\n  TOKEN: \"${env:SECRET_TOKEN}\"\ncommands:\n  - claude: \"/deploy using token ${TOKEN} scenario:echo\"\n    capture: answer\n  - shell: 'test \"$ANSWER\" = \"claude: /deploy using token $TOKEN scenario:echo\"'\n",
    )
    .unwrap();
    scratch.commit();
    let replay = replay();
    let mut child = scratch
        .command(
            &["run", "-vv", "--no-worktree", "flow.yml"],
            &[
                ("PRODIGY_CLAUDE_COMMAND", replay.as_str()),
                ("IS_SANDBOX", "1"),
                ("SECRET_TOKEN", secret),
                // The call lasts about a second, long enough to be seen running.
                ("CLAUDE_REPLAY_DELAY", "0.5"),
            ],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen: Vec<String> = Vec::new();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_mins(1) {
        for pid in descendants(child.id()) {
            if let Ok(line) = std::fs::read(format!("/proc/{pid}/cmdline")) {
                let line = String::from_utf8_lossy(&line).replace('\0', " ");
                if !line.trim().is_empty() && !seen.contains(&line) {
                    seen.push(line);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        seen.iter()
            .any(|l| l.contains("replay") && l.contains("stream-json")),
        "the call was never seen running: {seen:?}"
    );
    assert!(!seen.iter().any(|l| l.contains(secret)), "{seen:?}");
    assert!(!text.contains(secret), "{text}");
    assert!(
        text.contains("--dangerously-skip-permissions <<< '/deploy using token *** scenario:echo'"),
        "{text}"
    );
    let started = &events_of(&scratch, "claude_started")[0];
    assert_eq!(
        started["args"],
        serde_json::json!([
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--dangerously-skip-permissions"
        ])
    );
    // The CLI got the prompt whole, the secret's value included: the shell step compared its
    // answer with it (the log masks it).
    let finished = &events_of(&scratch, "claude_finished")[0];
    let log = std::fs::read_to_string(finished["log"].as_str().unwrap()).unwrap();
    assert!(
        log.contains("claude: /deploy using token *** scenario:echo"),
        "{log}"
    );
}

/// `stall_timeout` ends a call whose CLI stays silent that long, with its whole process
/// group, as kind `stalled`; here the stub prints its `init`, then would wait 30 s before
/// each further line.
#[test]
fn a_silent_call_is_stopped_as_stalled() {
    let scratch = Scratch::new();
    let out = run(
        &scratch,
        &["--no-worktree"],
        "claude:\n  stall_timeout: 1s\ncommands:\n  - claude: \"Reply briefly.\"\n",
        &[("CLAUDE_REPLAY_DELAY", "30")],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(
            "Claude `stalled` error: the Claude CLI reported no event for `stall_timeout`"
        ),
        "{text}"
    );
    let finished = &events_of(&scratch, "claude_finished")[0];
    assert_eq!(finished["error_kind"], "stalled", "{finished}");
    // Stopped after its first event, long before the stub's next line; the log ends with
    // prodigy's line saying how, which `prodigy logs` reads.
    let log = std::fs::read_to_string(finished["log"].as_str().unwrap()).unwrap();
    assert_eq!(log.lines().count(), 2, "{log}");
    assert_eq!(
        log.lines().last(),
        Some(r#"{"type":"prodigy_end","ended":"stalled"}"#),
        "{log}"
    );
    let runs = String::from_utf8_lossy(&scratch.run(&["logs"], &[]).stdout).into_owned();
    let session = runs.split_whitespace().next().unwrap().to_owned();
    let logs = scratch.run(&["logs", &session], &[]);
    let listed = String::from_utf8_lossy(&logs.stdout).into_owned();
    assert!(
        listed.contains("failed (stalled)"),
        "{listed}\n{}",
        stderr(&logs)
    );
    assert!(
        finished["duration_secs"].as_f64().unwrap() < 29.0,
        "{finished}"
    );
}

/// `${claude.cost_usd}` is the decimal the cost stands for, not the float noise the CLI's
/// figure carries.
#[test]
fn a_call_cost_is_rendered_as_a_decimal() {
    let scratch = Scratch::new();
    let transcript = scratch.dir.path().join("noisy.jsonl");
    let ok = std::fs::read_to_string(root().join("tests/fixtures/claude/ok.jsonl")).unwrap();
    std::fs::write(
        &transcript,
        ok.replace(
            "\"total_cost_usd\":0.00026",
            "\"total_cost_usd\":0.008100000000000001",
        ),
    )
    .unwrap();
    let out = run(
        &scratch,
        &["--no-worktree"],
        "- claude: \"Reply briefly.\"\n- shell: \"echo cost=${claude.cost_usd} > cost.txt\"\n",
        &[("CLAUDE_REPLAY", transcript.to_str().unwrap())],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let cost = std::fs::read_to_string(scratch.project().join("cost.txt")).unwrap();
    assert_eq!(cost, "cost=0.0081\n");
    assert_eq!(
        events_of(&scratch, "claude_finished")[0]["cost_usd"],
        0.0081
    );
}

/// A shell script holding a secret's value (`${TOKEN}` is spliced into its text) reaches
/// `sh` through its environment, not its argument list, and still runs as written.
#[test]
fn a_secret_in_a_shell_script_is_never_on_a_command_line() {
    let scratch = Scratch::new();
    let secret = "hunter2-in-shell-argv-never";
    std::fs::write(
        scratch.project().join("flow.yml"),
        "secrets:\n  TOKEN: \"${env:SECRET_TOKEN}\"\ncommands:\n  - shell: 'sleep 1; test \"${TOKEN}\" = \"$TOKEN\" && echo \"same $$\" > same.txt; exit 0'\n  - shell: 'test \"$(cat same.txt)\" != \"\" && test -z \"$PRODIGY_SCRIPT\"'\n",
    )
    .unwrap();
    scratch.commit();
    let mut child = scratch
        .command(
            &["run", "--no-worktree", "flow.yml"],
            &[("SECRET_TOKEN", secret)],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen: Vec<String> = Vec::new();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_mins(1) {
        for pid in descendants(child.id()) {
            if let Ok(line) = std::fs::read(format!("/proc/{pid}/cmdline")) {
                let line = String::from_utf8_lossy(&line).replace('\0', " ");
                if !line.trim().is_empty() && !seen.contains(&line) {
                    seen.push(line);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        seen.iter().any(|l| l.contains("sleep 1")),
        "the script was never seen running: {seen:?}"
    );
    assert!(!seen.iter().any(|l| l.contains(secret)), "{seen:?}");
    // `$$` and the shell's own expansions work as in `sh -c`.
    let same = std::fs::read_to_string(scratch.project().join("same.txt")).unwrap();
    assert!(same.starts_with("same "), "{same}");
}

/// `claude: {on_retry: continue}`: the retry of a call that failed (`max_turns`) resumes its
/// session (`--resume ID` of the failed call), told why it failed, in the same tree, where
/// the first attempt's edits still are; both calls are counted in the run's totals.
#[test]
fn a_continued_retry_resumes_the_failed_session_with_its_edits() {
    let scratch = Scratch::new();
    let queue = queue(&scratch, &["maxturns"]);
    let args = scratch.dir.path().join("args");
    let prompts = scratch.dir.path().join("prompts");
    // A CLI that edits the tree it runs in: the second call notes the first's edit.
    let wrapper = scratch.dir.path().join("editing-claude");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n[ \"$1\" = --version ] && exec {replay} --version\n\
             [ -f first-edit.txt ] && echo kept > kept.txt\n\
             echo edited > first-edit.txt\n\
             tee -a {prompts} | {replay} \"$@\"\n",
            replay = replay(),
            prompts = prompts.display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = run(
        &scratch,
        &["--no-worktree"],
        "- claude:\n    prompt: \"Fix it. scenario:echo\"\n    on_retry: continue\n  retry_config: {attempts: 2, initial_delay: 10ms}\n",
        &[
            ("PRODIGY_CLAUDE_COMMAND", wrapper.to_str().unwrap()),
            ("CLAUDE_REPLAY_QUEUE", queue.to_str().unwrap()),
            ("CLAUDE_REPLAY_ARGS", args.to_str().unwrap()),
        ],
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let calls: Vec<Vec<String>> = calls(&args)
        .into_iter()
        .filter(|c| c != &["--version"])
        .collect();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(!calls[0].contains(&"--resume".to_owned()), "{calls:?}");
    let failed = "5691e5c4-679a-4569-ac7e-44e7d4a68315";
    assert!(
        calls[1].windows(2).any(|w| w == ["--resume", failed]),
        "{calls:?}"
    );
    let prompts = std::fs::read_to_string(&prompts).unwrap();
    assert!(
        prompts.contains("The previous attempt at this task failed (max_turns: "),
        "{prompts}"
    );
    assert!(prompts.ends_with("\n\nFix it. scenario:echo"), "{prompts}");
    // The second call ran where the first one's edit still was.
    assert!(scratch.project().join("kept.txt").exists(), "{text}");
    let finished = &events_of(&scratch, "workflow_finished")[0];
    assert_eq!(finished["claude"]["calls"], 2, "{finished}");
    assert_eq!(finished["claude"]["failed"], 1, "{finished}");
    // The failed call's $0.00052 and the continued one's $0.00026.
    assert_eq!(finished["claude"]["cost_usd"], 0.00078, "{finished}");
}
