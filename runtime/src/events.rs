//! What a run tells the world: the [`Event`]s written to its events file, the [`Line`]s and
//! [`ProgressUpdate`]s a person sees, and the [`Sink`] every one of them goes through.
//!
//! The runtime never writes to the terminal: it hands lines and progress to a [`Reporter`]
//! (the binary's draws them; [`Silent`] drops them), and events to the [`Sink`], which masks
//! secrets, adds a map agent's ids, writes the events file and keeps the first write that
//! failed, so that the run stops with it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;

use crate::claude::{ErrorKind, Tokens, Totals};
use crate::jobstore::{JobPhase, Status};
use crate::lock;
use crate::machine::Outcome;
use crate::mapreduce::ErrorMetrics;
use crate::message::Message;
use crate::store::EventLog;
use crate::vars::Secrets;

/// Where a step was written: the workflow file and the line its entry starts on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Origin {
    /// The workflow file as the user named it.
    pub file: String,
    /// From 1.
    pub line: u32,
}

impl Origin {
    /// Where STEP of PLAN was written: the plan's file and the line the planner found; none
    /// for a step the compiler made.
    pub fn of(
        plan: &prodigy_compiler::plan::Plan,
        step: &prodigy_compiler::plan::PlanStep,
    ) -> Option<Origin> {
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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
/// is written, and inside a map agent `agent_id` and `item_id`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "event_type")]
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
    #[serde(rename = "checkpoint_saved")]
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
        strategy: prodigy_compiler::plan::Strategy,
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
        format: prodigy_compiler::plan::CaptureFormat,
    },
    /// A setup step's `capture_outputs` set a variable.
    #[serde(rename = "variable_captured")]
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
    #[serde(rename = "dlq_item_added")]
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
        task: crate::backend::TaskRef,
    },
    /// An item's task was submitted to its backend.
    #[serde(rename = "task_submitted")]
    TaskSubmitted {
        /// The task.
        task: crate::backend::TaskRef,
        /// The item's attempt.
        attempt: u32,
    },
    /// A resumed job found an item's task still there and waits for it.
    #[serde(rename = "task_adopted")]
    TaskAdopted {
        /// The task.
        task: crate::backend::TaskRef,
        /// The item's attempt.
        attempt: u32,
    },
    /// An item's task is cancelled.
    #[serde(rename = "task_cancelled")]
    TaskCancelled {
        /// The task.
        task: crate::backend::TaskRef,
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
    },
    /// A Claude call refused as rate limited or overloaded is made again within
    /// `patience`, as the same attempt.
    #[serde(rename = "claude_call_repeated")]
    ClaudeCallRepeated {
        /// The step.
        step: String,
        /// `rate_limit` or `overloaded`.
        error_kind: crate::claude::ErrorKind,
        /// Since the call was first refused.
        waited_secs: f64,
    },
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
        tally: crate::progress::Tally,
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

    /// The events file.
    pub fn path(&self) -> PathBuf {
        lock(&self.log).path.clone()
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
            origin: Some(Origin {
                file: "w.yml".into(),
                line: 7,
            }),
        };
        assert_eq!(
            Value::Object(step.to_json()).to_string(),
            r#"{"event_type":"step_started","step":"build","step_index":0,"step_id":4,"file":"w.yml","line":7}"#
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
}
