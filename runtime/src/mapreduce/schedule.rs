//! The map phase's scheduler: admits items up to `max_parallel` under the error policy and
//! the circuit breaker, collects each agent's outcome, and writes it before acting on it.
//!
//! [`Scheduler`] owns the job machine, the breaker and the queue; the work in flight
//! (agents, `on_item_failure` handlers, retry timers) runs as futures that each end in one
//! message ([`Done`]), and the scheduler reacts to each message in turn: it records the
//! outcome, feeds the machines, and answers with the work to start next ([`Work`]).

use crate::mapreduce::{MapError, MaxParallelError};
use crate::message::{Bug, Message};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use futures::future::LocalBoxFuture;
use futures::stream::{FuturesUnordered, StreamExt as _};
use prodigy_plan::{ErrorCollection, MaxParallel, TimeoutAction};
use prodigy_plan::{Plan, StepId};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::breaker::{Breaker, BreakerAction, BreakerEvent, BreakerState};
use crate::claude::budget::{Admit, Budget, Reached, Spend};
use crate::dlq::{ErrorType, FailureDetail};
use crate::events::Event;
use crate::exec;
use crate::job::{ItemAction, ItemEvent, Job, JobPolicy, JobState, StopReason};
use crate::jobstore::{ItemRecord, ItemStatus};
use crate::mapreduce::{
    AgentRun, AgentSpec, MapJob, StateLost, StateWriteError, agent_id, breaker_name, describe,
    failure_of, item_id, repair_dlq, run_agent, run_item_handler, tally,
};
use crate::progress::{Progress, Tally};
use crate::runner::Runner;
use crate::vars::Vars;

impl MapJob<'_> {
    pub(crate) async fn map(&mut self, vars: &Vars) -> Result<MapEnd, MapError> {
        let runner = self.runner;
        let plan = self.plan;
        if plan.map.is_none() {
            return Ok(MapEnd::Finished);
        }
        let (items, records) = self.load_records().await?;
        let max_parallel = max_parallel(plan, vars, self.opts.max_parallel)?;
        self.cp.max_parallel = max_parallel;
        let spec = AgentSpec {
            parallel: max_parallel,
            ..AgentSpec::new(
                plan,
                self.opts.cancel_running,
                items.len(),
                self.opts.host.clone(),
            )
        };
        // What an earlier coordinator of the job left on the backend goes before items run.
        spec.host.end_earlier(runner, runner.session()).await;
        let (halt_tx, halt_rx) = watch::channel(false);
        let (cancel_tx, cancel_rx) = watch::channel(false);
        let context = Context {
            runner,
            spec: &spec,
            vars,
            items: &items,
            plan,
            halt: halt_rx,
            cancel: cancel_rx,
        };
        let scheduler = Scheduler::new(self, records, max_parallel, halt_tx, cancel_tx);
        let ended = scheduler.run(&context).await;
        self.map_ended(ended)
    }

    /// The job's items and the outcomes earlier processes recorded, by index (the DLQ
    /// repaired to match them, merges a killed process made recorded, worktrees it left
    /// back in the pool).
    async fn load_records(&mut self) -> Result<(Vec<Value>, Vec<Option<ItemRecord>>), MapError> {
        let items = self.files.load_items().map_err(|e| {
            self.state_lost()
                .map_or(MapError::Items(e), MapError::StateLost)
        })?;
        let previous = self.files.load_results().map_err(MapError::Results)?;
        for id in repair_dlq(&self.dlq, &previous, &items, &self.cp.items_remaining) {
            self.runner.record(&Event::DlqItemRepaired {
                item_id: id,
                repaired: true,
            });
        }
        let mut records: Vec<Option<ItemRecord>> = vec![None; items.len()];
        for record in previous {
            let index = record.index;
            if let Some(slot) = records.get_mut(index) {
                *slot = Some(record);
            }
        }
        self.recover_merged(&mut records).await;
        self.adopt_agents().await;
        Ok((items, records))
    }

    /// How the map phase ended, once the scheduler has nothing in flight: its counts
    /// and checkpoint written.
    fn map_ended(&mut self, ended: Ended) -> Result<MapEnd, MapError> {
        let Ended {
            records,
            batch,
            lost,
            machine: job,
            budget,
        } = ended;
        if let Some(why) = lost.or_else(|| self.state_lost()) {
            return Err(MapError::StateLost(why));
        }
        if !batch.is_empty() {
            self.say(Message::ItemsFailed(batch));
        }
        self.update_counts(&records);
        self.runner.record(&Event::MapFinished {
            successful: self.cp.successful_items,
            failed: self.cp.failed_items,
            skipped: self.cp.skipped_items,
            pending: self.cp.items_remaining.len(),
        });
        if let Some(why) = self.write_failure() {
            return Err(MapError::StateWrite(why));
        }
        if self.runner.cancelled() {
            return Ok(MapEnd::Interrupted);
        }
        if let JobState::Stopping(reason) = job.state() {
            return Ok(MapEnd::Stopped(describe(reason)));
        }
        if let Some(reached) = budget.and_then(|b| b.reached())
            && !self.cp.items_remaining.is_empty()
        {
            return Ok(MapEnd::Budget(reached));
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
        self.say(Message::MapStateLost(why.to_string()));
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
            task: run.task.clone(),
            slurm: None,
            merge_commit: run.merge_commit.clone(),
            trail: run.trail.clone(),
        };
        match self.files.append(&record) {
            Ok(()) => Some(record),
            Err(e) => {
                self.write_failed(StateWriteError::Job(e).into());
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
                self.write_failed(StateWriteError::Dlq(e).into());
                0
            }
        }
    }
}

/// The agents at a time: OVERRIDE (`--max-parallel`), else the map's `max_parallel`,
/// a number or a `${VAR}` rendered with VARS.
pub(crate) fn max_parallel(
    plan: &Plan,
    vars: &Vars,
    over: Option<usize>,
) -> Result<usize, MaxParallelError> {
    if let Some(n) = over {
        return Ok(n.max(1));
    }
    let Some(map) = &plan.map else {
        return Ok(1);
    };
    match &map.max_parallel {
        MaxParallel::Fixed(n) => Ok(usize::try_from(n.value).unwrap_or(usize::MAX).max(1)),
        MaxParallel::Variable(t) => {
            let text = t.parsed.render(vars).map_err(MaxParallelError::Render)?;
            match text.trim().parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(MaxParallelError::NotPositive {
                    written: t.value.clone(),
                    text,
                }),
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
    /// The Claude budget was reached with items left.
    Budget(Reached),
    Interrupted,
}

/// What the progress display says about the job's Claude spending.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spending {
    /// US dollars spent so far.
    pub(crate) spent: f64,
    /// What an item cost on average, once one finished.
    pub(crate) average: Option<f64>,
    /// Items in all.
    pub(crate) total: u64,
}

/// Shows the job's counts on the progress display; QUEUE: the verified merge queue's.
#[expect(
    clippy::too_many_arguments,
    reason = "the scheduler's counts, each borrowed where it lives"
)]
pub(crate) fn show_progress(
    progress: &mut Progress,
    job: &Job,
    agents: usize,
    dlq: u64,
    breaker: Option<&Breaker>,
    claude_turns: u64,
    spending: Spending,
    queue: Option<crate::events::QueueCounts>,
) {
    let done = job.counts().finished();
    let tally = Tally {
        done,
        running: agents as u64,
        failed: job.counts().failed + job.counts().skipped,
        dlq,
        claude_turns,
        claude_micros: crate::progress::micros(spending.spent),
        forecast_micros: spending.average.map(|a| {
            crate::progress::micros(
                a * crate::claude::budget::amount(spending.total.saturating_sub(done)),
            )
        }),
        queue,
    };
    progress.update(tally, breaker.map_or("off", |b| breaker_name(b.state())));
}

/// What the work in flight borrows, the same for the whole map phase.
pub(crate) struct Context<'c> {
    runner: &'c Runner,
    spec: &'c AgentSpec,
    vars: &'c Vars,
    items: &'c [Value],
    plan: &'c Plan,
    /// Set when the job stops (the error policy, a failed state write, the Claude budget).
    halt: watch::Receiver<bool>,
    /// Set when the running agents are to be cancelled (`--cancel-running`, `on_budget: stop`).
    cancel: watch::Receiver<bool>,
}

/// Work the scheduler starts; each ends in one [`Done`] message.
pub(crate) enum Work<'c> {
    /// An agent for ITEM.
    Agent {
        index: usize,
        attempt: u32,
        item: &'c Value,
        admission: Admission,
    },
    /// An agent the breaker rejected: it fails at once as `CircuitOpen`.
    Rejected { index: usize, attempt: u32 },
    /// The backoff before an item's next attempt; it ends early when the job stops or a
    /// signal comes.
    Timer {
        index: usize,
        attempt: u32,
        delay: Duration,
    },
    /// The `custom:` handler of a failed item.
    Handler {
        index: usize,
        attempt: u32,
        item: &'c Value,
        run: Box<AgentRun>,
        steps: &'c [StepId],
        error: Value,
    },
}

/// The future of WORK, which ends in its message.
fn start<'c>(work: Work<'c>, context: &'c Context<'c>) -> LocalBoxFuture<'c, Done> {
    let Context {
        runner, spec, vars, ..
    } = *context;
    match work {
        Work::Agent {
            index,
            attempt,
            item,
            admission,
        } => {
            let halt = context.halt.clone();
            let cancel = Some(context.cancel.clone());
            Box::pin(async move {
                let run = run_agent(runner, spec, vars, item, index, attempt, halt, cancel).await;
                Done::Agent {
                    index,
                    attempt,
                    run,
                    admission,
                }
            })
        }
        Work::Rejected { index, attempt } => Box::pin(std::future::ready(Done::Agent {
            index,
            attempt,
            run: AgentRun::rejected(),
            admission: Admission::Rejected,
        })),
        Work::Timer {
            index,
            attempt,
            delay,
        } => {
            let mut halt = context.halt.clone();
            let mut signal = runner.cancel.clone();
            Box::pin(async move {
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = exec::cancelled(&mut halt) => {}
                    () = exec::cancelled(&mut signal) => {}
                }
                Done::RetryDue { index, attempt }
            })
        }
        Work::Handler {
            index,
            attempt,
            item,
            run,
            steps,
            error,
        } => Box::pin(async move {
            let ok = run_item_handler(runner, steps, vars, item, index, spec, error).await;
            Done::Handled {
                index,
                attempt,
                run: *run,
                ok,
            }
        }),
    }
}

/// The map phase's scheduler: it owns the job machine, the breaker, the queue of items and
/// the records of their outcomes, and reacts to each [`Done`] message.
pub(crate) struct Scheduler<'j, 'a> {
    job: &'j mut MapJob<'a>,
    machine: Job,
    breaker: Option<Breaker>,
    /// Items (and their next attempt) waiting for a slot.
    pending: VecDeque<(usize, u32)>,
    records: Vec<Option<ItemRecord>>,
    /// Agents and handlers running: each takes one of the `max_parallel` slots.
    agents: usize,
    dlq_count: u64,
    /// Failures not reported yet under `error_collection: batched`.
    batch: Vec<(String, String)>,
    /// The failed attempts `retry_config` ran again, for the DLQ's `failure_history`.
    earlier: HashMap<usize, Vec<FailureDetail>>,
    progress: Progress,
    last_save: Instant,
    stop_announced: bool,
    /// Set when the job's state directory vanished: no new agents start.
    lost: Option<StateLost>,
    halt: watch::Sender<bool>,
    /// Cancels the running agents.
    cancel: watch::Sender<bool>,
    /// `--cancel-running`: a stop cancels the running agents.
    cancel_running: bool,
    /// The Claude budget, if any.
    budget: Option<Budget>,
    /// The Claude cost of the agent runs that ended, and how many there were.
    item_costs: (f64, u64),
    collection: ErrorCollection,
    timeout_action: TimeoutAction,
    jitter: Option<f64>,
    max_delay: Duration,
    max_parallel: usize,
}

/// What the scheduler leaves when nothing is in flight any more.
struct Ended {
    records: Vec<Option<ItemRecord>>,
    batch: Vec<(String, String)>,
    lost: Option<StateLost>,
    machine: Job,
    budget: Option<Budget>,
}

impl<'j, 'a> Scheduler<'j, 'a> {
    /// The scheduler of JOB's map phase over RECORDS (`None`: the item has no outcome
    /// yet), under the job's error policy, breaker and budget; says what it will run.
    fn new(
        job: &'j mut MapJob<'a>,
        records: Vec<Option<ItemRecord>>,
        max_parallel: usize,
        halt: watch::Sender<bool>,
        cancel: watch::Sender<bool>,
    ) -> Self {
        let runner = job.runner;
        let plan = job.plan;
        let total = records.len();
        let counts = tally(records.iter().flatten());
        let policy: JobPolicy = plan.job_policy.clone();
        let collection = policy.error_collection;
        let (jitter, max_delay) = (policy.jitter, policy.max_delay.unwrap_or(Duration::MAX));
        let breaker = policy.circuit_breaker.map(Breaker::new);
        let machine = Job::resumed(policy, counts, total as u64);
        let timeout_config = plan.map.as_ref().and_then(|m| m.timeout_config.as_ref());
        let timeout_action = timeout_config.map_or(TimeoutAction::Dlq, |c| c.action);
        let pending: VecDeque<(usize, u32)> = records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_none())
            .map(|(i, _)| (i, 1))
            .collect();
        runner.record(&Event::MapStarted {
            items: total,
            pending: pending.len(),
            max_parallel,
        });
        job.say(Message::MapStarted {
            pending: pending.len(),
            total,
            max_parallel,
        });
        // What an item has cost on average: its last attempt's Claude calls, for the items
        // earlier processes finished; every attempt's from here on.
        let item_costs = records.iter().flatten().fold((0.0, 0), |(sum, n), r| {
            (sum + r.claude.map_or(0.0, |c| c.cost_usd), n + 1)
        });
        let dlq_count = job.dlq.index().map_or(0, |i| i.item_count as u64);
        // `timeout_config.enable_monitoring: false` turns the progress display off.
        let monitored = timeout_config.is_none_or(|c| c.enable_monitoring);
        let progress = Progress::start(
            runner.sink.reporter(),
            total as u64,
            counts.finished(),
            monitored,
        );
        let cancel_running = job.opts.cancel_running;
        Scheduler {
            job,
            machine,
            breaker,
            pending,
            records,
            agents: 0,
            dlq_count,
            batch: Vec::new(),
            earlier: HashMap::new(),
            progress,
            last_save: Instant::now(),
            stop_announced: false,
            lost: None,
            halt,
            cancel,
            cancel_running,
            budget: Budget::of(plan, runner.opts.max_cost_usd),
            item_costs,
            collection,
            timeout_action,
            jitter,
            max_delay,
            max_parallel,
        }
    }
}

impl Scheduler<'_, '_> {
    /// Starts work and reacts to what ends until nothing runs and nothing may start.
    async fn run<'c>(mut self, context: &'c Context<'c>) -> Ended {
        let mut running: FuturesUnordered<LocalBoxFuture<'c, Done>> = FuturesUnordered::new();
        loop {
            // The counts once the agents that take the place of the last outcome's have
            // started (nothing is awaited in between): shown before, a plain progress line,
            // printed at the first count after an outcome, said one fewer ran than did.
            for work in self.admit(context) {
                running.push(start(work, context));
            }
            self.cancel_if_stopping();
            self.show(context.runner);
            let Some(done) = running.next().await else {
                break;
            };
            if let Some(work) = self.on_message(done, context) {
                running.push(start(work, context));
            }
            // A dead-lettered item or the budget tells its notifications now, each bounded
            // by its `timeout` (docs/language.md §2, "Notifications").
            context.runner.notify_pending(context.vars).await;
            self.cancel_if_stopping();
        }
        self.progress.finish();
        Ended {
            records: self.records,
            batch: self.batch,
            lost: self.lost,
            machine: self.machine,
            budget: self.budget,
        }
    }

    fn show(&mut self, runner: &Runner) {
        let spending = Spending {
            spent: self.job.claude_spent(),
            average: self.average_item_cost(),
            total: self.records.len() as u64,
        };
        show_progress(
            &mut self.progress,
            &self.machine,
            self.agents,
            self.dlq_count,
            self.breaker.as_ref(),
            runner.live_claude_turns(),
            spending,
            runner
                .plan
                .merge
                .as_ref()
                .is_some_and(prodigy_plan::PlanMerge::queued)
                .then(|| runner.verify_queue.counts()),
        );
    }

    /// What an agent run has cost on average, once one ended.
    fn average_item_cost(&self) -> Option<f64> {
        let (sum, n) = self.item_costs;
        (n > 0).then(|| sum / crate::claude::budget::amount(n))
    }

    /// The agents to start while slots, items and the policy allow.
    fn admit<'c>(&mut self, context: &Context<'c>) -> Vec<Work<'c>> {
        let runner = context.runner;
        let mut started = Vec::new();
        while self.machine.admits()
            && self.lost.is_none()
            && !runner.cancelled()
            && self.job.write_failed.is_none()
            && self.agents < context.spec.host.admit_limit(self.max_parallel)
        {
            let Some((index, attempt)) = self.pending.pop_front() else {
                break;
            };
            let Some(item) = context.items.get(index) else {
                continue;
            };
            if !self.within_budget(runner) {
                self.pending.push_front((index, attempt));
                break;
            }
            let mut admission = Admission::Normal;
            if let Some(b) = self.breaker.as_mut() {
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
                    started.push(Work::Rejected { index, attempt });
                    continue;
                }
            }
            self.agents += 1;
            started.push(Work::Agent {
                index,
                attempt,
                item,
                admission,
            });
        }
        started
    }

    /// Whether the Claude budget lets one more agent start; when it has just been reached,
    /// records and says so, and stops the job from starting agents.
    fn within_budget(&mut self, runner: &Runner) -> bool {
        let spend = Spend {
            spent: self.job.claude_spent(),
            running: self.agents as u64,
            running_cost: runner.live_claude_cost(),
            average: self.average_item_cost(),
        };
        let Some(budget) = self.budget.as_mut() else {
            return true;
        };
        match budget.admit(spend) {
            Admit::Start => true,
            Admit::Refused => false,
            Admit::Reached(reached) => {
                let not_started = self.pending.len() as u64 + 1;
                runner.record(&Event::ClaudeBudgetReached {
                    spent: reached.spent,
                    limit: reached.limit,
                    not_started,
                });
                self.job.say(Message::ClaudeBudgetReached {
                    reached,
                    not_started,
                    unit: "item",
                    stops_running: budget.stops_running(),
                });
                let _ = self.halt.send(true);
                false
            }
        }
    }

    /// Cancels the running agents once the job stops under `--cancel-running`, or the
    /// Claude budget is reached under `on_budget: stop`.
    fn cancel_if_stopping(&self) {
        let halted = *self.halt.borrow() && self.cancel_running;
        let over_budget = self
            .budget
            .is_some_and(|b| b.stops_running() && b.reached().is_some());
        if (halted || over_budget) && !*self.cancel.borrow() {
            let _ = self.cancel.send(true);
        }
    }

    /// Reacts to what ended: records it, feeds the machines, and says what starts next.
    fn on_message<'c>(&mut self, done: Done, context: &Context<'c>) -> Option<Work<'c>> {
        let runner = context.runner;
        let (index, attempt, run, admission) = match done {
            Done::RetryDue { index, attempt } => {
                self.pending.push_front((index, attempt));
                return None;
            }
            Done::Agent {
                index,
                attempt,
                run,
                admission,
            } => {
                if admission != Admission::Rejected {
                    self.agents = self.agents.saturating_sub(1);
                    self.item_costs.0 += run.claude.cost_usd;
                    self.item_costs.1 += 1;
                    if run.task.is_some() {
                        self.job.spent_elsewhere += run.claude.cost_usd;
                    }
                }
                (index, attempt, run, admission)
            }
            Done::Handled {
                index,
                attempt,
                run,
                ok,
            } => {
                self.on_handled(index, attempt, &run, ok, context);
                return None;
            }
        };
        if run.end == crate::backend::Ended::Cancelled {
            // Interrupted, cancelled by `--cancel-running`, or its backend cannot go on: the
            // item stays pending.
            runner.record(&Event::AgentCancelled {
                agent_id: agent_id(index),
                item_id: item_id(index),
            });
            if let Some(lost) = run.stop_job {
                let next = format!("run `prodigy resume-job -y {}`", context.runner.session());
                self.backend_lost(
                    lost.why("the job stops with its unfinished items pending", &next),
                );
            }
            return None;
        }
        self.feed_breaker(index, &run, admission, runner);
        let next = if run.end == crate::backend::Ended::Succeeded {
            self.on_succeeded(index, attempt, &run, context);
            None
        } else {
            self.on_failed(index, attempt, run, context)
        };
        self.after_outcome();
        next
    }

    /// The backend cannot go on (WHY): no new agents start, those running end as their
    /// backend lets them, and the job fails with WHY, its unfinished items pending.
    fn backend_lost(&mut self, why: String) {
        if self.lost.is_none() {
            self.lost = Some(StateLost::Backend(why));
            let _ = self.halt.send(true);
        }
    }

    /// The `custom:` handler of a failed item ended: the item's outcome is written, and it
    /// goes to the DLQ unless the handler succeeded.
    fn on_handled(
        &mut self,
        index: usize,
        attempt: u32,
        run: &AgentRun,
        ok: bool,
        context: &Context<'_>,
    ) {
        self.agents = self.agents.saturating_sub(1);
        context.runner.record(&Event::ItemHandlerFinished {
            item_id: item_id(index),
            success: ok,
        });
        let before = self.earlier.remove(&index).unwrap_or_default();
        let timeout = context.spec.timeout;
        if let Some(record) =
            self.job
                .outcome(index, attempt, run, timeout, ItemStatus::Failed, !ok)
        {
            if !ok {
                self.dlq_count +=
                    self.job
                        .dead_letter(&record, context.items.get(index), run, before);
            }
            self.records[index] = Some(record);
        }
        self.job.stop_after_write_failure(&self.halt);
    }

    /// A probe's result decides a half-open breaker; a result of an agent that started
    /// before the breaker opened counts only while it is closed.
    fn feed_breaker(
        &mut self,
        index: usize,
        run: &AgentRun,
        admission: Admission,
        runner: &Runner,
    ) {
        let counts_for_breaker = match admission {
            Admission::Rejected => false,
            Admission::Probe => true,
            Admission::Normal => self
                .breaker
                .as_ref()
                .is_some_and(|b| matches!(b.state(), BreakerState::Closed { .. })),
        };
        let (Some(b), true) = (self.breaker.as_mut(), counts_for_breaker) else {
            return;
        };
        let event = if run.end == crate::backend::Ended::Succeeded {
            BreakerEvent::Success
        } else {
            BreakerEvent::Failure
        };
        match b.on_event(event, runner.started.elapsed()) {
            BreakerAction::Opened => {
                runner.record(&Event::CircuitOpen {
                    item_id: item_id(index),
                });
                self.job.say(Message::CircuitOpened {
                    item: item_id(index),
                });
            }
            BreakerAction::Closed => {
                runner.record(&Event::CircuitClosed {
                    item_id: item_id(index),
                });
                self.job.say(Message::CircuitClosed {
                    item: item_id(index),
                });
            }
            BreakerAction::Allow
            | BreakerAction::Probe
            | BreakerAction::Reject
            | BreakerAction::Nothing => {}
        }
    }

    fn on_succeeded(&mut self, index: usize, attempt: u32, run: &AgentRun, context: &Context<'_>) {
        self.machine.on_item(ItemEvent::Succeeded);
        context.runner.record(&Event::AgentCompleted {
            agent_id: agent_id(index),
            item_id: item_id(index),
            attempt,
            duration_secs: run.duration.as_secs_f64(),
        });
        if let Some(record) = self.job.outcome(
            index,
            attempt,
            run,
            context.spec.timeout,
            ItemStatus::Succeeded,
            false,
        ) {
            self.records[index] = Some(record);
        }
    }

    /// An agent failed: reported as `error_collection` says, then retried, skipped, handed
    /// to its handler or dead-lettered as the error policy and `timeout_action` say.
    fn on_failed<'c>(
        &mut self,
        index: usize,
        attempt: u32,
        run: AgentRun,
        context: &Context<'c>,
    ) -> Option<Work<'c>> {
        let runner = context.runner;
        let timeout = context.spec.timeout;
        let message = run.message(timeout);
        runner.record(&Event::AgentFailed {
            agent_id: agent_id(index),
            item_id: item_id(index),
            attempt,
            error_type: run.error_type().name().to_owned(),
            error: message.clone(),
            step: run.failure.as_ref().map(|f| f.step.clone()),
        });
        self.report_failure(index, &message);
        match self.failure_action(index, attempt, &run, context.plan) {
            ItemAction::Retry { attempt, delay } => {
                let detail = failure_of(runner, &run, &runner.mask(&message), index);
                self.earlier.entry(index).or_default().push(detail);
                let delay = match self.jitter {
                    Some(factor) => runner.jittered(delay, factor, self.max_delay),
                    None => delay,
                };
                runner.record(&Event::ItemRetryScheduled {
                    item_id: item_id(index),
                    next_attempt: attempt,
                    delay_secs: delay.as_secs_f64(),
                });
                Some(Work::Timer {
                    index,
                    attempt,
                    delay,
                })
            }
            ItemAction::Skip => {
                runner.record(&Event::ItemSkipped {
                    item_id: item_id(index),
                });
                if let Some(record) =
                    self.job
                        .outcome(index, attempt, &run, timeout, ItemStatus::Skipped, false)
                {
                    self.records[index] = Some(record);
                }
                None
            }
            ItemAction::Handler(handler) => {
                self.handle(index, attempt, run, handler, &message, context)
            }
            ItemAction::DeadLetter | ItemAction::Fail | ItemAction::Done => {
                let before = self.earlier.remove(&index).unwrap_or_default();
                if let Some(record) =
                    self.job
                        .outcome(index, attempt, &run, timeout, ItemStatus::Failed, true)
                {
                    self.dlq_count +=
                        self.job
                            .dead_letter(&record, context.items.get(index), &run, before);
                    self.records[index] = Some(record);
                }
                None
            }
        }
    }

    /// What becomes of item INDEX after RUN failed: `timeout_action` decides for every
    /// timeout (the agent's or a command's), the error policy for the rest.
    fn failure_action(
        &mut self,
        index: usize,
        attempt: u32,
        run: &AgentRun,
        plan: &Plan,
    ) -> ItemAction {
        let timed_out = run.error_type() == ErrorType::Timeout;
        let action = match (timed_out, self.timeout_action) {
            (true, TimeoutAction::Skip) => {
                self.machine.skip();
                ItemAction::Skip
            }
            (true, TimeoutAction::Fail) => {
                self.machine.fail_and_stop(StopReason::AgentTimeout);
                ItemAction::Fail
            }
            (
                _,
                TimeoutAction::Dlq
                | TimeoutAction::GracefulTerminate
                | TimeoutAction::Skip
                | TimeoutAction::Fail,
            ) => self.machine.on_item(ItemEvent::Failed { attempt }),
        };
        // The planner takes a handler's id from `Plan::handlers`; were it missing, the item is
        // dead-lettered rather than handled by nothing.
        match action {
            ItemAction::Handler(handler) if plan.handler(handler).is_none() => {
                self.job.say(Message::Bug(Bug::HandlerNotInPlan {
                    handler: handler.0,
                    item: item_id(index),
                }));
                ItemAction::DeadLetter
            }
            other => other,
        }
    }

    /// Starts HANDLER (`on_item_failure: custom:`) for item INDEX, whose RUN failed with
    /// MESSAGE: with every `${error.*}` field a step's handler has, plus the item's.
    fn handle<'c>(
        &mut self,
        index: usize,
        attempt: u32,
        run: AgentRun,
        handler: crate::job::HandlerId,
        message: &str,
        context: &Context<'c>,
    ) -> Option<Work<'c>> {
        let (name, steps) = context.plan.handler(handler).unwrap_or_default();
        context.runner.record(&Event::ItemHandlerStarted {
            item_id: item_id(index),
            handler: name.to_owned(),
        });
        let failure = run.failure.as_ref();
        let error = json!({
            "message": message,
            "exit_code": failure.and_then(|f| f.output.as_ref()).and_then(|o| o.exit_code).unwrap_or(-1),
            "type": run.error_type().name(),
            "step": failure.map(|f| f.step.clone()),
            "item_id": item_id(index),
            "timestamp": crate::store::timestamp(),
        });
        let item = context.items.get(index)?;
        // A handler takes an agent's place among the `max_parallel`.
        self.agents += 1;
        Some(Work::Handler {
            index,
            attempt,
            item,
            run: Box::new(run),
            steps,
            error,
        })
    }

    /// Says a failure as `error_collection` asks: at once, by batches, or (`aggregate`)
    /// only in the job's summary.
    fn report_failure(&mut self, index: usize, message: &str) {
        match self.collection {
            ErrorCollection::Immediate => {
                self.job.say(Message::ItemFailed {
                    item: item_id(index),
                    why: message.to_owned(),
                });
            }
            ErrorCollection::Batched(size) => {
                self.batch.push((item_id(index), message.to_owned()));
                if self.batch.len() as u64 >= size.max(1) {
                    self.job
                        .say(Message::ItemsFailed(std::mem::take(&mut self.batch)));
                }
            }
            ErrorCollection::Aggregate => {}
        }
    }

    /// After an agent's outcome: a stop the error policy decided is announced (and halts
    /// the agents that watch it), the checkpoint is written at most once a second, and a
    /// failed state write stops the job.
    fn after_outcome(&mut self) {
        if let JobState::Stopping(reason) = self.machine.state()
            && !self.stop_announced
        {
            self.stop_announced = true;
            let why = describe(reason);
            self.job.runner.record(&Event::JobStopping { reason: why });
            self.job.say(Message::JobStopping(reason.clone()));
            let _ = self.halt.send(true);
        }
        if self.last_save.elapsed() >= Duration::from_secs(1) && self.job.write_failed.is_none() {
            self.job.update_counts(&self.records);
            // A failure is noted and stops the job just below.
            let _ = self.job.save(None);
            self.last_save = Instant::now();
            if self.lost.is_none() {
                self.lost = self.job.state_lost();
                if let Some(why) = &self.lost {
                    self.job.say(Message::MapStateLost(why.to_string()));
                    let _ = self.halt.send(true);
                }
            }
        }
        self.job.stop_after_write_failure(&self.halt);
    }
}
