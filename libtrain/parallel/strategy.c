/*
 * strategy.c — what every strategy shares (strategy.h): the grid their groups come from,
 * a new strategy object, its free, and the appending of its lines. The bottom of
 * parallel/: it names no strategy (the table of them is strategies.c).
 */
#include "parallel/strategy.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int train_grid_create(train_grid *g, train_backend *world, int T, char *err) {
  memset(g, 0, sizeof *g);
  g->world = world;
  g->T = T > 1 ? T : 1;
  g->D = world ? world->nranks / g->T : 1;
  g->dp = world;
  if (g->T == 1) return 0;
  if (!world || world->nranks % g->T != 0) {
    train_errf(err, "%d ranks cannot form --tp %d groups", world ? world->nranks : 1, T);
    return -1;
  }
  if (!world->split) {
    train_errf(err,
               "--tp: the %s backend cannot split the job into tensor- and "
               "data-parallel groups; use --backend coll",
               world->name);
    return -1;
  }
  /* rank = d*T + t: the TP group is the T consecutive ranks of one d (colour d), the DP
   * group the D ranks of one t (colour t), each ranked by its place in the job */
  train_backend *tp = NULL, *dp = NULL;
  if (world->split(world, train_dp_rank_of(world->rank, g->T), world->rank, &tp) != 0 ||
      world->split(world, train_tp_rank_of(world->rank, g->T), world->rank, &dp) != 0 || !tp ||
      !dp) {
    train_errf(err, "%s", world->err);
    if (dp) dp->destroy(dp);
    if (tp) tp->destroy(tp);
    g->dp = world;
    return -1;
  }
  g->tp = tp;
  g->dp = dp;
  return 0;
}

void train_grid_free(train_grid *g) {
  if (g->tp) {
    g->dp->destroy(g->dp);
    g->tp->destroy(g->tp);
  }
  g->tp = NULL;
  g->dp = g->world;
}

train_parallel *train_parallel_new(const train_parallel_ops *ops, train_session *s, train_grid *g,
                                   const train_parallel_options *opt) {
  train_parallel *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->ops = ops;
  p->s = s;
  p->grid = g;
  p->opt = *opt;
  p->can_sample = 1;
  p->rows_mult = 1;
  return p;
}

void train_parallel_free(train_parallel *p) {
  if (p) p->ops->free(p);
}

void train_appendf(char *out, size_t n, const char *fmt, ...) {
  size_t used = strnlen(out, n);
  if (used + 1 >= n) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out + used, n - used, fmt, ap);
  va_end(ap);
}
