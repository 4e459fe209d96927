/* tcp_matrix.c — see tcp_matrix.h.
 *
 * Inputs are chosen so that the exact answer is representable in every dtype used: small
 * integers for float sums, min and max (|sum| <= 4·N, exact even in bfloat16), powers of
 * two for float products, any bits for integers (wrap-around is the reference).  So every
 * result except float AVG must match bit for bit, in any reduction order; AVG may differ
 * from sum/N by the one rounding of the division.  Each rank computes every rank's input
 * from (seed, rank, index), so it needs nothing from the library to know the answer.
 */
#include "tcp_matrix.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  K_ALL_REDUCE,
  K_REDUCE_SCATTER,
  K_ALL_GATHER,
  K_BROADCAST,
  K_REDUCE,
  K_SENDRECV,
  /* TM_KINDS: what tm_call serves; the rest only tm_run */
  K_ALL_TO_ALL = TM_KINDS,
  K_ALL_TO_ALLV,
  K_GATHER,
  K_SCATTER,
  K_GROUP_P2P,
  K_N
};
static const char *kname[K_N] = {"all_reduce", "reduce_scatter", "all_gather",       "broadcast",
                                 "reduce",     "sendrecv",       "all_to_all",       "all_to_allv",
                                 "gather",     "scatter",        "grouped send/recv"};
static const coll_dtype dtypes[] = {COLL_INT32,   COLL_UINT8,   COLL_INT64,
                                    COLL_FLOAT32, COLL_FLOAT64, COLL_BFLOAT16};

static uint64_t hash3(uint64_t seed, int rank, size_t i) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ (uint64_t)rank * 0xbf58476d1ce4e5b9ull ^ (uint64_t)i;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 32);
}

static bool is_float(coll_dtype d) {
  return d == COLL_FLOAT32 || d == COLL_FLOAT64 || d == COLL_BFLOAT16;
}
static bool is_signed(coll_dtype d) { return d == COLL_INT32 || d == COLL_INT64; }

/* Rank r's input element i as a number (floats) or as raw bits (integers). */
static double fin(coll_op op, uint64_t seed, int r, size_t i) {
  uint64_t h = hash3(seed, r, i);
  if (op == COLL_PROD) {
    static const double f[4] = {1, -1, 2, 0.5};
    return f[h % 4];
  }
  return (double)(int)(h % 9) - 4;
}
static uint64_t iin(coll_op op, uint64_t seed, int r, size_t i) {
  uint64_t h = hash3(seed, r, i);
  return op == COLL_PROD ? (uint64_t)((int64_t)(h % 5) - 2) : h;
}

static void store(uint8_t *p, coll_dtype d, double fv, uint64_t iv) {
  switch (d) {
  case COLL_FLOAT32: {
    float f = (float)fv;
    memcpy(p, &f, 4);
    break;
  }
  case COLL_FLOAT64: memcpy(p, &fv, 8); break;
  case COLL_BFLOAT16: {
    float f = (float)fv;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t h = (uint16_t)(u >> 16);
    memcpy(p, &h, 2);
    break;
  }
  case COLL_UINT8: *p = (uint8_t)iv; break;
  case COLL_INT32: {
    uint32_t v = (uint32_t)iv;
    memcpy(p, &v, 4);
    break;
  }
  default: memcpy(p, &iv, 8); break;
  }
}

static void gen(uint8_t *p, coll_dtype d, coll_op op, uint64_t seed, int r, size_t i) {
  store(p, d, is_float(d) ? fin(op, seed, r, i) : 0, is_float(d) ? 0 : iin(op, seed, r, i));
}

static double loadf(const uint8_t *p, coll_dtype d) {
  switch (d) {
  case COLL_FLOAT32: {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  case COLL_FLOAT64: {
    double v;
    memcpy(&v, p, 8);
    return v;
  }
  default: {
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  }
}

/* The expected reduction of element i over n ranks, written at `want`. */
static void reduced(uint8_t *want, coll_dtype d, coll_op op, uint64_t seed, int n, size_t i) {
  if (is_float(d)) {
    double acc = fin(op, seed, 0, i);
    for (int r = 1; r < n; r++) {
      double x = fin(op, seed, r, i);
      switch (op) {
      case COLL_PROD: acc *= x; break;
      case COLL_MIN: acc = x < acc ? x : acc; break;
      case COLL_MAX: acc = x > acc ? x : acc; break;
      default: acc += x;
      }
    }
    if (op == COLL_AVG) acc /= n;
    store(want, d, acc, 0);
    return;
  }
  size_t es = coll_dtype_size(d);
  uint64_t mask = es == 8 ? ~0ull : (1ull << (8 * es)) - 1;
  int sh = 64 - 8 * (int)es;
  uint64_t acc = iin(op, seed, 0, i) & mask;
  for (int r = 1; r < n; r++) {
    uint64_t x = iin(op, seed, r, i) & mask;
    bool less = is_signed(d) ? (int64_t)(x << sh) < (int64_t)(acc << sh) : x < acc;
    switch (op) {
    case COLL_PROD: acc = (acc * x) & mask; break;
    case COLL_MIN:
      if (less) acc = x;
      break;
    case COLL_MAX:
      if (!less && x != acc) acc = x;
      break;
    default: acc = (acc + x) & mask;
    }
  }
  store(want, d, 0, acc);
}

typedef struct {
  int kind;
  coll_dtype d;
  coll_op op;
  bool in_place;
  size_t count;
  int root;
  uint64_t seed;
} tm_call_t;

static int check(const tm_call_t *c, const uint8_t *out, size_t out_len, int rank, int n) {
  size_t es = coll_dtype_size(c->d);
  uint8_t want[8];
  for (size_t i = 0; i < out_len; i++) {
    const uint8_t *got = out + i * es;
    switch (c->kind) {
    case K_ALL_REDUCE:
    case K_REDUCE: reduced(want, c->d, c->op, c->seed, n, i); break;
    case K_REDUCE_SCATTER:
      reduced(want, c->d, c->op, c->seed, n, (size_t)rank * c->count + i);
      break;
    case K_ALL_GATHER: gen(want, c->d, COLL_SUM, c->seed, (int)(i / c->count), i % c->count); break;
    case K_BROADCAST: gen(want, c->d, COLL_SUM, c->seed, c->root, i); break;
    default: gen(want, c->d, COLL_SUM, c->seed, (rank + n - 1) % n, i); break;
    }
    bool ok = memcmp(got, want, es) == 0;
    if (!ok && c->op == COLL_AVG && is_float(c->d)) {
      double g = loadf(got, c->d), w = loadf(want, c->d);
      double eps = c->d == COLL_BFLOAT16 ? 0x1p-7 : c->d == COLL_FLOAT32 ? 0x1p-23 : 0x1p-52;
      ok = fabs(g - w) <= 2 * eps * fabs(w);
    }
    if (!ok) {
      fprintf(stderr, "rank %d: %s %s %s %s n=%d count=%zu root=%d: element %zu is wrong\n", rank,
              kname[c->kind], coll_dtype_name(c->d), coll_op_name(c->op),
              c->in_place ? "in-place" : "out-of-place", n, c->count, c->root, i);
      return 1;
    }
  }
  return 0;
}

static int one(coll_comm_t comm, int rank, int n, const tm_call_t *c, uint8_t *a, uint8_t *b) {
  size_t es = coll_dtype_size(c->d), cnt = c->count;
  size_t in_len = c->kind == K_REDUCE_SCATTER ? cnt * (size_t)n : cnt;
  size_t out_len = c->kind == K_ALL_GATHER ? cnt * (size_t)n : cnt;
  uint8_t *send = a, *recv = b;
  if (c->in_place) {
    if (c->kind == K_REDUCE_SCATTER)
      recv = a + (size_t)rank * cnt * es;
    else if (c->kind == K_ALL_GATHER) {
      recv = a;
      send = a + (size_t)rank * cnt * es;
    } else
      recv = a;
  }
  memset(recv, 0x5a, out_len * es);
  for (size_t i = 0; i < in_len; i++) gen(send + i * es, c->d, c->op, c->seed, rank, i);
  coll_result r = COLL_OK;
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  switch (c->kind) {
  case K_ALL_REDUCE: r = coll_all_reduce(send, recv, cnt, c->d, c->op, comm, NULL); break;
  case K_REDUCE_SCATTER: r = coll_reduce_scatter(send, recv, cnt, c->d, c->op, comm, NULL); break;
  case K_ALL_GATHER: r = coll_all_gather(send, recv, cnt, c->d, comm, NULL); break;
  case K_BROADCAST: r = coll_broadcast(send, recv, cnt, c->d, c->root, comm, NULL); break;
  case K_REDUCE:
    r = coll_reduce(send, rank == c->root ? recv : NULL, cnt, c->d, c->op, c->root, comm, NULL);
    break;
  default: r = coll_sendrecv(send, cnt, next, recv, cnt, prev, c->d, comm, NULL); break;
  }
  if (r != COLL_OK) {
    fprintf(stderr, "rank %d: %s %s %s count=%zu returned %s: %s\n", rank, kname[c->kind],
            coll_dtype_name(c->d), coll_op_name(c->op), cnt, coll_result_string(r),
            coll_comm_last_error(comm));
    return 1;
  }
  if (c->kind == K_REDUCE && rank != c->root) return 0;
  return check(c, recv, out_len, rank, n);
}

/* ---- all-to-all(v), gather, scatter, grouped send/recv ----------------------------------
 * Element k of the block rank s sends to rank d is gen(seed, s, d*cnt + k) (all-to-all,
 * scatter's root), gen(seed, s, k) (gather), so each rank knows every block it should
 * receive.  all_to_allv's block from s to d holds v_count(cnt, s, d) elements (0, cnt/2,
 * cnt or 3cnt/2) at element d*(2cnt+1) of s's index space, packed in reverse rank order
 * with a one-element gap after each block, so displacements, zero blocks and untouched
 * gaps are all checked.  The grouped kind sends two blocks each to the next and previous
 * rank and receives the mirror, in an order that differs between odd and even ranks. */
static size_t v_count(size_t cnt, int s, int d) { return cnt * (size_t)((s + 2 * d) % 4) / 2; }

static void v_layout(size_t cnt, int n, int me, bool send, size_t *counts, size_t *displs) {
  size_t at = 0;
  for (int j = n - 1; j >= 0; j--) {
    counts[j] = send ? v_count(cnt, me, j) : v_count(cnt, j, me);
    displs[j] = at;
    at += counts[j] + 1;
  }
}

static int wrong_at(const tm_call_t *c, int rank, int n, size_t i, const char *what) {
  fprintf(stderr, "rank %d: %s %s %s n=%d count=%zu root=%d: element %zu is wrong (%s)\n", rank,
          kname[c->kind], coll_dtype_name(c->d), c->in_place ? "in-place" : "out-of-place", n,
          c->count, c->root, i, what);
  return 1;
}

static int one_more(coll_comm_t comm, int rank, int n, const tm_call_t *c, uint8_t *a, uint8_t *b) {
  size_t es = coll_dtype_size(c->d), cnt = c->count, nb = (size_t)n * cnt;
  uint8_t want[8];
  coll_result r = COLL_OK;
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  size_t sc[256], sd[256], rc[256], rd[256];
  switch (c->kind) {
  case K_ALL_TO_ALL: {
    uint8_t *recv = c->in_place ? a : b;
    memset(b, 0x5a, nb * es);
    for (size_t i = 0; i < nb; i++) gen(a + i * es, c->d, COLL_SUM, c->seed, rank, i);
    r = coll_all_to_all(a, recv, cnt, c->d, comm, NULL);
    if (r != COLL_OK) break;
    for (size_t i = 0; i < nb; i++) {
      int from = (int)(i / cnt);
      gen(want, c->d, COLL_SUM, c->seed, from, (size_t)rank * cnt + i % cnt);
      if (memcmp(recv + i * es, want, es)) return wrong_at(c, rank, n, i, "block from a peer");
    }
    return 0;
  }
  case K_ALL_TO_ALLV: {
    if (n > 256) return 0;
    v_layout(cnt, n, rank, true, sc, sd);
    v_layout(cnt, n, rank, false, rc, rd);
    size_t stride = 2 * cnt + 1, rlen = 0;
    for (int j = 0; j < n; j++) {
      for (size_t k = 0; k < sc[j]; k++)
        gen(a + (sd[j] + k) * es, c->d, COLL_SUM, c->seed, rank, (size_t)j * stride + k);
      rlen += rc[j] + 1;
    }
    memset(b, 0x5a, rlen * es);
    r = coll_all_to_allv(a, sc, sd, b, rc, rd, c->d, comm, NULL);
    if (r != COLL_OK) break;
    for (int i = 0; i < n; i++) {
      for (size_t k = 0; k < rc[i]; k++) {
        gen(want, c->d, COLL_SUM, c->seed, i, (size_t)rank * stride + k);
        if (memcmp(b + (rd[i] + k) * es, want, es))
          return wrong_at(c, rank, n, rd[i] + k, "block from a peer");
      }
      for (size_t x = 0; x < es; x++)
        if (b[(rd[i] + rc[i]) * es + x] != 0x5a)
          return wrong_at(c, rank, n, rd[i] + rc[i], "a gap between blocks was written");
    }
    return 0;
  }
  case K_GATHER: {
    bool root = rank == c->root;
    memset(b, 0x5a, nb * es);
    uint8_t *send = root && c->in_place ? b + (size_t)rank * cnt * es : a;
    for (size_t k = 0; k < cnt; k++) gen(send + k * es, c->d, COLL_SUM, c->seed, rank, k);
    r = coll_gather(send, root ? b : NULL, cnt, c->d, c->root, comm, NULL);
    if (r != COLL_OK || !root) break;
    for (size_t i = 0; i < nb; i++) {
      gen(want, c->d, COLL_SUM, c->seed, (int)(i / cnt), i % cnt);
      if (memcmp(b + i * es, want, es)) return wrong_at(c, rank, n, i, "block from a rank");
    }
    return 0;
  }
  case K_SCATTER: {
    bool root = rank == c->root;
    if (root)
      for (size_t i = 0; i < nb; i++) gen(a + i * es, c->d, COLL_SUM, c->seed, rank, i);
    uint8_t *recv = root && c->in_place ? a + (size_t)rank * cnt * es : b;
    if (recv == b) memset(b, 0x5a, cnt * es);
    r = coll_scatter(root ? a : NULL, recv, cnt, c->d, c->root, comm, NULL);
    if (r != COLL_OK) break;
    for (size_t k = 0; k < cnt; k++) {
      gen(want, c->d, COLL_SUM, c->seed, c->root, (size_t)rank * cnt + k);
      if (memcmp(recv + k * es, want, es)) return wrong_at(c, rank, n, k, "the root's block");
    }
    return 0;
  }
  default: { /* K_GROUP_P2P: a[0,cnt) to next, a[cnt,2cnt) to prev; b the mirror */
    if (n < 2) return 0;
    for (size_t i = 0; i < 2 * cnt; i++) gen(a + i * es, c->d, COLL_SUM, c->seed, rank, i);
    memset(b, 0x5a, 2 * cnt * es);
    coll_group_start();
    if (rank % 2) {
      coll_recv(b, cnt, c->d, prev, comm, NULL);
      coll_recv(b + cnt * es, cnt, c->d, next, comm, NULL);
    }
    coll_send(a, cnt, c->d, next, comm, NULL);
    coll_send(a + cnt * es, cnt, c->d, prev, comm, NULL);
    if (rank % 2 == 0) {
      coll_recv(b, cnt, c->d, prev, comm, NULL);
      coll_recv(b + cnt * es, cnt, c->d, next, comm, NULL);
    }
    r = coll_group_end();
    if (r != COLL_OK) break;
    for (size_t i = 0; i < 2 * cnt; i++) {
      gen(want, c->d, COLL_SUM, c->seed, i < cnt ? prev : next, i);
      if (memcmp(b + i * es, want, es))
        return wrong_at(c, rank, n, i, i < cnt ? "from the previous rank" : "from the next rank");
    }
    return 0;
  }
  }
  if (r != COLL_OK) {
    fprintf(stderr, "rank %d: %s %s count=%zu root=%d returned %s: %s\n", rank, kname[c->kind],
            coll_dtype_name(c->d), cnt, c->root, coll_result_string(r), coll_comm_last_error(comm));
    return 1;
  }
  return 0;
}

int tm_call(coll_comm_t comm, int rank, int n, int kind, coll_dtype d, coll_op op, bool in_place,
            size_t count, int root, uint64_t seed, uint8_t *a, uint8_t *b) {
  tm_call_t c = {.kind = kind,
                 .d = d,
                 .op = op,
                 .in_place = in_place,
                 .count = count,
                 .root = root,
                 .seed = seed};
  return one(comm, rank, n, &c, a, b);
}

int tm_run(coll_comm_t comm, int rank, int n, bool big) {
  size_t cap = ((size_t)1 << 20) * (size_t)n + 4096 * 8;
  uint8_t *a = malloc(cap), *b = malloc(cap);
  if (!a || !b) {
    free(a);
    free(b);
    fprintf(stderr, "rank %d: out of memory\n", rank);
    return 1;
  }
  memset(a, 0, cap);
  memset(b, 0, cap);
  int fails = 0;
  uint64_t seed = 7;
  for (int kind = 0; kind < K_N && fails < 3; kind++)
    for (size_t di = 0; di < sizeof dtypes / sizeof *dtypes && fails < 3; di++) {
      coll_dtype d = dtypes[di];
      size_t es = coll_dtype_size(d);
      bool reducing = kind == K_ALL_REDUCE || kind == K_REDUCE_SCATTER || kind == K_REDUCE;
      for (int op = 0; op < (reducing ? 5 : 1) && fails < 3; op++) {
        if (op == COLL_AVG && !is_float(d)) continue;
        size_t counts[9], nc = 0;
        counts[nc++] = 0;
        counts[nc++] = 1;
        if (n > 2) counts[nc++] = (size_t)n - 1;
        counts[nc++] = 1031;
        counts[nc++] = 65536 / es + 7;  /* just over an shm slot */
        counts[nc++] = 262144 / es + 7; /* just over a tcp slot */
        /* ~1 MiB per rank: every dtype with sum, every op on float32 */
        if (big && (!reducing || op == COLL_SUM || d == COLL_FLOAT32)) {
          size_t c = ((size_t)1 << 20) / es + 3;
          if (kind == K_REDUCE_SCATTER || kind == K_ALL_GATHER || kind >= K_ALL_TO_ALL)
            c = c / (size_t)n + 1;
          if (kind == K_ALL_TO_ALLV || kind == K_GROUP_P2P) c = c / 2 + 1;
          counts[nc++] = c;
        }
        bool no_in_place = kind == K_SENDRECV || kind == K_ALL_TO_ALLV || kind == K_GROUP_P2P;
        for (int ip = 0; ip < (no_in_place ? 1 : 2); ip++)
          for (size_t ci = 0; ci < nc; ci++) {
            bool rooted = kind == K_BROADCAST || kind == K_REDUCE || kind == K_GATHER ||
                          kind == K_SCATTER;
            for (int ri = 0; ri < (rooted && n > 1 ? 2 : 1); ri++) {
              tm_call_t c = {.kind = kind,
                             .d = d,
                             .op = (coll_op)op,
                             .in_place = ip,
                             .count = counts[ci],
                             .root = ri ? n - 1 : 0,
                             .seed = seed++};
              fails += kind < TM_KINDS ? one(comm, rank, n, &c, a, b)
                                       : one_more(comm, rank, n, &c, a, b);
            }
          }
      }
    }
  free(a);
  free(b);
  return fails;
}
