//! A job's merge journal, `merges.jsonl` beside `results.jsonl`: one line per agent merge,
//! appended before the agent's commits are merged into the integration ref.
//!
//! An agent's merge and its outcome are two writes: the ref moves, then `results.jsonl`
//! gets the outcome. A kill between the two would leave the item pending with its work
//! already merged, and running it again on a base that holds its work fails it (nothing
//! left to commit). With this journal, resume finds the item's intended merge, sees that
//! the integration ref contains the commit it names, and records the item as succeeded
//! with its merge commit instead of running it again (`MapJob::recover_merged`).
//! An intent whose commit is not in the ref was never merged: the item runs again.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// An agent's merge about to happen: what resume needs to record the item's success.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MergeIntent {
    /// `item_<index>`.
    pub item_id: String,
    /// Its place in `items.json`.
    pub index: usize,
    /// The agent's run (its attempt number).
    pub attempts: u32,
    /// The agent's branch.
    pub branch: String,
    /// The agent's worktree.
    pub worktree: PathBuf,
    /// The agent's last commit, the one merged.
    pub head: String,
    /// The stdout of the agent's last command, secrets masked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// How long the agent's run took.
    pub duration_secs: f64,
    /// What its Claude calls cost, when it made any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claude: Option<crate::claude::kinds::Totals>,
}

/// Why a line could not be added to the merge journal or the list of kept worktrees.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum JournalError {
    /// The file (or its directory) could not be opened or written.
    #[error("cannot write `{}`: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The line could not be encoded.
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
}

/// Appends INTENT to the journal in the job directory DIR, with one write.
///
/// # Errors
///
/// The journal could not be opened or written (the path and the OS error).
pub fn append(dir: &Path, intent: &MergeIntent) -> Result<(), JournalError> {
    append_line(&crate::layout::merges(dir), intent)
}

/// Notes in the job directory DIR that the agent worktree at WORKTREE is kept.
///
/// # Errors
///
/// The file could not be opened or written (the path and the OS error).
pub fn note_kept(dir: &Path, worktree: &Path) -> Result<(), JournalError> {
    append_line(&crate::layout::kept_worktrees(dir), &worktree)
}

/// The agent worktrees [`note_kept`] noted in the job directory DIR.
pub fn kept(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_to_string(crate::layout::kept_worktrees(dir))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn append_line(path: &Path, value: &impl Serialize) -> Result<(), JournalError> {
    let fail = |source| JournalError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        crate::durable::private_dir(dir).map_err(fail)?;
    }
    let mut line = serde_json::to_vec(value).map_err(JournalError::Encode)?;
    line.push(b'\n');
    let mut file = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .mode(crate::durable::PRIVATE_FILE)
        .open(path)
        .map_err(fail)?;
    // A line torn by a crash is ended first, so that this intent stands on its own line.
    if !ends_a_line(&mut file) {
        line.insert(0, b'\n');
    }
    crate::durable::append(&mut file, path, &line).map_err(fail)
}

/// Whether FILE is empty or ends with a newline.
fn ends_a_line(file: &mut std::fs::File) -> bool {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut last = [b'\n'];
    if file.metadata().is_ok_and(|m| m.len() > 0) {
        let _ = file
            .seek(SeekFrom::End(-1))
            .and_then(|_| file.read_exact(&mut last));
    }
    last[0] == b'\n'
}

/// The test hook `PRODIGY_FAULT_KILL_AFTER_MERGES` (CONTRIBUTING.md, "Fault injection"):
/// in debug builds, the process kills itself with SIGKILL right after the Nth agent merge
/// moved the integration ref, before the item's outcome is written. Release builds ignore
/// it.
pub(crate) fn kill_point_after_merge() {
    static AFTER: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    static MERGES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    kill_point(KILL_AFTER_MERGES_ENV, &AFTER, &MERGES);
}

/// The test hook `PRODIGY_FAULT_KILL_AFTER_VERIFIED` (CONTRIBUTING.md, "Fault injection"):
/// in debug builds, the process kills itself with SIGKILL right after the Nth verified
/// candidate was journalled, before the integration ref moves to it.
pub(crate) fn kill_point_after_verified() {
    static AFTER: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    static VERIFIED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    kill_point(KILL_AFTER_VERIFIED_ENV, &AFTER, &VERIFIED);
}

/// Kills the process with SIGKILL when the environment variable ENV (read once, into
/// AFTER) names the count COUNT reaches now; only in debug builds.
fn kill_point(
    env: &str,
    after: &std::sync::OnceLock<Option<u64>>,
    count: &std::sync::atomic::AtomicU64,
) {
    let after = after.get_or_init(|| {
        if !cfg!(debug_assertions) {
            return None;
        }
        std::env::var(env).ok()?.trim().parse().ok()
    });
    let Some(after) = after else { return };
    let reached = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
    if reached == *after {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::SIGKILL);
    }
}

/// The name of the kill hook's environment variable.
pub const KILL_AFTER_MERGES_ENV: &str = "PRODIGY_FAULT_KILL_AFTER_MERGES";

/// The name of the verified queue's kill hook's environment variable.
pub const KILL_AFTER_VERIFIED_ENV: &str = "PRODIGY_FAULT_KILL_AFTER_VERIFIED";

/// A candidate of the verified merge queue that passed `merge.verify`, journalled before
/// the integration ref moves from BASE to it: a process killed in between leaves the ref at
/// BASE, and resume moves it on without verifying the same state again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verified {
    /// The candidate commit.
    pub verified: String,
    /// The integration ref it was stacked on.
    pub base: String,
    /// The items whose work it holds (their places in `items.json`).
    pub items: Vec<usize>,
}

/// Appends VERIFIED to the journal in the job directory DIR, with one write.
///
/// # Errors
///
/// The journal could not be opened or written (the path and the OS error).
pub fn append_verified(dir: &Path, verified: &Verified) -> Result<(), JournalError> {
    append_line(&crate::layout::merges(dir), verified)
}

/// The last verified candidate in the journal of the job directory DIR.
pub fn last_verified(dir: &Path) -> Option<Verified> {
    let text = std::fs::read_to_string(crate::layout::merges(dir)).unwrap_or_default();
    text.lines()
        .rev()
        .find_map(|line| serde_json::from_str::<Verified>(line).ok())
}

/// The intents in the journal of the job directory DIR, the last one per item winning; torn
/// or unreadable lines are skipped (an intent that was not written was not acted on).
pub fn load(dir: &Path) -> Vec<MergeIntent> {
    let text = std::fs::read_to_string(crate::layout::merges(dir)).unwrap_or_default();
    let mut by_item = std::collections::BTreeMap::new();
    for line in text.lines() {
        if let Ok(intent) = serde_json::from_str::<MergeIntent>(line) {
            by_item.insert(intent.index, intent);
        }
    }
    by_item.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(index: usize, head: &str) -> MergeIntent {
        MergeIntent {
            item_id: format!("item_{index}"),
            index,
            attempts: 1,
            branch: format!("prodigy-s-item_{index}"),
            worktree: PathBuf::from("/w"),
            head: head.into(),
            output: None,
            duration_secs: 0.5,
            claude: None,
        }
    }

    #[test]
    fn a_verified_line_and_an_intent_do_not_read_as_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join("job");
        let verified = |c: &str| Verified {
            verified: c.into(),
            base: "b".into(),
            items: vec![0, 2],
        };
        append(&job, &intent(0, "h0")).unwrap();
        append_verified(&job, &verified("c1")).unwrap();
        append(&job, &intent(2, "h2")).unwrap();
        append_verified(&job, &verified("c2")).unwrap();
        append(&job, &intent(3, "h3")).unwrap();
        let heads: Vec<String> = load(&job).into_iter().map(|i| i.head).collect();
        assert_eq!(heads, ["h0", "h2", "h3"]);
        assert_eq!(last_verified(&job), Some(verified("c2")));
        assert_eq!(last_verified(dir.path()), None);
    }

    #[test]
    fn the_last_intent_per_item_wins_and_a_torn_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join("job");
        append(&job, &intent(2, "a")).unwrap();
        append(&job, &intent(0, "b")).unwrap();
        append(&job, &intent(2, "c")).unwrap();
        let mut text = std::fs::read_to_string(crate::layout::merges(&job)).unwrap();
        text.push_str("{\"item_id\": \"item_1\", \"ind");
        std::fs::write(crate::layout::merges(&job), text).unwrap();
        // The next intent is not glued onto the torn line.
        append(&job, &intent(3, "d")).unwrap();
        let loaded = load(&job);
        assert_eq!(
            loaded
                .iter()
                .map(|i| (i.index, i.head.as_str()))
                .collect::<Vec<_>>(),
            vec![(0, "b"), (2, "c"), (3, "d")]
        );
        assert!(load(&dir.path().join("none")).is_empty());
        note_kept(&job, Path::new("/w/a")).unwrap();
        assert_eq!(kept(&job), [PathBuf::from("/w/a")]);
    }
}
