//! `--executor` and the hidden `prodigy agent` subcommand that a Slurm task runs for one map
//! item (docs/slurm.md).

use std::path::PathBuf;
use std::sync::Arc;

use prodigy_runtime::backend::AgentHost;
use prodigy_runtime::backend::container::ContainerOptions;
use prodigy_runtime::backend::slurm::SlurmOptions;
use prodigy_runtime::jobstore::JobFiles;
use prodigy_runtime::layout::Layout;
use prodigy_runtime::runner::Options;

use crate::{err, exit_code};

/// Where a MapReduce job's agents run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ExecutorChoice {
    /// As child processes of prodigy, `max_parallel` at a time.
    #[default]
    Local,
    /// As Slurm jobs, submitted with `sbatch` (the Slurm client tools must be on `PATH`).
    Slurm,
    /// In containers, one per agent (podman, or docker; `PRODIGY_CONTAINER_IMAGE`).
    Container,
}

impl ExecutorChoice {
    /// Its name in `--executor`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ExecutorChoice::Local => "local",
            ExecutorChoice::Slurm => "slurm",
            ExecutorChoice::Container => "container",
        }
    }

    /// The runtime's executor; without a shared filesystem (`--no-shared-fs`), its agents
    /// see only the repository served at SERVE (src/noshare.rs).
    pub(crate) fn host_with(
        self,
        no_shared_fs: bool,
        serve: Option<std::net::SocketAddr>,
    ) -> AgentHost {
        use prodigy_runtime::backend::noshare::{Launch, NoShare};
        if !no_shared_fs {
            return self.host();
        }
        let launch = match self {
            ExecutorChoice::Slurm => Launch::Slurm(slurm_options()),
            ExecutorChoice::Local | ExecutorChoice::Container => Launch::Process {
                program: this_program(),
            },
        };
        AgentHost::new(Arc::new(NoShare::new(
            launch,
            Arc::new(crate::noshare::GitServer),
            serve,
        )))
    }

    /// Whether a job of PLAN runs without a shared filesystem, and where it serves: the flags,
    /// else, under `--executor slurm`, the workflow's `executor.slurm.no_shared_fs` and
    /// `serve` (Slurm's options have no effect under another executor).
    pub(crate) fn no_shared_fs(
        self,
        plan: &prodigy_compiler::plan::Plan,
        flag: bool,
        serve: Option<std::net::SocketAddr>,
    ) -> (bool, Option<std::net::SocketAddr>) {
        let slurm = plan
            .slurm
            .as_ref()
            .filter(|_| self == ExecutorChoice::Slurm);
        (
            flag || slurm.is_some_and(|s| s.no_shared_fs),
            serve.or_else(|| {
                slurm
                    .and_then(|s| s.serve.as_ref())
                    .and_then(|a| a.value.parse().ok())
            }),
        )
    }

    /// The runtime's executor: Slurm tasks run this very program.
    pub(crate) fn host(self) -> AgentHost {
        match self {
            ExecutorChoice::Local => AgentHost::local(),
            ExecutorChoice::Slurm => AgentHost::new(Arc::new(slurm_options())),
            ExecutorChoice::Container => {
                let program = this_program();
                let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
                AgentHost::new(Arc::new(ContainerOptions {
                    engine: container_engine().unwrap_or_else(|| "podman".to_owned()),
                    program,
                    image: var("PRODIGY_CONTAINER_IMAGE"),
                    network: var("PRODIGY_CONTAINER_NETWORK").is_some_and(|v| v == "host"),
                    cpus: var("PRODIGY_CONTAINER_CPUS"),
                    memory: var("PRODIGY_CONTAINER_MEMORY"),
                    run_args: var("PRODIGY_CONTAINER_ARGS")
                        .and_then(|text| prodigy_runtime::backend::slurm::split_args(&text))
                        .unwrap_or_default(),
                    poll: std::time::Duration::from_millis(50),
                }))
            }
        }
    }

    /// Refuses `--executor slurm` when a Slurm client tool is not on `PATH`, or
    /// `PRODIGY_SBATCH_ARGS` cannot be split into words, before anything starts.
    pub(crate) fn check(
        self,
        plan: &prodigy_compiler::plan::Plan,
        no_shared_fs: bool,
    ) -> Result<(), u8> {
        if self == ExecutorChoice::Container && no_shared_fs {
            err(
                "error: `--no-shared-fs` runs agents as processes of this machine or as Slurm tasks, not in containers\n  help: run with `--executor slurm` or `--executor local`, or without `--no-shared-fs`\n",
            );
            return Err(exit_code::USAGE);
        }
        if self == ExecutorChoice::Container {
            let named = plan.container.as_ref().is_some_and(|c| c.image.is_some());
            return check_container(named);
        }
        if self != ExecutorChoice::Slurm {
            return Ok(());
        }
        let missing: Vec<&str> = ["sbatch", "squeue", "scancel", "scontrol"]
            .into_iter()
            .filter(|tool| prodigy_runtime::exec::find_executable(tool).is_none())
            .collect();
        if !missing.is_empty() {
            err(&format!(
                "error: `--executor slurm` needs the Slurm client tools (`sbatch`, `squeue`, `scancel`, `scontrol`) on PATH; missing: {}\n  help: install Slurm's client (Debian: `apt-get install slurm-client`) on this machine, or run with `--executor local`\n",
                missing.join(", ")
            ));
            return Err(exit_code::USAGE);
        }
        if let Ok(text) = std::env::var("PRODIGY_SBATCH_ARGS")
            && prodigy_runtime::backend::slurm::split_args(&text).is_none()
        {
            err(&format!(
                "error: PRODIGY_SBATCH_ARGS=`{text}` cannot be split into words: an opening quote has no closing quote\n"
            ));
            return Err(exit_code::USAGE);
        }
        Ok(())
    }
}

/// The container engine: `PRODIGY_CONTAINER_ENGINE`, else podman, else docker, as found on
/// `PATH`.
fn container_engine() -> Option<String> {
    if let Ok(engine) = std::env::var("PRODIGY_CONTAINER_ENGINE")
        && !engine.is_empty()
    {
        return Some(engine);
    }
    ["podman", "docker"]
        .into_iter()
        .find(|e| prodigy_runtime::exec::find_executable(e).is_some())
        .map(str::to_owned)
}

/// Refuses `--executor container` without an engine, an image, or with
/// `PRODIGY_CONTAINER_ARGS` that cannot be split into words.
fn check_container(named: bool) -> Result<(), u8> {
    if container_engine().is_none() {
        err(
            "error: `--executor container` needs podman (or docker) on PATH\n  help: install podman (Debian: `apt-get install podman`), or run with `--executor local`\n",
        );
        return Err(exit_code::USAGE);
    }
    if !named
        && std::env::var("PRODIGY_CONTAINER_IMAGE")
            .unwrap_or_default()
            .is_empty()
    {
        err(
            "error: `--executor container` needs an image: name it in the workflow's `executor.container.image` (or set PRODIGY_CONTAINER_IMAGE)\n  help: the image needs a shell, git, the C library prodigy was built against and, for Claude steps, the Claude CLI (docs/containers.md)\n",
        );
        return Err(exit_code::USAGE);
    }
    if let Ok(text) = std::env::var("PRODIGY_CONTAINER_ARGS")
        && prodigy_runtime::backend::slurm::split_args(&text).is_none()
    {
        err(&format!(
            "error: PRODIGY_CONTAINER_ARGS=`{text}` cannot be split into words: an opening quote has no closing quote\n"
        ));
        return Err(exit_code::USAGE);
    }
    Ok(())
}

/// `PRODIGY_SBATCH_ARGS`: more `sbatch` options, split as a shell would.
fn sbatch_args() -> Vec<String> {
    std::env::var("PRODIGY_SBATCH_ARGS")
        .ok()
        .and_then(|text| prodigy_runtime::backend::slurm::split_args(&text))
        .unwrap_or_default()
}

/// `prodigy agent`: what a Slurm task runs. Not for people.
#[derive(clap::Args)]
pub(crate) struct AgentArgs {
    /// The coordinator's `$PRODIGY_HOME`.
    #[arg(long, required_unless_present = "serve")]
    pub(crate) home: Option<PathBuf>,
    /// The MapReduce job.
    #[arg(long)]
    pub(crate) job: String,
    /// The item's index.
    #[arg(long)]
    pub(crate) item: usize,
    /// Where to write the outcome.
    #[arg(long, required_unless_present = "serve")]
    pub(crate) result: Option<PathBuf>,
    /// The agent's worktree.
    #[arg(long)]
    pub(crate) workdir: Option<PathBuf>,
    /// Without a shared filesystem: the job's served repository (the secret on stdin).
    #[arg(long, requires = "repo_key", conflicts_with_all = ["home", "result", "workdir"])]
    pub(crate) serve: Option<String>,
    /// Without a shared filesystem: the name of the project's clones on this node.
    #[arg(long)]
    pub(crate) repo_key: Option<String>,
    /// Without a shared filesystem: the agent writes its own output under the node's
    /// private directory (a Slurm task, whose output Slurm sends nowhere).
    #[arg(long, requires = "serve")]
    pub(crate) output_on_node: bool,
}

/// Runs the agent template for one item of a job and writes its outcome; exit 0 once the
/// outcome is written (it says whether the agent failed), 2 when it could not be.
pub(crate) fn agent(args: &AgentArgs) -> u8 {
    // Hook (no shared filesystem): the node's own clone and home (src/noshare.rs).
    if let (Some(url), Some(key)) = (&args.serve, &args.repo_key) {
        return crate::noshare::remote_agent(url, &args.job, args.item, key, args.output_on_node);
    }
    let (Some(home), Some(result)) = (&args.home, &args.result) else {
        err("error: `prodigy agent` needs `--home` and `--result`, or `--serve`\n");
        return exit_code::USAGE;
    };
    let Some((dir, repo)) = Layout::find_job(home, &args.job) else {
        err(&format!(
            "error: no MapReduce job `{}` under {}\n",
            args.job,
            home.display()
        ));
        return exit_code::USAGE;
    };
    let files = JobFiles::new(dir);
    let (checkpoint, items) = match files
        .load_checkpoint()
        .and_then(|c| Ok((c, files.load_items()?)))
    {
        Ok(x) => x,
        Err(e) => {
            crate::err_diagnostic(&e);
            return exit_code::USAGE;
        }
    };
    let Some(item) = items.get(args.item).cloned() else {
        err(&format!(
            "error: job `{}` has {} items; there is no item {}\n",
            args.job,
            items.len(),
            args.item
        ));
        return exit_code::USAGE;
    };
    let (file, plan) = match crate::run::compile(&checkpoint.workflow_file) {
        Ok(x) => x,
        Err(code) => return code,
    };
    // The job's steps are the ones its checkpoint was made with: a workflow edited since
    // (`resume-job --force` accepts it and records the new hash) is refused here.
    if prodigy_runtime::store::hash(&file.text) != checkpoint.workflow_hash {
        err(&format!(
            "error: `{}` changed since job `{}` started; its agents do not run a different workflow (`prodigy resume-job --force` accepts the change)\n",
            checkpoint.workflow_file.display(),
            args.job
        ));
        return exit_code::USAGE;
    }
    // The agent works in the job's worktree, which the coordinator made.
    let layout = Layout {
        home: home.clone(),
        repo,
    };
    let opts = Options {
        worktree: checkpoint.worktree.clone(),
        ..crate::run::from_cli(
            Options::resumed_job(&checkpoint, &file.text, layout),
            prodigy_runtime::runner::DEFAULT_GRACE.as_secs(),
        )
    };
    let total = items.len();
    if let Err(e) = prodigy_runtime::backend::mark_started(result) {
        crate::err_diagnostic(&e);
        return exit_code::USAGE;
    }
    let result = crate::run::block_on(async move {
        let (rx, _signal) = crate::run::watch_signals();
        // The agent's log shows its steps' output, as `-v` does.
        let reporter = Arc::new(crate::report::Terminal::new(1, false));
        let (runner, vars) = prodigy_runtime::session::open(
            Arc::new(plan),
            opts,
            reporter,
            rx,
            checkpoint.job_id.clone(),
            Some(checkpoint.started_at.clone()),
            Some(&checkpoint.variables),
        )
        .await
        .map_err(|e| e.to_string())?;
        let outcome = prodigy_runtime::backend::run_task(
            &runner,
            vars,
            &item,
            args.item,
            total,
            args.workdir.clone(),
        )
        .await;
        prodigy_runtime::backend::write_result(result, &outcome).map_err(|e| e.to_string())
    });
    match result {
        Ok(Ok(())) => exit_code::OK,
        Ok(Err(why)) => {
            err(&format!("error: {why}\n"));
            exit_code::USAGE
        }
        Err(code) => code,
    }
}

/// This very program, which remote tasks run (`prodigy agent`).
fn this_program() -> PathBuf {
    std::env::current_exe().unwrap_or_else(|_| PathBuf::from("prodigy"))
}

/// The Slurm backend's options, with or without a shared filesystem: `PRODIGY_SLURM_PROGRAM`,
/// `PRODIGY_SBATCH_ARGS`, and `PRODIGY_SLURM_UNREACHABLE_SECS`, how long an unanswering
/// controller is waited for (docs/slurm.md).
fn slurm_options() -> SlurmOptions {
    // The program the nodes run: this one, at its path, unless `PRODIGY_SLURM_PROGRAM`
    // names theirs (a path, or a name on the node's `PATH`).
    let program = std::env::var_os("PRODIGY_SLURM_PROGRAM")
        .filter(|p| !p.is_empty())
        .map_or_else(this_program, PathBuf::from);
    let mut options = SlurmOptions::new(program);
    options.sbatch_args = sbatch_args();
    if let Some(secs) = std::env::var("PRODIGY_SLURM_UNREACHABLE_SECS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&s| s > 0)
    {
        options.unreachable_after = std::time::Duration::from_secs(secs);
    }
    options
}
