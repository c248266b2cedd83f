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
