//! The last lines of a run or a job, and its exit code.

use std::fmt::Write as _;

use prodigy_runtime::layout::Layout;
use prodigy_runtime::mapreduce::{JobOutcome, JobReport};
use prodigy_runtime::progress::count;
use prodigy_runtime::runner::{Report, RunOutcome};

use crate::{err, exit_code};

/// The last lines of a job: the error metrics when items failed, then how it ended and
/// what to do next: where the failures are (`dlq show`, the events), what is kept when the
/// merge back failed (UNMERGED), where to fix a failed step (FIX).
pub(super) fn finish_job(
    report: &JobReport,
    signal: u8,
    strict: bool,
    unmerged: Option<&str>,
    fix: &str,
    launched: bool,
) -> u8 {
    let mut text = String::new();
    write_error_metrics(&mut text, report);
    let id = &report.job_id;
    let events = report.events.display();
    let queued = queued_line(report.dlq_count);
    let again = resume_command("resume-job", "", id);
    let code = match &report.outcome {
        JobOutcome::Completed => completed_job(&mut text, report, unmerged, strict, launched),
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
                "{}, then resume with: {}",
                stop_advice(reason, fix),
                resume_command("resume-job", "--force", id)
            );
            exit_code::PROBLEMS
        }
        JobOutcome::BudgetReached {
            reached,
            not_started,
        } => {
            let _ = writeln!(
                text,
                "✗ job {id} stopped: {}; {} not started (events in {events})",
                prodigy_runtime::claude::budget::describe(reached),
                count(*not_started, "item")
            );
            if let Some(queued) = &queued {
                let _ = writeln!(text, "{queued}: see why with `prodigy dlq show {id}`");
            }
            let _ = writeln!(
                text,
                "raise the budget and resume with: {}",
                resume_command("resume-job", "--max-cost-usd AMOUNT", id)
            );
            exit_code::BUDGET
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
                    "✗ {phase} failed: {what}; fix it{fix}, then resume with: {again}"
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
                "✗ job {id} stopped in {phase}: {what}; {} pending; make room (or fix the permissions) under {}, then resume with: {again}",
                count(report.pending, "item"),
                Layout::home().display()
            );
            exit_code::PROBLEMS
        }
        JobOutcome::Interrupted => {
            // Stopped for the usage limit: the caller's last line says when to resume.
            if signal != exit_code::CLAUDE_LIMIT {
                let _ = writeln!(text, "interrupted; resume with: {again}");
            }
            interrupted(signal)
        }
    };
    if crate::quiet() {
        // `-q`: only the outcome line, and where failed items went.
        text = text
            .lines()
            .filter(|l| {
                l.starts_with(['✓', '✗', '⚠'])
                    || l.starts_with("interrupted")
                    // Where the failed items are, which the outcome line does not say.
                    || l.contains("in the dead letter queue: see why with")
            })
            .fold(String::new(), |mut kept, l| {
                kept.push_str(l);
                kept.push('\n');
                kept
            });
    }
    err(&text);
    code
}

/// What a job's last lines say of the items in its dead letter queue; none when it is empty.
/// `prodigy COMMAND [-y] [OPTIONS] ID`: the command that continues the run or job ID, as a
/// hint prints it. Without a terminal to ask on, a resume that completes merges nothing
/// unless it has `-y`; a hint printed there (a script, CI) carries `-y`, so that running it
/// as printed does what it says.
pub(crate) fn resume_command(command: &str, options: &str, id: &str) -> String {
    use std::io::IsTerminal as _;
    let yes = if std::io::stdin().is_terminal() {
        ""
    } else {
        " -y"
    };
    let options = if options.is_empty() {
        String::new()
    } else {
        format!(" {options}")
    };
    format!("prodigy {command}{yes}{options} {id}")
}

fn queued_line(dlq_count: u64) -> Option<String> {
    match dlq_count {
        0 => None,
        1 => Some("1 item is in the dead letter queue".to_owned()),
        n => Some(format!("{n} items are in the dead letter queue")),
    }
}

/// Adds the error metrics of REPORT to TEXT when items failed: the counts by error type
/// and the failure patterns.
fn write_error_metrics(text: &mut String, report: &JobReport) {
    let m = &report.metrics;
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
}

/// Whether REPORT's items all failed without any of their tasks having started (LAUNCHED
/// says whether one did): the job failed to launch.
fn none_launched(report: &JobReport, launched: bool) -> bool {
    let m = &report.metrics;
    !launched && m.successful == 0 && (m.failed > 0 || report.dlq_count > 0)
}

/// Adds how a completed job ended to TEXT: its counts, its queued items, and what is
/// kept when the merge back failed (UNMERGED); the exit code (`--strict` is STRICT; a job
/// none of whose items' tasks LAUNCHED failed).
fn completed_job(
    text: &mut String,
    report: &JobReport,
    unmerged: Option<&str>,
    strict: bool,
    launched: bool,
) -> u8 {
    let queued = queued_line(report.dlq_count);
    let queued = queued.as_deref();
    let m = &report.metrics;
    let id = &report.job_id;
    let events = report.events.display();
    // Some items failed: not a tick, though the exit code stays 0 unless `--strict`.
    let (mark, completed) = match (
        unmerged.is_some() || none_launched(report, launched),
        report.dlq_count > 0 || m.failed > 0,
    ) {
        (true, _) => ("✗", "completed"),
        (false, true) => ("⚠", "completed with failures"),
        (false, false) => ("✓", "completed"),
    };
    let empty = m.total_items == 0 && unmerged.is_none();
    if empty {
        // A misspelt `filter` field keeps nothing: not a tick, and an error under `--strict`.
        let _ = writeln!(
            text,
            "⚠ job {id} completed with no items: the input, after `json_path` and `filter`, had none to process (see them with `prodigy items`; events in {events})"
        );
    } else {
        let _ = writeln!(
            text,
            "{mark} job {id} {completed}: {} succeeded, {} failed, {} skipped of {} (events in {events})",
            m.successful,
            m.failed,
            m.skipped,
            count(m.total_items, "item"),
        );
    }
    if let Some(queued) = queued {
        let _ = writeln!(
            text,
            "{queued}: see why with `prodigy dlq show {id}`, retry with `{}`",
            resume_command("dlq retry", "", id)
        );
    }
    let none_launched = none_launched(report, launched);
    if none_launched {
        let _ = writeln!(
            text,
            "✗ no agent of job {id} started: every item's task failed to launch (see why with `prodigy dlq show {id}`)"
        );
    }
    if let Some(kept) = unmerged {
        let _ = writeln!(text, "✗ merging job {id} back failed; {kept}");
        exit_code::PROBLEMS
    } else if none_launched {
        exit_code::PROBLEMS
    } else if report.dlq_count > 0 && strict {
        exit_code::DLQ_STRICT
    } else if empty && strict {
        exit_code::PROBLEMS
    } else {
        exit_code::OK
    }
}

/// What to change before resuming a job the error policy stopped for REASON (the text the
/// runtime gave): fix the cause (FIX says where the job's files are), or loosen the setting
/// that stopped it.
pub(super) fn stop_advice(reason: &str, fix: &str) -> String {
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

/// The exit code of an interrupted run: the signal's (130 for SIGINT, 143 for SIGTERM,
/// [`exit_code::CLAUDE_LIMIT`] when the run stopped for the usage limit), or 130 when a step
/// saw the interrupt before the handler recorded which one.
pub(crate) fn interrupted(signal: u8) -> u8 {
    if signal == 0 {
        exit_code::SIGINT
    } else {
        signal
    }
}

/// The last line of a standard run: how it ended and what to do next. UNMERGED says what is
/// kept when its merge back failed; FIX, where to fix a failed step.
pub(super) fn finish(report: &Report, signal: u8, unmerged: Option<&str>, fix: &str) -> u8 {
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
                "✗ session {} stopped: {}; make room (or fix the permissions) under {}, then resume with: {}\n",
                report.session_id,
                report.state_error.as_deref().unwrap_or_default(),
                Layout::home().display(),
                resume_command("resume", "", &report.session_id)
            ));
            exit_code::PROBLEMS
        }
        RunOutcome::Failed => {
            err(&format!(
                "✗ step `{}` failed; fix it{fix}, then resume with: {}\n",
                report.failed_step.as_deref().unwrap_or("?"),
                resume_command("resume", "", &report.session_id)
            ));
            exit_code::PROBLEMS
        }
        RunOutcome::Interrupted => {
            // Stopped for the usage limit: the caller's last line says when to resume.
            if signal != exit_code::CLAUDE_LIMIT {
                err(&format!(
                    "interrupted; resume with: {}\n",
                    resume_command("resume", "", &report.session_id)
                ));
            }
            interrupted(signal)
        }
        RunOutcome::BudgetReached => {
            let reached = report.budget.map_or_else(
                || "Claude budget reached".to_owned(),
                |r| prodigy_runtime::claude::budget::describe(&r),
            );
            err(&format!(
                "✗ session {} stopped: {reached}; raise the budget and resume with: {} (events in {})\n",
                report.session_id,
                resume_command("resume", "--max-cost-usd AMOUNT", &report.session_id),
                report.events.display()
            ));
            exit_code::BUDGET
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

/// The last line of a run or job ID that stopped for the Claude usage limit STOP: when it
/// resets and the exact command to run after that (`prodigy AGAIN ID`).
pub(crate) fn limit_stopped(
    again: &str,
    id: &str,
    stop: &prodigy_runtime::claude::limit::LimitStop,
) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    err(&format!(
        "paused: Claude usage limit ({}) resets at {}; after that, resume with: {}\n",
        stop.limit_type,
        prodigy_runtime::claude::limit::clock_text(stop.resets_at, now),
        resume_command(again, "", id),
    ));
}
