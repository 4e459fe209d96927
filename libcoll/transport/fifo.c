/* fifo.c — the slot ring of shm.c and cuda_ipc.c (fifo.h says how it works).
 *
 * Must never: block without a bound, allocate, or touch the slots' bytes.
 */
#include "fifo.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base.h"
#include "proc.h"

static inline uint32_t slot_of(const coll_fifo_conn *c, uint32_t pos) {
  return pos & (c->base.nslots - 1); /* nslots is a power of two */
}

static void futex_wake(_Atomic uint32_t *addr) {
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, 1, NULL, NULL, 0);
}

void *coll_fifo_send_slot(coll_conn *cc) {
  coll_fifo_conn *s = (coll_fifo_conn *)cc;
  if (s->pos - s->cached >= s->base.nslots) {
    s->cached = atomic_load_explicit(&s->ctl->head, memory_order_acquire);
    if (s->pos - s->cached >= s->base.nslots) return NULL;
  }
  return s->slots + (size_t)slot_of(s, s->pos) * s->stride;
}

void coll_fifo_send_post(coll_conn *cc, uint32_t bytes) {
  coll_fifo_conn *s = (coll_fifo_conn *)cc;
  s->ctl->bytes[slot_of(s, s->pos)] = bytes;
  s->pos++;
  atomic_store_explicit(&s->ctl->tail, s->pos, memory_order_release);
  /* Dekker pairing with the receiver's "raise flag, re-check tail, sleep": with both
   * sides sequentially consistent, one of them sees the other's store. */
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&s->ctl->tail_waiter, memory_order_relaxed)) futex_wake(&s->ctl->tail);
}

const void *coll_fifo_recv_slot(coll_conn *cc, uint32_t *bytes) {
  coll_fifo_conn *r = (coll_fifo_conn *)cc;
  if (r->pos == r->cached) {
    r->cached = atomic_load_explicit(&r->ctl->tail, memory_order_acquire);
    if (r->pos == r->cached) return NULL;
  }
  uint32_t i = slot_of(r, r->pos);
  *bytes = r->ctl->bytes[i];
  return r->slots + (size_t)i * r->stride;
}

void coll_fifo_recv_release(coll_conn *cc) {
  coll_fifo_conn *r = (coll_fifo_conn *)cc;
  r->pos++;
  atomic_store_explicit(&r->ctl->head, r->pos, memory_order_release);
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&r->ctl->head_waiter, memory_order_relaxed)) futex_wake(&r->ctl->head);
}

static bool can_go(coll_fifo_conn *c) {
  if (c->base.is_send)
    return c->pos - atomic_load_explicit(&c->ctl->head, memory_order_acquire) < c->base.nslots;
  return atomic_load_explicit(&c->ctl->tail, memory_order_acquire) != c->pos;
}

coll_result coll_fifo_peer_gone(const coll_comm_view *view, _Atomic int32_t *closed, pid_t pid,
                                int peer) {
  if (atomic_load(closed))
    return coll_view_fail(view, COLL_ERR_REMOTE, "rank %d: peer rank %d aborted its communicator",
                          view->rank, peer);
  const char *how = coll_process_gone(pid);
  if (how)
    return coll_view_fail(view, COLL_ERR_REMOTE, "rank %d: peer rank %d (pid %d) has died%s",
                          view->rank, peer, (int)pid, how);
  return COLL_OK;
}

coll_result coll_fifo_wait(const coll_comm_view *view, coll_conn *cc, int max_ms) {
  coll_fifo_conn *c = (coll_fifo_conn *)cc;
  /* When ranks outnumber cores the peer we wait for is likely not running: spinning
   * would only keep it off the core, so go straight to yielding. */
  int spins = view->oversubscribed ? 0 : 1000;
  for (int i = 0; i < spins; i++) {
    if (can_go(c)) return COLL_OK;
    coll_cpu_relax();
  }
  for (int i = 0; i < 64; i++) {
    if (can_go(c)) return COLL_OK;
    if (!coll_yield(view->mates)) break; /* the core is held by something outside the job: sleep */
  }
  _Atomic uint32_t *word = c->base.is_send ? &c->ctl->head : &c->ctl->tail;
  _Atomic uint32_t *flag = c->base.is_send ? &c->ctl->head_waiter : &c->ctl->tail_waiter;
  uint32_t seen = atomic_load(word);
  atomic_store(flag, 1);
  atomic_thread_fence(memory_order_seq_cst);
  coll_result r = COLL_OK;
  if (!can_go(c) && !atomic_load(view->aborted)) {
    int ms = max_ms < 1 ? 1 : max_ms;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    long rc = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, &ts, NULL, 0);
    if (rc != 0 && errno == ETIMEDOUT && !can_go(c)) /* a long quiet spell */
      r = coll_fifo_peer_gone(view, c->peer_closed, c->peer_pid, c->base.peer);
  }
  atomic_store(flag, 0);
  return r;
}

void coll_fifo_wake(coll_conn *cc) {
  coll_fifo_conn *c = (coll_fifo_conn *)cc;
  futex_wake(c->base.is_send ? &c->ctl->head : &c->ctl->tail);
}
