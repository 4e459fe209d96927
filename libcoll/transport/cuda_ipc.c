/* cuda_ipc.c — the CUDA IPC transport: FIFO slots in GPU memory, shared between the
 * processes of one host with cudaIpcGetMemHandle / cudaIpcOpenMemHandle.
 *
 * Each rank allocates, once at setup, one device buffer holding the FIFOs it receives
 * on (one per peer, NSLOTS slots of SLOT_BYTES each) and exports it with an IPC handle;
 * every sender opens its receivers' buffers and writes (copies or reduces, on its own
 * CUDA stream) straight into its slot there.  The counters stay on the host, exactly as
 * in shm.c: a POSIX shared segment per receiver holds, per sender, `tail` (written by
 * the sender), `head` (written by the receiver) and the byte count of each slot, with
 * release stores, acquire loads, and a futex to sleep on when there is nothing to do —
 * the same ring code as shm.c's (fifo.c).
 * The executor's device memory ops fence (wait for the CUDA stream) before send_post and
 * before recv_release, so a published slot is complete in GPU memory and a released
 * one is no longer read: the counters never run ahead of the bytes.
 *
 *   device buffer of rank r:  [fifo from rank 0][fifo from rank 1]...  (own one unused)
 *   fifo = NSLOTS x SLOT_BYTES
 *   host segment of rank r:   [header page][ctl page from rank 0][ctl page from rank 1]...
 *
 * Several ranks may share one GPU: they are separate processes, and opening another
 * process's allocation on the same device is what CUDA IPC does (only the process that
 * made a handle cannot open it, which the selection in cuda.c rules out).  Between two
 * GPUs the handle is opened with cudaIpcMemLazyEnablePeerAccess, and the selection only
 * pairs GPUs that can reach each other.  Slots are larger than shm's (2 MiB): each
 * slice costs one stream fence, a few microseconds, which a 64 KiB slice would not
 * amortise at GPU copy rates.
 *
 * Must never: block without a bound, allocate or call into the kernel while data moves,
 * trust a peer's segment beyond what it checks, or let a CUDA error pass unreported.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base.h"
#include "coll_config.h"
#include "cuda_ipc.h"
#include "fifo.h"
#include "shm.h"

#define CIPC_MAGIC 0x43495043u /* "CPIC" */
#define CIPC_BLOB_MAGIC 0x42495043u
#define PAGE 4096
#define CIPC_NSLOTS 4
#define CIPC_SLOT_BYTES (2u << 20)

/* What a rank tells its peers (fits COLL_CONN_BLOB). */
typedef struct {
  uint32_t magic;
  uint32_t ok;
  int32_t pid;
  uint32_t pci;
  uint32_t npeers;
  uint32_t peers[16];
  uint32_t nslots, slot_bytes;
  uint64_t seg_size, fifo_bytes;
  char shm_name[64];
  unsigned char handle[64]; /* cudaIpcMemHandle_t */
} cipc_blob;
_Static_assert(sizeof(cipc_blob) <= COLL_CONN_BLOB, "cuda_ipc blob fits");

bool coll_cuda_ipc_blob_view(const void *blob, coll_cuda_view *v) {
  cipc_blob b;
  memcpy(&b, blob, sizeof b);
  memset(v, 0, sizeof *v);
  if (b.magic != CIPC_BLOB_MAGIC || !b.ok) return false;
  v->ok = true;
  v->pid = b.pid;
  v->pci = b.pci;
  v->npeers = b.npeers < 16 ? b.npeers : 16;
  memcpy(v->peers, b.peers, sizeof v->peers);
  return true;
}

#if COLL_HAVE_CUDA
#include <cuda_runtime_api.h>

_Static_assert(sizeof(cudaIpcMemHandle_t) == 64, "IPC handle is 64 bytes");

typedef struct {
  coll_seg_owner owner; /* first: coll_shm_create stamps it */
  uint32_t magic, nranks, nslots, slot_bytes;
  int32_t owner_pid;
  int32_t owner_rank;
  _Atomic int32_t closed;
} cipc_header;

/* The counters and both ends are fifo.h's, as shm.c's; only the slots differ (device
 * memory, written and read by the executor's device ops). */
typedef coll_fifo_ctl cipc_ctl;
typedef coll_fifo_conn cipc_conn;
_Static_assert(sizeof(cipc_ctl) <= PAGE, "control block fits a page");
_Static_assert(CIPC_NSLOTS <= COLL_FIFO_MAX_SLOTS && (CIPC_NSLOTS & (CIPC_NSLOTS - 1)) == 0,
               "slots: a power of two the control block has room for");

typedef struct {
  char name[64];
  uint8_t *base; /* host segment */
  size_t size;
  bool unlinked;
  uint8_t *fifo; /* device */
  size_t fifo_bytes;
  int device;
  uint8_t **peer_base;
  size_t *peer_size;
  void **peer_fifo; /* opened IPC pointers */
  cipc_conn *conns; /* [2p] send to p, [2p+1] recv from p */
} cipc_ctx;

#define CK_FAIL(view, e, what, ...)                                                    \
  coll_view_fail(view, COLL_ERR_SYSTEM, "rank %d: cuda_ipc: " what " failed: %s (%s)", \
                 (view)->rank, ##__VA_ARGS__, cudaGetErrorName(e), cudaGetErrorString(e))

static size_t fifo_stride(void) { return (size_t)CIPC_NSLOTS * CIPC_SLOT_BYTES; }
static size_t seg_size(int nranks) { return PAGE + (size_t)nranks * PAGE; }
static cipc_ctl *ctl_of(uint8_t *base, int from) {
  return (cipc_ctl *)(base + PAGE + (size_t)from * PAGE);
}

static bool cipc_can_connect(const coll_comm_view *view, int peer) {
  return view->host_ids[peer] == view->host_ids[view->rank] &&
         view->pids[peer] != view->pids[view->rank];
}

static uint32_t pci_of(int dev, cudaError_t *err) {
  int dom = 0, bus = 0, slot = 0;
  cudaError_t e = cudaDeviceGetAttribute(&dom, cudaDevAttrPciDomainId, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&bus, cudaDevAttrPciBusId, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&slot, cudaDevAttrPciDeviceId, dev);
  *err = e;
  return ((uint32_t)dom << 16) | (((uint32_t)bus & 0xff) << 8) | ((uint32_t)slot & 0xff);
}

static coll_result cipc_setup(const coll_comm_view *view, void **ctxp, void *blob) {
  int n = view->nranks;
  cipc_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return coll_view_fail(view, COLL_ERR_SYSTEM, "out of memory setting up cuda_ipc");
  *ctxp = ctx;
  ctx->peer_base = calloc((size_t)n, sizeof *ctx->peer_base);
  ctx->peer_size = calloc((size_t)n, sizeof *ctx->peer_size);
  ctx->peer_fifo = calloc((size_t)n, sizeof *ctx->peer_fifo);
  ctx->conns = calloc(2 * (size_t)n, sizeof *ctx->conns);
  if (!ctx->peer_base || !ctx->peer_size || !ctx->peer_fifo || !ctx->conns)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "out of memory setting up cuda_ipc");
  ctx->device = view->cuda_device >= 0 ? view->cuda_device : 0;

  cipc_blob b;
  memset(&b, 0, sizeof b);
  cudaError_t e = cudaSetDevice(ctx->device);
  if (e != cudaSuccess) return CK_FAIL(view, e, "cudaSetDevice(%d)", ctx->device);
  b.pci = pci_of(ctx->device, &e);
  if (e != cudaSuccess) return CK_FAIL(view, e, "reading the PCI address of GPU %d", ctx->device);
  /* The GPUs this one can reach with peer access, by PCI address (device ordinals differ
   * between processes with different CUDA_VISIBLE_DEVICES). */
  int ndev = 0;
  if ((e = cudaGetDeviceCount(&ndev)) != cudaSuccess) return CK_FAIL(view, e, "cudaGetDeviceCount");
  for (int d = 0; d < ndev && b.npeers < 16; d++) {
    int can = 0;
    if (d == ctx->device) continue;
    if (cudaDeviceCanAccessPeer(&can, ctx->device, d) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    cudaError_t pe;
    uint32_t pci = pci_of(d, &pe);
    if (can && pe == cudaSuccess) b.peers[b.npeers++] = pci;
    cudaGetLastError();
  }

  /* The FIFOs: allocated and cleared once, here, never on the data path. */
  ctx->fifo_bytes = (size_t)n * fifo_stride();
  void *fifo = NULL;
  if ((e = cudaMalloc(&fifo, ctx->fifo_bytes)) != cudaSuccess)
    return CK_FAIL(view, e, "cudaMalloc of %zu bytes of FIFO on GPU %d", ctx->fifo_bytes,
                   ctx->device);
  ctx->fifo = fifo;
  if ((e = cudaMemset(fifo, 0, ctx->fifo_bytes)) != cudaSuccess)
    return CK_FAIL(view, e, "clearing the FIFO");
  cudaIpcMemHandle_t h;
  if ((e = cudaIpcGetMemHandle(&h, fifo)) != cudaSuccess)
    return CK_FAIL(view, e, "cudaIpcGetMemHandle");
  memcpy(b.handle, &h, sizeof h);

  /* The counters: a host segment, as shm.c's. */
  coll_shm_segment_name(ctx->name, sizeof ctx->name, view->secret, "cu", view->rank);
  ctx->size = seg_size(n);
  void *p;
  coll_result cr = coll_shm_create(view, ctx->name, ctx->size, &p);
  if (cr != COLL_OK) return cr;
  ctx->base = p;
  /* First touch now, not on the data path (the owner record stays as stamped). */
  memset(ctx->base + sizeof(coll_seg_owner), 0, ctx->size - sizeof(coll_seg_owner));
  cipc_header *hd = (cipc_header *)ctx->base;
  hd->nranks = (uint32_t)n;
  hd->nslots = CIPC_NSLOTS;
  hd->slot_bytes = CIPC_SLOT_BYTES;
  hd->owner_pid = (int32_t)getpid();
  hd->owner_rank = view->rank;
  atomic_store(&hd->closed, 0);
  hd->magic = CIPC_MAGIC;

  b.magic = CIPC_BLOB_MAGIC;
  b.ok = 1;
  b.pid = (int32_t)getpid();
  b.nslots = CIPC_NSLOTS;
  b.slot_bytes = CIPC_SLOT_BYTES;
  b.seg_size = ctx->size;
  b.fifo_bytes = ctx->fifo_bytes;
  snprintf(b.shm_name, sizeof b.shm_name, "%s", ctx->name);
  memcpy(blob, &b, sizeof b);
  return COLL_OK;
}

static coll_result cipc_connect(const coll_comm_view *view, void *vctx, int peer,
                                const void *peer_blob, coll_conn **send, coll_conn **recv) {
  cipc_ctx *ctx = vctx;
  cipc_blob b;
  memcpy(&b, peer_blob, sizeof b);
  b.shm_name[sizeof b.shm_name - 1] = 0;
  if (b.magic != CIPC_BLOB_MAGIC || !b.ok || b.nslots != CIPC_NSLOTS ||
      b.slot_bytes != CIPC_SLOT_BYTES || b.seg_size != seg_size(view->nranks) ||
      b.fifo_bytes != (uint64_t)view->nranks * fifo_stride())
    return coll_view_fail(view, COLL_ERR_INTERNAL,
                          "rank %d: cuda_ipc: rank %d's connection info "
                          "does not match this build (slots %u x %u bytes)",
                          view->rank, peer, b.nslots, b.slot_bytes);
  int fd = shm_open(b.shm_name, O_RDWR, 0);
  if (fd < 0)
    return coll_view_fail(view, COLL_ERR_SYSTEM,
                          "rank %d: cuda_ipc: opening rank %d's segment %s "
                          "failed: %s",
                          view->rank, peer, b.shm_name, strerror(errno));
  void *p = mmap(NULL, b.seg_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED)
    return coll_view_fail(view, COLL_ERR_SYSTEM,
                          "rank %d: cuda_ipc: mapping rank %d's segment "
                          "failed: %s",
                          view->rank, peer, strerror(err));
  ctx->peer_base[peer] = p;
  ctx->peer_size[peer] = b.seg_size;
  cipc_header *ph = p;
  if (ph->magic != CIPC_MAGIC || ph->nranks != (uint32_t)view->nranks || ph->owner_rank != peer)
    return coll_view_fail(view, COLL_ERR_INTERNAL,
                          "rank %d: cuda_ipc: rank %d's segment %s is not a valid libcoll "
                          "segment for this communicator",
                          view->rank, peer, b.shm_name);
  cudaIpcMemHandle_t h;
  memcpy(&h, b.handle, sizeof h);
  cudaError_t e = cudaSetDevice(ctx->device);
  if (e != cudaSuccess) return CK_FAIL(view, e, "cudaSetDevice(%d)", ctx->device);
  void *pf = NULL;
  e = cudaIpcOpenMemHandle(&pf, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess)
    return CK_FAIL(view, e, "cudaIpcOpenMemHandle of rank %d's FIFO (pid %d)", peer, (int)b.pid);
  ctx->peer_fifo[peer] = pf;

  cipc_conn *s = &ctx->conns[2 * peer], *r = &ctx->conns[2 * peer + 1];
  *s = (cipc_conn){.base = {.t = &coll_transport_cuda_ipc,
                            .peer = peer,
                            .is_send = true,
                            .slot_bytes = CIPC_SLOT_BYTES,
                            .nslots = CIPC_NSLOTS},
                   .ctl = ctl_of(p, view->rank),
                   .slots = (uint8_t *)pf + (size_t)view->rank * fifo_stride(),
                   .stride = CIPC_SLOT_BYTES,
                   .peer_closed = &ph->closed,
                   .peer_pid = b.pid};
  *r = (cipc_conn){.base = {.t = &coll_transport_cuda_ipc,
                            .peer = peer,
                            .is_send = false,
                            .slot_bytes = CIPC_SLOT_BYTES,
                            .nslots = CIPC_NSLOTS},
                   .ctl = ctl_of(ctx->base, peer),
                   .slots = ctx->fifo + (size_t)peer * fifo_stride(),
                   .stride = CIPC_SLOT_BYTES,
                   .peer_closed = &ph->closed,
                   .peer_pid = b.pid};
  *send = &s->base;
  *recv = &r->base;
  return COLL_OK;
}

static coll_result cipc_ready(const coll_comm_view *view, void *vctx) {
  cipc_ctx *ctx = vctx;
  if (!ctx->unlinked && ctx->base && shm_unlink(ctx->name) != 0)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "rank %d: cuda_ipc: unlinking %s failed: %s",
                          view->rank, ctx->name, strerror(errno));
  ctx->unlinked = true;
  return COLL_OK;
}

static void cipc_close(const coll_comm_view *view, void *vctx, coll_comm_end how) {
  cipc_ctx *ctx = vctx;
  if (!ctx) return;
  cudaSetDevice(ctx->device);
  if (ctx->peer_fifo)
    for (int i = 0; i < view->nranks; i++)
      if (ctx->peer_fifo[i]) cudaIpcCloseMemHandle(ctx->peer_fifo[i]);
  if (ctx->fifo) cudaFree(ctx->fifo);
  cudaGetLastError();
  if (ctx->base) {
    if (how == COLL_END_ABORTED) atomic_store(&((cipc_header *)ctx->base)->closed, 1);
    if (!ctx->unlinked) shm_unlink(ctx->name);
    munmap(ctx->base, ctx->size);
  }
  if (ctx->peer_base)
    for (int i = 0; i < view->nranks; i++)
      if (ctx->peer_base[i]) munmap(ctx->peer_base[i], ctx->peer_size[i]);
  free(ctx->peer_base);
  free(ctx->peer_size);
  free(ctx->peer_fifo);
  free(ctx->conns);
  free(ctx);
}

const coll_transport coll_transport_cuda_ipc = {
    .name = "cuda_ipc",
    .slot_bytes = CIPC_SLOT_BYTES,
    .can_connect = cipc_can_connect,
    .setup = cipc_setup,
    .connect = cipc_connect,
    .ready = cipc_ready,
    .send_slot = coll_fifo_send_slot,
    .send_post = coll_fifo_send_post,
    .recv_slot = coll_fifo_recv_slot,
    .recv_release = coll_fifo_recv_release,
    .wait = coll_fifo_wait,
    .wake = coll_fifo_wake,
    .close = cipc_close,
};

#else /* no CUDA in this build: a transport that never connects */

static bool none_can_connect(const coll_comm_view *view, int peer) {
  (void)view, (void)peer;
  return false;
}
static coll_result none_setup(const coll_comm_view *view, void **ctx, void *blob) {
  (void)ctx, (void)blob;
  return coll_view_fail(view, COLL_ERR_UNSUPPORTED, "cuda_ipc: this build has no CUDA support");
}
static void none_close(const coll_comm_view *view, void *ctx, coll_comm_end how) {
  (void)view, (void)ctx, (void)how;
}

const coll_transport coll_transport_cuda_ipc = {.name = "cuda_ipc",
                                                .slot_bytes = CIPC_SLOT_BYTES,
                                                .can_connect = none_can_connect,
                                                .setup = none_setup,
                                                .close = none_close};
#endif
