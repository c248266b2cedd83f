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
    /// The paths those lines name (untracked directories end with `/`).
    pub uncommitted_files: Vec<String>,
    /// Commits on its branch that the repository's current branch does not have (nor, for
    /// a map agent's branch, its session's branch or integration ref).
    pub unmerged_commits: usize,
}

/// The worktrees prodigy left under `$PRODIGY_HOME/worktrees/` for the repository at REPO,
/// as git lists them.
pub fn list(layout: &Layout, repo: &Path) -> Vec<Listed> {
    // Git prints resolved paths: compare with the resolved `$PRODIGY_HOME/worktrees` (any
    // repo name: the project may have been run from a subdirectory).
    let root = Layout::worktrees_root(&layout.home);
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
                let unmerged = branch.as_deref().map_or(0, |b| unmerged_commits(repo, b));
                let changed = uncommitted(&p);
                found.push(Listed {
                    uncommitted: changed.len(),
                    uncommitted_files: changed.iter().map(|l| status_path(l).to_owned()).collect(),
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

/// The path a `git status --porcelain` line names (the new one of a rename).
fn status_path(line: &str) -> &str {
    let path = line.get(3..).unwrap_or(line);
    path.rsplit(" -> ").next().unwrap_or(path).trim_matches('"')
}

/// The session or job a `prodigy-*` branch belongs to: `prodigy-ID`, or `prodigy-ID-item_N`
/// (and `-2`, ... for later attempts) for its map agents.
fn branch_owner(branch: &str) -> &str {
    let id = branch.strip_prefix("prodigy-").unwrap_or(branch);
    id.find("-item_").map_or(id, |at| &id[..at])
}

/// The commits of BRANCH that the repository's current branch does not have; for a map
/// agent's branch, nor its session's branch or integration ref, where its work is merged.
fn unmerged_commits(repo: &Path, branch: &str) -> usize {
    let mut args = vec![
        "rev-list".to_owned(),
        "--count".to_owned(),
        branch.to_owned(),
    ];
    args.push("^HEAD".to_owned());
    let owner = branch_owner(branch);
    if branch.starts_with("prodigy-") && owner.len() + "prodigy-".len() < branch.len() {
        for merged in [
            format!("refs/heads/prodigy-{owner}"),
            format!("refs/prodigy/prodigy-{owner}"),
        ] {
            if git_sync(repo, &["rev-parse", "-q", "--verify", &merged]).is_some() {
                args.push(format!("^{merged}"));
            }
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    git_sync(repo, &args)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A `prodigy-*` branch with no worktree: a session's or a map agent's, left by a run that
/// ended (or was killed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StrayBranch {
    /// The branch.
    pub branch: String,
    /// The session or job it belongs to.
    pub owner: String,
    /// Commits on it that the repository's current branch does not have (nor, for a map
    /// agent's branch, its session's branch or integration ref).
    pub unmerged_commits: usize,
}

/// The `prodigy-*` branches of the repository at REPO that no worktree has checked out.
pub fn stray_branches(repo: &Path) -> Vec<StrayBranch> {
    let checked_out: Vec<String> = git_sync(repo, &["worktree", "list", "--porcelain"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("branch refs/heads/"))
        .map(str::to_owned)
        .collect();
    let all = git_sync(
        repo,
        &[
            "for-each-ref",
            "--format=%(refname:short)",
            "refs/heads/prodigy-*",
        ],
    )
    .unwrap_or_default();
    let mut found = Vec::new();
    for branch in all.lines().filter(|b| !b.is_empty()) {
        if checked_out.iter().any(|c| c == branch) {
            continue;
        }
        found.push(StrayBranch {
            branch: branch.to_owned(),
            owner: branch_owner(branch).to_owned(),
            unmerged_commits: unmerged_commits(repo, branch),
        });
    }
    found
}

/// Deletes BRANCHES of the repository at REPO (each merged, or given up by the user);
/// returns how many went.
pub async fn delete_branches(repo: &Path, branches: &[&str]) -> usize {
    let mut deleted = 0;
    for chunk in branches.chunks(100) {
        let Ok(_admin) = admin(repo).await else {
            break;
        };
        let mut args = vec!["branch", "-D", "-q"];
        args.extend(chunk.iter().copied());
        if git_retrying(repo, &args).await.is_ok() {
            deleted += chunk.len();
        }
    }
    deleted
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
