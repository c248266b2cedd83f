#!/usr/bin/env python3
"""Print a JSON document {"items": [...]} with N pseudo-random work items (stdlib only)."""
import json
import random
import sys


def main() -> int:
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        print("usage: gen_items.py N", file=sys.stderr)
        return 2
    n = int(sys.argv[1])
    rng = random.Random(42)
    severities = ["low", "medium", "high", "critical"]
    out = sys.stdout
    out.write('{"items": [')
    for i in range(n):
        item = {
            "id": i,
            "score": rng.randint(0, 100),
            "severity": severities[rng.randrange(4)],
            "file": f"src/module_{i % 997}/file_{i}.rs",
        }
        if i:
            out.write(",")
        out.write(json.dumps(item, separators=(",", ":")))
    out.write("]}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
