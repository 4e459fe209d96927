/*
 * moe.h — the mixture-of-experts MLP (moe.c): a learned router and E expert MLPs in place
 * of a block's dense MLP, forward and backward, with the load-balancing auxiliary loss.
 * The layer operations call it (model.h: train_layer_ops.moe_forward/moe_backward): the
 * single-process ones (layers_local.c) with every expert here and nothing to exchange,
 * the expert-parallel ones (parallel/ep.c) with a train_moe_comm whose functions move the
 * rows between the ranks of the expert-parallel group. moe.c never talks to another
 * process itself: what crosses ranks goes through the comm it is handed.
 *
 * Shapes: N tokens (rows) here, C channels, E experts, K = top-k, X ranks of the
 * expert-parallel group, El = E/X experts held here (global experts [ep_rank*El, +El)).
 *
 * Parameters of block l under MoE (model.c's layout; tensors 8..12 of the block):
 *   mlp.fc.w (El*4C, C)  mlp.fc.b (El*4C)  mlp.proj.w (El*C, 4C)  mlp.proj.b (El*C)
 *   mlp.router.w (E, C)
 * expert e's slices are contiguous: rows [e*4C, +4C) of fc, [e*C, +C) of proj. Each
 * expert keeps GPT-2's hidden width 4C (as Switch, Mixtral and Megatron do: top-1 then
 * costs one dense MLP's FLOPs per token, top-k k of them).
 */
#ifndef TRAIN_MODEL_MOE_H
#define TRAIN_MODEL_MOE_H

#include "model/model.h"

/* How rows cross the expert-parallel group (parallel/ep.c); NULL: one rank, every expert
 * here (X = 1), the statistics are this rank's. Failures are kept by the implementation
 * (the passes cannot return errors: model.h's layer operations); the data is then
 * garbage, never out of bounds. */
typedef struct train_moe_comm {
  /* x (n floats) summed in place over the data-parallel group: the global batch */
  void (*stats_sum)(train_model *m, float *x, int n);
  /* send (X*per ints, block j for rank j) -> recv (X*per ints, block s from rank s) */
  void (*counts)(train_model *m, const int *send, int *recv, int per);
  /* rows of C floats: block j of send (scount[j] rows, in rank order) to rank j, block s
   * of recv (rcount[s] rows) from rank s; fixed: every count is the same (capacity mode:
   * a fixed-size all-to-all). `what` names it for traces ("dispatch 3", ...). */
  void (*rows)(train_model *m, const float *send, const int *scount, float *recv, const int *rcount,
               int C, int fixed, const char *what);
} train_moe_comm;

/* 0, or -1 with a sentence: experts >= 1 with 1 <= topk <= experts, ep >= 1 dividing
 * experts, capacity factor >= 0 (0 dropless), aux coefficient >= 0, and what MoE does not
 * run with (the CUDA model, bf16, recomputation, pipelines, tensor parallelism). */
int train_moe_check(const train_config *cfg, int experts, int topk, int ep, float capacity,
                    float aux_coef, train_device dev, int tp, int pp, int bf16, int recompute,
                    char *err);

/* The MoE state of a model (m->moe): per block the routing and the activations backward
 * needs, sized for m->maxB * m->maxT tokens. NULL with err when out of memory. */
struct train_moe *train_moe_create(train_model *m, char *err);
void train_moe_free(struct train_moe *s);

/* out (N,C) = the MoE MLP of inp (N,C) for local block l (out is written, not added);
 * with targets (m->have_targets) the router's statistics are summed over comm's group
 * and the auxiliary loss formed. */
void train_moe_forward(train_model *m, const train_moe_comm *comm, int l, float *out,
                       const float *inp, int N);
/* dinp (N,C) += the gradient of the block's MoE input from dout (N,C), and block l's
 * router and expert gradients += theirs (the experts' from the tokens of every rank of
 * the group that chose them), the auxiliary loss's included. */
void train_moe_backward(train_model *m, const train_moe_comm *comm, int l, float *dinp,
                        const float *dout, const float *inp, int N);

/* What the last forward with targets saw, over the global batch (every rank the same). */
typedef struct train_moe_stats {
  double aux;       /* the auxiliary loss, summed over the blocks (coefficient included) */
  double load;      /* max/mean tokens per expert, the mean over the blocks (1: balanced) */
  double load_max;  /* the largest max/mean of any block */
  double dropped;   /* capacity mode: the fraction of token-assignments dropped */
  double rows_sent; /* this rank, last forward: rows (of C floats) sent to other ranks
                     * in dispatch, summed over the blocks (combine sends as many back) */
} train_moe_stats;
void train_moe_stats_read(const train_model *m, train_moe_stats *out);

/* The capacity of one expert for N tokens here: ceil(cf*N*K/E) rows, 0 when dropless. */
int train_moe_capacity(int N, int experts, int topk, float cf);

/* Model tensors: 1 for an expert tensor of an MoE block (held in part under EP, synced
 * over the expert-data-parallel group), else 0. */
int train_moe_is_expert_tensor(const train_param *p);

#endif
