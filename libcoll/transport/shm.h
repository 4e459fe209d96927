/* shm.h — what shm.c offers beyond the connector contract: the one-shot mailboxes in
 * every rank's segment (oneshot.c), and the shared-segment helpers that cuda_ipc.c, the
 * launcher and the tests share (names, creation with take-over of a dead job's segment).
 *
 * Must never: take a struct coll_comm (callers on the libcoll side hand over the view
 * and shm's context, the communicator's transport_ctxs[COLL_T_SHM]).
 */
#ifndef COLL_SHM_H
#define COLL_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"

/* ---- shm mailboxes: the one-shot path for small collectives (oneshot.c) ------------
 * Every rank's segment holds two mailboxes (calls alternate between them).  `seq` is
 * the one-shot call the mailbox speaks for.  Data of up to 56 bytes starts in the same
 * cache line, so a reader that sees `seq` change has usually pulled it with it; longer
 * data starts on the next line, aligned for the reduction's vector loads (oneshot.c). */
#define COLL_MAILBOX_BYTES (64 * 1024)
#define COLL_MAILBOX_INLINE 56 /* data bytes in the flag's line; longer data starts a line on */
typedef struct {
  _Alignas(64) _Atomic uint32_t seq;
  uint32_t pad;
  uint8_t data[];
} coll_mailbox;
/* `rank`'s mailbox `parity` (0/1), or NULL when rank is not reached through shm.
 * `shm_ctx`: shm's context on this communicator (NULL: shm is not in use). */
coll_mailbox *coll_shm_mailbox(const coll_comm_view *view, void *shm_ctx, int rank,
                               unsigned parity);
/* ---- shm fan-out area: one writer, every other rank a reader (fanout.c, staged.c) ----
 * Every rank's segment holds a byte ring of COLL_FANOUT_BYTES that it alone writes, when
 * it is the root of a broadcast or stages an all-reduce, and the others read.  Positions are byte
 * counts since the communicator began, modulo 2^32 (the ring's size divides 2^32, so a position's
 * place in the ring survives the wrap): `written` is the owner's, readers[q].read rank
 * q's, each on a line of its own.  `waiters` counts readers asleep on `written`;
 * `owner_waiting` says the owner is asleep on a reader's `read`.  The area stays sparse
 * until its owner first writes it. */
#define COLL_FANOUT_BYTES (4u << 20)
typedef struct {
  _Alignas(64) _Atomic uint32_t read;
} coll_fanout_reader;
typedef struct {
  _Alignas(64) _Atomic uint32_t written;
  _Atomic uint32_t owner_waiting;
  _Alignas(64) _Atomic uint32_t waiters;
  /* staged.c: the owner's part of each staged chunk is reduced, up to this place; and
   * the count of ranks asleep on it. */
  _Alignas(64) _Atomic uint32_t reduced;
  _Atomic uint32_t reduced_waiters;
  coll_fanout_reader readers[]; /* one per rank (the owner's unused) */
} coll_fanout;
/* `rank`'s fan-out control block and its ring, or NULL when rank is not reached
 * through shm. */
coll_fanout *coll_shm_fanout(const coll_comm_view *view, void *shm_ctx, int rank);
uint8_t *coll_shm_fanout_area(const coll_comm_view *view, void *shm_ctx, int rank);
/* Makes this rank's own ring resident (once, before it first writes it): COLL_OK, or a
 * sentence when /dev/shm has no room for it. */
coll_result coll_shm_fanout_warm(const coll_comm_view *view, void *shm_ctx);

/* The count of ranks sleeping (futex) on one of `rank`'s mailboxes. */
_Atomic uint32_t *coll_shm_mailbox_waiters(const coll_comm_view *view, void *shm_ctx, int rank);
/* COLL_ERR_REMOTE (with a sentence) if `peer` aborted or died, else COLL_OK. */
coll_result coll_shm_peer_check(const coll_comm_view *view, void *shm_ctx, int peer);
/* Bytes of the FIFO from rank `from` in this rank's segment that are resident (mincore:
 * in memory, whoever touched them), control page included; 0 for a FIFO no plan used.
 * -1 when shm does not reach `from`.  For tests and diagnostics. */
long coll_shm_fifo_resident(const coll_comm_view *view, void *shm_ctx, int from);

/* ---- shared segments ------------------------------------------------------------------ */

/* The name of a rank's shared segment: /coll-<job>-<comm>-<what><rank>, where <job> is
 * the hex of the secret's first 8 bytes (every communicator split from one job keeps
 * them, so the launcher's clean-up and the tests find all of a job's segments by that
 * prefix) and <comm> of its last 8 (different for every communicator).  `what`: "" for
 * shm's FIFOs, "cu" for cuda_ipc's counters. */
void coll_shm_segment_name(char *out, size_t len, const uint8_t *secret, const char *what,
                           int rank);
/* The first bytes of every shared segment a rank creates (shm's FIFOs, cuda_ipc's
 * counters): who made it, so that a rank that finds its segment's name taken can tell a
 * segment left by a dead job (removed and made anew) from one of a live job (refused). */
typedef struct {
  _Alignas(64) _Atomic int32_t pid; /* stamped last: 0 while the creator is at it */
  int32_t rank;
  uint64_t start; /* the owner's start time (/proc/PID/stat field 22): pids get reused */
} coll_seg_owner;
/* Creates segment `name` (0600, O_EXCL) of `size` bytes, maps it and stamps its owner
 * record with this process.  A segment of that name already there is first looked at:
 * its owner dead (no such process, a zombie, or a pid now used by a process that started
 * later) — it is removed and made anew, with an INFO line; alive — COLL_ERR_SYSTEM with a
 * sentence naming the owner (two live jobs with the same secret on one host).  Memory
 * beyond the owner record is zero (fresh).  view NULL: no communicator (rank -1, the
 * sentence in this thread). */
coll_result coll_shm_create(const coll_comm_view *view, const char *name, size_t size, void **base);

/* "coll-<job>-": how the names of one job's segments begin in /dev/shm (no leading
 * slash), from its secret; what the launcher's clean-up and the tests' leak checks match,
 * so that they see only their own job's segments and never another job's. */
void coll_job_prefix(char *out, size_t len, const uint8_t *secret);

#endif
