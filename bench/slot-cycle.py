#!/usr/bin/env python3
"""CPU time of the git commands of one pooled slot's item cycle, by command, median of ROUNDS.

Usage: python3 bench/slot-cycle.py REPO [ROUNDS]

In two throwaway worktrees of REPO's HEAD (made under a temporary directory, removed at
the end), one with git's default index, one as prodigy makes a pooled slot's
(`index.version=4`, `core.untrackedCache=true`), each round runs what a slot costs per item:
`git clean -ffdxq`, `git switch -c` to a new branch at HEAD, the agent's `git add` +
`git commit` of one new file, and the `git status --porcelain` after it. It prints the
median CPU milliseconds (user + system) of each command for both. CPU time, unlike wall
time, hardly moves with the load of a shared machine; it says what each command costs, not
how long a job waits for it.
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


base = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=repo, text=True).strip()
kinds = {"default index": [], "v4 + untracked cache": ["-c", "index.version=4", "-c", "core.untrackedCache=true"]}
with tempfile.TemporaryDirectory() as tmp:
    slots = {}
    for n, (kind, config) in enumerate(kinds.items()):
        path = os.path.join(tmp, f"slot-{n}")
        subprocess.run(["git", "worktree", "add", "-q", "--no-checkout", "--detach", path, base], cwd=repo, check=True)
        subprocess.run(["git", *config, "reset", "-q", "--hard"], cwd=path, check=True)
        os.makedirs(os.path.join(path, "items"), exist_ok=True)
        slots[kind] = (path, {"clean": [], "switch": [], "add + commit": [], "status": []})
    try:
        for r in range(rounds):
            for n, (path, spent) in enumerate(slots.values()):
                spent["clean"].append(cpu_ms(["git", "clean", "-ffdxq"], path))
                spent["switch"].append(cpu_ms(["git", "switch", "-q", "-c", f"slot-cycle-{os.getpid()}-{n}-{r}", base], path))
                with open(os.path.join(path, "items", f"slot-cycle-{r}.txt"), "w") as f:
                    f.write(f"{r}\n")
                spent["add + commit"].append(cpu_ms(["sh", "-c", "git add items && git commit -q -m item"], path))
                spent["status"].append(cpu_ms(["git", "status", "--porcelain"], path))
        print(f"CPU ms per command, median of {rounds} rounds (load {os.getloadavg()[0]:.1f}):")
        for kind, (_, spent) in slots.items():
            print(f"  {kind:22}" + "  ".join(f"{k} {statistics.median(v):6.1f}" for k, v in spent.items()))
    finally:
        for n, (path, _) in enumerate(slots.values()):
            subprocess.run(["git", "worktree", "remove", "--force", path], cwd=repo, check=False)
        branches = subprocess.check_output(
            ["git", "for-each-ref", "--format=%(refname:short)", f"refs/heads/slot-cycle-{os.getpid()}-*"], cwd=repo, text=True
        ).split()
        if branches:
            subprocess.run(["git", "branch", "-q", "-D", *branches], cwd=repo, check=False)
