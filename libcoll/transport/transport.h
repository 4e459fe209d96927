/* transport.h — the one connector interface every transport implements, and all that a
 * transport may know about the communicator it serves.
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
 *
 * A transport sees its communicator only through a coll_comm_view (below), never
 * struct coll_comm: no file in libcoll/transport/ includes libcoll's internal header.  Must
 * never: grow a field or callback that serves one algorithm or executor policy rather
 * than moving slices (those stay on the libcoll side).
 */
#ifndef COLL_TRANSPORT_H
#define COLL_TRANSPORT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "base.h"
#include "coll.h"

#define COLL_SECRET_BYTES 16

struct coll_comm;
typedef struct coll_conn coll_conn;
typedef struct coll_transport coll_transport;

/* What a transport may know about its communicator.  comm.c fills it (it lives in struct
 * coll_comm) as the facts become known: everything before the transports' setup() but
 * the per-rank pids and host ids of peers and `oversubscribed`, which the exchange of
 * rank info brings before connect(); cuda.c sets `cuda_device` before cuda_ipc's
 * setup().  The pointers stay valid for the communicator's life. */
typedef struct coll_comm_view {
  int rank, nranks;
  const uint8_t *secret;    /* COLL_SECRET_BYTES: names segments, signs hellos */
  const uint64_t *host_ids; /* [nranks]: equal ids, same host */
  const pid_t *pids;        /* [nranks]: for liveness checks on this host */
  int timeout_ms;           /* COLL_TIMEOUT_MS (0: no limit) bounds setup's waits */
  /* More ranks on this host than the CPUs they may run on (the union of their
   * affinities, comm.c): a wait yields at once, never spins. */
  bool oversubscribed;
  const coll_cpu_mates *mates; /* who else may run on this rank's CPU: for coll_yield */
  const _Atomic int *aborted;  /* coll_comm_abort ran: waits return, closes skip draining */
  /* This rank's address on the route to the rendezvous: TCP and IB listen there. */
  const struct sockaddr_storage *local;
  socklen_t local_len;
  int cuda_device;         /* the GPU of the device path (cuda_ipc), -1 before it is chosen */
  struct coll_comm *owner; /* opaque: whose sentence coll_view_fail sets */
} coll_comm_view;

/* Records `r` with a sentence on the view's communicator (view NULL: in this thread) and
 * returns r, as coll_fail does on the libcoll side (debug.c). */
coll_result coll_view_fail_at(const coll_comm_view *view, coll_result r, const char *file, int line,
                              const char *fmt, ...) __attribute__((format(printf, 5, 6)));
#define coll_view_fail(view, r, ...) coll_view_fail_at(view, r, __FILE__, __LINE__, __VA_ARGS__)

/* How a communicator ends, told to close(): transports decide from it whether to flush
 * and say goodbye or to leave so that peers see the end at once. */
typedef enum {
  COLL_END_CLEAN = 0,   /* destroyed with every call succeeded: flush, say goodbye */
  COLL_END_FAILED = 1,  /* a call failed (the communicator's sticky error): just leave */
  COLL_END_ABORTED = 2, /* coll_comm_abort, or init failed: peers must give up waiting */
} coll_comm_end;

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
  /* The largest slot its connectors use: the executor never cuts a slice bigger than
   * the smallest of these over the transports set up (comm.c). */
  size_t slot_bytes;
  /* connect() runs when the executor first needs the peer (comm.c), not during init:
   * the transport accepts its peers' connections at any time after ready(). */
  bool lazy;
  /* Can this transport connect this rank to `peer` (e.g. same host for shm)? */
  bool (*can_connect)(const coll_comm_view *view, int peer);
  /* Creates this rank's local resources and writes the info peers need into `blob`
   * (at most COLL_CONN_BLOB bytes). */
  coll_result (*setup)(const coll_comm_view *view, void **ctx, void *blob);
  /* Builds the send and receive connections with `peer` from the peer's blob. */
  coll_result (*connect)(const coll_comm_view *view, void *ctx, int peer, const void *peer_blob,
                         coll_conn **send, coll_conn **recv);
  /* Called once every rank has connected (shm unlinks its segment here). */
  coll_result (*ready)(const coll_comm_view *view, void *ctx);
  /* Optional: called on this rank's executor thread before a slice of more than `from`
   * bytes first moves on `c` from this side (comm.c's coll_comm_use_peer), to make bytes
   * [from, to) of every slot resident (from = 0: the first use, control included), so
   * that a transport that reserves its buffers sparsely holds memory only for the peers
   * and slice sizes the algorithms use, and faults it in off the data path.  It must not
   * change what the FIFO holds (the peer may already be using it). */
  coll_result (*warm)(const coll_comm_view *view, coll_conn *c, size_t from, size_t to);

  /* Data path.  send_slot: the next free slot or NULL; send_post publishes it with
   * `bytes` valid bytes.  recv_slot: the next filled slot (its size in *bytes) or NULL;
   * recv_release hands it back. */
  void *(*send_slot)(coll_conn *c);
  void (*send_post)(coll_conn *c, uint32_t bytes);
  const void *(*recv_slot)(coll_conn *c, uint32_t *bytes);
  void (*recv_release)(coll_conn *c);
  /* Sleeps until send_slot (is_send) / recv_slot might succeed, or max_ms passes.
   * Returns COLL_OK on either; COLL_ERR_REMOTE (with a sentence) if the peer is gone. */
  coll_result (*wait)(const coll_comm_view *view, coll_conn *c, int max_ms);
  /* Wakes any thread of this process sleeping in wait() on `c`. */
  void (*wake)(coll_conn *c);

  void (*close)(const coll_comm_view *view, void *ctx, coll_comm_end how);
};

#define COLL_CONN_BLOB 256

extern const coll_transport coll_transport_shm;
extern const coll_transport coll_transport_tcp;

#endif
