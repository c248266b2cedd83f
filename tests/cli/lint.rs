//! `prodigy check` as a linter (files, directories, standard input, `--fix`, ShellCheck) and the
//! command-line conventions (completions, man page, `--color`, `-q`, exit statuses).

use std::path::Path;

use predicates::prelude::*;

use super::{check_json, external, prodigy, write};

const TYPO: &str =
    "commands:\n  - shell: make   # build it\n    retry_config:\n      max_attemps: 3  # keep\n";
const TYPO_FIXED: &str =
    "commands:\n  - shell: make   # build it\n    retry_config:\n      max_attempts: 3  # keep\n";

fn read(path: &Path) -> String {
    #[expect(clippy::disallowed_methods, reason = "tests read what prodigy wrote")]
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn an_unreadable_file_has_an_entry_in_every_machine_format() {
    let json = check_json(["does/not/exist.yml"], 2);
    let d = &json["diagnostics"][0];
    assert_eq!(d["file"], "does/not/exist.yml");
    assert_eq!(d["code"], "F001");
    assert_eq!(d["severity"], "error");
    assert!(
        d["message"]
            .as_str()
            .unwrap()
            .starts_with("cannot read `does/not/exist.yml`")
    );

    let sarif = prodigy()
        .args(["check", "--format", "sarif", "does/not/exist.yml"])
        .assert()
        .code(2)
        .get_output()
        .stdout
        .clone();
    let sarif: serde_json::Value = serde_json::from_slice(&sarif).unwrap();
    let result = &sarif["runs"][0]["results"][0];
    assert_eq!(result["ruleId"], "F001");
    assert_eq!(
        result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
        "does/not/exist.yml"
    );

    prodigy()
        .args(["check", "--format", "github", "does/not/exist.yml"])
        .assert()
        .code(2)
        .stdout(predicate::str::starts_with(
            "::error file=does/not/exist.yml,line=1,col=1,",
        ))
        .stderr(predicate::str::contains("checked 1 file: 1 error"));
}

#[test]
fn special_files_are_refused_without_reading_them() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe.yml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    // A FIFO nobody writes to would block a reader forever; `/dev/zero` never ends.
    for (path, what) in [
        (fifo.display().to_string(), "a FIFO"),
        ("/dev/zero".to_owned(), "a character device"),
    ] {
        let json = prodigy()
            .args(["check", "--format", "json", &path])
            .timeout(std::time::Duration::from_secs(20))
            .assert()
            .code(2)
            .get_output()
            .stdout
            .clone();
        let json: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(json["diagnostics"][0]["code"], "F001");
        assert!(
            json["diagnostics"][0]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("it is {what}, not a regular file")),
            "{json}"
        );
        prodigy()
            .args(["run", &path])
            .timeout(std::time::Duration::from_secs(20))
            .assert()
            .code(2)
            .stderr(predicate::str::contains("not a regular file"));
    }
}

#[test]
fn empty_and_non_utf8_files_get_a_diagnostic_not_an_internal_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty = write(&dir, "empty.yml", "# nothing yet\n");
    let latin1 = dir.path().join("latin1.yml");
    std::fs::write(&latin1, b"commands:\n  - shell: \"caf\xe9\"\n").unwrap();
    let json = check_json([&empty, &latin1], 1);
    let codes: Vec<&str> = json["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["F003", "F002"]);
    // The first byte that is not UTF-8.
    assert_eq!(json["diagnostics"][1]["line"], 2);
    assert_eq!(json["diagnostics"][1]["column"], 16);
    for path in [&empty, &latin1] {
        prodigy()
            .arg("run")
            .arg(path)
            .assert()
            .code(1)
            .stderr(predicate::str::contains("internal error").not())
            .stderr(predicate::str::contains("the workflow has errors"));
    }
}

#[test]
fn fix_edits_in_place_keeping_comments() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "w.yml", TYPO);
    prodigy()
        .args(["check", "--no-shellcheck", "--fix"])
        .arg(&path)
        .assert()
        .code(0)
        .stderr(predicate::str::contains(
            "checked 1 file: no problems found; fixed 1 problem in 1 file",
        ));
    assert_eq!(read(&path), TYPO_FIXED);
    // Nothing left to fix: a second run changes nothing.
    prodigy()
        .args(["check", "--no-shellcheck", "--fix"])
        .arg(&path)
        .assert()
        .code(0)
        .stderr(predicate::str::contains("fixed 0 problems in 0 files"));
}

#[test]
fn fix_dry_run_prints_a_unified_diff_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "w.yml", TYPO);
    let name = path.display().to_string();
    prodigy()
        .args(["check", "--no-shellcheck", "--fix", "--dry-run", &name])
        .assert()
        .code(0)
        .stdout(format!(
            "--- {name}\n+++ {name}\n@@ -1,4 +1,4 @@\n commands:\n   - shell: make   # build it\n     retry_config:\n-      max_attemps: 3  # keep\n+      max_attempts: 3  # keep\n"
        ))
        .stderr(predicate::str::contains("would fix 1 problem in 1 file"));
    assert_eq!(read(&path), TYPO);
    // A relative name gets git's `a/` and `b/`, for `git apply` and `patch -p1`.
    prodigy()
        .current_dir(dir.path())
        .args(["check", "--no-shellcheck", "--fix", "--dry-run", "w.yml"])
        .assert()
        .code(0)
        .stdout(predicate::str::starts_with("--- a/w.yml\n+++ b/w.yml\n"));
    // `--dry-run` only means something with `--fix`.
    prodigy()
        .args(["check", "--dry-run", &name])
        .assert()
        .code(2);
}

#[test]
fn fixes_are_in_the_json_and_sarif_output() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "w.yml", TYPO);
    let json = check_json([&path], 1);
    assert_eq!(
        json["diagnostics"][0]["fix"],
        serde_json::json!({
            "description": "rename `max_attemps` to `max_attempts`",
            "edits": [{
                "line": 4, "column": 7, "end_line": 4, "end_column": 18,
                "start_byte": 63, "end_byte": 74, "replacement": "max_attempts",
            }],
        })
    );
    let sarif = prodigy()
        .args(["check", "--format", "sarif"])
        .arg(&path)
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    let sarif: serde_json::Value = serde_json::from_slice(&sarif).unwrap();
    let fix = &sarif["runs"][0]["results"][0]["fixes"][0];
    assert_eq!(
        fix["description"]["text"],
        "rename `max_attemps` to `max_attempts`"
    );
    let replacement = &fix["artifactChanges"][0]["replacements"][0];
    assert_eq!(replacement["insertedContent"]["text"], "max_attempts");
    assert_eq!(replacement["deletedRegion"]["startLine"], 4);
    assert_eq!(replacement["deletedRegion"]["startColumn"], 7);
    // A diagnostic without a sure fix says so.
    let json = check_json(["workflows/err/V004-multiple-commands.yml"], 1);
    assert!(json["diagnostics"][0]["fix"].is_null());
    // The human summary counts what `--fix` would do.
    prodigy()
        .args(["check", "--no-shellcheck"])
        .arg(&path)
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "1 error (1 fixable with `prodigy check --fix`)",
        ));
}

#[test]
fn a_directory_is_searched_for_workflows_honouring_gitignore() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join(".prodigy")).unwrap();
    std::fs::create_dir_all(dir.path().join(".github/workflows")).unwrap();
    std::fs::create_dir_all(dir.path().join("build")).unwrap();
    write(&dir, ".prodigy/bad.yml", TYPO);
    write(&dir, "good.yaml", "- shell: make\n");
    write(&dir, "build/ignored.yml", TYPO);
    write(&dir, ".gitignore", "build/\n");
    write(
        &dir,
        ".github/workflows/ci.yml",
        "on: push\njobs:\n  test:\n    runs-on: x\n    steps:\n      - run: make\n",
    );
    write(
        &dir,
        "compose.yml",
        "services:\n  db:\n    image: postgres\n",
    );
    // `.gitignore` counts in a git repository.
    let git = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(dir.path())
        .status();
    if !git.is_ok_and(|s| s.success()) {
        external::missing_tool("check DIR honours .gitignore", "git", "git");
        return;
    }
    let json = check_json(["--no-shellcheck", dir.path().to_str().unwrap()], 1);
    let files: Vec<String> = json["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["file"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        files,
        [format!("{}/.prodigy/bad.yml", dir.path().display())]
    );
    // Without a path, the current directory.
    prodigy()
        .current_dir(dir.path())
        .args(["check", "--no-shellcheck"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("╭─[.prodigy/bad.yml:4:7]"))
        .stderr(predicate::str::contains("checked 2 files: 1 error"));
    // Named files are checked whatever they look like, unless `--only-workflows`.
    prodigy()
        .current_dir(dir.path())
        .args(["check", "--no-shellcheck", "compose.yml"])
        .assert()
        .code(1);
    prodigy()
        .current_dir(dir.path())
        .args([
            "check",
            "--no-shellcheck",
            "--only-workflows",
            "compose.yml",
            "good.yaml",
        ])
        .assert()
        .code(0)
        .stderr(predicate::str::contains(
            "checked 1 file: no problems found",
        ));
}

#[test]
fn stdin_is_checked_under_the_given_name() {
    let json = prodigy()
        .args([
            "check",
            "--no-shellcheck",
            "--format",
            "json",
            "--stdin-filename",
            "ci/w.yml",
        ])
        .write_stdin(TYPO)
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    let json: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(json["diagnostics"][0]["file"], "ci/w.yml");
    assert_eq!(json["diagnostics"][0]["line"], 4);
    // With `--fix`, the fixed text comes back on stdout, the report on stderr.
    prodigy()
        .args([
            "check",
            "--no-shellcheck",
            "--fix",
            "--stdin-filename",
            "w.yml",
        ])
        .write_stdin(TYPO)
        .assert()
        .code(0)
        .stdout(TYPO_FIXED)
        .stderr(predicate::str::contains("fixed 1 problem in 1 file"));
    // A name is not a path to read as well.
    prodigy()
        .args(["check", "--stdin-filename", "w.yml", "other.yml"])
        .assert()
        .code(2);
}

#[test]
fn shellcheck_findings_are_warnings_at_their_place_in_the_string() {
    if !external::tool_available("check runs shellcheck", "shellcheck", "shellcheck") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "w.yml",
        "mode: mapreduce\nmap:\n  input: \"ls items\"\n  agent_template:\n    - shell: |\n        cd ${item.dir|shell}\n        echo ${item.name|shell} x $count\n",
    );
    let json = check_json([&path], 0);
    let found: Vec<(String, u64, u64, String)> = json["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["message"]
                    .as_str()
                    .unwrap()
                    .split(':')
                    .next()
                    .unwrap()
                    .to_owned(),
                d["line"].as_u64().unwrap(),
                d["column"].as_u64().unwrap(),
                d["help"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            (
                "SC2164".to_owned(),
                6,
                9,
                "see https://www.shellcheck.net/wiki/SC2164".to_owned()
            ),
            (
                "SC2086".to_owned(),
                7,
                35,
                "see https://www.shellcheck.net/wiki/SC2086".to_owned()
            ),
        ]
    );
    assert!(
        json["diagnostics"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["code"] == "S001" && d["severity"] == "warning")
    );
    // `--no-shellcheck` does not run it; a suppression of S001 is then not useless.
    let quiet = write(
        &dir,
        "s.yml",
        "- shell: ls $x  # prodigy: ignore[S001] x is a list of words\n",
    );
    let json = check_json(
        [
            "--no-shellcheck",
            quiet.to_str().unwrap(),
            path.to_str().unwrap(),
        ],
        0,
    );
    assert_eq!(json["diagnostics"], serde_json::json!([]));
    // The suppression silences the finding when ShellCheck runs.
    let json = check_json([&quiet], 0);
    assert_eq!(json["diagnostics"], serde_json::json!([]));
}

#[test]
fn completions_for_every_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        prodigy()
            .args(["completions", shell])
            .assert()
            .code(0)
            .stdout(predicate::str::contains("prodigy"))
            .stdout(predicate::str::contains("resume-job"))
            .stdout(predicate::str::contains("dlq"))
            // prodigy's own hidden subcommands are not offered.
            .stdout(predicate::str::contains("guard").not());
    }
    prodigy().args(["completions", "tcsh"]).assert().code(2);
}

#[test]
fn bash_completes_files_after_a_command_that_takes_paths() {
    let script = prodigy()
        .args(["completions", "bash"])
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let dir = tempfile::tempdir().unwrap();
    let script_path = write(&dir, "prodigy.bash", &String::from_utf8(script).unwrap());
    write(&dir, "flow.yml", "commands: []\n");
    // What bash offers for `prodigy WORDS<TAB>`, in a directory holding `flow.yml`.
    let offered = |words: &str| {
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                r#"source "$1"; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMP_LINE="${{COMP_WORDS[*]}}"; COMP_POINT=${{#COMP_LINE}}; _prodigy prodigy "${{COMP_WORDS[-1]}}" "${{COMP_WORDS[-2]}}"; printf '%s\n' "${{COMPREPLY[@]}}""#
            ))
            .arg("bash")
            .arg(&script_path)
            .current_dir(dir.path())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for command in ["check", "run", "graph"] {
        let files = offered(&format!("prodigy {command} ''"));
        assert!(files.lines().any(|f| f == "flow.yml"), "{command}: {files}");
        let options = offered(&format!("prodigy {command} --"));
        assert!(options.contains("--help"), "{command}: {options}");
    }
    // Ids come from `prodigy ls`: a run's for `resume`, a job's for `resume-job` and `dlq`.
    let session = r#"{"version":1,"session_id":"session-1-a","workflow":"/p/a.yml","project":"/p","workflow_hash":"0","next_step":0,"status":"failed","variables":{},"params":[],"args":[],"profile":null,"started_at":"2026-11-01T10:00:00.000Z","updated_at":"2026-11-01T10:00:00.000Z"}"#;
    let job = r#"{"version":1,"job_id":"mapreduce-2-b","workflow_file":"/p/j.yml","project":"/p","workflow_hash":"0","phase":"map","status":"interrupted","items_processed":0,"items_total":3,"items_remaining":[],"successful_items":0,"failed_items":0,"skipped_items":0,"started_at":"2026-11-02T10:00:00.000Z","last_checkpoint_at":"2026-11-02T10:00:00.000Z","reduce_next_step":0,"variables":{},"params":[],"args":[],"profile":null,"max_parallel":2}"#;
    let home = dir.path().join("home/state/p-1");
    for (path, text) in [
        ("sessions/session-1-a", session),
        ("mapreduce/jobs/mapreduce-2-b", job),
    ] {
        std::fs::create_dir_all(home.join(path)).unwrap();
        std::fs::write(home.join(path).join("checkpoint.json"), text).unwrap();
    }
    let bin = assert_cmd::cargo::cargo_bin("prodigy");
    for (words, id) in [
        ("resume ''", "session-1-a"),
        ("resume-job ''", "mapreduce-2-b"),
        ("dlq show ''", "mapreduce-2-b"),
        ("events ''", "mapreduce-2-b\nsession-1-a"),
    ] {
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                r#"source "$1"; COMP_WORDS=(prodigy {words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); _prodigy prodigy "${{COMP_WORDS[-1]}}" "${{COMP_WORDS[-2]}}"; printf '%s\n' "${{COMPREPLY[@]}}""#
            ))
            .arg("bash")
            .arg(&script_path)
            .env("PRODIGY_HOME", dir.path().join("home"))
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin.parent().unwrap().display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .output()
            .unwrap();
        let offered = String::from_utf8_lossy(&out.stdout);
        assert_eq!(offered.trim(), id, "prodigy {words}");
    }
}

#[test]
fn the_man_page_has_every_subcommand() {
    let output = prodigy()
        .arg("man")
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let page = String::from_utf8(output).unwrap();
    assert!(page.starts_with(".ie"), "roff: {}", &page[..40]);
    assert!(page.contains(".TH prodigy 1"));
    for section in [
        "PRODIGY CHECK",
        "PRODIGY RUN",
        "PRODIGY RESUME-JOB",
        "PRODIGY DLQ RETRY",
        "PRODIGY EVENTS",
        "PRODIGY WORKTREE CLEAN",
        "PRODIGY COMPLETIONS",
    ] {
        assert!(
            page.contains(&format!(".SH \"{section}\"")),
            "no section {section}"
        );
    }
    // prodigy's own hidden subcommands are not the user's.
    for hidden in ["PRODIGY AGENT", "PRODIGY GUARD"] {
        assert!(!page.contains(&format!(".SH \"{hidden}\"")), "{hidden}");
    }
    assert!(page.contains("\\-\\-stdin\\-filename"));
    assert!(page.contains("Exit status:"));
    // Characters outside ASCII are groff escapes (`§` is `\[u00A7]`), not raw bytes.
    assert!(page.is_ascii(), "raw non-ASCII in the man page");
    assert!(page.contains("docs/language.md \\[u00A7]7"));
    // groff itself has nothing to say about it (`.ci/run` installs groff; elsewhere this part
    // skips with a line saying so).
    if external::tool_available("the_man_page_has_every_subcommand", "groff", "groff") {
        use std::io::Write as _;
        let mut groff = std::process::Command::new("groff")
            .args(["-ww", "-man", "-Tutf8", "-z"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        groff
            .stdin
            .take()
            .unwrap()
            .write_all(page.as_bytes())
            .unwrap();
        let out = groff.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.trim().is_empty(), "groff -ww warns:\n{said}");
    }
}

#[test]
fn color_is_chosen_with_a_flag_on_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "w.yml", TYPO);
    let ansi = predicate::str::contains("\u{1b}[");
    prodigy()
        .args(["check", "--no-shellcheck", "--color", "always"])
        .arg(&path)
        .assert()
        .code(1)
        .stdout(ansi.clone());
    prodigy()
        .args(["--color=never", "check", "--no-shellcheck"])
        .arg(&path)
        .env_remove("NO_COLOR")
        .assert()
        .code(1)
        .stdout(ansi.clone().not());
    // Global: accepted by every command, and it colours clap's own help.
    prodigy()
        .args(["run", "--color", "always", "--help"])
        .assert()
        .code(0)
        .stdout(ansi);
    prodigy()
        .args(["check", "--color", "sometimes"])
        .assert()
        .code(2);
}

#[test]
fn quiet_runs_print_only_the_outcome_line() {
    let dir = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let path = write(&dir, "w.yml", "- shell: echo one\n- shell: echo two\n");
    let run = |quiet: bool| {
        let mut cmd = prodigy();
        cmd.current_dir(dir.path())
            .env("PRODIGY_HOME", home.path())
            .args(["run", "--no-worktree"]);
        if quiet {
            cmd.arg("-q");
        }
        let output = cmd.arg(&path).assert().code(0).get_output().stderr.clone();
        String::from_utf8(output).unwrap()
    };
    assert!(run(false).contains("[1/2] echo one"));
    let quiet = run(true);
    assert_eq!(quiet.lines().count(), 1, "{quiet}");
    assert!(quiet.starts_with("✓ workflow completed"), "{quiet}");
    // Errors still show.
    let failing = write(&dir, "f.yml", "- shell: echo one\n- shell: exit 3\n");
    let output = prodigy()
        .current_dir(dir.path())
        .env("PRODIGY_HOME", home.path())
        .args(["run", "--no-worktree", "-q"])
        .arg(&failing)
        .assert()
        .code(1)
        .get_output()
        .stderr
        .clone();
    let text = String::from_utf8(output).unwrap();
    assert!(!text.contains("[1/2]"), "{text}");
    assert!(text.lines().last().unwrap().starts_with("✗ step"), "{text}");
    for command in [
        &["resume", "-q", "x"][..],
        &["resume-job", "--quiet", "x"],
        &["dlq", "retry", "-q", "x"],
    ] {
        // Accepted (the id names nothing: a usage error, not an unknown flag).
        prodigy()
            .env("PRODIGY_HOME", home.path())
            .args(command)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("unexpected argument").not());
    }
}

#[test]
fn help_lists_the_exit_statuses() {
    let output = prodigy()
        .arg("--help")
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let help = String::from_utf8(output).unwrap();
    for line in [
        "Exit status:",
        "    0  success",
        "    1  check found errors",
        "    2  bad usage, or a file that cannot be read",
        "    3  with --strict",
        "  130  interrupted by SIGINT",
        "  143  interrupted by SIGTERM",
    ] {
        assert!(help.contains(line), "--help lacks `{line}`:\n{help}");
    }
}

#[test]
fn release_builds_are_stripped_of_debug_info() {
    let manifest = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
    let profile = manifest
        .split("[profile.release]")
        .nth(1)
        .unwrap()
        .split("\n[")
        .next()
        .unwrap();
    assert!(profile.contains("strip = \"debuginfo\""), "{profile}");
    assert!(profile.contains("debug = false"), "{profile}");
}

#[test]
fn the_pre_commit_hook_checks_workflows_only() {
    let hooks = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".pre-commit-hooks.yaml"));
    assert!(hooks.contains("- id: prodigy-check"));
    assert!(hooks.contains("entry: prodigy check --only-workflows"));
    assert!(hooks.contains("language: rust"));
    assert!(hooks.contains("types: [yaml]"));
}

#[test]
fn a_file_too_large_to_read_is_reported_even_in_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir, "good.yml", "- shell: make\n");
    // Sparse: 65 MiB on paper, nothing on disk; refused before a byte is read.
    std::fs::File::create(dir.path().join("huge.yml"))
        .unwrap()
        .set_len(65 * 1024 * 1024)
        .unwrap();
    let json = check_json(["--no-shellcheck", dir.path().to_str().unwrap()], 2);
    let d = &json["diagnostics"][0];
    assert_eq!(d["code"], "F001");
    assert!(d["file"].as_str().unwrap().ends_with("huge.yml"));
    assert!(
        d["message"]
            .as_str()
            .unwrap()
            .ends_with("it is larger than 67108864 bytes"),
        "{d}"
    );
}

/// A `shellcheck` stand-in in DIR that counts its runs in `DIR/runs` (one line each) and
/// finds SC2086 at the start of every script it is given, with the script's first word in the
/// message.
fn counting_shellcheck(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let stub = bin.join("shellcheck");
    let runs = dir.join("runs");
    std::fs::write(
        &stub,
        format!(
            r#"#!/bin/sh
echo run >> '{runs}'
while [ "$1" != "--" ]; do shift; done
shift
sep=
printf '{{"comments":['
for f in "$@"; do
    word=$(head -c 20 "$f" | tr -dc 'a-z0-9 ')
    printf '%s{{"file":"%s","line":1,"endLine":1,"column":1,"endColumn":2,"level":"info","code":2086,"message":"saw %s","fix":null}}' "$sep" "$f" "$word"
    sep=,
done
printf ']}}'
exit 1
"#,
            runs = runs.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

fn runs(dir: &Path) -> usize {
    read(&dir.join("runs")).lines().count()
}

#[test]
fn an_unchanged_script_is_never_shellchecked_twice() {
    let dir = tempfile::tempdir().unwrap();
    let bin = counting_shellcheck(dir.path());
    let path_var = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let cache = dir.path().join("cache");
    let check = |file: &Path, cache: &Path| -> serde_json::Value {
        let out = prodigy()
            .env("PATH", &path_var)
            .env("XDG_CACHE_HOME", cache)
            .args(["check", "--format", "json"])
            .arg(file)
            .assert()
            .code(0)
            .get_output()
            .stdout
            .clone();
        serde_json::from_slice(&out).unwrap()
    };
    // The same script twice in one file: checked once.
    let file = write(
        &dir,
        "w.yml",
        "- shell: alpha $x\n- shell: beta $y\n- shell: alpha $x\n",
    );
    let cold = check(&file, &cache);
    let messages: Vec<&str> = cold["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["message"].as_str().unwrap())
        .collect();
    assert_eq!(messages.len(), 3, "{cold}");
    assert!(messages[0].contains("alpha") && messages[1].contains("beta"));
    assert!(messages[2].contains("alpha"), "{cold}");
    let after_cold = runs(dir.path());
    assert!(after_cold >= 1);
    // Unchanged: the findings come from the cache, identical, without running ShellCheck.
    let warm = check(&file, &cache);
    assert_eq!(warm, cold);
    assert_eq!(runs(dir.path()), after_cold, "ShellCheck ran again");
    // One changed script: only it is checked again, by one run.
    write(
        &dir,
        "w.yml",
        "- shell: alpha $x\n- shell: gamma $y\n- shell: alpha $x\n",
    );
    let changed = check(&file, &cache);
    assert_eq!(runs(dir.path()), after_cold + 1);
    assert!(
        changed["diagnostics"][1]["message"]
            .as_str()
            .unwrap()
            .contains("gamma"),
        "{changed}"
    );
    // Without the cache, the same findings.
    let fresh = check(&file, &dir.path().join("empty-cache"));
    assert_eq!(fresh, changed);
}
