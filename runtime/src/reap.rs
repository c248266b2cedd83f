//! No process outlives its coordinator (ARCHITECTURE.md, invariant 10), even one killed
//! with SIGKILL.
//!
//! The process that runs a session or a job (`run`, `resume`, `resume-job`, `dlq retry`: the
//! coordinator) [`adopt`]s an [`Owner`], its run's id and a nonce of its own, and [`mark`]s
//! every command it starts with `PRODIGY_OWNER=ID/NONCE`. Descendants inherit the
//! environment, so the mark reaches grandchildren too, whatever process group or session
//! they move to, and, unlike a recorded pid or process group, it cannot be reused by an
//! unrelated process. Two things end the marked processes:
//!
//! - the [`Guard`]: a small process (the prodigy binary's hidden `guard` subcommand) the
//!   coordinator starts before anything else. It holds the read end of a pipe whose write
//!   end only the coordinator holds (close-on-exec, so no command inherits it). When the
//!   pipe reaches its end, the coordinator has exited or died, however it died; the guard
//!   then [`sweep`]s the processes of its owner (SIGTERM, the grace period, SIGKILL) and
//!   exits. The coordinator closes the pipe and waits for the guard when it ends normally,
//!   so what a step left running in the background goes too.
//! - the next coordinator of the same session or job: once it holds the lock, and before
//!   anything runs, [`end_earlier`] sweeps the processes marked with the same id and another
//!   nonce (left by a coordinator killed together with its guard), and waits until they are
//!   gone, so that no item ever runs beside an earlier run of itself.
//!
//! A sweep finds the processes by reading `/proc/PID/environ` (its owner's processes only:
//! another user's cannot be read); a marked process that leads its process group is
//! signalled with its whole group, which catches a member that cleared its environment.
//! Zombies count as gone. Where there is no `/proc`, nothing is found and nothing is ended.

use std::collections::BTreeSet;
use std::io::Read as _;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::Signal;

/// The environment variable that marks the processes of a run: `ID/NONCE`.
pub const OWNER_ENV: &str = "PRODIGY_OWNER";

/// How often a sweep looks again.
const TICK: Duration = Duration::from_millis(50);

/// How long a sweep waits for processes to go after SIGKILL before it gives up.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// Who owns a process: a session or job id, and the nonce of the coordinator running it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    id: String,
    nonce: String,
}

impl Owner {
    /// The owner of this process's run of ID: the nonce is this process's id and the time,
    /// so that two coordinators of the same id never share it.
    pub fn new(id: &str) -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Owner {
            id: id.to_owned(),
            nonce: format!("{}.{}", std::process::id(), now.as_nanos()),
        }
    }

    /// The mark: `ID/NONCE` (an id holds no `/`).
    pub fn token(&self) -> String {
        format!("{}/{}", self.id, self.nonce)
    }
}

/// The id part of a mark.
fn id_of(token: &str) -> &str {
    token.rsplit_once('/').map_or(token, |(id, _)| id)
}

/// The mark of this process's run, once [`adopt`]ed.
static OWNED: OnceLock<String> = OnceLock::new();

/// Makes OWNER the owner of every command this process starts from now on ([`mark`]). A
/// process coordinates one run; a second call is ignored.
pub fn adopt(owner: &Owner) {
    let _ = OWNED.set(owner.token());
}

/// The mark this process puts on its commands, if it adopted an owner.
fn owned() -> Option<&'static str> {
    OWNED.get().map(String::as_str)
}

/// Puts this process's mark on PROCESS, after its environment is otherwise set (a
/// `clear_env` command is marked too).
pub(crate) fn mark(process: &mut tokio::process::Command) {
    mark_for(process, None);
}

/// [`mark`], for a command of the map agent AGENT (`agent-N`) when there is one: its mark is
/// the run's followed by `#AGENT` ([`item_mark`]), so that the guard ends it with the rest
/// and [`end_item`] ends what the item left before its worktree serves another item.
pub(crate) fn mark_for(process: &mut tokio::process::Command, agent: Option<&str>) {
    if let Some(token) = owned() {
        match agent {
            Some(agent) => process.env(OWNER_ENV, item_mark(token, agent)),
            None => process.env(OWNER_ENV, token),
        };
    }
}

/// The mark of agent AGENT's processes in the run marked TOKEN.
fn item_mark(token: &str, agent: &str) -> String {
    format!("{token}#{agent}")
}

/// Which processes a sweep ends.
#[derive(Clone, Copy, Debug)]
enum Which<'a> {
    /// Those of one coordinator: this mark exactly.
    Owner(&'a str),
    /// Those of earlier coordinators of the session or job ID: its marks but EXCEPT.
    EarlierRunsOf {
        id: &'a str,
        except: Option<&'a str>,
    },
    /// Those of one map agent: this item mark exactly ([`item_mark`]).
    Item(&'a str),
}

impl Which<'_> {
    fn matches(self, token: &str) -> bool {
        // An agent's mark is its coordinator's with `#AGENT` after it.
        let run = token.split_once('#').map_or(token, |(run, _)| run);
        match self {
            Which::Owner(owner) => run == owner,
            Which::EarlierRunsOf { id, except } => id_of(run) == id && except != Some(run),
            Which::Item(mark) => token == mark,
        }
    }
}

/// A live process a sweep found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Found {
    pid: i32,
    pgid: i32,
    /// When it started, in clock ticks after boot (`/proc/PID/stat` field 22): with the pid,
    /// it names the process even if the pid is reused.
    start: u64,
}

/// The mark in a process's environment (`/proc/PID/environ`: `NAME=VALUE` entries, each
/// ended by a NUL).
fn mark_in(environ: &[u8]) -> Option<&str> {
    let prefix = format!("{OWNER_ENV}=");
    environ
        .split(|b| *b == 0)
        .find_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .and_then(|value| std::str::from_utf8(value).ok())
}

/// The process group and start time of a live process from its `/proc/PID/stat` line; `None`
/// for a zombie or a line that is not one.
fn parse_stat(line: &str) -> Option<(i32, u64)> {
    // The command name, in parentheses, may hold spaces and parentheses: fields are counted
    // from the last `)`. After it: state (field 3), ppid, pgrp (5), …, starttime (22).
    let (_, rest) = line.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?;
    if matches!(*state, "Z" | "X" | "x") {
        return None;
    }
    let pgid = fields.get(2)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((pgid, start))
}

/// Reads at most LIMIT bytes of a file under `/proc` into BUF.
fn read_proc(path: &Path, buf: &mut Vec<u8>, limit: u64) -> bool {
    buf.clear();
    std::fs::File::open(path)
        .and_then(|file| file.take(limit).read_to_end(buf))
        .is_ok()
}

/// The live processes WHICH names (this process never counts).
fn scan(which: Which<'_>) -> Vec<Found> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    let mut buf = Vec::new();
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == me || !read_proc(&entry.path().join("environ"), &mut buf, 8 << 20) {
            continue;
        }
        if !mark_in(&buf).is_some_and(|token| which.matches(token)) {
            continue;
        }
        if !read_proc(&entry.path().join("stat"), &mut buf, 4096) {
            continue;
        }
        if let Some((pgid, start)) = parse_stat(&String::from_utf8_lossy(&buf)) {
            found.push(Found { pid, pgid, start });
        }
    }
    found
}

/// Sends SIGNAL to what a round found: a process that leads its group with the whole group,
/// any other one alone unless its group's leader was found. Each process gets each signal
/// once (SENT remembers).
fn send(found: &[Found], signal: Signal, sent: &mut BTreeSet<(i32, u64)>) {
    use nix::unistd::Pid;
    let leaders: BTreeSet<i32> = found
        .iter()
        .filter(|p| p.pid == p.pgid)
        .map(|p| p.pgid)
        .collect();
    for process in found {
        if !sent.insert((process.pid, process.start)) {
            continue;
        }
        if process.pid == process.pgid {
            let _ = nix::sys::signal::killpg(Pid::from_raw(process.pgid), signal);
        } else if !leaders.contains(&process.pgid) {
            let _ = nix::sys::signal::kill(Pid::from_raw(process.pid), signal);
        }
    }
}

/// A sweep in progress: SIGTERM to what it finds until the grace period is over, SIGKILL
/// after, until nothing is found, or [`KILL_WAIT`] after the grace period.
struct Sweep<'a> {
    which: Which<'a>,
    grace: Duration,
    waited: Duration,
    termed: BTreeSet<(i32, u64)>,
    killed: BTreeSet<(i32, u64)>,
}

/// What a round of a sweep came to.
#[derive(Debug, PartialEq, Eq)]
enum Round {
    /// Look again after this long.
    Wait(Duration),
    /// Nothing is left; this many processes were signalled.
    Done(usize),
    /// These processes outlived SIGKILL by [`KILL_WAIT`].
    GaveUp(Vec<i32>),
}

impl<'a> Sweep<'a> {
    fn new(which: Which<'a>, grace: Duration) -> Self {
        Sweep {
            which,
            grace,
            waited: Duration::ZERO,
            termed: BTreeSet::new(),
            killed: BTreeSet::new(),
        }
    }

    fn round(&mut self) -> Round {
        let found = scan(self.which);
        if found.is_empty() {
            return Round::Done(self.termed.union(&self.killed).count());
        }
        if self.waited >= self.grace + KILL_WAIT {
            return Round::GaveUp(found.iter().map(|p| p.pid).collect());
        }
        if self.waited < self.grace {
            send(&found, Signal::SIGTERM, &mut self.termed);
        } else {
            send(&found, Signal::SIGKILL, &mut self.killed);
        }
        self.waited += TICK;
        Round::Wait(TICK)
    }
}

/// Ends the processes WHICH names, waiting on the thread (the guard has no runtime).
fn sweep(which: Which<'_>, grace: Duration) -> Round {
    let mut sweep = Sweep::new(which, grace);
    loop {
        match sweep.round() {
            Round::Wait(pause) => std::thread::sleep(pause),
            ended => return ended,
        }
    }
}

/// Processes an earlier run left that would not go.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error(
    "processes of `{id}` (an earlier run, or an item's agent) are still there {} after SIGKILL: {}",
    humantime::format_duration(KILL_WAIT),
    pids.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
)]
#[diagnostic(
    code(prodigy::reap::survivors),
    help("end them (`kill -9 PID`), then resume again")
)]
pub struct Survivors {
    /// The session or job.
    pub id: String,
    /// Their process ids.
    pub pids: Vec<i32>,
}

/// Ends what earlier coordinators of the session or job ID left running (SIGTERM, GRACE,
/// SIGKILL) and waits until it is gone; returns how many processes were ended. The caller
/// holds ID's lock, so no live coordinator runs it.
///
/// # Errors
///
/// [`Survivors`]: processes still there [`KILL_WAIT`] after SIGKILL.
pub async fn end_earlier(id: &str, grace: Duration) -> Result<usize, Survivors> {
    let which = Which::EarlierRunsOf {
        id,
        except: owned(),
    };
    sweep_until_gone(which, grace, id).await
}

/// [`sweep`] without blocking the runtime; ID names whose processes they are in the error.
async fn sweep_until_gone(which: Which<'_>, grace: Duration, id: &str) -> Result<usize, Survivors> {
    let mut sweep = Sweep::new(which, grace);
    loop {
        match sweep.round() {
            Round::Wait(pause) => tokio::time::sleep(pause).await,
            Round::Done(ended) => return Ok(ended),
            Round::GaveUp(pids) => {
                return Err(Survivors {
                    id: id.to_owned(),
                    pids,
                });
            }
        }
    }
}

/// Ends what map agent AGENT of this process's run left running (a dev server, a watcher
/// started in the background: SIGTERM, GRACE, SIGKILL) and waits until it is gone, so that
/// nothing of one item writes into its worktree once another item has it. Returns how many
/// processes were ended; none when this process marks nothing.
///
/// # Errors
///
/// [`Survivors`]: processes still there [`KILL_WAIT`] after SIGKILL.
pub async fn end_item(agent: &str, grace: Duration) -> Result<usize, Survivors> {
    let Some(token) = owned() else {
        return Ok(0);
    };
    let mark = item_mark(token, agent);
    sweep_until_gone(Which::Item(&mark), grace, agent).await
}

/// The guard of a coordinator (see the module's documentation): started with [`Guard::start`],
/// kept for as long as the run goes on. Dropping it tells the guard the run ended and waits
/// for it to end what is left.
#[derive(Debug)]
pub struct Guard {
    pipe: Option<std::io::PipeWriter>,
    child: std::process::Child,
}

impl Guard {
    /// Starts `PROGRAM guard --owner TOKEN --grace-ms GRACE`, the guard of OWNER's
    /// processes, in a process group of its own (a terminal's Ctrl-C and a signal to the
    /// coordinator's group leave it be), unmarked, with no terminal output.
    ///
    /// # Errors
    ///
    /// The pipe cannot be made or PROGRAM cannot start.
    pub fn start(program: &Path, owner: &Owner, grace: Duration) -> std::io::Result<Guard> {
        use std::os::unix::process::CommandExt as _;
        let (reader, writer) = std::io::pipe()?;
        let child = std::process::Command::new(program)
            .arg("guard")
            .arg("--owner")
            .arg(owner.token())
            .arg("--grace-ms")
            .arg(grace.as_millis().to_string())
            .stdin(reader)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .env_remove(OWNER_ENV)
            .current_dir("/")
            .process_group(0)
            .spawn()?;
        Ok(Guard {
            pipe: Some(writer),
            child,
        })
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        drop(self.pipe.take());
        let _ = self.child.wait();
    }
}

/// What the guard process does: waits until INPUT (the pipe from its coordinator) ends, then
/// ends the processes marked TOKEN (SIGTERM, GRACE, SIGKILL).
pub fn guard(mut input: impl std::io::Read, token: &str, grace: Duration) {
    let mut buf = [0u8; 64];
    loop {
        match input.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = sweep(Which::Owner(token), grace);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_mark_is_its_runs_and_its_own() {
        let agent = item_mark("job-1/7.9", "agent-3");
        // The guard and the next coordinator end an agent's processes with the run's.
        assert!(Which::Owner("job-1/7.9").matches(&agent));
        assert!(!Which::Owner("job-1/7.8").matches(&agent));
        let earlier = Which::EarlierRunsOf {
            id: "job-1",
            except: Some("job-1/7.9"),
        };
        assert!(!earlier.matches(&agent));
        assert!(earlier.matches(&item_mark("job-1/5.5", "agent-3")));
        // An item's sweep ends that agent's processes only.
        assert!(Which::Item(&agent).matches(&agent));
        assert!(!Which::Item(&agent).matches("job-1/7.9"));
        assert!(!Which::Item(&agent).matches(&item_mark("job-1/7.9", "agent-30")));
    }

    /// A token no other test uses.
    fn token(name: &str) -> String {
        Owner::new(&format!("reap-test-{name}")).token()
    }

    /// Starts `sh -c SCRIPT` marked TOKEN, in its own process group, as `exec` does.
    fn start(script: &str, token: &str) -> std::process::Child {
        use std::os::unix::process::CommandExt as _;
        std::process::Command::new("sh")
            .args(["-c", script])
            .env(OWNER_ENV, token)
            .stdin(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap()
    }

    /// The pids of the live processes marked TOKEN and of the members of their groups.
    fn live(token: &str) -> Vec<i32> {
        scan(Which::Owner(token)).iter().map(|p| p.pid).collect()
    }

    /// Waits (up to 10 s) until the processes marked TOKEN are N or more: a shell starts its
    /// children a moment after it starts.
    fn until_live(token: &str, n: usize) {
        for _ in 0..200 {
            if live(token).len() >= n {
                return;
            }
            std::thread::sleep(TICK);
        }
        panic!("never saw {n} processes of {token}: {:?}", live(token));
    }

    /// Whether a live process's command line is TEXT.
    fn running(text: &str) -> bool {
        std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
            let mut buf = Vec::new();
            read_proc(&entry.path().join("cmdline"), &mut buf, 4096)
                && String::from_utf8_lossy(&buf).replace('\0', " ").trim_end() == text
        })
    }

    fn alive(child: &mut std::process::Child) -> bool {
        child.try_wait().unwrap().is_none()
    }

    #[test]
    fn marks_are_found_in_an_environment_and_matched_by_owner_or_id() {
        assert_eq!(
            mark_in(b"A=1\0PRODIGY_OWNER=job-1/42.7\0B=2\0"),
            Some("job-1/42.7")
        );
        assert_eq!(mark_in(b"XPRODIGY_OWNER=job-1/42.7\0"), None);
        assert_eq!(mark_in(b""), None);
        let owner = Which::Owner("job-1/42.7");
        assert!(owner.matches("job-1/42.7"));
        assert!(!owner.matches("job-1/43.8"));
        let earlier = Which::EarlierRunsOf {
            id: "job-1",
            except: Some("job-1/43.8"),
        };
        assert!(earlier.matches("job-1/42.7"));
        assert!(!earlier.matches("job-1/43.8"), "the coordinator's own");
        assert!(!earlier.matches("job-10/42.7"));
        assert!(!earlier.matches("job-2/42.7"));
        // Two coordinators of one id never share a mark.
        assert_ne!(Owner::new("job-1").token(), Owner::new("job-1").token());
    }

    #[test]
    fn a_stat_line_gives_the_group_and_start_time_of_a_live_process() {
        let line =
            "4242 (a (b) c) S 1 4240 4240 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(line), Some((4240, 987_654)));
        let zombie = "4243 (sh) Z 1 4240 4240 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987655 0 0";
        assert_eq!(parse_stat(zombie), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    /// The guard ends its owner's processes, grandchildren included, once its pipe ends, and
    /// leaves another owner's alone.
    #[test]
    fn the_guard_ends_its_owners_processes_when_its_pipe_ends() {
        let mine = token("mine");
        let theirs = token("theirs");
        // Children, grandchildren, one that leaves the group (`setsid`) but keeps the mark,
        // and one that clears its environment but stays in the group.
        let scrubbed = format!("sleep 29.{}", std::process::id());
        let mut child = start(
            &format!("sleep 30 & env -i {scrubbed} & setsid sleep 30 & sh -c 'sleep 30; :' & wait"),
            &mine,
        );
        let mut other = start("sleep 30", &theirs);
        until_live(&mine, 5);
        until_live(&theirs, 1);
        let (reader, writer) = std::io::pipe().unwrap();
        let guard = {
            let mine = mine.clone();
            std::thread::spawn(move || guard(reader, &mine, Duration::from_secs(1)))
        };
        std::thread::sleep(TICK * 2);
        assert!(alive(&mut child), "the guard waits for the end of its pipe");
        drop(writer);
        guard.join().unwrap();
        assert_eq!(live(&mine), Vec::<i32>::new());
        let gone = (0..40).any(|_| {
            std::thread::sleep(TICK);
            !running(&scrubbed)
        });
        assert!(gone, "its group went with its leader");
        assert!(alive(&mut other));
        assert!(matches!(sweep_owner(&theirs), Round::Done(n) if n > 0));
        let _ = child.wait();
        let _ = other.wait();
    }

    /// What ignores SIGTERM gets SIGKILL once the grace period is over; a sweep of the
    /// earlier runs of an id spares the current one.
    #[tokio::test]
    async fn earlier_runs_are_ended_even_when_they_ignore_sigterm() {
        let id = format!("reap-test-earlier-{}", std::process::id());
        let earlier = Owner::new(&id).token();
        let current = Owner::new(&id).token();
        let mut stubborn = start("trap '' TERM; sleep 30 & wait", &earlier);
        let mut running = start("sleep 30", &current);
        until_live(&earlier, 2);
        until_live(&current, 1);
        let mut sweep = Sweep::new(
            Which::EarlierRunsOf {
                id: &id,
                except: Some(&current),
            },
            Duration::from_millis(300),
        );
        let mut rounds = 0;
        let ended = loop {
            match sweep.round() {
                Round::Wait(pause) => tokio::time::sleep(pause).await,
                other => break other,
            }
            rounds += 1;
        };
        assert_eq!(ended, Round::Done(2));
        assert!(
            rounds >= 6,
            "waited the grace period before SIGKILL: {rounds}"
        );
        assert_eq!(sweep.killed.len(), 2, "SIGTERM was ignored");
        assert!(alive(&mut running));
        assert!(matches!(sweep_owner(&current), Round::Done(n) if n > 0));
        let _ = stubborn.wait();
        let _ = running.wait();
    }

    fn sweep_owner(token: &str) -> Round {
        sweep(Which::Owner(token), Duration::ZERO)
    }
}
