//! The map phase's dispatcher: admits items up to `max_parallel` under the error policy and
//! the circuit breaker, collects each agent's outcome, and writes it before acting on it.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use futures::future::LocalBoxFuture;
use futures::stream::{FuturesUnordered, StreamExt as _};
use prodigy_compiler::ast::{self, MaxParallel, TimeoutAction};
use prodigy_compiler::plan::{Plan, StepId};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::breaker::{Breaker, BreakerAction, BreakerConfig, BreakerEvent, BreakerState};
use crate::dlq::{ErrorType, FailureDetail};
use crate::events::Event;
use crate::exec;
use crate::job::{ItemAction, ItemEvent, Job, JobPolicy, JobState, StopReason};
use crate::jobstore::{ItemRecord, ItemStatus};
use crate::mapreduce::{
    AgentRun, AgentSpec, MapJob, RunEnd, agent_id, breaker_name, describe, dlq_write_failure,
    failure_of, item_id, job_write_failure, repair_dlq, run_agent, run_item_handler, tally,
};
use crate::progress::{Progress, Tally};
use crate::vars::Vars;

impl MapJob<'_> {
    #[expect(
        clippy::too_many_lines,
        reason = "the scheduling loop reads best in one place"
    )]
    pub(crate) async fn map(&mut self, vars: &Vars) -> Result<MapEnd, String> {
        let runner = self.runner;
        let plan = self.plan;
        let Some(map) = &plan.map else {
            return Ok(MapEnd::Finished);
        };
        let items = self
            .files
            .load_items()
            .map_err(|e| self.state_lost().unwrap_or_else(|| e.to_string()))?;
        let previous = self.files.load_results().map_err(|e| e.to_string())?;
        for id in repair_dlq(&self.dlq, &previous, &items, &self.cp.items_remaining) {
            runner.record(&Event::DlqItemRepaired {
                item_id: id,
                repaired: true,
            });
        }
        let total = items.len();
        let mut records: Vec<Option<ItemRecord>> = vec![None; total];
        for record in previous {
            let index = record.index;
            if let Some(slot) = records.get_mut(index) {
                *slot = Some(record);
            }
        }
        let counts = tally(records.iter().flatten());
        let max_parallel = max_parallel(plan, vars, self.opts.max_parallel)?;
        self.cp.max_parallel = max_parallel;
        let policy = JobPolicy::from_ast(plan.error_policy.as_ref());
        let collection = plan
            .error_policy
            .as_ref()
            .and_then(|p| p.error_collection.as_ref())
            .map_or(ast::ErrorCollection::Aggregate, |c| c.value);
        let (jitter, max_delay) = (policy.jitter, policy.max_delay.unwrap_or(Duration::MAX));
        let mut job = Job::resumed(policy, counts, total as u64);
        let mut breaker = plan
            .error_policy
            .as_ref()
            .and_then(|p| p.circuit_breaker.as_ref())
            .map(|c| Breaker::new(BreakerConfig::from_ast(c)));
        let handlers: HashMap<&str, &[StepId]> = plan
            .handlers
            .iter()
            .map(|(name, steps)| (name.as_str(), steps.as_slice()))
            .collect();
        let timeout_action = map
            .timeout_config
            .as_ref()
            .map_or(TimeoutAction::Dlq, |c| c.action);
        let spec = AgentSpec {
            parallel: max_parallel,
            ..AgentSpec::new(
                plan,
                self.opts.cancel_running,
                total,
                self.opts.executor.clone(),
            )
        };
        let mut pending: VecDeque<(usize, u32)> = records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_none())
            .map(|(i, _)| (i, 1))
            .collect();
        self.runner.record(&Event::MapStarted {
            items: total,
            pending: pending.len(),
            max_parallel,
        });
        self.say(&format!(
            "map: {} of {} to run, {max_parallel} at a time",
            pending.len(),
            crate::progress::count(total, "item")
        ));
        let (halt_tx, halt_rx) = watch::channel(false);
        let mut running: FuturesUnordered<LocalBoxFuture<'_, Done>> = FuturesUnordered::new();
        let mut agents = 0usize;
        let mut dlq_count = self.dlq.index().map_or(0, |i| i.item_count as u64);
        let mut batch: Vec<String> = Vec::new();
        // The failed attempts `retry_config` ran again, for the DLQ's `failure_history`.
        let mut earlier: HashMap<usize, Vec<FailureDetail>> = HashMap::new();
        // `timeout_config.enable_monitoring: false` turns the progress display off.
        let monitored = map
            .timeout_config
            .as_ref()
            .is_none_or(|c| c.enable_monitoring)
            && !self.runner.opts.quiet;
        let mut progress = Progress::start(
            runner.sink.reporter(),
            total as u64,
            counts.finished(),
            monitored,
        );
        let mut last_save = Instant::now();
        let mut stop_announced = false;
        // Set when the job's state directory vanished: no new agents start.
        let mut lost: Option<String> = None;
        loop {
            // The counts as the last outcome left them, before agents start in its place, so a
            // plain progress line does not depend on how fast the next agent starts.
            show_progress(
                &mut progress,
                &job,
                agents,
                dlq_count,
                breaker.as_ref(),
                runner.live_claude_turns(),
            );
            // Start agents while slots, items and the policy allow.
            while job.admits()
                && lost.is_none()
                && !runner.cancelled()
                && self.write_failed.is_none()
                && agents < spec.executor.admit_limit(max_parallel)
            {
                let Some((index, attempt)) = pending.pop_front() else {
                    break;
                };
                let Some(item) = items.get(index) else {
                    continue;
                };
                let mut admission = Admission::Normal;
                if let Some(b) = breaker.as_mut() {
                    let before = b.state();
                    let action = b.on_event(BreakerEvent::Admit, runner.started.elapsed());
                    if action == BreakerAction::Probe {
                        admission = Admission::Probe;
                    }
                    if matches!(before, BreakerState::Open { .. })
                        && matches!(b.state(), BreakerState::HalfOpen { .. })
                    {
                        runner.record(&Event::CircuitHalfOpen {
                            item_id: item_id(index),
                        });
                    }
                    if action == BreakerAction::Reject {
                        runner.record(&Event::AgentRejected {
                            item_id: item_id(index),
                            reason: "CircuitOpen".to_owned(),
                        });
                        running.push(Box::pin(std::future::ready(Done::Agent {
                            index,
                            attempt,
                            run: AgentRun::rejected(),
                            admission: Admission::Rejected,
                        })));
                        continue;
                    }
                }
                agents += 1;
                let spec = &spec;
                let halt = halt_rx.clone();
                running.push(Box::pin(async move {
                    let run = run_agent(runner, spec, vars, item, index, attempt, halt).await;
                    Done::Agent {
                        index,
                        attempt,
                        run,
                        admission,
                    }
                }));
            }
            show_progress(
                &mut progress,
                &job,
                agents,
                dlq_count,
                breaker.as_ref(),
                runner.live_claude_turns(),
            );
            let Some(done) = running.next().await else {
                break;
            };
            let (index, attempt, run, admission) = match done {
                Done::RetryDue { index, attempt } => {
                    pending.push_front((index, attempt));
                    continue;
                }
                Done::Agent {
                    index,
                    attempt,
                    run,
                    admission,
                } => {
                    if admission != Admission::Rejected {
                        agents = agents.saturating_sub(1);
                    }
                    (index, attempt, run, admission)
                }
                Done::Handled {
                    index,
                    attempt,
                    run,
                    ok,
                } => {
                    agents = agents.saturating_sub(1);
                    runner.record(&Event::ItemHandlerFinished {
                        item_id: item_id(index),
                        success: ok,
                    });
                    let before = earlier.remove(&index).unwrap_or_default();
                    if let Some(record) =
                        self.outcome(index, attempt, &run, spec.timeout, ItemStatus::Failed, !ok)
                    {
                        if !ok {
                            dlq_count += self.dead_letter(&record, items.get(index), &run, before);
                        }
                        records[index] = Some(record);
                    }
                    self.stop_after_write_failure(&halt_tx);
                    continue;
                }
            };
            if run.end == RunEnd::Cancelled {
                // Interrupted or cancelled by `--cancel-running`: the item stays pending.
                runner.record(&Event::AgentCancelled {
                    agent_id: agent_id(index),
                    item_id: item_id(index),
                });
                continue;
            }
            // A probe's result decides a half-open breaker; a result of an agent that started
            // before the breaker opened counts only while it is closed.
            let counts_for_breaker = match admission {
                Admission::Rejected => false,
                Admission::Probe => true,
                Admission::Normal => breaker
                    .as_ref()
                    .is_some_and(|b| matches!(b.state(), BreakerState::Closed { .. })),
            };
            if let (Some(b), true) = (breaker.as_mut(), counts_for_breaker) {
                let event = if run.end == RunEnd::Succeeded {
                    BreakerEvent::Success
                } else {
                    BreakerEvent::Failure
                };
                match b.on_event(event, runner.started.elapsed()) {
                    BreakerAction::Opened => {
                        runner.record(&Event::CircuitOpen {
                            item_id: item_id(index),
                        });
                        self.say("circuit breaker opened: items fail fast as `CircuitOpen` until it half-opens");
                    }
                    BreakerAction::Closed => {
                        runner.record(&Event::CircuitClosed {
                            item_id: item_id(index),
                        });
                        self.say("circuit breaker closed");
                    }
                    BreakerAction::Allow
                    | BreakerAction::Probe
                    | BreakerAction::Reject
                    | BreakerAction::Nothing => {}
                }
            }
            if run.end == RunEnd::Succeeded {
                job.on_item(ItemEvent::Succeeded);
                runner.record(&Event::AgentCompleted {
                    agent_id: agent_id(index),
                    item_id: item_id(index),
                    attempt,
                    duration_secs: run.duration.as_secs_f64(),
                });
                if let Some(record) = self.outcome(
                    index,
                    attempt,
                    &run,
                    spec.timeout,
                    ItemStatus::Succeeded,
                    false,
                ) {
                    records[index] = Some(record);
                }
            } else {
                let message = run.message(spec.timeout);
                runner.record(&Event::AgentFailed {
                    agent_id: agent_id(index),
                    item_id: item_id(index),
                    attempt,
                    error_type: run.error_type().name().to_owned(),
                    error: message.clone(),
                    step: run.failure.as_ref().map(|f| f.step.clone()),
                });
                match collection {
                    ast::ErrorCollection::Immediate => {
                        self.say(&format!("item {} failed: {message}", item_id(index)));
                    }
                    ast::ErrorCollection::Batched(size) => {
                        batch.push(format!("{}: {message}", item_id(index)));
                        if batch.len() as u64 >= size.max(1) {
                            self.say(&format!(
                                "{} failed:\n  {}",
                                crate::progress::count(batch.len(), "item"),
                                batch.join("\n  ")
                            ));
                            batch.clear();
                        }
                    }
                    ast::ErrorCollection::Aggregate => {}
                }
                // `timeout_action` decides for every timeout, the agent's or a command's.
                let timed_out = run.error_type() == ErrorType::Timeout;
                let action = match (timed_out, timeout_action) {
                    (true, TimeoutAction::Skip) => {
                        job.skip();
                        ItemAction::Skip
                    }
                    (true, TimeoutAction::Fail) => {
                        job.fail_and_stop(StopReason::AgentTimeout);
                        ItemAction::Fail
                    }
                    (
                        _,
                        TimeoutAction::Dlq
                        | TimeoutAction::GracefulTerminate
                        | TimeoutAction::Skip
                        | TimeoutAction::Fail,
                    ) => job.on_item(ItemEvent::Failed { attempt }),
                };
                if matches!(action, ItemAction::Retry { .. }) {
                    let detail = failure_of(runner, &run, &runner.mask(&message), index);
                    earlier.entry(index).or_default().push(detail);
                }
                match action {
                    ItemAction::Retry { attempt, delay } => {
                        let delay = match jitter {
                            Some(factor) => runner.jittered(delay, factor, max_delay),
                            None => delay,
                        };
                        runner.record(&Event::ItemRetryScheduled {
                            item_id: item_id(index),
                            next_attempt: attempt,
                            delay_secs: delay.as_secs_f64(),
                        });
                        let mut halt = halt_rx.clone();
                        let mut signal = runner.cancel.clone();
                        running.push(Box::pin(async move {
                            tokio::select! {
                                () = tokio::time::sleep(delay) => {}
                                () = exec::cancelled(&mut halt) => {}
                                () = exec::cancelled(&mut signal) => {}
                            }
                            Done::RetryDue { index, attempt }
                        }));
                    }
                    ItemAction::Skip => {
                        runner.record(&Event::ItemSkipped {
                            item_id: item_id(index),
                        });
                        if let Some(record) = self.outcome(
                            index,
                            attempt,
                            &run,
                            spec.timeout,
                            ItemStatus::Skipped,
                            false,
                        ) {
                            records[index] = Some(record);
                        }
                    }
                    ItemAction::Handler(name) => {
                        let steps = handlers.get(name.as_str()).copied().unwrap_or(&[]);
                        runner.record(&Event::ItemHandlerStarted {
                            item_id: item_id(index),
                            handler: name.clone(),
                        });
                        // Every `${error.*}` field a step's handler has, plus the item's.
                        let error = json!({"message": message, "exit_code": run.failure.as_ref().and_then(|f| f.output.as_ref()).and_then(|o| o.exit_code).unwrap_or(-1), "type": run.error_type().name(), "step": run.failure.as_ref().map(|f| f.step.clone()), "item_id": item_id(index), "timestamp": crate::store::timestamp()});
                        let Some(item) = items.get(index) else {
                            continue;
                        };
                        // A handler takes an agent's place among the `max_parallel`.
                        agents += 1;
                        let spec = &spec;
                        running.push(Box::pin(async move {
                            let ok =
                                run_item_handler(runner, steps, vars, item, index, spec, error)
                                    .await;
                            Done::Handled {
                                index,
                                attempt,
                                run,
                                ok,
                            }
                        }));
                    }
                    ItemAction::DeadLetter | ItemAction::Fail | ItemAction::Done => {
                        let before = earlier.remove(&index).unwrap_or_default();
                        if let Some(record) = self.outcome(
                            index,
                            attempt,
                            &run,
                            spec.timeout,
                            ItemStatus::Failed,
                            true,
                        ) {
                            dlq_count += self.dead_letter(&record, items.get(index), &run, before);
                            records[index] = Some(record);
                        }
                    }
                }
            }
            if let JobState::Stopping(reason) = job.state()
                && !stop_announced
            {
                stop_announced = true;
                let why = describe(reason);
                runner.record(&Event::JobStopping {
                    reason: why.clone(),
                });
                self.say(&format!("stopping: {why}; no new agents start"));
                let _ = halt_tx.send(true);
            }
            if last_save.elapsed() >= Duration::from_secs(1) && self.write_failed.is_none() {
                self.update_counts(&records);
                // A failure is noted and stops the job just below.
                let _ = self.save(None);
                last_save = Instant::now();
                if lost.is_none() {
                    lost = self.state_lost();
                    if let Some(why) = &lost {
                        self.say(&format!("error: {why}; no new agents start"));
                        let _ = halt_tx.send(true);
                    }
                }
            }
            self.stop_after_write_failure(&halt_tx);
        }
        progress.finish();
        if let Some(why) = lost.or_else(|| self.state_lost()) {
            return Err(why);
        }
        if !batch.is_empty() {
            self.say(&format!(
                "{} failed:\n  {}",
                crate::progress::count(batch.len(), "item"),
                batch.join("\n  ")
            ));
        }
        self.update_counts(&records);
        self.runner.record(&Event::MapFinished {
            successful: self.cp.successful_items,
            failed: self.cp.failed_items,
            skipped: self.cp.skipped_items,
            pending: self.cp.items_remaining.len(),
        });
        if let Some(why) = self.write_failure() {
            return Err(why);
        }
        if runner.cancelled() {
            return Ok(MapEnd::Interrupted);
        }
        if let JobState::Stopping(reason) = job.state() {
            return Ok(MapEnd::Stopped(describe(reason)));
        }
        Ok(MapEnd::Finished)
    }

    /// After a failed state write (the job's own or its event log's): says so once, and
    /// stops the job as its error policy would; the agents running finish.
    pub(crate) fn stop_after_write_failure(&mut self, halt: &watch::Sender<bool>) {
        if self.write_announced {
            return;
        }
        let Some(why) = self.write_failure() else {
            return;
        };
        self.write_failed(why.clone());
        self.write_announced = true;
        self.say(&format!("error: {why}; no new agents start"));
        let _ = halt.send(true);
    }

    /// Counts the outcomes in RECORDS that the checkpoint may claim: those whose DLQ entry
    /// is written too.
    pub(crate) fn update_counts(&mut self, records: &[Option<ItemRecord>]) {
        let unwritten = &self.dlq_unwritten;
        let counts = tally(
            records
                .iter()
                .enumerate()
                .filter(|(index, _)| !unwritten.contains(index))
                .filter_map(|(_, record)| record.as_ref()),
        );
        self.cp.successful_items = counts.succeeded;
        self.cp.failed_items = counts.failed;
        self.cp.skipped_items = counts.skipped;
        self.cp.items_processed = counts.finished();
        self.cp.items_remaining = records
            .iter()
            .enumerate()
            .filter(|(index, record)| record.is_none() || unwritten.contains(index))
            .map(|(index, _)| item_id(index))
            .collect();
    }

    /// Records an item's outcome in `results.jsonl`; `None` when it could not be written:
    /// the item stays pending and the job stops.
    pub(crate) fn outcome(
        &mut self,
        index: usize,
        attempt: u32,
        run: &AgentRun,
        timeout: Option<Duration>,
        status: ItemStatus,
        dead_lettered: bool,
    ) -> Option<ItemRecord> {
        let failed = status != ItemStatus::Succeeded;
        let record = ItemRecord {
            item_id: item_id(index),
            index,
            status,
            attempts: attempt,
            output: run.output.as_ref().map(|o| self.runner.mask(o)),
            error: failed.then(|| self.runner.mask(&run.message(timeout))),
            error_type: failed.then(|| run.error_type().name().to_owned()),
            duration_secs: run.duration.as_secs_f64(),
            dead_lettered,
            claude: (run.claude.calls > 0).then_some(run.claude),
            slurm: run.slurm.clone(),
        };
        match self.files.append(&record) {
            Ok(()) => Some(record),
            Err(e) => {
                self.write_failed(job_write_failure(&e));
                None
            }
        }
    }

    /// Puts a failed item in the DLQ with its EARLIER failed attempts (those `retry_config`
    /// ran again) before the last; 1 when it is a new entry.
    pub(crate) fn dead_letter(
        &mut self,
        record: &ItemRecord,
        item: Option<&Value>,
        run: &AgentRun,
        earlier: Vec<FailureDetail>,
    ) -> u64 {
        let failure = failure_of(
            self.runner,
            run,
            record.error.as_deref().unwrap_or_default(),
            record.index,
        );
        let data = item.unwrap_or(&Value::Null);
        let attempts = earlier.len();
        let mut failures = earlier;
        failures.push(failure);
        match self
            .dlq
            .record_failures(&record.item_id, data, failures, run.artifacts.clone())
        {
            Ok(entry) => {
                self.runner.record(&Event::DlqItemAdded {
                    item_id: record.item_id.clone(),
                    error_signature: entry.error_signature.clone(),
                    failure_count: entry.failure_count,
                });
                u64::from(entry.failure_count as usize == attempts + 1)
            }
            Err(e) => {
                self.dlq_unwritten.insert(record.index);
                self.write_failed(dlq_write_failure(&e));
                0
            }
        }
    }
}

/// The agents at a time: OVERRIDE (`--max-parallel`), else the map's `max_parallel`,
/// a number or a `${VAR}` rendered with VARS.
pub(crate) fn max_parallel(plan: &Plan, vars: &Vars, over: Option<usize>) -> Result<usize, String> {
    if let Some(n) = over {
        return Ok(n.max(1));
    }
    let Some(map) = &plan.map else {
        return Ok(1);
    };
    match &map.max_parallel {
        MaxParallel::Fixed(n) => Ok(usize::try_from(n.value).unwrap_or(usize::MAX).max(1)),
        MaxParallel::Variable(t) => {
            let text = t
                .parsed
                .render(vars)
                .map_err(|e| format!("`max_parallel`: {e}"))?;
            match text.trim().parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!(
                    "`max_parallel` is `{}`, which is `{text}`: not a positive number",
                    t.value
                )),
            }
        }
    }
}

/// How the breaker let an agent start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Rejected: the agent never ran.
    Rejected,
    /// Started normally (the breaker closed, or absent).
    Normal,
    /// Started as a half-open probe.
    Probe,
}

/// What finished in the map loop.
pub(crate) enum Done {
    Agent {
        index: usize,
        attempt: u32,
        run: AgentRun,
        admission: Admission,
    },
    RetryDue {
        index: usize,
        attempt: u32,
    },
    Handled {
        index: usize,
        attempt: u32,
        run: AgentRun,
        ok: bool,
    },
}

/// How the map phase ended.
pub(crate) enum MapEnd {
    Finished,
    Stopped(String),
    Interrupted,
}

/// Shows the job's counts on the progress display.
pub(crate) fn show_progress(
    progress: &mut Progress,
    job: &Job,
    agents: usize,
    dlq: u64,
    breaker: Option<&Breaker>,
    claude_turns: u64,
) {
    let tally = Tally {
        done: job.counts().finished(),
        running: agents as u64,
        failed: job.counts().failed + job.counts().skipped,
        dlq,
        claude_turns,
    };
    progress.update(tally, breaker.map_or("off", |b| breaker_name(b.state())));
}
