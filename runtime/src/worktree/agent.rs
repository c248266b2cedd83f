//! Map agents' worktrees: the pool they are reused from, and their commits merged one at a
//! time into the job's integration ref (conflicts go to `merge.on_conflict`).

use std::path::Path;

use super::{
    AgentWorktree, Layout, Merged, SessionWorktree, WorktreeError, add_on_new_branch, admin, git,
    git_output, git_retrying, remove, worktrees_dir,
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
pub(super) fn conflict(out: &str) -> (Vec<String>, String) {
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
pub(super) fn integration_ref(session: &SessionWorktree) -> String {
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
    let head = git(&agent.path, &["rev-parse", "HEAD"])
        .await?
        .trim()
        .to_owned();
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
