/* shm_wait.c — waiting for a word in a shared segment to reach a value: the one-shot
 * mailboxes' call numbers (oneshot.c) and the shared rings' byte counts (fanout.c,
 * staged.c), and a ring's owner waiting for room (every reader's count).
 *
 * A waiter spins while it has a core of its own, then yields (coll_yield: not while
 * something outside the job holds the core, backoff.c says why), then sleeps on a futex
 * on the word, having counted itself in the word's sleepers; whoever advances the word
 * fences and reads that count (coll_shm_wake), so a post never misses a sleeper.  Asleep,
 * it wakes every 100 ms to look at the peer's health, the communicator's abort flag, a
 * failure elsewhere in the job, and its deadline.
 *
 * Must never: wait without checking abort, peer health and the deadline, or allocate.
 */
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shm_ring.h"
#include "shm_wait.h"

void *coll_shm_ctx(struct coll_comm *comm) {
  return comm->transports[COLL_T_SHM] == &coll_transport_shm ? comm->transport_ctxs[COLL_T_SHM]
                                                             : NULL;
}

static coll_result timed_out(struct coll_comm *comm, const coll_work *w, int peer, uint32_t want,
                             uint32_t seen, const char *what) {
  return coll_fail(comm, COLL_ERR_TIMEOUT,
                   "rank %d timed out after %d ms waiting for rank %d in %s #%llu (count %zu, "
                   "%s, %s %u): rank %d was last seen at %s %u",
                   comm->rank, comm->timeout_ms, peer, coll_coll_name(w->coll),
                   (unsigned long long)w->seq, w->count, coll_dtype_name(w->dtype), what, want,
                   peer, what, seen);
}

coll_result coll_shm_wait(struct coll_comm *comm, const coll_work *w, int peer,
                          _Atomic uint32_t *word, uint32_t want, _Atomic uint32_t *sleepers,
                          const char *what) {
  if (coll_shm_reached(atomic_load_explicit(word, memory_order_acquire), want)) return COLL_OK;
  int spins = comm->oversubscribed ? 0 : 1000; /* ~25 us of pause here */
  for (int i = 0; i < spins; i++) {
    coll_cpu_relax();
    if (coll_shm_reached(atomic_load_explicit(word, memory_order_acquire), want)) return COLL_OK;
  }
  for (int i = 0; i < 256 && coll_yield(&comm->mates); i++) /* false: sleep now */
    if (coll_shm_reached(atomic_load_explicit(word, memory_order_acquire), want)) return COLL_OK;
  uint64_t start = coll_now_ns();
  for (;;) {
    if (atomic_load_explicit(&comm->aborted, memory_order_relaxed))
      return coll_fail(comm, COLL_ERR_REMOTE, "rank %d: communicator aborted during %s #%llu",
                       comm->rank, coll_coll_name(w->coll), (unsigned long long)w->seq);
    uint32_t seen = atomic_load_explicit(word, memory_order_acquire);
    if (coll_shm_reached(seen, want)) return COLL_OK;
    atomic_fetch_add(sleepers, 1);
    if (!coll_shm_reached(atomic_load(word), want)) {
      struct timespec ts = {.tv_sec = 0, .tv_nsec = 100 * 1000000L};
      syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, &ts, NULL, 0);
    }
    atomic_fetch_sub(sleepers, 1);
    seen = atomic_load_explicit(word, memory_order_acquire);
    if (coll_shm_reached(seen, want)) return COLL_OK;
    coll_result r = coll_shm_peer_check(&comm->view, coll_shm_ctx(comm), peer);
    if (r != COLL_OK) return r;
    if ((r = comm->exec_ops->watch(comm, w)) != COLL_OK) return r; /* a failure elsewhere */
    if (comm->timeout_ms && coll_now_ns() - start > (uint64_t)comm->timeout_ms * 1000000u)
      return timed_out(comm, w, peer, want, seen, what);
  }
}

void coll_shm_wake(_Atomic uint32_t *word, _Atomic uint32_t *sleepers) {
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(sleepers, memory_order_relaxed))
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

coll_result coll_shm_ring_wait_room(struct coll_comm *comm, const coll_work *w, coll_fanout *fo,
                                    uint32_t end, uint32_t *free_to, bool *scanned,
                                    const char *what) {
  uint32_t need = end - COLL_FANOUT_BYTES;
  if (*scanned && coll_shm_reached(*free_to, need)) return COLL_OK;
  uint32_t least = end; /* the slowest reader, once all have read what `need` asks */
  for (int q = 0; q < comm->nranks; q++) {
    if (q == comm->rank) continue;
    _Atomic uint32_t *rd = &fo->readers[q].read;
    coll_result r = coll_shm_wait(comm, w, q, rd, need, &fo->owner_waiting, what);
    if (r != COLL_OK) return r;
    uint32_t at = atomic_load_explicit(rd, memory_order_acquire);
    if (!coll_shm_reached(at, least)) least = at;
  }
  *free_to = least, *scanned = true;
  return COLL_OK;
}
