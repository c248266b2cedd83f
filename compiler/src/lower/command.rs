//! A step's command: `shell`, `claude` (with its call's settings), `write_file`, `foreach`,
//! the deprecated `test` and `command`, the legacy `name:` form; and `commit_config` and
//! `outputs`.

use super::step::{COMMAND_KINDS, Ctx};
use super::{Fields, Lowerer, one_of};
use crate::ast::{
    ClaudeBudget, ClaudeLimits, ClaudeSettings, Command, CommitConfig, Foreach, ForeachInput,
    OnBudget, OnRetry, StepOutput, Template, UsageLimitMode, WriteFile, WriteFormat,
};
use crate::diagnostics::{Code, Diagnostic, Fix};
use crate::shapes;
use crate::syntax::{Entry, Node, Scalar};

impl Lowerer<'_> {
    /// The step's command, and a `claude` command's own settings.
    pub(super) fn command(
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
            "shell" => Command::Shell(self.shell_template(value, "`shell`")?),
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
                    Lowerer::shell_template,
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
            stall_timeout: fields.duration(self, "stall_timeout").and_then(|stall| {
                if !stall.value.is_zero() {
                    return Some(stall.value);
                }
                self.push(
                    Diagnostic::new(Code::OutOfRange, "`stall_timeout` must be above 0")
                        .with_primary(stall.span, "a call would be stopped at once")
                        .with_help("give how long the call may stay silent, such as `10m`"),
                );
                None
            }),
            on_retry: fields
                .choice(
                    self,
                    "on_retry",
                    &[("fresh", OnRetry::Fresh), ("continue", OnRetry::Continue)],
                )
                .map(|o| o.value),
        }
    }

    /// `claude: {max_cost_usd, on_budget}` of the workflow's defaults (docs/language.md,
    /// "Claude budgets"); `None` when neither is set.
    pub(crate) fn claude_budget(&mut self, fields: &Fields<'_>) -> Option<ClaudeBudget> {
        let max_cost_usd = fields
            .number(self, "max_cost_usd", 0.0, f64::MAX)
            .and_then(|budget| {
                if budget.value > 0.0 {
                    return Some(budget.value);
                }
                self.push(
                    Diagnostic::new(Code::OutOfRange, "`max_cost_usd` must be above 0")
                        .with_primary(budget.span, "a budget of 0 allows no Claude call at all")
                        .with_help("give the most the run may spend in US dollars, such as `25`"),
                );
                None
            });
        let on_budget = fields.choice(
            self,
            "on_budget",
            &[("finish", OnBudget::Finish), ("stop", OnBudget::Stop)],
        );
        if max_cost_usd.is_none() && on_budget.is_none() {
            return None;
        }
        Some(ClaudeBudget {
            max_cost_usd,
            on_budget: on_budget.map_or(OnBudget::Finish, |o| o.value),
        })
    }

    /// `usage_limit`, `max_wait` and `patience` of the workflow's `claude:` defaults (a step's own
    /// settings have neither: the limit is the account's, for the whole run).
    pub(crate) fn claude_limits(&mut self, fields: &Fields<'_>) -> ClaudeLimits {
        let defaults = ClaudeLimits::default();
        ClaudeLimits {
            usage_limit: fields.choice_or(
                self,
                "usage_limit",
                &[
                    ("wait", UsageLimitMode::Wait),
                    ("stop", UsageLimitMode::Stop),
                ],
                defaults.usage_limit,
            ),
            max_wait: fields
                .duration(self, "max_wait")
                .map_or(defaults.max_wait, |d| d.value),
            patience: fields
                .duration(self, "patience")
                .map_or(defaults.patience, |d| d.value),
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

    pub(super) fn commit_config(&mut self, node: &Node) -> Option<CommitConfig> {
        let fields = self.fields(node, "`commit_config`", &shapes::COMMIT_CONFIG)?;
        let message_pattern = fields
            .string(self, "message_pattern")
            .and_then(|p| self.regex(p));
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

    pub(super) fn outputs(&mut self, node: &Node) -> Vec<StepOutput> {
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
    pub(super) fn flat_foreach_keys(&mut self, fields: &Fields<'_>) {
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
