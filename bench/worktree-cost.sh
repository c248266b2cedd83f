#!/usr/bin/env bash
# What worktree isolation costs per map item: N items (default 200), `max_parallel: 4`,
# each agent in its own git worktree running `true` and committing, its commit merged back
# into the session worktree (create, run, commit, merge, remove), against the same job with
# `--no-worktree` running only `true` (the engine without isolation), and against the same
# cycle as a shell script driven by `xargs -P4` the way upstream does it (`git worktree add`,
# `true`, commit, `git merge --no-ff` into a session worktree, `git worktree remove`,
# `git branch -D`; worktree administration and merges under `flock`, since unserialised
# `git worktree add` loses items), side by side in one run, alternating; median of several
# runs. The repository holds 200 small files.
#
# Usage: bash bench/worktree-cost.sh
#   PRODIGY_BIN=/path/to/prodigy N=200 RUNS=3 bash bench/worktree-cost.sh
#
# Upstream Prodigy v0.4.4's own documentation claims 14-20 ms per item at 4 parallel for
# the same cycle (a figure from upstream's docs, not measured here); only figures measured
# here, side by side, compare directly.
set -euo pipefail

N="${N:-200}"
RUNS="${RUNS:-3}"

# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" worktree-cost
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@example.invalid
export GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@example.invalid
export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1

mkdir -p "$TMP/project" "$TMP/home"
(
    cd "$TMP/project"
    git init -q -b main
    mkdir src
    for i in $(seq 1 200); do echo "fn f$i() {}" >"src/f$i.rs"; done
    git add -A && git commit -q -m base
)
cat >"$TMP/isolated.yml" <<YAML
mode: mapreduce
map:
  input: "seq 1 $N"
  max_parallel: 4
  agent_template:
    - shell: "true"
    - shell: "git commit -q --allow-empty -m \"item \$ITEM\""
      commit_required: true
YAML
cat >"$TMP/in-place.yml" <<YAML
mode: mapreduce
map:
  input: "seq 1 $N"
  max_parallel: 4
  agent_template:
    - shell: "true"
YAML

# The naive cycle, per item: its own worktree from the session branch, `true`, a commit,
# a merge into the session worktree, removal.
cat >"$TMP/item.sh" <<'SH'
set -e
item="$1"; repo="$2"; session="$3"; wt="$4/item-$item"; br="naive-$item"
flock "$repo/.git/naive.lock" git -C "$repo" worktree add -q -b "$br" "$wt" naive-session
(cd "$wt" && true && git commit -q --allow-empty -m "item $item")
flock "$repo/.git/naive.lock" git -C "$session" merge -q --no-ff -m "merge $item" "$br"
flock "$repo/.git/naive.lock" git -C "$repo" worktree remove --force "$wt"
flock "$repo/.git/naive.lock" git -C "$repo" branch -q -D "$br"
SH
time_naive() {
    local start end session="$TMP/naive-session"
    (cd "$TMP/project" && git worktree add -q -b naive-session "$session" HEAD)
    mkdir -p "$TMP/naive"
    start=$(now_ns)
    seq 1 "$N" | xargs -P4 -I{} sh "$TMP/item.sh" {} "$TMP/project" "$session" "$TMP/naive"
    end=$(now_ns)
    local merged
    merged=$(git -C "$session" log --oneline --grep '^item ' main..naive-session | wc -l)
    [[ "$merged" -eq "$N" ]] || { echo "naive cycle: $merged of $N commits merged" >&2; exit 1; }
    (cd "$TMP/project" && git worktree remove --force "$session" && git branch -q -D naive-session)
    echo $(((end - start) / 1000))
}

time_isolated() { time_run "$TMP/isolated.yml" -y; }
time_in_place() { time_run "$TMP/in-place.yml" --no-worktree; }
read -r iso base shell < <(alternate time_isolated time_in_place time_naive)
# Every run, warm-up included, brought all its items' commits to main.
commits=$(cd "$TMP/project" && git log --oneline --grep '^item ' | wc -l)
[[ "$commits" -eq $((N * (RUNS + 1))) ]] || { echo "expected $((N * (RUNS + 1))) item commits on main, found $commits" >&2; exit 1; }
awk -v n="$N" -v iso="$iso" -v base="$base" -v shell="$shell" 'BEGIN {
    printf "%d items, 4 at a time, median of runs:\n", n
    printf "  prodigy, a worktree per agent (get, true, commit, merge): %8.1f ms total, %6.2f ms/item\n", iso / 1000, iso / 1000 / n
    printf "  the same cycle as a shell script under xargs -P4:         %8.1f ms total, %6.2f ms/item\n", shell / 1000, shell / 1000 / n
    printf "  prodigy --no-worktree, true only:                         %8.1f ms total, %6.2f ms/item\n", base / 1000, base / 1000 / n
    printf "  prodigy / shell cycle: %.2f; isolation adds %.2f ms per item to the bare engine\n", iso / shell, (iso - base) / 1000 / n
}'
echo "every item's commit reached main: $commits commits over $((RUNS + 1)) runs (one a warm-up)"
