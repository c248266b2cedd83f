//! Source files and byte spans.
//!
//! This module owns the only file reading the compiler does ([`SourceFile::load`]) and the
//! conversion between byte offsets and the 1-based line and column numbers users see.

use std::path::Path;
use std::sync::Arc;

/// A half-open byte range `start..end` into one source file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Span {
    /// First byte of the range.
    pub start: u32,
    /// One past the last byte of the range.
    pub end: u32,
}

impl Span {
    /// A span from two byte offsets.
    pub fn new(start: usize, end: usize) -> Self {
        Self {
            start: to_u32(start),
            end: to_u32(end.max(start)),
        }
    }

    /// The length of the span in bytes.
    pub fn len(self) -> usize {
        (self.end - self.start) as usize
    }

    /// Whether the span covers no byte.
    pub fn is_empty(self) -> bool {
        self.start == self.end
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl From<Span> for miette::SourceSpan {
    fn from(span: Span) -> Self {
        miette::SourceSpan::new((span.start as usize).into(), span.len())
    }
}

/// A value together with the span of the YAML text it came from.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Spanned<T> {
    /// The value.
    pub value: T,
    /// Where it was written.
    pub span: Span,
}

impl<T> Spanned<T> {
    /// Pairs a value with its span.
    pub fn new(value: T, span: Span) -> Self {
        Self { value, span }
    }
}

/// A position shown to users: 1-based line and 1-based column counted in characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LineCol {
    /// 1-based line number.
    pub line: usize,
    /// 1-based column, in Unicode scalar values.
    pub column: usize,
}

/// Why a source file could not be loaded.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read `{path}`: {source}")]
    #[diagnostic(code(io))]
    Io {
        /// The path as given.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not UTF-8.
    #[error("`{path}` is not valid UTF-8")]
    #[diagnostic(code(io), help("workflow files must be UTF-8 text"))]
    NotUtf8 {
        /// The path as given.
        path: String,
    },
}

/// One workflow file's text and name.
#[derive(Clone, Debug)]
pub struct SourceFile {
    /// The name shown in diagnostics (the path as the user gave it).
    pub name: String,
    /// The whole text.
    pub text: Arc<str>,
    line_starts: Vec<usize>,
}

impl SourceFile {
    /// Wraps text that is already in memory.
    pub fn new(name: impl Into<String>, text: impl Into<Arc<str>>) -> Self {
        let text: Arc<str> = text.into();
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Self {
            name: name.into(),
            text,
            line_starts,
        }
    }

    /// Reads a file from disk.
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        let shown = path.display().to_string();
        #[expect(
            clippy::disallowed_methods,
            reason = "the compiler's one sanctioned read"
        )]
        let bytes = std::fs::read(path).map_err(|source| LoadError::Io {
            path: shown.clone(),
            source,
        })?;
        let text = String::from_utf8(bytes).map_err(|_| LoadError::NotUtf8 {
            path: shown.clone(),
        })?;
        Ok(Self::new(shown, text))
    }

    /// The 1-based line and column of a byte offset.
    pub fn line_col(&self, offset: u32) -> LineCol {
        let offset = (offset as usize).min(self.text.len());
        let line_idx = match self.line_starts.binary_search(&offset) {
            Ok(i) => i,
            Err(i) => i.saturating_sub(1),
        };
        let start = self.line_starts.get(line_idx).copied().unwrap_or(0);
        let column = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count())
            + 1;
        LineCol {
            line: line_idx + 1,
            column,
        }
    }

    /// The text under a span, or an empty string for a span outside the file.
    pub fn slice(&self, span: Span) -> &str {
        self.text
            .get(span.start as usize..span.end as usize)
            .unwrap_or("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_characters_from_one() {
        let file = SourceFile::new("x.yml", "ab\nçd: e\n");
        assert_eq!(file.line_col(0), LineCol { line: 1, column: 1 });
        assert_eq!(file.line_col(3), LineCol { line: 2, column: 1 });
        // `ç` is two bytes but one column.
        assert_eq!(file.line_col(6), LineCol { line: 2, column: 3 });
        assert_eq!(file.line_col(100), LineCol { line: 3, column: 1 });
    }
}
