/*
 * backend_nccl.c — the training backend over NVIDIA NCCL, for the GPU model path
 * (coll-train --device cuda --parallel ddp --backend nccl). Built when the CUDA toolkit
 * and NCCL are found (backend_nccl_stub.c otherwise).
 *
 * Bootstrap: rank 0's ncclGetUniqueId travels to the other ranks over a libcoll
 * communicator — the one coll_launch_local's fork or the launcher's environment
 * (torchrun, Slurm, mpirun variables) already gives every rank — which is kept for nothing
 * else. Each rank uses GPU (local rank mod devices).
 *
 * Requests: every operation goes on one CUDA stream created non-blocking, so it never
 * waits for, nor holds up, the model's kernels on the legacy default stream.  A bucket's
 * gradients are final once the compute stream passes the mark the model takes before it
 * calls DDP's hook: order_after makes this stream wait for that mark on the device
 * (cudaStreamWaitEvent), so neither the host nor the compute stream waits. A request is a CUDA
 * event recorded after its operation; operations on one stream run in call order, so requests
 * complete in order, as backend.h promises. Host buffers (the loss, weight hashes, the start-up
 * parameter broadcast, trace gathers) go through a per-request device staging buffer: copied in at
 * launch, copied out when the request is found complete. Device buffers (the gradients) are reduced
 * in place.
 *
 * Faults: NCCL waits forever for a dead peer, so wait polls the event and
 * ncclCommGetAsyncError and gives up after COLL_TIMEOUT_MS (libcoll's knob, default
 * 600000), naming the operation; abort is ncclCommAbort. It must never print or exit.
 */
#include "comm/backend.h"
#include "base/util.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct nccl_req {
  int busy;
  cudaEvent_t ev;
  const char *what;
  void *stage; /* device staging buffer of this slot (grows, kept) */
  size_t stage_cap;
  void *host_out; /* copy stage + out_off .. + out_bytes here on completion */
  size_t out_off, out_bytes;
} nccl_req;

typedef struct nccl_impl {
  ncclComm_t nccl;
  coll_comm_t boot; /* the libcoll communicator that carried the unique id */
  int own_boot;
  cudaStream_t stream;
  float *one; /* device float for the barrier */
  long timeout_ms;
  nccl_req req[TRAIN_BACKEND_MAX_REQS];
  int next;
} nccl_impl;

static int fail_cuda(train_backend *b, const char *what, cudaError_t e) {
  train_errf(b->err, "rank %d: NCCL backend: %s: CUDA error: %s", b->rank, what,
             cudaGetErrorString(e));
  return -1;
}

static int fail_nccl(train_backend *b, const char *what, ncclResult_t r) {
  nccl_impl *p = b->impl;
  const char *last = p && p->nccl ? ncclGetLastError(p->nccl) : NULL;
  train_errf(b->err, "rank %d: NCCL %s failed: %s%s%s", b->rank, what, ncclGetErrorString(r),
             last && *last ? ": " : "", last && *last ? last : "");
  return -1;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 1 when p is device (or managed) memory NCCL can use directly. */
static int on_device(const void *p) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError(); /* plain host memory on old runtimes: clear the error */
    return 0;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* The request just completed: copy its staged output back to the host. */
static int finish(train_backend *b, int s) {
  nccl_impl *p = b->impl;
  nccl_req *q = &p->req[s];
  q->busy = 0;
  if (!q->host_out) return 0;
  cudaError_t e = cudaMemcpy(q->host_out, (char *)q->stage + q->out_off, q->out_bytes,
                             cudaMemcpyDeviceToHost);
  q->host_out = NULL;
  return e == cudaSuccess ? 0 : fail_cuda(b, q->what, e);
}

static int nc_test(train_backend *b, train_req r) {
  nccl_impl *p = b->impl;
  if (r == TRAIN_REQ_DONE || !p->req[r].busy) return 1;
  cudaError_t e = cudaEventQuery(p->req[r].ev);
  if (e == cudaErrorNotReady) {
    ncclResult_t ae = ncclSuccess;
    if (ncclCommGetAsyncError(p->nccl, &ae) == ncclSuccess && ae != ncclSuccess &&
        ae != ncclInProgress) {
      p->req[r].busy = 0;
      return fail_nccl(b, p->req[r].what, ae);
    }
    return 0;
  }
  if (e != cudaSuccess) {
    p->req[r].busy = 0;
    return fail_cuda(b, p->req[r].what, e);
  }
  return finish(b, r) == 0 ? 1 : -1;
}

static int nc_wait(train_backend *b, train_req r) {
  nccl_impl *p = b->impl;
  if (r == TRAIN_REQ_DONE || !p->req[r].busy) return 0;
  double deadline = now_s() + p->timeout_ms / 1e3;
  for (unsigned spins = 0;; spins++) {
    int t = nc_test(b, r);
    if (t != 0) return t > 0 ? 0 : -1;
    if (now_s() > deadline) {
      train_errf(b->err,
                 "rank %d: NCCL %s did not complete within COLL_TIMEOUT_MS = %ld ms "
                 "(a peer died or stalled?)",
                 b->rank, p->req[r].what, p->timeout_ms);
      return -1;
    }
    if (spins > 1000) { /* nothing to do but wait: let the other ranks' threads run */
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    }
  }
}

/* A free slot for the next request (waiting for the oldest one if all are taken), with
 * a staging buffer of at least `stage_bytes` when that is not 0. */
static int take_slot(train_backend *b, const char *what, size_t stage_bytes, int *slot) {
  nccl_impl *p = b->impl;
  int s = p->next;
  nccl_req *q = &p->req[s];
  if (q->busy && nc_wait(b, s) != 0) return -1;
  cudaError_t e;
  if (!q->ev && (e = cudaEventCreateWithFlags(&q->ev, cudaEventDisableTiming)) != cudaSuccess)
    return fail_cuda(b, "cudaEventCreate", e);
  if (stage_bytes > q->stage_cap) {
    if (q->stage) cudaFree(q->stage);
    q->stage = NULL;
    q->stage_cap = 0;
    if ((e = cudaMalloc(&q->stage, stage_bytes)) != cudaSuccess) {
      cudaGetLastError();
      return fail_cuda(b, "staging buffer", e);
    }
    q->stage_cap = stage_bytes;
  }
  p->next = (s + 1) % TRAIN_BACKEND_MAX_REQS;
  q->what = what;
  q->host_out = NULL;
  *slot = s;
  return 0;
}

/* Device pointers for an operation reading in_bytes at `in` and writing out_bytes at
 * `out` (the same pointer for in-place): host sides are staged in the slot's buffer
 * (input at 0, output after it unless in-place). Copies the input in, on the stream. */
static int stage(train_backend *b, const char *what, const void *in, size_t in_bytes, void *out,
                 size_t out_bytes, const void **din, void **dout, int *slot) {
  nccl_impl *p = b->impl;
  int in_dev = in_bytes == 0 || on_device(in), out_dev = out_bytes == 0 || on_device(out);
  int inplace = in == out;
  size_t need = 0, out_off = 0;
  if (!in_dev) need = in_bytes;
  if (!out_dev) {
    out_off = inplace ? 0 : (need + 255) / 256 * 256;
    need = out_off + out_bytes > need ? out_off + out_bytes : need;
  }
  if (take_slot(b, what, need, slot) != 0) return -1;
  nccl_req *q = &p->req[*slot];
  *din = in;
  *dout = out;
  if (!in_dev) {
    cudaError_t e = cudaMemcpyAsync(q->stage, in, in_bytes, cudaMemcpyHostToDevice, p->stream);
    if (e != cudaSuccess) return fail_cuda(b, what, e);
    *din = q->stage;
    if (inplace) *dout = q->stage;
  }
  if (!out_dev) {
    *dout = (char *)q->stage + out_off;
    q->host_out = out;
    q->out_off = out_off;
    q->out_bytes = out_bytes;
  }
  return 0;
}

static int launched(train_backend *b, int s, ncclResult_t r, train_req *req) {
  nccl_impl *p = b->impl;
  nccl_req *q = &p->req[s];
  if (r != ncclSuccess) {
    q->host_out = NULL;
    return fail_nccl(b, q->what, r);
  }
  cudaError_t e = cudaEventRecord(q->ev, p->stream);
  if (e != cudaSuccess) {
    q->host_out = NULL;
    return fail_cuda(b, q->what, e);
  }
  q->busy = 1;
  *req = s;
  return 0;
}

static ncclRedOp_t red(train_reduce op) { return op == TRAIN_REDUCE_AVG ? ncclAvg : ncclSum; }

static int nc_all_reduce(train_backend *b, float *buf, size_t count, train_reduce op,
                         train_req *req) {
  nccl_impl *p = b->impl;
  const void *in;
  void *out;
  int s;
  if (stage(b, "all_reduce", buf, count * 4, buf, count * 4, &in, &out, &s) != 0) return -1;
  return launched(b, s, ncclAllReduce(in, out, count, ncclFloat32, red(op), p->nccl, p->stream),
                  req);
}

static int nc_reduce_scatter(train_backend *b, const float *send, float *recv, size_t recvcount,
                             train_reduce op, train_req *req) {
  nccl_impl *p = b->impl;
  const void *in;
  void *out;
  int s;
  size_t n = (size_t)b->nranks * recvcount;
  if (stage(b, "reduce_scatter", send, n * 4, recv, recvcount * 4, &in, &out, &s) != 0) return -1;
  return launched(b, s,
                  ncclReduceScatter(in, out, recvcount, ncclFloat32, red(op), p->nccl, p->stream),
                  req);
}

static int nc_all_gather(train_backend *b, const void *send, void *recv, size_t bytes,
                         train_req *req) {
  nccl_impl *p = b->impl;
  const void *in;
  void *out;
  int s;
  if (stage(b, "all_gather", send, bytes, recv, (size_t)b->nranks * bytes, &in, &out, &s) != 0)
    return -1;
  return launched(b, s, ncclAllGather(in, out, bytes, ncclUint8, p->nccl, p->stream), req);
}

static int nc_broadcast(train_backend *b, void *buf, size_t bytes, int root, train_req *req) {
  nccl_impl *p = b->impl;
  const void *in;
  void *out;
  int s;
  if (stage(b, "broadcast", buf, bytes, buf, bytes, &in, &out, &s) != 0) return -1;
  return launched(b, s, ncclBroadcast(in, out, bytes, ncclUint8, root, p->nccl, p->stream), req);
}

/* The next operations wait on the device for the model's mark: no host block, and the
 * compute stream is not held up either (it is the communication stream that waits). */
static int nc_order_after(train_backend *b, void *event) {
  nccl_impl *p = b->impl;
  cudaError_t e = cudaStreamWaitEvent(p->stream, (cudaEvent_t)event, 0);
  return e == cudaSuccess ? 0 : fail_cuda(b, "ordering the communication stream after backward", e);
}

static int nc_barrier(train_backend *b) {
  nccl_impl *p = b->impl;
  train_req r;
  if (nc_all_reduce(b, p->one, 1, TRAIN_REDUCE_SUM, &r) != 0) return -1;
  p->req[r].what = "barrier";
  return nc_wait(b, r);
}

static void release(train_backend *b) {
  nccl_impl *p = b->impl;
  for (int i = 0; i < TRAIN_BACKEND_MAX_REQS; i++) {
    if (p->req[i].ev) cudaEventDestroy(p->req[i].ev);
    if (p->req[i].stage) cudaFree(p->req[i].stage);
  }
  if (p->one) cudaFree(p->one);
  if (p->stream) cudaStreamDestroy(p->stream);
  if (p->own_boot && p->boot) coll_comm_destroy(p->boot);
  free(p);
  free(b);
}

static int nc_destroy(train_backend *b) {
  nccl_impl *p = b->impl;
  int rc = 0;
  for (int i = 0; i < TRAIN_BACKEND_MAX_REQS; i++)
    if (p->req[i].busy && nc_wait(b, i) != 0) rc = -1;
  if (rc == 0 && ncclCommDestroy(p->nccl) != ncclSuccess)
    rc = -1;
  else if (rc != 0)
    ncclCommAbort(p->nccl);
  release(b);
  return rc;
}

static void nc_abort(train_backend *b) {
  nccl_impl *p = b->impl;
  if (p->nccl) ncclCommAbort(p->nccl); /* fails what is in flight; the stream can then drain */
  if (p->boot) coll_comm_abort(p->boot);
  p->own_boot = 0; /* aborted: leave it, as backend_coll does */
  release(b);
}


int train_backend_nccl_built(void) { return 1; }

int train_nccl_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

train_backend *train_backend_nccl(coll_comm_t boot, int own, char *err) {
  int rank = 0, nranks = 1;
  if (coll_comm_rank(boot, &rank) != COLL_OK || coll_comm_size(boot, &nranks) != COLL_OK) {
    train_errf(err, "NCCL backend: %s", coll_comm_last_error(boot));
    return NULL;
  }
  /* every rank checks for a GPU before the first collective, so on a machine without
   * one all of them stop here, saying so, and none waits for the others */
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    train_errf(err, "rank %d: --backend nccl: no usable CUDA GPU (%s)", rank,
               e == cudaErrorInsufficientDriver
                   ? "no NVIDIA driver, or one older than this CUDA runtime"
               : e != cudaSuccess ? cudaGetErrorString(e)
                                  : "no devices");
    return NULL;
  }
  int dev = train_local_rank(rank) % ndev; /* coll_launch_local: every rank is local */
  if ((e = cudaSetDevice(dev)) != cudaSuccess) {
    train_errf(err, "rank %d: --backend nccl: cudaSetDevice(%d): %s", rank, dev,
               cudaGetErrorString(e));
    return NULL;
  }

  /* rank 0's unique id, over libcoll; a failure on rank 0 travels with it */
  struct {
    int32_t ok;
    ncclUniqueId id;
  } msg;
  memset(&msg, 0, sizeof msg);
  ncclResult_t nr = ncclSuccess;
  if (rank == 0) {
    nr = ncclGetUniqueId(&msg.id);
    msg.ok = nr == ncclSuccess;
  }
  if (coll_broadcast(&msg, &msg, sizeof msg, COLL_UINT8, 0, boot, NULL) != COLL_OK) {
    train_errf(err, "rank %d: NCCL backend: sending the NCCL unique id: %s", rank,
               coll_comm_last_error(boot));
    return NULL;
  }
  if (!msg.ok) {
    train_errf(err, "rank %d: NCCL backend: rank 0 could not create an NCCL unique id%s%s", rank,
               rank == 0 ? ": " : "", rank == 0 ? ncclGetErrorString(nr) : "");
    return NULL;
  }

  train_backend *b = calloc(1, sizeof *b);
  nccl_impl *p = calloc(1, sizeof *p);
  if (!b || !p) {
    free(b);
    free(p);
    train_errf(err, "out of memory for the NCCL backend");
    return NULL;
  }
  b->impl = p;
  b->name = "nccl";
  b->rank = rank;
  b->nranks = nranks;
  p->boot = boot;
  p->own_boot = own;
  const char *t = getenv("COLL_TIMEOUT_MS");
  p->timeout_ms = t && atol(t) > 0 ? atol(t) : 600000;

  if ((e = cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking)) != cudaSuccess ||
      (e = cudaMalloc((void **)&p->one, sizeof(float))) != cudaSuccess ||
      (e = cudaMemset(p->one, 0, sizeof(float))) != cudaSuccess) {
    train_errf(err, "rank %d: NCCL backend on GPU %d: %s", rank, dev, cudaGetErrorString(e));
    p->own_boot = 0; /* the caller still owns it on failure */
    release(b);
    return NULL;
  }
  nr = ncclCommInitRank(&p->nccl, nranks, msg.id, rank);
  if (nr != ncclSuccess) {
    train_errf(err, "rank %d: ncclCommInitRank (%d ranks, GPU %d) failed: %s", rank, nranks, dev,
               ncclGetErrorString(nr));
    p->nccl = NULL;
    p->own_boot = 0;
    release(b);
    return NULL;
  }
  b->all_reduce = nc_all_reduce;
  b->reduce_scatter = nc_reduce_scatter;
  b->all_gather = nc_all_gather;
  b->broadcast = nc_broadcast;
  b->barrier = nc_barrier;
  b->order_after = nc_order_after;
  b->test = nc_test;
  b->wait = nc_wait;
  b->destroy = nc_destroy;
  b->abort = nc_abort;
  return b;
}
