/*
 * pipeline.h — pipeline parallelism: the model's blocks cut into stages (model.h's
 * train_pp_piece rule; embeddings on the first stage, final LayerNorm, tied head and loss
 * on the last), one optimizer step run as a schedule of micro-batches (schedule.h: GPipe,
 * 1F1B, interleaved, ZB-H1) whose action lists pipeline.c interprets one by one: compute
 * on the stage's model pieces, transfers of activations and their gradients as libcoll
 * point-to-point calls grouped as the lists group them (train_backend.exchange).
 *
 * After the last micro-batch (and not before) a step makes each stage's gradients whole:
 * the tied embedding's two halves (wte's gradient from the embedding on the first stage
 * and from the head on the last) summed over the pair, then the average over the stage's
 * data-parallel group; the norm for clipping summed over the stages (wte counted once);
 * AdamW on what the stage holds. Tensor parallelism composes inside the stages (its layer
 * operations attached to each stage's model, rank = (p*D + d)*T + t).
 *
 * The step's batch: M micro-batches of --batch rows on each of the D data-parallel ranks,
 * micro-batch k of data rank d being rows (k*D + d)*batch of the global batch — the rows
 * DDP with --accum M reads, so a pipeline run, a DDP run and one process with
 * --batch M*D*batch see the same sequences.
 *
 * Checkpoints: data-parallel rank 0 of each (TP rank, stage) writes the units its stage
 * holds (checkpoint.c's T x 1 x P grid, train_stage_save; the tied wte once, from the
 * first stage), and train_session_load puts any checkpoint into a stage's session (its
 * pieces' blocks, wte on both end stages), so a run resumes at another P, V, T or D.
 */
#ifndef TRAIN_PARALLEL_PIPELINE_H
#define TRAIN_PARALLEL_PIPELINE_H

#include "parallel/schedule.h"
#include "parallel/strategy.h"

/* 0, or -1 with a sentence when the model cannot be cut into P stages of V chunks each
 * (fewer blocks than pieces, a device other than the CPU): model.h's rule. */
TRAIN_API int train_pp_config_check(const train_config *cfg, int P, int V, train_device dev,
                                    char *err);

/* Activation sets stage `stage` needs for (kind, P, M, V): the most (micro-batch, chunk)
 * pairs whose activations it holds at once as pipeline.c runs the lists (received
 * before its forward, released after its gradient is sent or, ZB, after W). The
 * session's model is created with that many (train_options.pp_slots). -1 with err when
 * the schedule cannot be built. */
TRAIN_API int train_pp_slots(train_pp_kind kind, int P, int M, int V, int stage, char *err);

/* --plan's row for pipeline stage `stage` of P (T-way tensor parallel inside, sp its
 * sequence parallelism, D data-parallel replicas, per-rank micro-batch B x S, M
 * micro-batches, V chunks): the stage's parameters, gradients and AdamW (fp32: 4 + 4 + 8
 * bytes a parameter), its activation sets (train_pp_slots of them) and backward scratch;
 * sent per step: the activations and gradients the lists send (B·S·C floats each, /T
 * under sp), the tied embedding's all-reduce between the end stages, the data-parallel
 * all-reduce of the stage's gradients (ring: 2(D-1)/D), and the tensor-parallel in-block
 * all-reduces of its blocks for each micro-batch. zero1 (--parallel fsdp --zero 1): AdamW's
 * moments of a 1/D shard, the reduced gradient shard beside the full gradients, the same
 * bytes on the wire (a reduce-scatter and an all-gather are one all-reduce's). */
TRAIN_API int train_pp_plan(const train_config *cfg, int B, int S, int tp, int sp, int P, int stage,
                            train_pp_kind kind, int M, int V, int D, int zero1, int recompute,
                            int bf16, double fixed, train_plan_row *out, char *err);

#endif
