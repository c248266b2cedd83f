//! Where a run works, as the user sees it: the session worktree entered (and said so), the
//! merge-back question, and what is kept when nothing is merged.

use std::path::PathBuf;

use prodigy_runtime::progress::count;
use prodigy_runtime::runner::{Options, Runner};
use prodigy_runtime::session::{self, Entered, Left, MergeQuestion};
use prodigy_runtime::vars::Vars;
use prodigy_runtime::worktree::{MergeBack, SessionWorktree};

use crate::{err, exit_code};

/// Where a run works and how it ends: a new session worktree in the repository ISOLATE
/// (top level, project prefix), or the one a checkpoint SAVED; `yes` merges it back without
/// asking.
pub(crate) struct Place {
    pub(crate) isolate: Option<(PathBuf, PathBuf)>,
    pub(crate) saved: Option<SessionWorktree>,
    /// `worktree.persist`: a new session worktree may be a spare an earlier job kept,
    /// cleaned except these ignored paths.
    pub(crate) spares: Option<Vec<String>>,
    pub(crate) yes: bool,
    /// The command that continues the run (`resume` or `resume-job`), for the hint on a
    /// merge not done.
    pub(crate) resume: &'static str,
}

impl Place {
    /// The place of a resumed run or job: its SAVED worktree (none: it worked in place),
    /// merged back without asking when YES; RESUME names the command that continues it.
    pub(crate) fn resumed(saved: Option<SessionWorktree>, yes: bool, resume: &'static str) -> Self {
        Place {
            isolate: None,
            saved,
            spares: None,
            yes,
            resume,
        }
    }

    /// Creates or reopens the session worktree of ID into OPTS ([`session::Place::enter`])
    /// and says so; on failure prints why.
    pub(crate) async fn enter(&self, opts: &mut Options, id: &str) -> Result<(), u8> {
        let place = session::Place {
            isolate: self.isolate.clone(),
            saved: self.saved.clone(),
            spares: self.spares.clone(),
        };
        match place.enter(opts, id).await {
            Ok(Entered::InPlace) => {}
            Ok(Entered::Reopened {
                worktree: w,
                recreated,
            }) => {
                if recreated {
                    crate::note(&format!(
                        "the worktree {} was gone; recreated it on branch `{}`\n",
                        w.path.display(),
                        w.branch
                    ));
                }
            }
            Ok(Entered::Created(w)) => {
                crate::note(&format!(
                    "working in worktree {} on branch `{}` (--no-worktree runs in place)\n",
                    w.path.display(),
                    w.branch
                ));
            }
            Err(e) => {
                crate::err_diagnostic(&e);
                return Err(exit_code::PROBLEMS);
            }
        }
        Ok(())
    }

    /// After the run: a successful one is merged back (asking first on a terminal unless
    /// `-y`) with [`session::leave`]; otherwise, or when the user declines, says where the
    /// work is. When the merge itself fails, returns what is kept and how to merge it later,
    /// for the last line.
    pub(crate) async fn leave(
        &self,
        runner: &Runner,
        vars: Vars,
        succeeded: bool,
    ) -> Result<(), String> {
        let decide = |q: &MergeQuestion<'_>| {
            self.yes
                || ask(&format!(
                    "merge {} from `{}` into `{}`{}? [y/N] ",
                    count(q.commits, "commit"),
                    q.branch,
                    q.target,
                    if q.merge_steps {
                        " with the `merge` steps"
                    } else {
                        ""
                    }
                ))
        };
        let left = session::leave(runner, vars, succeeded, decide).await;
        let Some(session) = runner.worktree() else {
            return Ok(());
        };
        let kept = format!(
            "the run's work is on branch `{}` in {}",
            session.branch,
            session.path.display()
        );
        let (back, ignored) = match left {
            Left::InPlace => return Ok(()),
            Left::Kept => {
                // Said even under `-q`: the worktree stays until it is resumed or cleaned.
                err(&format!("{kept}; nothing was merged\n"));
                return Ok(());
            }
            Left::Merged { back, ignored } => (Ok(back), ignored),
            Left::Failed(why) => (Err(why), 0),
            Left::Declined => {
                let steps = if runner.has_merge_steps() {
                    " (the workflow's `merge` steps did not run)"
                } else {
                    ""
                };
                err(&format!(
                    "{kept}; merge it with `prodigy {} -y {}`, or with `git merge --no-ff {}`{steps}, or drop it with `prodigy worktree clean`\n",
                    self.resume,
                    runner.session(),
                    session.branch
                ));
                return Ok(());
            }
        };
        let left = |n: usize| worktree_fate(runner.persists(), ignored, n, &session.path);
        match back {
            Ok(MergeBack::Nothing { left: 0 }) if ignored == 0 => Ok(()),
            Ok(MergeBack::Nothing { left: n }) => {
                kept_or_note(n)(&format!(
                    "the run made no commits: nothing to merge; {}\n",
                    left(n)
                ));
                Ok(())
            }
            Ok(MergeBack::Merged {
                commits,
                target,
                left: n,
            }) => {
                kept_or_note(n)(&format!(
                    "✓ merged {} from `{}` into `{target}`; {}\n",
                    count(commits, "commit"),
                    session.branch,
                    left(n)
                ));
                Ok(())
            }
            Err(e) => {
                err(&format!("✗ merge failed: {e}\n"));
                Err(format!(
                    "{kept}, not merged: fix the cause, then merge it with `prodigy {} -y {}` (or `git merge --no-ff {}`), or drop it with `prodigy worktree clean`",
                    self.resume,
                    runner.session(),
                    session.branch
                ))
            }
        }
    }

    /// Where the run works, for the hint after a failure: its session worktree, where a fix
    /// must go for `resume` to see it (not the user's checkout).
    pub(crate) fn fix_where(runner: &Runner) -> String {
        fix_in(runner.worktree())
    }
}

/// Where to fix what a run in WORKTREE needs: in that worktree, not in the user's checkout.
pub(super) fn fix_in(worktree: Option<&SessionWorktree>) -> String {
    worktree.map_or_else(String::new, |w| {
        // The project's place in the worktree, without the `/` of an empty prefix.
        let dir: PathBuf = w.workdir.components().collect();
        format!(
            " in the run's worktree {} (resume continues there, not in your checkout)",
            dir.display()
        )
    })
}

/// Before merging back a completed run (WHAT, whose id is ID) whose branch is not merged:
/// says what happens. Without `-y` and without a terminal to ask on, nothing is merged and
/// the hint says how: returns false, there is nothing more to do.
pub(super) fn announce_merge(what: &str, saved: &SessionWorktree, place: &Place, id: &str) -> bool {
    use std::io::IsTerminal as _;
    if place.yes {
        err(&format!(
            "{what} completed; merging its branch `{}` back\n",
            saved.branch
        ));
        return true;
    }
    if std::io::stdin().is_terminal() {
        err(&format!(
            "{what} completed; its branch `{}` is not merged back yet\n",
            saved.branch
        ));
        return true;
    }
    err(&format!(
        "{what} completed, and its work on branch `{}` in {} is not merged back; nothing was merged (no terminal to ask on): merge it with `prodigy {} -y {id}`, or with `git merge --no-ff {}`, or drop it with `prodigy worktree clean`\n",
        saved.branch,
        saved.path.display(),
        place.resume,
        saved.branch
    ));
    false
}

/// How the line about a merge back is shown: like any error when it says that the worktree
/// is kept for LEFT uncommitted changes (so `-q` shows it too), else as a note.
fn kept_or_note(left: usize) -> fn(&str) {
    if left > 0 { err } else { crate::note }
}

/// Asks QUESTION on the terminal; anything but yes (or no terminal) is no.
pub(crate) fn ask(question: &str) -> bool {
    use std::io::IsTerminal as _;
    if !std::io::stdin().is_terminal() {
        return false;
    }
    err(question);
    let mut answer = String::new();
    if std::io::stdin().read_line(&mut answer).is_err() {
        return false;
    }
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

/// What became of a session worktree merged back with N uncommitted changes left in it (at
/// PATH) and IGNORED ignored paths: removed, or with PERSISTS (`worktree.persist`) cleaned
/// and kept as a spare (said before); ignored files (build output and the like) go either
/// way, and are named; a worktree with uncommitted changes is kept.
fn worktree_fate(persists: bool, ignored: usize, n: usize, path: &std::path::Path) -> String {
    let gone = if persists {
        "its worktree is cleaned for the next job"
    } else {
        "its worktree is removed"
    };
    if n == 0 && ignored > 0 {
        format!(
            "{gone}, with {} (build output and the like) that {} only there",
            count(ignored, "ignored path"),
            if ignored == 1 { "was" } else { "were" }
        )
    } else if n == 0 {
        gone.to_owned()
    } else {
        format!(
            "{} {} left in {} (only commits come back; commit in a step with `commit_required` or `auto_commit`), so it is kept until `prodigy worktree clean`",
            count(n, "uncommitted change"),
            if n == 1 { "is" } else { "are" },
            path.display()
        )
    }
}
