//! `prodigy run`, `prodigy resume` and `prodigy resume-job`: compile, then hand the plan to
//! the runtime's session lifecycle (`prodigy_runtime::session`), print what it did, and map
//! how it ended to an exit code.

use prodigy_runtime::claude::budget::still_reached;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prodigy_compiler::plan::{Plan, StepId};
use prodigy_compiler::source::SourceFile;
use prodigy_runtime::jobstore::{JobCheckpoint, JobFiles, JobPhase};
use prodigy_runtime::layout::Layout;
pub(crate) use prodigy_runtime::layout::RunKind;
use prodigy_runtime::mapreduce::{JobOutcome, MapJob};
use prodigy_runtime::progress::count;
use prodigy_runtime::reap;
use prodigy_runtime::runner::{Inputs, Options, RunOutcome, Runner};
use prodigy_runtime::session::resume::{Refused, Resume};
use prodigy_runtime::session::{self, PlaceError, StartFailed};
pub(crate) use prodigy_runtime::session::{Started, roots};
use prodigy_runtime::store::Checkpoint;
use prodigy_runtime::vars::Vars;
use prodigy_runtime::worktree;

mod args;
mod dry;
pub(crate) mod finish;
mod place;

use args::JobArgs;
pub(crate) use args::{ResumeArgs, ResumeJobArgs, RunArgs, compile, from_cli, layout};
use dry::dry_run;
pub(crate) use finish::interrupted;
use finish::{finish, finish_job, stop_advice};
pub(crate) use place::{Place, ask};
use place::{announce_merge, fix_in};

use crate::{err, exit_code};

/// `--param NAME=VALUE` options as pairs; a usage error for one without `=` or a name.
pub(crate) fn parse_params(params: &[String]) -> Result<Vec<(String, String)>, u8> {
    let mut pairs = Vec::new();
    for p in params {
        match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => pairs.push((k.to_owned(), v.to_owned())),
            _ => {
                err(&format!("error: `--param {p}` must be NAME=VALUE\n"));
                return Err(exit_code::USAGE);
            }
        }
    }
    Ok(pairs)
}

/// The W005 diagnostics (variables nothing in the workflow defines) whose variable neither
/// PARAMS nor the environment (`in_env`, for flat names) supplies, made errors: at `run` they
/// would fail the step that reads them, halfway through.
fn unsupplied(
    diagnostics: Vec<prodigy_compiler::diagnostics::Diagnostic>,
    params: &[(String, String)],
    in_env: impl Fn(&str) -> bool,
) -> Vec<prodigy_compiler::diagnostics::Diagnostic> {
    diagnostics
        .into_iter()
        .filter(|d| {
            prodigy_compiler::scope::maybe_undefined_name(d).is_some_and(|name| {
                !params.iter().any(|(k, _)| k == name) && (name.contains('.') || !in_env(name))
            })
        })
        .map(|d| prodigy_compiler::diagnostics::Diagnostic {
            severity: prodigy_compiler::diagnostics::Severity::Error,
            ..d
        })
        .collect()
}

/// Fails the run, showing where, when the workflow uses a variable that neither it,
/// PARAMS nor the environment sets (DIAGNOSTICS are the check's).
fn refuse_unsupplied(
    file: &SourceFile,
    diagnostics: Vec<prodigy_compiler::diagnostics::Diagnostic>,
    params: &[(String, String)],
) -> Result<(), u8> {
    let unsupplied = unsupplied(diagnostics, params, |name| std::env::var_os(name).is_some());
    if unsupplied.is_empty() {
        return Ok(());
    }
    let color = crate::color(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    crate::err_styled(&crate::output::human(file, &unsupplied, color));
    err(
        "error: the workflow uses variables that neither it, `--param` nor the environment sets; fix them first (see above)\n",
    );
    Err(exit_code::PROBLEMS)
}

/// Warns that the uncommitted changes in PROJECT stay out of the run's worktree.
fn warn_uncommitted(project: &Path) {
    let changes = worktree::uncommitted(project);
    if !changes.is_empty() {
        crate::note(&format!(
            "warning: {} in {} {} not in the run's worktree, which starts from HEAD (commit them first, or use --no-worktree)\n",
            count(changes.len(), "uncommitted change"),
            project.display(),
            if changes.len() == 1 { "is" } else { "are" }
        ));
    }
}

/// `prodigy run`: checks the workflow, chooses where it runs, and runs it (a session, or a
/// MapReduce job).
pub(crate) fn run(args: &RunArgs) -> u8 {
    let (file, checked) = match crate::load_checked(&args.file) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let params = match parse_params(&args.params) {
        Ok(params) => params,
        Err(code) => return code,
    };
    let Some(plan) = checked.plan else {
        err("error: internal error: a workflow without errors has no plan\n");
        return exit_code::PROBLEMS;
    };
    // An env file may define anything; a dry run interpolates what it can and runs nothing.
    if plan.env_files.is_empty()
        && !args.dry_run
        && let Err(code) = refuse_unsupplied(&file, checked.diagnostics, &params)
    {
        return code;
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
            crate::err_diagnostic(&e);
            return match e {
                PlaceError::NoGit { .. }
                | PlaceError::CommitOutsideRepository { .. }
                | PlaceError::OldGit { .. } => exit_code::PROBLEMS,
                PlaceError::NotARepository { .. } => exit_code::USAGE,
            };
        }
    };
    if isolate.is_none() && !args.place.no_worktree && !args.dry_run {
        // Said once, so that a run in place outside a repository is not a surprise.
        crate::note("not a git repository: running in place\n");
    }
    if !args.dry_run {
        let merging = isolate.is_some();
        if let Err(code) = preflight(
            &plan,
            &roots(&plan, Some(JobPhase::Setup), 0, merging),
            merging,
        ) {
            return code;
        }
    }
    if isolate.is_some() {
        warn_uncommitted(&project);
    }
    let layout = layout(&project);
    let inputs = Inputs {
        params,
        args: args.args.clone(),
        profile: args.profile.clone(),
    };
    let opts = from_cli(
        Options::new(
            std::fs::canonicalize(&args.file).unwrap_or_else(|_| args.file.clone()),
            &file.text,
            project,
            layout,
            inputs,
        ),
        args.grace,
    );
    let opts = Options {
        max_cost_usd: args.job.max_cost_usd,
        ..opts
    };
    if args.dry_run {
        return dry_run(plan, opts);
    }
    let place = Place {
        isolate,
        saved: None,
        spares: plan.worktree.persist.then(|| plan.worktree.keep.clone()),
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
    if args.job.executor != crate::agent::ExecutorChoice::Local {
        crate::note(&format!(
            "note: `--executor {}` runs the map agents of MapReduce workflows; this workflow has no map phase, so its steps run here\n",
            args.job.executor.name()
        ));
    }
    execute_session(Arc::new(plan), opts, None, place)
}

/// Checks, before any worktree, branch or lock exists, that the programs the run needs are
/// installed: `git` when it works in a worktree (GIT), the Claude CLI when running ROOTS
/// leads to a `claude` step. On failure prints why and returns the exit code.
pub(crate) fn preflight(plan: &Plan, roots: &[StepId], git: bool) -> Result<(), u8> {
    let claude = std::env::var("PRODIGY_CLAUDE_COMMAND").ok();
    session::preflight(plan, roots, git, claude.as_deref()).map_err(|e| {
        crate::err_diagnostic(&e);
        exit_code::PROBLEMS
    })
}

/// `prodigy resume-job`: continue a MapReduce job from its checkpoint (docs/mapreduce.md): items
/// that were running go back to pending, finished items keep their results, failed items
/// stay in the DLQ, and the job goes on in the phase it stopped in.
pub(crate) fn resume_job(args: &ResumeJobArgs) -> u8 {
    let home = Layout::home();
    let Some((dir, repo)) = Layout::find_job(&home, &args.job) else {
        if Layout::find_session(&home, &args.job).is_some() {
            err(&format!(
                "error: `{}` is a standard run's session, not a MapReduce job: continue it with `{}`\n",
                args.job,
                finish::resume_command("resume", "", &args.job)
            ));
        } else {
            err(&format!(
                "error: no MapReduce job `{}` under {}\n",
                args.job,
                home.display()
            ));
        }
        return exit_code::USAGE;
    };
    let checkpoint = match JobFiles::new(dir).load_checkpoint() {
        Ok(c) => c,
        Err(e) => {
            crate::err_diagnostic(&e);
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
                "error: job {id} stopped: {reason}; resumed as it is, it stops again at its next failure. See why with `prodigy dlq show {id}`; {}, then resume with: {}\n",
                stop_advice(&reason, &fix_in(checkpoint.worktree.as_ref())),
                finish::resume_command("resume-job", "--force", &id),
            ));
            return exit_code::USAGE;
        }
        Err(e @ (Refused::JobEdited { .. } | Refused::SessionEdited { .. })) => {
            crate::err_diagnostic(&e);
            return exit_code::USAGE;
        }
    }
    // A job stopped at its budget and resumed under the same one would start agents only to
    // stop them: nothing starts, and the user is told how to go on.
    let budget = prodigy_runtime::claude::budget::Budget::of(&plan, args.job_args.max_cost_usd);
    let reached = still_reached(checkpoint.claude_budget_reached, budget.as_ref());
    if let Some(reached) = reached {
        err(&format!(
            "✗ job {id} not resumed: {}, and the budget is no larger; nothing was started
raise the budget and resume with: prodigy resume-job {id} --max-cost-usd AMOUNT (more than {})
",
            prodigy_runtime::claude::budget::describe(&reached),
            prodigy_runtime::claude::budget::usd(reached.limit),
            id = checkpoint.job_id,
        ));
        return exit_code::BUDGET;
    }
    let opts = from_cli(
        Options::resumed_job(&checkpoint, &file.text, Layout { home, repo }),
        args.grace,
    );
    let opts = Options {
        max_cost_usd: args.job_args.max_cost_usd,
        ..opts
    };
    let place = Place::resumed(checkpoint.worktree.clone(), args.yes, "resume-job");
    let roots = session::resume::job_roots(&plan, &checkpoint);
    if let Err(code) = preflight(&plan, &roots, place.saved.is_some()) {
        return code;
    }
    let phase = match checkpoint.phase {
        JobPhase::Setup => "setup".to_owned(),
        JobPhase::Map => format!(
            "map, {} of {} items left",
            checkpoint.items_remaining.len(),
            checkpoint.items_total
        ),
        JobPhase::Reduce => format!(
            "reduce step {}",
            checkpoint.reduce_next_step.saturating_add(1)
        ),
        JobPhase::Done => "the end".to_owned(),
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
    plan: Arc<Plan>,
    opts: Options,
    job_args: JobArgs,
    resume: Option<JobCheckpoint>,
    place: Place,
) -> u8 {
    if let Err(code) = job_args.executor.check(&plan, job_args.no_shared_fs) {
        return code;
    }
    let job_options = job_args.options_for(&plan);
    let job_id = resume
        .as_ref()
        .map_or_else(prodigy_runtime::store::job_id, |c| c.job_id.clone());
    let launch = Launch {
        kind: RunKind::Job,
        again: "resume-job",
        id: job_id.clone(),
        resumed: resume
            .as_ref()
            .map(|c| (c.started_at.clone(), c.variables.clone())),
    };
    execute(plan, opts, place, launch, async |runner, vars, opts| {
        let dir = opts.layout.job_dir(&job_id);
        let resumed = resume.is_some();
        let checkpoint = if let Some(c) = resume {
            c
        } else {
            crate::note(&format!(
                "job {job_id} started; its state is in {}\n",
                dir.display()
            ));
            session::new_job_checkpoint(&job_id, opts)
        };
        let job_dir = dir.clone();
        let job = MapJob::new(runner, JobFiles::new(dir), checkpoint, job_options, resumed);
        let mut report = job.run(vars).await;
        // The variables move (`map.results` holds every item's result).
        Ended {
            merge: Some(report.outcome == JobOutcome::Completed),
            vars: std::mem::take(&mut report.vars),
            finish: Box::new(move |signal, unmerged, fix| {
                // Hook (issue 27): whether any item's task on another backend started.
                let launched = job_args.executor == crate::agent::ExecutorChoice::Local
                    && !job_args.no_shared_fs
                    || crate::noshare::any_started(&job_dir);
                finish_job(&report, signal, job_args.strict, unmerged, fix, launched)
            }),
        }
    })
}

/// A session or job to run: a new one, or one resumed from its checkpoint.
pub(crate) struct Launch {
    pub(crate) kind: RunKind,
    /// The command that goes on with it after a stop: `resume`, `resume-job`, `dlq retry`.
    pub(crate) again: &'static str,
    pub(crate) id: String,
    /// When it started and the variables its checkpoint saved, when resumed.
    pub(crate) resumed: Option<(String, serde_json::Value)>,
}

/// How the work under the lock ended: its variables (for the merge steps), what becomes of
/// its place, and its [`Finish`].
pub(crate) struct Ended {
    pub(crate) vars: Vars,
    /// `Some(true)`: it succeeded, and its place is merged back (after the user's decision);
    /// `Some(false)`: its place is kept; `None`: the work stopped early, and its place is
    /// left as it is, unannounced.
    pub(crate) merge: Option<bool>,
    pub(crate) finish: Finish,
}

/// What prints the last lines of a session or job and gives its exit code, from the signal
/// that came (0 when none), why merging it back failed, and where to fix things.
pub(crate) type Finish = Box<dyn FnOnce(u8, Option<&str>, &str) -> u8>;

/// Runs a session or job: enters its place, takes its lock and computes its starting
/// variables ([`start`]), does WORK, and leaves the place before WORK's last lines, so that
/// the last line says how it ended and what to do next. The one path of `run`, `resume`
/// and `resume-job`, and of `dlq retry`.
pub(crate) fn execute(
    plan: Arc<Plan>,
    mut opts: Options,
    place: Place,
    launch: Launch,
    work: impl AsyncFnOnce(&Runner, Vars, &Options) -> Ended,
) -> u8 {
    // Every command of the run carries its mark, and the guard ends them once this process
    // is gone, however it goes (dropped last: a normal end waits for it).
    let owner = reap::Owner::new(&launch.id);
    reap::adopt(&owner);
    let _guard = std::env::current_exe()
        .and_then(|program| reap::Guard::start(&program, &owner, opts.grace))
        .inspect_err(|e| {
            err(&format!(
                "warning: cannot start the guard that ends the run's processes should prodigy be killed: {e}\n"
            ));
        })
        .ok();
    let what = match launch.kind {
        RunKind::Run => "session",
        RunKind::Job => "job",
    };
    let result = block_on(async move {
        let (rx, signal) = watch_signals();
        place.enter(&mut opts, &launch.id).await?;
        let again = launch.again;
        let (started_at, saved) = launch
            .resumed
            .map_or((None, None), |(at, saved)| (Some(at), Some(saved)));
        let id = launch.id.clone();
        let Started {
            runner,
            vars,
            lock: _lock,
            ended,
        } = start(
            plan,
            opts.clone(),
            rx,
            launch.kind,
            launch.id,
            started_at,
            saved.as_ref(),
        )
        .await?;
        if ended > 0 {
            crate::note(&format!(
                "note: ended {ended} {} that an earlier run of {what} {id} left running\n",
                if ended == 1 { "process" } else { "processes" }
            ));
        }
        if runner.prepare_session(&vars).await.is_err() {
            return Ok(exit_code::PROBLEMS);
        }
        let ended = work(&runner, vars, &opts).await;
        let merged = match ended.merge {
            Some(succeeded) => place.leave(&runner, ended.vars, succeeded).await,
            None => Ok(()),
        };
        let fix = Place::fix_where(&runner);
        let mut signal = signal.load(std::sync::atomic::Ordering::SeqCst);
        let limit = runner.claude_limit_stop().filter(|_| signal == 0);
        if limit.is_some() {
            signal = exit_code::CLAUDE_LIMIT;
        }
        let code = (ended.finish)(signal, merged.err().as_deref(), &fix);
        if let Some(stop) = &limit {
            finish::limit_stopped(again, &id, stop);
        }
        Ok(code)
    });
    result.and_then(|r| r).unwrap_or_else(|code| code)
}

/// A channel set on SIGINT or SIGTERM, and which one came (130 or 143).
pub(crate) fn watch_signals() -> (
    tokio::sync::watch::Receiver<bool>,
    Arc<std::sync::atomic::AtomicU8>,
) {
    use tokio::signal::unix::{SignalKind, signal as handler};
    let (tx, rx) = tokio::sync::watch::channel(false);
    let signal = Arc::new(std::sync::atomic::AtomicU8::new(0));
    let seen = signal.clone();
    // Both handlers are in place before this returns, so a signal that comes before the
    // task first runs (right after the first command starts) is caught, not fatal.
    let (Ok(mut int), Ok(mut term)) = (
        handler(SignalKind::interrupt()),
        handler(SignalKind::terminate()),
    ) else {
        return (rx, signal);
    };
    tokio::spawn(async move {
        let code = tokio::select! {
            _ = int.recv() => crate::exit_code::SIGINT,
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
        if Layout::find_job(&home, &args.session).is_some() {
            err(&format!(
                "error: `{}` is a MapReduce job, not a standard run's session: continue it with `{}`\n",
                args.session,
                finish::resume_command("resume-job", "", &args.session)
            ));
        } else {
            err(&format!(
                "error: no session `{}` under {}\n",
                args.session,
                home.display()
            ));
        }
        return exit_code::USAGE;
    };
    let checkpoint = match Checkpoint::load(&path) {
        Ok(c) => c,
        Err(e) => {
            // It names the file, and says whether it is damaged or could not be read.
            crate::err_diagnostic(&e);
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
        crate::err_diagnostic(&e);
        return exit_code::USAGE;
    }
    // After `--force` the new version is the session's workflow from now on.
    // Filed where the session was found: a run of an older version files it elsewhere.
    let opts = from_cli(
        Options::resumed(&checkpoint, &file.text, Layout { home, repo }),
        args.grace,
    );
    let opts = Options {
        max_cost_usd: args.max_cost_usd,
        ..opts
    };
    let place = Place::resumed(checkpoint.worktree.clone(), args.yes, "resume");
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
    execute_session(Arc::new(plan), opts, Some(&checkpoint), place)
}

/// Runs a standard session (new, or resumed from CHECKPOINT) under the session's lock.
fn execute_session(
    plan: Arc<Plan>,
    opts: Options,
    resume: Option<&Checkpoint>,
    place: Place,
) -> u8 {
    let launch = Launch {
        kind: RunKind::Run,
        again: "resume",
        id: resume
            .as_ref()
            .map_or_else(prodigy_runtime::store::session_id, |c| c.session_id.clone()),
        resumed: resume
            .as_ref()
            .map(|c| (c.started_at.clone(), c.variables.clone())),
    };
    execute(plan, opts, place, launch, async |runner, vars, _| {
        let first = resume.as_ref().map_or(0, |c| c.next_step);
        if let Some(checkpoint) = &resume {
            runner.carry_continued(&checkpoint.continued);
        }
        let mut report = runner.run(vars, first).await;
        Ended {
            merge: Some(report.outcome == RunOutcome::Succeeded),
            vars: std::mem::take(&mut report.vars),
            finish: Box::new(move |signal, unmerged, fix| finish(&report, signal, unmerged, fix)),
        }
    })
}

/// Takes the lock of ID, opens its event log and computes the starting variables (plus
/// SAVED, a checkpoint's variables) with [`session::start`]; on failure prints why and
/// returns the exit code.
pub(crate) async fn start(
    plan: Arc<Plan>,
    opts: Options,
    cancel: tokio::sync::watch::Receiver<bool>,
    kind: RunKind,
    id: String,
    started_at: Option<String>,
    saved: Option<&serde_json::Value>,
) -> Result<Started, u8> {
    let reporter = Arc::new(crate::report::Terminal::for_flags());
    session::start(plan, opts, reporter, cancel, kind, id, started_at, saved)
        .await
        .map_err(|e| {
            crate::err_diagnostic(&e);
            match e {
                StartFailed::Locked(_) | StartFailed::Store(_) | StartFailed::Survivors(_) => {
                    exit_code::USAGE
                }
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
