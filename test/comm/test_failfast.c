/* test_failfast.c — one rank fails; every other rank hears it by name, long before a timeout.
 *
 * The fault matrix of issue 14: in a job of N = 4 and 8 ranks over shm and over TCP,
 * one rank (the victim) fails in one way while the others are in, or about to enter,
 * a collective that cannot complete without it:
 *
 *   invalid   it makes an invalid call where the others make a valid one, then waits;
 *   abort     it calls coll_comm_abort, then waits;
 *   kill      it is SIGKILLed;
 *   init      it leaves during init (after joining the rendezvous);
 *   stop      it is SIGSTOPped: nothing can tell that apart from a slow rank, so the
 *             others must end in COLL_ERR_TIMEOUT at the configured time, not before.
 *
 * Every survivor must return COLL_ERR_REMOTE within NOTICE_MS, a quarter of COLL_TIMEOUT_MS
 * (so a timeout cannot pass for fail-fast), with a sentence naming the victim, and a later
 * call must fail too.  A quiet machine hears a failure in milliseconds (the log lines
 * say how many); the bound leaves room for a loaded CI machine's scheduler.  The survivors
 * report through a pipe; the parent kills and reaps every child on every path; each child
 * has alarm() as a last resort.
 */
#include <criterion/criterion.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll_test.h"
#include "bootstrap.h"
#include "internal.h"

#define COUNT (1u << 16) /* floats: 256 KiB, a few FIFO slots */
#define SLOW_MS 20000    /* COLL_TIMEOUT_MS for the fail-fast cases */
#define STOP_MS 2000     /* ... and for the stopped rank */
#define NOTICE_MS 5000   /* a failure must arrive within this (a quarter of SLOW_MS) */

typedef enum { F_INVALID, F_ABORT, F_KILL, F_INIT, F_STOP } fault;

typedef struct {
  int rank;
  int pending, later; /* coll_result of the call that needed the victim, and of a later one */
  int ms;             /* how long the first took */
  char msg[COLL_ERRBUF];
} report;

typedef struct {
  int n, victim;
  fault f;
  coll_unique_id id;
  coll_root *root;
  int rdy[2]; /* children -> parent: 'r' (ready), 'v' (the victim did its part) */
  int rep[2]; /* children -> parent: reports (atomic: a report is under PIPE_BUF) */
  int rel[2]; /* parent closes it: everyone may exit */
  int go[2];  /* parent -> victim: everyone finished the first call, fail now */
  pid_t pid[8];
} job;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void say(int fd, const void *p, size_t n) {
  if (write(fd, p, n) != (ssize_t)n) _exit(90);
}

static void wait_release(job *j) {
  char c;
  while (read(j->rel[0], &c, 1) > 0) {}
}

/* The victim of F_INIT: joins the rendezvous (registers with the root), then leaves
 * without a word, as a crash would: the root cannot hand it its ring neighbour, or its
 * neighbours find it gone. */
static int leave_in_init(job *j, int rank) {
  struct coll_comm *c = calloc(1, sizeof *c);
  pthread_mutex_init(&c->errmu, NULL);
  c->rank = rank;
  c->timeout_ms = SLOW_MS;
  coll_id_fields f;
  char why[200];
  if (coll_id_decode(&j->id, &f, why, sizeof why) != COLL_OK) return 6;
  coll_bootstrap b;
  if (coll_bootstrap_connect(c, &b, &f, rank, j->n) != COLL_OK) return 7;
  say(j->rdy[1], "v", 1);
  _exit(0); /* its sockets close with the process */
}

static int child(job *j, int rank) {
  alarm(60);
  close(j->rep[0]);
  close(j->rdy[0]);
  close(j->rel[1]);
  bool victim = rank == j->victim;
  if (victim && j->f == F_INIT) return leave_in_init(j, rank);
  report rp = {.rank = rank};
  double t0 = now_ms();
  coll_comm_t comm;
  coll_result r = coll_comm_init_rank(&comm, j->n, j->id, rank);
  if (r != COLL_OK) { /* F_INIT: the survivors' init is what fails */
    rp.pending = r;
    rp.later = r;
    rp.ms = (int)(now_ms() - t0);
    snprintf(rp.msg, sizeof rp.msg, "%s", coll_comm_last_error(NULL));
    say(j->rdy[1], "r", 1);
    say(j->rep[1], &rp, sizeof rp);
    wait_release(j);
    return 0;
  }
  float *x = malloc(sizeof(float) * COUNT);
  for (unsigned i = 0; i < COUNT; i++) x[i] = 1;
  if (coll_all_reduce(x, x, COUNT, COLL_FLOAT32, COLL_SUM, comm, NULL) != COLL_OK) {
    fprintf(stderr, "rank %d: first all-reduce: %s\n", rank, coll_comm_last_error(comm));
    return 3;
  }
  say(j->rdy[1], victim ? "v" : "r", 1);
  if (victim) {
    char g;
    if (read(j->go[0], &g, 1) != 1) return 8; /* a fault must not hit the first call */
    if (j->f == F_INVALID) {                  /* the others call it with a valid dtype */
      if (coll_all_reduce(x, x, COUNT, (coll_dtype)99, COLL_SUM, comm, NULL) !=
          COLL_ERR_INVALID_ARG)
        return 4;
    } else if (j->f == F_ABORT) {
      coll_comm_abort(comm);
    }
    for (;;) pause(); /* waits, as a rank stuck in its own code would */
  }
  t0 = now_ms();
  rp.pending = coll_all_reduce(x, x, COUNT, COLL_FLOAT32, COLL_SUM, comm, NULL);
  rp.ms = (int)(now_ms() - t0);
  snprintf(rp.msg, sizeof rp.msg, "%s", coll_comm_last_error(comm));
  rp.later = coll_barrier(comm, NULL);
  say(j->rep[1], &rp, sizeof rp);
  wait_release(j);
  coll_comm_destroy(comm);
  free(x);
  return 0;
}

/* The job's segments left in /dev/shm, removed: only this job's (coll_job_prefix), so
 * another libcoll job on the machine does not disturb the check. */
static int job_segments(const coll_unique_id *id) {
  coll_id_fields f;
  char why[200], prefix[64], names[512];
  if (coll_id_decode(id, &f, why, sizeof why) != COLL_OK) return -1;
  coll_job_prefix(prefix, sizeof prefix, f.secret);
  return t_prefix_segments(prefix, 1, names, sizeof names);
}

/* Reads len bytes, giving up after `ms` in all (a child that died cannot answer). */
static bool read_full(int fd, void *buf, size_t len, int ms) {
  uint8_t *p = buf;
  double end = now_ms() + ms;
  while (len) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    int left = (int)(end - now_ms());
    if (left <= 0 || poll(&pf, 1, left) <= 0) return false;
    ssize_t k = read(fd, p, len);
    if (k <= 0) return false;
    p += k;
    len -= (size_t)k;
  }
  return true;
}

/* Runs one case and checks every survivor's report. */
static void run_case(int n, fault f, const char *transport) {
  job j = {.n = n, .victim = 1, .f = f};
  char ms[16];
  snprintf(ms, sizeof ms, "%d", f == F_STOP ? STOP_MS : SLOW_MS);
  setenv("COLL_TIMEOUT_MS", ms, 1);
  setenv("COLL_TRANSPORT", transport, 1);
  setenv("COLL_TUNE", "0", 1);
  cr_assert_eq(coll_make_unique_id(&j.id, &j.root), COLL_OK, "%s", coll_comm_last_error(NULL));
  cr_assert_eq(pipe(j.rep), 0);
  cr_assert_eq(pipe(j.rdy), 0);
  cr_assert_eq(pipe(j.rel), 0);
  cr_assert_eq(pipe(j.go), 0);
  for (int r = 0; r < n; r++) {
    j.pid[r] = fork();
    cr_assert_neq(j.pid[r], -1);
    if (j.pid[r] == 0) _exit(child(&j, r));
  }
  close(j.rep[1]);
  close(j.rdy[1]);
  close(j.rel[0]);
  char why[200];
  cr_assert_eq(coll_bootstrap_root_run(j.root, false, why, sizeof why), COLL_OK, "%s", why);
  bool ok = true;
  for (int k = 0; k < n && ok; k++) { /* n-1 'r' and the victim's 'v' */
    char c;
    ok = read_full(j.rdy[0], &c, 1, 30000) && (c == 'r' || c == 'v');
  }
  if (ok) ok = write(j.go[1], "g", 1) == 1;
  if (ok && f == F_KILL) kill(j.pid[j.victim], SIGKILL);
  if (ok && f == F_STOP) kill(j.pid[j.victim], SIGSTOP);
  report rep[8];
  int nrep = 0;
  for (int k = 0; k < n - 1 && ok; k++) {
    ok = read_full(j.rep[0], &rep[k], sizeof rep[k], 30000);
    if (ok) nrep++;
  }
  close(j.rel[1]); /* everyone may go */
  kill(j.pid[j.victim], SIGKILL);
  for (int r = 0; r < n; r++) {
    int st;
    waitpid(j.pid[r], &st, 0);
    if (r != j.victim && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      fprintf(stderr, "  rank %d: %s %d\n", r, WIFEXITED(st) ? "exit status" : "signal",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      ok = false;
    }
  }
  close(j.rep[0]);
  close(j.rdy[0]);
  close(j.go[0]);
  close(j.go[1]);
  coll_bootstrap_root_stop(j.root);
  int left = job_segments(&j.id); /* removed either way: the next case starts clean */
  cr_assert(ok, "a rank failed or did not report (%d of %d reports)", nrep, n - 1);
  for (int k = 0; k < nrep; k++) {
    report *r = &rep[k];
    fprintf(stderr, "  %s n=%d fault %d rank %d: %s in %d ms: %s\n", transport, n, (int)f, r->rank,
            coll_result_string((coll_result)r->pending), r->ms, r->msg);
    cr_expect(r->later != COLL_OK, "rank %d: a later call succeeded", r->rank);
    if (f == F_STOP) {
      cr_expect(r->pending == COLL_ERR_TIMEOUT || r->pending == COLL_ERR_REMOTE, "rank %d: %s",
                r->rank, coll_result_string((coll_result)r->pending));
      cr_expect(r->ms >= STOP_MS - 100 && r->ms < STOP_MS + T_SLACK_MS,
                "rank %d: the stopped rank was given up after %d ms (COLL_TIMEOUT_MS %d)", r->rank,
                r->ms, STOP_MS);
      continue;
    }
    cr_expect(r->pending == COLL_ERR_REMOTE, "rank %d: %s, expected remote error", r->rank,
              coll_result_string((coll_result)r->pending));
    cr_expect(r->ms < NOTICE_MS, "rank %d: the failure took %d ms to arrive", r->rank, r->ms);
    cr_expect(strstr(r->msg, "rank 1 ") || strstr(r->msg, "rank 1:") || strstr(r->msg, "rank 1)"),
              "rank %d's sentence does not name rank 1: %s", r->rank, r->msg);
  }
  if (f == F_STOP) {
    int timeouts = 0;
    for (int k = 0; k < nrep; k++) timeouts += rep[k].pending == COLL_ERR_TIMEOUT;
    cr_expect(timeouts >= 1, "no survivor timed out waiting for the stopped rank");
  }
  cr_expect_eq(left, 0, "the job left %d shared segments in /dev/shm", left);
}

#define CASES(tr, name)                                     \
  Test(failfast, name##_invalid_call, .timeout = 60) {      \
    run_case(4, F_INVALID, tr);                             \
    run_case(8, F_INVALID, tr);                             \
  }                                                         \
  Test(failfast, name##_abort, .timeout = 60) {             \
    run_case(4, F_ABORT, tr);                               \
    run_case(8, F_ABORT, tr);                               \
  }                                                         \
  Test(failfast, name##_sigkill, .timeout = 60) {           \
    run_case(4, F_KILL, tr);                                \
    run_case(8, F_KILL, tr);                                \
  }                                                         \
  Test(failfast, name##_exit_in_init, .timeout = 60) {      \
    run_case(4, F_INIT, tr);                                \
    run_case(8, F_INIT, tr);                                \
  }                                                         \
  Test(failfast, name##_sigstop_times_out, .timeout = 60) { \
    run_case(4, F_STOP, tr);                                \
    run_case(8, F_STOP, tr);                                \
  }

CASES("shm", shm)
CASES("tcp", tcp)
