/* shm_wait.h — waiting on a word in a shared segment (shm_wait.c). */
#ifndef COLL_SHM_WAIT_H
#define COLL_SHM_WAIT_H

#include "algo.h"

/* shm's context on comm, whose segments hold the mailboxes and the fan-out rings (NULL:
 * shm is not in use). */
void *coll_shm_ctx(struct coll_comm *comm);

/* v has reached want, counting modulo 2^32 (both sides of a wrap compare right while
 * they are less than 2^31 apart). */
static inline bool coll_shm_reached(uint32_t v, uint32_t want) { return (int32_t)(v - want) >= 0; }

/* Waits until *word reaches want.  `peer` is the rank that advances it (its health is
 * looked at while we sleep); a sleeper counts itself in *sleepers, which the poster reads
 * in coll_shm_wake.  `what` names the unit of the word in the timeout's sentence ("one-shot
 * call", "fan-out byte"). */
coll_result coll_shm_wait(struct coll_comm *comm, const coll_work *w, int peer,
                          _Atomic uint32_t *word, uint32_t want, _Atomic uint32_t *sleepers,
                          const char *what);

/* After advancing *word: wakes whoever sleeps on it.  The fence pairs with a sleeper's
 * "count myself in, re-read the word, sleep" (Dekker): one of the two sees the other. */
void coll_shm_wake(_Atomic uint32_t *word, _Atomic uint32_t *sleepers);

#endif
