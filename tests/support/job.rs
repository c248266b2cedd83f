//! What the agent-backend test binaries (`tests/noshare`, `tests/slurm`, `tests/slurm_noshare`,
//! `tests/container`) share about a job: its id as a run printed it, where its state lives, and
//! git as the test user.

#![allow(dead_code, reason = "each test binary uses part of this module")]

use std::path::{Path, PathBuf};
use std::process::Output;

/// Git as the test user, whatever the machine's git configuration (signing, hooks).
pub(crate) fn git_identity() -> [(&'static str, &'static str); 6] {
    [
        ("GIT_AUTHOR_NAME", "t"),
        ("GIT_AUTHOR_EMAIL", "t@example.com"),
        ("GIT_COMMITTER_NAME", "t"),
        ("GIT_COMMITTER_EMAIL", "t@example.com"),
        ("GIT_CONFIG_GLOBAL", "/dev/null"),
        ("GIT_CONFIG_NOSYSTEM", "1"),
    ]
}

/// What a command printed on stderr.
pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The job id a run printed.
pub(crate) fn job_id(out: &Output) -> String {
    let text = stderr(out);
    let re = regex::Regex::new(r"job (mapreduce-[0-9a-z-]+) started").unwrap();
    re.captures(&text)
        .unwrap_or_else(|| panic!("no job id in:\n{text}"))[1]
        .to_owned()
}

/// The state directory of JOB under HOME, whose one project it is.
pub(crate) fn job_dir(home: &Path, job: &str) -> PathBuf {
    let state = home.join("state");
    let repo = std::fs::read_dir(&state).unwrap().next().unwrap().unwrap();
    repo.path().join("mapreduce/jobs").join(job)
}

/// The dead letters of JOB, as `prodigy dlq show --format json` prints them from REPO, whose
/// state is under HOME.
pub(crate) fn dead_letters(repo: &Path, home: &Path, job: &str) -> Vec<serde_json::Value> {
    use assert_cmd::cargo::CommandCargoExt;
    let out = std::process::Command::cargo_bin("prodigy")
        .unwrap()
        .args(["dlq", "show", job, "--format", "json"])
        .current_dir(repo)
        .env("PRODIGY_HOME", home)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("dlq show printed no JSON ({e}): {}", stderr(&out)))
}

/// Runs git ARGS in DIR as the test user, and returns what it printed on stdout.
pub(crate) fn git_in(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .envs(git_identity())
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Makes DIR (which exists) a repository on `main` whose one commit holds `wf.yml`, WORKFLOW.
pub(crate) fn repo_with_workflow(dir: &Path, workflow: &str) {
    std::fs::write(dir.join("wf.yml"), workflow).unwrap();
    git_in(dir, &["init", "-q", "-b", "main"]);
    git_in(dir, &["add", "wf.yml"]);
    git_in(dir, &["commit", "-qm", "workflow"]);
}
