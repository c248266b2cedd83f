//! Diagnostics: what the compiler says about a workflow.
//!
//! A [`Diagnostic`] is plain data (code, severity, message, labelled spans, help) so that every
//! output format (human, JSON, and later SARIF and LSP) renders the same facts.
//! [`render_human`] renders with miette exactly as `prodigy check` prints.

mod codes;

use std::fmt::Write as _;
use std::sync::Arc;

pub use codes::Code;
use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, SourceCode};

use crate::source::{SourceFile, Span};

/// How serious a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The workflow still compiles; something is probably not what the author meant.
    Warning,
    /// The workflow does not compile.
    Error,
}

/// A span with a short text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    /// Where.
    pub span: Span,
    /// What is wrong there, or how the place relates to the problem.
    pub text: String,
}

/// One problem found in a workflow file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Diagnostic {
    /// The stable code.
    pub code: Code,
    /// Error or warning.
    pub severity: Severity,
    /// Lowercase, no final period, identifiers in backticks.
    pub message: String,
    /// The exact place of the problem.
    pub primary: Option<Label>,
    /// Related places.
    pub labels: Vec<Label>,
    /// One imperative line saying how to fix it.
    pub help: Option<String>,
}

impl Diagnostic {
    /// A diagnostic with the code's default severity.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            severity: code.default_severity(),
            message: message.into(),
            primary: None,
            labels: Vec::new(),
            help: None,
        }
    }

    /// Sets the primary label.
    #[must_use]
    pub fn with_primary(mut self, span: Span, text: impl Into<String>) -> Self {
        self.primary = Some(Label {
            span,
            text: text.into(),
        });
        self
    }

    /// Adds a secondary label.
    #[must_use]
    pub fn with_label(mut self, span: Span, text: impl Into<String>) -> Self {
        self.labels.push(Label {
            span,
            text: text.into(),
        });
        self
    }

    /// Sets the help line.
    #[must_use]
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Whether this diagnostic is an error.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// The start of the primary span, for ordering.
    fn sort_key(&self) -> (u32, u32, Code) {
        let span = self.primary.as_ref().map(|l| l.span).unwrap_or_default();
        (span.start, span.end, self.code)
    }
}

/// Sorts diagnostics by position, then code, so that output is deterministic.
pub fn sort(diagnostics: &mut [Diagnostic]) {
    diagnostics.sort_by_key(Diagnostic::sort_key);
}

/// The shared text of a file, as miette wants it.
#[derive(Debug)]
struct Text(Arc<str>);

impl SourceCode for Text {
    fn read_span<'a>(
        &'a self,
        span: &miette::SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn miette::SpanContents<'a> + 'a>, miette::MietteError> {
        self.0
            .as_ref()
            .read_span(span, context_lines_before, context_lines_after)
    }
}

/// A diagnostic bound to its file, ready for miette.
#[derive(Debug)]
struct Bound<'a> {
    diagnostic: &'a Diagnostic,
    source: miette::NamedSource<Text>,
}

impl std::fmt::Display for Bound<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.diagnostic.message)
    }
}

impl std::error::Error for Bound<'_> {}

impl miette::Diagnostic for Bound<'_> {
    fn code<'b>(&'b self) -> Option<Box<dyn std::fmt::Display + 'b>> {
        Some(Box::new(self.diagnostic.code))
    }

    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.diagnostic.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        })
    }

    fn help<'b>(&'b self) -> Option<Box<dyn std::fmt::Display + 'b>> {
        self.diagnostic
            .help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn std::fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn SourceCode> {
        Some(&self.source)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let primary = self
            .diagnostic
            .primary
            .iter()
            .map(|l| LabeledSpan::new_primary_with_span(Some(l.text.clone()), l.span));
        let others = self
            .diagnostic
            .labels
            .iter()
            .map(|l| LabeledSpan::new_with_span(Some(l.text.clone()), l.span));
        Some(Box::new(primary.chain(others)))
    }
}

/// Renders diagnostics as `prodigy check` prints them, without colour, `width` columns wide.
pub fn render_human(
    file: &SourceFile,
    diagnostics: &[Diagnostic],
    width: usize,
    color: bool,
) -> String {
    let theme = if color {
        GraphicalTheme::unicode()
    } else {
        GraphicalTheme::unicode_nocolor()
    };
    let handler = GraphicalReportHandler::new_themed(theme)
        .with_width(width)
        .with_links(false);
    let mut out = String::new();
    for (i, diagnostic) in diagnostics.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let bound = Bound {
            diagnostic,
            source: miette::NamedSource::new(&file.name, Text(file.text.clone())),
        };
        if handler.render_report(&mut out, &bound).is_err() {
            let _ = write!(out, "{}: {}", diagnostic.code, diagnostic.message);
        }
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}
