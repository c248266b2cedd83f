//! Scope analysis: which variables exist at each step (docs/language.md §5), and untrusted text spliced
//! into shell commands unquoted.
//!
//! A reference is an error ([`Code::UndefinedVariable`]) only when the compiler can prove it
//! cannot exist: a phase variable outside its phase (`${item}` outside map agents, `${map.*}`
//! outside reduce and merge), a field a closed namespace does not have, a dotted path on an
//! unknown root, or a capture read before the step that makes it.
//! A simple lowercase name that nothing defines may still come from `--param`, so it is a
//! warning ([`Code::MaybeUndefined`]); upper-case names are process environment variables and
//! are never reported. References with a default (`:-` or `|default:`) are never reported.

use std::collections::BTreeMap;

use prodigy_grammar::path::{Path, Segment};
use prodigy_grammar::template::{Filter, Part};

use crate::ast::{
    CaptureFormat, Command, Condition, EnvValue, ForeachInput, MaxParallel, Parsed, RetryExhausted,
    Step, Template, Workflow,
};
use crate::diagnostics::{Code, Diagnostic};
use crate::lower::suggest;
use crate::source::Span;

/// The fields of `${map.*}` (reduce and merge).
pub(crate) const MAP_FIELDS: &[&str] = &[
    "results",
    "successful",
    "failed",
    "skipped",
    "total",
    "failure_rate",
    "success_rate",
    "dlq_count",
];
const MERGE_FIELDS: &[&str] = &[
    "worktree",
    "source_branch",
    "target_branch",
    "session_id",
    "commits",
    "commit_count",
    "commit_ids",
    "file_list",
    "file_count",
    "modified_files",
];
/// What a map agent sent back by the verified merge queue sees (empty on its first run).
const VERIFY_FIELDS: &[&str] = &["output", "reason", "attempt"];
/// What `merge.on_conflict` steps see: the conflicted merge, not the commits of a merge back.
const CONFLICT_FIELDS: &[&str] = &[
    "worktree",
    "source_branch",
    "target_branch",
    "session_id",
    "conflicted_files",
];
const GIT_FIELDS: &[&str] = &[
    "files_added",
    "files_modified",
    "files_deleted",
    "files_changed",
    "commits",
    "commit_count",
    "insertions",
    "deletions",
];
/// The fields of `${shell.*}`, set after every command, shell or Claude: `output` is both
/// streams interleaved, `stdout` and `stderr` each alone.
pub(crate) const SHELL_FIELDS: &[&str] = &["output", "stdout", "stderr", "exit_code"];
/// The fields of `${claude.*}`, set after a Claude command: its result, and what the CLI
/// reported about the call (docs/claude.md).
pub(crate) const CLAUDE_FIELDS: &[&str] = &[
    "output",
    "stderr",
    "exit_code",
    "session_id",
    "cost_usd",
    "num_turns",
    "log",
    "error_kind",
    "error",
];
/// The fields of `${error.*}` (handlers).
pub(crate) const ERROR_FIELDS: &[&str] = &["message", "exit_code", "step", "timestamp"];
/// The fields of `${error.*}` that only a failed Claude call sets: why it failed.
pub(crate) const CLAUDE_ERROR_FIELDS: &[&str] = &["kind", "type"];
/// The map item's own variables (map agents).
pub(crate) const ITEM_NAMES: &[&str] =
    &["item", "item_index", "item_total", "item_id", "item_json"];
const CAPTURE_FIELDS: &[&str] = &["exit_code", "success", "stderr", "duration"];

/// What a name in scope is.
#[derive(Clone, Debug)]
enum Var {
    /// Text with no fields (env values, secrets, setup outputs, legacy output captures).
    Plain,
    /// A typed capture: its fields are the metadata, plus any path when it is JSON.
    Capture { format: CaptureFormat },
    /// A step's `outputs`, read as `${ID.NAME}`.
    Outputs(Vec<String>),
}

/// Where a step stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    Standard,
    Setup,
    Map,
    Reduce,
    Merge,
    /// `merge.on_conflict`: resolving a conflicted merge.
    MergeConflict,
    /// `merge.verify`: testing a candidate of the merge queue (`${merge.*}`, no `${map.*}`).
    MergeVerify,
    /// A named handler run for a failed map item.
    ItemHandler,
    /// A `notify:` command: `${event.*}`.
    Notify,
}

#[derive(Clone, Debug)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "one flag per variable family of docs/language.md §5"
)]
struct Scope {
    /// Names inserted since the start, with what they replaced, so that nested contexts can
    /// be undone without copying the whole scope for every step.
    undo: Vec<(String, Option<Var>)>,
    phase: Section,
    names: BTreeMap<String, Var>,
    /// Inside an `on_failure` handler: `error.*` and `attempt`.
    handler: bool,
    /// Inside the `on_failure` handler of a `claude` step: `error.kind` and `error.type`.
    claude_failure: bool,
    /// Some step ran before: `shell.*`, `claude.*`.
    after_step: bool,
    /// The prompt of a `claude` step's own call: `claude.*` (the last call, on a retry the
    /// failed attempt's; empty before any call).
    claude_prompt: bool,
    /// A `validate` ran: `validation.*`.
    validation: bool,
    /// Inside `foreach.do`: `item`, `index`, `total`.
    foreach: bool,
}

/// A point to return to: the undo log's length and the flags.
#[derive(Clone, Copy)]
#[expect(clippy::struct_excessive_bools, reason = "a copy of the scope's flags")]
struct Mark {
    undo: usize,
    phase: Section,
    handler: bool,
    claude_failure: bool,
    after_step: bool,
    claude_prompt: bool,
    validation: bool,
    foreach: bool,
}

impl Scope {
    fn insert(&mut self, name: String, var: Var) {
        let previous = self.names.insert(name.clone(), var);
        self.undo.push((name, previous));
    }

    fn mark(&self) -> Mark {
        Mark {
            undo: self.undo.len(),
            phase: self.phase,
            handler: self.handler,
            claude_failure: self.claude_failure,
            after_step: self.after_step,
            claude_prompt: self.claude_prompt,
            validation: self.validation,
            foreach: self.foreach,
        }
    }

    fn restore(&mut self, mark: Mark) {
        while self.undo.len() > mark.undo {
            let Some((name, previous)) = self.undo.pop() else {
                break;
            };
            match previous {
                Some(var) => self.names.insert(name, var),
                None => self.names.remove(&name),
            };
        }
        self.phase = mark.phase;
        self.handler = mark.handler;
        self.claude_failure = mark.claude_failure;
        self.after_step = mark.after_step;
        self.claude_prompt = mark.claude_prompt;
        self.validation = mark.validation;
        self.foreach = mark.foreach;
    }
}

struct Checker<'a> {
    source: &'a str,
    diagnostics: Vec<Diagnostic>,
    /// Every capture name in the workflow with where it is defined, for "defined later".
    all_captures: BTreeMap<String, Span>,
    /// The map agents' merges go through the verified queue: `${verify.*}` is defined in
    /// their steps (and those steps' handlers).
    verify_vars: bool,
}

/// Checks every reference in the workflow against the variables in scope where it is used.
pub fn check(workflow: &Workflow, source: &str) -> Vec<Diagnostic> {
    let mut checker = Checker {
        source,
        diagnostics: Vec::new(),
        all_captures: BTreeMap::new(),
        verify_vars: workflow.map.is_some()
            && workflow.merge.as_ref().is_some_and(|m| {
                !m.verify.is_empty()
                    || !m.protect.is_empty()
                    || m.redispatch.as_ref().is_some_and(|r| r.value > 0)
                    || m.integrity
                        .as_ref()
                        .is_some_and(|i| i.value != prodigy_plan::Integrity::Off)
            }),
    };
    let all_steps = workflow
        .commands
        .iter()
        .chain(workflow.setup.iter().flat_map(|s| &s.commands))
        .chain(workflow.map.iter().flat_map(|m| &m.agent_template))
        .chain(workflow.reduce.iter().flatten());
    for step in all_steps {
        collect_captures(step, &mut checker.all_captures);
    }
    let global = checker.global_scope(workflow);
    // `worktree.setup` runs before anything else, in each new worktree.
    if let Some(prep) = &workflow.worktree {
        checker.steps(&prep.setup, &mut global.clone());
    }
    checker.notifications(workflow, &global);
    // What the run captured reaches the `merge` steps, which run after everything else.
    let before_merge = if workflow.map.is_none() {
        let mut before_merge = global.clone();
        checker.steps(&workflow.commands, &mut before_merge);
        for handler in &workflow.handlers {
            checker.steps(
                &handler.steps,
                &mut Scope {
                    handler: true,
                    ..global.clone()
                },
            );
        }
        before_merge
    } else {
        checker.mapreduce(workflow, global)
    };
    checker.merge(workflow, &before_merge);
    checker.diagnostics
}

fn collect_captures(step: &Step, out: &mut BTreeMap<String, Span>) {
    if let Some(c) = &step.capture {
        out.entry(c.name.value.clone()).or_insert(c.name.span);
    }
    if let Some(c) = &step.capture_output {
        out.entry(c.value.clone()).or_insert(c.span);
    }
    for nested in step
        .on_success
        .iter()
        .chain(step.on_exit_code.iter().flat_map(|h| &h.steps))
    {
        collect_captures(nested, out);
    }
}

impl Checker<'_> {
    /// The scope every phase starts from: the workflow's `env` (whose values are checked
    /// here: they see the process environment and each other) and `secrets`.
    fn global_scope(&mut self, workflow: &Workflow) -> Scope {
        let mut global = Scope {
            undo: Vec::new(),
            phase: Section::Standard,
            names: BTreeMap::new(),
            handler: false,
            claude_failure: false,
            after_step: false,
            claude_prompt: false,
            validation: false,
            foreach: false,
        };
        for var in workflow
            .env
            .iter()
            .chain(workflow.profiles.iter().flat_map(|p| &p.env))
        {
            global.names.insert(var.name.value.clone(), Var::Plain);
        }
        for secret in &workflow.secrets {
            global.names.insert(secret.name.value.clone(), Var::Plain);
        }
        for var in &workflow.env {
            self.env_value(&var.value, &global);
        }
        for template in &workflow.env_files {
            self.template(template, &global, false);
        }
        global
    }

    /// Notifications see the workflow's env and secrets, and the event (docs/language.md §2,
    /// "Notifications"): they can fire before setup has captured anything.
    fn notifications(&mut self, workflow: &Workflow, global: &Scope) {
        for notify in &workflow.notify {
            self.steps(
                std::slice::from_ref(&notify.step),
                &mut Scope {
                    phase: Section::Notify,
                    ..global.clone()
                },
            );
        }
    }

    /// A MapReduce job's phases from GLOBAL: setup, whose captures reach every later phase,
    /// the map input and agent template, reduce and the item handlers. Returns the scope
    /// the `merge` steps start from.
    fn mapreduce(&mut self, workflow: &Workflow, global: Scope) -> Scope {
        let mut scope = Scope {
            phase: Section::Setup,
            ..global
        };
        if let Some(setup) = &workflow.setup {
            self.steps(&setup.commands, &mut scope);
            for capture in &setup.capture_outputs {
                scope.names.insert(capture.name.value.clone(), Var::Plain);
            }
        }
        // Setup's variables reach every later phase; `shell.*` of setup's last step does not.
        let after_setup = Scope {
            after_step: false,
            validation: false,
            ..scope
        };
        if let Some(map) = &workflow.map {
            self.template(&map.input, &after_setup, false);
            if let MaxParallel::Variable(t) = &map.max_parallel {
                self.template(t, &after_setup, false);
            }
            self.steps(
                &map.agent_template,
                &mut Scope {
                    phase: Section::Map,
                    ..after_setup.clone()
                },
            );
        }
        // `merge.verify` runs during the map phase, on candidates of the merge queue: it
        // sees what setup captured, and `${merge.*}`, but not what reduce captures.
        if let Some(merge) = &workflow.merge {
            self.steps(
                &merge.verify,
                &mut Scope {
                    phase: Section::MergeVerify,
                    ..after_setup.clone()
                },
            );
        }
        let mut before_merge = Scope {
            phase: Section::Reduce,
            ..after_setup.clone()
        };
        if let Some(reduce) = &workflow.reduce {
            self.steps(reduce, &mut before_merge);
        }
        for handler in &workflow.handlers {
            let mut scope = Scope {
                phase: Section::ItemHandler,
                handler: true,
                ..after_setup.clone()
            };
            self.steps(&handler.steps, &mut scope);
        }
        before_merge
    }

    /// The `merge` and `merge.on_conflict` steps, which see what the run captured
    /// (`before_merge`) but no step's own variables; and, in a workflow without a map
    /// phase (where it has no effect), `merge.verify`.
    fn merge(&mut self, workflow: &Workflow, before_merge: &Scope) {
        let Some(merge) = &workflow.merge else {
            return;
        };
        let verify: &[Step] = if workflow.map.is_none() {
            &merge.verify
        } else {
            &[]
        };
        for (steps, phase) in [
            (&merge.commands[..], Section::Merge),
            (&merge.on_conflict[..], Section::MergeConflict),
            (verify, Section::MergeVerify),
        ] {
            self.steps(
                steps,
                &mut Scope {
                    phase,
                    after_step: false,
                    claude_prompt: false,
                    validation: false,
                    handler: false,
                    claude_failure: false,
                    foreach: false,
                    ..before_merge.clone()
                },
            );
        }
    }

    fn steps(&mut self, steps: &[Step], scope: &mut Scope) {
        for step in steps {
            self.step(step, scope);
            define(step, scope);
            define_on_success(step, scope);
            scope.after_step = true;
            if step.validate.is_some() {
                scope.validation = true;
            }
        }
    }

    fn step(&mut self, step: &Step, scope: &mut Scope) {
        let shell = matches!(step.command, Command::Shell(_));
        match &step.command {
            Command::Shell(t) => self.template(t, scope, shell),
            Command::Claude(t) => {
                let mark = scope.mark();
                scope.claude_prompt = true;
                self.template(t, scope, shell);
                scope.restore(mark);
            }
            Command::WriteFile(w) => {
                self.template(&w.path, scope, false);
                self.template(&w.content, scope, false);
            }
            Command::Foreach(f) => {
                match &f.input {
                    ForeachInput::Command(t) => self.template(t, scope, true),
                    ForeachInput::List(items) => {
                        for t in items {
                            self.template(t, scope, false);
                        }
                    }
                }
                let mark = scope.mark();
                scope.foreach = true;
                self.steps(&f.steps, scope);
                scope.restore(mark);
            }
            Command::Invalid => {}
        }
        for t in step.working_dir.iter().chain(&step.output_file) {
            self.template(t, scope, false);
        }
        for var in &step.env {
            self.env_value(&var.value, scope);
        }
        if let Some(when) = &step.when {
            self.condition(when, scope);
        }
        if let Some(config) = &step.commit_config {
            for t in config.message_template.iter().chain(&config.author) {
                self.template(t, scope, false);
            }
        }
        // What the step itself captures is there for its handlers.
        let after = scope.mark();
        define(step, scope);
        scope.after_step = true;
        if let Some(validate) = &step.validate {
            self.nested(&validate.commands, scope, |_| {});
            if let Some(t) = &validate.result_file {
                self.template(t, scope, false);
            }
            if let Some(on_incomplete) = &validate.on_incomplete {
                self.nested(&on_incomplete.commands, scope, |s| s.validation = true);
                if let Some(prompt) = &on_incomplete.prompt {
                    let mark = scope.mark();
                    scope.validation = true;
                    self.template(prompt, scope, false);
                    scope.restore(mark);
                }
            }
        }
        if let Some(check) = &step.step_validate {
            for c in &check.checks {
                self.template(&c.command, scope, !c.claude);
            }
        }
        if let Some(on_failure) = &step.on_failure {
            let claude = matches!(step.command, Command::Claude(_));
            self.nested(&on_failure.handler, scope, |s| {
                s.handler = true;
                s.claude_failure = claude;
            });
        }
        if let Some(retry) = &step.retry
            && let RetryExhausted::Fallback(t) = &retry.on_failure
        {
            let mark = scope.mark();
            scope.handler = true;
            self.template(t, scope, true);
            scope.restore(mark);
        }
        self.nested(&step.on_success, scope, |_| {});
        for handler in &step.on_exit_code {
            self.nested(&handler.steps, scope, |_| {});
        }
        scope.restore(after);
    }

    /// Checks a nested list of steps; what it defines does not outlive it.
    fn nested(&mut self, steps: &[Step], scope: &mut Scope, adjust: impl FnOnce(&mut Scope)) {
        let mark = scope.mark();
        adjust(scope);
        self.steps(steps, scope);
        scope.restore(mark);
    }

    fn env_value(&mut self, value: &EnvValue, scope: &Scope) {
        match value {
            EnvValue::Static(t) | EnvValue::Masked(t) => self.template(t, scope, false),
            EnvValue::Dynamic { command, .. } => self.template(command, scope, true),
            EnvValue::Conditional {
                condition,
                when_true,
                when_false,
            } => {
                self.condition(condition, scope);
                self.template(when_true, scope, false);
                self.template(when_false, scope, false);
            }
        }
    }

    fn condition(&mut self, condition: &Condition, scope: &Scope) {
        let mut rebaser = condition.rebaser(self.source);
        for (path, local, _) in condition.parsed.references() {
            let span = rebaser.span(local);
            self.reference(path, span, scope);
        }
        // Each comparison, with why its sides never compare and what it always is.
        let mut mixed = Vec::new();
        mixed_comparisons(&condition.parsed, scope, &mut mixed);
        for (local, why, always) in mixed {
            self.diagnostics.push(
                Diagnostic::new(
                    Code::MixedComparison,
                    format!("this comparison is always {always}: its sides are of different types"),
                )
                .with_primary(rebaser.span(local), why)
                .with_help(
                    "compare with a value of the same type (a string that reads as a number compares with numbers)",
                ),
            );
        }
    }

    fn template(&mut self, template: &Template, scope: &Scope, shell: bool) {
        let mut splices = if shell {
            crate::shell::splices(template)
        } else {
            Vec::new()
        }
        .into_iter()
        .peekable();
        let mut rebaser = template.rebaser(self.source);
        self.foreign_braces(template, scope, &mut rebaser);
        let sets = if shell {
            assigned(&template.value)
        } else {
            std::collections::BTreeSet::new()
        };
        for part in &template.parsed.parts {
            let var = match part {
                Part::Var(var) => var,
                // Only a `shell:` command keeps the shell's own expansions (`${f%.rs}`).
                Part::Shell { text, span } => {
                    self.shell_syntax(
                        template,
                        text,
                        *span,
                        &mut rebaser,
                        "uses syntax only a shell reads",
                    );
                    continue;
                }
                Part::Text(_) | Part::Dollar | Part::Bare { .. } => continue,
            };
            let span = rebaser.span(var.path_span);
            let has_default = var.default.is_some()
                || var.filters.iter().any(|f| matches!(f, Filter::Default(_)));
            let before = self.diagnostics.len();
            // A name nothing defines, which the command itself sets, is the shell's.
            if shell
                && var.path.segments.is_empty()
                && var.modifier.is_none()
                && var.filters.is_empty()
                && sets.contains(var.path.root.as_str())
            {
                self.reference(&var.path, span, scope);
                let undefined = self.diagnostics[before..]
                    .iter()
                    .any(|d| d.code == Code::MaybeUndefined);
                self.diagnostics.truncate(before);
                if undefined {
                    let text = template
                        .value
                        .get(var.span.start..var.span.end)
                        .unwrap_or_default()
                        .to_owned();
                    self.shell_syntax(
                        template,
                        &text,
                        var.span,
                        &mut rebaser,
                        "names a variable the command sets, which prodigy does not know",
                    );
                    continue;
                }
            }
            if !has_default {
                self.reference(&var.path, span, scope);
            }
            // A reference that cannot exist is reported once, as that.
            let exists = self.diagnostics[before..]
                .iter()
                .all(|d| d.code != Code::UndefinedVariable);
            if let Some(default) = &var.default {
                let nested = Parsed {
                    value: template.value.clone(),
                    span: template.span,
                    parsed: default.clone(),
                    exact: template.exact,
                };
                self.template(&nested, scope, false);
            }
            // Both in the order of the text: one pass for a command of many references.
            while splices
                .peek()
                .is_some_and(|s| s.span.start < var.span.start)
            {
                splices.next();
            }
            let splice = splices.next_if(|s| s.span == var.span);
            if let Some(splice) = &splice
                && exists
                && untrusted(&var.path, scope)
            {
                let escaped = var.filters.iter().any(|f| matches!(f, Filter::Shell));
                let w006 = Splicing {
                    template,
                    var,
                    span,
                    exported: Self::exported(&var.path, scope),
                    escaped,
                };
                if let Some(diagnostic) = w006.diagnostic(splice, &mut rebaser, self.source) {
                    self.diagnostics.push(diagnostic);
                }
            }
        }
    }

    /// W015 for `{{ item }}`, a variable prodigy knows in the braces of Jinja, Handlebars
    /// or Go templates: prodigy leaves it as text, and the command gets the braces.
    fn foreign_braces(
        &mut self,
        template: &Template,
        scope: &Scope,
        rebaser: &mut crate::ast::Rebaser<'_>,
    ) {
        let text = &template.value;
        let mut from = 0;
        while let Some(open) = text.get(from..).and_then(|t| t.find("{{")) {
            let start = from + open;
            let Some(close) = text.get(start + 2..).and_then(|t| t.find("}}")) else {
                break;
            };
            let end = start + 2 + close + 2;
            from = end;
            // `${{ ... }}` is GitHub Actions' own, in a workflow file that is not ours.
            if text[..start].ends_with('$') {
                continue;
            }
            let inner = text[start + 2..end - 2].trim();
            let root = inner.split(['.', '[']).next().unwrap_or_default();
            let plain = !inner.is_empty()
                && inner
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']'));
            let known = ITEM_NAMES.contains(&root)
                || matches!(
                    root,
                    "map"
                        | "merge"
                        | "shell"
                        | "claude"
                        | "workflow"
                        | "step"
                        | "error"
                        | "validation"
                        | "verify"
                        | "env"
                )
                || scope.names.contains_key(root);
            if !plain || !known {
                continue;
            }
            let span = rebaser.span(prodigy_grammar::Span::new(start, end));
            self.diagnostics.push(
                Diagnostic::new(
                    Code::ForeignBraces,
                    format!("`{{{{ {inner} }}}}` is another tool's template syntax"),
                )
                .with_primary(span, "prodigy leaves this as text")
                .with_help(format!("write `${{{inner}}}`")),
            );
        }
    }

    /// W010 for a `${...}` of a shell command that is the shell's (TEXT, at LOCAL in the
    /// template's value): prodigy would read it, or keep it only by accident.
    fn shell_syntax(
        &mut self,
        template: &Template,
        text: &str,
        local: prodigy_grammar::Span,
        rebaser: &mut crate::ast::Rebaser<'_>,
        why: &str,
    ) {
        let span = rebaser.span(local);
        let at = span.start as usize;
        let fix = (template.exact && self.source.get(at..at + 2) == Some("${")).then(|| {
            crate::diagnostics::Fix::replace(
                format!("escape it as `${text}`"),
                Span::new(at, at),
                "$",
            )
        });
        let mut diagnostic = Diagnostic::new(
            Code::ShellExpansion,
            format!("`{text}` in a shell command is the shell's, not a prodigy variable"),
        )
        .with_primary(span, why)
        .with_help(format!(
            "write `${text}`: `$${{` is a literal `${{` for the shell"
        ));
        diagnostic.fix = fix;
        self.diagnostics.push(diagnostic);
    }

    /// The exported variable that holds exactly PATH's text, unless another name takes it
    /// (the runtime gives it to that name, and none of this variable's): a variable the
    /// workflow defines under exactly that name (an `env` entry, a secret, a capture spelled
    /// in upper case), or one of the environment's own (`PATH`).
    fn exported(path: &Path, scope: &Scope) -> Option<String> {
        exported_name(path).filter(|name| {
            let root = export_root(&path.root);
            !RESERVED_ENV.contains(&name.as_str())
                && !scope
                    .names
                    .keys()
                    .any(|other| *other != path.root && Some(other) == root.as_ref())
        })
    }

    #[expect(
        clippy::too_many_lines,
        reason = "table-shaped: one arm per variable namespace the language defines"
    )]
    fn reference(&mut self, path: &Path, span: Span, scope: &Scope) {
        let root = path.root.as_str();
        let field = match path.segments.first() {
            Some(Segment::Field(f)) => Some(f.as_str()),
            Some(Segment::Index(_)) | None => None,
        };
        let closed = |lw: &mut Self, fields: &[&str], what: &str| {
            if let Some(f) = field
                && !fields.contains(&f)
            {
                let help = match suggest(f, fields.iter().copied()) {
                    Some(s) => format!("did you mean `{root}.{s}`?"),
                    None => format!(
                        "{what} has {}",
                        fields
                            .iter()
                            .map(|f| format!("`{root}.{f}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                lw.error(
                    span,
                    format!("`{root}` has no field `{f}`"),
                    "no such field",
                    help,
                );
            }
        };
        // Names defined by the workflow shadow nothing special; they come first.
        if let Some(var) = scope.names.get(root) {
            match var {
                Var::Plain
                | Var::Capture {
                    format: CaptureFormat::Json,
                } => {}
                Var::Capture {
                    format:
                        CaptureFormat::String
                        | CaptureFormat::Number
                        | CaptureFormat::Lines
                        | CaptureFormat::Boolean,
                } => {
                    if let Some(f) = field
                        && !CAPTURE_FIELDS.contains(&f)
                    {
                        self.error(
                                span,
                                format!("capture `{root}` has no field `{f}`"),
                                "only `json` captures have fields",
                                format!("add `capture_format: json` to the step that captures `{root}`, or use `${{{root}.exit_code}}`, `.success`, `.stderr` or `.duration`"),
                            );
                    }
                }
                Var::Outputs(names) => {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    closed(self, &names, "this step's `outputs`");
                }
            }
            return;
        }
        match root {
            "env" | "workflow" | "step" | "git" => match root {
                "workflow" | "step" => {
                    // What the runtime sets (docs/language.md §5): `workflow.name`/`id`,
                    // `step.name`/`index`, and the git context of both.
                    let mut fields: Vec<&str> = if root == "workflow" {
                        vec!["name", "id"]
                    } else {
                        vec!["name", "index"]
                    };
                    fields.extend_from_slice(GIT_FIELDS);
                    closed(self, &fields, &format!("`{root}`"));
                }
                "git" => closed(self, &["staged", "modified"], "`git`"),
                _ => {}
            },
            name if ITEM_NAMES.contains(&name) => {
                let in_map = matches!(scope.phase, Section::Map | Section::ItemHandler);
                let foreach_var = root == "item" && scope.foreach;
                if !in_map && !foreach_var {
                    self.error(span, format!("`{root}` is only defined in map agents"), "no map item here", "use it in `map.agent_template` steps, or inside `foreach.do` for `${item}`".to_owned());
                }
            }
            "index" | "total" if scope.foreach => {}
            "event" if scope.phase == Section::Notify => {
                closed(self, crate::plan::EVENT_FIELDS, "a notification's `event`");
            }
            "map" => {
                if matches!(scope.phase, Section::Reduce | Section::Merge) {
                    closed(self, MAP_FIELDS, "`map`");
                } else {
                    self.error(
                        span,
                        format!("`{path}` is only defined in `reduce` and `merge`"),
                        "the map phase's results do not exist here",
                        "move the step into `reduce:`".to_owned(),
                    );
                }
            }
            "merge" => {
                if matches!(scope.phase, Section::Merge | Section::MergeVerify) {
                    closed(self, MERGE_FIELDS, "`merge`");
                } else if scope.phase == Section::MergeConflict {
                    closed(self, CONFLICT_FIELDS, "`merge`");
                } else {
                    self.error(
                        span,
                        format!("`{path}` is only defined in `merge` steps"),
                        "no merge is running here",
                        "move the step into `merge:`".to_owned(),
                    );
                }
            }
            "verify" => {
                if scope.phase == Section::Map && self.verify_vars {
                    closed(self, VERIFY_FIELDS, "`verify`");
                } else {
                    self.error(
                        span,
                        format!("`{path}` is only defined in map agents whose merges are verified"),
                        "no verified merge queue sends work back here",
                        "set `merge.verify` or `merge.redispatch`, and read it in `map.agent_template`".to_owned(),
                    );
                }
            }
            "shell" | "claude" => {
                if scope.after_step || scope.handler || (root == "claude" && scope.claude_prompt) {
                    closed(
                        self,
                        if root == "shell" {
                            SHELL_FIELDS
                        } else {
                            CLAUDE_FIELDS
                        },
                        &format!("`{root}`"),
                    );
                } else {
                    self.error(
                        span,
                        format!("`{path}` needs a step before it"),
                        "no step has run yet",
                        "read it in an `on_failure` handler or a later step".to_owned(),
                    );
                }
            }
            "error" | "attempt" => {
                if scope.handler {
                    if root == "error" {
                        match field {
                            Some(f)
                                if CLAUDE_ERROR_FIELDS.contains(&f) && !scope.claude_failure =>
                            {
                                self.error(
                                    span,
                                    format!("`error.{f}` is only set when a `claude` step fails"),
                                    "this handler does not handle a Claude call",
                                    "read `${error.message}` or `${error.exit_code}` here; `error.kind` is for the handlers of `claude` steps".to_owned(),
                                );
                            }
                            _ if scope.claude_failure => {
                                let fields = [ERROR_FIELDS, CLAUDE_ERROR_FIELDS].concat();
                                closed(self, &fields, "`error`");
                            }
                            _ => closed(self, ERROR_FIELDS, "`error`"),
                        }
                    }
                } else {
                    self.error(
                        span,
                        format!("`{path}` is only defined in failure handlers"),
                        "no failure is being handled here",
                        "read it inside `on_failure:`".to_owned(),
                    );
                }
            }
            "validation" => {
                if !scope.validation {
                    self.error(
                        span,
                        format!("`{path}` needs a `validate` before it"),
                        "no validation has run yet",
                        "read it in `on_incomplete` or a step after one with `validate:`"
                            .to_owned(),
                    );
                }
            }
            _ => self.unknown(path, span, scope),
        }
    }

    fn unknown(&mut self, path: &Path, span: Span, scope: &Scope) {
        let root = path.root.as_str();
        if let Some(defined) = self.all_captures.get(root) {
            let defined = *defined;
            self.diagnostics.push(
                Diagnostic::new(
                    Code::UndefinedVariable,
                    format!("`{root}` is not captured yet"),
                )
                .with_primary(span, "used before the step that captures it")
                .with_label(defined, "captured here")
                .with_help("move the capture earlier, or this reference later"),
            );
            return;
        }
        let env_like = root
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if env_like && path.segments.is_empty() {
            return;
        }
        let candidates: Vec<&str> = scope.names.keys().map(String::as_str).collect();
        let suggestion = suggest(root, candidates.iter().copied());
        // A flat or dotted name (`${build.target}`) may come from `--param NAME=...`.
        let dotted: Option<Vec<&str>> = path
            .segments
            .iter()
            .map(|s| match s {
                Segment::Field(f) => Some(f.as_str()),
                Segment::Index(_) => None,
            })
            .collect();
        if let Some(fields) = dotted {
            let name = std::iter::once(root)
                .chain(fields)
                .collect::<Vec<_>>()
                .join(".");
            let help = match suggestion {
                Some(s) => format!(
                    "did you mean `${{{s}{}}}`? Otherwise define it with `env:`, a capture, or `--param {name}=...`",
                    &name[root.len()..]
                ),
                None if path.segments.is_empty() => format!(
                    "for a shell variable write `${root}` or `$${{{root}}}`; otherwise define it with `env:`, a capture or `--param {root}=...`"
                ),
                None => format!(
                    "define it with a `capture:` (with `capture_format: json` for fields) before this step, or `--param {name}=...`"
                ),
            };
            self.diagnostics.push(
                Diagnostic::new(Code::MaybeUndefined, maybe_undefined_message(&name))
                    .with_primary(span, "not defined here")
                    .with_help(help),
            );
        } else {
            let help = match suggestion {
                Some(s) => format!("did you mean `{s}`?"),
                None => "define it with a `capture:` (with `capture_format: json` for fields) before this step".to_owned(),
            };
            self.error(
                span,
                format!("undefined variable `{path}`"),
                "nothing defines this",
                help,
            );
        }
    }

    fn error(&mut self, span: Span, message: String, label: &str, help: String) {
        self.diagnostics.push(
            Diagnostic::new(Code::UndefinedVariable, message)
                .with_primary(span, label)
                .with_help(help),
        );
    }
}

const MAYBE_UNDEFINED: &str = "nothing in the workflow defines `";

fn maybe_undefined_message(name: &str) -> String {
    format!("{MAYBE_UNDEFINED}{name}`")
}

/// The variable a [`Code::MaybeUndefined`] diagnostic is about (`name` or `build.target`):
/// what `--param NAME=VALUE` or the environment would have to supply.
pub fn maybe_undefined_name(diagnostic: &Diagnostic) -> Option<&str> {
    if diagnostic.code != Code::MaybeUndefined {
        return None;
    }
    diagnostic
        .message
        .strip_prefix(MAYBE_UNDEFINED)?
        .strip_suffix('`')
}

/// Adds what a step defines for the steps after it.
fn define(step: &Step, scope: &mut Scope) {
    if let Some(capture) = &step.capture {
        scope.insert(
            capture.name.value.clone(),
            Var::Capture {
                format: capture.format,
            },
        );
    }
    if let Some(name) = &step.capture_output
        && !name.value.contains('.')
    {
        scope.insert(name.value.clone(), Var::Plain);
    }
    if let Some(on_failure) = &step.on_failure {
        for name in &on_failure.capture {
            scope.insert(name.value.clone(), Var::Plain);
        }
    }
    if let Some(id) = &step.id
        && !step.outputs.is_empty()
    {
        let names = step.outputs.iter().map(|o| o.name.value.clone()).collect();
        scope.insert(id.value.clone(), Var::Outputs(names));
    }
}

/// Adds what a step's `on_success` steps define (and theirs, nested): the user documentation
/// says a capture made there is "usable in later workflow steps". It is not there for the
/// step's own failure handlers, which run when `on_success` does not.
fn define_on_success(step: &Step, scope: &mut Scope) {
    for nested in &step.on_success {
        define(nested, scope);
        define_on_success(nested, scope);
    }
}

/// Text from outside the workflow: items, captured output, command output, error messages.
fn untrusted(path: &Path, scope: &Scope) -> bool {
    let field = |names: &[&str]| matches!(path.segments.first(), Some(Segment::Field(f)) if names.contains(&f.as_str()));
    match path.root.as_str() {
        "item" | "item_json" => true,
        "shell" => field(&["output", "stdout", "stderr"]),
        "claude" => field(&["output"]),
        "error" => field(&["message"]),
        // A notification's `${event.error}` holds what a command printed.
        "event" => field(&["error"]),
        root => match scope.names.get(root) {
            Some(Var::Capture { .. }) => !field(&["exit_code", "success", "duration"]),
            Some(Var::Plain | Var::Outputs(_)) | None => false,
        },
    }
}

/// The variables shell command TEXT sets itself: `NAME=`, `for NAME in`, `read ... NAME`,
/// `local`/`export`/`readonly`/`declare NAME`. One pass over the text.
fn assigned(text: &str) -> std::collections::BTreeSet<&str> {
    static SETS: std::sync::LazyLock<Option<regex::Regex>> = std::sync::LazyLock::new(|| {
        regex::Regex::new(
            // ASCII classes (a shell's names are ASCII): Unicode `\w` costs milliseconds to
            // compile, in every process that compiles a workflow (each Slurm task's too).
            r"(?:^|[[:space:];&|(])([A-Za-z_][[:word:]]*)=|\bfor[[:space:]]+([A-Za-z_][[:word:]]*)[[:space:]]+in\b|\bread\b([^;&|\n]*)|\b(?:local|export|readonly|declare|typeset)[[:space:]]+(?:-[[:word:]]+[[:space:]]+)*([A-Za-z_][[:word:]]*)",
        )
        .ok()
    });
    let mut out = std::collections::BTreeSet::new();
    let Some(sets) = SETS.as_ref() else {
        return out;
    };
    for found in sets.captures_iter(text) {
        for group in [1, 2, 4] {
            if let Some(name) = found.get(group) {
                out.insert(name.as_str());
            }
        }
        if let Some(words) = found.get(3) {
            out.extend(
                words
                    .as_str()
                    .split_whitespace()
                    .filter(|w| !w.starts_with('-') && !w.starts_with('<')),
            );
        }
    }
    out
}

/// What a condition's operand is known to be, for W009 (docs/language.md §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Known {
    /// Text that may read as a number (a captured string).
    Text,
    /// Text that reads as no number (a literal).
    Word,
    Number,
    Bool,
}

impl Known {
    fn name(self) -> &'static str {
        match self {
            Known::Text => "text",
            Known::Word => "text that is not a number",
            Known::Number => "a number",
            Known::Bool => "a boolean",
        }
    }
}

/// What EXPR is known to be before the run, if anything: a literal, or a capture whose
/// format or field fixes its type.
fn known(expr: &prodigy_grammar::expr::Expr, scope: &Scope) -> Option<Known> {
    use prodigy_grammar::expr::Expr;
    use serde_json::Value;
    match expr {
        Expr::Literal { value, .. } => match value {
            Value::Bool(_) => Some(Known::Bool),
            Value::Number(_) => Some(Known::Number),
            Value::String(s) if prodigy_grammar::value::read_number(s).is_some() => {
                Some(Known::Text)
            }
            Value::String(_) => Some(Known::Word),
            Value::Null | Value::Array(_) | Value::Object(_) => None,
        },
        Expr::Path { path, .. } | Expr::Var { path, .. } => {
            let Some(Var::Capture { format }) = scope.names.get(&path.root) else {
                return None;
            };
            match (path.segments.as_slice(), format) {
                ([], CaptureFormat::String) => Some(Known::Text),
                ([], CaptureFormat::Number) => Some(Known::Number),
                ([], CaptureFormat::Boolean) => Some(Known::Bool),
                (
                    [Segment::Field(f)],
                    CaptureFormat::String
                    | CaptureFormat::Number
                    | CaptureFormat::Boolean
                    | CaptureFormat::Lines,
                ) => match f.as_str() {
                    "exit_code" | "duration" => Some(Known::Number),
                    "success" => Some(Known::Bool),
                    "stderr" => Some(Known::Text),
                    _ => None,
                },
                _ => None,
            }
        }
        Expr::List { .. } | Expr::Not { .. } | Expr::Binary { .. } | Expr::Call { .. } => None,
    }
}

/// Every comparison in EXPR whose sides are known to be of types that never compare, with
/// a label that says which.
fn mixed_comparisons(
    expr: &prodigy_grammar::expr::Expr,
    scope: &Scope,
    out: &mut Vec<(prodigy_grammar::Span, String, bool)>,
) {
    use prodigy_grammar::expr::{BinOp, Expr};
    match expr {
        Expr::Literal { .. } | Expr::Path { .. } | Expr::Var { .. } => {}
        Expr::List { items, .. } | Expr::Call { args: items, .. } => {
            for item in items {
                mixed_comparisons(item, scope, out);
            }
        }
        Expr::Not { expr, .. } => mixed_comparisons(expr, scope, out),
        Expr::Binary { op, lhs, rhs, span } => match op {
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                if let (Some(a), Some(b)) = (known(lhs, scope), known(rhs, scope)) {
                    let compatible = a == b
                        || matches!(
                            (a, b),
                            (Known::Text | Known::Word, Known::Text | Known::Word)
                                | (Known::Text, Known::Number)
                                | (Known::Number, Known::Text)
                        );
                    if !compatible {
                        let why = format!("{} compared with {}", a.name(), b.name());
                        out.push((*span, why, *op == BinOp::Ne));
                    }
                }
            }
            BinOp::In | BinOp::NotIn | BinOp::And | BinOp::Or => {
                mixed_comparisons(lhs, scope, out);
                mixed_comparisons(rhs, scope, out);
            }
        },
    }
}

/// One untrusted `${...}` of a shell command, for W006 (docs/language.md §5).
struct Splicing<'a> {
    template: &'a Template,
    var: &'a prodigy_grammar::template::Var,
    /// The path's span in the file.
    span: Span,
    /// The exported variable that holds the same text, if any.
    exported: Option<String>,
    /// Whether it has `|shell`.
    escaped: bool,
}

impl Splicing<'_> {
    /// W006 for the reference, unless where it lands makes it safe: outside quotes with
    /// `|shell`. `|shell`'s single quotes are literal inside double quotes and a here-document,
    /// close and reopen single quotes, and are removed before `eval` or `sh -c` reads the
    /// text again.
    fn diagnostic(
        &self,
        splice: &crate::shell::Splice,
        rebaser: &mut crate::ast::Rebaser<'_>,
        source: &str,
    ) -> Option<Diagnostic> {
        use crate::shell::Quoting;
        let path = &self.var.path;
        let shelled = format!("${{{path}|shell}}");
        let (message, label, help, fix) = if let Some(inner) = splice.reparsed {
            let exported = self.exported.as_ref();
            (
                format!("`${{{path}}}` is spliced into a script the shell reads again"),
                "untrusted text: `eval` and `sh -c` remove its quotes and run the rest as shell syntax",
                match exported {
                    Some(name) => format!(
                        "use the exported variable, which the inner shell expands: \"${name}\""
                    ),
                    None => format!("pass it as an argument: `sh -c '... \"$1\"' sh {shelled}`"),
                },
                exported.and_then(|name| {
                    let text = reparsed_reference(name, inner, splice.quoting)?;
                    self.replace(rebaser, source, format!("read `${name}`"), &text)
                }),
            )
        } else {
            match splice.quoting {
                Quoting::Unquoted | Quoting::Comment if self.escaped => return None,
                Quoting::Unquoted | Quoting::Comment => (
                    format!("`${{{path}}}` is spliced into a shell command unquoted"),
                    "untrusted text: quotes or `;` in it would run as shell syntax",
                    match &self.exported {
                        Some(name) => {
                            format!("write `{shelled}`, or use the exported variable: \"${name}\"")
                        }
                        None => format!("write `{shelled}`"),
                    },
                    self.close_quotes(rebaser, source, ""),
                ),
                Quoting::Single => (
                    format!("`${{{path}}}` is spliced into a shell command inside single quotes"),
                    "untrusted text: a `'` in it ends the quotes and the rest runs as shell syntax",
                    match &self.exported {
                        Some(name) => format!(
                            "use the exported variable outside the single quotes: \"${name}\""
                        ),
                        None => format!("close the single quotes before it and write `{shelled}`"),
                    },
                    self.close_quotes(rebaser, source, "'"),
                ),
                Quoting::Double => (
                    format!("`${{{path}}}` is spliced into a shell command inside double quotes"),
                    if self.escaped {
                        "untrusted text: `|shell`'s quotes are literal here, and `$(...)` or a backtick in it runs"
                    } else {
                        "untrusted text: `$(...)`, a backtick or a `\"` in it would run as shell syntax"
                    },
                    match &self.exported {
                        Some(name) => format!(
                            "close the double quotes around it: `\"...\"{shelled}\"...\"`, or use the exported variable: `${name}`"
                        ),
                        None => {
                            format!("close the double quotes around it: `\"...\"{shelled}\"...\"`")
                        }
                    },
                    self.close_quotes(rebaser, source, "\""),
                ),
                Quoting::Heredoc { quoted } => (
                    format!("`${{{path}}}` is spliced into a here-document"),
                    "untrusted text: a line of it that is the delimiter ends the here-document and the rest runs",
                    match &self.exported {
                        Some(name) if !quoted => {
                            format!(
                                "use the exported variable, which the shell expands: `$${{{name}}}`"
                            )
                        }
                        Some(_) | None => {
                            "write the text to a file with `write_file:` and read that file"
                                .to_owned()
                        }
                    },
                    match &self.exported {
                        Some(name) if !quoted => self.replace(
                            rebaser,
                            source,
                            format!("read `${name}`"),
                            &format!("$${{{name}}}"),
                        ),
                        Some(_) | None => None,
                    },
                ),
            }
        };
        let mut diagnostic = Diagnostic::new(Code::UnquotedInterpolation, message)
            .with_primary(self.span, label)
            .with_help(help);
        diagnostic.fix = fix;
        Some(diagnostic)
    }

    /// The file span of the whole `${...}`, when the template lies in the file as written.
    fn whole(&self, rebaser: &mut crate::ast::Rebaser<'_>, source: &str) -> Option<Span> {
        let local = self.var.span;
        if !self.template.exact || local.end <= local.start {
            return None;
        }
        let span = rebaser.span(local);
        let text = source.get(span.start as usize..span.end as usize)?;
        (text.starts_with("${") && text.ends_with('}')).then_some(span)
    }

    /// The fix that replaces the whole `${...}` with TEXT (as the template reads it).
    fn replace(
        &self,
        rebaser: &mut crate::ast::Rebaser<'_>,
        source: &str,
        description: String,
        text: &str,
    ) -> Option<crate::diagnostics::Fix> {
        let whole = self.whole(rebaser, source)?;
        let text = yaml_encode(source, self.template.span, text);
        Some(crate::diagnostics::Fix::replace(description, whole, text))
    }

    /// The fix that closes the quotes QUOTE around the `${...}` (none outside quotes) and
    /// adds `|shell` as its last filter: `"a ${x} b"` → `"a "${x|shell}" b"`, one word still.
    fn close_quotes(
        &self,
        rebaser: &mut crate::ast::Rebaser<'_>,
        source: &str,
        quote: &str,
    ) -> Option<crate::diagnostics::Fix> {
        let whole = self.whole(rebaser, source)?;
        let local = self.var.span;
        // A quote right before or after the reference is the one that opens or closes the
        // quotes around it (one inside them would be escaped, or end them): it goes, rather
        // than a pair of empty quotes being added (`"${x}"` → `${x|shell}`).
        let value = self.template.value.as_str();
        let mut quote_at = |start: usize| {
            let byte = value.get(start..start + 1)?;
            let escaped = start > 0 && value.get(start - 1..start) == Some("\\");
            let span = rebaser.span(prodigy_grammar::Span {
                start,
                end: start + 1,
            });
            (byte == quote
                && !escaped
                && source.get(span.start as usize..span.end as usize) == Some(quote))
            .then_some(span)
        };
        let before = local.start.checked_sub(1).and_then(&mut quote_at);
        let after = quote_at(local.end);
        let encoded = yaml_encode(source, self.template.span, quote);
        let at = |offset: u32| Span::new(offset as usize, offset as usize);
        let mut edits = Vec::new();
        let mut edit = |span: Span, replacement: &str| {
            if !replacement.is_empty() || !span.is_empty() {
                edits.push(crate::diagnostics::Edit {
                    span,
                    replacement: replacement.to_owned(),
                });
            }
        };
        match before {
            Some(span) if !quote.is_empty() => edit(span, ""),
            Some(_) | None => edit(at(whole.start), &encoded),
        }
        edit(at(whole.end - 1), if self.escaped { "" } else { "|shell" });
        match after {
            Some(span) if !quote.is_empty() => edit(span, ""),
            Some(_) | None => edit(at(whole.end), &encoded),
        }
        let path = &self.var.path;
        Some(crate::diagnostics::Fix {
            description: if quote.is_empty() {
                format!("quote `${{{path}}}` with `|shell`")
            } else {
                format!("close the quotes around `${{{path}}}` and quote it with `|shell`")
            },
            edits,
        })
    }
}

/// How a script read again by `eval` or `sh -c` reads the exported variable NAME, written
/// where the outer shell finds it in OUTER quoting and the inner one in INNER: `"$NAME"` for
/// the inner shell, quoted for the outer one, as a template (`${` written `$${`).
fn reparsed_reference(
    name: &str,
    inner: crate::shell::Quoting,
    outer: crate::shell::Quoting,
) -> Option<String> {
    use crate::shell::Quoting;
    let script = match inner {
        Quoting::Unquoted => format!("\"${{{name}}}\""),
        Quoting::Double => format!("${{{name}}}"),
        Quoting::Single => format!("'\"${{{name}}}\"'"),
        Quoting::Heredoc { .. } | Quoting::Comment => return None,
    };
    let shell = match outer {
        Quoting::Single => script.replace('\'', "'\\''"),
        Quoting::Double => script
            .chars()
            .flat_map(|c| {
                let escape = "$`\"\\".contains(c).then_some('\\');
                escape.into_iter().chain([c])
            })
            .collect(),
        Quoting::Unquoted => script
            .chars()
            .flat_map(|c| {
                let escape = (!c.is_ascii_alphanumeric() && c != '_').then_some('\\');
                escape.into_iter().chain([c])
            })
            .collect(),
        Quoting::Heredoc { .. } | Quoting::Comment => return None,
    };
    Some(shell.replace("${", "$${"))
}

/// TEXT as it is written inside the YAML scalar at SCALAR: a `'` doubled in a single-quoted
/// scalar, `"` and `\` escaped in a double-quoted one, as it is in plain and block scalars.
fn yaml_encode(source: &str, scalar: Span, text: &str) -> String {
    match source
        .get(scalar.start as usize..)
        .and_then(|s| s.chars().next())
    {
        Some('\'') => text.replace('\'', "''"),
        Some('"') => text.replace('\\', "\\\\").replace('"', "\\\""),
        _ => text.to_owned(),
    }
}

pub use prodigy_plan::export::{
    EXPORT_SEPARATOR, RESERVED_ENV, export_field, export_root, exported_name,
};

#[cfg(test)]
mod tests {
    use crate::diagnostics::Code;
    use crate::source::SourceFile;

    #[track_caller]
    fn codes(text: &str) -> Vec<Code> {
        checked(text).iter().map(|d| d.code).collect()
    }

    fn checked(text: &str) -> Vec<crate::diagnostics::Diagnostic> {
        crate::check(&SourceFile::new("t.yml", text)).diagnostics
    }

    #[test]
    fn event_fields_exist_in_notifications_only() {
        let notify = |command: &str| {
            format!(
                "commands:\n  - shell: make\nnotify:\n  - on: [failed]\n    shell: \"{command}\"\n"
            )
        };
        assert_eq!(codes(&notify("echo ${event.status} ${event.item_id}")), []);
        let misspelt = checked(&notify("echo ${event.stauts}"));
        assert_eq!(
            misspelt.iter().map(|d| d.code).collect::<Vec<_>>(),
            [Code::UndefinedVariable]
        );
        assert_eq!(
            misspelt[0].help.as_deref(),
            Some("did you mean `event.status`?")
        );
        // A step is no notification: `event` is any other unknown name there.
        assert_eq!(
            codes("- shell: \"echo ${event.status}\"\n"),
            [Code::MaybeUndefined]
        );
    }

    #[test]
    fn only_the_context_fields_the_runtime_sets_are_in_scope() {
        for (text, code) in [
            (
                "- shell: echo ${workflow.name} ${workflow.id} ${step.name} ${step.index}\n",
                None,
            ),
            (
                "- shell: echo ${workflow.index}\n",
                Some(Code::UndefinedVariable),
            ),
            ("- shell: echo ${step.id}\n", Some(Code::UndefinedVariable)),
            (
                "mode: mapreduce\nmap:\n  input: x.json\n  agent_template:\n    - shell: \"true\"\nreduce:\n  - shell: echo ${map.duration}\n",
                Some(Code::UndefinedVariable),
            ),
        ] {
            assert_eq!(codes(text), code.into_iter().collect::<Vec<_>>(), "{text}");
        }
    }

    #[test]
    fn merge_steps_see_what_the_run_captured_but_not_the_last_steps_output() {
        let standard = "commands:\n  - shell: echo 1\n    capture: version\nmerge:\n  - shell: echo ${version|shell} ${merge.source_branch}\n";
        assert_eq!(codes(standard), []);
        let job = "mode: mapreduce\nmap:\n  input: x.json\n  agent_template:\n    - shell: \"true\"\nreduce:\n  - shell: echo ${map.successful}\n    capture: total\nmerge:\n  - shell: echo ${total|shell} ${map.total}\n";
        assert_eq!(codes(job), []);
        let shell = "commands:\n  - shell: echo 1\nmerge:\n  - shell: echo ${shell.output}\n";
        assert_eq!(codes(shell), [Code::UndefinedVariable]);
    }

    #[test]
    fn verify_variables_are_defined_in_agents_whose_merges_are_verified() {
        let job = |merge: &str, template: &str| {
            format!(
                "mode: mapreduce\nmap:\n  input: x.json\n  agent_template:\n    - shell: echo {template}\nmerge:\n{merge}"
            )
        };
        let verify = "  verify:\n    - shell: make test\n";
        let read = "${verify.output|shell} ${verify.reason|shell} ${verify.attempt}";
        assert_eq!(codes(&job(verify, read)), []);
        assert_eq!(codes(&job("  redispatch: 2\n", read)), []);
        assert_eq!(codes(&job("  protect: [test.sh]\n", read)), []);
        assert_eq!(codes(&job("  integrity: fail\n", read)), []);
        assert_eq!(
            codes(&job("  integrity: off\n", "${verify.reason|shell}")),
            [Code::UndefinedVariable]
        );
        // A field the queue does not set, and a queue that is not verified.
        assert_eq!(
            codes(&job(verify, "${verify.log}")),
            [Code::UndefinedVariable]
        );
        assert_eq!(
            codes(&job("  redispatch: 0\n", "${verify.reason|shell}")),
            [Code::UndefinedVariable]
        );
        // Outside the agents: the verify steps, reduce.
        let in_verify = "  verify:\n    - shell: echo ${verify.reason|shell}\n";
        assert_eq!(codes(&job(in_verify, "1")), [Code::UndefinedVariable]);
    }

    #[test]
    fn verify_steps_see_the_candidate_and_setups_captures_but_not_reduces() {
        let job = |verify: &str| {
            format!(
                "mode: mapreduce\nsetup:\n  - shell: echo 1\n    capture: version\nmap:\n  input: x.json\n  agent_template:\n    - shell: \"true\"\nreduce:\n  - shell: echo 2\n    capture: total\nmerge:\n  verify:\n    - shell: echo {verify}\n"
            )
        };
        assert_eq!(
            codes(&job(
                "${version|shell} ${merge.commit_count} ${merge.worktree|shell}"
            )),
            []
        );
        assert_eq!(codes(&job("${map.total}")), [Code::UndefinedVariable]);
        assert_ne!(codes(&job("${total|shell}")), []);
    }

    #[test]
    fn merge_fields_are_those_of_the_merge_being_made() {
        let wf = |commands: &str, on_conflict: &str| {
            format!(
                "commands:\n  - shell: \"true\"\nmerge:\n  commands:\n    - shell: echo {commands}\n  on_conflict:\n    - shell: echo {on_conflict}\n"
            )
        };
        let ok = wf("${merge.commits}", "${merge.conflicted_files}");
        assert_eq!(codes(&ok), []);
        // The merge back has no conflicted files; a conflicted merge has no commit list.
        let swapped = wf("${merge.conflicted_files}", "${merge.file_list}");
        assert_eq!(
            codes(&swapped),
            [Code::UndefinedVariable, Code::UndefinedVariable]
        );
    }

    #[test]
    fn an_on_incomplete_prompt_is_checked_with_validation_in_scope() {
        let prompt = |text: &str| {
            format!(
                "- shell: \"true\"\n  validate:\n    shell: \"true\"\n    on_incomplete:\n      shell: \"echo fix\"\n      prompt: \"{text}\"\n"
            )
        };
        assert_eq!(codes(&prompt("still missing ${validation.missing}")), []);
        assert_eq!(
            codes(&prompt("see ${nothing.here}")),
            [Code::MaybeUndefined]
        );
    }

    fn mapreduce(agent: &str, reduce: &str) -> String {
        format!(
            "name: x\nmode: mapreduce\nmap:\n  input: i.json\n  agent_template:\n    - {agent}\nreduce:\n  - {reduce}\n"
        )
    }

    #[test]
    fn phase_variables_exist_only_in_their_phase() {
        assert_eq!(
            codes(&mapreduce(
                "claude: '/fix ${item.file}'",
                "shell: 'echo ${map.total}'"
            )),
            []
        );
        assert_eq!(
            codes(&mapreduce(
                "claude: '/fix ${map.total}'",
                "shell: 'echo ${item.file}'"
            )),
            [Code::UndefinedVariable, Code::UndefinedVariable]
        );
        assert_eq!(
            codes("- shell: 'echo ${item}'\n"),
            [Code::UndefinedVariable]
        );
        assert_eq!(
            codes(&mapreduce("claude: '/a'", "shell: 'echo ${map.totl}'")),
            [Code::UndefinedVariable]
        );
    }

    #[test]
    fn claude_variables_describe_the_last_claude_call() {
        assert_eq!(
            codes(
                "- claude: /a\n- shell: \"echo ${claude.session_id|shell} ${claude.cost_usd} ${claude.num_turns} ${claude.log|shell} ${claude.error_kind} ${claude.exit_code} ${claude.stderr|shell}\"\n"
            ),
            []
        );
        assert_eq!(
            codes("- claude: /a\n- shell: \"echo ${claude.session}\"\n"),
            [Code::UndefinedVariable]
        );
    }

    #[test]
    fn a_claude_prompt_reads_the_last_call_on_every_attempt() {
        // The first step: `claude.*` is empty on the first attempt, the failed one's on a retry.
        assert_eq!(
            codes(
                "- claude: '/a ${claude.session_id} ${claude.error_kind} ${claude.error}'\n  retry_config: {attempts: 2}\n"
            ),
            []
        );
        // Only the prompt: a first shell step has no `claude.*` yet, nor a prompt `shell.*`.
        assert_eq!(
            codes("- shell: 'echo ${claude.session_id}'\n"),
            [Code::UndefinedVariable]
        );
        assert_eq!(
            codes("- claude: '/a ${shell.output}'\n"),
            [Code::UndefinedVariable]
        );
    }

    #[test]
    fn error_kind_is_known_in_the_handlers_of_claude_steps_only() {
        assert_eq!(
            codes(
                "- claude: /a\n  on_failure:\n    shell: \"echo ${error.kind} ${error.type} ${error.message|shell}\"\n"
            ),
            []
        );
        let shell = checked("- shell: make\n  on_failure:\n    shell: \"echo ${error.kind}\"\n");
        assert_eq!(
            shell.iter().map(|d| d.code).collect::<Vec<_>>(),
            [Code::UndefinedVariable]
        );
        assert_eq!(
            shell[0].message,
            "`error.kind` is only set when a `claude` step fails"
        );
        assert_eq!(
            codes("- claude: /a\n  on_failure:\n    shell: \"echo ${error.knd}\"\n"),
            [Code::UndefinedVariable]
        );
    }

    #[test]
    fn shell_variables_describe_the_last_command_shell_or_claude() {
        // `${shell.*}` is set after a Claude command too: in its handler and after it.
        assert_eq!(
            codes(
                "- claude: /fix\n  on_failure:\n    shell: \"echo ${shell.output|shell} ${shell.stdout|shell} ${shell.exit_code}\"\n- shell: \"echo ${shell.stdout|shell}\"\n"
            ),
            []
        );
        assert_eq!(
            codes("- shell: make\n- shell: \"echo ${shell.stdot|shell}\"\n"),
            [Code::UndefinedVariable]
        );
        // `${shell.stdout}` is command output: unquoted in a shell command it is W006.
        assert_eq!(
            codes("- shell: make\n- shell: \"echo ${shell.stdout}\"\n"),
            [Code::UnquotedInterpolation]
        );
    }

    #[test]
    fn step_variables_follow_the_step_order() {
        assert_eq!(
            codes("- shell: 'echo ${shell.output}'\n"),
            [Code::UndefinedVariable]
        );
        assert_eq!(
            codes("- shell: make\n- claude: '/fix ${shell.output}'\n"),
            []
        );
        assert_eq!(
            codes("- shell: make\n  on_failure:\n    claude: '/fix ${error.message} ${attempt}'\n"),
            []
        );
        assert_eq!(
            codes("- claude: '/a ${error.message}'\n"),
            [Code::UndefinedVariable]
        );
        assert_eq!(
            codes("- claude: '/a ${v}'\n- shell: date\n  capture: v\n"),
            [Code::UndefinedVariable]
        );
    }

    #[test]
    fn on_success_captures_reach_later_steps_only() {
        let on_success = "- shell: build\n  on_success:\n    shell: measure\n    capture: metrics\n    on_success:\n      shell: report\n      capture: summary\n";
        assert_eq!(
            codes(&format!(
                "{on_success}- claude: '/record ${{metrics}} ${{summary}} ${{metrics.exit_code}}'\n"
            )),
            []
        );
        // Not before the step, and not in its own failure handler, where `on_success` has
        // not run.
        assert_eq!(
            codes(&format!("- claude: '/early ${{metrics}}'\n{on_success}")),
            [Code::UndefinedVariable]
        );
        assert_eq!(
            codes(
                "- shell: build\n  on_failure:\n    claude: '/fix ${metrics}'\n  on_success:\n    shell: measure\n    capture: metrics\n"
            ),
            [Code::UndefinedVariable]
        );
        // In a map agent it reaches the agent's later steps.
        assert_eq!(
            codes(&mapreduce(
                "shell: 'true'\n      on_success:\n        shell: 'echo 1'\n        capture: n\n    - claude: '/a ${n}'",
                "shell: 'true'"
            )),
            []
        );
    }

    #[test]
    fn captures_have_fields_only_when_json() {
        let text = |format: &str| {
            format!(
                "- shell: cat x\n  capture: data\n  capture_format: {format}\n- claude: '/a ${{data.name}} ${{data.exit_code}}'\n"
            )
        };
        assert_eq!(codes(&text("json")), []);
        assert_eq!(codes(&text("string")), [Code::UndefinedVariable]);
    }

    #[test]
    fn unknown_names_are_warnings_unless_they_look_like_environment_variables() {
        assert_eq!(codes("- claude: '/a ${branch}'\n"), [Code::MaybeUndefined]);
        assert_eq!(
            codes("- claude: '/a ${GITHUB_TOKEN} $branch ${branch:-main}'\n"),
            []
        );
        // A dotted name may come from `--param build.target=...` as well as a flat one.
        let dotted = checked("- claude: '/a ${build.target}'\n");
        assert_eq!(
            dotted.iter().map(|d| d.code).collect::<Vec<_>>(),
            [Code::MaybeUndefined]
        );
        assert_eq!(
            super::maybe_undefined_name(&dotted[0]),
            Some("build.target")
        );
        // An index is not a name a parameter can supply.
        assert_eq!(
            codes("- claude: '/a ${build[0]}'\n"),
            [Code::UndefinedVariable]
        );
        assert_eq!(
            codes(
                "env:\n  TARGET: x\ncommands:\n  - claude: '/a ${TARGET} ${env.HOME} ${workflow.name}'\n"
            ),
            []
        );
    }

    #[test]
    fn foreach_items_are_in_scope_inside_do() {
        assert_eq!(
            codes(
                "- foreach:\n    foreach: [a, b]\n    do:\n      - claude: '/x ${item} ${index} ${total}'\n"
            ),
            []
        );
    }

    #[test]
    fn untrusted_text_in_shell_commands_must_be_quoted() {
        let agent = |cmd: &str| mapreduce(&format!("shell: {cmd}"), "shell: 'true'");
        assert_eq!(
            codes(&agent("\"rm ${item.f}\"")),
            [Code::UnquotedInterpolation]
        );
        assert_eq!(
            codes(&agent("\"rm \\\"${item.f}\\\"\"")),
            [Code::UnquotedInterpolation]
        );
        assert_eq!(codes(&agent("\"rm ${item.f|shell}\"")), []);
        // What a failed command printed reaches a notification as `${event.error}`.
        assert_eq!(
            codes(
                "commands:\n  - shell: make\nnotify:\n  - on: failed\n    shell: \"echo ${event.error}\"\n"
            ),
            [Code::UnquotedInterpolation]
        );
        assert_eq!(
            codes(
                "commands:\n  - shell: make\nnotify:\n  - on: failed\n    shell: \"echo ${event.error|shell} ${event.status}\"\n"
            ),
            []
        );
        // Single quotes end at the first `'` of the text: no protection.
        assert_eq!(
            codes(&agent("\"rm '${item.f}'\"")),
            [Code::UnquotedInterpolation]
        );
        assert_eq!(
            codes(&agent("\"rm '${item.f|shell}'\"")),
            [Code::UnquotedInterpolation]
        );
        assert_eq!(codes(&agent("\"rm '${item_index}'\"")), []);
        // `|shell`'s quotes are literal inside double quotes, and removed before `eval` or
        // `sh -c` reads its script; a command substitution starts a fresh word.
        for (cmd, found) in [
            (r#"'echo "processing ${item.f|shell}"'"#, 1),
            (r#"'sh -c "echo ${item.f|shell}"'"#, 1),
            (r"'X=1 eval echo ${item.f|shell}'", 1),
            (r#"'/bin/bash -ec "echo x; rm ${item.f|shell}"'"#, 1),
            (r#"'sh -c ''echo "$1"'' sh ${item.f|shell}'"#, 0),
            (r#"'echo "$(cat ${item.f|shell})"'"#, 0),
            (r"'echo x; rm ${item.f|shell} # -c'", 0),
        ] {
            assert_eq!(codes(&agent(cmd)).len(), found, "{cmd}");
        }
        assert_eq!(codes(&agent("\"echo ${item_index}\"")), []);
    }

    fn w006_help(text: &str) -> Vec<String> {
        crate::check(&SourceFile::new("t.yml", text))
            .diagnostics
            .iter()
            .filter(|d| d.code == Code::UnquotedInterpolation)
            .map(|d| d.help.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn w006_suggests_an_exported_variable_only_where_one_holds_the_text() {
        let agent = |cmd: &str| mapreduce(&format!("shell: \"{cmd}\""), "shell: 'true'");
        assert_eq!(
            w006_help(&agent("rm ${item.id}")),
            ["write `${item.id|shell}`, or use the exported variable: \"$ITEM__ID\""]
        );
        assert_eq!(
            w006_help(&agent("rm ${item.fileName}")),
            ["write `${item.fileName|shell}`"]
        );
        // `env: {TEXT: ...}` is exported as `TEXT`, so `$TEXT` is not the capture.
        assert_eq!(
            w006_help(
                "env:\n  TEXT: fixed\ncommands:\n  - shell: cat x\n    capture: text\n  - shell: echo ${text}\n"
            ),
            ["write `${text|shell}`"]
        );
        assert_eq!(
            w006_help("- shell: cat x\n  capture: path\n- shell: echo ${path}\n"),
            ["write `${path|shell}`"]
        );
    }

    #[test]
    fn w006_inside_single_quotes_suggests_the_exported_variable() {
        let agent = |cmd: &str| mapreduce(&format!("shell: \"{cmd}\""), "shell: 'true'");
        assert_eq!(
            w006_help(&agent("echo '${item.x}'")),
            ["use the exported variable outside the single quotes: \"$ITEM__X\""]
        );
        assert_eq!(
            w006_help(&agent("echo 'id: ${item.fileName} ok'")),
            ["close the single quotes before it and write `${item.fileName|shell}`"]
        );
        // A `'` inside double quotes is no quote; a reference after closed quotes is plain.
        assert_eq!(
            w006_help(&agent("echo \\\"it's ${item.x}\\\"")).len(),
            1,
            "double-quoted: the usual help"
        );
    }

    #[test]
    fn the_shells_own_expansions_are_reported_with_the_escape() {
        let shell = |cmd: &str| checked(&format!("- shell: |\n    {cmd}\n"));
        for cmd in [
            "echo ${f%.rs}",
            "echo ${f#*/} ${#f}",
            "echo ${1}",
            "for f in *.rs; do echo ${f:-none}; done",
            "f=x; echo ${f}",
            "read -r line; echo ${line:-empty}",
        ] {
            let found = shell(cmd);
            assert!(
                !found.is_empty() && found.iter().all(|d| d.code == Code::ShellExpansion),
                "{cmd}: {found:?}"
            );
            let fixed = crate::fix::fix_all(
                &SourceFile::new("t.yml", format!("- shell: |\n    {cmd}\n")),
                |f| crate::check(f).diagnostics,
            );
            assert!(
                fixed.diagnostics.is_empty(),
                "{cmd}: {:?}",
                fixed.diagnostics
            );
            assert!(fixed.text.contains("$${"), "{}", fixed.text);
        }
        // Prodigy's own references, and the shell's `$$`, are not reported.
        for cmd in ["echo $$ ${HOME:-/} ${x:-none}", "x=1; echo $x"] {
            assert_eq!(shell(cmd), [], "{cmd}");
        }
        // A Prodigy variable that the command also sets is Prodigy's.
        assert_eq!(
            codes("env:\n  f: a\ncommands:\n  - shell: \"f=b; echo ${f:-x}\"\n"),
            []
        );
        // Elsewhere shell syntax is a syntax error whose help names the escape.
        let claude = checked("- claude: '/a ${f%.rs}'\n");
        assert_eq!(claude[0].code, Code::TemplateSyntax);
        assert!(
            claude[0]
                .help
                .as_deref()
                .unwrap_or("")
                .contains("$${f%.rs}")
        );
    }

    #[test]
    fn comparisons_of_types_that_never_compare_are_reported() {
        let when = |capture: &str, cond: &str| {
            codes(&format!(
                "- shell: echo 1\n  capture: x\n{capture}- shell: make\n  when: \"{cond}\"\n"
            ))
        };
        let mixed = [Code::MixedComparison];
        // A captured string may read as a number: not reported.
        assert_eq!(when("", "${x} > 10"), []);
        assert_eq!(when("", "${x} == 'abc'"), []);
        assert_eq!(when("", "${x} == true"), mixed);
        assert_eq!(when("", "${x.exit_code} != 'ok'"), mixed);
        assert_eq!(when("", "${x.exit_code} == '0'"), []);
        assert_eq!(when("", "x.success == 1"), mixed);
        assert_eq!(when("  capture_format: number\n", "${x} > 'big'"), mixed);
        assert_eq!(when("  capture_format: boolean\n", "${x} == true"), []);
        assert_eq!(when("  capture_format: json\n", "${x} == true"), []);
        assert_eq!(
            when("", "'abc' > 3 || !(1 == true)"),
            [Code::MixedComparison; 2]
        );
        let ne = checked("- shell: make\n  when: \"1 != 'one'\"\n");
        assert_eq!(
            ne[0].message,
            "this comparison is always true: its sides are of different types"
        );
    }

    #[test]
    fn when_conditions_read_variables() {
        assert_eq!(
            codes(
                "- shell: make\n  capture: build\n  capture_format: json\n- claude: /a\n  when: \"${build.ok} && build.target == 'release'\"\n"
            ),
            []
        );
        assert_eq!(
            codes("- claude: /a\n  when: \"${item.ok}\"\n"),
            [Code::UndefinedVariable]
        );
    }
}
