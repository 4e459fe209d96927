/* test_collectives.c — the correctness matrix over the real shared-memory transport.
 *
 * Every collective × dtype × op × in-place/out-of-place × N ∈ {1,2,3,4,5,8} × counts
 * {0, 1, N-1, N+1, a prime, one just over a FIFO slot, a few MiB} × every root.  Each
 * rank generates every rank's input from (seed, rank, index), so it can compute the
 * exact expected output on its own, independently of the library, and checks all of
 * its output elements.  For float all-reduce it also checks that every rank holds the
 * same bits (a hash of the output is all-gathered and compared).
 *
 * Reference arithmetic: integers exactly, with wrap-around, in the unsigned type;
 * floats in double, compared with a tolerance of (N+1)·ε·Σ|xᵢ| (sum/avg; ε of the dtype,
 * since the ring rounds once per hop) or (N+1)·ε·|ref| (prod on inputs near 1);
 * min/max must be exact.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "coll_trace.h"
#include "coll_test.h"
#include "shm.h"
#include "shm_wait.h"

/* ---- inputs --------------------------------------------------------------------- */

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

/* A float that is exact in every float type: a multiple of 1/8 in [-8, 8) for sums
 * (non-integer), near 1 for products. */
static double fval(coll_op op, int rank, size_t i, uint64_t seed) {
  uint64_t h = mix(seed ^ mix((uint64_t)rank * 0x9e37u + i));
  if (op == COLL_PROD)
    return (h % 2) ? 1.0 + (double)(h >> 8 & 3) / 8 : 1.0 - (double)(h >> 8 & 3) / 16;
  return ((double)(h % 128) - 64) / 8;
}
static uint64_t ival(int rank, size_t i, uint64_t seed) {
  return mix(seed ^ mix((uint64_t)rank * 0x9e37u + i) ^ 0xabcdef);
}

/* Independent half/bfloat16 encoders for the exactly representable inputs above. */
static uint16_t to_bf16(double d) {
  float f = (float)d;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}
static uint16_t to_half(double d) {
  if (d == 0) return 0;
  uint16_t sign = d < 0 ? 0x8000 : 0;
  d = fabs(d);
  int e;
  double m = frexp(d, &e); /* d = m·2^e, m in [0.5,1) */
  /* normal half: value = (1 + f/1024)·2^(E-15) */
  int E = e - 1 + 15;
  uint16_t f = (uint16_t)lround((m * 2 - 1) * 1024);
  return (uint16_t)(sign | (uint16_t)(E << 10) | f);
}
static double from_half(uint16_t h) {
  int e = h >> 10 & 31, f = h & 1023;
  double v = e == 0 ? ldexp(f, -24) : e == 31 ? (f ? NAN : INFINITY) : ldexp(1024 + f, e - 25);
  return (h & 0x8000) ? -v : v;
}
static double from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static bool is_float(coll_dtype d) { return d >= COLL_FLOAT16; }

/* Writes rank `rank`'s input element i (one element, at dst). */
static void gen1(uint8_t *dst, coll_dtype d, coll_op op, int rank, size_t i, uint64_t seed) {
  if (is_float(d)) {
    double v = fval(op, rank, i, seed);
    uint16_t h;
    float f;
    switch (d) {
    case COLL_FLOAT16:
      h = to_half(v);
      memcpy(dst, &h, 2);
      break;
    case COLL_BFLOAT16:
      h = to_bf16(v);
      memcpy(dst, &h, 2);
      break;
    case COLL_FLOAT32:
      f = (float)v;
      memcpy(dst, &f, 4);
      break;
    default: memcpy(dst, &v, 8); break;
    }
    return;
  }
  uint64_t v = ival(rank, i, seed);
  if (op == COLL_PROD) v = (v % 5) - 2; /* small factors so products stay interesting */
  uint8_t b8 = (uint8_t)v;
  uint32_t b32 = (uint32_t)v;
  switch (coll_dtype_size(d)) {
  case 1: memcpy(dst, &b8, 1); break;
  case 4: memcpy(dst, &b32, 4); break;
  default: memcpy(dst, &v, 8); break;
  }
}

static void put(void *buf, size_t i, coll_dtype d, coll_op op, int rank, uint64_t seed) {
  gen1((uint8_t *)buf + i * coll_dtype_size(d), d, op, rank, i, seed);
}

static double getf(const void *buf, size_t i, coll_dtype d) {
  switch (d) {
  case COLL_FLOAT16: return from_half(((const uint16_t *)buf)[i]);
  case COLL_BFLOAT16: return from_bf16(((const uint16_t *)buf)[i]);
  case COLL_FLOAT32: return ((const float *)buf)[i];
  default: return ((const double *)buf)[i];
  }
}

/* Integer element i of rank r's input, as the dtype stores it, sign-extended or not. */
static int64_t geti_signed(uint64_t v, coll_dtype d) {
  switch (d) {
  case COLL_INT8: return (int8_t)v;
  case COLL_UINT8: return (uint8_t)v;
  case COLL_INT32: return (int32_t)v;
  case COLL_UINT32: return (uint32_t)v;
  case COLL_INT64: return (int64_t)v;
  default: return (int64_t)v;
  }
}
static uint64_t mask_of(coll_dtype d) {
  size_t es = coll_dtype_size(d);
  return es == 8 ? ~0ull : (1ull << (8 * es)) - 1;
}
static uint64_t geti_raw(const void *buf, size_t i, coll_dtype d) {
  switch (coll_dtype_size(d)) {
  case 1: return ((const uint8_t *)buf)[i];
  case 4: return ((const uint32_t *)buf)[i];
  default: return ((const uint64_t *)buf)[i];
  }
}

static double eps_of(coll_dtype d) {
  switch (d) {
  case COLL_FLOAT16: return ldexp(1, -10);
  case COLL_BFLOAT16: return ldexp(1, -7);
  case COLL_FLOAT32: return ldexp(1, -23);
  default: return ldexp(1, -52);
  }
}

/* Checks out[i] against the reduction of element `src_i` over ranks; returns true if ok. */
static bool check_reduced(const void *out, size_t i, size_t src_i, coll_dtype d, coll_op op, int n,
                          uint64_t seed, char *msg, size_t mlen) {
  if (is_float(d)) {
    double ref = op == COLL_PROD ? 1 : op == COLL_MIN ? INFINITY : op == COLL_MAX ? -INFINITY : 0;
    double mag = 0;
    for (int r = 0; r < n; r++) {
      double x = fval(op, r, src_i, seed);
      switch (op) {
      case COLL_PROD: ref *= x; break;
      case COLL_MIN: ref = fmin(ref, x); break;
      case COLL_MAX: ref = fmax(ref, x); break;
      default: ref += x; mag += fabs(x);
      }
    }
    if (op == COLL_AVG) {
      ref /= n;
      mag /= n;
    }
    double got = getf(out, i, d), tol;
    if (op == COLL_MIN || op == COLL_MAX)
      tol = 0;
    else if (op == COLL_PROD)
      tol = (n + 1) * eps_of(d) * fabs(ref);
    else
      tol = (n + 1) * eps_of(d) * mag;
    if (!(fabs(got - ref) <= tol)) {
      snprintf(msg, mlen, "element %zu is %.9g, expected %.9g (tolerance %.3g)", i, got, ref, tol);
      return false;
    }
    return true;
  }
  uint64_t m = mask_of(d), acc = op == COLL_PROD ? 1 : 0;
  int64_t best = 0;
  bool is_signed = d == COLL_INT8 || d == COLL_INT32 || d == COLL_INT64;
  for (int r = 0; r < n; r++) {
    uint64_t v = ival(r, src_i, seed);
    if (op == COLL_PROD) v = (v % 5) - 2;
    v &= m;
    int64_t sv = geti_signed(v, d);
    switch (op) {
    case COLL_PROD: acc = (acc * v) & m; break;
    case COLL_MIN:
    case COLL_MAX: {
      bool better;
      if (r == 0)
        better = true;
      else if (is_signed)
        better = op == COLL_MIN ? sv < best : sv > best;
      else
        better = op == COLL_MIN ? (uint64_t)sv < (uint64_t)best : (uint64_t)sv > (uint64_t)best;
      if (better) best = sv;
      break;
    }
    default: acc = (acc + v) & m;
    }
  }
  uint64_t want;
  if (op == COLL_MIN || op == COLL_MAX)
    want = (uint64_t)best & m;
  else if (op == COLL_AVG) {
    if (is_signed)
      want = (uint64_t)(geti_signed(acc, d) / n) & m;
    else
      want = (acc / (uint64_t)n) & m;
  } else
    want = acc;
  uint64_t got = geti_raw(out, i, d);
  if (got != want) {
    snprintf(msg, mlen, "element %zu is %#llx, expected %#llx", i, (unsigned long long)got,
             (unsigned long long)want);
    return false;
  }
  return true;
}

/* Element i equals rank r's input element j (for broadcast and all-gather). */
static bool check_copy(const void *out, size_t i, coll_dtype d, int r, size_t j, uint64_t seed,
                       char *msg, size_t mlen) {
  uint8_t want[8];
  size_t es = coll_dtype_size(d);
  gen1(want, d, COLL_SUM, r, j, seed);
  if (memcmp((const uint8_t *)out + i * es, want, es) != 0) {
    snprintf(msg, mlen, "element %zu does not hold rank %d's element %zu", i, r, j);
    return false;
  }
  return true;
}

/* ---- one collective call, checked ------------------------------------------------ */

typedef struct {
  int kind; /* 0 all_reduce 1 reduce_scatter 2 all_gather 3 broadcast 4 reduce 5 sendrecv */
  coll_dtype d;
  coll_op op;
  int in_place, root;
  size_t count;
  uint64_t seed;
} call;

static const char *kind_name[] = {"all_reduce", "reduce_scatter", "all_gather",
                                  "broadcast",  "reduce",         "sendrecv"};

static uint64_t fnv_bytes(const void *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
  return h;
}

/* Buffers are sized for the largest call and reused (allocated once per rank). */
typedef struct {
  uint8_t *a, *b;
  size_t cap;
  bool mapped;      /* from coll_mem_alloc: every call but sendrecv must take the mapped path */
  coll_algo forced; /* COLL_ALGO's row: every call it can serve must have run on it */
} bufs;

/* The kind numbers of this file as the library's collectives. */
static const coll_coll_kind kind_coll[] = {COLL_COLL_ALL_REDUCE, COLL_COLL_REDUCE_SCATTER,
                                           COLL_COLL_ALL_GATHER, COLL_COLL_BROADCAST,
                                           COLL_COLL_REDUCE,     COLL_COLL_SENDRECV};

static int run_call(coll_comm_t comm, int rank, int n, const call *c, bufs *B) {
  size_t es = coll_dtype_size(c->d), cnt = c->count;
  size_t in_len = cnt, out_len = cnt;
  if (c->kind == 1) in_len = cnt * (size_t)n;
  if (c->kind == 2) out_len = cnt * (size_t)n;
  uint8_t *send = B->a, *recv = B->b;
  if (c->in_place) {
    if (c->kind == 1) {
      send = B->a;
      recv = B->a + (size_t)rank * cnt * es;
    } else if (c->kind == 2) {
      recv = B->a;
      send = B->a + (size_t)rank * cnt * es;
    } else
      recv = send;
  }
  memset(recv, 0xA5, out_len * es);
  for (size_t i = 0; i < in_len; i++) put(send, i, c->d, c->op, rank, c->seed);
  coll_result r = COLL_OK;
  switch (c->kind) {
  case 0: r = coll_all_reduce(send, recv, cnt, c->d, c->op, comm, NULL); break;
  case 1: r = coll_reduce_scatter(send, recv, cnt, c->d, c->op, comm, NULL); break;
  case 2: r = coll_all_gather(send, recv, cnt, c->d, comm, NULL); break;
  case 3: r = coll_broadcast(send, recv, cnt, c->d, c->root, comm, NULL); break;
  case 4:
    r = coll_reduce(send, rank == c->root ? recv : NULL, cnt, c->d, c->op, c->root, comm, NULL);
    break;
  case 5:
    r = coll_sendrecv(send, cnt, (rank + 1) % n, recv, cnt, (rank + n - 1) % n, c->d, comm, NULL);
    break;
  }
  char what[160], msg[200];
  snprintf(what, sizeof what, "%s %s %s %s n=%d count=%zu root=%d", kind_name[c->kind],
           coll_dtype_name(c->d), coll_op_name(c->op), c->in_place ? "in-place" : "out-of-place", n,
           cnt, c->root);
  if (r != COLL_OK)
    return t_failf("rank %d: %s returned %s: %s", rank, what, coll_result_string(r),
                   coll_comm_last_error(comm));
  if (B->mapped && n > 1 && c->kind != 5 && cnt > 0) {
    const char *ran = coll_comm_last_algo(comm);
    if (!ran || strcmp(ran, "mapped") != 0)
      return t_failf("rank %d: %s ran %s, not the mapped path", rank, what, ran ? ran : "?");
  }
  /* A forced row must really have run every call it can serve: the matrix checks that
   * row, not a fallback (mapped: its own check above, which also needs the buffers). */
  if (B->forced != COLL_ALGO_AUTO && !B->mapped && n > 1 && c->kind != 5 && cnt > 0) {
    coll_work w = {.coll = kind_coll[c->kind], .count = cnt, .dtype = c->d};
    const char *ran = coll_comm_last_algo(comm), *want = coll_algo_name(B->forced);
    if (coll_algo_usable(coll_algo_get(B->forced), comm, &w, es) &&
        (!ran || strcmp(ran, want) != 0))
      return t_failf("rank %d: %s ran %s, not COLL_ALGO=%s", rank, what, ran ? ran : "?", want);
  }
  for (size_t i = 0; i < out_len; i++) {
    bool ok = true;
    switch (c->kind) {
    case 0: ok = check_reduced(recv, i, i, c->d, c->op, n, c->seed, msg, sizeof msg); break;
    case 1:
      ok = check_reduced(recv, i, (size_t)rank * cnt + i, c->d, c->op, n, c->seed, msg, sizeof msg);
      break;
    case 2:
      ok = check_copy(recv, i, c->d, (int)(i / cnt), i % cnt, c->seed, msg, sizeof msg);
      break;
    case 3: ok = check_copy(recv, i, c->d, c->root, i, c->seed, msg, sizeof msg); break;
    case 4:
      if (rank != c->root) return 0;
      ok = check_reduced(recv, i, i, c->d, c->op, n, c->seed, msg, sizeof msg);
      break;
    case 5: ok = check_copy(recv, i, c->d, (rank + n - 1) % n, i, c->seed, msg, sizeof msg); break;
    }
    if (!ok) return t_failf("rank %d: %s: %s", rank, what, msg);
  }
  /* Every rank must hold the same bits after a float all-reduce. */
  if (c->kind == 0 && is_float(c->d) && n > 1) {
    uint64_t h = fnv_bytes(recv, out_len * es), *all = calloc((size_t)n, 8);
    r = coll_all_gather(&h, all, 1, COLL_UINT64, comm, NULL);
    if (r != COLL_OK) {
      free(all);
      return t_failf("rank %d: hash gather failed", rank);
    }
    for (int q = 0; q < n; q++)
      if (all[q] != h) {
        free(all);
        return t_failf("rank %d: %s: rank %d holds different bits", rank, what, q);
      }
    free(all);
  }
  return 0;
}

/* ---- the matrix ------------------------------------------------------------------ */


typedef struct {
  bool big;       /* run the few-MiB part instead of the small counts */
  unsigned kinds; /* bit k: run call kind k (0: every kind) */
  bool mapped;    /* buffers from coll_mem_alloc (COLL_ALGO=mapped) */
  int forced;     /* the table row COLL_ALGO forces (COLL_ALGO_AUTO: none) */
} matrix_arg;

static int matrix(coll_comm_t comm, int rank, int n, void *varg) {
  const matrix_arg *ma = varg;
  size_t big_bytes = 3u << 20; /* a few MiB per rank buffer */
  bufs B;
  B.cap = (ma->big ? big_bytes + 64 : (size_t)70000 * 8) * (size_t)n + 4096;
  B.mapped = ma->mapped;
  B.forced = (coll_algo)ma->forced;
  if (ma->mapped) {
    void *a = NULL, *b = NULL;
    coll_result r = coll_mem_alloc(comm, B.cap, &a);
    if (r == COLL_OK) r = coll_mem_alloc(comm, B.cap, &b);
    if (r != COLL_OK)
      return t_failf("rank %d: coll_mem_alloc: %s", rank, coll_comm_last_error(comm));
    B.a = a, B.b = b;
  } else {
    B.a = malloc(B.cap);
    B.b = malloc(B.cap);
  }
  memset(B.a, 0, B.cap);
  memset(B.b, 0, B.cap);
  uint64_t seed = 12345;
  int fails = 0;
  for (int kind = 0; kind <= 5; kind++) {
    if (ma->kinds && !(ma->kinds & (1u << kind))) continue;
    for (int d = 0; d < COLL_NUM_DTYPES; d++) {
      bool reducing = kind == 0 || kind == 1 || kind == 4;
      for (int op = 0; op < (reducing ? COLL_NUM_OPS : 1); op++) {
        size_t es = coll_dtype_size((coll_dtype)d);
        size_t counts[8], nc = 0;
        /* Under ASan+UBSan (4-10x slower) one dtype per element size for a forced row
         * and for the few-MiB part: what they add is schedules, slicing and pipelining,
         * which depend on the element's size, not its kind.  Every dtype's kernels, with
         * their tails, run under the sanitizers in the tuner's small-count matrix
         * (n*_small); the plain build runs everything with every dtype. */
        bool one_per_size = d == COLL_INT8 || d == COLL_FLOAT16 || d == COLL_FLOAT32 ||
                            d == COLL_FLOAT64;
        if (T_SANITIZED && (ma->forced != COLL_ALGO_AUTO || ma->big) && !one_per_size) continue;
        if (ma->big) {
          /* Big buffers: every dtype with sum and avg, every op on float32. */
          if (reducing && op != COLL_SUM && op != COLL_AVG && d != COLL_FLOAT32) continue;
          size_t c = big_bytes / es + 3;
          if (kind == 1 || kind == 2) c = c / (size_t)n + 1;
          counts[nc++] = c;
        } else {
          counts[nc++] = 0;
          counts[nc++] = 1;
          if (n > 2) counts[nc++] = (size_t)n - 1;
          counts[nc++] = (size_t)n + 1;
          counts[nc++] = 1031;
          counts[nc++] = 65536 / es + 7; /* just over one FIFO slot */
        }
        for (int ip = 0; ip < (kind == 5 ? 1 : 2); ip++)
          for (size_t ci = 0; ci < nc; ci++) {
            bool rooted = kind == 3 || kind == 4;
            int nroots = rooted ? (ma->big ? 1 : n) : 1;
            for (int root = 0; root < nroots; root++) {
              call c = {.kind = kind,
                        .d = (coll_dtype)d,
                        .op = (coll_op)op,
                        .in_place = ip,
                        .root = rooted && ma->big ? n - 1 : root,
                        .count = counts[ci],
                        .seed = seed++};
              if (run_call(comm, rank, n, &c, &B)) {
                if (++fails >= 3) goto out;
              }
            }
          }
      }
    }
  }
out:
  if (ma->mapped) {
    if (fails) return 1; /* the peers may not reach the (collective) free */
    if (coll_mem_free(comm, B.a) != COLL_OK || coll_mem_free(comm, B.b) != COLL_OK)
      return t_failf("rank %d: coll_mem_free: %s", rank, coll_comm_last_error(comm));
    return 0;
  }
  free(B.a);
  free(B.b);
  return fails ? 1 : 0;
}

static void run_matrix_kinds(int n, bool big, const char *algo, unsigned kinds) {
  bool known = false;
  coll_algo forced = algo ? coll_algo_from_name(algo, &known) : COLL_ALGO_AUTO;
  matrix_arg a = {.big = big,
                  .kinds = kinds,
                  .mapped = algo && strcmp(algo, "mapped") == 0,
                  .forced = known ? (int)forced : COLL_ALGO_AUTO};
  char why[256];
  /* The ranks are forked by t_launch and read COLL_ALGO at every call. */
  if (algo) cr_assert_eq(setenv("COLL_ALGO", algo, 1), 0);
  int rc = t_launch(n, matrix, &a, 600000, why, sizeof why);
  if (algo) unsetenv("COLL_ALGO");
  cr_assert_eq(rc, 0, "matrix on %d ranks (%s, COLL_ALGO=%s): %s", n,
               big ? "few MiB" : "small counts", algo ? algo : "unset", why);
  T_ASSERT_NO_LEFTOVERS("after the job");
}

static void run_matrix(int n, bool big) { run_matrix_kinds(n, big, NULL, 0); }

Test(collectives, n1_small, .timeout = 300) { run_matrix(1, false); }
Test(collectives, n2_small, .timeout = 300) { run_matrix(2, false); }
Test(collectives, n3_small, .timeout = 300) { run_matrix(3, false); }
Test(collectives, n4_small, .timeout = 300) { run_matrix(4, false); }
Test(collectives, n5_small, .timeout = 300) { run_matrix(5, false); }
Test(collectives, n8_small, .timeout = 400) { run_matrix(8, false); }
Test(collectives, n1_big, .timeout = 300) { run_matrix(1, true); }
Test(collectives, n2_big, .timeout = 300) { run_matrix(2, true); }
Test(collectives, n3_big, .timeout = 300) { run_matrix(3, true); }
Test(collectives, n4_big, .timeout = 300) { run_matrix(4, true); }
Test(collectives, n5_big, .timeout = 300) { run_matrix(5, true); }
Test(collectives, n8_big, .timeout = 400) { run_matrix(8, true); }

/* The few-MiB matrix with every call's final copies streamed (copy.c: COLL_NT_BYTES=1 in
 * place of 16 MiB), in place too where the output is never an input (broadcast,
 * all-gather): the streamed stores must land before the call completes, on every rank. */
static void run_matrix_streamed(int n) {
  cr_assert_eq(setenv("COLL_NT_BYTES", "1", 1), 0);
  run_matrix(n, true);
  unsetenv("COLL_NT_BYTES");
}
Test(collectives, n2_big_streamed, .timeout = 300) { run_matrix_streamed(2); }
Test(collectives, n3_big_streamed, .timeout = 300) { run_matrix_streamed(3); }

/* ---- every row of the algorithm table forced through COLL_ALGO ------------------------
 * The same matrix, row by row of the table (algo/algo.h) — read from the table, so a row
 * added there is tested here — for the collectives the row serves (kinds 0 all-reduce,
 * 1 reduce-scatter, 2 all-gather, 3 broadcast, 4 reduce); run_call checks that every
 * call the row can serve ran on it.  Small counts for N = 1..8; the few-MiB part for
 * two N (one for rd, which moves n·log2(N) bytes per rank).  The mapped row runs on
 * coll_mem_alloc buffers (run_matrix_kinds). */
#define K(k) (1u << (k))
static unsigned row_kinds(coll_algo a) {
  unsigned k = 0;
  for (int i = 0; i < 5; i++)
    if (coll_algo_serves(a, kind_coll[i], 4)) k |= K(i);
  return k;
}
static void forced_small(coll_algo a) {
  for (int n = 1; n <= 8; n++) {
    /* Under ASan+UBSan N = 6 and 7 are left to the plain build: 3 and 5 already take
     * the paths of N that is not a power of two, 8 the largest. */
    if (T_SANITIZED && (n == 6 || n == 7)) continue;
    run_matrix_kinds(n, false, coll_algo_name(a), row_kinds(a));
  }
}
static void forced_big(coll_algo a, int n1, int n2) {
  run_matrix_kinds(n1, true, coll_algo_name(a), row_kinds(a));
  /* Under ASan+UBSan the first N only (the one that is not a power of two, where there
   * is one): the second runs the same code at another size, in the plain build. */
  if (n2 && !T_SANITIZED) run_matrix_kinds(n2, true, coll_algo_name(a), row_kinds(a));
}

/* Every row of the table is forced somewhere: here for the five collectives, in
 * test_alltoall.c (forced_pairwise_and_linear, forced_oneshot, forced_direct, mapped)
 * for all-to-all, gather and scatter.  A row added to the table without a forced test
 * fails here. */
Test(collectives, every_table_row_is_forced) {
  static const coll_algo here[] = {COLL_ALGO_RING,   COLL_ALGO_TREE,    COLL_ALGO_RD,
                                   COLL_ALGO_RHD,    COLL_ALGO_ONESHOT, COLL_ALGO_DIRECT,
                                   COLL_ALGO_MAPPED, COLL_ALGO_HIER,    COLL_ALGO_FANOUT,
                                   COLL_ALGO_STAGED};
  static const coll_algo in_alltoall[] = {COLL_ALGO_PAIRWISE, COLL_ALGO_LINEAR, COLL_ALGO_ONESHOT,
                                          COLL_ALGO_DIRECT, COLL_ALGO_MAPPED};
  for (int a = 1; a < COLL_NUM_ALGOS; a++) {
    /* The device rows run on device buffers only: test_cuda's matrices force each of them
     * (matrix_*_ranks_dev_oneshot / _dev_twoshot), on a machine with a GPU. */
    if (coll_algo_get((coll_algo)a)->device_only) continue;
    bool tested = false;
    for (size_t i = 0; i < sizeof here / sizeof *here; i++)
      tested |= here[i] == (coll_algo)a && row_kinds((coll_algo)a) != 0;
    for (size_t i = 0; i < sizeof in_alltoall / sizeof *in_alltoall; i++)
      tested |= in_alltoall[i] == (coll_algo)a &&
                (coll_algo_serves((coll_algo)a, COLL_COLL_ALL_TO_ALL, 4) ||
                 coll_algo_serves((coll_algo)a, COLL_COLL_GATHER, 4));
    cr_assert(tested, "row %s of the algorithm table is not forced by any matrix",
              coll_algo_name((coll_algo)a));
  }
}

Test(collectives, ring_small_n1_to_8, .timeout = 600) { forced_small(COLL_ALGO_RING); }
/* hier needs several hosts with the same number of ranks: the launcher emulates hosts of
 * two ranks (COLL_LAUNCH_RANKS_PER_HOST: shm inside, tcp across), so N = 4 and 6 run it
 * (run_call checks they did) and N = 5 (2 + 2 + 1) runs the tuner's choice instead; on
 * one host (N = 1..3 here would be one or unequal hosts) it never runs. */
Test(collectives, hier_hosts_of_two, .timeout = 600) {
  setenv("COLL_LAUNCH_RANKS_PER_HOST", "2", 1);
  for (int n = 4; n <= 6; n++) run_matrix_kinds(n, false, "hier", row_kinds(COLL_ALGO_HIER));
  run_matrix_kinds(4, true, "hier", row_kinds(COLL_ALGO_HIER));
  unsetenv("COLL_LAUNCH_RANKS_PER_HOST");
}
Test(collectives, tree_small_n1_to_8, .timeout = 600) { forced_small(COLL_ALGO_TREE); }
Test(collectives, rd_small_n1_to_8, .timeout = 600) { forced_small(COLL_ALGO_RD); }
Test(collectives, rhd_small_n1_to_8, .timeout = 600) { forced_small(COLL_ALGO_RHD); }
Test(collectives, oneshot_small_n1_to_8, .timeout = 600) { forced_small(COLL_ALGO_ONESHOT); }
Test(collectives, direct_small_n1_to_8, .timeout = 600) { forced_small(COLL_ALGO_DIRECT); }
Test(collectives, mapped_small_n1_to_8, .timeout = 600) { forced_small(COLL_ALGO_MAPPED); }
Test(collectives, fanout_small_n1_to_8, .timeout = 600) { forced_small(COLL_ALGO_FANOUT); }
Test(collectives, staged_small_n1_to_8, .timeout = 600) { forced_small(COLL_ALGO_STAGED); }
Test(collectives, tree_big, .timeout = 600) { forced_big(COLL_ALGO_TREE, 5, 8); }
Test(collectives, rd_big, .timeout = 600) { forced_big(COLL_ALGO_RD, 3, 0); }
Test(collectives, rhd_big, .timeout = 600) { forced_big(COLL_ALGO_RHD, 5, 8); }
Test(collectives, direct_big, .timeout = 600) { forced_big(COLL_ALGO_DIRECT, 2, 0); }
Test(collectives, mapped_big, .timeout = 600) { forced_big(COLL_ALGO_MAPPED, 5, 2); }
Test(collectives, fanout_big, .timeout = 600) { forced_big(COLL_ALGO_FANOUT, 3, 2); }
Test(collectives, staged_big, .timeout = 600) { forced_big(COLL_ALGO_STAGED, 5, 2); }
/* Streamed, the staged row stages up to its whole ring ahead of what it gathers
 * (staged.c): the few-MiB matrix with every call streamed (COLL_NT_BYTES=1). */
Test(collectives, staged_big_streamed, .timeout = 600) {
  cr_assert_eq(setenv("COLL_NT_BYTES", "1", 1), 0);
  forced_big(COLL_ALGO_STAGED, 3, 4);
  unsetenv("COLL_NT_BYTES");
}

/* COLL_ALGO=tree cannot serve reduce-scatter (nor all-gather): the call falls back to
 * the ring (with a warning) and still gives the right answer. */
Test(collectives, tree_forced_on_reduce_scatter_falls_back, .timeout = 300) {
  for (int n = 3; n <= 4; n++) run_matrix_kinds(n, false, "tree", K(1) | K(2));
}

/* An unknown name is refused the same way: the ring runs. */
Test(collectives, unknown_algo_falls_back, .timeout = 300) {
  run_matrix_kinds(3, false, "no-such-algorithm", K(0));
}

/* ---- the fan-out ring across its own end ----------------------------------------------
 * A broadcast longer than the root's ring (algo/fanout.c: 4 MiB) makes the root wait,
 * mid-call, for the slowest reader to leave a place before writing it again; sizes that
 * are not whole chunks move every later call's start, and large calls take larger chunks
 * (9 MiB: 128 KiB, 33 MiB: 512 KiB) that must start on their own multiple.  Roots,
 * placements and sizes alternate, and every byte is checked. */
static int fanout_laps(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  static const size_t sizes[] = {(9u << 20) + 5, 1, (33u << 20) + 3, (4u << 20) + 64, 777};
  size_t cap = (33u << 20) + 64;
  uint8_t *a = malloc(cap), *b = malloc(cap);
  if (!a || !b) return t_failf("rank %d: out of memory", rank);
  int fails = 0;
  for (int k = 0; k < 10 && !fails; k++) {
    size_t len = sizes[k % 5];
    int root = (k * 2 + 1) % n;
    bool in_place = k % 3 == 0;
    for (size_t i = 0; i < len; i++) a[i] = rank == root ? (uint8_t)(i * 7 + (size_t)k) : 0xee;
    memset(b, 0xee, len);
    uint8_t *out = in_place ? a : b;
    if (coll_broadcast(a, out, len, COLL_INT8, root, comm, NULL) != COLL_OK)
      return t_failf("rank %d: broadcast %d: %s", rank, k, coll_comm_last_error(comm));
    if (n > 1 && strcmp(coll_comm_last_algo(comm), "fanout") != 0)
      return t_failf("rank %d: broadcast %d ran on %s", rank, k, coll_comm_last_algo(comm));
    for (size_t i = 0; i < len && !fails; i++)
      if (out[i] != (uint8_t)(i * 7 + (size_t)k))
        fails = t_failf("rank %d: broadcast %d (root %d, %zu bytes, %s): byte %zu is %u", rank, k,
                        root, len, in_place ? "in place" : "out of place", i, out[i]);
  }
  free(a);
  free(b);
  return fails;
}

Test(collectives, fanout_calls_longer_than_the_ring, .timeout = 300) {
  char why[256];
  cr_assert_eq(setenv("COLL_ALGO", "fanout", 1), 0);
  for (int n = 2; n <= 4; n++) {
    int rc = t_launch(n, fanout_laps, NULL, 240000, why, sizeof why);
    cr_assert_eq(rc, 0, "%d ranks: %s", n, why);
  }
  unsetenv("COLL_ALGO");
  T_ASSERT_NO_LEFTOVERS("after the job");
}

/* ---- the staged rows and the fan-out broadcast on the same rings ----------------------
 * All three write a rank's ring (algo/staged.c, algo/fanout.c) and count its places the
 * same way: calls of one may follow calls of another, longer than the ring, of sizes
 * that are not whole chunks, in place and out of place, with every rank's ring moved by
 * a different amount (each broadcast moves its root's only; all-gather and all-reduce
 * chunks differ).  Integer sums, so every element is checked exactly.  The calls go
 * all-reduce, all-gather, all-reduce, broadcast, round and round. */
static int32_t lap_value(size_t i, int k, int rank) {
  return (int32_t)(i * 3 + (size_t)k) * (rank + 1);
}

static int shared_ring_laps(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  static const size_t counts[] = {(9u << 18) + 5, 1, (1u << 20) + 16, 3, (5u << 18) + 1};
  size_t cap = ((9u << 18) + 64) * (size_t)n;
  int32_t *a = malloc(cap * 4), *b = malloc(cap * 4);
  if (!a || !b) return t_failf("rank %d: out of memory", rank);
  int fails = 0;
  for (int k = 0; k < 16 && !fails; k++) {
    size_t len = counts[k % 5];
    bool in_place = k % 3 == 1, bcast = k % 4 == 3, gather = k % 4 == 1;
    int root = k % n;
    const char *want = bcast ? "fanout" : "staged";
    /* The row for this call (COLL_ALGO is read once, when the communicator is made). */
    comm->forced = bcast ? COLL_ALGO_FANOUT : COLL_ALGO_STAGED;
    size_t total = gather ? len * (size_t)n : len;
    for (size_t i = 0; i < total; i++) a[i] = b[i] = -7;
    int32_t *in = gather && in_place ? a + (size_t)rank * len : a, *out = in_place ? a : b;
    for (size_t i = 0; i < len; i++) in[i] = lap_value(i, k, rank);
    coll_result r = bcast    ? coll_broadcast(in, out, len, COLL_INT32, root, comm, NULL)
                    : gather ? coll_all_gather(in, out, len, COLL_INT32, comm, NULL)
                             : coll_all_reduce(in, out, len, COLL_INT32, COLL_SUM, comm, NULL);
    if (r != COLL_OK) return t_failf("rank %d: call %d: %s", rank, k, coll_comm_last_error(comm));
    if (n > 1 && strcmp(coll_comm_last_algo(comm), want) != 0)
      return t_failf("rank %d: call %d ran on %s", rank, k, coll_comm_last_algo(comm));
    for (size_t i = 0; i < total && !fails; i++) {
      size_t e = gather ? i % len : i;
      int32_t expect = bcast    ? lap_value(e, k, root)
                       : gather ? lap_value(e, k, (int)(i / len))
                                : (int32_t)(e * 3 + (size_t)k) * (n * (n + 1) / 2);
      if (out[i] != expect)
        fails = t_failf("rank %d: call %d (%s, %zu elements, %s): element %zu is %d, not %d", rank,
                        k,
                        bcast    ? "broadcast"
                        : gather ? "all-gather"
                                 : "all-reduce",
                        len, in_place ? "in place" : "out of place", i, out[i], expect);
    }
  }
  free(a);
  free(b);
  return fails;
}

Test(collectives, staged_and_fanout_share_the_rings, .timeout = 300) {
  char why[256];
  for (int n = 2; n <= 5; n++) {
    if (T_SANITIZED && n == 4) continue; /* 2, 3 and 5 take every path */
    int rc = t_launch(n, shared_ring_laps, NULL, 240000, why, sizeof why);
    cr_assert_eq(rc, 0, "%d ranks: %s", n, why);
  }
  T_ASSERT_NO_LEFTOVERS("after the job");
}

/* A broadcast that fills the root's ring but for one chunk returns at once on the root,
 * whose next call, a staged all-reduce, stages its first chunk where the broadcast's
 * first chunk lies (staged.c's chunks are larger): it must wait for the reader to have
 * read it.  Here the reader enters the broadcast only once the root is either asleep
 * waiting for it (right) or has published that chunk without waiting (wrong: the
 * broadcast's first bytes are then the all-reduce's, and the check below sees them).
 * Both are states of the shared counters, so the order is forced, not timed.  Rank 1
 * makes its calls late on purpose, so the calls are not compared (COLL_CHECK). */
static int staged_after_full_ring(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg, (void)n;
  size_t bcast = COLL_FANOUT_BYTES - 64 * 1024, count = 1u << 18; /* 1 MiB of int32 */
  uint8_t *a = malloc(bcast);
  int32_t *x = malloc(count * 4);
  if (!a || !x) return t_failf("rank %d: out of memory", rank);
  for (size_t i = 0; i < bcast; i++) a[i] = rank == 0 ? (uint8_t)(i * 13 + 1) : 0;
  for (size_t i = 0; i < count; i++) x[i] = (int32_t)i * (rank + 1);
  coll_fanout *fo = coll_shm_fanout(&comm->view, coll_shm_ctx(comm), 0);
  if (!fo) return t_failf("rank %d: no fan-out ring for rank 0", rank);
  /* COLL_CHECK (on in debug builds) would have the root wait, before it writes, to
   * compare the broadcast with rank 1's, which is not called until the root has written. */
  comm->check = false;
  if (rank == 1) {
    uint32_t end = atomic_load(&fo->readers[1].read) + (uint32_t)bcast; /* a whole chunk */
    while (!coll_shm_reached(atomic_load(&fo->written), end)) sched_yield();
    while (atomic_load(&fo->owner_waiting) == 0 &&
           !coll_shm_reached(atomic_load(&fo->written), end + 1))
      sched_yield();
  }
  comm->forced = COLL_ALGO_FANOUT;
  if (coll_broadcast(a, a, bcast, COLL_UINT8, 0, comm, NULL) != COLL_OK)
    return t_failf("rank %d: broadcast: %s", rank, coll_comm_last_error(comm));
  comm->forced = COLL_ALGO_STAGED;
  if (coll_all_reduce(x, x, count, COLL_INT32, COLL_SUM, comm, NULL) != COLL_OK)
    return t_failf("rank %d: all-reduce: %s", rank, coll_comm_last_error(comm));
  comm->forced = COLL_ALGO_AUTO;
  int fails = 0;
  for (size_t i = 0; i < bcast && !fails; i++)
    if (a[i] != (uint8_t)(i * 13 + 1))
      fails = t_failf("rank %d: broadcast byte %zu is %u", rank, i, a[i]);
  for (size_t i = 0; i < count && !fails; i++)
    if (x[i] != (int32_t)i * 3)
      fails = t_failf("rank %d: all-reduce element %zu is %d", rank, i, x[i]);
  free(a);
  free(x);
  return fails;
}

Test(collectives, staged_waits_for_the_last_broadcasts_reader, .timeout = 120) {
  char why[256];
  int rc = t_launch(2, staged_after_full_ring, NULL, 60000, why, sizeof why);
  cr_assert_eq(rc, 0, "%s", why);
  T_ASSERT_NO_LEFTOVERS("after the job");
}
