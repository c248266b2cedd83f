//! Feeds arbitrary text to the whole front end (YAML tree, lowering, rendering).
//! It must never panic, whatever the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prodigy_compiler::diagnostics::render_human;
use prodigy_compiler::source::SourceFile;

fuzz_target!(|text: &str| {
    let file = SourceFile::new("fuzz.yml", text);
    let checked = prodigy_compiler::check(&file);
    let _ = render_human(&file, &checked.diagnostics, 80, false);
});
