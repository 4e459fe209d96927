#!/usr/bin/env python3
"""ddp_compare.py — an unmodified PyTorch DDP training loop on libcoll and on Gloo.

    PYTHONPATH=build/torch /opt/libcoll/torch-2.15/bin/python3 torch/tools/ddp_compare.py [--ranks 2] [--steps 20]
        [--repeats 1]

Trains the GPT of libtrain/tools/reference.py (small: V=256, T=32, L=2, C=64, NH=4) with
DistributedDataParallel and AdamW for --steps steps on each rank's own batch, once with
backend "libcoll" and once with "gloo" (ranks forked, FileStore rendezvous), then prints
each step's loss (rank 0's, and the mean over ranks) for both, the largest relative
difference, and the median step time of each (with --repeats R: R runs of each,
interleaved, the median over runs of each run's median; losses compared in every run).  Exits 1 if the losses differ by more
than 1e-5 relative.  Nothing but the backend's name differs between the two runs.
"""
import argparse, os, statistics, sys, tempfile, time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "libtrain", "tools"))
from reference import GPT  # noqa: E402

V, T, L, C, NH, B = 256, 32, 2, 64, 4, 8


def rank_main(backend, rank, n, steps, store, wfd):
    torch.set_num_threads(1)
    if backend == "libcoll":
        import libcoll_torch  # noqa: F401
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=n)
    torch.manual_seed(1234)
    model = GPT(V, T, L, C, NH)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(99 + rank)
    losses, times = [], []
    for step in range(steps):
        idx = torch.randint(0, V, (B, T), generator=g)
        tgt = torch.roll(idx, -1, 1)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = ddp(idx, tgt)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append((loss.item(), mean.item() / n))
    if rank == 0:
        os.write(wfd, repr((losses, sorted(times)[len(times) // 2])).encode())
    dist.destroy_process_group()


def run(backend, n, steps):
    d = tempfile.mkdtemp(prefix="coll-ddp-")
    r, w = os.pipe()
    pids = []
    for rank in range(n):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 0
            try:
                rank_main(backend, rank, n, steps, os.path.join(d, "store"), w)
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            os._exit(code)
        pids.append(pid)
    os.close(w)
    out = b""
    while True:
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        out += chunk
    os.close(r)
    bad = [p for p in pids if os.waitpid(p, 0)[1] != 0]
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)
    if bad or not out:
        sys.exit(f"ddp_compare: the {backend} run failed")
    return eval(out.decode())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    runs = {"libcoll": [], "gloo": []}
    for _ in range(a.repeats):
        for b in ("libcoll", "gloo"):
            runs[b].append(run(b, a.ranks, a.steps))
    worst = 0.0
    print(f"{'step':>4} {'libcoll loss':>14} {'gloo loss':>14} {'libcoll mean':>14} {'gloo mean':>14}")
    for k, ((lc, _), (gl, _)) in enumerate(zip(runs["libcoll"], runs["gloo"])):
        for s, ((l0, lm), (g0, gm)) in enumerate(zip(lc, gl)):
            worst = max(worst, abs(l0 - g0) / abs(g0), abs(lm - gm) / abs(gm))
            if k == 0:
                print(f"{s:4d} {l0:14.8f} {g0:14.8f} {lm:14.8f} {gm:14.8f}")
    lc_t = statistics.median(t for _, t in runs["libcoll"])
    gl_t = statistics.median(t for _, t in runs["gloo"])
    print(f"largest relative difference {worst:.3g}; median step time libcoll {lc_t * 1e3:.2f} ms, "
          f"gloo {gl_t * 1e3:.2f} ms ({a.ranks} ranks, {a.repeats} interleaved runs, "
          f"torch {torch.__version__}, load {os.getloadavg()[0]:.2f})")
    sys.exit(0 if worst <= 1e-5 else 1)


if __name__ == "__main__":
    main()
