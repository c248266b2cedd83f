//! The map input pipeline: `json_path`, `filter`, `sort_by`, `distinct`, `offset`,
//! `max_items`, in that order.

use serde_json::Value;

use crate::expr::Expr;
use crate::jsonpath::JsonPath;
use crate::path::Path;
use crate::sort::SortSpec;

/// A compiled pipeline.
#[derive(Clone, Debug, Default)]
pub struct Pipeline {
    /// `json_path`; absent: an array input yields its elements, anything else one item.
    pub json_path: Option<JsonPath>,
    /// `filter`.
    pub filter: Option<Expr>,
    /// `sort_by`.
    pub sort_by: Option<SortSpec>,
    /// `distinct`: keep the first item for each value of this path.
    pub distinct: Option<Path>,
    /// `offset`.
    pub offset: Option<usize>,
    /// `max_items`.
    pub max_items: Option<usize>,
}

/// How many items survived each stage, for `check --input` and progress output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StageCounts {
    /// After `json_path`.
    pub selected: usize,
    /// After `filter`.
    pub filtered: usize,
    /// Each field the `filter` reads that some selected items lack, with how many lack it
    /// (a misspelt field is lacked by all of them).
    pub filter_missing: Vec<(String, usize)>,
    /// After `distinct`.
    pub distinct: usize,
    /// Items that reached `distinct` without a value at its path (missing or null): they
    /// count as one value, so all but the first of them were dropped.
    pub distinct_missing: usize,
    /// After `offset` and `max_items`.
    pub kept: usize,
}

impl Pipeline {
    /// Runs the pipeline over an input document.
    pub fn apply(&self, input: Value) -> (Vec<Value>, StageCounts) {
        let mut counts = StageCounts::default();
        let mut items = match &self.json_path {
            Some(path) => path.select_owned(input),
            None => match input {
                Value::Array(items) => items,
                other => vec![other],
            },
        };
        counts.selected = items.len();
        if let Some(filter) = &self.filter {
            for (path, _, var) in filter.references() {
                let name = path.to_string();
                let lacking = items
                    .iter()
                    .filter(|item| crate::expr::item_field(item, path).is_none())
                    .count();
                if !var && lacking > 0 && !counts.filter_missing.iter().any(|(n, _)| *n == name) {
                    counts.filter_missing.push((name, lacking));
                }
            }
            items.retain(|item| filter.matches_item(item));
        }
        counts.filtered = items.len();
        if let Some(sort) = &self.sort_by {
            sort.sort(&mut items);
        }
        if let Some(path) = &self.distinct {
            let mut seen = std::collections::HashSet::new();
            let mut missing = 0;
            items.retain(|item| {
                let key = crate::expr::item_field(item, path).unwrap_or(&Value::Null);
                if key.is_null() {
                    missing += 1;
                }
                seen.insert(canonical(key))
            });
            counts.distinct_missing = missing;
        }
        counts.distinct = items.len();
        let offset = self.offset.unwrap_or(0).min(items.len());
        items.drain(..offset);
        if let Some(max) = self.max_items {
            items.truncate(max);
        }
        counts.kept = items.len();
        (items, counts)
    }
}

/// A text key under which equal values (by [`crate::value::equal`]) coincide.
fn canonical(value: &Value) -> String {
    match value {
        Value::Number(n) => n
            .as_f64()
            .map_or_else(|| n.to_string(), |f| format!("{f:?}")),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        Value::Object(map) => {
            let mut entries: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{k:?}:{}", canonical(v)))
                .collect();
            entries.sort();
            format!("{{{}}}", entries.join(","))
        }
        Value::Null | Value::Bool(_) | Value::String(_) => value.to_string(),
    }
}

/// Whether INPUT, a rendered `map.input` at whose path nothing exists, names a file that is
/// missing (one word ending in `.json`, `.jsonl` or `.txt`) rather than a shell command.
pub fn names_a_file(input: &str) -> bool {
    let input = input.trim();
    !input.contains(char::is_whitespace)
        && [".json", ".jsonl", ".txt"]
            .iter()
            .any(|ext| input.ends_with(ext))
}

/// How a map input is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    /// A `.json` file: one JSON document.
    Json,
    /// A `.jsonl` file: one JSON value per non-blank line.
    JsonLines,
    /// A command's stdout, or a file of another kind: JSON when it parses as JSON,
    /// otherwise one string item per non-blank line.
    Text,
}

impl InputKind {
    /// The kind of an input file, by its extension.
    pub fn of_file(path: &str) -> Self {
        let extension = std::path::Path::new(path)
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase());
        match extension.as_deref() {
            Some("jsonl") => InputKind::JsonLines,
            Some("json") => InputKind::Json,
            _ => InputKind::Text,
        }
    }
}

/// A map input read: its document, and the numbers in it a 64-bit value would change, kept as
/// the strings they were written as ([`crate::exact`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    /// The document the pipeline selects items from.
    pub document: Value,
    /// Each number passed as its text, in the order it appears.
    pub numbers_as_text: Vec<String>,
}

/// The input document of TEXT read as KIND; a `.json` or `.jsonl` file that is not JSON is
/// an error naming the line and column.
pub fn parse_input(text: &str, kind: InputKind) -> Result<Input, String> {
    let (exact, numbers_as_text) = crate::exact::quote_inexact_numbers(text);
    let document = match kind {
        InputKind::Json => json(&exact, text).map_err(|e| format!("not JSON: {e}")),
        InputKind::JsonLines => exact
            .lines()
            .zip(text.lines())
            .enumerate()
            .filter(|(_, (l, _))| !l.trim().is_empty())
            .map(|(n, (l, written))| {
                json(l, written).map_err(|e| format!("line {}: not JSON: {e}", n + 1))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        // Output that is not one JSON value is items of its lines, digits as written.
        InputKind::Text if !numbers_as_text.is_empty() && !is_json(&exact) => {
            return Ok(Input {
                document: input_from_output(text)?,
                numbers_as_text: Vec::new(),
            });
        }
        InputKind::Text => input_from_output(&exact),
    }?;
    Ok(Input {
        document,
        numbers_as_text,
    })
}

/// EXACT (TEXT with its inexact numbers quoted) as JSON; an error is TEXT's, so that its
/// column is where the user's text has it.
fn json(exact: &str, text: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str(exact).map_err(|e| {
        serde_json::from_str::<serde::de::IgnoredAny>(text)
            .err()
            .unwrap_or(e)
    })
}

/// Whether TEXT, trimmed, is one JSON value.
fn is_json(text: &str) -> bool {
    let trimmed = text.trim();
    !trimmed.is_empty() && serde_json::from_str::<serde::de::IgnoredAny>(trimmed).is_ok()
}

/// The input document made from a command's stdout: the whole output when it is JSON,
/// otherwise an array with one string per non-blank line. Output that starts as JSON but
/// stops before its end (truncated), or that opens with `{` and is not JSON (nor one JSON
/// value per line), is an error naming where the JSON broke, not items made of its lines.
fn input_from_output(stdout: &str) -> Result<Value, String> {
    let trimmed = stdout.trim();
    match serde_json::from_str::<Value>(trimmed) {
        Ok(value) if !trimmed.is_empty() => return Ok(value),
        Ok(_) => {}
        Err(e) => {
            let lines_are_json = || {
                trimmed
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .all(|l| serde_json::from_str::<Value>(l).is_ok())
            };
            let truncated = e.classify() == serde_json::error::Category::Eof
                && (trimmed.starts_with('[') || trimmed.starts_with('{'));
            if truncated || (trimmed.starts_with('{') && !lines_are_json()) {
                return Err(format!("not JSON: {e}"));
            }
        }
    }
    Ok(Value::Array(
        stdout
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| Value::String(l.to_owned()))
            .collect(),
    ))
}

#[cfg(test)]
mod input_tests {
    use super::*;

    #[test]
    fn json_lines_are_values_and_broken_files_are_errors() {
        assert_eq!(
            parse_input("{\"id\": 1}\n\n[2]\n", InputKind::of_file("a.JSONL"))
                .unwrap()
                .document,
            serde_json::json!([{"id": 1}, [2]])
        );
        let err = parse_input("{\"id\": 1}\n{oops\n", InputKind::JsonLines).unwrap_err();
        assert!(err.starts_with("line 2: not JSON"), "{err}");
        assert!(parse_input("[1,", InputKind::of_file("items.json")).is_err());
        assert_eq!(
            parse_input("a\nb\n", InputKind::of_file("items.txt"))
                .unwrap()
                .document,
            serde_json::json!(["a", "b"])
        );
    }

    /// A number no 64-bit value holds reaches the item as the digits it was written with.
    #[test]
    fn numbers_beyond_64_bits_are_passed_as_written() {
        let written = "[{\"id\": 123456789012345678901, \"n\": 7}]";
        for kind in [InputKind::Json, InputKind::Text] {
            let input = parse_input(written, kind).unwrap();
            assert_eq!(
                input.document,
                serde_json::json!([{"id": "123456789012345678901", "n": 7}])
            );
            assert_eq!(input.numbers_as_text, ["123456789012345678901"]);
        }
        let lines = parse_input("{\"id\": 99999999999999999999}\n", InputKind::JsonLines).unwrap();
        assert_eq!(
            lines.document,
            serde_json::json!([{"id": "99999999999999999999"}])
        );
        // Lines of text are items as written, and nothing was changed to say so.
        let text = parse_input(
            "fix 123456789012345678901\n-99999999999999999999\n",
            InputKind::Text,
        );
        let text = text.unwrap();
        assert_eq!(
            text.document,
            serde_json::json!(["fix 123456789012345678901", "-99999999999999999999"])
        );
        assert!(text.numbers_as_text.is_empty());
        // A broken file's error is where the user's text has it.
        let err = parse_input("[123456789012345678901, oops]", InputKind::Json).unwrap_err();
        assert!(err.ends_with("line 1 column 25"), "{err}");
    }

    /// Items without the `distinct` field are counted, since they are kept as one.
    #[test]
    fn distinct_counts_the_items_without_the_field() {
        let pipeline = Pipeline {
            distinct: Some(crate::path::Path::name("owner")),
            ..Pipeline::default()
        };
        let input = serde_json::json!([{"owner": "a"}, {"id": 1}, {"owner": null}, {"id": 2}, {"owner": "a"}]);
        let (items, counts) = pipeline.apply(input);
        assert_eq!(
            items,
            serde_json::json!([{"owner": "a"}, {"id": 1}])
                .as_array()
                .unwrap()
                .clone()
        );
        assert_eq!((counts.distinct, counts.distinct_missing), (2, 3));
    }

    /// A command's output cut short is an error saying where, not items made of its lines.
    #[test]
    fn truncated_json_output_is_an_error_naming_where() {
        let err = parse_input("{\"items\": [{\"id\": 1},", InputKind::Text).unwrap_err();
        assert_eq!(
            err,
            "not JSON: EOF while parsing a value at line 1 column 21"
        );
        let err = parse_input("[1, 2,\n3", InputKind::Text).unwrap_err();
        assert!(err.contains("at line 2 column 1"), "{err}");
        let err = parse_input("{\"id\": 1}\n{\"id\":", InputKind::Text).unwrap_err();
        assert!(err.starts_with("not JSON: "), "{err}");
        // Lines that only look like JSON at the start are still items.
        assert_eq!(
            parse_input("[1/2] build\n[2/2] test\n", InputKind::Text)
                .unwrap()
                .document,
            serde_json::json!(["[1/2] build", "[2/2] test"])
        );
        assert_eq!(
            parse_input("{\"id\": 1}\n{\"id\": 2}\n", InputKind::Text)
                .unwrap()
                .document,
            serde_json::json!(["{\"id\": 1}", "{\"id\": 2}"])
        );
    }
}
