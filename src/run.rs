//! `prodigy run` and `prodigy resume`: compile, then hand the plan to the runtime.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prodigy_compiler::plan::{Plan, PlanCommand, StepId};
use prodigy_compiler::source::SourceFile;
use prodigy_runtime::jobstore::{JobCheckpoint, JobFiles, Phase, Status};
use prodigy_runtime::mapreduce::{JobOptions, JobOutcome, JobReport, MapJob};
use prodigy_runtime::progress::count;
use prodigy_runtime::runner::{Options, Report, RunOutcome, Runner};
use prodigy_runtime::store::{Checkpoint, Layout, SessionLock};
use prodigy_runtime::vars::Vars;
use prodigy_runtime::worktree::{self, MergeBack, SessionWorktree};

use crate::{err, exit_code, out};

/// `prodigy run` options.
#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// The workflow file.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Positional arguments: `${ARG}` is the first, `${ARG_1}`, `${ARG_2}`, … each one.
    #[arg(long = "args", value_name = "ARG", num_args = 1..)]
    args: Vec<String>,
    /// A variable for the workflow, `NAME=VALUE` (repeatable).
    #[arg(long = "param", value_name = "NAME=VALUE")]
    params: Vec<String>,
    /// Apply this `profiles:` entry on top of `env`.
    #[arg(long)]
    profile: Option<String>,
    /// Print the steps with their commands interpolated as far as possible; run nothing.
    #[arg(long)]
    dry_run: bool,
    /// Show each step's output (`-v`); also its command, its `env` (credentials redacted) and its timing (`-vv`).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Print only the final outcome line and errors (no progress, no step lines).
    #[arg(short, long, conflicts_with = "verbose")]
    pub(crate) quiet: bool,
    /// Merge the run's worktree back into the branch it started from without asking (the
    /// question is asked on a terminal; elsewhere, without `-y`, the branch is kept).
    #[arg(short = 'y', long)]
    yes: bool,
    #[command(flatten)]
    place: PlaceArgs,
    /// Seconds between SIGTERM and SIGKILL when a step times out or the run is interrupted.
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    grace: u64,
    #[command(flatten)]
    job: JobArgs,
}

/// Where `run` works.
#[derive(clap::Args)]
pub(crate) struct PlaceArgs {
    /// Run in the project directory itself instead of a session worktree (the default in a
    /// git repository: `$PRODIGY_HOME/worktrees/{repo}/{session}` on branch
    /// `prodigy-{session}`, branched from HEAD and merged back at the end).
    #[arg(long, conflicts_with = "worktree")]
    no_worktree: bool,
    /// Insist on a session worktree: fail outside a git repository.
    #[arg(long)]
    worktree: bool,
}

/// Options of MapReduce jobs, for `run` and `resume-job`.
#[derive(clap::Args, Clone, Copy)]
pub(crate) struct JobArgs {
    /// Agents at a time, over the workflow's `max_parallel` (MapReduce).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_parallel: Option<u64>,
    /// When the error policy stops a MapReduce job, cancel the running agents (their items
    /// stay pending for `resume-job`) instead of letting them finish.
    #[arg(long)]
    cancel_running: bool,
    /// Exit 3 when a MapReduce job finishes with items in the dead letter queue (else 0,
    /// and the last line says so).
    #[arg(long)]
    strict: bool,
    /// Where map agents run: `local` processes, or `slurm` jobs (README "Map agents on Slurm").
    #[arg(long, value_enum, default_value_t)]
    pub(crate) executor: crate::agent::ExecutorChoice,
}

impl JobArgs {
    fn options(self) -> JobOptions {
        JobOptions {
            max_parallel: self
                .max_parallel
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            cancel_running: self.cancel_running,
            strict: self.strict,
            executor: self.executor.executor(),
        }
    }
}

/// `prodigy resume-job` options.
#[derive(clap::Args)]
pub(crate) struct ResumeJobArgs {
    /// The job to continue (printed when a job stops, fails or is interrupted).
    #[arg(value_name = "JOB_ID")]
    job: String,
    /// Show each agent's step output (`-v`); also commands and timings (`-vv`).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Print only the final outcome line and errors (no progress, no step lines).
    #[arg(short, long, conflicts_with = "verbose")]
    pub(crate) quiet: bool,
    /// Resume even if the workflow file changed since the job started, or its error policy
    /// stopped it (once the cause is fixed, or the setting that stopped it loosened).
    #[arg(long)]
    force: bool,
    /// Merge the job's worktree back without asking.
    #[arg(short = 'y', long)]
    yes: bool,
    /// Seconds between SIGTERM and SIGKILL when a step times out or the job is interrupted.
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    grace: u64,
    #[command(flatten)]
    job_args: JobArgs,
}

/// `prodigy resume` options.
#[derive(clap::Args)]
pub(crate) struct ResumeArgs {
    /// The session to continue (printed when a run fails or is interrupted).
    #[arg(value_name = "SESSION_ID")]
    session: String,
    /// Show each step's output (`-v`); also its command, its `env` (credentials redacted) and its timing (`-vv`).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Print only the final outcome line and errors (no progress, no step lines).
    #[arg(short, long, conflicts_with = "verbose")]
    pub(crate) quiet: bool,
    /// Resume even if the workflow file changed since the run started.
    #[arg(long)]
    force: bool,
    /// Merge the run's worktree back without asking.
    #[arg(short = 'y', long)]
    yes: bool,
    /// Seconds between SIGTERM and SIGKILL when a step times out or the run is interrupted.
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    grace: u64,
}

pub(crate) fn compile(path: &Path) -> Result<(SourceFile, prodigy_compiler::plan::Plan), u8> {
    let (file, checked) = crate::load_checked(path)?;
    let Some(plan) = checked.plan else {
        err("error: internal error: a workflow without errors has no plan\n");
        return Err(exit_code::PROBLEMS);
    };
    Ok((file, plan))
}

/// How to run WORKFLOW (whose text is TEXT) for PROJECT: the Claude program and jitter seed
/// from the environment, `-v` and `--grace`, no parameters, no worktree yet.
pub(crate) fn options(
    workflow: PathBuf,
    text: &str,
    layout: Layout,
    project: PathBuf,
    verbose: u8,
    grace: u64,
) -> Options {
    Options {
        workflow,
        workflow_hash: prodigy_runtime::store::hash(text),
        line_starts: prodigy_runtime::events::line_starts(text),
        layout,
        project,
        params: Vec::new(),
        args: Vec::new(),
        profile: None,
        claude_command: std::env::var("PRODIGY_CLAUDE_COMMAND").ok(),
        verbose,
        quiet: crate::quiet(),
        grace: Duration::from_secs(grace),
        seed: jitter_seed(),
        worktree: None,
        output_limit: output_limit(),
    }
}

/// `PRODIGY_OUTPUT_LIMIT`: bytes, or a number with `K`, `M` or `G` (powers of 1024); the
/// default when unset or not a size (with a warning).
fn output_limit() -> usize {
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
/// [`prodigy_runtime::store::namespace`]), wherever in the repository they start.
pub(crate) fn layout(project: &Path) -> Layout {
    Layout::of_project(project)
}

pub(crate) fn run(args: &RunArgs) -> u8 {
    let (file, plan) = match compile(&args.file) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let mut params = Vec::new();
    for p in &args.params {
        match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => params.push((k.to_owned(), v.to_owned())),
            _ => {
                err(&format!("error: `--param {p}` must be NAME=VALUE\n"));
                return exit_code::USAGE;
            }
        }
    }
    let project = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    if !args.dry_run && !git_installed() {
        // Without git, a repository looks like a plain directory: say so rather than run
        // in place.
        let why = if args.place.worktree {
            Some("`--worktree` needs it; install git".to_owned())
        } else if !args.place.no_worktree
            && let Some(top) = prodigy_runtime::store::top_level(&project)
        {
            Some(format!(
                "{} is a git repository, where runs work in a git worktree; install git, or run in place with --no-worktree",
                top.display()
            ))
        } else {
            worktree::commit_required_step(&plan).map(|step| {
                format!("step `{step}` requires a commit (`commit_required`); install git")
            })
        };
        if let Some(why) = why {
            err(&format!(
                "error: `git` is not installed (or not on PATH), and {why}\n"
            ));
            return exit_code::PROBLEMS;
        }
    }
    let repository = worktree::repository(&project);
    if repository.is_none()
        && !args.dry_run
        && let Some(step) = worktree::commit_required_step(&plan)
    {
        err(&format!(
            "error: step `{step}` requires a commit (`commit_required`), but {} is not a git repository (or has no commit yet); run it inside one\n",
            project.display()
        ));
        return exit_code::PROBLEMS;
    }
    let isolate = match repository {
        _ if args.place.no_worktree || args.dry_run => None,
        Some(repo) => Some(repo),
        None if args.place.worktree => {
            err(&format!(
                "error: `--worktree` needs a git repository with a commit, and {} is not one\n",
                project.display()
            ));
            return exit_code::USAGE;
        }
        None => None,
    };
    if !args.dry_run {
        let merging = isolate.is_some();
        if let Err(code) = preflight(
            &plan,
            &roots(&plan, Some(Phase::Setup), 0, merging),
            merging,
        ) {
            return code;
        }
    }
    if isolate.is_some() {
        let changes = worktree::uncommitted(&project);
        if !changes.is_empty() {
            crate::note(&format!(
                "warning: {} in {} {} not in the run's worktree, which starts from HEAD (commit them first, or use --no-worktree)\n",
                count(changes.len(), "uncommitted change"),
                project.display(),
                if changes.len() == 1 { "is" } else { "are" }
            ));
        }
    }
    let opts = Options {
        params,
        args: args.args.clone(),
        profile: args.profile.clone(),
        ..options(
            std::fs::canonicalize(&args.file).unwrap_or_else(|_| args.file.clone()),
            &file.text,
            layout(&project),
            project,
            args.verbose,
            args.grace,
        )
    };
    if args.dry_run {
        return dry_run(plan, opts);
    }
    let place = Place {
        isolate,
        saved: None,
        yes: args.yes,
        resume: if plan.map.is_some() {
            "resume-job"
        } else {
            "resume"
        },
    };
    if plan.map.is_some() {
        return execute_job(Arc::new(plan), opts, args.job, None, place);
    }
    if args.job.executor == crate::agent::ExecutorChoice::Slurm {
        crate::note(
            "note: `--executor slurm` runs the map agents of MapReduce workflows; this workflow has no map phase, so its steps run here\n",
        );
    }
    execute(Arc::new(plan), opts, None, place)
}

/// Whether `git` is on the PATH.
fn git_installed() -> bool {
    prodigy_runtime::exec::program_exists("git")
}

/// The steps a run starts from, for [`preflight`]: a standard workflow's from step FIRST
/// (0-based), a job's from PHASE on (`None`: none of its phases, as when it only merges),
/// and the `merge` steps when MERGING.
pub(crate) fn roots(plan: &Plan, phase: Option<Phase>, first: usize, merging: bool) -> Vec<StepId> {
    let mut roots = Vec::new();
    if plan.map.is_none() {
        if phase.is_some() {
            roots.extend(plan.commands.iter().skip(first));
        }
    } else {
        let (setup, map, reduce) = match phase {
            Some(Phase::Setup) => (true, true, true),
            Some(Phase::Map) => (false, true, true),
            Some(Phase::Reduce) => (false, false, true),
            Some(Phase::Done) | None => (false, false, false),
        };
        if setup && let Some(steps) = &plan.setup {
            roots.extend(&steps.steps);
        }
        if map && let Some(m) = &plan.map {
            roots.extend(&m.steps);
            for (_, steps) in &plan.handlers {
                roots.extend(steps);
            }
            // An agent's merge that conflicts runs the resolver.
            if let Some(merge) = &plan.merge {
                roots.extend(&merge.on_conflict);
            }
        }
        if reduce {
            roots.extend(&plan.reduce);
        }
    }
    if merging && let Some(merge) = &plan.merge {
        roots.extend(&merge.steps);
        roots.extend(&merge.on_conflict);
    }
    roots
}

/// Checks, before any worktree, branch or lock exists, that the programs the run needs are
/// installed: `git` when it works in a worktree (GIT), the Claude CLI when running ROOTS
/// leads to a `claude` step. On failure prints why and returns the exit code.
pub(crate) fn preflight(plan: &Plan, roots: &[StepId], git: bool) -> Result<(), u8> {
    if git && !git_installed() {
        err(
            "error: the run works in a git worktree, but `git` is not installed (or not on PATH); install git\n",
        );
        return Err(exit_code::PROBLEMS);
    }
    let claude = std::env::var("PRODIGY_CLAUDE_COMMAND").ok();
    prodigy_runtime::runner::preflight(plan, roots, claude.as_deref()).map_err(|e| {
        err(&format!("error: {e}\n"));
        exit_code::PROBLEMS
    })
}

/// Where a run works and how it ends: a new session worktree in the repository ISOLATE
/// (top level, project prefix), or the one a checkpoint SAVED; `yes` merges it back without
/// asking.
pub(crate) struct Place {
    pub(crate) isolate: Option<(PathBuf, PathBuf)>,
    pub(crate) saved: Option<SessionWorktree>,
    pub(crate) yes: bool,
    /// The command that continues the run (`resume` or `resume-job`), for the hint on a
    /// merge not done.
    pub(crate) resume: &'static str,
}

impl Place {
    /// Creates or reopens the session worktree of ID into OPTS; on failure prints why.
    pub(crate) async fn enter(&self, opts: &mut Options, id: &str) -> Result<(), u8> {
        let made = if let Some(saved) = &self.saved {
            match worktree::reopen(saved).await {
                Ok((w, recreated)) => {
                    if recreated {
                        crate::note(&format!(
                            "the worktree {} was gone; recreated it on branch `{}`\n",
                            w.path.display(),
                            w.branch
                        ));
                    }
                    w
                }
                Err(e) => {
                    err(&format!("error: cannot reopen the run's worktree: {e}\n"));
                    return Err(exit_code::PROBLEMS);
                }
            }
        } else if let Some((top, prefix)) = &self.isolate {
            match worktree::create_session(&opts.layout, top, prefix, id).await {
                Ok(w) if !w.workdir.is_dir() => {
                    worktree::remove(top, &w.path, &w.branch).await;
                    err(&format!(
                        "error: {} is not in the repository's HEAD (is it committed?), so the run's worktree has no such directory; commit it, or run with --no-worktree\n",
                        prefix.display()
                    ));
                    return Err(exit_code::PROBLEMS);
                }
                Ok(w) => {
                    crate::note(&format!(
                        "working in worktree {} on branch `{}` (--no-worktree runs in place)\n",
                        w.path.display(),
                        w.branch
                    ));
                    w
                }
                Err(e) => {
                    err(&format!("error: cannot create the run's worktree: {e}\n"));
                    return Err(exit_code::PROBLEMS);
                }
            }
        } else {
            return Ok(());
        };
        opts.worktree = Some(made);
        Ok(())
    }

    /// After the run: a successful one is merged back (asking first on a terminal unless
    /// `-y`); otherwise, or when the user declines, says where the work is. When the merge
    /// itself fails, returns what is kept and how to merge it later, for the last line.
    pub(crate) async fn leave(
        &self,
        runner: &Runner,
        mut vars: Vars,
        succeeded: bool,
    ) -> Result<(), String> {
        let Some(session) = runner.worktree() else {
            return Ok(());
        };
        let kept = format!(
            "the run's work is on branch `{}` in {}",
            session.branch,
            session.path.display()
        );
        if !succeeded {
            crate::note(&format!("{kept}; nothing was merged\n"));
            return Ok(());
        }
        let (commits, _) = worktree::session_changes(session);
        let target = session.target_branch.as_deref().unwrap_or("HEAD");
        if !commits.is_empty()
            && !self.yes
            && !ask(&format!(
                "merge {} from `{}` into `{target}`{}? [y/N] ",
                count(commits.len(), "commit"),
                session.branch,
                if runner.has_merge_steps() {
                    " with the `merge` steps"
                } else {
                    ""
                }
            ))
        {
            let steps = if runner.has_merge_steps() {
                " (the workflow's `merge` steps did not run)"
            } else {
                ""
            };
            err(&format!(
                "{kept}; merge it with `prodigy {} -y {}`, or with `git merge --no-ff {}`{steps}, or drop it with `prodigy worktree clean`\n",
                self.resume,
                runner.session(),
                session.branch
            ));
            return Ok(());
        }
        // Ignored files (build output and the like) go with the worktree: say so.
        let ignored = worktree::ignored(&session.path);
        let left = |n: usize| {
            if n == 0 && ignored > 0 {
                format!(
                    "its worktree is removed, with {} (build output and the like) that {} only there",
                    count(ignored, "ignored path"),
                    if ignored == 1 { "was" } else { "were" }
                )
            } else if n == 0 {
                "its worktree is removed".to_owned()
            } else {
                format!(
                    "{} {} left in {} (only commits come back; commit in a step with `commit_required` or `auto_commit`), so it is kept until `prodigy worktree clean`",
                    count(n, "uncommitted change"),
                    if n == 1 { "is" } else { "are" },
                    session.path.display()
                )
            }
        };
        match runner.merge_session(&mut vars).await {
            Ok(MergeBack::Nothing { left: 0 }) if ignored == 0 => Ok(()),
            Ok(MergeBack::Nothing { left: n }) => {
                crate::note(&format!(
                    "the run made no commits: nothing to merge; {}\n",
                    left(n)
                ));
                Ok(())
            }
            Ok(MergeBack::Merged {
                commits,
                target,
                left: n,
            }) => {
                crate::note(&format!(
                    "✓ merged {} from `{}` into `{target}`; {}\n",
                    count(commits, "commit"),
                    session.branch,
                    left(n)
                ));
                Ok(())
            }
            Err(e) => {
                err(&format!("✗ merge failed: {e}\n"));
                Err(format!(
                    "{kept}, not merged: fix the cause, then merge it with `prodigy {} -y {}` (or `git merge --no-ff {}`), or drop it with `prodigy worktree clean`",
                    self.resume,
                    runner.session(),
                    session.branch
                ))
            }
        }
    }

    /// Where the run works, for the hint after a failure: its session worktree, where a fix
    /// must go for `resume` to see it (not the user's checkout).
    pub(crate) fn fix_where(runner: &Runner) -> String {
        fix_in(runner.worktree())
    }
}

/// Where to fix what a run in WORKTREE needs: in that worktree, not in the user's checkout.
fn fix_in(worktree: Option<&SessionWorktree>) -> String {
    worktree.map_or_else(String::new, |w| {
        // The project's place in the worktree, without the `/` of an empty prefix.
        let dir: PathBuf = w.workdir.components().collect();
        format!(
            " in the run's worktree {} (resume continues there, not in your checkout)",
            dir.display()
        )
    })
}

/// Whether a completed run's session branch is still to be merged: a `resume` of it merges it
/// back (with its `merge` steps).
fn unmerged(saved: Option<&SessionWorktree>) -> bool {
    saved.is_some_and(worktree::pending_merge)
}

/// Before merging back a completed run (WHAT, whose id is ID) whose branch is not merged:
/// says what happens. Without `-y` and without a terminal to ask on, nothing is merged and
/// the hint says how: returns false, there is nothing more to do.
fn announce_merge(what: &str, saved: &SessionWorktree, place: &Place, id: &str) -> bool {
    use std::io::IsTerminal as _;
    if place.yes {
        err(&format!(
            "{what} completed; merging its branch `{}` back\n",
            saved.branch
        ));
        return true;
    }
    if std::io::stdin().is_terminal() {
        err(&format!(
            "{what} completed; its branch `{}` is not merged back yet\n",
            saved.branch
        ));
        return true;
    }
    err(&format!(
        "{what} completed, and its work on branch `{}` in {} is not merged back; nothing was merged (no terminal to ask on): merge it with `prodigy {} -y {id}`, or with `git merge --no-ff {}`, or drop it with `prodigy worktree clean`\n",
        saved.branch,
        saved.path.display(),
        place.resume,
        saved.branch
    ));
    false
}

/// Asks QUESTION on the terminal; anything but yes (or no terminal) is no.
pub(crate) fn ask(question: &str) -> bool {
    use std::io::IsTerminal as _;
    if !std::io::stdin().is_terminal() {
        return false;
    }
    err(question);
    let mut answer = String::new();
    if std::io::stdin().read_line(&mut answer).is_err() {
        return false;
    }
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

/// `prodigy resume-job`: continue a MapReduce job from its checkpoint (seed `002`): items
/// that were running go back to pending, finished items keep their results, failed items
/// stay in the DLQ, and the job goes on in the phase it stopped in.
pub(crate) fn resume_job(args: &ResumeJobArgs) -> u8 {
    let home = Layout::home();
    let Some((dir, repo)) = Layout::find_job(&home, &args.job) else {
        err(&format!(
            "error: no MapReduce job `{}` under {}\n",
            args.job,
            home.display()
        ));
        return exit_code::USAGE;
    };
    let checkpoint = match JobFiles::new(dir).load_checkpoint() {
        Ok(c) => c,
        Err(e) => {
            err(&format!("error: {e}\n"));
            return exit_code::USAGE;
        }
    };
    if checkpoint.status == Status::Completed && !unmerged(checkpoint.worktree.as_ref()) {
        err(&format!(
            "job `{}` already completed; nothing to resume\n",
            checkpoint.job_id
        ));
        return exit_code::OK;
    }
    let (file, plan) = match compile(&checkpoint.workflow_file) {
        Ok(x) => x,
        Err(code) => return code,
    };
    if prodigy_runtime::store::hash(&file.text) != checkpoint.workflow_hash && !args.force {
        err(&format!(
            "error: {} changed since the job started; resume with --force to continue with the new version\n",
            checkpoint.workflow_file.display()
        ));
        return exit_code::USAGE;
    }
    let opts = Options {
        params: checkpoint.params.clone(),
        args: checkpoint.args.clone(),
        profile: checkpoint.profile.clone(),
        ..options(
            checkpoint.workflow_file.clone(),
            &file.text,
            Layout { home, repo },
            checkpoint.project.clone(),
            args.verbose,
            args.grace,
        )
    };
    let place = Place {
        isolate: None,
        saved: checkpoint.worktree.clone(),
        yes: args.yes,
        resume: "resume-job",
    };
    if checkpoint.status == Status::Stopped && !args.force {
        let reason = checkpoint
            .stop_reason
            .as_deref()
            .unwrap_or("its error policy stopped it");
        err(&format!(
            "error: job {id} stopped: {reason}; resumed as it is, it stops again at its next failure. See why with `prodigy dlq show {id}`; {}, then resume with: prodigy resume-job --force {id}\n",
            stop_advice(reason, &fix_in(checkpoint.worktree.as_ref())),
            id = checkpoint.job_id,
        ));
        return exit_code::USAGE;
    }
    let completed = checkpoint.status == Status::Completed;
    let phase = (!completed).then_some(checkpoint.phase);
    let merging = place.saved.is_some();
    if let Err(code) = preflight(&plan, &roots(&plan, phase, 0, merging), merging) {
        return code;
    }
    let phase = match checkpoint.phase {
        Phase::Setup => "setup".to_owned(),
        Phase::Map => format!(
            "map, {} of {} items left",
            checkpoint.items_remaining.len(),
            checkpoint.items_total
        ),
        Phase::Reduce => format!(
            "reduce step {}",
            checkpoint.reduce_next_step.saturating_add(1)
        ),
        Phase::Done => "the end".to_owned(),
    };
    if let (true, Some(saved)) = (completed, &place.saved) {
        let what = format!("job {}", checkpoint.job_id);
        if !announce_merge(&what, saved, &place, &checkpoint.job_id) {
            return exit_code::OK;
        }
    } else {
        crate::note(&format!("resuming job {} in {phase}\n", checkpoint.job_id));
    }
    execute_job(Arc::new(plan), opts, args.job_args, Some(checkpoint), place)
}

/// Runs a MapReduce job (new, or resumed from CHECKPOINT) under the job's lock.
fn execute_job(
    plan: Arc<prodigy_compiler::plan::Plan>,
    mut opts: Options,
    job_args: JobArgs,
    resume: Option<JobCheckpoint>,
    place: Place,
) -> u8 {
    if let Err(code) = job_args.executor.check() {
        return code;
    }
    let result = block_on(async move {
        let (rx, signal) = watch_signals();
        let job_id = resume
            .as_ref()
            .map_or_else(prodigy_runtime::store::job_id, |c| c.job_id.clone());
        place.enter(&mut opts, &job_id).await?;
        let dir = opts.layout.job_dir(&job_id);
        let started_at = resume.as_ref().map(|c| c.started_at.clone());
        let saved = resume.as_ref().map(|c| &c.variables);
        let Started {
            runner,
            vars,
            lock: _lock,
        } = start(
            plan,
            opts.clone(),
            rx,
            Kind::Job,
            job_id.clone(),
            started_at,
            saved,
        )
        .await?;
        let resumed = resume.is_some();
        let checkpoint = if let Some(c) = resume {
            c
        } else {
            crate::note(&format!(
                "job {job_id} started; its state is in {}\n",
                dir.display()
            ));
            new_checkpoint(&job_id, &opts)
        };
        let job = MapJob::new(
            &runner,
            JobFiles::new(dir),
            checkpoint,
            job_args.options(),
            resumed,
        );
        let mut report = job.run(vars).await;
        // Worktree news first: the last line says how the job ended and what to do next.
        // The variables move (`map.results` holds every item's result).
        let completed = report.outcome == JobOutcome::Completed;
        let vars = std::mem::take(&mut report.vars);
        let merged = place.leave(&runner, vars, completed).await;
        let fix = Place::fix_where(&runner);
        Ok(finish_job(
            &report,
            signal.load(std::sync::atomic::Ordering::SeqCst),
            job_args.strict,
            merged.err().as_deref(),
            &fix,
        ))
    });
    result.and_then(|r| r).unwrap_or_else(|code| code)
}

fn new_checkpoint(job_id: &str, opts: &Options) -> JobCheckpoint {
    let now = prodigy_runtime::store::timestamp();
    JobCheckpoint {
        version: 1,
        job_id: job_id.to_owned(),
        workflow_file: opts.workflow.clone(),
        project: opts.project.clone(),
        workflow_hash: opts.workflow_hash.clone(),
        phase: Phase::Setup,
        status: Status::Running,
        items_processed: 0,
        items_total: 0,
        items_remaining: Vec::new(),
        successful_items: 0,
        failed_items: 0,
        skipped_items: 0,
        started_at: now.clone(),
        last_checkpoint_at: now,
        reduce_next_step: 0,
        variables: serde_json::Value::Null,
        params: opts.params.clone(),
        args: opts.args.clone(),
        profile: opts.profile.clone(),
        max_parallel: 0,
        stop_reason: None,
        error_metrics: None,
        worktree: opts.worktree.clone(),
    }
}

/// The last lines of a job: the error metrics when items failed, then how it ended and
/// what to do next: where the failures are (`dlq show`, the events), what is kept when the
/// merge back failed (UNMERGED), where to fix a failed step (FIX).
fn finish_job(
    report: &JobReport,
    signal: u8,
    strict: bool,
    unmerged: Option<&str>,
    fix: &str,
) -> u8 {
    let m = &report.metrics;
    let mut text = String::new();
    if m.failed + m.skipped > 0 {
        let types: Vec<String> = m
            .error_types
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect();
        let _ = writeln!(
            text,
            "errors: {} ({:.1}% of finished items failed)",
            types.join(", "),
            m.failure_rate * 100.0
        );
        for p in &m.failure_patterns {
            let _ = writeln!(
                text,
                "pattern: {} ×{}: {}",
                p.pattern, p.frequency, p.suggestion
            );
        }
    }
    let id = &report.job_id;
    let events = report.events.display();
    let queued = match report.dlq_count {
        0 => None,
        1 => Some("1 item is in the dead letter queue".to_owned()),
        n => Some(format!("{n} items are in the dead letter queue")),
    };
    let code = match &report.outcome {
        JobOutcome::Completed => {
            let _ = writeln!(
                text,
                "{} job {id} completed: {} succeeded, {} failed, {} skipped of {} (events in {events})",
                if unmerged.is_some() { "✗" } else { "✓" },
                m.successful,
                m.failed,
                m.skipped,
                count(m.total_items, "item"),
            );
            if let Some(queued) = &queued {
                let _ = writeln!(
                    text,
                    "{queued}: see why with `prodigy dlq show {id}`, retry with `prodigy dlq retry {id}`"
                );
            }
            if let Some(kept) = unmerged {
                let _ = writeln!(text, "✗ merging job {id} back failed; {kept}");
                exit_code::PROBLEMS
            } else if report.dlq_count > 0 && strict {
                exit_code::DLQ_STRICT
            } else {
                exit_code::OK
            }
        }
        JobOutcome::Stopped(reason) => {
            let _ = writeln!(
                text,
                "✗ job {id} stopped: {reason}; {} pending (events in {events})",
                count(report.pending, "item")
            );
            if let Some(queued) = &queued {
                let _ = writeln!(text, "{queued}: see why with `prodigy dlq show {id}`");
            }
            let _ = writeln!(
                text,
                "{}, then resume with: prodigy resume-job --force {id}",
                stop_advice(reason, fix)
            );
            exit_code::PROBLEMS
        }
        JobOutcome::Failed { phase, what } => {
            if let Some(queued) = &queued {
                let _ = writeln!(
                    text,
                    "{queued}: see why with `prodigy dlq show {id}`; events in {events}"
                );
            } else {
                let _ = writeln!(text, "events in {events}");
            }
            if report.resumable {
                let _ = writeln!(
                    text,
                    "✗ {phase} failed: {what}; fix it{fix}, then resume with: prodigy resume-job {id}"
                );
            } else {
                // Nothing is left to resume from: the job runs again from the start.
                let _ = writeln!(
                    text,
                    "✗ {phase} failed: {what}; the job cannot be resumed, run the workflow again"
                );
            }
            exit_code::PROBLEMS
        }
        JobOutcome::StateWrite { phase, what } => {
            let _ = writeln!(text, "events in {events}");
            let _ = writeln!(
                text,
                "✗ job {id} stopped in {phase}: {what}; {} pending; make room (or fix the permissions) under {}, then resume with: prodigy resume-job {id}",
                count(report.pending, "item"),
                Layout::home().display()
            );
            exit_code::PROBLEMS
        }
        JobOutcome::Interrupted => {
            let _ = writeln!(text, "interrupted; resume with: prodigy resume-job {id}");
            interrupted(signal)
        }
    };
    if crate::quiet() {
        // `-q`: only the outcome line.
        text = text
            .lines()
            .filter(|l| l.starts_with('✓') || l.starts_with('✗') || l.starts_with("interrupted"))
            .fold(String::new(), |mut kept, l| {
                kept.push_str(l);
                kept.push('\n');
                kept
            });
    }
    err(&text);
    code
}

/// What to change before resuming a job the error policy stopped for REASON (the text the
/// runtime gave): fix the cause (FIX says where the job's files are), or loosen the setting
/// that stopped it.
fn stop_advice(reason: &str, fix: &str) -> String {
    let setting = [
        ("`max_failures`", "raise `max_failures`"),
        ("`failure_threshold`", "raise `failure_threshold`"),
        ("`on_item_failure: stop`", "change `on_item_failure`"),
        ("`continue_on_failure`", "set `continue_on_failure: true`"),
        (
            "`timeout_action: fail`",
            "give agents more time or change `timeout_action`",
        ),
    ]
    .iter()
    .find(|(key, _)| reason.contains(key))
    .map_or_else(String::new, |(_, what)| {
        format!(", or {what} in the workflow")
    });
    format!("fix the cause{fix}{setting}")
}

/// The exit code of an interrupted run: the signal's (130 for SIGINT, 143 for SIGTERM), or
/// 130 when a step saw the interrupt before the handler recorded which one.
pub(crate) fn interrupted(signal: u8) -> u8 {
    if signal == 0 {
        exit_code::SIGINT
    } else {
        signal
    }
}

/// A channel set on SIGINT or SIGTERM, and which one came (130 or 143).
pub(crate) fn watch_signals() -> (
    tokio::sync::watch::Receiver<bool>,
    Arc<std::sync::atomic::AtomicU8>,
) {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let signal = Arc::new(std::sync::atomic::AtomicU8::new(0));
    let seen = signal.clone();
    tokio::spawn(async move {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            return;
        };
        let code = tokio::select! {
            _ = tokio::signal::ctrl_c() => crate::exit_code::SIGINT,
            _ = term.recv() => crate::exit_code::SIGTERM,
        };
        seen.store(code, std::sync::atomic::Ordering::SeqCst);
        let _ = tx.send(true);
    });
    (rx, signal)
}

pub(crate) fn resume(args: &ResumeArgs) -> u8 {
    let home = Layout::home();
    let Some((path, repo)) = Layout::find_session(&home, &args.session) else {
        err(&format!(
            "error: no session `{}` under {}\n",
            args.session,
            home.display()
        ));
        return exit_code::USAGE;
    };
    let checkpoint = match Checkpoint::load(&path) {
        Ok(c) => c,
        Err(e) => {
            err(&format!("error: cannot read {}: {e}\n", path.display()));
            return exit_code::USAGE;
        }
    };
    if checkpoint.status == "completed" && !unmerged(checkpoint.worktree.as_ref()) {
        err(&format!(
            "session `{}` already completed; nothing to resume\n",
            checkpoint.session_id
        ));
        return exit_code::OK;
    }
    let (file, plan) = match compile(&checkpoint.workflow) {
        Ok(x) => x,
        Err(code) => return code,
    };
    if prodigy_runtime::store::hash(&file.text) != checkpoint.workflow_hash && !args.force {
        err(&format!(
            "error: {} changed since the session started; resume with --force to run the new version from step {}\n",
            checkpoint.workflow.display(),
            checkpoint.next_step.saturating_add(1)
        ));
        return exit_code::USAGE;
    }
    // After `--force` the new version is the session's workflow from now on.
    let opts = Options {
        params: checkpoint.params.clone(),
        args: checkpoint.args.clone(),
        profile: checkpoint.profile.clone(),
        ..options(
            checkpoint.workflow.clone(),
            &file.text,
            // Where the session was found: a run of an older version files it elsewhere.
            Layout { home, repo },
            checkpoint.project.clone(),
            args.verbose,
            args.grace,
        )
    };
    let place = Place {
        isolate: None,
        saved: checkpoint.worktree.clone(),
        yes: args.yes,
        resume: "resume",
    };
    let completed = checkpoint.status == "completed";
    let steps = roots(
        &plan,
        (!completed).then_some(Phase::Setup),
        checkpoint.next_step,
        place.saved.is_some(),
    );
    if let Err(code) = preflight(&plan, &steps, place.saved.is_some()) {
        return code;
    }
    if let (true, Some(saved)) = (completed, &place.saved) {
        let what = format!("session {}", checkpoint.session_id);
        if !announce_merge(&what, saved, &place, &checkpoint.session_id) {
            return exit_code::OK;
        }
    } else {
        crate::note(&format!(
            "resuming session {} at step {}\n",
            checkpoint.session_id,
            checkpoint.next_step.saturating_add(1)
        ));
    }
    execute(Arc::new(plan), opts, Some(checkpoint), place)
}

fn execute(
    plan: Arc<prodigy_compiler::plan::Plan>,
    mut opts: Options,
    resume: Option<Checkpoint>,
    place: Place,
) -> u8 {
    let result = block_on(async move {
        let (rx, signal) = watch_signals();
        let id = resume
            .as_ref()
            .map_or_else(prodigy_runtime::store::session_id, |c| c.session_id.clone());
        place.enter(&mut opts, &id).await?;
        let started_at = resume.as_ref().map(|c| c.started_at.clone());
        let saved = resume.as_ref().map(|c| &c.variables);
        let Started {
            runner,
            vars,
            lock: _lock,
        } = start(plan, opts, rx, Kind::Session, id, started_at, saved).await?;
        let first = resume.as_ref().map_or(0, |c| c.next_step);
        if let Some(checkpoint) = &resume {
            runner.carry_continued(&checkpoint.continued);
        }
        let mut report = runner.run(vars, first).await;
        // Worktree news first: the last line says how the run ended and what to do next.
        let succeeded = report.outcome == RunOutcome::Succeeded;
        let vars = std::mem::take(&mut report.vars);
        let merged = place.leave(&runner, vars, succeeded).await;
        let fix = Place::fix_where(&runner);
        Ok(finish(
            &report,
            signal.load(std::sync::atomic::Ordering::SeqCst),
            merged.err().as_deref(),
            &fix,
        ))
    });
    result.and_then(|r| r).unwrap_or_else(|code| code)
}

/// What a runner runs for: a standard session or a MapReduce job (their locks live in
/// their state directories).
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Session,
    Job,
}

/// A runner ready to go: its lock held and its starting variables, with what a checkpoint
/// saved put back (its callers ran [`preflight`] before making anything).
pub(crate) struct Started {
    pub(crate) runner: Runner,
    pub(crate) vars: Vars,
    /// Held until the run ends.
    pub(crate) lock: SessionLock,
}

/// Takes the lock of ID, opens its event log and computes the starting variables (plus SAVED, a checkpoint's variables); on failure prints why and
/// returns the exit code.
pub(crate) async fn start(
    plan: Arc<prodigy_compiler::plan::Plan>,
    opts: Options,
    cancel: tokio::sync::watch::Receiver<bool>,
    kind: Kind,
    id: String,
    started_at: Option<String>,
    saved: Option<&serde_json::Value>,
) -> Result<Started, u8> {
    let fail = |code: u8| {
        move |e: &dyn std::fmt::Display| {
            err(&format!("error: {e}\n"));
            code
        }
    };
    let lock = match kind {
        Kind::Session => SessionLock::acquire(&opts.layout, &id),
        Kind::Job => SessionLock::acquire_in(&opts.layout.job_dir(&id), &format!("job `{id}`")),
    }
    .map_err(|e| fail(exit_code::USAGE)(&e))?;
    let reporter = Arc::new(crate::report::Terminal::new(opts.verbose, opts.quiet));
    let runner = Runner::with_id(plan, opts, cancel, id, started_at)
        .map_err(|e| fail(exit_code::USAGE)(&e))?
        .report_to(reporter);
    let mut vars = runner
        .initial_vars()
        .await
        .map_err(|e| fail(exit_code::PROBLEMS)(&e))?;
    if let Some(saved) = saved {
        restore(&mut vars, &runner.unseal(saved.clone()));
    }
    Ok(Started { runner, vars, lock })
}

/// Puts back what earlier steps captured, without overriding env, secrets or params.
pub(crate) fn restore(vars: &mut Vars, variables: &serde_json::Value) {
    if let Some(values) = variables.get("values").and_then(|v| v.as_object()) {
        for (k, v) in values {
            if !vars.values.contains_key(k) {
                vars.set(k.clone(), v.clone());
            }
        }
    }
    if let Some(meta) = variables.get("meta").and_then(|v| v.as_object()) {
        for (k, v) in meta {
            vars.meta.insert(k.clone(), v.clone());
        }
    }
}

/// The last line of a standard run: how it ended and what to do next. UNMERGED says what is
/// kept when its merge back failed; FIX, where to fix a failed step.
fn finish(report: &Report, signal: u8, unmerged: Option<&str>, fix: &str) -> u8 {
    if !report.continued.is_empty() {
        err(&continued_line(&report.continued));
    }
    match report.outcome {
        RunOutcome::Succeeded => {
            if let Some(kept) = unmerged {
                err(&format!(
                    "✗ session {} ran every step, but merging it back failed; {kept} (events in {})\n",
                    report.session_id,
                    report.events.display()
                ));
                return exit_code::PROBLEMS;
            }
            err(&format!(
                "✓ workflow completed (session {}, events in {})\n",
                report.session_id,
                report.events.display()
            ));
            exit_code::OK
        }
        RunOutcome::Failed if report.state_error.is_some() => {
            err(&format!(
                "✗ session {} stopped: {}; make room (or fix the permissions) under {}, then resume with: prodigy resume {}\n",
                report.session_id,
                report.state_error.as_deref().unwrap_or_default(),
                Layout::home().display(),
                report.session_id
            ));
            exit_code::PROBLEMS
        }
        RunOutcome::Failed => {
            err(&format!(
                "✗ step `{}` failed; fix it{fix}, then resume with: prodigy resume {}\n",
                report.failed_step.as_deref().unwrap_or("?"),
                report.session_id
            ));
            exit_code::PROBLEMS
        }
        RunOutcome::Interrupted => {
            err(&format!(
                "interrupted; resume with: prodigy resume {}\n",
                report.session_id
            ));
            interrupted(signal)
        }
    }
}

/// How many steps failed and were continued, and which: those whose `on_failure` handler ran
/// without any run of the command succeeding, and those whose failure is ignored.
fn continued_line(steps: &[prodigy_runtime::store::ContinuedStep]) -> String {
    let names: Vec<String> = steps
        .iter()
        .map(|c| {
            let how = if c.handled {
                "its `on_failure` handler ran"
            } else {
                "failure ignored"
            };
            format!("`{}` ({how})", c.step)
        })
        .collect();
    let (count, verb) = match steps.len() {
        1 => ("1 step".to_owned(), "was"),
        n => (format!("{n} steps"), "were"),
    };
    format!(
        "warning: {count} failed and {verb} continued: {}\n",
        names.join(", ")
    )
}

/// Prints the steps with their commands rendered as far as the starting variables allow
/// (env files, env, the profile, params and args; secrets as `***`; nothing is run).
fn dry_run(plan: prodigy_compiler::plan::Plan, opts: Options) -> u8 {
    let plan = Arc::new(plan);
    let reporter = Arc::new(crate::report::Terminal::new(opts.verbose, opts.quiet));
    let runner = Runner::dry(plan.clone(), opts).report_to(reporter);
    let vars = match block_on(runner.preview_vars()) {
        Ok(Ok(vars)) => vars,
        Ok(Err(e)) => {
            err(&format!("error: {e}\n"));
            return exit_code::PROBLEMS;
        }
        Err(code) => return code,
    };
    let mut text = String::new();
    if let Some(map) = &plan.map {
        let _ = writeln!(
            text,
            "dry run of MapReduce workflow {}; nothing is executed",
            plan.name.as_deref().unwrap_or(&plan.source)
        );
        if let Some(setup) = &plan.setup {
            text.push_str("setup:\n");
            dry_steps(&mut text, &plan, &setup.steps, &runner, &vars);
        }
        let parallel = match &map.max_parallel {
            prodigy_compiler::ast::MaxParallel::Fixed(n) => n.value.to_string(),
            prodigy_compiler::ast::MaxParallel::Variable(t) => runner.preview(&t.parsed, &vars),
        };
        let _ = writeln!(
            text,
            "map: input {}, {parallel} agents at a time (`prodigy items` lists the items)",
            runner.preview(&map.input.parsed, &vars)
        );
        dry_steps(&mut text, &plan, &map.steps, &runner, &vars);
        if !plan.reduce.is_empty() {
            text.push_str("reduce:\n");
            dry_steps(&mut text, &plan, &plan.reduce, &runner, &vars);
        }
    } else {
        let _ = writeln!(
            text,
            "dry run of {} ({}); nothing is executed",
            plan.name.as_deref().unwrap_or(&plan.source),
            count(plan.commands.len(), "step")
        );
        dry_steps(&mut text, &plan, &plan.commands, &runner, &vars);
    }
    out(&text);
    exit_code::OK
}

/// One numbered entry per step, with its command rendered as far as VARS allow.
fn dry_steps(
    text: &mut String,
    plan: &prodigy_compiler::plan::Plan,
    steps: &[prodigy_compiler::plan::StepId],
    runner: &Runner,
    vars: &Vars,
) {
    for (i, id) in steps.iter().enumerate() {
        let Some(step) = plan.step(*id) else { continue };
        let command = match &step.command {
            PlanCommand::Shell(t) => format!("shell: {}", runner.preview(&t.parsed, vars)),
            PlanCommand::Claude(t) => format!("claude: {}", runner.preview(&t.parsed, vars)),
            PlanCommand::WriteFile(w) => {
                format!("write_file: {}", runner.preview(&w.path.parsed, vars))
            }
            PlanCommand::Foreach { .. } => "foreach".to_owned(),
        };
        let _ = writeln!(
            text,
            "{:>3}. {}\n     {}",
            i + 1,
            step.label,
            command.replace('\n', "\n     ")
        );
        if let Some(when) = &step.when {
            let _ = writeln!(text, "     when: {}", when.value);
        }
        if let Some(retry) = &step.retry {
            let _ = writeln!(text, "     retry: {} attempts", retry.config.attempts);
        }
        if step.on_failure.is_some() {
            text.push_str("     on_failure: handled\n");
        }
    }
}

/// Runs a future on a fresh single-threaded runtime.
pub(crate) fn block_on<F: std::future::Future>(future: F) -> Result<F::Output, u8> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => Ok(runtime.block_on(future)),
        Err(e) => {
            err(&format!("error: cannot start the runtime: {e}\n"));
            Err(exit_code::USAGE)
        }
    }
}

/// The seed of retry jitter: `PRODIGY_SEED` when set (tests and reproductions), else a fresh
/// one per run, so that parallel runs do not retry in lockstep.
pub(crate) fn jitter_seed() -> u64 {
    std::env::var("PRODIGY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            u64::from(std::process::id())
                ^ now.as_secs().rotate_left(20)
                ^ u64::from(now.subsec_nanos())
        })
}
