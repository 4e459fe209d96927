/* env_rank.c — a libcoll program started by someone else's launcher (mpirun, a
 * torchrun-like environment): joins with coll_comm_init_from_env, runs an all-reduce,
 * a broadcast and a barrier, checks them, prints one line, exits 0 on success. */
#include <stdio.h>
#include <stdlib.h>

#include "coll.h"

int main(void) {
  coll_comm_t comm;
  coll_result r = coll_comm_init_from_env(&comm);
  if (r != COLL_OK) {
    fprintf(stderr, "init_from_env: %s: %s\n", coll_result_string(r), coll_comm_last_error(NULL));
    return 2;
  }
  int rank, n;
  coll_comm_rank(comm, &rank);
  coll_comm_size(comm, &n);
  enum { C = 100000 };
  double *x = malloc(sizeof(double) * C);
  for (int i = 0; i < C; i++) x[i] = rank + i;
  r = coll_all_reduce(x, x, C, COLL_FLOAT64, COLL_SUM, comm, NULL);
  int bad = r != COLL_OK;
  for (int i = 0; i < C && !bad; i++) bad = x[i] != (double)n * (n - 1) / 2 + (double)n * i;
  int64_t v = rank == n - 1 ? 4242 : -1;
  if (!bad) bad = coll_broadcast(&v, &v, 1, COLL_INT64, n - 1, comm, NULL) != COLL_OK || v != 4242;
  if (!bad) bad = coll_barrier(comm, NULL) != COLL_OK;
  printf("rank %d of %d: %s\n", rank, n, bad ? "WRONG" : "ok");
  coll_comm_destroy(comm);
  free(x);
  return bad;
}
