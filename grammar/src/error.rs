//! Parse errors of the expression languages, with spans local to the parsed string.

use crate::Span;

/// What kind of text failed to parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseErrorKind {
    /// A `${...}` template.
    Template,
    /// A filter or `when` expression.
    Expression,
    /// A `sort_by` specification.
    Sort,
    /// A JSON path.
    JsonPath,
    /// Nesting deeper than [`crate::MAX_DEPTH`].
    TooDeep,
}

/// A syntax error: what is wrong, where, and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ParseError {
    /// Which language.
    pub kind: ParseErrorKind,
    /// Lowercase, identifiers in backticks.
    pub message: String,
    /// Where, local to the parsed string.
    pub span: Span,
    /// What the label at the span says.
    pub label: String,
    /// One imperative line.
    pub help: Option<String>,
}

impl ParseError {
    pub(crate) fn new(
        kind: ParseErrorKind,
        message: impl Into<String>,
        span: Span,
        label: impl Into<String>,
    ) -> Self {
        ParseError {
            kind,
            message: message.into(),
            span,
            label: label.into(),
            help: None,
        }
    }

    #[must_use]
    pub(crate) fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
}

/// Rejects text whose brackets nest deeper than [`crate::MAX_DEPTH`], before any recursive
/// parser sees it. Quotes are not tracked: the bound is conservative.
pub(crate) fn check_depth(text: &str) -> Result<(), ParseError> {
    depth_of(text, |rest| rest.starts_with(['(', '[', '{']).then_some(1))
}

/// The same for a template, where only `${` nests (a default holds a template): brackets in
/// the command text around it are the shell's business.
pub(crate) fn check_template_depth(text: &str) -> Result<(), ParseError> {
    depth_of(text, |rest| rest.starts_with("${").then_some(2))
}

fn depth_of(text: &str, opens: impl Fn(&str) -> Option<usize>) -> Result<(), ParseError> {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        if let Some(len) = opens(&text[i..]) {
            depth += 1;
            if depth > crate::MAX_DEPTH {
                return Err(ParseError::new(
                    ParseErrorKind::TooDeep,
                    "the expression nests too deeply",
                    Span::new(i, i + len),
                    format!("more than {} levels", crate::MAX_DEPTH),
                )
                .help("split the expression into simpler parts"));
            }
        } else if matches!(c, ')' | ']' | '}') {
            depth = depth.saturating_sub(1);
        }
    }
    Ok(())
}
