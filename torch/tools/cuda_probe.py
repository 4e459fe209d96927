#!/usr/bin/env python3
"""cuda_probe.py — what the libcoll backend does with a CUDA tensor, on 2 forked ranks.

    PYTHONPATH=<build>/torch python3 torch/tools/cuda_probe.py

The binding takes CPU tensors only (docs/pytorch.md, "Limits"): this records, on a machine
with a GPU, the answer dist.all_reduce gives a CUDA tensor (the exception's sentence), and
that the same process group still reduces a CPU tensor afterwards.  Prints one line per
rank and exits 0 when every rank got a RuntimeError naming the device and then a correct
CPU sum; 1 otherwise.  Used by scripts/gpu_check.sh's torch stage.
"""
import os, sys, tempfile

import torch
import torch.distributed as dist

N = 2


def rank_main(rank, store):
    import libcoll_torch  # noqa: F401
    dist.init_process_group("libcoll", init_method=f"file://{store}", rank=rank, world_size=N)
    said = "no exception"
    try:
        t = torch.ones(1024, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        said = f"no exception; result[0] = {t[0].item()}"
    except RuntimeError as e:
        said = str(e)
    c = torch.full((1024,), float(rank + 1))
    dist.all_reduce(c)
    ok = "cuda" in said and c.eq(N * (N + 1) / 2).all().item()
    print(f"rank {rank}: CUDA tensor -> {said}; CPU sum {'ok' if ok else 'WRONG'}", flush=True)
    dist.destroy_process_group()
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    d = tempfile.mkdtemp()
    store = os.path.join(d, "store")
    kids = []
    for r in range(N):
        pid = os.fork()
        if pid == 0:
            rank_main(r, store)
        kids.append(pid)
    bad = 0
    for pid in kids:
        _, st = os.waitpid(pid, 0)
        bad += st != 0
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)
    sys.exit(1 if bad else 0)
