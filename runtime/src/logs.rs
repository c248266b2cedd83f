//! Command logs under `$PRODIGY_HOME/logs/{repo}/{id}/` (docs/running.md, "Logs"): the raw stream of
//! every Claude call, the whole output of a command that outgrew `PRODIGY_OUTPUT_LIMIT`, and
//! every step's output and record ([`StepLog`]).
//! Lines are written as they arrive, secrets masked; files are readable by the user only.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Masks secrets in a line before it is written for people.
pub type Mask = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// Creates (or truncates) PATH readable and writable by the user only, and its missing
/// parent directories with mode 0700.
pub fn create_private(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(parent) = path.parent() {
        crate::durable::private_dir(parent)?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(crate::durable::PRIVATE_FILE)
        .open(path)
}

/// Creates the first free `NNNN-STEM.EXT` in DIR (from `0001`), so that logs of earlier
/// runs (a resume, a DLQ retry of the same item) are kept, and numbers follow the order of
/// the calls of one owner.
pub fn create_numbered(dir: &Path, stem: &str, ext: &str, mask: Option<Mask>) -> LineLog {
    use std::os::unix::fs::OpenOptionsExt as _;
    let stem = file_part(stem);
    let mut last_error = crate::durable::private_dir(dir).err();
    if last_error.is_none() {
        for n in 1..=9999u32 {
            let path = dir.join(format!("{n:04}-{stem}.{ext}"));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(crate::durable::PRIVATE_FILE)
                .open(&path)
            {
                Ok(file) => {
                    return LineLog {
                        path,
                        file: Some(std::io::BufWriter::new(file)),
                        mask,
                        lines: LineSplitter::default(),
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
        lines: LineSplitter::default(),
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

/// What [`LineSplitter`] hands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split<'a> {
    /// A whole line, without its `\n`.
    Line(&'a str),
    /// The start of a line that outgrew the splitter's limit; the rest follows.
    Part(&'a str),
}

/// Splits a stream into lines as its chunks arrive: the one splitter of command output, for
/// logs and for watchers of a command's lines.
#[derive(Debug, Default)]
pub struct LineSplitter {
    partial: Vec<u8>,
}

impl LineSplitter {
    /// Hands each whole line of what arrived so far to OUT; the rest waits for the next
    /// chunk. When what waits outgrows LONGEST bytes it goes to OUT as a [`Split::Part`],
    /// cut at a character boundary, so memory stays bounded and no character is broken.
    pub fn feed(&mut self, chunk: &[u8], longest: usize, out: &mut dyn FnMut(Split<'_>)) {
        self.partial.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(end) = memchr::memchr(b'\n', &self.partial[start..]) {
            out(Split::Line(&text(&self.partial[start..start + end])));
            start += end + 1;
        }
        self.partial.drain(..start);
        if self.partial.len() > longest {
            let cut = char_boundary(&self.partial);
            let rest = self.partial.split_off(cut);
            let part = std::mem::replace(&mut self.partial, rest);
            out(Split::Part(&text(&part)));
        }
    }

    /// Hands what is left, a last line without its `\n`, to OUT.
    pub fn finish(&mut self, out: &mut dyn FnMut(Split<'_>)) {
        if !self.partial.is_empty() {
            let rest = std::mem::take(&mut self.partial);
            out(Split::Line(&text(&rest)));
        }
    }
}

/// Where BYTES end, less a UTF-8 sequence that the next bytes will complete (all of them
/// when that would leave nothing).
fn char_boundary(bytes: &[u8]) -> usize {
    let len = bytes.len();
    for back in 1..=len.min(4) {
        let byte = bytes[len - back];
        if byte & 0xC0 != 0x80 {
            // A lead byte (or ASCII): its sequence length says whether it is complete.
            let needs = match byte {
                0xF0..=0xF7 => 4,
                0xE0..=0xEF => 3,
                0xC0..=0xDF => 2,
                _ => 1,
            };
            return if needs > back && len > back {
                len - back
            } else {
                len
            };
        }
    }
    len
}

/// A log written line by line, each line masked; after a write error it stops writing and
/// remembers the error.
pub struct LineLog {
    /// Where it is.
    pub path: PathBuf,
    file: Option<std::io::BufWriter<File>>,
    mask: Option<Mask>,
    lines: LineSplitter,
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
            lines: LineSplitter::default(),
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

    /// Writes one line and flushes it, so a reader sees it now.
    pub fn line_flushed(&mut self, line: &str) {
        self.line(line);
        if let Some(file) = self.file.as_mut()
            && let Err(e) = file.flush()
        {
            self.error = Some(e);
            self.file = None;
        }
    }

    /// Writes a chunk of a stream: its whole lines now, the rest with the next chunk. A line
    /// longer than [`LONGEST_LINE`] is written in pieces, so memory stays bounded.
    pub fn chunk(&mut self, chunk: &[u8]) {
        let mut lines = std::mem::take(&mut self.lines);
        lines.feed(chunk, LONGEST_LINE, &mut |split| self.split(split));
        self.lines = lines;
    }

    fn split(&mut self, split: Split<'_>) {
        match split {
            Split::Line(line) => self.line(line),
            Split::Part(part) => self.piece(part),
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
        let mut lines = std::mem::take(&mut self.lines);
        lines.finish(&mut |split| self.split(split));
        if let Some(file) = self.file.as_mut()
            && let Err(e) = file.flush()
        {
            self.error = Some(e);
            self.file = None;
        }
    }
}

/// What a step's record says it was: `step-NNNN.json` beside its output `step-NNNN.log` in
/// its owner's directory (`steps`, or the map item), written when the step ends (README
/// "Logs"). A step with an output log and no record is running, or its run was killed.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepRecord {
    /// The step's label.
    pub step: String,
    /// Its list: `steps`, `setup`, `map`, `reduce` or `merge`; none for a step a step runs
    /// (a handler, a validation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Its index in that list, from 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// How it ended (`succeeded`, `failed`, ...).
    pub outcome: String,
    /// From its start to its end.
    pub duration_secs: f64,
    /// Commands it ran itself (attempts and a fallback).
    pub commands: u32,
    /// Bytes of output in its log.
    pub output_bytes: u64,
    /// The logs of its Claude calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claude_logs: Vec<PathBuf>,
}

/// Step NUMBER's output log in OWNER (`step-NNNN.log`).
pub fn step_log(owner: &Path, number: u32) -> PathBuf {
    owner.join(format!("step-{number:04}.log"))
}

/// Step NUMBER's record in OWNER (`step-NNNN.json`).
pub fn step_record_path(owner: &Path, number: u32) -> PathBuf {
    owner.join(format!("step-{number:04}.json"))
}

/// Step NUMBER of OWNER: its record, if it ended (read within 1 MiB), and its output log.
pub fn step_files(owner: &Path, number: u32) -> (Option<StepRecord>, PathBuf) {
    let record = prodigy_plan::support::read_regular(&step_record_path(owner, number), 1 << 20)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok());
    (record, step_log(owner, number))
}

/// The number of the step file NAME (`step-0003.log` or `.json`), if it is one.
pub fn step_number(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("step-")?;
    let digits = rest
        .strip_suffix(".json")
        .or_else(|| rest.strip_suffix(".log"))?;
    if digits.len() < 4 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The highest step number in DIR (0 when it has none).
pub fn last_step_number(dir: &Path) -> u32 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter_map(|e| step_number(&e.file_name().to_string_lossy()))
            .max()
            .unwrap_or(0)
    })
}

/// The output of one step as it is kept (docs/running.md, "Logs"): what each command it ran itself
/// printed, stdout and stderr interleaved, as much as the run keeps in memory
/// (`PRODIGY_OUTPUT_LIMIT` per command, its last part; the whole output of a longer one is
/// in its spill log, which the kept part's first line names), secrets masked. The file is
/// made on the first output; the record is written at the end.
pub struct StepLog {
    dir: PathBuf,
    number: u32,
    file: Option<File>,
    record: StepRecord,
    /// The first write error.
    pub error: Option<std::io::Error>,
}

impl StepLog {
    /// The log of step NUMBER in DIR.
    pub fn new(dir: PathBuf, number: u32, step: String) -> Self {
        StepLog {
            dir,
            number,
            file: None,
            record: StepRecord {
                step,
                phase: None,
                index: None,
                outcome: String::new(),
                duration_secs: 0.0,
                commands: 0,
                output_bytes: 0,
                claude_logs: Vec::new(),
            },
            error: None,
        }
    }

    /// Its number in its directory (`step-NNNN`).
    pub fn number(&self) -> u32 {
        self.number
    }

    /// Where the output goes.
    pub fn output_path(&self) -> PathBuf {
        step_log(&self.dir, self.number)
    }

    /// Where the record goes.
    pub fn record_path(&self) -> PathBuf {
        step_record_path(&self.dir, self.number)
    }

    /// Sets the step's list and index in it.
    pub fn place(&mut self, phase: Option<&str>, index: Option<usize>) {
        self.record.phase = phase.map(str::to_owned);
        self.record.index = index;
    }

    /// Adds the output TEXT (masked) of a command the step ran, after a line saying which
    /// one it is (HEADER) when it is not the first.
    pub fn command(&mut self, header: &str, text: &str, claude_log: Option<&Path>) {
        self.record.commands += 1;
        if let Some(log) = claude_log {
            self.record.claude_logs.push(log.to_owned());
        }
        let mut bytes = String::new();
        if self.record.commands > 1 && (self.record.output_bytes > 0 || !text.is_empty()) {
            bytes.push_str(header);
            bytes.push('\n');
        }
        bytes.push_str(text);
        if !bytes.is_empty() && !bytes.ends_with('\n') {
            bytes.push('\n');
        }
        if bytes.is_empty() || self.error.is_some() {
            return;
        }
        if self.file.is_none() {
            match open_append(&self.output_path()) {
                Ok(file) => self.file = Some(file),
                Err(e) => {
                    self.error = Some(e);
                    return;
                }
            }
        }
        if let Some(file) = self.file.as_mut() {
            match file.write_all(bytes.as_bytes()) {
                Ok(()) => self.record.output_bytes += bytes.len() as u64,
                Err(e) => {
                    self.error = Some(e);
                    self.file = None;
                }
            }
        }
    }

    /// Writes the record: the step ended as OUTCOME after DURATION.
    ///
    /// # Errors
    ///
    /// When the record cannot be written.
    pub fn finish(
        mut self,
        outcome: &str,
        duration: std::time::Duration,
    ) -> Result<(), std::io::Error> {
        outcome.clone_into(&mut self.record.outcome);
        self.record.duration_secs = duration.as_secs_f64();
        let text = serde_json::to_string(&self.record).map_err(std::io::Error::other)?;
        let mut file = create_private(&self.record_path())?;
        file.write_all(text.as_bytes())?;
        file.write_all(b"\n")
    }
}

fn open_append(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(parent) = path.parent() {
        crate::durable::private_dir(parent)?;
    }
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(crate::durable::PRIVATE_FILE)
        .open(path)
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
    fn a_line_longer_than_the_limit_is_written_in_pieces_without_breaking_a_character() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("long.log");
        let mut log = LineLog::create(path.clone(), None);
        // An odd number of bytes of two-byte characters: the first chunk ends mid-character.
        let line = "é".repeat(LONGEST_LINE / 2 + 1);
        let bytes = line.as_bytes();
        let (first, second) = bytes.split_at(LONGEST_LINE + 1);
        log.chunk(first);
        log.chunk(second);
        log.chunk(b"\nnext");
        log.finish();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{line}\nnext\n")
        );
    }

    #[test]
    fn the_splitter_hands_on_lines_and_cuts_only_at_character_boundaries() {
        let mut seen = Vec::new();
        let mut splitter = LineSplitter::default();
        let mut out = |s: Split<'_>| {
            seen.push(match s {
                Split::Line(l) => format!("line {l}"),
                Split::Part(p) => format!("part {p}"),
            });
        };
        splitter.feed(b"one\ntw", 100, &mut out);
        splitter.feed(b"o\n", 100, &mut out);
        // "aé" then the first byte of "é": five bytes over a limit of 4.
        splitter.feed(&"aéé".as_bytes()[..4], 3, &mut out);
        splitter.feed(&"aéé".as_bytes()[4..], 3, &mut out);
        splitter.finish(&mut out);
        assert_eq!(seen, ["line one", "line two", "part aé", "line é"]);
        assert_eq!(char_boundary("aé".as_bytes()), 3);
        assert_eq!(char_boundary(&"a€".as_bytes()[..3]), 1);
        assert_eq!(char_boundary(&"€".as_bytes()[..2]), 2);
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
    fn a_step_log_keeps_each_commands_output_and_its_record() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(last_step_number(dir.path()), 0);
        let mut log = StepLog::new(dir.path().to_owned(), 3, "make".into());
        log.place(Some("reduce"), Some(1));
        log.command("[prodigy: attempt 1]", "one\ntwo", None);
        log.command(
            "[prodigy: attempt 2]",
            "three\n",
            Some(Path::new("/l/0001-x.jsonl")),
        );
        log.finish("recovered", std::time::Duration::from_millis(1500))
            .unwrap();
        let output = std::fs::read_to_string(dir.path().join("step-0003.log")).unwrap();
        assert_eq!(output, "one\ntwo\n[prodigy: attempt 2]\nthree\n");
        let record: StepRecord = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("step-0003.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(record.outcome, "recovered");
        assert_eq!(
            (record.phase.as_deref(), record.index),
            (Some("reduce"), Some(1))
        );
        assert_eq!(
            (record.commands, record.output_bytes),
            (2, output.len() as u64)
        );
        assert_eq!(record.claude_logs, [PathBuf::from("/l/0001-x.jsonl")]);
        assert_eq!(last_step_number(dir.path()), 3);
        // A step that printed nothing has a record and no output file.
        let quiet = StepLog::new(dir.path().to_owned(), 4, "true".into());
        quiet
            .finish("succeeded", std::time::Duration::ZERO)
            .unwrap();
        assert!(!dir.path().join("step-0004.log").exists());
        assert_eq!(step_number("step-0004.json"), Some(4));
        assert_eq!(step_number("output-0004-x.log"), None);
    }

    #[test]
    fn file_parts_are_safe_names() {
        assert_eq!(file_part("claude: /fix ${item}"), "claude-fix-item");
        assert_eq!(file_part("../.."), "step");
    }
}
