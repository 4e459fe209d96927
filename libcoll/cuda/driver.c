/* driver.c — is the CUDA driver (libcuda.so) loaded in this process?
 *
 * Why ask.  Nothing can have allocated device memory before the driver was loaded, so a
 * job that never touched CUDA (libcoll links the CUDA runtime statically and loads the
 * driver only when called) pays for no probe, no context and no pointer query per call.
 * A program may load the driver after its communicators exist (torch, on its first CUDA
 * call), so the question is asked before every call that moves data: it must be cheap.
 *
 * How, cheaply.  The loader appends every object it loads to the end of its list of link
 * maps (struct link_map in <link.h>, the list debuggers read through r_debug), under its
 * own lock.  So nothing is loaded without the l_next of the list's last object changing
 * from NULL.  We keep the last object we saw (the "tail"), and per call read only its
 * l_next, one load (0.6 ns, where dl_iterate_phdr, which takes the loader's lock, costs
 * 12 ns on our VM): NULL means nothing was loaded since the list was last searched, and
 * the answer has not changed.  Otherwise the list is searched again, under the loader's
 * lock (dl_iterate_phdr), and the new tail kept.
 *
 * The tail must not be freed while a call reads it, and a program may dlclose any object
 * it dlopened: so each tail is pinned by a reference of our own (dlopen with
 * RTLD_NOLOAD), and never released — a thread may still be reading an old tail when a
 * new one is taken, and nothing tells us when it has finished.  The cost: an object that
 * was last in the list when libcoll looked stays mapped after the program's dlclose
 * (POSIX lets dlclose keep an object), one such object per search, and searches happen
 * only after the program loaded something new.  Where a tail cannot be pinned the check
 * falls back to the loader's count of objects ever added (dl_iterate_phdr's dlpi_adds,
 * under the loader's lock): correct, and as slow as before.  Once seen, the driver stays
 * seen: nothing unloads it.
 *
 * Reading l_next while the loader may be writing it: the loader's store happens
 * before anything the program can do with the object it loaded (allocate device memory,
 * hand a pointer to another thread through its own synchronisation), so a call that
 * could be given a device pointer sees the store.  A load that races a dlopen running in
 * another thread may miss it, as dl_iterate_phdr called a moment earlier would.
 *
 * Must never: call CUDA, print, or take the loader's lock on the per-call path once a
 * tail is pinned.
 */
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

static _Atomic bool driver_seen;
static _Atomic(struct link_map *) tail;      /* pinned; NULL before the first search */
static _Atomic unsigned long long adds_seen; /* the loader's count at the last search */
static pthread_mutex_t search_mu = PTHREAD_MUTEX_INITIALIZER;

static int first_object(struct dl_phdr_info *info, size_t size, void *adds) {
  (void)size;
  *(unsigned long long *)adds = info->dlpi_adds;
  return 1;
}
/* Visits every object, so the name left in `name` is the last one's ("" for the
 * program itself). */
static int last_name(struct dl_phdr_info *info, size_t size, void *name) {
  (void)size;
  snprintf(name, PATH_MAX, "%s", info->dlpi_name ? info->dlpi_name : "");
  return 0;
}
static int is_driver(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size, (void)arg;
  const char *slash = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
  const char *base = slash ? slash + 1 : info->dlpi_name;
  return base && strncmp(base, "libcuda.so", 10) == 0;
}

/* The list's last object, with a reference held on it; NULL if it could not be had (it
 * was unloaded in between, or its name does not open it again).  One reference per
 * object: when the last object is still `now` (what was loaded after it is gone again),
 * the one it already holds is enough. */
static struct link_map *pin_tail(struct link_map *now) {
  char name[PATH_MAX];
  name[0] = '\0';
  dl_iterate_phdr(last_name, name);
  void *h = dlopen(name[0] ? name : NULL, RTLD_NOLOAD | RTLD_LAZY);
  if (!h) return NULL;
  struct link_map *lm = NULL;
  if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || !lm || lm == now) {
    dlclose(h);
    return lm == now ? now : NULL;
  }
  return lm; /* the reference is never dropped: see the top of the file */
}

/* The slow path: something was loaded since the last search (or there was none). */
__attribute__((noinline)) static bool search(void) { /* off the fast path */
  pthread_mutex_lock(&search_mu);
  bool found = atomic_load(&driver_seen);
  unsigned long long adds = 0;
  dl_iterate_phdr(first_object, &adds);
  if (!found && adds != atomic_load_explicit(&adds_seen, memory_order_relaxed)) {
    /* Pin first, then search: whatever is loaded after the pin moves its l_next, and
     * everything up to it is in the search. */
    struct link_map *t = pin_tail(atomic_load_explicit(&tail, memory_order_relaxed));
    found = dl_iterate_phdr(is_driver, NULL) != 0;
    if (found) atomic_store(&driver_seen, true);
    atomic_store_explicit(&adds_seen, adds, memory_order_relaxed);
    if (t) atomic_store_explicit(&tail, t, memory_order_release);
  }
  pthread_mutex_unlock(&search_mu);
  return found;
}

/* The one read of the loader's memory on the fast path.  The loader writes l_next under
 * its own lock, which ThreadSanitizer cannot see (ld.so is not instrumented): it would
 * take the first read after another thread's dlopen for a race with the calloc that
 * made the map.  The read is atomic; the order comes from the loader's lock. */
__attribute__((no_sanitize_thread)) static struct link_map *next_of(struct link_map *t) {
  return __atomic_load_n(&t->l_next, __ATOMIC_ACQUIRE);
}

bool coll_cuda_driver_loaded(void) {
  if (atomic_load_explicit(&driver_seen, memory_order_relaxed)) return true;
  struct link_map *t = atomic_load_explicit(&tail, memory_order_acquire);
  if (t && next_of(t) == NULL) return false;
  return search();
}
