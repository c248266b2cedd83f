//! The workflow files of the public Prodigy repository, checked against known outcomes.
//!
//! The corpus lives in `../shared/corpus/prodigy` beside the repository (override with
//! `PRODIGY_CORPUS`); it is read in place, never copied into this project, and the test skips
//! with a line saying so when it is missing outside CI. `docs/compat.md` explains each outcome.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use std::collections::BTreeSet;

use prodigy_compiler::source::SourceFile;

#[path = "../support/external.rs"]
mod external;

type Expected = (
    &'static str,
    &'static [(&'static str, usize)],
    &'static [(&'static str, usize)],
);

/// Every corpus file: (path, errors as (code, line), warnings as (code, line)).
/// Most warnings are W006: upstream's own workflows splice `${item.*}` and captured output
/// into shell commands unquoted.
const EXPECTED: &[Expected] = &[
    (
        "examples/capture-conditional-flow.yml",
        &[],
        &[
            ("W006", 31),
            ("W006", 40),
            ("W006", 58),
            ("W006", 59),
            ("W006", 60),
            ("W006", 61),
            ("W006", 68),
            ("W006", 72),
        ],
    ),
    // `|length:100` is not a filter (upstream has no filters at all and leaves the text as is).
    (
        "examples/capture-json-processing.yml",
        &[("P101", 57)],
        &[
            ("W006", 14),
            ("W006", 14),
            ("W006", 32),
            ("W006", 33),
            ("W006", 34),
            ("W006", 35),
            ("W006", 43),
            ("W006", 44),
            ("W006", 47),
            ("W006", 48),
            ("W006", 49),
            ("W006", 51),
        ],
    ),
    (
        "examples/capture-output-custom-vars.yml",
        &[],
        &[
            ("W006", 19),
            ("W006", 36),
            ("W006", 37),
            ("W006", 52),
            ("W006", 55),
        ],
    ),
    // Upstream's own file is not valid YAML: a heredoc line at the wrong indentation.
    (
        "examples/capture-parallel-analysis.yml",
        &[("P001", 104)],
        &[],
    ),
    (
        "examples/mapreduce-command-input.yml",
        &[],
        &[("W006", 18), ("W006", 20)],
    ),
    // Upstream's own file is not valid YAML: an unquoted `: ` inside a plain scalar.
    ("examples/mapreduce-json-input.yml", &[("P001", 30)], &[]),
    ("examples/standard-workflow.yml", &[], &[]),
    ("examples/test-resume.yml", &[], &[]),
    ("examples/test-sensitive-masking.yml", &[], &[]),
    // `analyze:` steps were removed upstream.
    (
        "workflows/analysis-workflow.yml",
        &[("V009", 19), ("V009", 29), ("V009", 38)],
        &[],
    ),
    ("workflows/book-docs-drift.yml", &[], &[]),
    ("workflows/complex-build-pipeline.yml", &[], &[]),
    // `analysis:` caching was removed upstream: a warning, not an error.
    ("workflows/coverage-simplified.yml", &[], &[("W002", 9)]),
    (
        "workflows/coverage-with-test-debug.yml",
        &[],
        &[("W002", 8)],
    ),
    ("workflows/coverage.yml", &[("V009", 21)], &[]),
    ("workflows/debtmap-reduce.yml", &[], &[]),
    ("workflows/debtmap.yml", &[], &[]),
    ("workflows/debug.yml", &[], &[]),
    (
        "workflows/documentation-drift-mapreduce.yml",
        &[],
        &[
            ("W006", 61),
            ("W006", 63),
            ("W006", 67),
            ("W006", 69),
            ("W006", 69),
        ],
    ),
    ("workflows/documentation-drift.yml", &[], &[]),
    (
        "workflows/documentation-maintain.yml",
        &[],
        &[
            ("W010", 164),
            ("W010", 240),
            ("W010", 241),
            ("W010", 242),
            ("W010", 243),
        ],
    ),
    ("workflows/documentation-workflow.yml", &[], &[]),
    ("workflows/environment-example.yml", &[], &[("W005", 16)]),
    // `path matches '...'`: `matches` is a function; upstream's parser rejects this filter too.
    ("workflows/fix-files-mapreduce.yml", &[("P102", 41)], &[]),
    // Upstream's own file is not valid YAML: a list followed by a top-level mapping key.
    ("workflows/implement-with-tests.yml", &[("P001", 66)], &[]),
    ("workflows/implement.yml", &[], &[]),
    (
        "workflows/mapreduce-env-example.yml",
        &[],
        &[("W006", 61), ("W006", 65)],
    ),
    ("workflows/mapreduce-example.yml", &[], &[]),
    ("workflows/mkdocs-drift.yml", &[], &[]),
    // `args`/`options` beside `claude:` are not appended (only the legacy `name:` form does).
    (
        "workflows/product-enhancement-workflow.yml",
        &[],
        &[("W002", 9), ("W002", 15), ("W002", 19)],
    ),
    ("workflows/spec.yml", &[], &[]),
    ("workflows/tech-debt.yml", &[("V009", 3)], &[]),
    ("workflows/test-mapreduce-context.yml", &[], &[("W006", 15)]),
    ("workflows/test-mapreduce.yml", &[], &[("W006", 10)]),
    (
        "workflows/tests/minimal-mapreduce.yml",
        &[],
        &[
            ("W006", 43),
            ("W006", 43),
            ("W006", 44),
            ("W006", 44),
            ("W006", 45),
            ("W006", 48),
            ("W006", 49),
            ("W006", 49),
        ],
    ),
    (
        "workflows/tests/test-mapreduce-resume.yml",
        &[],
        &[
            ("W006", 30),
            ("W006", 30),
            ("W006", 30),
            ("W006", 36),
            ("W006", 36),
            ("W006", 37),
            ("W006", 37),
            ("W006", 38),
            ("W006", 38),
            ("W006", 39),
            ("W006", 40),
            ("W006", 44),
            ("W006", 45),
            ("W006", 45),
        ],
    ),
    ("workflows/tests/test-sequential-resume.yml", &[], &[]),
    ("workflows/workflow-syntax-drift.yml", &[], &[]),
];

fn yaml_files(dir: &std::path::Path, base: &std::path::Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, base, out);
        } else if path.extension().is_some_and(|e| e == "yml" || e == "yaml") {
            out.insert(path.strip_prefix(base).unwrap().display().to_string());
        }
    }
}

#[test]
fn corpus_files_have_their_known_outcome() {
    let Some(dir) = external::corpus_dir("corpus_files_have_their_known_outcome") else {
        return;
    };
    let mut on_disk = BTreeSet::new();
    yaml_files(&dir, &dir, &mut on_disk);
    let listed: BTreeSet<String> = EXPECTED.iter().map(|(p, _, _)| (*p).to_owned()).collect();
    assert_eq!(
        on_disk, listed,
        "the corpus and the expected outcomes list different files"
    );

    let mut mismatches = Vec::new();
    for (path, errors, warnings) in EXPECTED {
        let file = SourceFile::load(&dir.join(path)).unwrap();
        let checked = prodigy_compiler::check(&file);
        let found = |error: bool| -> Vec<(String, usize)> {
            checked
                .diagnostics
                .iter()
                .filter(|d| d.is_error() == error)
                .map(|d| {
                    (
                        d.code.as_str().to_owned(),
                        file.line_col(d.primary.as_ref().unwrap().span.start).line,
                    )
                })
                .collect()
        };
        let want = |list: &[(&str, usize)]| -> Vec<(String, usize)> {
            list.iter().map(|(c, l)| ((*c).to_owned(), *l)).collect()
        };
        let (got_errors, got_warnings) = (found(true), found(false));
        if got_errors != want(errors) || got_warnings != want(warnings) {
            mismatches.push(format!(
                "{path}: errors {got_errors:?}, warnings {got_warnings:?}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "unexpected outcomes:\n{}",
        mismatches.join("\n")
    );
}
