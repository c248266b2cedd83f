//! Command logs under `$PRODIGY_HOME/logs/{repo}/{id}/` (README "Logs"): the raw stream of
//! every Claude call, and the whole output of a command that outgrew `PRODIGY_OUTPUT_LIMIT`.
//! Lines are written as they arrive, secrets masked; files are readable by the user only.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::store::Layout;

/// Masks secrets in a line before it is written for people.
pub type Mask = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// `logs/{repo}/{id}/` for a session or a MapReduce job.
pub fn dir(layout: &Layout, id: &str) -> PathBuf {
    layout.home.join("logs").join(&layout.repo).join(id)
}

/// Creates (or truncates) PATH readable and writable by the user only, and its missing
/// parent directories with mode 0700.
pub fn create_private(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(parent) = path.parent() {
        crate::store::private_dir(parent)?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(crate::store::PRIVATE_FILE)
        .open(path)
}

/// Creates the first free `NNNN-STEM.EXT` in DIR (from `0001`), so that logs of earlier
/// runs (a resume, a DLQ retry of the same item) are kept, and numbers follow the order of
/// the calls of one owner.
pub fn create_numbered(dir: &Path, stem: &str, ext: &str, mask: Option<Mask>) -> LineLog {
    use std::os::unix::fs::OpenOptionsExt as _;
    let stem = file_part(stem);
    let mut last_error = crate::store::private_dir(dir).err();
    if last_error.is_none() {
        for n in 1..=9999u32 {
            let path = dir.join(format!("{n:04}-{stem}.{ext}"));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(crate::store::PRIVATE_FILE)
                .open(&path)
            {
                Ok(file) => {
                    return LineLog {
                        path,
                        file: Some(std::io::BufWriter::new(file)),
                        mask,
                        partial: Vec::new(),
                        error: None,
                    };
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    last_error = Some(e);
                    break;
                }
            }
        }
    }
    LineLog {
        path: dir.join(format!("{stem}.{ext}")),
        file: None,
        mask,
        partial: Vec::new(),
        error: Some(last_error.unwrap_or_else(|| std::io::Error::other("no free log name"))),
    }
}

/// A file name made of TEXT: letters, digits, `-`, `_` and `.` kept, anything else `-`, at
/// most 40 characters.
pub fn file_part(text: &str) -> String {
    let mut part: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    while part.contains("--") {
        part = part.replace("--", "-");
    }
    let part = part.trim_matches(['-', '.']).to_owned();
    if part.is_empty() {
        "step".to_owned()
    } else {
        part
    }
}

/// BYTES as text: borrowed when they are UTF-8 (the fast, usual case), else with each
/// invalid sequence replaced.
pub fn text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

/// The longest piece of a line a log holds before writing it.
pub const LONGEST_LINE: usize = 1 << 20;

/// A log written line by line, each line masked; after a write error it stops writing and
/// remembers the error.
pub struct LineLog {
    /// Where it is.
    pub path: PathBuf,
    file: Option<std::io::BufWriter<File>>,
    mask: Option<Mask>,
    partial: Vec<u8>,
    /// The first write error.
    pub error: Option<std::io::Error>,
}

impl LineLog {
    /// Creates the log at PATH.
    pub fn create(path: PathBuf, mask: Option<Mask>) -> Self {
        let (file, error) = match create_private(&path) {
            Ok(file) => (Some(std::io::BufWriter::new(file)), None),
            Err(e) => (None, Some(e)),
        };
        LineLog {
            path,
            file,
            mask,
            partial: Vec::new(),
            error,
        }
    }

    /// Whether the file is being written.
    pub fn is_open(&self) -> bool {
        self.file.is_some()
    }

    /// Writes one line (a newline is added).
    pub fn line(&mut self, line: &str) {
        let Some(file) = self.file.as_mut() else {
            return;
        };
        let masked = match &self.mask {
            Some(mask) => std::borrow::Cow::Owned(mask(line)),
            None => std::borrow::Cow::Borrowed(line),
        };
        if let Err(e) = file
            .write_all(masked.as_bytes())
            .and_then(|()| file.write_all(b"\n"))
        {
            self.error = Some(e);
            self.file = None;
        }
    }

    /// Writes a chunk of a stream: its whole lines now, the rest with the next chunk. A line
    /// longer than [`LONGEST_LINE`] is written in pieces, so memory stays bounded.
    pub fn chunk(&mut self, chunk: &[u8]) {
        let mut partial = std::mem::take(&mut self.partial);
        partial.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(end) = memchr::memchr(b'\n', &partial[start..]) {
            self.line(&text(&partial[start..start + end]));
            start += end + 1;
        }
        partial.drain(..start);
        self.partial = partial;
        if self.partial.len() > LONGEST_LINE {
            let piece = std::mem::take(&mut self.partial);
            self.piece(&String::from_utf8_lossy(&piece));
        }
    }

    /// Writes part of a line, without its end.
    fn piece(&mut self, text: &str) {
        let Some(file) = self.file.as_mut() else {
            return;
        };
        let masked = match &self.mask {
            Some(mask) => std::borrow::Cow::Owned(mask(text)),
            None => std::borrow::Cow::Borrowed(text),
        };
        if let Err(e) = file.write_all(masked.as_bytes()) {
            self.error = Some(e);
            self.file = None;
        }
    }

    /// Writes what is left of the last line.
    pub fn finish(&mut self) {
        if !self.partial.is_empty() {
            let rest = std::mem::take(&mut self.partial);
            self.line(&String::from_utf8_lossy(&rest));
        }
        if let Some(file) = self.file.as_mut()
            && let Err(e) = file.flush()
        {
            self.error = Some(e);
            self.file = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_masked_and_the_file_is_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/call.jsonl");
        let mask: Mask = Arc::new(|l: &str| l.replace("s3cret", "***"));
        let mut log = LineLog::create(path.clone(), Some(mask));
        log.chunk(b"one s3c");
        log.chunk(b"ret\ntwo\nthr");
        log.finish();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "one ***\ntwo\nthr\n"
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dmode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dmode, 0o700);
    }

    #[test]
    fn numbered_logs_never_overwrite_earlier_ones() {
        let dir = tempfile::tempdir().unwrap();
        let first = create_numbered(dir.path(), "fix ${item}", "jsonl", None);
        let second = create_numbered(dir.path(), "fix ${item}", "jsonl", None);
        assert!(first.path.ends_with("0001-fix-item.jsonl"));
        assert!(second.path.ends_with("0002-fix-item.jsonl"));
        assert!(second.is_open());
    }

    #[test]
    fn file_parts_are_safe_names() {
        assert_eq!(file_part("claude: /fix ${item}"), "claude-fix-item");
        assert_eq!(file_part("../.."), "step");
    }
}
