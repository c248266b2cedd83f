//! Which entries of a pool slot's worktree are new since the slot was readied for its item,
//! from the directories' own stamps, so that the clean before the next item hands
//! `git clean` those paths instead of having it read every directory of a big checkout
//! (docs/performance.md, "Big repositories").
//!
//! A directory's change time moves whenever an entry is added to it, removed from it or
//! renamed in it, and only the kernel sets it. A directory whose change time is less than
//! [`RACY`] older than the look that listed it is "racy": a change within the file system's
//! clock tick could leave its stamp as it was, so it is listed again at every look. Stamps
//! are kept only on file systems whose every write goes through the kernel that runs
//! prodigy ([`local`]); on others (NFS, FUSE, ...) the clean walks the whole worktree.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::os::unix::fs::{DirEntryExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Beyond this many directories (a dependency tree the clean keeps, say) a worktree has no
/// stamps: looking at each of them would cost what the walk it saves does.
const MAX_DIRS: usize = 20_000;
/// Beyond this many entries in all, the same.
const MAX_ENTRIES: usize = 1_000_000;
/// How recent a directory's change time makes it racy.
const RACY: Duration = Duration::from_secs(1);

/// What says a directory changed: its inode (replaced) and its change and modification
/// times, to the nanosecond.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    ctime: (i64, i64),
    mtime: (i64, i64),
}

impl Stamp {
    fn of(path: &Path) -> Option<Self> {
        let meta = std::fs::symlink_metadata(path).ok()?;
        meta.is_dir().then(|| Self {
            ino: meta.ino(),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        })
    }
}

/// An entry of a directory as its listing showed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    ino: u64,
    dir: bool,
}

/// One directory: its stamp and entries when it was last listed.
#[derive(Debug)]
struct Dir {
    stamp: Stamp,
    racy: bool,
    entries: HashMap<OsString, Entry>,
}

impl Dir {
    /// Lists the directory at PATH, stamped BEFORE; NOW is when the look began, in
    /// nanoseconds since the epoch.
    fn list(path: &Path, before: Stamp, now: i128) -> Option<Self> {
        let mut entries = HashMap::new();
        for entry in std::fs::read_dir(path).ok()? {
            let entry = entry.ok()?;
            let dir = entry.file_type().ok()?.is_dir();
            entries.insert(
                entry.file_name(),
                Entry {
                    ino: entry.ino(),
                    dir,
                },
            );
        }
        let after = Stamp::of(path)?;
        // In nanoseconds since the epoch, so that no time (a clock far off, a damaged
        // file system) can overflow.
        let changed = i128::from(before.ctime.0) * 1_000_000_000 + i128::from(before.ctime.1);
        let racy = after != before || changed + RACY.as_nanos().cast_signed() >= now;
        Some(Self {
            stamp: before,
            racy,
            entries,
        })
    }
}

/// What a pool knows of a slot's directories.
#[derive(Debug)]
pub(super) enum Known {
    /// Their stamps when the slot was last readied.
    Stamped(Stamps),
    /// None: the worktree is not on a local file system, is too big, or could not be
    /// read; it is not looked at again.
    Unstamped,
}

/// The directories of a worktree (paths relative to its root, the root itself empty) as
/// they were when the slot was last readied.
#[derive(Debug, Default)]
pub(super) struct Stamps {
    dirs: BTreeMap<PathBuf, Dir>,
}

impl Stamps {
    /// The worktree at ROOT as it is now, listing again only the directories whose stamp
    /// moved since SELF (or that were racy) and those new since; a new worktree's from
    /// `Stamps::default()`. `None` when ROOT cannot be read, is not on a [`local`] file
    /// system or is too big ([`MAX_DIRS`], [`MAX_ENTRIES`]).
    pub(super) fn refresh(mut self, root: &Path) -> Option<Self> {
        if !local(root) {
            return None;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos().cast_signed());
        let mut dirs = BTreeMap::new();
        let mut entries = 0;
        let mut todo = vec![PathBuf::new()];
        while let Some(rel) = todo.pop() {
            let path = root.join(&rel);
            let Some(stamp) = Stamp::of(&path) else {
                // Gone since its parent was listed (nothing writes to an idle slot, but the
                // root must be there).
                if rel.as_os_str().is_empty() {
                    return None;
                }
                continue;
            };
            let dir = match self.dirs.remove(&rel) {
                Some(known) if known.stamp == stamp && !known.racy => known,
                _ => Dir::list(&path, stamp, now)?,
            };
            entries += dir.entries.len();
            if dirs.len() >= MAX_DIRS || entries > MAX_ENTRIES {
                return None;
            }
            todo.extend(
                dir.entries
                    .iter()
                    .filter(|(name, e)| e.dir && name.as_os_str() != ".git")
                    .map(|(name, _)| rel.join(name)),
            );
            dirs.insert(rel, dir);
        }
        Some(Self { dirs })
    }

    /// The directories, relative to the worktree's root (the root itself empty).
    pub(super) fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.dirs.keys().map(PathBuf::as_path)
    }

    /// The entries of the worktree at ROOT that are new since SELF was taken (or replaced:
    /// another inode under the same name), relative to ROOT; what is inside a new directory
    /// is not named. `None` when a directory cannot be read or there are more than LIMIT.
    pub(super) fn new_entries(&self, root: &Path, limit: usize) -> Option<Vec<PathBuf>> {
        let mut found = Vec::new();
        for (rel, dir) in &self.dirs {
            let path = root.join(rel);
            let Some(stamp) = Stamp::of(&path) else {
                // Gone: its parent's listing says whether something else took its name.
                if rel.as_os_str().is_empty() {
                    return None;
                }
                continue;
            };
            if stamp == dir.stamp && !dir.racy {
                continue;
            }
            for entry in std::fs::read_dir(&path).ok()? {
                let entry = entry.ok()?;
                let now = Entry {
                    ino: entry.ino(),
                    dir: entry.file_type().ok()?.is_dir(),
                };
                if dir.entries.get(&entry.file_name()) != Some(&now) {
                    found.push(rel.join(entry.file_name()));
                    if found.len() > limit {
                        return None;
                    }
                }
            }
        }
        Some(found)
    }
}

/// Whether the file system at PATH sees every write to it: a local disk's (ext2/3/4, XFS,
/// Btrfs) or memory (tmpfs). A network or FUSE file system may be written by another
/// machine, and its directories' times read from a cache.
#[cfg(target_os = "linux")]
pub(super) fn local(path: &Path) -> bool {
    use nix::sys::statfs::{
        BTRFS_SUPER_MAGIC, EXT4_SUPER_MAGIC, TMPFS_MAGIC, XFS_SUPER_MAGIC, statfs,
    };
    statfs(path).is_ok_and(|fs| {
        [
            EXT4_SUPER_MAGIC,
            XFS_SUPER_MAGIC,
            BTRFS_SUPER_MAGIC,
            TMPFS_MAGIC,
        ]
        .contains(&fs.filesystem_type())
    })
}

#[cfg(not(target_os = "linux"))]
pub(super) fn local(_: &Path) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(mut found: Vec<PathBuf>) -> Vec<String> {
        found.sort();
        found
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn what_an_item_adds_anywhere_is_found_and_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        if !local(root) {
            eprintln!("skipped: the temporary directory is not on a local file system");
            return;
        }
        for d in ["src/a", "src/b", "items"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
            std::fs::write(root.join(d).join("f.rs"), "x").unwrap();
        }
        std::thread::sleep(RACY + Duration::from_millis(100));
        let stamps = Stamps::default().refresh(root).unwrap();
        assert_eq!(stamps.dirs.len(), 5);
        assert!(stamps.dirs.values().all(|d| !d.racy), "{stamps:?}");
        assert_eq!(
            names(stamps.new_entries(root, 10).unwrap()),
            Vec::<String>::new()
        );

        // What an agent leaves: a file deep down, a new directory with files, a file
        // replaced under its own name; a tracked file changed in place is git status's.
        std::fs::write(root.join("src/b/out.o"), "o").unwrap();
        std::fs::create_dir_all(root.join("target/debug")).unwrap();
        std::fs::write(root.join("target/debug/bin"), "b").unwrap();
        std::fs::write(root.join("items/f.rs.new"), "y").unwrap();
        std::fs::rename(root.join("items/f.rs.new"), root.join("items/f.rs")).unwrap();
        std::fs::write(root.join("src/a/f.rs"), "changed in place").unwrap();
        assert_eq!(
            names(stamps.new_entries(root, 10).unwrap()),
            ["items/f.rs", "src/b/out.o", "target"]
        );
        assert_eq!(stamps.new_entries(root, 2), None, "more than the limit");

        // After the clean and the move, the next look starts from what is there then, and
        // lists again only what moved: the new directory is known from now on.
        std::fs::remove_file(root.join("src/b/out.o")).unwrap();
        let stamps = stamps.refresh(root).unwrap();
        assert_eq!(stamps.dirs.len(), 7);
        std::thread::sleep(RACY + Duration::from_millis(100));
        let stamps = stamps.refresh(root).unwrap();
        assert!(stamps.dirs.values().all(|d| !d.racy), "{stamps:?}");
        std::fs::write(root.join("target/debug/more"), "m").unwrap();
        std::fs::remove_dir_all(root.join("src/a")).unwrap();
        assert_eq!(
            names(stamps.new_entries(root, 10).unwrap()),
            ["target/debug/more"]
        );
    }

    #[test]
    fn a_racy_directory_is_listed_again_whatever_its_stamp() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        if !local(root) {
            eprintln!("skipped: the temporary directory is not on a local file system");
            return;
        }
        std::fs::create_dir(root.join("d")).unwrap();
        let mut stamps = Stamps::default().refresh(root).unwrap();
        assert!(
            stamps.dirs.values().all(|d| d.racy),
            "just made: {stamps:?}"
        );
        // A write in the same clock tick as the look: the stamp does not move.
        std::fs::write(root.join("d/late"), "x").unwrap();
        let d = stamps.dirs.get_mut(Path::new("d")).unwrap();
        d.stamp = Stamp::of(&root.join("d")).unwrap();
        assert_eq!(names(stamps.new_entries(root, 10).unwrap()), ["d/late"]);
        // Once settled, an unmoved stamp is trusted.
        stamps.dirs.get_mut(Path::new("d")).unwrap().racy = false;
        assert!(!names(stamps.new_entries(root, 10).unwrap()).contains(&"d/late".to_owned()));
    }

    #[test]
    fn a_worktree_that_is_not_there_has_no_stamps() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(
            Stamps::default()
                .refresh(&tmp.path().join("absent"))
                .is_none()
        );
    }
}
