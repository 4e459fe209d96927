/*
 * checkpoint.h — how the savers (train_session_save, train_tp_save in checkpoint.c;
 * train_fsdp_save and train_tp_fsdp_save in fsdp.c; pipeline.c's stages) write the one
 * checkpoint format: each rank describes its part of the T x S x P grid and calls
 * train_ckpt_write, which writes the shard, gathers every shard's size and checksum, and
 * has rank 0 write the manifest last. The format itself is described at the top of
 * checkpoint.c. Nothing here prints; a rank that cannot write still takes part.
 */
#ifndef TRAIN_PARALLEL_CHECKPOINT_H
#define TRAIN_PARALLEL_CHECKPOINT_H

#include "comm/backend.h"
#include "model/model.h"

/* The file name of shard (t, s, p) of a T x S x P checkpoint whose manifest is
 * `manifest`: "<manifest>.shard<t>.<s>of<T>x<S>" when P = 1 (the names of version 4),
 * else "<manifest>.shard<t>.<s>.<p>of<T>x<S>x<P>". */
void train_shard_path(char *out, size_t n, const char *manifest, int t, int s, int p, int T, int S,
                      int P);

/* One rank's part of a checkpoint: the grid (T tensor-parallel slices, each cut in S
 * data-parallel shards by FSDP's units, the units written by P pipeline stages), which
 * shard this rank holds, and that shard's count floats of parameters, AdamW m and AdamW
 * v: the units its stage writes (checkpoint.c's rule), each cut as S says. */
typedef struct train_ckpt_part {
  int T, S;               /* the grid */
  int P, chunks;          /* pipeline stages and chunks per stage (0: 1, no pipeline) */
  int t, s, stage;        /* this rank's shard */
  int writes;             /* 0: another rank writes the same shard (a DDP copy) */
  const float *p, *m, *v; /* count floats each (when writes) */
  size_t count;
  const size_t *unit_len; /* the L+2 unit lengths the pieces were cut by (FSDP's own), to
                           * be checked against the model's slice; NULL: not cut (S = 1) */
  const char *failed;     /* non-NULL: this rank could not even prepare its shard (the
                           * sentence); it still takes part so that everyone learns */
} train_ckpt_part;

/* Collective over `world` (every rank of the job; NULL: this process alone, a 1 x 1 grid):
 * the shards of the ranks that write, then the manifest at `path` from world rank 0, last
 * (each atomically). Every rank returns 0 when the whole checkpoint exists, else -1 with a
 * sentence (then there is no manifest). */
int train_ckpt_write(train_session *s, train_backend *world, const train_ckpt_part *part,
                     const char *path, char *err);

/* Collective over `world` (every rank of a pipeline job, rank = (p*D + d)*T + t): a
 * checkpoint of the T x 1 x P grid from this pipeline stage's session (stage `stage` of P,
 * `chunks` pieces each, TP rank t of T): data-parallel rank 0 of each (t, stage) writes
 * its units (writes = 1: the stage's parameters and moments but for the head's copy of wte,
 * which stage 0 writes), the others take part. 0, or -1 with a sentence on every rank. */
int train_stage_save(train_session *s, train_backend *world, int T, int t, int P, int stage,
                     int chunks, int writes, const char *path, char *err);

#endif
