//! A MapReduce job's records (docs/language.md §9), in its state directory
//! `state/{repo}/mapreduce/jobs/{job_id}/` (the paths are [`crate::layout`]'s):
//!
//! - `checkpoint.json`: the seed's fields (`job_id`, `workflow_file`, `phase`,
//!   `items_processed`, `items_total`, `items_remaining`, `successful_items`,
//!   `failed_items`, `started_at`, `last_checkpoint_at`) plus what resume needs; written
//!   atomically at every phase change, periodically during the map phase, and at the end.
//! - `items.json`: the items after the input pipeline, written once before the first agent.
//! - `results.jsonl`: one line per item outcome, appended when the outcome is decided and
//!   before anything acts on it. A killed process loses no line it wrote, so resume re-runs
//!   only the items that were in flight; a torn last line (power loss, a full disk) is ignored,
//!   and cut off before the next outcome is appended.
//! - `lock`: held by the process running the job.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::durable::write_atomic;

/// Where the job is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobPhase {
    /// Running `setup`.
    Setup,
    /// Running agents.
    Map,
    /// Running `reduce`.
    Reduce,
    /// Finished (completed, failed or stopped).
    Done,
}

/// How the job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// A process is running it (or was, until it was killed).
    Running,
    /// Every phase finished.
    Completed,
    /// A setup or reduce step failed it.
    Failed,
    /// The error policy stopped it; pending items stay pending.
    Stopped,
    /// A signal stopped it.
    Interrupted,
}

/// `checkpoint.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobCheckpoint {
    /// Format version.
    pub version: u32,
    /// The job.
    pub job_id: String,
    /// The workflow file (absolute).
    pub workflow_file: PathBuf,
    /// The project directory (absolute).
    pub project: PathBuf,
    /// A hash of the workflow text: resuming a changed workflow is refused.
    pub workflow_hash: String,
    /// The phase to continue in.
    pub phase: JobPhase,
    /// How the job stands.
    pub status: Status,
    /// Items with an outcome.
    pub items_processed: u64,
    /// Items after the input pipeline.
    pub items_total: u64,
    /// Ids of the items without an outcome.
    pub items_remaining: Vec<String>,
    /// Items that succeeded.
    pub successful_items: u64,
    /// Items that failed.
    pub failed_items: u64,
    /// Items skipped by `on_item_failure: skip`.
    pub skipped_items: u64,
    /// When the job started.
    pub started_at: String,
    /// When this checkpoint was written.
    pub last_checkpoint_at: String,
    /// The next `reduce` step, in the reduce phase.
    pub reduce_next_step: usize,
    /// Variables after setup (and during reduce, after each step), each secret value sealed.
    pub variables: Value,
    /// `--param` values.
    pub params: Vec<(String, String)>,
    /// `--args` values.
    pub args: Vec<String>,
    /// `--profile`.
    pub profile: Option<String>,
    /// The parallelism the job runs with.
    pub max_parallel: usize,
    /// Why the error policy stopped the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// The error metrics (docs/language.md §8) once the map phase is over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_metrics: Option<Value>,
    /// The session worktree the job works in (docs/language.md §11); resume continues in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<crate::worktree::records::SessionWorktree>,
    /// US dollars the job's Claude calls have cost so far, every process that ran it
    /// included: its Claude budget is for the whole job (docs/language.md, "Claude budgets").
    #[serde(default, skip_serializing_if = "crate::claude::budget::is_zero")]
    pub claude_cost_usd: f64,
    /// How far this process's events had been written when `claude_cost_usd` was: a
    /// `claude_finished` after it is not in the amount ([`crate::spend`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claude_counted_to: Option<crate::store::EventsMark>,
    /// Set when the job stopped at its Claude budget: `resume-job` continues it without
    /// `--force` (with a larger `--max-cost-usd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claude_budget_reached: Option<crate::claude::budget::Reached>,
}

/// How an item ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    /// Its agent succeeded.
    Succeeded,
    /// It failed for good.
    Failed,
    /// It failed and was skipped by policy.
    Skipped,
}

/// One item's outcome: a line of `results.jsonl` and an entry of `${map.results}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ItemRecord {
    /// `item_<index>`.
    pub item_id: String,
    /// Its place in `items.json`.
    pub index: usize,
    /// How it ended.
    pub status: ItemStatus,
    /// Runs of its agent (1 unless `on_item_failure: retry`).
    pub attempts: u32,
    /// The stdout of the agent's last command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// What went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The DLQ error type of the failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    /// How long the last run took.
    pub duration_secs: f64,
    /// Whether the item went to the DLQ.
    #[serde(default)]
    pub dead_lettered: bool,
    /// What its Claude calls cost, when it made any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claude: Option<crate::claude::kinds::Totals>,
    /// The backend's task that ran it (`--executor slurm|container`). Records of earlier
    /// versions name a Slurm task by `slurm_job_id` and `slurm_task_id`, read here too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<crate::backend::task::TaskRef>,
    /// The Slurm task as records of earlier versions name it (`slurm_job_id`,
    /// `slurm_task_id`), kept as read; new records leave it out (`task_ref()` answers for
    /// both).
    #[serde(flatten)]
    pub slurm: Option<crate::backend::task::SlurmIds>,
    /// The commit that brought the agent's work into the session's merged work (its last
    /// commit when fast-forwarded to); absent when it merged nothing or ran without a
    /// worktree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_commit: Option<String>,
    /// Its Claude sessions and logs, the kind of its last failed call, its merged commits.
    #[serde(flatten)]
    pub trail: ItemTrail,
}

impl ItemRecord {
    /// The task that ran it, however the record names it.
    pub fn task_ref(&self) -> Option<crate::backend::task::TaskRef> {
        self.task
            .clone()
            .or_else(|| self.slurm.as_ref().map(crate::backend::task::TaskRef::from))
    }
}

/// Where to look into what an item did: its Claude calls' sessions and logs (in the order
/// they ran), the kind of its last failed Claude call, and the commits of its agent merged
/// into the job's work. Each is left out of `results.jsonl` when empty.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ItemTrail {
    /// The session id of each Claude call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claude_sessions: Vec<String>,
    /// The log of each Claude call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claude_logs: Vec<std::path::PathBuf>,
    /// The kind of the last Claude call that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claude_error_kind: Option<crate::claude::kinds::ErrorKind>,
    /// The agent's commits merged into the job's work, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commits: Vec<String>,
}

impl ItemTrail {
    /// Notes CALL, a Claude call the item made.
    pub fn add_call(&mut self, call: &crate::claude::kinds::Call) {
        if let Some(session) = &call.session_id {
            self.claude_sessions.push(session.clone());
        }
        if let Some(log) = &call.log {
            self.claude_logs.push(log.clone());
        }
        if let Some(kind) = call.verdict.kind {
            self.claude_error_kind = Some(kind);
        }
    }
}

/// A problem with the job's files.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum JobStoreError {
    /// A file could not be read or written.
    #[error("job state `{path}`: {source}")]
    #[diagnostic(code(prodigy::job::io))]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is not what prodigy wrote.
    #[error("job state `{path}` is damaged: {source}")]
    #[diagnostic(code(prodigy::job::damaged))]
    Damaged {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
}

/// The files of one job.
#[derive(Debug)]
pub struct JobFiles {
    dir: PathBuf,
    journal: Option<File>,
}

impl JobFiles {
    /// The job's directory (created on the first write).
    pub fn new(dir: PathBuf) -> Self {
        JobFiles { dir, journal: None }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> JobStoreError + '_ {
        move |source| JobStoreError::Io {
            path: path.to_owned(),
            source,
        }
    }

    fn write_json(path: &Path, value: &impl Serialize) -> Result<(), JobStoreError> {
        let bytes = serde_json::to_vec_pretty(value).map_err(|source| JobStoreError::Damaged {
            path: path.to_owned(),
            source,
        })?;
        write_atomic(path, &bytes).map_err(Self::io(path))
    }

    fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, JobStoreError> {
        let bytes = std::fs::read(path).map_err(Self::io(path))?;
        serde_json::from_slice(&bytes).map_err(|source| JobStoreError::Damaged {
            path: path.to_owned(),
            source,
        })
    }

    /// Writes `checkpoint.json` atomically; makes the journal durable first, so the
    /// checkpoint never counts an outcome the journal could lose.
    pub fn save_checkpoint(&mut self, checkpoint: &JobCheckpoint) -> Result<(), JobStoreError> {
        if let Some(journal) = &self.journal {
            let path = crate::layout::results(&self.dir);
            journal.sync_data().map_err(Self::io(&path))?;
        }
        Self::write_json(&crate::layout::checkpoint(&self.dir), checkpoint)
    }

    /// Reads `checkpoint.json`.
    pub fn load_checkpoint(&self) -> Result<JobCheckpoint, JobStoreError> {
        Self::read_json(&crate::layout::checkpoint(&self.dir))
    }

    /// Writes `items.json`.
    pub fn save_items(&self, items: &[Value]) -> Result<(), JobStoreError> {
        let path = crate::layout::items(&self.dir);
        let bytes = serde_json::to_vec(items).map_err(|source| JobStoreError::Damaged {
            path: path.clone(),
            source,
        })?;
        write_atomic(&path, &bytes).map_err(Self::io(&path))
    }

    /// Reads `items.json`.
    pub fn load_items(&self) -> Result<Vec<Value>, JobStoreError> {
        Self::read_json(&crate::layout::items(&self.dir))
    }

    /// Appends an outcome to `results.jsonl` with one write.
    pub fn append(&mut self, record: &ItemRecord) -> Result<(), JobStoreError> {
        let path = crate::layout::results(&self.dir);
        if self.journal.is_none() {
            crate::durable::private_dir(&self.dir).map_err(Self::io(&self.dir))?;
            let mut file = OpenOptions::new()
                .create(true)
                .read(true)
                .append(true)
                .mode(crate::durable::PRIVATE_FILE)
                .open(&path)
                .map_err(Self::io(&path))?;
            // A line torn by a crash or a full disk is cut off, so the next record stands on
            // its own line and no half record stays.
            cut_torn_tail(&mut file).map_err(Self::io(&path))?;
            self.journal = Some(file);
        }
        let mut line = serde_json::to_vec(record).map_err(|source| JobStoreError::Damaged {
            path: path.clone(),
            source,
        })?;
        line.push(b'\n');
        let Some(file) = self.journal.as_mut() else {
            return Ok(());
        };
        let written = crate::durable::append(file, &path, &line);
        if written.is_err() {
            // Opened again for the next record, which checks the end of the file anew.
            self.journal = None;
        }
        written.map_err(Self::io(&path))
    }

    /// Every outcome in `results.jsonl`, in item order, the last one per item winning; a
    /// torn last line is skipped. The journal is read a line at a time, so that a job of
    /// many items holds its records once, not also the file's bytes.
    pub fn load_results(&self) -> Result<Vec<ItemRecord>, JobStoreError> {
        use std::io::BufRead as _;
        let path = crate::layout::results(&self.dir);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(JobStoreError::Io { path, source }),
        };
        // One record per item in a vector, found again through a map of positions: a
        // 100,000-item job peaks ~10 MB lower than with a `BTreeMap` of whole records.
        let mut records: Vec<ItemRecord> = Vec::new();
        let mut at: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
        let mut reader = std::io::BufReader::with_capacity(64 << 10, file);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => {}
                Err(source) => return Err(JobStoreError::Io { path, source }),
            }
            let Ok(record) = serde_json::from_slice::<ItemRecord>(&line) else {
                continue;
            };
            match at.entry(record.index) {
                std::collections::hash_map::Entry::Occupied(slot) => {
                    if let Some(old) = records.get_mut(*slot.get()) {
                        *old = record;
                    }
                }
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(records.len());
                    records.push(record);
                }
            }
        }
        drop(at);
        records.sort_unstable_by_key(|r| r.index);
        Ok(records)
    }
}

/// Cuts FILE after its last newline: a last line without its end was torn by a crash or a
/// full disk, and is no record.
fn cut_torn_tail(file: &mut File) -> std::io::Result<()> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    const CHUNK: usize = 8192;
    let len = file.metadata()?.len();
    let mut end = len;
    let mut buf = [0u8; CHUNK];
    while end > 0 {
        let start = end.saturating_sub(CHUNK as u64);
        let size = usize::try_from(end - start).unwrap_or(CHUNK);
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf[..size])?;
        if let Some(at) = buf[..size].iter().rposition(|&b| b == b'\n') {
            let keep = start + at as u64 + 1;
            if keep < len {
                file.set_len(keep)?;
            }
            return Ok(());
        }
        end = start;
    }
    if len > 0 {
        file.set_len(0)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_of_an_earlier_version_still_names_its_slurm_task() {
        let old = r#"{"item_id":"item_2","index":2,"status":"failed","attempts":1,"duration_secs":1.5,"slurm_job_id":"41","slurm_task_id":2}"#;
        let r: ItemRecord = serde_json::from_str(old).unwrap();
        let task = r.task_ref().unwrap();
        assert_eq!((task.backend.as_str(), task.id.as_str()), ("slurm", "41_2"));
        // Shown again (`dlq show --format json`, `${map.results}`), it keeps its ids.
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains(r#""slurm_job_id":"41""#), "{text}");
        // A new record names its task the current way only.
        let text = serde_json::to_string(&ItemRecord {
            task: r.task_ref(),
            slurm: None,
            ..r
        })
        .unwrap();
        assert!(
            text.contains(r#""task":{"backend":"slurm","id":"41_2"}"#),
            "{text}"
        );
        assert!(!text.contains("slurm_job_id"), "{text}");
    }

    fn record(index: usize, status: ItemStatus) -> ItemRecord {
        ItemRecord {
            item_id: format!("item_{index}"),
            index,
            status,
            attempts: 1,
            output: None,
            error: None,
            error_type: None,
            duration_secs: 0.0,
            dead_lettered: false,
            claude: None,
            task: None,
            slurm: None,
            merge_commit: None,
            trail: ItemTrail::default(),
        }
    }

    #[test]
    fn outcomes_survive_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = JobFiles::new(dir.path().join("job"));
        files.append(&record(0, ItemStatus::Succeeded)).unwrap();
        files.append(&record(2, ItemStatus::Failed)).unwrap();
        drop(files);
        let journal = dir.path().join("job/results.jsonl");
        let mut text = std::fs::read_to_string(&journal).unwrap();
        text.push_str("{\"item_id\": \"item_1\", \"ind");
        std::fs::write(&journal, text).unwrap();
        let mut files = JobFiles::new(dir.path().join("job"));
        let results = files.load_results().unwrap();
        assert_eq!(
            results.iter().map(|r| r.index).collect::<Vec<_>>(),
            vec![0, 2]
        );
        // The next run's first outcome is not glued onto the torn line, which is cut off.
        files.append(&record(3, ItemStatus::Succeeded)).unwrap();
        let text = std::fs::read_to_string(&journal).unwrap();
        assert!(!text.contains("\"ind\n"), "{text}");
        assert_eq!(text.lines().count(), 3, "{text}");
        let results = files.load_results().unwrap();
        assert_eq!(
            results.iter().map(|r| r.index).collect::<Vec<_>>(),
            vec![0, 2, 3]
        );
    }

    /// An item recorded again (a retry, `dlq retry`) counts as its last record, and the
    /// records come back in item order whatever order they finished in.
    #[test]
    fn the_last_record_of_an_item_wins_and_items_come_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = JobFiles::new(dir.path().join("job"));
        files.append(&record(2, ItemStatus::Failed)).unwrap();
        files.append(&record(0, ItemStatus::Succeeded)).unwrap();
        files.append(&record(2, ItemStatus::Succeeded)).unwrap();
        let results = files.load_results().unwrap();
        assert_eq!(
            results
                .iter()
                .map(|r| (r.index, r.status))
                .collect::<Vec<_>>(),
            vec![(0, ItemStatus::Succeeded), (2, ItemStatus::Succeeded)]
        );
    }

    #[test]
    fn a_long_torn_line_is_cut_back_to_the_last_whole_record() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("job/results.jsonl");
        let mut files = JobFiles::new(dir.path().join("job"));
        files.append(&record(0, ItemStatus::Succeeded)).unwrap();
        drop(files);
        let whole = std::fs::read_to_string(&journal).unwrap();
        // Torn well past one read of the tail.
        std::fs::write(
            &journal,
            format!("{whole}{{\"output\": \"{}", "x".repeat(20_000)),
        )
        .unwrap();
        let mut files = JobFiles::new(dir.path().join("job"));
        files.append(&record(1, ItemStatus::Failed)).unwrap();
        let text = std::fs::read_to_string(&journal).unwrap();
        assert!(text.starts_with(&whole) && !text.contains("xxx"), "{text}");
        assert_eq!(files.load_results().unwrap().len(), 2);
        // A file that is all torn line is emptied.
        std::fs::write(&journal, "{\"item_id\"").unwrap();
        let mut files = JobFiles::new(dir.path().join("job"));
        files.append(&record(2, ItemStatus::Succeeded)).unwrap();
        assert_eq!(
            std::fs::read_to_string(&journal).unwrap().lines().count(),
            1
        );
    }

    #[test]
    fn items_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let files = JobFiles::new(dir.path().join("job"));
        let items = vec![serde_json::json!({"id": 1}), serde_json::json!("two")];
        files.save_items(&items).unwrap();
        assert_eq!(files.load_items().unwrap(), items);
    }
}
