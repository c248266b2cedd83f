//! The Claude Code CLI as prodigy sees it: recorded transcripts, the replay stub that stands in
//! for the CLI in tests, and a contract test that runs the real, pinned CLI against a fake
//! Anthropic API and checks that what prodigy's stream parser relies on still holds.
//!
//! The transcripts in `tests/fixtures/claude/` are recorded by `tests/claude/record.sh`
//! (CONTRIBUTING.md, "Claude Code transcripts"); the runs are listed in
//! `tests/claude/scenarios.tsv`, shared by the recorder and the contract test.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test helpers fail loudly, read fixtures directly and time real processes"
)]

#[path = "../support/external.rs"]
mod external;

#[path = "../support/watch.rs"]
mod watch;

use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead as _, BufReader};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn fixtures() -> PathBuf {
    repo().join("tests/fixtures/claude")
}

fn replay_stub() -> PathBuf {
    fixtures().join("replay")
}

/// What the CLI authenticates with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Credentials {
    /// `ANTHROPIC_API_KEY=dummy`.
    ApiKey,
    /// Nothing: not logged in.
    None,
    /// `CLAUDE_CODE_OAUTH_TOKEN=dummy`: a subscription, whose usage limit the CLI reports
    /// with a `rate_limit_event`.
    OAuth,
}

impl Credentials {
    /// The variable that holds them, if any.
    fn variable(self) -> Option<&'static str> {
        match self {
            Credentials::ApiKey => Some("ANTHROPIC_API_KEY"),
            Credentials::None => None,
            Credentials::OAuth => Some("CLAUDE_CODE_OAUTH_TOKEN"),
        }
    }
}

/// One run of `tests/claude/scenarios.tsv`.
#[derive(Debug)]
struct Scenario {
    name: String,
    retries: String,
    credentials: Credentials,
    max_turns: Option<String>,
    prompt: String,
}

fn scenarios() -> Vec<Scenario> {
    let text = fs::read_to_string(repo().join("tests/claude/scenarios.tsv")).unwrap();
    let list: Vec<Scenario> = text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            assert_eq!(
                fields.len(),
                5,
                "scenarios.tsv: 5 tab-separated fields in {line:?}"
            );
            Scenario {
                name: fields[0].to_owned(),
                retries: fields[1].to_owned(),
                credentials: match fields[2] {
                    "yes" => Credentials::ApiKey,
                    "no" => Credentials::None,
                    "oauth" => Credentials::OAuth,
                    other => panic!(
                        "scenarios.tsv: the credentials are `yes`, `no` or `oauth`, not {other:?}"
                    ),
                },
                max_turns: (fields[3] != "-").then(|| fields[3].to_owned()),
                prompt: fields[4].to_owned(),
            }
        })
        .collect();
    assert!(!list.is_empty(), "scenarios.tsv lists no scenario");
    list
}

fn recorded_exit(name: &str) -> i32 {
    let text = fs::read_to_string(fixtures().join(format!("{name}.exit"))).unwrap();
    text.trim().parse().unwrap()
}

fn recorded_stderr(name: &str) -> Vec<u8> {
    fs::read(fixtures().join(format!("{name}.stderr"))).unwrap_or_default()
}

fn recorded_stream(name: &str) -> Vec<u8> {
    fs::read(fixtures().join(format!("{name}.jsonl"))).unwrap()
}

/// The replay stub with `args` and `env`, nothing of the caller's `CLAUDE_REPLAY*` inherited,
/// and an empty standard input.
fn replay(args: &[&str], env: &[(&str, &str)]) -> Output {
    replay_fed(args, "", env)
}

/// [`replay`] with PROMPT on standard input, as prodigy gives it to the CLI.
fn replay_fed(args: &[&str], prompt: &str, env: &[(&str, &str)]) -> Output {
    use std::io::Write as _;
    let mut command = Command::new(replay_stub());
    command
        .args(args)
        .env_remove("CLAUDE_REPLAY")
        .env_remove("CLAUDE_REPLAY_DELAY")
        .env_remove("CLAUDE_REPLAY_ARGS")
        .env_remove("CLAUDE_REPLAY_QUEUE")
        .env_remove("CLAUDE_REPLAY_RESETS_IN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // A stub that exits without reading its input is no failure here.
    let _ = stdin.write_all(prompt.as_bytes());
    drop(stdin);
    child.wait_with_output().unwrap()
}

fn json_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8(stdout.to_vec())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The recordings and the replay stub (no Node needed).
// ---------------------------------------------------------------------------------------------

#[test]
fn every_scenario_is_recorded_as_a_stream_that_ends_in_a_result() {
    for scenario in scenarios() {
        let name = &scenario.name;
        let events = json_lines(&recorded_stream(name));
        assert!(
            events.len() >= 2,
            "{name}: a transcript has at least init and result"
        );
        assert_eq!(events[0]["type"], "system", "{name}: first event");
        assert_eq!(events[0]["subtype"], "init", "{name}: first event");
        let last = events.last().unwrap();
        assert_eq!(last["type"], "result", "{name}: last event");
        let code = recorded_exit(name);
        assert_eq!(
            code != 0,
            last["is_error"] == true,
            "{name}: exit {code} and is_error {} disagree",
            last["is_error"]
        );
    }
}

#[test]
fn the_recorded_version_is_the_pinned_one() {
    let pinned = fs::read_to_string(repo().join("tests/claude/VERSION")).unwrap();
    let recorded = fs::read_to_string(fixtures().join("VERSION.txt")).unwrap();
    assert!(
        recorded.starts_with(&format!("{} ", pinned.trim())),
        "VERSION.txt says {recorded:?} but tests/claude/VERSION pins {pinned:?}: re-record"
    );
    let out = replay(&["--version"], &[]);
    assert!(out.status.success());
    assert_eq!(out.stdout, recorded.as_bytes());
}

#[test]
fn replay_stub_replays_every_fixture_byte_for_byte() {
    for scenario in scenarios() {
        let name = &scenario.name;
        let out = replay_fed(&["-p"], "anything", &[("CLAUDE_REPLAY", name)]);
        assert_eq!(out.stdout, recorded_stream(name), "{name}: stdout");
        assert_eq!(out.stderr, recorded_stderr(name), "{name}: stderr");
        assert_eq!(
            out.status.code(),
            Some(recorded_exit(name)),
            "{name}: exit code"
        );
    }
}

#[test]
fn replay_stub_picks_the_transcript_from_the_prompt() {
    let cases = [
        ("Reply briefly.", "ok"),
        ("Fix it scenario:429 now", "429"),
        ("scenario:ok\nthen scenario:maxturns", "maxturns"),
        ("/nosuch", "unknown-command"),
        ("/nosuch with arguments", "unknown-command"),
        ("/src/main.rs is broken", "ok"),
    ];
    for (prompt, name) in cases {
        let out = replay_fed(&["-p", "--verbose"], prompt, &[]);
        assert_eq!(
            out.stdout,
            recorded_stream(name),
            "{prompt:?} replays {name}"
        );
        assert_eq!(out.status.code(), Some(recorded_exit(name)), "{prompt:?}");
    }
    // After `--`, the last argument is the prompt, as the CLI takes it too.
    let out = replay(&["-p", "--", "Fix it scenario:429 now"], &[]);
    assert_eq!(out.stdout, recorded_stream("429"));

    // `CLAUDE_REPLAY` wins over the prompt, as a name or as a path.
    let out = replay_fed(&["-p"], "scenario:ok", &[("CLAUDE_REPLAY", "401")]);
    assert_eq!(out.stdout, recorded_stream("401"));
    assert_eq!(out.status.code(), Some(recorded_exit("401")));
    let path = fixtures().join("tool.jsonl");
    let out = replay_fed(
        &["-p"],
        "scenario:ok",
        &[("CLAUDE_REPLAY", path.to_str().unwrap())],
    );
    assert_eq!(out.stdout, recorded_stream("tool"));
}

#[test]
fn replay_stub_says_which_transcript_is_missing() {
    let out = replay_fed(&["-p"], "scenario:nosuchscenario", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("no transcript at") && stderr.contains("nosuchscenario.jsonl"),
        "{stderr}"
    );
}

#[test]
fn replay_stub_echo_sends_back_the_prompt_as_valid_json() {
    let prompt = "Say \"hi\" to C:\\temp\\ and \\n stays\nsecond line\twith a tab é scenario:echo";
    let out = replay_fed(&["-p", "--output-format", "stream-json"], prompt, &[]);
    assert!(out.status.success(), "{out:?}");
    let events = json_lines(&out.stdout);
    let kinds: Vec<(Value, Value)> = events
        .iter()
        .map(|e| (e["type"].clone(), e["subtype"].clone()))
        .collect();
    let ok_kinds: Vec<(Value, Value)> = json_lines(&recorded_stream("ok"))
        .iter()
        .map(|e| (e["type"].clone(), e["subtype"].clone()))
        .collect();
    assert_eq!(kinds, ok_kinds, "an `ok`-shaped stream");
    let expected = format!("claude: {prompt}");
    let assistant = events.iter().find(|e| e["type"] == "assistant").unwrap();
    assert_eq!(
        assistant["message"]["content"][0]["text"],
        expected.as_str()
    );
    let result = events.last().unwrap();
    assert_eq!(result["result"], expected.as_str());
    assert_eq!(result["is_error"], false);
}

#[test]
fn replay_stub_appends_each_argument_list_to_claude_replay_args() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("args");
    let log_str = log.to_str().unwrap();
    let env = [("CLAUDE_REPLAY_ARGS", log_str)];
    replay(&["--version"], &env);
    let out = replay_fed(&["-p", "--max-turns", "2"], "a prompt", &env);
    assert!(out.status.success());
    let out = replay(&["-p", "--", "two words\nand a line"], &env);
    assert!(out.status.success());
    assert_eq!(
        fs::read_to_string(&log).unwrap(),
        "--version\n\n-p\n--max-turns\n2\n\n-p\n--\ntwo words\nand a line\n\n"
    );
}

/// A queue names the transcripts of the next calls, in order, before the prompt does; a
/// usage limit's reset can be moved to a few seconds from now.
#[test]
fn replay_stub_takes_queued_transcripts_and_moves_the_reset() {
    let dir = tempfile::tempdir().unwrap();
    let queue = dir.path().join("queue");
    fs::write(&queue, "usage-limit\n401\n").unwrap();
    let queue_str = queue.to_str().unwrap();
    let env = [
        ("CLAUDE_REPLAY_QUEUE", queue_str),
        ("CLAUDE_REPLAY_RESETS_IN", "60"),
    ];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let out = replay(&["x scenario:ok"], &env);
    assert_eq!(out.status.code(), Some(recorded_exit("usage-limit")));
    let events = json_lines(&out.stdout);
    let limit = events
        .iter()
        .find(|e| e["type"] == "rate_limit_event")
        .unwrap();
    let resets = limit["rate_limit_info"]["resetsAt"].as_u64().unwrap();
    assert!((now + 59..=now + 62).contains(&resets), "{resets} vs {now}");
    assert_eq!(replay(&["x scenario:ok"], &env).status.code(), Some(1));
    // The queue is empty: the prompt decides again.
    assert_eq!(fs::read_to_string(&queue).unwrap(), "");
    assert_eq!(
        replay(&["x scenario:ok"], &env).stdout,
        recorded_stream("ok")
    );
}

#[test]
fn replay_stub_waits_between_lines_when_asked() {
    let started = Instant::now();
    let out = replay_fed(&["-p"], "scenario:tool", &[("CLAUDE_REPLAY_DELAY", "0.1")]);
    let elapsed = started.elapsed();
    assert_eq!(
        out.stdout,
        recorded_stream("tool"),
        "the same bytes, only slower"
    );
    let gaps = json_lines(&out.stdout).len() - 1;
    let gaps = u32::try_from(gaps).unwrap();
    assert!(
        elapsed >= Duration::from_millis(100) * gaps,
        "{gaps} pauses of 0.1 s took only {elapsed:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The contract: the real CLI against the fake API, compared with the recordings.
// ---------------------------------------------------------------------------------------------

const TEST: &str = "claude::real_cli_matches_the_recordings";
/// Installing the CLI: a download of some 80 MB.
const INSTALL_TIMEOUT: Duration = Duration::from_mins(10);
/// One CLI run; the slowest scenario (two retries) takes a few seconds.
const RUN_TIMEOUT: Duration = Duration::from_mins(2);

/// What prodigy's parser relies on in one stream: each event's `type` and `subtype`, the
/// assistant's `error`, the retries' status, and the result's outcome.
fn contract(stream: &[u8], exit: Option<i32>) -> Vec<String> {
    let mut facts = Vec::new();
    for (index, line) in String::from_utf8_lossy(stream).lines().enumerate() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            facts.push(format!("line {}: not JSON: {line}", index + 1));
            continue;
        };
        let mut fact = format!("{} {}", event["type"], event["subtype"]);
        let fields: &[&str] = match event["type"].as_str() {
            Some("assistant") => &["error"],
            Some("system") if event["subtype"] == "api_retry" => {
                &["attempt", "max_retries", "error_status", "error"]
            }
            Some("result") => &["is_error", "api_error_status", "num_turns"],
            _ => &[],
        };
        for field in fields {
            let _ = write!(fact, " {field}={}", event[*field]);
        }
        // A subscription's usage limit: what the gate reads (the reset's time changes).
        if event["type"] == "rate_limit_event" {
            let info = &event["rate_limit_info"];
            let _ = write!(
                fact,
                " status={} rateLimitType={} resetsAt is a number: {}",
                info["status"],
                info["rateLimitType"],
                info["resetsAt"].is_u64()
            );
        }
        facts.push(fact);
    }
    facts.push(format!("exit {exit:?}"));
    facts
}

/// Kills the process group it leads when dropped, on every path out of the test.
struct Guard {
    child: Child,
}

impl Drop for Guard {
    fn drop(&mut self) {
        kill_group(&mut self.child);
    }
}

fn kill_group(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Waits for `child` at most `limit`; past it, kills its process group and returns `None`.
fn wait_bounded(child: Child, limit: Duration) -> Option<ExitStatus> {
    let mut guard = Guard { child };
    // Past the limit, the guard kills the group.
    watch::exited_within(&mut guard.child, limit)
}

#[test]
fn a_run_past_its_time_is_killed_with_its_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let child = Command::new("sh")
        .arg("-c")
        .arg(r#"sleep 30 & echo $! > "$1"; wait"#)
        .arg("sh")
        .arg(&pid_file)
        .process_group(0)
        .spawn()
        .unwrap();
    watch::until_changed(dir.path(), "the shell", || {
        fs::read_to_string(&pid_file).is_ok_and(|text| text.ends_with('\n'))
    });
    assert_eq!(wait_bounded(child, Duration::from_millis(200)), None);
    let grandchild: i32 = fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Gone, or a zombie waiting for its new parent to reap it: its pidfd tells either.
    assert!(
        watch::gone_within(&[grandchild], Duration::from_secs(10)).is_empty(),
        "the background `sleep` {grandchild} outlived its killed group"
    );
}

/// Installs the pinned CLI (`tests/claude/install.sh`) and returns its path, or `None` after
/// a skip line. A missing Node fails under CI; an unreachable registry skips.
fn install_cli(scratch: &Path) -> Option<PathBuf> {
    // Two tests installing into the same directory at once break each other's install.
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = INSTALLING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (program, package) in [("node", "nodejs"), ("npm", "npm")] {
        if !external::tool_available(TEST, program, package) {
            return None;
        }
    }
    let out_path = scratch.join("install.out");
    let err_path = scratch.join("install.err");
    let child = Command::new("sh")
        .arg(repo().join("tests/claude/install.sh"))
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out_path).unwrap())
        .stderr(fs::File::create(&err_path).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let status = wait_bounded(child, INSTALL_TIMEOUT);
    let stderr = fs::read_to_string(&err_path).unwrap_or_default();
    match status.and_then(|s| s.code()) {
        Some(0) => Some(PathBuf::from(fs::read_to_string(&out_path).unwrap().trim())),
        Some(3) => {
            external::missing_tool(TEST, "npm", "npm");
            None
        }
        Some(4) if external::ci::required() => {
            panic!("under CI the pinned Claude Code CLI must install: {stderr}")
        }
        Some(4) => {
            external::skip_line(
                TEST,
                &format!(
                    "npm could not install the pinned Claude Code CLI (is the registry \
                     reachable?), skipped: {}",
                    stderr.trim()
                ),
            );
            None
        }
        other => panic!("tests/claude/install.sh ended with {other:?}: {stderr}"),
    }
}

/// Starts `tests/claude/fake-api.mjs` on loopback and returns it with its port.
fn start_fake_api(scratch: &Path) -> (Guard, u16) {
    let mut child = Command::new("node")
        .arg(repo().join("tests/claude/fake-api.mjs"))
        .arg("--log")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(fs::File::create(scratch.join("fake-api.log")).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let guard = Guard { child };
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = send.send(line);
    });
    let line = receive
        .recv_timeout(Duration::from_secs(20))
        .expect("the fake API did not say `listening PORT` within 20 s");
    let port = line
        .trim()
        .strip_prefix("listening ")
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("the fake API's first line is {line:?}"));
    (guard, port)
}

/// Runs the CLI once for `scenario`, as `tests/claude/record.sh` does.
fn run_cli(
    claude: &Path,
    port: u16,
    scenario: &Scenario,
    scratch: &Path,
) -> (Vec<u8>, String, Option<i32>) {
    let home = scratch.join(&scenario.name).join("home");
    let project = home.join("project");
    fs::create_dir_all(&project).unwrap();
    let mut command = Command::new(claude);
    command.args([
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--dangerously-skip-permissions",
    ]);
    if let Some(turns) = &scenario.max_turns {
        command.args(["--max-turns", turns]);
    }
    for (key, _) in std::env::vars_os() {
        let key_str = key.to_string_lossy();
        if key_str.starts_with("ANTHROPIC_") || key_str.starts_with("CLAUDE_") {
            command.env_remove(&key);
        }
    }
    command
        .env("HOME", &home)
        .env("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{port}"))
        .env("IS_SANDBOX", "1")
        .env("CLAUDE_CODE_MAX_RETRIES", &scenario.retries)
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1");
    if let Some(variable) = scenario.credentials.variable() {
        command.env(variable, "dummy");
    }
    let out_path = scratch.join(format!("{}.out", scenario.name));
    let err_path = scratch.join(format!("{}.err", scenario.name));
    // The prompt on standard input, as prodigy gives it.
    let prompt = scratch.join(format!("{}.prompt", scenario.name));
    fs::write(&prompt, &scenario.prompt).unwrap();
    let child = command
        .current_dir(&project)
        .stdin(fs::File::open(&prompt).unwrap())
        .stdout(fs::File::create(&out_path).unwrap())
        .stderr(fs::File::create(&err_path).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let status = wait_bounded(child, RUN_TIMEOUT);
    let stdout = fs::read(&out_path).unwrap();
    let mut stderr = fs::read_to_string(&err_path).unwrap();
    let code = if let Some(status) = status {
        status.code()
    } else {
        let _ = write!(stderr, "\n(killed after {RUN_TIMEOUT:?})");
        None
    };
    (stdout, stderr, code)
}

/// One HTTP/1.1 request to the fake API; the status code and the body.
fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    let (status, _, body) = http_with_head(port, method, path, body);
    (status, body)
}

/// [`http`], with the response's head (status line and headers, lowercased) too.
fn http_with_head(port: u16, method: &str, path: &str, body: &str) -> (u16, String, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_lowercase(), body.to_owned())
}

#[test]
fn fake_api_answers_every_kind_of_request() {
    const TEST: &str = "claude::fake_api_answers_every_kind_of_request";
    if !external::tool_available(TEST, "node", "nodejs") {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let (_server, port) = start_fake_api(scratch.path());
    let tools = r#""tools":[{"name":"Bash","input_schema":{"type":"object"}}]"#;
    let ask = |prompt: &str, stream: bool| {
        format!(
            r#"{{"model":"m","max_tokens":9,"stream":{stream},{tools},"messages":[{{"role":"user","content":[{{"type":"text","text":"{prompt}"}}]}}]}}"#
        )
    };

    // Not streamed: one message.
    let (status, body) = http(port, "POST", "/v1/messages?beta=true", &ask("hi", false));
    assert_eq!(status, 200, "{body}");
    let message: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(message["type"], "message");
    assert_eq!(message["content"][0]["type"], "text");
    assert_eq!(message["stop_reason"], "end_turn");

    // Streamed: server-sent events in the Messages API's order, with a tool call.
    let (status, body) = http(port, "POST", "/v1/messages", &ask("go scenario:tool", true));
    assert_eq!(status, 200, "{body}");
    let events: Vec<&str> = body
        .lines()
        .filter_map(|line| line.strip_prefix("event: "))
        .collect();
    assert_eq!(events.first().copied(), Some("message_start"), "{events:?}");
    assert_eq!(events.last().copied(), Some("message_stop"), "{events:?}");
    assert!(body.contains(r#""type":"tool_use""#), "{body}");
    assert!(body.contains(r#""stop_reason":"tool_use""#), "{body}");

    // Errors: the status and the Anthropic error body with its type.
    for (scenario, code, kind) in [
        ("401", 401, "authentication_error"),
        ("429", 429, "rate_limit_error"),
        ("500", 500, "api_error"),
        ("529", 529, "overloaded_error"),
    ] {
        let prompt = format!("x scenario:{scenario}");
        let (status, body) = http(port, "POST", "/v1/messages", &ask(&prompt, true));
        assert_eq!(status, code, "{body}");
        let error: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(error["type"], "error");
        assert_eq!(error["error"]["type"], kind);
    }

    // A subscription's usage limit: 429 with the unified rate-limit headers until the reset,
    // the same reset for every request of the scenario; then the ordinary answer.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let limited = ask("x scenario:usage-limit-1", true);
    let (status, head, body) = http_with_head(port, "POST", "/v1/messages", &limited);
    assert_eq!(status, 429, "{body}");
    let header = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .map_or_else(|| panic!("no `{name}` in {head}"), str::to_owned)
    };
    assert_eq!(header("anthropic-ratelimit-unified-status"), "rejected");
    assert_eq!(
        header("anthropic-ratelimit-unified-representative-claim"),
        "five_hour"
    );
    let reset: u64 = header("anthropic-ratelimit-unified-reset").parse().unwrap();
    assert!((now..=now + 2).contains(&reset), "{reset} vs {now}");
    assert!(header("retry-after").parse::<u64>().unwrap() <= 1);
    std::thread::sleep(Duration::from_millis(2100));
    let (status, body) = http(port, "POST", "/v1/messages", &limited);
    assert_eq!(status, 200, "after the reset: {body}");

    // A storm: the status for its seconds, with `retry-after`, then the ordinary answer.
    let storm = ask("x scenario:storm-529-1", true);
    let (status, head, _) = http_with_head(port, "POST", "/v1/messages", &storm);
    assert_eq!(status, 529);
    assert!(head.contains("retry-after: 1"), "{head}");
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(http(port, "POST", "/v1/messages", &storm).0, 200);

    // A side request offers no tools: a short text, whatever the prompt's scenario.
    let side = r#"{"model":"small","max_tokens":9,"messages":[{"role":"user","content":"title for: scenario:401"}]}"#;
    let (status, body) = http(port, "POST", "/v1/messages", side);
    assert_eq!(status, 200, "{body}");
    let message: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(message["content"][0]["type"], "text", "{body}");

    // Everything else is answered harmlessly.
    let (status, body) = http(port, "POST", "/v1/messages/count_tokens", "{}");
    assert_eq!((status, body.contains("input_tokens")), (200, true));
    assert_eq!(http(port, "GET", "/api/hello", "").0, 200);
    assert_eq!(http(port, "POST", "/api/event_logging/batch", "{}").0, 200);
}

#[test]
fn real_cli_matches_the_recordings() {
    let scratch = tempfile::tempdir().unwrap();
    let Some(claude) = install_cli(scratch.path()) else {
        return;
    };
    let (_server, port) = start_fake_api(scratch.path());
    let mut report = String::new();
    for scenario in scenarios() {
        let (stdout, stderr, code) = run_cli(&claude, port, &scenario, scratch.path());
        let expected = contract(
            &recorded_stream(&scenario.name),
            Some(recorded_exit(&scenario.name)),
        );
        let actual = contract(&stdout, code);
        if expected != actual {
            let _ = writeln!(
                report,
                "== {}: recorded\n  {}\nnow\n  {}\nstderr: {}",
                scenario.name,
                expected.join("\n  "),
                actual.join("\n  "),
                stderr.trim()
            );
        }
    }
    let log = fs::read_to_string(scratch.path().join("fake-api.log")).unwrap_or_default();
    assert!(
        report.is_empty(),
        "the Claude Code CLI no longer behaves as recorded in tests/fixtures/claude \
         (re-record with tests/claude/record.sh and check prodigy's parser):\n{report}\
         \nrequests the fake API saw:\n{log}"
    );
}

/// Runs prodigy with ARGS in PROJECT against the real CLI and the fake API on PORT, with an
/// API key.
fn prodigy(claude: &Path, port: u16, project: &Path, home: &Path, args: &[&str]) -> Output {
    prodigy_as(Credentials::ApiKey, claude, port, project, home, args)
}

/// [`prodigy`], the CLI authenticating with CREDENTIALS.
fn prodigy_as(
    credentials: Credentials,
    claude: &Path,
    port: u16,
    project: &Path,
    home: &Path,
    args: &[&str],
) -> Output {
    prodigy_with(credentials, Some("0"), claude, port, project, home, args)
}

/// [`prodigy_as`], with `CLAUDE_CODE_MAX_RETRIES` set to RETRIES in prodigy's environment, or
/// not set at all.
fn prodigy_with(
    credentials: Credentials,
    retries: Option<&str>,
    claude: &Path,
    port: u16,
    project: &Path,
    home: &Path,
    args: &[&str],
) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_prodigy"));
    for (key, _) in std::env::vars_os() {
        let key_str = key.to_string_lossy();
        if key_str.starts_with("ANTHROPIC_") || key_str.starts_with("CLAUDE_") {
            command.env_remove(&key);
        }
    }
    let child = command
        .args(args)
        .current_dir(project)
        .env("HOME", home)
        .env("PRODIGY_HOME", home.join("prodigy"))
        .env("PRODIGY_CLAUDE_COMMAND", claude)
        .env("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{port}"))
        .envs(credentials.variable().map(|v| (v, "dummy")))
        .env("IS_SANDBOX", "1")
        .envs(retries.map(|r| ("CLAUDE_CODE_MAX_RETRIES", r)))
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("GIT_AUTHOR_NAME", "test")
        .env("GIT_AUTHOR_EMAIL", "test@example.invalid")
        .env("GIT_COMMITTER_NAME", "test")
        .env("GIT_COMMITTER_EMAIL", "test@example.invalid")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Every file under DIR.
/// Every event a run under HOME (its `PRODIGY_HOME` is `HOME/prodigy`) recorded, file by file.
fn events_under(home: &Path) -> Vec<Value> {
    files_under(&home.join("prodigy/events"))
        .iter()
        .flat_map(|f| {
            fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The whole path a user takes, with the real CLI: a tool call's final text is captured, a
/// 529 is classified and retried by `retry_on: [overloaded]`, an unknown slash command fails
/// though the CLI exits 0, and a map item whose key is refused goes to the DLQ as an
/// `authentication` failure with its log, without a retry.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "a test: one scenario read top to bottom"
)]
fn prodigy_runs_the_real_cli_end_to_end() {
    let scratch = tempfile::tempdir().unwrap();
    let Some(claude) = install_cli(scratch.path()) else {
        return;
    };
    let (_server, port) = start_fake_api(scratch.path());
    let home = scratch.path().join("home");
    let project = scratch.path().join("project");
    fs::create_dir_all(&home).unwrap();
    fs::create_dir_all(&project).unwrap();
    fs::write(
        project.join("flow.yml"),
        r#"- claude: "Run a tool. scenario:tool"
  capture: answer
- shell: 'printf "%s\n" "$ANSWER" > answer.txt'
- claude: "Reply. scenario:529"
  retry_config:
    attempts: 2
    retry_on: [overloaded]
  on_failure:
    shell: "echo handled"
    fail_workflow: false
- claude: "/nosuch"
"#,
    )
    .unwrap();
    let out = prodigy(
        &claude,
        port,
        &project,
        &home,
        &["run", "-v", "--no-worktree", "flow.yml"],
    );
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("→ Bash: echo tool-ran"), "{text}");
    assert_eq!(
        fs::read_to_string(project.join("answer.txt"))
            .unwrap()
            .trim(),
        "The tool ran."
    );
    assert!(text.contains("retrying in"), "529 is retried: {text}");
    assert!(text.contains("Claude `overloaded` error"), "{text}");
    assert!(
        text.contains("failed: /nosuch: Claude `invalid_request` error: Unknown command: /nosuch"),
        "{text}"
    );
    assert!(
        text.contains("4 Claude calls (3 failed), 4 turns"),
        "{text}"
    );

    // A map job in a git repository: one item succeeds, one is refused.
    for args in [
        &["init", "-q", "."][..],
        &["add", "."][..],
        &["commit", "-qm", "init"][..],
    ] {
        let status = Command::new("git")
            .args(args)
            .current_dir(&project)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .status()
            .unwrap();
        assert!(status.success());
    }
    fs::write(
        project.join("job.yml"),
        r#"name: real-claude
mode: mapreduce
map:
  input: "printf '%s' '[{\"s\": \"ok\"}, {\"s\": \"401\"}]'"
  json_path: "$[*]"
  agent_template:
    - claude: "Reply briefly. scenario:${item.s}"
      retry_config:
        attempts: 3
  max_parallel: 2
"#,
    )
    .unwrap();
    let out = prodigy(&claude, port, &project, &home, &["run", "-y", "job.yml"]);
    let text = String::from_utf8_lossy(&out.stderr);
    // The job completes; the refused item waits in the DLQ.
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("errors: 1 ClaudeFailed"), "{text}");
    let dlq: Vec<Value> = files_under(&home.join("prodigy/dlq"))
        .iter()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("items")))
        .map(|p| serde_json::from_str(&fs::read_to_string(p).unwrap()).unwrap())
        .collect();
    assert_eq!(dlq.len(), 1, "{text}");
    let failure = &dlq[0]["failure_history"][0];
    assert_eq!(
        failure["error_type"],
        serde_json::json!({"ClaudeFailed": {"kind": "authentication"}}),
        "{failure}"
    );
    assert!(
        failure["error_message"]
            .as_str()
            .unwrap()
            .contains("Invalid API key"),
        "{failure}"
    );
    let log = PathBuf::from(failure["json_log_location"].as_str().unwrap());
    assert!(
        fs::read_to_string(&log)
            .unwrap()
            .contains("authentication_failed"),
        "{}",
        log.display()
    );
    // Authentication failures are not retried unless `retry_on` names them.
    let requests = fs::read_to_string(scratch.path().join("fake-api.log")).unwrap_or_default();
    assert_eq!(
        requests.matches("-> 401").count(),
        1,
        "one call for the refused item: {requests}"
    );
}

/// A subscription at its usage limit, with the real CLI: the fake API refuses every request
/// with the unified rate-limit headers until the limit resets a few seconds later; the job
/// pauses its Claude calls until then, runs them again, and ends with every item done and
/// nothing in the DLQ, though its error policy sends the first failure there.
#[test]
fn prodigy_pauses_at_the_usage_limit_with_the_real_cli() {
    let scratch = tempfile::tempdir().unwrap();
    let Some(claude) = install_cli(scratch.path()) else {
        return;
    };
    let (_server, port) = start_fake_api(scratch.path());
    let home = scratch.path().join("home");
    let project = scratch.path().join("project");
    fs::create_dir_all(&home).unwrap();
    fs::create_dir_all(&project).unwrap();
    fs::write(project.join("items.json"), r#"["a", "b"]"#).unwrap();
    fs::write(
        project.join("job.yml"),
        r#"name: limited
mode: mapreduce
map:
  input: items.json
  json_path: "$[*]"
  max_parallel: 2
  agent_template:
    - claude: "Reply briefly about ${item}. scenario:usage-limit-3"
error_policy:
  on_item_failure: dlq
  max_failures: 1
"#,
    )
    .unwrap();
    let out = prodigy_as(
        Credentials::OAuth,
        &claude,
        port,
        &project,
        &home,
        &["run", "--no-worktree", "job.yml"],
    );
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("paused: Claude usage limit (five_hour), resumes at"),
        "{text}"
    );
    assert!(
        text.contains("resumed: Claude usage limit (five_hour) lifted"),
        "{text}"
    );
    assert!(text.contains("2 succeeded, 0 failed"), "{text}");
    assert!(!text.contains("dead letter queue"), "{text}");
    let events = events_under(&home);
    let count = |kind: &str| events.iter().filter(|e| e["event_type"] == kind).count();
    assert!(count("claude_limit_reached") >= 1, "{events:?}");
    assert!(count("claude_limit_lifted") >= 1, "{events:?}");
    assert_eq!(count("agent_failed"), 0, "{events:?}");
    assert_eq!(count("dlq_item_added"), 0, "{events:?}");
}

/// A 429 storm of a few seconds, with the real CLI and no retries of its own: the governor
/// narrows the job's Claude calls, `patience` makes the refused calls again after its
/// back-off, and the job ends with every item done and nothing in the DLQ.
#[test]
fn prodigy_rides_out_a_rate_limit_storm_with_the_real_cli() {
    let scratch = tempfile::tempdir().unwrap();
    let Some(claude) = install_cli(scratch.path()) else {
        return;
    };
    let (_server, port) = start_fake_api(scratch.path());
    let home = scratch.path().join("home");
    let project = scratch.path().join("project");
    fs::create_dir_all(&home).unwrap();
    fs::create_dir_all(&project).unwrap();
    fs::write(project.join("items.json"), r#"["a", "b"]"#).unwrap();
    fs::write(
        project.join("job.yml"),
        r#"name: storm
mode: mapreduce
claude:
  patience: 2m
map:
  input: items.json
  json_path: "$[*]"
  max_parallel: 2
  agent_template:
    - claude: "Reply briefly about ${item}. scenario:storm-429-3"
error_policy:
  on_item_failure: dlq
  max_failures: 1
"#,
    )
    .unwrap();
    let out = prodigy(
        &claude,
        port,
        &project,
        &home,
        &["run", "-v", "--no-worktree", "job.yml"],
    );
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("2 succeeded, 0 failed"), "{text}");
    let events = events_under(&home);
    let count = |kind: &str| events.iter().filter(|e| e["event_type"] == kind).count();
    assert!(count("claude_slots_changed") >= 1, "{events:?}");
    assert!(count("claude_call_repeated") >= 1, "{events:?}");
    assert_eq!(count("dlq_item_added"), 0, "{events:?}");
}

/// With the real CLI and no `CLAUDE_CODE_MAX_RETRIES` of the user's, a call through a storm
/// makes one request and prodigy's two retries, not the CLI's own ten, so that the run's
/// governor does the waiting; a step that sets the variable in its `env` keeps its own.
#[test]
fn prodigy_gives_the_real_cli_a_small_retry_budget_of_its_own() {
    let scratch = tempfile::tempdir().unwrap();
    let Some(claude) = install_cli(scratch.path()) else {
        return;
    };
    let (_server, port) = start_fake_api(scratch.path());
    let home = scratch.path().join("home");
    let project = scratch.path().join("project");
    fs::create_dir_all(&home).unwrap();
    fs::create_dir_all(&project).unwrap();
    fs::write(
        project.join("wf.yml"),
        r#"- claude: "Reply briefly. scenario:storm-429-120"
  on_failure: true
- claude: "Reply briefly. scenario:storm-529-120"
  env:
    CLAUDE_CODE_MAX_RETRIES: "0"
  on_failure: true
"#,
    )
    .unwrap();
    let out = prodigy_with(
        Credentials::ApiKey,
        None,
        &claude,
        port,
        &project,
        &home,
        &["run", "--no-worktree", "wf.yml"],
    );
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let requests = fs::read_to_string(scratch.path().join("fake-api.log")).unwrap_or_default();
    assert_eq!(requests.matches("-> 429").count(), 3, "{requests}");
    assert_eq!(requests.matches("-> 529").count(), 1, "{requests}");
    let retries: Vec<Value> = events_under(&home)
        .into_iter()
        .filter(|e| e["event_type"] == "claude_finished")
        .map(|e| e["api_retries"].clone())
        .collect();
    assert_eq!(retries, [2, 0], "{text}");
}

/// With the real CLI, an API that takes a request and never answers is found by
/// `stall_timeout` (kind `stalled`, a few seconds, not the CLI's own ten-minute timeout),
/// and a stream cut in the middle of a reply is kind `network`.
#[test]
fn a_stuck_api_is_a_stalled_call_and_a_cut_stream_a_network_failure_with_the_real_cli() {
    let scratch = tempfile::tempdir().unwrap();
    let Some(claude) = install_cli(scratch.path()) else {
        return;
    };
    let (_server, port) = start_fake_api(scratch.path());
    let home = scratch.path().join("home");
    let project = scratch.path().join("project");
    fs::create_dir_all(&home).unwrap();
    fs::create_dir_all(&project).unwrap();
    fs::write(
        project.join("wf.yml"),
        "claude:\n  stall_timeout: 3s\ncommands:\n  - claude: \"Reply briefly. scenario:hang\"\n    on_failure: true\n  - claude: \"Reply briefly. scenario:cut\"\n    on_failure: true\n",
    )
    .unwrap();
    let started = std::time::Instant::now();
    let out = prodigy(
        &claude,
        port,
        &project,
        &home,
        &["run", "--no-worktree", "wf.yml"],
    );
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    // Bounded by the stall timeout, far below the CLI's own request timeout.
    assert!(started.elapsed() < Duration::from_mins(2), "{text}");
    let finished: Vec<Value> = events_under(&home)
        .into_iter()
        .filter(|e| e["event_type"] == "claude_finished")
        .collect();
    let kinds: Vec<&Value> = finished.iter().map(|e| &e["error_kind"]).collect();
    assert_eq!(kinds, ["stalled", "network"], "{finished:?}");
}
