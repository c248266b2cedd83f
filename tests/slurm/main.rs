//! `--executor slurm` against a real one-node Slurm cluster on loopback (docs/slurm.md, "Map agents
//! on Slurm"): started by `scripts/slurm-cluster start` when the tests run as root with
//! Debian's Slurm packages installed, else skipped with a line saying why. `.ci/run`
//! installs the packages (as root) and stops the cluster afterwards.

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test helpers fail loudly and read what the runs wrote directly"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use assert_cmd::cargo::CommandCargoExt;
use serde_json::Value;

#[path = "../support/external.rs"]
mod external;
#[path = "../support/job.rs"]
mod job;
use job::{git_identity, git_in, job_id, repo_with_workflow, stderr};
#[path = "../support/slurm_cluster.rs"]
mod slurm_cluster;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The cluster, started once per test binary: its `SLURM_CONF` (which `scripts/slurm-cluster
/// start` prints), or why the tests skip.
static UP: OnceLock<Result<String, String>> = OnceLock::new();

/// Whether the cluster is up; `false` after a skip line.
fn cluster(test: &str) -> bool {
    let up = UP.get_or_init(|| slurm_cluster::start(&root(), "scripts/slurm-cluster", &[]));
    match up {
        Ok(_) => true,
        Err(why) => {
            external::skip_line(test, why.trim());
            false
        }
    }
}

/// PROGRAM pointed at the test cluster's configuration (nothing is read from /etc/slurm).
fn slurm(program: &str) -> Command {
    let mut cmd = Command::new(program);
    if let Some(Ok(conf)) = UP.get() {
        cmd.env("SLURM_CONF", conf);
    }
    cmd
}

/// A git repository with WORKFLOW as `wf.yml`, and a `$PRODIGY_HOME` beside it.
struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new(workflow: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let p = Project { dir };
        std::fs::create_dir(p.repo()).unwrap();
        repo_with_workflow(&p.repo(), workflow);
        p
    }

    fn repo(&self) -> PathBuf {
        self.dir.path().join("repo")
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// A file outside the repository that agents can append to.
    fn log(&self) -> PathBuf {
        self.dir.path().join("runs.log")
    }

    fn git(&self, args: &[&str]) -> String {
        git_in(&self.repo(), args)
    }

    fn prodigy(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// `prodigy ARGS` in the project, with its `PRODIGY_HOME`, the runs log and the git
    /// identity, and no input.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::cargo_bin("prodigy").unwrap();
        cmd.args(args)
            .current_dir(self.repo())
            .env("PRODIGY_HOME", self.home())
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

    /// The job whose two tasks (items 0 and 1) have both started, within 30 s.
    fn both_tasks_started(&self) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let state = self.home().join("state");
            let job = std::fs::read_dir(&state).ok().and_then(|mut repos| {
                let jobs = repos.next()?.ok()?.path().join("mapreduce/jobs");
                let job = std::fs::read_dir(jobs).ok()?.next()?.ok()?;
                let both = (0..2).all(|i| {
                    job.path()
                        .join(format!("slurm/item_{i}.result.started"))
                        .exists()
                });
                both.then(|| job.file_name().to_string_lossy().into_owned())
            });
            if let Some(job) = job {
                return job;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the tasks did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn results(&self, job: &str) -> Vec<Value> {
        std::fs::read_to_string(self.job_dir(job).join("results.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// Tasks of JOB still waiting or running in Slurm's queue. A task `COMPLETING` is left out:
/// its processes have ended and Slurm is only cleaning up after it (its epilog), which can
/// outlast the coordinator by a moment.
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
fn every_item_runs_once_inside_a_slurm_job_and_the_agents_commits_are_merged() {
    if !cluster("every_item_runs_once_inside_a_slurm_job") {
        return;
    }
    let p = Project::new(
        r#"name: slurm-all-items
mode: mapreduce
map:
  input: "seq 1 6"
  max_parallel: 2
  agent_template:
    - shell: 'echo "$ITEM $SLURM_JOB_ID" >> "$RUNS_LOG" && echo "$SLURM_JOB_ID" > "job-$ITEM.txt" && git add "job-$ITEM.txt" && git commit -qm "item $ITEM"'
reduce:
  - shell: "echo '${map.successful} of ${map.total}'"
"#,
    );
    let out = p.prodigy(&["run", "-y", "--executor", "slurm", "wf.yml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job = job_id(&out);
    // Each item ran exactly once, inside a Slurm job.
    let log = std::fs::read_to_string(p.log()).unwrap();
    let mut items: Vec<&str> = log.lines().map(|l| l.split(' ').next().unwrap()).collect();
    items.sort_unstable();
    assert_eq!(items, ["1", "2", "3", "4", "5", "6"], "{log}");
    assert!(
        log.lines().all(|l| l
            .split(' ')
            .nth(1)
            .is_some_and(|id| id.parse::<u64>().is_ok())),
        "an item ran outside Slurm:\n{log}"
    );
    // Their commits reached the branch the run started from.
    for n in 1..=6 {
        let id = std::fs::read_to_string(p.repo().join(format!("job-{n}.txt"))).unwrap();
        assert!(id.trim().parse::<u64>().is_ok(), "job-{n}.txt: {id}");
    }
    assert_eq!(
        p.git(&["log", "--oneline", "--grep", "^item "])
            .lines()
            .count(),
        6
    );
    // The results name the Slurm task of each item.
    let results = p.results(&job);
    assert_eq!(results.len(), 6);
    for r in &results {
        assert_eq!(r["status"], "succeeded", "{r}");
        assert_eq!(r["task"]["backend"], "slurm", "{r}");
        let id = r["task"]["id"].as_str().unwrap();
        assert!(id.ends_with(&format!("_{}", r["index"])), "{r}");
        assert_eq!(r["task"]["node"], "localhost", "{r}");
    }
    assert_eq!(queued(&job), "");
}

#[test]
fn a_failed_item_goes_to_the_dlq_with_its_slurm_task_and_dlq_retry_runs_it_on_slurm() {
    if !cluster("a_failed_item_goes_to_the_dlq_with_its_slurm_task") {
        return;
    }
    let p = Project::new(
        r#"name: slurm-dlq
mode: mapreduce
map:
  input: "seq 1 3"
  max_parallel: 2
  agent_template:
    - shell: 'if [ "$ITEM" = 2 ] && [ ! -e "$RUNS_LOG.fixed" ]; then echo broken >&2; exit 7; fi; echo "$ITEM $SLURM_JOB_ID" >> "$RUNS_LOG"'
"#,
    );
    let out = p.prodigy(&["run", "--no-worktree", "--executor", "slurm", "wf.yml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job = job_id(&out);
    let show = p.prodigy(&["dlq", "show", &job, "--format", "json"]);
    let text = String::from_utf8_lossy(&show.stdout).into_owned();
    assert!(show.status.success(), "{}", stderr(&show));
    assert!(text.contains("item_1"), "{text}");
    assert!(
        text.contains("\"backend\"") && text.contains("\"slurm\""),
        "the DLQ entry names no Slurm job:\n{text}"
    );
    assert!(text.contains("broken"), "{text}");
    std::fs::write(p.dir.path().join("runs.log.fixed"), "").unwrap();
    let retry = p.prodigy(&["dlq", "retry", &job, "--executor", "slurm"]);
    assert!(retry.status.success(), "{}", stderr(&retry));
    assert!(
        stderr(&retry).contains("1 succeeded and left the queue"),
        "{}",
        stderr(&retry)
    );
    let log = std::fs::read_to_string(p.log()).unwrap();
    let line = log
        .lines()
        .find(|l| l.starts_with("2 "))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        line[2..].parse::<u64>().is_ok(),
        "the retry ran outside Slurm: {line}"
    );
    let last = p.results(&job).pop().unwrap();
    assert_eq!(
        (last["index"].clone(), last["status"].clone()),
        (1.into(), "succeeded".into())
    );
    assert_eq!(last["task"]["backend"], "slurm", "{last}");
}

#[test]
fn an_agent_timeout_cancels_its_slurm_task() {
    if !cluster("an_agent_timeout_cancels_its_slurm_task") {
        return;
    }
    let p = Project::new(
        r#"name: slurm-timeout
mode: mapreduce
map:
  input: "seq 1 2"
  agent_timeout_secs: 2
  agent_template:
    - shell: 'if [ "$ITEM" = 1 ]; then sleep 120; fi; echo "$ITEM done" >> "$RUNS_LOG"'
"#,
    );
    let started = std::time::Instant::now();
    let out = p.prodigy(&["run", "--no-worktree", "--executor", "slurm", "wf.yml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        started.elapsed() < Duration::from_mins(1),
        "took {:?}",
        started.elapsed()
    );
    let job = job_id(&out);
    assert_eq!(queued(&job), "", "the timed-out task is still in the queue");
    let results = p.results(&job);
    let first = results.iter().find(|r| r["index"] == 0).unwrap();
    assert_eq!(first["error_type"], "Timeout", "{first}");
    assert_eq!(first["task"]["backend"], "slurm", "{first}");
    let log = std::fs::read_to_string(p.log()).unwrap();
    assert_eq!(log.trim(), "2 done", "{log}");
}

#[test]
fn slurm_without_its_tools_is_refused_before_anything_starts() {
    let p = Project::new(
        "name: no-slurm\nmode: mapreduce\nmap:\n  input: \"seq 1 2\"\n  agent_template:\n    - shell: \"true\"\n",
    );
    // A PATH with git and sh, and no Slurm.
    let bin = tempfile::tempdir().unwrap();
    for tool in ["git", "sh"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .unwrap();
        let at = String::from_utf8_lossy(&found.stdout).trim().to_owned();
        std::os::unix::fs::symlink(at, bin.path().join(tool)).unwrap();
    }
    let path = bin.path().as_os_str().to_owned();
    let out = p
        .command(&["run", "--no-worktree", "--executor", "slurm", "wf.yml"])
        .env("PATH", &path)
        .output()
        .unwrap();
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("`--executor slurm` needs the Slurm client tools"),
        "{text}"
    );
    assert!(!p.home().join("state").exists(), "a job started: {text}");
}

#[test]
fn a_killed_coordinator_leaves_its_tasks_running_and_resume_job_adopts_them() {
    if !cluster("a_killed_coordinator_leaves_its_tasks_running") {
        return;
    }
    let p = Project::new(
        r#"name: slurm-kill
mode: mapreduce
map:
  input: "seq 1 4"
  max_parallel: 2
  agent_template:
    - shell: 'echo "start $ITEM" >> "$RUNS_LOG"; sleep 3; echo "$ITEM" > "item-$ITEM.txt" && git add "item-$ITEM.txt" && git commit -qm "item $ITEM"'
"#,
    );
    let mut child = p
        .command(&["run", "-y", "--executor", "slurm", "wf.yml"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once both running items are Slurm tasks: `sbatch` answered with their ids.
    let submitted = |index: usize| {
        let jobs = p.home().join("state");
        std::fs::read_dir(&jobs).ok().and_then(|mut repos| {
            let repo = repos.next()?.ok()?.path().join("mapreduce/jobs");
            let job = std::fs::read_dir(repo).ok()?.next()?.ok()?.path();
            let record = std::fs::read(job.join(format!("slurm/item_{index}.job"))).ok()?;
            let record: Value = serde_json::from_slice(&record).ok()?;
            record["slurm_job_id"]
                .is_string()
                .then(|| job.file_name().unwrap().to_string_lossy().into_owned())
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let job = loop {
        if let (Some(job), Some(_)) = (submitted(0), submitted(1)) {
            break job;
        }
        assert!(std::time::Instant::now() < deadline, "no tasks submitted");
        std::thread::sleep(Duration::from_millis(50));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert_ne!(
        queued(&job),
        "",
        "the killed coordinator's tasks left the queue"
    );
    let out = p.prodigy(&["resume-job", "-y", "--executor", "slurm", &job]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Every item started once: the tasks were adopted, not run again.
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
    // The adopted tasks' commits came back too.
    for n in 1..=4 {
        assert!(
            p.repo().join(format!("item-{n}.txt")).exists(),
            "item {n} not merged: {}\n{}",
            stderr(&out),
            p.git(&["log", "--oneline", "--all", "--graph"])
        );
    }
    let events = std::fs::read_dir(p.home().join("events"))
        .unwrap()
        .flat_map(|repo| std::fs::read_dir(repo.unwrap().path().join(&job)).unwrap())
        .map(|f| std::fs::read_to_string(f.unwrap().path()).unwrap())
        .collect::<String>();
    // At least the two tasks that were running when it was killed.
    let adopted = events.matches("\"task_adopted\"").count();
    assert!(adopted >= 2, "{adopted} adopted:\n{events}");
}

#[test]
fn waiting_in_the_queue_does_not_count_against_the_agent_timeout() {
    if !cluster("waiting_in_the_queue_does_not_count_against_the_agent_timeout") {
        return;
    }
    let p = Project::new(
        r#"name: slurm-held
mode: mapreduce
map:
  input: "seq 1 1"
  agent_timeout_secs: 2
  agent_template:
    - shell: 'echo "$ITEM $SLURM_JOB_ID" >> "$RUNS_LOG"'
"#,
    );
    // `--hold` (through PRODIGY_SBATCH_ARGS) keeps the task pending until it is released.
    let child = p
        .command(&["run", "--no-worktree", "--executor", "slurm", "wf.yml"])
        .env("PRODIGY_SBATCH_ARGS", "--hold --comment 'held by a test'")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let held = |job: &str| queued(job).contains("PENDING");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let job = loop {
        let state = p.home().join("state");
        let job = std::fs::read_dir(&state).ok().and_then(|mut repos| {
            let jobs = repos.next()?.ok()?.path().join("mapreduce/jobs");
            let job = std::fs::read_dir(jobs).ok()?.next()?.ok()?;
            Some(job.file_name().to_string_lossy().into_owned())
        });
        if let Some(job) = job.filter(|j| held(j)) {
            break job;
        }
        assert!(std::time::Instant::now() < deadline, "no held task");
        std::thread::sleep(Duration::from_millis(50));
    };
    // Held past the agent's timeout, then released.
    std::thread::sleep(Duration::from_secs(3));
    let ids = slurm("squeue")
        .args(["-h", "-n", &format!("prodigy-{job}"), "-o", "%A"])
        .output()
        .unwrap();
    let id = String::from_utf8_lossy(&ids.stdout).trim().to_owned();
    let released = slurm("scontrol").args(["release", &id]).status().unwrap();
    assert!(released.success());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let results = p.results(&job);
    assert_eq!(results[0]["status"], "succeeded", "{results:?}");
    assert!(std::fs::read_to_string(p.log()).unwrap().starts_with("1 "));
}

#[test]
fn an_interrupted_run_cancels_its_slurm_tasks() {
    if !cluster("an_interrupted_run_cancels_its_slurm_tasks") {
        return;
    }
    let p = Project::new(
        r#"name: slurm-interrupt
mode: mapreduce
map:
  input: "seq 1 2"
  max_parallel: 2
  agent_template:
    - shell: 'sleep 60; echo "$ITEM" >> "$RUNS_LOG"'
"#,
    );
    let child = p
        .command(&["run", "--no-worktree", "--executor", "slurm", "wf.yml"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let job = p.both_tasks_started();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert_eq!(
        queued(&job),
        "",
        "an interrupted run left its tasks running"
    );
    assert!(!p.log().exists(), "an agent finished after the interrupt");
}

#[test]
fn the_workflows_slurm_options_reach_sbatch_and_the_environment_overrides_them() {
    if !cluster("the_workflows_slurm_options_reach_sbatch") {
        return;
    }
    let p = Project::new(
        r#"name: slurm-options
mode: mapreduce
slurm:
  partition: debug
  time: "7"
  cpus_per_task: 1
  mem: 64M
  sbatch_args: ["--comment=from-the-workflow"]
map:
  input: "seq 1 1"
  agent_template:
    - shell: 'scontrol show job "$SLURM_JOB_ID" -o >> "$RUNS_LOG"'
"#,
    );
    let out = p
        .command(&["run", "--no-worktree", "--executor", "slurm", "wf.yml"])
        .env("PRODIGY_SBATCH_ARGS", "--time=9")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let job = std::fs::read_to_string(p.log()).unwrap();
    for expected in [
        "Partition=debug",
        "TimeLimit=00:09:00",
        "MinMemoryNode=64M",
        "Comment=from-the-workflow",
    ] {
        assert!(job.contains(expected), "no {expected} in:\n{job}");
    }
}

#[test]
fn a_task_that_ends_without_a_result_fails_its_item_with_what_slurm_says() {
    if !cluster("a_task_that_ends_without_a_result_fails_its_item") {
        return;
    }
    // The agent cancels its own task behind prodigy's back, as an administrator might.
    let p = Project::new(
        r#"name: slurm-lost
mode: mapreduce
map:
  input: "seq 1 1"
  agent_template:
    - shell: 'scancel "$SLURM_JOB_ID"; sleep 30'
"#,
    );
    let out = p.prodigy(&["run", "--no-worktree", "--executor", "slurm", "wf.yml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job = job_id(&out);
    let results = p.results(&job);
    let error = results[0]["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        error.contains("stopped before its agent finished") && error.contains("CANCELLED"),
        "{results:?}"
    );
    let show = p.prodigy(&["dlq", "show", &job, "--format", "json"]);
    assert!(String::from_utf8_lossy(&show.stdout).contains("stopped before its agent finished"));
}

#[test]
fn when_the_error_policy_stops_the_job_tasks_waiting_in_the_queue_never_run() {
    if !cluster("when_the_error_policy_stops_the_job_tasks_waiting_never_run") {
        return;
    }
    let p = Project::new(
        r#"name: slurm-stop
mode: mapreduce
max_failures: 1
map:
  input: "seq 1 4"
  max_parallel: 1
  agent_template:
    - shell: 'echo "$ITEM" >> "$RUNS_LOG"; sleep 1; [ "$ITEM" != 1 ]'
"#,
    );
    let out = p.prodigy(&["run", "--no-worktree", "--executor", "slurm", "wf.yml"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let job = job_id(&out);
    assert_eq!(queued(&job), "", "tasks were left in the queue");
    // Items 2 and 3 were waiting behind item 1 in its slot. Slurm starts item 2 the moment
    // item 1 ends, so it may have started before prodigy learnt of the failure (then it
    // finishes, as a running agent does); item 3 was still waiting: cancelled, never run.
    let log = std::fs::read_to_string(p.log()).unwrap();
    assert!(log == "1\n" || log == "1\n2\n", "{log}");
    let results = p.results(&job);
    assert_eq!(results.len(), log.lines().count(), "{results:?}");
}

#[test]
fn a_task_slurm_started_before_its_agent_did_runs_on_when_the_error_policy_stops_the_job() {
    if !cluster("a_task_slurm_started_before_its_agent_did_runs_on") {
        return;
    }
    // Item 2 succeeds at once, and the task behind it in its slot (item 4, array index 3)
    // starts: it is RUNNING in Slurm, but its agent has not started yet (the `slow-start`
    // partition's prolog takes 4 s) when item 1 fails and the error policy stops the job.
    // Item 1 fails only once Slurm shows that task RUNNING, however slowly a loaded
    // machine schedules it. It runs to the end like any running agent, and its result is
    // kept. (The task behind item 1 starts the moment item 1 ends, maybe before prodigy
    // learns of the failure: it may run too.)
    let p = Project::new(
        r#"name: slurm-slow-start
mode: mapreduce
max_failures: 1
map:
  input: "seq 1 4"
  max_parallel: 2
  agent_template:
    - shell: |
        echo "$ITEM" >> "$RUNS_LOG"
        if [ "$ITEM" = 1 ]; then
          until squeue -h -n "$SLURM_JOB_NAME" -t RUNNING -o %K | grep -qx 3; do sleep 0.2; done
          exit 1
        fi
"#,
    );
    let out = p
        .command(&["run", "--no-worktree", "--executor", "slurm", "wf.yml"])
        .env("PRODIGY_SBATCH_ARGS", "--partition=slow-start")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let job = job_id(&out);
    assert_eq!(queued(&job), "", "tasks were left in the queue");
    let log = std::fs::read_to_string(p.log()).unwrap();
    let mut ran: Vec<&str> = log.lines().collect();
    ran.sort_unstable();
    assert!(
        ran.len() >= 3 && ran[..2] == ["1", "2"],
        "the task Slurm had started was cancelled:\n{log}"
    );
    // Every agent that ran has its result: nothing was cancelled half-way.
    let results = p.results(&job);
    assert_eq!(results.len(), ran.len(), "{log}\n{results:?}");
    for r in results.iter().filter(|r| r["index"] != 0) {
        assert_eq!(r["status"], "succeeded", "{r}");
    }
}

#[test]
fn a_second_start_leaves_the_running_cluster_alone_and_its_configuration_is_its_own() {
    if !cluster("a_second_start_leaves_the_running_cluster_alone") {
        return;
    }
    let Some(Ok(conf)) = UP.get() else {
        unreachable!("the cluster is up")
    };
    let dir = Path::new(conf)
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_owned();
    let pids = || {
        ["slurmctld", "slurmd"]
            .map(|d| std::fs::read_to_string(dir.join(format!("run/{d}.pid"))).unwrap())
    };
    let before = pids();
    // The daemons read the cluster's own slurm.conf, not /etc/slurm's.
    for pid in &before {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid.trim())).unwrap();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        assert!(
            args.windows(2)
                .any(|w| w[0] == b"-f" && w[1] == conf.as_bytes()),
            "{}",
            String::from_utf8_lossy(&cmdline)
        );
    }
    let again = Command::new(root().join("scripts/slurm-cluster"))
        .arg("start")
        .output()
        .unwrap();
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(stderr(&again).contains("already up"), "{}", stderr(&again));
    assert_eq!(
        String::from_utf8_lossy(&again.stdout).trim(),
        format!("SLURM_CONF={conf}")
    );
    assert_eq!(pids(), before, "a second start restarted the daemons");
}

/// The pids holding the socket listening on TCP PORT on this machine, from `ss`: the
/// daemon, and for a moment a child it forked (`slurmstepd` for a job step of another test)
/// before that child closes what it inherited.
fn listeners(port: &str) -> Vec<String> {
    let Ok(out) = Command::new("ss")
        .args(["-Hltnp", &format!("( sport = :{port} )")])
        .output()
    else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split("pid=")
        .skip(1)
        .map(|rest| rest.chars().take_while(char::is_ascii_digit).collect())
        .collect()
}

#[test]
fn the_test_cluster_shares_no_port_name_or_munge_with_another_slurm() {
    if !cluster("the_test_cluster_shares_no_port_name_or_munge_with_another_slurm") {
        return;
    }
    let Some(Ok(conf)) = UP.get() else {
        unreachable!("the cluster is up")
    };
    let dir = Path::new(conf).parent().unwrap().parent().unwrap();
    let text = std::fs::read_to_string(conf).unwrap();
    let setting = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key} in {conf}"))
            .to_owned()
    };
    // Its own name and munge socket, and ports other than Slurm's defaults.
    assert_eq!(setting("ClusterName"), "prodigy-test");
    assert!(
        setting("AuthInfo").starts_with(&format!("socket={}", dir.display())),
        "{}",
        setting("AuthInfo")
    );
    let ctld = setting("SlurmctldPort");
    let slurmd = setting("SlurmdPort");
    assert!(!["6817", "6818"].contains(&ctld.as_str()), "{ctld}");
    assert!(!["6817", "6818"].contains(&slurmd.as_str()), "{slurmd}");
    // What answers on those ports is its own daemons, and the controller says so.
    for (port, daemon) in [(&ctld, "slurmctld"), (&slurmd, "slurmd")] {
        let pid = std::fs::read_to_string(dir.join(format!("run/{daemon}.pid"))).unwrap();
        let holders = listeners(port);
        assert!(
            holders.iter().any(|h| h == pid.trim()),
            "{daemon} on {port}: held by {holders:?}, not {}",
            pid.trim()
        );
    }
    let shown = slurm("scontrol").args(["show", "config"]).output().unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("ClusterName") && l.ends_with("= prodigy-test")),
        "{shown}"
    );
}

/// A TCP relay to the test cluster's controller that can stop answering: what a coordinator
/// sees when its Slurm controller hangs, without touching the controller other tests use.
struct Relay {
    port: u16,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Relay {
    fn to(upstream: u16) -> Relay {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let frozen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let down = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refused = down.clone();
        let flag = frozen.clone();
        // Each byte waits while the relay is frozen; threads end with their connections.
        let pipe = move |mut from: std::net::TcpStream, mut to: std::net::TcpStream| {
            let flag = flag.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                while let Ok(n) = from.read(&mut buf) {
                    while flag.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    if n == 0 || to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = to.shutdown(std::net::Shutdown::Write);
            });
        };
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                // A stopped controller: every connection is dropped unanswered.
                if refused.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        Relay { port, frozen, down }
    }

    fn freeze(&self) {
        self.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// From now on the controller is gone, as if its daemon had stopped.
    fn stop(&self) {
        self.down.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The test cluster's configuration CONF with its controller behind a new relay, written
    /// into DIR; the relay and the configuration's path.
    fn configured(conf: &str, dir: &Path) -> (Relay, PathBuf) {
        let text = std::fs::read_to_string(conf).unwrap();
        let port: u16 = text
            .lines()
            .find_map(|l| l.strip_prefix("SlurmctldPort="))
            .unwrap()
            .parse()
            .unwrap();
        let relay = Relay::to(port);
        let relayed = dir.join("relayed.conf");
        std::fs::write(
            &relayed,
            text.replace(
                &format!("SlurmctldPort={port}"),
                &format!("SlurmctldPort={}", relay.port),
            ),
        )
        .unwrap();
        (relay, relayed)
    }
}

#[test]
fn a_coordinator_whose_slurm_controller_stops_answering_still_stops_promptly_on_sigterm() {
    if !cluster("a_coordinator_whose_slurm_controller_stops_answering_still_stops_promptly") {
        return;
    }
    let Some(Ok(conf)) = UP.get() else {
        unreachable!("the cluster is up")
    };
    let p = Project::new(
        r#"name: slurm-hung-controller
mode: mapreduce
map:
  input: "seq 1 2"
  max_parallel: 2
  agent_template:
    - shell: 'sleep 60; echo "$ITEM" >> "$RUNS_LOG"'
"#,
    );
    // The coordinator reaches the controller only through the relay.
    let (relay, relayed) = Relay::configured(conf, p.dir.path());
    let child = p
        .command(&[
            "run",
            "--no-worktree",
            "--grace",
            "2",
            "--executor",
            "slurm",
            "wf.yml",
        ])
        .env("SLURM_CONF", &relayed)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let job = p.both_tasks_started();
    relay.freeze();
    // Let the coordinator's next questions to Slurm hang.
    std::thread::sleep(Duration::from_secs(2));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    let sent = std::time::Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    let took = sent.elapsed();
    // This test's own tasks, which the hung controller never heard cancelled.
    let _ = slurm("scancel")
        .args(["-n", &format!("prodigy-{job}")])
        .status();
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    // Its grace (2 s) and a margin; it used to wait for each unanswered question in turn.
    assert!(
        took < Duration::from_secs(12),
        "SIGTERM took {took:?} with a hung controller:\n{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("resume-job"),
        "the interrupted run says how to go on:\n{}",
        stderr(&out)
    );
}

#[test]
fn a_job_whose_slurm_controller_goes_away_stops_within_its_limit_and_resumes_once_it_is_back() {
    if !cluster("a_job_whose_slurm_controller_goes_away_stops_within_its_limit") {
        return;
    }
    let Some(Ok(conf)) = UP.get() else {
        unreachable!("the cluster is up")
    };
    // The agents outlast the limit; the controller goes away while they run. Other tests
    // share the cluster, so its daemons stay up: the coordinator reaches the controller
    // only through a relay, which then drops every connection, as a stopped controller's
    // port does.
    let p = Project::new(
        r#"name: slurm-controller-gone
mode: mapreduce
map:
  input: "seq 1 2"
  max_parallel: 2
  agent_template:
    - shell: 'sleep 12; echo "$ITEM" >> "$RUNS_LOG"'
"#,
    );
    let (relay, relayed) = Relay::configured(conf, p.dir.path());
    let mut child = p
        .command(&["run", "--no-worktree", "--executor", "slurm", "wf.yml"])
        .env("SLURM_CONF", &relayed)
        .env("PRODIGY_SLURM_UNREACHABLE_SECS", "2")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let job = p.both_tasks_started();
    relay.stop();
    let stopped = std::time::Instant::now();
    // Bounded: were the coordinator to poll on, the test fails instead of hanging.
    while child.try_wait().unwrap().is_none() {
        if stopped.elapsed() > Duration::from_mins(1) {
            let _ = child.kill();
            let _ = slurm("scancel")
                .args(["-n", &format!("prodigy-{job}")])
                .status();
            panic!("the coordinator still polls a controller gone for a minute");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("`localhost` (port ")
            && said.contains("has answered none of prodigy's questions for 2 s")
            && said.contains(&format!("prodigy resume-job -y {job}")),
        "the message names the controller and what to do:\n{said}"
    );
    // The tasks ran on without their coordinator; once the controller answers again the job
    // resumes: their results are adopted, nothing runs twice.
    let deadline = std::time::Instant::now() + Duration::from_mins(1);
    while !queued(&job).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the tasks did not end"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = p.prodigy(&["resume-job", "-y", "--executor", "slurm", &job]);
    assert!(out.status.success(), "{}", stderr(&out));
    let log = std::fs::read_to_string(p.log()).unwrap();
    let mut ran: Vec<&str> = log.lines().collect();
    ran.sort_unstable();
    assert_eq!(ran, ["1", "2"], "{log}");
    let results = p.results(&job);
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(
        results.iter().all(|r| r["status"] == "succeeded"),
        "{results:?}"
    );
}
