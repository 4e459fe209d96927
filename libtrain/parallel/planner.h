/*
 * planner.h — the memory and communication planner (`coll-train --plan`): for a model, a
 * per-rank batch and N ranks, the bytes each rank holds and sends per step under each
 * strategy, counted the way this trainer allocates (fp32: 4 bytes per parameter for the
 * weights, 4 for the gradients, 8 for AdamW's two moments), plus the fixed part of the
 * process measured, and the measured peak to print beside it.
 *
 * The seed material's table in these terms, P parameters, Ps = P/N rounded up per unit:
 *   none/DDP  16P;  ZeRO-1 8P + 8Ps (+ this trainer's master and gradient shards, 8Ps);
 *   ZeRO-2 4P + 16Ps (+ the live full gradients of a few units);
 *   ZeRO-3 16Ps + the root units + the gathered working set (two blocks, their gradients).
 * Sent per rank per step (ring): DDP 2(N-1)/N·4P; ZeRO-1/2 the same as reduce-scatter +
 * all-gather; ZeRO-3 3(N-1)/N·4P less the top block's backward gather (it stays from
 * forward), all with the padding.
 */
#ifndef TRAIN_PARALLEL_PLANNER_H
#define TRAIN_PARALLEL_PLANNER_H

#include "train.h"

typedef enum {
  TRAIN_PLAN_NONE = 0,
  TRAIN_PLAN_DDP,
  TRAIN_PLAN_ZERO1,
  TRAIN_PLAN_ZERO2,
  TRAIN_PLAN_ZERO3,
  TRAIN_PLAN_COUNT
} train_strategy;

typedef struct train_plan_row {
  const char *name;
  char label[24]; /* when set, printed instead of name (rows made per stage) */
  double params, grads, optim, acts, working, fixed, total; /* bytes per rank */
  double sent;                                              /* bytes per rank per step */
} train_plan_row;

/* One row; `fixed` is the measured fixed part (train_rss_bytes at start). -1 with err on
 * an impossible config. */
TRAIN_API int train_plan(const train_config *cfg, int B, int T, int N, int accum, train_strategy st,
                         double fixed, train_plan_row *out, char *err);
/* The same with activation recomputation (train_recompute): the activations forward keeps. */
TRAIN_API int train_plan_rc(const train_config *cfg, int B, int T, int N, int accum,
                            train_strategy st, int recompute, double fixed, train_plan_row *out,
                            char *err);
/* And with --dtype bf16 (bf16 1): the seeds' 2 + 2 + 12 bytes a parameter and the ZeRO
 * paper's stages (planner.c: bf16_rows); activations as the bf16 model keeps them. */
TRAIN_API int train_plan_dt(const train_config *cfg, int B, int T, int N, int accum,
                            train_strategy st, int recompute, int bf16, double fixed,
                            train_plan_row *out, char *err);
/* Resident bytes now (VmRSS) and the peak so far (VmHWM), from /proc/self/status; 0 when
 * unavailable. */
TRAIN_API double train_rss_bytes(void);
TRAIN_API double train_peak_rss_bytes(void);
/* Resident bytes of libcoll's communicator (its /dev/shm segments) in this process: part of
 * a parallel run's fixed cost, measured once the communicator has carried the start-up
 * broadcasts. */
TRAIN_API double train_comm_rss_bytes(void);
/* The table's header line and one row, in MiB, into out (no newline). */
TRAIN_API void train_plan_header(char *out, size_t n);
TRAIN_API void train_plan_format(const train_plan_row *r, char *out, size_t n);

/* The planner's row (planner.c) from a layout: unit lengths ul (L+2: embeddings, blocks,
 * final LayerNorm), P parameters and A activation bytes of one rank's model — the whole
 * model, or a tensor-parallel slice (train_model_sizes_tp) for TP x FSDP. */
void train_plan_fill(const size_t *ul, int L, size_t P, size_t A, int N, int accum,
                     train_strategy st, double fixed, train_plan_row *r);

#endif
