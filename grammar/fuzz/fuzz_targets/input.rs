//! Map input: reading any text as any kind never panics; a number is quoted only when a
//! 64-bit value would change it, and what JSON parses before quoting still parses after.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prodigy_grammar::exact::quote_inexact_numbers;
use prodigy_grammar::pipeline::{InputKind, parse_input};

fuzz_target!(|text: &str| {
    for kind in [InputKind::Json, InputKind::JsonLines, InputKind::Text] {
        let _ = parse_input(text, kind);
    }
    let (quoted, kept) = quote_inexact_numbers(text);
    if serde_json::from_str::<serde_json::Value>(text).is_ok() {
        assert!(serde_json::from_str::<serde_json::Value>(&quoted).is_ok());
    }
    assert_eq!(kept.is_empty(), quoted == text);
});
