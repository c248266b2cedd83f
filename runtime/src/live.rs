//! The live picture of one run or job (`prodigy status`, `prodigy ui`), folded from what it
//! writes under `$PRODIGY_HOME` as it runs: its checkpoint (through [`runs::find`]), its
//! events files (every process's, so a resumed job counts what earlier ones did), its DLQ
//! and the streams of the Claude calls running now.
//!
//! Read-only, and incremental: [`Live::refresh`] reads only what the files gained since the
//! last call (each file's offset is remembered; a line still being written waits for its
//! end), so a dashboard over a growing file reads it once. What is kept per item is a row
//! and the offsets of its event lines, so memory grows with the items, not with their
//! output; an item's detail ([`Live::item`]) reads its lines back.

use crate::events::{Glance, item_index};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Serialize;
use serde_json::Value;

use crate::backend::TaskRef;
use crate::claude::Stream;
use crate::layout::{Layout, RunKind};
use crate::runs::{self, Summary};

/// The most of an item's input shown in a row.
const SHORT: usize = 80;
/// The most of a step's output an item's detail shows: its end.
pub const OUTPUT_TAIL: u64 = 4 << 10;
/// The most read from a file at once (a refresh reads a growing file in chunks to its end).
const CHUNK: u64 = 2 << 20;

/// Why a run cannot be watched.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum LiveError {
    /// No run or job has the id.
    #[error("no run or job `{0}` under the prodigy home")]
    #[diagnostic(code(prodigy::live::unknown))]
    Unknown(String),
    /// Its checkpoint cannot be read.
    #[error("the checkpoint of `{id}` cannot be read: {why}")]
    #[diagnostic(code(prodigy::live::unreadable))]
    Unreadable {
        /// The id.
        id: String,
        /// Why.
        #[source]
        why: runs::ReadError,
    },
}

pub use crate::runs::State;

/// The counts of a job's items (a standard run's steps).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// In all (0 until the input is loaded).
    pub total: u64,
    /// Succeeded.
    pub succeeded: u64,
    /// Failed.
    pub failed: u64,
    /// Skipped by the policy.
    pub skipped: u64,
    /// Running now.
    pub running: u64,
    /// Not finished and not running.
    pub pending: u64,
    /// In the dead letter queue.
    pub dlq: u64,
    /// Retries scheduled (of items, and of steps).
    pub retries: u64,
}

/// What the Claude calls cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spend {
    /// Calls ended.
    pub calls: u64,
    /// Turns taken.
    pub turns: u64,
    /// US dollars.
    pub cost_usd: f64,
    /// The cost of the items left, at the average finished item's (a job's map phase).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forecast_usd: Option<f64>,
}

/// A usage-limit pause.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pause {
    /// `five_hour`, `seven_day`, ….
    pub limit_type: String,
    /// When it resets (RFC 3339).
    pub resets_at: String,
}

/// The Claude rate governor holding fewer calls than ran at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Slots {
    /// Calls that may run at once now.
    pub slots: u64,
    /// The most that ran at once.
    pub max: u64,
}

impl Slots {
    /// `Claude: 2 of 8 slots, rate limited`, as `status`, the dashboard and the progress
    /// line say it.
    pub fn text(self) -> String {
        format!("Claude: {} of {} slots, rate limited", self.slots, self.max)
    }
}

/// The verified merge queue as `status` and the dashboard show it: its counts, and what
/// the last failed verification printed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueView {
    /// The counts.
    #[serde(flatten)]
    pub counts: crate::events::QueueCounts,
    /// The items whose work is being verified now.
    pub verifying_items: Vec<String>,
    /// What the last failed verification printed, with the items it held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<QueueFailure>,
}

/// A failed verification, as the queue's view keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueFailure {
    /// The items of the candidate.
    pub item_ids: Vec<String>,
    /// What the failing step printed.
    pub output: String,
}

/// The queue as the fold keeps it: its view, and the items waiting.
#[derive(Clone, Debug, Default)]
struct QueueFold {
    view: QueueView,
    waiting: BTreeSet<String>,
}

impl QueueFold {
    /// Takes in one of the queue's events, KIND, of LINE.
    fn take(&mut self, kind: &str, line: &Line<'_>) {
        let items = || -> Vec<String> {
            line.item_ids
                .iter()
                .flatten()
                .map(|i| i.as_ref().to_owned())
                .collect()
        };
        let item = line.item_id.as_deref().map(str::to_owned);
        let counts = &mut self.view.counts;
        match kind {
            "merge_queued" => {
                self.waiting.extend(item);
            }
            "verify_started" => {
                let items = items();
                for i in &items {
                    self.waiting.remove(i);
                }
                counts.verifying = items.len() as u64;
                counts.verifications += 1;
                self.view.verifying_items = items;
            }
            "verify_finished" => {
                counts.verifying = 0;
                self.view.verifying_items.clear();
                if line.passed == Some(false) {
                    self.view.last_failure = Some(QueueFailure {
                        item_ids: items(),
                        output: line.output.as_deref().unwrap_or_default().to_owned(),
                    });
                }
            }
            "merge_refused" => {
                counts.refused += 1;
                if let Some(item) = &item {
                    self.waiting.remove(item);
                }
            }
            "item_redispatched" => counts.redispatched += 1,
            "agent_merged" => {
                counts.landed += 1;
                if let Some(item) = &item {
                    self.waiting.remove(item);
                }
            }
            _ => {}
        }
        self.view.counts.queued = self.waiting.len() as u64;
    }

    /// ITEM's agent ended: its work waits no more (landed without a verification, refused,
    /// or the agent stopped).
    fn ended(&mut self, item: &str) {
        self.waiting.remove(item);
        self.view.counts.queued = self.waiting.len() as u64;
    }
}

/// One agent (or a standard run's own step) working now.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Agent {
    /// `agent-N`, or `run` for a standard run's steps and a job's setup and reduce.
    pub agent_id: String,
    /// `item_N`, for a map agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item_id: Option<String>,
    /// The item's attempt.
    pub attempt: u32,
    /// The step running now.
    pub step: Option<String>,
    /// Its plan id.
    pub step_id: Option<u32>,
    /// When the agent started (RFC 3339).
    pub started_at: String,
    /// Seconds since then.
    pub elapsed_secs: f64,
    /// A Claude call running now: its last tool call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// A Claude call running now: turns so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turns: Option<u32>,
    /// Its task on the agent backend (`--executor slurm|container`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskRef>,
}

/// One step of the plan as the agents go through it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StepLive {
    /// Its plan id.
    pub step_id: u32,
    /// Its label.
    pub label: String,
    /// Agents (or the run) in it now.
    pub running: u64,
    /// Times it succeeded.
    pub succeeded: u64,
    /// Times it failed.
    pub failed: u64,
    /// Retries of it scheduled.
    pub retries: u64,
}

/// How an item stands now, as the read model shows it: waiting, running or retrying, or how
/// it ended (the outcome its record holds, [`crate::jobstore::ItemStatus`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Standing {
    /// Not started.
    Pending,
    /// An agent works on it.
    Running,
    /// Waits for a retry.
    Retrying,
    /// Succeeded.
    Succeeded,
    /// Failed (in the DLQ unless skipped).
    Failed,
    /// Skipped by the policy.
    Skipped,
}

/// One item's row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ItemRow {
    /// `item_N`.
    pub item_id: String,
    /// N.
    pub index: u64,
    /// How it stands.
    pub status: Standing,
    /// Attempts started.
    pub attempts: u32,
    /// The last finished attempt's duration.
    pub duration_secs: Option<f64>,
    /// Its Claude calls' cost.
    pub cost_usd: f64,
    /// The agent that ran it last.
    pub agent_id: Option<String>,
    /// Its last task on the agent backend (`--executor slurm|container`): the backend, its
    /// id there and the node that ran it when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskRef>,
    /// Whether it is in the DLQ.
    pub in_dlq: bool,
    /// Why it failed last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The item as the input gave it, shortened.
    pub short: String,
    /// Where its event lines are: (events file, byte offset).
    #[serde(skip)]
    lines: Vec<(u16, u64)>,
}

/// The whole picture at one moment (what `prodigy status --json` prints, without the item
/// rows).
#[derive(Clone, Debug, Serialize)]
pub struct Picture {
    /// The run or job.
    pub summary: Summary,
    /// How it stands.
    pub state: State,
    /// The usage-limit pause, while paused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause: Option<Pause>,
    /// The Claude rate governor, while it holds fewer calls than ran at once (`Claude: 2 of
    /// 8 slots, rate limited`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claude_slots: Option<Slots>,
    /// A job's phase (`setup`, `map`, `reduce`), from its events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The verified merge queue (`merge.verify`), when the job has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueView>,
    /// The item counts (a standard run: its steps).
    pub counts: Counts,
    /// The Claude spend.
    pub spend: Spend,
    /// The breaker (`closed`, `open`, `half_open`), for a job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaker: Option<&'static str>,
    /// Items finished a minute in the map phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub items_per_min: Option<f64>,
    /// Seconds left at that rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eta_secs: Option<f64>,
    /// Seconds since it started (until it ended, when it did).
    pub duration_secs: f64,
    /// The agents working now.
    pub agents: Vec<Agent>,
    /// The steps, in plan order.
    pub steps: Vec<StepLive>,
    /// Why it stopped, when the job said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopping: Option<String>,
    /// How far its events are read, while a first read of many is not done (the rest of
    /// the picture is then what was read so far).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reading: Option<Reading>,
}

/// How far a run's events files are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Reading {
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes in them.
    pub total_bytes: u64,
}

/// One item in full: its row, its events, its DLQ entry and its Claude calls.
#[derive(Clone, Debug, Serialize)]
pub struct ItemDetail {
    /// Its row.
    pub row: ItemRow,
    /// The item as the input gave it.
    pub data: Option<Value>,
    /// Its events, in order.
    pub events: Vec<Value>,
    /// Its DLQ entry.
    pub dlq: Option<crate::dlq::DeadLetteredItem>,
    /// Its Claude calls, as `prodigy logs --show` renders them.
    pub claude: Vec<ClaudeCall>,
    /// Its steps' outputs, in the order they ran, with the attempt each belongs to.
    pub outputs: Vec<StepOutput>,
}

/// One step's output as its log keeps it (`step-NNNN.log` and `.json` in the item's logs).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepOutput {
    /// The item's attempt it ran in (0 when no attempt's start is known).
    pub attempt: u32,
    /// Its number in the item's logs.
    pub number: u32,
    /// The step's label (none while it runs, or when its run was killed).
    pub step: Option<String>,
    /// How it ended (none while it runs, or when its run was killed).
    pub outcome: Option<String>,
    /// From its start to its end.
    pub duration_secs: Option<f64>,
    /// Bytes of output in its log.
    pub output_bytes: u64,
    /// The last [`OUTPUT_TAIL`] bytes of its output, from a line's start.
    pub tail: String,
    /// Whether the tail leaves out earlier output.
    pub truncated: bool,
    /// The log file (none when the step printed nothing).
    pub log: Option<PathBuf>,
}

/// One Claude call rendered for people.
#[derive(Clone, Debug, Serialize)]
pub struct ClaudeCall {
    /// The log file.
    pub log: PathBuf,
    /// Its lines: the session, text, tool calls, API retries.
    pub lines: Vec<String>,
    /// How it ended, when it did: the final text.
    pub result: Option<String>,
    /// Turns.
    pub turns: u32,
    /// Tool calls.
    pub tool_calls: u32,
}

/// What the fold reads of an event line (serde skips the other fields without building
/// them, which makes the first read of a large job's events several times faster).
#[derive(Debug, Default, serde::Deserialize)]
struct Line<'a> {
    #[serde(borrow)]
    event_type: Option<Cow<'a, str>>,
    #[serde(borrow)]
    timestamp: Option<Cow<'a, str>>,
    #[serde(borrow)]
    item_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    agent_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    step: Option<Cow<'a, str>>,
    #[serde(borrow)]
    phase: Option<Cow<'a, str>>,
    #[serde(borrow)]
    action: Option<Cow<'a, str>>,
    #[serde(borrow)]
    limit_type: Option<Cow<'a, str>>,
    #[serde(borrow)]
    resets_at: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reason: Option<Cow<'a, str>>,
    #[serde(borrow)]
    error: Option<Cow<'a, str>>,
    #[serde(borrow)]
    log: Option<Cow<'a, str>>,
    #[serde(borrow)]
    outcome: Option<Cow<'a, str>>,
    /// How a job ended (`job_finished`).
    #[serde(borrow)]
    status: Option<Cow<'a, str>>,
    #[serde(borrow)]
    slurm_job_id: Option<Cow<'a, str>>,
    /// A task event's backend-neutral reference (`task_submitted`, `task_adopted`).
    #[serde(borrow)]
    task: Option<LineTask<'a>>,
    step_id: Option<u64>,
    attempt: Option<u64>,
    items: Option<u64>,
    steps: Option<u64>,
    num_turns: Option<u64>,
    slurm_task_id: Option<u64>,
    /// Claude calls that may run at once, and the most that ran (`claude_slots_changed`).
    slots: Option<u64>,
    max: Option<u64>,
    cost_usd: Option<f64>,
    duration_secs: Option<f64>,
    /// The items of a candidate of the verified merge queue (`verify_started`, …).
    #[serde(borrow)]
    item_ids: Option<Vec<Cow<'a, str>>>,
    /// Whether a verification passed (`verify_finished`).
    passed: Option<bool>,
    /// What a failed verification printed (`verify_finished`).
    #[serde(borrow)]
    output: Option<Cow<'a, str>>,
}

/// The task a task event names.
#[derive(Debug, serde::Deserialize)]
struct LineTask<'a> {
    #[serde(borrow)]
    backend: Cow<'a, str>,
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow, default)]
    node: Option<Cow<'a, str>>,
}

impl Line<'_> {
    /// The text field KEY.
    fn text(&self, key: &str) -> Option<String> {
        let field = match key {
            "event_type" => &self.event_type,
            "timestamp" => &self.timestamp,
            "item_id" => &self.item_id,
            "agent_id" => &self.agent_id,
            "step" => &self.step,
            "phase" => &self.phase,
            "action" => &self.action,
            "limit_type" => &self.limit_type,
            "resets_at" => &self.resets_at,
            "reason" => &self.reason,
            "error" => &self.error,
            "log" => &self.log,
            "outcome" => &self.outcome,
            "status" => &self.status,
            "slurm_job_id" => &self.slurm_job_id,
            _ => return None,
        };
        field.as_deref().map(str::to_owned)
    }

    /// The number field KEY.
    fn number(&self, key: &str) -> Option<u64> {
        match key {
            "step_id" => self.step_id,
            "attempt" => self.attempt,
            "items" => self.items,
            "steps" => self.steps,
            "num_turns" => self.num_turns,
            "slurm_task_id" => self.slurm_task_id,
            "slots" => self.slots,
            "max" => self.max,
            _ => None,
        }
    }
}

/// The events [`Live::fold`] reads (its `match` names these; the others are only placed),
/// sorted. Its tests hold it to [`crate::events::vocabulary`]: every event is here or in
/// `NOT_FOLDED`, with why.
const FOLDED: &[&str] = &[
    "CircuitClosed",
    "CircuitHalfOpen",
    "CircuitOpen",
    "agent_cancelled",
    "agent_completed",
    "agent_failed",
    "agent_merged",
    "agent_rejected",
    "agent_started",
    "claude_budget_reached",
    "claude_finished",
    "claude_limit_lifted",
    "claude_limit_reached",
    "claude_slots_changed",
    "claude_started",
    "dlq_item_added",
    "dlq_item_removed",
    "dlq_item_updated",
    "dlq_retry_finished",
    "dlq_retry_started",
    "input_loaded",
    "item_redispatched",
    "item_retry_scheduled",
    "item_skipped",
    "job_finished",
    "job_resumed",
    "job_started",
    "job_stopping",
    "map_started",
    "merge_queued",
    "merge_refused",
    "reduce_started",
    "retry_scheduled",
    "setup_started",
    "slurm_task_adopted",
    "slurm_task_submitted",
    "step_finished",
    "step_skipped",
    "step_started",
    "task_adopted",
    "task_submitted",
    "verify_finished",
    "verify_started",
    "workflow_finished",
    "workflow_started",
];

/// Whether [`Live::fold`] reads events of KIND.
fn folded(kind: &str) -> bool {
    FOLDED.binary_search(&kind).is_ok()
}

/// A file read as it grows.
#[derive(Debug, Default)]
struct Tail {
    offset: u64,
}

impl Tail {
    /// Hands EACH the complete lines PATH gained since the last call (up to a chunk), with
    /// each line's offset; whether there was any.
    fn read(&mut self, path: &Path, each: &mut dyn FnMut(u64, &[u8])) -> bool {
        let Ok(mut file) = std::fs::File::open(path) else {
            return false;
        };
        let Ok(len) = file.metadata().map(|m| m.len()) else {
            return false;
        };
        if len < self.offset {
            // Cut back (a failed write is cut back): read what is there again.
            self.offset = 0;
        }
        if len == self.offset || file.seek(SeekFrom::Start(self.offset)).is_err() {
            return false;
        }
        let mut bytes = Vec::new();
        if file
            .take((len - self.offset).min(CHUNK))
            .read_to_end(&mut bytes)
            .is_err()
        {
            return false;
        }
        let Some(end) = memchr::memrchr(b'\n', &bytes) else {
            if bytes.len() as u64 == CHUNK {
                // A line longer than a chunk is no event: skipped, not waited for.
                self.offset += CHUNK;
                return true;
            }
            return false;
        };
        let mut start = 0;
        for stop in memchr::memchr_iter(b'\n', &bytes[..=end]) {
            each(self.offset + start as u64, &bytes[start..stop]);
            start = stop + 1;
        }
        self.offset += end as u64 + 1;
        true
    }
}

/// The events files of one run or job (one per process, named by its start, so their names
/// sort in order), read as they grow: the one reader of events files that `prodigy status`,
/// `prodigy ui` and `prodigy graph --status` share. Only complete lines are handed on (a line
/// still being written waits for its end), a chunk at a time, so memory stays bounded by the
/// chunk whatever the files' size; each file's offset is kept between calls.
#[derive(Debug)]
pub struct EventFiles {
    dir: PathBuf,
    files: Vec<(PathBuf, Tail)>,
}

impl EventFiles {
    /// The events files in DIR (nothing is read until [`EventFiles::read`]).
    pub fn new(dir: PathBuf) -> EventFiles {
        EventFiles {
            dir,
            files: Vec::new(),
        }
    }

    /// Hands EACH every complete line the files gained since the last call, oldest file
    /// first, with its file's number (for [`EventFiles::path`]) and its byte offset. After
    /// each chunk, SPENT says whether to stop there (the rest is read by the next call).
    /// Returns whether any line was read, and whether SPENT cut the reading.
    pub fn read(
        &mut self,
        each: &mut dyn FnMut(u16, u64, &[u8]),
        spent: &dyn Fn() -> bool,
    ) -> (bool, bool) {
        let mut names: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        for name in names {
            if !self.files.iter().any(|(p, _)| *p == name) {
                self.files.push((name, Tail::default()));
            }
        }
        let mut any = false;
        for (index, (path, tail)) in self.files.iter_mut().enumerate() {
            let file = u16::try_from(index).unwrap_or(u16::MAX);
            while tail.read(path, &mut |offset, line| {
                any = true;
                each(file, offset, line);
            }) {
                if spent() {
                    return (any, true);
                }
            }
        }
        (any, false)
    }

    /// The path of file number FILE.
    pub fn path(&self, file: u16) -> Option<&Path> {
        self.files.get(usize::from(file)).map(|(p, _)| p.as_path())
    }

    /// The bytes read so far, and the files' sizes now.
    fn progress(&self) -> (u64, u64) {
        self.files
            .iter()
            .fold((0, 0), |(read, size), (path, tail)| {
                let len = std::fs::metadata(path).map_or(0, |m| m.len());
                (read + tail.offset.min(len), size + len)
            })
    }
}

/// A running Claude call's stream, read as it grows.
#[derive(Debug, Default)]
struct Call {
    log: PathBuf,
    tail: Tail,
    stream: Stream,
    tool: Option<String>,
}

/// Who does what now: a map agent, or the run itself.
#[derive(Debug, Clone)]
struct Actor {
    item_id: Option<String>,
    attempt: u32,
    started_at: String,
    step: Option<(u32, String)>,
    task: Option<TaskRef>,
}

/// A run or job being watched.
#[derive(Debug)]
pub struct Live {
    home: PathBuf,
    id: String,
    summary: Summary,
    events: EventFiles,
    job_dir: Option<PathBuf>,
    shorts_loaded: bool,
    // The fold.
    phase: Option<String>,
    pause: Option<Pause>,
    slots: Option<Slots>,
    breaker: Option<&'static str>,
    stopping: Option<String>,
    queue: Option<QueueFold>,
    counts: Counts,
    spend: Spend,
    items: BTreeMap<u64, ItemRow>,
    dlq: BTreeSet<String>,
    steps: BTreeMap<u32, StepLive>,
    actors: BTreeMap<String, Actor>,
    calls: BTreeMap<String, Call>,
    first_at: Option<String>,
    last_at: Option<String>,
    map_started_at: Option<String>,
    finished_in_map: u64,
    ended: bool,
    reading: Option<Reading>,
}

impl Live {
    /// Starts watching ID under HOME (nothing is read until [`Live::refresh`]).
    pub fn open(home: &Path, id: &str) -> Result<Live, LiveError> {
        let summary = load(home, id)?;
        let layout = Layout {
            home: home.to_owned(),
            repo: summary.repo.clone(),
        };
        let job_dir = (summary.kind == RunKind::Job).then(|| layout.job_dir(id));
        Ok(Live {
            home: home.to_owned(),
            id: id.to_owned(),
            events: EventFiles::new(layout.events_dir(id)),
            summary,
            job_dir,
            shorts_loaded: false,
            phase: None,
            pause: None,
            slots: None,
            breaker: None,
            stopping: None,
            queue: None,
            counts: Counts::default(),
            spend: Spend::default(),
            items: BTreeMap::new(),
            dlq: BTreeSet::new(),
            steps: BTreeMap::new(),
            actors: BTreeMap::new(),
            calls: BTreeMap::new(),
            first_at: None,
            last_at: None,
            map_started_at: None,
            finished_in_map: 0,
            ended: false,
            reading: None,
        })
    }

    /// The id watched.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Reads what the files gained; true when anything changed.
    pub fn refresh(&mut self) -> bool {
        self.refresh_within(None)
    }

    /// Reads what the files gained, for at most about BUDGET when one is given (a chunk at a
    /// time): what is left is read by the next calls, and meanwhile the picture says how far
    /// the reading got ([`Picture::reading`]). True when anything changed.
    pub fn refresh_within(&mut self, budget: Option<std::time::Duration>) -> bool {
        let start = tokio::time::Instant::now();
        let spent = || budget.is_some_and(|b| start.elapsed() >= b);
        let mut changed = false;
        if let Ok(summary) = load(&self.home, &self.id) {
            changed |= summary.updated_at != self.summary.updated_at
                || summary.state != self.summary.state;
            self.summary = summary;
        }
        let mut events = std::mem::replace(&mut self.events, EventFiles::new(PathBuf::new()));
        let (read, cut) = events.read(
            &mut |file, offset, line| {
                // An event the fold does not read (most of an agent's: its attempts, its
                // commands) is only placed, from its bytes, not parsed.
                if let Some(glance) = Glance::of(line)
                    && !folded(glance.kind)
                {
                    self.place(&glance, file, offset);
                    return;
                }
                // Only the fields the fold reads, from the bytes; the rest is skipped unbuilt.
                if let Ok(event) = serde_json::from_slice::<Line<'_>>(line) {
                    self.fold(&event, file, offset);
                }
            },
            &spent,
        );
        changed |= read;
        // How far the reading got, when the budget cut it.
        let (read, size) = events.progress();
        self.events = events;
        let reading = cut.then_some(Reading {
            read_bytes: read,
            total_bytes: size,
        });
        changed |= reading != self.reading;
        self.reading = reading;
        if !self.shorts_loaded
            && let Some(dir) = &self.job_dir
            && let Ok(text) = std::fs::File::open(crate::layout::items(dir)).and_then(|mut f| {
                let mut s = Vec::new();
                f.read_to_end(&mut s).map(|_| s)
            })
            && let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(&text)
        {
            self.shorts_loaded = true;
            if self.counts.total == 0 {
                self.counts.total = items.len() as u64;
            }
            for (index, item) in items.iter().enumerate() {
                let row = self.row(index as u64);
                row.short = short(item);
            }
            changed = true;
        }
        for call in self.calls.values_mut() {
            let (tail, stream, tool) = (&mut call.tail, &mut call.stream, &mut call.tool);
            while tail.read(&call.log, &mut |_, line| {
                for note in stream.feed(&String::from_utf8_lossy(line)) {
                    if let crate::claude::Note::Tool { .. } = note {
                        *tool = Some(note.line());
                    }
                }
                changed = true;
            }) {}
        }
        changed
    }

    fn row(&mut self, index: u64) -> &mut ItemRow {
        self.items.entry(index).or_insert_with(|| ItemRow {
            item_id: format!("item_{index}"),
            index,
            status: Standing::Pending,
            attempts: 0,
            duration_secs: None,
            cost_usd: 0.0,
            agent_id: None,
            task: None,
            in_dlq: false,
            error: None,
            short: String::new(),
            lines: Vec::new(),
        })
    }

    /// Places an event the fold does not read: its time, and its line among its item's.
    fn place(&mut self, glance: &Glance<'_>, file: u16, offset: u64) {
        if let Some(at) = glance.at {
            self.seen_at(at);
        }
        if let Some(index) = glance.item {
            self.row(index).lines.push((file, offset));
        }
    }

    /// An event's time AT: the first, and the last so far.
    fn seen_at(&mut self, at: &str) {
        if self.first_at.is_none() {
            self.first_at = Some(at.to_owned());
        }
        let last = self.last_at.get_or_insert_with(String::new);
        last.clear();
        last.push_str(at);
    }

    /// Folds one event (of a kind [`folded`] names).
    #[expect(
        clippy::too_many_lines,
        reason = "table-shaped: one arm per kind of event in the run's events file"
    )]
    fn fold(&mut self, event: &Line<'_>, file: u16, offset: u64) {
        let text = |key: &str| event.text(key);
        let number = |key: &str| event.number(key);
        // Borrowed from the line: most events allocate nothing here.
        let kind: &str = event.event_type.as_deref().unwrap_or_default();
        let at: Option<&str> = event.timestamp.as_deref();
        if let Some(at) = at {
            self.seen_at(at);
        }
        let item: Option<&str> = event.item_id.as_deref();
        let index = item.and_then(item_index);
        if let Some(index) = index {
            self.row(index).lines.push((file, offset));
        }
        if matches!(kind, "agent_completed" | "agent_failed" | "agent_cancelled")
            && let (Some(queue), Some(item)) = (&mut self.queue, item)
        {
            queue.ended(item);
        }
        // Who does it: a map agent, else the run itself.
        let actor_key: &str = event
            .agent_id
            .as_deref()
            .filter(|_| item.is_some())
            .unwrap_or("run");
        match kind {
            "job_started" | "job_resumed" | "workflow_started" => {
                self.ended = false;
                self.phase = text("phase");
                self.actors.clear();
                self.calls.clear();
                self.pause = None;
                if self.summary.kind == RunKind::Job {
                    self.breaker.get_or_insert("closed");
                }
                if let Some(queue) = &mut self.queue {
                    // A new process: what waited or was being verified runs again.
                    queue.waiting.clear();
                    queue.view.counts.queued = 0;
                    queue.view.counts.verifying = 0;
                    queue.view.verifying_items.clear();
                }
                if kind == "job_resumed" {
                    // Items that were running start again.
                    for row in self.items.values_mut() {
                        if row.status == Standing::Running || row.status == Standing::Retrying {
                            row.status = Standing::Pending;
                        }
                    }
                }
                if kind == "workflow_started" {
                    self.counts.total = number("steps").unwrap_or(0);
                }
            }
            "setup_started" => self.phase = Some("setup".to_owned()),
            "merge_queued" | "verify_started" | "verify_finished" | "merge_refused"
            | "item_redispatched" => {
                self.queue
                    .get_or_insert_with(QueueFold::default)
                    .take(kind, event);
            }
            "agent_merged" => {
                if let Some(queue) = &mut self.queue {
                    queue.take(kind, event);
                }
            }
            "input_loaded" => self.counts.total = number("items").unwrap_or(0),
            "map_started" => {
                self.phase = Some("map".to_owned());
                self.counts.total = number("items").unwrap_or(self.counts.total);
                self.map_started_at = at.map(str::to_owned);
            }
            "reduce_started" => self.phase = Some("reduce".to_owned()),
            "job_finished" | "workflow_finished" => {
                self.ended = true;
                // A job that stopped, failed or was interrupted stays in the phase it was in:
                // that is where it goes on.
                if kind == "job_finished" && text("status").as_deref() == Some("completed") {
                    self.phase = Some("done".to_owned());
                }
                self.actors.clear();
                self.calls.clear();
                self.pause = None;
            }
            "job_stopping" => self.stopping = text("reason"),
            "claude_budget_reached" => {
                self.stopping = Some("the Claude budget is reached".to_owned());
            }
            "claude_limit_reached" if text("action").as_deref() == Some("wait") => {
                self.pause = Some(Pause {
                    limit_type: text("limit_type").unwrap_or_default(),
                    resets_at: text("resets_at").unwrap_or_default(),
                });
            }
            "claude_limit_lifted" => self.pause = None,
            "claude_slots_changed" => {
                self.slots = match (number("slots"), number("max")) {
                    (Some(slots), Some(max)) if slots < max => Some(Slots { slots, max }),
                    _ => None,
                };
            }
            "CircuitOpen" => self.breaker = Some("open"),
            "CircuitHalfOpen" => self.breaker = Some("half_open"),
            "CircuitClosed" => self.breaker = Some("closed"),
            "agent_started" => {
                let attempt = number("attempt").and_then(|n| u32::try_from(n).ok());
                if let Some(index) = index {
                    let row = self.row(index);
                    row.status = Standing::Running;
                    row.attempts = attempt.unwrap_or(row.attempts + 1);
                    row.agent_id = text("agent_id");
                }
                self.actors.insert(
                    actor_key.to_owned(),
                    Actor {
                        item_id: item.map(str::to_owned),
                        attempt: attempt.unwrap_or(1),
                        started_at: at.unwrap_or_default().to_owned(),
                        step: None,
                        task: None,
                    },
                );
            }
            "task_submitted" | "task_adopted" | "slurm_task_submitted" | "slurm_task_adopted" => {
                // Events of earlier versions name a Slurm task by its two ids.
                let task = match &event.task {
                    Some(task) => TaskRef {
                        backend: task.backend.clone().into_owned(),
                        id: task.id.clone().into_owned(),
                        node: task.node.as_ref().map(|n| n.clone().into_owned()),
                    },
                    None => TaskRef {
                        backend: "slurm".to_owned(),
                        id: format!(
                            "{}_{}",
                            text("slurm_job_id").unwrap_or_default(),
                            number("slurm_task_id").unwrap_or(0)
                        ),
                        node: None,
                    },
                };
                if let Some(index) = index {
                    self.row(index).task = Some(task.clone());
                }
                if let Some(actor) = self.actors.get_mut(actor_key) {
                    actor.task = Some(task);
                }
            }
            "agent_completed" | "agent_failed" | "agent_cancelled" | "agent_rejected" => {
                if let Some(index) = index {
                    let duration = event.duration_secs;
                    let error = text("error");
                    let row = self.row(index);
                    match kind {
                        "agent_completed" => row.status = Standing::Succeeded,
                        "agent_cancelled" => row.status = Standing::Pending,
                        _ => {
                            row.status = Standing::Failed;
                            row.error = error.or_else(|| text("reason"));
                        }
                    }
                    if duration.is_some() {
                        row.duration_secs = duration;
                    }
                }
                // A rejected item had no agent.
                if kind != "agent_rejected" {
                    self.actors.remove(actor_key);
                    self.calls.remove(actor_key);
                }
            }
            "item_retry_scheduled" => {
                self.counts.retries += 1;
                if let Some(index) = index {
                    self.row(index).status = Standing::Retrying;
                }
            }
            "item_skipped" => {
                if let Some(index) = index {
                    self.row(index).status = Standing::Skipped;
                }
            }
            "dlq_item_added" => {
                if let Some((index, id)) = index.zip(item.map(str::to_owned)) {
                    self.dlq.insert(id);
                    self.row(index).in_dlq = true;
                }
            }
            "dlq_item_removed" => {
                if let Some((index, id)) = index.zip(item.map(str::to_owned)) {
                    self.dlq.remove(&id);
                    let row = self.row(index);
                    row.in_dlq = false;
                    row.status = Standing::Succeeded;
                }
            }
            // A retried item that failed again stays in the DLQ, failed.
            "dlq_item_updated" => {
                if let Some(index) = index {
                    let row = self.row(index);
                    row.in_dlq = true;
                    row.status = Standing::Failed;
                }
            }
            "dlq_retry_started" => self.ended = false,
            "dlq_retry_finished" => {
                self.ended = true;
                self.actors.clear();
                self.calls.clear();
            }
            "step_started" => {
                let id = number("step_id").and_then(|n| u32::try_from(n).ok());
                let label = text("step").unwrap_or_default();
                if let Some(id) = id {
                    let step = self.steps.entry(id).or_insert_with(|| StepLive {
                        step_id: id,
                        label: label.clone(),
                        ..StepLive::default()
                    });
                    step.running += 1;
                }
                let actor = self
                    .actors
                    .entry(actor_key.to_owned())
                    .or_insert_with(|| Actor {
                        item_id: None,
                        attempt: 1,
                        started_at: at.unwrap_or_default().to_owned(),
                        step: None,
                        task: None,
                    });
                if let Some((old, _)) = actor.step.take()
                    && let Some(step) = self.steps.get_mut(&old)
                {
                    step.running = step.running.saturating_sub(1);
                }
                actor.step = id.map(|id| (id, label));
            }
            "step_finished" | "step_skipped" => {
                let succeeded = !matches!(
                    text("outcome").as_deref(),
                    Some("failed" | "failed_continued" | "cancelled")
                );
                if let Some(actor) = self.actors.get_mut(actor_key)
                    && let Some((id, _)) = actor.step.take()
                    && let Some(step) = self.steps.get_mut(&id)
                {
                    step.running = step.running.saturating_sub(1);
                    if succeeded {
                        step.succeeded += 1;
                    } else {
                        step.failed += 1;
                    }
                }
                if self.summary.kind == RunKind::Run && actor_key == "run" {
                    if succeeded {
                        self.counts.succeeded += 1;
                    } else {
                        self.counts.failed += 1;
                    }
                }
            }
            "retry_scheduled" => {
                self.counts.retries += 1;
                if let Some(actor) = self.actors.get(actor_key)
                    && let Some((id, _)) = &actor.step
                    && let Some(step) = self.steps.get_mut(id)
                {
                    step.retries += 1;
                }
            }
            "claude_started" => {
                if let Some(log) = text("log") {
                    self.calls.insert(
                        actor_key.to_owned(),
                        Call {
                            log: PathBuf::from(log),
                            ..Call::default()
                        },
                    );
                }
            }
            "claude_finished" => {
                self.calls.remove(actor_key);
                let cost = event.cost_usd.unwrap_or(0.0);
                self.spend.calls += 1;
                self.spend.turns += number("num_turns").unwrap_or(0);
                self.spend.cost_usd += cost;
                if let Some(index) = index {
                    let row = self.row(index);
                    row.cost_usd = crate::claude::pricing::usd(row.cost_usd + cost);
                }
            }
            _ => {}
        }
        if matches!(kind, "agent_completed" | "agent_failed" | "item_skipped")
            && self.phase.as_deref() == Some("map")
        {
            self.finished_in_map += 1;
        }
    }

    /// The picture now (NOW: the wall clock, for elapsed times).
    pub fn picture(&self, now: SystemTime) -> Picture {
        let counts = self.counts_now();
        let live = self.is_running();
        let end = if live {
            Some(now)
        } else {
            self.last_at.as_deref().and_then(parse)
        };
        let (items_per_min, eta_secs) = self.map_rate(end, live, counts);
        Picture {
            summary: self.summary.clone(),
            state: self.state_now(),
            pause: self.pause.clone().filter(|_| live),
            claude_slots: self.slots.filter(|_| live),
            phase: self.phase.clone(),
            queue: self.queue.as_ref().map(|q| q.view.clone()),
            counts,
            spend: self.spend_now(counts, live),
            breaker: self.breaker,
            items_per_min,
            eta_secs,
            duration_secs: self.duration_secs(end),
            agents: if live { self.agents(now) } else { Vec::new() },
            steps: self.steps_now(live),
            stopping: self.stopping.clone(),
            reading: self.reading,
        }
    }

    /// The counts now: a job's from its item rows and its DLQ, a standard run's with its
    /// running step; the pending ones are what is neither done nor running.
    fn counts_now(&self) -> Counts {
        let mut counts = self.counts;
        // What ran when the run's process died (or stopped) runs no more: it is pending, as
        // `ls` and `resume-job` count it.
        let live = self.is_running();
        if self.summary.kind == RunKind::Job {
            counts.succeeded = 0;
            counts.failed = 0;
            counts.skipped = 0;
            counts.running = 0;
            for row in self.items.values() {
                match row.status {
                    Standing::Succeeded => counts.succeeded += 1,
                    Standing::Failed => counts.failed += 1,
                    Standing::Skipped => counts.skipped += 1,
                    Standing::Running if live => counts.running += 1,
                    Standing::Running | Standing::Pending | Standing::Retrying => {}
                }
            }
            counts.dlq = self.dlq.len() as u64;
        } else {
            counts.running = u64::from(live && self.actors.values().any(|a| a.step.is_some()));
        }
        counts.pending = counts.total.saturating_sub(done(counts) + counts.running);
        counts
    }

    /// The run's state as the view shows it: a running run paused for a usage limit is
    /// paused.
    fn state_now(&self) -> State {
        match self.summary.state {
            State::Running if self.pause.is_some() => State::Paused,
            state => state,
        }
    }

    /// How long the run ran, in seconds, from its start to END (now while it runs, its last
    /// event after); 0 when either is unknown.
    fn duration_secs(&self, end: Option<SystemTime>) -> f64 {
        let start =
            parse(&self.summary.started_at).or_else(|| self.first_at.as_deref().and_then(parse));
        start
            .zip(end)
            .and_then(|(s, e)| e.duration_since(s).ok())
            .map_or(0.0, |d| d.as_secs_f64())
    }

    /// The rate of the map phase from its start in this process to END, in items per
    /// minute, and, while the run is LIVE, the seconds left for the COUNTS still to finish.
    #[expect(
        clippy::cast_precision_loss,
        reason = "item counts far below 2^52, for a rate and a forecast"
    )]
    fn map_rate(
        &self,
        end: Option<SystemTime>,
        live: bool,
        counts: Counts,
    ) -> (Option<f64>, Option<f64>) {
        let Some(map_start) = self.map_started_at.as_deref().and_then(parse) else {
            return (None, None);
        };
        let Some(spent) = end.and_then(|end| end.duration_since(map_start).ok()) else {
            return (None, None);
        };
        if self.finished_in_map == 0 || spent.as_secs_f64() <= 0.0 {
            return (None, None);
        }
        let rate = self.finished_in_map as f64 / spent.as_secs_f64();
        let eta = live.then(|| counts.pending.saturating_add(counts.running) as f64 / rate);
        (Some(rate * 60.0), eta)
    }

    /// What the Claude calls cost, rounded; while a job is LIVE, with the forecast for its
    /// items still to finish at the mean cost of those done (COUNTS).
    #[expect(
        clippy::cast_precision_loss,
        reason = "item counts far below 2^52, for a rate and a forecast"
    )]
    fn spend_now(&self, counts: Counts, live: bool) -> Spend {
        let mut spend = self.spend;
        spend.cost_usd = crate::claude::pricing::usd(spend.cost_usd);
        let done = done(counts);
        if self.summary.kind == RunKind::Job && done > 0 && live {
            let items_cost: f64 = self.items.values().map(|r| r.cost_usd).sum();
            spend.forecast_usd = Some(crate::claude::pricing::usd(
                items_cost / done as f64 * (counts.pending + counts.running) as f64,
            ));
        }
        spend
    }

    /// The agents at work (an item or a step), with what their Claude calls do (NOW: the
    /// wall clock, for their elapsed times).
    fn agents(&self, now: SystemTime) -> Vec<Agent> {
        self.actors
            .iter()
            .map(|(key, actor)| {
                let call = self.calls.get(key);
                Agent {
                    agent_id: key.clone(),
                    item_id: actor.item_id.clone(),
                    attempt: actor.attempt,
                    step: actor.step.as_ref().map(|(_, l)| l.clone()),
                    step_id: actor.step.as_ref().map(|(id, _)| *id),
                    started_at: actor.started_at.clone(),
                    elapsed_secs: parse(&actor.started_at)
                        .and_then(|s| now.duration_since(s).ok())
                        .map_or(0.0, |d| d.as_secs_f64()),
                    tool: call.and_then(|c| c.tool.clone()),
                    turns: call.map(|c| c.stream.turns),
                    task: actor.task.clone(),
                }
            })
            .filter(|a| a.item_id.is_some() || a.step.is_some())
            .collect()
    }

    /// The steps' totals; none runs once the run is not LIVE.
    fn steps_now(&self, live: bool) -> Vec<StepLive> {
        let mut steps: Vec<StepLive> = self.steps.values().cloned().collect();
        if !live {
            for step in &mut steps {
                step.running = 0;
            }
        }
        steps
    }

    /// Item rows: those whose status is FILTER (every one without), sorted by SORT
    /// (`index`, `status`, `attempts`, `duration`, `cost`, `agent`; descending with
    /// DESCENDING), the page of LIMIT rows from OFFSET; and how many matched.
    pub fn rows(
        &self,
        filter: Option<Standing>,
        sort: &str,
        descending: bool,
        offset: usize,
        limit: usize,
    ) -> (Vec<ItemRow>, usize) {
        let total = self.counts.total.max(self.items.len() as u64);
        let pending = ItemRow {
            item_id: String::new(),
            index: 0,
            status: Standing::Pending,
            attempts: 0,
            duration_secs: None,
            cost_usd: 0.0,
            agent_id: None,
            task: None,
            in_dlq: false,
            error: None,
            short: String::new(),
            lines: Vec::new(),
        };
        // Items never seen are pending; they get a row only when a page shows them.
        let mut rows: Vec<(u64, Option<&ItemRow>)> = (0..total)
            .map(|i| (i, self.items.get(&i)))
            .filter(|(_, r)| filter.is_none_or(|f| r.map_or(Standing::Pending, |r| r.status) == f))
            .collect();
        let order = |a: &(u64, Option<&ItemRow>), b: &(u64, Option<&ItemRow>)| {
            let (x, y) = (a.1.unwrap_or(&pending), b.1.unwrap_or(&pending));
            let by = match sort {
                "status" => x.status.cmp(&y.status),
                "attempts" => x.attempts.cmp(&y.attempts),
                "duration" => x
                    .duration_secs
                    .unwrap_or(0.0)
                    .total_cmp(&y.duration_secs.unwrap_or(0.0)),
                "cost" => x.cost_usd.total_cmp(&y.cost_usd),
                "agent" => x.agent_id.cmp(&y.agent_id),
                _ => a.0.cmp(&b.0),
            };
            let by = if descending { by.reverse() } else { by };
            by.then(a.0.cmp(&b.0))
        };
        let matched = rows.len();
        if offset < matched {
            let end = (offset + limit).min(matched);
            if end < matched {
                rows.select_nth_unstable_by(end, order);
                rows.truncate(end);
            }
            rows.sort_by(order);
        }
        let page = rows
            .into_iter()
            .skip(offset)
            .take(limit)
            .map(|(i, r)| {
                r.cloned().unwrap_or_else(|| ItemRow {
                    item_id: format!("item_{i}"),
                    index: i,
                    ..pending.clone()
                })
            })
            .collect();
        (page, matched)
    }

    /// One item in full, read back from its event lines, its DLQ entry and its Claude logs.
    pub fn item(&self, item_id: &str) -> Option<ItemDetail> {
        let index = item_index(item_id)?;
        if index >= self.counts.total.max(self.items.len() as u64) {
            return None;
        }
        let row = self.items.get(&index).cloned().unwrap_or_else(|| ItemRow {
            item_id: item_id.to_owned(),
            index,
            status: Standing::Pending,
            attempts: 0,
            duration_secs: None,
            cost_usd: 0.0,
            agent_id: None,
            task: None,
            in_dlq: false,
            error: None,
            short: String::new(),
            lines: Vec::new(),
        });
        let mut events = Vec::new();
        let mut logs = Vec::new();
        for (file, offset) in &row.lines {
            let Some(path) = self.events.path(*file) else {
                continue;
            };
            let Some(line) = line_at(path, *offset) else {
                continue;
            };
            if let Ok(event) = serde_json::from_str::<Value>(&line) {
                if event.get("event_type").and_then(Value::as_str) == Some("claude_started")
                    && let Some(log) = event.get("log").and_then(Value::as_str)
                {
                    logs.push(PathBuf::from(log));
                }
                events.push(event);
            }
        }
        let dlq = self.job_dir.as_ref().and_then(|_| {
            let layout = Layout {
                home: self.home.clone(),
                repo: self.summary.repo.clone(),
            };
            crate::dlq::Dlq::new(&layout, &self.id)
                .get(item_id)
                .ok()
                .flatten()
        });
        let data = dlq.as_ref().map(|d| d.item_data.clone()).or_else(|| {
            let dir = self.job_dir.as_ref()?;
            let file = std::fs::File::open(crate::layout::items(dir)).ok()?;
            let mut reader = serde_json::Deserializer::from_reader(std::io::BufReader::new(file));
            serde::Deserializer::deserialize_seq(&mut reader, Nth(index)).ok()?
        });
        let claude = logs.iter().map(|log| render_call(log)).collect();
        let layout = Layout {
            home: self.home.clone(),
            repo: self.summary.repo.clone(),
        };
        let outputs = step_outputs(&layout.logs_dir(&self.id), item_id, &events);
        Some(ItemDetail {
            row,
            data,
            events,
            dlq,
            claude,
            outputs,
        })
    }

    /// Whether the run still runs (a live process holds it).
    pub fn is_running(&self) -> bool {
        self.summary.state == runs::State::Running
    }

    /// Whether the last refresh left events unread (its budget was spent).
    pub fn behind(&self) -> bool {
        self.reading.is_some()
    }

    /// Whether its events say it ended (in its last process).
    pub fn ended(&self) -> bool {
        self.ended
    }
}

/// The Nth value of a JSON array, the others skipped unbuilt.
struct Nth(u64);

impl<'de> serde::de::Visitor<'de> for Nth {
    type Value = Option<Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        for _ in 0..self.0 {
            if seq.next_element::<serde::de::IgnoredAny>()?.is_none() {
                return Ok(None);
            }
        }
        let found = seq.next_element::<Value>()?;
        // The rest, so the array ends as it should.
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(found)
    }
}

/// A Claude call's log rendered as `prodigy logs --show` does.
pub fn render_call(log: &Path) -> ClaudeCall {
    let mut stream = Stream::default();
    let mut lines = Vec::new();
    let mut tail = Tail::default();
    while tail.read(log, &mut |_, line| {
        lines.extend(
            stream
                .feed(&String::from_utf8_lossy(line))
                .iter()
                .map(crate::claude::Note::line),
        );
    }) {}
    ClaudeCall {
        log: log.to_owned(),
        lines,
        result: stream.result.as_ref().and_then(|r| r.result.clone()),
        turns: stream.num_turns(),
        tool_calls: stream.tool_calls,
    }
}

/// The outputs of ITEM's steps in the run's logs DIR, each with the attempt it ran in:
/// EVENTS (the item's, in order) say which, as each `step_started` names the number of its
/// log files (`log_number`) after its attempt's `agent_started`. A log no event names (an
/// earlier version's) has attempt 0: unknown.
fn step_outputs(dir: &Path, item: &str, events: &[Value]) -> Vec<StepOutput> {
    let mut attempt_of: BTreeMap<u32, u32> = BTreeMap::new();
    let mut attempt = 0;
    for event in events {
        match event.get("event_type").and_then(Value::as_str) {
            Some("agent_started") => {
                let n = event.get("attempt").and_then(Value::as_u64).unwrap_or(1);
                attempt = u32::try_from(n).unwrap_or(u32::MAX);
            }
            Some("step_started") => {
                if let Some(number) = event
                    .get("log_number")
                    .and_then(Value::as_u64)
                    .and_then(|n| u32::try_from(n).ok())
                {
                    attempt_of.insert(number, attempt);
                }
            }
            _ => {}
        }
    }
    crate::logs::owner_steps(dir, item)
        .into_iter()
        .filter(|(number, _)| *number > 0)
        .map(|(number, (record, log))| {
            let attempt = attempt_of.get(&number).copied().unwrap_or(0);
            let (tail, truncated) = tail_of(&log, OUTPUT_TAIL);
            StepOutput {
                attempt,
                number,
                step: record.as_ref().map(|r| r.step.clone()),
                outcome: record.as_ref().map(|r| r.outcome.clone()),
                duration_secs: record.as_ref().map(|r| r.duration_secs),
                output_bytes: record.as_ref().map_or_else(
                    || std::fs::metadata(&log).map_or(0, |m| m.len()),
                    |r| r.output_bytes,
                ),
                tail,
                truncated,
                log: log.exists().then_some(log),
            }
        })
        .collect()
}

/// The last MOST bytes of PATH, from the first line that starts in them (all of it when it
/// is shorter); whether earlier bytes were left out.
fn tail_of(path: &Path, most: u64) -> (String, bool) {
    let Ok(mut file) = std::fs::File::open(path) else {
        return (String::new(), false);
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let from = len.saturating_sub(most);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(from)).is_err() || file.take(most).read_to_end(&mut bytes).is_err()
    {
        return (String::new(), false);
    }
    let mut start = 0;
    if from > 0
        && let Some(newline) = memchr::memchr(b'\n', &bytes)
        && newline + 1 < bytes.len()
    {
        start = newline + 1;
    }
    (
        String::from_utf8_lossy(&bytes[start..]).into_owned(),
        from > 0,
    )
}

/// The line of PATH at OFFSET.
fn line_at(path: &Path, offset: u64) -> Option<String> {
    use std::io::BufRead as _;
    let mut file = std::fs::File::open(path).ok()?;
    file.seek(SeekFrom::Start(offset)).ok()?;
    let mut line = String::new();
    std::io::BufReader::new(file)
        .take(16 << 20)
        .read_line(&mut line)
        .ok()?;
    Some(line)
}

/// VALUE as one line of at most [`SHORT`] characters.
fn short(value: &Value) -> String {
    let text = match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let text = crate::progress::visible(&text).replace('\n', " ");
    if text.chars().count() > SHORT {
        let mut cut: String = text.chars().take(SHORT - 1).collect();
        cut.push('…');
        cut
    } else {
        text
    }
}

/// The items of COUNTS that are done: succeeded, failed or skipped.
fn done(counts: Counts) -> u64 {
    counts.succeeded + counts.failed + counts.skipped
}

/// An RFC 3339 time.
fn parse(at: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(at.trim_end_matches('Z')).ok()
}

/// The summary of ID.
fn load(home: &Path, id: &str) -> Result<Summary, LiveError> {
    match runs::find(home, id) {
        None => Err(LiveError::Unknown(id.to_owned())),
        Some(Err(why)) => Err(LiveError::Unreadable {
            id: id.to_owned(),
            why,
        }),
        Some(Ok(summary)) => Ok(summary),
    }
}

/// The run to show when none is named: the newest running one of REPO, else its newest.
pub fn default_id(home: &Path, repo: Option<&str>) -> Option<String> {
    let listing = runs::list(home, repo);
    listing
        .runs
        .iter()
        .find(|r| r.state == runs::State::Running)
        .or_else(|| listing.runs.first())
        .map(|r| r.id.clone())
}

#[cfg(test)]
mod vocabulary_tests {
    use super::FOLDED;

    /// Names of earlier versions' events, which the read model still folds.
    const LEGACY: &[&str] = &["slurm_task_adopted", "slurm_task_submitted"];

    /// The events the read model does not fold, and why: with [`FOLDED`], every event.
    const NOT_FOLDED: &[&str] = &[
        // A step's attempts, handlers, validation and captures: `step_*` and `retry_scheduled`
        // carry what the read model shows of a step; `logs` and `events` show the rest.
        "attempt_finished",
        "attempt_started",
        "capture_failed",
        "exit_code_handler_started",
        "fallback_started",
        "handler_finished",
        "handler_started",
        "item_handler_finished",
        "item_handler_started",
        "step_failed",
        "step_failed_continued",
        "step_validation_finished",
        "success_handler_started",
        "validation_finished",
        "variable_captured",
        // Merges, worktrees and checkpoints: the job's state files say where it is.
        "integrity_checked",
        "verified_landed",
        "agent_merge_failed",
        "agent_merge_recovered",
        "agent_worktree_kept",
        "agent_worktrees_swept",
        "checkpoint_saved",
        "merge_conflict_handler_finished",
        "merge_conflict_handler_started",
        "merge_finished",
        "merge_started",
        "setup_left_uncommitted",
        "worktree_prepared",
        // Phase ends: the next phase's start, or the job's end, is what changes the picture.
        "map_finished",
        "reduce_finished",
        "setup_finished",
        // A repeated Claude call is one call; a task's start and cancel show as its agent's.
        "claude_call_repeated",
        "task_cancelled",
        "task_started",
        // What the run says about itself, not about its items.
        "internal_error",
        "notification_finished",
        "state_write_failed",
    ];

    /// Every event is folded by the read model or listed as not, and the names are events.
    #[test]
    fn every_event_is_folded_or_said_why_not() {
        let all = crate::events::vocabulary();
        assert!(all.len() > 50, "the vocabulary was not read: {all:?}");
        assert!(FOLDED.is_sorted(), "FOLDED is searched: keep it sorted");
        let mut listed: Vec<&str> = FOLDED
            .iter()
            .filter(|k| !LEGACY.contains(k))
            .chain(NOT_FOLDED)
            .copied()
            .collect();
        listed.sort_unstable();
        let unlisted: Vec<&String> = all
            .iter()
            .filter(|k| !listed.contains(&k.as_str()))
            .collect();
        let unknown: Vec<&&str> = listed
            .iter()
            .filter(|k| !all.iter().any(|a| a == *k))
            .collect();
        assert!(
            unlisted.is_empty() && unknown.is_empty(),
            "events neither folded nor in NOT_FOLDED: {unlisted:?}; names that are no event: {unknown:?}"
        );
        let both: Vec<&&str> = NOT_FOLDED.iter().filter(|k| FOLDED.contains(k)).collect();
        assert!(both.is_empty(), "folded and not: {both:?}");
    }

    /// The arms of [`super::Live::fold`]'s `match` name exactly the events in [`FOLDED`], so
    /// that an event let through is read, and one read is let through.
    #[test]
    fn the_folds_arms_are_the_folded_events() {
        let source = include_str!("live.rs");
        let start = source.find("    fn fold(&mut self").unwrap();
        let end = start + source[start..].find("\n    }\n").unwrap();
        let arms = crate::events::arm_names(&source[start..end]);
        assert_eq!(arms, FOLDED);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    const JOB: &str = "mapreduce-1-00000000000001";

    /// A home with a running job's checkpoint (nothing holds its lock: crashed) and an
    /// empty events file; returns the events file.
    fn home() -> (tempfile::TempDir, PathBuf) {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join("state/p-1/mapreduce/jobs").join(JOB);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("checkpoint.json"),
            format!(
                r#"{{"version":1,"job_id":"{JOB}","workflow_file":"/p/j.yml","project":"/p","workflow_hash":"0","phase":"map","status":"running","items_processed":0,"items_total":3,"items_remaining":[],"successful_items":0,"failed_items":0,"skipped_items":0,"started_at":"2026-11-26T10:00:00.000Z","last_checkpoint_at":"2026-11-26T10:00:00.000Z","reduce_next_step":0,"variables":{{}},"params":[],"args":[],"profile":null,"max_parallel":2}}"#
            ),
        )
        .unwrap();
        std::fs::write(dir.join("items.json"), r#"[{"n":1},{"n":2},"three"]"#).unwrap();
        let events = home.path().join("events/p-1").join(JOB);
        std::fs::create_dir_all(&events).unwrap();
        let file = events.join("events-2026-11-26T100000Z.jsonl");
        std::fs::write(&file, "").unwrap();
        (home, file)
    }

    fn append(file: &Path, text: &str) {
        std::fs::OpenOptions::new()
            .append(true)
            .open(file)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }

    fn event(at: &str, kind: &str, fields: &str) -> String {
        format!(
            r#"{{"timestamp":"2026-11-26T10:00:{at}.000Z","event_type":"{kind}","job_id":"{JOB}"{fields}}}"#
        ) + "\n"
    }

    /// While the rate governor holds fewer Claude calls than ran, the picture says so; once
    /// it recovers, or the run is no longer running, it does not.
    #[test]
    fn the_rate_governor_shows_while_it_holds_calls_back() {
        let (home, file) = home();
        let dir = home.path().join("state/p-1/mapreduce/jobs").join(JOB);
        let lock = crate::store::SessionLock::acquire_in(&dir, "job").unwrap();
        let mut live = Live::open(home.path(), JOB).unwrap();
        append(&file, &event("00", "job_started", r#","phase":"map""#));
        append(
            &file,
            &event(
                "01",
                "claude_slots_changed",
                r#","slots":2,"max":8,"reason":"rate_limited""#,
            ),
        );
        live.refresh();
        let p = live.picture(parse("2026-11-26T10:00:05.000Z").unwrap());
        let slots = p.claude_slots.unwrap();
        assert_eq!(slots.text(), "Claude: 2 of 8 slots, rate limited");
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(
            json["claude_slots"],
            serde_json::json!({"slots": 2, "max": 8})
        );
        append(
            &file,
            &event(
                "02",
                "claude_slots_changed",
                r#","slots":8,"max":8,"reason":"recovered""#,
            ),
        );
        live.refresh();
        let p = live.picture(parse("2026-11-26T10:00:06.000Z").unwrap());
        assert_eq!(p.claude_slots, None);
        drop(lock);
    }

    /// The verified merge queue's lane: what waits, what is being verified, what landed
    /// and went back, and what the last failed verification printed.
    #[test]
    fn the_merge_queue_is_folded_from_its_events() {
        let (home, file) = home();
        let mut live = Live::open(home.path(), JOB).unwrap();
        let lines = [
            ("00", "job_started", r#","phase":"map""#),
            ("01", "merge_queued", r#","item_id":"item_0""#),
            ("01", "merge_queued", r#","item_id":"item_1""#),
            ("01", "merge_queued", r#","item_id":"item_2""#),
            (
                "02",
                "verify_started",
                r#","item_ids":["item_0","item_1"],"candidate":"c","bisecting":false"#,
            ),
        ];
        for (at, kind, fields) in lines {
            append(&file, &event(at, kind, fields));
        }
        live.refresh();
        let q = live
            .picture(parse("2026-11-26T10:00:03.000Z").unwrap())
            .queue
            .unwrap();
        assert_eq!((q.counts.queued, q.counts.verifying), (1, 2));
        assert_eq!(q.verifying_items, ["item_0", "item_1"]);
        let lines = [
            (
                "03",
                "verify_finished",
                r#","item_ids":["item_0","item_1"],"candidate":"c","passed":false,"duration_secs":1.0,"output":"FAILED: tests/b.sh""#,
            ),
            (
                "03",
                "agent_merged",
                r#","branch":"b","merge":"MergeCommit""#,
            ),
            (
                "03",
                "merge_refused",
                r#","item_id":"item_1","reason":"verify_failed""#,
            ),
            (
                "03",
                "item_redispatched",
                r#","item_id":"item_1","reason":"verify_failed","attempt":1"#,
            ),
            // Landed with no verification of its own (`merge.protect` alone).
            (
                "04",
                "agent_completed",
                r#","agent_id":"agent-2","item_id":"item_2","attempt":1"#,
            ),
        ];
        for (at, kind, fields) in lines {
            append(&file, &event(at, kind, fields));
        }
        live.refresh();
        let q = live
            .picture(parse("2026-11-26T10:00:05.000Z").unwrap())
            .queue
            .unwrap();
        let c = q.counts;
        assert_eq!(
            (
                c.queued,
                c.verifying,
                c.verifications,
                c.landed,
                c.refused,
                c.redispatched
            ),
            (0, 0, 1, 1, 1, 1)
        );
        let failure = q.last_failure.unwrap();
        assert_eq!(failure.output, "FAILED: tests/b.sh");
        assert_eq!(failure.item_ids, ["item_0", "item_1"]);
        assert_eq!(
            c.text(),
            "verify: idle, 0 queued, 1 landed, 1 re-dispatched (1 run)"
        );
    }

    /// A job whose process died counts what was running as pending, as `ls` and
    /// `resume-job` do: nothing runs it any more.
    #[test]
    fn a_crashed_job_has_nothing_running() {
        let (home, file) = home();
        let mut live = Live::open(home.path(), JOB).unwrap();
        append(&file, &event("00", "job_started", r#","phase":"map""#));
        append(
            &file,
            &event(
                "00",
                "map_started",
                r#","items":3,"pending":3,"max_parallel":2"#,
            ),
        );
        append(
            &file,
            &event(
                "01",
                "agent_started",
                r#","agent_id":"agent-0","item_id":"item_0","attempt":1"#,
            ),
        );
        live.refresh();
        let p = live.picture(parse("2026-11-26T10:00:05.000Z").unwrap());
        assert_eq!(p.state, State::Crashed);
        assert_eq!((p.counts.running, p.counts.pending), (0, 3));
    }

    #[test]
    fn a_job_that_stopped_is_shown_in_the_phase_it_stopped_in() {
        for (status, phase) in [
            ("stopped", "reduce"),
            ("interrupted", "reduce"),
            ("failed", "reduce"),
            ("completed", "done"),
        ] {
            let (home, file) = home();
            let mut live = Live::open(home.path(), JOB).unwrap();
            append(&file, &event("00", "job_started", r#","phase":"map""#));
            append(&file, &event("01", "reduce_started", ""));
            append(
                &file,
                &event(
                    "02",
                    "job_finished",
                    &format!(r#","status":"{status}","dlq_count":0,"duration_secs":2.0"#),
                ),
            );
            live.refresh();
            let p = live.picture(parse("2026-11-26T10:00:05.000Z").unwrap());
            assert_eq!(p.phase.as_deref(), Some(phase), "{status}");
        }
    }

    #[test]
    #[expect(
        clippy::too_many_lines,
        reason = "a test: one scenario read top to bottom"
    )]
    fn a_growing_events_file_is_folded_once_and_a_cut_line_waits_for_its_end() {
        let (home, file) = home();
        let dir = home.path().join("state/p-1/mapreduce/jobs").join(JOB);
        let lock = crate::store::SessionLock::acquire_in(&dir, "job").unwrap();
        let mut live = Live::open(home.path(), JOB).unwrap();
        append(&file, &event("00", "job_started", r#","phase":"map""#));
        append(
            &file,
            &event(
                "00",
                "map_started",
                r#","items":3,"pending":3,"max_parallel":2"#,
            ),
        );
        append(
            &file,
            &event(
                "01",
                "agent_started",
                r#","agent_id":"agent-0","item_id":"item_0","attempt":1"#,
            ),
        );
        append(
            &file,
            &event(
                "01",
                "step_started",
                r#","step":"claude: fix","step_index":0,"step_id":0,"agent_id":"agent-0","item_id":"item_0""#,
            ),
        );
        let log = home.path().join("call.jsonl");
        std::fs::write(&log, "").unwrap();
        append(
            &file,
            &event(
                "01",
                "claude_started",
                &format!(
                    r#","step":"claude: fix","log":"{}","agent_id":"agent-0","item_id":"item_0""#,
                    log.display()
                ),
            ),
        );
        assert!(live.refresh());
        let p = live.picture(parse("2026-11-26T10:00:05.000Z").unwrap());
        assert_eq!(p.counts.total, 3);
        assert_eq!(p.counts.running, 1);
        assert_eq!(p.counts.pending, 2);
        assert_eq!(p.phase.as_deref(), Some("map"));
        assert_eq!(p.state, State::Running);
        assert_eq!(p.steps[0].running, 1);
        assert_eq!(p.agents.len(), 1);
        assert_eq!(p.agents[0].item_id.as_deref(), Some("item_0"));
        assert_eq!(p.agents[0].step.as_deref(), Some("claude: fix"));
        assert!((p.agents[0].elapsed_secs - 4.0).abs() < 1e-6);
        assert_eq!(p.agents[0].turns, Some(0));
        // The call's stream grows: its tool call and turn show.
        append(
            &log,
            concat!(
                r#"{"type":"assistant","message":{"id":"m1","content":[{"type":"tool_use","name":"Bash","input":{"command":"cargo test"}}]}}"#,
                "\n"
            ),
        );
        assert!(live.refresh());
        let p = live.picture(parse("2026-11-26T10:00:05.000Z").unwrap());
        assert_eq!(p.agents[0].tool.as_deref(), Some("→ Bash: cargo test"));
        assert_eq!(p.agents[0].turns, Some(1));

        // Half a line: nothing changes until its end arrives.
        let done = event(
            "03",
            "claude_finished",
            r#","step":"claude: fix","success":true,"num_turns":2,"cost_usd":0.5,"agent_id":"agent-0","item_id":"item_0""#,
        );
        let (head, rest) = done.split_at(40);
        append(&file, head);
        assert!(!live.refresh());
        append(&file, rest);
        append(
            &file,
            &event(
                "03",
                "agent_failed",
                r#","agent_id":"agent-0","item_id":"item_0","attempt":1,"error_type":"CommandFailed","error":"boom","step":"claude: fix""#,
            ),
        );
        append(
            &file,
            &event(
                "03",
                "dlq_item_added",
                r#","item_id":"item_0","error_signature":"x","failure_count":1"#,
            ),
        );
        assert!(live.refresh());
        assert!(!live.refresh(), "nothing new: nothing read again");
        let p = live.picture(parse("2026-11-26T10:00:05.000Z").unwrap());
        assert_eq!((p.counts.failed, p.counts.dlq, p.counts.running), (1, 1, 0));
        assert_eq!((p.spend.calls, p.spend.turns), (1, 2));
        assert!((p.spend.cost_usd - 0.5).abs() < 1e-9);
        assert_eq!(p.steps[0].failed, 0, "the step itself never finished");

        let (rows, matched) = live.rows(Some(Standing::Failed), "index", false, 0, 10);
        assert_eq!(matched, 1);
        assert_eq!(rows[0].item_id, "item_0");
        assert_eq!(rows[0].short, r#"{"n":1}"#);
        assert_eq!(rows[0].error.as_deref(), Some("boom"));
        let (rows, matched) = live.rows(None, "cost", true, 1, 1);
        assert_eq!(matched, 3);
        assert_eq!(rows[0].item_id, "item_1", "cost descending, then index");
        assert_eq!(rows[0].short, r#"{"n":2}"#);

        let detail = live.item("item_0").unwrap();
        let kinds: Vec<_> = detail
            .events
            .iter()
            .map(|e| e["event_type"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            kinds,
            [
                "agent_started",
                "step_started",
                "claude_started",
                "claude_finished",
                "agent_failed",
                "dlq_item_added"
            ]
        );
        assert_eq!(detail.claude.len(), 1);
        assert_eq!(detail.data, Some(serde_json::json!({"n": 1})));
        assert_eq!(
            live.item("item_2").unwrap().data,
            Some(Value::from("three"))
        );
        assert!(live.item("item_3").is_none());

        // Its process is gone: crashed, and no agent is shown as working.
        drop(lock);
        live.refresh();
        let p = live.picture(parse("2026-11-26T10:00:05.000Z").unwrap());
        assert_eq!(p.state, State::Crashed);
        assert!(p.agents.is_empty());
    }

    /// An item a `dlq retry` ran and that failed again is failed and in the DLQ, not
    /// running; a task event names its task, in today's form and in an earlier version's.
    #[test]
    fn a_dlq_retry_that_fails_again_and_task_events_show_as_they_happened() {
        let (home, file) = home();
        for line in [
            event(
                "00",
                "map_started",
                r#","items":3,"pending":3,"max_parallel":2"#,
            ),
            event(
                "01",
                "task_submitted",
                r#","task":{"backend":"container","id":"prodigy-job-0","node":"host1"},"attempt":1,"item_id":"item_0""#,
            ),
            event(
                "01",
                "slurm_task_submitted",
                r#","slurm_job_id":"42","slurm_task_id":1,"item_id":"item_1""#,
            ),
            event(
                "02",
                "dlq_item_added",
                r#","item_id":"item_2","failure_count":1"#,
            ),
            event("03", "dlq_retry_started", r#","items":1"#),
            event(
                "03",
                "agent_started",
                r#","agent_id":"agent-9","item_id":"item_2","attempt":2"#,
            ),
            event(
                "04",
                "dlq_item_updated",
                r#","item_id":"item_2","failure_count":2"#,
            ),
            event(
                "04",
                "dlq_retry_finished",
                r#","retried":1,"succeeded":0,"failed":1"#,
            ),
        ] {
            append(&file, &line);
        }
        let mut live = Live::open(home.path(), JOB).unwrap();
        live.refresh();
        let (rows, _) = live.rows(None, "index", false, 0, 10);
        // Any backend's task, with its backend and node, under `task`.
        let task = serde_json::to_value(&rows[0]).unwrap()["task"].clone();
        assert_eq!(
            task,
            serde_json::json!({"backend": "container", "id": "prodigy-job-0", "node": "host1"})
        );
        let old = rows[1].task.as_ref().unwrap();
        assert_eq!((old.backend.as_str(), old.id.as_str()), ("slurm", "42_1"));
        assert_eq!(rows[2].status, Standing::Failed);
        assert!(rows[2].in_dlq);
        let p = live.picture(parse("2026-11-26T10:00:05.000Z").unwrap());
        assert_eq!(p.counts.running, 0);
    }

    #[test]
    fn a_resumed_job_is_read_across_its_events_files_and_its_interrupted_item_runs_again() {
        let (home, file) = home();
        append(
            &file,
            &event(
                "00",
                "map_started",
                r#","items":3,"pending":3,"max_parallel":2"#,
            ),
        );
        append(
            &file,
            &event(
                "01",
                "agent_started",
                r#","agent_id":"agent-0","item_id":"item_0","attempt":1"#,
            ),
        );
        append(
            &file,
            &event(
                "01",
                "claude_finished",
                r#","step":"s","num_turns":1,"cost_usd":0.25,"agent_id":"agent-0","item_id":"item_0""#,
            ),
        );
        append(
            &file,
            &event(
                "02",
                "agent_completed",
                r#","agent_id":"agent-0","item_id":"item_0","attempt":1"#,
            ),
        );
        append(
            &file,
            &event(
                "02",
                "agent_started",
                r#","agent_id":"agent-1","item_id":"item_1","attempt":1"#,
            ),
        );
        // Killed here (nothing holds the job's lock): what ran is pending, as `ls` and
        // `resume-job` count it. `resume-job` writes a second file.
        let mut live = Live::open(home.path(), JOB).unwrap();
        live.refresh();
        let p = live.picture(SystemTime::UNIX_EPOCH);
        assert_eq!((p.counts.succeeded, p.counts.running), (1, 0));
        let second = file.with_file_name("events-2026-11-26T110000Z.jsonl");
        std::fs::write(&second, event("03", "job_resumed", r#","phase":"map""#)).unwrap();
        live.refresh();
        let p = live.picture(SystemTime::UNIX_EPOCH);
        assert_eq!(
            (p.counts.succeeded, p.counts.running, p.counts.pending),
            (1, 0, 2)
        );
        append(
            &second,
            &event(
                "04",
                "agent_started",
                r#","agent_id":"agent-0","item_id":"item_1","attempt":1"#,
            ),
        );
        append(
            &second,
            &event(
                "04",
                "claude_finished",
                r#","step":"s","num_turns":1,"cost_usd":0.25,"agent_id":"agent-0","item_id":"item_1""#,
            ),
        );
        append(
            &second,
            &event(
                "05",
                "agent_completed",
                r#","agent_id":"agent-0","item_id":"item_1","attempt":1"#,
            ),
        );
        live.refresh();
        let p = live.picture(SystemTime::UNIX_EPOCH);
        assert_eq!(
            (p.counts.succeeded, p.counts.running, p.counts.pending),
            (2, 0, 1)
        );
        // The spend spans both processes.
        assert!((p.spend.cost_usd - 0.5).abs() < 1e-9);
        assert_eq!(live.item("item_1").unwrap().events.len(), 4);
    }

    #[test]
    fn a_usage_limit_pauses_a_running_job_until_it_is_lifted() {
        let (home, file) = home();
        let mut live = Live::open(home.path(), JOB).unwrap();
        append(
            &file,
            &event(
                "00",
                "claude_limit_reached",
                r#","step":"s","limit_type":"five_hour","resets_at":"2026-11-26T15:00:00Z","action":"wait","wait_secs":60.0"#,
            ),
        );
        live.refresh();
        // What the picture says of a live run (the lock is a process's; the fold is not).
        live.summary.state = runs::State::Running;
        let p = live.picture(SystemTime::UNIX_EPOCH);
        assert_eq!(p.state, State::Paused);
        assert_eq!(p.pause.unwrap().limit_type, "five_hour");
        append(&file, &event("01", "claude_limit_lifted", r#","step":"s""#));
        live.refresh();
        live.summary.state = runs::State::Running;
        assert_eq!(live.picture(SystemTime::UNIX_EPOCH).state, State::Running);
    }

    #[test]
    fn an_items_step_outputs_show_their_tails_under_the_attempt_they_ran_in() {
        let dir = tempfile::tempdir().unwrap();
        let at = |secs: &str| parse(&format!("2026-11-26T10:00:{secs}.000Z")).unwrap();
        let item = dir.path().join("item_0");
        std::fs::create_dir(&item).unwrap();
        let write = |name: &str, text: &str, when: SystemTime| {
            let path = item.join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(when)
                .unwrap();
        };
        // Attempt 1 failed in its step 1; attempt 2 ran it again, printing 5 KiB of lines.
        // The first log's time says nothing (it was copied back after attempt 2 started):
        // the events say which attempt wrote it.
        write("step-0001.log", "first try\n", at("09"));
        write(
            "step-0001.json",
            r#"{"step":"make","outcome":"failed","duration_secs":1.0,"commands":1,"output_bytes":10}"#,
            at("09"),
        );
        let long = (0..1024).fold(String::new(), |mut text, n| {
            use std::fmt::Write as _;
            let _ = writeln!(text, "{n:04}");
            text
        });
        write("step-0002.log", &long, at("07"));
        // A log no event names (written by an earlier version): its attempt is unknown.
        write("step-0003.log", "old\n", at("08"));
        let events: Vec<Value> = ["01", "05"]
            .iter()
            .zip(1..)
            .flat_map(|(secs, attempt)| {
                [
                    serde_json::json!({
                        "timestamp": format!("2026-11-26T10:00:{secs}.000Z"),
                        "event_type": "agent_started",
                        "attempt": attempt,
                    }),
                    serde_json::json!({
                        "timestamp": format!("2026-11-26T10:00:{secs}.000Z"),
                        "event_type": "step_started",
                        "step": "make",
                        "step_id": 0,
                        "log_number": attempt,
                    }),
                ]
            })
            .collect();
        let outputs = step_outputs(dir.path(), "item_0", &events);
        assert_eq!(outputs.len(), 3);
        assert_eq!(outputs[2].attempt, 0);
        assert_eq!(outputs[0].attempt, 1);
        assert_eq!(outputs[0].outcome.as_deref(), Some("failed"));
        assert_eq!(outputs[0].tail, "first try\n");
        assert!(!outputs[0].truncated);
        // The second runs still (no record): its end, from a line's start, at most 4 KiB.
        assert_eq!(outputs[1].attempt, 2);
        assert_eq!(outputs[1].outcome, None);
        assert_eq!(outputs[1].output_bytes, 5120);
        assert!(outputs[1].truncated);
        assert!(outputs[1].tail.len() <= 4096);
        assert!(
            outputs[1].tail.starts_with("0205\n"),
            "{}",
            &outputs[1].tail[..10]
        );
        assert!(outputs[1].tail.ends_with("1023\n"));
    }

    #[test]
    fn an_event_the_fold_does_not_read_is_placed_from_its_bytes() {
        let attempt = event(
            "03",
            "attempt_finished",
            r#","step":"x","note":{"item_id":"item_9"},"agent_id":"agent-1","item_id":"item_2""#,
        );
        let glance = Glance::of(attempt.trim_end().as_bytes()).unwrap();
        assert_eq!(glance.kind, "attempt_finished");
        assert_eq!(glance.at, Some("2026-11-26T10:00:03.000Z"));
        assert_eq!(glance.item, Some(2));
        assert!(!folded(glance.kind));
        // Written otherwise, or with an escape in a field read: parsed instead.
        assert_eq!(Glance::of(br#"{"event_type":"x","timestamp":"t"}"#), None);
        assert_eq!(
            Glance::of(br#"{"timestamp":"t","event_type":"a\"b"}"#),
            None
        );
        let (home, file) = home();
        let mut live = Live::open(home.path(), JOB).unwrap();
        append(&file, &attempt);
        append(
            &file,
            &event(
                "04",
                "agent_started",
                r#","agent_id":"agent-1","item_id":"item_1","attempt":1"#,
            ),
        );
        assert!(live.refresh());
        let detail = live.item("item_2").unwrap();
        assert_eq!(detail.events.len(), 1);
        assert_eq!(detail.events[0]["event_type"], "attempt_finished");
        assert_eq!(live.item("item_1").unwrap().row.status, Standing::Running);
        assert_eq!(live.last_at.as_deref(), Some("2026-11-26T10:00:04.000Z"));
    }

    #[test]
    fn a_refresh_with_a_budget_reads_a_chunk_and_the_picture_says_how_far() {
        let (home, file) = home();
        let mut live = Live::open(home.path(), JOB).unwrap();
        let mut text = event("00", "map_started", r#","items":3"#);
        // More than a chunk of events.
        let step = event(
            "01",
            "attempt_started",
            r#","agent_id":"agent-0","item_id":"item_0""#,
        );
        let lines = usize::try_from(CHUNK).unwrap() / step.len() + 100;
        text.push_str(&step.repeat(lines));
        text.push_str(&event(
            "02",
            "agent_completed",
            r#","agent_id":"agent-0","item_id":"item_0""#,
        ));
        append(&file, &text);
        let now = parse("2026-11-26T10:00:05.000Z").unwrap();
        assert!(live.refresh_within(Some(std::time::Duration::ZERO)));
        let reading = live.picture(now).reading.unwrap();
        assert!(reading.read_bytes > 0 && reading.read_bytes < reading.total_bytes);
        assert_eq!(reading.total_bytes, text.len() as u64);
        assert_eq!(live.picture(now).counts.succeeded, 0);
        assert!(live.behind());
        // The next refresh reads the rest.
        assert!(live.refresh());
        let p = live.picture(now);
        assert_eq!(p.reading, None);
        assert_eq!(p.counts.succeeded, 1);
        assert_eq!(live.item("item_0").unwrap().events.len(), lines + 1);
    }
}
