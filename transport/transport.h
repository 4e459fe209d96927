/* transport.h — the one connector interface every transport implements.
 *
 * A connection is a FIFO of `nslots` fixed-size slots in the receiver's memory with two
 * counters: the sender's `tail` (slots written) and the receiver's `head` (slots
 * consumed).  The sender may fill slot tail % nslots only while tail - head < nslots.
 * That is the whole contract between the executor and a transport: shm keeps the FIFO
 * in a shared segment; tcp/ib/cuda_ipc map the same counters onto their own hardware.
 *
 * The data-path calls never block and never allocate: they return NULL when the FIFO
 * is full (send) or empty (recv), and the executor calls `wait` to sleep until that
 * may have changed.  Only `wait` may sleep, and it returns within `max_ms`.
 */
#ifndef COLL_TRANSPORT_H
#define COLL_TRANSPORT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coll.h"

struct coll_comm;
typedef struct coll_conn coll_conn;
typedef struct coll_transport coll_transport;

/* The part of a connection every transport shares; each transport embeds it first. */
struct coll_conn {
  const coll_transport *t;
  int peer;
  bool is_send;
  size_t slot_bytes;
  uint32_t nslots;
};

struct coll_transport {
  const char *name;
  /* connect() runs when the executor first needs the peer (comm.c), not during init:
   * the transport accepts its peers' connections at any time after ready(). */
  bool lazy;
  /* Can this transport connect this rank to `peer` (e.g. same host for shm)? */
  bool (*can_connect)(struct coll_comm *comm, int peer);
  /* Creates this rank's local resources and writes the info peers need into `blob`
   * (at most COLL_CONN_BLOB bytes). */
  coll_result (*setup)(struct coll_comm *comm, void **ctx, void *blob);
  /* Builds the send and receive connections with `peer` from the peer's blob. */
  coll_result (*connect)(struct coll_comm *comm, void *ctx, int peer, const void *peer_blob,
                         coll_conn **send, coll_conn **recv);
  /* Called once every rank has connected (shm unlinks its segment here). */
  coll_result (*ready)(struct coll_comm *comm, void *ctx);

  /* Data path.  send_slot: the next free slot or NULL; send_post publishes it with
   * `bytes` valid bytes.  recv_slot: the next filled slot (its size in *bytes) or NULL;
   * recv_release hands it back. */
  void *(*send_slot)(coll_conn *c);
  void (*send_post)(coll_conn *c, uint32_t bytes);
  const void *(*recv_slot)(coll_conn *c, uint32_t *bytes);
  void (*recv_release)(coll_conn *c);
  /* Sleeps until send_slot (is_send) / recv_slot might succeed, or max_ms passes.
   * Returns COLL_OK on either; COLL_ERR_REMOTE (with a sentence) if the peer is gone. */
  coll_result (*wait)(struct coll_comm *comm, coll_conn *c, int max_ms);
  /* Wakes any thread of this process sleeping in wait() on `c`. */
  void (*wake)(coll_conn *c);

  void (*close)(struct coll_comm *comm, void *ctx);
};

#define COLL_CONN_BLOB 256

extern const coll_transport coll_transport_shm;

/* ---- shm mailboxes: the one-shot path for small collectives (oneshot.c) ------------
 * Every rank's segment holds two mailboxes (calls alternate between them).  `seq` is
 * the one-shot call the mailbox speaks for; the data starts in the same cache line, so
 * a reader that sees `seq` change has usually pulled the first 56 bytes with it. */
#define COLL_MAILBOX_BYTES (64 * 1024)
typedef struct {
  _Alignas(64) _Atomic uint32_t seq;
  uint32_t pad;
  uint8_t data[];
} coll_mailbox;
/* `rank`'s mailbox `parity` (0/1), or NULL when rank is not reached through shm. */
coll_mailbox *coll_shm_mailbox(struct coll_comm *comm, int rank, unsigned parity);
/* The count of ranks sleeping (futex) on one of `rank`'s mailboxes. */
_Atomic uint32_t *coll_shm_mailbox_waiters(struct coll_comm *comm, int rank);
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
 * beyond the owner record is zero (fresh). */
coll_result coll_shm_create(struct coll_comm *comm, const char *name, size_t size,
                            void **base);

/* "coll-<job>-": how the names of one job's segments begin in /dev/shm (no leading
 * slash), from its secret; what the launcher's clean-up and the tests' leak checks match,
 * so that they see only their own job's segments and never another job's. */
void coll_job_prefix(char *out, size_t len, const uint8_t *secret);
/* COLL_ERR_REMOTE (with a sentence) if `peer` aborted or died, else COLL_OK. */
coll_result coll_shm_peer_check(struct coll_comm *comm, int peer);
extern const coll_transport coll_transport_tcp;

#endif
