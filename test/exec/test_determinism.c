/* test_determinism.c — the same job gives the same bits.
 *
 * Different algorithms add in different orders, so a float all-reduce gives the same
 * bits run after run only if the tuner chooses the same algorithm every run.  Here the
 * same program — fresh communicators, so a fresh tuning each time — runs five times at
 * N = 2 and 4, float32 all-reduces of 1 KiB to 8 MiB whose inputs span many exponents
 * (so that any change of order changes the last bits), and every run must give the
 * same result bits and name the same algorithms.  The tuning cache (exec/tune.c) is a
 * private file of this test: the first run measures, later runs read it, as a user's
 * runs on one machine do.
 *
 * It also checks that the inputs are order-sensitive at all: two different forced
 * algorithms must give different bits for at least one size at N = 4, or the test
 * would prove nothing.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_trace.h"
#include "coll_test.h"

#define RUNS 5
#define SIZES 14 /* 1 KiB << 0 .. 13: 1 KiB to 8 MiB */

typedef struct {
  uint64_t hash[SIZES];
  char algo[SIZES][16];
} outcome;

typedef struct {
  const char *path; /* rank 0 writes its outcome here */
} arg_t;

static uint64_t fnv(const void *p, size_t n) {
  const uint8_t *b = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* Values from 2^-20 to 2^20 with both signs: sums of them round differently in every
 * order. */
static float input(int rank, size_t i) {
  uint64_t s = (uint64_t)rank * 0x9e3779b97f4a7c15ull + i;
  uint64_t r = t_rand(&s);
  float m = 1.0f + (float)(r & 0xffff) / 65536.0f;
  int e = (int)((r >> 16) % 41) - 20;
  float v = m;
  for (; e > 0; e--) v *= 2;
  for (; e < 0; e++) v /= 2;
  return (r >> 40) & 1 ? -v : v;
}

static int job(coll_comm_t comm, int rank, int n, void *varg) {
  (void)n;
  const arg_t *a = varg;
  size_t max = (size_t)8 << 20;
  float *in = malloc(max), *out = malloc(max);
  if (!in || !out) return t_failf("rank %d: out of memory", rank);
  for (size_t i = 0; i < max / 4; i++) in[i] = input(rank, i);
  outcome o;
  memset(&o, 0, sizeof o);
  for (int k = 0; k < SIZES; k++) {
    size_t count = ((size_t)1024 << k) / 4;
    if (coll_all_reduce(in, out, count, COLL_FLOAT32, COLL_SUM, comm, NULL) != COLL_OK) {
      free(in), free(out);
      return t_failf("rank %d: all-reduce of %zu floats: %s", rank, count,
                     coll_comm_last_error(comm));
    }
    o.hash[k] = fnv(out, count * 4);
    const char *al = coll_comm_last_algo(comm);
    snprintf(o.algo[k], sizeof o.algo[k], "%s", al ? al : "?");
  }
  free(in), free(out);
  if (rank == 0) {
    FILE *f = fopen(a->path, "wb");
    if (!f || fwrite(&o, sizeof o, 1, f) != 1) return t_failf("rank 0: cannot write %s", a->path);
    fclose(f);
  }
  return 0;
}

static void run_once(int n, outcome *o) {
  char path[] = "/tmp/coll-determinism-XXXXXX", why[256];
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  close(fd);
  arg_t a = {.path = path};
  int rc = t_launch(n, job, &a, 240000, why, sizeof why);
  FILE *f = fopen(path, "rb");
  size_t got = f ? fread(o, sizeof *o, 1, f) : 0;
  if (f) fclose(f);
  unlink(path);
  cr_assert_eq(rc, 0, "%d ranks: %s", n, why);
  cr_assert_eq(got, 1u, "rank 0 wrote no outcome");
}

static void five_runs(int n) {
  char cache[] = "/tmp/coll-determinism-tune-XXXXXX";
  int fd = mkstemp(cache);
  cr_assert(fd >= 0);
  close(fd);
  unlink(cache); /* the first run finds no cache and measures */
  setenv("COLL_TUNE_FILE", cache, 1);
  setenv("COLL_TUNE_BUSY", "100", 1); /* the first run's figures are kept, busy or not */
  unsetenv("COLL_ALGO");
  outcome first, o;
  run_once(n, &first);
  for (int r = 1; r < RUNS; r++) {
    run_once(n, &o);
    for (int k = 0; k < SIZES; k++) {
      cr_expect_str_eq(o.algo[k], first.algo[k], "N=%d, %zu bytes: run %d chose %s, run 0 %s", n,
                       (size_t)1024 << k, r, o.algo[k], first.algo[k]);
      cr_expect_eq(o.hash[k], first.hash[k], "N=%d, %zu bytes (%s): run %d gave other bits", n,
                   (size_t)1024 << k, o.algo[k], r);
    }
  }
  unsetenv("COLL_TUNE_FILE");
  unsetenv("COLL_TUNE_BUSY");
  unlink(cache);
}

Test(determinism, five_runs_n2_same_bits, .timeout = 300) { five_runs(2); }
Test(determinism, five_runs_n4_same_bits, .timeout = 300) { five_runs(4); }

/* The inputs must be able to tell algorithms apart, or the checks above prove nothing. */
Test(determinism, inputs_are_order_sensitive, .timeout = 300) {
  setenv("COLL_TUNE_FILE", "none", 1);
  outcome ring, rd;
  setenv("COLL_ALGO", "ring", 1);
  run_once(4, &ring);
  setenv("COLL_ALGO", "rd", 1);
  run_once(4, &rd);
  unsetenv("COLL_ALGO");
  unsetenv("COLL_TUNE_FILE");
  int differ = 0;
  for (int k = 0; k < SIZES; k++) differ += ring.hash[k] != rd.hash[k];
  cr_assert_gt(differ, 0, "ring and rd gave the same bits at every size");
}
