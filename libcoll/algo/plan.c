/* plan.c — choosing an algorithm and building this rank's schedule.
 *
 * The algorithms live one per file and one row each in the table (algo.h, table.c);
 * this file builds the schedule of the row the tuner chose (the executor hands the row
 * itself down in coll_plan_args.row; a row with no schedule, or one that cannot serve
 * the call, gets the collective's default), handles the cases that need no
 * algorithm at all (one rank, point-to-point), and names collectives and steps for
 * logs and traces.  Pure: no I/O, no allocation, no globals.
 *
 * Costs of what this file schedules itself (α per message, β per byte, n bytes):
 *   send / recv       α + n·β      (one FIFO, pipelined in slots)
 *   sendrecv          α + max(n_send, n_recv)·β   (the two directions interleave)
 *   group p2p         α + max over connections of n_conn·β  (every connection streams at
 *                     once; a connection's messages follow each other, so n_conn is the
 *                     sum of the bytes of the group's messages on it)
 *   any collective on one rank: a local copy, n·β_mem (nothing when in place)
 */
#include <stdio.h>
#include <string.h>

#include "algo.h"

/* ring: 2p + 2; hier: all-reduce n + (2H - 1) + n <= 2p + 1 for p = H·n (n, H >= 1),
 * all-gather (H + 1) + p; tree: at most 5 per rank
 * (up and down in two trees, one of them with a second child); rd/rhd: a copy, the folds
 * (all-gather's fold-out in two ranges) and two steps per phase, at most 4·ceil(log2 p) + 4;
 * pairwise: a copy and two steps per peer, 2p - 1; linear: the root's copy and one step per peer,
 * p. */
size_t coll_plan_max_steps(int nranks) {
  size_t p = (size_t)(nranks > 0 ? nranks : 1), lg = 0, ring = 2 * p + 2, rd;
  while (((size_t)1 << lg) < p) lg++;
  rd = 4 * lg + 4;
  return (ring > rd ? ring : rd) > 8 ? (ring > rd ? ring : rd) : 8;
}

static void push(coll_step *steps, size_t *n, coll_step s) {
  if (s.count > 0) steps[(*n)++] = s;
}

/* One rank: every collective is a local copy (or nothing when in place). */
static void plan_single(const coll_plan_args *a, coll_step *steps, size_t *n) {
  size_t cnt = a->count;
  if (a->coll == COLL_COLL_BARRIER) return;
  coll_step s = {.kind = COLL_STEP_COPY,
                 .peer_in = -1,
                 .peer_out = -1,
                 .src_buf = COLL_BUF_SEND,
                 .dst_buf = COLL_BUF_RECV,
                 .count = cnt,
                 .chunk = 0,
                 .final = 1};
  if (a->in_place) return; /* nothing moves; AVG over one rank divides by one */
  push(steps, n, s);
}

/* A group's point-to-point work (group.c; its top comment argues why this cannot
 * deadlock): one step per operation, and two rules.
 *   Sends before receives: the copies, then the sends, then the receives, each in call
 *   order, so in every round a rank posts all its slices before it waits for any.
 *   One slice per connection per round: an operation's delay is the number of slices of
 *   the earlier operations on the same connection (same peer, same direction), so the
 *   k-th send to a peer runs exactly in the rounds of that peer's k-th receive from us,
 *   which it computes the same way from the same counts.
 * Counts and the slice are bytes.  scratch[2p + 0/1] counts the slices given so far to
 * the connection to / from rank p. */
static coll_result plan_group(const coll_plan_args *a, coll_step *steps, size_t *n) {
  if (!a->scratch || (a->ngroup && !a->group) || a->slice == 0) return COLL_ERR_INVALID_ARG;
  for (int p = 0; p < 2 * a->nranks; p++) a->scratch[p] = 0;
  static const coll_step_kind order[] = {COLL_STEP_COPY, COLL_STEP_SEND, COLL_STEP_RECV};
  for (size_t pass = 0; pass < 3; pass++) {
    for (size_t i = 0; i < a->ngroup; i++) {
      const coll_group_op *op = &a->group[i];
      bool self = op->peer == a->rank;
      if (op->peer < 0 || op->peer >= a->nranks || (op->kind == COLL_STEP_COPY) != self ||
          (op->kind != COLL_STEP_COPY && op->kind != COLL_STEP_SEND && op->kind != COLL_STEP_RECV))
        return COLL_ERR_INVALID_ARG;
      if (op->kind != order[pass]) continue;
      bool send = op->kind == COLL_STEP_SEND;
      size_t *given = &a->scratch[2 * (size_t)op->peer + (send ? 0 : 1)];
      size_t slices = (op->count + a->slice - 1) / a->slice;
      if (*given > UINT32_MAX) return COLL_ERR_INVALID_ARG; /* delay is 32 bits */
      coll_step s = {.kind = op->kind,
                     .peer_in = op->kind == COLL_STEP_RECV ? op->peer : -1,
                     .peer_out = send ? op->peer : -1,
                     .peer_in2 = -1,
                     .src_buf = COLL_BUF_SEND,
                     .dst_buf = COLL_BUF_RECV,
                     .count = op->count,
                     .chunk = -1,
                     .delay = self ? 0 : (uint32_t)*given,
                     .item = (int32_t)i};
      if (!self) *given += slices;
      push(steps, n, s);
    }
  }
  return COLL_OK;
}

coll_result coll_plan_build(const coll_plan_args *a, coll_step *steps, size_t *nsteps) {
  *nsteps = 0;
  if (a->nranks < 1 || a->rank < 0 || a->rank >= a->nranks) return COLL_ERR_INVALID_ARG;
  if (a->coll == COLL_COLL_GROUP_P2P) return plan_group(a, steps, nsteps);
  if (a->coll == COLL_COLL_SEND || a->coll == COLL_COLL_RECV) {
    if (a->root < 0 || a->root >= a->nranks || a->root == a->rank) return COLL_ERR_INVALID_ARG;
    bool send = a->coll == COLL_COLL_SEND;
    coll_step s = {.kind = send ? COLL_STEP_SEND : COLL_STEP_RECV,
                   .peer_in = send ? -1 : a->root,
                   .peer_out = send ? a->root : -1,
                   .src_buf = COLL_BUF_SEND,
                   .dst_buf = COLL_BUF_RECV,
                   .count = a->count,
                   .chunk = -1};
    push(steps, nsteps, s);
    return COLL_OK;
  }
  if (a->coll == COLL_COLL_SENDRECV) {
    bool self_out = a->root == a->rank, self_in = a->recv_peer == a->rank;
    if (a->root < 0 || a->root >= a->nranks || a->recv_peer < 0 || a->recv_peer >= a->nranks ||
        self_out != self_in || (self_out && a->count != a->recv_count))
      return COLL_ERR_INVALID_ARG;
    if (self_out) {
      coll_step s = {.kind = COLL_STEP_COPY,
                     .peer_in = -1,
                     .peer_out = -1,
                     .src_buf = COLL_BUF_SEND,
                     .dst_buf = COLL_BUF_RECV,
                     .count = a->count,
                     .chunk = -1};
      push(steps, nsteps, s);
      return COLL_OK;
    }
    /* Two independent steps: the executor interleaves their slices round by round, so
     * the send never waits for the whole receive (or the other way round). */
    coll_step s = {.kind = COLL_STEP_SEND,
                   .peer_in = -1,
                   .peer_out = a->root,
                   .src_buf = COLL_BUF_SEND,
                   .dst_buf = COLL_BUF_RECV,
                   .count = a->count,
                   .chunk = -1};
    coll_step r = {.kind = COLL_STEP_RECV,
                   .peer_in = a->recv_peer,
                   .peer_out = -1,
                   .src_buf = COLL_BUF_RECV,
                   .dst_buf = COLL_BUF_RECV,
                   .count = a->recv_count,
                   .chunk = -1};
    push(steps, nsteps, s);
    push(steps, nsteps, r);
    return COLL_OK;
  }
  if ((a->coll == COLL_COLL_BROADCAST || a->coll == COLL_COLL_REDUCE) &&
      (a->root < 0 || a->root >= a->nranks))
    return COLL_ERR_INVALID_ARG;
  /* The newer collectives have one schedule each, the table's default row for them
   * (pairwise, linear), which also covers one rank. */
  if (a->coll == COLL_COLL_ALL_TO_ALL || a->coll == COLL_COLL_ALL_TO_ALLV ||
      a->coll == COLL_COLL_GATHER || a->coll == COLL_COLL_SCATTER) {
    const coll_algo_entry *d = coll_algo_get(coll_algo_default(a->coll));
    return d && d->plan ? d->plan(a, steps, nsteps) : COLL_ERR_INVALID_ARG;
  }
  if (a->nranks == 1) {
    plan_single(a, steps, nsteps);
    return COLL_OK;
  }
  /* The row's schedule (the row handed in, else algo's); a row with none (a run path),
   * or one that cannot serve this collective, gets the collective's default schedule
   * (coll_algo_default): the tests and coll-sim ask any row for any collective.  Whether
   * it serves is the row's `colls` bit, read here rather than asked of table.c: that is
   * all coll_algo_serves answers once point-to-point and one rank are out of the way,
   * and the executor's call then goes plan.c -> the row's plan without a detour. */
  const coll_algo_entry *e = a->row ? a->row : coll_algo_get(a->algo);
  if (!e || !e->plan || (unsigned)a->coll >= COLL_NUM_COLLS || !(e->colls & COLL_BIT(a->coll)))
    e = coll_algo_get(coll_algo_default(a->coll));
  if (!e || !e->plan) return COLL_ERR_INVALID_ARG;
  return e->plan(a, steps, nsteps);
}

const char *coll_step_name(coll_step_kind k) {
  static const char *names[] = {"copy",
                                "send",
                                "recv",
                                "recv-copy-send",
                                "recv-reduce-send",
                                "recv-reduce-copy",
                                "recv-reduce-copy-send",
                                "recv2-reduce-send"};
  return (unsigned)k <= COLL_STEP_RECV2_REDUCE_SEND ? names[k] : "?";
}
