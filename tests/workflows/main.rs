//! Fixture workflows: `workflows/ok/` and `workflows/examples/` must compile with no diagnostic;
//! `workflows/err/CODE-*.yml` must report `CODE`, and its rendered report is a snapshot.

#![expect(
    clippy::unwrap_used,
    clippy::disallowed_methods,
    reason = "test helpers fail loudly and read fixtures directly"
)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use prodigy_compiler::diagnostics::{Code, render_human};
use prodigy_compiler::source::SourceFile;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixtures(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("workflows").join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yml" || e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in workflows/{dir}");
    files
}

/// Loads a fixture under its repository-relative name, so snapshots do not depend on where the
/// checkout lives.
fn load(path: &Path) -> SourceFile {
    let text = std::fs::read_to_string(path).unwrap();
    let name = path.strip_prefix(root()).unwrap().display().to_string();
    SourceFile::new(name, text)
}

#[test]
fn ok_fixtures_have_no_diagnostics() {
    let mut failures = Vec::new();
    for path in fixtures("ok").into_iter().chain(fixtures("examples")) {
        let file = load(&path);
        let file_exists = |p: &str| root().join(p).is_file();
        let surroundings = prodigy_compiler::Surroundings {
            file_exists: &file_exists,
        };
        let checked = prodigy_compiler::check_in(&file, &surroundings);
        if !checked.diagnostics.is_empty() || checked.workflow.is_none() {
            failures.push(render_human(&file, &checked.diagnostics, 100, false));
        }
    }
    assert!(
        failures.is_empty(),
        "ok fixtures with diagnostics:\n{}",
        failures.join("\n")
    );
}

#[test]
fn err_fixtures_report_their_code() {
    for path in fixtures("err") {
        let file = load(&path);
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        let code_text = stem.split('-').next().unwrap();
        let code = Code::parse(code_text)
            .unwrap_or_else(|| panic!("{stem}: `{code_text}` is not a registered code"));
        let file_exists = |p: &str| root().join(p).is_file();
        let surroundings = prodigy_compiler::Surroundings {
            file_exists: &file_exists,
        };
        let checked = prodigy_compiler::check_in(&file, &surroundings);
        assert!(
            checked.diagnostics.iter().any(|d| d.code == code),
            "{stem}: expected {code}, got {:?}",
            checked
                .diagnostics
                .iter()
                .map(|d| d.code.as_str())
                .collect::<Vec<_>>()
        );
        let rendered = render_human(&file, &checked.diagnostics, 100, false);
        insta::with_settings!({
            snapshot_path => "../../workflows/err/snapshots",
            prepend_module_to_snapshot => false,
            omit_expression => true,
        }, {
            insta::assert_snapshot!(stem, rendered);
        });
    }
}

#[test]
fn every_code_has_a_fixture() {
    let with_fixture: BTreeSet<String> = fixtures("err")
        .iter()
        .map(|p| {
            p.file_stem()
                .unwrap()
                .to_string_lossy()
                .split('-')
                .next()
                .unwrap()
                .to_owned()
        })
        .collect();
    let missing: Vec<&str> = Code::ALL
        .iter()
        .filter(|c| **c != Code::Internal)
        .map(|c| c.as_str())
        .filter(|c| !with_fixture.contains(*c))
        .collect();
    assert!(
        missing.is_empty(),
        "codes without a fixture under workflows/err/: {missing:?}"
    );
}
