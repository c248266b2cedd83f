//! Git facts about the project: the current commit, what a span of commits changed, and the
//! working tree's state. These feed `commit_required`, `auto_commit` and the git context
//! variables (`step.files_added`, `workflow.commits`, `git.staged`, ...; docs/language.md §5).

use std::path::Path;

use serde_json::{Value, json};

/// Runs git without blocking the runtime (other agents go on while it works); its output
/// when it succeeds.
async fn git(project: &Path, args: &[&str]) -> Option<String> {
    crate::worktree::git(project, args).await.ok()
}

/// The commit `HEAD` names, or `None` outside a repository (or before its first commit):
/// read from git's files where they are plain, else asked of git.
pub async fn head(project: &Path) -> Option<String> {
    if let Some(head) = crate::worktree::head_from_files(project) {
        return Some(head);
    }
    git(project, &["rev-parse", "HEAD"])
        .await
        .map(|s| s.trim().to_owned())
}

/// How to commit what a step left (`commit_config`).
#[derive(Clone, Debug, Default)]
pub struct CommitOptions {
    /// The message.
    pub message: String,
    /// `--author`.
    pub author: Option<String>,
    /// `-S`.
    pub sign: bool,
    /// Paths to stage (empty: everything).
    pub include: Vec<String>,
    /// Paths never to stage.
    pub exclude: Vec<String>,
    /// Squash every commit since this one, with the new changes, into one commit.
    pub squash_since: Option<String>,
}

/// How many of the last lines git (and its hooks) printed a failure message quotes.
const SAID_LINES: usize = 20;

/// How many characters of one such line it quotes.
const SAID_LINE_CHARS: usize = 300;

/// Why staging or committing failed (`auto_commit`, `commit_config`).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum CommitError {
    /// A git command (or one of its hooks) failed and printed STDERR; the message quotes its
    /// last lines ([`said`]).
    #[error("`git {command}` failed:\n{}", said(stderr))]
    Failed {
        /// The git subcommand (`add`, `reset`, `commit`).
        command: String,
        /// What git and its hooks printed.
        stderr: String,
    },
    /// A git command failed and printed nothing; HINT says what is likely missing.
    #[error("`git {command}` failed and printed nothing{hint}")]
    Silent {
        /// The git subcommand.
        command: String,
        /// A likely cause, with its leading space (or nothing).
        hint: &'static str,
    },
    /// Git could not be run at all.
    #[error(transparent)]
    Git(crate::worktree::WorktreeError),
}

/// Runs git in PROJECT like [`git`]; when it fails, says so with the last lines git and
/// its hooks printed (bounded; the runner masks secrets in whatever it shows or records).
async fn git_or_say(
    project: &Path,
    args: &[&str],
    hint: &'static str,
) -> Result<String, CommitError> {
    let command = args.first().copied().unwrap_or_default().to_owned();
    match crate::worktree::git(project, args).await {
        Ok(out) => Ok(out),
        Err(crate::worktree::WorktreeError::Git { stderr, .. }) if !stderr.trim().is_empty() => {
            Err(CommitError::Failed { command, stderr })
        }
        Err(crate::worktree::WorktreeError::Git { .. }) => {
            Err(CommitError::Silent { command, hint })
        }
        Err(e) => Err(CommitError::Git(e)),
    }
}

/// The last [`SAID_LINES`] lines of TEXT, each cut at [`SAID_LINE_CHARS`] characters, with
/// a first line that counts what was left out.
fn said(text: &str) -> String {
    let lines: Vec<&str> = text.trim().lines().collect();
    let skipped = lines.len().saturating_sub(SAID_LINES);
    let mut out: Vec<String> = Vec::new();
    if skipped > 0 {
        out.push(format!("({skipped} earlier lines left out)"));
    }
    for line in &lines[skipped..] {
        let mut cut: String = line.chars().take(SAID_LINE_CHARS).collect();
        if cut.len() < line.len() {
            cut.push('…');
        }
        out.push(cut);
    }
    out.join("\n")
}

/// Stages and commits per OPTIONS; nothing to commit is not an error. A failure says what
/// git and its hooks (`pre-commit`, `commit-msg`) printed.
pub async fn commit(project: &Path, options: &CommitOptions) -> Result<(), CommitError> {
    let mut add = vec!["add".to_owned(), "-A".to_owned(), "--".to_owned()];
    if options.include.is_empty() {
        add.push(".".to_owned());
    } else {
        add.extend(options.include.iter().cloned());
    }
    add.extend(options.exclude.iter().map(|p| format!(":(exclude){p}")));
    let add: Vec<&str> = add.iter().map(String::as_str).collect();
    git_or_say(project, &add, "").await?;
    if let Some(base) = &options.squash_since {
        git_or_say(project, &["reset", "--soft", base], "").await?;
    }
    if git(project, &["diff", "--cached", "--quiet"])
        .await
        .is_some()
    {
        return Ok(());
    }
    let mut args = vec!["commit", "-q", "-m", options.message.as_str()];
    let author = options.author.as_ref().map(|a| format!("--author={a}"));
    if let Some(a) = &author {
        args.push(a);
    }
    if options.sign {
        args.push("-S");
    }
    git_or_say(
        project,
        &args,
        " (is a signing key or the author's identity missing?)",
    )
    .await
    .map(|_| ())
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
pub async fn changes(project: &Path, from: &str) -> Value {
    let range = format!("{from}..HEAD");
    let commits = lines(git(project, &["rev-list", "--reverse", &range]).await);
    let (mut added, mut modified, mut deleted, mut changed) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for line in lines(
        git(
            project,
            &["diff", "--name-status", "--no-renames", from, "HEAD"],
        )
        .await,
    ) {
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
    for line in lines(git(project, &["diff", "--numstat", from, "HEAD"]).await) {
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
pub async fn status(project: &Path) -> Value {
    json!({
        "staged": lines(git(project, &["diff", "--cached", "--name-only"]).await),
        "modified": lines(git(project, &["diff", "--name-only"]).await),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn commit_all(project: &Path, message: &str) -> Result<(), CommitError> {
        commit(
            project,
            &CommitOptions {
                message: message.to_owned(),
                ..CommitOptions::default()
            },
        )
        .await
    }

    async fn repo() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for args in [
            &["init", "-q"][..],
            &["config", "user.email", "t@example.invalid"],
            &["config", "user.name", "t"],
            &["commit", "-q", "--allow-empty", "-m", "base"],
        ] {
            assert!(git(dir.path(), args).await.is_some(), "git {args:?}");
        }
        dir
    }

    #[tokio::test]
    async fn changes_lists_files_commits_and_lines() {
        let dir = repo().await;
        let p = dir.path();
        let base = head(p).await.unwrap();
        std::fs::write(p.join("a.md"), "one\ntwo\n").unwrap();
        std::fs::write(p.join("b.rs"), "x\n").unwrap();
        commit_all(p, "first").await.unwrap();
        std::fs::write(p.join("b.rs"), "y\n").unwrap();
        std::fs::remove_file(p.join("a.md")).unwrap();
        std::fs::write(p.join("c.txt"), "new\n").unwrap();
        commit_all(p, "second").await.unwrap();
        let after_first = changes(p, &base).await;
        assert_eq!(after_first["commit_count"], 2);
        assert_eq!(after_first["files_added"], json!(["b.rs", "c.txt"]));
        assert_eq!(after_first["files_deleted"], json!([]));
        let mid = git(p, &["rev-parse", "HEAD~1"]).await.unwrap();
        let second = changes(p, mid.trim()).await;
        assert_eq!(second["files_added"], json!(["c.txt"]));
        assert_eq!(second["files_modified"], json!(["b.rs"]));
        assert_eq!(second["files_deleted"], json!(["a.md"]));
        assert_eq!(second["insertions"], 2);
        assert_eq!(second["deletions"], 3);
        assert_eq!(second["commits"].as_array().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn non_ascii_names_come_back_as_written() {
        let dir = repo().await;
        let p = dir.path();
        let base = head(p).await.unwrap();
        std::fs::write(p.join("café.txt"), "x\n").unwrap();
        commit_all(p, "accent").await.unwrap();
        assert_eq!(changes(p, &base).await["files_added"], json!(["café.txt"]));
    }

    #[tokio::test]
    async fn status_separates_staged_from_modified() {
        let dir = repo().await;
        let p = dir.path();
        std::fs::write(p.join("a"), "1").unwrap();
        std::fs::write(p.join("b"), "1").unwrap();
        commit_all(p, "files").await.unwrap();
        std::fs::write(p.join("a"), "2").unwrap();
        std::fs::write(p.join("b"), "2").unwrap();
        git(p, &["add", "a"]).await.unwrap();
        let s = status(p).await;
        assert_eq!(s["staged"], json!(["a"]));
        assert_eq!(s["modified"], json!(["b"]));
    }

    /// A hook that refuses the commit is quoted: what it printed, its last lines only.
    #[tokio::test]
    async fn a_refusing_hook_is_quoted_in_the_failure() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = repo().await;
        let p = dir.path();
        let hook = p.join(".git/hooks/pre-commit");
        std::fs::create_dir_all(hook.parent().unwrap()).unwrap();
        std::fs::write(
            &hook,
            "#!/bin/sh\nseq 1 30 >&2\necho 'lint: trailing whitespace in a.txt' >&2\nexit 1\n",
        )
        .unwrap();
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(p.join("a.txt"), "x \n").unwrap();
        let why = commit_all(p, "lint me").await.unwrap_err().to_string();
        assert!(why.starts_with("`git commit` failed:\n"), "{why}");
        assert!(why.contains("lint: trailing whitespace in a.txt"), "{why}");
        assert!(why.contains("(11 earlier lines left out)"), "{why}");
        assert!(!why.contains("signing key"), "{why}");
        assert_eq!(why.lines().count(), 22, "{why}");
    }

    #[test]
    fn long_lines_are_cut() {
        let said = said(&"é".repeat(1000));
        assert_eq!(said.chars().count(), SAID_LINE_CHARS + 1);
        assert!(said.ends_with('…'));
    }

    #[tokio::test]
    async fn outside_a_repository_there_is_no_head() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(head(dir.path()).await, None);
    }
}
