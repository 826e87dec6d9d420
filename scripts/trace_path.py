#!/usr/bin/env python3
"""Where a step's time goes on its critical path, from a `kiln profile --trace FILE` timeline.

Kernels launched with PDL overlap (the next one starts while the one before finishes), so their
durations do not add up to the step. Walking the kernels in start order, each is charged the time
from the later of its own start and the previous kernels' latest end to its own end: the part of
the step it alone held up. Prints, per kernel name, the count, the median and the sum of that
share, and the step's span.
    scripts/trace_path.py TRACE.json [...]
"""
import json
import statistics
import sys


def critical_path(path):
    with open(path) as f:
        doc = json.load(f)
    events = sorted((e for e in doc["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
    shares, latest = {}, 0.0
    for e in events:
        start, end = e["ts"], e["ts"] + e["dur"]
        shares.setdefault(e["name"], []).append(max(0.0, end - max(latest, start)))
        latest = max(latest, end)
    return shares, latest - (events[0]["ts"] if events else 0.0)


def main():
    for path in sys.argv[1:]:
        shares, span = critical_path(path)
        print(f"{path}: step span {span:.1f} us")
        print(f"  {'kernel':28s} {'n':>4s} {'median us':>10s} {'sum us':>9s}")
        for name, v in shares.items():
            print(f"  {name:28s} {len(v):4d} {statistics.median(v):10.2f} {sum(v):9.1f}")


if __name__ == "__main__":
    main()
