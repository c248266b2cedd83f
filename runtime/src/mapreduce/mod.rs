//! The MapReduce driver (docs/language.md §8): `setup` and its `capture_outputs`, the input pipeline,
//! one agent per item through the same step machines as a standard run, under the error
//! policy ([`crate::job`]) and the circuit breaker ([`crate::breaker`]), the DLQ, `reduce`
//! with `${map.*}`, and the job's files ([`crate::jobstore`]) for `resume-job`.
//!
//! Order of effects for an item: its outcome is appended to `results.jsonl` first, then the
//! DLQ is written. A kill between the two is repaired when the job resumes.

use crate::message::Message;
use std::path::PathBuf;

use prodigy_plan::Plan;
use serde_json::{Value, json};

use crate::breaker::BreakerState;
use crate::dlq::Dlq;
use crate::job::StopReason;
use crate::jobstore::{JobCheckpoint, JobFiles, JobPhase, Status};
use crate::runner::Runner;
use crate::vars::Vars;

mod agent;
mod dlq_retry;
mod error;
pub(crate) mod integrity;
mod merge;
pub mod metrics;
mod reduce;
mod schedule;
mod setup;
pub(crate) mod verify;
pub(crate) use error::{MapError, StateLost, StateWriteError, WriteFailure};
pub use error::{MaxParallelError, RetryError};
pub use setup::{ItemsError, setup_and_items};

pub(crate) use agent::*;
pub use dlq_retry::*;
pub(crate) use merge::*;
pub use metrics::*;
pub(crate) use reduce::*;
pub(crate) use schedule::*;

/// How to run a job, beyond the workflow.
#[derive(Clone, Debug, Default)]
pub struct JobOptions {
    /// `--max-parallel`, over the workflow's `max_parallel`.
    pub max_parallel: Option<usize>,
    /// `--cancel-running`: when the error policy stops the job, cancel the running agents
    /// (their items stay pending) instead of letting them finish.
    pub cancel_running: bool,
    /// `--strict`: a `json_path` that selects nothing from the input fails the job instead
    /// of completing it with no items.
    pub strict: bool,
    /// Where the agents run (`--executor`).
    pub host: crate::backend::AgentHost,
}

/// How a job ended.
#[derive(Clone, Debug, PartialEq)]
pub enum JobOutcome {
    /// Every phase finished.
    Completed,
    /// A setup or reduce step failed, or the input could not be read.
    Failed {
        /// `setup`, `map` or `reduce`.
        phase: &'static str,
        /// What failed.
        what: String,
    },
    /// The error policy stopped the map phase.
    Stopped(String),
    /// The Claude budget was reached: no new agent started; `not_started` items are pending.
    BudgetReached {
        /// The spent amount and the limit.
        reached: crate::claude::budget::Reached,
        /// Items left pending.
        not_started: u64,
    },
    /// A state write failed in PHASE (say, the disk under `$PRODIGY_HOME` is full): no new
    /// agent started after it, and what has no recorded outcome runs again on resume.
    StateWrite {
        /// `setup`, `map` or `reduce`.
        phase: &'static str,
        /// The file and the OS error.
        what: String,
    },
    /// A signal stopped it.
    Interrupted,
}

/// What a job reports.
#[derive(Clone, Debug)]
pub struct JobReport {
    /// The job.
    pub job_id: String,
    /// How it ended.
    pub outcome: JobOutcome,
    /// Error metrics of the map phase.
    pub metrics: ErrorMetrics,
    /// Items in the DLQ.
    pub dlq_count: u64,
    /// Items without an outcome.
    pub pending: u64,
    /// The event log.
    pub events: PathBuf,
    /// The variables at the end (for the `merge` steps).
    pub vars: Vars,
    /// Whether the job's state is still there to resume from (false when its state
    /// directory was removed while it ran).
    pub resumable: bool,
}

/// `item_<index>`, as upstream names items.
pub fn item_id(index: usize) -> String {
    format!("item_{index}")
}

fn agent_id(index: usize) -> String {
    format!("agent-{index}")
}

/// The index in an `item_<index>` id.
pub fn item_index(id: &str) -> Option<usize> {
    id.strip_prefix("item_")?.parse().ok()
}

/// The item variables of docs/language.md §5.
pub(crate) fn item_vars(vars: &mut Vars, item: &Value, index: usize, total: usize) {
    vars.set("item", item.clone());
    vars.set("item_index", json!(index));
    vars.set("item_total", json!(total));
    vars.set("item_id", Value::String(item_id(index)));
    vars.set("item_json", Value::String(item.to_string()));
}

/// A job stopped by a failed state write in PHASE: it failed, and resuming it continues.
fn stopped_by_write(phase: &'static str, why: impl std::fmt::Display) -> JobOutcome {
    JobOutcome::StateWrite {
        phase,
        what: why.to_string(),
    }
}

fn phase_name(phase: JobPhase) -> &'static str {
    match phase {
        JobPhase::Setup => "setup",
        JobPhase::Map => "map",
        JobPhase::Reduce | JobPhase::Done => "reduce",
    }
}

/// A failed write of the job's files, for people: the file and the OS error.
fn job_write_failure(e: &crate::jobstore::JobStoreError) -> String {
    match e {
        crate::jobstore::JobStoreError::Io { path, source } => {
            crate::durable::describe(path, source)
        }
        crate::jobstore::JobStoreError::Damaged { .. } => e.to_string(),
    }
}

/// Says when the DLQ's index was damaged and rebuilt from its item files; a queue that
/// cannot be read at all is reported where it is used.
pub(crate) fn say_if_rebuilt(runner: &Runner, dlq: &Dlq) {
    if let Ok(Some(rebuilt)) = dlq.repair() {
        runner.say_for_run(Message::DlqRebuilt(rebuilt));
    }
}

/// A failed write of the DLQ, for people: the file and the OS error.
fn dlq_write_failure(e: &crate::dlq::DlqError) -> String {
    match e {
        crate::dlq::DlqError::Io { path, source } => crate::durable::describe(path, source),
        crate::dlq::DlqError::Damaged { .. } => e.to_string(),
    }
}

/// Describes why the error policy stopped the job: in its events, its end and the
/// reporter's `stopping:` line.
#[must_use]
pub fn describe(reason: &StopReason) -> String {
    match reason {
        StopReason::ItemFailureStop => "an item failed under `on_item_failure: stop`".into(),
        StopReason::NoContinueOnFailure => {
            "an item failed and `continue_on_failure` is false".into()
        }
        StopReason::MaxFailures(n) => format!("`max_failures` ({n}) items failed"),
        StopReason::AgentTimeout => "an item timed out under `timeout_action: fail`".into(),
        StopReason::MissingHandler(name) => {
            format!("`on_item_failure` names handler `{name}`, which `handlers` does not define")
        }
        StopReason::FailureRate { rate, threshold } => format!(
            "the failure rate {:.0}% went above `failure_threshold` ({:.0}%)",
            rate * 100.0,
            threshold * 100.0
        ),
    }
}

fn breaker_name(state: BreakerState) -> &'static str {
    match state {
        BreakerState::Closed { .. } => "closed",
        BreakerState::Open { .. } => "open",
        BreakerState::HalfOpen { .. } => "half-open",
    }
}

/// One run (or resumption) of a MapReduce job.
pub struct MapJob<'a> {
    pub(crate) runner: &'a Runner,
    pub(crate) plan: &'a Plan,
    pub(crate) files: JobFiles,
    pub(crate) dlq: Dlq,
    pub(crate) cp: JobCheckpoint,
    pub(crate) opts: JobOptions,
    /// The checkpoint's status when this process took the job over.
    pub(crate) resumed_from: Option<Status>,
    /// The first state write that failed (path and OS error): no new agent starts after it.
    pub(crate) write_failed: Option<WriteFailure>,
    /// Items whose outcome is in `results.jsonl` but whose DLQ entry could not be written:
    /// the checkpoint keeps them remaining, so that resuming puts their entries back.
    pub(crate) dlq_unwritten: std::collections::BTreeSet<usize>,
    /// Whether the map loop said that a write failed.
    pub(crate) write_announced: bool,
    /// What the job's Claude calls cost before this process took it over.
    pub(crate) spent_before: f64,
    /// What the Claude calls of agents that ran elsewhere (Slurm tasks) cost: this process's
    /// totals do not hold them.
    pub(crate) spent_elsewhere: f64,
}

impl<'a> MapJob<'a> {
    /// A job whose state is CHECKPOINT (a new one, or one loaded for `resume-job`).
    pub fn new(
        runner: &'a Runner,
        files: JobFiles,
        checkpoint: JobCheckpoint,
        opts: JobOptions,
        resumed: bool,
    ) -> Self {
        let dlq = Dlq::new(&runner.opts.layout, &checkpoint.job_id);
        say_if_rebuilt(runner, &dlq);
        let checkpoint_spent = checkpoint.claude_cost_usd;
        MapJob {
            runner,
            plan: &runner.plan,
            files,
            dlq,
            resumed_from: resumed.then_some(checkpoint.status),
            cp: checkpoint,
            opts,
            write_failed: None,
            dlq_unwritten: std::collections::BTreeSet::new(),
            write_announced: false,
            spent_before: checkpoint_spent,
            spent_elsewhere: 0.0,
        }
    }

    /// What the job's Claude calls have cost so far, earlier processes included.
    pub(crate) fn claude_spent(&self) -> f64 {
        self.spent_before + self.spent_elsewhere + crate::lock(&self.runner.claude_totals).cost_usd
    }

    /// After a coordinator was killed, what its Claude calls cost that the checkpoint does
    /// not hold ([`crate::spend`]): the calls that finished after it was written count in
    /// what the job spent before, and the calls that were running are priced from their
    /// logs, recorded as finished and counted as this process's, so that the budget and the
    /// job's totals hold them, once.
    fn count_uncounted_calls(&mut self) {
        let events = self.runner.events_path();
        let Some(dir) = events.parent() else {
            return;
        };
        let found = crate::claude::spend::uncounted(
            &crate::claude::spend::read_events(dir),
            self.cp.claude_counted_to.as_ref(),
        );
        self.spent_before += found.finished.cost_usd;
        for call in found.interrupted {
            let Some(priced) = crate::claude::spend::price(&call.log) else {
                continue;
            };
            let event = crate::events::Event::ClaudeFinished {
                step: call.step,
                success: false,
                error_kind: priced.verdict.kind,
                message: Some(
                    "the coordinator was killed while the call ran; its cost is the one its \
                     log shows"
                        .to_owned(),
                ),
                session_id: priced.session_id.clone(),
                num_turns: priced.num_turns,
                cost_usd: priced.cost_usd,
                cost_estimated: priced.cost_estimated,
                tokens: priced.tokens,
                tool_calls: priced.tool_calls,
                api_retries: priced.api_retries,
                exit_code: None,
                log: priced.log.clone(),
                duration_secs: 0.0,
            };
            let agent = call
                .agent
                .as_ref()
                .map(|(agent_id, item_id)| crate::events::AgentIds { agent_id, item_id });
            self.runner.sink.record(&event, agent);
            crate::lock(&self.runner.claude_totals).add(&priced);
        }
    }

    /// The first state write of the job that failed, its event log's included.
    fn write_failure(&self) -> Option<WriteFailure> {
        self.write_failed
            .clone()
            .or_else(|| self.runner.state_failure().map(WriteFailure::Run))
    }

    /// Notes a failed state write (the first one is the one reported).
    fn write_failed(&mut self, why: WriteFailure) {
        if self.write_failed.is_none() {
            self.runner.record(&crate::events::Event::StateWriteFailed {
                error: why.to_string(),
            });
            self.write_failed = Some(why);
        }
    }

    fn say(&self, message: Message) {
        self.runner.say(message);
    }

    /// Why the job's results can no longer be kept, when its state directory (or the
    /// `items.json` the map phase starts from) vanished while it ran: a removed
    /// `PRODIGY_HOME` would otherwise end in "completed: 0 succeeded".
    fn state_lost(&self) -> Option<StateLost> {
        let dir = self.files.dir();
        (!crate::layout::items(dir).is_file()).then(|| StateLost::DirRemoved {
            dir: dir.to_owned(),
        })
    }

    /// Writes the checkpoint (and the DLQ's index first).
    ///
    /// # Errors
    ///
    /// The failed write, described; it is noted, so the job stops.
    fn save(&mut self, vars: Option<&Vars>) -> Result<(), WriteFailure> {
        if let Some(vars) = vars {
            let mut values = vars.values.clone();
            // Recomputed from the results on resume.
            values.remove("map");
            self.cp.variables = self
                .runner
                .seal_json(json!({"values": values, "meta": vars.meta}));
        }
        self.cp.last_checkpoint_at = crate::store::timestamp();
        self.cp.claude_cost_usd = self.claude_spent();
        self.cp.claude_counted_to = self.runner.sink.mark();
        // The DLQ's index catches up with its items at every checkpoint.
        let written = self
            .dlq
            .flush()
            .map_err(StateWriteError::Dlq)
            .and_then(|()| {
                self.files
                    .save_checkpoint(&self.cp)
                    .map_err(StateWriteError::Job)
            });
        match written {
            Ok(()) => {
                self.runner
                    .record(&crate::events::Event::JobCheckpointSaved {
                        phase: self.cp.phase,
                        status: self.cp.status,
                        items_processed: self.cp.items_processed,
                    });
                Ok(())
            }
            Err(why) => {
                let why = WriteFailure::from(why);
                self.write_failed(why.clone());
                Err(why)
            }
        }
    }

    /// Runs the job from its checkpoint's phase to the end.
    pub async fn run(mut self, mut vars: Vars) -> JobReport {
        let (workflow, phase, job_dir) = (
            self.plan.name.clone(),
            self.cp.phase,
            self.files.dir().to_owned(),
        );
        self.runner.record(&if self.resumed_from.is_some() {
            crate::events::Event::JobResumed {
                workflow,
                phase,
                job_dir,
            }
        } else {
            crate::events::Event::JobStarted {
                workflow,
                phase,
                job_dir,
            }
        });
        vars.merge(
            "workflow",
            crate::runner::fields(json!({"name": self.plan.name, "id": self.cp.job_id})),
        );
        if self.resumed_from.is_some() {
            self.count_uncounted_calls();
        }
        self.cp.status = Status::Running;
        self.cp.stop_reason = None;
        // After `resume-job --force` the new version is the job's workflow from now on, and
        // agents in Slurm tasks check it against the checkpoint: written before any starts.
        if self.cp.workflow_hash != self.runner.opts.workflow_hash {
            self.cp
                .workflow_hash
                .clone_from(&self.runner.opts.workflow_hash);
            if let Err(why) = self.save(None) {
                let outcome = stopped_by_write(phase_name(self.cp.phase), why);
                return self.finish(outcome, vars).await;
            }
        }
        let outcome = self.phases(&mut vars).await;
        self.finish(outcome, vars).await
    }

    async fn phases(&mut self, vars: &mut Vars) -> JobOutcome {
        if self.cp.phase == JobPhase::Setup {
            if let Err(why) = self.save(Some(vars)) {
                return stopped_by_write("setup", why);
            }
            if let Err(outcome) = self.setup(vars).await {
                return outcome;
            }
            if let Some(why) = self.write_failure() {
                return stopped_by_write("setup", why);
            }
            self.warn_setup_leftovers(vars).await;
            let items = match self.load_items(vars).await {
                Ok(items) => items,
                Err(why) => {
                    let why = why.to_string();
                    self.say(Message::JobFailed(why.clone()));
                    return JobOutcome::Failed {
                        phase: "map",
                        what: why,
                    };
                }
            };
            if let Err(e) = self.files.save_items(&items) {
                let why = WriteFailure::from(StateWriteError::Job(e));
                self.write_failed(why.clone());
                return stopped_by_write("map", why);
            }
            self.cp.items_total = items.len() as u64;
            self.cp.items_remaining = (0..items.len()).map(item_id).collect();
            self.cp.phase = JobPhase::Map;
            if let Err(why) = self.save(Some(vars)) {
                return stopped_by_write("map", why);
            }
        }
        if self.cp.phase == JobPhase::Map {
            let ended = self.map(vars).await;
            if let Err(why) = self.runner.end_map_phase().await {
                let why = why.to_string();
                self.say(Message::JobFailed(why.clone()));
                return JobOutcome::Failed {
                    phase: "map",
                    what: why,
                };
            }
            match ended {
                Ok(MapEnd::Finished) => self.sweep_agents().await,
                Ok(MapEnd::Stopped(reason)) => return JobOutcome::Stopped(reason),
                Ok(MapEnd::Budget(reached)) => {
                    return JobOutcome::BudgetReached {
                        reached,
                        not_started: self.cp.items_remaining.len() as u64,
                    };
                }
                Ok(MapEnd::Interrupted) => return JobOutcome::Interrupted,
                Err(MapError::StateWrite(why)) if self.write_failed.as_ref() == Some(&why) => {
                    return stopped_by_write("map", why);
                }
                Err(why) => {
                    let why = why.to_string();
                    self.say(Message::JobFailed(why.clone()));
                    return JobOutcome::Failed {
                        phase: "map",
                        what: why,
                    };
                }
            }
            self.cp.phase = JobPhase::Reduce;
            self.cp.reduce_next_step = 0;
            if let Err(why) = self.save(Some(vars)) {
                return stopped_by_write("map", why);
            }
        }
        if self.cp.phase == JobPhase::Reduce {
            return self.reduce(vars).await;
        }
        // A completed job resumed to merge it back: its `merge` steps see `${map.*}`.
        let records = self.files.load_results().unwrap_or_default();
        let dlq_count = self.dlq.index().map_or(0, |i| i.item_count as u64);
        vars.set(
            "map",
            map_vars(
                &records,
                self.cp.items_total,
                dlq_count,
                reduce::builds_map_results(self.plan.reads_map_results, self.cp.items_total),
            ),
        );
        JobOutcome::Completed
    }

    async fn finish(mut self, mut outcome: JobOutcome, vars: Vars) -> JobReport {
        // A job whose state could not all be written did not complete: what is missing runs
        // again when it is resumed.
        if let (JobOutcome::Completed, Some(why)) = (&outcome, self.write_failure()) {
            outcome = stopped_by_write(phase_name(self.cp.phase), why);
        }
        // A write that failed because the job's directory is gone (whichever write saw it
        // first) leaves nothing to resume: the job failed, and says why.
        if let (JobOutcome::StateWrite { phase, .. }, Some(lost)) = (&outcome, self.state_lost())
            && !self.files.dir().is_dir()
        {
            outcome = JobOutcome::Failed {
                phase,
                what: lost.to_string(),
            };
        }
        let phase = phase_name(self.cp.phase);
        let records = self.files.load_results().unwrap_or_default();
        let metrics = error_metrics(&records, self.cp.items_total, &self.cp.job_id);
        self.cp.status = match &outcome {
            JobOutcome::Completed => Status::Completed,
            JobOutcome::Failed { .. } | JobOutcome::StateWrite { .. } => Status::Failed,
            JobOutcome::Stopped(_) | JobOutcome::BudgetReached { .. } => Status::Stopped,
            JobOutcome::Interrupted => Status::Interrupted,
        };
        if outcome == JobOutcome::Completed {
            self.cp.phase = JobPhase::Done;
        }
        self.cp.claude_budget_reached = None;
        match &outcome {
            JobOutcome::Stopped(reason) => self.cp.stop_reason = Some(reason.clone()),
            JobOutcome::BudgetReached { reached, .. } => {
                self.cp.stop_reason = Some(crate::claude::budget::describe(reached));
                self.cp.claude_budget_reached = Some(*reached);
            }
            JobOutcome::Completed
            | JobOutcome::Failed { .. }
            | JobOutcome::StateWrite { .. }
            | JobOutcome::Interrupted => {}
        }
        self.cp.error_metrics = serde_json::to_value(&metrics).ok();
        if let Err(why) = self.save(None)
            && outcome == JobOutcome::Completed
        {
            outcome = stopped_by_write(phase, why);
        }
        let dlq_count = self.dlq.index().map_or(0, |i| i.item_count as u64);
        let claude = *crate::lock(&self.runner.claude_totals);
        self.runner.record(&crate::events::Event::JobFinished {
            status: self.cp.status,
            metrics: metrics.clone(),
            dlq_count,
            duration_secs: self.runner.started.elapsed().as_secs_f64(),
            claude: (claude.calls > 0).then_some(claude),
        });
        self.runner.say_claude_totals();
        self.runner.notify_pending(&vars).await;
        JobReport {
            job_id: self.cp.job_id.clone(),
            outcome,
            metrics,
            dlq_count,
            pending: self.cp.items_remaining.len() as u64,
            events: self.runner.events_path(),
            vars,
            // The checkpoint was just saved: it is missing only when its directory is gone;
            // past setup, the items must be there too.
            resumable: crate::layout::checkpoint(self.files.dir()).is_file()
                && (self.cp.phase == JobPhase::Setup || self.state_lost().is_none()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlq::ErrorType;
    use crate::jobstore::{ItemRecord, ItemStatus};
    use crate::vars::CommandOutput;
    use prodigy_grammar::jsonpath::JsonPath;
    use prodigy_plan::support::{Span, Spanned};
    use prodigy_plan::{CaptureSource, Multiline, OutputCapture};
    use setup::setup_value;

    fn failed(index: usize, kind: &str, message: &str) -> ItemRecord {
        ItemRecord {
            item_id: item_id(index),
            index,
            status: ItemStatus::Failed,
            attempts: 1,
            output: None,
            error: Some(message.into()),
            error_type: Some(kind.into()),
            duration_secs: 0.0,
            dead_lettered: true,
            claude: None,
            task: None,
            slurm: None,
            merge_commit: None,
            trail: crate::jobstore::ItemTrail::default(),
        }
    }

    /// `${map.results}` holds every item's record, so it is built only for a plan whose
    /// steps can read it; the counts are there either way.
    #[test]
    fn map_results_are_built_only_when_asked_for() {
        let records = vec![failed(0, "Timeout", "agent timed out")];
        let counts = reduce::map_vars(&records, 1, 1, false);
        assert!(counts.get("results").is_none(), "{counts}");
        assert_eq!(counts["failed"], 1);
        let full = reduce::map_vars(&records, 1, 1, true);
        let keys: Vec<&String> = full.as_object().unwrap().keys().collect();
        assert_eq!(keys[0], "results");
        assert_eq!(full["results"][0]["error"], "agent timed out");
        // A small job builds the list anyway, for scripts that read it from the
        // environment; a large one only when its workflow mentions it.
        assert!(reduce::builds_map_results(false, 10_000));
        assert!(!reduce::builds_map_results(false, 10_001));
        assert!(reduce::builds_map_results(true, 100_000));
    }

    #[test]
    fn metrics_count_outcomes_and_find_patterns() {
        let mut records = vec![
            failed(0, "Timeout", "agent timed out"),
            failed(1, "Timeout", "agent timed out"),
            failed(2, "Timeout", "agent timed out"),
            failed(3, "CommandFailed", "connection refused by network"),
            failed(4, "CommandFailed", "network unreachable"),
            failed(5, "CommandFailed", "network unreachable"),
            failed(6, "Unknown", "odd"),
        ];
        records.push(ItemRecord {
            status: ItemStatus::Succeeded,
            error: None,
            error_type: None,
            ..failed(7, "", "")
        });
        let metrics = error_metrics(&records, 10, "job");
        assert_eq!(
            (metrics.total_items, metrics.successful, metrics.failed),
            (10, 1, 7)
        );
        assert!((metrics.failure_rate - 7.0 / 8.0).abs() < 1e-9);
        assert_eq!(metrics.error_types.get("Timeout"), Some(&3));
        let patterns: Vec<(&str, &str)> = metrics
            .failure_patterns
            .iter()
            .map(|p| (p.pattern.as_str(), p.suggestion.as_str()))
            .collect();
        assert_eq!(
            patterns,
            vec![
                (
                    "CommandFailed",
                    "Check network connectivity and retry settings"
                ),
                (
                    "Timeout",
                    "Consider increasing agent_timeout_secs in timeout_config"
                ),
            ]
        );
    }

    #[test]
    fn the_advice_names_the_dominant_error() {
        // 3 permission errors and 1 network error: the advice is about permissions, even
        // though a network error is among them.
        let records = vec![
            failed(
                0,
                "CommandFailed",
                "cp: cannot create 'out/a': Permission denied",
            ),
            failed(1, "CommandFailed", "curl: (7) connection refused"),
            failed(2, "CommandFailed", "open /etc/x: permission denied"),
            failed(
                3,
                "CommandFailed",
                "rm: cannot remove 'b': Permission denied",
            ),
        ];
        let metrics = error_metrics(&records, 4, "job");
        assert_eq!(
            metrics.failure_patterns,
            vec![FailurePattern {
                pattern: "CommandFailed".into(),
                frequency: 4,
                suggestion: "Verify file permissions and access rights".into(),
            }]
        );
        // Mostly unrelated errors: the generic advice, not the one network error's.
        let records = vec![
            failed(0, "CommandFailed", "error[E0308]: mismatched types"),
            failed(1, "CommandFailed", "error[E0425]: cannot find value"),
            failed(2, "CommandFailed", "network unreachable"),
        ];
        assert_eq!(
            error_metrics(&records, 3, "job").failure_patterns[0].suggestion,
            "Review error logs for more details: `prodigy dlq stats job` shows which items failed and why"
        );
    }

    #[test]
    fn a_dlq_write_lost_by_a_crash_is_repaired_but_a_cleared_item_stays_out() {
        let home = tempfile::tempdir().unwrap();
        let layout = crate::layout::Layout {
            home: home.path().to_owned(),
            repo: "demo".into(),
        };
        let dlq = Dlq::new(&layout, "job");
        let records = vec![failed(0, "Timeout", "slow"), failed(1, "Timeout", "slow")];
        let items = vec![json!("a"), json!("b")];
        // Item 0 was recorded before the last checkpoint (then cleared by hand); item 1
        // after it, and its DLQ write was lost.
        let remaining = vec![item_id(1)];
        assert_eq!(
            repair_dlq(&dlq, &records, &items, &remaining),
            vec![item_id(1)]
        );
        let entry = dlq.get(&item_id(1)).unwrap().unwrap();
        assert_eq!(entry.item_data, json!("b"));
        assert_eq!(entry.failure_history[0].error_type, ErrorType::Timeout);
        assert!(dlq.get(&item_id(0)).unwrap().is_none());
        // Repairing again adds nothing twice.
        assert!(repair_dlq(&dlq, &records, &items, &remaining).is_empty());
    }

    /// A pattern compiled as the planner compiles it.
    fn pattern(text: &str) -> prodigy_plan::Pattern {
        prodigy_plan::Pattern::compile(Spanned::new(text.into(), Span::default())).unwrap()
    }

    /// A JSON path parsed as the planner parses it.
    fn path(text: &str) -> prodigy_plan::Parsed<JsonPath> {
        prodigy_plan::Parsed {
            value: text.into(),
            span: Span::default(),
            parsed: JsonPath::parse(text).unwrap(),
            exact: true,
        }
    }

    fn capture(source: CaptureSource) -> OutputCapture {
        OutputCapture {
            source,
            max_size: 1024,
            ..OutputCapture::new("v", 0)
        }
    }

    #[test]
    fn setup_captures_apply_pattern_path_default_and_lines() {
        let out = CommandOutput {
            stdout: "count: 42\n{\"a\": {\"b\": [7]}}".to_owned(),
            stderr: "warn".to_owned(),
            success: true,
        };
        let mut c = capture(CaptureSource::Stdout);
        c.pattern = Some(pattern(r"count: (\d+)"));
        c.format = prodigy_plan::CaptureFormat::Number;
        assert_eq!(setup_value(&c, &out).unwrap(), json!(42));
        let mut c = capture(CaptureSource::Stdout);
        c.multiline = Multiline::LastLine;
        assert_eq!(
            setup_value(&c, &out).unwrap(),
            json!("{\"a\": {\"b\": [7]}}")
        );
        let json_out = CommandOutput {
            stdout: "{\"a\": {\"b\": [7]}}".to_owned(),
            stderr: String::new(),
            success: true,
        };
        let mut c = capture(CaptureSource::Stdout);
        c.json_path = Some(path("$.a.b[0]"));
        assert_eq!(setup_value(&c, &json_out).unwrap(), json!("7"));
        let mut c = capture(CaptureSource::Stderr);
        c.pattern = Some(pattern("nothing"));
        assert!(setup_value(&c, &out).is_err());
        c.default = Some("fallback".into());
        assert_eq!(setup_value(&c, &out).unwrap(), json!("fallback"));
        let mut c = capture(CaptureSource::Stdout);
        c.max_size = 5;
        assert_eq!(setup_value(&c, &out).unwrap(), json!("count"));
    }
}
