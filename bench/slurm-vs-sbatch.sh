#!/usr/bin/env bash
# What running map agents on Slurm costs: N items (default 200) whose agent runs `true` at
# `max_parallel: 2`, under `prodigy run --executor slurm` (results, events, checkpoints,
# DLQ bookkeeping, one Slurm task per item), against one raw job array of the same N
# `true` tasks (`sbatch --array=0-(N-1)%2`) polled with `squeue` until it leaves the
# queue. Alternating, median of RUNS (default 3); prints both, their ratio and the
# per-item overhead.
#
# Needs a Slurm cluster: as root, `scripts/slurm-cluster start` starts a one-node one.
#
# Usage: bash bench/slurm-vs-sbatch.sh
#   PRODIGY_BIN=/path/to/prodigy N=200 RUNS=3 bash bench/slurm-vs-sbatch.sh
set -euo pipefail

N="${N:-200}"
RUNS="${RUNS:-3}"

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

time_prodigy() {
    local start end
    start=$(now_ns)
    (cd "$TMP/project" && PRODIGY_HOME="$TMP/home" "$BIN" run -q --no-worktree --executor slurm "$TMP/workflow.yml" >/dev/null 2>"$TMP/prodigy.err") ||
        { cat "$TMP/prodigy.err" >&2; exit 1; }
    end=$(now_ns)
    echo $(((end - start) / 1000))
}

time_sbatch() {
    local start end job
    start=$(now_ns)
    job=$(sbatch --parsable --array="0-$((N - 1))%2" --job-name=bench-raw --output=/dev/null --chdir="$TMP/raw" --wrap=true)
    job=${job%%;*}
    while [[ -n "$(squeue -h -j "$job" -o %i 2>/dev/null)" ]]; do sleep 0.2; done
    end=$(now_ns)
    echo $(((end - start) / 1000))
}

read -r prodigy raw < <(alternate time_prodigy time_sbatch)
awk -v p="$prodigy" -v r="$raw" -v n="$N" 'BEGIN {
    printf "%d items of `true` at 2 parallel on Slurm (median of runs)\n", n
    printf "  prodigy --executor slurm  %8.2f s\n", p / 1e6
    printf "  raw sbatch --array + squeue %6.2f s\n", r / 1e6
    printf "  ratio prodigy/raw         %8.2f (target 1.2 or less)\n", p / r
    printf "  overhead per item         %8.1f ms\n", (p - r) / 1e3 / n
}'
