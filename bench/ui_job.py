"""Grows a finished MapReduce job to N items, for bench/ui-100k.sh.

Usage: python3 bench/ui_job.py PRODIGY_HOME JOB_ID N

The job's events (one file) are rewritten: the lines before its first item's event, then
item 0's events repeated for items 0..N-1 (item id and agent renamed), then the lines after
its last item's event. Its items.json gets N items and its checkpoint N as the total.
"""

import json
import pathlib
import re
import shutil
import sys


def main() -> None:
    home, job, n = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    (events_dir,) = list(home.glob(f"events/*/{job}"))
    (events,) = sorted(events_dir.glob("*.jsonl"))
    lines = events.read_text().splitlines()
    with_item = [i for i, line in enumerate(lines) if '"item_id":"item_' in line]
    first, last = with_item[0], with_item[-1]
    block = [line for line in lines[first : last + 1] if '"item_id":"item_0"' in line]
    ids = re.compile(r'"item_0"|"agent-\d+"')
    with events.open("w") as out:
        for line in lines[:first]:
            out.write(line.replace('"items":3', f'"items":{n}') + "\n")
        for item in range(n):
            names = {'"item_0"': f'"item_{item}"'}
            for line in block:
                out.write(
                    ids.sub(lambda m: names.get(m.group(0), f'"agent-{item % 4}"'), line)
                    + "\n"
                )
        for line in lines[last + 1 :]:
            out.write(line + "\n")
    # The last item's step logs (its page shows their tails) are item 0's.
    (logs,) = list(home.glob(f"logs/*/{job}"))
    if n > 1:
        shutil.copytree(logs / "item_0", logs / f"item_{n - 1}", dirs_exist_ok=True)
    (job_dir,) = list(home.glob(f"state/*/mapreduce/jobs/{job}"))
    (job_dir / "items.json").write_text(json.dumps(list(range(1, n + 1))))
    checkpoint = json.loads((job_dir / "checkpoint.json").read_text())
    checkpoint["items_total"] = n
    (job_dir / "checkpoint.json").write_text(json.dumps(checkpoint))


if __name__ == "__main__":
    main()
