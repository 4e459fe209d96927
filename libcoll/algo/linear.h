/* linear.h — gather and scatter straight between the root and every rank (see linear.c). */
#ifndef COLL_LINEAR_H
#define COLL_LINEAR_H
#include "plan.h"
/* gather / scatter, any nranks >= 1, any root. */
coll_result coll_linear_plan(const coll_plan_args *a, coll_step *steps, size_t *nsteps);
#endif
