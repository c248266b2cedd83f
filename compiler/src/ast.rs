//! The typed AST of a workflow file.
//!
//! Lowering ([`crate::lower`]) fills these types from the spanned YAML tree, applying aliases,
//! legacy forms and defaults, so that later stages see one normalised shape per concept.
//! Every node keeps the span of its YAML origin.
//! Every string in one of the small languages arrives parsed ([`Parsed`]): templates,
//! `when` conditions, filters, sort specifications and JSON paths.
//! The leaf types that the plan hands on to the runtime (templates, conditions, env values,
//! capture and write formats, ...) are defined in [`crate::plan::vocab`] and re-exported here.

use std::time::Duration;

use crate::source::{Span, Spanned};

// The leaf types the runtime also reads live in the plan's vocabulary; lowering and the
// checks name them here as before.
pub use crate::plan::vocab::{
    Capture, CaptureFormat, CaptureSource, CaptureStreams, ClaudeBudget, ClaudeLimits,
    ClaudeSettings, CommitConfig, Condition, Container, EnvValue, EnvVar, ErrorCollection,
    ForeachInput, MaxParallel, Mode, Multiline, NotifyEvent, OnBudget, OnRetry, PERMISSION_MODES,
    Parsed, Pattern, Profile, Rebaser, RetryExhausted, Secret, SecretSource, Slurm, StepOutput,
    StepValidate, Strategy, SuccessCriteria, Template, TimeoutAction, TimeoutConfig, TimeoutPolicy,
    UsageLimitMode, ValidationCheck, WriteFile, WriteFormat,
};
// So do the policies as written that the plan keeps beside their resolved forms.
pub use crate::plan::vocab::{
    Backoff, CircuitBreaker, ErrorPolicy, ItemFailure, Matcher, PolicyRetry, RetryConfig,
    SetupCapture,
};

/// A whole workflow file.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Workflow {
    /// `name`, if given.
    pub name: Option<Spanned<String>>,
    /// `description`: documentation shown by `graph` and in logs.
    pub description: Option<Spanned<String>>,
    /// `standard` or `mapreduce`.
    pub mode: Mode,
    /// The steps of a standard workflow (`commands`, alias `steps`, or a bare list).
    pub commands: Vec<Step>,
    /// Workflow `env`.
    pub env: Vec<EnvVar>,
    /// `secrets`.
    pub secrets: Vec<Secret>,
    /// `env_files`.
    pub env_files: Vec<Template>,
    /// `profiles`.
    pub profiles: Vec<Profile>,
    /// Named step lists under `handlers`.
    pub handlers: Vec<NamedSteps>,
    /// The error policy, with the top-level convenience keys folded in.
    pub error_policy: Option<ErrorPolicy>,
    /// `MapReduce` `setup`.
    pub setup: Option<Setup>,
    /// `MapReduce` `map`.
    pub map: Option<MapPhase>,
    /// `MapReduce` `reduce`.
    pub reduce: Option<Vec<Step>>,
    /// `merge`.
    pub merge: Option<Merge>,
    /// `claude`: the defaults of every Claude call.
    pub claude: Option<ClaudeSettings>,
    /// `claude: {max_cost_usd, on_budget}`: the cap on the whole run's Claude spending.
    pub claude_budget: Option<ClaudeBudget>,
    /// `claude: {usage_limit, max_wait}`: what the run does at the usage limit.
    pub claude_limits: ClaudeLimits,
    /// `slurm` or `executor.slurm`: how `--executor slurm` submits the map agents.
    pub slurm: Option<Slurm>,
    /// `worktree`: how each worktree prodigy makes is prepared.
    pub worktree: Option<WorktreePrep>,
    /// `notify`: commands run when the run or job reaches an event.
    pub notify: Vec<Notify>,
    /// `executor.container`: the map agents' containers under `--executor container`.
    pub container: Option<Container>,
    /// The whole document.
    pub span: Span,
}

/// `worktree`: files copied and directories linked into each worktree, its `setup` steps,
/// the agents' sparse checkout and what cleaning between items keeps (docs/language.md §11).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct WorktreePrep {
    /// `copy`: untracked files or globs of the user's checkout, relative to the repository.
    pub copy: Vec<Spanned<String>>,
    /// `link`: directories of the user's checkout symlinked into each worktree.
    pub link: Vec<Spanned<String>>,
    /// `setup`: steps run once per worktree.
    pub setup: Vec<Step>,
    /// `sparse`: the cone of the agents' sparse checkout.
    pub sparse: Vec<Spanned<String>>,
    /// `keep`: ignored directories the clean between items keeps.
    pub keep: Vec<Spanned<String>>,
    /// `persist`: the agents' worktrees are kept for the next job.
    pub persist: bool,
    /// The `worktree:` key.
    pub span: Span,
}

/// Whether TEXT is a time limit `sbatch --time` takes: `MIN`, `MIN:SEC`, `H:MIN:SEC`,
/// `D-H`, `D-H:MIN`, `D-H:MIN:SEC`, or `UNLIMITED`/`INFINITE`.
pub fn is_slurm_time(text: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.len() <= 9 && s.bytes().all(|b| b.is_ascii_digit());
    if matches!(text, "UNLIMITED" | "INFINITE" | "unlimited" | "infinite") {
        return true;
    }
    let (days, rest) = match text.split_once('-') {
        Some((d, rest)) => (Some(d), rest),
        None => (None, text),
    };
    if days.is_some_and(|d| !digits(d)) {
        return false;
    }
    let parts: Vec<&str> = rest.split(':').collect();
    parts.iter().all(|p| digits(p)) && (1..=3).contains(&parts.len())
}

/// Whether TEXT is a memory size `sbatch --mem` takes: a whole number with an optional
/// unit `K`, `M`, `G` or `T` (megabytes without one).
pub fn is_slurm_mem(text: &str) -> bool {
    let number = text.trim_end_matches(['K', 'M', 'G', 'T', 'k', 'm', 'g', 't']);
    text.len() - number.len() <= 1
        && !number.is_empty()
        && number.bytes().all(|b| b.is_ascii_digit())
}

/// One `notify:` entry: the events it fires on and its command, as a step with its
/// `timeout` (docs/language.md §2, "Notifications").
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Notify {
    /// `on`.
    pub on: Vec<Spanned<NotifyEvent>>,
    /// Its `shell` or `claude` command, with its `timeout`.
    pub step: Step,
}

/// A named list of steps (`handlers`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct NamedSteps {
    /// The handler name.
    pub name: Spanned<String>,
    /// Its steps.
    pub steps: Vec<Step>,
}

/// One step, in any context.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "each flag is a documented step field"
)]
pub struct Step {
    /// The whole step.
    pub span: Span,
    /// What it runs.
    pub command: Command,
    /// `id`.
    pub id: Option<Spanned<String>>,
    /// `name` as a display name.
    pub name: Option<Spanned<String>>,
    /// `description`.
    pub description: Option<Spanned<String>>,
    /// `timeout`.
    pub timeout: Option<Spanned<Duration>>,
    /// `working_dir`.
    pub working_dir: Option<Template>,
    /// Step `env`.
    pub env: Vec<EnvVar>,
    /// `clear_env`: start from an empty environment plus the step's `env` and `PATH`.
    pub clear_env: bool,
    /// `when`.
    pub when: Option<Condition>,
    /// Typed `capture`.
    pub capture: Option<Capture>,
    /// Legacy `capture_output`: the variable name it stores stdout under.
    pub capture_output: Option<Spanned<String>>,
    /// `output_file`.
    pub output_file: Option<Template>,
    /// `on_success` steps.
    pub on_success: Vec<Step>,
    /// `on_failure`.
    pub on_failure: Option<OnFailure>,
    /// `on_exit_code`.
    pub on_exit_code: Vec<ExitCodeHandler>,
    /// `retry_config` (alias `retry`).
    pub retry: Option<RetryConfig>,
    /// `commit_required`.
    pub commit_required: bool,
    /// `auto_commit`.
    pub auto_commit: bool,
    /// `commit_config`.
    pub commit_config: Option<CommitConfig>,
    /// `validate`.
    pub validate: Option<Validate>,
    /// `step_validate`.
    pub step_validate: Option<StepValidate>,
    /// `outputs`: after the step, `${ID.NAME}` lists the files its commits touched matching each glob.
    pub outputs: Vec<StepOutput>,
    /// `continue_on_error` of a handler command.
    pub continue_on_error: bool,
    /// A `claude` step's own settings (`claude: {prompt, model, ...}`).
    pub claude: Option<ClaudeSettings>,
}

/// What a step runs.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub enum Command {
    /// `shell`: `sh -c TEXT`.
    Shell(Template),
    /// `claude`: the Claude Code CLI with TEXT.
    Claude(Template),
    /// `write_file`.
    WriteFile(WriteFile),
    /// `foreach`.
    Foreach(Box<Foreach>),
    /// A step whose command could not be lowered (a diagnostic says why).
    Invalid,
}

/// `foreach`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Foreach {
    /// Where the items come from.
    pub input: ForeachInput,
    /// How many items run at once (1 = sequential).
    pub parallel: u32,
    /// The steps run for each item.
    pub steps: Vec<Step>,
    /// Keep going when an item fails.
    pub continue_on_error: bool,
    /// At most this many items.
    pub max_items: Option<u64>,
}

/// One `on_exit_code` entry.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ExitCodeHandler {
    /// The exit code.
    pub code: Spanned<i32>,
    /// The steps run for it.
    pub steps: Vec<Step>,
}

/// Which of the six `on_failure` forms was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFailureForm {
    /// `true` / `false`.
    Bool,
    /// A single command string.
    Single,
    /// A list of commands.
    List,
    /// `{shell?, claude?, ...}`.
    Advanced,
    /// `{commands: [...], ...}`.
    Detailed,
}

/// `on_failure` at command level, normalised.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct OnFailure {
    /// The whole `on_failure` value.
    pub span: Span,
    /// The form written.
    pub form: OnFailureForm,
    /// The handler steps, in order (empty for the boolean forms).
    pub handler: Vec<Step>,
    /// Fail the workflow once attempts are exhausted.
    pub fail_workflow: bool,
    /// Runs of the command, counting the first.
    pub max_attempts: u32,
    /// `strategy`.
    pub strategy: Strategy,
    /// Where `strategy` was written, when it was.
    pub strategy_span: Option<Span>,
    /// A failing handler fails the workflow.
    pub handler_failure_fatal: bool,
    /// Timeout for each handler command.
    pub timeout: Option<Spanned<Duration>>,
    /// Variable names that store the handler's combined output.
    pub capture: Vec<Spanned<String>>,
    /// The handler must create a commit.
    pub commit_required: bool,
}

/// `validate`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Validate {
    /// The whole value.
    pub span: Span,
    /// The validation steps.
    pub commands: Vec<Step>,
    /// Where the result JSON is read from (else stdout).
    pub result_file: Option<Template>,
    /// Completion percentage required.
    pub threshold: f64,
    /// Timeout for the validation.
    pub timeout: Option<Spanned<Duration>>,
    /// A JSON Schema the result must satisfy.
    pub expected_schema: Option<serde_json::Value>,
    /// What to do while incomplete.
    pub on_incomplete: Option<OnIncomplete>,
}

/// `validate.on_incomplete`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct OnIncomplete {
    /// The steps that complete the work.
    pub commands: Vec<Step>,
    /// Validation rounds at most.
    pub max_attempts: u32,
    /// Fail the workflow when still incomplete.
    pub fail_workflow: bool,
    /// The handler must create a commit.
    pub commit_required: bool,
    /// A confirmation prompt.
    pub prompt: Option<Template>,
}

/// `MapReduce` `setup`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Setup {
    /// The steps.
    pub commands: Vec<Step>,
    /// Timeout for the whole phase.
    pub timeout: Option<Spanned<Duration>>,
    /// Variables made from the steps' outputs.
    pub capture_outputs: Vec<SetupCapture>,
}

/// `MapReduce` `map`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MapPhase {
    /// The whole `map` value.
    pub span: Span,
    /// A JSON file or a command.
    pub input: Template,
    /// `json_path`.
    pub json_path: Option<Parsed<prodigy_grammar::jsonpath::JsonPath>>,
    /// `filter`.
    pub filter: Option<Parsed<prodigy_grammar::expr::Expr>>,
    /// `sort_by`.
    pub sort_by: Option<Parsed<prodigy_grammar::sort::SortSpec>>,
    /// `max_items`.
    pub max_items: Option<Spanned<u64>>,
    /// `offset`.
    pub offset: Option<Spanned<u64>>,
    /// `distinct`: a path into each item.
    pub distinct: Option<Parsed<prodigy_grammar::path::Path>>,
    /// `max_parallel`.
    pub max_parallel: MaxParallel,
    /// The agent timeout.
    pub agent_timeout: Option<Spanned<Duration>>,
    /// `timeout_config`.
    pub timeout_config: Option<TimeoutConfig>,
    /// The steps each agent runs.
    pub agent_template: Vec<Step>,
}

/// `merge`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Merge {
    /// The steps.
    pub commands: Vec<Step>,
    /// Timeout for the whole merge.
    pub timeout: Option<Spanned<Duration>>,
    /// Steps that resolve a merge that conflicts (an agent's work into the session, or the
    /// session back without `commands`), run in a worktree holding the conflicted merge.
    pub on_conflict: Vec<Step>,
    /// `verify`: steps run on each candidate of the map agents' merge queue, in a scratch
    /// worktree holding it; the integration ref moves only to a candidate that passed.
    pub verify: Vec<Step>,
    /// `batch`: how many queued candidates are verified at once (default 1).
    pub batch: Option<Spanned<u32>>,
    /// `redispatch`: how many times a refused candidate goes back to its agent (default 0).
    pub redispatch: Option<Spanned<u32>>,
    /// `protect`: globs of paths no agent may change.
    pub protect: Vec<Spanned<String>>,
    /// `integrity`: what the test-integrity verdict does (`off`, `warn`, `fail`).
    pub integrity: Option<Spanned<prodigy_plan::Integrity>>,
}
