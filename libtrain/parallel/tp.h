/*
 * tp.h — tensor parallelism (Megatron-LM's layout) as a layer over a train_session whose
 * model was created at local widths (train_options.tp, .tp_rank), and a backend over the
 * T ranks of one tensor-parallel group.
 *
 * Each of the T ranks holds a slice of every block's matrices and of the vocabulary:
 *
 *   tensor          full shape   on rank r (Cl = C/T, Vl = ceil(V/T))
 *   wte             (V, C)       rows [r*Vl, r*Vl + Vl) of wte padded with zero rows to T*Vl
 *   attn.qkv.w, .b  (3C, C)      rows r*Cl.. of each of q, k, v: heads [r*NH/T, +NH/T)
 *   attn.proj.w     (C, C)       columns [r*Cl, +Cl)   (row-parallel: its input is split)
 *   mlp.fc.w, .b    (4C, C)      rows [r*4Cl, +4Cl)    (column-parallel)
 *   mlp.proj.w      (C, 4C)      columns [r*4Cl, +4Cl) (row-parallel)
 *   wpe, ln*, lnf, attn.proj.b, mlp.proj.b           replicated
 *
 * tp.c implements the model's layer operations (model.h: train_layer_ops) for such a
 * slice and train_tp_attach installs them on the model, which calls them as it calls the
 * single-process ones; the group is reached inside them, at the two conjugate operators
 * of Megatron:
 *
 *        x ──f──> [column-parallel Linear] ─> local heads / GELU ─> [row-parallel] ──g──> y
 *   f: forward identity, backward all-reduce of the input gradient;
 *   g: forward all-reduce of the partial outputs (then the bias, once), backward identity;
 *
 * one f and one g per attention and per MLP: four all-reduces of B·T·C floats per block
 * per step. The embedding looks up the ids it holds (zeros elsewhere) and all-reduces; the
 * LM head is column-parallel over the vocabulary (an f), and the cross-entropy reduces the
 * row maxima, the sums of exponentials and the target logits (3 all-reduces of B·T floats)
 * and never gathers the logits. Gradients of the replicated tensors come out identical on
 * every rank of the group (their inputs and output gradients are whole everywhere); the
 * global gradient norm sums the split tensors over the group and counts the replicated
 * ones once. The CPU model only.
 *
 * On a TP session train_copy_logits_to_host gives this rank's (B,T,V/T) columns and
 * train_session_sample writes an empty string. Checkpoints are cut by TP rank (train_tp_save,
 * or train_tp_fsdp_save under FSDP; format in checkpoint.c); train_session_load reads any
 * checkpoint into a TP session (its slice of the single-process state) and a TP checkpoint
 * into one process.
 *
 * Data parallelism composes along the other axis: DDP over the backend of the ranks with
 * the same TP rank (ddp.h) sees the local flat arrays and needs no change.
 */
#ifndef TRAIN_PARALLEL_TP_H
#define TRAIN_PARALLEL_TP_H

#include "comm/backend.h"
#include "parallel/strategy.h"
#include "train.h"


/* 0, or -1 with a sentence when the model cannot be split T ways (heads not a multiple of
 * T, T beyond the vocabulary, a device other than the CPU). */
TRAIN_API int train_tp_config_check(const train_config *cfg, int tp, train_device dev, char *err);

/* Collective over `tp` (the session's model must have been created with
 * opt.tp == tp->nranks, opt.tp_rank == tp->rank): checks every rank holds bitwise the same
 * replicated tensors and installs the tensor-parallel layer operations on the model, with
 * the group in their context; train_tp_detach gives the model back its single-process
 * operations. Backend and session stay the caller's; train_tp_detach before freeing
 * either. */
TRAIN_API int train_tp_attach(train_session *s, train_backend *tp, char *err);
TRAIN_API void train_tp_detach(train_session *s);
/* 0 while every collective inside forward/backward succeeded, else -1 with the first
 * failure's sentence (the model's passes cannot return errors themselves). */
TRAIN_API int train_tp_status(const train_session *s, char *err);

typedef struct train_tp_stats {
  long calls;       /* all-reduces and all-gathers made inside forward/backward */
  long block_calls; /* of which the f/g all-reduces in blocks */
  double bytes;     /* bytes reduced inside blocks (B·T·C·4 per call) */
  double ms;        /* time blocked in the block all-reduces */
  double other_ms;  /* time blocked in the embedding / head / loss / norm collectives */
} train_tp_stats;
/* Counters since the last reset (reset = 1 zeroes them after reading). */
TRAIN_API void train_tp_stats_read(train_session *s, train_tp_stats *out, int reset);
/* With a trace (may be NULL): every collective inside the model is recorded as a
 * communication slice of rank `rank` ("g attn", "f mlp", ...). */
struct train_trace;
TRAIN_API void train_tp_set_trace(train_session *s, struct train_trace *tr, int rank);

/* Megatron's two conjugate operators over the group `b`, in place on x (n floats), blocking;
 * 0 or -1 with a sentence in b->err. The layer operations make the same sums (tp.c).
 *   f ("copy to the tensor-parallel region"):  forward identity, backward sum over ranks;
 *   g ("reduce from the region"):              forward sum over ranks, backward identity. */
TRAIN_API int train_tp_f_forward(train_backend *b, float *x, size_t n);
TRAIN_API int train_tp_f_backward(train_backend *b, float *dx, size_t n);
TRAIN_API int train_tp_g_forward(train_backend *b, float *x, size_t n);
TRAIN_API int train_tp_g_backward(train_backend *b, float *dx, size_t n);

/* --plan's row for T x D ranks (D = 1: TP alone, else TP x DDP) at per-rank batch B x seq
 * S: parameters, gradients, AdamW and activations of one rank's slice, and the bytes a rank
 * sends per step (ring: 2(n-1)/n of each all-reduce): the 4 in-block all-reduces per block
 * per step of B·S·C floats, the embedding's and the LM head's (B·S·C each), the loss's
 * (3·B·S), and with D > 1 DDP's gradient all-reduce of the slice. With sp the residual
 * stream's activations are divided by T and every in-block all-reduce is an all-gather
 * plus a reduce-scatter of the same bytes on the wire (ring: (n-1)/n each). *inblock gets the
 * in-block all-reduce count per step and *inblock_bytes the bytes of each (may be NULL).
 * zero 1..3 (with dp > 1): TP x FSDP, ZeRO-`zero` along D over the rank's slice — the FSDP
 * row of the slice's units (train_plan's formulas) plus TP's traffic; 0: DDP (or none). */
#include "parallel/planner.h"
TRAIN_API int train_tp_plan(const train_config *cfg, int B, int S, int tp, int dp, int sp, int zero,
                            int recompute, int bf16, double fixed, train_plan_row *out,
                            long *inblock, double *inblock_bytes, char *err);

/* Parameter conversion between the single-process layout (full: train_num_params of the
 * T = 1 model) and rank r's local layout: shard copies r's slice out of full; unshard
 * writes local into its place in full (the replicated tensors too). */
TRAIN_API int train_tp_shard(const train_config *cfg, int tp, int rank, const float *full,
                             float *local, char *err);
TRAIN_API int train_tp_unshard(const train_config *cfg, int tp, int rank, const float *local,
                               float *full, char *err);

/* Collective over the job `world` (T x D ranks, rank = d*T + t) and this rank's TP group
 * `tp`: a checkpoint of the T x 1 grid (format in checkpoint.c). Data-parallel rank 0 of
 * each TP group writes its slice `path.shard<t>.0of<T>x1` (temp file, fsync, rename):
 * parameters, AdamW m and v — p, m, v (this rank's local layout, train_num_params floats
 * each; e.g. gathered from FSDP's shards), or the session's model's own when p is NULL;
 * then rank 0 writes the manifest `path` (grid, config, step, data position, RNG, each
 * shard's size and checksum) the same way, last.
 * The other DP ranks write nothing: under DDP they hold the same state. The session's
 * batch multiplier (train_session_set_batch_mult) should make its batch the global one.
 * Every rank returns -1 with a sentence if any part failed (then there is no manifest). */
TRAIN_API int train_tp_save(train_session *s, train_backend *world, train_backend *tp,
                            const float *p, const float *m, const float *v, const char *path,
                            char *err);

/* *x = its sum over the TP group of the session's model m (blocking; FSDP's gradient norm
 * over a TP slice: fsdp.c); 0, or -1 with a sentence. Only while a group is attached. */
int train_tp_group_sum(train_model *m, float *x, char *err);

#endif
