/* test_reduce.c — the reduction kernels (reduce.c) against independent references.
 *
 * Every dtype × op is checked element by element against a scalar reference written
 * here from first principles: integers in 128-bit arithmetic reduced modulo 2^N,
 * floats in double, and float16 / bfloat16 decoded and rounded by their own frexp /
 * ldexp code (never by reduce.c's helpers).  Lengths cover empty, tails around every
 * vector width and a large odd array; dst aliases a, b, or both; a guard zone after
 * dst catches writes past n.  The half conversions are checked exhaustively where the
 * space allows (all 65536 patterns) and at every rounding boundary otherwise.
 *
 * Nothing here uses common/coll_test.c; every helper is static.
 */
#include <criterion/criterion.h>

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reduce.h"

/* --- deterministic randomness --- */

static uint64_t rng_state;
static void rng_seed(uint64_t s) { rng_state = s; }
static uint64_t rng(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double rng_unit(void) { return (double)(rng() >> 11) * 0x1p-53; } /* [0, 1) */

/* --- bit casts --- */

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float ffrom(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static double dfrom(uint64_t u) {
  double f;
  memcpy(&f, &u, 8);
  return f;
}

/* --- independent small-float codec ---
 * A binary format with 1 sign bit, `eb` exponent bits and `mb` mantissa bits:
 * float16 is (5, 10), bfloat16 is (8, 7). */

#define F16_EB 5
#define F16_MB 10
#define BF_EB 8
#define BF_MB 7

static double ref_decode(uint16_t h, int eb, int mb) {
  int bias = (1 << (eb - 1)) - 1;
  unsigned e = (h >> mb) & ((1u << eb) - 1), m = h & ((1u << mb) - 1);
  double sgn = (h & 0x8000) ? -1.0 : 1.0;
  if (e == (1u << eb) - 1) return m ? NAN : sgn * INFINITY;
  if (e == 0) return sgn * ldexp((double)m, 1 - bias - mb);
  return sgn * ldexp((double)(m + (1u << mb)), (int)e - bias - mb);
}

/* Round a double to the format, to nearest with ties to even, by scaling it to an
 * integer significand and rounding that by hand.  NaN encodes as the canonical quiet
 * NaN (callers compare NaN-ness, not payloads, against this). */
static uint16_t ref_encode(double v, int eb, int mb) {
  int bias = (1 << (eb - 1)) - 1, emin = 1 - bias, emax = bias;
  uint16_t sign = signbit(v) ? 0x8000 : 0;
  uint16_t expall = (uint16_t)(((1u << eb) - 1) << mb);
  if (isnan(v)) return (uint16_t)(sign | expall | (1u << (mb - 1)));
  double a = fabs(v);
  if (isinf(a)) return (uint16_t)(sign | expall);
  if (a == 0) return sign;
  int e;
  (void)frexp(a, &e);
  int E = e - 1; /* a = 1.xxx * 2^E */
  if (E < emin) E = emin;
  double m = ldexp(a, mb - E); /* exact: a power-of-two scaling */
  double fl = floor(m), d = m - fl;
  uint64_t M = (uint64_t)fl;
  if (d > 0.5 || (d == 0.5 && (M & 1))) M++;
  if (M == (1ull << (mb + 1))) {
    M >>= 1;
    E++;
  }
  if (E > emax) return (uint16_t)(sign | expall);
  if (M < (1ull << mb)) return (uint16_t)(sign | M); /* subnormal or zero */
  return (uint16_t)(sign | ((unsigned)(E + bias) << mb) | (M - (1ull << mb)));
}

static int is_nan16(uint16_t h, int eb, int mb) {
  unsigned e = (h >> mb) & ((1u << eb) - 1);
  return e == (1u << eb) - 1 && (h & ((1u << mb) - 1)) != 0;
}

/* --- dtypes --- */

static size_t dt_size(coll_dtype dt) {
  switch (dt) {
  case COLL_INT8:
  case COLL_UINT8: return 1;
  case COLL_FLOAT16:
  case COLL_BFLOAT16: return 2;
  case COLL_INT32:
  case COLL_UINT32:
  case COLL_FLOAT32: return 4;
  case COLL_INT64:
  case COLL_UINT64:
  case COLL_FLOAT64: return 8;
  }
  return 0;
}
static const char *dt_name(coll_dtype dt) {
  static const char *names[] = {"int8",   "uint8",   "int32",    "uint32",  "int64",
                                "uint64", "float16", "bfloat16", "float32", "float64"};
  return names[dt];
}
static const char *op_name(coll_op op) {
  static const char *names[] = {"sum", "prod", "min", "max", "avg"};
  return names[op];
}
static int dt_signed(coll_dtype dt) {
  return dt == COLL_INT8 || dt == COLL_INT32 || dt == COLL_INT64;
}
static int dt_is_int(coll_dtype dt) { return dt <= COLL_UINT64; }

/* Integers read as a sign-extended / zero-extended 64-bit value. */
static int64_t get_s(coll_dtype dt, const void *p, size_t i) {
  switch (dt) {
  case COLL_INT8: return ((const int8_t *)p)[i];
  case COLL_INT32: return ((const int32_t *)p)[i];
  default: return ((const int64_t *)p)[i];
  }
}
static uint64_t get_u(coll_dtype dt, const void *p, size_t i) {
  switch (dt) {
  case COLL_UINT8: return ((const uint8_t *)p)[i];
  case COLL_UINT32: return ((const uint32_t *)p)[i];
  default: return ((const uint64_t *)p)[i];
  }
}
/* Stores the low N bits of w (N = the dtype's width), through an unsigned pointer. */
static void put_bits(coll_dtype dt, void *p, size_t i, uint64_t w) {
  switch (dt_size(dt)) {
  case 1: ((uint8_t *)p)[i] = (uint8_t)w; break;
  case 2: ((uint16_t *)p)[i] = (uint16_t)w; break;
  case 4: ((uint32_t *)p)[i] = (uint32_t)w; break;
  default: ((uint64_t *)p)[i] = w; break;
  }
}
static uint64_t get_bits(coll_dtype dt, const void *p, size_t i) {
  switch (dt_size(dt)) {
  case 1: return ((const uint8_t *)p)[i];
  case 2: return ((const uint16_t *)p)[i];
  case 4: return ((const uint32_t *)p)[i];
  default: return ((const uint64_t *)p)[i];
  }
}

/* Float-like dtypes read as double (exact for all four). */
static double get_f(coll_dtype dt, const void *p, size_t i) {
  switch (dt) {
  case COLL_FLOAT16: return ref_decode(((const uint16_t *)p)[i], F16_EB, F16_MB);
  case COLL_BFLOAT16: return ref_decode(((const uint16_t *)p)[i], BF_EB, BF_MB);
  case COLL_FLOAT32: return ((const float *)p)[i];
  default: return ((const double *)p)[i];
  }
}
/* Stores v, which must already be representable in float for the 16/32-bit types
 * (the reference rounds to float first, as the contract does), rounding to the dtype. */
static void put_f(coll_dtype dt, void *p, size_t i, double v) {
  switch (dt) {
  case COLL_FLOAT16: ((uint16_t *)p)[i] = ref_encode(v, F16_EB, F16_MB); break;
  case COLL_BFLOAT16: ((uint16_t *)p)[i] = ref_encode(v, BF_EB, BF_MB); break;
  case COLL_FLOAT32: ((float *)p)[i] = (float)v; break;
  default: ((double *)p)[i] = v; break;
  }
}

static int elem_is_nan(coll_dtype dt, const void *p, size_t i) {
  switch (dt) {
  case COLL_FLOAT16: return is_nan16(((const uint16_t *)p)[i], F16_EB, F16_MB);
  case COLL_BFLOAT16: return is_nan16(((const uint16_t *)p)[i], BF_EB, BF_MB);
  case COLL_FLOAT32: return isnan(((const float *)p)[i]);
  case COLL_FLOAT64: return isnan(((const double *)p)[i]);
  default: return 0;
  }
}

/* Same element: identical bits, or both NaN (payloads are not part of the contract). */
static int elem_same(coll_dtype dt, const void *got, const void *want, size_t i) {
  if (elem_is_nan(dt, want, i)) return elem_is_nan(dt, got, i);
  return get_bits(dt, got, i) == get_bits(dt, want, i);
}

/* --- reference reductions --- */

/* min/max of doubles: NaN propagates, -0 < +0. */
static double ref_minmax(double x, double y, int is_max) {
  if (isnan(x) || isnan(y)) return NAN;
  if (x == y) {
    if (x != 0) return x;
    int neg = is_max ? (signbit(x) && signbit(y)) : (signbit(x) || signbit(y));
    return neg ? -0.0 : 0.0;
  }
  return (x < y) == !is_max ? x : y;
}

static void ref_reduce(coll_dtype dt, coll_op op, const void *a, const void *b, void *out,
                       size_t n) {
  if (op == COLL_AVG) op = COLL_SUM;
  for (size_t i = 0; i < n; i++) {
    if (dt_signed(dt)) {
      __int128 x = get_s(dt, a, i), y = get_s(dt, b, i), r = 0;
      switch (op) {
      case COLL_SUM: r = x + y; break;
      case COLL_PROD: r = x * y; break; /* |x*y| <= 2^126: no overflow */
      case COLL_MIN: r = x < y ? x : y; break;
      case COLL_MAX: r = x > y ? x : y; break;
      default: break;
      }
      put_bits(dt, out, i, (uint64_t)(unsigned __int128)r); /* modulo 2^N */
    } else if (dt_is_int(dt)) {
      unsigned __int128 x = get_u(dt, a, i), y = get_u(dt, b, i), r = 0;
      switch (op) {
      case COLL_SUM: r = x + y; break;
      case COLL_PROD: r = x * y; break; /* < 2^128: exact */
      case COLL_MIN: r = x < y ? x : y; break;
      case COLL_MAX: r = x > y ? x : y; break;
      default: break;
      }
      put_bits(dt, out, i, (uint64_t)r); /* modulo 2^N */
    } else {
      double x = get_f(dt, a, i), y = get_f(dt, b, i), r = 0;
      switch (op) {
      case COLL_SUM: r = x + y; break;
      case COLL_PROD: r = x * y; break;
      case COLL_MIN: r = ref_minmax(x, y, 0); break;
      case COLL_MAX: r = ref_minmax(x, y, 1); break;
      default: break;
      }
      /* float32 and the half types combine in float: one rounding to float (the
       * double result is exact, or double-rounding-safe since 53 >= 2*24+2), then
       * the half types round once more to their own precision. */
      if (dt != COLL_FLOAT64) r = (double)(float)r;
      put_f(dt, out, i, r);
    }
  }
}

static void ref_avg(coll_dtype dt, const void *in, void *out, size_t n, int nranks) {
  for (size_t i = 0; i < n; i++) {
    if (dt_signed(dt)) {
      int64_t x = get_s(dt, in, i);
      uint64_t mag = x < 0 ? 0 - (uint64_t)x : (uint64_t)x;
      uint64_t q = mag / (uint64_t)nranks; /* magnitude truncated: toward zero */
      put_bits(dt, out, i, x < 0 ? 0 - q : q);
    } else if (dt_is_int(dt)) {
      put_bits(dt, out, i, get_u(dt, in, i) / (uint64_t)nranks);
    } else {
      double r = get_f(dt, in, i) / (double)nranks;
      if (dt != COLL_FLOAT64) r = (double)(float)r;
      put_f(dt, out, i, r);
    }
  }
}

/* --- random data --- */

/* A value of moderate magnitude: sums and products of these round for real. */
static double nice_value(int emax) {
  double m = rng_unit() * 2 - 1;
  int e = (int)(rng() % (unsigned)(2 * emax + 1)) - emax;
  return ldexp(m, e);
}

static void fill_random(coll_dtype dt, void *buf, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t pick = rng() % 100, bits = rng();
    if (dt_is_int(dt)) {
      if (pick < 60) {
        put_bits(dt, buf, i, bits);
      } else if (pick < 90) {
        put_bits(dt, buf, i, (uint64_t)((int64_t)(bits % 21) - 10));
      } else { /* extremes: 0, max, min, -1 of the type, in bits */
        static const uint64_t ext[] = {0, 1, ~0ull};
        size_t sz = dt_size(dt) * 8;
        uint64_t top = sz == 64 ? 1ull << 63 : 1ull << (sz - 1);
        uint64_t v = (bits & 3) == 3 ? top : (bits & 3) == 2 ? top - 1 : ext[bits % 3];
        put_bits(dt, buf, i, v);
      }
      continue;
    }
    static const double specials[] = {0.0,     -0.0,    1.0,     -1.0,     INFINITY, -INFINITY,
                                      NAN,     -NAN,    65504.0, 65520.0,  0x1p-24,  0x1p-25,
                                      0x1p-14, FLT_MAX, FLT_MIN, 0x1p-149, 3.0,      0.5};
    size_t nspecial = sizeof specials / sizeof specials[0];
    switch (dt) {
    case COLL_FLOAT16:
    case COLL_BFLOAT16: {
      int eb = dt == COLL_FLOAT16 ? F16_EB : BF_EB, mb = dt == COLL_FLOAT16 ? F16_MB : BF_MB;
      uint16_t h;
      if (pick < 45)
        h = (uint16_t)bits;
      else if (pick < 92)
        h = ref_encode((double)(float)nice_value(8), eb, mb);
      else
        h = ref_encode((double)(float)specials[bits % nspecial], eb, mb);
      ((uint16_t *)buf)[i] = h;
      break;
    }
    case COLL_FLOAT32: {
      float f;
      if (pick < 25)
        f = ffrom((uint32_t)bits);
      else if (pick < 30)
        f = ffrom((uint32_t)bits & 0x807fffffu); /* subnormals */
      else if (pick < 90)
        f = (float)nice_value(20);
      else if (pick < 92)
        f = ffrom(0x7f800001u | ((uint32_t)bits & 0x803fffffu)); /* sNaN */
      else
        f = (float)specials[bits % nspecial];
      ((float *)buf)[i] = f;
      break;
    }
    default: {
      double d;
      if (pick < 25)
        d = dfrom(bits);
      else if (pick < 30)
        d = dfrom(bits & 0x800fffffffffffffull);
      else if (pick < 90)
        d = nice_value(60);
      else if (pick < 92)
        d = dfrom(0x7ff0000000000001ull | (bits & 0x8007ffffffffffffull));
      else
        d = specials[bits % nspecial];
      ((double *)buf)[i] = d;
      break;
    }
    }
  }
}

static void fmt_elem(char *s, size_t cap, coll_dtype dt, const void *p, size_t i) {
  uint64_t bits = get_bits(dt, p, i);
  if (dt_signed(dt))
    snprintf(s, cap, "%" PRId64, get_s(dt, p, i));
  else if (dt_is_int(dt))
    snprintf(s, cap, "%" PRIu64, bits);
  else
    snprintf(s, cap, "%.17g (0x%0*" PRIx64 ")", get_f(dt, p, i), (int)dt_size(dt) * 2, bits);
}

/* Index of the first element that differs, or n. */
static size_t first_mismatch(coll_dtype dt, const void *got, const void *want, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!elem_same(dt, got, want, i)) return i;
  return n;
}

/* --- the sweep: all dtypes × ops × lengths × aliasing --- */

#define GUARD 64 /* bytes before and after every buffer the kernel is given */
#define BIG_N 1000003

static const size_t lengths[] = {0,  1,  2,  3,  5,   7,   8,   15,   16,   17,
                                 31, 33, 63, 65, 127, 129, 255, 1001, 4099, BIG_N};

static void check_dtype(coll_dtype dt) {
  size_t sz = dt_size(dt), cap = BIG_N * sz;
  rng_seed(0x5eed0000u + (unsigned)dt);
  unsigned char *a0 = malloc(cap), *b0 = malloc(cap), *want = malloc(cap);
  unsigned char *wa = malloc(cap + 2 * GUARD + 8), *wb = malloc(cap + 2 * GUARD + 8);
  unsigned char *wd = malloc(cap + 2 * GUARD + 8);
  cr_assert(a0 && b0 && want && wa && wb && wd);
  fill_random(dt, a0, BIG_N);
  fill_random(dt, b0, BIG_N);

  for (int op = 0; op < COLL_NUM_OPS; op++) {
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
      size_t n = lengths[li];
      /* Start the inputs somewhere in the random data, and vary the alignment of the
       * buffers (by up to 8 bytes) so vector loops meet misaligned heads. */
      size_t start = (li * 7919) % (BIG_N - n + 1);
      const unsigned char *A = a0 + start * sz, *B = b0 + start * sz;
      size_t mis = (li % 3) * sz % 16; /* 0, 1 or 2 elements; at most 8 bytes */
      ref_reduce(dt, (coll_op)op, A, B, want, n);
      for (int mode = 0; mode < 4; mode++) {
        /* mode 0: dst, a, b distinct; 1: dst == a; 2: dst == b; 3: dst == a == b. */
        unsigned char *pa = wa + GUARD + mis, *pb = wb + GUARD + mis, *pd = wd + GUARD + mis;
        const unsigned char *srcb = B;
        if (mode == 3) srcb = A;
        size_t span = n * sz + 2 * GUARD + 8; /* the part of each buffer in play */
        memset(wa, 0xa5, span);
        memset(wb, 0xa5, span);
        memset(wd, 0xa5, span);
        memcpy(pa, A, n * sz);
        memcpy(pb, srcb, n * sz);
        void *dst = pd;
        const void *xa = pa, *xb = pb;
        if (mode == 1) dst = pa;
        if (mode == 2) dst = pb;
        if (mode == 3) dst = pa, xb = pa;
        if (n == 0) coll_kernel_reduce(NULL, NULL, NULL, 0, dt, (coll_op)op);
        coll_kernel_reduce(dst, xa, xb, n, dt, (coll_op)op);

        const void *ref = want;
        unsigned char *want3 = NULL;
        if (mode == 3) { /* x OP x */
          want3 = malloc(n * sz + 1);
          ref_reduce(dt, (coll_op)op, A, A, want3, n);
          ref = want3;
        }
        size_t bad = first_mismatch(dt, dst, ref, n);
        char g[96] = "", w[96] = "", x[96] = "", y[96] = "";
        if (bad < n) {
          fmt_elem(g, sizeof g, dt, dst, bad);
          fmt_elem(w, sizeof w, dt, ref, bad);
          fmt_elem(x, sizeof x, dt, A, bad);
          fmt_elem(y, sizeof y, dt, mode == 3 ? A : B, bad);
        }
        cr_expect(bad == n, "%s %s n=%zu alias mode %d: element %zu: %s OP %s gave %s, want %s",
                  dt_name(dt), op_name((coll_op)op), n, mode, bad, x, y, g, w);
        free(want3);

        /* Nothing outside [dst, dst + n) may change. */
        unsigned char *base = (unsigned char *)dst - GUARD - mis;
        unsigned char *wbuf = dst == (void *)pa ? wa : dst == (void *)pb ? wb : wd;
        cr_assert(base == wbuf);
        int clobbered = 0;
        for (size_t k = 0; k < GUARD + mis; k++) clobbered |= base[k] != 0xa5;
        for (size_t k = GUARD + mis + n * sz; k < span; k++) clobbered |= base[k] != 0xa5;
        cr_expect(!clobbered, "%s %s n=%zu alias mode %d: wrote outside dst[0..n)", dt_name(dt),
                  op_name((coll_op)op), n, mode);
        /* An input that is not dst is left alone. */
        if (mode == 0) {
          cr_expect(memcmp(pa, A, n * sz) == 0 && memcmp(pb, B, n * sz) == 0,
                    "%s %s n=%zu: an input was modified", dt_name(dt), op_name((coll_op)op), n);
        }
      }
    }
  }

  /* Average: reduce-as-sum then divide, over the whole random array, several nranks. */
  static const int nranks_list[] = {2, 3, 7, 8, 1000};
  for (size_t k = 0; k < sizeof nranks_list / sizeof nranks_list[0]; k++) {
    int nr = nranks_list[k];
    size_t n = k == 0 ? BIG_N : 4099 + k;
    memcpy(wd, a0, n * sz);
    ref_avg(dt, a0, want, n, nr);
    coll_kernel_avg(wd, n, dt, nr);
    size_t bad = first_mismatch(dt, wd, want, n);
    char g[96] = "", w[96] = "", x[96] = "";
    if (bad < n) {
      fmt_elem(g, sizeof g, dt, wd, bad);
      fmt_elem(w, sizeof w, dt, want, bad);
      fmt_elem(x, sizeof x, dt, a0, bad);
    }
    cr_expect(bad == n, "%s avg nranks=%d n=%zu: element %zu: %s / %d gave %s, want %s",
              dt_name(dt), nr, n, bad, x, nr, g, w);
  }
  /* nranks 1 (and nonsense nranks) leave the data alone; n == 0 touches nothing. */
  for (int nr = -1; nr <= 1; nr++) {
    memcpy(wd, a0, 1001 * sz);
    coll_kernel_avg(wd, 1001, dt, nr);
    cr_expect(memcmp(wd, a0, 1001 * sz) == 0, "%s avg nranks=%d changed the data", dt_name(dt), nr);
  }
  coll_kernel_avg(NULL, 0, dt, 4);

  free(a0), free(b0), free(want), free(wa), free(wb), free(wd);
}

Test(reduce_sweep, int8) { check_dtype(COLL_INT8); }
Test(reduce_sweep, uint8) { check_dtype(COLL_UINT8); }
Test(reduce_sweep, int32) { check_dtype(COLL_INT32); }
Test(reduce_sweep, uint32) { check_dtype(COLL_UINT32); }
Test(reduce_sweep, int64) { check_dtype(COLL_INT64); }
Test(reduce_sweep, uint64) { check_dtype(COLL_UINT64); }
Test(reduce_sweep, float16) { check_dtype(COLL_FLOAT16); }
Test(reduce_sweep, bfloat16) { check_dtype(COLL_BFLOAT16); }
Test(reduce_sweep, float32) { check_dtype(COLL_FLOAT32); }
Test(reduce_sweep, float64) { check_dtype(COLL_FLOAT64); }

/* --- half conversions --- */

/* to-float: exact value for every non-NaN pattern (sign of zero included); a NaN comes
 * back as a quiet float NaN with the same sign and the payload in the top bits. */
static void check_to_float_exhaustive(float (*conv)(uint16_t), int eb, int mb, const char *name) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = conv((uint16_t)h);
    double want = ref_decode((uint16_t)h, eb, mb);
    uint32_t fb = fbits(f);
    int ok;
    if (isnan(want)) {
      uint32_t payload = h & ((1u << mb) - 1);
      ok = isnan(f) && (fb >> 31) == (h >> 15) && (fb & 0x00400000u) &&
           ((fb & 0x007fffffu) >> (23 - mb)) == (payload | (1u << (mb - 1))) &&
           (fb & ((1u << (23 - mb)) - 1)) == 0;
    } else {
      ok = (double)f == want && !signbit(f) == !signbit(want);
    }
    if (!ok && bad++ < 5)
      cr_expect(ok, "%s_to_float(0x%04x) = %a (0x%08x), want %a", name, h, (double)f, fb, want);
  }
  cr_expect(bad == 0, "%s_to_float: %d of 65536 patterns wrong", name, bad);
}

Test(half, f16_to_float_exhaustive) {
  check_to_float_exhaustive(coll_half_to_float, F16_EB, F16_MB, "half");
}
Test(half, bf16_to_float_exhaustive) {
  check_to_float_exhaustive(coll_bf16_to_float, BF_EB, BF_MB, "bf16");
}

/* One float -> half check against the reference; NaN must become a quiet NaN with the
 * sign kept and the float payload's top bits kept (reduce.c's documented choice). */
static int check_from_float(uint16_t (*conv)(float), int eb, int mb, float f) {
  uint16_t got = conv(f);
  uint32_t fb = fbits(f);
  int ok;
  if (isnan(f)) {
    uint16_t payload = (uint16_t)((fb & 0x007fffffu) >> (23 - mb));
    ok = is_nan16(got, eb, mb) && (got >> 15) == (fb >> 31) &&
         (got & ((1u << mb) - 1)) == (payload | (1u << (mb - 1)));
  } else {
    ok = got == ref_encode((double)f, eb, mb);
  }
  return ok;
}

static void check_from_float_sweep(uint16_t (*conv)(float), int eb, int mb, const char *name) {
  /* Every float with every combination of the bits that are kept (sign, exponent and
   * the top mb mantissa bits), times the dropped-bit patterns that decide rounding:
   * exact, just above, just below half, exactly half, just above half, all ones. */
  int drop = 23 - mb;
  uint32_t half = 1u << (drop - 1), all = (1u << drop) - 1;
  uint32_t lows[] = {0, 1, half - 1, half, half + 1, all, 0};
  long bad = 0, total = 0;
  rng_seed(0xf10a7);
  for (uint32_t pre = 0; pre < (1u << (9 + mb)); pre++) {
    lows[6] = (uint32_t)rng() & all;
    for (size_t k = 0; k < sizeof lows / sizeof lows[0]; k++) {
      float f = ffrom((pre << drop) | lows[k]);
      total++;
      if (!check_from_float(conv, eb, mb, f) && bad++ < 5)
        cr_expect(0, "float_to_%s(%a = 0x%08x) = 0x%04x, want 0x%04x", name, (double)f, fbits(f),
                  conv(f), ref_encode((double)f, eb, mb));
    }
  }
  /* And random floats of every kind. */
  for (int i = 0; i < 2000000; i++) {
    float f = ffrom((uint32_t)rng());
    total++;
    if (!check_from_float(conv, eb, mb, f) && bad++ < 5)
      cr_expect(0, "float_to_%s(%a = 0x%08x) = 0x%04x, want 0x%04x", name, (double)f, fbits(f),
                conv(f), ref_encode((double)f, eb, mb));
  }
  cr_expect(bad == 0, "float_to_%s: %ld of %ld wrong", name, bad, total);
}

Test(half, f16_from_float_sweep) {
  check_from_float_sweep(coll_float_to_half, F16_EB, F16_MB, "half");
}
Test(half, bf16_from_float_sweep) {
  check_from_float_sweep(coll_float_to_bf16, BF_EB, BF_MB, "bf16");
}

/* Ties to even, stated directly: for every pair of adjacent finite values (h, h+1) of
 * the same sign, the float exactly halfway between them must go to whichever of the
 * two has an even mantissa, one float ulp either side must go to the nearer one, and
 * h itself must come back unchanged.  Covers subnormals, the subnormal/normal seam
 * and the last finite value, whose upper neighbour is the overflow threshold (inf). */
static void check_ties(uint16_t (*conv)(float), int eb, int mb, const char *name) {
  uint16_t inf = (uint16_t)(((1u << eb) - 1) << mb);
  int bad = 0;
  for (uint32_t h = 0; h < inf; h++) {
    for (int neg = 0; neg < 2; neg++) {
      uint16_t lo = (uint16_t)(h | (neg ? 0x8000 : 0)), hi = (uint16_t)(lo + 1);
      double vlo = ref_decode(lo, eb, mb);
      /* the value that hi stands for, even when hi is inf: 2^(emax+1) */
      double vhi = (h + 1 == inf) ? (neg ? -1 : 1) * ldexp(1.0, 1 << (eb - 1))
                                  : ref_decode(hi, eb, mb);
      double mid = (vlo + vhi) / 2; /* exact in double, and in float (mb+2 bits) */
      float fm = (float)mid;
      uint16_t even = (lo & 1) ? hi : lo;
      float below = nextafterf(fm, (float)vlo), above = nextafterf(fm, (float)vhi);
      int ok = (double)fm == mid && conv(fm) == even && conv(below) == lo && conv(above) == hi &&
               conv((float)vlo) == lo;
      if (!ok && bad++ < 5)
        cr_expect(ok,
                  "%s ties between 0x%04x and 0x%04x: mid->0x%04x (want 0x%04x), "
                  "below->0x%04x, above->0x%04x, exact->0x%04x",
                  name, lo, hi, conv(fm), even, conv(below), conv(above), conv((float)vlo));
    }
  }
  cr_expect(bad == 0, "%s: %d tie boundaries wrong", name, bad);
}

Test(half, f16_ties_to_even) { check_ties(coll_float_to_half, F16_EB, F16_MB, "half"); }
Test(half, bf16_ties_to_even) { check_ties(coll_float_to_bf16, BF_EB, BF_MB, "bf16"); }

Test(half, f16_named_cases) {
  struct {
    float f;
    uint16_t h;
  } cases[] = {
      {0.0f, 0x0000},         {-0.0f, 0x8000},           {1.0f, 0x3c00},
      {-2.0f, 0xc000},        {65504.0f, 0x7bff},        {65519.99f, 0x7bff},
      {65520.0f, 0x7c00},     {1e10f, 0x7c00},           {-1e10f, 0xfc00},
      {INFINITY, 0x7c00},     {-INFINITY, 0xfc00},       {0x1p-24f, 0x0001},
      {0x1p-25f, 0x0000},     {0x1.000002p-25f, 0x0001}, {-0x1p-25f, 0x8000},
      {0x1.8p-24f, 0x0002},   {0x1.4p-23f, 0x0002},      {0x1p-14f, 0x0400},
      {0x1.ffcp-15f, 0x0400}, {0x1.ff0p-15f, 0x03fe},    {0x1.002p0f, 0x3c00},
      {0x1.006p0f, 0x3c02},   {0x1.002002p0f, 0x3c01},   {FLT_MIN, 0x0000},
      {0x1p-149f, 0x0000},    {FLT_MAX, 0x7c00},         {0.1f, 0x2e66},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    cr_expect(coll_float_to_half(cases[i].f) == cases[i].h,
              "float_to_half(%a) = 0x%04x, want 0x%04x", (double)cases[i].f,
              coll_float_to_half(cases[i].f), cases[i].h);
  uint16_t q = coll_float_to_half(NAN), s = coll_float_to_half(ffrom(0x7f800001u));
  cr_expect((q & 0x7e00) == 0x7e00, "NaN -> 0x%04x is not a quiet NaN", q);
  cr_expect((s & 0x7e00) == 0x7e00, "signalling NaN -> 0x%04x is not a quiet NaN", s);
  cr_expect(isnan(coll_half_to_float(0x7c01)) && (fbits(coll_half_to_float(0x7c01)) & 0x00400000u),
            "half sNaN must widen to a quiet NaN");
  /* Round trip of every non-NaN half. */
  for (uint32_t h = 0; h < 65536; h++) {
    if (is_nan16((uint16_t)h, F16_EB, F16_MB)) continue;
    uint16_t back = coll_float_to_half(coll_half_to_float((uint16_t)h));
    if (back != h) cr_assert(back == h, "half 0x%04x round-trips to 0x%04x", h, back);
  }
}

Test(half, bf16_named_cases) {
  struct {
    float f;
    uint16_t h;
  } cases[] = {
      {0.0f, 0x0000},        {-0.0f, 0x8000},       {1.0f, 0x3f80},      {0x1.01p0f, 0x3f80},
      {0x1.03p0f, 0x3f82},   {0x1.0101p0f, 0x3f81}, {FLT_MAX, 0x7f80},   {-FLT_MAX, 0xff80},
      {0x1.fep127f, 0x7f7f}, {INFINITY, 0x7f80},    {0x1p-149f, 0x0000}, {0x1p-133f, 0x0001},
      {0x1.8p-133f, 0x0002}, {FLT_MIN, 0x0080},     {0.1f, 0x3dcd},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    cr_expect(coll_float_to_bf16(cases[i].f) == cases[i].h,
              "float_to_bf16(%a) = 0x%04x, want 0x%04x", (double)cases[i].f,
              coll_float_to_bf16(cases[i].f), cases[i].h);
  /* A NaN whose payload is only in the low 16 bits must not truncate to inf. */
  uint16_t n = coll_float_to_bf16(ffrom(0x7f800001u));
  cr_expect(n != 0x7f80 && (n & 0x7fc0) == 0x7fc0, "low-payload NaN -> 0x%04x", n);
  for (uint32_t h = 0; h < 65536; h++) {
    if (is_nan16((uint16_t)h, BF_EB, BF_MB)) continue;
    uint16_t back = coll_float_to_bf16(coll_bf16_to_float((uint16_t)h));
    if (back != h) cr_assert(back == h, "bf16 0x%04x round-trips to 0x%04x", h, back);
  }
}

/* --- hand-picked semantics: NaN / inf / signed zero, wrapping, truncation --- */

#define CASE_REPEAT 37 /* each case lands in vector bodies and in scalar tails */

/* Runs op over nc (x, y) cases of a float-like dtype, each repeated CASE_REPEAT times
 * at shifting positions, and checks each against the expected double (NaN: any NaN). */
static void run_float_cases(coll_dtype dt, coll_op op, const double *x, const double *y,
                            const double *want, size_t nc) {
  size_t n = nc * CASE_REPEAT, sz = dt_size(dt);
  unsigned char *a = malloc(n * sz), *b = malloc(n * sz), *d = malloc(n * sz);
  unsigned char *w = malloc(n * sz);
  cr_assert(a && b && d && w);
  for (size_t i = 0; i < n; i++) {
    size_t c = (i + i / nc) % nc;
    put_f(dt, a, i, x[c]);
    put_f(dt, b, i, y[c]);
    put_f(dt, w, i, want[c]);
  }
  for (int mode = 0; mode < 3; mode++) {
    unsigned char *aa = malloc(n * sz), *bb = malloc(n * sz);
    memcpy(aa, a, n * sz);
    memcpy(bb, b, n * sz);
    void *dst = mode == 0 ? (void *)d : mode == 1 ? (void *)aa : (void *)bb;
    coll_kernel_reduce(dst, aa, bb, n, dt, op);
    for (size_t i = 0; i < n; i++) {
      if (!elem_same(dt, dst, w, i)) {
        size_t c = (i + i / nc) % nc;
        char g[96];
        fmt_elem(g, sizeof g, dt, dst, i);
        cr_expect(0, "%s %s(%g, %g) = %s, want %g (mode %d, index %zu)", dt_name(dt), op_name(op),
                  x[c], y[c], g, want[c], mode, i);
        break;
      }
    }
    free(aa), free(bb);
  }
  free(a), free(b), free(d), free(w);
}

Test(semantics, float_min_max_nan_inf_zero) {
  const double I = INFINITY, N = NAN, z = 0.0, nz = -0.0;
  const double x[] = {N, 1, N, -I, I, -I, I, I, -I, N, z, nz, z, nz, 2, -3, 5, -1};
  const double y[] = {1, N, N, 1, 1, N, N, -I, I, -I, nz, z, z, nz, 2, 7, -5, -1};
  const double mn[] = {N, N, N, -I, 1, N, N, -I, -I, N, nz, nz, z, nz, 2, -3, -5, -1};
  const double mx[] = {N, N, N, 1, I, N, N, I, I, N, z, z, z, nz, 2, 7, 5, -1};
  const coll_dtype dts[] = {COLL_FLOAT16, COLL_BFLOAT16, COLL_FLOAT32, COLL_FLOAT64};
  size_t nc = sizeof x / sizeof x[0];
  for (size_t k = 0; k < 4; k++) {
    run_float_cases(dts[k], COLL_MIN, x, y, mn, nc);
    run_float_cases(dts[k], COLL_MAX, x, y, mx, nc);
  }
}

Test(semantics, float_sum_prod_specials) {
  const double I = INFINITY, N = NAN;
  const double x[] = {I, I, -I, N, 1, 0.0, -0.0, -0.0, I, 3};
  const double y[] = {1, -I, -I, 1, N, -0.0, -0.0, 0.0, 0.0, 0.5};
  const double sum[] = {I, N, -I, N, N, 0.0, -0.0, 0.0, I, 3.5};
  const double prod[] = {I, -I, I, N, N, -0.0, 0.0, -0.0, N, 1.5};
  const coll_dtype dts[] = {COLL_FLOAT16, COLL_BFLOAT16, COLL_FLOAT32, COLL_FLOAT64};
  size_t nc = sizeof x / sizeof x[0];
  for (size_t k = 0; k < 4; k++) {
    run_float_cases(dts[k], COLL_SUM, x, y, sum, nc);
    run_float_cases(dts[k], COLL_AVG, x, y, sum, nc);
    run_float_cases(dts[k], COLL_PROD, x, y, prod, nc);
  }
  /* Half sums that overflow or round. */
  const double hx[] = {65504, 60000, 1, 2048, 2048, 0x1p-24};
  const double hy[] = {16, 10000, 0x1p-11, 1, 3, 0x1p-24};
  const double hs[] = {I, I, 1, 2048, 2052, 0x1p-23}; /* 65520 -> inf; ties to even */
  run_float_cases(COLL_FLOAT16, COLL_SUM, hx, hy, hs, sizeof hx / sizeof hx[0]);
  const double bx[] = {0x1.fep127, 1, 256, 256};
  const double by[] = {0x1p120, 0x1p-8, 1, 3};
  const double bs[] = {I, 1, 256, 260};
  run_float_cases(COLL_BFLOAT16, COLL_SUM, bx, by, bs, sizeof bx / sizeof bx[0]);
}

/* Integer cases as bit patterns of the dtype; want is the wrapped result. */
static void run_int_cases(coll_dtype dt, coll_op op, const uint64_t *x, const uint64_t *y,
                          const uint64_t *want, size_t nc) {
  size_t n = nc * CASE_REPEAT, sz = dt_size(dt);
  unsigned char *a = malloc(n * sz), *b = malloc(n * sz), *d = malloc(n * sz);
  cr_assert(a && b && d);
  for (size_t i = 0; i < n; i++) {
    size_t c = (i + i / nc) % nc;
    put_bits(dt, a, i, x[c]);
    put_bits(dt, b, i, y[c]);
  }
  coll_kernel_reduce(d, a, b, n, dt, op);
  for (size_t i = 0; i < n; i++) {
    size_t c = (i + i / nc) % nc;
    uint64_t mask = sz == 8 ? ~0ull : (1ull << (sz * 8)) - 1;
    if (get_bits(dt, d, i) != (want[c] & mask)) {
      cr_expect(0, "%s %s case %zu (0x%" PRIx64 ", 0x%" PRIx64 ") = 0x%" PRIx64 ", want 0x%" PRIx64,
                dt_name(dt), op_name(op), c, x[c] & mask, y[c] & mask, get_bits(dt, d, i),
                want[c] & mask);
      break;
    }
  }
  free(a), free(b), free(d);
}
#define U(v) ((uint64_t)(int64_t)(v))
#define NC(arr) (sizeof(arr) / sizeof(arr[0]))

Test(semantics, int_wrap) {
  { /* int8 */
    uint64_t x[] = {U(INT8_MAX), U(INT8_MIN), U(INT8_MIN), U(100), U(-1)};
    uint64_t y[] = {U(1), U(-1), U(INT8_MIN), U(100), U(1)};
    uint64_t s[] = {U(INT8_MIN), U(INT8_MAX), U(0), U(-56), U(0)};
    uint64_t p[] = {U(INT8_MAX), U(INT8_MIN), U(0), U(16), U(-1)};
    run_int_cases(COLL_INT8, COLL_SUM, x, y, s, NC(x));
    run_int_cases(COLL_INT8, COLL_PROD, x, y, p, NC(x));
    uint64_t px[] = {U(-128), U(16), U(127), U(-7)};
    uint64_t py[] = {U(-1), U(16), U(127), U(3)};
    uint64_t pp[] = {U(-128), U(0), U(1), U(-21)};
    run_int_cases(COLL_INT8, COLL_PROD, px, py, pp, NC(px));
  }
  { /* uint8 */
    uint64_t x[] = {255, 255, 200, 0};
    uint64_t y[] = {1, 255, 100, 0};
    uint64_t s[] = {0, 254, 44, 0};
    uint64_t p[] = {255, 1, 32, 0}; /* 20000 mod 256 = 32 */
    run_int_cases(COLL_UINT8, COLL_SUM, x, y, s, NC(x));
    run_int_cases(COLL_UINT8, COLL_PROD, x, y, p, NC(x));
  }
  { /* int32 */
    uint64_t x[] = {U(INT32_MAX), U(INT32_MIN), U(INT32_MAX), U(INT32_MIN), U(65536)};
    uint64_t y[] = {U(1), U(-1), U(2), U(-1), U(65536)};
    uint64_t s[] = {U(INT32_MIN), U(INT32_MAX), U(INT32_MIN + 1), U(INT32_MAX), U(131072)};
    uint64_t p[] = {U(INT32_MAX), U(INT32_MIN), U(-2), U(INT32_MIN), U(0)};
    run_int_cases(COLL_INT32, COLL_SUM, x, y, s, NC(x));
    run_int_cases(COLL_INT32, COLL_PROD, x, y, p, NC(x));
  }
  { /* uint32 */
    uint64_t x[] = {UINT32_MAX, 65536, UINT32_MAX};
    uint64_t y[] = {1, 65536, UINT32_MAX};
    uint64_t s[] = {0, 131072, UINT32_MAX - 1};
    uint64_t p[] = {UINT32_MAX, 0, 1};
    run_int_cases(COLL_UINT32, COLL_SUM, x, y, s, NC(x));
    run_int_cases(COLL_UINT32, COLL_PROD, x, y, p, NC(x));
  }
  { /* int64 */
    uint64_t x[] = {U(INT64_MAX), U(INT64_MIN), U(INT64_MIN), U(1) << 32, U(INT64_MAX)};
    uint64_t y[] = {U(1), U(-1), U(INT64_MIN), U(1) << 32, U(2)};
    uint64_t s[] = {U(INT64_MIN), U(INT64_MAX), U(0), U(1) << 33, U(INT64_MIN + 1)};
    uint64_t p[] = {U(INT64_MAX), U(INT64_MIN), U(0), U(0), U(-2)};
    run_int_cases(COLL_INT64, COLL_SUM, x, y, s, NC(x));
    run_int_cases(COLL_INT64, COLL_PROD, x, y, p, NC(x));
    uint64_t mx[] = {U(INT64_MIN), U(INT64_MAX)}, my[] = {U(INT64_MAX), U(-1)};
    uint64_t mn[] = {U(INT64_MIN), U(-1)}, mm[] = {U(INT64_MAX), U(INT64_MAX)};
    run_int_cases(COLL_INT64, COLL_MIN, mx, my, mn, NC(mx));
    run_int_cases(COLL_INT64, COLL_MAX, mx, my, mm, NC(mx));
  }
  { /* uint64 */
    uint64_t x[] = {UINT64_MAX, UINT64_MAX, 1ull << 63};
    uint64_t y[] = {1, UINT64_MAX, 2};
    uint64_t s[] = {0, UINT64_MAX - 1, (1ull << 63) + 2};
    uint64_t p[] = {UINT64_MAX, 1, 0};
    run_int_cases(COLL_UINT64, COLL_SUM, x, y, s, NC(x));
    run_int_cases(COLL_UINT64, COLL_PROD, x, y, p, NC(x));
    uint64_t mn[] = {1, UINT64_MAX, 2}, mm[] = {UINT64_MAX, UINT64_MAX, 1ull << 63};
    run_int_cases(COLL_UINT64, COLL_MIN, x, y, mn, NC(x));
    run_int_cases(COLL_UINT64, COLL_MAX, x, y, mm, NC(x));
  }
  { /* signed vs unsigned ordering of the same bits */
    uint64_t x[] = {0x80, 0x7f}, y[] = {0x01, 0xff};
    uint64_t smin[] = {0x80, 0xff}, umin[] = {0x01, 0x7f};
    run_int_cases(COLL_INT8, COLL_MIN, x, y, smin, NC(x));
    run_int_cases(COLL_UINT8, COLL_MIN, x, y, umin, NC(x));
  }
}

Test(semantics, avg_truncates_toward_zero) {
  int8_t i8[] = {-7, 7, -1, 1, INT8_MIN, INT8_MAX, -128, 0};
  int8_t w8[] = {-3, 3, 0, 0, -64, 63, -64, 0};
  coll_kernel_avg(i8, NC(i8), COLL_INT8, 2);
  for (size_t i = 0; i < NC(i8); i++)
    cr_expect(i8[i] == w8[i], "int8 avg[%zu] = %d, want %d", i, i8[i], w8[i]);
  int8_t t8[] = {-128, -7, 127};
  coll_kernel_avg(t8, 3, COLL_INT8, 3);
  cr_expect(t8[0] == -42 && t8[1] == -2 && t8[2] == 42, "int8 /3: %d %d %d", t8[0], t8[1], t8[2]);
  uint8_t u8[] = {255, 7, 1};
  coll_kernel_avg(u8, 3, COLL_UINT8, 2);
  cr_expect(u8[0] == 127 && u8[1] == 3 && u8[2] == 0, "uint8 avg: %u %u %u", u8[0], u8[1], u8[2]);

  int32_t i32[33];
  for (int i = 0; i < 33; i++) i32[i] = i % 2 ? -7 : INT32_MIN;
  coll_kernel_avg(i32, 33, COLL_INT32, 2);
  for (int i = 0; i < 33; i++)
    cr_expect(i32[i] == (i % 2 ? -3 : INT32_MIN / 2), "int32 avg[%d] = %d", i, i32[i]);
  uint32_t u32[] = {UINT32_MAX, 5};
  coll_kernel_avg(u32, 2, COLL_UINT32, 4);
  cr_expect(u32[0] == UINT32_MAX / 4 && u32[1] == 1, "uint32 avg: %u %u", u32[0], u32[1]);

  int64_t i64[] = {-7, INT64_MIN, INT64_MAX, -1};
  coll_kernel_avg(i64, 4, COLL_INT64, 2);
  cr_expect(i64[0] == -3 && i64[1] == INT64_MIN / 2 && i64[2] == INT64_MAX / 2 && i64[3] == 0,
            "int64 avg: %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64, i64[0], i64[1], i64[2],
            i64[3]);
  uint64_t u64[] = {UINT64_MAX, 9};
  coll_kernel_avg(u64, 2, COLL_UINT64, 3);
  cr_expect(u64[0] == UINT64_MAX / 3 && u64[1] == 3, "uint64 avg");

  /* A true division: 3/3 is exactly 1 (x * (1/3) would not always be). */
  float f32[19];
  for (int i = 0; i < 19; i++) f32[i] = 3.0f * (float)(i + 1);
  coll_kernel_avg(f32, 19, COLL_FLOAT32, 3);
  for (int i = 0; i < 19; i++)
    cr_expect(f32[i] == (float)(i + 1), "float32 avg[%d] = %a", i, (double)f32[i]);
  double f64[] = {-7.0, 1.0, INFINITY};
  coll_kernel_avg(f64, 3, COLL_FLOAT64, 2);
  cr_expect(f64[0] == -3.5 && f64[1] == 0.5 && f64[2] == INFINITY, "float64 avg");
  uint16_t h[] = {0x3c00 /* 1 */, 0x0001 /* 2^-24 */, 0x0003, 0x7bff};
  coll_kernel_avg(h, 4, COLL_FLOAT16, 2);
  /* 0.5; 2^-25 ties to 0; 1.5 * 2^-24 ties to 2 * 2^-24; 32752 */
  cr_expect(h[0] == 0x3800 && h[1] == 0x0000 && h[2] == 0x0002 && h[3] == 0x77ff,
            "float16 avg: %04x %04x %04x %04x", h[0], h[1], h[2], h[3]);
  uint16_t bh[] = {0x3f80, 0x4040 /* 3 */};
  coll_kernel_avg(bh, 2, COLL_BFLOAT16, 3);
  cr_expect(bh[0] == ref_encode((double)(1.0f / 3.0f), BF_EB, BF_MB) && bh[1] == 0x3f80,
            "bfloat16 avg: %04x %04x", bh[0], bh[1]);
}

Test(semantics, invalid_dtype_or_op_is_a_no_op) {
  float a[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, d[9];
  memset(d, 0x5a, sizeof d);
  unsigned char before[sizeof d];
  memcpy(before, d, sizeof d);
  coll_kernel_reduce(d, a, a, 9, (coll_dtype)COLL_NUM_DTYPES, COLL_SUM);
  coll_kernel_reduce(d, a, a, 9, (coll_dtype)-1, COLL_SUM);
  coll_kernel_reduce(d, a, a, 9, COLL_FLOAT32, (coll_op)COLL_NUM_OPS);
  coll_kernel_avg(d, 9, (coll_dtype)COLL_NUM_DTYPES, 2);
  cr_expect(memcmp(d, before, sizeof d) == 0, "an invalid dtype/op wrote to dst");
}
