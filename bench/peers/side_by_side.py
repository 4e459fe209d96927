#!/usr/bin/python3
"""side_by_side.py — libcoll's coll-bench against Open MPI, MPICH and Gloo on this machine,
interleaved, with the medians and ratios docs/perf.md quotes.

  bench/peers/side_by_side.py --preset large [--reps 3] [--build build]
  bench/peers/side_by_side.py --preset small
  bench/peers/side_by_side.py --ranks 2 --colls all_to_all,gather,scatter --sizes 1M,16M \\
      --who openmpi,mpich,gloo,libcoll --metric busbw

Every repetition runs each library once per (ranks, collective) in the order of --who
before the next repetition starts (A B C A B C ...), so all of them see the same state of a
shared machine; a cell of the summary is the median over the repetitions.  Ratios are
libcoll / the best peer of that row: busbw, higher is better for libcoll; time, lower is.
Where a peer's call exists in one placement only (MPI_Bcast, torch's in-place all_reduce,
broadcast and reduce, and gloo's out-of-place-only calls), that placement stands in for
the other and the cell is marked "*".

The programs (built by meson into BUILD, see bench/peers/meson.build):
  openmpi   mpirun.openmpi [--allow-run-as-root] --oversubscribe -np N
                BUILD/bench/peers/mpi_coll_bench.openmpi COLL -s SIZES PEER_ARGS
  mpich     mpirun.mpich -np N BUILD/bench/peers/mpi_coll_bench.mpich COLL -s SIZES PEER_ARGS
  gloo      /usr/bin/python3 bench/peers/gloo_bench.py COLL --ranks N -s SIZES PEER_ARGS
  libcoll   BUILD/bench/coll-bench COLL --ranks N -b S -e S COLL_ARGS (one run per size, or
                -b MIN -e MAX -f F when the sizes are a geometric series)
  libcoll-windows   the same with -R 1 (buffers from coll_mem_alloc)
--tuned exports GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=...
to every run (Open MPI: -x GLIBC_TUNABLES): "malloc-tuned" in docs/perf.md, so the MPIs'
per-call scratch buffers are not fresh memory each time (see the design notes).

Every program's whole output is kept in --out (default /tmp/side_by_side-DATE), one file
per run, its command line first; runs.txt there has one line per measurement:
  rep ranks collective size who placement time_us busbw_gbps [algorithm]
Must never: run two programs at once, or print a figure that is not the median of runs
whose output files are kept.
"""
import argparse
import datetime
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184"
PEERS = ("openmpi", "mpich", "gloo")
LABELS = {"openmpi": "Open MPI", "mpich": "MPICH", "gloo": "Gloo", "libcoll": "libcoll",
          "libcoll-windows": "libcoll windows"}

# What docs/perf.md ran (section "Shared memory on one host").
PRESETS = {
    "large": dict(ranks="2,4", colls="all_reduce,all_gather,reduce_scatter", sizes="64M,256M",
                  who="openmpi,mpich,libcoll,libcoll-windows", metric="busbw", tuned=True,
                  peer_args="-t 1 -n 5 -w 5 -c 0", coll_args="-n 10 -w 2 -c 0 -z 1"),
    "small": dict(ranks="2,4", colls="all_reduce", sizes="8,64,512,4K,32K,64K",
                  who="openmpi,mpich,libcoll", metric="time", tuned=True,
                  peer_args="-t 0.3 -n 5 -w 5 -c 0", coll_args="-n 5000 -w 500 -c 0 -z 1"),
    # the peers alone at the points of the peers' own table (bench/peers/README.md)
    "peers": dict(ranks="2,4", colls="all_reduce", sizes="8,1K,64M,256M",
                  who="openmpi,mpich,gloo", metric="time,busbw", tuned=False,
                  peer_args="-t 0.2 -n 5 -w 5 -c 0", coll_args="-n 20 -w 5 -c 0 -z 1"),
}


def load_average():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def parse_size(s):
    s = s.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s and s[-1].upper() in mult:
        return int(s[:-1]) * mult[s[-1].upper()]
    return int(s)


def geometric(sizes):
    """(min, max, factor) when sizes are min*f^k, else None."""
    if len(sizes) < 2 or sizes[0] == 0 or sizes[1] % sizes[0]:
        return None
    f = sizes[1] // sizes[0]
    if f < 2 or any(b != a * f for a, b in zip(sizes, sizes[1:])):
        return None
    return sizes[0], sizes[-1], f


def parse_tables(text):
    """Rows of an nccl-tests-style output: (collective, size, [(time, busbw) or None] x 2,
    last column)."""
    rows, coll = [], None
    for line in text.splitlines():
        if line.startswith("# Collective: "):
            coll = line.split()[2]
            continue
        p = line.split()
        if not coll or line.startswith("#") or len(p) < 14 or not p[0].isdigit():
            continue
        places = []
        for k in (5, 9):
            places.append(None if p[k] == "N/A" else (float(p[k]), float(p[k + 2])))
        rows.append((coll, int(p[0]), places, p[-1]))
    return rows


class Runner:
    def __init__(self, a):
        self.a = a
        self.env = dict(os.environ)
        if a.tuned:
            self.env["GLIBC_TUNABLES"] = TUNABLES
        self.runs = open(os.path.join(a.out, "runs.txt"), "a")
        self.data = {}  # (np, coll, size, who, placement) -> [(time, busbw, algo)]
        self.failed = []

    def commands(self, who, np_, coll, sizes):
        a, b = self.a, self.a.build
        slist = ",".join(str(s) for s in sizes)
        if who == "openmpi":
            cmd = ["mpirun.openmpi"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
            cmd += ["--oversubscribe", "-np", str(np_)]
            if a.tuned:
                cmd += ["-x", "GLIBC_TUNABLES"]
            return [cmd + [f"{b}/bench/peers/mpi_coll_bench.openmpi", coll, "-s", slist]
                    + a.peer_args]
        if who == "mpich":
            return [["mpirun.mpich", "-np", str(np_), f"{b}/bench/peers/mpi_coll_bench.mpich",
                     coll, "-s", slist] + a.peer_args]
        if who == "gloo":
            return [[a.python, os.path.join(HERE, "gloo_bench.py"), coll, "--ranks", str(np_),
                     "-s", slist] + a.peer_args]
        base = [f"{b}/bench/coll-bench", coll, "--ranks", str(np_)] + a.coll_args
        if who == "libcoll-windows":
            base += ["-R", "1"]
        g = geometric(sizes)
        if g:
            return [base + ["-b", str(g[0]), "-e", str(g[1]), "-f", str(g[2])]]
        return [base + ["-b", str(s), "-e", str(s)] for s in sizes]

    def run(self, rep, np_, coll, who, sizes):
        for i, cmd in enumerate(self.commands(who, np_, coll, sizes)):
            name = f"rep{rep}_n{np_}_{coll}_{who}{'_' + str(i) if i else ''}.txt"
            path = os.path.join(self.a.out, name)
            started = datetime.datetime.now().isoformat(timespec="seconds")
            t0 = time.monotonic()
            # its own process group, so that a timeout ends the launcher and every rank
            p = subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)
            try:
                out, _ = p.communicate(timeout=self.a.timeout)
                rc = p.returncode
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, _ = p.communicate()
                rc = f"killed after {self.a.timeout:g} s"
            with open(path, "w") as f:
                f.write(f"# side_by_side: {shlex.join(cmd)}\n"
                        f"# started {started}, load average {load_average()}, "
                        f"GLIBC_TUNABLES={self.env.get('GLIBC_TUNABLES', '')}\n{out}"
                        f"# exit status: {rc}, {time.monotonic() - t0:.1f} s\n")
            if rc != 0:
                self.failed.append(f"{name}: exit status {rc}")
                print(f"side_by_side: {name}: exit status {rc} (kept in {path})", file=sys.stderr)
            for c, size, places, last in parse_tables(out):
                if c != coll:
                    continue
                for k, pl in enumerate(places):
                    if pl is None:
                        continue
                    placement = ("out", "in")[k]
                    algo = last if who.startswith("libcoll") else ""
                    self.data.setdefault((np_, coll, size, who, placement), []).append(
                        (pl[0], pl[1], algo))
                    line = f"{rep} {np_} {coll} {size} {who} {placement} {pl[0]} {pl[1]} {algo}"
                    print(line.rstrip(), file=self.runs, flush=True)
                    if self.a.verbose:
                        print(line, file=sys.stderr)

    def cell(self, np_, coll, size, who, placement, metric):
        """(median, marked, algorithm) of one library at one point, or None."""
        marked = False
        v = self.data.get((np_, coll, size, who, placement))
        if not v:
            v = self.data.get((np_, coll, size, who, "in" if placement == "out" else "out"))
            marked = bool(v)
        if not v:
            return None
        k = 0 if metric == "time" else 1
        algos = [x[2] for x in v if x[2]]
        algo = max(set(algos), key=algos.count) if algos else ""
        return statistics.median(x[k] for x in v), marked, algo, len(v)


def fmt(v, metric):
    if v is None:
        return "n/a"
    x, marked, algo, _ = v
    s = (f"{x:,.0f}" if x >= 1000 else f"{x:.2f}") if metric == "time" else f"{x:.2f}"
    if algo:
        s += f" ({algo})"
    return s + ("*" if marked else "")


def summary(r, a, metric, placement):
    peers = [w for w in a.who if w in PEERS]
    ours = [w for w in a.who if w not in PEERS]
    unit = "time in us (lower is better)" if metric == "time" else "busbw in GB/s (higher is better)"
    print(f"\n### {unit}, {'out-of-place' if placement == 'out' else 'in-place'}, "
          f"medians of {a.reps} interleaved runs{', peers malloc-tuned' if a.tuned else ''}\n")
    head = ["n", "collective", "size"] + [LABELS[w] for w in peers]
    for w in ours:
        head += [LABELS[w]] + (["ratio"] if peers else [])
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    sizes = sorted({k[2] for k in r.data})
    for np_ in a.ranks:
        for coll in a.colls:
            for size in sizes:
                cells = {w: r.cell(np_, coll, size, w, placement, metric) for w in a.who}
                if all(c is None for c in cells.values()):
                    continue
                row = [str(np_), coll, size_text(size)] + [fmt(cells[w], metric) for w in peers]
                pv = [cells[w][0] for w in peers if cells[w] is not None]
                best = (min(pv) if metric == "time" else max(pv)) if pv else None
                for w in ours:
                    row.append(fmt(cells[w], metric))
                    if peers:
                        ok = cells[w] is not None and best
                        row.append(f"{cells[w][0] / best:.2f}x" if ok else "n/a")
                print("| " + " | ".join(row) + " |")


def size_text(s):
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if s >= 1 << shift and s % (1 << shift) == 0:
            return f"{s >> shift} {unit}"
    return f"{s} B"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), help="what docs/perf.md ran")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="meson build directory")
    ap.add_argument("--ranks", help="comma list of rank counts (default 2,4)")
    ap.add_argument("--colls", help="comma list of collectives")
    ap.add_argument("--sizes", help="comma list of sizes, K/M/G suffixes")
    ap.add_argument("--who", help="comma list of openmpi,mpich,gloo,libcoll,libcoll-windows")
    ap.add_argument("--metric", help="time, busbw or both (comma list)")
    ap.add_argument("--placement", default="out", choices=("out", "in", "both"))
    ap.add_argument("--tuned", action="store_true", default=None,
                    help="GLIBC_TUNABLES for every run (the presets set it where perf.md did)")
    ap.add_argument("--untuned", dest="tuned", action="store_false")
    ap.add_argument("--peer-args", help="flags for mpi_coll_bench and gloo_bench.py")
    ap.add_argument("--coll-args", help="flags for coll-bench")
    ap.add_argument("--python", default="/usr/bin/python3", help="the Python with torch")
    ap.add_argument("--out", default=None, help="where the raw outputs go")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per program run")
    ap.add_argument("--verbose", action="store_true", help="print every measurement")
    a = ap.parse_args()
    base = dict(PRESETS.get(a.preset) or dict(
        ranks="2,4", colls="all_reduce", sizes="64M", who="openmpi,mpich,gloo,libcoll",
        metric="busbw", tuned=False, peer_args="-n 20 -w 5 -c 0",
        coll_args="-n 20 -w 5 -c 0 -z 1"))
    for k in base:
        if getattr(a, k) is None:
            setattr(a, k, base[k])
    a.ranks = [int(x) for x in a.ranks.split(",")]
    a.colls = a.colls.split(",")
    a.sizes = sorted(parse_size(x) for x in a.sizes.split(","))
    a.who = a.who.split(",")
    for w in a.who:
        if w not in LABELS:
            ap.error(f"--who: unknown '{w}' ({', '.join(LABELS)})")
    a.metric = ["time", "busbw"] if a.metric in ("both", "time,busbw", "busbw,time") else [a.metric]
    a.peer_args = shlex.split(a.peer_args)
    a.coll_args = shlex.split(a.coll_args)
    a.build = os.path.abspath(a.build)
    a.out = a.out or f"/tmp/side_by_side-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    os.makedirs(a.out, exist_ok=True)
    for w in a.who:
        need = {"openmpi": f"{a.build}/bench/peers/mpi_coll_bench.openmpi",
                "mpich": f"{a.build}/bench/peers/mpi_coll_bench.mpich",
                "libcoll": f"{a.build}/bench/coll-bench",
                "libcoll-windows": f"{a.build}/bench/coll-bench"}.get(w)
        if need and not os.access(need, os.X_OK):
            sys.exit(f"side_by_side: {need} is not built (ninja -C {a.build}; the MPI peers are "
                     "built when meson finds mpicc.openmpi / mpicc.mpich)")

    r = Runner(a)
    print(f"side_by_side: {a.reps} repetitions of {','.join(a.who)}; raw outputs in {a.out}; "
          f"load average {load_average()}", file=sys.stderr, flush=True)
    for rep in range(1, a.reps + 1):
        for np_ in a.ranks:
            for coll in a.colls:
                for who in a.who:
                    r.run(rep, np_, coll, who, a.sizes)
    for metric in a.metric:
        for placement in (("out", "in") if a.placement == "both" else (a.placement,)):
            summary(r, a, metric, placement)
    print(f"\n(* the other placement: that library's call has only this one.  Raw: {a.out})",
          flush=True)
    if r.failed:
        print("side_by_side: runs that failed:\n  " + "\n  ".join(r.failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
