//! What a test may need from outside the repository: the upstream corpus and optional tools.
//!
//! A fresh clone with nothing beside it must pass `cargo test --workspace --locked`, so a test
//! that needs one of these skips when it is missing, and says so on a line of its own (written
//! to the real standard error, which the test harness does not capture). CI must not skip:
//! `.ci/run` sets `PRODIGY_CORPUS` and `CI=true`, and then a missing corpus or tool fails
//! (the rule for `CI` is [`ci::required`]).
//!
//! Included by each test binary that needs it with `#[path = "../support/external.rs"]`.

#![allow(dead_code, reason = "each test binary uses part of this module")]

use std::io::Write as _;
use std::path::{Path, PathBuf};

#[path = "ci.rs"]
pub(crate) mod ci;

/// Says on the terminal, even under the test harness's capture, that `what` was skipped.
pub(crate) fn skip_line(what: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "skipped: {what}: {why}");
}

/// The corpus of real workflow files from the public Prodigy repository: `PRODIGY_CORPUS`,
/// else `../shared/corpus/prodigy` beside the repository.
///
/// `None` (after a skip line naming `test`) when `PRODIGY_CORPUS` is unset and the default
/// place holds nothing; a panic when `PRODIGY_CORPUS` names no directory, or under CI.
pub(crate) fn corpus_dir(test: &str) -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("PRODIGY_CORPUS") {
        let dir = PathBuf::from(dir);
        assert!(
            dir.is_dir(),
            "PRODIGY_CORPUS is set to {}, which is not a directory",
            dir.display()
        );
        return Some(dir);
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus/prodigy");
    if dir.is_dir() {
        return Some(dir);
    }
    assert!(
        !ci::required(),
        "the corpus is missing at {} and CI must not skip: set PRODIGY_CORPUS",
        dir.display()
    );
    skip_line(
        test,
        &format!(
            "corpus not found at {}, skipped; set PRODIGY_CORPUS",
            dir.display()
        ),
    );
    None
}

/// A file of the corpus, or `None` after a skip line (see [`corpus_dir`]).
pub(crate) fn corpus_file(test: &str, path: &str) -> Option<PathBuf> {
    corpus_dir(test).map(|dir| dir.join(path))
}

/// Whether `program` can be started (`program --version`); when it cannot, see
/// [`missing_tool`].
pub(crate) fn tool_available(test: &str, program: &str, package: &str) -> bool {
    let starts = std::process::Command::new(program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok();
    if !starts {
        missing_tool(test, program, package);
    }
    starts
}

/// `program` could not be started: outside CI the test named `test` skips what needs it, with
/// a line saying why; under CI ([`ci::required`]) this panics, since `.ci/run` installs every
/// tool the tests use.
pub(crate) fn missing_tool(test: &str, program: &str, package: &str) {
    assert!(
        !ci::required(),
        "`{program}` is missing in CI; .ci/run installs the Debian package `{package}`"
    );
    skip_line(
        test,
        &format!("`{program}` not found, skipped; install the Debian package `{package}`"),
    );
}
