#!/usr/bin/python3
"""side_by_side.py — libcoll's coll-bench against Intel MPI, Open MPI, MPICH and Gloo on this
machine, interleaved, with the medians and ratios docs/perf.md quotes.

  bench/peers/side_by_side.py --preset headline [--reps 3] [--build build]
  bench/peers/side_by_side.py --preset large
  bench/peers/side_by_side.py --preset small
  bench/peers/side_by_side.py --preset impi-sweep          # Intel MPI's best algorithm per size
  bench/peers/side_by_side.py --ranks 2 --colls all_to_all,gather,scatter --sizes 1M,16M \
      --who impi,openmpi5,mpich5,openmpi,mpich,gloo,libcoll --metric busbw

Every repetition runs each library once per (ranks, collective) in the order of --who
before the next repetition starts (A B C A B C ...), so all of them see the same state of a
shared machine; a cell of the summary is the median over the repetitions.  Ratios are
libcoll / the best peer of that row: busbw, higher is better for libcoll; time, lower is.
Where a peer's call exists in one placement only (MPI_Bcast, torch's in-place all_reduce,
broadcast and reduce, gloo's out-of-place-only calls, IMB's out-of-place calls), that
placement stands in for the other and the cell is marked "*".

The programs (mpi_coll_bench built by meson into BUILD, see bench/peers/meson.build; the
wheels unpacked by bench/peers/get_wheels.sh into PEERS_DIR, default /opt/libcoll/peers):
  openmpi   Debian's Open MPI 4.1: mpirun.openmpi [--allow-run-as-root] --oversubscribe -np N
                BUILD/bench/peers/mpi_coll_bench.openmpi COLL -s SIZES PEER_ARGS
  mpich     Debian's MPICH 4.0: mpirun.mpich -np N BUILD/bench/peers/mpi_coll_bench.mpich ...
  impi      Intel MPI 2021.19: I_MPI_FABRICS=shm PEERS_DIR/impi-2021.19.0/bin/mpirun -np N
                BUILD/bench/peers/mpi_coll_bench.impi ...
  openmpi5  Open MPI 5.0.11: PEERS_DIR/openmpi-5.0.11/bin/mpirun [--allow-run-as-root]
                --oversubscribe -np N BUILD/bench/peers/mpi_coll_bench.openmpi5 ...
  mpich5    MPICH 5.0.2: PEERS_DIR/mpich-5.0.2/bin/mpirun -np N .../mpi_coll_bench.mpich5 ...
  imb       Intel MPI's own IMB-MPI1 (second opinion on impi): I_MPI_FABRICS=shm
                LD_LIBRARY_PATH=PEERS_DIR/impi-2021.19.0/lib .../bin/mpirun -np N
                .../bin/IMB-MPI1 Allreduce -npmin N -msglen FILE IMB_ARGS; its time is t_max
                (the slowest rank's mean, as coll-bench's); out-of-place; it checks nothing
  gloo      /usr/bin/python3 bench/peers/gloo_bench.py COLL --ranks N -s SIZES PEER_ARGS
  libcoll   BUILD/bench/coll-bench COLL --ranks N -b S -e S COLL_ARGS (one run per size, or
                -b MIN -e MAX -f F when the sizes are a geometric series)
  libcoll-windows   the same with -R 1 (buffers from coll_mem_alloc)
libcoll may carry a row of its algorithm table too: libcoll@ring, libcoll@direct ... run
coll-bench with COLL_ALGO set, each in a column of its own beside plain libcoll (the
tuner's choice), which alone makes the ratio's numerator; --best never folds them in, so
a table shows which row won each cell without crediting libcoll with a choice its tuner
did not make.
An MPI peer may carry a setting: WHO@ALG forces that library's algorithm for the collective
measured (impi, imb: I_MPI_ADJUST_<OP>=ALG, which may be Intel's conditional form
"13:65536-67108864"; openmpi, openmpi5: --mca coll_tuned_use_dynamic_rules 1 --mca
coll_tuned_<op>_algorithm ALG; mpich, mpich5: MPIR_CVAR_<OP>_INTRA_ALGORITHM=ALG, a name);
WHO@A-B is every ALG from A to B, impi@all every preset Intel MPI has for the collective
(impi_info -v I_MPI_ADJUST_<OP>).  --best folds a library's settings into one column, the
best median of each cell with its setting in parentheses ("-" the library's default):
that is "I_MPI_ADJUST_ALLREDUCE chosen per size".
--tuned exports GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=...
to every run (Open MPI: -x GLIBC_TUNABLES): "malloc-tuned" in docs/perf.md, so the MPIs'
per-call scratch buffers are not fresh memory each time (see the design notes).

Every program's whole output is kept in --out (default /tmp/side_by_side-DATE), one file
per run, its command line and settings first; runs.txt there has one line per measurement:
  rep ranks collective size who placement time_us busbw_gbps [algorithm]
Before every run it reads where the host has put cpus 0 and 1: the spin round trip of
BUILD/bench/peers/pingpong_bench -m spin -n 20000 (about 0.1 s).  On the development VM
the host moves its two vCPUs between one shared physical core (~0.06 us) and cores far
apart (0.25-0.46 us), and the 2-rank figures move with it (docs/perf.md, "The machine's
two placements").  Each raw file's header has the reading taken before it, and the
summary ends with their range per repetition, so a table says where it ran.
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
PEERS = ("impi", "imb", "openmpi5", "mpich5", "openmpi", "mpich", "gloo")
LABELS = {"impi": "Intel MPI", "imb": "IMB-MPI1", "openmpi5": "Open MPI 5",
          "mpich5": "MPICH 5", "openmpi": "Open MPI 4", "mpich": "MPICH 4", "gloo": "Gloo",
          "libcoll": "libcoll", "libcoll-windows": "libcoll windows"}
# the wheels' prefixes under --peers-dir (bench/peers/get_wheels.sh)
WHEELS = {"impi": "impi-2021.19.0", "imb": "impi-2021.19.0", "openmpi5": "openmpi-5.0.11",
          "mpich5": "mpich-5.0.2"}
# a collective's name in each library: Intel MPI's I_MPI_ADJUST_<OP> and IMB's benchmark,
# Open MPI's coll_tuned_<op>_algorithm, MPICH's MPIR_CVAR_<OP>_INTRA_ALGORITHM; and the
# message length IMB is given for a size of ours, as a divisor (IMB counts one rank's
# block where nccl-tests count the whole buffer: all_gather, all_to_all, gather, scatter)
OPS = {"all_reduce": ("ALLREDUCE", "Allreduce", "allreduce", "ALLREDUCE", False),
       "all_gather": ("ALLGATHER", "Allgather", "allgather", "ALLGATHER", True),
       "reduce_scatter": ("REDUCE_SCATTER", "Reduce_scatter", "reduce_scatter",
                          "REDUCE_SCATTER", False),
       "broadcast": ("BCAST", "Bcast", "bcast", "BCAST", False),
       "reduce": ("REDUCE", "Reduce", "reduce", "REDUCE", False),
       "all_to_all": ("ALLTOALL", "Alltoall", "alltoall", "ALLTOALL", True),
       "gather": ("GATHER", "Gather", "gather", "GATHER", True),
       "scatter": ("SCATTER", "Scatter", "scatter", "SCATTER", True)}

# Intel MPI 2021.19's presets per collective (impi_info -v I_MPI_ADJUST_<OP>: "range: 0-N";
# one above N is ignored with a warning): impi@all is 1..N of the collective measured
IMPI_PRESETS = {"all_reduce": 32, "all_gather": 6, "reduce_scatter": 6, "broadcast": 22,
                "reduce": 19, "all_to_all": 18, "gather": 5, "scatter": 5}


def split_who(w):
    """'impi@13' -> ('impi', '13'); 'impi' -> ('impi', '')."""
    base, _, setting = w.partition("@")
    return base, setting


def impi_setting(setting):
    """Intel MPI's setting words: '13+wait' -> ('13', True); 'wait' -> ('', True).
    'wait' is I_MPI_WAIT_MODE=1: a rank waiting for a message sleeps in the kernel instead
    of polling, which is what Intel MPI needs with more ranks than cores (4 ranks on this
    machine's 2: 16-17 ms per 64 KiB all-reduce polling, 39-48 us waiting)."""
    words = setting.split("+") if setting else []
    wait = "wait" in words
    return "+".join(x for x in words if x != "wait"), wait


def label(w):
    base, setting = split_who(w)
    if base in ("impi", "imb"):
        alg, wait = impi_setting(setting)
        return LABELS[base] + (f", alg {alg}" if alg else "") + (", wait mode" if wait else "")
    return LABELS[base] + (f", alg {setting}" if setting else "")


def expand_who(words):
    """WHO@A-B (integers) -> WHO@A, ..., WHO@B; impi@all, imb@all -> every preset of
    Intel MPI (those beyond a collective's range are not run for it)."""
    out = []
    for w in words:
        base, setting = split_who(w)
        suffix = ""
        if base in ("impi", "imb"):  # impi@all+wait, impi@1-13+wait: every one in wait mode
            setting, wait = impi_setting(setting)
            suffix = "+wait" if wait else ""
        if setting == "all" and base in ("impi", "imb"):
            setting = f"1-{max(IMPI_PRESETS.values())}"
        lo, dash, hi = setting.partition("-")
        if dash and lo.isdigit() and hi.isdigit() and ":" not in setting:
            out += [f"{base}@{k}{suffix}" for k in range(int(lo), int(hi) + 1)]
        else:
            out.append(w)
    return out

# IMB-MPI1's flags: -iter bounds the repetitions per size (with the policy off -time does
# not: 100000 repetitions of 4 MiB at 4 ranks ran past 600 s); -time S is a budget of S
# seconds times the number of sizes for the whole run, after which IMB prints "time-out"
# for the sizes left (-time 1 lost 64 MiB at 4 ranks); -msglog 26 lets -msglen go to
# 64 MiB (IMB clips lengths at 4 MiB by default).
IMB_ARGS = "-iter 400 -time 10 -iter_policy off -msglog 26 -mem 4"

# What docs/perf.md ran (section "Shared memory on one host").
PRESETS = {
    # issue 44's table: all-reduce against Intel MPI at the settings its sweep found best
    # here (impi-sweep, 2026-11-29: polling with algorithms 8 and 13 on 2 ranks; wait mode
    # with 2, 10, 12, 13 and 26 on 4 ranks, where polling takes 16-20 ms a call); with
    # --best the best of them per cell; the newer MPIs, and IMB-MPI1 as a second opinion
    "headline": dict(ranks="2,4", colls="all_reduce", sizes="8,1K,64K,1M,16M,64M",
                     who="impi,impi@8,impi@13,impi@wait,impi@2+wait,impi@10+wait,"
                         "impi@12+wait,impi@13+wait,impi@26+wait,imb,imb@wait,"
                         "openmpi5,mpich5,openmpi,mpich,libcoll",
                     metric="time", tuned=False, best=True,
                     peer_args="-t 0.5 -n 5 -w 5 -c 0",
                     imb_args=IMB_ARGS,
                     coll_args="-n auto -c 0 -z 1"),
    # issue 44's third criterion: the other collectives at 1 and 64 MiB against Intel MPI
    # (every preset: the best per cell) and the rest
    "headline-colls": dict(ranks="2,4", colls="all_gather,reduce_scatter,broadcast,all_to_all",
                           sizes="1M,64M", who="impi,impi@all,impi@wait,impi@all+wait,imb,"
                           "imb@wait,openmpi5,mpich5,openmpi,mpich,libcoll", metric="time", tuned=False, best=True,
                           peer_args="-t 0.5 -n 5 -w 5 -c 0",
                           imb_args=IMB_ARGS,
                           coll_args="-n auto -c 0 -z 1"),
    # Intel MPI's all-reduce algorithms one by one, polling and in wait mode, to choose
    # I_MPI_ADJUST_ALLREDUCE per size (docs: bench/peers/README.md, "Best settings")
    "impi-sweep": dict(ranks="2,4", colls="all_reduce", sizes="8,1K,64K,1M,16M,64M",
                       who="impi,impi@wait,impi@all,impi@all+wait", metric="time", tuned=False, best=False,
                       peer_args="-t 0.3 -n 3 -w 3 -c 0", coll_args=""),
    "large": dict(ranks="2,4", colls="all_reduce,all_gather,reduce_scatter", sizes="64M,256M",
                  who="openmpi,mpich,libcoll,libcoll-windows", metric="busbw", tuned=True,
                  best=False,
                  peer_args="-t 1 -n 5 -w 5 -c 0", coll_args="-n 10 -w 2 -c 0 -z 1"),
    "small": dict(ranks="2,4", colls="all_reduce", sizes="8,64,512,4K,32K,64K",
                  who="openmpi,mpich,libcoll", metric="time", tuned=True, best=False,
                  peer_args="-t 0.3 -n 5 -w 5 -c 0", coll_args="-n 5000 -w 500 -c 0 -z 1"),
    # the peers alone at the points of the peers' own table (bench/peers/README.md)
    "peers": dict(ranks="2,4", colls="all_reduce", sizes="8,1K,64M,256M",
                  who="openmpi,mpich,gloo", metric="time,busbw", tuned=False, best=False,
                  peer_args="-t 0.2 -n 5 -w 5 -c 0", coll_args="-n 20 -w 5 -c 0 -z 1"),
}


def load_average():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def cross_core_rt(build):
    """The spin round trip between cpus 0 and 1 in us (pingpong_bench's median of 5), or
    None when the program is not built or does not answer."""
    prog = os.path.join(build, "bench", "peers", "pingpong_bench")
    try:
        out = subprocess.run([prog, "-m", "spin", "-n", "20000"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        f = line.split()
        if f[:1] == ["spin"] and "median" in f:
            return float(f[f.index("median") + 1])
    return None


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


def parse_imb(text, coll, np_):
    """Rows of an IMB-MPI1 table as parse_tables gives them: (collective, our size,
    [(t_max, busbw), None], ""), out-of-place only."""
    rows, on = [], False
    per_rank = OPS[coll][4]
    for line in text.splitlines():
        if line.startswith("# Benchmarking "):
            on = line.split()[2] == OPS[coll][1]
            continue
        if line.startswith("# #processes = "):
            on = on and int(line.split()[3]) == np_
            continue
        p = line.split()
        if not on or len(p) != 5 or not p[0].isdigit() or int(p[0]) == 0:
            continue
        size = int(p[0]) * (np_ if per_rank else 1)
        t = float(p[3])  # t_max: the slowest rank's mean
        rows.append((coll, size, [(t, round(size / 1e3 / t * bus_factor(coll, np_), 4)), None], ""))
    return rows


def bus_factor(coll, n):
    if coll == "all_reduce":
        return 2.0 * (n - 1) / n
    return 1.0 if coll in ("broadcast", "reduce") else (n - 1) / n


def coll_iters(size):
    """-n auto for coll-bench: about 1 GiB moved per size, 5 to 200000 calls.  The peers
    time about 0.5 s per size (-t 0.5); 5000 calls of 1 KiB were 4 ms, and the same
    2-rank all-reduce read 0.77-0.82 us there against 0.73-0.74 over 20000 calls."""
    n = max(5, min(200000, (1 << 30) // max(size, 1)))
    return n, max(2, n // 10)


class Runner:
    def __init__(self, a):
        self.a = a
        self.env = dict(os.environ)
        if self.env.pop("COLL_ALGO", None) is not None:  # plain libcoll is the tuner's choice
            print("side_by_side: COLL_ALGO is ignored: name a row as libcoll@ROW",
                  file=sys.stderr)
        if a.tuned:
            self.env["GLIBC_TUNABLES"] = TUNABLES
        self.runs = open(os.path.join(a.out, "runs.txt"), "a")
        self.data = {}  # (np, coll, size, who, placement) -> [(time, busbw, algo)]
        self.failed = []
        self.rt = {}  # rep -> [cross-core round trips (us) read before its runs]

    def commands(self, who, np_, coll, sizes):
        """[(argv, extra environment)] for one library at one (ranks, collective)."""
        a, b = self.a, self.a.build
        base_who, setting = split_who(who)
        slist = ",".join(str(s) for s in sizes)
        prefix = os.path.join(a.peers_dir, WHEELS.get(base_who, ""))
        env = {}
        if base_who in ("impi", "imb"):
            env["I_MPI_FABRICS"] = "shm"  # one host, without libfabric
            alg, wait = impi_setting(setting)
            if alg:
                env["I_MPI_ADJUST_" + OPS[coll][0]] = alg
            if wait:
                env["I_MPI_WAIT_MODE"] = "1"
        if base_who in ("mpich", "mpich5") and setting:
            env[f"MPIR_CVAR_{OPS[coll][3]}_INTRA_ALGORITHM"] = setting
        bench = [f"{b}/bench/peers/mpi_coll_bench.{base_who}", coll, "-s", slist] + a.peer_args
        if base_who in ("openmpi", "openmpi5"):
            cmd = ["mpirun.openmpi" if base_who == "openmpi" else f"{prefix}/bin/mpirun"]
            cmd += ["--allow-run-as-root"] if os.geteuid() == 0 else []
            cmd += ["--oversubscribe", "-np", str(np_)]
            if a.tuned:
                cmd += ["-x", "GLIBC_TUNABLES"]
            if setting:
                cmd += ["--mca", "coll_tuned_use_dynamic_rules", "1",
                        "--mca", f"coll_tuned_{OPS[coll][2]}_algorithm", setting]
            return [(cmd + bench, env)]
        if base_who == "mpich":
            return [(["mpirun.mpich", "-np", str(np_)] + bench, env)]
        if base_who in ("mpich5", "impi"):  # hydra: the whole environment goes to the ranks
            return [([f"{prefix}/bin/mpirun", "-np", str(np_)] + bench, env)]
        if base_who == "imb":
            env["LD_LIBRARY_PATH"] = f"{prefix}/lib"  # IMB-MPI1 has no RUNPATH
            per_rank = OPS[coll][4]
            lens = os.path.join(a.out, f"imb_msglen_{coll}_n{np_}.txt")
            with open(lens, "w") as f:
                f.write("".join(f"{s // np_ if per_rank else s}\n" for s in sizes))
            return [([f"{prefix}/bin/mpirun", "-np", str(np_), f"{prefix}/bin/IMB-MPI1",
                      OPS[coll][1], "-npmin", str(np_), "-msglen", lens] + a.imb_args, env)]
        if base_who == "gloo":
            return [([a.python, os.path.join(HERE, "gloo_bench.py"), coll, "--ranks", str(np_),
                      "-s", slist] + a.peer_args, env)]
        base = [f"{b}/bench/coll-bench", coll, "--ranks", str(np_)]
        if setting:
            env["COLL_ALGO"] = setting  # the row forced (libcoll/algo/table.c)
        if base_who == "libcoll-windows":
            base += ["-R", "1"]
        if "auto" in a.coll_args:  # -n auto: the count of calls follows the size
            out = []
            for s in sizes:
                n, w = coll_iters(s)
                args = [str(n) if x == "auto" else x for x in a.coll_args]
                out.append((base + args + ["-w", str(w), "-b", str(s), "-e", str(s)], env))
            return out
        base += a.coll_args
        g = geometric(sizes)
        if g:
            return [(base + ["-b", str(g[0]), "-e", str(g[1]), "-f", str(g[2])], env)]
        return [(base + ["-b", str(s), "-e", str(s)], env) for s in sizes]

    def run(self, rep, np_, coll, who, sizes):
        base_who, setting = split_who(who)
        alg = impi_setting(setting)[0] if base_who in ("impi", "imb") else ""
        if alg.isdigit() and int(alg) > IMPI_PRESETS[coll]:
            return  # Intel MPI would ignore it and run its default
        for i, (cmd, extra) in enumerate(self.commands(who, np_, coll, sizes)):
            name = f"rep{rep}_n{np_}_{coll}_{who}{'_' + str(i) if i else ''}.txt"
            path = os.path.join(self.a.out, name)
            rt = cross_core_rt(self.a.build)
            if rt is not None:
                self.rt.setdefault(rep, []).append(rt)
            started = datetime.datetime.now().isoformat(timespec="seconds")
            t0 = time.monotonic()
            env = dict(self.env, **extra)
            # its own process group, so that a timeout ends the launcher and every rank
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)
            try:
                out, _ = p.communicate(timeout=self.a.timeout)
                rc = p.returncode
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, _ = p.communicate()
                rc = f"killed after {self.a.timeout:g} s"
            settings = " ".join(f"{k}={v}" for k, v in sorted(extra.items()))
            with open(path, "w") as f:
                f.write(f"# side_by_side: {settings + ' ' if settings else ''}{shlex.join(cmd)}\n"
                        f"# started {started}, load average {load_average()}, "
                        f"GLIBC_TUNABLES={env.get('GLIBC_TUNABLES', '')}, cross-core round trip "
                        f"{'?' if rt is None else f'{rt:.3f}'} us\n{out}"
                        f"# exit status: {rc}, {time.monotonic() - t0:.1f} s\n")
            if rc != 0:
                self.failed.append(f"{name}: exit status {rc}")
                print(f"side_by_side: {name}: exit status {rc} (kept in {path})", file=sys.stderr)
            rows = parse_imb(out, coll, np_) if who.startswith("imb") else parse_tables(out)
            for c, size, places, last in rows:
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
                        print(f"{line.rstrip()}   (round trip {'?' if rt is None else rt})",
                              file=sys.stderr)

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


def columns(a):
    """The peers' columns: [(title, [who, ...])], one per --who, or with --best one per
    library, its settings folded in."""
    peers = [w for w in a.who if split_who(w)[0] in PEERS]
    if not a.best:
        return [(label(w), [w]) for w in peers]
    cols = {}
    for w in peers:
        cols.setdefault(split_who(w)[0], []).append(w)
    return [(LABELS[b] + (" best" if len(ws) > 1 else ""), ws) for b, ws in cols.items()]


def best_cell(r, np_, coll, size, ws, placement, metric):
    """The best median of the settings ws at one point, its setting in the algorithm slot
    ("-": the library's default) when there are several."""
    got = [(r.cell(np_, coll, size, w, placement, metric), w) for w in ws]
    got = [(c, w) for c, w in got if c is not None]
    if not got:
        return None
    pick = min if metric == "time" else max
    c, w = pick(got, key=lambda x: x[0][0])
    return (c[0], c[1], (split_who(w)[1] or "-") if len(ws) > 1 else c[2], c[3])


def summary(r, a, metric, placement):
    cols = columns(a)
    ours = [w for w in a.who if split_who(w)[0] not in PEERS]
    unit = "time in us (lower is better)" if metric == "time" else "busbw in GB/s (higher is better)"
    print(f"\n### {unit}, {'out-of-place' if placement == 'out' else 'in-place'}, "
          f"medians of {a.reps} interleaved runs{', peers malloc-tuned' if a.tuned else ''}"
          f"{', best setting of each library (in parentheses)' if a.best else ''}\n")
    head = ["n", "collective", "size"] + [t for t, _ in cols]
    for w in ours:
        head += [label(w)] + (["ratio"] if cols and not split_who(w)[1] else [])
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    sizes = sorted({k[2] for k in r.data})
    for np_ in a.ranks:
        for coll in a.colls:
            for size in sizes:
                pc = [best_cell(r, np_, coll, size, ws, placement, metric) for _, ws in cols]
                oc = [r.cell(np_, coll, size, w, placement, metric) for w in ours]
                if all(c is None for c in pc + oc):
                    continue
                row = [str(np_), coll, size_text(size)] + [fmt(c, metric) for c in pc]
                pv = [c[0] for c in pc if c is not None]
                best = (min(pv) if metric == "time" else max(pv)) if pv else None
                for w, c in zip(ours, oc):
                    row.append(fmt(c, metric))
                    if cols and not split_who(w)[1]:
                        row.append(f"{c[0] / best:.2f}x" if c is not None and best else "n/a")
                print("| " + " | ".join(row) + " |")


def placements_text(rt):
    """One line: the cross-core round trips read before each repetition's runs."""
    if not rt:
        return "(cross-core round trip: not read; build bench/peers/pingpong_bench)"
    reps = "; ".join(f"{k}: {min(v):.2f}-{max(v):.2f}" for k, v in sorted(rt.items()))
    every = [x for v in rt.values() for x in v]
    near = sum(x < 0.15 for x in every)
    return (f"(cross-core round trip before each run, us, per repetition: {reps}; "
            f"{near} of {len(every)} runs with both cpus on one physical core (< 0.15 us))")


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
    ap.add_argument("--who", help="comma list of impi,imb,openmpi5,mpich5,openmpi,mpich,gloo,"
                    "libcoll,libcoll-windows; an MPI may carry @ALG or @A-B, libcoll @ROW "
                    "(above)")
    ap.add_argument("--best", action="store_true", default=None,
                    help="one column per library: the best of its settings per cell")
    ap.add_argument("--no-best", dest="best", action="store_false")
    ap.add_argument("--peers-dir", default=os.environ.get("COLL_PEERS_DIR", "/opt/libcoll/peers"),
                    help="where bench/peers/get_wheels.sh unpacked the MPI wheels")
    ap.add_argument("--imb-args", help="flags for IMB-MPI1 after -npmin N -msglen FILE")
    ap.add_argument("--metric", help="time, busbw or both (comma list)")
    ap.add_argument("--placement", default="out", choices=("out", "in", "both"))
    ap.add_argument("--tuned", action="store_true", default=None,
                    help="GLIBC_TUNABLES for every run (the presets set it where perf.md did)")
    ap.add_argument("--untuned", dest="tuned", action="store_false")
    ap.add_argument("--peer-args", help="flags for mpi_coll_bench and gloo_bench.py")
    ap.add_argument("--coll-args", help="flags for coll-bench ('-n auto': calls per size "
                    "from the size, 5 to 5000, and a tenth of that as warmup)")
    ap.add_argument("--python", default="/usr/bin/python3", help="the Python with torch")
    ap.add_argument("--out", default=None, help="where the raw outputs go")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per program run")
    ap.add_argument("--verbose", action="store_true", help="print every measurement")
    a = ap.parse_args()
    base = dict(PRESETS.get(a.preset) or dict(
        ranks="2,4", colls="all_reduce", sizes="64M", who="openmpi,mpich,gloo,libcoll",
        metric="busbw", tuned=False, best=False, peer_args="-n 20 -w 5 -c 0",
        coll_args="-n 20 -w 5 -c 0 -z 1"))
    base.setdefault("imb_args", IMB_ARGS)
    for k in base:
        if getattr(a, k) is None:
            setattr(a, k, base[k])
    a.ranks = [int(x) for x in a.ranks.split(",")]
    a.colls = a.colls.split(",")
    a.sizes = sorted(parse_size(x) for x in a.sizes.split(","))
    a.who = expand_who(a.who.split(","))
    for w in a.who:
        b, setting = split_who(w)
        if b not in LABELS:
            ap.error(f"--who: unknown '{w}' ({', '.join(LABELS)})")
        if setting and b in ("gloo", "libcoll-windows"):
            ap.error(f"--who: '{w}': only an MPI or libcoll takes a setting")
        if setting and b == "libcoll" and not setting.replace("_", "").isalnum():
            ap.error(f"--who: '{w}': libcoll@NAME takes a row of the algorithm table")
    a.metric = ["time", "busbw"] if a.metric in ("both", "time,busbw", "busbw,time") else [a.metric]
    a.peer_args = shlex.split(a.peer_args)
    a.coll_args = shlex.split(a.coll_args)
    a.imb_args = shlex.split(a.imb_args)
    if "auto" in a.coll_args and (a.coll_args.index("auto") == 0 or
                                  a.coll_args[a.coll_args.index("auto") - 1] != "-n"):
        ap.error("--coll-args: 'auto' is a value of -n only")
    if "auto" in a.coll_args and "-w" in a.coll_args:
        ap.error("--coll-args: -n auto sets -w too")
    a.build = os.path.abspath(a.build)
    a.out = a.out or f"/tmp/side_by_side-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    os.makedirs(a.out, exist_ok=True)
    for w in a.who:
        b = split_who(w)[0]
        prefix = os.path.join(a.peers_dir, WHEELS.get(b, ""))
        need = {"libcoll": f"{a.build}/bench/coll-bench",
                "libcoll-windows": f"{a.build}/bench/coll-bench",
                "imb": f"{prefix}/bin/IMB-MPI1", "gloo": None}.get(
                    b, f"{a.build}/bench/peers/mpi_coll_bench.{b}")
        if need and not os.access(need, os.X_OK):
            how = (f"ninja -C {a.build}; meson builds mpi_coll_bench.openmpi and .mpich when it "
                   "finds mpicc.openmpi / mpicc.mpich, and .impi, .openmpi5, .mpich5 when "
                   f"bench/peers/get_wheels.sh has unpacked them under -Dpeers_dir")
            if b == "imb":
                how = f"bench/peers/get_wheels.sh with COLL_PEERS_DIR={a.peers_dir}"
            sys.exit(f"side_by_side: {need} is not there ({how})")

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
    print(placements_text(r.rt), flush=True)
    if r.failed:
        print("side_by_side: runs that failed:\n  " + "\n  ".join(r.failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
