/* plan.h — algorithms as data.
 *
 * An algorithm is a pure function from (collective, count, nranks, rank, root) to this
 * rank's schedule: an ordered list of steps over element ranges of the user's send and
 * receive buffers.  The executor streams each step's range through the connector in
 * slices; because both ends of a connection slice equal-length ranges the same way,
 * slices pair up without any negotiation.  Nothing here does I/O, allocates behind the
 * caller's back, or knows about dtypes beyond counting elements: the same schedule is
 * what the trace prints and what the tests check for invariants.  The vocabulary of a
 * schedule (coll_algo, coll_step and the rest: types only) is base/schedule.h's, so that
 * internal.h can hold steps without including this layer's header.
 */
#ifndef COLL_PLAN_H
#define COLL_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "coll.h"
#include "schedule.h"
#include "vocab.h"


/* Appends a step from the send buffer to the receive buffer (left out when count is 0,
 * as both ends of a connection leave it out): the shape of the pairwise and linear plans. */
static inline void coll_plan_add(coll_step *steps, size_t *n, coll_step_kind kind, int in, int out,
                                 size_t src_off, size_t dst_off, size_t count, int chunk) {
  if (count == 0) return;
  steps[(*n)++] = (coll_step){.kind = kind,
                              .peer_in = in,
                              .peer_out = out,
                              .peer_in2 = -1,
                              .src_buf = COLL_BUF_SEND,
                              .dst_buf = COLL_BUF_RECV,
                              .src_off = src_off,
                              .dst_off = dst_off,
                              .count = count,
                              .chunk = chunk};
}

/* The most steps any algorithm here produces for nranks ranks (a group's
 * point-to-point plan has one step per operation instead: its caller sizes it). */
size_t coll_plan_max_steps(int nranks);

struct coll_algo_entry; /* algo.h */

typedef struct {
  coll_coll_kind coll;
  coll_algo algo;
  /* algo's row of the table when the caller already holds it (the executor: the one
   * the tuner returned), so that coll_plan_build does not look it up again; NULL: it
   * looks algo up.  Never a row other than algo's. */
  const struct coll_algo_entry *row;
  size_t count;           /* all_reduce/broadcast/reduce/send/recv: count; reduce_scatter:
                             recvcount; all_gather/gather: sendcount; all_to_all: elements per
                             block (per peer); scatter: recvcount; all_to_allv: unused */
  int nranks, rank, root; /* root: broadcast/reduce root; send/recv: the peer */
  int in_place;           /* send and recv buffers are the in-place pair */
  size_t recv_count;      /* sendrecv: elements received (count is elements sent) */
  int recv_peer;          /* sendrecv: the source (root is the destination) */
  /* Which host each rank runs on (comm.c builds it once per communicator).  NULL: not
   * known, as if every rank shared one host.  Only host-aware rows read it (hier.c). */
  const coll_hosts *hosts;
  size_t slice; /* elements per slice the executor will cut steps into; plans
                   whose steps read what earlier steps wrote at other offsets
                   (rhd) delay by it.  0: as if no step were ever cut. */
  /* COLL_COLL_GROUP_P2P: the operations in call order (count and slice in bytes), and
   * 2 * nranks scratch entries the plan may overwrite; steps needs ngroup entries. */
  const coll_group_op *group;
  size_t ngroup;
  size_t *scratch;
  /* all_to_allv: per peer, elements sent to it and where they start in the send buffer,
   * elements received from it and where they go in the receive buffer (nranks each). */
  const size_t *sendcounts, *sdispls, *recvcounts, *rdispls;
} coll_plan_args;

/* Fills steps[0..*nsteps) (capacity coll_plan_max_steps(nranks)).  Steps with count 0
 * are left out: both ends of a connection leave out the same ones.  Returns
 * COLL_ERR_INVALID_ARG for arguments no algorithm can serve. */
coll_result coll_plan_build(const coll_plan_args *a, coll_step *steps, size_t *nsteps);

/* Ring chunking: `count` elements split into n chunks whose sizes differ by at most one
 * (the first count % n chunks are one longer).  Chunk i is [off, off+len).  Inline:
 * ring.c and rd.c ask it for every chunk of a plan (direct.c and mapped.c for their
 * blocks), and a call into plan.c for two divisions sent the plan builder back and
 * forth between two files. */
static inline void coll_ring_chunk(size_t count, int n, int i, size_t *off, size_t *len) {
  size_t base = count / (size_t)n, extra = count % (size_t)n, ui = (size_t)i;
  *len = base + (ui < extra ? 1 : 0);
  *off = ui * base + (ui < extra ? ui : extra);
}

const char *coll_step_name(coll_step_kind k);
const char *coll_algo_name(coll_algo a);
/* The schedule that serves c when nothing better is chosen or a forced algorithm cannot
 * serve it: pairwise for all-to-all(v), linear for gather and scatter, else the ring. */
coll_algo coll_algo_default(coll_coll_kind c);
/* A row's name or alias from the table ("ring", "rabenseifner", ...); *ok = false (and
 * AUTO returned) for anything else. */
coll_algo coll_algo_from_name(const char *s, bool *ok);
/* Whether algorithm `a` serves collective c on nranks ranks (its row in the table,
 * algo.h).  Point-to-point and one-rank calls need no algorithm: true for every `a`. */
bool coll_algo_serves(coll_algo a, coll_coll_kind c, int nranks);
/* Whether `a` runs as a schedule of steps (ring, tree, rd, rhd), not a run function. */
bool coll_algo_has_plan(coll_algo a);
/* "auto, ring, tree, ..." — every COLL_ALGO name, for messages; returns the length. */
size_t coll_algo_names(char *buf, size_t len);
/* The cost of collective c by algorithm a, from the formula at the top of the
 * algorithm's file: p ranks, n bytes (nccl-tests' convention: the whole vector for
 * all-reduce/broadcast/reduce, the whole output of all-gather, the whole input of
 * reduce-scatter, one rank's whole send buffer of all-to-all, the root's whole buffer of
 * gather and scatter), slices of `slice` bytes, α s/message, β s/byte moved, γ s/byte
 * reduced (rows with constants of their own — one-shot, direct, mapped — take α and β
 * for them here).  Writes the formula with its numbers into `formula`.
 * COLL_ERR_INVALID_ARG when a cannot serve c (AUTO is not an algorithm). */
coll_result coll_algo_cost(coll_algo a, coll_coll_kind c, int p, double n, double slice,
                           double alpha, double beta, double gamma, double *seconds, char *formula,
                           size_t formula_len);

#endif
