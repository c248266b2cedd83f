//! What a container's agent can reach (docs/containers.md, "What an agent can reach").
//!
//! The agent gets its own worktree read-write and nothing else of the user's: not the
//! checkout, not the repository's git directory (its hooks, its configuration, its refs),
//! not `$PRODIGY_HOME` beyond its own job's state. Its git directory is a private one the
//! coordinator makes for the attempt ([`Sandbox::prepare`]): the worktree's branch at its
//! commit, a copy of its index, excludes and configuration, and the repository's objects
//! borrowed read-only (`objects/info/alternates`), with no hooks. The worktree's `.git` file
//! is covered, inside the container only, by a read-only one that names the private
//! directory, so the agent can neither point git elsewhere for the coordinator nor reach
//! the real git directory. Once the container has ended, the commits the agent made are
//! fetched back from the private directory (`git fetch`, which runs nothing the private
//! directory configures) and the worktree's branch and index are moved to them
//! ([`Sandbox::bring_back`]); the private directory is then removed.

use std::path::{Path, PathBuf};

use crate::backend::Dispatch;
use crate::runner::Runner;
use crate::worktree::command::{WorktreeError, git};

/// What one attempt's container mounts, and the private git directory behind it.
pub(super) struct Sandbox {
    /// `-v` arguments, each `SOURCE:TARGET[:ro]`.
    pub(super) mounts: Vec<String>,
    /// The attempt's private directory (`JOB/container-git/item_N-ATTEMPT`).
    dir: PathBuf,
    /// The agent's worktree and the commit its private git directory started at.
    git: Option<(PathBuf, String)>,
}

/// A mount of PATH at its own path; read-only unless WRITE.
fn mount(path: &Path, write: bool) -> String {
    let path = path.display();
    if write {
        format!("{path}:{path}")
    } else {
        format!("{path}:{path}:ro")
    }
}

/// Why a container agent's sandbox could not be made, or its commits not brought back.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub(super) enum SandboxError {
    /// A file or directory of the sandbox could not be made, written or copied.
    #[error("cannot {what} `{}`: {source}", path.display())]
    #[diagnostic(code(prodigy::container::sandbox_io))]
    Io {
        /// `create`, `write`, `copy`.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Git could not say where the worktree's git files are, or could not set the identity.
    #[error("cannot prepare the agent's git directory for `{}`: {source}", worktree.display())]
    #[diagnostic(code(prodigy::container::sandbox_git))]
    Git {
        /// The agent's worktree.
        worktree: PathBuf,
        /// What git said.
        source: WorktreeError,
    },
    /// `git rev-parse` did not name the worktree's git files.
    #[error("`git rev-parse` in `{}` did not name its git files", worktree.display())]
    #[diagnostic(code(prodigy::container::sandbox_git))]
    Unnamed {
        /// The agent's worktree.
        worktree: PathBuf,
    },
    /// The private git directory's `HEAD` is not a plain ref to a commit.
    #[error("cannot tell which commit the agent's git directory `{}` ends at", dir.display())]
    #[diagnostic(
        code(prodigy::container::no_head),
        help(
            "the agent left its private git directory in a state prodigy does not read; its worktree is kept"
        )
    )]
    NoHead {
        /// The private git directory.
        dir: PathBuf,
    },
    /// The agent's commits could not be fetched, or the worktree not moved to them.
    #[error("the agent's commits could not be brought back from `{}`: {source}", dir.display())]
    #[diagnostic(code(prodigy::container::bring_back))]
    BringBack {
        /// The private git directory, kept.
        dir: PathBuf,
        /// What git said.
        source: WorktreeError,
    },
}

/// An I/O error on PATH.
fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SandboxError {
    let path = path.to_owned();
    move |source| SandboxError::Io { what, path, source }
}

impl Sandbox {
    /// The mounts of D's container: the prodigy program, the job's state read-only with its
    /// container directory, events and logs writable, the workflow file and the env and
    /// secret files it names read-only; the agent's worktree read-write with its private
    /// git directory, or, for a job that runs in place (no worktree), the project itself.
    ///
    /// # Errors
    ///
    /// Why the private git directory or a directory to mount could not be made.
    pub(super) async fn prepare(
        runner: &Runner,
        program: &Path,
        d: &Dispatch,
    ) -> Result<Sandbox, SandboxError> {
        let layout = &runner.opts.layout;
        let dir = d
            .job_dir
            .join("container-git")
            .join(format!("item_{}-{}", d.index, d.attempt));
        let _ = std::fs::remove_dir_all(&dir);
        let mut mounts = vec![mount(program, false), mount(&d.job_dir, false)];
        let container_dir = super::dir(&d.job_dir);
        let events = layout.events_dir(&d.job_id);
        let logs = layout.logs_dir(&d.job_id);
        for writable in [&container_dir, &events, &logs] {
            crate::durable::private_dir(writable).map_err(io("create", writable))?;
            mounts.push(mount(writable, true));
        }
        // What the agent reads of the project: the workflow, and the files it names.
        let project = &runner.opts.project;
        let mut read = Vec::new();
        if let Ok(checkpoint) = crate::jobstore::JobFiles::new(d.job_dir.clone()).load_checkpoint()
        {
            read.push(checkpoint.workflow_file);
        }
        let named = runner
            .plan
            .env_files
            .iter()
            .map(|f| f.value.as_str())
            .chain(runner.plan.secrets.iter().filter_map(|s| match &s.source {
                prodigy_plan::SecretSource::File(path) => Some(path.value.as_str()),
                prodigy_plan::SecretSource::Env(_) => None,
            }));
        read.extend(
            named
                .filter(|name| !name.contains("${"))
                .map(|name| project.join(name)),
        );
        let Some(worktree) = &d.worktree else {
            // A job that runs in place works in the project itself, as its user asked.
            mounts.push(mount(project, true));
            mounts.extend(read.iter().filter(|p| p.is_file()).map(|p| mount(p, false)));
            return Ok(Sandbox {
                mounts,
                dir,
                git: None,
            });
        };
        mounts.extend(
            read.iter()
                .filter(|p| p.is_file() && !p.starts_with(&worktree.path))
                .map(|p| mount(p, false)),
        );
        // A step's environment `command:` runs in the session worktree.
        if let Some(session) = &runner.opts.worktree {
            mounts.push(mount(&session.workdir, false));
        }
        mounts.push(mount(&worktree.path, true));
        // `worktree.link`: the linked directories of the checkout, read-only.
        for entry in &runner.plan.worktree.link {
            let link = worktree.path.join(entry.trim_end_matches('/'));
            if let Ok(target) = std::fs::read_link(&link)
                && target.is_absolute()
                && target.is_dir()
            {
                mounts.push(mount(&target, false));
            }
        }
        let (private, objects, base) = private_git(&worktree.path, &dir).await?;
        mounts.push(mount(&private, true));
        mounts.extend(objects.iter().map(|o| mount(o, false)));
        let dotgit = dir.join("dotgit");
        std::fs::write(&dotgit, format!("gitdir: {}\n", private.display()))
            .map_err(io("write", &dotgit))?;
        mounts.push(format!(
            "{}:{}:ro",
            dotgit.display(),
            worktree.path.join(".git").display()
        ));
        Ok(Sandbox {
            mounts,
            dir,
            git: Some((worktree.path.clone(), base)),
        })
    }

    /// Brings what the agent committed in its private git directory into its worktree:
    /// fetched into the repository, then the worktree's branch and index moved to it (the
    /// files are the agent's already); the private directory is removed. Nothing to do
    /// when the agent committed nothing or has no worktree.
    ///
    /// # Errors
    ///
    /// Why the commits could not be brought back (the private directory is kept then).
    pub(super) async fn bring_back(self) -> Result<(), SandboxError> {
        let Some((worktree, base)) = &self.git else {
            let _ = std::fs::remove_dir_all(&self.dir);
            return Ok(());
        };
        let private = self.dir.join("git");
        // Read from the private directory's files, not by a git there: the agent wrote it.
        let Some(head) = crate::worktree::refs::head_in_git_dir(&private) else {
            return Err(SandboxError::NoHead { dir: private });
        };
        if head != *base {
            let from = private.display().to_string();
            let fetched = git(
                worktree,
                &[
                    "-c",
                    "uploadpack.allowAnySHA1InWant=true",
                    "fetch",
                    "-q",
                    "--no-tags",
                    "--no-write-fetch-head",
                    "--no-recurse-submodules",
                    &from,
                    &head,
                ],
            )
            .await;
            let moved = match fetched {
                Ok(_) => git(worktree, &["reset", "-q", &head]).await,
                Err(e) => Err(e),
            };
            if let Err(source) = moved {
                return Err(SandboxError::BringBack {
                    dir: private,
                    source,
                });
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

/// Makes the private git directory `DIR/git` of the worktree at WORKTREE: its branch at its
/// commit, copies of its index, excludes, sparse patterns and the repository's
/// configuration (with the identity git would commit with here), the repository's object
/// directories as alternates, and no hooks. Returns it, the object directories to mount
/// read-only, and the commit.
async fn private_git(
    worktree: &Path,
    dir: &Path,
) -> Result<(PathBuf, Vec<PathBuf>, String), SandboxError> {
    let ask = async |args: &[&str]| {
        git(worktree, args)
            .await
            .map(|out| out.trim().to_owned())
            .map_err(|source| SandboxError::Git {
                worktree: worktree.to_owned(),
                source,
            })
    };
    let paths = ask(&[
        "rev-parse",
        "--path-format=absolute",
        "--git-common-dir",
        "--git-path",
        "index",
        "--git-path",
        "info/exclude",
        "--git-path",
        "info/sparse-checkout",
        "--git-path",
        "config.worktree",
        "--git-path",
        "shallow",
    ])
    .await?;
    let paths: Vec<PathBuf> = paths.lines().map(PathBuf::from).collect();
    let [common, index, exclude, sparse, worktree_config, shallow] = paths.as_slice() else {
        return Err(SandboxError::Unnamed {
            worktree: worktree.to_owned(),
        });
    };
    let branch = ask(&["symbolic-ref", "-q", "HEAD"]).await.ok();
    let base = ask(&["rev-parse", "HEAD"]).await?;
    let private = dir.join("git");
    for sub in [
        "objects/info",
        "objects/pack",
        "refs/heads",
        "refs/tags",
        "info",
    ] {
        let at = private.join(sub);
        std::fs::create_dir_all(&at).map_err(io("create", &at))?;
    }
    let write = |rel: &str, text: &str| {
        let at = private.join(rel);
        if let Some(parent) = at.parent() {
            std::fs::create_dir_all(parent).map_err(io("create", parent))?;
        }
        std::fs::write(&at, text).map_err(io("write", &at))
    };
    match &branch {
        Some(name) if name.starts_with("refs/heads/") && !name.contains("..") => {
            write("HEAD", &format!("ref: {name}\n"))?;
            write(name, &format!("{base}\n"))?;
        }
        _ => write("HEAD", &format!("{base}\n"))?,
    }
    let objects = object_dirs(common);
    let mut alternates = String::new();
    for o in &objects {
        alternates.push_str(&o.to_string_lossy());
        alternates.push('\n');
    }
    write("objects/info/alternates", &alternates)?;
    for (from, to) in [
        (common.join("config"), "config"),
        (index.clone(), "index"),
        (exclude.clone(), "info/exclude"),
        (sparse.clone(), "info/sparse-checkout"),
        (worktree_config.clone(), "config.worktree"),
        (shallow.clone(), "shallow"),
    ] {
        if from.is_file() {
            let at = private.join(to);
            std::fs::copy(&from, &at).map_err(io("copy", &from))?;
        }
    }
    // The identity git commits with here (the user's global one too), which the
    // container's own configuration does not have.
    let config = private.join("config").display().to_string();
    for key in ["user.name", "user.email"] {
        if let Ok(value) = ask(&["config", "--get", key]).await {
            let set = ["config", "--file", &config, key, &value];
            git(worktree, &set)
                .await
                .map_err(|source| SandboxError::Git {
                    worktree: worktree.to_owned(),
                    source,
                })?;
        }
    }
    Ok((private, objects, base))
}

/// The object directories of the repository whose git directory is COMMON: its own, and
/// those it borrows (`objects/info/alternates`).
fn object_dirs(common: &Path) -> Vec<PathBuf> {
    let mut objects = vec![common.join("objects")];
    if let Ok(text) = std::fs::read_to_string(common.join("objects/info/alternates")) {
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            if let Ok(at) = std::fs::canonicalize(common.join("objects").join(line)) {
                objects.push(at);
            }
        }
    }
    objects
}
