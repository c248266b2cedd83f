# Shared by the benchmark scripts: `source "$(dirname "${BASH_SOURCE[0]}")/common.sh" NAME`.
# Sets BIN (PRODIGY_BIN, else a fresh `cargo build --release --locked`), TMP (removed on
# exit), and defines now_ns and median.

BENCH_NAME="${1:-bench}"
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"

if [[ -n "${PRODIGY_BIN:-}" ]]; then
    BIN="$PRODIGY_BIN"
else
    echo "building prodigy (cargo build --release --locked) ..."
    (cd "$ROOT" && cargo build --release --locked -q)
    BIN="$ROOT/target/release/prodigy"
fi
BIN="$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")"
[[ -x "$BIN" ]] || { echo "$BENCH_NAME: $BIN is not executable" >&2; exit 1; }

TMP="$(mktemp -d)"
trap 'rm -rf -- "$TMP"' EXIT

now_ns() { date +%s%N; }

median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

# Runs each timing function (each prints microseconds) once to warm up, then RUNS times,
# alternating so that all see the same machine state; prints their medians, in order.
alternate() {
    local f r out=()
    for f in "$@"; do
        "$f" >/dev/null
        : >"$TMP/alternate-$f.txt"
    done
    for ((r = 0; r < RUNS; r++)); do
        for f in "$@"; do "$f" >>"$TMP/alternate-$f.txt"; done
    done
    for f in "$@"; do out+=("$(median <"$TMP/alternate-$f.txt")"); done
    echo "${out[@]}"
}

# The spread of the timing function F's runs in the last `alternate`: "min-max" in ms.
spread() { sort -n "$TMP/alternate-$1.txt" | awk '{a[NR] = $1} END {printf "%.1f-%.1f", a[1] / 1000, a[NR] / 1000}'; }

# The machine's load averages (1, 5, 15 minutes): the benchmarks run on shared machines.
load() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?"; }

# Prints microseconds for one `prodigy run` of WORKFLOW (with the extra arguments) in
# $TMP/project with PRODIGY_HOME=$TMP/home; a failed run prints its errors and stops the
# benchmark.
time_run() {
    local workflow="$1" start end
    shift
    start=$(now_ns)
    (cd "$TMP/project" && PRODIGY_HOME="$TMP/home" "$BIN" run "$@" "$workflow" >/dev/null 2>"$TMP/err") ||
        { cat "$TMP/err" >&2; exit 1; }
    end=$(now_ns)
    echo $(((end - start) / 1000))
}
