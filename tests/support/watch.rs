//! Waiting for what a running prodigy says instead of polling with sleeps: its standard output
//! and error are read line by line as they come (a thread each, so neither pipe fills up),
//! and a test blocks until the line it waits for arrives, for at most a minute.

#![allow(dead_code, reason = "each test binary uses part of this module")]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ExitStatus, Output};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a test waits for a line, or for a process to end, before it fails.
pub(crate) const PATIENCE: Duration = Duration::from_mins(1);

/// A line one of the child's pipes gave: `true` for standard error.
type Line = (bool, String);

/// A child whose output is read as it comes: spawned with both pipes (`Scratch::spawn`).
pub(crate) struct Watched {
    child: Child,
    lines: Receiver<Line>,
    readers: Vec<JoinHandle<()>>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

fn read_lines(pipe: impl Read + Send + 'static, err: bool, tx: Sender<Line>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
            // The test may have stopped listening; the rest is still read so the child never
            // blocks on a full pipe.
            let _ = tx.send((err, std::mem::take(&mut line)));
        }
    })
}

impl Watched {
    /// Starts reading CHILD's standard output and error.
    pub(crate) fn new(mut child: Child) -> Self {
        let (tx, lines) = channel();
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(read_lines(out, false, tx.clone()));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(read_lines(err, true, tx));
        }
        Watched {
            child,
            lines,
            readers,
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    }

    /// The child's process id.
    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }

    fn keep(&mut self, (err, line): Line) {
        let to = if err {
            &mut self.stderr
        } else {
            &mut self.stdout
        };
        to.extend_from_slice(line.as_bytes());
    }

    /// Blocks until a line of either pipe contains TEXT and returns it; fails when the child
    /// closed both pipes or after [`PATIENCE`].
    pub(crate) fn wait_for(&mut self, text: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.1.contains(text).then(|| line.1.clone());
                    self.keep(line);
                    if let Some(found) = found {
                        return found;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    panic!("no line with `{text}` after {PATIENCE:?}:\n{}", self.said());
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("the run ended with no line with `{text}`:\n{}", self.said());
                }
            }
        }
    }

    fn said(&self) -> String {
        format!(
            "{}{}",
            String::from_utf8_lossy(&self.stderr),
            String::from_utf8_lossy(&self.stdout)
        )
    }

    /// Waits for the child to end (killing it and failing after [`PATIENCE`]) and returns
    /// all it printed, the lines already seen included.
    pub(crate) fn finish(mut self) -> Output {
        let status = wait(&mut self.child);
        for reader in std::mem::take(&mut self.readers) {
            reader.join().unwrap();
        }
        while let Ok(line) = self.lines.try_recv() {
            self.keep(line);
        }
        Output {
            status,
            stdout: self.stdout,
            stderr: self.stderr,
        }
    }
}

/// Waits for CHILD to end, on a thread of its own, for at most [`PATIENCE`]: then kills it
/// and fails. (Its pipes, if any, must be read elsewhere.)
fn wait(child: &mut Child) -> ExitStatus {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        // Only tells; the waiting itself is done below, by the owner of the child.
        let ended = nix::sys::wait::waitid(
            nix::sys::wait::Id::Pid(pid),
            nix::sys::wait::WaitPidFlag::WEXITED | nix::sys::wait::WaitPidFlag::WNOWAIT,
        );
        let _ = tx.send(ended.is_ok());
    });
    if rx.recv_timeout(PATIENCE).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("process {pid} still ran after {PATIENCE:?}");
    }
    child.wait().unwrap()
}

/// Waits for CHILD to end and returns what it printed: the whole of both pipes, read while
/// it runs; kills it and fails after [`PATIENCE`].
pub(crate) fn output_of(child: Child) -> Output {
    Watched::new(child).finish()
}
