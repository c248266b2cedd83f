//! The runtime returns typed errors (CONTRIBUTING.md, "Typed errors"): no function under
//! `runtime/src` returns `Result<_, String>`, and no alias hides one; each failure is an enum
//! variant with its data (`thiserror` + `miette::Diagnostic`), worded by its `Display`.

mod scan;

use std::path::Path;

/// The generic arguments of every `Result<…>` in TEXT (any spacing, over lines), as written.
fn result_arguments(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("Result") {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = text[at + "Result".len()..].trim_start();
        let Some(inner) = rest.strip_prefix('<') else {
            continue;
        };
        let mut depth = 1usize;
        let mut end = None;
        let mut previous = ' ';
        for (i, c) in inner.char_indices() {
            match c {
                '<' => depth += 1,
                // `->` inside the arguments (`Result<fn() -> T, E>`) closes nothing.
                '>' if previous != '-' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(i);
                        break;
                    }
                }
                _ => {}
            }
            previous = c;
        }
        if let Some(end) = end {
            let line = text[..at].lines().count().max(1);
            out.push((line, inner[..end].to_owned()));
        }
    }
    out
}

/// The top-level arguments of ARGS (`T, E`), trimmed.
fn split_top(args: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut depth = 0i32;
    let mut previous = ' ';
    for c in args.chars() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' if previous == '-' => {}
            '>' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(String::new());
                previous = c;
                continue;
            }
            _ => {}
        }
        previous = c;
        if let Some(last) = parts.last_mut() {
            last.push(c);
        }
    }
    parts
        .into_iter()
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|p| !p.is_empty())
        .collect()
}

/// The lines of TEXT with a `Result` whose error is a `String`, with their 1-based numbers.
fn offending(text: &str) -> Vec<(usize, String)> {
    result_arguments(text)
        .into_iter()
        .filter(|(_, args)| {
            split_top(args).get(1).is_some_and(|error| {
                matches!(
                    error.as_str(),
                    "String" | "std::string::String" | "alloc::string::String"
                )
            })
        })
        .map(|(line, args)| (line, format!("Result<{args}>")))
        .collect()
}

#[test]
fn the_runtime_returns_no_string_errors() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = scan::rust_files(&src);
    files.sort();
    assert!(files.len() > 10, "found the runtime's sources: {files:?}");
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, what) in offending(&text) {
            found.push(format!("{}:{n}: {what}", file.display()));
        }
    }
    assert!(
        found.is_empty(),
        "the runtime returns typed errors: give the failure an enum (`thiserror` + \
         `miette::Diagnostic`) whose variants carry its data (CONTRIBUTING.md, \"Typed errors\"):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_finds_every_string_error() {
    let bad = [
        "fn f() -> Result<(), String> {",
        "fn f() -> Result<Vec<Value>,String> {",
        "fn f() -> Result<\n    Result<Merged, WorktreeError>,\n    String,\n> {",
        "type Fallible<T> = Result<T, String>;",
        "type Fallible<T> = std::result::Result<T, std::string::String>;",
        "fn f() -> Option<Result<Summary, String>> {",
        "fn f() -> Result<Box<dyn Fn() -> u8>, String> {",
        "let r: Result < u8 , String > = Ok(1);",
    ];
    for text in bad {
        assert_eq!(offending(text).len(), 1, "{text}");
    }
    let good = [
        "fn f() -> Result<String, Error> {",
        "fn f() -> Result<(), StoreError> {",
        "fn f() -> Result<Vec<String>, LockError> {",
        "fn f() -> io::Result<String> {",
        "fn f() -> ParseResult<u8, Strings> {",
        "fn f() -> Result<HashMap<String, String>, E> {",
    ];
    for text in good {
        assert!(offending(text).is_empty(), "{text}");
    }
}
