//! Executors: run a shell command, the Claude CLI, or a file write, and report what happened.
//!
//! Every command runs in its own process group. A timeout or a cancellation sends SIGTERM
//! to the whole group, waits a grace period, then sends SIGKILL, so no child outlives it.
//! Every command carries its run's mark ([`crate::reap`]), so that what it started is ended
//! even when prodigy itself is killed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use crate::machine::Exit;

/// What to run.
#[derive(Clone)]
pub struct Command {
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// The working directory.
    pub cwd: PathBuf,
    /// Variables added to the environment.
    pub env: Vec<(String, String)>,
    /// Start from an empty environment (plus `PATH` and `env`).
    pub clear_env: bool,
    /// Kill the process group after this long.
    pub timeout: Option<Duration>,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// How much of each stream is kept in memory: the last this many bytes.
    pub output_limit: usize,
    /// Where standard output goes whole once it outgrows `output_limit`.
    pub spill: Option<PathBuf>,
    /// Masks secrets in what goes to the spill.
    pub mask: Option<crate::logs::Mask>,
    /// Written to standard input, which is then closed (`None`: standard input is empty).
    /// A Claude call's prompt goes this way, never as an argument, because any local user
    /// reads a process's arguments in `/proc/PID/cmdline` (docs/claude.md).
    pub stdin: Option<String>,
    /// The map agent (`agent-N`) whose command this is: its processes, and whatever they
    /// leave running, carry the agent's mark and are ended before its worktree serves
    /// another item ([`crate::reap::end_item`]).
    pub agent: Option<String>,
}

/// What a command produced.
#[derive(Clone, Debug, Default)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent facts about how a process ended"
)]
pub struct Output {
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Both streams in the order their chunks arrived, for a process that ran (`None`:
    /// standard output followed by standard error).
    pub interleaved: Option<String>,
    /// Exit code, if it exited.
    pub code: Option<i32>,
    /// Killed by the timeout.
    pub timed_out: bool,
    /// Killed by a cancellation.
    pub cancelled: bool,
    /// Could not start; the reason is in `stderr`.
    pub spawn_error: bool,
    /// Wall time.
    pub duration: Duration,
    /// What a Claude call's events said.
    pub claude: Option<Box<crate::claude::kinds::Call>>,
    /// Standard output was shown as it arrived.
    pub streamed: bool,
}

impl Output {
    /// Standard output and standard error interleaved as the command wrote them
    /// (`${shell.output}`).
    pub fn combined(&self) -> std::borrow::Cow<'_, str> {
        match &self.interleaved {
            Some(text) => std::borrow::Cow::Borrowed(text),
            None => std::borrow::Cow::Owned(format!("{}{}", self.stdout, self.stderr)),
        }
    }

    /// The failure as the machine sees it.
    pub fn exit(&self) -> Exit {
        Exit {
            code: self.code,
            timed_out: self.timed_out,
            spawn_error: self.spawn_error || self.cancelled,
            text: format!("{}{}", self.stdout, self.stderr),
            claude: self.claude_error(),
        }
    }

    /// Whether the command succeeded: it exited 0 and, for a Claude call, its events say
    /// it succeeded.
    pub fn success(&self) -> bool {
        self.code == Some(0)
            && !self.timed_out
            && !self.spawn_error
            && !self.cancelled
            && self.claude_error().is_none()
    }

    /// Why a Claude call failed.
    pub fn claude_error(&self) -> Option<crate::claude::kinds::ErrorKind> {
        self.claude.as_ref().and_then(|c| c.verdict.kind)
    }

    /// What went wrong, for `${error.message}` and the failure line: Claude's own message
    /// for a Claude call, else standard error.
    pub fn failure_message(&self) -> &str {
        match &self.claude {
            Some(call) if call.verdict.kind.is_some() => call.verdict.message.trim_end(),
            _ => self.stderr.trim_end(),
        }
    }

    /// A failure that happened before any process ran (an undefined variable, a bad path).
    pub fn error(message: impl Into<String>) -> Self {
        Output {
            stderr: message.into(),
            spawn_error: true,
            ..Output::default()
        }
    }
}

/// The shell command `sh -c TEXT`.
pub fn shell(text: &str) -> (String, Vec<String>) {
    ("sh".to_owned(), vec!["-c".to_owned(), text.to_owned()])
}

/// The variable [`shell_from_env`] reads its script from.
pub const SCRIPT_ENV: &str = "PRODIGY_SCRIPT";

/// `sh -c` running the script in `$PRODIGY_SCRIPT` ([`SCRIPT_ENV`]), for a script that holds
/// a secret: its text stays off the command line, which every local user can read. The
/// variable is unset before the script runs, so what it starts does not inherit it.
pub fn shell_from_env() -> (String, Vec<String>) {
    (
        "sh".to_owned(),
        vec![
            "-c".to_owned(),
            format!(
                "__prodigy_script=\"${SCRIPT_ENV}\"; unset {SCRIPT_ENV}; eval \"$__prodigy_script\""
            ),
        ],
    )
}

/// The executable file PROGRAM names: PROGRAM itself when it holds a `/` (a path, relative to
/// the current directory or absolute), else the first executable file of that name in a
/// directory of `PATH`, as the shell would find it. A file without execute permission, or a
/// directory, does not count: starting it would fail.
pub fn find_executable(program: &str) -> Option<PathBuf> {
    find_in(program, std::env::var_os("PATH").as_deref())
}

/// [`find_executable`] with PATH the value of `PATH`.
fn find_in(program: &str, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let executable = |path: &Path| {
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = PathBuf::from(program);
        return executable(&path).then_some(path);
    }
    std::env::split_paths(path?)
        .map(|dir| dir.join(program))
        .find(|path| executable(path))
}

/// How much of each stream a command keeps in memory when `PRODIGY_OUTPUT_LIMIT` does not
/// say: its last 8 MiB (docs/running.md).
pub const DEFAULT_OUTPUT_LIMIT: usize = 8 << 20;

/// What a pipe reader keeps: the last `limit` bytes; once the stream outgrows that, all of
/// it goes to the spill log (secrets masked), when there is one, so the whole output is
/// still on disk.
struct Buffer {
    bytes: Vec<u8>,
    limit: usize,
    dropped: u64,
    spill: Option<(PathBuf, Option<crate::logs::Mask>)>,
    log: Option<crate::logs::LineLog>,
}

impl Buffer {
    fn new(limit: usize, spill: Option<(PathBuf, Option<crate::logs::Mask>)>) -> Self {
        Buffer {
            bytes: Vec::new(),
            limit: limit.max(1),
            dropped: 0,
            spill,
            log: None,
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        if self.log.is_none()
            && self.bytes.len() + chunk.len() > self.limit
            && let Some((path, mask)) = self.spill.take()
        {
            // The spill starts with everything kept so far.
            let mut log = crate::logs::LineLog::create(path, mask);
            log.chunk(&self.bytes);
            self.log = Some(log);
        }
        if let Some(log) = &mut self.log {
            log.chunk(chunk);
        }
        self.bytes.extend_from_slice(chunk);
        // Trimmed once it holds twice the limit, so that each byte of a long stream is
        // moved at most once.
        if self.bytes.len() > 2 * self.limit {
            let cut = self.bytes.len() - self.limit;
            self.bytes.drain(..cut);
            self.dropped += cut as u64;
        }
    }

    /// The text kept, with a line in front when earlier output was dropped.
    fn text(&self, whole: Option<&Path>) -> String {
        let mut bytes = &self.bytes[..];
        let mut dropped = self.dropped;
        if bytes.len() > self.limit {
            dropped += (bytes.len() - self.limit) as u64;
            bytes = &bytes[bytes.len() - self.limit..];
        }
        let text = crate::logs::text(bytes);
        if dropped == 0 {
            return text.into_owned();
        }
        let whole = whole.map_or_else(String::new, |path| {
            format!("; the whole output is in {}", path.display())
        });
        format!(
            "{TRUNCATED} {dropped} bytes of earlier output dropped (PRODIGY_OUTPUT_LIMIT){whole}]\n{text}"
        )
    }
}

/// How a text cut to its tail starts.
pub const TRUNCATED: &str = "[prodigy: output truncated:";

type Shared = Arc<Mutex<Buffer>>;

/// Reads a child's pipe into a buffer shared with [`collected`], chunk by chunk, so that
/// what arrived is kept even when a background process holds the pipe open. Each chunk is
/// also appended to BOTH, the buffer the two pipes share, so that it holds their output in
/// the order it arrived, and sent to WATCH when a caller follows the stream.
fn reader<R>(
    pipe: Option<R>,
    buffer: Buffer,
    both: Shared,
    watch: Option<tokio::sync::mpsc::UnboundedSender<Vec<u8>>>,
) -> (Shared, tokio::task::JoinHandle<()>)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    let buffer = Arc::new(Mutex::new(buffer));
    let sink = buffer.clone();
    let task = tokio::spawn(async move {
        let Some(mut pipe) = pipe else { return };
        let mut chunk = vec![0u8; 64 * 1024];
        while let Ok(n) = pipe.read(&mut chunk).await {
            if n == 0 {
                break;
            }
            crate::lock(&sink).push(&chunk[..n]);
            crate::lock(&both).push(&chunk[..n]);
            if let Some(watch) = &watch {
                let _ = watch.send(chunk[..n].to_vec());
            }
        }
    });
    (buffer, task)
}

/// What a pipe reader gathered: everything up to the end of the pipe, or, when a background
/// process keeps it open, what arrived within 200 ms of the command's end.
async fn collected((buffer, task): (Shared, tokio::task::JoinHandle<()>)) -> Shared {
    let abort = task.abort_handle();
    if tokio::time::timeout(Duration::from_millis(200), task)
        .await
        .is_err()
    {
        abort.abort();
    }
    buffer
}

/// The longest line of the Claude CLI's stream a watcher is given whole; a longer one (no
/// JSON event of the CLI comes near it) is cut, so memory stays bounded. A shell command's
/// lines, shown to a person, are cut at [`crate::logs::LONGEST_LINE`], as its log cuts them.
pub const CLAUDE_LINE: usize = 64 << 20;

/// Hands each line of a chunk of standard output to WATCH, without its `\r\n` or `\n`; a
/// line longer than LONGEST in pieces.
fn watch_lines(
    lines: &mut crate::logs::LineSplitter,
    chunk: &[u8],
    longest: usize,
    watch: &mut dyn FnMut(&str),
) {
    lines.feed(chunk, longest, &mut |split| watch_split(split, watch));
}

fn watch_split(split: crate::logs::Split<'_>, watch: &mut dyn FnMut(&str)) {
    match split {
        crate::logs::Split::Line(line) => watch(line.trim_end_matches('\r')),
        crate::logs::Split::Part(part) => watch(part),
    }
}

/// Runs a command to completion, or until its timeout or `cancel` fires.
pub async fn run(command: &Command, cancel: &mut watch::Receiver<bool>) -> Output {
    run_watched(command, cancel, None, crate::logs::LONGEST_LINE).await
}

/// Where a bare program name (`sh`) is on the PATH COMMAND runs with, found once per
/// name and PATH for the whole process: left to the child, the lookup costs a failed
/// `execve` for each directory before it on every spawn (bench/README.md). `None` (the
/// child looks it up) for a path, a PATH with a relative directory (it depends on the
/// working directory), or a name not found.
fn on_path(command: &Command) -> Option<PathBuf> {
    type Found = std::collections::HashMap<(String, std::ffi::OsString), PathBuf>;
    static FOUND: std::sync::OnceLock<Mutex<Found>> = std::sync::OnceLock::new();
    use std::os::unix::fs::PermissionsExt;
    if command.program.is_empty() || command.program.contains('/') {
        return None;
    }
    let path: std::ffi::OsString = match command.env.iter().rev().find(|(k, _)| k == "PATH") {
        Some((_, v)) => v.into(),
        None => std::env::var_os("PATH")?,
    };
    let key = (command.program.clone(), path);
    let found = FOUND.get_or_init(Mutex::default);
    if let Some(hit) = crate::lock(found).get(&key) {
        return Some(hit.clone());
    }
    for dir in std::env::split_paths(&key.1) {
        if !dir.is_absolute() {
            return None;
        }
        let candidate = dir.join(&command.program);
        let executable = std::fs::metadata(&candidate)
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
        if executable {
            crate::lock(found).insert(key, candidate.clone());
            return Some(candidate);
        }
    }
    None
}

/// The process COMMAND starts: in its own process group, killed when dropped, marked as
/// prodigy's, with its environment (only `PATH` kept when it clears the rest).
fn process_for(command: &Command) -> tokio::process::Command {
    let mut process = match on_path(command) {
        // The program as found, with the name it was given as its `argv[0]` (`$0`).
        Some(found) => {
            let mut process = tokio::process::Command::new(found);
            process.arg0(&command.program);
            process
        }
        None => tokio::process::Command::new(&command.program),
    };
    process
        .args(&command.args)
        .current_dir(&command.cwd)
        .stdin(if command.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if command.clear_env {
        process.env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            process.env("PATH", path);
        }
    }
    process.envs(command.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    crate::reap::mark_for(&mut process, command.agent.as_deref());
    process
}

/// [`run`], and each line of standard output goes to WATCH as it arrives.
pub async fn run_watched(
    command: &Command,
    cancel: &mut watch::Receiver<bool>,
    mut watch: Option<&mut dyn FnMut(&str)>,
    longest: usize,
) -> Output {
    let started = Instant::now();
    let mut child = match process_for(command).spawn() {
        Ok(child) => child,
        Err(e) => {
            return Output {
                stderr: format!("could not start `{}`: {e}", command.program),
                spawn_error: true,
                duration: started.elapsed(),
                ..Output::default()
            };
        }
    };
    let pid = child.id().and_then(|id| i32::try_from(id).ok());
    feed_stdin(child.stdin.take(), command.stdin.clone());
    let limit = command.output_limit;
    // The interleaved buffer is the one that spills: its log holds both streams whole.
    let both = Arc::new(Mutex::new(Buffer::new(
        limit,
        command
            .spill
            .clone()
            .map(|path| (path, command.mask.clone())),
    )));
    let (watch_tx, mut watch_rx) = tokio::sync::mpsc::unbounded_channel();
    let read_out = reader(
        child.stdout.take(),
        Buffer::new(limit, None),
        both.clone(),
        watch.is_some().then_some(watch_tx),
    );
    let read_err = reader(
        child.stderr.take(),
        Buffer::new(limit, None),
        both.clone(),
        None,
    );
    let deadline = async {
        match command.timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let mut lines = crate::logs::LineSplitter::default();
    let mut output = Output::default();
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.ok(),
            () = &mut deadline => {
                output.timed_out = true;
                break terminate(&mut child, pid, command.grace).await;
            }
            () = cancelled(cancel) => {
                output.cancelled = true;
                break terminate(&mut child, pid, command.grace).await;
            }
            Some(chunk) = watch_rx.recv(), if watch.is_some() => {
                if let Some(watch) = watch.as_deref_mut() {
                    watch_lines(&mut lines, &chunk, longest, watch);
                }
            }
        }
    };
    if output.timed_out || output.cancelled {
        // Whatever the group left behind goes too.
        signal_group(pid, nix::sys::signal::Signal::SIGKILL);
    }
    let read_out = collected(read_out).await;
    let read_err = collected(read_err).await;
    let whole = finish_log(&both);
    output.stdout = crate::lock(&read_out).text(whole.as_deref());
    output.stderr = crate::lock(&read_err).text(whole.as_deref());
    if let Some(watch) = watch {
        while let Ok(chunk) = watch_rx.try_recv() {
            watch_lines(&mut lines, &chunk, longest, watch);
        }
        lines.finish(&mut |split| watch_split(split, watch));
    }
    let mut interleaved = crate::lock(&both).text(whole.as_deref());
    output.code = status.and_then(|s| s.code());
    if output.timed_out
        && let Some(t) = command.timeout
    {
        note_timeout(t, [&mut output.stderr, &mut interleaved]);
    }
    output.interleaved = Some(interleaved);
    output.duration = started.elapsed();
    output
}

/// Ends the log the interleaved buffer BOTH spilled to, if it did: its path, while it is
/// usable.
fn finish_log(both: &Mutex<Buffer>) -> Option<PathBuf> {
    let mut both = crate::lock(both);
    both.log.as_mut().and_then(|log| {
        log.finish();
        log.is_open().then(|| log.path.clone())
    })
}

/// Ends each of TEXTS with a line saying the command timed out after TIMEOUT.
fn note_timeout(timeout: Duration, texts: [&mut String; 2]) {
    let note = format!(
        "prodigy: timed out after {}",
        humantime::format_duration(timeout)
    );
    for text in texts {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&note);
    }
}

/// Writes TEXT to a child's standard input and closes it, in the background so that a child
/// that reads slowly (or never) cannot hold up its own output. A child that exits or closes
/// its input before reading all of it is no error here: its exit says what happened.
fn feed_stdin(pipe: Option<tokio::process::ChildStdin>, text: Option<String>) {
    let (Some(mut pipe), Some(text)) = (pipe, text) else {
        return;
    };
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt as _;
        let _ = pipe.write_all(text.as_bytes()).await;
        let _ = pipe.shutdown().await;
    });
}

/// Resolves once `cancel` is set (never, if its sender is gone without setting it).
pub(crate) async fn cancelled(cancel: &mut watch::Receiver<bool>) {
    loop {
        if *cancel.borrow() {
            return;
        }
        if cancel.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

pub(crate) fn signal_group(pid: Option<i32>, signal: nix::sys::signal::Signal) {
    if let Some(pid) = pid {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), signal);
    }
}

/// SIGTERM to the group, a grace period, then SIGKILL.
pub(crate) async fn terminate(
    child: &mut tokio::process::Child,
    pid: Option<i32>,
    grace: Duration,
) -> Option<std::process::ExitStatus> {
    signal_group(pid, nix::sys::signal::Signal::SIGTERM);
    if let Ok(status) = tokio::time::timeout(grace, child.wait()).await {
        return status.ok();
    }
    signal_group(pid, nix::sys::signal::Signal::SIGKILL);
    child.wait().await.ok()
}

/// `write_file`: PATH, relative to `cwd`, must stay inside ROOT (the project) once its links
/// are followed ([`crate::confine::inside`]); JSON and YAML are validated (JSON is
/// pretty-printed; YAML is read with the plan's reader, `Plan::yaml`); `mode` sets the permission
/// bits, else a new file gets the umask's.
#[expect(
    clippy::too_many_arguments,
    reason = "the fields of a `write_file` step, and the plan's YAML reader"
)]
pub fn write_file(
    root: &Path,
    cwd: &Path,
    path: &str,
    content: &str,
    format: prodigy_plan::WriteFormat,
    yaml: prodigy_plan::YamlReader,
    mode: Option<u32>,
    create_dirs: bool,
) -> Output {
    use prodigy_plan::WriteFormat;
    // Resolved before anything is made, and written at the real place, so that no `..`,
    // absolute path or link leads the write (or the `chmod`) out of the project.
    let target = match crate::confine::inside(root, cwd, path) {
        Ok(target) => target,
        Err(e) => return Output::error(format!("`write_file`: {e}")),
    };
    let text = match format {
        WriteFormat::Text => content.to_owned(),
        WriteFormat::Json => match serde_json::from_str::<serde_json::Value>(content) {
            Ok(value) => serde_json::to_string_pretty(&value).unwrap_or_default() + "\n",
            Err(e) => return Output::error(format!("`write_file` content is not valid JSON: {e}")),
        },
        WriteFormat::Yaml => match yaml.read(content) {
            Ok(value) => value.map_or_else(String::new, |v| to_yaml(&v)),
            Err(why) => {
                return Output::error(format!("`write_file` content is not valid YAML: {why}"));
            }
        },
    };
    if create_dirs
        && let Some(parent) = target.parent()
        && let Err(e) = std::fs::create_dir_all(parent)
    {
        return Output::error(format!("cannot create `{}`: {e}", parent.display()));
    }
    if let Err(e) = std::fs::write(&target, &text) {
        return Output::error(format!("cannot write `{path}`: {e}"));
    }
    if let Some(mode) = mode {
        use std::os::unix::fs::PermissionsExt;
        if let Err(e) = std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode)) {
            return Output::error(format!("cannot set the mode of `{path}`: {e}"));
        }
    }
    Output {
        stdout: format!("Wrote {} bytes to {path}\n", text.len()),
        code: Some(0),
        ..Output::default()
    }
}

/// Block-style YAML for a JSON value: mappings and sequences indented by two, strings plain
/// when YAML would read them back as the same string, double-quoted (JSON escapes, which YAML
/// shares) otherwise.
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => yaml_block(value, 0, &mut out),
        Value::Array(items) if !items.is_empty() => yaml_block(value, 0, &mut out),
        scalar => {
            out.push_str(&yaml_scalar(scalar));
            out.push('\n');
        }
    }
    out
}

fn yaml_block(value: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    let nested = |v: &Value| match v {
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => false,
    };
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                out.push_str(&pad);
                out.push_str(&yaml_string(key));
                if nested(v) {
                    out.push_str(":\n");
                    yaml_block(v, indent + 2, out);
                } else {
                    out.push_str(": ");
                    out.push_str(&yaml_scalar(v));
                    out.push('\n');
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                if nested(item) {
                    // The item's block, with its first indentation turned into the dash.
                    let mut block = String::new();
                    yaml_block(item, indent + 2, &mut block);
                    out.push_str(&pad);
                    out.push_str("- ");
                    out.push_str(&block[indent + 2..]);
                } else {
                    out.push_str(&pad);
                    out.push_str("- ");
                    out.push_str(&yaml_scalar(item));
                    out.push('\n');
                }
            }
        }
        scalar => {
            out.push_str(&pad);
            out.push_str(&yaml_scalar(scalar));
            out.push('\n');
        }
    }
}

fn yaml_scalar(value: &Value) -> String {
    match value {
        Value::String(s) => yaml_string(s),
        Value::Object(_) => "{}".to_owned(),
        Value::Array(_) => "[]".to_owned(),
        other => other.to_string(),
    }
}

fn yaml_string(s: &str) -> String {
    const WORDS: &[&str] = &[
        "true", "false", "yes", "no", "on", "off", "null", "y", "n", "~",
    ];
    let plain = s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_' || c == '/')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | ' '))
        && !s.ends_with(' ')
        && !WORDS.contains(&s.to_ascii_lowercase().as_str());
    if plain {
        s.to_owned()
    } else {
        Value::String(s.to_owned()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read_back(yaml: &str) -> Value {
        prodigy_compiler::plan::yaml_to_json(yaml)
            .unwrap_or_else(|why| panic!("{yaml}: {why}"))
            .unwrap()
    }

    fn sh(text: &str) -> Command {
        let (program, args) = shell(text);
        Command {
            program,
            args,
            cwd: std::env::temp_dir(),
            env: Vec::new(),
            clear_env: false,
            timeout: None,
            grace: Duration::from_secs(1),
            output_limit: DEFAULT_OUTPUT_LIMIT,
            spill: None,
            mask: None,
            stdin: None,
            agent: None,
        }
    }

    /// `sh` is found on the PATH once, not by the child on every spawn, and the script
    /// still sees the name it was run by as `$0`; a step's own PATH decides where.
    #[tokio::test]
    async fn a_program_found_on_the_path_keeps_its_name_as_argv0() {
        let (_tx, mut cancel) = watch::channel(false);
        let out = run(&sh("echo \"$0\""), &mut cancel).await;
        assert_eq!((out.code, out.stdout.as_str()), (Some(0), "sh\n"));
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = sh("true");
        cmd.env
            .push(("PATH".into(), dir.path().display().to_string()));
        assert_eq!(on_path(&cmd), None, "no `sh` in that PATH");
        let mut cmd = sh("true");
        cmd.env
            .push(("PATH".into(), "relative:/usr/bin:/bin".into()));
        assert_eq!(
            on_path(&cmd),
            None,
            "a relative directory depends on the cwd"
        );
        let mut cmd = sh("true");
        cmd.env.push(("PATH".into(), "/usr/bin:/bin".into()));
        assert!(on_path(&cmd).is_some_and(|p| p.is_absolute() && p.ends_with("sh")));
    }

    #[tokio::test]
    async fn standard_input_gets_the_text_and_then_its_end() {
        let (_tx, mut cancel) = watch::channel(false);
        let mut cmd = sh("wc -c; cat");
        cmd.stdin = Some("a prompt\n".to_owned());
        let out = run(&cmd, &mut cancel).await;
        assert_eq!(out.code, Some(0));
        // `wc` read to the end of the input, so `cat` finds nothing left.
        assert_eq!(out.stdout.trim(), "9");
        // Without a text, standard input is empty.
        let out = run(&sh("cat"), &mut cancel).await;
        assert_eq!((out.code, out.stdout.as_str()), (Some(0), ""));
    }

    #[tokio::test]
    async fn both_streams_are_kept_apart_and_interleaved_in_order() {
        let (_tx, mut cancel) = watch::channel(false);
        let out = run(
            &sh("echo out1; sleep 0.3; echo err1 >&2; sleep 0.3; echo out2; exit 4"),
            &mut cancel,
        )
        .await;
        assert_eq!(out.code, Some(4));
        assert_eq!(out.stdout, "out1\nout2\n");
        assert_eq!(out.stderr, "err1\n");
        assert_eq!(out.combined(), "out1\nerr1\nout2\n");
    }

    #[tokio::test]
    async fn a_timeout_note_reaches_the_interleaved_output_too() {
        let (_tx, mut cancel) = watch::channel(false);
        let mut cmd = sh("echo started; sleep 5");
        cmd.timeout = Some(Duration::from_millis(300));
        let out = run(&cmd, &mut cancel).await;
        assert!(out.timed_out);
        assert_eq!(out.combined(), "started\nprodigy: timed out after 300ms");
        // What did not come from a process is stdout, then stderr.
        let made = Output::error("no such variable");
        assert_eq!(made.combined(), "no such variable");
    }

    #[tokio::test]
    async fn output_past_the_limit_keeps_its_tail_in_memory_and_all_of_it_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let spill = dir.path().join("logs/out.log");
        let (_tx, mut cancel) = watch::channel(false);
        let mut cmd = sh("i=0; while [ $i -lt 3000 ]; do echo line-$i-TOKEN; i=$((i+1)); done");
        cmd.output_limit = 4096;
        cmd.spill = Some(spill.clone());
        cmd.mask = Some(Arc::new(|l: &str| l.replace("TOKEN", "***")));
        let out = run(&cmd, &mut cancel).await;
        assert!(out.stdout.starts_with(TRUNCATED), "{}", &out.stdout[..200]);
        assert!(out.stdout.contains(&spill.display().to_string()));
        assert!(out.stdout.ends_with("line-2999-TOKEN\n"));
        assert!(out.stdout.len() < 4096 + 300, "{}", out.stdout.len());
        assert!(out.combined().len() < 4096 + 300);
        assert!(out.combined().contains(&spill.display().to_string()));
        let whole = std::fs::read_to_string(&spill).unwrap();
        assert_eq!(whole.lines().count(), 3000);
        assert!(whole.starts_with("line-0-***\n"), "{}", &whole[..40]);
        // Standard error past the limit goes to the log too.
        let mut loud = sh("i=0; while [ $i -lt 3000 ]; do echo err-$i >&2; i=$((i+1)); done");
        loud.output_limit = 4096;
        let errors = dir.path().join("logs/err.log");
        loud.spill = Some(errors.clone());
        let out = run(&loud, &mut cancel).await;
        assert!(
            out.stderr.contains(&errors.display().to_string()),
            "{}",
            &out.stderr[..200]
        );
        assert_eq!(
            std::fs::read_to_string(&errors).unwrap().lines().count(),
            3000
        );
        // Below the limit nothing is cut and nothing is spilled.
        let mut small = sh("echo hi");
        small.spill = Some(dir.path().join("never.log"));
        assert_eq!(run(&small, &mut cancel).await.stdout, "hi\n");
        assert!(!dir.path().join("never.log").exists());
    }

    /// A line longer than what a watcher takes whole reaches it in pieces of at most that
    /// size, all of it: memory stays bounded however long a command's line is.
    #[tokio::test]
    async fn a_long_line_reaches_a_watcher_in_bounded_pieces() {
        let (_tx, mut cancel) = watch::channel(false);
        let pieces = std::cell::RefCell::new(Vec::new());
        let mut watch = |line: &str| pieces.borrow_mut().push(line.len());
        let out = run_watched(
            &sh("head -c 3500000 /dev/zero | tr '\\0' a; echo; echo end"),
            &mut cancel,
            Some(&mut watch),
            1 << 20,
        )
        .await;
        assert_eq!(out.code, Some(0));
        let pieces = pieces.into_inner();
        assert!(pieces.iter().all(|&n| n <= 1 << 20), "{pieces:?}");
        assert_eq!(pieces.iter().sum::<usize>(), 3_500_000 + 3, "{pieces:?}");
        assert_eq!(pieces.last(), Some(&3));
    }

    #[tokio::test]
    async fn a_watcher_sees_each_line_before_the_command_ends() {
        let (_tx, mut cancel) = watch::channel(false);
        let seen = std::cell::RefCell::new(Vec::new());
        let started = Instant::now();
        let mut watch = |line: &str| seen.borrow_mut().push((line.to_owned(), started.elapsed()));
        let out = run_watched(
            &sh("echo one; sleep 0.5; printf two"),
            &mut cancel,
            Some(&mut watch),
            crate::logs::LONGEST_LINE,
        )
        .await;
        let seen = seen.into_inner();
        assert_eq!(out.code, Some(0));
        assert_eq!(
            seen.iter().map(|(l, _)| l.as_str()).collect::<Vec<_>>(),
            ["one", "two"]
        );
        assert!(seen[0].1 < Duration::from_millis(400), "{seen:?}");
    }

    #[test]
    fn only_executable_files_are_found_on_path_or_by_path() {
        use std::os::unix::fs::PermissionsExt as _;
        let first = tempfile::tempdir().unwrap();
        let second = tempfile::tempdir().unwrap();
        let make = |dir: &Path, name: &str, mode: u32| {
            let path = dir.join(name);
            std::fs::write(&path, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            path
        };
        // A non-executable `tool` earlier on PATH is passed over, as the shell does.
        make(first.path(), "tool", 0o644);
        let tool = make(second.path(), "tool", 0o755);
        let plain = make(first.path(), "plain", 0o644);
        std::fs::create_dir(second.path().join("dir")).unwrap();
        let path = std::env::join_paths([first.path(), second.path()]).unwrap();
        assert_eq!(find_in("tool", Some(&path)), Some(tool.clone()));
        assert_eq!(find_in("plain", Some(&path)), None);
        assert_eq!(find_in("dir", Some(&path)), None);
        assert_eq!(find_in("tool", None), None);
        // A path is taken as it is, whatever PATH says.
        let named = tool.to_str().unwrap();
        assert_eq!(find_in(named, None), Some(tool.clone()));
        assert_eq!(find_in(plain.to_str().unwrap(), Some(&path)), None);
        let missing = second.path().join("missing");
        assert_eq!(find_in(missing.to_str().unwrap(), Some(&path)), None);
    }

    #[test]
    fn yaml_reads_back_as_the_same_value() {
        let value = json!({
            "name": "demo",
            "tags": ["a", "b c", "true", "", "- x", "#no"],
            "nested": {"list": [{"k": 1, "v": [1, 2]}, [3, [4]]], "empty": {}, "none": []},
            "odd key: yes": "multi\nline \"quoted\"",
            "numbers": [1, 2.5, -3],
            "flags": [true, false, null],
        });
        let yaml = to_yaml(&value);
        assert!(yaml.starts_with("name: demo\ntags:\n  - a\n"), "{yaml}");
        assert_eq!(read_back(&yaml), value, "{yaml}");
        assert_eq!(read_back(&to_yaml(&json!("yes"))), json!("yes"));
    }
}
