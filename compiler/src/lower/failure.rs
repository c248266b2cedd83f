//! What a failing command does: `on_failure` in its six forms and `retry_config` with its
//! backoffs, matchers and what happens once the retries run out.

use std::time::Duration;

use super::fields::Fields;
use super::step::without_key;
use super::{Lowerer, one_of};
use crate::ast::{
    Backoff, Command, Matcher, OnFailure, OnFailureForm, Pattern, RetryConfig, RetryExhausted,
    Step, Strategy,
};
use crate::diagnostics::{Code, Diagnostic, Edit, Fix};
use crate::shapes;
use crate::source::{Span, Spanned};
use crate::syntax::{Node, NodeKind, Scalar};

impl Lowerer<'_> {
    /// `on_failure` in all six forms. `default_attempts` is 3 for the deprecated `test:` form.
    #[expect(
        clippy::too_many_lines,
        reason = "table-shaped lowering: one arm per key of `on_failure:` in the format's table"
    )]
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
                    if let Some(text) = fields.read(self, "shell", Lowerer::shell_template) {
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
        let timing = self.retry_timing(&fields, "`retry_config`");
        if let Some(backoff) = timing.backoff {
            out.backoff = backoff;
        }
        if let Some(d) = timing.max_delay {
            out.max_delay = d;
        }
        out.jitter = timing.jitter;
        if let Some(f) = timing.jitter_factor {
            out.jitter_factor = f;
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
    /// What `retry_config` and `error_policy.retry_config` share: `backoff` (whose own
    /// `max_delay` may not repeat the mapping's), `jitter` and `jitter_factor` (without
    /// effect when jitter is off). CONTEXT names the mapping in messages.
    pub(crate) fn retry_timing(&mut self, fields: &Fields<'_>, context: &str) -> RetryTiming {
        let mut timing = RetryTiming::default();
        if let Some(b) = fields.node("backoff")
            && let Some((backoff, max_delay)) = self.backoff(b)
        {
            timing.backoff = Some(backoff);
            if let Some(d) = max_delay {
                if let Some(outer) = fields.entry("max_delay") {
                    self.duplicate(d.span, outer.key.span, "max_delay", "`backoff`", context);
                }
                timing.max_delay = Some(d.value);
            }
        }
        timing.jitter = fields.flag(self, "jitter", false);
        timing.jitter_factor = fields
            .number(self, "jitter_factor", 0.0, 1.0)
            .map(|f| f.value);
        if let Some(e) = fields.entry("jitter_factor").filter(|_| !timing.jitter) {
            self.no_effect(
                e,
                "jitter is off",
                "add `jitter: true`, or remove `jitter_factor`",
            );
        }
        timing
    }

    #[expect(
        clippy::too_many_lines,
        reason = "table-shaped lowering: one arm per backoff kind and its keys in the format's table"
    )]
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
            ("stalled", Matcher::Stalled),
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
            if let Some(p) = pattern.and_then(|p| self.regex(p)) {
                out.push(Matcher::Pattern(p));
            }
        }
        out
    }

    /// A regular expression, compiled; `None` (with a diagnostic) when it does not compile.
    pub(crate) fn regex(&mut self, pattern: Spanned<String>) -> Option<Pattern> {
        let span = pattern.span;
        match Pattern::compile(pattern) {
            Ok(p) => Some(p),
            Err(why) => {
                self.push(
                    Diagnostic::new(Code::InvalidRegex, "invalid regular expression")
                        .with_primary(span, why)
                        .with_help("fix the pattern; escape literal characters such as `(` or `[` with `\\`"),
                );
                None
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

/// The timing fields both retry mappings share, as [`Lowerer::retry_timing`] read them.
#[derive(Default)]
pub(crate) struct RetryTiming {
    /// `backoff`, when given and valid.
    pub backoff: Option<Backoff>,
    /// `backoff`'s own `max_delay`.
    pub max_delay: Option<Duration>,
    /// `jitter`.
    pub jitter: bool,
    /// `jitter_factor`, when given and valid.
    pub jitter_factor: Option<f64>,
}
