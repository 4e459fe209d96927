/* ring.h — ring schedules (see ring.c for the algorithm and its cost). */
#ifndef COLL_RING_H
#define COLL_RING_H
#include "plan.h"
/* nranks >= 2; broadcast/reduce/all_reduce/reduce_scatter/all_gather/barrier. */
coll_result coll_ring_plan(const coll_plan_args *a, coll_step *steps, size_t *nsteps);
#endif
