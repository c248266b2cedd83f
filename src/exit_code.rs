//! Process exit codes, as documented in the README and `--help` (one table, [`TABLE`]).

/// Everything passed.
pub(crate) const OK: u8 = 0;
/// `check` found errors (or warnings under `--deny warnings`); a workflow failed, a job
/// stopped, or none of a job's agents started; `events --strict` skipped damaged lines.
pub(crate) const PROBLEMS: u8 = 1;
/// Bad usage, or a file that could not be read.
pub(crate) const USAGE: u8 = 2;
/// Under `--strict`, a job that completed with items in the dead letter queue.
pub(crate) const DLQ_STRICT: u8 = 3;
/// A run or job stopped at its Claude budget (`max_cost_usd`, `--max-cost-usd`).
pub(crate) const BUDGET: u8 = 4;
/// Stopped for the Claude account's usage limit, resumable after its reset (`claude:
/// {usage_limit: stop}`, or a reset later than `max_wait`): `EX_TEMPFAIL`.
pub(crate) const CLAUDE_LIMIT: u8 = 75;
/// Interrupted by SIGINT (Ctrl-C): 128 + 2.
pub(crate) const SIGINT: u8 = 130;
/// Interrupted by SIGTERM: 128 + 15.
pub(crate) const SIGTERM: u8 = 143;

/// Every exit status with its meaning, for `--help` and the README.
pub(crate) const TABLE: &[(u8, &str)] = &[
    (OK, "success: no errors; the workflow or job completed"),
    (
        PROBLEMS,
        "check found errors (warnings too under --deny warnings); a workflow failed, a job stopped, or none of its agents started; events --strict skipped damaged lines",
    ),
    (USAGE, "bad usage, or a file that cannot be read"),
    (
        DLQ_STRICT,
        "with --strict, a job completed with items in the dead letter queue",
    ),
    (
        BUDGET,
        "a run or job stopped at its Claude budget; resume it with a larger --max-cost-usd",
    ),
    (
        CLAUDE_LIMIT,
        "stopped at the Claude usage limit; the last line says when and how to resume",
    ),
    (
        SIGINT,
        "interrupted by SIGINT (Ctrl-C); the last line says how to resume",
    ),
    (
        SIGTERM,
        "interrupted by SIGTERM; the last line says how to resume",
    ),
];

/// The table as `--help` shows it.
pub(crate) fn help() -> String {
    use std::fmt::Write as _;
    let mut text = String::from("Exit status:\n");
    for (code, meaning) in TABLE {
        let _ = writeln!(text, "  {code:>3}  {meaning}");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's table is this table.
    #[test]
    fn the_readme_documents_every_exit_status() {
        let readme = include_str!("../README.md");
        for (code, meaning) in TABLE {
            let row = format!("| {code} | {meaning} |");
            assert!(readme.contains(&row), "README lacks the row `{row}`");
        }
    }
}
