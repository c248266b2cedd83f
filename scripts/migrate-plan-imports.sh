#!/bin/sh
# The import rewrites of the plan crate split (issue 26, point 4): the runtime names the plan
# as `prodigy_plan`, not through `prodigy_compiler::plan`. Idempotent; re-run it after merging
# a branch that still names `prodigy_compiler::plan` under runtime/.
#
# The binary (src/) and the top-level tests (tests/) keep `prodigy_compiler::plan`, which
# re-exports the plan crate: they depend on the compiler anyway. The runtime's test support
# (`runtime/src/testing`, `#[cfg(test)]`) compiles YAML with the compiler, a dev-dependency,
# and keeps its other `prodigy_compiler::` paths.
#
# Run `cargo fmt --all` afterwards: shorter paths let rustfmt join a few lines.
#
# Not mechanical, done by hand once: `exec::write_file` reads YAML content with the plan's
# reader (`Plan::yaml`, passed in by `step/execute.rs`) instead of
# `prodigy_compiler::plan::support::yaml_to_json`; and `src/main.rs`, `src/check.rs`,
# `tests/workflows/main.rs` import `prodigy_compiler::source::LoadDiagnostic as _` for
# `LoadError::diagnostic()` (`LoadError` now lives in the plan crate).
set -eu
cd "$(dirname "$0")/.."
files=$(grep -rl 'prodigy_compiler::plan' runtime/src runtime/tests 2>/dev/null || true)
[ -n "$files" ] || exit 0
# shellcheck disable=SC2086
sed -i \
    -e 's/prodigy_compiler::plan::support::yaml_to_json/PRODIGY_COMPILER_YAML_TO_JSON/g' \
    -e 's/use prodigy_compiler::plan;/use prodigy_plan as plan;/g' \
    -e 's/prodigy_compiler::plan::{self,/prodigy_plan::{self as plan,/g' \
    -e 's/prodigy_compiler::plan::/prodigy_plan::/g' \
    -e 's/prodigy_compiler::plan\b/prodigy_plan/g' \
    -e 's/PRODIGY_COMPILER_YAML_TO_JSON/prodigy_compiler::plan::yaml_to_json/g' \
    $files
