//! What the state layer records of worktrees (ARCHITECTURE.md, "Layers"): the session
//! worktree a checkpoint keeps, and what messages say about worktrees (paths no commit
//! holds, agent branches left, a `HEAD` off the run's branch, notes from preparing one).
//! Making and merging worktrees is the rest of `worktree`'s.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How an agent's worktree was readied for its item: the one place that says when a
/// worktree's own setup (dependencies, copied files) is due.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Readied {
    /// A new worktree was checked out for this agent's slot: nothing of a previous item is
    /// in it, and neither is anything the clean keeps.
    #[default]
    Created,
    /// A slot's worktree moved to this item: the base checked out, everything untracked and
    /// ignored removed except what [`super::Pool::keep_ignored`] names.
    Moved,
    /// A spare an earlier job kept ([`super::Pool::persist`]) taken for a new slot: cleaned like a
    /// moved one, and prepared afresh (this workflow's `worktree.setup` runs in it).
    Spare,
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
    /// Whether the worktree is new or a slot's moved to this item (not saved: it matters
    /// only where the worktree is made).
    #[serde(skip)]
    pub readied: Readied,
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

/// Agent branches [`sweep_agents`] could not delete (none named when they could not even
/// be listed), and why: git's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchesLeft {
    /// The branches still there.
    pub branches: Vec<String>,
    /// Why: git's first error.
    pub why: String,
}

/// Where a step left the session worktree's `HEAD` when it is not on the run's branch (a
/// step that switched to a branch of its own, or checked a commit out), and what became of
/// its commits ([`follow_head`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OffBranch {
    /// `HEAD` descends from the run's branch: the branch was moved to it and the worktree
    /// put back on it, so that its commits are merged like the others.
    Followed {
        /// Where `HEAD` was: a branch's name, or `None` for a detached `HEAD`.
        head: Option<String>,
        /// The run's branch.
        branch: String,
        /// Commits it gained.
        commits: usize,
    },
    /// `HEAD` does not descend from the run's branch: its commits cannot be merged as the
    /// run's work. They stay on KEPT (the branch `HEAD` was on, or one made for a detached
    /// `HEAD`, so that removing the worktree never loses them).
    Diverged {
        /// Where `HEAD` was: a branch's name, or `None` for a detached `HEAD`.
        head: Option<String>,
        /// The run's branch.
        branch: String,
        /// The branch that holds `HEAD`'s commits.
        kept: String,
    },
}

impl std::fmt::Display for OffBranch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let was = |head: &Option<String>| {
            head.as_ref()
                .map_or_else(|| "a detached HEAD".to_owned(), |b| format!("branch `{b}`"))
        };
        match self {
            OffBranch::Followed {
                head,
                branch,
                commits,
            } => write!(
                f,
                "a step left the run's worktree on {} instead of the run's branch `{branch}`; the {} made there {} from `{branch}`, which now points at {} and is merged as the run's work",
                was(head),
                crate::text::count(*commits, "commit"),
                if *commits == 1 { "descends" } else { "descend" },
                if *commits == 1 { "it" } else { "them" }
            ),
            OffBranch::Diverged { head, branch, kept } => write!(
                f,
                "a step left the run's worktree on {}, whose commits do not descend from the run's branch `{branch}`: they are not the run's work and are not merged; they are on branch `{kept}` (merge or drop it yourself)",
                was(head),
            ),
        }
    }
}

/// What preparing a worktree found worth a note (said as `note: …`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrepareNote {
    /// A `worktree.copy` entry names a file git tracks: every worktree has it already.
    CopyTracked {
        /// The entry.
        entry: String,
    },
    /// A `worktree.copy` entry matches no untracked file of the checkout.
    CopyMatchesNothing {
        /// The entry.
        entry: String,
        /// The user's checkout.
        source: PathBuf,
    },
    /// A file `worktree.copy` matches is inside a linked directory: not copied.
    CopyThroughLink {
        /// The file, relative to the worktree's root.
        file: String,
    },
    /// A `worktree.link` entry is no directory of the checkout.
    LinkNotADirectory {
        /// The entry.
        entry: String,
        /// The user's checkout.
        source: PathBuf,
    },
    /// A `worktree.link` entry exists in the worktree already (tracked?): not linked.
    LinkExists {
        /// The entry.
        entry: String,
    },
}

/// The integration ref of a map phase whose merged work is in the session branch but that
/// could not be deleted ([`super::finish_map`]): the next map phase's end deletes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefLeft {
    /// The ref (`refs/prodigy/…`).
    pub name: String,
    /// Why: git's message.
    pub why: String,
}
