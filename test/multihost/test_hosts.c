/* test_hosts.c — several "hosts" on one machine, and the host-aware all-reduce (algo/hier.c).
 *
 * The local launcher's COLL_LAUNCH_RANKS_PER_HOST gives each rank a COLL_HOST_ID
 * ("launch-host-<h>", hosts filled in rank order), so the library sees the layout a cluster
 * would give it: shared memory between ranks of one host, TCP (over loopback) between
 * hosts.  No root, no namespaces: these run everywhere.
 *   2 hosts x 2 ranks   hier forced: all-reduce against tcp_matrix's checker for every dtype
 *                       and op, all-gather for every dtype, counts 0, 1, odd, just over a
 *                       shm and a tcp slot, in place and not; the layout as
 *                       coll_comm_hosts reports it.
 *   2 x 2, auto         the tuner (fixed defaults, COLL_TUNE=0) picks hier for all-reduce at
 *                       64 KiB and up (all-gather at 1 MiB and up) and the call runs it; the bytes
 * per link class (coll_comm_link_bytes, what --explain prints): hier sends fewer bytes across hosts
 * than the flat ring, by the formulas. 2 x 2, measured     the tuner measures the links across
 * hosts (α_x, β_x) and the all-reduce it then picks is right. 3 hosts x 2         hier forced,
 * fewer dtypes and ops. 2 + 1 (unequal)     hier does not fit: forced, the tuner's choice runs
 * instead (right results), the auto choice never names it, and its plan is the ring's. Every job is
 * bounded (launcher timeout, COLL_TIMEOUT_MS) and leaves nothing in /dev/shm.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_test.h"
#include "coll_trace.h"
#include "tcp_matrix.h"

typedef struct {
  int hosts, per_host;    /* what coll_comm_hosts must report (per_host 0: unequal) */
  const char *want_algo;  /* what each all-reduce with data must have run, NULL: anything */
  const char *never_algo; /* what no call may have run, NULL: no such rule */
  bool all_dtypes;
} job;

static const coll_dtype all_dtypes[] = {COLL_INT32,   COLL_UINT8,   COLL_INT64,
                                        COLL_FLOAT32, COLL_FLOAT64, COLL_BFLOAT16};
static const coll_dtype few_dtypes[] = {COLL_INT32, COLL_FLOAT32, COLL_BFLOAT16};

static int check_layout(coll_comm_t comm, int rank, int n, const job *j) {
  int nh = -1, per = -1, host[16];
  if (coll_comm_hosts(comm, &nh, &per, host) != COLL_OK)
    return t_failf("rank %d: coll_comm_hosts: %s", rank, coll_comm_last_error(comm));
  if (nh != j->hosts || per != j->per_host)
    return t_failf("rank %d: %d hosts of %d ranks each, expected %d of %d", rank, nh, per, j->hosts,
                   j->per_host);
  for (int r = 1; r < n; r++)
    if (host[r] < host[r - 1])
      return t_failf("rank %d: hosts are not filled in rank order: %d then %d", rank, host[r - 1],
                     host[r]);
  return 0;
}

static int rank_matrix(coll_comm_t comm, int rank, int n, void *arg) {
  const job *j = arg;
  if (check_layout(comm, rank, n, j)) return 1;
  size_t cap = (size_t)n * 270000 + 4096; /* an all-gather's output of the largest count */
  uint8_t *a = malloc(cap), *b = malloc(cap);
  if (!a || !b) {
    free(a);
    free(b);
    return t_failf("rank %d: out of memory", rank);
  }
  const coll_dtype *dts = j->all_dtypes ? all_dtypes : few_dtypes;
  size_t ndt = j->all_dtypes ? sizeof all_dtypes / sizeof *all_dtypes
                             : sizeof few_dtypes / sizeof *few_dtypes;
  static const coll_op all_ops[] = {COLL_SUM, COLL_PROD, COLL_MIN, COLL_MAX, COLL_AVG};
  static const coll_op few_ops[] = {COLL_SUM, COLL_MAX, COLL_AVG};
  const coll_op *ops = j->all_dtypes ? all_ops : few_ops;
  size_t nops = j->all_dtypes ? 5 : 3;
  int fails = 0;
  uint64_t seed = 11;
  for (size_t di = 0; di < ndt && !fails; di++) {
    size_t es = coll_dtype_size(dts[di]);
    const size_t counts[] = {0, 1, 3, (size_t)n + 1, 1031, 65536 / es + 7, 262144 / es + 7};
    for (size_t oi = 0; oi < nops && !fails; oi++) {
      bool fl = dts[di] == COLL_FLOAT32 || dts[di] == COLL_FLOAT64 || dts[di] == COLL_BFLOAT16;
      if (ops[oi] == COLL_AVG && !fl) continue;
      /* all-reduce (tm kind 0) with every op; all-gather (kind 2) once per dtype */
      for (int kind = 0; kind <= (oi == 0 ? 2 : 0) && !fails; kind += 2)
        for (int ip = 0; ip < 2 && !fails; ip++)
          for (size_t ci = 0; ci < sizeof counts / sizeof *counts && !fails; ci++) {
            const char *what = kind ? "all_gather" : "all_reduce";
            fails += tm_call(comm, rank, n, kind, dts[di], ops[oi], ip, counts[ci], 0, seed++, a,
                             b);
            const char *ran = coll_comm_last_algo(comm);
            if (!fails && counts[ci] && j->want_algo && (!ran || strcmp(ran, j->want_algo)))
              fails += t_failf("rank %d: %s of %zu %s ran %s, expected %s", rank, what, counts[ci],
                               coll_dtype_name(dts[di]), ran ? ran : "nothing", j->want_algo);
            if (!fails && j->never_algo && ran && !strcmp(ran, j->never_algo))
              fails += t_failf("rank %d: %s of %zu %s ran %s", rank, what, counts[ci],
                               coll_dtype_name(dts[di]), ran);
          }
    }
  }
  free(a);
  free(b);
  return fails ? 1 : 0;
}

static void launch(int n, const char *per_host, const char *algo, const char *tune, job *j,
                   coll_rank_fn fn) {
  setenv("COLL_LAUNCH_RANKS_PER_HOST", per_host, 1);
  setenv("COLL_TIMEOUT_MS", "30000", 1);
  setenv("COLL_TUNE", tune, 1);
  if (strcmp(tune, "0") != 0) setenv("COLL_TUNE_FILE", "none", 1); /* measure, every time */
  if (algo)
    setenv("COLL_ALGO", algo, 1);
  else
    unsetenv("COLL_ALGO");
  char why[256];
  int rc = t_launch(n, fn, j, 100000, why, sizeof why);
  unsetenv("COLL_LAUNCH_RANKS_PER_HOST");
  unsetenv("COLL_ALGO");
  cr_assert_eq(rc, 0, "%d ranks, COLL_LAUNCH_RANKS_PER_HOST=%s, COLL_ALGO=%s: %s", n, per_host,
               algo ? algo : "(auto)", why);
  T_ASSERT_NO_LEFTOVERS("after the job");
}

Test(hosts, two_by_two_hier_matrix, .timeout = 150) {
  job j = {.hosts = 2, .per_host = 2, .want_algo = "hier", .all_dtypes = true};
  launch(4, "2", "hier", "0", &j, rank_matrix);
}

Test(hosts, three_by_two_hier, .timeout = 150) {
  job j = {.hosts = 3, .per_host = 2, .want_algo = "hier"};
  launch(6, "2", "hier", "0", &j, rank_matrix);
}

Test(hosts, unequal_hosts_fall_back, .timeout = 150) {
  job j = {.hosts = 2, .per_host = 0, .never_algo = "hier"};
  launch(3, "2,1", "hier", "0", &j, rank_matrix);
}

/* The choice and the bytes per link class, 2 x 2 or 2 + 1 (j->per_host). */
static int rank_choice(coll_comm_t comm, int rank, int n, void *arg) {
  const job *j = arg;
  if (check_layout(comm, rank, n, j)) return 1;
  char why[512];
  for (size_t bytes = 65536; bytes <= (64u << 20); bytes *= 4) {
    const char *pick = coll_comm_algo_for(comm, "all_reduce", bytes, why, sizeof why);
    bool hier = pick && strcmp(pick, "hier") == 0;
    if (hier != (j->per_host > 1))
      return t_failf("rank %d: all_reduce of %zu B goes to %s (%s)", rank, bytes,
                     pick ? pick : "nothing", why);
    pick = coll_comm_algo_for(comm, "all_gather", bytes * 16, why, sizeof why);
    if ((pick && strcmp(pick, "hier") == 0) != (j->per_host > 1))
      return t_failf("rank %d: all_gather of %zu B goes to %s (%s)", rank, bytes * 16,
                     pick ? pick : "nothing", why);
  }
  /* The bytes each rank sends inside its host and across, from the plans, for a float32
   * all-reduce of S = 4·count bytes (count divisible by N·H: the formulas are exact). */
  size_t count = 6000;
  double S = 4.0 * count;
  uint64_t tot[2][2] = {{0, 0}, {0, 0}}; /* [ring, hier][inside, across] */
  for (int r = 0; r < n; r++)
    for (int k = 0; k < 2; k++) {
      uint64_t in, x;
      if (coll_comm_link_bytes(comm, "all_reduce", count, COLL_FLOAT32, k ? "hier" : "ring", r, &in,
                               &x) != COLL_OK)
        return t_failf("rank %d: coll_comm_link_bytes: %s", rank, coll_comm_last_error(comm));
      tot[k][0] += in, tot[k][1] += x;
    }
  uint64_t in, x;
  if (coll_comm_link_bytes(comm, "all_reduce", count, COLL_FLOAT32, "oneshot", 0, &in, &x) !=
      COLL_ERR_INVALID_ARG)
    return t_failf("rank %d: link bytes of a row with no schedule", rank);
  if (j->per_host > 1) {
    int H = j->hosts, m = j->per_host;
    /* ring: every rank 2(N-1)/N*S, the H ranks before a host boundary all across */
    if (tot[0][1] != (uint64_t)(H * 2.0 * (n - 1) / n * S) ||
        tot[0][0] != (uint64_t)((n - H) * 2.0 * (n - 1) / n * S))
      return t_failf("rank %d: ring sends %llu inside, %llu across", rank,
                     (unsigned long long)tot[0][0], (unsigned long long)tot[0][1]);
    /* hier: 2(m-1)/m*S inside and 2(H-1)/H*S/m across, per rank */
    if (tot[1][0] != (uint64_t)(n * 2.0 * (m - 1) / m * S) ||
        tot[1][1] != (uint64_t)(n * 2.0 * (H - 1) / H * S / m))
      return t_failf("rank %d: hier sends %llu inside, %llu across", rank,
                     (unsigned long long)tot[1][0], (unsigned long long)tot[1][1]);
    if (!(tot[1][1] < tot[0][1])) return t_failf("rank %d: hier crosses no less", rank);
  } else if (memcmp(tot[0], tot[1], sizeof tot[0]) != 0) {
    return t_failf("rank %d: hier does not fit 2 + 1 ranks, yet plans unlike the ring", rank);
  }
  /* The call runs the choice, and right. */
  uint8_t *a = malloc(1 << 20), *b = malloc(1 << 20);
  int bad = !a || !b ? t_failf("rank %d: out of memory", rank)
                     : tm_call(comm, rank, n, 0, COLL_FLOAT32, COLL_SUM, false, 200000, 0, 5, a, b);
  const char *ran = coll_comm_last_algo(comm);
  if (!bad && (!ran || (strcmp(ran, "hier") == 0) != (j->per_host > 1)))
    bad = t_failf("rank %d: an 800 KB all_reduce ran %s", rank, ran ? ran : "nothing");
  free(a);
  free(b);
  return bad;
}

Test(hosts, two_by_two_auto_choice_and_link_bytes, .timeout = 120) {
  job j = {.hosts = 2, .per_host = 2};
  launch(4, "2", NULL, "0", &j, rank_choice);
}

Test(hosts, unequal_hosts_never_chosen, .timeout = 120) {
  job j = {.hosts = 2, .per_host = 0};
  launch(3, "2,1", NULL, "0", &j, rank_choice);
}

/* Measured: the links across hosts get their own α and β, and the all-reduce the tuner
 * then picks (whichever it is on a loaded machine) is right. */
static int rank_measured(coll_comm_t comm, int rank, int n, void *arg) {
  const job *j = arg;
  if (check_layout(comm, rank, n, j)) return 1;
  double ax = 0, bx = 0, a = 0, b = 0;
  if (coll_comm_net_params(comm, &ax, &bx) != COLL_OK ||
      coll_comm_tune_params(comm, &a, &b, NULL, NULL) != COLL_OK)
    return t_failf("rank %d: %s", rank, coll_comm_last_error(comm));
  if (!(ax > 0 && bx > 0 && a > 0 && b > 0))
    return t_failf("rank %d: alpha %g beta %g, across alpha %g beta %g", rank, a, b, ax, bx);
  uint8_t *x = malloc(1 << 20), *y = malloc(1 << 20);
  int bad = !x || !y ? 1 : 0;
  for (size_t count = 1; !bad && count <= 200000; count *= 23)
    bad = tm_call(comm, rank, n, 0, COLL_FLOAT32, COLL_SUM, count % 2, count, 0, count, x, y);
  free(x);
  free(y);
  return bad;
}

Test(hosts, two_by_two_measured, .timeout = 150) {
  job j = {.hosts = 2, .per_host = 2};
  launch(4, "2", NULL, "1", &j, rank_measured);
}
