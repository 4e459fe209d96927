/* ib_regcache.c — the registration cache (see ib_regcache.h for the rules).
 *
 * Entries live in a fixed pool; `sorted` holds the live ones ordered by start address.
 * Lookups binary-search the last entry starting at or below the address and walk back:
 * live entries overlap only when one was in use while the other was made, so the walk
 * is short.  Must never allocate after init or drop an entry whose refs > 0.
 */
#include "ib_regcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int coll_ib_regcache_init(coll_ib_regcache *c, const coll_ib_reg_ops *ops, size_t page, int cap,
                          size_t max_bytes) {
  memset(c, 0, sizeof *c);
  if (!ops || !ops->reg || !ops->dereg || page == 0 || (page & (page - 1)) || cap < 1) return -1;
  c->ops = *ops;
  c->page = page;
  c->cap = cap;
  c->max_bytes = max_bytes;
  c->pool = calloc((size_t)cap, sizeof *c->pool);
  c->sorted = calloc((size_t)cap, sizeof *c->sorted);
  if (!c->pool || !c->sorted) {
    free(c->pool);
    free(c->sorted);
    c->pool = NULL;
    c->sorted = NULL;
    return -1;
  }
  return 0;
}

/* Index of the first live entry whose start is > addr (0..n). */
static int upper(const coll_ib_regcache *c, uintptr_t addr) {
  int lo = 0, hi = c->n;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (c->sorted[mid]->start <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static void remove_at(coll_ib_regcache *c, int i) {
  coll_ib_reg *r = c->sorted[i];
  c->ops.dereg(c->ops.arg, r->handle);
  c->bytes -= r->end - r->start;
  memset(r, 0, sizeof *r);
  memmove(&c->sorted[i], &c->sorted[i + 1], (size_t)(c->n - i - 1) * sizeof *c->sorted);
  c->n--;
}

static int index_of(const coll_ib_regcache *c, const coll_ib_reg *r) {
  for (int i = 0; i < c->n; i++)
    if (c->sorted[i] == r) return i;
  return -1;
}

/* Evicts the least recently used unused entry not covered by [keep_a, keep_b) (those are
 * about to be merged anyway); false if there is none. */
static bool evict_one(coll_ib_regcache *c, uintptr_t keep_a, uintptr_t keep_b) {
  int victim = -1;
  for (int i = 0; i < c->n; i++) {
    coll_ib_reg *r = c->sorted[i];
    if (r->refs || (r->start >= keep_a && r->end <= keep_b)) continue;
    if (victim < 0 || r->last_use < c->sorted[victim]->last_use) victim = i;
  }
  if (victim < 0) return false;
  remove_at(c, victim);
  c->evictions++;
  return true;
}

coll_ib_reg *coll_ib_regcache_get(coll_ib_regcache *c, uintptr_t addr, size_t len, char *why,
                                  size_t why_len) {
  if (len == 0) len = 1;
  if (len > UINTPTR_MAX - c->page || addr > UINTPTR_MAX - c->page - len) {
    snprintf(why, why_len, "range at %#lx of %zu bytes wraps the address space",
             (unsigned long)addr, len);
    return NULL;
  }
  uintptr_t want_end = addr + len;
  c->clock++;
  for (int i = upper(c, addr) - 1; i >= 0; i--) {
    coll_ib_reg *r = c->sorted[i];
    if (!r->stale && r->end >= want_end) {
      r->refs++;
      r->last_use = c->clock;
      c->hits++;
      return r;
    }
  }
  c->misses++;
  uintptr_t a = addr & ~(uintptr_t)(c->page - 1);
  uintptr_t b = (want_end + c->page - 1) & ~(uintptr_t)(c->page - 1);
  /* Grow [a, b) over every unused entry it overlaps or touches, until nothing changes;
   * skip the merge when the union would exceed the byte limit on its own. */
  for (bool grew = true; grew;) {
    grew = false;
    for (int i = 0; i < c->n; i++) {
      coll_ib_reg *r = c->sorted[i];
      if (r->refs || r->stale || r->end < a || r->start > b) continue;
      uintptr_t na = r->start < a ? r->start : a, nb = r->end > b ? r->end : b;
      if (c->max_bytes && nb - na > c->max_bytes) continue;
      if (na != a || nb != b) grew = true;
      a = na;
      b = nb;
    }
  }
  if (c->max_bytes && b - a > c->max_bytes) {
    snprintf(why, why_len, "a %zu-byte registration exceeds the cache's limit of %zu bytes",
             (size_t)(b - a), c->max_bytes);
    return NULL;
  }
  /* Entries inside [a, b) and unused are replaced by the new one. */
  int absorbed = 0;
  size_t absorbed_bytes = 0;
  for (int i = 0; i < c->n; i++) {
    coll_ib_reg *r = c->sorted[i];
    if (!r->refs && r->start >= a && r->end <= b) {
      absorbed++;
      absorbed_bytes += r->end - r->start;
    }
  }
  while (c->n - absorbed + 1 > c->cap ||
         (c->max_bytes && c->bytes - absorbed_bytes + (b - a) > c->max_bytes)) {
    if (!evict_one(c, a, b)) {
      snprintf(why, why_len,
               "the registration cache is full: %d regions (%zu bytes) are in "
               "use",
               c->n, c->bytes);
      return NULL;
    }
  }
  void *h = NULL;
  uint32_t lkey = 0, rkey = 0;
  char reason[160] = "";
  if (c->ops.reg(c->ops.arg, a, (size_t)(b - a), &h, &lkey, &rkey, reason, sizeof reason) != 0) {
    snprintf(why, why_len, "registering %zu bytes at %#lx failed: %s", (size_t)(b - a),
             (unsigned long)a, reason);
    return NULL;
  }
  /* Registered: now the absorbed entries can go. */
  for (int i = c->n - 1; i >= 0; i--) {
    coll_ib_reg *r = c->sorted[i];
    if (!r->refs && r->start >= a && r->end <= b) {
      remove_at(c, i);
      c->merges++;
    }
  }
  coll_ib_reg *slot = NULL;
  for (int i = 0; i < c->cap && !slot; i++)
    if (!c->pool[i].used) slot = &c->pool[i];
  /* The eviction loop left room: a free pool slot exists. */
  *slot = (coll_ib_reg){.start = a,
                        .end = b,
                        .handle = h,
                        .lkey = lkey,
                        .rkey = rkey,
                        .refs = 1,
                        .used = true,
                        .last_use = c->clock};
  int at = upper(c, a);
  memmove(&c->sorted[at + 1], &c->sorted[at], (size_t)(c->n - at) * sizeof *c->sorted);
  c->sorted[at] = slot;
  c->n++;
  c->bytes += b - a;
  return slot;
}

void coll_ib_regcache_put(coll_ib_regcache *c, coll_ib_reg *r) {
  if (!r || !r->used || r->refs == 0) return;
  r->refs--;
  if (r->refs == 0 && r->stale) {
    int i = index_of(c, r);
    if (i >= 0) remove_at(c, i);
  }
}

int coll_ib_regcache_invalidate(coll_ib_regcache *c, uintptr_t addr, size_t len) {
  if (len == 0) return 0;
  uintptr_t end = addr > UINTPTR_MAX - len ? UINTPTR_MAX : addr + len;
  int dropped = 0;
  for (int i = c->n - 1; i >= 0; i--) {
    coll_ib_reg *r = c->sorted[i];
    if (r->end <= addr || r->start >= end) continue;
    if (r->refs) {
      r->stale = true;
    } else {
      remove_at(c, i);
      dropped++;
    }
  }
  return dropped;
}

int coll_ib_regcache_destroy(coll_ib_regcache *c) {
  int held = 0;
  while (c->n > 0) {
    held += c->sorted[c->n - 1]->refs > 0;
    remove_at(c, c->n - 1);
  }
  free(c->pool);
  free(c->sorted);
  c->pool = NULL;
  c->sorted = NULL;
  return held;
}
