//! Where a run works: the choice between a session worktree and the project itself, entering
//! that worktree, and leaving it (merged back, or kept).

use std::path::{Path, PathBuf};

use prodigy_plan::Plan;

use crate::runner::{Options, Runner};
use crate::vars::Vars;
use crate::worktree::{self, MergeBack, SessionWorktree, WorktreeError};

/// How the user asked a new run to be placed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// Run in the project directory itself (`--no-worktree`).
    pub no_worktree: bool,
    /// Insist on a session worktree (`--worktree`).
    pub worktree: bool,
    /// Nothing runs (`--dry-run`): no worktree, and no program is needed.
    pub dry_run: bool,
}

/// Why a new run cannot be placed.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum PlaceError {
    /// `git` is missing, and `--worktree`, the repository or a `commit_required` step needs
    /// it (WHY says which).
    #[error("`git` is not installed (or not on PATH), and {why}")]
    #[diagnostic(code(prodigy::session::no_git))]
    NoGit {
        /// What needs git.
        why: String,
    },
    /// A step must commit, and the project is not in a git repository.
    #[error(
        "step `{step}` requires a commit (`commit_required`), but {} is not a git repository (or has no commit yet); run it inside one",
        project.display()
    )]
    #[diagnostic(code(prodigy::session::commit_outside_repository))]
    CommitOutsideRepository {
        /// The step.
        step: String,
        /// The project directory.
        project: PathBuf,
    },
    /// A MapReduce job would run in worktrees, and git is older than 2.38: its agents' work
    /// could not be merged (`git merge-tree --write-tree`).
    #[error(
        "the map agents' work is merged with `git merge-tree --write-tree`, which needs git {}.{} or newer, and `git` is {}.{}; upgrade git, or run in place with --no-worktree",
        worktree::MERGE_TREE_GIT.0, worktree::MERGE_TREE_GIT.1, found.0, found.1
    )]
    #[diagnostic(code(prodigy::session::old_git))]
    OldGit {
        /// The version found (major, minor).
        found: (u32, u32),
    },
    /// `--worktree`, and the project is not in a git repository.
    #[error(
        "`--worktree` needs a git repository with a commit, and {} is not one",
        project.display()
    )]
    #[diagnostic(code(prodigy::session::not_a_repository))]
    NotARepository {
        /// The project directory.
        project: PathBuf,
    },
}

/// Where a new run of PLAN in PROJECT works, as HOW asks: `Some((top level, project
/// prefix))` for a session worktree in that repository, `None` for the project itself.
///
/// # Errors
///
/// [`PlaceError`]: git is missing and needed, a step must commit outside a repository, or
/// `--worktree` outside one.
pub fn choose_place(
    plan: &Plan,
    project: &Path,
    how: Placement,
) -> Result<Option<(PathBuf, PathBuf)>, PlaceError> {
    if !how.dry_run && !super::git_installed() {
        // Without git, a repository looks like a plain directory: say so rather than run
        // in place.
        let why = if how.worktree {
            Some("`--worktree` needs it; install git".to_owned())
        } else if !how.no_worktree
            && let Some(top) = crate::layout::top_level(project)
        {
            Some(format!(
                "{} is a git repository, where runs work in a git worktree; install git, or run in place with --no-worktree",
                top.display()
            ))
        } else {
            worktree::commit_required_step(plan).map(|step| {
                format!("step `{step}` requires a commit (`commit_required`); install git")
            })
        };
        if let Some(why) = why {
            return Err(PlaceError::NoGit { why });
        }
    }
    let repository = worktree::repository(project);
    if repository.is_none()
        && !how.dry_run
        && let Some(step) = worktree::commit_required_step(plan)
    {
        return Err(PlaceError::CommitOutsideRepository {
            step: step.to_owned(),
            project: project.to_owned(),
        });
    }
    match repository {
        _ if how.no_worktree || how.dry_run => Ok(None),
        Some(_) if plan.map.is_some() => match worktree::git_version() {
            Some(found) if found < worktree::MERGE_TREE_GIT => Err(PlaceError::OldGit { found }),
            _ => Ok(repository),
        },
        Some(repo) => Ok(Some(repo)),
        None if how.worktree => Err(PlaceError::NotARepository {
            project: project.to_owned(),
        }),
        None => Ok(None),
    }
}

/// Where a run works: a new session worktree in the repository ISOLATE (top level, project
/// prefix), or the one a checkpoint SAVED.
#[derive(Clone, Debug, Default)]
pub struct Place {
    /// A new session worktree in this repository (top level, the project's prefix in it).
    pub isolate: Option<(PathBuf, PathBuf)>,
    /// The session worktree of the run being resumed.
    pub saved: Option<SessionWorktree>,
    /// `worktree.persist`: a new session worktree is taken from a spare an earlier job
    /// kept, when there is one, cleaned except these ignored paths (`worktree.keep`).
    pub spares: Option<Vec<String>>,
}

/// How entering a [`Place`] went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entered {
    /// The run works in the project itself.
    InPlace,
    /// A new session worktree.
    Created(SessionWorktree),
    /// The saved session worktree; RECREATED when it was gone.
    Reopened {
        /// The worktree.
        worktree: SessionWorktree,
        /// It was gone and is made again, on its branch.
        recreated: bool,
    },
}

/// Why a session worktree cannot be entered.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum EnterError {
    /// The saved worktree cannot be reopened.
    #[error("cannot reopen the run's worktree: {0}")]
    #[diagnostic(code(prodigy::session::reopen))]
    Reopen(WorktreeError),
    /// A new worktree cannot be created.
    #[error("cannot create the run's worktree: {0}")]
    #[diagnostic(code(prodigy::session::create))]
    Create(WorktreeError),
    /// The project's directory is not in HEAD, so the worktree has no such directory (the
    /// worktree made is removed again).
    #[error(
        "{} is not in the repository's HEAD (is it committed?), so the run's worktree has no such directory; commit it, or run with --no-worktree",
        prefix.display()
    )]
    #[diagnostic(code(prodigy::session::not_in_head))]
    NotInHead {
        /// The project's prefix in the repository.
        prefix: PathBuf,
    },
}

impl Place {
    /// Creates or reopens the session worktree of ID into OPTS.
    ///
    /// # Errors
    ///
    /// [`EnterError`]: the worktree cannot be made or reopened.
    pub async fn enter(&self, opts: &mut Options, id: &str) -> Result<Entered, EnterError> {
        let (made, entered) = if let Some(saved) = &self.saved {
            let (w, recreated) = worktree::reopen(saved).await.map_err(EnterError::Reopen)?;
            (
                w.clone(),
                Entered::Reopened {
                    worktree: w,
                    recreated,
                },
            )
        } else if let Some((top, prefix)) = &self.isolate {
            let w = match &self.spares {
                Some(keep) => {
                    worktree::create_session_from_spare(&opts.layout, top, prefix, id, keep).await
                }
                None => worktree::create_session(&opts.layout, top, prefix, id).await,
            }
            .map_err(EnterError::Create)?;
            if !w.workdir.is_dir() {
                worktree::remove(top, &w.path, &w.branch).await;
                return Err(EnterError::NotInHead {
                    prefix: prefix.clone(),
                });
            }
            (w.clone(), Entered::Created(w))
        } else {
            return Ok(Entered::InPlace);
        };
        opts.worktree = Some(made);
        Ok(entered)
    }
}

/// The question before merging a session back, for the caller to answer.
#[derive(Clone, Copy, Debug)]
pub struct MergeQuestion<'a> {
    /// Commits the run made.
    pub commits: usize,
    /// The session branch.
    pub branch: &'a str,
    /// The branch it merges into (`HEAD` when detached).
    pub target: &'a str,
    /// The workflow's `merge` steps do the merge.
    pub merge_steps: bool,
}

/// How leaving the session worktree went.
#[derive(Debug, PartialEq, Eq)]
pub enum Left {
    /// The run worked in place: there is nothing to leave.
    InPlace,
    /// The run did not succeed: its worktree and branch are kept, nothing merged.
    Kept,
    /// The caller declined the merge: the worktree and branch are kept.
    Declined,
    /// Merged back (or nothing to merge); IGNORED paths (build output and the like) went
    /// with the worktree if it was removed.
    Merged {
        /// What the merge did.
        back: MergeBack,
        /// Ignored paths in the worktree before it went.
        ignored: usize,
    },
    /// The merge failed: why. The worktree and branch are kept.
    Failed(String),
}

/// After the run: a successful one (SUCCEEDED) is merged back when it made no commits or
/// DECIDE says yes to the [`MergeQuestion`]; otherwise the worktree is kept.
pub async fn leave(
    runner: &Runner,
    mut vars: Vars,
    succeeded: bool,
    decide: impl FnOnce(&MergeQuestion<'_>) -> bool,
) -> Left {
    let Some(session) = runner.worktree() else {
        return Left::InPlace;
    };
    // A step may have left the worktree off the run's branch: its commits are followed
    // when they descend from it, and never left without a reference.
    let off = match worktree::follow_head(session).await {
        Ok(off) => off,
        Err(e) if succeeded => {
            return Left::Failed(format!("cannot tell which commits are the run's: {e}"));
        }
        // A run that failed keeps its worktree as it is, whatever its HEAD holds.
        Err(_) => None,
    };
    match off {
        Some(off @ worktree::OffBranch::Diverged { .. }) if succeeded => {
            return Left::Failed(off.to_string());
        }
        Some(off) => runner.say(crate::message::Message::OffBranch(off)),
        None => {}
    }
    if !succeeded {
        return Left::Kept;
    }
    let (commits, _) = worktree::session_changes(session);
    let target = session.target_branch.as_deref().unwrap_or("HEAD");
    if !commits.is_empty()
        && !decide(&MergeQuestion {
            commits: commits.len(),
            branch: &session.branch,
            target,
            merge_steps: runner.has_merge_steps(),
        })
    {
        return Left::Declined;
    }
    // Ignored files (build output and the like) go with the worktree: counted first.
    let ignored = worktree::ignored(&session.path);
    match runner.merge_session(&mut vars).await {
        Ok(back) => Left::Merged { back, ignored },
        Err(why) => Left::Failed(why.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan::empty("w.yml")
    }

    fn git(dir: &Path, args: &[&str]) {
        let ok = std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap()
            .status
            .success();
        assert!(ok, "git {args:?}");
    }

    #[test]
    fn outside_a_repository_a_run_works_in_place_unless_a_worktree_is_insisted_on() {
        if !crate::session::git_installed() {
            eprintln!("skipped: no git");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let how = Placement::default();
        assert_eq!(choose_place(&plan(), dir.path(), how).unwrap(), None);
        let insist = Placement {
            worktree: true,
            ..how
        };
        let e = choose_place(&plan(), dir.path(), insist).unwrap_err();
        assert!(matches!(e, PlaceError::NotARepository { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with("`--worktree` needs a git repository"),
            "{e}"
        );
    }

    #[test]
    fn in_a_repository_a_run_gets_a_worktree_unless_in_place_or_dry() {
        if !crate::session::git_installed() {
            eprintln!("skipped: no git");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        for args in [
            &["init", "-q", "-b", "main"][..],
            &["config", "user.email", "t@example.invalid"],
            &["config", "user.name", "t"],
            &["commit", "-q", "--allow-empty", "-m", "base"],
        ] {
            git(dir.path(), args);
        }
        let how = Placement::default();
        let (top, prefix) = choose_place(&plan(), dir.path(), how).unwrap().unwrap();
        assert_eq!(
            top.canonicalize().unwrap(),
            dir.path().canonicalize().unwrap()
        );
        assert_eq!(prefix, PathBuf::new());
        for how in [
            Placement {
                no_worktree: true,
                ..how
            },
            Placement {
                dry_run: true,
                ..how
            },
        ] {
            assert_eq!(choose_place(&plan(), dir.path(), how).unwrap(), None);
        }
    }
}
