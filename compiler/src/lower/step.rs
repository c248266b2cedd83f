//! Steps, in every context, and the per-step structures: `on_failure`, `retry_config`,
//! `validate`, `step_validate`, captures, `write_file` and `foreach`.

use super::values::MAX_ATTEMPTS;
use super::{Fields, Lowerer, one_of};
use crate::ast::{
    Backoff, Capture, CaptureFormat, CaptureStreams, ClaudeSettings, Command, CommitConfig, EnvVar,
    ExitCodeHandler, Foreach, ForeachInput, Matcher, OnFailure, OnFailureForm, OnIncomplete,
    RetryConfig, RetryExhausted, Step, StepOutput, StepValidate, Strategy, SuccessCriteria,
    Template, Validate, ValidationCheck, WriteFile, WriteFormat,
};
use crate::diagnostics::{Code, Diagnostic, Edit, Fix};
use crate::shapes;
use crate::source::{Span, Spanned};
use crate::syntax::{Entry, Node, NodeKind, Scalar};
use std::time::Duration;

pub(crate) const COMMAND_KINDS: &[&str] = &[
    "shell",
    "claude",
    "write_file",
    "foreach",
    "test",
    "command",
];

/// Where a step sits, for the few keys whose meaning depends on it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Ctx {
    /// A command of a handler list, where `continue_on_error` moves on to the next command.
    pub(crate) handler_command: bool,
}

impl Lowerer<'_> {
    /// A list of steps.
    pub(crate) fn steps(&mut self, node: &Node, what: &str, ctx: Ctx) -> Vec<Step> {
        let Some(items) = node.as_seq() else {
            if node.is_null() {
                return Vec::new();
            }
            self.wrong_type(node, what, "a list of steps");
            return Vec::new();
        };
        items
            .iter()
            .filter_map(|item| self.step(item, ctx))
            .collect()
    }

    /// A phase's steps: a list, or the deprecated `{commands: [...]}` form.
    pub(crate) fn phase_steps(&mut self, node: &Node, what: &str) -> Vec<Step> {
        if node.as_map().is_some() {
            let Some(fields) = self.fields(node, what, &shapes::PHASE_COMMANDS) else {
                return Vec::new();
            };
            let Some(entry) = fields.entry("commands") else {
                self.missing(
                    node.span,
                    what,
                    "commands",
                    "list the steps directly under the phase",
                );
                return Vec::new();
            };
            let fix = self.unnest_commands(node, entry);
            self.deprecated_fixed(
                entry.key.span,
                &format!("nested `commands:` under {what} is deprecated"),
                &format!("list the steps directly under {what}"),
                fix,
            );
            return self.steps(&entry.value, what, Ctx::default());
        }
        self.steps(node, what, Ctx::default())
    }

    /// The fix of a nested `commands:` that is the phase's only key, on a line of its own,
    /// above a block list: deleting its line leaves the list directly under the phase.
    fn unnest_commands(&self, phase: &Node, entry: &Entry) -> Option<Fix> {
        if phase.as_map()?.len() != 1 || entry.value.as_seq().is_none() {
            return None;
        }
        let text = self.text;
        let key_start = entry.key.span.start as usize;
        let line_start = text.get(..key_start)?.rfind('\n').map_or(0, |i| i + 1);
        let after = text.get(entry.key.span.end as usize..)?;
        let newline = after.find('\n')?;
        let tail = after.get(..newline)?.trim();
        let value_start = entry.value.span.start as usize;
        let line_end = entry.key.span.end as usize + newline + 1;
        let block = text.get(line_start..key_start)?.trim().is_empty()
            && tail == ":"
            && value_start >= line_end
            && text.get(value_start..)?.starts_with('-');
        block.then(|| {
            Fix::replace(
                "list the steps directly under the phase",
                Span::new(line_start, line_end),
                "",
            )
        })
    }

    /// One step. A mapping with both `shell` and `claude` is an error here; handler positions
    /// split it with [`Lowerer::handler_steps`].
    pub(crate) fn step(&mut self, node: &Node, ctx: Ctx) -> Option<Step> {
        match node.scalar() {
            Some(Scalar::Str(text)) => {
                // A plain string step is a Claude command, upstream's legacy form.
                let _ = text;
                let command = self
                    .template(node, "a step")
                    .map_or(Command::Invalid, Command::Claude);
                return Some(Step::new(node.span, command));
            }
            Some(_) => {
                self.wrong_type(
                    node,
                    "a step",
                    "a mapping such as `shell: \"make\"` or a command string",
                );
                return None;
            }
            None => {}
        }
        let fields = self.fields(node, "a step", &shapes::STEP)?;
        // A step whose command is wrong still has its other fields checked.
        let (command, claude) = self
            .command(&fields, node)
            .unwrap_or((Command::Invalid, None));
        let mut step = Step::new(node.span, command);
        step.claude = claude;
        self.step_fields(&fields, &mut step, ctx);
        Some(step)
    }

    /// Steps in a handler position (`on_success`, `on_exit_code`): a step, a list of steps, or a
    /// mapping with both `shell` and `claude`, which runs the shell command and then Claude.
    pub(crate) fn handler_steps(&mut self, node: &Node, what: &str) -> Vec<Step> {
        if node.as_seq().is_some() {
            return self.steps(node, what, Ctx::default());
        }
        if let Some(fields) = self.peek(node, &shapes::STEP) {
            let has = |k: &str| fields.has(k);
            let others = COMMAND_KINDS
                .iter()
                .filter(|k| !matches!(**k, "shell" | "claude"))
                .any(|k| has(k));
            if has("shell") && has("claude") && !others {
                // The shell step carries the mapping's other fields (and their diagnostics,
                // once); the Claude step that follows is the command alone.
                let claude_only = keep_keys(node, &["claude"]);
                return [without_key(node, "claude"), claude_only]
                    .iter()
                    .filter_map(|n| self.step(n, Ctx::default()))
                    .collect();
            }
        }
        self.step(node, Ctx::default()).into_iter().collect()
    }

    /// The step's command, and a `claude` command's own settings.
    fn command(
        &mut self,
        fields: &Fields<'_>,
        node: &Node,
    ) -> Option<(Command, Option<ClaudeSettings>)> {
        for removed in ["analyze", "goal_seek"] {
            if let Some(entry) = fields.entry(removed) {
                let help = if removed == "analyze" {
                    "remove the step; analysis was removed in Prodigy 0.3, run an analysis tool with `shell:` instead"
                } else {
                    "replace it with a step that has `validate:` and `on_incomplete:`, which loop until a threshold is met"
                };
                self.push(
                    Diagnostic::new(
                        Code::RemovedFeature,
                        format!("`{removed}` steps were removed"),
                    )
                    .with_primary(entry.key.span, format!("`{removed}` no longer exists"))
                    .with_help(help),
                );
                return None;
            }
        }
        let kinds: Vec<(&str, &Entry)> = COMMAND_KINDS
            .iter()
            .filter_map(|k| fields.entry(k).map(|e| (*k, e)))
            .collect();
        match kinds.as_slice() {
            [] => {
                if let Some(name) = fields.node("name") {
                    return self.legacy_named(fields, name).map(|c| (c, None));
                }
                let at = node
                    .as_map()
                    .and_then(|m| m.first())
                    .map_or(node.span, |e| e.key.span);
                self.push(
                    Diagnostic::new(Code::NoCommand, "a step needs a command")
                        .with_primary(at, "this step runs nothing")
                        .with_help(format!("add one of {}", one_of(&COMMAND_KINDS[..5]))),
                );
                None
            }
            [("claude", entry)] => self
                .claude_command(&entry.value)
                .map(|(t, settings)| (Command::Claude(t), settings)),
            [(kind, entry)] => self.command_of(kind, entry, fields).map(|c| (c, None)),
            [(first, first_entry), (second, second_entry), ..] => {
                self.push(
                    Diagnostic::new(
                        Code::MultipleCommands,
                        format!("a step has both `{first}` and `{second}`"),
                    )
                    .with_primary(second_entry.key.span, "second command")
                    .with_label(first_entry.key.span, "first command")
                    .with_help("split them into two steps; each step runs exactly one command"),
                );
                None
            }
        }
    }

    fn command_of(&mut self, kind: &str, entry: &Entry, fields: &Fields<'_>) -> Option<Command> {
        let value = &entry.value;
        Some(match kind {
            "shell" => Command::Shell(self.template(value, "`shell`")?),
            "claude" => Command::Claude(self.claude_command(value)?.0),
            "command" => {
                let fix = fields.entry("claude").is_none().then(|| {
                    Fix::replace("rename `command` to `claude`", entry.key.span, "claude")
                });
                self.deprecated_fixed(
                    entry.key.span,
                    "`command` is a deprecated spelling of `claude`",
                    "write `claude:` instead",
                    fix,
                );
                Command::Claude(self.template(value, "`command`")?)
            }
            "write_file" => Command::WriteFile(self.write_file(value)?),
            "foreach" => Command::Foreach(Box::new(self.foreach(value, fields)?)),
            // `test` is rewritten in `step_fields`, where its `on_failure` lands on the step.
            _ => {
                self.deprecated(
                    entry.key.span,
                    "`test` steps are deprecated",
                    "write `shell:` with an `on_failure:` handler instead",
                );
                let test = self.fields(value, "`test`", &shapes::TEST)?.within("test");
                Command::Shell(test.require(
                    self,
                    "command",
                    "add `command: \"cargo test\"`",
                    Lowerer::template,
                )?)
            }
        })
    }

    /// A `claude` command: its prompt, written alone or as `{prompt, model, ...}` with the
    /// call's own settings.
    pub(crate) fn claude_command(
        &mut self,
        node: &Node,
    ) -> Option<(Template, Option<ClaudeSettings>)> {
        if node.as_map().is_none() {
            return self.template(node, "`claude`").map(|t| (t, None));
        }
        let fields = self.fields(node, "`claude`", &shapes::CLAUDE_STEP)?;
        let settings = self.claude_settings(&fields);
        let prompt = fields.within("claude").require(
            self,
            "prompt",
            "add `prompt: \"/fix ${item}\"` with the prompt or slash command",
            Lowerer::template,
        )?;
        Some((prompt, Some(settings)))
    }

    /// The settings of a Claude call, from a mapping already checked against its shape.
    pub(crate) fn claude_settings(&mut self, fields: &Fields<'_>) -> ClaudeSettings {
        let text = |lw: &mut Self, key: &str| fields.string(lw, key).map(|s| s.value);
        let list = |lw: &mut Self, key: &str| {
            fields
                .strings(lw, key)
                .map(|l| l.into_iter().map(|s| s.value).collect::<Vec<_>>())
        };
        let modes: Vec<(&str, &str)> = crate::ast::PERMISSION_MODES
            .iter()
            .map(|m| (*m, *m))
            .collect();
        ClaudeSettings {
            model: text(self, "model"),
            max_turns: fields
                .integer(self, "max_turns", 1, i64::MAX)
                .map(|n| u32::try_from(n.value).unwrap_or(u32::MAX)),
            allowed_tools: list(self, "allowed_tools"),
            disallowed_tools: list(self, "disallowed_tools"),
            append_system_prompt: text(self, "append_system_prompt"),
            permission_mode: fields
                .choice(self, "permission_mode", &modes)
                .map(|m| m.value.to_owned()),
            max_budget_usd: fields
                .number(self, "max_budget_usd", 0.0, f64::MAX)
                .and_then(|budget| {
                    if budget.value > 0.0 {
                        return Some(budget.value);
                    }
                    self.push(
                        Diagnostic::new(Code::OutOfRange, "`max_budget_usd` must be above 0")
                            .with_primary(budget.span, "a budget of 0 allows no call at all")
                            .with_help(
                                "give the most the call may spend in US dollars, such as `2.5`",
                            ),
                    );
                    None
                }),
            fallback_model: text(self, "fallback_model"),
            mcp_config: list(self, "mcp_config"),
            add_dirs: list(self, "add_dirs"),
        }
    }

    /// `{name: X, args, options}`: the Claude command `/X args --option value`.
    fn legacy_named(&mut self, fields: &Fields<'_>, name: &Node) -> Option<Command> {
        let name = self.string(name, "`name`")?;
        let mut text = if name.value.starts_with('/') {
            name.value.clone()
        } else {
            format!("/{}", name.value)
        };
        if let Some(args) = fields.strings(self, "args") {
            for arg in args {
                text.push(' ');
                text.push_str(&arg.value);
            }
        }
        if let Some(options) = fields.node("options") {
            for (key, value) in options
                .as_map()
                .unwrap_or_default()
                .iter()
                .filter_map(|e| Some((e.key.text()?, &e.value)))
            {
                match value.scalar() {
                    Some(Scalar::Bool(true)) => {
                        text.push_str(" --");
                        text.push_str(key);
                    }
                    Some(Scalar::Bool(false) | Scalar::Null) => {}
                    _ => {
                        if let Some(v) = self.string(value, "an option value") {
                            text.push_str(" --");
                            text.push_str(key);
                            text.push(' ');
                            text.push_str(&v.value);
                        }
                    }
                }
            }
            if options.as_map().is_none() {
                self.wrong_type(options, "`options`", "a mapping of option names to values");
            }
        }
        self.synthesized(text, name.span).map(Command::Claude)
    }

    fn step_fields(&mut self, fields: &Fields<'_>, step: &mut Step, ctx: Ctx) {
        let legacy_named = !COMMAND_KINDS.iter().any(|k| fields.has(k));
        if let Some(id) = fields.string(self, "id") {
            self.step_id(&id);
            step.id = Some(id);
        }
        if !legacy_named {
            step.name = fields.string(self, "name");
            for key in ["args", "options"] {
                if let Some(entry) = fields.entry(key) {
                    self.no_effect(
                        entry,
                        "only the legacy `name:` form appends `args` and `options` to its command",
                        "put the arguments in the command text, which runs as written",
                    );
                }
            }
        }
        self.flat_foreach_keys(fields);
        step.description = fields.string(self, "description");
        step.timeout = fields.duration(self, "timeout");
        step.working_dir = fields.template(self, "working_dir");
        if let Some(env) = fields.node("env") {
            step.env = self.env_map(env, "step `env`");
        }
        step.clear_env = fields.flag(self, "clear_env", false);
        // `temporary` asks for what is already the rule: a step's env never outlives the step.
        if let Some(e) = fields.entry("temporary")
            && fields.boolean(self, "temporary") == Some(false)
        {
            self.no_effect(
                e,
                "a step's `env` never outlives the step",
                "remove `temporary: false`; step environments are always temporary",
            );
        }
        step.when = fields.condition(self, "when");
        self.captures(fields, step);
        if let Some(e) = fields.aliased(self, "output_file", "output") {
            step.output_file = self.template(&e.value, "`output_file`");
            if let Some(t) = &step.output_file
                && leaves_project(&t.value)
            {
                self.push(
                    Diagnostic::new(
                        Code::OutputFileEscapes,
                        "`output_file` paths must stay inside the project",
                    )
                    .with_primary(t.span, "this path leaves the project")
                    .with_help(
                        "use a path relative to the project without `..` above it, such as `logs/output.txt`",
                    ),
                );
            }
        }
        if let Some(steps) = fields.read(self, "on_success", |lw, n, what| {
            Some(lw.handler_steps(n, what))
        }) {
            step.on_success = steps;
        }
        if let Some(node) = fields.node("on_exit_code") {
            step.on_exit_code = self.exit_codes(node);
        }
        if let Some(e) = fields.aliased(self, "retry_config", "retry") {
            step.retry = self.retry_config(&e.value);
        }
        step.commit_required = fields.flag(self, "commit_required", false);
        step.auto_commit = fields.flag(self, "auto_commit", false);
        step.commit_config = fields
            .node("commit_config")
            .and_then(|n| self.commit_config(n));
        if let Some(e) = fields.entry("commit_config").filter(|_| !step.auto_commit) {
            self.no_effect(
                e,
                "`commit_config` shapes the commits of `auto_commit`",
                "add `auto_commit: true`",
            );
        }
        step.validate = fields.node("validate").and_then(|n| self.validate(n));
        self.step_validate(fields, step);
        if let Some(outputs) = fields.node("outputs") {
            step.outputs = self.outputs(outputs);
            if step.id.is_none() && !step.outputs.is_empty() {
                self.missing(
                    fields.entry("outputs").map_or(step.span, |e| e.key.span),
                    "a step with `outputs`",
                    "id",
                    "add `id:`; outputs are read as `${ID.NAME}`",
                );
            }
        }
        if let Some(e) = fields.entry("analysis") {
            self.no_effect(
                e,
                "analysis caching was removed in Prodigy 0.3",
                "remove `analysis:`",
            );
        }
        self.failure_fields(fields, step, ctx);
        if let Some(metadata) = fields.node("metadata") {
            self.metadata(metadata, step);
        }
    }

    /// `on_failure` and the keys that stand in for it.
    fn failure_fields(&mut self, fields: &Fields<'_>, step: &mut Step, ctx: Ctx) {
        // Which key decided what a failure does, for messages about the keys that come after.
        let mut decided_by: Option<&str> = None;
        // `test: {command, on_failure}` carries its handler inside.
        let test_handler = fields
            .node("test")
            .and_then(|test| self.peek(test, &shapes::TEST))
            .and_then(|test| test.entry("on_failure"));
        if let Some(handler) = test_handler {
            step.on_failure = self.on_failure(&handler.value, 3);
            decided_by = Some("test.on_failure");
        }
        if let Some(e) = fields.entry("on_failure") {
            if let Some(inner) = test_handler {
                self.duplicate(
                    e.key.span,
                    inner.key.span,
                    "on_failure",
                    "the step",
                    "`test`",
                );
            }
            step.on_failure = self.on_failure(&e.value, 1);
            decided_by = Some("on_failure");
        }
        // Keys that mean `on_failure: true`.
        for key in ["allow_failure", "continue_on_error"] {
            let Some(e) = fields.entry(key) else { continue };
            let value = fields.boolean(self, key) == Some(true);
            if key == "continue_on_error" && ctx.handler_command {
                step.continue_on_error = value;
                continue;
            }
            if !value {
                continue;
            }
            if let Some(first) = decided_by {
                self.no_effect(
                    e,
                    &format!("`{first}` already decides what a failure does"),
                    &format!("remove `{key}`, or `{first}`"),
                );
            } else {
                step.on_failure = Some(OnFailure::ignore(e.value.span));
                decided_by = Some(key);
            }
        }
        // `max_attempts` and `fail_workflow` beside `on_failure` configure it (the Error Handling guide).
        let inner_keys: Vec<&str> = fields
            .node("on_failure")
            .and_then(Node::as_map)
            .map(|m| m.iter().filter_map(|e| e.key.text()).collect())
            .unwrap_or_default();
        for key in ["max_attempts", "fail_workflow"] {
            let Some(e) = fields.entry(key) else { continue };
            let Some(on_failure) = step.on_failure.as_mut().filter(|h| !h.handler.is_empty())
            else {
                // `fail_workflow: false` on a step without a handler asks to go on after a failure.
                if key == "fail_workflow" && step.on_failure.is_none() {
                    if fields.boolean(self, key) == Some(false) {
                        step.on_failure = Some(OnFailure::ignore(e.value.span));
                    }
                    continue;
                }
                self.no_effect(
                    e,
                    "it configures an `on_failure` handler and this step has none",
                    "add an `on_failure:` handler, or use `retry_config.attempts` to retry the command",
                );
                continue;
            };
            if inner_keys.contains(&key) {
                self.no_effect(
                    e,
                    &format!("`on_failure` sets `{key}` itself"),
                    &format!("keep `{key}` inside `on_failure` only"),
                );
                continue;
            }
            if key == "max_attempts" {
                if let Some(n) = fields.attempts(self, key) {
                    on_failure.max_attempts = n.value;
                }
            } else if let Some(b) = fields.boolean(self, key) {
                on_failure.fail_workflow = b;
            }
        }
    }

    /// The legacy `metadata` block; each key that the step also sets directly is reported.
    fn metadata(&mut self, node: &Node, step: &mut Step) {
        let Some(fields) = self.fields(node, "`metadata`", &shapes::METADATA) else {
            return;
        };
        let shadowed = |lw: &mut Self, e: &Entry, field: &str| {
            lw.no_effect(
                e,
                &format!("the step sets `{field}` itself"),
                &format!("remove `metadata.{}`", e.key.text().unwrap_or_default()),
            );
        };
        if let Some(e) = fields.entry("continue_on_error")
            && fields.boolean(self, "continue_on_error") == Some(true)
        {
            if step.on_failure.is_some() {
                shadowed(self, e, "on_failure");
            } else {
                step.on_failure = Some(OnFailure::ignore(e.value.span));
            }
        }
        if let Some(e) = fields.entry("retries")
            && let Some(n) = fields.read(self, "retries", |lw, n, what| {
                lw.count_in(n, what, 0, MAX_ATTEMPTS - 1)
            })
            && n.value > 0
        {
            if step.retry.is_some() {
                shadowed(self, e, "retry_config");
            } else {
                step.retry = Some(RetryConfig {
                    attempts: n.value + 1,
                    ..RetryConfig::defaults(n.span)
                });
            }
        }
        if let Some(e) = fields.entry("timeout")
            && let Some(t) = fields.duration(self, "timeout")
        {
            if step.timeout.is_some() {
                shadowed(self, e, "timeout");
            } else {
                step.timeout = Some(t);
            }
        }
        if let Some(env) = fields.node("env") {
            for var in self.env_map(env, "`metadata.env`") {
                if let Some(own) = step.env.iter().find(|v| v.name.value == var.name.value) {
                    let own_span = own.name.span;
                    self.duplicate(
                        var.name.span,
                        own_span,
                        &var.name.value,
                        "`metadata.env`",
                        "the step's `env`",
                    );
                } else {
                    step.env.push(var);
                }
            }
        }
        if fields.flag(self, "commit_required", false) {
            step.commit_required = true;
        }
        if let Some(e) = fields.entry("analysis") {
            self.no_effect(
                e,
                "analysis caching was removed in Prodigy 0.3",
                "remove `analysis:`",
            );
        }
    }

    fn captures(&mut self, fields: &Fields<'_>, step: &mut Step) {
        let format = fields.choice(
            self,
            "capture_format",
            &[
                ("string", CaptureFormat::String),
                ("number", CaptureFormat::Number),
                ("json", CaptureFormat::Json),
                ("lines", CaptureFormat::Lines),
                ("boolean", CaptureFormat::Boolean),
            ],
        );
        let streams = fields
            .node("capture_streams")
            .and_then(|n| self.capture_streams(n));
        if let Some(name) = fields.string(self, "capture") {
            step.capture = Some(Capture {
                name,
                format: format.map_or(CaptureFormat::String, |f| f.value),
                streams: streams.unwrap_or_default(),
            });
        } else {
            for key in ["capture_format", "capture_streams"] {
                if let Some(e) = fields.entry(key).filter(|_| !fields.has("capture")) {
                    self.no_effect(
                        e,
                        "it shapes a `capture` and this step has none",
                        "add `capture: NAME`",
                    );
                }
            }
        }
        if let Some(node) = fields.node("capture_output") {
            let default_name = match step.command {
                Command::Claude(_) => "claude.output",
                _ => "shell.output",
            };
            step.capture_output = match node.scalar() {
                Some(Scalar::Bool(true)) => Some(Spanned::new(default_name.to_owned(), node.span)),
                Some(Scalar::Bool(false)) => None,
                _ => fields.string(self, "capture_output"),
            };
        }
    }

    fn capture_streams(&mut self, node: &Node) -> Option<CaptureStreams> {
        if node.as_map().is_some() {
            let fields = self.fields(node, "`capture_streams`", &shapes::CAPTURE_STREAMS)?;
            let d = CaptureStreams::default();
            return Some(CaptureStreams {
                stdout: fields.flag(self, "stdout", d.stdout),
                stderr: fields.flag(self, "stderr", d.stderr),
                exit_code: fields.flag(self, "exit_code", d.exit_code),
                success: fields.flag(self, "success", d.success),
                duration: fields.flag(self, "duration", d.duration),
            });
        }
        let base = CaptureStreams::default();
        let choices = [
            ("stdout", base),
            (
                "stderr",
                CaptureStreams {
                    stdout: false,
                    stderr: true,
                    ..base
                },
            ),
            (
                "both",
                CaptureStreams {
                    stderr: true,
                    ..base
                },
            ),
        ];
        self.choice(node, "`capture_streams`", &choices)
            .map(|c| c.value)
    }

    fn exit_codes(&mut self, node: &Node) -> Vec<ExitCodeHandler> {
        let Some(map) = node.as_map() else {
            self.wrong_type(node, "`on_exit_code`", "a mapping from exit codes to steps");
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in map {
            let code = match entry.key.scalar() {
                Some(Scalar::Int(i)) => i32::try_from(i).ok(),
                Some(Scalar::Str(s)) => s.trim().parse::<i32>().ok(),
                _ => None,
            };
            let Some(code) = code.filter(|c| (0..=255).contains(c)) else {
                self.push(
                    Diagnostic::new(
                        Code::InvalidExitCode,
                        format!("`{}` is not an exit code", entry.key.text().unwrap_or("?")),
                    )
                    .with_primary(entry.key.span, "expected a whole number from 0 to 255")
                    .with_help("key `on_exit_code` entries by exit code, such as `1:` or `127:`"),
                );
                continue;
            };
            let steps = self.handler_steps(&entry.value, "an `on_exit_code` handler");
            out.push(ExitCodeHandler {
                code: Spanned::new(code, entry.key.span),
                steps,
            });
        }
        out
    }

    /// A handler command written as a string: a leading `/` means Claude, else shell.
    fn command_string(&mut self, node: &Node, what: &str) -> Option<Step> {
        let text = self.template(node, what)?;
        let command = if text.value.trim_start().starts_with('/') {
            Command::Claude(text)
        } else {
            Command::Shell(text)
        };
        Some(Step::new(node.span, command))
    }

    /// A list of handler commands: strings or steps.
    fn handler_commands(&mut self, node: &Node, what: &str) -> Vec<Step> {
        let Some(items) = node.as_seq() else {
            self.wrong_type(node, what, "a list of commands");
            return Vec::new();
        };
        items
            .iter()
            .filter_map(|item| {
                if item.as_map().is_some() {
                    self.step(
                        item,
                        Ctx {
                            handler_command: true,
                        },
                    )
                } else {
                    self.command_string(item, what)
                }
            })
            .collect()
    }

    /// `on_failure` in all six forms. `default_attempts` is 3 for the deprecated `test:` form.
    pub(crate) fn on_failure(&mut self, node: &Node, default_attempts: u32) -> Option<OnFailure> {
        let base = OnFailure {
            span: node.span,
            form: OnFailureForm::Bool,
            handler: Vec::new(),
            fail_workflow: false,
            max_attempts: 1,
            strategy: Strategy::Recovery,
            strategy_span: None,
            handler_failure_fatal: false,
            timeout: None,
            capture: Vec::new(),
            commit_required: false,
        };
        match &node.kind {
            NodeKind::Scalar { .. } => {
                if let Some(Scalar::Bool(b)) = node.scalar() {
                    return Some(OnFailure {
                        fail_workflow: !b,
                        ..base
                    });
                }
                let step = self.command_string(node, "`on_failure`")?;
                Some(OnFailure {
                    form: OnFailureForm::Single,
                    handler: vec![step],
                    ..base
                })
            }
            NodeKind::Seq(_) => {
                let handler = self.handler_commands(node, "`on_failure`");
                Some(OnFailure {
                    form: OnFailureForm::List,
                    handler,
                    ..base
                })
            }
            NodeKind::Map(_) => {
                let detailed = self
                    .peek(node, &shapes::ON_FAILURE_DETAILED)
                    .is_some_and(|f| f.has("commands"));
                let shape = if detailed {
                    &shapes::ON_FAILURE_DETAILED
                } else {
                    &shapes::ON_FAILURE_ADVANCED
                };
                let fields = self.fields(node, "`on_failure`", shape)?;
                let mut out = OnFailure {
                    form: OnFailureForm::Advanced,
                    max_attempts: default_attempts,
                    ..base
                };
                if detailed {
                    out.form = OnFailureForm::Detailed;
                    if let Some(commands) = fields.node("commands") {
                        out.handler = self.handler_commands(commands, "`on_failure.commands`");
                    }
                } else {
                    if let Some(text) = fields.template(self, "shell") {
                        out.handler.push(Step::new(node.span, Command::Shell(text)));
                    }
                    if let Some((text, settings)) =
                        fields.node("claude").and_then(|n| self.claude_command(n))
                    {
                        let mut step = Step::new(node.span, Command::Claude(text));
                        step.claude = settings;
                        out.handler.push(step);
                    }
                }
                if let Some(e) = fields.aliased(self, "max_attempts", "max_retries")
                    && let Some(n) = self.attempts(&e.value, &fields.label("max_attempts"))
                {
                    out.max_attempts = n.value;
                }
                // Only the advanced form has `retry_original`.
                if !detailed && let Some(e) = fields.entry("retry_original") {
                    // `true` means `max_attempts: 2` when no count is given; `false` means
                    // nothing.
                    let counted = fields.has("max_attempts") || fields.has("max_retries");
                    let fix = match e.value.scalar() {
                        Some(Scalar::Bool(true)) if !counted => Some(Fix {
                            description: "write `max_attempts: 2`".into(),
                            edits: vec![
                                Edit {
                                    span: e.key.span,
                                    replacement: "max_attempts".into(),
                                },
                                Edit {
                                    span: e.value.span,
                                    replacement: "2".into(),
                                },
                            ],
                        }),
                        Some(Scalar::Bool(false)) => self
                            .entry_lines(e)
                            .map(|lines| Fix::replace("remove `retry_original: false`", lines, "")),
                        _ => None,
                    };
                    self.deprecated_fixed(
                        e.key.span,
                        "`retry_original` is deprecated",
                        "set `max_attempts: 2` or more; the command is retried after the handler",
                        fix,
                    );
                    if fields.boolean(self, "retry_original") == Some(true) {
                        out.max_attempts = out.max_attempts.max(2);
                    }
                }
                out.fail_workflow = fields.flag(self, "fail_workflow", false);
                out.handler_failure_fatal = fields.flag(self, "handler_failure_fatal", false);
                out.commit_required = fields.flag(self, "commit_required", false);
                out.timeout = fields.duration(self, "timeout");
                if let Some(n) = fields.node("capture") {
                    out.capture = self.handler_capture(n);
                }
                let choices = [
                    ("recovery", Strategy::Recovery),
                    ("fallback", Strategy::Fallback),
                    ("cleanup", Strategy::Cleanup),
                    ("custom", Strategy::Custom),
                ];
                if let Some(s) = fields.choice(self, "strategy", &choices) {
                    out.strategy = s.value;
                    out.strategy_span = Some(s.span);
                }
                if out.handler.is_empty() {
                    for key in [
                        "max_attempts",
                        "max_retries",
                        "timeout",
                        "strategy",
                        "capture",
                        "handler_failure_fatal",
                    ] {
                        if let Some(e) = fields.entry(key) {
                            self.no_effect(
                                e,
                                "this `on_failure` has no handler command",
                                "add `shell:` or `claude:` to run on failure, or use `retry_config` to retry",
                            );
                        }
                    }
                }
                Some(out)
            }
        }
    }

    /// `on_failure.capture`: a name, a list of names, or a mapping whose keys are the names
    /// (the Error Handling guide writes `error_log: "handler_output"`).
    fn handler_capture(&mut self, node: &Node) -> Vec<Spanned<String>> {
        let Some(map) = node.as_map() else {
            return self.string_list(node, "`capture`");
        };
        map.iter()
            .filter_map(|e| {
                self.string(&e.value, "a capture source")?;
                self.string(&e.key, "a variable name")
            })
            .collect()
    }

    /// Command-level `retry_config`.
    pub(crate) fn retry_config(&mut self, node: &Node) -> Option<RetryConfig> {
        let fields = self.fields(node, "`retry_config`", &shapes::RETRY_CONFIG)?;
        let mut out = RetryConfig::defaults(node.span);
        let attempts = fields.aliased(self, "attempts", "max_attempts");
        if let Some(n) = attempts.and_then(|e| self.attempts(&e.value, &fields.label("attempts"))) {
            out.attempts = n.value;
        }
        if let Some(d) = fields.delay(self, "initial_delay") {
            out.initial_delay = d.value;
        }
        if let Some(d) = fields.delay(self, "max_delay") {
            out.max_delay = d.value;
        }
        if let Some(b) = fields.node("backoff")
            && let Some((backoff, max_delay)) = self.backoff(b)
        {
            out.backoff = backoff;
            if let Some(d) = max_delay {
                if let Some(outer) = fields.entry("max_delay") {
                    self.duplicate(
                        d.span,
                        outer.key.span,
                        "max_delay",
                        "`backoff`",
                        "`retry_config`",
                    );
                }
                out.max_delay = d.value;
            }
        }
        out.jitter = fields.flag(self, "jitter", false);
        if let Some(f) = fields.number(self, "jitter_factor", 0.0, 1.0) {
            out.jitter_factor = f.value;
        }
        if let Some(e) = fields.entry("jitter_factor").filter(|_| !out.jitter) {
            self.no_effect(
                e,
                "jitter is off",
                "add `jitter: true`, or remove `jitter_factor`",
            );
        }
        if let Some(list) = fields.node("retry_on") {
            out.retry_on = self.matchers(list);
        }
        out.retry_budget = fields.delay(self, "retry_budget").map(|d| d.value);
        if let Some(n) = fields.node("on_failure")
            && let Some(action) = self.retry_exhausted(n)
        {
            out.on_failure = action;
        }
        Some(out)
    }

    /// A backoff in any of its spellings: `exponential`, `{exponential: {base: 2}}`,
    /// `{type: exponential, base: 2}`, or `!exponential {base: 2}`.
    /// Returns the strategy and a `max_delay` given inside it.
    pub(crate) fn backoff(&mut self, node: &Node) -> Option<(Backoff, Option<Spanned<Duration>>)> {
        const KINDS: &[&str] = shapes::BACKOFF_KINDS;
        let (kind, kind_node, params): (String, &Node, Option<Node>) = if let Some(tag) = &node.tag
        {
            (tag.clone(), node, (!node.is_null()).then(|| node.clone()))
        } else if let Some(text) = node.text() {
            (text.trim().to_owned(), node, None)
        } else if let Some(map) = node.as_map() {
            if let Some(type_entry) = self
                .peek(node, &shapes::BACKOFF_TYPED)
                .and_then(|f| f.entry("type"))
            {
                let Some(kind) = type_entry.value.text() else {
                    self.wrong_type(&type_entry.value, "`backoff.type`", &one_of(KINDS));
                    return None;
                };
                (
                    kind.trim().to_owned(),
                    &type_entry.value,
                    Some(without_key(node, "type")),
                )
            } else if let [single] = map {
                let kind = single.key.text().unwrap_or_default().to_owned();
                (
                    kind,
                    &single.key,
                    (!single.value.is_null()).then(|| single.value.clone()),
                )
            } else {
                self.wrong_type(
                    node,
                    "`backoff`",
                    "a strategy name such as `exponential`, `{exponential: {base: 2}}` or `{type: exponential, base: 2}`",
                );
                return None;
            }
        } else {
            self.wrong_type(node, "`backoff`", "a strategy name or mapping");
            return None;
        };
        let Some(kind) = KINDS.iter().find(|k| k.eq_ignore_ascii_case(&kind)) else {
            self.unknown_variant(kind_node, "backoff strategy", &kind, KINDS);
            return None;
        };
        // The parameters of each strategy are the shape `backoff_by_name` gives its key.
        let Some(shapes::Key {
            ty: shapes::Ty::Object(param_shape),
            ..
        }) = shapes::BACKOFF_BY_NAME.key(kind)
        else {
            self.unknown_variant(kind_node, "backoff strategy", kind, KINDS);
            return None;
        };
        let what = format!("`{kind}` backoff");
        let fields = match &params {
            Some(p) => Some(self.fields(p, &what, param_shape)?),
            None => None,
        };
        let get = |k: &str| fields.as_ref().and_then(|f| f.node(k));
        let dur = |lw: &mut Self, k: &str| {
            fields
                .as_ref()
                .and_then(|f| f.delay(lw, k))
                .map(|d| d.value)
        };
        let max_delay = fields.as_ref().and_then(|f| f.delay(self, "max_delay"));
        let backoff = match *kind {
            "fixed" => Backoff::Fixed {
                delay: dur(self, "delay"),
            },
            "linear" => Backoff::Linear {
                initial: dur(self, "initial"),
                increment: dur(self, "increment"),
            },
            "exponential" => {
                let factor = match (&fields, get("base"), get("multiplier")) {
                    (Some(f), Some(_), Some(_)) => {
                        f.aliased(self, "base", "multiplier").map(|e| &e.value)
                    }
                    (_, base, multiplier) => base.or(multiplier),
                };
                let base = factor
                    .and_then(|n| self.number(n, "`base`", 1.0, f64::MAX))
                    .map_or(2.0, |b| b.value);
                Backoff::Exponential {
                    initial: dur(self, "initial"),
                    base,
                }
            }
            "fibonacci" => Backoff::Fibonacci {
                initial: dur(self, "initial"),
            },
            _ => {
                let delays = match get("delays") {
                    Some(list) if list.as_seq().is_some() => list
                        .as_seq()
                        .unwrap_or_default()
                        .iter()
                        .filter_map(|n| self.delay(n, "a custom delay").map(|d| d.value))
                        .collect(),
                    Some(other) => {
                        self.wrong_type(other, "`delays`", "a list of durations");
                        Vec::new()
                    }
                    None => Vec::new(),
                };
                Backoff::Custom { delays }
            }
        };
        Some((backoff, max_delay))
    }

    fn matchers(&mut self, node: &Node) -> Vec<Matcher> {
        let items: Vec<&Node> = match node.as_seq() {
            Some(items) => items.iter().collect(),
            None => vec![node],
        };
        let named = [
            ("network", Matcher::Network),
            ("timeout", Matcher::Timeout),
            ("server_error", Matcher::ServerError),
            ("rate_limit", Matcher::RateLimit),
            ("overloaded", Matcher::Overloaded),
            ("auth", Matcher::Auth),
        ];
        let mut out = Vec::new();
        for item in items {
            let pattern = if item.tag.as_deref() == Some("pattern") {
                self.string(item, "`pattern`")
            } else if item.as_map().is_some() {
                self.fields(item, "a `retry_on` matcher", &shapes::RETRY_ON_PATTERN)
                    .and_then(|f| f.string(self, "pattern"))
            } else {
                if let Some(m) = self.choice(item, "`retry_on` matcher", &named) {
                    out.push(m.value);
                }
                continue;
            };
            if let Some(p) = pattern
                && self.regex(&p)
            {
                out.push(Matcher::Pattern(p));
            }
        }
        out
    }

    /// Checks that a regular expression compiles.
    pub(crate) fn regex(&mut self, pattern: &Spanned<String>) -> bool {
        match prodigy_grammar::compile_regex(&pattern.value) {
            Ok(_) => true,
            Err(why) => {
                self.push(
                    Diagnostic::new(Code::InvalidRegex, "invalid regular expression")
                        .with_primary(pattern.span, why)
                        .with_help("fix the pattern; escape literal characters such as `(` or `[` with `\\`"),
                );
                false
            }
        }
    }

    fn retry_exhausted(&mut self, node: &Node) -> Option<RetryExhausted> {
        let fallback_of = |lw: &mut Self, value: &Node| -> Option<RetryExhausted> {
            if value.as_map().is_some() {
                let f = lw.fields(value, "`fallback`", &shapes::FALLBACK)?;
                f.within("fallback")
                    .require(lw, "command", "add `command: \"...\"`", Lowerer::template)
                    .map(RetryExhausted::Fallback)
            } else {
                lw.template(value, "`fallback`")
                    .map(RetryExhausted::Fallback)
            }
        };
        if node.tag.as_deref() == Some("fallback") {
            return fallback_of(self, node);
        }
        if let Some(map) = node.as_map() {
            let f = self.fields(node, "`retry_config.on_failure`", &shapes::RETRY_EXHAUSTED)?;
            let _ = map;
            let value = f.required(
                self,
                "fallback",
                "write `stop`, `continue` or `{fallback: {command: \"...\"}}`",
            )?;
            return fallback_of(self, value);
        }
        self.choice(
            node,
            "`retry_config.on_failure`",
            &[
                ("stop", RetryExhausted::Stop),
                ("continue", RetryExhausted::Continue),
            ],
        )
        .map(|c| c.value)
    }

    fn commit_config(&mut self, node: &Node) -> Option<CommitConfig> {
        let fields = self.fields(node, "`commit_config`", &shapes::COMMIT_CONFIG)?;
        let message_pattern = fields.string(self, "message_pattern");
        if let Some(p) = &message_pattern {
            self.regex(p);
        }
        Some(CommitConfig {
            message_template: fields.template(self, "message_template"),
            message_pattern,
            sign: fields.flag(self, "sign", false),
            author: fields.template(self, "author"),
            include_files: fields.strings(self, "include_files").unwrap_or_default(),
            exclude_files: fields.strings(self, "exclude_files").unwrap_or_default(),
            squash: fields.flag(self, "squash", false),
        })
    }

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
                self.template(&entry.value, "`shell`")
                    .map(|t| vec![Step::new(entry.value.span, Command::Shell(t))])
                    .unwrap_or_default()
            }
        }
    }

    fn validate(&mut self, node: &Node) -> Option<Validate> {
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

    fn step_validate(&mut self, fields: &Fields<'_>, step: &mut Step) {
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
                let expect_output = c.string(self, "expect_output");
                if let Some(p) = &expect_output {
                    self.regex(p);
                }
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

    fn outputs(&mut self, node: &Node) -> Vec<StepOutput> {
        let Some(map) = node.as_map() else {
            self.wrong_type(
                node,
                "`outputs`",
                "a mapping of names to `{file_pattern: GLOB}`",
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in map {
            let Some(name) = self.string(&entry.key, "an output name") else {
                continue;
            };
            let Some(f) = self.fields(&entry.value, "an output", &shapes::OUTPUT) else {
                continue;
            };
            let Some(pattern) = f.require(
                self,
                "file_pattern",
                "add `file_pattern: \"*.md\"`",
                Lowerer::string,
            ) else {
                continue;
            };
            out.push(StepOutput {
                name,
                file_pattern: pattern,
            });
        }
        out
    }

    fn write_file(&mut self, node: &Node) -> Option<WriteFile> {
        let fields = self.fields(node, "`write_file`", &shapes::WRITE_FILE)?;
        let path = fields.require(
            self,
            "path",
            "add `path: \"out/result.json\"`",
            Lowerer::template,
        );
        let content = fields.require(self, "content", "add `content: \"...\"`", Lowerer::template);
        if let Some(p) = &path {
            let escapes =
                p.value.starts_with('/') || p.value.split(['/', '\\']).any(|part| part == "..");
            if escapes {
                self.push(
                    Diagnostic::new(
                        Code::PathEscapes,
                        "`write_file` paths must stay inside the working directory",
                    )
                    .with_primary(p.span, "this path leaves the working directory")
                    .with_help("use a relative path without `..`, such as `out/result.json`"),
                );
            }
        }
        let format = fields.choice_or(
            self,
            "format",
            &[
                ("text", WriteFormat::Text),
                ("json", WriteFormat::Json),
                ("yaml", WriteFormat::Yaml),
            ],
            WriteFormat::Text,
        );
        let mode = fields.node("mode").and_then(|n| self.file_mode(n));
        let create_dirs = fields.flag(self, "create_dirs", false);
        Some(WriteFile {
            path: path?,
            content: content?,
            format,
            mode,
            create_dirs,
        })
    }

    fn file_mode(&mut self, node: &Node) -> Option<u32> {
        let text = node.text().unwrap_or_default().trim();
        let digits = text.strip_prefix("0o").unwrap_or(text);
        match u32::from_str_radix(digits, 8) {
            Ok(mode) if mode <= 0o7777 && !digits.is_empty() && node.as_map().is_none() => {
                Some(mode)
            }
            _ => {
                self.push(
                    Diagnostic::new(
                        Code::InvalidFileMode,
                        format!("`{text}` is not a file mode"),
                    )
                    .with_primary(node.span, "expected octal permission bits")
                    .with_help(
                        "write the mode as an octal string such as `\"0644\"` or `\"0755\"`",
                    ),
                );
                None
            }
        }
    }

    /// `do`, `parallel` and `max_items` belong to a flat `foreach` (`foreach: CMD` beside them).
    fn flat_foreach_keys(&mut self, fields: &Fields<'_>) {
        let flat = fields.node("foreach").is_some_and(|n| n.as_map().is_none());
        if flat {
            return;
        }
        for key in ["do", "parallel", "max_items"] {
            if let Some(e) = fields.entry(key) {
                let why = if fields.has("foreach") {
                    "this `foreach` is a mapping; the key belongs inside it"
                } else {
                    "it belongs to a `foreach` step"
                };
                self.no_effect(e, why, "move it under `foreach:`, or remove it");
            }
        }
    }

    fn foreach(&mut self, node: &Node, step: &Fields<'_>) -> Option<Foreach> {
        // Nested form: `foreach: {foreach|input|items, parallel, do, continue_on_error, max_items}`.
        // Flat form: `foreach: CMD|LIST` with `do`, `parallel`, ... beside it in the step.
        let nested = if node.as_map().is_some() {
            Some(self.fields(node, "`foreach`", &shapes::FOREACH)?)
        } else {
            None
        };
        // The keys of a flat `foreach` stand beside it in the step.
        let from = nested.as_ref().unwrap_or(step);
        let source = match &nested {
            None => node,
            Some(f) => {
                let sources: Vec<&Entry> = ["foreach", "input", "items"]
                    .iter()
                    .filter_map(|k| f.entry(k))
                    .collect();
                if let [first, second, ..] = sources.as_slice() {
                    let (a, b) = (
                        first.key.text().unwrap_or("?"),
                        second.key.text().unwrap_or("?"),
                    );
                    self.duplicate(
                        second.key.span,
                        first.key.span,
                        a,
                        &format!("`{b}`"),
                        "the same `foreach`",
                    );
                }
                let Some(source) = sources.first().map(|e| &e.value) else {
                    self.missing(
                        node.span,
                        "`foreach`",
                        "foreach",
                        "add `foreach:` with a command or a list of items",
                    );
                    return None;
                };
                source
            }
        };
        let input = if source.as_seq().is_some() {
            ForeachInput::List(self.template_list(source, "`foreach` items"))
        } else {
            ForeachInput::Command(self.template(source, "`foreach`")?)
        };
        let parallel = match from.node("parallel").map(Node::scalar) {
            None | Some(Some(Scalar::Bool(false))) => 1,
            Some(Some(Scalar::Bool(true))) => 10,
            Some(_) => from.u32(self, "parallel", 1).map_or(1, |c| c.value),
        };
        let Some(do_node) = from.node("do") else {
            self.missing(
                node.span,
                "`foreach`",
                "do",
                "add `do:` with the steps to run for each item",
            );
            return None;
        };
        let steps = self.steps(do_node, "`do`", Ctx::default());
        let continue_on_error = from.flag(self, "continue_on_error", false);
        let max_items = from.u64(self, "max_items", 1).map(|n| n.value);
        Some(Foreach {
            input,
            parallel,
            steps,
            continue_on_error,
            max_items,
        })
    }
}

impl Step {
    /// A step with a command and every field at its default.
    pub fn new(span: Span, command: Command) -> Self {
        Step {
            span,
            command,
            id: None,
            name: None,
            description: None,
            timeout: None,
            working_dir: None,
            env: Vec::<EnvVar>::new(),
            clear_env: false,
            when: None,
            capture: None,
            capture_output: None,
            output_file: None,
            on_success: Vec::new(),
            on_failure: None,
            on_exit_code: Vec::new(),
            retry: None,
            commit_required: false,
            auto_commit: false,
            commit_config: None,
            validate: None,
            step_validate: None,
            outputs: Vec::new(),
            continue_on_error: false,
            claude: None,
        }
    }
}

impl OnFailure {
    /// `on_failure: true`.
    pub fn ignore(span: Span) -> Self {
        OnFailure {
            span,
            form: OnFailureForm::Bool,
            handler: Vec::new(),
            fail_workflow: false,
            max_attempts: 1,
            strategy: Strategy::Recovery,
            strategy_span: None,
            handler_failure_fatal: false,
            timeout: None,
            capture: Vec::new(),
            commit_required: false,
        }
    }
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

/// A copy of a mapping node without one key.
fn keep_keys(node: &Node, keys: &[&str]) -> Node {
    let mut copy = node.clone();
    if let NodeKind::Map(entries) = &mut copy.kind {
        entries.retain(|e| e.key.text().is_some_and(|k| keys.contains(&k)));
    }
    copy
}

fn without_key(node: &Node, key: &str) -> Node {
    let mut copy = node.clone();
    if let NodeKind::Map(entries) = &mut copy.kind {
        entries.retain(|e| e.key.text() != Some(key));
    }
    copy
}

/// Whether PATH, as written, leaves the project: it is absolute, or its `..` climb above
/// where it starts before any interpolation (what an interpolation renders to is checked
/// when the step runs).
fn leaves_project(path: &str) -> bool {
    if path.starts_with('/') {
        return true;
    }
    let mut depth = 0_usize;
    for part in path.split('/') {
        match part {
            _ if part.contains('$') => return false,
            "" | "." => {}
            ".." => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return true,
            },
            _ => depth += 1,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_path_leaves_the_project_when_it_is_absolute_or_climbs_above_its_start() {
        for path in ["/tmp/out.txt", "../out.txt", "logs/../../out.txt", "./../x"] {
            assert!(super::leaves_project(path), "{path}");
        }
        // What an interpolation renders to is checked at run time.
        for path in [
            "out.txt",
            "logs/../out.txt",
            "a/./b/../c",
            "${item.name}.txt",
            "${dir}/../x",
        ] {
            assert!(!super::leaves_project(path), "{path}");
        }
    }
}
