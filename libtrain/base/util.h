/*
 * util.h — the helpers every layer of libtrain shares (util.c): a seeded RNG, FNV-1a
 * hashing, one-line error messages, a clock, atomic file writes, and which local rank this
 * process is. The bottom of libtrain: it includes nothing of libtrain but train.h.
 */
#ifndef TRAIN_BASE_UTIL_H
#define TRAIN_BASE_UTIL_H

#include "train.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

uint64_t train_splitmix64(uint64_t *state);
float train_rand_uniform(uint64_t *state); /* [0,1) */
float train_rand_normal(uint64_t *state);  /* N(0,1), Box-Muller */
uint64_t train_fnv1a(uint64_t h, const void *p, size_t n);
#define TRAIN_FNV_INIT 0xcbf29ce484222325ULL
void train_errf(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
double train_now(void);
int train_cpu_count(void);

/* Atomic file write: open a temp file next to `path`; commit = fsync, rename, fsync dir;
 * abort = close and unlink. */
typedef struct train_atomic {
  FILE *f;
  char path[4096];
  char tmp[4200];
} train_atomic;
int train_atomic_open(train_atomic *a, const char *path, char *err);
int train_atomic_commit(train_atomic *a, char *err);
void train_atomic_abort(train_atomic *a);


/* This process's rank among the ranks on its machine, which picks its GPU (local rank mod
 * devices): coll-train's own forked ranks set TRAIN_LOCAL_RANK; launchers set one of the
 * others.  `fallback` when none is set (a one-host job whose rank is the local rank). */
static inline int train_local_rank(int fallback) {
  static const char *vars[] = {"TRAIN_LOCAL_RANK", "LOCAL_RANK",      "OMPI_COMM_WORLD_LOCAL_RANK",
                               "SLURM_LOCALID",    "MPI_LOCALRANKID", "PMI_LOCAL_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return atoi(v);
  }
  return fallback;
}


/* The CUDA module (libtrain_cuda.so, cuda_module.c): the address of `name` in it, or NULL
 * with a sentence in err when the module or the symbol is missing. */
void *train_cuda_module_sym(const char *name, char *err);

#endif
