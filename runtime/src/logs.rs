//! Command logs under `$PRODIGY_HOME/logs/{repo}/{id}/` (docs/running.md, "Logs"): the raw stream of
//! every Claude call, the whole output of a command that outgrew `PRODIGY_OUTPUT_LIMIT`, and
//! every step's output and record ([`StepLog`]).
//! Lines are written as they arrive, secrets masked; files are readable by the user only.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Masks secrets in a line before it is written for people.
pub type Mask = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// Creates (or truncates) PATH readable and writable by the user only, and its missing
/// parent directories with mode 0700.
pub fn create_private(path: &Path) -> std::io::Result<File> {
    open_private(path, std::fs::OpenOptions::new().write(true).truncate(true))
}

/// Opens PATH for appending, created readable and writable by the user only (as
/// [`create_private`] does) when it is missing.
fn open_append(path: &Path) -> std::io::Result<File> {
    open_private(path, std::fs::OpenOptions::new().append(true))
}

/// Opens PATH with OPTIONS, creating it with mode 0600 and its missing parent directories
/// with mode 0700.
fn open_private(path: &Path, options: &mut std::fs::OpenOptions) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(parent) = path.parent() {
        crate::durable::private_dir(parent)?;
    }
    options
        .create(true)
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
        // What waits holds no newline: only the new bytes are looked through, so that a
        // long line costs each of its bytes one look, not one per chunk.
        let mut from = self.partial.len();
        self.partial.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(end) = memchr::memchr(b'\n', &self.partial[from..]) {
            let end = from + end;
            out(Split::Line(&text(&self.partial[start..end])));
            start = end + 1;
            from = start;
        }
        self.partial.drain(..start);
        // Pieces of at most LONGEST bytes (fewer to end on a whole character; never less
        // than one character, so that each piece moves on).
        let longest = longest.max(4);
        let mut cut_at = 0;
        while self.partial.len() - cut_at > longest {
            let piece = &self.partial[cut_at..cut_at + longest];
            let cut = char_boundary(piece);
            out(Split::Part(&text(&piece[..cut])));
            cut_at += cut;
        }
        self.partial.drain(..cut_at);
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

/// The run's step records, one JSON line per step that ended, in the run's log directory
/// (docs/running.md, "Logs").
pub const RECORDS: &str = "records.jsonl";

/// What a step's record says it was: a line of the run's [`RECORDS`], written when the step
/// ends, beside its output `step-NNNN.log` in its owner's directory (made only when the step
/// printed something). A step with an output log and no record is running, or its run was
/// killed. Versions before kept each record in `step-NNNN.json` beside the log; those are
/// still read.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepRecord {
    /// Whose step it is: `steps`, or the map item (`item_3`); none in a `step-NNNN.json`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    /// Its number among its owner's steps (`step-NNNN`); 0 in a `step-NNNN.json`.
    #[serde(default)]
    pub number: u32,
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

/// The number of the step file NAME (`step-0003.log`, or an earlier version's
/// `step-0003.json`), if it is one.
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

/// The highest step number of the step files in DIR (0 when it has none).
pub fn last_step_number(dir: &Path) -> u32 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter_map(|e| step_number(&e.file_name().to_string_lossy()))
            .max()
            .unwrap_or(0)
    })
}

/// Hands each line of the records file in DIR to LINE.
fn each_record_line(dir: &Path, line: &mut dyn FnMut(&[u8])) {
    use std::io::BufRead as _;
    let Ok(file) = File::open(dir.join(RECORDS)) else {
        return;
    };
    let mut reader = std::io::BufReader::with_capacity(1 << 16, file);
    let mut buffer = Vec::new();
    while reader
        .read_until(b'\n', &mut buffer)
        .is_ok_and(|read| read > 0)
    {
        line(&buffer);
        buffer.clear();
    }
}

/// The records in DIR, in the order they were written: OWNER's only when it is named (only
/// the lines that start with it are parsed, a record's first field being its owner, so that
/// one item of a large job is found fast), else every owner's. A line that cannot be read
/// (cut short by a crash) is left out.
fn read_records(dir: &Path, owner: Option<&str>) -> Vec<StepRecord> {
    let start = match owner.map(serde_json::to_string) {
        Some(Ok(name)) => format!("{{\"owner\":{name},"),
        Some(Err(_)) => return Vec::new(),
        None => String::new(),
    };
    let mut records = Vec::new();
    each_record_line(dir, &mut |line| {
        if line.starts_with(start.as_bytes())
            && let Ok(record) = serde_json::from_slice::<StepRecord>(line)
            && owner.map_or(!record.owner.is_empty(), |o| record.owner == o)
        {
            records.push(record);
        }
    });
    records
}

/// One step of an owner as its logs tell: its record, if it ended, and where its output log
/// is (the file exists when the step printed something).
pub type StepFiles = (Option<StepRecord>, PathBuf);

/// The steps of every owner in the run's logs DIR by owner and number: the records of [`RECORDS`], an
/// earlier version's `step-NNNN.json` files, and the output logs of steps without a record.
pub fn run_steps(dir: &Path) -> BTreeMap<String, BTreeMap<u32, StepFiles>> {
    let mut steps: BTreeMap<String, BTreeMap<u32, StepFiles>> = BTreeMap::new();
    for record in read_records(dir, None) {
        let owner = dir.join(&record.owner);
        let number = record.number;
        steps
            .entry(record.owner.clone())
            .or_default()
            .insert(number, (Some(record), step_log(&owner, number)));
    }
    let owners = std::fs::read_dir(dir).into_iter().flatten();
    for entry in owners.filter_map(Result::ok) {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            let mut found = steps
                .remove(&*entry.file_name().to_string_lossy())
                .unwrap_or_default();
            add_step_files(&entry.path(), &mut found);
            if !found.is_empty() {
                steps.insert(entry.file_name().to_string_lossy().into_owned(), found);
            }
        }
    }
    steps
}

/// The steps of OWNER in the run's logs DIR by number (see [`run_steps`]).
pub fn owner_steps(dir: &Path, owner: &str) -> BTreeMap<u32, StepFiles> {
    let records = read_records(dir, Some(owner));
    let dir = dir.join(owner);
    let mut steps: BTreeMap<u32, StepFiles> = records
        .into_iter()
        .map(|r| {
            let log = step_log(&dir, r.number);
            (r.number, (Some(r), log))
        })
        .collect();
    add_step_files(&dir, &mut steps);
    steps
}

/// Adds to STEPS the step files in OWNER: a log without a record, and an earlier version's
/// record (`step-NNNN.json`, read within 1 MiB).
fn add_step_files(owner: &Path, steps: &mut BTreeMap<u32, StepFiles>) {
    let entries = std::fs::read_dir(owner).into_iter().flatten();
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(number) = step_number(&name) else {
            continue;
        };
        let found = steps
            .entry(number)
            .or_insert_with(|| (None, step_log(owner, number)));
        if found.0.is_none() && entry.path().extension().is_some_and(|e| e == "json") {
            found.0 = prodigy_plan::support::read_regular(&entry.path(), 1 << 20)
                .ok()
                .and_then(|bytes| serde_json::from_slice(&bytes).ok());
        }
    }
}

/// The run's [`RECORDS`] file, opened for appending at the first record: every step's
/// record is one `write` of one line to it, so the records of steps ending at once (map
/// items, and other processes' agents) never mix.
#[derive(Debug)]
pub struct RecordsFile {
    path: PathBuf,
    /// The open file, or why it could not be opened (said for every record that is lost).
    file: std::sync::OnceLock<Result<File, Arc<std::io::Error>>>,
}

impl RecordsFile {
    /// Appends one line of TEXT (a newline is added).
    fn append(&self, text: &str) -> std::io::Result<()> {
        let file = self
            .file
            .get_or_init(|| open_append(&self.path).map_err(Arc::new));
        let file = file
            .as_ref()
            .map_err(|e| std::io::Error::new(e.kind(), Arc::clone(e)))?;
        let mut line = String::with_capacity(text.len() + 1);
        line.push_str(text);
        line.push('\n');
        (&*file).write_all(line.as_bytes())
    }
}

/// The step logs of a run: gives each owner's steps their numbers, following what earlier
/// runs of the same id (a resume, a DLQ retry) kept, and writes their records.
#[derive(Debug)]
pub struct StepLogs {
    run_dir: PathBuf,
    records: Arc<RecordsFile>,
    /// The last number of each owner in the records as the run found them, until the owner's
    /// first step.
    found: HashMap<String, u32>,
    /// The last number given out to each owner.
    last: HashMap<String, u32>,
}

impl StepLogs {
    /// The step logs of the run whose logs are in DIR.
    pub fn new(dir: PathBuf) -> Self {
        /// What numbering needs of a record.
        #[derive(serde::Deserialize)]
        struct Numbered {
            owner: String,
            number: u32,
        }
        let mut found: HashMap<String, u32> = HashMap::new();
        each_record_line(&dir, &mut |line| {
            if let Ok(record) = serde_json::from_slice::<Numbered>(line) {
                let last = found.entry(record.owner).or_default();
                *last = (*last).max(record.number);
            }
        });
        StepLogs {
            records: Arc::new(RecordsFile {
                path: dir.join(RECORDS),
                file: std::sync::OnceLock::new(),
            }),
            run_dir: dir,
            found,
            last: HashMap::new(),
        }
    }

    /// The log of OWNER's next step, labelled STEP.
    pub fn next(&mut self, owner: &str, step: String) -> StepLog {
        let dir = self.run_dir.join(owner);
        let number = if let Some(last) = self.last.get_mut(owner) {
            *last += 1;
            *last
        } else {
            // A step killed before its record has a log and no record: its number is
            // taken too.
            let found = self.found.remove(owner).unwrap_or(0);
            let number = found.max(last_step_number(&dir)) + 1;
            self.last.insert(owner.to_owned(), number);
            number
        };
        StepLog::new(dir, owner.to_owned(), number, step, self.records.clone())
    }
}

/// The output of one step as it is kept (docs/running.md, "Logs"): what each command it ran itself
/// printed, stdout and stderr interleaved, as much as the run keeps in memory
/// (`PRODIGY_OUTPUT_LIMIT` per command, its last part; the whole output of a longer one is
/// in its spill log, which the kept part's first line names), secrets masked. The file (and
/// its owner's directory) is made on the first output; the record is written at the end.
pub struct StepLog {
    dir: PathBuf,
    file: Option<File>,
    record: StepRecord,
    records: Arc<RecordsFile>,
    /// The first write error.
    pub error: Option<std::io::Error>,
}

impl StepLog {
    /// The log of step NUMBER of OWNER, whose directory is DIR; its record goes to RECORDS.
    fn new(
        dir: PathBuf,
        owner: String,
        number: u32,
        step: String,
        records: Arc<RecordsFile>,
    ) -> Self {
        StepLog {
            dir,
            file: None,
            record: StepRecord {
                owner,
                number,
                step,
                phase: None,
                index: None,
                outcome: String::new(),
                duration_secs: 0.0,
                commands: 0,
                output_bytes: 0,
                claude_logs: Vec::new(),
            },
            records,
            error: None,
        }
    }

    /// Its number among its owner's steps (`step-NNNN`).
    pub fn number(&self) -> u32 {
        self.record.number
    }

    /// Where the output goes.
    pub fn output_path(&self) -> PathBuf {
        step_log(&self.dir, self.record.number)
    }

    /// Where the record goes.
    pub fn records_path(&self) -> &Path {
        &self.records.path
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
        self.records.append(&text)
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
        let mut logs = StepLogs::new(dir.path().to_owned());
        let mut log = logs.next("item_3", "make".into());
        assert_eq!(log.number(), 1);
        log.place(Some("reduce"), Some(1));
        log.command("[prodigy: attempt 1]", "one\ntwo", None);
        log.command(
            "[prodigy: attempt 2]",
            "three\n",
            Some(Path::new("/l/0001-x.jsonl")),
        );
        log.finish("recovered", std::time::Duration::from_millis(1500))
            .unwrap();
        let output = std::fs::read_to_string(dir.path().join("item_3/step-0001.log")).unwrap();
        assert_eq!(output, "one\ntwo\n[prodigy: attempt 2]\nthree\n");
        let steps = owner_steps(dir.path(), "item_3");
        let (Some(record), log) = &steps[&1] else {
            panic!("no record: {steps:?}");
        };
        assert_eq!(log, &dir.path().join("item_3/step-0001.log"));
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
        // A step that printed nothing has a record, and no output file or directory.
        let quiet = logs.next("item_4", "true".into());
        quiet
            .finish("succeeded", std::time::Duration::ZERO)
            .unwrap();
        assert!(!dir.path().join("item_4").exists());
        let all = run_steps(dir.path());
        assert_eq!(all.keys().collect::<Vec<_>>(), ["item_3", "item_4"]);
        assert_eq!(all["item_4"][&1].0.as_ref().unwrap().outcome, "succeeded");
        // Every record is one line of the run's records file.
        let records = std::fs::read_to_string(dir.path().join(RECORDS)).unwrap();
        assert_eq!(records.lines().count(), 2);
        assert_eq!(step_number("step-0004.json"), Some(4));
        assert_eq!(step_number("output-0004-x.log"), None);
    }

    #[test]
    fn numbers_continue_after_the_records_and_logs_of_earlier_runs() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = StepLogs::new(dir.path().to_owned());
        for _ in 0..2 {
            let log = first.next("item_0", "a".into());
            log.finish("failed", std::time::Duration::ZERO).unwrap();
        }
        // Step 3 was killed after it printed: a log and no record.
        let mut killed = first.next("item_0", "a".into());
        killed.command("", "half", None);
        drop(killed);
        // A resume, or a DLQ retry, in another process.
        let mut again = StepLogs::new(dir.path().to_owned());
        assert_eq!(again.next("item_0", "a".into()).number(), 4);
        assert_eq!(again.next("item_1", "a".into()).number(), 1);
        assert_eq!(again.next("item_0", "a".into()).number(), 5);
        let steps = owner_steps(dir.path(), "item_0");
        assert_eq!(steps.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
        assert!(steps[&3].0.is_none());
        // An owner's records are its own, not those of an owner its name begins.
        let log = again.next("item_00", "b".into());
        log.finish("succeeded", std::time::Duration::ZERO).unwrap();
        assert_eq!(owner_steps(dir.path(), "item_0").len(), 3);
        assert_eq!(owner_steps(dir.path(), "item_00").len(), 1);
    }

    #[test]
    fn an_earlier_versions_record_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let owner = dir.path().join("steps");
        std::fs::create_dir(&owner).unwrap();
        std::fs::write(owner.join("step-0001.log"), "out\n").unwrap();
        std::fs::write(
            owner.join("step-0001.json"),
            r#"{"step":"make","outcome":"failed","duration_secs":1.0,"commands":1,"output_bytes":4}"#,
        )
        .unwrap();
        std::fs::write(
            owner.join("step-0002.json"),
            r#"{"step":"quiet","outcome":"succeeded","duration_secs":0.1,"commands":1,"output_bytes":0}"#,
        )
        .unwrap();
        let steps = owner_steps(dir.path(), "steps");
        assert_eq!(steps[&1].0.as_ref().unwrap().outcome, "failed");
        assert_eq!(steps[&2].0.as_ref().unwrap().step, "quiet");
        assert_eq!(run_steps(dir.path())["steps"].len(), 2);
        // A resume of that run numbers on.
        assert_eq!(
            StepLogs::new(dir.path().to_owned())
                .next("steps", "b".into())
                .number(),
            3
        );
    }

    #[test]
    fn file_parts_are_safe_names() {
        assert_eq!(file_part("claude: /fix ${item}"), "claude-fix-item");
        assert_eq!(file_part("../.."), "step");
    }
}
