//! `prodigy run`, `prodigy resume` and `prodigy resume-job`: compile, then hand the plan to
//! the runtime's session lifecycle (`prodigy_runtime::session`), print what it did, and map
//! how it ended to an exit code.

use std::path::PathBuf;
use std::sync::Arc;

use prodigy_compiler::plan::{Plan, StepId};
use prodigy_runtime::jobstore::{JobCheckpoint, JobFiles, Phase};
use prodigy_runtime::mapreduce::{JobOutcome, MapJob};
use prodigy_runtime::progress::count;
use prodigy_runtime::runner::{Options, RunOutcome};
use prodigy_runtime::session::resume::{Refused, Resume};
use prodigy_runtime::session::{self, PlaceError, StartFailed};
pub(crate) use prodigy_runtime::session::{Kind, Started, roots};
use prodigy_runtime::store::{Checkpoint, Layout};
use prodigy_runtime::worktree;

mod args;
mod dry;
mod finish;
mod place;

use args::JobArgs;
pub(crate) use args::{ResumeArgs, ResumeJobArgs, RunArgs, compile, layout, options};
use dry::dry_run;
pub(crate) use finish::interrupted;
use finish::{finish, finish_job, stop_advice};
pub(crate) use place::{Place, ask};
use place::{announce_merge, fix_in};

use crate::{err, exit_code};

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
    let how = session::Placement {
        no_worktree: args.place.no_worktree,
        worktree: args.place.worktree,
        dry_run: args.dry_run,
    };
    let isolate = match session::choose_place(&plan, &project, how) {
        Ok(isolate) => isolate,
        Err(e) => {
            err(&format!("error: {e}\n"));
            return match e {
                PlaceError::NoGit { .. } | PlaceError::CommitOutsideRepository { .. } => {
                    exit_code::PROBLEMS
                }
                PlaceError::NotARepository { .. } => exit_code::USAGE,
            };
        }
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

/// Checks, before any worktree, branch or lock exists, that the programs the run needs are
/// installed: `git` when it works in a worktree (GIT), the Claude CLI when running ROOTS
/// leads to a `claude` step. On failure prints why and returns the exit code.
pub(crate) fn preflight(plan: &Plan, roots: &[StepId], git: bool) -> Result<(), u8> {
    let claude = std::env::var("PRODIGY_CLAUDE_COMMAND").ok();
    session::preflight(plan, roots, git, claude.as_deref()).map_err(|e| {
        err(&format!("error: {e}\n"));
        exit_code::PROBLEMS
    })
}

/// `prodigy resume-job`: continue a MapReduce job from its checkpoint (README "MapReduce jobs"): items
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
    let resume = session::resume::job(&checkpoint);
    if resume == Resume::Nothing {
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
    match session::resume::check_job(&checkpoint, &file.text, args.force) {
        Ok(()) => {}
        Err(Refused::Stopped { job: id, reason }) => {
            err(&format!(
                "error: job {id} stopped: {reason}; resumed as it is, it stops again at its next failure. See why with `prodigy dlq show {id}`; {}, then resume with: prodigy resume-job --force {id}\n",
                stop_advice(&reason, &fix_in(checkpoint.worktree.as_ref())),
            ));
            return exit_code::USAGE;
        }
        Err(e @ (Refused::JobEdited { .. } | Refused::SessionEdited { .. })) => {
            err(&format!("error: {e}\n"));
            return exit_code::USAGE;
        }
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
    let roots = session::resume::job_roots(&plan, &checkpoint);
    if let Err(code) = preflight(&plan, &roots, place.saved.is_some()) {
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
    if let (Resume::MergeBack, Some(saved)) = (resume, &place.saved) {
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
            session::new_job_checkpoint(&job_id, &opts)
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
    let resume = session::resume::session(&checkpoint);
    if resume == Resume::Nothing {
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
    if let Err(e) = session::resume::check_session(&checkpoint, &file.text, args.force) {
        err(&format!("error: {e}\n"));
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
    let steps = session::resume::session_roots(&plan, &checkpoint);
    if let Err(code) = preflight(&plan, &steps, place.saved.is_some()) {
        return code;
    }
    if let (Resume::MergeBack, Some(saved)) = (resume, &place.saved) {
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

/// Takes the lock of ID, opens its event log and computes the starting variables (plus
/// SAVED, a checkpoint's variables) with [`session::start`]; on failure prints why and
/// returns the exit code.
pub(crate) async fn start(
    plan: Arc<Plan>,
    opts: Options,
    cancel: tokio::sync::watch::Receiver<bool>,
    kind: Kind,
    id: String,
    started_at: Option<String>,
    saved: Option<&serde_json::Value>,
) -> Result<Started, u8> {
    let reporter = Arc::new(crate::report::Terminal::new(opts.verbose, opts.quiet));
    session::start(plan, opts, reporter, cancel, kind, id, started_at, saved)
        .await
        .map_err(|e| {
            err(&format!("error: {e}\n"));
            match e {
                StartFailed::Locked(_) | StartFailed::Store(_) => exit_code::USAGE,
                StartFailed::Variables(_) => exit_code::PROBLEMS,
            }
        })
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
