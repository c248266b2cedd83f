//! The value semantics shared by the languages: equality, ordering, truthiness, rendering.

use std::borrow::Cow;
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

/// The number a string reads as, for comparisons that mix a string and a number (as GitHub
/// Actions expressions decide them): decimal notation with an optional sign, fraction and
/// exponent, surrounding whitespace ignored (`" 61\n"` is 61). Anything else, the empty
/// string included, reads as no number.
pub fn read_number(text: &str) -> Option<f64> {
    let text = text.trim();
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    let (mantissa, exponent) = match digits.find(['e', 'E']) {
        Some(at) => (&digits[..at], Some(&digits[at + 1..])),
        None => (digits, None),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let well_formed = !whole.is_empty()
        && all_digits(whole)
        && all_digits(fraction)
        && (!mantissa.contains('.') || !fraction.is_empty())
        && exponent.is_none_or(|e| {
            let e = e.strip_prefix(['-', '+']).unwrap_or(e);
            !e.is_empty() && all_digits(e)
        });
    well_formed
        .then(|| text.parse::<f64>().ok())
        .flatten()
        .filter(|n| n.is_finite())
}

/// The pair a comparison (`==`, `!=`, `<`, ...) compares: a string beside a number compares
/// as the number it reads as ([`read_number`]), or stays a string (and the comparison is
/// false) when it reads as none. Any other pair is compared as it is.
pub fn coerce<'a>(a: &'a Value, b: &'a Value) -> (Cow<'a, Value>, Cow<'a, Value>) {
    let number = |s: &str| {
        read_number(s)
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
    };
    match (a, b) {
        (Value::String(s), Value::Number(_)) => match number(s) {
            Some(n) => (Cow::Owned(n), Cow::Borrowed(b)),
            None => (Cow::Borrowed(a), Cow::Borrowed(b)),
        },
        (Value::Number(_), Value::String(s)) => match number(s) {
            Some(n) => (Cow::Borrowed(a), Cow::Owned(n)),
            None => (Cow::Borrowed(a), Cow::Borrowed(b)),
        },
        _ => (Cow::Borrowed(a), Cow::Borrowed(b)),
    }
}

/// Why a comparison of A and B is false whatever its operator, when they are of types that
/// never compare (after [`coerce`]): `"abc" is not a number`, `"true" is a string, not a
/// boolean`. `None` when they are of one type, or one is `null`.
pub fn mismatch(a: &Value, b: &Value) -> Option<String> {
    let (a, b) = coerce(a, b);
    let (a, b) = (a.as_ref(), b.as_ref());
    if type_rank(a) == type_rank(b) || a.is_null() || b.is_null() {
        return None;
    }
    Some(match (a, b) {
        (Value::String(s), Value::Number(_)) | (Value::Number(_), Value::String(s)) => {
            format!("{} is not a number", shown(s))
        }
        (Value::String(s), other) | (other, Value::String(s)) => {
            format!("{} is a string, not {}", shown(s), type_name(other))
        }
        _ => format!("{} is {}, {} is {}", a, type_name(a), b, type_name(b)),
    })
}

/// A string for a message: JSON-quoted, cut at 40 characters.
fn shown(text: &str) -> String {
    let cut: String = text.chars().take(40).collect();
    let quoted = Value::String(cut.clone()).to_string();
    if cut.len() < text.len() {
        format!("{}…\"", quoted.trim_end_matches('"'))
    } else {
        quoted
    }
}

/// A type's name with its article, for messages.
pub fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
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
    fn strings_read_as_numbers_only_in_decimal_notation() {
        for (text, number) in [
            ("61", Some(61.0)),
            (" 61\n", Some(61.0)),
            ("-2.5", Some(-2.5)),
            ("+3", Some(3.0)),
            ("1e3", Some(1000.0)),
            ("abc", None),
            ("", None),
            ("1.", None),
            (".5", None),
            ("inf", None),
            ("NaN", None),
            ("0x10", None),
            ("1 2", None),
        ] {
            assert_eq!(read_number(text), number, "{text:?}");
        }
    }

    #[test]
    fn a_mismatch_says_which_side_is_not_what() {
        assert_eq!(mismatch(&json!("61"), &json!(10)), None);
        assert_eq!(
            mismatch(&json!("abc"), &json!(10)).as_deref(),
            Some("\"abc\" is not a number")
        );
        assert_eq!(
            mismatch(&json!(true), &json!("true")).as_deref(),
            Some("\"true\" is a string, not a boolean")
        );
        assert_eq!(mismatch(&json!(null), &json!(1)), None);
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
