//! Spare worktrees (`worktree.persist`, docs/language.md §11): a job's worktrees kept when
//! it ends, cleaned and detached from their branches, under `worktrees/{repo}/spare-N`, for
//! the next job of the repository to take instead of checking out the whole tree again.

use std::path::{Path, PathBuf};

use super::{Layout, WorktreeError, admin, git, remove};

/// Removes everything untracked or ignored from the worktree at PATH, except the ignored
/// paths KEEP names (gitignore patterns).
pub(super) async fn clean(path: &Path, keep: &[String]) -> Result<(), WorktreeError> {
    clean_only(path, keep, None).await
}

/// [`clean`], of only what the pathspecs ONLY name when there are some (and then nothing
/// when it names nothing).
pub(super) async fn clean_only(
    path: &Path,
    keep: &[String],
    only: Option<&[String]>,
) -> Result<(), WorktreeError> {
    let mut args = vec!["clean", "-ffdxq"];
    for pattern in keep {
        args.extend(["-e", pattern.as_str()]);
    }
    if let Some(only) = only {
        if only.is_empty() {
            return Ok(());
        }
        args.push("--");
        args.extend(only.iter().map(String::as_str));
    }
    git(path, &args).await.map(|_| ())
}

/// Keeps the worktree at PATH of REPO as a spare: cleaned (except what KEEP names),
/// detached from its branch (which the caller deletes), and moved to the first free
/// [`Layout::spare_worktree`]. False when any of it fails: the caller removes it then.
pub(super) async fn park(layout: &Layout, repo: &Path, path: &Path, keep: &[String]) -> bool {
    if clean(path, keep).await.is_err() {
        return false;
    }
    let Some(head) = crate::worktree::facts::head(path).await else {
        return false;
    };
    if git(path, &["update-ref", "--no-deref", "HEAD", &head])
        .await
        .is_err()
    {
        return false;
    }
    let Ok(_admin) = admin(repo).await else {
        return false;
    };
    let Some(target) = (0..10_000)
        .map(|n| layout.spare_worktree(n))
        .find(|p| !p.exists())
    else {
        return false;
    };
    let (from, to) = (path.to_string_lossy(), target.to_string_lossy());
    git(repo, &["worktree", "move", &from, &to]).await.is_ok()
}

/// [`park`]s the worktree at PATH and deletes its BRANCH, else [`remove`]s both; true when
/// it was kept.
pub(crate) async fn park_or_remove(
    layout: &Layout,
    repo: &Path,
    path: &Path,
    branch: &str,
    keep: &[String],
) -> bool {
    if park(layout, repo, path, keep).await {
        let _admin = admin(repo).await;
        let _ = super::git_retrying(repo, &["branch", "-D", "-q", branch]).await;
        true
    } else {
        remove(repo, path, branch).await;
        false
    }
}

/// Takes a spare of REPO, if there is one: moved (under the worktree administration lock)
/// to the path TARGET gives, its tracked files put back to its commit, cleaned except what
/// KEEP names, and its `worktree.setup` marker removed (this job's workflow prepares it
/// afresh). It is still detached: the caller puts it on its branch. `None` when there is no
/// spare, or the one taken could not be readied (it is removed).
pub(super) async fn take(
    layout: &Layout,
    repo: &Path,
    keep: &[String],
    target: impl FnOnce() -> PathBuf,
) -> Option<PathBuf> {
    let mut spares: Vec<PathBuf> = std::fs::read_dir(layout.worktrees_dir())
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| Layout::is_spare(p) && p.join(".git").is_file())
        .collect();
    if spares.is_empty() {
        return None;
    }
    spares.sort();
    let path = {
        let _admin = admin(repo).await.ok()?;
        let path = target();
        let to = path.to_string_lossy().into_owned();
        let mut taken = None;
        // Another process may have taken one since the listing: the next is tried.
        for spare in spares.iter().filter(|s| s.exists()) {
            let from = spare.to_string_lossy();
            if git(repo, &["worktree", "move", &from, &to]).await.is_ok() {
                taken = Some(path);
                break;
            }
        }
        taken?
    };
    // As a new slot is checked out, also for a spare that was a session worktree, checked
    // out without the slots' index.
    let readied = git(&path, &super::agent::SLOT_CHECKOUT).await.is_ok()
        && clean(&path, keep).await.is_ok()
        && super::bootstrap::forget_prepared(&path).await.is_ok();
    if !readied {
        remove(repo, &path, "").await;
        return None;
    }
    Some(path)
}
