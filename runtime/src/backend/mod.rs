//! Where a map agent's steps run: the agent backends behind `--executor`.
//!
//! The coordinator ([`crate::mapreduce`]) keeps everything around an agent (the error
//! policy, the breaker, the DLQ, checkpoints, worktrees, the merge queue, resume) and asks
//! an [`AgentBackend`] only to run the agent's steps for one item: submit it, learn how it
//! ended, cancel it, and find what a killed coordinator left for the item. [`LocalBackend`] runs the
//! steps in this process; [`crate::backend::slurm`] as Slurm array tasks and [`container`] in one
//! container per agent run `prodigy agent` ([`run_task`]), which writes a [`TaskResult`]
//! atomically to a file the coordinator waits for. A task is named in records, the DLQ and
//! the `task_*` events by a backend-neutral [`TaskRef`].
//!
//! A new backend implements [`AgentBackend`] in a module of its own, adds its variant to
//! `--executor` (`src/agent.rs`) and, when it has options, a key under the workflow's
//! `executor:` (ARCHITECTURE.md, "Agent backends").

pub mod container;
mod local;
pub mod noshare;
pub mod slurm;
pub mod task;

pub use task::{SlurmIds, TaskRef};

pub use local::LocalBackend;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::dlq::{CommandTail, ErrorType};
use crate::runner::{Runner, StepFailure};
use crate::vars::Vars;

/// A future of a backend, on the coordinator's thread (a [`Runner`] is not `Send`).
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// What runs map agents somewhere else than in the coordinator's process.
pub trait AgentBackend: std::fmt::Debug + Send + Sync {
    /// Its name in `--executor`, task references and events (`local`, `slurm`,
    /// `container`).
    fn name(&self) -> &'static str;

    /// Whether its tasks may outlive the coordinator that submitted them: a task a killed
    /// coordinator left may then still work in its agent worktree, which a resumed job
    /// must not take back into its pool.
    fn outlives_coordinator(&self) -> bool {
        true
    }

    /// How many agents may be under way at once for `max_parallel` running (a backend
    /// that queues work may keep more submitted than running).
    fn admit_limit(&self, max_parallel: usize) -> usize {
        max_parallel
    }

    /// Runs D's item (submitting it, or adopting what a killed coordinator left when
    /// `d.adopt`), waits until it ends, and cancels it on its timeout, on the run's signal
    /// or when the job stops; what ran it is in the answer's `task`. RUNNER is the agent's
    /// ([`Runner::in_agent`]); VARS are the item's, which steps run in this process change
    /// (the merge sees what they captured).
    fn dispatch<'a>(
        &'a self,
        runner: &'a Runner,
        d: Dispatch,
        vars: &'a mut Vars,
    ) -> Pending<'a, Dispatched>;

    /// The worktree of the task a killed coordinator left for item INDEX of the job in
    /// `job_dir`, when that task is adopted rather than run again.
    fn adoptable<'a>(
        &'a self,
        runner: &'a Runner,
        job_dir: &'a Path,
        index: usize,
    ) -> Pending<'a, Option<Option<crate::worktree::records::AgentWorktree>>>;

    /// Ends what earlier coordinators of job JOB left running on this backend before any
    /// item runs again (resume, `dlq retry`); a backend that adopts its tasks leaves them.
    fn end_earlier<'a>(&'a self, _runner: &'a Runner, _job: &'a str) -> Pending<'a, ()> {
        Box::pin(async {})
    }
}

/// Where a MapReduce job's agents run: the backend `--executor` chose, [`LocalBackend`]
/// unless another is named. The coordinator asks only the [`AgentBackend`] it derefs to.
#[derive(Clone, Debug)]
pub struct AgentHost(Arc<dyn AgentBackend>);

impl AgentHost {
    /// Agents run through BACKEND.
    pub fn new(backend: Arc<dyn AgentBackend>) -> Self {
        AgentHost(backend)
    }

    /// Agents run in this process ([`LocalBackend`]).
    pub fn local() -> Self {
        AgentHost(Arc::new(LocalBackend))
    }
}

impl Default for AgentHost {
    fn default() -> Self {
        AgentHost::local()
    }
}

impl std::ops::Deref for AgentHost {
    type Target = dyn AgentBackend;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl TaskRef {
    /// The task this process runs in, from what its backend put in its environment
    /// (`SLURM_ARRAY_JOB_ID`, `PRODIGY_CONTAINER`).
    pub fn from_env() -> Option<TaskRef> {
        if let Some(ids) = task_ids_from_env() {
            return Some(TaskRef {
                node: std::env::var("SLURMD_NODENAME").ok(),
                ..TaskRef::from(&ids)
            });
        }
        let name = std::env::var(container::NAME_ENV).ok()?;
        Some(TaskRef {
            backend: "container".to_owned(),
            id: name,
            node: std::env::var(container::HOST_ENV).ok(),
        })
    }
}

/// A task file could not be written.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("cannot write `{path}`: {source}")]
#[diagnostic(
    code(prodigy::backend::io),
    help("check the free space and permissions there")
)]
pub struct TaskFileError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub source: std::io::Error,
}

/// How an agent run inside a task ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskEnd {
    /// Every step succeeded.
    Succeeded,
    /// A step failed.
    Failed,
    /// The task was told to stop (SIGTERM from its backend: `scancel`, Slurm, the engine).
    Cancelled,
}

/// The step that failed inside a task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskFailure {
    /// `shell: ...` or `claude: ...`.
    pub step: String,
    /// Why it failed (secrets masked).
    pub message: String,
    /// The DLQ's classification.
    pub error_type: ErrorType,
    /// The failing command's exit code and the last lines of its output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<CommandTail>,
    /// The log of the Claude call that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<PathBuf>,
}

/// What a task writes to its result file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    /// How the agent ended.
    pub end: TaskEnd,
    /// The stdout of the agent's last command (secrets masked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// The step that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<TaskFailure>,
    /// How long the agent ran, in seconds.
    pub duration_secs: f64,
    /// The task it ran in (results of earlier versions: `slurm`).
    #[serde(default, alias = "slurm", skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskRef>,
    /// `SLURMD_NODENAME` in results of earlier versions (now in `task`).
    #[serde(default, skip_serializing)]
    pub node: Option<String>,
    /// What the agent's Claude calls cost, when it made any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claude: Option<crate::claude::Totals>,
    /// The agent's Claude sessions, logs and last failed kind.
    #[serde(flatten)]
    pub trail: crate::jobstore::ItemTrail,
}

/// Where the task whose result goes to RESULT says that it started.
pub fn started_path(result: &Path) -> PathBuf {
    result.with_extension("started")
}

/// Notes that the task whose result goes to RESULT started: its agent timeout runs from now.
/// Only the empty file's existence counts, so it is created, not written atomically.
///
/// # Errors
///
/// The file could not be created.
pub fn mark_started(result: &Path) -> Result<(), TaskFileError> {
    let path = started_path(result);
    task_file(&path)
        .map(drop)
        .map_err(|source| TaskFileError { path, source })
}

/// Writes RESULT to PATH atomically: a temporary file renamed to PATH, so the coordinator
/// reads a whole result or none. Not fsynced (each task's end waited for two fsyncs): the
/// coordinator makes the outcome durable when it records it, and a result that a crash of
/// the node loses before that is a task without a result, as a task killed with it is.
///
/// # Errors
///
/// The file could not be written.
pub fn write_result(path: &Path, result: &TaskResult) -> Result<(), TaskFileError> {
    use std::io::Write as _;
    let failed = |source| TaskFileError {
        path: path.to_owned(),
        source,
    };
    let bytes = serde_json::to_vec_pretty(result).map_err(|e| failed(std::io::Error::other(e)))?;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let written = task_file(&tmp)
        .and_then(|mut file| file.write_all(&bytes))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(failed(e));
    }
    Ok(())
}

/// A task's file at PATH, created (or emptied) readable by its owner only, its directory
/// made when it is missing.
fn task_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let open = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(crate::durable::PRIVATE_FILE)
            .open(path)
    };
    match open() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            crate::durable::private_dir(path.parent().unwrap_or_else(|| Path::new(".")))?;
            open()
        }
        opened => opened,
    }
}

/// The result at PATH, when a whole one is there.
pub fn read_result(path: &Path) -> Option<TaskResult> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Runs the agent template for ITEM (index INDEX) in WORKDIR, inside a backend's task
/// (`prodigy agent`): the same steps, command timeouts and failure handling as a local
/// agent. The agent's overall timeout is the coordinator's (it cancels the task).
pub async fn run_task(
    runner: &Runner,
    mut vars: Vars,
    item: &Value,
    index: usize,
    total: usize,
    workdir: Option<PathBuf>,
) -> TaskResult {
    let spec = crate::mapreduce::AgentSpec::new(&runner.plan, false, total, AgentHost::local());
    vars.merge(
        "workflow",
        crate::runner::fields(json!({"name": runner.plan.name, "id": runner.session()})),
    );
    crate::mapreduce::item_vars(&mut vars, item, index, total);
    // `${verify.*}` is defined where the merge queue is verified; a task does not carry
    // why its item came back, so it reads as a first run's (docs/mapreduce.md, "Verified
    // integration").
    if runner
        .plan
        .merge
        .as_ref()
        .is_some_and(prodigy_plan::PlanMerge::queued)
    {
        vars.set(
            "verify",
            json!({ "output": "", "reason": "", "attempt": 0 }),
        );
    }
    let (scope, stop) = crate::mapreduce::scope_for(Some(index), Some(&spec), workdir);
    let started = Instant::now();
    let task = TaskRef::from_env();
    let agent = runner.in_agent(Rc::clone(&scope));
    if let Some(task) = &task {
        agent.record(&crate::events::Event::TaskStarted { task: task.clone() });
    }
    let (outcome, why) = crate::mapreduce::guarded(
        runner,
        stop,
        agent.run_agent_steps(&spec.steps, &mut vars),
        None,
        None,
    )
    .await;
    let end = match (why, outcome) {
        (Some(_), _) | (None, crate::machine::Outcome::Cancelled) => TaskEnd::Cancelled,
        (None, o) if o.continues_agent() => TaskEnd::Succeeded,
        (None, _) => TaskEnd::Failed,
    };
    // Masked here: the result file is written for the coordinator, on disk.
    let failure = scope.failure.borrow().clone().map(|f| TaskFailure {
        step: runner.mask(&f.step),
        message: runner.mask(&f.message),
        error_type: f.error_type,
        output: f.output.map(|o| crate::dlq::CommandTail {
            exit_code: o.exit_code,
            stdout: runner.mask(&o.stdout),
            stderr: runner.mask(&o.stderr),
        }),
        log: f.log,
    });
    let claude = *scope.claude.borrow();
    TaskResult {
        end,
        output: vars.last_output.take().map(|o| runner.mask(&o)),
        failure,
        duration_secs: started.elapsed().as_secs_f64(),
        task,
        node: None,
        claude: (claude.calls > 0).then_some(claude),
        trail: scope.trail.take(),
    }
}

fn task_ids_from_env() -> Option<SlurmIds> {
    let job = std::env::var("SLURM_ARRAY_JOB_ID").ok()?;
    let task = std::env::var("SLURM_ARRAY_TASK_ID").ok()?.parse().ok()?;
    Some(SlurmIds {
        slurm_job_id: job,
        slurm_task_id: task,
    })
}

/// How a dispatched agent ended, for the coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Every step succeeded.
    Succeeded,
    /// A step failed, or the task was lost.
    Failed,
    /// The agent's timeout ended it.
    TimedOut,
    /// It was cancelled (or never submitted).
    Cancelled,
}

/// What [`AgentBackend::dispatch`] reports.
#[derive(Debug)]
pub struct Dispatched {
    /// How it ended.
    pub end: Ended,
    /// The stdout of the agent's last command.
    pub output: Option<String>,
    /// The step that failed.
    pub(crate) failure: Option<StepFailure>,
    /// The task that ran it.
    pub task: Option<TaskRef>,
    /// What its Claude calls cost.
    pub claude: crate::claude::Totals,
    /// Its Claude sessions and logs.
    pub trail: crate::jobstore::ItemTrail,
    /// Set when the backend cannot go on (its controller does not answer): why. The item
    /// stays pending (`end` is `Cancelled`), and the job stops saying why.
    pub stop_job: Option<BackendLost>,
}

/// Why a backend cannot go on: its controller has answered none of prodigy's questions for
/// a while. What to do next depends on what was running (a job, or a DLQ retry), so the
/// words are made where that is known ([`BackendLost::why`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendLost {
    /// The controller as its configuration names it (host, port, file).
    pub controller: String,
    /// How long it answered nothing, in seconds.
    pub secs: u64,
}

impl BackendLost {
    /// The message: the controller's silence, what stops (STOPS), and NEXT, what to run once
    /// the controller is back.
    pub fn why(&self, stops: &str, next: &str) -> String {
        format!(
            "the Slurm controller {} has answered none of prodigy's questions for {} s; {stops}: start the controller (or check that this machine reaches it, `scontrol ping`), then {next}",
            self.controller, self.secs
        )
    }
}

impl Dispatched {
    /// A task prodigy stopped: no outcome of its own.
    pub fn ended(end: Ended, task: TaskRef) -> Self {
        Dispatched {
            end,
            output: None,
            failure: None,
            task: Some(task),
            claude: crate::claude::Totals::default(),
            trail: crate::jobstore::ItemTrail::default(),
            stop_job: None,
        }
    }

    /// An item stopped before its task was submitted.
    pub fn not_submitted() -> Self {
        Dispatched {
            end: Ended::Cancelled,
            output: None,
            failure: None,
            task: None,
            claude: crate::claude::Totals::default(),
            trail: crate::jobstore::ItemTrail::default(),
            stop_job: None,
        }
    }

    /// A task that failed at STEP with MESSAGE, without a result of its own.
    pub fn failed(
        step: &str,
        message: String,
        error_type: ErrorType,
        task: Option<TaskRef>,
    ) -> Self {
        Dispatched {
            end: Ended::Failed,
            output: None,
            failure: Some(StepFailure {
                step: step.into(),
                message,
                error_type,
                output: None,
                log: None,
            }),
            task,
            claude: crate::claude::Totals::default(),
            trail: crate::jobstore::ItemTrail::default(),
            stop_job: None,
        }
    }

    /// The outcome a task wrote, the task being TASK unless it named itself.
    pub fn from_result(result: TaskResult, task: TaskRef) -> Self {
        let end = match result.end {
            TaskEnd::Succeeded => Ended::Succeeded,
            TaskEnd::Failed => Ended::Failed,
            TaskEnd::Cancelled => Ended::Cancelled,
        };
        Dispatched {
            end,
            output: result.output,
            failure: result.failure.map(|f| StepFailure {
                step: f.step,
                message: f.message,
                error_type: f.error_type,
                output: f.output,
                log: f.log,
            }),
            task: Some(match result.task {
                Some(t) => TaskRef {
                    node: t.node.or(result.node),
                    ..t
                },
                None => task,
            }),
            claude: result.claude.unwrap_or_default(),
            trail: result.trail,
            stop_job: None,
        }
    }
}

/// What one item's dispatch needs.
#[derive(Debug)]
pub struct Dispatch {
    /// The job's state directory.
    pub job_dir: PathBuf,
    /// The job.
    pub job_id: String,
    /// The item's index.
    pub index: usize,
    /// The item's attempt.
    pub attempt: u32,
    /// The agent's worktree.
    pub worktree: Option<crate::worktree::records::AgentWorktree>,
    /// The agent's timeout, counted from when its task starts.
    pub timeout: Option<Duration>,
    /// Set when running agents are cancelled (`--cancel-running`).
    pub halt: Option<watch::Receiver<bool>>,
    /// Whether the task a killed coordinator submitted for the item is adopted.
    pub adopt: bool,
    /// The job's `max_parallel`: how many slots its tasks run in.
    pub parallel: usize,
    /// Set when the job stops: a task still waiting in the queue is cancelled (its item
    /// stays pending), as a local agent that had not started would not start.
    pub stopping: Option<watch::Receiver<bool>>,
    /// The agent's steps (a backend whose task runs `prodigy agent` finds them in the
    /// workflow it reads).
    pub steps: Vec<prodigy_plan::StepId>,
    /// Stops the agent's own commands (its scope's cancel signal), for a backend that runs
    /// them in this process.
    pub stop: watch::Sender<bool>,
}

/// This machine's host name, the `node` of a task that runs here.
pub(crate) fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "localhost".to_owned(), |h| h.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_ref_reads_both_its_own_form_and_slurm_ids() {
        let current: TaskRef =
            serde_json::from_str(r#"{"backend":"container","id":"prodigy-j-item_0-1"}"#).unwrap();
        assert_eq!(current.backend, "container");
        assert_eq!(current.node, None);
        let old: TaskRef =
            serde_json::from_str(r#"{"slurm_job_id":"41","slurm_task_id":3}"#).unwrap();
        assert_eq!(
            old,
            TaskRef {
                backend: "slurm".into(),
                id: "41_3".into(),
                node: None
            }
        );
    }

    #[test]
    fn a_result_file_of_an_earlier_version_gives_its_task_and_node() {
        let old = r#"{"end":"succeeded","duration_secs":0.1,"slurm":{"slurm_job_id":"9","slurm_task_id":1},"node":"n1"}"#;
        let result: TaskResult = serde_json::from_str(old).unwrap();
        let fallback = TaskRef {
            backend: "slurm".into(),
            id: "0_0".into(),
            node: None,
        };
        let done = Dispatched::from_result(result, fallback);
        assert_eq!(
            done.task,
            Some(TaskRef {
                backend: "slurm".into(),
                id: "9_1".into(),
                node: Some("n1".into())
            })
        );
    }
}
