#!/usr/bin/env bash
# What a MapReduce job costs per item: N items (default 1,000) whose agent runs `true`,
# `max_parallel: 4`, under `prodigy run` (events, the outcome journal, checkpoints and the
# DLQ bookkeeping all on, as always) against `xargs -P4` running the same `sh -c true`
# once per item, side by side in one run, alternating; median of several runs.
# Then the peak memory (max RSS) of a job over BIG items (default 100,000).
#
# Usage: bash bench/map-xargs.sh
#   PRODIGY_BIN=/path/to/prodigy bash bench/map-xargs.sh   # skip the build
#   N=1000 RUNS=5 BIG=100000 bash bench/map-xargs.sh
#
# Only the ratio means anything: both sides are timed on the same machine.
set -euo pipefail

N="${N:-1000}"
RUNS="${RUNS:-5}"
BIG="${BIG:-100000}"

# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" map-xargs
mkdir -p "$TMP/project" "$TMP/home"
seq 1 "$N" >"$TMP/project/items.txt"
cat >"$TMP/workflow.yml" <<YAML
name: map-$N
mode: mapreduce
map:
  input: "cat items.txt"
  max_parallel: 4
  agent_template:
    - shell: "true"
YAML

time_prodigy() { time_run "$TMP/workflow.yml"; }

time_xargs() {
    local start end
    start=$(now_ns)
    xargs -P4 -I{} sh -c true <"$TMP/project/items.txt"
    end=$(now_ns)
    echo $(((end - start) / 1000))
}

LOAD_BEFORE=$(load)
read -r P X < <(alternate time_prodigy time_xargs)
# The state and events of a project live under its name and a hash of its path.
JOBS=$(find "$TMP/home/state" -type d -path '*/mapreduce/jobs' | head -1)
JOB=$(ls -t "$JOBS" | head -1)
OUTCOMES=$(wc -l <"$JOBS/$JOB/results.jsonl")
EVENTS=$(cat "$TMP/home/events"/*/"$JOB"/events-*.jsonl | wc -l)

printf '%d items of `true` at 4 parallel, median (min-max) of %d runs, load %s before, %s after\n' "$N" "$RUNS" "$LOAD_BEFORE" "$(load)"
printf '  prodigy run (events, journal, checkpoints): %8.1f ms (%s)  (%s outcomes, %s events per run)\n' \
    "$(echo "$P / 1000" | bc -l)" "$(spread time_prodigy)" "$OUTCOMES" "$EVENTS"
printf '  xargs -P4 sh -c true:                       %8.1f ms (%s)\n' "$(echo "$X / 1000" | bc -l)" "$(spread time_xargs)"
printf '  ratio prodigy / xargs:                      %8.2f  (target <= 1.10)\n' "$(echo "$P / $X" | bc -l)"

# Peak memory over BIG items: the items (kept as JSON values), the results for
# `${map.results}`, the journal and the checkpoints.
seq 1 "$BIG" >"$TMP/project/items.txt"
if command -v /usr/bin/time >/dev/null; then
    (cd "$TMP/project" && PRODIGY_HOME="$TMP/home" /usr/bin/time -f '%M' -o "$TMP/rss" \
        "$BIN" run "$TMP/workflow.yml" >/dev/null 2>&1)
    printf 'peak memory for %d items: %.1f MB (max RSS)\n' "$BIG" "$(echo "$(cat "$TMP/rss") / 1024" | bc -l)"
else
    echo "peak memory: /usr/bin/time is not installed (apt-get install time)"
fi
