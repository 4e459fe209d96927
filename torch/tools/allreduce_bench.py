#!/usr/bin/python3
"""allreduce_bench.py — torch-level dist.all_reduce (float32, SUM, in place) on libcoll and
Gloo, side by side in one run.

    PYTHONPATH=build/torch /usr/bin/python3 torch/tools/allreduce_bench.py [--ranks 2,4]
        [--sizes 4K,64K,1M,16M,64M] [--repeats 3]

For each N, each repeat forks N ranks per backend, alternating libcoll and Gloo (so a
busy moment hurts both); each rank times `iters` all_reduce calls after a warm-up (iters
shrinks with the size) and rank 0 reports the mean time per call.  Prints the median
over repeats, per size, for both, and their ratio.  One torch thread per rank.
"""
import argparse, os, statistics, sys, tempfile, time

import torch
import torch.distributed as dist


def parse_size(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * m[s[-1]] if s[-1] in m else int(s)


def rank_main(backend, rank, n, sizes, store, wfd):
    torch.set_num_threads(1)
    if backend == "libcoll":
        import libcoll_torch  # noqa: F401
    else:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=n)
    out = []
    for size in sizes:
        t = torch.ones(size // 4)
        iters = max(3, min(200, (64 << 20) // size // 4))
        for _ in range(2):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        out.append((time.perf_counter() - t0) / iters)
    if rank == 0:
        os.write(wfd, repr(out).encode())
    dist.destroy_process_group()


def run(backend, n, sizes):
    d = tempfile.mkdtemp(prefix="coll-arb-")
    r, w = os.pipe()
    pids = []
    for rank in range(n):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 0
            try:
                rank_main(backend, rank, n, sizes, os.path.join(d, "store"), w)
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sizes", default="4K,64K,1M,16M,64M")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    names = a.sizes.split(",")
    sizes = [parse_size(s) for s in names]
    print(f"dist.all_reduce float32 SUM, torch {torch.__version__}, medians of {a.repeats} runs")
    print(f"{'N':>2} {'size':>6} {'libcoll us':>11} {'gloo us':>11} {'gloo/libcoll':>13}")
    for n in [int(x) for x in a.ranks.split(",")]:
        res = {"libcoll": [], "gloo": []}
        for _ in range(a.repeats):
            for b in ("libcoll", "gloo"):
                res[b].append(run(b, n, sizes))
        for i, name in enumerate(names):
            lc = statistics.median(x[i] for x in res["libcoll"]) * 1e6
            gl = statistics.median(x[i] for x in res["gloo"]) * 1e6
            print(f"{n:2d} {name:>6} {lc:11.1f} {gl:11.1f} {gl / lc:13.2f}")


if __name__ == "__main__":
    main()
