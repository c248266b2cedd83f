#!/usr/bin/env bash
# How `prodigy check` scales, side by side in one run:
#  1. generated standard workflows of 1,000, 10,000 and 20,000 steps (`--no-shellcheck
#     --format json`): median time of RUNS runs and peak memory (`/usr/bin/time -f %M`),
#     each as a ratio to the 1,000-step file (linear is 10x and 20x);
#  2. ShellCheck on a directory of workflows (DIR, default the repository's `workflows/`)
#     and on the 1,000-step file: without ShellCheck, with a cold cache (an empty
#     XDG_CACHE_HOME each run) and with a warm one (the findings of the run before).
#
# Usage: bash bench/check-scale.sh [DIR]
#   PRODIGY_BIN=/path/to/prodigy RUNS=3 bash bench/check-scale.sh
# Only the ratios mean anything: the machine may be shared.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" check-scale
RUNS="${RUNS:-3}"
DIR="${1:-$ROOT/workflows}"
[[ -x /usr/bin/time ]] || { echo "check-scale: needs GNU time at /usr/bin/time" >&2; exit 1; }

# measure LABEL CMD...: median seconds and the largest peak KB over RUNS runs.
measure() {
    local label="$1" r
    shift
    : >"$TMP/secs" && : >"$TMP/kb"
    for ((r = 0; r < RUNS; r++)); do
        [[ -n "${BEFORE_EACH:-}" ]] && "$BEFORE_EACH"
        /usr/bin/time -o "$TMP/t" -f '%e %M' "$@" >/dev/null 2>&1 || true
        # GNU time puts "Command exited with non-zero status N" first (a file with errors).
        read -r s kb < <(tail -n 1 "$TMP/t")
        echo "$s" >>"$TMP/secs"
        echo "$kb" >>"$TMP/kb"
    done
    printf '%s\t%s\t%s\n' "$label" "$(median <"$TMP/secs")" "$(sort -n "$TMP/kb" | tail -1)"
}

echo "prodigy: $BIN ($RUNS runs each, median time, largest peak memory)"
echo
echo "== check --no-shellcheck --format json, generated workflows =="
: >"$TMP/scale.tsv"
for n in 1000 10000 20000; do
    python3 "$BENCH_DIR/gen_workflow.py" "$n" >"$TMP/w-$n.yml"
    measure "$n" "$BIN" check --no-shellcheck --format json "$TMP/w-$n.yml" >>"$TMP/scale.tsv"
done
awk -F'\t' '
    NR == 1 { t0 = $2; m0 = $3 }
    { printf "%6s steps  %7.2f s (%5.1fx)  %8.1f MB (%5.1fx)\n", $1, $2, (t0 > 0 ? $2 / t0 : 0), $3 / 1024, $3 / m0 }
' "$TMP/scale.tsv"

echo
if ! command -v shellcheck >/dev/null 2>&1; then
    echo "== ShellCheck: skipped (shellcheck is not on PATH) =="
    exit 0
fi
echo "== ShellCheck ($(shellcheck --version | awk '/^version/ {print $2}'), $(nproc) CPUs) =="
export XDG_CACHE_HOME="$TMP/cache"
cold() { rm -rf -- "$XDG_CACHE_HOME"; }
for target in "$DIR" "$TMP/w-1000.yml"; do
    name="$(basename "$target")"
    : >"$TMP/sc.tsv"
    measure "none" "$BIN" check --no-shellcheck --format json "$target" >>"$TMP/sc.tsv"
    BEFORE_EACH=cold measure "cold" "$BIN" check --format json "$target" >>"$TMP/sc.tsv"
    cold
    "$BIN" check --format json "$target" >/dev/null 2>&1 || true
    measure "warm" "$BIN" check --format json "$target" >>"$TMP/sc.tsv"
    echo "$name:"
    awk -F'\t' '
        NR == 1 { t0 = $2 }
        { printf "  %-5s %7.2f s (%6.1fx no ShellCheck)\n", $1, $2, (t0 > 0 ? $2 / t0 : 0) }
    ' "$TMP/sc.tsv"
done
