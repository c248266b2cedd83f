//! Git worktree isolation (docs/language.md §11): a run works in a session worktree on its own branch,
//! every map agent in a worktree branched from it, and the agents' commits come back one at
//! a time.
//!
//! Everything goes through the `git` command. Operations that change the repository's
//! shared administrative state (adding and removing worktrees, deleting branches) are
//! serialised: inside the process by one async lock, across processes by an advisory lock
//! on a file in the repository's git directory; merges into a session worktree are
//! serialised by the merge queue of their job, and merges back into one branch across
//! processes by a lock file per branch there too ([`lock_branch`]). Concurrent `git worktree
//! add` calls race on the repository's lock files, which is how upstream loses items at high
//! parallelism.

use std::path::{Path, PathBuf};

use crate::layout::Layout;

pub(crate) mod command;
pub use command::*;

/// How an agent's commits came back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merged {
    /// The agent made no commit: nothing to merge.
    Nothing,
    /// The session branch had not moved: fast-forwarded.
    FastForward,
    /// A merge commit (`--no-ff`).
    MergeCommit,
}

/// The repository PROJECT is in: its top level and PROJECT's path inside it; `None` outside
/// a repository or before its first commit (there is nothing to branch from).
pub fn repository(project: &Path) -> Option<(PathBuf, PathBuf)> {
    let top = git_sync(project, &["rev-parse", "--show-toplevel"])?;
    git_sync(project, &["rev-parse", "--verify", "-q", "HEAD"])?;
    let prefix = git_sync(project, &["rev-parse", "--show-prefix"]).unwrap_or_default();
    Some((PathBuf::from(top), PathBuf::from(prefix)))
}

/// The uncommitted changes of the working tree at DIR, one `git status --short` line each.
pub fn uncommitted(dir: &Path) -> Vec<String> {
    git_sync(dir, &["status", "--porcelain"])
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// How many ignored paths (build output and the like; a directory counts once) the working
/// tree at DIR holds.
pub fn ignored(dir: &Path) -> usize {
    git_sync(dir, &["status", "--porcelain", "--ignored"])
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("!!"))
        .count()
}

/// [`uncommitted`], without blocking the runtime.
pub async fn changes(dir: &Path) -> Vec<String> {
    git(dir, &["status", "--porcelain"])
        .await
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// What the working tree at TOP holds that no commit does: what `git status` shows
/// (new, changed and ignored paths; a new directory once) and empty directories, which git
/// never keeps. At most 10 000 directories are looked into.
pub async fn not_committed(top: &Path) -> Vec<Uncommitted> {
    let status = git(top, &["status", "--porcelain", "--ignored"])
        .await
        .unwrap_or_default();
    let mut found: Vec<Uncommitted> = status
        .lines()
        .filter(|l| l.len() > 3)
        .map(|l| {
            let path = &l[3..];
            // A rename shows as `old -> new`: the new path is the one in the tree.
            let path = path.rsplit(" -> ").next().unwrap_or(path);
            Uncommitted {
                path: path.trim_matches('"').to_owned(),
                kind: if l.starts_with("!!") {
                    UncommittedKind::Ignored
                } else {
                    UncommittedKind::Changed
                },
            }
        })
        .collect();
    let listed: std::collections::HashSet<PathBuf> =
        found.iter().map(|u| top.join(&u.path)).collect();
    let mut dirs = vec![top.to_path_buf()];
    let mut budget = 10_000usize;
    while let Some(dir) = dirs.pop() {
        if budget == 0 {
            break;
        }
        budget -= 1;
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut empty = true;
        for entry in entries.flatten() {
            empty = false;
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            // `.git` is git's, and what git status named is reported already.
            if is_dir && entry.file_name() != ".git" && !listed.contains(&path) {
                dirs.push(path);
            }
        }
        if empty && dir != top {
            let relative = dir.strip_prefix(top).unwrap_or(&dir);
            found.push(Uncommitted {
                path: format!("{}/", relative.display()),
                kind: UncommittedKind::EmptyDir,
            });
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    found
}

/// The branch checked out at DIR (`None` on a detached HEAD).
pub fn current_branch(dir: &Path) -> Option<String> {
    git_sync(dir, &["symbolic-ref", "-q", "--short", "HEAD"]).filter(|b| !b.is_empty())
}

/// The in-process half of the lock around worktree administration: one for the process
/// (a run works on one repository).
static ADMIN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Holds the worktree administration lock: the process's, and the repository's file lock.
struct Admin {
    _guard: tokio::sync::MutexGuard<'static, ()>,
    _file: std::fs::File,
}

async fn admin(repo: &Path) -> Result<Admin, WorktreeError> {
    let guard = ADMIN.lock().await;
    // Another prodigy process may hold it for the length of one git command.
    let file = lock_file(
        &common_dir(repo)
            .await?
            .join(crate::layout::WORKTREE_ADMIN_LOCK),
    )
    .await?;
    Ok(Admin {
        _guard: guard,
        _file: file,
    })
}

/// The repository's common git directory: every process working on the repository (from
/// any worktree or directory, with any `PRODIGY_HOME`) finds the same lock files there.
async fn common_dir(repo: &Path) -> Result<PathBuf, WorktreeError> {
    if repo.join(".git").is_dir() {
        return Ok(repo.join(".git"));
    }
    let dir = git(
        repo,
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
    )
    .await?;
    Ok(PathBuf::from(dir.trim()))
}

/// Takes the advisory lock on the file at PATH (made if missing), waiting for whoever
/// holds it; it is released when the file is dropped, or when its process dies.
async fn lock_file(path: &Path) -> Result<std::fs::File, WorktreeError> {
    let cannot = |source| WorktreeError::Lock {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(cannot)?;
    tokio::task::spawn_blocking(move || file.lock().map(|()| file))
        .await
        .map_err(|e| cannot(std::io::Error::other(e)))?
        .map_err(cannot)
}

/// Held while a run merges into BRANCH of a repository: merges into one branch from
/// several processes (two runs of a workflow ending together) happen one at a time, so
/// that no `git merge` starts while another's `MERGE_HEAD` is there.
#[derive(Debug)]
pub struct BranchLock {
    _file: std::fs::File,
}

/// Waits for, and takes, the lock on merges into BRANCH of the repository at REPO: the file
/// `prodigy-merge-BRANCH.lock` in its common git directory (the branch's name with every
/// byte other than a letter, digit, `-`, `_` or `.` written `%XX`).
///
/// # Errors
///
/// When the git directory cannot be found or the file cannot be made or locked.
pub async fn lock_branch(repo: &Path, branch: &str) -> Result<BranchLock, WorktreeError> {
    use std::fmt::Write as _;
    let mut name = String::new();
    for byte in branch.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.') {
            name.push(char::from(byte));
        } else {
            let _ = write!(name, "%{byte:02X}");
        }
    }
    let path = crate::layout::branch_lock(&common_dir(repo).await?, &name);
    Ok(BranchLock {
        _file: lock_file(&path).await?,
    })
}

/// Creates the session worktree of SESSION for the project at PROJECT (inside REPO at
/// PREFIX): `worktrees/{repo}/{session}` on branch `prodigy-{session}`, from HEAD.
pub async fn create_session(
    layout: &Layout,
    repo: &Path,
    prefix: &Path,
    session: &str,
) -> Result<SessionWorktree, WorktreeError> {
    let path = layout.session_worktree(session);
    // Readable by the user only, as the rest of `$PRODIGY_HOME`; if it cannot be made, git
    // says why.
    let _ = crate::durable::private_dir(&layout.worktrees_dir());
    let branch = format!("prodigy-{session}");
    let base_commit = git(repo, &["rev-parse", "HEAD"]).await?.trim().to_owned();
    // An older git checks the worktree out itself (and runs the `post-checkout` hook).
    let fills = git_version().is_some_and(|v| v >= fill::CHECK_ATTR_SOURCE);
    {
        let _admin = admin(repo).await?;
        let target = path.to_string_lossy().into_owned();
        add_on_new_branch(repo, &branch, &target, &base_commit, fills).await?;
    }
    // Checked out outside the administration lock, from the user's checkout where it holds
    // HEAD's files; then the repository's `post-checkout` hook runs as after
    // `git worktree add`, and its failure is the checkout's.
    let before = "0".repeat(base_commit.len());
    let hook = [
        "hook",
        "run",
        "--ignore-missing",
        "post-checkout",
        "--",
        &before,
        &base_commit,
        "1",
    ];
    let checked_out = async {
        if fills {
            check_out(repo, &path, &base_commit, false).await?;
            git(&path, &hook).await?;
        }
        Ok(())
    };
    if let Err(e) = checked_out.await {
        remove(repo, &path, &branch).await;
        return Err(e);
    }
    Ok(SessionWorktree {
        workdir: path.join(prefix),
        path,
        branch,
        target_branch: current_branch(repo),
        base_commit,
        repo: repo.to_owned(),
    })
}

/// [`create_session`] for a workflow with `worktree.persist`: from a spare worktree an
/// earlier job kept, when there is one ([`spare::take`], cleaned except the ignored paths
/// KEEP names), put on the new branch at HEAD (only the files that differ are written);
/// else checked out as usual.
pub async fn create_session_from_spare(
    layout: &Layout,
    repo: &Path,
    prefix: &Path,
    session: &str,
    keep: &[String],
) -> Result<SessionWorktree, WorktreeError> {
    let path = layout.session_worktree(session);
    let Some(taken) = spare::take(layout, repo, keep, || path.clone()).await else {
        return create_session(layout, repo, prefix, session).await;
    };
    let branch = format!("prodigy-{session}");
    let base_commit = git(repo, &["rev-parse", "HEAD"]).await?.trim().to_owned();
    let ready = async {
        git(&taken, &["switch", "-q", "-c", &branch]).await?;
        git(&taken, &["reset", "-q", "--keep", &base_commit]).await
    };
    if ready.await.is_err() {
        remove(repo, &taken, &branch).await;
        return create_session(layout, repo, prefix, session).await;
    }
    Ok(SessionWorktree {
        workdir: taken.join(prefix),
        path: taken,
        branch,
        target_branch: current_branch(repo),
        base_commit,
        repo: repo.to_owned(),
    })
}

/// Checks out BASE in the new worktree at PATH (made with `--no-checkout`): every file of
/// BASE the worktree SOURCE holds is copied from there, checked against its blob
/// ([`fill`]), the rest checked out (or the whole tree, when it cannot be filled). SLOT: a
/// pool's slot, whose index is set up as [`agent::SLOT_CHECKOUT`] says.
async fn check_out(
    source: &Path,
    path: &Path,
    base: &str,
    slot: bool,
) -> Result<(), WorktreeError> {
    let filled = {
        let (source, dest, base) = (source.to_owned(), path.to_owned(), base.to_owned());
        tokio::task::spawn_blocking(move || fill::fill(&source, &dest, &base, slot))
            .await
            .unwrap_or(false)
    };
    if filled {
        return Ok(());
    }
    let reset: &[&str] = if slot {
        &agent::SLOT_CHECKOUT
    } else {
        &["reset", "--hard", "--no-recurse-submodules", "--quiet"]
    };
    git(path, reset).await.map(drop)
}

/// `git worktree add -b BRANCH TARGET BASE`. Git makes the branch before the worktree: when
/// the worktree cannot be made (TARGET exists, the disk is full), the branch it made is
/// deleted again, so that a failed attempt leaves no stray `prodigy-*` branch. A branch that
/// existed before is never touched.
async fn add_on_new_branch(
    repo: &Path,
    branch: &str,
    target: &str,
    base: &str,
    no_checkout: bool,
) -> Result<String, WorktreeError> {
    let exists = async || {
        let name = format!("refs/heads/{branch}");
        git(repo, &["rev-parse", "-q", "--verify", &name])
            .await
            .is_ok()
    };
    let existed = exists().await;
    let mut args = vec!["worktree", "add", "-q"];
    if no_checkout {
        args.push("--no-checkout");
    }
    args.extend(["-b", branch, target, base]);
    let added = git_retrying(repo, &args).await;
    if added.is_err() && !existed && exists().await {
        let _ = git(repo, &["branch", "-D", "-q", branch]).await;
    }
    added
}

/// Removes the worktree at PATH (with whatever it holds) and deletes BRANCH (none when
/// empty: a detached worktree); missing ones are not an error.
pub async fn remove(repo: &Path, path: &Path, branch: &str) {
    // The files go first, outside the administration lock: in a big repository deleting a
    // whole checkout takes a while, and the slots of a pool are removed side by side.
    let files = path.to_owned();
    let _ = tokio::task::spawn_blocking(move || empty_worktree(&files)).await;
    let _admin = admin(repo).await;
    let target = path.to_string_lossy().into_owned();
    // A repository's own checkout (its `.git` a directory) is never deleted, whatever PATH
    // a caller passes; git refuses to remove it too.
    let own_checkout = std::fs::symlink_metadata(path.join(".git")).is_ok_and(|m| m.is_dir());
    if path.exists() && !own_checkout {
        let _ = git_retrying(repo, &["worktree", "remove", "--force", &target]).await;
        let _ = std::fs::remove_dir_all(path);
    }
    let _ = git_retrying(repo, &["worktree", "prune"]).await;
    if !branch.is_empty() {
        let _ = git_retrying(repo, &["branch", "-D", "-q", branch]).await;
    }
}

/// Deletes what the worktree at PATH holds except its `.git` file, which git's own removal
/// needs. Only a linked worktree (whose `.git` is a file) is emptied: never a repository's
/// own checkout, whatever PATH a caller passes.
fn empty_worktree(path: &Path) {
    if !std::fs::symlink_metadata(path.join(".git")).is_ok_and(|m| m.is_file()) {
        return;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name() == ".git" {
            continue;
        }
        let _ = if entry.file_type().is_ok_and(|t| t.is_dir()) {
            std::fs::remove_dir_all(entry.path())
        } else {
            std::fs::remove_file(entry.path())
        };
    }
}

/// The session worktree SAVED by a checkpoint, ready to work in again: as it is when it is
/// still there; put back on its branch when only the directory is gone; else a new one from
/// HEAD (its branch was merged and removed). The flag says whether it had to be recreated.
pub async fn reopen(saved: &SessionWorktree) -> Result<(SessionWorktree, bool), WorktreeError> {
    if saved.path.is_dir() {
        return Ok((saved.clone(), false));
    }
    let target = saved.path.to_string_lossy().into_owned();
    let _admin = admin(&saved.repo).await?;
    let _ = git(&saved.repo, &["worktree", "prune"]).await;
    let branch_exists = git(&saved.repo, &["rev-parse", "-q", "--verify", &saved.branch])
        .await
        .is_ok();
    if branch_exists {
        git_retrying(
            &saved.repo,
            &["worktree", "add", "-q", &target, &saved.branch],
        )
        .await?;
        return Ok((saved.clone(), true));
    }
    let base_commit = git(&saved.repo, &["rev-parse", "HEAD"])
        .await?
        .trim()
        .to_owned();
    add_on_new_branch(&saved.repo, &saved.branch, &target, &base_commit, false).await?;
    Ok((
        SessionWorktree {
            base_commit,
            target_branch: current_branch(&saved.repo),
            ..saved.clone()
        },
        true,
    ))
}

mod agent;
pub mod bootstrap;
pub mod candidate;
pub mod facts;
mod fill;
mod list;
pub(crate) mod merge;
pub mod records;
pub(crate) mod refs;
pub(crate) mod spare;
mod stamps;
mod watch;

pub use agent::*;
pub use list::*;
pub use merge::*;
pub use records::{
    AgentWorktree, BranchesLeft, OffBranch, Readied, SessionWorktree, Uncommitted, UncommittedKind,
};
pub(crate) use refs::head_from_files;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn repo() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for args in [
            &["init", "-q", "-b", "main"][..],
            &["config", "user.email", "t@example.invalid"],
            &["config", "user.name", "t"],
            &["commit", "-q", "--allow-empty", "-m", "base"],
        ] {
            assert!(git_sync(dir.path(), args).is_some(), "git {args:?}");
        }
        dir
    }

    fn layout(home: &Path) -> Layout {
        Layout {
            home: home.to_owned(),
            repo: "demo".into(),
        }
    }

    fn commit_file(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
        git_sync(dir, &["add", name]).unwrap();
        git_sync(dir, &["commit", "-q", "-m", name]).unwrap();
    }

    /// `remove` deletes a worktree's files before git's removal, so it must never touch a
    /// repository's own checkout: given one, it deletes nothing, neither file nor branch
    /// checked out there; a linked worktree goes with its files and branch.
    #[tokio::test]
    async fn remove_never_empties_a_repositorys_own_checkout() {
        let project = repo();
        commit_file(project.path(), "kept.txt", "mine");
        std::fs::write(project.path().join("untracked.txt"), "mine too").unwrap();
        remove(project.path(), project.path(), "main").await;
        assert!(project.path().join("kept.txt").is_file());
        assert!(project.path().join("untracked.txt").is_file());
        let linked = project.path().join("linked");
        let target = linked.to_string_lossy().into_owned();
        git_sync(
            project.path(),
            &["worktree", "add", "-q", "-b", "side", &target],
        )
        .unwrap();
        assert!(linked.join("kept.txt").is_file());
        remove(project.path(), &linked, "side").await;
        assert!(!linked.exists());
        let branches = git_sync(project.path(), &["branch", "--format=%(refname:short)"]).unwrap();
        assert_eq!(branches.trim(), "main");
    }

    /// Git makes the branch before the worktree: a worktree that cannot be made left its
    /// `prodigy-*` branch behind.
    #[tokio::test]
    async fn a_worktree_that_cannot_be_made_leaves_no_branch() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        // Something already where the worktree goes.
        std::fs::create_dir_all(layout.worktrees_dir()).unwrap();
        std::fs::write(layout.worktrees_dir().join("s1"), "in the way").unwrap();
        let err = create_session(&layout, &top, &prefix, "s1")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("already exists"), "{err}");
        let branches = git_sync(&top, &["branch", "--format=%(refname:short)"]).unwrap();
        assert_eq!(branches.trim(), "main");
        // A branch that was there before is left alone.
        git_sync(&top, &["branch", "prodigy-s1"]).unwrap();
        create_session(&layout, &top, &prefix, "s1")
            .await
            .unwrap_err();
        let branches = git_sync(&top, &["branch", "--format=%(refname:short)"]).unwrap();
        assert_eq!(branches.trim(), "main\nprodigy-s1");
    }

    /// The session worktree is filled from the user's checkout, not checked out by
    /// `git worktree add`: what the user changed and did not commit stays out of it, and the
    /// repository's `post-checkout` hook still runs there as after `git worktree add` (a
    /// failing hook fails the run, and leaves neither worktree nor branch).
    #[tokio::test]
    async fn a_session_worktree_holds_head_and_the_post_checkout_hook_ran_in_it() {
        let project = repo();
        commit_file(project.path(), "kept.txt", "committed\n");
        std::fs::write(project.path().join("kept.txt"), "edited\n").unwrap();
        std::fs::write(project.path().join("mine.txt"), "untracked\n").unwrap();
        let hook = project.path().join(".git/hooks/post-checkout");
        std::fs::write(&hook, "#!/bin/sh\necho \"$@\" > hook-ran\n").unwrap();
        std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        let session = create_session(&layout, &top, &prefix, "s1").await.unwrap();
        let read = |name: &str| std::fs::read_to_string(session.path.join(name)).unwrap();
        assert_eq!(read("kept.txt"), "committed\n");
        assert!(!session.path.join("mine.txt").exists());
        let zero = "0".repeat(session.base_commit.len());
        assert_eq!(
            read("hook-ran"),
            format!("{zero} {} 1\n", session.base_commit)
        );
        assert_eq!(
            git_sync(&session.path, &["status", "--porcelain"]).unwrap(),
            "?? hook-ran"
        );
        std::fs::write(&hook, "#!/bin/sh\necho refused >&2\nexit 3\n").unwrap();
        let err = create_session(&layout, &top, &prefix, "s2")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("refused"), "{err}");
        assert!(!layout.session_worktree("s2").exists());
        let branches = git_sync(&top, &["branch", "--format=%(refname:short)"]).unwrap();
        assert_eq!(branches.trim(), "main\nprodigy-s1");
    }

    #[tokio::test]
    async fn agents_merge_back_and_a_conflict_leaves_the_session_clean() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        let session = create_session(&layout, &top, &prefix, "s1").await.unwrap();
        assert_eq!(session.branch, "prodigy-s1");
        assert_eq!(session.target_branch.as_deref(), Some("main"));
        let pool = Pool::default();
        let a = create_agent(&layout, &session, &pool, "item_0")
            .await
            .unwrap();
        let b = create_agent(&layout, &session, &pool, "item_1")
            .await
            .unwrap();
        let c = create_agent(&layout, &session, &pool, "item_2")
            .await
            .unwrap();
        let idle = create_agent(&layout, &session, &pool, "item_3")
            .await
            .unwrap();
        commit_file(&a.path, "same.txt", "a\n");
        commit_file(&b.path, "other.txt", "b\n");
        commit_file(&c.path, "same.txt", "c\n");
        let merge = |agent: AgentWorktree| {
            let session = session.clone();
            let pool = &pool;
            async move { merge_agent(&session, pool, &agent, "merge").await }
        };
        assert_eq!(merge(a).await.unwrap(), Merged::FastForward);
        assert_eq!(merge(b).await.unwrap(), Merged::MergeCommit);
        let Err(WorktreeError::Conflict { files, .. }) = merge(c).await else {
            panic!("expected a conflict");
        };
        assert_eq!(files, ["same.txt"]);
        assert!(
            uncommitted(&session.path).is_empty(),
            "the session is clean"
        );
        assert_eq!(merge(idle.clone()).await.unwrap(), Merged::Nothing);
        assert!(
            !session.path.join("other.txt").exists(),
            "not until the map ends"
        );
        finish_map(&session).await.unwrap();
        assert!(session.path.join("other.txt").exists());
        remove(&top, &idle.path, &idle.branch).await;
        assert!(!idle.path.exists());
        let (commits, files) = session_changes(&session);
        assert_eq!(commits.len(), 3, "two agent commits and one merge");
        assert_eq!(files, ["other.txt", "same.txt"]);
        assert!(!merged(&session));
        merge_session(&session).await.unwrap();
        assert!(merged(&session));
        assert!(project.path().join("other.txt").exists());
    }

    #[tokio::test]
    async fn an_agent_worktree_left_by_a_kill_is_left_alone() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        let session = create_session(&layout, &top, &prefix, "s2").await.unwrap();
        let first = create_agent(&layout, &session, &Pool::default(), "item_0")
            .await
            .unwrap();
        commit_file(&first.path, "half.txt", "x\n");
        // A new process (a resume) starts with an empty pool; what the first left stays.
        let again = create_agent(&layout, &session, &Pool::default(), "item_0")
            .await
            .unwrap();
        assert_ne!(again.path, first.path);
        assert_eq!(again.branch, "prodigy-s2-item_0-2");
        assert!(!again.path.join("half.txt").exists());
        assert_eq!(agent_head(&again).await.unwrap(), None);
        assert!(first.path.join("half.txt").is_file());
    }

    #[tokio::test]
    async fn a_reused_worktree_keeps_nothing_of_the_last_agent() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        let session = create_session(&layout, &top, &prefix, "s3").await.unwrap();
        let pool = Pool::default();
        let first = create_agent(&layout, &session, &pool, "item_0")
            .await
            .unwrap();
        commit_file(&first.path, "kept.txt", "x\n");
        std::fs::write(first.path.join("untracked.txt"), "junk").unwrap();
        merge_agent(&session, &pool, &first, "merge").await.unwrap();
        let path = first.path.clone();
        pool.release(first);
        let second = create_agent(&layout, &session, &pool, "item_1")
            .await
            .unwrap();
        assert_eq!(second.path, path, "the worktree is reused");
        assert_eq!(second.branch, "prodigy-s3-item_1");
        assert!(
            second.path.join("kept.txt").is_file(),
            "merged work is in the base"
        );
        assert!(!second.path.join("untracked.txt").exists());
        pool.release(second);
        pool.drain(&top).await;
        assert!(!path.exists());
        let branches = git_sync(&top, &["branch", "--format=%(refname:short)"]).unwrap();
        assert_eq!(branches, "main\nprodigy-s3");
    }

    /// A slot that cannot move to the base (a tracked file the base changes was changed in
    /// it) is replaced by a new worktree on the item's branch; the move's half-made branch
    /// and the old worktree are gone, and the new one holds the base.
    #[tokio::test]
    async fn a_slot_that_cannot_move_is_replaced_by_a_new_worktree() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        let session = create_session(&layout, &top, &prefix, "s7").await.unwrap();
        let pool = Pool::default();
        let first = create_agent(&layout, &session, &pool, "item_0")
            .await
            .unwrap();
        commit_file(&first.path, "x.txt", "1\n");
        merge_agent(&session, &pool, &first, "merge").await.unwrap();
        let second = create_agent(&layout, &session, &pool, "item_1")
            .await
            .unwrap();
        commit_file(&second.path, "x.txt", "2\n");
        merge_agent(&session, &pool, &second, "merge")
            .await
            .unwrap();
        std::fs::write(first.path.join("x.txt"), "changed here").unwrap();
        let old = first.path.clone();
        pool.release(first);
        let third = create_agent(&layout, &session, &pool, "item_2")
            .await
            .unwrap();
        assert_ne!(third.path, old);
        assert!(!old.exists(), "the slot that could not move is removed");
        assert_eq!(third.readied, Readied::Created);
        assert_eq!(third.branch, "prodigy-s7-item_2");
        assert_eq!(
            std::fs::read_to_string(third.path.join("x.txt")).unwrap(),
            "2\n"
        );
        let stray = git_sync(&top, &["branch", "--list", "prodigy-s7-item_2-*"]).unwrap();
        assert_eq!(stray, "");
    }

    /// A slot's worktree moves to the next item without what the last one left, ignored
    /// or not, except the ignored paths the pool is told to keep.
    #[tokio::test]
    async fn a_moved_slot_keeps_only_the_ignored_paths_it_is_told_to() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        commit_file(&top, ".gitignore", "node_modules/\nout/\n*.log\n");
        let session = create_session(&layout, &top, &prefix, "s5").await.unwrap();
        let pool = Pool::default();
        pool.keep_ignored(vec!["node_modules".into()]);
        let first = create_agent(&layout, &session, &pool, "item_0")
            .await
            .unwrap();
        assert_eq!(first.readied, Readied::Created);
        for dir in ["node_modules/dep", "out/deep", "sub/node_modules"] {
            std::fs::create_dir_all(first.path.join(dir)).unwrap();
        }
        std::fs::write(first.path.join("node_modules/dep/index.js"), "x").unwrap();
        std::fs::write(first.path.join("out/deep/secret"), "x").unwrap();
        std::fs::write(first.path.join("debug.log"), "x").unwrap();
        let path = first.path.clone();
        pool.release(first);
        let second = create_agent(&layout, &session, &pool, "item_1")
            .await
            .unwrap();
        assert_eq!(second.path, path, "the slot's worktree is reused");
        assert_eq!(second.readied, Readied::Moved);
        assert!(second.path.join("node_modules/dep/index.js").is_file());
        assert!(!second.path.join("out").exists());
        assert!(!second.path.join("debug.log").exists());
        assert!(
            second.path.join("sub/node_modules").exists(),
            "the pattern is gitignore's: `node_modules` matches at any depth"
        );
    }

    /// The clean between two items looks only where the slot's directories moved (and at
    /// what the item's commits deleted): an item that leaves an ignored file in a
    /// directory, an empty directory, a new ignored directory, and a tracked file it
    /// stopped tracking (its directory untouched) leaves none of them to the next; what it
    /// committed stays.
    #[tokio::test]
    async fn a_slot_is_cleaned_of_what_its_item_left_where_nothing_else_moved() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        commit_file(&top, ".gitignore", "*.env\n*.log\nbuild/\n");
        for dir in ["a", "c"] {
            std::fs::create_dir(top.join(dir)).unwrap();
            commit_file(&top, &format!("{dir}/tracked.txt"), "t\n");
        }
        std::fs::write(top.join("a/secret.env"), "TOKEN=1\n").unwrap();
        git_sync(&top, &["add", "-f", "a/secret.env"]).unwrap();
        git_sync(&top, &["commit", "-q", "-m", "secret"]).unwrap();
        let session = create_session(&layout, &top, &prefix, "s9").await.unwrap();
        let pool = Pool::default();
        let first = create_agent(&layout, &session, &pool, "item_0")
            .await
            .unwrap();
        // Old enough that an unmoved stamp is trusted when the slot is readied again.
        std::thread::sleep(std::time::Duration::from_millis(1_200));
        pool.release(first);
        let second = create_agent(&layout, &session, &pool, "item_1")
            .await
            .unwrap();
        assert_eq!(second.readied, Readied::Moved);
        std::thread::sleep(std::time::Duration::from_millis(1_200));
        let wt = second.path.clone();
        git_sync(&wt, &["rm", "-q", "--cached", "a/secret.env"]).unwrap();
        git_sync(&wt, &["commit", "-q", "-m", "untrack the secret"]).unwrap();
        commit_file(&wt, "c/new.txt", "n\n");
        std::fs::write(wt.join("c/run.log"), "x").unwrap();
        std::fs::create_dir(wt.join("c/empty")).unwrap();
        std::fs::create_dir_all(wt.join("build/deep")).unwrap();
        std::fs::write(wt.join("build/deep/out"), "x").unwrap();
        assert!(uncommitted(&wt).is_empty(), "{:?}", uncommitted(&wt));
        merge_agent(&session, &pool, &second, "merge")
            .await
            .unwrap();
        pool.release(second);
        let third = create_agent(&layout, &session, &pool, "item_2")
            .await
            .unwrap();
        assert_eq!(third.path, wt, "the slot's worktree is reused");
        assert!(
            third.path.join("c/new.txt").is_file(),
            "merged work is in the base"
        );
        for left in ["a/secret.env", "c/run.log", "c/empty", "build"] {
            assert!(
                !third.path.join(left).exists(),
                "{left} is left to the next item"
            );
        }
        assert!(third.path.join("a/tracked.txt").is_file());
    }

    /// The release asks about what the item touched only, and still sees every kind of
    /// change: a tracked file written in place (its directory unchanged), a new file, a
    /// change staged and nothing else (no file touched); nothing when nothing was done.
    #[tokio::test]
    async fn a_slots_release_sees_what_its_item_changed_from_what_it_touched() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        std::fs::create_dir(top.join("src")).unwrap();
        commit_file(&top, "src/lib.rs", "a\n");
        commit_file(&top, "README", "r\n");
        let session = create_session(&layout, &top, &prefix, "s10").await.unwrap();
        let pool = Pool::default();
        let agent = create_agent(&layout, &session, &pool, "item_0")
            .await
            .unwrap();
        let wt = agent.path.clone();
        if !stamps::local(&wt) {
            eprintln!("skipped: the temporary directory is not on a local file system");
            return;
        }
        assert_eq!(pool.touched(&wt), Some(vec![]), "the slot is watched");
        assert!(pool.changes(&agent).await.is_empty());
        std::fs::write(wt.join("src/lib.rs"), "changed in place\n").unwrap();
        assert_eq!(pool.touched(&wt), Some(vec![PathBuf::from("src/lib.rs")]));
        assert_eq!(pool.changes(&agent).await, [" M src/lib.rs"]);
        git_sync(&wt, &["checkout", "--", "src/lib.rs"]).unwrap();
        std::fs::write(wt.join("new.txt"), "n").unwrap();
        let mut left = pool.changes(&agent).await;
        left.sort();
        assert_eq!(left, ["?? new.txt"]);
        std::fs::remove_file(wt.join("new.txt")).unwrap();
        git_sync(&wt, &["rm", "-q", "--cached", "README"]).unwrap();
        let mut left = pool.changes(&agent).await;
        left.sort();
        assert_eq!(left, ["?? README", "D  README"]);
    }

    /// `worktree.persist`: the end of a job keeps its idle slots, cleaned, detached and
    /// without their branches, as spares; the next job's first slots are those spares,
    /// moved to its names, on its branches at its base, with nothing of the last job but
    /// the ignored paths its pool keeps, and prepared afresh (the setup marker gone).
    #[tokio::test]
    async fn a_persisted_slot_is_the_next_jobs_without_what_the_last_left() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        commit_file(&top, ".gitignore", "node_modules/\n*.log\n");
        commit_file(&top, "a.txt", "a\n");
        let session = create_session(&layout, &top, &prefix, "s8").await.unwrap();
        let pool = Pool::default();
        pool.persist(layout.clone());
        pool.keep_ignored(vec!["node_modules".into()]);
        let first = create_agent(&layout, &session, &pool, "item_0")
            .await
            .unwrap();
        commit_file(&first.path, "one.txt", "1\n");
        merge_agent(&session, &pool, &first, "merge").await.unwrap();
        std::fs::create_dir_all(first.path.join("node_modules/dep")).unwrap();
        std::fs::write(first.path.join("node_modules/dep/index.js"), "x").unwrap();
        std::fs::write(first.path.join("debug.log"), "x").unwrap();
        crate::worktree::bootstrap::mark_prepared(&first.path)
            .await
            .unwrap();
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let tracked = inode(&first.path.join("a.txt"));
        pool.release(first);
        assert_eq!(pool.drain(&top).await, 1, "one idle slot is kept");
        finish_map(&session).await.unwrap();
        let spare = layout.spare_worktree(0);
        assert!(spare.join("a.txt").is_file(), "kept with its files");
        assert!(!spare.join("debug.log").exists(), "cleaned when kept");
        let branches = git_sync(&top, &["branch", "--format=%(refname:short)"]).unwrap();
        assert_eq!(branches, "main\nprodigy-s8", "the slot's branch is deleted");

        // The next job, from `main` with a commit of its own.
        commit_file(&top, "two.txt", "2\n");
        let next = create_session(&layout, &top, &prefix, "s9").await.unwrap();
        let pool = Pool::default();
        pool.keep_ignored(vec!["node_modules".into()]);
        let cold = create_agent(&layout, &next, &pool, "item_0").await.unwrap();
        assert_eq!(
            cold.readied,
            Readied::Created,
            "only a job that persists takes spares"
        );
        assert!(spare.exists());
        pool.release(cold);
        pool.drain(&top).await;
        let pool = Pool::default();
        pool.persist(layout.clone());
        pool.keep_ignored(vec!["node_modules".into()]);
        let taken = create_agent(&layout, &next, &pool, "item_0").await.unwrap();
        assert_eq!(taken.readied, Readied::Spare);
        assert_eq!(taken.path, layout.agent_worktree("s9", 0));
        assert!(!spare.exists(), "the spare is taken");
        assert_eq!(taken.branch, "prodigy-s9-item_0");
        assert_eq!(
            inode(&taken.path.join("a.txt")),
            tracked,
            "no checkout of the whole tree"
        );
        assert!(taken.path.join("two.txt").is_file(), "at the new base");
        assert!(
            !taken.path.join("one.txt").exists(),
            "the old job's work is not merged here"
        );
        assert!(taken.path.join("node_modules/dep/index.js").is_file());
        assert_eq!(agent_head(&taken).await.unwrap(), None);
        let gitdir = git_sync(&taken.path, &["rev-parse", "--absolute-git-dir"]).unwrap();
        assert!(
            !Path::new(&gitdir)
                .join(crate::layout::PREPARED_MARKER)
                .exists(),
            "this job's setup runs in it"
        );
        // A second slot has no spare left: it is checked out.
        let new = create_agent(&layout, &next, &pool, "item_1").await.unwrap();
        assert_eq!(new.readied, Readied::Created);
        pool.release(taken);
        pool.release(new);
        assert_eq!(pool.drain(&top).await, 2, "both are kept for the next job");
        assert!(layout.spare_worktree(1).exists());
    }

    /// Leaves a lock file at PATH as a git killed a minute ago would.
    fn left_lock(path: &Path) {
        std::fs::write(path, "").unwrap();
        let then = std::time::SystemTime::now() - Duration::from_mins(1);
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(then)
            .unwrap();
    }

    /// The branches of REPO, by name.
    fn branches(repo: &Path) -> Vec<String> {
        git_sync(repo, &["branch", "--format=%(refname:short)"])
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The worktrees a killed process left are taken into the next process's pool (reset
    /// and cleaned), except those kept; the next item works in one of them. The ref locks
    /// the killed process's gits left go first: a new item's branch can be made even where
    /// one was left (`item_2`).
    #[tokio::test(start_paused = true)]
    async fn worktrees_a_killed_process_left_are_cleaned_and_reused() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        commit_file(&top, "README", "demo\n");
        let session = create_session(&layout, &top, &prefix, "s6").await.unwrap();
        let killed = Pool::default();
        let busy = create_agent(&layout, &session, &killed, "item_0")
            .await
            .unwrap();
        let kept = create_agent(&layout, &session, &killed, "item_1")
            .await
            .unwrap();
        std::fs::write(busy.path.join("half.txt"), "x").unwrap();
        std::fs::write(busy.path.join("README"), "changed").unwrap();
        std::fs::write(kept.path.join("wip.txt"), "keep me").unwrap();
        // The killed process's gits left the repository's ref lock behind, and the lock of
        // a branch they were making.
        let ref_lock = top.join(".git/packed-refs.lock");
        left_lock(&ref_lock);
        let branch_lock = top.join(".git/refs/heads/prodigy-s6-item_2.lock");
        left_lock(&branch_lock);
        // A new process (a resume) with an empty pool.
        let pool = Pool::default();
        let taken = pool
            .adopt(
                &layout,
                &session,
                std::slice::from_ref(&kept.path),
                std::time::SystemTime::now(),
            )
            .await;
        assert_eq!(taken, 1);
        assert!(!ref_lock.exists(), "a stale packed-refs.lock stays");
        assert!(!branch_lock.exists(), "a stale branch lock stays");
        let again = create_agent(&layout, &session, &pool, "item_0")
            .await
            .unwrap();
        assert_eq!(again.path, busy.path);
        assert_eq!(again.readied, Readied::Moved);
        assert_eq!(again.branch, "prodigy-s6-item_0-2");
        assert!(!again.path.join("half.txt").exists());
        assert_eq!(
            std::fs::read_to_string(again.path.join("README")).unwrap(),
            "demo\n"
        );
        assert!(
            kept.path.join("wip.txt").is_file(),
            "a kept worktree is left alone"
        );
        let next = create_agent(&layout, &session, &pool, "item_2")
            .await
            .unwrap();
        assert_eq!(next.branch, "prodigy-s6-item_2");
    }

    /// A killed process's agent branches: one with a worktree (`item_0`), one whose
    /// worktree is kept (`item_1`), and three without (`item_3`, `item_4`, `item_4-2`).
    async fn killed_job(layout: &Layout, top: &Path, prefix: &Path) -> (SessionWorktree, PathBuf) {
        let session = create_session(layout, top, prefix, "s9").await.unwrap();
        let killed = Pool::default();
        create_agent(layout, &session, &killed, "item_0")
            .await
            .unwrap();
        let kept = create_agent(layout, &session, &killed, "item_1")
            .await
            .unwrap();
        for branch in [
            "prodigy-s9-item_3",
            "prodigy-s9-item_4",
            "prodigy-s9-item_4-2",
        ] {
            git_sync(top, &["branch", branch]).unwrap();
        }
        (session, kept.path)
    }

    /// A lock a killed git left on one agent branch (its `git commit` was killed) kept
    /// every branch of the sweep, since git deletes them in one transaction: it is removed
    /// first, and the sweep leaves only the kept worktree's branch.
    #[tokio::test(start_paused = true)]
    async fn a_lock_a_killed_git_left_keeps_no_agent_branch() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        let (session, kept) = killed_job(&layout, &top, &prefix).await;
        let lock = top.join(".git/refs/heads/prodigy-s9-item_3.lock");
        left_lock(&lock);
        let swept = sweep_agents(
            &layout,
            &session,
            std::slice::from_ref(&kept),
            std::time::SystemTime::now(),
        )
        .await;
        assert_eq!(
            branches(&top),
            ["main", "prodigy-s9", "prodigy-s9-item_1"],
            "{swept:?}"
        );
        assert_eq!(swept.left, None);
        assert_eq!((swept.worktrees, swept.branches, swept.locks), (1, 3, 1));
        assert!(!lock.exists());
    }

    /// A lock made after this process started may be a live git's: it stays, and the sweep
    /// names the branch it could not delete, with git's reason; the others go.
    #[tokio::test(start_paused = true)]
    async fn a_branch_the_sweep_cannot_delete_is_named() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        let (session, kept) = killed_job(&layout, &top, &prefix).await;
        let lock = top.join(".git/refs/heads/prodigy-s9-item_4.lock");
        left_lock(&lock);
        let started = std::time::SystemTime::now() - Duration::from_mins(2);
        let swept = sweep_agents(&layout, &session, std::slice::from_ref(&kept), started).await;
        assert_eq!(
            branches(&top),
            [
                "main",
                "prodigy-s9",
                "prodigy-s9-item_1",
                "prodigy-s9-item_4"
            ]
        );
        let left = swept.left.unwrap();
        assert_eq!(left.branches, ["prodigy-s9-item_4"]);
        assert!(left.why.contains("prodigy-s9-item_4.lock"), "{}", left.why);
        assert_eq!(swept.locks, 0);
        assert!(lock.exists());
    }

    /// A clean merge made without a working tree is the merge `git merge --no-ff` makes:
    /// the same tree, the same parents in the same order, the same message.
    #[tokio::test]
    async fn a_merge_without_a_checkout_is_the_merge_git_makes() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        commit_file(&top, "README", "demo\n");
        commit_file(&top, "shared.txt", "one\ntwo\nthree\nfour\nfive\n");
        let session = create_session(&layout, &top, &prefix, "s7").await.unwrap();
        let pool = Pool::default();
        let a = create_agent(&layout, &session, &pool, "item_0")
            .await
            .unwrap();
        let b = create_agent(&layout, &session, &pool, "item_1")
            .await
            .unwrap();
        // Both change the same file, in different places: a real three-way merge.
        commit_file(&a.path, "shared.txt", "ONE\ntwo\nthree\nfour\nfive\n");
        commit_file(&a.path, "a.txt", "a\n");
        commit_file(&b.path, "shared.txt", "one\ntwo\nthree\nfour\nFIVE\n");
        std::fs::remove_file(b.path.join("README")).unwrap();
        git_sync(&b.path, &["commit", "-q", "-am", "no readme"]).unwrap();
        merge_agent(&session, &pool, &a, "merge a").await.unwrap();
        let before = git_sync(&session.path, &["rev-parse", &integration_ref(&session)]).unwrap();
        assert_eq!(
            merge_agent(&session, &pool, &b, "Merge item_1")
                .await
                .unwrap(),
            Merged::MergeCommit
        );
        let ours = git_sync(&session.path, &["rev-parse", &integration_ref(&session)]).unwrap();
        // The same merge with git's porcelain, in a checkout of what was merged before.
        let theirs = git_sync(&b.path, &["rev-parse", "HEAD"]).unwrap();
        let check = home.path().join("check");
        let target = check.to_string_lossy().into_owned();
        git_sync(
            &top,
            &["worktree", "add", "-q", "--detach", &target, &before],
        )
        .unwrap();
        git_sync(
            &check,
            &["merge", "-q", "--no-ff", "-m", "Merge item_1", &theirs],
        )
        .unwrap();
        let show = |dir: &Path, rev: &str| {
            git_sync(dir, &["show", "-s", "--format=%T %P%n%B", rev]).unwrap()
        };
        assert_eq!(show(&session.path, &ours), show(&check, "HEAD"));
        let tree = |dir: &Path, rev: &str| git_sync(dir, &["ls-tree", "-r", rev]).unwrap();
        assert_eq!(tree(&session.path, &ours), tree(&check, "HEAD"));
        assert!(tree(&check, "HEAD").contains("a.txt"));
        assert!(!tree(&check, "HEAD").contains("README"));
        // The session worktree was not touched: its branch and files are as they were.
        assert!(uncommitted(&session.path).is_empty());
        assert!(!session.path.join("a.txt").exists());
        assert!(session.path.join("README").exists());
    }

    /// The commit that brought an agent's last commit into the merged work: itself when
    /// fast-forwarded to, the merge commit otherwise, none when it is not there.
    #[tokio::test]
    async fn the_commit_that_merged_an_agent_is_found_again() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        let session = create_session(&layout, &top, &prefix, "s4").await.unwrap();
        let pool = Pool::default();
        let a = create_agent(&layout, &session, &pool, "item_0")
            .await
            .unwrap();
        let b = create_agent(&layout, &session, &pool, "item_1")
            .await
            .unwrap();
        let c = create_agent(&layout, &session, &pool, "item_2")
            .await
            .unwrap();
        commit_file(&a.path, "a.txt", "a\n");
        commit_file(&b.path, "b.txt", "b\n");
        commit_file(&c.path, "c.txt", "c\n");
        let head = |w: &AgentWorktree| git_sync(&w.path, &["rev-parse", "HEAD"]).unwrap();
        assert_eq!(merged_commit(&session, &head(&a)).await, None);
        merge_agent(&session, &pool, &a, "merge a").await.unwrap();
        merge_agent(&session, &pool, &b, "merge b").await.unwrap();
        let ref_head = git_sync(&session.path, &["rev-parse", &integration_ref(&session)]);
        assert_eq!(merged_commit(&session, &head(&a)).await, Some(head(&a)));
        assert_eq!(merged_commit(&session, &head(&b)).await, ref_head);
        assert_eq!(merged_commit(&session, &head(&c)).await, None);
        // After the map phase, found on the session branch.
        finish_map(&session).await.unwrap();
        assert_eq!(merged_commit(&session, &head(&b)).await, ref_head);
    }

    #[test]
    fn git_versions_are_read_as_git_prints_them() {
        assert_eq!(parse_git_version("git version 2.47.3\n"), Some((2, 47)));
        assert_eq!(
            parse_git_version("git version 2.39.5 (Apple Git-154)"),
            Some((2, 39))
        );
        assert_eq!(
            parse_git_version("git version 2.37.1.windows.1"),
            Some((2, 37))
        );
        assert_eq!(parse_git_version("not git"), None);
        assert!(git_version().is_some_and(|v| v >= MERGE_TREE_GIT));
    }

    #[test]
    fn outside_a_repository_there_is_nothing_to_isolate() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(repository(dir.path()), None);
    }

    /// A git whose caller stops waiting (a run interrupted mid-merge drops the future) is left
    /// to finish: killed, it would leave its lock files behind.
    #[tokio::test]
    async fn a_git_whose_caller_stops_waiting_finishes_its_work() {
        let project = repo();
        let top = project.path();
        let hook = top.join(".git/hooks/pre-commit");
        std::fs::write(&hook, "#!/bin/sh\nsleep 1\n").unwrap();
        let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(&hook, mode).unwrap();
        let commit = git(top, &["commit", "-q", "--allow-empty", "-m", "second"]);
        // The hook makes git outlast the wait: the future is dropped with git running.
        assert!(
            tokio::time::timeout(Duration::from_millis(100), commit)
                .await
                .is_err()
        );
        let count = || git_sync(top, &["rev-list", "--count", "HEAD"]);
        for _ in 0..600 {
            if count().as_deref() == Some("2") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(count().as_deref(), Some("2"), "the commit was not made");
        assert!(!top.join(".git/index.lock").exists());
    }

    /// A lock a killed git left on `packed-refs` does not fail a map phase whose work is
    /// merged: the integration ref is named, and the next end of a map phase deletes it.
    #[tokio::test]
    async fn an_integration_ref_that_cannot_be_deleted_does_not_undo_the_merge() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        commit_file(&top, "a.txt", "a\n");
        // Git gives up on the held lock at once (not after its default second).
        git_sync(&top, &["config", "core.packedRefsTimeout", "0"]).unwrap();
        let session = create_session(&layout, &top, &prefix, "s11").await.unwrap();
        let pool = Pool::default();
        let agent = create_agent(&layout, &session, &pool, "item_0")
            .await
            .unwrap();
        commit_file(&agent.path, "a.txt", "changed by the agent\n");
        merge_agent(&session, &pool, &agent, "merge").await.unwrap();
        pool.release(agent);
        pool.drain(&top).await;
        let name = integration_ref(&session);
        let to = git_sync(&session.path, &["rev-parse", &name]).unwrap();
        git_sync(&top, &["pack-refs", "--all"]).unwrap();
        let lock = top.join(".git/packed-refs.lock");
        std::fs::write(&lock, "").unwrap();
        let left = finish_map(&session).await.unwrap().unwrap();
        assert_eq!(left.name, name);
        assert!(left.why.contains("packed-refs.lock"), "{}", left.why);
        assert_eq!(git_sync(&session.path, &["rev-parse", "HEAD"]).unwrap(), to);
        assert_eq!(
            std::fs::read_to_string(session.path.join("a.txt")).unwrap(),
            "changed by the agent\n"
        );
        // Once the lock is gone, the next end of a map phase deletes the ref.
        std::fs::remove_file(&lock).unwrap();
        assert_eq!(finish_map(&session).await.unwrap(), None);
        assert!(git_sync(&session.path, &["rev-parse", "-q", "--verify", &name]).is_none());
        assert_eq!(git_sync(&session.path, &["rev-parse", "HEAD"]).unwrap(), to);
    }

    /// A map phase whose merge into the session worktree was cut short (a full disk, a
    /// kill) left files git had begun to write: a file the merge adds, empty, and a tracked
    /// one it changes, truncated. The next try puts exactly those back and merges, whatever
    /// else the session holds; a merge that git refuses for the session's own changes leaves
    /// them alone and says to commit or remove them.
    #[tokio::test]
    async fn a_map_merge_cut_short_is_put_back_and_tried_again() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        commit_file(&top, "a.txt", "a\n");
        let session = create_session(&layout, &top, &prefix, "s10").await.unwrap();
        let pool = Pool::default();
        let agent = create_agent(&layout, &session, &pool, "item_0")
            .await
            .unwrap();
        commit_file(&agent.path, "a.txt", "changed by the agent\n");
        std::fs::create_dir_all(agent.path.join("new")).unwrap();
        commit_file(&agent.path, "new/b.txt", "added by the agent\n");
        merge_agent(&session, &pool, &agent, "merge").await.unwrap();
        pool.release(agent);
        pool.drain(&top).await;
        // What git left when the disk filled: nothing committed, the files half written.
        let from = git_sync(&session.path, &["rev-parse", "HEAD"]).unwrap();
        let to = git_sync(&session.path, &["rev-parse", &integration_ref(&session)]).unwrap();
        let marker = session
            .path
            .join(git_sync(&session.path, &["rev-parse", "--git-path", FINISHING]).unwrap());
        std::fs::write(&marker, format!("{from} {to}\n")).unwrap();
        std::fs::write(session.path.join("a.txt"), "").unwrap();
        std::fs::create_dir_all(session.path.join("new")).unwrap();
        std::fs::write(session.path.join("new/b.txt"), "").unwrap();
        std::fs::write(session.path.join("mine.txt"), "the session's own\n").unwrap();
        finish_map(&session).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(session.path.join("a.txt")).unwrap(),
            "changed by the agent\n"
        );
        assert_eq!(
            std::fs::read_to_string(session.path.join("new/b.txt")).unwrap(),
            "added by the agent\n"
        );
        assert_eq!(git_sync(&session.path, &["rev-parse", "HEAD"]).unwrap(), to);
        assert!(!marker.exists());
        assert_eq!(
            std::fs::read_to_string(session.path.join("mine.txt")).unwrap(),
            "the session's own\n",
            "what the merge does not touch is left alone"
        );

        // The session's own change in a file the agents changed: refused, kept, and said.
        let agent = create_agent(&layout, &session, &pool, "item_1")
            .await
            .unwrap();
        commit_file(&agent.path, "a.txt", "again\n");
        merge_agent(&session, &pool, &agent, "merge").await.unwrap();
        pool.release(agent);
        pool.drain(&top).await;
        std::fs::write(session.path.join("a.txt"), "the user's edit\n").unwrap();
        let e = finish_map(&session).await.unwrap_err();
        let said = FinishMapError {
            branch: session.branch.clone(),
            path: session.path.clone(),
            source: e,
        }
        .to_string();
        assert!(said.contains("commit or remove the changes"), "{said}");
        assert_eq!(
            std::fs::read_to_string(session.path.join("a.txt")).unwrap(),
            "the user's edit\n"
        );
        assert!(!marker.exists());

        // A conflict (the session committed in a file the agents changed): git undoes its
        // merge, and nothing is left half merged.
        commit_file(&session.path, "a.txt", "the session's\n");
        finish_map(&session).await.unwrap_err();
        assert!(
            git_sync(
                &session.path,
                &["rev-parse", "-q", "--verify", "MERGE_HEAD"]
            )
            .is_none()
        );
        assert_eq!(uncommitted(&session.path), ["?? mine.txt"]);
        assert_eq!(
            std::fs::read_to_string(session.path.join("a.txt")).unwrap(),
            "the session's\n"
        );
        assert!(!marker.exists());
    }
}
