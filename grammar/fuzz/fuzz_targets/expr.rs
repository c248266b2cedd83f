//! Filter and `when` expressions: parsing never panics; what parses round-trips through
//! the printer and evaluates without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prodigy_grammar::expr::Expr;

fuzz_target!(|text: &str| {
    if let Ok(e) = Expr::parse(text) {
        let printed = e.to_string();
        let again = Expr::parse(&printed).expect("printed expression parses");
        assert_eq!(again.strip(), e.strip());
        let _ = e.matches_item(&serde_json::json!({"a": 1, "b": [1, "x"], "c": {"d": null}}));
    }
});
