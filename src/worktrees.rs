//! `prodigy worktree ls|clean`: the worktrees runs left under
//! `$PRODIGY_HOME/worktrees/{repo}/` (kept after a failure, a declined merge, uncommitted
//! changes, or a merge conflict parked in the DLQ).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use prodigy_runtime::layout::Layout;
use prodigy_runtime::store::is_running;
use prodigy_runtime::worktree::{self, BranchFate, Listed};

use crate::{err, exit_code, out};
use prodigy_runtime::progress::count;

/// `prodigy worktree`.
#[derive(clap::Subcommand)]
pub(crate) enum WorktreeCommand {
    /// List the worktrees runs left for the repository in the current directory: session
    /// worktrees (`{session_id}`), map agents' (`{session_id}-agent-N`) and spares kept for
    /// the next job (`spare-N`, `worktree.persist`), with their branch, uncommitted changes
    /// and commits not yet merged into the current branch.
    #[command(alias = "list")]
    Ls {
        /// One JSON object per worktree, in an array.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        quiet: crate::Quiet,
    },
    /// Remove the worktrees of runs that are not running, and the `prodigy-*` branches of
    /// runs that ended. Worktrees with uncommitted changes are removed only when you say so:
    /// on a terminal it asks, elsewhere it needs `-y` (without, they are kept and named).
    /// A branch goes when it is merged into the current branch (an agent's: or into its
    /// session's branch); a branch with unmerged commits is kept (the output names it;
    /// `git branch -D` drops it).
    Clean {
        /// Say what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Remove worktrees with uncommitted changes without asking.
        #[arg(short = 'y', long)]
        yes: bool,
        #[command(flatten)]
        quiet: crate::Quiet,
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
    if Layout::is_spare(&found.path) {
        state.push("a spare for the next job (`worktree.persist`)".to_owned());
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
        WorktreeCommand::Ls { json, .. } => {
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
            let stray = worktree::stray_branches(&repo);
            if found.is_empty() && stray.is_empty() {
                crate::note(&format!(
                    "no worktrees under {}\n",
                    layout.worktrees_dir().display()
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
                for file in f.uncommitted_files.iter().take(SHOWN_FILES) {
                    let _ = writeln!(text, "      {file}");
                }
                if f.uncommitted_files.len() > SHOWN_FILES {
                    let _ = writeln!(
                        text,
                        "      … and {} more",
                        f.uncommitted_files.len() - SHOWN_FILES
                    );
                }
            }
            if !stray.is_empty() {
                let _ = writeln!(
                    text,
                    "{} without a worktree:",
                    count(stray.len(), "`prodigy-*` branch")
                );
                for b in &stray {
                    let state = if is_running(&layout.home, &b.owner) {
                        "running".to_owned()
                    } else if b.unmerged_commits > 0 {
                        count(b.unmerged_commits, "unmerged commit")
                    } else {
                        "merged".to_owned()
                    };
                    let _ = writeln!(text, "    {}; {state}", b.branch);
                }
            }
            out(&prodigy_runtime::progress::visible(&text));
            exit_code::OK
        }
        WorktreeCommand::Clean { dry_run, yes, .. } => {
            clean(&layout, &repo, &found, *dry_run, *yes)
        }
    }
}

/// How many uncommitted files `worktree ls` names per worktree.
const SHOWN_FILES: usize = 10;

/// `prodigy worktree clean`: the worktrees of runs not running (those with uncommitted
/// changes only when the user says so), then the `prodigy-*` branches no worktree has,
/// of runs not running, that are merged.
fn clean(layout: &Layout, repo: &Path, found: &[Listed], dry_run: bool, yes: bool) -> u8 {
    let idle: Vec<&Listed> = found
        .iter()
        .filter(|f| {
            let busy = running(layout, &f.path);
            if busy {
                crate::note(&format!(
                    "skipped {}: its run is still going\n",
                    f.path.display()
                ));
            }
            !busy
        })
        .collect();
    let skipped = found.len() - idle.len();
    let dirty: Vec<&Listed> = idle.iter().copied().filter(|f| f.uncommitted > 0).collect();
    let drop_dirty = dirty.is_empty()
        || dry_run
        || yes
        || {
            let files: usize = dirty.iter().map(|f| f.uncommitted).sum();
            crate::run::ask(&format!(
                "{} {} {} that no commit has (`prodigy worktree ls` names them); remove {} all the same? [y/N] ",
                count(dirty.len(), "worktree"),
                if dirty.len() == 1 { "holds" } else { "hold" },
                count(files, "uncommitted change"),
                if dirty.len() == 1 { "it" } else { "them" },
            ))
        };
    let result = crate::run::block_on(async {
        let (mut removed, mut kept) = (0, 0);
        // Branches named already (kept with a worktree, or kept unmerged after it).
        let mut named: Vec<&str> = Vec::new();
        for f in idle {
            let what = describe(f, false);
            if f.uncommitted > 0 && !drop_dirty {
                kept += 1;
                named.extend(f.branch.as_deref());
                err(&format!(
                    "kept {} ({what}): see them with `prodigy worktree ls`; `worktree clean -y` removes them\n",
                    f.path.display()
                ));
                continue;
            }
            if dry_run {
                err(&format!("would remove {} ({what})\n", f.path.display()));
                removed += 1;
                continue;
            }
            let fate = worktree::clean(repo, f).await;
            let branch = f.branch.as_deref().unwrap_or_default();
            if let BranchFate::Kept(_) = fate {
                named.push(branch);
            }
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
        let (deleted, unmerged) = clean_branches(layout, repo, dry_run, &named).await;
        let verb = if dry_run { "would remove" } else { "removed" };
        let mut line = format!(
            "{verb} {} and {}; {skipped} in use",
            count(removed, "worktree"),
            count(deleted, "branch")
        );
        if kept > 0 {
            let _ = write!(
                line,
                "; {} kept for {} uncommitted changes",
                count(kept, "worktree"),
                if kept == 1 { "its" } else { "their" }
            );
        }
        if unmerged > 0 {
            let _ = write!(
                line,
                "; {} with unmerged commits kept",
                count(unmerged, "branch")
            );
        }
        err(&format!("{line}\n"));
        kept
    });
    match result {
        Ok(0) => exit_code::OK,
        Ok(_) => exit_code::PROBLEMS,
        Err(code) => code,
    }
}

/// Deletes (or, on a dry run, counts) the merged `prodigy-*` branches that no worktree has
/// and whose run is not running (but for those in NAMED, which the worktrees' lines named);
/// names the unmerged ones. Returns how many were (or would
/// be) deleted and how many are kept for their unmerged commits.
async fn clean_branches(
    layout: &Layout,
    repo: &Path,
    dry_run: bool,
    named: &[&str],
) -> (usize, usize) {
    let stray: Vec<_> = worktree::stray_branches(repo)
        .into_iter()
        .filter(|b| !is_running(&layout.home, &b.owner) && !named.contains(&b.branch.as_str()))
        .collect();
    let mut merged = Vec::new();
    let mut unmerged = 0;
    for b in &stray {
        if b.unmerged_commits == 0 {
            merged.push(b.branch.as_str());
        } else {
            unmerged += 1;
            err(&format!(
                "kept branch `{}`: {} not merged (`git branch -D {}` drops {})\n",
                b.branch,
                count(b.unmerged_commits, "commit"),
                b.branch,
                if b.unmerged_commits == 1 {
                    "it"
                } else {
                    "them"
                }
            ));
        }
    }
    if dry_run {
        return (merged.len(), unmerged);
    }
    (worktree::delete_branches(repo, &merged).await, unmerged)
}
