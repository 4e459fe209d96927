/* pairwise.c — all-to-all and all-to-allv as one exchange with every peer at once.
 *
 * Rank r owes block q of its send buffer to rank q and is owed block r of every rank's.
 * Ranks are paired symmetrically: at position k = 0..p-1 rank r pairs with
 * q = (k - r) mod p, and q pairs with r at the same position (r + q = k mod p).  Each
 * pair is two steps, a SEND of block q to q and a RECV of q's block into block q of the
 * receive buffer; the position where a rank pairs with itself (2r = k mod p) is a local
 * COPY of its own block.
 *
 *   p = 4, rank 1:   k=0  q=3   send b3 -> 3, recv b3 <- 3
 *                    k=1  q=0   send b0 -> 0, recv b0 <- 0
 *                    k=2  q=1   copy b1 (own block)
 *                    k=3  q=2   send b2 -> 2, recv b2 <- 2
 *
 * The executor does not run the pairs one after another: it interleaves all steps slice
 * by slice, round by round, so every connection carries one slice per round and all p-1
 * exchanges proceed together.  No deadlock with FIFOs of any depth: a rank waiting to
 * send waits for a peer still in an earlier round; a rank waiting to receive at position
 * k waits for a peer that has not reached its send at position k of the same round, so
 * is waiting at a smaller position (or in an earlier round), and positions cannot
 * decrease all the way round a cycle.  (test_plan.c runs every plan against FIFOs of one
 * and two slots.)
 *
 * In place (all_to_all with sendbuf == recvbuf): a block is sent and received at the same
 * position, and within a round the send's slice is copied into the slot before the
 * receive's slice lands on it, so block q's outgoing bytes leave before q's incoming ones
 * overwrite them; the symmetric pairing is what makes this possible.  all_to_allv is
 * never in place (api.c refuses it).
 *
 * Cost (p ranks, n bytes = one rank's whole send buffer, α per message, β per byte moved
 * through a FIFO):
 *   all-to-all      (p-1)·α + (p-1)/p·n·β
 * Every rank sends and receives (p-1)/p·n bytes, the least any all-to-all can; each
 * byte is copied twice (into the slot and out).  The own block's local copy (n/p bytes)
 * is not counted, as ring.c does not count all-gather's.  all-to-allv has no one n (the
 * ranks' totals differ); the tuner does not price it (tune.c).
 *
 * Must never: send a block anywhere but to its owner, write outside the blocks that the
 * counts and displacements name (gaps between blocks stay untouched), or depend on
 * anything but its arguments: every rank's plan must pair up with every other's.
 */
#include <stdio.h>

#include "pairwise.h"

static int mod(int a, int n) { return ((a % n) + n) % n; }

static void add(coll_step *steps, size_t *n, coll_step_kind kind, int in, int out,
                size_t so, size_t doff, size_t count, int chunk) {
  if (count == 0) return;
  steps[(*n)++] = (coll_step){.kind = kind, .peer_in = in, .peer_out = out,
                              .peer_in2 = -1, .src_buf = COLL_BUF_SEND,
                              .dst_buf = COLL_BUF_RECV, .src_off = so, .dst_off = doff,
                              .count = count, .chunk = chunk};
}

coll_result coll_pairwise_plan(const coll_plan_args *a, coll_step *steps, size_t *nsteps) {
  int p = a->nranks, r = a->rank;
  bool v = a->coll == COLL_COLL_ALL_TO_ALLV;
  *nsteps = 0;
  if (a->coll != COLL_COLL_ALL_TO_ALL && !v) return COLL_ERR_INVALID_ARG;
  if (v && (!a->sendcounts || !a->sdispls || !a->recvcounts || !a->rdispls || a->in_place))
    return COLL_ERR_INVALID_ARG;
  for (int k = 0; k < p; k++) {
    int q = mod(k - r, p);
    size_t sc = v ? a->sendcounts[q] : a->count, rc = v ? a->recvcounts[q] : a->count;
    size_t so = v ? a->sdispls[q] : (size_t)q * a->count;
    size_t ro = v ? a->rdispls[q] : (size_t)q * a->count;
    if (q == r) {
      if (sc != rc) return COLL_ERR_INVALID_ARG; /* its own block: a copy of one size */
      if (!a->in_place) add(steps, nsteps, COLL_STEP_COPY, -1, -1, so, ro, sc, q);
      continue;
    }
    add(steps, nsteps, COLL_STEP_SEND, -1, q, so, ro, sc, q);
    add(steps, nsteps, COLL_STEP_RECV, q, -1, so, ro, rc, q);
  }
  return COLL_OK;
}

coll_result coll_pairwise_cost(coll_coll_kind c, int p, double n, double slice, double alpha,
                               double beta, double gamma, double *seconds, char *formula,
                               size_t formula_len) {
  (void)slice, (void)gamma;
  if (c != COLL_COLL_ALL_TO_ALL || p < 1) return COLL_ERR_INVALID_ARG;
  if (p == 1) {
    *seconds = 0;
    snprintf(formula, formula_len, "one rank: a local copy, no messages");
    return COLL_OK;
  }
  double steps = p - 1, bytes = (double)(p - 1) / p * n;
  *seconds = steps * alpha + bytes * beta;
  snprintf(formula, formula_len,
           "(p-1)*a + (p-1)/p*n*b with p=%d, n=%.0f B: %.0f*%.3f us + %.0f B*%.4f ns/B = "
           "%.2f us + %.2f us = %.2f us",
           p, n, steps, alpha * 1e6, bytes, beta * 1e9, steps * alpha * 1e6, bytes * beta * 1e6,
           *seconds * 1e6);
  return COLL_OK;
}
