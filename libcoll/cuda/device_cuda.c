/* device_cuda.c — the CUDA device table (kernels/device_ops.h): cuda.c's and peer.c's
 * hooks gathered into the one table comm.c hands every communicator of a build with CUDA
 * (comm->dev), and coll_stream_create_cuda every stream it makes (stream->dev).
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
#include "cuda_internal.h"

/* The device data path maps the peers' buffers for the caller's cudaStream_t, the one
 * its stream wraps (a blocking call: none, the legacy default stream). */
static coll_result peer_map(struct coll_comm *comm, const char *fn, coll_work *w,
                            const void *descs) {
  return coll_cuda_peer_map(comm, fn, w, descs,
                            w->stream ? coll_cuda_stream_user(w->stream) : NULL);
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
#else
const coll_device_ops *coll_cuda_device(void) { return NULL; }
#endif
