/* cuda.c — device buffers: detection, the device memory ops, the communicator's CUDA
 * state, and collectives enqueued on a cudaStream_t.
 *
 * The layers above never call this file by name: device_cuda.c gathers its hooks (and
 * peer.c's) into the CUDA device table (kernels/device_ops.h), which a communicator
 * holds as comm->dev and a stream made here (coll_stream_create_cuda) as stream->dev.
 *
 * Data path.  The executor runs the same plan for device buffers as for host buffers;
 * only its memory ops and connectors change (coll_cuda_exec_begin, the table's
 * exec_begin, hands them over).
 * Device ops issue cudaMemcpyAsync and the kernels of cuda_kernels.cu on the
 * communicator's own non-blocking stream, and `fence` waits for that stream (polling
 * cudaStreamQuery, bounded by COLL_TIMEOUT_MS and the abort flag) before the executor
 * publishes a slot to a peer or hands one back.  The connectors are cuda_ipc's: FIFO
 * slots in the receiver's device memory, tail/head counters in host shared memory.
 * The stream is non-blocking on purpose: a blocking stream would wait for the legacy
 * default stream, which may itself be waiting for this very collective (below).
 *
 * Streams (coll_stream_create_cuda, coll_cuda.h).  Ordering with the user's
 * cudaStream_t goes both ways, like NCCL's:
 *  - before: at enqueue we record an event on the cudaStream_t; the executor waits for
 *    it (cudaEventQuery polling) before the collective touches a buffer.
 *  - after: each collective gets a ticket, 1, 2, 3 ... per stream.  When it finishes
 *    (successfully or not) the executor publishes it in a 32-bit counter in mapped,
 *    pinned host memory; the counter only advances over tickets that are all done, so
 *    "counter >= t" means "every collective enqueued up to t is done" even when several
 *    communicators share a stream.  At enqueue the cudaStream_t is made to wait for
 *    its ticket with cuStreamWaitValue32(GEQ) — a wait in the GPU's front end: no
 *    thread is blocked, and it costs the stream nothing until the value arrives.
 *    We get the driver function through cudaGetDriverEntryPointByVersion, so libcoll
 *    never links libcuda.  Where stream memory operations are not supported the
 *    fallback is cudaLaunchHostFunc with a callback that waits for the counter
 *    (sleeping 20 us between looks); it holds one of the driver's callback threads
 *    while it waits, which is why it is only the fallback.
 *
 * Detection.  The probe (cudaGetDeviceCount) runs once per process, lazily, and only
 * from a communicator's init or a pointer check; COLL_CUDA=off skips it and every
 * buffer is then host memory.  libcoll links the static CUDA runtime, which opens
 * libcuda.so.1 at run time: with no driver the probe fails and nothing else changes.
 *
 * Must never: print, exit, block without a bound (every wait looks at the abort flag
 * and the deadline), call CUDA in a process whose communicators never asked for it, or
 * let a CUDA error pass without a coll_fail sentence naming the call.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll_config.h"
#include "cuda_internal.h"

/* ---- pure parts ------------------------------------------------------------------------ */

static bool lists(const coll_cuda_view *v, uint32_t pci) {
  uint32_t n = v->npeers < 16 ? v->npeers : 16;
  for (uint32_t i = 0; i < n; i++)
    if (v->peers[i] == pci) return true;
  return false;
}

coll_cuda_selection coll_cuda_select(const coll_cuda_view *a, const coll_cuda_view *b, char *why,
                                     size_t why_len) {
  const char *w = NULL;
  if (!a->ok || !b->ok)
    w = "one of the two ranks has no CUDA device path (no GPU, no driver, "
        "or its cuda_ipc setup failed)";
  else if (a->host_id != b->host_id)
    w = "they run on different hosts (CUDA IPC is within one host)";
  else if (a->pid == b->pid)
    w = "they are the same process (CUDA IPC handles cannot be opened "
        "by the process that made them)";
  else if (a->pci != b->pci && !(lists(a, b->pci) && lists(b, a->pci)))
    w = "their GPUs cannot access each other (no peer access between them)";
  if (why && why_len) snprintf(why, why_len, "%s", w ? w : "cuda_ipc");
  return w ? COLL_SEL_NONE : COLL_SEL_CUDA_IPC;
}

static const char *kind_name(coll_mem_kind k) {
  return k == COLL_MEM_DEVICE ? "device memory" : k == COLL_MEM_HOST ? "host memory" : "NULL";
}

coll_result coll_cuda_check_kinds(struct coll_comm *comm, const char *fn, coll_mem_kind sk, int sd,
                                  coll_mem_kind rk, int rd, int comm_dev, const char *cuda_ready) {
  int rank = comm ? comm->rank : -1;
  if (sk != COLL_MEM_DEVICE && rk != COLL_MEM_DEVICE) return COLL_OK;
  if (sk != COLL_MEM_NONE && rk != COLL_MEM_NONE && sk != rk)
    return coll_fail(comm, COLL_ERR_INVALID_ARG,
                     "%s on rank %d: sendbuf is %s but recvbuf is %s: both buffers must be "
                     "device memory or both host memory",
                     fn, rank, kind_name(sk), kind_name(rk));
  int dev = sk == COLL_MEM_DEVICE ? sd : rd;
  if (sk == COLL_MEM_DEVICE && rk == COLL_MEM_DEVICE && sd != rd)
    return coll_fail(comm, COLL_ERR_INVALID_ARG,
                     "%s on rank %d: sendbuf is on GPU %d but recvbuf on GPU %d: both must be "
                     "on the communicator's GPU",
                     fn, rank, sd, rd);
  if (cuda_ready)
    return coll_fail(comm, COLL_ERR_UNSUPPORTED,
                     "%s on rank %d: the buffers are CUDA device memory (GPU %d), but this "
                     "communicator cannot run a collective on device memory: %s",
                     fn, rank, dev, cuda_ready);
  if (dev != comm_dev)
    return coll_fail(comm, COLL_ERR_INVALID_ARG,
                     "%s on rank %d: the buffers are on GPU %d but the communicator was built "
                     "on GPU %d (call cudaSetDevice before coll_comm_init_rank)",
                     fn, rank, dev, comm_dev);
  return COLL_OK;
}

#if COLL_HAVE_CUDA
/* ======================================================================================
 * With CUDA
 * ====================================================================================== */
#include <cuda.h> /* types and enums of the driver API only: libcuda is never linked */
#include <cuda_runtime_api.h>

#include "coll_cuda.h"
#include "cuda_kernels.h"

bool coll_cuda_built(void) { return true; }

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static bool probe_ok;
static _Atomic bool probe_ran;
static char probe_why[256];

bool coll_cuda_probed(void) { return atomic_load(&probe_ran); }

static void probe(void) {
  atomic_store(&probe_ran, true);
  const char *e = getenv("COLL_CUDA");
  if (e && (strcmp(e, "off") == 0 || strcmp(e, "0") == 0)) {
    snprintf(probe_why, sizeof probe_why, "COLL_CUDA=%s turned CUDA off", e);
    return;
  }
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaErrorInsufficientDriver) {
    int drv = 0; /* the CUDA version the installed driver supports; 0: no driver */
    cudaDriverGetVersion(&drv);
    char has[64] = "no libcuda.so.1 was found";
    if (drv)
      snprintf(has, sizeof has, "the driver supports CUDA %d.%d", drv / 1000, drv % 1000 / 10);
    snprintf(probe_why, sizeof probe_why,
             "no usable CUDA driver: libcoll was built with the CUDA %d.%d runtime, and %s "
             "(cudaGetDeviceCount: %s)",
             CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10, has, cudaGetErrorName(err));
    cudaGetLastError();
    return;
  }
  if (err != cudaSuccess) {
    snprintf(probe_why, sizeof probe_why,
             "no usable CUDA driver or GPU (cudaGetDeviceCount: %s, %s)", cudaGetErrorName(err),
             cudaGetErrorString(err));
    cudaGetLastError();
    return;
  }
  if (n < 1) {
    snprintf(probe_why, sizeof probe_why, "the CUDA driver sees no GPU");
    return;
  }
  probe_ok = true;
}

bool coll_cuda_available(void) {
  pthread_once(&probe_once, probe);
  return probe_ok;
}

const char *coll_cuda_unavailable_reason(void) {
  pthread_once(&probe_once, probe);
  return probe_ok ? "" : probe_why;
}

coll_mem_kind coll_cuda_classify(const void *p, int *device) {
  *device = -1;
  if (!p) return COLL_MEM_NONE;
  if (!coll_cuda_driver_loaded() || !coll_cuda_available()) return COLL_MEM_HOST;
  struct cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError(); /* not a pointer CUDA knows: host memory */
    return COLL_MEM_HOST;
  }
  if (a.type == cudaMemoryTypeDevice) {
    *device = a.device;
    return COLL_MEM_DEVICE;
  }
  return COLL_MEM_HOST; /* unregistered, pinned host or managed: the CPU can touch it */
}

#define CUDA_FAIL(comm, code, err, what, ...)                                            \
  coll_fail(comm, code, "rank %d: " what " failed: %s (%s)", (comm) ? (comm)->rank : -1, \
            ##__VA_ARGS__, cudaGetErrorName(err), cudaGetErrorString(err))

/* ---- device memory ops ----------------------------------------------------------------- */

static cudaStream_t comm_stream(struct coll_comm *c) { return (cudaStream_t)c->cuda->stream; }
static int comm_dev(struct coll_comm *c) { return c->cuda ? c->cuda->device : -1; }

static coll_result dev_copy(struct coll_comm *c, void *dst, const void *src, size_t bytes) {
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, comm_stream(c));
  if (e != cudaSuccess)
    return CUDA_FAIL(c, COLL_ERR_SYSTEM, e, "cudaMemcpyAsync of %zu bytes on GPU %d", bytes,
                     c->cuda->device);
  return COLL_OK;
}

static coll_result dev_reduce(struct coll_comm *c, void *dst, const void *a, const void *b,
                              size_t n, coll_dtype dtype, coll_op op) {
  cudaError_t e = (cudaError_t)coll_cuda_launch_reduce(dst, a, b, n, (int)dtype, (int)op,
                                                       c->cuda->stream);
  if (e != cudaSuccess)
    return CUDA_FAIL(c, COLL_ERR_SYSTEM, e, "launching the %s %s reduction kernel (%zu elements)",
                     coll_dtype_name(dtype), coll_op_name(op), n);
  return COLL_OK;
}

static coll_result dev_avg(struct coll_comm *c, void *buf, size_t n, coll_dtype dtype, int nranks) {
  cudaError_t e = (cudaError_t)coll_cuda_launch_avg(buf, n, (int)dtype, nranks, c->cuda->stream);
  if (e != cudaSuccess)
    return CUDA_FAIL(c, COLL_ERR_SYSTEM, e, "launching the %s average kernel (%zu elements)",
                     coll_dtype_name(dtype), n);
  return COLL_OK;
}

/* Polls until `query` stops answering cudaErrorNotReady: a short spin (a slice of a few
 * MiB takes microseconds on a GPU), then yields, always bounded by the deadline and the
 * abort flag. */
typedef cudaError_t (*query_fn)(void *);
static coll_result poll_done(struct coll_comm *c, query_fn q, void *arg, const char *what) {
  uint64_t start = 0;
  for (unsigned i = 0;; i++) {
    cudaError_t e = q(arg);
    if (e == cudaSuccess) return COLL_OK;
    if (e != cudaErrorNotReady)
      return CUDA_FAIL(c, COLL_ERR_SYSTEM, e, "waiting for %s on GPU %d", what, comm_dev(c));
    if (i < 2000 && !c->oversubscribed) {
      coll_cpu_relax();
      continue;
    }
    if (!start) start = coll_now_ns();
    if (atomic_load_explicit(&c->aborted, memory_order_relaxed))
      return coll_fail(c, COLL_ERR_REMOTE, "rank %d: communicator aborted while waiting for %s",
                       c->rank, what);
    if (c->timeout_ms && coll_now_ns() - start > (uint64_t)c->timeout_ms * 1000000u)
      return coll_fail(c, COLL_ERR_TIMEOUT,
                       "rank %d timed out after %d ms waiting for %s on "
                       "GPU %d",
                       c->rank, c->timeout_ms, what, comm_dev(c));
    sched_yield();
  }
}

static cudaError_t stream_query(void *s) { return cudaStreamQuery((cudaStream_t)s); }
static cudaError_t event_query(void *ev) { return cudaEventQuery((cudaEvent_t)ev); }

coll_result coll_cuda_wait_event(struct coll_comm *comm, void *event, const char *what) {
  return poll_done(comm, event_query, event, what);
}

static coll_result dev_fence(struct coll_comm *c) {
  return poll_done(c, stream_query, c->cuda->stream, "libcoll's CUDA stream");
}

static const coll_mem_ops coll_mem_device = {
    .name = "cuda", .copy = dev_copy, .reduce = dev_reduce, .avg = dev_avg, .fence = dev_fence};

/* ---- the communicator's CUDA state ------------------------------------------------------
 *
 * Lazy.  Creating a communicator makes no CUDA call: a host-only job on a machine with
 * GPUs gets no CUDA context, no device FIFOs and no IPC handles.  The first collective
 * handed device memory sets the device path up, on the executor's thread, before it runs:
 *   1. on the buffers' GPU: a stream, and cuda_ipc's FIFO and handle (setup_local);
 *   2. an all-gather of every rank's cuda_ipc blob over the host path (internal: it
 *      takes no sequence number and no COLL_CHECK);
 *   3. connect to every peer where every pair of ranks can (coll_cuda_select);
 *   4. a second all-gather, of "my device path works": it stays only if every rank's
 *      does, so no rank starts a device collective that a peer refuses;
 *   5. cuda_ipc's ready (unlinks its segment: everyone has mapped it by round 4).
 * Every rank calls the same collectives in the same order, so every rank reaches step 2
 * at the same call — the first one on device memory, which must be on device memory on
 * every rank (as every call of NCCL is).  The communicator's GPU is that call's GPU: a
 * rank that called cudaSetDevice(local rank) before allocating gets its own, whatever
 * was current when the communicator was made. */

coll_result coll_cuda_comm_setup(struct coll_comm *comm) {
  struct coll_cuda_comm *cc = calloc(1, sizeof *cc);
  if (!cc) return coll_fail(comm, COLL_ERR_SYSTEM, "out of memory setting up CUDA");
  cc->device = -1;
  comm->cuda = cc;
  return COLL_OK;
}

/* Step 1.  False with cc->reason when this rank cannot have a device path. */
static bool setup_local(struct coll_comm *comm, int dev, void *blob) {
  struct coll_cuda_comm *cc = comm->cuda;
  memset(blob, 0, COLL_CONN_BLOB);
  cc->device = dev;
  comm->view.cuda_device = dev; /* what cuda_ipc's setup opens its FIFOs on */
  cudaError_t e = cudaSetDevice(dev);
  /* The kernels are built as sm_80 and sm_90 code plus compute_90 PTX (libcoll/meson.build):
   * every 8.x part runs the sm_80 code, 9.0 its own, newer ones JIT the PTX.  Older parts
   * would only fail at the first launch, with cudaErrorNoKernelImageForDevice. */
  int major = 0, minor = 0;
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (e == cudaSuccess && major < 8) {
    snprintf(cc->reason, sizeof cc->reason,
             "rank %d: GPU %d has compute capability %d.%d, but "
             "libcoll's kernels are built for 8.0 and newer (sm_80, sm_90, compute_90 PTX)",
             comm->rank, dev, major, minor);
    return false;
  }
  if (e == cudaSuccess) {
    cudaStream_t s;
    e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e == cudaSuccess) cc->stream = s;
  }
  if (e != cudaSuccess) {
    snprintf(cc->reason, sizeof cc->reason,
             "rank %d: creating a CUDA stream on GPU %d failed: "
             "%s (%s)",
             comm->rank, dev, cudaGetErrorName(e), cudaGetErrorString(e));
    cudaGetLastError();
    return false;
  }
  e = (cudaError_t)coll_cuda_preload_kernels();
  if (e != cudaSuccess) {
    snprintf(cc->reason, sizeof cc->reason,
             "rank %d: loading libcoll's kernels on GPU %d "
             "failed: %s (%s)",
             comm->rank, dev, cudaGetErrorName(e), cudaGetErrorString(e));
    cudaGetLastError();
    return false;
  }
  if (comm->nranks == 1) return true;
  if (coll_transport_cuda_ipc.setup(&comm->view, &cc->ipc_ctx, blob) != COLL_OK) {
    snprintf(cc->reason, sizeof cc->reason, "%s", comm->errbuf);
    memset(blob, 0, COLL_CONN_BLOB);
    return false;
  }
  return true;
}

/* One all-gather of `len` bytes per rank over the host path, as the library's own call. */
static coll_result connect_all(struct coll_comm *comm, const uint8_t *blobs, size_t stride);
static void agree(struct coll_comm *comm, const uint8_t *flags);

static coll_result lazy_setup(struct coll_comm *comm, int dev, coll_device_exchange xchg) {
  struct coll_cuda_comm *cc = comm->cuda;
  int n = comm->nranks;
  if (!coll_cuda_available()) {
    snprintf(cc->reason, sizeof cc->reason, "%s", coll_cuda_unavailable_reason());
    return COLL_OK; /* the caller refuses; the peers, whose buffers are device memory
                       too, saw the same probe fail (or will hear why from COLL_CHECK) */
  }
  uint8_t blob[COLL_CONN_BLOB];
  bool ok = setup_local(comm, dev, blob);
  if (!ok) COLL_WARN(comm->rank, "CUDA: %s", cc->reason);
  if (n > 1) {
    uint8_t *all = malloc((size_t)n * COLL_CONN_BLOB);
    if (!all) return coll_fail(comm, COLL_ERR_SYSTEM, "out of memory setting up the device path");
    coll_result r = xchg(comm, blob, all, COLL_CONN_BLOB);
    if (r == COLL_OK) r = connect_all(comm, all, COLL_CONN_BLOB);
    free(all);
    if (r != COLL_OK) return r;
    uint8_t token = cc->ready ? 1 : 0, *tokens = calloc((size_t)n, 1);
    if (!tokens)
      return coll_fail(comm, COLL_ERR_SYSTEM, "out of memory setting up the device path");
    r = xchg(comm, &token, tokens, 1);
    if (r == COLL_OK) agree(comm, tokens);
    free(tokens);
    if (r != COLL_OK) return r;
    if (cc->ipc_ctx && (r = coll_transport_cuda_ipc.ready(&comm->view, cc->ipc_ctx)) != COLL_OK)
      return r;
    /* The device data path on top (peer.c): every rank reaches this alike. */
    if (cc->ready && (r = coll_cuda_peer_setup(comm, xchg, cc->device, cc->stream)) != COLL_OK)
      return r;
  } else {
    cc->ready = ok;
  }
  if (cc->ready)
    COLL_INFO(comm->rank, "CUDA: device path set up on GPU %d (%s)", cc->device,
              n > 1 ? "cuda_ipc to every peer" : "one rank");
  return COLL_OK;
}

coll_result coll_cuda_comm_lazy(struct coll_comm *comm, const coll_work *w, const char *fn,
                                coll_device_exchange xchg) {
  struct coll_cuda_comm *cc = comm->cuda;
  if (!cc) return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: no CUDA state", comm->rank);
  if (!atomic_load_explicit(&cc->tried, memory_order_acquire)) {
    int old = -1;
    if (cudaGetDevice(&old) != cudaSuccess) old = -1;
    coll_result r = lazy_setup(comm, w->cuda_dev, xchg);
    if (old >= 0) cudaSetDevice(old);
    cudaGetLastError();
    if (!cc->ready && !cc->reason[0])
      snprintf(cc->reason, sizeof cc->reason, "setting it up failed: %.*s",
               (int)sizeof cc->reason - 32, comm->errbuf);
    atomic_store_explicit(&cc->tried, true, memory_order_release);
    if (r != COLL_OK) return r;
  }
  if (w->peer_exchange) return COLL_OK; /* peer.c decides what the call takes */
  if (!cc->ready)
    return coll_fail(comm, COLL_ERR_UNSUPPORTED,
                     "%s on rank %d: the buffers are CUDA device "
                     "memory (GPU %d), but this communicator cannot run a collective on device "
                     "memory: %s",
                     fn, comm->rank, w->cuda_dev, cc->reason);
  if (w->cuda_dev != cc->device)
    return coll_fail(comm, COLL_ERR_INVALID_ARG,
                     "%s on rank %d: the buffers are on GPU %d, but "
                     "this communicator's device path is on GPU %d (set up by its first call "
                     "on device memory)",
                     fn, comm->rank, w->cuda_dev, cc->device);
  return COLL_OK;
}

static coll_result connect_all(struct coll_comm *comm, const uint8_t *blobs, size_t stride) {
  struct coll_cuda_comm *cc = comm->cuda;
  int n = comm->nranks;
  coll_cuda_view *v = calloc((size_t)n, sizeof *v);
  cc->send = calloc((size_t)n, sizeof *cc->send);
  cc->recv = calloc((size_t)n, sizeof *cc->recv);
  if (!v || !cc->send || !cc->recv) {
    free(v);
    return coll_fail(comm, COLL_ERR_SYSTEM, "out of memory connecting cuda_ipc");
  }
  for (int p = 0; p < n; p++) {
    coll_cuda_ipc_blob_view(blobs + (size_t)p * stride, &v[p]);
    v[p].host_id = comm->host_ids[p];
  }
  /* Ready only if every pair of ranks has cuda_ipc: every rank computes the same answer
   * from the same views, so no rank starts a device collective its peers refuse. */
  bool all = true;
  char why[160];
  for (int a = 0; a < n && all; a++)
    for (int b = a + 1; b < n && all; b++)
      if (coll_cuda_select(&v[a], &v[b], why, sizeof why) != COLL_SEL_CUDA_IPC) {
        all = false;
        if (!cc->reason[0])
          snprintf(cc->reason, sizeof cc->reason, "no cuda_ipc between rank %d and rank %d: %s", a,
                   b, why);
      }
  coll_result r = COLL_OK;
  if (all) {
    for (int p = 0; p < n && r == COLL_OK; p++) {
      if (p == comm->rank) continue;
      r = coll_transport_cuda_ipc.connect(&comm->view, cc->ipc_ctx, p, blobs + (size_t)p * stride,
                                          &cc->send[p], &cc->recv[p]);
    }
    for (int p = 0; p < n && r == COLL_OK; p++)
      if (cc->send[p] && (cc->slot_bytes == 0 || cc->send[p]->slot_bytes < cc->slot_bytes))
        cc->slot_bytes = cc->send[p]->slot_bytes;
    cc->ready = r == COLL_OK;
    if (r != COLL_OK) {
      /* A GPU that is there but refuses (cudaIpcOpenMemHandle denied, cudaSetDevice
       * failing): the host path owes it nothing.  The communicator goes on without a
       * device path; the connectors made so far stay with ipc_ctx, which close() frees.
       * Peers whose own connects worked hear of it in lazy_setup's second round. */
      snprintf(cc->reason, sizeof cc->reason, "%s", comm->errbuf);
      for (int p = 0; p < n; p++) cc->send[p] = cc->recv[p] = NULL;
      cc->slot_bytes = 0;
      COLL_WARN(comm->rank,
                "CUDA: %s; going on without the device path (device buffers are "
                "refused)",
                cc->reason);
      r = COLL_OK;
    }
  } else {
    COLL_INFO(comm->rank, "CUDA: %s; device buffers are refused", cc->reason);
  }
  free(v);
  return r;
}

/* Round 4: flags[p] & 1 is rank p's "my device path works". */
static void agree(struct coll_comm *comm, const uint8_t *flags) {
  struct coll_cuda_comm *cc = comm->cuda;
  if (!cc || !cc->ready) return;
  for (int p = 0; p < comm->nranks; p++)
    if (!(flags[p] & 1)) {
      cc->ready = false;
      snprintf(cc->reason, sizeof cc->reason,
               "rank %d has no device path (its log says why), so no rank uses one", p);
      COLL_WARN(comm->rank, "CUDA: %s; device buffers are refused", cc->reason);
      return;
    }
}

void coll_cuda_comm_wake(struct coll_comm *comm) {
  struct coll_cuda_comm *cc = comm->cuda;
  if (!cc) return;
  coll_cuda_peer_poison(comm); /* streams waiting on the device path's flags */
  for (int p = 0; p < comm->nranks; p++) {
    if (cc->send && cc->send[p]) cc->send[p]->t->wake(cc->send[p]);
    if (cc->recv && cc->recv[p]) cc->recv[p]->t->wake(cc->recv[p]);
  }
}

/* Waits until `s` has run everything issued on it, for at most timeout_ms (0: no
 * bound).  Unlike poll_done it ignores the abort flag: what follows frees memory that
 * work on the stream may still touch.  False when the bound ran out. */
static bool drain(cudaStream_t s, int timeout_ms) {
  uint64_t start = coll_now_ns();
  for (;;) {
    cudaError_t e = cudaStreamQuery(s);
    if (e != cudaErrorNotReady) {
      cudaGetLastError();
      return true; /* done, or an error that no waiting will cure */
    }
    if (timeout_ms && coll_now_ns() - start > (uint64_t)timeout_ms * 1000000u) return false;
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
}

void coll_cuda_comm_free(struct coll_comm *comm, coll_comm_end how) {
  struct coll_cuda_comm *cc = comm->cuda;
  if (!cc) return;
  bool drained = true;
  if (cc->stream) {
    cudaSetDevice(cc->device);
    /* libcoll's stream only runs copies and reductions of slices: it never waits for
     * another stream, so this ends in microseconds unless the GPU itself is stuck. */
    drained = drain((cudaStream_t)cc->stream, comm->timeout_ms);
  }
  if (!drained) {
    /* Freeing FIFOs under a running kernel could corrupt what a later allocation gets:
     * leave them (and the stream) to the process's exit. */
    COLL_WARN(comm->rank,
              "CUDA: libcoll's stream on GPU %d did not drain within %d ms; "
              "leaving its FIFO memory allocated",
              cc->device, comm->timeout_ms);
  } else {
    if (cc->ipc_ctx) coll_transport_cuda_ipc.close(&comm->view, cc->ipc_ctx, how);
    if (cc->stream) cudaStreamDestroy((cudaStream_t)cc->stream);
  }
  cudaGetLastError();
  coll_cuda_peer_free(comm);
  free(cc->send);
  free(cc->recv);
  free(cc);
  comm->cuda = NULL;
}

/* ---- streams ------------------------------------------------------------------------------ */

#define TICKET_RING 4096u

typedef CUresult (*wait_value_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

struct coll_cuda_stream {
  cudaStream_t user;
  int device;
  _Atomic uint32_t *flag; /* pinned, mapped: tickets done, contiguously */
  CUdeviceptr flag_dev;
  wait_value_fn wait_value;  /* NULL: use the host-function fallback */
  uint32_t issued;           /* last ticket handed out (under the stream's mutex) */
  uint32_t published;        /* value in *flag */
  uint8_t done[TICKET_RING]; /* done[t % RING]: ticket t finished, not yet published */
};

coll_result coll_cuda_stream_new(struct coll_cuda_stream **out, void *user) {
  cudaStream_t cs = (cudaStream_t)user;
  *out = NULL;
  if (!coll_cuda_available())
    return coll_fail(NULL, COLL_ERR_UNSUPPORTED, "coll_stream_create_cuda: %s",
                     coll_cuda_unavailable_reason());
  struct coll_cuda_stream *x = calloc(1, sizeof *x);
  if (!x) return coll_fail(NULL, COLL_ERR_SYSTEM, "coll_stream_create_cuda: out of memory");
  x->user = cs;
  void *flag = NULL;
  /* The stream's own device (the legacy/per-thread default streams answer with the
   * current one). */
  cudaError_t e = cudaStreamGetDevice(cs, &x->device);
  if (e != cudaSuccess) {
    cudaGetLastError();
    e = cudaGetDevice(&x->device);
  }
  if (e == cudaSuccess) e = cudaHostAlloc(&flag, 64, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) {
    free(x);
    return CUDA_FAIL((struct coll_comm *)NULL, COLL_ERR_SYSTEM, e,
                     "coll_stream_create_cuda: cudaHostAlloc of the completion counter");
  }
  x->flag = flag;
  atomic_store(x->flag, 0);
  void *dptr = NULL;
  e = cudaHostGetDevicePointer(&dptr, flag, 0);
  if (e != cudaSuccess) {
    cudaFreeHost(flag);
    free(x);
    return CUDA_FAIL((struct coll_comm *)NULL, COLL_ERR_SYSTEM, e,
                     "coll_stream_create_cuda: cudaHostGetDevicePointer of the counter");
  }
  x->flag_dev = (CUdeviceptr)(uintptr_t)dptr;
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &q) ==
          cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    x->wait_value = (wait_value_fn)fn;
  cudaGetLastError();
  *out = x;
  return COLL_OK;
}

void coll_cuda_stream_discard(struct coll_cuda_stream *x) {
  if (!x) return;
  cudaFreeHost((void *)x->flag);
  free(x);
}

static bool drain(cudaStream_t s, int timeout_ms);
void *coll_cuda_stream_user(struct coll_stream *s) { return (void *)s->cuda->user; }

bool coll_cuda_peer_wanted(struct coll_comm *comm) {
  struct coll_cuda_comm *cc = comm->cuda;
  if (!cc) return false;
  if (!atomic_load_explicit(&cc->tried, memory_order_acquire)) return true; /* not known yet */
  return cc->ready && comm->peer && comm->peer->ok;
}

coll_result coll_cuda_stream_sync(struct coll_stream *s) {
  struct coll_cuda_stream *x = s->cuda;
  int timeout = coll_env_timeout_ms();
  if (drain(x->user, timeout)) return COLL_OK;
  return coll_fail(NULL, COLL_ERR_TIMEOUT,
                   "coll_stream_synchronize: the cudaStream_t did not "
                   "finish within %d ms (COLL_TIMEOUT_MS)",
                   timeout);
}

bool coll_cuda_stream_idle(struct coll_stream *s) {
  cudaError_t e = cudaStreamQuery(s->cuda->user);
  cudaGetLastError();
  return e != cudaErrorNotReady;
}

void coll_cuda_stream_free(struct coll_stream *s) {
  struct coll_cuda_stream *x = s->cuda;
  if (!x) return;
  /* coll_stream_destroy synchronised first, so every ticket handed out is done; say so
   * once more (a ticket given to a call that failed to enqueue included) so that no wait
   * on the user's stream can be left hanging.  The GPU (or a host callback) may still
   * read the counter until the user's stream has passed our last wait: only then can
   * the pinned page go, and that wait is bounded — on timeout the page stays. */
  pthread_mutex_lock(&s->mu);
  x->published = x->issued;
  atomic_store_explicit(x->flag, x->published, memory_order_release);
  pthread_mutex_unlock(&s->mu);
  int old = -1;
  if (cudaGetDevice(&old) == cudaSuccess && old != x->device) cudaSetDevice(x->device);
  if (drain(x->user, coll_env_timeout_ms()))
    cudaFreeHost((void *)x->flag);
  else
    COLL_WARN(-1, "CUDA: the cudaStream_t of a coll_stream_t did not reach its last wait "
                  "within COLL_TIMEOUT_MS; leaving its completion counter allocated");
  if (old >= 0 && old != x->device) cudaSetDevice(old);
  cudaGetLastError();
  free(x);
  s->cuda = NULL;
}

/* Marks ticket t done and publishes the longest run of done tickets. */
void coll_cuda_ticket_done_locked(struct coll_stream *s, uint32_t t) {
  struct coll_cuda_stream *x = s->cuda;
  if (!x) return;
  x->done[t % TICKET_RING] = 1;
  while (x->done[(x->published + 1) % TICKET_RING]) {
    x->done[(x->published + 1) % TICKET_RING] = 0;
    x->published++;
  }
  atomic_store_explicit(x->flag, x->published, memory_order_release);
  pthread_cond_broadcast(&s->cv);
}

static void ticket_done(struct coll_stream *s, uint32_t t) {
  pthread_mutex_lock(&s->mu);
  coll_cuda_ticket_done_locked(s, t);
  pthread_mutex_unlock(&s->mu);
}

typedef struct {
  struct coll_cuda_stream *x;
  uint32_t ticket;
  int timeout_ms; /* the communicator's: 0 waits without a bound */
} host_wait_arg;

/* The fallback: runs on a driver thread once the stream reaches it; may not call CUDA.
 * The ticket is published when its collective ends in any way (failed and aborted ones
 * too), and a collective's own waits are bounded by the same timeout, so the bound here
 * (twice it) only guards against a collective that never ran at all. */
static void host_wait(void *p) {
  host_wait_arg *a = p;
  uint64_t start = coll_now_ns(), limit = (uint64_t)a->timeout_ms * 2000000u;
  while ((int32_t)(atomic_load_explicit(a->x->flag, memory_order_acquire) - a->ticket) < 0) {
    if (limit && coll_now_ns() - start > limit) break;
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
  free(a);
}

/* ---- per collective ---------------------------------------------------------------------- */

/* A new event recorded on stream `s` of GPU `dev` (the event must belong to the stream's
 * device); the caller's current device is put back afterwards. */
static cudaError_t record_event(int dev, cudaStream_t s, cudaEvent_t *out) {
  int old = -1;
  cudaError_t e = cudaGetDevice(&old);
  if (e == cudaSuccess && old != dev) e = cudaSetDevice(dev);
  cudaEvent_t ev = NULL;
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) {
    e = cudaEventRecord(ev, s);
    if (e != cudaSuccess) cudaEventDestroy(ev);
  }
  if (old >= 0 && old != dev) cudaSetDevice(old);
  if (e == cudaSuccess) *out = ev;
  return e;
}

coll_result coll_cuda_prepare(struct coll_comm *comm, const char *fn, coll_work *w) {
  w->device = false;
  w->cuda_event = NULL;
  w->cuda_ticket = 0;
  struct coll_cuda_stream *x = w->stream ? w->stream->cuda : NULL;
  bool moves = w->count > 0 || (w->coll == COLL_COLL_SENDRECV && w->recv_count > 0);
  w->cuda_dev = -1;
  /* A process that never loaded the CUDA driver has no device memory: no query at all. */
  if (moves && w->coll != COLL_COLL_BARRIER && coll_cuda_driver_loaded()) {
    int sd, rd;
    coll_mem_kind sk = coll_cuda_classify(w->sendbuf, &sd);
    coll_mem_kind rk = sk;
    rd = sd;
    if (w->recvbuf != w->sendbuf) rk = coll_cuda_classify(w->recvbuf, &rd); /* in place: once */
    struct coll_cuda_comm *cc = comm->cuda;
    bool tried = cc && atomic_load_explicit(&cc->tried, memory_order_acquire);
    /* Before the first device call the path is not set up: it will be, on this GPU. */
    const char *why = !cc ? "CUDA was not set up" : !tried || cc->ready ? NULL : cc->reason;
    int dev = sk == COLL_MEM_DEVICE ? sd : rd;
    coll_result r = coll_cuda_check_kinds(comm, fn, sk, sd, rk, rd, tried ? cc->device : dev, why);
    if (r != COLL_OK) return r;
    w->device = sk == COLL_MEM_DEVICE || rk == COLL_MEM_DEVICE;
    if (w->device) w->cuda_dev = dev;
  }
  /* The device data path (peer.c) may serve the five collectives on device buffers of
   * a communicator of several ranks, blocking or on a cudaStream_t: api.c asks it first,
   * and comes back to coll_cuda_prepare_stream where it does not. */
  bool five = w->coll == COLL_COLL_ALL_REDUCE || w->coll == COLL_COLL_BROADCAST ||
              w->coll == COLL_COLL_REDUCE || w->coll == COLL_COLL_REDUCE_SCATTER ||
              w->coll == COLL_COLL_ALL_GATHER;
  w->peer_candidate = w->device && comm->nranks > 1 && (!w->stream || x) && five;
  /* On a coll_stream_t the progress thread asks it when the call's turn comes (exec/
   * executor.c), after the event on the legacy default stream recorded below. */
  w->peer_queued = w->device && comm->nranks > 1 && w->stream && !x && !w->group && five;
  if (w->peer_candidate) return COLL_OK;
  return coll_cuda_prepare_stream(comm, fn, w);
}

coll_result coll_cuda_prepare_stream(struct coll_comm *comm, const char *fn, coll_work *w) {
  struct coll_cuda_stream *x = w->stream ? w->stream->cuda : NULL;
  if (!x && w->device) {
    /* A call without a cudaStream_t starts after what the caller enqueued before it on
     * the legacy default stream, as NCCL's calls on stream 0 do: a cudaMemcpy from
     * pageable memory may return before its DMA lands, and libcoll's stream, being
     * non-blocking, would not wait for it.  (The likely cause of the first GPU run's
     * in-place reduce_scatter results made of bytes from before the upload; not yet
     * confirmed on a GPU.)  Recorded here, in the caller's thread, so that work enqueued
     * after the call is not waited for; exec_begin waits for the event. */
    cudaEvent_t ev = NULL;
    cudaError_t e = record_event(w->cuda_dev, cudaStreamLegacy, &ev);
    if (e != cudaSuccess)
      return CUDA_FAIL(comm, COLL_ERR_SYSTEM, e, "%s: recording an event on the default stream",
                       fn);
    w->cuda_event = ev;
    return COLL_OK;
  }
  if (!x) return COLL_OK;
  cudaEvent_t ev = NULL;
  cudaError_t e = record_event(x->device, x->user, &ev);
  if (e != cudaSuccess)
    return CUDA_FAIL(comm, COLL_ERR_SYSTEM, e, "%s: recording an event on the cudaStream_t", fn);
  w->cuda_event = ev;
  /* A ticket; wait while the ring holds TICKET_RING unfinished ones (the queue of a
   * communicator holds far fewer, so this only waits with several communicators). */
  pthread_mutex_lock(&w->stream->mu);
  while (x->issued + 1 - x->published >= TICKET_RING)
    pthread_cond_wait(&w->stream->cv, &w->stream->mu);
  w->cuda_ticket = ++x->issued;
  pthread_mutex_unlock(&w->stream->mu);
  return COLL_OK;
}

coll_result coll_cuda_after_submit(struct coll_comm *comm, coll_work *w, coll_result r) {
  struct coll_cuda_stream *x = w->stream ? w->stream->cuda : NULL;
  if (!x) { /* prepare gave every work on a cudaStream_t a ticket (0 after a wrap) */
    if (r != COLL_OK && w->cuda_event) { /* a blocking device call's event, not enqueued */
      cudaEventDestroy((cudaEvent_t)w->cuda_event);
      w->cuda_event = NULL;
    }
    return r;
  }
  if (r != COLL_OK) {
    /* Not enqueued: nothing will finish it. */
    ticket_done(w->stream, w->cuda_ticket);
    if (w->cuda_event) cudaEventDestroy((cudaEvent_t)w->cuda_event);
    return r;
  }
  if (x->wait_value) {
    CUresult cr = x->wait_value((CUstream)x->user, x->flag_dev, w->cuda_ticket,
                                CU_STREAM_WAIT_VALUE_GEQ);
    if (cr == CUDA_SUCCESS) return COLL_OK;
    COLL_INFO(comm->rank,
              "cuStreamWaitValue32 refused (CUresult %d): ordering the cudaStream_t "
              "with cudaLaunchHostFunc from now on",
              (int)cr);
    x->wait_value = NULL; /* not supported here: use the fallback from now on */
  }
  host_wait_arg *a = malloc(sizeof *a);
  if (!a)
    return coll_fail(comm, COLL_ERR_SYSTEM, "rank %d: out of memory ordering the cudaStream_t",
                     comm->rank);
  a->x = x;
  a->ticket = w->cuda_ticket;
  a->timeout_ms = comm->timeout_ms;
  cudaError_t e = cudaLaunchHostFunc(x->user, host_wait, a);
  if (e != cudaSuccess) {
    free(a);
    return CUDA_FAIL(comm, COLL_ERR_SYSTEM, e,
                     "cudaLaunchHostFunc (making the cudaStream_t wait for the collective)");
  }
  return COLL_OK;
}

/* The device current on this thread before a collective, restored after it: a blocking
 * call runs on the caller's thread, whose current device is the caller's business. */
static _Thread_local int saved_device = -1;

coll_result coll_cuda_exec_begin(struct coll_comm *comm, const coll_work *w,
                                 const coll_mem_ops **ops, coll_conn ***send, coll_conn ***recv,
                                 size_t *slot_bytes) {
  struct coll_cuda_comm *cc = comm->cuda;
  int dev = w->device && cc                ? cc->device
            : w->stream && w->stream->cuda ? w->stream->cuda->device
                                           : -1;
  saved_device = -1;
  if (dev >= 0) {
    cudaError_t e = cudaGetDevice(&saved_device);
    if (e == cudaSuccess && saved_device != dev) e = cudaSetDevice(dev);
    if (e != cudaSuccess) {
      saved_device = -1;
      return CUDA_FAIL(comm, COLL_ERR_SYSTEM, e, "cudaSetDevice(%d)", dev);
    }
  }
  if (w->cuda_event) {
    char what[96];
    snprintf(what, sizeof what, "the work before %s #%llu on %s", coll_coll_name(w->coll),
             (unsigned long long)w->seq,
             w->stream && w->stream->cuda ? "its cudaStream_t" : "the default stream");
    coll_result r = poll_done(comm, event_query, w->cuda_event, what);
    if (r != COLL_OK) return r;
  }
  if (!w->device) return COLL_OK;
  if (!cc || !cc->ready)
    return coll_fail(comm, COLL_ERR_INTERNAL,
                     "rank %d: %s #%llu on device memory reached the "
                     "executor without a device path",
                     comm->rank, coll_coll_name(w->coll), (unsigned long long)w->seq);
  *ops = &coll_mem_device;
  if (comm->nranks > 1) {
    *send = cc->send;
    *recv = cc->recv;
    *slot_bytes = cc->slot_bytes;
  }
  return COLL_OK;
}

coll_result coll_cuda_exec_end(struct coll_comm *comm, const coll_work *w, coll_result r) {
  if (w->device && comm->cuda && comm->cuda->stream) {
    coll_result f = dev_fence(comm);
    if (r == COLL_OK) r = f;
  }
  if (saved_device >= 0) {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != saved_device) cudaSetDevice(saved_device);
    cudaGetLastError();
    saved_device = -1;
  }
  return r;
}

void coll_cuda_work_done(coll_work *w) {
  if (w->cuda_event) {
    cudaEventDestroy((cudaEvent_t)w->cuda_event);
    w->cuda_event = NULL;
  }
}

#else
/* ======================================================================================
 * Without CUDA: what the tests and the pure parts ask, saying so.  The device table is
 * the host one then (device_cuda.c answers NULL, comm.c takes kernels/device_host.c),
 * so nothing of the per-communicator and per-call code above is needed.
 * ====================================================================================== */

bool coll_cuda_built(void) { return false; }
bool coll_cuda_available(void) { return false; }
const char *coll_cuda_unavailable_reason(void) {
  return "this build of libcoll has no CUDA support (nvcc was not found when it was configured)";
}
coll_mem_kind coll_cuda_classify(const void *p, int *device) {
  *device = -1;
  return p ? COLL_MEM_HOST : COLL_MEM_NONE;
}
bool coll_cuda_probed(void) { return false; }
#endif
