#!/usr/bin/env bash
# Filter plus sort over N map items: `prodigy items` against jq doing the same
# `select(...) | sort_by(...)`, side by side in one run. Reports medians and the ratio.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
n=${N:-1000000}
runs=${RUNS:-3}

if [ -z "${PRODIGY_BIN:-}" ]; then
  (cd "$root" && cargo build --release --locked -q)
  PRODIGY_BIN="$root/target/release/prodigy"
fi
if ! command -v jq >/dev/null 2>&1; then
  echo "installing jq (Debian package)" >&2
  apt-get install -y -qq jq >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq jq >/dev/null; }
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$here/gen_items.py" "$n" > "$tmp/items.json"
cat > "$tmp/wf.yml" <<YAML
name: bench-filter-sort
mode: mapreduce
map:
  input: items.json
  json_path: "\$.items[*]"
  filter: "score > 50 && severity == 'high'"
  sort_by: "score DESC, id"
  agent_template:
    - shell: "true"
YAML

prodigy_cmd=("$PRODIGY_BIN" items "$tmp/wf.yml")
jq_cmd=(jq -c '[.items[] | select(.score > 50 and .severity == "high")] | sort_by(-.score, .id) | .[]' "$tmp/items.json")

# Both must select the same items in the same order.
"${prodigy_cmd[@]}" 2>/dev/null > "$tmp/prodigy.out"
"${jq_cmd[@]}" > "$tmp/jq.out"
if ! cmp -s "$tmp/prodigy.out" "$tmp/jq.out"; then
  echo "error: prodigy and jq disagree on the selected items" >&2
  exit 1
fi

median_ms() {
  local times=() t0 t1
  for _ in $(seq "$runs"); do
    t0=$(date +%s%N)
    "$@" > /dev/null 2>&1
    t1=$(date +%s%N)
    times+=($(( (t1 - t0) / 1000000 )))
  done
  printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

size=$(du -h "$tmp/items.json" | cut -f1)
kept=$(wc -l < "$tmp/prodigy.out")
p=$(median_ms "${prodigy_cmd[@]}")
j=$(median_ms "${jq_cmd[@]}")
echo "items: $n ($size), kept after filter: $kept, median of $runs runs"
echo "prodigy items:   ${p} ms"
echo "jq:              ${j} ms"
awk -v p="$p" -v j="$j" 'BEGIN { printf "ratio prodigy/jq: %.3f (below 1 means prodigy is faster)\n", p / j }'
