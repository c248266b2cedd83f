#!/usr/bin/env python3
"""A Slurm slot's turn as slurmctld saw it, from a slice of its log (info level).

Usage: python3 bench/slurm-turns.py LOG_SLICE [LABEL]

Reads the allocations (`sched: Allocate JobId=...`, or the backfill scheduler's `Started`)
and the `_job_complete: JobId=... done` lines (timestamps to the millisecond), and prints,
as medians over the tasks of the slice:
- run: the controller allocating a task until it learnt that the task ended (the launch,
  the prolog, the batch script and the task's own work, the completion message);
- wait: the last task that ended before an allocation, until that allocation (the
  controller's scheduling: a freed slot's next task starting).
A slot's turn is about run + wait. Both sides of bench/slurm-vs-sbatch.sh run on the same
controller, so what differs between them is what their tasks do and how they are queued.
"""
import re
import statistics
import sys
from datetime import datetime

STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\] (.*)$")
# The main scheduler says `sched: Allocate JobId=...`, the backfill one
# `sched/backfill: _start_job: Started JobId=...`.
ALLOCATE = re.compile(r"sched: Allocate JobId=(\S+)|sched/backfill: _start_job: Started JobId=(\S+)")
COMPLETE = re.compile(r"_job_complete: JobId=(\S+) done")


def ms(stamp):
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f").timestamp() * 1000


events = []
with open(sys.argv[1], encoding="utf-8", errors="replace") as log:
    for line in log:
        m = STAMP.match(line)
        if not m:
            continue
        at, text = ms(m.group(1)), m.group(2)
        if a := ALLOCATE.search(text):
            events.append((at, "allocate", a.group(1) or a.group(2)))
        elif c := COMPLETE.search(text):
            events.append((at, "complete", c.group(1)))

allocated, runs, waits, last_complete = {}, [], [], None
for at, kind, job in events:
    if kind == "allocate":
        allocated[job] = at
        if last_complete is not None:
            waits.append(at - last_complete)
    else:
        if job in allocated:
            runs.append(at - allocated.pop(job))
        last_complete = at

label = sys.argv[2] if len(sys.argv) > 2 else "slice"


def med(values):
    return f"{statistics.median(values):6.1f}" if values else "     -"


print(f"  {label:<27} {med(runs)} {med(waits)}   ({len(runs)} tasks)")
