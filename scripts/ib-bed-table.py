#!/usr/bin/env python3
"""ib-bed-table.py — the table of one scripts/ib-bed-perf.sh run: reads the bed's results
folder (g0/rank0.out: the sweeps under "=== WHO rep R" lines; perf-g0.txt: perftest's
client side) and prints, per size, the median over the repetitions of each library's
out-of-place time, their ratio, and the bus bandwidth, then perftest's figures as the
fabric's own limit, then the issue's two tests on the ratios (<= 1.1x the peer's time up
to 64 KiB; at least its bandwidth from 1 MiB).  Must never: mix repetitions of one
library into another's median, or read a row whose #wrong is not 0 as a time.

usage: ib-bed-table.py RESULTS_DIR
"""
import os
import statistics
import sys


def sweeps(path):
    """{who: [{size: (time_us, busbw_MBps)}, ...one per repetition]}; wrong rows fail."""
    out, cur = {}, None
    for line in open(path, errors="replace"):
        line = line.strip()
        if line.startswith("=== "):
            who = line.split()[1]
            cur = {}
            out.setdefault(who, []).append(cur)
            continue
        f = line.split()
        if cur is None or len(f) < 9 or not f[0].isdigit():
            continue
        # busbw is printed in GB/s to 2 decimals, all zeros on this wire: recomputed from
        # the time, 2 ranks: busbw = algbw * 2(n-1)/n = size / time (B/us = MB/s)
        size, t, wrong = int(f[0]), float(f[5]), f[8]
        bw = size / t
        if wrong != "0":
            sys.exit(f"ib-bed-table: {path}: {size} B has {wrong} wrong elements")
        cur[size] = (t, bw)
    return out


def perftest(path):
    """[(test, bytes, figure, unit)] from perftest's client output."""
    rows, test, head = [], None, None
    if not os.path.exists(path):
        return rows
    for line in open(path, errors="replace"):
        s = line.strip()
        for name in ("Send Latency Test", "RDMA_Write BW Test"):
            if name in s:
                test = "ib_send_lat" if "Latency" in name else "ib_write_bw"
        if s.startswith("#bytes"):
            head = s.split()
            continue
        f = s.split()
        if head and f and f[0].isdigit() and len(f) >= 4:
            if test == "ib_send_lat":
                col = next(i for i, h in enumerate(head) if h.startswith("t_typical"))
                rows.append((test, int(f[0]), float(f[col]), "us typical"))
            else:
                # "#bytes #iterations BW peak[MB/sec] BW average[MB/sec] ...": the
                # header's words are not the columns; the average is the fourth figure
                rows.append((test, int(f[0]), float(f[3]), "MB/s average"))
            head = None
    return rows


def human(n):
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}iB"
    return f"{n} B"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    res = sys.argv[1]
    data = sweeps(os.path.join(res, "g0", "rank0.out"))
    if "libcoll" not in data:
        sys.exit(f"ib-bed-table: no libcoll sweep in {res}/g0/rank0.out")
    peer = "mpich5" if "mpich5" in data else None
    med = {}
    for who, runs in data.items():
        sizes = sorted(set().union(*[r.keys() for r in runs]))
        for s in sizes:
            ts = [r[s] for r in runs if s in r]
            med[who, s] = (statistics.median(t for t, _ in ts), statistics.median(b for _, b in ts), len(ts))
    sizes = sorted(s for w, s in med if w == "libcoll")
    print("| size | libcoll (us) | MPICH 5 over UCX (us) | libcoll / MPICH | libcoll busbw (MB/s) | MPICH busbw (MB/s) |")
    print("|---:|---:|---:|---:|---:|---:|")
    fails = []
    for s in sizes:
        t, b, n = med["libcoll", s]
        if peer and (peer, s) in med:
            pt, pb, pn = med[peer, s]
            ratio = t / pt
            print(f"| {human(s)} | {t:.0f} | {pt:.0f} | {ratio:.2f} | {b:.3g} | {pb:.3g} |")
            if s <= 65536 and ratio > 1.1:
                fails.append(f"{human(s)}: {ratio:.2f}x the peer's time (bound 1.1x)")
            if s >= 1 << 20 and ratio > 1.0:
                fails.append(f"{human(s)}: {1 / ratio:.2f} of the peer's bandwidth (bound 1.0)")
        else:
            print(f"| {human(s)} | {t:.0f} | - | - | {b:.3g} | - |")
    reps = max(n for (w, _), (_, _, n) in med.items())
    print(f"\nmedians of {reps} repetitions each, interleaved (order swapped every repetition); "
          "out-of-place times, 2 guests x 1 rank, float32 sum")
    pt = perftest(os.path.join(res, "perf-g0.txt"))
    if pt:
        print("\nthe fabric's own limit (perftest, guest 0 -> guest 1, same boot):")
        for test, size, fig, unit in pt:
            print(f"  {test} {human(size)}: {fig:.2f} {unit}")
    if peer:
        print("\nagainst the issue's bounds: " + ("all hold" if not fails else "; ".join(fails)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
