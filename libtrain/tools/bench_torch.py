#!/usr/bin/python3
"""bench_torch.py — trains the same GPT as coll-train with PyTorch (fp32) and prints
tokens/s, for the comparisons in docs/perf.md. The model is the one in reference.py;
AdamW, clipping and the schedule as in coll-train. On --device cuda the matrix products
are plain fp32 (TF32 off), as coll-train's cuBLAS calls, unless --tf32 1.

usage: bench_torch.py [--layers 4 --channels 128 --heads 4 --seq 64 --max-seq 256
                       --batch 16 --steps 30 --threads 2 --data FILE
                       --device cpu|cuda --tf32 0|1]
"""
import argparse
import os
import sys
import time


def _threads_from_argv():
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return str(os.cpu_count())


# torch.set_num_threads() does not reach the BLAS: Debian's torch calls OpenBLAS, whose
# own thread pool would use every core. Pin it before torch (and numpy) load it.
os.environ["OPENBLAS_NUM_THREADS"] = _threads_from_argv()
os.environ["OMP_NUM_THREADS"] = _threads_from_argv()

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import GPT  # noqa: E402


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--channels", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--max-seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--data", default=os.path.join(here, "..", "data", "sonnets.txt"))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--tf32", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    dev = torch.device(a.device)
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = bool(a.tf32)
        torch.backends.cudnn.allow_tf32 = bool(a.tf32)
    data = np.frombuffer(open(a.data, "rb").read(), dtype=np.uint8).astype(np.int64)
    model = GPT(256, a.max_seq, a.layers, a.channels, a.heads)
    for p in model.parameters():  # GPT-2 init, roughly: scale does not affect speed
        torch.nn.init.normal_(p, std=0.02) if p.dim() == 2 else None
    model = model.to(dev)
    layout = model.flat_layout()
    groups = [{"params": [t for t, d in layout if d], "weight_decay": 0.1},
              {"params": [t for t, d in layout if not d], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    params = [t for t, _ in layout]
    rng = np.random.default_rng(0)
    B, T = a.batch, a.seq
    times = []
    for step in range(a.steps):
        starts = rng.integers(0, len(data) - T - 1, size=B)
        x = torch.from_numpy(np.stack([data[s:s + T] for s in starts])).to(dev)
        y = torch.from_numpy(np.stack([data[s + 1:s + T + 1] for s in starts])).to(dev)
        if a.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if a.device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        times.append(dt)
        print("step %4d | loss %.6f | %7.1f ms | %8.0f tok/s" % (step + 1, loss.item(),
              dt * 1e3, B * T / dt))
    mean = sum(times[1:]) / max(1, len(times) - 1)
    where = ("%s, TF32 %s" % (torch.cuda.get_device_name(dev), "on" if a.tf32 else "off")
             if a.device == "cuda" else "%d threads" % a.threads)
    print("pytorch %s: %s, %.1f ms/step, %.0f tok/s (mean of steps 2..%d)"
          % (torch.__version__, where, mean * 1e3, B * T / mean, a.steps))


if __name__ == "__main__":
    main()
