#!/usr/bin/env bash
# A 60-second API outage in the middle of a Claude job, through the real Claude Code CLI
# against the fake Messages API (tests/claude/fake-api.mjs), for two prodigy binaries side by
# side in one run: OLD (the code before the rate governor) and NEW.
#
# The job: 40 items of one Claude call each, `max_parallel: 8`, each call retried by
# `retry_config` (3 attempts, exponential from 1s) on `rate_limit`. Items 0-9 answer at once;
# items 10-39 share the scenario `storm-429-60`: every request of theirs is answered 429
# (`retry-after: 1`) for 60 s from the first of them, then normally. NEW's workflow also
# sets `claude: {patience: 30m}` (OLD refuses the key).
#
# For each binary it prints: the requests refused during the outage, items in the DLQ
# (goal 0), items whose call succeeded more than once (goal 0), the seconds from the
# outage's end to the job's end, the exit status and the wall time.
#
# Usage: OLD=/path/to/old/prodigy [NEW=/path/to/new/prodigy] bash bench/claude-outage.sh
# NEW defaults to target/debug/prodigy. Needs node and npm (the CLI is installed once by
# tests/claude/install.sh). Everything listens on 127.0.0.1 and stops with the script.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NEW=${NEW:-$ROOT/target/debug/prodigy}
[ -n "${OLD:-}" ] || { echo "claude-outage: set OLD to the prodigy binary to compare against" >&2; exit 2; }
CLAUDE=$("$ROOT/tests/claude/install.sh")
WORK=$(mktemp -d)
trap 'kill "${API_PID:-0}" 2>/dev/null || true; rm -rf "$WORK"' EXIT

items() {
  python3 - <<'PY'
import json
print(json.dumps([{"n": i, "scenario": "ok" if i < 10 else "storm-429-60"} for i in range(40)]))
PY
}

workflow() { # $1: extra top-level lines
  cat <<YAML
name: outage
mode: mapreduce
$1
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

run_one() { # $1: label, $2: binary, $3: extra workflow lines
  local dir="$WORK/$1" port start end
  mkdir -p "$dir/project" "$dir/home"
  (cd "$dir/project" && git init -q -b main && items > items.json &&
    workflow "$3" > wf.yml && git add . &&
    git -c user.name=b -c user.email=b@example.invalid commit -qm init)
  node "$ROOT/tests/claude/fake-api.mjs" --log > "$dir/api.port" 2> "$dir/api.log" &
  API_PID=$!
  for _ in $(seq 100); do grep -q listening "$dir/api.port" 2>/dev/null && break; sleep 0.1; done
  port=$(awk '/listening/ {print $2}' "$dir/api.port")
  start=$(date +%s.%N)
  set +e
  (cd "$dir/project" && env -u ANTHROPIC_API_KEY HOME="$dir/home" PRODIGY_HOME="$dir/home/prodigy" \
    PRODIGY_CLAUDE_COMMAND="$CLAUDE" ANTHROPIC_BASE_URL="http://127.0.0.1:$port" \
    ANTHROPIC_API_KEY=dummy IS_SANDBOX=1 CLAUDE_CODE_MAX_RETRIES=0 DISABLE_AUTOUPDATER=1 \
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 GIT_CONFIG_GLOBAL=/dev/null \
    GIT_AUTHOR_NAME=b GIT_AUTHOR_EMAIL=b@example.invalid GIT_COMMITTER_NAME=b \
    GIT_COMMITTER_EMAIL=b@example.invalid \
    "$2" run -y --no-worktree wf.yml) > "$dir/out.txt" 2>&1 </dev/null
  local status=$?
  set -e
  end=$(date +%s.%N)
  kill "$API_PID" 2>/dev/null || true
  wait "$API_PID" 2>/dev/null || true
  python3 - "$1" "$dir" "$status" "$start" "$end" <<'PY'
import glob, json, sys
label, d, status, start, end = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
refused = sum(1 for l in open(f"{d}/api.log") if l.rstrip().endswith("-> 429"))
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
times = []
for path in glob.glob(f"{d}/home/prodigy/events/*/*/events-*.jsonl"):
    for line in open(path):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        t = e.get("timestamp")
        if t:
            times.append((t, e))
        if e.get("event_type") == "claude_finished" and e.get("success"):
            ok[e.get("item_id")] = ok.get(e.get("item_id"), 0) + 1
twice = sum(1 for n in ok.values() if n > 1)
# The outage starts with item_10's first call and lasts 60 s.
from datetime import datetime
def secs(t):
    return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
first = [secs(t) for t, e in times if e.get("event_type") == "claude_started" and e.get("item_id") in {f"item_{i}" for i in range(10, 40)}]
last = max((secs(t) for t, _ in times), default=end)
after = last - (min(first) + 60) if first else float("nan")
print(f"{label:4} refused={refused:4} dlq={dlq:3} twice={twice:2} after_outage={after:6.1f}s exit={status:3} wall={end - start:6.1f}s items={len(results)}")
PY
}

echo "40 items, max_parallel 8, a 60 s all-429 outage from item_10's first request"
run_one old "$OLD" ""
run_one new "$NEW" "claude:
  patience: 30m"
