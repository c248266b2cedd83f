//! Preparing a worktree prodigy made (docs/language.md §11, `worktree:`): untracked files of
//! the user's checkout copied in (`copy`), directories symlinked (`link`), the map agents'
//! sparse checkout (`sparse`), and the `setup` steps, run once per worktree.
//!
//! [`prepare`] is called each time a worktree is handed to a session or an agent: copies and
//! links are made again (cleaning a reused agent worktree removes them), while the sparse
//! checkout and `setup` happen only until [`mark_prepared`] notes, in the worktree's own git
//! directory, that setup succeeded there. Copied and linked paths are added to the
//! repository's `info/exclude`, so that an agent's `git add -A` never commits them; git reads
//! only the common `info/exclude`, so the lines also apply in the user's checkout, where the
//! originals are. Only names reach events and messages, never a copied file's contents.

use std::path::{Path, PathBuf};

use prodigy_plan::PlanWorktree;

pub use super::records::PrepareNote;
use super::{WorktreeError, git};

/// The block of `info/exclude` lines prodigy adds.
pub(crate) const EXCLUDE_HEADER: &str =
    "# prodigy: files copied or linked into its worktrees (worktree: copy, link)";

/// Why a worktree could not be prepared.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum BootstrapError {
    /// A git command failed.
    #[error(transparent)]
    Git(#[from] WorktreeError),
    /// A file could not be copied, linked or written.
    #[error("cannot {what} `{path}`: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Why a worktree's preparation (`worktree:` copies, links and `setup`) failed.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum PrepareError {
    /// Copying, linking or marking it failed.
    #[error("cannot prepare the worktree {}: {source}", root.display())]
    Prepare {
        /// The worktree.
        root: PathBuf,
        /// Why.
        source: BootstrapError,
    },
    /// A `worktree.setup` step failed.
    #[error("`worktree.setup` step {number} of {total} (`{label}`) failed in {}", root.display())]
    Setup {
        /// The step's number, from 1.
        number: usize,
        /// How many steps `setup` has.
        total: usize,
        /// The step.
        label: String,
        /// The worktree.
        root: PathBuf,
    },
}

pub(crate) fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BootstrapError {
    let path = path.to_owned();
    move |source| BootstrapError::Io { what, path, source }
}

/// What [`prepare`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prepared {
    /// The files copied, relative to the repository's root.
    pub copied: Vec<String>,
    /// The directories linked.
    pub linked: Vec<String>,
    /// What is worth a note: an entry that matched nothing, a tracked file not copied.
    pub notes: Vec<PrepareNote>,
    /// Whether `setup` is still to run in this worktree.
    pub needs_setup: bool,
    /// Whether the worktree was not prepared before (its notes are said then only).
    pub first: bool,
}

/// Prepares the worktree at WORKTREE (its root) from the user's checkout at SOURCE (the
/// repository's top level) as PREP says; AGENT: a map agent's worktree, the only kind that
/// is made sparse.
///
/// # Errors
///
/// When git fails or a file cannot be copied or linked.
pub async fn prepare(
    source: &Path,
    worktree: &Path,
    prep: &PlanWorktree,
    agent: bool,
) -> Result<Prepared, BootstrapError> {
    let mut done = Prepared::default();
    if prep.is_empty() {
        return Ok(done);
    }
    let marker = own_git_dir(worktree)
        .await?
        .join(crate::layout::PREPARED_MARKER);
    let first = !marker.exists();
    done.first = first;
    if first && agent && !prep.sparse.is_empty() {
        let mut args = vec!["sparse-checkout", "set", "--cone", "--"];
        args.extend(prep.sparse.iter().map(String::as_str));
        git(worktree, &args).await?;
    }
    // Links first, so that a copy entry that reaches into a linked directory sees the link.
    link(source, worktree, &prep.link, &mut done)?;
    copy(source, worktree, &prep.copy, &mut done).await?;
    exclude(worktree, &done).await?;
    done.needs_setup = first && !prep.setup.is_empty();
    if first && prep.setup.is_empty() {
        mark_prepared(worktree).await?;
    }
    Ok(done)
}

/// Notes that `setup` succeeded in the worktree at WORKTREE: [`prepare`] no longer asks for
/// it, however often the worktree is reused.
///
/// # Errors
///
/// When the worktree's git directory cannot be found or written.
pub async fn mark_prepared(worktree: &Path) -> Result<(), BootstrapError> {
    let marker = own_git_dir(worktree)
        .await?
        .join(crate::layout::PREPARED_MARKER);
    std::fs::write(&marker, "").map_err(io("write", &marker))
}

/// Forgets that `setup` ran in the worktree at WORKTREE ([`mark_prepared`]): the next
/// [`prepare`] prepares it as a new one (a spare taken by another job, whose workflow may
/// prepare it differently).
///
/// # Errors
///
/// When the worktree's git directory cannot be found, or the marker there not removed.
pub(crate) async fn forget_prepared(worktree: &Path) -> Result<(), BootstrapError> {
    let marker = own_git_dir(worktree)
        .await?
        .join(crate::layout::PREPARED_MARKER);
    match std::fs::remove_file(&marker) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove", &marker)(e)),
        _ => Ok(()),
    }
}

/// The worktree's own git directory (`.git/worktrees/NAME`), which git removes with it.
pub(crate) async fn own_git_dir(worktree: &Path) -> Result<PathBuf, WorktreeError> {
    let dir = git(worktree, &["rev-parse", "--absolute-git-dir"]).await?;
    Ok(PathBuf::from(dir.trim()))
}

/// Copies the untracked files of SOURCE that ENTRIES name (paths or globs, `*` within a
/// directory, `**` across) into WORKTREE, modes kept.
pub(crate) async fn copy(
    source: &Path,
    worktree: &Path,
    entries: &[String],
    done: &mut Prepared,
) -> Result<(), BootstrapError> {
    if entries.is_empty() {
        return Ok(());
    }
    // Git matches the pathspecs and lists only what it does not track, ignored files included.
    let mut args = vec!["ls-files", "-z", "--others", "--"];
    let specs: Vec<String> = entries.iter().map(|e| format!(":(glob){e}")).collect();
    args.extend(specs.iter().map(String::as_str));
    let listed = git(source, &args).await?;
    let files: Vec<&str> = listed.split('\0').filter(|f| !f.is_empty()).collect();
    for entry in entries {
        let glob = globset::GlobBuilder::new(entry)
            .literal_separator(true)
            .build()
            .map(|g| g.compile_matcher());
        let matches = |f: &str| match &glob {
            Ok(m) => m.is_match(f),
            Err(_) => f == entry,
        };
        if files.iter().any(|f| matches(f)) {
            continue;
        }
        if source.join(entry).is_file() {
            done.notes.push(PrepareNote::CopyTracked {
                entry: entry.clone(),
            });
        } else {
            done.notes.push(PrepareNote::CopyMatchesNothing {
                entry: entry.clone(),
                source: source.to_path_buf(),
            });
        }
    }
    for file in files {
        let from = source.join(file);
        if !from.is_file() {
            continue;
        }
        // A file under a linked directory is there through the link already; writing it
        // would write (and first remove) the user's own file through the link.
        if through_link(worktree, file) {
            done.notes.push(PrepareNote::CopyThroughLink {
                file: file.to_owned(),
            });
            continue;
        }
        let to = worktree.join(file);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(io("create", parent))?;
        }
        // A file left by an earlier item goes first: it may be read-only.
        let _ = std::fs::remove_file(&to);
        // `std::fs::copy` copies the permission bits too.
        std::fs::copy(&from, &to).map_err(io("copy", &from))?;
        done.copied.push(file.to_owned());
    }
    Ok(())
}

/// Whether a directory on the way from WORKTREE to FILE (relative to it) is a symbolic link.
pub(crate) fn through_link(worktree: &Path, file: &str) -> bool {
    let mut at = worktree.to_path_buf();
    let parts: Vec<&str> = file.split('/').collect();
    for part in &parts[..parts.len().saturating_sub(1)] {
        at.push(part);
        if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            return true;
        }
    }
    false
}

/// Whether PATH (relative to a worktree's root; a directory ends with `/`) is what PREP
/// copies or links into every worktree.
pub(crate) fn is_prepared(prep: &PlanWorktree, path: &str) -> bool {
    let path = path.trim_end_matches('/');
    prep.link.iter().any(|l| l.trim_end_matches('/') == path)
        || prep.copy.iter().any(|c| {
            c == path
                || globset::GlobBuilder::new(c)
                    .literal_separator(true)
                    .build()
                    .is_ok_and(|g| g.compile_matcher().is_match(path))
        })
}

/// Symlinks the directories of SOURCE that ENTRIES name into WORKTREE.
pub(crate) fn link(
    source: &Path,
    worktree: &Path,
    entries: &[String],
    done: &mut Prepared,
) -> Result<(), BootstrapError> {
    for entry in entries {
        let entry = entry.trim_end_matches('/');
        let from = source.join(entry);
        if !from.is_dir() {
            done.notes.push(PrepareNote::LinkNotADirectory {
                entry: entry.to_owned(),
                source: source.to_path_buf(),
            });
            continue;
        }
        let to = worktree.join(entry);
        match std::fs::symlink_metadata(&to) {
            Ok(meta) if meta.file_type().is_symlink() => {
                std::fs::remove_file(&to).map_err(io("replace", &to))?;
            }
            Ok(_) => {
                done.notes.push(PrepareNote::LinkExists {
                    entry: entry.to_owned(),
                });
                continue;
            }
            Err(_) => {}
        }
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(io("create", parent))?;
        }
        std::os::unix::fs::symlink(&from, &to).map_err(io("link", &to))?;
        done.linked.push(entry.to_owned());
    }
    Ok(())
}

/// One writer of `info/exclude` at a time in this process: agents are prepared concurrently.
static EXCLUDE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Adds what DONE copied and linked to the repository's `info/exclude`, as anchored paths
/// (no trailing `/`: a symlink is no directory to git), each line once.
pub(crate) async fn exclude(worktree: &Path, done: &Prepared) -> Result<(), BootstrapError> {
    if done.copied.is_empty() && done.linked.is_empty() {
        return Ok(());
    }
    let common = git(
        worktree,
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
    )
    .await?;
    let info = PathBuf::from(common.trim()).join("info");
    let path = info.join("exclude");
    let _guard = crate::lock(&EXCLUDE);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let present: std::collections::HashSet<&str> = text.lines().map(str::trim).collect();
    let mut missing: Vec<String> = Vec::new();
    for name in done.copied.iter().chain(&done.linked) {
        let line = format!("/{}", escape(name));
        if !present.contains(line.as_str()) && !missing.contains(&line) {
            missing.push(line);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let header = present.contains(EXCLUDE_HEADER);
    let mut out = text.clone();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    if !header {
        out.push_str(EXCLUDE_HEADER);
        out.push('\n');
    }
    for line in missing {
        out.push_str(&line);
        out.push('\n');
    }
    std::fs::create_dir_all(&info).map_err(io("create", &info))?;
    std::fs::write(&path, out).map_err(io("write", &path))
}

/// NAME as a literal gitignore pattern.
pub(crate) fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '*' | '?' | '[' | '\\' | '!' | '#') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn sh(dir: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A repository with a tracked file, a `.env` nobody ignores, an executable untracked
    /// script and a cache directory; and a worktree of it.
    fn project() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir_all(repo.join("cache/pkg")).unwrap();
        sh(&repo, &["init", "-q", "-b", "main"]);
        sh(&repo, &["config", "user.email", "t@example.invalid"]);
        sh(&repo, &["config", "user.name", "t"]);
        std::fs::write(repo.join("README"), "r\n").unwrap();
        sh(&repo, &["add", "README"]);
        sh(&repo, &["commit", "-q", "-m", "base"]);
        std::fs::write(repo.join(".env"), "TOKEN=s3cr3t\n").unwrap();
        std::fs::create_dir_all(repo.join("conf")).unwrap();
        std::fs::write(repo.join("conf/a.local"), "a").unwrap();
        std::fs::write(repo.join("run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(repo.join("run.sh"), std::fs::Permissions::from_mode(0o751))
            .unwrap();
        std::fs::write(repo.join("cache/pkg/lib"), "x").unwrap();
        let wt = dir.path().join("wt");
        sh(
            &repo,
            &["worktree", "add", "-q", "-b", "w", wt.to_str().unwrap()],
        );
        (dir, wt)
    }

    fn prep() -> PlanWorktree {
        PlanWorktree {
            copy: vec![
                ".env".into(),
                "conf/*.local".into(),
                "run.sh".into(),
                "README".into(),
                "nope".into(),
            ],
            link: vec!["cache".into()],
            ..PlanWorktree::default()
        }
    }

    #[tokio::test]
    async fn copies_and_links_are_made_and_never_committed() {
        let (dir, wt) = project();
        let repo = dir.path().join("repo");
        let done = prepare(&repo, &wt, &prep(), true).await.unwrap();
        assert_eq!(done.copied, [".env", "conf/a.local", "run.sh"]);
        assert_eq!(done.linked, ["cache"]);
        assert_eq!(done.notes.len(), 2, "{:?}", done.notes);
        assert_eq!(
            done.notes[0],
            PrepareNote::CopyTracked {
                entry: "README".into()
            }
        );
        assert!(
            matches!(&done.notes[1], PrepareNote::CopyMatchesNothing { entry, .. } if entry == "nope")
        );
        assert!(!done.needs_setup);
        assert_eq!(
            std::fs::read_to_string(wt.join(".env")).unwrap(),
            "TOKEN=s3cr3t\n"
        );
        let mode = std::fs::metadata(wt.join("run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o751);
        assert!(
            std::fs::symlink_metadata(wt.join("cache"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            std::fs::read_to_string(wt.join("cache/pkg/lib")).unwrap(),
            "x"
        );
        // An agent's `git add -A` commits none of them.
        std::fs::write(wt.join("work.txt"), "w").unwrap();
        sh(&wt, &["add", "-A"]);
        sh(&wt, &["commit", "-q", "-m", "agent"]);
        let files = sh(&wt, &["ls-tree", "-r", "--name-only", "HEAD"]);
        assert_eq!(files, "README\nwork.txt\n");
        // Prepared again (a reused worktree): the same lines, once.
        prepare(&repo, &wt, &prep(), true).await.unwrap();
        let exclude = std::fs::read_to_string(repo.join(".git/info/exclude")).unwrap();
        assert_eq!(exclude.matches("/.env\n").count(), 1, "{exclude}");
        assert_eq!(exclude.matches(EXCLUDE_HEADER).count(), 1, "{exclude}");
    }

    /// A copy entry that reaches into a linked directory never writes through the link: the
    /// second preparation (a resume) would otherwise remove the user's own file.
    #[tokio::test]
    async fn a_copy_inside_a_linked_directory_leaves_the_users_file_alone() {
        let (dir, wt) = project();
        let repo = dir.path().join("repo");
        let prep = PlanWorktree {
            copy: vec!["**/lib".into()],
            link: vec!["cache".into()],
            ..PlanWorktree::default()
        };
        let first = prepare(&repo, &wt, &prep, false).await.unwrap();
        assert!(first.copied.is_empty(), "{:?}", first.copied);
        let again = prepare(&repo, &wt, &prep, false).await.unwrap();
        assert!(again.copied.is_empty(), "{:?}", again.copied);
        assert!(
            again
                .notes
                .iter()
                .any(|n| matches!(n, PrepareNote::CopyThroughLink { .. })),
            "{:?}",
            again.notes
        );
        assert_eq!(
            std::fs::read_to_string(repo.join("cache/pkg/lib")).unwrap(),
            "x"
        );
    }

    #[test]
    fn what_is_copied_or_linked_is_known_as_prepared() {
        let prep = prep();
        for yes in [".env", "conf/b.local", "cache/", "cache"] {
            assert!(is_prepared(&prep, yes), "{yes}");
        }
        for no in ["conf/x/b.local", "src/", ".envrc"] {
            assert!(!is_prepared(&prep, no), "{no}");
        }
    }

    #[tokio::test]
    async fn setup_is_asked_for_until_it_is_marked_done() {
        let (dir, wt) = project();
        let repo = dir.path().join("repo");
        let prep = PlanWorktree {
            setup: vec![prodigy_plan::StepId(0)],
            ..PlanWorktree::default()
        };
        assert!(prepare(&repo, &wt, &prep, true).await.unwrap().needs_setup);
        assert!(prepare(&repo, &wt, &prep, true).await.unwrap().needs_setup);
        mark_prepared(&wt).await.unwrap();
        assert!(!prepare(&repo, &wt, &prep, true).await.unwrap().needs_setup);
        // The user's checkout is not marked.
        assert!(
            !repo
                .join(".git")
                .join(crate::layout::PREPARED_MARKER)
                .exists()
        );
    }

    #[tokio::test]
    async fn an_agent_worktree_is_sparse_and_its_commits_keep_the_whole_tree() {
        let (dir, wt) = project();
        let repo = dir.path().join("repo");
        for f in ["a/in.txt", "b/out.txt"] {
            std::fs::create_dir_all(repo.join(f).parent().unwrap()).unwrap();
            std::fs::write(repo.join(f), f).unwrap();
        }
        sh(&repo, &["add", "a", "b"]);
        sh(&repo, &["commit", "-q", "-m", "tree"]);
        sh(&wt, &["reset", "-q", "--hard", "main"]);
        let prep = PlanWorktree {
            sparse: vec!["a".into()],
            ..PlanWorktree::default()
        };
        prepare(&repo, &wt, &prep, true).await.unwrap();
        assert!(wt.join("a/in.txt").is_file());
        assert!(!wt.join("b/out.txt").exists(), "outside the cone");
        std::fs::write(wt.join("a/new.txt"), "n").unwrap();
        sh(&wt, &["add", "-A"]);
        sh(&wt, &["commit", "-q", "-m", "agent"]);
        let files = sh(&wt, &["ls-tree", "-r", "--name-only", "HEAD"]);
        assert_eq!(files, "README\na/in.txt\na/new.txt\nb/out.txt\n");
        // A session worktree is never made sparse.
        let other = dir.path().join("other");
        sh(
            &repo,
            &["worktree", "add", "-q", "-b", "o", other.to_str().unwrap()],
        );
        prepare(&repo, &other, &prep, false).await.unwrap();
        assert!(other.join("b/out.txt").is_file());
    }
}
