#!/usr/bin/env python3
"""cuda_probe.py — the libcoll backend on CUDA tensors, 2 forked ranks sharing cuda:0.

    PYTHONPATH=<build>/torch python3 torch/tools/cuda_probe.py

Used by scripts/gpu_check.sh's torch stage, on the GPU machine.  Each rank joins "libcoll"
through a file:// store, then checks against a CPU reference computed from the known
inputs: all_reduce (SUM, float32 and bfloat16, in place, 1 MiB and 8 bytes),
all_gather_into_tensor, reduce_scatter_tensor, broadcast, all_gather (lists), reduce,
all_to_all_single; async_op=True ordered on the current stream (the result used by a
kernel on the same stream before wait(), then by another stream after wait()); a call
mixing CPU and CUDA tensors refused; a 20-step DistributedDataParallel training of a small
MLP on cuda:0 (final parameters identical on both ranks, loss decreasing); and a CPU
tensor still reduced by the same group.  One line per check per rank, then
"rank R: all checks passed"; exits 0 only when both ranks passed everything.  Each rank
is bounded (SIGALRM) and the whole run by DEADLINE_S.

Where torch sees no CUDA device it prints "cuda_probe: no CUDA device here: skipped" and
exits 0 (the parent asks NVML, so it never initializes CUDA before forking).
"""
import os, signal, sys, tempfile, time, traceback
from datetime import timedelta

# torch.cuda.is_available() must not initialize CUDA in the parent: a forked child
# cannot use a CUDA driver its parent initialized.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import torch
import torch.distributed as dist

N = 2
RANK_BOUND_S = 50   # each rank's alarm
DEADLINE_S = 55     # the parent's, for both


def base(n, dtype):
    """Rank r's input is base * (r + 1): small integers, exact in bfloat16 sums."""
    return (torch.arange(n) % 13).to(dtype)


def check(rank, name, fn, failed):
    try:
        why = fn()
    except Exception as e:  # noqa: BLE001 - every failure is reported, then the next check
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        traceback.print_exc(file=sys.stderr)
    if why:
        failed.append(name)
        print(f"rank {rank}: {name} FAILED: {why}", flush=True)
    else:
        print(f"rank {rank}: {name} ok", flush=True)


def same(got, want):
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {got.dtype} {tuple(got.shape)}, want {want.dtype} {tuple(want.shape)}"
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        i = tuple(bad[0].tolist())
        return f"{bad.shape[0]} elements differ, first at {i}: {got[i].item()} != {want[i].item()}"
    return None


def rank_main(rank, store):
    signal.alarm(RANK_BOUND_S)
    import libcoll_torch  # noqa: F401
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("libcoll", init_method=f"file://{store}", rank=rank,
                            world_size=N, timeout=timedelta(seconds=30))
    failed = []
    tot = sum(r + 1 for r in range(N))

    def all_reduce(dtype, nbytes):
        n = nbytes // torch.tensor([], dtype=dtype).element_size()
        b = base(n, dtype)
        t = (b * (rank + 1)).to(dev)
        dist.all_reduce(t)
        torch.cuda.current_stream().synchronize()
        return same(t, b * tot)

    for dtype, dname in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
        for nbytes, sname in ((1 << 20, "1MiB"), (8, "8B")):
            check(rank, f"all_reduce {dname} {sname}",
                  lambda d=dtype, nb=nbytes: all_reduce(d, nb), failed)

    n = 65536

    def all_gather_into_tensor():
        inp = (base(n, torch.float32) + 100 * rank).to(dev)
        out = torch.empty(N * n, device=dev)
        dist.all_gather_into_tensor(out, inp)
        return same(out, torch.cat([base(n, torch.float32) + 100 * r for r in range(N)]))

    def reduce_scatter_tensor():
        b = base(N * n, torch.float32)
        inp = (b * (rank + 1)).to(dev)
        out = torch.empty(n, device=dev)
        dist.reduce_scatter_tensor(out, inp)
        return same(out, (b * tot)[rank * n:(rank + 1) * n])

    def broadcast():
        t = (base(n, torch.float32) + 7 * rank).to(dev)
        dist.broadcast(t, src=1)
        return same(t, base(n, torch.float32) + 7)

    def all_gather():
        inp = (base(1000, torch.int64) + 1000 * rank).to(dev)
        outs = [torch.empty_like(inp) for _ in range(N)]
        dist.all_gather(outs, inp)
        return same(torch.stack(outs), torch.stack([base(1000, torch.int64) + 1000 * r
                                                    for r in range(N)]))

    def reduce():
        b = base(n, torch.float32)
        t = (b * (rank + 1)).to(dev)
        dist.reduce(t, dst=0)
        return same(t, b * tot) if rank == 0 else same(t, b * (rank + 1))

    def all_to_all_single():
        # rank r sends block j (1000 elements of value 10 r + j) to rank j
        inp = torch.cat([torch.full((1000,), 10.0 * rank + j) for j in range(N)]).to(dev)
        out = torch.empty_like(inp)
        dist.all_to_all_single(out, inp)
        return same(out, torch.cat([torch.full((1000,), 10.0 * r + rank) for r in range(N)]))

    check(rank, "all_gather_into_tensor float32", all_gather_into_tensor, failed)
    check(rank, "reduce_scatter_tensor float32", reduce_scatter_tensor, failed)
    check(rank, "broadcast float32", broadcast, failed)
    check(rank, "all_gather int64", all_gather, failed)
    check(rank, "reduce float32", reduce, failed)
    check(rank, "all_to_all_single float32", all_to_all_single, failed)

    def async_same_stream():
        # 16 MiB: long enough that a host-side race would show.  The doubling is enqueued
        # before wait(): stream order alone must put it after the all-reduce.
        b = base(4 << 20, torch.float32)
        t = (b * (rank + 1)).to(dev)
        w = dist.all_reduce(t, async_op=True)
        u = t * 2
        w.wait()
        why = same(u, b * tot * 2)
        if why:
            return "used on the same stream before wait(): " + why
        # Another stream after wait(): wait() made it wait for the all-reduce.
        t2 = (b * (rank + 1)).to(dev)
        torch.cuda.current_stream().synchronize()
        w2 = dist.all_reduce(t2, async_op=True)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            w2.wait()
            v = t2 + 0
        s.synchronize()
        why = same(v, b * tot)
        if why:
            return "used on another stream after wait(): " + why
        fut = w2.get_future()
        vals = fut.wait()
        if not w2.is_completed():
            return "is_completed() is False after its future completed"
        return same(vals[0], b * tot)

    check(rank, "all_reduce async_op=True on the current stream", async_same_stream, failed)

    def mixed_refused():
        try:
            dist.all_gather_into_tensor(torch.empty(2 * N, device=dev), torch.ones(2))
        except RuntimeError as e:
            print(f"rank {rank}:   (refused: {str(e).splitlines()[0][:150]})", flush=True)
            return None
        return "a call mixing CPU and CUDA tensors was not refused"

    check(rank, "mixed CPU and CUDA tensors refused", mixed_refused, failed)

    def ddp():
        from torch.nn.parallel import DistributedDataParallel as DDP
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 1)).to(dev)
        if rank == 1:  # DDP's broadcast from rank 0 must fix this
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
        ddp = DDP(model, device_ids=[0])
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(1 + rank)
        x = torch.randn(64, 32, generator=g).to(dev)
        y = x.sum(dim=1, keepdim=True).tanh()
        losses = []
        for _ in range(20):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        flat = torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])
        every = torch.empty(N * flat.numel())
        dist.all_gather_into_tensor(every, flat)  # CPU tensors: the host path
        if not all(torch.equal(every[r * flat.numel():(r + 1) * flat.numel()], flat)
                   for r in range(N)):
            return "the final parameters differ between ranks"
        if not losses[-1] < losses[0]:
            return f"the loss did not decrease: {losses[0]:.5f} -> {losses[-1]:.5f}"
        print(f"rank {rank}:   (DDP loss {losses[0]:.5f} -> {losses[-1]:.5f})", flush=True)
        return None

    check(rank, "DDP 20 steps on cuda:0", ddp, failed)

    def cpu_still():
        c = torch.full((1024,), float(rank + 1))
        dist.all_reduce(c)
        return same(c, torch.full((1024,), float(tot)))

    check(rank, "CPU tensor still works", cpu_still, failed)
    dist.destroy_process_group()
    if failed:
        print(f"rank {rank}: {len(failed)} checks FAILED: {', '.join(failed)}", flush=True)
    else:
        print(f"rank {rank}: all checks passed", flush=True)
    sys.stdout.flush()
    os._exit(1 if failed else 0)


def main():
    if not torch.cuda.is_available():
        print("cuda_probe: no CUDA device here: skipped", flush=True)
        return 0
    d = tempfile.mkdtemp()
    store = os.path.join(d, "store")
    kids = []
    for r in range(N):
        pid = os.fork()
        if pid == 0:
            try:
                rank_main(r, store)
            except BaseException:  # noqa: BLE001 - a child never returns into the parent's code
                traceback.print_exc()
                print(f"rank {r}: stopped by an exception", flush=True)
            os._exit(1)
        kids.append(pid)
    bad = 0
    left = dict.fromkeys(kids)
    end = time.monotonic() + DEADLINE_S
    while left and time.monotonic() < end:
        for pid in list(left):
            got, st = os.waitpid(pid, os.WNOHANG)
            if got:
                del left[pid]
                if st != 0:
                    bad += 1
                    if os.WIFSIGNALED(st):
                        print(f"cuda_probe: a rank died of signal {os.WTERMSIG(st)}", flush=True)
        time.sleep(0.05)
    for pid in left:  # past the deadline: ours to end
        print(f"cuda_probe: a rank (pid {pid}) did not finish within {DEADLINE_S} s: killed",
              flush=True)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        bad += 1
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)
    print(f"cuda_probe: {'FAILED' if bad else 'passed'} ({N} ranks)", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
