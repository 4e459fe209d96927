/* test_alltoall.c — all-to-all, all-to-allv, gather and scatter over the real transports.
 *
 * Every element carries who sent it, to whom, and its index: element i of the block
 * rank s sends rank d is E(seed, s, d, i), bytes from a hash, so any dtype works and a
 * misplaced, duplicated or stale element is caught by comparing bytes with the value
 * computed here, independently of the library.  Receive buffers start as 0xA5 with a
 * guard after them; whatever the call must not write (all_to_allv's gaps between
 * blocks, a non-root's buffer in gather, the guard) is checked to be still 0xA5, and the
 * send buffers to be unchanged.
 *
 * The matrix: N = 1..8; every dtype; counts 0, 1, a prime and (the big part) one over
 * the largest FIFO slot; every root; in place and out of place where the API defines
 * it; all_to_allv with uneven and zero counts and displacements in another order than
 * the ranks, with gaps.  Then: each algorithm forced with COLL_ALGO (the call must run
 * on it when it can serve it), COLL_TRANSPORT=tcp, calls queued on a stream (the v
 * arrays freed right after the enqueue), COLL_CHECK catching all_to_allv counts that
 * disagree, and arguments refused with a sentence naming the call and the argument.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_trace.h"
#include "coll_test.h"

#define POISON 0xA5
#define GUARD 64               /* bytes after every receive buffer that nothing may write */
#define BIG_BLOCK (256u << 10) /* the largest FIFO slot (shm with ranks > cores, tcp) */

/* ---- data ----------------------------------------------------------------------------- */

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

/* Byte b of element i of the block rank s sends rank d. */
static uint8_t ebyte(uint64_t seed, int s, int d, size_t i, size_t b) {
  return (uint8_t)(mix(seed ^ mix(((uint64_t)s << 48) ^ ((uint64_t)d << 32) ^ i)) >> (8 * b));
}

static void fill(uint8_t *p, size_t es, uint64_t seed, int s, int d, size_t n) {
  for (size_t i = 0; i < n; i++)
    for (size_t b = 0; b < es; b++) p[i * es + b] = ebyte(seed, s, d, i, b);
}

/* 0 when p holds the n elements s sent d; else reports the first wrong one. */
static int expect(const uint8_t *p, size_t es, uint64_t seed, int s, int d, size_t n,
                  const char *what, int rank) {
  for (size_t i = 0; i < n; i++)
    for (size_t b = 0; b < es; b++)
      if (p[i * es + b] != ebyte(seed, s, d, i, b))
        return t_failf("rank %d: %s: element %zu of the block from rank %d to rank %d is wrong",
                       rank, what, i, s, d);
  return 0;
}

static int untouched(const uint8_t *p, size_t from, size_t to, const char *what, int rank) {
  for (size_t i = from; i < to; i++)
    if (p[i] != POISON)
      return t_failf("rank %d: %s: byte %zu was written but lies outside every block", rank, what,
                     i);
  return 0;
}

static coll_result wait_for(coll_stream_t s, coll_result r) {
  return r == COLL_OK && s ? coll_stream_synchronize(s) : r;
}

/* ---- one checked call of each kind ---------------------------------------------------- */

typedef struct {
  int n, rank;
  coll_dtype d;
  size_t count;
  uint64_t seed;
  bool in_place;
  int root;
  const char *algo; /* forced COLL_ALGO, or NULL */
  coll_comm_t comm;
  coll_stream_t stream; /* NULL: blocking */
  uint8_t *a, *b;       /* two buffers of cap bytes (+ GUARD) */
  size_t cap;
} ctx;

static void describe(const ctx *c, const char *kind, char *buf, size_t len) {
  snprintf(buf, len, "%s %s n=%d count=%zu root=%d %s%s%s", kind, coll_dtype_name(c->d), c->n,
           c->count, c->root, c->in_place ? "in-place" : "out-of-place",
           c->algo ? " COLL_ALGO=" : "", c->algo ? c->algo : "");
}

/* When an algorithm is forced and can serve the call, the call must have run on it. */
static int ran_on(const ctx *c, const char *what, const char *want) {
  if (!want || c->n == 1 || c->count == 0) return 0;
  const char *got = coll_comm_last_algo(c->comm);
  if (!got || strcmp(got, want) != 0)
    return t_failf("rank %d: %s ran %s, expected %s", c->rank, what, got ? got : "(nothing)", want);
  return 0;
}

static bool one_host_shm(void) {
  const char *t = getenv("COLL_TRANSPORT");
  return !t || strcmp(t, "tcp") != 0;
}

/* Which path a forced algorithm must take for this call (NULL: not checked). */
static const char *expected_algo(const ctx *c, const char *kind, size_t bytes_whole) {
  if (!c->algo) return NULL;
  bool a2a = strcmp(kind, "all_to_all") == 0, v = strcmp(kind, "all_to_allv") == 0;
  bool rooted = !a2a && !v;
  if (strcmp(c->algo, "pairwise") == 0) return a2a || v ? "pairwise" : NULL;
  if (strcmp(c->algo, "linear") == 0) return rooted ? "linear" : NULL;
  if (strcmp(c->algo, "oneshot") == 0) {
    bool fits = strcmp(kind, "gather") == 0 ? bytes_whole / (size_t)c->n <= 65536
                                            : bytes_whole <= 65536;
    return one_host_shm() && !v && fits ? "oneshot" : NULL;
  }
  if (strcmp(c->algo, "direct") == 0) {
    if (!one_host_shm() || rooted) return NULL;
    /* In place, every rank declines together and the tuner's next choice runs. */
    return c->in_place ? NULL : "direct";
  }
  if (strcmp(c->algo, "mapped") == 0) { /* buffers from coll_mem_alloc (matrix_arg.mapped) */
    if (v) return "pairwise";           /* all-to-allv has no mapped path */
    return a2a && c->in_place ? NULL : "mapped"; /* in place: the tuner's choice */
  }
  return NULL;
}

static int do_all_to_all(ctx *c) {
  size_t es = coll_dtype_size(c->d), blk = c->count * es, tot = blk * (size_t)c->n;
  uint8_t *send = c->a, *recv = c->in_place ? c->a : c->b;
  char what[160];
  describe(c, "all_to_all", what, sizeof what);
  memset(recv, POISON, tot + GUARD);
  for (int j = 0; j < c->n; j++) fill(send + (size_t)j * blk, es, c->seed, c->rank, j, c->count);
  coll_result r = wait_for(c->stream,
                           coll_all_to_all(send, recv, c->count, c->d, c->comm, c->stream));
  if (r != COLL_OK)
    return t_failf("rank %d: %s: %s: %s", c->rank, what, coll_result_string(r),
                   coll_comm_last_error(c->stream ? NULL : c->comm));
  for (int i = 0; i < c->n; i++)
    if (expect(recv + (size_t)i * blk, es, c->seed, i, c->rank, c->count, what, c->rank)) return 1;
  if (untouched(recv, tot, tot + GUARD, what, c->rank)) return 1;
  if (!c->in_place)
    for (int j = 0; j < c->n; j++)
      if (expect(send + (size_t)j * blk, es, c->seed, c->rank, j, c->count, "send buffer changed",
                 c->rank))
        return 1;
  return ran_on(c, what, expected_algo(c, "all_to_all", tot));
}

static int do_gather(ctx *c) {
  size_t es = coll_dtype_size(c->d), blk = c->count * es, tot = blk * (size_t)c->n;
  bool root = c->rank == c->root;
  uint8_t *recv = c->b, *send = c->a;
  if (c->in_place && root) send = c->b + (size_t)c->root * blk;
  char what[160];
  describe(c, "gather", what, sizeof what);
  memset(recv, POISON, tot + GUARD);
  fill(send, es, c->seed, c->rank, c->root, c->count);
  /* Off the root the receive buffer is ignored: NULL on odd ranks, a poisoned buffer
   * (which must stay so) on even ones. */
  void *rb = root || c->rank % 2 == 0 ? recv : NULL;
  coll_result r = wait_for(c->stream,
                           coll_gather(send, rb, c->count, c->d, c->root, c->comm, c->stream));
  if (r != COLL_OK)
    return t_failf("rank %d: %s: %s: %s", c->rank, what, coll_result_string(r),
                   coll_comm_last_error(c->stream ? NULL : c->comm));
  if (!root) return untouched(recv, 0, tot + GUARD, what, c->rank);
  for (int q = 0; q < c->n; q++)
    if (expect(recv + (size_t)q * blk, es, c->seed, q, c->root, c->count, what, c->rank)) return 1;
  if (untouched(recv, tot, tot + GUARD, what, c->rank)) return 1;
  return ran_on(c, what, expected_algo(c, "gather", tot));
}

static int do_scatter(ctx *c) {
  size_t es = coll_dtype_size(c->d), blk = c->count * es, tot = blk * (size_t)c->n;
  bool root = c->rank == c->root;
  uint8_t *send = c->a, *recv = c->b;
  if (c->in_place && root) recv = c->a + (size_t)c->root * blk;
  char what[160];
  describe(c, "scatter", what, sizeof what);
  if (!(c->in_place && root)) memset(recv, POISON, blk + GUARD);
  if (root)
    for (int q = 0; q < c->n; q++) fill(send + (size_t)q * blk, es, c->seed, c->root, q, c->count);
  const void *sb = root ? send : c->rank % 2 ? NULL : c->a; /* ignored off the root */
  coll_result r = wait_for(c->stream,
                           coll_scatter(sb, recv, c->count, c->d, c->root, c->comm, c->stream));
  if (r != COLL_OK)
    return t_failf("rank %d: %s: %s: %s", c->rank, what, coll_result_string(r),
                   coll_comm_last_error(c->stream ? NULL : c->comm));
  if (expect(recv, es, c->seed, c->root, c->rank, c->count, what, c->rank)) return 1;
  if (!(c->in_place && root) && untouched(recv, blk, blk + GUARD, what, c->rank)) return 1;
  if (root)
    for (int q = 0; q < c->n; q++)
      if (expect(send + (size_t)q * blk, es, c->seed, c->root, q, c->count, "send buffer changed",
                 c->rank))
        return 1;
  return ran_on(c, what, expected_algo(c, "scatter", tot));
}

/* What rank s sends rank d in the all_to_allv pattern `pat`: uneven, zero for some pairs
 * (the own block too), up to about 2·base. */
static size_t vcount(int pat, int s, int d, size_t base) {
  unsigned h = (unsigned)(s * 7 + d * 3 + pat * 5) % 5;
  return h == 0 ? 0 : h == 1 ? 1 : base / 2 + (size_t)(h - 2) * base / 2 + (size_t)s;
}

/* Fills the four arrays of rank r for pattern pat: blocks placed in another order than the
 * ranks, with gaps of 1..3 elements between them; returns the extents (elements). */
static void vlayout(int pat, int n, int r, size_t base, size_t *sc, size_t *sd, size_t *rc,
                    size_t *rd, size_t *sext, size_t *rext) {
  size_t at = 2;
  for (int i = 0; i < n; i++) sc[i] = vcount(pat, r, i, base), rc[i] = vcount(pat, i, r, base);
  for (int i = n - 1; i >= 0; i--) { /* send blocks in reverse rank order */
    sd[i] = at;
    at += sc[i] + 1 + (size_t)i % 3;
  }
  *sext = at;
  at = 1;
  for (int i = 0; i < n; i++) { /* receive blocks starting with the next rank */
    int q = (r + 1 + i) % n;
    rd[q] = at;
    at += rc[q] + 1 + (size_t)q % 2;
  }
  *rext = at + 3;
}

static int do_all_to_allv(ctx *c, int pat, bool free_arrays) {
  size_t es = coll_dtype_size(c->d), n = (size_t)c->n, sext, rext;
  size_t *v = malloc(4 * n * sizeof *v);
  if (!v) return t_failf("out of memory");
  size_t *sc = v, *sd = v + n, *rc = v + 2 * n, *rd = v + 3 * n;
  vlayout(pat, c->n, c->rank, c->count, sc, sd, rc, rd, &sext, &rext);
  if ((sext > rext ? sext : rext) * es > c->cap) {
    free(v);
    return t_failf("test bug: all_to_allv needs %zu bytes", (sext > rext ? sext : rext) * es);
  }
  char what[160];
  describe(c, "all_to_allv", what, sizeof what);
  snprintf(what + strlen(what), sizeof what - strlen(what), " pattern %d", pat);
  uint8_t *send = c->a, *recv = c->b;
  memset(recv, POISON, rext * es + GUARD);
  memset(send, POISON, sext * es);
  for (size_t q = 0; q < n; q++) fill(send + sd[q] * es, es, c->seed, c->rank, (int)q, sc[q]);
  /* Kept for the check: the call's own copy is what it must use. */
  size_t *keep = malloc(4 * n * sizeof *keep);
  if (!keep) {
    free(v);
    return t_failf("out of memory");
  }
  memcpy(keep, v, 4 * n * sizeof *v);
  coll_result r = coll_all_to_allv(send, sc, sd, recv, rc, rd, c->d, c->comm, c->stream);
  if (free_arrays) { /* a call on a stream copied them: scribble, then free */
    memset(v, 0xff, 4 * n * sizeof *v);
    free(v);
    v = NULL;
  }
  r = wait_for(c->stream, r);
  free(v);
  sc = keep, sd = keep + n, rc = keep + 2 * n, rd = keep + 3 * n;
  int bad = 0;
  if (r != COLL_OK)
    bad = t_failf("rank %d: %s: %s: %s", c->rank, what, coll_result_string(r),
                  coll_comm_last_error(c->stream ? NULL : c->comm));
  size_t prev_end = 0;
  for (size_t i = 0; i < n && !bad; i++) { /* blocks in buffer order, gaps between them */
    size_t q = ((size_t)c->rank + 1 + i) % n;
    bad = untouched(recv, prev_end * es, rd[q] * es, what, c->rank) ||
          expect(recv + rd[q] * es, es, c->seed, (int)q, c->rank, rc[q], what, c->rank);
    prev_end = rd[q] + rc[q];
  }
  if (!bad) bad = untouched(recv, prev_end * es, rext * es + GUARD, what, c->rank);
  for (size_t q = 0; q < n && !bad; q++)
    bad = expect(send + sd[q] * es, es, c->seed, c->rank, (int)q, sc[q], "send buffer changed",
                 c->rank);
  if (!bad) {
    const char *want = expected_algo(c, "all_to_allv", 0);
    bad = ran_on(c, what, want);
  }
  free(keep);
  return bad;
}

/* ---- the matrix ------------------------------------------------------------------------- */

enum { K_A2A = 1, K_A2AV = 2, K_GATHER = 4, K_SCATTER = 8, K_ALL = 15 };

typedef struct {
  bool big;       /* the over-one-slot counts (three dtypes) instead of the small ones */
  unsigned kinds; /* K_* */
  bool streams;   /* every call on a stream */
  bool mapped;    /* buffers from coll_mem_alloc */
} matrix_arg;

static int matrix(coll_comm_t comm, int rank, int n, void *varg) {
  const matrix_arg *ma = varg;
  ctx c = {.n = n, .rank = rank, .comm = comm, .algo = getenv("COLL_ALGO")};
  if (c.algo && !*c.algo) c.algo = NULL;
  size_t small[] = {0, 1, 1031};
  const coll_dtype big_types[] = {COLL_INT8, COLL_BFLOAT16, COLL_FLOAT64};
  size_t maxc = ma->big ? BIG_BLOCK + 7 : 1031;
  /* all_to_allv's blocks are up to ~2x count plus gaps: room for 3x */
  c.cap = (maxc * 8 * 3 + 64) * (size_t)n + 256;
  if (ma->mapped) {
    void *a = NULL, *b = NULL;
    if (coll_mem_alloc(comm, c.cap + GUARD, &a) != COLL_OK ||
        coll_mem_alloc(comm, c.cap + GUARD, &b) != COLL_OK)
      return t_failf("rank %d: coll_mem_alloc: %s", rank, coll_comm_last_error(comm));
    c.a = a, c.b = b;
  } else {
    c.a = malloc(c.cap + GUARD);
    c.b = malloc(c.cap + GUARD);
  }
  if (!c.a || !c.b) return t_failf("rank %d: out of memory", rank);
  if (ma->streams && coll_stream_create(&c.stream) != COLL_OK)
    return t_failf("rank %d: coll_stream_create failed", rank);
  int fails = 0;
  uint64_t seed = 777;
  int ntypes = ma->big ? 3 : COLL_NUM_DTYPES;
  for (int ti = 0; ti < ntypes && fails < 3; ti++) {
    c.d = ma->big ? big_types[ti] : (coll_dtype)ti;
    size_t es = coll_dtype_size(c.d);
    size_t counts[3], nc = 0;
    if (ma->big)
      counts[nc++] = BIG_BLOCK / es + 7;
    else
      for (size_t i = 0; i < 3; i++) counts[nc++] = small[i];
    for (size_t ci = 0; ci < nc && fails < 3; ci++) {
      c.count = counts[ci];
      for (int ip = 0; ip < 2; ip++) {
        c.in_place = ip;
        c.root = 0;
        if ((ma->kinds & K_A2A) && (c.seed = seed++, do_all_to_all(&c))) fails++;
        if ((ma->kinds & K_A2AV) && !ip)
          for (int pat = 0; pat < 2; pat++)
            if (c.seed = seed++, do_all_to_allv(&c, pat + ti, ma->streams)) fails++;
        for (int root = 0; root < n; root++) {
          c.root = root;
          if ((ma->kinds & K_GATHER) && (c.seed = seed++, do_gather(&c))) fails++;
          if ((ma->kinds & K_SCATTER) && (c.seed = seed++, do_scatter(&c))) fails++;
        }
      }
    }
  }
  if (c.stream) coll_stream_destroy(c.stream);
  if (ma->mapped) {
    if (fails) return 1; /* the peers may not reach the (collective) free */
    if (coll_mem_free(comm, c.a) != COLL_OK || coll_mem_free(comm, c.b) != COLL_OK)
      return t_failf("rank %d: coll_mem_free: %s", rank, coll_comm_last_error(comm));
    return 0;
  }
  free(c.a);
  free(c.b);
  return fails ? 1 : 0;
}

static void run(int n, bool big, unsigned kinds, const char *algo, const char *transport,
                bool streams) {
  matrix_arg a = {.big = big,
                  .kinds = kinds,
                  .streams = streams,
                  .mapped = algo && strcmp(algo, "mapped") == 0};
  char why[256];
  if (algo) setenv("COLL_ALGO", algo, 1);
  if (transport) setenv("COLL_TRANSPORT", transport, 1);
  setenv("COLL_TIMEOUT_MS", "60000", 1);
  int rc = t_launch(n, matrix, &a, 300000, why, sizeof why);
  unsetenv("COLL_ALGO");
  unsetenv("COLL_TRANSPORT");
  unsetenv("COLL_TIMEOUT_MS");
  cr_assert_eq(rc, 0, "n=%d %s COLL_ALGO=%s COLL_TRANSPORT=%s%s: %s", n, big ? "big" : "small",
               algo ? algo : "auto", transport ? transport : "auto", streams ? " streams" : "",
               why);
  T_ASSERT_NO_LEFTOVERS("after the job");
}

Test(alltoall, shm_small_n1_to_8, .timeout = 900) {
  for (int n = 1; n <= 8; n++) run(n, false, K_ALL, NULL, NULL, false);
}
Test(alltoall, shm_big, .timeout = 900) {
  const int ns[] = {2, 3, 5, 8};
  for (int i = 0; i < 4; i++) run(ns[i], true, K_ALL, NULL, NULL, false);
}

/* Each path forced: it must run where it can serve the call (checked per call), and
 * every other call falls back to the schedule with the right answer. */
Test(alltoall, forced_pairwise_and_linear, .timeout = 900) {
  for (int n = 2; n <= 8; n += 3) {
    run(n, false, K_A2A | K_A2AV, "pairwise", NULL, false);
    run(n, false, K_GATHER | K_SCATTER, "linear", NULL, false);
  }
  run(4, true, K_A2A | K_A2AV, "pairwise", NULL, false);
  run(3, true, K_GATHER | K_SCATTER, "linear", NULL, false);
}
Test(alltoall, forced_oneshot, .timeout = 900) {
  for (int n = 2; n <= 8; n += 2) run(n, false, K_ALL, "oneshot", NULL, false);
}
/* Buffers from coll_mem_alloc: all-to-all (out of place), gather and scatter run on the
 * mapped path (loads and stores into the peers' windows); the rest on the schedules. */
Test(alltoall, mapped, .timeout = 900) {
  for (int n = 1; n <= 5; n++) run(n, false, K_ALL, "mapped", NULL, false);
  run(3, true, K_ALL, "mapped", NULL, false);
}

Test(alltoall, forced_direct, .timeout = 900) {
  for (int n = 2; n <= 8; n += 3) run(n, false, K_A2A | K_A2AV, "direct", NULL, false);
  run(3, true, K_A2A | K_A2AV, "direct", NULL, false);
}

Test(alltoall, tcp, .timeout = 900) {
  for (int n = 1; n <= 8; n++) run(n, false, K_ALL, NULL, "tcp", false);
  run(3, true, K_ALL, NULL, "tcp", false);
}

/* Queued on a stream: the call returns before it runs, so all_to_allv's arrays are
 * overwritten and freed at once (under ASan a call that kept them would be caught). */
Test(alltoall, streams, .timeout = 900) {
  for (int n = 1; n <= 5; n += 2) run(n, false, K_ALL, NULL, NULL, true);
  run(4, true, K_A2A | K_A2AV, NULL, NULL, true);
  run(3, false, K_A2AV, "direct", NULL, true);
}

/* Several calls in flight on one stream before the first is waited for, all_to_allv
 * among them, each with its own buffers and arrays (freed right after the enqueue). */
static int queued(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  enum { CALLS = 12, COUNT = 3000 };
  size_t un = (size_t)n, cap = (3 * COUNT + 64) * un + 256;
  uint8_t *bufs[CALLS][2];
  size_t *keep[CALLS];
  coll_stream_t s;
  if (coll_stream_create(&s) != COLL_OK) return t_failf("rank %d: no stream", rank);
  for (int k = 0; k < CALLS; k++) {
    bufs[k][0] = malloc(cap + GUARD);
    bufs[k][1] = malloc(cap + GUARD);
    keep[k] = malloc(4 * un * sizeof(size_t));
    memset(bufs[k][1], POISON, cap + GUARD);
    size_t *v = malloc(4 * un * sizeof *v), se, re;
    vlayout(k, n, rank, COUNT, v, v + un, v + 2 * un, v + 3 * un, &se, &re);
    memcpy(keep[k], v, 4 * un * sizeof *v);
    for (size_t q = 0; q < un; q++)
      fill(bufs[k][0] + v[un + q] * 4, 4, (uint64_t)k, rank, (int)q, v[q]);
    coll_result r = coll_all_to_allv(bufs[k][0], v, v + un, bufs[k][1], v + 2 * un, v + 3 * un,
                                     COLL_FLOAT32, comm, s);
    memset(v, 0xff, 4 * un * sizeof *v);
    free(v);
    if (r != COLL_OK)
      return t_failf("rank %d: enqueue %d: %s", rank, k, coll_comm_last_error(comm));
  }
  coll_result r = coll_stream_synchronize(s);
  if (r != COLL_OK) return t_failf("rank %d: synchronize: %s", rank, coll_comm_last_error(NULL));
  int bad = 0;
  for (int k = 0; k < CALLS; k++) {
    size_t *rc = keep[k] + 2 * un, *rd = keep[k] + 3 * un;
    for (size_t q = 0; q < un && !bad; q++)
      bad = expect(bufs[k][1] + rd[q] * 4, 4, (uint64_t)k, (int)q, rank, rc[q],
                   "queued all_to_allv", rank);
    free(bufs[k][0]);
    free(bufs[k][1]);
    free(keep[k]);
  }
  coll_stream_destroy(s);
  return bad;
}

Test(alltoall, many_queued_all_to_allv, .timeout = 300) {
  char why[256];
  for (int n = 2; n <= 4; n += 2) {
    int rc = t_launch(n, queued, NULL, 120000, why, sizeof why);
    cr_assert_eq(rc, 0, "n=%d: %s", n, why);
  }
}

/* ---- disagreements and bad arguments ---------------------------------------------------- */

/* COLL_CHECK: rank 0 sends rank 1 five elements, rank 1 expects four; both learn it as
 * a mismatch naming the counts, before any data moves. */
static int v_mismatch(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg, (void)n;
  /* rank 0 sends rank 1 five elements; rank 1 expects four (the other direction agrees) */
  size_t sc[2] = {2, 5}, sd[2] = {0, 2}, rc[2] = {2, 4}, rd[2] = {0, 2};
  if (rank == 1) {
    sc[0] = 4, sc[1] = 2, sd[0] = 2, sd[1] = 0;
    rc[0] = 4, rc[1] = 2, rd[0] = 2, rd[1] = 0;
  }
  float s[16] = {0}, r[16];
  coll_result res = coll_all_to_allv(s, sc, sd, r, rc, rd, COLL_FLOAT32, comm, NULL);
  if (res != COLL_ERR_MISMATCH)
    return t_failf("rank %d: got %s, not a mismatch: %s", rank, coll_result_string(res),
                   coll_comm_last_error(comm));
  const char *e = coll_comm_last_error(comm);
  const char *want = rank == 0 ? "rank 1 expects 4 elements from rank 0, but rank 0's "
                                 "sendcounts[1] is 5"
                               : "rank 0 sends 5 elements to rank 1, but rank 1's "
                                 "recvcounts[0] is 4";
  if (!strstr(e, "all_to_allv") || !strstr(e, want))
    return t_failf("rank %d: the sentence does not say what disagreed: %s", rank, e);
  return 0;
}

Test(alltoall, check_catches_v_count_mismatch, .timeout = 120) {
  char why[256];
  setenv("COLL_CHECK", "1", 1);
  setenv("COLL_TIMEOUT_MS", "20000", 1);
  int rc = t_launch(2, v_mismatch, NULL, 60000, why, sizeof why);
  unsetenv("COLL_CHECK");
  unsetenv("COLL_TIMEOUT_MS");
  cr_assert_eq(rc, 0, "%s", why);
}

/* Refused up front with COLL_ERR_INVALID_ARG and a sentence naming the call and the
 * argument; every rank makes the same bad calls, then a good one still works. */
static int refused(coll_comm_t comm, coll_result got, const char *fn, const char *arg, int rank,
                   const char *what) {
  const char *e = coll_comm_last_error(comm);
  if (got != COLL_ERR_INVALID_ARG)
    return t_failf("rank %d: %s: got %s, not COLL_ERR_INVALID_ARG", rank, what,
                   coll_result_string(got));
  if (!strstr(e, fn) || !strstr(e, arg))
    return t_failf("rank %d: %s: the sentence names no '%s' of %s: %s", rank, what, arg, fn, e);
  return 0;
}

static int bad_args(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  int f = 0;
  size_t un = (size_t)n;
  float buf[64], out[64];
  memset(buf, 0, sizeof buf);
  size_t sc[8], sd[8], rc[8], rd[8];
  for (int i = 0; i < n; i++) sc[i] = rc[i] = 2, sd[i] = rd[i] = 2 * (size_t)i;
#define R(call, fn, a) f += refused(comm, call, fn, a, rank, #call)
  R(coll_all_to_all(buf, out, 2, (coll_dtype)99, comm, NULL), "coll_all_to_all", "dtype");
  R(coll_all_to_all(NULL, out, 2, COLL_FLOAT32, comm, NULL), "coll_all_to_all", "sendbuf");
  R(coll_all_to_all(buf, NULL, 2, COLL_FLOAT32, comm, NULL), "coll_all_to_all", "recvbuf");
  R(coll_all_to_all(buf, out, SIZE_MAX / 4, COLL_FLOAT32, comm, NULL), "coll_all_to_all",
    "overflows");
  R(coll_all_to_all(buf, buf + 1, 2, COLL_FLOAT32, comm, NULL), "coll_all_to_all", "overlap");
  if (coll_all_to_all(buf, out, 2, COLL_FLOAT32, NULL, NULL) != COLL_ERR_INVALID_ARG ||
      !strstr(coll_comm_last_error(NULL), "comm is NULL"))
    f += t_failf("rank %d: a NULL comm was not refused", rank);

  R(coll_all_to_allv(buf, NULL, sd, out, rc, rd, COLL_FLOAT32, comm, NULL), "coll_all_to_allv",
    "sendcounts is NULL");
  R(coll_all_to_allv(buf, sc, sd, out, rc, NULL, COLL_FLOAT32, comm, NULL), "coll_all_to_allv",
    "rdispls is NULL");
  R(coll_all_to_allv(buf, sc, sd, buf, rc, rd, COLL_FLOAT32, comm, NULL), "coll_all_to_allv",
    "in place");
  R(coll_all_to_allv(buf, sc, sd, buf + 1, rc, rd, COLL_FLOAT32, comm, NULL), "coll_all_to_allv",
    "overlap");
  R(coll_all_to_allv(NULL, sc, sd, out, rc, rd, COLL_FLOAT32, comm, NULL), "coll_all_to_allv",
    "sendbuf");
  rc[rank] = 3;
  R(coll_all_to_allv(buf, sc, sd, out, rc, rd, COLL_FLOAT32, comm, NULL), "coll_all_to_allv",
    "recvcounts[");
  rc[rank] = 2;
  sd[n - 1] = SIZE_MAX - 1;
  R(coll_all_to_allv(buf, sc, sd, out, rc, rd, COLL_FLOAT32, comm, NULL), "coll_all_to_allv",
    "sdispls[");
  sd[n - 1] = 2 * un - 2;
  R(coll_all_to_allv(buf, sc, sd, out, rc, rd, (coll_dtype)-1, comm, NULL), "coll_all_to_allv",
    "dtype");

  R(coll_gather(buf, out, 2, COLL_FLOAT32, n, comm, NULL), "coll_gather", "root");
  R(coll_gather(buf, out, 2, COLL_FLOAT32, -1, comm, NULL), "coll_gather", "root");
  R(coll_gather(NULL, out, 2, COLL_FLOAT32, 0, comm, NULL), "coll_gather", "sendbuf");
  if (rank == 0) {
    R(coll_gather(buf, NULL, 2, COLL_FLOAT32, 0, comm, NULL), "coll_gather", "recvbuf");
    R(coll_gather(buf + 1, buf, 2, COLL_FLOAT32, 0, comm, NULL), "coll_gather", "overlap");
  }
  R(coll_scatter(buf, out, 2, COLL_FLOAT32, n, comm, NULL), "coll_scatter", "root");
  R(coll_scatter(buf, NULL, 2, COLL_FLOAT32, 0, comm, NULL), "coll_scatter", "recvbuf");
  R(coll_scatter(buf, out, SIZE_MAX / 2, COLL_FLOAT32, 0, comm, NULL), "coll_scatter", "overflows");
  if (rank == 0) {
    R(coll_scatter(NULL, out, 2, COLL_FLOAT32, 0, comm, NULL), "coll_scatter", "sendbuf");
    R(coll_scatter(buf, buf + 1, 2, COLL_FLOAT32, 0, comm, NULL), "coll_scatter", "overlap");
  }
#undef R
  /* Nothing was sent: the communicator still works, for every kind. */
  float g[64];
  for (int i = 0; i < 2 * n; i++) buf[i] = (float)(100 * rank + i);
  if (coll_all_to_all(buf, out, 2, COLL_FLOAT32, comm, NULL) != COLL_OK ||
      out[0] != (float)(2 * rank) || out[2 * n - 1] != (float)(100 * (n - 1) + 2 * rank + 1))
    f += t_failf("rank %d: all_to_all after the refusals: %s", rank, coll_comm_last_error(comm));
  if (coll_gather(buf, rank == 0 ? g : NULL, 2, COLL_FLOAT32, 0, comm, NULL) != COLL_OK ||
      (rank == 0 && g[2 * n - 1] != (float)(100 * (n - 1) + 1)))
    f += t_failf("rank %d: gather after the refusals: %s", rank, coll_comm_last_error(comm));
  if (coll_scatter(rank == 0 ? buf : NULL, g, 2, COLL_FLOAT32, 0, comm, NULL) != COLL_OK ||
      g[1] != (float)(2 * rank + 1))
    f += t_failf("rank %d: scatter after the refusals: %s", rank, coll_comm_last_error(comm));
  return f ? 1 : 0;
}

Test(alltoall, bad_arguments_are_refused, .timeout = 120) {
  char why[256];
  for (int n = 1; n <= 3; n++) {
    int rc = t_launch(n, bad_args, NULL, 60000, why, sizeof why);
    cr_assert_eq(rc, 0, "n=%d: %s", n, why);
  }
}

/* The tuner's own choice on coll_mem_alloc buffers, in place and not, at sizes where
 * several run paths are candidates (2 ranks, 1 MiB: mapped and direct; in place both
 * decline and the schedule runs).  Once a row that declined was offered again by the
 * next choice and the call spun for ever: every row that declined stays declined. */
static int auto_on_windows(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  size_t count = (1u << 20) / 4 / (size_t)n, tot = count * (size_t)n;
  float *a = NULL, *b = NULL;
  if (coll_mem_alloc(comm, tot * 4, (void **)&a) != COLL_OK ||
      coll_mem_alloc(comm, tot * 4, (void **)&b) != COLL_OK)
    return t_failf("rank %d: coll_mem_alloc: %s", rank, coll_comm_last_error(comm));
  for (int in_place = 0; in_place < 2; in_place++) {
    for (size_t i = 0; i < tot; i++) a[i] = (float)(rank * 1000000 + (int)i);
    float *recv = in_place ? a : b;
    if (coll_all_to_all(a, recv, count, COLL_FLOAT32, comm, NULL) != COLL_OK)
      return t_failf("rank %d: all_to_all: %s", rank, coll_comm_last_error(comm));
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < count; i++) {
        float want = (float)(q * 1000000 + (int)((size_t)rank * count + i));
        if (recv[(size_t)q * count + i] != want)
          return t_failf("rank %d (%s): element %zu of block %d is %g, want %g", rank,
                         in_place ? "in place" : "out of place", i, q,
                         (double)recv[(size_t)q * count + i], (double)want);
      }
  }
  if (coll_mem_free(comm, a) != COLL_OK || coll_mem_free(comm, b) != COLL_OK)
    return t_failf("rank %d: coll_mem_free: %s", rank, coll_comm_last_error(comm));
  return 0;
}

Test(alltoall, auto_choice_on_windows_in_and_out_of_place, .timeout = 120) {
  for (int n = 2; n <= 3; n++) {
    char why[256];
    int rc = t_launch(n, auto_on_windows, NULL, 60000, why, sizeof why);
    cr_assert_eq(rc, 0, "%d ranks: %s", n, why);
  }
}
