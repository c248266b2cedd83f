#!/usr/bin/env bash
# What a MapReduce job costs per item in a big repository: a generated repository of FILES
# files (default 20,000 of about 7.5 kB, a 150 MB checkout; set FILES=2000 for the small
# one), N items (default 200) at `max_parallel: 4`, each agent writing one small file and
# committing it, its commit merged into the session's work, the session merged back into
# `main`; side by side in one run, alternating, median and spread of RUNS runs, once as a
# first job (the agents' worktrees checked out, then removed) and once with
# `worktree.persist` (the agents' worktrees the last such job kept), against
#   - a serial shell loop making the same N commits one after another in the checkout, and
#   - a serial shell loop doing per item `git worktree add`, the commit, `git merge` into
#     the checkout, `git worktree remove` and `git branch -D`,
# then the peak memory (max RSS of the biggest process) of one run of each.
#
# Usage: bash bench/big-repo.sh
#   PROFILE=1 FILES=20000 bash bench/big-repo.sh
#   PRODIGY_BIN=/path/to/prodigy FILES=2000 N=200 RUNS=3 SETTLE=65 bash bench/big-repo.sh
# WT_N (default N) runs the worktree loop on fewer items: each of its items checks out the
# whole tree, seconds apiece at 20,000 files; its per-item figure is what compares then.
# PROFILE=1 runs one prodigy job instead, with `git` on PATH replaced by a wrapper that
# notes each git process's CPU (its own and the agents'), and prints the CPU per kind of git
# command, with the job's total; nothing is timed against the loops then.
# Disk: about 4 x the checkout while it runs (the repository and prodigy's 4 agent
# worktrees), removed at the end.
set -euo pipefail

FILES="${FILES:-20000}"
N="${N:-200}"
RUNS="${RUNS:-3}"
WT_N="${WT_N:-$N}"

# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" big-repo
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@example.invalid
export GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@example.invalid
export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1

mkdir -p "$TMP/project" "$TMP/home"
echo "generating a repository of $FILES files ..."
python3 - "$TMP/project" "$FILES" <<'PY'
import os, random, sys
root, files = sys.argv[1], int(sys.argv[2])
rng = random.Random(28)
for i in range(files):
    d = os.path.join(root, "src", f"d{i // 100:03}")
    os.makedirs(d, exist_ok=True)
    # Half random hex, half repeated text: compresses about 2:1, as source does.
    body = rng.randbytes(1900).hex() + ("let x = %d;\n" % i) * 300
    with open(os.path.join(d, f"f{i}.rs"), "w") as f:
        f.write(body)
PY
(
    cd "$TMP/project"
    git init -q -b main
    printf 'target/\n' >.gitignore
    mkdir items && touch items/.keep
    git add -A && git -c gc.auto=0 commit -q -m base && git gc -q
)
echo "checkout $(du -sh --exclude=.git "$TMP/project" | cut -f1), .git $(du -sh "$TMP/project/.git" | cut -f1)"

# Each run's items write new files, so that every run has N commits to make. A second
# argument `persist` adds `worktree: {persist: true}`: the job takes the agent worktrees
# the last such job kept, and keeps its own for the next.
job() {
    local worktree=""
    [[ "${2:-}" == persist ]] && worktree=$'worktree:\n  persist: true'
    cat >"$TMP/job.yml" <<YAML
mode: mapreduce
$worktree
map:
  input: "seq 1 $N"
  max_parallel: 4
  agent_template:
    - shell: "echo \$ITEM > items/p-$1-\$ITEM.txt && git add items && git commit -q -m \"item \$ITEM\""
      commit_required: true
YAML
}

if [[ "${PROFILE:-}" == 1 ]]; then
    [[ -x /usr/bin/time ]] || { echo "PROFILE=1 needs /usr/bin/time" >&2; exit 1; }
    mkdir -p "$TMP/shim"
    real_git=$(command -v git)
    # `times` prints the shell's children's CPU: the one git process it ran.
    cat >"$TMP/shim/git" <<SH
#!/usr/bin/env bash
"$real_git" "\$@"
rc=\$?
times >"$TMP/shim/times.\$\$"
mapfile -t t <"$TMP/shim/times.\$\$"
rm -f "$TMP/shim/times.\$\$"
printf '%s\t%s\n' "\${t[1]}" "\$*" >>"$TMP/git-cpu.log"
exit \$rc
SH
    chmod +x "$TMP/shim/git"
    job 1
    (cd "$TMP/project" && PATH="$TMP/shim:$PATH" PRODIGY_HOME="$TMP/home" \
        /usr/bin/time -f '%e %U %S' -o "$TMP/total" "$BIN" run -y "$TMP/job.yml" >/dev/null 2>"$TMP/err") ||
        { cat "$TMP/err" >&2; exit 1; }
    read -r wall user sys <"$TMP/total"
    python3 - "$TMP/git-cpu.log" "$N" "$wall" "$user" "$sys" <<'PY'
import collections, re, sys
log, n = sys.argv[1], int(sys.argv[2])
wall, user, sys_ = (float(x) for x in sys.argv[3:6])
rows = collections.defaultdict(lambda: [0, 0.0])
def seconds(t):
    m, s = re.fullmatch(r"(\d+)m([\d.]+)s", t).groups()
    return 60 * int(m) + float(s)
for line in open(log):
    times, args = line.rstrip("\n").split("\t", 1)
    user_t, sys_t = times.split()
    words = args.split()
    while words and words[0] in ("-c", "--no-optional-locks"):
        words = words[2:] if words[0] == "-c" else words[1:]
    # The command and its first options (`reset -q --keep` and `reset -q --hard` apart).
    kind = words[:2] if words[:1] == ["worktree"] else words[:1]
    for word in words[len(kind) : len(kind) + 2]:
        if not word.startswith("-"):
            break
        kind.append(word)
    kind = " ".join(kind)
    rows[kind][0] += 1
    rows[kind][1] += seconds(user_t) + seconds(sys_t)
total = sum(r[1] for r in rows.values())
print(f"one job of {n} items: {wall:.1f} s wall, {user + sys_:.1f} s CPU (all processes); git {total:.1f} s")
print(f"{'git command':34} {'calls':>6} {'CPU s':>7} {'ms/call':>8} {'ms/item':>8}")
for kind, (calls, cpu) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
    print(f"{kind:34} {calls:6} {cpu:7.2f} {1000 * cpu / calls:8.1f} {1000 * cpu / n:8.1f}")
PY
    exit 0
fi

run=0
time_prodigy() { run=$((run + 1)); job "$run"; time_run "$TMP/job.yml" -y; }
time_persist() { run=$((run + 1)); job "$run" persist; time_run "$TMP/job.yml" -y; }
time_serial() {
    local start end
    run=$((run + 1))
    start=$(now_ns)
    (
        cd "$TMP/project"
        for i in $(seq 1 "$N"); do
            echo "$i" >"items/s-$run-$i.txt"
            git add items && git commit -q -m "item $i"
        done
    )
    end=$(now_ns)
    echo $(((end - start) / 1000))
}
time_worktrees() {
    local start end wt="$TMP/wt"
    run=$((run + 1))
    start=$(now_ns)
    (
        cd "$TMP/project"
        for i in $(seq 1 "$WT_N"); do
            git worktree add -q -b "w-$run-$i" "$wt" HEAD
            (cd "$wt" && echo "$i" >"items/w-$run-$i.txt" && git add items && git commit -q -m "item $i")
            git merge -q --no-ff -m "merge $i" "w-$run-$i"
            git worktree remove --force "$wt"
            git branch -q -D "w-$run-$i"
        done
    )
    end=$(now_ns)
    echo $(((end - start) / 1000))
}

# Median, minimum and maximum of each, in seconds.
RUNS_OUT="$TMP/runs"
mkdir -p "$RUNS_OUT"
# Before each timed run, the disk is flushed and SETTLE seconds (default 6) pass: on ext4
# without a journal, a new file skips every inode freed in the last minute or so (60 s on
# Linux 6.x; 5 minutes while their table block is not yet written back), one look each, so
# that a run right after one that deleted whole checkouts (a first job removes its five)
# pays seconds for it in every file it makes. Set SETTLE=65 there.
settle() { sync; sleep "${SETTLE:-6}"; }
# The warm-up round also leaves the spares the first timed `persist` run takes.
for f in time_prodigy time_persist time_serial time_worktrees; do settle; "$f" >/dev/null; done
for ((r = 0; r < RUNS; r++)); do
    for f in time_prodigy time_persist time_serial time_worktrees; do settle; "$f" >>"$RUNS_OUT/$f"; done
done
stats() { sort -n "$RUNS_OUT/$1" | awk '{a[NR] = $1} END {printf "%.2f %.2f %.2f\n", a[int((NR + 1) / 2)] / 1e6, a[1] / 1e6, a[NR] / 1e6}'; }
read -r pm plo phi < <(stats time_prodigy)
read -r km klo khi < <(stats time_persist)
read -r sm slo shi < <(stats time_serial)
read -r wm wlo whi < <(stats time_worktrees)

commits=$(git -C "$TMP/project" log --oneline --grep '^item ' | wc -l)
expected=$(((N * 3 + WT_N) * (RUNS + 1)))
[[ "$commits" -eq "$expected" ]] || { echo "expected $expected item commits on main, found $commits" >&2; ls "$TMP/project/items" | cut -c1-2 | sort | uniq -c >&2; git -C "$TMP/project" log --oneline -5 >&2; exit 1; }

peak() { /usr/bin/time -f '%M' -o "$TMP/rss" "$@" >/dev/null 2>&1; echo $(($(cat "$TMP/rss") / 1024)); }
if command -v /usr/bin/time >/dev/null; then
    run=$((run + 1))
    job "$run"
    mp=$(cd "$TMP/project" && PRODIGY_HOME="$TMP/home" peak "$BIN" run -y "$TMP/job.yml")
    run=$((run + 1))
    ms=$(peak bash -c "$(declare -f time_serial); run=$run; N=$N; TMP=$TMP; now_ns() { date +%s%N; }; time_serial")
    run=$((run + 1))
    mw=$(peak bash -c "$(declare -f time_worktrees); run=$run; WT_N=$WT_N; TMP=$TMP; now_ns() { date +%s%N; }; time_worktrees")
else
    mp="?" ms="?" mw="?"
fi

awk -v files="$FILES" -v n="$N" -v wn="$WT_N" -v runs="$RUNS" \
    -v pm="$pm" -v plo="$plo" -v phi="$phi" -v km="$km" -v klo="$klo" -v khi="$khi" -v sm="$sm" -v slo="$slo" -v shi="$shi" \
    -v wm="$wm" -v wlo="$wlo" -v whi="$whi" -v mp="$mp" -v ms="$ms" -v mw="$mw" 'BEGIN {
    printf "%d files, each item one commit; median (min-max) of %d runs, per item, peak RSS:\n", files, runs
    printf "  prodigy, %d items, max_parallel 4:        %7.2f s (%.2f-%.2f) %7.1f ms/item  %s MB\n", n, pm, plo, phi, pm * 1000 / n, mp
    printf "  prodigy, worktree.persist (the last job'"'"'s spares): %7.2f s (%.2f-%.2f) %7.1f ms/item\n", km, klo, khi, km * 1000 / n
    printf "  serial git commit, %d items, one checkout: %7.2f s (%.2f-%.2f) %7.1f ms/item  %s MB\n", n, sm, slo, shi, sm * 1000 / n, ms
    printf "  serial worktree add/commit/merge/remove, %d items: %7.2f s (%.2f-%.2f) %7.1f ms/item  %s MB\n", wn, wm, wlo, whi, wm * 1000 / wn, mw
    printf "  per item, prodigy / serial commits: %.2f; prodigy / worktree loop: %.2f\n", (pm / n) / (sm / n), (pm / n) / (wm / wn)
    printf "  per item, prodigy with worktree.persist / serial commits: %.2f\n", km / sm
}'
