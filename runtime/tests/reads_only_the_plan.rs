//! The runtime reads only the plan (ARCHITECTURE.md, invariant 3): nothing under
//! `runtime/src` names a path of `prodigy_compiler` other than `prodigy_compiler::plan`.

use std::path::{Path, PathBuf};

/// The lines of TEXT that name the compiler other than through its `plan` module, with
/// their 1-based numbers.
fn offending(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("prodigy_compiler") {
            let after = &rest[at + "prodigy_compiler".len()..];
            // `prodigy_compiler::plan` and its items are fine; anything else (another
            // module, a `{...}` group, an alias with `as`) is not.
            let fine = after
                .strip_prefix("::plan")
                .is_some_and(|tail| !tail.starts_with(|c: char| c.is_alphanumeric() || c == '_'));
            if !fine {
                out.push((n + 1, line.trim().to_owned()));
                break;
            }
            rest = after;
        }
    }
    out
}

/// Every `.rs` file under DIR (what cannot be listed is left out; the test checks that it
/// found the sources).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_runtime_names_only_the_plan_of_the_compiler() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // `testing/` is test support (`#[cfg(test)]`): it compiles YAML into the plans the
    // fake-executor tests run, as the binary does; the runtime itself never sees it.
    let testing = src.join("testing");
    files.retain(|f| !f.starts_with(&testing));
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
        "the runtime reads only the plan; use or re-export what it needs from \
         `prodigy_compiler::plan` (ARCHITECTURE.md, invariant 3):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_finds_every_way_to_reach_past_the_plan() {
    let bad = [
        "use prodigy_compiler::ast::Template;",
        "use prodigy_compiler::{ast, plan};",
        "use prodigy_compiler as compiler;",
        "let f = prodigy_compiler::syntax::parse(&file);",
        "/// see [`prodigy_compiler::scope::exported_name`]",
        "use prodigy_compiler::planner::X;",
        "x(prodigy_compiler::plan::A, prodigy_compiler::source::Span::default())",
    ];
    for line in bad {
        assert_eq!(offending(line).len(), 1, "{line}");
    }
    let good = [
        "use prodigy_compiler::plan::{Plan, StepId};",
        "use prodigy_compiler::plan::support::read_regular;",
        "fn f(p: &prodigy_compiler::plan::Plan) {}",
        "use prodigy_compiler::plan;",
    ];
    for line in good {
        assert!(offending(line).is_empty(), "{line}");
    }
}
