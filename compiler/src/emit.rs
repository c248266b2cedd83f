//! Renders the IR graph as DOT (Graphviz), Mermaid (`flowchart`) or JSON.
//!
//! Output is deterministic: nodes and edges come in the graph's insertion order.
//! The map phase's agent is drawn once, inside a cluster, however many items there are.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::Duration;

use crate::ir::{Edge, Graph, Node, Phase};
use crate::plan::{Plan, PlanCommand, StepId};
use crate::source::SourceFile;

/// A duration as people write it: `500ms`, `1s`, `1.5s`, `2m`, `1m30s`, `1h5m`.
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    if !ms.is_multiple_of(1000) && ms < 60_000 {
        let text = format!("{:.3}", d.as_secs_f64());
        return format!("{}s", text.trim_end_matches('0').trim_end_matches('.'));
    }
    let secs = d.as_secs();
    match (secs / 3600, (secs % 3600) / 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, _) => format!("{h}h"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

/// The label of a retry edge: `retry ×3: 1s, 2s, 4s`.
pub fn retry_label(retries: u32, schedule: &[Duration]) -> String {
    if schedule.is_empty() {
        return format!("retry ×{retries}");
    }
    let delays: Vec<String> = schedule.iter().map(|d| duration(*d)).collect();
    format!("retry ×{retries}: {}", delays.join(", "))
}

/// How far a run got at a node (`prodigy graph --status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Nothing reached it.
    NotReached,
    /// It started and has not ended.
    Running,
    /// It ended well.
    Succeeded,
    /// It failed (or, for an item node, items reached it).
    Failed,
    /// `when` was false, or items were skipped.
    Skipped,
}

impl NodeState {
    /// Its fill colour in DOT and Mermaid.
    pub fn colour(self) -> &'static str {
        match self {
            NodeState::NotReached => "#eeeeee",
            NodeState::Running => "#fff2a8",
            NodeState::Succeeded => "#c8f0c8",
            NodeState::Failed => "#f8c0c0",
            NodeState::Skipped => "#d8d8f0",
        }
    }

    fn name(self) -> &'static str {
        match self {
            NodeState::NotReached => "not_reached",
            NodeState::Running => "running",
            NodeState::Succeeded => "succeeded",
            NodeState::Failed => "failed",
            NodeState::Skipped => "skipped",
        }
    }

    const ALL: [NodeState; 5] = [
        NodeState::NotReached,
        NodeState::Running,
        NodeState::Succeeded,
        NodeState::Failed,
        NodeState::Skipped,
    ];
}

/// A node's state in a run, with its counts as one line (`ran 3, failed 1, retried 2`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct NodeStatus {
    /// How far the run got here.
    pub state: NodeState,
    /// Runs of the step (or items, events) that reached it.
    pub count: u64,
    /// Retries of the step.
    pub retries: u64,
    /// Map items that ran it.
    pub items_ran: u64,
    /// Map items that failed at it.
    pub items_failed: u64,
    /// The counts as a person reads them, drawn under the node's label.
    pub note: String,
}

/// The states of a run's nodes, by node index; a node not in it was not reached.
pub type Status = std::collections::BTreeMap<usize, NodeStatus>;

fn state_of(status: Option<&Status>, index: usize) -> Option<(NodeState, String)> {
    let status = status?;
    Some(match status.get(&index) {
        Some(s) => (s.state, s.note.clone()),
        None => (NodeState::NotReached, String::new()),
    })
}

struct Labels<'a> {
    plan: &'a Plan,
}

impl Labels<'_> {
    /// `merge queue: verified in batches of 4; protects tests/**, Cargo.lock`.
    fn verify_label(&self) -> String {
        let Some(merge) = &self.plan.merge else {
            return "merge queue".to_owned();
        };
        let mut parts = Vec::new();
        if !merge.verify.is_empty() {
            parts.push(if merge.batch > 1 {
                format!("verified in batches of {}", merge.batch)
            } else {
                "verified one at a time".to_owned()
            });
        }
        if !merge.protect.is_empty() {
            parts.push(format!("protects {}", merge.protect.join(", ")));
        }
        if parts.is_empty() {
            "merge queue".to_owned()
        } else {
            format!("merge queue: {}", parts.join("; "))
        }
    }

    fn node(&self, node: &Node) -> String {
        match node {
            Node::Start => "start".to_owned(),
            Node::Success => "success".to_owned(),
            Node::Failure => "failed".to_owned(),
            Node::Phase {
                phase: Phase::Setup,
                ..
            } => "setup".to_owned(),
            Node::Phase {
                phase: Phase::Map, ..
            } => match &self.plan.map {
                Some(map) => {
                    let parallel = match &map.max_parallel {
                        crate::ast::MaxParallel::Fixed(n) => n.value.to_string(),
                        crate::ast::MaxParallel::Variable(t) => t.value.clone(),
                    };
                    format!(
                        "map: one agent per item of {} (max_parallel {parallel})",
                        map.input.value
                    )
                }
                None => "map".to_owned(),
            },
            Node::Phase {
                phase: Phase::Reduce,
                ..
            } => "reduce".to_owned(),
            Node::Phase {
                phase: Phase::Merge,
                ..
            } => "merge".to_owned(),
            Node::Phase {
                phase: Phase::Verify,
                ..
            } => self.verify_label(),
            Node::Step { step } => self.step(*step),
            Node::Fallback { step } => format!("fallback of {}", self.step(*step)),
            Node::Breaker { .. } => match self
                .plan
                .error_policy
                .as_ref()
                .and_then(|p| p.circuit_breaker.as_ref())
            {
                Some(b) => format!(
                    "circuit breaker: opens after {} failures in a row, for {}",
                    b.failure_threshold,
                    duration(b.timeout)
                ),
                None => "circuit breaker".to_owned(),
            },
            Node::Dlq => "dead letter queue".to_owned(),
            Node::ItemFailed => "item failed".to_owned(),
            Node::ItemSkipped => "item skipped".to_owned(),
        }
    }

    fn step(&self, id: StepId) -> String {
        let Some(step) = self.plan.step(id) else {
            return format!("step {}", id.0);
        };
        let kind = match &step.command {
            PlanCommand::Shell(_) => "shell",
            PlanCommand::Claude(_) => "claude",
            PlanCommand::WriteFile(_) => "write_file",
            PlanCommand::Foreach { .. } => "foreach",
        };
        let mut label = format!("{kind}: {}", step.label);
        if step.when.is_some() {
            label.push_str(" (when …)");
        }
        label
    }

    /// Where a step node, or the fallback command of one, was written: `FILE:LINE`.
    fn at(&self, node: &Node) -> Option<String> {
        let line = match node {
            Node::Step { step } => self.plan.step(*step)?.line,
            Node::Fallback { step } => {
                let step = self.plan.step(*step)?;
                step.retry
                    .as_ref()
                    .and_then(|r| r.fallback_line)
                    .or(step.line)
            }
            Node::Start
            | Node::Success
            | Node::Failure
            | Node::Phase { .. }
            | Node::Breaker { .. }
            | Node::Dlq
            | Node::ItemFailed
            | Node::ItemSkipped => None,
        }?;
        Some(format!("{}:{line}", self.plan.source))
    }

    /// What hovering a node shows: where it was written, then the step's description or its
    /// command.
    fn tooltip(&self, node: &Node) -> Option<String> {
        let at = self.at(node);
        let what = match node {
            Node::Step { step } => self.plan.step(*step).and_then(|step| {
                if let Some(d) = &step.description {
                    return Some(d.clone());
                }
                match &step.command {
                    PlanCommand::Shell(t) | PlanCommand::Claude(t) => Some(t.value.clone()),
                    PlanCommand::WriteFile(_) | PlanCommand::Foreach { .. } => None,
                }
            }),
            Node::Start
            | Node::Success
            | Node::Failure
            | Node::Phase { .. }
            | Node::Fallback { .. }
            | Node::Breaker { .. }
            | Node::Dlq
            | Node::ItemFailed
            | Node::ItemSkipped => None,
        };
        match (at, what) {
            (Some(at), Some(what)) => Some(format!("{at}\n{what}")),
            (at, what) => at.or(what),
        }
    }

    fn edge(edge: &Edge) -> Option<String> {
        match edge {
            Edge::Next => None,
            Edge::OnSuccess => Some("on success".to_owned()),
            Edge::OnFailure => Some("on failure".to_owned()),
            Edge::OnExitCode { code } => Some(format!("exit {code}")),
            Edge::Retry { retries, schedule } => Some(retry_label(*retries, schedule)),
            Edge::Fallback => Some("retries exhausted".to_owned()),
            Edge::FanOut => Some("each item".to_owned()),
            Edge::FanIn => Some("all done".to_owned()),
            Edge::Continue => Some("failure ignored".to_owned()),
            Edge::Reject => Some("rejects items while open".to_owned()),
            Edge::ItemRetry { retries, schedule } => {
                Some(format!("item {}", retry_label(*retries, schedule)))
            }
            Edge::OnItemFailure { action } => Some(format!("on_item_failure: {action}")),
            Edge::Redispatch { times } => Some(format!(
                "refused: back to its agent, {times} time{} at most",
                if *times == 1 { "" } else { "s" }
            )),
            Edge::Stop { why } => Some(format!("job stops ({why})")),
        }
    }
}

/// Steps that belong to the map agent (drawn inside its cluster).
fn agent_steps(plan: &Plan) -> BTreeSet<StepId> {
    let roots: Vec<StepId> = plan
        .map
        .iter()
        .flat_map(|m| m.steps.iter().copied())
        .collect();
    crate::checks::subtree(plan, &roots).into_iter().collect()
}

fn in_agent(node: &Node, agent: &BTreeSet<StepId>) -> bool {
    match node {
        Node::Step { step } | Node::Fallback { step } => agent.contains(step),
        Node::ItemFailed => true,
        Node::Start
        | Node::Success
        | Node::Failure
        | Node::Phase { .. }
        | Node::Breaker { .. }
        | Node::Dlq
        | Node::ItemSkipped => false,
    }
}

fn dot_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

/// Renders DOT for Graphviz.
pub fn dot(graph: &Graph, plan: &Plan) -> String {
    dot_status(graph, plan, None)
}

/// Renders DOT with a run's STATUS on it: each node filled with its state's colour, its counts
/// under its label.
pub fn dot_status(graph: &Graph, plan: &Plan, status: Option<&Status>) -> String {
    let labels = Labels { plan };
    let agent = agent_steps(plan);
    let mut out = String::new();
    let title = plan.name.clone().unwrap_or_else(|| plan.source.clone());
    let _ = writeln!(out, "digraph workflow {{");
    let _ = writeln!(out, "  label=\"{}\";", dot_escape(&title));
    let _ = writeln!(out, "  labelloc=t;");
    let _ = writeln!(
        out,
        "  node [shape=box, style=rounded, fontname=\"Helvetica\"];"
    );
    let _ = writeln!(out, "  edge [fontname=\"Helvetica\", fontsize=10];");
    let node_line = |index: usize, node: &Node| {
        let state = state_of(status, index);
        let mut label = labels.node(node);
        if let Some((state, note)) = &state {
            let _ = write!(label, "\n[{}]", state.name());
            if !note.is_empty() {
                let _ = write!(label, " {note}");
            }
        }
        let mut attrs = format!("label=\"{}\"", dot_escape(&label));
        if let Some((state, _)) = &state {
            let _ = write!(
                attrs,
                ", style=\"rounded,filled\", fillcolor=\"{}\"",
                state.colour()
            );
        }
        let shape = match node {
            Node::Start => Some("circle"),
            Node::Success | Node::Failure => Some("doublecircle"),
            Node::Phase { .. } => Some("folder"),
            Node::Breaker { .. } => Some("octagon"),
            Node::Dlq => Some("cylinder"),
            Node::ItemFailed | Node::ItemSkipped => Some("hexagon"),
            Node::Step { .. } | Node::Fallback { .. } => None,
        };
        if let Some(shape) = shape {
            let _ = write!(attrs, ", shape={shape}");
        }
        if matches!(node, Node::Failure | Node::ItemFailed) {
            attrs.push_str(", color=red");
        }
        if let Some(tip) = labels.tooltip(node) {
            let _ = write!(attrs, ", tooltip=\"{}\"", dot_escape(&tip));
        }
        format!("n{index} [{attrs}];")
    };
    let mut cluster = Vec::new();
    for (index, node) in graph.nodes() {
        if in_agent(node, &agent) {
            cluster.push(node_line(index.index(), node));
        } else {
            let _ = writeln!(out, "  {}", node_line(index.index(), node));
        }
    }
    if !cluster.is_empty() {
        let _ = writeln!(out, "  subgraph cluster_agent {{");
        let _ = writeln!(
            out,
            "    label=\"map agent (drawn once, runs for every item)\";"
        );
        let _ = writeln!(out, "    style=dashed;");
        for line in cluster {
            let _ = writeln!(out, "    {line}");
        }
        let _ = writeln!(out, "  }}");
    }
    for (from, to, edge) in graph.edges() {
        let mut attrs = Vec::new();
        if let Some(label) = Labels::edge(edge) {
            attrs.push(format!("label=\"{}\"", dot_escape(&label)));
        }
        // A retry loop belongs to the step it runs again: hovering it shows where that was written.
        if let (Edge::Retry { .. }, Some(at)) =
            (edge, graph.graph.node_weight(to).and_then(|n| labels.at(n)))
        {
            attrs.push(format!("tooltip=\"{}\"", dot_escape(&at)));
        }
        match edge {
            Edge::OnFailure | Edge::Fallback | Edge::Reject | Edge::Stop { .. } => {
                attrs.push("color=red".to_owned());
            }
            Edge::OnItemFailure { .. } => attrs.push("color=red, style=bold".to_owned()),
            Edge::Retry { .. } | Edge::ItemRetry { .. } | Edge::Redispatch { .. } => {
                attrs.push("color=orange, style=dashed".to_owned());
            }
            Edge::Continue => attrs.push("color=gray, style=dashed".to_owned()),
            Edge::OnSuccess | Edge::OnExitCode { .. } => attrs.push("color=darkgreen".to_owned()),
            Edge::Next | Edge::FanOut | Edge::FanIn => {}
        }
        let attrs = if attrs.is_empty() {
            String::new()
        } else {
            format!(" [{}]", attrs.join(", "))
        };
        let _ = writeln!(out, "  n{} -> n{}{attrs};", from.index(), to.index());
    }
    out.push_str("}\n");
    out
}

fn mermaid_escape(text: &str) -> String {
    text.replace('"', "#quot;")
        .replace('\n', " ")
        .replace('|', "#124;")
        .replace('<', "#lt;")
        .replace('>', "#gt;")
}

/// Renders a Mermaid `flowchart`, as GitHub renders it.
pub fn mermaid(graph: &Graph, plan: &Plan) -> String {
    mermaid_status(graph, plan, None)
}

/// Renders a Mermaid `flowchart` with a run's STATUS on it: a class per state (its fill
/// colour), the counts under each node's label.
pub fn mermaid_status(graph: &Graph, plan: &Plan, status: Option<&Status>) -> String {
    let labels = Labels { plan };
    let agent = agent_steps(plan);
    let mut out = String::from("flowchart TD\n");
    let node_line = |index: usize, node: &Node| {
        let mut label = labels.node(node);
        if let Some((state, note)) = state_of(status, index) {
            let _ = write!(label, " [{}]", state.name());
            if !note.is_empty() {
                let _ = write!(label, " {note}");
            }
        }
        let text = mermaid_escape(&label);
        match node {
            Node::Start | Node::Success => format!("n{index}((\"{text}\"))"),
            Node::Failure => format!("n{index}(((\"{text}\")))"),
            Node::Phase { .. } => format!("n{index}[/\"{text}\"/]"),
            Node::Breaker { .. } | Node::ItemFailed | Node::ItemSkipped => {
                format!("n{index}{{{{\"{text}\"}}}}")
            }
            Node::Dlq => format!("n{index}[(\"{text}\")]"),
            Node::Step { .. } | Node::Fallback { .. } => format!("n{index}[\"{text}\"]"),
        }
    };
    // Mermaid draws no tooltip without a click handler, which GitHub disables: where a step
    // was written is a comment after its node, `%% n3: FILE:LINE`. A comment ends at the end
    // of its line, and braces could be read as a `%%{...}%%` directive.
    let node_lines = |index: usize, node: &Node| {
        let mut lines = vec![node_line(index, node)];
        if let Some(at) = labels.at(node) {
            let at = at
                .replace(['\n', '\r'], " ")
                .replace('{', "(")
                .replace('}', ")");
            lines.push(format!("%% n{index}: {at}"));
        }
        lines
    };
    let mut cluster = Vec::new();
    for (index, node) in graph.nodes() {
        if in_agent(node, &agent) {
            cluster.extend(node_lines(index.index(), node));
        } else {
            for line in node_lines(index.index(), node) {
                let _ = writeln!(out, "  {line}");
            }
        }
    }
    if !cluster.is_empty() {
        let _ = writeln!(
            out,
            "  subgraph agent[\"map agent (drawn once, runs for every item)\"]"
        );
        for line in cluster {
            let _ = writeln!(out, "    {line}");
        }
        let _ = writeln!(out, "  end");
    }
    for (from, to, edge) in graph.edges() {
        let arrow = match edge {
            Edge::Retry { .. }
            | Edge::ItemRetry { .. }
            | Edge::Redispatch { .. }
            | Edge::Continue => "-.->",
            Edge::OnFailure
            | Edge::Fallback
            | Edge::Reject
            | Edge::OnItemFailure { .. }
            | Edge::Stop { .. } => "==>",
            Edge::Next | Edge::OnSuccess | Edge::OnExitCode { .. } | Edge::FanOut | Edge::FanIn => {
                "-->"
            }
        };
        match Labels::edge(edge) {
            Some(label) => {
                let _ = writeln!(
                    out,
                    "  n{} {arrow}|\"{}\"| n{}",
                    from.index(),
                    mermaid_escape(&label),
                    to.index()
                );
            }
            None => {
                let _ = writeln!(out, "  n{} {arrow} n{}", from.index(), to.index());
            }
        }
    }
    if status.is_some() {
        for state in NodeState::ALL {
            let _ = writeln!(
                out,
                "  classDef {} fill:{},stroke:#555",
                state.name(),
                state.colour()
            );
        }
        for (index, _) in graph.nodes() {
            if let Some((state, _)) = state_of(status, index.index()) {
                let _ = writeln!(out, "  class n{} {}", index.index(), state.name());
            }
        }
    }
    out
}

/// Renders the graph as JSON: nodes with labels and origins, edges with kinds and labels.
pub fn json(graph: &Graph, plan: &Plan, file: &SourceFile) -> serde_json::Value {
    json_status(graph, plan, file, None)
}

/// Renders the graph as JSON with a run's STATUS: each node has a `status` (its state and
/// counts).
pub fn json_status(
    graph: &Graph,
    plan: &Plan,
    file: &SourceFile,
    status: Option<&Status>,
) -> serde_json::Value {
    let labels = Labels { plan };
    let origin = |node: &Node| {
        let span = match node {
            // A step the compiler made has no place in the file.
            Node::Step { step } => plan
                .step(*step)
                .filter(|s| s.line.is_some())
                .map(|s| s.origin),
            Node::Fallback { step } => plan.step(*step).and_then(|s| {
                let fallback = s.retry.as_ref().and_then(|r| match &r.policy.exhausted {
                    crate::plan::Exhausted::Fallback(f) => Some(f.span),
                    crate::plan::Exhausted::Stop | crate::plan::Exhausted::Continue => None,
                });
                fallback.or_else(|| s.line.is_some().then_some(s.origin))
            }),
            Node::Phase { origin, .. } | Node::Breaker { origin } => Some(*origin),
            Node::Start
            | Node::Success
            | Node::Failure
            | Node::Dlq
            | Node::ItemFailed
            | Node::ItemSkipped => None,
        }?;
        let at = file.line_col(span.start);
        Some(serde_json::json!({"file": plan.source, "line": at.line, "column": at.column}))
    };
    let nodes: Vec<serde_json::Value> = graph
        .nodes()
        .map(|(index, node)| {
            let mut value = serde_json::to_value(node).unwrap_or(serde_json::Value::Null);
            if let Some(map) = value.as_object_mut() {
                map.insert("id".into(), format!("n{}", index.index()).into());
                map.insert("label".into(), labels.node(node).into());
                map.insert(
                    "origin".into(),
                    origin(node).unwrap_or(serde_json::Value::Null),
                );
                if let Some(status) = status {
                    let value = status.get(&index.index()).map_or_else(
                        || serde_json::json!({"state": NodeState::NotReached}),
                        |s| serde_json::to_value(s).unwrap_or(serde_json::Value::Null),
                    );
                    map.insert("status".into(), value);
                }
            }
            value
        })
        .collect();
    let edges: Vec<serde_json::Value> = graph
        .edges()
        .map(|(from, to, edge)| {
            let mut value = serde_json::to_value(edge).unwrap_or(serde_json::Value::Null);
            if let Some(map) = value.as_object_mut() {
                map.insert("from".into(), format!("n{}", from.index()).into());
                map.insert("to".into(), format!("n{}", to.index()).into());
                map.insert(
                    "label".into(),
                    Labels::edge(edge).map_or(serde_json::Value::Null, Into::into),
                );
            }
            value
        })
        .collect();
    serde_json::json!({"version": 1, "nodes": nodes, "edges": edges})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_written() {
        let d = |ms: u64| duration(Duration::from_millis(ms));
        assert_eq!(
            [
                d(500),
                d(1000),
                d(1500),
                d(60_000),
                d(90_000),
                d(3_600_000),
                d(3_900_000)
            ],
            ["500ms", "1s", "1.5s", "1m", "1m30s", "1h", "1h5m"]
        );
        assert_eq!(
            retry_label(
                3,
                &[
                    Duration::from_secs(1),
                    Duration::from_secs(2),
                    Duration::from_secs(4)
                ]
            ),
            "retry ×3: 1s, 2s, 4s"
        );
    }
}
