//! Map agents as Slurm jobs (docs/slurm.md).
//!
//! The coordinator ([`crate::mapreduce`]) keeps everything it does for a local agent (the
//! error policy, the breaker, the DLQ, worktrees and the merge queue); only the agent's
//! steps run elsewhere: [`dispatch`] submits one Slurm array task for the item, running
//! `prodigy agent` ([`run_task`]) in the item's worktree, and waits for the result file the
//! task writes atomically. That file is the truth; `squeue` and `scontrol` are asked only
//! when the task has left the queue without writing it (node failure, `scancel`, time
//! limit). Agent timeouts, `--cancel-running` and interrupts cancel the task with
//! `scancel`. Only the command-line tools are used (`sbatch --parsable`, `squeue -h -o`,
//! `scontrol show job -o`, `scancel`), whose text output is stable across versions.
//!
//! Files, under the job's state directory, in `slurm/`: `agent.sh` (the batch script),
//! `item_N.job` (the task submitted for the item, see [`Submitted`]), `item_N.result.json`
//! (the task's [`TaskResult`]) and `item_N.out` (the task's own stdout and stderr).

use crate::message::Message;
use std::path::{Path, PathBuf};

use crate::backend::{read_result, started_path};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

pub use crate::backend::task::SlurmIds;
use crate::backend::{
    AgentBackend, Dispatch, Dispatched, Ended, Pending, TaskEnd, TaskRef, TaskResult,
};
use crate::dlq::ErrorType;
use crate::runner::Runner;

/// How agents are submitted to Slurm.
#[derive(Clone, Debug)]
pub struct SlurmOptions {
    /// The `prodigy` program the tasks run (the coordinator's own executable: on a cluster,
    /// the same path must exist on every node).
    pub program: PathBuf,
    /// More `sbatch` options, passed as they are (partition, account, time limit, ...).
    pub sbatch_args: Vec<String>,
    /// How often the coordinator looks for result files.
    pub poll: Duration,
    /// How long the controller may answer none of the coordinator's questions before the
    /// job stops, its items left pending ([`UNREACHABLE_AFTER`]).
    pub unreachable_after: Duration,
    /// Since when it has answered none, shared by the job's dispatches.
    pub reach: std::sync::Arc<Reach>,
    /// The job's `max_parallel` slots, each a chain of tasks.
    pub slots: std::sync::Arc<Slots>,
    /// Hook (no shared filesystem, [`crate::backend::noshare`]): how tasks reach the job's
    /// served repository, set when it is served; tasks then use node-local paths only.
    pub remote: std::sync::Arc<std::sync::OnceLock<crate::backend::noshare::Remote>>,
}

impl AgentBackend for SlurmOptions {
    fn name(&self) -> &'static str {
        "slurm"
    }

    /// Each slot also has its next tasks waiting in the queue (one starts the moment the
    /// slot's running task ends, where a task submitted then would wait for the
    /// controller's next scheduling pass, about a second).
    fn admit_limit(&self, max_parallel: usize) -> usize {
        max_parallel.saturating_mul(SLOT_DEPTH)
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

    fn adoptable<'a>(
        &'a self,
        runner: &'a Runner,
        job_dir: &'a Path,
        index: usize,
    ) -> Pending<'a, Option<Option<crate::worktree::records::AgentWorktree>>> {
        Box::pin(async move { adoptable(runner, job_dir, index).await.map(|s| s.worktree) })
    }
}

/// How many tasks each slot holds: the running one and those waiting behind it.
const SLOT_DEPTH: usize = 3;

/// The `max_parallel` slots of a job on Slurm. Each holds the items whose tasks run one
/// after the other in it: a task is submitted with `--dependency=afterany:` on the task
/// before it in its slot, so at most `max_parallel` run at once on any cluster.
#[derive(Debug, Default)]
pub struct Slots {
    chains: std::sync::Mutex<Vec<Vec<Link>>>,
}

#[derive(Debug)]
struct Link {
    index: usize,
    /// `None` while its `sbatch` runs.
    ids: Option<SlurmIds>,
}

impl Slots {
    /// Puts item INDEX at the end of the shortest of the PARALLEL chains; its slot.
    fn reserve(&self, index: usize, parallel: usize) -> usize {
        let mut chains = crate::lock(&self.chains);
        if chains.len() < parallel.max(1) {
            chains.resize_with(parallel.max(1), Vec::new);
        }
        let slot = (0..chains.len())
            .min_by_key(|&s| chains.get(s).map_or(0, Vec::len))
            .unwrap_or(0);
        if let Some(chain) = chains.get_mut(slot) {
            chain.push(Link { index, ids: None });
        }
        slot
    }

    /// Where item INDEX stands in SLOT: what it is submitted after, or whose `sbatch` it
    /// still waits for.
    fn turn(&self, slot: usize, index: usize) -> Turn {
        let chains = crate::lock(&self.chains);
        let previous = chains.get(slot).and_then(|chain| {
            let at = chain.iter().position(|l| l.index == index)?;
            at.checked_sub(1).and_then(|p| chain.get(p))
        });
        match previous {
            None => Turn::Submit(None),
            Some(Link {
                ids: Some(ids),
                index: _,
            }) => Turn::Submit(Some(ids.clone())),
            Some(Link { ids: None, index }) => Turn::Wait { previous: *index },
        }
    }

    /// The task item INDEX is submitted after in SLOT: the one before it, once its `sbatch`
    /// has answered (an item whose `sbatch` failed leaves the chain, and the one before it
    /// counts). It waits as long as that takes, since submitting without the dependency
    /// would let more than `max_parallel` tasks run; every [`WAIT_NOTE`] it calls NOTE with
    /// the item it waits for and how long it has waited. `None` once STOPPED says so.
    async fn before(
        &self,
        slot: usize,
        index: usize,
        stopped: &mut dyn FnMut() -> bool,
        note: &mut dyn FnMut(usize, Duration),
    ) -> Option<Option<SlurmIds>> {
        let since = Instant::now();
        let mut noted = 0;
        loop {
            let previous = match self.turn(slot, index) {
                Turn::Submit(after) => return Some(after),
                Turn::Wait { previous } => previous,
            };
            if stopped() {
                return None;
            }
            let waited = since.elapsed();
            if let Some(n) = note_due(waited, noted) {
                noted = n;
                note(previous, waited);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Notes the task of item INDEX in SLOT.
    fn submitted(&self, slot: usize, index: usize, ids: &SlurmIds) {
        let mut chains = crate::lock(&self.chains);
        if let Some(link) = chains
            .get_mut(slot)
            .and_then(|c| c.iter_mut().find(|l| l.index == index))
        {
            link.ids = Some(ids.clone());
        }
    }

    /// Takes item INDEX out of its chain.
    fn release(&self, index: usize) {
        for chain in crate::lock(&self.chains).iter_mut() {
            chain.retain(|l| l.index != index);
        }
    }
}

/// Where an item stands in its slot ([`Slots::turn`]).
#[derive(Debug, PartialEq, Eq)]
enum Turn {
    /// Submit it, after this task when there is one.
    Submit(Option<SlurmIds>),
    /// Wait: the `sbatch` of item PREVIOUS, before it in the slot, has not answered yet.
    Wait { previous: usize },
}

/// How often a task that waits for the `sbatch` of the one before it says so.
const WAIT_NOTE: Duration = Duration::from_secs(30);

/// After waiting WAITED with NOTED notes made: `Some(notes)` when one more is due.
fn note_due(waited: Duration, noted: u32) -> Option<u32> {
    let due = u32::try_from(waited.as_secs() / WAIT_NOTE.as_secs()).unwrap_or(u32::MAX);
    (due > noted).then_some(due)
}

/// Takes an item out of its slot when its dispatch ends, however it ends.
struct Held<'a> {
    slots: &'a Slots,
    index: usize,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.slots.release(self.index);
    }
}

impl SlurmOptions {
    /// Options that run PROGRAM with no extra `sbatch` options, polling every 50 ms.
    pub fn new(program: PathBuf) -> Self {
        SlurmOptions {
            program,
            sbatch_args: Vec::new(),
            poll: Duration::from_millis(50),
            slots: std::sync::Arc::default(),
            unreachable_after: UNREACHABLE_AFTER,
            reach: std::sync::Arc::default(),
            remote: std::sync::Arc::default(),
        }
    }
}

/// How long a coordinator keeps asking a Slurm controller that answers none of its
/// questions (`squeue`, `sbatch`) before the job stops with its items pending, for
/// `resume-job` once the controller is back; `PRODIGY_SLURM_UNREACHABLE_SECS` sets it
/// (docs/slurm.md).
pub const UNREACHABLE_AFTER: Duration = Duration::from_mins(2);

/// Since when the Slurm controller has answered none of the coordinator's questions.
#[derive(Debug, Default)]
pub struct Reach {
    unanswered_since: std::sync::Mutex<Option<Instant>>,
}

impl Reach {
    /// Slurm answered.
    fn answered(&self) {
        *crate::lock(&self.unanswered_since) = None;
    }

    /// Slurm did not answer: for how long none has been answered.
    fn unanswered(&self) -> Duration {
        crate::lock(&self.unanswered_since)
            .get_or_insert_with(Instant::now)
            .elapsed()
    }
}

/// Whether E says that the controller could not be reached (rather than refusing).
fn unanswered(e: &SlurmError) -> bool {
    match e {
        SlurmError::Command { message, .. } => [
            "Unable to contact slurm controller",
            "no answer within",
            "Socket timed out",
            "Connection refused",
        ]
        .iter()
        .any(|m| message.contains(m)),
        SlurmError::Parse { .. } | SlurmError::Io { .. } => false,
    }
}

/// The controller the Slurm configuration names (`SlurmctldHost`, `SlurmctldPort` of
/// `SLURM_CONF`, else `/etc/slurm/slurm.conf`), for the message that it is unreachable.
fn controller() -> String {
    let conf = std::env::var_os("SLURM_CONF")
        .map_or_else(|| PathBuf::from("/etc/slurm/slurm.conf"), PathBuf::from);
    let text = std::fs::read_to_string(&conf).unwrap_or_default();
    let key = |name: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let host = key("SlurmctldHost").or_else(|| key("ControlMachine"));
    match (host, key("SlurmctldPort")) {
        (Some(host), Some(port)) => format!("`{host}` (port {port}, `{}`)", conf.display()),
        (Some(host), None) => format!("`{host}` (`{}`)", conf.display()),
        (None, _) => format!("of `{}`", conf.display()),
    }
}

/// The item whose task is TASK (none when it was never submitted) stays pending: the
/// controller has answered nothing for `unreachable_after`, and the job stops.
fn unreachable(slurm: &SlurmOptions, task: Option<TaskRef>) -> Dispatched {
    Dispatched {
        stop_job: Some(crate::backend::BackendLost {
            controller: controller(),
            secs: slurm.unreachable_after.as_secs(),
        }),
        task,
        ..Dispatched::not_submitted()
    }
}

/// What the coordinator keeps of a submitted task in `item_N.job`: enough to adopt it after
/// a crash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submitted {
    /// The task; `None` while `sbatch` runs (the file is written before, so that a task
    /// whose coordinator was killed before `sbatch` answered is still found, by name).
    #[serde(flatten)]
    pub ids: Option<SlurmIds>,
    /// The attempt of the item it runs.
    pub attempt: u32,
    /// Which coordinator submitted it: a task of another one (a coordinator that was
    /// killed) is adopted by `resume-job`; one of this coordinator is an earlier attempt.
    pub coordinator: String,
    /// Where it works.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<PathBuf>,
    /// Its agent worktree, which a coordinator that adopts the task merges from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<crate::worktree::records::AgentWorktree>,
}

/// A problem running an agent through Slurm.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum SlurmError {
    /// A Slurm command could not be started or failed.
    #[error("`{command}` failed: {message}")]
    #[diagnostic(
        code(prodigy::slurm::command),
        help(
            "check that the Slurm client tools are installed and that `sinfo` reaches the cluster"
        )
    )]
    Command {
        /// The command.
        command: String,
        /// Its stderr, or why it could not run.
        message: String,
    },
    /// `sbatch --parsable` printed no job id.
    #[error("`sbatch --parsable` printed `{output}`, not a job id")]
    #[diagnostic(
        code(prodigy::slurm::parse),
        help("prodigy needs a Slurm whose `sbatch --parsable` prints `JOBID` or `JOBID;CLUSTER`")
    )]
    Parse {
        /// What it printed.
        output: String,
    },
    /// A state file could not be written.
    #[error("cannot write `{path}`: {source}")]
    #[diagnostic(
        code(prodigy::slurm::io),
        help("check the free space and permissions there")
    )]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// TEXT split into words as a shell would (`PRODIGY_SBATCH_ARGS`); `None` when its quotes
/// do not close.
pub fn split_args(text: &str) -> Option<Vec<String>> {
    shlex::split(text)
}

/// The directory of a job's Slurm files.
pub fn dir(job_dir: &Path) -> PathBuf {
    crate::layout::backend_dir(job_dir, "slurm")
}

/// Where the task of item INDEX writes its result.
pub fn result_path(job_dir: &Path, index: usize) -> PathBuf {
    crate::layout::task_result(&dir(job_dir), index)
}

fn submitted_path(job_dir: &Path, index: usize) -> PathBuf {
    dir(job_dir).join(format!("item_{index}.job"))
}

/// Reads the job id out of what `sbatch --parsable` printed (`JOBID` or `JOBID;CLUSTER`).
///
/// # Errors
///
/// It printed no job id.
pub fn parse_job_id(stdout: &str) -> Result<String, SlurmError> {
    let id = stdout.trim().split(';').next().unwrap_or_default();
    if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) {
        Ok(id.to_owned())
    } else {
        Err(SlurmError::Parse {
            output: stdout.trim().to_owned(),
        })
    }
}

/// `JobState` and `Reason` from `scontrol show job -o` (one line of `Key=Value` words).
pub fn parse_scontrol(text: &str) -> Option<(String, String)> {
    let field = |key: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .map(str::to_owned)
    };
    let state = field("JobState=")?;
    Some((state, field("Reason=").unwrap_or_default()))
}

/// The failure of a task that Slurm stopped (it left the queue without a result, or its
/// agent wrote that it was told to stop when prodigy had not asked), from its final Slurm
/// STATE and REASON (`scontrol`'s words; empty when Slurm no longer knows the task).
pub fn lost_task(task: &str, state: &str, reason: &str) -> (String, ErrorType) {
    let why = match state {
        "" => "Slurm no longer knows it".to_owned(),
        "NODE_FAIL" => "its node failed (NODE_FAIL)".to_owned(),
        "TIMEOUT" => "it reached its Slurm time limit (TIMEOUT)".to_owned(),
        "CANCELLED" => "it was cancelled outside prodigy (CANCELLED)".to_owned(),
        "OUT_OF_MEMORY" => "it ran out of memory (OUT_OF_MEMORY)".to_owned(),
        "PREEMPTED" => "it was preempted (PREEMPTED)".to_owned(),
        "BOOT_FAIL" => "its node could not boot (BOOT_FAIL)".to_owned(),
        other => format!("it ended as {other}"),
    };
    let reason = match reason {
        "" | "None" => String::new(),
        r => format!(", reason `{r}`"),
    };
    let error_type = match state {
        "OUT_OF_MEMORY" => ErrorType::ResourceExhausted,
        "TIMEOUT" => ErrorType::Timeout,
        _ => ErrorType::Unknown,
    };
    (
        format!(
            "the Slurm task {task} stopped before its agent finished: {why}{reason}; its output is in the job's slurm/ directory"
        ),
        error_type,
    )
}

/// The batch script every task runs: `prodigy agent` for the task's item, with the
/// arguments `sbatch` passes on.
pub fn batch_script(program: &Path) -> String {
    let program = shlex::try_quote(&program.to_string_lossy())
        .map_or_else(|_| "prodigy".to_owned(), std::borrow::Cow::into_owned);
    format!(
        "#!/bin/sh\n# Written by prodigy: one map agent per Slurm array task.\nexec {program} agent --item \"$SLURM_ARRAY_TASK_ID\" \"$@\"\n"
    )
}

/// Runs the agent template for ITEM (index INDEX) in WORKDIR, inside a Slurm task: the
/// same steps, command timeouts and failure handling as a local agent. The agent's overall
/// timeout is the coordinator's (it cancels the task).
/// This coordinator's name in `item_N.job` files: its pid and when its runner started.
fn coordinator(runner: &Runner) -> String {
    format!("{}@{}", std::process::id(), runner.started_at)
}

/// How long a question to Slurm (`squeue`, `scontrol`, `scancel`) may take before it counts
/// as unanswered: a controller that stops answering must not hold the coordinator (each
/// client retries on its own for Slurm's `MessageTimeout`, 10 s by default).
const ASK_WITHIN: Duration = Duration::from_secs(15);

/// Runs PROGRAM with ARGS and returns its stdout; a question to Slurm fails after
/// [`ASK_WITHIN`], and `sbatch` (which may rightly take long on a busy controller) is not
/// bounded. See [`command_or_stop`] for one that a stop interrupts.
async fn command(program: &str, args: &[String]) -> Result<String, SlurmError> {
    let line = || format!("{program} {}", args.join(" "));
    let run = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = if program == "sbatch" {
        run.await
    } else {
        match tokio::time::timeout(ASK_WITHIN, run).await {
            Ok(out) => out,
            Err(_) => {
                return Err(SlurmError::Command {
                    command: line(),
                    message: format!(
                        "no answer within {} s (is the Slurm controller up?)",
                        ASK_WITHIN.as_secs()
                    ),
                });
            }
        }
    }
    .map_err(|e| SlurmError::Command {
        command: line(),
        message: e.to_string(),
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(SlurmError::Command {
            command: line(),
            message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// [`command`], unless SIGNAL is (or becomes) set first: `None` then, the command killed
/// (`kill_on_drop`). Ctrl-C and SIGTERM are honoured at once while Slurm does not answer.
async fn command_or_stop(
    program: &str,
    args: &[String],
    signal: &mut watch::Receiver<bool>,
) -> Option<Result<String, SlurmError>> {
    if *signal.borrow_and_update() {
        return None;
    }
    tokio::select! {
        out = command(program, args) => Some(out),
        _ = signal.wait_for(|stop| *stop) => None,
    }
}

/// Whether TASK is still pending or running (`squeue` lists it); `None` when `squeue`
/// could not tell.
async fn queued(task: &str) -> Option<bool> {
    let args = [
        "-h".to_owned(),
        "-j".to_owned(),
        task.to_owned(),
        "-o".to_owned(),
        "%T".to_owned(),
    ];
    match command("squeue", &args).await {
        Ok(out) => Some(!out.trim().is_empty()),
        // A job Slurm has already forgotten is an error for `squeue -j`.
        Err(SlurmError::Command { message, .. }) if message.contains("Invalid job id") => {
            Some(false)
        }
        Err(_) => None,
    }
}

/// The final state and reason of TASK, as `scontrol` still knows them.
async fn final_state(task: &str) -> (String, String) {
    let args = [
        "show".to_owned(),
        "job".to_owned(),
        "-o".to_owned(),
        task.to_owned(),
    ];
    command("scontrol", &args)
        .await
        .ok()
        .and_then(|out| parse_scontrol(&out))
        .unwrap_or_default()
}

/// The node of TASK and why its agent could not start there, as the task's job comment
/// says ([`crate::backend::noshare::NotStarted`]); `None` when it says nothing of it.
async fn not_started(task: &str) -> Option<(String, crate::backend::noshare::NotStarted)> {
    let args = [
        "-h".to_owned(),
        "-t".to_owned(),
        "all".to_owned(),
        "-j".to_owned(),
        task.to_owned(),
        "-o".to_owned(),
        "%N %k".to_owned(),
    ];
    let out = command("squeue", &args).await.ok()?;
    out.lines().find_map(|line| {
        let (node, comment) = line.split_once(' ')?;
        let why = crate::backend::noshare::NotStarted::parse(comment)?;
        let node = if node.is_empty() { "its node" } else { node };
        Some((node.to_owned(), why))
    })
}

/// Cancels TASK and waits (up to a minute) until it has left the queue, so that nothing
/// runs in its worktree any more.
async fn cancel(runner: &Runner, ids: &SlurmIds, why: &str) {
    let task = ids.task();
    runner.record(&crate::events::Event::TaskCancelled {
        task: TaskRef::from(ids),
        reason: why.to_owned(),
    });
    // After Ctrl-C or SIGTERM the coordinator waits no longer than its grace period, even
    // for a controller that does not answer: a task that outlives it is adopted or
    // cancelled by `resume-job`.
    let interrupted = *runner.cancel.borrow();
    let wait = if interrupted {
        runner.opts.grace
    } else {
        Duration::from_mins(1)
    };
    let deadline = Instant::now() + wait;
    match tokio::time::timeout_at(deadline, command("scancel", std::slice::from_ref(&task))).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => runner.say_for_run(Message::ScancelFailed {
            task: TaskRef::from(ids),
            why: e.to_string(),
        }),
        Err(_) => runner.say_for_run(Message::ScancelUnanswered {
            task: TaskRef::from(ids),
            waited: wait,
        }),
    }
    loop {
        match tokio::time::timeout_at(deadline, queued(&task)).await {
            Ok(Some(false)) => return,
            Ok(_) => {}
            Err(_) => break,
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    runner.say_for_run(Message::TaskStillQueued {
        task: TaskRef::from(ids),
        waited: wait,
        interrupted,
    });
}

/// The task a killed coordinator submitted for item INDEX when it can be adopted: it is
/// still queued or has written its result. Its worktree is the one the item must use.
pub(crate) async fn adoptable(runner: &Runner, job_dir: &Path, index: usize) -> Option<Submitted> {
    let mut earlier = std::fs::read(submitted_path(job_dir, index))
        .ok()
        .and_then(|t| serde_json::from_slice::<Submitted>(&t).ok())?;
    if earlier.coordinator == coordinator(runner) {
        return None;
    }
    let result = result_path(job_dir, index);
    if earlier.ids.is_none() {
        earlier.ids = match find_task(runner.session(), index).await {
            Some(ids) => Some(ids),
            None => read_result(&result)
                .and_then(|r| r.task)
                .and_then(|t| parse_task(&t.id)),
        };
    }
    let ids = earlier.ids.clone()?;
    let adopt = result.exists() || queued(&ids.task()).await == Some(true);
    adopt.then_some(earlier)
}

/// The queued task of item INDEX of JOB, found by its name and array index.
async fn find_task(job: &str, index: usize) -> Option<SlurmIds> {
    let args = [
        "-h".to_owned(),
        "-n".to_owned(),
        format!("prodigy-{job}"),
        "-o".to_owned(),
        "%i".to_owned(),
    ];
    let out = command("squeue", &args).await.ok()?;
    out.lines()
        .find_map(|line| parse_task(line).filter(|ids| ids.slurm_task_id == index))
}

/// `JOB_TASK` (running) or `JOB_[TASK]` (pending), as `squeue -o %i` prints an array task.
pub fn parse_task(text: &str) -> Option<SlurmIds> {
    let (job, task) = text.trim().split_once('_')?;
    let task = task.trim_start_matches('[').trim_end_matches(']');
    Some(SlurmIds {
        slurm_job_id: parse_job_id(job).ok()?,
        slurm_task_id: task.parse().ok()?,
    })
}

/// The task a killed coordinator left for D's item when D adopts it: one of the same
/// worktree whose ids Slurm knows. Anything else is submitted again.
pub(crate) async fn adopted(runner: &Runner, d: &Dispatch) -> Option<SlurmIds> {
    if !d.adopt {
        return None;
    }
    let earlier = adoptable(runner, &d.job_dir, d.index).await?;
    if earlier.worktree == d.worktree {
        earlier.ids
    } else {
        None
    }
}

/// Cancels the task a killed coordinator left for D's item when D does not adopt it (its
/// worktree is not D's) and Slurm still has it: the item runs again in a new task, never in
/// two at once, and the earlier task's outcome is never taken for the new one's.
pub(crate) async fn replace_earlier(runner: &Runner, d: &Dispatch) {
    if !d.adopt {
        return;
    }
    let Some(earlier) = adoptable(runner, &d.job_dir, d.index).await else {
        return;
    };
    if earlier.worktree == d.worktree {
        return;
    }
    if let Some(ids) = earlier.ids
        && queued(&ids.task()).await == Some(true)
    {
        cancel(runner, &ids, "not adopted").await;
    }
}

/// Submits the task of D's item, or adopts the one a killed coordinator left; `None` when
/// STOPPED said so before it was submitted.
async fn submit(
    runner: &Runner,
    slurm: &SlurmOptions,
    d: &Dispatch,
    slot: usize,
    stopped: &mut dyn FnMut() -> bool,
) -> Result<Option<(SlurmIds, bool)>, SlurmError> {
    let slurm_dir = dir(&d.job_dir);
    crate::durable::private_dir(&slurm_dir).map_err(io_error(&slurm_dir))?;
    let marker = submitted_path(&d.job_dir, d.index);
    if let Some(ids) = adopted(runner, d).await {
        slurm.slots.submitted(slot, d.index, &ids);
        return Ok(Some((ids, true)));
    }
    replace_earlier(runner, d).await;
    let args = sbatch_args(runner, slurm, d, &slurm_dir)?;
    // The task waits in the queue for the one before it in its slot, and starts as soon as
    // that one ends; until that one's `sbatch` has answered, this one is not submitted.
    // Shown without `-v`, unlike an agent's own lines: the whole job may be waiting.
    let mut note = |previous: usize, waited: Duration| {
        runner.say_for_run(Message::SbatchWaiting {
            item: d.index,
            previous,
            waited,
        });
    };
    let Some(after) = slurm.slots.before(slot, d.index, stopped, &mut note).await else {
        return Ok(None);
    };
    // Written before `sbatch` too, so that a task is never left unknown to `resume-job`.
    let mut record = Submitted {
        ids: None,
        attempt: d.attempt,
        coordinator: coordinator(runner),
        workdir: d.worktree.as_ref().map(|w| w.workdir.clone()),
        worktree: d.worktree.clone(),
    };
    let write = |record: &Submitted| {
        let bytes =
            serde_json::to_vec(record).map_err(|e| io_error(&marker)(std::io::Error::other(e)))?;
        crate::durable::write_atomic(&marker, &bytes).map_err(io_error(&marker))
    };
    write(&record)?;
    // Ctrl-C or SIGTERM stops an `sbatch` that Slurm does not answer: the item stays
    // pending, and `resume-job` finds the task by its name if Slurm took it after all.
    let mut signal = runner.cancel.clone();
    let Some(out) = sbatch(&args, after.as_ref(), &mut signal).await else {
        return Ok(None);
    };
    let ids = SlurmIds {
        slurm_job_id: parse_job_id(&out?)?,
        slurm_task_id: d.index,
    };
    slurm.slots.submitted(slot, d.index, &ids);
    record.ids = Some(ids.clone());
    write(&record)?;
    Ok(Some((ids, false)))
}

/// What turns an I/O error at PATH into a [`SlurmError`].
fn io_error(path: &Path) -> impl Fn(std::io::Error) -> SlurmError + use<> {
    let path = path.to_owned();
    move |source| SlurmError::Io {
        path: path.clone(),
        source,
    }
}

/// The `sbatch` arguments of D's task (the batch script, in the directory `slurm_dir`,
/// written when it changed), its earlier result and start mark removed.
fn sbatch_args(
    runner: &Runner,
    slurm: &SlurmOptions,
    d: &Dispatch,
    slurm_dir: &Path,
) -> Result<Vec<String>, SlurmError> {
    let result = result_path(&d.job_dir, d.index);
    for stale in [&result, &started_path(&result)] {
        match std::fs::remove_file(stale) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_error(stale)(e)),
            _ => {}
        }
    }
    let workdir = d.worktree.as_ref().map(|w| w.workdir.as_path());
    let script = slurm_dir.join("agent.sh");
    // Hook (no shared filesystem): the script carries the job's secret to the agent.
    let remote = slurm.remote.get();
    let text = remote.map_or_else(
        || batch_script(&slurm.program),
        |r| r.batch_script(&slurm.program),
    );
    if std::fs::read(&script).ok().as_deref() != Some(text.as_bytes()) {
        crate::durable::write_atomic(&script, text.as_bytes()).map_err(io_error(&script))?;
    }
    // Hook (no shared filesystem): no path on a node is known to be private before the
    // task's agent makes its directory, where it writes its own output
    // (`--output-on-node`); Slurm's goes nowhere, and the task starts at `/`.
    let (output, chdir) = match remote {
        Some(_) => (PathBuf::from("/dev/null"), PathBuf::from("/")),
        None => (
            slurm_dir.join(format!("item_{}.out", d.index)),
            workdir.unwrap_or(&runner.opts.project).to_owned(),
        ),
    };
    let mut args = vec![
        "--parsable".to_owned(),
        format!("--array={}", d.index),
        format!("--job-name=prodigy-{}", d.job_id),
        format!("--output={}", output.display()),
        "--open-mode=append".to_owned(),
        format!("--chdir={}", chdir.display()),
    ];
    // The workflow's `slurm:` first, so that `PRODIGY_SBATCH_ARGS` can override it.
    if let Some(options) = &runner.plan.slurm {
        args.extend(options.sbatch_options());
    }
    args.extend(slurm.sbatch_args.iter().cloned());
    args.push(script.display().to_string());
    if let Some(r) = remote {
        // Hook (no shared filesystem): the agent reaches the served repository only.
        args.extend(r.agent_args(true));
    } else {
        args.extend([
            "--home".to_owned(),
            runner.opts.layout.home.display().to_string(),
            "--job".to_owned(),
            d.job_id.clone(),
            "--result".to_owned(),
            result.display().to_string(),
        ]);
        if let Some(w) = workdir {
            args.extend(["--workdir".to_owned(), w.display().to_string()]);
        }
    }
    Ok(args)
}

/// Runs `sbatch` with ARGS, after the task AFTER (`--dependency=afterany:`) when there is
/// one that Slurm still knows; `None` when SIGNAL came first.
async fn sbatch(
    args: &[String],
    after: Option<&SlurmIds>,
    signal: &mut tokio::sync::watch::Receiver<bool>,
) -> Option<Result<String, SlurmError>> {
    let Some(previous) = after else {
        return command_or_stop("sbatch", args, signal).await;
    };
    let mut chained = args.to_vec();
    chained.insert(
        1,
        format!("--dependency=afterany:{}", previous.slurm_job_id),
    );
    match command_or_stop("sbatch", &chained, signal).await? {
        // A task Slurm has already forgotten cannot be waited for, nor needs to be.
        Err(SlurmError::Command { message, .. }) if message.contains("ependency") => {
            command_or_stop("sbatch", args, signal).await
        }
        other => Some(other),
    }
}

/// The outcome at RESULT of a task that has left the queue, which may come a moment after
/// it does: without a shared filesystem the agent pushes it to the served repository, and it
/// is written here by the next look there (every POLL); over a network filesystem another
/// node's file may be seen late. Looked for until three polls, and at least 3 s, have
/// passed; `None` then: the task ended without one.
async fn result_after_end(result: &Path, poll: Duration) -> Option<TaskResult> {
    let until = Instant::now() + (poll * 3).max(Duration::from_secs(3));
    loop {
        if let Some(r) = read_result(result) {
            return Some(r);
        }
        if Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The failure of a task Slurm stopped, once it has left the queue (up to 30 s), with the
/// state Slurm gives it; Ctrl-C or SIGTERM ends the wait at once.
async fn stopped_by_slurm(
    runner: &Runner,
    slurm: &SlurmOptions,
    ids: &SlurmIds,
    began: bool,
) -> Dispatched {
    let task = ids.task();
    let mut signal = runner.cancel.clone();
    let wait = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && queued(&task).await == Some(true) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        final_state(&task).await
    };
    let (state, reason) = tokio::select! {
        known = wait => known,
        _ = signal.wait_for(|stop| *stop) => Default::default(),
    };
    let (mut message, error_type) = lost_task(&task, &state, &reason);
    // Hook (no shared filesystem): the task's output is on its node, or was never written;
    // a node that could not start the agent said why in the task's comment.
    let told = match slurm.remote.get() {
        Some(_) if !began => not_started(&task).await,
        _ => None,
    };
    if let Some((node, why)) = told {
        message = why.on_task(&task, &node);
        runner.say_for_run(Message::AgentNotStarted {
            task: TaskRef::from(ids),
            node,
            why,
        });
    } else if !began {
        message = crate::backend::noshare::never_started(
            &message,
            slurm.remote.get().is_some(),
            state == "FAILED",
        );
    } else if let Some(r) = slurm.remote.get() {
        message = crate::backend::noshare::on_node(&message, &r.output(ids.slurm_task_id));
    }
    Dispatched::failed("slurm", message, error_type, Some(TaskRef::from(ids)))
}

/// What asking Slurm to keep a queued task from starting ([`keep_waiting_args`]) said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kept {
    /// It was still waiting and now will not start: it can be cancelled unstarted.
    Waiting,
    /// Slurm has already started it (or it has ended): its agent runs or ran.
    Started,
    /// Slurm could not be asked.
    Unknown,
}

/// `scontrol update` moving TASK's start time a year ahead: Slurm accepts it only for a task
/// still pending, and refuses it, in the same step, for one it has started.
fn keep_waiting_args(task: &str) -> Vec<String> {
    vec![
        "update".to_owned(),
        format!("JobId={task}"),
        "StartTime=now+365days".to_owned(),
    ]
}

/// What `scontrol` answering [`keep_waiting_args`] means.
fn kept_waiting(answer: &Result<String, SlurmError>) -> Kept {
    match answer {
        Ok(_) => Kept::Waiting,
        Err(SlurmError::Command { message, .. })
            if ["no longer pending", "already finished", "Invalid job id"]
                .iter()
                .any(|m| message.contains(m)) =>
        {
            Kept::Started
        }
        Err(_) => Kept::Unknown,
    }
}

/// [`submit`], tried again every 2 s while the controller cannot be reached, up to its
/// limit; Err is how the item's dispatch ends without a task.
async fn submit_within_reach(
    runner: &Runner,
    slurm: &SlurmOptions,
    d: &Dispatch,
    slot: usize,
    stopped: &mut dyn FnMut() -> bool,
) -> Result<(SlurmIds, bool), Dispatched> {
    loop {
        match submit(runner, slurm, d, slot, stopped).await {
            Ok(Some(submitted)) => {
                slurm.reach.answered();
                return Ok(submitted);
            }
            Ok(None) => return Err(Dispatched::not_submitted()),
            Err(e) if unanswered(&e) => {
                if slurm.reach.unanswered() >= slurm.unreachable_after {
                    return Err(unreachable(slurm, None));
                }
                let again = Instant::now() + Duration::from_secs(2);
                while Instant::now() < again {
                    if stopped() {
                        return Err(Dispatched::not_submitted());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Err(e) => {
                let failed = Dispatched::failed("sbatch", e.to_string(), ErrorType::Unknown, None);
                return Err(failed);
            }
        }
    }
}

/// Runs D's item as a Slurm task and waits for its outcome.
async fn dispatch(runner: &Runner, slurm: &SlurmOptions, mut d: Dispatch) -> Dispatched {
    let slot = slurm.slots.reserve(d.index, d.parallel);
    let _held = Held {
        slots: &slurm.slots,
        index: d.index,
    };
    let mut signal = runner.cancel.clone();
    let mut halt = d.halt.take();
    let mut stopping = d.stopping.take();
    // Before its task is submitted, an item stops for any of them.
    let mut stopped = || {
        *signal.borrow_and_update()
            || halt.as_mut().is_some_and(|h| *h.borrow_and_update())
            || stopping.as_mut().is_some_and(|h| *h.borrow_and_update())
    };
    let (ids, adopted) = match submit_within_reach(runner, slurm, &d, slot, &mut stopped).await {
        Ok(submitted) => submitted,
        Err(done) => return done,
    };
    let (task, attempt) = (TaskRef::from(&ids), d.attempt);
    runner.record(&if adopted {
        crate::events::Event::TaskAdopted { task, attempt }
    } else {
        crate::events::Event::TaskSubmitted { task, attempt }
    });
    let task = ids.task();
    let result = result_path(&d.job_dir, d.index);
    // The agent's timeout counts from when its task starts, not while it waits in the queue.
    let started = started_path(&result);
    let mut deadline = None;
    // Slurm is asked about a task without a result at most once a second.
    let mut asked = Instant::now();
    // When the job stops, a task still waiting in the queue is cancelled; one that Slurm has
    // started runs on like any running agent. Its `.started` file may come seconds after
    // Slurm starts it (a prolog, a slow node): only Slurm can tell, atomically.
    let mut runs_on = false;
    let mut asked_to_wait = None;
    loop {
        if let Some(r) = read_result(&result) {
            if r.end == TaskEnd::Cancelled {
                // Prodigy did not ask for it (it returns before reading when it does).
                return stopped_by_slurm(runner, slurm, &ids, started.exists()).await;
            }
            return Dispatched::from_result(r, TaskRef::from(&ids));
        }
        if deadline.is_none() && started.exists() {
            deadline = d.timeout.map(|t| Instant::now() + t);
        }
        if deadline.is_some_and(|t| Instant::now() >= t) {
            cancel(runner, &ids, "timeout").await;
            return Dispatched::ended(Ended::TimedOut, TaskRef::from(&ids));
        }
        if *signal.borrow_and_update() || halt.as_mut().is_some_and(|h| *h.borrow_and_update()) {
            cancel(runner, &ids, "cancelled").await;
            return Dispatched::ended(Ended::Cancelled, TaskRef::from(&ids));
        }
        if !runs_on
            && stopping.as_mut().is_some_and(|h| *h.borrow_and_update())
            && asked_to_wait.is_none_or(|at: Instant| at.elapsed() >= Duration::from_secs(1))
        {
            asked_to_wait = Some(Instant::now());
            let kept = if started.exists() {
                Kept::Started
            } else {
                match command_or_stop("scontrol", &keep_waiting_args(&task), &mut signal).await {
                    Some(answer) => kept_waiting(&answer),
                    // The signal is acted on at the top of the loop.
                    None => Kept::Unknown,
                }
            };
            match kept {
                Kept::Waiting => {
                    cancel(runner, &ids, "cancelled").await;
                    return Dispatched::ended(Ended::Cancelled, TaskRef::from(&ids));
                }
                Kept::Started => runs_on = true,
                // Asked again in a second.
                Kept::Unknown => {}
            }
        }
        if asked.elapsed() >= Duration::from_secs(1) {
            asked = Instant::now();
            // A signal while Slurm is slow to answer is acted on at the top of the loop.
            let mut interrupt = runner.cancel.clone();
            let answer = tokio::select! {
                answer = queued(&task) => Some(answer),
                _ = interrupt.wait_for(|stop| *stop) => None,
            };
            match answer {
                Some(Some(false)) => {
                    slurm.reach.answered();
                    if let Some(r) = result_after_end(&result, slurm.poll).await {
                        return Dispatched::from_result(r, TaskRef::from(&ids));
                    }
                    return stopped_by_slurm(runner, slurm, &ids, started.exists()).await;
                }
                Some(Some(true)) => slurm.reach.answered(),
                // Its result is read first: a task that ends while the controller is away
                // still counts. Without one, the job stops once the limit has passed.
                Some(None) if slurm.reach.unanswered() >= slurm.unreachable_after => {
                    return unreachable(slurm, Some(TaskRef::from(&ids)));
                }
                Some(None) | None => {}
            }
        }
        tokio::time::sleep(slurm.poll).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_outcome_that_comes_after_the_task_left_the_queue_is_still_the_items() {
        let dir = tempfile::tempdir().unwrap();
        let result = dir.path().join("item_1.json");
        let outcome: TaskResult =
            serde_json::from_str(r#"{"end": "succeeded", "duration_secs": 1.0}"#).unwrap();
        // Written a second after the task was seen gone, as a pushed outcome is.
        let late = {
            let (result, outcome) = (result.clone(), outcome.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                crate::backend::write_result(&result, &outcome).unwrap();
            })
        };
        let found = result_after_end(&result, Duration::from_millis(50)).await;
        late.await.unwrap();
        assert_eq!(found.map(|r| r.end), Some(TaskEnd::Succeeded));
        // None ever: the task ended without one, after the wait.
        let start = Instant::now();
        assert!(
            result_after_end(&dir.path().join("item_2.json"), Duration::from_millis(50))
                .await
                .is_none()
        );
        assert!(start.elapsed() >= Duration::from_secs(3));
    }

    #[test]
    fn sbatch_parsable_output_gives_the_job_id() {
        assert_eq!(parse_job_id("42\n").unwrap(), "42");
        assert_eq!(parse_job_id("42;cluster\n").unwrap(), "42");
        assert!(parse_job_id("Submitted batch job 42").is_err());
        assert!(parse_job_id("").is_err());
    }

    #[test]
    fn squeue_array_tasks_parse_running_and_pending() {
        let ids = |job: &str, task| SlurmIds {
            slurm_job_id: job.into(),
            slurm_task_id: task,
        };
        assert_eq!(parse_task("1201_3"), Some(ids("1201", 3)));
        assert_eq!(parse_task("1203_[5]\n"), Some(ids("1203", 5)));
        assert_eq!(parse_task("1203"), None);
        assert_eq!(parse_task("1203_[0-4%2]"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_controller_is_unreachable_for_as_long_as_none_of_its_answers_came() {
        let reach = Reach::default();
        assert_eq!(reach.unanswered(), Duration::ZERO);
        tokio::time::advance(Duration::from_secs(90)).await;
        // Every dispatch counts from the first question left unanswered.
        assert_eq!(reach.unanswered(), Duration::from_secs(90));
        reach.answered();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(reach.unanswered(), Duration::ZERO);
    }

    #[test]
    fn only_an_unreachable_controller_makes_sbatch_try_again() {
        let failed = |message: &str| SlurmError::Command {
            command: "sbatch".into(),
            message: message.into(),
        };
        assert!(unanswered(&failed(
            "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"
        )));
        assert!(unanswered(&failed(
            "no answer within 15 s (is the Slurm controller up?)"
        )));
        assert!(!unanswered(&failed(
            "sbatch: error: Batch job submission failed: Invalid partition name specified"
        )));
    }

    #[test]
    fn scontrol_gives_state_and_reason() {
        let line = "JobId=7 ArrayJobId=7 ArrayTaskId=3 JobName=x JobState=NODE_FAIL Reason=NodeDown Dependency=(null)";
        assert_eq!(
            parse_scontrol(line),
            Some(("NODE_FAIL".to_owned(), "NodeDown".to_owned()))
        );
        assert_eq!(
            parse_scontrol("slurm_load_jobs error: Invalid job id"),
            None
        );
    }

    #[test]
    fn a_lost_task_says_why_in_slurm_words() {
        let (message, kind) = lost_task("7_3", "NODE_FAIL", "NodeDown");
        assert!(message.contains("7_3"), "{message}");
        assert!(
            message.contains("its node failed (NODE_FAIL), reason `NodeDown`"),
            "{message}"
        );
        assert_eq!(kind, ErrorType::Unknown);
        assert_eq!(
            lost_task("7_3", "OUT_OF_MEMORY", "None").1,
            ErrorType::ResourceExhausted
        );
        assert_eq!(lost_task("7_3", "TIMEOUT", "").1, ErrorType::Timeout);
        assert!(
            lost_task("7_3", "", "")
                .0
                .contains("Slurm no longer knows it")
        );
    }

    fn ids(job: &str, task: usize) -> SlurmIds {
        SlurmIds {
            slurm_job_id: job.into(),
            slurm_task_id: task,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_is_submitted_after_the_one_before_it_however_long_its_sbatch_takes() {
        let slots = Slots::default();
        assert_eq!(slots.reserve(0, 1), 0);
        assert_eq!(slots.reserve(1, 1), 0);
        let notes = std::cell::RefCell::new(Vec::new());
        let started = Instant::now();
        let (mut never, mut note) = (
            || false,
            |previous, waited: Duration| notes.borrow_mut().push((previous, waited.as_secs())),
        );
        let (after, ()) = tokio::join!(slots.before(0, 1, &mut never, &mut note), async {
            // Item 0's `sbatch` answers after 75 s.
            tokio::time::sleep(Duration::from_secs(75)).await;
            slots.submitted(0, 0, &ids("41", 0));
        });
        assert_eq!(after, Some(Some(ids("41", 0))));
        assert!(started.elapsed() >= Duration::from_secs(75));
        assert_eq!(notes.into_inner(), [(0, 30), (0, 60)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_whose_predecessor_failed_to_submit_goes_after_the_one_before_that() {
        let slots = Slots::default();
        for index in 0..3 {
            slots.reserve(index, 1);
        }
        slots.submitted(0, 0, &ids("40", 0));
        let (mut never, mut note) = (|| false, |_, _| {});
        let (after, ()) = tokio::join!(slots.before(0, 2, &mut never, &mut note), async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            // Item 1's `sbatch` failed: its dispatch ended.
            slots.release(1);
        });
        assert_eq!(after, Some(Some(ids("40", 0))));
        assert_eq!(slots.turn(0, 0), Turn::Submit(None));
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_waiting_for_its_slot_is_never_submitted_once_the_job_stops() {
        let slots = Slots::default();
        slots.reserve(0, 1);
        slots.reserve(1, 1);
        let started = Instant::now();
        let mut stopped = || started.elapsed() >= Duration::from_secs(40);
        let after = slots.before(0, 1, &mut stopped, &mut |_, _| {}).await;
        assert_eq!(after, None);
        assert!(started.elapsed() < Duration::from_secs(41));
    }

    #[test]
    fn a_waiting_task_says_so_every_thirty_seconds() {
        assert_eq!(note_due(Duration::from_secs(29), 0), None);
        assert_eq!(note_due(Duration::from_secs(30), 0), Some(1));
        assert_eq!(note_due(Duration::from_secs(45), 1), None);
        assert_eq!(note_due(Duration::from_secs(61), 1), Some(2));
    }

    #[test]
    fn only_a_task_slurm_kept_from_starting_is_cancelled_unstarted() {
        let refused = |message: &str| {
            Err(SlurmError::Command {
                command: "scontrol update".into(),
                message: message.into(),
            })
        };
        assert_eq!(kept_waiting(&Ok(String::new())), Kept::Waiting);
        assert_eq!(
            kept_waiting(&refused("7223_3: Job is no longer pending execution")),
            Kept::Started
        );
        assert_eq!(
            kept_waiting(&refused("7223_3: Job has already finished")),
            Kept::Started
        );
        assert_eq!(
            kept_waiting(&refused(
                "slurm_update error: Unable to contact slurm controller"
            )),
            Kept::Unknown
        );
        assert_eq!(
            keep_waiting_args("7_3"),
            ["update", "JobId=7_3", "StartTime=now+365days"]
        );
    }

    #[test]
    fn the_batch_script_quotes_the_program() {
        let s = batch_script(Path::new("/opt/my tools/prodigy"));
        assert!(
            s.contains("exec '/opt/my tools/prodigy' agent --item \"$SLURM_ARRAY_TASK_ID\" \"$@\""),
            "{s}"
        );
    }

    #[test]
    fn results_round_trip_through_the_file() {
        use crate::backend::{TaskFailure, TaskResult, write_result};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slurm").join("item_0.result.json");
        let result = TaskResult {
            end: TaskEnd::Failed,
            output: None,
            failure: Some(TaskFailure {
                step: "shell: false".into(),
                message: "exit 1".into(),
                error_type: ErrorType::CommandFailed { exit_code: 1 },
                output: None,
                log: None,
            }),
            duration_secs: 0.5,
            task: Some(TaskRef {
                node: Some("localhost".into()),
                ..TaskRef::from(&ids("9", 0))
            }),
            node: None,
            claude: Some(crate::claude::Totals {
                calls: 1,
                ..crate::claude::Totals::default()
            }),
            trail: crate::jobstore::ItemTrail {
                claude_sessions: vec!["s-1".into()],
                claude_error_kind: Some(crate::claude::ErrorKind::Stalled),
                ..crate::jobstore::ItemTrail::default()
            },
        };
        write_result(&path, &result).unwrap();
        assert_eq!(read_result(&path), Some(result));
    }
}
