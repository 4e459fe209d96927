/* test_faults.c — a dead, a stalled and an aborted rank must produce errors, not hangs.
 *
 * Ranks are forked here (before any libcoll thread exists in this process) and join with
 * the env-based init, so that this process, unlike the local launcher, can let the
 * survivors of a SIGKILL run on and report.  Every rank has alarm() as a last resort and
 * the parent kills and reaps every child on every path.  COLL_TIMEOUT_MS is set per case (below).
 *
 * Gating makes the order certain without sleeping: in a job of N ranks the "laggard"
 * (rank N-1) does not enter the second all-reduce until the parent says so, so the
 * others are certainly pending in it (it cannot finish without the laggard) when the
 * parent kills or stops the victim; then the laggard is released into the same call.
 * Each survivor reports (rank, result of the pending call, result of a later call, time
 * taken, the sentence) through a pipe, and waits to be released before it exits, so no
 * survivor's exit can be mistaken for a death.
 *
 * Bounds are for a loaded machine (CI runs two test programs at once, QEMU guests among
 * them): a death must be reported as a death (COLL_ERR_REMOTE naming the rank) well inside
 * COLL_TIMEOUT_MS, which is 10 s in the death cases, so that a slow scheduler cannot turn
 * it into a timeout; the stalled-rank case keeps 2 s, since its timeout is what it tests.
 * On a quiet machine deaths are heard in ~100 ms (shm's liveness poll) or at once (a
 * closed TCP link).
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll_test.h"
#include "coll_trace.h"
#include "internal.h"

#define COUNT (1u << 20) /* floats: 4 MiB, many FIFO slots */
/* The fan-out broadcast's floats: twice the root's ring, so the root waits for the gated
 * laggard to read before it can write the rest (algo/fanout.c). */
#define FANOUT_COUNT (2 * COUNT)
/* COLL_TIMEOUT_MS of the death cases, and the bound on noticing a death: half of it, so a
 * death reported inside it cannot have been the timeout. */
#define DEATH_TIMEOUT_MS 10000
#define NOTICE_MS (DEATH_TIMEOUT_MS / 2)
/* COLL_TIMEOUT_MS of the stalled case (T_SLACK_MS is what a loaded machine adds after it). */
#define STALL_TIMEOUT_MS 2000

typedef struct {
  int rank;
  int pending, later; /* coll_result of the interrupted call and of a call after it */
  int ms;             /* time the interrupted call took */
  char algo[16];      /* the row it ran on */
  char msg[400];
} report;


static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

enum { ROLE_SURVIVOR, ROLE_VICTIM, ROLE_LAGGARD };

typedef struct {
  int n, port, timeout_ms;
  const char *transport;
  bool fanout; /* the pending call: a broadcast from the victim through its fan-out ring */
  bool staged; /* every all-reduce on the staged rings (algo/staged.c) */
  int rep[2];  /* children -> parent: one byte 'v'/'r', or a report */
  int gate[2]; /* parent -> laggard: a byte lets it into the second all-reduce */
  int rel[2];  /* parent closes it: survivors exit */
} job;

static void put_byte(int fd, char c) {
  if (write(fd, &c, 1) != 1) _exit(90);
}

static int child(job *j, int rank, int role) {
  alarm(35); /* a last resort only: the test's own bounds are shorter */
  close(j->rep[0]);
  close(j->gate[1]);
  close(j->rel[1]);
  char v[64];
  snprintf(v, sizeof v, "%d", rank);
  setenv("RANK", v, 1);
  snprintf(v, sizeof v, "%d", j->n);
  setenv("WORLD_SIZE", v, 1);
  snprintf(v, sizeof v, "127.0.0.1:%d", j->port);
  setenv("COLL_ADDR", v, 1);
  setenv("COLL_TRANSPORT", j->transport, 1);
  snprintf(v, sizeof v, "%d", j->timeout_ms);
  setenv("COLL_TIMEOUT_MS", v, 1);
  /* The row under test, forced: the tuner's own choice follows the costs it measured,
   * and on a loaded machine it picked the staged row for the fan-out's broadcast (CI,
   * 2026-11-30). */
  if (j->staged) setenv("COLL_ALGO", "staged", 1);
  if (j->fanout) setenv("COLL_ALGO", "fanout", 1);
  coll_comm_t comm;
  if (coll_comm_init_from_env(&comm) != COLL_OK) {
    fprintf(stderr, "rank %d: init: %s\n", rank, coll_comm_last_error(NULL));
    return 2;
  }
  float *x = malloc(sizeof(float) * FANOUT_COUNT);
  for (unsigned i = 0; i < FANOUT_COUNT; i++) x[i] = 1;
  if (coll_all_reduce(x, x, COUNT, COLL_FLOAT32, COLL_SUM, comm, NULL) != COLL_OK) return 3;
  char c;
  if (role == ROLE_VICTIM) {
    /* Enter the second all-reduce (its first slices leave), then say so and wait to die. */
    coll_stream_t s;
    coll_stream_create(&s);
    if (j->fanout) { /* the same call as the others' (COLL_CHECK compares them) */
      coll_broadcast(x, x, FANOUT_COUNT, COLL_FLOAT32, 1, comm, s);
    } else {
      coll_all_reduce(x, x, COUNT, COLL_FLOAT32, COLL_SUM, comm, s);
    }
    put_byte(j->rep[1], 'v');
    for (;;) pause();
  }
  /* Everyone's first all-reduce is over before the kill: with schedules other than the
   * ring the laggard's last receives can come from the victim, and a dead TCP peer's
   * unread data is reset away. */
  put_byte(j->rep[1], 'r');
  if (role == ROLE_LAGGARD && read(j->gate[0], &c, 1) != 1) return 4;
  report rp = {.rank = rank};
  double t0 = now_ms();
  if (j->fanout) {
    rp.pending = coll_broadcast(x, x, FANOUT_COUNT, COLL_FLOAT32, 1, comm, NULL);
  } else {
    rp.pending = coll_all_reduce(x, x, COUNT, COLL_FLOAT32, COLL_SUM, comm, NULL);
  }
  rp.ms = (int)(now_ms() - t0);
  const char *ran = coll_comm_last_algo(comm); /* NULL: it failed before any row ran it */
  snprintf(rp.algo, sizeof rp.algo, "%s", ran ? ran : "");
  snprintf(rp.msg, sizeof rp.msg, "%s", coll_comm_last_error(comm));
  rp.later = coll_barrier(comm, NULL);
  if (write(j->rep[1], &rp, sizeof rp) != (ssize_t)sizeof rp) return 5;
  while (read(j->rel[0], &c, 1) > 0) {}
  coll_comm_destroy(comm);
  free(x);
  return 0;
}

typedef struct {
  pid_t pid[8];
  char prefix[40]; /* the job's segments in /dev/shm: coll-<job>- */
  report rep[8];
  int nrep;
  char victim_state; /* its /proc state letter once every survivor had reported */
} outcome;

static char proc_state(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return '?';
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')');
  return p && p[1] == ' ' ? p[2] : '?';
}

static void reap_all(job *j, outcome *o) {
  for (int r = 0; r < j->n; r++)
    if (o->pid[r] > 0) {
      kill(o->pid[r], SIGKILL);
      waitpid(o->pid[r], NULL, 0);
      o->pid[r] = 0;
    }
}

static bool read_full(int fd, void *buf, size_t len) {
  uint8_t *p = buf;
  while (len) {
    ssize_t k = read(fd, p, len);
    if (k <= 0) return false;
    p += k;
    len -= (size_t)k;
  }
  return true;
}

/* Runs the scenario: victim `vic` gets `sig` once the others are pending. */
static void scenario_of(int n, int vic, int sig, const char *transport, const char *algo,
                        outcome *o) {
  bool fanout = algo && strcmp(algo, "fanout") == 0, staged = algo && strcmp(algo, "staged") == 0;
  job j = {.n = n,
           .port = t_free_port(),
           .timeout_ms = sig == SIGSTOP ? STALL_TIMEOUT_MS : DEATH_TIMEOUT_MS,
           .transport = transport,
           .fanout = fanout,
           .staged = staged};
  cr_assert_eq(pipe(j.rep), 0);
  cr_assert_eq(pipe(j.gate), 0);
  cr_assert_eq(pipe(j.rel), 0);
  memset(o, 0, sizeof *o);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", j.port); /* as child() sets COLL_ADDR */
  t_env_job_prefix(o->prefix, sizeof o->prefix, addr, n);
  for (int r = 0; r < n; r++) {
    int role = r == vic ? ROLE_VICTIM : r == n - 1 ? ROLE_LAGGARD : ROLE_SURVIVOR;
    o->pid[r] = fork();
    cr_assert_neq(o->pid[r], -1);
    if (o->pid[r] == 0) _exit(child(&j, r, role));
  }
  close(j.rep[1]);
  close(j.gate[0]);
  close(j.rel[0]);
  /* n-1 survivors (the laggard too) say 'r', the victim says 'v'. */
  bool ok = true;
  for (int k = 0; k < n && ok; k++) {
    char c;
    ok = read_full(j.rep[0], &c, 1) && (c == 'r' || c == 'v');
  }
  if (ok) {
    kill(o->pid[vic], sig);
    char go = 'g';
    ok = write(j.gate[1], &go, 1) == 1;
  }
  for (int k = 0; k < n - 1 && ok; k++) {
    ok = read_full(j.rep[0], &o->rep[k], sizeof o->rep[k]);
    if (ok) o->nrep++;
  }
  /* Not reaped yet: a zombie after SIGKILL, once the kernel has torn it down.  The
   * survivors may report before that (the watch hears the links close while the victim
   * still exits), so wait for it, bounded. */
  for (int k = 0; k < 1000 && (o->victim_state = proc_state(o->pid[vic])) != 'Z' && sig == SIGKILL;
       k++) {
    struct timespec nap = {0, 10000000L};
    nanosleep(&nap, NULL);
  }
  close(j.rel[1]); /* survivors may go */
  for (int r = 0; r < n; r++) {
    if (r == vic || o->pid[r] <= 0) continue;
    int st;
    waitpid(o->pid[r], &st, 0);
    o->pid[r] = 0;
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) ok = false;
  }
  reap_all(&j, o);
  close(j.rep[0]);
  close(j.gate[1]);
  cr_assert(ok, "a rank failed or did not report (%d of %d reports)", o->nrep, n - 1);
  for (int k = 0; k < o->nrep; k++)
    fprintf(stderr, "  rank %d: %s in %d ms: %s\n", o->rep[k].rank,
            coll_result_string((coll_result)o->rep[k].pending), o->rep[k].ms, o->rep[k].msg);
}

static void scenario(int n, int vic, int sig, const char *transport, outcome *o) {
  scenario_of(n, vic, sig, transport, NULL, o);
}

static void expect_dead(const char *transport, bool must_name) {
  outcome o;
  scenario(4, 1, SIGKILL, transport, &o);
  int named = 0;
  for (int k = 0; k < o.nrep; k++) {
    report *r = &o.rep[k];
    cr_expect(r->pending == COLL_ERR_REMOTE || r->pending == COLL_ERR_TIMEOUT,
              "rank %d: pending all-reduce returned %s", r->rank,
              coll_result_string((coll_result)r->pending));
    cr_expect(r->later != COLL_OK, "rank %d: a later call succeeded after the death", r->rank);
    cr_expect(r->ms < DEATH_TIMEOUT_MS + T_SLACK_MS,
              "rank %d: the error took %d ms (COLL_TIMEOUT_MS is %d)", r->rank, r->ms,
              DEATH_TIMEOUT_MS);
    named += strstr(r->msg, "rank 1 ") != NULL || strstr(r->msg, "rank 1:") != NULL ||
             strstr(r->msg, "rank 1 (") != NULL;
    if (must_name) /* by the transport, or by the watch (a neighbour saw it go first) */
      cr_expect(strstr(r->msg, "lost rank 1 ") || strstr(r->msg, "rank 1 died"),
                "rank %d does not name the lost rank: %s", r->rank, r->msg);
  }
  cr_expect(named >= 1, "no survivor named rank 1");
  /* Only this job's segments: other libcoll jobs may run on the machine meanwhile. */
  char left[512];
  int k = t_prefix_segments(o.prefix, 1, left, sizeof left);
  cr_expect_eq(k, 0, "segments of the job left in /dev/shm: %s", left);
}

Test(faults, sigkill_mid_all_reduce_tcp, .timeout = 40) { expect_dead("tcp", true); }
Test(faults, sigkill_mid_all_reduce_shm, .timeout = 40) { expect_dead("auto", false); }

/* A SIGKILLed rank that its parent has not reaped yet is a zombie: kill(pid, 0) still
 * succeeds on it, but shm must report it dead (naming it), not time out on it.  The
 * victim is reaped only after the survivors reported, so it certainly was a zombie. */
Test(faults, sigkill_zombie_is_dead_shm, .timeout = 40) {
  outcome o;
  scenario(3, 1, SIGKILL, "shm", &o);
  cr_expect_eq(o.victim_state, 'Z', "the victim was not a zombie but '%c'", o.victim_state);
  int named = 0;
  for (int k = 0; k < o.nrep; k++) {
    report *r = &o.rep[k];
    cr_expect(r->pending == COLL_ERR_REMOTE || r->pending == COLL_ERR_TIMEOUT,
              "rank %d: pending all-reduce returned %s", r->rank,
              coll_result_string((coll_result)r->pending));
    /* shm's liveness check ("peer rank 1 (pid N) has died"), the direct path's read of its
     * memory failing with ESRCH, or the watch (its link ended: "rank 1 died"), whichever
     * comes first: all name it, none waits for a timeout */
    if (r->pending == COLL_ERR_REMOTE &&
        ((strstr(r->msg, "rank 1") && strstr(r->msg, "(pid ") &&
          (strstr(r->msg, "has died") || strstr(r->msg, "No such process"))) ||
         strstr(r->msg, "rank 1 died"))) {
      named++;
      cr_expect(r->ms < NOTICE_MS, "rank %d: the death took %d ms to notice", r->rank, r->ms);
    }
  }
  /* Rank 2 receives from rank 1 in the ring: it waits on the dead rank itself. */
  cr_expect(named >= 1, "no survivor reported rank 1 dead (COLL_ERR_REMOTE)");
}

/* The shared-ring rows (algo/fanout.c, algo/staged.c) wait on ring counters, not on a
 * FIFO: when a rank dies there, the others must say so too.  A pending call on n ranks,
 * rank 1 killed: every survivor must have run it on `algo`, name rank 1 as dead within
 * NOTICE_MS, fail the next call, and leave no segment behind. */
static void expect_ring_row_names_the_dead(int n, const char *algo, const char *call) {
  outcome o;
  scenario_of(n, 1, SIGKILL, "shm", algo, &o);
  int named = 0, inside = 0;
  for (int k = 0; k < o.nrep; k++) {
    report *r = &o.rep[k];
    cr_expect(r->pending == COLL_ERR_REMOTE, "rank %d: pending %s returned %s: %s", r->rank, call,
              coll_result_string((coll_result)r->pending), r->msg);
    /* A survivor that reaches the call after the death is known (the laggard, or any
     * rank on a loaded machine) fails before a row runs it: it reports none.  One inside
     * the call must have been on the row under test. */
    if (r->algo[0])
      cr_expect_str_eq(r->algo, algo, "rank %d: the %s ran on %s", r->rank, call, r->algo);
    inside += r->algo[0] != 0;
    cr_expect(r->later != COLL_OK, "rank %d: a later call succeeded after the death", r->rank);
    cr_expect(r->ms < NOTICE_MS, "rank %d: the death took %d ms to notice", r->rank, r->ms);
    named += strstr(r->msg, "rank 1") != NULL;
  }
  cr_expect_eq(named, o.nrep, "a survivor did not name rank 1");
  cr_log_info("%d of %d survivors were inside the %s row when rank 1 died; the rest heard of "
              "it before a row ran their call\n",
              inside, o.nrep, algo);
  char left[512];
  cr_expect_eq(t_prefix_segments(o.prefix, 1, left, sizeof left), 0,
               "segments of the job left in /dev/shm: %s", left);
}

/* The fan-out's root dies: 8 MiB from one root on 3 ranks of one host, on the fan-out. */
Test(faults, sigkill_root_of_fanout_broadcast_shm, .timeout = 40) {
  expect_ring_row_names_the_dead(3, "fanout", "broadcast");
}

/* The staged all-reduce (algo/staged.c) waits on its peers' ring counters: a rank that
 * dies with its part unreduced must be named by everyone waiting for that part. */
Test(faults, sigkill_mid_staged_all_reduce_shm, .timeout = 40) {
  expect_ring_row_names_the_dead(4, "staged", "all-reduce");
}

Test(faults, sigstop_times_out_tcp, .timeout = 40) {
  outcome o;
  scenario(3, 1, SIGSTOP, "tcp", &o);
  /* Every survivor waits until COLL_TIMEOUT_MS.  The first to time out POISONs the rest
   * (architecture.md), so a survivor whose own deadline had not quite fired returns
   * COLL_ERR_REMOTE relaying that timeout; which one is first is a race at equal deadlines.
   * At least one must time out itself, and every sentence must still say where it hung. */
  int named = 0, timeouts = 0;
  for (int k = 0; k < o.nrep; k++) {
    report *r = &o.rep[k];
    timeouts += r->pending == COLL_ERR_TIMEOUT;
    cr_expect(r->pending == COLL_ERR_TIMEOUT ||
                  (r->pending == COLL_ERR_REMOTE && strstr(r->msg, "timed out after")),
              "rank %d: stalled peer gave %s: %s", r->rank,
              coll_result_string((coll_result)r->pending), r->msg);
    cr_expect(strstr(r->msg, "all_reduce") && strstr(r->msg, "step") && strstr(r->msg, "bytes"),
              "rank %d: sentence lacks collective/step/bytes: %s", r->rank, r->msg);
    cr_expect(r->ms >= STALL_TIMEOUT_MS - 100 && r->ms < STALL_TIMEOUT_MS + T_SLACK_MS,
              "rank %d: timed out after %d ms", r->rank, r->ms);
    named += strstr(r->msg, "rank 1 in step") != NULL;
  }
  cr_expect(timeouts >= 1, "no survivor timed out waiting for the stalled rank");
  cr_expect(named >= 1, "no survivor's sentence names the stalled rank 1");
}

/* ---- abort from another thread ------------------------------------------------------- */

static void *aborter(void *arg) {
  coll_comm_t comm = arg;
  /* Abort only once the main thread is inside the collective (it cannot finish: rank 1
   * never joins), so the call is certainly blocked when the abort lands. */
  while (atomic_load(&comm->users) == 0) sched_yield();
  coll_comm_abort(comm);
  return NULL;
}

static int abort_rank(coll_comm_t comm, int rank, int n, void *arg) {
  (void)n;
  int *fds = arg; /* [0..1]: rank 0 is done; [2..3]: rank 1 is up */
  char c = 'u';
  if (rank == 1) /* never joins the all-reduce */
    return write(fds[3], &c, 1) == 1 && read(fds[0], &c, 1) == 1 ? 0 : 1;
  /* Rank 0's init can end while rank 1's still reads rank 0's last bytes of it: aborted
   * then, rank 1's init would fail, not the call this test is about. */
  if (read(fds[2], &c, 1) != 1) return 1;
  pthread_t t;
  pthread_create(&t, NULL, aborter, comm);
  float x = 1;
  double t0 = now_ms();
  coll_result r = coll_all_reduce(&x, &x, 1, COLL_FLOAT32, COLL_SUM, comm, NULL);
  double ms = now_ms() - t0;
  pthread_join(t, NULL);
  char msg[400];
  snprintf(msg, sizeof msg, "%s", coll_comm_last_error(NULL));
  c = 'k';
  if (write(fds[1], &c, 1) != 1) return 1;
  if (r != COLL_ERR_REMOTE) return t_failf("blocked all-reduce returned %s", coll_result_string(r));
  /* Far inside COLL_TIMEOUT_MS (20 s): the abort, not a timeout, ended it. */
  if (ms > 5000) return t_failf("abort took %.0f ms to unblock the call", ms);
  fprintf(stderr, "  rank 0: %s after %.1f ms: %s\n", coll_result_string(r), ms, msg);
  _exit(0); /* the communicator is gone: the launcher must not destroy it */
}

Test(faults, abort_from_another_thread_tcp, .timeout = 40) {
  int fds[4];
  cr_assert_eq(pipe(fds), 0);
  cr_assert_eq(pipe(fds + 2), 0);
  setenv("COLL_TRANSPORT", "tcp", 1);
  setenv("COLL_TIMEOUT_MS", "20000", 1);
  char why[256];
  int rc = t_launch(2, abort_rank, fds, 30000, why, sizeof why);
  for (int i = 0; i < 4; i++) close(fds[i]);
  cr_assert_eq(rc, 0, "%s", why);
}
