//! `validate` with `on_incomplete`, and `step_validate`.

use std::time::Duration;

use super::{Fields, Lowerer};
use crate::ast::{
    Command, OnIncomplete, Step, StepValidate, SuccessCriteria, Template, Validate, ValidationCheck,
};
use crate::diagnostics::{Code, Diagnostic, Fix};
use crate::shapes;
use crate::syntax::{Entry, Node};

impl Lowerer<'_> {
    /// A command written inline in `validate` / `on_incomplete`: `shell`, `claude` or `commands`.
    fn inline_commands(&mut self, fields: &Fields<'_>, what: &str) -> Vec<Step> {
        let mut present: Vec<(&str, &Entry)> = Vec::new();
        for key in ["shell", "claude", "command", "commands"] {
            if let Some(e) = fields.entry(key) {
                present.push((key, e));
            }
        }
        if let [(first, a), (second, b), ..] = present.as_slice() {
            self.push(
                Diagnostic::new(
                    Code::MultipleCommands,
                    format!("{what} has both `{first}` and `{second}`"),
                )
                .with_primary(b.key.span, "second command")
                .with_label(a.key.span, "first command")
                .with_help("keep one; list several steps under `commands:`"),
            );
        }
        let Some((key, entry)) = present.first() else {
            return Vec::new();
        };
        match *key {
            "commands" => self.handler_commands(&entry.value, &format!("{what}.commands")),
            "claude" => self
                .claude_command(&entry.value)
                .map(|(t, settings)| {
                    let mut step = Step::new(entry.value.span, Command::Claude(t));
                    step.claude = settings;
                    vec![step]
                })
                .unwrap_or_default(),
            _ => {
                if *key == "command" {
                    let fix = (present.len() == 1).then(|| {
                        Fix::replace("rename `command` to `shell`", entry.key.span, "shell")
                    });
                    self.deprecated_fixed(
                        entry.key.span,
                        "`command` is a deprecated spelling of `shell`",
                        "write `shell:` instead",
                        fix,
                    );
                }
                self.shell_template(&entry.value, "`shell`")
                    .map(|t| vec![Step::new(entry.value.span, Command::Shell(t))])
                    .unwrap_or_default()
            }
        }
    }

    pub(super) fn validate(&mut self, node: &Node) -> Option<Validate> {
        let mut out = Validate {
            span: node.span,
            commands: Vec::new(),
            result_file: None,
            threshold: 100.0,
            timeout: None,
            expected_schema: None,
            on_incomplete: None,
        };
        if node.as_seq().is_some() {
            out.commands = self.handler_commands(node, "`validate`");
            return Some(out);
        }
        let fields = self.fields(node, "`validate`", &shapes::VALIDATE)?;
        out.commands = self.inline_commands(&fields, "`validate`");
        out.result_file = fields.template(self, "result_file");
        if out.commands.is_empty() && out.result_file.is_none() {
            self.missing(
                fields.entry("on_incomplete").map_or(node.span, |e| e.key.span),
                "`validate`",
                "shell",
                "add `shell:`, `claude:` or `commands:` that check the work, or `result_file:` that the step writes",
            );
        }
        if let Some(t) = fields.number(self, "threshold", 0.0, 100.0) {
            out.threshold = t.value;
        }
        out.timeout = fields.duration(self, "timeout");
        out.expected_schema = fields.node("expected_schema").map(Node::to_json);
        if let Some(n) = fields.node("on_incomplete") {
            out.on_incomplete = self.on_incomplete(n);
        }
        Some(out)
    }

    fn on_incomplete(&mut self, node: &Node) -> Option<OnIncomplete> {
        let mut out = OnIncomplete {
            commands: Vec::new(),
            max_attempts: 2,
            fail_workflow: true,
            commit_required: false,
            prompt: None,
        };
        if node.as_seq().is_some() {
            out.commands = self.handler_commands(node, "`on_incomplete`");
            return Some(out);
        }
        let fields = self.fields(node, "`on_incomplete`", &shapes::ON_INCOMPLETE)?;
        out.commands = self.inline_commands(&fields, "`on_incomplete`");
        if out.commands.is_empty() && !fields.has("prompt") {
            self.missing(
                node.span,
                "`on_incomplete`",
                "claude",
                "add `claude:`, `shell:` or `commands:` that complete the work",
            );
        }
        if let Some(n) = fields.attempts(self, "max_attempts") {
            out.max_attempts = n.value;
        }
        out.fail_workflow = fields.flag(self, "fail_workflow", true);
        out.commit_required = fields.flag(self, "commit_required", false);
        out.prompt = fields.template(self, "prompt");
        Some(out)
    }

    pub(super) fn step_validate(&mut self, fields: &Fields<'_>, step: &mut Step) {
        let Some(node) = fields.node("step_validate") else {
            for key in [
                "skip_validation",
                "validation_timeout",
                "ignore_validation_failure",
            ] {
                if let Some(e) = fields.entry(key) {
                    self.no_effect(
                        e,
                        "it configures `step_validate` and this step has none",
                        "add `step_validate:` or remove it",
                    );
                }
            }
            return;
        };
        let mut out = StepValidate {
            span: node.span,
            checks: Vec::new(),
            success_criteria: SuccessCriteria::All,
            max_attempts: 1,
            retry_delay: Duration::from_secs(5),
            skip: fields.flag(self, "skip_validation", false),
            timeout: fields.duration(self, "validation_timeout"),
            ignore_failure: fields.flag(self, "ignore_validation_failure", false),
        };
        let check_of = |text: Template| ValidationCheck {
            command: text,
            claude: false,
            expect_output: None,
            expect_exit_code: 0,
        };
        if node.as_map().is_none() {
            out.checks = self
                .template_list(node, "`step_validate`")
                .into_iter()
                .map(check_of)
                .collect();
            step.step_validate = Some(out);
            return;
        }
        let Some(f) = self.fields(node, "`step_validate`", &shapes::STEP_VALIDATE) else {
            return;
        };
        if let Some(list) = f.node("commands") {
            for item in list.as_seq().unwrap_or_default() {
                if item.as_map().is_none() {
                    out.checks
                        .extend(self.template(item, "a validation command").map(check_of));
                    continue;
                }
                let Some(c) =
                    self.fields(item, "a validation command", &shapes::VALIDATION_COMMAND)
                else {
                    continue;
                };
                let Some(command) =
                    c.require(self, "command", "add `command: \"...\"`", Lowerer::template)
                else {
                    continue;
                };
                let expect_output = c.string(self, "expect_output").and_then(|p| self.regex(p));
                let claude = c.choice_or(
                    self,
                    "command_type",
                    &[("shell", false), ("claude", true)],
                    false,
                );
                let expect_exit_code = c
                    .integer(self, "expect_exit_code", 0, 255)
                    .map_or(0, |n| i32::try_from(n.value).unwrap_or(0));
                out.checks.push(ValidationCheck {
                    command,
                    claude,
                    expect_output,
                    expect_exit_code,
                });
            }
            if list.as_seq().is_none() {
                self.wrong_type(list, "`step_validate.commands`", "a list of commands");
            }
        }
        if let Some(n) = f.node("success_criteria") {
            out.success_criteria = self.success_criteria(n).unwrap_or(SuccessCriteria::All);
        }
        if let Some(n) = f.attempts(self, "max_attempts") {
            out.max_attempts = n.value;
        }
        if let Some(d) = f.duration(self, "retry_delay") {
            out.retry_delay = d.value;
        }
        step.step_validate = Some(out);
    }

    fn success_criteria(&mut self, node: &Node) -> Option<SuccessCriteria> {
        if node.as_map().is_some() {
            let f = self.fields(node, "`success_criteria`", &shapes::AT_LEAST)?;
            let n = &f.aliased(self, "atleast", "at_least")?.value;
            return self
                .count(n, "`at_least`", 1)
                .map(|n| SuccessCriteria::AtLeast(n.value));
        }
        self.choice(
            node,
            "`success_criteria`",
            &[("all", SuccessCriteria::All), ("any", SuccessCriteria::Any)],
        )
        .map(|c| c.value)
    }
}
