/* ring.h — ring schedules (see ring.c for the algorithm and its cost). */
#ifndef COLL_RING_H
#define COLL_RING_H
#include "plan.h"
/* nranks >= 2; broadcast/reduce/all_reduce/reduce_scatter/all_gather/barrier. */
coll_result coll_ring_plan(const coll_plan_args *a, coll_step *steps, size_t *nsteps);
/* The cost formulas of the comment at the top of ring.c, evaluated: p ranks, n bytes
 * (nccl-tests' convention), slices of `slice` bytes, α s/message, β s/byte.  Writes the
 * formula with its numbers into `formula`. */
coll_result coll_ring_cost(coll_coll_kind coll, int p, double n, double slice, double alpha,
                           double beta, double *seconds, char *formula, size_t formula_len);
#endif
