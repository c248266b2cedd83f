//! `check` never panics, whatever the input, and every span it reports lies on character
//! boundaries inside the file, so every diagnostic can be rendered.

use proptest::prelude::*;

use prodigy_compiler::diagnostics::render_human;
use prodigy_compiler::source::SourceFile;

fn check_is_total(text: &str) {
    let file = SourceFile::new("fuzz.yml", text);
    let checked = prodigy_compiler::check(&file);
    for d in &checked.diagnostics {
        for label in d.primary.iter().chain(&d.labels) {
            let (start, end) = (label.span.start as usize, label.span.end as usize);
            assert!(
                start <= end && end <= text.len(),
                "{}: span {start}..{end} outside the file",
                d.code
            );
            assert!(
                text.is_char_boundary(start) && text.is_char_boundary(end),
                "{}: span splits a character",
                d.code
            );
        }
    }
    let _ = render_human(&file, &checked.diagnostics, 80, false);
}

const SEED: &str = include_str!("../../workflows/ok/seed-002-complete-structure.yml");

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_yaml_like_text(text in "[ a-z_:\\-\\[\\]{}&*!|>'\"#,\n0-9é$]{0,200}") {
        check_is_total(&text);
    }

    #[test]
    fn mutated_workflows(cuts in proptest::collection::vec((0usize..SEED.len(), 0usize..8, "[ :\\-\\[{&*\n]{0,3}"), 1..6)) {
        let mut text = SEED.to_owned();
        for (at, len, insert) in cuts {
            let mut at = at.min(text.len());
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            let mut end = (at + len).min(text.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.replace_range(at..end, &insert);
        }
        check_is_total(&text);
    }
}
