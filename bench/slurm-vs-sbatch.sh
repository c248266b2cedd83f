#!/usr/bin/env bash
# What running map agents on Slurm costs: N items (default 200) whose agent runs `true` at
# `max_parallel: 2`, under `prodigy run --executor slurm` (results, events, checkpoints,
# DLQ bookkeeping, one Slurm task per item), against one raw job array of the same N
# `true` tasks (`sbatch --array=0-(N-1)%2`) polled with `squeue` until it leaves the
# queue. Alternating, RUNS runs of each (default 5) after a warm-up; prints the median and
# the spread (min-max) of both side by side, the ratio of the medians and the per-item
# overhead, a slot's turn on each side against one `prodigy agent` timed alone, where
# prodigy's time per item goes (from the events of its last run), each side's last run as
# slurmctld logged it (bench/slurm-turns.py, when its log is readable here), and the load.
#
# Needs a Slurm cluster: as root, `scripts/slurm-cluster start` starts a one-node one.
#
# Usage: bash bench/slurm-vs-sbatch.sh
#   PRODIGY_BIN=/path/to/prodigy N=200 RUNS=3 bash bench/slurm-vs-sbatch.sh
set -euo pipefail

N="${N:-200}"
RUNS="${RUNS:-5}"

# The cluster of scripts/slurm-cluster keeps its slurm.conf in its own directory.
if [ -z "${SLURM_CONF:-}" ] && [ -e "${PRODIGY_SLURM_DIR:-/tmp/prodigy-slurm}/etc/slurm.conf" ]; then
  export SLURM_CONF="${PRODIGY_SLURM_DIR:-/tmp/prodigy-slurm}/etc/slurm.conf"
fi
command -v sbatch >/dev/null || { echo "slurm-vs-sbatch: sbatch is not on PATH (see scripts/slurm-cluster)" >&2; exit 1; }
timeout 5 sinfo -h >/dev/null 2>&1 || { echo "slurm-vs-sbatch: no Slurm cluster answers (as root: scripts/slurm-cluster start)" >&2; exit 1; }

# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" slurm-vs-sbatch
mkdir -p "$TMP/project" "$TMP/home" "$TMP/raw"
cat >"$TMP/workflow.yml" <<YAML
name: slurm-$N
mode: mapreduce
map:
  input: "seq 1 $N"
  max_parallel: 2
  agent_template:
    - shell: "true"
YAML

# slurmctld's log, when this machine can read it: each side's last run is cut out of it
# (bench/slurm-turns.py reads a slot's turn there as the controller saw it).
CTLD_LOG=$(timeout 10 scontrol show config 2>/dev/null | sed -n 's/^SlurmctldLogFile *= *//p')
[[ -r "$CTLD_LOG" ]] || CTLD_LOG=
log_size() { if [[ -n "$CTLD_LOG" ]]; then stat -c %s "$CTLD_LOG"; else echo 0; fi; }
# cut_log FROM NAME: the log written since byte FROM goes to $TMP/NAME.ctld.log.
cut_log() { if [[ -n "$CTLD_LOG" ]]; then tail -c +"$(($1 + 1))" "$CTLD_LOG" >"$TMP/$2.ctld.log"; fi; }

time_prodigy() {
    local start end from
    from=$(log_size)
    start=$(now_ns)
    rm -rf "${TMP:?}/home"
    (cd "$TMP/project" && PRODIGY_HOME="$TMP/home" "$BIN" run -q --no-worktree --executor slurm "$TMP/workflow.yml" >/dev/null 2>"$TMP/prodigy.err") ||
        { cat "$TMP/prodigy.err" >&2; exit 1; }
    end=$(now_ns)
    cut_log "$from" prodigy
    echo $(((end - start) / 1000))
}

time_sbatch() {
    local start end job from
    from=$(log_size)
    start=$(now_ns)
    job=$(sbatch --parsable --array="0-$((N - 1))%2" --job-name=bench-raw --output=/dev/null --chdir="$TMP/raw" --wrap=true)
    job=${job%%;*}
    while [[ -n "$(squeue -h -j "$job" -o %i 2>/dev/null)" ]]; do sleep 0.2; done
    end=$(now_ns)
    cut_log "$from" raw
    echo $(((end - start) / 1000))
}

LOAD_BEFORE=$(load)
alternate time_prodigy time_sbatch >/dev/null
spread() { sort -n "$TMP/alternate-$1.txt" | awk '{a[NR] = $1} END {printf "%.2f %.2f %.2f", a[int((NR + 1) / 2)] / 1e6, a[1] / 1e6, a[NR] / 1e6}'; }
read -r p_med p_min p_max <<<"$(spread time_prodigy)"
read -r r_med r_min r_max <<<"$(spread time_sbatch)"
awk -v pm="$p_med" -v pl="$p_min" -v ph="$p_max" -v rm="$r_med" -v rl="$r_min" -v rh="$r_max" -v n="$N" -v runs="$RUNS" 'BEGIN {
    printf "%d items of `true` at 2 parallel on Slurm, %d runs each (seconds)\n", n, runs
    printf "  %-28s %8s %8s %8s\n", "", "median", "min", "max"
    printf "  %-28s %8.2f %8.2f %8.2f\n", "prodigy --executor slurm", pm, pl, ph
    printf "  %-28s %8.2f %8.2f %8.2f\n", "raw sbatch --array + squeue", rm, rl, rh
    printf "  ratio of the medians         %8.2f (target 1.15 or less)\n", pm / rm
    printf "  overhead per item            %8.1f ms\n", (pm - rm) * 1e3 / n
}'

# Where the time goes, per item, from the last prodigy run's events (timestamps to the
# millisecond, within one day): prodigy admitting the item until its `sbatch` answered,
# Slurm starting the task (its place in the slot's chain included), and the agent running
# in the task until the coordinator has read its result and recorded the outcome.
# The coordinator's and the tasks' events files of the job.
find "$TMP/home/events" -name 'events-*.jsonl' -exec cat {} + >"$TMP/events.jsonl"
awk '
    function ms(line,   t) {
        match(line, /"timestamp":"[^"]*"/); t = substr(line, RSTART + 24, 12)
        return ((substr(t, 1, 2) * 60 + substr(t, 4, 2)) * 60 + substr(t, 7, 6)) * 1000
    }
    function item(line) { match(line, /"item_id":"item_[0-9]+"/); return substr(line, RSTART + 11, RLENGTH - 12) }
    /"event_type":"agent_started"/   { a[item($0)] = ms($0) }
    /"event_type":"task_submitted"/  { s[item($0)] = ms($0) }
    /"event_type":"task_started"/    { t[item($0)] = ms($0) }
    /"event_type":"agent_completed"/ { c[item($0)] = ms($0) }
    /"event_type":"job_started"/     { j0 = ms($0) }
    /"event_type":"job_finished"/    { j1 = ms($0) }
    function med(x,   k, n, v, i, j, tmp) {
        n = 0; for (k in x) v[++n] = x[k]
        for (i = 2; i <= n; i++) { tmp = v[i]; for (j = i - 1; j >= 1 && v[j] > tmp; j--) v[j + 1] = v[j]; v[j + 1] = tmp }
        return n ? v[int((n + 1) / 2)] : 0
    }
    END {
        for (k in c) if ((k in a) && (k in s) && (k in t)) { sub1[k] = s[k] - a[k]; sub2[k] = t[k] - s[k]; sub3[k] = c[k] - t[k] }
        printf "where an item'"'"'s time goes in prodigy'"'"'s last run (median per item, ms; items overlap)\n"
        printf "  admitted -> sbatch answered  %8.1f\n", med(sub1)
        printf "  submitted -> task started    %8.1f (Slurm: the slot'"'"'s chain and the start)\n", med(sub2)
        printf "  task started -> outcome      %8.1f (the agent, its result file, the coordinator)\n", med(sub3)
        printf "  job started -> finished      %8.1f (all items)\n", j1 - j0
    }' "$TMP/events.jsonl"

# The serial part of a slot's turn that a raw task does not have: one task's `prodigy agent`
# (start, workflow compiled, job state read, the item's steps, its result written), timed
# alone here on an item of the last run (its result goes to a scratch file).
job_dir=$(find "$TMP/home/state" -mindepth 4 -maxdepth 4 -type d -path '*/mapreduce/jobs/*' | head -n 1)
job=$(basename "$job_dir")
: >"$TMP/agent.txt"
for ((r = 0; r < 11; r++)); do
    start=$(now_ns)
    (cd "$TMP/project" && "$BIN" agent --home "$TMP/home" --job "$job" --item 0 --result "$TMP/agent-result.json" >/dev/null 2>&1)
    end=$(now_ns)
    echo $(((end - start) / 1000)) >>"$TMP/agent.txt"
done
awk -v pm="$p_med" -v rm="$r_med" -v n="$N" -v agent="$(median <"$TMP/agent.txt")" 'BEGIN {
    printf "a slot'"'"'s turn (2 slots run N/2 tasks each, one after the other), median run\n"
    printf "  prodigy                      %8.1f ms\n", pm * 1e3 / (n / 2)
    printf "  raw array                    %8.1f ms\n", rm * 1e3 / (n / 2)
    printf "  prodigy agent alone          %8.1f ms (median of 11, this machine as loaded now)\n", agent / 1e3
}'

# The same turn as the controller saw it (its log's allocations and completions, to the
# millisecond): what the tasks take from their allocation to their end, and how long a freed
# slot waits for its next allocation.
if [[ -n "$CTLD_LOG" ]] && command -v python3 >/dev/null; then
    printf "a slot's turn in slurmctld's log, each side's last run (median ms)\n"
    printf "  %-27s %6s %6s\n" "" "run" "wait"
    python3 "$BENCH_DIR/slurm-turns.py" "$TMP/prodigy.ctld.log" "prodigy"
    python3 "$BENCH_DIR/slurm-turns.py" "$TMP/raw.ctld.log" "raw array"
else
    echo "(slurmctld's log is not readable here: no view of the controller's side)"
fi
echo "load (1, 5, 15 min): $LOAD_BEFORE before, $(load) after"
