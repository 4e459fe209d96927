#!/usr/bin/python3
"""reference.py — the PyTorch reference for libtrain's model, fp32: on the CPU (Debian's
/usr/bin/python3 and python3-torch; the default) or with --device cuda on the GPU (a
python3 whose torch has CUDA; TF32 off, deterministic kernels where torch has them).

It is written independently of the C code from the model description in
docs/training.md: it builds the same GPT-2-style model with torch.nn modules, loads
the initial weights from a one-process coll-train checkpoint (a manifest and its one
shard; format in libtrain/parallel/checkpoint.c), and for the batches it is given writes

  logits.bin   (B,T,V) float32  logits of batch 0
  loss.bin     ()      float32  mean cross-entropy of batch 0
  grads.bin    (P,)    float32  every parameter gradient of batch 0, in the
                                checkpoint's flat layout
  losses.bin   (S,)    float32  loss of each of S AdamW steps (one batch per step)
  norms.bin    (S,)    float32  global gradient norm before clipping, per step

usage: reference.py --ckpt CKPT --inputs IN.bin --targets TG.bin --batch B --seq T
                    --steps S --out DIR [--threads N] [--device cpu|cuda]
IN.bin/TG.bin hold S*B*T int32 token ids. The optimizer hyper-parameters (lr schedule,
betas, eps, weight decay, clipping) are read from the checkpoint header. The outputs are
the same files, in the same layout, on either device. It must never fall back to the CPU
when --device cuda finds no GPU (it exits with the reason), nor leave TF32 on.
"""
import argparse
import math
import os
import struct
import sys

# cuBLAS is deterministic under use_deterministic_algorithms only with a fixed workspace,
# which it reads from the environment when CUDA starts: before torch is imported. On the
# CPU it is never read.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HEADER = struct.Struct("<8sII7I8Q7f3I")
FIELDS = ("magic version header_bytes vocab max_seq layers channels heads batch seq "
          "seed step nparams sample_rng epoch index data_tokens data_hash lr min_lr_frac "
          "beta1 beta2 eps weight_decay grad_clip warmup steps flags").split()
GRID = struct.Struct("<4I")              # T, S, units, P (version 4: 0 for one stage)
SHARD = struct.Struct("<8s6I2Q")         # magic, version, t, s, T, S, p, step, count


def read_checkpoint(path):
    """The header and the parameters of a one-process checkpoint: its manifest at path and
    its one shard path.shard0.0of1x1 (a 1 x 1 x 1 grid; format in
    libtrain/parallel/checkpoint.c; versions 4 and 5)."""
    raw = open(path, "rb").read()
    h = dict(zip(FIELDS, HEADER.unpack_from(raw, 0)))
    if h["magic"] != b"COLLTRN\0" or h["version"] not in (4, 5):
        sys.exit("reference.py: %s is not a version-4 or -5 coll-train checkpoint" % path)
    T, S, _, P = GRID.unpack_from(raw, h["header_bytes"])
    P = max(P, 1)
    if T != 1 or S != 1 or P != 1:
        sys.exit("reference.py: %s is a %d x %d x %d grid; only a one-process checkpoint "
                 "(1 x 1 x 1) holds the weights in one piece" % (path, T, S, P))
    count = h["nparams"]
    shard = path + ".shard0.0of1x1"
    sraw = open(shard, "rb").read()
    magic, version, _, _, _, _, _, _, n = SHARD.unpack_from(sraw, 0)
    if magic != b"COLLSHD\0" or version != h["version"] or n != count:
        sys.exit("reference.py: %s is not the shard of %s" % (shard, path))
    params = np.frombuffer(sraw, dtype="<f4", count=n, offset=SHARD.size).copy()
    return h, params


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C, eps=1e-5)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C, eps=1e-5)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def attention(self, x):
        B, T, C = x.shape
        hs = C // self.NH
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.NH, hs).transpose(1, 2)  # (B,NH,T,hs)
        k = k.view(B, T, self.NH, hs).transpose(1, 2)
        v = v.view(B, T, self.NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        x = x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, V, maxT, L, C, NH):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(maxT, C)
        self.blocks = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.lnf = nn.LayerNorm(C, eps=1e-5)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # LM head tied to the token embedding
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def flat_layout(self):
        """(tensor, decay) in the order of the checkpoint's flat parameter array."""
        out = [(self.wte.weight, True), (self.wpe.weight, True)]
        for b in self.blocks:
            out += [(b.ln1.weight, False), (b.ln1.bias, False),
                    (b.qkv.weight, True), (b.qkv.bias, False),
                    (b.proj.weight, True), (b.proj.bias, False),
                    (b.ln2.weight, False), (b.ln2.bias, False),
                    (b.fc.weight, True), (b.fc.bias, False),
                    (b.fcproj.weight, True), (b.fcproj.bias, False)]
        out += [(self.lnf.weight, False), (self.lnf.bias, False)]
        return out


def lr_at(h, step):
    """linear warmup, then cosine from lr to lr*min_lr_frac at `steps` (0-based step)."""
    lr, warmup, steps = h["lr"], h["warmup"], h["steps"]
    if step < warmup:
        return lr * (step + 1) / warmup
    min_lr = lr * h["min_lr_frac"]
    if step >= steps or steps <= warmup:
        return min_lr
    ratio = (step - warmup) / (steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--targets", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("reference.py: --device cuda: torch %s (CUDA %s) sees no GPU "
                     "(torch.cuda.is_available() is False)" % (torch.__version__,
                                                                torch.version.cuda))
        # plain fp32 products, as coll-train's cuBLAS calls: TF32 would round the inputs
        # to 10 mantissa bits (relative error ~5e-4), far above the tolerances compared.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        # warn_only: a CUDA kernel without a deterministic variant warns instead of
        # stopping the run; the comparison's tolerance covers its reordered sums.
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        torch.use_deterministic_algorithms(True)
    dev = torch.device(a.device)

    h, flat = read_checkpoint(a.ckpt)
    model = GPT(h["vocab"], h["max_seq"], h["layers"], h["channels"], h["heads"]).to(dev)
    layout = model.flat_layout()
    assert sum(t.numel() for t, _ in layout) == h["nparams"], "layout size mismatch"
    off = 0
    with torch.no_grad():
        for t, _ in layout:
            t.copy_(torch.from_numpy(flat[off:off + t.numel()]).view_as(t))
            off += t.numel()

    B, T, S = a.batch, a.seq, a.steps
    inp = np.fromfile(a.inputs, dtype="<i4").reshape(-1, B, T)
    tgt = np.fromfile(a.targets, dtype="<i4").reshape(-1, B, T)
    assert inp.shape[0] >= max(S, 1), "not enough batches for the steps"

    def w(name, arr):
        np.asarray(arr, dtype="<f4").tofile(os.path.join(a.out, name))

    # 1. one forward/backward: logits, loss, all gradients
    def batch(k):
        return (torch.from_numpy(inp[k]).long().to(dev), torch.from_numpy(tgt[k]).long().to(dev))

    x0, y0 = batch(0)
    logits, loss = model(x0, y0)
    loss.backward()
    w("logits.bin", logits.detach().cpu().numpy().ravel())
    w("loss.bin", [loss.item()])
    w("grads.bin", np.concatenate([t.grad.cpu().numpy().ravel() for t, _ in layout]))

    # 2. S AdamW steps with clipping and the learning-rate schedule
    with torch.no_grad():
        off = 0
        for t, _ in layout:  # back to the initial weights
            t.copy_(torch.from_numpy(flat[off:off + t.numel()]).view_as(t))
            off += t.numel()
    params = [t for t, _ in layout]
    groups = [{"params": [t for t, d in layout if d], "weight_decay": h["weight_decay"]},
              {"params": [t for t, d in layout if not d], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=h["lr"], betas=(h["beta1"], h["beta2"]),
                            eps=h["eps"], foreach=False)
    losses, norms = [], []
    for step in range(S):
        for g in opt.param_groups:
            g["lr"] = lr_at(h, step)
        opt.zero_grad(set_to_none=False)
        _, loss = model(*batch(step))
        loss.backward()
        clip = h["grad_clip"] if h["grad_clip"] > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
    w("losses.bin", losses)
    w("norms.bin", norms)


if __name__ == "__main__":
    main()
