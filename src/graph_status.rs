//! `prodigy graph --status ID`: the compiled plan with a run's (or job's) state on it, folded
//! from its events files. The fold is local to this command: whole lines only, so a run
//! still writing its events is read as far as it got.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use prodigy_compiler::emit::{NodeState, NodeStatus, Status};
use prodigy_compiler::ir::{Graph, Node, Phase};
use prodigy_runtime::events::kind_of;
use prodigy_runtime::layout::Layout;
use prodigy_runtime::live::EventFiles;
use serde_json::Value;

/// A run or job found by its id: its workflow, the hash of the text it ran, its events.
pub(crate) struct Found {
    /// The workflow file it ran (absolute).
    pub(crate) workflow: PathBuf,
    /// `store::hash` of the workflow text when it started.
    pub(crate) workflow_hash: String,
    /// Its events directory.
    pub(crate) events: PathBuf,
}

/// Finds the run or job ID under HOME; the error says which ids exist.
pub(crate) fn find(home: &Path, id: &str) -> Result<Found, String> {
    if let Some((dir, repo)) = Layout::find_job(home, id)
        && let Ok(c) = prodigy_runtime::jobstore::JobFiles::new(dir).load_checkpoint()
    {
        return Ok(Found {
            workflow: c.workflow_file,
            workflow_hash: c.workflow_hash,
            events: Layout {
                home: home.to_owned(),
                repo,
            }
            .events_dir(id),
        });
    }
    if let Some((path, repo)) = Layout::find_session(home, id)
        && let Ok(c) = prodigy_runtime::store::Checkpoint::load(&path)
    {
        return Ok(Found {
            workflow: c.workflow,
            workflow_hash: c.workflow_hash,
            events: Layout {
                home: home.to_owned(),
                repo,
            }
            .events_dir(id),
        });
    }
    let listing = prodigy_runtime::runs::list(home, None);
    let ids: Vec<&str> = listing.runs.iter().take(5).map(|r| r.id.as_str()).collect();
    let known = if ids.is_empty() {
        "there are none".to_owned()
    } else {
        let more = if listing.runs.len() > ids.len() {
            ", ..."
        } else {
            ""
        };
        format!("the newest are {}{more}", ids.join(", "))
    };
    Err(format!(
        "no run or job `{id}` under {} ({known}; `prodigy ls` lists them)",
        home.display()
    ))
}

/// The status of GRAPH's nodes from the events files in DIR, read through the runtime's one
/// events reader ([`EventFiles`]): a chunk at a time and one event at a time, so memory stays
/// bounded whatever the files' size. A line not yet ended (the run is writing it) and a
/// damaged line are left out.
pub(crate) fn status(graph: &Graph, dir: &Path) -> Status {
    let mut fold = Fold::new(graph);
    EventFiles::new(dir.to_owned()).read(
        &mut |_, _, line| {
            // Most of a job's events are its agents' commands: skipped unparsed.
            if kind_of(line).is_some_and(|kind| !Fold::reads(kind)) {
                return;
            }
            if let Ok(event) = serde_json::from_slice::<Value>(line)
                && event.is_object()
            {
                fold.feed(&event);
            }
        },
        &|| false,
    );
    fold.status()
}

/// `1 item`, `2 items`.
fn items(n: u64) -> String {
    if n == 1 {
        "1 item".to_owned()
    } else {
        format!("{n} items")
    }
}

/// What the events say about one node.
#[derive(Default)]
struct Tally {
    started: u64,
    succeeded: u64,
    failed: u64,
    skipped: u64,
    retries: u64,
    running: u64,
    items: BTreeSet<String>,
    items_failed: BTreeSet<String>,
}

/// The events folded onto a graph's nodes so far, one event at a time.
struct Fold<'g> {
    graph: &'g Graph,
    tally: BTreeMap<usize, Tally>,
    /// The steps running in each agent (or in the run itself: ""), innermost last.
    stacks: BTreeMap<String, Vec<usize>>,
    dlq: BTreeSet<String>,
    /// Every item that went into the DLQ, also those since retried or cleared.
    dlq_passed: BTreeSet<String>,
    ended: Option<bool>,
}

impl<'g> Fold<'g> {
    fn new(graph: &'g Graph) -> Fold<'g> {
        Fold {
            graph,
            tally: BTreeMap::new(),
            stacks: BTreeMap::new(),
            dlq: BTreeSet::new(),
            dlq_passed: BTreeSet::new(),
            ended: None,
        }
    }

    /// Whether [`Fold::feed`] reads events of KIND (its `match` names these).
    fn reads(kind: &str) -> bool {
        matches!(
            kind,
            "workflow_started"
                | "job_started"
                | "job_resumed"
                | "setup_started"
                | "setup_finished"
                | "map_started"
                | "map_finished"
                | "reduce_started"
                | "reduce_finished"
                | "verify_started"
                | "verify_finished"
                | "item_redispatched"
                | "step_started"
                | "attempt_started"
                | "fallback_started"
                | "step_finished"
                | "step_skipped"
                | "agent_failed"
                | "agent_rejected"
                | "item_skipped"
                | "CircuitOpen"
                | "dlq_item_added"
                | "dlq_item_removed"
                | "workflow_finished"
                | "job_finished"
        )
    }

    /// Folds one EVENT onto the nodes.
    #[expect(
        clippy::too_many_lines,
        reason = "table-shaped: one arm per kind of event folded onto the graph"
    )]
    fn feed(&mut self, event: &Value) {
        let graph = self.graph;
        let find = |wanted: &dyn Fn(&Node) -> bool| node(graph, wanted);
        let step_node =
            |id: u64| find(&|n| matches!(n, Node::Step { step } if u64::from(step.0) == id));
        let phase = |p: Phase| find(&|n| matches!(n, Node::Phase { phase, .. } if *phase == p));
        let kind = event["event_type"].as_str().unwrap_or_default();
        let agent = event["agent_id"].as_str().unwrap_or_default().to_owned();
        let item = event["item_id"].as_str().map(str::to_owned);
        let tally = &mut self.tally;
        let stack = self.stacks.entry(agent).or_default();
        let mut bump = |node: Option<usize>, f: &mut dyn FnMut(&mut Tally)| {
            if let Some(node) = node {
                f(tally.entry(node).or_default());
            }
        };
        match kind {
            "workflow_started" | "job_started" | "job_resumed" => {
                let start = find(&|n| matches!(n, Node::Start));
                bump(start, &mut |t| t.succeeded += 1);
                self.ended = None;
            }
            "setup_started" => bump(phase(Phase::Setup), &mut |t| t.running += 1),
            "setup_finished" => bump(phase(Phase::Setup), &mut |t| {
                t.running = 0;
                t.succeeded += 1;
            }),
            "map_started" => bump(phase(Phase::Map), &mut |t| t.running += 1),
            "map_finished" => bump(phase(Phase::Map), &mut |t| {
                t.running = 0;
                t.succeeded += 1;
            }),
            "reduce_started" => bump(phase(Phase::Reduce), &mut |t| t.running += 1),
            "reduce_finished" => bump(phase(Phase::Reduce), &mut |t| {
                t.running = 0;
                t.succeeded += 1;
            }),
            // The verified merge queue: its verifications, refusals and re-dispatches.
            "verify_started" => bump(phase(Phase::Verify), &mut |t| {
                t.started += 1;
                t.running += 1;
            }),
            "verify_finished" => {
                let passed = event["passed"] == true;
                bump(phase(Phase::Verify), &mut |t| {
                    t.running = t.running.saturating_sub(1);
                    if passed {
                        t.succeeded += 1;
                    } else {
                        t.failed += 1;
                    }
                });
            }
            "item_redispatched" => bump(phase(Phase::Verify), &mut |t| t.retries += 1),
            "step_started" => {
                let node = event["step_id"].as_u64().and_then(step_node);
                if let Some(node) = node {
                    stack.push(node);
                }
                bump(node, &mut |t| {
                    t.started += 1;
                    t.running += 1;
                    if let Some(item) = &item {
                        t.items.insert(item.clone());
                    }
                });
            }
            "attempt_started" => {
                let again = event["attempt"].as_u64().unwrap_or(1) > 1
                    || event["run"].as_u64().unwrap_or(1) > 1;
                if again {
                    bump(stack.last().copied(), &mut |t| t.retries += 1);
                }
            }
            "fallback_started" => {
                let step =
                    stack
                        .last()
                        .and_then(|&n| match graph.nodes().find(|(i, _)| i.index() == n) {
                            Some((_, Node::Step { step })) => Some(*step),
                            _ => None,
                        });
                let node = step
                    .and_then(|s| find(&|n| matches!(n, Node::Fallback { step } if *step == s)));
                bump(node, &mut |t| t.succeeded += 1);
            }
            "step_finished" | "step_skipped" => {
                let outcome = if kind == "step_skipped" {
                    "skipped"
                } else {
                    event["outcome"].as_str().unwrap_or_default()
                };
                bump(stack.pop(), &mut |t| {
                    t.running = t.running.saturating_sub(1);
                    match outcome {
                        "succeeded" | "recovered" => t.succeeded += 1,
                        "skipped" => t.skipped += 1,
                        _ => {
                            t.failed += 1;
                            if let Some(item) = &item {
                                t.items_failed.insert(item.clone());
                            }
                        }
                    }
                });
            }
            "agent_failed" | "agent_rejected" => {
                bump(find(&|n| matches!(n, Node::ItemFailed)), &mut |t| {
                    t.failed += 1;
                    if let Some(item) = &item {
                        t.items.insert(item.clone());
                    }
                });
            }
            "item_skipped" => bump(find(&|n| matches!(n, Node::ItemSkipped)), &mut |t| {
                t.skipped += 1;
            }),
            "CircuitOpen" => bump(find(&|n| matches!(n, Node::Breaker { .. })), &mut |t| {
                t.failed += 1;
            }),
            "dlq_item_added" => {
                if let Some(item) = item {
                    self.dlq_passed.insert(item.clone());
                    self.dlq.insert(item);
                }
            }
            "dlq_item_removed" => {
                if let Some(item) = &item {
                    self.dlq.remove(item);
                }
            }
            "workflow_finished" => self.ended = Some(event["outcome"] == "completed"),
            "job_finished" => self.ended = Some(event["status"] == "completed"),
            _ => {}
        }
    }

    /// Each node's status from what was folded.
    fn status(self) -> Status {
        let Fold {
            graph,
            tally,
            dlq,
            dlq_passed,
            ended,
            ..
        } = self;
        let mut status = Status::new();
        let in_agent = |t: &Tally| !t.items.is_empty();
        for (node, t) in tally {
            let state = if t.running > 0 && ended.is_none() {
                NodeState::Running
            } else if t.failed > 0 && t.succeeded == 0 {
                NodeState::Failed
            } else if t.succeeded > 0 {
                NodeState::Succeeded
            } else if t.skipped > 0 {
                NodeState::Skipped
            } else if t.running > 0 {
                // Started, never ended, and the run is over.
                NodeState::Failed
            } else {
                NodeState::NotReached
            };
            let mut parts = Vec::new();
            if in_agent(&t) {
                parts.push(format!("items ran {}", t.items.len()));
                if !t.items_failed.is_empty() {
                    parts.push(format!("failed {}", t.items_failed.len()));
                }
            } else if t.started > 1 {
                parts.push(format!("ran {}", t.started));
                if t.failed > 0 {
                    parts.push(format!("failed {}", t.failed));
                }
            }
            if t.retries > 0 {
                parts.push(format!("retried {} times", t.retries));
            }
            if t.skipped > 0 && t.started == 0 {
                parts.push(items(t.skipped));
            }
            status.insert(
                node,
                NodeStatus {
                    state,
                    count: t.started.max(t.failed + t.succeeded + t.skipped),
                    retries: t.retries,
                    items_ran: t.items.len() as u64,
                    items_failed: t.items_failed.len() as u64,
                    note: parts.join(", "),
                },
            );
        }
        // The item-failed node counts items, not runs.
        if let Some(node) = node(graph, &|n| matches!(n, Node::ItemFailed))
            && let Some(s) = status.get_mut(&node)
        {
            s.note = format!("{}, {} runs", items(s.items_ran), s.count);
        }
        if let Some(node) = node(graph, &|n| matches!(n, Node::Dlq))
            && let Some(state) = dlq_status(&dlq, &dlq_passed)
        {
            status.insert(node, state);
        }
        let end = match ended {
            Some(true) => {
                node(graph, &|n| matches!(n, Node::Success)).map(|n| (n, NodeState::Succeeded))
            }
            Some(false) => {
                node(graph, &|n| matches!(n, Node::Failure)).map(|n| (n, NodeState::Failed))
            }
            None => None,
        };
        if let Some((node, state)) = end {
            status.insert(
                node,
                NodeStatus {
                    state,
                    count: 1,
                    retries: 0,
                    items_ran: 0,
                    items_failed: 0,
                    note: String::new(),
                },
            );
        }
        status
    }
}

/// The first node of GRAPH that WANTED picks.
fn node(graph: &Graph, wanted: &dyn Fn(&Node) -> bool) -> Option<usize> {
    graph
        .nodes()
        .find(|(_, n)| wanted(n))
        .map(|(i, _)| i.index())
}

/// The DLQ node's status: the items in it (failed), else the items that went through it
/// and left it, retried or cleared (reached); `None` when none went in.
fn dlq_status(dlq: &BTreeSet<String>, passed: &BTreeSet<String>) -> Option<NodeStatus> {
    let n = |set: &BTreeSet<String>| set.len() as u64;
    if !dlq.is_empty() {
        return Some(NodeStatus {
            state: NodeState::Failed,
            count: n(dlq),
            retries: 0,
            items_ran: 0,
            items_failed: n(dlq),
            note: items(n(dlq)),
        });
    }
    (!passed.is_empty()).then(|| NodeStatus {
        state: NodeState::Succeeded,
        count: n(passed),
        retries: 0,
        items_ran: 0,
        items_failed: 0,
        note: format!("{} went through, none left", items(n(passed))),
    })
}

#[cfg(test)]
mod tests {
    /// Every event `graph --status` matches on is one the runtime writes: a renamed event
    /// fails here rather than leaving the picture without it.
    #[test]
    fn the_events_it_reads_are_events() {
        let source = include_str!("graph_status.rs");
        let body = |name: &str| {
            let start = source.find(name).unwrap_or_default();
            let end = start + source[start..].find("\n    }\n").unwrap_or_default();
            &source[start..end]
        };
        let all = prodigy_runtime::events::vocabulary();
        let read = prodigy_runtime::events::arm_names(body("    fn reads(kind: &str)"));
        assert!(read.len() > 15, "the scan found too few: {read:?}");
        let unknown: Vec<&String> = read.iter().filter(|n| !all.contains(n)).collect();
        assert!(unknown.is_empty(), "not events: {unknown:?}");
        // What it lets through, it reads.
        let feed = body("    fn feed(&mut self");
        let unread: Vec<&String> = read
            .iter()
            .filter(|n| !feed.contains(&format!("\"{n}\"")))
            .collect();
        assert!(unread.is_empty(), "let through and not read: {unread:?}");
    }
}
