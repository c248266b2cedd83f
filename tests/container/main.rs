//! `--executor container` with podman (docs/containers.md): each agent runs in
//! a container of a test image built offline from this machine's own `sh`, `bash`, `git` and
//! the libraries they and prodigy need (imported once with `podman import`; no registry is
//! reached). Skipped with a line saying why without podman; `.ci/run` installs it, and under
//! CI the tests must run. Every container a test's run starts carries the label
//! `prodigy.job=JOB` of that run's job, and the test removes those, and only those.

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
use job::{job_id, stderr};

/// The test image, built from the host's binaries.
const IMAGE: &str = "localhost/prodigy-test-agent:2";

/// The engine's configuration the tests use (`CONTAINERS_CONF`), when the machine's own
/// does not run containers (a runtime that refuses hybrid cgroups, limits above what the
/// process may set); `None` for the machine's own. `Err` says why the tests skip.
static UP: OnceLock<Result<Option<PathBuf>, String>> = OnceLock::new();

/// Whether podman runs the test image here; `false` after a skip line.
fn podman(test: &str) -> bool {
    let up = UP.get_or_init(|| {
        if Command::new("podman").arg("--version").output().is_err() {
            assert!(
                !external::ci::required() || !Path::new("/usr/bin/apt-get").exists(),
                "CI must not skip the container tests: .ci/run installs podman as root with apt"
            );
            return Err("podman is not installed (.ci/run installs it)".into());
        }
        image();
        if runs(None) {
            return Ok(None);
        }
        let conf = conf();
        if runs(Some(&conf)) {
            return Ok(Some(conf));
        }
        assert!(
            !external::ci::required(),
            "podman cannot run a container here, even with runc and lower limits"
        );
        Err("podman cannot run a container on this machine".into())
    });
    match up {
        Ok(_) => true,
        Err(why) => {
            external::skip_line(test, why);
            false
        }
    }
}

/// `podman`, with the tests' configuration when they need one.
fn engine() -> Command {
    let mut cmd = Command::new("podman");
    if let Some(Ok(Some(conf))) = UP.get() {
        cmd.env("CONTAINERS_CONF", conf);
    }
    cmd
}

/// Whether the test image runs `true` with the configuration CONF.
fn runs(conf: Option<&Path>) -> bool {
    let mut cmd = Command::new("podman");
    if let Some(conf) = conf {
        cmd.env("CONTAINERS_CONF", conf);
    }
    cmd.args([
        "run",
        "--rm",
        "--network=none",
        IMAGE,
        "/bin/sh",
        "-c",
        "true",
    ])
    .output()
    .is_ok_and(|o| o.status.success())
}

/// A configuration with runc (which takes a machine whose cgroups are half v1, half v2)
/// and the limits this process has, written once under the build directory.
fn conf() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("prodigy-test-podman");
    std::fs::create_dir_all(&dir).unwrap();
    // `ulimit`'s soft and hard limit of FLAG, at most MAX (runc may not set the number of
    // processes to what the machine allows).
    let limit = |flag: &str, max: u64| {
        let out = Command::new("bash")
            .args(["-c", &format!("ulimit -S{flag}; ulimit -H{flag}")])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut values = text
            .split_whitespace()
            .map(|v| v.parse::<u64>().unwrap_or(u64::MAX).min(max));
        let (soft, hard) = (values.next().unwrap(), values.next().unwrap());
        format!("{soft}:{hard}")
    };
    let runtime = if Path::new("/usr/sbin/runc").exists() || Path::new("/usr/bin/runc").exists() {
        "runtime = \"runc\"\n"
    } else {
        ""
    };
    let text = format!(
        "[containers]\ndefault_ulimits = [\"nofile={}\", \"nproc={}\"]\n[engine]\n{runtime}",
        limit("n", 1 << 20),
        limit("u", 4096),
    );
    let path = dir.join("containers.conf");
    std::fs::write(&path, text).unwrap();
    path
}

/// Imports the test image unless it is there: a root filesystem of this machine's `sh`,
/// `bash`, `git`, `sleep`, `cat` and the libraries they and prodigy load.
fn image() {
    let there = Command::new("podman")
        .args(["image", "exists", IMAGE])
        .status()
        .is_ok_and(|s| s.success());
    if there {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    for d in ["tmp", "dev", "proc", "etc", "root"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    let prodigy = assert_cmd::cargo::cargo_bin("prodigy");
    let mut files: Vec<PathBuf> = Vec::new();
    for program in ["sh", "bash", "git", "sleep", "cat"] {
        let path = which(program);
        files.extend(libraries(&path));
        let to = rootfs.join("usr/bin").join(program);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&path, &to).unwrap();
    }
    std::os::unix::fs::symlink("usr/bin", rootfs.join("bin")).unwrap();
    files.extend(libraries(&prodigy));
    for file in files {
        let to = rootfs.join(file.strip_prefix("/").unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&file, &to).unwrap();
    }
    let tar = dir.path().join("rootfs.tar");
    let out = Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = Command::new("podman")
        .args(["import", "-q"])
        .arg(&tar)
        .arg(IMAGE)
        .output()
        .unwrap();
    assert!(out.status.success(), "podman import: {out:?}");
}

/// PROGRAM on `PATH`, as its real file.
fn which(program: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap();
    let found = std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH"));
    std::fs::canonicalize(found).unwrap()
}

/// The shared libraries PROGRAM loads, as `ldd` lists them (with the loader).
fn libraries(program: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(program).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(PathBuf::from)
        .collect()
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
        std::fs::write(p.repo().join("wf.yml"), workflow).unwrap();
        p.git(&["init", "-q", "-b", "main"]);
        // In the repository's own configuration: the agents' commits in the containers
        // read it there.
        p.git(&["config", "user.name", "t"]);
        p.git(&["config", "user.email", "t@example.com"]);
        p.git(&["config", "commit.gpgsign", "false"]);
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

    fn git(&self, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(args)
            .current_dir(self.repo())
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn prodigy(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// `prodigy ARGS` in the project, with its `PRODIGY_HOME`, the tests' engine
    /// configuration, and no input.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::cargo_bin("prodigy").unwrap();
        cmd.args(args)
            .current_dir(self.repo())
            .env("PRODIGY_HOME", self.home())
            .env("PRODIGY_CONTAINER_ENGINE", "podman")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env_remove("PRODIGY_CONTAINER_IMAGE")
            .env_remove("PRODIGY_CONTAINER_ARGS")
            .env_remove("PRODIGY_CONTAINER_NETWORK")
            .stdin(std::process::Stdio::null());
        if let Some(Ok(Some(conf))) = UP.get() {
            cmd.env("CONTAINERS_CONF", conf);
        }
        cmd
    }

    fn job_dir(&self, job: &str) -> PathBuf {
        job::job_dir(&self.home(), job)
    }

    /// The job of the run under way, once N of its containers run (within 60 s).
    fn running(&self, n: usize) -> String {
        let deadline = std::time::Instant::now() + Duration::from_mins(1);
        loop {
            let job = std::fs::read_dir(self.home().join("state"))
                .ok()
                .and_then(|mut repos| {
                    let jobs = repos.next()?.ok()?.path().join("mapreduce/jobs");
                    let job = std::fs::read_dir(jobs).ok()?.next()?.ok()?;
                    Some(job.file_name().to_string_lossy().into_owned())
                });
            if let Some(job) = job
                && containers(&job, true).len() >= n
            {
                return job;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the containers did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
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

/// The containers of JOB (only running ones when RUNNING).
fn containers(job: &str, running: bool) -> Vec<String> {
    let label = format!("label=prodigy.job={job}");
    let mut args = vec!["ps", "-q", "--filter", &label];
    if !running {
        args.push("-a");
    }
    let out = engine().args(&args).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Removes what JOB's runs left (a failed test must not leave its containers behind).
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let ids = containers(&self.0, false);
        if !ids.is_empty() {
            let _ = engine().args(["rm", "-f"]).args(&ids).output();
        }
    }
}

/// Waits (up to 60 s) until JOB has no running container.
fn until_none_runs(job: &str) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_mins(1);
    loop {
        let left = containers(job, true);
        if left.is_empty() || std::time::Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn every_item_runs_once_in_a_container_of_its_own_and_its_commit_is_merged() {
    if !podman("every_item_runs_once_in_a_container") {
        return;
    }
    let p = Project::new(&format!(
        r#"name: container-all-items
mode: mapreduce
executor:
  container:
    image: {IMAGE}
    cpus: 1
    memory: 256m
map:
  input: "seq 1 3"
  max_parallel: 2
  agent_template:
    - shell: 'echo "$ITEM $PRODIGY_CONTAINER" > "item-$ITEM.txt" && git add "item-$ITEM.txt" && git commit -qm "item $ITEM"'
"#
    ));
    let out = p.prodigy(&["run", "-y", "--executor", "container", "wf.yml"]);
    let job = job_id(&out);
    let _cleanup = Cleanup(job.clone());
    assert!(out.status.success(), "{}", stderr(&out));
    for n in 1..=3 {
        let text = std::fs::read_to_string(p.repo().join(format!("item-{n}.txt")))
            .unwrap_or_else(|e| panic!("item {n} not merged: {e}\n{}", stderr(&out)));
        // Written inside the item's own container.
        let name = format!("prodigy-{job}-item_{}-1", n - 1);
        assert_eq!(text.trim(), format!("{n} {name}"));
    }
    // Once each: one commit per item.
    let log = p.git(&["log", "--format=%s"]);
    for n in 1..=3 {
        assert_eq!(
            log.lines().filter(|l| *l == format!("item {n}")).count(),
            1,
            "{log}"
        );
    }
    let results = p.results(&job);
    assert_eq!(results.len(), 3);
    for r in &results {
        assert_eq!(r["status"], "succeeded", "{r}");
        assert_eq!(r["task"]["backend"], "container", "{r}");
    }
    assert_eq!(containers(&job, false), Vec::<String>::new(), "left behind");
}

#[test]
fn the_network_is_off_in_the_containers_unless_the_workflow_allows_it() {
    if !podman("the_network_is_off_in_the_containers") {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let workflow = |network: bool| {
        format!(
            r#"name: container-network
mode: mapreduce
executor:
  container:
    image: {IMAGE}
    network: {network}
map:
  input: "seq 1 1"
  agent_template:
    - shell: 'bash -c "echo hello > /dev/tcp/127.0.0.1/{port}"'
"#
        )
    };
    let off = Project::new(&workflow(false));
    let out = off.prodigy(&["run", "--no-worktree", "--executor", "container", "wf.yml"]);
    let job = job_id(&out);
    let _cleanup = Cleanup(job.clone());
    let results = off.results(&job);
    assert_eq!(
        results[0]["status"], "failed",
        "reached the host: {results:?}"
    );
    let on = Project::new(&workflow(true));
    let out = on.prodigy(&["run", "--no-worktree", "--executor", "container", "wf.yml"]);
    let job = job_id(&out);
    let _cleanup = Cleanup(job.clone());
    assert!(out.status.success(), "{}", stderr(&out));
    let results = on.results(&job);
    assert_eq!(results[0]["status"], "succeeded", "{results:?}");
}

#[test]
fn an_agent_timeout_removes_its_container() {
    if !podman("an_agent_timeout_removes_its_container") {
        return;
    }
    let p = Project::new(&format!(
        r#"name: container-timeout
mode: mapreduce
executor:
  container:
    image: {IMAGE}
map:
  input: "seq 1 1"
  agent_timeout_secs: 2
  agent_template:
    - shell: 'sleep 120'
"#
    ));
    let started = std::time::Instant::now();
    let out = p.prodigy(&["run", "--no-worktree", "--executor", "container", "wf.yml"]);
    let job = job_id(&out);
    let _cleanup = Cleanup(job.clone());
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        started.elapsed() < Duration::from_mins(1),
        "took {:?}",
        started.elapsed()
    );
    let results = p.results(&job);
    assert_eq!(results[0]["error_type"], "Timeout", "{results:?}");
    assert_eq!(containers(&job, false), Vec::<String>::new(), "left behind");
}

const SLOW: &str = r#"name: container-slow
mode: mapreduce
executor:
  container:
    image: IMAGE
map:
  input: "seq 1 2"
  max_parallel: 2
  agent_template:
    - shell: 'sleep 120'
"#;

#[test]
fn an_interrupted_run_removes_its_containers() {
    if !podman("an_interrupted_run_removes_its_containers") {
        return;
    }
    let p = Project::new(&SLOW.replace("IMAGE", IMAGE));
    let child = p
        .command(&["run", "--no-worktree", "--executor", "container", "wf.yml"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let job = p.running(2);
    let _cleanup = Cleanup(job.clone());
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert_eq!(containers(&job, false), Vec::<String>::new(), "left behind");
}

#[test]
fn a_killed_coordinator_leaves_no_container_running_and_resume_removes_what_is_left() {
    if !podman("a_killed_coordinator_leaves_no_container_running") {
        return;
    }
    let p = Project::new(&SLOW.replace("IMAGE", IMAGE));
    let mut child = p
        .command(&["run", "--no-worktree", "--executor", "container", "wf.yml"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let job = p.running(2);
    let _cleanup = Cleanup(job.clone());
    child.kill().unwrap();
    child.wait().unwrap();
    // The coordinator's guard ends the agents' processes in their containers.
    assert_eq!(until_none_runs(&job), Vec::<String>::new(), "still running");
    // Resume removes the containers the killed coordinator left before items run again,
    // and runs the items anew (quickly, this time).
    std::fs::write(
        p.repo().join("wf.yml"),
        SLOW.replace("IMAGE", IMAGE).replace("sleep 120", "true"),
    )
    .unwrap();
    let out = p.prodigy(&[
        "resume-job",
        "-y",
        "--force",
        "--executor",
        "container",
        &job,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let results = p.results(&job);
    assert!(
        results.iter().all(|r| r["status"] == "succeeded"),
        "{results:?}"
    );
    assert_eq!(containers(&job, false), Vec::<String>::new(), "left behind");
}

#[test]
fn an_agent_reaches_its_own_worktree_and_nothing_else_of_the_user() {
    if !podman("an_agent_reaches_its_own_worktree_and_nothing_else_of_the_user") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("hook-ran");
    let p = Project::new("");
    let (repo, home) = (p.repo(), p.home());
    // Each escape the agent tries, and whether the system said no: the attempts are
    // committed with the item, so that the test sees they ran.
    let workflow = format!(
        r##"name: container-escapes
mode: mapreduce
executor:
  container:
    image: {IMAGE}
map:
  input: "seq 1 1"
  agent_template:
    - shell: |
        try() {{ if sh -c "$1" 2>/dev/null; then echo "done: $2"; else echo "refused: $2"; fi >> attempts.txt; }}
        try 'echo pwned > {repo}/README.md' checkout
        try 'mkdir -p {repo}/.git/hooks && printf "#!/bin/sh\ntouch {mark}\n" > {repo}/.git/hooks/post-merge && chmod +x {repo}/.git/hooks/post-merge' hooks
        try 'touch {repo}/.git/objects/planted' objects
        try 'echo "gitdir: /tmp" > .git' dotgit
        try 'touch {home}/planted && mkdir -p {home}/state/other && touch {home}/state/other/planted' home
        try 'git config core.hooksPath /tmp && git config core.fsmonitor "touch {mark}"' config
        git add attempts.txt && git commit -qm "item $ITEM"
"##,
        repo = repo.display(),
        home = home.display(),
        mark = mark.display(),
    );
    std::fs::write(repo.join("wf.yml"), workflow).unwrap();
    std::fs::write(repo.join("README.md"), "the user's\n").unwrap();
    p.git(&["add", "wf.yml", "README.md"]);
    p.git(&["commit", "-qm", "escapes"]);
    let config_before = std::fs::read_to_string(repo.join(".git/config")).unwrap();
    let out = p.prodigy(&["run", "-y", "--executor", "container", "wf.yml"]);
    let job = job_id(&out);
    let _cleanup = Cleanup(job.clone());
    assert!(out.status.success(), "{}", stderr(&out));
    // The item's own work is merged, with what it tried.
    let attempts = std::fs::read_to_string(repo.join("attempts.txt"))
        .unwrap_or_else(|e| panic!("the item was not merged: {e}\n{}", stderr(&out)));
    for refused in ["objects", "dotgit"] {
        assert!(
            attempts.contains(&format!("refused: {refused}")),
            "{refused}: {attempts}"
        );
    }
    // Nothing of the user's changed: the checkout, the git directory's hooks, objects and
    // configuration, `$PRODIGY_HOME`; and no hook ran on the host at the merge back.
    assert_eq!(
        std::fs::read_to_string(repo.join("README.md")).unwrap(),
        "the user's\n"
    );
    assert!(!repo.join(".git/hooks/post-merge").exists(), "{attempts}");
    assert!(!repo.join(".git/objects/planted").exists(), "{attempts}");
    assert_eq!(
        std::fs::read_to_string(repo.join(".git/config")).unwrap(),
        config_before
    );
    assert!(!home.join("planted").exists(), "{attempts}");
    assert!(!home.join("state/other").exists(), "{attempts}");
    assert!(
        !mark.exists(),
        "a hook or a command the agent set ran on the host"
    );
    assert_eq!(p.git(&["status", "--porcelain"]), "");
}

/// An agent that cannot start in its container (here the engine runs `bash` on the prodigy
/// program) says why on its standard error: that reaches the item's failure in the DLQ.
#[test]
fn an_agent_that_cannot_start_in_its_container_says_why_in_the_dlq() {
    if !podman("an_agent_that_cannot_start_in_its_container_says_why_in_the_dlq") {
        return;
    }
    let p = Project::new(&format!(
        r#"name: container-no-start
mode: mapreduce
executor:
  container:
    image: {IMAGE}
map:
  input: "seq 1 1"
  agent_template:
    - shell: 'true'
"#
    ));
    let out = p
        .command(&["run", "-y", "--executor", "container", "wf.yml"])
        .env("PRODIGY_CONTAINER_ARGS", "--entrypoint=/usr/bin/bash")
        .output()
        .unwrap();
    let job = job_id(&out);
    let _cleanup = Cleanup(job.clone());
    let results = p.results(&job);
    let error = results[0]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("ended without the agent's result")
            && error.contains("cannot execute binary file"),
        "{results:?}\n{}",
        stderr(&out)
    );
}
