//! One map agent: its worktree, its item's variables and scope, its steps, its timeout, and
//! the `on_item_failure` handler when it fails.

use crate::backend::Ended;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use prodigy_plan::TimeoutPolicy;
use prodigy_plan::{Plan, StepId};
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::dlq::{ErrorType, FailureDetail, WorktreeArtifacts};
use crate::exec;
use crate::mapreduce::verify::SentBack;
use crate::mapreduce::{Queueing, agent_id, item_id, item_vars, merge_back};
use crate::runner::{AgentScope, Runner, StepFailure};
use crate::vars::Vars;
use crate::worktree::AgentWorktree;

/// What an agent runs: its steps, its timeouts and how it is stopped.
pub(crate) struct AgentSpec {
    pub(crate) steps: Vec<StepId>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) timeouts: Rc<HashMap<StepId, Duration>>,
    pub(crate) grace: Option<Duration>,
    pub(crate) cancel_running: bool,
    pub(crate) total: usize,
    pub(crate) host: crate::backend::AgentHost,
    /// Whether a Slurm task a killed coordinator left for an item is adopted (the map
    /// phase, whose pending items have no outcome yet; not `dlq retry`, whose items do).
    pub(crate) adopt: bool,
    /// The job's `max_parallel`.
    pub(crate) parallel: usize,
}

impl AgentSpec {
    pub(crate) fn new(
        plan: &Plan,
        cancel_running: bool,
        total: usize,
        host: crate::backend::AgentHost,
    ) -> Self {
        let Some(map) = &plan.map else {
            return AgentSpec {
                steps: Vec::new(),
                timeout: None,
                timeouts: Rc::default(),
                grace: None,
                cancel_running,
                total,
                host,
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
            host,
            adopt: true,
            parallel: 1,
        }
    }
}

/// An agent's run.
#[derive(Clone, Debug)]
pub(crate) struct AgentRun {
    pub(crate) end: Ended,
    pub(crate) output: Option<String>,
    pub(crate) failure: Option<StepFailure>,
    pub(crate) duration: Duration,
    /// The agent's worktree, kept because it failed with work in it or its merge
    /// conflicted.
    pub(crate) artifacts: Option<WorktreeArtifacts>,
    /// What its Claude calls cost.
    pub(crate) claude: crate::claude::Totals,
    /// The backend's task that ran it.
    pub(crate) task: Option<crate::backend::TaskRef>,
    /// The commit that merged its work, as `ItemRecord::merge_commit`.
    pub(crate) merge_commit: Option<String>,
    /// Its Claude sessions and logs, and the commits merged.
    pub(crate) trail: crate::jobstore::ItemTrail,
    /// Why the job stops, when its backend cannot go on ([`crate::backend::Dispatched`]).
    pub(crate) stop_job: Option<crate::backend::BackendLost>,
    /// Why the verified merge queue refused its work, when it did.
    pub(crate) refusal: Option<crate::mapreduce::verify::Refusal>,
}

impl AgentRun {
    /// What a backend reported, DURATION after the agent started.
    pub(crate) fn dispatched(done: crate::backend::Dispatched, duration: Duration) -> Self {
        AgentRun {
            end: done.end,
            output: done.output,
            failure: done.failure,
            duration,
            artifacts: None,
            task: done.task,
            claude: done.claude,
            merge_commit: None,
            trail: done.trail,
            stop_job: done.stop_job,
            refusal: None,
        }
    }

    pub(crate) fn rejected() -> Self {
        Self::failed(
            "circuit breaker",
            "the circuit breaker is open: the agent was not started".into(),
            ErrorType::CircuitOpen,
        )
    }

    pub(crate) fn failed(step: &str, message: String, error_type: ErrorType) -> Self {
        AgentRun {
            end: Ended::Failed,
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
            task: None,
            merge_commit: None,
            trail: crate::jobstore::ItemTrail::default(),
            stop_job: None,
            refusal: None,
        }
    }

    pub(crate) fn error_type(&self) -> ErrorType {
        match (self.end, &self.failure) {
            (Ended::TimedOut, _) => ErrorType::Timeout,
            (_, Some(f)) => f.error_type.clone(),
            (_, None) => ErrorType::Unknown,
        }
    }

    pub(crate) fn message(&self, timeout: Option<Duration>) -> String {
        match (self.end, &self.failure) {
            (Ended::TimedOut, _) => format!(
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

/// Runs BODY (the steps of an agent's runner, [`Runner::in_agent`]); on TIMEOUT, on the
/// run's signal, or when HALT is set (if given), sets the agent's cancel signal STOP (its
/// processes get SIGTERM, then SIGKILL after the grace period) and waits for BODY to wind
/// down.
pub(crate) async fn guarded<F: std::future::Future>(
    runner: &Runner,
    stop: watch::Sender<bool>,
    body: F,
    timeout: Option<Duration>,
    halt: Option<watch::Receiver<bool>>,
) -> (F::Output, Option<Stopped>) {
    let mut body = std::pin::pin!(body);
    let deadline = async {
        match timeout {
            // A pause for the Claude usage limit does not count.
            Some(t) => runner.sleep_unpaused(t).await,
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
        cancel: rx,
        timeouts: spec.map(|s| s.timeouts.clone()).unwrap_or_default(),
        grace: spec.and_then(|s| s.grace),
        failure: RefCell::new(None),
        claude: RefCell::new(crate::claude::Totals::default()),
        trail: RefCell::new(crate::jobstore::ItemTrail::default()),
        workdir,
        sessions: RefCell::new(HashMap::new()),
        sent_back: RefCell::new(None),
    };
    (Rc::new(scope), tx)
}

/// Runs one agent for ITEM; HALT says the job stops (a Slurm task not yet running is not
/// started), CANCEL that the running agents are cancelled. Its worktree, its preparation
/// and the merge of its work are the coordinator's; its steps run where its host (the
/// `--executor` backend) says. Work the verified merge queue refuses sends the item back
/// to its agent up to `merge.redispatch` times, each time from the merged work as it is
/// then, with `${verify.*}` saying why; that is not an item retry, and the breaker hears
/// only of how the last run ended.
#[expect(
    clippy::too_many_arguments,
    reason = "the agent's inputs and its two stop signals, all borrowed from the scheduler"
)]
pub(crate) async fn run_agent(
    runner: &Runner,
    spec: &AgentSpec,
    base: &Vars,
    item: &Value,
    index: usize,
    attempt: u32,
    halt: watch::Receiver<bool>,
    cancel: Option<watch::Receiver<bool>>,
) -> AgentRun {
    let merge = runner.plan.merge.as_ref();
    let queued = merge.is_some_and(prodigy_plan::PlanMerge::queued);
    let most = merge.map_or(0, |m| m.redispatch);
    let mut sent_back: Option<SentBack> = None;
    loop {
        let dispatches = sent_back.as_ref().map_or(0, |s| s.attempt);
        let once = Once {
            base,
            item,
            index,
            attempt,
            queued,
            sent_back: sent_back.as_ref(),
            send_back: dispatches < most,
        };
        let (run, sessions) = run_once(runner, spec, &once, halt.clone(), cancel.clone()).await;
        let Some(refusal) = run.refusal.as_ref().filter(|_| dispatches < most) else {
            return run;
        };
        let next = SentBack {
            reason: refusal.reason,
            output: refusal.output.clone(),
            attempt: dispatches + 1,
            sessions,
        };
        runner
            .verify_queue
            .redispatched
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        runner.record(&crate::events::Event::ItemRedispatched {
            item_id: item_id(index),
            reason: next.reason.name().to_owned(),
            attempt: next.attempt,
        });
        runner.say(crate::message::Message::ItemSentBack {
            item: item_id(index),
            reason: next.reason.name(),
            attempt: next.attempt,
            of: most,
        });
        sent_back = Some(next);
    }
}

/// One run of an agent's item: what [`run_once`] needs besides the stop signals.
struct Once<'a> {
    base: &'a Vars,
    item: &'a Value,
    index: usize,
    attempt: u32,
    /// Whether the merge queue is verified: `${verify.*}` is then set, from the refusal
    /// that sent the item back (empty on its first run).
    queued: bool,
    /// The refusal that sent the item back, when one did.
    sent_back: Option<&'a SentBack>,
    /// Whether a refusal of this run's work sends the item back again.
    send_back: bool,
}

/// One run of the agent for ONCE's item, in a fresh worktree from the merged work; with
/// the session of each of its Claude steps, by label, for a re-dispatch to continue.
async fn run_once(
    runner: &Runner,
    spec: &AgentSpec,
    once: &Once<'_>,
    halt: watch::Receiver<bool>,
    cancel: Option<watch::Receiver<bool>>,
) -> (AgentRun, HashMap<String, String>) {
    let Once {
        base,
        item,
        index,
        attempt,
        ..
    } = *once;
    let worktree = match agent_worktree(runner, spec, index).await {
        Ok(worktree) => worktree,
        Err(run) => return (run, HashMap::new()),
    };
    let mut vars = base.clone();
    item_vars(&mut vars, item, index, spec.total);
    if once.queued {
        vars.set("verify", SentBack::vars(once.sent_back));
    }
    let (scope, stop) = scope_for(
        Some(index),
        Some(spec),
        worktree.as_ref().map(|w| w.workdir.clone()),
    );
    if let Some(sent) = once.sent_back {
        *scope.sent_back.borrow_mut() = Some((sent.sessions.clone(), sent.message()));
    }
    runner.record(&crate::events::Event::AgentStarted {
        agent_id: agent_id(index),
        item_id: item_id(index),
        attempt,
    });
    let started = Instant::now();
    let agent = runner.in_agent(scope.clone());
    // `worktree:` copies, links and, once per worktree, `setup` (docs/language.md §11).
    let prepared = match &worktree {
        Some(w) => {
            agent
                .prepare_worktree(&w.path, true, &mut base.clone())
                .await
        }
        None => Ok(()),
    };
    let mut run = if let Err(message) = prepared {
        agent.say(crate::message::Message::AgentWorktreeNotPrepared(
            message.to_string(),
        ));
        AgentRun::failed(
            "worktree.setup",
            message.to_string(),
            ErrorType::WorktreeError,
        )
    } else {
        let dispatch = crate::backend::Dispatch {
            job_dir: runner.opts.layout.job_dir(runner.session()),
            job_id: runner.session().to_owned(),
            index,
            attempt,
            worktree: worktree.clone(),
            timeout: spec.timeout,
            stopping: Some(halt),
            halt: cancel,
            adopt: spec.adopt,
            parallel: spec.parallel,
            steps: spec.steps.clone(),
            stop,
        };
        // The steps run where the host says; everything around them stays here.
        let done = spec.host.dispatch(&agent, dispatch, &mut vars).await;
        AgentRun::dispatched(done, started.elapsed())
    };
    if let (Some(session), Some(worktree)) = (&runner.opts.worktree, worktree) {
        // What the item left running in the background (a dev server, a watcher) is ended
        // before its worktree is looked at and handed to the next item.
        let grace = spec.grace.unwrap_or(runner.opts.grace);
        if let Err(e) = crate::reap::end_item(&agent_id(index), grace).await {
            run = AgentRun::failed("processes", e.to_string(), ErrorType::WorktreeError);
        }
        let queueing = Queueing {
            base,
            send_back: once.send_back,
        };
        merge_back(
            runner,
            session,
            worktree,
            (index, attempt),
            &mut run,
            &mut vars,
            &queueing,
        )
        .await;
    }
    let sessions = scope.sessions.borrow().clone();
    (run, sessions)
}

/// The worktree item INDEX's agent works in: the one a task a killed coordinator left
/// kept (when the backend adopts it), else a new one from the pool; none when the session
/// has no worktree. Err is the item's failed run.
async fn agent_worktree(
    runner: &Runner,
    spec: &AgentSpec,
    index: usize,
) -> Result<Option<AgentWorktree>, AgentRun> {
    let Some(session) = &runner.opts.worktree else {
        return Ok(None);
    };
    if spec.adopt {
        let job_dir = runner.opts.layout.job_dir(runner.session());
        if let Some(adopted) = spec.host.adoptable(runner, &job_dir, index).await.flatten() {
            return Ok(Some(adopted));
        }
    }
    crate::worktree::create_agent(
        &runner.opts.layout,
        session,
        &runner.agent_worktrees,
        &item_id(index),
    )
    .await
    .map(Some)
    .map_err(|e| {
        AgentRun::failed(
            "worktree",
            format!("cannot create the agent's worktree: {e}"),
            ErrorType::WorktreeError,
        )
    })
}

/// The DLQ's record of a kept agent worktree, with its uncommitted CHANGES; secrets masked
/// (a file name or git's message may hold one).
pub(crate) fn artifacts(
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
pub(crate) async fn run_item_handler(
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
    let agent = runner.in_agent(scope);
    // The handler works for the item as its agent did: under the agent's timeout.
    let (outcome, why) = guarded(
        runner,
        stop,
        agent.run_list(steps, &mut vars),
        spec.timeout,
        None,
    )
    .await;
    why.is_none() && outcome.continues()
}

/// The DLQ's record of RUN's failure, with MESSAGE (already masked).
pub(crate) fn failure_of(
    runner: &Runner,
    run: &AgentRun,
    message: &str,
    index: usize,
) -> FailureDetail {
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
        task: run.task.clone(),
        slurm: None,
        ..failure_detail(None, message, index, run.duration.as_secs_f64())
    }
}

pub(crate) fn failure_detail(
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
        task: None,
        slurm: None,
    }
}
