//! `prodigy worktree ls|clean`: the worktrees runs left under
//! `$PRODIGY_HOME/worktrees/{repo}/` (kept after a failure, a declined merge, uncommitted
//! changes, or a merge conflict parked in the DLQ).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use prodigy_runtime::store::{Layout, is_running};
use prodigy_runtime::worktree::{self, BranchFate, Listed};

use crate::{err, exit_code, out};
use prodigy_runtime::progress::count;

/// `prodigy worktree`.
#[derive(clap::Subcommand)]
pub(crate) enum WorktreeCommand {
    /// List the worktrees runs left for the repository in the current directory: session
    /// worktrees (`{session_id}`) and map agents' (`{session_id}-agent-N`), with their
    /// branch, uncommitted changes and commits not yet merged into the current branch.
    #[command(alias = "list")]
    Ls {
        /// One JSON object per worktree, in an array.
        #[arg(long)]
        json: bool,
    },
    /// Remove the worktrees of runs that are not running, with their uncommitted changes.
    /// A branch goes too when it is merged into the current branch; a branch with unmerged
    /// commits is kept (the output names it; `git branch -D` drops it).
    Clean {
        /// Say what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

fn located() -> Result<(Layout, PathBuf), u8> {
    let project = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let Some((repo, _)) = worktree::repository(&project) else {
        err(&format!(
            "error: {} is not in a git repository with a commit\n",
            project.display()
        ));
        return Err(exit_code::USAGE);
    };
    Ok((crate::run::layout(&project), repo))
}

/// Whether the session or job owning PATH is running (its lock is held), whatever directory
/// it was started from.
fn running(layout: &Layout, path: &Path) -> bool {
    is_running(&layout.home, &worktree::owner(path))
}

fn describe(found: &Listed, busy: bool) -> String {
    let mut state = Vec::new();
    if busy {
        state.push("running".to_owned());
    }
    if found.uncommitted > 0 {
        state.push(count(found.uncommitted, "uncommitted change"));
    }
    if found.unmerged_commits > 0 {
        state.push(count(found.unmerged_commits, "unmerged commit"));
    }
    if state.is_empty() {
        state.push("clean".to_owned());
    }
    state.join(", ")
}

pub(crate) fn worktree(command: &WorktreeCommand) -> u8 {
    let (layout, repo) = match located() {
        Ok(x) => x,
        Err(code) => return code,
    };
    let found = worktree::list(&layout, &repo);
    match command {
        WorktreeCommand::Ls { json } => {
            if *json {
                let rows: Vec<serde_json::Value> = found
                    .iter()
                    .map(|f| {
                        let mut row = serde_json::to_value(f).unwrap_or_default();
                        row["running"] = running(&layout, &f.path).into();
                        row
                    })
                    .collect();
                out(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(&rows).unwrap_or_default()
                ));
                return exit_code::OK;
            }
            if found.is_empty() {
                err(&format!(
                    "no worktrees under {}\n",
                    worktree::worktrees_dir(&layout).display()
                ));
                return exit_code::OK;
            }
            let mut text = String::new();
            for f in &found {
                let _ = writeln!(
                    text,
                    "{}\n    branch {}; {}",
                    f.path.display(),
                    f.branch.as_deref().unwrap_or("(detached)"),
                    describe(f, running(&layout, &f.path))
                );
            }
            out(&text);
            exit_code::OK
        }
        WorktreeCommand::Clean { dry_run } => {
            let result = crate::run::block_on(async {
                let (mut removed, mut skipped) = (0, 0);
                for f in &found {
                    if running(&layout, &f.path) {
                        skipped += 1;
                        err(&format!(
                            "skipped {}: its run is still going\n",
                            f.path.display()
                        ));
                        continue;
                    }
                    let what = describe(f, false);
                    if *dry_run {
                        err(&format!("would remove {} ({what})\n", f.path.display()));
                        removed += 1;
                        continue;
                    }
                    let fate = worktree::clean(&repo, f).await;
                    let branch = f.branch.as_deref().unwrap_or_default();
                    let note = match fate {
                        BranchFate::Deleted => format!("; branch `{branch}` deleted"),
                        BranchFate::Kept(n) => format!(
                            "; branch `{branch}` kept: {} not merged (`git branch -D {branch}` drops {})",
                            match n {
                                1 => "1 commit is".to_owned(),
                                n => format!("{n} commits are"),
                            },
                            if n == 1 { "it" } else { "them" }
                        ),
                        BranchFate::None => String::new(),
                    };
                    err(&format!("removed {} ({what}){note}\n", f.path.display()));
                    removed += 1;
                }
                let verb = if *dry_run { "would remove" } else { "removed" };
                err(&format!(
                    "{verb} {}; {skipped} in use\n",
                    count(removed, "worktree")
                ));
            });
            match result {
                Ok(()) => exit_code::OK,
                Err(code) => code,
            }
        }
    }
}
