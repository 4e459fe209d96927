#!/usr/bin/env python3
"""pp_trace_picture.py — the measured pipeline, drawn as `coll-train --explain` draws the
schedule: one row per stage, one cell per time slot, the compute action running at the
start of each slot (F3, B0, W2) or '..' while the stage waits.

    coll-train --pp 2 --micro-batches 4 --steps 3 --trace run.json ...
    libtrain/tools/pp_trace_picture.py run.json [--step K] [--slot-us US]

It reads the compute track (tid 0) of each rank in coll-train's Chrome-trace JSON, takes
optimizer step K (default: the last; a step ends at its "optimizer" slice) and, unless
--slot-us says otherwise, one slot = the median forward's duration, so that a schedule
whose backward costs twice its forward looks like the picture's F = 1, B = 2. It prints
the measured idle fraction (time not in F/B/W over the time in them, the largest over the
stages) the way --explain prints the lists'. It only reads the file.
"""
import argparse
import json
import re
import statistics
import sys

ACTION = re.compile(r"^([FBW])(\d+)('?)$")


def steps_of(events):
    """The rank's compute slices split into optimizer steps (each ends at 'optimizer')."""
    steps, cur = [], []
    for e in sorted(events, key=lambda e: e["ts"]):
        if e["name"] == "optimizer":
            steps.append(cur)
            cur = []
        elif ACTION.match(e["name"]):
            cur.append(e)
    return steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--step", type=int, default=-1, help="optimizer step, from 1 (default: last)")
    ap.add_argument("--slot-us", type=float, default=0.0, help="slot width in microseconds")
    a = ap.parse_args()
    ev = [e for e in json.load(open(a.trace))["traceEvents"] if e.get("ph") == "X"]
    ranks = sorted({e["pid"] for e in ev})
    per = {}
    for r in ranks:
        st = steps_of([e for e in ev if e["pid"] == r and e.get("tid") == 0])
        if not st:
            sys.exit(f"pp_trace_picture: rank {r} has no F/B/W slices (run with --pp and --trace)")
        k = a.step - 1 if a.step > 0 else len(st) - 1
        if k >= len(st):
            sys.exit(f"pp_trace_picture: rank {r} has {len(st)} steps, not {a.step}")
        per[r] = st[k]
    fwd = [e["dur"] for r in ranks for e in per[r] if e["name"].startswith("F")]
    slot = a.slot_us or statistics.median(fwd)
    t0 = min(e["ts"] for r in ranks for e in per[r])
    t1 = max(e["ts"] + e["dur"] for r in ranks for e in per[r])
    n = int((t1 - t0) / slot + 0.999)
    worst = 0.0
    for r in ranks:
        cells = []
        for j in range(n):
            t = t0 + j * slot + slot / 2  # the middle of the slot
            hit = [e for e in per[r] if e["ts"] <= t < e["ts"] + e["dur"]]
            cells.append(hit[0]["name"][:3].ljust(2) if hit else "..")
        busy = sum(e["dur"] for e in per[r])
        idle = (t1 - t0) - busy
        worst = max(worst, idle / busy if busy else 0.0)
        print(f"{r} | " + " ".join(cells))
    print(f"measured idle fraction {worst:.3g} (slot {slot:.0f} us, step "
          f"{a.step if a.step > 0 else 'last'})")


if __name__ == "__main__":
    main()
