/* cuda_ipc.h — what the rest of libcoll sees of the CUDA IPC transport (cuda_ipc.c): the
 * transport itself, and the view of a rank that its blob carries, which the pair rule
 * (coll_cuda_select in cuda.c) judges.
 *
 * Must never: name a CUDA type (every file includes it in every build) or the
 * communicator (a transport sees only its coll_comm_view).
 */
#ifndef COLL_CUDA_IPC_H
#define COLL_CUDA_IPC_H

#include <stdbool.h>
#include <stdint.h>

#include "transport.h"

/* What one rank says about itself in the init exchange, as the pair rule needs it. */
typedef struct {
  bool ok; /* this rank set up cuda_ipc (a device, its FIFO, its handle) */
  int32_t pid;
  uint64_t host_id;
  uint32_t pci;    /* domain << 16 | bus << 8 | device of this rank's GPU */
  uint32_t npeers; /* GPUs (by pci) this rank's GPU can reach with peer access */
  uint32_t peers[16];
} coll_cuda_view;

extern const coll_transport coll_transport_cuda_ipc;
/* Reads the selection view out of a cuda_ipc blob (host_id is not in it); false when the
 * blob is not a valid one (then v->ok is false). */
bool coll_cuda_ipc_blob_view(const void *blob, coll_cuda_view *v);

#endif
