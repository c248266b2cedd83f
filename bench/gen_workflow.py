#!/usr/bin/env python3
"""Print a standard Prodigy workflow with N steps to stdout.

Usage: gen_workflow.py N

Every step uses only fields defined in docs/language.md §2-5: a `shell`
command, `id`, `capture`, `timeout`, `retry_config` (attempts, backoff,
initial_delay, max_delay) and the advanced `on_failure` form (shell,
max_attempts, fail_workflow).  From step 1 on, each command interpolates the
previous step's capture, so the checker has to resolve N references to
earlier captures.  The output is deterministic for a given N.
"""

import sys

# Small, deterministic variations so the steps are not all identical.
SUBCOMMANDS = ("build", "test", "check")
BACKOFFS = ("exponential", "fixed", "fibonacci")  # plain-string forms (docs/language.md §0.3, §4)

STEP = """\
  - shell: "{command}"
    id: step-{i}
    capture: out_{i}
    timeout: {timeout}s
    retry_config:
      attempts: {attempts}
      backoff: {backoff}
      initial_delay: 1s
      max_delay: 30s
    on_failure:
      shell: 'echo "step {i} failed: ${{shell.stderr|shell}} (exit ${{shell.exit_code}})" >&2'
      max_attempts: 2
      fail_workflow: false
"""


def step(i: int) -> str:
    command = f"cargo {SUBCOMMANDS[i % 3]} --bin app-{i} --target ${{TARGET}}"
    if i > 0:
        command += f" && echo ${{out_{i - 1}|shell}}"
    return STEP.format(
        i=i,
        command=command,
        timeout=30 + 10 * (i % 4),
        attempts=2 + i % 3,
        backoff=BACKOFFS[i % 3],
    )


def main(argv: list) -> int:
    if len(argv) != 2:
        print("usage: gen_workflow.py N", file=sys.stderr)
        return 2
    try:
        n = int(argv[1])
    except ValueError:
        n = -1
    if n < 1:
        print(f"gen_workflow.py: N must be a positive integer, got {argv[1]!r}",
              file=sys.stderr)
        return 2

    out = sys.stdout
    out.write(f"name: generated-{n}\n")
    out.write("env:\n  TARGET: release\n")
    out.write("commands:\n")
    for i in range(n):
        out.write(step(i))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
