#!/usr/bin/python3
"""gloo_bench.py — the Gloo peer: torch.distributed's gloo backend (CPU tensors) measured
and printed exactly as coll-bench prints libcoll, so a row here and a row there divide.

  /usr/bin/python3 bench/peers/gloo_bench.py COLLECTIVE[,COLLECTIVE...]|all --ranks N [flags]
  COLLECTIVE: all_reduce all_gather reduce_scatter broadcast reduce all_to_all gather
              scatter (aliases allreduce allgather reducescatter bcast alltoall)

--ranks N starts N processes on this machine (multiprocessing, spawn; they meet through
a FileStore in a temporary directory, GLOO_SOCKET_IFNAME=lo unless set); without it the process joins
the job torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).  Flags are
coll-bench's and mpi_coll_bench's: -b -e -f -i sizes, -s LIST, -n iters, -w warmup,
-c check, -d dtype, -o op, -r root, -t SECONDS (see mpi_coll_bench.c; the same
calibration), --threads (torch threads per rank, default 1).  Run it with the Python
that has torch (Debian: /usr/bin/python3 with python3-torch).

Sizes, counts and bus-bandwidth factors are nccl-tests' (the table in mpi_coll_bench.c):
size = per-rank buffer for all_reduce/broadcast/reduce; the whole n-block buffer for
all_gather, reduce_scatter, all_to_all (each rank's send buffer), gather (the root's
receive buffer) and scatter (the root's send buffer); busbw factor 2(n-1)/n for
all_reduce, 1 for broadcast/reduce, (n-1)/n for the other six.

The calls and their columns.  torch's all_reduce, broadcast and reduce work on one
tensor, in place: they are timed in the in-place columns (out-of-place reads N/A).
all_gather (list of n outputs), all_to_all_single, gather and scatter (lists at the root)
take separate inputs and outputs: out-of-place columns (torch 1.13's gloo all_gather
gathers into a flat tensor of its own and copies out, so an in-place layout would save
nothing; in-place reads N/A).  What gloo refuses (torch 1.13: reduce_scatter, and
bfloat16 everywhere) is tried first on a group of each rank alone and reported in a
comment line instead of rows: met on the whole group, a refusal left the ranks' later
calls out of step.  Rows of size 0 for all_gather and all_to_all are skipped: gloo dies
of a division by zero (SIGFPE) on empty tensors there.

Per row (as coll-bench does): fill the inputs; barrier; -w warmup calls; barrier; the
timed calls back to back (synchronous, no async_op); time = the slowest rank's mean.
With -c 1 the inputs are written again, one more call runs, every checked output
element is compared with its exact expected value (coll-bench's patterns, as in
mpi_coll_bench.c), and #wrong is the sum over ranks.  Tensors are allocated per row
(torch's list-based calls want one tensor per peer), outside the timed loop.

Must never: import or call libcoll (a number printed here is gloo's alone); allocate,
fill or check inside a timed loop; print a time it did not measure.  Exit status: 0 all
right, 1 a result was wrong, 2 bad usage, 3 a rank failed.  PEERS_BENCH_FAULT=RANK[:INDEX]
corrupts that output element before each check (to test the checker).
"""
import argparse
import datetime
import math
import os
import shutil
import socket
import tempfile
import sys
import time

import multiprocessing
import multiprocessing.connection

# torch is imported by the ranks only (load_torch): the launching process needs none of it,
# and an import of torch costs more than a second here.
torch = dist = None


def load_torch():
    global torch, dist
    import torch as t
    import torch.distributed as d
    torch, dist = t, d

COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
         "all_to_all", "gather", "scatter"]
ALIASES = {"allreduce": "all_reduce", "allgather": "all_gather",
           "reducescatter": "reduce_scatter", "bcast": "broadcast", "alltoall": "all_to_all"}
REDUCES = ("all_reduce", "reduce_scatter", "reduce")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
IN_PLACE_ONLY = ("all_reduce", "broadcast", "reduce")

# name (torch's too) -> (largest L with 0..L exact, how many factors of two fit)
DTYPES = {
    "int8": (127, 6), "uint8": (255, 7), "int32": (1 << 31, 30), "int64": (1 << 31, 62),
    "float16": (2048, 15), "bfloat16": (256, 127), "float32": (1 << 24, 127),
    "float64": (1 << 31, 1023),
}
DTYPE_ALIASES = {"char": "int8", "int": "int32", "half": "float16", "fp16": "float16",
                 "bf16": "bfloat16", "float": "float32", "fp32": "float32",
                 "double": "float64", "fp64": "float64"}
OPS = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX"}  # dist.ReduceOp's names


def reduce_op(op):
    return getattr(dist.ReduceOp, OPS[op])


def torch_dtype(dname):
    return getattr(torch, dname)


class UsageError(Exception):
    pass


def parse_size(s):
    s0 = s
    s = s.strip()
    shift = 0
    for suffix in ("KiB", "MiB", "GiB", "KB", "MB", "GB", "K", "M", "G", "B"):
        if s.upper().endswith(suffix.upper()):
            shift = {"K": 10, "M": 20, "G": 30}.get(suffix[0].upper(), 0)
            s = s[: -len(suffix)]
            break
    if not s.isdigit():
        raise UsageError(f"'{s0}' is not a size")
    return int(s) << shift


def sweep(a):
    if a.sizes:
        return a.sizes
    out, s = [a.b], a.b
    while True:
        n = s * a.f if a.f > 1 else s + a.i
        if n > a.e or n == s:
            return out
        out.append(n)
        s = n


def bus_factor(c, n):
    if c == "all_reduce":
        return 2.0 * (n - 1) / n
    if c in ("broadcast", "reduce"):
        return 1.0
    return (n - 1) / n


def factor_text(c):
    return "2(n-1)/n" if c == "all_reduce" else "1" if c in ("broadcast", "reduce") else "(n-1)/n"


def blocked(c):
    return c not in ("all_reduce", "broadcast", "reduce")


# ---- data: coll-bench's patterns (bench/bench_util.c), vectorised ------------------------

def input_values(c, dname, op, n, r, j):
    """float64 tensor: what rank r feeds at input indices j (int64 tensor)."""
    if c not in REDUCES:
        return ((j + 13 * r) % 97).double()
    lim, twos = DTYPES[dname]
    if op == "sum":
        k = min(8, lim // n + 1)
        if k < 2:
            return (j % n == r).double()
        return ((j + r) % k).double()
    if op == "prod":
        p = max(3, (n + twos - 1) // twos)
        return torch.where((j + r) % p == 0, 2.0, 1.0).double()
    return ((j + r) % 100).double()


def reduced_values(dname, op, n, j):
    lim, twos = DTYPES[dname]
    if op == "sum":
        k = min(8, lim // n + 1)
        if k < 2:
            return torch.ones(j.shape, dtype=torch.float64)
        s = torch.full(j.shape, (n // k) * (k * (k - 1) // 2), dtype=torch.int64)
        for t in range(n % k):
            s += (j + t) % k
        return s.double()
    if op == "prod":
        p = max(3, (n + twos - 1) // twos)
        r0 = (p - j % p) % p
        tw = torch.where(r0 < n, (n - 1 - r0) // p + 1, torch.zeros_like(r0))
        return torch.pow(2.0, tw.double())
    s = j % 100
    wraps = (s + n - 1 >= 100) | (n >= 100)
    if op == "max":
        return torch.where(wraps, torch.full_like(s, 99), s + n - 1).double()
    return torch.where(wraps, torch.zeros_like(s), s).double()


def expected_values(c, dname, op, n, r, root, count):
    if c in ("all_reduce", "reduce"):
        return reduced_values(dname, op, n, torch.arange(count))
    if c == "reduce_scatter":
        return reduced_values(dname, op, n, r * count + torch.arange(count))
    if c == "broadcast":
        return input_values(c, dname, op, n, root, torch.arange(count))
    i = torch.arange(n * count)
    if c in ("all_gather", "gather"):
        return ((i % count + 13 * (i // count)) % 97).double()
    if c == "all_to_all":  # block s came from rank s, which sent it from its block r
        return ((r * count + i % count + 13 * (i // count)) % 97).double()
    if c == "scatter":
        return input_values(c, dname, op, n, root, r * count + torch.arange(count))
    raise ValueError(c)


def poison(t):
    if t.numel():
        t.view(torch.uint8).fill_(0xFF)  # NaN, -1 or the largest value: never expected


# ---- one row -----------------------------------------------------------------------------

class Row:
    """Tensors and the call of one (collective, dtype, op, size) on this rank."""

    def __init__(self, c, dname, op, n, r, root, count):
        self.c, self.dname, self.op, self.n, self.r, self.root = c, dname, op, n, r, root
        self.count = count
        dt = torch_dtype(dname)
        nin = n * count if c in ("reduce_scatter", "all_to_all", "scatter") else count
        self.nin = nin
        self.inp_flat = torch.empty(nin, dtype=dt)
        self.out_flat = None
        self.outs = None
        if c in IN_PLACE_ONLY:
            self.out_flat = self.inp_flat  # one tensor, in place
        elif c == "reduce_scatter":
            self.ins = list(self.inp_flat.split(count)) if count else [self.inp_flat[:0]] * n
            self.out_flat = torch.empty(count, dtype=dt)
        elif c == "all_gather" or (c == "gather" and r == root):
            self.out_flat = torch.empty(n * count, dtype=dt)
            self.outs = [self.out_flat[s * count:(s + 1) * count] for s in range(n)]
        elif c == "all_to_all":
            self.out_flat = torch.empty(n * count, dtype=dt)
        elif c == "scatter":
            self.ins = [self.inp_flat[s * count:(s + 1) * count] for s in range(n)]
            self.out_flat = torch.empty(count, dtype=dt)
        # the output this rank checks (None: undefined here)
        self.checked = self.out_flat
        if c in ("reduce", "gather") and r != root:
            self.checked = None

    def has_input(self):
        return not (self.c in ("broadcast", "scatter") and self.r != self.root)

    def prepare(self):
        if self.out_flat is not None and self.out_flat is not self.inp_flat:
            poison(self.out_flat)
        if self.has_input():
            v = input_values(self.c, self.dname, self.op, self.n, self.r, torch.arange(self.nin))
            self.inp_flat.copy_(v)
        else:
            poison(self.inp_flat)

    def call(self, group=None, global_root=None):
        # src/dst are ranks of the world group: global_root names the root of `group`
        c = self.c
        root = self.root if global_root is None else global_root
        if c == "all_reduce":
            dist.all_reduce(self.inp_flat, op=reduce_op(self.op), group=group)
        elif c == "broadcast":
            dist.broadcast(self.inp_flat, src=root, group=group)
        elif c == "reduce":
            dist.reduce(self.inp_flat, dst=root, op=reduce_op(self.op), group=group)
        elif c == "reduce_scatter":
            dist.reduce_scatter(self.out_flat, self.ins, op=reduce_op(self.op), group=group)
        elif c == "all_gather":
            dist.all_gather(self.outs, self.inp_flat, group=group)
        elif c == "all_to_all":
            dist.all_to_all_single(self.out_flat, self.inp_flat, group=group)
        elif c == "gather":
            dist.gather(self.inp_flat, self.outs if self.r == self.root else None, dst=root,
                        group=group)
        elif c == "scatter":
            dist.scatter(self.out_flat, self.ins if self.r == self.root else None, src=root,
                         group=group)

    def wrong(self, fault):
        if self.checked is None:
            return 0
        got = self.checked
        if fault is not None and fault[0] == self.r and fault[1] < got.numel():
            got[fault[1]] += 1
        want = expected_values(self.c, self.dname, self.op, self.n, self.r, self.root,
                               self.count)
        return int((got.double() != want).sum())


def refused(alone, rank, c, dname, op):
    """Why gloo refuses (collective, dtype, op), or None.  Tried on a group of this rank
    alone: a refusal met on the world group left the ranks' later calls out of step (a
    4-rank run hung, another blamed the wrong calls), so it is found out here, and the
    answer agreed by all ranks."""
    why = None
    try:
        row = Row(c, dname, op, 1, 0, 0, 4)
        row.prepare()
        row.call(group=alone, global_root=rank)
    except RuntimeError as ex:
        why = str(ex).splitlines()[0] if str(ex) else type(ex).__name__
    ok = torch.tensor([0 if why else 1], dtype=torch.int64)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if int(ok[0]) == 1:
        return None
    return why or "on another rank"


def slowest(x):
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0])


def time_calls(row, iters):
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        row.call()
    return slowest((time.perf_counter() - t0) / iters)


def measure(a, row, fault):
    row.prepare()
    dist.barrier()
    for _ in range(a.w):
        row.call()
    iters = a.n
    if a.t > 0:  # calibrate: double a batch until it takes 10 ms on the slowest rank
        batch = 1
        while True:
            per = time_calls(row, batch)
            if per * batch >= 0.01 or batch >= 1000000:
                break
            batch *= 2
        iters = int(min(1e6, max(a.n, math.ceil(a.t / max(per, 1e-9)))))
    sec = time_calls(row, iters)
    wrong = None
    if a.c:
        row.prepare()
        dist.barrier()
        row.call()
        w = torch.tensor([row.wrong(fault)], dtype=torch.int64)
        dist.all_reduce(w)
        wrong = int(w[0])
    return sec, iters, wrong


def fmt_time(us):
    return f"{us:7.0f}" if us >= 10000 else f"{us:7.1f}" if us >= 100 else f"{us:7.2f}"


def print_table_header(c, n):
    print(f"#\n# Collective: {c}   busbw = algbw * {factor_text(c)} = algbw * {bus_factor(c, n):.4f}")
    if c in IN_PLACE_ONLY:
        print(f"# (torch's {c} works in place on one tensor: in-place columns only)")
    else:
        print(f"# (torch's {c} takes separate input and output tensors: out-of-place columns only)")
    print("#")
    print("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
          % ("", "", "", "", ""))
    print("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s  %7s"
          % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
             "time", "algbw", "busbw", "#wrong", "iters"))
    print("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s"
          % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
             "(GB/s)", ""))
    sys.stdout.flush()


def worker(rank, n, a):
    load_torch()
    torch.set_num_threads(a.threads)
    timeout = datetime.timedelta(seconds=a.timeout)
    if a.store:  # --ranks: the launcher's file, no port to race for
        dist.init_process_group("gloo", store=dist.FileStore(a.store, n), rank=rank,
                                world_size=n, timeout=timeout)
    else:
        dist.init_process_group("gloo", rank=rank, world_size=n, timeout=timeout)
    # one group of this rank alone, to find out what gloo refuses without the others
    alone = None
    for r in range(n):
        g = dist.new_group([r])
        if r == rank:
            alone = g
    fault = None
    f = os.environ.get("PEERS_BENCH_FAULT", "")
    if f:
        p = f.split(":")
        fault = (int(p[0]), int(p[1]) if len(p) > 1 else 0)
    if rank == 0:
        print(f"# gloo_bench {','.join(a.colls) if len(a.colls) < len(COLLS) else 'all'} "
              f"(torch {torch.__version__}, backend gloo, {a.threads} torch thread(s) per rank, "
              f"GLOO_SOCKET_IFNAME={os.environ.get('GLOO_SOCKET_IFNAME', '')})")
        print(f"# Command: {a.cmdline}")
        if a.sizes:
            print(f"# nRanks {n} sizes: {','.join(str(s) for s in a.sizes)} warmup iters: {a.w} "
                  f"iters: {a.n} validation: {a.c}")
        elif a.f > 1:
            print(f"# nRanks {n} minBytes {a.b} maxBytes {a.e} step: {a.f}(factor) warmup iters: "
                  f"{a.w} iters: {a.n} validation: {a.c}")
        else:
            print(f"# nRanks {n} minBytes {a.b} maxBytes {a.e} step: {a.i}(bytes) warmup iters: "
                  f"{a.w} iters: {a.n} validation: {a.c}")
        if a.t > 0:
            print(f"# -t {a.t:g}: each row times about {a.t:g} s of back-to-back calls "
                  f"(at least {a.n})")
        print("# time: the slowest rank's mean over the timed calls (us)")
    info = [None] * n
    dist.all_gather_object(info, (os.getpid(), socket.gethostname()))
    if rank == 0:
        print("#\n# Using ranks")
        for r, (pid, host) in enumerate(info):
            print(f"#  Rank {r:2d} Pid {pid:6d} on {host:>10s}")
        sys.stdout.flush()

    any_wrong = False
    for c in a.colls:
        if rank == 0:
            print_table_header(c, n)
        bad, bw_sum, bw_count = 0, 0.0, 0
        root = a.r if c in ROOTED else 0
        for dname in a.dtypes:
            es = torch.tensor([], dtype=torch_dtype(dname)).element_size()
            for op in (a.ops if c in REDUCES else ["sum"]):
                why = refused(alone, rank, c, dname, op)
                if why:
                    if rank == 0:
                        print(f"# {c} {dname}{' ' + op if c in REDUCES else ''}: gloo refused: "
                              f"{why}")
                        sys.stdout.flush()
                    continue
                for size in sweep(a):
                    count = size // es // n if blocked(c) else size // es
                    nbytes = count * n * es if blocked(c) else count * es
                    if count == 0 and c in ("all_gather", "all_to_all"):
                        if rank == 0:
                            print(f"# size {nbytes}: skipped (gloo's {c} divides by zero on "
                                  f"empty tensors)")
                        continue
                    row = Row(c, dname, op, n, rank, root, count)
                    sec, iters, wrong = measure(a, row, fault)
                    algbw = nbytes / 1e9 / sec if sec > 0 else 0.0
                    busbw = algbw * bus_factor(c, n)
                    bw_sum += busbw
                    bw_count += 1
                    bad += 1 if wrong else 0
                    if rank == 0:
                        cols = (f"  {fmt_time(sec * 1e6)}  {algbw:6.2f}  {busbw:6.2f}  "
                                f"{'N/A' if wrong is None else wrong:>5}")
                        na = "  %7s  %6s  %6s  %5s" % ("N/A", "N/A", "N/A", "N/A")
                        print("%12d  %12d  %8s  %6s  %6d" % (nbytes, count, dname,
                                                            op if c in REDUCES else "none",
                                                            root if c in ROOTED else -1)
                              + (na + cols if c in IN_PLACE_ONLY else cols + na)
                              + f"  {iters:7d}")
                        sys.stdout.flush()
        any_wrong = any_wrong or bad > 0
        if rank == 0:
            print(f"# Out of bounds values : {bad} {'FAILED' if bad else 'OK'}")
            print(f"# Avg bus bandwidth    : {bw_sum / bw_count if bw_count else 0.0:g} \n#")
            sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    return 1 if any_wrong else 0


def spawned(rank, n, a):
    try:
        code = worker(rank, n, a)
    except BaseException:  # a failure is status 3, never 1 (1 means a wrong result)
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(3)
    sys.exit(code)


def root_fits(a, n):
    if any(c in ROOTED for c in a.colls) and a.r >= n:
        print(f"gloo_bench.py: -r {a.r}: the root must be below the number of ranks ({n})",
              file=sys.stderr)
        sys.exit(2)


def parse(argv):
    ap = argparse.ArgumentParser(
        prog="gloo_bench.py", description="nccl-tests-style tables of torch.distributed/gloo",
        epilog="Exit status: 0 all right, 1 a result was wrong, 2 bad usage, 3 a rank failed.")
    ap.add_argument("collective", help="all_reduce,... or all (comma list)")
    ap.add_argument("--ranks", type=int, default=0,
                    help="start N local ranks (else join the torchrun environment)")
    ap.add_argument("-b", "--minbytes", dest="b", default="32M")
    ap.add_argument("-e", "--maxbytes", dest="e", default="32M")
    ap.add_argument("-f", "--stepfactor", dest="f", type=int, default=1)
    ap.add_argument("-i", "--stepbytes", dest="i", default="1M")
    ap.add_argument("-s", "--sizes", dest="s", default=None, help="explicit list: 8,1K,64M")
    ap.add_argument("-n", "--iters", dest="n", type=int, default=20)
    ap.add_argument("-w", "--warmup_iters", dest="w", type=int, default=5)
    ap.add_argument("-c", "--check", dest="c", type=int, default=1, choices=(0, 1))
    ap.add_argument("-d", "--datatype", dest="d", default="float32")
    ap.add_argument("-o", "--op", dest="o", default="sum")
    ap.add_argument("-r", "--root", dest="r", type=int, default=0)
    ap.add_argument("-t", "--target", dest="t", type=float, default=0.0,
                    help="time about T seconds per row (at least -n calls)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds a rank waits for the others before failing (default 300)")
    a = ap.parse_args(argv)
    try:
        names = COLLS if a.collective == "all" else a.collective.split(",")
        a.colls = []
        for x in names:
            x = ALIASES.get(x, x)
            if x not in COLLS:
                raise UsageError(f"unknown collective '{x}'")
            a.colls.append(x)
        a.b, a.e, a.i = parse_size(a.b), parse_size(a.e), parse_size(a.i)
        a.sizes = [parse_size(x) for x in a.s.split(",")] if a.s else None
        if not a.sizes and a.b > a.e:
            raise UsageError(f"-b {a.b} is larger than -e {a.e}")
        if not a.sizes and a.f > 1 and a.b == 0 and a.e > 0:
            raise UsageError("-b 0 with -f > 1: the size would never grow")
        if a.n < 1 or a.w < 0:
            raise UsageError("-n must be at least 1 and -w at least 0")
        d = DTYPE_ALIASES.get(a.d, a.d)
        if d in ("uint32", "uint64"):
            raise UsageError(f"-d {a.d}: torch has no such dtype")
        a.dtypes = list(DTYPES) if d == "all" else [d]
        if a.dtypes[0] not in DTYPES:
            raise UsageError(f"-d: unknown datatype '{a.d}'")
        if a.o == "avg":
            raise UsageError("-o avg: gloo has no averaging op")
        a.ops = list(OPS) if a.o == "all" else [a.o]
        if a.ops[0] not in OPS:
            raise UsageError(f"-o: unknown op '{a.o}' (sum, prod, min, max or all)")
    except UsageError as ex:
        ap.error(str(ex))
    a.cmdline = " ".join([os.path.basename(sys.argv[0])] + list(argv))
    return a


def launch(n, a):
    """Runs N ranks here and exits with the job's status.  They meet through a FileStore
    in a directory of their own: a port picked free and handed over can be taken in
    between by any other job's connection (it happened beside a loop of coll-bench jobs).
    A rank that fails (status other than 0 or 1) ends the others, which would otherwise
    wait for it until gloo's timeout."""
    d = tempfile.mkdtemp(prefix="gloo_bench.")
    a.store = os.path.join(d, "store")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=spawned, args=(r, n, a)) for r in range(n)]
    try:
        for p in procs:
            p.start()
        live = list(procs)
        while live:
            multiprocessing.connection.wait([p.sentinel for p in live])
            live = [p for p in live if p.exitcode is None]
            if any(p.exitcode not in (None, 0, 1) for p in procs):
                for p in live:
                    p.kill()
                for p in live:
                    p.join()
                break
    finally:
        shutil.rmtree(d, ignore_errors=True)
    codes = [p.exitcode for p in procs]
    if any(c not in (0, 1) for c in codes):
        print(f"gloo_bench.py: a rank failed (exit codes {codes})", file=sys.stderr)
        sys.exit(3)
    sys.exit(max(codes))


def main():
    a = parse(sys.argv[1:])
    a.store = None
    if a.ranks:
        root_fits(a, a.ranks)
        launch(a.ranks, a)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        n = int(os.environ["WORLD_SIZE"])
        root_fits(a, n)
        spawned(int(os.environ["RANK"]), n, a)
    print("gloo_bench.py: give --ranks N, or start it under torchrun", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
