/* pairwise.h — all-to-all(v) by one exchange with every peer (see pairwise.c). */
#ifndef COLL_PAIRWISE_H
#define COLL_PAIRWISE_H
#include "plan.h"
/* all_to_all / all_to_allv, any nranks >= 1. */
coll_result coll_pairwise_plan(const coll_plan_args *a, coll_step *steps, size_t *nsteps);
/* The formula at the top of pairwise.c, evaluated (all_to_all; n = one rank's whole send
 * buffer). */
coll_result coll_pairwise_cost(coll_coll_kind c, int p, double n, double slice, double alpha,
                               double beta, double gamma, double *seconds, char *formula,
                               size_t formula_len);
#endif
