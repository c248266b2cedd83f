//! What an item touched in its slot's worktree, from the kernel's notifications (inotify)
//! on the directories [`super::stamps::Stamps`] knows, so that the release asks
//! `git status` about those paths only instead of having it stat every tracked file of a
//! big checkout (docs/performance.md, "Big repositories").
//!
//! One notification instance per pool (a user has 128 by default), at most [`MAX_WATCHES`]
//! directories watched for it in all. A slot whose notifications may be incomplete (its
//! directories were more than that, the kernel's queue overflowed, more than
//! [`MAX_TOUCHED`] paths were touched) says so, and the release looks at the whole
//! worktree. Only on local file systems, where every write goes through this kernel.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

#[cfg(target_os = "linux")]
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

/// At most this many directories are watched for one pool: a share of the user's watches
/// (8,192 on older kernels) that leaves their editors theirs.
const MAX_WATCHES: usize = 4_096;
/// Beyond this many touched paths the release looks at the whole worktree.
pub(super) const MAX_TOUCHED: usize = 256;

/// What each slot's item touched since the slot was [`Watcher::arm`]ed (a slot is in
/// [`Watcher::slots`] only from then).
#[derive(Debug, Default)]
struct Slot {
    touched: BTreeSet<PathBuf>,
    /// Notifications were lost, or some directories are not watched.
    incomplete: bool,
}

/// The notifications of one pool's slots.
#[derive(Debug, Default)]
pub(super) struct Watcher {
    #[cfg(target_os = "linux")]
    fd: Option<Inotify>,
    #[cfg(target_os = "linux")]
    dirs: HashMap<WatchDescriptor, (PathBuf, PathBuf)>,
    slots: HashMap<PathBuf, Slot>,
}

impl Watcher {
    /// Starts over for the slot at ROOT, readied for its next item: what was touched
    /// before (the move itself) is forgotten, and DIRS (relative to ROOT) are watched.
    #[cfg(target_os = "linux")]
    pub(super) fn arm<'a>(&mut self, root: &Path, dirs: impl Iterator<Item = &'a Path>) {
        self.pump();
        if self.fd.is_none() {
            self.fd = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok();
        }
        let mut slot = Slot::default();
        let Some(fd) = &self.fd else {
            slot.incomplete = true;
            self.slots.insert(root.to_owned(), slot);
            return;
        };
        let mask = AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_ATTRIB
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF
            | AddWatchFlags::IN_ONLYDIR
            | AddWatchFlags::IN_DONT_FOLLOW;
        // The other slots' watches, and this one's as they are added (a directory watched
        // already keeps its descriptor).
        let mut known = self.dirs.values().filter(|(r, _)| r != root).count();
        for rel in dirs {
            known += 1;
            if known > MAX_WATCHES {
                slot.incomplete = true;
                break;
            }
            let Ok(wd) = fd.add_watch(&root.join(rel), mask) else {
                slot.incomplete = true;
                break;
            };
            self.dirs.insert(wd, (root.to_owned(), rel.to_owned()));
        }
        self.slots.insert(root.to_owned(), slot);
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn arm<'a>(&mut self, root: &Path, _: impl Iterator<Item = &'a Path>) {
        let slot = Slot {
            incomplete: true,
            ..Slot::default()
        };
        self.slots.insert(root.to_owned(), slot);
    }

    /// The paths (relative to ROOT) the item in the slot at ROOT touched since it was
    /// armed: created, written, deleted, renamed or changed in mode, directly in a watched
    /// directory (a new directory is named, not what is inside it). `None` when they may
    /// be incomplete, or the slot is not armed.
    pub(super) fn touched(&mut self, root: &Path) -> Option<Vec<PathBuf>> {
        self.pump();
        let slot = self.slots.get(root)?;
        (!slot.incomplete).then(|| slot.touched.iter().cloned().collect())
    }

    /// Stops watching the slot at ROOT (kept or removed).
    pub(super) fn forget(&mut self, root: &Path) {
        self.slots.remove(root);
        #[cfg(target_os = "linux")]
        {
            let gone: Vec<WatchDescriptor> = self
                .dirs
                .iter()
                .filter(|(_, (r, _))| r == root)
                .map(|(wd, _)| *wd)
                .collect();
            for wd in gone {
                self.dirs.remove(&wd);
                if let Some(fd) = &self.fd {
                    let _ = fd.rm_watch(wd);
                }
            }
        }
    }

    /// Reads the notifications waiting, into their slots.
    #[cfg(target_os = "linux")]
    fn pump(&mut self) {
        let Some(fd) = &self.fd else {
            return;
        };
        // Ends with EAGAIN once nothing is waiting.
        while let Ok(events) = fd.read_events() {
            for event in events {
                if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    self.slots.values_mut().for_each(|s| s.incomplete = true);
                    continue;
                }
                let Some((root, rel)) = self.dirs.get(&event.wd) else {
                    continue;
                };
                let Some(slot) = self.slots.get_mut(root) else {
                    continue;
                };
                let path = match &event.name {
                    Some(name) => rel.join(name),
                    // The directory itself: deleted, moved, its mode changed. The root
                    // cannot be named to `git status` alone.
                    None if rel.as_os_str().is_empty() => {
                        slot.incomplete = true;
                        continue;
                    }
                    None => rel.clone(),
                };
                slot.touched.insert(path);
                if slot.touched.len() > MAX_TOUCHED {
                    slot.incomplete = true;
                }
            }
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn pump(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touched(w: &mut Watcher, root: &Path) -> Option<Vec<String>> {
        w.touched(root).map(|found| {
            found
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect()
        })
    }

    #[test]
    fn what_an_item_touches_is_named_and_what_came_before_it_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        if !super::super::stamps::local(root) {
            eprintln!("skipped: the temporary directory is not on a local file system");
            return;
        }
        std::fs::create_dir_all(root.join("src/a")).unwrap();
        std::fs::write(root.join("src/a/f.rs"), "x").unwrap();
        std::fs::write(root.join("top.txt"), "t").unwrap();
        let mut w = Watcher::default();
        assert_eq!(touched(&mut w, root), None, "not armed");
        let dirs = [Path::new(""), Path::new("src"), Path::new("src/a")];
        w.arm(root, dirs.iter().copied());
        assert_eq!(touched(&mut w, root), Some(vec![]));

        // Written in place (no directory changes), a new directory and what is in it, a
        // deletion.
        std::fs::write(root.join("src/a/f.rs"), "changed").unwrap();
        std::fs::create_dir_all(root.join("build/deep")).unwrap();
        std::fs::write(root.join("build/deep/out"), "o").unwrap();
        std::fs::remove_file(root.join("top.txt")).unwrap();
        assert_eq!(
            touched(&mut w, root),
            Some(vec!["build".into(), "src/a/f.rs".into(), "top.txt".into()])
        );

        // Armed again for the next item: what the move did is not the item's.
        std::fs::write(root.join("src/a/f.rs"), "the move").unwrap();
        w.arm(root, dirs.iter().copied());
        assert_eq!(touched(&mut w, root), Some(vec![]));
        std::fs::set_permissions(
            root.join("src/a/f.rs"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        assert_eq!(touched(&mut w, root), Some(vec!["src/a/f.rs".into()]));

        // Too much to name: the whole worktree is looked at.
        for n in 0..=MAX_TOUCHED {
            std::fs::write(root.join(format!("src/n{n}")), "n").unwrap();
        }
        assert_eq!(touched(&mut w, root), None);
        w.forget(root);
        assert_eq!(touched(&mut w, root), None);
    }
}
