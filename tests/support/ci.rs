//! Whether the tests run under CI, where nothing they need may be skipped: `CI` set to
//! anything but empty, `false` or `0` (`.ci/run` sets `CI=true`). The one rule for every
//! test binary; the progress display of `prodigy` itself follows the same one.
//!
//! Included with `#[path = ".../tests/support/ci.rs"]` (by `external.rs` for the test
//! binaries that use it, directly elsewhere).

#![allow(dead_code, reason = "each test binary uses part of this module")]

use std::ffi::OsStr;

/// Whether a missing corpus, tool or service fails the test instead of skipping it.
pub(crate) fn required() -> bool {
    required_by(std::env::var_os("CI").as_deref())
}

/// The rule, for the value of `CI` (`None` when unset).
pub(crate) fn required_by(value: Option<&OsStr>) -> bool {
    value.is_some_and(|v| {
        let v = v.to_string_lossy();
        let v = v.trim();
        !(v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false"))
    })
}

#[cfg(test)]
mod tests {
    // Paths in full: a binary without the test harness compiles no `#[test]`, and its
    // imports would be unused.
    #[test]
    fn ci_is_required_when_set_to_anything_but_empty_false_or_zero() {
        use super::required_by;
        use std::ffi::OsStr;
        for on in ["true", "1", "yes", "github"] {
            assert!(required_by(Some(OsStr::new(on))), "CI={on}");
        }
        for off in ["", " ", "false", "FALSE", "0"] {
            assert!(!required_by(Some(OsStr::new(off))), "CI={off}");
        }
        assert!(!required_by(None));
    }
}
