//! The test-integrity verdict of an agent's work (`merge.integrity`, docs/mapreduce.md,
//! "Verified integration"): deterministic, read from the diff between where the agent's work
//! began and its last commit, with no model. It looks for what weakens a test suite while
//! keeping it green: test files deleted, test functions removed, skip markers added,
//! assertions removed, expected-output files rewritten, the test runner or CI changed.
//! Each finding has a level (`warn` or `fail`), what it is and where; the verdict is the
//! worst level found, `pass` when none.

use std::fmt::Write as _;

/// How bad a finding, or a whole verdict, is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Level {
    /// Nothing found.
    Pass,
    /// Worth a look, refuses nothing (a test renamed, a test's data edited).
    Warn,
    /// Weakens the tests (a test deleted or skipped, an assertion removed).
    Fail,
}

impl Level {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Level::Pass => "pass",
            Level::Warn => "warn",
            Level::Fail => "fail",
        }
    }
}

/// One thing the verdict found.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Finding {
    pub(crate) level: Level,
    /// What it is, for people.
    pub(crate) what: String,
    /// Where: `path` or `path:line` (the line in the agent's version, or the old one for
    /// what was removed).
    pub(crate) place: String,
}

/// The verdict on one agent's work.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub(crate) findings: Vec<Finding>,
}

impl Verdict {
    /// The worst level found.
    pub(crate) fn level(&self) -> Level {
        self.findings
            .iter()
            .map(|f| f.level)
            .max()
            .unwrap_or(Level::Pass)
    }

    /// `fail: a skip marker added (tests/a.rs:12)`, a line per finding.
    pub(crate) fn text(&self) -> String {
        let mut text = String::new();
        for f in &self.findings {
            let _ = writeln!(text, "{}: {} ({})", f.level.name(), f.what, f.place);
        }
        text
    }

    fn push(&mut self, level: Level, what: impl Into<String>, place: impl Into<String>) {
        self.findings.push(Finding {
            level,
            what: what.into(),
            place: place.into(),
        });
    }
}

/// One file of a unified diff.
#[derive(Debug, Default)]
struct FileDiff {
    old: String,
    new: String,
    deleted: bool,
    renamed: bool,
    /// Lines added, with their line numbers in the new file.
    added: Vec<(usize, String)>,
    /// Lines removed, with their line numbers in the old file.
    removed: Vec<(usize, String)>,
}

/// The files of PATCH, `git diff --no-color --find-renames -U0` output.
fn files(patch: &str) -> Vec<FileDiff> {
    let mut out: Vec<FileDiff> = Vec::new();
    let (mut old_line, mut new_line) = (0usize, 0usize);
    for line in patch.lines() {
        if let Some(rest) = line.strip_prefix("diff --git ") {
            let (a, b) = rest.split_once(" b/").unwrap_or((rest, rest));
            out.push(FileDiff {
                old: a.trim_start_matches("a/").to_owned(),
                new: b.to_owned(),
                ..FileDiff::default()
            });
            continue;
        }
        let Some(file) = out.last_mut() else { continue };
        if line.starts_with("deleted file mode") {
            file.deleted = true;
        } else if let Some(from) = line.strip_prefix("rename from ") {
            file.renamed = true;
            from.clone_into(&mut file.old);
        } else if let Some(to) = line.strip_prefix("rename to ") {
            to.clone_into(&mut file.new);
        } else if let Some(hunk) = line.strip_prefix("@@ ") {
            // `@@ -a[,b] +c[,d] @@`
            let mut parts = hunk.split_whitespace();
            let start = |p: Option<&str>| -> usize {
                p.and_then(|s| s.get(1..)?.split(',').next().and_then(|n| n.parse().ok()))
                    .unwrap_or(0)
            };
            old_line = start(parts.next());
            new_line = start(parts.next());
        } else if line.starts_with("+++") || line.starts_with("---") {
        } else if let Some(text) = line.strip_prefix('+') {
            file.added.push((new_line, text.to_owned()));
            new_line += 1;
        } else if let Some(text) = line.strip_prefix('-') {
            file.removed.push((old_line, text.to_owned()));
            old_line += 1;
        }
    }
    out
}

/// Whether PATH is a test file by its name or directory, in the common layouts of Rust,
/// Python, JavaScript/TypeScript, Go, Java and Ruby.
pub(crate) fn is_test_path(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    let name = lower.rsplit('/').next().unwrap_or(&lower);
    let dirs: Vec<&str> = lower.split('/').collect();
    let in_test_dir = dirs[..dirs.len().saturating_sub(1)].iter().any(|d| {
        matches!(
            *d,
            "tests" | "test" | "__tests__" | "spec" | "specs" | "testing"
        )
    });
    in_test_dir
        || name.starts_with("test_")
        || name.ends_with("_test.py")
        || name.ends_with("_test.go")
        || name.ends_with("_test.rs")
        || name.ends_with("_spec.rb")
        || name.ends_with("test.java")
        || [".test.", ".spec."].iter().any(|m| name.contains(m))
}

/// Whether PATH holds expected output: a snapshot, a golden or expected file.
fn is_expected_output(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    let name = lower.rsplit('/').next().unwrap_or(&lower);
    lower.contains("__snapshots__/")
        || lower.contains("/snapshots/")
        || lower.contains("/golden/")
        || lower.contains("/expected/")
        || [".snap", ".expected", ".golden", ".approved.txt"]
            .iter()
            .any(|e| name.ends_with(e))
}

/// Whether PATH configures CI or how the tests run.
fn is_ci_or_runner(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    let name = lower.rsplit('/').next().unwrap_or(&lower);
    lower.starts_with(".github/workflows/")
        || lower.starts_with(".circleci/")
        || lower.starts_with(".ci/")
        || matches!(
            name,
            ".gitlab-ci.yml"
                | "jenkinsfile"
                | "azure-pipelines.yml"
                | ".travis.yml"
                | "pytest.ini"
                | "tox.ini"
                | "conftest.py"
                | "nextest.toml"
                | "jest.config.js"
                | "jest.config.ts"
                | "vitest.config.ts"
                | "vitest.config.js"
                | ".mocharc.json"
                | ".mocharc.yml"
        )
}

/// What marks a test skipped, ignored or expected to fail, in the common frameworks.
const MARKERS: &[&str] = &[
    "#[ignore",
    "@pytest.mark.skip",
    "@pytest.mark.xfail",
    "@unittest.skip",
    "@unittest.expectedFailure",
    "pytest.skip(",
    "it.skip(",
    "test.skip(",
    "describe.skip(",
    "xit(",
    "xdescribe(",
    "xtest(",
    "t.Skip(",
    "t.SkipNow(",
    "@Disabled",
    "@Ignore",
    "skip(",
];

/// Whether LINE marks a test skipped, ignored or expected to fail.
fn is_skip_marker(line: &str) -> bool {
    let t = line.trim();
    // `skip(` alone only as a call at the start of a line (Ruby, Jest's `test.skip` aside).
    MARKERS.iter().any(|m| {
        if *m == "skip(" {
            t.starts_with("skip(") || t.starts_with("skip ")
        } else {
            t.contains(m)
        }
    })
}

/// Whether LINE asserts something, in the common test frameworks.
fn is_assertion(line: &str) -> bool {
    let t = line.trim();
    t.starts_with("assert")
        || t.contains("assert!(")
        || t.contains("assert_eq!(")
        || t.contains("assert_ne!(")
        || t.contains("self.assert")
        || t.contains("expect(")
        || t.contains(".should")
        || t.contains("t.Error")
        || t.contains("t.Fatal")
        || t.contains("require.")
        || t.contains("Assert.")
}

/// The name of the test LINE defines, when it defines one.
fn test_name(line: &str) -> Option<String> {
    let t = line.trim();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    if let Some(rest) = t.strip_prefix("def test") {
        return Some(format!("test{}", ident(rest)));
    }
    if let Some(rest) = t.strip_prefix("func Test") {
        return Some(format!("Test{}", ident(rest)));
    }
    for call in ["it(", "test(", "it.only(", "test.only("] {
        if let Some(rest) = t.strip_prefix(call) {
            let quoted = rest.trim_start_matches(['"', '\'', '`']);
            return Some(
                quoted
                    .split(['"', '\'', '`'])
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
            );
        }
    }
    None
}

/// Whether the file's lines around these changes are Rust tests: a `#[test]` among them.
fn rust_test_fns(lines: &[(usize, String)]) -> usize {
    lines
        .iter()
        .filter(|(_, l)| {
            let t = l.trim();
            t.starts_with("#[test]") || t.starts_with("#[tokio::test")
        })
        .count()
}

/// The first line (from 1) of a Rust source's test module, `#[cfg(test)]`, in TEXT.
fn rust_tests_from(text: &str) -> Option<usize> {
    text.lines()
        .position(|l| l.trim_start().starts_with("#[cfg(test)]"))
        .map(|i| i + 1)
}

/// Judges PATCH, the diff of an agent's work (`git diff -U0 --find-renames BASE...HEAD`);
/// OLD gives a file's text where the work began (Rust sources keep their unit tests below
/// `#[cfg(test)]`: what is removed there is a test's).
pub(crate) fn judge(patch: &str, old: &dyn Fn(&str) -> Option<String>) -> Verdict {
    let mut verdict = Verdict::default();
    for mut file in files(patch) {
        let mut test_file = is_test_path(&file.old) || is_test_path(&file.new);
        let rust = std::path::Path::new(&file.old)
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("rs"));
        if !test_file && rust {
            // Only what is removed from the test module counts as a test's.
            if let Some(from) = old(&file.old).as_deref().and_then(rust_tests_from) {
                file.removed.retain(|(n, _)| *n >= from);
                test_file = !file.removed.is_empty();
            } else {
                file.removed.clear();
            }
        }
        let shown = file.new.clone();
        if file.deleted && test_file {
            verdict.push(Level::Fail, "a test file deleted", &file.old);
            continue;
        }
        if file.renamed && test_file && file.old != file.new {
            verdict.push(
                Level::Warn,
                format!("a test file renamed from `{}`", file.old),
                &shown,
            );
        }
        if is_expected_output(&file.new) && !file.removed.is_empty() {
            let at = file.removed.first().map_or(0, |(n, _)| *n);
            verdict.push(
                Level::Fail,
                "expected output rewritten",
                format!("{}:{at}", file.old),
            );
        }
        if is_ci_or_runner(&file.new) || is_ci_or_runner(&file.old) {
            verdict.push(
                Level::Fail,
                "CI or test runner configuration changed",
                &shown,
            );
        }
        for (n, line) in &file.added {
            if is_skip_marker(line) {
                verdict.push(
                    Level::Fail,
                    format!("a skip marker added: `{}`", line.trim()),
                    format!("{shown}:{n}"),
                );
            }
        }
        let removed_tests: Vec<String> = file
            .removed
            .iter()
            .filter_map(|(_, l)| test_name(l))
            .collect();
        let added_tests: Vec<String> = file
            .added
            .iter()
            .filter_map(|(_, l)| test_name(l))
            .collect();
        let rust_removed = rust_test_fns(&file.removed);
        let rust_added = rust_test_fns(&file.added);
        let lost = removed_tests.len() + rust_removed;
        let gained = added_tests.len() + rust_added;
        if lost > gained {
            let at = file.removed.first().map_or(0, |(n, _)| *n);
            verdict.push(
                Level::Fail,
                format!("{} test(s) removed", lost - gained),
                format!("{}:{at}", file.old),
            );
        } else if lost > 0 {
            verdict.push(
                Level::Warn,
                format!("{lost} test(s) renamed or rewritten"),
                &shown,
            );
        }
        let testing = test_file || rust_removed + rust_added > 0 || lost + gained > 0;
        if testing {
            let removed: Vec<&(usize, String)> = file
                .removed
                .iter()
                .filter(|(_, l)| is_assertion(l))
                .collect();
            let added = file.added.iter().filter(|(_, l)| is_assertion(l)).count();
            if removed.len() > added {
                let at = removed.first().map_or(0, |(n, _)| *n);
                verdict.push(
                    Level::Fail,
                    format!("{} assertion(s) removed", removed.len() - added),
                    format!("{}:{at}", file.old),
                );
            }
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diff(path: &str, removed: &[&str], added: &[&str]) -> String {
        let mut text = format!(
            "diff --git a/{path} b/{path}\nindex 1..2 100644\n--- a/{path}\n+++ b/{path}\n@@ -3,{} +3,{} @@\n",
            removed.len(),
            added.len()
        );
        for l in removed {
            let _ = writeln!(text, "-{l}");
        }
        for l in added {
            let _ = writeln!(text, "+{l}");
        }
        text
    }

    /// A Rust source whose test module starts on line 2.
    const OLD_TEXT: &str = "use x;\n#[cfg(test)]\nmod tests {\n";

    fn old_text(_: &str) -> Option<String> {
        Some(OLD_TEXT.to_owned()).filter(|t| !t.is_empty())
    }

    fn levels(patch: &str) -> (Level, String) {
        let v = judge(patch, &old_text);
        (v.level(), v.text())
    }

    #[test]
    fn gaming_changes_fail() {
        let deleted = "diff --git a/tests/smoke.rs b/tests/smoke.rs\ndeleted file mode 100644\n--- a/tests/smoke.rs\n+++ /dev/null\n@@ -1,3 +0,0 @@\n-#[test]\n-fn it_works() {}\n-\n";
        for (name, patch) in [
            ("deleted test file", deleted.to_owned()),
            ("ignore added", diff("src/lib.rs", &[], &["    #[ignore]"])),
            (
                "pytest skip",
                diff(
                    "tests/test_api.py",
                    &[],
                    &["@pytest.mark.skip(reason='flaky')"],
                ),
            ),
            (
                "jest skip",
                diff(
                    "src/app.test.js",
                    &["it('adds', () => {"],
                    &["it.skip('adds', () => {"],
                ),
            ),
            (
                "go skip",
                diff("pkg/a_test.go", &[], &["\tt.Skip(\"later\")"]),
            ),
            (
                "assert removed",
                diff("tests/test_api.py", &["    assert total == 3"], &[]),
            ),
            (
                "rust assert removed",
                diff("src/lib.rs", &["        assert_eq!(add(1, 2), 3);"], &[]),
            ),
            (
                "test fn removed",
                diff("src/lib.rs", &["    #[test]", "    fn adds() {}"], &[]),
            ),
            (
                "snapshot rewritten",
                diff("tests/snapshots/out.snap", &["old"], &["new"]),
            ),
            (
                "runner edited",
                diff(
                    ".github/workflows/ci.yml",
                    &["run: cargo test"],
                    &["run: true"],
                ),
            ),
        ] {
            let (level, text) = levels(&patch);
            assert_eq!(level, Level::Fail, "{name}: {text}");
        }
    }

    #[test]
    fn honest_changes_pass_or_warn_with_a_reason() {
        // A test added.
        let added = diff(
            "tests/test_api.py",
            &[],
            &["def test_total():", "    assert total() == 3"],
        );
        assert_eq!(levels(&added).0, Level::Pass);
        // A function and its test renamed together.
        let renamed = diff(
            "src/lib.rs",
            &[
                "pub fn add(a: i32) -> i32 {",
                "    #[test]",
                "    fn add_works() {",
                "        assert_eq!(add(1), 2);",
            ],
            &[
                "pub fn plus(a: i32) -> i32 {",
                "    #[test]",
                "    fn plus_works() {",
                "        assert_eq!(plus(1), 2);",
            ],
        );
        let (level, text) = levels(&renamed);
        assert_eq!(level, Level::Warn, "{text}");
        assert!(text.contains("renamed or rewritten"), "{text}");
        // A test's data edited.
        let data = diff("tests/data/input.json", &["{\"n\": 1}"], &["{\"n\": 2}"]);
        assert_eq!(levels(&data).0, Level::Pass);
        // Code that is not a test, with a `debug_assert!` removed.
        let code = diff(
            "src/lib.rs",
            &["    debug_assert!(x > 0);"],
            &["    let y = x;"],
        );
        let no_tests = |_: &str| Some("fn f(x: i32) {\n".to_owned());
        assert_eq!(judge(&code, &no_tests).level(), Level::Pass);
        // An assertion changed, not removed.
        let changed = diff(
            "tests/test_api.py",
            &["    assert total == 3"],
            &["    assert total == 4"],
        );
        assert_eq!(levels(&changed).0, Level::Pass);
    }

    #[test]
    fn a_malformed_diff_is_read_without_panicking() {
        for patch in [
            "diff --git a/t.py b/t.py\n@@ é +ü @@\n+@pytest.mark.skip\n",
            "@@ -1 +1 @@\n-assert x\n",
            "diff --git \n+++\n---\n@@\n",
        ] {
            let _ = judge(patch, &old_text);
        }
        // What can be read of it still counts: the skip marker of the first.
        let first = "diff --git a/t.py b/t.py\n@@ é +ü @@\n+@pytest.mark.skip\n";
        assert_eq!(judge(first, &old_text).level(), Level::Fail);
    }

    #[test]
    fn places_name_the_file_and_line() {
        let patch = diff("tests/test_api.py", &[], &["@pytest.mark.skip"]);
        let v = judge(&patch, &old_text);
        assert_eq!(v.findings[0].place, "tests/test_api.py:3");
        assert!(v.text().starts_with("fail: a skip marker added"));
    }
}
