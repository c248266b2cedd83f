#!/usr/bin/env bash
# An API outage in the middle of a Claude job, through the real Claude Code CLI against the
# fake Messages API (tests/claude/fake-api.mjs), for one or two prodigy binaries side by side
# in one run: OLD (optional, the code to compare against) and NEW.
#
# The job: 40 items of one Claude call each, `max_parallel: 8`, `claude: {patience: 30m}`, each
# call retried by `retry_config` (3 attempts, exponential from 1s) on `rate_limit`. Items 0-9
# answer at once; items 10-39 share the scenario `storm-429-STORM`: every request of theirs is
# answered 429 (`retry-after: 1`) for STORM seconds (default 90) from the first of them, then
# normally. The CLI runs with its own retry budget as each binary leaves it
# (`CLAUDE_CODE_MAX_RETRIES` is not set here): ten retries by the CLI's default, or what
# prodigy sets.
#
# Each binary first runs the same job without the storm (every item `ok`: the calm run), then
# with it. For each run it prints: the requests refused (and how many of them the CLIs made
# as their own retries), items in the DLQ (goal 0), items whose call succeeded more than once
# (goal 0), the seconds from the storm's end to the first request answered after it and to
# the job's end, the exit status and the wall time. Then the storm's cost: the storm run's
# wall time less the calm run's, and that cost over STORM (issue 40: 1.2 at most).
#
# Usage: [OLD=/path/to/old/prodigy] [NEW=/path/to/new/prodigy] [STORM=90] [CALM=1] \
#          bash bench/claude-outage.sh
# NEW defaults to target/debug/prodigy; CALM=0 skips the calm runs; KEEP=1 keeps each run's
# project, PRODIGY_HOME and the fake API's log (with times) and says where. Needs node and npm (the
# CLI is installed once by tests/claude/install.sh). Everything listens on 127.0.0.1 and stops
# with the script.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NEW=${NEW:-$ROOT/target/debug/prodigy}
STORM=${STORM:-90}
CALM=${CALM:-1}
CLAUDE=$("$ROOT/tests/claude/install.sh")
WORK=$(mktemp -d)
if [ "${KEEP:-0}" = 1 ]; then
  echo "runs kept in $WORK"
  trap 'kill "${API_PID:-0}" 2>/dev/null || true' EXIT
else
  trap 'kill "${API_PID:-0}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
fi

items() { # $1: the scenario of items 10-39
  python3 - "$1" <<'PY'
import json, sys
print(json.dumps([{"n": i, "scenario": "ok" if i < 10 else sys.argv[1]} for i in range(40)]))
PY
}

workflow() {
  cat <<YAML
name: outage
mode: mapreduce
claude:
  patience: 30m
map:
  input: items.json
  json_path: "\$[*]"
  max_parallel: 8
  agent_template:
    - claude: "Reply briefly about item \${item.n}. scenario:\${item.scenario}"
      retry_config:
        attempts: 3
        backoff: exponential
        initial_delay: 1s
        retry_on: [rate_limit]
YAML
}

run_one() { # $1: label, $2: binary, $3: the scenario of items 10-39
  local dir="$WORK/$1" port start end
  mkdir -p "$dir/project" "$dir/home"
  (cd "$dir/project" && git init -q -b main && items "$3" > items.json &&
    workflow > wf.yml && git add . &&
    git -c user.name=b -c user.email=b@example.invalid commit -qm init)
  # Each request's log line with the time it came, for the first answer after the storm.
  node "$ROOT/tests/claude/fake-api.mjs" --log > "$dir/api.port" 2> >(
    while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done > "$dir/api.log"
  ) &
  API_PID=$!
  for _ in $(seq 100); do grep -q listening "$dir/api.port" 2>/dev/null && break; sleep 0.1; done
  port=$(awk '/listening/ {print $2}' "$dir/api.port")
  start=$(date +%s.%N)
  set +e
  (cd "$dir/project" && env -u ANTHROPIC_API_KEY -u CLAUDE_CODE_MAX_RETRIES HOME="$dir/home" \
    PRODIGY_HOME="$dir/home/prodigy" \
    PRODIGY_CLAUDE_COMMAND="$CLAUDE" ANTHROPIC_BASE_URL="http://127.0.0.1:$port" \
    ANTHROPIC_API_KEY=dummy IS_SANDBOX=1 DISABLE_AUTOUPDATER=1 \
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 GIT_CONFIG_GLOBAL=/dev/null \
    GIT_AUTHOR_NAME=b GIT_AUTHOR_EMAIL=b@example.invalid GIT_COMMITTER_NAME=b \
    GIT_COMMITTER_EMAIL=b@example.invalid \
    "$2" run -y --no-worktree wf.yml) > "$dir/out.txt" 2>&1 </dev/null
  local status=$?
  set -e
  end=$(date +%s.%N)
  kill "$API_PID" 2>/dev/null || true
  wait "$API_PID" 2>/dev/null || true
  sleep 0.2
  python3 - "$1" "$dir" "$status" "$start" "$end" <<'PY'
import glob, json, re, sys
label, d, status, start, end = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
storm_end = None
refused = 0
answered = []  # times of the conversation's requests answered normally
for l in open(f"{d}/api.log"):
    at, _, text = l.rstrip("\n").partition(" ")
    m = re.search(r"storm \S+ from \S+ until (\S+)", text)
    if m:
        storm_end = float(m.group(1))
    if "tools=0" in text:
        continue
    if text.endswith("-> 429"):
        refused += 1
    elif "-> " in text and "messages model=" in text:
        answered.append(float(at))
results = {}
for path in glob.glob(f"{d}/home/prodigy/state/*/mapreduce/jobs/*/results.jsonl"):
    for line in open(path):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        results[r["item_id"]] = r
dlq = sum(1 for r in results.values() if r.get("dead_lettered"))
ok = {}
own_retries = 0
for path in glob.glob(f"{d}/home/prodigy/events/*/*/events-*.jsonl"):
    for line in open(path):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event_type") == "claude_finished" and e.get("success"):
            ok[e.get("item_id")] = ok.get(e.get("item_id"), 0) + 1
for path in glob.glob(f"{d}/home/prodigy/logs/**/*.jsonl", recursive=True):
    for line in open(path):
        if '"subtype":"api_retry"' in line:
            own_retries += 1
twice = sum(1 for n in ok.values() if n > 1)
if storm_end is None:
    storm = "no storm"
else:
    first = min((t for t in answered if t >= storm_end), default=float("nan"))
    storm = f"first answer {first - storm_end:5.1f}s after the storm, end {end - storm_end:6.1f}s after"
print(f"{label:10} refused={refused:4} (CLI retries {own_retries:3}) dlq={dlq:2} twice={twice:2} "
      f"{storm} exit={status} wall={end - start:6.1f}s items={len(results)}")
with open(f"{d}/../walls", "a") as f:
    f.write(f"{label} {end - start:.1f}\n")
PY
}

wall() { awk -v l="$1" '$1 == l {print $2}' "$WORK/walls"; }

echo "40 items, max_parallel 8, a ${STORM} s all-429 storm from item_10's first request"
labels=()
[ -n "${OLD:-}" ] && labels+=(old)
labels+=(new)
for label in "${labels[@]}"; do
  bin=$NEW
  [ "$label" = old ] && bin=$OLD
  [ "$CALM" = 1 ] && run_one "$label-calm" "$bin" ok
  run_one "$label-storm" "$bin" "storm-429-$STORM"
done
if [ "$CALM" = 1 ]; then
  for label in "${labels[@]}"; do
    calm=$(wall "$label-calm") storm=$(wall "$label-storm")
    awk -v l="$label" -v c="$calm" -v s="$storm" -v n="$STORM" 'BEGIN {
      printf "%-4s calm %6.1fs, storm %6.1fs: the %d s storm cost %6.1fs, %.2f times its length\n",
        l, c, s, n, s - c, (s - c) / n }'
  done
fi
