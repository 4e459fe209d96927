/* test_api.c — argument checking, streams, abort, and error sentences.
 *
 * Invalid arguments must come back as COLL_ERR_INVALID_ARG with a sentence on every rank
 * that passed them, before anything moves — so the same bad call on all ranks returns
 * at once and nobody hangs.  Then the asynchronous side: work queued on streams runs in
 * call order and synchronize reports it; abort from another thread frees a rank stuck
 * waiting for a peer that never comes.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_test.h"

#define EXPECT_INVALID(call, needle)                                                               \
  do {                                                                                             \
    coll_result r_ = (call);                                                                       \
    if (r_ != COLL_ERR_INVALID_ARG)                                                                \
      return t_failf("rank %d: %s returned %s, expected invalid argument", rank, #call,            \
                     coll_result_string(r_));                                                      \
    const char *m_ = coll_comm_last_error(comm);                                                   \
    if (!strstr(m_, needle))                                                                       \
      return t_failf("rank %d: %s: sentence '%s' does not mention '%s'", rank, #call, m_, needle); \
  } while (0)

static int bad_args(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  float buf[64] = {0}, out[64 * 8] = {0};
  EXPECT_INVALID(coll_all_reduce(buf, out, 4, (coll_dtype)99, COLL_SUM, comm, NULL), "dtype");
  EXPECT_INVALID(coll_all_reduce(buf, out, 4, COLL_FLOAT32, (coll_op)-1, comm, NULL), "op");
  EXPECT_INVALID(coll_all_reduce(NULL, out, 4, COLL_FLOAT32, COLL_SUM, comm, NULL),
                 "sendbuf is NULL");
  EXPECT_INVALID(coll_all_reduce(buf, NULL, 4, COLL_FLOAT32, COLL_SUM, comm, NULL),
                 "recvbuf is NULL");
  EXPECT_INVALID(coll_all_reduce(buf, out, SIZE_MAX / 2, COLL_FLOAT32, COLL_SUM, comm, NULL),
                 "overflows");
  EXPECT_INVALID(coll_all_reduce(buf, buf + 1, 8, COLL_FLOAT32, COLL_SUM, comm, NULL), "overlap");
  EXPECT_INVALID(coll_broadcast(buf, out, 4, COLL_FLOAT32, n, comm, NULL), "root");
  EXPECT_INVALID(coll_broadcast(buf, out, 4, COLL_FLOAT32, -1, comm, NULL), "root");
  EXPECT_INVALID(coll_reduce(buf, out, 4, COLL_FLOAT32, COLL_SUM, n + 5, comm, NULL), "root");
  EXPECT_INVALID(coll_reduce_scatter(buf, out, SIZE_MAX / 8, COLL_FLOAT64, COLL_SUM, comm, NULL),
                 "overflows");
  EXPECT_INVALID(coll_all_gather(buf, out, 4, (coll_dtype)10, comm, NULL), "dtype");
  EXPECT_INVALID(coll_send(buf, 4, COLL_FLOAT32, n, comm, NULL), "peer");
  EXPECT_INVALID(coll_send(buf, 4, COLL_FLOAT32, rank, comm, NULL), "itself");
  if (n > 1) EXPECT_INVALID(coll_recv(NULL, 4, COLL_FLOAT32, (rank + 1) % n, comm, NULL), "NULL");
  EXPECT_INVALID(coll_sendrecv(buf, 4, n, out, 4, 0, COLL_FLOAT32, comm, NULL), "dst");
  /* A NULL buffer is fine when nothing moves. */
  coll_result r = coll_all_reduce(NULL, NULL, 0, COLL_FLOAT32, COLL_SUM, comm, NULL);
  if (r != COLL_OK)
    return t_failf("rank %d: zero-count all-reduce with NULL: %s", rank, coll_result_string(r));
  /* After all those refusals the communicator still works. */
  for (int i = 0; i < 4; i++) buf[i] = (float)rank;
  r = coll_all_reduce(buf, out, 4, COLL_FLOAT32, COLL_SUM, comm, NULL);
  if (r != COLL_OK || out[3] != (float)(n * (n - 1) / 2))
    return t_failf("rank %d: all-reduce after refusals: %s %g", rank, coll_result_string(r),
                   out[3]);
  return 0;
}

Test(api, invalid_arguments_on_every_rank, .timeout = 60) {
  char why[256];
  cr_assert_eq(t_launch(3, bad_args, NULL, 50000, why, sizeof why), 0, "%s", why);
  cr_assert_eq(t_launch(1, bad_args, NULL, 50000, why, sizeof why), 0, "%s", why);
}

Test(api, null_communicator_and_bad_init) {
  float x = 0;
  cr_assert_eq(coll_all_reduce(&x, &x, 1, COLL_FLOAT32, COLL_SUM, NULL, NULL),
               COLL_ERR_INVALID_ARG);
  cr_assert(strstr(coll_comm_last_error(NULL), "comm is NULL"));
  cr_assert_eq(coll_barrier(NULL, NULL), COLL_ERR_INVALID_ARG);
  int v;
  cr_assert_eq(coll_comm_rank(NULL, &v), COLL_ERR_INVALID_ARG);
  cr_assert_eq(coll_comm_size(NULL, &v), COLL_ERR_INVALID_ARG);
  cr_assert_eq(coll_comm_set_timeout(NULL, 5), COLL_ERR_INVALID_ARG);
  coll_comm_t c;
  coll_unique_id id;
  memset(&id, 0x5a, sizeof id);
  cr_assert_eq(coll_comm_init_rank(&c, 2, id, 0), COLL_ERR_INVALID_ARG);
  cr_assert(strstr(coll_comm_last_error(NULL), "unique id"), "%s", coll_comm_last_error(NULL));
  cr_assert_eq(coll_get_unique_id(&id), COLL_OK);
  cr_assert_eq(coll_comm_init_rank(&c, 2, id, 2), COLL_ERR_INVALID_ARG);
  cr_assert_eq(coll_comm_init_rank(&c, 0, id, 0), COLL_ERR_INVALID_ARG);
  cr_assert_eq(coll_comm_init_rank(NULL, 2, id, 0), COLL_ERR_INVALID_ARG);
  cr_assert_str_eq(coll_result_string(COLL_ERR_TIMEOUT), "timeout");
  cr_assert_eq(coll_dtype_size(COLL_BFLOAT16), 2);
  cr_assert_eq(coll_dtype_size((coll_dtype)42), 0);
}

Test(api, init_from_env_says_what_is_missing) {
  coll_comm_t c;
  const char *vars[] = {"COLL_RANK",
                        "COLL_WORLD_SIZE",
                        "RANK",
                        "WORLD_SIZE",
                        "OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_SIZE",
                        "PMI_RANK",
                        "PMI_SIZE",
                        "SLURM_PROCID",
                        "SLURM_NTASKS",
                        "COLL_ADDR",
                        "MASTER_ADDR",
                        "MASTER_PORT"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
  cr_assert_eq(coll_comm_init_from_env(&c), COLL_ERR_INVALID_ARG);
  cr_assert(strstr(coll_comm_last_error(NULL), "WORLD_SIZE"), "%s", coll_comm_last_error(NULL));
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "two", 1);
  cr_assert_eq(coll_comm_init_from_env(&c), COLL_ERR_INVALID_ARG);
  cr_assert(strstr(coll_comm_last_error(NULL), "integers"), "%s", coll_comm_last_error(NULL));
  setenv("WORLD_SIZE", "2", 1);
  cr_assert_eq(coll_comm_init_from_env(&c), COLL_ERR_INVALID_ARG);
  cr_assert(strstr(coll_comm_last_error(NULL), "COLL_ADDR"), "%s", coll_comm_last_error(NULL));
  setenv("COLL_ADDR", "localhost", 1);
  cr_assert_eq(coll_comm_init_from_env(&c), COLL_ERR_INVALID_ARG);
  cr_assert(strstr(coll_comm_last_error(NULL), "host:port"), "%s", coll_comm_last_error(NULL));
  setenv("RANK", "5", 1);
  setenv("COLL_ADDR", "127.0.0.1:1", 1);
  cr_assert_eq(coll_comm_init_from_env(&c), COLL_ERR_INVALID_ARG);
  cr_assert(strstr(coll_comm_last_error(NULL), "impossible"), "%s", coll_comm_last_error(NULL));
}

/* ---- streams ------------------------------------------------------------------- */

static int streams(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  enum { K = 50, C = 20000 };
  coll_stream_t s;
  if (coll_stream_create(&s) != COLL_OK) return t_failf("stream create");
  int32_t *bufs = malloc(sizeof(int32_t) * K * C);
  for (int k = 0; k < K; k++)
    for (int i = 0; i < C; i++) bufs[k * C + i] = rank + k + i;
  /* Enqueue K in-place all-reduces; they must run in order and all be right. */
  for (int k = 0; k < K; k++) {
    coll_result r = coll_all_reduce(bufs + k * C, bufs + k * C, C, COLL_INT32, COLL_SUM, comm, s);
    if (r != COLL_OK) return t_failf("rank %d enqueue %d: %s", rank, k, coll_result_string(r));
  }
  coll_result q = coll_stream_query(s);
  if (q != COLL_OK && q != COLL_IN_PROGRESS) return t_failf("query: %s", coll_result_string(q));
  if (coll_stream_synchronize(s) != COLL_OK)
    return t_failf("rank %d sync: %s", rank, coll_comm_last_error(NULL));
  if (coll_stream_query(s) != COLL_OK) return t_failf("query after sync");
  for (int k = 0; k < K; k++)
    for (int i = 0; i < C; i++) {
      int32_t want = n * (n - 1) / 2 + n * (k + i);
      if (bufs[k * C + i] != want)
        return t_failf("rank %d: buffer %d elem %d is %d, want %d", rank, k, i, bufs[k * C + i],
                       want);
    }
  /* Mixing a blocking call after queued work keeps call order. */
  int64_t v = rank, w = 0;
  coll_all_reduce(bufs, bufs, C, COLL_INT32, COLL_MAX, comm, s);
  if (coll_all_reduce(&v, &w, 1, COLL_INT64, COLL_SUM, comm, NULL) != COLL_OK ||
      w != n * (n - 1) / 2)
    return t_failf("rank %d: blocking call after queued work", rank);
  if (coll_stream_destroy(s) != COLL_OK) return t_failf("destroy");
  free(bufs);
  return 0;
}

Test(api, streams_run_in_order, .timeout = 120) {
  char why[256];
  cr_assert_eq(t_launch(4, streams, NULL, 100000, why, sizeof why), 0, "%s", why);
}

/* ---- abort ---------------------------------------------------------------------- */

typedef struct {
  int pipe_fd[2];
} abort_arg;

/* Rank 0 queues an all-reduce that cannot finish (rank 1 never joins it), so the
 * progress thread is stuck waiting for rank 1; then the main thread aborts.  The queued
 * work must fail with COLL_ERR_REMOTE and the abort must return, with no timing games:
 * the work is certainly pending because its peer never sends. */
static int stuck_then_abort(coll_comm_t comm, int rank, int n, void *varg) {
  (void)n;
  abort_arg *a = varg;
  char byte;
  if (rank == 1) {
    /* Wait for rank 0's verdict, then leave without touching the communicator. */
    ssize_t got = read(a->pipe_fd[0], &byte, 1);
    _exit(got == 1 && byte == 'k' ? 0 : 1);
  }
  coll_stream_t s;
  coll_stream_create(&s);
  float x = 1, y = 0;
  coll_result r = coll_all_reduce(&x, &y, 1, COLL_FLOAT32, COLL_SUM, comm, s);
  if (r != COLL_OK) return t_failf("enqueue: %s", coll_result_string(r));
  if (coll_stream_query(s) != COLL_IN_PROGRESS) return t_failf("work finished without rank 1?");
  if (coll_comm_abort(comm) != COLL_OK) return t_failf("abort failed");
  r = coll_stream_synchronize(s);
  if (r != COLL_ERR_REMOTE)
    return t_failf("stuck all-reduce returned %s after abort", coll_result_string(r));
  if (!strstr(coll_comm_last_error(NULL), "abort"))
    return t_failf("sentence does not mention the abort: %s", coll_comm_last_error(NULL));
  coll_stream_destroy(s);
  byte = 'k';
  if (write(a->pipe_fd[1], &byte, 1) != 1) return t_failf("pipe");
  _exit(0); /* the communicator is gone: the launcher must not destroy it */
}

Test(api, abort_fails_pending_work, .timeout = 60) {
  abort_arg a;
  cr_assert_eq(pipe(a.pipe_fd), 0);
  char why[256];
  int rc = t_launch(2, stuck_then_abort, &a, 30000, why, sizeof why);
  cr_assert_eq(rc, 0, "%s", why);
  close(a.pipe_fd[0]);
  close(a.pipe_fd[1]);
}
