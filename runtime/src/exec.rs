//! Executors: run a shell command, the Claude CLI, or a file write, and report what happened.
//!
//! Every command runs in its own process group. A timeout or a cancellation sends SIGTERM
//! to the whole group, waits a grace period, then sends SIGKILL, so no child outlives it.

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
#[derive(Clone, Debug)]
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
}

/// What a command produced.
#[derive(Clone, Debug, Default)]
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

/// The Claude CLI with TEXT: `PRODIGY_CLAUDE_COMMAND` (program and leading arguments) or
/// `claude`, then `--print --dangerously-skip-permissions TEXT`.
pub fn claude(text: &str, override_command: Option<&str>) -> (String, Vec<String>) {
    let words: Vec<String> = override_command
        .unwrap_or("claude")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let (program, mut args) = match words.split_first() {
        Some((p, rest)) => (p.clone(), rest.to_vec()),
        None => ("claude".to_owned(), Vec::new()),
    };
    args.extend([
        "--print".to_owned(),
        "--dangerously-skip-permissions".to_owned(),
        text.to_owned(),
    ]);
    (program, args)
}

/// Whether a program can be found on `PATH` (or is a path that exists).
pub fn program_exists(program: &str) -> bool {
    if program.contains('/') {
        return Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// Reads a child's pipe into a buffer shared with [`collected`], chunk by chunk, so that
/// what arrived is kept even when a background process holds the pipe open. Each chunk is
/// also appended to BOTH, the buffer the two pipes share, so that it holds their output in
/// the order it arrived.
fn reader<R>(
    pipe: Option<R>,
    both: Arc<Mutex<Vec<u8>>>,
) -> (Arc<Mutex<Vec<u8>>>, tokio::task::JoinHandle<()>)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    let buffer = Arc::new(Mutex::new(Vec::new()));
    let sink = buffer.clone();
    let task = tokio::spawn(async move {
        let Some(mut pipe) = pipe else { return };
        let mut chunk = [0u8; 8192];
        while let Ok(n) = pipe.read(&mut chunk).await {
            if n == 0 {
                break;
            }
            crate::lock(&sink).extend_from_slice(&chunk[..n]);
            crate::lock(&both).extend_from_slice(&chunk[..n]);
        }
    });
    (buffer, task)
}

/// What a pipe reader gathered: everything up to the end of the pipe, or, when a background
/// process keeps it open, what arrived within 200 ms of the command's end.
async fn collected((buffer, task): (Arc<Mutex<Vec<u8>>>, tokio::task::JoinHandle<()>)) -> String {
    let abort = task.abort_handle();
    if tokio::time::timeout(Duration::from_millis(200), task)
        .await
        .is_err()
    {
        abort.abort();
    }
    let bytes = crate::lock(&buffer);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Runs a command to completion, or until its timeout or `cancel` fires.
pub async fn run(command: &Command, cancel: &mut watch::Receiver<bool>) -> Output {
    let started = Instant::now();
    let mut process = tokio::process::Command::new(&command.program);
    process
        .args(&command.args)
        .current_dir(&command.cwd)
        .stdin(Stdio::null())
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
    let mut child = match process.spawn() {
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
    let both = Arc::new(Mutex::new(Vec::new()));
    let read_out = reader(child.stdout.take(), both.clone());
    let read_err = reader(child.stderr.take(), both.clone());
    let deadline = async {
        match command.timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    let mut output = Output::default();
    let status = tokio::select! {
        status = child.wait() => status.ok(),
        () = deadline => {
            output.timed_out = true;
            terminate(&mut child, pid, command.grace).await
        }
        () = cancelled(cancel) => {
            output.cancelled = true;
            terminate(&mut child, pid, command.grace).await
        }
    };
    if output.timed_out || output.cancelled {
        // Whatever the group left behind goes too.
        signal_group(pid, nix::sys::signal::Signal::SIGKILL);
    }
    output.stdout = collected(read_out).await;
    output.stderr = collected(read_err).await;
    let mut interleaved = String::from_utf8_lossy(&crate::lock(&both)).into_owned();
    output.code = status.and_then(|s| s.code());
    if output.timed_out
        && let Some(t) = command.timeout
    {
        let note = format!("prodigy: timed out after {}", humantime::format_duration(t));
        for text in [&mut output.stderr, &mut interleaved] {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&note);
        }
    }
    output.interleaved = Some(interleaved);
    output.duration = started.elapsed();
    output
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

fn signal_group(pid: Option<i32>, signal: nix::sys::signal::Signal) {
    if let Some(pid) = pid {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), signal);
    }
}

/// SIGTERM to the group, a grace period, then SIGKILL.
async fn terminate(
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

/// `write_file`: the path must stay inside `cwd`; JSON and YAML are validated (JSON is
/// pretty-printed); `mode` sets the permission bits.
pub fn write_file(
    cwd: &Path,
    path: &str,
    content: &str,
    format: prodigy_compiler::ast::WriteFormat,
    mode: u32,
    create_dirs: bool,
) -> Output {
    use prodigy_compiler::ast::WriteFormat;
    let relative = Path::new(path);
    if relative.is_absolute()
        || relative
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Output::error(format!(
            "`write_file` path `{path}` leaves the working directory"
        ));
    }
    let text = match format {
        WriteFormat::Text => content.to_owned(),
        WriteFormat::Json => match serde_json::from_str::<serde_json::Value>(content) {
            Ok(value) => serde_json::to_string_pretty(&value).unwrap_or_default() + "\n",
            Err(e) => return Output::error(format!("`write_file` content is not valid JSON: {e}")),
        },
        WriteFormat::Yaml => {
            let file = prodigy_compiler::source::SourceFile::new(path, content);
            let parsed = prodigy_compiler::syntax::parse(&file);
            if let Some(d) = parsed.diagnostics.first() {
                return Output::error(format!(
                    "`write_file` content is not valid YAML: {}",
                    d.message
                ));
            }
            parsed
                .root
                .map_or_else(String::new, |root| to_yaml(&root.to_json()))
        }
    };
    let target = cwd.join(relative);
    if create_dirs
        && let Some(parent) = target.parent()
        && let Err(e) = std::fs::create_dir_all(parent)
    {
        return Output::error(format!("cannot create `{}`: {e}", parent.display()));
    }
    if let Err(e) = std::fs::write(&target, &text) {
        return Output::error(format!("cannot write `{path}`: {e}"));
    }
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode));
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
        let file = prodigy_compiler::source::SourceFile::new("x.yml", yaml);
        let parsed = prodigy_compiler::syntax::parse(&file);
        assert!(parsed.diagnostics.is_empty(), "{yaml}");
        parsed.root.unwrap().to_json()
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
        }
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
