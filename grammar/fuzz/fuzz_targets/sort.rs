//! Sort specifications: parsing never panics; what parses round-trips and sorts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prodigy_grammar::sort::SortSpec;

fuzz_target!(|text: &str| {
    if let Ok(s) = SortSpec::parse(text) {
        let again = SortSpec::parse(&s.to_string()).expect("printed spec parses");
        assert_eq!(again.strip(), s.strip());
        let mut items = vec![serde_json::json!({"a": 2}), serde_json::json!({"a": null}), serde_json::json!(3)];
        s.sort(&mut items);
    }
});
