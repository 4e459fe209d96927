/* table.c — the algorithm table (algo.h): one row per algorithm, and the lookups on it.
 *
 * Read a row left to right: its name; what it serves; what it costs and how much the
 * tuner distrusts that formula; how it runs.  Everything else in libcoll that asks
 * "which algorithms exist, what can this one do, what does it cost, what is it called"
 * asks this table.
 *
 * Handicaps (measured, see docs/bandwidth-math.md):
 *   tree, rd, rhd  1.25: their models leave out what the ring does best (its steps
 *                  overlap; halving phases and tree levels wait for each other): a near
 *                  tie at 64 MiB on 4 ranks went to Rabenseifner at 3.5 GB/s busbw
 *                  against the ring's 5.4.
 *   dev_oneshot,   1: device.c's constants, from the first GPU run (one H200 shared by
 *   dev_twoshot,     every rank, 2026-11-30).
 *   dev_onegpu
 *   hier           1: priced with the link classes (hier.c); the flat rows it is weighed
 *                  against are priced at their slowest link on several hosts (tune.c).
 *   fanout       0.9: its α-β model prices one call; it leaves out that the root may run
 *                  the ring's size (4 MiB) ahead of its readers, so a stall on one side
 *                  (a rank preempted on these 2 shared cores) does not stop the other:
 *                  2 ranks, 1 MiB in place, the mean of 8000 calls was 58-60 us against
 *                  the chain's 81-87, whose model is 6 % cheaper.
 *   staged       0.9 for all-gather, the formula's word for all-reduce: the all-reduce
 *                  model (staged.c) puts it level with the ring at 2 ranks (the ring keeps
 *                  them: it measured ahead there) and ahead from 3, where it measured so
 *                  (4 ranks, 16 MiB: 7.5-8.0 ms against 8.5-9.6).  The all-gather model,
 *                  like the fan-out's, prices one call and leaves out that a rank may run
 *                  the whole ring ahead and copies its own block from the cache: 2 ranks,
 *                  out of place, medians of 5 (side_by_side.py), 1 MiB 82.4 us against
 *                  the ring's 87.0, 64 MiB 7.04 ms against 8.83.  The one-shot keeps
 *                  calls up to 4-16 KiB, as measured.
 *   direct         2: its model (per-call and per-byte costs of process_vm_readv on
 *                  1 MiB) was 2x optimistic at 256 KiB - 4 MiB on 2 ranks (a 4 MiB
 *                  all-reduce: 425 us against the ring's 190 us); all-to-all is taken at
 *                  its word, but only where it measured faster (direct.c: preferable).
 *                  All-gather 0.6, also only where it measured faster: its model and
 *                  staged's price one byte alike (β_cma defaults to β), but direct
 *                  copies a byte once and staged twice.  Measured against each model on
 *                  2 ranks (2026-11-30, 1 MiB out of place): direct 67-71 us against
 *                  its 44.9, staged 102-109 against its 47.4; 1.5x against 2.2x, so
 *                  0.9 × 1.5 / 2.2 ≈ 0.6 beside staged's 0.9.
 *
 * Must never: hold state (the table is const), or name an algorithm anywhere but here.
 */
#include <stdio.h>
#include <string.h>

#include "algo.h"
#include "linear.h"
#include "pairwise.h"
#include "rd.h"
#include "ring.h"
#include "tree.h"

#define B(k) COLL_BIT(COLL_COLL_##k)
#define FIVE (B(BROADCAST) | B(REDUCE) | B(ALL_REDUCE) | B(REDUCE_SCATTER) | B(ALL_GATHER))

/* Not formatted: one row per algorithm, its fields grouped by hand. */
/* clang-format off */
const coll_algo_entry coll_algo_table[COLL_NUM_ALGOS] = {
    [COLL_ALGO_AUTO] = {.id = COLL_ALGO_AUTO, .name = "auto"},
    [COLL_ALGO_RING] = {
        .id = COLL_ALGO_RING, .name = "ring",
        .colls = FIVE | B(BARRIER),
        .cost = coll_ring_cost, .handicap = 1.0,
        .plan = coll_ring_plan},
    [COLL_ALGO_TREE] = {
        .id = COLL_ALGO_TREE, .name = "tree",
        .colls = B(BROADCAST) | B(REDUCE) | B(ALL_REDUCE) | B(BARRIER),
        .cost = coll_tree_cost, .handicap = 1.25,
        .plan = coll_tree_plan},
    [COLL_ALGO_RD] = {
        .id = COLL_ALGO_RD, .name = "rd", .alias = "recursive_doubling",
        .colls = B(ALL_REDUCE) | B(ALL_GATHER) | B(BARRIER),
        .cost = coll_rd_cost, .handicap = 1.25,
        .plan = coll_rd_plan},
    [COLL_ALGO_RHD] = {
        .id = COLL_ALGO_RHD, .name = "rhd", .alias = "rabenseifner",
        .colls = B(ALL_REDUCE) | B(ALL_GATHER),
        .cost = coll_rhd_cost, .handicap = 1.25,
        .plan = coll_rhd_plan},
    [COLL_ALGO_ONESHOT] = {
        .id = COLL_ALGO_ONESHOT, .name = "oneshot",
        .colls = FIVE | B(BARRIER) | B(ALL_TO_ALL) | B(GATHER) | B(SCATTER),
        .host_only = true, .usable = coll_oneshot_usable,
        .cost = coll_oneshot_cost, .handicap = 1.0,
        .run = coll_oneshot_run_row},
    [COLL_ALGO_DIRECT] = {
        .id = COLL_ALGO_DIRECT, .name = "direct",
        .colls = B(BROADCAST) | B(ALL_REDUCE) | B(REDUCE_SCATTER) | B(ALL_GATHER) |
                 B(ALL_TO_ALL) | B(ALL_TO_ALLV),
        .host_only = true, .usable = coll_direct_usable,
        .cost = coll_direct_cost, .handicap = 2.0,
        .coll_handicap = {[COLL_COLL_ALL_TO_ALL] = 1.0, [COLL_COLL_ALL_GATHER] = 0.6},
        .preferable = coll_direct_preferable,
        .run = coll_direct_run},
    [COLL_ALGO_MAPPED] = {
        .id = COLL_ALGO_MAPPED, .name = "mapped",
        .colls = FIVE | B(ALL_TO_ALL) | B(GATHER) | B(SCATTER),
        .host_only = true, .usable = coll_mapped_usable, .per_call = true,
        .cost = coll_mapped_cost, .handicap = 1.0,
        .run = coll_mapped_run},
    [COLL_ALGO_PAIRWISE] = {
        .id = COLL_ALGO_PAIRWISE, .name = "pairwise",
        .colls = B(ALL_TO_ALL) | B(ALL_TO_ALLV),
        .cost = coll_pairwise_cost, .handicap = 1.0,
        .plan = coll_pairwise_plan},
    [COLL_ALGO_LINEAR] = {
        .id = COLL_ALGO_LINEAR, .name = "linear",
        .colls = B(GATHER) | B(SCATTER),
        .cost = coll_linear_cost, .handicap = 1.0,
        .plan = coll_linear_plan},
    [COLL_ALGO_DEV_ONESHOT] = {
        .id = COLL_ALGO_DEV_ONESHOT, .name = "dev_oneshot",
        .colls = FIVE,
        .device_only = true, .usable = coll_dev_usable,
        .cost = coll_dev_oneshot_cost, .handicap = 1.0,
        .run = coll_dev_oneshot_run},
    [COLL_ALGO_DEV_TWOSHOT] = {
        .id = COLL_ALGO_DEV_TWOSHOT, .name = "dev_twoshot",
        .colls = B(ALL_REDUCE),
        .device_only = true, .usable = coll_dev_usable,
        .cost = coll_dev_twoshot_cost, .handicap = 1.0,
        .run = coll_dev_twoshot_run},
    [COLL_ALGO_HIER] = {
        .id = COLL_ALGO_HIER, .name = "hier", .alias = "hierarchical",
        .colls = B(ALL_REDUCE) | B(ALL_GATHER),
        .usable = coll_hier_usable,
        .cost = coll_hier_cost, .handicap = 1.0, .link_classes = true,
        .plan = coll_hier_plan},
    [COLL_ALGO_FANOUT] = {
        .id = COLL_ALGO_FANOUT, .name = "fanout",
        .colls = B(BROADCAST),
        .host_only = true, .usable = coll_fanout_usable,
        .cost = coll_fanout_cost, .handicap = 0.9,
        .run = coll_fanout_run},
    [COLL_ALGO_STAGED] = {
        .id = COLL_ALGO_STAGED, .name = "staged",
        .colls = B(ALL_REDUCE) | B(ALL_GATHER),
        .host_only = true, .usable = coll_staged_usable,
        .cost = coll_staged_cost, .handicap = 0.9,
        .coll_handicap = {[COLL_COLL_ALL_REDUCE] = 1.0},
        .run = coll_staged_run},
    [COLL_ALGO_DEV_ONEGPU] = {
        .id = COLL_ALGO_DEV_ONEGPU, .name = "dev_onegpu",
        .colls = FIVE,
        .device_only = true, .usable = coll_dev_onegpu_usable,
        .cost = coll_dev_onegpu_cost, .handicap = 1.0,
        .run = coll_dev_onegpu_run},
};
/* clang-format on */

static bool no_algorithm_needed(coll_coll_kind c, int nranks) {
  return c == COLL_COLL_SEND || c == COLL_COLL_RECV || c == COLL_COLL_SENDRECV ||
         c == COLL_COLL_GROUP_P2P || nranks == 1;
}

bool coll_algo_serves(coll_algo a, coll_coll_kind c, int nranks) {
  if ((unsigned)a >= COLL_NUM_ALGOS || (unsigned)c >= COLL_NUM_COLLS) return false;
  if (no_algorithm_needed(c, nranks)) return true; /* plan.c schedules these itself */
  if (a == COLL_ALGO_AUTO) return true;            /* the tuner picks a row that does */
  return (coll_algo_table[a].colls & COLL_BIT(c)) != 0;
}

coll_algo coll_algo_default(coll_coll_kind c) {
  /* The first row with a schedule that serves c, in table order: the ring for the five
   * and barrier, pairwise for all-to-all(v), linear for gather and scatter. */
  for (int a = 0; a < COLL_NUM_ALGOS; a++)
    if (coll_algo_table[a].plan && (coll_algo_table[a].colls & COLL_BIT(c))) return (coll_algo)a;
  return COLL_ALGO_RING; /* point-to-point: plan.c schedules it, any name will do */
}

bool coll_algo_has_plan(coll_algo a) {
  const coll_algo_entry *e = coll_algo_get(a);
  return e && e->plan;
}

bool coll_algo_usable(const coll_algo_entry *e, struct coll_comm *comm, const coll_work *w,
                      size_t es) {
  if (!e || !coll_algo_serves(e->id, w->coll, comm->nranks)) return false;
  if (e->host_only && (w->device || w->cuda_event)) return false;
  if (e->device_only && !(w->device && w->peer_ok)) return false;
  return !e->usable || e->usable(comm, w->coll, w->count, es);
}

coll_result coll_algo_cost(coll_algo a, coll_coll_kind c, int p, double n, double slice,
                           double alpha, double beta, double gamma, double *seconds, char *formula,
                           size_t formula_len) {
  const coll_algo_entry *e = coll_algo_get(a);
  if (!e || !e->cost || p < 1 || !(n >= 0) || !(slice > 0)) return COLL_ERR_INVALID_ARG;
  if (!no_algorithm_needed(c, p) && !coll_algo_serves(a, c, p)) return COLL_ERR_INVALID_ARG;
  /* One model for every row: the one-shot and direct rows' own constants default to the
   * FIFO's (callers that measured them use the rows' cost functions directly). */
  coll_cost_model m = {.p = p,
                       .slice = slice,
                       .alpha = alpha,
                       .beta = beta,
                       .gamma = gamma,
                       .alpha_mb = alpha,
                       .beta_cma = beta,
                       .alpha_cma = alpha};
  return e->cost(c, n, &m, seconds, formula, formula_len);
}

const char *coll_algo_name(coll_algo a) {
  return (unsigned)a < COLL_NUM_ALGOS ? coll_algo_table[a].name : "?";
}

coll_algo coll_algo_from_name(const char *s, bool *ok) {
  for (int a = 0; s && a < COLL_NUM_ALGOS; a++) {
    const coll_algo_entry *e = &coll_algo_table[a];
    if (strcmp(s, e->name) == 0 || (e->alias && strcmp(s, e->alias) == 0)) {
      *ok = true;
      return (coll_algo)a;
    }
  }
  *ok = false;
  return COLL_ALGO_AUTO;
}

size_t coll_algo_names(char *buf, size_t len) {
  size_t used = 0;
  if (len) buf[0] = 0;
  for (int a = 0; a < COLL_NUM_ALGOS && used < len; a++) {
    int k = snprintf(buf + used, len - used, "%s%s", a ? ", " : "", coll_algo_table[a].name);
    if (k < 0) break;
    used += (size_t)k;
  }
  return used;
}
