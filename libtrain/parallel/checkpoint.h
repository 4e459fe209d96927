/*
 * checkpoint.h — the pieces of the sharded checkpoint format (checkpoint.c) that the
 * parallel strategies write through: a shard's file name, a shard, and the manifest that
 * rank 0 writes last. The format itself is described at the top of checkpoint.c.
 */
#ifndef TRAIN_PARALLEL_CHECKPOINT_H
#define TRAIN_PARALLEL_CHECKPOINT_H

#include "model/model.h"

/* Sharded checkpoints (checkpoint.c; format there): rank r's shard file name, writing it
 * (atomically; *bytes and *hash for the manifest), and the manifest (rank 0, last). */
void train_shard_path(char *out, size_t n, const char *manifest, int rank, int nranks);
int train_shard_write(const train_session *s, const char *manifest, int rank, int nranks,
                      const float *p, const float *m, const float *v, size_t S,
                      uint64_t *bytes, uint64_t *hash, char *err);
int train_manifest_write(train_session *s, const char *path, int nranks, int nunits,
                         const size_t *unit_len, const uint64_t *bytes, const uint64_t *hash,
                         char *err);


#endif
