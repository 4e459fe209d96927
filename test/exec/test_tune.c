/* test_tune.c — the algorithm choice (tune.c) and the one-shot path (oneshot.c).
 *
 * Checks that every rank makes the same choice at every size, that COLL_ALGO forces an
 * algorithm where it can serve the call and falls back (still correct) where it cannot,
 * that COLL_TUNE_FILE caches the measurement (not one taken beside a busy loop, above
 * COLL_TUNE_BUSY) and COLL_TUNE=0 skips it, and that long
 * mixed sequences of one-shot calls (writers and non-writers alternating, the case the
 * mailbox reuse rule is about) give exact results for N = 2..6.
 */
#include <criterion/criterion.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_trace.h"
#include "coll_test.h"

static const char *colls[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"};

/* Every rank hashes its choices over sizes 1 B .. 1 GiB; all hashes must agree, and the
 * choice at 8 B / 256 MiB must be what the test expects. */
typedef struct {
  const char *small, *large; /* expected all_reduce choice at 8 B and 256 MiB, or NULL */
} expect;

static int agree(coll_comm_t comm, int rank, int n, void *arg) {
  const expect *ex = arg;
  uint64_t h = 1469598103934665603ull;
  for (int c = 0; c < 5; c++)
    for (int k = 0; k <= 30; k++) {
      const char *a = coll_comm_algo_for(comm, colls[c], (size_t)1 << k, NULL, 0);
      if (!a) return t_failf("rank %d: no choice for %s at %zu B", rank, colls[c], (size_t)1 << k);
      for (const char *p = a; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    }
  uint64_t *all = calloc((size_t)n, sizeof *all);
  if (!all) return 1;
  coll_result r = coll_all_gather(&h, all, 1, COLL_UINT64, comm, NULL);
  int bad = r != COLL_OK;
  for (int i = 0; i < n && !bad; i++)
    if (all[i] != h) bad = t_failf("rank %d chose differently from rank %d", rank, i);
  free(all);
  char why[256];
  const char *s = coll_comm_algo_for(comm, "all_reduce", 8, why, sizeof why);
  const char *l = coll_comm_algo_for(comm, "all_reduce", 256u << 20, NULL, 0);
  if (ex->small && strcmp(s, ex->small) != 0)
    bad = t_failf("rank %d: all_reduce 8 B chose %s, want %s (%s)", rank, s, ex->small, why);
  if (strcmp(l, "oneshot") == 0)
    bad = t_failf("rank %d: 256 MiB cannot go through a mailbox but chose oneshot", rank);
  if (ex->large && strcmp(l, ex->large) != 0)
    bad = t_failf("rank %d: all_reduce 256 MiB chose %s, want %s", rank, l, ex->large);
  if (!strstr(why, "ring"))
    bad = t_failf("rank %d: the reasons do not price the ring: %s", rank, why);
  return bad;
}

static void run(int n, coll_rank_fn fn, void *arg) {
  char why[512] = "";
  int st = t_launch(n, fn, arg, 60000, why, sizeof why);
  cr_assert_eq(st, 0, "n=%d: %s", n, why);
  T_ASSERT_NO_LEFTOVERS("after the job");
}

/* Measured parameters differ from run to run (a busy machine): only agreement is
 * certain.  With the fixed defaults (COLL_TUNE=0) the choice itself is known. */
Test(tune, every_rank_chooses_alike, .timeout = 120) {
  expect ex = {.small = NULL, .large = NULL};
  for (int n = 2; n <= 5; n++) run(n, agree, &ex);
}

Test(tune, defaults_choose_oneshot_small_and_a_schedule_large, .timeout = 120) {
  setenv("COLL_TUNE", "0", 1);
  expect ex = {.small = "oneshot", .large = NULL};
  for (int n = 2; n <= 4; n++) run(n, agree, &ex);
  unsetenv("COLL_TUNE");
}

Test(tune, large_messages_never_take_the_oneshot_path, .timeout = 60) {
  /* The one-shot path cannot carry more than a mailbox: a large call must get a FIFO
   * algorithm whatever COLL_ALGO says. */
  setenv("COLL_ALGO", "oneshot", 1);
  expect ex = {.small = "oneshot", .large = NULL};
  run(3, agree, &ex);
  unsetenv("COLL_ALGO");
}

Test(tune, coll_algo_ring_forces_the_ring, .timeout = 60) {
  setenv("COLL_ALGO", "ring", 1);
  expect ex = {.small = "ring", .large = "ring"};
  run(2, agree, &ex);
  run(4, agree, &ex);
  unsetenv("COLL_ALGO");
}

/* ---- results under forcing and fallback ---------------------------------------------- */

static int sums(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  static const size_t counts[] = {1, 7, 1000, 16384, 300001};
  int bad = 0;
  for (size_t i = 0; i < sizeof counts / sizeof counts[0] && !bad; i++) {
    size_t c = counts[i];
    int32_t *in = malloc(c * 4), *out = malloc(c * 4);
    if (!in || !out) return 1;
    for (size_t k = 0; k < c; k++) in[k] = (int32_t)(k * 3 + (size_t)rank);
    coll_result r = coll_all_reduce(in, out, c, COLL_INT32, COLL_SUM, comm, NULL);
    if (r != COLL_OK) bad = t_failf("rank %d: all_reduce %zu: %s", rank, c, coll_result_string(r));
    for (size_t k = 0; k < c && !bad; k++) {
      int32_t want = (int32_t)(k * 3 * (size_t)n + (size_t)(n * (n - 1) / 2));
      if (out[k] != want)
        bad = t_failf("rank %d: count %zu element %zu = %d, want %d", rank, c, k, out[k], want);
    }
    free(in);
    free(out);
  }
  return bad;
}

Test(tune, forced_oneshot_falls_back_for_large_calls, .timeout = 120) {
  setenv("COLL_ALGO", "oneshot", 1);
  run(2, sums, NULL);
  run(3, sums, NULL);
  unsetenv("COLL_ALGO");
}

Test(tune, unknown_coll_algo_is_reported_and_ignored, .timeout = 60) {
  setenv("COLL_ALGO", "no-such-algorithm", 1);
  run(2, sums, NULL);
  unsetenv("COLL_ALGO");
}

/* ---- COLL_TUNE_FILE and COLL_TUNE=0 --------------------------------------------------- */

static int params(coll_comm_t comm, int rank, int n, void *arg) {
  (void)n;
  double *want = arg; /* NULL: just report through the file */
  double a, b, g, m;
  if (coll_comm_tune_params(comm, &a, &b, &g, &m) != COLL_OK) return 1;
  if (!(a > 0 && b > 0 && g > 0 && m >= 0)) return t_failf("rank %d: bad params", rank);
  if (want && (a != want[0] || b != want[1] || g != want[2] || m != want[3]))
    return t_failf("rank %d: params %g %g %g %g, want %g %g %g %g", rank, a, b, g, m, want[0],
                   want[1], want[2], want[3]);
  return 0;
}

/* Every rank's coll_comm_tune_source is `arg`, and its share is in range (or -1). */
static int source_is(coll_comm_t comm, int rank, int n, void *arg) {
  (void)n;
  double share = -2;
  const char *src = coll_comm_tune_source(comm, &share);
  if (!src || strcmp(src, (const char *)arg) != 0)
    return t_failf("rank %d: the figures came from %s, want %s", rank, src ? src : "NULL",
                   (const char *)arg);
  if (!(share == -1 || (share >= 0 && share <= 1)))
    return t_failf("rank %d: foreign share %g", rank, share);
  return 0;
}

/* A fresh path for a cache file, not created. */
static void fresh_path(char *path) {
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  close(fd);
  unlink(path);
}

/* The first line of the cache at `path` ("" if none), and its foreign= share (-2 if none). */
static double cache_line(const char *path, char *line, size_t len) {
  FILE *f = fopen(path, "r");
  line[0] = 0;
  if (!f) return -2;
  if (!fgets(line, (int)len, f)) line[0] = 0;
  fclose(f);
  const char *fo = strstr(line, " foreign=");
  double share = -2;
  if (fo) sscanf(fo, " foreign=%lg", &share);
  return share;
}

Test(tune, tune_file_is_written_then_read, .timeout = 60) {
  char path[] = "/tmp/coll-tune-XXXXXX";
  fresh_path(path);
  setenv("COLL_TUNE_FILE", path, 1);
  setenv("COLL_TUNE_BUSY", "100", 1); /* cached even on a loaded machine */
  run(2, source_is, "measured");
  char line[768];
  double share = cache_line(path, line, sizeof line);
  cr_assert(line[0], "rank 0 did not write %s", path);
  cr_assert(share >= -1 && share <= 1, "the line does not say how busy the machine was: %s", line);
  double v[4];
  char *at = strstr(line, " alpha=");
  cr_assert(at, "line: %s", line);
  cr_assert_eq(sscanf(at, " alpha=%lg beta=%lg gamma=%lg alpha_mb=%lg", &v[0], &v[1], &v[2], &v[3]),
               4, "line: %s", line);
  /* The second communicator reads the cached numbers instead of measuring. */
  run(2, params, v);
  run(2, source_is, "cache");
  unsetenv("COLL_TUNE_FILE");
  unsetenv("COLL_TUNE_BUSY");
  unlink(path);
}

/* With a busy loop on every CPU the ranks may use (at most two: this test binds itself to
 * its first two), a measurement is busy: above COLL_TUNE_BUSY the communicator takes the
 * fixed defaults and nothing is cached, and with COLL_TUNE_BUSY=100 the line it writes
 * says how busy (a loop on each core takes about half of every rank's time: at least 20 %
 * is asserted).  The loops are killed and reaped before asserting. */
Test(tune, a_measurement_beside_busy_loops_is_not_cached, .timeout = 120) {
  cpu_set_t allowed, two;
  cr_assert(sched_getaffinity(0, sizeof allowed, &allowed) == 0);
  CPU_ZERO(&two);
  int cpus[2], ncpu = 0;
  for (int c = 0; c < CPU_SETSIZE && ncpu < 2; c++)
    if (CPU_ISSET(c, &allowed)) CPU_SET(c, &two), cpus[ncpu++] = c;
  cr_assert(sched_setaffinity(0, sizeof two, &two) == 0);
  pid_t loops[2];
  for (int i = 0; i < ncpu; i++) {
    loops[i] = t_spin_child(cpus[i]);
    cr_assert(loops[i] >= 0, "fork failed");
  }
  char quiet_path[] = "/tmp/coll-tune-busy-XXXXXX", kept_path[] = "/tmp/coll-tune-kept-XXXXXX";
  fresh_path(quiet_path);
  fresh_path(kept_path);
  char why[512] = "";
  setenv("COLL_TUNE_BUSY", "10", 1);
  setenv("COLL_TUNE_FILE", quiet_path, 1);
  double defaults[4] = {1e-6, 1.0 / 5e9, 1.0 / 10e9, 0.5e-6}; /* as COLL_TUNE=0 */
  int st1 = t_launch(2, params, defaults, 90000, why, sizeof why);
  int st3 = st1 == 0 ? t_launch(2, source_is, "busy", 90000, why, sizeof why) : -1;
  setenv("COLL_TUNE_BUSY", "100", 1);
  setenv("COLL_TUNE_FILE", kept_path, 1);
  int st2 = st3 == 0 ? t_launch(2, params, NULL, 90000, why, sizeof why) : -1;
  unsetenv("COLL_TUNE_BUSY");
  unsetenv("COLL_TUNE_FILE");
  for (int i = 0; i < ncpu; i++) t_spin_stop(loops[i]);
  char line[768];
  bool written = access(quiet_path, F_OK) == 0;
  double share = cache_line(kept_path, line, sizeof line);
  unlink(quiet_path);
  unlink(kept_path);
  cr_assert_eq(st1, 0, "%s", why);
  cr_assert_eq(st3, 0, "%s", why);
  cr_assert_eq(st2, 0, "%s", why);
  cr_assert(!written, "a measurement beside a busy loop on every core was cached");
  cr_assert_geq(share, 0.2, "with COLL_TUNE_BUSY=100 the line says foreign=%g (want >= 0.2): %s",
                share, line);
  T_ASSERT_NO_LEFTOVERS("after the jobs");
}

Test(tune, coll_tune_0_uses_the_defaults, .timeout = 60) {
  setenv("COLL_TUNE", "0", 1);
  double want[4] = {1e-6, 1.0 / 5e9, 1.0 / 10e9, 0.5e-6};
  run(3, params, want);
  run(2, source_is, "defaults");
  unsetenv("COLL_TUNE");
}

/* ---- one-shot sequences ---------------------------------------------------------------- */

/* 2000 calls of random one-shot collectives (and a few ring ones) with random roots,
 * counts and in-place use; each result checked exactly (int64 arithmetic). */
static int sequence(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  uint64_t st = 12345; /* same stream on every rank: same calls */
  enum { MAXC = 2048 };
  int64_t *in = malloc((size_t)MAXC * (size_t)n * 8), *out = malloc((size_t)MAXC * (size_t)n * 8);
  if (!in || !out) return 1;
  int bad = 0;
  for (int it = 0; it < 2000 && !bad; it++) {
    int kind = (int)(t_rand(&st) % 7);
    size_t c = 1 + t_rand(&st) % (it % 50 == 49 ? 40000 : 64);
    if (c > MAXC && kind != 0) c = MAXC;
    int root = (int)(t_rand(&st) % (uint64_t)n);
    int64_t salt = (int64_t)(t_rand(&st) % 1000);
    coll_result r = COLL_OK;
    int64_t *buf = c > MAXC ? malloc(c * 8) : NULL, *o = buf ? malloc(c * 8) : out;
    int64_t *x = buf ? buf : in;
    if (buf && !o) return 1;
    for (size_t k = 0; k < c * (size_t)n && (kind == 3 || kind == 4 || k < c); k++)
      x[k] = salt + (int64_t)k * 7 + rank;
    switch (kind) {
    case 0: /* all-reduce, sometimes large (ring) */
      r = coll_all_reduce(x, o, c, COLL_INT64, COLL_SUM, comm, NULL);
      for (size_t k = 0; k < c && !r && !bad; k++)
        if (o[k] != n * (salt + (int64_t)k * 7) + n * (n - 1) / 2)
          bad = t_failf("it %d all_reduce[%zu] = %lld", it, k, (long long)o[k]);
      break;
    case 1: /* broadcast: only the root writes */
      r = coll_broadcast(x, o, c, COLL_INT64, root, comm, NULL);
      for (size_t k = 0; k < c && !r && !bad; k++)
        if (o[k] != salt + (int64_t)k * 7 + root)
          bad = t_failf("it %d broadcast[%zu] = %lld", it, k, (long long)o[k]);
      break;
    case 2: /* reduce: only the root reads */
      r = coll_reduce(x, o, c, COLL_INT64, COLL_MAX, root, comm, NULL);
      for (size_t k = 0; k < c && !r && !bad && rank == root; k++)
        if (o[k] != salt + (int64_t)k * 7 + n - 1)
          bad = t_failf("it %d reduce[%zu] = %lld", it, k, (long long)o[k]);
      break;
    case 3: /* all-gather, in place */
      memmove(o + (size_t)rank * c, x, c * 8);
      r = coll_all_gather(o + (size_t)rank * c, o, c, COLL_INT64, comm, NULL);
      for (size_t k = 0; k < c * (size_t)n && !r && !bad; k++)
        if (o[k] != salt + (int64_t)(k % c) * 7 + (int64_t)(k / c))
          bad = t_failf("it %d all_gather[%zu] = %lld", it, k, (long long)o[k]);
      break;
    case 4: /* reduce-scatter */
      r = coll_reduce_scatter(x, o, c, COLL_INT64, COLL_SUM, comm, NULL);
      for (size_t k = 0; k < c && !r && !bad; k++) {
        int64_t e = (int64_t)((size_t)rank * c + k);
        if (o[k] != n * (salt + e * 7) + n * (n - 1) / 2)
          bad = t_failf("it %d reduce_scatter[%zu] = %lld", it, k, (long long)o[k]);
      }
      break;
    case 5: r = coll_barrier(comm, NULL); break;
    default: /* in-place all-reduce of one element */
      x[0] = rank + 1;
      r = coll_all_reduce(x, x, 1, COLL_INT64, COLL_PROD, comm, NULL);
      if (!r) {
        int64_t f = 1;
        for (int i = 1; i <= n; i++) f *= i;
        if (x[0] != f) bad = t_failf("it %d prod = %lld", it, (long long)x[0]);
      }
    }
    if (r != COLL_OK)
      bad = t_failf("rank %d it %d kind %d: %s", rank, it, kind, coll_comm_last_error(comm));
    if (buf) {
      free(buf);
      free(o);
    }
  }
  free(in);
  free(out);
  return bad;
}

Test(tune, oneshot_mixed_sequences, .timeout = 300) {
  /* Forced, so the one-shot path runs whatever the measurement says (large calls fall
   * back to a schedule); then as the tuner chooses. */
  setenv("COLL_ALGO", "oneshot", 1);
  for (int n = 2; n <= 6; n++) run(n, sequence, NULL);
  unsetenv("COLL_ALGO");
  for (int n = 2; n <= 4; n++) run(n, sequence, NULL);
}

/* The direct path (process_vm_readv; root may always read) on every collective it
 * serves, checked exactly: the random sequences, then large all-reduces. */
Test(tune, direct_reads_give_exact_results, .timeout = 300) {
  setenv("COLL_ALGO", "direct", 1);
  for (int n = 2; n <= 5; n++) run(n, sequence, NULL);
  run(2, sums, NULL);
  run(3, sums, NULL);
  unsetenv("COLL_ALGO");
}
