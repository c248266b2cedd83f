#!/usr/bin/env bash
# How long `prodigy ui` and `prodigy status` take over a finished job of N items (default
# 100,000) the first time they read it, and their peak memory.
# The job is made, not run: a real 3-item job (`shell: "echo item ${item}"`) is run once
# under a scratch PRODIGY_HOME, then `ui_job.py` repeats its item events for N items
# (every item id and agent renamed), writes N items to its items.json and N into its
# checkpoint, as a job of N items leaves them.
#
# Usage: bash bench/ui-100k.sh
#   PRODIGY_BIN=/path/to/prodigy bash bench/ui-100k.sh   # skip the build
#   N=100000 RUNS=5 bash bench/ui-100k.sh
#
# Prints, median of RUNS (min to max): `status ID --json` wall time and max RSS; the
# time from starting `prodigy ui` to its first answer of the job's page
# (`/api/runs/ID`, which starts reading the job) and to the first answer that is not partial
# (no `reading` field), then its items page and an item, and the server's max RSS after them.
set -euo pipefail

N="${N:-100000}"
RUNS="${RUNS:-5}"

# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" ui-100k
HOME_DIR="$TMP/home"
mkdir -p "$TMP/project" "$HOME_DIR"
export PRODIGY_HOME="$HOME_DIR"
cat >"$TMP/project/job.yml" <<'YAML'
name: ui-bench
mode: mapreduce
map:
  input: "seq 1 3"
  max_parallel: 1
  agent_template:
    - shell: "echo item ${item}"
    - shell: "true"
YAML
(cd "$TMP/project" && "$BIN" run -q --no-worktree job.yml >/dev/null 2>&1)
ID="$(cd "$TMP/project" && "$BIN" ls --ids | head -1)"
python3 "$BENCH_DIR/ui_job.py" "$HOME_DIR" "$ID" "$N"
echo "job $ID: $N items, $(du -sh "$HOME_DIR/events" | cut -f1) of events"

# Prints "MS KB" of one run of the command given.
timed() {
    /usr/bin/time -f "%e %M" -o "$TMP/time.txt" "$@" >/dev/null
    awk '{printf "%d %d\n", $1 * 1000, $2}' "$TMP/time.txt"
}

# Starts `prodigy ui`, times its first answer of the job's page, then the items page and
# an item; prints "FIRST_MS ITEMS_MS ITEM_MS KB FULL_MS" (FULL: until the page no longer says
# it is reading the job's events).
ui_once() {
    local t0 start first full items item url addr token pid kb
    rm -f "$TMP/ui.out"
    t0=$(now_ns)
    "$BIN" ui --port 0 >"$TMP/ui.out" 2>/dev/null &
    pid=$!
    until grep -q token= "$TMP/ui.out" 2>/dev/null; do sleep 0.01; done
    url=$(head -1 "$TMP/ui.out" | sed 's/^prodigy ui: //')
    addr=${url#http://}
    addr=${addr%%/*}
    token=${url##*token=}
    curl -sf -H "X-Prodigy-Token: $token" "http://$addr/api/runs/$ID" >/dev/null
    first=$(now_ns)
    # A large job's events are read over several requests; the page says how far.
    while curl -sf -H "X-Prodigy-Token: $token" "http://$addr/api/runs/$ID" | grep -q '"reading"'; do :; done
    full=$(now_ns)
    start=$(now_ns)
    curl -sf -H "X-Prodigy-Token: $token" "http://$addr/api/runs/$ID/items?sort=duration&desc=true&offset=50000" >/dev/null
    items=$(now_ns)
    curl -sf -H "X-Prodigy-Token: $token" "http://$addr/api/runs/$ID/items/item_$((N - 1))" >/dev/null
    item=$(now_ns)
    kb=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    echo "$(((first - t0) / 1000000)) $(((items - start) / 1000000)) $(((item - items) / 1000000)) $kb $(((full - t0) / 1000000))"
}

# "median (min to max)" of column C of FILE.
stat() {
    cut -d' ' -f"$1" "$2" | sort -n | awk '{a[NR] = $1} END {printf "%s (%s to %s)", a[int((NR + 1) / 2)], a[1], a[NR]}'
}

: >"$TMP/status.txt"
: >"$TMP/ui.txt"
for ((r = 0; r < RUNS; r++)); do
    timed "$BIN" status "$ID" --json >>"$TMP/status.txt"
    ui_once >>"$TMP/ui.txt"
done
echo "status --json:      $(stat 1 "$TMP/status.txt") ms, max RSS $(stat 2 "$TMP/status.txt") KB"
echo "ui first job page:  $(stat 1 "$TMP/ui.txt") ms (from the server's start)"
echo "ui job page whole:  $(stat 5 "$TMP/ui.txt") ms (until every event is read)"
echo "ui items page:      $(stat 2 "$TMP/ui.txt") ms (sorted by duration, offset 50,000)"
echo "ui one item:        $(stat 3 "$TMP/ui.txt") ms"
echo "ui server max RSS:  $(stat 4 "$TMP/ui.txt") KB"
