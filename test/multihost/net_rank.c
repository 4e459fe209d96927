/* net_rank.c — one rank of the multi-host correctness matrix: joins the job from the
 * environment (scripts/netns.sh starts one per network namespace), runs tcp_matrix with
 * ~1 MiB counts, checks nothing of libcoll is left in /dev/shm, prints one line, and
 * exits 0 when everything was correct.  NET_RANK_SMALL=1 leaves out the big counts.
 * NET_RANK_SPLIT=1 then splits the job into two halves (keys reversed, so child ranks
 * run backwards), checks each child's ranks, an all-reduce and the matrix on it, and
 * that the parent still works after the child is gone.  NET_RANK_RDMA_CHECK=1 (the ib
 * bed) checks that no queue pair or memory region of the process outlives the destroy;
 * NET_RANK_FAULT=link is the ib bed's link-down fault (link_down below). */
#include <dirent.h>
#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "internal.h"
#include "tcp_matrix.h"

#define SLOW_MS 20000 /* COLL_TIMEOUT_MS for the fail-fast faults (test_netns.c sets it) */
#define STOP_MS 2000  /* ... and for stop */

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

/* NET_RANK_FAULT=invalid|abort|kill|init|stop: the fault matrix across hosts (issue 14,
 * as test_failfast.c within one).  Rank 1, the victim, fails that way while the others
 * are in, or entering, calls that cannot finish without it:
 *   invalid, abort, kill   after one good all-reduce and a barrier (the victim leaves it
 *                          only once every rank has entered), it makes an invalid call
 *                          where the others all-reduce, calls coll_comm_abort, or
 *                          SIGKILLs itself;
 *   init                   it joins the rendezvous and the bootstrap ring, then exits;
 *   stop                   it is SIGSTOPped after the barrier: nothing tells that apart
 *                          from a slow rank.
 * A survivor must return COLL_ERR_REMOTE within 2 s (COLL_TIMEOUT_MS is 20 s) with a
 * sentence naming rank 1, and print "ok" with what it saw; for stop, COLL_ERR_TIMEOUT at
 * the configured time (COLL_TIMEOUT_MS 2 s; a survivor may instead hear of another's
 * timeout, COLL_ERR_REMOTE, and test_netns.c wants at least one timeout).  Every process
 * ends by alarm() (or the kill): the victim 3 s after the barrier (the stopped one is
 * killed by a watchdog it forked, as a stopped process keeps its alarm pending), a
 * survivor 3 s after its report, so no survivor leaves while another may still be waiting
 * (a second failure it could hear of first).  The test reads the survivors' lines, not
 * exit statuses. */
static void alarm_exit(int sig) {
  (void)sig;
  _exit(0); /* the planned end of a fault run, not a failure to report */
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void report(int rank, int n, const char *host, const char *how, coll_result r, int ms,
                   const char *msg) {
  bool named = strstr(msg, "rank 1 ") || strstr(msg, "rank 1:") || strstr(msg, "rank 1)");
  bool good = strcmp(how, "stop") == 0 ? (r == COLL_ERR_TIMEOUT || r == COLL_ERR_REMOTE) &&
                                             ms >= STOP_MS - 100 && ms < STOP_MS + 2000
                                       : r == COLL_ERR_REMOTE && ms < 2000 && named;
  printf("rank %d of %d on %s: %s (%s after %s in %d ms: %s)\n", rank, n, host,
         good ? "ok" : "WRONG", coll_result_string(r), how, ms, msg);
  fflush(stdout);
  alarm(3);
  for (;;) pause();
}

/* The victim of init: joins the job as coll_comm_init_from_env does, up to the bootstrap
 * ring, then leaves without a word, as a crash would. */
static int leave_in_init(void) {
  coll_id_fields f;
  int rank, n;
  if (coll_env_job(&f, &rank, &n) != COLL_OK) return 6;
  struct coll_comm *c = calloc(1, sizeof *c);
  pthread_mutex_init(&c->errmu, NULL);
  c->rank = rank;
  c->timeout_ms = SLOW_MS;
  coll_bootstrap b;
  if (coll_bootstrap_connect(c, &b, &f, rank, n) != COLL_OK) return 7;
  _exit(0); /* its sockets close with the process */
}

static int fault(int rank_env, const char *host, const char *how) {
  signal(SIGALRM, alarm_exit);
  if (rank_env == 1 && strcmp(how, "init") == 0) return leave_in_init();
  double t0 = now_ms();
  coll_comm_t comm;
  coll_result r = coll_comm_init_from_env(&comm);
  if (r != COLL_OK) { /* init: the survivors' init is what fails */
    const char *ws = getenv("WORLD_SIZE");
    report(rank_env, ws ? atoi(ws) : -1, host, how, r, (int)(now_ms() - t0),
           coll_comm_last_error(NULL));
    return 1;
  }
  int rank, n;
  coll_comm_rank(comm, &rank);
  coll_comm_size(comm, &n);
  enum { COUNT = 1 << 16 };
  static float x[COUNT];
  for (int i = 0; i < COUNT; i++) x[i] = 1;
  if (coll_all_reduce(x, x, COUNT, COLL_FLOAT32, COLL_SUM, comm, NULL) != COLL_OK) {
    fprintf(stderr, "rank %d: the first all-reduce: %s\n", rank, coll_comm_last_error(comm));
    return 1;
  }
  /* A survivor may still be inside the barrier when the fault comes, so its measured
   * span is the barrier and the all-reduce. */
  t0 = now_ms();
  r = coll_barrier(comm, NULL);
  if (rank == 1) {
    alarm(3);
    if (r != COLL_OK) {
      fprintf(stderr, "rank 1: the barrier before the fault: %s\n", coll_comm_last_error(comm));
      return 1;
    }
    if (strcmp(how, "kill") == 0) raise(SIGKILL);
    if (strcmp(how, "abort") == 0) coll_comm_abort(comm);
    if (strcmp(how, "invalid") == 0)
      coll_all_reduce(x, x, COUNT, (coll_dtype)99, COLL_SUM, comm, NULL);
    if (strcmp(how, "stop") == 0) {
      pid_t me = getpid();
      if (fork() == 0) { /* the watchdog: stop the victim, kill it once the others are done */
        kill(me, SIGSTOP);
        struct timespec d = {.tv_sec = STOP_MS / 1000 + 2};
        nanosleep(&d, NULL);
        kill(me, SIGKILL);
        _exit(0);
      }
    }
    for (;;) pause();
  }
  if (r == COLL_OK) r = coll_all_reduce(x, x, COUNT, COLL_FLOAT32, COLL_SUM, comm, NULL);
  report(rank, n, host, how, r, (int)(now_ms() - t0), coll_comm_last_error(comm));
  return 1;
}

/* NET_RANK_FAULT=link (the ib bed, scripts/ib-bed.sh): every rank all-reduces in a loop
 * while the bed takes a guest's link down; the hook waits for $TMPDIR/net_rank.started,
 * which each rank creates after its first all-reduce.  Every rank must come out of the
 * loop with an error whose sentence names another rank within COLL_TIMEOUT_MS plus 5 s
 * ("ok (link ...)"), or say WRONG; a loop that runs out (the link never went down) is
 * WRONG too.  Ends by alarm, as the other faults do. */
static int link_down(const char *host) {
  signal(SIGALRM, alarm_exit);
  coll_comm_t comm;
  if (coll_comm_init_from_env(&comm) != COLL_OK) {
    fprintf(stderr, "init_from_env on %s: %s\n", host, coll_comm_last_error(NULL));
    return 2;
  }
  int rank, n;
  coll_comm_rank(comm, &rank);
  coll_comm_size(comm, &n);
  enum { COUNT = 1 << 14 };
  static float x[COUNT];
  coll_result r = coll_all_reduce(x, x, COUNT, COLL_FLOAT32, COLL_SUM, comm, NULL);
  const char *tmp = getenv("TMPDIR");
  char mark[512];
  snprintf(mark, sizeof mark, "%s/net_rank.started", tmp && *tmp ? tmp : "/tmp");
  FILE *f = fopen(mark, "w");
  if (f) fclose(f);
  long limit_ms = 600000;
  const char *t = getenv("COLL_TIMEOUT_MS");
  if (t && *t) limit_ms = atol(t);
  double t0 = now_ms(), last = t0;
  for (int i = 0; r == COLL_OK && now_ms() - t0 < 2.0 * limit_ms + 30000; i++) {
    last = now_ms();
    r = coll_all_reduce(x, x, COUNT, COLL_FLOAT32, COLL_SUM, comm, NULL);
  }
  int ms = (int)(now_ms() - last);
  const char *msg = r == COLL_OK ? "the loop ran out: the link never went down"
                                 : coll_comm_last_error(comm);
  bool names = false;
  for (int p = 0; p < n; p++) {
    char who[32];
    snprintf(who, sizeof who, "rank %d", p);
    const char *at = msg;
    while (p != rank && (at = strstr(at, who)) != NULL) {
      char c = at[strlen(who)];
      if (c < '0' || c > '9') names = true;
      at += strlen(who);
    }
  }
  bool good = r != COLL_OK && names && ms <= limit_ms + 5000;
  printf("rank %d of %d on %s: %s (link down: %s after %d ms: %s)\n", rank, n, host,
         good ? "ok" : "WRONG", coll_result_string(r), ms, msg);
  fflush(stdout);
  alarm(3);
  for (;;) pause();
}

/* NET_RANK_RDMA_CHECK=1 (the ib bed): after coll_comm_destroy, no queue pair or memory
 * region of this process may be left (`rdma resource show`, whose lines name the pid). */
static int rdma_leftovers(void) {
  const char *c = getenv("NET_RANK_RDMA_CHECK");
  if (!c || strcmp(c, "1") != 0) return 0;
  FILE *p = popen("rdma resource show qp 2>&1; rdma resource show mr 2>&1", "r");
  if (!p) return 1;
  char line[512], pid[32];
  snprintf(pid, sizeof pid, "pid %d ", (int)getpid());
  int n = 0;
  while (fgets(line, sizeof line, p))
    if (strstr(line, pid)) {
      fprintf(stderr, "left after destroy: %s", line);
      n++;
    }
  pclose(p);
  return n;
}

int main(void) {
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  const char *how = getenv("NET_RANK_FAULT");
  if (how && strcmp(how, "link") == 0) return link_down(host);
  if (how && *how) {
    const char *re = getenv("RANK");
    return fault(re ? atoi(re) : -1, host, how);
  }
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
  const char *small = getenv("NET_RANK_SMALL");
  const char *split = getenv("NET_RANK_SPLIT");
  int fails = tm_run(comm, rank, n, !(small && *small == '1'));
  if (split && *split == '1') fails += split_halves(comm, rank, n);
  if (coll_comm_destroy(comm) != COLL_OK) fails++;
  int left = shm_leftovers(), rdma = rdma_leftovers();
  printf("rank %d of %d on %s: %s\n", rank, n, host,
         fails  ? "WRONG"
         : left ? "LEFT SEGMENTS IN /dev/shm"
         : rdma ? "LEFT QUEUE PAIRS OR MEMORY REGIONS"
                : "ok");
  return fails || left || rdma ? 1 : 0;
}
