/* window.c — memory every rank of a communicator can address: coll_mem_alloc/free.
 *
 * A user buffer from malloc is private to its process, so a collective on it has to
 * move every byte through a FIFO slot: the sender copies it in, the receiver copies it
 * out (ring.c), or ask the kernel to copy it (direct.c).  Memory from coll_mem_alloc is
 * a memfd that every other rank on the host has mapped too, so mapped.c can read a
 * peer's send buffer and write a peer's receive buffer with plain loads and stores:
 * each byte crosses memory once.  This is MPI_Win_allocate_shared / ncclMemAlloc +
 * ncclCommRegister for CPU ranks.
 *
 * Allocation is collective (every rank calls it, in the same order, sizes may differ):
 *   1. each rank creates a memfd of its size and maps it, populated (the page faults
 *      are paid here, never on a collective's hot path);
 *   2. the ranks all-gather (pid, fd, size, ok);
 *   3. when every rank is on this host, each opens /proc/<pid>/fd/<fd> of every peer
 *      and maps it, populated; an all-reduce of the outcome makes every rank agree
 *      whether the window is shared.  A window that is not shared (ranks on several
 *      hosts, /proc not readable) is still ordinary memory: collectives on it take the
 *      FIFO paths.
 * The memfd is closed once every peer has mapped it: the memory lives as long as some
 * rank maps it, and goes away with the processes even if they are killed (no name in
 * /dev/shm to leak).
 *
 * Windows live in a table whose slot numbers are the same on every rank (collective
 * allocation, lowest free slot), so a call can name a buffer to its peers as (slot,
 * offset).  The table is guarded by winmu: calls look buffers up from the executor
 * thread while the user thread may allocate.
 *
 * Must never: hand out a window some rank failed to allocate, change the table on one
 * rank only, or unmap a window while a call on it may still run (free starts with an
 * all-gather, which the executor runs after every call enqueued before it).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

typedef struct {
  int32_t pid, fd, ok, pad;
  uint64_t bytes;
} win_desc;

static size_t page_round(size_t n) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  return n == 0 ? pg : (n + pg - 1) / pg * pg;
}

/* A memfd of `len` bytes (huge: from the hugetlb pool, len rounded up to 2 MiB), mapped
 * and populated here; NULL with errno set on failure.  A shared hugetlb mapping reserves
 * its pages when it is made, so a short pool fails here and not with SIGBUS later. */
static void *map_memfd(size_t *len, bool huge, int *fd_out) {
  size_t l = *len;
  if (huge) l = (l + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  int fd = memfd_create("libcoll-window", MFD_CLOEXEC | (huge ? MFD_HUGETLB : 0));
  if (fd < 0) return NULL;
  void *m = ftruncate(fd, (off_t)l) == 0
                ? mmap(NULL, l, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0)
                : MAP_FAILED;
  if (m == MAP_FAILED) {
    int e = errno;
    close(fd);
    errno = e;
    return NULL;
  }
  *len = l, *fd_out = fd;
  return m;
}

static void unmap_window(struct coll_comm *comm, coll_window *w) {
  for (int p = 0; w->peer && p < comm->nranks; p++)
    if (w->peer[p] && p != comm->rank) munmap(w->peer[p], w->peer_bytes[p]);
  if (w->base) munmap(w->base, w->bytes);
  free(w->peer);
  free(w->peer_bytes);
  memset(w, 0, sizeof *w);
}

/* Maps every peer's memfd; false (with errno-style reason in `why`) on the first failure. */
static bool map_peers(struct coll_comm *comm, coll_window *w, const win_desc *d, char *why,
                      size_t why_len) {
  for (int p = 0; p < comm->nranks; p++) {
    if (p == comm->rank) continue;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)d[p].pid, (int)d[p].fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      snprintf(why, why_len, "opening rank %d's %s: %s", p, path, strerror(errno));
      return false;
    }
    void *m = mmap(NULL, d[p].bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) {
      snprintf(why, why_len, "mapping rank %d's %llu bytes: %s", p, (unsigned long long)d[p].bytes,
               strerror(e));
      return false;
    }
    w->peer[p] = m;
    w->peer_bytes[p] = d[p].bytes;
  }
  return true;
}

coll_result coll_mem_alloc(coll_comm_t comm, size_t bytes, void **ptr) {
  if (!comm) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_mem_alloc: comm is NULL");
  if (!ptr)
    return coll_fail(comm, COLL_ERR_INVALID_ARG, "coll_mem_alloc on rank %d: ptr is NULL",
                     comm->rank);
  *ptr = NULL;
  int n = comm->nranks, me = comm->rank;
  coll_window w = {0};
  win_desc mine = {.pid = (int32_t)getpid(), .fd = -1, .ok = 0};
  char why[200] = "";
  int slot = -1;
  pthread_mutex_lock(&comm->winmu);
  for (int i = 0; i < COLL_MAX_WINDOWS && slot < 0; i++)
    if (!comm->windows[i].base) slot = i;
  pthread_mutex_unlock(&comm->winmu);

  /* 1. This rank's memory.  Every failure still takes part in the exchange below, so
   * the peers learn of it instead of waiting. */
  size_t len = bytes > (size_t)PTRDIFF_MAX ? 0 : page_round(bytes);
  w.peer = calloc((size_t)n, sizeof *w.peer);
  w.peer_bytes = calloc((size_t)n, sizeof *w.peer_bytes);
  int fd = -1;
  if (slot < 0) {
    snprintf(why, sizeof why, "all %d windows of the communicator are in use", COLL_MAX_WINDOWS);
  } else if (!len) {
    snprintf(why, sizeof why, "%zu bytes is more than an address space holds", bytes);
  } else if (!w.peer || !w.peer_bytes) {
    snprintf(why, sizeof why, "out of memory");
  } else {
    /* COLL_HUGEPAGES=1: 2 MiB pages when the pool has them.  Off by default: the pool is
     * the administrator's, reserved for whoever they reserved it for. */
    const char *hp = getenv("COLL_HUGEPAGES");
    void *m = hp && strcmp(hp, "1") == 0 ? map_memfd(&len, true, &fd) : NULL;
    if (!m && !(m = map_memfd(&len, false, &fd))) {
      snprintf(why, sizeof why, "creating and mapping a %zu-byte memfd: %s", len, strerror(errno));
    } else {
      w.base = m, w.bytes = len, w.peer[me] = m, w.peer_bytes[me] = len;
      mine.fd = fd, mine.bytes = len, mine.ok = 1;
    }
  }

  /* 2. Who has what. */
  win_desc *all = calloc((size_t)n, sizeof *all);
  coll_result r = all ? coll_exec_bytes(comm, COLL_COLL_ALL_GATHER, &mine, all, sizeof mine,
                                        COLL_SUM, 0)
                      : coll_fail(comm, COLL_ERR_SYSTEM,
                                  "coll_mem_alloc on rank %d: out of "
                                  "memory",
                                  me);
  int failed = -1;
  for (int p = 0; r == COLL_OK && p < n && failed < 0; p++)
    if (!all[p].ok) failed = p;
  if (r == COLL_OK && failed >= 0) {
    r = failed == me ? coll_fail(comm, COLL_ERR_SYSTEM, "coll_mem_alloc on rank %d: %s", me, why)
                     : coll_fail(comm, COLL_ERR_REMOTE,
                                 "coll_mem_alloc on rank %d: rank %d "
                                 "could not allocate its part",
                                 me, failed);
  }

  /* 3. Map the peers' memory where every rank is on this host; agree on the outcome. */
  if (r == COLL_OK && n > 1 && comm->mailboxes) {
    uint8_t ok = map_peers(comm, &w, all, why, sizeof why);
    if (!ok)
      COLL_INFO(me, "coll_mem_alloc: %s; collectives on this memory use the FIFO paths", why);
    r = coll_exec_bytes(comm, COLL_COLL_ALL_REDUCE, &ok, &ok, 1, COLL_MIN, 0);
    w.shared = r == COLL_OK && ok;
    if (!w.shared) /* keep the memory, drop the peers' mappings */
      for (int p = 0; p < n; p++)
        if (p != me && w.peer[p]) munmap(w.peer[p], w.peer_bytes[p]), w.peer[p] = NULL;
  }
  if (fd >= 0) close(fd); /* every peer has mapped it (or never will) */
  free(all);
  if (r != COLL_OK) {
    unmap_window(comm, &w);
    return r;
  }
  if (!comm->mapped_where && !(comm->mapped_where = calloc((size_t)n, sizeof(coll_mapped_where)))) {
    unmap_window(comm, &w);
    return coll_fail(comm, COLL_ERR_SYSTEM, "coll_mem_alloc on rank %d: out of memory", me);
  }
  pthread_mutex_lock(&comm->winmu);
  comm->windows[slot] = w;
  if (w.shared) comm->nshared++;
  pthread_mutex_unlock(&comm->winmu);
  *ptr = w.base;
  return COLL_OK;
}

coll_result coll_mem_free(coll_comm_t comm, void *ptr) {
  if (!comm) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_mem_free: comm is NULL");
  int32_t slot = -1;
  pthread_mutex_lock(&comm->winmu);
  for (int i = 0; ptr && i < COLL_MAX_WINDOWS; i++)
    if (comm->windows[i].base == ptr) slot = i;
  pthread_mutex_unlock(&comm->winmu);
  /* Every rank must free the same window, or none does: the table stays the same on
   * all ranks.  The all-gather also waits for every earlier call on the window. */
  int n = comm->nranks;
  int32_t *all = calloc((size_t)n, sizeof *all);
  if (!all) return coll_fail(comm, COLL_ERR_SYSTEM, "coll_mem_free: out of memory");
  coll_result r = coll_exec_bytes(comm, COLL_COLL_ALL_GATHER, &slot, all, sizeof slot, COLL_SUM, 0);
  int odd = -1;
  for (int p = 0; r == COLL_OK && p < n && odd < 0; p++)
    if (all[p] != slot || all[p] < 0) odd = p;
  free(all);
  if (r != COLL_OK) return r;
  if (odd >= 0) {
    if (slot < 0)
      return coll_fail(comm, COLL_ERR_INVALID_ARG,
                       "coll_mem_free on rank %d: %p did not come "
                       "from coll_mem_alloc on this communicator (nothing freed on any rank)",
                       comm->rank, ptr);
    return coll_fail(comm, COLL_ERR_MISMATCH,
                     "coll_mem_free on rank %d: rank %d frees a "
                     "different window (or none), so no rank frees anything",
                     comm->rank, odd);
  }
  pthread_mutex_lock(&comm->winmu);
  if (comm->windows[slot].shared) comm->nshared--;
  coll_window w = comm->windows[slot];
  memset(&comm->windows[slot], 0, sizeof w);
  pthread_mutex_unlock(&comm->winmu);
  unmap_window(comm, &w);
  return COLL_OK;
}

bool coll_window_find(struct coll_comm *comm, const void *p, size_t bytes, int32_t *slot,
                      uint64_t *off) {
  const uint8_t *a = p;
  for (int i = 0; a && i < COLL_MAX_WINDOWS; i++) {
    const coll_window *w = &comm->windows[i];
    if (w->shared && a >= w->base && (size_t)(a - w->base) <= w->bytes &&
        bytes <= w->bytes - (size_t)(a - w->base)) {
      *slot = i, *off = (uint64_t)(a - w->base);
      return true;
    }
  }
  return false;
}

uint8_t *coll_window_peer(struct coll_comm *comm, int32_t slot, int p, uint64_t off, size_t bytes) {
  if (slot < 0 || slot >= COLL_MAX_WINDOWS) return NULL;
  const coll_window *w = &comm->windows[slot];
  return w->shared && w->peer[p] && off <= w->peer_bytes[p] && bytes <= w->peer_bytes[p] - off
             ? w->peer[p] + off
             : NULL;
}

void coll_windows_free(struct coll_comm *comm) {
  for (int i = 0; comm->windows && i < COLL_MAX_WINDOWS; i++)
    if (comm->windows[i].base) unmap_window(comm, &comm->windows[i]);
  free(comm->windows);
  comm->windows = NULL;
  free(comm->mapped_where);
  comm->mapped_where = NULL;
  comm->nshared = 0;
}
