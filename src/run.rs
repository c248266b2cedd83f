//! `prodigy run` and `prodigy resume`: compile, then hand the plan to the runtime.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prodigy_compiler::plan::PlanCommand;
use prodigy_compiler::source::SourceFile;
use prodigy_runtime::runner::{Options, Report, RunOutcome, Runner};
use prodigy_runtime::store::{Checkpoint, Layout, SessionLock};
use prodigy_runtime::vars::Vars;

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
    /// Answer yes to questions (nothing asks yet; accepted for scripts).
    #[arg(short = 'y', long)]
    yes: bool,
    /// Seconds between SIGTERM and SIGKILL when a step times out or the run is interrupted.
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    grace: u64,
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
    /// Resume even if the workflow file changed since the run started.
    #[arg(long)]
    force: bool,
    /// Seconds between SIGTERM and SIGKILL when a step times out or the run is interrupted.
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    grace: u64,
}

fn compile(path: &Path) -> Result<(SourceFile, prodigy_compiler::plan::Plan), u8> {
    let (file, checked) = crate::load_checked(path)?;
    let Some(plan) = checked.plan else {
        err("error: internal error: a workflow without errors has no plan\n");
        return Err(exit_code::PROBLEMS);
    };
    if plan.map.is_some() {
        err(
            "error: running MapReduce workflows is not implemented yet; `prodigy check`, `graph` and `items` work on them\n",
        );
        return Err(exit_code::USAGE);
    }
    Ok((file, plan))
}

fn layout(project: &Path) -> Layout {
    let repo = project
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("project")
        .to_owned();
    Layout {
        home: Layout::home(),
        repo,
    }
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
    let opts = Options {
        workflow: std::fs::canonicalize(&args.file).unwrap_or_else(|_| args.file.clone()),
        workflow_hash: prodigy_runtime::store::hash(&file.text),
        layout: layout(&project),
        project,
        params,
        args: args.args.clone(),
        profile: args.profile.clone(),
        claude_command: std::env::var("PRODIGY_CLAUDE_COMMAND").ok(),
        verbose: args.verbose,
        grace: Duration::from_secs(args.grace),
        seed: jitter_seed(),
    };
    let _ = args.yes;
    if args.dry_run {
        return dry_run(plan, opts);
    }
    execute(Arc::new(plan), opts, None)
}

pub(crate) fn resume(args: &ResumeArgs) -> u8 {
    let home = Layout::home();
    let Some(path) = Layout::find_session(&home, &args.session) else {
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
    if checkpoint.status == "completed" {
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
            checkpoint.next_step + 1
        ));
        return exit_code::USAGE;
    }
    let opts = Options {
        workflow: checkpoint.workflow.clone(),
        // After `--force` the new version is the session's workflow from now on.
        workflow_hash: prodigy_runtime::store::hash(&file.text),
        layout: layout(&checkpoint.project),
        project: checkpoint.project.clone(),
        params: checkpoint.params.clone(),
        args: checkpoint.args.clone(),
        profile: checkpoint.profile.clone(),
        claude_command: std::env::var("PRODIGY_CLAUDE_COMMAND").ok(),
        verbose: args.verbose,
        grace: Duration::from_secs(args.grace),
        seed: jitter_seed(),
    };
    err(&format!(
        "resuming session {} at step {}\n",
        checkpoint.session_id,
        checkpoint.next_step + 1
    ));
    execute(Arc::new(plan), opts, Some(checkpoint))
}

fn execute(
    plan: Arc<prodigy_compiler::plan::Plan>,
    opts: Options,
    resume: Option<Checkpoint>,
) -> u8 {
    if plan.merge.is_some() {
        err(
            "warning: the `merge` steps run when a session worktree is merged back; worktree isolation is not implemented yet, so this run works in place and will not run them\n",
        );
    }
    let result = block_on(async move {
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
                _ = tokio::signal::ctrl_c() => 130,
                _ = term.recv() => 143,
            };
            seen.store(code, std::sync::atomic::Ordering::SeqCst);
            let _ = tx.send(true);
        });
        let layout = opts.layout.clone();
        let runner = match Runner::new(plan, opts, rx, resume.as_ref()) {
            Ok(r) => r,
            Err(e) => {
                err(&format!("error: {e}\n"));
                return exit_code::USAGE;
            }
        };
        let _lock = match SessionLock::acquire(&layout, runner.session()) {
            Ok(lock) => lock,
            Err(e) => {
                err(&format!("error: {e}\n"));
                return exit_code::USAGE;
            }
        };
        if let Err(e) = runner.preflight() {
            err(&format!("error: {e}\n"));
            return exit_code::PROBLEMS;
        }
        let mut vars = match runner.initial_vars().await {
            Ok(v) => v,
            Err(e) => {
                err(&format!("error: {e}\n"));
                return exit_code::PROBLEMS;
            }
        };
        let start = match &resume {
            Some(c) => {
                restore(&mut vars, c);
                c.next_step
            }
            None => 0,
        };
        let report = runner.run(vars, start).await;
        finish(&report, signal.load(std::sync::atomic::Ordering::SeqCst))
    });
    result.unwrap_or_else(|code| code)
}

/// Puts back what earlier steps captured, without overriding env, secrets or params.
fn restore(vars: &mut Vars, checkpoint: &Checkpoint) {
    if let Some(values) = checkpoint
        .variables
        .get("values")
        .and_then(|v| v.as_object())
    {
        for (k, v) in values {
            if !vars.values.contains_key(k) {
                vars.set(k.clone(), v.clone());
            }
        }
    }
    if let Some(meta) = checkpoint.variables.get("meta").and_then(|v| v.as_object()) {
        for (k, v) in meta {
            vars.meta.insert(k.clone(), v.clone());
        }
    }
}

fn finish(report: &Report, signal: u8) -> u8 {
    match report.outcome {
        RunOutcome::Succeeded => {
            err(&format!(
                "✓ workflow completed (session {}, events in {})\n",
                report.session_id,
                report.events.display()
            ));
            exit_code::OK
        }
        RunOutcome::Failed => {
            err(&format!(
                "✗ step `{}` failed; fix it, then resume with: prodigy resume {}\n",
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
            if signal == 0 { 130 } else { signal }
        }
    }
}

/// Prints the steps with their commands rendered as far as the starting variables allow
/// (env files, env, the profile, params and args; secrets as `***`; nothing is run).
fn dry_run(plan: prodigy_compiler::plan::Plan, opts: Options) -> u8 {
    let plan = Arc::new(plan);
    let runner = Runner::dry(plan.clone(), opts);
    let vars = match block_on(runner.preview_vars()) {
        Ok(Ok(vars)) => vars,
        Ok(Err(e)) => {
            err(&format!("error: {e}\n"));
            return exit_code::PROBLEMS;
        }
        Err(code) => return code,
    };
    let mut text = format!(
        "dry run of {} ({} steps); nothing is executed\n",
        plan.name.as_deref().unwrap_or(&plan.source),
        plan.commands.len()
    );
    for (i, id) in plan.commands.iter().enumerate() {
        let Some(step) = plan.step(*id) else { continue };
        let command = match &step.command {
            PlanCommand::Shell(t) => format!("shell: {}", runner.preview(&t.parsed, &vars)),
            PlanCommand::Claude(t) => format!("claude: {}", runner.preview(&t.parsed, &vars)),
            PlanCommand::WriteFile(w) => {
                format!("write_file: {}", runner.preview(&w.path.parsed, &vars))
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
    out(&text);
    exit_code::OK
}

/// Runs a future on a fresh single-threaded runtime.
fn block_on<F: std::future::Future>(future: F) -> Result<F::Output, u8> {
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
fn jitter_seed() -> u64 {
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
