/* pairwise.c — all-to-all and all-to-allv as one exchange with every peer at once.
 *
 * Rank r owes block q of its send buffer to rank q and is owed block r of every rank's.
 * The plan is a SEND of block q to every peer q, then the local COPY of the own block,
 * then a RECV from every peer q into block q of the receive buffer.  Peers are taken in
 * the order q = (k - r) mod p, k = 0..p-1, which pairs ranks symmetrically (r + q = k:
 * r's k-th partner has r as its k-th) and staggers them, so the ranks do not all send
 * to rank 0 first.
 *
 *   p = 4, rank 1:   send b3 -> 3, send b0 -> 0, send b2 -> 2    (k = 0, 1, 3)
 *                    copy b1                                      (k = 2: itself)
 *                    recv b3 <- 3, recv b0 <- 0, recv b2 <- 2
 *
 * The executor interleaves all steps slice by slice, round by round: in round j a rank
 * posts slice j to every peer before it waits for any peer's slice j, so all p-1
 * exchanges proceed together, and with more ranks than cores a rank that gets the CPU
 * hands every peer its data before it sleeps (waiting for one peer between two sends
 * made 4 ranks on 2 cores switch context per peer).  No deadlock with FIFOs of any
 * depth: a send waits only for a receiver still in an earlier round; a receive in round
 * j waits for a sender that is in an earlier round or still posting its round-j sends,
 * which themselves wait only on earlier rounds.  (test_plan.c runs every plan against
 * FIFOs of one and two slots.)
 *
 * In place (all_to_all with sendbuf == recvbuf): block q is sent and received, and in
 * every round its send slice is copied into the slot before its receive slice lands on
 * it, so block q's outgoing bytes leave before q's incoming ones overwrite them.
 * all_to_allv is never in place (api.c refuses it).
 *
 * Cost (p ranks, n bytes = one rank's whole send buffer, α per message, β per byte moved
 * through a FIFO):
 *   all-to-all      (p-1)·α + 2·(p-1)/p·n·β
 * Every rank sends and receives (p-1)/p·n bytes, the least any all-to-all can.  Each
 * byte is copied twice, into a slot and out of it, by the sender's core and the
 * receiver's: the 2 says that a rank's core does both for its (p-1)/p·n bytes, since it
 * sends as much as it receives, while β (a ping-pong, tune.c) saw one copy per byte
 * per core.  The own block's local copy (n/p bytes) is not counted.  all-to-allv has no one n (the
 * ranks' totals differ); the tuner does not price it (tune.c).
 *
 * Must never: send a block anywhere but to its owner, write outside the blocks that the
 * counts and displacements name (gaps between blocks stay untouched), or depend on
 * anything but its arguments: every rank's plan must pair up with every other's.
 */
#include <stdio.h>

#include "algo.h"
#include "pairwise.h"

static int mod(int a, int n) { return ((a % n) + n) % n; }


coll_result coll_pairwise_plan(const coll_plan_args *a, coll_step *steps, size_t *nsteps) {
  int p = a->nranks, r = a->rank;
  bool v = a->coll == COLL_COLL_ALL_TO_ALLV;
  *nsteps = 0;
  if (a->coll != COLL_COLL_ALL_TO_ALL && !v) return COLL_ERR_INVALID_ARG;
  if (v && (!a->sendcounts || !a->sdispls || !a->recvcounts || !a->rdispls || a->in_place))
    return COLL_ERR_INVALID_ARG;
  /* Three passes over the partners in the same order: the sends, the own block, the
   * receives. */
  for (int pass = 0; pass < 3; pass++)
    for (int k = 0; k < p; k++) {
      int q = mod(k - r, p);
      size_t sc = v ? a->sendcounts[q] : a->count, rc = v ? a->recvcounts[q] : a->count;
      size_t so = v ? a->sdispls[q] : (size_t)q * a->count;
      size_t ro = v ? a->rdispls[q] : (size_t)q * a->count;
      if (q == r) {
        if (sc != rc) return COLL_ERR_INVALID_ARG; /* its own block: a copy of one size */
        if (pass == 1 && !a->in_place)
          coll_plan_add(steps, nsteps, COLL_STEP_COPY, -1, -1, so, ro, sc, q);
      } else if (pass == 0) {
        coll_plan_add(steps, nsteps, COLL_STEP_SEND, -1, q, so, ro, sc, q);
      } else if (pass == 2) {
        coll_plan_add(steps, nsteps, COLL_STEP_RECV, q, -1, so, ro, rc, q);
      }
    }
  return COLL_OK;
}

coll_result coll_pairwise_cost(coll_coll_kind c, double n, const coll_cost_model *m,
                               double *seconds, char *formula, size_t formula_len) {
  int p = m->p;
  double alpha = m->alpha, beta = m->beta;
  if (c != COLL_COLL_ALL_TO_ALL || p < 1) return COLL_ERR_INVALID_ARG;
  if (p == 1) {
    *seconds = 0;
    snprintf(formula, formula_len, "one rank: a local copy, no messages");
    return COLL_OK;
  }
  double steps = p - 1, bytes = 2.0 * (p - 1) / p * n;
  *seconds = steps * alpha + bytes * beta;
  snprintf(formula, formula_len,
           "(p-1)*a + 2(p-1)/p*n*b with p=%d, n=%.0f B: %.0f*%.3f us + %.0f B*%.4f ns/B = "
           "%.2f us + %.2f us = %.2f us",
           p, n, steps, alpha * 1e6, bytes, beta * 1e9, steps * alpha * 1e6, bytes * beta * 1e6,
           *seconds * 1e6);
  return COLL_OK;
}
