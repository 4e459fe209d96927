#!/usr/bin/env python3
"""trace_plot.py — draws a coll-train --trace timeline (Chrome trace-event JSON) as an SVG
with gnuplot: one row per rank and thread (compute, communication), one box per slice.
Usage: trace_plot.py TRACE.json OUT.svg [--step K]  (K: which optimizer step to show,
counted from 1 by 'forward' slices of rank 0; default: the last one).
Only reads the trace and writes OUT.svg (via gnuplot); never changes the trace."""
import json, subprocess, sys, tempfile, os

def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    ev = [e for e in json.load(open(src))["traceEvents"] if e.get("ph") == "X"]
    nranks = max(e["pid"] for e in ev) + 1
    fwd = sorted(e["ts"] for e in ev if e["pid"] == 0 and e["name"] == "forward")
    k = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--step" else len(fwd)
    t0 = fwd[k - 1]
    t1 = fwd[k] if k < len(fwd) else max(e["ts"] + e["dur"] for e in ev)
    rows, labels = [], []
    for r in range(nranks):
        for tid, tname in ((0, "compute"), (1, "comm")):
            y = len(labels)
            labels.append(f"rank {r} {tname}")
            for e in ev:
                if e["pid"] == r and e["tid"] == tid and e["ts"] < t1 and e["ts"] + e["dur"] > t0:
                    a = (e["ts"] - t0) / 1e3
                    b = (e["ts"] + e["dur"] - t0) / 1e3
                    n = e["name"]
                    color = ("0x4477aa" if n.startswith("bwd") else "0x66ccee" if n == "forward"
                             else "0xee6677" if n.startswith("allreduce") else "0xccbb44" if
                             n.startswith("wait") else "0x228833" if n == "optimizer"
                             else "0xaa3377")
                    rows.append((a, b, y, color, n))
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "slices.dat")
        with open(data, "w") as f:
            for a, b, y, c, n in rows:
                f.write(f"{a:.3f} {b:.3f} {y} {c}\n")
        ytics = ", ".join(f'"{l}" {i}' for i, l in enumerate(labels))
        term = "pngcairo" if out.endswith(".png") else "svg"
        script = f"""set terminal {term} size 1000,{120 + 45 * len(labels)} font "sans,11"
set output "{out}"
set title "coll-train DDP, one optimizer step ({os.path.basename(src)}): light blue forward, blue backward (one box per layer), red all-reduce (one box per bucket), yellow exposed wait, green AdamW" noenhanced font "sans,10"
set xlabel "ms since the step's forward began (rank 0)"
set yrange [-0.7:{len(labels) - 0.3}]
set ytics ({ytics})
set grid x
unset key
set style fill solid 0.9 border lc rgb "black"
plot "{data}" using (($1+$2)/2):3:(($2-$1)/2):(0.35):4 with boxxyerror lc rgb variable
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)

main()
