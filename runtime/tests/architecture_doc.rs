//! ARCHITECTURE.md stays readable and true to the tree: short lines a reader can scan, and
//! every source file it names exists (names move with renames; a stale path is a lie).

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
