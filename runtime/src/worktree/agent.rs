//! Map agents' worktrees: the pool they are reused from, and their commits merged one at a
//! time into the job's integration ref (conflicts go to `merge.on_conflict`).

use std::path::{Path, PathBuf};

use super::records::{BranchesLeft, Readied};
use super::stamps::{Known, Stamps};
use super::watch::Watcher;
use super::{
    AgentWorktree, Layout, Merged, SessionWorktree, WorktreeError, add_on_new_branch, admin,
    common_dir, git, git_output, git_retrying, remove,
};

/// The agent worktrees of one session, reused from item to item: switching a worktree to a
/// new branch touches only the files that differ, where creating one checks out the whole
/// tree and removing it deletes it again.
#[derive(Debug, Default)]
pub struct Pool {
    idle: std::sync::Mutex<Vec<AgentWorktree>>,
    made: std::sync::atomic::AtomicUsize,
    /// Branches of agents whose work is merged, deleted together when the phase ends.
    done: std::sync::Mutex<Vec<String>>,
    /// Worktrees kept for a successful agent's uncommitted changes.
    kept: std::sync::Mutex<Vec<std::path::PathBuf>>,
    /// The integration ref's commit as this process last set or read it (merges into one
    /// session are serialised, and only this process runs the session's job).
    head: std::sync::Mutex<Option<String>>,
    /// What the clean between two items keeps: gitignore patterns of ignored paths (the
    /// dependency directories the workflow names, `worktree.keep`).
    keep: std::sync::Mutex<Vec<String>>,
    /// Where the idle worktrees go when the map phase ends (`worktree.persist`): spares
    /// under this layout; `None`: they are removed.
    park: std::sync::Mutex<Option<Layout>>,
    /// The directories of each slot's worktree as they were when it was readied for its
    /// item: what the clean after the item looks at ([`Pool::clean_after`]).
    stamps: std::sync::Mutex<std::collections::HashMap<PathBuf, Known>>,
    /// What each slot's item touched, for the release ([`Pool::changes`]).
    watch: std::sync::Mutex<Watcher>,
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

    /// Sets what the clean between two items keeps: gitignore patterns (`node_modules`,
    /// `/target`) of ignored paths, such as dependency directories that are costly to make
    /// again. Untracked paths that are not ignored are never kept: an agent that leaves
    /// them keeps its worktree out of the pool instead.
    pub fn keep_ignored(&self, patterns: Vec<String>) {
        *crate::lock(&self.keep) = patterns;
    }

    /// Keeps the idle worktrees when the map phase ends, cleaned and detached from their
    /// branches, as spares under LAYOUT for the next job of the repository to take instead
    /// of checking out the whole tree ([`Layout::spare_worktree`]), rather than removing
    /// them (`worktree.persist`).
    pub fn persist(&self, layout: Layout) {
        *crate::lock(&self.park) = Some(layout);
    }

    /// Removes everything untracked or ignored from the worktree at PATH, except what
    /// [`Pool::keep_ignored`] names (an adopted slot's, whose item is unknown).
    async fn clean(&self, path: &Path) -> Result<(), WorktreeError> {
        let keep = crate::lock(&self.keep).clone();
        super::spare::clean(path, &keep).await
    }

    /// [`Pool::clean`] of the slot OLD's item leaves: the first half of moving it to its
    /// next item (the caller then checks out the base). Where its directories were stamped
    /// when it was readied ([`Pool::stamp`]), `git clean` is handed only what is new since
    /// then ([`Stamps::new_entries`]) and the files the item's commits deleted (ignored
    /// files by those names would be left otherwise), less the files those commits added:
    /// nothing at all to do when the item only committed new files. Returns the stamps
    /// for the next [`Pool::stamp`].
    async fn clean_after(&self, old: &AgentWorktree) -> (Result<(), WorktreeError>, Option<Known>) {
        let stamps = crate::lock(&self.stamps).remove(&old.path);
        let (only, stamps) = match stamps {
            Some(Known::Stamped(stamps)) => {
                let (only, stamps) = changed_paths(old, stamps).await;
                (only, stamps.map(Known::Stamped))
            }
            Some(Known::Unstamped) => (None, Some(Known::Unstamped)),
            None => (None, None),
        };
        let keep = crate::lock(&self.keep).clone();
        (
            super::spare::clean_only(&old.path, &keep, only.as_deref()).await,
            stamps,
        )
    }

    /// Notes the directories of the slot at PATH as they are now that it is readied for its
    /// item, from PREVIOUS (its stamps before, so that only directories that moved are
    /// listed again; `None`: a walk of the whole worktree): what [`Pool::clean_after`]
    /// compares with. The slot is watched from now on ([`Pool::changes`]).
    async fn stamp(&self, path: &Path, previous: Option<Known>) {
        let known = match previous {
            Some(Known::Unstamped) => Known::Unstamped,
            Some(Known::Stamped(stamps)) => Self::refresh(path, stamps).await,
            None => Self::refresh(path, Stamps::default()).await,
        };
        match &known {
            Known::Stamped(stamps) => crate::lock(&self.watch).arm(path, stamps.dirs()),
            Known::Unstamped => crate::lock(&self.watch).forget(path),
        }
        crate::lock(&self.stamps).insert(path.to_owned(), known);
    }

    /// What the item in the slot at PATH touched, as [`Pool::changes`] sees it.
    #[cfg(test)]
    pub(super) fn touched(&self, path: &Path) -> Option<Vec<PathBuf>> {
        crate::lock(&self.watch).touched(path)
    }

    /// The uncommitted changes the agent in AGENT left, one `git status --short` line each,
    /// as [`super::changes`] says them. Where the slot is watched ([`Watcher`]), `git status`
    /// is asked about the paths the item touched only (none: no process at all), after
    /// `git diff-index --cached` has shown nothing staged anywhere; in a big checkout that
    /// spares the untracked walk of every directory. The watch sees only what is written
    /// through the worktree's own directories: a tracked file written through a hard link
    /// from outside is found by `git diff-files` (every tracked file's stat data against the
    /// index, no content read), and asked about too.
    pub async fn changes(&self, agent: &AgentWorktree) -> Vec<String> {
        let touched = crate::lock(&self.watch).touched(&agent.path);
        let Some(mut specs) = touched
            .and_then(|touched| utf8(&touched))
            .map(|t| literal(&t))
        else {
            return super::changes(&agent.path).await;
        };
        if git(&agent.path, &["diff-index", "--cached", "--quiet", "HEAD"])
            .await
            .is_err()
        {
            return super::changes(&agent.path).await;
        }
        let Ok(unlike) = git(&agent.path, &["diff-files", "--name-only", "-z"]).await else {
            return super::changes(&agent.path).await;
        };
        let unlike: Vec<String> = unlike
            .split('\0')
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect();
        if unlike.len() > super::watch::MAX_TOUCHED {
            return super::changes(&agent.path).await;
        }
        specs.extend(literal(&unlike));
        if specs.is_empty() {
            return Vec::new();
        }
        let mut args = vec!["status", "--porcelain", "--"];
        args.extend(specs.iter().map(String::as_str));
        match git(&agent.path, &args).await {
            Ok(out) => out.lines().map(str::to_owned).collect(),
            Err(_) => super::changes(&agent.path).await,
        }
    }

    /// [`Stamps::refresh`], off the runtime's threads.
    async fn refresh(path: &Path, stamps: Stamps) -> Known {
        let root = path.to_owned();
        tokio::task::spawn_blocking(move || stamps.refresh(&root))
            .await
            .ok()
            .flatten()
            .map_or(Known::Unstamped, Known::Stamped)
    }

    /// Adds the agent worktrees of SESSION that an earlier process left (killed, or stopped
    /// before the map phase ended) to the idle ones, except those in KEEP (kept for the
    /// DLQ or for uncommitted changes): each is reset to its commit and cleaned, then used
    /// like any idle worktree. Their branches (a killed attempt's commits) are not this
    /// process's to delete: they stay until the map phase ends with every item decided
    /// ([`sweep_agents`]). Returns how many were taken.
    ///
    /// First the ref locks a killed git left are removed ([`clear_stale_locks`], BEFORE
    /// being when this process started), else the next branch of a killed item could not
    /// be made.
    pub async fn adopt(
        &self,
        layout: &Layout,
        session: &SessionWorktree,
        keep: &[std::path::PathBuf],
        before: std::time::SystemTime,
    ) -> usize {
        let keep: Vec<std::path::PathBuf> = keep.iter().map(|p| canonical(p)).collect();
        clear_stale_locks(session, before).await;
        let mut taken = 0;
        // The verified queue's scratch worktree is the queue's own: never an agent's slot.
        let scratch = canonical(&super::candidate::scratch_path(layout, session));
        for (path, _) in leftover_agents(layout, session).await {
            if path == scratch || keep.contains(&path) || self.idle().iter().any(|a| a.path == path)
            {
                continue;
            }
            // A kill may have left git's index lock, or a merge half done.
            let gitdir = git(&path, &["rev-parse", "--absolute-git-dir"]).await;
            if let Ok(gitdir) = gitdir {
                let _ = std::fs::remove_file(Path::new(gitdir.trim()).join("index.lock"));
            }
            let reset = git(&path, &["reset", "-q", "--hard"]).await;
            if reset.is_err() || self.clean(&path).await.is_err() {
                continue;
            }
            let base = crate::worktree::facts::head(&path)
                .await
                .unwrap_or_default();
            self.idle().push(AgentWorktree {
                workdir: path.clone(),
                path,
                // No branch of this process's: none is deleted when the slot moves on.
                branch: String::new(),
                base,
                readied: Readied::Moved,
            });
            taken += 1;
        }
        taken
    }

    /// Notes that the worktree at PATH is kept (a successful agent left changes in it).
    pub fn keep(&self, path: std::path::PathBuf) {
        crate::lock(&self.stamps).remove(&path);
        crate::lock(&self.watch).forget(&path);
        crate::lock(&self.kept).push(path);
    }

    /// The worktrees [`Pool::keep`] noted.
    pub fn kept(&self) -> Vec<std::path::PathBuf> {
        crate::lock(&self.kept).clone()
    }

    /// Removes the idle worktrees (or, [`Pool::persist`], keeps them as spares) and the
    /// merged agents' branches; returns how many worktrees were kept as spares.
    pub async fn drain(&self, repo: &Path) -> usize {
        let idle = std::mem::take(&mut *self.idle());
        crate::lock(&self.stamps).clear();
        *crate::lock(&self.watch) = Watcher::default();
        let park = crate::lock(&self.park).clone();
        let mut parked = 0;
        let mut gone = Vec::new();
        for agent in idle {
            match &park {
                Some(layout) if self.park(layout, repo, &agent).await => {
                    parked += 1;
                    if !agent.branch.is_empty() {
                        crate::lock(&self.done).push(agent.branch);
                    }
                }
                _ => gone.push(agent),
            }
        }
        futures::future::join_all(
            gone.iter()
                .map(|agent| remove(repo, &agent.path, &agent.branch)),
        )
        .await;
        let done = std::mem::take(&mut *crate::lock(&self.done));
        let done: Vec<&str> = done.iter().map(String::as_str).collect();
        // What is left here the sweep at the end of the map phase deletes or names.
        for chunk in done.chunks(100) {
            delete_branches(repo, chunk).await;
        }
        *crate::lock(&self.head) = None;
        parked
    }

    /// Keeps AGENT's idle worktree as a spare ([`super::spare::park`]); false when it
    /// cannot (the caller removes it then).
    async fn park(&self, layout: &Layout, repo: &Path, agent: &AgentWorktree) -> bool {
        let keep = crate::lock(&self.keep).clone();
        super::spare::park(layout, repo, &agent.path, &keep).await
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
    pub(crate) async fn advance(
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

/// What [`sweep_agents`] removed, and what it could not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Agent worktrees removed.
    pub worktrees: usize,
    /// Agent branches deleted.
    pub branches: usize,
    /// Lock files a killed git left that were removed ([`clear_stale_locks`]).
    pub locks: usize,
    /// The agent branches that are still there, and why.
    pub left: Option<BranchesLeft>,
}

/// What git adds to a file's name for its lock (`refs/heads/x.lock`): git's, not a path of
/// prodigy's state.
const GIT_LOCK_SUFFIX: &str = ".lock";

/// How long a lock file made before this process started must stay unchanged before it is
/// taken as left behind: a git that is running holds one for milliseconds.
const STALE_LOCK_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// Removes the lock files a git killed while it changed refs left behind (a killed git
/// never removes its own, and git refuses to touch a ref whose lock exists): the
/// repository's `packed-refs.lock`, which every branch deletion takes, and the
/// `{branch}.lock` files of SESSION's agent branches (`{session branch}-item_*`), one of
/// which makes a `git branch -D` of many branches delete none, since git deletes them in one
/// transaction. Only a lock last changed before BEFORE (when this process started: none of
/// its gits made it) and still unchanged after [`STALE_LOCK_SETTLE`] (no git of a killed
/// process is still finishing with it) counts as left behind. Returns how many it removed.
async fn clear_stale_locks(session: &SessionWorktree, before: std::time::SystemTime) -> usize {
    let Ok(common) = common_dir(&session.repo).await else {
        return 0;
    };
    let mut locks = vec![common.join("packed-refs.lock")];
    // The loose refs of the agent branches: `refs/heads/{session branch}-item_*`.
    let agents = common
        .join("refs/heads")
        .join(format!("{}-item_", session.branch));
    if let (Some(dir), Some(prefix)) = (agents.parent(), agents.file_name()) {
        let prefix = prefix.to_string_lossy();
        let ours = |path: &Path| {
            path.file_name().is_some_and(|n| {
                let name = n.to_string_lossy();
                name.starts_with(&*prefix) && name.ends_with(GIT_LOCK_SUFFIX)
            })
        };
        if let Ok(entries) = std::fs::read_dir(dir) {
            locks.extend(entries.flatten().map(|e| e.path()).filter(|p| ours(p)));
        }
    }
    let changed = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let old: Vec<(std::path::PathBuf, std::time::SystemTime)> = locks
        .into_iter()
        .filter_map(|path| {
            let at = changed(&path)?;
            (at < before).then_some((path, at))
        })
        .collect();
    if old.is_empty() {
        return 0;
    }
    tokio::time::sleep(STALE_LOCK_SETTLE).await;
    old.into_iter()
        .filter(|(path, at)| changed(path) == Some(*at) && std::fs::remove_file(path).is_ok())
        .count()
}

/// Removes what the map agents of SESSION left that nothing keeps, however they left it (a
/// pool drained by a process that was killed, an attempt killed mid-item, a merged agent's
/// branch): every worktree `{session}-agent-N` under `worktrees/{repo}/` and every branch
/// `{session branch}-item_*`, except the worktrees in KEEP and their branches. Called when
/// a map phase ends with every item decided, so that no attempt left is still wanted.
/// First the ref locks a killed git left are removed ([`clear_stale_locks`], BEFORE being
/// when this process started); a branch that still cannot be deleted is named in
/// [`Swept::left`] with git's reason, never left silently.
pub async fn sweep_agents(
    layout: &Layout,
    session: &SessionWorktree,
    keep: &[std::path::PathBuf],
    before: std::time::SystemTime,
) -> Swept {
    let mut swept = Swept {
        locks: clear_stale_locks(session, before).await,
        ..Swept::default()
    };
    let keep: Vec<std::path::PathBuf> = keep.iter().map(|p| canonical(p)).collect();
    let mut kept_branches = Vec::new();
    let mut known = Vec::new();
    for (path, branch) in leftover_agents(layout, session).await {
        known.push(path.clone());
        if keep.contains(&path) {
            kept_branches.push(branch);
            continue;
        }
        remove(&session.repo, &path, &branch).await;
        swept.worktrees += 1;
    }
    // Directories git no longer knows (a kill while one was being made).
    let dir = layout.worktrees_dir();
    let dir = canonical(&dir);
    let ours = agent_path(layout, session);
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if ours(&path) && !keep.contains(&path) && !known.contains(&path) {
                let _ = std::fs::remove_dir_all(&path);
                swept.worktrees += 1;
            }
        }
    }
    let pattern = format!("refs/heads/{}-item_*", session.branch);
    let branches = match git(
        &session.repo,
        &["for-each-ref", "--format=%(refname:short)", &pattern],
    )
    .await
    {
        Ok(branches) => branches,
        Err(e) => {
            swept.left = Some(BranchesLeft {
                branches: Vec::new(),
                why: first_line(&e),
            });
            return swept;
        }
    };
    let stale: Vec<&str> = branches
        .lines()
        .filter(|b| !b.is_empty() && !kept_branches.iter().any(|k| k == b))
        .collect();
    let mut left = Vec::new();
    let mut why = None;
    for chunk in stale.chunks(100) {
        let deleted = delete_branches(&session.repo, chunk).await;
        swept.branches += chunk.len() - deleted.left.len();
        left.extend(deleted.left);
        why = why.or(deleted.why);
    }
    if let Some(why) = why {
        swept.left = Some(BranchesLeft {
            branches: left,
            why,
        });
    }
    swept
}

/// The first line of what E says (git's further lines are advice).
fn first_line(e: &WorktreeError) -> String {
    e.to_string().lines().next().unwrap_or_default().to_owned()
}

/// What [`delete_branches`] could not delete, and git's first reason.
struct Deleted {
    left: Vec<String>,
    why: Option<String>,
}

/// Deletes BRANCHES of REPO together, else (git deletes them in one transaction, and one
/// it cannot delete keeps them all) one by one: those still there, and why.
async fn delete_branches(repo: &Path, branches: &[&str]) -> Deleted {
    let all = |why: String| Deleted {
        left: branches.iter().map(|b| (*b).to_owned()).collect(),
        why: Some(why),
    };
    let _admin = match admin(repo).await {
        Ok(admin) => admin,
        Err(e) => return all(first_line(&e)),
    };
    let mut args = vec!["branch", "-D", "-q"];
    args.extend(branches.iter().copied());
    let Err(together) = git_retrying(repo, &args).await else {
        return Deleted {
            left: Vec::new(),
            why: None,
        };
    };
    if branches.len() == 1 {
        return all(first_line(&together));
    }
    let mut deleted = Deleted {
        left: Vec::new(),
        why: None,
    };
    for branch in branches {
        if let Err(e) = git_retrying(repo, &["branch", "-D", "-q", branch]).await {
            deleted.left.push((*branch).to_owned());
            deleted.why = deleted.why.or_else(|| Some(first_line(&e)));
        }
    }
    deleted
}

fn canonical(path: &Path) -> std::path::PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned())
}

/// Whether a path (canonical) is one of SESSION's agent worktrees: `{session}-agent-N`
/// under `worktrees/{repo}/`.
fn agent_path(layout: &Layout, session: &SessionWorktree) -> impl Fn(&Path) -> bool {
    let dir = canonical(&layout.worktrees_dir());
    let name = session
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prefix = format!("{name}-agent-");
    move |path: &Path| {
        path.parent() == Some(dir.as_path())
            && path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
    }
}

/// The agent worktrees of SESSION that git knows, with their branches (empty on a
/// detached HEAD).
async fn leftover_agents(
    layout: &Layout,
    session: &SessionWorktree,
) -> Vec<(std::path::PathBuf, String)> {
    let ours = agent_path(layout, session);
    let listed = git(&session.repo, &["worktree", "list", "--porcelain"])
        .await
        .unwrap_or_default();
    let mut found = Vec::new();
    for block in listed.split("\n\n") {
        let mut path = None;
        let mut branch = None;
        for line in block.lines() {
            if let Some(p) = line.strip_prefix("worktree ") {
                path = Some(std::path::PathBuf::from(p));
            } else if let Some(b) = line.strip_prefix("branch refs/heads/") {
                branch = Some(b.to_owned());
            }
        }
        if let Some(path) = path.filter(|p| ours(p)) {
            found.push((path, branch.unwrap_or_default()));
        }
    }
    found
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

/// At most this many paths go to one `git clean`; beyond, it cleans the whole worktree.
const CLEAN_PATHS: usize = 256;

/// What the clean after the item in OLD must look at ([`Pool::clean_after`]), as literal
/// pathspecs, from the slot's STAMPS; `None`: the whole worktree. With the stamps to keep.
async fn changed_paths(
    old: &AgentWorktree,
    stamps: Stamps,
) -> (Option<Vec<String>>, Option<Stamps>) {
    let root = old.path.clone();
    let Ok((found, stamps)) =
        tokio::task::spawn_blocking(move || (stamps.new_entries(&root, CLEAN_PATHS), stamps)).await
    else {
        // The look panicked: the next readying walks the worktree afresh.
        return (None, None);
    };
    let Some(mut found) = found.and_then(|found| utf8(&found)) else {
        return (None, Some(stamps));
    };
    match super::head_from_files(&old.path) {
        Some(head) if head == old.base => {}
        Some(head) => {
            let Some((added, deleted)) = tracked_changes(&old.path, &old.base, &head).await else {
                return (None, Some(stamps));
            };
            found.retain(|p| !added.contains(p));
            found.extend(deleted);
        }
        None => return (None, Some(stamps)),
    }
    if found.len() > CLEAN_PATHS {
        return (None, Some(stamps));
    }
    (Some(literal(&found)), Some(stamps))
}

/// PATHS as strings; `None` when one is not UTF-8 (git is then asked about everything).
fn utf8(paths: &[PathBuf]) -> Option<Vec<String>> {
    paths
        .iter()
        .map(|p| p.to_str().map(str::to_owned))
        .collect()
}

/// PATHS as git pathspecs that match them and only them (no wildcards).
fn literal(paths: &[String]) -> Vec<String> {
    paths.iter().map(|p| format!(":(literal){p}")).collect()
}

/// The files added and deleted between commits FROM and TO, in the worktree at DIR.
async fn tracked_changes(
    dir: &Path,
    from: &str,
    to: &str,
) -> Option<(std::collections::HashSet<String>, Vec<String>)> {
    let out = git(
        dir,
        &[
            "diff-tree",
            "-r",
            "-z",
            "--no-commit-id",
            "--no-renames",
            "--name-status",
            "--diff-filter=AD",
            from,
            to,
        ],
    )
    .await
    .ok()?;
    let mut added = std::collections::HashSet::new();
    let mut deleted = Vec::new();
    let mut fields = out.split('\0');
    while let (Some(status), Some(path)) = (fields.next(), fields.next()) {
        match status {
            "A" => {
                added.insert(path.to_owned());
            }
            "D" => deleted.push(path.to_owned()),
            _ => {}
        }
    }
    Some((added, deleted))
}

/// What `git merge-tree --write-tree --name-only` printed for a conflict (the tree, the
/// conflicted paths, a blank line, then git's messages): the paths and the messages.
pub(crate) fn conflict(out: &str) -> (Vec<String>, String) {
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
/// branch exists) from the session's merged work as it is now: an idle one of POOL (one
/// slot's worktree, kept for the whole job) cleaned of everything the last agent left and
/// switched to the new branch, else a new `{session}-agent-N` next to the session
/// worktree. [`AgentWorktree::readied`] says which.
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
    let target = Target {
        names: &branch_for,
        base: &base,
        prefix: &prefix,
    };
    let reused = pool.idle().pop();
    if let Some(old) = reused {
        // The last item's work is merged (or it had none): its branch goes when the phase
        // ends, whatever becomes of the worktree.
        if !old.branch.is_empty() {
            crate::lock(&pool.done).push(old.branch.clone());
        }
        // Released only without commits or uncommitted changes (or reset when adopted): what
        // is left to clear is ignored files (build output and the like).
        let (cleaned, stamps) = pool.clean_after(&old).await;
        match cleaned {
            Ok(()) => {
                let moved = ready_slot(session, pool, old.path, &target, Readied::Moved, stamps);
                if let Some(agent) = moved.await {
                    return Ok(agent);
                }
            }
            Err(_) => discard(session, pool, &old.path, "").await,
        }
    }
    create_slot(layout, session, pool, &target).await
}

/// Where a slot's worktree goes for an item: the first free branch NAMES gives, at BASE,
/// the agent's commands in PREFIX below the worktree's root.
struct Target<'a, F> {
    names: &'a F,
    base: &'a str,
    prefix: &'a Path,
}

/// Readies the clean worktree at PATH for the item TARGET says (a slot moved on, a spare
/// taken): on a new branch where the last item's ended, moved to the base with
/// `reset --keep`, which rewrites only the files that differ between the two commits and,
/// unlike a `switch` to the base, does not first stat every file of the index (the release
/// and the clean have just shown the worktree holds nothing else); then stamped and watched
/// from STAMPS ([`Pool::stamp`]). `None` when it cannot be: the worktree is removed, with
/// the branch made for it.
async fn ready_slot<F: Fn(u32) -> String>(
    session: &SessionWorktree,
    pool: &Pool,
    path: PathBuf,
    target: &Target<'_, F>,
    readied: Readied,
    stamps: Option<Known>,
) -> Option<AgentWorktree> {
    let branch = first_free_branch(target.names, async |branch: &str| {
        git(&path, &["switch", "-q", "-c", branch]).await
    })
    .await;
    let Ok(branch) = branch else {
        discard(session, pool, &path, "").await;
        return None;
    };
    if git(&path, &["reset", "-q", "--keep", target.base])
        .await
        .is_err()
    {
        discard(session, pool, &path, &branch).await;
        return None;
    }
    pool.stamp(&path, stamps).await;
    Some(AgentWorktree {
        workdir: path.join(target.prefix),
        path,
        branch,
        base: target.base.to_owned(),
        readied,
    })
}

/// Removes POOL's slot worktree at PATH (and BRANCH, unless empty): no longer watched.
async fn discard(session: &SessionWorktree, pool: &Pool, path: &Path, branch: &str) {
    crate::lock(&pool.watch).forget(path);
    remove(&session.repo, path, branch).await;
}

/// How a slot's worktree is checked out (a new one, and a spare taken for a slot): the
/// slot's index is read and written by every item's switch, status and commit, and the
/// smaller version 4 index and the untracked cache (which `git status` keeps up to date and
/// reads instead of every directory) make those cheaper in a big repository. Both are
/// recorded in the index, so the agents' own git commands keep them.
pub(super) const SLOT_CHECKOUT: [&str; 7] = [
    "-c",
    "index.version=4",
    "-c",
    "core.untrackedCache=true",
    "reset",
    "-q",
    "--hard",
];

/// A new `{session}-agent-N` worktree next to the session worktree for a pool's slot, for
/// the item TARGET says: on the first free branch, checked out at the base.
async fn create_slot<F: Fn(u32) -> String>(
    layout: &Layout,
    session: &SessionWorktree,
    pool: &Pool,
    target: &Target<'_, F>,
) -> Result<AgentWorktree, WorktreeError> {
    // Only a job that keeps its slots takes spares: without `worktree.persist`, a job's
    // worktrees are its own from checkout to removal.
    let persists = crate::lock(&pool.park).is_some();
    if persists && let Some(spare) = claim_spare(layout, session, pool, target).await {
        return Ok(spare);
    }
    let (path, branch) = {
        let _admin = admin(&session.repo).await?;
        let _ = crate::durable::private_dir(&layout.worktrees_dir());
        let path = next_slot_path(layout, session, pool);
        let at = path.to_string_lossy().into_owned();
        // Registered under the lock, checked out outside it: the slots' first checkouts
        // (the whole tree each) run side by side.
        let branch = first_free_branch(target.names, async |branch: &str| {
            add_on_new_branch(&session.repo, branch, &at, target.base, true).await
        })
        .await?;
        (path, branch)
    };
    // The session worktree holds nearly every file of the base.
    if let Err(e) = super::check_out(&session.path, &path, target.base, true).await {
        remove(&session.repo, &path, &branch).await;
        return Err(e);
    }
    pool.stamp(&path, None).await;
    Ok(AgentWorktree {
        workdir: path.join(target.prefix),
        path,
        branch,
        base: target.base.to_owned(),
        readied: Readied::Created,
    })
}

/// The path of POOL's next slot, `{session}-agent-N` with the first N no directory has
/// (the caller holds the administration lock). Paths left by another process (kept for
/// the DLQ, or by a kill) are skipped; the map phase adopts the unkept ones first
/// ([`Pool::adopt`]).
fn next_slot_path(layout: &Layout, session: &SessionWorktree, pool: &Pool) -> std::path::PathBuf {
    let name = session
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    loop {
        let n = pool.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = layout.agent_worktree(&name, n);
        if !path.exists() {
            return path;
        }
    }
}

/// A spare worktree an earlier job kept ([`Pool::persist`]) as a new slot of POOL
/// ([`super::spare::take`]: at the slot's path `{session}-agent-N`, cleaned except what
/// [`Pool::keep_ignored`] names, prepared afresh), readied for the item TARGET says
/// ([`ready_slot`]). `None` when there is no spare, or the one taken could not be readied
/// (it is removed).
async fn claim_spare<F: Fn(u32) -> String>(
    layout: &Layout,
    session: &SessionWorktree,
    pool: &Pool,
    target: &Target<'_, F>,
) -> Option<AgentWorktree> {
    let keep = crate::lock(&pool.keep).clone();
    let path = super::spare::take(layout, &session.repo, &keep, || {
        next_slot_path(layout, session, pool)
    })
    .await?;
    ready_slot(session, pool, path, target, Readied::Spare, None).await
}

/// The ref the map agents' work is merged into while the map phase runs: the session
/// branch's working tree is not touched by each merge, and the phase ends with one merge of
/// this ref into the session branch ([`finish_map`]).
pub(crate) fn integration_ref(session: &SessionWorktree) -> String {
    format!("refs/prodigy/{}", session.branch)
}

/// [`agent_head`], then [`merge_head`] (the map loop calls them apart, so that agents
/// without commits skip the merge queue).
#[cfg(test)]
pub(super) async fn merge_agent(
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
    let head = match super::head_from_files(&agent.path) {
        Some(head) => head,
        None => git(&agent.path, &["rev-parse", "HEAD"])
            .await?
            .trim()
            .to_owned(),
    };
    Ok((head != agent.base).then_some(head))
}

/// The agent's commits since it branched, oldest first (none when git cannot list them:
/// the list is for the record, never a reason to fail).
pub async fn agent_commits(agent: &AgentWorktree) -> Vec<String> {
    let range = format!("{}..HEAD", agent.base);
    git(&agent.path, &["rev-list", "--reverse", &range])
        .await
        .map(|out| out.lines().map(str::to_owned).collect())
        .unwrap_or_default()
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
    let agent_side = (agent.base.as_str(), agent.branch.as_str());
    let how = (message, true);
    let stacked = super::candidate::stack(session, agent_side, &current, theirs, how).await?;
    pool.advance(session, &stacked.commit, &current).await?;
    Ok(if stacked.fast_forward {
        Merged::FastForward
    } else {
        Merged::MergeCommit
    })
}

/// The commit that brought HEAD, an agent's last commit, into the session's merged work
/// (the integration ref while the map phase runs, else the session branch): the merge
/// commit on the ref's first-parent line, or HEAD itself when it was fast-forwarded to.
/// `None` when HEAD is not in that work: it was never merged.
pub async fn merged_commit(session: &SessionWorktree, head: &str) -> Option<String> {
    let name = integration_ref(session);
    let target = if git(&session.path, &["rev-parse", "-q", "--verify", &name])
        .await
        .is_ok()
    {
        name
    } else {
        format!("refs/heads/{}", session.branch)
    };
    git(
        &session.path,
        &["merge-base", "--is-ancestor", head, &target],
    )
    .await
    .ok()?;
    let range = format!("{head}..{target}");
    let line = git(
        &session.path,
        &["rev-list", "--first-parent", "--ancestry-path", &range],
    )
    .await
    .ok()?;
    let Some(oldest) = line.lines().last() else {
        // The ref is HEAD itself.
        return Some(head.to_owned());
    };
    let parent = git(&session.path, &["rev-parse", &format!("{oldest}^1")])
        .await
        .ok()?;
    Some(if parent.trim() == head {
        head.to_owned()
    } else {
        oldest.to_owned()
    })
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
pub async fn merge_resolved(dir: &Path, other: &str) -> Result<(), super::Unresolved> {
    if git(dir, &["rev-parse", "-q", "--verify", "MERGE_HEAD"])
        .await
        .is_ok()
    {
        return Err(super::Unresolved::NotCommitted);
    }
    match unmerged_files(dir).await {
        Ok(files) if !files.is_empty() => {
            return Err(super::Unresolved::StillUnmerged { files });
        }
        Ok(_) => {}
        Err(e) => return Err(e.into()),
    }
    if git(dir, &["merge-base", "--is-ancestor", other, "HEAD"])
        .await
        .is_err()
    {
        return Err(super::Unresolved::NotInHistory);
    }
    Ok(())
}

/// Gives up a merge left in DIR (`git merge --abort`), so the worktree is as before it.
pub async fn abort_merge(dir: &Path) {
    let _ = git(dir, &["merge", "--abort"]).await;
}
