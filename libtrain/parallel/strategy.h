/*
 * strategy.h — the one interface every way of training past one process implements, so
 * that coll-train's loop (app/coll_train.c) is one loop: it asks the strategy for a step,
 * for its checkpoint, for its lines of output, and never asks which strategy it is.
 *
 * A strategy is a row of the table in strategies.c (name, create) and a table of operations
 * (train_parallel_ops) in the strategy's own file: none.c (one process, or one rank that
 * only steps its session), ddp.c, fsdp.c — the data-parallel strategies, over the grid's
 * data-parallel group — and tp.c, tensor parallelism, which wraps one of those: it
 * attaches its group to the model (the model's layer operations, model/layer_ops.h) and
 * hands the step to the data-parallel strategy it holds, as torchtitan composes its
 * dimensions. A new strategy is a new file and a row.
 *
 * The groups come from one object, the grid (grid.c): the job's ranks as T x D, tensor
 * parallel innermost (rank = d*T + t), every group a split of the job's backend; a
 * strategy asks the grid for its group and never splits on its own.
 *
 * Every operation is collective over the strategy's groups when it says so; all return 0,
 * or -1 with one sentence in err, and none prints: the strategies write their lines into
 * buffers and the application prints them on rank 0.
 */
#ifndef TRAIN_PARALLEL_STRATEGY_H
#define TRAIN_PARALLEL_STRATEGY_H

#include "base/util.h"
#include "comm/backend.h"
#include "parallel/planner.h"
#include "train.h"

#include <stdint.h>
#include <stdio.h>

/* The job as a grid of T x D x P ranks (strategy.c). world == NULL: one process. */
typedef struct train_grid {
  train_backend *world; /* every rank of the job, or NULL */
  train_backend *tp;    /* the T ranks of this rank's tensor-parallel group (NULL: T = 1) */
  train_backend *dp;    /* the D ranks holding the same slice (the world when T = P = 1) */
  train_backend *pp;    /* the P stages of this rank's pipeline (NULL: P = 1) */
  int T, D, P;
  int t, d, p; /* this rank's place: rank = (p*D + d)*T + t */
  /* Expert parallelism (train_grid_add_ep), carved out of the data-parallel group as
   * Megatron does: the EP group is X consecutive DP ranks (DP rank d: EP group d / X,
   * index e = d % X), the expert-data-parallel group the D/X DP ranks with the same e
   * (the ranks holding the same experts). NULL where the group would be one rank. */
  train_backend *ep, *edp;
  int X, e; /* X = 1: no expert parallelism */
  /* Context parallelism (train_grid_create_cp; Cp 0 or 1: none): the Cp ranks of one
   * (d, t) split each sequence; they are data-parallel for the weights, so `dp` is then
   * the D x Cp ranks of one t (gradients sync over it) and D counts replicas of the
   * sequences. rank = (d*Cp + c)*T + t. */
  train_backend *cp; /* the Cp ranks of this rank's context-parallel ring (NULL: Cp = 1) */
  int Cp, c;
} train_grid;

/* Ranks of a T x D grid: tensor-parallel groups of T consecutive ranks, data-parallel
 * groups across them: rank = d*T + t. */
static inline int train_tp_rank_of(int rank, int tp) { return rank % tp; }
static inline int train_dp_rank_of(int rank, int tp) { return rank / tp; }

/* Splits world into the T x D grid (collective over world); T = 1 needs no split. */
TRAIN_API int train_grid_create(train_grid *g, train_backend *world, int T, char *err);
/* The same with a pipeline dimension, Megatron's order: tensor parallel innermost, then
 * data parallel, pipeline outermost — rank = (p*D + d)*T + t, so a TP group is T
 * consecutive ranks (one host's, where the traffic is heaviest) and the P stages of one
 * pipeline are D*T ranks apart. Every group a split of world. */
TRAIN_API int train_grid_create_pp(train_grid *g, train_backend *world, int T, int P, char *err);
/* Splits the data-parallel group into the expert-parallel groups of X consecutive ranks
 * and the expert-data-parallel groups across them (collective over g->dp); X must divide
 * D. X = 1 splits nothing: every rank holds every expert, expert-DP is the DP group. */
TRAIN_API int train_grid_add_ep(train_grid *g, int X, char *err);
/* The grid with a context-parallel dimension between data and tensor parallelism,
 * Megatron's order: rank = (d*Cp + c)*T + t, so a TP group is T consecutive ranks, a CP
 * ring Cp ranks T apart, and the gradient sync group (dp) the D*Cp ranks of one t. Every
 * group a split of world; no pipeline dimension (refused with --cp). */
TRAIN_API int train_grid_create_cp(train_grid *g, train_backend *world, int T, int Cp, char *err);
/* Leaves the groups the grid split (not the world). */
TRAIN_API void train_grid_free(train_grid *g);

/* What the command line chose, for every strategy (each reads its own fields). */
typedef struct train_parallel_options {
  const char *data;    /* the data-parallel strategy: "none", "ddp" or "fsdp" */
  int zero;            /* fsdp: ZeRO stage 1..3 */
  int accum;           /* micro-steps per optimizer step */
  int overlap;         /* ddp: all-reduce buckets during backward */
  size_t bucket_bytes; /* ddp: bucket cap */
  int sp;              /* tp: sequence parallelism */
  int trace;           /* record a timeline (--trace) */
  int schedule;        /* pp: the schedule (schedule.h's train_pp_kind) */
  int micro;           /* pp: micro-batches per step (M) */
  int chunks;          /* pp: model chunks per stage (V, interleaved) */
  int experts;         /* the model's mixture of experts (0: dense): ep.c steps it */
  int cp_ulysses;      /* cp: 1 = Ulysses (all-to-all to heads), 0 = ring attention */
} train_parallel_options;

/* One step as the strategy saw it: what the loop prints and sums. */
typedef struct train_step_report {
  train_step_stats step;     /* loss: mean over the ranks and micro-steps */
  double fwd_ms, bwd_ms;     /* compute */
  double wait_ms;            /* exposed communication */
  double comm_ms;            /* first collective launched .. last seen done (ddp) */
  double hidden;             /* 1 - wait / comm (ddp) */
  double sent_bytes;         /* this rank, this step, by the ring formulas (fsdp) */
  double measured_bytes;     /* the same from libcoll's trace counters (fsdp) */
  double tp_ms, tp_other_ms; /* blocked in the tensor-parallel collectives: in blocks, other */
  double tp_bytes;           /* bytes of the in-block collectives */
  long tp_calls;             /* in-block collectives */
  double ep_ms, ep_bytes;    /* blocked in the MoE all-to-alls; bytes this rank sent in them */
  long ep_calls;             /* MoE all-to-alls (counts and rows) */
  double cp_ms, cp_bytes;    /* context parallel: blocked in its transfers; sent */
  long cp_calls;             /* its transfers (ring steps, all-to-alls) */
} train_step_report;

typedef struct train_parallel train_parallel;

typedef struct train_parallel_ops {
  const char *name;
  /* One optimizer step (collective). */
  int (*step)(train_parallel *p, train_step_report *r, char *err);
  /* Collective, before an evaluation: makes the model whole where the evaluating ranks
   * need it (fsdp gathers the parameters). NULL: nothing to do. */
  int (*eval_begin)(train_parallel *p, char *err);
  /* Collective: a checkpoint at path (parallel/checkpoint.c's format); `what` (n bytes)
   * gets a few words on its files for the run's line ("" when there is nothing to add). */
  int (*save)(train_parallel *p, const char *path, char *what, size_t n, char *err);
  /* Collective over the job: the data-parallel strategy's part of a tensor-parallel
   * checkpoint (tp's save hands it the world and the TP group): its slice's shards. */
  int (*save_slice)(train_parallel *p, train_backend *world, train_backend *tp, const char *path,
                    char *err);
  /* Collective, after the last step: checks (ranks hold the same weights) and the
   * timeline (written to trace_path on rank 0 when not NULL). */
  int (*finish)(train_parallel *p, const char *trace_path, char *err);
  /* Lines describing the strategy at the start (each ends in '\n'); *out = '\0' if none. */
  void (*describe)(train_parallel *p, char *out, size_t n);
  /* The end of one step's line (" | bwd ... ms"). */
  void (*step_line)(const train_parallel *p, const train_step_report *r, char *out, size_t n);
  /* The summary after the run: `later` sums the steps after the first (nlater of them,
   * `seconds` their time; the first warms caches), `all` every step (nall). */
  void (*summary)(const train_parallel *p, const train_step_report *later, long nlater,
                  double seconds, const train_step_report *all, long nall, char *out, size_t n);
  /* 0, or -1 with the first failure inside the model's passes (tp: a collective inside
   * forward or backward, which cannot return errors themselves). NULL: always 0. */
  int (*status)(const train_parallel *p, char *err);
  /* The planner's row of this run's layout. */
  int (*plan)(const train_parallel *p, double fixed, train_plan_row *out, char *err);
  /* Collective: the validation loss over `batches` batches where the model's forward
   * spans ranks (pipeline: through the stages), the same number on every rank. NULL:
   * train_session_val_loss on the evaluating ranks. */
  int (*val_loss)(train_parallel *p, int batches, float *out, char *err);
  void (*free)(train_parallel *p);
} train_parallel_ops;

struct train_parallel {
  const train_parallel_ops *ops;
  train_session *s;
  train_grid *grid;
  train_parallel_options opt;
  train_parallel *inner; /* tp: the data-parallel strategy it hands steps to */
  int eval_everywhere;   /* 1: evaluation is collective (tp: every rank runs the forward) */
  int can_sample;        /* 0: the model cannot generate on one rank (tp holds V/T logits) */
  int rows_mult;         /* sequences per step = batch * rows_mult (data ranks x accum) */
  int zero;              /* the ZeRO stage the strategy shards by (fsdp), else 0 */
  void *impl;
};

/* Creates the strategies the grid and opt ask for (tp over the data-parallel one when
 * T > 1) on the session s, after any checkpoint was loaded into it (fsdp keeps its shards
 * of what the session holds); every rank of the job calls it (collective). NULL with err.
 * Every strategy reads grid.D * accum rows per step and its checkpoints record that global
 * batch: train_session_set_batch_mult(s, grid.D * accum) before the load. */
TRAIN_API train_parallel *train_parallel_create(train_session *s, train_grid *g,
                                                const train_parallel_options *opt, char *err);
TRAIN_API void train_parallel_free(train_parallel *p);

/* The rows of the table (strategies.c); each strategy's file defines its create. */
typedef train_parallel *(*train_parallel_create_fn)(train_session *s, train_grid *g,
                                                    const train_parallel_options *opt, char *err);
train_parallel *train_none_create(train_session *s, train_grid *g,
                                  const train_parallel_options *opt, char *err);
train_parallel *train_ddp_strategy_create(train_session *s, train_grid *g,
                                          const train_parallel_options *opt, char *err);
train_parallel *train_fsdp_strategy_create(train_session *s, train_grid *g,
                                           const train_parallel_options *opt, char *err);
/* tp attaches its group to the model, then creates the data-parallel strategy it wraps
 * with `inner` (over the grid's data-parallel group: the model is a slice by then). */
train_parallel *train_tp_strategy_create(train_session *s, train_grid *g,
                                         const train_parallel_options *opt,
                                         train_parallel_create_fn inner, char *err);

/* ep.c: the mixture-of-experts model over the grid's data-parallel group, its experts
 * spread over the expert-parallel groups (train_grid_add_ep; X = 1: all on every rank). */
train_parallel *train_ep_strategy_create(train_session *s, train_grid *g,
                                         const train_parallel_options *opt, char *err);

/* pipeline.c: P stages over the grid's pipeline group, the data-parallel sync of each
 * stage over its data-parallel group after the last micro-batch (the model attached to
 * the tensor-parallel group first when T > 1). */
/* cp.c: context parallelism over the grid's CP group: attaches ring or Ulysses attention
 * and the chunked positions to the model, then creates the data-parallel strategy `inner`
 * over the grid's dp group (D x Cp ranks: the gradients sync over both). */
train_parallel *train_cp_strategy_create(train_session *s, train_grid *g,
                                         const train_parallel_options *opt,
                                         train_parallel_create_fn inner, char *err);

train_parallel *train_pp_strategy_create(train_session *s, train_grid *g,
                                         const train_parallel_options *opt, char *err);

/* A train_parallel with ops and the common fields filled (impl NULL), or NULL. */
train_parallel *train_parallel_new(const train_parallel_ops *ops, train_session *s, train_grid *g,
                                   const train_parallel_options *opt);

/* Appends printf-style text to out (of n bytes) after what it holds. */
void train_appendf(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
