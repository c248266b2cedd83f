//! Worktrees left under `$PRODIGY_HOME/worktrees/{repo}/`: listing them and cleaning them up.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Layout, admin, git_retrying, git_sync, uncommitted};

/// A worktree left under `$PRODIGY_HOME/worktrees/{repo}/`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Listed {
    /// Its directory.
    pub path: PathBuf,
    /// Its branch, when git knows the worktree.
    pub branch: Option<String>,
    /// `git status --short` lines.
    pub uncommitted: usize,
    /// Commits on its branch that the repository's current branch does not have.
    pub unmerged_commits: usize,
}

/// The worktrees prodigy left under `$PRODIGY_HOME/worktrees/` for the repository at REPO,
/// as git lists them.
pub fn list(layout: &Layout, repo: &Path) -> Vec<Listed> {
    // Git prints resolved paths: compare with the resolved `$PRODIGY_HOME/worktrees` (any
    // repo name: the project may have been run from a subdirectory).
    let root = layout.home.join("worktrees");
    let root = std::fs::canonicalize(&root).unwrap_or(root);
    let text = git_sync(repo, &["worktree", "list", "--porcelain"]).unwrap_or_default();
    let mut found = Vec::new();
    let mut path: Option<PathBuf> = None;
    let mut branch: Option<String> = None;
    for line in text.lines().chain(std::iter::once("")) {
        if let Some(p) = line.strip_prefix("worktree ") {
            path = Some(PathBuf::from(p));
        } else if let Some(b) = line.strip_prefix("branch ") {
            branch = Some(b.trim_start_matches("refs/heads/").to_owned());
        } else if line.is_empty() {
            if let Some(p) = path.take()
                && p.starts_with(&root)
            {
                let unmerged = branch.as_deref().map_or(0, |b| {
                    git_sync(repo, &["rev-list", "--count", &format!("HEAD..{b}")])
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0)
                });
                found.push(Listed {
                    uncommitted: uncommitted(&p).len(),
                    unmerged_commits: unmerged,
                    branch: branch.take(),
                    path: p,
                });
            }
            branch = None;
        }
    }
    found
}

/// The session or job a worktree under `worktrees/{repo}/` belongs to: its directory's
/// name, without the `-agent-N` of an agent's worktree.
pub fn owner(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match name.rfind("-agent-") {
        Some(at) => name[..at].to_owned(),
        None => name,
    }
}

/// What `prodigy worktree clean` did with one worktree's branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BranchFate {
    /// Deleted: everything on it is in the repository's current branch.
    Deleted,
    /// Kept: it has commits the current branch does not have.
    Kept(usize),
    /// The worktree had no branch.
    None,
}

/// Removes a worktree left under `worktrees/{repo}/` (with its uncommitted changes); its
/// branch goes too when it is merged into the repository's current branch, else it stays.
pub async fn clean(repo: &Path, found: &Listed) -> BranchFate {
    {
        let _admin = admin(repo).await;
        let target = found.path.to_string_lossy().into_owned();
        let _ = git_retrying(repo, &["worktree", "remove", "--force", &target]).await;
        let _ = std::fs::remove_dir_all(&found.path);
        let _ = git_retrying(repo, &["worktree", "prune"]).await;
    }
    let Some(branch) = &found.branch else {
        return BranchFate::None;
    };
    if found.unmerged_commits > 0 {
        return BranchFate::Kept(found.unmerged_commits);
    }
    let _admin = admin(repo).await;
    match git_retrying(repo, &["branch", "-D", "-q", branch]).await {
        Ok(_) => BranchFate::Deleted,
        Err(_) => BranchFate::None,
    }
}
