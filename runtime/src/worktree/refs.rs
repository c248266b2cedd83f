//! `HEAD` read from git's files, without a git process: a map agent's item asks for it
//! three times (`commit_required` before and after its step, then whether it committed), and
//! in a big repository each `git rev-parse HEAD` costs a few milliseconds of CPU. Only the
//! plain layouts are read (a `.git` directory or file, a loose ref or one in
//! `packed-refs`); anything else (reftable, `GIT_DIR` in the environment, a symbolic ref
//! chain, a ref being rewritten) answers `None`, and the caller asks git.

use std::path::{Path, PathBuf};

/// Whether TEXT is an object name: 40 (SHA-1) or 64 (SHA-256) lowercase hex digits.
fn is_oid(text: &str) -> bool {
    matches!(text.len(), 40 | 64) && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The git directory of the working tree DIR is in (its own, for a linked worktree), found
/// as git does: the first `.git` directory, or file naming one, in DIR or above it.
fn git_dir(dir: &Path) -> Option<PathBuf> {
    for at in dir.ancestors() {
        let dot = at.join(".git");
        let Ok(meta) = std::fs::symlink_metadata(&dot) else {
            continue;
        };
        if meta.is_dir() {
            return Some(dot);
        }
        let text = std::fs::read_to_string(&dot).ok()?;
        let named = Path::new(
            text.strip_prefix("gitdir: ")?
                .trim_end_matches(['\n', '\r']),
        );
        return Some(at.join(named));
    }
    None
}

/// The commit `HEAD` names in the working tree DIR (or a directory inside it), read from
/// git's files; `None` when they are not the plain kind this reads, or name no commit.
pub(crate) fn head_from_files(dir: &Path) -> Option<String> {
    if ["GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
    {
        return None;
    }
    head_in_git_dir(&git_dir(dir)?)
}

/// The commit `HEAD` names in the git directory OWN (a linked worktree's own, or a
/// repository's), read from its files; `None` when they are not the plain kind this reads,
/// or name no commit. Reading never runs anything the directory configures: a container
/// agent's private git directory is read this way.
pub(crate) fn head_in_git_dir(own: &Path) -> Option<String> {
    let own = own.to_path_buf();
    let common = match std::fs::read_to_string(own.join("commondir")) {
        Ok(text) => own.join(text.trim_end_matches(['\n', '\r'])),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => own.clone(),
        Err(_) => return None,
    };
    if common.join("reftable").exists() {
        return None;
    }
    let head = std::fs::read_to_string(own.join("HEAD")).ok()?;
    let head = head.trim_end_matches(['\n', '\r']);
    if is_oid(head) {
        return Some(head.to_owned());
    }
    let name = head.strip_prefix("ref: ")?;
    if !name.starts_with("refs/heads/") || name.contains("..") {
        return None;
    }
    match std::fs::read_to_string(common.join(name)) {
        Ok(text) => {
            let oid = text.trim_end_matches(['\n', '\r']);
            return is_oid(oid).then(|| oid.to_owned());
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(_) => return None,
    }
    let packed = std::fs::read_to_string(common.join("packed-refs")).ok()?;
    packed.lines().find_map(|line| {
        let (oid, refname) = line.split_once(' ')?;
        (refname == name && is_oid(oid)).then(|| oid.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What git prints (trimmed); it must succeed.
    fn git(dir: &Path, args: &[&str]) -> String {
        super::super::git_sync(dir, args).unwrap_or_else(|| panic!("git {args:?} failed"))
    }

    /// What git itself says `HEAD` is, in every layout this reads: a repository, a
    /// directory inside it, a linked worktree, a packed ref, a detached `HEAD`.
    #[test]
    fn head_is_what_git_says_in_every_plain_layout() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir_all(repo.join("sub")).unwrap();
        for args in [
            &["init", "-q", "-b", "main"][..],
            &["config", "user.email", "t@example.invalid"],
            &["config", "user.name", "t"],
            &["commit", "-q", "--allow-empty", "-m", "one"],
        ] {
            git(&repo, args);
        }
        let same =
            |at: &Path| assert_eq!(head_from_files(at), Some(git(at, &["rev-parse", "HEAD"])));
        same(&repo);
        same(&repo.join("sub"));
        let linked = dir.path().join("linked");
        git(
            &repo,
            &[
                "worktree",
                "add",
                "-q",
                "-b",
                "other",
                linked.to_str().unwrap(),
            ],
        );
        git(&linked, &["commit", "-q", "--allow-empty", "-m", "two"]);
        same(&linked);
        assert_ne!(head_from_files(&linked), head_from_files(&repo));
        git(&repo, &["pack-refs", "--all"]);
        assert!(!repo.join(".git/refs/heads/other").exists(), "packed");
        same(&linked);
        same(&repo);
        git(&linked, &["switch", "-q", "--detach", "main"]);
        same(&linked);
    }

    /// An unborn branch, or no repository, names no commit.
    #[test]
    fn no_commit_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(head_from_files(dir.path()), None);
        git(dir.path(), &["init", "-q", "-b", "main"]);
        assert_eq!(head_from_files(dir.path()), None);
    }
}
