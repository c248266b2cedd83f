//! Bringing a session's work back: the end of a map phase, and the session branch merged
//! into the branch the run started from (with the workflow's `merge` steps, or `git merge`).

use super::records::{OffBranch, RefLeft};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use prodigy_plan::Plan;

use super::{
    SessionWorktree, WorktreeError, conflict, current_branch, git, git_output, git_sync,
    integration_ref,
};
use crate::vars::Vars;

/// Why a map phase's merged work did not come into the session worktree
/// ([`crate::runner::Runner::end_map_phase`]); the agents' work stays on the integration ref.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error(
    "cannot bring the agents' merged work (`refs/prodigy/{branch}`) into the session worktree {}: {source}; {}",
    path.display(),
    finish_map_advice(source)
)]
pub struct FinishMapError {
    /// The session branch.
    pub branch: String,
    /// The session worktree.
    pub path: PathBuf,
    /// What git said.
    pub source: WorktreeError,
}

/// What to do about SOURCE, a failed end of the map phase: changes of the session's own that
/// git refused to overwrite are the user's to commit or remove; anything else (a full disk)
/// left nothing in the way, and resuming tries again.
pub(crate) fn finish_map_advice(source: &WorktreeError) -> &'static str {
    match source {
        WorktreeError::Git { stderr, .. } if refused_to_start(stderr) => {
            "commit or remove the changes there that stand in the way, then resume"
        }
        WorktreeError::Spawn(_)
        | WorktreeError::Git { .. }
        | WorktreeError::Lock { .. }
        | WorktreeError::Conflict { .. } => {
            "what the merge had begun to write was put back; make room (or fix the cause), then resume: it tries again"
        }
    }
}

/// Whether git's STDERR says a merge refused to start: changes in the worktree stand in the
/// way, and nothing was written.
pub(crate) fn refused_to_start(stderr: &str) -> bool {
    stderr.contains("would be overwritten") || stderr.contains("Your local changes")
}

/// The file in a session worktree's own git directory that says a map phase's merge into it
/// has begun: `FROM TO` (the session's commit before, the integration ref's). It stays
/// while the merge may have left files half written (killed, or the disk full), so that
/// the next try puts them back first ([`finish_map`]).
pub(super) const FINISHING: &str = "prodigy-finishing-map";

/// Ends a map phase: the agents' merged work comes into the session branch (a fast-forward
/// unless the session committed meanwhile) and the integration ref goes. Nothing to do when
/// no agent merged anything.
///
/// A merge that fails once it has begun writing (a full disk) leaves files git wrote only
/// in part; those, and only those (the paths the merge changes, which git refuses to start
/// on when they hold changes of their own), are put back as the session's commit has them,
/// at once and again by the next try, so that `resume-job` goes on once there is room.
///
/// Once the merge is done, the integration ref goes; when it cannot (a lock a killed git
/// left, or one held for longer than the wait), the job goes on: its work is in the session
/// branch, the ref is named ([`RefLeft`]), and the next map phase's end deletes it (merging
/// it again is a fast-forward to where the branch is).
pub async fn finish_map(session: &SessionWorktree) -> Result<Option<RefLeft>, WorktreeError> {
    let name = integration_ref(session);
    let marker = git(&session.path, &["rev-parse", "--git-path", FINISHING])
        .await
        .map(|p| session.path.join(p.trim()))?;
    if let Ok(text) = std::fs::read_to_string(&marker)
        && let Some((from, to)) = text.trim().split_once(' ')
    {
        let head = git(&session.path, &["rev-parse", "HEAD"]).await?;
        if head.trim() == from {
            put_back(&session.path, from, to).await?;
        }
    }
    let Ok(head) = git(&session.path, &["rev-parse", "-q", "--verify", &name]).await else {
        let _ = std::fs::remove_file(&marker);
        return Ok(None);
    };
    let to = head.trim();
    let from = git(&session.path, &["rev-parse", "HEAD"]).await?;
    let from = from.trim();
    std::fs::write(&marker, format!("{from} {to}\n")).map_err(|e| WorktreeError::Git {
        args: "merge".into(),
        stderr: format!("cannot write `{}`: {e}", marker.display()),
    })?;
    let message = format!("Merge the map agents' work ({})", session.branch);
    let merged = git(&session.path, &["merge", "-q", "--ff", "-m", &message, to]).await;
    if let Err(e) = merged {
        // Refused before writing anything (changes of the session's own in the way): those
        // are the user's, and stay. Anything else may have left files half written.
        let refused = matches!(&e, WorktreeError::Git { stderr, .. } if refused_to_start(stderr));
        if refused || put_back(&session.path, from, to).await.is_ok() {
            let _ = std::fs::remove_file(&marker);
        }
        return Err(e);
    }
    let _ = std::fs::remove_file(&marker);
    // Deleting a ref rewrites `packed-refs`, whose lock the end-of-phase sweep's branch
    // deletions may hold at this moment.
    let deleted = super::git_retrying(&session.path, &["update-ref", "-d", &name]).await;
    Ok(deleted.err().map(|e| RefLeft {
        name,
        why: e.to_string(),
    }))
}

/// Puts back, in the worktree at DIR whose `HEAD` is still FROM, the paths a merge from FROM
/// to TO changes, as FROM has them (in the index and on disk): a file FROM has is checked
/// out again, one only TO has is removed.
pub(crate) async fn put_back(dir: &Path, from: &str, to: &str) -> Result<(), WorktreeError> {
    // A merge that stopped on a conflict (the session committed meanwhile) is git's to
    // undo: it knows what it wrote.
    if git(dir, &["rev-parse", "-q", "--verify", "MERGE_HEAD"])
        .await
        .is_ok()
    {
        return git(dir, &["merge", "--abort"]).await.map(drop);
    }
    let changed = git(
        dir,
        &["diff", "--name-only", "-z", "--no-renames", from, to],
    )
    .await?;
    let changed: Vec<&str> = changed.split('\0').filter(|p| !p.is_empty()).collect();
    if changed.is_empty() {
        return Ok(());
    }
    // Only after a failure: the whole tree's names, once.
    let kept = git(dir, &["ls-tree", "-r", "-z", "--name-only", from]).await?;
    let kept: std::collections::HashSet<&str> =
        kept.split('\0').filter(|p| !p.is_empty()).collect();
    let (back, gone): (Vec<&str>, Vec<&str>) = changed.iter().partition(|p| kept.contains(*p));
    let literal = |paths: &[&str]| -> Vec<String> {
        paths.iter().map(|p| format!(":(literal){p}")).collect()
    };
    if !gone.is_empty() {
        for path in &gone {
            let _ = std::fs::remove_file(dir.join(path));
        }
        let specs = literal(&gone);
        let mut args = vec!["rm", "-q", "--cached", "--ignore-unmatch", "--"];
        args.extend(specs.iter().map(String::as_str));
        git(dir, &args).await?;
    }
    if !back.is_empty() {
        let specs = literal(&back);
        let mut args = vec!["restore", "--source", from, "--staged", "--worktree", "--"];
        args.extend(specs.iter().map(String::as_str));
        git(dir, &args).await?;
    }
    Ok(())
}

/// The commits of the session branch that TARGET does not have, oldest first, with the
/// files they change: what merging the session back brings.
pub fn session_changes(session: &SessionWorktree) -> (Vec<String>, Vec<String>) {
    let target = session
        .target_branch
        .clone()
        .unwrap_or_else(|| session.base_commit.clone());
    let range = format!("{target}..{}", session.branch);
    let commits = git_sync(&session.repo, &["rev-list", "--reverse", &range])
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    let spec = format!("{target}...{}", session.branch);
    let files = git_sync(&session.repo, &["diff", "--name-only", &spec])
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    (commits, files)
}

/// Brings the session worktree's `HEAD` back to the run's branch when a step moved it off
/// (docs/running.md, "Commits off the run's branch"), whether the run succeeded or not (a
/// resumed run goes on there). When `HEAD` descends from the branch, the branch moves to
/// `HEAD` and the worktree goes back on it without touching a file. Otherwise a detached
/// `HEAD` gets a branch of its own, so that no commit loses its only reference when the
/// worktree is removed. `None` when `HEAD` is on the run's branch, or on the same commit
/// (then it is put back on the branch too).
///
/// # Errors
///
/// When git cannot read or move `HEAD` or the branch.
pub async fn follow_head(session: &SessionWorktree) -> Result<Option<OffBranch>, WorktreeError> {
    let path = &session.path;
    let own = format!("refs/heads/{}", session.branch);
    let on = git(path, &["symbolic-ref", "-q", "HEAD"])
        .await
        .ok()
        .map(|r| r.trim().to_owned());
    if on.as_deref() == Some(own.as_str()) {
        return Ok(None);
    }
    let head = on
        .as_deref()
        .map(|r| r.strip_prefix("refs/heads/").unwrap_or(r).to_owned());
    let at = git(path, &["rev-parse", "HEAD"]).await?.trim().to_owned();
    let tip = git(path, &["rev-parse", &own]).await?.trim().to_owned();
    let descends = at == tip
        || git(path, &["merge-base", "--is-ancestor", &tip, &at])
            .await
            .is_ok();
    if descends {
        let commits = git(path, &["rev-list", "--count", &format!("{tip}..{at}")])
            .await?
            .trim()
            .parse()
            .unwrap_or(0);
        let reason = "prodigy: the run's commits, off its branch";
        git(path, &["update-ref", "-m", reason, &own, &at, &tip]).await?;
        git(path, &["symbolic-ref", "-m", reason, "HEAD", &own]).await?;
        return Ok((at != tip).then_some(OffBranch::Followed {
            head,
            branch: session.branch.clone(),
            commits,
        }));
    }
    let kept = if let Some(branch) = &head {
        branch.clone()
    } else {
        keep_detached(path, &session.branch, &at).await?
    };
    Ok(Some(OffBranch::Diverged {
        head,
        branch: session.branch.clone(),
        kept,
    }))
}

/// Gives the detached `HEAD` at AT of the worktree PATH a branch of its own, named after the
/// run's BRANCH (`BRANCH-detached`, `-detached-2`, …), and puts the worktree on it: asked
/// again (a resumed run), it is the same branch, not another. Returns its name.
pub(crate) async fn keep_detached(
    path: &Path,
    branch: &str,
    at: &str,
) -> Result<String, WorktreeError> {
    let mut n = 1;
    loop {
        let name = if n == 1 {
            format!("{branch}-detached")
        } else {
            format!("{branch}-detached-{n}")
        };
        match git(path, &["branch", "--no-track", &name, at]).await {
            Ok(_) => {
                let on = format!("refs/heads/{name}");
                git(path, &["symbolic-ref", "HEAD", &on]).await?;
                return Ok(name);
            }
            Err(e) if n >= 100 => return Err(e),
            Err(_) => n += 1,
        }
    }
}

/// Whether a run's session branch still waits to be merged into the branch it started from:
/// it exists and that branch does not contain it (a run started on a detached HEAD has
/// nothing to merge into).
pub fn pending_merge(session: &SessionWorktree) -> bool {
    session.target_branch.is_some()
        && git_sync(
            &session.repo,
            &[
                "rev-parse",
                "-q",
                "--verify",
                &format!("refs/heads/{}", session.branch),
            ],
        )
        .is_some()
        && !merged(session)
}

/// Whether the session branch is merged into its target branch.
pub fn merged(session: &SessionWorktree) -> bool {
    let Some(target) = &session.target_branch else {
        return false;
    };
    git_sync(
        &session.repo,
        &["merge-base", "--is-ancestor", &session.branch, target],
    )
    .is_some()
}

/// Merges the session branch into its target in the user's checkout (`git merge --no-ff`).
/// Refuses when the checkout has another branch out, so nothing else is touched.
pub async fn merge_session(session: &SessionWorktree) -> Result<(), WorktreeError> {
    let Some(target) = &session.target_branch else {
        return Err(WorktreeError::Git {
            args: "merge".into(),
            stderr: "the run started on a detached HEAD: there is no branch to merge into".into(),
        });
    };
    let current = current_branch(&session.repo);
    if current.as_deref() != Some(target.as_str()) {
        return Err(WorktreeError::Git {
            args: "merge".into(),
            stderr: format!(
                "`{}` has `{}` checked out, not `{target}`, the branch the run started from",
                session.repo.display(),
                current.as_deref().unwrap_or("a detached HEAD")
            ),
        });
    }
    // A merge that would conflict is refused before it starts: the user's checkout is never
    // left half-merged.
    let (code, out, _) = git_output(
        &session.repo,
        &[
            "merge-tree",
            "--write-tree",
            "--name-only",
            target,
            &session.branch,
        ],
    )
    .await?;
    if code == Some(1) {
        return Err(WorktreeError::Conflict {
            branch: session.branch.clone(),
            files: conflict(&out).0,
            output: format!("`{target}` changed since the run started"),
        });
    }
    let message = format!("Merge {} (prodigy)", session.branch);
    let merged = git(
        &session.repo,
        &["merge", "-q", "--no-ff", "-m", &message, &session.branch],
    )
    .await;
    if merged.is_err()
        && git(
            &session.repo,
            &["rev-parse", "-q", "--verify", "MERGE_HEAD"],
        )
        .await
        .is_ok()
    {
        let _ = git(&session.repo, &["merge", "--abort"]).await;
    }
    merged.map(|_| ())
}

/// The first step that must commit (`commit_required` on the step, its `on_failure`
/// handler or its `on_incomplete`), by label: a run outside a git repository refuses it.
pub fn commit_required_step(plan: &Plan) -> Option<&str> {
    plan.steps
        .iter()
        .find(|s| {
            s.commit_required
                || s.on_failure.as_ref().is_some_and(|h| h.commit_required)
                || s.validate
                    .as_ref()
                    .and_then(|v| v.on_incomplete.as_ref())
                    .is_some_and(|o| o.commit_required)
        })
        .map(|s| s.label.as_str())
}

/// How bringing a session back went. The worktree and its branch are removed, unless the
/// run left uncommitted changes in it (`left`): those are never merged, and never thrown
/// away either.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MergeBack {
    /// The run made no commit: nothing was merged.
    Nothing {
        /// Uncommitted changes left in the worktree, which is then kept.
        left: usize,
    },
    /// The session branch is merged into TARGET.
    Merged {
        /// Commits brought in.
        commits: usize,
        /// The branch merged into.
        target: String,
        /// Uncommitted changes left in the worktree, which is then kept.
        left: usize,
    },
}

/// Why bringing the session back failed ([`crate::runner::Runner::merge_session`]).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum MergeBackError {
    /// The run started on a detached HEAD.
    #[error("the run started on a detached HEAD: there is no branch to merge into")]
    DetachedHead,
    /// Git failed: locking the target branch, or merging.
    #[error(transparent)]
    Git(#[from] WorktreeError),
    /// The `merge` steps ran past their `timeout`.
    #[error(
        "the `merge` steps took longer than their timeout ({})",
        humantime::format_duration(*timeout)
    )]
    TimedOut {
        /// The `merge.timeout`.
        timeout: Duration,
    },
    /// The run was interrupted during the `merge` steps.
    #[error("the `merge` steps were interrupted")]
    Interrupted,
    /// A `merge` step failed.
    #[error("a `merge` step failed")]
    StepFailed,
    /// The `merge` steps ended without merging the session branch.
    #[error("the `merge` steps finished, but `{branch}` is not merged into `{target}`")]
    NotMerged {
        /// The session branch.
        branch: String,
        /// The branch it should be merged into.
        target: String,
    },
    /// The merge conflicted and `merge.on_conflict` did not resolve it.
    #[error("merging `{branch}` back conflicts in {}, and {source}", files.join(", "))]
    Unresolved {
        /// The session branch.
        branch: String,
        /// The conflicting paths.
        files: Vec<String>,
        /// Why the resolver did not resolve it.
        source: ResolveError,
    },
}

/// Why `merge.on_conflict` did not resolve a conflicted merge, with what its last step
/// printed ([`crate::runner::Runner::resolve_conflict`]).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("{failure}{}", printed(log))]
pub struct ResolveError {
    /// What went wrong.
    pub failure: ResolveFailure,
    /// What the last step printed (empty when none ran or it printed nothing).
    pub log: String,
}

/// `; the last step printed:` and LOG, unless LOG is blank.
pub(crate) fn printed(log: &str) -> String {
    if log.trim().is_empty() {
        String::new()
    } else {
        format!("; the last step printed:\n{}", log.trim_end())
    }
}

/// What went wrong in resolving a conflicted merge.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ResolveFailure {
    /// The workflow has no `merge.on_conflict` steps.
    #[error("no `merge.on_conflict` steps")]
    NoSteps,
    /// Git failed around the steps.
    #[error(transparent)]
    Git(#[from] WorktreeError),
    /// The steps ran past the merge's `timeout`.
    #[error(
        "the `merge.on_conflict` steps took longer than the merge's timeout ({})",
        humantime::format_duration(*timeout)
    )]
    TimedOut {
        /// The `merge.timeout`.
        timeout: Duration,
    },
    /// The run was interrupted during the steps.
    #[error("the `merge.on_conflict` steps were interrupted")]
    Interrupted,
    /// A step failed.
    #[error("a `merge.on_conflict` step failed")]
    StepFailed,
    /// The steps ended, but the merge is not resolved.
    #[error("the `merge.on_conflict` steps ended, but {0}")]
    Unresolved(#[source] Unresolved),
    /// An agent's resolved merge left no commit to merge.
    #[error("the resolved merge left no commit")]
    NoCommit,
}

impl From<ResolveFailure> for ResolveError {
    fn from(failure: ResolveFailure) -> Self {
        ResolveError {
            failure,
            log: String::new(),
        }
    }
}

impl From<WorktreeError> for ResolveError {
    fn from(e: WorktreeError) -> Self {
        ResolveFailure::Git(e).into()
    }
}

/// Why a worktree does not hold a resolved merge ([`merge_resolved`]).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum Unresolved {
    /// The merge is still in progress (`MERGE_HEAD` exists).
    #[error("the merge is not committed")]
    NotCommitted,
    /// Files are still unmerged.
    #[error("{} still unmerged", files.join(", "))]
    StillUnmerged {
        /// The unmerged paths.
        files: Vec<String>,
    },
    /// Git failed while checking.
    #[error(transparent)]
    Git(#[from] WorktreeError),
    /// The merged work is not an ancestor of `HEAD`.
    #[error("the merged work is not in the branch's history")]
    NotInHistory,
}

/// A merge that conflicted, for the `merge.on_conflict` steps.
pub(crate) struct Conflicted<'a> {
    /// The worktree that receives the merge.
    pub dir: &'a Path,
    /// What is merged into it: a commit or a branch.
    pub other: &'a str,
    /// `${merge.source_branch}`: the branch whose work is being merged.
    pub source_branch: &'a str,
    /// `${merge.target_branch}`: the branch it is merged into.
    pub target_branch: &'a str,
    /// The map item whose work it is, when it is an agent's.
    pub item: Option<usize>,
    /// Where the steps run (the worktree, under the project's prefix).
    pub workdir: Option<PathBuf>,
}

/// How the `merge` or `merge.on_conflict` steps ended.
pub(crate) enum PhaseEnd {
    Completed,
    StepFailed,
    TimedOut,
    Interrupted,
}

/// `${merge.*}` for the `merge` steps: the session's branch and worktree, TARGET, and the
/// COMMITS and FILES merging it back brings.
pub(crate) fn set_merge_vars(
    vars: &mut Vars,
    session: &SessionWorktree,
    target: &str,
    session_id: &str,
    commits: &[String],
    files: &[String],
) {
    let short: Vec<String> = commits
        .iter()
        .map(|c| c.chars().take(7).collect())
        .collect();
    vars.set(
        "merge",
        json!({
            "worktree": session.path,
            "source_branch": session.branch,
            "target_branch": target,
            "session_id": session_id,
            "commits": commits,
            "commit_count": commits.len(),
            "commit_ids": short.join(","),
            "file_list": files.join(","),
            "file_count": files.len(),
            "modified_files": files,
        }),
    );
}
