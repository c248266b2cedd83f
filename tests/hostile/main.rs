//! Hostile input: workflows far larger or deeper than anyone writes, generated here, must get
//! a diagnostic or a clean result from `prodigy check`, never a crash. No test measures time;
//! each input is one that used to overflow the stack, panic or take seconds.

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers fail loudly"
)]

#[path = "../support/external.rs"]
mod external;

use std::fmt::Write as _;
use std::path::PathBuf;

use assert_cmd::Command;

/// Writes a workflow into a scratch directory and runs `prodigy check` on it.
struct Hostile {
    dir: tempfile::TempDir,
    path: PathBuf,
}

impl Hostile {
    fn new(text: &str) -> Hostile {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hostile.yml");
        std::fs::write(&path, text).unwrap();
        Hostile { dir, path }
    }

    /// Runs `prodigy ARGS hostile.yml`; returns the exit code, stdout and stderr.
    fn run(&self, args: &[&str]) -> (i32, String, String) {
        let output = Command::cargo_bin("prodigy")
            .unwrap()
            .current_dir(self.dir.path())
            .env("NO_COLOR", "1")
            // ShellCheck's findings are kept here, not in the user's cache.
            .env("XDG_CACHE_HOME", self.dir.path().join("cache"))
            .args(args)
            .arg(&self.path)
            .output()
            .unwrap();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// `check --format json`: the exit code and the diagnostics' codes.
    fn codes(&self) -> (i32, Vec<String>) {
        // ShellCheck is not what these inputs attack, and would take minutes on them.
        let (code, stdout, stderr) = self.run(&["check", "--no-shellcheck", "--format", "json"]);
        let json: serde_json::Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("no JSON ({e}); exit {code}, stderr:\n{stderr}"));
        let codes = json["diagnostics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["code"].as_str().unwrap().to_owned())
            .collect();
        (code, codes)
    }
}

fn steps(count: usize) -> String {
    let mut text = String::new();
    for i in 0..count {
        writeln!(text, "- shell: \"echo {i}\"").unwrap();
    }
    text
}

/// 60,000 steps overflowed the stack in the graph's cycle check (recursive, one frame per
/// step).
#[test]
fn sixty_thousand_steps_check_and_draw() {
    let file = Hostile::new(&steps(60_000));
    assert_eq!(file.codes(), (0, Vec::new()));
    let (code, stdout, stderr) = file.run(&["graph", "--format", "json"]);
    assert_eq!(code, 0, "{stderr}");
    let graph: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(graph["nodes"].as_array().unwrap().len() > 60_000);
}

/// A `when:` of 160,000 `!` or `||` terms overflowed the stack: once while the refused tree
/// was dropped, and before the depth limit applied.
#[test]
fn huge_conditions_are_refused_with_p105() {
    for condition in [
        format!("{}true", "!".repeat(160_000)),
        vec!["a"; 160_000].join(" || "),
        vec!["a"; 160_000].join(" && "),
    ] {
        let file = Hostile::new(&format!(
            "env:\n  a: \"1\"\ncommands:\n  - shell: \"true\"\n    when: \"{condition}\"\n"
        ));
        assert_eq!(file.codes(), (1, vec!["P105".to_owned()]));
        let (code, report, _) = file.run(&["check"]);
        assert_eq!(code, 1);
        assert!(report.contains("more than 256 levels"), "{report}");
    }
}

/// A diagnostic past column 65,535 panicked the human renderer; the line is clipped around
/// the label, which keeps its real line and column.
#[test]
fn a_diagnostic_far_along_a_line_renders() {
    let file = Hostile::new(&format!(
        "- {{shell: \"{}\", bogus: 1}}\n",
        "x".repeat(100_000)
    ));
    let (code, report, stderr) = file.run(&["check"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(report.contains("hostile.yml:1:100015]"), "{report}");
    assert!(report.contains("unknown key `bogus` in a step"), "{report}");
    assert!(report.contains("…xxx"), "{report}");
    assert!(report.len() < 4_000, "{} bytes", report.len());
}

/// 16,000 `${a}` in one command took seconds: each reference was placed in the file by a
/// scan from the start of the string.
#[test]
fn sixteen_thousand_references_in_one_string() {
    let refs = "${a}".repeat(16_000);
    let defined = Hostile::new(&format!(
        "env:\n  a: x\ncommands:\n  - shell: \"echo {refs}\"\n"
    ));
    assert_eq!(defined.codes(), (0, Vec::new()));
    let undefined = Hostile::new(&format!("- shell: \"echo {refs}\"\n"));
    let (code, codes) = undefined.codes();
    assert_eq!((code, codes.len()), (0, 16_000));
    assert!(codes.iter().all(|c| c == "W005"));
    let (code, report, stderr) = undefined.run(&["check", "--no-shellcheck"]);
    assert_eq!(code, 0);
    // Each warning shows its place on the 64 kB line clipped, not the whole line (1 GB in all).
    assert!(report.len() < 20_000_000, "{} bytes", report.len());
    assert!(
        stderr.contains("checked 1 file: 16000 warnings"),
        "{}",
        &stderr[stderr.len().saturating_sub(300)..]
    );
}

/// ShellCheck takes about 15 ms a script: a file of more shell commands than `check` hands
/// it is checked without it, and the user is told, instead of waiting for minutes.
#[test]
fn a_file_of_many_shell_commands_is_checked_without_shellcheck_and_says_so() {
    // Distinct commands: ShellCheck checks each script text once.
    let mut steps = String::new();
    for i in 0..2_001 {
        std::fmt::Write::write_fmt(&mut steps, format_args!("- shell: \"echo step {i}\"\n"))
            .unwrap();
    }
    let file = Hostile::new(&steps);
    if !external::tool_available(
        "a_file_of_many_shell_commands_is_checked_without_shellcheck_and_says_so",
        "shellcheck",
        "shellcheck",
    ) {
        return;
    }
    let (code, _, stderr) = file.run(&["check"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("it has 2001 shell commands, more than the 2000"),
        "{stderr}"
    );
}

/// Paths that climb out of the project, as written, and item data spliced inside single
/// quotes, thousands of times over: each is reported (V109, V108, W006), in bounded time.
#[test]
fn escaping_paths_and_single_quoted_splices_are_reported() {
    let climb = "../".repeat(20_000);
    let file = Hostile::new(&format!(
        "mode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n    - shell: \"echo '{quoted}'\"\n      output_file: \"{climb}etc/${{item.name}}\"\n    - write_file:\n        path: \"/etc/passwd\"\n        content: x\n    - shell: \"echo ok\"\n      output_file: \"/tmp/out.txt\"\n",
        quoted = "${item.x} ".repeat(2_000),
    ));
    let (code, codes) = file.codes();
    assert_eq!(code, 1);
    assert_eq!(
        codes.iter().filter(|c| *c == "V109").count(),
        2,
        "{codes:?}"
    );
    assert_eq!(
        codes.iter().filter(|c| *c == "V108").count(),
        1,
        "{codes:?}"
    );
    assert_eq!(codes.iter().filter(|c| *c == "W006").count(), 2_000);
}

/// One framed JSON-RPC message.
fn frame(message: &serde_json::Value) -> String {
    let body = message.to_string();
    format!("Content-Length: {}\r\n\r\n{body}", body.len())
}

#[test]
fn the_language_server_survives_what_a_hostile_client_sends() {
    use serde_json::json;
    use std::io::Write as _;
    let uri = "file:///tmp/hostile/workflow.yml";
    let mut input = String::new();
    input.push_str(&frame(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}}),
    ));
    input.push_str(&frame(
        &json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}),
    ));
    // No `languageId`; a hover without parameters; 200 changes in a burst.
    input.push_str(&frame(&json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": uri, "text": "commands: []\n"}}})));
    input.push_str(&frame(
        &json!({"jsonrpc": "2.0", "id": 2, "method": "textDocument/hover", "params": {}}),
    ));
    for version in 2..=201 {
        let text = format!("commands:\n  - shell: \"echo $x{version}\"\n");
        input.push_str(&frame(&json!({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": text}]}})));
    }
    input.push_str(&frame(
        &json!({"jsonrpc": "2.0", "id": 3, "method": "textDocument/hover", "params": {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 2}}}),
    ));
    // Then a length no memory holds, and the end of the input inside it.
    input.push_str("Content-Length: 99999999999999\r\n\r\n{");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_prodigy"))
        .arg("lsp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    // Bounded: the server is killed after 30 s.
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if finished
            .recv_timeout(std::time::Duration::from_secs(30))
            .is_err()
        {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
            return true;
        }
        false
    });
    let output = child.wait_with_output().unwrap();
    let _ = done.send(());
    assert!(!watchdog.join().unwrap(), "the server hung");
    writer.join().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(1),
        "a signal, not an exit: {stderr}"
    );
    assert!(stderr.contains("99999999999999 bytes"), "{stderr}");
    assert!(
        stdout.contains(r#""id":2"#) && stdout.contains("-32602"),
        "{stdout}"
    );
    assert!(stdout.contains(r#""id":3"#), "stopped serving: {stdout}");
    let checks = stdout.matches("publishDiagnostics").count();
    assert!(checks <= 20, "{checks} checks for a burst of 200 changes");
    assert!(
        stdout.contains(r#""version":201"#),
        "the last version was not checked"
    );
}

/// A MapReduce workflow over INPUT, run with `--no-worktree` and a scratch `PRODIGY_HOME`
/// (the scratch directory is no git repository); the exit code and stderr.
fn run_map_job(input: &str, map: &str, extra: &[&str]) -> (i32, String) {
    let workflow = format!(
        "name: hostile-input\nmode: mapreduce\nmap:\n  input: {input:?}\n{map}  agent_template:\n    - shell: \"echo ${{item}}\"\n"
    );
    let file = Hostile::new(&workflow);
    let output = Command::cargo_bin("prodigy")
        .unwrap()
        .current_dir(file.dir.path())
        .env("NO_COLOR", "1")
        .env("PRODIGY_HOME", file.dir.path().join("home"))
        .args(["run", "--no-worktree"])
        .args(extra)
        .arg(&file.path)
        .timeout(std::time::Duration::from_secs(30))
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `map.input: /dev/zero` was read until memory ran out, and a FIFO blocked the run: only a
/// regular file is read, and anything else is refused by name, at once.
#[test]
fn a_device_or_a_fifo_as_map_input_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("items.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    for (input, what) in [
        ("/dev/zero".to_owned(), "a character device"),
        (fifo.display().to_string(), "a FIFO"),
    ] {
        let (code, stderr) = run_map_job(&input, "", &[]);
        assert_eq!(code, 1, "{stderr}");
        assert!(
            stderr.contains(&format!(
                "the map input `{input}` is {what}, not a regular file"
            )),
            "{stderr}"
        );
        assert!(!stderr.contains("completed"), "{stderr}");
    }
}

/// An input command whose JSON is cut short used to complete "of 0 items": it is an error
/// saying where the JSON broke.
#[test]
fn truncated_json_from_an_input_command_fails_the_job() {
    let (code, stderr) = run_map_job(r#"printf '{"items": [{"id": 1}, {"id": 2'"#, "", &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("not JSON: EOF while parsing an object at line 1"),
        "{stderr}"
    );
    assert!(!stderr.contains("completed"), "{stderr}");
}

/// A `json_path` that selects nothing completed the job "of 0 items" in silence: it warns,
/// naming the expression and the input, and fails the job under `--strict`.
#[test]
fn a_json_path_selecting_nothing_warns_and_fails_under_strict() {
    let input = r#"printf '{"items": [1, 2]}'"#;
    let map = "  json_path: \"$.itmes[*]\"\n";
    let (code, stderr) = run_map_job(input, map, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "warning: `json_path: $.itmes[*]` selected nothing from the map input `{input}`"
        )),
        "{stderr}"
    );
    let (code, stderr) = run_map_job(input, map, &["--strict"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("selected nothing from the map input") && stderr.contains("--strict"),
        "{stderr}"
    );
    assert!(!stderr.contains("completed"), "{stderr}");
}

/// A misspelt field in `filter` completed a job of 0 items with a tick: the run says how many
/// items lack the field, and the last line says the job had no items (an error under
/// `--strict`).
#[test]
fn a_filter_that_keeps_nothing_says_so() {
    let input = r#"printf '[{"priority": 3}, {"priority": 1}]'"#;
    let map = "  filter: \"prority >= 2\"\n";
    let (code, stderr) = run_map_job(input, map, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("(2 of 2 without `prority`)"), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("⚠ job ") && last.contains("completed with no items"),
        "{stderr}"
    );
    assert!(!stderr.contains("✓"), "{stderr}");
    let (code, stderr) = run_map_job(input, map, &["--strict"]);
    assert_eq!(code, 1, "{stderr}");
    // A field some items have is counted, and the job is as before.
    let (code, stderr) = run_map_job(
        r#"printf '[{"priority": 3}, {"id": 1}]'"#,
        "  filter: \"priority >= 2\"\n",
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("(1 of 2 without `priority`)"), "{stderr}");
    assert!(stderr.contains("completed: 1 succeeded"), "{stderr}");
}

/// Outside a git repository, `run` works in place: it says so once, not under `-q`.
#[test]
fn a_run_outside_a_repository_says_it_runs_in_place() {
    let file = Hostile::new("- shell: \"echo one\"\n- shell: \"echo two\"\n");
    let run = |extra: &[&str]| {
        let output = Command::cargo_bin("prodigy")
            .unwrap()
            .current_dir(file.dir.path())
            .env("NO_COLOR", "1")
            .env("PRODIGY_HOME", file.dir.path().join("home"))
            .env("GIT_CEILING_DIRECTORIES", file.dir.path().parent().unwrap())
            .arg("run")
            .args(extra)
            .arg(&file.path)
            .timeout(std::time::Duration::from_secs(30))
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let said = "not a git repository: running in place";
    let stderr = run(&[]);
    assert_eq!(stderr.matches(said).count(), 1, "{stderr}");
    assert!(!run(&["-q"]).contains(said));
    assert!(!run(&["--no-worktree"]).contains(said));
}

/// `prodigy items --input` reads the input as `run` does: a device is refused, unread.
#[test]
fn items_refuses_a_device_as_input() {
    let file = Hostile::new(
        "name: items\nmode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n    - shell: \"echo ${item}\"\n",
    );
    let output = Command::cargo_bin("prodigy")
        .unwrap()
        .current_dir(file.dir.path())
        .env("NO_COLOR", "1")
        .args(["items", "--input", "/dev/zero"])
        .arg(&file.path)
        .timeout(std::time::Duration::from_secs(30))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("the map input `/dev/zero` is a character device, not a regular file"),
        "{stderr}"
    );
}

/// A step that prints 300 MB: prodigy keeps the last `PRODIGY_OUTPUT_LIMIT` bytes (8 MiB) of
/// it in memory, in the capture and in the checkpoint, with a truncation mark, and the whole of
/// it in a log. Memory stays bounded (it was 2.97 GB for 500 MB before).
#[test]
fn three_hundred_megabytes_of_output_stay_bounded() {
    let file = Hostile::new(
        "- shell: \"head -c 300000000 /dev/zero | tr '\\\\0' a | fold -w 999\"\n  capture: big\n- write_file:\n    path: big.txt\n    content: \"${big}\"\n",
    );
    let home = file.dir.path().join("home");
    let time = std::path::Path::new("/usr/bin/time");
    let mut command = if time.exists() {
        let mut c = std::process::Command::new(time);
        c.args(["-f", "maxrss=%M"])
            .arg(assert_cmd::cargo::cargo_bin("prodigy"));
        c
    } else {
        external::skip_line(
            "three_hundred_megabytes_of_output_stay_bounded",
            "/usr/bin/time is missing: peak memory not measured",
        );
        std::process::Command::new(assert_cmd::cargo::cargo_bin("prodigy"))
    };
    let output = command
        .args(["run", "--no-worktree"])
        .arg(&file.path)
        .current_dir(file.dir.path())
        .env("PRODIGY_HOME", &home)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    // What the second step got: the tail after the mark, not 300 MB.
    let big = std::fs::File::open(file.dir.path().join("big.txt")).unwrap();
    let size = big.metadata().unwrap().len();
    assert!(size < 9 << 20 && size > 8 << 20, "{size}");
    let mut head = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(big, 40), &mut head).unwrap();
    assert!(head.starts_with("[prodigy: output truncated:"), "{head}");
    let mut checkpoint = 0;
    let mut logged = 0;
    let mut kept = 0;
    let mut stack = vec![home];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let len = entry.metadata().unwrap().len();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                stack.push(path);
            } else if path.ends_with("checkpoint.json") {
                checkpoint = len;
            } else if name.starts_with("output-") && path.extension().is_some_and(|e| e == "log") {
                logged = len;
            } else if name == "step-0001.log" {
                kept = len;
            }
        }
    }
    assert!(checkpoint < 64 << 20, "checkpoint of {checkpoint} bytes");
    // The step's own log keeps what memory keeps: the tail, after the line naming the spill.
    assert!(kept < 9 << 20 && kept > 8 << 20, "step log of {kept} bytes");
    assert_eq!(
        logged,
        300_000_000 + 300_000_000 / 999 + 1,
        "the whole output is logged"
    );
    if let Some(rss) = stderr
        .lines()
        .find_map(|l| l.strip_prefix("maxrss="))
        .and_then(|k| k.trim().parse::<u64>().ok())
    {
        // Kilobytes; the output alone would be 300 000. About 160–210 MB is measured here
        // (a few copies of the 8 MiB tail, allocator slack); the bound leaves room for a
        // loaded machine and still fails for anything that holds the whole output.
        assert!(rss < 260_000, "peak memory {rss} kB");
        eprintln!("peak memory for 300 MB of output: {rss} kB");
    }
}
