//! The plan: the compiled, frozen form of a workflow that the runtime interprets.
//!
//! Every step of every context (phases, handlers, success and exit-code handlers, validation,
//! `foreach` bodies) gets a dense [`StepId`]; nested step lists become lists of ids, so the
//! runtime walks a flat table and never sees YAML or the AST's nesting.
//! Templates and expressions arrive pre-parsed, each step keeps its origin span, and each
//! retry policy carries its concrete delay schedule.

use std::time::Duration;

use crate::ast::{
    self, Capture, CommitConfig, Condition, EnvVar, ErrorPolicy, ExitCodeHandler, Mode, Parsed,
    Profile, RetryConfig, Secret, SetupCapture, Step, StepOutput, StepValidate, Strategy, Template,
    TimeoutConfig, WriteFile,
};
use crate::source::Span;

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
    /// Named handlers.
    pub handlers: Vec<(String, Vec<StepId>)>,
    /// The error policy (MapReduce).
    pub error_policy: Option<ErrorPolicy>,
    /// The workflow's `claude:` defaults, for Claude calls that are not a step's own command
    /// (`step_validate` checks); each `claude` step has them merged into [`PlanStep::claude`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claude: Option<ast::ClaudeSettings>,
    /// `slurm`: `sbatch` options for the map agents under `--executor slurm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<ast::Slurm>,
    /// Every variable the workflow reads, resolved to where its value comes from; steps
    /// refer to these slots in [`PlanStep::reads`].
    pub variables: Vec<Variable>,
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
    /// `retry_config` with its schedule.
    pub retry: Option<RetryPolicy>,
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
    pub claude: Option<ast::ClaudeSettings>,
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
        input: ast::ForeachInput,
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

/// A command-level retry policy with its nominal delays (before jitter).
#[derive(Clone, Debug, serde::Serialize)]
pub struct RetryPolicy {
    /// The policy as written, defaults applied.
    pub config: RetryConfig,
    /// Delay before retry n, for n = 1..attempts-1, capped at `max_delay`.
    pub schedule: Vec<Duration>,
}

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
    pub capture_outputs: Vec<SetupCapture>,
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
    pub max_parallel: ast::MaxParallel,
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

/// `merge`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PlanMerge {
    /// The steps (none: the default merge back).
    pub steps: Vec<StepId>,
    /// Timeout for the merge.
    pub timeout: Option<Duration>,
    /// Steps that resolve a conflicted merge (none: a conflict is not resolved).
    pub on_conflict: Vec<StepId>,
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

    /// The time its retry policy can take, if it has one.
    pub fn retry_cost(&self) -> Option<RetryCost> {
        let retry = self.retry.as_ref()?;
        Some(RetryCost {
            delays: retry
                .schedule
                .iter()
                .fold(Duration::ZERO, |total, d| total.saturating_add(*d)),
            runs: self
                .timeout
                .map(|t| t.saturating_mul(retry.config.attempts)),
        })
    }
}

impl Plan {
    /// The step with an id.
    pub fn step(&self, id: StepId) -> Option<&PlanStep> {
        self.steps.get(id.index())
    }
}

/// The nominal delays of a retry policy: before retry n (n = 1..attempts-1), capped.
pub fn schedule(config: &RetryConfig) -> Vec<Duration> {
    (1..config.attempts).map(|n| delay(config, n)).collect()
}

/// The delay before retry `n` (1-based), docs/language.md §4, before jitter.
pub fn delay(config: &RetryConfig, n: u32) -> Duration {
    let initial = config.initial_delay;
    let raw = match &config.backoff {
        ast::Backoff::Fixed { delay } => delay.unwrap_or(initial),
        ast::Backoff::Linear {
            initial: i,
            increment,
        } => {
            let i = i.unwrap_or(initial);
            i.saturating_add(increment.unwrap_or(initial).saturating_mul(n - 1))
        }
        ast::Backoff::Exponential { initial: i, base } => {
            let i = i.unwrap_or(initial);
            let factor = base.powi(i32::try_from(n - 1).unwrap_or(i32::MAX));
            Duration::try_from_secs_f64(i.as_secs_f64() * factor).unwrap_or(Duration::MAX)
        }
        ast::Backoff::Fibonacci { initial: i } => i.unwrap_or(initial).saturating_mul(fibonacci(n)),
        ast::Backoff::Custom { delays } => delays
            .get((n - 1) as usize)
            .copied()
            .unwrap_or(config.max_delay),
    };
    raw.min(config.max_delay)
}

/// The delays between the runs of an item under `error_policy.retry_config`, with the
/// error-policy formulas of docs/language.md §4 (seed `000`): fixed `delay`; linear `initial +
/// n·increment`; exponential `initial · base^(n-1)`; fibonacci `initial · fib(n)`; custom
/// `delays[n-1]`. A missing initial delay is 1 s; `max_delay` caps every delay.
pub fn policy_schedule(config: &ast::PolicyRetry) -> Vec<Duration> {
    const DEFAULT: Duration = Duration::from_secs(1);
    let cap = config.max_delay.unwrap_or(Duration::MAX);
    (1..config.max_attempts.max(1))
        .map(|n| {
            let raw = match &config.backoff {
                ast::Backoff::Fixed { delay } => delay.unwrap_or(DEFAULT),
                ast::Backoff::Linear { initial, increment } => initial
                    .unwrap_or(DEFAULT)
                    .saturating_add(increment.unwrap_or(DEFAULT).saturating_mul(n)),
                ast::Backoff::Exponential { initial, base } => {
                    let factor = base.powi(i32::try_from(n - 1).unwrap_or(i32::MAX));
                    Duration::try_from_secs_f64(initial.unwrap_or(DEFAULT).as_secs_f64() * factor)
                        .unwrap_or(Duration::MAX)
                }
                ast::Backoff::Fibonacci { initial } => {
                    initial.unwrap_or(DEFAULT).saturating_mul(fibonacci(n))
                }
                ast::Backoff::Custom { delays } => delays
                    .get((n - 1) as usize)
                    .copied()
                    .unwrap_or(config.max_delay.unwrap_or(DEFAULT)),
            };
            raw.min(cap)
        })
        .collect()
}

fn fibonacci(n: u32) -> u32 {
    let (mut a, mut b) = (1u32, 1u32);
    for _ in 2..n {
        (a, b) = (b, a.saturating_add(b));
    }
    if n <= 2 { 1 } else { b }
}

/// Builds the plan of a lowered workflow.
pub fn plan(workflow: &ast::Workflow, source: &str) -> Plan {
    let mut builder = Builder {
        steps: Vec::new(),
        claude: workflow.claude.clone().unwrap_or_default(),
    };
    let commands = builder.list(&workflow.commands, Role::Main);
    let setup = workflow.setup.as_ref().map(|s| PlanSetup {
        steps: builder.list(&s.commands, Role::Main),
        timeout: s.timeout.as_ref().map(|t| t.value),
        capture_outputs: s.capture_outputs.clone(),
    });
    let map = workflow.map.as_ref().map(|m| PlanMap {
        input: m.input.clone(),
        json_path: m.json_path.clone(),
        filter: m.filter.clone(),
        sort_by: m.sort_by.clone(),
        distinct: m.distinct.clone(),
        offset: m.offset.as_ref().map(|n| n.value),
        max_items: m.max_items.as_ref().map(|n| n.value),
        max_parallel: m.max_parallel.clone(),
        agent_timeout: m
            .timeout_config
            .as_ref()
            .and_then(|t| t.agent_timeout.as_ref())
            .or(m.agent_timeout.as_ref())
            .map(|t| t.value),
        timeout_config: m.timeout_config.clone(),
        steps: builder.list(&m.agent_template, Role::Main),
    });
    let reduce = workflow
        .reduce
        .as_ref()
        .map(|r| builder.list(r, Role::Main))
        .unwrap_or_default();
    let merge = workflow.merge.as_ref().map(|m| PlanMerge {
        steps: builder.list(&m.commands, Role::Main),
        timeout: m.timeout.as_ref().map(|t| t.value),
        on_conflict: builder.list(&m.on_conflict, Role::Main),
    });
    let handlers = workflow
        .handlers
        .iter()
        .map(|h| (h.name.value.clone(), builder.list(&h.steps, Role::Main)))
        .collect();
    Plan {
        version: 1,
        source: source.to_owned(),
        name: workflow.name.as_ref().map(|n| n.value.clone()),
        description: workflow.description.as_ref().map(|n| n.value.clone()),
        mode: workflow.mode,
        env: workflow.env.clone(),
        secrets: workflow.secrets.clone(),
        env_files: workflow.env_files.clone(),
        profiles: workflow.profiles.clone(),
        steps: builder.steps,
        commands,
        setup,
        map,
        reduce,
        merge,
        handlers,
        error_policy: workflow.error_policy.clone(),
        claude: workflow.claude.clone().filter(|s| !s.is_empty()),
        slurm: workflow.slurm.clone(),
        variables: Vec::new(),
    }
    .with_variables(workflow)
}

impl Plan {
    /// Fills the variable table and each step's `reads`.
    fn with_variables(mut self, workflow: &ast::Workflow) -> Self {
        let mut known: std::collections::BTreeMap<String, VarSource> =
            std::collections::BTreeMap::new();
        for var in workflow
            .env
            .iter()
            .chain(workflow.profiles.iter().flat_map(|p| &p.env))
        {
            known.insert(var.name.value.clone(), VarSource::Env);
        }
        for secret in &workflow.secrets {
            known.insert(secret.name.value.clone(), VarSource::Secret);
        }
        for capture in workflow.setup.iter().flat_map(|s| &s.capture_outputs) {
            known.insert(capture.name.value.clone(), VarSource::SetupOutput);
        }
        for step in &self.steps {
            if let Some(c) = &step.capture {
                known.insert(c.name.value.clone(), VarSource::Capture);
            }
            if let Some(name) = &step.capture_output {
                known.insert(name.clone(), VarSource::Capture);
            }
            for name in step.on_failure.iter().flat_map(|f| &f.capture) {
                known.insert(name.clone(), VarSource::Capture);
            }
            if let (Some(id), false) = (&step.step_id, step.outputs.is_empty()) {
                known.insert(id.clone(), VarSource::Outputs);
            }
        }
        let mut table: Vec<Variable> = Vec::new();
        for i in 0..self.steps.len() {
            let roots = step_roots(&self.steps[i]);
            let mut reads = Vec::new();
            for (root, bare) in roots {
                // A bare `$NAME` that the workflow does not define is the shell's.
                if bare && !known.contains_key(&root) {
                    continue;
                }
                let source = known
                    .get(&root)
                    .copied()
                    .unwrap_or_else(|| builtin(&root, &self.steps[i]));
                let slot = if let Some(p) = table.iter().position(|v| v.name == root) {
                    p
                } else {
                    table.push(Variable { name: root, source });
                    table.len() - 1
                };
                let slot = Slot(u32::try_from(slot).unwrap_or(u32::MAX));
                if !reads.contains(&slot) {
                    reads.push(slot);
                }
            }
            self.steps[i].reads = reads;
        }
        self.variables = table;
        self
    }
}

/// The first names of every variable a step's own fields read, and whether each was a bare
/// `$NAME`.
fn step_roots(step: &PlanStep) -> Vec<(String, bool)> {
    let mut templates: Vec<&Template> = Vec::new();
    match &step.command {
        PlanCommand::Shell(t)
        | PlanCommand::Claude(t)
        | PlanCommand::Foreach {
            input: ast::ForeachInput::Command(t),
            ..
        } => templates.push(t),
        PlanCommand::WriteFile(w) => templates.extend([&w.path, &w.content]),
        PlanCommand::Foreach {
            input: ast::ForeachInput::List(items),
            ..
        } => templates.extend(items),
    }
    templates.extend(step.working_dir.iter().chain(&step.output_file));
    for var in &step.env {
        if let ast::EnvValue::Static(t) | ast::EnvValue::Masked(t) = &var.value {
            templates.push(t);
        }
    }
    let mut roots: Vec<(String, bool)> = Vec::new();
    for template in templates {
        for var in template.parsed.vars() {
            roots.push((var.path.root.clone(), false));
        }
        for part in &template.parsed.parts {
            if let prodigy_grammar::template::Part::Bare { name, .. } = part {
                roots.push((name.clone(), true));
            }
        }
    }
    if let Some(when) = &step.when {
        roots.extend(
            when.parsed
                .references()
                .into_iter()
                .map(|(p, _, _)| (p.root.clone(), false)),
        );
    }
    roots
}

/// Where a name that the workflow does not define comes from.
fn builtin(root: &str, step: &PlanStep) -> VarSource {
    match root {
        "item" | "item_index" | "item_total" | "item_id" | "item_json"
            if step.role != Role::Foreach =>
        {
            VarSource::Item
        }
        "item" | "index" | "total" => VarSource::Foreach,
        "map" => VarSource::MapResults,
        "shell" | "claude" => VarSource::LastCommand,
        "error" | "attempt" => VarSource::Failure,
        "validation" => VarSource::Validation,
        "merge" => VarSource::Merge,
        "workflow" | "step" | "git" => VarSource::Context,
        "env" => VarSource::Process,
        name if name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') =>
        {
            VarSource::Process
        }
        _ => VarSource::Param,
    }
}

struct Builder {
    steps: Vec<PlanStep>,
    /// The workflow's `claude:` defaults.
    claude: ast::ClaudeSettings,
}

impl Builder {
    fn list(&mut self, steps: &[Step], role: Role) -> Vec<StepId> {
        steps.iter().filter_map(|s| self.step(s, role)).collect()
    }

    fn default_timeout(&mut self, ids: &[StepId], timeout: Option<Duration>) {
        for id in ids {
            if let Some(step) = self.steps.get_mut(id.index()) {
                step.timeout = step.timeout.or(timeout);
            }
        }
    }

    fn step(&mut self, step: &Step, role: Role) -> Option<StepId> {
        let command = match &step.command {
            ast::Command::Shell(t) => PlanCommand::Shell(t.clone()),
            ast::Command::Claude(t) => PlanCommand::Claude(t.clone()),
            ast::Command::WriteFile(w) => PlanCommand::WriteFile(w.clone()),
            ast::Command::Foreach(f) => PlanCommand::Foreach {
                input: f.input.clone(),
                parallel: f.parallel,
                steps: self.list(&f.steps, Role::Foreach),
                continue_on_error: f.continue_on_error,
                max_items: f.max_items,
            },
            // A step without a command has a diagnostic; a plan is only built without errors.
            ast::Command::Invalid => return None,
        };
        let id = StepId(u32::try_from(self.steps.len()).unwrap_or(u32::MAX));
        // Reserve the slot so that nested steps get later ids than their parent.
        self.steps.push(PlanStep {
            id,
            origin: step.span,
            role,
            label: label(step),
            command,
            step_id: step.id.as_ref().map(|i| i.value.clone()),
            description: step.description.as_ref().map(|d| d.value.clone()),
            timeout: step.timeout.as_ref().map(|t| t.value),
            working_dir: step.working_dir.clone(),
            env: step.env.clone(),
            clear_env: step.clear_env,
            when: step.when.clone(),
            capture: step.capture.clone(),
            capture_output: step.capture_output.as_ref().map(|c| c.value.clone()),
            output_file: step.output_file.clone(),
            on_success: Vec::new(),
            on_failure: None,
            on_exit_code: Vec::new(),
            retry: step.retry.as_ref().map(|r| RetryPolicy {
                config: r.clone(),
                schedule: schedule(r),
            }),
            commit_required: step.commit_required,
            auto_commit: step.auto_commit,
            commit_config: step.commit_config.clone(),
            validate: None,
            step_validate: step.step_validate.clone(),
            outputs: step.outputs.clone(),
            continue_on_error: step.continue_on_error,
            reads: Vec::new(),
            claude: matches!(step.command, ast::Command::Claude(_))
                .then(|| {
                    step.claude
                        .as_ref()
                        .map_or_else(|| self.claude.clone(), |own| own.over(&self.claude))
                })
                .filter(|s| !s.is_empty()),
        });
        let on_failure = step.on_failure.as_ref().map(|f| PlanOnFailure {
            handler: self.list(&f.handler, Role::Handler),
            fail_workflow: f.fail_workflow,
            max_attempts: f.max_attempts,
            strategy: f.strategy,
            strategy_span: f.strategy_span,
            handler_failure_fatal: f.handler_failure_fatal,
            timeout: f.timeout.as_ref().map(|t| t.value),
            capture: f.capture.iter().map(|c| c.value.clone()).collect(),
            commit_required: f.commit_required,
        });
        let on_success = self.list(&step.on_success, Role::OnSuccess);
        let on_exit_code = step
            .on_exit_code
            .iter()
            .map(|ExitCodeHandler { code, steps }| (code.value, self.list(steps, Role::OnExitCode)))
            .collect();
        let validate = step.validate.as_ref().map(|v| PlanValidate {
            commands: self.list(&v.commands, Role::Validation),
            result_file: v.result_file.clone(),
            threshold: v.threshold,
            timeout: v.timeout.as_ref().map(|t| t.value),
            expected_schema: v.expected_schema.clone(),
            on_incomplete: v.on_incomplete.as_ref().map(|o| PlanOnIncomplete {
                commands: self.list(&o.commands, Role::OnIncomplete),
                max_attempts: o.max_attempts,
                fail_workflow: o.fail_workflow,
                commit_required: o.commit_required,
                prompt: o.prompt.clone(),
            }),
        });
        // A handler's or a validation's `timeout` bounds each of its commands that has none.
        if let Some(f) = &on_failure {
            self.default_timeout(&f.handler, f.timeout);
        }
        if let Some(v) = &validate {
            self.default_timeout(&v.commands, v.timeout);
        }
        if let Some(slot) = self.steps.get_mut(id.index()) {
            slot.on_failure = on_failure;
            slot.on_success = on_success;
            slot.on_exit_code = on_exit_code;
            slot.validate = validate;
        }
        Some(id)
    }
}

/// A short label: the name, else the id, else the command's first line, shortened.
fn label(step: &Step) -> String {
    if let Some(name) = step.name.as_ref().or(step.id.as_ref()) {
        return name.value.clone();
    }
    let text = match &step.command {
        ast::Command::Shell(t) | ast::Command::Claude(t) => t.value.as_str(),
        ast::Command::WriteFile(w) => return format!("write {}", w.path.value),
        ast::Command::Foreach(_) => return "foreach".to_owned(),
        ast::Command::Invalid => return String::new(),
    };
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let mut short: String = first.chars().take(48).collect();
    if first.chars().count() > 48 || text.trim().lines().count() > 1 {
        short.push('…');
    }
    short
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_policy_delays_use_the_seed_formulas() {
        let secs = Duration::from_secs;
        let policy = |backoff, max_delay| ast::PolicyRetry {
            span: Span::default(),
            max_attempts: 5,
            backoff,
            max_delay,
            jitter: false,
            jitter_factor: 0.3,
        };
        let linear = ast::Backoff::Linear {
            initial: Some(secs(1)),
            increment: Some(secs(2)),
        };
        // Linear counts from n (not n-1) in the error-policy formula.
        assert_eq!(
            policy_schedule(&policy(linear, None)),
            [secs(3), secs(5), secs(7), secs(9)]
        );
        let fib = ast::Backoff::Fibonacci {
            initial: Some(secs(1)),
        };
        assert_eq!(
            policy_schedule(&policy(fib, Some(secs(2)))),
            [secs(1), secs(1), secs(2), secs(2)]
        );
        let exp = ast::Backoff::Exponential {
            initial: None,
            base: 3.0,
        };
        assert_eq!(
            policy_schedule(&policy(exp, None)),
            [secs(1), secs(3), secs(9), secs(27)]
        );
    }

    fn config(backoff: ast::Backoff, attempts: u32) -> RetryConfig {
        RetryConfig {
            attempts,
            backoff,
            ..RetryConfig::defaults(Span::default())
        }
    }

    fn secs(v: &[Duration]) -> Vec<f64> {
        v.iter().map(Duration::as_secs_f64).collect()
    }

    #[test]
    fn delay_formulas_follow_spec_section_4() {
        let s = |b, n| secs(&schedule(&config(b, n)));
        assert_eq!(s(ast::Backoff::Fixed { delay: None }, 4), [1.0, 1.0, 1.0]);
        assert_eq!(
            s(
                ast::Backoff::Linear {
                    initial: None,
                    increment: Some(Duration::from_secs(2))
                },
                4
            ),
            [1.0, 3.0, 5.0]
        );
        assert_eq!(
            s(
                ast::Backoff::Exponential {
                    initial: None,
                    base: 2.0
                },
                7
            ),
            [1.0, 2.0, 4.0, 8.0, 16.0, 30.0]
        );
        assert_eq!(
            s(ast::Backoff::Fibonacci { initial: None }, 7),
            [1.0, 1.0, 2.0, 3.0, 5.0, 8.0]
        );
        let custom = ast::Backoff::Custom {
            delays: vec![Duration::from_secs(5), Duration::from_secs(7)],
        };
        assert_eq!(s(custom, 5), [5.0, 7.0, 30.0, 30.0]);
        assert_eq!(s(ast::Backoff::Fixed { delay: None }, 1), Vec::<f64>::new());
    }
}
