//! ARCHITECTURE.md stays readable and true to the tree: short lines a reader can scan, at
//! most 400 of them, every source file it names exists (names move with renames; a stale
//! path is a lie), the lints it names are the workspace's at the levels it says, and its list
//! of test binaries is the list cargo builds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest line ARCHITECTURE.md may have, in characters.
const WIDTH: usize = 100;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// ARCHITECTURE.md's text (empty when it cannot be read, which the tests notice).
fn architecture() -> String {
    std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap_or_default()
}

#[test]
fn architecture_md_has_short_lines() {
    let text = architecture();
    assert!(text.lines().count() > 100, "ARCHITECTURE.md was not read");
    let long: Vec<String> = text
        .lines()
        .enumerate()
        .filter(|(_, line)| line.chars().count() > WIDTH)
        .map(|(n, line)| {
            format!(
                "ARCHITECTURE.md:{}: {} characters",
                n + 1,
                line.chars().count()
            )
        })
        .collect();
    assert!(
        long.is_empty(),
        "lines longer than {WIDTH} characters:\n{}",
        long.join("\n")
    );
}

/// The source files ARCHITECTURE.md names by a path from the repository's root, e.g.
/// `runtime/src/layout.rs`.
fn named_files(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for word in text.split(|c: char| c.is_whitespace() || matches!(c, '`' | '(' | ')' | ',' | ';'))
    {
        let word = word.trim_end_matches(['.', ':']);
        let rooted = ["runtime/", "compiler/", "grammar/", "src/", "tests/"]
            .iter()
            .any(|p| word.starts_with(p));
        let rust = Path::new(word).extension().is_some_and(|e| e == "rs");
        if rooted && rust && !word.contains('*') {
            out.push(word.to_owned());
        }
    }
    out
}

#[test]
fn the_source_files_architecture_md_names_exist() {
    let named = named_files(&architecture());
    assert!(
        named.iter().any(|f| f == "runtime/src/layout.rs"),
        "found no rooted path: {named:?}"
    );
    let missing: Vec<&String> = named.iter().filter(|f| !root().join(f).is_file()).collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names missing files: {missing:?}"
    );
}

/// The most lines ARCHITECTURE.md may have: the layers, the invariants with what enforces
/// each, the lints and the state diagrams fit; the rest goes to dated notes in `docs/design/`.
const MAX_LINES: usize = 400;

/// Protects the length: ARCHITECTURE.md once grew to 1,135 lines that repeated themselves and
/// went stale. Fails as soon as it passes [`MAX_LINES`].
#[test]
fn architecture_md_has_at_most_400_lines() {
    let text = architecture();
    let lines = text.lines().count();
    assert!(lines > 0, "ARCHITECTURE.md was not read");
    assert!(
        lines <= MAX_LINES,
        "ARCHITECTURE.md has {lines} lines, more than {MAX_LINES}: move detail into a dated \
         note under docs/design/"
    );
}

/// A file of the repository's root as text (empty when it cannot be read, which the tests
/// notice).
fn root_file(name: &str) -> String {
    std::fs::read_to_string(root().join(name)).unwrap_or_default()
}

/// The lines of the section of TEXT under the heading `## TITLE`, up to the next `## `.
fn section<'a>(text: &'a str, title: &str) -> Vec<&'a str> {
    let heading = format!("## {title}");
    text.lines()
        .skip_while(|line| line.trim_end() != heading)
        .skip(1)
        .take_while(|line| !line.starts_with("## "))
        .collect()
}

/// The words in backticks in TEXT, in order.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The lint levels a `[workspace.lints]` table can give.
const LEVELS: [&str; 4] = ["forbid", "deny", "warn", "allow"];

/// The lints of MANIFEST's `[workspace.lints.rust]` and `[workspace.lints.clippy]` tables
/// with their levels, clippy's named `clippy::NAME`; read as plain lines (`name = "warn"` or
/// `name = { level = "warn", … }`).
fn workspace_lints(manifest: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut prefix = None;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            prefix = match line {
                "[workspace.lints.rust]" => Some(""),
                "[workspace.lints.clippy]" => Some("clippy::"),
                _ => None,
            };
            continue;
        }
        let Some(prefix) = prefix else { continue };
        if line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        let level = match value.strip_prefix('{') {
            Some(inline) => inline
                .split_once("level")
                .and_then(|(_, rest)| rest.split('"').nth(1))
                .unwrap_or_default(),
            None => value.split('"').nth(1).unwrap_or_default(),
        };
        out.insert(format!("{prefix}{}", name.trim()), level.to_owned());
    }
    out
}

/// What ARCHITECTURE.md's "Lints" section claims: each list item reads
/// ``- LEVEL `lint`, `clippy::lint`: why``, continued on indented lines; the lints are the
/// words in backticks before the first `:` outside backticks. An item that does not read so
/// is returned as a problem, so that a claim is never skipped unread.
fn claimed_lints(text: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut items: Vec<String> = Vec::new();
    for line in section(text, "Lints") {
        if let Some(item) = line.strip_prefix("- ") {
            items.push(item.to_owned());
        } else if line.starts_with("  ")
            && let Some(item) = items.last_mut()
        {
            item.push(' ');
            item.push_str(line.trim());
        }
    }
    let mut claims = Vec::new();
    let mut problems = Vec::new();
    for item in &items {
        let (level, rest) = item.split_once(' ').unwrap_or_default();
        let mut inside = false;
        let head_end = rest.char_indices().find_map(|(at, c)| {
            if c == '`' {
                inside = !inside;
            }
            (c == ':' && !inside).then_some(at)
        });
        let names = head_end
            .map(|end| backticked(&rest[..end]))
            .unwrap_or_default();
        if !LEVELS.contains(&level) || names.is_empty() {
            problems.push(format!(
                "a lint item that does not read `- LEVEL `lint`: why`: {item}"
            ));
            continue;
        }
        claims.extend(names.iter().map(|n| ((*n).to_owned(), level.to_owned())));
    }
    (claims, problems)
}

/// What is untrue in TEXT's claims about lints, given MANIFEST: a lint of the "Lints"
/// section at another level than the manifest gives it, or not there at all; and a
/// `clippy::NAME` in backticks anywhere else that the workspace does not turn on.
fn untrue_lint_claims(text: &str, manifest: &str) -> Vec<String> {
    let lints = workspace_lints(manifest);
    let (claims, mut problems) = claimed_lints(text);
    let claimed: BTreeSet<&str> = claims.iter().map(|(name, _)| name.as_str()).collect();
    for (name, level) in &claims {
        match lints.get(name) {
            Some(set) if set == level => {}
            Some(set) => problems.push(format!(
                "`{name}` is claimed {level}, Cargo.toml says {set}"
            )),
            None => problems.push(format!(
                "`{name}` is claimed {level}, not in [workspace.lints]"
            )),
        }
    }
    for word in backticked(text) {
        if word.starts_with("clippy::")
            && !claimed.contains(word)
            && lints.get(word).is_none_or(|level| level == "allow")
        {
            problems.push(format!(
                "`{word}` is named but not on in [workspace.lints.clippy]"
            ));
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

/// Protects the claims about lints: every lint ARCHITECTURE.md's "Lints" section names is in
/// the root `Cargo.toml`'s `[workspace.lints]` at the level it says, and every `clippy::NAME`
/// it cites (an invariant's enforcer) is turned on there. Fails when a lint is dropped from
/// `Cargo.toml`, changes level, or is cited without being set.
#[test]
fn the_lints_architecture_md_names_are_the_workspace_lints() {
    let text = architecture();
    let manifest = root_file("Cargo.toml");
    assert!(
        workspace_lints(&manifest).len() > 5,
        "read no [workspace.lints] from the root Cargo.toml"
    );
    let (claims, _) = claimed_lints(&text);
    assert!(
        claims.len() > 5,
        "read no lints from ARCHITECTURE.md's \"Lints\": {claims:?}"
    );
    let problems = untrue_lint_claims(&text, &manifest);
    assert!(
        problems.is_empty(),
        "ARCHITECTURE.md's lints:\n{}",
        problems.join("\n")
    );
}

/// The lint check is not vacuous: a made-up lint, a wrong level, an item it cannot read and
/// a cited clippy lint that is off are each reported.
#[test]
fn the_lint_check_reports_what_is_untrue() {
    let manifest = "[workspace.lints.rust]\nmissing_docs = \"warn\"\n\n\
                    [workspace.lints.clippy]\n# a comment\n\
                    pedantic = { level = \"warn\", priority = -1 }\n\
                    must_use_candidate = \"allow\"\n\n[package]\nname = \"x\"\n";
    let lints = workspace_lints(manifest);
    assert_eq!(lints.get("missing_docs").map(String::as_str), Some("warn"));
    assert_eq!(
        lints.get("clippy::pedantic").map(String::as_str),
        Some("warn")
    );
    assert_eq!(lints.len(), 3, "{lints:?}");
    let true_text = "## Lints\n\n- warn `missing_docs`, `clippy::pedantic`: why, with\n  \
                     `a::b`: no lint.\n\n## Next\n";
    assert_eq!(
        untrue_lint_claims(true_text, manifest),
        Vec::<String>::new()
    );
    let text = "## Lints\n\n- deny `missing_docs`: wrong level.\n\
                - warn `clippy::no_such_lint`: made up.\n- `clippy::pedantic` with no level\n\n\
                ## Next\n\nSee `clippy::must_use_candidate`.\n";
    let problems = untrue_lint_claims(text, manifest);
    assert_eq!(problems.len(), 4, "{problems:#?}");
}

/// The names of MANIFEST's `[[test]]` targets.
fn test_targets(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[[test]]";
        } else if inside
            && let Some((key, value)) = line.split_once('=')
            && key.trim() == "name"
        {
            out.push(value.trim().trim_matches('"').to_owned());
        }
    }
    out
}

/// The test binaries cargo finds on its own: the directories `tests/NAME` with a `main.rs`.
fn test_directories() -> BTreeSet<String> {
    std::fs::read_dir(root().join("tests"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.path().join("main.rs").is_file())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The test binaries TEXT lists: the words in backticks after `Test binaries:`, up to the
/// end of that sentence.
fn listed_test_binaries(text: &str) -> Vec<&str> {
    text.split_once("Test binaries:")
        .map(|(_, rest)| backticked(rest.split_once('.').map_or(rest, |(list, _)| list)))
        .unwrap_or_default()
}

/// What is wrong with TEXT's list of test binaries, given the `[[test]]` TARGETS and the
/// test DIRECTORIES: a listed binary that is neither, and a binary that is not listed.
fn wrong_test_binaries(
    text: &str,
    targets: &[String],
    directories: &BTreeSet<String>,
) -> Vec<String> {
    let listed = listed_test_binaries(text);
    let mut problems: Vec<String> = listed
        .iter()
        .filter(|name| !targets.iter().any(|t| t == *name) && !directories.contains(**name))
        .map(|name| format!("`{name}` is listed, but is no [[test]] and no tests/{name}/main.rs"))
        .collect();
    let actual: BTreeSet<&str> = targets
        .iter()
        .map(String::as_str)
        .chain(directories.iter().map(String::as_str))
        .collect();
    problems.extend(
        actual
            .into_iter()
            .filter(|name| !listed.contains(name))
            .map(|name| format!("the test binary `{name}` is not listed")),
    );
    problems
}

/// Protects the list of test binaries: every one ARCHITECTURE.md lists after "Test
/// binaries:" is a `[[test]]` of the root `Cargo.toml` or a `tests/NAME/main.rs`, and every
/// one of those is listed. Fails when a binary is added, renamed or removed without the list
/// (it once named six of thirteen).
#[test]
fn the_test_binaries_architecture_md_lists_are_the_test_binaries() {
    let text = architecture();
    let targets = test_targets(&root_file("Cargo.toml"));
    let directories = test_directories();
    assert!(
        targets.len() > 5,
        "read no [[test]] from the root Cargo.toml"
    );
    assert!(directories.len() > 5, "found no tests/*/main.rs");
    assert!(
        listed_test_binaries(&text).len() > 5,
        "found no list after \"Test binaries:\" in ARCHITECTURE.md"
    );
    let problems = wrong_test_binaries(&text, &targets, &directories);
    assert!(
        problems.is_empty(),
        "ARCHITECTURE.md's test binaries:\n{}",
        problems.join("\n")
    );
}

/// The test-binary check is not vacuous: a listed binary that does not exist and one that
/// exists but is not listed are each reported.
#[test]
fn the_test_binary_check_reports_what_is_wrong() {
    let manifest = "[[bin]]\nname = \"prodigy\"\n\n[[test]]\nname = \"cli\"\npath = \"x\"\n";
    let targets = test_targets(manifest);
    assert_eq!(targets, ["cli"]);
    let directories = BTreeSet::from(["cli".to_owned(), "noshare".to_owned()]);
    let text = "Test binaries: `cli`, `gone`. Other `words`.";
    assert_eq!(listed_test_binaries(text), ["cli", "gone"]);
    let problems = wrong_test_binaries(text, &targets, &directories);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(
        problems.iter().any(|p| p.contains("`gone`")),
        "{problems:#?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("`noshare`")),
        "{problems:#?}"
    );
}
