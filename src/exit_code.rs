//! Process exit codes, as documented in the README and `--help`.

/// Everything passed.
pub(crate) const OK: u8 = 0;
/// `check` found errors (or warnings under `--deny warnings`).
pub(crate) const PROBLEMS: u8 = 1;
/// Bad usage, or a file that could not be read.
pub(crate) const USAGE: u8 = 2;
