//! Templates: parsing never panics; what parses prints to text that parses to the same AST
//! and renders against an empty scope without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prodigy_grammar::template::Template;

fuzz_target!(|text: &str| {
    if let Ok(t) = Template::parse(text) {
        let printed = t.to_string();
        let again = Template::parse(&printed).expect("printed template parses");
        assert_eq!(again.strip(), t.strip());
        let _ = t.render(&serde_json::json!({}));
    }
});
