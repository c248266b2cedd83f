//! The terminal reporter: how a run looks to a person. The runtime hands it lines and the
//! progress of map phases ([`prodigy_runtime::events::Reporter`]); it applies `-q`, `-v` and
//! `-vv`, prefixes a map agent's lines with its item, and draws the progress of a map phase
//! (docs/language.md §10): a live bar on a terminal (`indicatif`) with items done, running,
//! failed, dead-lettered, the breaker's state, the rate and the ETA; plain lines when stderr
//! is not a terminal, at most one per 10 % of the items or per 10 s.

use std::io::{IsTerminal as _, Write as _};
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use prodigy_runtime::claude::Note;
use prodigy_runtime::events::{ProgressUpdate, Reporter};
use prodigy_runtime::message::{Bug, DlqRetried, Message, StepList};
use prodigy_runtime::progress::{Tally, count, visible};
use prodigy_runtime::worktree::bootstrap::PrepareNote;
use prodigy_runtime::worktree::{BranchesLeft, Uncommitted, UncommittedKind};
use tokio::time::Instant;

/// `-v`/`-vv` and `-q`, as every command that runs steps takes them.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub(crate) struct Shown {
    /// Show each step's output, a map agent's too (`-v`); also its command, its `env`
    /// (credentials redacted) and its timing (`-vv`).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
    /// Print only the final outcome line and errors (no progress, no step lines).
    #[arg(short, long, conflicts_with = "verbose")]
    pub(crate) quiet: bool,
}

/// Shows a run on stderr, and what its commands print on stdout.
pub(crate) struct Terminal {
    /// `-v` (1) or `-vv` (2).
    verbose: u8,
    /// `-q`: errors only, and no progress display.
    quiet: bool,
    /// The map phase being shown.
    display: Mutex<Option<Display>>,
    /// What the progress display adds about Claude: the usage limit's pause, and the rate
    /// governor's slots while it limits them.
    claude: Mutex<(Option<String>, Option<String>)>,
    /// Commands' output goes to stderr too (`items --run-setup`, whose stdout is the items).
    output_on_stderr: bool,
}

impl Terminal {
    /// A reporter for the command's `-v` and `-q`.
    pub(crate) fn for_flags() -> Self {
        Self::new(crate::verbose(), crate::quiet())
    }

    /// A reporter for `-v` VERBOSE times, or `-q` when QUIET.
    pub(crate) fn new(verbose: u8, quiet: bool) -> Self {
        Terminal {
            verbose,
            quiet,
            display: Mutex::new(None),
            claude: Mutex::new((None, None)),
            output_on_stderr: false,
        }
    }

    /// A reporter for `-v` VERBOSE times, or `-q` when QUIET, that writes commands' output
    /// to stderr too, keeping stdout for what the command itself prints.
    pub(crate) fn on_stderr(verbose: u8, quiet: bool) -> Self {
        Terminal {
            output_on_stderr: true,
            ..Self::new(verbose, quiet)
        }
    }

    /// MESSAGE as it is shown, if it is: `-q` shows only errors, a message that needs `-v`
    /// or `-vv` shows only with it, a map agent's messages need `-v` and start with its item
    /// (ITEM), and what a step says is indented under it.
    fn render(&self, message: &Message, item: Option<&str>) -> Option<String> {
        let needs = verbosity(message).max(u8::from(item.is_some()));
        if needs > self.verbose || (self.quiet && !is_error(message)) {
            return None;
        }
        let text = text(message);
        Some(match item {
            // Every line names its item: parallel agents' lines interleave.
            Some(item) => text
                .lines()
                .map(|line| format!("[{item}] {line}"))
                .collect::<Vec<_>>()
                .join("\n"),
            None if in_step(message) => format!("  {}", text.replace('\n', "\n  ")),
            None => text,
        })
    }
}

impl Terminal {
    /// What the progress display adds about Claude, if anything.
    fn claude_state(&self) -> Option<String> {
        let claude = lock(&self.claude);
        let parts: Vec<&str> = [&claude.0, &claude.1]
            .into_iter()
            .filter_map(Option::as_deref)
            .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

impl Reporter for Terminal {
    fn message(&self, message: &Message, item: Option<&str>) {
        let changed = match message {
            Message::ClaudePaused {
                limit_type,
                resumes_at,
            } => {
                lock(&self.claude).0 = Some(paused_text(limit_type, resumes_at));
                true
            }
            Message::ClaudeResumed { .. } => {
                lock(&self.claude).0 = None;
                true
            }
            Message::ClaudeSlots { slots, max } => {
                lock(&self.claude).1 = (slots < max).then(|| slots_text(*slots, *max));
                true
            }
            _ => false,
        };
        if changed && let Some(d) = lock(&self.display).as_mut() {
            d.redraw(self.claude_state().as_deref());
        }
        let Some(text) = self.render(message, item) else {
            return;
        };
        let display = lock(&self.display);
        let bar = display.as_ref().and_then(|d| d.bar.as_ref());
        if matches!(message, Message::Output(_) | Message::Result(_)) && !self.output_on_stderr {
            print_output(bar, &text);
        } else {
            println(bar, &text);
        }
    }

    fn shows_output(&self) -> bool {
        self.verbose > 0
    }

    fn shows_results(&self) -> bool {
        !self.quiet
    }

    fn progress(&self, update: &ProgressUpdate) {
        let mut display = lock(&self.display);
        match update {
            ProgressUpdate::Started { total, done, shown } => {
                if let Some(old) = display.take() {
                    old.finish();
                }
                *display = Some(Display::start(*total, *done, *shown && !self.quiet));
            }
            ProgressUpdate::Counts { tally, breaker } => {
                if let Some(d) = display.as_mut() {
                    d.update(*tally, breaker, self.claude_state().as_deref());
                }
            }
            ProgressUpdate::Finished => {
                if let Some(d) = display.take() {
                    d.finish();
                }
            }
        }
    }
}

/// How a message is shown: the least `-v` count that shows it (a map agent's messages need
/// at least one), whether it reports an error (shown even under `-q`), and whether it is
/// about the step being run (shown under it, indented; a command's own output goes to
/// stdout as it printed it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Class {
    verbosity: u8,
    error: bool,
    in_step: bool,
}

const NOTE: Class = Class {
    verbosity: 0,
    error: false,
    in_step: false,
};
const ERROR: Class = Class {
    error: true,
    ..NOTE
};
const IN_STEP: Class = Class {
    in_step: true,
    ..NOTE
};
const STEP_ERROR: Class = Class {
    error: true,
    ..IN_STEP
};
const VERBOSE: Class = Class {
    verbosity: 1,
    ..NOTE
};
const VERBOSE_IN_STEP: Class = Class {
    verbosity: 1,
    ..IN_STEP
};
const DEBUG_IN_STEP: Class = Class {
    verbosity: 2,
    ..IN_STEP
};

/// How MESSAGE is shown: one arm per variant, so a new one says all three at once.
fn class(message: &Message) -> Class {
    match message {
        Message::StepStarted { .. }
        | Message::Result(_)
        | Message::NotExported { .. }
        | Message::ClaudeTotals(_)
        | Message::ClaudeBudgetReached { .. }
        | Message::NotificationFailed { .. }
        | Message::ItemFailed { .. }
        | Message::ItemsFailed(_)
        | Message::ClaudePaused { .. }
        | Message::ClaudeResumed { .. }
        | Message::EnvFileNotLoaded { .. }
        | Message::SetupLeftovers { .. }
        | Message::InputFromProject { .. }
        | Message::NothingSelected { .. }
        | Message::DistinctMissing { .. }
        | Message::NumbersAsText { .. }
        | Message::IntegrationRefLeft(_)
        | Message::ItemsLoaded { .. }
        | Message::KeptWorktreeNotNoted { .. }
        | Message::AgentWorktreeKept { .. }
        | Message::ItemSentBack { .. }
        | Message::AgentBranchesLeft(_)
        | Message::SparesKept { .. }
        | Message::MergeRecovered { .. }
        | Message::DlqRetry { .. }
        | Message::DlqIndexNotWritten(_)
        | Message::DlqRebuilt(_)
        | Message::WorktreeNote(_)
        | Message::MergeConflict { .. }
        | Message::MergeStepsStarted { .. }
        | Message::MapStarted { .. }
        | Message::JobStopping(_)
        | Message::CircuitOpened { .. }
        | Message::CircuitClosed { .. }
        | Message::ContainersNotRemoved(_)
        | Message::ScancelFailed { .. }
        | Message::ScancelUnanswered { .. }
        | Message::TaskStillQueued { .. }
        | Message::SbatchWaiting { .. }
        | Message::AgentNotStarted { .. } => NOTE,
        Message::ClaudeLimitStop { .. }
        | Message::Bug(_)
        | Message::StateLost { .. }
        | Message::JobFailed(_)
        | Message::DlqUnreadable(_)
        | Message::SessionNotPrepared(_)
        | Message::MapStateLost(_)
        | Message::OffBranch(_)
        | Message::AgentWorktreeNotPrepared(_) => ERROR,
        Message::Skipped { .. }
        | Message::ValidationIncomplete { .. }
        | Message::PromptPreview(_)
        | Message::StepLogNotKept { .. }
        | Message::ClaudeLogNotWritten { .. } => IN_STEP,
        Message::StepFailed { .. }
        | Message::EnvFailed(_)
        | Message::CommitFailed(_)
        | Message::CaptureFailed(_)
        | Message::ValidationInvalid { .. }
        | Message::WhenFailed { .. } => STEP_ERROR,
        Message::Output(_) | Message::ClaudeSlots { .. } => VERBOSE,
        Message::Description(_) | Message::Retrying { .. } => VERBOSE_IN_STEP,
        Message::Command(_) | Message::Env { .. } | Message::Exited { .. } => DEBUG_IN_STEP,
        Message::Claude(note) => match note {
            Note::Started { .. } => DEBUG_IN_STEP,
            Note::Text(_) | Note::Tool { .. } | Note::ApiRetry { .. } => VERBOSE_IN_STEP,
        },
        Message::StepValidateFailed { ignored, .. } => Class {
            error: !ignored,
            ..IN_STEP
        },
        Message::ValidationGaveUp { fails_after, .. } => Class {
            error: fails_after.is_some(),
            ..IN_STEP
        },
    }
}

/// The least `-v` count that shows MESSAGE.
fn verbosity(message: &Message) -> u8 {
    class(message).verbosity
}

/// Whether MESSAGE reports an error: shown even under `-q`.
fn is_error(message: &Message) -> bool {
    class(message).error
}

/// Whether MESSAGE is about the step being run, so that it is shown under it (indented).
fn in_step(message: &Message) -> bool {
    class(message).in_step
}

/// [`Message::AgentBranchesLeft`]: the first three branches by name, then how many more.
fn branches_left(left: &BranchesLeft) -> String {
    let why = &left.why;
    let fix = "`prodigy worktree clean` deletes them later";
    if left.branches.is_empty() {
        return format!("warning: the agent branches of this job were not deleted: {why}; {fix}");
    }
    let mut names: Vec<String> = left
        .branches
        .iter()
        .take(3)
        .map(|b| format!("`{b}`"))
        .collect();
    if left.branches.len() > 3 {
        names.push(format!("{} more", left.branches.len() - 3));
    }
    let were = if left.branches.len() == 1 {
        "was"
    } else {
        "were"
    };
    format!(
        "warning: {} {were} not deleted ({}): {why}; {fix}",
        count(left.branches.len(), "agent branch"),
        names.join(", ")
    )
}

/// MESSAGE as text, without the indentation of [`in_step`]; it may span
/// lines.
#[expect(
    clippy::too_many_lines,
    reason = "table-shaped: one arm per `Message` variant's text"
)]
fn text(message: &Message) -> String {
    match message {
        Message::StepStarted {
            phase,
            number,
            total,
            label,
        } => match phase {
            StepList::Steps => format!("[{number}/{total}] {label}"),
            StepList::Setup => format!("[setup {number}/{total}] {label}"),
            StepList::Reduce => format!("[reduce {number}/{total}] {label}"),
        },
        Message::Description(text) => format!("({text})"),
        Message::Skipped { when, reason } => match reason {
            Some(reason) => format!("skipped: `when: {when}` is false ({reason})"),
            None => format!("skipped: `when: {when}` is false"),
        },
        Message::Retrying { delay, attempt } => format!(
            "retrying in {} (attempt {attempt})",
            humantime::format_duration(*delay)
        ),
        Message::Command(text) => format!("$ {}", text.trim_end().replace('\n', "\n  ")),
        Message::Env { name, value } => format!("env {name}={value}"),
        Message::Output(line) | Message::Result(line) => line.clone(),
        Message::Claude(note) => note
            .line()
            .lines()
            .map(|line| format!("│ {line}"))
            .collect::<Vec<_>>()
            .join("\n"),
        Message::Exited {
            label,
            how,
            duration,
        } => format!("{label} {how} in {:.3}s", duration.as_secs_f64()),
        Message::StepFailed {
            label,
            detail,
            continued,
        } => {
            let detail = if detail.is_empty() {
                String::new()
            } else {
                format!(": {detail}")
            };
            let continued = if *continued {
                "; its `on_failure` handler ran and the workflow goes on (`fail_workflow` is false)"
            } else {
                ""
            };
            format!("failed: {label}{detail}{continued}")
        }
        Message::NotExported { step, name, why } => format!(
            "warning: `{step}` reads `${name}`, which prodigy left out of its environment: {why}; the variable is empty there (write the value to a file with `write_file` and read that)"
        ),
        Message::ClaudeTotals(totals) => totals.line(),
        Message::NotificationFailed {
            event,
            command,
            why,
            output,
        } => {
            let kept = output.as_ref().map_or_else(String::new, |path| {
                format!("; its output is in {}", path.display())
            });
            format!(
                "warning: the `{event}` notification `{command}` failed ({why}){kept}; the run goes on"
            )
        }
        Message::ClaudeBudgetReached {
            reached,
            not_started,
            unit,
            stops_running,
        } => {
            // A standard run's steps run one at a time: nothing is running then.
            let running = match (*unit, *stops_running) {
                ("step", _) => "",
                (_, true) => ", the running agents are stopped",
                (_, false) => ", the running agents finish",
            };
            format!(
                "stopping: {}; {} not started{running}",
                prodigy_runtime::claude::budget::describe(reached),
                count(*not_started, unit),
            )
        }
        Message::ItemFailed { item, why } => format!("item {item} failed: {why}"),
        Message::ItemsFailed(items) => {
            let lines: Vec<String> = items
                .iter()
                .map(|(item, why)| format!("{item}: {why}"))
                .collect();
            format!(
                "{} failed:\n  {}",
                count(items.len(), "item"),
                lines.join("\n  ")
            )
        }
        Message::ClaudePaused {
            limit_type,
            resumes_at,
        } => paused_text(limit_type, resumes_at),
        Message::ClaudeSlots { slots, max } => slots_text(*slots, *max),
        Message::ClaudeResumed { limit_type } => {
            format!("resumed: Claude usage limit ({limit_type}) lifted")
        }
        Message::ClaudeLimitStop {
            limit_type,
            resets_at,
            max_wait,
        } => {
            let why = match max_wait {
                Some(wait) => format!(
                    "later than `max_wait` ({})",
                    humantime::format_duration(*wait)
                ),
                None => "and `usage_limit` is `stop`".to_owned(),
            };
            format!(
                "stopping: Claude usage limit ({limit_type}) resets at {resets_at}, {why}; running commands end, the run is saved"
            )
        }
        Message::Bug(bug) => format!("internal error: {}", bug_text(bug)),
        Message::EnvFileNotLoaded { path, why } => {
            format!("warning: env file `{}` not loaded: {why}", path.display())
        }
        Message::EnvFailed(why)
        | Message::CommitFailed(why)
        | Message::CaptureFailed(why)
        | Message::JobFailed(why)
        | Message::DlqUnreadable(why)
        | Message::AgentWorktreeNotPrepared(why) => format!("error: {why}"),
        Message::StateLost { why, stops } => {
            if *stops {
                format!("error: {why}; no further step starts")
            } else {
                format!("error: {why}")
            }
        }
        Message::StepValidateFailed { label, ignored } => {
            if *ignored {
                format!(
                    "warning: `step_validate` of `{label}` failed; ignored (`ignore_validation_failure`)"
                )
            } else {
                format!("error: `step_validate` of `{label}` failed")
            }
        }
        Message::ValidationInvalid { label, why } => format!(
            "error: the validation result of `{label}` does not fit `expected_schema`: {why}"
        ),
        Message::ValidationIncomplete {
            label,
            completion,
            threshold,
        } => {
            format!("warning: validation of `{label}` is incomplete ({completion}% < {threshold}%)")
        }
        Message::ValidationGaveUp {
            label,
            completion,
            fails_after,
        } => match fails_after {
            Some(attempts) => format!(
                "error: validation of `{label}` still incomplete after {} ({completion}%)",
                count(*attempts, "attempt")
            ),
            None => format!("warning: validation of `{label}` still incomplete ({completion}%)"),
        },
        Message::PromptPreview(text) => text.clone(),
        Message::SetupLeftovers { left, worktree } => setup_leftovers_text(left, worktree),
        Message::InputFromProject { input, project } => format!(
            "note: `{input}` is not in the run's worktree (it is not committed); reading it from {}",
            project.display()
        ),
        Message::NothingSelected { json_path, input } => format!(
            "warning: `json_path: {json_path}` selected nothing from the map input `{input}`; check the expression against the input with `prodigy items`"
        ),
        Message::DistinctMissing { field, missing } => format!(
            "warning: `distinct: {field}`: {missing} items have no `{}` and were kept as one",
            field.strip_prefix("item.").unwrap_or(field)
        ),
        Message::IntegrationRefLeft(left) => format!(
            "warning: the map phase's work is merged, but `{}` could not be deleted ({}); the next map phase's end deletes it",
            left.name, left.why
        ),
        Message::NumbersAsText { count: 1, first } => format!(
            "note: the map input's number `{first}` is beyond what a 64-bit number holds: items carry it as the string it was written as"
        ),
        Message::NumbersAsText { count, first } => format!(
            "note: {count} numbers in the map input are beyond what a 64-bit number holds (the first: `{first}`): items carry them as the strings they were written as"
        ),
        Message::ItemsLoaded { items, stages } => {
            format!("map: {} ({stages})", count(*items, "item"))
        }
        Message::KeptWorktreeNotNoted { path, why } => format!(
            "warning: {why}: if this process is killed, the end of the map phase may remove {} with its changes",
            path.display()
        ),
        Message::AgentBranchesLeft(left) => branches_left(left),
        Message::OffBranch(off) => format!("warning: {off}"),
        Message::SparesKept { count: n, dir } => format!(
            "kept {} in {} as {} for the next job (`worktree.persist`); `prodigy worktree clean` removes {}",
            count(*n, "worktree"),
            dir.display(),
            if *n == 1 { "a spare" } else { "spares" },
            if *n == 1 { "it" } else { "them" }
        ),
        Message::AgentWorktreeKept {
            item,
            changes,
            path,
        } => format!(
            "warning: {item} left {} in {}; only commits are merged, so that worktree is kept (`prodigy worktree clean` removes it)",
            count(*changes, "uncommitted change"),
            path.display()
        ),
        Message::ItemSentBack {
            item,
            reason,
            attempt,
            of,
        } => format!(
            "{item}: the merge queue refused its work ({reason}); its agent runs it again on the merged work (re-dispatch {attempt} of {of}, `${{verify.output}}` says why)"
        ),
        Message::MergeRecovered { item } => {
            format!("{item}: its work was merged before the job stopped; recorded as succeeded")
        }
        Message::DlqRetry { item, how } => match how {
            DlqRetried::NotAnItem => format!("{item}: not an item of this job; left in the queue"),
            DlqRetried::ManualReview => format!("{item}: marked for manual review; not retried"),
            DlqRetried::Succeeded => {
                format!("{item}: succeeded; removed from the dead letter queue")
            }
            DlqRetried::FailedAgain { failures, last } => {
                format!("{item}: failed again ({failures} failures): {last}")
            }
        },
        Message::DlqIndexNotWritten(why) => format!("warning: cannot write the DLQ index: {why}"),
        Message::DlqRebuilt(rebuilt) => format!("warning: {rebuilt}"),
        Message::StepLogNotKept { path, why } => format!(
            "warning: cannot keep the step's output in {}: {why}",
            path.display()
        ),
        Message::ClaudeLogNotWritten { path, why } => format!(
            "warning: cannot write the Claude log {}: {why}",
            path.display()
        ),
        Message::WhenFailed { label, why } => format!("error: `when` of `{label}`: {why}"),
        Message::SessionNotPrepared(why) => {
            format!("error: {why}; the run does not start, its worktree is kept")
        }
        Message::WorktreeNote(note) => format!("note: {}", prepare_note_text(note)),
        Message::MergeConflict {
            source_branch,
            target_branch,
            files,
            worktree,
        } => format!(
            "merging `{source_branch}` into `{target_branch}` conflicts in {}: running `merge.on_conflict` in {}",
            files.join(", "),
            worktree.display()
        ),
        Message::MergeStepsStarted { steps, worktree } => {
            format!("merge: {} in {}", count(*steps, "step"), worktree.display())
        }
        Message::MapStarted {
            pending,
            total,
            max_parallel,
        } => format!(
            "map: {pending} of {} to run, {max_parallel} at a time",
            count(*total, "item")
        ),
        Message::MapStateLost(why) => format!("error: {why}; no new agents start"),
        Message::JobStopping(reason) => format!(
            "stopping: {}; no new agents start",
            prodigy_runtime::mapreduce::describe(reason)
        ),
        Message::CircuitOpened { .. } => {
            "circuit breaker opened: items fail fast as `CircuitOpen` until it half-opens"
                .to_owned()
        }
        Message::CircuitClosed { .. } => "circuit breaker closed".to_owned(),
        Message::ContainersNotRemoved(why) | Message::ScancelFailed { why, .. } => {
            format!("warning: {why}")
        }
        Message::ScancelUnanswered { task, waited } => format!(
            "warning: `scancel {}` had no answer within {} s",
            task.id,
            waited.as_secs()
        ),
        Message::TaskStillQueued {
            task,
            waited,
            interrupted,
        } => {
            if *interrupted {
                format!(
                    "warning: the Slurm task {} was not seen leaving the queue within {} s of `scancel`; `prodigy resume-job` cancels or adopts it",
                    task.id,
                    waited.as_secs()
                )
            } else {
                format!(
                    "warning: the Slurm task {} is still in the queue a minute after `scancel`",
                    task.id
                )
            }
        }
        Message::AgentNotStarted { task, node, why } => {
            format!("warning: {}", why.on_task(&task.id, node))
        }
        Message::SbatchWaiting {
            item,
            previous,
            waited,
        } => format!(
            "warning: item_{item} waits for the `sbatch` of item_{previous}, before it in its Slurm slot, which has not answered for {} s; it is submitted after it so that at most `max_parallel` tasks run",
            waited.as_secs()
        ),
    }
}

/// What preparing a worktree noted, as `note: …` says it.
fn prepare_note_text(note: &PrepareNote) -> String {
    match note {
        PrepareNote::CopyTracked { entry } => format!(
            "`worktree.copy`: `{entry}` is tracked by git, so every worktree has it already; not copied"
        ),
        PrepareNote::CopyMatchesNothing { entry, source } => format!(
            "`worktree.copy`: `{entry}` matches no untracked file of {}",
            source.display()
        ),
        PrepareNote::CopyThroughLink { file } => format!(
            "`worktree.copy`: `{file}` is inside a linked directory, so the worktree sees it through the link; not copied"
        ),
        PrepareNote::LinkNotADirectory { entry, source } => format!(
            "`worktree.link`: `{entry}` is no directory of {}; not linked",
            source.display()
        ),
        PrepareNote::LinkExists { entry } => format!(
            "`worktree.link`: `{entry}` exists in the worktree already (is it tracked?); not linked"
        ),
    }
}

/// A bug, as `internal error: …` says it.
fn bug_text(bug: &Bug) -> String {
    match bug {
        Bug::NoSuchStep(index) => format!("the run has no step #{index}; please report it"),
        Bug::CheckpointWriterStopped(why) => format!("the checkpoint writer stopped: {why}"),
        Bug::RunnerReconfigured => "a runner in use was reconfigured; please report it".to_owned(),
        Bug::GateOpenedOnLimit => {
            "the Claude gate opened on a usage limit; please report it".to_owned()
        }
        Bug::UnexpectedSequenceEvent { event, state } => {
            format!("the run received {event} while {state}; please report it")
        }
        Bug::ImpossibleStepState { step } => {
            format!("step `{step}` reached a state that cannot happen; please report it")
        }
        Bug::HandlerNotInPlan { handler, item } => {
            format!("handler #{handler} is not in the plan; item {item} goes to the DLQ")
        }
    }
}

/// The paths `setup` left that no commit holds (the first ten, each with why), and what to do.
fn setup_leftovers_text(left: &[Uncommitted], worktree: &std::path::Path) -> String {
    const SHOWN: usize = 10;
    let mut names: Vec<String> = left
        .iter()
        .take(SHOWN)
        .map(|u| match u.kind {
            UncommittedKind::Changed => u.path.clone(),
            UncommittedKind::Ignored => format!("{} (ignored)", u.path),
            UncommittedKind::EmptyDir => format!("{} (empty)", u.path),
        })
        .collect();
    if left.len() > SHOWN {
        names.push(format!("and {} more", left.len() - SHOWN));
    }
    let mut advice = Vec::new();
    if left.iter().any(|u| u.kind != UncommittedKind::EmptyDir) {
        advice.push(
            "commit them in setup (e.g. `git add -A && git commit -m setup`; ignored files need `git add -f`)"
                .to_owned(),
        );
    }
    if let Some(dir) = left.iter().find(|u| u.kind == UncommittedKind::EmptyDir) {
        advice.push(format!(
            "git keeps no empty directory, so make those in the agent template (e.g. `mkdir -p {}`)",
            dir.path.trim_end_matches('/')
        ));
    }
    format!(
        "warning: setup left {} that no commit holds in {}: {}; map agents start from the session's commits and will not see them: {}",
        count(left.len(), "path"),
        worktree.display(),
        names.join(", "),
        advice.join("; ")
    )
}

/// The rate governor's slots, as its line and the progress display show them.
fn slots_text(slots: usize, max: usize) -> String {
    if slots < max {
        prodigy_runtime::live::Slots {
            slots: slots as u64,
            max: max as u64,
        }
        .text()
    } else {
        format!("Claude: {slots} of {max} slots")
    }
}

/// The pause for a usage limit, as its line and the progress display show it.
fn paused_text(limit_type: &str, resumes_at: &str) -> String {
    format!("paused: Claude usage limit ({limit_type}), resumes at {resumes_at}")
}

/// The outcome marks and prefixes that start a line, with their colour: green for what
/// succeeded, red for what failed, yellow for a warning.
const MARKS: [(&str, &str); 7] = [
    ("✓", "32"),
    ("✗", "31"),
    ("error:", "31"),
    ("internal error:", "31"),
    ("failed:", "31"),
    ("⚠", "33"),
    ("warning:", "33"),
];

/// TEXT (already [`visible`]) with the mark or prefix that starts each line coloured, when
/// `--color`, `NO_COLOR` and `TERM` allow colour on stderr ([`crate::color`]).
pub(crate) fn marked(text: &str) -> String {
    if crate::color(std::io::stderr().is_terminal()) {
        paint(text)
    } else {
        text.to_owned()
    }
}

/// TEXT with the mark or prefix ([`MARKS`]) that starts each line (after its indentation)
/// in its colour.
fn paint(text: &str) -> String {
    text.split_inclusive('\n')
        .map(|line| {
            let rest = line.trim_start();
            let indent = &line[..line.len() - rest.len()];
            match MARKS.iter().find(|(mark, _)| rest.starts_with(mark)) {
                Some((mark, code)) => {
                    format!("{indent}\x1b[{code}m{mark}\x1b[0m{}", &rest[mark.len()..])
                }
                None => line.to_owned(),
            }
        })
        .collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes a command's output TEXT to stdout, as `just` does: prodigy's own lines go to
/// stderr, so `prodigy run -v wf.yml > out.txt` keeps the results. The progress bar (on
/// stderr) is cleared while it is written.
fn print_output(bar: Option<&ProgressBar>, text: &str) {
    let text = visible(text);
    let write = || {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{text}");
        let _ = stdout.flush();
    };
    match bar {
        Some(bar) => bar.suspend(write),
        None => write(),
    }
}

/// Prints a line to stderr, above BAR when one is drawn; control characters in it are
/// shown, not sent to the terminal ([`visible`]).
fn println(bar: Option<&ProgressBar>, text: &str) {
    let text = marked(&visible(text));
    if let Some(bar) = bar {
        bar.println(text);
    } else {
        let mut stderr = std::io::stderr().lock();
        let _ = writeln!(stderr, "{text}");
        let _ = stderr.flush();
    }
}

/// The display of one map phase.
struct Display {
    bar: Option<ProgressBar>,
    total: u64,
    started: Instant,
    /// Done count and time of the last plain line.
    last_line: (u64, Instant),
    /// Done count when this process started (resumed jobs).
    done_at_start: u64,
    /// Whether anything is shown.
    shown: bool,
    /// The last counts shown, to draw again when a pause starts or ends.
    last_counts: Option<(Tally, String)>,
}

impl Display {
    /// Starts showing a map phase of TOTAL items, DONE of them already finished; nothing is
    /// shown unless SHOWN.
    fn start(total: u64, done: u64, shown: bool) -> Self {
        let terminal = shown
            && std::io::stderr().is_terminal()
            && !under_ci(std::env::var_os("CI").as_deref());
        let bar = terminal.then(|| {
            let bar = new_bar(total, done, ProgressDrawTarget::stderr());
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        let now = Instant::now();
        Display {
            bar,
            total,
            started: now,
            last_line: (done, now),
            done_at_start: done,
            shown,
            last_counts: None,
        }
    }

    /// Shows the latest counts again, with PAUSED (the usage limit's pause) or without.
    fn redraw(&mut self, paused: Option<&str>) {
        if let (Some(bar), Some((tally, breaker))) = (&self.bar, &self.last_counts) {
            bar.set_message(bar_message(*tally, breaker, paused));
        }
    }

    /// Shows the latest counts, and PAUSED while Claude calls wait for a usage limit.
    fn update(&mut self, tally: Tally, breaker: &str, paused: Option<&str>) {
        self.last_counts = Some((tally, breaker.to_owned()));
        let summary = summary(tally, breaker, paused);
        if let Some(bar) = &self.bar {
            bar.set_position(tally.done);
            bar.set_message(bar_message(tally, breaker, paused));
            return;
        }
        if !self.shown {
            return;
        }
        let now = Instant::now();
        let step = (self.total / 10).max(1);
        let due = tally.done >= self.last_line.0 + step
            || now.duration_since(self.last_line.1) >= Duration::from_secs(10)
            || (tally.done == self.total && self.last_line.0 != self.total);
        if !due {
            return;
        }
        self.last_line = (tally.done, now);
        let speed = Speed::of(
            self.total,
            tally.done,
            self.done_at_start,
            now.duration_since(self.started),
        );
        let eta = speed
            .eta
            .map(|left| format!(", ETA {}", eta_text(left)))
            .unwrap_or_default();
        println(
            None,
            &format!(
                "map: {}/{} done, {summary}, {}{eta}",
                tally.done,
                self.total,
                speed.rate_text()
            ),
        );
    }

    /// Removes the bar.
    fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}

/// The counts of a map phase as its lines show them, PAUSED (the usage limit's pause) last.
fn summary(tally: Tally, breaker: &str, paused: Option<&str>) -> String {
    let mut summary = format!(
        "{} running, {} failed, {} in DLQ, breaker {breaker}{}",
        tally.running,
        tally.failed,
        tally.dlq,
        tally.spending()
    );
    if let Some(queue) = tally.queue {
        summary.push_str(", ");
        summary.push_str(&queue.text());
    }
    match paused {
        Some(paused) => format!("{summary}, {paused}"),
        None => summary,
    }
}

/// The bar's message: the counts, and the turns of the running Claude calls.
fn bar_message(tally: Tally, breaker: &str, paused: Option<&str>) -> String {
    let summary = summary(tally, breaker, paused);
    if tally.claude_turns > 0 {
        format!(
            "{summary}, {} in running Claude calls",
            count(tally.claude_turns, "turn")
        )
    } else {
        summary
    }
}

/// The bar of a map phase of TOTAL items, DONE of them finished before it starts (a resumed
/// job), drawn to TARGET. Its rate and ETA count only the items this process finished, so
/// that a resumed job does not look faster than it is.
fn new_bar(total: u64, done: u64, target: ProgressDrawTarget) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), target);
    let speed = move |state: &indicatif::ProgressState| {
        Speed::of(state.len().unwrap_or(0), state.pos(), done, state.elapsed())
    };
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} map [{bar:30}] {pos}/{len} {msg} {rate} ETA {left}")
    {
        let style = style
            .progress_chars("=> ")
            .with_key(
                "rate",
                move |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = w.write_str(&speed(state).rate_text());
                },
            )
            .with_key(
                "left",
                move |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let text = speed(state).eta.map_or_else(|| "-".to_owned(), eta_text);
                    let _ = w.write_str(&text);
                },
            );
        bar.set_style(style);
    }
    bar.set_position(done);
    bar
}

/// How fast a map phase goes: items per second over the items finished since this process
/// started the phase, and the time left at that rate.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Speed {
    rate: f64,
    eta: Option<Duration>,
}

impl Speed {
    /// Of TOTAL items, DONE are finished, `done_at_start` of them before ELAPSED began.
    fn of(total: u64, done: u64, done_at_start: u64, elapsed: Duration) -> Self {
        let new = done.saturating_sub(done_at_start);
        let secs = elapsed.as_secs_f64();
        #[expect(
            clippy::cast_precision_loss,
            reason = "item counts stay far below 2^52"
        )]
        let rate = if secs > 0.0 { new as f64 / secs } else { 0.0 };
        let eta = (rate > 0.0 && done < total).then(|| {
            #[expect(
                clippy::cast_precision_loss,
                reason = "item counts stay far below 2^52"
            )]
            let left = (total - done) as f64 / rate;
            Duration::from_secs_f64(left.ceil().min(1e9))
        });
        Speed { rate, eta }
    }

    /// `12.3 items/s`: one decimal at most.
    fn rate_text(self) -> String {
        format!("{:.1} items/s", self.rate)
    }
}

/// A time left in whole seconds, as `1m 5s`.
fn eta_text(left: Duration) -> String {
    humantime::format_duration(Duration::from_secs(left.as_secs())).to_string()
}

/// Whether `CI` (its value, `None` when unset) says the run is under CI, where no live bar is
/// drawn even on a terminal: set to anything but empty, `false` or `0` (docs/mapreduce.md;
/// the test binaries apply the same rule).
fn under_ci(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| {
        let v = v.to_string_lossy();
        let v = v.trim();
        !(v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prodigy_runtime::backend::TaskRef;
    use prodigy_runtime::job::StopReason;

    /// `CI=false` or `CI=` on a terminal still gets the live bar; `CI=true` does not.
    #[test]
    fn ci_set_to_false_zero_or_empty_is_not_ci() {
        use std::ffi::OsStr;
        for on in ["true", "1", "github"] {
            assert!(under_ci(Some(OsStr::new(on))), "CI={on}");
        }
        for off in ["", "false", "False", "0"] {
            assert!(!under_ci(Some(OsStr::new(off))), "CI={off}");
        }
        assert!(!under_ci(None));
    }

    /// A usage limit's pause is a line of its own at every verbosity but `-q`, and stays on
    /// the progress display's counts, with the rate governor's slots, until it lifts.
    #[test]
    fn a_claude_pause_and_narrowed_slots_show_on_the_lines_and_the_counts() {
        let paused = Message::ClaudePaused {
            limit_type: "five_hour".into(),
            resumes_at: "07:35 UTC".into(),
        };
        let plain = Terminal::new(0, false);
        assert_eq!(
            plain.render(&paused, None).as_deref(),
            Some("paused: Claude usage limit (five_hour), resumes at 07:35 UTC")
        );
        assert_eq!(Terminal::new(0, true).render(&paused, None), None);
        let stop = Message::ClaudeLimitStop {
            limit_type: "seven_day".into(),
            resets_at: "2026-11-30 09:00 UTC".into(),
            max_wait: Some(Duration::from_hours(6)),
        };
        assert_eq!(
            Terminal::new(0, true).render(&stop, None).as_deref(),
            Some(
                "stopping: Claude usage limit (seven_day) resets at 2026-11-30 09:00 UTC, later than `max_wait` (6h); running commands end, the run is saved"
            )
        );
        plain.message(&paused, None);
        plain.message(&Message::ClaudeSlots { slots: 2, max: 8 }, None);
        assert_eq!(
            plain.claude_state().as_deref(),
            Some(
                "paused: Claude usage limit (five_hour), resumes at 07:35 UTC, Claude: 2 of 8 slots, rate limited"
            )
        );
        let tally = Tally {
            running: 3,
            ..Tally::default()
        };
        assert_eq!(
            summary(tally, "closed", plain.claude_state().as_deref()),
            "3 running, 0 failed, 0 in DLQ, breaker closed, paused: Claude usage limit (five_hour), resumes at 07:35 UTC, Claude: 2 of 8 slots, rate limited"
        );
        plain.message(
            &Message::ClaudeResumed {
                limit_type: "five_hour".into(),
            },
            None,
        );
        plain.message(&Message::ClaudeSlots { slots: 8, max: 8 }, None);
        assert_eq!(plain.claude_state(), None);
    }

    /// Each line's mark or prefix gets its colour; the rest of the line stays as it was.
    #[test]
    fn outcome_marks_and_prefixes_are_coloured() {
        assert_eq!(
            paint("✓ job done\n  error: no file\nplain ✗\n⚠ some failed"),
            "\x1b[32m✓\x1b[0m job done\n  \x1b[31merror:\x1b[0m no file\nplain ✗\n\x1b[33m⚠\x1b[0m some failed"
        );
        assert_eq!(paint("warning: slow\n"), "\x1b[33mwarning:\x1b[0m slow\n");
    }

    /// `-q` keeps errors only; `-v` and `-vv` add their messages; an agent's message names
    /// its item; what a step says is indented under it.
    #[test]
    fn quiet_and_verbose_decide_which_messages_show() {
        let step = Message::StepStarted {
            phase: StepList::Steps,
            number: 1,
            total: 2,
            label: "build".into(),
        };
        let error = Message::JobFailed("no such file".into());
        let output = Message::Output("compiled".into());
        let command = Message::Command("make\ntest".into());
        let normal = Terminal::new(0, false);
        let quiet = Terminal::new(0, true);
        let verbose = Terminal::new(1, false);
        let very = Terminal::new(2, false);
        assert_eq!(normal.render(&step, None).as_deref(), Some("[1/2] build"));
        assert_eq!(normal.render(&output, None), None);
        assert_eq!(normal.render(&step, Some("item_3")), None);
        assert_eq!(quiet.render(&step, None), None);
        assert_eq!(
            quiet.render(&error, None).as_deref(),
            Some("error: no such file")
        );
        assert_eq!(
            quiet.render(&Message::Description("slow".into()), None),
            None
        );
        assert_eq!(verbose.render(&output, None).as_deref(), Some("compiled"));
        assert_eq!(verbose.render(&command, None), None);
        assert_eq!(
            verbose.render(&step, Some("item_3")).as_deref(),
            Some("[item_3] [1/2] build")
        );
        assert_eq!(
            very.render(&command, None).as_deref(),
            Some("  $ make\n    test")
        );
        assert!(!normal.shows_output() && verbose.shows_output());
        // The run's result (reduce, a standard run's last step) needs no `-v`, and `-q`
        // drops it.
        let result = Message::Result("3 of 3 succeeded".into());
        assert_eq!(
            normal.render(&result, None).as_deref(),
            Some("3 of 3 succeeded")
        );
        assert_eq!(quiet.render(&result, None), None);
        assert!(normal.shows_results() && !quiet.shows_results());
        // Each line of an agent's message names its item.
        let note = Message::Claude(Note::Text("first\nsecond".into()));
        assert_eq!(
            verbose.render(&note, Some("item_3")).as_deref(),
            Some("[item_3] │ first\n[item_3] │ second")
        );
    }

    /// How each kind of message reads, and which `-v` shows it.
    #[test]
    fn messages_render_as_people_read_them() {
        let cases = [
            (
                Message::StepStarted {
                    phase: StepList::Setup,
                    number: 1,
                    total: 2,
                    label: "shell: make".into(),
                },
                "[setup 1/2] shell: make",
                0,
            ),
            (
                Message::Retrying {
                    delay: Duration::from_secs(2),
                    attempt: 2,
                },
                "retrying in 2s (attempt 2)",
                1,
            ),
            (Message::Command("make\ntest".into()), "$ make\n  test", 2),
            (
                Message::StepFailed {
                    label: "shell: make".into(),
                    detail: "exit code 2".into(),
                    continued: false,
                },
                "failed: shell: make: exit code 2",
                0,
            ),
            (
                Message::ItemsFailed(vec![
                    ("item_1".into(), "boom".into()),
                    ("item_4".into(), "bang".into()),
                ]),
                "2 items failed:\n  item_1: boom\n  item_4: bang",
                0,
            ),
            (
                Message::ItemFailed {
                    item: "item_1".into(),
                    why: "boom".into(),
                },
                "item item_1 failed: boom",
                0,
            ),
            (
                Message::NotExported {
                    step: "cat \"$ITEM__BLOB\"".into(),
                    name: "ITEM__BLOB".into(),
                    why: "its value is over 100 kB".into(),
                },
                "warning: `cat \"$ITEM__BLOB\"` reads `$ITEM__BLOB`, which prodigy left out of its environment: its value is over 100 kB; the variable is empty there (write the value to a file with `write_file` and read that)",
                0,
            ),
        ];
        for (message, shown, needs) in cases {
            assert_eq!(text(&message), shown);
            assert_eq!(verbosity(&message), needs, "{shown}");
        }
        assert!(is_error(&Message::JobFailed("x".into())));
        assert!(!is_error(&Message::Description("x".into())));
        assert!(in_step(&Message::Description("x".into())));
        assert!(!in_step(&Message::JobFailed("x".into())));
    }

    /// The typed messages read as the free text the runtime wrote before them did, with
    /// the same prefix, place (under the step or not) and `-q` behaviour.
    #[test]
    #[expect(
        clippy::too_many_lines,
        reason = "a test: one case per message variant, read top to bottom"
    )]
    fn typed_messages_read_as_their_free_text_did() {
        let label = || "shell: make".to_owned();
        let task = || TaskRef {
            backend: "slurm".into(),
            id: "12_3".into(),
            node: None,
        };
        let left = vec![
            Uncommitted {
                path: "out/".into(),
                kind: UncommittedKind::EmptyDir,
            },
            Uncommitted {
                path: "notes.txt".into(),
                kind: UncommittedKind::Changed,
            },
            Uncommitted {
                path: "build.log".into(),
                kind: UncommittedKind::Ignored,
            },
        ];
        // (message, text, an error (shown under -q), under the step)
        let cases = [
            (
                Message::Bug(Bug::NoSuchStep(3)),
                "internal error: the run has no step #3; please report it",
                true,
                false,
            ),
            (
                Message::Bug(Bug::CheckpointWriterStopped("panicked".into())),
                "internal error: the checkpoint writer stopped: panicked",
                true,
                false,
            ),
            (
                Message::Bug(Bug::RunnerReconfigured),
                "internal error: a runner in use was reconfigured; please report it",
                true,
                false,
            ),
            (
                Message::Bug(Bug::GateOpenedOnLimit),
                "internal error: the Claude gate opened on a usage limit; please report it",
                true,
                false,
            ),
            (
                Message::Bug(Bug::UnexpectedSequenceEvent {
                    event: "Saved(None)".into(),
                    state: "Ready".into(),
                }),
                "internal error: the run received Saved(None) while Ready; please report it",
                true,
                false,
            ),
            (
                Message::EnvFileNotLoaded {
                    path: "/p/.env".into(),
                    why: "gone".into(),
                },
                "warning: env file `/p/.env` not loaded: gone",
                false,
                false,
            ),
            (Message::EnvFailed("gone".into()), "error: gone", true, true),
            (
                Message::StateLost {
                    why: "disk full".into(),
                    stops: true,
                },
                "error: disk full; no further step starts",
                true,
                false,
            ),
            (
                Message::StateLost {
                    why: "disk full".into(),
                    stops: false,
                },
                "error: disk full",
                true,
                false,
            ),
            (
                Message::CommitFailed("no commit".into()),
                "error: no commit",
                true,
                true,
            ),
            (
                Message::CaptureFailed("bad json".into()),
                "error: bad json",
                true,
                true,
            ),
            (
                Message::StepValidateFailed {
                    label: label(),
                    ignored: false,
                },
                "error: `step_validate` of `shell: make` failed",
                true,
                true,
            ),
            (
                Message::StepValidateFailed {
                    label: label(),
                    ignored: true,
                },
                "warning: `step_validate` of `shell: make` failed; ignored (`ignore_validation_failure`)",
                false,
                true,
            ),
            (
                Message::ValidationInvalid {
                    label: label(),
                    why: "no `status`".into(),
                },
                "error: the validation result of `shell: make` does not fit `expected_schema`: no `status`",
                true,
                true,
            ),
            (
                Message::ValidationIncomplete {
                    label: label(),
                    completion: 62.5,
                    threshold: 100.0,
                },
                "warning: validation of `shell: make` is incomplete (62.5% < 100%)",
                false,
                true,
            ),
            (
                Message::ValidationGaveUp {
                    label: label(),
                    completion: 80.0,
                    fails_after: Some(1),
                },
                "error: validation of `shell: make` still incomplete after 1 attempt (80%)",
                true,
                true,
            ),
            (
                Message::ValidationGaveUp {
                    label: label(),
                    completion: 80.0,
                    fails_after: None,
                },
                "warning: validation of `shell: make` still incomplete (80%)",
                false,
                true,
            ),
            (
                Message::PromptPreview("fix it".into()),
                "fix it",
                false,
                true,
            ),
            (
                Message::JobFailed("setup timed out after 1s".into()),
                "error: setup timed out after 1s",
                true,
                false,
            ),
            (
                Message::SetupLeftovers {
                    left,
                    worktree: "/wt/s".into(),
                },
                "warning: setup left 3 paths that no commit holds in /wt/s: out/ (empty), notes.txt, build.log (ignored); map agents start from the session's commits and will not see them: commit them in setup (e.g. `git add -A && git commit -m setup`; ignored files need `git add -f`); git keeps no empty directory, so make those in the agent template (e.g. `mkdir -p out`)",
                false,
                false,
            ),
            (
                Message::InputFromProject {
                    input: "items.json".into(),
                    project: "/p".into(),
                },
                "note: `items.json` is not in the run's worktree (it is not committed); reading it from /p",
                false,
                false,
            ),
            (
                Message::NothingSelected {
                    json_path: "$.x[*]".into(),
                    input: "items.json".into(),
                },
                "warning: `json_path: $.x[*]` selected nothing from the map input `items.json`; check the expression against the input with `prodigy items`",
                false,
                false,
            ),
            (
                Message::DistinctMissing {
                    field: "item.id".into(),
                    missing: 2,
                },
                "warning: `distinct: item.id`: 2 items have no `id` and were kept as one",
                false,
                false,
            ),
            (
                Message::NumbersAsText {
                    count: 2,
                    first: "123456789012345678901".into(),
                },
                "note: 2 numbers in the map input are beyond what a 64-bit number holds (the first: `123456789012345678901`): items carry them as the strings they were written as",
                false,
                false,
            ),
            (
                Message::ItemsLoaded {
                    items: 1,
                    stages: "1 read".into(),
                },
                "map: 1 item (1 read)",
                false,
                false,
            ),
            (
                Message::AgentBranchesLeft(BranchesLeft {
                    branches: ["a", "b", "c", "d", "e"].map(String::from).to_vec(),
                    why: "cannot lock ref".into(),
                }),
                "warning: 5 agent branches were not deleted (`a`, `b`, `c`, 2 more): cannot lock ref; `prodigy worktree clean` deletes them later",
                false,
                false,
            ),
            (
                Message::AgentBranchesLeft(BranchesLeft {
                    branches: vec!["a".into()],
                    why: "cannot lock ref".into(),
                }),
                "warning: 1 agent branch was not deleted (`a`): cannot lock ref; `prodigy worktree clean` deletes them later",
                false,
                false,
            ),
            (
                Message::AgentBranchesLeft(BranchesLeft {
                    branches: Vec::new(),
                    why: "not a git repository".into(),
                }),
                "warning: the agent branches of this job were not deleted: not a git repository; `prodigy worktree clean` deletes them later",
                false,
                false,
            ),
            (
                Message::KeptWorktreeNotNoted {
                    path: "/wt/a".into(),
                    why: "cannot write".into(),
                },
                "warning: cannot write: if this process is killed, the end of the map phase may remove /wt/a with its changes",
                false,
                false,
            ),
            (
                Message::AgentWorktreeKept {
                    item: "item_2".into(),
                    changes: 2,
                    path: "/wt/a".into(),
                },
                "warning: item_2 left 2 uncommitted changes in /wt/a; only commits are merged, so that worktree is kept (`prodigy worktree clean` removes it)",
                false,
                false,
            ),
            (
                Message::MergeRecovered {
                    item: "item_2".into(),
                },
                "item_2: its work was merged before the job stopped; recorded as succeeded",
                false,
                false,
            ),
            (
                Message::DlqRetry {
                    item: "x".into(),
                    how: DlqRetried::NotAnItem,
                },
                "x: not an item of this job; left in the queue",
                false,
                false,
            ),
            (
                Message::DlqRetry {
                    item: "item_1".into(),
                    how: DlqRetried::ManualReview,
                },
                "item_1: marked for manual review; not retried",
                false,
                false,
            ),
            (
                Message::DlqRetry {
                    item: "item_1".into(),
                    how: DlqRetried::Succeeded,
                },
                "item_1: succeeded; removed from the dead letter queue",
                false,
                false,
            ),
            (
                Message::DlqRetry {
                    item: "item_1".into(),
                    how: DlqRetried::FailedAgain {
                        failures: 3,
                        last: "boom".into(),
                    },
                },
                "item_1: failed again (3 failures): boom",
                false,
                false,
            ),
            (
                Message::DlqUnreadable("damaged".into()),
                "error: damaged",
                true,
                false,
            ),
            (
                Message::DlqIndexNotWritten("denied".into()),
                "warning: cannot write the DLQ index: denied",
                false,
                false,
            ),
            (
                Message::Bug(Bug::ImpossibleStepState { step: label() }),
                "internal error: step `shell: make` reached a state that cannot happen; please report it",
                true,
                false,
            ),
            (
                Message::StepLogNotKept {
                    path: "/logs/s/3-make.log".into(),
                    why: "disk full".into(),
                },
                "warning: cannot keep the step's output in /logs/s/3-make.log: disk full",
                false,
                true,
            ),
            (
                Message::ClaudeLogNotWritten {
                    path: "/logs/s/3-claude.jsonl".into(),
                    why: "disk full".into(),
                },
                "warning: cannot write the Claude log /logs/s/3-claude.jsonl: disk full",
                false,
                true,
            ),
            (
                Message::WhenFailed {
                    label: label(),
                    why: "`x` is not defined".into(),
                },
                "error: `when` of `shell: make`: `x` is not defined",
                true,
                true,
            ),
            (
                Message::SessionNotPrepared("cannot prepare the worktree /wt/s: denied".into()),
                "error: cannot prepare the worktree /wt/s: denied; the run does not start, its worktree is kept",
                true,
                false,
            ),
            (
                Message::WorktreeNote(PrepareNote::CopyTracked {
                    entry: "README".into(),
                }),
                "note: `worktree.copy`: `README` is tracked by git, so every worktree has it already; not copied",
                false,
                false,
            ),
            (
                Message::WorktreeNote(PrepareNote::CopyMatchesNothing {
                    entry: "*.env".into(),
                    source: "/p".into(),
                }),
                "note: `worktree.copy`: `*.env` matches no untracked file of /p",
                false,
                false,
            ),
            (
                Message::WorktreeNote(PrepareNote::CopyThroughLink {
                    file: "cache/lib".into(),
                }),
                "note: `worktree.copy`: `cache/lib` is inside a linked directory, so the worktree sees it through the link; not copied",
                false,
                false,
            ),
            (
                Message::WorktreeNote(PrepareNote::LinkNotADirectory {
                    entry: "cache".into(),
                    source: "/p".into(),
                }),
                "note: `worktree.link`: `cache` is no directory of /p; not linked",
                false,
                false,
            ),
            (
                Message::WorktreeNote(PrepareNote::LinkExists {
                    entry: "cache".into(),
                }),
                "note: `worktree.link`: `cache` exists in the worktree already (is it tracked?); not linked",
                false,
                false,
            ),
            (
                Message::MergeConflict {
                    source_branch: "prodigy-agent-1".into(),
                    target_branch: "prodigy-s".into(),
                    files: vec!["a.txt".into(), "b.txt".into()],
                    worktree: "/wt/m".into(),
                },
                "merging `prodigy-agent-1` into `prodigy-s` conflicts in a.txt, b.txt: running `merge.on_conflict` in /wt/m",
                false,
                false,
            ),
            (
                Message::MergeStepsStarted {
                    steps: 1,
                    worktree: "/wt/s".into(),
                },
                "merge: 1 step in /wt/s",
                false,
                false,
            ),
            (
                Message::MapStarted {
                    pending: 2,
                    total: 3,
                    max_parallel: 4,
                },
                "map: 2 of 3 items to run, 4 at a time",
                false,
                false,
            ),
            (
                Message::MapStateLost("cannot write /h/job.json: disk full".into()),
                "error: cannot write /h/job.json: disk full; no new agents start",
                true,
                false,
            ),
            (
                Message::JobStopping(StopReason::MaxFailures(3)),
                "stopping: `max_failures` (3) items failed; no new agents start",
                false,
                false,
            ),
            (
                Message::CircuitOpened {
                    item: "item_4".into(),
                },
                "circuit breaker opened: items fail fast as `CircuitOpen` until it half-opens",
                false,
                false,
            ),
            (
                Message::CircuitClosed {
                    item: "item_5".into(),
                },
                "circuit breaker closed",
                false,
                false,
            ),
            (
                Message::Bug(Bug::HandlerNotInPlan {
                    handler: 2,
                    item: "item_1".into(),
                }),
                "internal error: handler #2 is not in the plan; item item_1 goes to the DLQ",
                true,
                false,
            ),
            (
                Message::AgentWorktreeNotPrepared("`worktree.setup` failed: exit code 1".into()),
                "error: `worktree.setup` failed: exit code 1",
                true,
                false,
            ),
            (
                Message::ContainersNotRemoved("`podman rm -f c1` failed: no such container".into()),
                "warning: `podman rm -f c1` failed: no such container",
                false,
                false,
            ),
            (
                Message::ScancelFailed {
                    task: task(),
                    why: "`scancel 12_3` failed: denied".into(),
                },
                "warning: `scancel 12_3` failed: denied",
                false,
                false,
            ),
            (
                Message::ScancelUnanswered {
                    task: task(),
                    waited: Duration::from_mins(1),
                },
                "warning: `scancel 12_3` had no answer within 60 s",
                false,
                false,
            ),
            (
                Message::TaskStillQueued {
                    task: task(),
                    waited: Duration::from_mins(1),
                    interrupted: false,
                },
                "warning: the Slurm task 12_3 is still in the queue a minute after `scancel`",
                false,
                false,
            ),
            (
                Message::TaskStillQueued {
                    task: task(),
                    waited: Duration::from_secs(10),
                    interrupted: true,
                },
                "warning: the Slurm task 12_3 was not seen leaving the queue within 10 s of `scancel`; `prodigy resume-job` cancels or adopts it",
                false,
                false,
            ),
            (
                Message::AgentNotStarted {
                    task: task(),
                    node: "n2".into(),
                    why: prodigy_runtime::backend::noshare::NotStarted::NoProgram {
                        program: "/opt/prodigy".into(),
                    },
                },
                "warning: the Slurm task 12_3 could not start its agent on n2: `/opt/prodigy` does not exist there (install prodigy at that path on every node, or name the nodes' program with `PRODIGY_SLURM_PROGRAM`)",
                false,
                false,
            ),
            (
                Message::SbatchWaiting {
                    item: 5,
                    previous: 1,
                    waited: Duration::from_secs(30),
                },
                "warning: item_5 waits for the `sbatch` of item_1, before it in its Slurm slot, which has not answered for 30 s; it is submitted after it so that at most `max_parallel` tasks run",
                false,
                false,
            ),
        ];
        for (message, shown, error, under_step) in cases {
            assert_eq!(text(&message), shown);
            assert_eq!(verbosity(&message), 0, "{shown}");
            assert_eq!(is_error(&message), error, "{shown}");
            assert_eq!(in_step(&message), under_step, "{shown}");
        }
    }

    #[test]
    fn a_resumed_phase_counts_only_the_items_it_finished() {
        // 90 of 100 items were done before the resume; 5 more in 10 s is 0.5 items/s, and
        // the last 5 take 10 s more (not 95 items in 10 s, which would say 1 s).
        let speed = Speed::of(100, 95, 90, Duration::from_secs(10));
        assert_eq!(speed.rate_text(), "0.5 items/s");
        assert_eq!(speed.eta, Some(Duration::from_secs(10)));
        let fresh = Speed::of(100, 0, 0, Duration::from_secs(3));
        assert_eq!(
            (fresh.rate_text().as_str(), fresh.eta),
            ("0.0 items/s", None)
        );
    }

    #[test]
    fn rates_have_one_decimal_at_most() {
        let speed = Speed::of(1000, 7, 0, Duration::from_secs(3));
        assert_eq!(speed.rate_text(), "2.3 items/s");
        assert_eq!(eta_text(Duration::from_millis(65_700)), "1m 5s");
    }

    /// A terminal that keeps what is drawn on it.
    #[derive(Debug, Default, Clone)]
    struct Screen(std::sync::Arc<Mutex<String>>);

    impl indicatif::TermLike for Screen {
        fn width(&self) -> u16 {
            200
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, line: &str) -> std::io::Result<()> {
            lock(&self.0).push_str(line);
            lock(&self.0).push('\n');
            Ok(())
        }
        fn write_str(&self, text: &str) -> std::io::Result<()> {
            lock(&self.0).push_str(text);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_bar_shows_the_rate_with_one_decimal_and_counts_only_new_items() {
        let screen = Screen::default();
        let bar = new_bar(
            100_000,
            90_000,
            ProgressDrawTarget::term_like(Box::new(screen.clone())),
        );
        std::thread::sleep(Duration::from_millis(60));
        bar.set_position(90_001);
        bar.tick();
        let drawn = lock(&screen.0).clone();
        assert!(drawn.contains("90001/100000"), "{drawn:?}");
        let rate = regex::Regex::new(r"([0-9]+)(\.[0-9]+)? items/s").unwrap();
        let found = rate
            .captures_iter(&drawn)
            .last()
            .unwrap_or_else(|| panic!("no rate in {drawn:?}"));
        assert!(
            found.get(2).is_none_or(|d| d.as_str().len() == 2),
            "more than one decimal: {drawn:?}"
        );
        // One new item in 60 ms or more: at most 17 items/s, where counting the 90 000
        // items done before would make thousands.
        let whole: u64 = found[1].parse().unwrap();
        assert!(whole < 1000, "the items done before count: {drawn:?}");
        assert!(
            !regex::Regex::new(r"[0-9]/s").unwrap().is_match(&drawn),
            "indicatif's own rate (4 decimals) is shown: {drawn:?}"
        );
    }
}
