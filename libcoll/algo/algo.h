/* algo.h — the one algorithm table: every way libcoll can run a collective, in one place.
 *
 * Each algorithm is one file in algo/ and one row of coll_algo_table (table.c), and every
 * row has the same three parts:
 *
 *   what it serves   the collectives (a bit per coll_coll_kind), whether its buffers may
 *                    be device memory, and — per communicator and call — what else it
 *                    needs (`usable`: every peer behind shm mailboxes and a message that
 *                    fits one; peers' memory readable; buffers in coll_mem_alloc windows).
 *                    Any N ≥ 2 (one rank never needs an algorithm: plan.c copies).
 *   what it costs    its α-β-γ formula (`cost`), the one the comment at the top of its
 *                    file states, the one `coll-bench --explain` prints and the tuner
 *                    (exec/tune.c) compares, all with the same model (coll_cost_model).
 *   how it runs      `plan`: a schedule of steps the executor streams through the FIFOs
 *                    (ring, tree, rd, rhd); or `run`: its own function, for paths that
 *                    are not FIFO schedules (oneshot, direct, mapped).
 *
 * The executor (exec/executor.c) asks the tuner for a row and runs it; COLL_ALGO names
 * are the rows' names.  Adding an algorithm: one file, one row, one coll_algo value.
 *
 * Must never: decide anything from what one rank alone knows (`usable` must give the
 * same answer on every rank, since all ranks must run the same algorithm), or do I/O in
 * `cost` or `plan` (both are pure; the tests call them with no communicator).
 */
#ifndef COLL_ALGO_H
#define COLL_ALGO_H

#include "internal.h"
#include "plan.h"

#define COLL_BIT(kind) (1u << (kind))

/* The parameters every row is priced with (measured by exec/tune.c, or given). */
typedef struct {
  int p;            /* ranks */
  double slice;     /* bytes per FIFO slot: schedules pipeline in slices */
  double alpha;     /* s per FIFO message, this algorithm's own where calibrated */
  double beta;      /* s per byte through a FIFO (copied into a slot and out) */
  double gamma;     /* s per byte reduced */
  double alpha_mb;  /* s per one-shot call through the mailboxes (algo/oneshot.c) */
  double beta_cma;  /* s per byte read from a peer's memory (algo/direct.c) */
  double alpha_cma; /* s per process_vm_readv call beyond its bytes */
  int cores;        /* CPUs the ranks of a host share (0: unknown, taken as one a rank) */
  /* Link classes, for host-aware rows (hier.c): the hosts the p ranks run on, the ranks
   * on each (0: hosts hold different numbers), and the links across hosts (α_x, β_x);
   * alpha and beta above are then the links inside a host.  hosts 0 or 1: one class. */
  int hosts, local;
  double alpha_net; /* s per message across hosts */
  double beta_net;  /* s per byte across hosts */
  /* The device rows: distinct GPUs the ranks' buffers are on (0: one GPU a rank).  On
   * one GPU every rank's kernels share one memory and time-slice (device.c). */
  int gpus;
} coll_cost_model;

typedef struct coll_algo_entry {
  coll_algo id;
  const char *name;  /* COLL_ALGO=name, trace and coll-bench's algo column */
  const char *alias; /* a second COLL_ALGO name, or NULL */

  /* --- what it serves --- */
  uint32_t colls;   /* COLL_BIT(kind) of every collective it serves */
  bool host_only;   /* loads, stores or system calls on host memory: no device buffers */
  bool device_only; /* GPU kernels on every rank's mapped buffers (device.c): only for
                       device buffers that cuda/peer.c mapped for the call (w->peer_ok) */
  /* Per communicator and call, beyond `colls`: NULL when nothing more is needed (a FIFO
   * schedule runs over every transport).  count in elements of es bytes, as the call's. */
  bool (*usable)(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es);
  /* Usable only call by call (buffers must lie in windows): not in the tuner's per-size
   * table; considered at each call instead, where it is usable. */
  bool per_call;

  /* --- what it costs --- */
  /* Seconds for collective c on n bytes (nccl-tests' size: the whole vector; the whole
   * output of all-gather, the whole input of reduce-scatter), with the formula and its
   * numbers written into `formula`.  COLL_ERR_INVALID_ARG if it cannot serve c. */
  coll_result (*cost)(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                      char *formula, size_t formula_len);
  /* The tuner compares cost × handicap: 1 takes the formula at its word; above 1 for
   * rows whose model is known to flatter them, below 1 for what it leaves out in their
   * favour (the numbers and why are in table.c).  coll_handicap[c], where set (> 0),
   * replaces it for collective c. */
  double handicap;
  double coll_handicap[COLL_NUM_COLLS];
  /* Priced with the link classes (coll_cost_model's hosts, local, alpha_net, beta_net):
   * a host-aware row.  Every other row is priced, on a communicator of several hosts, at
   * its slowest link (exec/tune.c): a flat schedule's steps wait for the network. */
  bool link_classes;
  /* Where the tuner may pick it on its own (COLL_ALGO may force it wherever it is
   * usable); NULL: wherever usable.  n = nccl-tests' size of the call. */
  bool (*preferable)(struct coll_comm *comm, coll_coll_kind c, double n);

  /* --- how it runs: exactly one of the two --- */
  coll_result (*plan)(const coll_plan_args *a, coll_step *steps, size_t *nsteps);
  /* Runs w on every rank.  *ran = false (and COLL_OK) when, after exchanging what only
   * the call can tell (where the buffers are), every rank agreed it cannot: the
   * executor then runs the tuner's next choice. */
  coll_result (*run)(struct coll_comm *comm, const coll_work *w, bool *ran);
} coll_algo_entry;

/* Rows indexed by coll_algo (AUTO, index 0, is the tuner's choice, not a row that runs). */
extern const coll_algo_entry coll_algo_table[COLL_NUM_ALGOS];
/* The row of `a`, NULL for AUTO or anything out of range (inline: every call asks). */
static inline const coll_algo_entry *coll_algo_get(coll_algo a) {
  return (unsigned)a < COLL_NUM_ALGOS && a != COLL_ALGO_AUTO ? &coll_algo_table[a] : NULL;
}
/* Whether row e can serve this call on comm: the collective, the memory kind, `usable`.
 * The same on every rank for the same call. */
bool coll_algo_usable(const coll_algo_entry *e, struct coll_comm *comm, const coll_work *w,
                      size_t es);

/* The rows' own costs (each in its file). */
coll_result coll_ring_cost(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                           char *formula, size_t formula_len);
coll_result coll_tree_cost(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                           char *formula, size_t formula_len);
coll_result coll_rd_cost(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                         char *formula, size_t formula_len);
coll_result coll_rhd_cost(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                          char *formula, size_t formula_len);
coll_result coll_oneshot_cost(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                              char *formula, size_t formula_len);
coll_result coll_direct_cost(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                             char *formula, size_t formula_len);
coll_result coll_mapped_cost(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                             char *formula, size_t formula_len);
coll_result coll_pairwise_cost(coll_coll_kind c, double n, const coll_cost_model *m,
                               double *seconds, char *formula, size_t formula_len);
coll_result coll_linear_cost(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                             char *formula, size_t formula_len);
coll_result coll_dev_oneshot_cost(coll_coll_kind c, double n, const coll_cost_model *m,
                                  double *seconds, char *formula, size_t formula_len);
coll_result coll_fanout_cost(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                             char *formula, size_t formula_len);
coll_result coll_staged_cost(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                             char *formula, size_t formula_len);
coll_result coll_hier_cost(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                           char *formula, size_t formula_len);
coll_result coll_dev_twoshot_cost(coll_coll_kind c, double n, const coll_cost_model *m,
                                  double *seconds, char *formula, size_t formula_len);
coll_result coll_dev_onegpu_cost(coll_coll_kind c, double n, const coll_cost_model *m,
                                 double *seconds, char *formula, size_t formula_len);

/* The rows' `usable` and `run` (each in its file). */
bool coll_oneshot_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es);
bool coll_direct_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es);
bool coll_mapped_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es);
bool coll_direct_preferable(struct coll_comm *comm, coll_coll_kind c, double n);
bool coll_fanout_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es);
coll_result coll_fanout_run(struct coll_comm *comm, const coll_work *w, bool *ran);
bool coll_staged_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es);
coll_result coll_staged_run(struct coll_comm *comm, const coll_work *w, bool *ran);
coll_result coll_oneshot_run_row(struct coll_comm *comm, const coll_work *w, bool *ran);
bool coll_hier_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es);
bool coll_dev_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es);
coll_result coll_dev_oneshot_run(struct coll_comm *comm, const coll_work *w, bool *ran);
coll_result coll_dev_twoshot_run(struct coll_comm *comm, const coll_work *w, bool *ran);
bool coll_dev_onegpu_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es);
coll_result coll_dev_onegpu_run(struct coll_comm *comm, const coll_work *w, bool *ran);

/* hier.c: whether a layout lets the host-aware all-reduce run (several hosts, the same
 * number >= 2 of ranks on each); its schedule (the ring's where it does not fit); the
 * layout built from per-rank host ids into the caller's arrays (nranks ints each),
 * returning the number of hosts. */
bool coll_hier_fits(const coll_hosts *hs, int nranks);
coll_result coll_hier_plan(const coll_plan_args *a, coll_step *steps, size_t *nsteps);
int coll_hosts_build(const uint64_t *ids, int nranks, int *host, int *local, int *by_host,
                     coll_hosts *out);
/* The bytes rank a->rank sends over links inside its host and across hosts when a's
 * schedule runs (a->hosts: the layout; NULL counts everything inside), es bytes per
 * element; steps: scratch of coll_plan_max_steps(a->nranks).  From the plan itself, the
 * one the executor would run. */
coll_result coll_plan_link_bytes(const coll_plan_args *a, size_t es, coll_step *steps,
                                 uint64_t *inside, uint64_t *across);

#endif
