//! Candidates of the verified merge queue (docs/mapreduce.md, "Verified integration"): an
//! agent's work stacked on the merged work without moving the integration ref, the scratch
//! worktree that holds a candidate while `merge.verify` tests it, and what a refused
//! candidate's agent is told.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{SessionWorktree, WorktreeError, admin, conflict, git, git_output};
use crate::layout::Layout;

/// One agent's work stacked on a base: the commit the integration ref would move to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stacked {
    /// The commit: the agent's own last commit (a fast-forward), or a merge commit.
    pub commit: String,
    /// Whether it is a fast-forward.
    pub fast_forward: bool,
}

/// Stacks THEIRS (an agent's last commit, branched at `agent_base`) on BASE, without a
/// working tree and without moving any ref: a fast-forward when `fast_forward` allows it, BASE
/// is where the agent branched and its history contains BASE, else a merge commit (`git
/// merge-tree --write-tree`, then `commit-tree`) with MESSAGE. A conflict is
/// [`WorktreeError::Conflict`] naming BRANCH. The verified queue allows no fast-forward:
/// an agent's own commits before its last were never verified, and must not become
/// first-parent states of the merged work.
///
/// # Errors
///
/// The conflict, or git failing.
pub async fn stack(
    session: &SessionWorktree,
    (agent_base, branch): (&str, &str),
    base: &str,
    theirs: &str,
    (message, fast_forward): (&str, bool),
) -> Result<Stacked, WorktreeError> {
    // A fast-forward only when the agent's history contains everything merged so far (an
    // agent may have reset its branch below where it started).
    if fast_forward
        && base == agent_base
        && git(
            &session.path,
            &["merge-base", "--is-ancestor", base, theirs],
        )
        .await
        .is_ok()
    {
        return Ok(Stacked {
            commit: theirs.to_owned(),
            fast_forward: true,
        });
    }
    let args = ["merge-tree", "--write-tree", "--name-only", base, theirs];
    let (code, out, err) = git_output(&session.path, &args).await?;
    match code {
        Some(0) => {
            let tree = out.lines().next().unwrap_or_default().trim().to_owned();
            let args = [
                "commit-tree",
                &tree,
                "-p",
                base,
                "-p",
                theirs,
                "-m",
                message,
            ];
            let commit = git(&session.path, &args).await?;
            Ok(Stacked {
                commit: commit.trim().to_owned(),
                fast_forward: false,
            })
        }
        Some(1) => {
            let (files, output) = conflict(&out);
            Err(WorktreeError::Conflict {
                branch: branch.to_owned(),
                files,
                output,
            })
        }
        _ => Err(WorktreeError::Git {
            args: "merge-tree --write-tree".into(),
            stderr: err,
        }),
    }
}

/// The paths THEIRS changes since it and BASE parted (`git diff BASE...THEIRS`): what the
/// agent's work brings, whatever landed meanwhile.
///
/// # Errors
///
/// When git cannot compare the two.
pub async fn changed_paths(
    session: &SessionWorktree,
    base: &str,
    theirs: &str,
) -> Result<Vec<String>, WorktreeError> {
    let range = format!("{base}...{theirs}");
    let out = git(
        &session.path,
        &["diff", "--name-only", "-z", "--no-renames", &range],
    )
    .await?;
    Ok(out
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect())
}

/// The diff of an agent's work up to THEIRS since it and the merged work parted (`git diff
/// -U0 --find-renames`), with that fork point, for the test-integrity verdict.
///
/// # Errors
///
/// When git cannot read the merged work or compare.
pub async fn work_diff(
    pool: &super::Pool,
    session: &SessionWorktree,
    theirs: &str,
) -> Result<(String, String), WorktreeError> {
    let current = pool.integration(session).await?;
    let fork = git(&session.path, &["merge-base", &current, theirs]).await?;
    let fork = fork.trim().to_owned();
    let patch = git(
        &session.path,
        &["diff", "--no-color", "-U0", "--find-renames", &fork, theirs],
    )
    .await?;
    Ok((patch, fork))
}

/// The text of PATH at commit AT, when it has one.
pub fn file_at(session: &SessionWorktree, at: &str, path: &str) -> Option<String> {
    let spec = format!("{at}:{path}");
    super::command::git_bytes(&session.path, &["show", &spec], None)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

/// What an agent whose work conflicts with BASE (the merged work) is told: the conflicted
/// FILES, then both sides' hunks in them since THEIRS and BASE parted.
pub async fn conflict_report(
    session: &SessionWorktree,
    base: &str,
    theirs: &str,
    files: &[String],
) -> String {
    let mut report = format!("conflicted files: {}\n", files.join(", "));
    let Ok(fork) = git(&session.path, &["merge-base", base, theirs]).await else {
        return report;
    };
    let fork = fork.trim();
    for (title, tip) in [
        ("what landed in the merged work since your work began", base),
        ("your change", theirs),
    ] {
        let mut args = vec!["diff", "--no-color", "--no-renames", fork, tip, "--"];
        args.extend(files.iter().map(String::as_str));
        let diff = git(&session.path, &args).await.unwrap_or_default();
        let _ = write!(report, "\n--- {title}:\n{diff}");
    }
    report
}

/// The scratch worktree that holds the candidate COMMIT while `merge.verify` tests it:
/// `{session}-agent-verify` beside the agents' worktrees (swept with them), created
/// detached at COMMIT the first time, then moved to COMMIT with a forced checkout that
/// removes untracked files and keeps ignored ones (build output, which makes the next
/// verification faster). Either way it is a real checkout. Returns its path and whether it
/// was just created (the `worktree:` preparation runs once, then).
///
/// # Errors
///
/// When git cannot add the worktree or check COMMIT out.
pub async fn scratch(
    layout: &Layout,
    session: &SessionWorktree,
    commit: &str,
) -> Result<(PathBuf, bool), WorktreeError> {
    let path = scratch_path(layout, session);
    if path.join(".git").exists() {
        // A kill mid-checkout may have left git's index lock.
        if let Ok(gitdir) = git(&path, &["rev-parse", "--absolute-git-dir"]).await {
            let _ = std::fs::remove_file(Path::new(gitdir.trim()).join("index.lock"));
        }
        let moved = async {
            git(&path, &["checkout", "-q", "-f", "--detach", commit]).await?;
            git(&path, &["clean", "-q", "-ffd"]).await
        };
        if moved.await.is_ok() {
            return Ok((path, false));
        }
    }
    if path.exists() {
        // Damaged, or half made (a kill mid-`worktree add`): made again.
        super::remove(&session.repo, &path, "").await;
    }
    let _admin = admin(&session.repo).await?;
    let _ = crate::durable::private_dir(&layout.worktrees_dir());
    let at = path.to_string_lossy().into_owned();
    git(
        &session.repo,
        &["worktree", "add", "-q", "--detach", &at, commit],
    )
    .await?;
    Ok((path, true))
}

/// Where [`scratch`] puts the scratch worktree of SESSION.
pub fn scratch_path(layout: &Layout, session: &SessionWorktree) -> PathBuf {
    let name = session
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    layout.worktrees_dir().join(format!("{name}-agent-verify"))
}

/// The paths of CHANGED that a `merge.protect` glob of PROTECT matches. A glob with a `/`
/// is matched against the whole path from the repository's root (`*` stays within one
/// directory, `**` crosses them); one without is matched against each file's name, as in
/// `.gitignore` (`Cargo.lock` protects every `Cargo.lock`). A glob that does not compile
/// (`check` reports it, V112) protects the path spelt exactly so.
pub fn protected<'a>(protect: &[String], changed: &'a [String]) -> Vec<&'a str> {
    let matchers: Vec<(bool, Option<globset::GlobMatcher>, &str)> = protect
        .iter()
        .map(|g| {
            let anchored = g.contains('/');
            let glob = globset::GlobBuilder::new(g.trim_start_matches('/'))
                .literal_separator(true)
                .build()
                .ok()
                .map(|g| g.compile_matcher());
            (anchored, glob, g.as_str())
        })
        .collect();
    changed
        .iter()
        .filter(|path| {
            let name = Path::new(path.as_str())
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            matchers.iter().any(|(anchored, glob, text)| {
                let subject = if *anchored { path.as_str() } else { &name };
                match glob {
                    Some(m) => m.is_match(subject),
                    None => subject == *text,
                }
            })
        })
        .map(String::as_str)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worktree::{create_session, git_sync, repository};

    /// The scratch worktree is a real checkout of each candidate in turn, keeps ignored
    /// build output between them, drops what a verification left untracked, and is made
    /// again when a kill left it half made or locked.
    #[tokio::test]
    async fn the_scratch_worktree_follows_the_candidates_and_survives_a_kill() {
        let project = tempfile::tempdir().unwrap();
        let dir = project.path();
        for args in [
            &["init", "-q", "-b", "main"][..],
            &["config", "user.email", "t@example.invalid"],
            &["config", "user.name", "t"],
        ] {
            git_sync(dir, args).unwrap();
        }
        std::fs::write(dir.join(".gitignore"), "/target\n").unwrap();
        std::fs::write(dir.join("a.txt"), "one\n").unwrap();
        git_sync(dir, &["add", "-A"]).unwrap();
        git_sync(dir, &["commit", "-q", "-m", "one"]).unwrap();
        let first = git_sync(dir, &["rev-parse", "HEAD"]).unwrap();
        std::fs::write(dir.join("a.txt"), "two\n").unwrap();
        git_sync(dir, &["commit", "-q", "-am", "two"]).unwrap();
        let second = git_sync(dir, &["rev-parse", "HEAD"]).unwrap();
        let home = tempfile::tempdir().unwrap();
        let layout = Layout {
            home: home.path().to_owned(),
            repo: "demo".into(),
        };
        let (top, prefix) = repository(dir).unwrap();
        let session = create_session(&layout, &top, &prefix, "s1").await.unwrap();
        let (path, made) = scratch(&layout, &session, first.trim()).await.unwrap();
        assert!(made);
        assert_eq!(
            std::fs::read_to_string(path.join("a.txt")).unwrap(),
            "one\n"
        );
        std::fs::create_dir_all(path.join("target")).unwrap();
        std::fs::write(path.join("target/cache"), "built").unwrap();
        std::fs::write(path.join("left.txt"), "by a step").unwrap();
        let (again, made) = scratch(&layout, &session, second.trim()).await.unwrap();
        assert_eq!((again.as_path(), made), (path.as_path(), false));
        assert_eq!(
            std::fs::read_to_string(path.join("a.txt")).unwrap(),
            "two\n"
        );
        assert!(path.join("target/cache").is_file(), "build output stays");
        assert!(!path.join("left.txt").exists(), "untracked files go");
        // A kill left git's index lock: the next candidate is checked out all the same.
        let gitdir = git_sync(&path, &["rev-parse", "--absolute-git-dir"]).unwrap();
        std::fs::write(Path::new(gitdir.trim()).join("index.lock"), "").unwrap();
        scratch(&layout, &session, first.trim()).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(path.join("a.txt")).unwrap(),
            "one\n"
        );
        // A kill in the middle of `worktree add` left a directory that is no worktree.
        crate::worktree::remove(&session.repo, &path, "").await;
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join("half"), "").unwrap();
        let (_, made) = scratch(&layout, &session, second.trim()).await.unwrap();
        assert!(made);
        assert_eq!(
            std::fs::read_to_string(path.join("a.txt")).unwrap(),
            "two\n"
        );
        assert!(!path.join("half").exists());
    }

    #[test]
    fn a_protect_glob_with_a_slash_is_anchored_and_one_without_matches_names() {
        let protect = vec![
            "tests/run.sh".to_owned(),
            "ci/**".to_owned(),
            "Cargo.lock".to_owned(),
        ];
        let changed: Vec<String> = [
            "tests/run.sh",
            "src/tests/run.sh",
            "ci/a/b.yml",
            "sub/Cargo.lock",
            "src/lib.rs",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(
            protected(&protect, &changed),
            ["tests/run.sh", "ci/a/b.yml", "sub/Cargo.lock"]
        );
    }

    #[test]
    fn a_star_stays_within_one_directory() {
        let protect = vec!["tests/*.sh".to_owned()];
        let changed = vec!["tests/a.sh".to_owned(), "tests/deep/b.sh".to_owned()];
        assert_eq!(protected(&protect, &changed), ["tests/a.sh"]);
    }
}
