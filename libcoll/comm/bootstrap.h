/* bootstrap.h — a rank's side of the TCP bootstrap (bootstrap.c): the state comm.c
 * holds while a new job's communicator is built, and the calls on it.
 *
 * Here, in the comm layer, rather than in internal.h: the state holds the ring links
 * (ring_link.h) by value, and a shared header must not pull a layer's header into every
 * layer.  Only comm/ (comm.c, bootstrap.c) and the tests that join a job by hand include
 * it; the root's side and the unique id stay in internal.h (api/ starts the root).
 *
 * Must never: be included outside comm/ by libcoll itself.
 */
#ifndef COLL_BOOTSTRAP_H
#define COLL_BOOTSTRAP_H

#include "internal.h"
#include "ring_link.h"

/* A rank's side of the bootstrap (bootstrap.c): its listener and ring links. */
typedef struct {
  int rank, nranks;
  int timeout_ms;
  coll_ring_link link;
  struct sockaddr_storage local; /* this end of the route to the root */
  socklen_t local_len;
  coll_sockaddr_packed next_addr; /* from the root's note */
  bool have_next, next_done, failed, formed;
  uint64_t end_ns;              /* init's deadline */
  char why[COLL_LINK_NOTE_MAX]; /* failed: what the neighbours were told */
  coll_frame_tx tx;
  coll_frame_rx rx_prev, rx_next;
} coll_bootstrap;

coll_result coll_bootstrap_connect(struct coll_comm *comm, coll_bootstrap *b,
                                   const coll_id_fields *f, int rank, int nranks);
/* Every rank contributes `len` bytes (same len on all ranks); `all` receives nranks*len
 * bytes, rank i's at offset i*len. */
coll_result coll_bootstrap_allgather(struct coll_comm *comm, coll_bootstrap *b, const void *mine,
                                     void *all, size_t len);
void coll_bootstrap_close(coll_bootstrap *b);
/* Init failed on this rank: the ring hears why (sentence in comm->errbuf). */
void coll_bootstrap_fail(struct coll_comm *comm, coll_bootstrap *b);

#endif
