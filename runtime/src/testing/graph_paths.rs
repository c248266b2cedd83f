//! What `prodigy graph` draws for a map agent is what runs: for every fixture with a map
//! phase, each item's way through the agent as the events show it, for every combination of
//! its commands succeeding or failing, is a path of the graph, and each path the graph draws
//! from the map phase to an item's fate is one such run.
//!
//! An item's path starts at the map phase and ends where its fate is decided: the reduce
//! (it succeeded, or a `custom:` handler handled it), the DLQ, or "item skipped". Its nodes
//! come from its events: `step_started` (a step, a handler command), `fallback_started`,
//! `agent_failed` (item failed), `dlq_item_added`, `item_skipped`, `agent_completed` and a
//! successful `item_handler_finished` (the reduce). A step run again (its own retries) is
//! one node; the item's retries repeat its run, which the graph draws as the item retry
//! edge, with the delays the events show.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use prodigy_compiler::ir::{self, Edge, Node, Phase};
use prodigy_plan::{Plan, PlanCommand, StepId};
use serde_json::Value;

use super::{FakeExecutor, Harness, Reply};
use crate::mapreduce::JobOptions;

/// The most commands whose outcomes are combined (2^N runs per fixture).
const MOST_COMMANDS: usize = 6;

/// A node by its index in the graph.
type NodeIndex = usize;
type Path_ = Vec<NodeIndex>;

/// The graph as plain lists, in its stable order.
struct Graph {
    nodes: Vec<(NodeIndex, Node)>,
    edges: Vec<(NodeIndex, NodeIndex, Edge)>,
}

impl Graph {
    fn of(graph: &ir::Graph) -> Self {
        Graph {
            nodes: graph.nodes().map(|(i, n)| (i.index(), n.clone())).collect(),
            edges: graph
                .edges()
                .map(|(a, b, e)| (a.index(), b.index(), e.clone()))
                .collect(),
        }
    }

    fn at(&self, index: NodeIndex) -> &Node {
        &self.nodes.iter().find(|(i, _)| *i == index).unwrap().1
    }

    fn from(&self, index: NodeIndex) -> impl Iterator<Item = &(NodeIndex, NodeIndex, Edge)> {
        self.edges.iter().filter(move |(a, ..)| *a == index)
    }
}

/// Policies no fixture has, as workflows of their own.
const MORE: &[(&str, &str)] = &[(
    "inline-stop",
    r#"
name: inline-stop
mode: mapreduce
map:
  input: "seq 1 1"
  agent_template:
    - shell: "echo check ${item}"
      on_failure:
        shell: "echo cleanup ${item}"
        fail_workflow: true
    - shell: "echo build ${item}"
      on_failure:
        strategy: fallback
        commands:
          - shell: "echo fallback ${item}"
error_policy:
  on_item_failure: stop
  retry_config:
    max_attempts: 3
    backoff:
      exponential:
        initial: 1s
reduce:
  - shell: "echo done"
"#,
)];

fn fixtures() -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows");
    let mut out = Vec::new();
    for dir in ["examples", "run"] {
        let mut files: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yml"))
            .collect();
        files.sort();
        out.extend(files);
    }
    out
}

/// The longest literal run of TEMPLATE's text, outside `${...}`: what picks out its command
/// among the rendered commands the fake sees.
fn marker(template: &str) -> String {
    let mut best = String::new();
    let mut rest = template;
    loop {
        let (literal, after) = match rest.find("${") {
            Some(at) => (&rest[..at], Some(&rest[at..])),
            None => (rest, None),
        };
        if literal.trim().len() > best.trim().len() {
            best = literal.to_owned();
        }
        let Some(after) = after else { break };
        match after.find('}') {
            Some(end) => rest = &after[end + 1..],
            None => break,
        }
    }
    best
}

/// The shell commands an item can run (its agent's steps, what they trigger, the
/// `on_item_failure` handler), as markers; none when one cannot be scripted.
fn markers(plan: &Plan) -> Option<Vec<String>> {
    let map = plan.map.as_ref()?;
    let mut roots: Vec<StepId> = map.steps.clone();
    for (_, steps) in &plan.handlers {
        roots.extend(steps);
    }
    let mut out = Vec::new();
    for id in prodigy_compiler::checks::subtree(plan, &roots) {
        let step = plan.step(id)?;
        match &step.command {
            PlanCommand::Shell(t) => out.push(marker(&t.value)),
            PlanCommand::Claude(_) | PlanCommand::WriteFile(_) | PlanCommand::Foreach { .. } => {
                return None;
            }
        }
    }
    // Each marker must pick out one command.
    let distinct = out.iter().all(|m| {
        !m.trim().is_empty() && out.iter().filter(|o| o.contains(m.as_str())).count() == 1
    });
    (distinct && out.len() <= MOST_COMMANDS).then_some(out)
}

fn node(graph: &Graph, wanted: &Node) -> NodeIndex {
    graph
        .nodes
        .iter()
        .find(|(_, n)| n == wanted)
        .map_or_else(|| panic!("the graph has no {wanted:?}"), |(i, _)| *i)
}

fn is_end(node: &Node) -> bool {
    matches!(
        node,
        Node::Phase {
            phase: Phase::Reduce,
            ..
        } | Node::Dlq
            | Node::ItemSkipped
            | Node::Failure
    )
}

/// Every path the graph draws from the map phase to an item's fate, each run of the item
/// taken as often as the item retry edge says (the scripted outcomes repeat), a step's own
/// retries as one node; paths through the circuit breaker are not scripted.
fn graph_paths(graph: &Graph, map: NodeIndex) -> BTreeSet<Path_> {
    let mut done = BTreeSet::new();
    let mut stack: Vec<Path_> = vec![vec![map]];
    while let Some(path) = stack.pop() {
        let last = *path.last().unwrap();
        if path.len() > 1 && is_end(graph.at(last)) {
            done.insert(path);
            continue;
        }
        for (_, to, edge) in graph.from(last) {
            let to = *to;
            let skip = to == last
                || path.contains(&to)
                || matches!(edge, Edge::ItemRetry { .. } | Edge::Reject)
                || matches!(graph.at(to), Node::Breaker { .. });
            if !skip {
                let mut next = path.clone();
                next.push(to);
                stack.push(next);
            }
        }
    }
    // An item that failed runs again from its first step, as often as it is retried.
    let retry = graph.edges.iter().find_map(|(from, to, e)| match e {
        Edge::ItemRetry { retries, .. } => Some((*from, *to, *retries)),
        _ => None,
    });
    let Some((failed, first, retries)) = retry else {
        return done;
    };
    done.into_iter()
        .map(|path| {
            let Some(at) = path.iter().position(|&n| n == failed) else {
                return path;
            };
            let from = path.iter().position(|&n| n == first).unwrap();
            let run = path[from..=at].to_vec();
            let mut out = path[..=at].to_vec();
            for _ in 0..retries {
                out.extend(&run);
            }
            out.extend(&path[at + 1..]);
            out
        })
        .collect()
}

/// Each item's path as its events show it, and the delays of its retries.
fn event_paths(graph: &Graph, plan: &Plan, trace: &super::Trace) -> Vec<(Path_, Vec<f64>)> {
    let map = node(
        graph,
        &Node::Phase {
            phase: Phase::Map,
            origin: plan.map.as_ref().unwrap().input.span,
        },
    );
    let reduce = graph
        .nodes
        .iter()
        .find(|(_, n)| {
            matches!(
                n,
                Node::Phase {
                    phase: Phase::Reduce,
                    ..
                }
            )
        })
        .map(|(i, _)| *i)
        .unwrap();
    let mut items: Vec<(String, Path_, Vec<f64>)> = Vec::new();
    for line in &trace.lines {
        let (kind, fields) = line.split_once(' ').unwrap();
        let event: Value = serde_json::from_str(fields).unwrap();
        let Some(item) = event["item_id"].as_str() else {
            continue;
        };
        let at = if let Some(at) = items.iter().position(|(i, ..)| i == item) {
            at
        } else {
            items.push((item.to_owned(), vec![map], Vec::new()));
            items.len() - 1
        };
        let (_, path, delays) = &mut items[at];
        let last = path.last().copied();
        let step_of = |n: Option<NodeIndex>| match n.map(|n| graph.at(n)) {
            Some(Node::Step { step }) => Some(*step),
            _ => None,
        };
        let next = match kind {
            "step_started" => Some(node(
                graph,
                &Node::Step {
                    step: StepId(u32::try_from(event["step_id"].as_u64().unwrap()).unwrap()),
                },
            )),
            "fallback_started" => step_of(last).map(|step| node(graph, &Node::Fallback { step })),
            "agent_failed" => Some(node(graph, &Node::ItemFailed)),
            "dlq_item_added" => Some(node(graph, &Node::Dlq)),
            "item_skipped" => Some(node(graph, &Node::ItemSkipped)),
            "agent_completed" => Some(reduce),
            "item_handler_finished" if event["success"] == true => Some(reduce),
            // A handled failure of an agent's step fails the item: the event says so.
            "step_finished" => {
                assert_ne!(event["outcome"], "failed_continued", "{line}");
                None
            }
            "item_retry_scheduled" => {
                delays.push(event["delay_secs"].as_f64().unwrap());
                None
            }
            _ => None,
        };
        if let Some(next) = next
            && last != Some(next)
        {
            path.push(next);
        }
    }
    items.into_iter().map(|(_, p, d)| (p, d)).collect()
}

/// The workflow to run, with its input where the run finds it: a command's input (which
/// would run as a process, off the paused clock) becomes a file of one item; the file a
/// setup writes (the fake runs no setup) is written with one item of its shape.
fn runnable(fixture: &Path, yaml: &str, plan: &Plan, project: &Path) -> Option<String> {
    let map = plan.map.as_ref()?;
    let input = &map.input.value;
    if input.contains(' ') {
        let items = if map.json_path.is_some() {
            // What the command prints (an `echo` of JSON), for the `json_path` to read.
            printed(input)?
        } else {
            "[1]".to_owned()
        };
        std::fs::write(project.join("graph-paths-items.json"), items).unwrap();
        let (start, end) = (map.input.span.start as usize, map.input.span.end as usize);
        let key = yaml[..start].rfind("input:")?;
        // A block scalar's span takes the line break and the next line's indent.
        let written = &yaml[start..end];
        let after = &written[written.trim_end().len()..];
        let mut out = yaml.to_owned();
        out.replace_range(key..end, &format!("input: graph-paths-items.json{after}"));
        return Some(out);
    }
    let beside = fixture.parent()?.join(input);
    if beside.is_file() {
        std::fs::copy(&beside, project.join(input)).unwrap();
        return Some(yaml.to_owned());
    }
    if fixture.file_stem().is_some_and(|s| s == "docs-check") {
        std::fs::write(
            project.join(input),
            "{\"path\": \"README.md\", \"lines\": 3}\n",
        )
        .unwrap();
        return Some(yaml.to_owned());
    }
    None
}

/// What TEXT prints when it is an `echo` or `printf`, perhaps piped into a filter that only
/// reads (`wc`, `tr`, `cut`, `head`, `tail`, `sort`): the captured output of a setup or an
/// agent step. Run at once, since it takes no time, in the temporary directory, never with
/// a redirection or a second command; `None` for anything else.
fn printed(text: &str) -> Option<String> {
    let text = text.trim_start();
    let mut stages = text.split('|');
    let first = stages.next().unwrap_or_default();
    let filters = stages.all(|stage| {
        let word = stage.split_whitespace().next().unwrap_or_default();
        ["wc", "tr", "cut", "head", "tail", "sort"].contains(&word)
    });
    let plain = (first.starts_with("echo ") || first.starts_with("printf "))
        && filters
        && !text.contains(['>', '<', ';', '&', '`'])
        && !text.contains("$(")
        && !text.contains("||");
    if !plain {
        return None;
    }
    let out = std::process::Command::new("sh")
        .args(["-c", text])
        .current_dir(std::env::temp_dir())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn show(graph: &Graph, plan: &Plan, path: &Path_) -> String {
    let names: Vec<String> = path
        .iter()
        .map(|&n| match graph.at(n) {
            Node::Step { step } => format!("`{}`", plan.step(*step).unwrap().label),
            other => format!("{other:?}"),
        })
        .collect();
    names.join(" → ")
}

/// What comparing one fixture found.
#[derive(Default)]
struct Outcome {
    stem: String,
    with_map: bool,
    compared: bool,
    /// A step's failure was handled (`failed_handled`) in one of its runs.
    handled: bool,
}

/// Whether PLAN's map agent has a Claude step: such a fixture is left out (the fake cannot
/// play a Claude session that commits); every other one with a map phase is compared.
fn claude_agent(plan: &Plan) -> bool {
    plan.map.as_ref().is_some_and(|m| {
        prodigy_compiler::checks::subtree(plan, &m.steps)
            .into_iter()
            .any(|id| {
                matches!(
                    plan.step(id).map(|s| &s.command),
                    Some(PlanCommand::Claude(_))
                )
            })
    })
}

/// Runs FIXTURE's map agent for every combination of its commands' outcomes and compares
/// each item's way with the graph's paths (the module's header says how).
async fn compare(fixture: &Path, yaml: &str) -> Outcome {
    let yaml = yaml.to_owned();
    let fixture = fixture.to_owned();
    let mut outcome = Outcome::default();
    let stem = fixture.file_stem().unwrap().to_string_lossy().into_owned();
    outcome.stem.clone_from(&stem);
    let plan = Harness::plan(&yaml);
    if plan.map.is_some() && !claude_agent(&plan) {
        outcome.with_map = true;
    }
    let Some(markers) = plan.map.as_ref().and(markers(&plan)) else {
        return outcome;
    };
    if plan.job_policy.jitter.is_some() {
        return outcome;
    }
    let graph = Graph::of(&ir::build(&plan));
    let map = node(
        &graph,
        &Node::Phase {
            phase: Phase::Map,
            origin: plan.map.as_ref().unwrap().input.span,
        },
    );
    let drawn = graph_paths(&graph, map);
    let schedule: Vec<f64> = graph
        .edges
        .iter()
        .find_map(|(_, _, e)| match e {
            Edge::ItemRetry { schedule, .. } => Some(schedule.clone()),
            _ => None,
        })
        .unwrap_or_default()
        .iter()
        .map(Duration::as_secs_f64)
        .collect();
    // A setup whose output is captured gets what its `echo`s print; elsewhere a command
    // succeeds with nothing (no process runs).
    let captures = yaml.contains("capture_outputs:");
    let mut seen = BTreeSet::new();
    let mut scripted = true;
    for failing in 0..1u32 << markers.len() {
        let fails: Vec<String> = markers
            .iter()
            .enumerate()
            .filter(|(i, _)| failing & (1 << i) != 0)
            .map(|(_, m)| m.clone())
            .collect();
        let fake = FakeExecutor::new().rule(move |text| {
            if fails.iter().any(|m| text.contains(m.as_str())) {
                Reply::exit(1).stderr("scripted failure\n")
            } else if let Some(out) = captures.then(|| printed(text)).flatten() {
                Reply::ok().stdout(&out)
            } else {
                Reply::ok()
            }
        });
        let harness = Harness::new(fake);
        let Some(runnable) = runnable(&fixture, &yaml, &plan, harness.project.path()) else {
            scripted = false;
            break;
        };
        let (_, trace) = harness.run_job(&runnable, JobOptions::default()).await;
        outcome.handled |= trace.lines.iter().any(|l| {
            l.starts_with("step_finished ") && l.contains(r#""outcome":"failed_handled""#)
        });
        if std::env::var_os("GRAPH_PATHS_DEBUG").is_some() {
            eprintln!("{stem} {failing}\n{}", trace.text());
        }
        for (path, delays) in event_paths(&graph, &plan, &trace) {
            assert!(
                drawn.contains(&path),
                "{stem}: the run took {}, which the graph does not draw; it draws:\n{}",
                show(&graph, &plan, &path),
                drawn
                    .iter()
                    .map(|p| show(&graph, &plan, p))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            assert_eq!(
                delays,
                schedule[..delays.len().min(schedule.len())],
                "{stem}: the item's retries waited otherwise than the graph says"
            );
            seen.insert(path);
        }
    }
    if !scripted {
        return outcome;
    }
    for path in &drawn {
        assert!(
            seen.contains(path),
            "{stem}: the graph draws {}, which no scripted run took",
            show(&graph, &plan, path)
        );
    }
    outcome.compared = true;
    outcome
}

/// Each fixture runs on a thread of its own, with its own paused clock: the runs wait on the
/// disk (every state write is synced), hardly on the processor, so side by side they overlap.
#[test]
fn every_path_of_a_map_agent_runs_and_every_run_is_drawn() {
    let mut workflows: Vec<(std::path::PathBuf, String)> = fixtures()
        .into_iter()
        .map(|f| {
            let yaml = std::fs::read_to_string(&f).unwrap();
            (f, yaml)
        })
        .collect();
    for (name, yaml) in MORE {
        workflows.push((format!("{name}.yml").into(), (*yaml).to_owned()));
    }
    let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
        let handles: Vec<_> = workflows
            .iter()
            .map(|(fixture, yaml)| {
                scope.spawn(move || {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .start_paused(true)
                        .build()
                        .unwrap()
                        .block_on(compare(fixture, yaml))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let compared: Vec<String> = outcomes
        .iter()
        .filter(|o| o.compared)
        .map(|o| o.stem.clone())
        .collect();
    let with_map: Vec<String> = outcomes
        .iter()
        .filter(|o| o.with_map)
        .map(|o| o.stem.clone())
        .collect();
    let handled = outcomes.iter().any(|o| o.handled);
    eprintln!("compared: {compared:?}");
    let missing: Vec<&String> = with_map.iter().filter(|s| !compared.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "fixtures with a map phase the comparison left out: {missing:?}"
    );
    assert!(handled, "no step_finished event said `failed_handled`");
    // The comparison covers the fixtures that exercise each `on_item_failure`.
    for wanted in [
        "docs-check",
        "mapreduce-custom-handler",
        "mapreduce-skip",
        "mapreduce-handled-failure",
        "inline-stop",
    ] {
        assert!(
            compared.iter().any(|c| c == wanted),
            "{wanted} was not compared: {compared:?}"
        );
    }
}
