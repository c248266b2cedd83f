//! JSON paths: parsing never panics, and selecting never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prodigy_grammar::jsonpath::JsonPath;

fuzz_target!(|text: &str| {
    if let Ok(p) = JsonPath::parse(text) {
        let _ = p.select(&serde_json::json!({"items": [{"a": 1}, {"a": [2, 3]}], "b": "c"}));
    }
});
