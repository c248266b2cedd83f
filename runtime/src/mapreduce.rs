//! The MapReduce driver (docs/language.md §8): `setup` and its `capture_outputs`, the input pipeline,
//! one agent per item through the same step machines as a standard run, under the error
//! policy ([`crate::job`]) and the circuit breaker ([`crate::breaker`]), the DLQ, `reduce`
//! with `${map.*}`, and the job's files ([`crate::jobstore`]) for `resume-job`.
//!
//! Order of effects for an item: its outcome is appended to `results.jsonl` first, then the
//! DLQ is written. A kill between the two is repaired when the job resumes.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use futures::future::LocalBoxFuture;
use futures::stream::{FuturesUnordered, StreamExt as _};
use prodigy_compiler::plan::{
    CaptureSource, ErrorCollection, MaxParallel, Multiline, OutputCapture, Plan, StepId,
    TimeoutAction, TimeoutPolicy,
};
use prodigy_grammar::pipeline::InputKind;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::breaker::{Breaker, BreakerAction, BreakerEvent, BreakerState};
use crate::dlq::{Dlq, ErrorType, FailureDetail, WorktreeArtifacts};
use crate::exec;
use crate::job::{Counts, ItemAction, ItemEvent, Job, JobPolicy, JobState, StopReason};
use crate::jobstore::{ItemRecord, ItemStatus, JobCheckpoint, JobFiles, Phase, Status};
use crate::machine::Outcome;
use crate::progress::{Progress, Tally};
use crate::runner::{AGENT, AgentScope, Runner, StepFailure};
use crate::vars::{CommandOutput, Vars};
use crate::worktree::{AgentWorktree, SessionWorktree, WorktreeError};

/// How to run a job, beyond the workflow.
#[derive(Clone, Debug, Default)]
pub struct JobOptions {
    /// `--max-parallel`, over the workflow's `max_parallel`.
    pub max_parallel: Option<usize>,
    /// `--cancel-running`: when the error policy stops the job, cancel the running agents
    /// (their items stay pending) instead of letting them finish.
    pub cancel_running: bool,
    /// `--strict`: a `json_path` that selects nothing from the input fails the job instead
    /// of completing it with no items.
    pub strict: bool,
    /// Where the agents run (`--executor`).
    pub executor: crate::slurm::Executor,
}

/// How a job ended.
#[derive(Clone, Debug, PartialEq)]
pub enum JobOutcome {
    /// Every phase finished.
    Completed,
    /// A setup or reduce step failed, or the input could not be read.
    Failed {
        /// `setup`, `map` or `reduce`.
        phase: &'static str,
        /// What failed.
        what: String,
    },
    /// The error policy stopped the map phase.
    Stopped(String),
    /// A state write failed in PHASE (say, the disk under `$PRODIGY_HOME` is full): no new
    /// agent started after it, and what has no recorded outcome runs again on resume.
    StateWrite {
        /// `setup`, `map` or `reduce`.
        phase: &'static str,
        /// The file and the OS error.
        what: String,
    },
    /// A signal stopped it.
    Interrupted,
}

/// What a job reports.
#[derive(Clone, Debug)]
pub struct JobReport {
    /// The job.
    pub job_id: String,
    /// How it ended.
    pub outcome: JobOutcome,
    /// Error metrics of the map phase.
    pub metrics: ErrorMetrics,
    /// Items in the DLQ.
    pub dlq_count: u64,
    /// Items without an outcome.
    pub pending: u64,
    /// The event log.
    pub events: PathBuf,
    /// The variables at the end (for the `merge` steps).
    pub vars: Vars,
    /// Whether the job's state is still there to resume from (false when its state
    /// directory was removed while it ran).
    pub resumable: bool,
}

/// Error metrics (seed `000`): printed at the end of the job and stored with it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ErrorMetrics {
    /// Items after the input pipeline.
    pub total_items: u64,
    /// Items that succeeded.
    pub successful: u64,
    /// Items that failed.
    pub failed: u64,
    /// Items skipped by policy.
    pub skipped: u64,
    /// Failed over finished items (0.0 to 1.0).
    pub failure_rate: f64,
    /// Failures by error type.
    pub error_types: BTreeMap<String, u64>,
    /// Error types seen 3 or more times, with what to do about them.
    pub failure_patterns: Vec<FailurePattern>,
}

/// A recurring failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailurePattern {
    /// The error type.
    pub pattern: String,
    /// How often it occurred.
    pub frequency: u64,
    /// What to do.
    pub suggestion: String,
}

/// How many of RECORDS succeeded, failed and were skipped.
fn tally<'r>(records: impl Iterator<Item = &'r ItemRecord>) -> Counts {
    let mut counts = Counts::default();
    for record in records {
        match record.status {
            ItemStatus::Succeeded => counts.succeeded += 1,
            ItemStatus::Failed => counts.failed += 1,
            ItemStatus::Skipped => counts.skipped += 1,
        }
    }
    counts
}

/// Error metrics from the item outcomes (seed `000`: a pattern is an error type seen 3 or
/// more times; timeouts, network and permission errors get their own suggestion).
pub fn error_metrics(records: &[ItemRecord], total: u64) -> ErrorMetrics {
    let mut metrics = ErrorMetrics {
        total_items: total,
        ..ErrorMetrics::default()
    };
    let counts = tally(records.iter());
    (metrics.successful, metrics.failed, metrics.skipped) =
        (counts.succeeded, counts.failed, counts.skipped);
    let mut messages: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for record in records {
        if record.status != ItemStatus::Succeeded {
            let kind = record
                .error_type
                .clone()
                .unwrap_or_else(|| "Unknown".into());
            *metrics.error_types.entry(kind.clone()).or_default() += 1;
            messages
                .entry(kind)
                .or_default()
                .push(record.error.as_deref().unwrap_or(""));
        }
    }
    let finished = counts.finished();
    if finished > 0 {
        #[expect(
            clippy::cast_precision_loss,
            reason = "item counts stay far below 2^52"
        )]
        let rate = metrics.failed as f64 / finished as f64;
        metrics.failure_rate = rate;
    }
    for (kind, count) in &metrics.error_types {
        if *count < 3 {
            continue;
        }
        let suggestion = if kind == "Timeout" {
            "Consider increasing agent_timeout_secs in timeout_config"
        } else {
            match dominant_cause(messages.get(kind).map_or(&[][..], Vec::as_slice)) {
                Cause::Network => "Check network connectivity and retry settings",
                Cause::Permission => "Verify file permissions and access rights",
                Cause::Other => "Review error logs for more details.",
            }
        };
        metrics.failure_patterns.push(FailurePattern {
            pattern: kind.clone(),
            frequency: *count,
            suggestion: suggestion.to_owned(),
        });
    }
    metrics
}

/// What an error message says went wrong, for the advice of a failure pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    Network,
    Permission,
    Other,
}

impl Cause {
    fn of(message: &str) -> Cause {
        let text = message.to_lowercase();
        let any = |words: &[&str]| words.iter().any(|w| text.contains(w));
        if any(&["permission", "access denied", "not permitted"]) {
            Cause::Permission
        } else if any(&["network", "connection", "unreachable", "could not resolve"]) {
            Cause::Network
        } else {
            Cause::Other
        }
    }
}

/// The cause most of MESSAGES share; on a tie, a specific cause (network, then permission)
/// wins over the rest, so the advice names what most failures have in common.
fn dominant_cause(messages: &[&str]) -> Cause {
    let order = [Cause::Network, Cause::Permission, Cause::Other];
    let count = |cause: Cause| messages.iter().filter(|m| Cause::of(m) == cause).count();
    let mut best = (Cause::Other, 0);
    for cause in order {
        let n = count(cause);
        if n > best.1 {
            best = (cause, n);
        }
    }
    best.0
}

/// `item_<index>`, as upstream names items.
pub fn item_id(index: usize) -> String {
    format!("item_{index}")
}

fn agent_id(index: usize) -> String {
    format!("agent-{index}")
}

/// The index in an `item_<index>` id.
pub fn item_index(id: &str) -> Option<usize> {
    id.strip_prefix("item_")?.parse().ok()
}

/// The item variables of docs/language.md §5.
pub(crate) fn item_vars(vars: &mut Vars, item: &Value, index: usize, total: usize) {
    vars.set("item", item.clone());
    vars.set("item_index", json!(index));
    vars.set("item_total", json!(total));
    vars.set("item_id", Value::String(item_id(index)));
    vars.set("item_json", Value::String(item.to_string()));
}

/// What an agent runs: its steps, its timeouts and how it is stopped.
pub(crate) struct AgentSpec {
    pub(crate) steps: Vec<StepId>,
    timeout: Option<Duration>,
    timeouts: Rc<HashMap<StepId, Duration>>,
    grace: Option<Duration>,
    cancel_running: bool,
    total: usize,
    executor: crate::slurm::Executor,
    /// Whether a Slurm task a killed coordinator left for an item is adopted (the map
    /// phase, whose pending items have no outcome yet; not `dlq retry`, whose items do).
    adopt: bool,
    /// The job's `max_parallel`.
    parallel: usize,
}

impl AgentSpec {
    pub(crate) fn new(
        plan: &Plan,
        cancel_running: bool,
        total: usize,
        executor: crate::slurm::Executor,
    ) -> Self {
        let Some(map) = &plan.map else {
            return AgentSpec {
                steps: Vec::new(),
                timeout: None,
                timeouts: Rc::default(),
                grace: None,
                cancel_running,
                total,
                executor,
                adopt: true,
                parallel: 1,
            };
        };
        let config = map.timeout_config.as_ref();
        // `per_command` leaves the agent without an overall timeout; named command timeouts
        // apply under every policy.
        let timeout = match config.map(|c| c.policy) {
            Some(TimeoutPolicy::PerCommand) => None,
            Some(TimeoutPolicy::PerAgent | TimeoutPolicy::Hybrid) | None => map.agent_timeout,
        };
        let mut timeouts = HashMap::new();
        for (key, duration) in config.map_or(&[][..], |c| c.command_timeouts.as_slice()) {
            for (index, id) in map.steps.iter().enumerate() {
                let Some(step) = plan.step(*id) else { continue };
                let names = [
                    Some(index.to_string()),
                    step.step_id.clone(),
                    Some(step.label.clone()),
                ];
                if names.iter().flatten().any(|n| n == &key.value) {
                    timeouts.insert(*id, *duration);
                }
            }
        }
        AgentSpec {
            steps: map.steps.clone(),
            timeout,
            timeouts: Rc::new(timeouts),
            grace: config.map(|c| c.cleanup_grace_period),
            cancel_running,
            total,
            executor,
            adopt: true,
            parallel: 1,
        }
    }
}

/// How an agent's run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunEnd {
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
}

/// An agent's run.
#[derive(Clone, Debug)]
struct AgentRun {
    end: RunEnd,
    output: Option<String>,
    failure: Option<StepFailure>,
    duration: Duration,
    /// The agent's worktree, kept because it failed with work in it or its merge
    /// conflicted.
    artifacts: Option<WorktreeArtifacts>,
    /// What its Claude calls cost.
    claude: crate::claude::Totals,
    /// The Slurm task that ran it.
    slurm: Option<crate::slurm::SlurmIds>,
}

impl AgentRun {
    fn rejected() -> Self {
        Self::failed(
            "circuit breaker",
            "the circuit breaker is open: the agent was not started".into(),
            ErrorType::CircuitOpen,
        )
    }

    fn failed(step: &str, message: String, error_type: ErrorType) -> Self {
        AgentRun {
            end: RunEnd::Failed,
            output: None,
            failure: Some(StepFailure {
                step: step.into(),
                message,
                error_type,
                output: None,
                log: None,
            }),
            duration: Duration::ZERO,
            artifacts: None,
            claude: crate::claude::Totals::default(),
            slurm: None,
        }
    }

    fn error_type(&self) -> ErrorType {
        match (self.end, &self.failure) {
            (RunEnd::TimedOut, _) => ErrorType::Timeout,
            (_, Some(f)) => f.error_type.clone(),
            (_, None) => ErrorType::Unknown,
        }
    }

    fn message(&self, timeout: Option<Duration>) -> String {
        match (self.end, &self.failure) {
            (RunEnd::TimedOut, _) => format!(
                "agent timed out after {}",
                humantime::format_duration(timeout.unwrap_or_default())
            ),
            (_, Some(f)) if f.message.is_empty() => format!("`{}` failed", f.step),
            (_, Some(f)) => f.message.clone(),
            (_, None) => "the agent failed".into(),
        }
    }
}

/// Why a guarded future was stopped early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stopped {
    TimedOut,
    Cancelled,
}

/// Runs BODY with SCOPE as the agent scope; on TIMEOUT, on the run's signal, or when HALT
/// is set (if given), sets the scope's cancel signal (its processes get SIGTERM, then
/// SIGKILL after the grace period) and waits for BODY to wind down.
pub(crate) async fn guarded<F: std::future::Future>(
    runner: &Runner,
    scope: Rc<AgentScope>,
    stop: watch::Sender<bool>,
    body: F,
    timeout: Option<Duration>,
    halt: Option<watch::Receiver<bool>>,
) -> (F::Output, Option<Stopped>) {
    let body = AGENT.scope(scope, body);
    let mut body = std::pin::pin!(body);
    let deadline = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    let mut deadline = std::pin::pin!(deadline);
    let mut signal = runner.cancel.clone();
    let (mut halt, halting) = match halt {
        Some(rx) => (rx, true),
        None => (watch::channel(false).1, false),
    };
    let mut why = None;
    loop {
        tokio::select! {
            out = &mut body => return (out, why),
            () = &mut deadline, if why.is_none() => {
                why = Some(Stopped::TimedOut);
                let _ = stop.send(true);
            }
            () = exec::cancelled(&mut signal), if why.is_none() => {
                why = Some(Stopped::Cancelled);
                let _ = stop.send(true);
            }
            () = exec::cancelled(&mut halt), if why.is_none() && halting => {
                why = Some(Stopped::Cancelled);
                let _ = stop.send(true);
            }
        }
    }
}

pub(crate) fn scope_for(
    index: Option<usize>,
    spec: Option<&AgentSpec>,
    workdir: Option<PathBuf>,
) -> (Rc<AgentScope>, watch::Sender<bool>) {
    let (tx, rx) = watch::channel(false);
    let scope = AgentScope {
        agent_id: index.map(agent_id).unwrap_or_default(),
        item_id: index.map(item_id).unwrap_or_default(),
        quiet: index.is_some(),
        cancel: rx,
        timeouts: spec.map(|s| s.timeouts.clone()).unwrap_or_default(),
        grace: spec.and_then(|s| s.grace),
        failure: RefCell::new(None),
        claude: RefCell::new(crate::claude::Totals::default()),
        workdir,
    };
    (Rc::new(scope), tx)
}

/// Runs one agent for ITEM.
async fn run_agent(
    runner: &Runner,
    spec: &AgentSpec,
    base: &Vars,
    item: &Value,
    index: usize,
    attempt: u32,
    halt: watch::Receiver<bool>,
) -> AgentRun {
    // A Slurm task that a killed coordinator left for this item keeps its worktree.
    let adopted = match (&spec.executor, spec.adopt) {
        (crate::slurm::Executor::Slurm(_), true) => {
            let job_dir = runner.opts.layout.job_dir(runner.session());
            crate::slurm::adoptable(runner, &job_dir, index)
                .await
                .and_then(|s| s.worktree)
        }
        _ => None,
    };
    let worktree = match (&runner.opts.worktree, adopted) {
        (Some(_), Some(adopted)) => Some(adopted),
        (Some(session), None) => {
            match crate::worktree::create_agent(
                &runner.opts.layout,
                session,
                &runner.agent_worktrees,
                &item_id(index),
            )
            .await
            {
                Ok(w) => Some(w),
                Err(e) => {
                    return AgentRun::failed(
                        "worktree",
                        format!("cannot create the agent's worktree: {e}"),
                        ErrorType::WorktreeError,
                    );
                }
            }
        }
        (None, _) => None,
    };
    let mut vars = base.clone();
    item_vars(&mut vars, item, index, spec.total);
    let (scope, stop) = scope_for(
        Some(index),
        Some(spec),
        worktree.as_ref().map(|w| w.workdir.clone()),
    );
    runner.record(
        "agent_started",
        json!({"agent_id": agent_id(index), "item_id": item_id(index), "attempt": attempt}),
    );
    let started = Instant::now();
    let mut run = if let crate::slurm::Executor::Slurm(slurm) = &spec.executor {
        // The steps run in a Slurm task; everything around them stays here.
        let job_dir = runner.opts.layout.job_dir(runner.session());
        let done = crate::runner::AGENT
            .scope(
                scope.clone(),
                crate::slurm::dispatch(
                    runner,
                    crate::slurm::Dispatch {
                        slurm,
                        job_dir,
                        job_id: runner.session().to_owned(),
                        index,
                        attempt,
                        worktree: worktree.clone(),
                        timeout: spec.timeout,
                        stopping: Some(halt.clone()),
                        halt: spec.cancel_running.then_some(halt),
                        adopt: spec.adopt,
                        parallel: spec.parallel,
                    },
                ),
            )
            .await;
        let end = match done.end {
            crate::slurm::Ended::Succeeded => RunEnd::Succeeded,
            crate::slurm::Ended::Failed => RunEnd::Failed,
            crate::slurm::Ended::TimedOut => RunEnd::TimedOut,
            crate::slurm::Ended::Cancelled => RunEnd::Cancelled,
        };
        AgentRun {
            end,
            output: done.output,
            failure: done.failure,
            duration: started.elapsed(),
            artifacts: None,
            slurm: done.ids,
            claude: done.claude,
        }
    } else {
        let (outcome, why) = guarded(
            runner,
            scope.clone(),
            stop,
            runner.run_agent_steps(&spec.steps, &mut vars),
            spec.timeout,
            spec.cancel_running.then_some(halt),
        )
        .await;
        let end = match (why, outcome) {
            (Some(Stopped::TimedOut), _) => RunEnd::TimedOut,
            (Some(Stopped::Cancelled), _) | (None, Outcome::Cancelled) => RunEnd::Cancelled,
            // A step whose failure was only handled fails the item.
            (None, o) if o.continues_agent() => RunEnd::Succeeded,
            (None, _) => RunEnd::Failed,
        };
        let failure = scope.failure.borrow().clone();
        let claude = *scope.claude.borrow();
        AgentRun {
            end,
            output: vars.last_output.take(),
            failure,
            duration: started.elapsed(),
            artifacts: None,
            slurm: None,
            claude,
        }
    };
    if let (Some(session), Some(worktree)) = (&runner.opts.worktree, worktree) {
        merge_back(runner, session, worktree, index, &mut run, &mut vars).await;
    }
    run
}

/// An agent's merge conflicted: `merge.on_conflict` resolves it in the agent's worktree (the
/// session's merged work merged into the agent's branch), and the agent's new head is merged
/// again. The outer error is why the resolver did not resolve it.
async fn resolve_agent_conflict(
    runner: &Runner,
    session: &SessionWorktree,
    worktree: &AgentWorktree,
    index: usize,
    vars: &mut Vars,
    message: &str,
) -> Result<Result<crate::worktree::Merged, WorktreeError>, String> {
    let current = runner
        .agent_worktrees
        .integration(session)
        .await
        .map_err(|e| e.to_string())?;
    runner
        .resolve_conflict(
            crate::worktree::Conflicted {
                dir: &worktree.path,
                other: &current,
                source_branch: &worktree.branch,
                target_branch: &session.branch,
                item: Some(index),
                workdir: Some(worktree.workdir.clone()),
            },
            vars,
        )
        .await?;
    let head = crate::worktree::agent_head(worktree)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the resolved merge left no commit")?;
    Ok(
        crate::worktree::merge_head(session, &runner.agent_worktrees, worktree, &head, message)
            .await,
    )
}

/// After an agent in a worktree: a successful agent's commits go into the session's merged
/// work through the merge queue and its worktree goes back to the pool (kept instead when
/// it left uncommitted changes); a conflict fails the item with `MergeConflict`. The
/// worktree of an agent that failed is kept when it holds commits or changes (its path goes
/// into the DLQ entry), else it goes back to the pool.
async fn merge_back(
    runner: &Runner,
    session: &SessionWorktree,
    worktree: AgentWorktree,
    index: usize,
    run: &mut AgentRun,
    vars: &mut Vars,
) {
    if run.end == RunEnd::Succeeded {
        let message = format!("Merge {} (agent {})", item_id(index), agent_id(index));
        // Only agents that committed wait for the merge queue.
        let merged = match crate::worktree::agent_head(&worktree).await {
            Ok(Some(head)) => {
                let _queue = runner.merge_queue.lock().await;
                let merged = crate::worktree::merge_head(
                    session,
                    &runner.agent_worktrees,
                    &worktree,
                    &head,
                    &message,
                )
                .await;
                match merged {
                    Err(WorktreeError::Conflict {
                        branch,
                        files,
                        output,
                    }) if runner.resolves_conflicts() => {
                        // Still holding the queue: the resolver merges what is merged now
                        // into the agent's branch, which then merges cleanly.
                        resolve_agent_conflict(runner, session, &worktree, index, vars, &message)
                            .await
                            .unwrap_or_else(|why| {
                                Err(WorktreeError::Conflict {
                                    branch,
                                    files,
                                    output: format!("{output}\n{why}"),
                                })
                            })
                    }
                    other => other,
                }
            }
            Ok(None) => Ok(crate::worktree::Merged::Nothing),
            Err(e) => Err(e),
        };
        match merged {
            Ok(how) => {
                if how != crate::worktree::Merged::Nothing {
                    runner.record(
                        "agent_merged",
                        json!({"branch": worktree.branch, "merge": format!("{how:?}")}),
                    );
                }
                // Only commits come back; changes left uncommitted are kept, not wiped.
                let left = crate::worktree::changes(&worktree.path).await;
                if left.is_empty() {
                    runner.agent_worktrees.release(worktree);
                } else {
                    runner.record(
                        "agent_worktree_kept",
                        json!({"path": worktree.path, "branch": worktree.branch, "uncommitted": left}),
                    );
                    runner.say(&format!(
                        "warning: {} left {} in {}; only commits are merged, so that worktree is kept (`prodigy worktree clean` removes it)",
                        item_id(index),
                        crate::progress::count(left.len(), "uncommitted change"),
                        worktree.path.display()
                    ));
                }
                return;
            }
            Err(e) => {
                let error_type = if matches!(e, WorktreeError::Conflict { .. }) {
                    ErrorType::MergeConflict
                } else {
                    ErrorType::WorktreeError
                };
                runner.record(
                    "agent_merge_failed",
                    json!({"branch": worktree.branch, "error": e.to_string(), "error_type": error_type.name()}),
                );
                let logs = match &e {
                    WorktreeError::Conflict { output, .. } => output.clone(),
                    other => other.to_string(),
                };
                run.end = RunEnd::Failed;
                run.failure = Some(StepFailure {
                    step: "merge".into(),
                    message: e.to_string(),
                    error_type,
                    output: None,
                    log: None,
                });
                let left = crate::worktree::changes(&worktree.path).await;
                run.artifacts = Some(artifacts(runner, &worktree, &left, Some(logs)));
                return;
            }
        }
    }
    let committed = matches!(crate::worktree::agent_head(&worktree).await, Ok(Some(_)));
    let left = crate::worktree::changes(&worktree.path).await;
    let kept = committed || !left.is_empty();
    if kept && run.end != RunEnd::Cancelled {
        let logs = run.failure.as_ref().map(|f| f.message.clone());
        run.artifacts = Some(artifacts(runner, &worktree, &left, logs));
    } else if !kept {
        runner.agent_worktrees.release(worktree);
    }
}

/// The DLQ's record of a kept agent worktree, with its uncommitted CHANGES; secrets masked
/// (a file name or git's message may hold one).
fn artifacts(
    runner: &Runner,
    worktree: &AgentWorktree,
    changes: &[String],
    error_logs: Option<String>,
) -> WorktreeArtifacts {
    WorktreeArtifacts {
        worktree_path: worktree.path.clone(),
        branch_name: worktree.branch.clone(),
        uncommitted_changes: (!changes.is_empty()).then(|| runner.mask(&changes.join("\n"))),
        error_logs: error_logs
            .filter(|l| !l.is_empty())
            .map(|l| runner.mask(&l)),
    }
}

/// Runs the `custom:` handler for a failed item with `${item}` and `${error.*}` set.
async fn run_item_handler(
    runner: &Runner,
    steps: &[StepId],
    base: &Vars,
    item: &Value,
    index: usize,
    spec: &AgentSpec,
    error: Value,
) -> bool {
    let mut vars = base.clone();
    item_vars(&mut vars, item, index, spec.total);
    vars.set("error", error);
    let (scope, stop) = scope_for(Some(index), None, None);
    // The handler works for the item as its agent did: under the agent's timeout.
    let (outcome, why) = guarded(
        runner,
        scope,
        stop,
        runner.run_list(steps, &mut vars),
        spec.timeout,
        None,
    )
    .await;
    why.is_none() && outcome.continues()
}

/// Puts back the DLQ entries a kill lost between an outcome and its DLQ write: the
/// dead-lettered outcomes recorded since the last checkpoint (their items were still
/// REMAINING in it) that are missing from the queue. Entries removed on purpose before that
/// checkpoint (`dlq clear`, `dlq retry`) stay removed. Returns the ids put back.
fn repair_dlq(
    dlq: &Dlq,
    records: &[ItemRecord],
    items: &[Value],
    remaining: &[String],
) -> Vec<String> {
    let remaining: std::collections::HashSet<&str> = remaining.iter().map(String::as_str).collect();
    let mut repaired = Vec::new();
    for record in records
        .iter()
        .filter(|r| r.dead_lettered && remaining.contains(r.item_id.as_str()))
    {
        if matches!(dlq.get(&record.item_id), Ok(None)) {
            let item = items.get(record.index).cloned().unwrap_or(Value::Null);
            let failure = failure_detail(
                record.error_type.as_deref(),
                record.error.as_deref().unwrap_or_default(),
                record.index,
                record.duration_secs,
            );
            if dlq
                .record_failure(&record.item_id, &item, failure, None)
                .is_ok()
            {
                repaired.push(record.item_id.clone());
            }
        }
    }
    repaired
}

/// The agents at a time: OVERRIDE (`--max-parallel`), else the map's `max_parallel`,
/// a number or a `${VAR}` rendered with VARS.
pub(crate) fn max_parallel(plan: &Plan, vars: &Vars, over: Option<usize>) -> Result<usize, String> {
    if let Some(n) = over {
        return Ok(n.max(1));
    }
    let Some(map) = &plan.map else {
        return Ok(1);
    };
    match &map.max_parallel {
        MaxParallel::Fixed(n) => Ok(usize::try_from(n.value).unwrap_or(usize::MAX).max(1)),
        MaxParallel::Variable(t) => {
            let text = t
                .parsed
                .render(vars)
                .map_err(|e| format!("`max_parallel`: {e}"))?;
            match text.trim().parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!(
                    "`max_parallel` is `{}`, which is `{text}`: not a positive number",
                    t.value
                )),
            }
        }
    }
}

/// How the breaker let an agent start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admission {
    /// Rejected: the agent never ran.
    Rejected,
    /// Started normally (the breaker closed, or absent).
    Normal,
    /// Started as a half-open probe.
    Probe,
}

/// What finished in the map loop.
enum Done {
    Agent {
        index: usize,
        attempt: u32,
        run: AgentRun,
        admission: Admission,
    },
    RetryDue {
        index: usize,
        attempt: u32,
    },
    Handled {
        index: usize,
        attempt: u32,
        run: AgentRun,
        ok: bool,
    },
}

/// How the map phase ended.
enum MapEnd {
    Finished,
    Stopped(String),
    Interrupted,
}

/// A job stopped by a failed state write in PHASE: it failed, and resuming it continues.
fn stopped_by_write(phase: &'static str, why: String) -> JobOutcome {
    JobOutcome::StateWrite { phase, what: why }
}

fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Setup => "setup",
        Phase::Map => "map",
        Phase::Reduce | Phase::Done => "reduce",
    }
}

/// A failed write of the job's files, for people: the file and the OS error.
fn job_write_failure(e: &crate::jobstore::JobStoreError) -> String {
    match e {
        crate::jobstore::JobStoreError::Io { path, source } => {
            crate::statefs::describe(path, source)
        }
        crate::jobstore::JobStoreError::Damaged { .. } => e.to_string(),
    }
}

/// A failed write of the DLQ, for people: the file and the OS error.
fn dlq_write_failure(e: &crate::dlq::DlqError) -> String {
    match e {
        crate::dlq::DlqError::Io { path, source } => crate::statefs::describe(path, source),
        crate::dlq::DlqError::Damaged { .. } => e.to_string(),
    }
}

/// Describes why the error policy stopped the job.
fn describe(reason: &StopReason) -> String {
    match reason {
        StopReason::ItemFailureStop => "an item failed under `on_item_failure: stop`".into(),
        StopReason::NoContinueOnFailure => {
            "an item failed and `continue_on_failure` is false".into()
        }
        StopReason::MaxFailures(n) => format!("`max_failures` ({n}) items failed"),
        StopReason::AgentTimeout => "an item timed out under `timeout_action: fail`".into(),
        StopReason::MissingHandler(name) => {
            format!("`on_item_failure` names handler `{name}`, which `handlers` does not define")
        }
        StopReason::FailureRate { rate, threshold } => format!(
            "the failure rate {:.0}% went above `failure_threshold` ({:.0}%)",
            rate * 100.0,
            threshold * 100.0
        ),
    }
}

fn breaker_name(state: BreakerState) -> &'static str {
    match state {
        BreakerState::Closed { .. } => "closed",
        BreakerState::Open { .. } => "open",
        BreakerState::HalfOpen { .. } => "half-open",
    }
}

/// One run (or resumption) of a MapReduce job.
pub struct MapJob<'a> {
    runner: &'a Runner,
    plan: &'a Plan,
    files: JobFiles,
    dlq: Dlq,
    cp: JobCheckpoint,
    opts: JobOptions,
    /// The checkpoint's status when this process took the job over.
    resumed_from: Option<Status>,
    /// The first state write that failed (path and OS error): no new agent starts after it.
    write_failed: Option<String>,
    /// Items whose outcome is in `results.jsonl` but whose DLQ entry could not be written:
    /// the checkpoint keeps them remaining, so that resuming puts their entries back.
    dlq_unwritten: std::collections::BTreeSet<usize>,
    /// Whether the map loop said that a write failed.
    write_announced: bool,
}

impl<'a> MapJob<'a> {
    /// A job whose state is CHECKPOINT (a new one, or one loaded for `resume-job`).
    pub fn new(
        runner: &'a Runner,
        files: JobFiles,
        checkpoint: JobCheckpoint,
        opts: JobOptions,
        resumed: bool,
    ) -> Self {
        let dlq = Dlq::new(&runner.opts.layout, &checkpoint.job_id);
        MapJob {
            runner,
            plan: &runner.plan,
            files,
            dlq,
            resumed_from: resumed.then_some(checkpoint.status),
            cp: checkpoint,
            opts,
            write_failed: None,
            dlq_unwritten: std::collections::BTreeSet::new(),
            write_announced: false,
        }
    }

    /// The first state write of the job that failed, its event log's included.
    fn write_failure(&self) -> Option<String> {
        self.write_failed
            .clone()
            .or_else(|| self.runner.state_failure())
    }

    /// Notes a failed state write (the first one is the one reported).
    fn write_failed(&mut self, why: String) {
        if self.write_failed.is_none() {
            self.runner
                .record("state_write_failed", json!({"error": why}));
            self.write_failed = Some(why);
        }
    }

    fn say(&self, text: &str) {
        self.runner.say(text);
    }

    /// Why the job's results can no longer be kept, when its state directory (or the
    /// `items.json` the map phase starts from) vanished while it ran: a removed
    /// `PRODIGY_HOME` would otherwise end in "completed: 0 succeeded".
    fn state_lost(&self) -> Option<String> {
        let dir = self.files.dir();
        (!dir.join("items.json").is_file()).then(|| {
            format!(
                "the job's state directory `{}` was removed while the job ran (is `PRODIGY_HOME` still there?), so its results cannot be kept",
                dir.display()
            )
        })
    }

    /// Writes the checkpoint (and the DLQ's index first).
    ///
    /// # Errors
    ///
    /// The failed write, described; it is noted, so the job stops.
    fn save(&mut self, vars: Option<&Vars>) -> Result<(), String> {
        if let Some(vars) = vars {
            let mut values = vars.values.clone();
            // Recomputed from the results on resume.
            values.remove("map");
            self.cp.variables = self
                .runner
                .seal_json(json!({"values": values, "meta": vars.meta}));
        }
        self.cp.last_checkpoint_at = crate::store::timestamp();
        // The DLQ's index catches up with its items at every checkpoint.
        let written = self
            .dlq
            .flush()
            .map_err(|e| dlq_write_failure(&e))
            .and_then(|()| {
                self.files
                    .save_checkpoint(&self.cp)
                    .map_err(|e| job_write_failure(&e))
            });
        match written {
            Ok(()) => {
                self.runner.record(
                    "checkpoint_saved",
                    json!({"phase": self.cp.phase, "status": self.cp.status, "items_processed": self.cp.items_processed}),
                );
                Ok(())
            }
            Err(why) => {
                self.write_failed(why.clone());
                Err(why)
            }
        }
    }

    /// Runs the job from its checkpoint's phase to the end.
    pub async fn run(mut self, mut vars: Vars) -> JobReport {
        let event = if self.resumed_from.is_some() {
            "job_resumed"
        } else {
            "job_started"
        };
        self.runner.record(
            event,
            json!({"workflow": self.plan.name, "phase": self.cp.phase, "job_dir": self.files.dir()}),
        );
        vars.merge(
            "workflow",
            crate::runner::fields(json!({"name": self.plan.name, "id": self.cp.job_id})),
        );
        self.cp.status = Status::Running;
        self.cp.stop_reason = None;
        // After `resume-job --force` the new version is the job's workflow from now on, and
        // agents in Slurm tasks check it against the checkpoint: written before any starts.
        if self.cp.workflow_hash != self.runner.opts.workflow_hash {
            self.cp
                .workflow_hash
                .clone_from(&self.runner.opts.workflow_hash);
            if let Err(why) = self.save(None) {
                let outcome = stopped_by_write(phase_name(self.cp.phase), why);
                return self.finish(outcome, vars);
            }
        }
        let outcome = self.phases(&mut vars).await;
        self.finish(outcome, vars)
    }

    async fn phases(&mut self, vars: &mut Vars) -> JobOutcome {
        if self.cp.phase == Phase::Setup {
            if let Err(why) = self.save(Some(vars)) {
                return stopped_by_write("setup", why);
            }
            if let Err(outcome) = self.setup(vars).await {
                return outcome;
            }
            if let Some(why) = self.write_failure() {
                return stopped_by_write("setup", why);
            }
            self.warn_setup_leftovers(vars).await;
            let items = match self.load_items(vars).await {
                Ok(items) => items,
                Err(why) => {
                    self.say(&format!("error: {why}"));
                    return JobOutcome::Failed {
                        phase: "map",
                        what: why,
                    };
                }
            };
            if let Err(e) = self.files.save_items(&items) {
                let why = job_write_failure(&e);
                self.write_failed(why.clone());
                return stopped_by_write("map", why);
            }
            self.cp.items_total = items.len() as u64;
            self.cp.items_remaining = (0..items.len()).map(item_id).collect();
            self.cp.phase = Phase::Map;
            if let Err(why) = self.save(Some(vars)) {
                return stopped_by_write("map", why);
            }
        }
        if self.cp.phase == Phase::Map {
            let ended = self.map(vars).await;
            if let Err(why) = self.runner.end_map_phase().await {
                self.say(&format!("error: {why}"));
                return JobOutcome::Failed {
                    phase: "map",
                    what: why,
                };
            }
            match ended {
                Ok(MapEnd::Finished) => {}
                Ok(MapEnd::Stopped(reason)) => return JobOutcome::Stopped(reason),
                Ok(MapEnd::Interrupted) => return JobOutcome::Interrupted,
                Err(why) if self.write_failed.as_ref() == Some(&why) => {
                    return stopped_by_write("map", why);
                }
                Err(why) => {
                    self.say(&format!("error: {why}"));
                    return JobOutcome::Failed {
                        phase: "map",
                        what: why,
                    };
                }
            }
            self.cp.phase = Phase::Reduce;
            self.cp.reduce_next_step = 0;
            if let Err(why) = self.save(Some(vars)) {
                return stopped_by_write("map", why);
            }
        }
        if self.cp.phase == Phase::Reduce {
            return self.reduce(vars).await;
        }
        // A completed job resumed to merge it back: its `merge` steps see `${map.*}`.
        let records = self.files.load_results().unwrap_or_default();
        let dlq_count = self.dlq.index().map_or(0, |i| i.item_count as u64);
        vars.set("map", map_vars(&records, self.cp.items_total, dlq_count));
        JobOutcome::Completed
    }

    fn finish(mut self, mut outcome: JobOutcome, vars: Vars) -> JobReport {
        // A job whose state could not all be written did not complete: what is missing runs
        // again when it is resumed.
        if let (JobOutcome::Completed, Some(why)) = (&outcome, self.write_failure()) {
            outcome = stopped_by_write(phase_name(self.cp.phase), why);
        }
        let phase = phase_name(self.cp.phase);
        let records = self.files.load_results().unwrap_or_default();
        let metrics = error_metrics(&records, self.cp.items_total);
        self.cp.status = match &outcome {
            JobOutcome::Completed => Status::Completed,
            JobOutcome::Failed { .. } | JobOutcome::StateWrite { .. } => Status::Failed,
            JobOutcome::Stopped(_) => Status::Stopped,
            JobOutcome::Interrupted => Status::Interrupted,
        };
        if outcome == JobOutcome::Completed {
            self.cp.phase = Phase::Done;
        }
        if let JobOutcome::Stopped(reason) = &outcome {
            self.cp.stop_reason = Some(reason.clone());
        }
        self.cp.error_metrics = serde_json::to_value(&metrics).ok();
        if let Err(why) = self.save(None)
            && outcome == JobOutcome::Completed
        {
            outcome = stopped_by_write(phase, why);
        }
        let dlq_count = self.dlq.index().map_or(0, |i| i.item_count as u64);
        let claude = *crate::lock(&self.runner.claude_totals);
        let mut finished = json!({"status": self.cp.status, "metrics": metrics, "dlq_count": dlq_count, "duration_secs": self.runner.started.elapsed().as_secs_f64()});
        if claude.calls > 0 {
            finished["claude"] = json!(claude);
        }
        self.runner.record("job_finished", finished);
        self.runner.say_claude_totals();
        JobReport {
            job_id: self.cp.job_id.clone(),
            outcome,
            metrics,
            dlq_count,
            pending: self.cp.items_remaining.len() as u64,
            events: self.runner.events_path(),
            vars,
            // The checkpoint was just saved: it is missing only when its directory is gone;
            // past setup, the items must be there too.
            resumable: self.files.dir().join("checkpoint.json").is_file()
                && (self.cp.phase == Phase::Setup || self.state_lost().is_none()),
        }
    }

    /// After `setup` in a session worktree: warns once, naming them, about the files setup
    /// left that no commit holds, since agents branch from commits only and will not see
    /// them (a `mkdir out` in setup, and every item fails). The map input file is left out:
    /// prodigy reads it itself, so setup may well leave it uncommitted.
    async fn warn_setup_leftovers(&self, vars: &Vars) {
        use crate::worktree::UncommittedKind;
        const SHOWN: usize = 10;
        let (Some(session), Some(_)) = (self.runner.worktree(), &self.plan.setup) else {
            return;
        };
        let input = self
            .plan
            .map
            .as_ref()
            .and_then(|m| m.input.parsed.render(vars).ok())
            .map(|i| i.trim().trim_start_matches("./").to_owned());
        let mut left = crate::worktree::not_committed(&session.path).await;
        left.retain(|u| Some(u.path.as_str()) != input.as_deref());
        if left.is_empty() {
            return;
        }
        let paths: Vec<&str> = left.iter().map(|u| u.path.as_str()).collect();
        self.runner
            .record("setup_left_uncommitted", json!({"paths": paths}));
        let mut names: Vec<String> = left
            .iter()
            .take(SHOWN)
            .map(|u| match u.kind {
                UncommittedKind::Changed => u.path.clone(),
                UncommittedKind::Ignored => format!("{} (ignored)", u.path),
                UncommittedKind::EmptyDir => format!("{} (empty)", u.path),
            })
            .collect();
        if left.len() > SHOWN {
            names.push(format!("and {} more", left.len() - SHOWN));
        }
        let mut advice = Vec::new();
        if left.iter().any(|u| u.kind != UncommittedKind::EmptyDir) {
            advice.push(
                "commit them in setup (e.g. `git add -A && git commit -m setup`; ignored files need `git add -f`)"
                    .to_owned(),
            );
        }
        if let Some(dir) = left.iter().find(|u| u.kind == UncommittedKind::EmptyDir) {
            advice.push(format!(
                "git keeps no empty directory, so make those in the agent template (e.g. `mkdir -p {}`)",
                dir.path.trim_end_matches('/')
            ));
        }
        self.say(&format!(
            "warning: setup left {} that no commit holds in {}: {}; map agents start from the session's commits and will not see them: {}",
            crate::progress::count(left.len(), "path"),
            session.path.display(),
            names.join(", "),
            advice.join("; ")
        ));
    }

    /// `setup`: its steps in order under the phase `timeout`, then `capture_outputs`.
    async fn setup(&mut self, vars: &mut Vars) -> Result<(), JobOutcome> {
        let Some(setup) = &self.plan.setup else {
            return Ok(());
        };
        self.runner
            .record("setup_started", json!({"steps": setup.steps.len()}));
        let total = setup.steps.len();
        let runner = self.runner;
        let plan = self.plan;
        let body = async {
            let mut outputs = Vec::new();
            for (index, &id) in setup.steps.iter().enumerate() {
                let label = plan.step(id).map(|s| s.label.clone()).unwrap_or_default();
                runner.say(&format!("[setup {}/{total}] {label}", index + 1));
                vars.commands.remove(&id.0);
                let outcome = runner.run_step(id, vars, Some(index)).await;
                outputs.push(vars.commands.get(&id.0).cloned());
                if !outcome.continues() {
                    return (outcome, Some(label), outputs);
                }
            }
            (Outcome::Succeeded, None, outputs)
        };
        let (scope, stop) = scope_for(None, None, None);
        let ((outcome, failed, outputs), why) =
            guarded(runner, scope, stop, body, setup.timeout, None).await;
        match (why, outcome) {
            (Some(Stopped::Cancelled), _) | (None, Outcome::Cancelled) => {
                return Err(JobOutcome::Interrupted);
            }
            (Some(Stopped::TimedOut), _) => {
                let what = format!(
                    "setup timed out after {}",
                    humantime::format_duration(setup.timeout.unwrap_or_default())
                );
                self.say(&format!("error: {what}"));
                return Err(JobOutcome::Failed {
                    phase: "setup",
                    what,
                });
            }
            (None, o) if !o.continues() => {
                return Err(JobOutcome::Failed {
                    phase: "setup",
                    what: format!("step `{}` failed", failed.unwrap_or_default()),
                });
            }
            (None, _) => {}
        }
        for capture in &setup.capture_outputs {
            let index = usize::try_from(capture.command_index).unwrap_or(usize::MAX);
            // A step that ran no command (skipped by `when`, a `write_file`) has no output:
            // the `default` stands in, if there is one.
            let value = match (outputs.get(index), &capture.default) {
                (Some(Some(out)), _) => setup_value(capture, out),
                (_, Some(default)) => Ok(Value::String(default.clone())),
                (_, None) => Err(format!(
                    "capture `{}`: setup step {index} produced no output, and there is no `default`",
                    capture.name
                )),
            };
            match value {
                Ok(value) => {
                    self.runner.record(
                        "variable_captured",
                        json!({"name": capture.name, "phase": "setup"}),
                    );
                    vars.set(capture.name.clone(), value);
                }
                Err(why) => {
                    self.say(&format!("error: {why}"));
                    return Err(JobOutcome::Failed {
                        phase: "setup",
                        what: why,
                    });
                }
            }
        }
        self.runner.record("setup_finished", json!({}));
        Ok(())
    }

    /// The items: `map.input` as a file under the project (JSON, or one item per line), else
    /// as a shell command whose stdout is the input; then the pipeline of docs/language.md §7.
    async fn load_items(&self, vars: &Vars) -> Result<Vec<Value>, String> {
        let Some(map) = &self.plan.map else {
            return Ok(Vec::new());
        };
        let input = map
            .input
            .parsed
            .render(vars)
            .map_err(|e| format!("`map.input`: {e}"))?;
        let mut path = self.runner.workdir().join(input.trim());
        let outside = self.runner.opts.project.join(input.trim());
        if !path.exists() && self.runner.worktree().is_some() && outside.exists() {
            // An input the user has not committed is not in the session worktree.
            self.say(&format!(
                "note: `{}` is not in the run's worktree (it is not committed); reading it from {}",
                input.trim(),
                self.runner.opts.project.display()
            ));
            path = outside;
        }
        // Anything at the path is the input file; only a regular file within the bound is
        // read, so a device or a FIFO is refused rather than read without end.
        let (text, kind) = if path.exists() {
            let text = crate::input::read_file(&path, crate::input::MAX_INPUT_SIZE)?;
            (text, InputKind::of_file(input.trim()))
        } else if !input.trim().contains(char::is_whitespace)
            && [".json", ".jsonl", ".txt"]
                .iter()
                .any(|ext| input.trim().ends_with(ext))
        {
            return Err(format!(
                "the map input file `{}` does not exist",
                path.display()
            ));
        } else {
            let (program, args) = exec::shell(&input);
            let command = exec::Command {
                program,
                args,
                cwd: self.runner.workdir(),
                env: vars.environment(),
                clear_env: false,
                timeout: Some(Duration::from_mins(5)),
                grace: self.runner.opts.grace,
                output_limit: self.runner.opts.output_limit,
                spill: None,
                mask: None,
            };
            let stdout = crate::input::command_output(
                &command,
                &input,
                &mut self.runner.cancel_rx(),
                crate::input::MAX_INPUT_SIZE,
            )
            .await?;
            (stdout, InputKind::Text)
        };
        let document = prodigy_grammar::pipeline::parse_input(&text, kind)
            .map_err(|e| format!("the map input `{input}`: {e}"))?;
        let pipeline = map.pipeline();
        let (items, counts) = pipeline.apply(document);
        let mut loaded = json!({"input": input, "selected": counts.selected, "filtered": counts.filtered, "distinct": counts.distinct, "items": counts.kept});
        if map.distinct.is_some() {
            // Items without the `distinct` field, which it kept as one.
            loaded["distinct_missing"] = json!(counts.distinct_missing);
        }
        self.runner.record("input_loaded", loaded);
        if let Some(json_path) = map.json_path.as_ref().filter(|_| counts.selected == 0) {
            let what = format!(
                "`json_path: {}` selected nothing from the map input `{}`",
                json_path.value,
                input.trim()
            );
            if self.opts.strict {
                return Err(format!("{what} (with --strict, a job needs items)"));
            }
            self.say(&format!(
                "warning: {what}; check the expression against the input with `prodigy items`"
            ));
        }
        if let Some(distinct) = map
            .distinct
            .as_ref()
            .filter(|_| counts.distinct_missing > 1)
        {
            let field = distinct.value.trim();
            self.say(&format!(
                "warning: `distinct: {field}`: {} items have no `{}` and were kept as one",
                counts.distinct_missing,
                field.strip_prefix("item.").unwrap_or(field)
            ));
        }
        self.say(&format!(
            "map: {} ({})",
            crate::progress::count(counts.kept, "item"),
            crate::progress::stage_counts(&pipeline, &counts)
        ));
        Ok(items)
    }

    #[expect(
        clippy::too_many_lines,
        reason = "the scheduling loop reads best in one place"
    )]
    async fn map(&mut self, vars: &Vars) -> Result<MapEnd, String> {
        let runner = self.runner;
        let plan = self.plan;
        let Some(map) = &plan.map else {
            return Ok(MapEnd::Finished);
        };
        let items = self
            .files
            .load_items()
            .map_err(|e| self.state_lost().unwrap_or_else(|| e.to_string()))?;
        let previous = self.files.load_results().map_err(|e| e.to_string())?;
        for id in repair_dlq(&self.dlq, &previous, &items, &self.cp.items_remaining) {
            runner.record("dlq_item_added", json!({"item_id": id, "repaired": true}));
        }
        let total = items.len();
        let mut records: Vec<Option<ItemRecord>> = vec![None; total];
        for record in previous {
            let index = record.index;
            if let Some(slot) = records.get_mut(index) {
                *slot = Some(record);
            }
        }
        let counts = tally(records.iter().flatten());
        let max_parallel = max_parallel(plan, vars, self.opts.max_parallel)?;
        self.cp.max_parallel = max_parallel;
        let policy: JobPolicy = plan.job_policy.clone();
        let collection = policy.error_collection;
        let (jitter, max_delay) = (policy.jitter, policy.max_delay.unwrap_or(Duration::MAX));
        let mut breaker = policy.circuit_breaker.map(Breaker::new);
        let mut job = Job::resumed(policy, counts, total as u64);
        let timeout_action = map
            .timeout_config
            .as_ref()
            .map_or(TimeoutAction::Dlq, |c| c.action);
        let spec = AgentSpec {
            parallel: max_parallel,
            ..AgentSpec::new(
                plan,
                self.opts.cancel_running,
                total,
                self.opts.executor.clone(),
            )
        };
        let mut pending: VecDeque<(usize, u32)> = records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_none())
            .map(|(i, _)| (i, 1))
            .collect();
        self.runner.record(
            "map_started",
            json!({"items": total, "pending": pending.len(), "max_parallel": max_parallel}),
        );
        self.say(&format!(
            "map: {} of {} to run, {max_parallel} at a time",
            pending.len(),
            crate::progress::count(total, "item")
        ));
        let (halt_tx, halt_rx) = watch::channel(false);
        let mut running: FuturesUnordered<LocalBoxFuture<'_, Done>> = FuturesUnordered::new();
        let mut agents = 0usize;
        let mut dlq_count = self.dlq.index().map_or(0, |i| i.item_count as u64);
        let mut batch: Vec<String> = Vec::new();
        // The failed attempts `retry_config` ran again, for the DLQ's `failure_history`.
        let mut earlier: HashMap<usize, Vec<FailureDetail>> = HashMap::new();
        // `timeout_config.enable_monitoring: false` turns the progress display off.
        let monitored = map
            .timeout_config
            .as_ref()
            .is_none_or(|c| c.enable_monitoring)
            && !self.runner.opts.quiet;
        let mut progress = Progress::start(total as u64, counts.finished(), monitored);
        let mut last_save = Instant::now();
        let mut stop_announced = false;
        // Set when the job's state directory vanished: no new agents start.
        let mut lost: Option<String> = None;
        loop {
            // The counts as the last outcome left them, before agents start in its place, so a
            // plain progress line does not depend on how fast the next agent starts.
            show_progress(
                &mut progress,
                &job,
                agents,
                dlq_count,
                breaker.as_ref(),
                runner.live_claude_turns(),
            );
            // Start agents while slots, items and the policy allow.
            while job.admits()
                && lost.is_none()
                && !runner.cancelled()
                && self.write_failed.is_none()
                && agents < spec.executor.admit_limit(max_parallel)
            {
                let Some((index, attempt)) = pending.pop_front() else {
                    break;
                };
                let Some(item) = items.get(index) else {
                    continue;
                };
                let mut admission = Admission::Normal;
                if let Some(b) = breaker.as_mut() {
                    let before = b.state();
                    let action = b.on_event(BreakerEvent::Admit, runner.started.elapsed());
                    if action == BreakerAction::Probe {
                        admission = Admission::Probe;
                    }
                    if matches!(before, BreakerState::Open { .. })
                        && matches!(b.state(), BreakerState::HalfOpen { .. })
                    {
                        runner.record("CircuitHalfOpen", json!({"item_id": item_id(index)}));
                    }
                    if action == BreakerAction::Reject {
                        runner.record(
                            "agent_rejected",
                            json!({"item_id": item_id(index), "reason": "CircuitOpen"}),
                        );
                        running.push(Box::pin(std::future::ready(Done::Agent {
                            index,
                            attempt,
                            run: AgentRun::rejected(),
                            admission: Admission::Rejected,
                        })));
                        continue;
                    }
                }
                agents += 1;
                let spec = &spec;
                let halt = halt_rx.clone();
                running.push(Box::pin(async move {
                    let run = run_agent(runner, spec, vars, item, index, attempt, halt).await;
                    Done::Agent {
                        index,
                        attempt,
                        run,
                        admission,
                    }
                }));
            }
            show_progress(
                &mut progress,
                &job,
                agents,
                dlq_count,
                breaker.as_ref(),
                runner.live_claude_turns(),
            );
            let Some(done) = running.next().await else {
                break;
            };
            let (index, attempt, run, admission) = match done {
                Done::RetryDue { index, attempt } => {
                    pending.push_front((index, attempt));
                    continue;
                }
                Done::Agent {
                    index,
                    attempt,
                    run,
                    admission,
                } => {
                    if admission != Admission::Rejected {
                        agents = agents.saturating_sub(1);
                    }
                    (index, attempt, run, admission)
                }
                Done::Handled {
                    index,
                    attempt,
                    run,
                    ok,
                } => {
                    agents = agents.saturating_sub(1);
                    runner.record(
                        "item_handler_finished",
                        json!({"item_id": item_id(index), "success": ok}),
                    );
                    let before = earlier.remove(&index).unwrap_or_default();
                    if let Some(record) =
                        self.outcome(index, attempt, &run, spec.timeout, ItemStatus::Failed, !ok)
                    {
                        if !ok {
                            dlq_count += self.dead_letter(&record, items.get(index), &run, before);
                        }
                        records[index] = Some(record);
                    }
                    self.stop_after_write_failure(&halt_tx);
                    continue;
                }
            };
            if run.end == RunEnd::Cancelled {
                // Interrupted or cancelled by `--cancel-running`: the item stays pending.
                runner.record(
                    "agent_cancelled",
                    json!({"agent_id": agent_id(index), "item_id": item_id(index)}),
                );
                continue;
            }
            // A probe's result decides a half-open breaker; a result of an agent that started
            // before the breaker opened counts only while it is closed.
            let counts_for_breaker = match admission {
                Admission::Rejected => false,
                Admission::Probe => true,
                Admission::Normal => breaker
                    .as_ref()
                    .is_some_and(|b| matches!(b.state(), BreakerState::Closed { .. })),
            };
            if let (Some(b), true) = (breaker.as_mut(), counts_for_breaker) {
                let event = if run.end == RunEnd::Succeeded {
                    BreakerEvent::Success
                } else {
                    BreakerEvent::Failure
                };
                match b.on_event(event, runner.started.elapsed()) {
                    BreakerAction::Opened => {
                        runner.record("CircuitOpen", json!({"item_id": item_id(index)}));
                        self.say("circuit breaker opened: items fail fast as `CircuitOpen` until it half-opens");
                    }
                    BreakerAction::Closed => {
                        runner.record("CircuitClosed", json!({"item_id": item_id(index)}));
                        self.say("circuit breaker closed");
                    }
                    BreakerAction::Allow
                    | BreakerAction::Probe
                    | BreakerAction::Reject
                    | BreakerAction::Nothing => {}
                }
            }
            if run.end == RunEnd::Succeeded {
                job.on_item(ItemEvent::Succeeded);
                runner.record(
                    "agent_completed",
                    json!({"agent_id": agent_id(index), "item_id": item_id(index), "attempt": attempt, "duration_secs": run.duration.as_secs_f64()}),
                );
                if let Some(record) = self.outcome(
                    index,
                    attempt,
                    &run,
                    spec.timeout,
                    ItemStatus::Succeeded,
                    false,
                ) {
                    records[index] = Some(record);
                }
            } else {
                let message = run.message(spec.timeout);
                runner.record(
                    "agent_failed",
                    json!({"agent_id": agent_id(index), "item_id": item_id(index), "attempt": attempt, "error_type": run.error_type().name(), "error": message, "step": run.failure.as_ref().map(|f| f.step.clone())}),
                );
                match collection {
                    ErrorCollection::Immediate => {
                        self.say(&format!("item {} failed: {message}", item_id(index)));
                    }
                    ErrorCollection::Batched(size) => {
                        batch.push(format!("{}: {message}", item_id(index)));
                        if batch.len() as u64 >= size.max(1) {
                            self.say(&format!(
                                "{} failed:\n  {}",
                                crate::progress::count(batch.len(), "item"),
                                batch.join("\n  ")
                            ));
                            batch.clear();
                        }
                    }
                    ErrorCollection::Aggregate => {}
                }
                // `timeout_action` decides for every timeout, the agent's or a command's.
                let timed_out = run.error_type() == ErrorType::Timeout;
                let action = match (timed_out, timeout_action) {
                    (true, TimeoutAction::Skip) => {
                        job.skip();
                        ItemAction::Skip
                    }
                    (true, TimeoutAction::Fail) => {
                        job.fail_and_stop(StopReason::AgentTimeout);
                        ItemAction::Fail
                    }
                    (
                        _,
                        TimeoutAction::Dlq
                        | TimeoutAction::GracefulTerminate
                        | TimeoutAction::Skip
                        | TimeoutAction::Fail,
                    ) => job.on_item(ItemEvent::Failed { attempt }),
                };
                // The planner takes a handler's id from `Plan::handlers`; were it missing, the
                // item is dead-lettered rather than handled by nothing.
                let action = match action {
                    ItemAction::Handler(handler) if plan.handler(handler).is_none() => {
                        self.say(&format!(
                            "internal error: handler #{} is not in the plan; item {} goes to the DLQ",
                            handler.0,
                            item_id(index)
                        ));
                        ItemAction::DeadLetter
                    }
                    other => other,
                };
                if matches!(action, ItemAction::Retry { .. }) {
                    let detail = failure_of(runner, &run, &runner.mask(&message), index);
                    earlier.entry(index).or_default().push(detail);
                }
                match action {
                    ItemAction::Retry { attempt, delay } => {
                        let delay = match jitter {
                            Some(factor) => runner.jittered(delay, factor, max_delay),
                            None => delay,
                        };
                        runner.record(
                            "item_retry_scheduled",
                            json!({"item_id": item_id(index), "next_attempt": attempt, "delay_secs": delay.as_secs_f64()}),
                        );
                        let mut halt = halt_rx.clone();
                        let mut signal = runner.cancel.clone();
                        running.push(Box::pin(async move {
                            tokio::select! {
                                () = tokio::time::sleep(delay) => {}
                                () = exec::cancelled(&mut halt) => {}
                                () = exec::cancelled(&mut signal) => {}
                            }
                            Done::RetryDue { index, attempt }
                        }));
                    }
                    ItemAction::Skip => {
                        runner.record("item_skipped", json!({"item_id": item_id(index)}));
                        if let Some(record) = self.outcome(
                            index,
                            attempt,
                            &run,
                            spec.timeout,
                            ItemStatus::Skipped,
                            false,
                        ) {
                            records[index] = Some(record);
                        }
                    }
                    ItemAction::Handler(handler) => {
                        let (name, steps) = plan.handler(handler).unwrap_or_default();
                        runner.record(
                            "item_handler_started",
                            json!({"item_id": item_id(index), "handler": name}),
                        );
                        // Every `${error.*}` field a step's handler has, plus the item's.
                        let error = json!({"message": message, "exit_code": run.failure.as_ref().and_then(|f| f.output.as_ref()).and_then(|o| o.exit_code).unwrap_or(-1), "type": run.error_type().name(), "step": run.failure.as_ref().map(|f| f.step.clone()), "item_id": item_id(index), "timestamp": crate::store::timestamp()});
                        let Some(item) = items.get(index) else {
                            continue;
                        };
                        // A handler takes an agent's place among the `max_parallel`.
                        agents += 1;
                        let spec = &spec;
                        running.push(Box::pin(async move {
                            let ok =
                                run_item_handler(runner, steps, vars, item, index, spec, error)
                                    .await;
                            Done::Handled {
                                index,
                                attempt,
                                run,
                                ok,
                            }
                        }));
                    }
                    ItemAction::DeadLetter | ItemAction::Fail | ItemAction::Done => {
                        let before = earlier.remove(&index).unwrap_or_default();
                        if let Some(record) = self.outcome(
                            index,
                            attempt,
                            &run,
                            spec.timeout,
                            ItemStatus::Failed,
                            true,
                        ) {
                            dlq_count += self.dead_letter(&record, items.get(index), &run, before);
                            records[index] = Some(record);
                        }
                    }
                }
            }
            if let JobState::Stopping(reason) = job.state()
                && !stop_announced
            {
                stop_announced = true;
                let why = describe(reason);
                runner.record("job_stopping", json!({"reason": why}));
                self.say(&format!("stopping: {why}; no new agents start"));
                let _ = halt_tx.send(true);
            }
            if last_save.elapsed() >= Duration::from_secs(1) && self.write_failed.is_none() {
                self.update_counts(&records);
                // A failure is noted and stops the job just below.
                let _ = self.save(None);
                last_save = Instant::now();
                if lost.is_none() {
                    lost = self.state_lost();
                    if let Some(why) = &lost {
                        self.say(&format!("error: {why}; no new agents start"));
                        let _ = halt_tx.send(true);
                    }
                }
            }
            self.stop_after_write_failure(&halt_tx);
        }
        progress.finish();
        if let Some(why) = lost.or_else(|| self.state_lost()) {
            return Err(why);
        }
        if !batch.is_empty() {
            self.say(&format!(
                "{} failed:\n  {}",
                crate::progress::count(batch.len(), "item"),
                batch.join("\n  ")
            ));
        }
        self.update_counts(&records);
        self.runner.record(
            "map_finished",
            json!({"successful": self.cp.successful_items, "failed": self.cp.failed_items, "skipped": self.cp.skipped_items, "pending": self.cp.items_remaining.len()}),
        );
        if let Some(why) = self.write_failure() {
            return Err(why);
        }
        if runner.cancelled() {
            return Ok(MapEnd::Interrupted);
        }
        if let JobState::Stopping(reason) = job.state() {
            return Ok(MapEnd::Stopped(describe(reason)));
        }
        Ok(MapEnd::Finished)
    }

    /// After a failed state write (the job's own or its event log's): says so once, and
    /// stops the job as its error policy would; the agents running finish.
    fn stop_after_write_failure(&mut self, halt: &watch::Sender<bool>) {
        if self.write_announced {
            return;
        }
        let Some(why) = self.write_failure() else {
            return;
        };
        self.write_failed(why.clone());
        self.write_announced = true;
        self.say(&format!("error: {why}; no new agents start"));
        let _ = halt.send(true);
    }

    /// Counts the outcomes in RECORDS that the checkpoint may claim: those whose DLQ entry
    /// is written too.
    fn update_counts(&mut self, records: &[Option<ItemRecord>]) {
        let unwritten = &self.dlq_unwritten;
        let counts = tally(
            records
                .iter()
                .enumerate()
                .filter(|(index, _)| !unwritten.contains(index))
                .filter_map(|(_, record)| record.as_ref()),
        );
        self.cp.successful_items = counts.succeeded;
        self.cp.failed_items = counts.failed;
        self.cp.skipped_items = counts.skipped;
        self.cp.items_processed = counts.finished();
        self.cp.items_remaining = records
            .iter()
            .enumerate()
            .filter(|(index, record)| record.is_none() || unwritten.contains(index))
            .map(|(index, _)| item_id(index))
            .collect();
    }

    /// Records an item's outcome in `results.jsonl`; `None` when it could not be written:
    /// the item stays pending and the job stops.
    fn outcome(
        &mut self,
        index: usize,
        attempt: u32,
        run: &AgentRun,
        timeout: Option<Duration>,
        status: ItemStatus,
        dead_lettered: bool,
    ) -> Option<ItemRecord> {
        let failed = status != ItemStatus::Succeeded;
        let record = ItemRecord {
            item_id: item_id(index),
            index,
            status,
            attempts: attempt,
            output: run.output.as_ref().map(|o| self.runner.mask(o)),
            error: failed.then(|| self.runner.mask(&run.message(timeout))),
            error_type: failed.then(|| run.error_type().name().to_owned()),
            duration_secs: run.duration.as_secs_f64(),
            dead_lettered,
            claude: (run.claude.calls > 0).then_some(run.claude),
            slurm: run.slurm.clone(),
        };
        match self.files.append(&record) {
            Ok(()) => Some(record),
            Err(e) => {
                self.write_failed(job_write_failure(&e));
                None
            }
        }
    }

    /// Puts a failed item in the DLQ with its EARLIER failed attempts (those `retry_config`
    /// ran again) before the last; 1 when it is a new entry.
    fn dead_letter(
        &mut self,
        record: &ItemRecord,
        item: Option<&Value>,
        run: &AgentRun,
        earlier: Vec<FailureDetail>,
    ) -> u64 {
        let failure = failure_of(
            self.runner,
            run,
            record.error.as_deref().unwrap_or_default(),
            record.index,
        );
        let data = item.unwrap_or(&Value::Null);
        let attempts = earlier.len();
        let mut failures = earlier;
        failures.push(failure);
        match self
            .dlq
            .record_failures(&record.item_id, data, failures, run.artifacts.clone())
        {
            Ok(entry) => {
                self.runner.record(
                    "dlq_item_added",
                    json!({"item_id": record.item_id, "error_signature": entry.error_signature, "failure_count": entry.failure_count}),
                );
                u64::from(entry.failure_count as usize == attempts + 1)
            }
            Err(e) => {
                self.dlq_unwritten.insert(record.index);
                self.write_failed(dlq_write_failure(&e));
                0
            }
        }
    }

    /// `reduce`, from the checkpoint's next step, with `${map.*}`.
    async fn reduce(&mut self, vars: &mut Vars) -> JobOutcome {
        // `${map.*}` holds every item's record: built only when a step can read it.
        let readers = self
            .plan
            .merge
            .as_ref()
            .map_or(0, |m| m.steps.len() + m.on_conflict.len());
        if !self.plan.reduce.is_empty() || readers > 0 {
            let records = self.files.load_results().unwrap_or_default();
            let dlq_count = self.dlq.index().map_or(0, |i| i.item_count as u64);
            vars.set("map", map_vars(&records, self.cp.items_total, dlq_count));
        }
        let total = self.plan.reduce.len();
        if self.cp.reduce_next_step == 0 {
            self.runner
                .record("reduce_started", json!({"steps": total}));
        }
        for (index, &id) in self
            .plan
            .reduce
            .iter()
            .enumerate()
            .skip(self.cp.reduce_next_step)
        {
            if self.runner.cancelled() {
                return JobOutcome::Interrupted;
            }
            let label = self
                .plan
                .step(id)
                .map(|s| s.label.clone())
                .unwrap_or_default();
            self.say(&format!("[reduce {}/{total}] {label}", index + 1));
            match self.runner.run_step(id, vars, Some(index)).await {
                Outcome::Cancelled => return JobOutcome::Interrupted,
                o if o.continues() => {}
                _ => {
                    return JobOutcome::Failed {
                        phase: "reduce",
                        what: format!("step `{label}` failed"),
                    };
                }
            }
            self.cp.reduce_next_step = index + 1;
            if let Err(why) = self.save(Some(vars)) {
                return stopped_by_write("reduce", why);
            }
            if let Some(why) = self.write_failure() {
                return stopped_by_write("reduce", why);
            }
        }
        self.runner.record("reduce_finished", json!({}));
        JobOutcome::Completed
    }
}

/// What `prodigy dlq retry` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetrySummary {
    /// Items run again.
    pub retried: u64,
    /// Items that succeeded and left the queue.
    pub succeeded: u64,
    /// Items that failed again and stay, with one more failure recorded.
    pub still_failing: u64,
    /// Items marked for manual review, not run.
    pub manual: u64,
    /// Whether a signal stopped the retry.
    pub interrupted: bool,
    /// Whether the retried agents' work could not be brought into the session worktree.
    pub unmerged: bool,
}

/// Runs the DLQ items of `job_id` again through the agent template, `parallel` at a time
/// (default: the workflow's `max_parallel`), reading them one by one from the queue. Items that succeed leave the queue and their
/// success is added to the job's results; items that fail again stay, with the new failure
/// in their history. Items marked for manual review are left alone.
pub async fn retry_dead_letters(
    runner: &Runner,
    vars: &Vars,
    files: &mut JobFiles,
    job_id: &str,
    parallel: Option<usize>,
    total: usize,
    executor: &crate::slurm::Executor,
) -> Result<RetrySummary, String> {
    let max_parallel = max_parallel(&runner.plan, vars, parallel)?;
    let dlq = Dlq::new(&runner.opts.layout, job_id);
    let ids = dlq.index().map_err(|e| e.to_string())?.item_ids;
    let spec = AgentSpec {
        adopt: false,
        parallel: max_parallel,
        ..AgentSpec::new(&runner.plan, false, total, executor.clone())
    };
    let (_halt_tx, halt_rx) = watch::channel(false);
    runner.record("dlq_retry_started", json!({"items": ids.len()}));
    let mut summary = RetrySummary::default();
    let dlq_ref = &dlq;
    let spec_ref = &spec;
    let mut runs = futures::stream::iter(ids)
        .map(|id| {
            let halt = halt_rx.clone();
            async move {
                let Some(index) = item_index(&id) else {
                    runner.say(&format!("{id}: not an item of this job; left in the queue"));
                    return (id, 0, None);
                };
                let entry = match dlq_ref.get(&id) {
                    Ok(Some(entry)) => entry,
                    Ok(None) => return (id, index, None),
                    Err(e) => {
                        runner.say(&format!("error: {e}"));
                        return (id, index, None);
                    }
                };
                if !entry.reprocess_eligible || runner.cancelled() {
                    return (id, index, Some((entry, None)));
                }
                let attempt = entry.failure_count.saturating_add(1);
                let run = run_agent(
                    runner,
                    spec_ref,
                    vars,
                    &entry.item_data,
                    index,
                    attempt,
                    halt,
                )
                .await;
                (id, index, Some((entry, Some(run))))
            }
        })
        .buffer_unordered(max_parallel.max(1));
    while let Some((id, index, result)) = runs.next().await {
        let Some((entry, run)) = result else { continue };
        let Some(run) = run else {
            if runner.cancelled() {
                summary.interrupted = true;
            } else {
                summary.manual += 1;
                runner.say(&format!("{id}: marked for manual review; not retried"));
            }
            continue;
        };
        match run.end {
            RunEnd::Cancelled => summary.interrupted = true,
            RunEnd::Succeeded => {
                summary.retried += 1;
                summary.succeeded += 1;
                // The success is recorded before the item leaves the queue, so a crash in
                // between loses nothing.
                let record = ItemRecord {
                    item_id: id.clone(),
                    index,
                    status: ItemStatus::Succeeded,
                    attempts: entry.failure_count.saturating_add(1),
                    output: run.output.as_ref().map(|o| runner.mask(o)),
                    error: None,
                    error_type: None,
                    duration_secs: run.duration.as_secs_f64(),
                    dead_lettered: false,
                    claude: (run.claude.calls > 0).then_some(run.claude),
                    slurm: run.slurm.clone(),
                };
                files.append(&record).map_err(|e| e.to_string())?;
                dlq.remove(&id).map_err(|e| e.to_string())?;
                runner.record("dlq_item_removed", json!({"item_id": id}));
                runner.say(&format!(
                    "{id}: succeeded; removed from the dead letter queue"
                ));
            }
            RunEnd::Failed | RunEnd::TimedOut => {
                summary.retried += 1;
                summary.still_failing += 1;
                let message = runner.mask(&run.message(spec.timeout));
                let failure = failure_of(runner, &run, &message, index);
                let updated = dlq
                    .record_failure(&id, &entry.item_data, failure, run.artifacts.clone())
                    .map_err(|e| e.to_string())?;
                runner.record(
                    "dlq_item_updated",
                    json!({"item_id": id, "failure_count": updated.failure_count}),
                );
                let last = message.lines().last().unwrap_or("").to_owned();
                runner.say(&format!(
                    "{id}: failed again ({} failures): {last}",
                    updated.failure_count
                ));
            }
        }
    }
    // A stale index does no harm (the next load rebuilds it from the items): say so, go on.
    if let Err(e) = dlq.flush() {
        runner.say(&format!("warning: cannot write the DLQ index: {e}"));
    }
    if let Err(why) = runner.end_map_phase().await {
        runner.say(&format!("error: {why}"));
        summary.unmerged = true;
    }
    runner.record(
        "dlq_retry_finished",
        json!({"retried": summary.retried, "succeeded": summary.succeeded, "still_failing": summary.still_failing}),
    );
    Ok(summary)
}

/// `${map.*}` (docs/language.md §5).
fn map_vars(records: &[ItemRecord], total: u64, dlq_count: u64) -> Value {
    let metrics = error_metrics(records, total);
    let finished = metrics.successful + metrics.failed + metrics.skipped;
    #[expect(
        clippy::cast_precision_loss,
        reason = "item counts stay far below 2^52"
    )]
    let success_rate = if finished > 0 {
        metrics.successful as f64 / finished as f64
    } else {
        0.0
    };
    json!({
        "results": records,
        "successful": metrics.successful,
        "failed": metrics.failed,
        "skipped": metrics.skipped,
        "total": total,
        "failure_rate": metrics.failure_rate,
        "success_rate": success_rate,
        "dlq_count": dlq_count,
    })
}

/// The DLQ's record of RUN's failure, with MESSAGE (already masked).
fn failure_of(runner: &Runner, run: &AgentRun, message: &str, index: usize) -> FailureDetail {
    let output = run.failure.as_ref().and_then(|f| f.output.as_ref());
    FailureDetail {
        error_type: run.error_type(),
        command_output: output.map(|o| crate::dlq::CommandTail {
            exit_code: o.exit_code,
            stdout: runner.mask(&o.stdout),
            stderr: runner.mask(&o.stderr),
        }),
        step_failed: run
            .failure
            .as_ref()
            .map_or_else(|| "agent".to_owned(), |f| runner.mask(&f.step)),
        json_log_location: run
            .failure
            .as_ref()
            .and_then(|f| f.log.as_ref())
            .map(|p| p.display().to_string()),
        slurm: run.slurm.clone(),
        ..failure_detail(None, message, index, run.duration.as_secs_f64())
    }
}

fn failure_detail(
    error_type: Option<&str>,
    message: &str,
    index: usize,
    duration_secs: f64,
) -> FailureDetail {
    let error_type = ErrorType::from_name(error_type.unwrap_or_default());
    let lines: Vec<&str> = message.lines().collect();
    FailureDetail {
        attempt_number: 1,
        timestamp: crate::store::timestamp(),
        error_type,
        error_message: lines.last().copied().unwrap_or("").to_owned(),
        error_context: (lines.len() > 1).then(|| lines.iter().map(|l| (*l).to_owned()).collect()),
        stack_trace: (!message.is_empty()).then(|| message.to_owned()),
        agent_id: agent_id(index),
        step_failed: "agent".to_owned(),
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a duration in milliseconds, never negative"
        )]
        duration_ms: (duration_secs * 1000.0) as u64,
        json_log_location: None,
        command_output: None,
        slurm: None,
    }
}

/// A setup `capture_outputs` entry from its step's output.
fn setup_value(capture: &OutputCapture, out: &CommandOutput) -> Result<Value, String> {
    let CommandOutput {
        stdout,
        stderr,
        success,
    } = out;
    let name = &capture.name;
    let mut text = match capture.source {
        CaptureSource::Stdout => stdout.clone(),
        CaptureSource::Stderr => stderr.clone(),
        CaptureSource::Both => format!("stdout:\n{stdout}\nstderr:\n{stderr}"),
        CaptureSource::Combined => format!("{stdout}{stderr}"),
    };
    if let Ok(max) = usize::try_from(capture.max_size)
        && max > 0
        && text.len() > max
    {
        text.truncate(text.floor_char_boundary(max));
    }
    let mut found = Some(text);
    if let (Some(pattern), Some(t)) = (&capture.pattern, &found) {
        let re = prodigy_grammar::compile_regex(pattern)
            .map_err(|e| format!("capture `{name}`: `pattern`: {e}"))?;
        found = re
            .captures(t)
            .and_then(|c| c.get(1).or_else(|| c.get(0)).map(|m| m.as_str().to_owned()));
    }
    if let (Some(path), Some(t)) = (&capture.json_path, &found) {
        let path = prodigy_grammar::jsonpath::JsonPath::parse(path)
            .map_err(|e| format!("capture `{name}`: `json_path`: {e}"))?;
        found = serde_json::from_str::<Value>(t)
            .ok()
            .and_then(|doc| path.select(&doc).into_iter().next())
            .map(|v| match v {
                Value::String(s) => s,
                other => other.to_string(),
            });
    }
    let text = match (found, &capture.default) {
        (Some(t), _) => t,
        (None, Some(default)) => default.clone(),
        (None, None) => {
            return Err(format!(
                "capture `{name}`: `pattern` or `json_path` found nothing in the output of setup step {}, and there is no `default`",
                capture.command_index
            ));
        }
    };
    let text = match capture.multiline {
        Multiline::Preserve => text,
        Multiline::Join => text.lines().collect::<Vec<_>>().join(" "),
        Multiline::FirstLine => text.lines().next().unwrap_or("").to_owned(),
        Multiline::LastLine => text.lines().last().unwrap_or("").to_owned(),
        Multiline::Array => {
            return Ok(Value::Array(
                text.lines().map(|l| Value::String(l.to_owned())).collect(),
            ));
        }
    };
    crate::runner::typed_value(capture.format, name, &text, *success)
}

/// Shows the job's counts on the progress display.
fn show_progress(
    progress: &mut Progress,
    job: &Job,
    agents: usize,
    dlq: u64,
    breaker: Option<&Breaker>,
    claude_turns: u64,
) {
    let tally = Tally {
        done: job.counts().finished(),
        running: agents as u64,
        failed: job.counts().failed + job.counts().skipped,
        dlq,
        claude_turns,
    };
    progress.update(tally, breaker.map_or("off", |b| breaker_name(b.state())));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(index: usize, kind: &str, message: &str) -> ItemRecord {
        ItemRecord {
            item_id: item_id(index),
            index,
            status: ItemStatus::Failed,
            attempts: 1,
            output: None,
            error: Some(message.into()),
            error_type: Some(kind.into()),
            duration_secs: 0.0,
            dead_lettered: true,
            claude: None,
            slurm: None,
        }
    }

    #[test]
    fn metrics_count_outcomes_and_find_patterns() {
        let mut records = vec![
            failed(0, "Timeout", "agent timed out"),
            failed(1, "Timeout", "agent timed out"),
            failed(2, "Timeout", "agent timed out"),
            failed(3, "CommandFailed", "connection refused by network"),
            failed(4, "CommandFailed", "network unreachable"),
            failed(5, "CommandFailed", "network unreachable"),
            failed(6, "Unknown", "odd"),
        ];
        records.push(ItemRecord {
            status: ItemStatus::Succeeded,
            error: None,
            error_type: None,
            ..failed(7, "", "")
        });
        let metrics = error_metrics(&records, 10);
        assert_eq!(
            (metrics.total_items, metrics.successful, metrics.failed),
            (10, 1, 7)
        );
        assert!((metrics.failure_rate - 7.0 / 8.0).abs() < 1e-9);
        assert_eq!(metrics.error_types.get("Timeout"), Some(&3));
        let patterns: Vec<(&str, &str)> = metrics
            .failure_patterns
            .iter()
            .map(|p| (p.pattern.as_str(), p.suggestion.as_str()))
            .collect();
        assert_eq!(
            patterns,
            vec![
                (
                    "CommandFailed",
                    "Check network connectivity and retry settings"
                ),
                (
                    "Timeout",
                    "Consider increasing agent_timeout_secs in timeout_config"
                ),
            ]
        );
    }

    #[test]
    fn the_advice_names_the_dominant_error() {
        // 3 permission errors and 1 network error: the advice is about permissions, even
        // though a network error is among them.
        let records = vec![
            failed(
                0,
                "CommandFailed",
                "cp: cannot create 'out/a': Permission denied",
            ),
            failed(1, "CommandFailed", "curl: (7) connection refused"),
            failed(2, "CommandFailed", "open /etc/x: permission denied"),
            failed(
                3,
                "CommandFailed",
                "rm: cannot remove 'b': Permission denied",
            ),
        ];
        let metrics = error_metrics(&records, 4);
        assert_eq!(
            metrics.failure_patterns,
            vec![FailurePattern {
                pattern: "CommandFailed".into(),
                frequency: 4,
                suggestion: "Verify file permissions and access rights".into(),
            }]
        );
        // Mostly unrelated errors: the generic advice, not the one network error's.
        let records = vec![
            failed(0, "CommandFailed", "error[E0308]: mismatched types"),
            failed(1, "CommandFailed", "error[E0425]: cannot find value"),
            failed(2, "CommandFailed", "network unreachable"),
        ];
        assert_eq!(
            error_metrics(&records, 3).failure_patterns[0].suggestion,
            "Review error logs for more details."
        );
    }

    #[test]
    fn a_dlq_write_lost_by_a_crash_is_repaired_but_a_cleared_item_stays_out() {
        let home = tempfile::tempdir().unwrap();
        let layout = crate::store::Layout {
            home: home.path().to_owned(),
            repo: "demo".into(),
        };
        let dlq = Dlq::new(&layout, "job");
        let records = vec![failed(0, "Timeout", "slow"), failed(1, "Timeout", "slow")];
        let items = vec![json!("a"), json!("b")];
        // Item 0 was recorded before the last checkpoint (then cleared by hand); item 1
        // after it, and its DLQ write was lost.
        let remaining = vec![item_id(1)];
        assert_eq!(
            repair_dlq(&dlq, &records, &items, &remaining),
            vec![item_id(1)]
        );
        let entry = dlq.get(&item_id(1)).unwrap().unwrap();
        assert_eq!(entry.item_data, json!("b"));
        assert_eq!(entry.failure_history[0].error_type, ErrorType::Timeout);
        assert!(dlq.get(&item_id(0)).unwrap().is_none());
        // Repairing again adds nothing twice.
        assert!(repair_dlq(&dlq, &records, &items, &remaining).is_empty());
    }

    fn capture(source: CaptureSource) -> OutputCapture {
        OutputCapture {
            source,
            max_size: 1024,
            ..OutputCapture::new("v", 0)
        }
    }

    #[test]
    fn setup_captures_apply_pattern_path_default_and_lines() {
        let out = CommandOutput {
            stdout: "count: 42\n{\"a\": {\"b\": [7]}}".to_owned(),
            stderr: "warn".to_owned(),
            success: true,
        };
        let mut c = capture(CaptureSource::Stdout);
        c.pattern = Some(r"count: (\d+)".into());
        c.format = prodigy_compiler::plan::CaptureFormat::Number;
        assert_eq!(setup_value(&c, &out).unwrap(), json!(42));
        let mut c = capture(CaptureSource::Stdout);
        c.multiline = Multiline::LastLine;
        assert_eq!(
            setup_value(&c, &out).unwrap(),
            json!("{\"a\": {\"b\": [7]}}")
        );
        let json_out = CommandOutput {
            stdout: "{\"a\": {\"b\": [7]}}".to_owned(),
            stderr: String::new(),
            success: true,
        };
        let mut c = capture(CaptureSource::Stdout);
        c.json_path = Some("$.a.b[0]".into());
        assert_eq!(setup_value(&c, &json_out).unwrap(), json!("7"));
        let mut c = capture(CaptureSource::Stderr);
        c.pattern = Some("nothing".into());
        assert!(setup_value(&c, &out).is_err());
        c.default = Some("fallback".into());
        assert_eq!(setup_value(&c, &out).unwrap(), json!("fallback"));
        let mut c = capture(CaptureSource::Stdout);
        c.max_size = 5;
        assert_eq!(setup_value(&c, &out).unwrap(), json!("count"));
    }
}
