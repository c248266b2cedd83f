//! Where everything prodigy keeps lives: every path under `$PRODIGY_HOME` and every file it
//! leaves in a repository. Other modules ask this one for paths and own what the files hold;
//! the unit tests below pin every path, so that a change here never moves files silently
//! (a resumed run or job reads what an earlier version wrote).
//!
//! Under `$PRODIGY_HOME` (default `~/.prodigy`), for the project namespace REPO
//! ([`namespace`]):
//!
//! ```text
//! events/REPO/ID/events-STAMP.jsonl              events of a run or job (one file a process)
//! state/REPO/sessions/SESSION/checkpoint.json    a standard run's checkpoint
//! state/REPO/sessions/SESSION/lock               held by the process running it
//! state/REPO/mapreduce/jobs/JOB/checkpoint.json  a job's checkpoint
//!                              /items.json       the items after the input pipeline
//!                              /results.jsonl    the journal of item outcomes
//!                              /lock             held by the process running it
//!                              /merges.jsonl     agent merges about to happen
//!                              /kept-worktrees.jsonl  agent worktrees kept
//!                              /BACKEND/item_N.result.json  a remote task's result
//! dlq/REPO/JOB/mapreduce/dlq/JOB/index.json      the dead letter queue's index
//!                               /items/ITEM.json one dead-lettered item
//! logs/REPO/ID/OWNER/                            step logs (`steps`, or the item id)
//! worktrees/REPO/SESSION                         a session worktree
//! worktrees/REPO/SESSION-agent-N                 an agent worktree slot
//! ```
//!
//! In the repository: [`WORKTREE_ADMIN_LOCK`] and [`branch_lock`] in the common git
//! directory, [`PREPARED_MARKER`] in a worktree's own git directory.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// A standard run or a MapReduce job: what keeps its state where.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    /// A standard run (`session-…`, under `sessions/`), continued with `prodigy resume`.
    Run,
    /// A MapReduce job (`mapreduce-…`, under `mapreduce/jobs/`), continued with
    /// `prodigy resume-job`.
    Job,
}

/// A run's or job's checkpoint, in its state directory.
pub const CHECKPOINT: &str = "checkpoint.json";
/// A standard run's checkpoint journal, beside its checkpoint ([`crate::store::CheckpointJournal`]).
pub const JOURNAL: &str = "checkpoint.journal";
/// The lock of a run or job, in its state directory ([`crate::store::SessionLock`]).
pub const LOCK: &str = "lock";
/// A job's items after the input pipeline, in its state directory.
pub const ITEMS: &str = "items.json";
/// A job's journal of item outcomes, in its state directory.
pub const RESULTS: &str = "results.jsonl";
/// A job's journal of agent merges ([`crate::merge_journal`]).
pub const MERGES: &str = "merges.jsonl";
/// The agent worktrees a job kept for their uncommitted changes.
pub const KEPT_WORKTREES: &str = "kept-worktrees.jsonl";
/// The DLQ's index, in the DLQ's directory.
pub const DLQ_INDEX: &str = "index.json";
/// The lock around worktree administration, in the repository's common git directory.
pub const WORKTREE_ADMIN_LOCK: &str = "prodigy-worktrees.lock";
/// The marker of a prepared worktree (its `setup` ran), in the worktree's own git directory.
pub const PREPARED_MARKER: &str = "prodigy-prepared";

/// How the directory of a spare agent worktree starts ([`Layout::spare_worktree`]): no
/// session id does.
const SPARE_PREFIX: &str = "spare-";

/// Where runs of one project keep their files.
#[derive(Clone, Debug)]
pub struct Layout {
    /// `$PRODIGY_HOME` (default `~/.prodigy`).
    pub home: PathBuf,
    /// The project's namespace, [`namespace`] of its directory.
    pub repo: String,
}

impl Layout {
    /// The layout of the project at PROJECT under `$PRODIGY_HOME`.
    pub fn of_project(project: &Path) -> Self {
        Layout {
            home: Layout::home(),
            repo: namespace(project),
        }
    }

    /// `$PRODIGY_HOME`, else `~/.prodigy`.
    pub fn home() -> PathBuf {
        std::env::var_os("PRODIGY_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".prodigy")))
            .unwrap_or_else(|| PathBuf::from(".prodigy"))
    }

    /// `state/`: the state of every project.
    pub fn state_root(home: &Path) -> PathBuf {
        home.join("state")
    }

    /// `events/`: the events of every project.
    pub fn events_root(home: &Path) -> PathBuf {
        home.join("events")
    }

    /// `dlq/`: the dead letter queues of every project.
    pub fn dlq_root(home: &Path) -> PathBuf {
        home.join("dlq")
    }

    /// `logs/`: the logs of every project.
    pub fn logs_root(home: &Path) -> PathBuf {
        home.join("logs")
    }

    /// The layouts of every project with state under HOME (`state/*`).
    pub fn projects(home: &Path) -> Vec<Layout> {
        let Ok(entries) = std::fs::read_dir(Layout::state_root(home)) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .map(|e| Layout {
                home: home.to_owned(),
                repo: e.file_name().to_string_lossy().into_owned(),
            })
            .collect()
    }

    /// `events/{repo}/{id}/`.
    pub fn events_dir(&self, id: &str) -> PathBuf {
        Layout::events_root(&self.home).join(&self.repo).join(id)
    }

    /// `state/{repo}/sessions/`.
    pub fn sessions_dir(&self) -> PathBuf {
        Layout::state_root(&self.home)
            .join(&self.repo)
            .join("sessions")
    }

    /// `state/{repo}/sessions/{session}/`.
    pub fn session_dir(&self, session: &str) -> PathBuf {
        self.sessions_dir().join(session)
    }

    /// `state/{repo}/mapreduce/jobs/`.
    pub fn jobs_dir(&self) -> PathBuf {
        Layout::state_root(&self.home)
            .join(&self.repo)
            .join("mapreduce")
            .join("jobs")
    }

    /// `state/{repo}/mapreduce/jobs/{job_id}/`.
    pub fn job_dir(&self, job: &str) -> PathBuf {
        self.jobs_dir().join(job)
    }

    /// The state directory of ID, a run or a job.
    pub fn state_dir(&self, kind: RunKind, id: &str) -> PathBuf {
        match kind {
            RunKind::Run => self.session_dir(id),
            RunKind::Job => self.job_dir(id),
        }
    }

    /// `dlq/{repo}/{job_id}/mapreduce/dlq/{job_id}/`.
    pub fn dlq_dir(&self, job: &str) -> PathBuf {
        Layout::dlq_root(&self.home)
            .join(&self.repo)
            .join(job)
            .join("mapreduce")
            .join("dlq")
            .join(job)
    }

    /// `logs/{repo}/{id}/` for a session or a MapReduce job.
    pub fn logs_dir(&self, id: &str) -> PathBuf {
        Layout::logs_root(&self.home).join(&self.repo).join(id)
    }

    /// `worktrees/`: the worktrees of every project.
    pub fn worktrees_root(home: &Path) -> PathBuf {
        home.join("worktrees")
    }

    /// `worktrees/{repo}/`.
    pub fn worktrees_dir(&self) -> PathBuf {
        Layout::worktrees_root(&self.home).join(&self.repo)
    }

    /// `worktrees/{repo}/{session}`: a session worktree.
    pub fn session_worktree(&self, session: &str) -> PathBuf {
        self.worktrees_dir().join(session)
    }

    /// `worktrees/{repo}/{session}-agent-{n}`: slot N of a session's agent worktrees.
    pub fn agent_worktree(&self, session: &str, n: usize) -> PathBuf {
        self.worktrees_dir().join(format!("{session}-agent-{n}"))
    }

    /// `worktrees/{repo}/spare-{n}`: an agent worktree a job with `worktree.persist` kept,
    /// cleaned and detached, for the next job of the repository to take.
    pub fn spare_worktree(&self, n: usize) -> PathBuf {
        self.worktrees_dir().join(format!("{SPARE_PREFIX}{n}"))
    }

    /// Whether PATH is a spare agent worktree ([`Layout::spare_worktree`]) of any repository.
    pub fn is_spare(path: &Path) -> bool {
        path.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(SPARE_PREFIX))
    }

    /// Finds a MapReduce job's directory in any project; the project's name comes with it.
    pub fn find_job(home: &Path, job: &str) -> Option<(PathBuf, String)> {
        if !is_id(job) {
            return None;
        }
        Layout::projects(home)
            .into_iter()
            .map(|layout| (layout.job_dir(job), layout.repo))
            .find(|(p, _)| checkpoint(p).is_file())
    }

    /// Finds a session's checkpoint in any project; the project's namespace comes with it.
    pub fn find_session(home: &Path, session: &str) -> Option<(PathBuf, String)> {
        if !is_id(session) {
            return None;
        }
        Layout::projects(home)
            .into_iter()
            .map(|layout| (checkpoint(&layout.session_dir(session)), layout.repo))
            .find(|(p, _)| p.is_file())
    }
}

/// `events-{stamp}.jsonl` in an events directory ([`Layout::events_dir`]).
pub fn events_file(events_dir: &Path, stamp: &str) -> PathBuf {
    events_dir.join(format!("events-{stamp}.jsonl"))
}

/// The checkpoint in a run's or job's state directory.
pub fn checkpoint(state_dir: &Path) -> PathBuf {
    state_dir.join(CHECKPOINT)
}

/// The checkpoint journal in a run's state directory.
pub fn journal(state_dir: &Path) -> PathBuf {
    state_dir.join(JOURNAL)
}

/// The lock in a run's or job's state directory.
pub fn lock(state_dir: &Path) -> PathBuf {
    state_dir.join(LOCK)
}

/// `items.json` in a job's directory.
pub fn items(job_dir: &Path) -> PathBuf {
    job_dir.join(ITEMS)
}

/// `results.jsonl` in a job's directory.
pub fn results(job_dir: &Path) -> PathBuf {
    job_dir.join(RESULTS)
}

/// `merges.jsonl` in a job's directory.
pub fn merges(job_dir: &Path) -> PathBuf {
    job_dir.join(MERGES)
}

/// `kept-worktrees.jsonl` in a job's directory.
pub fn kept_worktrees(job_dir: &Path) -> PathBuf {
    job_dir.join(KEPT_WORKTREES)
}

/// The files of agent backend BACKEND (`slurm`, `container`) in a job's directory.
pub fn backend_dir(job_dir: &Path, backend: &str) -> PathBuf {
    job_dir.join(backend)
}

/// Where the task of item INDEX writes its result, in a backend's directory.
pub fn task_result(backend_dir: &Path, index: usize) -> PathBuf {
    backend_dir.join(format!("item_{index}.result.json"))
}

/// The DLQ's index in its directory ([`Layout::dlq_dir`]).
pub fn dlq_index(dlq_dir: &Path) -> PathBuf {
    dlq_dir.join(DLQ_INDEX)
}

/// The directory of the DLQ's items.
pub fn dlq_items(dlq_dir: &Path) -> PathBuf {
    dlq_dir.join("items")
}

/// The file of the DLQ item whose file name (without `.json`) is NAME.
pub fn dlq_item(dlq_dir: &Path, name: &str) -> PathBuf {
    dlq_items(dlq_dir).join(format!("{name}.json"))
}

/// The lock held while a run merges into a branch, in the repository's common git
/// directory; NAME is the branch's name made safe for a file name.
pub fn branch_lock(common_dir: &Path, name: &str) -> PathBuf {
    common_dir.join(format!("prodigy-merge-{name}.lock"))
}

/// The name under which the runs of the project at PROJECT keep their files: the name of
/// its git repository's top level (of PROJECT itself outside git), a dash, and the first 8
/// hex digits of [`crate::store::hash`] of that directory's canonical path. A run from a subdirectory
/// files its state with the rest of the repository, and two repositories with the same
/// name do not share a namespace.
pub fn namespace(project: &Path) -> String {
    let project = std::fs::canonicalize(project).unwrap_or_else(|_| project.to_owned());
    let top = top_level(&project).unwrap_or(project);
    let name = top
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.is_empty())
        .unwrap_or("project");
    let digest = crate::durable::hash(&top.to_string_lossy());
    format!("{name}-{}", &digest[..8])
}

/// The top level of the git working tree DIR is in, as git finds it: the nearest directory,
/// DIR or above, that holds a `.git` (a directory, or the file of a linked worktree or a
/// submodule). Needs no `git`.
pub fn top_level(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .find(|d| d.join(".git").exists())
        .map(Path::to_path_buf)
}

/// Whether TEXT can name a session or job: one path component, so that it never reaches
/// outside `$PRODIGY_HOME` when joined to a directory.
pub fn is_id(text: &str) -> bool {
    !text.is_empty() && text != "." && text != ".." && !text.contains(['/', '\\', '\0'])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path prodigy keeps, spelled out: a resumed run or job, `prodigy ls`, `logs`,
    /// `dlq` and `status` read what earlier versions wrote there, so none may move.
    #[test]
    fn every_path_is_where_earlier_versions_put_it() {
        let layout = Layout {
            home: PathBuf::from("/h"),
            repo: "app-1".into(),
        };
        let home = &layout.home;
        let (session, job) = (layout.session_dir("s-1"), layout.job_dir("j-1"));
        let dlq = layout.dlq_dir("j-1");
        let git = Path::new("/r/.git");
        let built = [
            Layout::state_root(home),
            Layout::events_root(home),
            Layout::dlq_root(home),
            Layout::logs_root(home),
            Layout::worktrees_root(home),
            layout.events_dir("s-1"),
            events_file(&layout.events_dir("j-1"), "20260101T000000Z"),
            layout.sessions_dir(),
            checkpoint(&session),
            journal(&session),
            lock(&session),
            layout.state_dir(RunKind::Run, "s-1"),
            layout.jobs_dir(),
            checkpoint(&job),
            items(&job),
            results(&job),
            lock(&job),
            merges(&job),
            kept_worktrees(&job),
            task_result(&backend_dir(&job, "slurm"), 3),
            layout.state_dir(RunKind::Job, "j-1"),
            dlq_index(&dlq),
            dlq_item(&dlq, "item_2"),
            layout.logs_dir("s-1"),
            layout.worktrees_dir(),
            layout.session_worktree("s-1"),
            layout.agent_worktree("s-1", 2),
            layout.spare_worktree(0),
            git.join(WORKTREE_ADMIN_LOCK),
            branch_lock(git, "main"),
            git.join("worktrees/w").join(PREPARED_MARKER),
        ];
        let built: Vec<String> = built.iter().map(|p| p.display().to_string()).collect();
        let expected = "\
/h/state
/h/events
/h/dlq
/h/logs
/h/worktrees
/h/events/app-1/s-1
/h/events/app-1/j-1/events-20260101T000000Z.jsonl
/h/state/app-1/sessions
/h/state/app-1/sessions/s-1/checkpoint.json
/h/state/app-1/sessions/s-1/checkpoint.journal
/h/state/app-1/sessions/s-1/lock
/h/state/app-1/sessions/s-1
/h/state/app-1/mapreduce/jobs
/h/state/app-1/mapreduce/jobs/j-1/checkpoint.json
/h/state/app-1/mapreduce/jobs/j-1/items.json
/h/state/app-1/mapreduce/jobs/j-1/results.jsonl
/h/state/app-1/mapreduce/jobs/j-1/lock
/h/state/app-1/mapreduce/jobs/j-1/merges.jsonl
/h/state/app-1/mapreduce/jobs/j-1/kept-worktrees.jsonl
/h/state/app-1/mapreduce/jobs/j-1/slurm/item_3.result.json
/h/state/app-1/mapreduce/jobs/j-1
/h/dlq/app-1/j-1/mapreduce/dlq/j-1/index.json
/h/dlq/app-1/j-1/mapreduce/dlq/j-1/items/item_2.json
/h/logs/app-1/s-1
/h/worktrees/app-1
/h/worktrees/app-1/s-1
/h/worktrees/app-1/s-1-agent-2
/h/worktrees/app-1/spare-0
/r/.git/prodigy-worktrees.lock
/r/.git/prodigy-merge-main.lock
/r/.git/worktrees/w/prodigy-prepared";
        assert_eq!(built.join("\n"), expected);
    }

    /// A job or session is found in whichever project holds it, by its checkpoint.
    #[test]
    fn runs_and_jobs_are_found_in_any_project() {
        let home = tempfile::tempdir().unwrap();
        let other = Layout {
            home: home.path().to_owned(),
            repo: "other-1".into(),
        };
        let mine = Layout {
            home: home.path().to_owned(),
            repo: "mine-2".into(),
        };
        std::fs::create_dir_all(other.session_dir("s")).unwrap();
        std::fs::create_dir_all(mine.job_dir("j")).unwrap();
        std::fs::create_dir_all(mine.session_dir("s")).unwrap();
        std::fs::write(checkpoint(&mine.job_dir("j")), "{}").unwrap();
        std::fs::write(checkpoint(&mine.session_dir("s")), "{}").unwrap();
        assert_eq!(
            Layout::find_job(home.path(), "j"),
            Some((mine.job_dir("j"), "mine-2".to_owned()))
        );
        assert_eq!(
            Layout::find_session(home.path(), "s"),
            Some((checkpoint(&mine.session_dir("s")), "mine-2".to_owned()))
        );
        assert_eq!(Layout::find_job(home.path(), "s"), None);
        assert_eq!(Layout::find_job(home.path(), "../j"), None);
    }

    #[test]
    fn a_namespace_is_the_repository_name_and_a_hash_of_its_place() {
        let root = tempfile::tempdir().unwrap();
        let (one, two) = (root.path().join("a/app"), root.path().join("b/app"));
        for repo in [&one, &two] {
            std::fs::create_dir_all(repo.join(".git")).unwrap();
            std::fs::create_dir_all(repo.join("sub/deeper")).unwrap();
        }
        let first = namespace(&one);
        assert!(
            regex::Regex::new("^app-[0-9a-f]{8}$")
                .unwrap()
                .is_match(&first),
            "{first}"
        );
        // From a subdirectory: the repository's namespace, not `deeper`.
        assert_eq!(namespace(&one.join("sub/deeper")), first);
        // Another repository with the same name: another namespace, and stable.
        assert_ne!(namespace(&two), first);
        assert_eq!(namespace(&two), namespace(&two.join("sub")));
        // Outside git: the directory itself.
        let plain = root.path().join("plain/dir");
        std::fs::create_dir_all(&plain).unwrap();
        assert!(
            namespace(&plain).starts_with("dir-"),
            "{}",
            namespace(&plain)
        );
    }

    #[test]
    fn ids_are_one_path_component() {
        for good in ["session-1-abc", "mapreduce-1795299919-01dfa04e250"] {
            assert!(is_id(good), "{good}");
        }
        for bad in ["", ".", "..", "../x", "/abs", "a/b", "a\\b"] {
            assert!(!is_id(bad), "{bad}");
        }
    }
}
