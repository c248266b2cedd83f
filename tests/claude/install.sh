#!/bin/sh
# Installs the pinned Claude Code CLI (tests/claude/VERSION) into
# target/claude-cli/VERSION, once, and prints the path of its `claude` program.
#
# Exit codes: 0 installed (or already there), 3 node or npm is missing, 4 npm failed (for
# example the registry cannot be reached); npm's output is then on stderr.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
version=$(tr -d ' \n' < "$here/VERSION")
target=${CARGO_TARGET_DIR:-$root/target}
dir=$target/claude-cli/$version
bin=$dir/node_modules/.bin/claude

if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
  printf '%s\n' "$bin"
  exit 0
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "node and npm are needed to install @anthropic-ai/claude-code@$version" >&2
  exit 3
fi
mkdir -p "$dir"
# npm's download cache is only needed during the install: the CLI is large, disks are not.
cache=$(mktemp -d "$target/claude-cli/npm-cache.XXXXXX")
trap 'rm -rf "$cache"' EXIT
if ! npm install --prefix "$dir" --cache "$cache" --no-save --no-audit --no-fund \
  --loglevel=error "@anthropic-ai/claude-code@$version" >&2; then
  echo "npm could not install @anthropic-ai/claude-code@$version" >&2
  exit 4
fi
if ! "$bin" --version >/dev/null 2>&1; then
  echo "@anthropic-ai/claude-code@$version installed, but $bin does not start" >&2
  exit 4
fi
printf '%s\n' "$bin"
