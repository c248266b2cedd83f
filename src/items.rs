//! `prodigy items --run-setup`: a job's `setup` run in a throwaway worktree of the project,
//! then the map input pipeline over what it wrote (docs/mapreduce.md, "`prodigy items`"). The worktree
//! is removed whatever happens: success, a failed setup, Ctrl-C or SIGTERM.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use prodigy_compiler::plan::Plan;
use prodigy_runtime::layout::Layout;
use prodigy_runtime::runner::{Inputs, Options, Runner};

use crate::{err, exit_code};

/// A detached worktree of the project's repository in a temporary directory, removed
/// (worktree and directory) when dropped.
struct Throwaway {
    repo: PathBuf,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Throwaway {
    /// A worktree of the repository holding PROJECT at its `HEAD`.
    fn create(project: &Path) -> Result<Self, String> {
        let top = git(project, &["rev-parse", "--show-toplevel"])
            .map_err(|e| format!("`--run-setup` runs `setup` in a throwaway git worktree, and {} is not in a git repository with a commit: {e}", project.display()))?;
        let repo = PathBuf::from(top.trim());
        let dir = tempfile::Builder::new()
            .prefix("prodigy-items-")
            .tempdir()
            .map_err(|e| format!("cannot make a temporary directory: {e}"))?;
        let path = dir.path().join("worktree");
        let text = path.to_string_lossy().into_owned();
        git(
            &repo,
            &["worktree", "add", "--quiet", "--detach", &text, "HEAD"],
        )
        .map_err(|e| format!("cannot make a throwaway worktree: {e}"))?;
        Ok(Throwaway {
            repo,
            path,
            _dir: dir,
        })
    }

    /// Where PROJECT (in the repository) is in the worktree.
    fn project(&self, project: &Path) -> PathBuf {
        let canonical = project
            .canonicalize()
            .unwrap_or_else(|_| project.to_owned());
        let repo = self
            .repo
            .canonicalize()
            .unwrap_or_else(|_| self.repo.clone());
        canonical
            .strip_prefix(&repo)
            .ok()
            .filter(|rel| !rel.as_os_str().is_empty())
            .map_or_else(|| self.path.clone(), |rel| self.path.join(rel))
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        let text = self.path.to_string_lossy().into_owned();
        if let Err(e) = git(&self.repo, &["worktree", "remove", "--force", &text]) {
            err(&format!(
                "warning: cannot remove the throwaway worktree {}: {e}\n",
                self.path.display()
            ));
        }
    }
}

/// Runs git in DIR: its standard output, or its standard error.
fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `git`: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// The items of PLAN (read from WORKFLOW, whose text is TEXT) after its `setup` ran in a
/// throwaway worktree: setup's lines and output on stderr, the items on stdout.
pub(crate) fn run_setup(
    workflow: &Path,
    text: &str,
    plan: Plan,
) -> Result<Vec<serde_json::Value>, u8> {
    let project = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let throwaway = Throwaway::create(&project).map_err(|e| {
        err(&format!("error: {e}\n"));
        exit_code::USAGE
    })?;
    let place = throwaway.project(&project);
    let (repo, worktree) = (throwaway.repo.clone(), throwaway.path.clone());
    crate::note(&format!(
        "items: running `setup` in a throwaway worktree, {}\n",
        place.display()
    ));
    let opts = Options::new(
        workflow.to_owned(),
        text,
        place,
        Layout::of_project(&project),
        Inputs::default(),
    );
    let reporter = Arc::new(crate::report::Terminal::on_stderr(
        u8::from(!crate::quiet()),
        crate::quiet(),
    ));
    let (result, signal) = crate::run::block_on(async move {
        let (cancel, signal) = crate::run::watch_signals();
        let runner = Runner::unrecorded(Arc::new(plan), opts, cancel).report_to(reporter);
        let items = match runner.initial_vars().await {
            // The workflow's `worktree:` prepares this worktree as it does a run's.
            Ok(mut vars) => match runner
                .prepare_worktree_of(&repo, &worktree, false, &mut vars)
                .await
            {
                Ok(()) => prodigy_runtime::mapreduce::setup_and_items(&runner, vars)
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        (items, signal.load(std::sync::atomic::Ordering::SeqCst))
    })?;
    // Removed before the items are printed, and before prodigy exits on an error or signal.
    drop(throwaway);
    match (result, signal) {
        (Ok(items), 0) => Ok(items),
        (Err(e), 0) => {
            err(&format!("error: {e}\n"));
            Err(exit_code::PROBLEMS)
        }
        (_, signal) => Err(signal),
    }
}
