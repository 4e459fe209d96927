/* submit.c — where a checked call enters the executor: device buffers recognised (and
 * refused when they cannot run), the device data path tried first where it may serve
 * (device_path.c: the back end maps every rank's buffers; the table's device rows,
 * algo/device.c, enqueue the call on the caller's stream), else the queue (executor.c,
 * whose progress thread serves device buffers on a coll_stream_t the same way), with the
 * cudaStream_t's event before and its wait after.  Every device question goes through
 * the communicator's device table, comm->dev (kernels/device_ops.h: cuda/'s in a build
 * with CUDA, else the host table, whose answers are "host memory" and "nothing to do").
 *
 * api.c and group.c hand every call here, and only here: the layers below them (exec,
 * algo, and the device back end through comm->dev) are reached from this file down.
 *
 * Must never: run a collective itself, or let a call that was not enqueued leak what it
 * owns (all_to_allv's copied arrays).
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "device_ops.h"
#include "internal.h"

/* All-to-all, gather and scatter have no device path yet: cuda.c's executor hooks were
 * written for the five collectives, and nothing could test them on a GPU. */
static coll_result host_only(struct coll_comm *comm, const char *fn, const coll_work *w) {
  bool newer = w->coll == COLL_COLL_ALL_TO_ALL || w->coll == COLL_COLL_ALL_TO_ALLV ||
               w->coll == COLL_COLL_GATHER || w->coll == COLL_COLL_SCATTER;
  if (!newer || (!w->device && !w->cuda_event)) return COLL_OK;
  return coll_fail(comm, COLL_ERR_UNSUPPORTED,
                   "%s on rank %d: %s, but all-to-all, gather and scatter run on host memory "
                   "and coll_stream_t streams only (no device path yet): stage the data "
                   "through host buffers",
                   fn, comm->rank,
                   w->device ? "the buffers are CUDA device memory"
                             : "the stream wraps a cudaStream_t");
}

/* The caller's thread hands the device path's exchange to the executor like any call
 * (device_path.c); past the exchange every peer is in this call, so a failure after it
 * must reach them. */
static coll_result submit_exchange(struct coll_comm *comm, coll_work *x, coll_work *call) {
  (void)call;
  return coll_exec_submit(comm, x);
}

static coll_result device_path(struct coll_comm *comm, const char *fn, coll_work *w, bool *served) {
  bool exchanged = false;
  coll_result r = coll_device_path(comm, fn, w, served, &exchanged, submit_exchange);
  if (r != COLL_OK && exchanged) coll_exec_failed(comm, r);
  return r;
}

coll_result coll_submit(struct coll_comm *comm, const char *fn, coll_work *w) {
  coll_comm_enter(comm);
  /* The device back end (cuda.c, or the host table): device buffers are recognised (and
   * refused when they cannot run) here; a cudaStream_t gets its event before and its
   * wait after the enqueue. */
  coll_result r = comm->dev->prepare(comm, fn, w);
  bool enqueued = false;
  if (r == COLL_OK && w->peer_candidate) {
    bool served = false;
    r = device_path(comm, fn, w, &served);
    if (r != COLL_OK || served) {
      coll_comm_leave(comm);
      return r;
    }
    r = comm->dev->prepare_stream(comm, fn, w);
    if (r != COLL_OK) {
      coll_comm_leave(comm);
      return r;
    }
  }
  if (r == COLL_OK) {
    r = host_only(comm, fn, w);
    if (r == COLL_OK) r = coll_exec_submit(comm, w), enqueued = true;
    /* On failure it releases the event; on success it makes a cudaStream_t wait.  A call
     * with neither (host memory, no cudaStream_t: prepare set no event) has nothing
     * there, and does not go back down into the back end after the executor for it. */
    if (w->cuda_event || (w->stream && w->stream->cuda)) r = comm->dev->after_submit(comm, w, r);
  }
  if (!enqueued) free(w->v_copy); /* else the executor frees it (finish()) */
  coll_comm_leave(comm);
  return r;
}


coll_result coll_submit_classify(struct coll_comm *comm, const char *fn, coll_work *w) {
  coll_result r = comm->dev->prepare(comm, fn, w);
  comm->dev->work_done(w); /* the event a device call gets: a probe runs nothing */
  return r;
}
