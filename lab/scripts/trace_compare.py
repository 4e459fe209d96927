#!/usr/bin/env python3
"""trace_compare.py — a measured call and coll-sim's prediction of it, step by step.

  lab/scripts/trace_compare.py REAL.json SIM.json [--calls A:B]

REAL.json: COLL_TRACE's file from a coll-bench run of one case (one collective, one size:
-b = -e); SIM.json: `coll-sim --trace` of the same case.  For every rank and every step
of its plan (in the order the executor runs them) it prints the median span over the
chosen calls in both: from the end of the rank's previous step (or the start of its
call) to the end of this one, so a span is the step's wait plus its work, as the
executor's trace records it.  The simulated work alone is printed beside it.  A step
whose measured span is longer than the simulated one while its input was there when it
started (a first send, say) is an operation the model prices too low.

--calls A:B takes each rank's calls A to B-1 of the case, in time order (default: the
last 20).  coll-bench runs, per placement, -w warm-up calls, -n timed ones and (-c 1)
one check, out of place first: with `-w 3 -n 20` the timed out-of-place calls are
--calls 3:23 (what coll-sim predicts), the in-place ones --calls 27:47.  From SIM.json
the last B-A calls of each rank are taken (`coll-sim --loop 20`, or `--calls C
--warmup W`).  Only the calls of the largest element count are read, and no
point-to-point call or barrier, so coll-bench's own calls (its barriers, the all-reduce
of its timings, the size check) drop out.

Must never: run anything; it reads two files.
"""
import collections
import json
import statistics
import sys


def real_steps(path, first, end):
    ev = json.load(open(path))["traceEvents"]
    calls = [e for e in ev if e.get("cat") == "call"
             and e["name"].split()[0] not in ("send", "recv", "barrier")]
    count = max(e["args"].get("count", 0) for e in calls)
    calls = [e for e in calls if e["args"].get("count") == count]
    steps = collections.defaultdict(list)
    for e in ev:
        if e.get("cat") == "step":
            steps[(e["pid"], e["args"]["call"])].append(e)
    per_rank = collections.defaultdict(list)
    for c in calls:
        per_rank[c["pid"]].append(c)
    spans, call_us = collections.defaultdict(list), collections.defaultdict(list)
    for r, cs in per_rank.items():
        for c in sorted(cs, key=lambda e: e["ts"])[first:end]:
            call_us[r].append(c["dur"])
            prev = c["ts"]
            for i, s in enumerate(sorted(steps[(r, c["name"])], key=lambda e: e["ts"])):
                t = s["ts"] + s["dur"]
                spans[(r, i)].append((s["name"].split(" c")[0], t - prev))
                prev = t
    return spans, call_us


def sim_steps(path, last):
    ev = json.load(open(path))["traceEvents"]
    ops, calls = collections.defaultdict(list), collections.defaultdict(list)
    for e in ev:  # track 0: calls, 1: operations (2: time on a core, not used here)
        if e.get("ph") == "X" and e["tid"] == 0:
            calls[e["pid"]].append(e)
        elif e.get("ph") == "X" and e["tid"] == 1:
            ops[e["pid"]].append(e)
    spans, call_us = collections.defaultdict(list), collections.defaultdict(list)
    for r, cs in calls.items():
        for c in sorted(cs, key=lambda e: e["ts"])[-last:]:
            call_us[r].append(c["dur"])
            inside = [e for e in ops[r] if c["ts"] - 1e-6 <= e["ts"] <= c["ts"] + c["dur"]]
            first = {}  # a step's slices: from its first slice's start to its last's end
            for e in sorted(inside, key=lambda e: e["ts"]):
                k = e["args"]["step"]
                if k not in first:
                    first[k] = [e["ts"], e["ts"] + e["dur"], e["name"], 0.0]
                first[k][1] = e["ts"] + e["dur"]
                first[k][3] += e["dur"]
            prev = c["ts"]
            for i, (_, (a, b, name, work)) in enumerate(sorted(first.items(), key=lambda kv: kv[1][0])):
                spans[(r, i)].append((name, b - prev, work))
                prev = b
    return spans, call_us


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    first, end = -20, None
    if "--calls" in argv:
        a, b = argv[argv.index("--calls") + 1].split(":")
        first, end = int(a), int(b)
    real, rcall = real_steps(argv[1], first, end)
    sim, scall = sim_steps(argv[2], 20 if end is None else end - first)
    med = statistics.median
    print("| rank | step | measured: span µs (median) | predicted: span µs | of it, work µs |")
    print("|---|---|---|---|---|")
    for r in sorted(rcall):
        print(f"| {r} | the call | {med(rcall[r]):.2f} | {med(scall[r]) if scall.get(r) else float('nan'):.2f} | |")
        for (rr, i) in sorted(k for k in real if k[0] == r):
            name = real[(rr, i)][0][0]
            s = sim.get((rr, i), [])
            if s and s[0][0] != name:
                name += f" (predicted: {s[0][0]})"
            ps = f"{med(x[1] for x in s):.2f}" if s else "-"
            pw = f"{med(x[2] for x in s):.2f}" if s else "-"
            print(f"| {r} | {i}: {name} | {med(x[1] for x in real[(rr, i)]):.2f} | {ps} | {pw} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
