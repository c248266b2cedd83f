#!/bin/sh
# A stand-in for the Claude Code CLI, for trying a Claude workflow without Claude:
#   PRODIGY_CLAUDE_COMMAND=workflows/examples/claude-stand-in.sh prodigy run my-claude-job.yml
# prodigy runs it as `PROGRAM -p --output-format stream-json --verbose ...`, with the prompt
# on its standard input, and reads what it prints: stream-json, one JSON object a line. The
# least it must print is an `init` event (the session), the assistant's answer, and a
# `result` event; `is_error: true` (or a non-zero exit) fails the call. Here the answer is
# the prompt's first line; replace the middle with whatever your stand-in should do (edit
# files, commit), keeping the three lines it prints.

# `prodigy run` first checks that the CLI answers `--version`.
for arg; do [ "$arg" = --version ] && { echo "0.0.0 (stand-in)"; exit 0; }; done

prompt=$(cat)
# The answer, as one JSON string: backslashes and quotes escaped, the first line only.
answer=$(printf '%s' "$prompt" | head -n 1 | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/ /g')

echo '{"type":"system","subtype":"init","session_id":"stand-in-1","model":"stand-in","tools":[]}'
printf '{"type":"assistant","message":{"content":[{"type":"text","text":"done: %s"}]}}\n' "$answer"
printf '{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"done: %s","session_id":"stand-in-1","total_cost_usd":0,"usage":{"input_tokens":0,"output_tokens":0}}\n' "$answer"
