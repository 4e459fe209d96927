/* cuda_internal.h — cuda.c's functions, as the cuda layer's files (device_cuda.c, which
 * gathers the hooks into the CUDA device table; driver.c; peer.c) and the tests see them
 * (the transport's own part, libcoll/transport/cuda_ipc.c, is declared in
 * libcoll/transport/cuda_ipc.h).  The layers above never include it: they reach CUDA
 * through the device table (kernels/device_ops.h, comm->dev), and comm.c asks for that
 * table through device_cuda.h alone (layers.rules).
 *
 * No CUDA type appears here, so every file can include it in every build.  Without nvcc
 * (COLL_HAVE_CUDA == 0) cuda.c provides the process-wide and pure functions only (the
 * first two sections below), saying "no CUDA": the communicator's and the calls' hooks
 * are then the host table's (kernels/device_host.c), and are not defined here.
 *
 * The pieces:
 *  - the device memory ops: the table type (coll_mem_ops) and the host table are the
 *    kernels layer's (kernels/mem_ops.h, mem_host.c); cuda.c's device table is
 *    cudaMemcpyAsync and cuda_kernels.cu on the communicator's own CUDA stream, with
 *    `fence` waiting for that stream before a slot is published (send_post) or handed
 *    back (recv_release), and coll_cuda_exec_begin (the table's exec_begin) hands it to
 *    the executor.
 *  - pointer classification: only in a process where the CUDA driver is loaded (someone
 *    used CUDA: a process that never did can have no device memory), then
 *    cudaPointerGetAttributes once a probe found a device (cached per process).
 *  - the per-communicator CUDA state: its device, its stream, and the cuda_ipc
 *    connectors used for device buffers (host buffers keep using shm / tcp).
 *  - pure functions (transport selection per pair, the buffer check) that tests call
 *    without a GPU.
 * Must never: initialise CUDA in a process that has not asked for it through a
 * communicator or a device pointer check, or print; every failure is a coll_fail sentence.
 */
#ifndef COLL_CUDA_INTERNAL_H
#define COLL_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_ipc.h"
#include "internal.h"
#include "mem_ops.h"
#include "peer.h"

/* ---- process-wide ------------------------------------------------------------------- */

/* Was libcoll built with CUDA (nvcc found)? */
bool coll_cuda_built(void);
/* Probes once per process (COLL_CUDA=off skips it): a CUDA runtime, a driver and at
 * least one device.  False with the reason in coll_cuda_unavailable_reason(). */
bool coll_cuda_available(void);
const char *coll_cuda_unavailable_reason(void);
/* Has this process run the probe (for tests: a host-only job must not)? */
bool coll_cuda_probed(void);

/* Is the CUDA driver (libcuda.so) loaded in this process?  Asked before every call that
 * moves data (a process that never loaded it has no device memory); one load per call
 * while nothing new is loaded (driver.c). */
bool coll_cuda_driver_loaded(void);

typedef enum { COLL_MEM_HOST = 0, COLL_MEM_DEVICE = 1, COLL_MEM_NONE = 2 } coll_mem_kind;
/* NONE for NULL; host when CUDA is unavailable or was never used in this process, for
 * host (pinned or not) and managed memory; device (and its ordinal in *device) for
 * cudaMalloc'ed memory. */
coll_mem_kind coll_cuda_classify(const void *p, int *device);

/* ---- pure parts (no CUDA calls; tested without a GPU) ------------------------------- */

/* coll_cuda_view, what one rank says about itself in the init exchange: cuda_ipc.h. */
typedef enum { COLL_SEL_CUDA_IPC = 0, COLL_SEL_NONE = 1 } coll_cuda_selection;
/* The transport for device buffers between a and b.  Symmetric by construction (both
 * ranks of a pair compute it from the same two views and must agree): cuda_ipc when
 * both set it up, they are separate processes on one host, and they share a GPU or
 * each GPU can reach the other's.  Otherwise NONE, with the reason in `why`. */
coll_cuda_selection coll_cuda_select(const coll_cuda_view *a, const coll_cuda_view *b, char *why,
                                     size_t why_len);

/* The up-front check of a collective's buffers: both on the same side (and one GPU),
 * and device buffers only with CUDA available and cuda_ipc to every peer.  `cuda_ready`
 * is NULL when ready, else the reason the communicator has no device path. */
coll_result coll_cuda_check_kinds(struct coll_comm *comm, const char *fn, coll_mem_kind send_kind,
                                  int send_dev, coll_mem_kind recv_kind, int recv_dev, int comm_dev,
                                  const char *cuda_ready);

/* ---- the communicator's CUDA state (cuda.c): the CUDA table's comm_* hooks ----------- */

/* At creation: the communicator's CUDA state, empty.  Makes no CUDA call (nothing is
 * set up until a collective is handed device memory). */
coll_result coll_cuda_comm_setup(struct coll_comm *comm);
/* executor.c, before running work on device memory (w->device): on the communicator's
 * first such call, sets the device path up on the buffers' GPU (w->cuda_dev) with every
 * other rank (cuda.c's "Lazy" comment says how); then refuses, with a sentence, a call
 * the path cannot serve.  Collective on that first call: every rank must make it. */
coll_result coll_cuda_comm_lazy(struct coll_comm *comm, const coll_work *w, const char *fn,
                                coll_device_exchange xchg);
/* `how` the communicator ends, for cuda_ipc's close (comm.c knows). */
void coll_cuda_comm_free(struct coll_comm *comm, coll_comm_end how);
/* Wakes threads waiting on cuda_ipc connectors (abort). */
void coll_cuda_comm_wake(struct coll_comm *comm);

/* ---- per collective: the CUDA table's hooks for exec/submit.c, executor.c, stream.c -- */

/* exec/submit.c, before enqueueing: classifies the buffers of `w` (sets w->device), refuses
 * what cannot run, and sets w->peer_candidate for a call the device data path (peer.c)
 * may serve; for any other call on a CUDA stream (or device buffers) it goes on with
 * coll_cuda_prepare_stream. */
coll_result coll_cuda_prepare(struct coll_comm *comm, const char *fn, coll_work *w);
/* For the host-driven path: records the event the collective waits for (the caller's
 * cudaStream_t, or the legacy default stream for a blocking call) and its ticket. */
coll_result coll_cuda_prepare_stream(struct coll_comm *comm, const char *fn, coll_work *w);
/* exec/submit.c, after enqueueing on a CUDA stream: makes the cudaStream_t wait for the
 * collective.  On a failed enqueue (r != COLL_OK) only cleans up. */
coll_result coll_cuda_after_submit(struct coll_comm *comm, coll_work *w, coll_result r);
/* executor.c, at the start of a device collective: waits for the recorded event, binds
 * the device, and returns the ops, connectors and slice size to use. */
/* A stream's CUDA part (its completion counter in mapped host memory, the user's
 * cudaStream_t), made and discarded for device_cuda.c's coll_stream_create_cuda. */
struct coll_cuda_stream;
coll_result coll_cuda_stream_new(struct coll_cuda_stream **out, void *user);
void coll_cuda_stream_discard(struct coll_cuda_stream *x);

coll_result coll_cuda_exec_begin(struct coll_comm *comm, const coll_work *w,
                                 const coll_mem_ops **ops, coll_conn ***send, coll_conn ***recv,
                                 size_t *slot_bytes);
/* executor.c, at the end of every collective that called exec_begin: the final fence
 * (so no device work of a failed collective is left running); returns r, or the fence's
 * failure when r was COLL_OK. */
coll_result coll_cuda_exec_end(struct coll_comm *comm, const coll_work *w, coll_result r);
/* executor.c, when queued work finishes (any result): frees its event. */
void coll_cuda_work_done(coll_work *w);
/* stream.c, under the stream's mutex: ticket t is done; publishes every ticket up to the
 * first one not done, which releases the cudaStream_t waiting for them. */
void coll_cuda_ticket_done_locked(struct coll_stream *s, uint32_t t);
/* stream.c: waits (bounded by COLL_TIMEOUT_MS) until the wrapped cudaStream_t has run
 * everything enqueued on it; whether it has. */
coll_result coll_cuda_stream_sync(struct coll_stream *s);
bool coll_cuda_stream_idle(struct coll_stream *s);
/* stream.c: frees the CUDA part of a stream. */
void coll_cuda_stream_free(struct coll_stream *s);

/* A bounded wait for a cudaEvent_t (exec/submit.c waits for a blocking call of the
 * device data path with it). */
coll_result coll_cuda_wait_event(struct coll_comm *comm, void *event, const char *what);
/* The cudaStream_t (as void *) a stream of coll_stream_create_cuda (cuda.c) wraps. */
void *coll_cuda_stream_user(struct coll_stream *s);

/* exec/submit.c, for a w->peer_candidate: whether to try the device data path at all —
 * not known yet (the first device call sets it up), or known to be up.  False once the
 * communicator is known not to have it (every rank knows the same). */
bool coll_cuda_peer_wanted(struct coll_comm *comm);

/* The communicator's CUDA state (comm->cuda). */
struct coll_cuda_comm {
  _Atomic bool tried;       /* the first device call has set the path up (or failed to):
                               the fields below are final once this reads true */
  int device;               /* the GPU of the first call on device memory */
  void *stream;             /* cudaStream_t: libcoll's own, non-blocking */
  void *ipc_ctx;            /* cuda_ipc transport context */
  coll_conn **send, **recv; /* per peer, for device buffers */
  size_t slot_bytes;
  bool ready;               /* every pair of ranks has cuda_ipc: device buffers can run */
  char reason[COLL_ERRBUF]; /* why not, when !ready */
};

#endif
