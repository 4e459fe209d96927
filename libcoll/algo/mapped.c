/* mapped.c — collectives on coll_mem_alloc memory, by loads and stores into peers' buffers.
 *
 * When every rank's buffers lie in windows (window.c), every rank has every other
 * rank's send and receive buffers mapped in its own address space, and nothing needs
 * to move through a FIFO: rank r takes block r of the data (coll_ring_chunk's split)
 * and does the whole job for it, writing the result straight into every rank's
 * receive buffer.
 *
 *   0. the ranks all-gather where their buffers are, (window slot, offset), through the
 *      one-shot mailboxes (oneshot.c); that is also the entry barrier: a peer's
 *      receive buffer is written only once the peer has handed it over by calling;
 *   1. rank r, piece by piece through a scratch the size of a few cache lines:
 *        all-reduce      reduce block r of every send buffer, in rank order, store it
 *                        into block r of every receive buffer;
 *        reduce-scatter  reduce block r of every send buffer into its own receive;
 *        reduce          as all-reduce, stored into the root's receive buffer only;
 *        all-gather      store its send buffer into slot r of every receive buffer;
 *        broadcast       store block r of the root's buffer into every receive buffer;
 *        all-to-all      load block r of every rank's send buffer into its own receive
 *                        buffer (rank p's into block p);
 *        gather          store its send buffer into block r of the root's receive buffer;
 *        scatter         load block r of the root's send buffer into its receive buffer;
 *   2. a one-shot barrier (after a store fence): no rank returns while a peer may still
 *      read its send buffer or write its receive buffer.
 *
 * Per rank, an all-reduce of n bytes reads n and writes n bytes (its block from p
 * senders, its block to p receivers) in one pass, against the ring's 2(p-1)/p·n bytes
 * through slots, each copied in and out.  When all ranks' buffers together outgrow the
 * caches the stores are non-temporal (copy.c): the lines are not read first, and they
 * are not left in this core's cache where the peer would have to fetch them from.
 *
 * Cost (p ranks, n bytes, α_mb one one-shot call, β_mem per byte streamed to memory,
 * γ per byte reduced):
 *   all-reduce      2·α_mb + n·β_mem + (p-1)/p·n·γ
 *   reduce-scatter  2·α_mb + n/p·β_mem + (p-1)/p·n·γ     (n = whole input)
 *   all-gather      2·α_mb + n·β_mem                     (n = whole output)
 *   broadcast       2·α_mb + n·β_mem
 *   all-to-all      2·α_mb + n·β_mem                     (n = one rank's whole buffer)
 *   gather, scatter 2·α_mb + n/p·β_mem                   (n = the root's whole buffer)
 * All-to-all that any rank calls in place is not run here (a rank would load a block its
 * owner is overwriting): every rank sees the in-place pair in the exchange and takes the
 * schedule; all-to-allv neither (its peers' displacements are not in windows).
 * Every element is reduced once, in rank order, by one rank, so every rank gets the
 * same bits, and a rerun too (not the ring's bits: its order differs).
 *
 * Why pieces of PIECE bytes: reducing a long run into scratch and then storing it
 * makes the core read for a while and then write for a while, and both phases leave
 * memory idle in one direction; short pieces keep reads and stores in flight together
 * (measured on 2 ranks, 64 MiB: 16 KiB pieces 7.6 GB/s busbw, 256 B pieces 13.4).
 *
 * Must never: write a peer's receive buffer before the peer entered the call, return
 * before every peer finished with this rank's buffers, or touch bytes outside the
 * call's ranges (in place, block r is read whole before it is written).
 */
#include <stdio.h>
#include <string.h>

#include "algo.h"
#include "reduce.h"

#define PIECE 512 /* bytes per reduced piece (see above) */

typedef coll_mapped_where where;

bool coll_mapped_serves(coll_coll_kind c) {
  return c == COLL_COLL_ALL_REDUCE || c == COLL_COLL_REDUCE_SCATTER || c == COLL_COLL_ALL_GATHER ||
         c == COLL_COLL_BROADCAST || c == COLL_COLL_REDUCE || c == COLL_COLL_ALL_TO_ALL ||
         c == COLL_COLL_GATHER || c == COLL_COLL_SCATTER;
}

/* Bytes of the send and receive ranges of this rank's call. */
static void ranges(const struct coll_comm *comm, const coll_work *w, size_t *sb, size_t *rb) {
  size_t b = w->count * coll_elem_bytes(w->dtype), p = (size_t)comm->nranks;
  *sb = *rb = b;
  if (w->coll == COLL_COLL_REDUCE_SCATTER || w->coll == COLL_COLL_SCATTER) *sb = b * p;
  if (w->coll == COLL_COLL_ALL_GATHER || w->coll == COLL_COLL_GATHER) *rb = b * p;
  if (w->coll == COLL_COLL_ALL_TO_ALL) *sb = *rb = b * p;
}

/* Does rank p's call need its send (receive) buffer here? */
static bool needs_send(const coll_work *w, int p) {
  return (w->coll != COLL_COLL_BROADCAST && w->coll != COLL_COLL_SCATTER) || p == w->root;
}
static bool needs_recv(const coll_work *w, int p) {
  return (w->coll != COLL_COLL_REDUCE && w->coll != COLL_COLL_GATHER) || p == w->root;
}

/* out[0..k) = op over ranks, in rank order, of in[q][0..k); via `scratch`, then stored
 * (streamed) into each of the `nout` destinations. */
static void reduce_piece(const struct coll_comm *comm, const coll_work *w, uint8_t *const *in,
                         size_t at, size_t k, uint8_t *scratch, uint8_t *const *out, int nout,
                         size_t out_at, bool nt) {
  int n = comm->nranks;
  size_t es = coll_elem_bytes(w->dtype);
  coll_kernel_reduce(scratch, in[0] + at, in[1] + at, k, w->dtype, w->op);
  for (int q = 2; q < n; q++) coll_kernel_reduce(scratch, scratch, in[q] + at, k, w->dtype, w->op);
  if (w->op == COLL_AVG) coll_kernel_avg(scratch, k, w->dtype, n);
  for (int q = 0; q < nout; q++) {
    if (nt)
      coll_copy_nt(out[q] + out_at, scratch, k * es);
    else
      memcpy(out[q] + out_at, scratch, k * es);
  }
}

/* Block [off, off+cnt) elements of every input, reduced, into every output at out_off. */
static void reduce_block(const struct coll_comm *comm, const coll_work *w, uint8_t *const *in,
                         size_t off, size_t cnt, uint8_t *const *out, int nout, size_t out_off,
                         bool nt) {
  size_t es = coll_elem_bytes(w->dtype), per = PIECE / es;
  uint8_t *scratch = comm->scratch; /* executor.c's slice scratch: idle during this call */
  for (size_t d = 0; d < cnt; d += per) {
    size_t k = cnt - d < per ? cnt - d : per;
    /* Ask for the inputs 8 KiB ahead: p streams from p processes' page tables are more
     * than the hardware prefetchers follow (2 ranks, 64 MiB: 9.7-10.2 -> 11.5-12.0 GB/s
     * busbw, medians of 5 interleaved runs; 16 KiB ahead the same). */
    if (d + 16 * per < cnt)
      for (int q = 0; q < comm->nranks; q++)
        for (size_t l = 0; l < PIECE; l += 64)
          __builtin_prefetch(in[q] + (off + d + 16 * per) * es + l, 0, 0);
    reduce_piece(comm, w, in, (off + d) * es, k, scratch, out, nout, (out_off + d) * es, nt);
  }
}

/* `bytes` at src into each destination (skipping one that is src itself), in pieces
 * that stay in cache so src is read from memory once. */
static void copy_out(const uint8_t *src, size_t bytes, uint8_t *const *out, int nout, bool nt) {
  enum { CHUNK = 64 << 10 };
  for (size_t d = 0; d < bytes; d += CHUNK) {
    size_t k = bytes - d < CHUNK ? bytes - d : CHUNK;
    for (int q = 0; q < nout; q++)
      if (out[q] + d == src + d)
        continue;
      else if (nt)
        coll_copy_nt(out[q] + d, src + d, k);
      else
        memcpy(out[q] + d, src + d, k);
  }
}

static coll_result run(struct coll_comm *comm, const coll_work *w, const where *at) {
  int n = comm->nranks, me = comm->rank;
  size_t es = coll_elem_bytes(w->dtype), sb, rb;
  ranges(comm, w, &sb, &rb);
  uint8_t *in[COLL_MAX_RANKS_MAPPED], *out[COLL_MAX_RANKS_MAPPED];
  pthread_mutex_lock(&comm->winmu);
  for (int p = 0; p < n; p++) {
    in[p] = needs_send(w, p)
                ? comm->hooks->window_peer(comm, at[p].send_slot, p, at[p].send_off, sb)
                : NULL;
    out[p] = needs_recv(w, p)
                 ? comm->hooks->window_peer(comm, at[p].recv_slot, p, at[p].recv_off, rb)
                 : NULL;
    if ((needs_send(w, p) && !in[p] && sb) || (needs_recv(w, p) && !out[p] && rb)) {
      pthread_mutex_unlock(&comm->winmu);
      return coll_fail(comm, COLL_ERR_INTERNAL,
                       "rank %d: rank %d's buffers of %s #%llu are "
                       "not inside its window",
                       me, p, coll_coll_name(w->coll), (unsigned long long)w->seq);
    }
  }
  pthread_mutex_unlock(&comm->winmu);
  /* Non-temporal stores only where the buffers of all ranks together outgrow the caches
   * (copy.c's threshold, COLL_NT_BYTES): below it the receive buffers would stay in
   * cache, and streaming them out made 512 KiB - 2 MiB all-reduces on 2 ranks 1.3x
   * slower than the ring; above it ordinary stores pay a read for ownership per line
   * (8 MiB on 2 ranks: 820 us against 340 us streamed). */
  bool nt = (size_t)n * (sb + rb) >= comm->nt_bytes;
  size_t off, cnt;
  switch (w->coll) {
  case COLL_COLL_ALL_REDUCE:
    coll_ring_chunk(w->count, n, me, &off, &cnt);
    reduce_block(comm, w, in, off, cnt, out, n, off, nt);
    break;
  case COLL_COLL_REDUCE:
    coll_ring_chunk(w->count, n, me, &off, &cnt);
    reduce_block(comm, w, in, off, cnt, &out[w->root], 1, off, nt);
    break;
  case COLL_COLL_REDUCE_SCATTER:
    reduce_block(comm, w, in, (size_t)me * w->count, w->count, &out[me], 1, 0, nt);
    break;
  case COLL_COLL_ALL_GATHER: {
    uint8_t *dst[COLL_MAX_RANKS_MAPPED];
    for (int p = 0; p < n; p++) dst[p] = out[p] + (size_t)me * sb;
    copy_out(in[me], sb, dst, n, nt);
    break;
  }
  case COLL_COLL_BROADCAST: {
    coll_ring_chunk(w->count, n, me, &off, &cnt);
    uint8_t *dst[COLL_MAX_RANKS_MAPPED];
    for (int p = 0; p < n; p++) dst[p] = out[p] + off * es;
    copy_out(in[w->root] + off * es, cnt * es, dst, n, nt);
    break;
  }
  case COLL_COLL_ALL_TO_ALL: { /* p's block `me` into block p, starting with the next rank */
    size_t blk = sb / (size_t)n;
    for (int i = 1; i <= n; i++) {
      int p = (me + i) % n;
      uint8_t *dst = out[me] + (size_t)p * blk;
      copy_out(in[p] + (size_t)me * blk, blk, &dst, 1, nt);
    }
    break;
  }
  case COLL_COLL_GATHER: {
    uint8_t *dst = out[w->root] + (size_t)me * sb;
    copy_out(in[me], sb, &dst, 1, nt); /* the root in place: skipped (dst == src) */
    break;
  }
  case COLL_COLL_SCATTER: copy_out(in[w->root] + (size_t)me * rb, rb, &out[me], 1, nt); break;
  default:
    return coll_fail(comm, COLL_ERR_INTERNAL, "mapped path asked to run %s",
                     coll_coll_name(w->coll));
  }
  if (nt) coll_copy_nt_fence(); /* the stores reach the peers before the barrier */
  coll_work b = {.coll = COLL_COLL_BARRIER, .dtype = COLL_UINT8, .seq = w->seq, .inner = true};
  return coll_oneshot_run(comm, &b);
}

coll_result coll_mapped_run(struct coll_comm *comm, const coll_work *w, bool *ran) {
  *ran = false;
  int n = comm->nranks;
  if (n > COLL_MAX_RANKS_MAPPED || !comm->mailboxes) return COLL_OK;
  size_t sb, rb;
  ranges(comm, w, &sb, &rb);
  where mine = {.send_slot = -1, .recv_slot = -1};
  pthread_mutex_lock(&comm->winmu); /* the user's thread may be allocating a window */
  if (needs_send(w, comm->rank) &&
      !comm->hooks->window_find(comm, w->sendbuf, sb, &mine.send_slot, &mine.send_off))
    mine.send_slot = -1;
  if (needs_recv(w, comm->rank) &&
      !comm->hooks->window_find(comm, w->recvbuf, rb, &mine.recv_slot, &mine.recv_off))
    mine.recv_slot = -1;
  pthread_mutex_unlock(&comm->winmu);
  where *at = comm->mapped_where;
  coll_work ex = {.coll = COLL_COLL_ALL_GATHER,
                  .sendbuf = &mine,
                  .recvbuf = at,
                  .count = sizeof mine,
                  .dtype = COLL_UINT8,
                  .seq = w->seq,
                  .inner = true};
  uint64_t t0 = comm->exec_ops->trace_on(comm) ? coll_now_ns() : 0;
  coll_result r = coll_oneshot_run(comm, &ex);
  if (r != COLL_OK) return r;
  for (int p = 0; p < n; p++)
    if ((needs_send(w, p) && at[p].send_slot < 0) || (needs_recv(w, p) && at[p].recv_slot < 0)) {
      if (comm->forced == COLL_ALGO_MAPPED && !comm->warned_mapped) {
        comm->warned_mapped = true;
        COLL_WARN(comm->rank,
                  "COLL_ALGO=mapped cannot serve %s #%llu: rank %d's %s buffer is "
                  "not coll_mem_alloc memory; using the tuner's choice instead",
                  coll_coll_name(w->coll), (unsigned long long)w->seq, p,
                  needs_send(w, p) && at[p].send_slot < 0 ? "send" : "receive");
      }
      return COLL_OK; /* every rank sees the same table: all fall back together */
    }
  if (w->coll == COLL_COLL_ALL_TO_ALL)
    for (int p = 0; p < n; p++)
      if (at[p].send_slot == at[p].recv_slot && at[p].send_off == at[p].recv_off)
        return COLL_OK; /* rank p in place: every rank takes the schedule */
  *ran = true;
  r = run(comm, w, at);
  if (t0 && r == COLL_OK)
    comm->exec_ops->trace_record(comm, w, COLL_ALGO_MAPPED, comm->steps, 0,
                                 coll_elem_bytes(w->dtype), t0, coll_now_ns());
  return r;
}

/* ---- the row in the algorithm table (algo.h) ----------------------------------------- */

/* Whether the call may try: windows exist (every rank agrees: the count changes only in
 * collective calls) and the communicator is small enough; whether the buffers really
 * lie in windows only the exchange at the start of coll_mapped_run can tell. */
bool coll_mapped_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es) {
  (void)es;
  return atomic_load_explicit(&comm->nshared, memory_order_relaxed) > 0 && count > 0 &&
         comm->mailboxes && comm->nranks <= COLL_MAX_RANKS_MAPPED && coll_mapped_serves(c);
}

/* The formulas at the top of this file, n = nccl-tests' size.  β_mem is half the
 * model's β: a FIFO's β is a byte copied into a slot and out again, a store here is one
 * copy.  The tuner prefers this row to every FIFO schedule whenever it is usable — it
 * moves each byte once where they move it through a slot — and compares the formula
 * only against the other run paths (one-shot, direct). */
coll_result coll_mapped_cost(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                             char *formula, size_t flen) {
  int p = m->p;
  double a = m->alpha_mb, b = m->beta / 2, g = m->gamma, f = (double)(p - 1) / p, s;
  switch (c) {
  case COLL_COLL_ALL_REDUCE:
  case COLL_COLL_REDUCE:
    s = 2 * a + n * b + f * n * g;
    snprintf(formula, flen, "2*a_mb + n*b_mem + (p-1)/p*n*g = %.3g us", s * 1e6);
    break;
  case COLL_COLL_REDUCE_SCATTER:
    s = 2 * a + n / p * b + f * n * g;
    snprintf(formula, flen, "2*a_mb + n/p*b_mem + (p-1)/p*n*g = %.3g us", s * 1e6);
    break;
  case COLL_COLL_ALL_GATHER:
  case COLL_COLL_BROADCAST:
    s = 2 * a + n * b;
    snprintf(formula, flen, "2*a_mb + n*b_mem = %.3g us", s * 1e6);
    break;
  case COLL_COLL_ALL_TO_ALL: /* n: one rank's send buffer; it pulls (p-1)/p of it in */
  case COLL_COLL_GATHER:     /* n: the root's buffer; each rank stores its n/p */
  case COLL_COLL_SCATTER:
    s = 2 * a + (c == COLL_COLL_ALL_TO_ALL ? n : n / p) * b;
    snprintf(formula, flen, "2*a_mb + %s*b_mem = %.3g us", c == COLL_COLL_ALL_TO_ALL ? "n" : "n/p",
             s * 1e6);
    break;
  default: return COLL_ERR_INVALID_ARG;
  }
  *seconds = s;
  return COLL_OK;
}
