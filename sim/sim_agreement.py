#!/usr/bin/env python3
"""sim_agreement.py — coll-sim's predictions against coll-bench's measurements.

  sim/sim_agreement.py measure OUT.csv [REPS] [NS]   interleaved coll-bench runs
  sim/sim_agreement.py compare OUT.csv [coll-sim flags...]
  sim/sim_agreement.py measure-netns OUT.csv [REPS] [HOSTS]   (root: netns.sh)
  sim/sim_agreement.py compare-netns OUT.csv [--line-measured] [coll-sim flags...]
  sim/sim_agreement.py sweep OUT.csv [REPS] [NS]     all-reduce 1..16 MiB by 2
  sim/sim_agreement.py compare-inplace OUT.csv [coll-sim flags...]
  sim/sim_agreement.py matrix SET.csv... [coll-sim flags...]

measure: REPS rounds (default 9: with 5, two sets minutes apart differed by more than
25 % in 11 of the 40 all-reduce medians, with 9 in 4); in each round every case once
(N in NS, default "2,3,4"; all_reduce ring/tree, all_gather ring, broadcast ring/tree;
64 KiB..16 MiB by 4), so that a disturbance of the machine hits one run of many cases rather than every
run of one case.  Each row gets the round and the load average when it started.  Each
round first runs the probes of the machine's figures: sim-membw 2 (the kernels, into
OUT.membw), sim-membw handover and pingpong and sim-sched (a copy out of a peer's slot,
the read-for-ownership, yield and wake: into OUT.fixed).
compare: the median of the out-of-place times per case, coll-sim's prediction for it
(--cpu-model, cores per host 2, every rank on one host, the kernels of OUT.membw,
with --fixed-measured the figures of OUT.fixed, with --fit-slot-out slot_out in cache
fitted to OUT's own FIT cases of the ring), and the error; cases named in
FIT (the ones the model's free figures were fitted on) are marked, the rest are
predictions.  Exit 1 if a predicted case of all_reduce ring/tree is off by more than 25 %.

measure-netns: all-reduce ring and tree, 64 KiB..16 MiB, across HOSTS (default "2,4")
network-namespace hosts of one rank each, every link capped at 1 Gbit/s by tbf with its
256 KB bucket (scripts/netns.sh -r 1gbit); each case its own job (COLL_TUNE=0: no probe
drains the bucket first), 2 warm-up and 10 timed calls back to back (-c 0), so every case
starts with a full bucket; per round and host count also the same hosts uncapped (ring
4 KiB and 256 KiB, into OUT.line: the unshaped link).  compare-netns: coll-sim with that
link (rate 119.55 MB/s of TCP payload, the bucket, bytes it covers at line speed: 3 GB/s,
or with --line-measured OUT.line's per host count; 12 calls of which the last 10 are
timed) against the medians.  α_net: the small calls' median over 2(K-1) hops, from
calls of at least K elements (fewer leave chunks empty, and the ring skips their hops),
taken in jobs of the cases' shape (OUT.alpha: ring 1-4 KiB, 2 + 10 calls per job) where
the set has them, else from the long job of 8 B..4 KiB.

sweep: all-reduce ring and tree only, 1..16 MiB by 2 (the sizes around the last-level
cache that measure's factor of 4 steps over), N in NS (default "3"), ranks bound
round-robin, REPS rounds (default 5), each after sim-membw 2 (into OUT.membw).  With
ONE_CPU=1 every rank and the probe run on one CPU (taskset; the probe with 1 thread),
and compare-inplace predicts with --cores 1.
compare-inplace: per case both columns, out of place and in place (coll-sim --in-place),
the errors, and what out of place costs more than in place, measured and predicted:
the two differ only in the buffers a call touches (W), so that difference is where the
cache model's knee shows.  It only reports; it exits 0.
matrix: compare's all-reduce errors for several sets side by side, with each case's mean
and spread over them (a case off by about the same everywhere is the model's; one off in
a set or two, the machine's period), and a last column: the error against the sets
pooled (the median of every run of every set, predicted with the median of every
probe).  Below it, per set, how many cases the model misses there and how many of the
set's own medians are more than 25 % from the pooled ones.  Exit 1 if a predicted case
misses the pooled median by more than 25 % (test_sim runs it on the committed sets).

Every tool runs from COLL_BUILD_DIR (default: the checkout's build/).
"""
import csv, math, os, statistics, subprocess, sys, tempfile

CASES = [("all_reduce", "ring"), ("all_reduce", "tree"), ("all_gather", "ring"),
         ("broadcast", "ring"), ("broadcast", "tree")]
# The cases the CPU model's free figures were fitted on (docs/bandwidth-math.md, 8):
# slot_out (ring N=2 and N=3 at 1 MiB of set G), the fixed hand-over (--no-sched only),
# the FIFOs' footprint (on set C).  The per-call cost, once fitted on ring N=2 64 KiB, is
# now measured (64-512 B calls).
FIT = {("all_reduce", "ring", 2, 1048576), ("all_reduce", "ring", 3, 1048576),
       ("all_reduce", "tree", 8, 16777216)}
# coll-bench repeats the call: slots the receiver read in earlier calls are written again
# (coll-sim --rfo-ns), so the prediction is a call in steady state, the 6th of 10.
STEADY = ["--calls", "10", "--warmup", "5"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The build whose tools run (coll-bench, coll-sim, sim-membw): COLL_BUILD_DIR, else ROOT/build.
BUILD = os.environ.get("COLL_BUILD_DIR", f"{ROOT}/build")


def measure(out, reps, ns):
    # COLL_LAUNCH_BIND: coll_launch_local binds rank i to core i mod C (sets E, F: BIND=1,
    # coll-sim --bind); sets A-D were measured with the kernel placing the ranks (BIND
    # unset: COLL_LAUNCH_BIND=0, coll-sim --no-bind).  The .membw file's first line says
    # which, for compare.
    bind = "1" if os.environ.get("BIND") == "1" else "0"
    env = dict(os.environ, COLL_TUNE_FILE="none", COLL_LAUNCH_BIND=bind)
    fresh = not os.path.exists(out + ".membw")
    with open(out, "a") as f, open(out + ".membw", "a") as mf:
        if fresh:  # compare reads it: coll-sim --bind or --no-bind
            mf.write(f"# placement: {'bound' if bind == '1' else 'kernel'}\n")
        for rep in range(reps):
            # The kernels' speeds in the same run: this VM's memory moves with its host's
            # load by tens of percent from one hour to the next.
            p = subprocess.run([f"{BUILD}/sim/sim-membw", "2"], capture_output=True,
                               text=True, timeout=600)
            mf.write(f"# round {rep}\n{p.stdout}")
            mf.flush()
            # The cross-core and scheduler figures in the same run (fixed_flags below).
            with open(out + ".fixed", "a") as xf:
                xf.write(f"# round {rep}\n")
                for probe in (["sim-membw", "handover"], ["sim-membw", "pingpong"], ["sim-sched"]):
                    p = subprocess.run([f"{BUILD}/sim/{probe[0]}"] + probe[1:],
                                       capture_output=True, text=True, timeout=600)
                    xf.write(p.stdout)
            for n in ns:
                for coll, algo in CASES:
                    bench_rows(f, rep, env, coll, n, algo, "64K", "16M", "4")


def bench_rows(f, rep, env, coll, n, algo, lo, hi, factor, prefix=()):
    """One coll-bench job (20 timed calls after 3) of COLL by ALGO on N ranks, sizes LO to
    HI by FACTOR, run under PREFIX (taskset): its csv rows to F, each after the round and
    the load average when it started."""
    load = open("/proc/loadavg").read().split()[0]
    p = subprocess.run(list(prefix) + [f"{BUILD}/bench/coll-bench", coll, "--ranks", str(n), "-b", lo,
                        "-e", hi, "-f", factor, "-A", algo, "-n", "20", "-w", "3", "--csv"],
                       env=env, capture_output=True, text=True, timeout=600)
    for line in p.stdout.splitlines()[1:]:
        f.write(f"{rep},{load},{line}\n")
    f.flush()


def predict(coll, algo, n, size, flags):
    p = subprocess.run([f"{BUILD}/sim/coll-sim", "-N", str(n), "-H", str(n), "--cores", "2",
                        "-c", coll, "-A", algo, "-b", str(size), "-e", str(size), "-f", "2",
                        "--cpu-model"] + STEADY + flags, capture_output=True, text=True,
                       check=True)
    for line in p.stdout.splitlines():
        w = line.split()
        if len(w) == 6 and w[2] == algo and not line.startswith("#"):
            return float(w[3])
    raise RuntimeError(p.stdout)


def membw_rounds(path):
    """PATH.membw (sim-membw 2 once per round, measure) as one dict per round: "w", W ->
    the copy, nt-copy and reduce ns/B; "c" and "m", each kernel's mean over W of 0.4-3
    MiB (in cache) and of W >= 96 MiB (memory), [] where the round lacks them.  [] if
    there is no file."""
    try:
        text = open(path + ".membw").read()
    except OSError:
        return []
    runs, cur = [], None
    for line in text.splitlines():
        w = line.split()
        if line.startswith("# round"):
            cur = {"w": {}}
            runs.append(cur)
        elif cur is not None and not line.startswith("#") and len(w) == 4:
            cur["w"][int(w[0])] = [float(x) for x in w[1:]]
    for r in runs:
        cached = [v for ws, v in r["w"].items() if 393216 <= ws <= 3145728]
        mem = [v for ws, v in r["w"].items() if ws >= 100663296]
        r["c"] = [statistics.mean(v[i] for v in cached) for i in range(3)] if cached else []
        r["m"] = [statistics.mean(v[i] for v in mem) for i in range(3)] if mem else []
    return runs


def membw_flags(path, flags):
    """The kernels' speeds recorded beside the measurements (measure writes PATH.membw):
    with --membw-curve, coll-sim --membw PATH.membw (the measured curve against W);
    else --copy-ns, --nt-ns, --reduce-ns: per run the mean over W of 0.4-3 MiB (cache)
    and W >= 96 MiB (memory), then the median of the runs -- the statistic the measured
    times are compared by (the smallest run, as the built-in figures were taken, prices
    the kernels at the machine's best moment and every case a little fast).  With
    --membw-min, the smallest.  Flags given on the command line win."""
    if "--membw-curve" in flags:
        flags.remove("--membw-curve")
        if os.path.exists(path + ".membw"):
            print(f"# kernels: coll-sim --membw {path}.membw")
            return ["--membw", path + ".membw"]
        return []
    runs = [r for r in membw_rounds(path) if r["c"] and r["m"]]
    if not runs:
        return []
    pick, how = statistics.median, "median"
    if "--membw-min" in flags:
        flags.remove("--membw-min")
        pick, how = min, "smallest"
    out = []
    for i, name in enumerate(["--copy-ns", "--nt-ns", "--reduce-ns"]):
        if name in flags:
            continue
        c = pick([r["c"][i] for r in runs])
        m = pick([r["m"][i] for r in runs])
        out += [name, f"{c:.4f},{m:.4f}"]
    print(f"# kernels from {path}.membw ({len(runs)} runs, the {how}): {' '.join(out)}")
    return out


def llc_hit(ws, cache, ways=16):
    """coll-sim's share of hits for a working set of WS bytes in a last-level cache of
    CACHE bytes and WAYS ways (sim/sim_cpu.c, sim_cpu_hit: lines fall on the sets as
    Poisson(λ), λ = ways·WS/CACHE, a set keeps at most WAYS of them)."""
    lam = ways * ws / cache
    spread = 12 * math.sqrt(lam) + 40
    total = sum(math.exp(k * math.log(lam) - lam - math.lgamma(k + 1)) * min(k, ways)
                for k in range(max(1, int(lam - spread)), int(lam + spread) + 1))
    return min(1.0, total / lam)


def cache_flags(path, flags):
    """With --cache-measured: the last-level cache this set's machine had, from its own
    kernels' probe (PATH.membw): per round the C (0.5 MiB steps, 4-40 MiB) for which
    coll-sim's mixture, f·x_cache + (1-f)·x_mem with that round's x_cache and x_mem,
    best fits the copy and reduce points of W = 6-48 MiB per thread (the host's W twice
    that: two threads), least squares of the relative errors; then the median of the
    rounds.  Not the default: the built-in 20 MiB was read off the same kind of probe."""
    if "--cache-measured" not in flags:
        return []
    flags.remove("--cache-measured")
    runs = [r for r in membw_rounds(path) if r["c"] and r["m"]]
    if not runs:
        return []
    fits = []
    for r in runs:
        cached, mem = r["c"], r["m"]
        best = None
        for half in range(8, 81):
            c = half * 0.5 * 1048576
            err = 0.0
            for ws, v in r["w"].items():
                if 6291456 <= ws <= 50331648:
                    f = llc_hit(2 * ws, c)
                    err += sum(((f * cached[i] + (1 - f) * mem[i]) - v[i]) ** 2 / v[i] ** 2
                               for i in (0, 2))
            if best is None or err < best[0]:
                best = (err, half * 0.5)
        fits.append(best[1])
    med = statistics.median(fits)
    print(f"# cache from {path}.membw: {', '.join(f'{c:g}' for c in fits)} MiB per round, "
          f"the median: --cache {med:g}")
    return ["--cache", f"{med:g}"]


def fixed_flags(path, flags):
    """With --fixed-measured: the figures the kernels' probe does not cover, measured
    beside the set (measure writes PATH.fixed, from set L on): per round sim-membw
    handover (slot_in: the consumer's copy out of a slot, the mean over W of 0.4-3 MiB
    and of W >= 48 MiB), sim-membw pingpong (rfo: the mean over slots of 32-256 KiB) and
    sim-sched (yield and wake), then the median of the rounds.  Not the default: slot_out
    was fitted (set G) with the built-in slot_in and rfo beside it, so measured ones
    without a refit price the same bytes twice (set L: 36 of 40 with them, 38 without;
    docs/bandwidth-math.md, "Set L").  Flags given on the command line win."""
    if "--fixed-measured" not in flags:
        return []
    flags.remove("--fixed-measured")
    try:
        text = open(path + ".fixed").read()
    except OSError:
        return []
    runs, cur, mode = [], None, None
    for line in text.splitlines():
        w = line.split()
        if line.startswith("# round"):
            cur = {"in_c": [], "in_m": [], "rfo": [], "sched": None}
            runs.append(cur)
        elif cur is None:
            continue
        elif line.startswith("# hand-over"):
            mode = "handover"
        elif line.startswith("# pingpong"):
            mode = "pingpong"
        elif line.startswith("# sim-sched"):
            mode = "sched"
        elif line.startswith("# coll-sim --yield-us"):
            cur["sched"] = (w[3], w[5])
        elif line.startswith("#") or not w:
            continue
        elif mode == "handover" and len(w) == 3:
            ws = int(w[0])
            if 393216 <= ws <= 3145728:
                cur["in_c"].append(float(w[2]))
            elif ws >= 50331648:
                cur["in_m"].append(float(w[2]))
        elif mode == "pingpong" and len(w) == 4 and 32768 <= int(w[0]) <= 262144:
            cur["rfo"].append(float(w[3]))
    runs = [r for r in runs if r["in_c"] and r["in_m"] and r["rfo"] and r["sched"]]
    if not runs:
        return []
    med = statistics.median
    vals = {
        "--slot-in-ns": f"{med(statistics.mean(r['in_c']) for r in runs):.4f},"
                        f"{med(statistics.mean(r['in_m']) for r in runs):.4f}",
        "--rfo-ns": f"{med(statistics.mean(r['rfo']) for r in runs):.4f}",
        "--yield-us": ",".join(f"{med(float(r['sched'][0].split(',')[i]) for r in runs):.2f}"
                               for i in range(2)),
        "--wake-us": ",".join(f"{med(float(r['sched'][1].split(',')[i]) for r in runs):.2f}"
                              for i in range(2)),
    }
    out = []
    for name, v in vals.items():
        if name not in flags:
            out += [name, v]
    print(f"# cross-core and scheduler figures from {path}.fixed ({len(runs)} runs, the median): "
          f"{' '.join(out)}")
    return out


def placement_flags(path, flags):
    """coll-sim --bind for a set measured with ranks bound round-robin (measure writes
    "# placement: bound" atop PATH.membw; sets A-D, from before, were the kernel's)."""
    if "--bind" in flags or "--no-bind" in flags:
        return []
    try:
        first = open(path + ".membw").readline()
    except OSError:
        first = ""
    if first.strip() == "# placement: one cpu":
        print("# placement: every rank on one CPU (--bind --cores 1)")
        return ["--bind", "--cores", "1"]
    bound = first.strip() == "# placement: bound"
    print(f"# placement: {'bound round-robin (--bind)' if bound else 'the kernel (--no-bind)'}")
    return ["--bind" if bound else "--no-bind"]


# coll-sim's slot_out from memory (sim/coll-sim.c), kept when --fit-slot-out refits
# the in-cache figure.
SLOT_OUT_MEM = 0.088


def slot_out_flags(path, flags):
    """With --fit-slot-out: slot_out in cache fitted to this set's own ring N=2 and N=3 at
    1 MiB (the FIT cases it was fitted on, in set G, for the built-in 0.026), as then:
    least squares of the two relative errors over 0.018-0.050 ns/B in steps of 0.001.
    FLAGS are the set's other flags (its kernels), which the fit predicts with."""
    if "--fit-slot-out" not in flags:
        return []
    flags.remove("--fit-slot-out")
    meas = {}
    for r in csv.reader(open(path)):
        if r[2] == "all_reduce" and r[5] == "ring" and int(r[9]) == 1048576 and r[3] in ("2", "3"):
            meas.setdefault(int(r[3]), []).append(float(r[11]))
    if len(meas) < 2:
        return []
    best = None
    for i in range(18, 51):
        v = [f"--slot-out-ns", f"{i / 1000:g},{SLOT_OUT_MEM:g}"]
        err = sum(((predict("all_reduce", "ring", n, 1048576, flags + v) - statistics.median(t))
                   / statistics.median(t)) ** 2 for n, t in meas.items())
        if best is None or err < best[0]:
            best = (err, v)
    print(f"# slot_out fitted on {path}'s ring N=2 and N=3 at 1 MiB: {best[1][1]} "
          f"(built in: 0.026, set G)")
    return best[1]


def set_flags(path, flags):
    """coll-sim's flags for set PATH: its placement, the kernels (and with the options,
    the fixed figures, cache, slot_out) measured beside it, then FLAGS."""
    flags = list(flags)
    flags = (placement_flags(path, flags) + membw_flags(path, flags) + fixed_flags(path, flags)
             + cache_flags(path, flags) + flags)
    return flags + slot_out_flags(path, flags)


def case_errors(path, flags):
    """Per case of set PATH (coll, algo, n, size), in CASES' order: the measured times,
    their median, coll-sim's prediction with FLAGS (set_flags's) and the error in %."""
    runs = {}
    for r in csv.reader(open(path)):
        coll, n, algo, size = r[2], int(r[3]), r[5], int(r[9])
        runs.setdefault((coll, algo, n, size), []).append(float(r[11]))
    out = {}
    for key in sorted(runs, key=lambda k: (CASES.index((k[0], k[1])), k[2], k[3])):
        coll, algo, n, size = key
        med = statistics.median(runs[key])
        pred = predict(coll, algo, n, size, flags)
        out[key] = (runs[key], med, pred, (pred - med) / med * 100)
    return out


def compare(path, flags):
    flags = set_flags(path, flags)
    bad = 0
    print("| case | N | size | measured us (median of runs) | predicted us | error | role |")
    print("|---|---|---|---|---|---|---|")
    errs = {}
    for key, (times, med, pred, err) in case_errors(path, flags).items():
        coll, algo, n, size = key
        role = "fitted" if key in FIT else "predicted"
        errs.setdefault((coll, algo, role), []).append(abs(err))
        if role == "predicted" and coll == "all_reduce" and abs(err) > 25:
            bad += 1
        print(f"| {coll} {algo} | {n} | {size >> 10} KiB | {med:.1f} "
              f"({', '.join(f'{v:.0f}' for v in times)}) | {pred:.1f} | {err:+.0f} % | {role} |")
    for k, v in sorted(errs.items()):
        print(f"# {k[0]} {k[1]} {k[2]}: {len(v)} cases, median |error| {statistics.median(v):.0f} %, "
              f"within 25 %: {sum(e <= 25 for e in v)}")
    return 1 if bad else 0


def pool_sets(paths, tmp):
    """The sets PATHS as one: their rows in one CSV under TMP, and beside it every round of
    their probes (.membw, and .fixed where every set has one), so that set_flags and
    case_errors take the median of all their runs.  The sets must share a placement."""
    heads = set()
    for path in paths:
        try:
            heads.add(open(path + ".membw").readline().strip())
        except OSError:
            heads.add("")
    if len(heads) != 1:
        raise SystemExit(f"matrix: the sets were measured with different placements: {heads}")
    out = os.path.join(tmp, "pooled.csv")
    with open(out, "w") as f:
        for path in paths:
            f.write(open(path).read())
    for ext in (".membw", ".fixed"):
        if all(os.path.exists(p + ext) for p in paths):
            with open(out + ext, "w") as f:
                for k, path in enumerate(paths):
                    for line in open(path + ext):
                        if k and line.startswith("# placement"):
                            continue
                        f.write(line)
    return out


def matrix(args):
    """All-reduce ring and tree: each case's error in every set named, side by side, then
    per case the mean and the spread over the sets, and the error against the sets pooled
    (the median of all their runs, predicted with the median of all their probes).  A case
    wrong by about the same in every set is the model's; one that misses in a set or two,
    the machine's period.  Below the table, per set: how many of its cases the model
    misses, and how many of its own medians are more than 25 % from the pooled ones -- a
    second measurement of the same case, which no model can agree with better than the
    measurements agree with each other.  Exit 1 if a case misses against the pool.
    ARGS: set files, then coll-sim flags (the first argument starting with -)."""
    first = next((i for i, a in enumerate(args) if a.startswith("-")), len(args))
    paths, flags = args[:first], args[first:]
    cols, table, meds = [], {}, {}
    for path in paths:
        name = os.path.basename(path).rsplit(".", 1)[0]
        cols.append(name)
        for key, (_, med, _, err) in case_errors(path, set_flags(path, flags)).items():
            if key[0] == "all_reduce":
                table.setdefault(key, {})[name] = err
                meds.setdefault(key, {})[name] = med
    with tempfile.TemporaryDirectory() as tmp:
        pooled = pool_sets(paths, tmp)
        print(f"# pooled: the {len(paths)} sets' runs together")
        pool = {key: (med, err) for key, (_, med, _, err)
                in case_errors(pooled, set_flags(pooled, flags)).items() if key[0] == "all_reduce"}
    print("| case | N | size | " + " | ".join(cols) + " | mean | sd | out of 25 % | pooled |")
    print("|---|---|---|" + "---|" * (len(cols) + 4))
    bad = 0
    for key in sorted(table, key=lambda k: (k[1], k[2], k[3])):
        v = [table[key][c] for c in cols if c in table[key]]
        miss = sum(abs(e) > 25 for e in v)
        sd = statistics.stdev(v) if len(v) > 1 else 0.0
        tag = " (fitted)" if key in FIT else ""
        bad += key not in FIT and abs(pool[key][1]) > 25
        print(f"| {key[1]}{tag} | {key[2]} | {key[3] >> 10} KiB | "
              + " | ".join(f"{table[key][c]:+.0f}" if c in table[key] else "" for c in cols)
              + f" | {statistics.mean(v):+.0f} | {sd:.0f} | {miss} | {pool[key][1]:+.0f} |")
    print()
    print("| set | the model misses | its medians > 25 % from the pooled | both "
          "| slow rounds |")
    print("|---|---|---|---|---|")
    for c, path in zip(cols, paths):
        keys = [k for k in table if c in table[k] and k not in FIT]
        model = {k for k in keys if abs(table[k][c]) > 25}
        own = {k for k in keys if abs(meds[k][c] / pool[k][0] - 1) > 0.25}
        # A round's pace: the geometric mean over its all-reduce runs of run / pooled
        # median.  "Slow": more than 1.25, the whole round late, not one case.
        logs = {}
        for r in csv.reader(open(path)):
            key = (r[2], r[5], int(r[3]), int(r[9]))
            if key in pool:
                logs.setdefault(int(r[0]), []).append(math.log(float(r[11]) / pool[key][0]))
        pace = [math.exp(statistics.mean(v)) for _, v in sorted(logs.items())]
        slow = [f"{p:.2f}" for p in pace if p > 1.25]
        print(f"| {c} | {len(model)} | {len(own)} | {len(model & own)} | {len(slow)} of "
              f"{len(pace)}{' (' + ', '.join(slow) + ')' if slow else ''} |")
    return 1 if bad else 0


def sweep(out, reps, ns):
    env = dict(os.environ, COLL_TUNE_FILE="none", COLL_LAUNCH_BIND="1")
    # ONE_CPU=1: every rank and the kernels' probe confined to one CPU (taskset), so the
    # ranks only take turns; the probe then runs one thread (the other core idles).
    one = os.environ.get("ONE_CPU") == "1"
    prefix = ["taskset", "-c", str(min(os.sched_getaffinity(0)))] if one else []
    fresh = not os.path.exists(out + ".membw")
    with open(out, "a") as f, open(out + ".membw", "a") as mf:
        if fresh:
            mf.write("# placement: one cpu\n" if one else "# placement: bound\n")
        for rep in range(reps):
            p = subprocess.run(prefix + [f"{BUILD}/sim/sim-membw", "1" if one else "2"],
                               capture_output=True, text=True, timeout=600)
            mf.write(f"# round {rep}\n{p.stdout}")
            mf.flush()
            for n in ns:
                for algo in ("ring", "tree"):
                    bench_rows(f, rep, env, "all_reduce", n, algo, "1M", "16M", "2", prefix)


def compare_inplace(path, flags):
    flags = (placement_flags(path, flags) + membw_flags(path, flags) + cache_flags(path, flags)
             + flags)
    runs = {}
    for r in csv.reader(open(path)):
        key = (r[2], r[5], int(r[3]), int(r[9]))
        runs.setdefault(key, []).append((float(r[11]), float(r[15])))
    print("| case | N | size | out of place: measured, predicted | in place: measured, "
          "predicted | out - in: measured, predicted |")
    print("|---|---|---|---|---|---|")
    for key in sorted(runs, key=lambda k: (k[1], k[2], k[3])):
        coll, algo, n, size = key
        oop = statistics.median(v[0] for v in runs[key])
        ip = statistics.median(v[1] for v in runs[key])
        po = predict(coll, algo, n, size, flags)
        pi = predict(coll, algo, n, size, flags + ["--in-place"])
        print(f"| {coll} {algo} | {n} | {size >> 10} KiB | {oop:.0f}, {po:.0f} "
              f"({(po - oop) / oop * 100:+.0f} %) | {ip:.0f}, {pi:.0f} ({(pi - ip) / ip * 100:+.0f} %) "
              f"| {oop - ip:.0f}, {po - pi:.0f} |")
    return 0


NETNS_SIZES = [65536 << (2 * i) for i in range(5)]
# The link of measure-netns as coll-sim sees it: TCP payload of 1 Gbit/s in 1514-byte
# frames (1448 bytes each), tbf's bucket, tcp's slots (256 KiB, 4 per FIFO), one rank and
# core per host, coll-bench's 2 + 10; α_net from the same run's small calls (below).
NETNS_SIM = ["--cpu-model", "--bw-net", "0.11955", "--slot", "256K",
             "--depth", "4", "--burst", "256K", "--calls", "12", "--warmup", "2"]


# The unshaped link, what tbf's bucket-covered bytes leave at: the same hosts without the
# cap, ring calls of 4 KiB and 256 KiB (one slice per hop at 2 and 4 hosts: a chunk of
# 256K/K fits tcp's 256 KiB slot), written to OUT.line.  Per hop the larger call carries
# (256K - 4K)/K bytes more, over 2(K-1) hops; what it takes longer is the packet path of
# those bytes: both ends' system calls, TCP, the veths and the bridge, on this machine's
# cores, which all hosts share (line_speed below).
LINE_SIZES = (4096, 262144)


def netns_job(dest, rep, k, rate, bench):
    """One job of coll-bench BENCH on k netns hosts (capped at RATE if given): rank 0's
    csv rows to DEST, each after the round and the load average when it started."""
    load = open("/proc/loadavg").read().split()[0]
    env = dict(os.environ, COLL_TUNE="0", COLL_TUNE_FILE="none")
    p = subprocess.run([f"{ROOT}/scripts/netns.sh", "-q", "-k", str(k)]
                       + (["-r", rate] if rate else []) + ["-t", "120", "--",
                       f"{BUILD}/bench/coll-bench", "all_reduce"] + bench
                       + ["-c", "0", "--csv"],
                       env=env, capture_output=True, text=True, timeout=180)
    for line in p.stdout.splitlines():
        if line.startswith("[h0] all_reduce,"):
            dest.write(f"{rep},{load},{line[5:]}\n")
    dest.flush()


# α_net as a case's job sees it: small ring calls in jobs of the cases' shape (a fresh
# job, 2 warm-up and 10 timed calls), one job per size, written to OUT.alpha.  The long
# job's α (200 calls of each size after 20, 4 KiB last) is below what such jobs measure
# (a 4 KiB ring on 4 hosts, five interleaved pairs: 792 against 579 us a call, medians);
# why is not separated (docs/bandwidth-math.md, 8), but the cases pay it.
ALPHA_SIZES = (1024, 2048, 4096)


def measure_netns(out, reps, hosts):
    with open(out, "a") as f, open(out + ".line", "a") as lf, open(out + ".alpha", "a") as af:
        for rep in range(reps):
            for k in hosts:
                netns_job(lf, rep, k, None, ["-b", str(LINE_SIZES[0]), "-e", str(LINE_SIZES[1]),
                                             "-f", str(LINE_SIZES[1] // LINE_SIZES[0]),
                                             "-A", "ring", "-n", "50", "-w", "5"])
                # α_net of this many hosts in a long job: ring calls of 8 B..4 KiB
                # (2(K-1) hops each), printed beside the one compare-netns uses
                netns_job(f, rep, k, "1gbit", ["-b", "8", "-e", "4K", "-f", "8", "-A", "ring",
                                               "-n", "200", "-w", "20"])
                for size in ALPHA_SIZES:
                    netns_job(af, rep, k, "1gbit", ["-b", str(size), "-e", str(size),
                                                    "-A", "ring", "-n", "10", "-w", "2"])
                for algo in ("ring", "tree"):
                    for size in NETNS_SIZES:
                        netns_job(f, rep, k, "1gbit", ["-b", str(size), "-e", str(size),
                                                       "-A", algo, "-n", "10", "-w", "2"])


def line_speed(path):
    """Per host count, the unshaped link's GB/s from PATH.line (measure-netns): per round,
    the extra bytes per hop of the 256 KiB call over the 4 KiB one, over its extra time per
    hop; the median of the rounds.  {} when there is no such file (the sets before it)."""
    if not os.path.exists(path + ".line"):
        return {}
    t = {}
    for r in csv.reader(open(path + ".line")):
        t.setdefault((r[0], int(r[3])), {})[int(r[9])] = float(r[11])
    per = {}
    for (rep, n), v in t.items():
        if all(s in v for s in LINE_SIZES) and v[LINE_SIZES[1]] > v[LINE_SIZES[0]]:
            hop_bytes = (LINE_SIZES[1] - LINE_SIZES[0]) / n
            hop_us = (v[LINE_SIZES[1]] - v[LINE_SIZES[0]]) / (2 * (n - 1))
            per.setdefault(n, []).append(hop_bytes / hop_us / 1000)
    return {n: statistics.median(v) for n, v in per.items()}


def small_ring_calls(rows):
    """{hosts: [us]} of the small ring calls among csv ROWS (size <= 4 KiB), counting only
    calls of at least K elements: fewer leave chunks empty, and the ring skips their hops
    (8 B over 4 ranks: 4 hops, not 6), so they are not 2(K-1) hops of α."""
    calls = {}
    for r in rows:
        if int(r[9]) <= 4096 and int(r[10]) >= int(r[3]):
            calls.setdefault(int(r[3]), []).append(float(r[11]))
    return calls


def compare_netns(path, flags):
    rows = list(csv.reader(open(path)))
    runs = {}
    for r in rows:
        if int(r[9]) > 4096:  # the smaller ones are α_net's measurement, not cases
            runs.setdefault((r[5], int(r[3]), int(r[9])), []).append(float(r[11]))
    small = small_ring_calls(rows)
    short = small_ring_calls(csv.reader(open(path + ".alpha"))) if os.path.exists(
        path + ".alpha") else {}
    # α_net per host count: the small calls' median, less the per-call cost (1 us, the
    # CPU model's), over the ring's 2(K-1) hops.  From the jobs of the cases' shape
    # (PATH.alpha) where the set has them; the long job's is printed beside.
    def per_hop(v, n):
        return (statistics.median(v) - 1.0) / (2 * (n - 1))
    alpha = {n: per_hop(v, n) for n, v in small.items()}
    for n in sorted(alpha):
        print(f"# {n} hosts: alpha_net {alpha[n]:.1f} us from {len(small[n])} small ring calls "
              f"of a long job (median {statistics.median(small[n]):.1f} us)"
              + (", not used" if n in short else ""))
    for n in sorted(short):
        alpha[n] = per_hop(short[n], n)
        print(f"# {n} hosts: alpha_net {alpha[n]:.1f} us from {len(short[n])} small ring calls "
              f"in jobs of the cases' shape (median {statistics.median(short[n]):.1f} us; "
              f"{path}.alpha)")
    # The unshaped link measured beside the cases (PATH.line) is printed; coll-sim takes it
    # only with --line-measured (otherwise --bw-line's default, 3 GB/s).  Per host count it
    # is not the model's line: it about halves from 2 hosts to 4 on 2 cores, where the ring has
    # every host on the wire at once and the tree fewer (docs/bandwidth-math.md, 8).
    use_line = "--line-measured" in flags
    if use_line:
        flags = [f for f in flags if f != "--line-measured"]
    line = line_speed(path)
    for n in sorted(line):
        print(f"# {n} hosts: unshaped link {line[n]:.3f} GB/s per hop ({path}.line)"
              + ("" if use_line else ", not used without --line-measured"))
    if not use_line:
        line = {}
    print("| case | hosts x ranks | size | measured us (runs) | predicted us | error |")
    print("|---|---|---|---|---|---|")
    worst = 0
    for key in sorted(runs, key=lambda k: (k[1], k[0], k[2])):
        algo, n, size = key
        med = statistics.median(runs[key])
        p = subprocess.run([f"{BUILD}/sim/coll-sim", "-N", str(n), "-H", "1", "--cores", "1",
                            "-c", "all_reduce", "-A", algo, "-b", str(size), "-e", str(size), "-f", "2"]
                           + NETNS_SIM + ["--alpha-net", f"{alpha.get(n, 92.0):.1f}"]
                           + (["--bw-line", f"{line[n]:.3f}"] if n in line else []) + flags,
                           capture_output=True, text=True, check=True)
        pred = next(float(l.split()[3]) for l in p.stdout.splitlines()
                    if not l.startswith("#") and len(l.split()) == 6)
        err = (pred - med) / med * 100
        worst = max(worst, abs(err))
        print(f"| all_reduce {algo} | {n} x 1 | {size >> 10} KiB | {med:.0f} "
              f"({', '.join(f'{v:.0f}' for v in runs[key])}) | {pred:.0f} | {err:+.0f} % |")
    print(f"# largest |error| {worst:.0f} %")
    return 1 if worst > 25 else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "measure-netns":
        measure_netns(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 3,
                      [int(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "2,4").split(",")])
        sys.exit(0)
    if len(sys.argv) >= 3 and sys.argv[1] == "compare-netns":
        sys.exit(compare_netns(sys.argv[2], sys.argv[3:]))
    if len(sys.argv) >= 3 and sys.argv[1] == "measure":
        measure(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 9,
                [int(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "2,3,4").split(",")])
    elif len(sys.argv) >= 3 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3:]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "sweep":
        sweep(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 5,
              [int(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "3").split(",")])
    elif len(sys.argv) >= 3 and sys.argv[1] == "matrix":
        sys.exit(matrix(sys.argv[2:]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "compare-inplace":
        sys.exit(compare_inplace(sys.argv[2], sys.argv[3:]))
    else:
        print(__doc__)
        sys.exit(2)
