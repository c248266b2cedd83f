//! The plan's vocabulary: the leaf types that lowering produces and the runtime reads as
//! they are (templates, conditions, env values, capture and write formats, Claude and Slurm
//! settings, timeout actions, `max_parallel`, ...).
//!
//! They are defined here, in the plan crate, so that the runtime needs nothing of the
//! compiler; the compiler's `ast` re-exports them for lowering and the checks. So are the
//! policies as written (`retry_config`, `error_policy`), which the plan keeps beside their
//! resolved forms ([`crate::policy`]).
//! Values that carry a [`Span`] keep it for the compiler's diagnostics over the plan; the
//! runtime only reads their values.

use std::time::Duration;

use crate::span::{Span, Spanned};

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
        match (self.align_start(local.start), self.align(local.end)) {
            (Some(start), Some(end)) => Span::new(
                self.whole.start as usize + start,
                self.whole.start as usize + end.max(start),
            ),
            _ => self.whole,
        }
    }

    /// The offset in the scalar of the character at byte `at` of the value: past what the
    /// YAML scanner dropped before it (the opening quote of `"${a} == 1"` for offset 0).
    fn align_start(&mut self, at: usize) -> Option<usize> {
        let j = self.align(at)?;
        let found = self
            .value
            .get(at..)
            .and_then(|v| v.chars().next())
            .and_then(|c| {
                let k = advance(self.scalar, j, c)? - c.len_utf8();
                self.scalar.get(k..)?.starts_with(c).then_some(k)
            });
        Some(found.unwrap_or(j))
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

/// A regular expression from the workflow (`retry_on` and `capture_outputs` patterns,
/// `expect_output`, `message_pattern`), compiled once when the workflow is checked, with the
/// bounds of [`prodigy_grammar::compile_regex`]: the runtime matches with it and never
/// compiles. It serialises as the text it was written as, with its span.
#[derive(Clone, Debug)]
pub struct Pattern {
    source: Spanned<String>,
    regex: regex::Regex,
}

impl Pattern {
    /// Compiles SOURCE.
    ///
    /// # Errors
    ///
    /// Why it is not a valid regular expression (or is too large), as a message.
    pub fn compile(source: Spanned<String>) -> Result<Self, String> {
        let regex = prodigy_grammar::compile_regex(&source.value)?;
        Ok(Pattern { source, regex })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source.value
    }

    /// Where it was written.
    pub fn span(&self) -> Span {
        self.source.span
    }

    /// The compiled expression.
    pub fn regex(&self) -> &regex::Regex {
        &self.regex
    }

    /// Whether it matches somewhere in TEXT.
    pub fn is_match(&self, text: &str) -> bool {
        self.regex.is_match(text)
    }
}

/// Two patterns are equal when they were written the same, in the same place.
impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl serde::Serialize for Pattern {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.source.serialize(serializer)
    }
}

/// A `${...}` template: command text, paths, env values, messages.
pub type Template = Parsed<prodigy_grammar::template::Template>;

/// A `when:` or env condition, in the filter language.
pub type Condition = Parsed<prodigy_grammar::expr::Expr>;

/// What a run does when a Claude call hits the account's usage limit (`claude: {usage_limit}`,
/// docs/language.md §2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageLimitMode {
    /// Pause every Claude call until the limit resets (up to `max_wait`), then go on.
    #[default]
    Wait,
    /// Checkpoint and stop, saying when to resume.
    Stop,
}

/// The run-wide Claude settings that are not options of a call: `claude: {usage_limit,
/// max_wait, patience}` of the workflow's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ClaudeLimits {
    /// `usage_limit`: wait or stop.
    pub usage_limit: UsageLimitMode,
    /// `max_wait`: the longest pause; a later reset stops the run.
    pub max_wait: std::time::Duration,
    /// `patience`: how long a call refused as rate limited or overloaded (429, 529) is made
    /// again, as the same attempt, before its failure counts; zero: not at all.
    pub patience: std::time::Duration,
}

impl ClaudeLimits {
    /// `max_wait` when the workflow does not say: six hours, more than a five-hour limit.
    pub const DEFAULT_MAX_WAIT: std::time::Duration = std::time::Duration::from_hours(6);

    /// Whether these are the defaults (the serialised plan leaves them out).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl Default for ClaudeLimits {
    fn default() -> Self {
        ClaudeLimits {
            usage_limit: UsageLimitMode::Wait,
            max_wait: Self::DEFAULT_MAX_WAIT,
            patience: std::time::Duration::ZERO,
        }
    }
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
    /// `stall_timeout`: prodigy ends the call when its CLI reports no event for this long
    /// (no CLI option).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stall_timeout: Option<std::time::Duration>,
    /// `on_retry`: whether a retried call starts afresh (the default) or continues the
    /// failed attempt's session (no CLI option of its own: `--resume` on the retry).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_retry: Option<OnRetry>,
}

/// `merge.integrity`: what the test-integrity verdict of an agent's work does at the merge
/// queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Integrity {
    /// The verdict is not computed.
    Off,
    /// The verdict is recorded and shown; nothing is refused (the default).
    #[default]
    Warn,
    /// Work whose verdict is `fail` is refused (and sent back, with `merge.redispatch`).
    Fail,
}

/// `claude.on_retry`: what a retried call of a step does with the failed attempt's session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnRetry {
    /// A fresh session, as the first attempt had.
    #[default]
    Fresh,
    /// `--resume` the failed attempt's session, told why it failed; its edits stay.
    Continue,
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
            stall_timeout: self.stall_timeout.or(defaults.stall_timeout),
            on_retry: self.on_retry.or(defaults.on_retry),
        }
    }

    /// Whether no field is set.
    pub fn is_empty(&self) -> bool {
        *self == ClaudeSettings::default()
    }
}

/// The workflow's spending cap on Claude calls: `claude: {max_cost_usd, on_budget}`
/// (docs/language.md, "Claude budgets"), for the whole run or job across resumes.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct ClaudeBudget {
    /// `max_cost_usd`: the most, in US dollars; `None` when only `on_budget` is set (then
    /// `--max-cost-usd` gives the amount).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// `on_budget`.
    pub on_budget: OnBudget,
}

/// `claude.on_budget`: what happens to the running Claude calls once the budget is reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBudget {
    /// They finish (no new one starts).
    #[default]
    Finish,
    /// They are stopped; their items stay pending.
    Stop,
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
/// `executor.container`: the map agents' containers under `--executor container`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Container {
    /// The image.
    pub image: Option<Spanned<String>>,
    /// Whether the agents may use the network.
    pub network: bool,
    /// `--cpus`.
    pub cpus: Option<Spanned<f64>>,
    /// `--memory`.
    pub memory: Option<Spanned<String>>,
}

/// Top-level `slurm` (or `executor.slurm`): `sbatch` options for the map agents when they run on Slurm.
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
    /// The nodes share no filesystem with the coordinator (`--no-shared-fs`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_shared_fs: bool,
    /// Where the coordinator serves the repository to them, `HOST:PORT` (`--serve-addr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve: Option<Spanned<String>>,
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

/// `on_failure.strategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    pub message_pattern: Option<Pattern>,
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
    pub expect_output: Option<Pattern>,
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

impl RetryConfig {
    /// The documented defaults.
    pub fn defaults(span: Span) -> Self {
        RetryConfig {
            span,
            attempts: 3,
            backoff: Backoff::Exponential {
                initial: None,
                base: 2.0,
            },
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
            jitter: false,
            jitter_factor: 0.3,
            retry_on: Vec::new(),
            retry_budget: None,
            on_failure: RetryExhausted::Stop,
        }
    }
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
    /// A Claude call stopped by its `stall_timeout`.
    Stalled,
    /// A regular expression over stderr and stdout.
    Pattern(Pattern),
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
    pub pattern: Option<Pattern>,
    /// `json_path` into the output.
    pub json_path: Option<Parsed<prodigy_grammar::jsonpath::JsonPath>>,
    /// `max_size` in bytes.
    pub max_size: u64,
    /// `default` when pattern or path fail.
    pub default: Option<Spanned<String>>,
    /// `multiline`.
    pub multiline: Multiline,
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

/// What a `notify:` entry fires on (docs/language.md §2, "Notifications").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NotifyEvent {
    /// The run or job ended successfully.
    Finished,
    /// The run or job ended failed (a job also when its error policy stopped it).
    Failed,
    /// A Claude call reached the account's usage limit: Claude calls wait for the reset,
    /// or the run stops.
    Paused,
    /// The Claude budget was reached: no new Claude call starts.
    BudgetReached,
    /// A map item went to the DLQ.
    ItemDeadLettered,
}

impl NotifyEvent {
    /// Every event with its name, in the order the documentation lists them.
    pub const ALL: [(&'static str, NotifyEvent); 5] = [
        ("finished", NotifyEvent::Finished),
        ("failed", NotifyEvent::Failed),
        ("paused", NotifyEvent::Paused),
        ("budget_reached", NotifyEvent::BudgetReached),
        ("item_dead_lettered", NotifyEvent::ItemDeadLettered),
    ];

    /// Its name, as `on:` and `${event.name}` spell it.
    pub fn name(self) -> &'static str {
        match self {
            NotifyEvent::Finished => "finished",
            NotifyEvent::Failed => "failed",
            NotifyEvent::Paused => "paused",
            NotifyEvent::BudgetReached => "budget_reached",
            NotifyEvent::ItemDeadLettered => "item_dead_lettered",
        }
    }
}

/// The fields of `${event.*}` in a notification's command; a field an event does not
/// carry is empty (docs/language.md §2, "Notifications").
pub const EVENT_FIELDS: &[&str] = &[
    "name",
    "id",
    "workflow",
    "mode",
    "status",
    "duration_secs",
    "cost_usd",
    "failed_step",
    "items_total",
    "items_succeeded",
    "items_failed",
    "items_dlq",
    "reset_at",
    "limit_type",
    "spent_usd",
    "limit_usd",
    "item_id",
    "error",
];

/// How long a notification's command may run unless its `timeout:` says otherwise.
pub const DEFAULT_NOTIFY_TIMEOUT: Duration = Duration::from_mins(1);
