//! A run's records under `$PRODIGY_HOME` (docs/language.md §9): events as JSON lines, a
//! standard run's checkpoint after every step (appended to the session's checkpoint journal and
//! made durable there, compacted into `checkpoint.json`, written atomically through
//! [`crate::durable`], when a process starts saving, when the journal grows large, and at the
//! end of a run), the lock of a run or job, and ids. Where each file lives is
//! [`crate::layout`]'s.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::durable::{PRIVATE_FILE, private_dir, write_atomic};
use crate::layout::Layout;

use serde_json::{Map, Value, json};

/// The time now, as RFC 3339 with milliseconds.
pub fn timestamp() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Appends events, one JSON object per line.
#[derive(Debug)]
pub struct EventLog {
    file: Option<File>,
    job: String,
    /// The file's path.
    pub path: PathBuf,
    /// The first write that failed, described (path and OS error).
    pub failed: Option<String>,
}

impl EventLog {
    /// Opens `events-{timestamp}.jsonl` for a job (a session id for standard runs).
    pub fn open(layout: &Layout, job: &str) -> std::io::Result<Self> {
        let dir = layout.events_dir(job);
        private_dir(&dir)?;
        let stamp = humantime::format_rfc3339_seconds(SystemTime::now())
            .to_string()
            .replace(':', "");
        let path = crate::layout::events_file(&dir, &stamp);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(PRIVATE_FILE)
            .open(&path)?;
        Ok(EventLog {
            file: Some(file),
            job: job.to_owned(),
            path,
            failed: None,
        })
    }

    /// An event log that keeps nothing (dry runs).
    pub fn none() -> Self {
        EventLog {
            file: None,
            job: String::new(),
            path: PathBuf::new(),
            failed: None,
        }
    }

    /// The place its writes have reached; none for a log that keeps nothing.
    pub fn mark(&self) -> Option<EventsMark> {
        let len = self.file.as_ref()?.metadata().ok()?.len();
        let file = self.path.file_name()?.to_str()?.to_owned();
        Some(EventsMark { file, offset: len })
    }

    /// Appends an event: `timestamp`, `event_type`, `job_id`, and `fields`. The line is
    /// written before the caller acts on what it records. A line that cannot be written is
    /// left out whole, and the first such failure is kept in [`EventLog::failed`].
    pub fn record(&mut self, event_type: &str, fields: Value) {
        let Some(file) = self.file.as_mut() else {
            return;
        };
        let mut object = Map::new();
        object.insert("timestamp".into(), Value::String(timestamp()));
        object.insert("event_type".into(), Value::String(event_type.to_owned()));
        object.insert("job_id".into(), Value::String(self.job.clone()));
        if let Value::Object(extra) = fields {
            object.extend(extra);
        }
        let mut line = Value::Object(object).to_string();
        line.push('\n');
        if let Err(e) = crate::durable::append(file, &self.path, line.as_bytes()) {
            self.failed
                .get_or_insert_with(|| crate::durable::describe(&self.path, &e));
        }
    }
}

/// A standard run's checkpoint.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Checkpoint {
    /// Format version.
    pub version: u32,
    /// The session.
    pub session_id: String,
    /// The workflow file (absolute).
    pub workflow: PathBuf,
    /// The project directory (absolute).
    pub project: PathBuf,
    /// A hash of the workflow text: resuming a changed workflow is refused.
    pub workflow_hash: String,
    /// The index (into the workflow's steps) of the next step to run.
    pub next_step: usize,
    /// How the run stands.
    pub status: SessionStatus,
    /// Variables captured so far, each secret value sealed (replaced by its name).
    pub variables: Value,
    /// `--param` values.
    pub params: Vec<(String, String)>,
    /// `--args` values.
    pub args: Vec<String>,
    /// `--profile`.
    pub profile: Option<String>,
    /// When the run started.
    pub started_at: String,
    /// When this checkpoint was written.
    pub updated_at: String,
    /// The session worktree the run works in (docs/language.md §11); resume continues in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<crate::worktree::records::SessionWorktree>,
    /// The steps so far that failed and were continued, so that a resumed run still reports
    /// them at its end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub continued: Vec<ContinuedStep>,
    /// What the session's Claude calls have cost so far, earlier processes included: its
    /// Claude budget spans resumes (docs/language.md, "Claude budgets").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claude: Option<crate::claude::kinds::Totals>,
    /// Which save of the session this is: each save has a greater number than the one
    /// before, in every process that runs the session, so that a journal record a
    /// compaction has already folded into `checkpoint.json` never wins over it.
    #[serde(default)]
    pub seq: u64,
}

/// How a standard run stands, in its checkpoint: written as `running`, `completed`,
/// `failed` or `interrupted`, the strings checkpoints always held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// A process is running it (or was, until it was killed).
    Running,
    /// Every step ran.
    Completed,
    /// A step failed it, or its state could not be written.
    Failed,
    /// A signal stopped it.
    Interrupted,
}

/// A step of a standard run that failed and after which the workflow went on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContinuedStep {
    /// Its index among the workflow's steps.
    pub index: usize,
    /// Its name.
    pub step: String,
    /// Its `on_failure` handler ran and no run of the command succeeded; otherwise the
    /// failure was ignored (`on_failure: true`, `allow_failure`, `retry_config.on_failure:
    /// continue`).
    pub handled: bool,
}

/// The size past which the journal is compacted into `checkpoint.json`.
const COMPACT_AT: u64 = 4 << 20;

impl Checkpoint {
    /// Reads a session's checkpoint: `checkpoint.json` at PATH, or the newest record of the
    /// journal beside it that is newer. A record that is cut short or does not read (a crash
    /// in the middle of an append) ends the journal: neither it nor anything after it
    /// counts.
    pub fn load(path: &Path) -> Result<Self, CheckpointError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| CheckpointError::Io { path, source }
        };
        let text = std::fs::read(path).map_err(io(path))?;
        let snapshot: Checkpoint =
            serde_json::from_slice(&text).map_err(|source| CheckpointError::Damaged {
                path: path.to_owned(),
                source,
            })?;
        // The session's journal, beside its `checkpoint.json`: one JSON checkpoint per line,
        // each with a greater `seq` than the one before.
        let journal = crate::layout::journal(path.parent().unwrap_or(Path::new("")));
        match std::fs::read(&journal) {
            Ok(records) => Ok(newest(snapshot, &records)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(snapshot),
            Err(e) => Err(io(&journal)(e)),
        }
    }
}

/// Why a session's checkpoint could not be read.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum CheckpointError {
    /// A file of it could not be read.
    #[error("cannot read the session checkpoint `{path}`: {source}")]
    #[diagnostic(code(prodigy::session::io))]
    Io {
        /// `checkpoint.json` or its journal.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `checkpoint.json` is not what prodigy wrote.
    #[error("the session checkpoint `{path}` is damaged: {source}")]
    #[diagnostic(
        code(prodigy::session::damaged),
        help("the session cannot be resumed; `prodigy run` starts the workflow afresh")
    )]
    Damaged {
        /// `checkpoint.json`.
        path: PathBuf,
        /// What the JSON parser found.
        source: serde_json::Error,
    },
}

/// The newest of SNAPSHOT and the whole records of JOURNAL.
fn newest(mut current: Checkpoint, journal: &[u8]) -> Checkpoint {
    for line in journal.split_inclusive(|b| *b == b'\n') {
        let Some(record) = line.strip_suffix(b"\n") else {
            break;
        };
        let Ok(record) = serde_json::from_slice::<Checkpoint>(record) else {
            break;
        };
        if record.seq > current.seq && record.session_id == current.session_id {
            current = record;
        }
    }
    current
}

/// Saves one session's checkpoints, in order: each batch is appended to the journal with one
/// `write` and made durable with one `fdatasync`, instead of a temporary file, an fsync, a
/// rename and an fsync of the directory per checkpoint. The first save of a process (which
/// compacts what an earlier process journaled), a final one (not `running`) and one after
/// the journal passed a few megabytes rewrite `checkpoint.json` atomically with the newest
/// checkpoint and empty the journal instead.
#[derive(Debug)]
pub struct CheckpointJournal {
    dir: PathBuf,
    /// The journal, open for appending once this process wrote its first snapshot.
    file: Option<File>,
    /// The number of the last save.
    seq: u64,
    /// The journal's length.
    len: u64,
}

impl CheckpointJournal {
    /// The journal of SESSION.
    pub fn new(layout: &Layout, session: &str) -> Self {
        CheckpointJournal {
            dir: layout.session_dir(session),
            file: None,
            seq: 0,
            len: 0,
        }
    }

    /// `checkpoint.json`.
    pub fn snapshot_path(&self) -> PathBuf {
        crate::layout::checkpoint(&self.dir)
    }

    /// Saves BATCH (in order; the last is the newest) durably, numbering each; returns the
    /// path of `checkpoint.json`.
    pub fn save(&mut self, batch: &mut [Checkpoint]) -> std::io::Result<PathBuf> {
        let snapshot = self.snapshot_path();
        let Some(status) = batch.last().map(|c| c.status) else {
            return Ok(snapshot);
        };
        if self.file.is_none() {
            // Numbers go on from what an earlier process saved.
            self.seq = Checkpoint::load(&snapshot).map_or(0, |c| c.seq);
        }
        for checkpoint in batch.iter_mut() {
            self.seq += 1;
            checkpoint.seq = self.seq;
        }
        let compact = match &self.file {
            None => true,
            Some(_) => status != SessionStatus::Running || self.len > COMPACT_AT,
        };
        if compact {
            let last = status != SessionStatus::Running;
            self.compact(batch.last(), last)?;
            if last {
                // Its records are older than the snapshot: removed, not emptied first (on a
                // busy disk a truncation can wait for the filesystem's journal, tens of ms).
                self.file = None;
                let _ = std::fs::remove_file(crate::layout::journal(&self.dir));
            }
            return Ok(snapshot);
        }
        let mut lines = Vec::new();
        for checkpoint in batch.iter() {
            serde_json::to_writer(&mut lines, checkpoint).map_err(std::io::Error::other)?;
            lines.push(b'\n');
        }
        let path = crate::layout::journal(&self.dir);
        let Some(file) = self.file.as_mut() else {
            return Err(std::io::Error::other("the checkpoint journal is not open"));
        };
        let appended = crate::durable::append(file, &path, &lines).and_then(|()| file.sync_data());
        if let Err(e) = appended {
            // A record the failed append could not cut back would end the journal for
            // every reader: the next save starts over with a snapshot and an empty journal.
            self.file = None;
            return Err(e);
        }
        self.len += lines.len() as u64;
        Ok(snapshot)
    }

    /// Writes NEWEST as `checkpoint.json` and empties the journal. The journal is opened
    /// (made) before the snapshot is written, so that the fsync of the directory that ends
    /// the snapshot's write makes its name durable too; it is emptied only after, so that a
    /// crash in between still finds the newer of the two, and only when it holds anything.
    /// LAST: the run's final save, after which the caller removes the journal, so it is
    /// neither made nor emptied.
    fn compact(&mut self, newest: Option<&Checkpoint>, last: bool) -> std::io::Result<()> {
        let Some(newest) = newest else {
            return Ok(());
        };
        if self.file.is_none() && !last {
            private_dir(&self.dir)?;
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .mode(PRIVATE_FILE)
                .open(crate::layout::journal(&self.dir))?;
            // What an earlier process (or a failed append) left in it, if anything.
            self.len = file.metadata()?.len();
            self.file = Some(file);
        }
        let text = serde_json::to_vec_pretty(newest).map_err(std::io::Error::other)?;
        write_atomic(&self.snapshot_path(), &text)?;
        if let Some(file) = &self.file
            && !last
            && self.len > 0
        {
            file.set_len(0)?;
        }
        self.len = 0;
        Ok(())
    }
}

/// Why the lock of a session or job was not taken.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum LockError {
    /// Its state directory could not be created.
    #[error("cannot create `{}`: {source}", dir.display())]
    CreateDir {
        /// The state directory.
        dir: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The lock file could not be opened, locked or written.
    #[error("cannot lock `{}`: {source}", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Another live process holds it.
    #[error("{what} is already running in process {pid}")]
    Held {
        /// What is locked: "session `ID`", "job `ID`".
        what: String,
        /// The holder's pid, as its lock file says it.
        pid: String,
    },
    /// The lock file was replaced under it again and again.
    #[error("cannot lock `{}`", path.display())]
    Unsteady {
        /// The lock file.
        path: PathBuf,
    },
}

/// The lock of one session or job: `lock` in its state directory, held with an advisory
/// lock (`flock`) for as long as the process runs it and holding the owner's pid for
/// messages. The kernel releases it when the process dies, however it dies, so a stale
/// file never blocks; dropping the lock removes the file.
#[derive(Debug)]
pub struct SessionLock {
    path: PathBuf,
    /// Held open: closing it releases the lock.
    _file: File,
}

impl SessionLock {
    /// Takes the lock of SESSION, or says which live process holds it.
    pub fn acquire(layout: &Layout, session: &str) -> Result<Self, LockError> {
        Self::acquire_in(
            &layout.session_dir(session),
            &format!("session `{session}`"),
        )
    }

    /// Takes the lock in DIR (a session's or a job's state directory); WHAT names it in the
    /// message when another process holds it.
    pub fn acquire_in(dir: &Path, what: &str) -> Result<Self, LockError> {
        use std::os::unix::fs::MetadataExt as _;
        private_dir(dir).map_err(|source| LockError::CreateDir {
            dir: dir.to_owned(),
            source,
        })?;
        let path = crate::layout::lock(dir);
        let cannot = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        // A holder that lets go removes the file: the lock taken on the removed file's inode
        // is worth nothing, so try again on the new one.
        let mut tries = 0;
        let mut waited = std::time::Duration::ZERO;
        while tries < 3 {
            tries += 1;
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(PRIVATE_FILE)
                .open(&path)
                .map_err(cannot)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    let holder = std::fs::read_to_string(&path).unwrap_or_default();
                    // The holder it names is dead: what still holds the lock is a child it
                    // was starting when it died, between fork and exec (the descriptor
                    // closes at exec). That takes moments, longer on a loaded machine.
                    if waited < DEAD_HOLDER_WAIT && !alive(holder.trim()) {
                        std::thread::sleep(DEAD_HOLDER_POLL);
                        waited += DEAD_HOLDER_POLL;
                        tries -= 1;
                        continue;
                    }
                    return Err(LockError::Held {
                        what: what.to_owned(),
                        pid: holder.trim().to_owned(),
                    });
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(cannot(e)),
            }
            let current = std::fs::metadata(&path).map(|m| m.ino()).ok();
            if current != Some(file.metadata().map_err(cannot)?.ino()) {
                continue;
            }
            file.set_len(0).map_err(cannot)?;
            write!(file, "{}", std::process::id()).map_err(cannot)?;
            return Ok(SessionLock { path, _file: file });
        }
        Err(LockError::Unsteady { path })
    }
}

/// How long a lock whose named holder is dead is waited for, and how often it is tried.
const DEAD_HOLDER_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
const DEAD_HOLDER_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Whether PID (a lock file's text) names a process that exists; text that is not a pid is
/// taken as alive, so that only a holder known to be dead is waited for.
fn alive(pid: &str) -> bool {
    let Ok(pid) = pid.parse::<i32>() else {
        return true;
    };
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// Whether a process runs the session or job ID (holds its lock), in any project under
/// HOME.
pub fn is_running(home: &Path, id: &str) -> bool {
    crate::layout::Layout::projects(home)
        .iter()
        .any(|p| is_locked(&p.session_dir(id)) || is_locked(&p.job_dir(id)))
}

/// Whether a live process holds the lock in DIR (a session's or a job's state directory).
pub fn is_locked(dir: &Path) -> bool {
    let Ok(file) = OpenOptions::new()
        .read(true)
        .write(true)
        .open(crate::layout::lock(dir))
    else {
        return false;
    };
    matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock))
}

impl Drop for SessionLock {
    fn drop(&mut self) {
        // Removed while still held; the lock goes when the file closes right after.
        let _ = std::fs::remove_file(&self.path);
    }
}

pub use crate::durable::hash;

/// A new session id: the time, the process and a counter, so runs started in the same
/// second (in one process or several) differ.
pub fn session_id() -> String {
    new_id("session")
}

/// A new MapReduce job id, unique in the same way as [`session_id`].
pub fn job_id() -> String {
    new_id("mapreduce")
}

fn new_id(prefix: &str) -> String {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    id_of(prefix, now, std::process::id(), n)
}

/// An id from the time, the whole process id (fixed width, so that no two fields can run
/// into each other) and a counter within the process.
fn id_of(prefix: &str, now: std::time::Duration, pid: u32, n: u32) -> String {
    format!(
        "{prefix}-{}-{pid:08x}{:05x}{n}",
        now.as_secs(),
        now.subsec_micros()
    )
}

/// `json!` of a step's identity for events.
pub fn step_fields(index: Option<usize>, label: &str, id: u32) -> Value {
    json!({"step": label, "step_index": index, "step_id": id})
}

/// A place in a job's events: a file of its events directory, and how many bytes of it had
/// been written.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EventsMark {
    /// The file's name (`events-STAMP.jsonl`).
    pub file: String,
    /// Its length then.
    pub offset: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint written before the status was typed (its `status` a plain string) still
    /// loads, and each status is written back as the same string.
    #[test]
    fn a_checkpoint_with_the_old_string_status_loads() {
        let dir = tempfile::tempdir().unwrap();
        for (text, status) in [
            ("running", SessionStatus::Running),
            ("completed", SessionStatus::Completed),
            ("failed", SessionStatus::Failed),
            ("interrupted", SessionStatus::Interrupted),
        ] {
            let path = dir.path().join(format!("{text}.json"));
            let old = json!({
                "version": 1,
                "session_id": "session-1",
                "workflow": "/p/w.yml",
                "project": "/p",
                "workflow_hash": "abc",
                "next_step": 2,
                "status": text,
                "variables": {"values": {}, "meta": {}},
                "params": [],
                "args": [],
                "profile": null,
                "started_at": "2026-01-01T00:00:00Z",
                "updated_at": "2026-01-01T00:00:01Z",
            });
            std::fs::write(&path, old.to_string()).unwrap();
            let loaded = Checkpoint::load(&path).unwrap();
            assert_eq!(loaded.status, status);
            let written = serde_json::to_value(&loaded).unwrap();
            assert_eq!(written["status"], text);
        }
        let path = dir.path().join("unknown.json");
        std::fs::write(
            &path,
            std::fs::read_to_string(dir.path().join("failed.json"))
                .unwrap()
                .replace("\"failed\"", "\"done\""),
        )
        .unwrap();
        let e = Checkpoint::load(&path).unwrap_err();
        assert!(e.to_string().contains("unknown variant `done`"), "{e}");
        // Damaged, named, and told apart from a file that cannot be read.
        assert!(matches!(e, CheckpointError::Damaged { .. }), "{e:?}");
        assert!(
            e.to_string().starts_with(&format!(
                "the session checkpoint `{}` is damaged: ",
                path.display()
            )),
            "{e}"
        );
        let e = Checkpoint::load(&dir.path().join("missing.json")).unwrap_err();
        assert!(matches!(e, CheckpointError::Io { .. }), "{e:?}");
    }

    fn checkpoint_at(next_step: usize, status: SessionStatus) -> Checkpoint {
        Checkpoint {
            version: 1,
            session_id: "session-1".into(),
            workflow: "/p/w.yml".into(),
            project: "/p".into(),
            workflow_hash: "abc".into(),
            next_step,
            status,
            variables: json!({"values": {"n": next_step}}),
            params: Vec::new(),
            args: Vec::new(),
            profile: None,
            started_at: "2026-01-01T00:00:00Z".into(),
            updated_at: "2026-01-01T00:00:01Z".into(),
            worktree: None,
            continued: Vec::new(),
            claude: None,
            seq: 0,
        }
    }

    /// The layout of the project `demo` under HOME.
    fn demo_layout(home: &tempfile::TempDir) -> Layout {
        Layout {
            home: home.path().to_owned(),
            repo: "demo".into(),
        }
    }

    /// The snapshot (`checkpoint.json`) and the journal of `session-1` under LAYOUT.
    fn session_files(layout: &Layout) -> (std::path::PathBuf, std::path::PathBuf) {
        let snapshot = layout.session_dir("session-1").join("checkpoint.json");
        let journal = snapshot.with_file_name(crate::layout::JOURNAL);
        (snapshot, journal)
    }

    /// An append that fails makes the next save a snapshot, and so does a journal past
    /// `COMPACT_AT`.
    #[test]
    fn a_failed_append_and_a_large_journal_make_the_next_save_a_snapshot() {
        let home = tempfile::tempdir().unwrap();
        let layout = demo_layout(&home);
        let (snapshot, journal) = session_files(&layout);
        let mut writer = CheckpointJournal::new(&layout, "session-1");
        writer
            .save(&mut [checkpoint_at(1, SessionStatus::Running)])
            .unwrap();
        // An append that fails (here: the journal open for reading only) is an error, and
        // the next save writes the snapshot and empties the journal, whatever the failed
        // append left in it.
        writer.file = Some(File::open(&journal).unwrap());
        writer
            .save(&mut [checkpoint_at(2, SessionStatus::Running)])
            .unwrap_err();
        std::fs::write(&journal, "{\"torn").unwrap();
        writer
            .save(&mut [checkpoint_at(3, SessionStatus::Running)])
            .unwrap();
        let raw: Checkpoint = serde_json::from_slice(&std::fs::read(&snapshot).unwrap()).unwrap();
        assert_eq!(raw.next_step, 3);
        assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0);
        writer
            .save(&mut [checkpoint_at(4, SessionStatus::Running)])
            .unwrap();
        assert_eq!(Checkpoint::load(&snapshot).unwrap().next_step, 4);
        // A journal past COMPACT_AT is folded into the snapshot at the next save.
        writer.len = COMPACT_AT + 1;
        writer
            .save(&mut [checkpoint_at(5, SessionStatus::Running)])
            .unwrap();
        let raw: Checkpoint = serde_json::from_slice(&std::fs::read(&snapshot).unwrap()).unwrap();
        assert_eq!(raw.next_step, 5);
        assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0);
    }

    /// The first save of a process writes `checkpoint.json`; the next ones are appended to
    /// the journal (several in one batch), and a load sees the newest; a final save folds
    /// everything into `checkpoint.json` and removes the journal; a later process (a
    /// resume) numbers its saves on from there.
    #[test]
    fn checkpoints_go_to_the_journal_and_are_compacted_at_the_end() {
        let home = tempfile::tempdir().unwrap();
        let layout = demo_layout(&home);
        let (snapshot, journal) = session_files(&layout);
        let mut writer = CheckpointJournal::new(&layout, "session-1");
        writer
            .save(&mut [checkpoint_at(1, SessionStatus::Running)])
            .unwrap();
        assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0);
        writer
            .save(&mut [
                checkpoint_at(2, SessionStatus::Running),
                checkpoint_at(3, SessionStatus::Running),
            ])
            .unwrap();
        let raw: Checkpoint = serde_json::from_slice(&std::fs::read(&snapshot).unwrap()).unwrap();
        assert_eq!(raw.next_step, 1, "the snapshot is not rewritten per step");
        assert_eq!(
            std::fs::read_to_string(&journal).unwrap().lines().count(),
            2
        );
        let loaded = Checkpoint::load(&snapshot).unwrap();
        assert_eq!((loaded.next_step, loaded.seq), (3, 3));
        writer
            .save(&mut [checkpoint_at(4, SessionStatus::Failed)])
            .unwrap();
        assert!(!journal.exists());
        let loaded = Checkpoint::load(&snapshot).unwrap();
        assert_eq!(
            (loaded.next_step, loaded.status),
            (4, SessionStatus::Failed)
        );

        let mut resumed = CheckpointJournal::new(&layout, "session-1");
        let mut first = [checkpoint_at(5, SessionStatus::Running)];
        resumed.save(&mut first).unwrap();
        assert_eq!(first[0].seq, 5, "numbers go on from the earlier process");
        resumed
            .save(&mut [checkpoint_at(6, SessionStatus::Running)])
            .unwrap();
        assert_eq!(Checkpoint::load(&snapshot).unwrap().next_step, 6);
    }

    /// A crash in the middle of an append leaves a torn last record: it is left out, and the
    /// record before it counts. A record cut off after its closing brace but before its
    /// newline is torn too.
    #[test]
    fn a_torn_last_journal_record_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let snapshot = dir.path().join("checkpoint.json");
        let mut base = checkpoint_at(1, SessionStatus::Running);
        base.seq = 1;
        std::fs::write(&snapshot, serde_json::to_vec(&base).unwrap()).unwrap();
        let mut second = checkpoint_at(2, SessionStatus::Running);
        second.seq = 2;
        let mut third = checkpoint_at(3, SessionStatus::Running);
        third.seq = 3;
        let whole = serde_json::to_string(&second).unwrap() + "\n";
        let torn = serde_json::to_string(&third).unwrap();
        for cut in [torn.len() / 2, torn.len()] {
            std::fs::write(
                dir.path().join(crate::layout::JOURNAL),
                format!("{whole}{}", &torn[..cut]),
            )
            .unwrap();
            let loaded = Checkpoint::load(&snapshot).unwrap();
            assert_eq!(loaded.next_step, 2, "cut at {cut}");
        }
        // Garbage in the middle ends the journal there, even before a whole record.
        std::fs::write(
            dir.path().join(crate::layout::JOURNAL),
            format!("{{\"version\":1,\n{whole}"),
        )
        .unwrap();
        assert_eq!(Checkpoint::load(&snapshot).unwrap().next_step, 1);
    }

    /// A crash after a compaction wrote `checkpoint.json` and before it emptied the journal:
    /// the journal's records are older than the snapshot and lose to it.
    #[test]
    fn journal_records_older_than_the_snapshot_lose() {
        let dir = tempfile::tempdir().unwrap();
        let snapshot = dir.path().join("checkpoint.json");
        let mut done = checkpoint_at(3, SessionStatus::Completed);
        done.seq = 4;
        std::fs::write(&snapshot, serde_json::to_vec(&done).unwrap()).unwrap();
        let mut old = checkpoint_at(2, SessionStatus::Running);
        old.seq = 3;
        std::fs::write(
            dir.path().join(crate::layout::JOURNAL),
            serde_json::to_string(&old).unwrap() + "\n",
        )
        .unwrap();
        let loaded = Checkpoint::load(&snapshot).unwrap();
        assert_eq!(loaded.status, SessionStatus::Completed);
    }

    #[test]
    fn a_session_is_locked_once_and_a_stale_lock_is_taken_over() {
        let home = tempfile::tempdir().unwrap();
        let layout = demo_layout(&home);
        let first = SessionLock::acquire(&layout, "s1").unwrap();
        let again = SessionLock::acquire(&layout, "s1").unwrap_err().to_string();
        assert!(again.contains("already running"), "{again}");
        drop(first);
        // A lock left by a process that no longer exists.
        let lock = crate::layout::lock(&layout.session_dir("s1"));
        std::fs::write(&lock, "999999999").unwrap();
        let taken = SessionLock::acquire(&layout, "s1").unwrap();
        drop(taken);
        assert!(!lock.exists());
    }

    /// A killed coordinator's child between fork and exec still holds its lock for a moment:
    /// the next run waits for it rather than saying the dead process runs the job.
    #[test]
    fn a_lock_its_dead_holders_child_still_holds_is_waited_for() {
        let home = tempfile::tempdir().unwrap();
        let layout = demo_layout(&home);
        let dir = layout.session_dir("s1");
        private_dir(&dir).unwrap();
        let path = crate::layout::lock(&dir);
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        std::fs::write(&path, gone.id().to_string()).unwrap();
        // Another open file description holds it, as a forked child's would.
        let holder = std::fs::File::open(&path).unwrap();
        holder.lock().unwrap();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(holder);
        });
        let taken = SessionLock::acquire(&layout, "s1").unwrap();
        releaser.join().unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            std::process::id().to_string()
        );
        drop(taken);
        // A live holder is named.
        std::fs::write(&path, std::process::id().to_string()).unwrap();
        let holder = std::fs::File::open(&path).unwrap();
        holder.lock().unwrap();
        let held = SessionLock::acquire(&layout, "s1").unwrap_err().to_string();
        assert!(held.contains("already running in process"), "{held}");
    }

    #[test]
    fn session_ids_differ_within_a_second() {
        assert_ne!(session_id(), session_id());
        // Two processes in the same microsecond, even with pids alike in their low bits.
        let now = std::time::Duration::new(1_700_000_000, 123_456_000);
        assert_ne!(id_of("s", now, 0x1, 0), id_of("s", now, 0x10_0001, 0));
        assert_ne!(id_of("s", now, 7, 1), id_of("s", now, 7, 11));
        assert_ne!(id_of("s", now, 7, 11), id_of("s", now, 71, 1));
    }
}
