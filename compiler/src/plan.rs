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

/// `merge`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PlanMerge {
    /// The steps.
    pub steps: Vec<StepId>,
    /// Timeout for the merge.
    pub timeout: Option<Duration>,
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

/// The delay before retry `n` (1-based), SPEC §4, before jitter.
pub fn delay(config: &RetryConfig, n: u32) -> Duration {
    let initial = config.initial_delay;
    let raw = match &config.backoff {
        ast::Backoff::Fixed { delay } => delay.unwrap_or(initial),
        ast::Backoff::Linear {
            initial: i,
            increment,
        } => {
            let i = i.unwrap_or(initial);
            i + increment.unwrap_or(initial).saturating_mul(n - 1)
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

fn fibonacci(n: u32) -> u32 {
    let (mut a, mut b) = (1u32, 1u32);
    for _ in 2..n {
        (a, b) = (b, a.saturating_add(b));
    }
    if n <= 2 { 1 } else { b }
}

/// Builds the plan of a lowered workflow.
pub fn plan(workflow: &ast::Workflow, source: &str) -> Plan {
    let mut builder = Builder { steps: Vec::new() };
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
    }
}

struct Builder {
    steps: Vec<PlanStep>,
}

impl Builder {
    fn list(&mut self, steps: &[Step], role: Role) -> Vec<StepId> {
        steps.iter().filter_map(|s| self.step(s, role)).collect()
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
        });
        let on_failure = step.on_failure.as_ref().map(|f| PlanOnFailure {
            handler: self.list(&f.handler, Role::Handler),
            fail_workflow: f.fail_workflow,
            max_attempts: f.max_attempts,
            strategy: f.strategy,
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
