//! The dead letter queue of a MapReduce job, on disk as docs/language.md §9 lays it out:
//! `dlq/{repo}/{job_id}/mapreduce/dlq/{job_id}/items/{item_id}.json`, one
//! [`DeadLetteredItem`] per file, plus `index.json`. Every write is atomic.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::durable::write_atomic;
use crate::layout::Layout;

/// Why an item failed (the error types of docs/language.md §9, `CircuitOpen` among them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorType {
    /// The agent outlived its timeout.
    Timeout,
    /// A command exited non-zero.
    CommandFailed {
        /// Its exit code.
        exit_code: i32,
    },
    /// Validation failed.
    ValidationFailed,
    /// A git worktree operation failed.
    WorktreeError,
    /// Merging the agent's commits back conflicted.
    MergeConflict,
    /// The agent's work failed `merge.verify` on the merged work (after its re-dispatches).
    VerifyFailed,
    /// The agent's work changed a path `merge.protect` protects.
    ProtectedPath,
    /// The agent's work weakened the tests (`merge.integrity: fail`).
    IntegrityFailed,
    /// `commit_required` and no commit was made.
    CommitValidationFailed,
    /// Out of memory, disk or processes.
    ResourceExhausted,
    /// The circuit breaker was open: the agent never started.
    CircuitOpen,
    /// A Claude call failed, of this kind.
    ClaudeFailed {
        /// Why.
        kind: crate::claude::kinds::ErrorKind,
    },
    /// Anything else.
    Unknown,
}

impl ErrorType {
    /// The variant [`ErrorType::name`] names (`CommandFailed` without its exit code, which
    /// the name does not carry: -1); `Unknown` for any other text.
    pub fn from_name(name: &str) -> Self {
        match name {
            "Timeout" => ErrorType::Timeout,
            "CommandFailed" => ErrorType::CommandFailed { exit_code: -1 },
            "ValidationFailed" => ErrorType::ValidationFailed,
            "WorktreeError" => ErrorType::WorktreeError,
            "MergeConflict" => ErrorType::MergeConflict,
            "VerifyFailed" => ErrorType::VerifyFailed,
            "ProtectedPath" => ErrorType::ProtectedPath,
            "IntegrityFailed" => ErrorType::IntegrityFailed,
            "CommitValidationFailed" => ErrorType::CommitValidationFailed,
            "ResourceExhausted" => ErrorType::ResourceExhausted,
            "CircuitOpen" => ErrorType::CircuitOpen,
            "ClaudeFailed" => ErrorType::ClaudeFailed {
                kind: crate::claude::kinds::ErrorKind::Unknown,
            },
            _ => ErrorType::Unknown,
        }
    }

    /// The variant's name, as used in error signatures.
    pub fn name(&self) -> &'static str {
        match self {
            ErrorType::Timeout => "Timeout",
            ErrorType::CommandFailed { .. } => "CommandFailed",
            ErrorType::ValidationFailed => "ValidationFailed",
            ErrorType::WorktreeError => "WorktreeError",
            ErrorType::MergeConflict => "MergeConflict",
            ErrorType::VerifyFailed => "VerifyFailed",
            ErrorType::ProtectedPath => "ProtectedPath",
            ErrorType::IntegrityFailed => "IntegrityFailed",
            ErrorType::CommitValidationFailed => "CommitValidationFailed",
            ErrorType::ResourceExhausted => "ResourceExhausted",
            ErrorType::CircuitOpen => "CircuitOpen",
            ErrorType::ClaudeFailed { .. } => "ClaudeFailed",
            ErrorType::Unknown => "Unknown",
        }
    }
}

/// One failed attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FailureDetail {
    /// 1 for the first failure of the item.
    pub attempt_number: u32,
    /// When it failed (RFC 3339).
    pub timestamp: String,
    /// The classification.
    pub error_type: ErrorType,
    /// What went wrong, for people.
    pub error_message: String,
    /// The trail of operations that led to the failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_context: Option<Vec<String>>,
    /// A longer trace (the failing command's stderr tail).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_trace: Option<String>,
    /// The agent that ran the item.
    pub agent_id: String,
    /// The command that failed, as `shell: ...` or `claude: ...`.
    pub step_failed: String,
    /// How long the attempt ran.
    pub duration_ms: u64,
    /// Where Claude's JSON log of the attempt is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_log_location: Option<String>,
    /// The failing command's exit code and the last lines of its output, when a command
    /// ran (secrets masked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_output: Option<CommandTail>,
    /// The backend's task that ran it (`--executor slurm|container`). Records of earlier
    /// versions name a Slurm task by `slurm_job_id` and `slurm_task_id`, read here too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<crate::backend::task::TaskRef>,
    /// The Slurm task as records of earlier versions name it (`slurm_job_id`,
    /// `slurm_task_id`), kept as read; new records leave it out (`task_ref()` answers for
    /// both).
    #[serde(flatten)]
    pub slurm: Option<crate::backend::task::SlurmIds>,
}

impl FailureDetail {
    /// The task that ran it, however the record names it.
    pub fn task_ref(&self) -> Option<crate::backend::task::TaskRef> {
        self.task
            .clone()
            .or_else(|| self.slurm.as_ref().map(crate::backend::task::TaskRef::from))
    }
}

/// What a failed command left: its exit code and the last lines of what it printed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandTail {
    /// Its exit code (`None` when a signal ended it).
    pub exit_code: Option<i32>,
    /// The last lines of its standard output.
    pub stdout: String,
    /// The last lines of its standard error.
    pub stderr: String,
}

impl CommandTail {
    /// How many lines of each stream are kept.
    pub const LINES: usize = 20;
}

/// What a failed agent left behind in its worktree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorktreeArtifacts {
    /// The agent's worktree, kept for inspection.
    pub worktree_path: PathBuf,
    /// Its branch.
    pub branch_name: String,
    /// Files changed but not committed, described.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncommitted_changes: Option<String>,
    /// The error output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_logs: Option<String>,
}

/// An item in the DLQ.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeadLetteredItem {
    /// The item's id.
    pub item_id: String,
    /// The item as the input gave it.
    pub item_data: Value,
    /// When it first failed.
    pub first_attempt: String,
    /// When it last failed.
    pub last_attempt: String,
    /// Failed attempts so far.
    pub failure_count: u32,
    /// Every failed attempt.
    pub failure_history: Vec<FailureDetail>,
    /// The error type and the start of the message, to group similar failures.
    pub error_signature: String,
    /// Whether `dlq retry` may run it again.
    pub reprocess_eligible: bool,
    /// Whether a person should look first.
    pub manual_review_required: bool,
    /// The failed agent's worktree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree_artifacts: Option<WorktreeArtifacts>,
}

/// `index.json`: the ids in the queue, in the order they arrived.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DlqIndex {
    /// The job.
    pub job_id: String,
    /// Item ids, oldest first.
    pub item_ids: Vec<String>,
    /// How many.
    pub item_count: usize,
    /// When the queue last changed.
    pub updated_at: String,
}

/// Groups failures that look alike: the type, then the message's first line, whole words
/// only: a quoted command (`` `shell: ...` ``) longer than 40 characters keeps its first words
/// and `…` inside its quotes, and the whole is cut after the last word that fits in 80
/// characters, with `…`.
pub fn error_signature(error_type: &ErrorType, message: &str) -> String {
    const SPAN: usize = 40;
    const WHOLE: usize = 80;
    let line = message
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let mut text = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i > 0 {
            text.push('`');
        }
        if i % 2 == 1 {
            text.push_str(&words_within(part, SPAN));
        } else {
            text.push_str(part);
        }
    }
    format!("{}::{}", error_type.name(), words_within(&text, WHOLE))
}

/// TEXT when it has at most MAX characters, else its first words that fit with `…` after
/// them (a first word longer than that is cut, as nothing else fits).
fn words_within(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let room = max.saturating_sub(1);
    let mut out = String::new();
    for word in text.split(' ') {
        let wanted = if out.is_empty() {
            word.chars().count()
        } else {
            out.chars().count() + 1 + word.chars().count()
        };
        if wanted > room {
            break;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    if out.trim().is_empty() {
        out = text.chars().take(room).collect();
    }
    out.truncate(out.trim_end().len());
    out.push('…');
    out
}

/// A problem reading or writing the queue.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum DlqError {
    /// A file could not be read or written.
    #[error("dead letter queue `{path}`: {source}")]
    #[diagnostic(code(prodigy::dlq::io))]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is not what prodigy wrote.
    #[error("dead letter queue `{path}` is damaged: {source}")]
    #[diagnostic(
        code(prodigy::dlq::damaged),
        help("move the file aside; the rest of the queue stays usable")
    )]
    Damaged {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
}

/// One job's queue.
///
/// The index is loaded once per queue (reconciled with the item files, so that an index
/// write a crash lost is made good) and kept in memory; it is written back when the changes
/// not yet on disk exceed a sixteenth of the queue, and by [`Dlq::flush`] (at a job's
/// checkpoints, at most one a second), so that adding n items rewrites it about 16 ln n
/// times, plus once per checkpoint, instead of n times. Clones share the index.
#[derive(Clone, Debug)]
pub struct Dlq {
    job_id: String,
    dir: PathBuf,
    cache: std::sync::Arc<std::sync::Mutex<Option<Cached>>>,
}

/// The index in memory, and how many changes it has that `index.json` lacks.
#[derive(Debug)]
struct Cached {
    /// The ids in arrival order; removed ones stay until the next [`Cached::compact`].
    index: DlqIndex,
    /// The ids in the queue.
    present: std::collections::HashSet<String>,
    unwritten: usize,
    /// The index file was damaged and rebuilt from the item files; not yet said.
    rebuilt: Option<Rebuilt>,
}

/// A damaged `index.json` rebuilt from the item files (the index only lists them in order).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the dead letter queue's index `{index}` was damaged; it was rebuilt from the {items} item files in `{dir}` (the damaged file is kept as `{kept}`)"
)]
pub struct Rebuilt {
    /// `index.json`.
    pub index: PathBuf,
    /// Where the item files are.
    pub dir: PathBuf,
    /// How many items the rebuilt index lists.
    pub items: usize,
    /// Where the damaged file was moved.
    pub kept: PathBuf,
}

impl Cached {
    fn new(index: DlqIndex, unwritten: usize) -> Self {
        let present = index.item_ids.iter().cloned().collect();
        let mut cached = Cached {
            index,
            present,
            unwritten,
            rebuilt: None,
        };
        cached.compact();
        cached
    }

    /// Drops removed ids from the ordered list; an id removed and added again keeps its
    /// last place.
    fn compact(&mut self) {
        let mut seen = std::collections::HashSet::new();
        let present = &self.present;
        let mut ids = std::mem::take(&mut self.index.item_ids);
        ids.reverse();
        ids.retain(|id| present.contains(id) && seen.insert(id.clone()));
        ids.reverse();
        self.index.item_ids = ids;
        self.index.item_count = self.index.item_ids.len();
    }

    fn add(&mut self, id: &str) {
        if self.present.insert(id.to_owned()) {
            self.index.item_ids.push(id.to_owned());
            self.unwritten += 1;
        }
    }

    fn remove(&mut self, id: &str) -> bool {
        let removed = self.present.remove(id);
        if removed {
            self.unwritten += 1;
        }
        removed
    }
}

impl Dlq {
    /// The queue of `job_id` under the layout (nothing is created until an item is added).
    pub fn new(layout: &Layout, job_id: &str) -> Self {
        let dir = layout.dlq_dir(job_id);
        Dlq {
            job_id: job_id.to_owned(),
            dir,
            cache: std::sync::Arc::default(),
        }
    }

    /// The queue's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn item_path(&self, item_id: &str) -> PathBuf {
        let safe: String = item_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        // Ids that had to change get their hash too, so `a/b` and `a_b` stay two files.
        let name = if safe == item_id {
            safe
        } else {
            format!("{safe}-{}", crate::store::hash(item_id))
        };
        crate::layout::dlq_item(&self.dir, &name)
    }

    fn write_json(path: &Path, value: &impl Serialize) -> Result<(), DlqError> {
        let bytes = serde_json::to_vec_pretty(value).map_err(|source| DlqError::Damaged {
            path: path.to_owned(),
            source,
        })?;
        write_atomic(path, &bytes).map_err(|source| DlqError::Io {
            path: path.to_owned(),
            source,
        })
    }

    fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, DlqError> {
        let text = match std::fs::read(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(DlqError::Io {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|source| DlqError::Damaged {
                path: path.to_owned(),
                source,
            })
    }

    /// The index (empty when the queue does not exist), with the changes not yet written.
    pub fn index(&self) -> Result<DlqIndex, DlqError> {
        self.with_index(|cached| {
            cached.compact();
            Ok(cached.index.clone())
        })
    }

    /// Runs F on the index in memory, loading it first if needed.
    fn with_index<T>(
        &self,
        f: impl FnOnce(&mut Cached) -> Result<T, DlqError>,
    ) -> Result<T, DlqError> {
        let mut guard = crate::lock(&self.cache);
        let cached = match guard.take() {
            Some(cached) => cached,
            None => self.load_index()?,
        };
        f(guard.insert(cached))
    }

    /// Reads `index.json` and makes it agree with the item files: ids without a file are
    /// dropped, files the index lacks (a crash between an item and its index write) are
    /// added, oldest first.
    /// A damaged index (a torn write, a bad disk) is moved aside to `index.json.damaged`
    /// and rebuilt the same way from the item files, oldest first; [`Dlq::repair`] says so.
    fn load_index(&self) -> Result<Cached, DlqError> {
        let path = crate::layout::dlq_index(&self.dir);
        let (read, kept) = match Self::read_json(&path) {
            Ok(read) => (read, None),
            Err(DlqError::Damaged { .. }) => {
                let kept = self.dir.join("index.json.damaged");
                std::fs::rename(&path, &kept).map_err(|source| DlqError::Io {
                    path: path.clone(),
                    source,
                })?;
                (None, Some(kept))
            }
            Err(e) => return Err(e),
        };
        let mut index: DlqIndex = read.unwrap_or_else(|| DlqIndex {
            job_id: self.job_id.clone(),
            ..DlqIndex::default()
        });
        let before = index.item_ids.len();
        index.item_ids.retain(|id| self.item_path(id).is_file());
        let mut unwritten = before - index.item_ids.len();
        let known: std::collections::HashSet<PathBuf> =
            index.item_ids.iter().map(|id| self.item_path(id)).collect();
        let mut missing = Vec::new();
        if let Ok(entries) = std::fs::read_dir(crate::layout::dlq_items(&self.dir)) {
            for path in entries.flatten().map(|e| e.path()) {
                // A damaged or foreign file is not an item: it does not take the queue down.
                if path.extension().is_some_and(|e| e == "json")
                    && !known.contains(&path)
                    && let Ok(Some(item)) = Self::read_json::<DeadLetteredItem>(&path)
                {
                    missing.push((item.first_attempt, item.item_id));
                }
            }
        }
        missing.sort();
        unwritten += missing.len();
        index.item_ids.extend(missing.into_iter().map(|(_, id)| id));
        let mut cached = Cached::new(index, unwritten);
        cached.rebuilt = kept.map(|kept| Rebuilt {
            index: path,
            dir: crate::layout::dlq_items(&self.dir),
            items: cached.index.item_count,
            kept,
        });
        Ok(cached)
    }

    /// Loads the index now: whether it was damaged and rebuilt from the item files (said
    /// once), in which case the rebuilt index is written at once.
    pub fn repair(&self) -> Result<Option<Rebuilt>, DlqError> {
        self.with_index(|cached| {
            let rebuilt = cached.rebuilt.take();
            if rebuilt.is_some() {
                self.write_index(cached, true)?;
            }
            Ok(rebuilt)
        })
    }

    /// Writes the index when enough changes gathered (or ALWAYS).
    fn write_index(&self, cached: &mut Cached, always: bool) -> Result<(), DlqError> {
        if cached.unwritten == 0 || (!always && cached.unwritten <= cached.present.len() / 16) {
            return Ok(());
        }
        cached.compact();
        cached.index.updated_at = crate::store::timestamp();
        Self::write_json(&crate::layout::dlq_index(&self.dir), &cached.index)?;
        cached.unwritten = 0;
        Ok(())
    }

    /// Writes the changes the index file lacks.
    pub fn flush(&self) -> Result<(), DlqError> {
        self.with_index(|cached| self.write_index(cached, true))
    }

    /// One item, if it is in the queue.
    pub fn get(&self, item_id: &str) -> Result<Option<DeadLetteredItem>, DlqError> {
        Self::read_json(&self.item_path(item_id))
    }

    /// Every item, in the order they arrived.
    pub fn items(&self) -> Result<Vec<DeadLetteredItem>, DlqError> {
        let mut out = Vec::new();
        for id in self.index()?.item_ids {
            if let Some(item) = self.get(&id)? {
                out.push(item);
            }
        }
        Ok(out)
    }

    /// Records a failure of `item_id`: a new entry, or one more attempt on the entry there.
    pub fn record_failure(
        &self,
        item_id: &str,
        item_data: &Value,
        failure: FailureDetail,
        worktree_artifacts: Option<WorktreeArtifacts>,
    ) -> Result<DeadLetteredItem, DlqError> {
        self.record_failures(item_id, item_data, vec![failure], worktree_artifacts)
    }

    /// Records FAILURES of `item_id`, oldest first, in one write of its entry: the attempts
    /// a retry policy ran, then the last. The last one gives the entry its signature.
    pub fn record_failures(
        &self,
        item_id: &str,
        item_data: &Value,
        failures: Vec<FailureDetail>,
        worktree_artifacts: Option<WorktreeArtifacts>,
    ) -> Result<DeadLetteredItem, DlqError> {
        let mut item = self.get(item_id)?.unwrap_or_else(|| DeadLetteredItem {
            item_id: item_id.to_owned(),
            item_data: item_data.clone(),
            first_attempt: failures
                .first()
                .map(|f| f.timestamp.clone())
                .unwrap_or_default(),
            last_attempt: String::new(),
            failure_count: 0,
            failure_history: Vec::new(),
            error_signature: String::new(),
            reprocess_eligible: true,
            manual_review_required: false,
            worktree_artifacts: None,
        });
        for failure in failures {
            item.failure_count += 1;
            item.last_attempt.clone_from(&failure.timestamp);
            item.error_signature = error_signature(&failure.error_type, &failure.error_message);
            let manual = matches!(
                failure.error_type,
                ErrorType::MergeConflict | ErrorType::CommitValidationFailed
            );
            item.manual_review_required = manual;
            item.reprocess_eligible = !manual;
            item.failure_history.push(FailureDetail {
                attempt_number: item.failure_count,
                ..failure
            });
        }
        if worktree_artifacts.is_some() {
            item.worktree_artifacts = worktree_artifacts;
        }
        Self::write_json(&self.item_path(item_id), &item)?;
        self.with_index(|cached| {
            cached.add(item_id);
            self.write_index(cached, false)
        })?;
        Ok(item)
    }

    /// Takes `item_id` out of the queue (it succeeded on retry); false when it was not there.
    pub fn remove(&self, item_id: &str) -> Result<bool, DlqError> {
        self.with_index(|cached| {
            let removed = self.remove_file(cached, item_id)?;
            self.write_index(cached, false)?;
            Ok(removed)
        })
    }

    fn remove_file(&self, cached: &mut Cached, item_id: &str) -> Result<bool, DlqError> {
        let path = self.item_path(item_id);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(DlqError::Io { path, source }),
        }
        Ok(cached.remove(item_id))
    }

    /// Empties the queue; returns how many items it held.
    pub fn clear(&self) -> Result<usize, DlqError> {
        self.with_index(|cached| {
            cached.compact();
            let ids = cached.index.item_ids.clone();
            for id in &ids {
                self.remove_file(cached, id)?;
            }
            self.write_index(cached, true)?;
            Ok(ids.len())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_of_an_earlier_version_still_names_its_slurm_task() {
        let old = r#"{"attempt_number":1,"timestamp":"2026-11-01T00:00:00Z","error_type":"Unknown","error_message":"lost","agent_id":"agent-0","step_failed":"slurm","duration_ms":5,"slurm_job_id":"7","slurm_task_id":0}"#;
        let f: FailureDetail = serde_json::from_str(old).unwrap();
        let task = f.task_ref().unwrap();
        assert_eq!((task.backend.as_str(), task.id.as_str()), ("slurm", "7_0"));
    }

    fn failure(message: &str, code: i32) -> FailureDetail {
        FailureDetail {
            attempt_number: 0,
            timestamp: "2026-01-01T00:00:00Z".into(),
            error_type: ErrorType::CommandFailed { exit_code: code },
            error_message: message.into(),
            error_context: None,
            stack_trace: None,
            agent_id: "agent-1".into(),
            step_failed: "shell: cargo test".into(),
            duration_ms: 12,
            json_log_location: None,
            command_output: None,
            task: None,
            slurm: None,
        }
    }

    fn queue(home: &Path) -> Dlq {
        Dlq::new(
            &Layout {
                home: home.to_owned(),
                repo: "demo".into(),
            },
            "job-1",
        )
    }

    /// A damaged `index.json` does not take the queue down: it is moved aside, the index is
    /// rebuilt from the item files in the order they failed, said once, and written back.
    #[test]
    fn a_damaged_index_is_rebuilt_from_the_item_files() {
        let home = tempfile::tempdir().unwrap();
        let dlq = queue(home.path());
        for id in ["item_1", "item_2", "item_3"] {
            dlq.record_failure(id, &Value::Null, failure("boom", 1), None)
                .unwrap();
        }
        dlq.flush().unwrap();
        let index = dlq.dir().join("index.json");
        std::fs::write(&index, "{\"job_id\": \"job-1\", \"item_i").unwrap();
        let reopened = queue(home.path());
        let rebuilt = reopened.repair().unwrap().unwrap();
        assert_eq!(rebuilt.items, 3);
        assert_eq!(rebuilt.kept, dlq.dir().join("index.json.damaged"));
        let said = rebuilt.to_string();
        assert!(said.contains("index.json` was damaged"), "{said}");
        assert!(said.contains("rebuilt from the 3 item files"), "{said}");
        assert_eq!(reopened.repair().unwrap(), None);
        assert_eq!(
            reopened.index().unwrap().item_ids,
            ["item_1", "item_2", "item_3"]
        );
        let written: DlqIndex = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
        assert_eq!(written.item_count, 3);
    }

    #[test]
    fn error_types_read_back_from_their_names() {
        for kind in [
            ErrorType::Timeout,
            ErrorType::CommandFailed { exit_code: 3 },
            ErrorType::ValidationFailed,
            ErrorType::WorktreeError,
            ErrorType::MergeConflict,
            ErrorType::CommitValidationFailed,
            ErrorType::ResourceExhausted,
            ErrorType::CircuitOpen,
            ErrorType::Unknown,
        ] {
            assert_eq!(ErrorType::from_name(kind.name()).name(), kind.name());
        }
        assert_eq!(ErrorType::from_name("nonsense"), ErrorType::Unknown);
    }

    #[test]
    fn the_layout_is_the_seeds() {
        let home = tempfile::tempdir().unwrap();
        let dlq = queue(home.path());
        dlq.record_failure(
            "item-123",
            &serde_json::json!({"file": "a.rs"}),
            failure("cargo test failed with exit code 101", 101),
            None,
        )
        .unwrap();
        let dir = home.path().join("dlq/demo/job-1/mapreduce/dlq/job-1");
        assert!(dir.join("items/item-123.json").is_file());
        let index: DlqIndex =
            serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
        assert_eq!(index.item_ids, ["item-123"]);
        let text = std::fs::read_to_string(dir.join("items/item-123.json")).unwrap();
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            value["failure_history"][0]["error_type"],
            serde_json::json!({"CommandFailed": {"exit_code": 101}})
        );
        // The whole message: it is short, and a signature never stops mid-phrase.
        assert_eq!(
            value["error_signature"],
            "CommandFailed::cargo test failed with exit code 101"
        );
    }

    #[test]
    fn signatures_keep_whole_words_and_close_their_quotes() {
        let kind = ErrorType::CommandFailed { exit_code: 1 };
        assert_eq!(
            error_signature(&kind, "`shell: test $ITEM = 1 || exit 3` failed"),
            "CommandFailed::`shell: test $ITEM = 1 || exit 3` failed"
        );
        // A long quoted command keeps its first words, inside its quotes.
        assert_eq!(
            error_signature(
                &kind,
                "`claude: /fix the thing for item 2 please with a very long prompt text` failed"
            ),
            "CommandFailed::`claude: /fix the thing for item 2…` failed"
        );
        let long = "error: the configuration file config/settings.yaml could not be parsed because it holds a tab at line 12";
        let signature = error_signature(&ErrorType::Unknown, long);
        assert_eq!(
            signature,
            "Unknown::error: the configuration file config/settings.yaml could not be parsed because…"
        );
        let text = signature
            .trim_start_matches("Unknown::")
            .trim_end_matches('…');
        assert!(long.starts_with(text), "{signature}");
        assert!(
            long[text.len()..].starts_with(' '),
            "cut mid-word: {signature}"
        );
        // Multi-byte text is cut on characters.
        let wide = "é".repeat(100);
        assert_eq!(
            error_signature(&kind, &wide).chars().count(),
            "CommandFailed::".len() + 80
        );
    }

    #[test]
    fn repeated_failures_accumulate_and_removal_updates_the_index() {
        let home = tempfile::tempdir().unwrap();
        let dlq = queue(home.path());
        let data = serde_json::json!(1);
        dlq.record_failure("a", &data, failure("boom", 1), None)
            .unwrap();
        dlq.record_failure("b", &data, failure("bang", 2), None)
            .unwrap();
        let again = dlq
            .record_failure("a", &data, failure("boom again", 3), None)
            .unwrap();
        assert_eq!(again.failure_count, 2);
        assert_eq!(again.failure_history[1].attempt_number, 2);
        assert_eq!(dlq.index().unwrap().item_ids, ["a", "b"]);
        assert!(dlq.remove("a").unwrap());
        assert!(!dlq.remove("a").unwrap());
        assert_eq!(dlq.items().unwrap().len(), 1);
        assert_eq!(dlq.clear().unwrap(), 1);
        assert_eq!(dlq.index().unwrap().item_count, 0);
    }

    #[test]
    fn the_index_is_written_in_batches_and_a_lost_write_is_made_good() {
        let home = tempfile::tempdir().unwrap();
        let dlq = queue(home.path());
        let on_disk = |dlq: &Dlq| -> DlqIndex {
            serde_json::from_slice(&std::fs::read(dlq.dir().join("index.json")).unwrap()).unwrap()
        };
        let ids: Vec<String> = (0..195).map(|n| format!("item_{n}")).collect();
        for (n, id) in ids.iter().enumerate() {
            dlq.record_failure(
                id,
                &Value::Null,
                failure("boom", i32::try_from(n).unwrap()),
                None,
            )
            .unwrap();
        }
        // Adding n items rewrites the index about 16 ln n times, not n times: the file lags.
        let written = on_disk(&dlq).item_count;
        assert!(written < 195 && written > 150, "{written}");
        assert_eq!(dlq.index().unwrap().item_ids, ids, "readers see every item");
        // A process that dies here loses the last index write; the next one makes it good
        // from the item files, in arrival order.
        let again = queue(home.path());
        assert_eq!(again.index().unwrap().item_ids, ids);
        dlq.remove("item_3").unwrap();
        dlq.flush().unwrap();
        assert_eq!(on_disk(&dlq).item_count, 194);
        assert!(!on_disk(&dlq).item_ids.contains(&"item_3".to_owned()));
        // Removed and added again: once, at the end.
        dlq.record_failure("item_3", &Value::Null, failure("again", 1), None)
            .unwrap();
        dlq.flush().unwrap();
        let index = on_disk(&dlq);
        assert_eq!(index.item_ids.last().map(String::as_str), Some("item_3"));
        assert_eq!(index.item_ids.iter().filter(|i| *i == "item_3").count(), 1);
        assert_eq!(dlq.clear().unwrap(), 195);
        assert_eq!(on_disk(&dlq).item_count, 0);
    }

    #[test]
    fn merge_conflicts_need_a_person() {
        let home = tempfile::tempdir().unwrap();
        let dlq = queue(home.path());
        let item = dlq
            .record_failure(
                "x/y",
                &Value::Null,
                FailureDetail {
                    error_type: ErrorType::MergeConflict,
                    ..failure("conflict in src/lib.rs", 1)
                },
                Some(WorktreeArtifacts {
                    worktree_path: "/tmp/wt".into(),
                    branch_name: "agent-1".into(),
                    uncommitted_changes: None,
                    error_logs: Some("CONFLICT".into()),
                }),
            )
            .unwrap();
        assert!(item.manual_review_required);
        assert!(!item.reprocess_eligible);
        assert!(
            dlq.get("x/y").unwrap().is_some(),
            "ids with `/` are stored safely"
        );
        let other = dlq
            .record_failure("x_y", &Value::Null, failure("boom", 1), None)
            .unwrap();
        assert_eq!(other.failure_count, 1, "`x_y` is not `x/y`");
        assert_eq!(dlq.get("x/y").unwrap().unwrap().item_id, "x/y");
    }
}
