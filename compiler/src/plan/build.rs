//! The planner: a lowered workflow in, the frozen [`Plan`] out, every policy resolved.

use std::time::Duration;

use super::{
    HandlerPolicy, JobPolicy, OutputCapture, Plan, PlanCommand, PlanMap, PlanMerge, PlanOnFailure,
    PlanOnIncomplete, PlanRetry, PlanSetup, PlanStep, PlanValidate, PlanWorktree, RetryPolicy,
    Role, Slot, StepId, Template, VarSource, Variable,
};
use crate::ast::{self, ExitCodeHandler, Step, Strategy};
use crate::source::{SourceFile, Span};

/// Builds the plan of a lowered workflow, read from FILE.
#[expect(
    clippy::too_many_lines,
    reason = "table-shaped lowering: one block per phase of the workflow onto the plan"
)]
pub fn plan(workflow: &ast::Workflow, file: &SourceFile) -> Plan {
    let mut builder = Builder {
        file,
        steps: Vec::new(),
        claude: workflow.claude.clone().unwrap_or_default(),
    };
    let worktree = workflow
        .worktree
        .as_ref()
        .map(|w| {
            let texts = |list: &[crate::source::Spanned<String>]| {
                list.iter().map(|p| p.value.clone()).collect()
            };
            PlanWorktree {
                copy: texts(&w.copy),
                link: texts(&w.link),
                setup: builder.list(&w.setup, Role::Main),
                sparse: texts(&w.sparse),
                keep: texts(&w.keep),
                persist: w.persist,
            }
        })
        .unwrap_or_default();
    let commands = builder.list(&workflow.commands, Role::Main);
    let setup = workflow.setup.as_ref().map(|s| PlanSetup {
        steps: builder.list(&s.commands, Role::Main),
        timeout: s.timeout.as_ref().map(|t| t.value),
        capture_outputs: s
            .capture_outputs
            .iter()
            .map(OutputCapture::resolve)
            .collect(),
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
        verify: builder.list(&m.verify, Role::Main),
        batch: m.batch.as_ref().map_or(1, |b| b.value.max(1)),
        redispatch: m.redispatch.as_ref().map_or(0, |r| r.value),
        protect: m.protect.iter().map(|p| p.value.clone()).collect(),
        integrity: m.integrity.as_ref().map(|i| i.value),
    });
    let handlers: Vec<(String, Vec<StepId>)> = workflow
        .handlers
        .iter()
        .map(|h| (h.name.value.clone(), builder.list(&h.steps, Role::Main)))
        .collect();
    let notify = workflow
        .notify
        .iter()
        .filter_map(|n| {
            Some(super::PlanNotify {
                on: n.on.iter().map(|e| e.value).collect(),
                step: builder.step(&n.step, Role::Main)?,
            })
        })
        .collect();
    let names: Vec<&str> = handlers.iter().map(|(name, _)| name.as_str()).collect();
    let job_policy = JobPolicy::resolve(workflow.error_policy.as_ref(), &names);
    let mut plan = Plan {
        version: 1,
        source: file.name.clone(),
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
        job_policy,
        claude: workflow.claude.clone().filter(|s| !s.is_empty()),
        claude_budget: workflow.claude_budget,
        claude_limits: workflow.claude_limits,
        slurm: workflow.slurm.clone(),
        worktree,
        notify,
        container: workflow.container.clone(),
        variables: Vec::new(),
        reads_map_results: false,
        yaml: super::YamlReader(super::yaml_to_json),
    }
    .with_variables(workflow);
    // Whatever reads `${map.results}` is written in the file (a command, a dynamic `env`
    // value, a `step_validate` check, Claude settings, a `when`), so the file's text
    // settles it: a false alarm only costs memory, a miss would lose the value.
    plan.reads_map_results = mentions_map_results(&file.text);
    plan
}

/// Whether TEXT may read `${map.results}` or the whole `${map}`: `map.results`, `map[`,
/// `map}`, `map |` (a filter), a bare `$map`, or the exported `MAP__RESULTS…` variables. A
/// YAML `map:` key is none of these.
fn mentions_map_results(text: &str) -> bool {
    text.contains("MAP__RESULTS")
        || text.match_indices("map").any(|(at, _)| {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.') {
                return false;
            }
            let after = text[at + 3..].trim_start();
            after.starts_with(".results")
                || after.starts_with(['[', '}', '|'])
                || (before == Some('$') && !after.starts_with(['.', ':']))
        })
}

/// The variable table the planner derives (the plan is the plan crate's type).
trait WithVariables {
    /// Fills the variable table and each step's `reads`.
    fn with_variables(self, workflow: &ast::Workflow) -> Self;
}

impl WithVariables for Plan {
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
        // Each name's place in `table`: a search of the table per read made a check
        // quadratic in the number of steps.
        let mut slots: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
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
                let slot = if let Some(&p) = slots.get(&root) {
                    p
                } else {
                    slots.insert(root.clone(), table.len());
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

struct Builder<'f> {
    /// The workflow file, for the line each step starts on.
    file: &'f SourceFile,
    steps: Vec<PlanStep>,
    /// The workflow's `claude:` defaults.
    claude: ast::ClaudeSettings,
}

impl Builder<'_> {
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

    #[expect(
        clippy::too_many_lines,
        reason = "table-shaped lowering: one field per key of a step onto its plan step"
    )]
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
            line: line_of(self.file, step.span),
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
            retry: step.retry.as_ref().map(|r| PlanRetry {
                config: r.clone(),
                policy: RetryPolicy::resolve(r),
                fallback_line: match &r.on_failure {
                    ast::RetryExhausted::Fallback(command) => line_of(self.file, command.span),
                    ast::RetryExhausted::Stop | ast::RetryExhausted::Continue => None,
                },
            }),
            handler_policy: HandlerPolicy::none(),
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
            slot.handler_policy =
                on_failure
                    .as_ref()
                    .map_or_else(HandlerPolicy::none, |f| HandlerPolicy {
                        has_handler: !f.handler.is_empty(),
                        max_attempts: f.max_attempts.max(1),
                        fail_workflow: f.fail_workflow,
                        handler_failure_fatal: f.handler_failure_fatal,
                        recovers: f.strategy == Strategy::Fallback,
                    });
            slot.on_failure = on_failure;
            slot.on_success = on_success;
            slot.on_exit_code = on_exit_code;
            slot.validate = validate;
        }
        Some(id)
    }
}

/// The line (from 1) that SPAN starts on in FILE; none for the empty span at the start of the
/// file that a step the compiler made has.
fn line_of(file: &SourceFile, span: Span) -> Option<u32> {
    if span.start == 0 && span.end == 0 {
        return None;
    }
    u32::try_from(file.line_col(span.start).line).ok()
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
    use std::time::Duration;

    use crate::plan::{Exhausted, HandlerId, ItemFailure, Matcher, Plan};
    use crate::source::SourceFile;

    fn plan_of(yaml: &str) -> Plan {
        let checked = crate::check(&SourceFile::new("w.yml", yaml));
        let errors: Vec<_> = checked
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .collect();
        assert!(errors.is_empty(), "{errors:?}");
        checked.plan.unwrap()
    }

    #[test]
    fn every_step_knows_the_line_its_entry_starts_on() {
        let plan = plan_of(
            "name: lines\ncommands:\n  - shell: make\n\n  - name: test\n    shell: cargo test\n    \
             on_failure:\n      - shell: echo fix\n      - claude: /fix\n  - foreach: [a, b]\n    \
             do:\n      - shell: echo ${item}\n",
        );
        assert_eq!(plan.source, "w.yml");
        let lines: Vec<(&str, Option<u32>)> = plan
            .steps
            .iter()
            .map(|s| (s.label.as_str(), s.line))
            .collect();
        assert_eq!(
            lines,
            [
                ("make", Some(3)),
                ("test", Some(5)),
                ("echo fix", Some(8)),
                ("/fix", Some(9)),
                // A `foreach` body is planned before the step that holds it.
                ("echo ${item}", Some(12)),
                ("foreach", Some(10)),
            ]
        );
    }

    /// A job builds `${map.results}` only when a step can read it: a reduce that reads
    /// only the counts does not.
    #[test]
    fn the_plan_knows_whether_a_step_can_read_the_map_results() {
        let job = |reduce: &str| {
            plan_of(&format!(
                "name: x\nmode: mapreduce\nmap: {{input: i.json, agent_template: [{{shell: a}}]}}\n\
                 reduce:\n{reduce}"
            ))
            .reads_map_results
        };
        assert!(!job("  - shell: echo ${map.successful} of ${map.total}\n"));
        assert!(!job("  - shell: echo ${item_count}\n"));
        assert!(job("  - shell: echo '${map.results}'\n"));
        assert!(job("  - shell: echo '${map}'\n"));
        assert!(job(
            "  - shell: echo first\n    when: \"${map.results[0].status} == 'succeeded'\"\n"
        ));
        assert!(job(
            "  - write_file:\n      path: r.json\n      content: \"${map.results}\"\n"
        ));
        // Read only where the variable table does not look: a dynamic `env` value.
        assert!(job(
            "  - shell: echo $N\n    env:\n      N:\n        command: \"echo '${map.results}' | wc -c\"\n"
        ));
        assert!(job("  - shell: echo ${map | json}\n"));
        assert!(job("  - shell: echo $MAP__RESULTS__0__STATUS\n"));
        // The job's `map:` key and `${map.total}` are no reads of the results.
        assert!(!job("  - shell: echo ${map.total}\n"));
    }

    #[test]
    fn a_custom_item_failure_names_its_handler_by_id() {
        let plan = plan_of(
            "name: x\nmode: mapreduce\nmap: {input: i.json, agent_template: [{shell: a}]}\n\
             on_item_failure: custom:fixer\n\
             handlers:\n  notify:\n    - shell: echo hi\n  fixer:\n    - shell: echo fix\n",
        );
        assert_eq!(
            plan.job_policy.on_item_failure,
            ItemFailure::Custom(HandlerId(1))
        );
        let (name, steps) = plan.handler(HandlerId(1)).unwrap();
        assert_eq!(name, "fixer");
        assert_eq!(steps.len(), 1);
    }

    #[test]
    fn steps_carry_the_policies_their_machines_follow() {
        let plan = plan_of(
            "- shell: make\n  retry_config:\n    attempts: 3\n    backoff: fixed\n    \
             initial_delay: 2s\n    retry_on: [network, {pattern: 'busy'}]\n    \
             on_failure: {fallback: make clean}\n  \
             on_failure:\n    shell: echo fix\n    strategy: fallback\n    max_attempts: 2\n",
        );
        let step = &plan.steps[0];
        let retry = step.retry_policy();
        assert_eq!(retry.attempts, 3);
        assert_eq!(retry.delays, [Duration::from_secs(2); 2]);
        assert!(
            matches!(&retry.exhausted, Exhausted::Fallback(command) if command.value == "make clean"),
            "the exhausted policy carries its fallback command: {:?}",
            retry.exhausted
        );
        assert!(matches!(retry.retry_on[0], Matcher::Network));
        assert!(matches!(&retry.retry_on[1], Matcher::Pattern(re) if re.is_match("busy")));
        let handler = &step.handler_policy;
        assert!(handler.has_handler && handler.recovers);
        assert_eq!(handler.max_attempts, 2);
        // A handler command has neither.
        assert_eq!(step.retry.as_ref().unwrap().fallback_line, Some(7));
        let fix = &plan.steps[1];
        assert_eq!(fix.retry_policy().attempts, 1);
        assert!(!fix.handler_policy.has_handler && fix.handler_policy.fail_workflow);
    }

    #[test]
    fn patterns_and_paths_are_compiled_once_and_serialise_as_written() {
        let plan = plan_of(
            "name: x\nmode: mapreduce\nsetup:\n  commands: [{shell: echo}]\n  capture_outputs:\n    \
             v: {command_index: 0, pattern: 'v=([0-9]+)', json_path: '$.a'}\n\
             map:\n  input: i.json\n  agent_template:\n    - shell: make\n      \
             auto_commit: true\n      commit_config: {message_pattern: '^fix'}\n      \
             step_validate:\n        commands: [{command: echo ok, expect_output: 'o+k'}]\n      \
             retry_config: {attempts: 3, backoff: fixed, initial_delay: 2s}\n",
        );
        let capture = &plan.setup.as_ref().unwrap().capture_outputs[0];
        let pattern = capture.pattern.as_ref().unwrap();
        assert_eq!(
            pattern
                .regex()
                .captures("v=12")
                .unwrap()
                .get(1)
                .unwrap()
                .as_str(),
            "12"
        );
        let doc = serde_json::json!({"a": 7});
        assert_eq!(
            capture.json_path.as_ref().unwrap().parsed.select(&doc),
            [serde_json::json!(7)]
        );
        let step = &plan.steps[plan.map.as_ref().unwrap().steps[0].index()];
        let check = &step.step_validate.as_ref().unwrap().checks[0];
        assert!(check.expect_output.as_ref().unwrap().is_match("ook"));
        let message = step
            .commit_config
            .as_ref()
            .unwrap()
            .message_pattern
            .as_ref();
        assert!(message.unwrap().is_match("fix: it") && !message.unwrap().is_match("wip"));
        // The serialised plan shows the text as written: a capture's pattern and path as
        // strings, the other patterns with their spans, the retry schedule as a list.
        let json = serde_json::to_value(&plan).unwrap();
        let setup = &json["setup"]["capture_outputs"][0];
        assert_eq!(setup["pattern"], "v=([0-9]+)");
        assert_eq!(setup["json_path"], "$.a");
        let step = &json["steps"][step.id.index()];
        assert_eq!(
            step["step_validate"]["checks"][0]["expect_output"]["value"],
            "o+k"
        );
        assert!(step["step_validate"]["checks"][0]["expect_output"]["span"].is_object());
        assert_eq!(step["commit_config"]["message_pattern"]["value"], "^fix");
        assert_eq!(
            step["retry"]["schedule"],
            serde_json::json!([{"secs": 2, "nanos": 0}, {"secs": 2, "nanos": 0}])
        );
    }
}
