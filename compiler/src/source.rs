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

/// The largest file prodigy reads as a workflow (or as a file a workflow names): 64 MiB.
/// A workflow is a few kilobytes; the bound keeps `/dev/zero` or a stray disk image from
/// being read into memory.
pub const MAX_FILE_SIZE: u64 = 64 * 1024 * 1024;

/// Why a source file could not be loaded.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read `{path}`: {source}")]
    #[diagnostic(code(F001))]
    Io {
        /// The path as given.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The path names something other than a regular file: a directory, a FIFO, a device.
    #[error("cannot read `{path}`: it is {what}, not a regular file")]
    #[diagnostic(code(F001))]
    NotRegular {
        /// The path as given.
        path: String,
        /// "a directory", "a FIFO", ...
        what: &'static str,
    },
    /// The file is larger than [`MAX_FILE_SIZE`].
    #[error("cannot read `{path}`: it is larger than {limit} bytes")]
    #[diagnostic(code(F001))]
    TooLarge {
        /// The path as given.
        path: String,
        /// The bound.
        limit: u64,
    },
    /// The file is not UTF-8.
    #[error("`{path}` is not valid UTF-8")]
    #[diagnostic(code(F002), help("workflow files must be UTF-8 text"))]
    NotUtf8 {
        /// The path as given.
        path: String,
        /// Where the first invalid byte is.
        at: usize,
        /// The text before it, for positions.
        valid: String,
    },
}

impl LoadError {
    /// Whether the file could not be read at all (exit status 2), rather than read and found
    /// wrong (not UTF-8: a problem in the file, exit status 1).
    pub fn is_unreadable(&self) -> bool {
        !matches!(self, LoadError::NotUtf8 { .. })
    }

    /// The problem as a diagnostic of the file, for the machine-readable outputs and editors.
    /// Its span is empty at the start of the file, or at the first invalid byte.
    pub fn diagnostic(&self) -> crate::diagnostics::Diagnostic {
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

    /// The text before the first invalid byte of a file that is not UTF-8, so that the
    /// diagnostic's position can be shown; empty for the other errors.
    pub fn valid_prefix(&self) -> &str {
        match self {
            LoadError::NotUtf8 { valid, .. } => valid,
            _ => "",
        }
    }
}

fn lowercase_first(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map_or_else(String::new, |c| c.to_lowercase().chain(chars).collect())
}

/// What a file system entry is, for a message.
fn describe(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

/// Reads a regular file of at most `limit` bytes. Anything else (a directory, a FIFO such
/// as `/dev/stdin` on a pipe, a device such as `/dev/zero`) is refused before it is opened
/// for reading, so reading never blocks and never runs without bound.
pub fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, LoadError> {
    use std::io::Read as _;
    let shown = path.display().to_string();
    let io = |source| LoadError::Io {
        path: shown.clone(),
        source,
    };
    let regular = |meta: &std::fs::Metadata| {
        if meta.is_file() {
            Ok(())
        } else {
            Err(LoadError::NotRegular {
                path: shown.clone(),
                what: describe(meta.file_type()),
            })
        }
    };
    // Opening a FIFO for reading blocks until a writer comes: look before opening.
    regular(&std::fs::metadata(path).map_err(io)?)?;
    let file = std::fs::File::open(path).map_err(io)?;
    // The path may have changed between the look and the open: look at what is open.
    let meta = file.metadata().map_err(io)?;
    regular(&meta)?;
    let too_large = || LoadError::TooLarge {
        path: shown.clone(),
        limit,
    };
    if meta.len() > limit {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(bytes)
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
