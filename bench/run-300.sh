#!/usr/bin/env bash
# How much prodigy's runtime costs per step: a 300-step standard workflow of `true`
# (`prodigy run`, with its events and a checkpoint after every step) against the same
# 300 `sh -c true` in a shell loop, side by side in one run; median of several runs.
#
# Usage: bash bench/run-300.sh
#   PRODIGY_BIN=/path/to/prodigy bash bench/run-300.sh   # skip the build
#   RUNS=9 STEPS=1000 bash bench/run-300.sh
#
# Only the ratio means anything: both sides are timed on the same machine, alternating.
set -euo pipefail

STEPS="${STEPS:-300}"
RUNS="${RUNS:-7}"

# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" run-300
mkdir -p "$TMP/project" "$TMP/home"
{
    echo "name: run-$STEPS"
    echo "commands:"
    for ((i = 0; i < STEPS; i++)); do
        echo "  - shell: \"true\""
    done
} >"$TMP/workflow.yml"

time_prodigy() { time_run "$TMP/workflow.yml"; }

time_loop() {
    local start end
    start=$(now_ns)
    for ((i = 0; i < STEPS; i++)); do
        sh -c true
    done
    end=$(now_ns)
    echo $(((end - start) / 1000))
}

LOAD_BEFORE=$(load)
read -r P L < <(alternate time_prodigy time_loop)
EVENTS=$(find "$TMP/home/events" -name 'events-*.jsonl' | head -1 | xargs wc -l | awk '{print $1}')

printf '%d steps of `true`, median (min-max) of %d runs, load %s before, %s after\n' "$STEPS" "$RUNS" "$LOAD_BEFORE" "$(load)"
printf '  prodigy run (events + checkpoints): %8.1f ms (%s)  (%s events per run)\n' "$(echo "$P / 1000" | bc -l)" "$(spread time_prodigy)" "$EVENTS"
printf '  sh -c true in a shell loop:         %8.1f ms (%s)\n' "$(echo "$L / 1000" | bc -l)" "$(spread time_loop)"
printf '  ratio prodigy / loop:               %8.2f  (target <= 1.10)\n' "$(echo "$P / $L" | bc -l)"
