//! Reading `map.input` (docs/language.md §7) within a bound: a file only when it is a regular
//! file of at most [`MAX_INPUT_SIZE`] bytes, a command's standard output only up to the same
//! bound. A device such as `/dev/zero` is never read without end, and a FIFO such as
//! `/dev/stdin` on a pipe never blocks the run.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::sync::watch;

use crate::exec::Command;

/// The largest map input prodigy reads, from a file or from a command's standard output:
/// 1 GiB. A map input may be much larger than a workflow file (whose bound is
/// [`prodigy_plan::support::MAX_FILE_SIZE`]), but every item is kept in memory.
pub const MAX_INPUT_SIZE: u64 = 1024 * 1024 * 1024;

/// How much of an input command's standard error is kept for the message when it fails.
const STDERR_KEPT: u64 = 64 * 1024;

/// Why the map input could not be read: its file, or its command's output.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum InputError {
    /// The file is larger than the bound.
    #[error(
        "the map input file `{}` is larger than {}, the most prodigy reads",
        path.display(),
        size(*limit)
    )]
    FileTooLarge {
        /// The file.
        path: PathBuf,
        /// The bound, in bytes.
        limit: u64,
    },
    /// The path names a device, a FIFO or a directory.
    #[error(
        "the map input `{}` is {what}, not a regular file; write the items to a file, or give a command that prints them",
        path.display()
    )]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// "a directory", "a FIFO", ...
        what: &'static str,
    },
    /// The file could not be read.
    #[error("cannot read the map input file `{}`: {source}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not UTF-8 text.
    #[error("the map input file `{}` is not UTF-8 text{}", path.display(), utf8_detail(source.as_ref()))]
    FileNotUtf8 {
        /// The file.
        path: PathBuf,
        /// Where it stops being UTF-8, when known.
        source: Option<std::string::FromUtf8Error>,
    },
    /// The command could not be started.
    #[error("the map input command `{text}`: could not start `{program}`: {source}")]
    Spawn {
        /// The command as written.
        text: String,
        /// The program run.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// The command printed more than the bound.
    #[error(
        "the map input command `{text}` printed more than {}, the most prodigy reads; write the items to a file or select fewer",
        size(*limit)
    )]
    TooMuchOutput {
        /// The command as written.
        text: String,
        /// The bound, in bytes.
        limit: u64,
    },
    /// The command ran past its timeout.
    #[error("the map input command `{text}` timed out after {}", humantime::format_duration(*after))]
    TimedOut {
        /// The command as written.
        text: String,
        /// The timeout.
        after: Duration,
    },
    /// The run was interrupted while the command ran.
    #[error("the map input command `{text}` was interrupted")]
    Interrupted {
        /// The command as written.
        text: String,
    },
    /// The command exited non-zero or was killed.
    #[error("the map input command `{text}` failed ({}): {}", ended(*code), stderr.trim())]
    Failed {
        /// The command as written.
        text: String,
        /// Its exit code (`None`: a signal).
        code: Option<i32>,
        /// What it printed on standard error (bounded).
        stderr: String,
    },
    /// The command printed text that is not UTF-8.
    #[error("the map input command `{text}` printed text that is not UTF-8: {source}")]
    CommandNotUtf8 {
        /// The command as written.
        text: String,
        /// Where it stops being UTF-8.
        source: std::string::FromUtf8Error,
    },
}

/// `: DETAIL` after "is not UTF-8 text", when the detail is known.
fn utf8_detail(source: Option<&std::string::FromUtf8Error>) -> String {
    source.map(|e| format!(": {e}")).unwrap_or_default()
}

/// How a command ended, for [`InputError::Failed`]: `exited CODE`, or killed by a signal.
fn ended(code: Option<i32>) -> String {
    code.map_or_else(
        || "was killed by a signal".to_owned(),
        |c| format!("exited {c}"),
    )
}

/// Reads a map input file: a regular file of at most `limit` bytes, as UTF-8 text.
///
/// # Errors
///
/// A message naming the path and why it was not read: it does not exist, it is a device, a
/// FIFO or a directory, it is larger than `limit`, or it is not UTF-8.
pub fn read_file(path: &Path, limit: u64) -> Result<String, InputError> {
    use prodigy_plan::support::{LoadError, read_regular};
    let path = path.to_path_buf();
    let bytes = read_regular(&path, limit).map_err(|e| match e {
        LoadError::TooLarge { limit, .. } => InputError::FileTooLarge {
            path: path.clone(),
            limit,
        },
        LoadError::NotRegular { what, .. } => InputError::NotRegular {
            path: path.clone(),
            what,
        },
        LoadError::Io { source, .. } => InputError::Unreadable {
            path: path.clone(),
            source,
        },
        LoadError::NotUtf8 { .. } => InputError::FileNotUtf8 {
            path: path.clone(),
            source: None,
        },
    })?;
    String::from_utf8(bytes).map_err(|e| InputError::FileNotUtf8 {
        path,
        source: Some(e),
    })
}

/// A byte count for a message: `1 GiB`, `64 KiB`, else bytes.
fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

pub use prodigy_grammar::pipeline::names_a_file;

/// Runs the map input command TEXT (`sh -c`) in DIR with ENV added to the environment, as a
/// job does: for at most 5 minutes, then SIGTERM, GRACE and SIGKILL; its standard output
/// within [`MAX_INPUT_SIZE`].
///
/// # Errors
///
/// As [`command_output`]'s: the command could not start, failed, printed too much, timed
/// out or was cancelled.
pub async fn run_command(
    text: &str,
    dir: &Path,
    env: Vec<(String, String)>,
    grace: Duration,
    cancel: &mut watch::Receiver<bool>,
) -> Result<String, InputError> {
    let (program, args) = crate::exec::shell(text);
    let command = Command {
        program,
        args,
        cwd: dir.to_owned(),
        env,
        clear_env: false,
        timeout: Some(Duration::from_mins(5)),
        grace,
        output_limit: 0,
        spill: None,
        mask: None,
        stdin: None,
        agent: None,
    };
    command_output(&command, text, cancel, MAX_INPUT_SIZE).await
}

/// Reads PIPE to its end, keeping at most `keep` bytes; when `stop` is set, it stops reading
/// once it holds more than `keep` (so the caller sees `keep + 1` bytes and knows).
async fn read_pipe<R: AsyncRead + Unpin>(pipe: Option<R>, keep: u64, stop: bool, kept: Kept) {
    let Some(mut pipe) = pipe else { return };
    let mut chunk = [0u8; 8192];
    let cap = usize::try_from(keep.saturating_add(1)).unwrap_or(usize::MAX);
    while let Ok(n) = pipe.read(&mut chunk).await {
        if n == 0 {
            break;
        }
        let mut kept = crate::lock(&kept);
        let room = cap.saturating_sub(kept.len());
        kept.extend_from_slice(chunk.get(..n.min(room)).unwrap_or_default());
        if stop && kept.len() >= cap {
            break;
        }
    }
}

/// What a pipe's reader has kept so far: it outlives the reader, so what arrived before a
/// reader is given up on (a background process holding the pipe open) is not lost.
type Kept = std::sync::Arc<std::sync::Mutex<Vec<u8>>>;

/// Everything KEPT holds, taken out.
fn taken(kept: &Kept) -> Vec<u8> {
    std::mem::take(&mut *crate::lock(kept))
}

/// Waits a moment for TASK to end (a background process may hold its pipe open), then gives
/// up on it.
async fn settle(task: tokio::task::JoinHandle<()>) {
    let abort = task.abort_handle();
    if tokio::time::timeout(Duration::from_millis(200), task)
        .await
        .is_err()
    {
        abort.abort();
    }
}

/// Runs the map input command COMMAND (shown as TEXT) and returns its standard output, of at
/// most `limit` bytes. A command that prints more is killed with its process group as soon as
/// it passes the bound.
///
/// # Errors
///
/// A message naming the command when it cannot start, exits non-zero (with its standard
/// error), prints more than `limit` bytes, times out or is cancelled, or prints text that is
/// not UTF-8.
pub(crate) async fn command_output(
    command: &Command,
    text: &str,
    cancel: &mut watch::Receiver<bool>,
    limit: u64,
) -> Result<String, InputError> {
    let mut process = tokio::process::Command::new(&command.program);
    process
        .args(&command.args)
        .current_dir(&command.cwd)
        .envs(command.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    crate::reap::mark(&mut process);
    let mut child = process.spawn().map_err(|source| InputError::Spawn {
        text: text.to_owned(),
        program: command.program.clone(),
        source,
    })?;
    let pid = child.id().and_then(|id| i32::try_from(id).ok());
    let (out_kept, err_kept) = (Kept::default(), Kept::default());
    let mut out_task = tokio::spawn(read_pipe(
        child.stdout.take(),
        limit,
        true,
        out_kept.clone(),
    ));
    let err_task = tokio::spawn(read_pipe(
        child.stderr.take(),
        STDERR_KEPT,
        false,
        err_kept.clone(),
    ));
    let too_much = || InputError::TooMuchOutput {
        text: text.to_owned(),
        limit,
    };
    let timeout = command.timeout.unwrap_or(Duration::MAX);
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut stdout: Option<Vec<u8>> = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.ok(),
            _ = &mut out_task, if stdout.is_none() => {
                let bytes = taken(&out_kept);
                if bytes.len() as u64 > limit {
                    crate::exec::signal_group(pid, nix::sys::signal::Signal::SIGKILL);
                    return Err(too_much());
                }
                stdout = Some(bytes);
            }
            () = &mut deadline => {
                // SIGTERM, the grace period, then SIGKILL, as for any command.
                crate::exec::terminate(&mut child, pid, command.grace).await;
                return Err(InputError::TimedOut {
                    text: text.to_owned(),
                    after: timeout,
                });
            }
            () = crate::exec::cancelled(cancel) => {
                crate::exec::terminate(&mut child, pid, command.grace).await;
                return Err(InputError::Interrupted {
                    text: text.to_owned(),
                });
            }
        }
    };
    let stdout = if let Some(bytes) = stdout {
        bytes
    } else {
        // A background process may hold the pipe open: what arrived until soon after the end.
        settle(out_task).await;
        taken(&out_kept)
    };
    if stdout.len() as u64 > limit {
        return Err(too_much());
    }
    let code = status.and_then(|s| s.code());
    if code != Some(0) {
        settle(err_task).await;
        let stderr = taken(&err_kept);
        return Err(InputError::Failed {
            text: text.to_owned(),
            code,
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        });
    }
    String::from_utf8(stdout).map_err(|source| InputError::CommandNotUtf8 {
        text: text.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(text: &str) -> Command {
        let (program, args) = crate::exec::shell(text);
        Command {
            program,
            args,
            cwd: std::env::temp_dir(),
            env: Vec::new(),
            clear_env: false,
            timeout: Some(Duration::from_secs(20)),
            grace: Duration::from_secs(1),
            output_limit: crate::exec::DEFAULT_OUTPUT_LIMIT,
            spill: None,
            mask: None,
            stdin: None,
            agent: None,
        }
    }

    async fn run(text: &str, limit: u64) -> Result<String, InputError> {
        let (_tx, mut rx) = watch::channel(false);
        command_output(&sh(text), text, &mut rx, limit).await
    }

    #[tokio::test]
    async fn a_command_printing_without_end_is_stopped_at_the_bound() {
        let err = run("cat /dev/zero", 1 << 20).await.unwrap_err().to_string();
        assert!(
            err.contains("`cat /dev/zero` printed more than 1 MiB"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn output_within_the_bound_is_kept_whole() {
        assert_eq!(run("printf 'a\\nb\\n'", 4).await.unwrap(), "a\nb\n");
        let err = run("printf 'a\\nb\\n'", 3).await.unwrap_err().to_string();
        assert!(err.contains("printed more than 3 bytes"), "{err}");
    }

    #[tokio::test]
    async fn what_a_command_printed_is_kept_when_a_background_process_holds_the_pipe() {
        let out = run("printf '[1]'; sleep 5 &", 100).await.unwrap();
        assert_eq!(out, "[1]");
    }

    #[tokio::test]
    async fn a_failing_command_says_how_it_ended_and_what_it_printed() {
        let err = run("echo oops >&2; exit 4", 100)
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "the map input command `echo oops >&2; exit 4` failed (exited 4): oops"
        );
    }

    #[test]
    fn special_files_are_refused_unread() {
        let err = read_file(Path::new("/dev/zero"), MAX_INPUT_SIZE)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "the map input `/dev/zero` is a character device, not a regular file; write the items to a file, or give a command that prints them"
        );
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("items.txt");
        std::fs::write(&big, "0123456789").unwrap();
        let err = read_file(&big, 4).unwrap_err().to_string();
        assert!(
            err.ends_with("is larger than 4 bytes, the most prodigy reads"),
            "{err}"
        );
        let missing = read_file(&dir.path().join("none.json"), 4)
            .unwrap_err()
            .to_string();
        assert!(missing.contains("none.json"), "{missing}");
    }
}
