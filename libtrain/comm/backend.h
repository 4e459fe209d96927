/*
 * backend.h — the small interface data-parallel training needs from a communication
 * library, so that the same DDP code (ddp.c) runs over libcoll or Open MPI and the two can
 * be compared on the same run.
 *
 * A backend is a struct of function pointers over one group of `nranks` processes. The
 * collectives are asynchronous: they start the operation and hand back a request; test()
 * asks whether it finished (and gives a library that only progresses inside its own calls,
 * like MPI, the chance to progress), wait() blocks until it has. Reductions are on float32;
 * broadcast and all-gather move bytes. Requests complete in the order they were started.
 *
 * Every function returns 0 on success and -1 on failure, with a sentence in b->err (which
 * rank, which call, what the library said). Nothing here prints or exits: the caller
 * decides. Implementations: backend_coll.c (libcoll's public API), backend_mpi.c (Open MPI,
 * built when found; backend_mpi_stub.c otherwise), backend_nccl.c (NCCL on GPU buffers,
 * built with CUDA and NCCL; backend_nccl_stub.c otherwise).
 */
#ifndef TRAIN_COMM_BACKEND_H
#define TRAIN_COMM_BACKEND_H

#include "train.h"

#include <coll.h>
#include <coll_trace.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { TRAIN_REDUCE_SUM = 0, TRAIN_REDUCE_AVG = 1 } train_reduce;

/* Handle of an asynchronous operation; TRAIN_REQ_DONE is a request that needs no wait. */
typedef int train_req;
#define TRAIN_REQ_DONE (-1)
/* Operations that may be in flight at once; starting one more first waits for the oldest. */
#define TRAIN_BACKEND_MAX_REQS 256

/* One point-to-point transfer of an exchange (train_backend.exchange). */
typedef struct train_p2p {
  int send;  /* 1: send buf to peer, 0: receive into buf from peer */
  int peer;  /* rank in the backend's group */
  void *buf; /* host memory */
  size_t bytes;
} train_p2p;

typedef struct train_backend train_backend;
struct train_backend {
  const char *name; /* "coll", "mpi" */
  int rank, nranks;
  void *impl;
  char err[TRAIN_ERRLEN];

  int (*all_reduce)(train_backend *b, float *buf, size_t count, train_reduce op, train_req *req);
  /* Optional (NULL: --dtype bf16 is refused on this library): the same over bfloat16
   * (uint16_t) elements, reduced in float and rounded to nearest even (libcoll's
   * COLL_BFLOAT16; MPI has no bfloat16 type). */
  int (*all_reduce_bf16)(train_backend *b, uint16_t *buf, size_t count, train_reduce op,
                         train_req *req);
  /* recv (recvcount) = this rank's block of the reduction of send (nranks*recvcount) */
  int (*reduce_scatter)(train_backend *b, const float *send, float *recv, size_t recvcount,
                        train_reduce op, train_req *req);
  /* Optional: the same over bfloat16 elements (as all_reduce_bf16) */
  int (*reduce_scatter_bf16)(train_backend *b, const uint16_t *send, uint16_t *recv,
                             size_t recvcount, train_reduce op, train_req *req);
  /* recv (nranks*bytes) = every rank's send (bytes), in rank order */
  int (*all_gather)(train_backend *b, const void *send, void *recv, size_t bytes, train_req *req);
  int (*broadcast)(train_backend *b, void *buf, size_t bytes, int root, train_req *req);
  /* Optional (NULL: expert parallelism and Ulysses context parallelism are refused on
   * this library). all_to_all: block j
   * (bytes) of send goes to rank j, block s of recv (bytes) comes from rank s.
   * all_to_allv: the same with a size and an offset per rank, in bytes (sendbytes[j] at
   * sdispls[j] of send to rank j, recvbytes[s] at rdispls[s] of recv from rank s; a
   * rank's recvbytes[s] must equal rank s's sendbytes[rank]); not in place. The arrays
   * (nranks entries) are read before the call returns. libcoll: coll_all_to_all(v);
   * Open MPI: MPI_Ialltoall(v). */
  int (*all_to_all)(train_backend *b, const void *send, void *recv, size_t bytes, train_req *req);
  int (*all_to_allv)(train_backend *b, const void *send, const size_t *sendbytes,
                     const size_t *sdispls, void *recv, const size_t *recvbytes,
                     const size_t *rdispls, train_req *req);
  int (*barrier)(train_backend *b); /* blocking */
  /* 1: finished (a finished request may be tested again), 0: pending, -1: failed */
  int (*test)(train_backend *b, train_req req);
  int (*wait)(train_backend *b, train_req req);
  /* Optional (NULL: the caller waits on the host instead): makes the operations started
   * from now on wait, on the device, for `event` (a cudaEvent_t recorded on the model's
   * compute stream) before they read their buffers, without blocking the host.  NCCL:
   * cudaStreamWaitEvent on its communication stream. */
  int (*order_after)(train_backend *b, void *event);
  /* Optional (NULL: the library cannot split, and 2-D parallelism is refused): collective
   * over b, like MPI_Comm_split: ranks passing the same color >= 0 form a new group,
   * ranked by (key, rank in b), handed back in *out as a backend of its own (destroy it
   * before b). libcoll: coll_comm_split; Open MPI: MPI_Comm_split. */
  int (*split)(train_backend *b, int color, int key, train_backend **out);
  /* Optional (NULL: pipeline parallelism is refused on this library): blocking, the n
   * transfers as one group that completes when each has met its partner — so a stage
   * that sends forward and receives backward at once cannot deadlock whatever the order
   * of the list (libcoll: coll_group_start, coll_send/coll_recv, coll_group_end; Open MPI:
   * MPI_Isend/MPI_Irecv and MPI_Waitall). Two transfers to one peer meet that peer's in
   * list order. Ordered after the requests already started on b. */
  int (*exchange)(train_backend *b, const train_p2p *ops, int n);
  /* Optional (NULL: callers use exchange, blocking): the same group of transfers
   * started, completing through wait/test like the collectives — so a ring step's
   * transfer moves while the caller computes (context parallelism's ring attention).
   * libcoll: the group's send/recv on one of the backend's streams. */
  int (*exchange_start)(train_backend *b, const train_p2p *ops, int n, train_req *req);
  /* Waits for outstanding work and releases the group (MPI_Finalize for MPI). */
  int (*destroy)(train_backend *b);
  /* Fails pending work and leaves the group at once, from any state. */
  void (*abort)(train_backend *b);
  /* Optional, NULL where the library keeps no trace of its own (MPI, NCCL): start
   * recording the library's collectives (dropping older records), stop, and copy up to
   * `cap` records (*n gets how many there are). libcoll: coll_trace_start/stop/read, so
   * a DDP timeline can show libcoll's calls and ring steps under the bucket they serve. */
  int (*trace_start)(train_backend *b);
  int (*trace_stop)(train_backend *b);
  int (*trace_read)(train_backend *b, coll_trace_event *ev, size_t cap, size_t *n);
};

/* Wraps a libcoll communicator (from coll_launch_local or coll_comm_init_rank). With own,
 * the backend frees it in destroy/abort; without (coll_launch_local's comm, which the
 * launcher destroys), destroy leaves it alone. NULL with err on failure. */
TRAIN_API train_backend *train_backend_coll(coll_comm_t comm, int own, char *err);
/* Joins the job described by the launcher's environment (coll_comm_init_from_env). */
TRAIN_API train_backend *train_backend_coll_from_env(char *err);
/* MPI_Init (threads: funneled) and MPI_COMM_WORLD; NULL with err when this build has no
 * Open MPI or the process was not started by mpirun. */
TRAIN_API train_backend *train_backend_mpi(char *err);
/* 1 when the MPI backend was built in. */
TRAIN_API int train_backend_mpi_built(void);
/* NCCL on the GPU model path (--device cuda): rank 0's NCCL unique id is broadcast over
 * `boot` (a libcoll communicator of the same ranks, from coll_launch_local or the
 * launcher's environment; with own, the backend destroys it at the end). Each rank takes
 * GPU (local rank mod devices). NULL with err when this build has no NCCL, when there is
 * no usable GPU (every rank says so before any collective), or when NCCL fails to start. */
TRAIN_API train_backend *train_backend_nccl(coll_comm_t boot, int own, char *err);
/* 1 when the NCCL backend was built in; the number of CUDA devices NCCL could use (0 when
 * not built or none). */
TRAIN_API int train_backend_nccl_built(void);
TRAIN_API int train_nccl_device_count(void);

#ifdef __cplusplus
}
#endif
#endif
