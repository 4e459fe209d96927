/* coll_trace.h — what a communicator did, step by step, and what the cost model says it
 * should have cost.
 *
 * Every collective runs a schedule: an ordered list of steps (send a chunk, receive one,
 * receive-reduce-send, ...).  With tracing on, the executor records one event per step
 * it ran — the same steps, from the same schedule, not a separate description — with
 * the chunk, the peers, the bytes in and out and when it started and ended.  coll-bench
 * --explain prints these; COLL_TRACE=FILE.json writes them as a Perfetto timeline at
 * coll_comm_destroy; COLL_TRACE=text logs each call's steps to stderr as it finishes.
 *
 * Tracing costs two clock reads per step while on and one branch per call while off.
 */
#ifndef COLL_TRACE_H
#define COLL_TRACE_H

#include <stdint.h>

#include "coll.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  uint64_t seq;     /* the call's sequence number on this communicator */
  int32_t rank;     /* who ran it */
  int32_t step;     /* index in the rank's schedule; -1: the whole call */
  char coll[16];    /* "all_reduce", "broadcast", ... */
  char algo[12];    /* "ring", ... */
  char what[24];    /* step kind: "send", "recv-reduce-send", ...; "call" */
  int32_t peer_in;  /* rank data came from, -1 if none */
  int32_t peer_out; /* rank data went to, -1 if none */
  int32_t chunk;    /* chunk index the step moved, -1 if none */
  int32_t reduces;  /* 1 when the step combined a received contribution */
  int32_t dtype;    /* coll_dtype of the call */
  int32_t nranks;
  uint64_t count;      /* elements the step covered (the call's count for step -1) */
  uint64_t bytes_in;   /* bytes received from peer_in */
  uint64_t bytes_out;  /* bytes sent to peer_out */
  uint64_t t_start_ns; /* CLOCK_MONOTONIC: first slice began */
  uint64_t t_end_ns;   /*                  last slice ended */
} coll_trace_event;

/* Starts recording on this communicator (dropping what was recorded before). */
COLL_API coll_result coll_trace_start(coll_comm_t comm);
/* Stops recording; what was recorded stays readable. */
COLL_API coll_result coll_trace_stop(coll_comm_t comm);
/* Copies up to `cap` recorded events (oldest first) into `ev`; *n gets how many were
 * recorded in all (more than cap means some were not copied).  Call it when no work is
 * in flight (after coll_stream_synchronize). */
COLL_API coll_result coll_trace_read(coll_comm_t comm, coll_trace_event *ev, size_t cap, size_t *n);

/* The α-β cost model of the FIFO schedule libcoll runs for `coll` ("all_reduce", ...,
 * "sendrecv", "all_to_all", "gather", "scatter": the ring, pairwise or linear) on `nranks`
 * ranks moving `bytes` (nccl-tests' size convention: the whole buffer for all_gather /
 * reduce_scatter / gather / scatter, one rank's whole buffer for all_to_all), with slices of
 * `slice_bytes`: *seconds gets the predicted time for α seconds per message and β seconds per byte,
 * and `formula` (if not NULL) the formula with the numbers put in. */
COLL_API coll_result coll_cost_predict(const char *coll, int nranks, size_t bytes,
                                       size_t slice_bytes, double alpha, double beta,
                                       double *seconds, char *formula, size_t formula_len);
/* The cost model's parameters this communicator measured at creation (or read from
 * COLL_TUNE_FILE): alpha s per message, beta s per byte moved, gamma s per byte reduced,
 * alpha_oneshot the fixed cost of a one-shot call.  Any pointer may be NULL. */
COLL_API coll_result coll_comm_tune_params(coll_comm_t comm, double *alpha, double *beta,
                                           double *gamma, double *alpha_oneshot);
/* Where those parameters came from: "measured", "cache" (COLL_TUNE_FILE or the default
 * cache), "defaults" (COLL_TUNE=0, or a single rank) or "busy" (measured while more than
 * COLL_TUNE_BUSY per cent of a rank's time went to other processes, so the fixed defaults
 * serve instead).  *foreign (may be NULL) gets that share, 0..1, for a measurement or a
 * cache line that recorded it, else -1.  NULL if comm is NULL. */
COLL_API const char *coll_comm_tune_source(coll_comm_t comm, double *foreign);
/* The algorithm this communicator runs for `coll` ("all_reduce", ...) at `bytes` (as
 * nccl-tests counts them), honouring COLL_ALGO; `why` (may be NULL) gets every
 * candidate's predicted time, e.g. "ring 3.2 us, tree 2.1 us, oneshot 0.4 us".  NULL
 * for an unknown collective. */
COLL_API const char *coll_comm_algo_for(coll_comm_t comm, const char *coll, size_t bytes, char *why,
                                        size_t why_len);
/* Row `algo` of the algorithm table ("ring", "oneshot", ...) priced as the tuner prices
 * it on this communicator (its measured α, β, γ) for `coll` at `bytes`: *seconds gets the
 * prediction, `formula` (if not NULL) the row's formula with the numbers put in.
 * COLL_ERR_INVALID_ARG for an unknown name or a row that cannot serve `coll`. */
COLL_API coll_result coll_comm_algo_cost(coll_comm_t comm, const char *coll, size_t bytes,
                                         const char *algo, double *seconds, char *formula,
                                         size_t formula_len);
/* The hosts this communicator's ranks run on (same COLL_HOST_ID, else same hostname and
 * boot: one host): *nhosts; *per_host, the ranks on every host when all hosts hold the
 * same number, else 0; host_of[r] (nranks entries), hosts numbered 0.. in order of their
 * first rank.  Any pointer may be NULL. */
COLL_API coll_result coll_comm_hosts(coll_comm_t comm, int *nhosts, int *per_host, int *host_of);
/* The cost model's links across hosts (measured at creation between rank 0 and the first
 * rank of another host; defaults on one host): s per message, s per byte.  Either may be
 * NULL. */
COLL_API coll_result coll_comm_net_params(coll_comm_t comm, double *alpha_net, double *beta_net);
/* The bytes `rank` sends over links inside its host (*inside) and across hosts (*across)
 * when row `algo` ("ring", "hier", ...) runs `coll` on `count` elements of `dtype` (the
 * count the collective's call takes: per rank for all_gather and reduce_scatter) on this
 * communicator: summed from the schedule the executor would run, not from a formula.
 * COLL_ERR_INVALID_ARG for an unknown name, a rank out of range, or a row that runs no
 * schedule (oneshot, direct, mapped). */
COLL_API coll_result coll_comm_link_bytes(coll_comm_t comm, const char *coll, size_t count,
                                          coll_dtype dtype, const char *algo, int rank,
                                          uint64_t *inside, uint64_t *across);
/* The algorithm the last finished collective of this communicator ran ("ring",
 * "oneshot", "mapped", ...); NULL before the first, and after a call that failed before
 * any algorithm ran it (the communicator had already failed, or a peer was known dead). */
COLL_API const char *coll_comm_last_algo(coll_comm_t comm);
/* Bytes of one FIFO slot (the pipelining slice) on this communicator. */
COLL_API coll_result coll_comm_slice_bytes(coll_comm_t comm, size_t *bytes);
/* Name of the transport this communicator uses ("shm", ...). */
COLL_API const char *coll_comm_transport_name(coll_comm_t comm);

#ifdef __cplusplus
}
#endif
#endif
