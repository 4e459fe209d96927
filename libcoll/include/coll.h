/* coll.h — the whole public API of libcoll, NCCL-shaped.
 *
 * A communicator is a group of `nranks` processes that call the same collectives in
 * the same order.  Every call returns a coll_result; on failure a sentence saying what
 * happened is available from coll_comm_last_error().  Counts are in elements, never
 * bytes.  Collectives are asynchronous when given a stream (they enqueue and return)
 * and blocking when the stream is NULL.
 *
 * This header must never grow a dependency on anything but the C standard library:
 * programs outside the project compile against it as it is.
 */
#ifndef COLL_H
#define COLL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define COLL_API __attribute__((visibility("default")))
#else
#define COLL_API
#endif

#define COLL_VERSION_MAJOR 0
#define COLL_VERSION_MINOR 1
#define COLL_VERSION_PATCH 0
#define COLL_VERSION_STRING "0.1.0"

typedef enum {
  COLL_OK = 0,
  COLL_ERR_INVALID_ARG, /* refused up front: nothing was sent */
  COLL_ERR_SYSTEM,      /* an OS call failed (errno is in the sentence) */
  COLL_ERR_REMOTE,      /* a peer died or reported an error */
  COLL_ERR_TIMEOUT,     /* a wait took longer than COLL_TIMEOUT_MS */
  COLL_ERR_MISMATCH,    /* ranks called different collectives / counts / types */
  COLL_ERR_UNSUPPORTED, /* valid, but not possible with this build or machine */
  COLL_ERR_INTERNAL,    /* a bug in libcoll: please report the sentence */
  COLL_IN_PROGRESS      /* coll_stream_query: work is still pending */
} coll_result;

typedef enum {
  COLL_INT8,
  COLL_UINT8,
  COLL_INT32,
  COLL_UINT32,
  COLL_INT64,
  COLL_UINT64,
  COLL_FLOAT16,
  COLL_BFLOAT16,
  COLL_FLOAT32,
  COLL_FLOAT64
} coll_dtype;
#define COLL_NUM_DTYPES 10

typedef enum { COLL_SUM, COLL_PROD, COLL_MIN, COLL_MAX, COLL_AVG } coll_op;
#define COLL_NUM_OPS 5

typedef struct coll_comm *coll_comm_t;
typedef struct coll_stream *coll_stream_t; /* NULL: the call blocks until done */
typedef struct {
  unsigned char internal[128];
} coll_unique_id;

/* --- communicators --------------------------------------------------------------- */

/* Opens the rendezvous listener in this process (a background thread serves it until
 * every rank of the job has joined) and encodes its address plus a random secret.
 * Hand the id to every rank (fork, a file, MPI_Bcast ...) and call coll_comm_init_rank. */
COLL_API coll_result coll_get_unique_id(coll_unique_id *id);
COLL_API coll_result coll_comm_init_rank(coll_comm_t *comm, int nranks, coll_unique_id id,
                                         int rank);
/* Reads the launcher's environment: torchrun (RANK, WORLD_SIZE, LOCAL_RANK), Open MPI
 * (OMPI_COMM_WORLD_*), MPICH/PMI (PMI_RANK, PMI_SIZE), Slurm (SLURM_PROCID, SLURM_NTASKS,
 * SLURM_LOCALID); the rendezvous address from COLL_ADDR=host:port or
 * MASTER_ADDR/MASTER_PORT.  Rank 0 listens there. */
COLL_API coll_result coll_comm_init_from_env(coll_comm_t *comm);
/* Waits for this communicator's queued work, then frees it. */
COLL_API coll_result coll_comm_destroy(coll_comm_t comm);
/* Fails all pending and future work of the communicator with COLL_ERR_REMOTE, wakes any
 * thread blocked in it, and frees it once it is idle.  Safe from any thread. */
COLL_API coll_result coll_comm_abort(coll_comm_t comm);
/* Sub-communicators, like ncclCommSplit / MPI_Comm_split.  Collective over `comm`: every
 * rank calls it.  Ranks passing the same color (>= 0) form a new communicator, ranked by
 * (key, rank in comm); COLL_SPLIT_NOCOLOR gives *newcomm = NULL.  The ranks meet through
 * `comm` itself (no new id).  A child has its own connections and progress thread:
 * parent and children may be used concurrently (from different threads or streams)
 * and destroyed in any order.  On any failure, or a bad argument on any rank, every
 * rank returns an error and none keeps a child.  dup = split with one color, key = rank. */
#define COLL_SPLIT_NOCOLOR (-1)
COLL_API coll_result coll_comm_split(coll_comm_t comm, int color, int key, coll_comm_t *newcomm);
COLL_API coll_result coll_comm_dup(coll_comm_t comm, coll_comm_t *newcomm);
COLL_API coll_result coll_comm_rank(coll_comm_t comm, int *rank);
COLL_API coll_result coll_comm_size(coll_comm_t comm, int *nranks);
/* This communicator's timeout: a wait of its work that makes no progress for `ms`
 * milliseconds fails with COLL_ERR_TIMEOUT (0 = never).  Starts as COLL_TIMEOUT_MS (default
 * 600000).  Set it before enqueuing work on the communicator; children made by split/dup
 * start from the environment's value, not this one. */
COLL_API coll_result coll_comm_set_timeout(coll_comm_t comm, int ms);

COLL_API const char *coll_result_string(coll_result r);
/* The sentence for the last failure seen by this communicator (comm may be NULL: the
 * last failure of a call that had no communicator, in this thread). */
COLL_API const char *coll_comm_last_error(coll_comm_t comm);

/* --- streams: ordered queues of asynchronous work ------------------------------------
 * Work enqueued on streams runs in call order per communicator.  A stream may carry
 * work of several communicators.  synchronize waits for everything enqueued so far
 * and returns the first error any of it met (then clears it). */
COLL_API coll_result coll_stream_create(coll_stream_t *s);
COLL_API coll_result coll_stream_destroy(coll_stream_t s); /* synchronizes first */
COLL_API coll_result coll_stream_synchronize(coll_stream_t s);
/* COLL_OK when all enqueued work is done (or its error), COLL_IN_PROGRESS otherwise. */
COLL_API coll_result coll_stream_query(coll_stream_t s);

/* --- collectives ------------------------------------------------------------------- */

COLL_API coll_result coll_broadcast(const void *sendbuf, void *recvbuf, size_t count,
                                    coll_dtype dtype, int root, coll_comm_t comm, coll_stream_t s);
COLL_API coll_result coll_reduce(const void *sendbuf, void *recvbuf, size_t count, coll_dtype dtype,
                                 coll_op op, int root, coll_comm_t comm, coll_stream_t s);
COLL_API coll_result coll_all_reduce(const void *sendbuf, void *recvbuf, size_t count,
                                     coll_dtype dtype, coll_op op, coll_comm_t comm,
                                     coll_stream_t s);
COLL_API coll_result coll_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                         coll_dtype dtype, coll_op op, coll_comm_t comm,
                                         coll_stream_t s);
COLL_API coll_result coll_all_gather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                     coll_dtype dtype, coll_comm_t comm, coll_stream_t s);
COLL_API coll_result coll_send(const void *buf, size_t count, coll_dtype dtype, int peer,
                               coll_comm_t comm, coll_stream_t s);
COLL_API coll_result coll_recv(void *buf, size_t count, coll_dtype dtype, int peer,
                               coll_comm_t comm, coll_stream_t s);
/* Sends `sendcount` elements to `dst` and receives `recvcount` from `src` as one operation,
 * so that a ring of exchanges cannot deadlock (like MPI_Sendrecv, or a NCCL group of one
 * send and one recv).  dst == src == own rank copies locally. */
COLL_API coll_result coll_sendrecv(const void *sendbuf, size_t sendcount, int dst, void *recvbuf,
                                   size_t recvcount, int src, coll_dtype dtype, coll_comm_t comm,
                                   coll_stream_t s);
COLL_API coll_result coll_barrier(coll_comm_t comm, coll_stream_t s);

/* Block j of sendbuf (`count` elements, at j*count) goes to rank j; block i of recvbuf
 * comes from rank i.  Both buffers hold nranks*count elements.  In place
 * (sendbuf == recvbuf) each block is replaced by the one its peer sent, as MPI_IN_PLACE
 * does; any other overlap is refused. */
COLL_API coll_result coll_all_to_all(const void *sendbuf, void *recvbuf, size_t count,
                                     coll_dtype dtype, coll_comm_t comm, coll_stream_t s);
/* The same with a block size per peer, in elements: sendcounts[j] elements starting at
 * element sdispls[j] of sendbuf go to rank j; recvcounts[i] elements from rank i land at
 * element rdispls[i] of recvbuf.  Rank j's sendcounts[i] must equal rank i's
 * recvcounts[j] (and a rank's own sendcounts[r] its recvcounts[r]); elements of recvbuf
 * outside the named blocks are left untouched; receive blocks must not overlap each
 * other.  Not in place: sendbuf and recvbuf must not overlap.  The four arrays (nranks
 * entries each) are copied before the call returns, so with a stream they may be reused
 * at once. */
COLL_API coll_result coll_all_to_allv(const void *sendbuf, const size_t *sendcounts,
                                      const size_t *sdispls, void *recvbuf,
                                      const size_t *recvcounts, const size_t *rdispls,
                                      coll_dtype dtype, coll_comm_t comm, coll_stream_t s);
/* Every rank's `sendcount` elements land, in rank order, in the root's recvbuf
 * (nranks*sendcount elements); recvbuf is ignored (may be NULL) elsewhere.  In place on
 * the root: sendbuf == recvbuf + root*sendcount elements (its block is already there). */
COLL_API coll_result coll_gather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                 coll_dtype dtype, int root, coll_comm_t comm, coll_stream_t s);
/* The mirror of gather: block i of the root's sendbuf (nranks*recvcount elements) lands in
 * rank i's recvbuf (recvcount elements); sendbuf is ignored (may be NULL) off the root.
 * In place on the root: recvbuf == sendbuf + root*recvcount elements. */
COLL_API coll_result coll_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                  coll_dtype dtype, int root, coll_comm_t comm, coll_stream_t s);
/* --- grouped calls, as ncclGroupStart / ncclGroupEnd ------------------------------
 * Between coll_group_start and coll_group_end (per thread; groups nest, the outermost
 * end counts) the calls above check their arguments and return: COLL_OK, or an argument
 * error at once (that call is left out; the group stays open and usable).  Nothing runs
 * before the outermost coll_group_end, so the buffers must stay valid until then.  It
 * runs, per communicator, the group's collectives in call order and then all its
 * send/recv/sendrecv calls as one operation that moves them together: a ring of
 * exchanges, or a pipeline stage sending forward and backward at once, cannot deadlock
 * whatever the order of the calls.  Two sends to one peer meet that peer's two receives
 * in call order.  Communicators of one group progress concurrently.  Calls made with a
 * NULL stream make coll_group_end wait for them and return the first error; calls on
 * streams are enqueued there and report through coll_stream_synchronize.  A group's
 * send/recv calls on one communicator must all use the same stream, on host memory.
 * coll_group_end without an open group fails with COLL_ERR_INVALID_ARG. */
COLL_API coll_result coll_group_start(void);
COLL_API coll_result coll_group_end(void);

/* --- memory every rank can address ------------------------------------------------
 * Collective: every rank calls it, in the same order (sizes may differ).  Returns
 * page-aligned memory that the other ranks on this host have mapped as well (like
 * MPI_Win_allocate_shared, or ncclMemAlloc + ncclCommRegister): a collective whose
 * buffers all lie in such memory on every rank moves each byte once, by loads and
 * stores into the peers' memory, instead of through FIFO slots.  Anywhere else (ranks
 * on several hosts) it is ordinary memory.  coll_mem_free is collective too: every rank
 * frees the same allocation, after its last use. */
COLL_API coll_result coll_mem_alloc(coll_comm_t comm, size_t bytes, void **ptr);
COLL_API coll_result coll_mem_free(coll_comm_t comm, void *ptr);

/* --- small helpers users of the API keep asking for ------------------------------- */

COLL_API size_t coll_dtype_size(coll_dtype dtype);      /* 0 for an invalid dtype */
COLL_API const char *coll_dtype_name(coll_dtype dtype); /* "float32", ... or NULL */
COLL_API const char *coll_op_name(coll_op op);          /* "sum", ... or NULL */

#ifdef __cplusplus
}
#endif
#endif /* COLL_H */
