/*
 * ddp.h — data-parallel training (DDP) as a layer over a train_session and a backend.
 *
 * Every rank holds the whole model. At creation rank 0's parameters are broadcast and
 * all ranks check they hold identical bits. Each optimizer step reads a global batch of
 * accum * nranks * B sequences (the same rows one process would read with that batch),
 * rank r taking rows (k*nranks + r)*B .. +B for micro-step k; runs forward/backward on
 * them, and on the last micro-step averages the gradients across ranks in buckets:
 * ranges of the flat gradient array, cut in reverse layout order (final LayerNorm, top
 * block, ..., embeddings), the first `first_bucket_bytes` (1 MiB), the others up to
 * `bucket_bytes` (25 MiB), never splitting a tensor. With overlap, a bucket's
 * asynchronous all-reduce starts as soon as backward has made all its gradients final,
 * so it runs while backward computes the layers below; the optimizer waits for all.
 * Clipping and AdamW then run on identical gradients on every rank, which keeps the
 * weights bitwise identical.
 *
 * Errors: 0 / -1 with one line in err; a failed collective leaves the DDP object usable
 * only for train_ddp_free (and the backend for abort).
 */
#ifndef TRAIN_PARALLEL_DDP_H
#define TRAIN_PARALLEL_DDP_H

#include "comm/backend.h"
#include "parallel/timeline.h"
#include "train.h"

typedef struct train_ddp_options {
  size_t bucket_bytes;       /* cap of every bucket but the first (25 MiB) */
  size_t first_bucket_bytes; /* cap of the first bucket (1 MiB) */
  int overlap;               /* 1: launch buckets during backward; 0: after it */
  int accum;                 /* micro-steps per optimizer step (1) */
  int trace;                 /* record a timeline (train_ddp_write_trace) */
  /* context parallelism (cp.h; 0 or 1: none): the group's ranks in runs of cp share
   * sequences, rank i holding chunks of each by cp rank i % cp (train_cp_take) */
  int cp;
} train_ddp_options;

TRAIN_API train_ddp_options train_ddp_options_default(void);

typedef struct train_ddp_bucket {
  size_t start, count; /* range of the flat gradient array, in floats */
  int first_tensor, ntensors;
  int layer; /* the stage that makes it final: L = final LN, l, -1 */
} train_ddp_bucket;

typedef struct train_ddp_stats {
  train_step_stats step; /* loss: mean over all ranks and micro-steps; tokens/s: global */
  double fwd_ms;         /* forward, all micro-steps */
  double bwd_ms;         /* backward compute, all micro-steps (launch calls excluded) */
  double wait_ms;        /* exposed communication: time inside the all-reduce launch
                          * calls plus the wait for them after backward */
  double comm_ms;        /* first bucket launched .. last bucket seen done */
  double hidden;         /* 1 - wait_ms / comm_ms, clamped to [0, 1]: the share of the
                          * communication time that backward compute covered */
  double opt_ms;         /* clip + AdamW */
} train_ddp_stats;

typedef struct train_ddp train_ddp;

/* The session's batch is the per-rank micro-batch B. Broadcasts rank 0's parameters and
 * checks they are identical everywhere. The session and backend stay the caller's. */
TRAIN_API train_ddp *train_ddp_create(train_session *s, train_backend *b,
                                      const train_ddp_options *o, char *err);
TRAIN_API void train_ddp_free(train_ddp *d);
TRAIN_API int train_ddp_num_buckets(const train_ddp *d);
TRAIN_API const train_ddp_bucket *train_ddp_bucket_info(const train_ddp *d, int i);
/* Describes bucket i for people: "bucket 2: 1.02 MiB, 12 tensors h.1.ln1.w..h.1.mlp.proj.b,
 * final after layer 1". */
TRAIN_API void train_ddp_describe_bucket(const train_ddp *d, int i, char *out, size_t n);

/* One optimizer step on every rank (collective: all ranks must call it). */
TRAIN_API int train_ddp_step(train_ddp *d, train_ddp_stats *st, char *err);
/* Collective: 0 when every rank holds bitwise the same parameters; else -1 naming the
 * ranks that differ. */
TRAIN_API int train_ddp_check_identical(train_ddp *d, char *err);
/* Collective: gathers every rank's timeline; rank 0 writes `path`. */
TRAIN_API int train_ddp_write_trace(train_ddp *d, const char *path, char *err);

/* The pieces of train_ddp_step's backward, for other backward implementations and tests:
 * begin arms the buckets; grads_final(final_from, layer) is the backward hook (launches
 * every bucket lying entirely at offsets >= final_from); finish launches what is left
 * when overlap is off, and fails — naming the bucket, its tensors and the layer whose
 * gradients never became final — if a bucket was not launched by the end of backward. */
TRAIN_API void train_ddp_begin_backward(train_ddp *d);
TRAIN_API void train_ddp_grads_final(train_ddp *d, size_t final_from, int layer);
TRAIN_API int train_ddp_finish_backward(train_ddp *d, char *err);
/* Waits for every launched bucket. */
TRAIN_API int train_ddp_wait_all(train_ddp *d, char *err);

#endif
