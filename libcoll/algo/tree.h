/* tree.h — pipelined double binary tree schedules (see tree.c for the algorithm and its
 * cost). */
#ifndef COLL_TREE_H
#define COLL_TREE_H
#include "plan.h"

/* nranks >= 2; broadcast, reduce, all_reduce, barrier. */
coll_result coll_tree_plan(const coll_plan_args *a, coll_step *steps, size_t *nsteps);

/* One of the two trees, for tests and the trace: the neighbours of `rank` in tree t
 * (0 or 1) rooted at `root` over p ranks.  parent -1 at the root; children[] -1 where
 * absent; depth 0 at the root. */
void coll_tree_node(int p, int root, int t, int rank, int *parent, int children[2], int *depth);
/* The depth of the deepest rank: 1 + floor(log2(p-1)) for p >= 2. */
int coll_tree_height(int p);

#endif
