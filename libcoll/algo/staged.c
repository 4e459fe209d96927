/* staged.c — all-reduce on one host through every rank's shared ring: each rank stages
 * its input there once, reduces its own part of every staged chunk from all the rings,
 * and copies the other parts, already reduced, out of their owners' rings.
 *
 * The rings are the fan-out rings (shm.h, fanout.c): COLL_FANOUT_BYTES in each rank's
 * segment, written by its owner alone.  The call goes in chunks of G bytes; for chunk i
 * rank r
 *   1. stages: waits until every peer has left the chunk's place in r's ring (their
 *      `read` there at most a ring behind the chunk's end), copies its input's chunk i
 *      in, and publishes `written`;
 *   2. reduces: waits for every peer's `written` to cover chunk i, then reduces part r of
 *      the chunk (a p-th, on 64-byte lines) from all p rings in rank order into its own
 *      output, copies the result over its own staged part r, and publishes `reduced`;
 *   3. gathers: for every peer q, waits for q's `reduced` to cover chunk i, copies part q
 *      of q's chunk out of q's ring into its output, and publishes its `read` in q's ring.
 * Each part is reduced by one rank, in rank order, so every rank returns the same bits.
 * Places are byte counts modulo 2^32 in each ring, as fanout.c counts them: a ring's
 * owner and its readers start a call at the same whole chunk without a message, and the
 * broadcast and this row can follow each other on one ring.  Nobody reads a user buffer
 * but its owner, so a rank returns as soon as its output is whole: no barrier ends it.
 *
 * Why: bytes read or written per rank.  The ring's reduce-scatter sends n/p in each of
 * p-1 steps (copied into a slot: 2·n/p) and reduces it on arrival (the slot and the
 * output read, the output written: 3·n/p); its all-gather copies n/p in and out (4·n/p):
 * 9(p-1)/p·n.  Here: staging 2n, reducing n read and n/p written, the result put back
 * into the ring 2n/p, gathering 2(p-1)/p·n: (5 + 1/p)·n.  For p = 2 that is 5.5n against
 * 4.5n, and the ring stays; for p = 3, 5.3n against 6n; 4, 5.25n against 6.75n; 8, 5.1n
 * against 7.9n.  On shared cores the job's bytes are its time.
 *
 * Cost (p ranks, n bytes, k = ⌈n/G⌉ chunks; β a byte through a FIFO, in and out, so one
 * copy is β/2; γ a byte reduced; α_mb a hand-over through shared lines, the mailboxes'):
 *   3k·α_mb + (n + (p-1)/p·n + n/p)·β/2 + (p-1)/p·n·γ
 *   (staging n, gathering (p-1)/p·n, putting the reduced part back n/p; three hand-overs
 *   a chunk: staged, reduced, read)
 * against the ring's 2(p-1)/p·n·β + (p-1)/p·n·γ: level at p = 2, cheaper from 3.
 *
 * Measured on 2 cores (2026-11-29, out of place / in place, `coll-bench all_reduce -d
 * float -c 0 -z 1 -A ring|staged`, lab/perf-log.md): 4 ranks 16 MiB 7.5-8.0 ms / 6.0-6.2
 * against the ring's 8.5-9.6 / 7.3-8.1; 1 MiB 356 us against 477; 64 MiB 32.0 ms against
 * 37-45; 8 ranks 64 KiB 45 us against 72, 1 MiB 775 against 934; 3 ranks 1 MiB 325 against
 * 413; 2 ranks 1 MiB 165 against 153 (the ring's).
 *
 * Large calls out of place stream the output (coll_copy_streams): the gathered parts are
 * copied with streaming stores, and the own part is reduced in the cache-sized scratch,
 * copied back into the ring and streamed out (4 ranks 16 MiB: 7.9-8.1 ms against
 * 9.6-10.7 unstreamed).
 *
 * Must never: write a place in its ring before every peer has left it, read a peer's
 * chunk before the peer published it, or wait without checking abort, peer health and
 * the deadline (shm_wait.c does the waiting).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "algo.h"
#include "reduce.h"
#include "shm_wait.h"

/* Chunks of 256 KiB: 16 fit the ring.  4 ranks, 1 and 64 MiB, and 8 ranks, 1 MiB, on 2
 * cores took the same time with 128 KiB to 1 MiB (within the runs' spread). */
#define STAGED_CHUNK (256u * 1024)
_Static_assert(COLL_FANOUT_BYTES % STAGED_CHUNK == 0 && COLL_FANOUT_BYTES / STAGED_CHUNK >= 2,
               "whole chunks, at least two, fit the ring");

static uint32_t start_of(uint32_t at, uint32_t g) { return (at + g - 1) & ~(g - 1); }
static uint32_t next_start(uint32_t base, size_t bytes, uint32_t g) {
  return start_of(base + (uint32_t)bytes, g);
}
static uint8_t *slot(uint8_t *area, uint32_t place) {
  return area + (place & (COLL_FANOUT_BYTES - 1));
}

/* Part q of a chunk of m elements: [lo, hi), parts of whole 64-byte lines where they can
 * be. */
static void part(size_t m, size_t es, int p, int q, size_t *lo, size_t *hi) {
  size_t line = 64 / es ? 64 / es : 1;
  size_t per = (m + (size_t)p - 1) / (size_t)p;
  per = (per + line - 1) / line * line;
  size_t a = (size_t)q * per;
  *lo = a < m ? a : m;
  *hi = a + per < m ? a + per : m;
}

typedef struct {
  coll_fanout *fo;
  uint8_t *area;
  uint32_t base; /* where this call starts in that rank's ring */
} ring_view;

#define STAGED_MAX_RANKS 64

/* Waits until every peer has left the places before `end` - a ring in this rank's ring. */
static coll_result wait_room(struct coll_comm *comm, const coll_work *w, coll_fanout *fo,
                             uint32_t end, uint32_t *free_to, bool *scanned) {
  uint32_t need = end - COLL_FANOUT_BYTES;
  if (*scanned && coll_shm_reached(*free_to, need)) return COLL_OK;
  uint32_t least = end;
  for (int q = 0; q < comm->nranks; q++) {
    if (q == comm->rank) continue;
    _Atomic uint32_t *rd = &fo->readers[q].read;
    coll_result r = coll_shm_wait(comm, w, q, rd, need, &fo->owner_waiting, "staged byte");
    if (r != COLL_OK) return r;
    uint32_t at = atomic_load_explicit(rd, memory_order_acquire);
    if (!coll_shm_reached(at, least)) least = at;
  }
  *free_to = least, *scanned = true;
  return COLL_OK;
}

/* Part [lo, hi) of the chunk at o: reduced from every ring in rank order, into this
 * rank's output and over its own staged part.  Streamed (out of place, large): through
 * the cache-sized scratch, so the output's lines are written once and never read. */
static void reduce_part(struct coll_comm *comm, const coll_work *w, const ring_view *rv, size_t o,
                        size_t lo, size_t hi, size_t es, uint8_t *my_chunk, uint8_t *out, bool nt) {
  int n = comm->nranks;
  size_t step = nt ? comm->scratch_bytes / es : hi - lo;
  for (size_t a = lo; a < hi; a += step) {
    size_t k = hi - a < step ? hi - a : step;
    uint8_t *acc = nt ? comm->scratch : out + a * es;
    const uint8_t *c0 = slot(rv[0].area, rv[0].base + (uint32_t)o) + a * es;
    const uint8_t *c1 = slot(rv[1].area, rv[1].base + (uint32_t)o) + a * es;
    coll_kernel_reduce(acc, c0, c1, k, w->dtype, w->op);
    for (int q = 2; q < n; q++)
      coll_kernel_reduce(acc, acc, slot(rv[q].area, rv[q].base + (uint32_t)o) + a * es, k, w->dtype,
                         w->op);
    if (w->op == COLL_AVG) coll_kernel_avg(acc, k, w->dtype, n);
    memcpy(my_chunk + a * es, acc, k * es);
    if (nt) coll_copy_nt(out + a * es, acc, k * es);
  }
}

static void record(struct coll_comm *comm, const coll_work *w, size_t es, uint64_t t_start,
                   uint64_t t_end) {
  coll_step *st = comm->steps;
  st[0] = (coll_step){.kind = COLL_STEP_RECV_REDUCE_COPY,
                      .peer_in = -1,
                      .peer_out = -1,
                      .count = w->count,
                      .chunk = comm->rank};
  uint64_t *t0 = comm->exec_ops->trace_t0(comm), *t1 = comm->exec_ops->trace_t1(comm);
  t0[0] = t_start, t1[0] = t_end;
  comm->exec_ops->trace_record(comm, w, COLL_ALGO_STAGED, st, 1, es, t_start, t_end);
}

bool coll_staged_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es) {
  (void)count, (void)es;
  return c == COLL_COLL_ALL_REDUCE && comm->mailboxes && comm->nranks <= STAGED_MAX_RANKS;
}

coll_result coll_staged_run(struct coll_comm *comm, const coll_work *w, bool *ran) {
  *ran = true;
  int n = comm->nranks, me = comm->rank;
  void *shm = coll_shm_ctx(comm);
  ring_view rv[STAGED_MAX_RANKS];
  size_t es = coll_elem_bytes(w->dtype), bytes = w->count * es;
  uint32_t g = STAGED_CHUNK;
  for (int q = 0; q < n; q++) {
    rv[q].fo = coll_shm_fanout(&comm->view, shm, q);
    rv[q].area = coll_shm_fanout_area(&comm->view, shm, q);
    if (!rv[q].fo || !rv[q].area)
      return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: rank %d's ring is not mapped", me, q);
    uint32_t at = q == me ? atomic_load_explicit(&rv[q].fo->written, memory_order_relaxed)
                          : atomic_load_explicit(&rv[q].fo->readers[me].read, memory_order_relaxed);
    rv[q].base = start_of(at, g);
  }
  if (!comm->fanout_warm) {
    coll_result r = coll_shm_fanout_warm(&comm->view, shm);
    if (r != COLL_OK) return r;
    comm->fanout_warm = true;
  }
  coll_fanout *mine = rv[me].fo;
  /* Peers look at `reduced` only after `written` covers a chunk of this call. */
  atomic_store_explicit(&mine->reduced, rv[me].base, memory_order_relaxed);
  const uint8_t *src = w->sendbuf;
  uint8_t *dst = w->recvbuf;
  bool nt = coll_copy_streams(COLL_COLL_ALL_REDUCE, w->count, es, n, src == dst, comm->nt_bytes);
  uint64_t t_start = comm->exec_ops->trace_on(comm) ? coll_now_ns() : 0;
  uint32_t free_to = 0;
  bool scanned = false;
  coll_result r = COLL_OK;
  for (size_t o = 0; o < bytes && r == COLL_OK; o += g) {
    size_t len = bytes - o < g ? bytes - o : g, m = len / es;
    /* 1. stage */
    uint32_t my_start = rv[me].base + (uint32_t)o, my_end = my_start + (uint32_t)len;
    if ((r = wait_room(comm, w, mine, my_end, &free_to, &scanned)) != COLL_OK) break;
    uint8_t *my_chunk = slot(rv[me].area, my_start);
    memcpy(my_chunk, src + o, len);
    atomic_store_explicit(&mine->written, my_end, memory_order_release);
    coll_shm_wake(&mine->written, &mine->waiters);
    /* 2. reduce my part from every ring, in rank order */
    size_t lo, hi;
    part(m, es, n, me, &lo, &hi);
    for (int q = 0; q < n && r == COLL_OK; q++)
      if (q != me)
        r = coll_shm_wait(comm, w, q, &rv[q].fo->written, rv[q].base + (uint32_t)(o + len),
                          &rv[q].fo->waiters, "staged byte");
    if (r != COLL_OK) break;
    reduce_part(comm, w, rv, o, lo, hi, es, my_chunk, dst + o, nt);
    atomic_store_explicit(&mine->reduced, my_end, memory_order_release);
    coll_shm_wake(&mine->reduced, &mine->reduced_waiters);
    /* 3. gather every other part, reduced, from its owner's ring */
    for (int i = 1; i < n; i++) {
      int q = (me + i) % n;
      coll_fanout *fq = rv[q].fo;
      uint32_t q_end = rv[q].base + (uint32_t)(o + len);
      if ((r = coll_shm_wait(comm, w, q, &fq->reduced, q_end, &fq->reduced_waiters,
                             "staged byte")) != COLL_OK)
        break;
      part(m, es, n, q, &lo, &hi);
      if (hi > lo) {
        const uint8_t *from = slot(rv[q].area, rv[q].base + (uint32_t)o) + lo * es;
        if (nt)
          coll_copy_nt(dst + o + lo * es, from, (hi - lo) * es);
        else
          coll_copy_shared(dst + o + lo * es, from, (hi - lo) * es);
      }
      atomic_store_explicit(&fq->readers[me].read, q_end, memory_order_release);
      coll_shm_wake(&fq->readers[me].read, &fq->owner_waiting);
    }
  }
  if (r != COLL_OK) return r;
  /* The next call on each ring starts at its next whole chunk, on every rank alike. */
  for (int q = 0; q < n; q++) {
    uint32_t next = next_start(rv[q].base, bytes, g);
    if (q == me) {
      atomic_store_explicit(&mine->reduced, next, memory_order_relaxed);
      atomic_store_explicit(&mine->written, next, memory_order_release);
    } else {
      atomic_store_explicit(&rv[q].fo->readers[me].read, next, memory_order_release);
      coll_shm_wake(&rv[q].fo->readers[me].read, &rv[q].fo->owner_waiting);
    }
  }
  if (nt) coll_copy_nt_fence();
  if (t_start && !w->inner) record(comm, w, es, t_start, coll_now_ns());
  return COLL_OK;
}

coll_result coll_staged_cost(coll_coll_kind c, double nb, const coll_cost_model *m, double *seconds,
                             char *formula, size_t flen) {
  if (c != COLL_COLL_ALL_REDUCE || m->p < 1 || !(nb >= 0)) return COLL_ERR_INVALID_ARG;
  int p = m->p;
  double g = STAGED_CHUNK, k = nb > g ? ceil(nb / g) : 1, f = (double)(p - 1) / p;
  double copy = (nb + f * nb + nb / p) * m->beta / 2, red = f * nb * m->gamma;
  *seconds = 3 * k * m->alpha_mb + copy + red;
  snprintf(formula, flen,
           "3k*a_mb + (n + (p-1)/p*n + n/p)*b/2 + (p-1)/p*n*g with p=%d, n=%.0f B, k=%.0f: %.2f us",
           p, nb, k, *seconds * 1e6);
  return COLL_OK;
}
