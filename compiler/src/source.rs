//! Source files and byte spans.
//!
//! This module owns the only file reading the compiler does ([`SourceFile::load`]) and the
//! conversion between byte offsets and the 1-based line and column numbers users see.

use std::path::Path;
use std::sync::Arc;

pub use prodigy_plan::span::{Span, Spanned};

/// A position shown to users: 1-based line and 1-based column counted in characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LineCol {
    /// 1-based line number.
    pub line: usize,
    /// 1-based column, in Unicode scalar values.
    pub column: usize,
}

pub use prodigy_plan::file::{LoadError, MAX_FILE_SIZE, read_regular};

/// The diagnostic of a file that could not be loaded: [`LoadError`] is the plan crate's,
/// whose bounded read the runtime shares.
pub trait LoadDiagnostic {
    /// The problem as a diagnostic of the file, for the machine-readable outputs and editors.
    /// Its span is empty at the start of the file, or at the first invalid byte.
    fn diagnostic(&self) -> crate::diagnostics::Diagnostic;
}

impl LoadDiagnostic for LoadError {
    fn diagnostic(&self) -> crate::diagnostics::Diagnostic {
        use crate::diagnostics::{Code, Diagnostic};
        match self {
            LoadError::Io { source, .. } => {
                let why = source.to_string();
                Diagnostic::new(Code::Unreadable, lowercase_first(&self.to_string()))
                    .with_primary(Span::default(), lowercase_first(&why))
                    .with_help(match source.kind() {
                        std::io::ErrorKind::NotFound => "check the path; it is relative to the current directory",
                        std::io::ErrorKind::PermissionDenied => "make the file readable by the user running prodigy",
                        _ => "make sure the path names a readable workflow file",
                    })
            }
            LoadError::NotRegular { what, .. } => {
                Diagnostic::new(Code::Unreadable, self.to_string())
                    .with_primary(Span::default(), (*what).to_owned())
                    .with_help(if *what == "a directory" {
                        "`prodigy check DIR` checks every workflow under a directory; other commands need a file"
                    } else {
                        "to check text from standard input, pipe it to `prodigy check --stdin-filename NAME`"
                    })
            }
            LoadError::TooLarge { limit, .. } => Diagnostic::new(Code::Unreadable, self.to_string())
                .with_primary(Span::default(), format!("more than {limit} bytes"))
                .with_help("a workflow file is a few kilobytes; check that the path names the right file"),
            LoadError::NotUtf8 { at, .. } => Diagnostic::new(Code::NotUtf8, self.to_string())
                .with_primary(Span::new(*at, *at), "the first byte that is not UTF-8")
                .with_help("save the file as UTF-8 text"),
        }
    }
}

fn lowercase_first(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map_or_else(String::new, |c| c.to_lowercase().chain(chars).collect())
}

/// [`read_regular`] with [`MAX_FILE_SIZE`], as UTF-8 text: how `check`, `run` and the
/// language server read the files a workflow names (map inputs, env files).
pub fn read_text(path: &Path) -> Option<String> {
    read_regular(path, MAX_FILE_SIZE)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
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

    /// Reads a workflow file from disk: a regular file of at most [`MAX_FILE_SIZE`] bytes of
    /// UTF-8 text.
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        let bytes = read_regular(path, MAX_FILE_SIZE)?;
        Self::from_bytes(path.display().to_string(), bytes)
    }

    /// A file from bytes already read (standard input), which must be UTF-8.
    pub fn from_bytes(name: impl Into<String>, bytes: Vec<u8>) -> Result<Self, LoadError> {
        let name = name.into();
        match String::from_utf8(bytes) {
            Ok(text) => Ok(Self::new(name, text)),
            Err(e) => {
                let at = e.utf8_error().valid_up_to();
                let bytes = e.into_bytes();
                let valid =
                    String::from_utf8_lossy(bytes.get(..at).unwrap_or_default()).into_owned();
                Err(LoadError::NotUtf8 {
                    path: name,
                    at,
                    valid,
                })
            }
        }
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
