/* submit.c — where a checked call enters the executor: device buffers recognised (and
 * refused when they cannot run), the device data path tried first where it may serve
 * (the back end maps every rank's buffers; the table's device rows, algo/device.c,
 * enqueue the call on the caller's stream), else the queue (executor.c), with the
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

/* The device data path: every rank describes its buffers (comm->dev: cuda/peer.c), one
 * all-gather of the descriptions over the host path (numbered as the user's call, not
 * COLL_CHECKed: peer.c compares the calls itself; the first one sets the device path up),
 * peer.c maps every rank's buffers, the tuner picks one of the table's device rows (algo/device.c),
 * which enqueues the call on the caller's stream.  *served false: the host-driven path
 * takes the call, on every rank alike. */
static coll_result device_path(struct coll_comm *comm, const char *fn, coll_work *w, bool *served) {
  *served = false;
  w->peer_ok = false;
  const coll_device_ops *dev = comm->dev;
  if (!dev->peer_wanted(comm)) return COLL_OK;
  size_t n = (size_t)comm->nranks;
  uint8_t mine[COLL_DEVICE_DESC_BYTES], *all = malloc(n * COLL_DEVICE_DESC_BYTES);
  if (!all) return coll_fail(comm, COLL_ERR_SYSTEM, "%s on rank %d: out of memory", fn, comm->rank);
  memset(mine, 0, sizeof mine);
  dev->peer_describe(comm, fn, w, mine);
  coll_work x = {.coll = COLL_COLL_ALL_GATHER,
                 .sendbuf = mine,
                 .recvbuf = all,
                 .count = COLL_DEVICE_DESC_BYTES,
                 .dtype = COLL_UINT8,
                 .peer_exchange = true,
                 .cuda_dev = w->cuda_dev,
                 .inner = true};
  coll_result r = coll_exec_submit(comm, &x);
  bool exchanged = r == COLL_OK; /* a failed exchange has told the peers itself */
  if (r == COLL_OK) r = dev->peer_map(comm, fn, w, all);
  free(all);
  if (r == COLL_OK && w->peer_ok) {
    const coll_algo_entry *e = coll_tune_row(comm, w, coll_elem_bytes(w->dtype), 0);
    if (e->device_only) { /* else COLL_ALGO named a host-driven schedule */
      bool ran = true;
      *served = true;
      atomic_store_explicit(&comm->last_algo, (int)e->id + 1, memory_order_relaxed);
      r = dev->peer_finish(comm, w, e->run(comm, w, &ran));
      /* A blocking call returns with its result in place (bounded by the timeout). */
      if (r == COLL_OK && !w->stream &&
          (r = dev->wait_event(comm, dev->peer_done_event(comm), coll_coll_name(w->coll))) !=
              COLL_OK)
        dev->peer_poison(comm);
    }
  }
  /* Past the exchange every peer is in this call: a failure here must reach them. */
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
