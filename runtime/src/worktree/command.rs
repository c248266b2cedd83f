//! Running git, as every worktree operation and the container sandbox do: one set of options
//! (no optional locks, no fsmonitor, no automatic gc), waiting on a held ref lock, and the
//! error a failed command is. Part of the execution layer (ARCHITECTURE.md, "Layers"):
//! it names nothing of the run.

use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// What every git command prodigy runs is given. No file system monitor daemon per
/// worktree, whatever the user's configuration. No threads to stat the index's files
/// either: beside busy agents they cost more CPU than they save time (`git status` in a
/// worktree of 20,000 files: 25 ms of CPU instead of 35; docs/performance.md, "Big
/// repositories"). No optional locks: a `git status` that only looks does not write the
/// index back (12 ms of a release's 40 in a worktree of 20,000 files).
pub(crate) const GIT_OPTIONS: [&str; 9] = [
    "--no-optional-locks",
    "-c",
    "core.quotePath=false",
    "-c",
    "gc.auto=0",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.preloadIndex=false",
];

/// Runs git in DIR: its exit code, standard output and standard error.
///
/// A git whose caller stops waiting (a run interrupted mid-merge) is left to finish, never
/// killed: git killed while it changes refs leaves their lock files behind (`packed-refs.lock`),
/// and every later ref change in the repository fails until someone removes them.
pub(crate) async fn git_output(
    dir: &Path,
    args: &[&str],
) -> Result<(Option<i32>, String, String), WorktreeError> {
    let out = tokio::process::Command::new("git")
        .args(GIT_OPTIONS)
        .args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(false)
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
pub(crate) async fn git_retrying(dir: &Path, args: &[&str]) -> Result<String, WorktreeError> {
    let mut delay = Duration::from_millis(20);
    let mut tries = 0;
    loop {
        match git(dir, args).await {
            Err(WorktreeError::Git { stderr, .. })
                if tries < 8 && stderr.contains(".lock") && stderr.contains("exists") =>
            {
                tries += 1;
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            other => return other,
        }
    }
}

/// Runs git in DIR and waits for it, with STDIN written to it while its output is read:
/// its standard output, `None` when it fails.
pub(crate) fn git_bytes(dir: &Path, args: &[&str], stdin: Option<Vec<u8>>) -> Option<Vec<u8>> {
    use std::process::Stdio;
    let mut child = std::process::Command::new("git")
        .args(GIT_OPTIONS)
        .args(args)
        .current_dir(dir)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let writer = match (stdin, child.stdin.take()) {
        (Some(bytes), Some(mut pipe)) => Some(std::thread::spawn(move || {
            std::io::Write::write_all(&mut pipe, &bytes).is_ok()
        })),
        _ => None,
    };
    let out = child.wait_with_output().ok()?;
    let written = writer.is_none_or(|w| w.join().unwrap_or(false));
    (out.status.success() && written).then_some(out.stdout)
}

pub(crate) fn git_sync(dir: &Path, args: &[&str]) -> Option<String> {
    let out = git_bytes(dir, args, None)?;
    Some(String::from_utf8_lossy(&out).trim().to_owned())
}

/// The oldest git that merges map agents' work: `git merge-tree --write-tree` came with
/// git 2.38.
pub const MERGE_TREE_GIT: (u32, u32) = (2, 38);

/// The version of `git` on PATH as (major, minor), from `git version` ("git version
/// 2.47.3"); `None` when git cannot be run or says something else.
/// Asked once per process.
pub fn git_version() -> Option<(u32, u32)> {
    static VERSION: std::sync::OnceLock<Option<(u32, u32)>> = std::sync::OnceLock::new();
    *VERSION.get_or_init(|| parse_git_version(&git_sync(Path::new("."), &["version"])?))
}

pub(crate) fn parse_git_version(out: &str) -> Option<(u32, u32)> {
    let version = out.trim().strip_prefix("git version ")?;
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}
