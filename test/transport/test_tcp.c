/* test_tcp.c — the correctness matrix over the TCP transport on one host.
 *
 * COLL_TRANSPORT=tcp forces every peer pair onto sockets even though all ranks share
 * this machine, so the proxy, the framing, the striping over several sockets per pair
 * and the flow control all run for real.  N in 2, 3, 4, with one and with three sockets
 * per pair; the ~1 MiB counts run at N=4 (their two-socket striping is the common case).
 * Also: a peer's last data and its goodbye read in one go still reach the waiter, and
 * COLL_TRANSPORT=shm and nonsense values are refused or honoured as documented.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "coll_test.h"
#include "tcp_matrix.h"

typedef struct {
  bool big;
} targ;

static int rank_matrix(coll_comm_t comm, int rank, int n, void *varg) {
  const targ *a = varg;
  return tm_run(comm, rank, n, a->big) ? 1 : 0;
}

static void run(int n, bool big, const char *socks) {
  setenv("COLL_TRANSPORT", "tcp", 1);
  setenv("COLL_TIMEOUT_MS", "30000", 1);
  setenv("COLL_SOCKS_PER_PEER", socks, 1);
  targ a = {.big = big};
  char why[256];
  int rc = t_launch(n, rank_matrix, &a, 150000, why, sizeof why);
  cr_assert_eq(rc, 0, "tcp matrix on %d ranks (%s sockets per pair%s): %s", n, socks,
               big ? ", ~1 MiB counts" : "", why);
  T_ASSERT_NO_LEFTOVERS("after the job");
}

Test(tcp, n2, .timeout = 120) { run(2, false, "2"); }
Test(tcp, n3, .timeout = 120) { run(3, false, "2"); }
Test(tcp, n4, .timeout = 120) { run(4, false, "2"); }
Test(tcp, n3_one_socket, .timeout = 120) { run(3, false, "1"); }
Test(tcp, n2_three_sockets_big, .timeout = 160) { run(2, true, "3"); }
Test(tcp, n4_big, .timeout = 160) { run(4, true, "2"); }

/* ---- a goodbye right behind the last data ------------------------------------------ */

/* Is process `pid` stopped (state T in /proc/PID/stat)? */
static bool stopped(pid_t pid) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *e = strrchr(buf, ')');
  return e && e[1] == ' ' && e[2] == 'T';
}

/* Thread ids of this process, up to max; returns how many. */
static int tasks(pid_t *out, int max) {
  DIR *d = opendir("/proc/self/task");
  int k = 0;
  struct dirent *e;
  while (d && (e = readdir(d)) && k < max)
    if (e->d_name[0] != '.') out[k++] = (pid_t)atoi(e->d_name);
  if (d) closedir(d);
  return k;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Rank 1 waits in a broadcast on a child while rank 0 holds it stopped, broadcasts and
 * destroys the child: the data and the goodbye sit together in rank 1's socket, so its
 * proxy reads both in one go when rank 1 goes on.  Rank 1 runs on one CPU with the
 * child's threads at nice 19, so the waiter that the proxy wakes runs at once, before
 * the proxy does anything more: the data must reach it all the same (the proxy used to
 * announce the goodbye before the slice that came with it, and the waiter failed with
 * "rank 0 destroyed its communicator while this rank still waits for its data"). */
static int goodbye_behind_data(coll_comm_t comm, int rank, int n, void *arg) {
  (void)n, (void)arg;
  if (rank == 1) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu() < 0 ? 0 : sched_getcpu(), &one);
    sched_setaffinity(0, sizeof one, &one); /* the child's threads inherit it */
  }
  int32_t pid = (int32_t)getpid(), pids[2];
  if (coll_all_gather(&pid, pids, 1, COLL_INT32, comm, NULL) != COLL_OK)
    return t_failf("rank %d: all_gather: %s", rank, coll_comm_last_error(comm));
  for (int it = 0; it < 20; it++) {
    coll_comm_t c;
    pid_t before[64], after[64];
    int nb = tasks(before, 64);
    if (coll_comm_dup(comm, &c) != COLL_OK)
      return t_failf("rank %d: dup: %s", rank, coll_comm_last_error(comm));
    int na = rank == 1 ? tasks(after, 64) : 0;
    for (int i = 0; i < na; i++) {
      bool old = false;
      for (int j = 0; j < nb; j++) old = old || before[j] == after[i];
      if (!old) setpriority(PRIO_PROCESS, (id_t)after[i], 19);
    }
    int64_t v[4] = {rank == 0 ? it : -1, 1, 2, 3};
    int bad = 0;
    if (rank == 0) {
      sleep_ms(20); /* rank 1 is asleep in the broadcast by now */
      kill(pids[1], SIGSTOP);
      for (int i = 0; i < 2000 && !stopped(pids[1]); i++) sleep_ms(1);
      if (coll_broadcast(v, v, 4, COLL_INT64, 0, c, NULL) != COLL_OK)
        bad = t_failf("rank 0: broadcast #%d: %s", it, coll_comm_last_error(c));
      coll_comm_destroy(c);
      kill(pids[1], SIGCONT);
    } else {
      if (coll_broadcast(v, v, 4, COLL_INT64, 0, c, NULL) != COLL_OK)
        bad = t_failf("rank 1: broadcast #%d: %s", it, coll_comm_last_error(c));
      else if (v[0] != it)
        bad = t_failf("rank 1: broadcast #%d gave %lld", it, (long long)v[0]);
      coll_comm_destroy(c);
    }
    int32_t b = bad, sum = 0;
    if (coll_all_reduce(&b, &sum, 1, COLL_INT32, COLL_SUM, comm, NULL) != COLL_OK)
      return t_failf("rank %d: all_reduce: %s", rank, coll_comm_last_error(comm));
    if (sum) return 1;
  }
  return 0;
}
Test(tcp, goodbye_right_behind_the_last_data, .timeout = 120) {
  setenv("COLL_TRANSPORT", "tcp", 1);
  setenv("COLL_TIMEOUT_MS", "30000", 1);
  setenv("COLL_SOCKS_PER_PEER", "2", 1);
  setenv("COLL_TUNE", "0", 1);
  char why[256];
  int rc = t_launch(2, goodbye_behind_data, NULL, 100000, why, sizeof why);
  cr_assert_eq(rc, 0, "%s", why);
}

/* ---- transport selection ------------------------------------------------------------ */

static int init_only(coll_comm_t comm, int rank, int n, void *arg) {
  (void)comm;
  (void)n;
  (void)arg;
  coll_unique_id id = coll_launch_unique_id();
  coll_comm_t c;
  coll_result r = coll_comm_init_rank(&c, 2, id, rank);
  const char *want = getenv("T_EXPECT");
  if (strcmp(want, "ok") == 0) {
    if (r != COLL_OK) return t_failf("rank %d: init failed: %s", rank, coll_comm_last_error(NULL));
    int x = rank + 1, y = 0;
    r = coll_all_reduce(&x, &y, 1, COLL_INT32, COLL_SUM, c, NULL);
    coll_comm_destroy(c);
    return r == COLL_OK && y == 3 ? 0 : t_failf("rank %d: all-reduce gave %d", rank, y);
  }
  if (r != COLL_ERR_INVALID_ARG)
    return t_failf("rank %d: init returned %s", rank, coll_result_string(r));
  if (!strstr(coll_comm_last_error(NULL), "COLL_TRANSPORT"))
    return t_failf("rank %d: sentence does not name COLL_TRANSPORT: %s", rank,
                   coll_comm_last_error(NULL));
  return 0;
}

static void selection(const char *value, const char *expect) {
  setenv("COLL_TRANSPORT", value, 1);
  setenv("COLL_TIMEOUT_MS", "10000", 1);
  setenv("T_EXPECT", expect, 1);
  char why[256];
  int rc = coll_launch_local_raw(2, init_only, NULL, 30000, why, sizeof why);
  cr_assert_eq(rc, 0, "COLL_TRANSPORT=%s: %s", value, why);
  T_ASSERT_NO_LEFTOVERS("after the job");
}

Test(tcp, transport_shm_on_one_host, .timeout = 60) { selection("shm", "ok"); }
Test(tcp, transport_auto, .timeout = 60) { selection("auto", "ok"); }
Test(tcp, transport_unknown_refused, .timeout = 60) { selection("carrier-pigeon", "refused"); }
