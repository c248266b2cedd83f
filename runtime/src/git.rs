//! Git facts about the project: the current commit, what a span of commits changed, and the
//! working tree's state. These feed `commit_required`, `auto_commit` and the git context
//! variables (`step.files_added`, `workflow.commits`, `git.staged`, ...; SPEC §5).

use std::path::Path;

use serde_json::{Value, json};

fn git(project: &Path, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(project)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The commit `HEAD` names, or `None` outside a repository (or before its first commit).
pub fn head(project: &Path) -> Option<String> {
    git(project, &["rev-parse", "HEAD"]).map(|s| s.trim().to_owned())
}

/// Stages everything and commits it with MESSAGE, when there is anything to commit.
pub fn commit_all(project: &Path, message: &str) {
    let _ = git(project, &["add", "-A"]);
    if git(project, &["diff", "--cached", "--quiet"]).is_none() {
        let _ = git(project, &["commit", "-q", "-m", message]);
    }
}

fn lines(text: Option<String>) -> Vec<String> {
    text.unwrap_or_default()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// What the commits after FROM up to `HEAD` changed: `files_added`, `files_modified`,
/// `files_deleted`, `files_changed` (lists of paths), `commits` (hashes, oldest first),
/// `commit_count`, `insertions` and `deletions`.
pub fn changes(project: &Path, from: &str) -> Value {
    let range = format!("{from}..HEAD");
    let mut commits = lines(git(project, &["rev-list", "--reverse", &range]));
    commits.retain(|c| !c.is_empty());
    let (mut added, mut modified, mut deleted, mut changed) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for line in lines(git(
        project,
        &["diff", "--name-status", "--no-renames", from, "HEAD"],
    )) {
        let mut fields = line.split('\t');
        let (Some(status), Some(path)) = (fields.next(), fields.next()) else {
            continue;
        };
        match status.chars().next() {
            Some('A') => added.push(path.to_owned()),
            Some('D') => deleted.push(path.to_owned()),
            _ => modified.push(path.to_owned()),
        }
        changed.push(path.to_owned());
    }
    let (mut insertions, mut deletions) = (0u64, 0u64);
    for line in lines(git(project, &["diff", "--numstat", from, "HEAD"])) {
        let mut fields = line.split('\t');
        // Binary files show `-`; they count as no lines.
        insertions += fields
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        deletions += fields
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
    }
    json!({
        "files_added": added,
        "files_modified": modified,
        "files_deleted": deleted,
        "files_changed": changed,
        "commit_count": commits.len(),
        "commits": commits,
        "insertions": insertions,
        "deletions": deletions,
    })
}

/// The working tree: `staged` (in the index, not committed) and `modified` (changed, not
/// staged) paths.
pub fn status(project: &Path) -> Value {
    json!({
        "staged": lines(git(project, &["diff", "--cached", "--name-only"])),
        "modified": lines(git(project, &["diff", "--name-only"])),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for args in [
            &["init", "-q"][..],
            &["config", "user.email", "t@example.invalid"],
            &["config", "user.name", "t"],
            &["commit", "-q", "--allow-empty", "-m", "base"],
        ] {
            assert!(git(dir.path(), args).is_some(), "git {args:?}");
        }
        dir
    }

    #[test]
    fn changes_lists_files_commits_and_lines() {
        let dir = repo();
        let p = dir.path();
        let base = head(p).unwrap();
        std::fs::write(p.join("a.md"), "one\ntwo\n").unwrap();
        std::fs::write(p.join("b.rs"), "x\n").unwrap();
        commit_all(p, "first");
        std::fs::write(p.join("b.rs"), "y\n").unwrap();
        std::fs::remove_file(p.join("a.md")).unwrap();
        std::fs::write(p.join("c.txt"), "new\n").unwrap();
        commit_all(p, "second");
        let after_first = changes(p, &base);
        assert_eq!(after_first["commit_count"], 2);
        assert_eq!(after_first["files_added"], json!(["b.rs", "c.txt"]));
        assert_eq!(after_first["files_deleted"], json!([]));
        let mid = git(p, &["rev-parse", "HEAD~1"]).unwrap();
        let second = changes(p, mid.trim());
        assert_eq!(second["files_added"], json!(["c.txt"]));
        assert_eq!(second["files_modified"], json!(["b.rs"]));
        assert_eq!(second["files_deleted"], json!(["a.md"]));
        assert_eq!(second["insertions"], 2);
        assert_eq!(second["deletions"], 3);
        assert_eq!(second["commits"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn status_separates_staged_from_modified() {
        let dir = repo();
        let p = dir.path();
        std::fs::write(p.join("a"), "1").unwrap();
        std::fs::write(p.join("b"), "1").unwrap();
        commit_all(p, "files");
        std::fs::write(p.join("a"), "2").unwrap();
        std::fs::write(p.join("b"), "2").unwrap();
        git(p, &["add", "a"]).unwrap();
        let s = status(p);
        assert_eq!(s["staged"], json!(["a"]));
        assert_eq!(s["modified"], json!(["b"]));
    }

    #[test]
    fn outside_a_repository_there_is_no_head() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(head(dir.path()), None);
    }
}
