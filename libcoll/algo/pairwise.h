/* pairwise.h — all-to-all(v) by one exchange with every peer (see pairwise.c). */
#ifndef COLL_PAIRWISE_H
#define COLL_PAIRWISE_H
#include "plan.h"
/* all_to_all / all_to_allv, any nranks >= 1. */
coll_result coll_pairwise_plan(const coll_plan_args *a, coll_step *steps, size_t *nsteps);
#endif
