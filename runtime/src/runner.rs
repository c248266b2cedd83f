//! The driver: walks a standard workflow's plan step by step, feeding each step's
//! [`StepMachine`] with what the executors report, recording every event before acting on
//! it, and writing a checkpoint after every step.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use futures::StreamExt;
use futures::future::LocalBoxFuture as BoxFuture;
use prodigy_compiler::plan::{
    self, CaptureFormat, EnvValue, Plan, PlanCommand, PlanStep, SecretSource, StepId,
};
use prodigy_grammar::template::Template;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::exec::{self, Command, Output};
use crate::machine::{Action, Outcome, StepEvent, StepMachine};
use crate::store::{Checkpoint, ContinuedStep, EventLog, Layout};
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
    /// `-v` (1: step output; 2: also commands and timings).
    pub verbose: u8,
    /// `-q`: say only errors (and no progress display); the caller prints the outcome line.
    pub quiet: bool,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Seed for jitter.
    pub seed: u64,
    /// How much of each output stream of a command is kept in memory
    /// (`PRODIGY_OUTPUT_LIMIT`).
    pub output_limit: usize,
}

/// Whether a line [`Runner::say`] prints reports an error (shown even under `-q`).
fn is_error_line(text: &str) -> bool {
    let text = text.trim_start();
    ["error", "internal error", "failed:"]
        .iter()
        .any(|p| text.starts_with(p))
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    /// Every step succeeded or was allowed to fail.
    Succeeded,
    /// A step failed the workflow.
    Failed,
    /// A signal stopped it.
    Interrupted,
}

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
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A secret's source is missing.
    #[error("secret `{name}`: {why}")]
    Secret {
        /// The secret.
        name: String,
        /// What is missing.
        why: String,
    },
    /// `PRODIGY_CLAUDE_COMMAND` cannot be split into words.
    #[error("{0}")]
    ClaudeCommand(String),
    /// The Claude program does not answer `--version`.
    #[error(
        "`{program} --version` failed: {why}; check the Claude Code CLI installation (or PRODIGY_CLAUDE_COMMAND)"
    )]
    ClaudeVersion {
        /// The program.
        program: String,
        /// What went wrong.
        why: String,
    },
    /// Running as root without `IS_SANDBOX=1`.
    #[error(
        "running as root, the Claude Code CLI refuses `--dangerously-skip-permissions`; set `IS_SANDBOX=1` when this machine or container is a sandbox, or run as another user"
    )]
    ClaudeAsRoot,
    /// The Claude program is missing.
    #[error(
        "the workflow has `claude` steps but `{program}` is not installed; install the Claude Code CLI or set PRODIGY_CLAUDE_COMMAND to another agent CLI"
    )]
    ClaudeMissing {
        /// The program looked for.
        program: String,
    },
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

/// One run of a plan.
pub struct Runner {
    pub(crate) plan: Arc<Plan>,
    pub(crate) opts: Options,
    session: String,
    log: Mutex<EventLog>,
    pub(crate) cancel: watch::Receiver<bool>,
    rng: Mutex<StdRng>,
    pub(crate) started: Instant,
    pub(crate) started_at: String,
    secrets: Mutex<crate::vars::Secrets>,
    /// The checkpoint being made durable while the next step starts.
    pending_checkpoint: Mutex<Option<PendingCheckpoint>>,
    /// The first checkpoint that could not be written, described.
    checkpoint_failed: Mutex<Option<String>>,
    /// Outputs of `command:` env values with `cache: true`, by rendered command.
    env_cache: Mutex<std::collections::HashMap<String, String>>,
    /// Map agents' merges into the session worktree, one at a time.
    pub(crate) merge_queue: tokio::sync::Mutex<()>,
    /// Map agents' worktrees between two items.
    pub(crate) agent_worktrees: crate::worktree::Pool,
    /// The steps of a standard run that failed and were continued.
    continued: Mutex<Vec<ContinuedStep>>,
    /// Numbers the run's log files.
    log_seq: std::sync::atomic::AtomicU64,
    /// Turns taken so far by the Claude calls running now.
    live_turns: std::sync::atomic::AtomicU64,
    /// What the run's Claude calls cost.
    pub(crate) claude_totals: Mutex<crate::claude::Totals>,
}

/// What a map agent adds to the steps it runs: its ids on every event, its own cancel
/// signal (its timeout, or the job stopping), per-command timeouts, and the failure that
/// ended it.
pub(crate) struct AgentScope {
    /// `agent-<index>`.
    pub agent_id: String,
    /// `item_<index>`.
    pub item_id: String,
    /// Whether its steps' progress lines show only at `-v` (map agents).
    pub quiet: bool,
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
}

/// How a command's output is followed and kept.
struct Io<'w> {
    /// Sees each line of standard output as it arrives.
    watch: Option<&'w mut dyn FnMut(&str)>,
    /// Keep this much of each stream instead of `PRODIGY_OUTPUT_LIMIT` (and spill nothing).
    keep: Option<usize>,
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

tokio::task_local! {
    pub(crate) static AGENT: std::rc::Rc<AgentScope>;
}

type PendingCheckpoint = tokio::task::JoinHandle<(std::io::Result<PathBuf>, usize, String)>;

use crate::lock;

impl Runner {
    /// A runner for a new session, or for the session of `resume`.
    pub fn new(
        plan: Arc<Plan>,
        opts: Options,
        cancel: watch::Receiver<bool>,
        resume: Option<&Checkpoint>,
    ) -> Result<Self, StartError> {
        let session = resume.map_or_else(crate::store::session_id, |c| c.session_id.clone());
        let started_at = resume.map(|c| c.started_at.clone());
        Self::with_id(plan, opts, cancel, session, started_at)
    }

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
        Runner {
            plan,
            opts,
            session,
            log: Mutex::new(log),
            cancel,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            started: Instant::now(),
            started_at: started_at.unwrap_or_else(crate::store::timestamp),
            secrets: Mutex::new(crate::vars::Secrets::default()),
            pending_checkpoint: Mutex::new(None),
            checkpoint_failed: Mutex::new(None),
            env_cache: Mutex::new(std::collections::HashMap::new()),
            merge_queue: tokio::sync::Mutex::new(()),
            agent_worktrees: crate::worktree::Pool::default(),
            continued: Mutex::new(Vec::new()),
            log_seq: std::sync::atomic::AtomicU64::new(1),
            live_turns: std::sync::atomic::AtomicU64::new(0),
            claude_totals: Mutex::new(crate::claude::Totals::default()),
        }
    }

    /// Carries over, for `resume`, the steps that failed and were continued before: the
    /// run's end reports them with its own.
    pub fn carry_continued(&self, steps: &[ContinuedStep]) {
        *lock(&self.continued) = steps.to_vec();
    }

    /// Where commands run: the map agent's worktree, else the session worktree, else the
    /// project.
    pub(crate) fn workdir(&self) -> PathBuf {
        AGENT
            .try_with(|a| a.workdir.clone())
            .ok()
            .flatten()
            .or_else(|| self.opts.worktree.as_ref().map(|w| w.workdir.clone()))
            .unwrap_or_else(|| self.opts.project.clone())
    }

    /// The session worktree, when the run has one.
    pub fn worktree(&self) -> Option<&crate::worktree::SessionWorktree> {
        self.opts.worktree.as_ref()
    }

    /// Ends a map phase (or a DLQ retry) in a session worktree: the agents' merged work
    /// comes into the session branch, and their idle worktrees are removed.
    ///
    /// # Errors
    ///
    /// When the merge into the session branch fails (say, setup left uncommitted changes
    /// in files the agents changed); the agents' work stays on the integration ref.
    pub async fn end_map_phase(&self) -> Result<(), String> {
        let Some(session) = &self.opts.worktree else {
            return Ok(());
        };
        self.agent_worktrees.drain(&session.repo).await;
        crate::worktree::finish_map(session).await.map_err(|e| {
            format!(
                "cannot bring the agents' merged work (`refs/prodigy/{}`) into the session worktree {}: {e}; commit or remove the changes there that stand in the way",
                session.branch,
                session.path.display()
            )
        })
    }

    /// Whether the workflow has `merge` steps.
    pub fn has_merge_steps(&self) -> bool {
        self.plan
            .merge
            .as_ref()
            .is_some_and(|m| !m.steps.is_empty())
    }

    /// The session id.
    pub fn session(&self) -> &str {
        &self.session
    }

    pub(crate) fn mask(&self, text: &str) -> String {
        lock(&self.secrets).mask(text)
    }

    /// Registers the secret NAME: it is masked in everything the run prints and writes.
    fn add_secret(&self, name: &str, value: &str) {
        lock(&self.secrets).add(name, value);
    }

    /// Variables as a checkpoint keeps them: whole, with each secret value replaced by its
    /// name, so that the secret never reaches the disk and [`Runner::unseal`] brings back
    /// exactly what was captured (`Bearer ${TOKEN}` stays usable after a resume).
    pub(crate) fn seal_json(&self, value: Value) -> Value {
        lock(&self.secrets).seal_json(value)
    }

    /// Variables a checkpoint kept, with the secrets of this run put back in place.
    pub fn unseal(&self, value: Value) -> Value {
        lock(&self.secrets).unseal_json(value)
    }

    /// Records an event; inside a map agent it carries the agent's and the item's ids.
    pub(crate) fn record(&self, event: &str, fields: Value) {
        let mut masked = lock(&self.secrets).mask_json(fields);
        if let Value::Object(map) = &mut masked {
            let _ = AGENT.try_with(|a| {
                if !a.agent_id.is_empty() {
                    map.entry("agent_id")
                        .or_insert_with(|| Value::String(a.agent_id.clone()));
                    map.entry("item_id")
                        .or_insert_with(|| Value::String(a.item_id.clone()));
                }
            });
        }
        lock(&self.log).record(event, masked);
    }

    /// DELAY spread by the jitter FACTOR and capped at MAX, from the run's seeded RNG.
    pub(crate) fn jittered(&self, delay: Duration, factor: f64, max: Duration) -> Duration {
        crate::machine::jitter(delay, factor, max, &mut *lock(&self.rng))
    }

    /// The first event that could not be written, described (path and OS error).
    pub(crate) fn state_failure(&self) -> Option<String> {
        lock(&self.checkpoint_failed)
            .clone()
            .or_else(|| lock(&self.log).failed.clone())
    }

    /// Where events go.
    pub fn events_path(&self) -> PathBuf {
        lock(&self.log).path.clone()
    }

    /// Prints a line to stderr, secrets masked; inside a map agent only at `-v`, prefixed
    /// with the item, so that parallel agents stay readable.
    pub(crate) fn say(&self, text: &str) {
        use std::io::Write as _;
        if self.opts.quiet && !is_error_line(text) {
            return;
        }
        let agent = AGENT.try_with(|a| (a.quiet, a.item_id.clone())).ok();
        let text = match agent {
            Some((true, _)) if self.opts.verbose == 0 => return,
            Some((_, item)) if !item.is_empty() => format!("[{item}] {}", text.trim_start()),
            _ => text.to_owned(),
        };
        crate::progress::println(&self.mask(&text));
        let _ = std::io::stderr().flush();
    }

    /// Turns taken so far by the Claude calls running now, for the progress display.
    pub(crate) fn live_claude_turns(&self) -> u64 {
        self.live_turns.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// At the end of a run or a job that made Claude calls: what they cost.
    pub(crate) fn say_claude_totals(&self) {
        let claude = *lock(&self.claude_totals);
        if claude.calls > 0 {
            self.say(&claude.line());
        }
    }

    /// The signal that stops what runs now: the agent's inside a map agent, else the run's.
    pub(crate) fn cancel_rx(&self) -> watch::Receiver<bool> {
        AGENT
            .try_with(|a| a.cancel.clone())
            .unwrap_or_else(|_| self.cancel.clone())
    }

    pub(crate) fn cancelled(&self) -> bool {
        *self.cancel.borrow() || AGENT.try_with(|a| *a.cancel.borrow()).unwrap_or(false)
    }

    /// The variables a run starts with: env files, workflow env, profile, secrets, args and
    /// params (docs/language.md §1 precedence, lowest first).
    pub async fn initial_vars(&self) -> Result<Vars, StartError> {
        self.starting_vars(false).await
    }

    /// The variables a dry run can know without running anything: secrets are not read
    /// (they show as `***`) and `command:` env values stay unresolved.
    pub async fn preview_vars(&self) -> Result<Vars, StartError> {
        self.starting_vars(true).await
    }

    async fn starting_vars(&self, dry: bool) -> Result<Vars, StartError> {
        let mut vars = Vars::default();
        for file in &self.plan.env_files {
            let name = file.parsed.render(&vars).map_err(|e| StartError::Env {
                name: format!("env_files: {}", file.value),
                why: e.to_string(),
            })?;
            let path = self.opts.project.join(&name);
            let read = std::fs::read_to_string(&path);
            if let Err(e) = &read {
                self.say(&format!(
                    "warning: env file `{}` not loaded: {e}",
                    path.display()
                ));
            }
            if let Ok(text) = read {
                for line in text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                {
                    if let Some((k, v)) = line.split_once('=') {
                        let v = v.trim().trim_matches('"').trim_matches('\'');
                        vars.set_exported(
                            k.trim().trim_start_matches("export ").trim(),
                            Value::String(v.to_owned()),
                        );
                    }
                }
            }
        }
        for (i, arg) in self.opts.args.iter().enumerate() {
            if i == 0 {
                vars.set_exported("ARG", Value::String(arg.clone()));
            }
            vars.set_exported(format!("ARG_{}", i + 1), Value::String(arg.clone()));
        }
        for (k, v) in &self.opts.params {
            vars.set_exported(k.clone(), Value::String(v.clone()));
        }
        let mut secrets = Vec::new();
        for secret in &self.plan.secrets {
            if dry {
                secrets.push((secret.name.value.clone(), "***".to_owned()));
                continue;
            }
            let value = match &secret.source {
                SecretSource::Env(name) => {
                    std::env::var(&name.value).map_err(|_| StartError::Secret {
                        name: secret.name.value.clone(),
                        why: format!("environment variable `{}` is not set", name.value),
                    })?
                }
                SecretSource::File(path) => {
                    std::fs::read_to_string(self.opts.project.join(&path.value))
                        .map(|t| t.trim().to_owned())
                        .map_err(|e| StartError::Secret {
                            name: secret.name.value.clone(),
                            why: format!("cannot read `{}`: {e}", path.value),
                        })?
                }
            };
            self.add_secret(&secret.name.value, &value);
            secrets.push((secret.name.value.clone(), value));
        }
        for var in &self.plan.env {
            if let Some(value) = self
                .env_value(&var.name.value, &var.value, &vars, dry)
                .await?
            {
                vars.set_exported(var.name.value.clone(), value);
            }
        }
        if let Some(name) = &self.opts.profile {
            let profile = self
                .plan
                .profiles
                .iter()
                .find(|p| &p.name.value == name)
                .ok_or_else(|| StartError::Profile(name.clone()))?;
            for var in &profile.env {
                if let Some(value) = self
                    .env_value(&var.name.value, &var.value, &vars, dry)
                    .await?
                {
                    vars.set_exported(var.name.value.clone(), value);
                }
            }
        }
        // Secrets last: they win over everything.
        for (name, value) in secrets {
            vars.set_exported(name, Value::String(value));
        }
        Ok(vars)
    }

    /// Runs again, before each step, the workflow's and the profile's `command:` env values
    /// that are not cached (`cache: false`, the default), so each step sees a fresh value.
    async fn refresh_env(&self, vars: &mut Vars) -> Result<(), StartError> {
        let profile = self
            .opts
            .profile
            .as_ref()
            .and_then(|name| self.plan.profiles.iter().find(|p| &p.name.value == name));
        let overridden =
            |name: &str| profile.is_some_and(|p| p.env.iter().any(|v| v.name.value == name));
        let fresh = self
            .plan
            .env
            .iter()
            .filter(|v| !overridden(&v.name.value))
            .chain(profile.into_iter().flat_map(|p| &p.env))
            .filter(|v| matches!(v.value, EnvValue::Dynamic { cache: false, .. }));
        for var in fresh {
            if let Some(value) = self
                .env_value(&var.name.value, &var.value, vars, false)
                .await?
            {
                vars.set_exported(var.name.value.clone(), value);
            }
        }
        Ok(())
    }

    /// An env value; `None` for a `command:` value in a dry run (it is not run).
    async fn env_value(
        &self,
        name: &str,
        value: &EnvValue,
        vars: &Vars,
        dry: bool,
    ) -> Result<Option<Value>, StartError> {
        let render = |t: &plan::Template, vars: &Vars| {
            t.parsed.render(vars).map_err(|e| StartError::Env {
                name: name.to_owned(),
                why: e.to_string(),
            })
        };
        Ok(Some(match value {
            EnvValue::Static(t) => Value::String(render(t, vars)?),
            EnvValue::Masked(t) => {
                let text = render(t, vars)?;
                self.add_secret(name, &text);
                Value::String(text)
            }
            EnvValue::Dynamic { .. } if dry => return Ok(None),
            EnvValue::Dynamic { command, cache } => {
                let text = render(command, vars)?;
                if *cache && let Some(hit) = lock(&self.env_cache).get(&text) {
                    return Ok(Some(Value::String(hit.clone())));
                }
                let out = self.run_shell(&text, vars).await;
                if out.code != Some(0) {
                    return Err(StartError::Env {
                        name: name.to_owned(),
                        why: format!("`{text}` failed: {}", out.stderr.trim()),
                    });
                }
                let value = out.stdout.trim().to_owned();
                if *cache {
                    lock(&self.env_cache).insert(text, value.clone());
                }
                Value::String(value)
            }
            EnvValue::Conditional {
                condition,
                when_true,
                when_false,
            } => {
                let test = condition.parsed.test(vars).map_err(|e| StartError::Env {
                    name: name.to_owned(),
                    why: e.to_string(),
                })?;
                Value::String(render(if test { when_true } else { when_false }, vars)?)
            }
        }))
    }

    /// Runs TEXT with `sh -c` in the project with the environment of VARS, for at most
    /// 5 minutes: env `command:` values and map input commands.
    pub(crate) async fn run_shell(&self, text: &str, vars: &Vars) -> Output {
        let (program, args) = exec::shell(text);
        let cmd = Command {
            program,
            args,
            cwd: self.workdir(),
            env: vars.environment(),
            clear_env: false,
            timeout: Some(Duration::from_mins(5)),
            grace: self.opts.grace,
            output_limit: self.opts.output_limit,
            spill: None,
            mask: None,
        };
        exec::run(&cmd, &mut self.cancel_rx()).await
    }

    /// A template as `--dry-run` shows it: what can be resolved is, the rest stays as
    /// written, secrets are masked.
    pub fn preview(&self, template: &Template, vars: &Vars) -> String {
        self.mask(&template.render_lenient(vars))
    }

    /// Runs the standard workflow's steps from `start` (0 for a new run).
    pub async fn run(&self, mut vars: Vars, start: usize) -> Report {
        self.record("workflow_started", json!({"workflow": self.plan.name, "session_id": self.session, "resumed_at_step": start, "steps": self.plan.commands.len()}));
        let total = self.plan.commands.len();
        vars.merge(
            "workflow",
            fields(json!({"name": self.plan.name, "id": self.session})),
        );
        // The git context costs a few git commands per step: only when the workflow reads it.
        let git_base = if self
            .plan
            .variables
            .iter()
            .any(|v| matches!(v.name.as_str(), "step" | "workflow" | "git"))
        {
            crate::git::head(&self.workdir()).await
        } else {
            None
        };
        // Steps from START on run again: what they did before a resume no longer counts.
        lock(&self.continued).retain(|c| c.index < start);
        let mut outcome = RunOutcome::Succeeded;
        let mut failed_step = None;
        let mut next = start;
        let mut state_error = None;
        for (index, &id) in self.plan.commands.iter().enumerate().skip(start) {
            if self.cancelled() {
                outcome = RunOutcome::Interrupted;
                break;
            }
            // A checkpoint written while the last step ran has landed by now, most often.
            let landed = lock(&self.pending_checkpoint)
                .as_ref()
                .is_some_and(tokio::task::JoinHandle::is_finished);
            if landed {
                self.settle_checkpoint().await;
            }
            // A run whose state cannot be written stops: what it did since is not kept.
            if let Some(why) = self.state_failure() {
                self.say(&format!("error: {why}; no further step starts"));
                outcome = RunOutcome::Failed;
                state_error = Some(why);
                break;
            }
            let label = self
                .plan
                .step(id)
                .map(|s| s.label.clone())
                .unwrap_or_default();
            // The first step sees the values the run started with.
            if index > start
                && let Err(e) = self.refresh_env(&mut vars).await
            {
                self.say(&format!("  error: {e}"));
                outcome = RunOutcome::Failed;
                failed_step = Some(label);
                break;
            }
            let before = if git_base.is_some() {
                crate::git::head(&self.workdir()).await
            } else {
                None
            };
            self.say(&format!("[{}/{total}] {label}", index + 1));
            let step_outcome = self.run_step(id, &mut vars, Some(index)).await;
            if let (Some(base), Some(before)) = (&git_base, &before) {
                self.git_context(&mut vars, base, before).await;
            }
            if let Outcome::FailedContinued | Outcome::Ignored = step_outcome {
                let handled = step_outcome == Outcome::FailedContinued;
                self.record(
                    "step_failed_continued",
                    json!({"step": label, "step_index": index, "handled": handled}),
                );
                let mut continued = lock(&self.continued);
                continued.retain(|c| c.index != index);
                continued.push(ContinuedStep {
                    index,
                    step: label.clone(),
                    handled,
                });
            }
            match step_outcome {
                Outcome::Cancelled => {
                    outcome = RunOutcome::Interrupted;
                    break;
                }
                o if o.continues() => next = index + 1,
                _ => {
                    outcome = RunOutcome::Failed;
                    failed_step = Some(label);
                    break;
                }
            }
            if index + 1 < total {
                self.checkpoint(&vars, next, "running", false).await;
            }
        }
        // A run some of whose state was lost does not end as completed.
        self.settle_checkpoint().await;
        if let (None, Some(why)) = (&state_error, self.state_failure())
            && outcome != RunOutcome::Interrupted
        {
            self.say(&format!("error: {why}"));
            outcome = RunOutcome::Failed;
            state_error = Some(why);
        }
        let status = match outcome {
            RunOutcome::Succeeded => "completed",
            RunOutcome::Failed => "failed",
            RunOutcome::Interrupted => "interrupted",
        };
        self.checkpoint(&vars, next, status, true).await;
        if let (None, Some(why)) = (&state_error, self.state_failure()) {
            // Not durable: resuming runs the steps since the last checkpoint that landed.
            self.say(&format!("error: {why}"));
            if outcome == RunOutcome::Succeeded {
                outcome = RunOutcome::Failed;
            }
            state_error = Some(why);
        }
        let continued = lock(&self.continued).clone();
        let claude = *lock(&self.claude_totals);
        let mut finished = json!({"outcome": status, "failed_step": failed_step, "failed_continued": continued.len(), "duration_secs": self.started.elapsed().as_secs_f64()});
        if claude.calls > 0 {
            finished["claude"] = json!(claude);
        }
        self.record("workflow_finished", finished);
        self.say_claude_totals();
        let events = lock(&self.log).path.clone();
        Report {
            outcome,
            session_id: self.session.clone(),
            failed_step,
            events,
            vars,
            continued,
            state_error,
        }
    }

    /// After a step: what it committed (`step.*`), what the run has committed so far
    /// (`workflow.*`), and the working tree (`git.*`).
    async fn git_context(&self, vars: &mut Vars, base: &str, before: &str) {
        let project = &self.workdir();
        for (name, from) in [("step", before), ("workflow", base)] {
            vars.merge(name, fields(crate::git::changes(project, from).await));
        }
        vars.set("git", crate::git::status(project).await);
    }

    /// Writes the checkpoint atomically (temporary file, fsync, rename, fsync of the
    /// directory) on a blocking thread. The fsyncs of a step's checkpoint overlap the start
    /// of the next step; each checkpoint waits for the previous one, so they land in order,
    /// and `wait` (the last one of a run) returns only once it is durable. The
    /// `checkpoint_saved` event is recorded when the checkpoint is on disk.
    async fn checkpoint(&self, vars: &Vars, next_step: usize, status: &str, wait: bool) {
        let checkpoint = Checkpoint {
            version: 1,
            session_id: self.session.clone(),
            workflow: self.opts.workflow.clone(),
            project: self.opts.project.clone(),
            workflow_hash: self.opts.workflow_hash.clone(),
            next_step,
            status: status.to_owned(),
            variables: self.seal_json(json!({"values": vars.values, "meta": vars.meta})),
            params: self.opts.params.clone(),
            args: self.opts.args.clone(),
            profile: self.opts.profile.clone(),
            started_at: self.started_at.clone(),
            updated_at: crate::store::timestamp(),
            worktree: self.opts.worktree.clone(),
            continued: lock(&self.continued).clone(),
        };
        self.settle_checkpoint().await;
        let layout = self.opts.layout.clone();
        let status = status.to_owned();
        let handle =
            tokio::task::spawn_blocking(move || (checkpoint.save(&layout), next_step, status));
        *lock(&self.pending_checkpoint) = Some(handle);
        if wait {
            self.settle_checkpoint().await;
        }
    }

    /// Waits for the checkpoint in flight, if any, and records how it went.
    async fn settle_checkpoint(&self) {
        let Some(handle) = lock(&self.pending_checkpoint).take() else {
            return;
        };
        match handle.await {
            Ok((Ok(path), next_step, status)) => self.record(
                "checkpoint_saved",
                json!({"next_step": next_step, "status": status, "path": path}),
            ),
            Ok((Err(e), _, _)) => {
                let path = self
                    .opts
                    .layout
                    .session_dir(&self.session)
                    .join("checkpoint.json");
                lock(&self.checkpoint_failed)
                    .get_or_insert_with(|| crate::statefs::describe(&path, &e));
            }
            Err(e) => self.say(&format!(
                "internal error: the checkpoint writer stopped: {e}"
            )),
        }
    }

    /// Runs one step to its outcome.
    pub fn run_step<'a>(
        &'a self,
        id: StepId,
        vars: &'a mut Vars,
        index: Option<usize>,
    ) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let Some(step) = self.plan.step(id) else {
                return Outcome::Failed;
            };
            if self.cancelled() {
                return Outcome::Cancelled;
            }
            // A step of a phase (`index` given): `step.name`/`step.index` describe it; the
            // git fields describe the last one.
            if let Some(index) = index {
                vars.merge("step", fields(json!({"name": step.label, "index": index})));
            }
            if let (Some(description), true) = (&step.description, self.opts.verbose > 0) {
                self.say(&format!("  ({description})"));
            }
            let fields = crate::store::step_fields(index, &step.label, id.0);
            self.record("step_started", fields.clone());
            let mut machine =
                StepMachine::new(step.retry_policy.clone(), step.handler_policy.clone());
            if let Some(when) = &step.when {
                match when.parsed.test(vars) {
                    Ok(true) => {}
                    Ok(false) => {
                        self.record(
                            "step_skipped",
                            json!({"step": step.label, "when": when.value}),
                        );
                        if self.opts.verbose > 0 {
                            self.say(&format!("  skipped: `when: {}` is false", when.value));
                        }
                        let action = machine.on_event(
                            StepEvent::Skip,
                            self.started.elapsed(),
                            &mut *lock(&self.rng),
                        );
                        return match action {
                            Action::Finish(outcome) => outcome,
                            other => self.invalid(step, &machine, &other),
                        };
                    }
                    Err(e) => {
                        self.record(
                            "step_failed",
                            json!({"step": step.label, "error": format!("when: {e}")}),
                        );
                        self.say(&format!("  error: `when` of `{}`: {e}", step.label));
                        return Outcome::Failed;
                    }
                }
            }
            let head_before =
                if step.commit_required || step.auto_commit || !step.outputs.is_empty() {
                    crate::git::head(&self.workdir()).await
                } else {
                    None
                };
            let mut last: Option<Output> = None;
            // The output of a `strategy: fallback` handler that succeeded after the last run:
            // when it recovers the step, it stands in for the command's.
            let mut fallback_result: Option<Output> = None;
            let mut action = machine.on_event(
                StepEvent::Start,
                self.started.elapsed(),
                &mut *lock(&self.rng),
            );
            let mut outcome = loop {
                match action {
                    Action::Spawn { run, attempt } => {
                        fallback_result = None;
                        self.record(
                            "attempt_started",
                            json!({"step": step.label, "run": run, "attempt": attempt}),
                        );
                        let out = self.execute(step, vars).await;
                        self.record(
                            "attempt_finished",
                            json!({"step": step.label, "run": run, "attempt": attempt, "exit_code": out.code, "timed_out": out.timed_out, "success": out.exit().success(), "duration_secs": out.duration.as_secs_f64()}),
                        );
                        self.show_output(step, &out);
                        set_last_command(vars, step, &out);
                        let event = if out.cancelled {
                            StepEvent::Cancel
                        } else {
                            StepEvent::Exited(out.exit())
                        };
                        last = Some(out);
                        action =
                            machine.on_event(event, self.started.elapsed(), &mut *lock(&self.rng));
                    }
                    Action::Wait { delay, next } => {
                        self.record("retry_scheduled", json!({"step": step.label, "next_attempt": next, "delay_secs": delay.as_secs_f64()}));
                        if self.opts.verbose > 0 {
                            self.say(&format!(
                                "  retrying in {} (attempt {next})",
                                humantime::format_duration(Duration::from_millis(
                                    u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)
                                ))
                            ));
                        }
                        let mut cancel = self.cancel_rx();
                        let event = tokio::select! {
                            () = tokio::time::sleep(delay) => StepEvent::TimerFired,
                            () = exec::cancelled(&mut cancel) => StepEvent::Cancel,
                        };
                        action =
                            machine.on_event(event, self.started.elapsed(), &mut *lock(&self.rng));
                    }
                    Action::RunFallback => {
                        let out = match step.fallback() {
                            Some(t) => {
                                self.record("fallback_started", json!({"step": step.label}));
                                self.run_command(&exec::shell, t, step, vars, true).await
                            }
                            None => Output::error("internal error: no fallback command"),
                        };
                        self.show_output(step, &out);
                        set_last_command(vars, step, &out);
                        let event = StepEvent::Exited(out.exit());
                        last = Some(out);
                        action =
                            machine.on_event(event, self.started.elapsed(), &mut *lock(&self.rng));
                    }
                    Action::RunHandler { run } => {
                        let (ok, handler_output) =
                            self.handle_failure(step, vars, run, last.as_ref()).await;
                        if self.cancelled() {
                            break Outcome::Cancelled;
                        }
                        let fallback = step.handler_policy.recovers;
                        fallback_result = (ok && fallback).then(|| Output {
                            stdout: handler_output,
                            code: Some(0),
                            ..Output::default()
                        });
                        action = machine.on_event(
                            StepEvent::HandlerDone { ok },
                            self.started.elapsed(),
                            &mut *lock(&self.rng),
                        );
                    }
                    Action::Finish(outcome) => break outcome,
                    Action::Kill => break Outcome::Cancelled,
                    Action::Invalid => break self.invalid(step, &machine, &Action::Invalid),
                }
            };
            if outcome == Outcome::Recovered
                && let Some(result) = fallback_result.take()
            {
                last = Some(result);
            }
            if let Some(out) = &last
                && outcome != Outcome::Cancelled
                && let Err(why) = self.capture(step, vars, out)
            {
                self.say(&format!("  error: {why}"));
                self.record("capture_failed", json!({"step": step.label, "error": why}));
                // A value that does not fit its format fails the step; a step whose
                // failures do not fail the workflow (`allow_failure`, `fail_workflow:
                // false`) goes on without the variable.
                // An outcome that is already a failure stays what it is.
                if matches!(outcome, Outcome::Succeeded | Outcome::Recovered) {
                    outcome = failed(step);
                }
            }
            if matches!(outcome, Outcome::Succeeded | Outcome::Recovered) {
                outcome = self.after_success(step, vars, head_before, outcome).await;
            }
            // `on_exit_code` handlers run for the code the command ended with, whether the
            // step goes on or fails (a failed step stays failed).
            if let (Some(out), true) = (&last, outcome != Outcome::Cancelled) {
                for (code, steps) in &step.on_exit_code {
                    if out.code == Some(*code) {
                        self.record(
                            "exit_code_handler_started",
                            json!({"step": step.label, "exit_code": code}),
                        );
                        outcome = self.run_triggered(steps, vars, outcome).await;
                    }
                }
            }
            self.record(
                "step_finished",
                json!({"step": step.label, "outcome": outcome}),
            );
            // A failure that fails the workflow, or one that was only handled: in a map agent
            // both fail the item.
            if !outcome.continues_agent() && outcome != Outcome::Cancelled {
                let detail = last
                    .as_ref()
                    .map(|o| {
                        let line = o.failure_message().trim().lines().last().unwrap_or("");
                        match o.claude_error() {
                            Some(kind) => {
                                let advice = kind
                                    .advice()
                                    .map_or_else(String::new, |a| format!(" ({a})"));
                                format!("Claude `{kind}` error: {line}{advice}")
                            }
                            None => line.to_owned(),
                        }
                    })
                    .unwrap_or_default();
                let _ = AGENT.try_with(|a| {
                    *a.failure.borrow_mut() = Some(StepFailure {
                        step: step_text(step),
                        message: last.as_ref().map_or_else(
                            || "the step failed".to_owned(),
                            |o| tail(o.failure_message(), 20),
                        ),
                        error_type: error_type(step, last.as_ref()),
                        output: last.as_ref().map(|o| crate::dlq::CommandTail {
                            exit_code: o.code,
                            stdout: tail(&o.stdout, crate::dlq::CommandTail::LINES),
                            stderr: tail(&o.stderr, crate::dlq::CommandTail::LINES),
                        }),
                        log: last
                            .as_ref()
                            .and_then(|o| o.claude.as_ref())
                            .and_then(|c| c.log.clone()),
                    });
                });
                let in_agent = AGENT.try_with(|a| !a.agent_id.is_empty()).unwrap_or(false);
                self.say(&format!(
                    "  failed: {}{}{}",
                    step.label,
                    if detail.is_empty() {
                        String::new()
                    } else {
                        format!(": {detail}")
                    },
                    if outcome == Outcome::FailedContinued && !in_agent {
                        "; its `on_failure` handler ran and the workflow goes on (`fail_workflow` is false)"
                    } else {
                        ""
                    }
                ));
            }
            outcome
        })
    }

    /// A step machine answered what cannot happen: an internal error, recorded and shown,
    /// and the step fails.
    fn invalid(&self, step: &PlanStep, machine: &StepMachine, action: &Action) -> Outcome {
        self.record(
            "internal_error",
            json!({"step": step.label, "state": format!("{:?}", machine.state()), "action": format!("{action:?}")}),
        );
        self.say(&format!(
            "internal error in step `{}`: please report it",
            step.label
        ));
        Outcome::Failed
    }

    /// Runs the steps of a phase (the `merge` steps) in order, each with its index as
    /// `step.index`: `Succeeded`, or the outcome of the step that ended the list.
    pub(crate) async fn run_phase(&self, steps: &[StepId], vars: &mut Vars) -> Outcome {
        for (index, &id) in steps.iter().enumerate() {
            let outcome = self.run_step(id, vars, Some(index)).await;
            if !outcome.continues() {
                return outcome;
            }
        }
        Outcome::Succeeded
    }

    /// Runs a map agent's template like [`Self::run_phase`], except that a failure that was
    /// only handled (`FailedContinued`) ends the agent: its item fails.
    pub(crate) async fn run_agent_steps(&self, steps: &[StepId], vars: &mut Vars) -> Outcome {
        for (index, &id) in steps.iter().enumerate() {
            let outcome = self.run_step(id, vars, Some(index)).await;
            if !outcome.continues_agent() {
                return outcome;
            }
        }
        Outcome::Succeeded
    }

    /// Runs a list of steps in order: `Succeeded`, or the outcome (`Failed`, `Cancelled`)
    /// of the step that ended the list.
    pub(crate) fn run_list<'a>(
        &'a self,
        steps: &'a [StepId],
        vars: &'a mut Vars,
    ) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            for &id in steps {
                let outcome = self.run_step(id, vars, None).await;
                // A command with `continue_on_error` (validation and `on_incomplete` lists)
                // does not end the list; an interrupt always does.
                let tolerated = outcome != Outcome::Cancelled
                    && self.plan.step(id).is_some_and(|s| s.continue_on_error);
                if !outcome.continues() && !tolerated {
                    return outcome;
                }
            }
            Outcome::Succeeded
        })
    }

    /// Runs the steps a step triggers (`on_success`, `on_exit_code`, `on_incomplete`): a
    /// failure among them fails the step, and an interrupt stays an interrupt.
    async fn run_triggered(&self, steps: &[StepId], vars: &mut Vars, outcome: Outcome) -> Outcome {
        match self.run_list(steps, vars).await {
            Outcome::Cancelled => Outcome::Cancelled,
            ended if ended.continues() => outcome,
            _ => Outcome::Failed,
        }
    }

    /// Runs the `on_failure` handler after run RUN failed: whether it succeeded, and what its
    /// commands printed (their stdout, one after the other).
    async fn handle_failure(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        run: u32,
        last: Option<&Output>,
    ) -> (bool, String) {
        let Some(on_failure) = &step.on_failure else {
            return (true, String::new());
        };
        let error = last.map_or_else(|| json!({}), |o| {
            let mut error = json!({"message": o.failure_message(), "exit_code": o.code.unwrap_or(-1), "step": step.label, "timestamp": crate::store::timestamp()});
            if let Some(kind) = o.claude_error() {
                error["kind"] = json!(kind.name());
                error["type"] = json!(kind.name());
            }
            error
        });
        vars.set("error", error);
        vars.set("attempt", json!(run));
        self.record(
            "handler_started",
            json!({"step": step.label, "run": run, "strategy": on_failure.strategy}),
        );
        let head_before = if on_failure.commit_required {
            crate::git::head(&self.workdir()).await
        } else {
            None
        };
        let mut ok = true;
        let mut combined = String::new();
        for &id in &on_failure.handler {
            let continue_on_error = self.plan.step(id).is_some_and(|s| s.continue_on_error);
            vars.last_output = None;
            let outcome = self.run_step(id, vars, None).await;
            if let Some(output) = &vars.last_output {
                if !combined.is_empty() {
                    combined.push('\n');
                }
                combined.push_str(output);
            }
            if !matches!(
                outcome,
                Outcome::Succeeded | Outcome::Recovered | Outcome::Ignored | Outcome::Skipped
            ) && !continue_on_error
            {
                ok = false;
                break;
            }
        }
        if ok
            && on_failure.commit_required
            && !self
                .made_commit(step, "the handler of ", head_before.as_deref())
                .await
        {
            ok = false;
        }
        for name in &on_failure.capture {
            vars.set(name.clone(), Value::String(combined.clone()));
        }
        vars.values.remove("error");
        self.record(
            "handler_finished",
            json!({"step": step.label, "run": run, "success": ok}),
        );
        (ok, combined)
    }

    /// Validation, commits and `on_success` after a successful run.
    async fn after_success(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        head_before: Option<String>,
        mut outcome: Outcome,
    ) -> Outcome {
        if let Some(checks) = &step.step_validate
            && !checks.skip
            && !self.step_validate(step, checks, vars).await
        {
            if !checks.ignore_failure {
                return failed(step);
            }
            self.say(&format!(
                "  warning: `step_validate` of `{}` failed; ignored (`ignore_validation_failure`)",
                step.label
            ));
        }
        if let Some(validate) = &step.validate {
            outcome = self.validate(step, validate, vars, outcome).await;
            if !outcome.continues() {
                return outcome;
            }
        }
        if step.auto_commit
            && let Err(why) = self.commit(step, vars, head_before.as_deref()).await
        {
            self.record("step_failed", json!({"step": step.label, "error": why}));
            self.say(&format!("  error: {why}"));
            return failed(step);
        }
        if step.commit_required && !self.made_commit(step, "", head_before.as_deref()).await {
            return failed(step);
        }
        if let (Some(id), Some(before)) = (&step.step_id, &head_before)
            && !step.outputs.is_empty()
        {
            let changed = crate::git::changes(&self.workdir(), before).await;
            let files: Vec<&str> = changed["files_changed"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut outputs = serde_json::Map::new();
            for output in &step.outputs {
                let matcher = globset::Glob::new(&output.file_pattern.value)
                    .map(|g| g.compile_matcher())
                    .ok();
                let matching: Vec<&str> = files
                    .iter()
                    .copied()
                    .filter(|f| matcher.as_ref().is_some_and(|m| m.is_match(f)))
                    .collect();
                outputs.insert(output.name.value.clone(), json!(matching));
            }
            vars.set(id.clone(), Value::Object(outputs));
        }
        if !step.on_success.is_empty() {
            self.record("success_handler_started", json!({"step": step.label}));
            return self.run_triggered(&step.on_success, vars, outcome).await;
        }
        outcome
    }

    /// Whether HEAD moved since BEFORE (`commit_required`); when it did not, records and says
    /// `CommitValidationFailed` for WHAT (`""`, "the handler of ", ...) of STEP.
    async fn made_commit(&self, step: &PlanStep, what: &str, before: Option<&str>) -> bool {
        let after = crate::git::head(&self.workdir()).await;
        if after.is_some() && after.as_deref() != before {
            return true;
        }
        self.record(
            "step_failed",
            json!({"step": step.label, "error": "CommitValidationFailed"}),
        );
        self.say(&format!(
            "  error: {what}`{}` requires a commit and made none (CommitValidationFailed)",
            step.label
        ));
        false
    }

    /// `auto_commit` / `commit_config`: stage (all, or the included paths minus the excluded
    /// ones), commit with the rendered message (checked against `message_pattern`), the
    /// `author`, signed when asked, and squash what the step committed into one commit.
    async fn commit(
        &self,
        step: &PlanStep,
        vars: &Vars,
        head_before: Option<&str>,
    ) -> Result<(), String> {
        let config = step.commit_config.as_ref();
        let message = config
            .and_then(|c| c.message_template.as_ref())
            .map(|t| {
                t.parsed
                    .render(vars)
                    .map_err(|e| format!("commit message: {e}"))
            })
            .transpose()?
            .unwrap_or_else(|| format!("prodigy: {}", step.label));
        if let Some(pattern) = config.and_then(|c| c.message_pattern.as_ref()) {
            let re = prodigy_grammar::compile_regex(&pattern.value)
                .map_err(|e| format!("`message_pattern`: {e}"))?;
            if !re.is_match(&message) {
                return Err(format!(
                    "commit message `{message}` does not match `message_pattern` `{}`",
                    pattern.value
                ));
            }
        }
        let author = config
            .and_then(|c| c.author.as_ref())
            .map(|t| {
                t.parsed
                    .render(vars)
                    .map_err(|e| format!("commit author: {e}"))
            })
            .transpose()?;
        let options = crate::git::CommitOptions {
            message,
            author,
            sign: config.is_some_and(|c| c.sign),
            include: config
                .map(|c| c.include_files.iter().map(|f| f.value.clone()).collect())
                .unwrap_or_default(),
            exclude: config
                .map(|c| c.exclude_files.iter().map(|f| f.value.clone()).collect())
                .unwrap_or_default(),
            squash_since: config
                .is_some_and(|c| c.squash)
                .then_some(head_before)
                .flatten()
                .map(str::to_owned),
        };
        crate::git::commit(&self.workdir(), &options).await
    }

    /// `step_validate`: run the checks, up to `max_attempts` rounds `retry_delay` apart,
    /// until `success_criteria` holds.
    async fn step_validate(
        &self,
        step: &PlanStep,
        checks: &plan::StepValidate,
        vars: &Vars,
    ) -> bool {
        let timeout = checks.timeout.as_ref().map(|t| t.value).or(step.timeout);
        let rounds = checks.max_attempts.max(1);
        for round in 1..=rounds {
            let mut passed = 0u32;
            for check in &checks.checks {
                let out = if check.claude {
                    self.run_claude(&check.command, step, vars, timeout, false)
                        .await
                } else {
                    self.run_command_for(&exec::shell, &check.command, step, vars, timeout, false)
                        .await
                };
                let output_ok = check.expect_output.as_ref().is_none_or(|p| {
                    prodigy_grammar::compile_regex(&p.value)
                        .is_ok_and(|re| re.is_match(&out.stdout))
                });
                if out.code == Some(check.expect_exit_code) && output_ok {
                    passed += 1;
                }
            }
            let total = u32::try_from(checks.checks.len()).unwrap_or(u32::MAX);
            let ok = match checks.success_criteria {
                plan::SuccessCriteria::All => passed == total,
                plan::SuccessCriteria::Any => passed > 0 || total == 0,
                plan::SuccessCriteria::AtLeast(n) => passed >= n,
            };
            self.record(
                "step_validation_finished",
                json!({"step": step.label, "round": round, "passed": passed, "checks": total, "success": ok}),
            );
            if ok {
                return true;
            }
            if round < rounds {
                let mut cancel = self.cancel_rx();
                tokio::select! {
                    () = tokio::time::sleep(checks.retry_delay) => {}
                    () = exec::cancelled(&mut cancel) => return false,
                }
            }
        }
        self.say(&format!(
            "  error: `step_validate` of `{}` failed",
            step.label
        ));
        false
    }

    async fn validate(
        &self,
        step: &PlanStep,
        validate: &prodigy_compiler::plan::PlanValidate,
        vars: &mut Vars,
        outcome: Outcome,
    ) -> Outcome {
        let rounds = validate
            .on_incomplete
            .as_ref()
            .map_or(1, |o| o.max_attempts.max(1));
        for round in 1..=rounds {
            vars.last_output = None;
            let ok = match self.run_list(&validate.commands, vars).await {
                Outcome::Cancelled => return Outcome::Cancelled,
                ended => ended.continues(),
            };
            let mut result = self.validation_result(validate, vars, ok);
            if let Some(schema) = &validate.expected_schema
                && let Err(why) = matches_schema(schema, &result)
            {
                self.say(&format!(
                    "  error: the validation result of `{}` does not fit `expected_schema`: {why}",
                    step.label
                ));
                result = json!({"completion_percentage": 0, "status": "invalid", "missing": [why]});
            }
            // The value as the validator wrote it, so `${validation.completion}` renders `100`.
            let reported = result
                .get("completion_percentage")
                .filter(|v| v.is_number())
                .cloned()
                .unwrap_or_else(|| json!(if ok { 100 } else { 0 }));
            let completion = reported.as_f64().unwrap_or(0.0);
            let complete = completion >= validate.threshold;
            let missing = result.get("missing").cloned().unwrap_or(json!([]));
            vars.set(
                "validation",
                json!({"completion": reported, "missing": missing, "gaps": result.get("gaps").cloned().unwrap_or(json!({})), "status": result.get("status").cloned().unwrap_or(json!(if complete {"complete"} else {"incomplete"})), "attempt_number": round}),
            );
            self.record("validation_finished", json!({"step": step.label, "round": round, "completion": completion, "complete": complete}));
            if complete {
                return outcome;
            }
            let Some(on_incomplete) = &validate.on_incomplete else {
                self.say(&format!(
                    "  warning: validation of `{}` is incomplete ({completion}% < {}%)",
                    step.label, validate.threshold
                ));
                return outcome;
            };
            if round == rounds {
                if on_incomplete.fail_workflow {
                    self.say(&format!(
                        "  error: validation of `{}` still incomplete after {} ({completion}%)",
                        step.label,
                        crate::progress::count(rounds, "attempt")
                    ));
                    return Outcome::Failed;
                }
                self.say(&format!(
                    "  warning: validation of `{}` still incomplete ({completion}%)",
                    step.label
                ));
                return outcome;
            }
            if let Some(prompt) = &on_incomplete.prompt {
                self.say(&format!("  {}", self.preview(&prompt.parsed, vars)));
            }
            let head_before = if on_incomplete.commit_required {
                crate::git::head(&self.workdir()).await
            } else {
                None
            };
            let ended = self
                .run_triggered(&on_incomplete.commands, vars, outcome)
                .await;
            if !ended.continues() {
                return ended;
            }
            if on_incomplete.commit_required
                && !self
                    .made_commit(step, "`on_incomplete` of ", head_before.as_deref())
                    .await
            {
                return Outcome::Failed;
            }
        }
        outcome
    }

    fn validation_result(
        &self,
        validate: &prodigy_compiler::plan::PlanValidate,
        vars: &Vars,
        ok: bool,
    ) -> Value {
        let Some(template) = &validate.result_file else {
            // Without a result file the validator's output may be the result; if it is not
            // JSON, its exit status decides.
            return vars
                .last_output
                .as_deref()
                .and_then(|t| serde_json::from_str(t).ok())
                .unwrap_or_else(|| json!({"completion_percentage": if ok {100} else {0}}));
        };
        // A result file the validator promised but did not write is an incomplete result.
        let result = template
            .parsed
            .render(vars)
            .map_err(|e| e.to_string())
            .and_then(|p| {
                std::fs::read_to_string(self.workdir().join(&p))
                    .map_err(|e| format!("cannot read `{p}`: {e}"))
            })
            .and_then(|t| serde_json::from_str(&t).map_err(|e| format!("not JSON: {e}")));
        result.unwrap_or_else(|why| {
            json!({"completion_percentage": 0, "status": "invalid", "missing": [format!("result_file: {why}")]})
        })
    }

    /// Renders and runs a step's command; `output_file` gets its (masked) stdout.
    async fn execute(&self, step: &PlanStep, vars: &mut Vars) -> Output {
        let output = self.execute_command(step, vars).await;
        let Some(template) = &step.output_file else {
            return output;
        };
        // Failing to keep the output the workflow asked for fails the step.
        let written = template
            .parsed
            .render(vars)
            .map_err(|e| format!("`output_file`: {e}"))
            .and_then(|file| {
                // Never outside the project, however the rendered path is spelled or
                // whatever links it passes.
                let root = self.workdir();
                let path = crate::paths::inside(&root, &root, &file)
                    .map_err(|e| format!("`output_file`: {e}"))?;
                std::fs::write(&path, self.mask(&output.stdout))
                    .map_err(|e| format!("`output_file`: cannot write `{}`: {e}", path.display()))
            });
        match written {
            Ok(()) => output,
            Err(e) => Output::error(e),
        }
    }

    async fn execute_command(&self, step: &PlanStep, vars: &mut Vars) -> Output {
        match &step.command {
            PlanCommand::Shell(t) => self.run_command(&exec::shell, t, step, vars, true).await,
            PlanCommand::Claude(t) => {
                let timeout = Self::step_timeout(step);
                self.run_claude(t, step, vars, timeout, true).await
            }
            PlanCommand::WriteFile(w) => {
                let (path, content) =
                    match (w.path.parsed.render(vars), w.content.parsed.render(vars)) {
                        (Ok(p), Ok(c)) => (p, c),
                        (Err(e), _) | (_, Err(e)) => return Output::error(e.to_string()),
                    };
                match self.cwd(step, vars) {
                    Ok(cwd) => {
                        let root = self.workdir();
                        exec::write_file(
                            &root,
                            &cwd,
                            &path,
                            &content,
                            w.format,
                            w.mode,
                            w.create_dirs,
                        )
                    }
                    Err(e) => Output::error(e),
                }
            }
            PlanCommand::Foreach {
                input,
                parallel,
                steps,
                continue_on_error,
                max_items,
            } => {
                self.foreach(
                    step,
                    vars,
                    input,
                    *parallel,
                    steps,
                    *continue_on_error,
                    *max_items,
                )
                .await
            }
        }
    }

    /// The step's directory: `working_dir` under the project, or the project.
    fn cwd(&self, step: &PlanStep, vars: &Vars) -> Result<PathBuf, String> {
        match &step.working_dir {
            Some(t) => t
                .parsed
                .render(vars)
                .map(|dir| self.workdir().join(dir))
                .map_err(|e| format!("`working_dir`: {e}")),
            None => Ok(self.workdir()),
        }
    }

    async fn run_command(
        &self,
        build: &dyn Fn(&str) -> (String, Vec<String>),
        template: &plan::Template,
        step: &PlanStep,
        vars: &Vars,
        live: bool,
    ) -> Output {
        let timeout = Self::step_timeout(step);
        self.run_command_for(build, template, step, vars, timeout, live)
            .await
    }

    /// The step's timeout: the agent's `command_timeouts`, else its own.
    fn step_timeout(step: &PlanStep) -> Option<Duration> {
        AGENT
            .try_with(|a| a.timeouts.get(&step.id).copied())
            .ok()
            .flatten()
            .or(step.timeout)
    }

    /// The directory of the logs of what runs now: `logs/{repo}/{id}/{item or "steps"}`.
    fn log_dir(&self) -> PathBuf {
        let owner = AGENT
            .try_with(|a| a.item_id.clone())
            .ok()
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| "steps".to_owned());
        crate::logs::dir(&self.opts.layout, &self.session).join(owner)
    }

    /// Where a command's whole output goes once it outgrows the limit.
    fn spill_path(&self, step: &PlanStep) -> PathBuf {
        let n = self
            .log_seq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.log_dir().join(format!(
            "output-{n:04}-{}.log",
            crate::logs::file_part(&step.label)
        ))
    }

    /// Masks secrets as the run knows them now (nothing to do when it knows none).
    fn masker(&self) -> Option<crate::logs::Mask> {
        let secrets = lock(&self.secrets).clone();
        (!secrets.is_empty())
            .then(|| std::sync::Arc::new(move |text: &str| secrets.mask(text)) as crate::logs::Mask)
    }

    /// A command's text, or why it cannot be rendered (secrets masked).
    fn command_text(&self, template: &plan::Template, vars: &Vars) -> Result<String, Output> {
        template
            .parsed
            .render(vars)
            .map_err(|e| Output::error(format!("{e} in `{}`", self.mask(&template.value))))
    }

    /// Runs TEMPLATE as a Claude call (README "Claude Code steps"): the CLI's events are
    /// read as they arrive, written to the call's log, shown at `-v` when LIVE (a step's
    /// own command), and decide whether the call succeeded.
    async fn run_claude(
        &self,
        template: &plan::Template,
        step: &PlanStep,
        vars: &Vars,
        timeout: Option<Duration>,
        live: bool,
    ) -> Output {
        let text = match self.command_text(template, vars) {
            Ok(text) => text,
            Err(out) => return out,
        };
        // A step's own command has its settings merged with the workflow's in the plan; a
        // check of `step_validate` runs with the workflow's defaults.
        let settings = claude_settings(if live {
            step.claude.as_ref()
        } else {
            self.plan.claude.as_ref()
        });
        let (program, args) = match crate::claude::invocation(
            &text,
            self.opts.claude_command.as_deref(),
            &settings,
        ) {
            Ok(invocation) => invocation,
            Err(e) => return Output::error(e.to_string()),
        };
        let mut log = (!self.session.is_empty()).then(|| {
            crate::logs::create_numbered(&self.log_dir(), &step.label, "jsonl", self.masker())
        });
        let log_path = log.as_ref().filter(|l| l.is_open()).map(|l| l.path.clone());
        self.record(
            "claude_started",
            json!({"step": step.label, "program": program, "args": args, "cli_version": crate::claude::version(), "log": log_path}),
        );
        if self.opts.verbose > 1 {
            let shown: Vec<String> = std::iter::once(program.as_str())
                .chain(args.iter().map(String::as_str))
                .map(|word| {
                    shlex::try_quote(word)
                        .map_or_else(|_| word.to_owned(), std::borrow::Cow::into_owned)
                })
                .collect();
            self.say(&format!("  $ {}", shown.join(" ")));
        }
        let mut stream = crate::claude::Stream::default();
        let verbose = if live { self.opts.verbose } else { 0 };
        let mut watch = |line: &str| {
            if let Some(log) = log.as_mut() {
                log.line(line);
            }
            let turns = stream.turns;
            let notes = stream.feed(line);
            if stream.turns > turns {
                self.live_turns.fetch_add(
                    u64::from(stream.turns - turns),
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
            for note in notes {
                // The session's id and model at `-vv`; what Claude does at `-v`.
                let level = if matches!(note, crate::claude::Note::Started { .. }) {
                    2
                } else {
                    1
                };
                if verbose >= level {
                    for shown in note.line().lines() {
                        self.say(&format!("  │ {shown}"));
                    }
                }
            }
        };
        // The raw stream is in the log; memory keeps only its end.
        let io = Io {
            watch: Some(&mut watch),
            keep: Some(64 << 10),
        };
        let mut out = self
            .spawn_command(program, args, step, vars, timeout, io)
            .await;
        if let Some(log) = log.as_mut() {
            log.finish();
            if let Some(e) = &log.error {
                self.say(&format!(
                    "  warning: cannot write the Claude log {}: {e}",
                    log.path.display()
                ));
            }
        }
        self.live_turns.fetch_sub(
            u64::from(stream.turns),
            std::sync::atomic::Ordering::Relaxed,
        );
        if out.spawn_error {
            // Nothing ran: the reason is the failure, not a missing `result`.
            return out;
        }
        let ended = if out.timed_out || out.cancelled {
            None
        } else {
            out.code
        };
        let call = stream.finish(ended, log_path);
        out.streamed = live && self.opts.verbose > 0;
        // `${shell.output}`: the final text, then what the CLI wrote on standard error.
        out.interleaved = None;
        // What the step gives on: the final text, never the raw events.
        out.stdout = if call.verdict.message.is_empty() || call.verdict.message.ends_with('\n') {
            call.verdict.message.clone()
        } else {
            format!("{}\n", call.verdict.message)
        };
        self.record(
            "claude_finished",
            json!({
                "step": step.label,
                "success": call.verdict.kind.is_none() && !out.timed_out && !out.cancelled,
                "error_kind": call.verdict.kind,
                "message": (call.verdict.kind.is_some()).then(|| call.verdict.message.clone()),
                "session_id": call.session_id,
                "num_turns": call.num_turns,
                "cost_usd": call.cost_usd,
                "tokens": call.tokens,
                "tool_calls": call.tool_calls,
                "api_retries": call.api_retries,
                "exit_code": out.code,
                "log": call.log,
                "duration_secs": out.duration.as_secs_f64(),
            }),
        );
        lock(&self.claude_totals).add(&call);
        let _ = AGENT.try_with(|a| a.claude.borrow_mut().add(&call));
        out.claude = Some(Box::new(call));
        out
    }

    /// Renders TEMPLATE and runs it with the step's directory and environment; at `-v`,
    /// a LIVE command's (a step's own) standard output is shown as it arrives.
    async fn run_command_for(
        &self,
        build: &dyn Fn(&str) -> (String, Vec<String>),
        template: &plan::Template,
        step: &PlanStep,
        vars: &Vars,
        timeout: Option<Duration>,
        live: bool,
    ) -> Output {
        let text = match self.command_text(template, vars) {
            Ok(text) => text,
            Err(out) => return out,
        };
        if self.opts.verbose > 1 {
            self.say(&format!("  $ {}", text.trim_end().replace('\n', "\n    ")));
        }
        let (program, args) = build(&text);
        let streamed = live && self.opts.verbose > 0;
        let mut watch = |line: &str| {
            if streamed {
                self.say(&format!("  │ {line}"));
            }
        };
        let mut out = self
            .spawn_command(
                program,
                args,
                step,
                vars,
                timeout,
                Io {
                    watch: streamed.then_some(&mut watch as &mut dyn FnMut(&str)),
                    keep: None,
                },
            )
            .await;
        out.streamed = streamed;
        out
    }

    /// Runs PROGRAM with ARGS in the step's directory and environment; WATCH sees each line
    /// of standard output as it arrives.
    async fn spawn_command(
        &self,
        program: String,
        args: Vec<String>,
        step: &PlanStep,
        vars: &Vars,
        timeout: Option<Duration>,
        io: Io<'_>,
    ) -> Output {
        let mut step_env = Vec::new();
        for var in &step.env {
            match self
                .env_value(&var.name.value, &var.value, vars, false)
                .await
            {
                Ok(Some(v)) => {
                    step_env.push((var.name.value.clone(), prodigy_grammar::value::render(&v)));
                }
                Ok(None) => {}
                Err(e) => return Output::error(e.to_string()),
            }
        }
        if self.opts.verbose > 1 {
            for (name, value) in &step_env {
                let shown = if crate::vars::sensitive_name(name) {
                    "***REDACTED***"
                } else {
                    value.as_str()
                };
                self.say(&format!("  env {name}={shown}"));
            }
        }
        // `clear_env`: an empty environment plus the step's own `env` and `PATH` (docs/language.md §2).
        let mut env = if step.clear_env {
            Vec::new()
        } else {
            vars.environment()
        };
        env.extend(step_env);
        if matches!(step.command, PlanCommand::Claude(_)) {
            env.push(("PRODIGY_AUTOMATION".into(), "true".into()));
        }
        // Secrets win over step env.
        if !step.clear_env {
            for secret in &self.plan.secrets {
                let name = &secret.name.value;
                if let Some(value) = vars.values.get(name) {
                    env.push((name.clone(), prodigy_grammar::value::render(value)));
                }
            }
        }
        let cwd = match self.cwd(step, vars) {
            Ok(cwd) => cwd,
            Err(e) => return Output::error(e),
        };
        let spill = (!self.session.is_empty() && io.keep.is_none()).then(|| self.spill_path(step));
        let command = Command {
            program,
            args,
            cwd,
            env,
            clear_env: step.clear_env,
            timeout,
            grace: AGENT
                .try_with(|a| a.grace)
                .ok()
                .flatten()
                .unwrap_or(self.opts.grace),
            output_limit: io.keep.unwrap_or(self.opts.output_limit),
            mask: if spill.is_some() { self.masker() } else { None },
            spill,
        };
        exec::run_watched(&command, &mut self.cancel_rx(), io.watch).await
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "the fields of a foreach, unpacked"
    )]
    async fn foreach(
        &self,
        step: &PlanStep,
        vars: &mut Vars,
        input: &plan::ForeachInput,
        parallel: u32,
        steps: &[StepId],
        continue_on_error: bool,
        max_items: Option<u64>,
    ) -> Output {
        let mut items: Vec<String> = match input {
            plan::ForeachInput::Command(t) => {
                let out = self.run_command(&exec::shell, t, step, vars, false).await;
                if out.code != Some(0) {
                    return out;
                }
                out.stdout
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned)
                    .collect()
            }
            plan::ForeachInput::List(list) => match list
                .iter()
                .map(|t| t.parsed.render(vars))
                .collect::<Result<Vec<_>, _>>()
            {
                Ok(items) => items,
                Err(e) => return Output::error(e.to_string()),
            },
        };
        if let Some(max) = max_items.and_then(|m| usize::try_from(m).ok()) {
            items.truncate(max);
        }
        let total = items.len();
        let failed = std::sync::atomic::AtomicUsize::new(0);
        let halted = std::sync::atomic::AtomicBool::new(false);
        let base = vars.clone();
        let results = futures::stream::iter(items.into_iter().enumerate())
            .map(|(index, item)| {
                let mut item_vars = base.clone();
                let failed = &failed;
                let halted = &halted;
                async move {
                    if halted.load(std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    item_vars.set("item", Value::String(item));
                    item_vars.set("index", json!(index));
                    item_vars.set("total", json!(total));
                    if !self.run_list(steps, &mut item_vars).await.continues() {
                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if !continue_on_error {
                            halted.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
            })
            .buffer_unordered(usize::try_from(parallel.max(1)).unwrap_or(1));
        results.collect::<Vec<()>>().await;
        let failed = failed.into_inner();
        let summary = format!(
            "foreach: {total} items, {} succeeded, {failed} failed\n",
            total.saturating_sub(failed)
        );
        Output {
            stdout: summary,
            code: Some(i32::from(failed > 0)),
            cancelled: self.cancelled(),
            ..Output::default()
        }
    }

    /// At `-v`, what a command wrote (standard output unless it was shown as it arrived).
    fn show_output(&self, step: &PlanStep, out: &Output) {
        if self.opts.verbose > 0 {
            let stdout = if out.streamed {
                ""
            } else {
                out.stdout.as_str()
            };
            for line in stdout.lines().chain(out.stderr.lines()) {
                self.say(&format!("  │ {line}"));
            }
            if self.opts.verbose > 1 {
                let how = match (out.code, out.timed_out) {
                    (_, true) => "timed out".to_owned(),
                    (Some(code), false) => format!("exited {code}"),
                    // It never ran: why ("could not start `PROGRAM`: REASON"), not a signal.
                    (None, false) if out.spawn_error => {
                        format!(
                            "did not run ({})",
                            out.stderr.lines().next().unwrap_or("").trim()
                        )
                    }
                    (None, false) if out.cancelled => "was interrupted".to_owned(),
                    (None, false) => "ended by a signal".to_owned(),
                };
                self.say(&format!(
                    "  {} {how} in {:.3}s",
                    step.label,
                    out.duration.as_secs_f64()
                ));
            }
        }
    }

    /// Typed `capture` and legacy `capture_output` of the last run.
    fn capture(&self, step: &PlanStep, vars: &mut Vars, out: &Output) -> Result<(), String> {
        let trim = |s: &str| s.strip_suffix('\n').unwrap_or(s).to_owned();
        if let Some(capture) = &step.capture {
            let streams = capture.streams;
            let text = match (streams.stdout, streams.stderr) {
                (true, true) => format!("{}{}", out.stdout, out.stderr),
                (false, true) => out.stderr.clone(),
                (true, false) => out.stdout.clone(),
                // Neither stream: the value is empty; the other fields still describe the run.
                (false, false) => String::new(),
            };
            let text = trim(&text);
            let name = &capture.name.value;
            let value = typed_value(capture.format, name, &text, out.exit().success())?;
            let mut meta = serde_json::Map::new();
            if streams.exit_code {
                meta.insert("exit_code".into(), json!(out.code.unwrap_or(-1)));
            }
            if streams.success {
                meta.insert("success".into(), json!(out.exit().success()));
            }
            if streams.duration {
                meta.insert("duration".into(), json!(out.duration.as_secs_f64()));
            }
            meta.insert("stderr".into(), Value::String(trim(&out.stderr)));
            self.record(
                "variable_captured",
                json!({"step": step.label, "name": name, "format": capture.format}),
            );
            vars.set(name.clone(), value);
            vars.meta.insert(name.clone(), Value::Object(meta));
        }
        // `capture_output: true` on a shell step names `${shell.output}`, which every
        // command already sets (both streams); any other name stores stdout.
        if let Some(name) = step
            .capture_output
            .as_ref()
            .filter(|n| *n != "shell.output")
        {
            match name.split_once('.') {
                Some((root, field)) => {
                    vars.merge(root, fields(json!({ field: trim(&out.stdout) })));
                }
                None => vars.set(name.clone(), Value::String(trim(&out.stdout))),
            }
        }
        Ok(())
    }
}

/// TEXT as a capture of FORMAT (docs/language.md §5); a value that does not fit fails with a message
/// naming the capture. A `boolean` that is neither `true` nor `false` is the command's
/// success.
pub(crate) fn typed_value(
    format: CaptureFormat,
    name: &str,
    text: &str,
    success: bool,
) -> Result<Value, String> {
    Ok(match format {
        CaptureFormat::String => Value::String(text.to_owned()),
        CaptureFormat::Number => {
            let t = text.trim();
            t.parse::<i64>()
                .map(Value::from)
                .ok()
                .or_else(|| {
                    t.parse::<f64>()
                        .ok()
                        .and_then(serde_json::Number::from_f64)
                        .map(Value::Number)
                })
                .ok_or_else(|| format!("capture `{name}`: `{t}` is not a number"))?
        }
        CaptureFormat::Json if text.starts_with(exec::TRUNCATED) => {
            return Err(format!(
                "capture `{name}`: the output was cut to its last part (PRODIGY_OUTPUT_LIMIT), and a `json` capture needs it whole; raise PRODIGY_OUTPUT_LIMIT or write the JSON to a file"
            ));
        }
        CaptureFormat::Json => {
            serde_json::from_str(text).map_err(|e| format!("capture `{name}`: not JSON ({e})"))?
        }
        CaptureFormat::Lines => {
            Value::Array(text.lines().map(|l| Value::String(l.to_owned())).collect())
        }
        CaptureFormat::Boolean => match text.trim() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => Value::Bool(success),
        },
    })
}

/// How the DLQ classifies a failed step: by how its command ended, else by the check after
/// it that failed.
fn error_type(step: &PlanStep, last: Option<&Output>) -> crate::dlq::ErrorType {
    use crate::dlq::ErrorType;
    match last {
        Some(o) if o.timed_out => ErrorType::Timeout,
        Some(o) if let Some(kind) = o.claude_error() => ErrorType::ClaudeFailed { kind },
        Some(o) if o.code != Some(0) => ErrorType::CommandFailed {
            exit_code: o.code.unwrap_or(-1),
        },
        _ if step.commit_required => ErrorType::CommitValidationFailed,
        _ if step.validate.is_some() || step.step_validate.is_some() => ErrorType::ValidationFailed,
        _ => ErrorType::Unknown,
    }
}

/// The outcome of a step that failed after its command ran (a capture, a check, a commit):
/// a failure that fails the workflow unless the step may fail: ignored (`allow_failure`,
/// `on_failure: true`), or failed and continued (a handler with `fail_workflow: false`).
fn failed(step: &PlanStep) -> Outcome {
    let policy = &step.handler_policy;
    if policy.fail_workflow {
        Outcome::Failed
    } else if policy.has_handler {
        Outcome::FailedContinued
    } else {
        Outcome::Ignored
    }
}

/// A step as the DLQ names it: `shell: ...`, `claude: ...`.
fn step_text(step: &PlanStep) -> String {
    match &step.command {
        PlanCommand::Shell(t) => format!("shell: {}", t.value),
        PlanCommand::Claude(t) => format!("claude: {}", t.value),
        PlanCommand::WriteFile(w) => format!("write_file: {}", w.path.value),
        PlanCommand::Foreach { .. } => format!("foreach: {}", step.label),
    }
}

/// Checks, before anything is made (a worktree, a branch, a lock), that the programs that
/// running ROOTS needs work: when one of them, or a step they can lead to, is a `claude`
/// step or `claude` check, the Claude CLI (`claude_command`, else `claude`) is installed,
/// answers `--version` (remembered for the events), and, as root, `IS_SANDBOX=1` is set.
///
/// # Errors
///
/// [`StartError::ClaudeMissing`], [`StartError::ClaudeVersion`],
/// [`StartError::ClaudeAsRoot`], [`StartError::ClaudeCommand`].
pub fn preflight(
    plan: &Plan,
    roots: &[StepId],
    claude_command: Option<&str>,
) -> Result<(), StartError> {
    if !needs_claude(plan, roots) {
        return Ok(());
    }
    let (program, leading) = crate::claude::program(claude_command)
        .map_err(|e| StartError::ClaudeCommand(e.to_string()))?;
    if !exec::program_exists(&program) {
        return Err(StartError::ClaudeMissing { program });
    }
    let version = crate::claude::ask_version(&program, &leading).map_err(|why| {
        StartError::ClaudeVersion {
            program: program.clone(),
            why,
        }
    })?;
    crate::claude::remember_version(&version);
    // As root, the CLI refuses `--dangerously-skip-permissions` unless told it runs in a
    // sandbox; every call would fail the same way.
    if version.contains("Claude Code")
        && nix::unistd::geteuid().is_root()
        && std::env::var("IS_SANDBOX").as_deref() != Ok("1")
    {
        return Err(StartError::ClaudeAsRoot);
    }
    Ok(())
}

/// Whether running ROOTS runs the Claude CLI: one of them, or a step it can lead to
/// (`on_success`, `on_failure`, `on_exit_code`, `validate` and `on_incomplete` commands,
/// `foreach` bodies), is a `claude` step or has a `claude` check.
pub fn needs_claude(plan: &Plan, roots: &[StepId]) -> bool {
    let mut seen = std::collections::HashSet::new();
    let mut stack = roots.to_vec();
    while let Some(id) = stack.pop() {
        let Some(step) = plan.step(id) else { continue };
        if !seen.insert(id) {
            continue;
        }
        let checks_with_claude = step
            .step_validate
            .as_ref()
            .is_some_and(|v| v.checks.iter().any(|c| c.claude));
        if matches!(step.command, PlanCommand::Claude(_)) || checks_with_claude {
            return true;
        }
        stack.extend(&step.on_success);
        if let Some(handler) = &step.on_failure {
            stack.extend(&handler.handler);
        }
        for (_, steps) in &step.on_exit_code {
            stack.extend(steps);
        }
        if let Some(validate) = &step.validate {
            stack.extend(&validate.commands);
            if let Some(incomplete) = &validate.on_incomplete {
                stack.extend(&incomplete.commands);
            }
        }
        if let PlanCommand::Foreach { steps, .. } = &step.command {
            stack.extend(steps);
        }
    }
    false
}

/// The last N lines of a text.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `shell.*` after every command, shell or Claude, and `claude.*` after a Claude command, for
/// handlers and the next step: `${shell.output}` is stdout and stderr interleaved as the
/// command wrote them, `${shell.stdout}` and `${shell.stderr}` each stream alone.
fn set_last_command(vars: &mut Vars, step: &PlanStep, out: &Output) {
    let trimmed = |s: &str| s.strip_suffix('\n').unwrap_or(s).to_owned();
    let exit_code = out.code.unwrap_or(-1);
    vars.set(
        "shell",
        json!({"output": trimmed(&out.combined()), "stdout": trimmed(&out.stdout), "stderr": trimmed(&out.stderr), "exit_code": exit_code}),
    );
    if let Some(call) = &out.claude {
        vars.set(
            "claude",
            json!({
                "output": trimmed(&out.stdout),
                "stderr": trimmed(&out.stderr),
                "exit_code": exit_code,
                "session_id": call.session_id.clone().unwrap_or_default(),
                "cost_usd": call.cost_usd,
                "num_turns": call.num_turns,
                "log": call.log.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                "error_kind": call.verdict.kind.map_or("", crate::claude::ErrorKind::name),
            }),
        );
    } else if matches!(step.command, PlanCommand::Claude(_)) {
        vars.set(
            "claude",
            json!({"output": trimmed(&out.stdout), "stderr": trimmed(&out.stderr), "exit_code": exit_code}),
        );
    }
    vars.last_output = Some(trimmed(&out.stdout));
    vars.commands.insert(
        step.id.0,
        crate::vars::CommandOutput {
            stdout: trimmed(&out.stdout),
            stderr: trimmed(&out.stderr),
            success: out.success(),
        },
    );
}

/// The CLI options of a Claude call from the plan's resolved settings.
fn claude_settings(settings: Option<&plan::ClaudeSettings>) -> crate::claude::Settings {
    let Some(s) = settings else {
        return crate::claude::Settings::default();
    };
    crate::claude::Settings {
        model: s.model.clone(),
        max_turns: s.max_turns,
        allowed_tools: s.allowed_tools.clone().unwrap_or_default(),
        disallowed_tools: s.disallowed_tools.clone().unwrap_or_default(),
        append_system_prompt: s.append_system_prompt.clone(),
        permission_mode: s.permission_mode.clone(),
        max_budget_usd: s.max_budget_usd,
        fallback_model: s.fallback_model.clone(),
        mcp_config: s.mcp_config.clone().unwrap_or_default(),
        add_dirs: s.add_dirs.clone().unwrap_or_default(),
    }
}

/// The fields of a JSON object (nothing for anything else).
pub(crate) fn fields(value: Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
}

/// Checks a validation result against `expected_schema`.
fn matches_schema(schema: &Value, result: &Value) -> Result<(), String> {
    let validator =
        jsonschema::validator_for(schema).map_err(|e| format!("the schema is invalid: {e}"))?;
    validator.validate(result).map_err(|e| e.to_string())
}
