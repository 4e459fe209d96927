/* fanout.c — broadcast through the root's fan-out ring: the root copies its buffer in
 * once, and every other rank copies it out, all of them at once.
 *
 * The ring (shm.h) is the root's own, COLL_FANOUT_BYTES in its segment, written by it
 * alone and read by everyone else.  The root cuts the call into chunks of G bytes and,
 * chunk by chunk,
 *   waits until every reader has read what lay in that place before (each reader's
 *   `read` at most COLL_FANOUT_BYTES behind the chunk's end), copies the chunk in, and
 *   publishes `written` (release);
 * while each reader, chunk by chunk, waits until `written` covers the chunk, copies it
 * out, and publishes its `read`.  Places are byte counts modulo 2^32 (shm.h).  A call
 * starts where the last one ended, rounded up to a whole chunk, so no chunk wraps round
 * the ring's end, and the root and the readers agree on every place without a message:
 * they count the same calls.
 *
 * Why: a chain (ring.c) copies every byte into and out of p-1 FIFOs, 2(p-1) copies of
 * n in all; here there are p (the root's one, a reader's one each), and the readers
 * copy at the same time instead of one after the other.
 *
 * Cost (p ranks, n bytes, k = ⌈n/G⌉ chunks of G; α and β the FIFO's, per pipeline stage and
 * per byte, as the chain is priced: a chunk's hand-over is a slot's):
 *   a core per rank    (k+1)·α + (n + min(n, G))·β
 *                      (k+1 stages: the root writes chunk i while the readers read i-1;
 *                      the chain has p-1+k-1, so from 3 ranks on this is cheaper)
 *   c < p cores        (k+1)·α + the chain's copying × p / (2(p-1))
 *                      (the ranks take turns on the cores, so the time is the copying:
 *                      p copies of n here, 2(p-1) there)
 * Measured on 2 cores (2026-11-29, in place, `coll-bench broadcast -c 0 -z 1 -A ring|fanout`,
 * two alternating runs, lab/perf-log.md): 1 MiB on 3 ranks 143-144 µs against the chain's
 * 157-161, on 4 ranks 137-139 against 209, on 8 ranks 270-271 against 460-468; 64 MiB on
 * 4 ranks 11.7 ms against 17.6-18.3.
 *
 * Chunks of 64 KiB (the FIFO's slot: small enough to pipeline, large enough that a
 * hand-over is a twentieth of its copy), whether or not ranks share cores: 4 ranks on 2
 * cores took 132-135 µs at 1 MiB with 64 or 256 KiB chunks and 136-146 with 1 MiB ones.
 * Large calls take larger chunks, up to 512 KiB from 32 MiB (2 ranks, 64 MiB in place,
 * four alternating runs: 5.60-6.02 ms against 5.70-6.53 with 64 KiB).
 *
 * The root's own copy, out of place, goes chunk by chunk right after the chunk is
 * published, from the cache, while the readers copy (64 MiB out of place: 2 ranks 15.0-15.7
 * ms with the copy after the last chunk, 12.2-12.4 this way; 4 ranks 20.4-20.7, 17.3-17.4).
 *
 * With one reader (2 ranks) this is a chain of one link, with one difference: the root
 * may run the ring's 4 MiB ahead, where the chain's root waits once its 8 slots are full.
 * A stall of either rank (preempted on shared cores) then does not stall the other: in
 * place, 1 MiB, the mean of 8000 calls was 58-60 µs against the chain's 81-87 (Intel
 * MPI's best, 55-57); out of place and at 64 MiB the two are level.  The tuner's
 * handicap below 1 (table.c) stands for what the model leaves out.
 *
 * Must never: write a place in the ring before every reader has read what was there,
 * read one before the root published it, or wait without checking abort, peer health
 * and the deadline (shm_wait.c does the waiting).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "algo.h"
#include "ring.h"
#include "shm_ring.h"
#include "shm_wait.h"

/* Into a user's buffer: streamed for large calls (copy.c); else from the ring with the
 * copy for lines another core wrote (a reader), or from this core's cache (the root). */
static void put(void *dst, const void *src, size_t len, bool nt, bool from_ring) {
  if (nt)
    coll_copy_nt(dst, src, len);
  else if (from_ring)
    coll_copy_shared(dst, src, len);
  else
    memcpy(dst, src, len);
}

/* The root: every chunk into the ring once the readers have left its place. */
static coll_result write_ring(struct coll_comm *comm, const coll_work *w, coll_fanout *fo,
                              uint8_t *area, const uint8_t *src, uint8_t *dst, size_t bytes,
                              uint32_t g, bool nt) {
  uint32_t base = coll_shm_ring_start(atomic_load_explicit(&fo->written, memory_order_relaxed), g);
  uint32_t free_to = 0; /* every reader has read up to here, once scanned */
  bool scanned = false;
  for (size_t o = 0; o < bytes; o += g) {
    size_t len = bytes - o < g ? bytes - o : g;
    uint32_t start = base + (uint32_t)o, end = start + (uint32_t)len;
    coll_result r = coll_shm_ring_wait_room(comm, w, fo, end, &free_to, &scanned, "fan-out byte");
    if (r != COLL_OK) return r;
    memcpy(coll_shm_ring_slot(area, start), src + o, len);
    atomic_store_explicit(&fo->written, end, memory_order_release);
    coll_shm_wake(&fo->written, &fo->waiters);
    if (dst != src) put(dst + o, src + o, len, nt, false); /* from the cache, as they read */
  }
  atomic_store_explicit(&fo->written, coll_shm_ring_next(base, bytes, g), memory_order_release);
  return COLL_OK;
}

/* A reader: every chunk out of the root's ring once the root has published it. */
static coll_result read_ring(struct coll_comm *comm, const coll_work *w, coll_fanout *fo,
                             const uint8_t *area, uint8_t *dst, size_t bytes, uint32_t g, bool nt) {
  int me = comm->rank;
  _Atomic uint32_t *mine = &fo->readers[me].read;
  uint32_t base = coll_shm_ring_start(atomic_load_explicit(mine, memory_order_relaxed),
                                      g); /* ours alone */
  for (size_t o = 0; o < bytes; o += g) {
    size_t len = bytes - o < g ? bytes - o : g;
    uint32_t start = base + (uint32_t)o, end = start + (uint32_t)len;
    coll_result r = coll_shm_wait(comm, w, w->root, &fo->written, end, &fo->waiters,
                                  "fan-out byte");
    if (r != COLL_OK) return r;
    put(dst + o, coll_shm_ring_slot((uint8_t *)area, start), len, nt, true);
    atomic_store_explicit(mine, end, memory_order_release);
    coll_shm_wake(mine, &fo->owner_waiting);
  }
  /* The root's next call starts at the next whole chunk and may wait for us to be there. */
  atomic_store_explicit(mine, coll_shm_ring_next(base, bytes, g), memory_order_release);
  coll_shm_wake(mine, &fo->owner_waiting);
  return COLL_OK;
}

/* For the trace, as the one-shot path records itself: the root's copy into its ring, a
 * reader's read of it, both timed as the whole call. */
static void record(struct coll_comm *comm, const coll_work *w, size_t es, uint64_t t_start,
                   uint64_t t_end) {
  bool root = comm->rank == w->root;
  coll_step *st = comm->steps;
  st[0] = (coll_step){.kind = root ? COLL_STEP_COPY : COLL_STEP_RECV,
                      .peer_in = root ? -1 : w->root,
                      .peer_out = -1,
                      .count = w->count,
                      .chunk = w->root};
  uint64_t *t0 = comm->exec_ops->trace_t0(comm), *t1 = comm->exec_ops->trace_t1(comm);
  t0[0] = t_start, t1[0] = t_end;
  comm->exec_ops->trace_record(comm, w, COLL_ALGO_FANOUT, st, 1, es, t_start, t_end);
}

/* ---- the row in the algorithm table (algo.h) ----------------------------------------- */

bool coll_fanout_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es) {
  (void)count, (void)es;
  return c == COLL_COLL_BROADCAST && comm->mailboxes; /* every peer through shm */
}


coll_result coll_fanout_run(struct coll_comm *comm, const coll_work *w, bool *ran) {
  *ran = true;
  int me = comm->rank;
  void *shm = coll_shm_ctx(comm);
  coll_fanout *fo = coll_shm_fanout(&comm->view, shm, w->root);
  uint8_t *area = coll_shm_fanout_area(&comm->view, shm, w->root);
  if (!fo || !area)
    return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: rank %d's fan-out ring is not mapped", me,
                     w->root);
  size_t es = coll_elem_bytes(w->dtype), bytes = w->count * es;
  const uint8_t *src = w->sendbuf;
  uint8_t *dst = w->recvbuf;
  bool in_place = me == w->root ? src == dst : true;
  bool nt = coll_copy_streams(COLL_COLL_BROADCAST, w->count, es, comm->nranks, in_place,
                              comm->nt_bytes);
  uint32_t g = coll_shm_ring_chunk(bytes);
  uint64_t t_start = comm->exec_ops->trace_on(comm) ? coll_now_ns() : 0;
  coll_result r = COLL_OK;
  if (me == w->root) {
    if (!comm->fanout_warm) { /* the ring's pages, once, before the first write */
      if ((r = coll_shm_fanout_warm(&comm->view, shm)) != COLL_OK) return r;
      comm->fanout_warm = true;
    }
    r = write_ring(comm, w, fo, area, src, dst, bytes, g, nt);
  } else {
    r = read_ring(comm, w, fo, area, dst, bytes, g, nt);
  }
  if (nt) coll_copy_nt_fence(); /* the streamed stores are done when the call is */
  if (t_start && r == COLL_OK && !w->inner) record(comm, w, es, t_start, coll_now_ns());
  return r;
}

coll_result coll_fanout_cost(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                             char *formula, size_t flen) {
  if (c != COLL_COLL_BROADCAST || m->p < 1 || !(n >= 0)) return COLL_ERR_INVALID_ARG;
  int p = m->p;
  double g = coll_shm_ring_chunk(n < 1e18 ? (size_t)n : (size_t)1 << 60),
         k = n > g ? ceil(n / g) : 1;
  double fill = n < g ? n : g;
  if (m->cores > 0 && m->cores < p) {
    /* Ranks take turns on the cores: the copying is priced against the chain's, by the
     * copies made; the hand-overs are this row's own. */
    coll_cost_model copying = *m;
    copying.alpha = 0;
    double chain = 0;
    char f[256];
    coll_result r = coll_ring_cost(c, n, &copying, &chain, f, sizeof f);
    if (r != COLL_OK) return r;
    double share = p > 1 ? (double)p / (2.0 * (p - 1)) : 1.0;
    *seconds = (k + 1) * m->alpha + chain * share;
    snprintf(formula, flen,
             "(k+1)*a + the chain's copying x p/(2(p-1)) with p=%d on %d cores, k=%.0f: "
             "%.2f us + %.2f us x %.3f = %.2f us",
             p, m->cores, k, (k + 1) * m->alpha * 1e6, chain * 1e6, share, *seconds * 1e6);
    return COLL_OK;
  }
  *seconds = (k + 1) * m->alpha + (n + fill) * m->beta;
  snprintf(formula, flen,
           "(k+1)*a + (n + min(n,G))*b with p=%d, n=%.0f B, G=%.0f B, k=%.0f: %.2f us", p, n, g, k,
           *seconds * 1e6);
  return COLL_OK;
}
