/* ib_regcache.h — a cache of memory registrations (ibv_reg_mr) keyed by address range.
 *
 * Registering memory with an HCA pins its pages and costs a system call plus page-table
 * work (tens of microseconds for small buffers, milliseconds for large ones), so a buffer
 * used again is looked up here instead of registered again.  Entries cover page-aligned
 * ranges [start, end); a lookup hits any live entry that covers the asked range.  On a
 * miss, unused entries that overlap or touch the new range are merged into one larger
 * registration (a buffer that grows keeps one entry), and when the cache is at its entry
 * or byte limit the least recently used unused entry is evicted.  Entries in use (refs
 * > 0) are never deregistered; invalidate() (memory about to be freed) marks them stale
 * so that they are dropped when their last user puts them back.
 *
 * Pure: the actual register/deregister calls are callbacks, so the logic is tested
 * without an HCA.  Not thread-safe (one per transport context, used by one thread).
 * Must never allocate after init, or deregister an entry that someone holds.
 */
#ifndef COLL_IB_REGCACHE_H
#define COLL_IB_REGCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  /* Registers [start, start+len); returns 0 and fills handle/keys, or -1 with a reason. */
  int (*reg)(void *arg, uintptr_t start, size_t len, void **handle, uint32_t *lkey, uint32_t *rkey,
             char *why, size_t why_len);
  void (*dereg)(void *arg, void *handle);
  void *arg;
} coll_ib_reg_ops;

typedef struct {
  uintptr_t start, end; /* page-aligned, end exclusive */
  void *handle;         /* the ibv_mr (or the test's fake) */
  uint32_t lkey, rkey;
  uint32_t refs;
  bool stale; /* invalidated while in use: never hit again, dropped at refs == 0 */
  bool used;  /* this pool slot holds an entry */
  uint64_t last_use;
} coll_ib_reg;

typedef struct {
  coll_ib_reg_ops ops;
  size_t page;          /* power of two */
  int cap;              /* most entries */
  size_t max_bytes;     /* most bytes registered through the cache; 0 = no limit */
  coll_ib_reg *pool;    /* cap entries */
  coll_ib_reg **sorted; /* live entries by start address, n of them */
  int n;
  size_t bytes;
  uint64_t clock;
  uint64_t hits, misses, evictions, merges;
} coll_ib_regcache;

/* 0, or -1 when out of memory or the arguments are unusable (page not a power of two,
 * cap < 1). */
int coll_ib_regcache_init(coll_ib_regcache *c, const coll_ib_reg_ops *ops, size_t page, int cap,
                          size_t max_bytes);
/* A registration covering [addr, addr+len) (len 0 counts as 1), its reference count
 * raised; NULL with a reason if registering failed or every entry is in use. */
coll_ib_reg *coll_ib_regcache_get(coll_ib_regcache *c, uintptr_t addr, size_t len, char *why,
                                  size_t why_len);
/* Gives back one reference taken by get(). */
void coll_ib_regcache_put(coll_ib_regcache *c, coll_ib_reg *r);
/* The memory [addr, addr+len) is going away: unused overlapping entries are deregistered
 * now, used ones when put back.  Returns how many were deregistered now. */
int coll_ib_regcache_invalidate(coll_ib_regcache *c, uintptr_t addr, size_t len);
/* Deregisters everything; returns how many entries were still referenced (a caller bug). */
int coll_ib_regcache_destroy(coll_ib_regcache *c);

#endif
