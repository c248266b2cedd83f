//! The complete examples under `workflows/examples/`, run as their comments tell a user to
//! run them, in a scratch repository shaped for each.

use super::mapreduce::only_job;
use super::{Scratch, root, shown, stderr};

fn example(name: &str) -> String {
    root()
        .join("workflows/examples")
        .join(name)
        .display()
        .to_string()
}

/// `docs-check.yml`: setup lists the Markdown files, the filter drops the empty one, an agent
/// checks each file, a file that fails its check is tried again and then dead-lettered, and
/// reduce counts both.
#[test]
fn docs_check_example_dead_letters_the_files_that_fail_and_reports() {
    let scratch = Scratch::new();
    let project = scratch.project();
    for (name, text) in [
        ("README.md", "# Demo\n\nSome text.\n"),
        ("docs/guide.md", "# Guide\n\nStep one.\nStep two.\n"),
        ("docs/faq.md", "# FAQ\n"),
        ("docs/notes.md", "# Notes\nshort\n"),
        ("docs/untitled.md", "No title here.\n"),
        ("docs/trailing.md", "# Trailing\nspace at the end \n"),
        ("docs/empty.md", ""),
    ] {
        let path = project.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    scratch.commit();
    let output = scratch.run(&["run", "-v", "-y", &example("docs-check.yml")], &[]);
    let text = shown(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("7 Markdown files"), "{text}");
    // Setup leaves the work list uncommitted, which is fine: prodigy reads it, not the agents.
    assert!(!text.contains("warning: setup left"), "{text}");
    assert!(
        text.contains("map: 6 items (7 selected, 6 after filter"),
        "{text}"
    );
    assert!(
        text.contains("docs/untitled.md: the first line is not a title line"),
        "{text}"
    );
    assert!(
        text.contains("docs/trailing.md: trailing whitespace on the lines above"),
        "{text}"
    );
    assert!(text.contains("4 of 6 files pass, 2 fail"), "{text}");

    let job = only_job(&scratch);
    let listed = scratch.run(&["dlq", "list", &job, "--format", "json"], &[]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let mut paths: Vec<String> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            // Each dead-lettered file ran twice, as `retry_config` says.
            assert_eq!(entry["failure_count"], 2, "{entry}");
            let item = entry["item_id"].as_str().unwrap();
            let shown = scratch.run(&["dlq", "show", &job, item, "--format", "json"], &[]);
            let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
            shown["item_data"]["path"].as_str().unwrap().to_owned()
        })
        .collect();
    paths.sort();
    assert_eq!(paths, ["docs/trailing.md", "docs/untitled.md"], "{text}");
    let runs = scratch
        .events()
        .iter()
        .filter(|e| e["event_type"] == "agent_started" && e["item_id"] != serde_json::Value::Null)
        .count();
    assert_eq!(runs, 8, "4 files once, 2 files twice: {text}");
}

/// Runs `claude-fix-loop.yml` on tests that fail until a file `state` exists, with a Claude
/// stand-in that records each prompt (its standard input) in `stub-state/prompts` and, when `fixes`, writes
/// `state` and commits it.
fn run_fix_loop(fixes: bool) -> (Scratch, super::Output) {
    let scratch = Scratch::new();
    let claude = scratch.dir.path().join("bin/fixing-claude");
    let prompts = scratch.dir.path().join("stub-state/prompts");
    let fix = if fixes {
        "echo fixed > state && git add state && git -c user.name=c -c user.email=c@example.invalid commit -qm 'fix: write state'"
    } else {
        "echo 'no idea'"
    };
    std::fs::write(
        &claude,
        format!(
            "#!/bin/sh\nfor last; do :; done\n[ \"$last\" = --version ] && exec {stub} \"$@\"\nprompt=$(cat)\nprintf '%s\\n---\\n' \"$prompt\" >> {prompts}\n{fix} >&2\nprintf '%s' \"$prompt\" | exec {stub} \"$@\"\n",
            prompts = prompts.display(),
            stub = super::root().join("tests/run/bin/claude").display()
        ),
    )
    .unwrap();
    let mut perms = std::fs::metadata(&claude).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&claude, perms).unwrap();
    let tests = "echo tests: running; test -f state || { echo 'assertion failed: state is missing' >&2; exit 1; }";
    let output = scratch.run(
        &["run", "-y", &example("claude-fix-loop.yml")],
        &[
            ("PRODIGY_CLAUDE_COMMAND", claude.to_str().unwrap()),
            ("TEST_COMMAND", tests),
        ],
    );
    (scratch, output)
}

/// `claude-fix-loop.yml`: the tests fail, Claude gets their output (stderr included), fixes
/// and commits, the tests pass on their second run, and the fix is merged back with `-y`.
#[test]
fn claude_fix_loop_example_hands_the_failure_to_claude_and_merges_the_fix() {
    let (scratch, output) = run_fix_loop(true);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    let prompts = std::fs::read_to_string(scratch.dir.path().join("stub-state/prompts")).unwrap();
    assert_eq!(prompts.matches("\n---\n").count(), 1, "{prompts}");
    assert!(prompts.contains("tests: running"), "{prompts}");
    assert!(
        prompts.contains("assertion failed: state is missing"),
        "{prompts}"
    );
    assert!(prompts.contains("test -f state"), "{prompts}");
    // The fix came back to the user's branch.
    assert!(scratch.project().join("state").is_file(), "{text}");
    assert!(
        scratch
            .git(&["log", "--oneline"])
            .contains("fix: write state"),
        "{text}"
    );
}

/// When Claude cannot fix them, the tests run three times and the workflow fails, keeping
/// nothing on the user's branch.
#[test]
fn claude_fix_loop_example_gives_up_after_three_runs() {
    let (scratch, output) = run_fix_loop(false);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    let runs = scratch
        .events()
        .iter()
        .filter(|e| e["event_type"] == "attempt_started" && e["step"] == "tests")
        .count();
    assert_eq!(runs, 3, "{text}");
    assert!(!scratch.project().join("state").exists());
}

/// A Claude stand-in for `verified-fix.yml` on the `demo` crate of
/// [`verified_fix_example_keeps_every_state_green`]: it records each call's arguments and
/// prompt in `stub-state/calls`, makes its item's change and commits it. On `src/greet.rs`
/// it gives `greet` a parameter and fixes the callers its checkout has; its first run also
/// empties the protected `tests/smoke.rs`. On `src/names.rs` it adds a caller of `greet`,
/// written for the `greet` its checkout has.
const VERIFIED_FIX_CLAUDE: &str = r#"#!/bin/sh
for last; do :; done
[ "$last" = --version ] && exec STUB "$@"
prompt=$(cat)
printf '%s\n%s\n---\n' "$*" "$prompt" >> CALLS
case "$prompt" in
  *src/greet.rs*)
    printf 'pub fn greet(name: &str) -> String {\n    format!("hello {name}")\n}\n' > src/greet.rs
    sed -i 's/greet::greet()/greet::greet(crate::names::name())/' src/*.rs
    case "$prompt" in
      *"was not merged"*) ;;
      *) : > tests/smoke.rs ;;
    esac
    ;;
  *src/names.rs*)
    if grep -q 'name: &str' src/greet.rs; then call='crate::greet::greet(name())'; else call='crate::greet::greet()'; fi
    printf 'pub fn welcome() -> String {\n    %s\n}\n' "$call" >> src/names.rs
    ;;
  *src/lib.rs*)
    printf '//! The demo crate.\n' | cat - src/lib.rs > lib.tmp && mv lib.tmp src/lib.rs
    ;;
esac
git add -A && git -c user.name=c -c user.email=c@example.invalid commit -qm "claude: $(git diff --cached --name-only HEAD | head -1)" >&2
printf '%s' "$prompt" | exec STUB "$@"
"#;

/// The `demo` crate: `greet` says hello to `names::name()`, and `tests/smoke.rs` checks the
/// name.
fn demo_crate(project: &std::path::Path) {
    for (name, text) in [
        (
            "Cargo.toml",
            "[package]\nname = \"demo\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\n",
        ),
        (
            "Cargo.lock",
            "# This file is automatically @generated by Cargo.\n# It is not intended for manual editing.\nversion = 3\n\n[[package]]\nname = \"demo\"\nversion = \"0.1.0\"\n",
        ),
        (".gitignore", "/target\n"),
        ("src/lib.rs", "pub mod greet;\npub mod names;\n"),
        (
            "src/greet.rs",
            "pub fn greet() -> String {\n    format!(\"hello {}\", crate::names::name())\n}\n",
        ),
        (
            "src/names.rs",
            "pub fn name() -> &'static str {\n    \"world\"\n}\n",
        ),
        (
            "tests/smoke.rs",
            "#[test]\nfn the_name_is_the_world() {\n    assert_eq!(demo::names::name(), \"world\");\n}\n",
        ),
    ] {
        let path = project.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

/// `verified-fix.yml` on a small crate whose tests `cargo test` runs: the agent that
/// emptied the protected test file goes back and lands without it, the caller written for
/// the old `greet` is caught by the tests on the merged work and sent back (or written for
/// the new one when `greet` landed first), and every first-parent state of the merged work
/// passes `cargo test`.
#[test]
fn verified_fix_example_keeps_every_state_green() {
    let scratch = Scratch::new();
    let project = scratch.project();
    demo_crate(&project);
    scratch.commit();
    let start = scratch.git(&["rev-parse", "HEAD"]);
    let claude = scratch.dir.path().join("bin/verified-claude");
    let calls = scratch.dir.path().join("stub-state/calls");
    std::fs::write(
        &claude,
        VERIFIED_FIX_CLAUDE
            .replace(
                "STUB",
                &root().join("tests/run/bin/claude").display().to_string(),
            )
            .replace("CALLS", &calls.display().to_string()),
    )
    .unwrap();
    let mut perms = std::fs::metadata(&claude).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&claude, perms).unwrap();
    let target = scratch.dir.path().join("cargo-target");
    // The scratch's `PATH` has a stub `cargo`: the tests run the real one.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let test_command = format!("{cargo} test -q --offline");
    let output = scratch.run(
        &["run", "-y", &example("verified-fix.yml")],
        &[
            ("PRODIGY_CLAUDE_COMMAND", claude.to_str().unwrap()),
            ("TEST_COMMAND", test_command.as_str()),
            ("CARGO_TARGET_DIR", target.to_str().unwrap()),
        ],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("3 succeeded, 0 failed"), "{text}");
    let calls = std::fs::read_to_string(&calls).unwrap();
    // The agent that emptied the test file was sent back, continuing its session, told why.
    let greet: Vec<&str> = calls
        .split("\n---\n")
        .filter(|c| c.contains("src/greet.rs"))
        .collect();
    assert!(greet.len() >= 2, "{calls}");
    assert!(greet[1].contains("--resume stub-session"), "{}", greet[1]);
    assert!(greet[1].contains("protected"), "{}", greet[1]);
    assert!(greet[1].contains("tests/smoke.rs"), "{}", greet[1]);
    // The test file is as it was; `greet` takes a name, and `welcome` calls it so.
    assert_eq!(
        std::fs::read_to_string(project.join("tests/smoke.rs")).unwrap(),
        "#[test]\nfn the_name_is_the_world() {\n    assert_eq!(demo::names::name(), \"world\");\n}\n"
    );
    let names = std::fs::read_to_string(project.join("src/names.rs")).unwrap();
    assert!(
        names.contains("crate::greet::greet(name())")
            || names.contains("crate::greet::greet(crate::names::name())"),
        "{names}"
    );
    // Every first-parent state of the merged work passes the tests.
    let merged = scratch.git(&["rev-parse", "main^2"]);
    let range = format!("{}..{}", start.trim(), merged.trim());
    for commit in scratch.git(&["rev-list", "--first-parent", &range]).lines() {
        let dir = tempfile::tempdir().unwrap();
        let unpacked = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "git -C {} archive {commit} | tar -x -C {}",
                project.display(),
                dir.path().display()
            ))
            .status()
            .unwrap();
        assert!(unpacked.success());
        let tested = std::process::Command::new(&cargo)
            .args(["test", "-q", "--offline"])
            .env("CARGO_TARGET_DIR", &target)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            tested.status.success(),
            "{commit} is red: {}",
            String::from_utf8_lossy(&tested.stderr)
        );
    }
}

/// `claude-stand-in.sh`, the stand-in docs/claude.md shows: a Claude workflow runs with it
/// as its CLI, and each call's answer is its prompt's first line.
#[test]
fn the_claude_stand_in_example_runs_a_claude_workflow() {
    let scratch = Scratch::new();
    std::fs::write(
        scratch.project().join("job.yml"),
        "commands:\n  - claude: \"/summarize the README\"\n    capture: summary\n  - shell: \"echo got: ${summary|shell}\"\n",
    )
    .unwrap();
    scratch.commit();
    let stand_in = root().join("workflows/examples/claude-stand-in.sh");
    let output = scratch.run(
        &["run", "-v", "--no-worktree", "job.yml"],
        &[("PRODIGY_CLAUDE_COMMAND", stand_in.to_str().unwrap())],
    );
    let text = shown(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("got: done: /summarize the README"), "{text}");
}

/// A program that prints plain text in place of the CLI's stream-json fails its call, and
/// the error says what the protocol is and where it is written down.
#[test]
fn a_stand_in_that_prints_plain_text_is_told_about_stream_json() {
    let scratch = Scratch::new();
    let plain = scratch.dir.path().join("bin/plain-claude");
    std::fs::write(
        &plain,
        "#!/bin/sh\nfor a; do [ \"$a\" = --version ] && { echo 1.0; exit 0; }; done\ncat >/dev/null\necho 'I fixed it.'\necho 'All done.'\n",
    )
    .unwrap();
    let mut perms = std::fs::metadata(&plain).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&plain, perms).unwrap();
    std::fs::write(
        scratch.project().join("job.yml"),
        "commands:\n  - claude: \"/fix it\"\n",
    )
    .unwrap();
    scratch.commit();
    let output = scratch.run(
        &["run", "--no-worktree", "job.yml"],
        &[("PRODIGY_CLAUDE_COMMAND", plain.to_str().unwrap())],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains("printed no stream-json event (2 lines of other text)"),
        "{text}"
    );
    assert!(text.contains("A stand-in for the Claude CLI"), "{text}");
}
