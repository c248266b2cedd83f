#!/bin/sh
# Re-records the Claude Code CLI transcripts in tests/fixtures/claude/ (see CONTRIBUTING.md,
# "Claude Code transcripts").
#
#   tests/claude/record.sh [NAME...]
#
# Installs the pinned CLI (tests/claude/VERSION) into target/claude-cli/, starts the fake API
# (tests/claude/fake-api.mjs) on loopback, and runs the CLI once for each scenario of
# tests/claude/scenarios.tsv (or only those named), each in a fresh temporary HOME. For each it
# writes NAME.jsonl (stdout), NAME.exit (the exit code) and NAME.stderr (when not empty), with
# the temporary paths replaced by /home/user (HOME) and /home/user/project (the working
# directory) and the fake API's port by PORT; and the CLI's `--version` line in VERSION.txt.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/tests/fixtures/claude

claude=$("$here/install.sh")
tmp=$(mktemp -d)
server=
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

node "$here/fake-api.mjs" --log "$tmp/port" >"$tmp/server.out" 2>"$tmp/server.log" &
server=$!
tries=0
while [ ! -s "$tmp/port" ]; do
  tries=$((tries + 1))
  if [ "$tries" -gt 100 ]; then
    echo "record.sh: the fake API did not start" >&2
    cat "$tmp/server.log" >&2
    exit 1
  fi
  sleep 0.1
done
port=$(tr -d '\n' < "$tmp/port")
echo "record.sh: fake API on 127.0.0.1:$port, CLI $claude" >&2

mkdir -p "$out"
"$claude" --version > "$out/VERSION.txt"

# The CLI names a project's state directory after its path with every other character than
# letters and digits turned into `-`.
encode() { printf '%s' "$1" | sed 's/[^A-Za-z0-9]/-/g'; }

tab=$(printf '\t')
grep -v '^#' "$here/scenarios.tsv" | while IFS="$tab" read -r name retries key turns prompt; do
  if [ "$#" -gt 0 ]; then
    wanted=no
    for only in "$@"; do [ "$only" = "$name" ] && wanted=yes; done
    [ "$wanted" = yes ] || continue
  fi
  home=$tmp/$name/home
  mkdir -p "$home/project"
  if [ "$turns" = - ]; then turns_flag=; else turns_flag="--max-turns $turns"; fi
  key_value=
  token_value=
  case $key in
    yes) key_value=dummy ;;
    oauth) token_value=dummy ;;
  esac
  status=0
  # shellcheck disable=SC2086 # turns_flag is empty or two words
  (cd "$home/project" && env -u ANTHROPIC_API_KEY -u ANTHROPIC_AUTH_TOKEN -u CLAUDE_CODE_OAUTH_TOKEN \
    HOME="$home" ANTHROPIC_BASE_URL="http://127.0.0.1:$port" \
    ${key_value:+ANTHROPIC_API_KEY=$key_value} \
    ${token_value:+CLAUDE_CODE_OAUTH_TOKEN=$token_value} IS_SANDBOX=1 \
    CLAUDE_CODE_MAX_RETRIES="$retries" DISABLE_AUTOUPDATER=1 \
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
    timeout -k 5 120 "$claude" -p --output-format stream-json --verbose \
    --dangerously-skip-permissions $turns_flag) \
    >"$tmp/$name.out" 2>"$tmp/$name.err" <<EOF_PROMPT || status=$?
$prompt
EOF_PROMPT
  normalise() {
    sed -e "s|$home/project|/home/user/project|g" -e "s|$home|/home/user|g" \
      -e "s|$(encode "$home/project")|-home-user-project|g" \
      -e "s|127\.0\.0\.1:$port|127.0.0.1:PORT|g" "$1"
  }
  normalise "$tmp/$name.out" > "$out/$name.jsonl"
  echo "$status" > "$out/$name.exit"
  if [ -s "$tmp/$name.err" ]; then
    normalise "$tmp/$name.err" > "$out/$name.stderr"
  else
    rm -f "$out/$name.stderr"
  fi
  echo "record.sh: $name: exit $status, $(wc -l < "$out/$name.jsonl") lines" >&2
done
echo "record.sh: requests the fake API saw:" >&2
cat "$tmp/server.log" >&2
