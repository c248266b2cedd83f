//! What a run tells a person, as values. The runtime says a [`Message`] (through
//! [`crate::events::Sink::say`], which masks secrets); the reporter the binary gives it
//! decides whether `-q`, `-v` and `-vv` show it and how it reads. The runtime never decides
//! what is shown, nor writes to the terminal.

use std::path::PathBuf;
use std::time::Duration;

use crate::claude::kinds::{Note, Totals};

/// Which list of steps a numbered step belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepList {
    /// A standard workflow's steps or a map agent's template: `[2/5]`.
    Steps,
    /// A MapReduce job's `setup`: `[setup 1/2]`.
    Setup,
    /// A MapReduce job's `reduce`: `[reduce 1/2]`.
    Reduce,
}

/// One thing a run tells a person.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    /// A step starts: its place in its list (from 1) and its label.
    StepStarted {
        /// Which list.
        phase: StepList,
        /// From 1.
        number: usize,
        /// Steps in the list.
        total: usize,
        /// The step's label (`shell: make`).
        label: String,
    },
    /// The step's `description` (`-v`).
    Description(String),
    /// The step is skipped: its `when`, shown at normal verbosity so that a skipped step
    /// never reads as one that ran.
    Skipped {
        /// The condition as written.
        when: String,
        /// Why it is false, when a comparison in it mixed types that never compare
        /// (`"abc" is not a number`).
        reason: Option<String>,
    },
    /// The step runs again after DELAY (`-v`).
    Retrying {
        /// Before the next attempt.
        delay: Duration,
        /// The next attempt, from 1.
        attempt: u32,
    },
    /// A command about to run, as it runs (`-vv`).
    Command(String),
    /// A step's environment variable (`-vv`), secrets masked.
    Env {
        /// The variable.
        name: String,
        /// Its value as shown.
        value: String,
    },
    /// A line a step's command wrote (`-v`).
    Output(String),
    /// A line the run's result step wrote (a reduce step, a standard run's last step):
    /// shown at normal verbosity, as [`Message::Output`] is at `-v`.
    Result(String),
    /// What a Claude call does (`-v`; the session's id and model at `-vv`).
    Claude(Note),
    /// How a step's command ended and how long it took (`-vv`).
    Exited {
        /// The step's label.
        label: String,
        /// `exited 1`, `timed out`, …
        how: String,
        /// How long it ran.
        duration: Duration,
    },
    /// A step failed: `failed: LABEL: DETAIL`, shown even under `-q`.
    StepFailed {
        /// The step's label.
        label: String,
        /// Why, or empty.
        detail: String,
        /// Whether its `on_failure` handler ran and the workflow goes on.
        continued: bool,
    },
    /// A shell command reads an environment variable that prodigy left out of its
    /// environment (said once per step and variable in a run).
    NotExported {
        /// The step's label.
        step: String,
        /// The variable, as the command spells it (`ITEM__BLOB`).
        name: String,
        /// Why it was left out.
        why: String,
    },
    /// What the Claude calls of a run or a job cost.
    ClaudeTotals(Totals),
    /// The Claude budget is reached: no new Claude call starts.
    ClaudeBudgetReached {
        /// The spent amount and the limit.
        reached: crate::claude::budget::Reached,
        /// What is left that will not start: items of a job, steps of a run.
        not_started: u64,
        /// `item` or `step`.
        unit: &'static str,
        /// Whether the running calls are stopped (`on_budget: stop`) rather than finish.
        stops_running: bool,
    },
    /// A `notify:` command failed or timed out; the run goes on as it was.
    NotificationFailed {
        /// The event it fired on.
        event: &'static str,
        /// Its command's label.
        command: String,
        /// Why: its exit code and last line of output, or its timeout.
        why: String,
        /// The file its output is kept in, when it printed any.
        output: Option<std::path::PathBuf>,
    },
    /// A map item failed (`error_collection: immediate`).
    ItemFailed {
        /// `item_N`.
        item: String,
        /// Why.
        why: String,
    },
    /// A batch of map items failed (`error_collection: batched`): `item_N` and why.
    ItemsFailed(Vec<(String, String)>),
    /// Claude calls pause for the account's usage limit: `paused: Claude usage limit
    /// (five_hour), resumes at 07:35:00 UTC`.
    ClaudePaused {
        /// `five_hour`, `seven_day`, ...
        limit_type: String,
        /// When calls start again, as a clock (`07:35:00 UTC`).
        resumes_at: String,
    },
    /// The usage limit's pause is over.
    ClaudeResumed {
        /// The limit.
        limit_type: String,
    },
    /// The rate governor lets SLOTS of MAX Claude calls run at once (`Claude: 2 of 8 slots,
    /// rate limited`); SLOTS equal to MAX: no limit any more.
    ClaudeSlots {
        /// Calls that may run at once.
        slots: usize,
        /// The most that ran at once.
        max: usize,
    },
    /// The run stops for the usage limit (`usage_limit: stop`, or a reset beyond
    /// `max_wait`).
    ClaudeLimitStop {
        /// The limit.
        limit_type: String,
        /// When it resets, as a clock (`07:35:00 UTC`).
        resets_at: String,
        /// The `max_wait` it exceeds; `None` under `usage_limit: stop`.
        max_wait: Option<Duration>,
    },
    /// A bug in prodigy: `internal error: …`, shown even under `-q`.
    Bug(Bug),
    /// An `env_files` entry could not be read; the run goes on without it.
    EnvFileNotLoaded {
        /// The file.
        path: PathBuf,
        /// The OS error.
        why: String,
    },
    /// A step's environment could not be made (under the step).
    EnvFailed(String),
    /// The run's state could not be kept (a checkpoint, the job's files).
    StateLost {
        /// What was not written.
        why: String,
        /// Whether no further step starts because of it.
        stops: bool,
    },
    /// A step's commit failed or a required commit is missing (under the step).
    CommitFailed(String),
    /// A step's `capture` failed (under the step).
    CaptureFailed(String),
    /// A step's `step_validate` failed (under the step).
    StepValidateFailed {
        /// The step's label.
        label: String,
        /// Whether `ignore_validation_failure` lets the step go on.
        ignored: bool,
    },
    /// A validation result does not fit `expected_schema` (under the step).
    ValidationInvalid {
        /// The step's label.
        label: String,
        /// Why.
        why: String,
    },
    /// A validation is below its threshold and has no `on_incomplete` (under the step).
    ValidationIncomplete {
        /// The step's label.
        label: String,
        /// The completion it reported, in percent.
        completion: f64,
        /// The `threshold`, in percent.
        threshold: f64,
    },
    /// A validation is still incomplete after its `on_incomplete` attempts (under the step).
    ValidationGaveUp {
        /// The step's label.
        label: String,
        /// The completion it reported, in percent.
        completion: f64,
        /// The attempts when the workflow fails for it (`fail_workflow`); `None`: it goes on.
        fails_after: Option<u32>,
    },
    /// The prompt an `on_incomplete` handler gives Claude, as rendered (under the step).
    PromptPreview(String),
    /// A MapReduce job fails: why.
    JobFailed(String),
    /// `setup` left paths that no commit holds in the session's worktree.
    SetupLeftovers {
        /// The paths and why each is in no commit.
        left: Vec<crate::worktree::records::Uncommitted>,
        /// The session's worktree.
        worktree: PathBuf,
    },
    /// The map input is not committed and is read from the project instead.
    InputFromProject {
        /// The input as rendered.
        input: String,
        /// The project.
        project: PathBuf,
    },
    /// `json_path` selected nothing from the map input.
    NothingSelected {
        /// The `json_path` as written.
        json_path: String,
        /// The input as rendered.
        input: String,
    },
    /// A map phase's work is merged, but its integration ref could not be deleted.
    IntegrationRefLeft(crate::worktree::records::RefLeft),
    /// Numbers in the map input that no 64-bit value holds reach the items as the strings they
    /// were written as (docs/language.md §7), so that an agent sees their digits unchanged.
    NumbersAsText {
        /// How many there are.
        count: usize,
        /// The first, as written.
        first: String,
    },
    /// Items without the `distinct` field were kept as one.
    DistinctMissing {
        /// The `distinct` expression as written.
        field: String,
        /// How many items lack it.
        missing: usize,
    },
    /// The map input gave ITEMS (`map: 3 items (…)`).
    ItemsLoaded {
        /// The items kept.
        items: usize,
        /// What each stage of the pipeline did, as [`crate::progress::stage_counts`] says it.
        stages: String,
    },
    /// A kept agent worktree could not be noted in the merge journal.
    KeptWorktreeNotNoted {
        /// The worktree.
        path: PathBuf,
        /// Why the journal was not written.
        why: String,
    },
    /// The merge queue refused an item's work, and its agent runs the item again on the
    /// merged work (`merge.redispatch`).
    ItemSentBack {
        /// `item_N`.
        item: String,
        /// `verify_failed`, `conflict` or `protected`.
        reason: &'static str,
        /// The re-dispatch's number, from 1.
        attempt: u32,
        /// `merge.redispatch`.
        of: u32,
    },
    /// A map agent left uncommitted changes: its worktree is kept.
    AgentWorktreeKept {
        /// `item_N`.
        item: String,
        /// How many changes it left.
        changes: usize,
        /// The worktree.
        path: PathBuf,
    },
    /// The end of a map phase could not delete some of the job's agent branches.
    AgentBranchesLeft(crate::worktree::records::BranchesLeft),
    /// The end of a map phase kept idle agent worktrees as spares for the next job
    /// (`worktree.persist`).
    SparesKept {
        /// How many.
        count: usize,
        /// Where: `worktrees/{repo}/`, as `spare-N`.
        dir: PathBuf,
    },
    /// A step left the session worktree off the run's branch: what became of its commits.
    OffBranch(crate::worktree::records::OffBranch),
    /// An agent's merge is found done after a stop; the item is recorded as succeeded.
    MergeRecovered {
        /// `item_N`.
        item: String,
    },
    /// What `prodigy dlq retry` did with an item.
    DlqRetry {
        /// `item_N`.
        item: String,
        /// What happened.
        how: DlqRetried,
    },
    /// The dead letter queue cannot be read: why.
    DlqUnreadable(String),
    /// The dead letter queue's index cannot be written (a stale one does no harm).
    DlqIndexNotWritten(String),
    /// The dead letter queue's damaged index was rebuilt.
    DlqRebuilt(crate::dlq::Rebuilt),
    /// A step's output cannot be kept in its log (under the step).
    StepLogNotKept {
        /// The log file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A Claude call's log cannot be written (under the step).
    ClaudeLogNotWritten {
        /// The log file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A step's `when` cannot be evaluated: the step fails (under the step).
    WhenFailed {
        /// The step's label.
        label: String,
        /// Why.
        why: String,
    },
    /// The session's worktree cannot be prepared: the run does not start, its worktree is
    /// kept. Why.
    SessionNotPrepared(String),
    /// Preparing a worktree found something worth a note.
    WorktreeNote(crate::worktree::records::PrepareNote),
    /// Merging a branch conflicts: `merge.on_conflict` runs.
    MergeConflict {
        /// The branch merged.
        source_branch: String,
        /// The branch merged into.
        target_branch: String,
        /// The conflicted files.
        files: Vec<String>,
        /// Where the handler runs.
        worktree: PathBuf,
    },
    /// The workflow's `merge` steps start.
    MergeStepsStarted {
        /// How many.
        steps: usize,
        /// The session's worktree, where they run.
        worktree: PathBuf,
    },
    /// The map phase starts: PENDING of TOTAL items to run, so many at a time.
    MapStarted {
        /// Items left to run (a resumed job's finished ones are not).
        pending: usize,
        /// Items of the job.
        total: usize,
        /// Agents that run at once.
        max_parallel: usize,
    },
    /// The job's state can no longer be kept: no new agent starts. Why.
    MapStateLost(String),
    /// The error policy stops the job: no new agent starts.
    JobStopping(crate::job::StopReason),
    /// The circuit breaker opened after an item failed: items fail fast until it
    /// half-opens.
    CircuitOpened {
        /// `item_N`, whose failure opened it.
        item: String,
    },
    /// The circuit breaker closed after an item succeeded.
    CircuitClosed {
        /// `item_N`, whose success closed it.
        item: String,
    },
    /// A map agent's worktree cannot be prepared (`worktree:`): its item fails. Why.
    AgentWorktreeNotPrepared(String),
    /// The container engine could not list or remove a job's containers. Why.
    ContainersNotRemoved(String),
    /// `scancel` of a Slurm task failed.
    ScancelFailed {
        /// The task.
        task: crate::backend::task::TaskRef,
        /// Why.
        why: String,
    },
    /// `scancel` of a Slurm task had no answer within WAITED.
    ScancelUnanswered {
        /// The task.
        task: crate::backend::task::TaskRef,
        /// How long it was waited for.
        waited: Duration,
    },
    /// A cancelled Slurm task was not seen leaving the queue within WAITED.
    TaskStillQueued {
        /// The task.
        task: crate::backend::task::TaskRef,
        /// How long it was waited for.
        waited: Duration,
        /// Whether the run was interrupted (Ctrl-C, SIGTERM): it waited only its grace
        /// period, and `resume-job` deals with the task.
        interrupted: bool,
    },
    /// A task's agent could not start on its node, which said why
    /// ([`crate::backend::task::NotStarted`]); its item fails with the same words.
    AgentNotStarted {
        /// The task.
        task: crate::backend::task::TaskRef,
        /// Its node.
        node: String,
        /// Why.
        why: crate::backend::task::NotStarted,
    },
    /// An item's Slurm task waits for the `sbatch` of the item before it in its slot,
    /// which has not answered for a while.
    SbatchWaiting {
        /// The item waiting, from 0.
        item: usize,
        /// The item before it in its slot, from 0.
        previous: usize,
        /// How long that `sbatch` has not answered.
        waited: Duration,
    },
}

/// A bug in prodigy, said as `internal error: …`.
#[derive(Clone, Debug, PartialEq)]
pub enum Bug {
    /// The run asked for a step its plan does not have.
    NoSuchStep(usize),
    /// The checkpoint writer's task stopped.
    CheckpointWriterStopped(String),
    /// A runner already shared was changed.
    RunnerReconfigured,
    /// The Claude gate opened on a usage limit.
    GateOpenedOnLimit,
    /// The run's state machine got an event its state does not take.
    UnexpectedSequenceEvent {
        /// The event, as debugged.
        event: String,
        /// The state, as debugged.
        state: String,
    },
    /// A step's machine reached a state that cannot happen.
    ImpossibleStepState {
        /// The step's label.
        step: String,
    },
    /// The planner gave an item a failure handler the plan does not have: the item goes to
    /// the DLQ.
    HandlerNotInPlan {
        /// The handler's id.
        handler: u32,
        /// `item_N`.
        item: String,
    },
}

/// What `prodigy dlq retry` did with an item.
#[derive(Clone, Debug, PartialEq)]
pub enum DlqRetried {
    /// Its id names no item of the job: left in the queue.
    NotAnItem,
    /// Marked for manual review: not retried.
    ManualReview,
    /// It succeeded and left the queue.
    Succeeded,
    /// It failed again.
    FailedAgain {
        /// Its failures now.
        failures: u32,
        /// The last line of its failure.
        last: String,
    },
}

impl Message {
    /// The message with every text in it passed through MASK (secrets hidden).
    #[must_use]
    #[expect(
        clippy::too_many_lines,
        reason = "table-shaped: one arm per `Message` variant"
    )]
    pub fn masked(self, mask: &dyn Fn(&str) -> String) -> Self {
        match self {
            Message::StepStarted {
                phase,
                number,
                total,
                label,
            } => Message::StepStarted {
                phase,
                number,
                total,
                label: mask(&label),
            },
            Message::Description(text) => Message::Description(mask(&text)),
            Message::Skipped { when, reason } => Message::Skipped {
                when: mask(&when),
                reason: reason.map(|r| mask(&r)),
            },
            Message::Retrying { delay, attempt } => Message::Retrying { delay, attempt },
            Message::Command(text) => Message::Command(mask(&text)),
            Message::Env { name, value } => Message::Env {
                name,
                value: mask(&value),
            },
            Message::Output(line) => Message::Output(mask(&line)),
            Message::Result(line) => Message::Result(mask(&line)),
            Message::Claude(note) => Message::Claude(match note {
                Note::Started { session_id, model } => Note::Started { session_id, model },
                Note::Text(text) => Note::Text(mask(&text)),
                Note::Tool { name, detail } => Note::Tool {
                    name,
                    detail: mask(&detail),
                },
                Note::ApiRetry {
                    attempt,
                    max,
                    error,
                    delay_ms,
                } => Note::ApiRetry {
                    attempt,
                    max,
                    error: mask(&error),
                    delay_ms,
                },
            }),
            Message::Exited {
                label,
                how,
                duration,
            } => Message::Exited {
                label: mask(&label),
                how: mask(&how),
                duration,
            },
            Message::StepFailed {
                label,
                detail,
                continued,
            } => Message::StepFailed {
                label: mask(&label),
                detail: mask(&detail),
                continued,
            },
            Message::NotExported { step, name, why } => Message::NotExported {
                step: mask(&step),
                name,
                why: mask(&why),
            },
            Message::ClaudeTotals(totals) => Message::ClaudeTotals(totals),
            budget @ Message::ClaudeBudgetReached { .. } => budget,
            Message::NotificationFailed {
                event,
                command,
                why,
                output,
            } => Message::NotificationFailed {
                event,
                command: mask(&command),
                why: mask(&why),
                output,
            },
            Message::ItemFailed { item, why } => Message::ItemFailed {
                item,
                why: mask(&why),
            },
            Message::ItemsFailed(items) => Message::ItemsFailed(
                items
                    .into_iter()
                    .map(|(item, why)| (item, mask(&why)))
                    .collect(),
            ),
            Message::ClaudePaused { .. }
            | Message::ClaudeResumed { .. }
            | Message::ClaudeLimitStop { .. }
            | Message::ClaudeSlots { .. }
            | Message::Bug(
                Bug::NoSuchStep(_)
                | Bug::CheckpointWriterStopped(_)
                | Bug::RunnerReconfigured
                | Bug::GateOpenedOnLimit
                | Bug::UnexpectedSequenceEvent { .. }
                | Bug::HandlerNotInPlan { .. },
            )
            | Message::WorktreeNote(_)
            | Message::MergeStepsStarted { .. }
            | Message::SetupLeftovers { .. }
            | Message::DistinctMissing { .. }
            | Message::NumbersAsText { .. }
            | Message::IntegrationRefLeft(_)
            | Message::ItemsLoaded { .. }
            | Message::AgentWorktreeKept { .. }
            | Message::ItemSentBack { .. }
            | Message::SparesKept { .. }
            | Message::OffBranch(_)
            | Message::MergeRecovered { .. }
            | Message::DlqRebuilt(_)
            | Message::MapStarted { .. }
            | Message::JobStopping(_)
            | Message::CircuitOpened { .. }
            | Message::CircuitClosed { .. }
            | Message::ScancelUnanswered { .. }
            | Message::TaskStillQueued { .. }
            | Message::SbatchWaiting { .. }
            // Its node's words: a program path, git's first line; never the job's secret.
            | Message::AgentNotStarted { .. } => self,
            Message::MapStateLost(why) => Message::MapStateLost(mask(&why)),
            Message::AgentWorktreeNotPrepared(why) => Message::AgentWorktreeNotPrepared(mask(&why)),
            Message::ContainersNotRemoved(why) => Message::ContainersNotRemoved(mask(&why)),
            Message::ScancelFailed { task, why } => Message::ScancelFailed {
                task,
                why: mask(&why),
            },
            Message::EnvFileNotLoaded { path, why } => Message::EnvFileNotLoaded {
                path,
                why: mask(&why),
            },
            Message::EnvFailed(why) => Message::EnvFailed(mask(&why)),
            Message::StateLost { why, stops } => Message::StateLost {
                why: mask(&why),
                stops,
            },
            Message::CommitFailed(why) => Message::CommitFailed(mask(&why)),
            Message::CaptureFailed(why) => Message::CaptureFailed(mask(&why)),
            Message::StepValidateFailed { label, ignored } => Message::StepValidateFailed {
                label: mask(&label),
                ignored,
            },
            Message::ValidationInvalid { label, why } => Message::ValidationInvalid {
                label: mask(&label),
                why: mask(&why),
            },
            Message::ValidationIncomplete {
                label,
                completion,
                threshold,
            } => Message::ValidationIncomplete {
                label: mask(&label),
                completion,
                threshold,
            },
            Message::ValidationGaveUp {
                label,
                completion,
                fails_after,
            } => Message::ValidationGaveUp {
                label: mask(&label),
                completion,
                fails_after,
            },
            Message::PromptPreview(text) => Message::PromptPreview(mask(&text)),
            Message::JobFailed(why) => Message::JobFailed(mask(&why)),
            Message::InputFromProject { input, project } => Message::InputFromProject {
                input: mask(&input),
                project,
            },
            Message::NothingSelected { json_path, input } => Message::NothingSelected {
                json_path,
                input: mask(&input),
            },
            Message::KeptWorktreeNotNoted { path, why } => Message::KeptWorktreeNotNoted {
                path,
                why: mask(&why),
            },
            Message::DlqRetry { item, how } => Message::DlqRetry {
                item,
                how: match how {
                    DlqRetried::FailedAgain { failures, last } => DlqRetried::FailedAgain {
                        failures,
                        last: mask(&last),
                    },
                    how @ (DlqRetried::NotAnItem
                    | DlqRetried::ManualReview
                    | DlqRetried::Succeeded) => how,
                },
            },
            Message::DlqUnreadable(why) => Message::DlqUnreadable(mask(&why)),
            Message::AgentBranchesLeft(left) => {
                Message::AgentBranchesLeft(crate::worktree::records::BranchesLeft {
                    why: mask(&left.why),
                    ..left
                })
            }
            Message::DlqIndexNotWritten(why) => Message::DlqIndexNotWritten(mask(&why)),
            Message::Bug(Bug::ImpossibleStepState { step }) => {
                Message::Bug(Bug::ImpossibleStepState { step: mask(&step) })
            }
            Message::StepLogNotKept { path, why } => Message::StepLogNotKept {
                path,
                why: mask(&why),
            },
            Message::ClaudeLogNotWritten { path, why } => Message::ClaudeLogNotWritten {
                path,
                why: mask(&why),
            },
            Message::WhenFailed { label, why } => Message::WhenFailed {
                label: mask(&label),
                why: mask(&why),
            },
            Message::SessionNotPrepared(why) => Message::SessionNotPrepared(mask(&why)),
            Message::MergeConflict {
                source_branch,
                target_branch,
                files,
                worktree,
            } => Message::MergeConflict {
                source_branch: mask(&source_branch),
                target_branch: mask(&target_branch),
                files: files.iter().map(|f| mask(f)).collect(),
                worktree,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every text a message carries is masked.
    #[test]
    fn masking_reaches_every_text() {
        let mask = |text: &str| text.replace("hunter2", "***");
        let message = Message::StepFailed {
            label: "shell: echo hunter2".into(),
            detail: "hunter2 refused".into(),
            continued: false,
        }
        .masked(&mask);
        assert_eq!(
            message,
            Message::StepFailed {
                label: "shell: echo ***".into(),
                detail: "*** refused".into(),
                continued: false,
            }
        );
        let tool = Message::Claude(Note::Tool {
            name: "Bash".into(),
            detail: "curl -H hunter2".into(),
        })
        .masked(&mask);
        assert_eq!(
            tool,
            Message::Claude(Note::Tool {
                name: "Bash".into(),
                detail: "curl -H ***".into(),
            })
        );
        let task = crate::backend::task::TaskRef {
            backend: "slurm".into(),
            id: "12_3".into(),
            node: None,
        };
        let whys = [
            Message::MapStateLost("hunter2".into()),
            Message::AgentWorktreeNotPrepared("hunter2".into()),
            Message::ContainersNotRemoved("hunter2".into()),
            Message::ScancelFailed {
                task: task.clone(),
                why: "hunter2".into(),
            },
        ];
        let masked = [
            Message::MapStateLost("***".into()),
            Message::AgentWorktreeNotPrepared("***".into()),
            Message::ContainersNotRemoved("***".into()),
            Message::ScancelFailed {
                task,
                why: "***".into(),
            },
        ];
        for (message, expected) in whys.into_iter().zip(masked) {
            assert_eq!(message.masked(&mask), expected);
        }
    }
}
