//! The one bounded file read of the compiler and the runtime: workflow files, and the files a
//! workflow names (map inputs, env files).

use std::path::Path;

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

    /// The text before the first invalid byte of a file that is not UTF-8, so that the
    /// diagnostic's position can be shown; empty for the other errors.
    pub fn valid_prefix(&self) -> &str {
        match self {
            LoadError::NotUtf8 { valid, .. } => valid,
            _ => "",
        }
    }
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
