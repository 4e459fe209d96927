#!/usr/bin/env python3
"""parallel_compare.py — PyTorch's own parallelism on libcoll and on Gloo, losses compared.

    PYTHONPATH=build/torch python3 torch/tools/parallel_compare.py
        [--mode ddp|fsdp2|tp|pp-1f1b|pp-interleaved|mesh2d|all] [--ranks 2] [--steps 20]
        [--repeats 1] [--timeout 180] [--reference]

Each mode trains the small GPT defined below (V=256, T=32, L=2, C=64, NH=4, untied LM head,
separate q/k/v so that the tensor-parallel plan can name them) with AdamW for --steps
steps, once with backend "libcoll" and once with "gloo" (ranks forked after import,
FileStore rendezvous; nothing but the backend's name differs):

  ddp             DistributedDataParallel, each rank its own batch of 4
  fsdp2           fully_shard on every block and on the root, each rank its own batch of 4
  tp              parallelize_module: embeddings RowwiseParallel to a sequence-sharded
                  output, layer norms SequenceParallel, q/k/v/fc ColwiseParallel, o/proj
                  RowwiseParallel, LM head ColwiseParallel to replicated logits; every rank
                  the same batch of 4
  pp-1f1b         torch.distributed.pipelining, one stage per rank, Schedule1F1B
  pp-interleaved  two stages per rank, ScheduleInterleaved1F1B (batch 8, 4 microbatches)
  mesh2d          init_device_mesh("cpu", (ranks/2, 2), ("dp", "tp")): the tp plan on "tp",
                  fully_shard on "dp" (ranks 4 under --mode all)

It prints every step's loss (the mean over data-parallel replicas) of both, the largest
relative difference, and the median step time of each (rank 0's; with --repeats R: R runs
of each, interleaved, the median of the runs' medians, losses compared in every run).
Where Gloo cannot run a mode, it says so with Gloo's exact error and compares libcoll
with a single-process reference computed here instead (the same model, data and
optimizer without torch.distributed: data-parallel replicas and microbatches become mean
losses over their batches); --reference adds that comparison where Gloo ran too.  A mode passes when its difference is at most 1e-5 relative
and prints "parallel_compare MODE N: OK"; the script exits 1 if any mode failed.

Every rank is reaped: a run that has not finished within --timeout seconds (or whose
other ranks outlive a failed rank by 20 s) is killed and reported; the store's temporary
directory is removed whatever happened.
"""
import argparse, copy, math, os, shutil, signal, statistics, sys, tempfile, time, traceback
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

V, T, L, C, NH = 256, 32, 2, 64, 4
TOL = 1e-5
MODES = ["ddp", "fsdp2", "tp", "pp-1f1b", "pp-interleaved", "mesh2d"]
warnings.filterwarnings("ignore")


# ---------------------------------------------------------------------------- the model

class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.hs = C // NH
        self.q, self.k, self.v, self.o = (nn.Linear(C, C) for _ in range(4))

    def forward(self, x):
        B, Tx, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds NH / tp of them
        q, k, v = (m(x).view(B, Tx, -1, self.hs).transpose(1, 2) for m in (self.q, self.k, self.v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hs))
        mask = torch.tril(torch.ones(Tx, Tx, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.o((att @ v).transpose(1, 2).reshape(B, Tx, -1))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(C), Attention()
        self.ln2, self.mlp = nn.LayerNorm(C), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A pipeline stage keeps a part: tok/pos (the first stage), some blocks, ln_f/head
    (the last); the others are None."""

    def __init__(self, layers):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleDict({str(i): Block() for i in range(layers)})
        self.ln_f, self.head = nn.LayerNorm(C), nn.Linear(C, V, bias=False)

    def forward(self, x):
        if self.tok is not None:
            # positions (1, T): a sequence-sharded pos embedding shards them along dim 1
            x = self.tok(x) + self.pos(torch.arange(x.shape[1]).unsqueeze(0))
        for b in self.blocks.values():
            x = b(x)
        if self.ln_f is not None:
            x = self.head(self.ln_f(x))
        return x


def loss_fn(logits, tgt):
    return F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))


def layers_for(stages):
    # pieces: the embeddings, each block, the head; one piece per stage at least
    return max(L, stages - 2)


def make_model(layers):
    torch.manual_seed(1234)
    return GPT(layers)


def stage_of(full, s, stages):
    """Stage s of `stages`: a copy of `full` keeping its contiguous share of the pieces."""
    layers = len(full.blocks)
    pieces = ["emb"] + [str(i) for i in range(layers)] + ["out"]
    per, extra = divmod(len(pieces), stages)
    lo = s * per + min(s, extra)
    mine = pieces[lo:lo + per + (1 if s < extra else 0)]
    m = copy.deepcopy(full)
    if "emb" not in mine:
        m.tok = m.pos = None
    if "out" not in mine:
        m.ln_f = m.head = None
    for i in range(layers):
        if str(i) not in mine:
            del m.blocks[str(i)]
    return m


def tp_plan(layers):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel)
    plan = {
        "tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "pos": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "ln_f": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    for i in range(layers):
        p = f"blocks.{i}."
        plan.update({
            p + "ln1": SequenceParallel(),
            p + "attn": PrepareModuleInput(input_layouts=(Shard(1),),
                                           desired_input_layouts=(Replicate(),)),
            p + "attn.q": ColwiseParallel(), p + "attn.k": ColwiseParallel(),
            p + "attn.v": ColwiseParallel(),
            p + "attn.o": RowwiseParallel(output_layouts=Shard(1)),
            p + "ln2": SequenceParallel(),
            p + "mlp": PrepareModuleInput(input_layouts=(Shard(1),),
                                          desired_input_layouts=(Replicate(),)),
            p + "mlp.fc": ColwiseParallel(),
            p + "mlp.proj": RowwiseParallel(output_layouts=Shard(1)),
        })
    return plan


# ---------------------------------------------------------------------------- the data

def batch_size(mode):
    return 8 if mode.startswith("pp") else 4


MICRO = 4  # pipeline microbatches


def batches(dp_rank):
    """Data-parallel replica dp_rank's batches, one (idx, tgt) per step."""
    g = torch.Generator().manual_seed(99 + dp_rank)
    while True:
        idx = torch.randint(0, V, (BATCH, T), generator=g)
        yield idx, torch.roll(idx, -1, 1)


# ---------------------------------------------------------------------------- one rank

def same_backend(backend, *groups):
    """A DeviceMesh makes its groups with new_group(backend=None): the default group's
    backend, so the run under test is the backend's own all the way down."""
    for g in groups:
        if dist.get_backend(g) != backend:
            raise RuntimeError(f"a mesh group runs on {dist.get_backend(g)}, not {backend}")


def rank_main(mode, backend, rank, n, steps, store):
    torch.set_num_threads(1)
    if backend == "libcoll":
        import libcoll_torch  # noqa: F401
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=n)
    dp_rank = rank  # which data-parallel replica's data this rank trains on
    if mode in ("ddp", "fsdp2", "tp", "mesh2d"):
        model = make_model(L)
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    elif mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for b in model.blocks.values():
            fully_shard(b)
        fully_shard(model)
    elif mode == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module
        mesh = init_device_mesh("cpu", (n,))
        same_backend(backend, mesh.get_group())
        parallelize_module(model, mesh, tp_plan(L))
        dp_rank = 0
    elif mode == "mesh2d":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import parallelize_module
        mesh = init_device_mesh("cpu", (n // 2, 2), mesh_dim_names=("dp", "tp"))
        same_backend(backend, mesh["dp"].get_group(), mesh["tp"].get_group())
        parallelize_module(model, mesh["tp"], tp_plan(L))
        for b in model.blocks.values():
            fully_shard(b, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        dp_rank = mesh["dp"].get_local_rank()
    if mode.startswith("pp"):
        from torch.distributed.pipelining import (PipelineStage, Schedule1F1B,
                                                  ScheduleInterleaved1F1B)
        per = 2 if mode == "pp-interleaved" else 1
        stages = per * n
        full = make_model(layers_for(stages))
        # stage s on rank s % n: the first on rank 0, the last on rank n - 1
        mods = [stage_of(full, s, stages) for s in range(rank, stages, n)]
        pstages = [PipelineStage(m, s, stages, torch.device("cpu"))
                   for m, s in zip(mods, range(rank, stages, n))]
        if per == 1:
            sched = Schedule1F1B(pstages[0], MICRO, loss_fn=loss_fn)
        else:
            sched = ScheduleInterleaved1F1B(pstages, MICRO, loss_fn=loss_fn)
        params = [p for m in mods for p in m.parameters()]
        dp_rank = 0
    else:
        params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    data = batches(dp_rank)
    losses, times = [], []
    for _ in range(steps):
        idx, tgt = next(data)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if mode.startswith("pp"):
            mb = []
            if rank == 0:
                sched.step(idx, target=tgt if n == 1 else None, losses=mb)
            elif rank == n - 1:
                sched.step(target=tgt, losses=mb)
            else:
                sched.step()
            loss = torch.stack(mb).mean().detach() if mb else torch.zeros(())
        else:
            loss = loss_fn(model(idx), tgt)
            loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        # every rank's loss, summed here in rank order (an all_reduce's order of sums is the
        # backend's own): the mean over replicas, each counted n / dp times; for a pipeline
        # the last stage's loss
        every = [torch.zeros(()) for _ in range(n)]
        dist.all_gather(every, loss.detach().reshape(()))
        losses.append(every[-1].item() if mode.startswith("pp")
                      else sum(t.item() for t in every) / n)
    dist.destroy_process_group()
    return {"losses": losses, "time": statistics.median(times)}


def reference_main(mode, n, steps):
    """The same training in one process without torch.distributed."""
    torch.set_num_threads(1)
    pp = mode.startswith("pp")
    dp = {"ddp": n, "fsdp2": n, "mesh2d": n // 2}.get(mode, 1)
    micro = MICRO if pp else 1
    stages = (2 if mode == "pp-interleaved" else 1) * n if pp else 1
    model = make_model(layers_for(stages) if pp else L)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    data = [batches(r) for r in range(dp)]
    losses, times = [], []
    for _ in range(steps):
        pieces = []
        for d in data:
            idx, tgt = next(d)
            pieces += list(zip(idx.chunk(micro), tgt.chunk(micro)))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.stack([loss_fn(model(i), t) for i, t in pieces]).mean()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return {"losses": losses, "time": statistics.median(times)}


# ---------------------------------------------------------------------------- the runs

def run(mode, backend, n, steps, timeout):
    """Forks n ranks (or one reference process), waits for them at most `timeout` seconds,
    reaps them all and removes the store's directory.  Returns rank 0's result, or
    {"error": ...} with every failing rank's error and what was killed."""
    d = tempfile.mkdtemp(prefix="coll-par-")
    store = os.path.join(d, "store")
    pids = {}
    try:
        for rank in range(1 if backend == "reference" else n):
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    res = (reference_main(mode, n, steps) if backend == "reference"
                           else rank_main(mode, backend, rank, n, steps, store))
                except BaseException as e:
                    traceback.print_exc()
                    res = {"error": f"{type(e).__name__}: {e}".strip()}
                    code = 1
                try:
                    with open(os.path.join(d, f"result.{rank}"), "w") as f:
                        f.write(repr(res))
                finally:
                    os._exit(code)
            pids[pid] = rank
        deadline, killed, failed = time.monotonic() + timeout, [], False
        live = dict(pids)
        while live:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid in live:
                del live[pid]
                if status != 0 and not failed:
                    failed = True  # the others may wait for it: give them 20 s
                    deadline = min(deadline, time.monotonic() + 20)
                continue
            if time.monotonic() > deadline:
                for p, r in live.items():
                    os.kill(p, signal.SIGKILL)
                    killed.append(r)
                for p in list(live):
                    os.waitpid(p, 0)
                live.clear()
                break
            time.sleep(0.05)
        results = {}
        for rank in range(len(pids)):
            try:
                with open(os.path.join(d, f"result.{rank}")) as f:
                    results[rank] = eval(f.read())
            except (OSError, SyntaxError):
                pass
    finally:
        for p in pids:  # an exception here (KeyboardInterrupt): nothing left running
            try:
                os.kill(p, signal.SIGKILL)
                os.waitpid(p, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        shutil.rmtree(d, ignore_errors=True)
    by_error = {}  # each error once, with the ranks that raised it
    for r, res in sorted(results.items()):
        if "error" in res:
            by_error.setdefault(res["error"], []).append(str(r))
    errors = [f"rank{'s' if len(rs) > 1 else ''} {', '.join(rs)}: {e}"
              for e, rs in by_error.items()]
    if killed:
        errors.append(f"rank(s) {sorted(killed)} killed after "
                      f"{'a failed rank' if failed else f'{timeout} s'} (hung)")
    if errors or 0 not in results:
        return {"error": "; ".join(errors) or "rank 0 left no result"}
    return results[0]


def rel(a, b):
    return abs(a - b) / abs(b)


def compare(mode, n, steps, repeats, timeout, with_reference):
    runs = {"libcoll": [], "gloo": []}
    gloo_error = None
    for _ in range(repeats):
        for b in ("libcoll", "gloo"):
            if b == "gloo" and gloo_error:
                continue
            r = run(mode, b, n, steps, timeout)
            if "error" in r:
                if b == "libcoll":
                    print(f"parallel_compare {mode} {n}: FAILED: the libcoll run failed: "
                          f"{r['error']}", flush=True)
                    return False
                gloo_error = r["error"]
                continue
            runs[b].append(r)
    if gloo_error:
        print(f"{mode}: Gloo could not run this mode, so libcoll is compared with a "
              f"single-process reference; Gloo's error: {gloo_error}")
        del runs["gloo"]
    if gloo_error or with_reference:
        ref = run(mode, "reference", n, steps, timeout)
        if "error" in ref:
            print(f"parallel_compare {mode} {n}: FAILED: the reference failed: {ref['error']}")
            return False
        runs["reference"] = [ref] * repeats
    others = [b for b in runs if b != "libcoll"]
    judge = others[0]  # gloo where it ran, else the reference
    print(f"{mode} ({n} ranks): {'step':>4} {'libcoll loss':>14}"
          + "".join(f" {b + ' loss':>15}" for b in others))
    for s in range(steps):
        print(f"{mode} ({n} ranks): {s:4d} {runs['libcoll'][0]['losses'][s]:14.8f}"
              + "".join(f" {runs[b][0]['losses'][s]:15.8f}" for b in others))
    worst = {}
    for b in others:
        worst[b] = 0.0
        for lc, ot in zip(runs["libcoll"], runs[b]):
            if len(lc["losses"]) != steps or len(ot["losses"]) != steps:
                worst[b] = math.inf
            for x, y in zip(lc["losses"], ot["losses"]):
                worst[b] = max(worst[b], rel(x, y))
    times = {b: statistics.median(r["time"] for r in runs[b]) for b in runs}
    print(f"{mode}: largest relative difference "
          + ", ".join(f"libcoll vs {b} {worst[b]:.3g}{' (bitwise equal)' if worst[b] == 0 else ''}"
                      for b in others)
          + "; median step time " + ", ".join(f"{b} {times[b] * 1e3:.2f} ms" for b in runs)
          + f" ({n} ranks, {repeats} interleaved runs, torch {torch.__version__}, "
          f"load {os.getloadavg()[0]:.2f})")
    ok = worst[judge] <= TOL
    print(f"parallel_compare {mode} {n}: " + (
        "OK" + (" (against the reference: Gloo could not run it)" if gloo_error else "")
        if ok else f"FAILED: relative difference {worst[judge]:.3g} > {TOL} against {judge}"),
        flush=True)
    return ok


def main():
    global BATCH
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="all", choices=MODES + ["all"])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=180, help="seconds per run")
    ap.add_argument("--reference", action="store_true",
                    help="also compare with the single-process reference where Gloo runs")
    a = ap.parse_args()
    torch.set_num_threads(1)
    ok = True
    for mode in MODES if a.mode == "all" else [a.mode]:
        n = 4 if mode == "mesh2d" and a.mode == "all" else a.ranks
        if mode == "mesh2d" and (n < 4 or n % 2):
            sys.exit(f"parallel_compare: mesh2d takes an even --ranks of 4 or more, not {n}")
        BATCH = batch_size(mode)  # set before fork: the ranks inherit it
        t0 = time.monotonic()
        ok &= compare(mode, n, a.steps, a.repeats, a.timeout, a.reference)
        print(f"{mode}: wall time {time.monotonic() - t0:.1f} s", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
