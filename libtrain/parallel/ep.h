/*
 * ep.h — expert parallelism: a mixture-of-experts model (model/moe.h) trained over the
 * grid's data-parallel group of D ranks, its E experts spread over expert-parallel groups
 * of X consecutive DP ranks (train_grid_add_ep; Megatron's layout: the EP group is carved
 * out of the DP group). DP rank d holds experts [(d % X)*E/X, +E/X) of every block and
 * everything else whole.
 *
 *   forward, per block:  router -> counts all-to-all (E/X ints to each EP rank)
 *                        -> dispatch all-to-allv (the rows each expert gets)
 *                        -> the local experts -> combine all-to-allv (the mirror)
 *   backward, per block: the gates' gradients -> dispatch all-to-allv of the output
 *                        gradients -> the experts' backward -> combine all-to-allv of
 *                        the input gradients back to the tokens' ranks
 *   the router's statistics (counts, probability sums) are all-reduced over the D ranks
 *   before the auxiliary loss is formed, so every rank sees the global batch's.
 *   after backward: the dense gradients all-reduced (average) over the D ranks, the
 *   experts' summed over the D/X ranks holding the same experts and divided by D — the
 *   global batch's mean gradient, as one process computes it.
 *
 * With --parallel fsdp --zero 1 the gradients are reduce-scattered instead (same groups)
 * and AdamW runs on this rank's shard of each, the parameters all-gathered after.
 *
 * X = 1 is data parallelism of an MoE model (every expert everywhere; only the statistics
 * cross ranks in forward). Bytes a rank sends per block and step, N tokens of C fp32 each
 * (dropless, balanced): K*N*(X-1)/X rows in dispatch and as many in combine, the same
 * again in backward: 4*K*N*(X-1)/X*C*4 bytes; capacity mode sends E*cap rows of which
 * (X-1)/X to other ranks, padding included.
 */
#ifndef TRAIN_PARALLEL_EP_H
#define TRAIN_PARALLEL_EP_H

#include "parallel/planner.h"
#include "parallel/strategy.h"

/* --plan's row for an MoE model on D ranks with EP X (X = D = 1: one process): memory
 * per rank (its E/X experts, the MoE activations at balanced routing; zero1: AdamW's
 * moments sharded, the dense part over D, the experts over D/X) and bytes sent per step
 * (the all-to-alls, the dense and expert gradient all-reduces — ZeRO-1's reduce-scatter
 * and all-gather send the same). *a2a_layer gets the all-to-all bytes a rank sends per
 * block and step (forward and backward). */
TRAIN_API int train_ep_plan(const train_config *cfg, int B, int T, int D, int X, int experts,
                            int topk, float capacity, int zero1, double fixed, train_plan_row *out,
                            double *a2a_layer, char *err);

#endif
