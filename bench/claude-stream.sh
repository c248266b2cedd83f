#!/usr/bin/env bash
# What prodigy adds to a Claude call: a `claude:` step whose CLI is the replay stub
# (tests/fixtures/claude/replay) printing a generated 10 MB `stream-json` transcript (text,
# tool calls and tool results, then a result), against the stub printing the same
# transcript to /dev/null alone, side by side in one run; median of several runs.
# prodigy reads every event as it arrives, writes the call's log, and decides the verdict.
#
# Usage: bash bench/claude-stream.sh
#   PRODIGY_BIN=/path/to/prodigy bash bench/claude-stream.sh   # skip the build
#   RUNS=9 MB=50 bash bench/claude-stream.sh
#   PACE=0.002 bash bench/claude-stream.sh   # lines spaced as a real call sends them
#
# At full speed the replay is a `cat` of the file, a few milliseconds for 10 MB, so the ratio
# mostly shows prodigy's own start (about 15 ms) and its per-megabyte cost; with PACE, both
# sides replay the lines PACE seconds apart (CLAUDE_REPLAY_DELAY), as a call that runs for
# minutes delivers them.
#
# Only the ratio means anything: both sides are timed on the same machine, alternating.
set -euo pipefail

MB="${MB:-10}"
RUNS="${RUNS:-7}"

# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" claude-stream
REPLAY="$ROOT/tests/fixtures/claude/replay"
mkdir -p "$TMP/project" "$TMP/home"

# A transcript of MB megabytes: one init event, then turns of a tool call, its result (about
# 4 KB of output) and some text, then the result event.
python3 - "$MB" >"$TMP/big.jsonl" <<'PY'
import json, sys
target = int(sys.argv[1]) * 1_000_000
out = sys.stdout
def emit(event):
    line = json.dumps(event, separators=(",", ":"))
    out.write(line + "\n")
    return len(line) + 1
size = emit({"type": "system", "subtype": "init", "session_id": "bench", "model": "bench", "tools": ["Bash"]})
turn = 0
while size < target:
    turn += 1
    size += emit({"type": "assistant", "message": {"content": [
        {"type": "text", "text": f"Step {turn}: running the tests again."},
        {"type": "tool_use", "id": f"t{turn}", "name": "Bash", "input": {"command": "cargo test"}}]}})
    size += emit({"type": "user", "message": {"content": [
        {"type": "tool_result", "tool_use_id": f"t{turn}", "content": ("test ok\n" * 500)}]}})
emit({"type": "result", "subtype": "success", "is_error": False, "num_turns": turn,
      "result": "All tests pass.", "total_cost_usd": 1.0,
      "usage": {"input_tokens": 1000, "output_tokens": 1000}})
PY
printf -- '- claude: "Fix the tests."\n' >"$TMP/workflow.yml"
export CLAUDE_REPLAY="$TMP/big.jsonl" IS_SANDBOX=1 PRODIGY_CLAUDE_COMMAND="$REPLAY"
if [[ -n "${PACE:-}" ]]; then
    export CLAUDE_REPLAY_DELAY="$PACE"
fi

time_prodigy() { time_run "$TMP/workflow.yml" --no-worktree; }

time_replay() {
    local start end
    start=$(now_ns)
    "$REPLAY" -p --output-format stream-json --verbose -- "Fix the tests." >/dev/null
    end=$(now_ns)
    echo $(((end - start) / 1000))
}

read -r P R < <(alternate time_prodigy time_replay)
LOG=$(find "$TMP/home/logs" -name '*.jsonl' | head -1)
cmp -s "$LOG" "$TMP/big.jsonl" || { echo "claude-stream: the log differs from the stream" >&2; exit 1; }
awk -v p="$P" -v r="$R" -v mb="$MB" 'BEGIN {
    printf "a %d MB stream-json call: prodigy %.1f ms, the replay alone %.1f ms\n", mb, p / 1000, r / 1000
    printf "prodigy adds %.1f ms (%.0f%%, %.1f ms per MB); ratio %.2f (target: 1.10 or less)\n", (p - r) / 1000, (p - r) * 100 / r, (p - r) / 1000 / mb, p / r
}'
