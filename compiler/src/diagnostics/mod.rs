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

    /// The end of a line, before its `\n`.
    fn line_end(&self, line: usize) -> usize {
        self.line_starts
            .get(line + 1)
            .map_or(self.text.len(), |next| next - 1)
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
        let offset = contents.span().offset() + base;
        Ok(Box::new(miette::MietteSpanContents::new(
            contents.data(),
            miette::SourceSpan::new(offset.into(), contents.span().len()),
            contents.line() + first,
            self.chars_before(offset, contents.column()),
            contents.line_count() + first,
        )))
    }
}

impl Text {
    /// The column of OFFSET in characters, as `--format json`, SARIF and GitHub count it,
    /// from its column in bytes, as miette counts it.
    fn chars_before(&self, offset: usize, bytes: usize) -> usize {
        offset
            .checked_sub(bytes)
            .and_then(|line_start| self.text.get(line_start..offset))
            .map_or(bytes, |before| before.chars().count())
    }
}

/// The longest source line a report shows whole, in bytes; a longer line is clipped around
/// the labels on it. miette pads with the column as a format width, which panics past
/// 65,535, and a line of megabytes helps nobody in a terminal anyway.
const LONGEST_LINE: usize = 400;
/// What a clipped line keeps: this many bytes before the first label that starts on it...
const CLIP_BEFORE: usize = 40;
/// ...and this many in all.
const CLIP_WIDTH: usize = 160;

/// What a report reads: the file, or a clipped view of the lines around one diagnostic.
#[derive(Clone, Debug)]
enum Source {
    Whole(Text),
    Clipped(Clipped),
}

impl SourceCode for Source {
    fn read_span<'a>(
        &'a self,
        span: &miette::SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn miette::SpanContents<'a> + 'a>, miette::MietteError> {
        match self {
            Source::Whole(text) => text.read_span(span, context_lines_before, context_lines_after),
            Source::Clipped(clipped) => {
                clipped.read_span(span, context_lines_before, context_lines_after)
            }
        }
    }
}

/// One line of a clipped view: the characters of ellipsis before the original text, and
/// the original column of that text (in characters, as [`Text`] reports columns).
#[derive(Clone, Copy, Debug)]
struct ViewLine {
    prefix: usize,
    column: usize,
}

/// The lines around a diagnostic's labels, each long one clipped to [`CLIP_WIDTH`] bytes
/// (with `…` where text was left out) and every line far from the labels left empty, so that
/// line numbers stay those of the file and columns are translated back.
#[derive(Clone, Debug)]
struct Clipped {
    view: Text,
    /// The file's line number of the view's first line.
    first_line: usize,
    lines: Vec<ViewLine>,
}

/// How to move a file offset into the view: per file line, the kept byte range and where
/// that line starts in the view.
struct ViewMap<'t> {
    text: &'t Text,
    first_line: usize,
    /// Per view line: (kept start, kept end, view start of the kept text, view line end).
    kept: Vec<(usize, usize, usize, usize)>,
}

impl ViewMap<'_> {
    fn offset(&self, at: usize) -> usize {
        let line = self.text.line_of(at);
        let kept = line
            .checked_sub(self.first_line)
            .and_then(|i| self.kept.get(i));
        let Some(&(start, end, view, view_end)) = kept else {
            return 0;
        };
        if at < start {
            view.saturating_sub(usize::from(start > self.text.line_starts[line]) * '…'.len_utf8())
        } else if at <= end {
            view + (at - start)
        } else {
            view_end
        }
    }

    fn span(&self, span: Span) -> miette::SourceSpan {
        let (start, end) = (span.start as usize, span.end as usize);
        let (from, to) = (self.offset(start), self.offset(end));
        miette::SourceSpan::new(from.into(), to.saturating_sub(from))
    }
}

impl Clipped {
    /// A clipped view for a diagnostic with labels at `spans`, or `None` when every line
    /// the report shows is short enough to show whole.
    fn new(text: &Text, spans: impl Iterator<Item = Span>) -> Option<(Clipped, ViewMap<'_>)> {
        let spans: Vec<(usize, usize)> = spans
            .map(|s| (s.start as usize, (s.end as usize).max(s.start as usize)))
            .filter(|&(_, end)| end <= text.text.len())
            .collect();
        let last_line = text.line_starts.len() - 1;
        // The lines a report shows: each label's lines and one of context on each side.
        let shown: Vec<(usize, usize)> = spans
            .iter()
            .map(|&(start, end)| {
                (
                    text.line_of(start).saturating_sub(1),
                    (text.line_of(end) + 1).min(last_line),
                )
            })
            .collect();
        let long = |line: usize| text.line_end(line) - text.line_starts[line] > LONGEST_LINE;
        // A multi-line label shows every line it covers.
        if !shown.iter().any(|&(first, last)| (first..=last).any(long)) {
            return None;
        }
        let first_line = shown.iter().map(|s| s.0).min()?;
        let last = shown.iter().map(|s| s.1).max()?;
        let mut view = String::new();
        let mut lines = Vec::new();
        let mut kept = Vec::new();
        for line in first_line..=last {
            let (start, end) = (text.line_starts[line], text.line_end(line));
            let near = shown.iter().any(|&(a, b)| (a..=b).contains(&line));
            let (keep_start, keep_end) = if !near {
                (start, start)
            } else if end - start <= LONGEST_LINE {
                (start, end)
            } else {
                let anchor = spans
                    .iter()
                    .map(|s| s.0)
                    .filter(|&s| (start..=end).contains(&s))
                    .min()
                    .unwrap_or(start);
                let keep_start = text
                    .text
                    .floor_char_boundary(anchor.saturating_sub(CLIP_BEFORE).max(start));
                let keep_end = text
                    .text
                    .floor_char_boundary((keep_start + CLIP_WIDTH).min(end));
                (keep_start, keep_end)
            };
            let prefix = near && keep_start > start;
            if prefix {
                view.push('…');
            }
            let view_start = view.len();
            view.push_str(&text.text[keep_start..keep_end]);
            if near && keep_end < end {
                view.push('…');
            }
            kept.push((keep_start, keep_end, view_start, view.len()));
            lines.push(ViewLine {
                prefix: usize::from(prefix),
                column: text
                    .text
                    .get(start..keep_start)
                    .map_or(0, |t| t.chars().count()),
            });
            if line < last_line {
                view.push('\n');
            }
        }
        let clipped = Clipped {
            view: Text::new(view.into()),
            first_line,
            lines,
        };
        let map = ViewMap {
            text,
            first_line,
            kept,
        };
        Some((clipped, map))
    }

    fn read_span<'a>(
        &'a self,
        span: &miette::SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn miette::SpanContents<'a> + 'a>, miette::MietteError> {
        let contents = self
            .view
            .read_span(span, context_lines_before, context_lines_after)?;
        let column = match self.lines.get(contents.line()) {
            Some(line) if line.prefix > 0 && contents.column() >= line.prefix => {
                line.column + contents.column() - line.prefix
            }
            _ => contents.column(),
        };
        Ok(Box::new(miette::MietteSpanContents::new(
            contents.data(),
            *contents.span(),
            contents.line() + self.first_line,
            column,
            contents.line_count() + self.first_line,
        )))
    }
}

/// A diagnostic bound to its file, ready for miette: its labels are in the coordinates of
/// `source`, which is the file itself or a clipped view of it.
#[derive(Debug)]
struct Bound<'a> {
    diagnostic: &'a Diagnostic,
    source: miette::NamedSource<Source>,
    labels: Vec<LabeledSpan>,
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
        Some(Box::new(self.labels.iter().cloned()))
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
        let spans: Vec<(Span, &Label, bool)> = diagnostic
            .primary
            .iter()
            .map(|l| (l.span, l, true))
            .chain(diagnostic.labels.iter().map(|l| (l.span, l, false)))
            .collect();
        let (source, map) = match Clipped::new(&text, spans.iter().map(|(s, ..)| *s)) {
            Some((clipped, map)) => (Source::Clipped(clipped), Some(map)),
            None => (Source::Whole(text.clone()), None),
        };
        let labels = spans
            .iter()
            .map(|(span, label, primary)| {
                let span: miette::SourceSpan = map
                    .as_ref()
                    .map_or_else(|| (*span).into(), |m| m.span(*span));
                let text = Some(label.text.clone());
                if *primary {
                    LabeledSpan::new_primary_with_span(text, span)
                } else {
                    LabeledSpan::new_with_span(text, span)
                }
            })
            .collect();
        let bound = Bound {
            diagnostic,
            source: miette::NamedSource::new(&file.name, source),
            labels,
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

    /// A label past column 65,535 made miette's padding panic ("Formatting argument out of
    /// range"); long lines are now clipped around the label, with the file's line and column.
    #[test]
    fn labels_on_huge_lines_render_clipped_with_their_real_position() {
        let long = "x".repeat(70_000);
        let text = format!("- shell: \"true\"\n- {{shell: \"{long}\", bogus: 1}}\nname: é\n");
        let file = SourceFile::new("long.yml", text.clone());
        let at = text.find("bogus").unwrap();
        let name = text.find("name").unwrap();
        let diagnostic = Diagnostic::new(Code::UnknownKey, "unknown key `bogus` in a step")
            .with_primary(Span::new(at, at + 5), "unknown key")
            .with_label(Span::new(name, name + 4), "related");
        let out = render_human(&file, &[diagnostic], 100, false);
        let column = at - text[..at].rfind('\n').unwrap();
        assert!(out.contains(&format!("[long.yml:2:{column}]")), "{out}");
        assert!(out.contains("…xxxxxxxx"), "{out}");
        assert!(out.contains("\", bogus: 1}"), "{out}");
        assert!(out.contains("── unknown key"), "{out}");
        assert!(out.contains("3 │ name: é"), "{out}");
        assert!(out.contains("╰── related"), "{out}");
        assert!(
            out.len() < 2_000,
            "the long line is clipped: {} bytes",
            out.len()
        );
        // The underline sits under `bogus` in the clipped line.
        let lines: Vec<&str> = out.lines().collect();
        let source = lines.iter().position(|l| l.contains("bogus: 1")).unwrap();
        let underline = lines[source + 1];
        let col = |l: &str, pat: &str| l[..l.find(pat).unwrap()].chars().count();
        assert_eq!(col(lines[source], "bogus"), col(underline, "─"), "{out}");
    }

    /// The report's `file:line:column` counts characters, as `--format json`, SARIF and
    /// GitHub do (miette counts bytes: `1:27` for column 21 after three emoji).
    #[test]
    fn the_column_counts_characters_on_short_and_clipped_lines() {
        for pad in ["", &"x".repeat(500)] {
            let text = format!("- {{shell: \"🎉🎉🎉{pad}\", bogus: 1}}\n");
            let file = SourceFile::new("emoji.yml", text.clone());
            let at = text.find("bogus").unwrap();
            let diagnostic = Diagnostic::new(Code::UnknownKey, "unknown key `bogus` in a step")
                .with_primary(Span::new(at, at + 5), "unknown key");
            let out = render_human(&file, std::slice::from_ref(&diagnostic), 100, false);
            let column = file.line_col(u32::try_from(at).unwrap()).column;
            assert_eq!(column, text[..at].chars().count() + 1);
            assert!(out.contains(&format!("[emoji.yml:1:{column}]")), "{out}");
        }
    }

    #[test]
    fn a_label_spanning_a_huge_line_is_clipped_too() {
        let text = format!("- shell: \"{}\"\n", "é".repeat(40_000));
        let file = SourceFile::new("wide.yml", text.clone());
        let diagnostic = Diagnostic::new(Code::UnknownKey, "x")
            .with_primary(Span::new(9, text.len() - 1), "the whole command");
        let out = render_human(&file, &[diagnostic], 100, false);
        assert!(out.contains("[wide.yml:1:10]"), "{out}");
        assert!(out.contains("the whole command"), "{out}");
        assert!(out.len() < 2_000, "{out}");
    }
}
