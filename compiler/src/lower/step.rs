//! Steps, in every context, and the fields every step has: ids, environment, captures,
//! handlers, commits, `metadata` and the keys that stand in for `on_failure`.
//! A step's command is in `command.rs`, `on_failure` and `retry_config` in `failure.rs`,
//! `validate` and `step_validate` in `validate.rs`.

use super::values::MAX_ATTEMPTS;
use super::{Fields, Lowerer};
use crate::ast::{
    Capture, CaptureFormat, CaptureStreams, Command, EnvVar, ExitCodeHandler, OnFailure,
    RetryConfig, Step,
};
use crate::diagnostics::{Code, Diagnostic, Fix};
use crate::shapes;
use crate::source::{Span, Spanned};
use crate::syntax::{Entry, Node, NodeKind, Scalar};

pub(crate) use crate::shapes::COMMAND_KINDS;

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
            step.output_file = self.template(&e.value, &fields.label("output_file"));
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
    pub(super) fn command_string(&mut self, node: &Node, what: &str) -> Option<Step> {
        let claude = node
            .text()
            .is_some_and(|text| text.trim_start().starts_with('/'));
        let command = if claude {
            Command::Claude(self.template(node, what)?)
        } else {
            Command::Shell(self.shell_template(node, what)?)
        };
        Some(Step::new(node.span, command))
    }

    /// A list of handler commands: strings or steps.
    pub(super) fn handler_commands(&mut self, node: &Node, what: &str) -> Vec<Step> {
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

/// A copy of a mapping node without one key.
fn keep_keys(node: &Node, keys: &[&str]) -> Node {
    let mut copy = node.clone();
    if let NodeKind::Map(entries) = &mut copy.kind {
        entries.retain(|e| e.key.text().is_some_and(|k| keys.contains(&k)));
    }
    copy
}

pub(super) fn without_key(node: &Node, key: &str) -> Node {
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
