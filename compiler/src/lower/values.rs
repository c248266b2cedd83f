//! Scalar values: strings, booleans, numbers, durations and enum choices.

use std::time::Duration;

use super::{Lowerer, one_of, suggest};
use crate::diagnostics::{Code, Diagnostic};
use crate::shapes;
use crate::source::Spanned;
use crate::syntax::{Node, Scalar};

impl Lowerer<'_> {
    /// A string; numbers and booleans are taken as their text, as YAML authors expect.
    pub(crate) fn string(&mut self, node: &Node, what: &str) -> Option<Spanned<String>> {
        match node.scalar() {
            Some(Scalar::Null) | None => {
                self.wrong_type(node, what, "a string");
                None
            }
            Some(_) => node.text().map(|t| Spanned::new(t.to_owned(), node.span)),
        }
    }

    /// A list of strings; a single string is accepted as a list of one.
    pub(crate) fn string_list(&mut self, node: &Node, what: &str) -> Vec<Spanned<String>> {
        match node.as_seq() {
            Some(items) => items.iter().filter_map(|n| self.string(n, what)).collect(),
            None if node.as_map().is_none() && !node.is_null() => {
                self.string(node, what).into_iter().collect()
            }
            None => {
                self.wrong_type(node, what, "a list of strings");
                Vec::new()
            }
        }
    }

    /// A boolean.
    pub(crate) fn boolean(&mut self, node: &Node, what: &str) -> Option<bool> {
        if let Some(Scalar::Bool(b)) = node.scalar() {
            return Some(b);
        }
        // `"true"` quoted is a common slip; accept it as the boolean it spells.
        match node.scalar() {
            Some(Scalar::Str("true")) => Some(true),
            Some(Scalar::Str("false")) => Some(false),
            _ => {
                self.wrong_type(node, what, "`true` or `false`");
                None
            }
        }
    }

    /// A whole number in `min..=max`.
    pub(crate) fn integer(
        &mut self,
        node: &Node,
        what: &str,
        min: i64,
        max: i64,
    ) -> Option<Spanned<i64>> {
        let value = match node.scalar() {
            Some(Scalar::Int(i)) => i,
            Some(Scalar::Str(s)) if s.trim().parse::<i64>().is_ok() => s.trim().parse().ok()?,
            Some(Scalar::Float(f)) if f.fract() == 0.0 && f.abs() < 9e15 => {
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "checked to be a small whole number"
                )]
                let i = f as i64;
                i
            }
            _ => {
                self.wrong_type(node, what, "a whole number");
                return None;
            }
        };
        if value < min || value > max {
            let max = (max < i64::MAX).then_some(max);
            self.out_of_range(node, what, value, min, max);
            return None;
        }
        Some(Spanned::new(value, node.span))
    }

    fn out_of_range<T: std::fmt::Display>(
        &mut self,
        node: &Node,
        what: &str,
        value: T,
        min: T,
        max: Option<T>,
    ) {
        let range = match max {
            Some(max) => format!("from {min} to {max}"),
            None => format!("at least {min}"),
        };
        self.push(
            Diagnostic::new(Code::OutOfRange, format!("{what} must be {range}"))
                .with_primary(node.span, format!("{value} is out of range"))
                .with_help(format!("use a value {range}")),
        );
    }

    /// A whole number ≥ `min` that fits in `u32`.
    pub(crate) fn count(&mut self, node: &Node, what: &str, min: u32) -> Option<Spanned<u32>> {
        self.count_in(node, what, min, u32::MAX)
    }

    /// A whole number in `min..=max`.
    pub(crate) fn count_in(
        &mut self,
        node: &Node,
        what: &str,
        min: u32,
        max: u32,
    ) -> Option<Spanned<u32>> {
        self.integer(node, what, i64::from(min), i64::from(max))
            .and_then(|n| u32::try_from(n.value).ok().map(|v| Spanned::new(v, n.span)))
    }

    /// A number of attempts: 1 to [`MAX_ATTEMPTS`]. More is never meant, and every retry
    /// has a delay the plan computes up front.
    pub(crate) fn attempts(&mut self, node: &Node, what: &str) -> Option<Spanned<u32>> {
        self.count_in(node, what, 1, MAX_ATTEMPTS)
    }

    /// A whole number ≥ `min` as `u64`.
    pub(crate) fn size(&mut self, node: &Node, what: &str, min: u64) -> Option<Spanned<u64>> {
        self.integer(node, what, i64::try_from(min).unwrap_or(0), i64::MAX)
            .and_then(|n| u64::try_from(n.value).ok().map(|v| Spanned::new(v, n.span)))
    }

    /// A number in `min..=max`.
    pub(crate) fn number(
        &mut self,
        node: &Node,
        what: &str,
        min: f64,
        max: f64,
    ) -> Option<Spanned<f64>> {
        #[expect(
            clippy::cast_precision_loss,
            reason = "YAML integers used as numbers are small"
        )]
        let value = match node.scalar() {
            Some(Scalar::Int(i)) => i as f64,
            Some(Scalar::Float(f)) if f.is_finite() => f,
            Some(Scalar::Str(s)) if s.trim().parse::<f64>().is_ok_and(f64::is_finite) => {
                s.trim().parse().ok()?
            }
            _ => {
                self.wrong_type(node, what, "a number");
                return None;
            }
        };
        if value < min || value > max {
            let max = (max < f64::MAX).then_some(max);
            self.out_of_range(node, what, value, min, max);
            return None;
        }
        Some(Spanned::new(value, node.span))
    }

    /// A duration: a humantime string (`30s`, `1m 30s`, `500ms`), a number of seconds, or
    /// serde's `{secs, nanos}` form that upstream's error policy uses.
    pub(crate) fn duration(&mut self, node: &Node, what: &str) -> Option<Spanned<Duration>> {
        let parsed = match node.scalar() {
            Some(Scalar::Int(i)) if i >= 0 => Some(Duration::from_secs(i.unsigned_abs())),
            // Seconds beyond what a `Duration` holds are "not a duration", never a panic.
            Some(Scalar::Float(f)) if f >= 0.0 && f.is_finite() => {
                Duration::try_from_secs_f64(f).ok()
            }
            Some(Scalar::Str(s)) => {
                let s = s.trim();
                s.parse::<u64>()
                    .ok()
                    .map(Duration::from_secs)
                    .or_else(|| humantime::parse_duration(s).ok())
            }
            Some(Scalar::Int(_) | Scalar::Float(_)) => {
                self.push(
                    Diagnostic::new(Code::InvalidDuration, format!("{what} cannot be negative"))
                        .with_primary(node.span, "a negative duration")
                        .with_help("use a duration such as `30s` or a number of seconds"),
                );
                return None;
            }
            Some(Scalar::Null | Scalar::Bool(_)) => None,
            None => return self.secs_nanos(node, what),
        };
        if parsed.is_none() {
            let text = node.text().unwrap_or_default();
            self.push(
                Diagnostic::new(Code::InvalidDuration, format!("{what} is not a duration"))
                    .with_primary(node.span, format!("`{text}` is not a duration"))
                    .with_help("write a number of seconds or a duration such as `30s`, `1m 30s` or `500ms`"),
            );
        }
        parsed.map(|d| Spanned::new(d, node.span))
    }

    /// A delay: a field upstream reads with humantime (retry delays, `max_delay`,
    /// `retry_budget`, backoff parameters, the circuit breaker's `timeout`), where the user
    /// documentation lists a bare `500` among the invalid formats: it could mean
    /// milliseconds or seconds, so a number other than 0 needs a unit.
    /// Humantime strings and `{secs, nanos}` are read as [`Self::duration`] reads them.
    pub(crate) fn delay(&mut self, node: &Node, what: &str) -> Option<Spanned<Duration>> {
        let unitless = match node.scalar() {
            Some(Scalar::Int(i)) => i > 0,
            Some(Scalar::Float(f)) => f > 0.0,
            Some(Scalar::Str(s)) => s.trim().parse::<f64>().is_ok_and(|f| f > 0.0),
            Some(Scalar::Null | Scalar::Bool(_)) | None => false,
        };
        if unitless {
            let text = node.text().unwrap_or_default().trim();
            self.push(
                Diagnostic::new(Code::InvalidDuration, format!("{what} needs a unit"))
                    .with_primary(node.span, format!("`{text}` has no unit"))
                    .with_help(format!("write `{text}ms` or `{text}s`")),
            );
            return None;
        }
        // `1 second` and `2 minutes` are invalid formats of these fields (docs/language.md §1,
        // durations): units are written short and next to their numbers.
        if let Some(Scalar::Str(s)) = node.scalar()
            && let Some(compact) = compact_duration(s)
        {
            let text = s.trim();
            let fix = crate::diagnostics::Fix::replace(
                format!("write `{compact}`"),
                node.span,
                compact.clone(),
            );
            let mut diagnostic = Diagnostic::new(
                Code::InvalidDuration,
                format!("{what} needs a short unit next to its number"),
            )
            .with_primary(node.span, format!("`{text}` is not a duration here"))
            .with_help(format!(
                "write `{compact}`: short units next to their numbers"
            ));
            diagnostic.fix = Some(fix);
            self.push(diagnostic);
            return None;
        }
        self.duration(node, what)
    }

    fn secs_nanos(&mut self, node: &Node, what: &str) -> Option<Spanned<Duration>> {
        if node.as_map().is_none() {
            self.wrong_type(
                node,
                what,
                "a duration such as `30s` or a number of seconds",
            );
            return None;
        }
        let fields = self.fields(node, what, &shapes::SECS_NANOS)?;
        let secs = fields.u64(self, "secs", 0).map_or(0, |s| s.value);
        let nanos = fields.u32(self, "nanos", 0).map_or(0, |s| s.value);
        Some(Spanned::new(Duration::new(secs, nanos), node.span))
    }

    /// One of a fixed set of words (case-insensitive), with a did-you-mean otherwise.
    pub(crate) fn choice<T: Clone>(
        &mut self,
        node: &Node,
        what: &str,
        choices: &[(&str, T)],
    ) -> Option<Spanned<T>> {
        let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
        let Some(text) = node.text().filter(|_| !node.is_null()) else {
            self.wrong_type(node, what, &one_of(&names));
            return None;
        };
        if let Some((_, value)) = choices.iter().find(|(n, _)| fold(n) == fold(text)) {
            return Some(Spanned::new(value.clone(), node.span));
        }
        self.unknown_variant(node, what, text, &names);
        None
    }

    /// Reports a value that is not one of `names`.
    pub(crate) fn unknown_variant(&mut self, node: &Node, what: &str, text: &str, names: &[&str]) {
        let help = match suggest(text, names.iter().copied()) {
            Some(s) => format!("did you mean `{s}`?"),
            None => format!("use {}", one_of(names)),
        };
        self.push(
            Diagnostic::new(
                Code::UnknownVariant,
                format!("`{text}` is not a valid {what}"),
            )
            .with_primary(node.span, format!("expected {}", one_of(names)))
            .with_help(help),
        );
    }
}

/// The compact spelling (`1s`, `2m`, `1h30m`) of a duration written with a unit spelled out
/// (`1 second`, `2 minutes`, `5 secs`) or apart from its number (`30 s`), when it reads as
/// the same duration; `None` for a duration already written compactly (`1m 30s`) or text
/// that is not one.
fn compact_duration(text: &str) -> Option<String> {
    const UNITS: &[(&str, &[&str])] = &[
        ("ns", &["ns", "nsec", "nanos", "nanosecond", "nanoseconds"]),
        (
            "us",
            &["us", "usec", "micros", "microsecond", "microseconds"],
        ),
        (
            "ms",
            &["ms", "msec", "millis", "millisecond", "milliseconds"],
        ),
        ("s", &["s", "sec", "secs", "second", "seconds"]),
        ("m", &["m", "min", "mins", "minute", "minutes"]),
        ("h", &["h", "hr", "hrs", "hour", "hours"]),
        ("d", &["d", "day", "days"]),
        ("w", &["w", "week", "weeks"]),
    ];
    let mut rest = text.trim();
    let mut out = String::new();
    let mut rewritten = false;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let (number, after) = rest.split_at(digits);
        let unit_at = after.trim_start();
        rewritten |= unit_at.len() != after.len();
        let letters = unit_at
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(unit_at.len());
        let (unit, next) = unit_at.split_at(letters);
        let unit = unit.to_ascii_lowercase();
        let (short, _) = UNITS
            .iter()
            .find(|(_, names)| names.contains(&unit.as_str()))?;
        rewritten |= unit != *short;
        out.push_str(number);
        out.push_str(short);
        rest = next.trim_start();
    }
    let same =
        humantime::parse_duration(&out).ok()? == humantime::parse_duration(text.trim()).ok()?;
    (rewritten && same).then_some(out)
}

/// Case and underscores do not matter in choices: `PerAgent`, `per_agent` and `peragent` are one word.
fn fold(word: &str) -> String {
    word.trim()
        .chars()
        .filter(|c| *c != '_')
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// The most attempts a retry setting may ask for.
pub(crate) const MAX_ATTEMPTS: u32 = 1000;

#[cfg(test)]
mod tests {
    use super::compact_duration;

    #[test]
    fn durations_with_units_spelled_out_have_a_compact_spelling() {
        for (text, compact) in [
            ("1 second", Some("1s")),
            ("2 minutes", Some("2m")),
            ("1 hour 30 mins", Some("1h30m")),
            ("30 s", Some("30s")),
            ("500 millis", Some("500ms")),
            ("1s", None),
            ("1m 30s", None),
            ("500ms", None),
            ("soon", None),
            ("1 fortnight", None),
        ] {
            assert_eq!(compact_duration(text).as_deref(), compact, "{text}");
        }
    }
}
