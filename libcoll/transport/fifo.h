/* fifo.h — the slot ring that shm.c and cuda_ipc.c share: one sender, one receiver, the
 * counters in host shared memory, the slots wherever the transport keeps them (shared
 * memory for shm, the receiver's GPU memory for cuda_ipc).
 *
 *   control (one page of host shared memory per direction and peer):
 *     tail         slots written, by the sender      (release store, acquire load)
 *     tail_waiter  the receiver is (about to be) asleep on tail
 *     head         slots consumed, by the receiver
 *     head_waiter  the sender is (about to be) asleep on head
 *     bytes[i]     valid bytes in slot i
 *   The sender may fill slot tail % nslots while tail - head < nslots.
 *
 * Waiting: spin (cheap when the peer runs on another core), then yield (cheap when ranks
 * share cores), then sleep on the futex of the counter it waits for, raising its waiter
 * flag first (the Dekker pairing with the other side's "store counter, fence, read
 * flag"); a sleep that times out with nothing new looks at the peer's health: its
 * "aborted" flag, and whether its process is gone (base/proc.h, zombies included).
 *
 * Must never: block without a bound, allocate, or touch the slots themselves (the
 * transport's memory ops move the bytes; this file only moves the counters).
 */
#ifndef COLL_FIFO_H
#define COLL_FIFO_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "transport.h"

#define COLL_FIFO_MAX_SLOTS 8

typedef struct {
  _Alignas(64) _Atomic uint32_t tail;
  _Atomic uint32_t tail_waiter;
  _Alignas(64) _Atomic uint32_t head;
  _Atomic uint32_t head_waiter;
  _Alignas(64) uint32_t bytes[COLL_FIFO_MAX_SLOTS];
} coll_fifo_ctl;

/* One end of a ring.  base.nslots must be a power of two, at most COLL_FIFO_MAX_SLOTS. */
typedef struct {
  coll_conn base;
  coll_fifo_ctl *ctl;
  uint8_t *slots; /* slot i at slots + i * stride */
  size_t stride;
  uint32_t pos;                 /* sender: tail; receiver: head (kept locally too) */
  uint32_t cached;              /* sender: last head seen; receiver: last tail seen */
  _Atomic int32_t *peer_closed; /* set when the peer aborted its communicator */
  pid_t peer_pid;
} coll_fifo_conn;

/* The transport table's data path, for a coll_fifo_conn. */
void *coll_fifo_send_slot(coll_conn *c);
void coll_fifo_send_post(coll_conn *c, uint32_t bytes);
const void *coll_fifo_recv_slot(coll_conn *c, uint32_t *bytes);
void coll_fifo_recv_release(coll_conn *c);
coll_result coll_fifo_wait(const coll_comm_view *view, coll_conn *c, int max_ms);
void coll_fifo_wake(coll_conn *c);
/* COLL_ERR_REMOTE with a sentence when `peer` aborted (*closed) or its process is gone;
 * COLL_OK otherwise.  Reads /proc: only after a quiet spell. */
coll_result coll_fifo_peer_gone(const coll_comm_view *view, _Atomic int32_t *closed, pid_t pid,
                                int peer);

#endif
