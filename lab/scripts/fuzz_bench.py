#!/usr/bin/env python3
"""fuzz_bench.py — random coll-bench runs with every result checked, to look for wrong
answers and hangs beyond the suite's fixed cases.

Each run draws a collective, a row of the algorithm table to force (COLL_ALGO; a row that
cannot serve the call falls back, as it does for a user), a rank count (2-8 on this
machine's cores), a dtype, an op, a root, a size (0-64 B, up to 70 KB, or up to 5 MB,
rounded to whole elements), blocking or stream-ordered calls, malloc'd or coll_mem_alloc'd
buffers, and now and then TCP instead of shared memory, emulated hosts (hier), a low
non-temporal threshold, COLL_CHECK=1 or no binding.  coll-bench checks both placements
(out of place and in place) of every call and exits 1 on a wrong element.

Usage: lab/scripts/fuzz_bench.py [--bench PATH] SEED SECONDS
  --bench PATH  the coll-bench to run (default build/bench/coll-bench; an ASan build's
                finds memory errors that give no wrong answer)
Prints every failing command with its output tail, then one line:
  seed S: N runs, F failures, {exit status: runs}
Every run has a timeout of 120 s (a hang counts as a failure).  The same seed draws the
same runs.  Lab only: the suite does not run it.

Must never: run beside a benchmark (it loads both cores), or write outside /tmp.
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile
import time

COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
         "gather", "scatter", "sendrecv"]
ROWS = ["auto", "ring", "tree", "rd", "rhd", "oneshot", "direct", "mapped", "pairwise",
        "linear", "hier", "fanout", "staged"]
DTYPES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
          "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
OPS = ["sum", "prod", "min", "max", "avg"]


def draw(rng, bench):
    """One run: (command, extra environment)."""
    ranks = rng.choice([2, 2, 3, 3, 4, 5, 6, 7, 8])
    dtype = rng.choice(list(DTYPES))
    kind = rng.random()
    size = (rng.randint(0, 64) if kind < 0.3 else
            rng.randint(65, 70000) if kind < 0.7 else rng.randint(70000, 5_000_000))
    es = DTYPES[dtype]
    size = max(es, size // es * es)
    cmd = [bench, rng.choice(COLLS), "--ranks", str(ranks), "-b", str(size), "-e", str(size),
           "-d", dtype, "-o", rng.choice(OPS), "-n", "2", "-w", "1", "-c", "1",
           "-z", rng.choice(["0", "1"]), "-R", rng.choice(["0", "0", "0", "1"]),
           "-r", str(rng.randrange(ranks)), "-A", rng.choice(ROWS)]
    env = {}
    if rng.random() < 0.2:
        env["COLL_TRANSPORT"] = "tcp"
    if rng.random() < 0.2 and ranks >= 4:
        env["COLL_LAUNCH_RANKS_PER_HOST"] = str(rng.choice([2, 3]))
    if rng.random() < 0.3:
        env["COLL_NT_BYTES"] = str(rng.choice([0, 1, 4096, 65536]))
    if rng.random() < 0.3:
        env["COLL_CHECK"] = "1"
    if rng.random() < 0.1:
        env["COLL_LAUNCH_BIND"] = "0"
    return cmd, env


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default="build/bench/coll-bench")
    ap.add_argument("seed", type=int)
    ap.add_argument("seconds", type=float)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with tempfile.TemporaryDirectory(prefix="coll-fuzz-") as tmp:
        # One tuner cache for the whole fuzz, kept in /tmp; busy or not, it is used, so
        # that every run does not measure again (the rows are forced anyway).
        base = dict(os.environ, COLL_TUNE_BUSY="100", COLL_TUNE_FILE=os.path.join(tmp, "tune"))
        start, runs, bad, seen = time.time(), 0, 0, {}
        while time.time() - start < a.seconds:
            cmd, extra = draw(rng, a.bench)
            shown = " ".join([f"{k}={v}" for k, v in extra.items()] + cmd)
            runs += 1
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                                   env=dict(base, **extra))
            except subprocess.TimeoutExpired:
                bad += 1
                seen["timeout"] = seen.get("timeout", 0) + 1
                print("TIMEOUT", shown, flush=True)
                continue
            seen[p.returncode] = seen.get(p.returncode, 0) + 1
            if p.returncode != 0:
                bad += 1
                print(f"FAIL {p.returncode}: {shown}\n{p.stdout[-1500:]}\n{p.stderr[-1500:]}",
                      flush=True)
    print(f"seed {a.seed}: {runs} runs, {bad} failures, {seen}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
