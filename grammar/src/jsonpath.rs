//! `map.json_path`, through the `jsonpath-rust` crate (RFC 9535 syntax).

use serde_json::Value;

use crate::{ParseError, ParseErrorKind};

/// A parsed JSON path.
#[derive(Clone, Debug)]
pub struct JsonPath {
    text: String,
    query: jsonpath_rust::parser::model::JpQuery,
}

impl PartialEq for JsonPath {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl JsonPath {
    /// Parses a path such as `$.items[*]` or `$..files[?@.score > 5]`.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        crate::error::check_depth(text)?;
        let trimmed = text.trim();
        // Upstream accepts `items[*]` for `$.items[*]`; so do we.
        let (query_text, implicit_root) = if trimmed.starts_with('$') {
            (trimmed.to_owned(), 0)
        } else {
            (format!("$.{trimmed}"), 2)
        };
        match jsonpath_rust::parser::parse_json_path(&query_text) {
            Ok(query) => Ok(JsonPath {
                text: query_text,
                query,
            }),
            Err(err) => {
                // A position in the query, which may start with an added `$.`, back to the
                // text as written (after its leading whitespace).
                let leading = text.len() - text.trim_start().len();
                let at = crate::lower::jsonpath_error_position(&err)
                    .map_or(0, |p| p.min(query_text.len()))
                    .saturating_sub(implicit_root)
                    + leading;
                Err(ParseError::new(
                    ParseErrorKind::JsonPath,
                    "invalid JSON path",
                    crate::lower::char_span(text, at),
                    "the path cannot be read from here",
                )
                .help("write an RFC 9535 path such as `$.items[*]` or `$.items[?@.score > 5]`"))
            }
        }
    }

    /// The path as written (trimmed).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The values the path selects, taking them out of `value`: `$.a.b[*]` (and `$[*]`)
    /// moves the array's elements without copying them; other paths copy the selection.
    pub fn select_owned(&self, mut value: Value) -> Vec<Value> {
        if let Some(fields) = simple_wildcard(&self.text) {
            let mut target = &mut value;
            for field in &fields {
                match target.get_mut(field) {
                    Some(next) => target = next,
                    None => return Vec::new(),
                }
            }
            return match target.take() {
                Value::Array(items) => items,
                Value::Object(map) => map.into_iter().map(|(_, v)| v).collect(),
                _ => Vec::new(),
            };
        }
        self.select(&value)
    }

    /// The values the path selects, in document order.
    pub fn select(&self, value: &Value) -> Vec<Value> {
        jsonpath_rust::query::js_path_process(&self.query, value)
            .map(|refs| refs.into_iter().map(|r| r.val().clone()).collect())
            .unwrap_or_default()
    }
}

/// The field names of a path of the form `$.a.b[*]` (plain names only), if it is one.
fn simple_wildcard(text: &str) -> Option<Vec<&str>> {
    let inner = text.strip_prefix('$')?.strip_suffix("[*]")?;
    if inner.is_empty() {
        return Some(Vec::new());
    }
    let fields: Vec<&str> = inner.strip_prefix('.')?.split('.').collect();
    fields
        .iter()
        .all(|f| !f.is_empty() && f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .then_some(fields)
}

impl serde::Serialize for JsonPath {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selects_with_rfc_9535_semantics() {
        let data = json!({"items": [{"n": 1, "s": 7}, {"n": 2, "s": 3}], "name": "root"});
        assert_eq!(
            JsonPath::parse("$.items[*].n").unwrap().select(&data),
            [json!(1), json!(2)]
        );
        assert_eq!(
            JsonPath::parse("$.items[?@.s > 5].n")
                .unwrap()
                .select(&data),
            [json!(1)]
        );
        assert_eq!(
            JsonPath::parse("$..n").unwrap().select(&data),
            [json!(1), json!(2)]
        );
        assert!(JsonPath::parse("$.items[").is_err());
        assert_eq!(
            JsonPath::parse("items[*].n").unwrap().select(&data),
            [json!(1), json!(2)]
        );
    }
}
