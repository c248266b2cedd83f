//! Waiting for what a running prodigy says instead of polling with sleeps: its standard output
//! and error are read line by line as they come (a thread each, so neither pipe fills up),
//! and a test blocks until the line it waits for arrives, for at most a minute.
//! A test can also block until a file in a directory changes (`until_changed`, on inotify)
//! or until processes end (`gone_within`, on pidfds): the kernel tells it, nothing polls.

#![allow(dead_code, reason = "each test binary uses part of this module")]

use std::io::{BufRead, BufReader, Read};
use std::os::fd::OwnedFd;
use std::path::Path;
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

    /// Kills the child (if it still runs); [`Watched::finish`] then collects it.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
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

/// Blocks until READY holds: it is checked once, then again each time a file in DIR is
/// created, written, closed, moved in, removed or touched (inotify; DIR must exist).
/// Fails with WHAT after [`PATIENCE`].
pub(crate) fn until_changed(dir: &Path, what: &str, ready: impl FnMut() -> bool) {
    until(dir, false, what, ready);
}

/// [`until_changed`] for changes anywhere under DIR, in directories made while it waits too.
pub(crate) fn until_changed_under(dir: &Path, what: &str, ready: impl FnMut() -> bool) {
    until(dir, true, what, ready);
}

fn until(dir: &Path, deep: bool, what: &str, mut ready: impl FnMut() -> bool) {
    use rustix::fs::inotify;
    let watcher =
        inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK).unwrap();
    let watch = |dir: &Path| {
        inotify::add_watch(
            &watcher,
            dir,
            inotify::WatchFlags::CREATE
                | inotify::WatchFlags::MODIFY
                | inotify::WatchFlags::CLOSE_WRITE
                | inotify::WatchFlags::MOVED_TO
                | inotify::WatchFlags::DELETE
                | inotify::WatchFlags::ATTRIB,
        )
    };
    watch(dir).unwrap_or_else(|e| panic!("cannot watch {}: {e}", dir.display()));
    // Watching first, then checking: a change between the two still wakes the loop. A
    // directory made since the last look is watched before READY looks again, so what is
    // made in it later wakes the loop too.
    let deadline = Instant::now() + PATIENCE;
    loop {
        if deep {
            let mut dirs = vec![dir.to_path_buf()];
            while let Some(dir) = dirs.pop() {
                for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        // It may be gone already; then there is nothing in it to see.
                        let _ = watch(&entry.path());
                        dirs.push(entry.path());
                    }
                }
            }
        }
        if ready() {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "{what}: not after {PATIENCE:?}");
        if readable(&[&watcher], left).is_empty() {
            continue;
        }
        // What changed does not matter: READY looks again. Drain what the kernel queued.
        let mut buf = [0u8; 4096];
        while rustix::io::read(&watcher, &mut buf).is_ok_and(|n| n > 0) {}
    }
}

/// The indices of FDS that became readable within LEFT (none when the time ran out).
fn readable(fds: &[&OwnedFd], left: Duration) -> Vec<usize> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let mut polled: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::new(*fd, PollFlags::IN))
        .collect();
    let timeout = Timespec::try_from(left).unwrap();
    match poll(&mut polled, Some(&timeout)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => {}
        Err(e) => panic!("poll: {e}"),
    }
    polled
        .iter()
        .enumerate()
        .filter(|(_, fd)| !fd.revents().is_empty())
        .map(|(i, _)| i)
        .collect()
}

/// Waits until the processes PIDS (not necessarily this test's children) have all ended,
/// for at most WITHIN, and returns those still alive then. A pidfd of each tells when it
/// ends; a process already gone has none.
pub(crate) fn gone_within(pids: &[i32], within: Duration) -> Vec<i32> {
    use rustix::process::{Pid, PidfdFlags, pidfd_open};
    let mut alive: Vec<(i32, OwnedFd)> = pids
        .iter()
        .filter_map(|&pid| {
            Some((
                pid,
                pidfd_open(Pid::from_raw(pid)?, PidfdFlags::empty()).ok()?,
            ))
        })
        .collect();
    let deadline = Instant::now() + within;
    while !alive.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let fds: Vec<&OwnedFd> = alive.iter().map(|(_, fd)| fd).collect();
        let ended = readable(&fds, left);
        let mut i = 0;
        alive.retain(|_| {
            i += 1;
            !ended.contains(&(i - 1))
        });
    }
    alive.into_iter().map(|(pid, _)| pid).collect()
}

/// CHILD's status once it ended within WITHIN (its pidfd tells), else `None`, still running.
pub(crate) fn exited_within(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let pid = i32::try_from(child.id()).unwrap();
    gone_within(&[pid], within)
        .is_empty()
        .then(|| child.wait().unwrap())
}

/// The processes FIND names that still run after up to WITHIN: each one found is waited
/// for (pidfds), then FIND looks again, for what started meanwhile.
pub(crate) fn left_after(within: Duration, find: impl Fn() -> Vec<i32>) -> Vec<i32> {
    let deadline = Instant::now() + within;
    loop {
        let found = find();
        if found.is_empty() {
            return found;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if !gone_within(&found, left).is_empty() {
            return find();
        }
    }
}
