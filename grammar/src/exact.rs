//! Numbers a 64-bit value cannot hold, kept as the text they were written as.
//!
//! `serde_json` reads a number into a `u64`, an `i64` or an `f64`: `123456789012345678901`
//! becomes `1.2345678901234568e20`, and an agent given that item would see another number.
//! Before a map input is parsed, every number token whose value one of those types would
//! change is quoted, so it reaches the item as a string of its digits as written
//! (docs/language.md §7). Numbers a 64-bit value holds, however written (`1.50`, `1e3`),
//! are left alone: their value is what was written.

use std::borrow::Cow;

/// TEXT with every number token a 64-bit value would change written as a JSON string, and
/// those tokens in the order they appear. Text that is not JSON is scanned all the same: only
/// tokens outside strings that look like JSON numbers are touched, so a parse error stays the
/// error it was.
pub fn quote_inexact_numbers(text: &str) -> (Cow<'_, str>, Vec<String>) {
    let bytes = text.as_bytes();
    let mut out: Option<String> = None;
    let mut kept = Vec::new();
    let mut copied = 0;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => i = string_end(bytes, i),
            b'-' | b'0'..=b'9' => {
                let end = number_end(bytes, i);
                let token = text.get(i..end).unwrap_or_default();
                if !token.is_empty() && !fits(token) {
                    let out = out.get_or_insert_with(|| String::with_capacity(text.len() + 8));
                    out.push_str(text.get(copied..i).unwrap_or_default());
                    out.push('"');
                    out.push_str(token);
                    out.push('"');
                    copied = end;
                    kept.push(token.to_owned());
                }
                i = end.max(i + 1);
            }
            // A letter starts a word (`true`, or text that is not JSON): digits inside a word
            // are not a number.
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                while bytes
                    .get(i)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
                {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    match out {
        Some(mut out) => {
            out.push_str(text.get(copied..).unwrap_or_default());
            (Cow::Owned(out), kept)
        }
        None => (Cow::Borrowed(text), kept),
    }
}

/// One past the closing quote of the string that opens at START (or the end of the text).
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// One past the last byte of the JSON number that starts at START:
/// `-?digits(.digits)?([eE][+-]?digits)?`.
fn number_end(bytes: &[u8], start: usize) -> usize {
    let digits = |mut i: usize| {
        while bytes.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    };
    let mut i = start;
    if bytes.get(i) == Some(&b'-') {
        i += 1;
    }
    i = digits(i);
    if bytes.get(i) == Some(&b'.') && bytes.get(i + 1).is_some_and(u8::is_ascii_digit) {
        i = digits(i + 1);
    }
    if matches!(bytes.get(i), Some(b'e' | b'E')) {
        let sign = usize::from(matches!(bytes.get(i + 1), Some(b'+' | b'-')));
        if bytes.get(i + 1 + sign).is_some_and(u8::is_ascii_digit) {
            i = digits(i + 1 + sign);
        }
    }
    i
}

/// Whether `serde_json` reads TOKEN into a value equal to what it says: an integer within
/// `u64` or `i64`, or a number whose `f64` `serde_json` writes as the same decimal number.
fn fits(token: &str) -> bool {
    if token.parse::<u64>().is_ok() || token.parse::<i64>().is_ok() {
        return true;
    }
    let Ok(float) = token.parse::<f64>() else {
        // Not a number after all (a lone `-`): not ours to change.
        return true;
    };
    // What `serde_json` writes of the `f64` is what an agent would see: the same decimal
    // number, or not. (Rust's own formatting may pick other shortest digits.)
    serde_json::Number::from_f64(float)
        .is_some_and(|written| decimal(token) == decimal(&written.to_string()))
}

/// A decimal number as (negative, significant digits, the exponent of their first digit);
/// zero, of either sign, is `(false, "", 0)`.
fn decimal(token: &str) -> (bool, String, i64) {
    let (negative, unsigned) = match token.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, token),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (
            unsigned.get(..at).unwrap_or_default(),
            unsigned
                .get(at + 1..)
                .and_then(|e| e.trim_start_matches('+').parse::<i64>().ok())
                .unwrap_or(0),
        ),
        None => (unsigned, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all: String = whole.chars().chain(fraction.chars()).collect();
    let leading = all.len() - all.trim_start_matches('0').len();
    let digits = all.trim_start_matches('0').trim_end_matches('0');
    if digits.is_empty() {
        return (false, String::new(), 0);
    }
    let width = i64::try_from(whole.len()).unwrap_or(i64::MAX);
    let skipped = i64::try_from(leading).unwrap_or(0);
    // An exponent near `i64`'s ends (`0.01e-9223372036854775808`) must not overflow.
    (
        negative,
        digits.to_owned(),
        exponent.saturating_add(width).saturating_sub(skipped),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_a_64_bit_value_changes_are_quoted_and_named() {
        let text = r#"[{"id": 123456789012345678901, "n": -99999999999999999999, "x": 1.50,
            "s": "123456789012345678901", "e": 1e3, "big": 1e400, "pi": 3.141592653589793238,
            "ok": 18446744073709551615, "neg": -9223372036854775808, "z": -0.0, "t": true}]"#;
        let (quoted, kept) = quote_inexact_numbers(text);
        assert_eq!(
            kept,
            [
                "123456789012345678901",
                "-99999999999999999999",
                "1e400",
                "3.141592653589793238"
            ]
        );
        let value: serde_json::Value = serde_json::from_str(&quoted).unwrap();
        assert_eq!(value[0]["id"], "123456789012345678901");
        assert_eq!(value[0]["n"], "-99999999999999999999");
        assert_eq!(value[0]["x"], 1.5);
        assert_eq!(value[0]["s"], "123456789012345678901");
        assert_eq!(value[0]["e"], 1000.0);
        assert_eq!(value[0]["big"], "1e400");
        assert_eq!(value[0]["ok"], u64::MAX);
        assert_eq!(value[0]["neg"], i64::MIN);
        assert_eq!(value[0]["t"], true);
    }

    #[test]
    fn text_without_such_numbers_is_not_copied() {
        let text = r#"{"a": [1, -2, 0.1, 2.5e-3, 1E+2, 873354127078754.2], "b": "x\"1234567890123456789012\""}"#;
        let (quoted, kept) = quote_inexact_numbers(text);
        assert!(matches!(quoted, Cow::Borrowed(_)));
        assert!(kept.is_empty());
        // Digits inside a word of text that is not JSON are no number.
        let (quoted, kept) = quote_inexact_numbers("build_123456789012345678901 ok");
        assert!(matches!(quoted, Cow::Borrowed(_)) && kept.is_empty());
    }

    #[test]
    fn decimals_compare_by_value_not_by_spelling() {
        assert_eq!(decimal("1.50"), decimal("15e-1"));
        assert_eq!(decimal("0.001"), decimal("1e-3"));
        assert_eq!(decimal("-0.0"), decimal("0"));
        assert_ne!(decimal("-1"), decimal("1"));
        // Exponents at `i64`'s ends neither overflow nor pass for zero.
        assert_eq!(decimal("0.0001e-9223372036854775808").1, "1");
        let (_, kept) =
            quote_inexact_numbers("[0.0001e-9223372036854775808, 1e9223372036854775807]");
        assert_eq!(kept.len(), 2);
        assert_ne!(
            decimal("123456789012345678901"),
            decimal("1.2345678901234568e20")
        );
    }
}
