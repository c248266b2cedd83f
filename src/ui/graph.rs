//! The dashboard's picture of a plan: the graph `prodigy graph --format json` prints, laid out
//! in layers here (no Graphviz) and drawn as SVG, each step node coloured by its live state.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use prodigy_runtime::live::{Picture, State};
use serde_json::Value;

const WIDTH: usize = 260;
const HEIGHT: usize = 46;
const GAP_X: usize = 30;
const GAP_Y: usize = 34;

/// The graph of the workflow at PATH as `prodigy graph --format json` gives it; `None` when
/// it cannot be read or has errors now.
pub(crate) fn plan_graph(path: &std::path::Path) -> Option<Value> {
    let file = prodigy_compiler::source::SourceFile::load(path).ok()?;
    let checked = prodigy_compiler::check(&file);
    let (Some(plan), Some(graph)) = (&checked.plan, &checked.graph) else {
        return None;
    };
    Some(prodigy_compiler::emit::json(graph, plan, &file))
}

/// Layers: each node's longest distance from the nodes nothing points at, over the edges
/// that do not go back (a retry's loop).
fn layers(ids: &[String], edges: &[(usize, usize)]) -> Vec<usize> {
    let n = ids.len();
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in edges {
        out[a].push(b);
    }
    // Depth-first order marks back edges (to a node on the stack).
    let mut state = vec![0u8; n];
    let mut forward = vec![Vec::new(); n];
    for root in 0..n {
        if state[root] != 0 {
            continue;
        }
        let mut stack = vec![(root, 0usize)];
        state[root] = 1;
        while let Some((node, next)) = stack.pop() {
            if let Some(&to) = out[node].get(next) {
                stack.push((node, next + 1));
                match state[to] {
                    0 => {
                        forward[node].push(to);
                        state[to] = 1;
                        stack.push((to, 0));
                    }
                    2 => forward[node].push(to),
                    _ => {}
                }
            } else {
                state[node] = 2;
            }
        }
    }
    // Longest path over the forward edges, in a topological order (reverse post-order).
    let mut order = Vec::with_capacity(n);
    let mut seen = vec![false; n];
    for root in 0..n {
        if seen[root] {
            continue;
        }
        let mut stack = vec![(root, 0usize)];
        seen[root] = true;
        while let Some((node, next)) = stack.pop() {
            if let Some(&to) = forward[node].get(next) {
                stack.push((node, next + 1));
                if !seen[to] {
                    seen[to] = true;
                    stack.push((to, 0));
                }
            } else {
                order.push(node);
            }
        }
    }
    order.reverse();
    let mut layer = vec![0usize; n];
    for &node in &order {
        for &to in &forward[node] {
            layer[to] = layer[to].max(layer[node] + 1);
        }
    }
    layer
}

/// The state class of NODE (of KIND) in PICTURE (STEPS by id), and the detail line under
/// its label.
fn node_state(
    node: &Value,
    kind: &str,
    steps: &BTreeMap<u32, &prodigy_runtime::live::StepLive>,
    picture: &Picture,
) -> (&'static str, String) {
    match kind {
        "step" | "fallback" => node["step"]
            .as_u64()
            .and_then(|s| u32::try_from(s).ok())
            .and_then(|s| steps.get(&s))
            .map_or(("idle", String::new()), |s| {
                let state = if s.running > 0 {
                    "running"
                } else if s.failed > 0 {
                    "failed"
                } else if s.succeeded > 0 {
                    "done"
                } else {
                    "idle"
                };
                let mut d = format!(
                    "{} running · {} ok · {} failed",
                    s.running, s.succeeded, s.failed
                );
                if s.retries > 0 {
                    let _ = write!(d, " · {} retries", s.retries);
                }
                (state, d)
            }),
        "dlq" => (
            if picture.counts.dlq > 0 {
                "failed"
            } else {
                "idle"
            },
            format!("{} items", picture.counts.dlq),
        ),
        "breaker" => (
            match picture.breaker {
                Some("open") => "failed",
                Some("half_open") => "running",
                _ => "idle",
            },
            picture.breaker.unwrap_or("closed").replace('_', "-"),
        ),
        "phase" => (
            phase_state(node["phase"].as_str().unwrap_or_default(), picture),
            String::new(),
        ),
        // The ends, as `graph --status` colours them once the run reached them.
        "start" => ("done", String::new()),
        "success" => (
            if picture.state == State::Completed {
                "done"
            } else {
                "idle"
            },
            String::new(),
        ),
        "failure" => (
            match picture.state {
                State::Failed | State::Stopped => "failed",
                State::Running
                | State::Paused
                | State::Crashed
                | State::Completed
                | State::Interrupted => "idle",
            },
            String::new(),
        ),
        _ => ("idle", String::new()),
    }
}

/// The state of the phase node PHASE: the job's current phase runs (while it runs), the
/// phases before it are done, and a completed job's are all done.
fn phase_state(phase: &str, picture: &Picture) -> &'static str {
    // A job's phases in the order it goes through them (the verified queue runs with map).
    let rank = |p: &str| match p {
        "setup" => Some(0),
        "map" | "verify" => Some(1),
        "reduce" => Some(2),
        "merge" => Some(3),
        "done" => Some(4),
        _ => None,
    };
    if picture.state == State::Completed {
        return "done";
    }
    let (Some(this), Some(now)) = (rank(phase), picture.phase.as_deref().and_then(rank)) else {
        return "idle";
    };
    let live = matches!(picture.state, State::Running | State::Paused);
    match this.cmp(&now) {
        std::cmp::Ordering::Less => "done",
        std::cmp::Ordering::Equal if live => "running",
        std::cmp::Ordering::Equal | std::cmp::Ordering::Greater => "idle",
    }
}

/// Adds the edge FROM -> TO (with its LABEL) to SVG: a line down to a later layer (LAYER
/// of each node), or a curve around the right side back to an earlier one.
fn draw_edge(
    svg: &mut String,
    place: &[(usize, usize)],
    layer: &[usize],
    (from, to): (usize, usize),
    label: Option<&str>,
) {
    let (fx, fy) = place[from];
    let (tx, ty) = place[to];
    let (x1, y1) = (fx + WIDTH / 2, fy + HEIGHT);
    let (x2, y2) = (tx + WIDTH / 2, ty);
    let back = layer[to] <= layer[from];
    if back {
        // A loop back: around the right side.
        let side = fx.max(tx) + WIDTH + GAP_X / 2;
        let _ = write!(
            svg,
            r#"<path d="M{} {} C{side} {} {side} {} {} {}" class="edge back" marker-end="url(#arrow)"/>"#,
            fx + WIDTH,
            fy + HEIGHT / 2,
            fy + HEIGHT / 2,
            ty + HEIGHT / 2,
            tx + WIDTH,
            ty + HEIGHT / 2
        );
    } else {
        let _ = write!(
            svg,
            r#"<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" class="edge" marker-end="url(#arrow)"/>"#
        );
    }
    if let Some(label) = label.filter(|_| !back) {
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" class="edge-label">{}</text>"#,
            usize::midpoint(x1, x2) + 4,
            usize::midpoint(y1, y2),
            escape(label)
        );
    }
}

/// The SVG of GRAPH with the live state of PICTURE.
pub(crate) fn svg(graph: &Value, picture: &Picture) -> String {
    let empty = Vec::new();
    let nodes = graph["nodes"].as_array().unwrap_or(&empty);
    let ids: Vec<String> = nodes
        .iter()
        .map(|n| n["id"].as_str().unwrap_or_default().to_owned())
        .collect();
    let index: BTreeMap<&str, usize> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let edges: Vec<(usize, usize, Option<String>)> = graph["edges"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter_map(|e| {
            let from = *index.get(e["from"].as_str()?)?;
            let to = *index.get(e["to"].as_str()?)?;
            Some((from, to, e["label"].as_str().map(str::to_owned)))
        })
        .collect();
    let pairs: Vec<(usize, usize)> = edges.iter().map(|(a, b, _)| (*a, *b)).collect();
    let layer = layers(&ids, &pairs);
    let mut rows: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (node, l) in layer.iter().enumerate() {
        rows.entry(*l).or_default().push(node);
    }
    let widest = rows.values().map(Vec::len).max().unwrap_or(1);
    let total_w = widest * (WIDTH + GAP_X) + GAP_X;
    let total_h = rows.len() * (HEIGHT + GAP_Y) + GAP_Y;
    let mut place = vec![(0usize, 0usize); ids.len()];
    for (row, members) in rows.values().enumerate() {
        let offset = usize::midpoint(total_w - members.len() * (WIDTH + GAP_X), GAP_X);
        for (col, node) in members.iter().enumerate() {
            place[*node] = (
                offset + col * (WIDTH + GAP_X),
                GAP_Y + row * (HEIGHT + GAP_Y),
            );
        }
    }
    let steps: BTreeMap<u32, &prodigy_runtime::live::StepLive> =
        picture.steps.iter().map(|s| (s.step_id, s)).collect();
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {total_w} {total_h}" width="{total_w}" height="{total_h}" class="plan"><defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0L10,5L0,10z" fill="#888"/></marker></defs>"##
    );
    for (from, to, label) in &edges {
        draw_edge(&mut svg, &place, &layer, (*from, *to), label.as_deref());
    }
    for (i, node) in nodes.iter().enumerate() {
        let (x, y) = place[i];
        let kind = node["kind"].as_str().unwrap_or("step");
        let label = node["label"].as_str().unwrap_or_default();
        let (state, detail) = node_state(node, kind, &steps, picture);
        let _ = write!(
            svg,
            r#"<g class="node {kind} {state}" data-id="{}" data-step="{}"><title>{}</title><rect x="{x}" y="{y}" width="{WIDTH}" height="{HEIGHT}" rx="6"/><text x="{}" y="{}" class="label">{}</text><text x="{}" y="{}" class="detail">{}</text></g>"#,
            escape(&ids[i]),
            node["step"]
                .as_u64()
                .map_or_else(String::new, |s| s.to_string()),
            escape(label),
            x + 8,
            y + 19,
            escape(&cut(label, 36)),
            x + 8,
            y + 37,
            escape(&detail),
        );
    }
    svg.push_str("</svg>");
    svg
}

/// TEXT's first line cut to N characters.
fn cut(text: &str, n: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() > n || text.contains('\n') {
        let mut c: String = line.chars().take(n - 1).collect();
        c.push('…');
        c
    } else {
        line.to_owned()
    }
}

/// TEXT for XML.
pub(crate) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_follow_the_longest_path_and_a_loop_back_does_not_lift_its_target() {
        let ids: Vec<String> = ["a", "b", "c", "d"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        // a → b → c, a → c, c → b (a retry loop), c → d.
        let layer = layers(&ids, &[(0, 1), (1, 2), (0, 2), (2, 1), (2, 3)]);
        assert_eq!(layer, [0, 1, 2, 3]);
    }
}
