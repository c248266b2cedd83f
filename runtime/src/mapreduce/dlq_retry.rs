//! `prodigy dlq retry`: the DLQ's items through the agent template again, and repairing a DLQ
//! that missed an item's failure.

use crate::message::{DlqRetried, Message};
use futures::stream::StreamExt as _;
use serde_json::Value;
use tokio::sync::watch;

use crate::backend::Ended;
use crate::dlq::Dlq;
use crate::jobstore::{ItemRecord, ItemStatus, JobFiles};
use crate::mapreduce::{
    AgentSpec, failure_detail, failure_of, item_index, max_parallel, merged_run, run_agent,
    sweep_job_agents,
};
use crate::runner::Runner;
use crate::vars::Vars;

/// Puts back the DLQ entries a kill lost between an outcome and its DLQ write: the
/// dead-lettered outcomes recorded since the last checkpoint (their items were still
/// REMAINING in it) that are missing from the queue. Entries removed on purpose before that
/// checkpoint (`dlq clear`, `dlq retry`) stay removed. Returns the ids put back.
pub(crate) fn repair_dlq(
    dlq: &Dlq,
    records: &[ItemRecord],
    items: &[Value],
    remaining: &[String],
) -> Vec<String> {
    let remaining: std::collections::HashSet<&str> = remaining.iter().map(String::as_str).collect();
    let mut repaired = Vec::new();
    for record in records
        .iter()
        .filter(|r| r.dead_lettered && remaining.contains(r.item_id.as_str()))
    {
        if matches!(dlq.get(&record.item_id), Ok(None)) {
            let item = items.get(record.index).cloned().unwrap_or(Value::Null);
            let failure = failure_detail(
                record.error_type.as_deref(),
                record.error.as_deref().unwrap_or_default(),
                record.index,
                record.duration_secs,
            );
            if dlq
                .record_failure(&record.item_id, &item, failure, None)
                .is_ok()
            {
                repaired.push(record.item_id.clone());
            }
        }
    }
    repaired
}

/// What `prodigy dlq retry` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetrySummary {
    /// Items run again.
    pub retried: u64,
    /// Items that succeeded and left the queue.
    pub succeeded: u64,
    /// Items that failed again and stay, with one more failure recorded.
    pub still_failing: u64,
    /// Items marked for manual review, not run.
    pub manual: u64,
    /// Whether a signal stopped the retry.
    pub interrupted: bool,
    /// Items that stay in the queue without having run again because their backend was
    /// lost (its Slurm controller stopped answering): the retry halted, saying why once.
    pub halted: u64,
    /// Whether the retried agents' work could not be brought into the session worktree.
    pub unmerged: bool,
}

/// Runs the DLQ items of `job_id` again through the agent template, `parallel` at a time
/// (default: the workflow's `max_parallel`), reading them one by one from the queue. Items that succeed leave the queue and their
/// success is added to the job's results; items that fail again stay, with the new failure
/// in their history. Items marked for manual review are left alone.
pub async fn retry_dead_letters(
    runner: &Runner,
    vars: &Vars,
    files: &mut JobFiles,
    job_id: &str,
    parallel: Option<usize>,
    total: usize,
    host: &crate::backend::AgentHost,
) -> Result<RetrySummary, super::RetryError> {
    let max_parallel = max_parallel(&runner.plan, vars, parallel)?;
    let dlq = Dlq::new(&runner.opts.layout, job_id);
    super::say_if_rebuilt(runner, &dlq);
    let ids = dlq.index()?.item_ids;
    let spec = AgentSpec {
        adopt: false,
        parallel: max_parallel,
        ..AgentSpec::new(&runner.plan, false, total, host.clone())
    };
    host.end_earlier(runner, job_id).await;
    let (halt_tx, halt_rx) = watch::channel(false);
    runner.record(&crate::events::Event::DlqRetryStarted { items: ids.len() });
    let mut summary = RetrySummary::default();
    // An item whose retried work a killed process merged is recorded, not run again.
    let intents: std::collections::HashMap<usize, crate::merge_journal::MergeIntent> =
        crate::merge_journal::load(files.dir())
            .into_iter()
            .map(|i| (i.index, i))
            .collect();
    let retry = Retry {
        job_id,
        runner,
        spec: &spec,
        vars,
        dlq: &dlq,
        intents: &intents,
        backend_lost: std::cell::Cell::new(false),
        halt: halt_tx,
    };
    let mut runs = futures::stream::iter(ids)
        .map(|id| retry.run(id, halt_rx.clone()))
        .buffer_unordered(max_parallel.max(1));
    while let Some((id, index, result)) = runs.next().await {
        let Some((entry, run)) = result else { continue };
        match run {
            Some(run) => retry.record(files, &mut summary, (id, index), &entry, &run)?,
            None if runner.cancelled() => summary.interrupted = true,
            // Not run: the backend was lost before its turn.
            None if entry.reprocess_eligible => summary.halted += 1,
            None => {
                summary.manual += 1;
                runner.say(Message::DlqRetry {
                    item: id.clone(),
                    how: DlqRetried::ManualReview,
                });
            }
        }
    }
    finish_retry(runner, vars, files, &dlq, &mut summary).await;
    Ok(summary)
}

/// What one DLQ item of a retry came to: its id, its index, and (unless it is not an item
/// any more or cannot be read) its entry with the agent's run, `None` when it did not run
/// (marked for manual review, or the retry was interrupted).
type Retried = (
    String,
    usize,
    Option<(crate::dlq::DeadLetteredItem, Option<super::AgentRun>)>,
);

/// What every item of one DLQ retry shares.
struct Retry<'a> {
    runner: &'a Runner,
    /// The job whose DLQ is retried.
    job_id: &'a str,
    spec: &'a AgentSpec,
    vars: &'a Vars,
    dlq: &'a Dlq,
    /// The merge journal's intents, by item index.
    intents: &'a std::collections::HashMap<usize, crate::merge_journal::MergeIntent>,
    /// Whether a backend has stopped the retry already (said once: every item after it
    /// stops the same way).
    backend_lost: std::cell::Cell<bool>,
    /// Told once the backend is lost: no further item starts, and with `--cancel-running`
    /// the running ones stop.
    halt: watch::Sender<bool>,
}

impl Retry<'_> {
    /// Runs the DLQ item ID again, unless it is marked for manual review, the retry is
    /// interrupted, or a killed process already merged its retried work.
    async fn run(&self, id: String, halt: watch::Receiver<bool>) -> Retried {
        let runner = self.runner;
        let Some(index) = item_index(&id) else {
            runner.say(Message::DlqRetry {
                item: id.clone(),
                how: DlqRetried::NotAnItem,
            });
            return (id, 0, None);
        };
        let entry = match self.dlq.get(&id) {
            Ok(Some(entry)) => entry,
            Ok(None) => return (id, index, None),
            Err(e) => {
                runner.say(Message::DlqUnreadable(e.to_string()));
                return (id, index, None);
            }
        };
        if !entry.reprocess_eligible || runner.cancelled() || *halt.borrow() {
            return (id, index, Some((entry, None)));
        }
        if let Some(intent) = self.intents.get(&index)
            && let Some(run) = merged_run(runner, intent).await
        {
            return (id, index, Some((entry, Some(run))));
        }
        let attempt = entry.failure_count.saturating_add(1);
        let run = run_agent(
            runner,
            self.spec,
            self.vars,
            &entry.item_data,
            index,
            attempt,
            halt.clone(),
            self.spec.cancel_running.then_some(halt),
        )
        .await;
        (id, index, Some((entry, Some(run))))
    }

    /// Records how the retried item ID (at INDEX) ran: a success goes into the job's
    /// results, then leaves the queue (so a crash in between loses nothing); a failure
    /// is one more in its DLQ entry.
    fn record(
        &self,
        files: &mut JobFiles,
        summary: &mut RetrySummary,
        (id, index): (String, usize),
        entry: &crate::dlq::DeadLetteredItem,
        run: &super::AgentRun,
    ) -> Result<(), super::RetryError> {
        let runner = self.runner;
        match run.end {
            // The backend was lost (for this item, or another whose loss stopped it): the
            // item stays in the queue as it was, and no further item starts.
            Ended::Cancelled
                if run.stop_job.is_some() || (*self.halt.borrow() && !runner.cancelled()) =>
            {
                summary.halted += 1;
                // Said once: every item after it stops the same way.
                if let Some(lost) = run.stop_job.as_ref().filter(|_| !self.backend_lost.get()) {
                    self.backend_lost.set(true);
                    self.halt.send_replace(true);
                    let next = format!("run `prodigy dlq retry -y {}` again", self.job_id);
                    runner.say(Message::JobFailed(lost.why(
                        "the retry stops, its items left in the queue as they were",
                        &next,
                    )));
                }
            }
            Ended::Cancelled => summary.interrupted = true,
            Ended::Succeeded => {
                summary.retried += 1;
                summary.succeeded += 1;
                let record = ItemRecord {
                    item_id: id.clone(),
                    index,
                    status: ItemStatus::Succeeded,
                    attempts: entry.failure_count.saturating_add(1),
                    output: run.output.as_ref().map(|o| runner.mask(o)),
                    error: None,
                    error_type: None,
                    duration_secs: run.duration.as_secs_f64(),
                    dead_lettered: false,
                    claude: (run.claude.calls > 0).then_some(run.claude),
                    task: run.task.clone(),
                    slurm: None,
                    merge_commit: run.merge_commit.clone(),
                    trail: run.trail.clone(),
                };
                files.append(&record)?;
                self.dlq.remove(&id)?;
                runner.record(&crate::events::Event::DlqItemRemoved {
                    item_id: id.clone(),
                });
                runner.say(Message::DlqRetry {
                    item: id,
                    how: DlqRetried::Succeeded,
                });
            }
            Ended::Failed | Ended::TimedOut => {
                summary.retried += 1;
                summary.still_failing += 1;
                let message = runner.mask(&run.message(self.spec.timeout));
                let failure = failure_of(runner, run, &message, index);
                let updated = self.dlq.record_failure(
                    &id,
                    &entry.item_data,
                    failure,
                    run.artifacts.clone(),
                )?;
                runner.record(&crate::events::Event::DlqItemUpdated {
                    item_id: id.clone(),
                    failure_count: updated.failure_count,
                });
                let last = message.lines().last().unwrap_or("").to_owned();
                runner.say(Message::DlqRetry {
                    item: id,
                    how: DlqRetried::FailedAgain {
                        failures: updated.failure_count,
                        last,
                    },
                });
            }
        }
        Ok(())
    }
}

/// The end of a DLQ retry: the DLQ's index is written, the retried agents' merged work
/// comes into the session worktree, and when every item is decided what earlier attempts
/// left goes (the DLQ's worktrees stay).
async fn finish_retry(
    runner: &Runner,
    vars: &Vars,
    files: &JobFiles,
    dlq: &Dlq,
    summary: &mut RetrySummary,
) {
    // A stale index does no harm (the next load rebuilds it from the items): say so, go on.
    if let Err(e) = dlq.flush() {
        runner.say(Message::DlqIndexNotWritten(e.to_string()));
    }
    if let Err(why) = runner.end_map_phase().await {
        runner.say(Message::JobFailed(why.to_string()));
        summary.unmerged = true;
    } else if files
        .load_checkpoint()
        .is_ok_and(|c| c.items_remaining.is_empty())
    {
        sweep_job_agents(runner, files.dir(), dlq).await;
    }
    runner.record(&crate::events::Event::DlqRetryFinished {
        retried: summary.retried,
        succeeded: summary.succeeded,
        still_failing: summary.still_failing,
    });
    // What its events fired and has not run yet runs now, before the process ends.
    runner.notify_pending(vars).await;
}
