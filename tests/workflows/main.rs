//! Fixture workflows, one test each: `workflows/ok/` and `workflows/examples/` must compile
//! with no diagnostic and draw the same valid graphs every time; `workflows/err/CODE-*.yml`
//! must report `CODE`, and its rendered report is a snapshot; `workflows/run/*.yml` run end to
//! end in a scratch project, and their exit code, output and events are a snapshot.
//!
//! A custom harness (`harness = false`, `libtest-mimic`) makes each fixture a test of its own,
//! named `CHECK::DIR/STEM` (`err_fixtures_report_their_code::err/E001-...`), so that a failing
//! fixture hides no other and `cargo test --test workflows -- STEM` runs one fixture alone.

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test helpers fail loudly and read fixtures directly"
)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use libtest_mimic::{Arguments, Failed, Trial};
use prodigy_compiler::diagnostics::{Code, render_human};
use prodigy_compiler::source::{LoadDiagnostic as _, SourceFile};

#[path = "../support/external.rs"]
mod external;

#[path = "../support/scratch.rs"]
mod scratch;

#[path = "../../src/shellcheck.rs"]
#[allow(
    unused_imports,
    dead_code,
    reason = "its unit tests run with the binary's; this custom harness leaves out their `#[test]` functions"
)]
mod shellcheck;

use scratch::root;

/// The repository as the project directory: fixtures name files relative to it.
/// Slash commands are unknown (nothing to compare with), except for the W008 fixtures, which
/// are checked as if in the project `workflows/err/data/claude-project`. Map input files the
/// fixtures name are there (W012 is for its own fixtures), though only those under
/// `workflows/` can be read.
fn surroundings(stem: &str) -> prodigy_compiler::Surroundings<'static> {
    use prodigy_compiler::claude::{CommandLookup, find_command};
    let slash_command: &'static dyn Fn(&str) -> CommandLookup = if stem.starts_with("W008") {
        &|name: &str| {
            let dirs = [root().join("workflows/err/data/claude-project/.claude")];
            find_command(name, &dirs, &|p| p.is_file(), &|p| p.is_dir())
        }
    } else {
        &|_: &str| CommandLookup::Unknown
    };
    let file_exists: &'static dyn Fn(&str) -> bool = if stem.starts_with("W012") {
        &|p: &str| root().join(p).is_file()
    } else {
        &|p: &str| root().join(p).is_file() || prodigy_grammar::pipeline::names_a_file(p)
    };
    prodigy_compiler::Surroundings {
        file_exists,
        read_file: &|p: &str| std::fs::read_to_string(root().join(p)).ok(),
        tracked: &|p: &str| {
            std::process::Command::new("git")
                .args(["ls-files", "--error-unmatch", "--", p])
                .current_dir(root())
                .output()
                .is_ok_and(|o| o.status.success())
        },
        slash_command,
    }
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

/// Loads a fixture as `prodigy check` does, with the diagnostic of a file it cannot load.
fn load_checked(path: &Path) -> (SourceFile, Vec<prodigy_compiler::diagnostics::Diagnostic>) {
    let name = path.strip_prefix(root()).unwrap().display().to_string();
    match SourceFile::load(path) {
        Ok(mut file) => {
            file.name = name;
            let stem = path.file_stem().unwrap().to_string_lossy().to_string();
            let checked = if stem.starts_with("S001") {
                // ShellCheck's findings: the fixture needs the program.
                let Some(sc) = shellcheck::ShellCheck::find() else {
                    external::missing_tool(&format!("fixture {stem}"), "shellcheck", "shellcheck");
                    return (file, Vec::new());
                };
                let lint = |scripts: &[prodigy_compiler::shell::Script]| sc.lint(scripts).unwrap();
                prodigy_compiler::check_linted(&file, &surroundings(&stem), &lint)
            } else {
                prodigy_compiler::check_in(&file, &surroundings(&stem))
            };
            (file, checked.diagnostics)
        }
        Err(e) => {
            let file = SourceFile::new(name, e.valid_prefix().to_owned());
            let mut diagnostic = e.diagnostic();
            // The message names the path as given: make it the repository-relative one.
            diagnostic.message = diagnostic
                .message
                .replace(&path.display().to_string(), &file.name);
            (file, vec![diagnostic])
        }
    }
}

/// An `ok` or `examples` fixture compiles with no diagnostic.
fn ok_fixture_has_no_diagnostics(path: &Path) {
    let file = load(path);
    let checked = prodigy_compiler::check_in(&file, &surroundings(""));
    assert!(
        checked.diagnostics.is_empty() && checked.workflow.is_some(),
        "an ok fixture with diagnostics:\n{}",
        render_human(&file, &checked.diagnostics, 100, false)
    );
}

/// An `err` fixture `CODE-*.yml` reports `CODE` (and no internal error); its rendered
/// report is a snapshot.
fn err_fixture_reports_its_code(path: &Path) {
    let (file, diagnostics) = load_checked(path);
    let stem = path.file_stem().unwrap().to_string_lossy().to_string();
    let code_text = stem.split('-').next().unwrap();
    let code = Code::parse(code_text)
        .unwrap_or_else(|| panic!("{stem}: `{code_text}` is not a registered code"));
    if code == Code::Shellcheck && shellcheck::ShellCheck::find().is_none() {
        // Skipped in `load_checked`, which said so: ShellCheck is not installed.
        return;
    }
    assert!(
        diagnostics.iter().any(|d| d.code == code),
        "{stem}: expected {code}, got {:?}",
        diagnostics
            .iter()
            .map(|d| d.code.as_str())
            .collect::<Vec<_>>()
    );
    assert!(
        diagnostics.iter().all(|d| d.code != Code::Internal),
        "{stem}: an internal error is a bug, never an expected result"
    );
    let rendered = render_human(&file, &diagnostics, 100, false);
    insta::with_settings!({
        snapshot_path => "../../workflows/err/snapshots",
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_snapshot!(stem, rendered);
    });
}

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

/// Graphviz must accept the DOT; it is installed by `.ci/run`, and optional elsewhere.
fn dot_accepts(name: &str, dot: &str) {
    use std::io::Write as _;
    let child = std::process::Command::new("dot")
        .arg("-Tsvg")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        // One line for the whole test, not one per fixture.
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            external::missing_tool(
                "rendering the fixtures' graphs with Graphviz",
                "dot",
                "graphviz",
            );
        });
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(dot.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{name}: dot rejected the graph: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A small checker for the Mermaid `flowchart` syntax we emit: every line is a node, an edge,
/// a subgraph bracket, or a comment `%% nN: FILE:LINE` after a declared node (not a `%%{`
/// directive), labels are quoted without raw quotes or bars, and every edge joins declared
/// nodes.
fn mermaid_is_valid(name: &str, text: &str) {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("flowchart TD"), "{name}: header");
    let label = r#""[^"|]*""#;
    let node = regex::Regex::new(&format!(
        r"^(n\d+)(\(\({label}\)\)|\(\(\({label}\)\)\)|\[/{label}/\]|\{{\{{{label}\}}\}}|\[\({label}\)\]|\[{label}\])$"
    ))
    .unwrap();
    let edge =
        regex::Regex::new(&format!(r"^(n\d+) (-->|==>|-\.->)(?:\|{label}\|)? (n\d+)$")).unwrap();
    let subgraph = regex::Regex::new(&format!(r"^subgraph \w+\[{label}\]$")).unwrap();
    let origin = regex::Regex::new(r"^%% (n\d+): [^\n{}]*:[1-9]\d*$").unwrap();
    let mut declared = BTreeSet::new();
    let mut depth = 0;
    for line in lines {
        let line = line.trim();
        if let Some(c) = node.captures(line) {
            declared.insert(c[1].to_owned());
        } else if let Some(c) = edge.captures(line) {
            assert!(
                declared.contains(&c[1]) && declared.contains(&c[3]),
                "{name}: edge to an undeclared node: {line}"
            );
        } else if let Some(c) = origin.captures(line) {
            assert!(
                declared.contains(&c[1]),
                "{name}: a comment on an undeclared node: {line}"
            );
        } else if subgraph.is_match(line) {
            depth += 1;
        } else if line == "end" {
            depth -= 1;
        } else {
            panic!("{name}: not flowchart syntax: {line}");
        }
    }
    assert_eq!(depth, 0, "{name}: unbalanced subgraph");
}

/// An `ok` or `examples` fixture draws the same graph twice, which Graphviz renders and
/// which is valid Mermaid; both are snapshots.
fn ok_fixture_draws_a_valid_deterministic_graph(path: &Path) {
    let file = load(path);
    let checked = prodigy_compiler::check(&file);
    let (plan, graph) = (checked.plan.unwrap(), checked.graph.unwrap());
    let stem = path.file_stem().unwrap().to_string_lossy().to_string();
    let dot = prodigy_compiler::emit::dot(&graph, &plan);
    let mermaid = prodigy_compiler::emit::mermaid(&graph, &plan);
    // The same graph again, byte for byte.
    let again = prodigy_compiler::check(&file);
    assert_eq!(
        dot,
        prodigy_compiler::emit::dot(again.graph.as_ref().unwrap(), again.plan.as_ref().unwrap())
    );
    dot_accepts(&stem, &dot);
    mermaid_is_valid(&stem, &mermaid);
    let dir = fixture_dir(path);
    insta::with_settings!({
        snapshot_path => format!("../../workflows/{dir}/snapshots"),
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_snapshot!(format!("{stem}.dot"), dot);
        insta::assert_snapshot!(format!("{stem}.mermaid"), mermaid);
    });
}

/// `ok` or `examples`: where PATH's snapshots live.
fn fixture_dir(path: &Path) -> &'static str {
    if path.starts_with(root().join("workflows/ok")) {
        "ok"
    } else {
        "examples"
    }
}

/// The plans of the examples, and of two documentation examples, are snapshots.
fn plan_of_the_example(path: &Path) {
    let file = load(path);
    let plan = prodigy_compiler::check(&file).plan.unwrap();
    let stem = path.file_stem().unwrap().to_string_lossy().to_string();
    let dir = fixture_dir(path);
    insta::with_settings!({
        snapshot_path => format!("../../workflows/{dir}/snapshots"),
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_json_snapshot!(format!("{stem}.plan"), plan);
    });
}

/// A `run` fixture runs in a fresh scratch project with the arguments and failing stubs its
/// `# key: value` directives name; its exit code is the `exit` directive (0 by default), and
/// its report is a snapshot.
fn run_fixture(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let extra = scratch::directives(&text);
    let name = path.file_stem().unwrap().to_string_lossy().to_string();
    let (scratch, output) = scratch::run_file(path, &extra);
    scratch::check_exit(
        &name,
        &output,
        extra.get("exit").map_or("0", String::as_str),
    );
    let unordered = extra.get("events").is_some_and(|v| v == "unordered");
    scratch::snapshot(
        "run/snapshots",
        &name,
        &scratch::report_with(&scratch, &output, unordered),
    );
}

/// One test per fixture and check: `CHECK::DIR/STEM`.
fn per_fixture(trials: &mut Vec<Trial>, check: &str, dirs: &[&str], test: fn(&Path)) {
    for dir in dirs {
        for path in fixtures(dir) {
            let stem = path.file_stem().unwrap().to_string_lossy().to_string();
            trials.push(Trial::test(format!("{check}::{dir}/{stem}"), move || {
                test(&path);
                Ok::<(), Failed>(())
            }));
        }
    }
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    per_fixture(
        &mut trials,
        "ok_fixtures_have_no_diagnostics",
        &["ok", "examples"],
        ok_fixture_has_no_diagnostics,
    );
    per_fixture(
        &mut trials,
        "ok_fixtures_draw_valid_deterministic_graphs",
        &["ok", "examples"],
        ok_fixture_draws_a_valid_deterministic_graph,
    );
    per_fixture(
        &mut trials,
        "err_fixtures_report_their_code",
        &["err"],
        err_fixture_reports_its_code,
    );
    per_fixture(
        &mut trials,
        "plans_of_the_examples",
        &["examples"],
        plan_of_the_example,
    );
    for name in [
        "seed-002-complete-structure",
        "seed-000-on-failure-detailed-handler",
        "claude-settings",
    ] {
        let path = root().join("workflows/ok").join(format!("{name}.yml"));
        trials.push(Trial::test(
            format!("plans_of_the_examples::ok/{name}"),
            move || {
                plan_of_the_example(&path);
                Ok(())
            },
        ));
    }
    per_fixture(&mut trials, "run_fixtures", &["run"], run_fixture);
    trials.push(Trial::test("every_code_has_a_fixture", || {
        every_code_has_a_fixture();
        Ok(())
    }));
    libtest_mimic::run(&args, trials).exit();
}
