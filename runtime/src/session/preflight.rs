//! What is checked before anything is made (a worktree, a branch, a lock): the steps a run
//! starts from, and the programs they need.

use prodigy_plan::{Plan, StepId};

use crate::jobstore::JobPhase;
use crate::runner::StartError;

/// Why a run cannot start, found before anything was made.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum PreflightError {
    /// The run works in a git worktree and there is no `git`.
    #[error(
        "the run works in a git worktree, but `git` is not installed (or not on PATH); install git"
    )]
    #[diagnostic(code(prodigy::session::no_git))]
    NoGit,
    /// A step needs the Claude CLI, and it is missing or unusable.
    #[error(transparent)]
    #[diagnostic(code(prodigy::session::claude))]
    Claude(#[from] StartError),
}

/// Whether `git` is on the PATH.
#[must_use]
pub fn git_installed() -> bool {
    crate::exec::find_executable("git").is_some()
}

/// The steps a run starts from, for [`preflight`]: a standard workflow's from step FIRST
/// (0-based), a job's from PHASE on (`None`: none of its phases, as when it only merges),
/// and the `merge` steps when MERGING.
#[must_use]
pub fn roots(plan: &Plan, phase: Option<JobPhase>, first: usize, merging: bool) -> Vec<StepId> {
    let mut roots = Vec::new();
    if plan.map.is_none() {
        if phase.is_some() {
            roots.extend(plan.commands.iter().skip(first));
        }
    } else {
        let (setup, map, reduce) = match phase {
            Some(JobPhase::Setup) => (true, true, true),
            Some(JobPhase::Map) => (false, true, true),
            Some(JobPhase::Reduce) => (false, false, true),
            Some(JobPhase::Done) | None => (false, false, false),
        };
        if setup && let Some(steps) = &plan.setup {
            roots.extend(&steps.steps);
        }
        if map && let Some(m) = &plan.map {
            roots.extend(&m.steps);
            for (_, steps) in &plan.handlers {
                roots.extend(steps);
            }
            // An agent's merge that conflicts runs the resolver.
            if let Some(merge) = &plan.merge {
                roots.extend(&merge.on_conflict);
            }
        }
        if reduce {
            roots.extend(&plan.reduce);
        }
    }
    if merging && let Some(merge) = &plan.merge {
        roots.extend(&merge.steps);
        roots.extend(&merge.on_conflict);
    }
    roots
}

/// Checks, before any worktree, branch or lock exists, that the programs the run needs are
/// installed: `git` when it works in a worktree (GIT), the Claude CLI (`claude_command`, else
/// `claude`) when running ROOTS leads to a `claude` step.
///
/// # Errors
///
/// [`PreflightError`]: which program is missing or unusable.
pub fn preflight(
    plan: &Plan,
    roots: &[StepId],
    git: bool,
    claude_command: Option<&str>,
) -> Result<(), PreflightError> {
    if git && !git_installed() {
        return Err(PreflightError::NoGit);
    }
    crate::runner::check_claude(plan, roots, claude_command)
        .map_err(crate::runner::StartError::from)?;
    Ok(())
}
