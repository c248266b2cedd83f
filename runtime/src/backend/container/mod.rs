//! Map agents in containers (`--executor container`, docs/containers.md).
//!
//! Each agent runs `prodigy agent` (the coordinator's own executable, mounted read-only at
//! its path) in a container of its own made from the image the run names, as the user who
//! runs prodigy, without capabilities, the network off unless allowed, and CPU and memory
//! limits. It reaches only what [`sandbox`] mounts: its own worktree, with a private git
//! directory the coordinator makes and reads back, and its job's state. The container is
//! named `prodigy-JOB-item_N-ATTEMPT` and labelled `prodigy.job=JOB`; its processes carry
//! the run's mark (`reap::mark`), so a coordinator's guard ends them when the coordinator
//! dies, and resume removes every container an earlier coordinator of the job left
//! ([`AgentBackend::end_earlier`]) before items run again: a container is never adopted.
//! As on Slurm, the task writes its [`TaskResult`] atomically to a file the coordinator
//! waits for; the container is removed once it has ended, or at once (`rm -f`) on the
//! agent's timeout, Ctrl-C or `--cancel-running`.

mod sandbox;

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use super::{
    AgentBackend, Dispatch, Dispatched, Ended, Pending, TaskRef, read_result, started_path,
};
use crate::dlq::ErrorType;
use crate::message::Message;
use crate::runner::Runner;

/// What a container's processes find in their environment: the container's name.
pub const NAME_ENV: &str = "PRODIGY_CONTAINER";
/// What a container's processes find in their environment: the coordinator's host name.
pub const HOST_ENV: &str = "PRODIGY_CONTAINER_HOST";
/// The label that names a container's job.
pub const JOB_LABEL: &str = "prodigy.job";

/// How agents run in containers.
#[derive(Clone, Debug)]
pub struct ContainerOptions {
    /// The container engine: `podman`, or `docker`.
    pub engine: String,
    /// The `prodigy` program the containers run, mounted read-only at its path (the image
    /// needs the C library it was built against, a shell, git, and the Claude CLI for
    /// Claude steps).
    pub program: PathBuf,
    /// The image (`PRODIGY_CONTAINER_IMAGE`), instead of the workflow's
    /// `executor.container.image`.
    pub image: Option<String>,
    /// Whether the agents may use the network (the host's), whatever the workflow says
    /// (`PRODIGY_CONTAINER_NETWORK=host`).
    pub network: bool,
    /// CPUs per agent (`--cpus`), instead of the workflow's.
    pub cpus: Option<String>,
    /// Memory per agent (`--memory`), instead of the workflow's.
    pub memory: Option<String>,
    /// More `run` options, passed as they are (`PRODIGY_CONTAINER_ARGS`).
    pub run_args: Vec<String>,
    /// How often the coordinator looks for result files.
    pub poll: Duration,
}

/// A problem running an agent's container.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("`{command}` failed: {message}")]
#[diagnostic(
    code(prodigy::container::command),
    help("check that the engine runs containers here (`podman run --rm IMAGE true`)")
)]
pub struct ContainerError {
    /// The command.
    pub command: String,
    /// Its stderr, or why it could not run.
    pub message: String,
}

impl AgentBackend for ContainerOptions {
    fn name(&self) -> &'static str {
        "container"
    }

    fn dispatch<'a>(
        &'a self,
        runner: &'a Runner,
        d: Dispatch,
        _vars: &'a mut crate::vars::Vars,
    ) -> Pending<'a, Dispatched> {
        // The task's `prodigy agent` sets the item's variables itself.
        Box::pin(dispatch(runner, self, d))
    }

    /// A container is never adopted: [`AgentBackend::end_earlier`] removed it.
    fn adoptable<'a>(
        &'a self,
        _runner: &'a Runner,
        _job_dir: &'a Path,
        _index: usize,
    ) -> Pending<'a, Option<Option<crate::worktree::records::AgentWorktree>>> {
        Box::pin(async { None })
    }

    fn end_earlier<'a>(&'a self, runner: &'a Runner, job: &'a str) -> Pending<'a, ()> {
        Box::pin(async move {
            let filter = format!("label={JOB_LABEL}={job}");
            let listed = engine(
                &self.engine,
                &["ps", "-aq", "--filter", &filter].map(str::to_owned),
            )
            .await;
            match listed {
                Ok(ids) => {
                    let ids: Vec<String> = ids.split_whitespace().map(str::to_owned).collect();
                    if ids.is_empty() {
                        return;
                    }
                    let mut args = vec!["rm".to_owned(), "-f".to_owned()];
                    args.extend(ids);
                    if let Err(e) = engine(&self.engine, &args).await {
                        runner.say_for_run(Message::ContainersNotRemoved(e.to_string()));
                    }
                }
                Err(e) => runner.say_for_run(Message::ContainersNotRemoved(e.to_string())),
            }
        })
    }
}

/// Runs ENGINE with ARGS, marked as the run's, to its end.
async fn run_engine(program: &str, args: &[&str]) -> std::io::Result<std::process::Output> {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    crate::reap::mark(&mut command);
    command.output().await
}

/// Runs ENGINE with ARGS and returns its stdout.
async fn engine(program: &str, args: &[String]) -> Result<String, ContainerError> {
    let line = || format!("{program} {}", args.join(" "));
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_engine(program, &words)
        .await
        .map_err(|e| ContainerError {
            command: line(),
            message: e.to_string(),
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(ContainerError {
            command: line(),
            message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// The directory of a job's container files.
pub fn dir(job_dir: &Path) -> PathBuf {
    crate::layout::backend_dir(job_dir, "container")
}

/// The container of item INDEX's ATTEMPT of JOB.
pub fn container_name(job: &str, index: usize, attempt: u32) -> String {
    let job: String = job
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("prodigy-{job}-item_{index}-{attempt}")
}

/// The `run` arguments of D's container NAME, writing its result to RESULT, with MOUNTS
/// ([`sandbox::Sandbox`]).
fn run_args(
    o: &ContainerOptions,
    runner: &Runner,
    d: &Dispatch,
    name: &str,
    result: &Path,
    mounts: &[String],
) -> Vec<String> {
    let home = runner.opts.layout.home.display().to_string();
    let project = runner.opts.project.display().to_string();
    let program = o.program.display().to_string();
    let workdir = d.worktree.as_ref().map(|w| w.workdir.display().to_string());
    let workflow = runner.plan.container.as_ref();
    let network = o.network || workflow.is_some_and(|c| c.network);
    let image = o
        .image
        .clone()
        .or_else(|| {
            workflow
                .and_then(|c| c.image.as_ref())
                .map(|i| i.value.clone())
        })
        .unwrap_or_default();
    let cpus = o.cpus.clone().or_else(|| {
        workflow
            .and_then(|c| c.cpus.as_ref())
            .map(|c| c.value.to_string())
    });
    let memory = o.memory.clone().or_else(|| {
        workflow
            .and_then(|c| c.memory.as_ref())
            .map(|m| m.value.clone())
    });
    let mut args = vec![
        "run".to_owned(),
        "-d".to_owned(),
        "--name".to_owned(),
        name.to_owned(),
        "--label".to_owned(),
        format!("{JOB_LABEL}={}", d.job_id),
        format!("--network={}", if network { "host" } else { "none" }),
        // The run's mark, from the engine's own environment (`reap::mark`).
        "--env".to_owned(),
        crate::reap::OWNER_ENV.to_owned(),
        "--env".to_owned(),
        format!("{NAME_ENV}={name}"),
        "--env".to_owned(),
        format!("{HOST_ENV}={}", super::this_host()),
        // No capability (a root agent cannot pass a file's permissions or mount anything
        // over what it was given), and nothing gained through a set-user-id program.
        "--cap-drop=all".to_owned(),
        "--security-opt=no-new-privileges".to_owned(),
        "-w".to_owned(),
        workdir.clone().unwrap_or(project),
    ];
    args.extend(user_args(&o.engine));
    for m in mounts {
        args.extend(["-v".to_owned(), m.clone()]);
    }
    if let Some(cpus) = cpus {
        args.push(format!("--cpus={cpus}"));
    }
    if let Some(memory) = memory {
        args.push(format!("--memory={memory}"));
    }
    args.extend(o.run_args.iter().cloned());
    args.extend([
        image,
        program,
        "agent".to_owned(),
        "--item".to_owned(),
        d.index.to_string(),
        "--home".to_owned(),
        home,
        "--job".to_owned(),
        d.job_id.clone(),
        "--result".to_owned(),
        result.display().to_string(),
    ]);
    if let Some(w) = workdir {
        args.extend(["--workdir".to_owned(), w]);
    }
    args
}

/// Who the agent runs as: the user who runs prodigy, so that what it writes in its
/// worktree is theirs. Rootless podman maps that user into the container itself
/// (`--userns=keep-id`); otherwise the container runs as their uid and gid.
fn user_args(engine: &str) -> Vec<String> {
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    let podman = Path::new(engine)
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("podman"));
    if podman && !uid.is_root() {
        vec!["--userns=keep-id".to_owned()]
    } else {
        vec![format!("--user={uid}:{gid}")]
    }
}

/// Removes container NAME (`rm -f`, stopping it first with a grace period).
async fn remove(o: &ContainerOptions, runner: &Runner, name: &str) {
    let grace = runner.opts.grace.as_secs().max(1).to_string();
    let args = ["rm", "-f", "-t", &grace, name].map(str::to_owned);
    if let Err(e) = engine(&o.engine, &args).await {
        runner.say_for_run(Message::ContainersNotRemoved(e.to_string()));
    }
}

/// The last lines container NAME wrote, on either stream: the engine's `logs` gives the
/// container's standard error on its own standard error, where an agent that could not
/// start (or `prodigy agent` refusing) says why.
async fn output(o: &ContainerOptions, name: &str) -> String {
    match run_engine(&o.engine, &["logs", "--tail", "20", name]).await {
        Ok(out) => {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            text
        }
        Err(e) => format!("(its output could not be read: {e})"),
    }
}

/// Whether container NAME is still running; `None` when the engine could not tell.
async fn running(o: &ContainerOptions, name: &str) -> Option<bool> {
    let args = ["inspect", "-f", "{{.State.Running}}", name].map(str::to_owned);
    match engine(&o.engine, &args).await {
        Ok(out) => Some(out.trim() == "true"),
        Err(e) if e.message.contains("no such") => Some(false),
        Err(_) => None,
    }
}

/// Runs D's item in a container and waits for its outcome.
async fn dispatch(runner: &Runner, o: &ContainerOptions, mut d: Dispatch) -> Dispatched {
    let name = container_name(&d.job_id, d.index, d.attempt);
    let task = TaskRef {
        backend: "container".to_owned(),
        id: name.clone(),
        node: Some(super::this_host()),
    };
    let dir = dir(&d.job_dir);
    if let Err(e) = crate::durable::private_dir(&dir) {
        return Dispatched::failed(
            "container",
            format!("cannot create `{}`: {e}", dir.display()),
            ErrorType::Unknown,
            None,
        );
    }
    let result = crate::layout::task_result(&dir, d.index);
    let started = started_path(&result);
    for stale in [&result, &started] {
        let _ = std::fs::remove_file(stale);
    }
    // A container of the same name is an earlier attempt's: this coordinator removed it,
    // or an earlier coordinator left it, and `end_earlier` removed it; never two.
    let _ = engine(&o.engine, &["rm", "-f", &name].map(str::to_owned)).await;
    if *runner.cancel.borrow() {
        return Dispatched::not_submitted();
    }
    let sandbox = match sandbox::Sandbox::prepare(runner, &o.program, &d).await {
        Ok(sandbox) => sandbox,
        Err(why) => {
            let why = why.to_string();
            return Dispatched::failed("container", why, ErrorType::WorktreeError, Some(task));
        }
    };
    let args = run_args(o, runner, &d, &name, &result, &sandbox.mounts);
    if let Err(e) = engine(&o.engine, &args).await {
        remove(o, runner, &name).await;
        let _ = sandbox.bring_back().await;
        return Dispatched::failed(&o.engine, e.to_string(), ErrorType::Unknown, Some(task));
    }
    let done = wait(runner, o, &mut d, &name, task, &result).await;
    // The container is gone: what its agent committed comes back whatever its outcome (a
    // failed item's worktree keeps its commits for the DLQ).
    match sandbox.bring_back().await {
        Err(why) if done.end == Ended::Succeeded => {
            let why = why.to_string();
            Dispatched::failed("container", why, ErrorType::WorktreeError, done.task)
        }
        Ok(()) | Err(_) => done,
    }
}

/// Waits for the outcome of D's container NAME (TASK), whose agent writes RESULT; the
/// container is removed once it has ended.
async fn wait(
    runner: &Runner,
    o: &ContainerOptions,
    d: &mut Dispatch,
    name: &str,
    task: TaskRef,
    result: &Path,
) -> Dispatched {
    let name = name.to_owned();
    let started = started_path(result);
    runner.record(&crate::events::Event::TaskSubmitted {
        task: task.clone(),
        attempt: d.attempt,
    });
    let mut signal = runner.cancel.clone();
    let mut halt = d.halt.take();
    let mut deadline = None;
    let mut asked = Instant::now();
    loop {
        if let Some(r) = read_result(result) {
            remove(o, runner, &name).await;
            return finished(r, task, &name);
        }
        if deadline.is_none() && started.exists() {
            deadline = d.timeout.map(|t| Instant::now() + t);
        }
        let why = if deadline.is_some_and(|t| Instant::now() >= t) {
            Some((Ended::TimedOut, "timeout"))
        } else if *signal.borrow_and_update()
            || halt.as_mut().is_some_and(|h| *h.borrow_and_update())
        {
            Some((Ended::Cancelled, "cancelled"))
        } else {
            None
        };
        if let Some((end, reason)) = why {
            runner.record(&crate::events::Event::TaskCancelled {
                task: task.clone(),
                reason: reason.to_owned(),
            });
            remove(o, runner, &name).await;
            return Dispatched::ended(end, task);
        }
        if asked.elapsed() >= Duration::from_secs(1) {
            asked = Instant::now();
            if running(o, &name).await == Some(false) {
                if let Some(r) = read_result(result) {
                    remove(o, runner, &name).await;
                    return finished(r, task, &name);
                }
                let args = ["inspect", "-f", "{{.State.ExitCode}}", &name].map(str::to_owned);
                let code = engine(&o.engine, &args).await.unwrap_or_default();
                let logs = output(o, &name).await;
                remove(o, runner, &name).await;
                return Dispatched::failed(
                    "container",
                    runner.mask(&format!(
                        "the container {name} ended without the agent's result (exit code {}): {}",
                        code.trim(),
                        logs.trim()
                    )),
                    ErrorType::Unknown,
                    Some(task),
                );
            }
        }
        tokio::time::sleep(o.poll).await;
    }
}

/// The outcome of container NAME's agent; one that was told to stop when prodigy had not
/// asked (it returns before reading the result when it does) fails its item.
fn finished(result: super::TaskResult, task: TaskRef, name: &str) -> Dispatched {
    if result.end == super::TaskEnd::Cancelled {
        return Dispatched::failed(
            "container",
            format!("the container {name} was stopped outside prodigy before its agent finished"),
            ErrorType::Unknown,
            Some(task),
        );
    }
    Dispatched::from_result(result, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_names_hold_only_what_an_engine_accepts() {
        assert_eq!(
            container_name("mapreduce-20261126_1/x y", 3, 2),
            "prodigy-mapreduce-20261126_1-x-y-item_3-2"
        );
    }
}
