/* device_cuda.c — the CUDA device table (kernels/device_ops.h): cuda.c's and peer.c's
 * hooks gathered into the one table comm.c hands every communicator of a build with CUDA
 * (comm->dev), and the public calls that make and read a stream carrying it
 * (coll_stream_create_cuda, coll_stream_get_cuda: stream->dev).
 *
 * A separate file so that the one arrow comm/ may draw into cuda/ (layers.rules' allow)
 * ends here and at device_cuda.h, not at cuda.c: comm.c cannot call cuda.c's functions
 * by name.  Without nvcc there is no table (NULL): comm.c takes the host one.
 *
 * Must never: decide anything (the hooks do), or make a CUDA call when asked for the
 * table (a communicator's creation makes none).
 */
#include "coll_config.h"
#include "device_cuda.h"

#if COLL_HAVE_CUDA
#include <stdlib.h>

#include "coll_cuda.h"
#include "cuda_internal.h"

/* The device data path maps the peers' buffers for the caller's cudaStream_t, the one
 * its stream wraps (a blocking call or a coll_stream_t: none; peer.c picks). */
static coll_result peer_map(struct coll_comm *comm, const char *fn, coll_work *w,
                            const void *descs) {
  return coll_cuda_peer_map(comm, fn, w, descs,
                            w->stream && w->stream->cuda ? coll_cuda_stream_user(w->stream) : NULL);
}

static const coll_device_ops cuda_device = {
    .name = "cuda",
    .comm_setup = coll_cuda_comm_setup,
    .comm_free = coll_cuda_comm_free,
    .comm_lazy = coll_cuda_comm_lazy,
    .comm_wake = coll_cuda_comm_wake,
    .prepare = coll_cuda_prepare,
    .prepare_stream = coll_cuda_prepare_stream,
    .after_submit = coll_cuda_after_submit,
    .exec_begin = coll_cuda_exec_begin,
    .exec_end = coll_cuda_exec_end,
    .work_done = coll_cuda_work_done,
    .peer_wanted = coll_cuda_peer_wanted,
    .peer_describe = coll_cuda_peer_describe,
    .peer_map = peer_map,
    .peer_finish = coll_cuda_peer_finish,
    .peer_done_event = coll_cuda_peer_done_event,
    .wait_event = coll_cuda_wait_event,
    .peer_poison = coll_cuda_peer_poison,
    .stream_sync = coll_cuda_stream_sync,
    .stream_idle = coll_cuda_stream_idle,
    .stream_free = coll_cuda_stream_free,
    .ticket_done_locked = coll_cuda_ticket_done_locked,
};

const coll_device_ops *coll_cuda_device(void) { return &cuda_device; }

/* coll_cuda.h's: a stream of exec/stream.c's kind with a CUDA part (cuda.c's
 * coll_cuda_stream_new), carrying this table for stream.c to wait, query and free it
 * through.  Here, beside the table, so that cuda.c never needs to ask for it; not in api/:
 * api/ never names cuda/ (layers.rules), and cuda/ may not call up into exec/stream.c's
 * coll_stream_create, so the stream is made with internal.h's coll_stream_init, as
 * stream.c makes it, and with coll_stream_create's sentence. */
coll_result coll_stream_create_cuda(coll_stream_t *out, cudaStream_t cs) {
  if (!out)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_stream_create_cuda: stream pointer is NULL");
  *out = NULL;
  if (!coll_cuda_available())
    return coll_fail(NULL, COLL_ERR_UNSUPPORTED, "coll_stream_create_cuda: %s",
                     coll_cuda_unavailable_reason());
  struct coll_cuda_stream *x = NULL;
  coll_result r = coll_cuda_stream_new(&x, (void *)cs);
  if (r != COLL_OK) return r;
  struct coll_stream *st = malloc(sizeof *st);
  if (!st) {
    coll_cuda_stream_discard(x);
    return coll_fail(NULL, COLL_ERR_SYSTEM, "coll_stream_create: out of memory");
  }
  coll_stream_init(st, &cuda_device);
  st->cuda = x;
  *out = st;
  return COLL_OK;
}

coll_result coll_stream_get_cuda(coll_stream_t s, cudaStream_t *cs) {
  if (!s || !cs)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_stream_get_cuda: %s is NULL",
                     s ? "cs" : "stream");
  if (!s->cuda)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG,
                     "coll_stream_get_cuda: the stream was not made by coll_stream_create_cuda");
  *cs = (cudaStream_t)coll_cuda_stream_user(s);
  return COLL_OK;
}
#else
const coll_device_ops *coll_cuda_device(void) { return NULL; }
#endif
