#!/usr/bin/python3
"""bench_cpu.py — coll-train vs PyTorch on the CPU, same model, batch and threads,
interleaved (A B A B ...) so both see the same machine load; prints a markdown table
of median tokens/s for docs/perf.md.

usage: bench_cpu.py COLL_TRAIN [--reps 3] [--threads 1,2] [--steps 30]
                    [--config "--layers 4 --channels 128 --heads 4 --seq 64 --batch 16"]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("coll_train")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--config", default="--layers 4 --channels 128 --heads 4 --seq 64 --batch 16")
    a = ap.parse_args()
    cfg = a.config.split()
    rows = []
    for th in [int(t) for t in a.threads.split(",")]:
        ours, torch = [], []
        for _ in range(a.reps):
            o = run([a.coll_train] + cfg + ["--steps", str(a.steps), "--eval-every", "0",
                                            "--threads", str(th), "--quiet"])
            ours.append(float(re.search(r"\| (\d+) tok/s", o.splitlines()[-1]).group(1)))
            t = run(["/usr/bin/python3", os.path.join(here, "bench_torch.py")] + cfg +
                    ["--steps", str(a.steps), "--threads", str(th)])
            torch.append(float(re.search(r"ms/step, (\d+) tok/s", t).group(1)))
            print("threads %d: coll-train %.0f tok/s, pytorch %.0f tok/s" % (th, ours[-1],
                  torch[-1]), file=sys.stderr)
        mo, mt = statistics.median(ours), statistics.median(torch)
        rows.append((th, mo, mt, mo / mt, ours, torch))
    print("| threads | coll-train tok/s | PyTorch tok/s | ratio | runs (ours / torch) |")
    print("|---|---|---|---|---|")
    for th, mo, mt, r, ours, torch in rows:
        print("| %d | %.0f | %.0f | %.2fx | %s / %s |" % (th, mo, mt, r,
              " ".join("%.0f" % x for x in ours), " ".join("%.0f" % x for x in torch)))


if __name__ == "__main__":
    main()
