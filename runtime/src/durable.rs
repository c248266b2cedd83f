//! Durable writes: the one place the runtime writes its state under `$PRODIGY_HOME`
//! (checkpoints, `items.json`, `results.jsonl`, the DLQ, event logs), so that a failed write
//! is handled alike everywhere and can be provoked in tests. Where each file lives is
//! [`crate::layout`]'s; what it holds is its owner's ([`crate::store`], [`crate::jobstore`],
//! [`crate::dlq`], [`crate::merge_journal`]).
//!
//! [`write_atomic`] replaces a whole file (a temporary file, fsync, rename, fsync of the
//! directory); [`append`] adds a line to a journal; [`private_dir`] makes directories only
//! their owner reads.
//!
//! A failed append is undone (the file is cut back to its length before the write), so a
//! full disk leaves no torn line behind when the file can still be truncated.
//!
//! Test hook (CONTRIBUTING.md, "Fault injection"): in debug builds only, the environment
//! variable `PRODIGY_FAULT_STATE_WRITES` makes state writes fail with `ENOSPC`, as on a full
//! disk. Its value is comma-separated settings:
//!
//! - `file=TEXT`: only writes to files whose name contains TEXT are concerned (default:
//!   every state file);
//! - `after=N`: the first N concerned writes succeed, every later one fails;
//! - `bytes=N`: concerned writes succeed until N bytes were written in all; the write that
//!   crosses the limit writes its first bytes up to it (a torn write) and fails, and so
//!   does every later one.
//!
//! Release builds ignore the variable.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The name of the test hook's environment variable.
pub const FAULT_ENV: &str = "PRODIGY_FAULT_STATE_WRITES";

/// Which state writes fail, from `PRODIGY_FAULT_STATE_WRITES`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// Only files whose name contains this.
    pub file: Option<String>,
    /// Concerned writes that succeed before the first failure.
    pub after: Option<u64>,
    /// Bytes concerned writes may write in all.
    pub bytes: Option<u64>,
}

/// Why a [`FaultPlan`] could not be read.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum FaultPlanError {
    /// A part without `=`.
    #[error("`{0}` is not `key=value`")]
    NotKeyValue(String),
    /// A count that is not a number.
    #[error("`{key}` wants a number, not `{value}`")]
    NotANumber {
        /// The setting.
        key: String,
        /// What it was given.
        value: String,
    },
    /// A setting that does not exist.
    #[error("unknown setting `{0}`")]
    Unknown(String),
}

/// What a [`FaultPlan`] lets through so far.
#[derive(Debug, Default)]
struct Spent {
    writes: u64,
    bytes: u64,
}

impl FaultPlan {
    /// Reads a plan: `file=TEXT`, `after=N`, `bytes=N`, comma-separated.
    ///
    /// # Errors
    ///
    /// An unknown key or a number that is not one, described.
    pub fn parse(text: &str) -> Result<Self, FaultPlanError> {
        let mut plan = FaultPlan::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| FaultPlanError::NotKeyValue(part.to_owned()))?;
            let number = || {
                value
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| FaultPlanError::NotANumber {
                        key: key.to_owned(),
                        value: value.to_owned(),
                    })
            };
            match key.trim() {
                "file" => plan.file = Some(value.trim().to_owned()),
                "after" => plan.after = Some(number()?),
                "bytes" => plan.bytes = Some(number()?),
                other => return Err(FaultPlanError::Unknown(other.to_owned())),
            }
        }
        if plan.after.is_none() && plan.bytes.is_none() {
            plan.after = Some(0);
        }
        Ok(plan)
    }

    /// How many of LEN bytes a write to PATH may write before it fails (`None`: all, and it
    /// succeeds), counting it against SPENT.
    fn allow(&self, spent: &mut Spent, path: &Path, len: usize) -> Option<usize> {
        let name = path.file_name().map(|n| n.to_string_lossy());
        if let Some(file) = &self.file
            && !name.is_some_and(|n| n.contains(file.as_str()))
        {
            return None;
        }
        spent.writes += 1;
        if self.after.is_some_and(|after| spent.writes > after) {
            return Some(0);
        }
        if let Some(limit) = self.bytes {
            let room = limit.saturating_sub(spent.bytes);
            let len64 = len as u64;
            if len64 > room {
                spent.bytes = limit;
                return Some(usize::try_from(room).unwrap_or(len));
            }
            spent.bytes += len64;
        }
        None
    }
}

/// The plan of this process, read once: none in release builds or without the variable.
fn injected() -> Option<&'static Hook> {
    static PLAN: std::sync::OnceLock<Option<Hook>> = std::sync::OnceLock::new();
    PLAN.get_or_init(|| {
        if !cfg!(debug_assertions) {
            return None;
        }
        let text = std::env::var(FAULT_ENV).ok()?;
        match FaultPlan::parse(&text) {
            Ok(plan) => Some(Mutex::new((plan, Spent::default()))),
            Err(why) => {
                // A test hook set wrong must not pass for a test of nothing.
                let _ = writeln!(std::io::stderr(), "warning: {FAULT_ENV}: {why}; ignored");
                None
            }
        }
    })
    .as_ref()
}

fn no_space() -> std::io::Error {
    std::io::Error::from_raw_os_error(nix::libc::ENOSPC)
}

/// The hook's state: the plan and what it let through.
type Hook = Mutex<(FaultPlan, Spent)>;

/// Writes all of BYTES to FILE, a state file whose name is PATH (the file it becomes, for a
/// temporary file renamed into place). The one place state bytes are written.
///
/// # Errors
///
/// What writing failed with (`ENOSPC` when the test hook says so).
pub fn write_all(file: &mut impl Write, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_with(injected(), file, path, bytes)
}

fn write_with(
    hook: Option<&Hook>,
    file: &mut impl Write,
    path: &Path,
    bytes: &[u8],
) -> std::io::Result<()> {
    if let Some(hook) = hook {
        let allowed = {
            let mut guard = crate::lock(hook);
            let (plan, spent) = &mut *guard;
            plan.allow(spent, path, bytes.len())
        };
        if let Some(n) = allowed {
            file.write_all(&bytes[..n.min(bytes.len())])?;
            return Err(no_space());
        }
    }
    file.write_all(bytes)
}

/// Appends BYTES to FILE (opened for appending) as [`write_all`] does; when that fails, cuts
/// the file back to its length before, so that no torn record stays (best effort: the
/// error returned is the write's).
///
/// # Errors
///
/// What writing failed with.
pub fn append(file: &mut std::fs::File, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    append_with(injected(), file, path, bytes)
}

fn append_with(
    hook: Option<&Hook>,
    file: &mut std::fs::File,
    path: &Path,
    bytes: &[u8],
) -> std::io::Result<()> {
    let before = file.metadata().map(|m| m.len()).ok();
    let written = write_with(hook, file, path, bytes);
    if written.is_err()
        && let Some(len) = before
    {
        let _ = file.set_len(len);
    }
    written
}

/// A failed state write, for people: the file and the OS error.
pub fn describe(path: &Path, error: &std::io::Error) -> String {
    format!("cannot write `{}`: {error}", path.display())
}

/// The mode of every file prodigy keeps under `$PRODIGY_HOME`: they hold item data, outputs
/// and variables, so only their owner reads them.
pub const PRIVATE_FILE: u32 = 0o600;

/// The mode of every directory prodigy makes under `$PRODIGY_HOME`.
pub const PRIVATE_DIR: u32 = 0o700;

/// Makes DIR and the directories above it that are missing, readable by their owner only.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR)
        .create(dir)
}

/// Writes a file atomically (a temporary file in the same directory, fsync, rename, fsync
/// of the directory), readable by its owner only.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    // Unique per process and per write, so concurrent writers never share a temporary file.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    // The directory of the last write, made already: a run writes its checkpoint into one
    // directory after every step, and `mkdir -p` of a directory that exists costs two
    // system calls each time. Should it be removed meanwhile, the write fails and makes it.
    static LAST_DIR: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let known = crate::lock(&LAST_DIR).as_deref() == Some(dir);
    if !known {
        private_dir(dir)?;
        *crate::lock(&LAST_DIR) = Some(dir.to_owned());
    }
    match write_atomic_in(dir, path, bytes, &WRITES) {
        Err(e) if known && e.kind() == std::io::ErrorKind::NotFound => {
            private_dir(dir)?;
            write_atomic_in(dir, path, bytes, &WRITES)
        }
        done => done,
    }
}

fn write_atomic_in(
    dir: &Path,
    path: &Path,
    bytes: &[u8],
    writes: &std::sync::atomic::AtomicU64,
) -> std::io::Result<()> {
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        std::process::id(),
        writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let written = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(PRIVATE_FILE)
        .open(&tmp)
        .and_then(|mut file| {
            write_all(&mut file, path, bytes)?;
            file.sync_all()
        });
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        // A full disk leaves no temporary file behind to fill it further.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    File::open(dir)?.sync_all()
}

/// A short stable hash of a text (FNV-1a, 64 bits), to notice a changed workflow.
pub fn hash(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse_and_refuse_nonsense() {
        assert_eq!(
            FaultPlan::parse("file=results.jsonl, after=3").unwrap(),
            FaultPlan {
                file: Some("results.jsonl".into()),
                after: Some(3),
                bytes: None
            }
        );
        assert_eq!(FaultPlan::parse("").unwrap().after, Some(0));
        assert!(FaultPlan::parse("after=x").is_err());
        assert!(FaultPlan::parse("when=3").is_err());
        assert!(FaultPlan::parse("after").is_err());
    }

    #[test]
    fn writes_fail_after_n_and_only_for_matching_files() {
        let plan = FaultPlan::parse("file=results,after=2").unwrap();
        let mut spent = Spent::default();
        let results = Path::new("/h/results.jsonl");
        assert_eq!(
            plan.allow(&mut spent, Path::new("/h/checkpoint.json"), 5),
            None
        );
        assert_eq!(plan.allow(&mut spent, results, 5), None);
        assert_eq!(plan.allow(&mut spent, results, 5), None);
        assert_eq!(plan.allow(&mut spent, results, 5), Some(0));
        assert_eq!(plan.allow(&mut spent, Path::new("/h/index.json"), 5), None);
    }

    #[test]
    fn a_byte_budget_tears_the_write_that_crosses_it() {
        let plan = FaultPlan::parse("bytes=12").unwrap();
        let mut spent = Spent::default();
        let path = Path::new("x");
        assert_eq!(plan.allow(&mut spent, path, 10), None);
        assert_eq!(plan.allow(&mut spent, path, 10), Some(2));
        assert_eq!(plan.allow(&mut spent, path, 1), Some(0));
    }

    #[test]
    fn a_failed_append_leaves_the_file_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        std::fs::write(&path, "one\n").unwrap();
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        // The second append is torn by the byte budget: its first bytes land, then ENOSPC.
        let hook = Mutex::new((FaultPlan::parse("bytes=6").unwrap(), Spent::default()));
        append_with(Some(&hook), &mut file, &path, b"two\n").unwrap();
        let error = append_with(Some(&hook), &mut file, &path, b"three\n").unwrap_err();
        assert_eq!(error.raw_os_error(), Some(nix::libc::ENOSPC));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntwo\n");
        // Without the hook, writes go through.
        append_with(None, &mut file, &path, b"four\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntwo\nfour\n");
    }

    #[test]
    fn atomic_writes_replace_whole_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("a")).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file is left behind");
    }

    /// The directory of the last write is not made again, yet a write into it after it
    /// was removed still lands.
    #[test]
    fn an_atomic_write_makes_its_directory_again_when_it_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gone/c.json");
        write_atomic(&path, b"one").unwrap();
        std::fs::remove_dir_all(dir.path().join("gone")).unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
    }
}
