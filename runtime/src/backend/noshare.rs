//! Map agents on machines that share no filesystem with the coordinator (`--no-shared-fs`,
//! docs/slurm.md "Without a shared filesystem").
//!
//! The coordinator serves the job's repository over git's smart HTTP ([`Serve`], the
//! binary's `serve` module) at an address the user chooses, to requests carrying a per-job
//! secret; nothing else of its disk reaches the agents. The served repository is a bare one
//! in the job's state directory (`noshare/repo.git`) that borrows the project's objects
//! (`objects/info/alternates`), so agents see only what the job puts there and may push
//! only the refs its `pre-receive` hook lets through:
//!
//! - `refs/prodigy/JOB/task`: a commit whose tree holds the job's `checkpoint.json`,
//!   `items.json` and workflow (`workflow.yml`), written when the coordinator starts;
//! - `refs/prodigy/JOB/base/N`: the commit item N's agent starts from (its worktree's);
//! - `refs/prodigy/JOB/started/N`: pushed by the agent when it starts (its timeout runs);
//! - `refs/prodigy/JOB/results/N`: pushed by the agent at its end: a commit whose tree holds
//!   its [`TaskResult`] (`result.json`) and whose parent is the agent's last commit.
//!
//! The coordinator turns the last two into the files its backend waits for (the Slurm
//! backend's `item_N.started`/`item_N.result.json`), fetches the agent's commits into the
//! item's worktree before the merge, and deletes the item's refs. On a node, `prodigy agent
//! --serve` ([`NodeClone`]) keeps one persistent clone per concurrent task under a
//! node-local directory, fetches and `checkout -B`s the item's base into it, runs the agent
//! there and pushes; it retries a push while the coordinator is away (`resume-job` serves
//! the same repository with the same secret). The secret reaches git through
//! `GIT_CONFIG_*` variables of the git commands prodigy runs, never a command line.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{
    AgentBackend, Dispatch, Dispatched, Ended, Pending, TaskEnd, TaskRef, TaskResult, mark_started,
    read_result, started_path, write_result,
};
use crate::backend::slurm::SlurmOptions;
pub use crate::backend::task::NotStarted;
use crate::dlq::ErrorType;
use crate::message::Message;
use crate::runner::Runner;

/// What starts the server of a job's repository (the binary's `serve` module).
pub trait Serve: std::fmt::Debug + Send + Sync {
    /// Serves the bare repository `GIT_DIR` over git's smart HTTP at ADDR, under `/git`, to
    /// requests whose `Authorization` is `Bearer TOKEN` (others are refused with 401). The
    /// address it listens on, and a handle that stops it when dropped.
    ///
    /// # Errors
    ///
    /// It could not listen there.
    fn serve(
        &self,
        git_dir: &Path,
        token: &str,
        addr: std::net::SocketAddr,
    ) -> std::io::Result<(std::net::SocketAddr, Box<dyn std::any::Any + Send + Sync>)>;
}

/// How the agents of a job without a shared filesystem are started.
#[derive(Debug)]
pub enum Launch {
    /// As Slurm tasks (`--executor slurm --no-shared-fs`).
    Slurm(SlurmOptions),
    /// As processes of this machine that see the coordinator only through the served
    /// repository (`--executor local --no-shared-fs`): the mode, checked on one machine.
    Process {
        /// The `prodigy` program they run.
        program: PathBuf,
    },
}

/// What a task's node needs to reach its job's repository, and where its output goes.
#[derive(Clone, Debug)]
pub struct Remote {
    /// The repository's URL (`http://ADDR/git`).
    pub url: String,
    /// The job's secret.
    pub token: String,
    /// The job.
    pub job: String,
    /// The name of the project's clones on a node (a hash of the project's path).
    pub repo_key: String,
}

impl Remote {
    /// The batch script of the job's Slurm tasks: the secret on the agent's standard
    /// input, never on a command line nor in the environment its steps inherit. A task
    /// whose PROGRAM is not on its node says so in its job comment ([`NotStarted`]).
    pub fn batch_script(&self, program: &Path) -> String {
        let name = program.to_string_lossy();
        let quote = |text: &str| {
            shlex::try_quote(text)
                .map_or_else(|_| "prodigy".to_owned(), std::borrow::Cow::into_owned)
        };
        let q = quote(&name);
        let missing = quote(
            &NotStarted::NoProgram {
                program: name.clone().into_owned(),
            }
            .comment(),
        );
        let check = if name.contains('/') {
            let unusable = quote(
                &NotStarted::NotExecutable {
                    program: name.clone().into_owned(),
                }
                .comment(),
            );
            format!(
                "[ -e {q} ] || not_started {missing}\n{{ [ -f {q} ] && [ -x {q} ]; }} || not_started {unusable}\n"
            )
        } else {
            format!("command -v {q} >/dev/null 2>&1 || not_started {missing}\n")
        };
        format!(
            "#!/bin/sh\n# Written by prodigy: one map agent per Slurm array task, without a shared filesystem.\n# An agent that cannot start says why in the task's job comment, which the coordinator reads.\nnot_started() {{ scontrol update JobId=\"$SLURM_JOB_ID\" Comment=\"$1\" >/dev/null 2>&1; exit 127; }}\n{check}exec {q} agent --item \"$SLURM_ARRAY_TASK_ID\" \"$@\" <<'PRODIGY_SECRET'\n{}\nPRODIGY_SECRET\n",
            self.token
        )
    }

    /// Where item INDEX's task writes its own output, on its node: under the node's
    /// private directory ([`node_output`]), as the task's environment (the coordinator's,
    /// which Slurm passes on) names it.
    pub fn output(&self, index: usize) -> PathBuf {
        node_output(&node_root(), &self.job, index)
    }

    /// The `prodigy agent` arguments of a task (after `--item`); with ON (on a node), the
    /// agent writes its output under the node's private directory itself (a Slurm task,
    /// whose own output goes nowhere: no path on a node is known to be private before its
    /// agent makes one).
    pub fn agent_args(&self, on: bool) -> Vec<String> {
        let mut args = vec![
            "--serve".to_owned(),
            self.url.clone(),
            "--job".to_owned(),
            self.job.clone(),
            "--repo-key".to_owned(),
            self.repo_key.clone(),
        ];
        if on {
            args.push("--output-on-node".to_owned());
        }
        args
    }
}

impl NotStarted {
    /// Inside a Slurm task (`SLURM_JOB_ID`), says it in the task's job comment
    /// (`scontrol update`, bounded by Slurm's own message timeout); nothing elsewhere.
    pub fn tell_slurm(&self) {
        if let Some(id) = std::env::var_os("SLURM_JOB_ID").filter(|v| !v.is_empty()) {
            let mut job = std::ffi::OsString::from("JobId=");
            job.push(id);
            let _ = std::process::Command::new("scontrol")
                .arg("update")
                .arg(job)
                .arg(format!("Comment={}", self.comment()))
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// A problem serving a job's repository or bringing an agent's commits back.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum NoShareError {
    /// A git command failed.
    #[error("`git {command}` failed: {message}")]
    #[diagnostic(
        code(prodigy::noshare::git),
        help("check that git works here and the job's state directory is writable")
    )]
    Git {
        /// The command, without `git`.
        command: String,
        /// Its stderr, or why it could not run.
        message: String,
    },
    /// A file could not be written or read.
    #[error("cannot use `{path}`: {source}")]
    #[diagnostic(
        code(prodigy::noshare::io),
        help("check the free space and permissions there")
    )]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The server could not listen.
    #[error("cannot serve the job's repository at {addr}: {source}")]
    #[diagnostic(
        code(prodigy::noshare::serve),
        help("choose an address of this machine the nodes reach with `--serve-addr HOST:PORT`")
    )]
    Serve {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// An agent process could not start.
    #[error("`{program}` could not start: {source}")]
    #[diagnostic(
        code(prodigy::noshare::spawn),
        help("check that prodigy is installed at that path where the agents run")
    )]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The backend of agents without a shared filesystem: a [`Launch`] and the job's server.
#[derive(Debug)]
pub struct NoShare {
    /// How its agents start.
    pub launch: Launch,
    /// What serves the repository.
    pub serve: Arc<dyn Serve>,
    /// Where it listens (`--serve-addr`); by default this machine's name on a free port for
    /// Slurm, 127.0.0.1 for processes.
    pub addr: Option<std::net::SocketAddr>,
    /// How often the coordinator looks at the items' refs.
    pub poll: Duration,
    served: tokio::sync::Mutex<Option<Arc<Served>>>,
}

/// A job's served repository.
#[derive(Debug)]
struct Served {
    remote: Remote,
    /// The bare repository.
    bare: PathBuf,
    /// Stops the server when dropped.
    _server: Box<dyn std::any::Any + Send + Sync>,
}

impl NoShare {
    /// The backend starting agents with LAUNCH and serving with SERVE at ADDR.
    pub fn new(launch: Launch, serve: Arc<dyn Serve>, addr: Option<std::net::SocketAddr>) -> Self {
        NoShare {
            launch,
            serve,
            addr,
            poll: Duration::from_millis(50),
            served: tokio::sync::Mutex::new(None),
        }
    }

    /// The job's served repository, made and served on its first item.
    async fn served(
        &self,
        runner: &Runner,
        job_dir: &Path,
        job: &str,
    ) -> Result<Arc<Served>, NoShareError> {
        let mut slot = self.served.lock().await;
        if let Some(s) = slot.as_ref()
            && s.remote.job == job
        {
            return Ok(Arc::clone(s));
        }
        let dir = crate::layout::backend_dir(job_dir, "noshare");
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| NoShareError::Io { path, source }
        };
        crate::durable::private_dir(&dir).map_err(io(&dir))?;
        let token = secret(&dir.join("token"))?;
        let bare = dir.join("repo.git");
        let common = common_dir(&runner.opts.project).await?;
        prepare_bare(&bare, &common).await?;
        publish_task(&bare, job_dir, job).await?;
        let addr = match self.addr {
            Some(a) => a,
            None => default_addr(matches!(self.launch, Launch::Slurm(_))),
        };
        let (bound, server) =
            self.serve
                .serve(&bare, &token, addr)
                .map_err(|source| NoShareError::Serve {
                    addr: addr.to_string(),
                    source,
                })?;
        let host = if bound.ip().is_unspecified() {
            super::this_host()
        } else {
            match bound {
                std::net::SocketAddr::V4(a) => a.ip().to_string(),
                std::net::SocketAddr::V6(a) => format!("[{}]", a.ip()),
            }
        };
        let remote = Remote {
            url: format!("http://{host}:{}/git", bound.port()),
            token,
            job: job.to_owned(),
            repo_key: crate::store::hash(&common.to_string_lossy())
                .chars()
                .take(16)
                .collect(),
        };
        if let Launch::Slurm(slurm) = &self.launch {
            let _ = slurm.remote.set(remote.clone());
        }
        let s = Arc::new(Served {
            remote,
            bare,
            _server: server,
        });
        *slot = Some(Arc::clone(&s));
        Ok(s)
    }

    /// Where item INDEX's outcome is written on the coordinator's disk.
    fn result_path(&self, job_dir: &Path, index: usize) -> PathBuf {
        match &self.launch {
            Launch::Slurm(_) => crate::backend::slurm::result_path(job_dir, index),
            Launch::Process { .. } => {
                crate::layout::task_result(&crate::layout::backend_dir(job_dir, "noshare"), index)
            }
        }
    }
}

/// A job's secret: the one saved in PATH (a resumed job keeps it, so that the tasks an
/// earlier coordinator left still reach this one), else a new one.
fn secret(path: &Path) -> Result<String, NoShareError> {
    if let Ok(text) = std::fs::read_to_string(path)
        && text.trim().len() >= 32
    {
        return Ok(text.trim().to_owned());
    }
    let mut bytes = [0_u8; 32];
    let io = |source| NoShareError::Io {
        path: PathBuf::from("/dev/urandom"),
        source,
    };
    let mut random = std::fs::File::open("/dev/urandom").map_err(io)?;
    std::io::Read::read_exact(&mut random, &mut bytes).map_err(io)?;
    let token = bytes.iter().fold(String::new(), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    });
    crate::durable::write_atomic(path, token.as_bytes()).map_err(|source| NoShareError::Io {
        path: path.to_owned(),
        source,
    })?;
    Ok(token)
}

/// The default address: this machine's name (which the nodes resolve) for Slurm, loopback
/// for processes; a free port either way.
fn default_addr(slurm: bool) -> std::net::SocketAddr {
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    if !slurm {
        return loopback;
    }
    std::net::ToSocketAddrs::to_socket_addrs(&(super::this_host().as_str(), 0))
        .ok()
        .and_then(|mut a| a.find(|a| !a.ip().is_loopback()))
        .unwrap_or(std::net::SocketAddr::from(([0, 0, 0, 0], 0)))
}

/// This machine's name.
/// Runs git with ARGS (STDIN written to it), in DIR when given; its stdout.
async fn git(
    dir: Option<&Path>,
    args: &[&str],
    stdin: Option<&[u8]>,
) -> Result<String, NoShareError> {
    use tokio::io::AsyncWriteExt as _;
    let failed = |message: String| NoShareError::Git {
        command: args.join(" "),
        message,
    };
    let mut command = tokio::process::Command::new("git");
    if let Some(dir) = dir {
        command.arg("-C").arg(dir);
    }
    command
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(if stdin.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    crate::reap::mark(&mut command);
    let mut child = command.spawn().map_err(|e| failed(e.to_string()))?;
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(bytes)
            .await
            .map_err(|e| failed(e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| failed(e.to_string()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(failed(
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ))
    }
}

/// Git with `--git-dir=BARE`.
async fn bare_git(
    bare: &Path,
    args: &[&str],
    stdin: Option<&[u8]>,
) -> Result<String, NoShareError> {
    let dir = format!("--git-dir={}", bare.display());
    let mut all = vec![dir.as_str()];
    all.extend_from_slice(args);
    git(None, &all, stdin).await
}

/// The project's common git directory (where its objects are).
async fn common_dir(project: &Path) -> Result<PathBuf, NoShareError> {
    let out = git(
        Some(project),
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
        None,
    )
    .await?;
    Ok(PathBuf::from(out.trim()))
}

/// The hook that lets agents push only an item's `started` and `results` refs.
const PRE_RECEIVE: &str = "#!/bin/sh\n# Written by prodigy: agents push only their items' started and results refs.\nwhile read -r old new ref; do\n  case \"$ref\" in\n    refs/prodigy/*/started/*|refs/prodigy/*/results/*) ;;\n    *) echo \"prodigy: $ref is not an item's ref\" >&2; exit 1 ;;\n  esac\ndone\n";

/// Makes the bare repository BARE borrowing the objects of COMMON, unless it is there.
async fn prepare_bare(bare: &Path, common: &Path) -> Result<(), NoShareError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| NoShareError::Io { path, source }
    };
    if !bare.join("HEAD").is_file() {
        git(
            None,
            &["init", "-q", "--bare", &bare.display().to_string()],
            None,
        )
        .await?;
    }
    let alternates = bare.join("objects").join("info").join("alternates");
    let line = format!("{}\n", common.join("objects").display());
    std::fs::write(&alternates, line).map_err(io(&alternates))?;
    for (key, value) in [
        ("receive.autogc", "false"),
        ("gc.auto", "0"),
        ("http.receivepack", "true"),
        ("uploadpack.allowAnySHA1InWant", "true"),
    ] {
        bare_git(bare, &["config", key, value], None).await?;
    }
    let hook = bare.join("hooks").join("pre-receive");
    std::fs::create_dir_all(bare.join("hooks")).map_err(io(&hook))?;
    std::fs::write(&hook, PRE_RECEIVE).map_err(io(&hook))?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o700))
            .map_err(io(&hook))?;
    }
    Ok(())
}

/// Writes the job's task commit (`refs/prodigy/JOB/task`): its checkpoint, items and
/// workflow, which its agents read instead of the coordinator's files.
async fn publish_task(bare: &Path, job_dir: &Path, job: &str) -> Result<(), NoShareError> {
    let read =
        |path: PathBuf| std::fs::read(&path).map_err(|source| NoShareError::Io { path, source });
    let checkpoint = read(crate::layout::checkpoint(job_dir))?;
    let items = read(crate::layout::items(job_dir))?;
    let parsed: crate::jobstore::JobCheckpoint =
        serde_json::from_slice(&checkpoint).map_err(|e| NoShareError::Io {
            path: crate::layout::checkpoint(job_dir),
            source: std::io::Error::other(e),
        })?;
    let workflow = read(parsed.workflow_file.clone())?;
    let mut tree = String::new();
    for (name, bytes) in [
        (crate::layout::CHECKPOINT, &checkpoint),
        (crate::layout::ITEMS, &items),
        ("workflow.yml", &workflow),
    ] {
        let blob = bare_git(bare, &["hash-object", "-w", "--stdin"], Some(bytes)).await?;
        let _ = writeln!(tree, "100644 blob {}\t{name}", blob.trim());
    }
    let tree = bare_git(bare, &["mktree"], Some(tree.as_bytes())).await?;
    let commit = commit_tree(bare, tree.trim(), None, "prodigy: job task").await?;
    bare_git(bare, &["update-ref", &task_ref(job), &commit], None).await?;
    Ok(())
}

/// A commit of TREE (after PARENT) in BARE, by prodigy.
async fn commit_tree(
    bare: &Path,
    tree: &str,
    parent: Option<&str>,
    message: &str,
) -> Result<String, NoShareError> {
    let dir = format!("--git-dir={}", bare.display());
    let mut args = vec![
        dir.as_str(),
        "-c",
        "user.name=prodigy",
        "-c",
        "user.email=prodigy@localhost",
        "commit-tree",
        tree,
        "-m",
        message,
    ];
    if let Some(p) = parent {
        args.extend(["-p", p]);
    }
    Ok(git(None, &args, None).await?.trim().to_owned())
}

/// A ref of the job's namespace.
fn job_ref(job: &str, rest: &str) -> String {
    format!("refs/prodigy/{}/{rest}", ref_safe(job))
}

/// JOB with what a ref name cannot hold replaced.
fn ref_safe(job: &str) -> String {
    job.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The job's task commit.
pub fn task_ref(job: &str) -> String {
    job_ref(job, "task")
}

/// The commit item INDEX's agent starts from.
pub fn base_ref(job: &str, index: usize) -> String {
    job_ref(job, &format!("base/{index}"))
}

/// What item INDEX's agent pushes when it starts.
pub fn started_ref(job: &str, index: usize) -> String {
    job_ref(job, &format!("started/{index}"))
}

/// What item INDEX's agent pushes at its end.
pub fn results_ref(job: &str, index: usize) -> String {
    job_ref(job, &format!("results/{index}"))
}

/// Whether REF is in BARE (read as a loose ref: the served repository never packs its
/// refs).
fn has_ref(bare: &Path, name: &str) -> bool {
    bare.join(name).is_file()
}

/// Deletes item INDEX's refs in BARE.
async fn clean_refs(bare: &Path, job: &str, index: usize) -> Result<(), NoShareError> {
    for name in [
        started_ref(job, index),
        results_ref(job, index),
        base_ref(job, index),
    ] {
        if has_ref(bare, &name) {
            bare_git(bare, &["update-ref", "-d", &name], None).await?;
        }
    }
    Ok(())
}

/// Turns item INDEX's refs into the files the backend waits for, as they come.
async fn materialize(served: &Served, index: usize, result: &Path, poll: Duration) {
    let job = &served.remote.job;
    let (started, results) = (started_ref(job, index), results_ref(job, index));
    let mut marked = false;
    let mut written = false;
    loop {
        if !marked && has_ref(&served.bare, &started) {
            marked = mark_started(result).is_ok();
        }
        if !written && has_ref(&served.bare, &results) {
            let spec = format!("{results}:result.json");
            if let Ok(text) = bare_git(&served.bare, &["cat-file", "blob", &spec], None).await
                && let Ok(r) = serde_json::from_str::<TaskResult>(&text)
            {
                if !marked {
                    marked = mark_started(result).is_ok();
                }
                written = write_result(result, &r).is_ok();
            }
        }
        tokio::time::sleep(poll).await;
    }
}

/// Brings item INDEX's commits into DIR (its worktree): a fast-forward to the parent of
/// the agent's result commit.
async fn bring_back(served: &Served, dir: &Path, index: usize) -> Result<(), NoShareError> {
    let bare = served.bare.display().to_string();
    let results = results_ref(&served.remote.job, index);
    git(
        Some(dir),
        &[
            "fetch",
            "-q",
            "--no-tags",
            "--no-write-fetch-head",
            &bare,
            &results,
        ],
        None,
    )
    .await?;
    let head = bare_git(&served.bare, &["rev-parse", &format!("{results}^1")], None).await?;
    git(Some(dir), &["merge", "-q", "--ff-only", head.trim()], None).await?;
    Ok(())
}

impl AgentBackend for NoShare {
    /// A Slurm task can outlive a killed coordinator; a process of this machine cannot (it
    /// is reaped with it), so its agent worktrees go back into the pool on resume.
    fn outlives_coordinator(&self) -> bool {
        matches!(self.launch, Launch::Slurm(_))
    }

    fn name(&self) -> &'static str {
        match &self.launch {
            Launch::Slurm(_) => "slurm",
            Launch::Process { .. } => "process",
        }
    }

    fn admit_limit(&self, max_parallel: usize) -> usize {
        match &self.launch {
            Launch::Slurm(s) => s.admit_limit(max_parallel),
            Launch::Process { .. } => max_parallel,
        }
    }

    fn dispatch<'a>(
        &'a self,
        runner: &'a Runner,
        d: Dispatch,
        vars: &'a mut crate::vars::Vars,
    ) -> Pending<'a, Dispatched> {
        Box::pin(dispatch(self, runner, d, vars))
    }

    fn adoptable<'a>(
        &'a self,
        runner: &'a Runner,
        job_dir: &'a Path,
        index: usize,
    ) -> Pending<'a, Option<Option<crate::worktree::records::AgentWorktree>>> {
        match &self.launch {
            Launch::Slurm(s) => s.adoptable(runner, job_dir, index),
            Launch::Process { .. } => Box::pin(async { None }),
        }
    }

    fn end_earlier<'a>(&'a self, runner: &'a Runner, job: &'a str) -> Pending<'a, ()> {
        match &self.launch {
            Launch::Slurm(s) => s.end_earlier(runner, job),
            Launch::Process { .. } => Box::pin(async {}),
        }
    }
}

/// Runs D's item on a machine that sees only the served repository.
async fn dispatch(
    b: &NoShare,
    runner: &Runner,
    d: Dispatch,
    vars: &mut crate::vars::Vars,
) -> Dispatched {
    let served = match b.served(runner, &d.job_dir, &d.job_id).await {
        Ok(s) => s,
        Err(e) => {
            return Dispatched::failed("serve", e.to_string(), ErrorType::Unknown, None);
        }
    };
    let index = d.index;
    let dir = d
        .worktree
        .as_ref()
        .map_or_else(|| runner.opts.project.clone(), |w| w.path.clone());
    // Exactly when the backend adopts the earlier task: a task submitted again must not
    // find the earlier attempt's refs (its outcome would be taken for the new one's).
    let adopting = match &b.launch {
        Launch::Slurm(_) => crate::backend::slurm::adopted(runner, &d).await.is_some(),
        Launch::Process { .. } => false,
    };
    if !adopting {
        // An earlier task not adopted stops before the item's refs are cleaned: it pushes
        // nothing after them.
        if let Launch::Slurm(_) = &b.launch {
            crate::backend::slurm::replace_earlier(runner, &d).await;
        }
        let prepared = async {
            clean_refs(&served.bare, &d.job_id, index).await?;
            let head = git(Some(&dir), &["rev-parse", "HEAD"], None).await?;
            bare_git(
                &served.bare,
                &["update-ref", &base_ref(&d.job_id, index), head.trim()],
                None,
            )
            .await
        };
        if let Err(e) = prepared.await {
            return Dispatched::failed("serve", e.to_string(), ErrorType::Unknown, None);
        }
    }
    let result = b.result_path(&d.job_dir, index);
    let done = {
        let run = async {
            match &b.launch {
                Launch::Slurm(s) => s.dispatch(runner, d, vars).await,
                Launch::Process { program } => {
                    process_dispatch(runner, b, program, &served.remote, d, &result).await
                }
            }
        };
        tokio::select! {
            done = run => done,
            () = materialize(&served, index, &result, b.poll) => Dispatched::not_submitted(),
        }
    };
    let done = if done.end == Ended::Succeeded {
        match bring_back(&served, &dir, index).await {
            Ok(()) => done,
            Err(e) => Dispatched::failed(
                "serve",
                format!("the agent's commits could not be brought back: {e}"),
                ErrorType::Unknown,
                done.task,
            ),
        }
    } else {
        done
    };
    if let Err(e) = clean_refs(&served.bare, &served.remote.job, index).await {
        runner.say_for_run(Message::StateLost {
            why: format!("the refs of item_{index} stay in the job's served repository: {e}"),
            stops: false,
        });
    }
    done
}

/// Starts PROGRAM's agent for item INDEX, its output to LOG, the secret on its stdin.
async fn spawn_agent(
    program: &Path,
    remote: &Remote,
    index: usize,
    log: &Path,
) -> Result<tokio::process::Child, NoShareError> {
    use tokio::io::AsyncWriteExt as _;
    let out = std::fs::File::create(log)
        .and_then(|f| Ok((f.try_clone()?, f)))
        .map_err(|source| NoShareError::Io {
            path: log.to_owned(),
            source,
        })?;
    let mut command = tokio::process::Command::new(program);
    command
        .arg("agent")
        .arg("--item")
        .arg(index.to_string())
        .args(remote.agent_args(false))
        .current_dir(std::env::temp_dir())
        .stdin(std::process::Stdio::piped())
        .stdout(out.0)
        .stderr(out.1)
        .kill_on_drop(true);
    crate::reap::mark(&mut command);
    let mut child = command.spawn().map_err(|source| NoShareError::Spawn {
        program: program.to_owned(),
        source,
    })?;
    if let Some(mut pipe) = child.stdin.take() {
        let _ = pipe
            .write_all(format!("{}\n", remote.token).as_bytes())
            .await;
    }
    Ok(child)
}

/// Runs D's item as a process of this machine that sees only the served repository (its
/// node directory is `PRODIGY_NOSHARE_DIR`'s), and waits for its outcome.
async fn process_dispatch(
    runner: &Runner,
    b: &NoShare,
    program: &Path,
    remote: &Remote,
    mut d: Dispatch,
    result: &Path,
) -> Dispatched {
    let task = TaskRef {
        backend: "process".to_owned(),
        id: format!("{}-item_{}-{}", remote.job, d.index, d.attempt),
        node: Some(super::this_host()),
    };
    for stale in [result.to_owned(), started_path(result)] {
        let _ = std::fs::remove_file(stale);
    }
    let log = result.with_file_name(format!("item_{}.out", d.index));
    let mut child = match spawn_agent(program, remote, d.index, &log).await {
        Ok(c) => c,
        Err(why) => {
            return Dispatched::failed("agent", why.to_string(), ErrorType::Unknown, Some(task));
        }
    };
    runner.record(&crate::events::Event::TaskSubmitted {
        task: task.clone(),
        attempt: d.attempt,
    });
    let mut signal = runner.cancel.clone();
    let mut halt = d.halt.take();
    let mut deadline = None;
    let started = started_path(result);
    let mut exited = None;
    loop {
        if let Some(r) = read_result(result) {
            let _ = child.wait().await;
            if r.end == TaskEnd::Cancelled {
                return Dispatched::failed(
                    "agent",
                    "the agent was stopped outside prodigy before it finished".to_owned(),
                    ErrorType::Unknown,
                    Some(task),
                );
            }
            return Dispatched::from_result(r, task);
        }
        if deadline.is_none() && started.exists() {
            deadline = d.timeout.map(|t| tokio::time::Instant::now() + t);
        }
        let why = if deadline.is_some_and(|t| tokio::time::Instant::now() >= t) {
            Some((Ended::TimedOut, "timeout"))
        } else if *signal.borrow_and_update()
            || halt.as_mut().is_some_and(|h| *h.borrow_and_update())
        {
            Some((Ended::Cancelled, "cancelled"))
        } else {
            None
        };
        if let Some((end, reason)) = why {
            runner.record(&crate::events::Event::TaskCancelled {
                task: task.clone(),
                reason: reason.to_owned(),
            });
            let _ = child.kill().await;
            return Dispatched::ended(end, task);
        }
        match exited {
            None => {
                if let Ok(Some(status)) = child.try_wait() {
                    exited = Some((status, tokio::time::Instant::now()));
                }
            }
            // Its result may still be on its way from the served repository.
            Some((status, at)) if at.elapsed() >= Duration::from_secs(2) => {
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = tail.lines().rev().take(10).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                return Dispatched::failed(
                    "agent",
                    runner.mask(&format!(
                        "the agent ended ({status}) without pushing its outcome: {}",
                        tail.join("\n")
                    )),
                    ErrorType::Unknown,
                    Some(task),
                );
            }
            Some(_) => {}
        }
        tokio::time::sleep(b.poll).await;
    }
}

/// A task's persistent clone on its node, held (locked) while the task runs.
#[derive(Debug)]
pub struct NodeClone {
    /// The clone.
    pub dir: PathBuf,
    /// Where the task keeps its files beside the clone.
    pub side: PathBuf,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// Where a node keeps its clones and its tasks' output: `PRODIGY_NOSHARE_DIR`, else
/// `$XDG_CACHE_HOME/prodigy/noshare`, else `~/.cache/prodigy/noshare`, else (no home)
/// `/tmp/prodigy-noshare-UID`; [`private_node_dir`] makes it private before use.
pub fn node_root() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("PRODIGY_NOSHARE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(cache) = var("XDG_CACHE_HOME") {
        return PathBuf::from(cache).join("prodigy").join("noshare");
    }
    if let Some(home) = var("HOME") {
        return PathBuf::from(home)
            .join(".cache")
            .join("prodigy")
            .join("noshare");
    }
    std::env::temp_dir().join(format!("prodigy-noshare-{}", nix::unistd::geteuid()))
}

/// Where item INDEX of JOB writes its output on a node whose directory is ROOT.
pub fn node_output(root: &Path, job: &str, index: usize) -> PathBuf {
    root.join("out")
        .join(ref_safe(job))
        .join(format!("item_{index}.out"))
}

/// Makes DIR a directory of this user's that no one else may enter (made 0700 where
/// missing, with its parents): refused when it is another user's (one who made it first,
/// as under a shared /tmp, would see and could change what prodigy keeps there), its
/// group's and others' rights removed otherwise.
///
/// # Errors
///
/// It could not be made, or it is another user's.
pub fn private_node_dir(dir: &Path) -> Result<(), NoShareError> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let io = |source| NoShareError::Io {
        path: dir.to_owned(),
        source,
    };
    crate::durable::private_dir(dir).map_err(io)?;
    let meta = std::fs::metadata(dir).map_err(io)?;
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("it belongs to user {}, not this one", meta.uid()),
        )));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
    }
    Ok(())
}

/// Opens item INDEX of JOB's output file under the node directory ROOT for appending
/// (0600, in private directories, never through a symbolic link).
///
/// # Errors
///
/// A directory or the file could not be made.
pub fn open_node_output(
    root: &Path,
    job: &str,
    index: usize,
) -> Result<std::fs::File, NoShareError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = node_output(root, job, index);
    private_node_dir(root)?;
    if let Some(dir) = path.parent() {
        crate::durable::private_dir(dir).map_err(|source| NoShareError::Io {
            path: dir.to_owned(),
            source,
        })?;
    }
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|source| NoShareError::Io { path, source })
}

/// The git environment that carries the job's secret to the served repository.
fn auth_env(token: &str) -> [(String, String); 3] {
    [
        ("GIT_CONFIG_COUNT".to_owned(), "1".to_owned()),
        ("GIT_CONFIG_KEY_0".to_owned(), "http.extraHeader".to_owned()),
        (
            "GIT_CONFIG_VALUE_0".to_owned(),
            format!("Authorization: Bearer {token}"),
        ),
    ]
}

/// Runs git (blocking) in DIR with the secret TOKEN; its stdout.
fn node_git(
    dir: &Path,
    token: &str,
    args: &[&str],
    stdin: Option<&[u8]>,
) -> Result<String, NoShareError> {
    use std::io::Write as _;
    let failed = |message: String| NoShareError::Git {
        command: args.join(" "),
        message,
    };
    let mut command = std::process::Command::new("git");
    command
        .arg("-C")
        .arg(dir)
        .args(args)
        .envs(auth_env(token))
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(if stdin.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().map_err(|e| failed(e.to_string()))?;
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(bytes).map_err(|e| failed(e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| failed(e.to_string()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(failed(
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ))
    }
}

impl NodeClone {
    /// Takes the first free clone of the project `REPO_KEY` under ROOT (one per task running
    /// on the node at once), made on first use.
    ///
    /// # Errors
    ///
    /// A lock file or the clone could not be made.
    pub fn take(root: &Path, repo_key: &str) -> Result<NodeClone, NoShareError> {
        let base = root.join(repo_key);
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| NoShareError::Io { path, source }
        };
        crate::durable::private_dir(&base).map_err(io(&base))?;
        private_node_dir(root)?;
        private_node_dir(&base)?;
        for slot in 0_usize.. {
            let lock = base.join(format!("{slot}.lock"));
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock)
                .map_err(io(&lock))?;
            match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(locked) => {
                    let dir = base.join(slot.to_string());
                    let side = base.join(format!("{slot}.task"));
                    crate::durable::private_dir(&side).map_err(io(&side))?;
                    if !dir.join(".git").exists() {
                        let _ = std::fs::remove_dir_all(&dir);
                        crate::durable::private_dir(&dir).map_err(io(&dir))?;
                        node_git(&dir, "", &["init", "-q"], None)?;
                    }
                    return Ok(NodeClone {
                        dir,
                        side,
                        _lock: locked,
                    });
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {}
                Err((_, e)) => return Err(io(&lock)(e.into())),
            }
        }
        Err(NoShareError::Io {
            path: base,
            source: std::io::Error::other("no free clone"),
        })
    }

    /// Fetches the job's task and item INDEX's base from URL and checks the base out
    /// (`checkout -B`, the clone cleaned). The task's files.
    ///
    /// # Errors
    ///
    /// Git failed (the server unreachable, the secret refused, ...).
    pub fn prepare(
        &self,
        url: &str,
        token: &str,
        job: &str,
        index: usize,
    ) -> Result<TaskFiles, NoShareError> {
        let task = format!("+{}:refs/prodigy/task", task_ref(job));
        let base = format!("+{}:refs/prodigy/base", base_ref(job, index));
        node_git(
            &self.dir,
            token,
            &["fetch", "-q", "--no-tags", url, &task, &base],
            None,
        )?;
        node_git(
            &self.dir,
            token,
            &[
                "checkout",
                "-q",
                "-f",
                "-B",
                "prodigy-agent",
                "refs/prodigy/base",
            ],
            None,
        )?;
        node_git(&self.dir, token, &["clean", "-q", "-ffdx"], None)?;
        let show = |name: &str| {
            node_git(
                &self.dir,
                token,
                &["cat-file", "blob", &format!("refs/prodigy/task:{name}")],
                None,
            )
        };
        Ok(TaskFiles {
            checkpoint: show(crate::layout::CHECKPOINT)?,
            items: show(crate::layout::ITEMS)?,
            workflow: show("workflow.yml")?,
        })
    }

    /// Pushes that item INDEX started (its base, under `started/`).
    ///
    /// # Errors
    ///
    /// The push failed.
    pub fn push_started(
        &self,
        url: &str,
        token: &str,
        job: &str,
        index: usize,
    ) -> Result<(), NoShareError> {
        let spec = format!("refs/prodigy/base:{}", started_ref(job, index));
        node_git(&self.dir, token, &["push", "-q", "-f", url, &spec], None).map(|_| ())
    }

    /// Pushes RESULT as item INDEX's outcome, after the clone's `HEAD` (the agent's
    /// commits), retrying every two seconds for up to WAIT while the coordinator is away.
    ///
    /// # Errors
    ///
    /// The commit could not be made, or no push succeeded within WAIT.
    pub fn push_result(
        &self,
        url: &str,
        token: &str,
        job: &str,
        index: usize,
        result: &TaskResult,
        wait: Duration,
    ) -> Result<(), NoShareError> {
        let bytes = serde_json::to_vec_pretty(result).map_err(|e| NoShareError::Io {
            path: self.side.join("result.json"),
            source: std::io::Error::other(e),
        })?;
        let blob = node_git(
            &self.dir,
            token,
            &["hash-object", "-w", "--stdin"],
            Some(&bytes),
        )?;
        let tree = format!("100644 blob {}\tresult.json\n", blob.trim());
        let tree = node_git(&self.dir, token, &["mktree"], Some(tree.as_bytes()))?;
        let commit = node_git(
            &self.dir,
            token,
            &[
                "-c",
                "user.name=prodigy",
                "-c",
                "user.email=prodigy@localhost",
                "commit-tree",
                tree.trim(),
                "-p",
                "HEAD",
                "-m",
                "prodigy: item result",
            ],
            None,
        )?;
        let spec = format!("{}:{}", commit.trim(), results_ref(job, index));
        let mut tries = wait.as_secs() / 2;
        loop {
            match node_git(&self.dir, token, &["push", "-q", "-f", url, &spec], None) {
                Ok(_) => return Ok(()),
                Err(e) if tries == 0 => return Err(e),
                Err(_) => {
                    tries -= 1;
                    std::thread::sleep(Duration::from_secs(2));
                }
            }
        }
    }
}

/// A job's files as its task commit holds them.
#[derive(Debug)]
pub struct TaskFiles {
    /// `checkpoint.json`.
    pub checkpoint: String,
    /// `items.json`.
    pub items: String,
    /// The workflow's text.
    pub workflow: String,
}

/// What a task whose agent could not start pushes: why, on which node, and where its own
/// output is there.
pub fn not_started(why: &str) -> TaskResult {
    TaskResult {
        end: TaskEnd::Failed,
        output: None,
        failure: Some(super::TaskFailure {
            step: "agent".to_owned(),
            message: format!("the agent could not start on {}: {why}", super::this_host()),
            error_type: ErrorType::Unknown,
            output: None,
            log: None,
        }),
        duration_secs: 0.0,
        task: TaskRef::from_env(),
        node: None,
        claude: None,
        trail: crate::jobstore::ItemTrail::default(),
    }
}

/// A Slurm backend's message about a lost task, pointing at OUTPUT on the task's node
/// instead of the job's `slurm/` directory (which holds no output in this mode).
pub fn on_node(message: &str, output: &Path) -> String {
    message.replace(
        "its output is in the job's slurm/ directory",
        &format!(
            "its output, if it started, is in {} on its node",
            output.display()
        ),
    )
}

/// A Slurm backend's message about a lost task whose agent never started: it wrote no
/// output. When Slurm failed to launch it (`launch_failed`: `FAILED`, as for a node that
/// cannot open its output file) without REMOTE (a shared filesystem assumed), the likely
/// cause is a node that does not see the job's directory.
pub fn never_started(message: &str, remote: bool, launch_failed: bool) -> String {
    let why = if remote {
        "its agent never started, so it pushed no outcome; Slurm's own words on the launch are in the node's slurmd log"
    } else if launch_failed {
        "its agent never started, so it wrote no output: Slurm could not launch it on its node (a node that does not see this machine's filesystem cannot open the job's slurm/ directory; run such clusters with `--no-shared-fs`, docs/slurm.md)"
    } else {
        "its agent never started, so it wrote no output"
    };
    message.replace("its output is in the job's slurm/ directory", why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git_in(dir: &Path, args: &[&str]) -> std::process::Output {
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .output()
            .unwrap()
    }

    #[tokio::test]
    async fn agents_may_push_only_their_items_refs_to_the_served_repository() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("project");
        std::fs::create_dir(&project).unwrap();
        assert!(
            git_in(&project, &["init", "-q", "-b", "main"])
                .status
                .success()
        );
        assert!(
            git_in(&project, &["commit", "-q", "--allow-empty", "-m", "one"])
                .status
                .success()
        );
        let common = common_dir(&project).await.unwrap();
        let bare = dir.path().join("repo.git");
        prepare_bare(&bare, &common).await.unwrap();
        // The project's objects are borrowed, not copied.
        let head = git_in(&project, &["rev-parse", "HEAD"]);
        let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
        bare_git(&bare, &["cat-file", "-e", &head], None)
            .await
            .unwrap();
        let target = bare.display().to_string();
        let push = |spec: &str| git_in(&project, &["push", "-q", &target, spec]);
        let refused = push("HEAD:refs/heads/main");
        assert!(!refused.status.success());
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains("is not an item's ref"),
            "{refused:?}"
        );
        assert!(
            push(&format!("HEAD:{}", results_ref("job-1", 4)))
                .status
                .success()
        );
        assert!(has_ref(&bare, &results_ref("job-1", 4)));
        clean_refs(&bare, "job-1", 4).await.unwrap();
        assert!(!has_ref(&bare, &results_ref("job-1", 4)));
    }

    #[test]
    fn a_task_that_never_started_is_not_said_to_have_output() {
        let (message, _) = crate::backend::slurm::lost_task("7_3", "FAILED", "JobLaunchFailure");
        let said = never_started(&message, false, true);
        assert!(!said.contains("its output is in"), "{said}");
        assert!(said.contains("never started"), "{said}");
        assert!(said.contains("--no-shared-fs"), "{said}");
        let (message, _) = crate::backend::slurm::lost_task("7_3", "CANCELLED", "");
        let said = never_started(&message, false, false);
        assert!(!said.contains("its output is in"), "{said}");
        assert!(!said.contains("--no-shared-fs"), "{said}");
        let on = on_node(&message, Path::new("/tmp/prodigy-j-item_3.out"));
        assert!(on.contains("/tmp/prodigy-j-item_3.out on its node"), "{on}");
    }

    #[test]
    fn the_batch_script_gives_the_secret_on_stdin_not_the_command_line() {
        let remote = Remote {
            url: "http://10.0.0.1:4000/git".into(),
            token: "abc".into(),
            job: "j".into(),
            repo_key: "k".into(),
        };
        let script = remote.batch_script(Path::new("/opt/prodigy"));
        let exec = script.lines().find(|l| l.starts_with("exec ")).unwrap();
        assert!(!exec.contains("abc"), "{exec}");
        assert!(
            script.contains("<<'PRODIGY_SECRET'\nabc\nPRODIGY_SECRET\n"),
            "{script}"
        );
        assert!(!remote.agent_args(true).concat().contains("abc"));
    }

    /// Runs REMOTE's batch script for PROGRAM in DIR, with a `scontrol` that records its
    /// arguments; its exit code and what it recorded.
    fn run_batch_script(dir: &Path, remote: &Remote, program: &str) -> (Option<i32>, String) {
        use std::os::unix::fs::PermissionsExt as _;
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let scontrol = bin.join("scontrol");
        std::fs::write(
            &scontrol,
            "#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done > \"$SCONTROL_SAID\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&scontrol, std::fs::Permissions::from_mode(0o755)).unwrap();
        let script = dir.join("agent.sh");
        std::fs::write(&script, remote.batch_script(Path::new(program))).unwrap();
        let said = dir.join("said");
        let _ = std::fs::remove_file(&said);
        let status = std::process::Command::new("sh")
            .arg(&script)
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("SLURM_JOB_ID", "42")
            .env("SLURM_ARRAY_TASK_ID", "3")
            .env("SCONTROL_SAID", &said)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        (
            status.code(),
            std::fs::read_to_string(&said).unwrap_or_default(),
        )
    }

    #[test]
    fn a_task_whose_program_is_not_on_its_node_says_so_in_its_job_comment() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let remote = Remote {
            url: "http://10.0.0.1:4000/git".into(),
            token: "s3cret".into(),
            job: "j".into(),
            repo_key: "k".into(),
        };
        let comment = |said: &str| {
            let line = said
                .lines()
                .find_map(|l| l.strip_prefix("Comment="))
                .unwrap();
            assert!(!line.contains("s3cret"), "{line}");
            NotStarted::parse(line).unwrap()
        };
        // Not there.
        let missing = dir.path().join("no/such/prodigy");
        let (code, said) = run_batch_script(dir.path(), &remote, &missing.to_string_lossy());
        assert_eq!(code, Some(127));
        assert!(said.lines().any(|l| l == "JobId=42"), "{said}");
        let why = comment(&said);
        assert_eq!(
            why,
            NotStarted::NoProgram {
                program: missing.display().to_string()
            }
        );
        assert!(why.to_string().contains("does not exist there"), "{why}");
        // There, but not a program.
        let plain = dir.path().join("prodigy");
        std::fs::write(&plain, "").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (code, said) = run_batch_script(dir.path(), &remote, &plain.to_string_lossy());
        assert_eq!(code, Some(127));
        assert!(matches!(comment(&said), NotStarted::NotExecutable { .. }));
        // Named without a path, and not on `PATH`.
        let (code, said) = run_batch_script(dir.path(), &remote, "prodigy-not-installed-here");
        assert_eq!(code, Some(127));
        assert!(
            comment(&said)
                .to_string()
                .contains("`prodigy-not-installed-here` is not on its `PATH`"),
            "{said}"
        );
        // A program that is there runs, with the secret on its stdin and no comment.
        let fake = dir.path().join("fake-prodigy");
        std::fs::write(
            &fake,
            "#!/bin/sh\nread -r secret; test \"$secret\" = s3cret\n",
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (code, said) = run_batch_script(dir.path(), &remote, &fake.to_string_lossy());
        assert_eq!(code, Some(0));
        assert_eq!(said, "");
    }

    #[test]
    fn a_reason_reads_back_from_its_comment_on_one_bounded_line() {
        for why in [
            NotStarted::NoProgram {
                program: "/opt/prodigy".into(),
            },
            NotStarted::NotExecutable {
                program: "/opt/prodigy".into(),
            },
            NotStarted::NoSecret,
            NotStarted::NodeDir {
                why: "cannot use `/x`: Not a directory".into(),
            },
            NotStarted::Fetch {
                url: "http://10.0.0.1:4000/git".into(),
                why: "`git fetch` failed: refused".into(),
            },
        ] {
            assert_eq!(NotStarted::parse(&why.comment()), Some(why));
        }
        let long = NotStarted::Fetch {
            url: "http://h/git".into(),
            why: format!("first line {}\nsecond line", "x".repeat(1000)),
        };
        let comment = long.comment();
        assert!(!comment.contains('\n'), "{comment}");
        assert!(!comment.contains("second line"), "{comment}");
        assert!(comment.len() < 400, "{comment}");
        assert_eq!(NotStarted::parse("someone else's comment"), None);
    }

    #[test]
    fn a_node_directory_is_made_private_and_refused_when_another_user_owns_it() {
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        private_node_dir(&open).unwrap();
        assert_eq!(std::fs::metadata(&open).unwrap().mode() & 0o777, 0o700);
        // The task's output lands there, 0600, and not through a link someone left.
        let mut file = open_node_output(&open, "job/1", 3).unwrap();
        std::io::Write::write_all(&mut file, b"out").unwrap();
        let path = node_output(&open, "job/1", 3);
        assert!(path.starts_with(&open));
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &path).unwrap();
        assert!(open_node_output(&open, "job/1", 3).is_err());
        assert!(!dir.path().join("elsewhere").exists());
        // Without a home, the directory is this user's own, not one name for everyone.
        assert!(
            node_root().to_string_lossy().contains("noshare"),
            "{}",
            node_root().display()
        );
        if nix::unistd::geteuid().is_root() {
            let theirs = dir.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            let refused = private_node_dir(&theirs).unwrap_err().to_string();
            assert!(refused.contains("belongs to user 65534"), "{refused}");
            assert!(NodeClone::take(&theirs, "k").is_err());
        }
    }
}
