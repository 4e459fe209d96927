#!/usr/bin/env python3
"""trace_plot.py — draws a coll-train --trace timeline (Chrome trace-event JSON in
libcoll's trace format, see libtrain/parallel/timeline.h) as an SVG or PNG with gnuplot: per rank one
row for compute (forward and backward one box per stage, launches, exposed wait, AdamW),
one for the gradient buckets' all-reduces (launch to observed completion) and, when the
backend was libcoll, one for libcoll's calls and one per ring-schedule step (what the
progress thread actually ran, from libcoll's own records).
Usage: trace_plot.py TRACE.json OUT.svg [--step K]  (K: which optimizer step to show,
counted from 1 by the 'fwd embeddings' slices of rank 0; default: the last one).
Only reads the trace and writes OUT (via gnuplot); never changes the trace."""
import json, os, subprocess, sys, tempfile

COMPUTE, BUCKETS, LIB = 0, 1, 2


def color(e):
    n, cat = e["name"], e.get("cat", "")
    if cat == "call":
        return "0xee7733"
    if cat == "step":
        return "0xbbbbbb" if not e.get("args", {}).get("reduces") else "0x999933"
    if n.startswith("fwd"):
        return "0x66ccee"
    if n.startswith("bwd"):
        return "0x4477aa"
    if n.startswith("allreduce"):
        return "0xee6677"
    if n.startswith("wait"):
        return "0xccbb44"
    if n == "optimizer":
        return "0x228833"
    return "0xaa3377"  # launch calls


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    ev = [e for e in json.load(open(src))["traceEvents"] if e.get("ph") == "X"]
    nranks = max(e["pid"] for e in ev) + 1
    starts = sorted(e["ts"] for e in ev
                    if e["pid"] == 0 and e["name"] in ("fwd embeddings", "forward"))
    if not starts:
        sys.exit(f"{src}: no forward slices on rank 0: not a coll-train --trace file")
    k = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--step" else len(starts)
    t0 = starts[k - 1]
    # the step ends where the next forward begins; the last one with the last AdamW
    # (leaving out the end-of-run weight check)
    t1 = starts[k] if k < len(starts) else max(
        e["ts"] + e["dur"] for e in ev if e["name"] == "optimizer" or e["pid"] == 0 and
        e["tid"] == COMPUTE)
    inside = [e for e in ev if e["ts"] < t1 and e["ts"] + e["dur"] > t0]
    rows, labels = [], []
    for r in range(nranks):
        tids = sorted({e["tid"] for e in inside if e["pid"] == r} | {COMPUTE, BUCKETS})
        for tid in tids:
            y = len(labels)
            labels.append(f"rank {r} " + ("compute" if tid == COMPUTE else "buckets" if
                                          tid == BUCKETS else "libcoll calls" if tid == LIB
                                          else f"libcoll step {tid - LIB - 1}"))
            for e in inside:
                if e["pid"] == r and e["tid"] == tid:
                    a = (e["ts"] - t0) / 1e3
                    b = (e["ts"] + e["dur"] - t0) / 1e3
                    rows.append((a, b, y, color(e)))
    labels = labels[::-1]  # rank 0 on top
    top = len(labels) - 1
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "slices.dat")
        with open(data, "w") as f:
            for a, b, y, c in rows:
                f.write(f"{a:.3f} {b:.3f} {top - y} {c}\n")
        ytics = ", ".join(f'"{l}" {i}' for i, l in enumerate(labels))
        term = "pngcairo" if out.endswith(".png") else "svg"
        script = f"""set terminal {term} size 1100,{140 + 34 * len(labels)} font "sans,11"
set output "{out}"
set title "coll-train DDP, optimizer step {k} of {os.path.basename(src)}\\nlight blue forward and blue backward (a box per stage), red bucket all-reduce (launch to done), yellow exposed wait, green AdamW;\\norange libcoll's all-reduce calls, grey/olive its ring steps (olive: step reduces what it received)" noenhanced font "sans,10"
set xlabel "ms since the step's forward began (rank 0)"
set yrange [-0.7:{len(labels) - 0.3}]
set ytics ({ytics}) noenhanced
set grid x
unset key
set style fill solid 0.9 border lc rgb "black"
plot "{data}" using (($1+$2)/2):3:(($2-$1)/2):(0.35):4 with boxxyerror lc rgb variable
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)


main()
