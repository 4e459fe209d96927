/* coll-scale.c — how long a communicator of N ranks takes to build, and what it holds.
 *
 *   coll-scale --ranks N [--count C] [--iters K]
 *
 * Forks N ranks on this machine (coll_launch_local_raw: each rank builds its own
 * communicator, so init is timed from inside), then each rank runs all-reduce,
 * all-gather and broadcast of C floats K times, checks every result, counts its open
 * descriptors and its resident memory, and destroys the communicator.  Rank 0 prints one
 * line: N, the job's init time (from the moment the last rank entered init until the
 * last finished it — the part that grows with N, not the forking), the slowest rank's
 * own init, the most descriptors and the most memory any rank held, and whether every
 * result was right.  Run it with COLL_TRANSPORT=tcp COLL_TUNE=0 and `ulimit -n 1024` for
 * the issue-14 scale check (lab/perf-log.md).
 *
 * Must never: report a time it did not measure, or call a run good when a result was
 * wrong or a rank failed.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"
#include "coll_launch.h"

typedef struct {
  int count, iters;
} args;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts); /* one clock for every process on the host */
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1; /* the directory's own descriptor */
}

static double rss_mib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long pages = 0, res = 0;
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
    fclose(f);
  }
  return (double)res * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

#define CHECK(call)                                                        \
  do {                                                                     \
    coll_result r_ = (call);                                               \
    if (r_ != COLL_OK) {                                                   \
      fprintf(stderr, "coll-scale: rank %d: %s failed: %s\n", rank, #call, \
              coll_comm_last_error(comm));                                 \
      return 3;                                                            \
    }                                                                      \
  } while (0)

static int rank_main(coll_comm_t unused, int rank, int n, void *vp) {
  (void)unused;
  args *a = vp;
  coll_unique_id id = coll_launch_unique_id();
  coll_comm_t comm = NULL;
  double t0 = now_s();
  coll_result ir = coll_comm_init_rank(&comm, n, id, rank);
  double t1 = now_s();
  if (ir != COLL_OK) {
    fprintf(stderr, "coll-scale: rank %d: init failed: %s\n", rank, coll_comm_last_error(NULL));
    return 3;
  }
  size_t c = (size_t)a->count;
  float *x = malloc(c * sizeof *x), *y = malloc(c * sizeof *y),
        *g = malloc(c * (size_t)n * sizeof *g);
  if (!x || !y || !g) return 3;
  int wrong = 0;
  for (int it = 0; it < a->iters; it++) {
    for (size_t i = 0; i < c; i++) x[i] = (float)(rank + 1);
    CHECK(coll_all_reduce(x, y, c, COLL_FLOAT32, COLL_SUM, comm, NULL));
    for (size_t i = 0; i < c; i++) wrong += y[i] != (float)n * (float)(n + 1) / 2;
    CHECK(coll_all_gather(x, g, c, COLL_FLOAT32, comm, NULL));
    for (int p = 0; p < n; p++)
      for (size_t i = 0; i < c; i++) wrong += g[(size_t)p * c + i] != (float)(p + 1);
    int root = it % n;
    for (size_t i = 0; i < c; i++) y[i] = rank == root ? (float)(1000 + it) : -1.0f;
    CHECK(coll_broadcast(y, y, c, COLL_FLOAT32, root, comm, NULL));
    for (size_t i = 0; i < c; i++) wrong += y[i] != (float)(1000 + it);
  }
  /* The job's figures: latest start, earliest start, latest end, slowest own init,
   * most descriptors, most memory, results wrong anywhere. */
  double mx[5] = {t0, -t0, t1, t1 - t0, (double)open_fds()}, mxo[5];
  double mem = rss_mib(), memo, bad = wrong, bado;
  CHECK(coll_all_reduce(mx, mxo, 5, COLL_FLOAT64, COLL_MAX, comm, NULL));
  CHECK(coll_all_reduce(&mem, &memo, 1, COLL_FLOAT64, COLL_MAX, comm, NULL));
  CHECK(coll_all_reduce(&bad, &bado, 1, COLL_FLOAT64, COLL_SUM, comm, NULL));
  if (rank == 0)
    printf("%6d ranks: init %8.1f ms (last rank in to all ready), slowest rank's own %8.1f ms, "
           "first in to all ready %8.1f ms; at most %3.0f descriptors and %6.1f MiB in a "
           "rank; %s\n",
           n, (mxo[2] - mxo[0]) * 1e3, mxo[3] * 1e3, (mxo[2] + mxo[1]) * 1e3, mxo[4], memo,
           bado == 0 ? "every result right" : "WRONG RESULTS");
  coll_comm_destroy(comm);
  free(x);
  free(y);
  free(g);
  return bado == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  int n = 0;
  args a = {.count = 256, .iters = 3};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--ranks") && i + 1 < argc)
      n = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--count") && i + 1 < argc)
      a.count = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
      a.iters = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: coll-scale --ranks N [--count FLOATS] [--iters K]\n");
      return 2;
    }
  }
  if (n < 1 || a.count < 1 || a.iters < 1) {
    fprintf(stderr, "coll-scale: --ranks N is required (N >= 1), --count and --iters >= 1\n");
    return 2;
  }
  char why[512];
  fflush(stdout);
  int rc = coll_launch_local_raw(n, rank_main, &a, 0, why, sizeof why);
  if (rc) fprintf(stderr, "coll-scale: the job failed (%d): %s\n", rc, why);
  return rc;
}
