//! The typed AST of a workflow file.
//!
//! Lowering ([`crate::lower`]) fills these types from the spanned YAML tree, applying aliases,
//! legacy forms and defaults, so that later stages see one normalised shape per concept.
//! Every node keeps the span of its YAML origin.
//! Every string in one of the small languages arrives parsed ([`Parsed`]): templates,
//! `when` conditions, filters, sort specifications and JSON paths.

use std::time::Duration;

use crate::source::{Span, Spanned};

/// A string parsed by one of the expression grammars, with its text and YAML span.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Parsed<T> {
    /// The text as the YAML scalar holds it.
    pub value: String,
    /// Where the scalar is in the file.
    pub span: Span,
    /// The parsed form.
    pub parsed: T,
    /// Whether `value` lies in the file as written (plain, single-quoted and literal block
    /// scalars), so that a range inside it maps onto exact file positions; otherwise
    /// diagnostics inside the string label the whole scalar.
    #[serde(skip)]
    pub exact: bool,
}

impl<T> Parsed<T> {
    /// The file span of a byte range inside the string; `source` is the whole file.
    pub fn rebase(&self, source: &str, local: prodigy_grammar::Span) -> Span {
        self.rebaser(source).span(local)
    }

    /// Maps many ranges inside the string onto the file, in one pass over it when they come
    /// in order (the references of a template do): a string with thousands of references
    /// costs linear time, not a scan from its start for each.
    pub fn rebaser<'a>(&'a self, source: &'a str) -> Rebaser<'a> {
        let scalar = source
            .get(self.span.start as usize..self.span.end as usize)
            .unwrap_or("");
        Rebaser {
            value: &self.value,
            scalar,
            whole: self.span,
            exact: self.exact,
            i: 0,
            j: 0,
        }
    }
}

/// Maps byte offsets of a scalar's value onto the file (see [`Parsed::rebaser`]).
pub struct Rebaser<'a> {
    value: &'a str,
    scalar: &'a str,
    whole: Span,
    exact: bool,
    /// How far into `value` the alignment has got...
    i: usize,
    /// ...and the matching offset in `scalar`.
    j: usize,
}

impl Rebaser<'_> {
    /// The file span of a byte range inside the string, or the whole scalar when the string
    /// does not lie in the file as written.
    pub fn span(&mut self, local: prodigy_grammar::Span) -> Span {
        if !self.exact {
            return self.whole;
        }
        match (self.align(local.start), self.align(local.end)) {
            (Some(start), Some(end)) => Span::new(
                self.whole.start as usize + start,
                self.whole.start as usize + end.max(start),
            ),
            _ => self.whole,
        }
    }

    /// The offset in the scalar of byte `at` of the value, where the value is the scalar
    /// with quotes, indentation and line folding removed: characters are matched in order,
    /// skipping what the YAML scanner dropped. Goes on from the last offset asked for, or
    /// starts again when `at` lies before it.
    fn align(&mut self, at: usize) -> Option<usize> {
        if at < self.i {
            (self.i, self.j) = (0, 0);
        }
        while self.i < at {
            let Some(c) = self.value.get(self.i..).and_then(|v| v.chars().next()) else {
                // Past the end of the value: the end of what was matched.
                return Some(self.j);
            };
            let Some(j) = advance(self.scalar, self.j, c) else {
                (self.i, self.j) = (0, 0);
                return None;
            };
            self.i += c.len_utf8();
            self.j = j;
        }
        Some(self.j)
    }
}

/// The offset just past `c` in `source`, looking from `j` and skipping what the YAML scanner
/// dropped before it.
fn advance(source: &str, mut j: usize, c: char) -> Option<usize> {
    loop {
        let rest = source.get(j..)?;
        if rest.starts_with(c) {
            return Some(j + c.len_utf8());
        }
        // A folded line break reads as a space.
        if c == ' ' && rest.starts_with('\n') {
            return Some(j + rest.len() - rest.trim_start().len());
        }
        j += rest.chars().next()?.len_utf8();
    }
}

/// A `${...}` template: command text, paths, env values, messages.
pub type Template = Parsed<prodigy_grammar::template::Template>;

/// A `when:` or env condition, in the filter language.
pub type Condition = Parsed<prodigy_grammar::expr::Expr>;

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
    /// `slurm`: how `--executor slurm` submits the map agents.
    pub slurm: Option<Slurm>,
    /// The whole document.
    pub span: Span,
}

/// How a Claude call runs, as the CLI's options: a step's `claude: {prompt, ...}` or the
/// workflow's `claude:` defaults. A field left out is the CLI's default, or the workflow's
/// for a step.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ClaudeSettings {
    /// `model` (`--model`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `max_turns` (`--max-turns`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// `allowed_tools` (`--allowedTools`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<Vec<String>>,
    /// `disallowed_tools` (`--disallowedTools`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disallowed_tools: Option<Vec<String>>,
    /// `append_system_prompt` (`--append-system-prompt`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub append_system_prompt: Option<String>,
    /// `permission_mode` (`--permission-mode`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<String>,
    /// `max_budget_usd` (`--max-budget-usd`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_budget_usd: Option<f64>,
    /// `fallback_model` (`--fallback-model`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_model: Option<String>,
    /// `mcp_config` (`--mcp-config`, once per entry).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp_config: Option<Vec<String>>,
    /// `add_dirs` (`--add-dir`, once per entry).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub add_dirs: Option<Vec<String>>,
}

impl ClaudeSettings {
    /// These settings over DEFAULTS, field by field: a field given here wins, a list
    /// included (an empty list clears the default's).
    #[must_use]
    pub fn over(&self, defaults: &ClaudeSettings) -> ClaudeSettings {
        ClaudeSettings {
            model: self.model.clone().or_else(|| defaults.model.clone()),
            max_turns: self.max_turns.or(defaults.max_turns),
            allowed_tools: self
                .allowed_tools
                .clone()
                .or_else(|| defaults.allowed_tools.clone()),
            disallowed_tools: self
                .disallowed_tools
                .clone()
                .or_else(|| defaults.disallowed_tools.clone()),
            append_system_prompt: self
                .append_system_prompt
                .clone()
                .or_else(|| defaults.append_system_prompt.clone()),
            permission_mode: self
                .permission_mode
                .clone()
                .or_else(|| defaults.permission_mode.clone()),
            max_budget_usd: self.max_budget_usd.or(defaults.max_budget_usd),
            fallback_model: self
                .fallback_model
                .clone()
                .or_else(|| defaults.fallback_model.clone()),
            mcp_config: self
                .mcp_config
                .clone()
                .or_else(|| defaults.mcp_config.clone()),
            add_dirs: self.add_dirs.clone().or_else(|| defaults.add_dirs.clone()),
        }
    }

    /// Whether no field is set.
    pub fn is_empty(&self) -> bool {
        *self == ClaudeSettings::default()
    }
}

/// The permission modes of the Claude Code CLI (`--permission-mode`).
pub const PERMISSION_MODES: &[&str] = &[
    "acceptEdits",
    "auto",
    "bypassPermissions",
    "default",
    "dontAsk",
    "plan",
];
/// Top-level `slurm`: `sbatch` options for the map agents when they run on Slurm.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Slurm {
    /// `--partition`.
    pub partition: Option<Spanned<String>>,
    /// `--account`.
    pub account: Option<Spanned<String>>,
    /// `--time`, in Slurm's own format (`30`, `1:30:00`, `2-00:00:00`).
    pub time: Option<Spanned<String>>,
    /// `--cpus-per-task`.
    pub cpus_per_task: Option<Spanned<u64>>,
    /// `--mem` (`4096`, `4G`).
    pub mem: Option<Spanned<String>>,
    /// More `sbatch` options, as they are.
    pub sbatch_args: Vec<Spanned<String>>,
}

impl Slurm {
    /// The `sbatch` options this asks for, in a fixed order, `sbatch_args` last.
    pub fn sbatch_options(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut add = |flag: &str, value: Option<String>| {
            if let Some(v) = value {
                out.push(format!("--{flag}={v}"));
            }
        };
        add(
            "partition",
            self.partition.as_ref().map(|v| v.value.clone()),
        );
        add("account", self.account.as_ref().map(|v| v.value.clone()));
        add("time", self.time.as_ref().map(|v| v.value.clone()));
        add(
            "cpus-per-task",
            self.cpus_per_task.as_ref().map(|v| v.value.to_string()),
        );
        add("mem", self.mem.as_ref().map(|v| v.value.clone()));
        out.extend(self.sbatch_args.iter().map(|a| a.value.clone()));
        out
    }
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

/// The two kinds of workflow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Steps run one after another.
    #[default]
    Standard,
    /// Setup, a parallel map over items, then reduce.
    MapReduce,
}

/// One workflow `env` entry.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct EnvVar {
    /// The variable name.
    pub name: Spanned<String>,
    /// Its value.
    pub value: EnvValue,
}

/// The forms of an `env` value.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub enum EnvValue {
    /// A string, number or boolean rendered as text.
    Static(Template),
    /// `{secret: true, value: ...}`: masked wherever prodigy prints it.
    Masked(Template),
    /// `{command: CMD, cache: bool}`: the command's trimmed stdout.
    Dynamic {
        /// The shell command.
        command: Template,
        /// Whether to run it once per run.
        cache: bool,
    },
    /// `{condition, when_true, when_false}`.
    Conditional {
        /// A `when`-language expression.
        condition: Condition,
        /// Value when true.
        when_true: Template,
        /// Value when false.
        when_false: Template,
    },
}

/// One `secrets` entry.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Secret {
    /// The variable name.
    pub name: Spanned<String>,
    /// Where its value comes from.
    pub source: SecretSource,
}

/// Where a secret's value comes from.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub enum SecretSource {
    /// A process environment variable.
    Env(Spanned<String>),
    /// A file whose trimmed content is the value.
    File(Spanned<String>),
}

/// A named env overlay chosen with `--profile`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Profile {
    /// The profile name.
    pub name: Spanned<String>,
    /// Its `description`.
    pub description: Option<Spanned<String>>,
    /// The variables it sets.
    pub env: Vec<EnvVar>,
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

/// `write_file`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct WriteFile {
    /// Destination, relative to the working directory.
    pub path: Template,
    /// Content.
    pub content: Template,
    /// `text`, `json` or `yaml`.
    pub format: WriteFormat,
    /// Permission bits; without them a new file gets the umask's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// Create missing parent directories.
    pub create_dirs: bool,
}

/// `write_file.format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WriteFormat {
    /// Written as is.
    Text,
    /// Validated and pretty-printed JSON.
    Json,
    /// Validated YAML.
    Yaml,
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

/// The items of a `foreach`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub enum ForeachInput {
    /// A command whose non-blank stdout lines are the items.
    Command(Template),
    /// A literal list.
    List(Vec<Template>),
}

/// Typed `capture`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Capture {
    /// The variable name.
    pub name: Spanned<String>,
    /// `capture_format`.
    pub format: CaptureFormat,
    /// `capture_streams`.
    pub streams: CaptureStreams,
}

/// `capture_format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CaptureFormat {
    /// Text, trimmed of one trailing newline.
    String,
    /// A number.
    Number,
    /// A JSON document.
    Json,
    /// A list of lines.
    Lines,
    /// `true` or `false`.
    Boolean,
}

/// Which streams and facts a capture records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "one flag per documented stream option"
)]
pub struct CaptureStreams {
    /// Stdout in the value.
    pub stdout: bool,
    /// Stderr in the value (`NAME.stderr` is always set).
    pub stderr: bool,
    /// `NAME.exit_code`.
    pub exit_code: bool,
    /// `NAME.success`.
    pub success: bool,
    /// `NAME.duration`.
    pub duration: bool,
}

impl Default for CaptureStreams {
    fn default() -> Self {
        Self {
            stdout: true,
            stderr: false,
            exit_code: true,
            success: true,
            duration: true,
        }
    }
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

/// `on_failure.strategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Fix the problem; the step stays failed unless a later run of the command succeeds.
    Recovery,
    /// Do something else instead; success marks the step recovered, the handler's output
    /// standing in for the command's.
    Fallback,
    /// Clean up; the step stays failed.
    Cleanup,
    /// User-defined; the step stays failed.
    Custom,
}

/// Command-level `retry_config`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RetryConfig {
    /// The whole `retry_config` value.
    pub span: Span,
    /// Total runs of the command.
    pub attempts: u32,
    /// How delays grow.
    pub backoff: Backoff,
    /// First delay.
    pub initial_delay: Duration,
    /// Cap on every delay.
    pub max_delay: Duration,
    /// Whether delays are randomised.
    pub jitter: bool,
    /// How much jitter spreads a delay (0..=1).
    pub jitter_factor: f64,
    /// Which failures are retried (empty: all).
    pub retry_on: Vec<Matcher>,
    /// Total time across attempts and delays.
    pub retry_budget: Option<Duration>,
    /// What happens after the last attempt.
    pub on_failure: RetryExhausted,
}

/// A backoff strategy, shared by command-level retry and the error policy.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "lowercase", tag = "type")]
pub enum Backoff {
    /// The same delay every time.
    Fixed {
        /// The delay (default: the retry's initial delay).
        delay: Option<Duration>,
    },
    /// `initial + (n-1)·increment`.
    Linear {
        /// First delay override.
        initial: Option<Duration>,
        /// Added per retry (default: the initial delay).
        increment: Option<Duration>,
    },
    /// `initial · base^(n-1)`.
    Exponential {
        /// First delay override.
        initial: Option<Duration>,
        /// The growth factor (default 2).
        base: f64,
    },
    /// `initial · fib(n)`.
    Fibonacci {
        /// First delay override.
        initial: Option<Duration>,
    },
    /// An explicit list of delays.
    Custom {
        /// Delay before retry n is `delays[n-1]`.
        delays: Vec<Duration>,
    },
}

/// A `retry_on` matcher.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Matcher {
    /// Connection problems.
    Network,
    /// Timeouts.
    Timeout,
    /// HTTP 5xx.
    ServerError,
    /// HTTP 429.
    RateLimit,
    /// A Claude call that met an overloaded API (529).
    Overloaded,
    /// A Claude call whose credentials were refused (401, 403, not logged in).
    Auth,
    /// A regular expression over stderr and stdout.
    Pattern(Spanned<String>),
}

/// `retry_config.on_failure`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryExhausted {
    /// The step fails.
    Stop,
    /// The step is recorded failed and the workflow goes on.
    Continue,
    /// Run this command; its result is the step's.
    Fallback(Template),
}

/// `commit_config`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct CommitConfig {
    /// `message_template`.
    pub message_template: Option<Template>,
    /// `message_pattern`: a regex the message must match.
    pub message_pattern: Option<Spanned<String>>,
    /// `sign`.
    pub sign: bool,
    /// `author`.
    pub author: Option<Template>,
    /// `include_files` globs.
    pub include_files: Vec<Spanned<String>>,
    /// `exclude_files` globs.
    pub exclude_files: Vec<Spanned<String>>,
    /// `squash`.
    pub squash: bool,
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

/// `step_validate`: checks run after the step.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StepValidate {
    /// The whole value.
    pub span: Span,
    /// The checks.
    pub checks: Vec<ValidationCheck>,
    /// How many checks must pass.
    pub success_criteria: SuccessCriteria,
    /// Rounds of checks.
    pub max_attempts: u32,
    /// Delay between rounds.
    pub retry_delay: Duration,
    /// `skip_validation` on the step.
    pub skip: bool,
    /// `validation_timeout` on the step.
    pub timeout: Option<Spanned<Duration>>,
    /// `ignore_validation_failure` on the step.
    pub ignore_failure: bool,
}

/// One `step_validate` check.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ValidationCheck {
    /// The command.
    pub command: Template,
    /// Run with claude rather than the shell.
    pub claude: bool,
    /// A regex stdout must match.
    pub expect_output: Option<Spanned<String>>,
    /// The required exit code.
    pub expect_exit_code: i32,
}

/// `step_validate.success_criteria`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SuccessCriteria {
    /// Every check.
    All,
    /// One check.
    Any,
    /// At least this many.
    AtLeast(u32),
}

/// `outputs` entry.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StepOutput {
    /// Output name.
    pub name: Spanned<String>,
    /// `file_pattern` glob.
    pub file_pattern: Spanned<String>,
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

/// One `setup.capture_outputs` entry.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SetupCapture {
    /// The variable name.
    pub name: Spanned<String>,
    /// Which setup step (0-based).
    pub command_index: Spanned<u64>,
    /// `format`.
    pub format: CaptureFormat,
    /// `source`.
    pub source: CaptureSource,
    /// `pattern`: a regex whose first group (or whole match) is the value.
    pub pattern: Option<Spanned<String>>,
    /// `json_path` into the output.
    pub json_path: Option<Spanned<String>>,
    /// `max_size` in bytes.
    pub max_size: u64,
    /// `default` when pattern or path fail.
    pub default: Option<Spanned<String>>,
    /// `multiline`.
    pub multiline: Multiline,
}

/// `capture_outputs.*.source`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CaptureSource {
    /// Stdout.
    Stdout,
    /// Stderr.
    Stderr,
    /// Both, labelled.
    Both,
    /// Both, concatenated.
    Combined,
}

/// `capture_outputs.*.multiline`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Multiline {
    /// Keep as is.
    Preserve,
    /// Join lines with spaces.
    Join,
    /// First line only.
    FirstLine,
    /// Last line only.
    LastLine,
    /// A JSON array of lines.
    Array,
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

/// `map.max_parallel`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MaxParallel {
    /// A number.
    Fixed(Spanned<u64>),
    /// A `${VAR}` resolved at run time.
    Variable(Template),
}

/// `map.timeout_config`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TimeoutConfig {
    /// `agent_timeout_secs`.
    pub agent_timeout: Option<Spanned<Duration>>,
    /// `command_timeouts`: step name or index to timeout.
    pub command_timeouts: Vec<(Spanned<String>, Duration)>,
    /// `timeout_policy`.
    pub policy: TimeoutPolicy,
    /// `cleanup_grace_period_secs`.
    pub cleanup_grace_period: Duration,
    /// `timeout_action`.
    pub action: TimeoutAction,
    /// `enable_monitoring`.
    pub enable_monitoring: bool,
}

/// `timeout_config.timeout_policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum TimeoutPolicy {
    /// One timeout for the whole agent.
    PerAgent,
    /// A timeout per command.
    PerCommand,
    /// Both.
    Hybrid,
}

/// `timeout_config.timeout_action`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum TimeoutAction {
    /// Send the item to the DLQ.
    Dlq,
    /// Skip the item.
    Skip,
    /// Fail the job.
    Fail,
    /// Terminate gracefully, then DLQ.
    GracefulTerminate,
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
}

/// Workflow-level `error_policy`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ErrorPolicy {
    /// Where it was written (the `error_policy` value, or the first convenience key).
    pub span: Span,
    /// `on_item_failure`.
    pub on_item_failure: Option<Spanned<ItemFailure>>,
    /// `continue_on_failure`.
    pub continue_on_failure: Option<Spanned<bool>>,
    /// `max_failures`.
    pub max_failures: Option<Spanned<u64>>,
    /// `failure_threshold`.
    pub failure_threshold: Option<Spanned<f64>>,
    /// `error_collection`.
    pub error_collection: Option<Spanned<ErrorCollection>>,
    /// `circuit_breaker`.
    pub circuit_breaker: Option<CircuitBreaker>,
    /// `retry_config`.
    pub retry_config: Option<PolicyRetry>,
}

/// `on_item_failure`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemFailure {
    /// Dead-letter the item.
    Dlq,
    /// Retry with the policy's `retry_config`.
    Retry,
    /// Skip it.
    Skip,
    /// Stop the job.
    Stop,
    /// Run the named handler.
    Custom(String),
}

/// `error_collection`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCollection {
    /// Report at the end.
    Aggregate,
    /// Report each error as it happens.
    Immediate,
    /// Report every N errors.
    Batched(u64),
}

/// `circuit_breaker`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CircuitBreaker {
    /// The whole value.
    pub span: Span,
    /// Consecutive failures that open it.
    pub failure_threshold: u32,
    /// Successes in half-open that close it.
    pub success_threshold: u32,
    /// How long it stays open.
    pub timeout: Duration,
    /// Probes admitted while half-open.
    pub half_open_requests: u32,
}

/// `error_policy.retry_config`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PolicyRetry {
    /// The whole value.
    pub span: Span,
    /// Runs of an item, counting the first.
    pub max_attempts: u32,
    /// Delay growth.
    pub backoff: Backoff,
    /// Cap on every delay.
    pub max_delay: Option<Duration>,
    /// Randomise delays.
    pub jitter: bool,
    /// Spread of the jitter.
    pub jitter_factor: f64,
}

impl PolicyRetry {
    /// The policy `on_item_failure: retry` uses when `retry_config` says nothing: 3 runs,
    /// exponential backoff from 1 s.
    pub fn default_at(span: Span) -> Self {
        PolicyRetry {
            span,
            max_attempts: 3,
            backoff: Backoff::Exponential {
                initial: None,
                base: 2.0,
            },
            max_delay: None,
            jitter: false,
            jitter_factor: 0.3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(source: &str, value: &str, exact: bool) -> Parsed<()> {
        let start = source.find(['"', '\'', '|']).map_or(0, |i| i + 1);
        Parsed {
            value: value.to_owned(),
            span: Span::new(start, source.len()),
            parsed: (),
            exact,
        }
    }

    fn local(start: usize, end: usize) -> prodigy_grammar::Span {
        prodigy_grammar::Span::new(start, end)
    }

    #[test]
    fn a_rebaser_maps_ranges_in_any_order() {
        // A folded plain scalar: the line break and indentation read as one space.
        let source = "x: one ${a}\n   two ${b}";
        let p = Parsed {
            value: "one ${a} two ${b}".to_owned(),
            span: Span::new(3, source.len()),
            parsed: (),
            exact: true,
        };
        let mut rebaser = p.rebaser(source);
        let b = rebaser.span(local(15, 16));
        assert_eq!(&source[b.start as usize..b.end as usize], "b");
        // Backwards: it starts again from the beginning.
        let a = rebaser.span(local(6, 7));
        assert_eq!(&source[a.start as usize..a.end as usize], "a");
        assert_eq!(p.rebase(source, local(15, 16)), b);
        // Past the end of the value: the end of the scalar.
        assert_eq!(rebaser.span(local(17, 40)).start as usize, source.len());
    }

    #[test]
    fn a_string_with_escapes_labels_the_whole_scalar() {
        let source = "x: \"a\\tb ${c}\"";
        let p = parsed(source, "a\tb ${c}", false);
        assert_eq!(p.rebaser(source).span(local(6, 7)), p.span);
    }
}
