/* comm_entry.c — coll_comm_destroy and coll_comm_abort: the two communicator entry
 * points that must look at the calling thread's open group (group.c) before comm/ ends
 * the communicator, so they live here, above both.
 *
 * Must never: free a communicator that this thread's open group still holds calls on
 * (group.c would run them on freed memory at coll_group_end).
 */
#include "internal.h"

coll_result coll_comm_destroy(coll_comm_t comm) {
  if (!comm) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_comm_destroy: comm is NULL");
  if (coll_group_holds(comm)) /* group.c would run them on a freed communicator */
    return coll_fail(comm, COLL_ERR_INVALID_ARG,
                     "coll_comm_destroy on rank %d: this thread's open group holds calls on "
                     "the communicator; call coll_group_end first",
                     comm->rank);
  return coll_comm_close(comm);
}

coll_result coll_comm_abort(coll_comm_t comm) {
  if (!comm) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_comm_abort: comm is NULL");
  coll_group_forget(comm); /* calls this thread's open group holds on it will never run */
  return coll_comm_abort_close(comm);
}
