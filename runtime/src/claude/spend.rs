//! What a job's Claude calls cost that its checkpoint does not hold, found again when the job
//! is resumed after its coordinator was killed (docs/claude.md, "Claude budgets").
//!
//! The checkpoint's `claude_cost_usd` is written with the place its process's events had
//! reached ([`EventsMark`]): every `claude_finished` before that place is in it. A process
//! killed with SIGKILL leaves two kinds of spend out of it: calls that finished after its
//! last checkpoint (their `claude_finished` comes after the mark), and calls that were
//! running (a `claude_started` with no `claude_finished` at all), which only their logs
//! tell. `resume-job` adds the first to what the job spent and prices the second from their
//! logs ([`price`]), recording a `claude_finished` for each, so that it is counted once: a
//! later resume finds it finished, after the mark until a checkpoint holds it.
//!
//! Only the coordinator's events files are read (those with `job_started` or
//! `job_resumed`): the calls of agents that ran elsewhere reach the job's spend through their
//! results.

pub use crate::store::EventsMark;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::claude::{End, Stream, Totals};
use crate::events::Event;
// Every line the events file writes starts with its time and type: a glance reads the type.
use crate::events::kind_of;

/// A Claude call that has a `claude_started` and no `claude_finished`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interrupted {
    /// The step's label.
    pub step: String,
    /// The call's log.
    pub log: PathBuf,
    /// The map agent that made it, and its item.
    pub agent: Option<(String, String)>,
}

/// What the events hold that a checkpoint written at a mark does not.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Uncounted {
    /// The calls that finished after the mark.
    pub finished: Totals,
    /// The calls that never finished, oldest first.
    pub interrupted: Vec<Interrupted>,
}

/// A map agent's ids, as the sink adds them to its events.
#[derive(Deserialize)]
struct Ids {
    agent_id: Option<String>,
    item_id: Option<String>,
}

/// What the events FILES (name and contents, in any order) of a job hold that a checkpoint
/// written at MARK does not; without a mark (a checkpoint of an earlier version), only the
/// calls that never finished. A line cut short by the kill is left out.
#[must_use]
pub fn uncounted(files: &[(String, Vec<u8>)], mark: Option<&EventsMark>) -> Uncounted {
    let mut files: Vec<&(String, Vec<u8>)> = files.iter().collect();
    // Their names are their processes' start times.
    files.sort_by(|a, b| a.0.cmp(&b.0));
    let mut found = Uncounted::default();
    let mut finished_logs = std::collections::BTreeSet::new();
    for (name, bytes) in files {
        let lines = lines_of(bytes);
        let coordinator = lines
            .iter()
            .any(|(_, line)| matches!(kind_of(line), Some("job_started" | "job_resumed")));
        if !coordinator {
            continue;
        }
        for (offset, line) in lines {
            let counted =
                mark.is_none_or(|m| (name.as_str(), offset) < (m.file.as_str(), m.offset));
            match serde_json::from_slice::<Event>(line) {
                Ok(Event::ClaudeStarted {
                    step,
                    log: Some(log),
                    ..
                }) => {
                    let agent = serde_json::from_slice::<Ids>(line)
                        .ok()
                        .and_then(|ids| ids.agent_id.zip(ids.item_id));
                    found.interrupted.push(Interrupted { step, log, agent });
                }
                Ok(Event::ClaudeFinished {
                    error_kind,
                    num_turns,
                    cost_usd,
                    cost_estimated,
                    tokens,
                    log,
                    ..
                }) => {
                    if let Some(log) = log {
                        finished_logs.insert(log);
                    }
                    if !counted {
                        found.finished.merge(&Totals::one_call(
                            error_kind.is_some(),
                            num_turns,
                            cost_usd,
                            cost_estimated,
                            tokens,
                        ));
                    }
                }
                _ => {}
            }
        }
    }
    found
        .interrupted
        .retain(|call| !finished_logs.contains(&call.log));
    found
}

/// The whole lines of BYTES with the offset each starts at; a last line without its newline
/// (cut by a kill) is left out.
fn lines_of(bytes: &[u8]) -> Vec<(u64, &[u8])> {
    let mut lines = Vec::new();
    let mut start = 0;
    for (at, byte) in bytes.iter().enumerate() {
        if *byte == b'\n' {
            if let Some(line) = bytes.get(start..at) {
                lines.push((u64::try_from(start).unwrap_or(u64::MAX), line));
            }
            start = at + 1;
        }
    }
    lines
}

/// The events files in DIR, name and contents; those that cannot be read are left out.
#[must_use]
pub fn read_events(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let events = name.starts_with("events-")
                && Path::new(&name).extension().is_some_and(|e| e == "jsonl");
            events
                .then(|| std::fs::read(entry.path()).ok())
                .flatten()
                .map(|bytes| (name, bytes))
        })
        .collect()
}

/// The call whose stream is in LOG, as it ended when its process was killed: its cost the
/// `result`'s, or estimated from what it streamed; `None` when the log cannot be read.
#[must_use]
pub fn price(log: &Path) -> Option<crate::claude::kinds::Call> {
    let text = std::fs::read(log).ok()?;
    let mut stream = Stream::default();
    for line in String::from_utf8_lossy(&text).lines() {
        stream.feed(line);
    }
    Some(stream.finish(End::Killed, Some(log.to_owned())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(event: &str, fields: &str) -> String {
        format!("{{\"timestamp\":\"t\",\"event_type\":\"{event}\",\"job_id\":\"j\"{fields}}}\n")
    }

    fn started(log: &str) -> String {
        line(
            "claude_started",
            &format!(
                ",\"step\":\"claude: go\",\"program\":\"claude\",\"args\":[],\"cli_version\":null,\"log\":\"{log}\",\"agent_id\":\"agent-1\",\"item_id\":\"item_1\""
            ),
        )
    }

    fn finished(log: &str, cost: f64) -> String {
        line(
            "claude_finished",
            &format!(
                ",\"step\":\"claude: go\",\"success\":true,\"error_kind\":null,\"message\":null,\"session_id\":null,\"num_turns\":1,\"cost_usd\":{cost},\"tokens\":{{\"input\":1,\"output\":2,\"cache_read\":0,\"cache_creation\":0}},\"tool_calls\":0,\"api_retries\":0,\"exit_code\":0,\"log\":\"{log}\",\"duration_secs\":1.0"
            ),
        )
    }

    #[test]
    fn what_a_killed_coordinator_left_uncounted_is_found_once() {
        // The checkpoint was written after call 1 finished, then call 2 finished, and call
        // 3 was running when the process was killed, in the middle of a line.
        let before = [
            line(
                "job_started",
                ",\"workflow\":\"w\",\"phase\":\"map\",\"job_dir\":\"/j\"",
            ),
            started("/l/1"),
            finished("/l/1", 0.5),
        ]
        .concat();
        let mark = EventsMark {
            file: "events-1.jsonl".into(),
            offset: u64::try_from(before.len()).unwrap(),
        };
        let first = [before, started("/l/2"), started("/l/3")].concat();
        let killed = [first, finished("/l/2", 0.25), "{\"timest".into()].concat();
        // An agent that ran elsewhere writes its own file, with no job event.
        let elsewhere = [started("/l/9")].concat();
        let files = vec![
            ("events-1.jsonl".to_owned(), killed.clone().into_bytes()),
            ("events-0.jsonl".to_owned(), elsewhere.into_bytes()),
        ];
        let found = uncounted(&files, Some(&mark));
        assert_eq!((found.finished.calls, found.finished.cost_usd), (1, 0.25));
        assert_eq!(
            found.interrupted,
            [Interrupted {
                step: "claude: go".into(),
                log: "/l/3".into(),
                agent: Some(("agent-1".into(), "item_1".into())),
            }]
        );
        // The resume recorded call 3 as finished in its own file, and was killed before its
        // first checkpoint: the next resume counts calls 2 and 3, and nothing twice.
        let resumed = [
            line(
                "job_resumed",
                ",\"workflow\":\"w\",\"phase\":\"map\",\"job_dir\":\"/j\"",
            ),
            finished("/l/3", 0.125),
        ]
        .concat();
        let files = vec![
            ("events-1.jsonl".to_owned(), killed.into_bytes()),
            ("events-2.jsonl".to_owned(), resumed.into_bytes()),
        ];
        let found = uncounted(&files, Some(&mark));
        assert_eq!((found.finished.calls, found.finished.cost_usd), (2, 0.375));
        assert!(found.interrupted.is_empty());
        // Without a mark, the checkpoint holds every finished call.
        let found = uncounted(&files, None);
        assert_eq!(found.finished.calls, 0);
    }
}
