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
