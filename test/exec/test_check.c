/* test_check.c — COLL_CHECK: ranks that disagree about a call get COLL_ERR_MISMATCH with a
 * sentence naming both calls, on every rank, quickly; ranks that agree see no difference.
 *
 * Each case runs one call that all ranks agree on (so the sequence numbers are #1 in the
 * sentences), then the disagreement: rank 1 (the "odd" rank) calls something else.  The
 * first disagreement in rank order is between ranks 0 and 1, so every rank must report
 * exactly "rank 0 called <A> but rank 1 called <B>".  COLL_TIMEOUT_MS is 10 s and every
 * rank must have its answer within half of it (ANSWER_MS), so a hang or a timeout fails the
 * test; a quiet machine answers in milliseconds (the log lines say how many).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <time.h>

#include "coll_config.h"
#include "coll_test.h"
#include "internal.h"
#include "tcp_matrix.h"

#define ANSWER_MS 5000 /* a mismatch must be reported within this: half of COLL_TIMEOUT_MS */

typedef enum {
  C_ALL_REDUCE,
  C_BROADCAST,
  C_REDUCE,
  C_ALL_GATHER,
  C_SEND,
  C_RECV,
  C_SENDRECV,
  C_BARRIER
} call_kind;

typedef struct {
  call_kind kind;
  size_t count, recv_count;
  coll_dtype dtype;
  coll_op op;
  int root; /* root, or peer for send/recv, or dst for sendrecv */
  int src;  /* sendrecv */
} call;

typedef struct {
  call normal, odd;
  const char *want_a, *want_b; /* how the sentence must describe them */
  int idle_from;               /* ranks >= this do nothing (point-to-point cases) */
} mcase;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Ranks meet here (shared memory made before the fork) before they leave: a rank that
 * destroys its failed communicator at once may otherwise be seen as lost (COLL_ERR_REMOTE
 * over TCP) by a slower peer that is still receiving descriptors. */
static _Atomic int *arrived;

static void meet(int n) {
  atomic_fetch_add(arrived, 1);
  double t0 = now_ms();
  while (atomic_load(arrived) < n && now_ms() - t0 < 10000) sched_yield();
}

static coll_result do_call(coll_comm_t comm, const call *c, void *a, void *b) {
  switch (c->kind) {
  case C_ALL_REDUCE: return coll_all_reduce(a, b, c->count, c->dtype, c->op, comm, NULL);
  case C_BROADCAST: return coll_broadcast(a, b, c->count, c->dtype, c->root, comm, NULL);
  case C_REDUCE: return coll_reduce(a, b, c->count, c->dtype, c->op, c->root, comm, NULL);
  case C_ALL_GATHER: return coll_all_gather(a, b, c->count, c->dtype, comm, NULL);
  case C_SEND: return coll_send(a, c->count, c->dtype, c->root, comm, NULL);
  case C_RECV: return coll_recv(b, c->count, c->dtype, c->root, comm, NULL);
  case C_SENDRECV:
    return coll_sendrecv(a, c->count, c->root, b, c->recv_count, c->src, c->dtype, comm, NULL);
  case C_BARRIER: return coll_barrier(comm, NULL);
  }
  return COLL_ERR_INTERNAL;
}

static int mismatch_rank(coll_comm_t comm, int rank, int n, void *arg) {
  const mcase *mc = arg;
  size_t bytes = 1u << 20;
  uint8_t *a = calloc(1, bytes), *b = calloc(1, bytes);
  if (!a || !b) return t_failf("rank %d: out of memory", rank);
  coll_result r = coll_all_reduce(a, b, 16, COLL_FLOAT32, COLL_SUM, comm, NULL); /* #0 */
  if (r != COLL_OK)
    return t_failf("rank %d: agreeing call failed: %s", rank, coll_comm_last_error(comm));
  if (mc->idle_from && rank >= mc->idle_from) {
    free(a);
    free(b);
    meet(n);
    return 0;
  }
  const call *c = rank == 1 ? &mc->odd : &mc->normal;
  /* Point-to-point cases: rank 0 and 1 are the pair; the call after #0 is #1 on both. */
  double t0 = now_ms();
  r = do_call(comm, c, a, b);
  double ms = now_ms() - t0;
  char msg[COLL_ERRBUF];
  snprintf(msg, sizeof msg, "%s", coll_comm_last_error(comm));
  meet(n);
  free(a);
  free(b);
  if (r != COLL_ERR_MISMATCH)
    return t_failf("rank %d: got %s, not a mismatch: %s", rank, coll_result_string(r), msg);
  char want[400];
  snprintf(want, sizeof want, "rank 0 called %s but rank 1 called %s", mc->want_a, mc->want_b);
  if (!strstr(msg, want)) return t_failf("rank %d: sentence\n  %s\nlacks\n  %s", rank, msg, want);
  if (ms > ANSWER_MS) return t_failf("rank %d: the mismatch took %.0f ms to report", rank, ms);
  if (coll_barrier(comm, NULL) == COLL_OK)
    return t_failf("rank %d: the communicator still works after a mismatch", rank);
  fprintf(stderr, "  rank %d (%.2f ms): %s\n", rank, ms, msg);
  return 0;
}

static void run_case(int n, const mcase *mc, const char *transport) {
  setenv("COLL_CHECK", "1", 1);
  setenv("COLL_TIMEOUT_MS", "10000", 1);
  setenv("COLL_TRANSPORT", transport, 1);
  char why[512];
  arrived = mmap(NULL, sizeof *arrived, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(arrived, MAP_FAILED);
  atomic_store(arrived, 0);
  int rc = t_launch(n, mismatch_rank, (void *)mc, 30000, why, sizeof why);
  munmap(arrived, sizeof *arrived);
  cr_assert_eq(rc, 0, "%d ranks over %s: %s", n, transport, why);
}

#define AR(cnt, dt, o) \
  { .kind = C_ALL_REDUCE, .count = cnt, .dtype = dt, .op = o }
#define BC(cnt, dt, r) \
  { .kind = C_BROADCAST, .count = cnt, .dtype = dt, .root = r }

static const mcase k_coll = {AR(1000, COLL_FLOAT32, COLL_SUM), BC(1000, COLL_FLOAT32, 0),
                             "all_reduce #1 (count 1000, float32, sum)",
                             "broadcast #1 (count 1000, float32, root 0)", 0};
static const mcase k_count = {AR(1000, COLL_FLOAT32, COLL_SUM), AR(999, COLL_FLOAT32, COLL_SUM),
                              "all_reduce #1 (count 1000, float32, sum)",
                              "all_reduce #1 (count 999, float32, sum)", 0};
/* int32 and float32 are the same size: without the check this is silent garbage. */
static const mcase k_dtype = {AR(1000, COLL_FLOAT32, COLL_SUM), AR(1000, COLL_INT32, COLL_SUM),
                              "all_reduce #1 (count 1000, float32, sum)",
                              "all_reduce #1 (count 1000, int32, sum)", 0};
static const mcase k_op = {AR(1000, COLL_FLOAT32, COLL_SUM), AR(1000, COLL_FLOAT32, COLL_MAX),
                           "all_reduce #1 (count 1000, float32, sum)",
                           "all_reduce #1 (count 1000, float32, max)", 0};
static const mcase k_root = {BC(70000, COLL_FLOAT32, 0), BC(70000, COLL_FLOAT32, 1),
                             "broadcast #1 (count 70000, float32, root 0)",
                             "broadcast #1 (count 70000, float32, root 1)", 0};
static const mcase k_reduce_root = {
    {.kind = C_REDUCE, .count = 5, .dtype = COLL_INT64, .op = COLL_PROD, .root = 1},
    {.kind = C_REDUCE, .count = 5, .dtype = COLL_INT64, .op = COLL_PROD, .root = 0},
    "reduce #1 (count 5, int64, prod, root 1)",
    "reduce #1 (count 5, int64, prod, root 0)",
    0};
static const mcase k_barrier = {{.kind = C_BARRIER},
                                AR(1, COLL_UINT8, COLL_MAX),
                                "barrier #1",
                                "all_reduce #1 (count 1, uint8, max)",
                                0};

#define BOTH(name, mc)                                                    \
  Test(check, name##_2ranks, .timeout = 60) { run_case(2, &mc, "auto"); } \
  Test(check, name##_3ranks, .timeout = 60) { run_case(3, &mc, "auto"); }
BOTH(collective, k_coll)
BOTH(count, k_count)
BOTH(dtype, k_dtype)
BOTH(op, k_op)
BOTH(root, k_root)
BOTH(reduce_root, k_reduce_root)
BOTH(barrier_vs_all_reduce, k_barrier)
Test(check, count_3ranks_tcp, .timeout = 60) { run_case(3, &k_count, "tcp"); }

/* Point-to-point: only the pair checks; rank 2 (when there is one) takes no part. */
static const mcase k_p2p_count = {{.kind = C_SEND, .count = 10, .dtype = COLL_FLOAT32, .root = 1},
                                  {.kind = C_RECV, .count = 20, .dtype = COLL_FLOAT32, .root = 0},
                                  "send #1 (count 10, float32, to rank 1)",
                                  "recv #1 (count 20, float32, from rank 0)",
                                  2};
static const mcase k_p2p_dtype = {
    {.kind = C_SENDRECV, .count = 8, .recv_count = 8, .dtype = COLL_INT32, .root = 1, .src = 1},
    {.kind = C_SENDRECV, .count = 8, .recv_count = 8, .dtype = COLL_UINT32, .root = 0, .src = 0},
    "sendrecv #1 (send count 8 to rank 1, receive count 8 from rank 1, int32)",
    "sendrecv #1 (send count 8 to rank 0, receive count 8 from rank 0, uint32)",
    2};
static const mcase k_p2p_vs_coll = {{.kind = C_SEND, .count = 10, .dtype = COLL_FLOAT32, .root = 1},
                                    AR(10, COLL_FLOAT32, COLL_SUM),
                                    "send #1 (count 10, float32, to rank 1)",
                                    "all_reduce #1 (count 10, float32, sum)",
                                    0};
Test(check, p2p_count_2ranks, .timeout = 60) { run_case(2, &k_p2p_count, "auto"); }
Test(check, p2p_count_3ranks, .timeout = 60) { run_case(3, &k_p2p_count, "auto"); }
Test(check, p2p_dtype_sendrecv, .timeout = 60) { run_case(2, &k_p2p_dtype, "auto"); }
Test(check, p2p_vs_collective_2ranks, .timeout = 60) { run_case(2, &k_p2p_vs_coll, "auto"); }

/* ---- no false positives ---------------------------------------------------------------- */

static int matrix_rank(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  if (!comm->check) return t_failf("rank %d: COLL_CHECK=1 but the check is off", rank);
  int fails = tm_run(comm, rank, n, false);
  return fails ? t_failf("rank %d: %d wrong results with COLL_CHECK=1", rank, fails) : 0;
}

/* Every collective, dtype, op, in-place or not, roots 0 and N-1, sendrecv in a ring. */
Test(check, matrix_passes_with_check, .timeout = 300) {
  setenv("COLL_CHECK", "1", 1);
  setenv("COLL_TIMEOUT_MS", "60000", 1);
  setenv("COLL_TRANSPORT", "auto", 1);
  char why[512];
  int rc = t_launch(3, matrix_rank, NULL, 240000, why, sizeof why);
  cr_assert_eq(rc, 0, "%s", why);
}

static int default_rank(coll_comm_t comm, int rank, int n, void *arg) {
  (void)n;
  int want = *(int *)arg;
  if (comm->check != (want != 0))
    return t_failf("rank %d: check is %d, expected %d", rank, comm->check, want);
  return 0;
}

/* Unset, the check follows the build type (on in debug builds); COLL_CHECK=0 turns it off. */
Test(check, default_follows_build_type, .timeout = 60) {
  char why[512];
  unsetenv("COLL_CHECK");
  int want = COLL_CHECK_DEFAULT;
  cr_assert_eq(t_launch(2, default_rank, &want, 30000, why, sizeof why), 0, "%s", why);
  setenv("COLL_CHECK", "0", 1);
  want = 0;
  cr_assert_eq(t_launch(2, default_rank, &want, 30000, why, sizeof why), 0, "%s", why);
}

/* One rank with the check off (as if its COLL_CHECK differed): both sides see a slice of
 * the wrong size and say so, instead of reading a descriptor as data or the reverse. */
static int setting_rank(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  if (rank == 1) comm->check = false;
  float x[1000] = {0};
  coll_result r = coll_all_reduce(x, x, 1000, COLL_FLOAT32, COLL_SUM, comm, NULL);
  char msg[COLL_ERRBUF];
  snprintf(msg, sizeof msg, "%s", coll_comm_last_error(comm));
  meet(n);
  if (r != COLL_ERR_MISMATCH)
    return t_failf("rank %d: got %s: %s", rank, coll_result_string(r), msg);
  const char *want = rank == 0 ? "where the COLL_CHECK descriptor of all_reduce #0 was expected"
                               : "received a 48-byte slice from rank 0";
  if (!strstr(msg, want)) return t_failf("rank %d: sentence lacks \"%s\": %s", rank, want, msg);
  fprintf(stderr, "  rank %d: %s\n", rank, msg);
  return 0;
}

Test(check, setting_differs_between_ranks, .timeout = 60) {
  /* The slice-size evidence exists on FIFO schedules only: a one-shot call carries no
   * slices, so there differing settings end in a timeout instead (troubleshooting.md). */
  setenv("COLL_ALGO", "ring", 1);
  setenv("COLL_CHECK", "1", 1);
  setenv("COLL_TIMEOUT_MS", "10000", 1);
  setenv("COLL_TRANSPORT", "auto", 1);
  arrived = mmap(NULL, sizeof *arrived, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(arrived, MAP_FAILED);
  atomic_store(arrived, 0);
  char why[512];
  int rc = t_launch(2, setting_rank, NULL, 30000, why, sizeof why);
  munmap(arrived, sizeof *arrived);
  cr_assert_eq(rc, 0, "%s", why);
}

/* A rank that never makes the call is a stall, not a mismatch: the others time out in
 * the exchange, bounded by COLL_TIMEOUT_MS, naming it. */
static int absent_rank(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  if (rank == 1) {
    meet(n);
    return 0;
  }
  float x[10] = {0};
  double t0 = now_ms();
  coll_result r = coll_all_reduce(x, x, 10, COLL_FLOAT32, COLL_SUM, comm, NULL);
  double ms = now_ms() - t0;
  char msg[COLL_ERRBUF];
  snprintf(msg, sizeof msg, "%s", coll_comm_last_error(comm));
  meet(n);
  if (r != COLL_ERR_TIMEOUT) return t_failf("rank 0: got %s: %s", coll_result_string(r), msg);
  if (!strstr(msg, "waiting for the call descriptor of rank 1 in step 0 (COLL_CHECK"))
    return t_failf("rank 0: sentence does not name the absent rank: %s", msg);
  if (ms < 900 || ms > 1000 + T_SLACK_MS)
    return t_failf("rank 0: timed out after %.0f ms (limit 1000)", ms);
  fprintf(stderr, "  rank 0 (%.0f ms): %s\n", ms, msg);
  return 0;
}

Test(check, absent_rank_times_out, .timeout = 60) {
  setenv("COLL_CHECK", "1", 1);
  setenv("COLL_TIMEOUT_MS", "1000", 1);
  setenv("COLL_TRANSPORT", "auto", 1);
  arrived = mmap(NULL, sizeof *arrived, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(arrived, MAP_FAILED);
  atomic_store(arrived, 0);
  char why[512];
  int rc = t_launch(2, absent_rank, NULL, 30000, why, sizeof why);
  munmap(arrived, sizeof *arrived);
  cr_assert_eq(rc, 0, "%s", why);
}
