/* bench_util.c — coll-bench's pure arithmetic: names, sizes, bandwidth factors, and the
 * exactly-predictable data patterns.  See bench_util.h for the contract; nothing here
 * talks to a communicator, so test/tools/test_bench.c compiles this file in directly.
 *
 * The data patterns, per op (j is the element's index in the input buffer, r the rank,
 * N the number of ranks, L the largest integer the dtype holds exactly together with
 * every smaller one: 127 for int8, 256 for bfloat16, 2048 for float16, ...):
 *
 *   sum   v = (j + r) mod K, K = min(8, L/N + 1), so every partial sum is <= L.  When
 *         even K = 2 would overflow (N > L), one-hot: v = 1 on rank j mod N, else 0.
 *   prod  v = 2 when (j + r) mod P == 0, else 1, with P >= 3 chosen so that no element
 *         collects more twos than the dtype can hold (2^6 for int8, 2^15 for float16).
 *   min,
 *   max   v = (j + r) mod 100: a window of N consecutive residues, whose ends are known.
 *   avg   v = b(j) + d(r) with b = 1 + j mod K' and d = +1, -1, +1, -1, ... (0 on the
 *         last rank when N is odd), so the sum is exactly N*b and the mean exactly b.
 *
 * Collectives that do not reduce move D(r, i) = (i + 13 r) mod 97: different on every
 * rank, exact in every dtype (all-to-all: element i of rank r's send buffer is D(r, i),
 * so block b of rank r's output holds D(b, r·count + j)).  All values are non-negative, so the
 * poison pattern (all bits set: NaN, -1 or the type's maximum) never equals an expected value.
 */
#include "bench_util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- names --------------------------------------------------------------------------- */

static const char *const coll_names[BENCH_NUM_COLLS] = {"all_reduce",     "all_gather",
                                                        "reduce_scatter", "broadcast",
                                                        "reduce",         "sendrecv",
                                                        "all_to_all",     "gather",
                                                        "scatter"};

const char *bench_coll_name(bench_coll c) {
  return (unsigned)c < BENCH_NUM_COLLS ? coll_names[c] : NULL;
}

int bench_parse_coll(const char *s) {
  static const struct {
    const char *name;
    int coll;
  } aliases[] = {
      {"all", -1},
      {"allreduce", BENCH_ALL_REDUCE},
      {"allgather", BENCH_ALL_GATHER},
      {"reducescatter", BENCH_REDUCE_SCATTER},
      {"bcast", BENCH_BROADCAST},
      {"alltoall", BENCH_ALL_TO_ALL},
  };
  for (int c = 0; c < BENCH_NUM_COLLS; c++)
    if (strcmp(s, coll_names[c]) == 0) return c;
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(s, aliases[i].name) == 0) return aliases[i].coll;
  return -2;
}

static const char *const dtype_names[COLL_NUM_DTYPES] = {"int8",    "uint8",  "int32",   "uint32",
                                                         "int64",   "uint64", "float16", "bfloat16",
                                                         "float32", "float64"};

const char *bench_dtype_name(coll_dtype t) {
  return (unsigned)t < COLL_NUM_DTYPES ? dtype_names[t] : NULL;
}

int bench_parse_dtype(const char *s) {
  static const struct {
    const char *name;
    int dtype;
  } aliases[] = {
      {"all", -1},
      {"char", COLL_INT8},
      {"int", COLL_INT32},
      {"half", COLL_FLOAT16},
      {"fp16", COLL_FLOAT16},
      {"bf16", COLL_BFLOAT16},
      {"float", COLL_FLOAT32},
      {"fp32", COLL_FLOAT32},
      {"double", COLL_FLOAT64},
      {"fp64", COLL_FLOAT64},
  };
  for (int t = 0; t < COLL_NUM_DTYPES; t++)
    if (strcmp(s, dtype_names[t]) == 0) return t;
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(s, aliases[i].name) == 0) return aliases[i].dtype;
  return -2;
}

static const char *const op_names[COLL_NUM_OPS] = {"sum", "prod", "min", "max", "avg"};

const char *bench_op_name(coll_op op) { return (unsigned)op < COLL_NUM_OPS ? op_names[op] : NULL; }

int bench_parse_op(const char *s) {
  if (strcmp(s, "all") == 0) return -1;
  for (int o = 0; o < COLL_NUM_OPS; o++)
    if (strcmp(s, op_names[o]) == 0) return o;
  return -2;
}

size_t bench_dtype_size(coll_dtype t) {
  switch (t) {
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

bool bench_parse_uint(const char *s, unsigned long max, unsigned long *out) {
  if (!s || *s < '0' || *s > '9') return false;
  errno = 0;
  char *end;
  unsigned long v = strtoul(s, &end, 10);
  if (errno || *end || v > max) return false;
  *out = v;
  return true;
}

bool bench_parse_size(const char *s, size_t *out) {
  if (!s || *s < '0' || *s > '9') return false;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return false;
  unsigned shift = 0;
  switch (*end) {
  case 'k':
  case 'K':
    shift = 10;
    end++;
    break;
  case 'm':
  case 'M':
    shift = 20;
    end++;
    break;
  case 'g':
  case 'G':
    shift = 30;
    end++;
    break;
  default: break;
  }
  if (shift && (*end == 'i' || *end == 'I')) {
    end++;
    if (*end != 'b' && *end != 'B') return false;
  }
  if (*end == 'b' || *end == 'B') end++;
  if (*end) return false;
  if (shift && v > (SIZE_MAX >> shift)) return false;
  if (v > SIZE_MAX) return false;
  *out = (size_t)(v << shift);
  return true;
}

/* ---- nccl-tests conventions ------------------------------------------------------------ */

bool bench_coll_reduces(bench_coll c) {
  return c == BENCH_ALL_REDUCE || c == BENCH_REDUCE_SCATTER || c == BENCH_REDUCE;
}

bool bench_coll_rooted(bench_coll c) {
  return c == BENCH_BROADCAST || c == BENCH_REDUCE || c == BENCH_GATHER || c == BENCH_SCATTER;
}

bench_shape bench_shape_for(bench_coll c, size_t bytes, size_t typesize, int nranks) {
  bench_shape s = {0, 0, 0, 0};
  if (typesize == 0 || nranks < 1) return s;
  size_t n = (size_t)nranks;
  switch (c) {
  case BENCH_ALL_GATHER:
    s.count = bytes / typesize / n;
    s.send_elems = s.count;
    s.recv_elems = s.count * n;
    s.bytes = s.count * n * typesize;
    break;
  case BENCH_REDUCE_SCATTER:
  case BENCH_SCATTER:
    s.count = bytes / typesize / n;
    s.send_elems = s.count * n;
    s.recv_elems = s.count;
    s.bytes = s.count * n * typesize;
    break;
  case BENCH_GATHER:
    s.count = bytes / typesize / n;
    s.send_elems = s.count;
    s.recv_elems = s.count * n;
    s.bytes = s.count * n * typesize;
    break;
  case BENCH_ALL_TO_ALL:
    s.count = bytes / typesize / n;
    s.send_elems = s.recv_elems = s.count * n;
    s.bytes = s.count * n * typesize;
    break;
  default:
    s.count = bytes / typesize;
    s.send_elems = s.recv_elems = s.count;
    s.bytes = s.count * typesize;
    break;
  }
  return s;
}

double bench_bus_factor(bench_coll c, int nranks) {
  double n = nranks;
  switch (c) {
  case BENCH_ALL_REDUCE: return 2.0 * (n - 1) / n;
  case BENCH_ALL_GATHER:
  case BENCH_REDUCE_SCATTER:
  case BENCH_ALL_TO_ALL:
  case BENCH_GATHER:
  case BENCH_SCATTER: return (n - 1) / n;
  default: return 1.0;
  }
}

double bench_algbw(size_t bytes, double time_us) {
  if (!(time_us > 0)) return 0.0;
  return (double)bytes / 1e9 / (time_us * 1e-6);
}

void bench_format_time(double us, char *buf, size_t len) {
  if (us >= 10000.0)
    snprintf(buf, len, "%7.0f", us);
  else if (us >= 100.0)
    snprintf(buf, len, "%7.1f", us);
  else
    snprintf(buf, len, "%7.2f", us);
}

double bench_percentile(const double *sorted, size_t n, double q) {
  if (n == 0) return 0.0;
  double pos = ceil(q * (double)n);
  size_t i = pos < 1 ? 0 : (size_t)pos - 1;
  if (i >= n) i = n - 1;
  return sorted[i];
}

/* ---- half types ------------------------------------------------------------------------ */

uint16_t bench_float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
  if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
  int e = (int)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) { /* subnormal half (or zero) */
    if (e < -10) return sign;
    man |= 0x800000u;
    unsigned shift = (unsigned)(14 - e);
    uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; /* a carry may reach infinity */
  return (uint16_t)(sign | h);
}

float bench_half_to_float(uint16_t h) {
  unsigned e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  float f;
  if (e == 0)
    f = ldexpf((float)m, -24);
  else if (e == 31)
    f = m ? NAN : INFINITY;
  else
    f = ldexpf((float)(m | 0x400u), (int)e - 25);
  return (h & 0x8000u) ? -f : f;
}

uint16_t bench_float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu)) return (uint16_t)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

float bench_bf16_to_float(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

/* ---- element access ------------------------------------------------------------------- */

void bench_store(coll_dtype t, void *buf, size_t i, double v) {
  switch (t) {
  case COLL_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
  case COLL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
  case COLL_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
  case COLL_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
  case COLL_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
  case COLL_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
  case COLL_FLOAT16: ((uint16_t *)buf)[i] = bench_float_to_half((float)v); break;
  case COLL_BFLOAT16: ((uint16_t *)buf)[i] = bench_float_to_bf16((float)v); break;
  case COLL_FLOAT32: ((float *)buf)[i] = (float)v; break;
  case COLL_FLOAT64: ((double *)buf)[i] = v; break;
  }
}

double bench_load(coll_dtype t, const void *buf, size_t i) {
  switch (t) {
  case COLL_INT8: return ((const int8_t *)buf)[i];
  case COLL_UINT8: return ((const uint8_t *)buf)[i];
  case COLL_INT32: return ((const int32_t *)buf)[i];
  case COLL_UINT32: return ((const uint32_t *)buf)[i];
  case COLL_INT64: return (double)((const int64_t *)buf)[i];
  case COLL_UINT64: return (double)((const uint64_t *)buf)[i];
  case COLL_FLOAT16: return bench_half_to_float(((const uint16_t *)buf)[i]);
  case COLL_BFLOAT16: return bench_bf16_to_float(((const uint16_t *)buf)[i]);
  case COLL_FLOAT32: return ((const float *)buf)[i];
  case COLL_FLOAT64: return ((const double *)buf)[i];
  }
  return NAN;
}

void bench_poison(void *buf, size_t bytes) { memset(buf, 0xff, bytes); }

/* ---- data patterns -------------------------------------------------------------------- */

/* The largest L such that 0..L are all exact in the dtype (capped: patterns stay small). */
static uint64_t exact_limit(coll_dtype t) {
  switch (t) {
  case COLL_INT8: return 127;
  case COLL_UINT8: return 255;
  case COLL_FLOAT16: return 2048;
  case COLL_BFLOAT16: return 256;
  case COLL_FLOAT32: return 1u << 24;
  default: return 1ull << 31;
  }
}

/* How many factors of two a product may collect without leaving the exact range. */
static int max_twos(coll_dtype t) {
  switch (t) {
  case COLL_INT8: return 6;
  case COLL_UINT8: return 7;
  case COLL_INT32: return 30;
  case COLL_UINT32: return 31;
  case COLL_INT64: return 62;
  case COLL_UINT64: return 63;
  case COLL_FLOAT16: return 15;
  case COLL_BFLOAT16:
  case COLL_FLOAT32: return 127;
  case COLL_FLOAT64: return 1023;
  }
  return 1;
}

#define MINMAX_MOD 100u
#define DATA_MOD 97u

static uint64_t sum_modulus(const bench_data *d) {
  uint64_t k = exact_limit(d->dtype) / (uint64_t)d->nranks + 1;
  return k > 8 ? 8 : k; /* < 2: one-hot */
}

static uint64_t prod_period(const bench_data *d) {
  uint64_t n = (uint64_t)d->nranks, m = (uint64_t)max_twos(d->dtype);
  uint64_t p = (n + m - 1) / m;
  return p < 3 ? 3 : p;
}

static int64_t avg_modulus(const bench_data *d) {
  int64_t k = (int64_t)(exact_limit(d->dtype) / (uint64_t)d->nranks) - 1;
  return k > 4 ? 4 : k; /* < 1: every rank feeds the same constant */
}

static double reduce_input(const bench_data *d, int rank, uint64_t j) {
  uint64_t r = (uint64_t)rank, n = (uint64_t)d->nranks;
  switch (d->op) {
  case COLL_SUM: {
    uint64_t k = sum_modulus(d);
    if (k < 2) return j % n == r ? 1.0 : 0.0;
    return (double)((j + r) % k);
  }
  case COLL_PROD: return (j + r) % prod_period(d) == 0 ? 2.0 : 1.0;
  case COLL_MIN:
  case COLL_MAX: return (double)((j + r) % MINMAX_MOD);
  case COLL_AVG: {
    int64_t k = avg_modulus(d);
    if (k < 1) return n <= exact_limit(d->dtype) ? 1.0 : 0.0;
    int64_t b = 1 + (int64_t)(j % (uint64_t)k);
    int64_t dr = (n % 2 == 1 && r == n - 1) ? 0 : (r % 2 == 0 ? 1 : -1);
    return (double)(b + dr);
  }
  }
  return 0.0;
}

static double reduce_expected(const bench_data *d, uint64_t j) {
  uint64_t n = (uint64_t)d->nranks;
  switch (d->op) {
  case COLL_SUM: {
    uint64_t k = sum_modulus(d);
    if (k < 2) return 1.0;
    uint64_t s = (n / k) * (k * (k - 1) / 2);
    for (uint64_t t = 0; t < n % k; t++) s += (j + t) % k;
    return (double)s;
  }
  case COLL_PROD: {
    uint64_t p = prod_period(d), r0 = (p - j % p) % p;
    int twos = r0 < n ? (int)((n - 1 - r0) / p + 1) : 0;
    return ldexp(1.0, twos);
  }
  case COLL_MIN:
  case COLL_MAX: {
    uint64_t s = j % MINMAX_MOD;
    bool wraps = n >= MINMAX_MOD || s + n - 1 >= MINMAX_MOD;
    if (d->op == COLL_MAX) return (double)(wraps ? MINMAX_MOD - 1 : s + n - 1);
    return (double)(wraps ? 0 : s);
  }
  case COLL_AVG: {
    int64_t k = avg_modulus(d);
    if (k < 1) return n <= exact_limit(d->dtype) ? 1.0 : 0.0;
    return (double)(1 + (int64_t)(j % (uint64_t)k));
  }
  }
  return 0.0;
}

static double plain_data(int rank, uint64_t i) {
  return (double)((i + 13u * (uint64_t)rank) % DATA_MOD);
}

double bench_input_value(const bench_data *d, int rank, size_t idx) {
  if (bench_coll_reduces(d->coll)) return reduce_input(d, rank, idx);
  return plain_data(rank, idx);
}

bool bench_output_checked(const bench_data *d, int rank) {
  return (d->coll != BENCH_REDUCE && d->coll != BENCH_GATHER) || rank == d->root;
}

double bench_expected_value(const bench_data *d, int rank, size_t count, size_t idx) {
  switch (d->coll) {
  case BENCH_ALL_REDUCE:
  case BENCH_REDUCE: return reduce_expected(d, idx);
  case BENCH_REDUCE_SCATTER: return reduce_expected(d, (uint64_t)rank * count + idx);
  case BENCH_ALL_GATHER: return count ? plain_data((int)(idx / count), idx % count) : NAN;
  case BENCH_BROADCAST: return plain_data(d->root, idx);
  case BENCH_SENDRECV: return plain_data((rank - 1 + d->nranks) % d->nranks, idx);
  case BENCH_ALL_TO_ALL: /* block b came from rank b: its block `rank` */
    return count ? plain_data((int)(idx / count), (size_t)rank * count + idx % count) : NAN;
  case BENCH_GATHER: return count ? plain_data((int)(idx / count), idx % count) : NAN;
  case BENCH_SCATTER: return plain_data(d->root, (size_t)rank * count + idx);
  default: return NAN;
  }
}

void bench_fill_input(const bench_data *d, int rank, void *buf, size_t first, size_t n) {
  for (size_t i = 0; i < n; i++)
    bench_store(d->dtype, buf, i, bench_input_value(d, rank, first + i));
}

static double avg_tolerance(coll_dtype t) {
  switch (t) {
  case COLL_FLOAT16: return ldexp(1.0, -10);
  case COLL_BFLOAT16: return ldexp(1.0, -7);
  case COLL_FLOAT32: return ldexp(1.0, -21);
  case COLL_FLOAT64: return ldexp(1.0, -50);
  default: return 0.0;
  }
}

bench_check_result bench_check_output(const bench_data *d, int rank, size_t count, const void *buf,
                                      size_t n) {
  bench_check_result res = {0, 0, 0.0, 0.0};
  if (!bench_output_checked(d, rank)) return res;
  double tol = (bench_coll_reduces(d->coll) && d->op == COLL_AVG) ? avg_tolerance(d->dtype) : 0;
  for (size_t i = 0; i < n; i++) {
    double want = bench_expected_value(d, rank, count, i);
    double got = bench_load(d->dtype, buf, i);
    bool ok = tol > 0 ? fabs(got - want) <= tol * fmax(1.0, fabs(want)) : got == want;
    if (!ok) {
      if (res.wrong == 0) {
        res.first_index = i;
        res.first_expected = want;
        res.first_got = got;
      }
      res.wrong++;
    }
  }
  return res;
}

void bench_format_value(coll_dtype t, double v, char *buf, size_t len) {
  if (isnan(v))
    snprintf(buf, len, "nan");
  else if (t == COLL_FLOAT16 || t == COLL_BFLOAT16 || t == COLL_FLOAT32 || t == COLL_FLOAT64)
    snprintf(buf, len, "%.9g", v);
  else
    snprintf(buf, len, "%.0f", v);
}
