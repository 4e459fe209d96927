/* watch.h — how a failure on one rank reaches every rank of a communicator fast.
 *
 * See watch.c.  The executor asks coll_watch_check() whenever a wait has to sleep and
 * before each call; the API reports refused calls (coll_watch_refused) and the executor
 * failed ones (coll_watch_failed); abort and destroy say so (coll_watch_stop).
 */
#ifndef COLL_WATCH_H
#define COLL_WATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "coll.h"
#include "sock.h"

struct coll_comm;
struct coll_watch;
typedef struct coll_watch coll_watch;

/* Before the exchange of rank info: listen for the prev rank's link; `where` receives the
 * address to publish. */
coll_result coll_watch_listen(struct coll_comm *comm, coll_sockaddr_packed *where);
/* After it: dial the next rank and start the watch thread (it accepts prev itself, so
 * nothing here waits on another rank). */
coll_result coll_watch_start(struct coll_comm *comm, const coll_sockaddr_packed *next);
/* Ends the watch.  `how`: COLL_WATCH_BYE, a normal destroy (peers take the closing link
 * as a goodbye); COLL_WATCH_ABORT, coll_comm_abort; COLL_WATCH_FAILED, init failed with
 * the sentence in comm->errbuf.  The last two make every peer's calls fail at once. */
enum { COLL_WATCH_BYE = 0, COLL_WATCH_ABORT = 1, COLL_WATCH_FAILED = 2 };
void coll_watch_stop(struct coll_comm *comm, int how);

/* COLL_ERR_REMOTE with a sentence when a failure elsewhere means this rank's call `seq`
 * (`what`, e.g. "all_reduce #5"), which involves `peer` (or every rank when peer < 0),
 * can never complete. */
coll_result coll_watch_check(struct coll_comm *comm, uint64_t seq, int peer, const char *what);
/* Cheap test for the data path: is there anything for coll_watch_check to say? */
bool coll_watch_attention(const struct coll_comm *comm);
/* This rank's call (`seq`, the number it would have taken) was refused before anything
 * moved: peers that made it validly must not wait for this rank. */
void coll_watch_refused(struct coll_comm *comm, uint64_t seq);
/* This rank's call failed while running (sentence in comm->errbuf): the communicator is
 * finished everywhere. */
void coll_watch_failed(struct coll_comm *comm);

#endif
