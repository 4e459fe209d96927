/* rd.h — recursive doubling and recursive halving/doubling schedules (see rd.c). */
#ifndef COLL_RD_H
#define COLL_RD_H
#include "plan.h"

/* Recursive doubling, nranks >= 2: all_reduce, barrier, all_gather. */
coll_result coll_rd_plan(const coll_plan_args *a, coll_step *steps, size_t *nsteps);
/* Recursive halving/doubling (Rabenseifner), nranks >= 2: all_reduce, all_gather (the
 * all-gather is recursive doubling's). */
coll_result coll_rhd_plan(const coll_plan_args *a, coll_step *steps, size_t *nsteps);

#endif
