/* stream.c — streams: ordered queues of asynchronous work the caller can wait on.
 *
 * A stream only counts: how much work was enqueued on it and how much has finished, and
 * the first error among the finished.  The work itself sits in its communicator's queue
 * (executor.c), which is what orders it.  A stream may carry work of several
 * communicators, so it must never hold a communicator lock while it waits.
 *
 * A stream that wraps a device stream (coll_stream_create_cuda, cuda/cuda.c) is waited
 * for, freed and told of finished tickets through the table of the back end that made
 * it (stream->dev, kernels/device_ops.h); a plain one carries coll_device_host, whose
 * hooks do nothing, so this file never names cuda/.
 */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "device_ops.h"
#include "internal.h"

coll_result coll_stream_create(coll_stream_t *s) {
  if (!s)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_stream_create: stream pointer is NULL");
  struct coll_stream *st = malloc(sizeof *st);
  if (!st) return coll_fail(NULL, COLL_ERR_SYSTEM, "coll_stream_create: out of memory");
  coll_stream_init(st, &coll_device_host); /* host: its device hooks do nothing */
  *s = st;
  return COLL_OK;
}

coll_result coll_stream_synchronize(coll_stream_t s) {
  if (!s) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_stream_synchronize: stream is NULL");
  pthread_mutex_lock(&s->mu);
  while (s->completed < s->enqueued) pthread_cond_wait(&s->cv, &s->mu);
  coll_result r = s->err;
  if (r != COLL_OK) coll_fail(NULL, r, "%s", s->errmsg);
  s->err = COLL_OK;
  pthread_mutex_unlock(&s->mu);
  /* A cudaStream_t's: the device data path's calls were enqueued on it directly, so the
   * stream itself is what to wait for (bounded, cuda.c; the host table: nothing). */
  if (r == COLL_OK) r = s->dev->stream_sync(s);
  return r;
}

coll_result coll_stream_query(coll_stream_t s) {
  if (!s) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_stream_query: stream is NULL");
  pthread_mutex_lock(&s->mu);
  coll_result r = s->completed < s->enqueued ? COLL_IN_PROGRESS : s->err;
  if (r == COLL_OK && !s->dev->stream_idle(s)) r = COLL_IN_PROGRESS;
  if (r != COLL_OK && r != COLL_IN_PROGRESS) {
    coll_fail(NULL, r, "%s", s->errmsg);
    s->err = COLL_OK;
  }
  pthread_mutex_unlock(&s->mu);
  return r;
}

coll_result coll_stream_destroy(coll_stream_t s) {
  if (!s) return COLL_OK;
  coll_result r = coll_stream_synchronize(s);
  s->dev->stream_free(s); /* a stream of coll_stream_create_cuda: its CUDA part */
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
  return r;
}

void coll_stream_enqueued(struct coll_stream *s) {
  pthread_mutex_lock(&s->mu);
  s->enqueued++;
  pthread_mutex_unlock(&s->mu);
}

void coll_stream_complete(struct coll_stream *s, coll_result r, const char *msg, uint32_t ticket) {
  pthread_mutex_lock(&s->mu);
  s->completed++;
  s->dev->ticket_done_locked(s, ticket); /* every work on a CUDA stream has one */
  if (r != COLL_OK && s->err == COLL_OK) {
    s->err = r;
    snprintf(s->errmsg, sizeof s->errmsg, "%s", msg);
  }
  /* Waiters wait for everything enqueued (coll_stream_synchronize): wake them once, when
   * that is done, not at every completion — a caller waiting on 20 calls woken 20 times
   * takes a core from the ranks 20 times, which costs most when ranks outnumber cores.
   * (A CUDA stream's ticket waiters were woken by the ticket above.) */
  if (s->completed == s->enqueued) pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}
