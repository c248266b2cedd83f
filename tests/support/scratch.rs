//! A scratch project for running prodigy end to end, shared by the test binaries that run
//! workflows (`tests/run`, and the run fixtures of `tests/workflows`): a git repository with
//! one commit and the test user's identity, a scratch `PRODIGY_HOME`, stub commands first on
//! `PATH`, and the helpers that turn a run into a stable snapshot (exit code, output and
//! events, with scratch paths and ids normalised).
//!
//! Included by each test binary that needs it with `#[path = "../support/scratch.rs"]`.

#![allow(dead_code, reason = "each test binary uses part of this module")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use assert_cmd::cargo::CommandCargoExt;
use serde_json::Value;

pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The commands the documentation's examples name; each is the stub under that name.
pub(crate) const STUBBED: &[&str] = &[
    "aggregate",
    "analyze-codebase.sh",
    "build-production",
    "build-project",
    "cargo",
    "cleanup-artifacts",
    "curl",
    "debtmap",
    "deploy-production",
    "deploy-staging",
    "fetch-data.sh",
    "generate-work-items.sh",
    "make",
    "notify-success",
    "notify-team",
    "notify-team.sh",
    "npm",
    "optional-cleanup.sh",
    "prepare-data.sh",
    "process",
    "process-data.sh",
    "retry-build",
    "risky-command",
    "rollback-deployment",
    "save-to-local.sh",
    "step1.sh",
    "step2.sh",
    "step3.sh",
    "upload-results.sh",
    "validate",
];

/// Git as the test user, whatever the machine's git configuration.
pub(crate) fn as_test_user(cmd: &mut Command) -> &mut Command {
    cmd.env("GIT_AUTHOR_NAME", "test")
        .env("GIT_AUTHOR_EMAIL", "test@example.invalid")
        .env("GIT_COMMITTER_NAME", "test")
        .env("GIT_COMMITTER_EMAIL", "test@example.invalid")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
}

/// A scratch project (a git repository with one commit), a scratch `PRODIGY_HOME`, and a
/// `PATH` whose first entry holds the stubs.
pub(crate) struct Scratch {
    pub(crate) dir: tempfile::TempDir,
}

impl Scratch {
    pub(crate) fn new() -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["project", "home", "bin", "stub-state"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        for name in STUBBED {
            std::os::unix::fs::symlink(
                root().join("tests/run/bin/stub"),
                dir.path().join("bin").join(name),
            )
            .unwrap();
        }
        let scratch = Scratch { dir };
        scratch.git(&["init", "-q", "-b", "main"]);
        scratch.git(&["commit", "-q", "--allow-empty", "-m", "initial"]);
        scratch
    }

    /// Runs git in the project, as the test user, and returns its output.
    pub(crate) fn git(&self, args: &[&str]) -> String {
        let out = as_test_user(Command::new("git").args(args).current_dir(self.project()))
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?} failed: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Commits what the test put in the project (empty directories get a `.keep`), so that
    /// a run's session worktree, which starts from HEAD, has it too.
    pub(crate) fn commit(&self) {
        let mut dirs = vec![self.project()];
        while let Some(dir) = dirs.pop() {
            if dir.ends_with(".git") {
                continue;
            }
            let entries: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
            if entries.is_empty() {
                std::fs::write(dir.join(".keep"), "").unwrap();
            }
            dirs.extend(
                entries
                    .iter()
                    .map(std::fs::DirEntry::path)
                    .filter(|p| p.is_dir()),
            );
        }
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "--allow-empty", "-m", "test files"]);
    }

    /// The session worktree of the run ID.
    pub(crate) fn worktree(&self, id: &str) -> PathBuf {
        self.home().join("worktrees").join(self.repo()).join(id)
    }

    /// The project's namespace under `PRODIGY_HOME`: `project-` and a hash of where the
    /// scratch repository is.
    pub(crate) fn repo(&self) -> String {
        prodigy_runtime::layout::namespace(&self.project())
    }

    /// The project's state directory, `state/{repo}`.
    pub(crate) fn state(&self) -> PathBuf {
        self.home().join("state").join(self.repo())
    }

    pub(crate) fn project(&self) -> PathBuf {
        self.dir.path().join("project")
    }

    pub(crate) fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    pub(crate) fn command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::cargo_bin("prodigy").unwrap();
        as_test_user(&mut cmd);
        let path = format!(
            "{}:{}",
            self.dir.path().join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        cmd.args(args)
            .current_dir(self.project())
            .env("PATH", path)
            .env("PRODIGY_HOME", self.home())
            .env(
                "PRODIGY_CLAUDE_COMMAND",
                root().join("tests/run/bin/claude"),
            )
            .env("STUB_STATE", self.dir.path().join("stub-state"))
            .env("PRODIGY_SEED", "1")
            .env_remove("STUB_FAIL")
            .env_remove("STUB_ERROR")
            .env_remove("NO_COLOR")
            // `check` keeps ShellCheck's findings in a cache: the scratch's, not the user's.
            .env("XDG_CACHE_HOME", self.dir.path().join("cache"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Starts a run with its output piped, for tests that signal it.
    pub(crate) fn spawn(&self, args: &[&str]) -> std::process::Child {
        self.command(args, &[])
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }

    pub(crate) fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        self.command(args, env).output().unwrap()
    }

    /// Every event recorded under the scratch home, in file order.
    pub(crate) fn events(&self) -> Vec<Value> {
        let mut files = Vec::new();
        collect_files(&self.home().join("events"), &mut files);
        files.sort();
        files
            .iter()
            .flat_map(|f| {
                std::fs::read_to_string(f)
                    .unwrap()
                    .lines()
                    .map(|l| serde_json::from_str::<Value>(l).unwrap())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Hides what changes from run to run: scratch paths, session ids, durations, and the
    /// hash in the project's namespace (which depends on the scratch path), which shows as
    /// `project`, the repository's name.
    pub(crate) fn normalize(&self, text: &str) -> String {
        let text = text
            .replace(&self.project().display().to_string(), "[project]")
            .replace(&self.home().display().to_string(), "[home]")
            .replace(&format!("/{}/", self.repo()), "/project/")
            .replace(&self.dir.path().display().to_string(), "[scratch]")
            .replace(&root().display().to_string(), "[root]");
        let session = regex::Regex::new(r"session-[0-9]+-[0-9a-f]+").unwrap();
        let job = regex::Regex::new(r"mapreduce-[0-9]+-[0-9a-f]+").unwrap();
        let stamp = regex::Regex::new(r"events-[0-9TZ-]+\.jsonl").unwrap();
        let text = session.replace_all(&text, "[session]");
        let text = job.replace_all(&text, "[job]");
        let attempt_time = regex::Regex::new(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z").unwrap();
        let text = attempt_time.replace_all(&text, "[time]");
        let duration = regex::Regex::new(r#"(duration_secs\\?"?:)[0-9.e-]+"#).unwrap();
        let text = duration.replace_all(&text, "${1}[secs]");
        let rate = regex::Regex::new(r"[0-9.]+ items/s(, ETA [0-9a-z ]+)?").unwrap();
        let text = rate.replace_all(&text, "[rate]");
        stamp.replace_all(&text, "events-[time].jsonl").into_owned()
    }
}

pub(crate) fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_files(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// One line per event: its type, then the fields that do not change between runs.
pub(crate) fn event_lines(scratch: &Scratch, events: &[Value]) -> String {
    const VOLATILE: &[&str] = &[
        "timestamp",
        "job_id",
        "session_id",
        "duration_secs",
        "event_type",
        // Which log files a step wrote (`live`'s and `ui`'s tests show it in use).
        "log_number",
    ];
    let mut lines = String::new();
    let mut in_map = false;
    for event in events {
        let kind = event["event_type"].as_str().unwrap_or("?");
        match kind {
            "map_started" => in_map = true,
            "map_finished" => in_map = false,
            _ => {}
        }
        // The map phase's periodic checkpoints come once a second: when depends on speed
        // (one can come before any item finished, while an item waits for its retry).
        // A standard run's checkpoints are synced in batches while its next steps run:
        // where each lands among the steps' events depends on the disk (its final one is
        // waited for, and stays).
        if kind == "checkpoint_saved" && event["phase"].is_null() && event["status"] == "running" {
            continue;
        }
        if kind == "checkpoint_saved"
            && event["phase"] == "map"
            && event["status"] == "running"
            && (in_map || event["items_processed"].as_u64().unwrap_or(0) > 0)
        {
            continue;
        }
        let fields: BTreeMap<&String, &Value> = event
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| !VOLATILE.contains(&k.as_str()))
            .collect();
        let fields = serde_json::to_string(&fields).unwrap();
        lines.push_str(kind);
        if fields != "{}" {
            lines.push(' ');
            lines.push_str(&scratch.normalize(&fields));
        }
        lines.push('\n');
    }
    lines
}

/// The snapshot of one run: exit code, output and events.
pub(crate) fn report(scratch: &Scratch, output: &Output) -> String {
    report_with(scratch, output, false)
}

/// The same, with the event lines sorted when parallel work makes their order vary.
pub(crate) fn report_with(scratch: &Scratch, output: &Output, unordered: bool) -> String {
    let mut events = event_lines(scratch, &scratch.events());
    if unordered {
        let mut lines: Vec<&str> = events.lines().collect();
        lines.sort_unstable();
        events = lines.join("\n") + "\n";
    }
    format!(
        "exit: {}\n--- stdout ---\n{}--- stderr ---\n{}--- events ---\n{}",
        output
            .status
            .code()
            .map_or("signal".to_owned(), |c| c.to_string()),
        scratch.normalize(&String::from_utf8_lossy(&output.stdout)),
        scratch.normalize(&String::from_utf8_lossy(&output.stderr)),
        events,
    )
}

/// `# key: value` lines at the top of a fixture.
pub(crate) fn directives(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .take_while(|l| l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.trim_start_matches('#').trim().split_once(':')?;
            Some((k.trim().to_owned(), v.trim().to_owned()))
        })
        .collect()
}

pub(crate) fn snapshot(dir: &str, name: &str, text: &str) {
    insta::with_settings!({
        snapshot_path => format!("../../workflows/{dir}"),
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_snapshot!(name, text);
    });
}

/// Runs FILE in a fresh scratch project with the directives' arguments and failing stubs.
pub(crate) fn run_file(file: &Path, extra: &BTreeMap<String, String>) -> (Scratch, Output) {
    let scratch = Scratch::new();
    let mut args = vec![
        "run".to_owned(),
        "-v".to_owned(),
        file.display().to_string(),
    ];
    if let Some(more) = extra.get("args") {
        args.extend(more.split_whitespace().map(str::to_owned));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut env = Vec::new();
    if let Some(fail) = extra.get("stub-fail") {
        env.push(("STUB_FAIL", fail.as_str()));
    }
    if let Some(error) = extra.get("stub-error") {
        env.push(("STUB_ERROR", error.as_str()));
    }
    if let Some(dirs) = extra.get("dirs") {
        for dir in dirs.split_whitespace() {
            std::fs::create_dir_all(scratch.project().join(dir)).unwrap();
        }
        scratch.commit();
    }
    if let Some(secret) = extra.get("secret-env") {
        let (k, v) = secret.split_once('=').unwrap();
        env.push((k, v));
    }
    let output = scratch.run(&args, &env);
    (scratch, output)
}

pub(crate) fn check_exit(name: &str, output: &Output, expected: &str) {
    let expected: i32 = expected.parse().unwrap();
    assert_eq!(
        output.status.code(),
        Some(expected),
        "{name}: expected exit {expected}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
