//! `prodigy run` end to end: the standard-workflow examples of the user documentation
//! (`workflows/ok/seed-*`), and the shell-only standard workflows of the upstream corpus, each
//! run against stub commands in a scratch project (`tests/support/scratch.rs`). The exit code,
//! what prodigy printed and the sequence of events are snapshots. The fixture workflows under
//! `workflows/run/` run in `tests/workflows`, one test each.

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test helpers fail loudly and read fixtures directly"
)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

#[path = "../support/external.rs"]
mod external;

#[path = "../support/scratch.rs"]
mod scratch;

#[path = "../support/watch.rs"]
mod watch;

use scratch::{Scratch, as_test_user, check_exit, collect_files, report, root, run_file, snapshot};

/// How a standard-workflow example of the documentation is exercised: which stubs fail and
/// how, which directories exist, and the exit code its text implies.
struct Scenario {
    name: &'static str,
    fail: &'static str,
    error: &'static str,
    dirs: &'static [&'static str],
    /// `NAME=VALUE` of a secret the workflow reads from the environment, or empty.
    secret: &'static str,
    exit: i32,
}

const fn scenario(name: &'static str, fail: &'static str, exit: i32) -> Scenario {
    Scenario {
        name,
        fail,
        error: "failed",
        dirs: &[],
        secret: "",
        exit,
    }
}

const SEED_SCENARIOS: &[Scenario] = &[
    // npm install fails once; the handler cleans the cache and installs again.
    scenario("seed-000-cleanup-and-retry", "npm:1", 0),
    // The agent makes no commit, so `commit_required` fails the step.
    scenario("seed-000-commit-required", "", 1),
    // The tests fail twice; Claude fixes them after each failure; the third run passes.
    scenario("seed-000-conditional-recovery", "cargo:2", 0),
    // The deployment fails: the handler rolls back and notifies, and the workflow still fails.
    scenario(
        "seed-000-critical-step-notification",
        "deploy-production",
        1,
    ),
    // The command fails; Claude receives its output; the workflow goes on.
    scenario("seed-000-error-information", "risky-command", 0),
    // clippy fails once; Claude fixes the warnings; the second run passes.
    scenario("seed-000-on-failure-advanced-auto-retry", "cargo:1", 0),
    // The deployment fails; the rollback fails too but may; the recovery succeeds.
    scenario(
        "seed-000-on-failure-detailed-handler",
        "deploy-production rollback-deployment",
        0,
    ),
    // The optional cleanup's failure is ignored; the build fails and its handlers run.
    scenario(
        "seed-000-on-failure-simple-forms",
        "optional-cleanup.sh build-project",
        0,
    ),
    Scenario {
        dirs: &["dist"],
        ..scenario("seed-000-on-success-advanced", "", 0)
    },
    scenario("seed-000-on-success-simple-form", "", 0),
    // cargo test fails once; Claude analyses, cargo clean, and the retry passes.
    scenario("seed-000-progressive-error-handling", "cargo:1", 0),
    // The request fails twice and succeeds on the third attempt.
    scenario("seed-000-retry-config-jitter", "curl:2", 0),
    Scenario {
        error: "connection refused",
        ..scenario("seed-001-command-retry-config", "curl:2", 0)
    },
    // A compile error is not a network error: no retry, the workflow fails.
    Scenario {
        error: "error: undefined reference",
        ..scenario("seed-001-command-retry-network-only", "make", 1)
    },
    // The fetch hits a network error once; processing fails every attempt but may
    // (`on_failure: continue`); the upload passes on its second attempt. (The fallback after
    // five failed uploads would wait 15 s; `workflows/run/retry-fallback.yml` covers it.)
    Scenario {
        error: "connection refused",
        ..scenario(
            "seed-001-example1-command-level-only",
            "fetch-data.sh:1 process-data.sh upload-results.sh:1",
            0,
        )
    },
    // Not a seed: Claude settings and defaults (`workflows/ok/claude-settings.yml`); the
    // tests fail on both runs, and the handler's Claude call runs after each with its own settings.
    scenario("claude-settings", "cargo", 0),
    // Not a seed: the run-wide Claude settings (`workflows/ok/claude-usage-limit.yml`); no
    // limit is hit, so the run is an ordinary one.
    scenario("claude-usage-limit", "", 0),
    scenario("seed-002-merge-full-format", "", 0),
    scenario("seed-004-retry-config-fields", "curl:1", 0),
    // Not a seed: notifications (`workflows/ok/notify.yml`); the run finishes, so the
    // `finished` entry runs (curl, stubbed) with the secret masked in what it shows.
    Scenario {
        secret: "HOOK_TOKEN=hook-secret-value",
        ..scenario("notify", "", 0)
    },
];

fn is_standard(text: &str) -> bool {
    !text.contains("mode: mapreduce") && !text.lines().any(|l| l.starts_with("map:"))
}

#[test]
fn seed_standard_workflows_run_as_documented() {
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(root().join("workflows/ok")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.extension().is_some_and(|e| e == "yml")
            && is_standard(&std::fs::read_to_string(&path).unwrap())
        {
            seen.push(name);
        }
    }
    seen.sort();
    let mut listed: Vec<String> = SEED_SCENARIOS.iter().map(|s| s.name.to_owned()).collect();
    listed.sort();
    assert_eq!(seen, listed, "every standard seed example needs a scenario");
    // The scenarios wait out real backoff delays, so they run side by side.
    let runs: Vec<(&Scenario, String, Output)> = std::thread::scope(|scope| {
        let handles: Vec<_> = SEED_SCENARIOS
            .iter()
            .map(|s| {
                scope.spawn(move || {
                    let mut extra = BTreeMap::new();
                    extra.insert("stub-fail".to_owned(), s.fail.to_owned());
                    extra.insert("stub-error".to_owned(), s.error.to_owned());
                    extra.insert("dirs".to_owned(), s.dirs.join(" "));
                    if !s.secret.is_empty() {
                        extra.insert("secret-env".to_owned(), s.secret.to_owned());
                    }
                    let file = root().join(format!("workflows/ok/{}.yml", s.name));
                    let (scratch, output) = run_file(&file, &extra);
                    (s, report(&scratch, &output), output)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (s, report, output) in runs {
        snapshot("run/seeds", s.name, &report);
        check_exit(s.name, &output, &s.exit.to_string());
    }
}

/// A file of upstream's corpus, or `None` when the test named `test` is skipped for lack of
/// it (see `tests/support/external.rs`).
fn corpus(test: &str, path: &str) -> Option<PathBuf> {
    external::corpus_file(test, path)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Prodigy's lines (stderr), then what the commands printed (stdout, with `-v`).
fn shown(output: &Output) -> String {
    format!(
        "{}{}",
        stderr(output),
        String::from_utf8_lossy(&output.stdout)
    )
}

/// The session id that a failed or interrupted run names on its last line.
fn resume_id(output: &Output) -> String {
    let text = stderr(output);
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let at = last
        .find("prodigy resume -y ")
        .unwrap_or_else(|| panic!("the last line gives no resume hint:\n{text}"));
    last[at + "prodigy resume -y ".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

#[test]
fn corpus_standard_workflow_runs() {
    let Some(file) = corpus(
        "corpus_standard_workflow_runs",
        "examples/standard-workflow.yml",
    ) else {
        return;
    };
    let scratch = Scratch::new();
    std::fs::write(scratch.project().join("README.md"), "# demo\n").unwrap();
    std::fs::write(scratch.project().join("main.rs"), "fn main() {}\n").unwrap();
    scratch.commit();
    let output = scratch.run(&["run", "-v", file.to_str().unwrap()], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = shown(&output);
    assert!(text.contains("Found 1 Rust files"), "{text}");
    assert!(text.contains("README.md exists"), "{text}");
    assert!(text.contains("Workflow complete"), "{text}");
}

#[test]
fn corpus_capture_conditional_flow_runs() {
    let Some(file) = corpus(
        "corpus_capture_conditional_flow_runs",
        "examples/capture-conditional-flow.yml",
    ) else {
        return;
    };
    let scratch = Scratch::new();
    std::fs::write(
        scratch.project().join("Cargo.toml"),
        "[package]\nname = \"demo\"\nversion = \"1.2.3\"\n",
    )
    .unwrap();
    scratch.commit();
    // The generic stub's `cargo test` prints no test summary, so `test_count` does not parse
    // as a number: the step allows failure, and `should_bump` then reads an undefined variable.
    let output = scratch.run(&["run", "-v", file.to_str().unwrap()], &[]);
    let text = shown(&output);
    assert!(text.contains("is not a number"), "{text}");
    assert!(text.contains("undefined variable `test_count`"), "{text}");
    assert_eq!(output.status.code(), Some(1));
    // A `cargo` that reports 12 passing tests: every condition holds and the flow completes.
    let cargo = scratch.dir.path().join("bin/cargo");
    std::fs::remove_file(&cargo).unwrap();
    std::fs::write(
        &cargo,
        "#!/bin/sh\n[ \"$1\" = test ] && echo 'test result: ok. 12 passed; 0 failed'\nexit 0\n",
    )
    .unwrap();
    std::fs::set_permissions(&cargo, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let output = scratch.run(&["run", "-v", file.to_str().unwrap()], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("Running coverage analysis..."), "{text}");
    assert!(text.contains("Would bump version from 1.2.3"), "{text}");
    assert!(text.contains("Test Count: 12"), "{text}");
    assert!(text.contains("Deployment ready!"), "{text}");
}

#[test]
fn corpus_capture_json_processing_runs_but_for_its_unknown_filter() {
    let Some(file) = corpus(
        "corpus_capture_json_processing_runs_but_for_its_unknown_filter",
        "examples/capture-json-processing.yml",
    ) else {
        return;
    };
    let scratch = Scratch::new();
    // As written, the last step uses `|length:100`, which is not a filter: nothing runs.
    let output = scratch.run(&["run", file.to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("unknown filter `length`"));
    assert!(output.stdout.is_empty(), "diagnostics go to stderr");
    assert!(scratch.events().is_empty());
    // With the filter removed, steps 1 to 4 run; step 5 pastes a multi-line report into a
    // JSON string, which is not JSON, and the capture says so.
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("${final_summary|length:100}", "${final_summary.git.branch}");
    let copy = scratch.project().join("capture-json-processing.yml");
    std::fs::write(&copy, text).unwrap();
    let output = scratch.run(&["run", "-v", copy.to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(1));
    assert!(shown(&output).contains("Git Commit: "));
    assert!(stderr(&output).contains("capture `final_summary`: not JSON"));
    // Package and git captures flowed into the report.
    assert!(shown(&output).contains("Package: Package: test v1.0.0"));
    // The run works on its session branch.
    assert!(shown(&output).contains("Git Branch: prodigy-session-"));
}

#[test]
fn corpus_sensitive_masking_redacts_at_debug_verbosity() {
    let Some(file) = corpus(
        "corpus_sensitive_masking_redacts_at_debug_verbosity",
        "examples/test-sensitive-masking.yml",
    ) else {
        return;
    };
    let scratch = Scratch::new();
    let output = scratch.run(&["run", "-vv", file.to_str().unwrap()], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    for hidden in [
        "super_secret_password",
        "sk_test_123456789",
        "ghp_abcdefghijklmnop",
    ] {
        assert!(!text.contains(hidden), "{hidden} shown:\n{text}");
    }
    assert!(text.contains("env PASSWORD=***REDACTED***"), "{text}");
    assert!(text.contains("env USERNAME=john_doe"), "{text}");
    assert!(text.contains("env NORMAL_VAR=this_is_visible"), "{text}");
}

#[test]
fn corpus_environment_example_honours_env_profiles_and_secrets() {
    let Some(file) = corpus(
        "corpus_environment_example_honours_env_profiles_and_secrets",
        "workflows/environment-example.yml",
    ) else {
        return;
    };
    let scratch = Scratch::new();
    for dir in ["frontend", "backend", "deploy"] {
        std::fs::create_dir(scratch.project().join(dir)).unwrap();
    }
    std::fs::write(
        scratch.project().join(".env.production"),
        "DEPLOY_DIR=deploy\n",
    )
    .unwrap();
    scratch.commit();
    let file = file.to_str().unwrap();
    // Without the secret's source the run stops before the first step.
    let output = scratch.run(&["run", file, "--param", "branch=main"], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains("SECRET_API_KEY"));
    let env = [("SECRET_API_KEY", "key-0042")];
    let output = scratch.run(&["run", "-v", file, "--param", "branch=main"], &env);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("NODE_ENV=production API_URL=https://api.example.com"));
    assert!(
        text.contains("Deploying to production environment"),
        "{text}"
    );
    let output = scratch.run(
        &[
            "run",
            "-v",
            file,
            "--param",
            "branch=dev",
            "--profile",
            "testing",
        ],
        &env,
    );
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains("NODE_ENV=test API_URL=http://localhost:4000"),
        "{text}"
    );
    assert!(text.contains("Deploying to staging environment"), "{text}");
}

#[test]
fn corpus_test_resume_continues_after_the_fix() {
    let Some(corpus_file) = corpus(
        "corpus_test_resume_continues_after_the_fix",
        "examples/test-resume.yml",
    ) else {
        return;
    };
    let scratch = Scratch::new();
    let copy = scratch.project().join("test-resume.yml");
    std::fs::copy(corpus_file, &copy).unwrap();
    let path = copy.to_str().unwrap();
    let output = scratch.run(&["run", "-v", path], &[]);
    assert_eq!(output.status.code(), Some(1));
    let id = resume_id(&output);
    // Resuming the unchanged workflow runs the failing step again, and it fails again.
    let output = scratch.run(&["resume", &id], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    // Fix the step; a changed workflow resumes only with --force.
    let text = std::fs::read_to_string(&copy)
        .unwrap()
        .replace("exit 1", "echo fixed");
    std::fs::write(&copy, text).unwrap();
    let output = scratch.run(&["resume", "-v", &id], &[]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("--force"));
    let output = scratch.run(&["resume", "-v", "--force", &id], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(!text.contains("Step 1 - Starting workflow"), "{text}");
    assert!(
        text.contains("Step 4 - This should run on resume"),
        "{text}"
    );
    assert!(text.contains("Step 5 - Final step"), "{text}");
    // A completed session has nothing left to resume.
    let output = scratch.run(&["resume", &id], &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).contains("already completed"));
}

#[test]
fn resume_restores_the_captured_variables() {
    let scratch = Scratch::new();
    let file = scratch.project().join("flow.yml");
    std::fs::write(
        &file,
        "- shell: \"echo v1.2\"\n  capture: version\n- shell: \"test -f ready\"\n- shell: \"echo 'releasing ${version}'\"\n",
    )
    .unwrap();
    let output = scratch.run(&["run", file.to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(1));
    let id = resume_id(&output);
    // The run works in its session worktree: the fix goes there.
    std::fs::write(scratch.worktree(&id).join("ready"), "").unwrap();
    let output = scratch.run(&["resume", "-v", &id], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("releasing v1.2"), "{text}");
    assert!(
        !text.contains("[1/3]"),
        "the first step does not run again:\n{text}"
    );
}

#[test]
fn claude_gets_the_documented_flags_and_automation_mode() {
    let scratch = Scratch::new();
    let cli = scratch.dir.path().join("bin/fake-claude");
    std::fs::write(
        &cli,
        format!(
            "#!/bin/sh\necho \"automation=$PRODIGY_AUTOMATION args=$*\" >&2\nexec {} \"$@\"\n",
            root().join("tests/run/bin/claude").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cli, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let file = scratch.project().join("flow.yml");
    std::fs::write(&file, "- claude: \"/prodigy-lint src\"\n").unwrap();
    let output = scratch.run(
        &["run", "-vv", file.to_str().unwrap()],
        &[(
            "PRODIGY_CLAUDE_COMMAND",
            &format!("{} --model x", cli.display()),
        )],
    );
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    // The prompt is no argument: it goes to standard input, and `-vv` shows it so.
    assert!(
        text.contains(
            "automation=true args=--model x -p --output-format stream-json --verbose --dangerously-skip-permissions\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("--dangerously-skip-permissions <<< '/prodigy-lint src'\n"),
        "{text}"
    );
    // `-vv` shows how each command ended and how long it took.
    assert!(
        regex::Regex::new(r"exited 0 in [0-9]+\.[0-9]{3}s")
            .unwrap()
            .is_match(&text),
        "{text}"
    );
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let scratch = Scratch::new();
    let marker = format!("sleep 34.{}", std::process::id());
    let file = scratch.project().join("stubborn.yml");
    std::fs::write(
        &file,
        format!("- shell: \"trap '' TERM; {marker}; echo survived\"\n  timeout: 1s\n"),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let output = scratch.run(&["run", "--grace", "1", file.to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains("timed out after 1s"));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "SIGKILL came after the grace period, not after the sleep"
    );
    let left = survivors(&marker);
    assert!(left.is_empty(), "orphans: {left:?}");
}

#[test]
fn a_forced_resume_adopts_the_new_version() {
    let scratch = Scratch::new();
    let file = scratch.project().join("flow.yml");
    std::fs::write(&file, "- shell: \"echo one\"\n- shell: \"exit 3\"\n").unwrap();
    let output = scratch.run(&["run", file.to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(1));
    let id = resume_id(&output);
    // Still failing after the edit: the forced resume fails again.
    std::fs::write(&file, "- shell: \"echo one\"\n- shell: \"exit 4\"\n").unwrap();
    let output = scratch.run(&["resume", "--force", &id], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    // The edited file is now the session's: resuming again needs no --force.
    let output = scratch.run(&["resume", &id], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(!stderr(&output).contains("--force"), "{}", stderr(&output));
}

/// Watches the run's output, blocks in READY until the moment has come (a bounded wait on
/// what the run writes or says: `watch::until_changed`, `Watched::wait_for`), then sends
/// SIGNAL and returns what the run printed once it ended.
fn interrupt_when(
    child: std::process::Child,
    signal: nix::sys::signal::Signal,
    ready: impl FnOnce(&mut watch::Watched),
) -> Output {
    let mut run = watch::Watched::new(child);
    ready(&mut run);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(run.id()).unwrap());
    nix::sys::signal::kill(pid, signal).unwrap();
    run.finish()
}

#[test]
fn corpus_sequential_resume_after_interrupt() {
    let Some(corpus_file) = corpus(
        "corpus_sequential_resume_after_interrupt",
        "workflows/tests/test-sequential-resume.yml",
    ) else {
        return;
    };
    let scratch = Scratch::new();
    // The workflow writes to a fixed path in /tmp; point it into the scratch directory.
    let log = scratch.dir.path().join("resume-test.txt");
    let text = std::fs::read_to_string(corpus_file)
        .unwrap()
        .replace("/tmp/prodigy-resume-test.txt", log.to_str().unwrap());
    let copy = scratch.project().join("test-sequential-resume.yml");
    std::fs::write(&copy, text).unwrap();
    let child = scratch.spawn(&["run", "-v", copy.to_str().unwrap()]);
    // Interrupt during step 3, once it has written its line.
    let output = interrupt_when(child, nix::sys::signal::Signal::SIGINT, |_| {
        watch::until_changed(scratch.dir.path(), "step 3", || {
            std::fs::read_to_string(&log).is_ok_and(|t| t.contains("step3-complete"))
        });
    });
    assert_eq!(output.status.code(), Some(130), "{}", stderr(&output));
    let id = resume_id(&output);
    let output = scratch.run(&["resume", "-v", &id], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(!text.contains("Step 1: Creating test file"), "{text}");
    assert!(!text.contains("Step 2: Appending"), "{text}");
    assert!(text.contains("Step 3:"), "{text}");
    assert!(text.contains("All steps completed!"), "{text}");
    assert!(!log.exists(), "step 5 removes the file");
}

/// A standard run killed with SIGKILL at any point resumes where its last durable
/// checkpoint says: no step is lost, every step runs in order, and only the few steps that
/// ended while their checkpoints were being synced (at most 16) run again. Killed after
/// 2, 9 and 30 of 40 steps (once step 2 ran, the first checkpoint is on disk); each step
/// takes 50 ms, so that the run is still going when the kill comes.
#[test]
fn a_standard_run_killed_at_any_step_resumes_from_its_last_durable_checkpoint() {
    for kill_at in [2, 9, 30] {
        let scratch = Scratch::new();
        let log = scratch.dir.path().join("steps.log");
        let file = scratch.project().join("steps.yml");
        let steps = (1..=40)
            .map(|n| {
                format!(
                    "  - shell: \": {0}; echo {n} >> {0}; sleep 0.05\"\n",
                    log.display()
                )
            })
            .collect::<Vec<_>>()
            .concat();
        std::fs::write(&file, format!("name: steps\ncommands:\n{steps}")).unwrap();
        let child = scratch.spawn(&["run", file.to_str().unwrap()]);
        let output = interrupt_when(child, nix::sys::signal::Signal::SIGKILL, |_| {
            watch::until_changed(scratch.dir.path(), "the steps", || {
                std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() >= kill_at)
            });
        });
        assert_eq!(output.status.code(), None, "killed by a signal");
        let left = survivors(&format!("sh -c : {}", log.display()));
        assert!(left.is_empty(), "steps still running: {left:?}");
        let sessions = scratch.state().join("sessions");
        let session = std::fs::read_dir(&sessions)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .file_name()
            .to_string_lossy()
            .into_owned();
        let output = scratch.run(&["resume", &session], &[]);
        assert!(
            output.status.success(),
            "kill at {kill_at}: {}",
            stderr(&output)
        );
        let ran: Vec<usize> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        // Steps 1 to K in order (the killed run; a step starting as it was killed may
        // still have written its line), then steps R to 40 in order (the resumed run).
        let k = (1..ran.len())
            .find(|&i| ran[i] != ran[i - 1] + 1)
            .unwrap_or(ran.len());
        let (killed, resumed) = ran.split_at(k);
        assert_eq!(killed, (1..=k).collect::<Vec<_>>(), "kill at {kill_at}");
        let r = resumed.first().copied().unwrap_or(k + 1);
        assert_eq!(
            resumed,
            (r..=40).collect::<Vec<_>>(),
            "kill at {kill_at}: {ran:?}"
        );
        assert!(
            k >= kill_at && r <= k + 1 && r + 17 >= k,
            "kill at {kill_at}: ran {k} steps, resumed at step {r}"
        );
        let journal = sessions.join(&session).join("checkpoint.journal");
        assert!(!journal.exists(), "the journal is compacted at the end");
    }
}

/// The live processes whose command line starts with MARKER, with that line.
fn survivors_now(marker: &str) -> Vec<(i32, String)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
            let line = std::fs::read(e.path().join("cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&line).replace('\0', " ")))
        })
        .filter(|(_, c)| c.starts_with(marker))
        .collect()
}

/// The command lines of the processes that start with MARKER and still run after up to
/// 5 s for them to end (a loaded machine can take a moment): each one's end is waited for
/// (`watch::left_after`), not polled.
fn survivors(marker: &str) -> Vec<String> {
    let pids = || {
        survivors_now(marker)
            .into_iter()
            .map(|(pid, _)| pid)
            .collect()
    };
    let left = watch::left_after(std::time::Duration::from_secs(5), pids);
    survivors_now(marker)
        .into_iter()
        .filter(|(pid, _)| left.contains(pid))
        .map(|(_, line)| line)
        .collect()
}

#[test]
fn timeout_kills_the_whole_process_group() {
    let scratch = Scratch::new();
    let marker = format!("sleep 31.{}", std::process::id());
    let file = scratch.project().join("slow.yml");
    std::fs::write(
        &file,
        format!("- shell: \"{marker} & {marker} & wait\"\n  timeout: 1s\n"),
    )
    .unwrap();
    let output = scratch.run(&["run", file.to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("timed out after 1s"));
    let left = survivors(&marker);
    assert!(left.is_empty(), "orphans: {left:?}");
}

/// Runs a workflow whose second step sleeps, stops it with SIGNAL once the sleep was started
/// (the step touches `sleeping` then), and checks that nothing survives and the run ends as
/// interrupted with EXIT.
fn stop_with(signal: nix::sys::signal::Signal, exit: i32, tag: u32) {
    let scratch = Scratch::new();
    let marker = format!("sleep {tag}.{}", std::process::id());
    let sleeping = scratch.dir.path().join("sleeping");
    let file = scratch.project().join("long.yml");
    std::fs::write(
        &file,
        format!(
            "- shell: \"echo first\"\n- shell: \"echo started; {marker} & touch {}; wait\"\n",
            sleeping.display()
        ),
    )
    .unwrap();
    let child = scratch.spawn(&["run", "-v", file.to_str().unwrap()]);
    let output = interrupt_when(child, signal, |_| {
        watch::until_changed(scratch.dir.path(), "the sleep", || sleeping.exists());
    });
    assert_eq!(output.status.code(), Some(exit), "{}", stderr(&output));
    assert!(stderr(&output).contains("prodigy resume"));
    let left = survivors(&marker);
    assert!(left.is_empty(), "orphans: {left:?}");
    let events = scratch.events();
    let last = events.last().unwrap();
    assert_eq!(last["event_type"], "workflow_finished");
    assert_eq!(last["outcome"], "interrupted");
}

#[test]
fn interrupt_terminates_children_and_checkpoints() {
    stop_with(nix::sys::signal::Signal::SIGINT, 130, 32);
}

#[test]
fn sigterm_terminates_children_and_exits_143() {
    stop_with(nix::sys::signal::Signal::SIGTERM, 143, 33);
}

#[test]
fn secrets_never_reach_the_disk() {
    let scratch = Scratch::new();
    let file = root().join("workflows/run/secrets-masked.yml");
    let output = scratch.run(
        &["run", "-vv", file.to_str().unwrap()],
        &[("DEPLOY_TOKEN", "s3cr3t-value-42")],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!stderr(&output).contains("s3cr3t-value-42"));
    let mut files = Vec::new();
    collect_files(&scratch.home(), &mut files);
    assert!(files.len() >= 2, "events and checkpoint: {files:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(
            !text.contains("s3cr3t-value-42"),
            "{} leaks the secret",
            f.display()
        );
    }
}

#[test]
fn dry_run_prints_the_plan_and_runs_nothing() {
    let scratch = Scratch::new();
    let file = root().join("workflows/run/write-file-and-params.yml");
    let output = scratch.run(
        &[
            "run",
            "--dry-run",
            file.to_str().unwrap(),
            "--param",
            "target=prod",
        ],
        &[],
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(text.contains("write_file: out/config.json"), "{text}");
    assert!(text.contains("shell: cat out/config.json"), "{text}");
    assert!(!scratch.project().join("out").exists());
    assert!(scratch.events().is_empty());
}

#[test]
fn missing_claude_stops_before_the_first_step() {
    let scratch = Scratch::new();
    let file = root().join("workflows/run/claude-steps.yml");
    let output = scratch.run(
        &["run", file.to_str().unwrap()],
        &[("PRODIGY_CLAUDE_COMMAND", "no-such-claude-cli")],
    );
    assert_eq!(output.status.code(), Some(1));
    let text = stderr(&output);
    assert!(text.contains("no-such-claude-cli"), "{text}");
    assert!(text.contains("PRODIGY_CLAUDE_COMMAND"), "{text}");
    assert!(scratch.events().is_empty());
}

mod bootstrap;
mod budget;
mod claude;
mod claude_settings;
mod crash;
mod examples;
mod faults;
mod friction;
mod graph_status;
mod guides;
mod items;
mod live;
mod logs;
mod mapreduce;
mod notify;
mod paths;
mod reap;
mod secrets;
mod variables;
mod verify;
mod worktree;

#[test]
fn env_files_are_templates_and_a_missing_one_is_reported() {
    let scratch = Scratch::new();
    let dir = scratch.dir.path().join("envs");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("app.env"), "GREETING=hello from the file\n").unwrap();
    let file = scratch.project().join("env.yml");
    std::fs::write(
        &file,
        "env_files:\n  - \"${ENV_DIR}/app.env\"\n  - \"${ENV_DIR}/missing.env\"\ncommands:\n  - shell: \"echo $GREETING\"\n",
    )
    .unwrap();
    let output = scratch.run(
        &["run", "-v", file.to_str().unwrap()],
        &[("ENV_DIR", dir.to_str().unwrap())],
    );
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("hello from the file"), "{text}");
    assert!(
        text.contains("warning: env file") && text.contains("missing.env"),
        "{text}"
    );
}

#[test]
fn a_capture_of_neither_stream_is_empty_but_keeps_its_other_fields() {
    let scratch = Scratch::new();
    let file = scratch.project().join("flow.yml");
    std::fs::write(
        &file,
        "- shell: \"echo out; echo err >&2\"\n  capture: quiet\n  capture_streams:\n    stdout: false\n    stderr: false\n    exit_code: true\n- shell: \"echo \\\"[${quiet|shell}] code ${quiet.exit_code} err ${quiet.stderr|shell}\\\"\"\n",
    )
    .unwrap();
    let output = scratch.run(&["run", "-v", "--no-worktree", file.to_str().unwrap()], &[]);
    let text = shown(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("[''] code 0 err 'err'"), "{text}");
}

#[test]
fn a_resumed_run_still_reports_the_steps_that_failed_and_were_continued() {
    let scratch = Scratch::new();
    let file = scratch.project().join("flow.yml");
    std::fs::write(
        &file,
        "- shell: \"exit 1\"\n  on_failure: \"echo handled\"\n- shell: \"test -f ready\"\n- shell: \"echo done\"\n",
    )
    .unwrap();
    let line = "warning: 1 step failed and was continued: `exit 1` (its `on_failure` handler ran)";
    let output = scratch.run(&["run", file.to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains(line), "{}", stderr(&output));
    let id = resume_id(&output);
    std::fs::write(scratch.worktree(&id).join("ready"), "").unwrap();
    let output = scratch.run(&["resume", &id], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains(line),
        "the resumed run forgot step 1:\n{text}"
    );
    let finished: Vec<Value> = scratch
        .events()
        .into_iter()
        .filter(|e| e["event_type"] == "workflow_finished")
        .collect();
    assert_eq!(finished.len(), 2);
    assert_eq!(finished[1]["outcome"], "completed");
    assert_eq!(finished[1]["failed_continued"], 1);
}

/// What commands print goes to stdout, as they printed it; prodigy's own lines to stderr,
/// so `prodigy run -v wf.yml > out.txt` keeps the results.
#[test]
fn a_commands_output_goes_to_stdout_and_prodigys_lines_to_stderr() {
    let scratch = Scratch::new();
    let file = scratch.project().join("wf.yml");
    std::fs::write(
        &file,
        "- shell: \"echo result-one; echo result-two\"\n- shell: \"echo to-stderr >&2\"\n",
    )
    .unwrap();
    let output = scratch.run(&["run", "-v", "--no-worktree", file.to_str().unwrap()], &[]);
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    let out = String::from_utf8_lossy(&output.stdout);
    assert_eq!(out, "result-one\nresult-two\nto-stderr\n");
    assert!(
        !text
            .lines()
            .any(|l| l.contains("│") || l.trim() == "result-two"),
        "{text}"
    );
    assert!(text.contains("[1/2] echo result-one"), "{text}");
    assert!(text.contains("completed"), "{text}");
}

/// `--color always` colours `run`'s outcome marks and prefixes too; `NO_COLOR` (with `auto`,
/// off a terminal anyway) leaves them plain.
#[test]
fn color_always_colours_the_marks_of_a_run() {
    let scratch = Scratch::new();
    let file = scratch.project().join("wf.yml");
    std::fs::write(&file, "- shell: \"true\"\n").unwrap();
    let file = file.to_str().unwrap();
    let output = scratch.run(&["run", "--color", "always", "--no-worktree", file], &[]);
    let text = stderr(&output);
    assert!(
        text.contains("\u{1b}[32m✓\u{1b}[0m workflow completed"),
        "{text:?}"
    );
    std::fs::write(scratch.project().join("bad.yml"), "- shell: \"exit 3\"\n").unwrap();
    let bad = scratch.project().join("bad.yml");
    let args = [
        "run",
        "--color",
        "always",
        "--no-worktree",
        bad.to_str().unwrap(),
    ];
    let text = stderr(&scratch.run(&args, &[]));
    assert!(text.contains("\u{1b}[31m✗\u{1b}[0m"), "{text:?}");
    let plain = stderr(&scratch.run(&["run", "--no-worktree", file], &[]));
    assert!(!plain.contains('\u{1b}'), "{plain:?}");
}
