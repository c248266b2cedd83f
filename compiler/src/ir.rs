//! The IR graph: every path a run can take, as a `petgraph` graph over the plan's steps.
//!
//! Nodes are the start and the two ends, phases, steps (by [`StepId`]), fallbacks, the
//! circuit breaker and the dead letter queue; edges say how control moves between them.
//! The graph feeds `prodigy graph` and the graph checks; the runtime walks the [`Plan`].

use std::time::Duration;

use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::{EdgeRef, IntoEdgeReferences, NodeIndexable};

use crate::plan::ItemFailure;
use crate::plan::{Plan, PlanCommand, StepId};
use crate::source::Span;

/// A node of the graph.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Node {
    /// Where a run starts.
    Start,
    /// The run succeeded.
    Success,
    /// The run failed.
    Failure,
    /// A phase of a MapReduce workflow.
    Phase {
        /// Which phase.
        phase: Phase,
        /// Where it was written.
        origin: Span,
    },
    /// A step.
    Step {
        /// The plan's step.
        step: StepId,
    },
    /// The fallback command of a step's `retry_config`.
    Fallback {
        /// The step it belongs to.
        step: StepId,
    },
    /// The circuit breaker of the map phase.
    Breaker {
        /// Where it was written.
        origin: Span,
    },
    /// The dead letter queue.
    Dlq,
    /// A map item whose agent failed: retried, then handed to `on_item_failure`.
    ItemFailed,
    /// Failed items recorded as skipped (`on_item_failure: skip`).
    ItemSkipped,
}

/// A phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// `setup`.
    Setup,
    /// `map`.
    Map,
    /// `reduce`.
    Reduce,
    /// `merge`.
    Merge,
    /// The verified merge queue (`merge.verify`, `merge.protect`, `merge.redispatch`): each
    /// agent's work, before it reaches the merged work.
    Verify,
}

/// How control moves.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Edge {
    /// The next step.
    Next,
    /// After success.
    OnSuccess,
    /// After failure.
    OnFailure,
    /// After an exit code.
    OnExitCode {
        /// The code.
        code: i32,
    },
    /// Run again.
    Retry {
        /// Retries at most (runs minus one).
        retries: u32,
        /// Delays before each retry, when known.
        schedule: Vec<Duration>,
    },
    /// To the fallback command.
    Fallback,
    /// To each item's agent (or `foreach` body).
    FanOut,
    /// Back from the agents (or the body).
    FanIn,
    /// A failure that the workflow goes past.
    Continue,
    /// Items the open circuit breaker turns away.
    Reject,
    /// A failed map item runs its agent again.
    ItemRetry {
        /// Retries at most (`error_policy.retry_config.max_attempts` minus one).
        retries: u32,
        /// Delays before each retry (before jitter).
        schedule: Vec<Duration>,
    },
    /// A failed map item's last run: where `on_item_failure` sends it.
    OnItemFailure {
        /// `dlq`, `retry`, `skip`, `stop` or `custom:NAME`.
        action: String,
    },
    /// Work the verified merge queue refused goes back to its agent, which runs the item
    /// again on the merged work (`merge.redispatch`).
    Redispatch {
        /// Re-dispatches at most.
        times: u32,
    },
    /// The job stops: no new agent starts and the reduce does not run.
    Stop {
        /// Why: `on_item_failure: stop`, `max_failures N`, `failure_threshold X`,
        /// `continue_on_failure: false`.
        why: String,
    },
}

/// The graph of a plan.
#[derive(Clone, Debug)]
pub struct Graph {
    /// The graph itself.
    pub graph: StableDiGraph<Node, Edge>,
    /// The start node.
    pub start: NodeIndex,
}

/// Builds the graph of a plan.
#[expect(
    clippy::too_many_lines,
    reason = "table-shaped lowering: one block per part of a plan (setup, steps, map, reduce, merge) onto the graph"
)]
pub fn build(plan: &Plan) -> Graph {
    let mut b = Builder {
        plan,
        g: StableDiGraph::new(),
    };
    let start = b.g.add_node(Node::Start);
    let success = b.g.add_node(Node::Success);
    let failure = b.g.add_node(Node::Failure);
    let ends = Ends {
        item_failure: failure,
        agent: false,
    };
    // `worktree.setup` runs first, in each new worktree.
    let mut exit = b.chain(Exit::at(start), &plan.worktree.setup, Edge::Next, ends);
    if plan.map.is_none() {
        exit = b.chain(exit, &plan.commands, Edge::Next, ends);
    }
    if let Some(setup) = &plan.setup {
        let node = b.g.add_node(Node::Phase {
            phase: Phase::Setup,
            origin: span_of(plan, &setup.steps),
        });
        b.link(&exit, node, Edge::Next);
        exit = b.chain(Exit::at(node), &setup.steps, Edge::Next, ends);
    }
    if let Some(map) = &plan.map {
        let node = b.g.add_node(Node::Phase {
            phase: Phase::Map,
            origin: map.input.span,
        });
        b.link(&exit, node, Edge::Next);
        let policy = plan.error_policy.as_ref();
        let dlq = b.g.add_node(Node::Dlq);
        // Every way an agent fails leads to the item failing; the item is run again under
        // the item retry policy, then goes where `on_item_failure` says.
        let item_failed = b.g.add_node(Node::ItemFailed);
        let agent_ends = Ends {
            item_failure: item_failed,
            agent: true,
        };
        if let Some(breaker) = policy.and_then(|p| p.circuit_breaker.as_ref()) {
            let breaker = b.g.add_node(Node::Breaker {
                origin: breaker.span,
            });
            b.g.add_edge(node, breaker, Edge::Next);
            b.g.add_edge(breaker, item_failed, Edge::Reject);
        }
        let mut agents = b.chain(Exit::at(node), &map.steps, Edge::FanOut, agent_ends);
        let first =
            b.g.edges(node)
                .find(|e| matches!(e.weight(), Edge::FanOut))
                .map(|e| e.target());
        // The verified merge queue: an agent's work is verified before it lands; refused
        // work (a failed verification, a conflict, a protected path) goes back to its
        // agent, then fails the item.
        if let Some(merge) = plan.merge.as_ref().filter(|m| m.queued()) {
            let queue = b.g.add_node(Node::Phase {
                phase: Phase::Verify,
                origin: span_of(plan, &merge.verify),
            });
            b.link(&agents, queue, Edge::Next);
            b.g.add_edge(queue, item_failed, Edge::OnFailure);
            if merge.redispatch > 0
                && let Some(first) = first
            {
                let times = merge.redispatch;
                b.g.add_edge(queue, first, Edge::Redispatch { times });
            }
            agents = b.chain(Exit::at(queue), &merge.verify, Edge::Next, agent_ends);
        }
        let job = &plan.job_policy;
        if job.max_attempts > 1
            && let Some(first) = first
        {
            b.g.add_edge(
                item_failed,
                first,
                Edge::ItemRetry {
                    retries: job.max_attempts - 1,
                    schedule: job.retry_delays.clone(),
                },
            );
        }
        let reduce = b.g.add_node(Node::Phase {
            phase: Phase::Reduce,
            origin: map.input.span,
        });
        b.link(&agents, reduce, Edge::FanIn);
        let action = |name: &str| Edge::OnItemFailure {
            action: name.to_owned(),
        };
        // Where a failed item's fate is decided: the failure limits are checked there.
        let mut ended = vec![dlq];
        match &job.on_item_failure {
            ItemFailure::Dlq => {
                b.g.add_edge(item_failed, dlq, action("dlq"));
            }
            ItemFailure::Retry => {
                b.g.add_edge(item_failed, dlq, action("retry"));
            }
            ItemFailure::Skip => {
                let skipped = b.g.add_node(Node::ItemSkipped);
                b.g.add_edge(item_failed, skipped, action("skip"));
                b.g.add_edge(skipped, reduce, Edge::FanIn);
                ended.push(skipped);
            }
            // The item is dead-lettered and the job stops: no new agent starts and the
            // reduce does not run.
            ItemFailure::Stop => {
                b.g.add_edge(item_failed, dlq, action("stop"));
                let why = "on_item_failure: stop".to_owned();
                b.g.add_edge(dlq, failure, Edge::Stop { why });
            }
            // The handler runs for the item: a handler that succeeds leaves it failed (not
            // dead-lettered); one that fails dead-letters it.
            ItemFailure::Custom(id) => {
                let (name, steps) = plan.handler(*id).unwrap_or_default();
                let handled = b.chain(
                    Exit::at(item_failed),
                    steps,
                    action(&format!("custom:{name}")),
                    Ends {
                        item_failure: dlq,
                        agent: false,
                    },
                );
                b.link(&handled, reduce, Edge::FanIn);
                ended.push(handled.node);
                ended.extend(handled.continuing);
            }
            ItemFailure::MissingHandler(name) => {
                b.g.add_edge(item_failed, dlq, action(&format!("custom:{name}")));
                let why = format!("no handler `{name}`");
                b.g.add_edge(dlq, failure, Edge::Stop { why });
            }
        }
        if !matches!(
            job.on_item_failure,
            ItemFailure::Stop | ItemFailure::MissingHandler(_)
        ) {
            b.g.add_edge(dlq, reduce, Edge::FanIn);
            // The failure limits stop the job after the item's fate is written.
            if let Some(why) = limits(job) {
                for from in ended {
                    b.g.add_edge(from, failure, Edge::Stop { why: why.clone() });
                }
            }
        }
        exit = b.chain(Exit::at(reduce), &plan.reduce, Edge::Next, ends);
    }
    if let Some(merge) = &plan.merge {
        let node = b.g.add_node(Node::Phase {
            phase: Phase::Merge,
            origin: span_of(plan, &merge.steps),
        });
        b.link(&exit, node, Edge::Next);
        // The resolver of a conflicted merge hangs off the merge: it runs when one conflicts,
        // and a resolved merge goes on to the end.
        if !merge.on_conflict.is_empty() {
            let resolved = b.chain(Exit::at(node), &merge.on_conflict, Edge::OnFailure, ends);
            b.link(&resolved, success, Edge::Next);
        }
        exit = b.chain(Exit::at(node), &merge.steps, Edge::Next, ends);
    }
    b.link(&exit, success, Edge::Next);
    // Named handlers that nothing runs are still drawn (and reported as unreachable). They
    // are drawn before the unused failure node goes: a node added after a removal takes
    // its index, and would be wired to itself.
    for (_, steps) in &plan.handlers {
        let drawn =
            b.g.node_indices()
                .any(|n| matches!(b.g[n], Node::Step { step } if steps.contains(&step)));
        if !drawn && let Some(&first) = steps.first() {
            let node = b.g.add_node(Node::Step { step: first });
            let after = b.after(first, node, ends);
            let _ = b.chain(after, steps.get(1..).unwrap_or_default(), Edge::Next, ends);
        }
    }
    if b.g
        .neighbors_directed(failure, petgraph::Direction::Incoming)
        .next()
        .is_none()
    {
        b.g.remove_node(failure);
    }
    Graph { graph: b.g, start }
}

/// Why a failed item can stop the job, besides `on_item_failure: stop`: `max_failures`,
/// `failure_threshold`, `continue_on_failure: false`.
fn limits(job: &crate::plan::JobPolicy) -> Option<String> {
    let mut why = Vec::new();
    if !job.continue_on_failure {
        why.push("continue_on_failure: false".to_owned());
    }
    if let Some(max) = job.max_failures {
        why.push(format!("max_failures {max}"));
    }
    if let Some(rate) = job.failure_threshold {
        why.push(format!("failure_threshold {rate}"));
    }
    (!why.is_empty()).then(|| why.join(", "))
}

fn span_of(plan: &Plan, steps: &[StepId]) -> Span {
    steps
        .first()
        .and_then(|s| plan.step(*s))
        .map(|s| s.origin)
        .unwrap_or_default()
}

#[derive(Clone, Copy)]
struct Ends {
    /// Where an unhandled failure goes: the failed end, or for map agents the item's fate
    /// (the item-failed node).
    item_failure: NodeIndex,
    /// Whether these are a map agent's own steps, where a failure that was only handled
    /// (an `on_failure` handler without `fail_workflow`) also fails the item.
    agent: bool,
}

/// Where control leaves a chain: its last node, and the nodes whose failure is ignored,
/// which also go on to whatever comes next.
struct Exit {
    node: NodeIndex,
    continuing: Vec<NodeIndex>,
}

impl Exit {
    fn at(node: NodeIndex) -> Self {
        Exit {
            node,
            continuing: Vec::new(),
        }
    }
}

struct Builder<'p> {
    plan: &'p Plan,
    g: StableDiGraph<Node, Edge>,
}

impl Builder<'_> {
    /// Connects an exit to the next node.
    fn link(&mut self, exit: &Exit, to: NodeIndex, edge: Edge) {
        self.g.add_edge(exit.node, to, edge);
        for &from in &exit.continuing {
            self.g.add_edge(from, to, Edge::Continue);
        }
    }

    /// Links `steps` in order after `exit`; `first` is the edge into the first step.
    fn chain(&mut self, mut exit: Exit, steps: &[StepId], first: Edge, ends: Ends) -> Exit {
        let mut edge = first;
        for &step in steps {
            let node = self.g.add_node(Node::Step { step });
            self.link(&exit, node, edge);
            edge = Edge::Next;
            exit = self.after(step, node, ends);
        }
        exit
    }

    /// Wires a step's loops and handlers; returns where control leaves it.
    #[expect(
        clippy::too_many_lines,
        reason = "table-shaped lowering: one arm per way a step goes on (success, failure handlers, retries, exit codes)"
    )]
    fn after(&mut self, id: StepId, node: NodeIndex, ends: Ends) -> Exit {
        let Some(step) = self.plan.step(id) else {
            return Exit::at(node);
        };
        // In a map agent every unhandled failure fails the item; elsewhere, the run.
        let unhandled = ends.item_failure;
        // The steps a step runs are run as a list: a handled failure among them goes on.
        let agent = ends.agent;
        let ends = Ends {
            agent: false,
            ..ends
        };
        let mut exit = Exit::at(node);
        if let PlanCommand::Foreach { steps, .. } = &step.command {
            let body = self.chain(Exit::at(node), steps, Edge::FanOut, ends);
            self.link(&body, node, Edge::FanIn);
        }
        if let Some(retry) = &step.retry {
            if retry.config.attempts > 1 {
                let edge = Edge::Retry {
                    retries: retry.config.attempts - 1,
                    schedule: retry.policy.delays.clone(),
                };
                self.g.add_edge(node, node, edge);
            }
            if let crate::ast::RetryExhausted::Fallback(_) = &retry.config.on_failure {
                let fallback = self.g.add_node(Node::Fallback { step: id });
                self.g.add_edge(node, fallback, Edge::Fallback);
                exit.continuing.push(fallback);
            }
        }
        if let Some(validate) = &step.validate {
            let checked = self.chain(Exit::at(node), &validate.commands, Edge::Next, ends);
            if let Some(on_incomplete) = &validate.on_incomplete {
                let fix = self.chain(
                    Exit::at(checked.node),
                    &on_incomplete.commands,
                    Edge::OnFailure,
                    ends,
                );
                let retries = on_incomplete.max_attempts.saturating_sub(1);
                self.g.add_edge(
                    fix.node,
                    checked.node,
                    Edge::Retry {
                        retries,
                        schedule: Vec::new(),
                    },
                );
                if on_incomplete.fail_workflow {
                    self.g.add_edge(checked.node, unhandled, Edge::OnFailure);
                }
            }
            exit.node = checked.node;
            exit.continuing.extend(checked.continuing);
        }
        if !step.on_success.is_empty() {
            let done = self.chain(
                Exit {
                    node: exit.node,
                    continuing: Vec::new(),
                },
                &step.on_success,
                Edge::OnSuccess,
                ends,
            );
            exit.node = done.node;
            exit.continuing.extend(done.continuing);
        }
        for (code, steps) in &step.on_exit_code {
            let done = self.chain(
                Exit::at(node),
                steps,
                Edge::OnExitCode { code: *code },
                ends,
            );
            exit.continuing.push(done.node);
            exit.continuing.extend(done.continuing);
        }
        match &step.on_failure {
            Some(f) if !f.handler.is_empty() => {
                let handled = self.chain(Exit::at(node), &f.handler, Edge::OnFailure, ends);
                if f.max_attempts > 1 {
                    self.g.add_edge(
                        handled.node,
                        node,
                        Edge::Retry {
                            retries: f.max_attempts - 1,
                            schedule: Vec::new(),
                        },
                    );
                }
                // In a map agent a failure only handled fails the item; a `strategy:
                // fallback` handler that succeeds recovers the step, which goes on.
                if f.fail_workflow || agent {
                    self.g.add_edge(handled.node, unhandled, Edge::OnFailure);
                }
                if !f.fail_workflow && (!agent || step.handler_policy.recovers) {
                    exit.continuing.push(handled.node);
                }
                exit.continuing.extend(handled.continuing);
            }
            Some(f) if !f.fail_workflow => exit.continuing.push(node),
            // A failing handler command is judged by the step it handles.
            None if step.role == crate::plan::Role::Handler => {}
            Some(_) | None => {
                self.g.add_edge(node, unhandled, Edge::OnFailure);
            }
        }
        exit
    }
}

impl Graph {
    /// Nodes in a stable order (insertion order).
    pub fn nodes(&self) -> impl Iterator<Item = (NodeIndex, &Node)> {
        self.graph.node_indices().map(|n| (n, &self.graph[n]))
    }

    /// Edges in a stable order.
    pub fn edges(&self) -> impl Iterator<Item = (NodeIndex, NodeIndex, &Edge)> {
        (&self.graph)
            .edge_references()
            .map(|e| (e.source(), e.target(), e.weight()))
    }

    /// Nodes that no path from the start reaches.
    pub fn unreachable(&self) -> Vec<NodeIndex> {
        let mut seen = vec![false; self.graph.node_bound()];
        let mut stack = vec![self.start];
        while let Some(n) = stack.pop() {
            if std::mem::replace(&mut seen[n.index()], true) {
                continue;
            }
            stack.extend(self.graph.neighbors(n));
        }
        self.graph
            .node_indices()
            .filter(|n| !seen[n.index()])
            .collect()
    }

    /// Whether the graph has a cycle other than retries (which are bounded by definition).
    ///
    /// Kahn's algorithm with an explicit queue: no recursion, so a workflow of any length
    /// is checked in constant stack space (petgraph's cycle check recurses once per node).
    pub fn has_unbounded_cycle(&self) -> bool {
        let bounded = |e: &Edge| {
            matches!(
                e,
                Edge::Retry { .. } | Edge::ItemRetry { .. } | Edge::Redispatch { .. } | Edge::FanIn
            )
        };
        let mut incoming = vec![0usize; self.graph.node_bound()];
        for edge in self.graph.edge_references() {
            if !bounded(edge.weight()) {
                incoming[edge.target().index()] += 1;
            }
        }
        let mut ready: Vec<NodeIndex> = self
            .graph
            .node_indices()
            .filter(|n| incoming[n.index()] == 0)
            .collect();
        let mut removed = 0usize;
        while let Some(node) = ready.pop() {
            removed += 1;
            for edge in self.graph.edges(node) {
                if bounded(edge.weight()) {
                    continue;
                }
                let count = &mut incoming[edge.target().index()];
                *count -= 1;
                if *count == 0 {
                    ready.push(edge.target());
                }
            }
        }
        removed < self.graph.node_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(len: usize, back: Option<Edge>) -> Graph {
        let mut graph = StableDiGraph::new();
        let start = graph.add_node(Node::Start);
        let mut last = start;
        for i in 0..len {
            let node = graph.add_node(Node::Step {
                step: StepId(u32::try_from(i).unwrap()),
            });
            graph.add_edge(last, node, Edge::Next);
            last = node;
        }
        if let Some(edge) = back {
            graph.add_edge(last, start, edge);
        }
        Graph { graph, start }
    }

    #[test]
    fn only_cycles_other_than_retries_are_unbounded() {
        assert!(!chain(3, None).has_unbounded_cycle());
        let retry = Edge::Retry {
            retries: 2,
            schedule: Vec::new(),
        };
        assert!(!chain(3, Some(retry)).has_unbounded_cycle());
        assert!(!chain(3, Some(Edge::FanIn)).has_unbounded_cycle());
        assert!(chain(3, Some(Edge::Next)).has_unbounded_cycle());
    }

    #[test]
    fn a_long_chain_is_checked_without_recursion() {
        // Deep enough to overflow the 2 MiB stack of a test thread with a recursive search.
        assert!(!chain(200_000, None).has_unbounded_cycle());
        assert!(chain(200_000, Some(Edge::Next)).has_unbounded_cycle());
    }
}
