#!/usr/bin/env bash
# Compare `prodigy check FILE` against PyYAML merely loading FILE, for
# generated standard workflows of 1,000 and 10,000 steps, and report how
# check's cost grows from 1k to 10k steps (linear means about 10x).
#
# Usage: bash bench/check-speed.sh
#   PRODIGY_BIN=/path/to/prodigy bash bench/check-speed.sh   # skip the build
#
# All numbers come from one run on one machine, measured side by side; only
# the ratios mean anything.  Uses hyperfine when installed, else a fallback
# loop (median of 5 runs timed with `date +%s%N`).
set -euo pipefail

SIZES=(1000 10000)
WARMUP=1
RUNS=5

die() {
    printf 'check-speed: %s\n' "$*" >&2
    exit 1
}

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"

# --- prodigy binary ---------------------------------------------------------
if [[ -n "${PRODIGY_BIN:-}" ]]; then
    BIN="$(command -v -- "$PRODIGY_BIN" || true)"
    [[ -n "$BIN" && -x "$BIN" ]] || die "PRODIGY_BIN=$PRODIGY_BIN is not an executable"
else
    echo "building prodigy (cargo build --release --locked) ..."
    (cd "$ROOT" && cargo build --release --locked -q)
    BIN="$ROOT/target/release/prodigy"
    [[ -x "$BIN" ]] || die "build succeeded but $BIN is missing"
fi

# --- PyYAML -----------------------------------------------------------------
if ! python3 -c 'import yaml' 2>/dev/null; then
    echo "installing PyYAML ..."
    python3 -m pip install --quiet pyyaml
    python3 -c 'import yaml' || die "PyYAML is still not importable after pip install"
fi

LOADERS=(SafeLoader)
if python3 -c 'import sys, yaml; sys.exit(0 if hasattr(yaml, "CSafeLoader") else 1)'; then
    LOADERS+=(CSafeLoader)
    HAVE_CSAFE=1
else
    HAVE_CSAFE=0
fi

# --- scratch files ----------------------------------------------------------
TMP="$(mktemp -d)"
trap 'rm -rf -- "$TMP"' EXIT

# The loader under test: python3 load_yaml.py LOADER_NAME FILE.
cat >"$TMP/load_yaml.py" <<'EOF'
import sys
import yaml

loader = getattr(yaml, sys.argv[1])
with open(sys.argv[2], encoding="utf-8") as f:
    yaml.load(f, Loader=loader)
EOF

for n in "${SIZES[@]}"; do
    python3 "$BENCH_DIR/gen_workflow.py" "$n" >"$TMP/workflow-$n.yml"
done

# `prodigy check` must accept every generated file; show why if it does not.
for n in "${SIZES[@]}"; do
    if ! "$BIN" check "$TMP/workflow-$n.yml" >"$TMP/check-$n.out" 2>&1; then
        cat "$TMP/check-$n.out" >&2
        die "prodigy check rejected the generated $n-step workflow (exit code above must be 0)"
    fi
done

# --- timing -----------------------------------------------------------------
# results.tsv: SIZE <tab> TOOL <tab> MEDIAN_MS
RESULTS="$TMP/results.tsv"
: >"$RESULTS"

if command -v hyperfine >/dev/null 2>&1; then
    hf_version="$(hyperfine --version)"
    TIMER="$hf_version (--warmup $WARMUP --runs $RUNS, median)"
else
    now="$(date +%s%N)"
    [[ "$now" =~ ^[0-9]+$ ]] \
        || die "no hyperfine and \`date +%s%N\` has no nanoseconds here; install hyperfine"
    TIMER="fallback loop (warmup $WARMUP, median of $RUNS runs, date +%s%N)"
fi

# time_fallback TOOL SIZE CMD...: run CMD WARMUP+RUNS times, record the median.
time_fallback() {
    local tool="$1" size="$2"
    shift 2
    local i start end
    local -a samples=()
    for ((i = 0; i < WARMUP; i++)); do
        "$@" >/dev/null 2>&1 || die "$tool failed on $size steps: $*"
    done
    for ((i = 0; i < RUNS; i++)); do
        start="$(date +%s%N)"
        "$@" >/dev/null 2>&1 || die "$tool failed on $size steps: $*"
        end="$(date +%s%N)"
        samples+=("$((end - start))")
    done
    printf '%s\n' "${samples[@]}" | sort -n | awk -v size="$size" -v tool="$tool" '
        { v[NR] = $1 }
        END {
            m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "%s\t%s\t%.3f\n", size, tool, m / 1e6
        }' >>"$RESULTS"
}

echo "prodigy:  $BIN"
py_version="$(python3 --version 2>&1)"
yaml_version="$(python3 -c 'import yaml; print(yaml.__version__)')"
echo "python:   $py_version, PyYAML $yaml_version, loaders: ${LOADERS[*]}"
echo "timer:    $TIMER"
echo

for n in "${SIZES[@]}"; do
    file="$TMP/workflow-$n.yml"
    bytes="$(wc -c <"$file")"
    echo "== $n steps (${bytes//[[:space:]]/} bytes) =="
    if command -v hyperfine >/dev/null 2>&1; then
        json="$TMP/hyperfine-$n.json"
        args=(--warmup "$WARMUP" --runs "$RUNS" --shell bash --export-json "$json"
              --command-name prodigy
              "$(printf '%q check %q' "$BIN" "$file")")
        for loader in "${LOADERS[@]}"; do
            args+=(--command-name "$loader"
                   "$(printf 'python3 %q %q %q' "$TMP/load_yaml.py" "$loader" "$file")")
        done
        hyperfine "${args[@]}"
        # Results come back in command order: prodigy, then the loaders.
        python3 - "$json" "$n" prodigy "${LOADERS[@]}" >>"$RESULTS" <<'EOF'
import json, sys
path, size, tools = sys.argv[1], sys.argv[2], sys.argv[3:]
results = json.load(open(path))["results"]
assert len(results) == len(tools), (len(results), tools)
for tool, r in zip(tools, results):
    print(f"{size}\t{tool}\t{r['median'] * 1000:.3f}")
EOF
    else
        time_fallback prodigy "$n" "$BIN" check "$file"
        for loader in "${LOADERS[@]}"; do
            time_fallback "$loader" "$n" python3 "$TMP/load_yaml.py" "$loader" "$file"
        done
        awk -F'\t' -v size="$n" '$1 == size { printf "  %-12s %12.1f ms\n", $2, $3 }' "$RESULTS"
    fi
    echo
done

# --- report -----------------------------------------------------------------
awk -F'\t' -v small="${SIZES[0]}" -v large="${SIZES[1]}" -v csafe="$HAVE_CSAFE" '
    { ms[$1, $2] = $3 }
    function fmt_ms(size, tool) {
        return ((size, tool) in ms) ? sprintf("%.2f", ms[size, tool]) : "n/a"
    }
    function ratio(a, b) {
        return (a != "" && b != "" && b + 0 > 0) ? sprintf("%.3g", a / b) : "n/a"
    }
    function cell(size, tool) { return ((size, tool) in ms) ? ms[size, tool] : "" }
    function growth(tool,   a, b) {
        a = cell(large, tool); b = cell(small, tool)
        return (a != "" && b != "" && b + 0 > 0) ? sprintf("%.2fx", a / b) : "n/a"
    }
    END {
        hdr = "%-8s %12s %15s %16s %14s %15s\n"
        printf hdr, "steps", "prodigy ms", "SafeLoader ms", "CSafeLoader ms", "prodigy/Safe", "prodigy/CSafe"
        split(small " " large, sizes, " ")
        for (i = 1; i <= 2; i++) {
            s = sizes[i]
            p = cell(s, "prodigy")
            printf hdr, s, fmt_ms(s, "prodigy"), fmt_ms(s, "SafeLoader"), fmt_ms(s, "CSafeLoader"),
                ratio(p, cell(s, "SafeLoader")), ratio(p, cell(s, "CSafeLoader"))
        }
        printf "%-8s %12s %15s %16s\n", "growth", growth("prodigy"), growth("SafeLoader"), growth("CSafeLoader")
        printf "\nprodigy check growth %d -> %d steps: %s (linear is about %d)\n",
            small, large, growth("prodigy"), large / small
        if (!csafe) print "CSafeLoader: n/a (PyYAML was built without libyaml)"
    }' "$RESULTS"
echo "prodigy/Safe and prodigy/CSafe below 1 mean prodigy check is faster than PyYAML merely loading the file."
