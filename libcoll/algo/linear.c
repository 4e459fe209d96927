/* linear.c — gather and scatter straight between the root and every other rank.
 *
 * Gather: every rank but the root sends its block to the root; the root receives block
 * q from rank q into place q of its receive buffer, from all ranks at once, and copies
 * its own block into place (nothing to copy in place: its block is already there).
 * Scatter is the mirror: the root sends block q of its send buffer to rank q and copies
 * its own block; every other rank receives its block.
 *
 *   gather, p = 4, root 1:     rank 0  --b0--.
 *                              rank 2  --b2--+-->  rank 1: [ b0 | b1 | b2 | b3 ]
 *                              rank 3  --b3--'
 *
 * The root's p-1 receives (sends) are steps of one plan, which the executor interleaves
 * slice by slice: one slice on every link per round, all links busy together.
 *
 * Cost (p ranks, n bytes = the root's whole buffer as nccl-tests counts it, α per
 * message, β per byte moved through a FIFO):
 *   gather, scatter      (p-1)·α + (p-1)/p·n·β
 * The root receives (sends) (p-1)/p·n bytes, which any gather (scatter) must.  A
 * binomial tree needs only ceil(log2 p) hops but moves the same bytes into the root and
 * forwards up to n/2 more through intermediate ranks; on one host the root's copies are
 * the bound, and the messages that only α matters for take the one-shot path (oneshot.c),
 * so no tree is kept.  The α terms overlap (every link starts at once), so the formula is
 * pessimistic at small sizes.
 *
 * Must never: touch a non-root rank's receive buffer in gather or send buffer in scatter
 * (the API lets them be NULL), or write outside the root's p blocks.
 */
#include <stdio.h>

#include "algo.h"
#include "linear.h"


coll_result coll_linear_plan(const coll_plan_args *a, coll_step *steps, size_t *nsteps) {
  int p = a->nranks, r = a->rank, root = a->root;
  size_t cnt = a->count;
  *nsteps = 0;
  if (root < 0 || root >= p) return COLL_ERR_INVALID_ARG;
  switch (a->coll) {
  case COLL_COLL_GATHER:
    if (r != root) {
      coll_plan_add(steps, nsteps, COLL_STEP_SEND, -1, root, 0, 0, cnt, r);
      return COLL_OK;
    }
    if (!a->in_place)
      coll_plan_add(steps, nsteps, COLL_STEP_COPY, -1, -1, 0, (size_t)r * cnt, cnt, r);
    for (int k = 1; k < p; k++) { /* the ranks after the root first, as the ring orders */
      int q = (root + k) % p;
      coll_plan_add(steps, nsteps, COLL_STEP_RECV, q, -1, 0, (size_t)q * cnt, cnt, q);
    }
    return COLL_OK;
  case COLL_COLL_SCATTER:
    if (r != root) {
      coll_plan_add(steps, nsteps, COLL_STEP_RECV, root, -1, 0, 0, cnt, r);
      return COLL_OK;
    }
    for (int k = 1; k < p; k++) {
      int q = (root + k) % p;
      coll_plan_add(steps, nsteps, COLL_STEP_SEND, -1, q, (size_t)q * cnt, 0, cnt, q);
    }
    if (!a->in_place)
      coll_plan_add(steps, nsteps, COLL_STEP_COPY, -1, -1, (size_t)r * cnt, 0, cnt, r);
    return COLL_OK;
  default: return COLL_ERR_INVALID_ARG;
  }
}

coll_result coll_linear_cost(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                             char *formula, size_t formula_len) {
  int p = m->p;
  double alpha = m->alpha, beta = m->beta;
  if ((c != COLL_COLL_GATHER && c != COLL_COLL_SCATTER) || p < 1) return COLL_ERR_INVALID_ARG;
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
