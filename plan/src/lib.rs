//! The plan: the compiled, frozen form of a workflow that the compiler produces
//! (`prodigy_compiler::plan::plan`) and the runtime interprets. The runtime depends on this
//! crate and not on the compiler, so cargo keeps it from reading YAML, the AST or scopes.
//!
//! Every step of every context (phases, handlers, success and exit-code handlers, validation,
//! `foreach` bodies) gets a dense [`StepId`]; nested step lists become lists of ids, so the
//! runtime walks a flat table and never sees YAML or the AST's nesting.
//! Templates and expressions arrive pre-parsed, each step keeps its origin span and the line
//! it starts on, and each retry policy carries its concrete delay schedule.
//!
//! The plan speaks its own language: [`vocab`] holds the leaf types it shares with the AST
//! (templates, conditions, env values, formats, policies as written, ...), [`policy`] the
//! policies the planner resolves for the runtime's state machines (compiled matchers, clamped
//! breaker settings, error-policy defaults and schedules, handlers by id), [`span`] the byte
//! spans it keeps, [`export`] the environment names variables are exported under, and
//! [`file`] the bounded file read the compiler and the runtime share.

use std::time::Duration;

use crate::span::Span;
use crate::vocab::{ErrorPolicy, RetryConfig};

pub mod export;
pub mod file;
pub mod policy;
pub mod span;
pub mod vocab;

pub use policy::{
    BreakerConfig, Exhausted, HandlerId, HandlerPolicy, ItemFailure, JobPolicy, Matcher,
    OutputCapture, RetryPolicy, delay, policy_schedule, schedule,
};
pub use vocab::{
    Capture, CaptureFormat, CaptureSource, CaptureStreams, ClaudeBudget, ClaudeLimits,
    ClaudeSettings, CommitConfig, Condition, Container, DEFAULT_NOTIFY_TIMEOUT, EVENT_FIELDS,
    EnvValue, EnvVar, ErrorCollection, ForeachInput, Integrity, MaxParallel, Mode, Multiline,
    NotifyEvent, OnBudget, OnRetry, Parsed, Pattern, Profile, RetryExhausted, Secret, SecretSource,
    Slurm, StepOutput, StepValidate, Strategy, SuccessCriteria, Template, TimeoutAction,
    TimeoutConfig, TimeoutPolicy, UsageLimitMode, ValidationCheck, WriteFile, WriteFormat,
};

/// One `notify:` entry (docs/language.md §2, "Notifications").
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PlanNotify {
    /// The events it fires on.
    pub on: Vec<NotifyEvent>,
    /// Its command, a step of its own (its `timeout` always set).
    pub step: StepId,
}

/// What the runtime needs besides the plan itself, in one place.
pub mod support {
    pub use crate::export::{
        EXPORT_SEPARATOR, RESERVED_ENV, export_field, export_root, exported_name,
    };
    pub use crate::file::{LoadError, MAX_FILE_SIZE, read_regular};
    pub use crate::span::{Span, Spanned};
}

/// Parses the YAML text of a `write_file` with `format: yaml` (whose content is only known
/// at run time) into JSON, with the reader that reads workflows: the compiler gives the
/// plan its reader ([`Plan::yaml`]), so the runtime needs no YAML parser of its own.
#[derive(Clone, Copy)]
pub struct YamlReader(pub fn(&str) -> Result<Option<serde_json::Value>, String>);

impl YamlReader {
    /// The reader of a plan built by hand (tests): it refuses every text.
    pub const NONE: YamlReader = YamlReader(|_| Err("this plan has no YAML reader".to_owned()));

    /// TEXT (one document) as JSON; `None` when it holds no document (empty, or only
    /// comments).
    ///
    /// # Errors
    ///
    /// The first problem the reader found, as a message.
    pub fn read(self, text: &str) -> Result<Option<serde_json::Value>, String> {
        (self.0)(text)
    }
}

impl std::fmt::Debug for YamlReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("YamlReader")
    }
}

/// A dense index into [`Plan::steps`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct StepId(pub u32);

impl StepId {
    /// The index into [`Plan::steps`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The compiled workflow.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Plan {
    /// Format version of the serialised plan.
    pub version: u32,
    /// The workflow file as the user named it.
    pub source: String,
    /// `name`.
    pub name: Option<String>,
    /// `description`.
    pub description: Option<String>,
    /// `standard` or `mapreduce`.
    pub mode: Mode,
    /// Workflow `env`.
    pub env: Vec<EnvVar>,
    /// `secrets`.
    pub secrets: Vec<Secret>,
    /// `env_files`.
    pub env_files: Vec<Template>,
    /// `profiles`.
    pub profiles: Vec<Profile>,
    /// Every step, indexed by [`StepId`].
    pub steps: Vec<PlanStep>,
    /// A standard workflow's steps.
    pub commands: Vec<StepId>,
    /// MapReduce `setup`.
    pub setup: Option<PlanSetup>,
    /// MapReduce `map`.
    pub map: Option<PlanMap>,
    /// MapReduce `reduce`.
    pub reduce: Vec<StepId>,
    /// `merge`.
    pub merge: Option<PlanMerge>,
    /// Named handlers, indexed by [`HandlerId`].
    pub handlers: Vec<(String, Vec<StepId>)>,
    /// The error policy as written (MapReduce), for the graph checks.
    pub error_policy: Option<ErrorPolicy>,
    /// The error policy the map phase runs under: defaults filled, schedule computed, the
    /// circuit breaker clamped, a custom handler by id. Derived from `error_policy` and
    /// `handlers`, so not serialised.
    #[serde(skip)]
    pub job_policy: JobPolicy,
    /// The workflow's `claude:` defaults, for Claude calls that are not a step's own command
    /// (`step_validate` checks); each `claude` step has them merged into [`PlanStep::claude`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claude: Option<ClaudeSettings>,
    /// `claude: {max_cost_usd, on_budget}`: the cap on the run's or job's Claude spending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claude_budget: Option<ClaudeBudget>,
    /// What every Claude call of the run does at the account's usage limit (`claude:
    /// {usage_limit, max_wait}`).
    #[serde(default, skip_serializing_if = "ClaudeLimits::is_default")]
    pub claude_limits: ClaudeLimits,
    /// `slurm`: `sbatch` options for the map agents under `--executor slurm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<Slurm>,
    /// `worktree`: how each worktree prodigy makes is prepared.
    #[serde(default, skip_serializing_if = "PlanWorktree::is_empty")]
    pub worktree: PlanWorktree,
    /// `notify`: the notifications, each a step run when the run or job reaches one of
    /// its events.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notify: Vec<PlanNotify>,
    /// `executor.container`: the map agents' containers under `--executor container`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<Container>,
    /// Every variable the workflow reads, resolved to where its value comes from; steps
    /// refer to these slots in [`PlanStep::reads`].
    pub variables: Vec<Variable>,
    /// Whether a step can read `${map.results}` (or the whole `${map}`): only then does a
    /// job build that list of every item's record, which a job of many items cannot
    /// afford for nothing. Derived from `variables`' references, so not serialised.
    #[serde(skip)]
    pub reads_map_results: bool,
    /// How `write_file` reads YAML content at run time: the compiler's reader.
    #[serde(skip)]
    pub yaml: YamlReader,
}

/// A slot in [`Plan::variables`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct Slot(pub u32);

/// A variable the workflow reads, by the name its references start with.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Variable {
    /// The first name of the references (`item` for `${item.file}`).
    pub name: String,
    /// Where its value comes from.
    pub source: VarSource,
}

/// Where a variable's value comes from at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VarSource {
    /// Workflow or profile `env`.
    Env,
    /// `secrets` (masked).
    Secret,
    /// A step's `capture`, `capture_output` or handler `capture`.
    Capture,
    /// A step's `outputs` (`${ID.NAME}`).
    Outputs,
    /// Setup's `capture_outputs`.
    SetupOutput,
    /// The map item (`item`, `item_id`, ...).
    Item,
    /// `foreach` item variables.
    Foreach,
    /// The map phase's results (`map.*`).
    MapResults,
    /// The last command's result (`shell.*`, `claude.*`).
    LastCommand,
    /// The failure being handled (`error.*`, `attempt`).
    Failure,
    /// The last validation (`validation.*`).
    Validation,
    /// The merge being run (`merge.*`).
    Merge,
    /// Run metadata and git context (`workflow.*`, `step.*`, `git.*`).
    Context,
    /// The process environment (`env.*`, and upper-case names nothing defines).
    Process,
    /// A `--param`/`--args` value, or nothing (an error at run time).
    Param,
}

/// Where a step sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A step of a phase or of a named handler.
    Main,
    /// An `on_failure` handler command.
    Handler,
    /// An `on_success` step.
    OnSuccess,
    /// An `on_exit_code` step.
    OnExitCode,
    /// A `validate` command.
    Validation,
    /// An `on_incomplete` command.
    OnIncomplete,
    /// A step of a `foreach.do` body.
    Foreach,
}

/// One step.
#[derive(Clone, Debug, serde::Serialize)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "each flag is a documented step field"
)]
pub struct PlanStep {
    /// This step's id.
    pub id: StepId,
    /// Where it was written.
    pub origin: Span,
    /// The line (from 1) of the workflow file that its entry starts on, as events and
    /// `prodigy graph` name it with [`Plan::source`]; none for a step the compiler made (whose
    /// origin is empty at the start of the file).
    pub line: Option<u32>,
    /// Where it sits.
    pub role: Role,
    /// A short label for logs and graphs: the `name`, the `id`, or the command text.
    pub label: String,
    /// What it runs.
    pub command: PlanCommand,
    /// `id`.
    pub step_id: Option<String>,
    /// `description`.
    pub description: Option<String>,
    /// `timeout`.
    pub timeout: Option<Duration>,
    /// `working_dir`.
    pub working_dir: Option<Template>,
    /// Step `env`.
    pub env: Vec<EnvVar>,
    /// `clear_env`.
    pub clear_env: bool,
    /// `when`.
    pub when: Option<Condition>,
    /// Typed `capture`.
    pub capture: Option<Capture>,
    /// Legacy `capture_output` variable name.
    pub capture_output: Option<String>,
    /// `output_file`.
    pub output_file: Option<Template>,
    /// `on_success` steps.
    pub on_success: Vec<StepId>,
    /// `on_failure`.
    pub on_failure: Option<PlanOnFailure>,
    /// `on_exit_code`.
    pub on_exit_code: Vec<(i32, Vec<StepId>)>,
    /// `retry_config` as written, with the policy it resolves to (see
    /// [`PlanStep::retry_policy`]).
    pub retry: Option<PlanRetry>,
    /// What the step machine runs under: `on_failure` resolved (derived from `on_failure`,
    /// so not serialised).
    #[serde(skip)]
    pub handler_policy: HandlerPolicy,
    /// `commit_required`.
    pub commit_required: bool,
    /// `auto_commit`.
    pub auto_commit: bool,
    /// `commit_config`.
    pub commit_config: Option<CommitConfig>,
    /// `validate`.
    pub validate: Option<PlanValidate>,
    /// `step_validate`.
    pub step_validate: Option<StepValidate>,
    /// `outputs`.
    pub outputs: Vec<StepOutput>,
    /// `continue_on_error` of a handler command.
    pub continue_on_error: bool,
    /// The variables this step's own fields read (not its handlers'), as slots.
    pub reads: Vec<Slot>,
    /// A `claude` step's settings: its own over the workflow's `claude:` defaults, field by
    /// field; `None` when neither sets anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claude: Option<ClaudeSettings>,
}

/// What a step runs.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanCommand {
    /// `sh -c`.
    Shell(Template),
    /// The Claude Code CLI.
    Claude(Template),
    /// `write_file`.
    WriteFile(WriteFile),
    /// `foreach`.
    Foreach {
        /// The items.
        input: ForeachInput,
        /// Items at once.
        parallel: u32,
        /// The body.
        steps: Vec<StepId>,
        /// Keep going after a failed item.
        continue_on_error: bool,
        /// At most this many items.
        max_items: Option<u64>,
    },
}

/// `on_failure`, with its handler as step ids.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PlanOnFailure {
    /// The handler steps.
    pub handler: Vec<StepId>,
    /// Fail the workflow once attempts are exhausted.
    pub fail_workflow: bool,
    /// Runs of the command, counting the first.
    pub max_attempts: u32,
    /// `strategy`.
    pub strategy: Strategy,
    /// Where `strategy` was written, when it was (for the graph checks; not part of the
    /// plan the runtime reads).
    #[serde(skip)]
    pub strategy_span: Option<Span>,
    /// A failing handler fails the workflow.
    pub handler_failure_fatal: bool,
    /// Timeout for each handler command.
    pub timeout: Option<Duration>,
    /// Variables that store the handler's output.
    pub capture: Vec<String>,
    /// The handler must commit.
    pub commit_required: bool,
}

/// A command-level retry policy as written, and resolved for the step machine.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PlanRetry {
    /// The policy as written, defaults applied.
    pub config: RetryConfig,
    /// The policy resolved: its schedule (the delay before retry n, for n = 1..attempts-1,
    /// capped at `max_delay`, before jitter), compiled matchers and fallback command. The
    /// serialised plan shows its schedule, as `schedule`.
    #[serde(rename = "schedule", serialize_with = "schedule_of")]
    pub policy: RetryPolicy,
    /// The line (from 1) its `fallback` command is written on, when it has one.
    pub fallback_line: Option<u32>,
}

/// A resolved retry policy as its schedule.
fn schedule_of<S: serde::Serializer>(
    policy: &RetryPolicy,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&policy.delays, serializer)
}

/// The policy of a step without `retry_config`: one run, no retry.
static NO_RETRY: RetryPolicy = RetryPolicy::none();

/// `validate`, with its commands as step ids.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PlanValidate {
    /// The validation steps.
    pub commands: Vec<StepId>,
    /// Where the result is read from.
    pub result_file: Option<Template>,
    /// Completion required.
    pub threshold: f64,
    /// Timeout.
    pub timeout: Option<Duration>,
    /// A JSON Schema for the result.
    pub expected_schema: Option<serde_json::Value>,
    /// `on_incomplete`.
    pub on_incomplete: Option<PlanOnIncomplete>,
}

/// `on_incomplete`, with its commands as step ids.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PlanOnIncomplete {
    /// The completing steps.
    pub commands: Vec<StepId>,
    /// Validation rounds at most.
    pub max_attempts: u32,
    /// Fail when still incomplete.
    pub fail_workflow: bool,
    /// The handler must commit.
    pub commit_required: bool,
    /// A confirmation prompt.
    pub prompt: Option<Template>,
}

/// MapReduce `setup`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PlanSetup {
    /// The steps.
    pub steps: Vec<StepId>,
    /// Timeout for the phase.
    pub timeout: Option<Duration>,
    /// Variables made from the steps' outputs.
    pub capture_outputs: Vec<OutputCapture>,
}

/// MapReduce `map`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PlanMap {
    /// The input file or command.
    pub input: Template,
    /// `json_path`.
    pub json_path: Option<Parsed<prodigy_grammar::jsonpath::JsonPath>>,
    /// `filter`.
    pub filter: Option<Parsed<prodigy_grammar::expr::Expr>>,
    /// `sort_by`.
    pub sort_by: Option<Parsed<prodigy_grammar::sort::SortSpec>>,
    /// `distinct`.
    pub distinct: Option<Parsed<prodigy_grammar::path::Path>>,
    /// `offset`.
    pub offset: Option<u64>,
    /// `max_items`.
    pub max_items: Option<u64>,
    /// `max_parallel`.
    pub max_parallel: MaxParallel,
    /// The agent timeout (from `timeout_config` when it sets one).
    pub agent_timeout: Option<Duration>,
    /// `timeout_config`.
    pub timeout_config: Option<TimeoutConfig>,
    /// The agent's steps.
    pub steps: Vec<StepId>,
}

impl PlanMap {
    /// The input pipeline (everything after loading the input).
    pub fn pipeline(&self) -> prodigy_grammar::pipeline::Pipeline {
        prodigy_grammar::pipeline::Pipeline {
            json_path: self.json_path.as_ref().map(|p| p.parsed.clone()),
            filter: self.filter.as_ref().map(|p| p.parsed.clone()),
            sort_by: self.sort_by.as_ref().map(|p| p.parsed.clone()),
            distinct: self.distinct.as_ref().map(|p| p.parsed.clone()),
            offset: self.offset.and_then(|n| usize::try_from(n).ok()),
            max_items: self.max_items.and_then(|n| usize::try_from(n).ok()),
        }
    }
}

/// `worktree` (docs/language.md §11): paths relative to the repository's root.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PlanWorktree {
    /// Untracked files or globs of the user's checkout copied into each worktree.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub copy: Vec<String>,
    /// Directories of the user's checkout symlinked into each worktree.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub link: Vec<String>,
    /// Steps run once in each new worktree, before its first step or item.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub setup: Vec<StepId>,
    /// The cone of the map agents' sparse checkout (none: the whole tree).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sparse: Vec<String>,
    /// Ignored directories that cleaning a reused agent worktree keeps.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub keep: Vec<String>,
    /// Whether the map agents' idle worktrees are kept after the job, as spares for the next
    /// job in the repository, instead of being removed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub persist: bool,
}

impl PlanWorktree {
    /// Whether the workflow has no `worktree:` preparation (`persist` prepares nothing: it
    /// says what becomes of the agents' worktrees afterwards).
    pub fn is_empty(&self) -> bool {
        self.copy.is_empty()
            && self.link.is_empty()
            && self.setup.is_empty()
            && self.sparse.is_empty()
            && self.keep.is_empty()
    }
}

/// `merge`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PlanMerge {
    /// The steps (none: the default merge back).
    pub steps: Vec<StepId>,
    /// Timeout for the merge.
    pub timeout: Option<Duration>,
    /// Steps that resolve a conflicted merge (none: a conflict is not resolved).
    pub on_conflict: Vec<StepId>,
    /// Steps that test each candidate of the map agents' merge queue (none: no test).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub verify: Vec<StepId>,
    /// How many queued candidates are verified at once (at least 1).
    #[serde(skip_serializing_if = "is_one")]
    pub batch: u32,
    /// How many times a refused candidate goes back to its agent.
    #[serde(skip_serializing_if = "is_zero")]
    pub redispatch: u32,
    /// Globs of paths no map agent may change.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub protect: Vec<String>,
    /// `merge.integrity`, when the workflow sets it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub integrity: Option<Integrity>,
}

/// Whether N is 1 (`merge.batch`'s default, left out of the plan's JSON).
#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde passes a reference"
)]
fn is_one(n: &u32) -> bool {
    *n == 1
}

/// Whether N is 0 (`merge.redispatch`'s default, left out of the plan's JSON).
#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde passes a reference"
)]
fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl PlanMerge {
    /// Whether the map agents' merges go through the verified queue: `verify`, `protect`,
    /// `redispatch` or `integrity` (other than `off`) is set (`${verify.*}` is then defined
    /// in the agents' steps).
    pub fn queued(&self) -> bool {
        !self.verify.is_empty()
            || !self.protect.is_empty()
            || self.redispatch > 0
            || self.integrity.is_some_and(|i| i != Integrity::Off)
    }

    /// What the test-integrity verdict does: `warn` unless the workflow says otherwise.
    pub fn integrity(&self) -> Integrity {
        self.integrity.unwrap_or_default()
    }
}

/// What a step's `retry_config` can cost in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryCost {
    /// All the delays between attempts.
    pub delays: Duration,
    /// Every attempt running to the step's `timeout`, when it has one.
    pub runs: Option<Duration>,
}

impl RetryCost {
    /// Delays plus runs (delays alone without a timeout), saturating.
    pub fn worst(&self) -> Duration {
        self.delays.saturating_add(self.runs.unwrap_or_default())
    }
}

impl PlanStep {
    /// The steps this one can run: `on_success`, `on_exit_code`, handlers, validation and
    /// `on_incomplete` commands, and a `foreach` body.
    pub fn children(&self) -> impl Iterator<Item = StepId> + '_ {
        let validate = self.validate.iter().flat_map(|v| {
            v.commands
                .iter()
                .chain(v.on_incomplete.iter().flat_map(|o| &o.commands))
        });
        let body: &[StepId] = match &self.command {
            PlanCommand::Foreach { steps, .. } => steps,
            PlanCommand::Shell(_) | PlanCommand::Claude(_) | PlanCommand::WriteFile(_) => &[],
        };
        self.on_success
            .iter()
            .chain(self.on_exit_code.iter().flat_map(|(_, s)| s))
            .chain(self.on_failure.iter().flat_map(|f| &f.handler))
            .chain(validate)
            .chain(body)
            .copied()
    }

    /// What the step machine runs under: `retry_config` resolved, or a single run without
    /// one.
    pub fn retry_policy(&self) -> &RetryPolicy {
        self.retry.as_ref().map_or(&NO_RETRY, |r| &r.policy)
    }

    /// The time its retry policy can take, if it has one.
    pub fn retry_cost(&self) -> Option<RetryCost> {
        let retry = self.retry.as_ref()?;
        Some(RetryCost {
            delays: retry
                .policy
                .delays
                .iter()
                .fold(Duration::ZERO, |total, d| total.saturating_add(*d)),
            runs: self
                .timeout
                .map(|t| t.saturating_mul(retry.config.attempts)),
        })
    }
}

impl Plan {
    /// A standard workflow from SOURCE with nothing in it (for tests that build plans by hand).
    #[must_use]
    pub fn empty(source: &str) -> Plan {
        Plan {
            version: 1,
            source: source.to_owned(),
            name: None,
            description: None,
            mode: Mode::Standard,
            env: Vec::new(),
            secrets: Vec::new(),
            env_files: Vec::new(),
            profiles: Vec::new(),
            steps: Vec::new(),
            commands: Vec::new(),
            setup: None,
            map: None,
            reduce: Vec::new(),
            merge: None,
            handlers: Vec::new(),
            error_policy: None,
            job_policy: JobPolicy::default(),
            claude: None,
            claude_budget: None,
            claude_limits: ClaudeLimits::default(),
            slurm: None,
            worktree: PlanWorktree::default(),
            notify: Vec::new(),
            container: None,
            variables: Vec::new(),
            reads_map_results: false,
            yaml: YamlReader::NONE,
        }
    }

    /// The step with an id.
    pub fn step(&self, id: StepId) -> Option<&PlanStep> {
        self.steps.get(id.index())
    }

    /// A named handler: its name and steps.
    pub fn handler(&self, id: HandlerId) -> Option<(&str, &[StepId])> {
        self.handlers
            .get(id.index())
            .map(|(name, steps)| (name.as_str(), steps.as_slice()))
    }
}
