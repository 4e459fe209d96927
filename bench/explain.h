/* explain.h — coll-bench --explain (see explain.c). */
#ifndef COLL_BENCH_EXPLAIN_H
#define COLL_BENCH_EXPLAIN_H

#include <stdio.h>

#include "bench_util.h"
#include "coll.h"

typedef struct {
  coll_comm_t comm;
  int rank, nranks;
  FILE *out; /* rank 0 prints here */
  /* Issues one call of d's collective on (sb, rb, count) and waits for it; 0 on success
   * (a failure has been reported). */
  int (*call)(void *ctx, const bench_data *d, const void *sb, void *rb, size_t count);
  void *call_ctx;
  unsigned char *sendbuf, *recvbuf; /* large enough for the biggest size */
  unsigned long iters, warmup;
  double ranks_per_core;
  int one_host;       /* every rank on this host: their CLOCK_MONOTONIC readings compare */
  double alpha, beta; /* filled by bench_explain_probe: s/message, s/byte */
} bench_explain_ctx;

/* Measures α and β (every rank calls it); rank 0 prints how. */
int bench_explain_probe(bench_explain_ctx *e);
/* Runs d's collective at `size` bytes: timed, then once traced; rank 0 prints the steps,
 * the byte totals and the model beside the measurement. */
int bench_explain_one(bench_explain_ctx *e, const bench_data *d, size_t size);

#endif
