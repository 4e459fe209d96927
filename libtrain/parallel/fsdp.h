/*
 * fsdp.h — fully sharded data parallelism (ZeRO stages 1, 2 and 3) as a layer over a
 * train_session and a backend, beside DDP (ddp.h).
 *
 * The flat parameter, gradient and AdamW arrays are cut into units — the embeddings
 * (wte, wpe), each transformer block, the final LayerNorm — each padded to a multiple of
 * N floats; rank r owns shard r (plen/N floats) of every unit: the master parameters, the
 * reduced gradient and both AdamW moments of that slice. Per micro-step every rank reads
 * the same rows as a DDP rank (row (k*N + r)*B of the global batch), and as backward makes
 * a unit's gradient final (the tied wte only after the embeddings, so it holds both the LM
 * head's and the embedding's share) its reduce-scatter (mean over ranks) starts; the
 * shard is accumulated over micro-steps. The step clips by the global norm (one
 * all-reduce of the local squared norms, padding excluded), runs AdamW on the shards and
 * all-gathers parameters:
 *
 *   ZeRO-1  full parameters and gradients on every rank; optimizer state sharded; after
 *           the step every unit is all-gathered back into the full parameter array.
 *   ZeRO-2  as ZeRO-1, but a unit's full gradient is released (its pages returned to the
 *           system) as soon as its reduce-scatter has finished.
 *   ZeRO-3  parameters sharded too: a block's parameters exist only from the all-gather
 *           before its forward (prefetched while the previous block computes) until the
 *           end of its forward, and again from before its backward until its gradients
 *           are reduce-scattered; at most two blocks are materialised at once. The root
 *           units (embeddings, final LayerNorm, small) stay gathered, as PyTorch FSDP's
 *           root unit does.
 *
 * Under tensor parallelism (tp.h) the backend is the data-parallel group of one TP rank
 * and the arrays are that rank's slice; only the clipping norm differs: split tensors'
 * squares are summed over the TP group too, replicated ones counted once.
 *
 * Errors: 0 / -1 with one line in err; after a failed collective the object is only good
 * for train_fsdp_free (and the backend for abort).
 */
#ifndef TRAIN_PARALLEL_FSDP_H
#define TRAIN_PARALLEL_FSDP_H

#include "comm/backend.h"
#include "parallel/timeline.h"
#include "train.h"

typedef struct train_fsdp_options {
  int zero;  /* 1, 2 or 3 (3) */
  int accum; /* micro-steps per optimizer step (1) */
  int trace; /* record a timeline (train_fsdp_write_trace) */
  /* context parallelism (cp.h; 0 or 1: none): the group's ranks in runs of cp share
   * sequences, rank i holding chunks of each by cp rank i % cp (train_cp_take) */
  int cp;
} train_fsdp_options;

TRAIN_API train_fsdp_options train_fsdp_options_default(void);

typedef struct train_fsdp_stats {
  train_step_stats step;   /* loss: mean over ranks and micro-steps; tokens/s: global */
  double fwd_ms, bwd_ms;   /* compute, including the waits for gathers inside the hooks */
  double wait_ms;          /* exposed communication: time blocked on the backend */
  double opt_ms;           /* clip + AdamW + parameter gather after the step */
  uint64_t sent_bytes;     /* bytes this rank sent this step (ring formulas per call) */
  uint64_t measured_bytes; /* the same, measured: the bytes_out of every step libcoll's
                            * trace recorded for this rank's calls in this step (0 when
                            * the backend keeps no trace, or with --trace, which uses it) */
} train_fsdp_stats;

typedef struct train_fsdp train_fsdp;

/* The session's batch is the per-rank micro-batch. Broadcasts rank 0's parameters (unit by
 * unit), keeps this rank's shards, releases what the stage does not keep, and checks every
 * rank gathers the same weights. The session and backend stay the caller's; the session's
 * model is only usable through this object until train_fsdp_free. */
TRAIN_API train_fsdp *train_fsdp_create(train_session *s, train_backend *b,
                                        const train_fsdp_options *o, char *err);
TRAIN_API void train_fsdp_free(train_fsdp *f);
TRAIN_API int train_fsdp_zero(const train_fsdp *f);
TRAIN_API int train_fsdp_num_units(const train_fsdp *f);
/* "unit 3: block 2, 1.02 MiB, 267264 -> 4 x 66816 floats (0 padding)" */
TRAIN_API void train_fsdp_describe_unit(const train_fsdp *f, int u, char *out, size_t n);

/* One optimizer step (collective). */
TRAIN_API int train_fsdp_step(train_fsdp *f, train_fsdp_stats *st, char *err);
/* Collective: the full parameters (dst: nparams floats, or NULL) and, when m_dst/v_dst are
 * given, the full AdamW moments, gathered on every rank; *hash (may be NULL) gets the FNV-1a
 * hash of the parameters. */
TRAIN_API int train_fsdp_gather(train_fsdp *f, float *dst, float *m_dst, float *v_dst,
                                uint64_t *hash, char *err);
/* Collective: 0 when every rank gathers bitwise the same parameters, else -1. */
TRAIN_API int train_fsdp_check_identical(train_fsdp *f, char *err);
/* Collective: puts the full parameters into the model (for evaluation and sampling on
 * one rank) until the next step; costs the full parameter memory at ZeRO-3. */
TRAIN_API int train_fsdp_materialize(train_fsdp *f, char *err);
/* Collective: a checkpoint (format in checkpoint.c) of the 1 x N grid: every rank writes
 * its shard `path.shard0.<r>of1x<N>` (parameters, AdamW m and v of every range it owns;
 * temp file, fsync, rename), then rank 0 writes the manifest `path` (config, grid, units,
 * step, data position, RNG, each shard's size and checksum) the same way, last. Every rank
 * returns -1 if any part failed. train_session_load reads it back at any N (or in one
 * process, or tensor-parallel); a session loaded that way gives train_fsdp_create its full
 * state, which keeps its own shards of it. Not for FSDP over a tensor-parallel slice: */
TRAIN_API int train_fsdp_save(train_fsdp *f, const char *path, char *err);
/* Collective over the job `world` (T x N ranks, rank = d*T + t) with f over this rank's
 * data-parallel group and `tp` its tensor-parallel group: a checkpoint of the T x N grid,
 * every rank writing its own FSDP shard of its TP slice, `path.shard<t>.<d>of<T>x<N>` (no
 * gather), then rank 0 the manifest, last. The session's batch multiplier should make its
 * batch the global one. Every rank returns -1 with a sentence if any part failed. */
TRAIN_API int train_tp_fsdp_save(train_fsdp *f, train_backend *world, train_backend *tp,
                                 const char *path, char *err);
/* Collective: gathers the timelines; rank 0 writes `path`. */
TRAIN_API int train_fsdp_write_trace(train_fsdp *f, const char *path, char *err);

#endif
