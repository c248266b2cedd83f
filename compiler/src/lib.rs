//! The Prodigy workflow compiler.
//!
//! Text goes in, an AST and diagnostics come out: [`source`] loads files, [`syntax`] builds a
//! spanned YAML tree, [`lower`] turns it into an [`ast::Workflow`] and reports every problem
//! it finds, in one pass.
//! The crate is pure and synchronous: no tokio, no processes, no I/O beyond
//! [`source::SourceFile::load`].

pub mod ast;
pub mod checks;
pub mod claude;
pub mod detect;
pub mod diagnostics;
pub mod emit;
mod fields;
pub mod fix;
pub mod ide;
pub mod ir;
pub mod lower;
pub mod plan;
pub mod schema;
pub mod scope;
pub mod shapes;
pub mod shell;
pub mod source;
pub mod suppress;
pub mod syntax;

use diagnostics::Diagnostic;
use source::SourceFile;

/// What compiling one file produced.
#[derive(Debug)]
pub struct Checked {
    /// The workflow, when the file was well-formed enough to lower.
    pub workflow: Option<ast::Workflow>,
    /// The plan, when the workflow has no errors.
    pub plan: Option<plan::Plan>,
    /// The IR graph, when the workflow has no errors.
    pub graph: Option<ir::Graph>,
    /// Every problem found, sorted by position.
    pub diagnostics: Vec<Diagnostic>,
}

impl Checked {
    /// Whether any diagnostic is an error.
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

/// What the checks may learn about the world outside the file.
///
/// The compiler does no I/O of its own; the caller answers these questions.
pub struct Surroundings<'a> {
    /// Whether a path, relative to the project directory, names an existing file.
    pub file_exists: &'a dyn Fn(&str) -> bool,
    /// The text of a file relative to the project directory, if it can be read.
    pub read_file: &'a dyn Fn(&str) -> Option<String>,
    /// Whether a path, relative to the project directory, is a file git tracks (`false`
    /// outside a repository).
    pub tracked: &'a dyn Fn(&str) -> bool,
    /// Whether the Claude Code command NAME (`/NAME` in a prompt) is defined where Claude
    /// Code looks for it: [`claude::find_command`] over the `.claude` directories of the
    /// workflow's project and of the user's home.
    pub slash_command: &'a dyn Fn(&str) -> claude::CommandLookup,
}

/// An external linter of `shell:` commands (ShellCheck): it gets every command of a file as
/// a script and returns what it found.
pub type ShellLint<'a> = &'a dyn Fn(&[shell::Script]) -> Vec<shell::Finding>;

/// Parses and lowers a file, collecting every diagnostic.
pub fn check(file: &SourceFile) -> Checked {
    compile(file, None, None)
}

/// [`check`], plus the checks that need to know about the project directory:
/// `env_files` that do not exist, and slash commands that nothing defines.
pub fn check_in(file: &SourceFile, surroundings: &Surroundings<'_>) -> Checked {
    compile(file, Some(surroundings), None)
}

/// [`check_in`], plus what an external linter finds in the `shell:` commands (warnings
/// [`diagnostics::Code::Shellcheck`], suppressible like any other).
pub fn check_linted(
    file: &SourceFile,
    surroundings: &Surroundings<'_>,
    lint: ShellLint<'_>,
) -> Checked {
    compile(file, Some(surroundings), Some(lint))
}

fn compile(
    file: &SourceFile,
    surroundings: Option<&Surroundings<'_>>,
    lint: Option<ShellLint<'_>>,
) -> Checked {
    let document = syntax::parse(file);
    let mut diagnostics = document.diagnostics;
    if document.root.is_none() && diagnostics.is_empty() {
        diagnostics.push(
            Diagnostic::new(
                diagnostics::Code::EmptyFile,
                "the file holds no workflow: it is empty or only comments",
            )
            .with_primary(source::Span::new(0, 0), "no YAML document")
            .with_help("write a list of steps or a mapping with `commands:`, or delete the file"),
        );
    }
    let (workflow, lowered) = lower::lower(&file.text, document.root.as_ref());
    diagnostics.extend(lowered);
    let mut compiled = None;
    if let Some(workflow) = &workflow {
        diagnostics.extend(scope::check(workflow, &file.text));
        if let Some(surroundings) = surroundings {
            diagnostics.extend(missing_env_files(workflow, surroundings));
            diagnostics.extend(missing_copies(workflow, surroundings));
            if let Some(map) = &workflow.map {
                diagnostics.extend(fields::check(map, &file.text, surroundings));
                diagnostics.extend(fields::missing_input(
                    workflow,
                    map,
                    &file.text,
                    surroundings,
                ));
            }
            diagnostics.extend(claude::unknown_commands(
                workflow,
                &file.text,
                surroundings.slash_command,
            ));
        }
        if let Some(lint) = lint {
            let scripts = shell::scripts(workflow);
            if !scripts.is_empty() {
                let findings = lint(&scripts);
                diagnostics.extend(shell::diagnostics(file, &scripts, &findings));
            }
        }
        if !diagnostics.iter().any(Diagnostic::is_error) {
            let plan = plan::plan(workflow, file);
            let graph = ir::build(&plan);
            if graph.has_unbounded_cycle() {
                diagnostics.push(
                    Diagnostic::new(
                        diagnostics::Code::Internal,
                        "internal error: the workflow graph has a cycle that is not a retry",
                    )
                    .with_primary(workflow.span, "while compiling this workflow")
                    .with_help("this is a bug in prodigy; please report it with the file"),
                );
            } else {
                // The checks only warn: a plan exists exactly when the file has no errors.
                diagnostics.extend(checks::check(&plan, &graph));
                if let Some(surroundings) = surroundings
                    && let Some(count) = static_item_count(&plan, surroundings)
                {
                    diagnostics.extend(checks::breaker(&plan, count));
                }
                compiled = Some((plan, graph));
            }
        }
    }
    let steps: Vec<source::Span> = workflow
        .as_ref()
        .map(|w| all_steps(w).iter().map(|s| s.span).collect())
        .unwrap_or_default();
    // Without the linter, a suppression of its findings is not known to be useless.
    let unchecked: &[diagnostics::Code] = if lint.is_some() {
        &[]
    } else {
        &[diagnostics::Code::Shellcheck]
    };
    suppress::apply_unchecked(file, &steps, &mut diagnostics, unchecked);
    diagnostics::sort(&mut diagnostics);
    let (plan, graph) = compiled.map_or((None, None), |(p, g)| (Some(p), Some(g)));
    Checked {
        workflow,
        plan,
        graph,
        diagnostics,
    }
}

/// Every step, nested ones included.
pub(crate) fn all_steps(workflow: &ast::Workflow) -> Vec<&ast::Step> {
    fn walk<'w>(steps: &'w [ast::Step], out: &mut Vec<&'w ast::Step>) {
        for step in steps {
            out.push(step);
            walk(&step.on_success, out);
            for h in &step.on_exit_code {
                walk(&h.steps, out);
            }
            if let Some(f) = &step.on_failure {
                walk(&f.handler, out);
            }
            if let Some(v) = &step.validate {
                walk(&v.commands, out);
                if let Some(o) = &v.on_incomplete {
                    walk(&o.commands, out);
                }
            }
            if let ast::Command::Foreach(f) = &step.command {
                walk(&f.steps, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&workflow.commands, &mut out);
    for list in [
        workflow.setup.as_ref().map(|s| &s.commands),
        workflow.map.as_ref().map(|m| &m.agent_template),
        workflow.reduce.as_ref(),
        workflow.merge.as_ref().map(|m| &m.commands),
        workflow.merge.as_ref().map(|m| &m.on_conflict),
        workflow.merge.as_ref().map(|m| &m.verify),
    ]
    .into_iter()
    .flatten()
    {
        walk(list, &mut out);
    }
    for handler in &workflow.handlers {
        walk(&handler.steps, &mut out);
    }
    out
}

/// The number of map items, when the input is a file that can be read now.
fn static_item_count(plan: &plan::Plan, surroundings: &Surroundings<'_>) -> Option<usize> {
    use prodigy_grammar::pipeline::{InputKind, parse_input};
    let map = plan.map.as_ref()?;
    if !map.input.parsed.is_literal() {
        return None;
    }
    let text = (surroundings.read_file)(&map.input.value)?;
    let input = parse_input(&text, InputKind::of_file(&map.input.value)).ok()?;
    Some(map.pipeline().apply(input.document).0.len())
}

/// W013: a plain `worktree.copy` path (no glob) that names no file of the checkout; W014:
/// one that git tracks, which every worktree has already.
fn missing_copies(workflow: &ast::Workflow, surroundings: &Surroundings<'_>) -> Vec<Diagnostic> {
    workflow
        .worktree
        .iter()
        .flat_map(|w| &w.copy)
        // A path V110 refuses is not looked for.
        .filter(|path| !path.value.starts_with('/') && !path.value.split('/').any(|p| p == ".."))
        .filter(|path| !lower::is_glob(&path.value))
        .filter_map(|path| {
            if !(surroundings.file_exists)(&path.value) {
                Some(Diagnostic::new(
                    diagnostics::Code::MissingCopy,
                    format!("`worktree.copy` names `{}`, which does not exist", path.value),
                )
                .with_primary(path.span, "no such file in the project directory")
                .with_help("create the file before the run, fix the path (relative to the repository's root), or remove the entry"))
            } else if (surroundings.tracked)(&path.value) {
                Some(Diagnostic::new(
                    diagnostics::Code::TrackedCopy,
                    format!("`worktree.copy` names `{}`, which git tracks", path.value),
                )
                .with_primary(path.span, "every worktree has this file already")
                .with_help("remove the entry: `copy` is for files git does not track, such as `.env`"))
            } else {
                None
            }
        })
        .collect()
}

fn missing_env_files(workflow: &ast::Workflow, surroundings: &Surroundings<'_>) -> Vec<Diagnostic> {
    workflow
        .env_files
        .iter()
        // A templated path is only known at run time.
        .filter(|path| !path.value.contains('$') && !(surroundings.file_exists)(&path.value))
        .map(|path| {
            Diagnostic::new(diagnostics::Code::MissingEnvFile, format!("env file `{}` does not exist", path.value))
                .with_primary(path.span, "no such file in the project directory")
                .with_help("create the file, fix the path (relative to where prodigy runs), or remove the entry")
        })
        .collect()
}
