//! The runtime's layers (ARCHITECTURE.md, "Layers"), held against its code: a module imports
//! only from its own layer or lower ones, and no modules import each other in a cycle.
//!
//! A module is a file or directory under `runtime/src` named in [`LAYERS`] (the longest
//! named prefix of its path); what it imports is every `crate::…` and `super::…` path in its
//! code (comments and `#[cfg(test)]` modules left out), resolved the same way.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each layer, bottom first, with its modules. Everything under `runtime/src` must be named
/// here (a new top-level module is given its layer when it is made).
const LAYERS: &[(&str, &[&str])] = &[
    (
        "state",
        &[
            // The on-disk state and its vocabulary.
            "layout",
            "durable",
            "store",
            "jobstore",
            "dlq",
            "merge_journal",
            "logs",
            "events",
            "message",
            "progress",
            "runs",
            "job",
            "vars",
            "confine",
            "text",
            "claude::kinds",
            "claude::budget",
            "claude::pricing",
            "backend::task",
            "worktree::records",
            "worktree::refs",
            "mapreduce::metrics",
            // The pure machines: transition functions over the plan and their own types.
            "machine",
            "breaker",
            "sequence",
            "claude::limit",
            "claude::governor",
        ],
    ),
    (
        "execution",
        &[
            "exec",
            "executor",
            "reap",
            "input",
            "claude",
            "backend",
            "worktree::command",
        ],
    ),
    (
        "orchestration",
        &["runner", "step", "mapreduce", "session", "worktree"],
    ),
    ("read model", &["live"]),
];

/// Imports that still run back up or close a cycle, each `FROM -> TO`: the debt of the
/// redesign, listed so that none is added. The test fails when one of them is gone too, so
/// that the list stays exactly what is left.
///
/// What is left is one piece of work: the backends take `&Runner` in `dispatch`, and `step`,
/// `session` and `mapreduce` reach `Runner` and it them (`step`'s `impl Runner` blocks);
/// narrow services for the backends and a runner that hands steps what they use remove them.
const KNOWN: &[&str] = &[
    "backend -> mapreduce",
    "backend -> runner",
    "mapreduce -> runner",
    "mapreduce -> session",
    "mapreduce -> step",
    "runner -> mapreduce",
    "runner -> step",
    "session -> runner",
    "step -> runner",
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The module path of FILE under `src` (`claude/limit.rs` → `claude::limit`,
/// `claude/mod.rs` → `claude`).
fn module_of(file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src()).unwrap_or(file);
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The unit (a [`LAYERS`] name) a module path belongs to: its longest named prefix.
fn unit_of(path: &[String]) -> Option<&'static str> {
    let joined = path.join("::");
    LAYERS
        .iter()
        .flat_map(|(_, units)| units.iter())
        .filter(|u| joined == **u || joined.starts_with(&format!("{u}::")))
        .max_by_key(|u| u.len())
        .copied()
}

fn layer_of(unit: &str) -> usize {
    LAYERS
        .iter()
        .position(|(_, units)| units.contains(&unit))
        .unwrap_or(usize::MAX)
}

/// TEXT without comments, string literals' contents and `#[cfg(test)]` items.
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]" {
            // Skip the item: up to the line where its braces close (or its `;`).
            let mut depth = 0usize;
            for item in lines.by_ref() {
                depth =
                    (depth + item.matches('{').count()).saturating_sub(item.matches('}').count());
                if depth == 0 && (item.contains('}') || item.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        let line = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The paths TEXT names after `crate::` or `super::`, with `{…}` groups expanded, each as
/// the segments after the keyword; `super` is resolved against MODULE.
fn imports(text: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let bytes = text.as_bytes();
    for keyword in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(keyword) {
            let start = from + at;
            from = start + keyword.len();
            let before = start.checked_sub(1).map(|i| bytes[i]);
            if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':') {
                continue;
            }
            let base: Vec<String> = if keyword == "crate::" {
                Vec::new()
            } else {
                // `super` of `a/b.rs` is `a`; of `a/b/mod.rs` (module `a::b`) it is `a` too.
                let mut base = module.to_vec();
                base.pop();
                let mut rest = from;
                while text[rest..].starts_with("super::") {
                    base.pop();
                    rest += "super::".len();
                }
                from = rest;
                base
            };
            for tail in expand(&text[from..]) {
                let mut path = base.clone();
                path.extend(tail);
                found.push(path);
            }
        }
    }
    found
}

/// The paths at the start of TEXT: `a::b::C` or `a::{b, c::{D, E}}`.
fn expand(text: &str) -> Vec<Vec<String>> {
    if let Some(group) = text.strip_prefix('{') {
        return split_group(group)
            .into_iter()
            .flat_map(|item| expand(item.trim()))
            .collect();
    }
    let mut segments = Vec::new();
    let mut rest = text;
    loop {
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            break;
        }
        rest = &rest[name.len()..];
        segments.push(name);
        if let Some(after) = rest.strip_prefix("::") {
            rest = after;
            if let Some(group) = rest.strip_prefix('{') {
                let mut out = Vec::new();
                for item in split_group(group) {
                    for tail in expand(item.trim()) {
                        let mut path = segments.clone();
                        path.extend(tail);
                        out.push(path);
                    }
                }
                return out;
            }
        } else {
            break;
        }
    }
    if segments.is_empty() {
        Vec::new()
    } else {
        vec![segments]
    }
}

/// The top-level items of a `{…}` group that GROUP starts inside, up to its `}`.
fn split_group(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether FILE holds only tests: `testing/`, `tests.rs`, `*_tests.rs`.
fn is_test_file(module: &[String]) -> bool {
    module.first().is_some_and(|m| m == "testing")
        || module
            .last()
            .is_some_and(|m| m == "tests" || m.ends_with("_tests"))
}

/// Every arrow between two different units (`FROM -> TO`, with where it is), and the
/// modules no layer names.
type Arrows = BTreeMap<(String, String), String>;

fn arrows() -> (Arrows, Vec<String>) {
    let mut unplaced = Vec::new();
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files.sort();
    let mut out = BTreeMap::new();
    for file in files {
        let module = module_of(&file);
        if module.is_empty() || is_test_file(&module) {
            continue;
        }
        let Some(from) = unit_of(&module) else {
            unplaced.push(module.join("::"));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for path in imports(&code(&text), &module) {
            // `crate::lock` and other items of the crate root belong to no layer.
            let Some(to) = unit_of(&path) else { continue };
            if to != from {
                let at = file
                    .strip_prefix(src())
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                out.entry((from.to_owned(), to.to_owned())).or_insert(at);
            }
        }
    }
    (out, unplaced)
}

/// The arrows of a cycle: those whose ends are in one strongly connected component.
fn cyclic(arrows: &BTreeSet<(String, String)>) -> BTreeSet<(String, String)> {
    let reach = |from: &str, to: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_owned()];
        while let Some(at) = todo.pop() {
            if at == to {
                return true;
            }
            if seen.insert(at.clone()) {
                todo.extend(
                    arrows
                        .iter()
                        .filter(|(a, _)| *a == at)
                        .map(|(_, b)| b.clone()),
                );
            }
        }
        false
    };
    arrows
        .iter()
        .filter(|(a, b)| reach(b, a))
        .cloned()
        .collect()
}

#[test]
fn no_module_imports_from_a_layer_above_it_or_in_a_cycle() {
    let (arrows, unplaced) = arrows();
    assert!(unplaced.is_empty(), "modules no layer names: {unplaced:?}");
    assert!(
        arrows.len() > 50,
        "the scan found too few imports: {arrows:?}"
    );
    // Arrows that run up are reported as such; the cycles left are among the others (every
    // cycle through an arrow that runs up goes once that arrow does).
    let level: BTreeSet<(String, String)> = arrows
        .keys()
        .filter(|(from, to)| layer_of(to) <= layer_of(from))
        .cloned()
        .collect();
    let in_cycles = cyclic(&level);
    let mut bad: Vec<String> = Vec::new();
    for ((from, to), at) in &arrows {
        let up = layer_of(to) > layer_of(from);
        let cycle = in_cycles.contains(&(from.clone(), to.clone()));
        if up || cycle {
            let why = if up { "runs up" } else { "closes a cycle" };
            bad.push(format!("{from} -> {to}  ({why}; e.g. in {at})"));
        }
    }
    let names: BTreeSet<String> = bad
        .iter()
        .map(|b| b.split("  (").next().unwrap_or_default().to_owned())
        .collect();
    let known: BTreeSet<String> = KNOWN.iter().map(|k| (*k).to_owned()).collect();
    let new: Vec<&String> = bad
        .iter()
        .filter(|b| !known.contains(b.split("  (").next().unwrap_or_default()))
        .collect();
    let gone: Vec<&String> = known.difference(&names).collect();
    assert!(
        new.is_empty() && gone.is_empty(),
        "imports that run up a layer or close a cycle ({} of them):\n{}\n\nlisted in KNOWN but gone: {gone:?}",
        new.len(),
        new.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
    );
}

#[test]
fn the_scan_resolves_groups_super_and_comments() {
    let module: Vec<String> = vec!["claude".into(), "limit".into()];
    let text = code(
        "use crate::{events::Event, claude::{kinds::ErrorKind, Call}};\n\
         // crate::runner::Runner in a comment\n\
         fn f() { super::Note::x(); crate::lock(); }\n\
         #[cfg(test)]\nmod tests {\n    use crate::live::Live;\n}\n",
    );
    let found: Vec<String> = imports(&text, &module)
        .iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        found,
        [
            "events::Event",
            "claude::kinds::ErrorKind",
            "claude::Call",
            "lock",
            "claude::Note::x"
        ]
    );
    let units: Vec<Option<&str>> = imports(&text, &module).iter().map(|p| unit_of(p)).collect();
    assert_eq!(
        units,
        [
            Some("events"),
            Some("claude::kinds"),
            Some("claude"),
            None,
            Some("claude")
        ]
    );
    // A cycle of two is found, a chain is not.
    let pairs: BTreeSet<(String, String)> = [("a", "b"), ("b", "a"), ("b", "c")]
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
    assert_eq!(cyclic(&pairs).len(), 2);
}
