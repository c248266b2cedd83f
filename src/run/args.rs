//! The options of `run`, `resume` and `resume-job`, and the runner options they make.

use std::path::{Path, PathBuf};
use std::time::Duration;

use prodigy_compiler::source::SourceFile;
use prodigy_runtime::layout::Layout;
use prodigy_runtime::mapreduce::JobOptions;
use prodigy_runtime::runner::Options;

use crate::{err, exit_code};

/// `prodigy run` options.
#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// The workflow file.
    #[arg(value_name = "FILE")]
    pub(crate) file: PathBuf,
    /// Positional arguments: `${ARG}` is the first, `${ARG_1}`, `${ARG_2}`, … each one.
    #[arg(long = "args", value_name = "ARG", num_args = 1..)]
    pub(crate) args: Vec<String>,
    /// A variable for the workflow, `NAME=VALUE` (repeatable).
    #[arg(long = "param", value_name = "NAME=VALUE")]
    pub(crate) params: Vec<String>,
    /// Apply this `profiles:` entry on top of `env`.
    #[arg(long)]
    pub(crate) profile: Option<String>,
    /// Print the steps with their commands interpolated as far as possible; run nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    #[command(flatten)]
    pub(crate) shown: crate::report::Shown,
    /// Merge the run's worktree back into the branch it started from without asking (the
    /// question is asked on a terminal; elsewhere, without `-y`, the branch is kept).
    #[arg(short = 'y', long)]
    pub(crate) yes: bool,
    #[command(flatten)]
    pub(crate) place: PlaceArgs,
    /// Seconds between SIGTERM and SIGKILL when a step times out or the run is interrupted.
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    pub(crate) grace: u64,
    #[command(flatten)]
    pub(crate) job: JobArgs,
}

/// Where `run` works.
#[derive(clap::Args)]
pub(crate) struct PlaceArgs {
    /// Run in the project directory itself instead of a session worktree (the default in a
    /// git repository: `$PRODIGY_HOME/worktrees/{repo}/{session}` on branch
    /// `prodigy-{session}`, branched from HEAD and merged back at the end).
    #[arg(long, conflicts_with = "worktree")]
    pub(crate) no_worktree: bool,
    /// Insist on a session worktree: fail outside a git repository.
    #[arg(long)]
    pub(crate) worktree: bool,
}

/// Options of MapReduce jobs, for `run` and `resume-job`.
#[derive(clap::Args, Clone, Copy)]
pub(crate) struct JobArgs {
    /// Agents at a time, over the workflow's `max_parallel` (MapReduce).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_parallel: Option<u64>,
    /// When the error policy stops a MapReduce job, cancel the running agents (their items
    /// stay pending for `resume-job`) instead of letting them finish.
    #[arg(long)]
    pub(crate) cancel_running: bool,
    /// Exit 3 when a MapReduce job finishes with items in the dead letter queue, and 1 when
    /// it had no items to process (else 0, and the last line says so).
    #[arg(long)]
    pub(crate) strict: bool,
    /// Most the run or job may spend on Claude calls, in US dollars, across resumes: no new
    /// Claude call starts once it would be passed (over the workflow's `claude.max_cost_usd`).
    #[arg(long, value_name = "USD", value_parser = parse_usd)]
    pub(crate) max_cost_usd: Option<f64>,
    /// Where map agents run: `local` processes, `slurm` jobs, or a `container` each
    /// (docs/slurm.md, docs/containers.md).
    #[arg(long, value_enum, default_value_t)]
    pub(crate) executor: crate::agent::ExecutorChoice,
    /// The agents see nothing of this machine's disk: it serves the repository to them
    /// (git over HTTP, a per-job secret) and they push their commits back (docs/slurm.md).
    #[arg(long)]
    pub(crate) no_shared_fs: bool,
    /// With `--no-shared-fs`: where the repository is served, an address of this machine
    /// the agents reach (default: its host name on a free port; 127.0.0.1 for `local`).
    #[arg(long, value_name = "HOST:PORT", requires = "no_shared_fs")]
    pub(crate) serve_addr: Option<std::net::SocketAddr>,
}

impl JobArgs {
    /// The options of a job of PLAN: under `--executor slurm`, its workflow's
    /// `executor.slurm.no_shared_fs` and `serve` count as `--no-shared-fs` and
    /// `--serve-addr` when those are not given.
    pub(crate) fn options_for(self, plan: &prodigy_compiler::plan::Plan) -> JobOptions {
        let (no_shared_fs, serve_addr) =
            self.executor
                .no_shared_fs(plan, self.no_shared_fs, self.serve_addr);
        JobArgs {
            no_shared_fs,
            serve_addr,
            ..self
        }
        .options()
    }

    pub(crate) fn options(self) -> JobOptions {
        JobOptions {
            max_parallel: self
                .max_parallel
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            cancel_running: self.cancel_running,
            strict: self.strict,
            host: self.executor.host_with(self.no_shared_fs, self.serve_addr),
        }
    }
}

/// A positive amount of US dollars.
fn parse_usd(text: &str) -> Result<f64, String> {
    match text.trim().trim_start_matches('$').parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 => Ok(n),
        _ => Err(format!(
            "`{text}` is not an amount of US dollars above 0, such as `25` or `2.5`"
        )),
    }
}

/// `prodigy resume-job` options.
#[derive(clap::Args)]
pub(crate) struct ResumeJobArgs {
    /// The job to continue (printed when a job stops, fails or is interrupted).
    #[arg(value_name = "JOB_ID")]
    pub(crate) job: String,
    #[command(flatten)]
    pub(crate) shown: crate::report::Shown,
    /// Resume even if the workflow file changed since the job started, or its error policy
    /// stopped it (once the cause is fixed, or the setting that stopped it loosened).
    #[arg(long)]
    pub(crate) force: bool,
    /// Merge the job's worktree back without asking.
    #[arg(short = 'y', long)]
    pub(crate) yes: bool,
    /// Seconds between SIGTERM and SIGKILL when a step times out or the job is interrupted.
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    pub(crate) grace: u64,
    #[command(flatten)]
    pub(crate) job_args: JobArgs,
}

/// `prodigy resume` options.
#[derive(clap::Args)]
pub(crate) struct ResumeArgs {
    /// The session to continue (printed when a run fails or is interrupted).
    #[arg(value_name = "SESSION_ID")]
    pub(crate) session: String,
    #[command(flatten)]
    pub(crate) shown: crate::report::Shown,
    /// Resume even if the workflow file changed since the run started.
    #[arg(long)]
    pub(crate) force: bool,
    /// Merge the run's worktree back without asking.
    #[arg(short = 'y', long)]
    pub(crate) yes: bool,
    /// Most the session may spend on Claude calls, in US dollars, across resumes (over the
    /// workflow's `claude.max_cost_usd`).
    #[arg(long, value_name = "USD", value_parser = parse_usd)]
    pub(crate) max_cost_usd: Option<f64>,
    /// Seconds between SIGTERM and SIGKILL when a step times out or the run is interrupted.
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    pub(crate) grace: u64,
}

pub(crate) fn compile(path: &Path) -> Result<(SourceFile, prodigy_compiler::plan::Plan), u8> {
    let (file, checked) = crate::load_checked(path)?;
    let Some(plan) = checked.plan else {
        err("error: internal error: a workflow without errors has no plan\n");
        return Err(exit_code::PROBLEMS);
    };
    Ok((file, plan))
}

/// OPTS (from [`Options::new`], [`Options::resumed`] or [`Options::resumed_job`]) as this
/// command line and the environment ask: `--grace` GRACE seconds, the Claude program (`PRODIGY_CLAUDE_COMMAND`), the jitter seed and the output limit. Every
/// run goes through here, new or resumed, so a setting is never missed in one of them.
pub(crate) fn from_cli(opts: Options, grace: u64) -> Options {
    Options {
        claude_command: std::env::var("PRODIGY_CLAUDE_COMMAND").ok(),
        grace: Duration::from_secs(grace),
        seed: super::jitter_seed(),
        output_limit: output_limit(),
        ..opts
    }
}

/// `PRODIGY_OUTPUT_LIMIT`: bytes, or a number with `K`, `M` or `G` (powers of 1024); the
/// default when unset or not a size (with a warning).
pub(crate) fn output_limit() -> usize {
    let Ok(text) = std::env::var("PRODIGY_OUTPUT_LIMIT") else {
        return prodigy_runtime::exec::DEFAULT_OUTPUT_LIMIT;
    };
    parse_size(&text).unwrap_or_else(|| {
        err(&format!(
            "warning: PRODIGY_OUTPUT_LIMIT=`{text}` is not a size (bytes, or a number with K, M or G); keeping the default, 8M\n"
        ));
        prodigy_runtime::exec::DEFAULT_OUTPUT_LIMIT
    })
}

fn parse_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => text.split_at(i),
        None => (text, ""),
    };
    let shift = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => return None,
    };
    number
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .filter(|n| *n > 0)
}

/// Where the runs of PROJECT keep their files: under its repository's namespace (see
/// [`prodigy_runtime::layout::namespace`]), wherever in the repository they start.
pub(crate) fn layout(project: &Path) -> Layout {
    Layout::of_project(project)
}
