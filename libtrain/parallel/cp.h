/*
 * cp.h — context parallelism (cp.c): the sequence split over the Cp ranks of a ring, so
 * that each rank runs every layer outside attention on its T/Cp positions, and
 * attention — the one layer that mixes positions — communicates:
 *
 *  - ring attention (default): each rank keeps its queries; the K/V blocks travel round
 *    the ring (Cp - 1 grouped send/recv steps, each started before the local block's
 *    attention and waited after it), the partial results merged by their log-sum-exp.
 *    Backward is the mirror: K/V travel again while each block's dK/dV partial sums
 *    travel behind them, one step late, and arrive at their owner after Cp steps.
 *  - Ulysses (--cp-mode ulysses): one all-to-all turns the sequence-sharded q, k, v into
 *    head-sharded ones for all T positions (NH/Cp heads per rank), the ordinary causal
 *    attention runs on them, one all-to-all turns the output back; backward mirrors it.
 *
 * Causal balance: each sequence is cut into 2Cp chunks of T/(2Cp) and CP rank r holds
 * chunks r and 2Cp-1-r (an early and a late one), so every rank has the same number of
 * unmasked query-key pairs. The positions for wpe follow the chunks; the data each rank
 * runs are its chunks of the same sequences (train_cp_take).
 *
 * The ranks of a ring see different tokens of the same weights: they are data-parallel
 * for the gradients, which sync over the D x Cp ranks (the grid's dp group). Under --tp
 * each ring works on the heads its tensor-parallel rank holds.
 */
#ifndef TRAIN_PARALLEL_CP_H
#define TRAIN_PARALLEL_CP_H

#include "train.h"

/* The position in the whole sequence (T tokens) of local row t (0 <= t < T/C) of CP rank
 * r of C: chunk r for the first T/(2C) rows, chunk 2C-1-r for the rest. */
static inline int train_cp_pos(int T, int C, int r, int t) {
  int Tc = T / (2 * C);
  return t < Tc ? r * Tc + t : (2 * C - 1 - r) * Tc + (t - Tc);
}

/* mine (B, T/C) = CP rank r's chunks of each of the B sequences of full (B, T). */
TRAIN_API void train_cp_take(const int *full, int *mine, int B, int T, int C, int r);

/* 0, or -1 with one sentence when --cp C (ulysses: --cp-mode ulysses) cannot run this
 * model and sequence: T not a multiple of 2C, (Ulysses) the heads held per TP rank not a
 * multiple of C. */
TRAIN_API int train_cp_check(const train_config *cfg, int T, int C, int ulysses, int tp, char *err);

/* Bytes one rank sends for context parallelism per layer and step, forward and backward
 * (train_cp_check's shapes; under --tp tp the rank's heads, C_model/tp channels): ring, (C-1) K/V
 * blocks of 2(T/C)C_model*4 bytes per sequence forward, backward the K/V again and C dK/dV blocks;
 * Ulysses, (C-1)/C of q, k, v and the output each way. */
TRAIN_API void train_cp_layer_bytes(const train_config *cfg, int B, int T, int C, int tp,
                                    int ulysses, double *fwd, double *bwd);
/* Bytes one rank holds for context parallelism beyond its model at (B, T/C): Ulysses'
 * per-layer head-sharded q, k, v and attention probabilities and the staging of both modes,
 * less the model's (T/C)^2 probabilities and their scratch, which neither mode touches
 * (but for the ring's lse) and so never become resident (may be negative). */
TRAIN_API double train_cp_extra_bytes(const train_config *cfg, int B, int T, int C, int tp,
                                      int ulysses, int recompute);

typedef struct train_plan_row train_plan_row;
/* The planner's row of --cp C over D replicas (ulysses: --cp-mode ulysses) under DDP or
 * ZeRO-`zero` (fsdp; 0: DDP) and activation recomputation `recompute`, with --tp tp the
 * tensor-parallel row: that strategy's memory
 * over D*C ranks for the model at (B, T/C), plus
 * train_cp_extra_bytes, and sent = its gradient traffic over D*C ranks plus L x
 * train_cp_layer_bytes. */
TRAIN_API int train_cp_plan(const train_config *cfg, int B, int T, int C, int D, int tp, int zero,
                            int ulysses, int recompute, double fixed, train_plan_row *out,
                            char *err);

#endif
