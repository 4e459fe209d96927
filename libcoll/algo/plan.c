/* plan.c — choosing an algorithm and building this rank's schedule.
 *
 * The algorithms live one per file (ring.c, tree.c, rd.c, pairwise.c, linear.c); this file
 * picks one (a forced algorithm that cannot serve the call falls back to the
 * collective's default: the ring, pairwise for all-to-all, linear for gather and
 * scatter), handles the
 * cases that need no algorithm at all (one rank, point-to-point), and names things for
 * logs and traces.  Pure: no I/O, no allocation, no globals.
 *
 * Costs of what this file schedules itself (α per message, β per byte, n bytes):
 *   send / recv       α + n·β      (one FIFO, pipelined in slots)
 *   sendrecv          α + max(n_send, n_recv)·β   (the two directions interleave)
 *   any collective on one rank: a local copy, n·β_mem (nothing when in place)
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "linear.h"
#include "pairwise.h"
#include "rd.h"
#include "ring.h"
#include "tree.h"

/* ring: 2p + 2; tree: at most 5 per rank (up and down in two trees, one of them with a
 * second child); rd/rhd: a copy, the folds (all-gather's fold-out in two ranges) and
 * two steps per phase, at most 4·ceil(log2 p) + 4; pairwise: a copy and two steps per
 * peer, 2p - 1; linear: the root's copy and one step per peer, p. */
size_t coll_plan_max_steps(int nranks) {
  size_t p = (size_t)(nranks > 0 ? nranks : 1), lg = 0, ring = 2 * p + 2, rd;
  while (((size_t)1 << lg) < p) lg++;
  rd = 4 * lg + 4;
  return (ring > rd ? ring : rd) > 8 ? (ring > rd ? ring : rd) : 8;
}

void coll_ring_chunk(size_t count, int n, int i, size_t *off, size_t *len) {
  size_t base = count / (size_t)n, extra = count % (size_t)n, ui = (size_t)i;
  *len = base + (ui < extra ? 1 : 0);
  *off = ui * base + (ui < extra ? ui : extra);
}

static void push(coll_step *steps, size_t *n, coll_step s) {
  if (s.count > 0) steps[(*n)++] = s;
}

/* One rank: every collective is a local copy (or nothing when in place). */
static void plan_single(const coll_plan_args *a, coll_step *steps, size_t *n) {
  size_t cnt = a->count;
  if (a->coll == COLL_COLL_BARRIER) return;
  coll_step s = {.kind = COLL_STEP_COPY, .peer_in = -1, .peer_out = -1,
                 .src_buf = COLL_BUF_SEND, .dst_buf = COLL_BUF_RECV, .count = cnt,
                 .chunk = 0, .final = 1};
  if (a->in_place) return; /* nothing moves; AVG over one rank divides by one */
  push(steps, n, s);
}

coll_result coll_plan_build(const coll_plan_args *a, coll_step *steps, size_t *nsteps) {
  *nsteps = 0;
  if (a->nranks < 1 || a->rank < 0 || a->rank >= a->nranks) return COLL_ERR_INVALID_ARG;
  if (a->coll == COLL_COLL_SEND || a->coll == COLL_COLL_RECV) {
    if (a->root < 0 || a->root >= a->nranks || a->root == a->rank) return COLL_ERR_INVALID_ARG;
    bool send = a->coll == COLL_COLL_SEND;
    coll_step s = {.kind = send ? COLL_STEP_SEND : COLL_STEP_RECV,
                   .peer_in = send ? -1 : a->root, .peer_out = send ? a->root : -1,
                   .src_buf = COLL_BUF_SEND, .dst_buf = COLL_BUF_RECV,
                   .count = a->count, .chunk = -1};
    push(steps, nsteps, s);
    return COLL_OK;
  }
  if (a->coll == COLL_COLL_SENDRECV) {
    bool self_out = a->root == a->rank, self_in = a->recv_peer == a->rank;
    if (a->root < 0 || a->root >= a->nranks || a->recv_peer < 0 ||
        a->recv_peer >= a->nranks || self_out != self_in ||
        (self_out && a->count != a->recv_count))
      return COLL_ERR_INVALID_ARG;
    if (self_out) {
      coll_step s = {.kind = COLL_STEP_COPY, .peer_in = -1, .peer_out = -1,
                     .src_buf = COLL_BUF_SEND, .dst_buf = COLL_BUF_RECV, .count = a->count,
                     .chunk = -1};
      push(steps, nsteps, s);
      return COLL_OK;
    }
    /* Two independent steps: the executor interleaves their slices round by round, so
     * the send never waits for the whole receive (or the other way round). */
    coll_step s = {.kind = COLL_STEP_SEND, .peer_in = -1, .peer_out = a->root,
                   .src_buf = COLL_BUF_SEND, .dst_buf = COLL_BUF_RECV, .count = a->count,
                   .chunk = -1};
    coll_step r = {.kind = COLL_STEP_RECV, .peer_in = a->recv_peer, .peer_out = -1,
                   .src_buf = COLL_BUF_RECV, .dst_buf = COLL_BUF_RECV,
                   .count = a->recv_count, .chunk = -1};
    push(steps, nsteps, s);
    push(steps, nsteps, r);
    return COLL_OK;
  }
  if ((a->coll == COLL_COLL_BROADCAST || a->coll == COLL_COLL_REDUCE) &&
      (a->root < 0 || a->root >= a->nranks))
    return COLL_ERR_INVALID_ARG;
  /* The newer collectives have one schedule each, which also covers one rank. */
  if (a->coll == COLL_COLL_ALL_TO_ALL || a->coll == COLL_COLL_ALL_TO_ALLV)
    return coll_pairwise_plan(a, steps, nsteps);
  if (a->coll == COLL_COLL_GATHER || a->coll == COLL_COLL_SCATTER)
    return coll_linear_plan(a, steps, nsteps);
  if (a->nranks == 1) {
    plan_single(a, steps, nsteps);
    return COLL_OK;
  }
  coll_algo algo = coll_algo_serves(a->algo, a->coll, a->nranks) ? a->algo : COLL_ALGO_RING;
  switch (algo) {
  case COLL_ALGO_TREE: return coll_tree_plan(a, steps, nsteps);
  case COLL_ALGO_RD: return coll_rd_plan(a, steps, nsteps);
  case COLL_ALGO_RHD: return coll_rhd_plan(a, steps, nsteps);
  case COLL_ALGO_AUTO: /* the tuner chooses before the plan is built; ring until then */
  case COLL_ALGO_RING:
    return coll_ring_plan(a, steps, nsteps);
  default: break; /* not a schedule here (one-shot), or not built */
  }
  return COLL_ERR_INVALID_ARG;
}

coll_algo coll_algo_default(coll_coll_kind c) {
  if (c == COLL_COLL_ALL_TO_ALL || c == COLL_COLL_ALL_TO_ALLV) return COLL_ALGO_PAIRWISE;
  if (c == COLL_COLL_GATHER || c == COLL_COLL_SCATTER) return COLL_ALGO_LINEAR;
  return COLL_ALGO_RING;
}

bool coll_algo_serves(coll_algo a, coll_coll_kind c, int nranks) {
  if (c == COLL_COLL_SEND || c == COLL_COLL_RECV || c == COLL_COLL_SENDRECV || nranks == 1)
    return (unsigned)a < COLL_NUM_ALGOS;
  switch (a) {
  case COLL_ALGO_AUTO:
    return (unsigned)c < COLL_NUM_COLLS;
  case COLL_ALGO_RING:
    return (unsigned)c < COLL_NUM_COLLS && coll_algo_default(c) == COLL_ALGO_RING;
  case COLL_ALGO_PAIRWISE:
    return c == COLL_COLL_ALL_TO_ALL || c == COLL_COLL_ALL_TO_ALLV;
  case COLL_ALGO_LINEAR:
    return c == COLL_COLL_GATHER || c == COLL_COLL_SCATTER;
  case COLL_ALGO_TREE:
    return c == COLL_COLL_BROADCAST || c == COLL_COLL_REDUCE || c == COLL_COLL_ALL_REDUCE ||
           c == COLL_COLL_BARRIER;
  case COLL_ALGO_RD:
    return c == COLL_COLL_ALL_REDUCE || c == COLL_COLL_ALL_GATHER || c == COLL_COLL_BARRIER;
  case COLL_ALGO_RHD:
    return c == COLL_COLL_ALL_REDUCE || c == COLL_COLL_ALL_GATHER;
  case COLL_ALGO_ONESHOT:
  case COLL_ALGO_DIRECT:
  case COLL_ALGO_MAPPED:
    return false; /* not schedules: oneshot.c / direct.c / mapped.c run them */
  }
  return false;
}

coll_result coll_algo_cost(coll_algo a, coll_coll_kind c, int p, double n, double slice,
                           double alpha, double beta, double gamma, double *seconds,
                           char *formula, size_t formula_len) {
  if (p < 1 || !(n >= 0) || !(slice > 0)) return COLL_ERR_INVALID_ARG;
  if (c != COLL_COLL_SEND && c != COLL_COLL_RECV && c != COLL_COLL_SENDRECV &&
      !coll_algo_serves(a, c, p))
    return COLL_ERR_INVALID_ARG;
  switch (a) {
  case COLL_ALGO_AUTO: return COLL_ERR_INVALID_ARG; /* not an algorithm: the tuner's choice */
  case COLL_ALGO_ONESHOT:
  case COLL_ALGO_DIRECT:
  case COLL_ALGO_MAPPED: return COLL_ERR_INVALID_ARG; /* priced in tune.c */
  case COLL_ALGO_TREE: return coll_tree_cost(c, p, n, slice, alpha, beta, gamma, seconds, formula, formula_len);
  case COLL_ALGO_RD: return coll_rd_cost(c, p, n, slice, alpha, beta, gamma, seconds, formula, formula_len);
  case COLL_ALGO_RHD: return coll_rhd_cost(c, p, n, slice, alpha, beta, gamma, seconds, formula, formula_len);
  case COLL_ALGO_PAIRWISE: return coll_pairwise_cost(c, p, n, slice, alpha, beta, gamma, seconds, formula, formula_len);
  case COLL_ALGO_LINEAR: return coll_linear_cost(c, p, n, slice, alpha, beta, gamma, seconds, formula, formula_len);
  case COLL_ALGO_RING: break;
  }
  coll_result r = coll_ring_cost(c, p, n, slice, alpha, beta, seconds, formula, formula_len);
  if (r != COLL_OK || p == 1) return r;
  /* ring.c's formula leaves the additions out; add them here so every algorithm is
   * compared with γ counted (ring.c's comment: (p-1)/p·n·γ for all-reduce and
   * reduce-scatter, chain reduce n·γ). */
  double red = 0;
  if (c == COLL_COLL_ALL_REDUCE || c == COLL_COLL_REDUCE_SCATTER) red = (double)(p - 1) / p * n;
  if (c == COLL_COLL_REDUCE) red = n;
  if (red > 0) {
    *seconds += red * gamma;
    size_t used = strlen(formula);
    if (used < formula_len)
      snprintf(formula + used, formula_len - used, " + %.0f B*%.4f ns/B reduced = %.2f us", red,
               gamma * 1e9, *seconds * 1e6);
  }
  return COLL_OK;
}

const char *coll_coll_name(coll_coll_kind c) {
  static const char *names[] = {"broadcast", "reduce", "all_reduce", "reduce_scatter",
                                "all_gather", "send", "recv", "barrier",
                                "sendrecv", "all_to_all", "all_to_allv", "gather",
                                "scatter"};
  return (unsigned)c < COLL_NUM_COLLS ? names[c] : "?";
}

const char *coll_step_name(coll_step_kind k) {
  static const char *names[] = {"copy", "send", "recv", "recv-copy-send", "recv-reduce-send",
                                "recv-reduce-copy", "recv-reduce-copy-send",
                                "recv2-reduce-send"};
  return (unsigned)k <= COLL_STEP_RECV2_REDUCE_SEND ? names[k] : "?";
}

const char *coll_algo_name(coll_algo a) {
  switch (a) {
  case COLL_ALGO_AUTO: return "auto";
  case COLL_ALGO_RING: return "ring";
  case COLL_ALGO_TREE: return "tree";
  case COLL_ALGO_RD: return "rd";
  case COLL_ALGO_RHD: return "rhd";
  case COLL_ALGO_ONESHOT: return "oneshot";
  case COLL_ALGO_DIRECT: return "direct";
  case COLL_ALGO_MAPPED: return "mapped";
  case COLL_ALGO_PAIRWISE: return "pairwise";
  case COLL_ALGO_LINEAR: return "linear";
  }
  return "?";
}

coll_algo coll_algo_from_name(const char *s, bool *ok) {
  static const struct { const char *name; coll_algo a; } names[] = {
      {"auto", COLL_ALGO_AUTO}, {"ring", COLL_ALGO_RING}, {"tree", COLL_ALGO_TREE},
      {"rd", COLL_ALGO_RD}, {"recursive_doubling", COLL_ALGO_RD}, {"rhd", COLL_ALGO_RHD},
      {"rabenseifner", COLL_ALGO_RHD}, {"oneshot", COLL_ALGO_ONESHOT},
      {"direct", COLL_ALGO_DIRECT}, {"mapped", COLL_ALGO_MAPPED},
      {"pairwise", COLL_ALGO_PAIRWISE}, {"linear", COLL_ALGO_LINEAR}};
  for (size_t i = 0; s && i < sizeof names / sizeof *names; i++)
    if (strcmp(s, names[i].name) == 0) {
      *ok = true;
      return names[i].a;
    }
  *ok = false;
  return COLL_ALGO_AUTO;
}
