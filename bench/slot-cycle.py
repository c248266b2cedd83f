#!/usr/bin/env python3
"""CPU time of the git commands of one pooled slot's item cycle, by command, median of ROUNDS.

Usage: python3 bench/slot-cycle.py REPO [ROUNDS]

In two throwaway worktrees of REPO's HEAD (made under a temporary directory, removed at
the end), both made as prodigy makes a pooled slot's (`index.version=4`,
`core.untrackedCache=true`), each round runs what a slot costs per item: `git clean -ffdxq`,
the move to a new branch at the job's merged work, the agent's `git add` + `git commit` of
one new file, and the `git status --porcelain` after it; the agent's commit is then merged
into the merged work without a checkout (`git merge-tree --write-tree` + `commit-tree`), as
prodigy merges, so that each move brings the other slot's files. One slot moves the way
prodigy did before (`git switch -c BRANCH BASE`, which stats every file of the index
first), the other the way it does now (`git switch -c BRANCH` at its commit, then
`git reset --keep BASE`). It prints the median CPU milliseconds (user + system) of each
command for both. CPU time, unlike wall time, hardly moves with the load of a shared
machine; it says what each command costs, not how long a job waits for it.
"""
import os
import resource
import statistics
import subprocess
import sys
import tempfile

repo = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 12
os.environ.update(
    GIT_CONFIG_GLOBAL="/dev/null",
    GIT_CONFIG_NOSYSTEM="1",
    GIT_AUTHOR_NAME="bench",
    GIT_AUTHOR_EMAIL="bench@example.invalid",
    GIT_COMMITTER_NAME="bench",
    GIT_COMMITTER_EMAIL="bench@example.invalid",
)


def cpu_ms(args, cwd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000


def out(args, cwd):
    return subprocess.check_output(args, cwd=cwd, text=True).strip()


merged = out(["git", "rev-parse", "HEAD"], repo)
prefix = f"slot-cycle-{os.getpid()}"
moves = {
    "switch -c BRANCH BASE": lambda path, branch, base: cpu_ms(["git", "switch", "-q", "-c", branch, base], path),
    "switch -c + reset --keep": lambda path, branch, base: cpu_ms(["git", "switch", "-q", "-c", branch], path)
    + cpu_ms(["git", "reset", "-q", "--keep", base], path),
}
with tempfile.TemporaryDirectory() as tmp:
    slots = {}
    for n, kind in enumerate(moves):
        path = os.path.join(tmp, f"slot-{n}")
        subprocess.run(["git", "worktree", "add", "-q", "--no-checkout", "--detach", path, merged], cwd=repo, check=True)
        subprocess.run(["git", "-c", "index.version=4", "-c", "core.untrackedCache=true", "reset", "-q", "--hard"], cwd=path, check=True)
        os.makedirs(os.path.join(path, "items"), exist_ok=True)
        slots[kind] = (path, {"clean": [], "move": [], "add + commit": [], "status": []})
    try:
        for r in range(rounds):
            for n, (kind, (path, spent)) in enumerate(slots.items()):
                spent["clean"].append(cpu_ms(["git", "clean", "-ffdxq"], path))
                spent["move"].append(moves[kind](path, f"{prefix}-{n}-{r}", merged))
                with open(os.path.join(path, "items", f"{prefix}-{n}-{r}.txt"), "w") as f:
                    f.write(f"{r}\n")
                spent["add + commit"].append(cpu_ms(["sh", "-c", "git add items && git commit -q -m item"], path))
                spent["status"].append(cpu_ms(["git", "status", "--porcelain"], path))
                head = out(["git", "rev-parse", "HEAD"], path)
                tree = out(["git", "merge-tree", "--write-tree", merged, head], path).splitlines()[0]
                merged = out(["git", "commit-tree", tree, "-p", merged, "-p", head, "-m", "merge"], path)
        print(f"CPU ms per command, median of {rounds} rounds (load {os.getloadavg()[0]:.1f}):")
        for kind, (_, spent) in slots.items():
            total = sum(statistics.median(v) for v in spent.values())
            print(f"  {kind:26}" + "  ".join(f"{k} {statistics.median(v):6.1f}" for k, v in spent.items()) + f"  sum {total:6.1f}")
    finally:
        for path, _ in slots.values():
            subprocess.run(["git", "worktree", "remove", "--force", path], cwd=repo, check=False)
        branches = out(["git", "for-each-ref", "--format=%(refname:short)", f"refs/heads/{prefix}-*"], repo).split()
        if branches:
            subprocess.run(["git", "branch", "-q", "-D", *branches], cwd=repo, check=False)
