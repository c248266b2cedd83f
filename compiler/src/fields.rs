//! W011: a map `filter` or `sort_by` that reads a field no item of the input has, when the
//! input is a file that can be read now (through [`crate::Surroundings`]): a misspelt field
//! makes a filter that keeps nothing, or a sort that does nothing.

use std::collections::BTreeSet;

use prodigy_grammar::path::Path;
use prodigy_grammar::pipeline::{InputKind, Pipeline, parse_input};
use serde_json::Value;

use crate::Surroundings;
use crate::ast::MapPhase;
use crate::diagnostics::{Code, Diagnostic};
use crate::lower::suggest;
use crate::source::Span;

/// The W011 warnings of MAP, whose YAML is SOURCE.
pub(crate) fn check(map: &MapPhase, source: &str, surroundings: &Surroundings<'_>) -> Vec<Diagnostic> {
    if map.filter.is_none() && map.sort_by.is_none() {
        return Vec::new();
    }
    let Some(items) = items(map, surroundings) else {
        return Vec::new();
    };
    if items.is_empty() {
        return Vec::new();
    }
    let mut read: Vec<(&Path, Span, &str)> = Vec::new();
    if let Some(filter) = &map.filter {
        let mut rebase = filter.rebaser(source);
        for (path, span, var) in filter.parsed.references() {
            if !var {
                read.push((path, rebase.span(span), "filter"));
            }
        }
    }
    if let Some(sort) = &map.sort_by {
        for key in &sort.parsed.keys {
            read.push((&key.path, sort.rebase(source, key.span.clone()), "sort_by"));
        }
    }
    let keys: BTreeSet<&str> = items
        .iter()
        .filter_map(Value::as_object)
        .flat_map(|o| o.keys().map(String::as_str))
        .collect();
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (path, span, what) in read {
        if !seen.insert((path.to_string(), what))
            || items
                .iter()
                .any(|item| prodigy_grammar::expr::item_field(item, path).is_some())
        {
            continue;
        }
        let root = if path.root == "item" {
            match path.segments.first() {
                Some(prodigy_grammar::path::Segment::Field(f)) => f.as_str(),
                _ => path.root.as_str(),
            }
        } else {
            path.root.as_str()
        };
        let help = match suggest(root, keys.iter().copied()) {
            Some(s) if s != root => format!("did you mean `{s}`?"),
            _ => "name a field the items have, or fix the input or its `json_path`".to_owned(),
        };
        out.push(
            Diagnostic::new(
                Code::FieldNoItemHas,
                format!("no item of `{}` has the field `{path}`", map.input.value),
            )
            .with_primary(span, format!("`{what}` reads a field that is never there"))
            .with_help(help),
        );
    }
    out
}

/// The items of MAP's input after `json_path`, when its input is a file that can be read.
fn items(map: &MapPhase, surroundings: &Surroundings<'_>) -> Option<Vec<Value>> {
    if !map.input.parsed.is_literal() {
        return None;
    }
    let text = (surroundings.read_file)(&map.input.value)?;
    let input = parse_input(&text, InputKind::of_file(&map.input.value)).ok()?;
    let pipeline = Pipeline {
        json_path: map.json_path.as_ref().map(|p| p.parsed.clone()),
        ..Pipeline::default()
    };
    Some(pipeline.apply(input).0)
}

#[cfg(test)]
mod tests {
    use crate::Surroundings;
    use crate::claude::CommandLookup;
    use crate::diagnostics::Code;
    use crate::source::SourceFile;

    fn w011(map: &str) -> Vec<String> {
        let text = format!(
            "mode: mapreduce\nmap:\n  input: items.json\n{map}  agent_template:\n    - shell: \"true\"\n"
        );
        let read = |p: &str| {
            (p == "items.json")
                .then(|| r#"[{"id": 1, "meta": {"score": 2}}, {"id": 2, "tag": "x"}]"#.to_owned())
        };
        let surroundings = Surroundings {
            file_exists: &|p| p == "items.json",
            read_file: &read,
            slash_command: &|_| CommandLookup::Unknown,
        };
        crate::check_in(&SourceFile::new("t.yml", text), &surroundings)
            .diagnostics
            .into_iter()
            .filter(|d| d.code == Code::FieldNoItemHas)
            .map(|d| d.message)
            .collect()
    }

    #[test]
    fn a_field_no_item_has_is_reported_once_a_field_one_item_has_is_not() {
        assert_eq!(w011("  filter: \"tag == 'x' && item.meta.score > 1\"\n"), Vec::<String>::new());
        assert_eq!(
            w011("  filter: \"idd > 0 || idd < 0\"\n  sort_by: \"meta.scor DESC, id\"\n"),
            [
                "no item of `items.json` has the field `idd`",
                "no item of `items.json` has the field `meta.scor`"
            ]
        );
        // A filter that reads only variables, or no input file to read: nothing to say.
        assert_eq!(w011("  filter: \"${x} == 1\"\n"), Vec::<String>::new());
    }
}
