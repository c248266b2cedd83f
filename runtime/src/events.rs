//! What a run tells the world: the [`Event`]s written to its events file, the [`Line`]s and
//! [`ProgressUpdate`]s a person sees, and the [`Sink`] every one of them goes through.
//!
//! The runtime never writes to the terminal: it hands lines and progress to a [`Reporter`]
//! (the binary's draws them; [`Silent`] drops them), and events to the [`Sink`], which masks
//! secrets, adds a map agent's ids, writes the events file and keeps the first write that
//! failed, so that the run stops with it.

pub use crate::store::EventsMark;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::claude::kinds::{ErrorKind, Tokens, Totals};
use crate::jobstore::{JobPhase, Status};
use crate::lock;
use crate::machine::Outcome;
use crate::mapreduce::metrics::ErrorMetrics;
use crate::message::Message;
use crate::store::EventLog;
use crate::vars::Secrets;

/// Where a step was written: the workflow file and the line its entry starts on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// The workflow file as the user named it.
    pub file: String,
    /// From 1.
    pub line: u32,
}

impl Origin {
    /// Where STEP of PLAN was written: the plan's file and the line the planner found; none
    /// for a step the compiler made.
    pub fn of(plan: &prodigy_plan::Plan, step: &prodigy_plan::PlanStep) -> Option<Origin> {
        step.line.map(|line| Origin {
            file: plan.source.clone(),
            line,
        })
    }
}

/// How a step ended, as its `step_finished` event says: the step machine's [`Outcome`], except
/// that a failure only handled by an `on_failure` handler of a map agent's own step is
/// `failed_handled` (it fails the item), where elsewhere it is `failed_continued` (the run
/// goes on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepOutcome {
    /// The command succeeded.
    Succeeded,
    /// A fallback succeeded in the command's place.
    Recovered,
    /// The step failed, its handler ran, and the run goes on.
    FailedContinued,
    /// A map agent's step failed and its handler ran: the item fails.
    FailedHandled,
    /// The failure is ignored.
    Ignored,
    /// The step failed.
    Failed,
    /// `when` was false.
    Skipped,
    /// Cancelled by a signal.
    Cancelled,
}

impl StepOutcome {
    /// The outcome of a step that ended as OUTCOME; `agent_step`: it is one of a map agent's
    /// own steps, whose handled failure ends the agent.
    pub fn of(outcome: Outcome, agent_step: bool) -> Self {
        match outcome {
            Outcome::Succeeded => StepOutcome::Succeeded,
            Outcome::Recovered => StepOutcome::Recovered,
            Outcome::FailedContinued if agent_step => StepOutcome::FailedHandled,
            Outcome::FailedContinued => StepOutcome::FailedContinued,
            Outcome::Ignored => StepOutcome::Ignored,
            Outcome::Failed => StepOutcome::Failed,
            Outcome::Skipped => StepOutcome::Skipped,
            Outcome::Cancelled => StepOutcome::Cancelled,
        }
    }
}

/// One event of a run or a job, as its events file holds it: `event_type` names the variant,
/// the fields follow in this order (the envelope's `timestamp` and `job_id` are added when it
/// is written, and inside a map agent `agent_id` and `item_id`). It reads back from its
/// line as it was written ([`Event`]'s `Deserialize`; the envelope's fields are ignored).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event_type", remote = "Self")]
pub enum Event {
    /// A standard run starts (or resumes).
    #[serde(rename = "workflow_started")]
    WorkflowStarted {
        /// `name`.
        workflow: Option<String>,
        /// The session.
        session_id: String,
        /// The step it starts at (0, or where it resumes).
        resumed_at_step: usize,
        /// How many top-level steps there are.
        steps: usize,
    },
    /// A standard run ends.
    #[serde(rename = "workflow_finished")]
    WorkflowFinished {
        /// `completed`, `failed` or `interrupted`.
        outcome: crate::store::SessionStatus,
        /// The step that failed the run.
        failed_step: Option<String>,
        /// How many steps failed and were continued.
        failed_continued: usize,
        /// Since the run started.
        duration_secs: f64,
        /// What its Claude calls cost, when it made any.
        #[serde(skip_serializing_if = "Option::is_none")]
        claude: Option<Totals>,
    },
    /// A step failed and the workflow goes on.
    #[serde(rename = "step_failed_continued")]
    StepFailedContinued {
        /// Its label.
        step: String,
        /// Its index among the top-level steps.
        step_index: usize,
        /// Whether a handler ran.
        handled: bool,
    },
    /// A standard run's checkpoint landed.
    #[serde(rename = "checkpoint_saved")]
    CheckpointSaved {
        /// The step a resume starts at.
        next_step: usize,
        /// The run's status.
        status: crate::store::SessionStatus,
        /// The checkpoint file.
        path: PathBuf,
    },
    /// A MapReduce job's checkpoint landed.
    #[serde(rename(serialize = "checkpoint_saved", deserialize = "job_checkpoint_saved"))]
    JobCheckpointSaved {
        /// The job's phase.
        phase: JobPhase,
        /// Its status.
        status: Status,
        /// Items with an outcome.
        items_processed: u64,
    },
    /// A step starts.
    #[serde(rename = "step_started")]
    StepStarted {
        /// Its label.
        step: String,
        /// Its index in its phase, when it has one.
        step_index: Option<usize>,
        /// Its id in the plan.
        step_id: u32,
        /// The number of its output's files in its owner's logs (`step-NNNN.log`, `.json`),
        /// which ties them to this run of the step (and so to its item's attempt).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        log_number: Option<u32>,
        /// Where it was written.
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        origin: Option<Origin>,
    },
    /// A step's `when` is false.
    #[serde(rename = "step_skipped")]
    StepSkipped {
        /// Its label.
        step: String,
        /// The condition.
        when: String,
    },
    /// A step failed before or after its command ran.
    #[serde(rename = "step_failed")]
    StepFailed {
        /// Its label.
        step: String,
        /// Why.
        error: String,
    },
    /// A step's command starts.
    #[serde(rename = "attempt_started")]
    AttemptStarted {
        /// Its label.
        step: String,
        /// The run (handlers' count).
        run: u32,
        /// The attempt within the run (retries' count).
        attempt: u32,
    },
    /// A step's command ended.
    #[serde(rename = "attempt_finished")]
    AttemptFinished {
        /// Its label.
        step: String,
        /// The run.
        run: u32,
        /// The attempt.
        attempt: u32,
        /// Its exit code (none when a signal ended it or it never ran).
        exit_code: Option<i32>,
        /// Whether its timeout ended it.
        timed_out: bool,
        /// Whether it succeeded.
        success: bool,
        /// How long it ran.
        duration_secs: f64,
    },
    /// A retry waits.
    #[serde(rename = "retry_scheduled")]
    RetryScheduled {
        /// Its label.
        step: String,
        /// The attempt that comes next.
        next_attempt: u32,
        /// The wait.
        delay_secs: f64,
    },
    /// `on_failure: fallback` runs its command.
    #[serde(rename = "fallback_started")]
    FallbackStarted {
        /// Its label.
        step: String,
    },
    /// A capture's value does not fit.
    #[serde(rename = "capture_failed")]
    CaptureFailed {
        /// Its label.
        step: String,
        /// Why.
        error: String,
    },
    /// An `on_exit_code` handler runs.
    #[serde(rename = "exit_code_handler_started")]
    ExitCodeHandlerStarted {
        /// Its label.
        step: String,
        /// The code it handles.
        exit_code: i32,
    },
    /// A step ends.
    #[serde(rename = "step_finished")]
    StepFinished {
        /// Its label.
        step: String,
        /// How it ended.
        outcome: StepOutcome,
        /// Where it was written.
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        origin: Option<Origin>,
    },
    /// A step machine answered what cannot happen.
    #[serde(rename = "internal_error")]
    InternalError {
        /// Its label.
        step: String,
        /// The machine's state.
        state: String,
        /// What it answered.
        action: String,
    },
    /// An `on_failure` handler starts.
    #[serde(rename = "handler_started")]
    HandlerStarted {
        /// Its label.
        step: String,
        /// The run it handles.
        run: u32,
        /// `on_failure.strategy`.
        strategy: prodigy_plan::Strategy,
    },
    /// An `on_failure` handler ended.
    #[serde(rename = "handler_finished")]
    HandlerFinished {
        /// Its label.
        step: String,
        /// The run it handled.
        run: u32,
        /// Whether it succeeded.
        success: bool,
    },
    /// `on_success` runs.
    #[serde(rename = "success_handler_started")]
    SuccessHandlerStarted {
        /// Its label.
        step: String,
    },
    /// A step's `capture` set a variable.
    #[serde(rename = "variable_captured")]
    VariableCaptured {
        /// Its label.
        step: String,
        /// The variable.
        name: String,
        /// Its `capture_format`.
        format: prodigy_plan::CaptureFormat,
    },
    /// A setup step's `capture_outputs` set a variable.
    #[serde(rename(
        serialize = "variable_captured",
        deserialize = "setup_variable_captured"
    ))]
    SetupVariableCaptured {
        /// The variable.
        name: String,
        /// `setup`.
        phase: String,
    },
    /// A round of a step's `validate` checks ended.
    #[serde(rename = "step_validation_finished")]
    StepValidationFinished {
        /// Its label.
        step: String,
        /// The round, from 1.
        round: u32,
        /// Checks that passed.
        passed: u32,
        /// Checks in all.
        checks: u32,
        /// Whether the round passed.
        success: bool,
    },
    /// A round of `validate` with a threshold ended.
    #[serde(rename = "validation_finished")]
    ValidationFinished {
        /// Its label.
        step: String,
        /// The round, from 1.
        round: u32,
        /// The completion reported.
        completion: f64,
        /// Whether it reaches the threshold.
        complete: bool,
    },
    /// A Claude call starts.
    #[serde(rename = "claude_started")]
    ClaudeStarted {
        /// Its label.
        step: String,
        /// The program.
        program: String,
        /// Its arguments.
        args: Vec<String>,
        /// The CLI's version.
        cli_version: Option<String>,
        /// The call's log.
        log: Option<PathBuf>,
    },
    /// A Claude call ended.
    #[serde(rename = "claude_finished")]
    ClaudeFinished {
        /// Its label.
        step: String,
        /// Whether it succeeded.
        success: bool,
        /// Why it failed.
        error_kind: Option<ErrorKind>,
        /// Claude's message of a failure.
        message: Option<String>,
        /// Claude's session.
        session_id: Option<String>,
        /// Turns taken.
        num_turns: u32,
        /// What it cost.
        cost_usd: f64,
        /// The cost is an estimate from the stream's usage (no `result` event came).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        cost_estimated: bool,
        /// Tokens used.
        tokens: Tokens,
        /// Tools called.
        tool_calls: u32,
        /// API requests retried.
        api_retries: u32,
        /// The CLI's exit code.
        exit_code: Option<i32>,
        /// The call's log.
        log: Option<PathBuf>,
        /// How long it ran.
        duration_secs: f64,
    },
    /// `merge.on_conflict` starts.
    #[serde(rename = "merge_conflict_handler_started")]
    MergeConflictHandlerStarted {
        /// The branch being merged.
        source_branch: String,
        /// The branch merged into.
        target_branch: String,
        /// The files in conflict.
        conflicted_files: Vec<String>,
        /// Where the merge is.
        worktree: PathBuf,
    },
    /// `merge.on_conflict` ended.
    #[serde(rename = "merge_conflict_handler_finished")]
    MergeConflictHandlerFinished {
        /// The branch being merged.
        source_branch: String,
        /// Whether it resolved the merge.
        success: bool,
        /// Why not.
        error: Option<String>,
    },
    /// The session branch is merged back.
    #[serde(rename = "merge_started")]
    MergeStarted {
        /// The session branch.
        source_branch: String,
        /// The branch the run started on.
        target_branch: String,
        /// Commits to merge.
        commits: usize,
    },
    /// The session branch was merged back.
    #[serde(rename = "merge_finished")]
    MergeFinished {
        /// The session branch.
        source_branch: String,
        /// The branch the run started on.
        target_branch: String,
    },
    /// A MapReduce job starts.
    #[serde(rename = "job_started")]
    JobStarted {
        /// `name`.
        workflow: Option<String>,
        /// The phase it starts in.
        phase: JobPhase,
        /// Its state directory.
        job_dir: PathBuf,
    },
    /// A MapReduce job resumes.
    #[serde(rename = "job_resumed")]
    JobResumed {
        /// `name`.
        workflow: Option<String>,
        /// The phase it resumes in.
        phase: JobPhase,
        /// Its state directory.
        job_dir: PathBuf,
    },
    /// A MapReduce job ends.
    #[serde(rename = "job_finished")]
    JobFinished {
        /// How it stands.
        status: Status,
        /// Its items' outcomes.
        metrics: ErrorMetrics,
        /// Items in the DLQ.
        dlq_count: u64,
        /// Since the job (this process) started.
        duration_secs: f64,
        /// What its Claude calls cost, when it made any.
        #[serde(skip_serializing_if = "Option::is_none")]
        claude: Option<Totals>,
    },
    /// A state file could not be written: the job stops.
    #[serde(rename = "state_write_failed")]
    StateWriteFailed {
        /// The file and the OS error.
        error: String,
    },
    /// The job stops starting agents.
    #[serde(rename = "job_stopping")]
    JobStopping {
        /// Why.
        reason: String,
    },
    /// The Claude budget (`max_cost_usd`, `--max-cost-usd`) is reached: no new Claude
    /// call starts.
    #[serde(rename = "claude_budget_reached")]
    ClaudeBudgetReached {
        /// US dollars spent, earlier processes of the job included.
        spent: f64,
        /// The limit.
        limit: f64,
        /// Items (or steps) left that will not start.
        not_started: u64,
    },
    /// Setup left files the agents will not see.
    #[serde(rename = "setup_left_uncommitted")]
    SetupLeftUncommitted {
        /// Their paths.
        paths: Vec<String>,
    },
    /// A worktree was prepared as `worktree:` says (names only, never contents).
    #[serde(rename = "worktree_prepared")]
    WorktreePrepared {
        /// The worktree's root.
        path: PathBuf,
        /// The files copied in, relative to the repository's root.
        copied: Vec<String>,
        /// The directories linked in.
        linked: Vec<String>,
        /// Whether its `setup` steps run now (they run once per worktree).
        setup: bool,
    },
    /// Setup starts.
    #[serde(rename = "setup_started")]
    SetupStarted {
        /// Its steps.
        steps: usize,
    },
    /// Setup ended.
    #[serde(rename = "setup_finished")]
    SetupFinished {},
    /// The map input was read and filtered.
    #[serde(rename = "input_loaded")]
    InputLoaded {
        /// `map.input`.
        input: String,
        /// Items `json_path` selected.
        selected: usize,
        /// Left after `filter`.
        filtered: usize,
        /// Left after `distinct`.
        distinct: usize,
        /// Kept in the end.
        items: usize,
        /// Items without the `distinct` field, when the workflow has `distinct`.
        #[serde(skip_serializing_if = "Option::is_none")]
        distinct_missing: Option<usize>,
    },
    /// The map phase starts.
    #[serde(rename = "map_started")]
    MapStarted {
        /// Items in all.
        items: usize,
        /// Items left to run.
        pending: usize,
        /// Agents at a time.
        max_parallel: usize,
    },
    /// The map phase ended.
    #[serde(rename = "map_finished")]
    MapFinished {
        /// Items that succeeded.
        successful: u64,
        /// Items that failed.
        failed: u64,
        /// Items skipped.
        skipped: u64,
        /// Items left.
        pending: usize,
    },
    /// An agent starts on an item.
    #[serde(rename = "agent_started")]
    AgentStarted {
        /// `agent-<index>`.
        agent_id: String,
        /// `item_<index>`.
        item_id: String,
        /// The attempt, from 1.
        attempt: u32,
    },
    /// An agent's item succeeded.
    #[serde(rename = "agent_completed")]
    AgentCompleted {
        /// `agent-<index>`.
        agent_id: String,
        /// `item_<index>`.
        item_id: String,
        /// The attempt.
        attempt: u32,
        /// How long it ran.
        duration_secs: f64,
    },
    /// An agent's item failed.
    #[serde(rename = "agent_failed")]
    AgentFailed {
        /// `agent-<index>`.
        agent_id: String,
        /// `item_<index>`.
        item_id: String,
        /// The attempt.
        attempt: u32,
        /// The DLQ's classification.
        error_type: String,
        /// Why.
        error: String,
        /// The step that failed.
        step: Option<String>,
    },
    /// An agent was stopped.
    #[serde(rename = "agent_cancelled")]
    AgentCancelled {
        /// `agent-<index>`.
        agent_id: String,
        /// `item_<index>`.
        item_id: String,
    },
    /// The breaker turned an item away.
    #[serde(rename = "agent_rejected")]
    AgentRejected {
        /// `item_<index>`.
        item_id: String,
        /// `CircuitOpen`.
        reason: String,
    },
    /// An agent's commits came into the session branch.
    #[serde(rename = "agent_merged")]
    AgentMerged {
        /// The agent's branch.
        branch: String,
        /// How.
        merge: String,
    },
    /// On resume: an item's work was merged by a process killed before it wrote the item's
    /// outcome; the item is recorded as succeeded instead of running again.
    #[serde(rename = "agent_merge_recovered")]
    AgentMergeRecovered {
        /// `item_<index>`.
        item_id: String,
        /// The agent's branch.
        branch: String,
        /// The commit that merged its work.
        merge_commit: String,
    },
    /// The map phase ended with every item decided: the agent worktrees and branches of the
    /// job that nothing keeps were removed, earlier runs' included.
    #[serde(rename = "agent_worktrees_swept")]
    AgentWorktreesSwept {
        /// Worktrees removed.
        worktrees: usize,
        /// Branches deleted.
        branches: usize,
    },
    /// An agent left uncommitted changes: its worktree is kept.
    #[serde(rename = "agent_worktree_kept")]
    AgentWorktreeKept {
        /// The worktree.
        path: PathBuf,
        /// Its branch.
        branch: String,
        /// `git status --porcelain` lines.
        uncommitted: Vec<String>,
    },
    /// An agent's commits could not be merged.
    #[serde(rename = "agent_merge_failed")]
    AgentMergeFailed {
        /// The agent's branch.
        branch: String,
        /// Why.
        error: String,
        /// The DLQ's classification.
        error_type: String,
    },
    /// A resumed job moved the integration ref to a candidate that passed `merge.verify`
    /// before the killed process could.
    #[serde(rename = "verified_landed")]
    VerifiedLanded {
        /// The candidate commit.
        candidate: String,
        /// The items whose work it holds.
        item_ids: Vec<String>,
    },
    /// The test-integrity verdict of an agent's work (`merge.integrity`).
    #[serde(rename = "integrity_checked")]
    IntegrityChecked {
        /// `item_<index>`.
        item_id: String,
        /// `pass`, `warn` or `fail`.
        verdict: String,
        /// Each finding: its level, what it is and where (`fail: a skip marker added
        /// (tests/a.py:3)`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        findings: Vec<String>,
    },
    /// An agent's work joined the verified merge queue.
    #[serde(rename = "merge_queued")]
    MergeQueued {
        /// `item_<index>`.
        item_id: String,
    },
    /// `merge.verify` began on a candidate: the merged work with these items' work stacked
    /// on top, in queue order.
    #[serde(rename = "verify_started")]
    VerifyStarted {
        /// The items whose work the candidate holds.
        item_ids: Vec<String>,
        /// The candidate commit.
        candidate: String,
        /// Whether it is part of bisecting a failed batch.
        bisecting: bool,
    },
    /// `merge.verify` ended on a candidate.
    #[serde(rename = "verify_finished")]
    VerifyFinished {
        /// The items whose work the candidate holds.
        item_ids: Vec<String>,
        /// The candidate commit.
        candidate: String,
        /// Whether every step passed.
        passed: bool,
        /// How long it took.
        duration_secs: f64,
        /// What the failing step printed (secrets masked), when it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<String>,
    },
    /// The merge queue refused an item's work, which goes back to its agent or to the DLQ.
    #[serde(rename = "merge_refused")]
    MergeRefused {
        /// `item_<index>`.
        item_id: String,
        /// `verify_failed`, `conflict` or `protected`.
        reason: String,
        /// The conflicted or protected paths (none for a failed verification).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        paths: Vec<String>,
    },
    /// A refused item's agent runs again on the current merged work (`merge.redispatch`).
    #[serde(rename = "item_redispatched")]
    ItemRedispatched {
        /// `item_<index>`.
        item_id: String,
        /// `verify_failed`, `conflict` or `protected`.
        reason: String,
        /// The re-dispatch's number, from 1.
        attempt: u32,
    },
    /// The breaker half-opens: this item probes.
    #[serde(rename = "CircuitHalfOpen")]
    CircuitHalfOpen {
        /// `item_<index>`.
        item_id: String,
    },
    /// The breaker opens.
    #[serde(rename = "CircuitOpen")]
    CircuitOpen {
        /// `item_<index>`.
        item_id: String,
    },
    /// The breaker closes.
    #[serde(rename = "CircuitClosed")]
    CircuitClosed {
        /// `item_<index>`.
        item_id: String,
    },
    /// A failed item waits for its retry.
    #[serde(rename = "item_retry_scheduled")]
    ItemRetryScheduled {
        /// `item_<index>`.
        item_id: String,
        /// The attempt that comes next.
        next_attempt: u32,
        /// The wait.
        delay_secs: f64,
    },
    /// A failed item is skipped (`on_item_failure: skip`).
    #[serde(rename = "item_skipped")]
    ItemSkipped {
        /// `item_<index>`.
        item_id: String,
    },
    /// A failed item's handler starts.
    #[serde(rename = "item_handler_started")]
    ItemHandlerStarted {
        /// `item_<index>`.
        item_id: String,
        /// The handler.
        handler: String,
    },
    /// A failed item's handler ended.
    #[serde(rename = "item_handler_finished")]
    ItemHandlerFinished {
        /// `item_<index>`.
        item_id: String,
        /// Whether it succeeded.
        success: bool,
    },
    /// A failed item went to the DLQ.
    #[serde(rename = "dlq_item_added")]
    DlqItemAdded {
        /// `item_<index>`.
        item_id: String,
        /// Its failures' signature.
        error_signature: String,
        /// How many times it failed.
        failure_count: u32,
    },
    /// An item the DLQ was missing is put back there on resume.
    #[serde(rename(serialize = "dlq_item_added", deserialize = "dlq_item_repaired"))]
    DlqItemRepaired {
        /// `item_<index>`.
        item_id: String,
        /// `true`.
        repaired: bool,
    },
    /// `dlq retry` starts.
    #[serde(rename = "dlq_retry_started")]
    DlqRetryStarted {
        /// Items to retry.
        items: usize,
    },
    /// A retried item succeeded.
    #[serde(rename = "dlq_item_removed")]
    DlqItemRemoved {
        /// `item_<index>`.
        item_id: String,
    },
    /// A retried item failed again.
    #[serde(rename = "dlq_item_updated")]
    DlqItemUpdated {
        /// `item_<index>`.
        item_id: String,
        /// How many times it failed.
        failure_count: u32,
    },
    /// `dlq retry` ended.
    #[serde(rename = "dlq_retry_finished")]
    DlqRetryFinished {
        /// Items retried.
        retried: u64,
        /// Items that succeeded.
        succeeded: u64,
        /// Items that failed again.
        still_failing: u64,
    },
    /// The reduce phase starts.
    #[serde(rename = "reduce_started")]
    ReduceStarted {
        /// Its steps.
        steps: usize,
    },
    /// The reduce phase ended.
    #[serde(rename = "reduce_finished")]
    ReduceFinished {},
    /// A backend's task started an item's steps (`slurm_task_started` before backends
    /// had one set of events).
    #[serde(rename = "task_started")]
    TaskStarted {
        /// The task.
        task: crate::backend::task::TaskRef,
    },
    /// An item's task was submitted to its backend.
    #[serde(rename = "task_submitted")]
    TaskSubmitted {
        /// The task.
        task: crate::backend::task::TaskRef,
        /// The item's attempt.
        attempt: u32,
    },
    /// A resumed job found an item's task still there and waits for it.
    #[serde(rename = "task_adopted")]
    TaskAdopted {
        /// The task.
        task: crate::backend::task::TaskRef,
        /// The item's attempt.
        attempt: u32,
    },
    /// An item's task is cancelled.
    #[serde(rename = "task_cancelled")]
    TaskCancelled {
        /// The task.
        task: crate::backend::task::TaskRef,
        /// Why.
        reason: String,
    },
    /// A Claude call ended at the account's usage limit: no Claude call starts until it
    /// resets (`wait`), or the run stops (`stop`).
    #[serde(rename = "claude_limit_reached")]
    ClaudeLimitReached {
        /// The step whose call hit it.
        step: String,
        /// `five_hour`, `seven_day`, ... (`unknown` when the CLI did not say).
        limit_type: String,
        /// When it resets (RFC 3339).
        resets_at: String,
        /// `wait` or `stop`.
        action: String,
        /// How long Claude calls wait (`wait`).
        #[serde(skip_serializing_if = "Option::is_none")]
        wait_secs: Option<f64>,
    },
    /// The usage limit's pause is over: Claude calls start again, the interrupted ones first.
    #[serde(rename = "claude_limit_lifted")]
    ClaudeLimitLifted {
        /// The step whose call starts first.
        step: String,
    },
    /// The rate governor changed how many Claude calls may run at once.
    #[serde(rename = "claude_slots_changed")]
    ClaudeSlotsChanged {
        /// Calls that may run at once now.
        slots: usize,
        /// The most that ran at once.
        max: usize,
        /// `rate_limited` (lowered) or `recovered` (raised).
        reason: String,
    },
    /// A `notify:` command ran (docs/language.md §2, "Notifications").
    #[serde(rename = "notification_finished")]
    NotificationFinished {
        /// The event it fired on.
        event: String,
        /// Its command's label.
        command: String,
        /// Whether it succeeded.
        success: bool,
        /// Its exit code, when it exited.
        exit_code: Option<i32>,
        /// Whether its `timeout` stopped it.
        timed_out: bool,
        /// How long it ran.
        duration_secs: f64,
        /// The file its output is kept in (docs/running.md, "Logs"), when it printed any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<std::path::PathBuf>,
    },
    /// A Claude call refused as rate limited or overloaded is made again within
    /// `patience`, as the same attempt.
    #[serde(rename = "claude_call_repeated")]
    ClaudeCallRepeated {
        /// The step.
        step: String,
        /// `rate_limit` or `overloaded`.
        error_kind: crate::claude::kinds::ErrorKind,
        /// Since the call was first refused.
        waited_secs: f64,
    },
}

impl Serialize for Event {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // The derived form (`remote = "Self"`).
        Event::serialize(self, serializer)
    }
}

/// The events that share their `event_type` with another, and the field that tells the
/// second from the first: its name for the derived form.
const SHARED_TYPES: [(&str, &str, &str); 3] = [
    ("checkpoint_saved", "phase", "job_checkpoint_saved"),
    ("variable_captured", "phase", "setup_variable_captured"),
    ("dlq_item_added", "repaired", "dlq_item_repaired"),
];

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut fields = serde_json::Map::<String, Value>::deserialize(deserializer)?;
        let kind = fields.get("event_type").and_then(Value::as_str);
        if let Some((_, _, second)) = SHARED_TYPES
            .iter()
            .find(|(name, field, _)| kind == Some(*name) && fields.contains_key(*field))
        {
            fields.insert("event_type".to_owned(), Value::String((*second).to_owned()));
        }
        // The derived form (`remote = "Self"`).
        Event::deserialize(Value::Object(fields)).map_err(serde::de::Error::custom)
    }
}

/// The `event_type` of every [`Event`] variant, as its events file writes it, sorted: the one
/// vocabulary that readers of events (the read model, `graph --status`, `events`) are held to
/// by their tests. Read from serde's own list of the variants, which its error for an
/// unknown one names; variants that share a written name ([`SHARED_TYPES`]) under it.
pub fn vocabulary() -> Vec<String> {
    let unknown = serde_json::json!({ "event_type": "" });
    let message = match Event::deserialize(unknown) {
        Err(e) => e.to_string(),
        Ok(_) => String::new(),
    };
    let listed = message
        .split_once("expected one of ")
        .map_or("", |(_, list)| list);
    let mut names: Vec<String> = listed
        .split(", ")
        .map(|n| n.trim().trim_matches('`').to_owned())
        .filter(|n| !n.is_empty())
        .map(|n| {
            SHARED_TYPES
                .iter()
                .find(|(_, _, second)| *second == n)
                .map_or(n, |(first, _, _)| (*first).to_owned())
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The names SOURCE's `match` arms name: each line whose pattern (before `=>` and any
/// `if` guard) is only string literals joined by `|`. For the tests that hold a reader of
/// events (the read model, `graph --status`, `events`) to [`vocabulary`].
pub fn arm_names(source: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for line in source.lines() {
        let pattern = line.trim().trim_start_matches('|');
        let pattern = pattern.split("=>").next().unwrap_or_default();
        let pattern = pattern.split(" if ").next().unwrap_or_default().trim();
        let literals: Vec<&str> = pattern
            .split('|')
            .map(str::trim)
            .map(|n| n.strip_prefix('"').and_then(|n| n.strip_suffix('"')))
            .collect::<Option<Vec<&str>>>()
            .unwrap_or_default();
        if literals
            .iter()
            .all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        {
            names.extend(literals.iter().map(|n| (*n).to_owned()));
        }
    }
    names.sort();
    names.dedup();
    names
}

impl Event {
    /// The event's fields as its file holds them, `event_type` first.
    pub fn to_json(&self) -> serde_json::Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(map)) => map,
            // Every variant is a struct of plain fields: nothing else can come out.
            Ok(_) | Err(_) => serde_json::Map::new(),
        }
    }
}

/// What the progress display of a map phase is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProgressUpdate {
    /// A map phase of `total` items starts, `done` of them finished before (a resume);
    /// `shown` is false when the workflow turned the display off.
    Started {
        /// Items in all.
        total: u64,
        /// Items finished before.
        done: u64,
        /// Whether to show anything.
        shown: bool,
    },
    /// The latest counts.
    Counts {
        /// What is done.
        tally: Tally,
        /// The breaker's state (`closed`, `open`, `half-open`, `off`).
        breaker: String,
    },
    /// The map phase ended.
    Finished,
}

/// Shows a run to a person: the binary draws lines and the progress bar on the terminal.
pub trait Reporter: Send + Sync {
    /// A message to show (or not, as `-q` and `-v` say), secrets masked; ITEM names the
    /// map item (`item_3`) whose agent says it.
    fn message(&self, message: &Message, item: Option<&str>);
    /// The progress of a map phase.
    fn progress(&self, update: &ProgressUpdate);
    /// Whether it shows a step's output as it arrives ([`Message::Output`]): the runtime
    /// streams output only to a reporter that shows it.
    fn shows_output(&self) -> bool {
        false
    }
    /// Whether it shows the run's result as it arrives ([`Message::Result`]): the output of
    /// the reduce phase and of a standard run's last step.
    fn shows_results(&self) -> bool {
        false
    }
}

/// A reporter that shows nothing (tests, embedding).
#[derive(Clone, Copy, Debug, Default)]
pub struct Silent;

impl Reporter for Silent {
    fn message(&self, _: &Message, _: Option<&str>) {}
    fn progress(&self, _: &ProgressUpdate) {}
}

/// The map agent an event or a line comes from.
#[derive(Clone, Copy, Debug)]
pub struct AgentIds<'a> {
    /// `agent-<index>`.
    pub agent_id: &'a str,
    /// `item_<index>`.
    pub item_id: &'a str,
}

/// Where every event and line of a run goes: the one place that masks secrets, adds a map
/// agent's ids, writes the events file and notes the first write that failed.
pub struct Sink {
    log: Mutex<EventLog>,
    secrets: Mutex<Secrets>,
    reporter: Arc<dyn Reporter>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("log", &self.log)
            .finish_non_exhaustive()
    }
}

impl Sink {
    /// A sink writing to LOG and showing nothing until [`Sink::report_to`].
    pub fn new(log: EventLog) -> Self {
        Sink {
            log: Mutex::new(log),
            secrets: Mutex::new(Secrets::default()),
            reporter: Arc::new(Silent),
        }
    }

    /// Shows lines and progress with REPORTER.
    pub fn report_to(&mut self, reporter: Arc<dyn Reporter>) {
        self.reporter = reporter;
    }

    /// The secrets masked in everything the run writes and shows.
    pub fn secrets(&self) -> std::sync::MutexGuard<'_, Secrets> {
        lock(&self.secrets)
    }

    /// Writes EVENT, secrets masked; from inside a map agent (AGENT names its ids) it carries the agent's
    /// and the item's ids unless it names them itself. A line that cannot be written is
    /// left out whole and the first failure kept ([`Sink::failure`]).
    pub fn record(&self, event: &Event, agent: Option<AgentIds<'_>>) {
        let mut fields = event.to_json();
        let event_type = match fields.shift_remove("event_type") {
            Some(Value::String(name)) => name,
            _ => String::new(),
        };
        if let Some(agent) = agent {
            fields
                .entry("agent_id")
                .or_insert_with(|| Value::String(agent.agent_id.to_owned()));
            fields
                .entry("item_id")
                .or_insert_with(|| Value::String(agent.item_id.to_owned()));
        }
        let masked = self.secrets().mask_json(Value::Object(fields));
        lock(&self.log).record(&event_type, masked);
    }

    /// Tells the reporter MESSAGE, secrets masked; ITEM names the map item that says it.
    pub fn say(&self, message: Message, item: Option<&str>) {
        let secrets = self.secrets();
        let message = if secrets.is_empty() {
            message
        } else {
            message.masked(&|text| secrets.mask(text))
        };
        drop(secrets);
        self.reporter.message(&message, item);
    }

    /// Tells the progress display.
    pub fn progress(&self, update: &ProgressUpdate) {
        self.reporter.progress(update);
    }

    /// The reporter lines and progress go to.
    pub fn reporter(&self) -> Arc<dyn Reporter> {
        Arc::clone(&self.reporter)
    }

    /// The first event that could not be written, described (path and OS error).
    pub fn failure(&self) -> Option<String> {
        lock(&self.log).failed.clone()
    }

    /// The place the events file's writes have reached ([`crate::spend`]).
    pub fn mark(&self) -> Option<crate::store::EventsMark> {
        lock(&self.log).mark()
    }

    /// The events file.
    pub fn path(&self) -> PathBuf {
        lock(&self.log).path.clone()
    }
}

/// An item's key in an event line, and its finder (built once).
const ITEM: &[u8] = br#""item_id":""#;
static ITEM_FINDER: std::sync::LazyLock<memchr::memmem::FinderRev<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::FinderRev::new(ITEM));

/// What an event line shows without parsing it, as the events file writes every event: it
/// starts with its time and its kind, and ends with its item (and agent).
#[derive(Debug, PartialEq)]
pub(crate) struct Glance<'a> {
    pub(crate) kind: &'a str,
    pub(crate) at: Option<&'a str>,
    pub(crate) item: Option<u64>,
}

impl<'a> Glance<'a> {
    /// The glance at LINE; none when it is not written so (it is then parsed).
    pub(crate) fn of(line: &'a [u8]) -> Option<Glance<'a>> {
        /// The plain string after KEY (`"key":"`) at FROM, when it has no escapes.
        fn string(line: &[u8], from: usize) -> Option<&str> {
            let rest = line.get(from..)?;
            let end = memchr::memchr2(b'"', b'\\', rest)?;
            if rest[end] != b'"' {
                return None;
            }
            std::str::from_utf8(&rest[..end]).ok()
        }
        const AT: &[u8] = br#"{"timestamp":""#;
        const KIND: &[u8] = br#""event_type":""#;
        if !line.starts_with(AT) {
            return None;
        }
        let at = string(line, AT.len())?;
        let after = AT.len() + at.len() + 2;
        if !line.get(after..)?.starts_with(KIND) {
            return None;
        }
        let kind = string(line, after + KIND.len())?;
        // The item is the origin's, written last; a value written before it may hold the
        // same key, so the last one is taken.
        let item = match ITEM_FINDER.rfind(line) {
            Some(at) => Some(item_index(string(line, at + ITEM.len())?)?),
            None => None,
        };
        Some(Glance {
            kind,
            at: Some(at),
            item,
        })
    }
}

/// The kind of the event LINE, read from its bytes without parsing it when it is written as
/// the events file writes every event (`None` otherwise: then parse it).
pub fn kind_of(line: &[u8]) -> Option<&str> {
    Glance::of(line).map(|g| g.kind)
}

/// N of `item_N`.
pub(crate) fn item_index(item_id: &str) -> Option<u64> {
    item_id.strip_prefix("item_")?.parse().ok()
}

/// The verified merge queue (`merge.verify`) as the progress line, `status` and the
/// dashboard show it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueCounts {
    /// Candidates waiting.
    pub queued: u64,
    /// Candidates in the verification running now.
    pub verifying: u64,
    /// Verifications run.
    pub verifications: u64,
    /// Candidates landed.
    pub landed: u64,
    /// Candidates refused.
    pub refused: u64,
    /// Items sent back to their agents.
    pub redispatched: u64,
}

impl QueueCounts {
    /// `verify: batch of 4 running, 3 queued, 2 re-dispatched`.
    #[must_use]
    pub fn text(&self) -> String {
        let running = match self.verifying {
            0 => "idle".to_owned(),
            1 => "1 candidate running".to_owned(),
            n => format!("batch of {n} running"),
        };
        format!(
            "verify: {running}, {} queued, {} landed, {} re-dispatched ({} run{})",
            self.queued,
            self.landed,
            self.redispatched,
            self.verifications,
            if self.verifications == 1 { "" } else { "s" }
        )
    }
}

/// What the map phase has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Items with an outcome.
    pub done: u64,
    /// Agents running.
    pub running: u64,
    /// Items that failed (dead-lettered, skipped or failed).
    pub failed: u64,
    /// Items in the DLQ.
    pub dlq: u64,
    /// Turns the Claude calls running now have taken so far (shown on the bar only: plain
    /// lines stay the same from run to run).
    pub claude_turns: u64,
    /// What the job's Claude calls have cost so far, in millionths of a US dollar
    /// (earlier processes included); whole numbers keep the tally comparable.
    pub claude_micros: u64,
    /// What the items left will cost at the average so far, in millionths of a US dollar
    /// (docs/language.md, "Claude budgets"); `None` before an item finished.
    pub forecast_micros: Option<u64>,
    /// The verified merge queue, when the job has one.
    pub queue: Option<QueueCounts>,
}

impl Tally {
    /// `, Claude $1.20 spent, ~$3.60 more for the items left`, or nothing when nothing
    /// was spent.
    #[must_use]
    pub fn spending(&self) -> String {
        if self.claude_micros == 0 {
            return String::new();
        }
        let dollars =
            |micros: u64| crate::claude::budget::usd(crate::claude::budget::amount(micros) / 1e6);
        let forecast = match self.forecast_micros {
            Some(micros) if micros > 0 => {
                format!(", ~{} more for the items left", dollars(micros))
            }
            Some(_) | None => String::new(),
        };
        format!(", Claude {} spent{forecast}", dollars(self.claude_micros))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file's form: `event_type` names the variant, the fields keep their order, and
    /// optional fields are `null` unless they are left out when empty.
    #[test]
    fn events_serialise_as_their_files_hold_them() {
        let started = Event::WorkflowStarted {
            workflow: None,
            session_id: "s".into(),
            resumed_at_step: 0,
            steps: 2,
        };
        assert_eq!(
            Value::Object(started.to_json()).to_string(),
            r#"{"event_type":"workflow_started","workflow":null,"session_id":"s","resumed_at_step":0,"steps":2}"#
        );
        let finished = Event::WorkflowFinished {
            outcome: crate::store::SessionStatus::Completed,
            failed_step: None,
            failed_continued: 0,
            duration_secs: 1.5,
            claude: None,
        };
        assert_eq!(
            Value::Object(finished.to_json()).to_string(),
            r#"{"event_type":"workflow_finished","outcome":"completed","failed_step":null,"failed_continued":0,"duration_secs":1.5}"#
        );
        let open = Event::CircuitOpen {
            item_id: "item_3".into(),
        };
        assert_eq!(
            Value::Object(open.to_json()).to_string(),
            r#"{"event_type":"CircuitOpen","item_id":"item_3"}"#
        );
        assert_eq!(
            Value::Object(Event::SetupFinished {}.to_json()).to_string(),
            r#"{"event_type":"setup_finished"}"#
        );
        let step = Event::StepStarted {
            step: "build".into(),
            step_index: Some(0),
            step_id: 4,
            log_number: Some(2),
            origin: Some(Origin {
                file: "w.yml".into(),
                line: 7,
            }),
        };
        assert_eq!(
            Value::Object(step.to_json()).to_string(),
            r#"{"event_type":"step_started","step":"build","step_index":0,"step_id":4,"log_number":2,"file":"w.yml","line":7}"#
        );
    }

    #[test]
    fn an_origin_is_the_plans_file_and_the_line_the_planner_found() {
        let plan = crate::testing::Harness::plan(
            "name: demo\ncommands:\n  - shell: make\n  - shell: test\n",
        );
        let second = plan.step(plan.commands[1]).unwrap();
        assert_eq!(
            Origin::of(&plan, second),
            Some(Origin {
                file: "workflow.yml".into(),
                line: 4
            })
        );
        let mut made = second.clone();
        made.line = None;
        assert_eq!(Origin::of(&plan, &made), None);
    }

    fn sink_in(dir: &std::path::Path) -> Sink {
        let layout = crate::layout::Layout {
            home: dir.to_owned(),
            repo: "demo".into(),
        };
        Sink::new(EventLog::open(&layout, "job").unwrap())
    }

    fn lines_of(sink: &Sink) -> Vec<Value> {
        std::fs::read_to_string(sink.path())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Secrets are masked and a map agent's ids added in the sink, for every event.
    #[test]
    fn the_sink_masks_secrets_and_adds_the_agents_ids() {
        let home = tempfile::tempdir().unwrap();
        let sink = sink_in(home.path());
        sink.secrets().add("TOKEN", "hunter2");
        sink.record(
            &Event::StepFailed {
                step: "push".into(),
                error: "auth hunter2 refused".into(),
            },
            Some(AgentIds {
                agent_id: "agent-1",
                item_id: "item_1",
            }),
        );
        sink.record(
            &Event::ItemSkipped {
                item_id: "item_2".into(),
            },
            Some(AgentIds {
                agent_id: "agent-1",
                item_id: "item_1",
            }),
        );
        let events = lines_of(&sink);
        let keys: Vec<&String> = events[0].as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "timestamp",
                "event_type",
                "job_id",
                "step",
                "error",
                "agent_id",
                "item_id"
            ]
        );
        assert_eq!(events[0]["error"], "auth *** refused");
        assert_eq!(events[0]["item_id"], "item_1");
        // An event that names its item keeps it.
        assert_eq!(events[1]["item_id"], "item_2");
        assert!(sink.failure().is_none());
    }

    #[derive(Default)]
    struct Kept(Mutex<Vec<Message>>);

    impl Reporter for Kept {
        fn message(&self, message: &Message, _: Option<&str>) {
            lock(&self.0).push(message.clone());
        }
        fn progress(&self, _: &ProgressUpdate) {}
    }

    /// Lines reach the reporter with the secrets masked.
    #[test]
    fn lines_reach_the_reporter_masked() {
        let home = tempfile::tempdir().unwrap();
        let mut sink = sink_in(home.path());
        let kept = Arc::new(Kept::default());
        sink.report_to(kept.clone());
        sink.secrets().add("TOKEN", "hunter2");
        sink.say(Message::Output("using hunter2".into()), None);
        assert_eq!(lock(&kept.0)[0], Message::Output("using ***".into()));
    }

    fn opt<T>(some: bool, value: T) -> Option<T> {
        some.then_some(value)
    }

    fn words(some: bool) -> Vec<String> {
        if some {
            vec!["a".into(), "b c".into()]
        } else {
            Vec::new()
        }
    }

    fn tokens() -> Tokens {
        Tokens {
            input: 1,
            output: 2,
            cache_read: 3,
            cache_creation: 4,
        }
    }

    fn totals() -> Totals {
        Totals {
            calls: 2,
            failed: 1,
            turns: 7,
            cost_usd: 0.125,
            estimated: 1,
            tokens: tokens(),
        }
    }

    fn metrics() -> ErrorMetrics {
        ErrorMetrics {
            total_items: 4,
            successful: 2,
            failed: 1,
            skipped: 1,
            failure_rate: 0.333_333_333_333_333_3,
            error_types: [("timeout".to_owned(), 3)].into(),
            failure_patterns: vec![crate::mapreduce::metrics::FailurePattern {
                pattern: "timeout".into(),
                frequency: 3,
                suggestion: "raise the timeout".into(),
            }],
        }
    }

    fn task(some: bool) -> crate::backend::task::TaskRef {
        crate::backend::task::TaskRef {
            backend: "slurm".into(),
            id: "12_3".into(),
            node: opt(some, "n1".into()),
        }
    }

    /// One event of every variant, its optional fields set (SOME) or left out.
    #[expect(clippy::too_many_lines, reason = "one constructor per variant")]
    fn every_event(some: bool) -> Vec<Event> {
        vec![
            Event::WorkflowStarted {
                workflow: opt(some, "text with spaces".into()),
                session_id: "text with spaces".into(),
                resumed_at_step: 3,
                steps: 3,
            },
            Event::WorkflowFinished {
                outcome: crate::store::SessionStatus::Failed,
                failed_step: opt(some, "text with spaces".into()),
                failed_continued: 3,
                duration_secs: 1.25,
                claude: opt(some, totals()),
            },
            Event::StepFailedContinued {
                step: "text with spaces".into(),
                step_index: 3,
                handled: some,
            },
            Event::CheckpointSaved {
                next_step: 3,
                status: crate::store::SessionStatus::Failed,
                path: PathBuf::from("/state/x.json"),
            },
            Event::JobCheckpointSaved {
                phase: JobPhase::Map,
                status: Status::Stopped,
                items_processed: 5,
            },
            Event::StepStarted {
                step: "text with spaces".into(),
                step_index: opt(some, 3),
                step_id: 4,
                log_number: opt(some, 7),
                origin: opt(
                    some,
                    Origin {
                        file: "w.yml".into(),
                        line: 12,
                    },
                ),
            },
            Event::StepSkipped {
                step: "text with spaces".into(),
                when: "text with spaces".into(),
            },
            Event::StepFailed {
                step: "text with spaces".into(),
                error: "text with spaces".into(),
            },
            Event::AttemptStarted {
                step: "text with spaces".into(),
                run: 4,
                attempt: 4,
            },
            Event::AttemptFinished {
                step: "text with spaces".into(),
                run: 4,
                attempt: 4,
                exit_code: opt(some, -2),
                timed_out: some,
                success: some,
                duration_secs: 1.25,
            },
            Event::RetryScheduled {
                step: "text with spaces".into(),
                next_attempt: 4,
                delay_secs: 1.25,
            },
            Event::FallbackStarted {
                step: "text with spaces".into(),
            },
            Event::CaptureFailed {
                step: "text with spaces".into(),
                error: "text with spaces".into(),
            },
            Event::ExitCodeHandlerStarted {
                step: "text with spaces".into(),
                exit_code: -2,
            },
            Event::StepFinished {
                step: "text with spaces".into(),
                outcome: StepOutcome::FailedHandled,
                origin: opt(
                    some,
                    Origin {
                        file: "w.yml".into(),
                        line: 12,
                    },
                ),
            },
            Event::InternalError {
                step: "text with spaces".into(),
                state: "text with spaces".into(),
                action: "text with spaces".into(),
            },
            Event::HandlerStarted {
                step: "text with spaces".into(),
                run: 4,
                strategy: prodigy_plan::Strategy::Fallback,
            },
            Event::HandlerFinished {
                step: "text with spaces".into(),
                run: 4,
                success: some,
            },
            Event::SuccessHandlerStarted {
                step: "text with spaces".into(),
            },
            Event::VariableCaptured {
                step: "text with spaces".into(),
                name: "text with spaces".into(),
                format: prodigy_plan::CaptureFormat::Json,
            },
            Event::SetupVariableCaptured {
                name: "text with spaces".into(),
                phase: "text with spaces".into(),
            },
            Event::StepValidationFinished {
                step: "text with spaces".into(),
                round: 4,
                passed: 4,
                checks: 4,
                success: some,
            },
            Event::ValidationFinished {
                step: "text with spaces".into(),
                round: 4,
                completion: 1.25,
                complete: some,
            },
            Event::ClaudeStarted {
                step: "text with spaces".into(),
                program: "text with spaces".into(),
                args: words(some),
                cli_version: opt(some, "text with spaces".into()),
                log: opt(some, PathBuf::from("/state/x.json")),
            },
            Event::ClaudeFinished {
                step: "text with spaces".into(),
                success: some,
                error_kind: opt(some, ErrorKind::RateLimit),
                message: opt(some, "text with spaces".into()),
                session_id: opt(some, "text with spaces".into()),
                num_turns: 4,
                cost_usd: 1.25,
                cost_estimated: some,
                tokens: tokens(),
                tool_calls: 4,
                api_retries: 4,
                exit_code: opt(some, -2),
                log: opt(some, PathBuf::from("/state/x.json")),
                duration_secs: 1.25,
            },
            Event::MergeConflictHandlerStarted {
                source_branch: "text with spaces".into(),
                target_branch: "text with spaces".into(),
                conflicted_files: words(some),
                worktree: PathBuf::from("/state/x.json"),
            },
            Event::MergeConflictHandlerFinished {
                source_branch: "text with spaces".into(),
                success: some,
                error: opt(some, "text with spaces".into()),
            },
            Event::MergeStarted {
                source_branch: "text with spaces".into(),
                target_branch: "text with spaces".into(),
                commits: 3,
            },
            Event::MergeFinished {
                source_branch: "text with spaces".into(),
                target_branch: "text with spaces".into(),
            },
            Event::JobStarted {
                workflow: opt(some, "text with spaces".into()),
                phase: JobPhase::Map,
                job_dir: PathBuf::from("/state/x.json"),
            },
            Event::JobResumed {
                workflow: opt(some, "text with spaces".into()),
                phase: JobPhase::Map,
                job_dir: PathBuf::from("/state/x.json"),
            },
            Event::JobFinished {
                status: Status::Stopped,
                metrics: metrics(),
                dlq_count: 5,
                duration_secs: 1.25,
                claude: opt(some, totals()),
            },
            Event::StateWriteFailed {
                error: "text with spaces".into(),
            },
            Event::JobStopping {
                reason: "text with spaces".into(),
            },
            Event::ClaudeBudgetReached {
                spent: 1.25,
                limit: 1.25,
                not_started: 5,
            },
            Event::SetupLeftUncommitted { paths: words(some) },
            Event::WorktreePrepared {
                path: PathBuf::from("/state/x.json"),
                copied: words(some),
                linked: words(some),
                setup: some,
            },
            Event::SetupStarted { steps: 3 },
            Event::SetupFinished {},
            Event::InputLoaded {
                input: "text with spaces".into(),
                selected: 3,
                filtered: 3,
                distinct: 3,
                items: 3,
                distinct_missing: opt(some, 3),
            },
            Event::MapStarted {
                items: 3,
                pending: 3,
                max_parallel: 3,
            },
            Event::MapFinished {
                successful: 5,
                failed: 5,
                skipped: 5,
                pending: 3,
            },
            Event::AgentStarted {
                agent_id: "text with spaces".into(),
                item_id: "text with spaces".into(),
                attempt: 4,
            },
            Event::AgentCompleted {
                agent_id: "text with spaces".into(),
                item_id: "text with spaces".into(),
                attempt: 4,
                duration_secs: 1.25,
            },
            Event::AgentFailed {
                agent_id: "text with spaces".into(),
                item_id: "text with spaces".into(),
                attempt: 4,
                error_type: "text with spaces".into(),
                error: "text with spaces".into(),
                step: opt(some, "text with spaces".into()),
            },
            Event::AgentCancelled {
                agent_id: "text with spaces".into(),
                item_id: "text with spaces".into(),
            },
            Event::AgentRejected {
                item_id: "text with spaces".into(),
                reason: "text with spaces".into(),
            },
            Event::AgentMerged {
                branch: "text with spaces".into(),
                merge: "text with spaces".into(),
            },
            Event::AgentMergeRecovered {
                item_id: "text with spaces".into(),
                branch: "text with spaces".into(),
                merge_commit: "text with spaces".into(),
            },
            Event::AgentWorktreesSwept {
                worktrees: 3,
                branches: 3,
            },
            Event::AgentWorktreeKept {
                path: PathBuf::from("/state/x.json"),
                branch: "text with spaces".into(),
                uncommitted: words(some),
            },
            Event::AgentMergeFailed {
                branch: "text with spaces".into(),
                error: "text with spaces".into(),
                error_type: "text with spaces".into(),
            },
            Event::MergeQueued {
                item_id: "text with spaces".into(),
            },
            Event::VerifiedLanded {
                candidate: "text with spaces".into(),
                item_ids: words(some),
            },
            Event::IntegrityChecked {
                item_id: "text with spaces".into(),
                verdict: "text with spaces".into(),
                findings: words(some),
            },
            Event::VerifyStarted {
                item_ids: words(some),
                candidate: "text with spaces".into(),
                bisecting: some,
            },
            Event::VerifyFinished {
                item_ids: words(some),
                candidate: "text with spaces".into(),
                passed: some,
                duration_secs: 1.25,
                output: opt(some, "text with spaces".into()),
            },
            Event::MergeRefused {
                item_id: "text with spaces".into(),
                reason: "text with spaces".into(),
                paths: words(some),
            },
            Event::ItemRedispatched {
                item_id: "text with spaces".into(),
                reason: "text with spaces".into(),
                attempt: 3,
            },
            Event::CircuitHalfOpen {
                item_id: "text with spaces".into(),
            },
            Event::CircuitOpen {
                item_id: "text with spaces".into(),
            },
            Event::CircuitClosed {
                item_id: "text with spaces".into(),
            },
            Event::ItemRetryScheduled {
                item_id: "text with spaces".into(),
                next_attempt: 4,
                delay_secs: 1.25,
            },
            Event::ItemSkipped {
                item_id: "text with spaces".into(),
            },
            Event::ItemHandlerStarted {
                item_id: "text with spaces".into(),
                handler: "text with spaces".into(),
            },
            Event::ItemHandlerFinished {
                item_id: "text with spaces".into(),
                success: some,
            },
            Event::DlqItemAdded {
                item_id: "text with spaces".into(),
                error_signature: "text with spaces".into(),
                failure_count: 4,
            },
            Event::DlqItemRepaired {
                item_id: "text with spaces".into(),
                repaired: some,
            },
            Event::DlqRetryStarted { items: 3 },
            Event::DlqItemRemoved {
                item_id: "text with spaces".into(),
            },
            Event::DlqItemUpdated {
                item_id: "text with spaces".into(),
                failure_count: 4,
            },
            Event::DlqRetryFinished {
                retried: 5,
                succeeded: 5,
                still_failing: 5,
            },
            Event::ReduceStarted { steps: 3 },
            Event::ReduceFinished {},
            Event::TaskStarted { task: task(some) },
            Event::TaskSubmitted {
                task: task(some),
                attempt: 4,
            },
            Event::TaskAdopted {
                task: task(some),
                attempt: 4,
            },
            Event::TaskCancelled {
                task: task(some),
                reason: "text with spaces".into(),
            },
            Event::ClaudeLimitReached {
                step: "text with spaces".into(),
                limit_type: "text with spaces".into(),
                resets_at: "text with spaces".into(),
                action: "text with spaces".into(),
                wait_secs: opt(some, 1.25),
            },
            Event::ClaudeLimitLifted {
                step: "text with spaces".into(),
            },
            Event::ClaudeSlotsChanged {
                slots: 3,
                max: 3,
                reason: "text with spaces".into(),
            },
            Event::NotificationFinished {
                event: "text with spaces".into(),
                command: "text with spaces".into(),
                success: some,
                exit_code: opt(some, -2),
                timed_out: some,
                duration_secs: 1.25,
                output: opt(some, PathBuf::from("/logs/step-0003.log")),
            },
            Event::ClaudeCallRepeated {
                step: "text with spaces".into(),
                error_kind: ErrorKind::Overloaded,
                waited_secs: 1.25,
            },
        ]
    }

    /// Each variant's place: a new variant does not compile here until it has one, and then
    /// fails `every_variant_reads_back_as_it_was_written` until [`every_event`] makes one.
    fn variant(event: &Event) -> usize {
        match event {
            Event::WorkflowStarted { .. } => 0,
            Event::WorkflowFinished { .. } => 1,
            Event::StepFailedContinued { .. } => 2,
            Event::CheckpointSaved { .. } => 3,
            Event::JobCheckpointSaved { .. } => 4,
            Event::StepStarted { .. } => 5,
            Event::StepSkipped { .. } => 6,
            Event::StepFailed { .. } => 7,
            Event::AttemptStarted { .. } => 8,
            Event::AttemptFinished { .. } => 9,
            Event::RetryScheduled { .. } => 10,
            Event::FallbackStarted { .. } => 11,
            Event::CaptureFailed { .. } => 12,
            Event::ExitCodeHandlerStarted { .. } => 13,
            Event::StepFinished { .. } => 14,
            Event::InternalError { .. } => 15,
            Event::HandlerStarted { .. } => 16,
            Event::HandlerFinished { .. } => 17,
            Event::SuccessHandlerStarted { .. } => 18,
            Event::VariableCaptured { .. } => 19,
            Event::SetupVariableCaptured { .. } => 20,
            Event::StepValidationFinished { .. } => 21,
            Event::ValidationFinished { .. } => 22,
            Event::ClaudeStarted { .. } => 23,
            Event::ClaudeFinished { .. } => 24,
            Event::MergeConflictHandlerStarted { .. } => 25,
            Event::MergeConflictHandlerFinished { .. } => 26,
            Event::MergeStarted { .. } => 27,
            Event::MergeFinished { .. } => 28,
            Event::JobStarted { .. } => 29,
            Event::JobResumed { .. } => 30,
            Event::JobFinished { .. } => 31,
            Event::StateWriteFailed { .. } => 32,
            Event::JobStopping { .. } => 33,
            Event::ClaudeBudgetReached { .. } => 34,
            Event::SetupLeftUncommitted { .. } => 35,
            Event::WorktreePrepared { .. } => 36,
            Event::SetupStarted { .. } => 37,
            Event::SetupFinished { .. } => 38,
            Event::InputLoaded { .. } => 39,
            Event::MapStarted { .. } => 40,
            Event::MapFinished { .. } => 41,
            Event::AgentStarted { .. } => 42,
            Event::AgentCompleted { .. } => 43,
            Event::AgentFailed { .. } => 44,
            Event::AgentCancelled { .. } => 45,
            Event::AgentRejected { .. } => 46,
            Event::AgentMerged { .. } => 47,
            Event::AgentMergeRecovered { .. } => 48,
            Event::AgentWorktreesSwept { .. } => 49,
            Event::AgentWorktreeKept { .. } => 50,
            Event::AgentMergeFailed { .. } => 51,
            Event::CircuitHalfOpen { .. } => 52,
            Event::CircuitOpen { .. } => 53,
            Event::CircuitClosed { .. } => 54,
            Event::ItemRetryScheduled { .. } => 55,
            Event::ItemSkipped { .. } => 56,
            Event::ItemHandlerStarted { .. } => 57,
            Event::ItemHandlerFinished { .. } => 58,
            Event::DlqItemAdded { .. } => 59,
            Event::DlqItemRepaired { .. } => 60,
            Event::DlqRetryStarted { .. } => 61,
            Event::DlqItemRemoved { .. } => 62,
            Event::DlqItemUpdated { .. } => 63,
            Event::DlqRetryFinished { .. } => 64,
            Event::ReduceStarted { .. } => 65,
            Event::ReduceFinished { .. } => 66,
            Event::TaskStarted { .. } => 67,
            Event::TaskSubmitted { .. } => 68,
            Event::TaskAdopted { .. } => 69,
            Event::TaskCancelled { .. } => 70,
            Event::ClaudeLimitReached { .. } => 71,
            Event::ClaudeLimitLifted { .. } => 72,
            Event::ClaudeSlotsChanged { .. } => 73,
            Event::NotificationFinished { .. } => 74,
            Event::ClaudeCallRepeated { .. } => 75,
            Event::VerifyStarted { .. } => 76,
            Event::VerifyFinished { .. } => 77,
            Event::MergeRefused { .. } => 78,
            Event::ItemRedispatched { .. } => 79,
            Event::MergeQueued { .. } => 80,
            Event::VerifiedLanded { .. } => 81,
            Event::IntegrityChecked { .. } => 82,
        }
    }

    const VARIANTS: usize = 83;

    /// Every variant reads back from its line, as the one it was (`checkpoint_saved`,
    /// `variable_captured` and `dlq_item_added` name two variants each), and writes the
    /// same bytes again.
    #[test]
    fn every_variant_reads_back_as_it_was_written() {
        for some in [true, false] {
            let events = every_event(some);
            let mut missing: Vec<usize> = (0..VARIANTS).collect();
            for event in &events {
                missing.retain(|&i| i != variant(event));
                let line = Value::Object(event.to_json()).to_string();
                let read: Event =
                    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
                assert_eq!(&read, event, "{line}");
                assert_eq!(Value::Object(read.to_json()).to_string(), line);
                assert_eq!(serde_json::to_string(&read).unwrap(), line);
            }
            assert!(
                missing.is_empty(),
                "every_event makes no variant {missing:?}"
            );
        }
    }

    /// What the sink wrote (the envelope's time and job, a map agent's ids added) reads
    /// back as the events it was given.
    #[test]
    fn events_read_back_from_the_file_the_sink_wrote() {
        let home = tempfile::tempdir().unwrap();
        let sink = sink_in(home.path());
        let events = every_event(true);
        for (i, event) in events.iter().enumerate() {
            let agent = (i % 2 == 0).then_some(AgentIds {
                agent_id: "agent-1",
                item_id: "item_1",
            });
            sink.record(event, agent);
        }
        let text = std::fs::read_to_string(sink.path()).unwrap();
        let read: Vec<Event> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect();
        assert_eq!(read, events);
    }
}
