#!/usr/bin/env python3
"""collective_bench.py — torch-level speed of libcoll against Gloo (CPU, float32) for
dist.all_reduce, all_gather_into_tensor, reduce_scatter_tensor and all_to_all_single, in
one run, with medians over interleaved repeats and the acceptance of issue #40 item 4.

    PYTHONPATH=build/torch /opt/libcoll/torch-2.15/bin/python3 torch/tools/collective_bench.py
        [--ops all_reduce,all_gather_into_tensor,reduce_scatter_tensor,all_to_all_single]
        [--ranks 2,4] [--sizes 4K,64K,1M,16M,64M] [--repeats 3] [--iters-scale 1.0]
        [--csv FILE] [--async] [--coll-bench [PATH]] [--timeout 600]

Size convention: SIZE is the bytes of each rank's input buffer for all_reduce (in place),
reduce_scatter_tensor (input SIZE, output SIZE/N) and all_to_all_single (input and output
SIZE, SIZE/N to each peer); for all_gather_into_tensor it is each rank's contribution
(input SIZE, output N x SIZE).  float32, SUM for the reductions.

Per repeat, per N: one fork of N ranks for libcoll and one for Gloo (the order of the two
alternates from repeat to repeat, so that neither always runs first), each rank running
every op and size with one torch thread.  Per op and size a rank checks one call's result,
does two warm-up calls and a barrier, then times `iters` blocking calls (iters shrinks
with the size; --iters-scale scales it, at least 3); rank 0's mean time per call is the
run's figure.  The table holds the median over repeats per op x N x size, Gloo / libcoll,
and the acceptance: Gloo / libcoll >= 3 up to 64 KiB and >= 2 from 1 MiB (sizes between
have none).  --async times `op(..., async_op=True).wait()` (the binding's Work path).
--coll-bench adds libcoll's own coll-bench at the same shapes (blocking, unchecked; the
in-place time for all_reduce, out-of-place for the others, as torch calls them), the
library's floor under the binding.

It must never leave a rank running (every child is reaped, killed past --timeout), never
leave its store files behind, and never report a figure from a run whose check failed.
"""
import argparse, csv, io, json, os, select, signal, shutil, statistics, subprocess, sys
import tempfile, time
from datetime import timedelta

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")
# coll-bench's name of each op, its -b for a SIZE of this script's convention, and the
# column that matches the torch call (all_reduce here is in place, the others are not).
COLL_BENCH = {"all_reduce": ("all_reduce", lambda s, n: s, "ip_time_us"),
              "all_gather_into_tensor": ("all_gather", lambda s, n: s * n, "oop_time_us"),
              "reduce_scatter_tensor": ("reduce_scatter", lambda s, n: s, "oop_time_us"),
              "all_to_all_single": ("all_to_all", lambda s, n: s, "oop_time_us")}


def parse_size(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * m[s[-1]] if s[-1] in m else int(s)


def iters_of(size, scale):
    return max(3, int(scale * max(3, min(200, (64 << 20) // size // 4))))


def buffers(op, size, n, rank):
    """The op's (input, output) tensors, the input filled with rank + 1, and a call."""
    e = size // 4
    inp = torch.full((e,), float(rank + 1))
    if op == "all_reduce":
        return inp, inp, lambda a: dist.all_reduce(inp, async_op=a)
    if op == "all_gather_into_tensor":
        out = torch.empty(e * n)
        return inp, out, lambda a: dist.all_gather_into_tensor(out, inp, async_op=a)
    if op == "reduce_scatter_tensor":
        out = torch.empty(e // n)
        return inp, out, lambda a: dist.reduce_scatter_tensor(out, inp, async_op=a)
    out = torch.empty(e)
    return inp, out, lambda a: dist.all_to_all_single(out, inp, async_op=a)


def expected(op, size, n, rank):
    """What the output holds after one call on inputs of rank + 1."""
    e = size // 4
    total = n * (n + 1) / 2
    if op == "all_reduce":
        return torch.full((e,), total)
    if op == "all_gather_into_tensor":
        return torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(e)
    if op == "reduce_scatter_tensor":
        return torch.full((e // n,), total)
    return torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(e // n)


def rank_main(backend, rank, n, ops, sizes, scale, store, wfd, use_async, timeout):
    torch.set_num_threads(1)
    if backend == "libcoll":
        import libcoll_torch  # noqa: F401
    else:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=n,
                            timeout=timedelta(seconds=timeout))
    out = {}
    for op in ops:
        for size in sizes:
            inp, res, call = buffers(op, size, n, rank)
            call(False)
            if not torch.equal(res, expected(op, size, n, rank)):
                raise RuntimeError(f"{backend} {op} of {size} bytes on {n} ranks: wrong result")
            inp.zero_()  # in-place all_reduce keeps summing; zeros stay finite
            call(False)
            call(False)
            dist.barrier()
            iters = iters_of(size, scale)
            t0 = time.perf_counter()
            if use_async:
                for _ in range(iters):
                    call(True).wait()
            else:
                for _ in range(iters):
                    call(False)
            out[f"{op}/{size}"] = (time.perf_counter() - t0) / iters
            del inp, res, call
    dist.barrier()
    if rank == 0:
        os.write(wfd, json.dumps(out).encode())
    dist.destroy_process_group()


def run(backend, n, ops, sizes, a):
    """One fork of n ranks running every op and size; rank 0's {op/size: seconds}.  Every
    child is reaped; when one fails, or the deadline passes, the others are killed."""
    d = tempfile.mkdtemp(prefix="coll-cb-")
    r, w = os.pipe()
    live, failed, data = [], False, b""
    deadline = time.monotonic() + a.timeout
    try:
        for rank in range(n):
            pid = os.fork()
            if pid == 0:
                os.close(r)
                code = 0
                try:
                    signal.alarm(a.timeout + 5)  # a hung rank ends on its own as well
                    rank_main(backend, rank, n, ops, sizes, a.iters_scale,
                              os.path.join(d, "store"), w, a.use_async, a.timeout)
                except BaseException:
                    import traceback
                    traceback.print_exc()
                    code = 1
                os._exit(code)
            live.append(pid)
        os.close(w)
        w = -1
        eof = False
        while live and not failed and time.monotonic() < deadline:
            if not eof and select.select([r], [], [], 0.1)[0]:
                chunk = os.read(r, 1 << 16)
                eof = not chunk
                data += chunk
            elif eof:
                time.sleep(0.05)
            for p in list(live):
                q, status = os.waitpid(p, os.WNOHANG)
                if q:
                    live.remove(p)
                    failed |= status != 0
        if not live and not failed:  # every writer gone: what is left in the pipe, then EOF
            while chunk := os.read(r, 1 << 16):
                data += chunk
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
        if live:
            failed = True
            for p in live:
                os.kill(p, signal.SIGKILL)
            for p in live:
                os.waitpid(p, 0)
        shutil.rmtree(d, ignore_errors=True)
    if failed or not data:
        sys.exit(f"collective_bench: the {backend} run on {n} ranks failed or timed out")
    return json.loads(data.decode())


def run_coll_bench(exe, n, ops, sizes, scale, timeout):
    out = {}
    for op in ops:
        name, bytes_of, column = COLL_BENCH[op]
        for size in sizes:
            b = str(bytes_of(size, n))
            p = subprocess.run([exe, name, "--ranks", str(n), "-b", b, "-e", b, "-z", "1",
                                "-c", "0", "-n", str(iters_of(size, scale)), "-w", "2", "--csv"],
                               capture_output=True, text=True, timeout=timeout)
            if p.returncode != 0:
                sys.exit(f"collective_bench: coll-bench {name} failed: {p.stderr}")
            row = next(csv.DictReader(io.StringIO(p.stdout)))
            out[f"{op}/{size}"] = float(row[column]) * 1e-6
    return out


def required(size):
    return 3.0 if size <= 64 << 10 else 2.0 if size >= 1 << 20 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sizes", default="4K,64K,1M,16M,64M")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iters-scale", type=float, default=1.0,
                    help="scale the timed calls per size (at least 3)")
    ap.add_argument("--csv", metavar="FILE")
    ap.add_argument("--async", dest="use_async", action="store_true")
    ap.add_argument("--coll-bench", nargs="?", metavar="PATH",
                    const=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                       "build", "bench", "coll-bench"))
    ap.add_argument("--timeout", type=int, default=600, help="seconds per fork of N ranks")
    a = ap.parse_args()
    ops = a.ops.split(",")
    for op in ops:
        if op not in OPS:
            sys.exit(f"collective_bench: unknown op {op} (ops: {','.join(OPS)})")
    names = a.sizes.split(",")
    sizes = [parse_size(s) for s in names]
    ranks = [int(x) for x in a.ranks.split(",")]
    for n in ranks:
        for s in sizes:
            if s % (4 * n):
                sys.exit(f"collective_bench: {s} bytes do not split into {n} float32 blocks")

    t_start = time.time()
    print(f"torch {torch.__version__}, float32, SUM, "
          f"{'async_op=True + wait()' if a.use_async else 'blocking calls'}, "
          f"medians of {a.repeats} interleaved runs, iters scale {a.iters_scale:g}, "
          f"load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print("size = bytes of each rank's input (all_reduce, reduce_scatter_tensor, "
          "all_to_all_single) or contribution (all_gather_into_tensor)")
    print("timed calls per size: " +
          ", ".join(f"{nm} {iters_of(s, a.iters_scale)}" for nm, s in zip(names, sizes)))
    backends = ["libcoll", "gloo"]
    res = {(b, n): [] for b in backends + ["coll-bench"] for n in ranks}
    for rep in range(a.repeats):
        for n in ranks:
            order = backends if rep % 2 == 0 else backends[::-1]
            for b in order:
                res[(b, n)].append(run(b, n, ops, sizes, a))
            if a.coll_bench:
                res[("coll-bench", n)].append(
                    run_coll_bench(a.coll_bench, n, ops, sizes, a.iters_scale, a.timeout))

    cb = " coll-bench us lc/cb" if a.coll_bench else ""
    print(f"{'op':<22} {'N':>2} {'size':>5} {'libcoll us':>11} {'gloo us':>11} "
          f"{'gloo/libcoll':>12} {'need':>5} {'mark':>4}{cb}")
    rows, fails = [], []
    for op in ops:
        for n in ranks:
            for name, size in zip(names, sizes):
                key = f"{op}/{size}"
                lc_runs = [x[key] * 1e6 for x in res[("libcoll", n)]]
                gl_runs = [x[key] * 1e6 for x in res[("gloo", n)]]
                lc, gl = statistics.median(lc_runs), statistics.median(gl_runs)
                need = required(size)
                mark = "-" if need is None else "pass" if gl / lc >= need else "FAIL"
                if mark == "FAIL":
                    fails.append(f"{op} N={n} {name}")
                line = (f"{op:<22} {n:2d} {name:>5} {lc:11.1f} {gl:11.1f} {gl / lc:12.2f} "
                        f"{'-' if need is None else f'{need:g}x':>5} {mark:>4}")
                row = {"op": op, "n": n, "size": name, "bytes": size, "libcoll_us": f"{lc:.1f}",
                       "gloo_us": f"{gl:.1f}", "gloo_over_libcoll": f"{gl / lc:.3f}",
                       "required": "" if need is None else need, "mark": mark,
                       "libcoll_runs_us": ";".join(f"{x:.1f}" for x in lc_runs),
                       "gloo_runs_us": ";".join(f"{x:.1f}" for x in gl_runs)}
                if a.coll_bench:
                    c = statistics.median(x[key] * 1e6 for x in res[("coll-bench", n)])
                    line += f" {c:13.1f} {lc / c:5.2f}"
                    row["coll_bench_us"] = f"{c:.1f}"
                print(line, flush=True)
                rows.append(row)
    print(f"acceptance (gloo/libcoll >= 3 at <= 64K, >= 2 at >= 1M): "
          f"{'all pass' if not fails else 'FAIL: ' + ', '.join(fails)}")
    print(f"load at the end {os.getloadavg()[0]:.2f}, {time.time() - t_start:.0f} s")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0]))
            wr.writeheader()
            wr.writerows(rows)


if __name__ == "__main__":
    main()
