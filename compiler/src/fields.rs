//! W011: a map `filter` or `sort_by` that reads a field no item of the input has, when the
//! input is a file that can be read now (through [`crate::Surroundings`]): a misspelt field
//! makes a filter that keeps nothing, or a sort that does nothing. W012: a map input file
//! that does not exist, which no `setup` step makes.

use std::collections::BTreeSet;

use prodigy_grammar::path::Path;
use prodigy_grammar::pipeline::{InputKind, Pipeline, names_a_file, parse_input};
use serde_json::Value;

use crate::Surroundings;
use crate::ast::{MapPhase, Workflow};
use crate::diagnostics::{Code, Diagnostic};
use crate::lower::suggest;
use crate::source::Span;

/// The W011 warnings of MAP, whose YAML is SOURCE.
pub(crate) fn check(
    map: &MapPhase,
    source: &str,
    surroundings: &Surroundings<'_>,
) -> Vec<Diagnostic> {
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
            read.push((&key.path, sort.rebase(source, key.span), "sort_by"));
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

/// W012: MAP's input names a file (see [`names_a_file`]) that does not exist, and no `setup`
/// step of WORKFLOW could make it: none mentions its file name (a command that writes it, a
/// `write_file` to it).
pub(crate) fn missing_input(
    workflow: &Workflow,
    map: &MapPhase,
    source: &str,
    surroundings: &Surroundings<'_>,
) -> Option<Diagnostic> {
    let input = map.input.value.trim();
    if !map.input.parsed.is_literal() || !names_a_file(input) || (surroundings.file_exists)(input) {
        return None;
    }
    let name = input.rsplit('/').next().unwrap_or(input);
    let made = workflow.setup.as_ref().is_some_and(|setup| {
        setup.commands.iter().any(|step| {
            source
                .get(step.span.start as usize..step.span.end as usize)
                .is_some_and(|text| text.contains(name))
        })
    });
    (!made).then(|| {
        Diagnostic::new(
            Code::MissingMapInput,
            format!("the map input file `{input}` does not exist"),
        )
        .with_primary(map.input.span, "no such file in the project directory, and no `setup` step makes it")
        .with_help("create the file, fix the path (relative to where prodigy runs), or make it in a `setup` step")
    })
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
    Some(pipeline.apply(input.document).0)
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
            tracked: &|_| false,
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
        assert_eq!(
            w011("  filter: \"tag == 'x' && item.meta.score > 1\"\n"),
            Vec::<String>::new()
        );
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

    #[test]
    fn a_missing_input_file_is_reported_unless_setup_makes_it() {
        let codes = |text: &str| -> Vec<Code> {
            let surroundings = Surroundings {
                file_exists: &|p| p == "items.json",
                read_file: &|_| None,
                tracked: &|_| false,
                slash_command: &|_| CommandLookup::Unknown,
            };
            crate::check_in(&SourceFile::new("t.yml", text), &surroundings)
                .diagnostics
                .into_iter()
                .map(|d| d.code)
                .filter(|c| *c == Code::MissingMapInput)
                .collect()
        };
        let job = |setup: &str, input: &str| {
            format!(
                "mode: mapreduce\n{setup}map:\n  input: {input}\n  agent_template:\n    - shell: \"true\"\n"
            )
        };
        assert_eq!(codes(&job("", "data/work.json")), [Code::MissingMapInput]);
        assert_eq!(codes(&job("", "items.json")), []);
        // A command, or a templated path, is not a file to look for.
        assert_eq!(codes(&job("", "\"ls src\"")), []);
        assert_eq!(codes(&job("", "\"${dir}/work.json\"")), []);
        // A setup step that mentions the file, or writes it, may make it.
        let writes = "setup:\n  - write_file:\n      path: data/work.json\n      content: \"[]\"\n";
        assert_eq!(codes(&job(writes, "data/work.json")), []);
        let mentions = "setup:\n  - shell: \"cd data && ./make work.json\"\n";
        assert_eq!(codes(&job(mentions, "data/work.json")), []);
        let other = "setup:\n  - shell: \"echo hi\"\n";
        assert_eq!(
            codes(&job(other, "data/work.json")),
            [Code::MissingMapInput]
        );
    }
}
