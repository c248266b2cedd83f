#!/usr/bin/env bash
# The verified merge queue (`merge.verify`, `batch`, `redispatch`, `protect`) against a serial
# loop in one checkout, side by side in one run (alternating, median of RUNS runs).
#
# A generated repository of shell functions whose test suite (`sh test.sh`, every
# `tests/*.sh`, plus SUITE_SECS of setup time) takes a fraction of a second, and N items
# (default 24, seed SEED) of these kinds, shuffled:
#   new:K        adds a function and its test (green whatever else lands);
#   change:K     changes what an existing function returns, and its own test: green alone,
#                red together with the matching caller:K; sent back, it updates every test
#                of that function to what it returns now;
#   caller:K     adds a test of that function expecting what it returns when the agent
#                starts: green alone, red together with change:K; sent back, it expects what
#                the function returns now;
#   first:K, second:K
#                write the same line of one file: a textual conflict; sent back, an agent
#                appends its line to what landed;
#   weaken:0     adds a function, and makes the test runner pass whatever happens (a
#                protected path); sent back, only the function.
# A scripted agent (AGENT_SECS of "thinking", then the change) plays every item.
#
# prodigy: `max_parallel: 4`, `merge.batch: 4`, `merge.redispatch: 2`,
# `merge.protect: [test.sh]`, `merge.verify: sh test.sh`.
# The serial loop: for each item in order, apply it, run the tests; on failure undo, run it
# once more with the failing output, run the tests, commit when they pass, else undo.
#
# Reported for each: items landed, red states (first-parent commits of the result on which
# the ORIGINAL test suite fails: must be 0), test-suite runs per landed item, wall time, and
# prodigy's time as a ratio of the loop's. Goals (2 cores): every item lands, 0 red states,
# at most 1.0 verification runs per landed item, at most 1.0x the loop's time.
#
# Usage: bash bench/verified-merge.sh
#   PRODIGY_BIN=/path/to/prodigy N=24 RUNS=3 SEED=7 AGENT_SECS=0.3 SUITE_SECS=0.2 bash bench/verified-merge.sh
set -euo pipefail

N="${N:-24}"
RUNS="${RUNS:-3}"
SEED="${SEED:-7}"
AGENT_SECS="${AGENT_SECS:-0.3}"
SUITE_SECS="${SUITE_SECS:-0.2}"

# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" verified-merge
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@example.invalid
export GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@example.invalid
export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1

# The repository: functions f0..f7, their tests, the runner.
mkdir -p "$TMP/base/lib" "$TMP/base/tests" "$TMP/base/notes"
for k in 0 1 2 3 4 5 6 7; do
    printf 'f%s() { echo $(( $1 + %s )); }\n' "$k" "$k" >"$TMP/base/lib/f$k.sh"
    printf '. ./lib/f%s.sh\n[ "$(f%s 1)" = "%s" ]\n' "$k" "$k" "$((k + 1))" >"$TMP/base/tests/t$k.sh"
    printf 'base\n' >"$TMP/base/notes/c$k.txt"
done
cat >"$TMP/base/test.sh" <<EOF
sleep $SUITE_SECS
for t in tests/*.sh; do sh "\$t" || { echo "FAILED: \$t"; exit 1; }; done
echo ok
EOF
cp "$TMP/base/test.sh" "$TMP/test.sh.orig"

# The items: pairs red together, conflicting pairs, one weakening item, the rest new.
python3 - "$N" "$SEED" >"$TMP/items.txt" <<'PY'
import random, sys
n, seed = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(seed)
pairs = max(1, n // 6)
conflicts = max(1, n // 8)
items = []
for k in range(pairs):
    items += [f"change:{k}", f"caller:{k}"]
for k in range(conflicts):
    items += [f"first:{k}", f"second:{k}"]
items.append("weaken:0")
k = 100
while len(items) < n:
    items.append(f"new:{k}")
    k += 1
rng.shuffle(items)
print("\n".join(items[:max(n, len(items))]))
PY

# The scripted agent: `agent.sh ITEM [REASON]`, in the checkout it works in.
cat >"$TMP/agent.sh" <<EOF
#!/bin/sh
sleep $AGENT_SECS
kind=\${1%%:*} k=\${1#*:} reason=\${2:-}
case \$kind in
new)
    printf 'f%s() { echo \$(( \$1 * 2 )); }\n' "\$k" > lib/f\$k.sh
    printf '. ./lib/f%s.sh\n[ "\$(f%s 2)" = "4" ]\n' "\$k" "\$k" > tests/t\$k.sh ;;
change)
    printf 'f%s() { echo \$(( \$1 + 100 + %s )); }\n' "\$k" "\$k" > lib/f\$k.sh
    if [ -n "\$reason" ]; then files=\$(grep -l "f\$k " tests/*.sh); else files=tests/t\$k.sh; fi
    for t in \$files; do
        n=\$(sed -n 's/.*(f'"\$k"' \([0-9]*\)).*/\1/p' "\$t")
        sed -i 's/= "[0-9]*" ]/= "'"\$((n + 100 + k))"'" ]/' "\$t"
    done ;;
caller)
    want=\$(. ./lib/f\$k.sh; f\$k 5)
    printf '. ./lib/f%s.sh\n[ "\$(f%s 5)" = "%s" ]\n' "\$k" "\$k" "\$want" > tests/u\$k.sh ;;
first|second)
    if [ "\$reason" = conflict ]; then echo "\$kind" >> notes/c\$k.txt; else echo "\$kind" > notes/c\$k.txt; fi ;;
weaken)
    printf 'g() { echo g; }\n' > lib/g.sh
    [ "\$reason" = protected ] || echo 'exit 0' > test.sh ;;
esac
EOF
chmod +x "$TMP/agent.sh"

cat >"$TMP/job.yml" <<EOF
mode: mapreduce
map:
  input: "cat $TMP/items.txt"
  max_parallel: 4
  agent_template:
    - shell: 'sh $TMP/agent.sh "\$ITEM" "\$VERIFY__REASON" && git add -A && git commit -qm "item \$ITEM"'
merge:
  verify:
    - shell: "sh test.sh"
  batch: 4
  redispatch: 2
  protect: [test.sh]
EOF

fresh() {
    rm -rf "$TMP/project" "$TMP/home"
    cp -r "$TMP/base" "$TMP/project"
    (cd "$TMP/project" && git init -q -b main && git add -A && git commit -qm base)
}

# Counts the first-parent commits in BASE..TIP of the project on which the original test
# suite fails.
red_states() {
    local base="$1" tip="$2" red=0 c dir
    for c in $(git -C "$TMP/project" rev-list --first-parent "$base..$tip"); do
        dir="$TMP/state"
        rm -rf "$dir" && mkdir -p "$dir"
        git -C "$TMP/project" archive "$c" | tar -x -C "$dir"
        cp "$TMP/test.sh.orig" "$dir/test.sh"
        (cd "$dir" && SUITE_SECS=0 sed -i '1d' test.sh && sh test.sh >/dev/null 2>&1) || red=$((red + 1))
    done
    echo "$red"
}

# One prodigy job: prints "microseconds landed red verifications".
prodigy_run() {
    fresh
    local base start end landed red runs
    base=$(git -C "$TMP/project" rev-parse HEAD)
    start=$(now_ns)
    (cd "$TMP/project" && PRODIGY_HOME="$TMP/home" "$BIN" run -y "$TMP/job.yml" >/dev/null 2>"$TMP/err") ||
        { cat "$TMP/err" >&2; exit 1; }
    end=$(now_ns)
    landed=$(sed -n 's/.*completed[^:]*: \([0-9]*\) succeeded.*/\1/p' "$TMP/err" | tail -1)
    red=$(red_states "$base" "main^2")
    runs=$(cat "$TMP"/home/events/*/*/*.jsonl | grep -c '"event_type":"verify_started"' || true)
    echo "$(((end - start) / 1000)) ${landed:-0} $red $runs"
}

# The serial loop: prints "microseconds landed red test-runs".
serial_run() {
    fresh
    local base start end landed=0 runs=0 item out
    base=$(git -C "$TMP/project" rev-parse HEAD)
    start=$(now_ns)
    (
        cd "$TMP/project"
        while read -r item; do
            sh "$TMP/agent.sh" "$item"
            runs=$((runs + 1))
            if out=$(sh test.sh 2>&1); then
                git add -A && git commit -qm "item $item" && landed=$((landed + 1))
                continue
            fi
            git checkout -q -- . && git clean -qfd
            sh "$TMP/agent.sh" "$item" verify_failed
            runs=$((runs + 1))
            if sh test.sh >/dev/null 2>&1; then
                git add -A && git commit -qm "item $item (second try)" && landed=$((landed + 1))
            else
                git checkout -q -- . && git clean -qfd
            fi
        done <"$TMP/items.txt"
        echo "$landed $runs" >"$TMP/serial-counts"
    )
    end=$(now_ns)
    read -r landed runs <"$TMP/serial-counts"
    echo "$(((end - start) / 1000)) $landed $(red_states "$base" main) $runs"
}

echo "verified-merge: $N items (seed $SEED: $(cut -d: -f1 "$TMP/items.txt" | sort | uniq -c | awk '{printf "%s %s, ", $1, $2}' | sed 's/, $//')), agents ${AGENT_SECS}s, suite ${SUITE_SECS}s, $RUNS runs, load $(load)"
: >"$TMP/p.txt"
: >"$TMP/s.txt"
for ((r = 0; r < RUNS; r++)); do
    prodigy_run >>"$TMP/p.txt"
    serial_run >>"$TMP/s.txt"
done
pt=$(cut -d' ' -f1 "$TMP/p.txt" | median)
st=$(cut -d' ' -f1 "$TMP/s.txt" | median)
row() {
    local name="$1" file="$2" t="$3"
    read -r _ landed red runs < <(sort -n "$file" | awk -v t="$t" '$1 == t')
    # The spread of the wall times: the fastest and the slowest run.
    local spread
    spread=$(cut -d' ' -f1 "$file" | sort -n | awk '{a[NR] = $1} END {printf "%.2f-%.2f", a[1] / 1e6, a[NR] / 1e6}')
    printf '%-22s %7s %6s %18s %10.2f s (%s)\n' "$name" "$landed/$N" "$red" \
        "$(awk -v r="$runs" -v l="$landed" 'BEGIN { if (l > 0) printf "%.2f", r / l; else print "-" }')" \
        "$(awk -v t="$t" 'BEGIN { print t / 1e6 }')" "$spread"
}
printf '%-22s %7s %6s %18s %12s\n' "" landed red "suite runs/landed" "wall: median (spread)"
row "prodigy (verified)" "$TMP/p.txt" "$pt"
row "serial loop" "$TMP/s.txt" "$st"
awk -v p="$pt" -v s="$st" 'BEGIN { printf "prodigy / serial loop: %.2fx\n", p / s }'
