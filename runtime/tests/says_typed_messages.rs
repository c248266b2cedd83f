//! The runtime says typed messages (ARCHITECTURE.md, invariant 14): nothing under
//! `runtime/src` words a message as free text (`Message::warning(…)`, `Message::Text`, …);
//! each is a `Message` variant with its data, worded by the binary's reporter. A command's
//! own output is `Message::Output` / `Message::Result`.

mod scan;

use std::path::Path;

/// The names that build free text: the constructors `Message` had, its free-text variant
/// `Text` and the severity that only free text carried (all gone now: a message is a
/// variant with its data; a command's output is `Message::Output`).
const FREE_TEXT: [&str; 10] = [
    "Message::error",
    "Message::warning",
    "Message::info",
    "Message::note",
    "Message::internal",
    "Message::step_error",
    "Message::step_warning",
    "Message::step_info",
    "Message::Text",
    "Severity::",
];

/// Files that may name free text, under `runtime/src`: none.
const ALLOWED: [&str; 0] = [];

/// The lines of TEXT that build a free-text message, with their 1-based numbers.
fn offending(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let found = FREE_TEXT.iter().any(|name| {
            line.match_indices(name).any(|(at, _)| {
                // `Message::information` is another name; `Severity::` is a path prefix.
                name.ends_with("::")
                    || !line[at + name.len()..]
                        .starts_with(|c: char| c.is_alphanumeric() || c == '_')
            })
        });
        if found {
            out.push((n + 1, line.trim().to_owned()));
        }
    }
    out
}

#[test]
fn the_runtime_says_no_free_text() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = scan::rust_files(&src);
    files.retain(|f| !ALLOWED.iter().any(|allowed| f == &src.join(allowed)));
    files.sort();
    assert!(files.len() > 10, "found the runtime's sources: {files:?}");
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in offending(&text) {
            found.push(format!("{}:{n}: {line}", file.display()));
        }
    }
    assert!(
        found.is_empty(),
        "the runtime says typed messages: add a `Message` variant with its data and word it \
         in `src/report.rs` (ARCHITECTURE.md, invariant 14):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_finds_every_free_text_message() {
    let bad = [
        "self.say(Message::warning(format!(\"env file `{}` not loaded\", p)));",
        "runner.say(Message::error(why.clone()));",
        "self.say(crate::message::Message::internal(",
        "say = Some(Message::step_error(why));",
        "Message::Text { severity: Severity::Info, in_step: false, text }",
        "let f = Message::note;",
    ];
    for line in bad {
        assert_eq!(offending(line).len(), 1, "{line}");
    }
    let good = [
        "self.say(Message::Output(line));",
        "self.say(Message::EnvFileNotLoaded { path, why });",
        "Message::information()",
        "self.say(Message::Bug(Bug::RunnerReconfigured));",
    ];
    for line in good {
        assert!(offending(line).is_empty(), "{line}");
    }
}
