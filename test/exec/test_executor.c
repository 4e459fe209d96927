/* test_executor.c — the executor's queue at its limits (exec/executor.c).
 *
 * Abort with a full queue: callers waiting for room must return, not hang, and the work
 * already queued must still be finished (its stream hears of every one).  The state
 * "the executor is busy and the queue is full" is made exactly, in one process, by
 * holding the execution right (comm->running) ourselves, as a progress thread stuck in a
 * slow call would; nothing here depends on timing.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "coll_test.h"
#include "internal.h"

typedef struct {
  coll_comm_t comm;
  coll_stream_t s; /* NULL: a blocking call */
  int32_t in, out;
  coll_result r;
  _Atomic int returned;
} caller;

static void *call(void *p) {
  caller *c = p;
  c->r = coll_all_reduce(&c->in, &c->out, 1, COLL_INT32, COLL_SUM, c->comm, c->s);
  atomic_store(&c->returned, 1);
  return NULL;
}

static void *do_abort(void *p) {
  coll_comm_abort(p);
  return NULL;
}

Test(executor, abort_with_a_full_queue, .timeout = 60) {
  setenv("COLL_TUNE", "0", 1);
  coll_unique_id id;
  coll_comm_t comm;
  cr_assert_eq(coll_get_unique_id(&id), COLL_OK);
  cr_assert_eq(coll_comm_init_rank(&comm, 1, id, 0), COLL_OK, "%s", coll_comm_last_error(NULL));
  /* Busy: the execution right is ours, so nothing queued runs. */
  bool idle = false;
  cr_assert(atomic_compare_exchange_strong(&comm->running, &idle, true));
  coll_stream_t s;
  cr_assert_eq(coll_stream_create(&s), COLL_OK);
  static int32_t in[COLL_QUEUE_SLOTS], out[COLL_QUEUE_SLOTS];
  for (int i = 0; i < COLL_QUEUE_SLOTS; i++)
    cr_assert_eq(coll_all_reduce(&in[i], &out[i], 1, COLL_INT32, COLL_SUM, comm, s), COLL_OK);
  cr_assert_eq(comm->qtail - comm->qhead, (uint64_t)COLL_QUEUE_SLOTS, "the queue is not full");
  /* Three callers wait for room: two blocking, one on the stream. */
  enum { W = 3 };
  caller c[W];
  pthread_t t[W], ab;
  for (int i = 0; i < W; i++) {
    c[i] = (caller){.comm = comm, .s = i == 2 ? s : NULL, .in = i};
    cr_assert_eq(pthread_create(&t[i], NULL, call, &c[i]), 0);
  }
  /* Abort once all three are inside the library (abort then waits for them to leave). */
  while (atomic_load(&comm->users) < W) sched_yield();
  cr_assert_eq(pthread_create(&ab, NULL, do_abort, comm), 0);
  for (int i = 0; i < W; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < W; i++)
    cr_expect_eq(c[i].r, COLL_ERR_REMOTE, "caller %d waiting for room returned %s", i,
                 coll_result_string(c[i].r));
  /* Hand the execution right back: the progress thread finishes the queued work (each
   * fails at once, aborted) and abort can free the communicator. */
  pthread_mutex_lock(&comm->qmu);
  atomic_store(&comm->running, false);
  pthread_cond_broadcast(&comm->qcv);
  pthread_mutex_unlock(&comm->qmu);
  pthread_join(ab, NULL);
  /* Every queued call was finished and reported: the stream does not wait for ever. */
  cr_expect_eq(coll_stream_synchronize(s), COLL_ERR_REMOTE);
  coll_stream_destroy(s);
}
