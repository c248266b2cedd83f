//! A new worktree filled from the files of another instead of a checkout of the whole tree.
//!
//! A pool's slot worktree (`agent.rs`) is a whole checkout of the job's base: in a big
//! repository, inflating and writing every blob costs seconds per slot (about 1.9 s at
//! 20,000 files), four times in a job's first seconds. The session worktree already holds
//! nearly all of those files. [`fill`] reads each tracked file of the base from there,
//! writes it into the new worktree while hashing it as git hashes a blob, and keeps it only
//! when the hash is the blob's id: whatever the other worktree holds (an edit, a file a
//! later merge changed), what lands in the new worktree is the committed content. The index
//! is then written from the base's tree and the new files' own stat data, so that git sees a
//! clean worktree without reading a file again. Everything that did not match (missing,
//! changed, a symlink written as a file) is checked out by `git checkout-index`, which also
//! records it in the index.
//!
//! A checkout does not always write a blob's bytes: a path whose attributes ask for a
//! conversion (a smudge `filter`, a `working-tree-encoding`, `ident`, an `eol`) is always
//! left to git, since the other worktree's copy of it may predate the attribute (a file
//! committed as UTF-8 and given `working-tree-encoding=UTF-16LE` later is still UTF-8 in the
//! user's checkout, and its status clean). A configuration that converts every text file
//! (`core.autocrlf=true`, `core.eol=crlf`) or writes symlinks as files (`core.symlinks=false`)
//! is not filled at all. The filled worktree is then byte for byte what `git worktree add`
//! writes.
//!
//! Only what this module knows how to write is filled: a SHA-1 repository, git 2.40 or later
//! (attributes read from the base with `check-attr --source`), no submodule, no sparse
//! checkout. Anything else, or any error on the way, says `false` and the caller checks the
//! tree out as before (`reset --hard` writes over whatever was filled).
//!
//! The index written is git's version 2 format (`Documentation/gitformat-index.txt` in
//! git's sources): a header, one entry per path in byte order with its stat data, mode,
//! blob id, flags and NUL-padded name, and the SHA-1 of all of it.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::{File, Metadata, OpenOptions};
use std::io::{Read as _, Write as _};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use sha1::{Digest as _, Sha1};

/// The oldest git [`fill`] works with: `git check-attr --source` came with git 2.40.
pub(super) const CHECK_ATTR_SOURCE: (u32, u32) = (2, 40);

/// Entries a thread takes at a time.
const CHUNK: usize = 256;

/// One path of the base's tree.
struct Entry {
    /// `0o100644`, `0o100755` or `0o120000`.
    mode: u32,
    oid: [u8; 20],
    path: Vec<u8>,
}

/// What an index entry records of its file's `lstat` (the low 32 bits of each, as git
/// keeps them).
#[derive(Clone, Copy, Default)]
struct Stat {
    ctime: (u32, u32),
    mtime: (u32, u32),
    dev: u32,
    ino: u32,
    uid: u32,
    gid: u32,
    size: u32,
}

/// Fills the new worktree DEST (made with `--no-checkout`: its `HEAD` at BASE, no index
/// yet) with BASE's tracked files, read from the worktree SOURCE where they hold BASE's
/// content, and checked out by git where they do not; then writes its index. SLOT: the
/// index in version 4 with the untracked cache, as a pool's slots have it
/// ([`super::agent::SLOT_CHECKOUT`]). `false` when it could not: the caller checks DEST out.
pub(super) fn fill(source: &Path, dest: &Path, base: &str, slot: bool) -> bool {
    if super::git_version().is_none_or(|v| v < CHECK_ATTR_SOURCE) {
        return false;
    }
    let Some(index) = index_path(dest) else {
        return false;
    };
    let Some(mut entries) = tree(dest, base) else {
        return false;
    };
    entries.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    if !plain_checkout(dest) {
        return false;
    }
    let Some(converted) = converted(dest, base, &entries) else {
        return false;
    };
    if !make_dirs(dest, &entries) {
        return false;
    }
    let stats = copy_all(source, dest, &entries, &converted);
    let Some(bytes) = index_bytes(&entries, &stats) else {
        return false;
    };
    if !write_index(&index, &bytes) {
        return false;
    }
    let missed: Vec<&[u8]> = entries
        .iter()
        .zip(&stats)
        .filter(|(_, stat)| stat.is_none())
        .map(|(entry, _)| entry.path.as_slice())
        .collect();
    if !missed.is_empty()
        && super::git_bytes(
            dest,
            &["checkout-index", "-q", "-u", "-f", "-z", "--stdin"],
            Some(nul_separated(&missed)),
        )
        .is_none()
    {
        return false;
    }
    !slot
        || super::git_bytes(
            dest,
            &["update-index", "--index-version", "4", "--untracked-cache"],
            None,
        )
        .is_some()
}

fn nul_separated(paths: &[&[u8]]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(paths.iter().map(|p| p.len() + 1).sum());
    for path in paths {
        bytes.extend_from_slice(path);
        bytes.push(0);
    }
    bytes
}

/// Where DEST's index goes, when the repository's object format is SHA-1 and there is no
/// index there yet and no sparse checkout.
fn index_path(dest: &Path) -> Option<PathBuf> {
    let out = super::git_bytes(
        dest,
        &["rev-parse", "--show-object-format", "--git-path", "index"],
        None,
    )?;
    let text = std::str::from_utf8(&out).ok()?;
    let mut lines = text.lines();
    if lines.next()? != "sha1" {
        return None;
    }
    let index = dest.join(lines.next()?);
    let sparse = super::git_bytes(
        dest,
        &["config", "--type=bool", "--get", "core.sparseCheckout"],
        None,
    );
    let sparse = sparse.is_some_and(|out| out.starts_with(b"true"));
    (!sparse && !index.exists()).then_some(index)
}

/// BASE's files and symlinks (`ls-tree -r`); `None` when it holds a submodule, or cannot be
/// read.
fn tree(dest: &Path, base: &str) -> Option<Vec<Entry>> {
    let out = super::git_bytes(dest, &["ls-tree", "-r", "-z", "--full-tree", base], None)?;
    let mut entries = Vec::new();
    for record in out.split(|&b| b == 0).filter(|r| !r.is_empty()) {
        // "MODE SP TYPE SP OID TAB PATH"
        let tab = memchr::memchr(b'\t', record)?;
        let (head, path) = (&record[..tab], &record[tab + 1..]);
        let mut fields = head.split(|&b| b == b' ');
        let mode = u32::from_str_radix(std::str::from_utf8(fields.next()?).ok()?, 8).ok()?;
        let kind = fields.next()?;
        let oid = hex_oid(fields.next()?)?;
        if kind != b"blob" || !matches!(mode, 0o100_644 | 0o100_755 | 0o120_000) {
            return None;
        }
        entries.push(Entry {
            mode,
            oid,
            path: path.to_vec(),
        });
    }
    Some(entries)
}

fn hex_oid(hex: &[u8]) -> Option<[u8; 20]> {
    if hex.len() != 40 {
        return None;
    }
    let mut oid = [0; 20];
    for (byte, pair) in oid.iter_mut().zip(hex.chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(oid)
}

/// The attributes that make a checkout write something other than the blob's bytes: a
/// smudge `filter`, a `working-tree-encoding`, `ident` (`$Id$` expanded) and an `eol`
/// (`eol=crlf` writes CRLF; any `eol` is left to git). `text` and `crlf` alone convert
/// nothing on a checkout whose line ending is LF, which [`plain_checkout`] makes sure of.
const CONVERTING: [&str; 4] = ["filter", "working-tree-encoding", "ident", "eol"];

/// Whether a checkout in DEST writes blobs as they are, apart from the attributes of
/// [`CONVERTING`]: no `core.autocrlf=true` nor `core.eol=crlf` (which turn the line endings
/// of every text file into CRLF), and symlinks written as symlinks (`core.symlinks`).
/// Read as git reads them, from every configuration file (system, global, the
/// repository's, the worktree's).
fn plain_checkout(dest: &Path) -> bool {
    // One git for the three keys: `KEY NL VALUE NUL` for each value set, in the order git
    // reads its files, so that the last of a key is its value; none set: git's defaults.
    let pattern = r"^core\.(autocrlf|eol|symlinks)$";
    let args = [
        "config",
        "-z",
        "--type=bool-or-str",
        "--get-regexp",
        pattern,
    ];
    let out = super::git_bytes(dest, &args, None).unwrap_or_default();
    let (mut autocrlf, mut eol, mut symlinks) = (None, None, None);
    for record in out.split(|&b| b == 0).filter(|r| !r.is_empty()) {
        let text = String::from_utf8_lossy(record).to_ascii_lowercase();
        let (key, value) = text.split_once('\n').unwrap_or((text.as_str(), ""));
        let value = Some(value.trim().to_owned());
        match key {
            "core.autocrlf" => autocrlf = value,
            "core.eol" => eol = value,
            "core.symlinks" => symlinks = value,
            _ => {}
        }
    }
    autocrlf.is_none_or(|v| v == "false" || v == "input")
        && eol.is_none_or(|v| v != "crlf")
        && symlinks.is_none_or(|v| v != "false")
}

/// The paths of ENTRIES (by position) that a checkout of BASE converts: one of the
/// [`CONVERTING`] attributes is set for it, from the base's `.gitattributes`,
/// `$GIT_DIR/info/attributes` or `core.attributesFile`, as git itself reads them. Git
/// writes those.
fn converted(dest: &Path, base: &str, entries: &[Entry]) -> Option<HashSet<usize>> {
    let paths: Vec<&[u8]> = entries.iter().map(|e| e.path.as_slice()).collect();
    let source = format!("--source={base}");
    let mut args = vec!["check-attr", "-z", "--stdin", &source];
    args.extend(CONVERTING);
    let out = super::git_bytes(dest, &args, Some(nul_separated(&paths)))?;
    // "PATH NUL ATTRIBUTE NUL VALUE NUL", for each path in the order asked, and for each
    // path its attributes in the order asked.
    let fields: Vec<&[u8]> = out.split(|&b| b == 0).collect();
    let per_path = 3 * CONVERTING.len();
    if fields.len() / per_path != entries.len() {
        return None;
    }
    let mut set = HashSet::new();
    for (i, answers) in fields.chunks_exact(per_path).enumerate() {
        let entry = entries.get(i)?;
        for (triple, attribute) in answers.chunks_exact(3).zip(CONVERTING) {
            let [path, name, value] = triple else {
                return None;
            };
            if *path != entry.path.as_slice() || *name != attribute.as_bytes() {
                return None;
            }
            if *value != b"unspecified" && *value != b"unset" {
                set.insert(i);
            }
        }
    }
    Some(set)
}

/// Makes every directory ENTRIES' files go in.
fn make_dirs(dest: &Path, entries: &[Entry]) -> bool {
    let mut made: HashSet<&[u8]> = HashSet::new();
    for entry in entries {
        let Some(slash) = memchr::memrchr(b'/', &entry.path) else {
            continue;
        };
        let dir = &entry.path[..slash];
        if made.insert(dir) && std::fs::create_dir_all(dest.join(OsStr::from_bytes(dir))).is_err() {
            return false;
        }
    }
    true
}

/// Copies ENTRIES from SOURCE to DEST on a few threads: each one's stat data where it was
/// copied, `None` where git is to write it (CONVERTED, or not the blob in SOURCE).
fn copy_all(
    source: &Path,
    dest: &Path,
    entries: &[Entry],
    converted: &HashSet<usize>,
) -> Vec<Option<Stat>> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    let next = AtomicUsize::new(0);
    let mut stats = vec![None; entries.len()];
    let done: Vec<Vec<(usize, Stat)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut buffer = vec![0; 256 * 1024];
                    let mut copied = Vec::new();
                    loop {
                        let start = next.fetch_add(CHUNK, Ordering::Relaxed);
                        if start >= entries.len() {
                            return copied;
                        }
                        let end = (start + CHUNK).min(entries.len());
                        for (i, entry) in entries[start..end].iter().enumerate() {
                            let i = start + i;
                            if converted.contains(&i) {
                                continue;
                            }
                            let path = OsStr::from_bytes(&entry.path);
                            let (from, to) = (source.join(path), dest.join(path));
                            if let Some(stat) = copy_one(&from, &to, entry, &mut buffer) {
                                copied.push((i, stat));
                            }
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_default())
            .collect()
    });
    for (i, stat) in done.into_iter().flatten() {
        stats[i] = Some(stat);
    }
    stats
}

/// Copies ENTRY's file FROM to TO when FROM holds the blob: its stat data there.
fn copy_one(from: &Path, to: &Path, entry: &Entry, buffer: &mut [u8]) -> Option<Stat> {
    let meta = std::fs::symlink_metadata(from).ok()?;
    let mut hasher = Sha1::new();
    if entry.mode == 0o120_000 {
        if !meta.file_type().is_symlink() {
            return None;
        }
        let target = std::fs::read_link(from).ok()?;
        let bytes = target.as_os_str().as_bytes();
        hasher.update(format!("blob {}\0", bytes.len()));
        hasher.update(bytes);
        if hasher.finalize()[..] != entry.oid {
            return None;
        }
        std::os::unix::fs::symlink(&target, to).ok()?;
        return Some(stat_of(&std::fs::symlink_metadata(to).ok()?));
    }
    if !meta.file_type().is_file() {
        return None;
    }
    let mut input = File::open(from).ok()?;
    let mut output = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if entry.mode == 0o100_755 {
            0o777
        } else {
            0o666
        })
        .open(to)
        .ok()?;
    hasher.update(format!("blob {}\0", meta.len()));
    let mut total: u64 = 0;
    loop {
        let n = input.read(buffer).ok()?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        output.write_all(&buffer[..n]).ok()?;
        total += n as u64;
    }
    // What was hashed is what was written: a file that changed while it was read is either
    // still the blob or not kept.
    if total != meta.len() || hasher.finalize()[..] != entry.oid {
        return None;
    }
    // The other file's modification time, as a copy keeps it: older than the index written
    // next, so that git need not read the file again to trust it (a "racily clean" entry).
    output.set_modified(meta.modified().ok()?).ok()?;
    Some(stat_of(&output.metadata().ok()?))
}

/// Git keeps the low 32 bits of each field.
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "git's index keeps the low 32 bits of each stat field, as these casts do"
)]
fn stat_of(meta: &Metadata) -> Stat {
    Stat {
        ctime: (meta.ctime() as u32, meta.ctime_nsec() as u32),
        mtime: (meta.mtime() as u32, meta.mtime_nsec() as u32),
        dev: meta.dev() as u32,
        ino: meta.ino() as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        size: meta.size() as u32,
    }
}

/// The version 2 index of ENTRIES (in byte order of their paths) with STATS (zero where git
/// is to write the file: it sees the entry as changed).
fn index_bytes(entries: &[Entry], stats: &[Option<Stat>]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(12 + entries.len() * 96 + 20);
    out.extend_from_slice(b"DIRC");
    out.extend_from_slice(&2u32.to_be_bytes());
    out.extend_from_slice(&u32::try_from(entries.len()).ok()?.to_be_bytes());
    for (entry, stat) in entries.iter().zip(stats) {
        let s = stat.unwrap_or_default();
        let fields = [
            s.ctime.0, s.ctime.1, s.mtime.0, s.mtime.1, s.dev, s.ino, entry.mode, s.uid, s.gid,
            s.size,
        ];
        for field in fields {
            out.extend_from_slice(&field.to_be_bytes());
        }
        out.extend_from_slice(&entry.oid);
        // Stage 0, no flag; a name of 0xFFF bytes or more says 0xFFF.
        let flags = u16::try_from(entry.path.len().min(0xFFF)).ok()?;
        out.extend_from_slice(&flags.to_be_bytes());
        out.extend_from_slice(&entry.path);
        // 62 bytes before the name; 1 to 8 NULs make the entry a multiple of 8.
        let pad = 8 - (62 + entry.path.len()) % 8;
        out.extend(std::iter::repeat_n(0, pad));
    }
    let sum = Sha1::digest(&out);
    out.extend_from_slice(&sum);
    Some(out)
}

/// Writes BYTES as the index at INDEX the way git does: into `index.lock` (which no one else
/// may hold), renamed over.
fn write_index(index: &Path, bytes: &[u8]) -> bool {
    let mut lock = index.as_os_str().to_owned();
    lock.push(".lock");
    let lock = PathBuf::from(lock);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&lock)
        .and_then(|mut file| file.write_all(bytes));
    if written.is_err() || std::fs::rename(&lock, index).is_err() {
        let _ = std::fs::remove_file(&lock);
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(dir: &Path, args: &[&str]) -> String {
        super::super::git_sync(dir, args).unwrap_or_else(|| panic!("git {args:?} in {dir:?}"))
    }

    fn commit(repo: &Path, paths: &str, message: &str) {
        sh(repo, &["add", paths]);
        let who = ["-c", "user.name=t", "-c", "user.email=t@t"];
        sh(repo, &[&who[..], &["commit", "-q", "-m", message]].concat());
    }

    /// A repository with files in directories, an executable, a symlink and a name that
    /// sorts between a directory's files and its name; and a second worktree of it made
    /// with `--no-checkout`.
    fn project() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        std::fs::create_dir_all(repo.join("src/deep")).unwrap();
        std::fs::write(repo.join("src/lib.rs"), "pub fn f() {}\n").unwrap();
        std::fs::write(repo.join("src/deep/a.txt"), "a\n".repeat(50_000)).unwrap();
        std::fs::write(repo.join("src.txt"), "sorts after src/ in a tree\n").unwrap();
        std::fs::write(repo.join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
        std::fs::set_permissions(
            repo.join("run.sh"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("src/lib.rs", repo.join("link")).unwrap();
        sh(&repo, &["init", "-q", "-b", "main"]);
        commit(&repo, "-A", "base");
        let dest = tmp.path().join("dest");
        let at = dest.to_string_lossy().into_owned();
        sh(
            &repo,
            &[
                "worktree",
                "add",
                "-q",
                "--no-checkout",
                "--detach",
                &at,
                "HEAD",
            ],
        );
        (tmp, repo, dest)
    }

    /// `git ls-files -s` (mode, blob, stage, path) and the files' contents: what a checkout
    /// of HEAD gives.
    fn looks(dir: &Path) -> (String, Vec<(String, Vec<u8>)>) {
        let staged = sh(dir, &["ls-files", "-s"]);
        let files = sh(dir, &["ls-files"])
            .lines()
            .map(|p| {
                let path = dir.join(p);
                let meta = std::fs::symlink_metadata(&path).unwrap();
                let body = if meta.file_type().is_symlink() {
                    std::fs::read_link(&path)
                        .unwrap()
                        .into_os_string()
                        .into_vec()
                } else {
                    std::fs::read(&path).unwrap()
                };
                (format!("{p} {:o}", meta.mode() & 0o170_111), body)
            })
            .collect();
        (staged, files)
    }

    use std::os::unix::ffi::OsStringExt as _;

    #[test]
    fn a_worktree_filled_from_another_is_the_checkout_of_its_commit_and_clean() {
        let (_tmp, repo, dest) = project();
        if !fill(&repo, &dest, "HEAD", true) {
            eprintln!("skipped: git older than 2.40");
            return;
        }
        assert_eq!(looks(&dest), looks(&repo));
        assert_eq!(sh(&dest, &["status", "--porcelain"]), "");
        // The index trusts the files' stat data: no entry is left for git to read again
        // (`diff-files` compares stat data only, without refreshing).
        assert_eq!(sh(&dest, &["diff-files", "--name-only"]), "");
        // A slot's index: version 4, with the untracked cache.
        let index =
            std::fs::read(dest.join(sh(&dest, &["rev-parse", "--git-path", "index"]))).unwrap();
        assert_eq!(index[4..8], 4u32.to_be_bytes());
        assert!(index.windows(4).any(|w| w == b"UNTR"));
    }

    #[test]
    fn what_the_other_worktree_changed_is_checked_out_from_the_commit() {
        let (_tmp, repo, dest) = project();
        let before = looks(&repo);
        std::fs::write(repo.join("src/lib.rs"), "edited, not committed\n").unwrap();
        std::fs::remove_file(repo.join("src/deep/a.txt")).unwrap();
        std::fs::remove_file(repo.join("link")).unwrap();
        std::fs::write(repo.join("link"), "src/lib.rs").unwrap();
        std::fs::write(repo.join("untracked.txt"), "not in the commit\n").unwrap();
        if !fill(&repo, &dest, "HEAD", false) {
            eprintln!("skipped: git older than 2.40");
            return;
        }
        assert_eq!(looks(&dest), before);
        assert!(!dest.join("untracked.txt").exists());
        assert_eq!(sh(&dest, &["status", "--porcelain"]), "");
        assert_eq!(sh(&dest, &["diff-files", "--name-only"]), "");
    }

    #[test]
    fn a_file_a_filter_writes_is_left_to_git() {
        let (_tmp, repo, dest) = project();
        // A smudge filter (configured in the repository) that writes something other than
        // the blob: the filled worktree has what git writes, not the other worktree's file.
        std::fs::write(repo.join(".gitattributes"), "*.txt filter=upper\n").unwrap();
        commit(&repo, ".gitattributes", "attrs");
        sh(&repo, &["config", "filter.upper.smudge", "tr a-z A-Z"]);
        sh(&repo, &["config", "filter.upper.clean", "tr A-Z a-z"]);
        let head = sh(&repo, &["rev-parse", "HEAD"]);
        sh(&dest, &["update-ref", "--no-deref", "HEAD", &head]);
        if !fill(&repo, &dest, "HEAD", false) {
            eprintln!("skipped: git older than 2.40");
            return;
        }
        assert_eq!(
            std::fs::read_to_string(dest.join("src.txt")).unwrap(),
            "SORTS AFTER SRC/ IN A TREE\n"
        );
        assert_eq!(
            std::fs::read_to_string(dest.join("src/lib.rs")).unwrap(),
            "pub fn f() {}\n"
        );
        assert_eq!(sh(&dest, &["status", "--porcelain"]), "");
    }

    /// The repository setups under which a checkout writes something other than the blob's
    /// bytes, each made after the files were committed (as a user adds an attribute later:
    /// their checkout keeps the old bytes, and its status stays clean).
    const CONVERTING_SETUPS: [(&str, &[&str], &str, &str); 8] = [
        // (name, `git config` pairs, committed `.gitattributes`, `info/attributes`)
        (
            "encoding",
            &[],
            "enc.txt working-tree-encoding=UTF-16LE\n",
            "",
        ),
        ("eol in .gitattributes", &[], "*.txt text eol=crlf\n", ""),
        ("eol in info/attributes", &[], "", "*.txt eol=crlf\n"),
        (
            "core.attributesFile",
            &["core.attributesFile", "ATTRS"],
            "",
            "",
        ),
        ("core.autocrlf", &["core.autocrlf", "true"], "", ""),
        ("core.eol", &["core.eol", "crlf"], "* text=auto\n", ""),
        ("ident", &[], "*.c ident\n", ""),
        ("core.symlinks", &["core.symlinks", "false"], "", ""),
    ];

    /// What a person compares between two checkouts: every file's bytes and mode, the
    /// index, `status --ignored` and `diff`.
    fn compared(dir: &Path) -> (String, Vec<(String, String)>, String, String) {
        let (staged, files) = looks(dir);
        // Short enough to read in a failure: a long file by its size and hash.
        let files = files
            .into_iter()
            .map(|(name, body)| {
                let shown = if body.len() > 64 {
                    format!("{} bytes, {:x}", body.len(), Sha1::digest(&body))
                } else {
                    format!("{body:?}")
                };
                (name, shown)
            })
            .collect();
        let status = sh(dir, &["status", "--porcelain", "--ignored"]);
        (staged, files, status, sh(dir, &["diff"]))
    }

    #[tokio::test]
    async fn a_filled_worktree_is_what_git_checks_out_whatever_converts_its_files() {
        if super::super::git_version().is_none_or(|v| v < CHECK_ATTR_SOURCE) {
            eprintln!("skipped: git older than 2.40");
            return;
        }
        for (name, config, attributes, info) in CONVERTING_SETUPS {
            let (tmp, repo, _) = project();
            std::fs::write(repo.join("enc.txt"), "h\u{e9}llo w\u{f6}rld\n").unwrap();
            std::fs::write(repo.join("id.c"), "/* $Id$ */\nint x;\n").unwrap();
            std::fs::write(repo.join("two.txt"), "one\ntwo\n").unwrap();
            commit(&repo, "-A", "files");
            let attrs_file = tmp.path().join("attrs");
            std::fs::write(&attrs_file, "*.txt eol=crlf\n").unwrap();
            for pair in config.chunks(2) {
                let value = pair[1].replace("ATTRS", &attrs_file.to_string_lossy());
                sh(&repo, &["config", pair[0], &value]);
            }
            if !attributes.is_empty() {
                std::fs::write(repo.join(".gitattributes"), attributes).unwrap();
                commit(&repo, ".gitattributes", "attributes");
            }
            if !info.is_empty() {
                let path = repo.join(sh(&repo, &["rev-parse", "--git-path", "info/attributes"]));
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, info).unwrap();
            }
            let add = |dir: &str, no_checkout: bool| {
                let at = tmp.path().join(dir);
                let target = at.to_string_lossy().into_owned();
                let mut args = vec!["worktree", "add", "-q", "--detach"];
                if no_checkout {
                    args.push("--no-checkout");
                }
                args.extend([target.as_str(), "HEAD"]);
                sh(&repo, &args);
                at
            };
            let real = add("real", false);
            // The setup converts something: the user's checkout is not what git writes now.
            assert!(looks(&real).1 != looks(&repo).1, "{name} converts nothing");
            // The session worktree is filled from the user's checkout, a slot from the
            // session worktree.
            let session = add("session", true);
            super::super::check_out(&repo, &session, "HEAD", false)
                .await
                .unwrap();
            let slot = add("slot", true);
            super::super::check_out(&session, &slot, "HEAD", true)
                .await
                .unwrap();
            let expected = compared(&real);
            assert_eq!(compared(&session), expected, "the session worktree, {name}");
            assert_eq!(compared(&slot), expected, "a slot, {name}");
        }
    }

    #[test]
    fn a_worktree_that_has_an_index_is_not_filled() {
        let (_tmp, repo, dest) = project();
        sh(&dest, &["read-tree", "HEAD"]);
        assert!(!fill(&repo, &dest, "HEAD", false));
        assert!(!dest.join("src").exists());
    }
}
