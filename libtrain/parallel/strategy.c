/*
 * strategy.c — the table of strategies and the grid their groups come from (strategy.h).
 *
 * The table names each data-parallel strategy once; tensor parallelism is the one
 * dimension that composes with them (it wraps the row the table picked), so it is applied
 * here, after the row, when the grid has T > 1. Nothing here knows what a strategy does.
 */
#include "parallel/strategy.h"
#include "parallel/tp.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const struct {
  const char *name;
  train_parallel_create_fn create;
} rows[] = {
    {"none", train_none_create},
    {"ddp", train_ddp_strategy_create},
    {"fsdp", train_fsdp_strategy_create},
};

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

train_parallel *train_parallel_create(train_session *s, train_grid *g,
                                      const train_parallel_options *opt, char *err) {
  train_parallel_create_fn create = NULL;
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    if (strcmp(rows[i].name, opt->data) == 0) create = rows[i].create;
  if (!create) {
    train_errf(err, "--parallel: '%s' is not none, ddp or fsdp", opt->data);
    return NULL;
  }
  return g->T > 1 ? train_tp_strategy_create(s, g, opt, create, err) : create(s, g, opt, err);
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
