//! Editor support: the documentation of the key under the cursor, and completions.
//!
//! Both walk the spanned YAML tree from the root along the shape tables of [`crate::shapes`],
//! the same tables lowering checks keys against. A half-typed document still gets answers:
//! when the text does not parse, the line under the cursor is blanked and parsing retried.

use std::ops::Range;

use crate::shapes::{self, Shape, Ty};
use crate::source::SourceFile;
use crate::syntax::{self, Node, NodeKind};

/// What a completion inserts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionKind {
    /// A mapping key.
    Key,
    /// A variable inside `${`.
    Variable,
}

/// One completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The text offered.
    pub label: String,
    /// A line of documentation.
    pub detail: String,
    /// What it is.
    pub kind: CompletionKind,
}

/// Where a value sits: a type to interpret it with.
#[derive(Clone, Copy)]
enum At {
    Ty(&'static Ty),
    Shape(&'static Shape),
    Steps,
    Step,
}

/// The shape a mapping node has, given what is expected there.
fn shape_of(at: At, node: &Node) -> Option<&'static Shape> {
    match at {
        At::Shape(shape) => Some(shape),
        At::Step | At::Steps => Some(&shapes::STEP),
        At::Ty(ty) => match ty {
            Ty::Object(shape) => Some(shape),
            Ty::Step | Ty::HandlerStep | Ty::Steps => Some(&shapes::STEP),
            Ty::OneOf(options) => {
                // `on_failure`: the detailed form is the mapping with `commands`.
                let has_commands = node
                    .as_map()
                    .is_some_and(|m| m.iter().any(|e| e.key.text() == Some("commands")));
                let shapes: Vec<&'static Shape> = options
                    .iter()
                    .filter_map(|o| match o {
                        Ty::Object(s) => Some(*s),
                        Ty::Step | Ty::HandlerStep | Ty::Steps => Some(&shapes::STEP),
                        _ => None,
                    })
                    .collect();
                shapes
                    .iter()
                    .find(|s| s.key("commands").is_some() == has_commands)
                    .or_else(|| shapes.first())
                    .copied()
            }
            _ => None,
        },
    }
}

/// What is expected inside a value of `at` for a child (a mapping value or a list item).
fn child(at: At, node: &Node, key: Option<&str>) -> Option<At> {
    match (at, key) {
        (At::Steps, None) => Some(At::Step),
        (At::Ty(Ty::Steps | Ty::OneOf(_)), None) if node.as_seq().is_some() => {
            // A list where steps are expected (`on_failure: [...]`, `on_success: [...]`).
            match at {
                At::Ty(Ty::OneOf(options)) => options.iter().find_map(|o| match o {
                    Ty::Steps => Some(At::Step),
                    Ty::List(inner) => Some(At::Ty(inner)),
                    _ => None,
                }),
                _ => Some(At::Step),
            }
        }
        (At::Ty(Ty::List(inner)), None)
        | (At::Ty(Ty::Map(inner) | Ty::Keyed { value: inner, .. }), Some(_)) => Some(At::Ty(inner)),
        (_, Some(key)) => {
            let shape = shape_of(at, node)?;
            let k = shape.key(key)?;
            Some(match &k.ty {
                Ty::Steps => At::Steps,
                Ty::Step | Ty::HandlerStep => At::Step,
                other => At::Ty(other),
            })
        }
        _ => None,
    }
}

/// Walks from the root to the deepest node containing `offset`: calls `visit` with each
/// mapping, the expectation there, and the entry key under the cursor (if on a key).
fn walk<'n>(node: &'n Node, at: At, offset: u32, found: &mut Vec<(&'n Node, At)>) {
    found.push((node, at));
    match &node.kind {
        NodeKind::Map(entries) => {
            for entry in entries {
                let value = &entry.value;
                if value.span.start <= offset
                    && offset <= value.span.end
                    && value.span != entry.key.span
                {
                    if let Some(next) = child(at, node, entry.key.text()) {
                        walk(value, next, offset, found);
                    }
                    return;
                }
            }
        }
        NodeKind::Seq(items) => {
            for item in items {
                if item.span.start <= offset && offset <= item.span.end {
                    if let Some(next) = child(at, node, None) {
                        walk(item, next, offset, found);
                    }
                    return;
                }
            }
        }
        NodeKind::Scalar { .. } => {}
    }
}

fn root_at(root: &Node) -> At {
    if root.as_seq().is_some() {
        At::Steps
    } else {
        At::Shape(&shapes::WORKFLOW)
    }
}

/// The documentation of the key under the cursor, as Markdown.
pub fn hover(text: &str, offset: usize) -> Option<String> {
    let file = SourceFile::new("hover.yml", text);
    let root = syntax::parse(&file).root?;
    let offset = u32::try_from(offset).ok()?;
    let mut path = Vec::new();
    walk(&root, root_at(&root), offset, &mut path);
    for (node, at) in path.iter().rev() {
        let Some(entries) = node.as_map() else {
            continue;
        };
        let Some(entry) = entries
            .iter()
            .find(|e| e.key.span.start <= offset && offset <= e.key.span.end)
        else {
            continue;
        };
        let name = entry.key.text()?;
        let shape = shape_of(*at, node)?;
        let key = shape.key(name)?;
        return Some(format!("**`{name}`** ({})\n\n{}", shape.doc, key.doc));
    }
    None
}

/// Completions at the cursor: variables inside `${`, else the keys the mapping may still take.
pub fn completions(text: &str, offset: usize) -> Vec<Completion> {
    let offset = offset.min(text.len());
    let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let before = &text[line_start..offset];
    if let Some(open) = before.rfind("${")
        && !before[open..].contains('}')
    {
        let line_end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
        return variables(text, line_start + open..line_end, &before[open + 2..]);
    }
    keys(text, offset, line_start)
}

fn keys(text: &str, offset: usize, line_start: usize) -> Vec<Completion> {
    // Parse as it is; if that fails, without the line being typed.
    let line_end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
    let typed = &text[line_start..offset];
    let indent = typed.len() - typed.trim_start().len();
    let item_indent = typed.trim_start().strip_prefix("- ").map(|_| indent + 2);
    let column = u32::try_from(item_indent.unwrap_or(indent)).unwrap_or(0);
    let blanked: String =
        text[..line_start].to_owned() + &" ".repeat(line_end - line_start) + &text[line_end..];
    let file = SourceFile::new("complete.yml", blanked.as_str());
    let Some(root) = syntax::parse(&file).root.or_else(|| {
        let cut = SourceFile::new("complete.yml", &text[..line_start]);
        syntax::parse(&cut).root
    }) else {
        return top_level(None);
    };
    let cursor_line = file.line_col(u32::try_from(offset).unwrap_or(0)).line;
    // The deepest mapping whose keys start at the cursor's column and that ends at or above
    // the cursor's line.
    let mut best: Option<(&Node, At)> = None;
    let mut stack: Vec<(&Node, At)> = vec![(&root, root_at(&root))];
    while let Some((node, at)) = stack.pop() {
        match &node.kind {
            NodeKind::Map(entries) => {
                if let Some(first) = entries.first() {
                    let start = file.line_col(first.key.span.start);
                    let end = file.line_col(node.span.end);
                    // A new list item (`- ` typed) starts a mapping of its own.
                    let fresh = item_indent.is_some() && start.line < cursor_line;
                    if u32::try_from(start.column - 1).unwrap_or(0) == column
                        && !fresh
                        && start.line <= cursor_line
                        && end.line + 1 >= cursor_line
                    {
                        best = Some((node, at));
                    }
                }
                for entry in entries {
                    if let Some(next) = child(at, node, entry.key.text()) {
                        stack.push((&entry.value, next));
                    }
                }
            }
            NodeKind::Seq(items) => {
                for item in items {
                    if let Some(next) = child(at, node, None) {
                        stack.push((item, next));
                    }
                }
            }
            NodeKind::Scalar { .. } => {}
        }
    }
    match best {
        Some((node, at)) => {
            let present: Vec<&str> = node
                .as_map()
                .unwrap_or_default()
                .iter()
                .filter_map(|e| e.key.text())
                .collect();
            shape_of(at, node).map_or_else(Vec::new, |shape| key_items(shape, &present))
        }
        None if column == 0 => top_level(Some(&root)),
        None if item_indent.is_some() => key_items(&shapes::STEP, &[]),
        None => Vec::new(),
    }
}

fn top_level(root: Option<&Node>) -> Vec<Completion> {
    let present: Vec<&str> = root
        .and_then(Node::as_map)
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e.key.text())
        .collect();
    key_items(&shapes::WORKFLOW, &present)
}

/// The keys a mapping may still take: those written today, not yet present, and no second
/// command in a step that has one.
fn key_items(shape: &Shape, present: &[&str]) -> Vec<Completion> {
    let has_command = shape.name == shapes::STEP.name
        && present.iter().any(|k| shapes::COMMAND_KINDS.contains(k));
    shape
        .current()
        .filter(|k| !present.contains(&k.name))
        .filter(|k| !(has_command && shapes::COMMAND_KINDS.contains(&k.name)))
        .map(|k| Completion {
            label: k.name.to_owned(),
            detail: k.doc.to_owned(),
            kind: CompletionKind::Key,
        })
        .collect()
}

/// The workflow of a document being typed into at `typing` (from the `${` to the end of its
/// line): as written, else without what is being typed, its string closed (`"echo ${it`
/// does not parse until the quote is closed).
/// Also the keys of the mappings the cursor is in, outermost first (`map`, `agent_template`).
fn workflow_while_typing(
    text: &str,
    typing: Range<usize>,
) -> Option<(crate::ast::Workflow, Vec<String>)> {
    let compiled = |text: &str| {
        let file = SourceFile::new("complete.yml", text);
        let workflow = crate::check(&file).workflow?;
        let at = u32::try_from(typing.start).ok()?;
        let mut path = Vec::new();
        let root = syntax::parse(&file).root;
        let mut node = root.as_ref();
        let inside = |n: &Node| n.span.start <= at && at <= n.span.end;
        while let Some(current) = node {
            node = match &current.kind {
                NodeKind::Map(entries) => entries.iter().find(|e| inside(&e.value)).map(|e| {
                    path.push(e.key.text().unwrap_or_default().to_owned());
                    &e.value
                }),
                NodeKind::Seq(items) => items.iter().find(|i| inside(i)),
                NodeKind::Scalar { .. } => None,
            };
        }
        Some((workflow, path))
    };
    compiled(text).or_else(|| {
        let (before, after) = (text.get(..typing.start)?, text.get(typing.end..)?);
        ["", "\"", "'"]
            .into_iter()
            .find_map(|close| compiled(&format!("{before}{close}{after}")))
    })
}

/// Variables for `${` typed at `typing`: what the workflow defines, and the built-in roots.
fn variables(text: &str, typing: Range<usize>, typed: &str) -> Vec<Completion> {
    let mut names: Vec<(String, &str)> = Vec::new();
    if let Some((workflow, path)) = &workflow_while_typing(text, typing) {
        for var in workflow
            .env
            .iter()
            .chain(workflow.profiles.iter().flat_map(|p| &p.env))
        {
            names.push((var.name.value.clone(), "workflow env"));
        }
        for secret in &workflow.secrets {
            names.push((secret.name.value.clone(), "secret (masked in output)"));
        }
        for capture in workflow.setup.iter().flat_map(|s| &s.capture_outputs) {
            names.push((capture.name.value.clone(), "setup capture_outputs"));
        }
        let mut captures = std::collections::BTreeMap::new();
        for step in workflow
            .commands
            .iter()
            .chain(workflow.setup.iter().flat_map(|s| &s.commands))
            .chain(workflow.map.iter().flat_map(|m| &m.agent_template))
            .chain(workflow.reduce.iter().flatten())
        {
            if let Some(c) = &step.capture {
                captures.insert(c.name.value.clone(), "step capture");
            }
            if let Some(c) = &step.capture_output {
                captures.insert(c.value.clone(), "step capture_output");
            }
        }
        names.extend(captures);
        // The item in the map phase (and a `foreach`), the map's results in `reduce` and
        // `merge`: where they are in scope (anywhere when the cursor's place is unknown).
        let phase = path.first().map(String::as_str);
        let in_foreach = path.iter().any(|k| k == "do" || k == "foreach");
        if workflow.map.is_some() {
            if in_foreach || !matches!(phase, Some("setup" | "reduce" | "merge" | "commands")) {
                names.extend(
                    crate::scope::ITEM_NAMES
                        .iter()
                        .map(|n| ((*n).to_owned(), "the map item (map agents)")),
                );
            }
            if matches!(phase, None | Some("reduce" | "merge")) {
                names.extend(
                    crate::scope::MAP_FIELDS
                        .iter()
                        .map(|f| (format!("map.{f}"), "map results (reduce and merge)")),
                );
            }
        }
    }
    names.extend(
        [
            ("workflow.name", "the workflow's name"),
            ("step.name", "the current step's name"),
            ("env.", "a process environment variable: `${env.NAME}`"),
        ]
        .map(|(n, d)| (n.to_owned(), d)),
    );
    names.extend(crate::scope::SHELL_FIELDS.iter().map(|f| {
        (
            format!("shell.{f}"),
            "the last command's result (shell or Claude)",
        )
    }));
    names.extend(crate::scope::CLAUDE_FIELDS.iter().map(|f| {
        (
            format!("claude.{f}"),
            "the last Claude call's result and session",
        )
    }));
    names.extend(crate::scope::ERROR_FIELDS.iter().map(|f| {
        (
            format!("error.{f}"),
            "the failure being handled (on_failure)",
        )
    }));
    names.extend(crate::scope::CLAUDE_ERROR_FIELDS.iter().map(|f| {
        (
            format!("error.{f}"),
            "why the Claude call failed (on_failure of a `claude` step)",
        )
    }));
    names
        .into_iter()
        .filter(|(n, _)| n.starts_with(typed))
        .map(|(label, detail)| Completion {
            label,
            detail: detail.to_owned(),
            kind: CompletionKind::Variable,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(items: &[Completion]) -> Vec<&str> {
        items.iter().map(|c| c.label.as_str()).collect()
    }

    /// `${` completes the same names while its string is still open as once it is closed.
    #[test]
    fn variables_complete_inside_an_open_string() {
        let head = "name: x\nmode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n    - shell: ls\n      capture: listing\n";
        for tail in [
            "    - shell: \"echo ${it",
            "    - shell: \"echo ${it\n",
            "    - shell: 'echo ${it",
            "    - shell: echo ${it",
            "    - shell: \"echo ${it}\"\n",
        ] {
            let text = format!("{head}{tail}");
            let at = text.find("${it").unwrap() + 4;
            let items = completions(&text, at);
            let names = labels(&items);
            for want in ["item", "item_index"] {
                assert!(names.contains(&want), "{tail:?}: {names:?}");
            }
            let at = text.find("${it").unwrap() + 2;
            let names: Vec<String> = completions(&text, at)
                .into_iter()
                .map(|c| c.label)
                .collect();
            assert!(names.iter().any(|n| n == "listing"), "{tail:?}: {names:?}");
        }
        let text = "name: x\nmode: mapreduce\nmap:\n  input: i.json\n  agent_template: [{shell: a}]\nreduce:\n  - shell: \"echo ${map.";
        let names: Vec<String> = completions(text, text.len())
            .into_iter()
            .map(|c| c.label)
            .collect();
        assert!(names.iter().any(|n| n == "map.successful"), "{names:?}");
        // Each where it is in scope: no `item` in `reduce`, no `map.*` in the map phase.
        assert!(!names.iter().any(|n| n == "item"), "{names:?}");
        let text = format!("{head}    - shell: \"echo ${{");
        let names: Vec<String> = completions(&text, text.len())
            .into_iter()
            .map(|c| c.label)
            .collect();
        assert!(names.iter().any(|n| n == "item"), "{names:?}");
        assert!(!names.iter().any(|n| n.starts_with("map.")), "{names:?}");
    }

    /// A step with a command is offered no second one, and no deprecated or removed key.
    #[test]
    fn step_keys_leave_out_a_second_command_and_old_keys() {
        let text = "- shell: make\n  \n";
        let items = completions(text, text.len() - 1);
        let names = labels(&items);
        assert!(names.contains(&"timeout"), "{names:?}");
        for refused in [
            "shell",
            "claude",
            "write_file",
            "foreach",
            "test",
            "command",
            "analyze",
            "goal_seek",
            "analysis",
        ] {
            assert!(!names.contains(&refused), "{refused}: {names:?}");
        }
        // A new item is a new step, whatever the step above it has.
        let text = "- shell: make\n- \n";
        let items = completions(text, text.len() - 1);
        let names = labels(&items);
        for offered in ["shell", "claude", "write_file", "foreach"] {
            assert!(names.contains(&offered), "{offered}: {names:?}");
        }
        for refused in ["test", "command", "analyze", "goal_seek"] {
            assert!(!names.contains(&refused), "{refused}: {names:?}");
        }
    }

    #[test]
    fn hover_documents_keys_in_context() {
        let text = "commands:\n  - shell: make\n    retry_config:\n      attempts: 3\n";
        let doc = hover(text, text.find("attempts").unwrap() + 2).unwrap();
        assert!(doc.contains("`attempts`"), "{doc}");
        let doc = hover(text, text.find("retry_config").unwrap()).unwrap();
        assert!(doc.contains("`retry_config`"), "{doc}");
        assert_eq!(hover(text, text.find("make").unwrap()), None);
    }

    #[test]
    fn claude_settings_are_documented_and_completed() {
        let text = "claude:\n  model: opus\ncommands:\n  - claude:\n      prompt: /a\n      max_turns: 3\n      \n";
        let doc = hover(text, text.find("max_turns").unwrap() + 2).unwrap();
        assert!(doc.contains("--max-turns"), "{doc}");
        let doc = hover(text, text.find("model").unwrap() + 1).unwrap();
        assert!(doc.contains("--model"), "{doc}");
        let items = completions(text, text.len() - 1);
        assert!(
            labels(&items).contains(&"allowed_tools"),
            "{:?}",
            labels(&items)
        );
        assert!(!labels(&items).contains(&"max_turns"));
        let top = "claude:\n  model: x\n  \ncommands: []\n";
        let at = top.find("\ncommands").unwrap();
        let items = completions(top, at);
        assert!(
            labels(&items).contains(&"max_turns"),
            "{:?}",
            labels(&items)
        );
        assert!(!labels(&items).contains(&"prompt"));
    }

    #[test]
    fn completes_the_keys_a_mapping_may_still_take() {
        let text = "commands:\n  - shell: make\n    ti\n";
        let at = text.find("ti").unwrap() + 2;
        let items = completions(text, at);
        assert!(labels(&items).contains(&"timeout"), "{:?}", labels(&items));
        assert!(!labels(&items).contains(&"shell"));
        let top = "name: x\nco";
        assert!(labels(&completions(top, top.len())).contains(&"commands"));
    }

    #[test]
    fn completes_variables_inside_templates() {
        let text = "env:\n  TARGET: prod\ncommands:\n  - shell: make\n    capture: build\n  - shell: echo ${TA";
        let items = completions(text, text.len());
        assert_eq!(labels(&items), ["TARGET"]);
        let all = completions(text, text.len() - 2);
        assert!(labels(&all).contains(&"build"));
        // Map variables come from the same tables the scope check uses.
        let map = "mode: mapreduce\nmap:\n  input: x.json\n  agent_template:\n    - shell: echo ${";
        let names = completions(map, map.len());
        let reduce = format!("{map}item}}\nreduce:\n  - shell: echo ${{");
        let names = [names, completions(&reduce, reduce.len())].concat();
        for name in [
            "item_total",
            "map.dlq_count",
            "shell.exit_code",
            "error.step",
            "claude.session_id",
            "claude.cost_usd",
            "error.kind",
        ] {
            assert!(
                labels(&names).contains(&name),
                "{name}: {:?}",
                labels(&names)
            );
        }
    }

    #[test]
    fn half_typed_documents_do_not_break_anything() {
        for text in [
            "commands:\n  - shell: \"unclosed\n    ",
            "- shell: x\n  on_failure:\n    ",
            ":\n  - [",
            "${",
        ] {
            for offset in 0..=text.len() {
                if text.is_char_boundary(offset) {
                    let _ = completions(text, offset);
                    let _ = hover(text, offset);
                }
            }
        }
    }
}
