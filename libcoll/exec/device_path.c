/* device_path.c — one call of the device data path, from whichever thread serves it: the
 * caller's (a blocking call or one on a cudaStream_t: submit.c) or the progress thread's
 * (device buffers on a coll_stream_t, queued like any call on a stream: executor.c).
 *
 * Every rank describes its buffers (comm->dev: cuda/peer.c), one all-gather of the
 * descriptions over the host path (numbered as the user's call, not COLL_CHECKed:
 * peer.c compares the calls itself; the first one sets the device path up), peer.c maps
 * every rank's buffers, the tuner picks one of the table's device rows (algo/device.c),
 * which enqueues the call on a CUDA stream: the caller's cudaStream_t, the legacy default
 * stream for a blocking call, the communicator's own for a coll_stream_t.  *served false:
 * the host-driven path takes the call, on every rank alike.
 *
 * The two threads differ only in how the exchange runs, so the caller hands it in: the
 * caller's thread submits it (and waits, as for a blocking call), the progress thread,
 * which holds the right to execute, runs it in place.  Either way the ranks' exchanges
 * are the same call of the same number, so a job may mix them.
 *
 * Why a coll_stream_t is served here and not only on a cudaStream_t: a trainer's DDP
 * posts each gradient bucket on a coll_stream_t once the host has seen the bucket final
 * (libtrain's coll backend); on the host-driven path every slice of those device buffers
 * waited for a host fence (118 ms of communication per step at 2 ranks on one H200),
 * here one kernel moves the bucket while the caller's backward runs on its own stream.
 *
 * Must never: run a collective on the host, or return with a call served on some ranks
 * and not on others (the choice follows from the exchanged descriptors, the same
 * everywhere).
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "device_ops.h"
#include "internal.h"

coll_result coll_device_path(struct coll_comm *comm, const char *fn, coll_work *w, bool *served,
                             bool *exchanged, coll_device_run_exchange xchg) {
  *served = false;
  *exchanged = false;
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
  coll_result r = xchg(comm, &x, w);
  *exchanged = r == COLL_OK; /* a failed exchange has told the peers itself */
  if (r == COLL_OK) r = dev->peer_map(comm, fn, w, all);
  free(all);
  if (r == COLL_OK && w->peer_ok) {
    const coll_algo_entry *e = coll_tune_row(comm, w, coll_elem_bytes(w->dtype), 0);
    if (e->device_only) { /* else COLL_ALGO named a host-driven schedule */
      bool ran = true;
      *served = true;
      atomic_store_explicit(&comm->last_algo, (int)e->id + 1, memory_order_relaxed);
      r = dev->peer_finish(comm, w, e->run(comm, w, &ran));
      /* A blocking call returns with its result in place, and so does a coll_stream_t's
       * work (its stream completes when this returns); both bounded by the timeout. */
      if (r == COLL_OK && (!w->stream || w->peer_queued) &&
          (r = dev->wait_event(comm, dev->peer_done_event(comm), coll_coll_name(w->coll))) !=
              COLL_OK)
        dev->peer_poison(comm);
    }
  }
  return r;
}
