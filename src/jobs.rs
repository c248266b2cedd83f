//! `prodigy dlq` and `prodigy events`: inspect what a job left under `$PRODIGY_HOME`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prodigy_runtime::dlq::{DeadLetteredItem, Dlq};
use prodigy_runtime::events::kind_of;
use prodigy_runtime::jobstore::JobFiles;
use prodigy_runtime::layout::Layout;
use prodigy_runtime::live::EventFiles;
use prodigy_runtime::runner::Options;

use crate::run::{Ended, RunKind};
use prodigy_runtime::progress::count;
use serde_json::Value;

use crate::{err, exit_code, out};

/// `prodigy dlq`.
#[derive(clap::Subcommand)]
pub(crate) enum DlqCommand {
    /// List the items in a job's dead letter queue, oldest first.
    List {
        /// The MapReduce job.
        #[arg(value_name = "JOB_ID")]
        job: String,
        /// `human` (a table) or `json`.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        #[command(flatten)]
        quiet: crate::Quiet,
    },
    /// Show dead-lettered items in full, with every failed attempt: one item, or all of them.
    Show {
        /// The MapReduce job.
        #[arg(value_name = "JOB_ID")]
        job: String,
        /// The item (`item_<n>`); without it, every item.
        #[arg(value_name = "ITEM_ID")]
        item: Option<String>,
        /// `human` or `json` (the stored `DeadLetteredItem` records).
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        #[command(flatten)]
        quiet: crate::Quiet,
    },
    /// Run the queued items again through the workflow's agent template. Items that succeed
    /// leave the queue; items that fail again stay with the new failure recorded. Items are
    /// read one at a time, so large queues need little memory.
    Retry(RetryArgs),
    /// Remove every item from a job's queue for good (after fixing them by hand). Asks first
    /// on a terminal; elsewhere it needs `-y`.
    Clear {
        /// The MapReduce job.
        #[arg(value_name = "JOB_ID")]
        job: String,
        /// Remove without asking.
        #[arg(short = 'y', long)]
        yes: bool,
        /// List the items that would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        quiet: crate::Quiet,
    },
    /// Count the queued items by error type and by error signature.
    Stats {
        /// The MapReduce job.
        #[arg(value_name = "JOB_ID")]
        job: String,
        /// `human` or `json`.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        #[command(flatten)]
        quiet: crate::Quiet,
    },
}

/// `prodigy dlq retry`.
#[derive(clap::Args)]
pub(crate) struct RetryArgs {
    /// The MapReduce job.
    #[arg(value_name = "JOB_ID")]
    job: String,
    /// Agents at a time (default: the workflow's `max_parallel`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_parallel: Option<u64>,
    /// List the items that would be retried; run nothing.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    pub(crate) shown: crate::report::Shown,
    /// Seconds between SIGTERM and SIGKILL when a step times out or the retry is interrupted.
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    grace: u64,
    /// Merge the job's worktree back without asking (when the job works in one).
    #[arg(short = 'y', long)]
    yes: bool,
    /// Where the retried agents run: `local` processes, `slurm` jobs, or a `container` each.
    #[arg(long, value_enum, default_value_t)]
    executor: crate::agent::ExecutorChoice,
    /// The agents see nothing of this machine's disk: it serves them the repository
    /// (docs/slurm.md; the workflow's `executor.slurm.no_shared_fs` counts under Slurm).
    #[arg(long)]
    no_shared_fs: bool,
    /// With `--no-shared-fs`: where the repository is served (`HOST:PORT`).
    #[arg(long, value_name = "HOST:PORT", requires = "no_shared_fs")]
    serve_addr: Option<std::net::SocketAddr>,
}

/// Output formats of the inspection commands.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    Human,
    Json,
}

/// `dlq clear`: empties the queue of JOB, after asking on a terminal (not with YES); a dry
/// run only lists what would go.
fn clear(queue: &Dlq, job: &str, yes: bool, dry_run: bool, layout: &Layout) -> u8 {
    let items = match queue.items() {
        Ok(items) => items,
        Err(e) => {
            crate::err_diagnostic(&e);
            return exit_code::USAGE;
        }
    };
    if items.is_empty() {
        crate::note(&format!(
            "the dead letter queue of {job} is empty; nothing to remove\n"
        ));
        return exit_code::OK;
    }
    let what = count(items.len(), "item");
    if dry_run {
        let mut text =
            format!("dry run: {what} would be removed from the dead letter queue of {job}\n");
        for i in &items {
            let kind = i
                .failure_history
                .last()
                .map_or("Unknown", |f| f.error_type.name());
            let _ = writeln!(text, "  {}  {kind}  {}", i.item_id, i.item_data);
        }
        out(&prodigy_runtime::progress::visible(&text));
        return exit_code::OK;
    }
    if !yes {
        use std::io::IsTerminal as _;
        if !std::io::stdin().is_terminal() {
            err(&format!(
                "error: `dlq clear` would remove {what} from the dead letter queue of {job} for good, and there is no terminal to confirm on; pass -y to go ahead (`--dry-run` lists what would go)\n"
            ));
            return exit_code::USAGE;
        }
        if !crate::run::ask(&format!(
            "remove {what} from the dead letter queue of {job} for good? [y/N] "
        )) {
            err("nothing was removed\n");
            return exit_code::PROBLEMS;
        }
    }
    match queue.clear() {
        Ok(n) => {
            // The job's events say so too, for `status`, the dashboard and `graph --status`.
            if let Ok(mut log) = prodigy_runtime::store::EventLog::open(layout, job) {
                for i in &items {
                    log.record(
                        "dlq_item_removed",
                        serde_json::json!({ "item_id": i.item_id }),
                    );
                }
            }
            err(&format!(
                "removed {} from the dead letter queue of {job}\n",
                count(n, "item")
            ));
            exit_code::OK
        }
        Err(e) => {
            crate::err_diagnostic(&e);
            exit_code::USAGE
        }
    }
}

/// An error type for people: its name, with the kind of a failed Claude call
/// (`ClaudeFailed (rate_limit)`).
fn error_shown(error: &prodigy_runtime::dlq::ErrorType) -> String {
    match error {
        prodigy_runtime::dlq::ErrorType::ClaudeFailed { kind } => {
            format!("{} ({kind})", error.name())
        }
        other => other.name().to_owned(),
    }
}

/// One failed attempt of a dead-lettered item, for `dlq show`: when, where and how it
/// failed, then the command's exit code and the last lines of its standard output and
/// standard error (or the error, for a failure that ran no command).
fn show_attempt(text: &mut String, f: &prodigy_runtime::dlq::FailureDetail) {
    let _ = writeln!(
        text,
        "  attempt {} at {} by {} ({} ms): {} in `{}`",
        f.attempt_number,
        f.timestamp,
        f.agent_id,
        f.duration_ms,
        error_shown(&f.error_type),
        f.step_failed
    );
    if let Some(log) = &f.json_log_location {
        let _ = writeln!(text, "    claude log: {log}");
    }
    let Some(output) = &f.command_output else {
        for line in f.stack_trace.as_deref().unwrap_or(&f.error_message).lines() {
            let _ = writeln!(text, "    │ {line}");
        }
        return;
    };
    let _ = writeln!(
        text,
        "    exit code: {}",
        output.exit_code.map_or_else(
            || {
                if output.stderr.contains("could not start `") {
                    "none (it could not start)".to_owned()
                } else {
                    "none (killed by a signal)".to_owned()
                }
            },
            |c| c.to_string()
        )
    );
    for (name, stream) in [("stdout", &output.stdout), ("stderr", &output.stderr)] {
        if stream.trim().is_empty() {
            let _ = writeln!(text, "    {name}: (empty)");
            continue;
        }
        let _ = writeln!(
            text,
            "    {name} (last {} lines at most):",
            prodigy_runtime::dlq::CommandTail::LINES
        );
        for line in stream.lines() {
            let _ = writeln!(text, "    │ {line}");
        }
    }
    // A failure the command's output does not explain (`commit_required`, a timeout, ...).
    if output.stderr.trim().is_empty() || !output.stderr.contains(f.error_message.trim()) {
        let _ = writeln!(text, "    error: {}", f.error_message);
    }
}

/// Where a job's files are: its state directory (if any) and its project's layout.
struct Located {
    layout: Layout,
    state: Option<PathBuf>,
}

/// Finds JOB in any project under `$PRODIGY_HOME`: by its state, else by its DLQ.
fn locate(job: &str) -> Option<Located> {
    if !prodigy_runtime::layout::is_id(job) {
        return None;
    }
    let home = Layout::home();
    if let Some((state, repo)) = Layout::find_job(&home, job) {
        return Some(Located {
            layout: Layout { home, repo },
            state: Some(state),
        });
    }
    let repo = std::fs::read_dir(Layout::dlq_root(&home))
        .ok()?
        .filter_map(Result::ok)
        .find(|repo| repo.path().join(job).is_dir())?
        .file_name()
        .to_string_lossy()
        .into_owned();
    Some(Located {
        layout: Layout { home, repo },
        state: None,
    })
}

fn unknown_job(job: &str) -> u8 {
    err(&format!(
        "error: no MapReduce job `{job}` under {}\n",
        Layout::home().display()
    ));
    exit_code::USAGE
}

/// Widest rendering of an item in `dlq list`.
const ITEM_WIDTH: usize = 40;

/// A short rendering of ITEM for `dlq list`: its `id`, `path` or first string field (an
/// object), the text itself (a string), else its JSON; cut to [`ITEM_WIDTH`] characters.
fn item_shown(item: &Value) -> String {
    let text = match item {
        Value::String(s) => s.clone(),
        Value::Object(map) => ["id", "path"]
            .iter()
            .find_map(|k| map.get(*k).filter(|v| !v.is_null()))
            .or_else(|| map.values().find(|v| v.is_string()))
            .map_or_else(
                || item.to_string(),
                |v| v.as_str().map_or_else(|| v.to_string(), str::to_owned),
            ),
        other => other.to_string(),
    };
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() {
        "-".to_owned()
    } else if text.chars().count() > ITEM_WIDTH {
        let cut: String = text.chars().take(ITEM_WIDTH - 1).collect();
        format!("{cut}…")
    } else {
        text
    }
}

fn to_json(value: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default() + "\n"
}

/// `prodigy dlq`: finds the job's dead letter queue, repairs its index if it must, and runs
/// the subcommand on it.
pub(crate) fn dlq(command: &DlqCommand) -> u8 {
    let job = match command {
        DlqCommand::List { job, .. }
        | DlqCommand::Show { job, .. }
        | DlqCommand::Clear { job, .. }
        | DlqCommand::Stats { job, .. } => job,
        DlqCommand::Retry(args) => &args.job,
    };
    let Some(located) = locate(job) else {
        return unknown_job(job);
    };
    let queue = Dlq::new(&located.layout, job);
    if let Ok(Some(rebuilt)) = queue.repair() {
        err(&format!("warning: {rebuilt}\n"));
    }
    match command {
        DlqCommand::List { format, .. } => dlq_list(&queue, job, *format),
        DlqCommand::Show { item, format, .. } => dlq_show(&queue, job, item.as_deref(), *format),
        DlqCommand::Clear { yes, dry_run, .. } => dlq_clear(&located, &queue, job, *yes, *dry_run),
        DlqCommand::Stats { format, .. } => dlq_stats(&queue, job, *format),
        DlqCommand::Retry(args) => retry(args, &located, &queue),
    }
}

/// The items of QUEUE, or the exit code after saying why they cannot be read.
fn queue_items(queue: &Dlq) -> Result<Vec<DeadLetteredItem>, u8> {
    queue.items().map_err(|e| {
        crate::err_diagnostic(&e);
        exit_code::USAGE
    })
}

/// `prodigy dlq list`: one row (or JSON object) per item of JOB's queue.
fn dlq_list(queue: &Dlq, job: &str, format: Format) -> u8 {
    let items = match queue_items(queue) {
        Ok(items) => items,
        Err(code) => return code,
    };
    if format == Format::Json {
        let rows: Vec<Value> = items.iter().map(list_row_json).collect();
        out(&to_json(&rows));
        return exit_code::OK;
    }
    if items.is_empty() {
        out(&format!("the dead letter queue of {job} is empty\n"));
        return exit_code::OK;
    }
    let rows: Vec<[String; 7]> = items.iter().map(list_row).collect();
    let mut text = crate::output::table(
        &[
            "ITEM",
            "WHAT",
            "FAILURES",
            "ERROR",
            "LAST ATTEMPT",
            "RETRY",
            "CLAUDE LOG",
        ],
        &rows,
    );
    let _ = writeln!(text, "{}", count(items.len(), "item"));
    out(&prodigy_runtime::progress::visible(&text));
    exit_code::OK
}

/// An item's object in `prodigy dlq list --format json`.
fn list_row_json(i: &DeadLetteredItem) -> Value {
    serde_json::json!({
        "item_id": i.item_id,
        "failure_count": i.failure_count,
        "error_type": i.failure_history.last().map(|f| f.error_type.name()),
        "claude_error_kind": i.failure_history.last().and_then(|f| match &f.error_type {
            prodigy_runtime::dlq::ErrorType::ClaudeFailed { kind } => Some(kind.name()),
            _ => None,
        }),
        "log": i.failure_history.last().and_then(|f| f.json_log_location.clone()),
        "last_attempt": i.last_attempt,
        "reprocess_eligible": i.reprocess_eligible,
        "error_signature": i.error_signature,
    })
}

/// An item's row in the table of `prodigy dlq list`.
fn list_row(i: &DeadLetteredItem) -> [String; 7] {
    let last = i.failure_history.last();
    [
        i.item_id.clone(),
        item_shown(&i.item_data),
        i.failure_count.to_string(),
        last.map_or_else(|| "Unknown".to_owned(), |f| error_shown(&f.error_type)),
        i.last_attempt.clone(),
        if i.reprocess_eligible {
            "yes"
        } else {
            "manual review"
        }
        .to_owned(),
        last.and_then(|f| f.json_log_location.clone())
            .unwrap_or_else(|| "-".to_owned()),
    ]
}

/// `prodigy dlq show`: ITEM of JOB's queue (or all of them) with each failed attempt.
fn dlq_show(queue: &Dlq, job: &str, item: Option<&str>, format: Format) -> u8 {
    let shown: Vec<DeadLetteredItem> = match item {
        Some(id) => match queue.get(id) {
            Ok(Some(item)) => vec![item],
            Ok(None) => {
                err(&format!(
                    "error: `{id}` is not in the dead letter queue of {job}\n"
                ));
                return exit_code::USAGE;
            }
            Err(e) => {
                crate::err_diagnostic(&e);
                return exit_code::USAGE;
            }
        },
        None => match queue_items(queue) {
            Ok(items) => items,
            Err(code) => return code,
        },
    };
    if format == Format::Json {
        if item.is_some()
            && let Some(one) = shown.first()
        {
            out(&to_json(one));
        } else {
            out(&to_json(&shown));
        }
        return exit_code::OK;
    }
    let mut text = String::new();
    for i in &shown {
        show_item(&mut text, i);
    }
    if shown.is_empty() {
        text = format!("the dead letter queue of {job} is empty\n");
    }
    out(&prodigy_runtime::progress::visible(&text));
    exit_code::OK
}

/// Adds item I to the TEXT of `prodigy dlq show`: its counts, data, signature, attempts
/// and worktree.
fn show_item(text: &mut String, i: &DeadLetteredItem) {
    let _ = writeln!(
        text,
        "{}: {}, first {}, last {}{}",
        i.item_id,
        count(i.failure_count, "failure"),
        i.first_attempt,
        i.last_attempt,
        if i.manual_review_required {
            " (manual review)"
        } else {
            ""
        }
    );
    let _ = writeln!(text, "  item: {}", i.item_data);
    let _ = writeln!(text, "  signature: {}", i.error_signature);
    for f in &i.failure_history {
        show_attempt(text, f);
    }
    if let Some(w) = &i.worktree_artifacts {
        let _ = writeln!(
            text,
            "  worktree: {} (branch {})",
            w.worktree_path.display(),
            w.branch_name
        );
    }
}

/// `prodigy dlq clear`: empties JOB's queue, unless the job runs (it owns the index then).
fn dlq_clear(located: &Located, queue: &Dlq, job: &str, yes: bool, dry_run: bool) -> u8 {
    // The running job keeps the index in memory: clear only what it does not own.
    // Listing what would go takes nothing from it.
    let _lock =
        match located.state.as_ref().filter(|_| !dry_run).map(|dir| {
            prodigy_runtime::store::SessionLock::acquire_in(dir, &format!("job `{job}`"))
        }) {
            Some(Err(e)) => {
                err(&format!(
                    "error: {e}; clear its queue once it has finished\n"
                ));
                return exit_code::USAGE;
            }
            Some(Ok(lock)) => Some(lock),
            None => None,
        };
    clear(queue, job, yes, dry_run, &located.layout)
}

/// `prodigy dlq stats`: how many items JOB's queue holds, by error type and signature.
fn dlq_stats(queue: &Dlq, job: &str, format: Format) -> u8 {
    let items = match queue_items(queue) {
        Ok(items) => items,
        Err(code) => return code,
    };
    let mut by_type = std::collections::BTreeMap::<&str, u64>::new();
    let mut by_signature = std::collections::BTreeMap::<&str, u64>::new();
    for i in &items {
        let kind = i
            .failure_history
            .last()
            .map_or("Unknown", |f| f.error_type.name());
        *by_type.entry(kind).or_default() += 1;
        *by_signature.entry(i.error_signature.as_str()).or_default() += 1;
    }
    let eligible = items.iter().filter(|i| i.reprocess_eligible).count();
    if format == Format::Json {
        out(&to_json(&serde_json::json!({
            "job_id": job,
            "items": items.len(),
            "reprocess_eligible": eligible,
            "manual_review": items.len() - eligible,
            "by_error_type": by_type,
            "by_signature": by_signature,
        })));
        return exit_code::OK;
    }
    let mut text = format!(
        "{} ({eligible} can be retried, {} manual review)\n",
        count(items.len(), "item"),
        match items.len() - eligible {
            1 => "1 needs".to_owned(),
            n => format!("{n} need"),
        }
    );
    text.push_str("by error type:\n");
    for (kind, n) in &by_type {
        let _ = writeln!(text, "  {n:>6}  {kind}");
    }
    text.push_str("by signature:\n");
    for (signature, n) in &by_signature {
        let _ = writeln!(text, "  {n:>6}  {signature}");
    }
    out(&prodigy_runtime::progress::visible(&text));
    exit_code::OK
}

/// `prodigy dlq retry --dry-run`: which items of QUEUE would run again, and with which
/// workflow (the job's CHECKPOINT says it).
fn retry_dry_run(queue: &Dlq, checkpoint: &prodigy_runtime::jobstore::JobCheckpoint) -> u8 {
    let items = match queue_items(queue) {
        Ok(items) => items,
        Err(code) => return code,
    };
    let (eligible, manual): (Vec<_>, Vec<_>) = items.iter().partition(|i| i.reprocess_eligible);
    let mut text = format!(
        "dry run: {} would be retried with {}\n",
        count(eligible.len(), "item"),
        checkpoint.workflow_file.display()
    );
    for i in &eligible {
        let _ = writeln!(text, "  {}  {}", i.item_id, i.item_data);
    }
    if !manual.is_empty() {
        let _ = writeln!(
            text,
            "{} manual review and would be left alone",
            match manual.len() {
                1 => "1 item needs".to_owned(),
                n => format!("{n} items need"),
            }
        );
    }
    out(&prodigy_runtime::progress::visible(&text));
    exit_code::OK
}

/// The steps `prodigy dlq retry` runs for PLAN: the agents again, and the session's way
/// back (the merge) when the job had completed in a SAVED worktree.
fn retried_steps(
    plan: &prodigy_compiler::plan::Plan,
    checkpoint: &prodigy_runtime::jobstore::JobCheckpoint,
    saved: bool,
) -> Vec<prodigy_compiler::plan::StepId> {
    let mut steps: Vec<_> = plan
        .map
        .as_ref()
        .map(|m| m.steps.clone())
        .unwrap_or_default();
    if saved && checkpoint.status == prodigy_runtime::jobstore::Status::Completed {
        steps.extend(crate::run::roots(plan, None, 0, true));
    }
    steps
}

/// `prodigy dlq retry`: runs the eligible items of QUEUE again with the job's workflow.
fn retry(args: &RetryArgs, located: &Located, queue: &Dlq) -> u8 {
    let Some(state) = &located.state else {
        err(&format!(
            "error: the state of job `{}` is gone, so its workflow is unknown; nothing to retry with\n",
            args.job
        ));
        return exit_code::USAGE;
    };
    let mut files = JobFiles::new(state.clone());
    let checkpoint = match files.load_checkpoint() {
        Ok(c) => c,
        Err(e) => {
            crate::err_diagnostic(&e);
            return exit_code::USAGE;
        }
    };
    if args.dry_run {
        return retry_dry_run(queue, &checkpoint);
    }
    let (file, plan) = match crate::run::compile(&checkpoint.workflow_file) {
        Ok(x) => x,
        Err(code) => return code,
    };
    if prodigy_runtime::store::hash(&file.text) != checkpoint.workflow_hash {
        crate::note(&format!(
            "note: {} changed since the job ran; the items run with the new agent template\n",
            checkpoint.workflow_file.display()
        ));
    }
    let parallel = args
        .max_parallel
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let opts = crate::run::from_cli(
        Options::resumed_job(&checkpoint, &file.text, located.layout.clone()),
        args.grace,
    );
    let place = crate::run::Place::resumed(checkpoint.worktree.clone(), args.yes, "resume-job");
    let steps = retried_steps(&plan, &checkpoint, place.saved.is_some());
    if let Err(code) = crate::run::preflight(&plan, &steps, place.saved.is_some()) {
        return code;
    }
    if let Err(code) = args.executor.check(&plan, args.no_shared_fs) {
        return code;
    }
    // Hook (issue 27): the retried agents without a shared filesystem, as the job's.
    let (no_shared_fs, serve) =
        args.executor
            .no_shared_fs(&plan, args.no_shared_fs, args.serve_addr);
    let executor = args.executor.host_with(no_shared_fs, serve);
    let job = args.job.clone();
    let total = usize::try_from(checkpoint.items_total).unwrap_or(usize::MAX);
    let completed = checkpoint.status == prodigy_runtime::jobstore::Status::Completed;
    let launch = crate::run::Launch {
        kind: RunKind::Job,
        again: "dlq retry",
        id: job.clone(),
        resumed: Some((checkpoint.started_at.clone(), checkpoint.variables.clone())),
    };
    crate::run::execute(
        Arc::new(plan),
        opts,
        place,
        launch,
        async |runner, vars, _| {
            let summary = match prodigy_runtime::mapreduce::retry_dead_letters(
                runner, &vars, &mut files, &job, parallel, total, &executor,
            )
            .await
            {
                Ok(s) => s,
                Err(e) => {
                    crate::err_diagnostic(&e);
                    return Ended {
                        vars,
                        merge: None,
                        finish: Box::new(|_, _, _| exit_code::PROBLEMS),
                    };
                }
            };
            if summary.interrupted {
                err(&format!(
                    "interrupted after retrying {}; run `{}` again for the rest\n",
                    count(summary.retried, "item"),
                    crate::run::finish::resume_command("dlq retry", "", &job)
                ));
                return Ended {
                    vars,
                    merge: None,
                    finish: Box::new(|signal, _, _| crate::run::interrupted(signal)),
                };
            }
            // The session comes back only for a job that completed (as `run` merges it), and
            // only when the retried work reached the session worktree.
            Ended {
                vars,
                merge: Some(completed && !summary.unmerged),
                finish: Box::new(move |_, unmerged, _| retried(&summary, &job, unmerged)),
            }
        },
    )
}

/// The last lines of `dlq retry` for job JOB and its exit code; UNMERGED says why merging
/// the job back failed.
fn retried(
    summary: &prodigy_runtime::mapreduce::RetrySummary,
    job: &str,
    unmerged: Option<&str>,
) -> u8 {
    let left = summary.still_failing + summary.manual + summary.halted;
    let mut text = format!(
        "retried {}: {} succeeded and left the queue, {} failed again; {} in the dead letter queue of {job}",
        count(summary.retried, "item"),
        summary.succeeded,
        summary.still_failing,
        if left == 1 {
            "1 item remains".to_owned()
        } else {
            format!("{left} items remain")
        }
    );
    if summary.still_failing > 0 {
        let _ = write!(text, " (see why with `prodigy dlq show {job}`)");
    }
    text.push('\n');
    if summary.halted > 0 {
        let _ = writeln!(
            text,
            "✗ the retry stopped with {} not run, its backend lost (said above); run `{}` again once it is back",
            count(summary.halted, "item"),
            crate::run::finish::resume_command("dlq retry", "", job)
        );
    }
    if let Some(kept) = unmerged {
        let _ = writeln!(text, "✗ merging job {job} back failed; {kept}");
    }
    err(&text);
    if summary.still_failing > 0 || summary.halted > 0 || summary.unmerged || unmerged.is_some() {
        exit_code::PROBLEMS
    } else {
        exit_code::OK
    }
}

/// `prodigy events`.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct EventsArgs {
    #[command(subcommand)]
    action: Option<EventsAction>,
    /// The job (or standard session) whose events to print.
    #[arg(value_name = "JOB_ID")]
    job: Option<String>,
    /// Keep printing new events as they are written, until the job finishes (or Ctrl-C).
    #[arg(long)]
    follow: bool,
    #[command(flatten)]
    show: ShowArgs,
    #[command(flatten)]
    pub(crate) quiet: crate::Quiet,
}

/// How events are shown.
#[derive(clap::Args, Clone)]
pub(crate) struct ShowArgs {
    /// Print the stored JSON lines as they are.
    #[arg(long)]
    json: bool,
    /// Only events whose type contains this text (case-insensitive), e.g. `circuit`.
    #[arg(long = "type", value_name = "TEXT")]
    event_type: Option<String>,
    /// Sum the Claude calls instead: calls, failures, turns, tokens and cost, per step and
    /// in all.
    #[arg(long, conflicts_with_all = ["json", "event_type"])]
    claude: bool,
    /// Fail (exit 1) when a line of the event files is damaged (torn by a crash, or not
    /// JSON); without it such lines are skipped with a warning that says where they are.
    #[arg(long)]
    strict: bool,
}

/// The damaged lines of the event files: where they are, as `FILE:LINE`.
#[derive(Default)]
struct Damaged {
    /// Every damaged line found so far.
    total: usize,
    /// The ones not yet reported.
    unreported: Vec<String>,
}

impl Damaged {
    /// How many places a warning names; the rest are counted.
    const SHOWN: usize = 10;

    fn note(&mut self, file: &Path, line: usize) {
        self.total += 1;
        self.unreported.push(format!("{}:{line}", file.display()));
    }

    /// How `prodigy events` ends: with problems when STRICT and a line was damaged.
    fn exit_code(&self, strict: bool) -> u8 {
        if strict && self.total > 0 {
            exit_code::PROBLEMS
        } else {
            exit_code::OK
        }
    }

    /// Tells, on standard error, of the damaged lines found since the last report.
    fn report(&mut self) {
        let places = std::mem::take(&mut self.unreported);
        if places.is_empty() {
            return;
        }
        let mut shown = places
            .iter()
            .take(Self::SHOWN)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        if places.len() > Self::SHOWN {
            let _ = write!(shown, " and {} more", places.len() - Self::SHOWN);
        }
        err(&format!(
            "warning: skipped {} that {} not an event (torn by a crash, or damaged): {shown}\n",
            count(places.len(), "damaged line"),
            if places.len() == 1 { "is" } else { "are" },
        ));
    }
}

/// The Claude calls in the events files in DIR, summed per step and in all.
fn claude_totals(dir: &Path) -> String {
    use prodigy_runtime::claude::Totals;
    use prodigy_runtime::events::Event;
    let mut steps: Vec<(String, Totals)> = Vec::new();
    let mut all = Totals::default();
    EventFiles::new(dir.to_owned()).read(
        &mut |_, _, line| {
            if kind_of(line).is_some_and(|kind| kind != "claude_finished") {
                return;
            }
            // Only the lines that can be a Claude call's are read as events.
            let Ok(Event::ClaudeFinished {
                step,
                error_kind,
                num_turns,
                cost_usd,
                cost_estimated,
                tokens,
                ..
            }) = serde_json::from_slice::<Event>(line)
            else {
                return;
            };
            let call = Totals::one_call(
                error_kind.is_some(),
                num_turns,
                cost_usd,
                cost_estimated,
                tokens,
            );
            match steps.iter_mut().find(|(s, _)| *s == step) {
                Some((_, totals)) => totals.merge(&call),
                None => steps.push((step, call)),
            }
            all.merge(&call);
        },
        &|| false,
    );
    if all.calls == 0 {
        return "no Claude calls\n".to_owned();
    }
    let mut text = String::new();
    for (step, totals) in &steps {
        let _ = writeln!(text, "{step}: {}", totals.line());
    }
    let _ = writeln!(text, "in all: {}", all.line());
    text
}

/// `prodigy events ls|follow --job-id ID`.
#[derive(clap::Subcommand)]
pub(crate) enum EventsAction {
    /// Print a job's events.
    Ls {
        /// The job (or standard session).
        #[arg(long, value_name = "ID")]
        job_id: String,
        #[command(flatten)]
        show: ShowArgs,
    },
    /// Print a job's events and keep printing new ones until the job finishes.
    Follow {
        /// The job (or standard session).
        #[arg(long, value_name = "ID")]
        job_id: String,
        #[command(flatten)]
        show: ShowArgs,
    },
}

/// The directory of JOB's events under HOME, in whichever repository's it is.
fn events_dir(home: &Path, job: &str) -> Option<PathBuf> {
    std::fs::read_dir(Layout::events_root(home))
        .ok()
        .filter(|_| prodigy_runtime::layout::is_id(job))
        .and_then(|repos| {
            repos
                .filter_map(Result::ok)
                .map(|repo| repo.path().join(job))
                .find(|p| p.is_dir())
        })
}

/// `prodigy events`: prints JOB's events, and with `--follow` the ones still to come.
pub(crate) fn events(args: &EventsArgs) -> u8 {
    let (job, follow, show) = match &args.action {
        Some(EventsAction::Ls { job_id, show }) => (job_id.as_str(), false, show),
        Some(EventsAction::Follow { job_id, show }) => (job_id.as_str(), true, show),
        None => {
            let Some(job) = &args.job else {
                err(
                    "error: name a job: `prodigy events JOB_ID` or `prodigy events ls --job-id JOB_ID`\n",
                );
                return exit_code::USAGE;
            };
            (job.as_str(), args.follow, &args.show)
        }
    };
    let home = Layout::home();
    let Some(dir) = events_dir(&home, job) else {
        err(&format!(
            "error: no events for `{job}` under {}\n",
            Layout::events_root(&home).display()
        ));
        return exit_code::USAGE;
    };
    if show.claude {
        out(&claude_totals(&dir));
        return exit_code::OK;
    }
    // The runtime's one events reader: whole lines only (a line being written is read on
    // the next round), a chunk at a time, so a large file is never held whole.
    let mut files = EventFiles::new(dir.clone());
    // The number of each file's last line read, for the places of damaged lines.
    let mut lines_read: Vec<usize> = Vec::new();
    let mut damaged = Damaged::default();
    let mut finished = false;
    loop {
        let mut text = String::new();
        // JSON lines stay as they are written; a person's view shows control characters.
        let flush = |text: &mut String| {
            if show.json {
                out(text);
            } else {
                out(&prodigy_runtime::progress::visible(text));
            }
            text.clear();
        };
        let mut places: Vec<(u16, usize)> = Vec::new();
        let (read_any, _) = files.read(
            &mut |file, _, bytes| {
                let number = usize::from(file);
                if lines_read.len() <= number {
                    lines_read.resize(number + 1, 0);
                }
                lines_read[number] += 1;
                let line = String::from_utf8_lossy(bytes);
                let Some(event) = serde_json::from_str::<Value>(&line)
                    .ok()
                    .filter(Value::is_object)
                else {
                    if !line.trim().is_empty() {
                        places.push((file, lines_read[number]));
                    }
                    return;
                };
                let kind = event
                    .get("event_type")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                // Finished when the latest event ends a run: a resumed job writes more
                // events after an earlier `job_finished`.
                finished = matches!(kind, "job_finished" | "workflow_finished");
                if let Some(filter) = &show.event_type
                    && !kind.to_lowercase().contains(&filter.to_lowercase())
                {
                    return;
                }
                if show.json {
                    text.push_str(&line);
                    text.push('\n');
                } else {
                    text.push_str(&human_event(&event));
                }
                if text.len() >= 64 << 10 {
                    flush(&mut text);
                }
            },
            &|| false,
        );
        flush(&mut text);
        for (file, line) in places {
            if let Some(path) = files.path(file) {
                damaged.note(path, line);
            }
        }
        damaged.report();
        if !follow || finished {
            return damaged.exit_code(show.strict);
        }
        // A job killed outright never writes `job_finished`: once nothing new comes and no
        // process runs it, there is nothing more to follow.
        if !read_any && !prodigy_runtime::store::is_running(&home, job) {
            // Its checkpoint says how it ended: a job completed before a `dlq retry` wrote
            // more events has nothing to resume.
            if let Some(hint) = resume_hint(&home, job) {
                err(&format!(
                    "`{job}` is not running and its log ends without finishing; {hint}\n"
                ));
            }
            return damaged.exit_code(show.strict);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// How to continue the job or session ID that no process runs, from its checkpoint's
/// status; `None` when it completed (there is nothing to continue).
fn resume_hint(home: &Path, id: &str) -> Option<String> {
    use crate::run::finish::resume_command;
    use prodigy_runtime::jobstore::Status;
    if let Some((dir, _)) = Layout::find_job(home, id) {
        let checkpoint = JobFiles::new(dir).load_checkpoint();
        return match checkpoint
            .as_ref()
            .map(|c| (c.status, c.claude_budget_reached))
        {
            Ok((Status::Completed, _)) => None,
            Ok((Status::Stopped, Some(reached))) => Some(format!(
                "it stopped at its Claude budget ({}): resume it with `{}`",
                prodigy_runtime::claude::budget::usd(reached.limit),
                resume_command("resume-job", "--max-cost-usd AMOUNT", id)
            )),
            Ok((Status::Stopped, None)) => Some(format!(
                "its error policy stopped it: see why with `prodigy dlq show {id}`, and resume it with `{}` once the cause is fixed",
                resume_command("resume-job", "--force", id)
            )),
            _ => Some(format!(
                "continue it with `{}`",
                resume_command("resume-job", "", id)
            )),
        };
    }
    match Layout::find_session(home, id)
        .and_then(|(path, _)| prodigy_runtime::store::Checkpoint::load(&path).ok())
    {
        Some(c) if c.status == prodigy_runtime::store::SessionStatus::Completed => None,
        Some(_) => Some(format!(
            "continue it with `{}`",
            resume_command("resume", "", id)
        )),
        None => Some(format!(
            "its state is gone, so it cannot be continued (`prodigy resume-job {id}` or `prodigy resume {id}` would say more)"
        )),
    }
}

/// `TIMESTAMP  TYPE  key=value ...`, strings bare when they have no spaces.
fn human_event(event: &Value) -> String {
    let field = |k: &str| event.get(k).and_then(Value::as_str).unwrap_or("");
    let mut line = format!("{}  {}", field("timestamp"), field("event_type"));
    if let Value::Object(map) = event {
        for (key, value) in map {
            if matches!(key.as_str(), "timestamp" | "event_type" | "job_id") {
                continue;
            }
            let shown = match value {
                Value::String(s) if !s.is_empty() && !s.contains(char::is_whitespace) => s.clone(),
                other => other.to_string(),
            };
            let _ = write!(line, "  {key}={shown}");
        }
    }
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(stderr: &str) -> prodigy_runtime::dlq::FailureDetail {
        serde_json::from_value(serde_json::json!({
            "attempt_number": 1,
            "timestamp": "2026-01-01T00:00:00Z",
            "error_type": "ValidationFailed",
            "error_message": "failed",
            "agent_id": "agent-1",
            "step_failed": "claude: /do it",
            "duration_ms": 1,
            "command_output": {"exit_code": null, "stdout": "", "stderr": stderr},
        }))
        .unwrap()
    }

    /// An attempt whose program could not start has no exit code, but no signal ended it.
    #[test]
    fn dlq_show_says_a_program_could_not_start_rather_than_a_signal() {
        let mut text = String::new();
        show_attempt(
            &mut text,
            &attempt("could not start `claude`: Permission denied"),
        );
        assert!(
            text.contains("exit code: none (it could not start)"),
            "{text}"
        );
        let mut text = String::new();
        show_attempt(&mut text, &attempt("Terminated"));
        assert!(
            text.contains("exit code: none (killed by a signal)"),
            "{text}"
        );
    }
}
