/* coll_launch.h — the local launcher: fork N ranks on this machine and run a function
 * in each, like `torchrun --standalone --nproc-per-node N`.
 *
 * This is a convenience for one machine (tools take `--ranks N`, tests fork ranks);
 * multi-machine jobs use a real launcher and coll_comm_init_from_env.  It must never be
 * called from a process that already runs libcoll threads other than the launcher's.
 */
#ifndef COLL_LAUNCH_H
#define COLL_LAUNCH_H

#include "coll.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Body of one rank: returns 0 on success; any other value is that rank's exit status. */
typedef int (*coll_rank_fn)(coll_comm_t comm, int rank, int nranks, void *arg);

/* Creates a unique id, forks `nranks` children; each builds its communicator with
 * coll_comm_init_rank, runs fn, destroys the communicator and exits with fn's value.
 * The parent waits for all of them; if one fails, crashes or the whole job runs longer
 * than timeout_ms (0: no limit) it kills the others.  Afterwards no shared-memory
 * segment of the job is left in /dev/shm.  Returns 0 when every rank returned 0, else
 * the first non-zero status seen (128+signal for a rank killed by a signal, 124 for a
 * timeout); `why` (if not NULL, `why_len` bytes) gets a sentence about the failure.
 * Rank r is bound to the (r mod C)-th of the C CPUs the caller may run on, as mpirun
 * binds ranks to cores, and round-robin when ranks outnumber CPUs (COLL_LAUNCH_BIND=0:
 * not bound). */
COLL_API int coll_launch_local(int nranks, coll_rank_fn fn, void *arg, int timeout_ms, char *why,
                               size_t why_len);

/* Same, but each child calls `fn` with comm == NULL and does not build a communicator:
 * for tests of init itself.  The child's environment has COLL_LAUNCH_RANK/NRANKS set and
 * the id is available from coll_launch_unique_id(). */
COLL_API int coll_launch_local_raw(int nranks, coll_rank_fn fn, void *arg, int timeout_ms,
                                   char *why, size_t why_len);
/* In a child of coll_launch_local_raw: the job's unique id. */
COLL_API coll_unique_id coll_launch_unique_id(void);

#ifdef __cplusplus
}
#endif
#endif
