//! Lowering: spanned YAML tree → [`ast::Workflow`].
//!
//! Lowering applies aliases, legacy forms and defaults, and collects every problem in one pass:
//! it never stops at the first.
//! Unknown keys are errors with a did-you-mean; known keys without effect in their place are
//! warnings, so that no field is ever silently ignored.
//! It must not do I/O.

mod command;
mod env;
mod failure;
mod fields;
mod mapreduce;
mod notify;
mod parsed;
pub(crate) mod step;
#[cfg(test)]
mod tests;
mod validate;
mod values;
mod worktree;

pub(crate) use worktree::is_glob;

use crate::ast::{self, Mode, Workflow};
use crate::diagnostics::{Code, Diagnostic, Fix};
use crate::shapes::{self, Shape};
use crate::source::{Span, Spanned};
use crate::syntax::{Entry, Node, NodeKind};
pub(crate) use fields::Fields;
use fields::Misreads;

/// Lowers a parsed document. Returns `None` when the root is missing or not a workflow.
pub fn lower(text: &str, root: Option<&Node>) -> (Option<Workflow>, Vec<Diagnostic>) {
    let mut lw = Lowerer::new(text);
    let workflow = root.and_then(|root| lw.workflow(root));
    (workflow, lw.finish())
}

/// The state of one lowering pass.
pub(crate) struct Lowerer<'a> {
    /// The whole file, to map positions inside strings back onto it.
    pub(crate) text: &'a str,
    pub(crate) diagnostics: Vec<Diagnostic>,
    /// Every step `id` seen, with where, to report duplicates.
    step_ids: std::collections::BTreeMap<String, Span>,
    /// Keys read that their shape does not declare: lowering bugs, reported as `ICE`.
    misreads: Misreads,
}

/// The best suggestion for a misspelt word among candidates, if one is close enough.
pub fn suggest<'c>(word: &str, candidates: impl IntoIterator<Item = &'c str>) -> Option<&'c str> {
    let word_lower = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| {
            (
                c,
                strsim::damerau_levenshtein(&word_lower, &c.to_ascii_lowercase()),
            )
        })
        .filter(|(c, d)| {
            let longest = word.chars().count().max(c.chars().count());
            *d <= 2.max(longest / 3) && *d < longest
        })
        .min_by_key(|(_, d)| *d)
        .map(|(c, _)| c)
}

/// "`a`, `b` or `c`".
pub(crate) fn one_of(choices: &[&str]) -> String {
    let quoted: Vec<String> = choices.iter().map(|c| format!("`{c}`")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

impl<'a> Lowerer<'a> {
    fn new(text: &'a str) -> Self {
        Lowerer {
            text,
            diagnostics: Vec::new(),
            step_ids: std::collections::BTreeMap::new(),
            misreads: Misreads::default(),
        }
    }

    /// Every diagnostic of the pass, with an internal error for each key that lowering read
    /// and its shape does not declare.
    fn finish(self) -> Vec<Diagnostic> {
        let mut diagnostics = self.diagnostics;
        diagnostics.extend(
            self.misreads
                .borrow()
                .iter()
                .map(fields::Misread::diagnostic),
        );
        diagnostics
    }
}

impl Lowerer<'_> {
    pub(crate) fn push(&mut self, diagnostic: Diagnostic) {
        self.diagnostics.push(diagnostic);
    }

    /// Checks that `node` is a mapping whose keys are all declared by `shape`, reporting the
    /// others. `what` names the mapping in messages ("a step", "`retry_config`").
    pub(crate) fn fields<'n>(
        &mut self,
        node: &'n Node,
        what: &str,
        shape: &'static Shape,
    ) -> Option<Fields<'n>> {
        let Some(map) = node.as_map() else {
            self.wrong_type(node, what, "a mapping");
            return None;
        };
        let known = shape.names();
        let known = known.as_slice();
        // Messages name only the keys written today, never a deprecated or removed one.
        let mut current: Vec<&str> = shape.current().map(|k| k.name).collect();
        if current.is_empty() {
            current = known.to_vec();
        }
        let mut entries = Vec::with_capacity(map.len());
        for entry in map {
            let Some(key) = entry.key.text().filter(|_| entry.key.as_map().is_none()) else {
                self.push(
                    Diagnostic::new(Code::WrongType, format!("keys of {what} must be strings"))
                        .with_primary(entry.key.span, format!("found {}", entry.key.describe()))
                        .with_help("write a plain key such as `name:`"),
                );
                continue;
            };
            if known.contains(&key) {
                entries.push((key, entry));
            } else {
                self.unknown_key(entry, key, what, &current);
                // The did-you-mean is a sure fix unless the mapping already has that key.
                if let (Some(last), Some(suggested)) = (
                    self.diagnostics.last_mut(),
                    suggest(key, current.iter().copied()),
                ) && !map.iter().any(|e| e.key.text() == Some(suggested))
                {
                    last.fix = Some(Fix::replace(
                        format!("rename `{key}` to `{suggested}`"),
                        entry.key.span,
                        suggested,
                    ));
                }
            }
        }
        Some(Fields::new(
            entries,
            shape,
            what,
            node.span,
            Misreads::clone(&self.misreads),
        ))
    }

    /// A mapping read as `shape` without reporting anything about its keys: to tell its
    /// forms apart before lowering it, or to read a mapping that is lowered elsewhere.
    pub(crate) fn peek<'n>(&self, node: &'n Node, shape: &'static Shape) -> Option<Fields<'n>> {
        let entries = node
            .as_map()?
            .iter()
            .filter_map(|e| Some((e.key.text().filter(|_| e.key.as_map().is_none())?, e)))
            .filter(|(k, _)| shape.key(k).is_some())
            .collect();
        Some(Fields::new(
            entries,
            shape,
            "",
            node.span,
            Misreads::clone(&self.misreads),
        ))
    }

    fn unknown_key(&mut self, entry: &Entry, key: &str, what: &str, known: &[&str]) {
        let help = match (
            shapes::workflow_only_help(key).filter(|_| what == "`claude`"),
            suggest(key, known.iter().copied()),
        ) {
            (Some(help), _) => help,
            (None, Some(s)) => format!("did you mean `{s}`?"),
            (None, None) => format!("{what} accepts {}", one_of(known)),
        };
        self.push(
            Diagnostic::new(Code::UnknownKey, format!("unknown key `{key}` in {what}"))
                .with_primary(entry.key.span, "unknown key")
                .with_help(help),
        );
    }

    /// Reports a value of the wrong shape. `expected` lists the accepted forms.
    pub(crate) fn wrong_type(&mut self, node: &Node, what: &str, expected: &str) {
        self.push(
            Diagnostic::new(Code::WrongType, format!("{what} must be {expected}"))
                .with_primary(node.span, format!("found {}", node.describe()))
                .with_help(format!("write {what} as {expected}")),
        );
    }

    /// Reports a value of the wrong form at SPAN, FOUND being what it is.
    pub(crate) fn wrong_type_at(&mut self, span: Span, what: &str, expected: &str, found: &str) {
        self.push(
            Diagnostic::new(Code::WrongType, format!("{what} must be {expected}"))
                .with_primary(span, format!("found {found}"))
                .with_help(format!("write {what} as {expected}")),
        );
    }

    /// Reports a missing required key on a mapping.
    pub(crate) fn missing(&mut self, at: Span, what: &str, key: &str, help: &str) {
        self.push(
            Diagnostic::new(Code::MissingKey, format!("{what} is missing `{key}`"))
                .with_primary(at, format!("`{key}` is required here"))
                .with_help(help.to_owned()),
        );
    }

    /// Reports a known key that has no effect where it is.
    pub(crate) fn no_effect(&mut self, entry: &Entry, why: &str, help: &str) {
        let key = entry.key.text().unwrap_or("?");
        self.push(
            Diagnostic::new(Code::NoEffect, format!("`{key}` has no effect here"))
                .with_primary(entry.key.span, why.to_owned())
                .with_help(help.to_owned()),
        );
    }

    /// Reports a deprecated form.
    pub(crate) fn deprecated(&mut self, span: Span, message: &str, help: &str) {
        self.push(
            Diagnostic::new(Code::Deprecated, message.to_owned())
                .with_primary(span, "deprecated")
                .with_help(help.to_owned()),
        );
    }

    /// Reports a deprecated form with the fix that writes its replacement.
    pub(crate) fn deprecated_fixed(
        &mut self,
        span: Span,
        message: &str,
        help: &str,
        fix: Option<Fix>,
    ) {
        self.deprecated(span, message, help);
        if let (Some(last), Some(fix)) = (self.diagnostics.last_mut(), fix) {
            last.fix = Some(fix);
        }
    }

    /// The span of the whole lines an entry occupies, newline included, when nothing else is
    /// on them (only indentation before the key, only spaces after the value): deleting it
    /// deletes the entry and nothing else.
    pub(crate) fn entry_lines(&self, entry: &Entry) -> Option<Span> {
        let text = self.text;
        let start = entry.key.span.start as usize;
        let end = entry.value.span.end.max(entry.key.span.end) as usize;
        let line_start = text.get(..start)?.rfind('\n').map_or(0, |i| i + 1);
        if !text.get(line_start..start)?.trim().is_empty() {
            return None;
        }
        let rest = text.get(end..)?;
        let line_end = rest.find('\n').map_or(text.len(), |i| end + i + 1);
        text.get(end..line_end)?
            .trim()
            .is_empty()
            .then(|| Span::new(line_start, line_end))
    }

    /// Reports one setting written in two places.
    pub(crate) fn duplicate(
        &mut self,
        here: Span,
        there: Span,
        key: &str,
        inner: &str,
        outer: &str,
    ) {
        self.push(
            Diagnostic::new(Code::DuplicateKey, format!("`{key}` is set twice"))
                .with_primary(here, format!("set in {inner}"))
                .with_label(there, format!("and in {outer}"))
                .with_help(format!("keep one `{key}`")),
        );
    }

    /// Records a step id and reports a duplicate.
    pub(crate) fn step_id(&mut self, id: &Spanned<String>) {
        if let Some(first) = self.step_ids.get(&id.value).copied() {
            self.push(
                Diagnostic::new(
                    Code::DuplicateStepId,
                    format!("duplicate step id `{}`", id.value),
                )
                .with_primary(id.span, "this id is already used")
                .with_label(first, "first used here")
                .with_help("give each step a unique `id`; later steps refer to it by name"),
            );
        } else {
            self.step_ids.insert(id.value.clone(), id.span);
        }
    }

    fn workflow(&mut self, root: &Node) -> Option<Workflow> {
        match &root.kind {
            NodeKind::Seq(_) => {
                let commands = self.steps(root, "the workflow", step::Ctx::default());
                if root.as_seq().is_some_and(<[Node]>::is_empty) {
                    self.empty_workflow(root.span);
                }
                Some(Workflow {
                    commands,
                    span: root.span,
                    ..Workflow::default()
                })
            }
            NodeKind::Map(_) => self.workflow_map(root),
            NodeKind::Scalar { .. } => {
                self.push(
                    Diagnostic::new(
                        Code::NotAWorkflow,
                        "a workflow must be a list of steps or a mapping",
                    )
                    .with_primary(root.span, format!("found {}", root.describe()))
                    .with_help("start the file with `commands:` followed by a list of steps"),
                );
                None
            }
        }
    }

    fn empty_workflow(&mut self, span: Span) {
        self.push(
            Diagnostic::new(Code::EmptyWorkflow, "the workflow has no steps")
                .with_primary(span, "nothing to run")
                .with_help("add a step such as `- shell: \"make test\"`"),
        );
    }

    #[expect(
        clippy::too_many_lines,
        reason = "table-shaped lowering: one arm per top-level key of a workflow map"
    )]
    fn workflow_map(&mut self, root: &Node) -> Option<Workflow> {
        let fields = self.fields(root, "the workflow", &shapes::WORKFLOW)?;
        let mut wf = Workflow {
            span: root.span,
            ..Workflow::default()
        };
        wf.name = fields.string(self, "name");
        wf.description = fields.string(self, "description");
        wf.mode = fields.choice_or(
            self,
            "mode",
            &[("standard", Mode::Standard), ("mapreduce", Mode::MapReduce)],
            Mode::Standard,
        );
        let mapreduce = wf.mode == Mode::MapReduce;
        let mode_key = fields.entry("mode");

        // Keys that belong to one mode only.
        let standard_only = ["commands", "steps"];
        let mapreduce_only = ["setup", "map", "reduce"];
        for (key, entry) in fields.keys() {
            if mapreduce && standard_only.contains(&key) {
                self.push(
                    Diagnostic::new(
                        Code::WrongMode,
                        format!("`{key}` is not part of a MapReduce workflow"),
                    )
                    .with_primary(
                        entry.key.span,
                        "a MapReduce workflow runs `setup`, `map`, `reduce`",
                    )
                    .with_help("move these steps into `setup:` or `map.agent_template:`"),
                );
            }
            // Without `mode` but with `map`, the V006 fix-it below says all there is to say.
            if !mapreduce && !fields.has("map") && mapreduce_only.contains(&key) {
                let mut d =
                    Diagnostic::new(Code::WrongMode, format!("`{key}` needs `mode: mapreduce`"))
                        .with_primary(entry.key.span, "only MapReduce workflows have this phase");
                d = match mode_key {
                    Some(m) => d.with_label(m.value.span, "the workflow is standard"),
                    None => d,
                };
                self.push(d.with_help(
                    "add `mode: mapreduce` at the top level, or move the steps into `commands:`",
                ));
            }
        }

        if !mapreduce {
            match fields.aliased(self, "commands", "steps") {
                Some(e) => {
                    wf.commands =
                        self.steps(&e.value, &fields.label("commands"), step::Ctx::default());
                    if e.value.as_seq().is_some_and(<[Node]>::is_empty) {
                        self.empty_workflow(e.value.span);
                    }
                }
                None => {
                    if let Some(map) = fields.entry("map") {
                        let mut d = Diagnostic::new(
                            Code::MapWithoutMapReduce,
                            "`map` needs `mode: mapreduce`",
                        )
                        .with_primary(map.key.span, "a map phase in a standard workflow");
                        if let Some(m) = mode_key {
                            d = d.with_label(m.value.span, "the mode is set here");
                        }
                        self.push(
                            d.with_help("add `mode: mapreduce` at the top level of the workflow"),
                        );
                    } else if !misspelt(root, &["commands", "steps"]) {
                        // A misspelt `comands:` already has its own did-you-mean.
                        self.missing(
                            first_key_span(root),
                            "the workflow",
                            "commands",
                            "list the steps under `commands:`",
                        );
                    }
                }
            }
            if let Some(map) = fields
                .entry("map")
                .filter(|_| fields.has("commands") || fields.has("steps"))
            {
                self.push(
                    Diagnostic::new(Code::MapWithoutMapReduce, "`map` needs `mode: mapreduce`")
                        .with_primary(map.key.span, "a map phase in a standard workflow")
                        .with_help("add `mode: mapreduce` at the top level of the workflow"),
                );
            }
        } else if !fields.has("map") {
            let at = mode_key.map_or(root.span, |m| m.value.span);
            self.push(
                Diagnostic::new(
                    Code::MapReduceWithoutMap,
                    "a MapReduce workflow needs a `map` phase",
                )
                .with_primary(at, "`mode: mapreduce` is set here")
                .with_help(
                    "add `map:` with `input:` and `agent_template:`, or remove `mode: mapreduce`",
                ),
            );
        }

        if let Some(env) = fields.read(self, "env", |lw, n, what| Some(lw.env_map(n, what))) {
            wf.env = env;
        }
        if let Some(secrets) = fields.node("secrets") {
            wf.secrets = self.secrets(secrets);
        }
        wf.env_files = fields.templates(self, "env_files");
        if let Some(profiles) = fields.node("profiles") {
            wf.profiles = self.profiles(profiles);
        }
        if let Some(claude) = fields.node("claude")
            && let Some(settings) = self.fields(claude, "`claude`", &shapes::CLAUDE_DEFAULTS)
        {
            wf.claude = Some(self.claude_settings(&settings));
            wf.claude_budget = self.claude_budget(&settings);
            wf.claude_limits = self.claude_limits(&settings);
        }
        if let Some(handlers) = fields.node("handlers") {
            wf.handlers = self.handlers(handlers);
        }
        if let Some(merge) = fields.node("merge") {
            wf.merge = self.merge(merge, mapreduce);
        }
        if let Some(entry) = fields.entry("slurm") {
            wf.slurm = self.slurm(&entry.value);
            if !mapreduce {
                self.no_effect(
                    entry,
                    "only the map agents of a MapReduce workflow run on Slurm",
                    "remove `slurm:`, or add `mode: mapreduce` with a `map` phase",
                );
            }
        }
        if let Some(entry) = fields.entry("worktree") {
            wf.worktree = self.worktree_prep(entry, mapreduce);
        }
        if let Some(notify) = fields.node("notify") {
            wf.notify = self.notify(notify);
        }
        if let Some(entry) = fields.entry("executor") {
            self.executor(entry, &mut wf, fields.entry("slurm"));
            if !mapreduce {
                self.no_effect(
                    entry,
                    "only the map agents of a MapReduce workflow run on an agent backend",
                    "remove `executor:`, or add `mode: mapreduce` with a `map` phase",
                );
            }
        }
        wf.error_policy = self.error_policy(&fields, mapreduce, &wf.handlers);
        if mapreduce {
            if let Some(setup) = fields.node("setup") {
                wf.setup = self.setup(setup);
            }
            if let Some(map) = fields.node("map") {
                wf.map = self.map_phase(map);
            }
            wf.reduce = fields.read(self, "reduce", |lw, n, what| Some(lw.phase_steps(n, what)));
        }
        Some(wf)
    }
}

/// Whether an unknown key of `node` looks like a misspelling of one of `keys`.
fn misspelt(node: &Node, keys: &[&str]) -> bool {
    node.as_map()
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e.key.text())
        .any(|k| shapes::WORKFLOW.key(k).is_none() && suggest(k, keys.iter().copied()).is_some())
}

fn first_key_span(node: &Node) -> Span {
    node.as_map()
        .and_then(|m| m.first())
        .map_or(node.span, |e| e.key.span)
}

/// Lowered handler lists, by name, for `custom:<name>` checks.
pub(crate) fn handler_names(handlers: &[ast::NamedSteps]) -> impl Iterator<Item = &str> {
    handlers.iter().map(|h| h.name.value.as_str())
}
