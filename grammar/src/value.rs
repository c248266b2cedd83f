//! The value semantics shared by the languages: equality, ordering, truthiness, rendering.

use std::cmp::Ordering;

use serde_json::Value;

/// Equality: numbers by value (`5 == 5.0`), everything else structurally; different types
/// are never equal.
#[expect(
    clippy::float_cmp,
    reason = "JSON numbers are equal when their values are exactly equal"
)]
pub fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| equal(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| equal(v, w)))
        }
        _ => a == b,
    }
}

/// Ordering for `<`, `<=`, `>`, `>=`: numbers numerically, strings byte-wise; any other pair
/// has no order (the comparison is false).
pub fn compare(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64()?.partial_cmp(&y.as_f64()?),
        (Value::String(x), Value::String(y)) => Some(x.as_bytes().cmp(y.as_bytes())),
        _ => None,
    }
}

/// Truthiness of a bare value in a condition: `null`, `false`, `0`, `""`, `"false"`, `"0"`,
/// `[]` and `{}` are false; everything else is true.
pub fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !(s.is_empty() || s == "false" || s == "0"),
        Value::Array(items) => !items.is_empty(),
        Value::Object(map) => !map.is_empty(),
    }
}

/// The rank of a type in the mixed-type sort order: null < bool < number < string < array < object.
pub fn type_rank(value: &Value) -> u8 {
    match value {
        Value::Null => 0,
        Value::Bool(_) => 1,
        Value::Number(_) => 2,
        Value::String(_) => 3,
        Value::Array(_) => 4,
        Value::Object(_) => 5,
    }
}

/// Total order used by sorting (nulls handled by the caller): type rank first, then within
/// a type: false < true, numbers numerically, strings byte-wise, arrays and objects by size.
pub fn sort_order(a: &Value, b: &Value) -> Ordering {
    let by_rank = type_rank(a).cmp(&type_rank(b));
    if by_rank != Ordering::Equal {
        return by_rank;
    }
    match (a, b) {
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Number(x), Value::Number(y)) => x
            .as_f64()
            .unwrap_or(0.0)
            .partial_cmp(&y.as_f64().unwrap_or(0.0))
            .unwrap_or(Ordering::Equal),
        (Value::String(x), Value::String(y)) => x.as_bytes().cmp(y.as_bytes()),
        (Value::Array(x), Value::Array(y)) => x.len().cmp(&y.len()),
        (Value::Object(x), Value::Object(y)) => x.len().cmp(&y.len()),
        _ => Ordering::Equal,
    }
}

/// Renders a value into command text: strings as they are, numbers as written (`5`, not
/// `5.0`), `null` as nothing, lists of scalars space-separated, anything else compact JSON.
pub fn render(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Array(items) if items.iter().all(is_scalar) => {
            items.iter().map(render).collect::<Vec<_>>().join(" ")
        }
        Value::Array(_) | Value::Object(_) => value.to_string(),
    }
}

fn is_scalar(value: &Value) -> bool {
    !matches!(value, Value::Array(_) | Value::Object(_))
}

/// POSIX shell quoting: the text inside single quotes, with `'` written as `'\''`.
pub fn shell_quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('\'');
    for c in text.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_are_equal_by_value() {
        assert!(equal(&json!(5), &json!(5.0)));
        assert!(!equal(&json!(5), &json!("5")));
        assert!(equal(&json!({"a": [1]}), &json!({"a": [1.0]})));
    }

    #[test]
    fn rendering_keeps_numbers_as_written() {
        assert_eq!(render(&json!(5)), "5");
        assert_eq!(render(&json!(7.5)), "7.5");
        assert_eq!(render(&json!(null)), "");
        assert_eq!(render(&json!(["a", "b"])), "a b");
        assert_eq!(render(&json!({"a": 1})), "{\"a\":1}");
    }

    #[test]
    fn shell_quoting_survives_quotes() {
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }
}
