/* device_ops.h — the device interface: everything the layers above (comm/, exec/) need
 * from a device back end, as one table of operations.
 *
 * A communicator gets its table once, at creation (comm.c: cuda/'s where libcoll was
 * built with CUDA, else coll_device_host), and exec/ calls only through comm->dev; a
 * stream carries the table of the back end that made it (stream->dev), since a stream
 * is waited on without a communicator.  So a host-only call of a build without CUDA
 * goes api -> exec -> algo -> kernels and never enters cuda/, and no file of api/, comm/
 * or exec/ names a coll_cuda_* function (layers.rules holds it; comm.c's one question,
 * coll_cuda_device, is the allowed exception).  Whether a buffer is device memory is
 * still decided call by call inside the back end (`prepare`), as before: the CUDA
 * table classifies lazily (no CUDA call in a process that never loaded the driver, and
 * COLL_CUDA=off or no driver decided there, once per process), the host table says
 * "host" to everything.
 *
 * Two implementations: coll_device_host (device_host.c, beside this file: every hook a
 * no-op or a "host memory" answer) and cuda/device_cuda.c's (cuda.c's and peer.c's
 * functions).  The table lives in the kernels layer, beside the memory-ops table that
 * exec_begin hands over (mem_ops.h), so that the executor reaches it by going down.
 *
 * Declarations only.  Must never: name a CUDA type (every build includes this), or grow
 * a hook that the host table cannot answer without doing anything.
 */
#ifndef COLL_DEVICE_OPS_H
#define COLL_DEVICE_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"
#include "mem_ops.h"

/* An all-gather of `len` bytes per rank over the host path, as the library's own call:
 * handed down by the executor to comm_lazy for the device path's set-up (a back end
 * never calls up into exec/). */
typedef coll_result (*coll_device_exchange)(struct coll_comm *comm, const void *mine, void *all,
                                            size_t len);

/* What one rank says about a call of the device data path (peer_describe), exchanged by
 * exec/submit.c in one all-gather. */
#define COLL_DEVICE_DESC_BYTES 192

typedef struct coll_device_ops {
  const char *name; /* "host", "cuda" */

  /* ---- the communicator (comm.c, executor.c) ---- */
  /* At creation: the back end's state, empty; makes no device call. */
  coll_result (*comm_setup)(struct coll_comm *comm);
  /* `how` the communicator ends, for the back end's transport's close. */
  void (*comm_free)(struct coll_comm *comm, coll_comm_end how);
  /* executor.c, before work on device memory (w->device) or a device-path exchange
   * (w->peer_exchange): the first such call sets the device path up with every rank
   * through `xchg`; then refuses, with a sentence, what the path cannot serve. */
  coll_result (*comm_lazy)(struct coll_comm *comm, const coll_work *w, const char *fn,
                           coll_device_exchange xchg);
  /* coll_exec_wake_all (abort): wakes every thread waiting on the back end. */
  void (*comm_wake)(struct coll_comm *comm);

  /* ---- per call (exec/submit.c) ---- */
  /* Classifies w's buffers (w->device, w->cuda_dev), refuses what cannot run, sets
   * w->peer_candidate for a call the device data path may serve, and for any other
   * call goes on with prepare_stream. */
  coll_result (*prepare)(struct coll_comm *comm, const char *fn, coll_work *w);
  /* For the host-driven path: the event the call waits for and its ticket on a
   * device stream (w->cuda_event, w->cuda_ticket). */
  coll_result (*prepare_stream)(struct coll_comm *comm, const char *fn, coll_work *w);
  /* After the enqueue of a call with an event or on a device stream: makes the device
   * stream wait for it; on a failed enqueue (r != COLL_OK) only cleans up.  Returns r,
   * or its own failure. */
  coll_result (*after_submit)(struct coll_comm *comm, coll_work *w, coll_result r);

  /* ---- per call (exec/executor.c) ---- */
  /* At the start of device work (w->device or w->cuda_event): waits for the call's
   * event, binds the device, and swaps in the memory ops, connectors and slot size. */
  coll_result (*exec_begin)(struct coll_comm *comm, const coll_work *w, const coll_mem_ops **ops,
                            coll_conn ***send, coll_conn ***recv, size_t *slot_bytes);
  /* At the end of every call that called exec_begin: the final fence; returns r, or the
   * fence's failure when r was COLL_OK. */
  coll_result (*exec_end)(struct coll_comm *comm, const coll_work *w, coll_result r);
  /* When a call finishes (any result; and after submit.c's classify-only probe): frees
   * what prepare gave it (its event). */
  void (*work_done)(coll_work *w);

  /* ---- the device data path (exec/submit.c) ---- */
  /* Whether to try it for a w->peer_candidate: not known yet, or known to be up. */
  bool (*peer_wanted)(struct coll_comm *comm);
  /* This rank's description of the call, COLL_DEVICE_DESC_BYTES into `out`. */
  void (*peer_describe)(struct coll_comm *comm, const char *fn, const coll_work *w, void *out);
  /* After the all-gather of every rank's description: compares the calls, maps every
   * peer's buffers; w->peer_ok says whether the device rows may serve the call. */
  coll_result (*peer_map)(struct coll_comm *comm, const char *fn, coll_work *w, const void *descs);
  /* After a device row enqueued w: records the call's end; returns r or its failure. */
  coll_result (*peer_finish)(struct coll_comm *comm, coll_work *w, coll_result r);
  /* The event peer_finish recorded, which a blocking call waits for (wait_event). */
  void *(*peer_done_event)(struct coll_comm *comm);
  /* A bounded wait (COLL_TIMEOUT_MS, abort) for a device event. */
  coll_result (*wait_event)(struct coll_comm *comm, void *event, const char *what);
  /* Ends every wait of the device data path (a blocking call's wait failed). */
  void (*peer_poison)(struct coll_comm *comm);

  /* ---- streams (exec/stream.c, through stream->dev) ---- */
  /* coll_stream_synchronize, after the stream's own count: waits (bounded) for the
   * device stream the stream wraps. */
  coll_result (*stream_sync)(struct coll_stream *s);
  /* coll_stream_query: has the wrapped device stream run everything enqueued on it? */
  bool (*stream_idle)(struct coll_stream *s);
  /* coll_stream_destroy: frees the back end's part of the stream (stream->cuda). */
  void (*stream_free)(struct coll_stream *s);
  /* coll_stream_complete, under the stream's mutex: ticket t is done. */
  void (*ticket_done_locked)(struct coll_stream *s, uint32_t t);
} coll_device_ops;

/* Host memory only (device_host.c): what a build without CUDA runs with. */
extern const coll_device_ops coll_device_host;

#endif
