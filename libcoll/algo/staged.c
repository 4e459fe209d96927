/* staged.c — all-reduce and all-gather on one host through every rank's shared ring:
 * each rank stages its input there once; for an all-reduce it reduces its own part of
 * every staged chunk from all the rings, and copies the other parts, already reduced,
 * out of their owners' rings; for an all-gather it copies every peer's block out.
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
 * An all-gather has no step 2: its parts are the ranks' whole blocks, gathered as soon as
 * they are staged (`written`), in chunks of 64 KiB growing with the block as the
 * fan-out's do, and its own block, out of place, is copied right after each chunk is
 * staged, from the cache.
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
 * All-reduce cost (p ranks, n bytes, k = ⌈n/G⌉ chunks; β a byte through a FIFO, in and out, so one
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
 * All-gather: per rank the block in (2n/p) and the p-1 others out (2(p-1)/p·n), 2n, against
 * the ring's 4(p-1)/p·n (the FIFO in and out at each of p-1 steps): level at 2 ranks,
 * half at many.  Priced (k+1)·α_mb + n·β/2 (k chunks of the block), level with the ring
 * at 2 ranks; the row's handicap for it (table.c) stands for the run-ahead and the own
 * block's copy from the cache, which the model leaves out.  Measured (out / in place, 2026-11-29,
 * `coll-bench all_gather -A ring|staged`): 4 ranks 1 MiB 167-171 us / 147-149 against the ring's
 * 237 / 215-227, 64 MiB 13.5-13.8 ms / 12.3-12.5 against 18.4-19.0 / 16.9-17.8; 2 ranks 1 MiB 87-89
 * / 62 against 90 / 66, 64 MiB 7.0 / 5.7-5.8 against 7.9-9.0 / 6.0.
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
#include "shm_ring.h"
#include "shm_wait.h"

/* Chunks of 256 KiB: 16 fit the ring.  4 ranks, 1 and 64 MiB, and 8 ranks, 1 MiB, on 2
 * cores took the same time with 128 KiB to 1 MiB (within the runs' spread). */
#define STAGED_CHUNK (256u * 1024)
_Static_assert(COLL_FANOUT_BYTES % STAGED_CHUNK == 0 && COLL_FANOUT_BYTES / STAGED_CHUNK >= 2,
               "whole chunks, at least two, fit the ring");

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

/* The rings a call looks at live on its stack: beyond this many ranks the row is not
 * usable (the same answer on every rank) and the ring runs. */
#define STAGED_MAX_RANKS 64

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
    const uint8_t *c0 = coll_shm_ring_slot(rv[0].area, rv[0].base + (uint32_t)o) + a * es;
    const uint8_t *c1 = coll_shm_ring_slot(rv[1].area, rv[1].base + (uint32_t)o) + a * es;
    coll_kernel_reduce(acc, c0, c1, k, w->dtype, w->op);
    for (int q = 2; q < n; q++)
      coll_kernel_reduce(acc, acc,
                         coll_shm_ring_slot(rv[q].area, rv[q].base + (uint32_t)o) + a * es, k,
                         w->dtype, w->op);
    if (w->op == COLL_AVG) coll_kernel_avg(acc, k, w->dtype, n);
    memcpy(my_chunk + a * es, acc, k * es);
    if (nt) coll_copy_nt(out + a * es, acc, k * es);
  }
}

bool coll_staged_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es) {
  (void)count, (void)es;
  return (c == COLL_COLL_ALL_REDUCE || c == COLL_COLL_ALL_GATHER) && comm->mailboxes &&
         comm->nranks <= STAGED_MAX_RANKS;
}

/* One call's progress: chunks staged (s), reduced (d) and gathered (gc, of which gq-1
 * peers' parts so far).  gc <= d <= s. */
typedef struct {
  struct coll_comm *comm;
  const coll_work *w;
  ring_view *rv;
  int n, me, gq;
  size_t es, bytes, nch, s, d, gc;
  const uint8_t *src;
  uint8_t *dst;
  bool nt, scanned;
  bool gathers_only; /* all-gather: no reduction; the parts are whole blocks */
  size_t g;          /* bytes a chunk */
  size_t ahead;      /* chunks it may stage past the one it is gathering */
  uint32_t free_to;  /* every peer has read this rank's ring up to here at least */
} staged_call;

static size_t len_of(const staged_call *c, size_t i) {
  size_t o = i * c->g;
  return c->bytes - o < c->g ? c->bytes - o : c->g;
}
/* Where chunk i ends in rank q's ring. */
static uint32_t end_of(const staged_call *c, int q, size_t i) {
  return c->rv[q].base + (uint32_t)(i * c->g + len_of(c, i));
}

/* Whether every peer has left the place of this rank's chunk i (without waiting). */
static bool room_for(staged_call *c, size_t i) {
  uint32_t end = end_of(c, c->me, i), need = end - COLL_FANOUT_BYTES, least = end;
  if (c->scanned && coll_shm_reached(c->free_to, need)) return true;
  coll_fanout *fo = c->rv[c->me].fo;
  for (int q = 0; q < c->n; q++) {
    if (q == c->me) continue;
    uint32_t at = atomic_load_explicit(&fo->readers[q].read, memory_order_acquire);
    if (!coll_shm_reached(at, need)) return false;
    if (!coll_shm_reached(at, least)) least = at;
  }
  c->free_to = least, c->scanned = true;
  return true;
}

/* The first peer whose chunk i is not staged yet, or -1. */
static int unstaged_peer(const staged_call *c, size_t i) {
  for (int k = 1; k < c->n; k++) {
    int q = (c->me + k) % c->n;
    if (!coll_shm_reached(atomic_load_explicit(&c->rv[q].fo->written, memory_order_acquire),
                          end_of(c, q, i)))
      return q;
  }
  return -1;
}

static void stage(staged_call *c) {
  size_t i = c->s++, o = i * c->g, len = len_of(c, i);
  coll_fanout *fo = c->rv[c->me].fo;
  memcpy(coll_shm_ring_slot(c->rv[c->me].area, c->rv[c->me].base + (uint32_t)o), c->src + o, len);
  atomic_store_explicit(&fo->written, end_of(c, c->me, i), memory_order_release);
  coll_shm_wake(&fo->written, &fo->waiters);
  /* An all-gather's own block, out of place: from the cache, while the peers read. */
  uint8_t *own = c->dst + (size_t)c->me * c->bytes;
  if (c->gathers_only && own != c->src) {
    if (c->nt)
      coll_copy_nt(own + o, c->src + o, len);
    else
      memcpy(own + o, c->src + o, len);
  }
}

static void reduce(staged_call *c) {
  size_t i = c->d++, o = i * c->g, lo, hi;
  part(len_of(c, i) / c->es, c->es, c->n, c->me, &lo, &hi);
  coll_fanout *fo = c->rv[c->me].fo;
  uint8_t *mine = coll_shm_ring_slot(c->rv[c->me].area, c->rv[c->me].base + (uint32_t)o);
  reduce_part(c->comm, c->w, c->rv, o, lo, hi, c->es, mine, c->dst + o, c->nt);
  atomic_store_explicit(&fo->reduced, end_of(c, c->me, i), memory_order_release);
  coll_shm_wake(&fo->reduced, &fo->reduced_waiters);
}

/* Peer q's part of chunk gc, reduced, out of q's ring; then this rank's `read` there. */
static void gather(staged_call *c, int q) {
  size_t i = c->gc, o = i * c->g, lo = 0, hi = len_of(c, i) / c->es;
  uint8_t *to = c->dst + o; /* all-reduce: part q of the chunk; all-gather: all of it */
  if (c->gathers_only)
    to += (size_t)q * c->bytes;
  else
    part(hi, c->es, c->n, q, &lo, &hi);
  if (hi > lo) {
    const uint8_t *from = coll_shm_ring_slot(c->rv[q].area, c->rv[q].base + (uint32_t)o) +
                          lo * c->es;
    if (c->nt)
      coll_copy_nt(to + lo * c->es, from, (hi - lo) * c->es);
    else
      coll_copy_shared(to + lo * c->es, from, (hi - lo) * c->es);
  }
  coll_fanout *fq = c->rv[q].fo;
  atomic_store_explicit(&fq->readers[c->me].read, end_of(c, q, i), memory_order_release);
  coll_shm_wake(&fq->readers[c->me].read, &fq->owner_waiting);
  if (++c->gq == c->n) c->gc++, c->gq = 1;
}

/* Elements of peer q's part summed over the call's chunks (all-reduce). */
static size_t part_total(const staged_call *c, int q) {
  size_t sum = 0, lo, hi;
  for (size_t i = 0; i < c->nch; i++) {
    part(len_of(c, i) / c->es, c->es, c->n, q, &lo, &hi);
    sum += hi - lo;
  }
  return sum;
}

/* For the trace, as the one-shot path records itself: the staging of the input (a copy
 * into the own ring), then what was read from each peer's ring — for an all-reduce this
 * rank's part of its staged input (reduced) and its reduced part; for an all-gather its
 * block — all timed as the whole call.  So the trace's bytes in are what came from
 * peers: 2(p-1)/p·n per rank for an all-reduce and (p-1)/p·n for an all-gather, the
 * ring's figures. */
static void record(const staged_call *c, uint64_t t_start, uint64_t t_end) {
  struct coll_comm *comm = c->comm;
  const coll_work *w = c->w;
  coll_step *st = comm->steps;
  size_t ns = 0, mine = c->gathers_only ? 0 : part_total(c, c->me);
  st[ns++] = (coll_step){
      .kind = COLL_STEP_COPY, .peer_in = -1, .peer_out = -1, .count = w->count, .chunk = c->me};
  for (int k = 1; k < c->n; k++) {
    int q = (c->me + k) % c->n;
    if (!c->gathers_only)
      st[ns++] = (coll_step){.kind = COLL_STEP_RECV_REDUCE_COPY,
                             .peer_in = q,
                             .peer_out = -1,
                             .count = mine,
                             .chunk = c->me};
    st[ns++] = (coll_step){.kind = COLL_STEP_RECV,
                           .peer_in = q,
                           .peer_out = -1,
                           .count = c->gathers_only ? w->count : part_total(c, q),
                           .chunk = q};
  }
  uint64_t *t0 = comm->exec_ops->trace_t0(comm), *t1 = comm->exec_ops->trace_t1(comm);
  for (size_t i = 0; i < ns; i++) t0[i] = t_start, t1[i] = t_end;
  comm->exec_ops->trace_record(comm, w, COLL_ALGO_STAGED, st, ns, c->es, t_start, t_end);
}

/* Does whatever is ready — gathers, reductions, stagings — and waits only when nothing
 * is, for the oldest thing this rank needs (the next part to gather, else the next
 * chunk to reduce, else room to stage): every wait is then for something its peers can
 * finish without this rank.
 *
 * How far staging runs ahead of gathering: with the output streamed, the whole ring, so
 * a rank given a core copies in all it can before it yields the core (4 ranks on 2
 * cores, 16 MiB out of place: 14,000 context switches in 44 calls against 42,000, and
 * 6.9-7.1 ms against 7.6-8.2 chunk by chunk; 8 ranks 16 MiB 15.6-16.1 against 16.9-17.3).
 * Otherwise one chunk: an output written in the cache wants the chunk's lines, read
 * when it was staged, still there (in place, 16 MiB: 5.6-6.0 ms one chunk ahead,
 * 6.2-6.6 the whole ring; 1 MiB out of place 362 us against 402-421). */
/* The word that says peer q's parts of a chunk may be gathered: reduced (all-reduce), or
 * staged (all-gather). */
static _Atomic uint32_t *ready_word(const staged_call *c, int q) {
  return c->gathers_only ? &c->rv[q].fo->written : &c->rv[q].fo->reduced;
}

static coll_result run_call(staged_call *c) {
  while (c->gc < c->nch || c->s < c->nch) { /* an all-gather may gather all before it stages all */
    bool moved = false;
    while (c->gc < c->d) {
      int q = (c->me + c->gq) % c->n;
      if (!coll_shm_reached(atomic_load_explicit(ready_word(c, q), memory_order_acquire),
                            end_of(c, q, c->gc)))
        break;
      gather(c, q), moved = true;
    }
    while (c->d < c->s && unstaged_peer(c, c->d) < 0) reduce(c), moved = true;
    if (c->gathers_only) c->d = c->nch; /* nothing to reduce: every chunk may be gathered */
    while (c->s < c->nch && c->s < c->gc + c->ahead && room_for(c, c->s)) stage(c), moved = true;
    if (moved) continue;
    coll_result r;
    if (c->gc < c->d) {
      int q = (c->me + c->gq) % c->n;
      coll_fanout *fq = c->rv[q].fo;
      r = coll_shm_wait(c->comm, c->w, q, ready_word(c, q), end_of(c, q, c->gc),
                        c->gathers_only ? &fq->waiters : &fq->reduced_waiters, "staged byte");
    } else if (c->d < c->s) {
      int q = unstaged_peer(c, c->d);
      r = q < 0 ? COLL_OK
                : coll_shm_wait(c->comm, c->w, q, &c->rv[q].fo->written, end_of(c, q, c->d),
                                &c->rv[q].fo->waiters, "staged byte");
    } else {
      r = coll_shm_ring_wait_room(c->comm, c->w, c->rv[c->me].fo, end_of(c, c->me, c->s),
                                  &c->free_to, &c->scanned, "staged byte");
    }
    if (r != COLL_OK) return r;
  }
  return COLL_OK;
}

coll_result coll_staged_run(struct coll_comm *comm, const coll_work *w, bool *ran) {
  *ran = true;
  int n = comm->nranks, me = comm->rank;
  void *shm = coll_shm_ctx(comm);
  ring_view rv[STAGED_MAX_RANKS];
  size_t es = coll_elem_bytes(w->dtype), bytes = w->count * es; /* all-gather: a block */
  bool ag = w->coll == COLL_COLL_ALL_GATHER;
  uint32_t g = ag ? coll_shm_ring_chunk(bytes) : STAGED_CHUNK;
  for (int q = 0; q < n; q++) {
    rv[q].fo = coll_shm_fanout(&comm->view, shm, q);
    rv[q].area = coll_shm_fanout_area(&comm->view, shm, q);
    if (!rv[q].fo || !rv[q].area)
      return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: rank %d's ring is not mapped", me, q);
    uint32_t at = q == me ? atomic_load_explicit(&rv[q].fo->written, memory_order_relaxed)
                          : atomic_load_explicit(&rv[q].fo->readers[me].read, memory_order_relaxed);
    rv[q].base = coll_shm_ring_start(at, g);
  }
  if (!comm->fanout_warm) {
    coll_result r = coll_shm_fanout_warm(&comm->view, shm);
    if (r != COLL_OK) return r;
    comm->fanout_warm = true;
  }
  coll_fanout *mine = rv[me].fo;
  /* Peers look at `reduced` only after `written` covers a chunk of this call. */
  atomic_store_explicit(&mine->reduced, rv[me].base, memory_order_relaxed);
  staged_call c = {.comm = comm,
                   .w = w,
                   .rv = rv,
                   .n = n,
                   .me = me,
                   .gq = 1,
                   .es = es,
                   .bytes = bytes,
                   .nch = (bytes + g - 1) / g,
                   .g = g,
                   .gathers_only = ag,
                   .src = w->sendbuf,
                   .dst = w->recvbuf};
  bool in_place = ag ? c.src == c.dst + (size_t)me * bytes : c.src == c.dst;
  c.nt = coll_copy_streams(w->coll, w->count, es, n, in_place, comm->nt_bytes);
  /* An all-gather writes nothing it staged: it may run the whole ring ahead, as the
   * fan-out's root does. */
  c.ahead = c.nt || ag ? COLL_FANOUT_BYTES / g : 1;
  uint64_t t_start = comm->exec_ops->trace_on(comm) ? coll_now_ns() : 0;
  coll_result r = run_call(&c);
  if (r != COLL_OK) return r;
  /* The next call on each ring starts at its next whole chunk, on every rank alike. */
  for (int q = 0; q < n; q++) {
    uint32_t next = coll_shm_ring_next(rv[q].base, bytes, g);
    if (q == me) {
      atomic_store_explicit(&mine->reduced, next, memory_order_relaxed);
      atomic_store_explicit(&mine->written, next, memory_order_release);
    } else {
      atomic_store_explicit(&rv[q].fo->readers[me].read, next, memory_order_release);
      coll_shm_wake(&rv[q].fo->readers[me].read, &rv[q].fo->owner_waiting);
    }
  }
  if (c.nt) coll_copy_nt_fence();
  if (t_start && !w->inner) record(&c, t_start, coll_now_ns());
  return COLL_OK;
}

coll_result coll_staged_cost(coll_coll_kind c, double nb, const coll_cost_model *m, double *seconds,
                             char *formula, size_t flen) {
  if ((c != COLL_COLL_ALL_REDUCE && c != COLL_COLL_ALL_GATHER) || m->p < 1 || !(nb >= 0))
    return COLL_ERR_INVALID_ARG;
  int p = m->p;
  if (c == COLL_COLL_ALL_GATHER) {
    double block = nb / p, g = coll_shm_ring_chunk(block < 1e18 ? (size_t)block : (size_t)1 << 60);
    double k = block > g ? ceil(block / g) : 1;
    *seconds = (k + 1) * m->alpha_mb + nb * m->beta / 2;
    snprintf(formula, flen, "(k+1)*a_mb + n*b/2 with p=%d, n=%.0f B, k=%.0f: %.2f us", p, nb, k,
             *seconds * 1e6);
    return COLL_OK;
  }
  double g = STAGED_CHUNK, k = nb > g ? ceil(nb / g) : 1, f = (double)(p - 1) / p;
  double copy = (nb + f * nb + nb / p) * m->beta / 2, red = f * nb * m->gamma;
  *seconds = 3 * k * m->alpha_mb + copy + red;
  snprintf(formula, flen,
           "3k*a_mb + (n + (p-1)/p*n + n/p)*b/2 + (p-1)/p*n*g with p=%d, n=%.0f B, k=%.0f: %.2f us",
           p, nb, k, *seconds * 1e6);
  return COLL_OK;
}
