//! The standard runs and MapReduce jobs kept under `$PRODIGY_HOME`, as `prodigy ls` lists
//! them: read from their checkpoints, with whether a process still holds each one's lock.

use crate::layout::{Layout, RunKind};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::jobstore::{JobFiles, JobStoreError, Status as JobStatus};
use crate::store::{Checkpoint, CheckpointError, SessionStatus, is_locked};

/// How a run or job stands: what `prodigy ls` reads from its state on disk, and what the
/// read model shows (`status`, the dashboard), which alone says [`State::Paused`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// A live process holds its lock.
    Running,
    /// A live process runs it, but its Claude calls wait for the usage limit to reset (its
    /// events say so; its state on disk says running).
    Paused,
    /// Its checkpoint says running, but no process holds its lock: it was killed.
    Crashed,
    /// Every step (or phase) ran.
    Completed,
    /// A step failed it.
    Failed,
    /// The error policy stopped the job.
    Stopped,
    /// A signal stopped it.
    Interrupted,
}

impl State {
    /// The word `prodigy ls` shows.
    pub fn word(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Paused => "paused at the usage limit",
            State::Crashed => "crashed",
            State::Completed => "completed",
            State::Failed => "failed",
            State::Stopped => "stopped",
            State::Interrupted => "interrupted",
        }
    }

    /// Whether `resume` or `resume-job` can continue it.
    pub fn resumable(self) -> bool {
        match self {
            State::Crashed | State::Failed | State::Stopped | State::Interrupted => true,
            State::Running | State::Paused | State::Completed => false,
        }
    }
}

/// A job's items, from its checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Items {
    /// Items after the input pipeline.
    pub total: u64,
    /// Items that succeeded.
    pub succeeded: u64,
    /// Items that failed (in the dead letter queue unless the policy skipped them).
    pub failed: u64,
    /// Items skipped by `on_item_failure: skip`.
    pub skipped: u64,
}

/// One run or job.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Its id.
    pub id: String,
    /// Run or job.
    pub kind: RunKind,
    /// How it stands.
    pub state: State,
    /// The project's namespace under `state/`.
    pub repo: String,
    /// The project directory.
    pub project: PathBuf,
    /// The workflow file.
    pub workflow: PathBuf,
    /// When it started (RFC 3339, UTC).
    pub started_at: String,
    /// When its checkpoint was last written.
    pub updated_at: String,
    /// A job's items; `None` for a standard run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub items: Option<Items>,
}

/// What [`list`] found.
#[derive(Debug, Default)]
pub struct Listing {
    /// Runs and jobs, newest first.
    pub runs: Vec<Summary>,
    /// Checkpoints that could not be read, with why.
    pub unreadable: Vec<(PathBuf, ReadError)>,
}

/// Why a checkpoint could not be read into a [`Summary`]; it says the OS's or the JSON
/// parser's words, the caller names the checkpoint.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ReadError {
    /// The file could not be read.
    #[error("{0}")]
    Io(#[source] std::io::Error),
    /// It is not a checkpoint.
    #[error("{0}")]
    Json(#[source] serde_json::Error),
}

/// The runs and jobs under HOME: of the project namespace REPO, or of every project.
pub fn list(home: &Path, repo: Option<&str>) -> Listing {
    let mut listing = Listing::default();
    for project in Layout::projects(home) {
        let name = &project.repo;
        if repo.is_some_and(|r| r != name) {
            continue;
        }
        for (sub, kind) in [
            (project.sessions_dir(), RunKind::Run),
            (project.jobs_dir(), RunKind::Job),
        ] {
            let Ok(entries) = std::fs::read_dir(&sub) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = crate::layout::checkpoint(&entry.path());
                if !path.is_file() {
                    continue;
                }
                match read(&entry.path(), &path, kind, name) {
                    Ok(summary) => listing.runs.push(summary),
                    Err(why) => listing.unreadable.push((path, why)),
                }
            }
        }
    }
    // Newest first; the id breaks ties (ids grow with time too).
    listing.runs.sort_by(|a, b| {
        b.started_at
            .cmp(&a.started_at)
            .then_with(|| b.id.cmp(&a.id))
    });
    listing
}

/// The run or job ID under HOME, in whichever project it is; `None` when there is none,
/// an error when its checkpoint cannot be read.
pub fn find(home: &Path, id: &str) -> Option<Result<Summary, ReadError>> {
    if let Some((dir, repo)) = Layout::find_job(home, id) {
        return Some(read(
            &dir,
            &crate::layout::checkpoint(&dir),
            RunKind::Job,
            &repo,
        ));
    }
    let (checkpoint, repo) = Layout::find_session(home, id)?;
    let dir = checkpoint.parent()?.to_owned();
    Some(read(&dir, &checkpoint, RunKind::Run, &repo))
}

/// The summary of the run or job whose state directory is DIR.
fn read(dir: &Path, checkpoint: &Path, kind: RunKind, repo: &str) -> Result<Summary, ReadError> {
    let live = is_locked(dir);
    match kind {
        RunKind::Run => {
            // With the newer records of its journal.
            let c = Checkpoint::load(checkpoint).map_err(|e| match e {
                CheckpointError::Io { source, .. } => ReadError::Io(source),
                CheckpointError::Damaged { source, .. } => ReadError::Json(source),
            })?;
            let state = match c.status {
                SessionStatus::Running if live => State::Running,
                SessionStatus::Running => State::Crashed,
                SessionStatus::Completed => State::Completed,
                SessionStatus::Failed => State::Failed,
                SessionStatus::Interrupted => State::Interrupted,
            };
            Ok(Summary {
                id: c.session_id,
                kind,
                state,
                repo: repo.to_owned(),
                project: c.project,
                workflow: c.workflow,
                started_at: c.started_at,
                updated_at: c.updated_at,
                items: None,
            })
        }
        RunKind::Job => {
            let c = JobFiles::new(dir.to_owned())
                .load_checkpoint()
                .map_err(|e| match e {
                    JobStoreError::Io { source, .. } => ReadError::Io(source),
                    JobStoreError::Damaged { source, .. } => ReadError::Json(source),
                })?;
            let state = match c.status {
                JobStatus::Running if live => State::Running,
                JobStatus::Running => State::Crashed,
                JobStatus::Completed => State::Completed,
                JobStatus::Failed => State::Failed,
                JobStatus::Stopped => State::Stopped,
                JobStatus::Interrupted => State::Interrupted,
            };
            let mut items = Items {
                total: c.items_total,
                succeeded: c.successful_items,
                failed: c.failed_items,
                skipped: c.skipped_items,
            };
            // A crashed job's checkpoint lags its outcomes: `results.jsonl`, written first,
            // is what `resume-job` goes on from, and what the events show.
            if state == State::Crashed
                && let Ok(results) = JobFiles::new(dir.to_owned()).load_results()
            {
                let count = |status: crate::jobstore::ItemStatus| {
                    results.iter().filter(|r| r.status == status).count() as u64
                };
                items.succeeded = count(crate::jobstore::ItemStatus::Succeeded);
                items.failed = count(crate::jobstore::ItemStatus::Failed);
                items.skipped = count(crate::jobstore::ItemStatus::Skipped);
            }
            Ok(Summary {
                id: c.job_id,
                kind,
                state,
                repo: repo.to_owned(),
                project: c.project,
                workflow: c.workflow_file,
                started_at: c.started_at,
                updated_at: c.last_checkpoint_at,
                items: Some(items),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn session(id: &str, status: &str, started: &str) -> String {
        format!(
            r#"{{"version":1,"session_id":"{id}","workflow":"/p/a.yml","project":"/p","workflow_hash":"0","next_step":1,"status":"{status}","variables":{{}},"params":[],"args":[],"profile":null,"started_at":"{started}","updated_at":"{started}"}}"#
        )
    }

    fn job(id: &str, status: &str, started: &str) -> String {
        format!(
            r#"{{"version":1,"job_id":"{id}","workflow_file":"/p/j.yml","project":"/p","workflow_hash":"0","phase":"done","status":"{status}","items_processed":3,"items_total":3,"items_remaining":[],"successful_items":2,"failed_items":1,"skipped_items":0,"started_at":"{started}","last_checkpoint_at":"{started}","reduce_next_step":0,"variables":{{}},"params":[],"args":[],"profile":null,"max_parallel":2}}"#
        )
    }

    #[test]
    fn runs_and_jobs_are_listed_newest_first_with_a_killed_one_as_crashed() {
        let home = tempfile::tempdir().unwrap();
        let state = home.path().join("state");
        write(
            &state.join("a-1/sessions/session-1/checkpoint.json"),
            &session("session-1", "completed", "2026-11-01T10:00:00.000Z"),
        );
        // Running in its checkpoint, but nothing holds its lock.
        write(
            &state.join("a-1/sessions/session-2/checkpoint.json"),
            &session("session-2", "running", "2026-11-03T10:00:00.000Z"),
        );
        write(
            &state.join("a-1/mapreduce/jobs/mapreduce-1/checkpoint.json"),
            &job("mapreduce-1", "completed", "2026-11-02T10:00:00.000Z"),
        );
        write(
            &state.join("b-2/sessions/session-3/checkpoint.json"),
            &session("session-3", "failed", "2026-11-04T10:00:00.000Z"),
        );
        write(
            &state.join("b-2/sessions/session-4/checkpoint.json"),
            "{torn",
        );

        let mine = list(home.path(), Some("a-1"));
        let ids: Vec<_> = mine.runs.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["session-2", "mapreduce-1", "session-1"]);
        assert_eq!(mine.runs[0].state, State::Crashed);
        assert!(mine.runs[0].state.resumable());
        assert_eq!(mine.runs[1].kind, RunKind::Job);
        assert_eq!(mine.runs[1].items.unwrap().failed, 1);
        assert!(mine.unreadable.is_empty());

        let all = list(home.path(), None);
        assert_eq!(all.runs.len(), 4);
        assert_eq!(all.runs[0].id, "session-3");
        assert_eq!(all.unreadable.len(), 1);
    }

    /// A killed job's checkpoint lags its outcomes (written after them): its counts are
    /// those of `results.jsonl`, which `resume-job` goes on from, the last one per item.
    #[test]
    fn a_crashed_jobs_counts_are_its_recorded_outcomes() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join("state/a-1/mapreduce/jobs/mapreduce-2");
        write(
            &dir.join("checkpoint.json"),
            &job("mapreduce-2", "running", "2026-11-02T10:00:00.000Z"),
        );
        let record = |index: usize, status: &str| {
            format!(
                r#"{{"item_id":"item_{index}","index":{index},"status":"{status}","attempts":1,"duration_secs":0.1}}"#
            )
        };
        let lines = [
            record(0, "succeeded"),
            record(1, "failed"),
            record(2, "succeeded"),
            // Retried: the last outcome of item 1 counts.
            record(1, "succeeded"),
        ];
        write(&dir.join("results.jsonl"), &(lines.join("\n") + "\n"));
        let runs = list(home.path(), Some("a-1")).runs;
        assert_eq!(runs[0].state, State::Crashed);
        let items = runs[0].items.unwrap();
        assert_eq!((items.succeeded, items.failed, items.total), (3, 0, 3));
    }
}
