/* ring.c — ring and chain schedules for the five collectives.
 *
 * Ranks form the ring 0 -> 1 -> ... -> p-1 -> 0; every rank only ever sends to
 * next = r+1 and receives from prev = r-1 (mod p).  The data is cut into p chunks
 * (coll_ring_chunk: sizes differ by at most one element).
 *
 * All-reduce = reduce-scatter then all-gather.  Reduce-scatter, step s = 0..p-2: rank r
 * sends chunk r-1-s and receives chunk r-2-s, adding its own contribution; after p-1
 * steps rank r holds chunk r reduced over all ranks.  Picture for p = 4 (which chunk
 * each rank sends at each step; after the last step rank r owns chunk r):
 *
 *            rank0  rank1  rank2  rank3
 *   step 0     c3     c0     c1     c2      (own data)
 *   step 1     c2     c3     c0     c1      (received + own, forwarded)
 *   step 2     c1     c2     c3     c0      -> then rank r holds c_r complete
 *
 * All-gather then circulates the finished chunks for p-1 more steps.  The rank that
 * finishes a chunk divides it for COLL_AVG before anyone copies it, so every rank ends
 * with the same bits, and the reduction order of each element is fixed (it starts at
 * the rank after its owner and goes round the ring), so a rerun gives the same bits.
 *
 * Cost (p ranks, n bytes, α per message, β per byte moved, γ per byte reduced):
 *   all-reduce      2(p-1)·α + 2·(p-1)/p·n·β + (p-1)/p·n·γ
 *   reduce-scatter   (p-1)·α +   (p-1)/p·n·β + (p-1)/p·n·γ      (n = whole input)
 *   all-gather       (p-1)·α +   (p-1)/p·n·β                    (n = whole output)
 * Every rank sends 2(p-1)/p·n bytes in all-reduce, which is the lower bound for any
 * algorithm, hence "bandwidth-optimal"; the price is the 2(p-1) latency terms.
 *
 * Lead (all-reduce, 2 ranks).  The executor runs slice j of every step in round j, so
 * without delays each round is a lockstep: copy slice j in, wait for the peer's slice j,
 * reduce it and pass it back, wait for the peer's reduced slice j, copy it out.  Every
 * round then waits twice on the other core, and a stall on either core stops both.
 * With a lead of one round per phase (the reduction runs one slice behind the send, the
 * final copy one behind the reduction) each wait is for a slice the peer posted a round
 * earlier, and a latency shorter than a slice's transfer hides behind the next slice:
 *   all-reduce, p = 2, α below a slice's n/(2k)·β     α + n·β   (the bound, and one hop)
 * A connection then holds up to 2·lead + 2 = 4 unread slices (the send of slice j and
 * the reduction of j-1 posted while the peer's reduction of j-1 still waits for room):
 * every transport's FIFO has 4 slots or more.  test_plan's sweep runs two ranks with 4
 * (with 3 it finds the deadlock).  Measured on this repository's 2-core VM, 1 MiB float
 * sum, six interleaved rounds: 166-232 µs out of place (mean 193) against 174-256 (mean
 * 204) without the lead, in place mean 163 against 180 (lab/perf-log.md, 2026-11-30).
 * More ranks keep lead 0 (not tried: their 2p-2 phases in flight would hold more slices
 * per FIFO, and the sweep would have to prove each p).
 *
 * Broadcast and reduce are pipelined chains rooted anywhere: broadcast runs
 * root -> root+1 -> ... -> root-1; reduce runs root+1 -> ... -> root-1 -> root.  Cut into
 * k slices of n/k bytes, the slices flow down the chain like a pipeline:
 *   broadcast       (p-1+k-1)·(α + n/k·β)
 *   reduce          (p-1+k-1)·(α + n/k·(β+γ))
 * which approaches n·β (n·(β+γ)) for large n: each link carries the data once.
 *
 * Pure: builds steps, touches no memory but `steps`, never fails for valid arguments.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "algo.h"
#include "ring.h"

static int mod(int a, int n) { return ((a % n) + n) % n; }

static void add(coll_step *steps, size_t *n, coll_step_kind kind, int in, int out, coll_buf sb,
                size_t so, coll_buf db, size_t doff, size_t count, int chunk, int final) {
  if (count == 0) return;
  steps[(*n)++] = (coll_step){.kind = kind,
                              .peer_in = in,
                              .peer_out = out,
                              .peer_in2 = -1,
                              .src_buf = sb,
                              .dst_buf = db,
                              .src_off = so,
                              .dst_off = doff,
                              .count = count,
                              .chunk = chunk,
                              .final = final};
}

/* Two ranks: each phase runs one round behind the one before it (see "Lead" above). */
#define RING_LEAD_2 1u

static void all_reduce(int p, int r, size_t count, coll_step *st, size_t *n) {
  int prev = mod(r - 1, p), next = mod(r + 1, p);
  size_t first = *n, off, len;
  int c = mod(r - 1, p);
  coll_ring_chunk(count, p, c, &off, &len);
  add(st, n, COLL_STEP_SEND, -1, next, COLL_BUF_SEND, off, COLL_BUF_RECV, off, len, c, 0);
  for (int s = 1; s <= p - 2; s++) {
    c = mod(r - 1 - s, p);
    coll_ring_chunk(count, p, c, &off, &len);
    add(st, n, COLL_STEP_RECV_REDUCE_SEND, prev, next, COLL_BUF_SEND, off, COLL_BUF_RECV, off, len,
        c, 0);
  }
  coll_ring_chunk(count, p, r, &off, &len);
  add(st, n, COLL_STEP_RECV_REDUCE_COPY_SEND, prev, next, COLL_BUF_SEND, off, COLL_BUF_RECV, off,
      len, r, 1);
  for (int k = 1; k <= p - 2; k++) {
    c = mod(r - k, p);
    coll_ring_chunk(count, p, c, &off, &len);
    add(st, n, COLL_STEP_RECV_COPY_SEND, prev, next, COLL_BUF_RECV, off, COLL_BUF_RECV, off, len, c,
        0);
  }
  c = mod(r + 1, p);
  coll_ring_chunk(count, p, c, &off, &len);
  add(st, n, COLL_STEP_RECV, prev, -1, COLL_BUF_RECV, off, COLL_BUF_RECV, off, len, c, 0);
  /* By phase, not by position: a step with nothing to move is left out, and the two ends
   * of a connection must still agree on the round of every slice. */
  if (p == 2)
    for (size_t i = first; i < *n; i++)
      st[i].delay = st[i].kind == COLL_STEP_SEND                    ? 0
                    : st[i].kind == COLL_STEP_RECV_REDUCE_COPY_SEND ? RING_LEAD_2
                                                                    : 2 * RING_LEAD_2;
}

static void reduce_scatter(int p, int r, size_t rc, coll_step *st, size_t *n) {
  int prev = mod(r - 1, p), next = mod(r + 1, p);
  int c = mod(r - 1, p);
  add(st, n, COLL_STEP_SEND, -1, next, COLL_BUF_SEND, (size_t)c * rc, COLL_BUF_RECV, 0, rc, c, 0);
  for (int s = 1; s <= p - 2; s++) {
    c = mod(r - 1 - s, p);
    add(st, n, COLL_STEP_RECV_REDUCE_SEND, prev, next, COLL_BUF_SEND, (size_t)c * rc, COLL_BUF_RECV,
        0, rc, c, 0);
  }
  add(st, n, COLL_STEP_RECV_REDUCE_COPY, prev, -1, COLL_BUF_SEND, (size_t)r * rc, COLL_BUF_RECV, 0,
      rc, r, 1);
}

static void all_gather(int p, int r, size_t sc, int in_place, coll_step *st, size_t *n) {
  int prev = mod(r - 1, p), next = mod(r + 1, p);
  if (!in_place)
    add(st, n, COLL_STEP_COPY, -1, -1, COLL_BUF_SEND, 0, COLL_BUF_RECV, (size_t)r * sc, sc, r, 0);
  add(st, n, COLL_STEP_SEND, -1, next, COLL_BUF_SEND, 0, COLL_BUF_RECV, 0, sc, r, 0);
  for (int k = 1; k <= p - 2; k++) {
    int c = mod(r - k, p);
    add(st, n, COLL_STEP_RECV_COPY_SEND, prev, next, COLL_BUF_RECV, (size_t)c * sc, COLL_BUF_RECV,
        (size_t)c * sc, sc, c, 0);
  }
  int c = mod(r + 1, p);
  add(st, n, COLL_STEP_RECV, prev, -1, COLL_BUF_RECV, (size_t)c * sc, COLL_BUF_RECV, (size_t)c * sc,
      sc, c, 0);
}

static void broadcast(int p, int r, int root, size_t count, int in_place, coll_step *st,
                      size_t *n) {
  int pos = mod(r - root, p), prev = mod(r - 1, p), next = mod(r + 1, p);
  if (pos == 0) {
    if (!in_place)
      add(st, n, COLL_STEP_COPY, -1, -1, COLL_BUF_SEND, 0, COLL_BUF_RECV, 0, count, 0, 0);
    add(st, n, COLL_STEP_SEND, -1, next, COLL_BUF_SEND, 0, COLL_BUF_RECV, 0, count, 0, 0);
  } else if (pos < p - 1) {
    add(st, n, COLL_STEP_RECV_COPY_SEND, prev, next, COLL_BUF_RECV, 0, COLL_BUF_RECV, 0, count, 0,
        0);
  } else {
    add(st, n, COLL_STEP_RECV, prev, -1, COLL_BUF_RECV, 0, COLL_BUF_RECV, 0, count, 0, 0);
  }
}

static void reduce(int p, int r, int root, size_t count, coll_step *st, size_t *n) {
  int pos = mod(r - root - 1, p), prev = mod(r - 1, p), next = mod(r + 1, p);
  if (pos == 0)
    add(st, n, COLL_STEP_SEND, -1, next, COLL_BUF_SEND, 0, COLL_BUF_RECV, 0, count, 0, 0);
  else if (pos < p - 1)
    add(st, n, COLL_STEP_RECV_REDUCE_SEND, prev, next, COLL_BUF_SEND, 0, COLL_BUF_RECV, 0, count, 0,
        0);
  else
    add(st, n, COLL_STEP_RECV_REDUCE_COPY, prev, -1, COLL_BUF_SEND, 0, COLL_BUF_RECV, 0, count, 0,
        1);
}

coll_result coll_ring_plan(const coll_plan_args *a, coll_step *steps, size_t *nsteps) {
  int p = a->nranks, r = a->rank;
  *nsteps = 0;
  switch (a->coll) {
  case COLL_COLL_ALL_REDUCE: all_reduce(p, r, a->count, steps, nsteps); break;
  case COLL_COLL_BARRIER: all_reduce(p, r, 1, steps, nsteps); break;
  case COLL_COLL_REDUCE_SCATTER: reduce_scatter(p, r, a->count, steps, nsteps); break;
  case COLL_COLL_ALL_GATHER: all_gather(p, r, a->count, a->in_place, steps, nsteps); break;
  case COLL_COLL_BROADCAST: broadcast(p, r, a->root, a->count, a->in_place, steps, nsteps); break;
  case COLL_COLL_REDUCE: reduce(p, r, a->root, a->count, steps, nsteps); break;
  default: return COLL_ERR_INVALID_ARG;
  }
  return COLL_OK;
}

coll_result coll_ring_cost(coll_coll_kind coll, double n, const coll_cost_model *m, double *seconds,
                           char *formula, size_t formula_len) {
  int p = m->p;
  double slice = m->slice, alpha = m->alpha, beta = m->beta, gamma = m->gamma;
  if (p < 1 || !(n >= 0) || !(slice > 0)) return COLL_ERR_INVALID_ARG;
  double a = alpha * 1e6, b = beta * 1e9; /* for printing: us and ns/B */
  double steps = 0, bytes = 0;            /* latency terms, bytes on the critical path */
  const char *shape = "";
  double k = 1;
  if (p == 1 && coll != COLL_COLL_SEND && coll != COLL_COLL_RECV && coll != COLL_COLL_SENDRECV &&
      coll != COLL_COLL_GROUP_P2P) {
    *seconds = 0;
    snprintf(formula, formula_len, "one rank: a local copy, no messages");
    return COLL_OK;
  }
  switch (coll) {
  case COLL_COLL_ALL_REDUCE:
    steps = 2.0 * (p - 1), bytes = 2.0 * (p - 1) / p * n;
    shape = "2(p-1)*a + 2(p-1)/p*n*b";
    break;
  case COLL_COLL_REDUCE_SCATTER:
  case COLL_COLL_ALL_GATHER:
    steps = p - 1, bytes = (double)(p - 1) / p * n;
    shape = "(p-1)*a + (p-1)/p*n*b";
    break;
  case COLL_COLL_BROADCAST:
  case COLL_COLL_REDUCE:
    k = n > slice ? ceil(n / slice) : 1;
    steps = p - 1 + k - 1, bytes = steps * n / k;
    shape = "(p-1+k-1)*(a + n/k*b)";
    break;
  case COLL_COLL_SEND:
  case COLL_COLL_RECV:
  case COLL_COLL_SENDRECV:
  case COLL_COLL_GROUP_P2P: /* n: the bytes on its busiest connection (plan.c) */
    steps = 1, bytes = n;
    shape = "a + n*b";
    break;
  case COLL_COLL_BARRIER:
    steps = 2.0 * (p - 1), bytes = 0;
    shape = "2(p-1)*a";
    break;
  default: return COLL_ERR_INVALID_ARG; /* all-to-all, gather, scatter: not ring schedules */
  }
  *seconds = steps * alpha + bytes * beta;
  char ks[32] = "";
  if (coll == COLL_COLL_BROADCAST || coll == COLL_COLL_REDUCE)
    snprintf(ks, sizeof ks, ", k=%.0f slices", k);
  snprintf(
      formula, formula_len,
      "%s with p=%d, n=%.0f B%s: %.0f*%.3f us + %.0f B*%.4f ns/B = %.2f us + %.2f us = %.2f us",
      shape, p, n, ks, steps, a, bytes, b, steps * a, bytes * b / 1e3, *seconds * 1e6);
  /* The additions: (p-1)/p·n·γ for all-reduce and reduce-scatter (each rank reduces its
   * share of every chunk once per hop), n·γ for the chain's reduce; printed only when γ
   * is given, so coll_cost_predict's α-β formula reads as before. */
  double red = 0;
  if (coll == COLL_COLL_ALL_REDUCE || coll == COLL_COLL_REDUCE_SCATTER)
    red = (double)(p - 1) / p * n;
  if (coll == COLL_COLL_REDUCE) red = n;
  if (red > 0 && gamma > 0) {
    *seconds += red * gamma;
    size_t used = strlen(formula);
    if (used < formula_len)
      snprintf(formula + used, formula_len - used, " + %.0f B*%.4f ns/B reduced = %.2f us", red,
               gamma * 1e9, *seconds * 1e6);
  }
  return COLL_OK;
}
