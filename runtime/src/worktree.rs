//! Git worktree isolation (docs/language.md §11): a run works in a session worktree on its own branch,
//! every map agent in a worktree branched from it, and the agents' commits come back one at
//! a time.
//!
//! Everything goes through the `git` command. Operations that change the repository's
//! shared administrative state (adding and removing worktrees, deleting branches) are
//! serialised: inside the process by one async lock, across processes by an advisory lock
//! on a file under `$PRODIGY_HOME/worktrees/{repo}/`; merges into a session worktree are
//! serialised by the merge queue of their job. Concurrent `git worktree add` calls race on
//! the repository's lock files, which is how upstream loses items at high parallelism.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use prodigy_compiler::plan::Plan;
use serde_json::json;

use crate::runner::Runner;
use crate::store::Layout;
use crate::vars::Vars;

/// Why a git operation failed.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum WorktreeError {
    /// `git` could not be started.
    #[error("cannot run `git`: {0}")]
    Spawn(std::io::Error),
    /// A git command failed.
    #[error("`git {args}` failed: {stderr}")]
    Git {
        /// The arguments.
        args: String,
        /// What git said.
        stderr: String,
    },
    /// The lock file could not be taken.
    #[error("cannot lock `{path}`: {source}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The merge conflicted; the session worktree was put back as it was.
    #[error("merging `{branch}` conflicts in {}", files.join(", "))]
    Conflict {
        /// The agent's branch.
        branch: String,
        /// The conflicting paths.
        files: Vec<String>,
        /// What git said.
        output: String,
    },
}

/// The session worktree of a run, as its checkpoint keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionWorktree {
    /// The worktree's root.
    pub path: PathBuf,
    /// Where commands run: the project directory's place inside the worktree.
    pub workdir: PathBuf,
    /// `prodigy-{session_id}`.
    pub branch: String,
    /// The branch the run started from (`None` on a detached HEAD).
    pub target_branch: Option<String>,
    /// The commit the session branched from.
    pub base_commit: String,
    /// The user's repository (its top level).
    pub repo: PathBuf,
}

/// A map agent's worktree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentWorktree {
    /// The worktree's root.
    pub path: PathBuf,
    /// Where the agent's commands run.
    pub workdir: PathBuf,
    /// Its branch.
    pub branch: String,
    /// The session commit it branched from.
    pub base: String,
}

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

/// Runs git in DIR: its exit code, standard output and standard error.
async fn git_output(
    dir: &Path,
    args: &[&str],
) -> Result<(Option<i32>, String, String), WorktreeError> {
    let out = tokio::process::Command::new("git")
        .args(["-c", "core.quotePath=false", "-c", "gc.auto=0"])
        .args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(WorktreeError::Spawn)?;
    Ok((
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Runs git in DIR and returns its standard output.
pub(crate) async fn git(dir: &Path, args: &[&str]) -> Result<String, WorktreeError> {
    let (code, stdout, stderr) = git_output(dir, args).await?;
    if code == Some(0) {
        return Ok(stdout);
    }
    let text = if stderr.trim().is_empty() {
        stdout
    } else {
        stderr
    };
    Err(WorktreeError::Git {
        args: args.join(" "),
        stderr: text.trim().to_owned(),
    })
}

/// Runs git in DIR, retrying a few times when another program holds one of the
/// repository's lock files.
async fn git_retrying(dir: &Path, args: &[&str]) -> Result<String, WorktreeError> {
    let mut delay = Duration::from_millis(20);
    let mut tries = 0;
    loop {
        match git(dir, args).await {
            Err(WorktreeError::Git { stderr, .. })
                if tries < 5 && stderr.contains(".lock") && stderr.contains("exists") =>
            {
                tries += 1;
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            other => return other,
        }
    }
}

fn git_sync(dir: &Path, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["-c", "core.quotePath=false"])
        .args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
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

/// A path in a working tree that no commit holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Uncommitted {
    /// Relative to the top of the working tree; directories end with `/`.
    pub path: String,
    /// What it is.
    pub kind: UncommittedKind,
}

/// Why a path is in no commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UncommittedKind {
    /// New or changed, not committed.
    Changed,
    /// Matched by `.gitignore`.
    Ignored,
    /// An empty directory: git keeps none, committed or not.
    EmptyDir,
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

/// `$PRODIGY_HOME/worktrees/{repo}/`.
pub fn worktrees_dir(layout: &Layout) -> PathBuf {
    layout.home.join("worktrees").join(&layout.repo)
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
    // In the repository's common git directory, so every process working on the repository
    // (from any directory, with any `PRODIGY_HOME`) takes the same lock.
    let common = if repo.join(".git").is_dir() {
        repo.join(".git")
    } else {
        let dir = git(
            repo,
            &["rev-parse", "--path-format=absolute", "--git-common-dir"],
        )
        .await?;
        PathBuf::from(dir.trim())
    };
    let path = common.join("prodigy-worktrees.lock");
    let cannot = |source| WorktreeError::Lock {
        path: path.clone(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(cannot)?;
    // Another prodigy process may hold it for the length of one git command.
    let file = tokio::task::spawn_blocking(move || file.lock().map(|()| file))
        .await
        .map_err(|e| cannot(std::io::Error::other(e)))?
        .map_err(cannot)?;
    Ok(Admin {
        _guard: guard,
        _file: file,
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
    let path = worktrees_dir(layout).join(session);
    // Readable by the user only, as the rest of `$PRODIGY_HOME`; if it cannot be made, git
    // says why.
    let _ = crate::store::private_dir(&worktrees_dir(layout));
    let branch = format!("prodigy-{session}");
    let base_commit = git(repo, &["rev-parse", "HEAD"]).await?.trim().to_owned();
    {
        let _admin = admin(repo).await?;
        let target = path.to_string_lossy().into_owned();
        add_on_new_branch(repo, &branch, &target, &base_commit).await?;
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

/// `git worktree add -b BRANCH TARGET BASE`. Git makes the branch before the worktree: when
/// the worktree cannot be made (TARGET exists, the disk is full), the branch it made is
/// deleted again, so that a failed attempt leaves no stray `prodigy-*` branch. A branch that
/// existed before is never touched.
async fn add_on_new_branch(
    repo: &Path,
    branch: &str,
    target: &str,
    base: &str,
) -> Result<String, WorktreeError> {
    let exists = async || {
        let name = format!("refs/heads/{branch}");
        git(repo, &["rev-parse", "-q", "--verify", &name])
            .await
            .is_ok()
    };
    let existed = exists().await;
    let added = git_retrying(repo, &["worktree", "add", "-q", "-b", branch, target, base]).await;
    if added.is_err() && !existed && exists().await {
        let _ = git(repo, &["branch", "-D", "-q", branch]).await;
    }
    added
}

/// Removes the worktree at PATH (with whatever it holds) and deletes BRANCH; missing ones
/// are not an error.
pub async fn remove(repo: &Path, path: &Path, branch: &str) {
    let _admin = admin(repo).await;
    let target = path.to_string_lossy().into_owned();
    if path.exists() {
        let _ = git_retrying(repo, &["worktree", "remove", "--force", &target]).await;
        let _ = std::fs::remove_dir_all(path);
    }
    let _ = git_retrying(repo, &["worktree", "prune"]).await;
    let _ = git_retrying(repo, &["branch", "-D", "-q", branch]).await;
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
    add_on_new_branch(&saved.repo, &saved.branch, &target, &base_commit).await?;
    Ok((
        SessionWorktree {
            base_commit,
            target_branch: current_branch(&saved.repo),
            ..saved.clone()
        },
        true,
    ))
}

/// The agent worktrees of one session, reused from item to item: switching a worktree to a
/// new branch touches only the files that differ, where creating one checks out the whole
/// tree and removing it deletes it again.
#[derive(Debug, Default)]
pub struct Pool {
    idle: std::sync::Mutex<Vec<AgentWorktree>>,
    made: std::sync::atomic::AtomicUsize,
    /// Branches of agents whose work is merged, deleted together when the phase ends.
    done: std::sync::Mutex<Vec<String>>,
    /// The integration ref's commit as this process last set or read it (merges into one
    /// session are serialised, and only this process runs the session's job).
    head: std::sync::Mutex<Option<String>>,
}

impl Pool {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<AgentWorktree>> {
        crate::lock(&self.idle)
    }

    /// Gives back the worktree of an agent whose work is merged (or that had none): the
    /// next agent reuses it.
    pub fn release(&self, agent: AgentWorktree) {
        self.idle().push(agent);
    }

    /// Removes the idle worktrees and the merged agents' branches.
    pub async fn drain(&self, repo: &Path) {
        let idle = std::mem::take(&mut *self.idle());
        for agent in idle {
            remove(repo, &agent.path, &agent.branch).await;
        }
        let done = std::mem::take(&mut *crate::lock(&self.done));
        for chunk in done.chunks(100) {
            let Ok(_admin) = admin(repo).await else {
                return;
            };
            let mut args = vec!["branch", "-D", "-q"];
            args.extend(chunk.iter().map(String::as_str));
            let _ = git_retrying(repo, &args).await;
        }
        *crate::lock(&self.head) = None;
    }

    /// The commit agents branch from: the integration ref, created from the session's HEAD
    /// at the first agent of a map phase.
    pub(crate) async fn integration(
        &self,
        session: &SessionWorktree,
    ) -> Result<String, WorktreeError> {
        if let Some(head) = crate::lock(&self.head).clone() {
            return Ok(head);
        }
        let name = integration_ref(session);
        let head =
            if let Ok(head) = git(&session.path, &["rev-parse", "-q", "--verify", &name]).await {
                head.trim().to_owned()
            } else {
                let head = git(&session.path, &["rev-parse", "HEAD"])
                    .await?
                    .trim()
                    .to_owned();
                // Created only if absent: a concurrent first agent may have made it already.
                let _ = git(&session.path, &["update-ref", &name, &head, ""]).await;
                git(&session.path, &["rev-parse", &name])
                    .await?
                    .trim()
                    .to_owned()
            };
        *crate::lock(&self.head) = Some(head.clone());
        Ok(head)
    }

    /// Moves the integration ref from CURRENT to NEW.
    async fn advance(
        &self,
        session: &SessionWorktree,
        new: &str,
        current: &str,
    ) -> Result<(), WorktreeError> {
        let name = integration_ref(session);
        git(&session.path, &["update-ref", &name, new, current]).await?;
        *crate::lock(&self.head) = Some(new.to_owned());
        Ok(())
    }
}

/// Runs CREATE with the first of `name(1)`, `name(2)`, ... that git does not refuse because
/// the branch exists; returns the name it took.
async fn first_free_branch(
    name: impl Fn(u32) -> String,
    create: impl AsyncFn(&str) -> Result<String, WorktreeError>,
) -> Result<String, WorktreeError> {
    let mut attempt = 1;
    loop {
        let branch = name(attempt);
        match create(&branch).await {
            Ok(_) => return Ok(branch),
            Err(WorktreeError::Git { stderr, .. })
                if stderr.contains("already exists") && attempt < 1000 =>
            {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// What `git merge-tree --write-tree --name-only` printed for a conflict (the tree, the
/// conflicted paths, a blank line, then git's messages): the paths and the messages.
fn conflict(out: &str) -> (Vec<String>, String) {
    let mut sections = out.splitn(2, "\n\n");
    let files = sections
        .next()
        .unwrap_or_default()
        .lines()
        .skip(1)
        .map(str::to_owned)
        .collect();
    (files, sections.next().unwrap_or_default().trim().to_owned())
}

/// The worktree of the map agent for ITEM in the session SESSION, on branch
/// `prodigy-{session}-{item}` (`-2`, `-3`, ... for later attempts while an earlier one's
/// branch exists) from the session's merged work as it is now: an idle one of POOL switched
/// to the new branch (cleaned of everything the last agent left), else a new
/// `{session}-agent-N` next to the session worktree.
pub async fn create_agent(
    layout: &Layout,
    session: &SessionWorktree,
    pool: &Pool,
    item: &str,
) -> Result<AgentWorktree, WorktreeError> {
    // A branch left by an earlier attempt at this item (a killed run, a failed attempt whose
    // worktree is kept for the DLQ) is never touched: this attempt gets the next name.
    let branch_for = |attempt: u32| {
        if attempt == 1 {
            format!("{}-{item}", session.branch)
        } else {
            format!("{}-{item}-{attempt}", session.branch)
        }
    };
    let base = pool.integration(session).await?;
    let prefix = session
        .workdir
        .strip_prefix(&session.path)
        .unwrap_or(Path::new(""))
        .to_owned();
    let reused = pool.idle().pop();
    if let Some(old) = reused {
        // Released only without commits or uncommitted changes: what is left to clear is
        // ignored files (build output and the like).
        let switched = match git(&old.path, &["clean", "-ffdxq"]).await {
            Ok(_) => first_free_branch(&branch_for, async |branch: &str| {
                git(&old.path, &["switch", "-q", "-c", branch, &base]).await
            })
            .await
            .ok(),
            Err(_) => None,
        };
        if let Some(branch) = switched {
            crate::lock(&pool.done).push(old.branch);
            return Ok(AgentWorktree {
                workdir: old.path.join(&prefix),
                path: old.path,
                branch,
                base,
            });
        }
        remove(&session.repo, &old.path, &old.branch).await;
    }
    let name = session
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let _admin = admin(&session.repo).await?;
    let _ = crate::store::private_dir(&worktrees_dir(layout));
    // Paths left by another process (kept for the DLQ, or by a kill) are skipped, not reused.
    let path = loop {
        let n = pool.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = worktrees_dir(layout).join(format!("{name}-agent-{n}"));
        if !path.exists() {
            break path;
        }
    };
    let target = path.to_string_lossy().into_owned();
    let branch = first_free_branch(&branch_for, async |branch: &str| {
        add_on_new_branch(&session.repo, branch, &target, &base).await
    })
    .await?;
    Ok(AgentWorktree {
        workdir: path.join(prefix),
        path,
        branch,
        base,
    })
}

/// The ref the map agents' work is merged into while the map phase runs: the session
/// branch's working tree is not touched by each merge, and the phase ends with one merge of
/// this ref into the session branch ([`finish_map`]).
fn integration_ref(session: &SessionWorktree) -> String {
    format!("refs/prodigy/{}", session.branch)
}

/// [`agent_head`], then [`merge_head`] (the map loop calls them apart, so that agents
/// without commits skip the merge queue).
#[cfg(test)]
async fn merge_agent(
    session: &SessionWorktree,
    pool: &Pool,
    agent: &AgentWorktree,
    message: &str,
) -> Result<Merged, WorktreeError> {
    match agent_head(agent).await? {
        Some(head) => merge_head(session, pool, agent, &head, message).await,
        None => Ok(Merged::Nothing),
    }
}

/// The agent's last commit, or `None` when it made none (the caller need not queue it).
pub async fn agent_head(agent: &AgentWorktree) -> Result<Option<String>, WorktreeError> {
    let head = git(&agent.path, &["rev-parse", "HEAD"])
        .await?
        .trim()
        .to_owned();
    Ok((head != agent.base).then_some(head))
}

/// Merges the agent's commits, up to THEIRS (its last commit), into the session's
/// integration ref: a fast-forward when nothing was merged since the agent branched (and
/// its history contains what was), else a merge commit computed without a working tree
/// (`git merge-tree --write-tree`, then `commit-tree`). A conflict changes nothing. The
/// caller serialises merges into one session.
pub async fn merge_head(
    session: &SessionWorktree,
    pool: &Pool,
    agent: &AgentWorktree,
    theirs: &str,
    message: &str,
) -> Result<Merged, WorktreeError> {
    let current = pool.integration(session).await?;
    // A fast-forward only when the agent's history contains everything merged so far (an
    // agent may have reset its branch below where it started).
    if current == agent.base
        && git(
            &session.path,
            &["merge-base", "--is-ancestor", &current, theirs],
        )
        .await
        .is_ok()
    {
        pool.advance(session, theirs, &current).await?;
        return Ok(Merged::FastForward);
    }
    let (code, out, err) = git_output(
        &session.path,
        &[
            "merge-tree",
            "--write-tree",
            "--name-only",
            &current,
            theirs,
        ],
    )
    .await?;
    match code {
        Some(0) => {
            let tree = out.lines().next().unwrap_or_default().trim().to_owned();
            let commit = git(
                &session.path,
                &[
                    "commit-tree",
                    &tree,
                    "-p",
                    &current,
                    "-p",
                    theirs,
                    "-m",
                    message,
                ],
            )
            .await?;
            pool.advance(session, commit.trim(), &current).await?;
            Ok(Merged::MergeCommit)
        }
        Some(1) => {
            let (files, output) = conflict(&out);
            Err(WorktreeError::Conflict {
                branch: agent.branch.clone(),
                files,
                output,
            })
        }
        _ => Err(WorktreeError::Git {
            args: "merge-tree --write-tree".into(),
            stderr: err,
        }),
    }
}

/// Starts merging OTHER into the branch checked out in DIR (`git merge --no-ff`), for the
/// `merge.on_conflict` steps to resolve: the files left conflicted (none when it merged
/// cleanly and is committed).
pub async fn begin_conflicted_merge(
    dir: &Path,
    other: &str,
    message: &str,
) -> Result<Vec<String>, WorktreeError> {
    let (code, _, err) = git_output(dir, &["merge", "-q", "--no-ff", "-m", message, other]).await?;
    if code == Some(0) {
        return Ok(Vec::new());
    }
    let unmerged = unmerged_files(dir).await?;
    if unmerged.is_empty() {
        return Err(WorktreeError::Git {
            args: format!("merge --no-ff {other}"),
            stderr: err,
        });
    }
    Ok(unmerged)
}

async fn unmerged_files(dir: &Path) -> Result<Vec<String>, WorktreeError> {
    Ok(git(dir, &["diff", "--name-only", "--diff-filter=U"])
        .await?
        .lines()
        .map(str::to_owned)
        .collect())
}

/// Whether DIR holds OTHER merged and committed, with nothing left unmerged: what the
/// `merge.on_conflict` steps must leave.
pub async fn merge_resolved(dir: &Path, other: &str) -> Result<(), String> {
    if git(dir, &["rev-parse", "-q", "--verify", "MERGE_HEAD"])
        .await
        .is_ok()
    {
        return Err("the merge is not committed".into());
    }
    match unmerged_files(dir).await {
        Ok(files) if !files.is_empty() => {
            return Err(format!("{} still unmerged", files.join(", ")));
        }
        Ok(_) => {}
        Err(e) => return Err(e.to_string()),
    }
    if git(dir, &["merge-base", "--is-ancestor", other, "HEAD"])
        .await
        .is_err()
    {
        return Err("the merged work is not in the branch's history".into());
    }
    Ok(())
}

/// Gives up a merge left in DIR (`git merge --abort`), so the worktree is as before it.
pub async fn abort_merge(dir: &Path) {
    let _ = git(dir, &["merge", "--abort"]).await;
}

/// Ends a map phase: the agents' merged work comes into the session branch (a fast-forward
/// unless the session committed meanwhile) and the integration ref goes. Nothing to do when
/// no agent merged anything.
pub async fn finish_map(session: &SessionWorktree) -> Result<(), WorktreeError> {
    let name = integration_ref(session);
    let Ok(head) = git(&session.path, &["rev-parse", "-q", "--verify", &name]).await else {
        return Ok(());
    };
    let message = format!("Merge the map agents' work ({})", session.branch);
    git(
        &session.path,
        &["merge", "-q", "--ff", "-m", &message, head.trim()],
    )
    .await?;
    git(&session.path, &["update-ref", "-d", &name]).await?;
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

impl Runner {
    /// Whether the workflow resolves conflicted merges (`merge.on_conflict`).
    pub(crate) fn resolves_conflicts(&self) -> bool {
        self.plan
            .merge
            .as_ref()
            .is_some_and(|m| !m.on_conflict.is_empty())
    }

    /// Runs the `merge.on_conflict` steps in a worktree holding the conflicted merge of
    /// `other` into `dir`, with `${merge.*}` and `${merge.conflicted_files}` set. Ok when they
    /// leave the merge committed and nothing unmerged; else the merge is given up (the
    /// worktree is as before it) and the error says why, for the DLQ.
    pub(crate) async fn resolve_conflict(
        &self,
        c: Conflicted<'_>,
        vars: &mut Vars,
    ) -> Result<(), String> {
        let Some(merge) = self
            .plan
            .merge
            .as_ref()
            .filter(|m| !m.on_conflict.is_empty())
        else {
            return Err("no `merge.on_conflict` steps".into());
        };
        let message = format!(
            "Merge {} into {} (conflicts resolved by `merge.on_conflict`)",
            c.target_branch, c.source_branch
        );
        let files = begin_conflicted_merge(c.dir, c.other, &message)
            .await
            .map_err(|e| e.to_string())?;
        if files.is_empty() {
            // It merged cleanly after all.
            return Ok(());
        }
        vars.set(
            "merge",
            json!({
                "worktree": c.dir,
                "source_branch": c.source_branch,
                "target_branch": c.target_branch,
                "session_id": self.session(),
                "conflicted_files": files,
            }),
        );
        self.record(&crate::events::Event::MergeConflictHandlerStarted {
            source_branch: c.source_branch.to_owned(),
            target_branch: c.target_branch.to_owned(),
            conflicted_files: files.clone(),
            worktree: c.dir.to_owned(),
        });
        self.say(&format!(
            "merging `{}` into `{}` conflicts in {}: running `merge.on_conflict` in {}",
            c.source_branch,
            c.target_branch,
            files.join(", "),
            c.dir.display()
        ));
        let (scope, stop) = crate::mapreduce::scope_for(c.item, None, c.workdir.clone());
        let steps = self.run_phase(&merge.on_conflict, vars);
        let (outcome, why) =
            crate::mapreduce::guarded(self, scope, stop, steps, merge.timeout, None).await;
        let result = match (why, outcome.continues()) {
            (Some(crate::mapreduce::Stopped::TimedOut), _) => Err(format!(
                "the `merge.on_conflict` steps took longer than the merge's timeout ({})",
                humantime::format_duration(merge.timeout.unwrap_or_default())
            )),
            (Some(crate::mapreduce::Stopped::Cancelled), _) => {
                Err("the `merge.on_conflict` steps were interrupted".into())
            }
            (None, false) => Err("a `merge.on_conflict` step failed".into()),
            (None, true) => merge_resolved(c.dir, c.other)
                .await
                .map_err(|why| format!("the `merge.on_conflict` steps ended, but {why}")),
        };
        let log = vars.last_output.clone().unwrap_or_default();
        self.record(&crate::events::Event::MergeConflictHandlerFinished {
            source_branch: c.source_branch.to_owned(),
            success: result.is_ok(),
            error: result.as_ref().err().cloned(),
        });
        vars.values.remove("merge");
        match result {
            Ok(()) => Ok(()),
            Err(why) => {
                abort_merge(c.dir).await;
                Err(if log.trim().is_empty() {
                    why
                } else {
                    format!("{why}; the last step printed:\n{}", log.trim_end())
                })
            }
        }
    }

    /// Brings the session worktree back: the `merge` steps with `${merge.*}` (checked
    /// afterwards: the session branch must be merged into its target), else `git merge
    /// --no-ff` into the branch the run started from. On success the session worktree and
    /// branch are removed. The caller has asked the user first.
    pub async fn merge_session(&self, vars: &mut Vars) -> Result<MergeBack, String> {
        let Some(session) = &self.opts.worktree else {
            return Ok(MergeBack::Nothing { left: 0 });
        };
        let left = uncommitted(&session.path).len();
        let (commits, files) = session_changes(session);
        if commits.is_empty() {
            if left == 0 {
                remove(&session.repo, &session.path, &session.branch).await;
            }
            return Ok(MergeBack::Nothing { left });
        }
        let target = session
            .target_branch
            .clone()
            .ok_or("the run started on a detached HEAD: there is no branch to merge into")?;
        self.record(&crate::events::Event::MergeStarted {
            source_branch: session.branch.clone(),
            target_branch: target.clone(),
            commits: commits.len(),
        });
        if let Some(merge) = self.plan.merge.as_ref().filter(|m| !m.steps.is_empty()) {
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
                    "session_id": self.session(),
                    "commits": commits,
                    "commit_count": commits.len(),
                    "commit_ids": short.join(","),
                    "file_list": files.join(","),
                    "file_count": files.len(),
                    "modified_files": files,
                }),
            );
            self.say(&format!(
                "merge: {} in {}",
                crate::progress::count(merge.steps.len(), "step"),
                session.path.display()
            ));
            // Under the `timeout`, stopped like any step: SIGTERM to the process groups,
            // then SIGKILL after the grace period.
            let (scope, stop) = crate::mapreduce::scope_for(None, None, None);
            let steps = self.run_phase(&merge.steps, vars);
            let (outcome, why) =
                crate::mapreduce::guarded(self, scope, stop, steps, merge.timeout, None).await;
            match why {
                Some(crate::mapreduce::Stopped::TimedOut) => {
                    return Err(format!(
                        "the `merge` steps took longer than their timeout ({})",
                        humantime::format_duration(merge.timeout.unwrap_or_default())
                    ));
                }
                Some(crate::mapreduce::Stopped::Cancelled) => {
                    return Err("the `merge` steps were interrupted".into());
                }
                None => {}
            }
            if !outcome.continues() {
                return Err("a `merge` step failed".into());
            }
            if !merged(session) {
                return Err(format!(
                    "the `merge` steps finished, but `{}` is not merged into `{target}`",
                    session.branch
                ));
            }
        } else {
            match merge_session(session).await {
                Err(WorktreeError::Conflict { files, .. }) if self.resolves_conflicts() => {
                    // Resolved in the session worktree: the target's new work merged into
                    // the session branch, which then merges back cleanly.
                    self.resolve_conflict(
                        Conflicted {
                            dir: &session.path,
                            other: &target,
                            source_branch: &session.branch,
                            target_branch: &target,
                            item: None,
                            workdir: None,
                        },
                        vars,
                    )
                    .await
                    .map_err(|why| {
                        format!(
                            "merging `{}` back conflicts in {}, and {why}",
                            session.branch,
                            files.join(", ")
                        )
                    })?;
                    merge_session(session).await.map_err(|e| e.to_string())?;
                }
                other => other.map_err(|e| e.to_string())?,
            }
        }
        self.record(&crate::events::Event::MergeFinished {
            source_branch: session.branch.clone(),
            target_branch: target.clone(),
        });
        // The `merge` steps may have left changes of their own: counted again.
        let left = changes(&session.path).await.len();
        if left == 0 {
            remove(&session.repo, &session.path, &session.branch).await;
        }
        Ok(MergeBack::Merged {
            commits: commits.len(),
            target,
            left,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Git makes the branch before the worktree: a worktree that cannot be made left its
    /// `prodigy-*` branch behind.
    #[tokio::test]
    async fn a_worktree_that_cannot_be_made_leaves_no_branch() {
        let project = repo();
        let home = tempfile::tempdir().unwrap();
        let layout = layout(home.path());
        let (top, prefix) = repository(project.path()).unwrap();
        // Something already where the worktree goes.
        std::fs::create_dir_all(worktrees_dir(&layout)).unwrap();
        std::fs::write(worktrees_dir(&layout).join("s1"), "in the way").unwrap();
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

    #[test]
    fn outside_a_repository_there_is_nothing_to_isolate() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(repository(dir.path()), None);
    }
}
