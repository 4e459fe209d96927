/* direct.c — large collectives on one host by reading peers' buffers in place.
 *
 * The ring moves every byte through a FIFO slot: the sender copies it in, the receiver
 * copies it out.  On one host a rank can instead read a peer's user buffer directly
 * with process_vm_readv (one kernel copy, no slot), so each byte is copied once:
 *
 *   1. every rank publishes the addresses of its send and receive buffers (a one-shot
 *      all-gather of 16 bytes through the mailboxes, oneshot.c);
 *   2. reduce-scatter: rank r reads block r of every peer's send buffer, piece by piece
 *      into a cache-sized scratch, and reduces in rank order into its own block r
 *      (all-reduce divides there for AVG);
 *   3. a one-shot barrier: every block is final before anyone reads it;
 *   4. all-gather: rank r reads every peer's finished block straight into its receive
 *      buffer;
 *   5. a one-shot barrier: nobody returns (and lets its caller reuse the buffers) while a
 *      peer may still be reading them.
 * All-gather is steps 1, 4 (from send buffers), 5; reduce-scatter 1, 2, 5; broadcast
 * 1, non-roots read the root's buffer, 5; all-to-all 1, then rank r reads block r of
 * every peer's send buffer straight into block p of its receive buffer, 5.  All-to-allv
 * publishes the address of its displacement array too, and reads each peer's
 * sdispls[r] (8 bytes) before that peer's block.  An all-to-all that any rank called in
 * place cannot run here (a peer would read a block its owner is overwriting): the
 * exchange carries an in-place flag, and when any rank set it every rank returns
 * without running, and the executor takes the pairwise schedule.
 *
 * Cost (p ranks, n bytes, β_cma per byte read from a peer, γ per byte reduced, α_mb one
 * one-shot exchange):
 *   all-reduce      3·α_mb + 2(p-1)/p·n·β_cma + (p-1)/p·n·γ
 *   all-gather      2·α_mb + (p-1)/p·n·β_cma
 *   reduce-scatter  2·α_mb + (p-1)/p·n·(β_cma + γ)
 *   broadcast       2·α_mb + (p-1)·n·β_cma
 *   all-to-all      2·α_mb + (p-1)·α_cma + (p-1)/p·n·β_cma      (n = one rank's buffer)
 *   all-to-allv     2·α_mb + 2(p-1)·α_cma + (p-1)/p·n·β_cma     (not priced: no common n)
 * the ring's (pairwise's) byte terms with β_cma (one copy) in place of β (two copies
 * through a slot).  Broadcast's p-1 readers all read the root's buffer, and the kernel
 * walks its page tables under one lock per 2 MiB of addresses: their reads take turns
 * (3 ranks, 1 MiB: 17 % of the samples spin in __pte_offset_map_lock, and the call takes
 * 226-261 µs against one reader's 68-81), hence (p-1)·n, not n.  The other collectives
 * read different peers at once.
 *
 * Usable only when every rank is on this host and the kernel lets ranks read each other
 * (same user, ptrace permission): tune.c probes that once at creation and all ranks
 * agree, since a rank that could not read would leave the others waiting.
 *
 * Must never: read a block before its owner said it is final, return while a peer may
 * still read this rank's buffers, or touch a user buffer outside the call's ranges.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "algo.h"
#include "reduce.h"

#define PIECE COLL_DIRECT_PIECE

typedef struct {
  uint64_t send, recv; /* addresses in the owner's address space */
  uint64_t sdispls;    /* all_to_allv: the owner's sdispls array */
  uint64_t in_place;   /* all_to_all: the owner called it in place */
} addr_pair;

/* Copies `len` bytes at `addr` in rank p's memory to `dst`. */
static coll_result read_peer(struct coll_comm *comm, const coll_work *w, int p, void *dst,
                             uint64_t addr, size_t len) {
  uint8_t *d = dst;
  while (len) {
    struct iovec local = {.iov_base = d, .iov_len = len};
    struct iovec remote = {.iov_base = (void *)(uintptr_t)addr, .iov_len = len};
    ssize_t got = process_vm_readv(comm->pids[p], &local, 1, &remote, 1, 0);
    if (got <= 0) {
      int e = got < 0 ? errno : EIO;
      if (e == EINTR) continue;
      /* No such process: the peer is gone; say so the way every other path does. */
      if (e == ESRCH)
        return coll_fail(comm, COLL_ERR_REMOTE,
                         "rank %d: lost rank %d (pid %d is gone): "
                         "%s #%llu cannot complete (reading %zu bytes of its buffer failed: %s)",
                         comm->rank, p, (int)comm->pids[p], coll_coll_name(w->coll),
                         (unsigned long long)w->seq, len, strerror(e));
      return coll_fail(comm, COLL_ERR_SYSTEM,
                       "rank %d: reading %zu bytes of rank %d's buffer (pid %d) in %s #%llu "
                       "failed: %s",
                       comm->rank, len, p, (int)comm->pids[p], coll_coll_name(w->coll),
                       (unsigned long long)w->seq, strerror(e));
    }
    d += got, addr += (uint64_t)got, len -= (size_t)got;
  }
  return COLL_OK;
}

/* read_peer for the call's data (not its addresses): what it read from each peer is
 * counted, for the trace (the bytes this rank received, as a ring's steps count them). */
static coll_result read_data(struct coll_comm *comm, const coll_work *w, int p, void *dst,
                             uint64_t addr, size_t len) {
  coll_result r = read_peer(comm, w, p, dst, addr, len);
  if (r == COLL_OK && comm->direct_got) comm->direct_got[p] += len;
  return r;
}

static coll_result barrier(struct coll_comm *comm, const coll_work *w) {
  coll_work b = {.coll = COLL_COLL_BARRIER, .dtype = COLL_UINT8, .seq = w->seq, .inner = true};
  return coll_oneshot_run(comm, &b);
}

/* out[0..cnt) = reduction over ranks, in rank order, of their elements
 * [off, off+cnt) of the send buffers (own from `mine`). */
static coll_result reduce_block(struct coll_comm *comm, const coll_work *w, const addr_pair *ap,
                                const uint8_t *mine, size_t off, size_t cnt, uint8_t *out) {
  int n = comm->nranks, me = comm->rank;
  size_t es = coll_elem_bytes(w->dtype), per = PIECE / es;
  uint8_t *s0 = comm->direct_scratch, *s1 = s0 + PIECE, *own = s1 + PIECE;
  coll_result r;
  for (size_t done = 0; done < cnt; done += per) {
    size_t k = cnt - done < per ? cnt - done : per, bytes = k * es;
    size_t at = (off + done) * es;
    uint8_t *o = out + done * es;
    /* In place, `o` is this rank's own input: keep a copy before it is overwritten. */
    const uint8_t *my = mine + at;
    if (o == my) {
      memcpy(own, my, bytes);
      my = own;
    }
    const uint8_t *a, *b;
    if (me == 0)
      a = my;
    else if ((r = read_data(comm, w, 0, s0, ap[0].send + at, bytes)) != COLL_OK)
      return r;
    else
      a = s0;
    if (me == 1)
      b = my;
    else if ((r = read_data(comm, w, 1, s1, ap[1].send + at, bytes)) != COLL_OK)
      return r;
    else
      b = s1;
    coll_kernel_reduce(o, a, b, k, w->dtype, w->op);
    for (int p = 2; p < n; p++) {
      if (p == me) {
        b = my;
      } else {
        if ((r = read_data(comm, w, p, s1, ap[p].send + at, bytes)) != COLL_OK) return r;
        b = s1;
      }
      coll_kernel_reduce(o, o, b, k, w->dtype, w->op);
    }
    if (w->op == COLL_AVG) coll_kernel_avg(o, k, w->dtype, n);
  }
  return COLL_OK;
}

/* All-to-all(v): block `me` of every peer's send buffer into this rank's blocks. */
static coll_result all_to_all(struct coll_comm *comm, const coll_work *w, const addr_pair *ap) {
  int n = comm->nranks, me = comm->rank;
  size_t es = coll_elem_bytes(w->dtype);
  const uint8_t *src = w->sendbuf;
  uint8_t *dst = w->recvbuf;
  bool v = w->coll == COLL_COLL_ALL_TO_ALLV;
  coll_result r;
  for (int i = 1; i < n; i++) { /* staggered: rank r starts with r+1, nobody is read by all */
    int p = (me + i) % n;
    size_t cnt = v ? w->recvcounts[p] : w->count, at = v ? w->rdispls[p] : (size_t)p * w->count;
    uint64_t from = ap[p].send + (uint64_t)me * w->count * es;
    if (cnt == 0) continue;
    if (v) {
      uint64_t disp = 0;
      if ((r = read_peer(comm, w, p, &disp, ap[p].sdispls + (uint64_t)me * sizeof(size_t),
                         sizeof disp)) != COLL_OK)
        return r;
      from = ap[p].send + disp * es;
    }
    if ((r = read_data(comm, w, p, dst + at * es, from, cnt * es)) != COLL_OK) return r;
  }
  size_t cnt = v ? w->sendcounts[me] : w->count;
  const uint8_t *mine = src + (v ? w->sdispls[me] : (size_t)me * w->count) * es;
  uint8_t *out = dst + (v ? w->rdispls[me] : (size_t)me * w->count) * es;
  if (cnt && out != mine) memcpy(out, mine, cnt * es);
  return COLL_OK;
}

static coll_result run_call(struct coll_comm *comm, const coll_work *w, addr_pair *ap, bool *ran) {
  int n = comm->nranks, me = comm->rank;
  size_t es = coll_elem_bytes(w->dtype);
  const uint8_t *src = w->sendbuf;
  uint8_t *dst = w->recvbuf;
  coll_result r;
  addr_pair mine = {.send = (uint64_t)(uintptr_t)src,
                    .recv = (uint64_t)(uintptr_t)dst,
                    .sdispls = (uint64_t)(uintptr_t)w->sdispls,
                    .in_place = w->coll == COLL_COLL_ALL_TO_ALL && src == dst};
  coll_work ex = {.coll = COLL_COLL_ALL_GATHER,
                  .sendbuf = &mine,
                  .recvbuf = ap,
                  .count = sizeof mine,
                  .dtype = COLL_UINT8,
                  .seq = w->seq,
                  .inner = true};
  if ((r = coll_oneshot_run(comm, &ex)) != COLL_OK) return r;
  for (int p = 0; p < n; p++)
    if (ap[p].in_place) {
      *ran = false; /* every rank saw the same flags: all take the schedule */
      return COLL_OK;
    }

  switch (w->coll) {
  case COLL_COLL_ALL_TO_ALL:
  case COLL_COLL_ALL_TO_ALLV:
    if ((r = all_to_all(comm, w, ap)) != COLL_OK) return r;
    break;
  case COLL_COLL_ALL_REDUCE: {
    size_t off, cnt;
    coll_ring_chunk(w->count, n, me, &off, &cnt);
    if ((r = reduce_block(comm, w, ap, src, off, cnt, dst + off * es)) != COLL_OK) return r;
    if ((r = barrier(comm, w)) != COLL_OK) return r;
    for (int i = 1; i < n; i++) {
      int p = (me + i) % n;
      coll_ring_chunk(w->count, n, p, &off, &cnt);
      if (cnt &&
          (r = read_data(comm, w, p, dst + off * es, ap[p].recv + off * es, cnt * es)) != COLL_OK)
        return r;
    }
    break;
  }
  case COLL_COLL_REDUCE_SCATTER:
    if ((r = reduce_block(comm, w, ap, src, (size_t)me * w->count, w->count, dst)) != COLL_OK)
      return r;
    break;
  case COLL_COLL_ALL_GATHER: {
    size_t bytes = w->count * es;
    for (int i = 1; i < n; i++) {
      int p = (me + i) % n;
      if (bytes &&
          (r = read_data(comm, w, p, dst + (size_t)p * bytes, ap[p].send, bytes)) != COLL_OK)
        return r;
    }
    if (dst + (size_t)me * bytes != src) memcpy(dst + (size_t)me * bytes, src, bytes);
    break;
  }
  case COLL_COLL_BROADCAST: {
    size_t bytes = w->count * es;
    if (me == w->root) {
      if (dst != src) memcpy(dst, src, bytes);
    } else if ((r = read_data(comm, w, w->root, dst, ap[w->root].send, bytes)) != COLL_OK) {
      return r;
    }
    break;
  }
  default:
    return coll_fail(comm, COLL_ERR_INTERNAL, "direct path asked to run %s",
                     coll_coll_name(w->coll));
  }
  return barrier(comm, w);
}

bool coll_direct_serves(struct coll_comm *comm, coll_coll_kind c) {
  if (!comm->direct_ok) return false;
  return c == COLL_COLL_ALL_REDUCE || c == COLL_COLL_REDUCE_SCATTER || c == COLL_COLL_ALL_GATHER ||
         c == COLL_COLL_BROADCAST || c == COLL_COLL_ALL_TO_ALL || c == COLL_COLL_ALL_TO_ALLV;
}

/* For the trace: one "recv" step per peer this rank read from, with the bytes it read
 * (all timed as the whole call).  A pull moves nothing out: a peer's reads of this
 * rank's buffers are that peer's steps. */
static void record(struct coll_comm *comm, const coll_work *w, uint64_t t_start, uint64_t t_end) {
  size_t es = coll_elem_bytes(w->dtype), ns = 0;
  coll_step *st = comm->steps;
  uint64_t *t0 = comm->exec_ops->trace_t0(comm), *t1 = comm->exec_ops->trace_t1(comm);
  for (int p = 0; p < comm->nranks && ns < coll_plan_max_steps(comm->nranks); p++) {
    if (!comm->direct_got[p]) continue;
    st[ns] = (coll_step){.kind = COLL_STEP_RECV,
                         .peer_in = p,
                         .peer_out = -1,
                         .count = comm->direct_got[p] / es,
                         .chunk = p};
    t0[ns] = t_start, t1[ns] = t_end;
    ns++;
  }
  comm->exec_ops->trace_record(comm, w, COLL_ALGO_DIRECT, st, ns, es, t_start, t_end);
}

coll_result coll_direct_run(struct coll_comm *comm, const coll_work *w, bool *ran) {
  uint64_t t0 = 0;
  if (comm->exec_ops->trace_on(comm) && !w->internal) {
    if (!comm->direct_got) comm->direct_got = calloc((size_t)comm->nranks, sizeof(uint64_t));
    if (comm->direct_got) {
      memset(comm->direct_got, 0, (size_t)comm->nranks * sizeof(uint64_t));
      t0 = coll_now_ns();
    }
  }
  *ran = true;
  coll_result r = run_call(comm, w, comm->direct_addrs, ran);
  if (t0 && r == COLL_OK && *ran) record(comm, w, t0, coll_now_ns());
  if (comm->direct_got && !t0) {
    free(comm->direct_got); /* tracing went off: count nothing from here on */
    comm->direct_got = NULL;
  }
  return r;
}

/* Can every rank read its neighbour's memory?  Each reads a word the next rank
 * published; all ranks learn the answer (an all-reduce of the flags), so they agree.
 * Then ranks 0 and 1 time reading 1 MiB: β_cma. */
coll_result coll_direct_probe(struct coll_comm *comm, double *beta_cma, double *alpha_cma) {
  int n = comm->nranks, me = comm->rank, next = (me + 1) % n;
  comm->direct_ok = false;
  *beta_cma = *alpha_cma = 0;
  if (!comm->mailboxes || n < 2) return COLL_OK;
  static const uint64_t magic = 0x636f6c6c64697265ull;
  uint64_t word = magic, got = 0;
  uint64_t *addrs = calloc((size_t)n, sizeof *addrs);
  if (!addrs) return coll_fail(comm, COLL_ERR_SYSTEM, "out of memory probing direct reads");
  uint64_t at = (uint64_t)(uintptr_t)&word;
  coll_result r = comm->exec_ops->bytes(comm, COLL_COLL_ALL_GATHER, &at, addrs, sizeof at, COLL_SUM,
                                        0);
  uint8_t ok = 0;
  if (r == COLL_OK) {
    struct iovec local = {.iov_base = &got, .iov_len = sizeof got};
    struct iovec remote = {.iov_base = (void *)(uintptr_t)addrs[next], .iov_len = sizeof got};
    ok = process_vm_readv(comm->pids[next], &local, 1, &remote, 1, 0) == (ssize_t)sizeof got &&
         got == magic;
    if (!ok)
      COLL_INFO(me,
                "direct reads of rank %d's memory are not allowed here (%s): large "
                "collectives use the FIFO schedules",
                next, strerror(errno));
  }
  free(addrs);
  if (r != COLL_OK) return r;
  /* All ranks agree: the smallest flag wins (and `word` stays alive until then). */
  if ((r = comm->exec_ops->bytes(comm, COLL_COLL_ALL_REDUCE, &ok, &ok, 1, COLL_MIN, 0)) != COLL_OK)
    return r;
  if (!ok) return COLL_OK;
  comm->direct_scratch = malloc(3 * (size_t)PIECE);
  comm->direct_addrs = calloc((size_t)n, sizeof(addr_pair));
  if (!comm->direct_scratch || !comm->direct_addrs)
    return coll_fail(comm, COLL_ERR_SYSTEM, "out of memory for the direct path's scratch");
  memset(comm->direct_scratch, 0, 3 * (size_t)PIECE); /* touched now, not on the hot path */
  comm->direct_ok = true;

  /* β_cma: rank 0 reads rank 1's 1 MiB five times; the fastest counts (rank 0's figure
   * is what tune.c broadcasts). */
  enum { BIG = 1 << 20 };
  uint8_t *big = me <= 1 ? malloc(BIG) : NULL;
  if (me <= 1 && !big) return coll_fail(comm, COLL_ERR_SYSTEM, "out of memory probing");
  if (big) memset(big, me, BIG);
  uint64_t where = (uint64_t)(uintptr_t)big;
  r = comm->exec_ops->bytes(comm, COLL_COLL_BROADCAST, &where, &where, sizeof where, COLL_SUM, 1);
  if (r == COLL_OK && me == 0) {
    double best = 1e9;
    coll_work dw = {.coll = COLL_COLL_ALL_REDUCE};
    for (int i = 0; i < 5 && r == COLL_OK; i++) {
      uint64_t t0 = coll_now_ns();
      r = read_peer(comm, &dw, 1, big, where, BIG);
      double t = (double)(coll_now_ns() - t0) * 1e-9;
      if (i > 0 && t < best) best = t; /* the first read pins fresh pages */
    }
    /* α_cma: the same read of 8 bytes (the system call and one page's pinning). */
    double small = 1e9;
    for (int i = 0; i < 50 && r == COLL_OK; i++) {
      uint64_t t0 = coll_now_ns();
      r = read_peer(comm, &dw, 1, big, where, 8);
      double t = (double)(coll_now_ns() - t0) * 1e-9;
      if (t < small) small = t;
    }
    *alpha_cma = small;
    *beta_cma = best > small ? (best - small) / BIG : best / BIG;
  }
  /* then free */
  coll_result r2 = comm->exec_ops->bytes(comm, COLL_COLL_BARRIER, NULL, NULL, 0, COLL_SUM, 0);
  free(big);
  return r != COLL_OK ? r : r2;
}

/* ---- the row in the algorithm table (algo.h) ----------------------------------------- */

bool coll_direct_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es) {
  (void)count, (void)es;
  return coll_direct_serves(comm, c);
}

/* All-to-all moves no byte twice here (pairwise copies each into a slot and out), and
 * measured faster that way while the buffers stay in cache (2 ranks on 2 cores: 256 KiB
 * 14 us vs pairwise 60-231, 1 MiB 170-205 vs 417-968, 4 MiB equal); from 16 MiB
 * pairwise's streamed stores win (6.8-8.2 ms vs 8.1-13.4).  With more ranks than cores
 * too, on a quiet machine (4 ranks on 2 cores, 2026-11-24, medians of 3 interleaved
 * runs: 256 KiB 58 us vs 163, 1 MiB 157 vs 483, 4 MiB 1290 vs 1579, 16 MiB 7098 vs
 * 5545): a first measurement under load had pairwise ahead there, which kept direct
 * away from oversubscribed jobs and cost them 3x at 1 MiB.  So the tuner takes it for
 * all-to-all up to 4 MiB, at the formula's word (table.c: coll_handicap). */
#define A2A_DIRECT_MAX (4u << 20)
/* All-gather the same way, for the same reason: staged copies every block into a ring and
 * out again, direct once.  2 ranks on 2 cores (2026-11-30, two runs each, out / in place,
 * µs): 64 KiB 4.7-6.1 / 3.7-3.8 against staged's 9.5-9.9 / 4.5-5.5, 1 MiB 67-71 / 29-33
 * against 102-105 / 75, 16 MiB 1540-1559 / 891-963 against 1631-1662 / 1278-1355; but
 * 64 MiB 13.2-13.5 ms against 8.2 (the kernel pins 32 MiB of pages per read).  With more
 * ranks than cores it was no better (4 ranks on 2 cores: 256 KiB 42-98 against 41-53,
 * 16 MiB 2.8-4.2 ms against 2.9-3.0).  So up to 16 MiB, ranks with a core each, with the
 * handicap table.c gives for it. */
#define AG_DIRECT_MAX (16u << 20)
bool coll_direct_preferable(struct coll_comm *comm, coll_coll_kind c, double n) {
  if (c == COLL_COLL_ALL_GATHER) return !comm->oversubscribed && n <= AG_DIRECT_MAX;
  if (c != COLL_COLL_ALL_TO_ALL) return true;
  return n <= A2A_DIRECT_MAX;
}

/* The formulas at the top of this file, n = nccl-tests' size.  a: one one-shot exchange;
 * r: one process_vm_readv call (a system call, and the kernel pins the pages it reads);
 * pieces: reduce-scatter reads in COLL_DIRECT_PIECE. */
coll_result coll_direct_cost(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                             char *formula, size_t flen) {
  int p = m->p;
  double a = m->alpha_mb, r = m->alpha_cma, b = m->beta_cma, g = m->gamma;
  double f = (double)(p - 1) / p, s;
  double pieces = ceil(n / p / COLL_DIRECT_PIECE);
  if (pieces < 1) pieces = 1;
  switch (c) {
  case COLL_COLL_ALL_REDUCE:
    s = 3 * a + (p - 1) * (pieces + 1) * r + 2 * f * n * b + f * n * g;
    snprintf(formula, flen,
             "3*a_mb + (p-1)*(pieces+1)*a_cma + 2(p-1)/p*n*b_cma + (p-1)/p*n*g"
             " = %.3g us",
             s * 1e6);
    break;
  case COLL_COLL_REDUCE_SCATTER:
    s = 2 * a + (p - 1) * pieces * r + f * n * (b + g);
    snprintf(formula, flen, "2*a_mb + (p-1)*pieces*a_cma + (p-1)/p*n*(b_cma+g) = %.3g us", s * 1e6);
    break;
  case COLL_COLL_ALL_GATHER:
    s = 2 * a + (p - 1) * r + f * n * b;
    snprintf(formula, flen, "2*a_mb + (p-1)*a_cma + (p-1)/p*n*b_cma = %.3g us", s * 1e6);
    break;
  case COLL_COLL_BROADCAST: /* the p-1 readers of one buffer take turns (see above) */
    s = 2 * a + r + (p - 1) * n * b;
    snprintf(formula, flen, "2*a_mb + a_cma + (p-1)*n*b_cma = %.3g us", s * 1e6);
    break;
  case COLL_COLL_ALL_TO_ALL:
  case COLL_COLL_ALL_TO_ALLV: /* n: one rank's whole send buffer */
    s = 2 * a + (p - 1) * r + f * n * b;
    snprintf(formula, flen, "2*a_mb + (p-1)*a_cma + (p-1)/p*n*b_cma = %.3g us", s * 1e6);
    break;
  default: return COLL_ERR_INVALID_ARG;
  }
  *seconds = s;
  return COLL_OK;
}
