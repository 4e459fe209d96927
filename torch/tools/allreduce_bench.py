#!/usr/bin/python3
"""allreduce_bench.py — torch-level dist.all_reduce (float32, SUM, in place, blocking) on
libcoll and Gloo, and coll-bench's own all_reduce, side by side in one run.

    PYTHONPATH=build/torch /usr/bin/python3 torch/tools/allreduce_bench.py [--ranks 2,4]
        [--sizes 4K,64K,1M,16M,64M] [--repeats 3] [--coll-bench build/bench/coll-bench]
        [--async]

For each N, each repeat runs libcoll, Gloo, then coll-bench (so a busy moment hurts all
three): for a backend it forks N ranks, each times `iters` all_reduce calls after a
warm-up (iters shrinks with the size) and rank 0 reports the mean time per call;
coll-bench runs `all_reduce --ranks N -b SIZE -e SIZE -z 1 -c 0 -n iters -w 2` per size
(blocking calls, unchecked, the in-place time: what dist.all_reduce does).  Prints the
median over repeats of each, per size, and the ratios the acceptance asks for.  One torch
thread per rank.  --async times `dist.all_reduce(t, async_op=True).wait()` instead (the
binding's Work path).
"""
import argparse, csv, io, os, statistics, subprocess, sys, tempfile, time

import torch
import torch.distributed as dist


def parse_size(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * m[s[-1]] if s[-1] in m else int(s)


def iters_of(size):
    return max(3, min(200, (64 << 20) // size // 4))


def rank_main(backend, rank, n, sizes, store, wfd, use_async):
    torch.set_num_threads(1)
    if backend == "libcoll":
        import libcoll_torch  # noqa: F401
    else:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=n)
    out = []
    for size in sizes:
        t = torch.ones(size // 4)
        iters = iters_of(size)
        for _ in range(2):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        if use_async:
            for _ in range(iters):
                dist.all_reduce(t, async_op=True).wait()
        else:
            for _ in range(iters):
                dist.all_reduce(t)
        out.append((time.perf_counter() - t0) / iters)
    if rank == 0:
        os.write(wfd, repr(out).encode())
    dist.destroy_process_group()


def run(backend, n, sizes, use_async):
    d = tempfile.mkdtemp(prefix="coll-arb-")
    r, w = os.pipe()
    pids = []
    for rank in range(n):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 0
            try:
                rank_main(backend, rank, n, sizes, os.path.join(d, "store"), w, use_async)
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            os._exit(code)
        pids.append(pid)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    bad = [p for p in pids if os.waitpid(p, 0)[1] != 0]
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)
    if bad or not data:
        sys.exit(f"allreduce_bench: the {backend} run failed")
    return eval(data.decode())


def run_coll_bench(exe, n, sizes):
    out = []
    for size in sizes:
        p = subprocess.run([exe, "all_reduce", "--ranks", str(n), "-b", str(size), "-e", str(size),
                            "-z", "1", "-c", "0", "-n", str(iters_of(size)), "-w", "2", "--csv"],
                           capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            sys.exit(f"allreduce_bench: coll-bench failed: {p.stderr}")
        row = next(csv.DictReader(io.StringIO(p.stdout)))
        out.append(float(row["ip_time_us"]) * 1e-6)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sizes", default="4K,64K,1M,16M,64M")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--coll-bench", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                         "build", "bench", "coll-bench"))
    ap.add_argument("--async", dest="use_async", action="store_true")
    a = ap.parse_args()
    names = a.sizes.split(",")
    sizes = [parse_size(s) for s in names]
    print(f"dist.all_reduce float32 SUM{' async_op=True + wait()' if a.use_async else ''}, "
          f"torch {torch.__version__}, medians of {a.repeats} interleaved runs, load {os.getloadavg()[0]:.2f}")
    print(f"{'N':>2} {'size':>6} {'libcoll us':>11} {'gloo us':>11} {'coll-bench us':>14} "
          f"{'gloo/libcoll':>13} {'libcoll/coll-bench':>19}")
    for n in [int(x) for x in a.ranks.split(",")]:
        res = {"libcoll": [], "gloo": [], "coll-bench": []}
        for _ in range(a.repeats):
            for b in ("libcoll", "gloo"):
                res[b].append(run(b, n, sizes, a.use_async))
            res["coll-bench"].append(run_coll_bench(a.coll_bench, n, sizes))
        for i, name in enumerate(names):
            lc, gl, cb = (statistics.median(x[i] for x in res[k]) * 1e6
                          for k in ("libcoll", "gloo", "coll-bench"))
            print(f"{n:2d} {name:>6} {lc:11.1f} {gl:11.1f} {cb:14.1f} {gl / lc:13.2f} {lc / cb:19.2f}",
                  flush=True)
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
