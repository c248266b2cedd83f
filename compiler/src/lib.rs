//! The Prodigy workflow compiler.
//!
//! Text goes in, an AST and diagnostics come out: [`source`] loads files, [`syntax`] builds a
//! spanned YAML tree, [`lower`] turns it into an [`ast::Workflow`] and reports every problem
//! it finds, in one pass.
//! The crate is pure and synchronous: no tokio, no processes, no I/O beyond
//! [`source::SourceFile::load`].

pub mod ast;
pub mod diagnostics;
pub mod lower;
pub mod source;
pub mod syntax;

use diagnostics::Diagnostic;
use source::SourceFile;

/// What compiling one file produced.
#[derive(Debug)]
pub struct Checked {
    /// The workflow, when the file was well-formed enough to lower.
    pub workflow: Option<ast::Workflow>,
    /// Every problem found, sorted by position.
    pub diagnostics: Vec<Diagnostic>,
}

impl Checked {
    /// Whether any diagnostic is an error.
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

/// Parses and lowers a file, collecting every diagnostic.
pub fn check(file: &SourceFile) -> Checked {
    let document = syntax::parse(file);
    let mut diagnostics = document.diagnostics;
    let (workflow, lowered) = lower::lower(document.root.as_ref());
    diagnostics.extend(lowered);
    diagnostics::sort(&mut diagnostics);
    Checked {
        workflow,
        diagnostics,
    }
}

/// What the checks may learn about the world outside the file.
///
/// The compiler does no I/O of its own; the caller answers these questions.
pub struct Surroundings<'a> {
    /// Whether a path, relative to the project directory, names an existing file.
    pub file_exists: &'a dyn Fn(&str) -> bool,
}

/// [`check`], plus the checks that need to know about the project directory:
/// `env_files` that do not exist.
pub fn check_in(file: &SourceFile, surroundings: &Surroundings<'_>) -> Checked {
    let mut checked = check(file);
    if let Some(workflow) = &checked.workflow {
        for path in &workflow.env_files {
            // A templated path is only known at run time.
            if path.value.contains('$') || (surroundings.file_exists)(&path.value) {
                continue;
            }
            checked.diagnostics.push(
                Diagnostic::new(
                    diagnostics::Code::MissingEnvFile,
                    format!("env file `{}` does not exist", path.value),
                )
                .with_primary(path.span, "no such file in the project directory")
                .with_help(
                    "create the file, fix the path (relative to where prodigy runs), or remove the entry",
                ),
            );
        }
        diagnostics::sort(&mut checked.diagnostics);
    }
    checked
}
