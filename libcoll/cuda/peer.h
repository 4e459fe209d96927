/* peer.h — the device data path (peer.c): what exec/submit.c drives through the device
 * table (comm->dev's peer hooks, gathered in device_cuda.c), what cuda.c sets up and
 * tears down, and the primitives algo/device.c schedules with.
 *
 * No CUDA types (streams and events are void *), so every file can include it in every
 * build; without nvcc peer.c provides the primitives only (never reached: nothing is a
 * device buffer there), and the host table (kernels/device_host.c) answers the hooks.
 *
 * Must never: name struct coll_cuda_comm (cuda.c's state): the path's own state is
 * struct coll_peer, in the communicator.
 */
#ifndef COLL_PEER_H
#define COLL_PEER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device_ops.h"
#include "internal.h"
#include "peer_kernels.h"

/* The flags of the device path's barriers: one row of this many 32-bit words per rank. */
#define COLL_PEER_FLAG_STRIDE 16
/* Per communicator: device memory for what an in-place one-shot must not write over
 * while peers still read it (algo/device.c). */
#define COLL_DEV_SCRATCH (4u << 20)

/* One call on the device path: where it is enqueued and every rank's buffers, mapped
 * into this process (this rank's own at its index). */
typedef struct coll_dev_call {
  void *stream; /* cudaStream_t: the caller's, or the legacy default stream */
  const void *send[COLL_PEER_MAX];
  void *recv[COLL_PEER_MAX];
  /* Some rank's call is in place (its send and receive buffers are one): the schedules
   * must agree on every rank, and whether a call is in place may differ between ranks. */
  bool any_in_place;
} coll_dev_call;

/* cuda.c's lazy set-up, once cuda_ipc is up on every rank, on GPU `device` with
 * libcoll's own stream: the barrier flags (a page of host shared memory every GPU can
 * reach), scratch, a trial.  Makes comm->peer, ok on every rank alike or on none (the
 * reason in its `why`); COLL_OK where the path simply cannot run. */
coll_result coll_cuda_peer_setup(struct coll_comm *comm, coll_device_exchange xchg, int device,
                                 void *stream);
void coll_cuda_peer_free(struct coll_comm *comm);
/* Ends every wait of the device path (abort, a poisoned communicator). */
void coll_cuda_peer_poison(struct coll_comm *comm);
/* What this rank says about the call, COLL_PEER_DESC_BYTES into `out`: its shape and
 * its buffers (allocation, offset, IPC handle) — or that they cannot be shared. */
#define COLL_PEER_DESC_BYTES COLL_DEVICE_DESC_BYTES /* device_ops.h: submit.c sizes it */
void coll_cuda_peer_describe(struct coll_comm *comm, const char *fn, const coll_work *w, void *out);
/* After exec/submit.c's all-gather of every rank's description (whose first instance set the
 * path up): compares the calls (COLL_ERR_MISMATCH), then maps every peer's buffers.
 * w->peer_ok says whether the device rows may serve the call (w->dev holds the
 * buffers); false with COLL_OK: the host-driven path serves it, on every rank alike. */
coll_result coll_cuda_peer_map(struct coll_comm *comm, const char *fn, coll_work *w,
                               const void *descs, void *stream);
/* exec/submit.c, after a device row enqueued w: records the call's end on its stream
 * (coll_cuda_peer_done_event: a blocking call waits for it, the next call on another
 * stream starts after it); a failure ends every wait on the flags (submit.c then fails
 * the communicator). */
coll_result coll_cuda_peer_finish(struct coll_comm *comm, coll_work *w, coll_result r);
void *coll_cuda_peer_done_event(struct coll_comm *comm);

/* The primitives algo/device.c schedules with, all enqueued on d->stream. */
coll_result coll_dev_barrier(struct coll_comm *comm, const coll_dev_call *d);
/* The next epoch of this communicator's flags (every rank takes the same number per
 * call, in the same order: the rows run the same schedule everywhere). */
uint32_t coll_dev_epoch(struct coll_comm *comm);
/* Half-barriers, on the call's stream: write `epoch` into my flag at each rank of
 * to[0..nto), then wait until my flag from each rank of from[0..nfrom) holds it. */
coll_result coll_dev_signal(struct coll_comm *comm, const coll_dev_call *d, uint32_t epoch,
                            const int *to, int nto, const int *from, int nfrom);
/* The kernels fanned out (peer_kernels.h): one launch serving every rank's outputs. */
coll_result coll_dev_reduce_fan(struct coll_comm *comm, const coll_dev_call *d, void *const *dst,
                                int ndst, size_t seg, const void *const *src, int nsrc,
                                size_t count, coll_dtype dtype, coll_op op);
coll_result coll_dev_copy_fan(struct coll_comm *comm, const coll_dev_call *d, void *const *dst,
                              int ndst, const void *const *src, const size_t *bytes, int nseg);
coll_result coll_dev_reduce(struct coll_comm *comm, const coll_dev_call *d, void *dst,
                            const void *const *src, int nsrc, size_t count, coll_dtype dtype,
                            coll_op op);
coll_result coll_dev_copy(struct coll_comm *comm, const coll_dev_call *d, void *const *dst,
                          const void *const *src, const size_t *bytes, int nseg);
/* COLL_DEV_SCRATCH bytes of device memory of this communicator. */
void *coll_dev_scratch(struct coll_comm *comm);

/* The communicator's device data path (comm->peer; peer.c's alone). */
struct coll_peer {
  bool ok;          /* set up on every rank: the device rows may run */
  char why[192];    /* why not */
  int device;       /* the communicator's GPU */
  void *stream;     /* libcoll's own stream there (the set-up's trial) */
  bool warned;      /* said once that a buffer could not be shared */
  void *flag_base;  /* the flag page (host shared memory), its size, its name */
  size_t flag_size; /*   while rank 0 has not yet unlinked it */
  char flag_name[64];
  bool flag_registered;
  _Atomic uint32_t *flags; /* [dst * COLL_PEER_FLAG_STRIDE + src], host view */
  uint64_t flags_dev;      /* the same, as the GPU addresses it */
  uint32_t epoch;          /* the last barrier's */
  void *scratch;           /* COLL_DEV_SCRATCH bytes of device memory */
  void *done_ev;           /* cudaEvent_t recorded after every call: a blocking call waits
                              for it, the next call on another stream starts after it */
  void *last_stream;       /* the stream of the last call */
  unsigned max_blocks;     /* per kernel: 4 per multiprocessor */
  coll_dev_call call;      /* the running call's buffers */
};

#endif
