//! Every path prodigy keeps is built in `runtime/src/layout.rs` (ARCHITECTURE.md, "On disk"):
//! no other source file spells a file name of a run's or job's state, or a directory under
//! `$PRODIGY_HOME`, outside its tests. A new file goes into the layout, whose test pins it.

mod scan;

use std::path::Path;

/// What only the layout may spell, as it appears in code.
const SPELLED: &[&str] = &[
    "\"checkpoint.json\"",
    "\"items.json\"",
    "\"results.jsonl\"",
    "\"merges.jsonl\"",
    "\"kept-worktrees.jsonl\"",
    "\"index.json\"",
    "\"lock\"",
    "\"prodigy-worktrees.lock\"",
    "\"prodigy-prepared\"",
    "\"prodigy-merge-",
    "join(\"state\")",
    "join(\"events\")",
    "join(\"dlq\")",
    "join(\"logs\")",
    "join(\"worktrees\")",
    "join(\"sessions\")",
    "join(\"mapreduce\")",
    "join(\"jobs\")",
];

/// The lines of TEXT before its tests that spell a path only the layout may.
fn spelled(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .take_while(|(_, line)| !line.starts_with("#[cfg(test)]"))
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .filter(|(_, line)| SPELLED.iter().any(|s| line.contains(s)))
        .map(|(n, line)| (n + 1, line.trim().to_owned()))
        .collect()
}

#[test]
fn only_the_layout_spells_where_state_lives() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let mut files = scan::rust_files(&root.join("runtime/src"));
    files.extend(scan::rust_files(&root.join("src")));
    assert!(files.len() > 50, "found only {} sources", files.len());
    let layout = root.join("runtime/src/layout.rs");
    let testing = root.join("runtime/src/testing");
    let mut found = Vec::new();
    for file in files {
        if file == layout || file.starts_with(&testing) || file.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in spelled(&text) {
            found.push(format!("{}:{n}: {line}", file.display()));
        }
    }
    assert!(
        found.is_empty(),
        "paths built outside runtime/src/layout.rs:\n{}",
        found.join("\n")
    );
}

#[test]
fn a_spelled_path_is_found_and_tests_and_comments_are_not() {
    let text = "fn a(d: &Path) -> PathBuf {\n    d.join(\"checkpoint.json\")\n}\n\
                // d.join(\"lock\")\n#[cfg(test)]\nmod tests { \"items.json\" }\n";
    assert_eq!(
        spelled(text),
        vec![(2, "d.join(\"checkpoint.json\")".to_owned())]
    );
}
