//! `--executor slurm --no-shared-fs` against a real Slurm cluster of its own (docs/slurm.md,
//! "Without a shared filesystem"): a one-node cluster that `scripts/slurm-cluster` starts
//! under `/tmp/prodigy-slurm-noshare`, named `prodigy-noshare`, with its own ports and munge,
//! so that it never touches the cluster of `tests/slurm`. The agents are given no path of
//! the coordinator's: they fetch the job from the repository it serves and push back.
//! Skipped with a line saying why when not root or without Slurm; under CI it must run.
//! Its scenarios take the cluster one at a time.

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test helpers fail loudly and read what the runs wrote directly"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use assert_cmd::cargo::CommandCargoExt;
use serde_json::Value;

#[path = "../support/external.rs"]
mod external;

/// This binary's cluster: its directory and name (never the ones of `tests/slurm`).
const DIR: &str = "/tmp/prodigy-slurm-noshare";
const NAME: &str = "prodigy-noshare";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The cluster's `SLURM_CONF`, or why the tests skip.
static UP: OnceLock<Result<String, String>> = OnceLock::new();

/// One scenario at a time on the cluster.
static TURN: Mutex<()> = Mutex::new(());

/// Whether the cluster is up; `false` after a skip line.
fn cluster(test: &str) -> bool {
    let up = UP.get_or_init(|| {
        if !nix::unistd::Uid::effective().is_root() {
            return Err("starting a Slurm cluster needs root".into());
        }
        let out = Command::new(root().join("scripts/slurm-cluster"))
            .args(["start", "--until-exit", &std::process::id().to_string()])
            .env("PRODIGY_SLURM_DIR", DIR)
            .env("PRODIGY_SLURM_NAME", NAME)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        match out.status.code() {
            Some(0) => {
                let printed = String::from_utf8_lossy(&out.stdout).into_owned();
                let conf = printed
                    .lines()
                    .find_map(|l| l.strip_prefix("SLURM_CONF="))
                    .unwrap_or_else(|| panic!("no SLURM_CONF= in:\n{printed}\n{said}"));
                Ok(conf.to_owned())
            }
            Some(2) => {
                assert!(
                    !external::ci::required() || !Path::new("/usr/bin/apt-get").exists(),
                    "CI must not skip the Slurm tests: .ci/run installs Slurm as root with apt\n{said}"
                );
                Err(format!("Slurm is not installed (scripts/install-slurm): {said}"))
            }
            Some(3) => panic!(
                "a Slurm controller that scripts/slurm-cluster did not start answers on its port; the tests refuse to use it:\n{said}"
            ),
            _ => panic!("scripts/slurm-cluster start failed:\n{said}"),
        }
    });
    match up {
        Ok(_) => true,
        Err(why) => {
            external::skip_line(test, why.trim());
            false
        }
    }
}

fn slurm(program: &str) -> Command {
    let mut cmd = Command::new(program);
    if let Some(Ok(conf)) = UP.get() {
        cmd.env("SLURM_CONF", conf);
    }
    cmd
}

/// A git repository with WORKFLOW as `wf.yml`, a `$PRODIGY_HOME` and the agents' node
/// directory beside it, and the address the repository is served at (a port found free).
struct Project {
    dir: tempfile::TempDir,
    addr: String,
}

impl Project {
    fn new(workflow: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let p = Project {
            dir,
            addr: format!("127.0.0.1:{port}"),
        };
        std::fs::create_dir(p.repo()).unwrap();
        std::fs::write(p.repo().join("wf.yml"), workflow).unwrap();
        p.git(&["init", "-q", "-b", "main"]);
        p.git(&["add", "wf.yml"]);
        p.git(&["commit", "-qm", "workflow"]);
        p
    }

    fn repo(&self) -> PathBuf {
        self.dir.path().join("repo")
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn node(&self) -> PathBuf {
        self.dir.path().join("node")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("runs.log")
    }

    fn git(&self, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(args)
            .current_dir(self.repo())
            .envs(git_identity())
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `prodigy ARGS --executor slurm --no-shared-fs --serve-addr ADDR` in the project.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::cargo_bin("prodigy").unwrap();
        cmd.args(args)
            .args([
                "--executor",
                "slurm",
                "--no-shared-fs",
                "--serve-addr",
                &self.addr,
            ])
            .current_dir(self.repo())
            .env("PRODIGY_HOME", self.home())
            .env("PRODIGY_NOSHARE_DIR", self.node())
            .env("RUNS_LOG", self.log())
            .env_remove("PRODIGY_SBATCH_ARGS")
            .envs(git_identity())
            .stdin(std::process::Stdio::null());
        if let Some(Ok(conf)) = UP.get() {
            cmd.env("SLURM_CONF", conf);
        }
        cmd
    }

    fn job_dir(&self, job: &str) -> PathBuf {
        let state = self.home().join("state");
        let repo = std::fs::read_dir(&state).unwrap().next().unwrap().unwrap();
        repo.path().join("mapreduce/jobs").join(job)
    }

    fn results(&self, job: &str) -> Vec<Value> {
        std::fs::read_to_string(self.job_dir(job).join("results.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// No item's ref is left in the served repository nor the project.
    fn refs_cleaned(&self, job: &str) {
        let bare = self.job_dir(job).join("noshare/repo.git");
        let left = Command::new("git")
            .arg(format!("--git-dir={}", bare.display()))
            .args(["for-each-ref", "--format=%(refname)", "refs/prodigy/"])
            .output()
            .unwrap();
        let left = String::from_utf8_lossy(&left.stdout);
        assert!(left.lines().all(|r| r.ends_with("/task")), "{left}");
        assert_eq!(self.git(&["for-each-ref", "refs/prodigy/"]), "");
    }
}

fn git_identity() -> [(&'static str, &'static str); 6] {
    [
        ("GIT_AUTHOR_NAME", "t"),
        ("GIT_AUTHOR_EMAIL", "t@example.com"),
        ("GIT_COMMITTER_NAME", "t"),
        ("GIT_COMMITTER_EMAIL", "t@example.com"),
        ("GIT_CONFIG_GLOBAL", "/dev/null"),
        ("GIT_CONFIG_NOSYSTEM", "1"),
    ]
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn job_id(out: &Output) -> String {
    let text = stderr(out);
    let re = regex::Regex::new(r"job (mapreduce-[0-9a-z-]+) started").unwrap();
    re.captures(&text)
        .unwrap_or_else(|| panic!("no job id in:\n{text}"))[1]
        .to_owned()
}

fn queued(job: &str) -> String {
    let out = slurm("squeue")
        .args(["-h", "-n", &format!("prodigy-{job}"), "-o", "%i %T"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| !line.ends_with(" COMPLETING"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_item_runs_once_on_slurm_in_a_node_clone_and_its_commit_lands_once() {
    if !cluster("every_item_runs_once_on_slurm_in_a_node_clone") {
        return;
    }
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let p = Project::new(
        r#"name: noshare-slurm
mode: mapreduce
map:
  input: "seq 1 5"
  max_parallel: 2
  agent_template:
    - shell: 'echo "$ITEM $SLURM_JOB_ID $(pwd)" >> "$RUNS_LOG" && echo "$ITEM" > "item-$ITEM.txt" && git add "item-$ITEM.txt" && git commit -qm "item $ITEM"'
"#,
    );
    let out = p.command(&["run", "-y", "wf.yml"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let job = job_id(&out);
    let log = std::fs::read_to_string(p.log()).unwrap();
    let mut items: Vec<&str> = log.lines().map(|l| l.split(' ').next().unwrap()).collect();
    items.sort_unstable();
    assert_eq!(items, ["1", "2", "3", "4", "5"], "{log}");
    let node = p.node().display().to_string();
    for line in log.lines() {
        let mut words = line.split(' ').skip(1);
        assert!(words.next().unwrap().parse::<u64>().is_ok(), "{line}");
        assert!(words.next().unwrap().starts_with(&node), "{line}");
    }
    assert_eq!(
        p.git(&["log", "--oneline", "--grep", "^item "])
            .lines()
            .count(),
        5
    );
    let results = p.results(&job);
    assert_eq!(results.len(), 5);
    assert!(
        results.iter().all(|r| r["task"]["backend"] == "slurm"),
        "{results:?}"
    );
    // Nothing was written under the job's slurm/ directory by a task: no output there.
    let slurm_dir = p.job_dir(&job).join("slurm");
    let outs = std::fs::read_dir(&slurm_dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "out")
        })
        .count();
    assert_eq!(outs, 0);
    p.refs_cleaned(&job);
    assert_eq!(queued(&job), "");
}

#[test]
fn kill_9_of_the_coordinator_and_resume_job_lose_and_duplicate_nothing() {
    if !cluster("kill_9_of_the_coordinator_and_resume_job") {
        return;
    }
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let p = Project::new(
        r#"name: noshare-kill
mode: mapreduce
map:
  input: "seq 1 4"
  max_parallel: 2
  agent_template:
    - shell: 'echo "start $ITEM" >> "$RUNS_LOG"; sleep 3; echo "$ITEM" > "item-$ITEM.txt" && git add "item-$ITEM.txt" && git commit -qm "item $ITEM"'
"#,
    );
    let mut child = p
        .command(&["run", "-y", "wf.yml"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed once two agents have started on their node.
    let deadline = std::time::Instant::now() + Duration::from_mins(1);
    loop {
        let started = std::fs::read_to_string(p.log()).unwrap_or_default();
        if started.lines().count() >= 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no agent started");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let state = p.home().join("state");
    let repo = std::fs::read_dir(&state).unwrap().next().unwrap().unwrap();
    let job = std::fs::read_dir(repo.path().join("mapreduce/jobs"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name()
        .to_string_lossy()
        .into_owned();
    let out = p.command(&["resume-job", "-y", &job]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let log = std::fs::read_to_string(p.log()).unwrap();
    let mut starts: Vec<&str> = log.lines().collect();
    starts.sort_unstable();
    assert_eq!(
        starts,
        ["start 1", "start 2", "start 3", "start 4"],
        "{log}"
    );
    let results = p.results(&job);
    assert_eq!(results.len(), 4, "{results:?}");
    assert!(
        results.iter().all(|r| r["status"] == "succeeded"),
        "{results:?}"
    );
    for n in 1..=4 {
        assert!(p.repo().join(format!("item-{n}.txt")).exists(), "item {n}");
    }
    assert_eq!(
        p.git(&["log", "--oneline", "--grep", "^item "])
            .lines()
            .count(),
        4
    );
    p.refs_cleaned(&job);
    assert_eq!(queued(&job), "");
}
