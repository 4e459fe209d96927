/* peer.c — the device data path: collectives whose bytes move in GPU kernels that read
 * the other ranks' buffers directly (CUDA IPC), ordered on the caller's cudaStream_t.
 *
 * The path of one call (exec/submit.c drives it through the device table, comm->dev,
 * whose peer hooks device_cuda.c points here, and does step 2; algo/device.c holds the
 * schedules):
 *   1. describe: each rank names its send and receive buffers as (allocation id, offset,
 *      IPC handle) — cuPointerGetAttributes and cudaIpcGetMemHandle, cached per
 *      allocation;
 *   2. exchange: one all-gather of those descriptors over the host path (a few hundred
 *      bytes through shm).  It carries the call's shape too, so a mismatch between
 *      ranks is found here, as COLL_CHECK would.  This is the one host rendezvous of
 *      the path: a call on a stream returns once every rank has made it, not earlier;
 *   3. import: every peer's buffers are opened (cudaIpcOpenMemHandle, cached per
 *      process and allocation), so this rank holds a pointer to every rank's buffers;
 *   4. enqueue (algo/device.c, through coll_dev_barrier / _reduce / _copy below): on the
 *      caller's stream, barriers and one or two kernels (a coll_stream_t's work, which
 *      the progress thread serves: on the communicator's own stream, after the caller's
 *      legacy default stream as it was at the call);
 *   5. a blocking call (NULL stream) waits, bounded, for the legacy default stream, and
 *      a coll_stream_t's work for the communicator's stream.
 *
 * Barriers without a thread and without an SM.  A barrier is stream memory operations
 * (cuStreamBatchMemOp): each rank writes its epoch into a flag of every peer, then waits
 * until each of its own flags holds at least that epoch.  The flags live in one page of
 * host shared memory, mapped into every rank's GPU address space (cudaHostRegister), so
 * the waits sit in the GPU's front end — no kernel spins, no host thread polls.  That
 * matters when ranks share one GPU: their kernels time-slice, and a kernel spinning for
 * another process's kernel could wait out its whole slice.  It also lets the host end
 * every wait at once (abort, a dead peer): coll_cuda_peer_poison writes the flags.
 *
 *   flags[dst][src]  written by src's stream, waited on by dst's; epochs only grow, and
 *                    a wait is "flag - epoch >= 0" in 32-bit arithmetic (wraps safely).
 *
 * Why a barrier before and after: before, so nobody reads a peer's input before the
 * peer's stream has produced it; after, so nobody returns (and lets its caller reuse its
 * buffers) while a peer still reads them.
 *
 * Must never: open the same allocation twice in one process (CUDA refuses), close a
 * mapping that enqueued work may still read (mappings live until the process ends),
 * block without a bound, or print; every failure is a coll_fail sentence.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "coll_config.h"
#include "peer.h"
#include "shm.h"

#define DESC_MAGIC 0x44455650u /* "PVED" */

/* One rank's buffer as its peers need it. */
typedef struct {
  uint64_t id;              /* CU_POINTER_ATTRIBUTE_BUFFER_ID: unique per allocation in a process */
  uint64_t offset;          /* of the buffer in its allocation */
  unsigned char handle[64]; /* cudaIpcMemHandle_t of the allocation */
} peer_buf;

/* What every rank says about a call (the exchange of step 2). */
typedef struct {
  uint32_t magic;
  uint8_t coll, dtype, op, ok; /* ok: both buffers can be shared */
  int32_t root;
  int32_t pid;
  uint64_t count;
  peer_buf buf[2]; /* send, recv (id 0: NULL) */
} peer_desc;
_Static_assert(sizeof(peer_desc) <= COLL_PEER_DESC_BYTES, "a descriptor fits its slot");

/* Rank p's descriptor in the exchanged array, whose slots are COLL_PEER_DESC_BYTES long,
 * not sizeof(peer_desc) (184): indexed as a peer_desc array, every peer's descriptor was
 * read 8 bytes per rank too early (the first GPU run of the path, 2026-11-30). */
static inline const peer_desc *desc_at(const void *descs, int p) {
  return (const peer_desc *)((const uint8_t *)descs + (size_t)p * COLL_PEER_DESC_BYTES);
}

#if COLL_HAVE_CUDA
#include <cuda.h> /* driver API types only: libcoll never links libcuda */
#include <cuda_runtime_api.h>

#include "peer_kernels.h"

typedef CUresult (*batch_fn)(CUstream, unsigned int, CUstreamBatchMemOpParams *, unsigned int);
typedef CUresult (*attrs_fn)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);

static pthread_once_t entry_once = PTHREAD_ONCE_INIT;
static batch_fn batch_memop;
static attrs_fn ptr_attrs;

static void *entry(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    fn = NULL;
  cudaGetLastError();
  return fn;
}
static void load_entries(void) {
  batch_memop = (batch_fn)entry("cuStreamBatchMemOp");
  ptr_attrs = (attrs_fn)entry("cuPointerGetAttributes");
}

/* ---- the process-wide caches ------------------------------------------------------------
 * Exported: my allocations' handles, by allocation id.  Imported: peers' allocations
 * opened here, by (pid, allocation id).  A caching allocator (PyTorch's) hands out the
 * same few segments again and again, so both stay small; past CACHE_MAX entries a call
 * falls back to the host-driven path instead of growing them further. */
#define CACHE_MAX 4096
typedef struct {
  uint64_t id;
  int32_t pid;
  void *base;
  unsigned char handle[64];
} cache_ent;
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static cache_ent *exported, *imported;
static size_t nexported, nimported;

static cache_ent *cache_find(cache_ent *v, size_t n, int32_t pid, uint64_t id) {
  for (size_t i = n; i-- > 0;) /* newest first: the buffers of the running loop */
    if (v[i].id == id && v[i].pid == pid) return &v[i];
  return NULL;
}
static cache_ent *cache_add(cache_ent **v, size_t *n) {
  if (*n >= CACHE_MAX) return NULL;
  if (!*v && !(*v = calloc(CACHE_MAX, sizeof **v))) return NULL;
  return &(*v)[(*n)++];
}

/* Step 1 for one buffer: false (with the reason) when it cannot be shared. */
static bool describe(const void *p, peer_buf *b, char *why, size_t why_len) {
  memset(b, 0, sizeof *b);
  if (!p) return true;
  CUdeviceptr start = 0;
  unsigned long long id = 0;
  int legacy = 0;
  CUpointer_attribute at[3] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                               CU_POINTER_ATTRIBUTE_BUFFER_ID,
                               CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
  void *data[3] = {&start, &id, &legacy};
  CUresult cr = ptr_attrs(3, at, data, (CUdeviceptr)(uintptr_t)p);
  if (cr != CUDA_SUCCESS) {
    snprintf(why, why_len, "cuPointerGetAttributes failed (CUresult %d)", (int)cr);
    return false;
  }
  if (!legacy) {
    snprintf(why, why_len,
             "the buffer is not shareable with cudaIpcGetMemHandle (memory from "
             "cudaMallocAsync pools or cuMemCreate)");
    return false;
  }
  b->id = id;
  b->offset = (uint64_t)((uintptr_t)p - (uintptr_t)start);
  pthread_mutex_lock(&cache_mu);
  cache_ent *e = cache_find(exported, nexported, 0, id);
  bool ok = true;
  if (!e) {
    cudaIpcMemHandle_t h;
    cudaError_t err = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)start);
    if (err != cudaSuccess) {
      snprintf(why, why_len, "cudaIpcGetMemHandle: %s", cudaGetErrorName(err));
      cudaGetLastError();
      ok = false;
    } else if (!(e = cache_add(&exported, &nexported))) {
      snprintf(why, why_len, "%d allocations already exported", CACHE_MAX);
      ok = false;
    } else {
      e->id = id;
      e->pid = 0;
      e->base = (void *)(uintptr_t)start;
      memcpy(e->handle, &h, sizeof h);
    }
  }
  if (ok) memcpy(b->handle, e->handle, sizeof b->handle);
  pthread_mutex_unlock(&cache_mu);
  return ok;
}

/* Step 3 for one peer buffer: its address in this process. */
static coll_result import(struct coll_comm *comm, int peer, int32_t pid, const peer_buf *b,
                          void **out) {
  *out = NULL;
  if (!b->id) return COLL_OK;
  pthread_mutex_lock(&cache_mu);
  cache_ent *e = cache_find(imported, nimported, pid, b->id);
  coll_result r = COLL_OK;
  if (!e) {
    cudaIpcMemHandle_t h;
    memcpy(&h, b->handle, sizeof h);
    void *base = NULL;
    cudaError_t err = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      cudaGetLastError();
      r = coll_fail(comm, COLL_ERR_SYSTEM,
                    "rank %d: opening rank %d's buffer (cudaIpcOpenMemHandle) "
                    "failed: %s (%s)",
                    comm->rank, peer, cudaGetErrorName(err), cudaGetErrorString(err));
    } else if (!(e = cache_add(&imported, &nimported))) {
      r = coll_fail(comm, COLL_ERR_SYSTEM,
                    "rank %d: %d peer allocations are mapped already: "
                    "no room for rank %d's",
                    comm->rank, CACHE_MAX, peer);
    } else {
      e->id = b->id;
      e->pid = pid;
      e->base = base;
    }
  }
  if (r == COLL_OK) *out = (uint8_t *)e->base + b->offset;
  pthread_mutex_unlock(&cache_mu);
  return r;
}

/* ---- set-up (from cuda.c's lazy set-up, on the executor's thread) ------------------------ */

static size_t flags_bytes(int n) {
  return 4096 + (((size_t)n * COLL_PEER_FLAG_STRIDE * 4 + 4095) & ~(size_t)4095);
}

/* This rank's half: map rank 0's flag page, find the driver functions, a scratch buffer,
 * a trial barrier with itself.  False with cc->why. */
static bool setup_local(struct coll_comm *comm, const char *name) {
  struct coll_peer *cc = comm->peer;
  pthread_once(&entry_once, load_entries);
  if (!batch_memop || !ptr_attrs) {
    snprintf(cc->why, sizeof cc->why,
             "the CUDA driver lacks cuStreamBatchMemOp or "
             "cuPointerGetAttributes");
    return false;
  }
  size_t size = flags_bytes(comm->nranks);
  if (comm->rank != 0) {
    int fd = shm_open(name, O_RDWR, 0600);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || (size_t)st.st_size < size) {
      snprintf(cc->why, sizeof cc->why, "rank %d: opening the flag page %s failed", comm->rank,
               name);
      if (fd >= 0) close(fd);
      return false;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
      snprintf(cc->why, sizeof cc->why, "rank %d: mapping the flag page failed", comm->rank);
      return false;
    }
    cc->flag_base = p;
    cc->flag_size = size;
  }
  cudaError_t e = cudaHostRegister(cc->flag_base, size,
                                   cudaHostRegisterMapped | cudaHostRegisterPortable);
  void *dptr = NULL;
  if (e == cudaSuccess) {
    cc->flag_registered = true;
    e = cudaHostGetDevicePointer(&dptr, cc->flag_base, 0);
  }
  if (e == cudaSuccess) e = cudaMalloc(&cc->scratch, COLL_DEV_SCRATCH);
  cudaEvent_t ev = NULL;
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  int sms = 0;
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cc->device);
  if (e == cudaSuccess) e = (cudaError_t)coll_cuda_preload_peer_kernels();
  if (e != cudaSuccess) {
    snprintf(cc->why, sizeof cc->why,
             "rank %d: setting up the flags, scratch or "
             "kernels failed: %s",
             comm->rank, cudaGetErrorName(e));
    cudaGetLastError();
    if (ev) cudaEventDestroy(ev);
    return false;
  }
  cc->done_ev = ev;
  cc->flags = (_Atomic uint32_t *)((uint8_t *)cc->flag_base + 4096);
  cc->flags_dev = (uint64_t)(uintptr_t)dptr + 4096;
  cc->max_blocks = (unsigned)(sms > 0 ? sms : 1) * 4;
  /* A trial: one write and one wait of this rank's own flag on libcoll's stream.  Where
   * stream memory operations are off, the driver refuses here, not in a user's call. */
  CUstreamBatchMemOpParams ops[2];
  memset(ops, 0, sizeof ops);
  uint64_t mine = cc->flags_dev +
                  4ull * ((uint64_t)comm->rank * COLL_PEER_FLAG_STRIDE + (uint64_t)comm->rank);
  ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[0].writeValue.address = (CUdeviceptr)mine;
  ops[0].writeValue.value = 0;
  ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  ops[1].waitValue.address = (CUdeviceptr)mine;
  ops[1].waitValue.value = 0;
  ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  CUresult cr = batch_memop((CUstream)cc->stream, 2, ops, 0);
  if (cr == CUDA_SUCCESS) e = cudaStreamSynchronize((cudaStream_t)cc->stream);
  if (cr != CUDA_SUCCESS || e != cudaSuccess) {
    snprintf(cc->why, sizeof cc->why,
             "rank %d: stream memory operations on GPU %d "
             "failed (CUresult %d, %s)",
             comm->rank, cc->device, (int)cr, cudaGetErrorName(e));
    cudaGetLastError();
    return false;
  }
  return true;
}

coll_result coll_cuda_peer_setup(struct coll_comm *comm, coll_device_exchange xchg, int device,
                                 void *stream) {
  int n = comm->nranks;
  char name[64] = "";
  if (n > COLL_PEER_MAX) {
    COLL_INFO(comm->rank,
              "CUDA: no device data path (%d ranks: its kernels read at most %d "
              "buffers): device buffers take the host-driven path",
              n, COLL_PEER_MAX);
    return COLL_OK;
  }
  struct coll_peer *cc = calloc(1, sizeof *cc);
  if (!cc)
    return coll_fail(comm, COLL_ERR_SYSTEM, "rank %d: out of memory for the device path",
                     comm->rank);
  cc->device = device;
  cc->stream = stream;
  comm->peer = cc;
  bool ok = true;
  if (comm->rank == 0) {
    coll_shm_segment_name(name, sizeof name, comm->secret, "dp", 0);
    void *p = NULL;
    size_t size = flags_bytes(n);
    if (coll_shm_create(&comm->view, name, size, &p) != COLL_OK) {
      snprintf(cc->why, sizeof cc->why, "%.160s", comm->errbuf);
      ok = false;
    } else {
      cc->flag_base = p;
      cc->flag_size = size;
      snprintf(cc->flag_name, sizeof cc->flag_name, "%s", name);
    }
  }
  char all_names[COLL_PEER_MAX][64];
  coll_result r = xchg(comm, name, all_names, sizeof name);
  if (r != COLL_OK) return r;
  if (ok) ok = all_names[0][0] && setup_local(comm, all_names[0]);
  /* Whether the path is up here, and on which GPU (its PCI address): ranks that share one
   * GPU time-slice it, and the one-GPU row (algo/device.c) serves them with one kernel. */
  typedef struct {
    uint8_t ok;
    char pci[31];
  } token_t;
  token_t token = {.ok = ok}, tokens[COLL_PEER_MAX];
  if (ok && cudaDeviceGetPCIBusId(token.pci, sizeof token.pci, device) != cudaSuccess) {
    cudaGetLastError();
    token.pci[0] = 0;
  }
  r = xchg(comm, &token, tokens, sizeof token);
  if (comm->rank == 0 && cc->flag_name[0]) {
    shm_unlink(cc->flag_name); /* everyone has mapped it (or failed to) by now */
    cc->flag_name[0] = 0;
  }
  if (r != COLL_OK) return r;
  bool all = true;
  int gpus = 0;
  for (int p = 0; p < n; p++) {
    bool seen = false; /* a GPU counted already (no address: a GPU of its own) */
    for (int q = 0; q < p && tokens[p].pci[0]; q++)
      seen |= strncmp(tokens[q].pci, tokens[p].pci, sizeof tokens[p].pci) == 0;
    gpus += !seen;
  }
  for (int p = 0; p < n; p++)
    if (!tokens[p].ok) {
      all = false;
      if (ok)
        snprintf(cc->why, sizeof cc->why,
                 "rank %d could not set the device "
                 "path's flags up",
                 p);
    }
  cc->ok = all;
  comm->dev_gpus = all ? gpus : 0;
  if (all)
    COLL_INFO(comm->rank, "CUDA: device data path up: %d ranks on %d GPU(s)%s", n, gpus,
              gpus == 1 && n > 1 ? " (one GPU: the dev_onegpu row serves the ranks with one kernel)"
                                 : "");
  if (!all)
    COLL_INFO(comm->rank,
              "CUDA: no device data path (%s): device buffers take the "
              "host-driven path",
              cc->why);
  return COLL_OK;
}

/* The last call's stream must have passed its waits before the flag page goes (a wait
 * reading unmapped memory would fault the GPU context).  A communicator that failed may
 * have waits that never end; there, and where the bound runs out, the page stays. */
void coll_cuda_peer_free(struct coll_comm *comm) {
  struct coll_peer *cc = comm->peer;
  if (!cc) return;
  bool keep = comm->sticky != COLL_OK || atomic_load(&comm->aborted);
  if (!keep && cc->done_ev && cc->epoch) {
    uint64_t start = coll_now_ns();
    cudaError_t e;
    while ((e = cudaEventQuery((cudaEvent_t)cc->done_ev)) == cudaErrorNotReady) {
      if (comm->timeout_ms && coll_now_ns() - start > (uint64_t)comm->timeout_ms * 1000000u) {
        keep = true;
        break;
      }
      struct timespec ts = {0, 50000};
      nanosleep(&ts, NULL);
    }
  }
  if (keep && cc->flag_base) {
    COLL_INFO(comm->rank, "CUDA: leaving the device path's flag page mapped (the "
                          "communicator failed, or its last call's stream did not finish)");
    cc->flag_registered = false;
    cc->flag_base = NULL;
  }
  if (cc->flag_registered) cudaHostUnregister(cc->flag_base);
  if (cc->flag_base) munmap(cc->flag_base, cc->flag_size);
  if (cc->flag_name[0]) shm_unlink(cc->flag_name);
  if (cc->scratch) cudaFree(cc->scratch);
  if (cc->done_ev) cudaEventDestroy((cudaEvent_t)cc->done_ev);
  cudaGetLastError();
  free(cc);
  comm->peer = NULL;
}

/* Ends every wait of the device path at once, on every rank: the communicator is being
 * aborted or was poisoned, and a stream stuck on a flag would never move again.  The
 * kernels behind the waits then run on whatever the buffers hold; the calls have failed
 * (their callers hear it from the communicator), so nothing reads those bytes as a
 * result. */
void coll_cuda_peer_poison(struct coll_comm *comm) {
  struct coll_peer *cc = comm->peer;
  if (!cc || !cc->flags) return;
  uint32_t far = cc->epoch + (1u << 30);
  for (int d = 0; d < comm->nranks; d++)
    for (int s = 0; s < comm->nranks; s++)
      atomic_store_explicit(&cc->flags[d * COLL_PEER_FLAG_STRIDE + s], far, memory_order_release);
}

/* ---- per call ----------------------------------------------------------------------------- */

static bool path_ready(struct coll_comm *comm) { return comm->peer && comm->peer->ok; }

void coll_cuda_peer_describe(struct coll_comm *comm, const char *fn, const coll_work *w,
                             void *out) {
  struct coll_peer *cc = comm->peer;
  pthread_once(&entry_once, load_entries);
  peer_desc mine;
  memset(&mine, 0, sizeof mine);
  mine.magic = DESC_MAGIC;
  mine.coll = (uint8_t)w->coll;
  mine.dtype = (uint8_t)w->dtype;
  mine.op = (uint8_t)w->op;
  mine.root = w->root;
  mine.pid = (int32_t)getpid();
  mine.count = w->count;
  char why[160] = "no cuPointerGetAttributes in this driver";
  int old = -1; /* the driver queries need the buffers' GPU current */
  if (cudaGetDevice(&old) == cudaSuccess && old != w->cuda_dev)
    cudaSetDevice(w->cuda_dev);
  else
    old = -1;
  mine.ok = ptr_attrs && describe(w->sendbuf, &mine.buf[0], why, sizeof why) &&
            (w->recvbuf == w->sendbuf ? (mine.buf[1] = mine.buf[0], true)
                                      : describe(w->recvbuf, &mine.buf[1], why, sizeof why));
  if (old >= 0) cudaSetDevice(old);
  if (!mine.ok && !(cc && cc->warned)) { /* no state yet: the first call, said once anyway */
    if (cc) cc->warned = true;
    COLL_INFO(comm->rank, "CUDA: %s #%llu takes the host-driven path: %s", fn,
              (unsigned long long)atomic_load(&comm->next_seq), why);
  }
  memcpy(out, &mine, sizeof mine);
}

/* Orders `stream` after `event` (cudaStreamWaitEvent), saying what it waited for. */
static coll_result stream_after(struct coll_comm *comm, void *stream, void *event, const char *fn,
                                const char *what) {
  cudaError_t e = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0);
  if (e == cudaSuccess) return COLL_OK;
  cudaGetLastError();
  return coll_fail(comm, COLL_ERR_SYSTEM,
                   "rank %d: ordering %s after %s (cudaStreamWaitEvent) failed: %s", comm->rank, fn,
                   what, cudaGetErrorName(e));
}

coll_result coll_cuda_peer_map(struct coll_comm *comm, const char *fn, coll_work *w,
                               const void *descs, void *stream) {
  struct coll_peer *cc = comm->peer;
  int n = comm->nranks;
  w->peer_ok = false;
  if (!path_ready(comm) || w->cuda_dev != cc->device)
    return COLL_OK; /* not ready: the host-driven path says why (or serves, as it can) */
  const peer_desc *mine = desc_at(descs, comm->rank);
  bool ok = true;
  for (int p = 0; p < n; p++) {
    const peer_desc *d = desc_at(descs, p);
    if (d->magic != DESC_MAGIC)
      return coll_fail(comm, COLL_ERR_INTERNAL,
                       "rank %d: rank %d's device-path descriptor is "
                       "corrupt",
                       comm->rank, p);
    if (d->coll != mine->coll || d->dtype != mine->dtype || d->count != mine->count ||
        ((w->coll == COLL_COLL_BROADCAST || w->coll == COLL_COLL_REDUCE) &&
         d->root != mine->root) ||
        (w->coll != COLL_COLL_BROADCAST && w->coll != COLL_COLL_ALL_GATHER && d->op != mine->op)) {
      char a[96], b[96];
      snprintf(a, sizeof a, "%s count %llu %s %s root %d",
               coll_coll_name((coll_coll_kind)mine->coll), (unsigned long long)mine->count,
               coll_dtype_name((coll_dtype)mine->dtype), coll_op_name((coll_op)mine->op),
               mine->root);
      snprintf(b, sizeof b, "%s count %llu %s %s root %d", coll_coll_name((coll_coll_kind)d->coll),
               (unsigned long long)d->count, coll_dtype_name((coll_dtype)d->dtype),
               coll_op_name((coll_op)d->op), d->root);
      return coll_fail(comm, COLL_ERR_MISMATCH, "%s: rank %d called %s, but rank %d called %s", fn,
                       comm->rank, a, p, b);
    }
    ok &= d->ok;
  }
  bool any_in_place = false;
  for (int p = 0; p < n; p++) {
    const peer_desc *d = desc_at(descs, p);
    any_in_place |= d->buf[0].id && d->buf[0].id == d->buf[1].id &&
                    d->buf[0].offset == d->buf[1].offset;
  }
  if (!ok) return COLL_OK; /* some rank's buffer cannot be shared: all take the host path */
  coll_dev_call *dc = &cc->call;
  memset(dc, 0, sizeof *dc);
  dc->any_in_place = any_in_place;
  int old = -1;
  if (cudaGetDevice(&old) == cudaSuccess && old != cc->device)
    cudaSetDevice(cc->device);
  else
    old = -1;
  coll_result r = COLL_OK;
  for (int p = 0; p < n && r == COLL_OK; p++) {
    if (p == comm->rank) {
      dc->send[p] = w->sendbuf;
      dc->recv[p] = w->recvbuf;
      continue;
    }
    void *s = NULL, *v = NULL;
    const peer_desc *d = desc_at(descs, p);
    r = import(comm, p, d->pid, &d->buf[0], &s);
    if (r == COLL_OK) r = import(comm, p, d->pid, &d->buf[1], &v);
    dc->send[p] = s;
    dc->recv[p] = v;
  }
  /* The caller's cudaStream_t; for a blocking call the legacy default stream (stream
   * order with what the caller enqueued there, as NCCL's stream 0); for a coll_stream_t's
   * work, served by the progress thread, the communicator's own non-blocking stream,
   * after the event coll_cuda_prepare_stream recorded on the legacy stream at the call:
   * on the legacy stream its barriers would also hold back every kernel the caller
   * enqueues meanwhile (a trainer's backward), and overlap would be lost. */
  dc->stream = stream                         ? stream
               : w->peer_queued && cc->stream ? cc->stream
                                              : (void *)cudaStreamLegacy;
  if (r == COLL_OK && w->peer_queued && w->cuda_event && dc->stream == cc->stream)
    r = stream_after(comm, dc->stream, w->cuda_event, fn, "the caller's default stream");
  /* A communicator's device calls run in call order, whatever streams they are on (as
   * NCCL's do): the scratch of an in-place one-shot, and the barriers' epochs, assume
   * it.  On a stream other than the last call's, wait for the last call's end first. */
  if (r == COLL_OK && cc->epoch && cc->last_stream != dc->stream)
    r = stream_after(comm, dc->stream, cc->done_ev, fn, "the previous device call");
  if (old >= 0) cudaSetDevice(old);
  if (r != COLL_OK) return r;
  cc->last_stream = dc->stream;
  w->dev = dc;
  w->peer_ok = true;
  return COLL_OK;
}

/* The calling thread's device is the caller's business: set for the enqueue, put back. */
static int enter_device(struct coll_comm *comm) {
  int old = -1;
  if (cudaGetDevice(&old) == cudaSuccess && old != comm->peer->device)
    cudaSetDevice(comm->peer->device);
  return old;
}
static void leave_device(struct coll_comm *comm, int old) {
  if (old >= 0 && old != comm->peer->device) cudaSetDevice(old);
}

coll_result coll_cuda_peer_finish(struct coll_comm *comm, coll_work *w, coll_result r) {
  struct coll_peer *cc = comm->peer;
  if (r == COLL_OK) {
    int old = enter_device(comm);
    cudaError_t e = cudaEventRecord((cudaEvent_t)cc->done_ev, (cudaStream_t)w->dev->stream);
    leave_device(comm, old);
    if (e != cudaSuccess)
      r = coll_fail(comm, COLL_ERR_SYSTEM, "rank %d: cudaEventRecord after %s failed: %s",
                    comm->rank, coll_coll_name(w->coll), cudaGetErrorName(e));
  }
  if (r != COLL_OK) coll_cuda_peer_poison(comm);
  w->dev = NULL;
  return r;
}

void *coll_cuda_peer_done_event(struct coll_comm *comm) { return comm->peer->done_ev; }

/* ---- the primitives algo/device.c schedules with ------------------------------------------ */

uint32_t coll_dev_epoch(struct coll_comm *comm) { return ++comm->peer->epoch; }

coll_result coll_dev_barrier(struct coll_comm *comm, const coll_dev_call *d) {
  int n = comm->nranks, me = comm->rank, k = 0, others[COLL_PEER_MAX];
  for (int p = 0; p < n; p++)
    if (p != me) others[k++] = p;
  return coll_dev_signal(comm, d, coll_dev_epoch(comm), others, k, others, k);
}

coll_result coll_dev_signal(struct coll_comm *comm, const coll_dev_call *d, uint32_t epoch,
                            const int *to, int nto, const int *from, int nfrom) {
  struct coll_peer *cc = comm->peer;
  int me = comm->rank, k = 0;
  CUstreamBatchMemOpParams ops[2 * COLL_PEER_MAX];
  memset(ops, 0, sizeof ops);
  for (int i = 0; i < nto; i++) {
    CUstreamBatchMemOpParams *o = &ops[k++];
    o->writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    o->writeValue.address = (CUdeviceptr)(cc->flags_dev +
                                          4ull * ((uint64_t)to[i] * COLL_PEER_FLAG_STRIDE +
                                                  (uint64_t)me));
    o->writeValue.value = epoch; /* default flags: ordered after the stream's earlier writes */
  }
  for (int i = 0; i < nfrom; i++) {
    CUstreamBatchMemOpParams *o = &ops[k++];
    o->waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    o->waitValue.address = (CUdeviceptr)(cc->flags_dev +
                                         4ull * ((uint64_t)me * COLL_PEER_FLAG_STRIDE +
                                                 (uint64_t)from[i]));
    o->waitValue.value = epoch;
    o->waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  }
  if (!k) return COLL_OK;
  int old = enter_device(comm);
  CUresult cr = batch_memop((CUstream)d->stream, (unsigned)k, ops, 0);
  leave_device(comm, old);
  if (cr != CUDA_SUCCESS)
    return coll_fail(comm, COLL_ERR_SYSTEM,
                     "rank %d: cuStreamBatchMemOp (a barrier of the "
                     "device path) failed: CUresult %d",
                     comm->rank, (int)cr);
  return COLL_OK;
}

coll_result coll_dev_reduce(struct coll_comm *comm, const coll_dev_call *d, void *dst,
                            const void *const *src, int nsrc, size_t count, coll_dtype dtype,
                            coll_op op) {
  int old = enter_device(comm);
  cudaError_t e = (cudaError_t)coll_cuda_launch_reduce_n(dst, src, nsrc, count, (int)dtype, (int)op,
                                                         comm->nranks, comm->peer->max_blocks,
                                                         d->stream);
  leave_device(comm, old);
  if (e != cudaSuccess)
    return coll_fail(comm, COLL_ERR_SYSTEM,
                     "rank %d: launching the %d-way %s %s reduction "
                     "(%zu elements) failed: %s",
                     comm->rank, nsrc, coll_dtype_name(dtype), coll_op_name(op), count,
                     cudaGetErrorName(e));
  return COLL_OK;
}

coll_result coll_dev_copy(struct coll_comm *comm, const coll_dev_call *d, void *const *dst,
                          const void *const *src, const size_t *bytes, int nseg) {
  int old = enter_device(comm);
  cudaError_t e = (cudaError_t)coll_cuda_launch_copy_n(dst, src, bytes, nseg,
                                                       comm->peer->max_blocks, d->stream);
  leave_device(comm, old);
  if (e != cudaSuccess)
    return coll_fail(comm, COLL_ERR_SYSTEM,
                     "rank %d: launching the copy of %d segments failed: "
                     "%s",
                     comm->rank, nseg, cudaGetErrorName(e));
  return COLL_OK;
}

coll_result coll_dev_reduce_fan(struct coll_comm *comm, const coll_dev_call *d, void *const *dst,
                                int ndst, size_t seg, const void *const *src, int nsrc,
                                size_t count, coll_dtype dtype, coll_op op) {
  int old = enter_device(comm);
  cudaError_t e = (cudaError_t)coll_cuda_launch_reduce_fan(dst, ndst, seg, src, nsrc, count,
                                                           (int)dtype, (int)op, comm->nranks,
                                                           comm->peer->max_blocks, d->stream);
  leave_device(comm, old);
  if (e != cudaSuccess)
    return coll_fail(comm, COLL_ERR_SYSTEM,
                     "rank %d: launching the %d-way %s %s reduction into %d outputs "
                     "(%zu elements) failed: %s",
                     comm->rank, nsrc, coll_dtype_name(dtype), coll_op_name(op), ndst, count,
                     cudaGetErrorName(e));
  return COLL_OK;
}

coll_result coll_dev_copy_fan(struct coll_comm *comm, const coll_dev_call *d, void *const *dst,
                              int ndst, const void *const *src, const size_t *bytes, int nseg) {
  int old = enter_device(comm);
  cudaError_t e = (cudaError_t)coll_cuda_launch_copy_fan(dst, ndst, src, bytes, nseg,
                                                         comm->peer->max_blocks, d->stream);
  leave_device(comm, old);
  if (e != cudaSuccess)
    return coll_fail(comm, COLL_ERR_SYSTEM,
                     "rank %d: launching the copy of %d segments to %d outputs each failed: %s",
                     comm->rank, nseg, ndst, cudaGetErrorName(e));
  return COLL_OK;
}

void *coll_dev_scratch(struct coll_comm *comm) { return comm->peer->scratch; }

#else
/* Without CUDA: nothing is ever a device buffer, so none of this is reached.  The hooks
 * of exec/submit.c are the host table's then (kernels/device_host.c); the primitives
 * below exist so that algo/device.c links the same way in every build. */
static coll_result no_cuda(struct coll_comm *comm) {
  return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: the device path in a build without CUDA",
                   comm->rank);
}
uint32_t coll_dev_epoch(struct coll_comm *comm) {
  (void)comm;
  return 0;
}
coll_result coll_dev_barrier(struct coll_comm *comm, const coll_dev_call *d) {
  (void)d;
  return no_cuda(comm);
}
coll_result coll_dev_signal(struct coll_comm *comm, const coll_dev_call *d, uint32_t epoch,
                            const int *to, int nto, const int *from, int nfrom) {
  (void)d, (void)epoch, (void)to, (void)nto, (void)from, (void)nfrom;
  return no_cuda(comm);
}
coll_result coll_dev_reduce_fan(struct coll_comm *comm, const coll_dev_call *d, void *const *dst,
                                int ndst, size_t seg, const void *const *src, int nsrc,
                                size_t count, coll_dtype dtype, coll_op op) {
  (void)d, (void)dst, (void)ndst, (void)seg, (void)src, (void)nsrc, (void)count, (void)dtype,
      (void)op;
  return no_cuda(comm);
}
coll_result coll_dev_copy_fan(struct coll_comm *comm, const coll_dev_call *d, void *const *dst,
                              int ndst, const void *const *src, const size_t *bytes, int nseg) {
  (void)d, (void)dst, (void)ndst, (void)src, (void)bytes, (void)nseg;
  return no_cuda(comm);
}
coll_result coll_dev_reduce(struct coll_comm *comm, const coll_dev_call *d, void *dst,
                            const void *const *src, int nsrc, size_t count, coll_dtype dtype,
                            coll_op op) {
  (void)d, (void)dst, (void)src, (void)nsrc, (void)count, (void)dtype, (void)op;
  return no_cuda(comm);
}
coll_result coll_dev_copy(struct coll_comm *comm, const coll_dev_call *d, void *const *dst,
                          const void *const *src, const size_t *bytes, int nseg) {
  (void)d, (void)dst, (void)src, (void)bytes, (void)nseg;
  return no_cuda(comm);
}
void *coll_dev_scratch(struct coll_comm *comm) {
  (void)comm;
  return NULL;
}
#endif
