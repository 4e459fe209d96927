"""torch_check.py — one run of the libcoll PyTorch backend on N forked ranks (test_torch.c).

    /usr/bin/python3 torch_check.py MODE N      (PYTHONPATH: the built libcoll_torch)

MODE: ops    every operation x dtype on the world and on a subgroup (ranks 1..N-1),
             against results computed here from rank-dependent inputs
      async  async_op=True: Work.wait / is_completed / futures (then) of several ops
      badop  a bitwise ReduceOp and a libcoll refusal raise RuntimeError with a sentence
      kill   the last rank SIGKILLs itself; the others must raise within seconds
      drop   async all_reduces whose Work and tensor are dropped at once, then
             destroy_process_group() must return
Prints "torch_check MODE N: OK <checks> checks" and exits 0, or says what failed and
exits 1.  The parent imports torch once and forks the ranks (FileStore rendezvous in a
temporary directory); it kills and reaps every rank on a timeout and never leaves
a file behind.
"""
import os, signal, sys, tempfile, time, warnings

import torch
import torch.distributed as dist

MODE, N = sys.argv[1], int(sys.argv[2])
TIMEOUT = 120
warnings.filterwarnings("ignore", message=".*will be deprecated")

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
COMPLEX = [torch.complex64, torch.complex128]
ALL = FLOATS + INTS + [torch.bool] + COMPLEX
MOVE_ONLY = [torch.int16]  # no libcoll reduction, but data movement takes any dtype
checks = 0


def fail(msg):
    raise AssertionError(msg)


def same(got, want, what):
    global checks
    checks += 1
    want = want.to(got.dtype)
    if got.shape != want.shape:
        fail(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if got.dtype in (torch.float16, torch.bfloat16):
        ok = torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    elif got.is_floating_point() or got.is_complex():
        ok = torch.allclose(got, want, rtol=1e-6, atol=1e-6)
    else:
        ok = torch.equal(got, want)
    if not ok:
        fail(f"{what}: got {got.flatten()[:8].tolist()}, expected {want.flatten()[:8].tolist()}")


def inp(r, n, dtype, salt=0):
    """Rank r's input: small positive values so every product stays exact."""
    v = (torch.arange(n) + r + salt) % 3 + 1
    if dtype == torch.bool:
        return (v % 2 == 0)
    if dtype.is_complex:
        return torch.complex(v.double(), (v * 2 - r).double()).to(dtype)
    return v.to(dtype)


def reduce_expect(xs, op):
    s = torch.stack([x if x.dtype != torch.bool else x.to(torch.uint8) for x in xs])
    if xs[0].dtype == torch.bool:
        return {"sum": s.amax(0), "max": s.amax(0), "min": s.amin(0), "prod": s.amin(0)}[op].bool()
    acc = s.to(torch.complex128 if s.is_complex() else torch.float64)
    if op == "sum":
        return acc.sum(0)
    if op == "avg":
        return acc.sum(0) / len(xs)
    if op == "prod":
        return acc.prod(0)
    if op == "min":
        return acc.amin(0)
    return acc.amax(0)


OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "prod": dist.ReduceOp.PRODUCT,
       "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def ops_for(dtype):
    if dtype == torch.bool:
        return ["sum", "prod", "min", "max"]
    if dtype.is_complex:
        return ["sum", "avg"]
    if dtype.is_floating_point:
        return ["sum", "avg", "prod", "min", "max"]
    return ["sum", "prod", "min", "max"]


def allgather_base(out, x, group):
    f = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
    return f(out, x, group=group)


def reduce_scatter_base(out, x, group, op=dist.ReduceOp.SUM):
    f = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
    return f(out, x, op=op, group=group)


def run_ops(group, ranks, tag):
    """Every operation on `group` (global ranks `ranks`); r is the rank in the group."""
    n = len(ranks)
    r = ranks.index(dist.get_rank())
    # all_reduce: every dtype x op, odd count
    for dt in ALL:
        for op in ops_for(dt):
            t = inp(r, 7, dt)
            dist.all_reduce(t, op=OPS[op], group=group)
            want = reduce_expect([inp(i, 7, dt) for i in range(n)], op)
            if op == "avg" and not (dt.is_floating_point or dt.is_complex):
                continue
            same(t, want, f"{tag} all_reduce {dt} {op}")
    # PREMUL_SUM (scale by 2, then sum)
    t = inp(r, 5, torch.float32)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0), group=group)
    same(t, 2 * reduce_expect([inp(i, 5, torch.float32) for i in range(n)], "sum"), f"{tag} premul_sum")
    # a non-contiguous tensor: only its view changes
    base = torch.zeros(4, 6)
    view = base[:, ::2]
    view.copy_(inp(r, 12, torch.float32).view(4, 3))
    dist.all_reduce(view, group=group)
    same(view, reduce_expect([inp(i, 12, torch.float32) for i in range(n)], "sum").view(4, 3), f"{tag} non-contiguous")
    same(base[:, 1::2], torch.zeros(4, 3), f"{tag} non-contiguous: the rest untouched")
    # the same through a Work (async_op=True, then wait): the blocking calls above take
    # the binding's direct path, these the stream + Work path
    for dt in ALL:
        for op in ("sum", "max") if not dt.is_complex else ("sum",):
            t = inp(r, 7, dt, 2)
            dist.all_reduce(t, op=OPS[op], group=group, async_op=True).wait()
            same(t, reduce_expect([inp(i, 7, dt, 2) for i in range(n)], op), f"{tag} async all_reduce {dt} {op}")
    # all_reduce_coalesced: one flat all-reduce per dtype.  torch 1.13's
    # dist.all_reduce_coalesced takes one dtype only, so the mixed lists (dtypes, shapes, a
    # non-contiguous view, complex, empty) go to the process group's method itself; "dist"
    # is torch's function on the float32 ones, async
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    base = torch.zeros(4, 6)
    shapes = [(3, torch.float64), (12, torch.float32), (9, torch.float64), (5, torch.int32),
              (4, torch.complex64), (0, torch.float32), (6, torch.float32)]
    for op in ("sum", "max", "premul", "dist"):
        base.zero_()
        ts = [inp(r, k, dt, j) for j, (k, dt) in enumerate(shapes)]
        ts[1] = base[:, ::2]
        ts[1].copy_(inp(r, 12, torch.float32, 1).view(4, 3))
        ts[2] = ts[2].view(3, 3)
        # the dtypes each op takes
        use = [j for j, (k, dt) in enumerate(shapes)
               if not (op == "max" and dt.is_complex or op == "premul" and not dt.is_floating_point
                       or op == "dist" and dt != torch.float32)]
        rop = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "dist": dist.ReduceOp.SUM,
               "premul": dist._make_nccl_premul_sum(2.0)}[op]
        if op == "dist":
            dist.all_reduce_coalesced([ts[j] for j in use], op=rop, group=group, async_op=True).wait()
        else:
            opts = dist.AllreduceCoalescedOptions()
            opts.reduceOp = rop
            pg.allreduce_coalesced([ts[j] for j in use], opts).wait()
        for j in use:
            k, dt = shapes[j]
            want = reduce_expect([inp(i, k, dt, j) for i in range(n)], "max" if op == "max" else "sum")
            same(ts[j].reshape(-1), want * (2 if op == "premul" else 1),
                 f"{tag} all_reduce_coalesced {op} {j} ({dt}, {k})")
        same(base[:, 1::2], torch.zeros(4, 3), f"{tag} all_reduce_coalesced {op}: the rest of the view's base untouched")
    # broadcast from every root, every dtype
    for root in range(n):
        for dt in ALL + MOVE_ONLY:
            t = inp(r, 6, dt) if r == root else torch.zeros(6, dtype=dt)
            dist.broadcast(t, src=ranks[root], group=group)
            same(t, inp(root, 6, dt), f"{tag} broadcast {dt} root {root}")
    # reduce to the last rank
    root = n - 1
    for dt, op in [(torch.float32, "sum"), (torch.int32, "max"), (torch.bfloat16, "min"), (torch.int64, "prod")]:
        t = inp(r, 5, dt)
        dist.reduce(t, dst=ranks[root], op=OPS[op], group=group)
        same(t, reduce_expect([inp(i, 5, dt) for i in range(n)], op) if r == root else inp(r, 5, dt),
             f"{tag} reduce {dt} {op}")
    # all_gather (list), into one tensor, coalesced
    for dt in [torch.float32, torch.int8, torch.bool, torch.complex64, torch.int16]:
        outs = [torch.zeros(2, 3, dtype=dt) for _ in range(n)]
        dist.all_gather(outs, inp(r, 6, dt).view(2, 3), group=group)
        for i in range(n):
            same(outs[i], inp(i, 6, dt).view(2, 3), f"{tag} all_gather {dt} from {i}")
        out = torch.zeros(n * 5, dtype=dt)
        allgather_base(out, inp(r, 5, dt), group)
        same(out, torch.cat([inp(i, 5, dt) for i in range(n)]), f"{tag} all_gather_into_tensor {dt}")
    outs = [[torch.zeros(3), torch.zeros(2, 2)] for _ in range(n)]
    dist.all_gather_coalesced(outs, [inp(r, 3, torch.float32), inp(r, 4, torch.float32, 5).view(2, 2)], group=group)
    for i in range(n):
        same(outs[i][0], inp(i, 3, torch.float32), f"{tag} all_gather_coalesced 0 from {i}")
        same(outs[i][1], inp(i, 4, torch.float32, 5).view(2, 2), f"{tag} all_gather_coalesced 1 from {i}")
    # reduce_scatter (list) and from one tensor
    for dt, op in [(torch.float32, "sum"), (torch.int32, "max"), (torch.float64, "avg"), (torch.complex128, "sum")]:
        out = torch.zeros(4, dtype=dt)
        dist.reduce_scatter(out, [inp(r, 4, dt, 10 * j) for j in range(n)], op=OPS[op], group=group)
        same(out, reduce_expect([inp(i, 4, dt, 10 * r) for i in range(n)], op), f"{tag} reduce_scatter {dt} {op}")
        out = torch.zeros(3, dtype=dt)
        reduce_scatter_base(out, inp(r, 3 * n, dt), group, OPS[op])
        full = reduce_expect([inp(i, 3 * n, dt) for i in range(n)], op)
        same(out, full[3 * r:3 * r + 3], f"{tag} reduce_scatter_tensor {dt} {op}")
    # the coalesced single-tensor forms (torch 2.x only: funcol, hence DTensor, calls them):
    # mixed dtypes, a non-contiguous output, an empty pair, AVG
    if hasattr(pg, "reduce_scatter_tensor_coalesced") and int(torch.__version__.split(".")[0]) >= 2:
        kinds = [(5, torch.float32), (3, torch.int64), (0, torch.float32), (4, torch.complex64)]
        base = torch.zeros(n * 6, 2)
        outs = [torch.zeros(n * k, dtype=dt) for k, dt in kinds]
        outs[0] = base[:n * 5, 0]
        pg.allgather_into_tensor_coalesced(outs, [inp(r, k, dt, j) for j, (k, dt) in enumerate(kinds)]).wait()
        for j, (k, dt) in enumerate(kinds):
            same(outs[j], torch.cat([inp(i, k, dt, j) for i in range(n)]),
                 f"{tag} allgather_into_tensor_coalesced {j} ({dt}, {k})")
        same(base[:, 1], torch.zeros(n * 6), f"{tag} allgather_into_tensor_coalesced: the rest untouched")
        for op in ("sum", "avg"):
            use = [j for j, (k, dt) in enumerate(kinds) if op == "sum" or dt != torch.int64]
            outs = [torch.zeros(kinds[j][0], dtype=kinds[j][1]) for j in use]
            opts = dist.ReduceScatterOptions()
            opts.reduceOp = OPS[op]
            pg.reduce_scatter_tensor_coalesced(
                outs, [inp(r, n * kinds[j][0], kinds[j][1], j) for j in use], opts).wait()
            for o, j in zip(outs, use):
                k, dt = kinds[j]
                full = reduce_expect([inp(i, n * k, dt, j) for i in range(n)], op)
                same(o, full[k * r:k * r + k], f"{tag} reduce_scatter_tensor_coalesced {op} {j} ({dt}, {k})")
    # gather and scatter, root 0 and the last
    for root in sorted({0, n - 1}):
        for dt in [torch.float32, torch.uint8, torch.bool]:
            outs = [torch.zeros(4, dtype=dt) for _ in range(n)] if r == root else None
            dist.gather(inp(r, 4, dt), gather_list=outs, dst=ranks[root], group=group)
            if r == root:
                for i in range(n):
                    same(outs[i], inp(i, 4, dt), f"{tag} gather {dt} root {root} from {i}")
            out = torch.zeros(4, dtype=dt)
            ins = [inp(j, 4, dt, 7) for j in range(n)] if r == root else None
            dist.scatter(out, scatter_list=ins, src=ranks[root], group=group)
            same(out, inp(r, 4, dt, 7), f"{tag} scatter {dt} root {root}")
    # all_to_all: block j of rank r holds (r+j+1) elements tagged (r, j)
    def block(src, dst, dt=torch.float32):
        return torch.full((src + dst + 1,), 100 * src + dst, dtype=dt)
    outs = [torch.zeros(i + r + 1) for i in range(n)]
    dist.all_to_all(outs, [block(r, j) for j in range(n)], group=group)
    for i in range(n):
        same(outs[i], block(i, r), f"{tag} all_to_all from {i}")
    for dt in [torch.float32, torch.int64, torch.bfloat16]:
        out = torch.zeros(2 * n, 3, dtype=dt)
        inx = torch.stack([torch.full((3,), 100 * r + j // 2, dtype=dt) for j in range(2 * n)])
        dist.all_to_all_single(out, inx, group=group)
        want = torch.stack([torch.full((3,), 100 * (j // 2) + r, dtype=dt) for j in range(2 * n)])
        same(out, want, f"{tag} all_to_all_single {dt}")
    insz = [r + j + 1 for j in range(n)]
    outsz = [i + r + 1 for i in range(n)]
    out = torch.zeros(sum(outsz), 2)
    inx = torch.cat([block(r, j).repeat_interleave(2).view(-1, 2) for j in range(n)])
    dist.all_to_all_single(out, inx, output_split_sizes=outsz, input_split_sizes=insz, group=group)
    same(out, torch.cat([block(i, r).repeat_interleave(2).view(-1, 2) for i in range(n)]), f"{tag} all_to_all_single splits")
    # send / recv round a ring (even ranks send first), and isend/irecv
    if n > 1:
        nxt, prv = ranks[(r + 1) % n], ranks[(r - 1) % n]
        got = torch.zeros(5, dtype=torch.int64)
        if r % 2 == 0:
            dist.send(inp(r, 5, torch.int64), dst=nxt, group=group)
            dist.recv(got, src=prv, group=group)
        else:
            dist.recv(got, src=prv, group=group)
            dist.send(inp(r, 5, torch.int64), dst=nxt, group=group)
        same(got, inp((r - 1) % n, 5, torch.int64), f"{tag} send/recv")
        got = torch.zeros(4)
        reqs = [dist.isend(inp(r, 4, torch.float32), dst=nxt, group=group),
                dist.irecv(got, src=prv, group=group)]
        for q in reqs:
            q.wait()
        same(got, inp((r - 1) % n, 4, torch.float32), f"{tag} isend/irecv")
    # torch 2.x: batch_isend_irecv coalesces (one libcoll group), so 8 MB sends to both
    # neighbours at once, which cross, cannot deadlock; a non-contiguous receive.  Then a
    # region of _coalescing_manager with an all_reduce and a send/recv pair: an operation
    # waited for inside its region raises, after it completes with the region
    if n > 1 and int(torch.__version__.split(".")[0]) >= 2:
        big = 1 << 21
        a, b = torch.zeros(big), torch.zeros(2 * big)[::2]
        ops = [dist.P2POp(dist.isend, torch.full((big,), float(r)), nxt, group),
               dist.P2POp(dist.isend, torch.full((big,), r + 0.5), prv, group),
               dist.P2POp(dist.irecv, a, prv, group), dist.P2POp(dist.irecv, b, nxt, group)]
        for q in dist.batch_isend_irecv(ops):
            q.wait()
        same(a, torch.full((big,), float((r - 1) % n)), f"{tag} batch_isend_irecv from the previous rank")
        same(b, torch.full((big,), (r + 1) % n + 0.5), f"{tag} batch_isend_irecv from the next rank (non-contiguous)")
        x, got = inp(r, 6, torch.float32), torch.zeros(3)
        with dist._coalescing_manager(group=group, device=torch.device("cpu"), async_ops=True) as cm:
            dist.all_reduce(x, group=group, async_op=True)
            ws = dist.isend(inp(r, 3, torch.float32, 9), dst=nxt, group=group)
            wr = dist.irecv(got, src=prv, group=group)
            expect_raise(wr.wait, ["inside its coalescing region"], f"{tag} wait inside a coalescing region")
        cm.wait()
        ws.wait()
        wr.wait()
        same(x, reduce_expect([inp(i, 6, torch.float32) for i in range(n)], "sum"), f"{tag} all_reduce in a coalescing region")
        same(got, inp((r - 1) % n, 3, torch.float32, 9), f"{tag} send/recv in a coalescing region")
    dist.barrier(group=group)


def run_async(group, ranks):
    n = len(ranks)
    r = ranks.index(dist.get_rank())
    works, ts, futs = [], [], []
    for k in range(6):
        t = inp(r, 1000 + k, torch.float32, k)
        w = dist.all_reduce(t, async_op=True, group=group)
        works.append(w)
        ts.append(t)
        futs.append(w.get_future().then(lambda f: f.value()[0] * 2))
    for k in reversed(range(6)):  # in any order
        works[k].wait()
        want = reduce_expect([inp(i, 1000 + k, torch.float32, k) for i in range(n)], "sum")
        same(ts[k], want, f"async all_reduce {k}")
        if not works[k].is_completed():
            fail(f"async all_reduce {k}: is_completed() is False after wait()")
        same(futs[k].wait(), 2 * want, f"async future.then {k}")
    # a future nobody waits on through the Work completes by itself
    out = torch.zeros(n * 3)
    w = dist.all_gather_into_tensor(out, inp(r, 3, torch.float32), group=group, async_op=True) \
        if hasattr(dist, "all_gather_into_tensor") else dist._all_gather_base(out, inp(r, 3, torch.float32), group=group, async_op=True)
    v = w.get_future().wait()
    same(v[0], torch.cat([inp(i, 3, torch.float32) for i in range(n)]), "async all_gather future value")
    if not w.is_completed():
        fail("is_completed() is False once the future completed")
    b = dist.barrier(group=group, async_op=True)
    b.wait()


def run_wait_timeout(rank, store_dir):
    """Work.wait(timeout): a receive whose message is not sent yet times out with the
    backend's sentence and stays usable; rank 1 sends only once rank 0 said it timed out
    (through a store, no sleep), and a second wait with a timeout then gets the data."""
    from datetime import timedelta
    store = dist.FileStore(f"{store_dir}/wait-timeout", N)
    if rank == 0:
        t = torch.zeros(4)
        w = dist.irecv(t, src=1)
        expect_raise(lambda: w.wait(timeout=timedelta(milliseconds=100)),
                     ["libcoll recv", "did not finish within 100 ms"], "Work.wait(100 ms) on a receive not sent yet")
        store.set("timed-out", "1")
        w.wait(timeout=timedelta(seconds=30))
        same(t, torch.arange(4.0), "the receive after its timed-out wait")
    elif rank == 1:
        store.wait(["timed-out"])
        dist.send(torch.arange(4.0), dst=0)
    dist.barrier()


def expect_raise(fn, words, what):
    global checks
    try:
        fn()
    except RuntimeError as e:
        for w in words:
            if w not in str(e):
                fail(f"{what}: the exception {str(e)!r} does not say {w!r}")
        print(f"rank {dist.get_rank()}: {what} raised: {e}", flush=True)
        checks += 1
        return
    fail(f"{what}: no exception")


def rank_main(rank, store_dir):
    os.environ.setdefault("COLL_TIMEOUT_MS", "60000")
    import libcoll_torch  # noqa: F401  registers "libcoll"
    dist.init_process_group("libcoll", init_method=f"file://{store_dir}/store", rank=rank,
                            world_size=N, timeout=__import__("datetime").timedelta(seconds=60))
    if dist.get_backend() != "libcoll":
        fail(f"backend is {dist.get_backend()}")
    sub_ranks = list(range(1, N)) if N > 2 else [1]
    sub = dist.new_group(sub_ranks)
    if MODE == "ops":
        # the blocking calls of these four go through the binding's wrappers (its direct
        # path), so the blocking checks below exercise it and the async ones the Work path
        global checks
        for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                     "all_to_all_single"):
            if getattr(dist, name) is not getattr(libcoll_torch, name):
                fail(f"dist.{name} is not libcoll_torch's blocking wrapper")
            checks += 1
        run_ops(dist.group.WORLD, list(range(N)), f"N={N}")
        if rank in sub_ranks:
            run_ops(sub, sub_ranks, f"subgroup {sub_ranks}")
        dist.barrier()
    elif MODE == "async":
        run_async(dist.group.WORLD, list(range(N)))
        if rank in sub_ranks:
            run_async(sub, sub_ranks)
        run_wait_timeout(rank, store_dir)
    elif MODE == "badop":
        t = torch.ones(4, dtype=torch.int32)
        expect_raise(lambda: dist.all_reduce(t, op=dist.ReduceOp.BAND),
                     ["libcoll all_reduce", "ReduceOp.BAND is not supported by the libcoll backend"], "BAND")
        expect_raise(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)),
                     ["libcoll cannot reduce", "Short"], "int16 all_reduce")
        expect_raise(lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool), op=dist.ReduceOp.AVG),
                     ["ReduceOp.AVG is not supported by the libcoll backend on bool"], "bool AVG")
        # libcoll's own refusal (a peer that is no rank of the group): its sentence
        expect_raise(lambda: dist.send(torch.ones(2), dst=N + 5), ["libcoll send", "peer"], "send to rank N+5")
        t = torch.full((3,), float(rank))
        dist.all_reduce(t)  # the group still works after refusals
        same(t, torch.full((3,), float(sum(range(N)))), "all_reduce after refusals")
    elif MODE == "drop":
        # Works and tensors dropped by Python at once, then destroy_process_group() (which
        # holds the GIL): the completion thread frees those tensors under the GIL, so the
        # destroy must let go of it while it waits for that thread (this hung before).
        for _ in range(20):
            dist.all_reduce(torch.ones(1 << 16), async_op=True)
        dist.destroy_process_group()
        return
    elif MODE == "kill":
        t = torch.ones(1 << 16)
        dist.all_reduce(t)
        if rank == N - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.monotonic()
        expect_raise(lambda: [dist.all_reduce(t) for _ in range(100)], ["libcoll all_reduce failed"],
                     "all_reduce with a dead rank")
        dt = time.monotonic() - t0
        print(f"rank {rank}: raised after {dt:.2f} s", flush=True)
        if dt > 10:
            fail(f"the dead rank was noticed after {dt:.1f} s")
        # no survivor leaves before every survivor raised: one leaving early would be a
        # second dead peer for the others (and their sentence would name it)
        store = dist.FileStore(f"{store_dir}/kill", N - 1)
        store.set(f"raised-{rank}", "1")
        store.wait([f"raised-{i}" for i in range(N - 1)])
        os._exit(0)  # the group cannot be destroyed cleanly without the dead rank
    dist.destroy_process_group()


def main():
    store_dir = tempfile.mkdtemp(prefix="coll-torch-")
    pids = {}
    for rank in range(N):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                rank_main(rank, store_dir)
                print(f"rank {rank}: {checks} checks passed", flush=True)
            except BaseException as e:  # report, then leave without running atexit hooks
                import traceback
                traceback.print_exc()
                print(f"rank {rank}: FAILED: {e}", flush=True)
                code = 1
            sys.stdout.flush()
            os._exit(code)
        pids[pid] = rank

    def on_alarm(*_):
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        print(f"torch_check {MODE} {N}: timed out after {TIMEOUT} s: ranks killed", flush=True)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TIMEOUT)
    bad = []
    while pids:
        pid, st = os.wait()
        rank = pids.pop(pid, None)
        if rank is None:
            continue
        code = os.waitstatus_to_exitcode(st)
        dead_ok = MODE == "kill" and rank == N - 1 and code == -signal.SIGKILL
        if code != 0 and not dead_ok:
            bad.append(f"rank {rank} exited {code}")
    signal.alarm(0)
    for f in os.listdir(store_dir):
        os.unlink(os.path.join(store_dir, f))
    os.rmdir(store_dir)
    if bad:
        print(f"torch_check {MODE} {N}: FAILED: {', '.join(bad)}", flush=True)
        sys.exit(1)
    print(f"torch_check {MODE} {N}: OK", flush=True)


if __name__ == "__main__":
    main()
