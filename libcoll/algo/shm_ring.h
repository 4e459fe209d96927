/* shm_ring.h — places in a rank's shared ring (shm.h's fan-out area), as the fan-out
 * broadcast (fanout.c) and the staged rows (staged.c) count them, and the wait for room.
 *
 * A place is a byte count since the communicator began, modulo 2^32 (the ring's size
 * divides 2^32, so a place keeps its slot across the wrap).  A call cuts its bytes into
 * chunks of g (a power of two dividing the ring) and starts at the first whole chunk
 * after where the ring's last call ended, so no chunk wraps round the ring's end, and
 * the owner and every reader find every place without a message: they count the same
 * calls.
 *
 * Must never: hold state; every rank computes the same places from the same calls.
 */
#ifndef COLL_SHM_RING_H
#define COLL_SHM_RING_H

#include "algo.h"

_Static_assert((COLL_FANOUT_BYTES & (COLL_FANOUT_BYTES - 1)) == 0,
               "the ring's size divides 2^32: a place modulo 2^32 keeps its slot");

/* The first whole chunk of g at or after `at`. */
static inline uint32_t coll_shm_ring_start(uint32_t at, uint32_t g) {
  return (at + g - 1) & ~(g - 1);
}

/* Where the call after one of `bytes` that started at `base` starts. */
static inline uint32_t coll_shm_ring_next(uint32_t base, size_t bytes, uint32_t g) {
  return coll_shm_ring_start(base + (uint32_t)bytes, g); /* modulo 2^32, as places count */
}

/* A place's byte in the ring `area`. */
static inline uint8_t *coll_shm_ring_slot(uint8_t *area, uint32_t place) {
  return area + (place & (COLL_FANOUT_BYTES - 1));
}

/* A streamed call's chunk: 64 KiB (a FIFO slot: small enough to pipeline a call of a
 * few hundred KiB) up to 8 MiB, then doubling with the call up to 512 KiB from 32 MiB
 * (the same on every rank: it depends on the call alone). */
#define COLL_SHM_RING_CHUNK (64u * 1024)
#define COLL_SHM_RING_CHUNK_MAX (512u * 1024)
_Static_assert(COLL_FANOUT_BYTES % COLL_SHM_RING_CHUNK_MAX == 0 &&
                   COLL_FANOUT_BYTES / COLL_SHM_RING_CHUNK_MAX >= 2,
               "whole chunks, at least two, fit the ring");
static inline uint32_t coll_shm_ring_chunk(size_t bytes) {
  uint32_t g = COLL_SHM_RING_CHUNK;
  for (size_t b = bytes / (4u << 20); b >= 2 && g < COLL_SHM_RING_CHUNK_MAX; b /= 2) g *= 2;
  return g;
}

/* The owner of ring `fo`, before writing the places before `end`: waits until every
 * other rank has read up to `end` less a ring.  *free_to (a place every reader has
 * passed, once *scanned) saves looking again while it still covers what is asked.
 * `what` names the unit in a timeout's sentence. */
coll_result coll_shm_ring_wait_room(struct coll_comm *comm, const coll_work *w, coll_fanout *fo,
                                    uint32_t end, uint32_t *free_to, bool *scanned,
                                    const char *what);

#endif
