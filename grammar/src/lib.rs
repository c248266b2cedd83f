//! The small languages inside workflow strings.
//!
//! - [`template`]: `${...}` interpolation, `$NAME` and `$$`, with filters and list modifiers.
//! - [`expr`]: the filter language of `map.filter`, also used by `when:` and env conditions.
//! - [`sort`]: `map.sort_by` specifications.
//! - [`jsonpath`]: `map.json_path`, through the `jsonpath-rust` crate.
//!
//! Each language has a typed AST generic over its span type (`S = Span` from the parsers,
//! `S = ()` in tests), a canonical printer (`Display`) and an evaluator over
//! `serde_json::Value`.
//! This crate knows nothing about YAML and exposes no pest types: parse errors are
//! [`ParseError`]s with spans local to the parsed string.

mod error;
pub mod exact;
pub mod expr;
pub mod jsonpath;
mod lower;
pub mod path;
pub mod pipeline;
pub mod sort;
pub mod template;
pub mod value;

pub use error::{ParseError, ParseErrorKind};
pub use path::{Path, Segment};

/// A byte range inside the parsed string.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Span {
    /// First byte.
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
}

impl Span {
    /// A span from two offsets.
    pub fn new(start: usize, end: usize) -> Self {
        Span {
            start,
            end: end.max(start),
        }
    }
}

/// How deeply parentheses, brackets and `${` may nest in one expression.
pub const MAX_DEPTH: usize = 64;

/// Compiles a regular expression, or says in one line why it does not compile.
pub fn compile_regex(pattern: &str) -> Result<regex::Regex, String> {
    // Patterns come from workflows and item data: bound what one may cost to build.
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .dfa_size_limit(1 << 20)
        .build()
        .map_err(|err| {
            let detail = err.to_string();
            detail
                .lines()
                .last()
                .unwrap_or("invalid")
                .trim()
                .trim_start_matches("error: ")
                .to_owned()
        })
}

#[cfg(test)]
mod regex_tests {
    #[test]
    fn regexes_are_bounded_in_size() {
        assert!(super::compile_regex(r"\.rs$").is_ok());
        // Item data can supply `matches` patterns; one that would take megabytes is refused.
        assert!(super::compile_regex(r"(\w{20}){20}").is_err());
    }
}
