//! The driver: walks a standard workflow's plan step by step, feeding each step's
//! [`StepMachine`] with what the executors report, recording every event before acting on
//! it, and writing a checkpoint after every step.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use prodigy_plan::{Plan, StepId};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::Value;
use tokio::sync::watch;

use crate::layout::Layout;
use crate::store::{ContinuedStep, EventLog};
use crate::vars::Vars;

/// How to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The workflow file (for checkpoints and resume).
    pub workflow: PathBuf,
    /// A hash of the workflow text.
    pub workflow_hash: String,
    /// The user's project directory: where env files and secret files are read, and where
    /// commands run when there is no session worktree.
    pub project: PathBuf,
    /// The session worktree commands run in (docs/language.md §11), when the project is a git repository
    /// and the run was not started with `--no-worktree`.
    pub worktree: Option<crate::worktree::SessionWorktree>,
    /// `$PRODIGY_HOME` and the project name.
    pub layout: Layout,
    /// `--param K=V`.
    pub params: Vec<(String, String)>,
    /// `--args`.
    pub args: Vec<String>,
    /// `--profile`.
    pub profile: Option<String>,
    /// `PRODIGY_CLAUDE_COMMAND`.
    pub claude_command: Option<String>,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Seed for jitter.
    pub seed: u64,
    /// How much of each output stream of a command is kept in memory
    /// (`PRODIGY_OUTPUT_LIMIT`).
    pub output_limit: usize,
    /// `--max-cost-usd`: the Claude budget of the run or job, over the workflow's
    /// `claude.max_cost_usd` ([`crate::claude::budget`]).
    pub max_cost_usd: Option<f64>,
    /// What a resumed session's Claude calls cost before this process (from its
    /// checkpoint): its budget spans resumes.
    pub claude_before: crate::claude::Totals,
}

/// What a run was started with that its checkpoint keeps, and `resume` and `resume-job`
/// run with again: `--param`, `--args` and `--profile`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inputs {
    /// `--param K=V`.
    pub params: Vec<(String, String)>,
    /// `--args`.
    pub args: Vec<String>,
    /// `--profile`.
    pub profile: Option<String>,
}

impl From<&crate::store::Checkpoint> for Inputs {
    fn from(c: &crate::store::Checkpoint) -> Self {
        Inputs {
            params: c.params.clone(),
            args: c.args.clone(),
            profile: c.profile.clone(),
        }
    }
}

impl From<&crate::jobstore::JobCheckpoint> for Inputs {
    fn from(c: &crate::jobstore::JobCheckpoint) -> Self {
        Inputs {
            params: c.params.clone(),
            args: c.args.clone(),
            profile: c.profile.clone(),
        }
    }
}

/// Between SIGTERM and SIGKILL unless `--grace` says otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

impl Options {
    /// How to run WORKFLOW, whose text is TEXT, for PROJECT with INPUTS, its files under
    /// LAYOUT: the one place run options are made, for a new run and a resumed one alike.
    /// No worktree yet (entering the run's place sets it), [`DEFAULT_GRACE`], jitter seed 0, the default output limit and the
    /// `claude` program; a caller changes what its command line and environment say.
    #[must_use]
    pub fn new(
        workflow: PathBuf,
        text: &str,
        project: PathBuf,
        layout: Layout,
        inputs: Inputs,
    ) -> Self {
        let Inputs {
            params,
            args,
            profile,
        } = inputs;
        Options {
            workflow,
            workflow_hash: crate::store::hash(text),
            project,
            worktree: None,
            layout,
            params,
            args,
            profile,
            claude_command: None,
            grace: DEFAULT_GRACE,
            seed: 0,
            output_limit: crate::exec::DEFAULT_OUTPUT_LIMIT,
            max_cost_usd: None,
            claude_before: crate::claude::Totals::default(),
        }
    }

    /// How to run again the session of CHECKPOINT, whose workflow now reads TEXT (after
    /// `--force`, the new version is the session's from now on), its files under LAYOUT.
    #[must_use]
    pub fn resumed(checkpoint: &crate::store::Checkpoint, text: &str, layout: Layout) -> Self {
        Options {
            claude_before: checkpoint.claude.unwrap_or_default(),
            ..Options::new(
                checkpoint.workflow.clone(),
                text,
                checkpoint.project.clone(),
                layout,
                checkpoint.into(),
            )
        }
    }

    /// How to run again the MapReduce job of CHECKPOINT, whose workflow now reads TEXT, its
    /// files under LAYOUT.
    #[must_use]
    pub fn resumed_job(
        checkpoint: &crate::jobstore::JobCheckpoint,
        text: &str,
        layout: Layout,
    ) -> Self {
        Options::new(
            checkpoint.workflow_file.clone(),
            text,
            checkpoint.project.clone(),
            layout,
            checkpoint.into(),
        )
    }
}

pub use crate::sequence::RunOutcome;

/// What a run reports.
#[derive(Clone, Debug)]
pub struct Report {
    /// How it ended.
    pub outcome: RunOutcome,
    /// The session.
    pub session_id: String,
    /// The step that failed, if one did.
    pub failed_step: Option<String>,
    /// The event log.
    pub events: PathBuf,
    /// The variables at the end (for the `merge` steps).
    pub vars: Vars,
    /// The steps that failed and after which the workflow went on, in order (those before
    /// a resume included).
    pub continued: Vec<ContinuedStep>,
    /// A state write (checkpoint or event log) that failed and stopped the run: the file and
    /// the OS error. The outcome is then `Failed`, with no failed step.
    pub state_error: Option<String>,
    /// The Claude budget, when it was reached.
    pub budget: Option<crate::claude::budget::Reached>,
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum StartError {
    /// A secret's source is missing.
    #[error("secret `{name}`: {why}")]
    Secret {
        /// The secret.
        name: String,
        /// What is missing.
        why: String,
    },
    /// The Claude CLI a step needs cannot be used.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Claude(#[from] crate::claude::preflight::ClaudeUnusable),
    /// An env value could not be computed.
    #[error("env `{name}`: {why}")]
    Env {
        /// The variable.
        name: String,
        /// Why.
        why: String,
    },
    /// `--profile` names no profile.
    #[error("no profile named `{0}`")]
    Profile(String),
    /// The store could not be written.
    #[error("cannot write under {path}: {source}")]
    Store {
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// One run of a plan: a handle on the run's state, shared by everything the run does,
/// and, inside a map agent (or a setup, merge or handler that runs like one), that agent's
/// scope ([`Runner::in_agent`]). Its fields are the state's ([`RunState`], through
/// `Deref`).
pub struct Runner {
    state: Arc<RunState>,
    /// The map agent the steps run for, if any.
    agent: Option<std::rc::Rc<AgentScope>>,
}

impl RunState {
    /// Notes that the session's checkpoint could not be written (the first failure wins):
    /// no further step starts ([`Runner::state_failure`]).
    pub(crate) fn checkpoint_write_failed(&self, e: &std::io::Error) {
        let path = crate::layout::checkpoint(&self.opts.layout.session_dir(&self.session));
        lock(&self.checkpoint_failed).get_or_insert_with(|| crate::durable::describe(&path, e));
    }
}

impl std::ops::Deref for Runner {
    type Target = RunState;

    fn deref(&self) -> &RunState {
        &self.state
    }
}

/// What one run of a plan shares among its steps and agents.
pub struct RunState {
    pub(crate) plan: Arc<Plan>,
    pub(crate) opts: Options,
    pub(crate) session: String,
    /// Where events and lines go.
    pub(crate) sink: crate::events::Sink,
    pub(crate) cancel: watch::Receiver<bool>,
    pub(crate) rng: Mutex<StdRng>,
    pub(crate) started: Instant,
    pub(crate) started_at: String,
    /// The checkpoints being made durable while the next steps run.
    pub(crate) pending_checkpoint: Mutex<PendingCheckpoint>,
    /// The first checkpoint that could not be written, described.
    pub(crate) checkpoint_failed: Mutex<Option<String>>,
    /// Outputs of `command:` env values with `cache: true`, by rendered command.
    pub(crate) env_cache: Mutex<std::collections::HashMap<String, String>>,
    /// The (step label, variable) pairs already warned of as left out of a command's
    /// environment.
    pub(crate) env_warned: Mutex<std::collections::HashSet<(String, String)>>,
    /// Map agents' merges into the session worktree, one at a time.
    pub(crate) merge_queue: tokio::sync::Mutex<()>,
    /// The verified merge queue's waiting candidates and counts (`merge.verify`).
    pub(crate) verify_queue: crate::mapreduce::verify::Queue,
    /// Map agents' worktrees between two items.
    pub(crate) agent_worktrees: crate::worktree::Pool,
    /// The steps of a standard run that failed and were continued.
    pub(crate) continued: Mutex<Vec<ContinuedStep>>,
    /// Numbers the run's log files.
    pub(crate) log_seq: std::sync::atomic::AtomicU64,
    /// The step logs of the run: each owner's step numbers (`steps`, `item_3`) and the
    /// records file; made at the first step.
    pub(crate) step_logs: Mutex<Option<crate::logs::StepLogs>>,
    /// Turns taken so far by the Claude calls running now.
    pub(crate) live_turns: std::sync::atomic::AtomicU64,
    /// What the Claude calls running now have cost so far, in millionths of a US dollar,
    /// from the usage their streams report (the Claude budget counts it).
    pub(crate) live_cost_micros: std::sync::atomic::AtomicU64,
    /// What the run's Claude calls cost.
    pub(crate) claude_totals: Mutex<crate::claude::Totals>,
    /// Runs the commands of the steps (local processes unless a test injects another).
    pub(crate) executor: Arc<dyn crate::executor::Executor>,
    /// The run's Claude calls at the account's usage limit ([`crate::step`]'s `limit`).
    pub(crate) claude_limit: crate::step::ClaudeLimitState,
    /// Notifications fired and not run yet ([`crate::runner::notify`]).
    pub(crate) notify_queue: Mutex<Vec<crate::runner::notify::Fired>>,
}

/// What a map agent adds to the steps it runs: its ids on every event, its own cancel
/// signal (its timeout, or the job stopping), per-command timeouts, and the failure that
/// ended it.
pub(crate) struct AgentScope {
    /// `agent-<index>`.
    pub agent_id: String,
    /// `item_<index>`.
    pub item_id: String,
    /// `timeout_config.cleanup_grace_period_secs`, over `--grace`.
    pub grace: Option<Duration>,
    /// Set when the agent must stop (a timeout, a signal, `--cancel-running`).
    pub cancel: watch::Receiver<bool>,
    /// `timeout_config.command_timeouts`, resolved to the agent's steps.
    pub timeouts: std::rc::Rc<std::collections::HashMap<StepId, Duration>>,
    /// The last step that failed.
    pub failure: std::cell::RefCell<Option<StepFailure>>,
    /// The agent's own worktree, when the session has one.
    pub workdir: Option<PathBuf>,
    /// What the item's Claude calls cost.
    pub claude: std::cell::RefCell<crate::claude::Totals>,
    /// The item's Claude sessions, logs and last failed kind, for `results.jsonl`.
    pub trail: std::cell::RefCell<crate::jobstore::ItemTrail>,
    /// The session of each Claude step's last call, by step label, for a re-dispatch.
    pub sessions: std::cell::RefCell<std::collections::HashMap<String, String>>,
    /// An item the verified merge queue sent back: the refused run's sessions by step
    /// label, and why its work came back, for a Claude step with `on_retry: continue`.
    pub sent_back: std::cell::RefCell<Option<(std::collections::HashMap<String, String>, String)>>,
}

/// How a command's output is followed and kept.
pub(crate) struct Io<'w> {
    /// Sees each line of standard output as it arrives.
    pub(crate) watch: Option<&'w mut dyn FnMut(&str)>,
    /// Keep this much of each stream instead of `PRODIGY_OUTPUT_LIMIT` (and spill nothing).
    pub(crate) keep: Option<usize>,
    /// Stops the command in place of the run's cancel signal (the caller passes that on).
    pub(crate) cancel: Option<tokio::sync::watch::Receiver<bool>>,
}

/// The step that ended an agent, for the DLQ.
#[derive(Clone, Debug)]
pub(crate) struct StepFailure {
    /// `shell: ...` or `claude: ...`.
    pub step: String,
    /// The last lines of its stderr, or why it could not run.
    pub message: String,
    /// The DLQ's classification.
    pub error_type: crate::dlq::ErrorType,
    /// The failing command's exit code and the last lines of its output, when one ran.
    pub output: Option<crate::dlq::CommandTail>,
    /// The log of the Claude call that failed.
    pub log: Option<PathBuf>,
}

type PendingCheckpoint = standard::CheckpointWriter;

use crate::lock;

mod env;
mod merge_back;
pub(crate) mod notify;
mod prepare;
mod standard;
pub use crate::claude::preflight::{check_claude, needs_claude};

impl Runner {
    /// A runner whose events go under `id` (a session or a MapReduce job), started at
    /// `started_at` when it continues an earlier run.
    pub fn with_id(
        plan: Arc<Plan>,
        opts: Options,
        cancel: watch::Receiver<bool>,
        id: String,
        started_at: Option<String>,
    ) -> Result<Self, StartError> {
        let log = EventLog::open(&opts.layout, &id).map_err(|source| StartError::Store {
            path: opts.layout.home.clone(),
            source,
        })?;
        Ok(Self::with_log(plan, opts, cancel, started_at, id, log))
    }

    /// A runner that records nothing (no events, no logs) and stops on CANCEL, for
    /// `prodigy items --run-setup`.
    pub fn unrecorded(plan: Arc<Plan>, opts: Options, cancel: watch::Receiver<bool>) -> Self {
        Self::with_log(plan, opts, cancel, None, String::new(), EventLog::none())
    }

    /// A runner that records nothing, for `--dry-run`.
    pub fn dry(plan: Arc<Plan>, opts: Options) -> Self {
        let (_, cancel) = watch::channel(false);
        Self::with_log(plan, opts, cancel, None, String::new(), EventLog::none())
    }

    fn with_log(
        plan: Arc<Plan>,
        opts: Options,
        cancel: watch::Receiver<bool>,
        started_at: Option<String>,
        session: String,
        log: EventLog,
    ) -> Self {
        let seed = opts.seed;
        // The run's signal, which a usage limit under `usage_limit: stop` can also set.
        let (cancel, halt) = crate::step::halting(cancel);
        let claude_limit = crate::step::ClaudeLimitState::new(plan.claude_limits, halt);
        // `worktree.keep`: the ignored directories a pooled slot keeps between items.
        let agent_worktrees = crate::worktree::Pool::default();
        agent_worktrees.keep_ignored(plan.worktree.keep.clone());
        // `worktree.persist`: idle slots are kept for the next job (a sparse one is not: the
        // next job's agents may need the whole tree).
        if plan.worktree.persist && plan.worktree.sparse.is_empty() {
            agent_worktrees.persist(opts.layout.clone());
        }
        let state = RunState {
            plan,
            opts,
            session,
            sink: crate::events::Sink::new(log),
            cancel,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            started: Instant::now(),
            started_at: started_at.unwrap_or_else(crate::store::timestamp),
            pending_checkpoint: Mutex::new(PendingCheckpoint::default()),
            checkpoint_failed: Mutex::new(None),
            env_cache: Mutex::new(std::collections::HashMap::new()),
            env_warned: Mutex::new(std::collections::HashSet::new()),
            merge_queue: tokio::sync::Mutex::new(()),
            verify_queue: crate::mapreduce::verify::Queue::default(),
            agent_worktrees,
            continued: Mutex::new(Vec::new()),
            log_seq: std::sync::atomic::AtomicU64::new(1),
            step_logs: Mutex::new(None),
            live_turns: std::sync::atomic::AtomicU64::new(0),
            live_cost_micros: std::sync::atomic::AtomicU64::new(0),
            claude_totals: Mutex::new(crate::claude::Totals::default()),
            executor: Arc::new(crate::executor::LocalExecutor),
            claude_limit,
            notify_queue: Mutex::new(Vec::new()),
        };
        Runner {
            state: Arc::new(state),
            agent: None,
        }
    }

    /// The same run, for the steps of the map agent (or agent-like phase) of SCOPE: its
    /// commands run in its directory under its signal and timeouts, and what it says and
    /// records carries its ids.
    pub(crate) fn in_agent(&self, scope: std::rc::Rc<AgentScope>) -> Runner {
        Runner {
            state: Arc::clone(&self.state),
            agent: Some(scope),
        }
    }

    /// The scope of the map agent the steps run for, if any.
    pub(crate) fn agent(&self) -> Option<&AgentScope> {
        self.agent.as_deref()
    }

    /// Changes the run's state before it starts (the builders below); a runner already
    /// shared cannot change, which only a bug could ask.
    fn configure(mut self, change: impl FnOnce(&mut RunState)) -> Self {
        match Arc::get_mut(&mut self.state) {
            Some(state) => change(state),
            None => self.say(crate::message::Message::Bug(
                crate::message::Bug::RunnerReconfigured,
            )),
        }
        self
    }

    /// The runner with EXECUTOR running its steps' commands instead of local processes.
    #[must_use]
    pub fn with_executor(self, executor: Arc<dyn crate::executor::Executor>) -> Self {
        self.configure(|state| state.executor = executor)
    }

    /// Carries over, for `resume`, the steps that failed and were continued before: the
    /// run's end reports them with its own.
    pub fn carry_continued(&self, steps: &[ContinuedStep]) {
        *lock(&self.continued) = steps.to_vec();
    }

    /// Where commands run: the map agent's worktree, else the session worktree, else the
    /// project.
    pub(crate) fn workdir(&self) -> PathBuf {
        self.agent()
            .and_then(|a| a.workdir.clone())
            .or_else(|| self.opts.worktree.as_ref().map(|w| w.workdir.clone()))
            .unwrap_or_else(|| self.opts.project.clone())
    }

    /// The session worktree, when the run has one.
    pub fn worktree(&self) -> Option<&crate::worktree::SessionWorktree> {
        self.opts.worktree.as_ref()
    }

    /// Ends a map phase (or a DLQ retry) in a session worktree: the agents' merged work
    /// comes into the session branch, and their idle worktrees are removed (or kept as
    /// spares for the next job, `worktree.persist`, which is said).
    ///
    /// # Errors
    ///
    /// When the merge into the session branch fails (say, setup left uncommitted changes
    /// in files the agents changed); the agents' work stays on the integration ref.
    pub async fn end_map_phase(&self) -> Result<(), crate::worktree::FinishMapError> {
        let Some(session) = &self.opts.worktree else {
            return Ok(());
        };
        let spares = self.agent_worktrees.drain(&session.repo).await;
        if spares > 0 {
            self.say(crate::message::Message::SparesKept {
                count: spares,
                dir: self.opts.layout.worktrees_dir(),
            });
        }
        let left = crate::worktree::finish_map(session)
            .await
            .map_err(|source| crate::worktree::FinishMapError {
                branch: session.branch.clone(),
                path: session.path.clone(),
                source,
            })?;
        if let Some(left) = left {
            self.say(crate::message::Message::IntegrationRefLeft(left));
        }
        Ok(())
    }

    /// Whether the workflow has `merge` steps.
    pub fn has_merge_steps(&self) -> bool {
        self.plan
            .merge
            .as_ref()
            .is_some_and(|m| !m.steps.is_empty())
    }

    /// Whether the job keeps its worktrees as spares for the next one (`worktree.persist`).
    pub fn persists(&self) -> bool {
        self.plan.worktree.persist
    }

    /// The session id.
    pub fn session(&self) -> &str {
        &self.session
    }

    pub(crate) fn mask(&self, text: &str) -> String {
        self.sink.secrets().mask(text)
    }

    /// Registers the secret NAME: it is masked in everything the run prints and writes.
    fn add_secret(&self, name: &str, value: &str) {
        self.sink.secrets().add(name, value);
    }

    /// Variables as a checkpoint keeps them: whole, with each secret value replaced by its
    /// name, so that the secret never reaches the disk and [`Runner::unseal`] brings back
    /// exactly what was captured (`Bearer ${TOKEN}` stays usable after a resume).
    pub(crate) fn seal_json(&self, value: Value) -> Value {
        self.sink.secrets().seal_json(value)
    }

    /// Variables a checkpoint kept, with the secrets of this run put back in place.
    pub fn unseal(&self, value: Value) -> Value {
        self.sink.secrets().unseal_json(value)
    }

    /// Records an event; inside a map agent it carries the agent's and the item's ids.
    pub(crate) fn record(&self, event: &crate::events::Event) {
        let agent =
            self.agent()
                .filter(|a| !a.agent_id.is_empty())
                .map(|a| crate::events::AgentIds {
                    agent_id: &a.agent_id,
                    item_id: &a.item_id,
                });
        self.sink.record(event, agent);
        self.queue_notifications(event);
    }

    /// DELAY spread by the jitter FACTOR and capped at MAX, from the run's seeded RNG.
    pub(crate) fn jittered(&self, delay: Duration, factor: f64, max: Duration) -> Duration {
        crate::machine::jitter(delay, factor, max, &mut *lock(&self.rng))
    }

    /// The first event that could not be written, described (path and OS error).
    pub(crate) fn state_failure(&self) -> Option<String> {
        lock(&self.checkpoint_failed)
            .clone()
            .or_else(|| self.sink.failure())
    }

    /// Where events go.
    pub fn events_path(&self) -> PathBuf {
        self.sink.path()
    }

    /// Tells the reporter MESSAGE (secrets masked); inside a map agent, as the agent's item.
    pub(crate) fn say(&self, message: crate::message::Message) {
        let item = self.agent().map(|a| a.item_id.as_str());
        self.sink.say(message, item.filter(|item| !item.is_empty()));
    }

    /// Tells the reporter MESSAGE as the run's own, even from a map agent's runner: trouble
    /// of the coordinator (a Slurm task that cannot be cancelled, a slot that waits), shown
    /// without `-v` and without an item.
    pub(crate) fn say_for_run(&self, message: crate::message::Message) {
        self.sink.say(message, None);
    }

    /// Whether the reporter shows a step's output as it arrives.
    pub(crate) fn shows_output(&self) -> bool {
        self.sink.reporter().shows_output()
    }

    /// How a line of STEP's own output is shown, if it is: the output of the reduce phase's
    /// steps and of a standard run's last step is the run's result, shown at normal
    /// verbosity (docs/running.md); any step's at `-v`.
    pub(crate) fn output_shown_as(
        &self,
        step: &prodigy_plan::PlanStep,
    ) -> Option<fn(String) -> crate::message::Message> {
        let result = self.agent().is_none_or(|a| a.agent_id.is_empty())
            && (self.plan.reduce.contains(&step.id) || self.plan.commands.last() == Some(&step.id));
        if result && self.sink.reporter().shows_results() {
            Some(crate::message::Message::Result)
        } else if self.shows_output() {
            Some(crate::message::Message::Output)
        } else {
            None
        }
    }

    /// Shows lines and the progress of map phases with REPORTER (by default nothing is
    /// shown: the runtime never writes to the terminal itself).
    #[must_use]
    pub fn report_to(self, reporter: Arc<dyn crate::events::Reporter>) -> Self {
        self.configure(|state| state.sink.report_to(reporter))
    }

    /// Where STEP was written, for its events.
    pub(crate) fn origin(&self, step: &prodigy_plan::PlanStep) -> Option<crate::events::Origin> {
        crate::events::Origin::of(&self.plan, step)
    }

    /// Turns taken so far by the Claude calls running now, for the progress display.
    pub(crate) fn live_claude_turns(&self) -> u64 {
        self.live_turns.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// What the Claude calls running now have cost so far (their streams' usage priced),
    /// for the Claude budget.
    pub(crate) fn live_claude_cost(&self) -> f64 {
        crate::claude::budget::amount(
            self.live_cost_micros
                .load(std::sync::atomic::Ordering::Relaxed),
        ) / 1e6
    }

    /// At the end of a run or a job that made Claude calls: what they cost.
    pub(crate) fn say_claude_totals(&self) {
        let claude = *lock(&self.claude_totals);
        if claude.calls > 0 {
            self.say(crate::message::Message::ClaudeTotals(claude));
        }
    }

    /// The signal that stops what runs now: the agent's inside a map agent, else the run's.
    pub(crate) fn cancel_rx(&self) -> watch::Receiver<bool> {
        self.agent()
            .map_or_else(|| self.cancel.clone(), |a| a.cancel.clone())
    }

    pub(crate) fn cancelled(&self) -> bool {
        *self.cancel.borrow() || self.agent().is_some_and(|a| *a.cancel.borrow())
    }
}

/// The fields of a JSON object (nothing for anything else).
pub(crate) fn fields(value: Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
}
