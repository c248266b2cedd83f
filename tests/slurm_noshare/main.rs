//! `--executor slurm --no-shared-fs` against a real Slurm cluster of its own (docs/slurm.md,
//! "Without a shared filesystem"): three nodes on this machine, each a slurmd in a network
//! namespace and a private mount namespace whose /tmp is its own (`scripts/slurm-cluster-ns`,
//! under `/tmp/prodigy-slurm-noshare`, named `prodigy-noshare`, its own ports and munge), so
//! no node sees the test's repository or `PRODIGY_HOME`, and it never touches the cluster of
//! `tests/slurm`. The agents record what they did in a log under the cluster's directory,
//! the one path the nodes share with this machine, which prodigy itself never uses.
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
#[path = "../support/job.rs"]
mod job;
use job::{dead_letters, git_identity, git_in, job_id, repo_with_workflow, stderr};
#[path = "../support/slurm_cluster.rs"]
mod slurm_cluster;

/// This binary's cluster: its directory and name (never the ones of `tests/slurm`).
const DIR: &str = "/tmp/prodigy-slurm-noshare";

/// The `prodigy` the coordinators run: a copy in the cluster's directory, because the agents
/// run the coordinator's own program and a node sees nothing else under /tmp, where a checkout
/// (a CI clone) may keep its `target/` (on a real cluster, prodigy is installed on the nodes).
fn prodigy() -> Command {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    let bin = BIN.get_or_init(|| {
        let built = Command::cargo_bin("prodigy")
            .unwrap()
            .get_program()
            .to_owned();
        let dir = Path::new(DIR).join("bin");
        std::fs::create_dir_all(&dir).unwrap();
        let copy = dir.join(format!("prodigy.{}", std::process::id()));
        std::fs::copy(&built, &copy).unwrap();
        // Renamed into place: a binary another test run still executes is not overwritten.
        let bin = dir.join("prodigy");
        std::fs::rename(&copy, &bin).unwrap();
        bin
    });
    Command::new(bin)
}
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
        slurm_cluster::start(
            &root(),
            "scripts/slurm-cluster-ns",
            &[("PRODIGY_SLURM_DIR", DIR), ("PRODIGY_SLURM_NAME", NAME)],
        )
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

impl Drop for Project {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.log());
    }
}

impl Project {
    fn new(workflow: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("10.213.1.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let p = Project {
            dir,
            addr: format!("10.213.1.1:{port}"),
        };
        std::fs::create_dir(p.repo()).unwrap();
        std::fs::create_dir_all(p.log().parent().unwrap()).unwrap();
        repo_with_workflow(&p.repo(), &workflow.replace("@ADDR@", &p.addr));
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

    /// The agents' log, under the cluster's directory (which the nodes see).
    fn log(&self) -> PathBuf {
        let name = self.dir.path().file_name().unwrap().to_string_lossy();
        Path::new(DIR).join("runs").join(format!("{name}.log"))
    }

    fn git(&self, args: &[&str]) -> String {
        git_in(&self.repo(), args)
    }

    /// `prodigy ARGS --executor slurm --no-shared-fs --serve-addr ADDR` in the project.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = self.command_as_written(args);
        cmd.args(["--no-shared-fs", "--serve-addr", &self.addr]);
        cmd
    }

    /// `prodigy ARGS --executor slurm`, the mode as the workflow says.
    fn command_as_written(&self, args: &[&str]) -> Command {
        self.command_by(prodigy(), args)
    }

    /// CMD (a `prodigy`) with ARGS `--executor slurm` in the project.
    fn command_by(&self, mut cmd: Command, args: &[&str]) -> Command {
        cmd.args(args)
            .args(["--executor", "slurm"])
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
        job::job_dir(&self.home(), job)
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

/// A coordinator the test started, killed if the test fails before it ends.
struct Reaped(Option<std::process::Child>);

impl Reaped {
    /// Kills it with SIGKILL, as `kill -9` would, and reaps it.
    fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Waits for it to end, with its output.
    fn wait(mut self) -> Output {
        self.0.take().unwrap().wait_with_output().unwrap()
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
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
fn every_item_runs_once_on_a_node_that_sees_nothing_of_the_coordinator_and_its_commit_lands_once() {
    if !cluster("every_item_runs_once_on_a_node_that_sees_nothing_of_the_coordinator") {
        return;
    }
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let p = Project::new(
        r#"name: noshare-slurm
mode: mapreduce
map:
  input: "seq 1 6"
  max_parallel: 3
  agent_template:
    - shell: 'seen=hidden; if test -e "$COORD_REPO" || test -e "$COORD_HOME"; then seen=visible; fi; sleep 1; modes=$(stat -c %a "$PRODIGY_NOSHARE_DIR" "$PRODIGY_NOSHARE_DIR/out" | tr "\n" ,); echo "$ITEM $SLURMD_NODENAME $(pwd) $seen $modes" >> "$RUNS_LOG" && echo "$ITEM" > "item-$ITEM.txt" && git add "item-$ITEM.txt" && git commit -qm "item $ITEM"'
"#,
    );
    let repo = p.repo().display().to_string();
    let home = p.home().display().to_string();
    let out = p
        .command(&["run", "-y", "wf.yml"])
        .env("COORD_REPO", &repo)
        .env("COORD_HOME", &home)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let job = job_id(&out);
    // Each item ran once, on a node, in a clone under the node directory, and saw neither
    // the coordinator's repository nor its `PRODIGY_HOME`.
    let log = std::fs::read_to_string(p.log()).unwrap();
    let mut items: Vec<&str> = log.lines().map(|l| l.split(' ').next().unwrap()).collect();
    items.sort_unstable();
    assert_eq!(items, ["1", "2", "3", "4", "5", "6"], "{log}");
    let node_dir = p.node().display().to_string();
    let mut nodes = std::collections::BTreeSet::new();
    for line in log.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        assert!(["n1", "n2", "n3"].contains(&words[1]), "{line}");
        nodes.insert(words[1]);
        assert!(words[2].starts_with(&node_dir), "{line}");
        assert_eq!(words[3], "hidden", "{line}");
        // The node directory and the task output's directory in it are private.
        assert_eq!(words[4], "700,700,", "{line}");
    }
    assert!(nodes.len() >= 2, "{log}");
    // Every item's commit landed once.
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
    let results = p.results(&job);
    assert_eq!(results.len(), 6);
    assert!(
        results.iter().all(|r| r["task"]["backend"] == "slurm"),
        "{results:?}"
    );
    p.refs_cleaned(&job);
    assert_eq!(queued(&job), "");
    // The job's secret is in its tasks' batch script, which another user of the cluster
    // can neither retrieve nor see in the job's details.
    let token = std::fs::read_to_string(p.job_dir(&job).join("noshare/token")).unwrap();
    let token = token.trim();
    let task = results[0]["task"]["id"].as_str().unwrap().to_owned();
    let as_nobody = |args: &[&str]| {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "nobody", "--", "scontrol"]).args(args);
        if let Some(Ok(conf)) = UP.get() {
            cmd.env("SLURM_CONF", conf);
        }
        cmd.output().unwrap()
    };
    let shown = as_nobody(&["show", "job", "-dd", &task]);
    assert!(shown.status.success(), "{shown:?}");
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(!shown.contains(token), "{shown}");
    // Slurm writes no output of the task at a path of the node someone else could make.
    assert!(shown.contains("StdOut=/dev/null"), "{shown}");
    assert!(shown.contains("WorkDir=/\n"), "{shown}");
    // Refused (`scontrol` says so on stderr, and exits 0 all the same).
    let script = as_nobody(&["write", "batch_script", &task, "-"]);
    assert!(
        !String::from_utf8_lossy(&script.stdout).contains(token),
        "{script:?}"
    );
    // Its owner can (the secret is there to be kept from other users only).
    let own = slurm("scontrol")
        .args(["write", "batch_script", &task, "-"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&own.stdout).contains(token),
        "{own:?}"
    );
}

/// Runs CMD, a two-item job of P none of whose agents can start: it exits 1 saying so and
/// runs no item. Returns what it printed, the job's id and its two dead letters.
fn run_none_started(p: &Project, mut cmd: Command) -> (String, String, Vec<Value>) {
    let out = cmd.output().unwrap();
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let job = job_id(&out);
    assert!(
        text.contains(&format!("no agent of job {job} started")),
        "{text}"
    );
    assert!(!p.log().exists(), "an item ran");
    let dlq = dead_letters(&p.repo(), &p.home(), &job);
    assert_eq!(dlq.len(), 2);
    (text, job, dlq)
}

/// Runs CMD, a job of P none of whose agents can start: it fails saying so, each item's
/// failure and a warning give the node's reason (returned, one per item), naming no output.
fn none_started(p: &Project, cmd: Command) -> Vec<String> {
    let (text, job, dlq) = run_none_started(p, cmd);
    assert_eq!(queued(&job), "");
    dlq.iter()
        .map(|item| {
            let why = item["failure_history"][0]["error_message"]
                .as_str()
                .unwrap()
                .to_owned();
            assert!(why.contains("could not start its agent on n"), "{why}");
            assert!(!why.contains("output"), "{why}");
            assert!(!why.contains("slurmd log"), "{why}");
            assert!(text.contains(&format!("warning: {why}")), "{text}");
            why
        })
        .collect()
}

const NEVER_RUNS: &str = r#"name: noshare-not-started
mode: mapreduce
map:
  input: "seq 1 2"
  agent_template:
    - shell: 'echo "$ITEM" >> "$RUNS_LOG"'
"#;

#[test]
fn a_node_without_the_coordinators_program_says_so_and_names_no_file_it_lacks() {
    if !cluster("a_node_without_the_coordinators_program_says_so") {
        return;
    }
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let p = Project::new(NEVER_RUNS);
    // The coordinator runs a copy under the test's own /tmp directory, which no node sees:
    // the program its tasks run does not exist on their nodes.
    let bin = p.dir.path().join("prodigy");
    std::fs::copy(prodigy().get_program(), &bin).unwrap();
    let mut cmd = p.command_by(Command::new(&bin), &["run", "-y", "wf.yml"]);
    cmd.args(["--no-shared-fs", "--serve-addr", &p.addr]);
    for why in none_started(&p, cmd) {
        assert!(
            why.contains(&format!("`{}` does not exist there", bin.display())),
            "{why}"
        );
    }
    // Named for the nodes, and not on their `PATH`.
    let p = Project::new(NEVER_RUNS);
    let mut cmd = p.command(&["run", "-y", "wf.yml"]);
    cmd.env("PRODIGY_SLURM_PROGRAM", "prodigy-not-on-the-nodes");
    for why in none_started(&p, cmd) {
        assert!(
            why.contains("`prodigy-not-on-the-nodes` is not on its `PATH`"),
            "{why}"
        );
    }
}

#[test]
fn a_node_that_cannot_fetch_the_served_repository_says_so() {
    if !cluster("a_node_that_cannot_fetch_the_served_repository_says_so") {
        return;
    }
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let p = Project::new(NEVER_RUNS);
    // Served on this machine's loopback, which is each node's own.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut cmd = p.command_as_written(&["run", "-y", "wf.yml"]);
    cmd.args(["--no-shared-fs", "--serve-addr", &addr]);
    for why in none_started(&p, cmd) {
        assert!(
            why.contains(&format!(
                "it could not fetch the job's repository from http://{addr}/git: fatal: unable to access"
            )),
            "{why}"
        );
    }
}

#[test]
fn without_no_shared_fs_every_item_fails_to_launch_and_the_job_fails_saying_so() {
    if !cluster("without_no_shared_fs_every_item_fails_to_launch") {
        return;
    }
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let p = Project::new(
        r#"name: noshare-none
mode: mapreduce
map:
  input: "seq 1 2"
  agent_template:
    - shell: 'echo "$ITEM" >> "$RUNS_LOG"'
"#,
    );
    let mut cmd = prodigy();
    cmd.args(["run", "-y", "--executor", "slurm", "wf.yml"])
        .current_dir(p.repo())
        .env("PRODIGY_HOME", p.home())
        .env("RUNS_LOG", p.log())
        .env_remove("PRODIGY_SBATCH_ARGS")
        .envs(git_identity())
        .stdin(std::process::Stdio::null());
    if let Some(Ok(conf)) = UP.get() {
        cmd.env("SLURM_CONF", conf);
    }
    let (_, _, dlq) = run_none_started(&p, cmd);
    for item in &dlq {
        let why = item["failure_history"][0]["error_message"]
            .as_str()
            .unwrap();
        assert!(why.contains("never started"), "{why}");
        assert!(!why.contains("its output is in"), "{why}");
    }
}

#[test]
fn a_node_killed_mid_task_sends_its_item_through_the_policy() {
    if !cluster("a_node_killed_mid_task_sends_its_item_through_the_policy") {
        return;
    }
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let p = Project::new(
        r#"name: noshare-node-dies
mode: mapreduce
map:
  input: "seq 1 3"
  max_parallel: 3
  agent_template:
    - shell: 'echo "start $ITEM $SLURMD_NODENAME" >> "$RUNS_LOG"; sleep 6; echo "$ITEM" > "item-$ITEM.txt" && git add "item-$ITEM.txt" && git commit -qm "item $ITEM"'
"#,
    );
    let child = Reaped(Some(
        p.command(&["run", "-y", "wf.yml"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let deadline = std::time::Instant::now() + Duration::from_mins(1);
    let victim = loop {
        let started = std::fs::read_to_string(p.log()).unwrap_or_default();
        if started.lines().count() >= 3 {
            break started
                .lines()
                .find(|l| l.ends_with(" n2"))
                .map(|l| l.split(' ').nth(1).unwrap().to_owned());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agents did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let victim = victim.unwrap_or_else(|| {
        panic!(
            "no item on n2: {}",
            std::fs::read_to_string(p.log()).unwrap_or_default()
        )
    });
    let killed = Command::new(root().join("scripts/slurm-cluster-ns"))
        .args(["kill-node", "2"])
        .env("PRODIGY_SLURM_DIR", DIR)
        .env("PRODIGY_SLURM_NAME", NAME)
        .output()
        .unwrap();
    assert!(killed.status.success(), "{killed:?}");
    let out = child.wait();
    // The node comes back for the next scenario.
    let restarted = Command::new(root().join("scripts/slurm-cluster-ns"))
        .args(["restart-node", "2"])
        .env("PRODIGY_SLURM_DIR", DIR)
        .env("PRODIGY_SLURM_NAME", NAME)
        .output()
        .unwrap();
    assert!(restarted.status.success(), "{restarted:?}");
    let text = stderr(&out);
    assert!(out.status.success(), "{text}");
    let job = job_id(&out);
    // Each item ran once; the one on the dead node failed with what Slurm said, into the DLQ.
    let log = std::fs::read_to_string(p.log()).unwrap();
    assert_eq!(log.lines().count(), 3, "{log}");
    let results = p.results(&job);
    let failed: Vec<&Value> = results
        .iter()
        .filter(|r| r["status"] != "succeeded")
        .collect();
    assert_eq!(failed.len(), 1, "{results:?}");
    assert_eq!(results.len(), 3, "{results:?}");
    assert!(!p.repo().join(format!("item-{victim}.txt")).exists());
    let dlq = dead_letters(&p.repo(), &p.home(), &job);
    assert_eq!(dlq.len(), 1);
    let why = dlq[0]["failure_history"][0]["error_message"]
        .as_str()
        .unwrap();
    assert!(why.contains("NODE_FAIL"), "{why}");
    assert!(why.contains("on its node"), "{why}");
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
# The mode as the workflow's keys say (the other tests use the command line's).
executor:
  slurm:
    no_shared_fs: true
    serve: "@ADDR@"
map:
  input: "seq 1 4"
  max_parallel: 2
  agent_template:
    - shell: 'echo "start $ITEM" >> "$RUNS_LOG"; sleep 3; echo "$ITEM" > "item-$ITEM.txt" && git add "item-$ITEM.txt" && git commit -qm "item $ITEM"'
"#,
    );
    let mut child = Reaped(Some(
        p.command_as_written(&["run", "-y", "wf.yml"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    ));
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
    child.kill();
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
    let out = p
        .command_as_written(&["resume-job", "-y", &job])
        .output()
        .unwrap();
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

#[test]
fn resume_job_runs_again_a_task_it_does_not_adopt_and_never_takes_the_earlier_outcome() {
    if !cluster("resume_job_runs_again_a_task_it_does_not_adopt") {
        return;
    }
    let _turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let p = Project::new(
        r#"name: noshare-not-adopted
mode: mapreduce
map:
  input: "seq 1 2"
  max_parallel: 2
  agent_template:
    - shell: 'echo "start $ITEM $SLURM_JOB_ID" >> "$RUNS_LOG"; sleep 4; echo "$ITEM" > "item-$ITEM.txt" && git add "item-$ITEM.txt" && git commit -qm "item $ITEM" && echo "end $ITEM $SLURM_JOB_ID" >> "$RUNS_LOG"'
"#,
    );
    let mut child = Reaped(Some(
        p.command(&["run", "-y", "wf.yml"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    ));
    let deadline = std::time::Instant::now() + Duration::from_mins(1);
    while std::fs::read_to_string(p.log())
        .unwrap_or_default()
        .lines()
        .count()
        < 2
    {
        assert!(std::time::Instant::now() < deadline, "no agent started");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill();
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
    // Item 1's task (index 0) no longer matches what the item will be given (as when its
    // worktree was lost): `resume-job` must not adopt it.
    let record = p.job_dir(&job).join("slurm/item_0.job");
    let mut submitted: Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    let earlier = submitted["slurm_job_id"].as_str().unwrap().to_owned();
    submitted.as_object_mut().unwrap().remove("worktree");
    std::fs::write(&record, serde_json::to_vec(&submitted).unwrap()).unwrap();
    let out = p.command(&["resume-job", "-y", &job]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let log = std::fs::read_to_string(p.log()).unwrap();
    // Item 2's task was adopted: it started and ended once. Item 1's earlier task was
    // cancelled before it ended, and a new one ran it to its end, once.
    let lines = |prefix: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.starts_with(prefix))
            .map(|l| l.split(' ').nth(2).unwrap().to_owned())
            .collect()
    };
    assert_eq!(lines("start 2 ").len(), 1, "{log}");
    assert_eq!(lines("end 2 ").len(), 1, "{log}");
    assert_eq!(lines("start 1 ").len(), 2, "{log}");
    let ended = lines("end 1 ");
    assert_eq!(ended.len(), 1, "{log}");
    assert_ne!(ended[0], earlier, "{log}");
    // The outcome recorded for item 1 is the new task's, and its commit landed once.
    let results = p.results(&job);
    let first = results
        .iter()
        .find(|r| r["item_id"] == "item_0")
        .unwrap_or_else(|| panic!("{results:?}"));
    assert_eq!(first["status"], "succeeded", "{results:?}");
    assert!(
        first["task"]["id"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{}_", ended[0])),
        "{results:?}"
    );
    assert_eq!(
        p.git(&["log", "--oneline", "--grep", "^item "])
            .lines()
            .count(),
        2
    );
    p.refs_cleaned(&job);
    assert_eq!(queued(&job), "");
}
