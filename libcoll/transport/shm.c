/* shm.c — the shared-memory transport: FIFOs in POSIX shared segments on one host.
 *
 * Each rank creates one segment holding the FIFOs it *receives* on, one per peer:
 *
 *   [header page][2 mailboxes][fan-out control][fan-out ring][fifo from rank 0][fifo from
 *   rank 1]...   (no fifo from itself is used; mailboxes and fan-out: shm.h)
 *   fifo = [control page: tail | head | slot sizes][nslots x slot_bytes of data]
 *
 * The sender maps the receiver's segment and writes (or reduces) straight into the slot,
 * then publishes it with a release store of `tail`; the receiver reads with an acquire
 * load, consumes, and publishes `head` the same way.  tail and head live on separate
 * cache lines so the two sides never write the same line.  A side that finds nothing to
 * do spins briefly, then yields, then sleeps on a futex on the counter it waits for,
 * having raised a "waiter" flag that tells the other side to call FUTEX_WAKE (so no
 * system call is made on the data path while both sides are busy).  That ring — the
 * counters, the waits, the liveness check — is fifo.c's, shared with cuda_ipc.c; this
 * file lays out the segments and connects.
 *
 * Segments are created 0600 and sparse: creation touches the header and mailboxes only,
 * and each FIFO's pages become resident when a plan first uses it (warm(): the receiver
 * for its own segment, the sender for the peer's, both with MADV_POPULATE_WRITE), so a
 * rank holds the FIFOs of the peers its algorithms use — a ring's two — not N-1 of them
 * (32 ranks touching every FIFO at creation took 2 GiB).  Populating there, not on the
 * data path, keeps first-touch faults (~10 us a page here) out of the slices, and a full
 * /dev/shm is a sentence then, not a SIGBUS mid-copy.  Segments are unlinked as soon as
 * every rank has mapped them (ready()), so a crash later leaves nothing in /dev/shm.  A crash
 * during init can leave one, and env-based init without COLL_SECRET derives the same name again
 * next run: every segment starts with its owner (pid and start time), and a rank that
 * finds its name taken removes the segment if that owner is dead and refuses, naming
 * it, if it is alive (coll_shm_create).
 *
 * Must never: block without a bound, allocate or call into the kernel while data moves,
 * or trust the peer's segment header beyond what it checks.
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

#include "fifo.h"
#include "base.h"
#include "proc.h"
#include "shm.h"

#define SHM_MAGIC 0x434f4c53u /* "COLS" */
#define PAGE 4096
#define SHM_NSLOTS 8
/* Slots are laid out SHM_SLOT_STRIDE apart; a connection uses 64 KiB of each, or all
 * 256 KiB when ranks outnumber cores: every slot that fills is a wait, and a wait there
 * is a context switch (measured, 4 ranks on 2 cores, 64 MiB all-reduce: 4.8-5.4 GB/s
 * busbw with 64 KiB, 6.0-6.2 with 256 KiB; 2 ranks on 2 cores: no difference). */
#define SHM_SLOT_STRIDE (256 * 1024)
#define SHM_SLOT_SMALL (64 * 1024)
/* One-shot mailboxes (oneshot.c): two per rank (alternate calls), each a flag line whose
 * last 56 bytes already carry data, then the rest of the data. */
#define MB_STRIDE ((size_t)COLL_MAILBOX_BYTES + PAGE)

typedef struct {
  coll_seg_owner owner; /* first: coll_shm_create stamps it */
  uint32_t magic, nranks, nslots, slot_bytes;
  int32_t owner_pid;
  int32_t owner_rank;
  _Atomic int32_t closed; /* the owner aborted: peers waiting on it give up */
  /* Ranks asleep on one of this rank's mailboxes: its own line, so the owner reads it
   * from its cache on every post and only a sleeper ever writes it. */
  _Alignas(64) _Atomic uint32_t mb_waiters;
} shm_header;

/* A FIFO's control block and the two ends are fifo.h's (shared with cuda_ipc.c). */
typedef coll_fifo_ctl shm_ctl;
typedef coll_fifo_conn shm_conn;
_Static_assert(sizeof(shm_ctl) <= PAGE, "control block fits a page");
_Static_assert(64 + (size_t)COLL_MAILBOX_BYTES <= MB_STRIDE,
               "a mailbox's data may start a cache line past its flag (oneshot.c)");
_Static_assert(SHM_NSLOTS <= COLL_FIFO_MAX_SLOTS && (SHM_NSLOTS & (SHM_NSLOTS - 1)) == 0,
               "slots: a power of two the control block has room for");

typedef struct {
  char name[64];
  uint8_t *base;
  size_t size;
  bool unlinked;
  uint8_t **peer_base; /* mapped segments of peers */
  size_t *peer_size;
  shm_conn *conns; /* 2 * nranks: [2p] send to p, [2p+1] recv from p */
} shm_ctx;

typedef struct {
  char name[64];
  uint64_t size;
  int32_t pid;
} shm_blob;

static size_t fifo_stride(void) { return PAGE + (size_t)SHM_NSLOTS * SHM_SLOT_STRIDE; }
/* The fan-out block after the mailboxes: its control (a line each for the owner, its
 * sleepers and every rank), then its ring. */
static size_t fanout_off(void) { return PAGE + 2 * MB_STRIDE; }
static size_t fanout_ctl_bytes(int nranks) {
  size_t b = sizeof(coll_fanout) + (size_t)nranks * sizeof(coll_fanout_reader);
  return (b + PAGE - 1) / PAGE * PAGE;
}
static size_t fifos_off_n(int nranks) {
  return fanout_off() + fanout_ctl_bytes(nranks) + COLL_FANOUT_BYTES;
}
static size_t seg_size(int nranks) { return fifos_off_n(nranks) + (size_t)nranks * fifo_stride(); }

/* (Every segment's header says its communicator's size: checked against ours before a
 * peer's segment is used.) */
static shm_ctl *fifo_ctl(uint8_t *base, int from) {
  int n = (int)((shm_header *)base)->nranks;
  return (shm_ctl *)(base + fifos_off_n(n) + (size_t)from * fifo_stride());
}
static coll_mailbox *mailbox_at(uint8_t *base, unsigned parity) {
  return (coll_mailbox *)(base + PAGE + (size_t)(parity & 1) * MB_STRIDE);
}
static uint8_t *fifo_slots(uint8_t *base, int from) {
  return (uint8_t *)fifo_ctl(base, from) + PAGE;
}

static bool shm_can_connect(const coll_comm_view *view, int peer) {
  return view->host_ids[peer] == view->host_ids[view->rank];
}

void coll_shm_segment_name(char *out, size_t len, const uint8_t *secret, const char *what,
                           int rank) {
  char hex[2 * COLL_SECRET_BYTES + 2];
  int n = 0;
  for (int i = 0; i < COLL_SECRET_BYTES; i++) {
    if (i == 8) hex[n++] = '-';
    n += snprintf(hex + n, sizeof hex - (size_t)n, "%02x", secret[i]);
  }
  snprintf(out, len, "/coll-%s-%s%d", hex, what, rank);
}

void coll_job_prefix(char *out, size_t len, const uint8_t *secret) {
  int n = snprintf(out, len, "coll-");
  for (int i = 0; i < 8 && n > 0 && (size_t)n < len; i++)
    n += snprintf(out + n, len - (size_t)n, "%02x", secret[i]);
  if (n > 0 && (size_t)n < len) snprintf(out + n, len - (size_t)n, "-");
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels answer EINVAL */
#endif

/* Makes [p, p+len) of a shared mapping resident as a write would, without writing: 0, or
 * the errno of a page that could not be had (EFAULT or ENOMEM: /dev/shm is full) — which
 * a plain store would have turned into SIGBUS.  A kernel without MADV_POPULATE_WRITE
 * (EINVAL) leaves the pages to fault on first use: 0.  len 0: nothing. */
static int populate(void *p, size_t len) {
  if (len == 0 || madvise(p, len, MADV_POPULATE_WRITE) == 0) return 0;
  return errno == EINVAL ? 0 : errno;
}

/* ---- creating a segment, and taking over one a dead job left ----------------------- */

/* NULL while the owner (pid, start) runs; else why it does not.  A pid that exists but
 * started at another time is a new process that inherited the number: the owner is gone.
 * When /proc cannot tell (unreadable), the owner counts as alive: refusing is safe,
 * removing a live job's segment is not. */
static const char *owner_gone(int32_t pid, uint64_t start, char *why, size_t len) {
  if (pid <= 0) return "no owner ever stamped it (its creator died while making it)";
  if (kill(pid, 0) != 0 && errno == ESRCH) {
    snprintf(why, len, "its owner, pid %d, no longer exists", (int)pid);
    return why;
  }
  char state;
  uint64_t now_start = coll_process_start(pid, &state);
  if (state == 'Z' || state == 'X') {
    snprintf(why, len, "its owner, pid %d, has exited or was killed", (int)pid);
    return why;
  }
  if (start && now_start && now_start != start) {
    snprintf(why, len, "pid %d now belongs to a process that started after its owner", (int)pid);
    return why;
  }
  return NULL;
}

/* `name` exists: COLL_OK once it is removed because its owner is dead (or it vanished by
 * itself), else a failure naming the live owner.  A creator stamps the owner record right
 * after mapping, so an unstamped segment is given up to a second to be stamped before it
 * is judged: its creator died half-way. */
static coll_result take_over(const coll_comm_view *view, const char *name) {
  int rank = view ? view->rank : -1;
  int fd = shm_open(name, O_RDONLY, 0);
  if (fd < 0) {
    if (errno == ENOENT) return COLL_OK; /* gone meanwhile */
    return coll_view_fail(view, COLL_ERR_SYSTEM,
                          "rank %d: shared segment %s already exists and cannot be opened (%s): "
                          "another user's job with the same secret?",
                          rank, name, strerror(errno));
  }
  int32_t pid = 0, orank = -1;
  uint64_t start = 0, deadline = coll_now_ns() + 1000000000ull;
  for (;;) {
    struct stat st;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(coll_seg_owner)) {
      void *m = mmap(NULL, sizeof(coll_seg_owner), PROT_READ, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) {
        const coll_seg_owner *o = m;
        pid = atomic_load_explicit(&o->pid, memory_order_acquire);
        start = o->start;
        orank = o->rank;
        munmap(m, sizeof(coll_seg_owner));
      }
    }
    if (pid != 0 || coll_now_ns() >= deadline) break;
    struct timespec ts = {0, 1000000L};
    nanosleep(&ts, NULL);
  }
  close(fd);
  char why[160];
  const char *gone = owner_gone(pid, start, why, sizeof why);
  if (!gone)
    return coll_view_fail(view, COLL_ERR_SYSTEM,
                          "rank %d: shared segment %s already exists and belongs to a running "
                          "process (pid %d, rank %d of its job): two live jobs with the same "
                          "secret on one host; give each its own COLL_SECRET (or rendezvous port)",
                          rank, name, (int)pid, (int)orank);
  COLL_INFO(rank, "removing shared segment %s left by a dead job: %s", name, gone);
  if (shm_unlink(name) != 0 && errno != ENOENT)
    return coll_view_fail(view, COLL_ERR_SYSTEM,
                          "rank %d: removing the stale segment %s (%s) "
                          "failed: %s",
                          rank, name, gone, strerror(errno));
  return COLL_OK;
}

coll_result coll_shm_create(const coll_comm_view *view, const char *name, size_t size,
                            void **base) {
  int rank = view ? view->rank : -1;
  *base = NULL;
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) {
    coll_result r = take_over(view, name);
    if (r != COLL_OK) return r;
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  if (fd < 0)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "rank %d: shm_open(%s) failed: %s", rank, name,
                          strerror(errno));
  if (ftruncate(fd, (off_t)size) != 0) {
    int e = errno;
    close(fd);
    shm_unlink(name);
    return coll_view_fail(view, COLL_ERR_SYSTEM, "rank %d: sizing %s to %zu bytes failed: %s", rank,
                          name, size, strerror(e));
  }
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name);
    return coll_view_fail(view, COLL_ERR_SYSTEM, "rank %d: mmap of %s failed: %s", rank, name,
                          strerror(e));
  }
  /* The owner record's page first: on a full /dev/shm the store below would be SIGBUS. */
  int pe = populate(p, PAGE);
  if (pe) {
    munmap(p, size);
    shm_unlink(name);
    return coll_view_fail(view, COLL_ERR_SYSTEM,
                          "rank %d: no memory for shared segment %s: "
                          "%s (is /dev/shm full?)",
                          rank, name, strerror(pe));
  }
  coll_seg_owner *o = p;
  char state;
  o->rank = rank;
  o->start = coll_process_start(getpid(), &state);
  atomic_store_explicit(&o->pid, (int32_t)getpid(), memory_order_release);
  *base = p;
  return COLL_OK;
}

static coll_result shm_setup(const coll_comm_view *view, void **ctxp, void *blob) {
  int n = view->nranks;
  shm_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return coll_view_fail(view, COLL_ERR_SYSTEM, "out of memory setting up shm");
  ctx->peer_base = calloc((size_t)n, sizeof *ctx->peer_base);
  ctx->peer_size = calloc((size_t)n, sizeof *ctx->peer_size);
  ctx->conns = calloc(2 * (size_t)n, sizeof *ctx->conns);
  *ctxp = ctx;
  if (!ctx->peer_base || !ctx->peer_size || !ctx->conns)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "out of memory setting up shm");
  coll_shm_segment_name(ctx->name, sizeof ctx->name, view->secret, "", view->rank);
  ctx->size = seg_size(n);
  void *p;
  coll_result cr = coll_shm_create(view, ctx->name, ctx->size, &p);
  if (cr != COLL_OK) return cr;
  ctx->base = p;
  /* The mailboxes serve every call of the one-shot path with every peer, and the fan-out
   * control every broadcast it runs: resident now.  The fan-out ring and the FIFOs stay
   * sparse until first used.  All start as zero, as a fresh page reads. */
  size_t hot = fanout_off() + fanout_ctl_bytes(n);
  int pe = populate(ctx->base, hot);
  if (pe)
    return coll_view_fail(view, COLL_ERR_SYSTEM,
                          "rank %d: no memory for the header and "
                          "mailboxes of %s (%zu bytes): %s (is /dev/shm full?)",
                          view->rank, ctx->name, hot, strerror(pe));
  shm_header *h = (shm_header *)ctx->base;
  h->nranks = (uint32_t)n;
  h->nslots = SHM_NSLOTS;
  h->slot_bytes = SHM_SLOT_STRIDE;
  h->owner_pid = (int32_t)getpid();
  h->owner_rank = view->rank;
  atomic_store(&h->closed, 0);
  h->magic = SHM_MAGIC;

  shm_blob b;
  memset(&b, 0, sizeof b);
  snprintf(b.name, sizeof b.name, "%s", ctx->name);
  b.size = ctx->size;
  b.pid = (int32_t)getpid();
  _Static_assert(sizeof b <= COLL_CONN_BLOB, "blob fits");
  memcpy(blob, &b, sizeof b);
  return COLL_OK;
}

static coll_result shm_connect(const coll_comm_view *view, void *vctx, int peer,
                               const void *peer_blob, coll_conn **send, coll_conn **recv) {
  shm_ctx *ctx = vctx;
  shm_blob b;
  memcpy(&b, peer_blob, sizeof b);
  b.name[sizeof b.name - 1] = 0;
  if (b.size != seg_size(view->nranks))
    return coll_view_fail(view, COLL_ERR_INTERNAL,
                          "rank %d: rank %d's segment %s has size %llu, expected %zu", view->rank,
                          peer, b.name, (unsigned long long)b.size, seg_size(view->nranks));
  int fd = shm_open(b.name, O_RDWR, 0);
  if (fd < 0)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "rank %d: opening rank %d's segment %s failed: %s",
                          view->rank, peer, b.name, strerror(errno));
  void *p = mmap(NULL, b.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "rank %d: mapping rank %d's segment failed: %s",
                          view->rank, peer, strerror(e));
  ctx->peer_base[peer] = p;
  ctx->peer_size[peer] = b.size;
  shm_header *ph = p;
  if (ph->magic != SHM_MAGIC || ph->nranks != (uint32_t)view->nranks || ph->owner_rank != peer)
    return coll_view_fail(view, COLL_ERR_INTERNAL,
                          "rank %d: rank %d's segment %s is not a valid "
                          "libcoll segment for this communicator",
                          view->rank, peer, b.name);

  /* Both ends compute the same size: oversubscription is a fact of the host.  Nothing
   * is touched here: warm() does it when a plan first uses the connection. */
  size_t slot = view->oversubscribed ? SHM_SLOT_STRIDE : SHM_SLOT_SMALL;
  shm_conn *s = &ctx->conns[2 * peer], *r = &ctx->conns[2 * peer + 1];
  *s = (shm_conn){.base = {.t = &coll_transport_shm,
                           .peer = peer,
                           .is_send = true,
                           .slot_bytes = slot,
                           .nslots = SHM_NSLOTS},
                  .ctl = fifo_ctl(p, view->rank),
                  .slots = fifo_slots(p, view->rank),
                  .stride = SHM_SLOT_STRIDE,
                  .peer_closed = &ph->closed,
                  .peer_pid = b.pid};
  *r = (shm_conn){.base = {.t = &coll_transport_shm,
                           .peer = peer,
                           .is_send = false,
                           .slot_bytes = slot,
                           .nslots = SHM_NSLOTS},
                  .ctl = fifo_ctl(ctx->base, peer),
                  .slots = fifo_slots(ctx->base, peer),
                  .stride = SHM_SLOT_STRIDE,
                  .peer_closed = &ph->closed,
                  .peer_pid = b.pid};
  *send = &s->base;
  *recv = &r->base;
  return COLL_OK;
}

/* Makes one end's view of a FIFO resident: its control page the first time, and bytes
 * [from, to) of each slot, whole pages (populate: safe while the peer already moves
 * slices through them, since nothing is written). */
static coll_result shm_warm(const coll_comm_view *view, coll_conn *cc, size_t from, size_t to) {
  shm_conn *c = (shm_conn *)cc;
  size_t lo = from / PAGE * PAGE, hi = (to + PAGE - 1) / PAGE * PAGE;
  if (hi > c->stride) hi = c->stride;
  int e = from == 0 ? populate(c->ctl, PAGE) : 0;
  for (uint32_t i = 0; !e && hi > lo && i < c->base.nslots; i++)
    e = populate(c->slots + (size_t)i * c->stride + lo, hi - lo);
  if (!e) return COLL_OK;
  return coll_view_fail(view, COLL_ERR_SYSTEM,
                        "rank %d: making %zu bytes of each slot of the FIFO %s rank %d resident "
                        "failed: %s (is /dev/shm full?)",
                        view->rank, hi, c->base.is_send ? "to" : "from", c->base.peer, strerror(e));
}

static coll_result shm_ready(const coll_comm_view *view, void *vctx) {
  shm_ctx *ctx = vctx;
  if (!ctx->unlinked && shm_unlink(ctx->name) != 0)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "rank %d: unlinking %s failed: %s", view->rank,
                          ctx->name, strerror(errno));
  ctx->unlinked = true;
  return COLL_OK;
}

static void shm_close(const coll_comm_view *view, void *vctx, coll_comm_end how) {
  shm_ctx *ctx = vctx;
  if (!ctx) return;
  if (ctx->base) {
    if (how == COLL_END_ABORTED) atomic_store(&((shm_header *)ctx->base)->closed, 1);
    if (!ctx->unlinked) shm_unlink(ctx->name);
    munmap(ctx->base, ctx->size);
  }
  if (ctx->peer_base)
    for (int i = 0; i < view->nranks; i++)
      if (ctx->peer_base[i]) munmap(ctx->peer_base[i], ctx->peer_size[i]);
  free(ctx->peer_base);
  free(ctx->peer_size);
  free(ctx->conns);
  free(ctx);
}

/* ---- one-shot mailboxes (used by oneshot.c) ----------------------------------------- */

/* A rank's segment as this rank maps it (its own, or a peer's), NULL when not mapped. */
static uint8_t *base_of(const coll_comm_view *view, shm_ctx *ctx, int rank) {
  if (!ctx || rank < 0 || rank >= view->nranks) return NULL;
  return rank == view->rank ? ctx->base : ctx->peer_base[rank];
}

coll_mailbox *coll_shm_mailbox(const coll_comm_view *view, void *vctx, int rank, unsigned parity) {
  uint8_t *base = base_of(view, vctx, rank);
  return base ? mailbox_at(base, parity) : NULL;
}

_Atomic uint32_t *coll_shm_mailbox_waiters(const coll_comm_view *view, void *vctx, int rank) {
  uint8_t *base = base_of(view, vctx, rank);
  return base ? &((shm_header *)base)->mb_waiters : NULL;
}

/* ---- the fan-out area (used by fanout.c) --------------------------------------------- */

coll_fanout *coll_shm_fanout(const coll_comm_view *view, void *vctx, int rank) {
  uint8_t *base = base_of(view, vctx, rank);
  return base ? (coll_fanout *)(base + fanout_off()) : NULL;
}

uint8_t *coll_shm_fanout_area(const coll_comm_view *view, void *vctx, int rank) {
  uint8_t *base = base_of(view, vctx, rank);
  return base ? base + fanout_off() + fanout_ctl_bytes(view->nranks) : NULL;
}

coll_result coll_shm_fanout_warm(const coll_comm_view *view, void *vctx) {
  shm_ctx *ctx = vctx;
  if (!ctx) return COLL_OK;
  int e = populate(coll_shm_fanout_area(view, ctx, view->rank), COLL_FANOUT_BYTES);
  if (e)
    return coll_view_fail(view, COLL_ERR_SYSTEM,
                          "rank %d: no memory for the %u-byte fan-out ring of %s: %s (is "
                          "/dev/shm full?)",
                          view->rank, COLL_FANOUT_BYTES, ctx->name, strerror(e));
  return COLL_OK;
}

coll_result coll_shm_peer_check(const coll_comm_view *view, void *vctx, int peer) {
  shm_ctx *ctx = vctx;
  if (!ctx || !ctx->peer_base[peer]) return COLL_OK;
  return coll_fifo_peer_gone(view, &((shm_header *)ctx->peer_base[peer])->closed,
                             ctx->conns[2 * peer].peer_pid, peer);
}

long coll_shm_fifo_resident(const coll_comm_view *view, void *vctx, int from) {
  shm_ctx *ctx = vctx;
  if (!ctx || from < 0 || from >= view->nranks || from == view->rank || !ctx->peer_base[from])
    return -1;
  size_t pages = fifo_stride() / PAGE;
  unsigned char *vec = malloc(pages);
  if (!vec) return -1;
  long bytes = -1;
  if (mincore(fifo_ctl(ctx->base, from), fifo_stride(), vec) == 0) {
    bytes = 0;
    for (size_t i = 0; i < pages; i++) bytes += (vec[i] & 1) ? PAGE : 0;
  }
  free(vec);
  return bytes;
}

const coll_transport coll_transport_shm = {
    .name = "shm",
    .slot_bytes = SHM_SLOT_STRIDE, /* the most; connect() picks, comm.c takes the least */
    .can_connect = shm_can_connect,
    .setup = shm_setup,
    .connect = shm_connect,
    .ready = shm_ready,
    .warm = shm_warm,
    .send_slot = coll_fifo_send_slot,
    .send_post = coll_fifo_send_post,
    .recv_slot = coll_fifo_recv_slot,
    .recv_release = coll_fifo_recv_release,
    .wait = coll_fifo_wait,
    .wake = coll_fifo_wake,
    .close = shm_close,
};
