/* exec_threads.c — several threads calling into libcoll at once, with COLL_CHECK on.
 *
 * A plain program (Criterion's workers do not start under ThreadSanitizer): the suite runs
 * it in the ordinary build and in the b_sanitize=thread one.  On 2 forked ranks, with
 * COLL_CHECK=1 (every call's descriptor compared across ranks, its sequence number too):
 *   A. 4 threads per rank, each on a communicator of its own (coll_comm_dup);
 *   B. 4 threads on one communicator, the calls serialised by our own lock and taken in
 *      turn (call k by thread k % 4, the same order on every rank), blocking calls mixed
 *      with calls on each thread's stream, so the fast path, the inline path and the
 *      progress thread hand the execution right between threads;
 *   C. 4 threads on one communicator with no lock at all, making calls whose order does
 *      not matter: identical all-reduces of per-rank constants (a barrier among them
 *      would be a real mismatch: another rank may run it against an all-reduce).  Here a call
 *      that took the fast path and one queued meanwhile used to run in the opposite order
 *      to their sequence numbers, and COLL_CHECK reported a mismatch that was not there.
 * 10,000 calls per rank in all; every result is checked.  Exit 0 when all is right.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "coll.h"
#include "coll_launch.h"

enum { T = 4, CALLS_A = 1000, CALLS_B = 4000, CALLS_C = 500, CNT = 16 };

typedef struct {
  coll_comm_t comm;
  int rank, n, t;
  pthread_mutex_t *mu; /* B: the test's own lock */
  pthread_cond_t *cv;
  int *turn;
  int bad;
} th;

static int fail(th *x, const char *what, int k) {
  fprintf(stderr, "rank %d thread %d: %s at call %d: %s\n", x->rank, x->t, what, k,
          coll_comm_last_error(x->comm));
  return x->bad = 1;
}

/* Rank r's element i of call k is r + i + k: the sum is n(n-1)/2 + n(i + k). */
static void fill(int64_t *a, int r, int k) {
  for (int i = 0; i < CNT; i++) a[i] = r + i + k;
}
static int sum_ok(const int64_t *b, int n, int k) {
  for (int i = 0; i < CNT; i++)
    if (b[i] != (int64_t)n * (n - 1) / 2 + (int64_t)n * (i + k)) return 0;
  return 1;
}

static void *phase_a(void *p) { /* own communicator */
  th *x = p;
  coll_stream_t s;
  if (coll_stream_create(&s) != COLL_OK) {
    x->bad = 1;
    return NULL;
  }
  int64_t a[CNT], b[CNT], qa[CNT], qb[CNT];
  for (int k = 0; k < CALLS_A && !x->bad; k++) {
    bool queued = k % 4 == 0;
    if (queued) {
      fill(qa, x->rank, k + 7);
      if (coll_all_reduce(qa, qb, CNT, COLL_INT64, COLL_SUM, x->comm, s) != COLL_OK)
        fail(x, "queued all-reduce", k);
    }
    fill(a, x->rank, k);
    if (k % 10 == 9) {
      if (coll_barrier(x->comm, NULL) != COLL_OK) fail(x, "barrier", k);
    } else if (coll_all_reduce(a, b, CNT, COLL_INT64, COLL_SUM, x->comm, NULL) != COLL_OK) {
      fail(x, "all-reduce", k);
    } else if (!sum_ok(b, x->n, k)) {
      fail(x, "wrong all-reduce result", k);
    }
    if (queued && !x->bad) {
      if (coll_stream_synchronize(s) != COLL_OK)
        fail(x, "stream", k);
      else if (!sum_ok(qb, x->n, k + 7))
        fail(x, "wrong queued result", k);
    }
  }
  coll_stream_destroy(s);
  return NULL;
}

static void *phase_b(void *p) { /* one communicator, calls in turn under our lock */
  th *x = p;
  coll_stream_t s;
  if (coll_stream_create(&s) != COLL_OK) {
    x->bad = 1;
    return NULL;
  }
  int64_t a[CNT], b[CNT], qa[CNT], qb[CNT];
  int pending = -1; /* the call k whose result waits on our stream */
  for (int k = x->t; k < CALLS_B; k += T) {
    pthread_mutex_lock(x->mu);
    while (*x->turn != k) pthread_cond_wait(x->cv, x->mu);
    if (!x->bad) {
      if (k % 3 == 0 && pending < 0) { /* on the stream: returns before it runs */
        fill(qa, x->rank, k);
        if (coll_all_reduce(qa, qb, CNT, COLL_INT64, COLL_SUM, x->comm, s) != COLL_OK)
          fail(x, "queued all-reduce", k);
        pending = k;
      } else if (k % 11 == 5) {
        if (coll_barrier(x->comm, NULL) != COLL_OK) fail(x, "barrier", k);
      } else {
        fill(a, x->rank, k);
        if (coll_all_reduce(a, b, CNT, COLL_INT64, COLL_SUM, x->comm, NULL) != COLL_OK)
          fail(x, "all-reduce", k);
        else if (!sum_ok(b, x->n, k))
          fail(x, "wrong all-reduce result", k);
      }
    }
    (*x->turn)++;
    pthread_cond_broadcast(x->cv);
    pthread_mutex_unlock(x->mu);
    /* Outside the lock: other threads' calls go on while ours completes. */
    if (pending >= 0 && (k / T) % 2 == 1) {
      if (coll_stream_synchronize(s) != COLL_OK)
        fail(x, "stream", pending);
      else if (!sum_ok(qb, x->n, pending))
        fail(x, "wrong queued result", pending);
      pending = -1;
    }
  }
  if (pending >= 0) {
    if (coll_stream_synchronize(s) != COLL_OK)
      fail(x, "stream", pending);
    else if (!sum_ok(qb, x->n, pending))
      fail(x, "wrong queued result", pending);
  }
  coll_stream_destroy(s);
  return NULL;
}

static void *phase_c(void *p) { /* one communicator, no lock: order does not matter */
  th *x = p;
  int64_t a[CNT], b[CNT];
  for (int k = 0; k < CALLS_C && !x->bad; k++) {
    for (int i = 0; i < CNT; i++) a[i] = x->rank + 1;
    if (coll_all_reduce(a, b, CNT, COLL_INT64, COLL_SUM, x->comm, NULL) != COLL_OK) {
      fail(x, "all-reduce", k);
      break;
    }
    for (int i = 0; i < CNT; i++)
      if (b[i] != (int64_t)x->n * (x->n + 1) / 2) {
        fail(x, "wrong all-reduce result", k);
        break;
      }
  }
  return NULL;
}

static int run_phase(void *(*fn)(void *), coll_comm_t *comms, int rank, int n) {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  int turn = 0, bad = 0;
  th x[T];
  pthread_t tid[T];
  for (int t = 0; t < T; t++) {
    x[t] =
        (th){.comm = comms[t], .rank = rank, .n = n, .t = t, .mu = &mu, .cv = &cv, .turn = &turn};
    if (pthread_create(&tid[t], NULL, fn, &x[t]) != 0) return 1;
  }
  for (int t = 0; t < T; t++) {
    pthread_join(tid[t], NULL);
    bad |= x[t].bad;
  }
  return bad;
}

static int body(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  coll_comm_t own[T], same[T];
  for (int t = 0; t < T; t++) {
    same[t] = comm;
    if (coll_comm_dup(comm, &own[t]) != COLL_OK) {
      fprintf(stderr, "rank %d: dup: %s\n", rank, coll_comm_last_error(comm));
      return 2;
    }
  }
  if (run_phase(phase_a, own, rank, n)) return 3;
  for (int t = 0; t < T; t++)
    if (coll_comm_destroy(own[t]) != COLL_OK) return 4;
  if (run_phase(phase_b, same, rank, n)) return 5;
  if (run_phase(phase_c, same, rank, n)) return 6;
  return 0;
}

int main(void) {
  setenv("COLL_CHECK", "1", 1);
  setenv("COLL_TUNE", "0", 1); /* five communicators per rank: no measuring */
  char why[256] = "";
  int rc = coll_launch_local(2, body, NULL, 240000, why, sizeof why);
  if (rc) {
    printf("exec_threads: failed (%d): %s\n", rc, why);
    return 1;
  }
  printf("exec_threads: 2 ranks x %d calls: ok\n", T * CALLS_A + CALLS_B + T * CALLS_C);
  return 0;
}
