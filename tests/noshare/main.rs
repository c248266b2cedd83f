//! `--no-shared-fs` without Slurm (docs/slurm.md, "Without a shared filesystem"): the
//! agents run as processes of this machine (`--executor local --no-shared-fs`) that are
//! given no path of the coordinator's: each works in a clone of its own under a node
//! directory (`PRODIGY_NOSHARE_DIR`), fetched from the repository the coordinator serves
//! over HTTP with the job's secret, and pushes its commits and outcome back.

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test helpers fail loudly and read what the runs wrote directly"
)]

use std::path::PathBuf;
use std::process::{Command, Output};

use assert_cmd::cargo::CommandCargoExt;

#[path = "../support/job.rs"]
mod job;
use job::{dead_letters, git_identity, git_in, job_id, repo_with_workflow, stderr};

/// A git repository with WORKFLOW as `wf.yml`, a `$PRODIGY_HOME` and a node directory
/// beside it.
struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new(workflow: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let p = Project { dir };
        std::fs::create_dir(p.repo()).unwrap();
        std::fs::create_dir(p.node()).unwrap();
        repo_with_workflow(&p.repo(), workflow);
        p
    }

    fn repo(&self) -> PathBuf {
        self.dir.path().join("repo")
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// The agents' node directory: their clones and their own `PRODIGY_HOME`.
    fn node(&self) -> PathBuf {
        self.dir.path().join("node")
    }

    /// A file outside the repository that agents append to.
    fn log(&self) -> PathBuf {
        self.dir.path().join("runs.log")
    }

    fn git(&self, args: &[&str]) -> String {
        git_in(&self.repo(), args)
    }

    fn prodigy(&self, args: &[&str]) -> Output {
        Command::cargo_bin("prodigy")
            .unwrap()
            .args(args)
            .current_dir(self.repo())
            .env("PRODIGY_HOME", self.home())
            .env("PRODIGY_NOSHARE_DIR", self.node())
            .env("RUNS_LOG", self.log())
            .envs(git_identity())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    }

    fn job_dir(&self, job: &str) -> PathBuf {
        job::job_dir(&self.home(), job)
    }
}

#[test]
fn every_item_runs_once_in_a_clone_of_its_own_and_its_commit_lands_once() {
    let p = Project::new(
        r#"name: noshare-all-items
mode: mapreduce
map:
  input: "seq 1 6"
  max_parallel: 2
  agent_template:
    - shell: 'echo "$ITEM $(pwd)" >> "$RUNS_LOG" && echo "$ITEM" > "item-$ITEM.txt" && git add "item-$ITEM.txt" && git commit -qm "item $ITEM"'
reduce:
  - shell: "echo '${map.successful} of ${map.total}'"
"#,
    );
    let out = p.prodigy(&["run", "-y", "--no-shared-fs", "wf.yml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job = job_id(&out);
    // Each item ran exactly once, in a clone under the node directory, not in the
    // coordinator's repository or worktrees.
    let log = std::fs::read_to_string(p.log()).unwrap();
    let mut items: Vec<&str> = log.lines().map(|l| l.split(' ').next().unwrap()).collect();
    items.sort_unstable();
    assert_eq!(items, ["1", "2", "3", "4", "5", "6"], "{log}");
    let node = p.node().display().to_string();
    assert!(
        log.lines()
            .all(|l| l.split(' ').nth(1).unwrap().starts_with(&node)),
        "an item ran outside the node directory {node}:\n{log}"
    );
    // At most two clones (`max_parallel: 2`), reused from item to item.
    let clones: Vec<String> = log
        .lines()
        .map(|l| l.split(' ').nth(1).unwrap().to_owned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert!(clones.len() <= 2, "{clones:?}");
    // Every item's commit reached the branch the run started from, once.
    for n in 1..=6 {
        let text = std::fs::read_to_string(p.repo().join(format!("item-{n}.txt"))).unwrap();
        assert_eq!(text.trim(), n.to_string());
    }
    assert_eq!(
        p.git(&["log", "--oneline", "--grep", "^item "])
            .lines()
            .count(),
        6
    );
    // No item's ref is left, in the served repository or the project.
    let bare = p.job_dir(&job).join("noshare/repo.git");
    let left = Command::new("git")
        .arg(format!("--git-dir={}", bare.display()))
        .args(["for-each-ref", "--format=%(refname)", "refs/prodigy/"])
        .output()
        .unwrap();
    let left = String::from_utf8_lossy(&left.stdout);
    assert!(
        left.lines().all(|r| r.ends_with("/task")),
        "refs left in the served repository:\n{left}"
    );
    assert_eq!(p.git(&["for-each-ref", "refs/prodigy/"]), "");
}

#[test]
fn a_job_none_of_whose_agents_could_start_fails_and_says_why() {
    let p = Project::new(
        r#"name: noshare-no-launch
mode: mapreduce
map:
  input: "seq 1 3"
  agent_template:
    - shell: 'echo "$ITEM" >> "$RUNS_LOG"'
"#,
    );
    // The node directory is a file: no clone can be made there.
    std::fs::remove_dir(p.node()).unwrap();
    std::fs::write(p.node(), "").unwrap();
    let out = p.prodigy(&["run", "-y", "--no-shared-fs", "wf.yml"]);
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let job = job_id(&out);
    assert!(
        text.contains(&format!("no agent of job {job} started")),
        "{text}"
    );
    assert!(!p.log().exists(), "an item ran");
    // Each item's failure says why, from the agent's own words.
    let dlq = dead_letters(&p.repo(), &p.home(), &job);
    assert_eq!(dlq.len(), 3);
    for item in &dlq {
        let why = item["failure_history"][0]["error_message"]
            .as_str()
            .unwrap();
        assert!(why.contains("without pushing its outcome"), "{why}");
        assert!(why.contains("Not a directory"), "{why}");
    }
}

#[test]
fn dlq_retry_runs_a_failed_item_again_without_a_shared_filesystem() {
    let p = Project::new(
        r#"name: noshare-retry
mode: mapreduce
map:
  input: "seq 1 3"
  agent_template:
    - shell: 'test "$ITEM" != "$FAIL_ITEM" && echo "$ITEM" > "item-$ITEM.txt" && git add "item-$ITEM.txt" && git commit -qm "item $ITEM"'
"#,
    );
    // The agents are processes of this machine: they inherit the coordinator's environment.
    let mut first = Command::cargo_bin("prodigy").unwrap();
    let out = first
        .args(["run", "-y", "--no-shared-fs", "wf.yml"])
        .current_dir(p.repo())
        .env("PRODIGY_HOME", p.home())
        .env("PRODIGY_NOSHARE_DIR", p.node())
        .env("FAIL_ITEM", "2")
        .envs(git_identity())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let job = job_id(&out);
    assert!(!p.repo().join("item-2.txt").exists());
    let out = p.prodigy(&["dlq", "retry", "-y", "--no-shared-fs", &job]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Run again as a process that pushed its outcome, not as a local agent.
    let result = std::fs::read(p.job_dir(&job).join("noshare/item_1.result.json")).unwrap();
    let result: serde_json::Value = serde_json::from_slice(&result).unwrap();
    assert_eq!(result["end"], "succeeded", "{result}");
    for n in 1..=3 {
        assert!(p.repo().join(format!("item-{n}.txt")).exists(), "item {n}");
    }
    assert_eq!(
        p.git(&["log", "--oneline", "--grep", "^item "])
            .lines()
            .count(),
        3
    );
}

#[test]
fn containers_without_a_shared_filesystem_are_refused_before_anything_starts() {
    let p = Project::new(
        r#"name: noshare-container
mode: mapreduce
map:
  input: "seq 1 2"
  agent_template:
    - shell: 'echo "$ITEM" >> "$RUNS_LOG"'
"#,
    );
    let out = p.prodigy(&[
        "run",
        "-y",
        "--executor",
        "container",
        "--no-shared-fs",
        "wf.yml",
    ]);
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("`--no-shared-fs` runs agents as processes of this machine or as Slurm tasks, not in containers"),
        "{text}"
    );
    assert!(!p.log().exists(), "an item ran outside a container");
}

/// A directory of fake Slurm client tools that never reach their controller; `sbatch`
/// appends its arguments to `sbatch.log` beside them.
fn unreachable_slurm(dir: &std::path::Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let bin = dir.join("slurm-bin");
    std::fs::create_dir_all(&bin).unwrap();
    for tool in ["sbatch", "squeue", "scancel", "scontrol"] {
        let log = if tool == "sbatch" {
            format!("echo \"$*\" >> '{}'\n", dir.join("sbatch.log").display())
        } else {
            String::new()
        };
        let path = bin.join(tool);
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\n{log}echo '{tool}: error: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    bin
}

#[test]
fn dlq_retry_halts_once_the_slurm_controller_is_lost_and_leaves_every_item_queued() {
    let p = Project::new(
        r#"name: noshare-retry-lost
mode: mapreduce
map:
  input: "seq 1 3"
  max_parallel: 1
  agent_template:
    - shell: 'test -z "$FAIL" && echo "$ITEM" >> "$RUNS_LOG"'
"#,
    );
    let mut first = Command::cargo_bin("prodigy").unwrap();
    let out = first
        .args(["run", "-y", "wf.yml"])
        .current_dir(p.repo())
        .env("PRODIGY_HOME", p.home())
        .env("FAIL", "1")
        .envs(git_identity())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let job = job_id(&out);
    let bin = unreachable_slurm(p.dir.path());
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::cargo_bin("prodigy")
        .unwrap()
        .args([
            "dlq",
            "retry",
            "-y",
            "--executor",
            "slurm",
            "--no-shared-fs",
            "--serve-addr",
            "127.0.0.1:0",
            &job,
        ])
        .current_dir(p.repo())
        .env("PRODIGY_HOME", p.home())
        .env("PRODIGY_NOSHARE_DIR", p.node())
        .env("RUNS_LOG", p.log())
        .env("PATH", path)
        .env("PRODIGY_SLURM_UNREACHABLE_SECS", "1")
        .env("SLURM_CONF", p.dir.path().join("slurm.conf"))
        .env_remove("PRODIGY_SBATCH_ARGS")
        .envs(git_identity())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = stderr(&out);
    // It stops, saying why, as a failure (not an interrupt), and marks nothing for review.
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("has answered none of prodigy's questions"),
        "{text}"
    );
    // What to run next is the retry again, not a `resume-job` of the job.
    assert!(
        text.contains(&format!("then run `prodigy dlq retry -y {job}` again")),
        "{text}"
    );
    assert!(!text.contains("resume-job"), "{text}");
    assert!(!text.contains("manual review"), "{text}");
    assert!(!text.contains("interrupted"), "{text}");
    assert!(text.contains("3 items remain"), "{text}");
    // Only the first item was ever submitted; no item ran.
    let submitted = std::fs::read_to_string(p.dir.path().join("sbatch.log")).unwrap();
    let arrays: std::collections::BTreeSet<&str> = submitted
        .split_whitespace()
        .filter(|w| w.starts_with("--array="))
        .collect();
    assert_eq!(arrays.len(), 1, "{submitted}");
    assert!(!p.log().exists(), "an item ran");
    // Every item stays in the queue, with no failure added by the retry that never ran it.
    let dlq = p.prodigy(&["dlq", "show", &job, "--format", "json"]);
    let dlq: Vec<serde_json::Value> = serde_json::from_slice(&dlq.stdout).unwrap();
    assert_eq!(dlq.len(), 3, "{dlq:?}");
    assert!(dlq.iter().all(|i| i["failure_count"] == 1), "{dlq:?}");
}
