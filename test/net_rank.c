/* net_rank.c — one rank of the multi-host correctness matrix: joins the job from the
 * environment (scripts/netns.sh starts one per network namespace), runs tcp_matrix with
 * ~1 MiB counts, checks nothing of libcoll is left in /dev/shm, prints one line, and
 * exits 0 when everything was correct.  NET_RANK_SMALL=1 leaves out the big counts.
 * NET_RANK_SPLIT=1 then splits the job into two halves (keys reversed, so child ranks
 * run backwards), checks each child's ranks, an all-reduce and the matrix on it, and
 * that the parent still works after the child is gone. */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"
#include "tcp_matrix.h"

static int shm_leftovers(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += strncmp(e->d_name, "coll-", 5) == 0;
  closedir(d);
  return n;
}

static int split_halves(coll_comm_t comm, int rank, int n) {
  int color = rank < (n + 1) / 2 ? 0 : 1;
  coll_comm_t c;
  coll_result r = coll_comm_split(comm, color, -rank, &c);
  if (r != COLL_OK) {
    fprintf(stderr, "rank %d: split: %s\n", rank, coll_comm_last_error(comm));
    return 1;
  }
  /* Independently: the members are this half's parent ranks, highest first. */
  int members[256], k = 0, me = -1, cr = -1, cn = -1;
  for (int p = n - 1; p >= 0; p--)
    if ((p < (n + 1) / 2 ? 0 : 1) == color) {
      if (p == rank) me = k;
      members[k++] = p;
    }
  coll_comm_rank(c, &cr);
  coll_comm_size(c, &cn);
  int fails = 0;
  if (cr != me || cn != k) {
    fprintf(stderr, "rank %d: child rank %d of %d, expected %d of %d\n", rank, cr, cn, me, k);
    fails++;
  }
  int64_t x[2] = {rank + 1, (int64_t)rank * rank}, y[2] = {0, 0}, w[2] = {0, 0};
  for (int i = 0; i < k; i++) w[0] += members[i] + 1, w[1] += (int64_t)members[i] * members[i];
  if (coll_all_reduce(x, y, 2, COLL_INT64, COLL_SUM, c, NULL) != COLL_OK || y[0] != w[0] ||
      y[1] != w[1]) {
    fprintf(stderr, "rank %d: child all_reduce gave %lld %lld, expected %lld %lld\n", rank,
            (long long)y[0], (long long)y[1], (long long)w[0], (long long)w[1]);
    fails++;
  }
  fails += tm_run(c, cr, cn, false);
  if (coll_comm_destroy(c) != COLL_OK) fails++;
  int64_t one = 1, all = 0;
  if (coll_all_reduce(&one, &all, 1, COLL_INT64, COLL_SUM, comm, NULL) != COLL_OK || all != n) {
    fprintf(stderr, "rank %d: the parent after the split: %s\n", rank, coll_comm_last_error(comm));
    fails++;
  }
  return fails;
}

/* NET_RANK_FAULT=kill|abort|invalid: the fault matrix across hosts.  After one good
 * all-reduce, rank 1 fails that way while the others enter an all-reduce that cannot
 * finish without it; each survivor must return COLL_ERR_REMOTE naming rank 1 within
 * 3 s (COLL_TIMEOUT_MS is 30 s) and prints "ok" with what it saw.  The victim, where it
 * does not die, stays until alarm() ends it 8 s later: long after the survivors have
 * had to notice its fault, not its exit.  Every process of a fault run ends by its
 * alarm (or the kill): the test reads the survivors' lines, not exit statuses. */
static int fault(coll_comm_t comm, int rank, int n, const char *host, const char *how) {
  enum { COUNT = 1 << 16 };
  static float x[COUNT];
  for (int i = 0; i < COUNT; i++) x[i] = 1;
  if (coll_all_reduce(x, x, COUNT, COLL_FLOAT32, COLL_SUM, comm, NULL) != COLL_OK) {
    fprintf(stderr, "rank %d: the first all-reduce: %s\n", rank, coll_comm_last_error(comm));
    return 1;
  }
  /* Everyone past the first all-reduce before the fault: the victim leaves this barrier
   * only once every rank has entered it.  A survivor may still be inside the barrier
   * when the fault comes, so its measured span is the barrier and the all-reduce. */
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  coll_result r = coll_barrier(comm, NULL);
  if (rank == 1) {
    alarm(8);
    if (r != COLL_OK) {
      fprintf(stderr, "rank 1: the barrier before the fault: %s\n", coll_comm_last_error(comm));
      return 1;
    }
    if (strcmp(how, "kill") == 0) raise(SIGKILL);
    if (strcmp(how, "abort") == 0) coll_comm_abort(comm);
    if (strcmp(how, "invalid") == 0)
      coll_all_reduce(x, x, COUNT, (coll_dtype)99, COLL_SUM, comm, NULL);
    for (;;) pause();
  }
  if (r == COLL_OK) r = coll_all_reduce(x, x, COUNT, COLL_FLOAT32, COLL_SUM, comm, NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  int ms = (int)((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000);
  const char *msg = coll_comm_last_error(comm);
  int good = r == COLL_ERR_REMOTE && ms < 3000 &&
             (strstr(msg, "rank 1 ") || strstr(msg, "rank 1:") || strstr(msg, "rank 1)"));
  printf("rank %d of %d on %s: %s (%s after %s in %d ms: %s)\n", rank, n, host,
         good ? "ok" : "WRONG", coll_result_string(r), how, ms, msg);
  fflush(stdout);
  /* Stay, holding the communicator, until the victim's alarm has ended it: a survivor
   * that left at once would be a second failure, and a slower survivor could hear of
   * that one first ("lost rank 0") instead of rank 1's. */
  alarm(9);
  for (;;) pause();
}

int main(void) {
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  coll_comm_t comm;
  coll_result r = coll_comm_init_from_env(&comm);
  if (r != COLL_OK) {
    fprintf(stderr, "init_from_env on %s: %s: %s\n", host, coll_result_string(r),
            coll_comm_last_error(NULL));
    return 2;
  }
  int rank, n;
  coll_comm_rank(comm, &rank);
  coll_comm_size(comm, &n);
  const char *how = getenv("NET_RANK_FAULT");
  if (how && *how) return fault(comm, rank, n, host, how);
  const char *small = getenv("NET_RANK_SMALL");
  const char *split = getenv("NET_RANK_SPLIT");
  int fails = tm_run(comm, rank, n, !(small && *small == '1'));
  if (split && *split == '1') fails += split_halves(comm, rank, n);
  if (coll_comm_destroy(comm) != COLL_OK) fails++;
  int left = shm_leftovers();
  printf("rank %d of %d on %s: %s\n", rank, n, host,
         fails ? "WRONG" : left ? "LEFT SEGMENTS IN /dev/shm" : "ok");
  return fails || left ? 1 : 0;
}
