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

/// One change to a file's text: replace the bytes of `span` by `replacement` (an empty span
/// inserts, an empty replacement deletes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edit {
    /// The bytes replaced.
    pub span: Span,
    /// What goes in their place.
    pub replacement: String,
}

/// A change the checker is sure of: applying its edits fixes the diagnostic without changing
/// what the workflow means otherwise. `prodigy check --fix` applies it; editors offer it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fix {
    /// What the fix does, imperative and lowercase: "rename `max_attemps` to `max_attempts`".
    pub description: String,
    /// The edits, which never overlap one another.
    pub edits: Vec<Edit>,
}

impl Fix {
    /// A fix of one edit.
    pub fn replace(
        description: impl Into<String>,
        span: Span,
        replacement: impl Into<String>,
    ) -> Self {
        Self {
            description: description.into(),
            edits: vec![Edit {
                span,
                replacement: replacement.into(),
            }],
        }
    }
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
    /// The edits that fix it, when the checker is sure of them.
    pub fix: Option<Fix>,
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
            fix: None,
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

    /// Attaches a sure fix.
    #[must_use]
    pub fn with_fix(mut self, fix: Fix) -> Self {
        self.fix = Some(fix);
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

/// A file's text as miette reads it. miette's own reader scans from the start of the text
/// for every label, which is quadratic for a large file with many diagnostics; this one hands
/// it only the lines around the span and shifts the positions back.
#[derive(Clone, Debug)]
struct Text {
    text: Arc<str>,
    line_starts: Arc<[usize]>,
}

impl Text {
    fn new(text: Arc<str>) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Text {
            text,
            line_starts: line_starts.into(),
        }
    }

    fn line_of(&self, offset: usize) -> usize {
        match self.line_starts.binary_search(&offset) {
            Ok(i) => i,
            Err(i) => i.saturating_sub(1),
        }
    }
}

impl SourceCode for Text {
    fn read_span<'a>(
        &'a self,
        span: &miette::SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn miette::SpanContents<'a> + 'a>, miette::MietteError> {
        let (start, end) = (span.offset(), span.offset() + span.len());
        if end > self.text.len() {
            return Err(miette::MietteError::OutOfBounds);
        }
        // A window of whole lines with room to spare on both sides.
        let first = self.line_of(start).saturating_sub(context_lines_before + 2);
        let last = self.line_of(end) + context_lines_after + 2;
        let base = self.line_starts.get(first).copied().unwrap_or(0);
        let stop = self
            .line_starts
            .get(last + 1)
            .copied()
            .unwrap_or(self.text.len());
        let window = self
            .text
            .get(base..stop)
            .ok_or(miette::MietteError::OutOfBounds)?;
        let local = miette::SourceSpan::new((start - base).into(), span.len());
        let contents = window.read_span(&local, context_lines_before, context_lines_after)?;
        Ok(Box::new(miette::MietteSpanContents::new(
            contents.data(),
            miette::SourceSpan::new(
                (contents.span().offset() + base).into(),
                contents.span().len(),
            ),
            contents.line() + first,
            contents.column(),
            contents.line_count() + first,
        )))
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
    let text = Text::new(file.text.clone());
    for (i, diagnostic) in diagnostics.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let bound = Bound {
            diagnostic,
            source: miette::NamedSource::new(&file.name, text.clone()),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Renders with miette's own reader over the whole text, for comparison.
    fn reference(file: &SourceFile, diagnostic: &Diagnostic) -> String {
        #[derive(Debug)]
        struct Plain<'a>(&'a Diagnostic, miette::NamedSource<String>);
        impl std::fmt::Display for Plain<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0.message)
            }
        }
        impl std::error::Error for Plain<'_> {}
        impl miette::Diagnostic for Plain<'_> {
            fn source_code(&self) -> Option<&dyn SourceCode> {
                Some(&self.1)
            }
            fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
                let l = self.0.primary.as_ref()?;
                Some(Box::new(std::iter::once(
                    LabeledSpan::new_primary_with_span(Some(l.text.clone()), l.span),
                )))
            }
        }
        let handler =
            GraphicalReportHandler::new_themed(GraphicalTheme::unicode_nocolor()).with_width(100);
        let mut out = String::new();
        let plain = Plain(
            diagnostic,
            miette::NamedSource::new(&file.name, file.text.to_string()),
        );
        handler.render_report(&mut out, &plain).unwrap();
        out
    }

    #[test]
    fn windowed_source_renders_like_the_whole_text() {
        let mut text = String::new();
        for i in 0..300 {
            writeln!(text, "line_{i}: value {i}").unwrap();
        }
        let file = SourceFile::new("big.yml", text.clone());
        for line in [0usize, 1, 2, 150, 298, 299] {
            let start = text
                .match_indices('\n')
                .nth(line.wrapping_sub(1))
                .map_or(0, |(i, _)| i + 1);
            let diagnostic = Diagnostic::new(Code::UnknownKey, "x")
                .with_primary(Span::new(start, start + 4), "here");
            let ours = render_human(&file, std::slice::from_ref(&diagnostic), 100, false);
            let theirs = reference(&file, &diagnostic);
            // Ours adds the code header; compare the source excerpt.
            let excerpt = |s: &str| {
                s.lines()
                    .filter(|l| l.contains('│') || l.contains('·'))
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            };
            assert_eq!(excerpt(&ours), excerpt(&theirs), "line {line}");
        }
    }
}
