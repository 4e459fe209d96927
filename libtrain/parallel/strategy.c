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
  return train_grid_create_pp(g, world, T, 1, err);
}

static int grid_split(train_grid *g, train_backend *world, char *err) {
  int T = g->T, D = g->D;
  train_backend *tp = NULL, *dp = NULL, *pp = NULL;
  /* TP: the T ranks of one (p, d); DP: the D ranks of one (p, t); PP: the P of one (d, t) */
  int rc = 0;
  if (T > 1) rc = world->split(world, g->p * D + g->d, world->rank, &tp);
  if (rc == 0) rc = world->split(world, g->p * T + g->t, world->rank, &dp);
  if (rc == 0) rc = world->split(world, g->d * T + g->t, world->rank, &pp);
  if (rc != 0 || (T > 1 && !tp) || !dp || !pp) {
    train_errf(err, "%s", world->err);
    if (pp) pp->destroy(pp);
    if (dp) dp->destroy(dp);
    if (tp) tp->destroy(tp);
    return -1;
  }
  g->tp = tp;
  g->dp = dp;
  g->pp = pp;
  return 0;
}

int train_grid_create_pp(train_grid *g, train_backend *world, int T, int P, char *err) {
  memset(g, 0, sizeof *g);
  g->world = world;
  g->T = T > 1 ? T : 1;
  g->P = P > 1 ? P : 1;
  g->D = world ? world->nranks / (g->T * g->P) : 1;
  g->dp = world;
  if (g->P > 1) {
    if (!world || world->nranks % (g->T * g->P) != 0) {
      train_errf(err, "%d ranks cannot form a grid of --tp %d x --pp %d x D",
                 world ? world->nranks : 1, g->T, g->P);
      return -1;
    }
    if (!world->split || !world->exchange) {
      train_errf(err,
                 "--pp: the %s backend cannot split the job into pipeline groups or send "
                 "between stages; use --backend coll",
                 world->name);
      return -1;
    }
    g->t = world->rank % g->T;
    g->d = world->rank / g->T % g->D;
    g->p = world->rank / (g->T * g->D);
    if (grid_split(g, world, err) != 0) {
      g->dp = world;
      return -1;
    }
    return 0;
  }
  if (g->T == 1) {
    g->d = world ? world->rank : 0;
    return 0;
  }
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
  g->t = train_tp_rank_of(world->rank, g->T);
  g->d = train_dp_rank_of(world->rank, g->T);
  return 0;
}

int train_grid_add_ep(train_grid *g, int X, char *err) {
  X = X > 1 ? X : 1;
  int D = g->dp ? g->dp->nranks : 1, d = g->dp ? g->dp->rank : 0;
  g->X = X;
  g->e = d % X;
  if (D % X != 0) {
    train_errf(err,
               "--ep %d: the %d data-parallel ranks cannot form expert-parallel groups of %d "
               "(--ranks must be a multiple of --ep)",
               X, D, X);
    return -1;
  }
  if (D == 1) return 0;
  if (!g->dp->split) {
    train_errf(err,
               "--experts: the %s backend cannot split the job into expert-parallel groups; "
               "use --backend coll",
               g->dp->name);
    return -1;
  }
  /* EP: colour d / X (consecutive ranks); expert-DP: colour d % X; each ranked by d. A
   * group of one rank is not kept (its collectives would be copies). */
  train_backend *ep = NULL, *edp = NULL;
  if (g->dp->split(g->dp, d / X, d, &ep) != 0 || g->dp->split(g->dp, d % X, d, &edp) != 0 || !ep ||
      !edp) {
    train_errf(err, "%s", g->dp->err);
    if (edp) edp->destroy(edp);
    if (ep) ep->destroy(ep);
    return -1;
  }
  if (X == 1) {
    ep->destroy(ep);
    ep = NULL;
  }
  if (X == D) {
    edp->destroy(edp);
    edp = NULL;
  }
  g->ep = ep;
  g->edp = edp;
  return 0;
}

int train_grid_create_cp(train_grid *g, train_backend *world, int T, int Cp, char *err) {
  memset(g, 0, sizeof *g);
  g->world = world;
  g->T = T > 1 ? T : 1;
  g->P = 1;
  g->Cp = Cp > 1 ? Cp : 1;
  g->dp = world;
  if (g->Cp == 1) return train_grid_create_pp(g, world, T, 1, err);
  int W = g->T * g->Cp;
  if (!world || world->nranks % W != 0) {
    train_errf(err, "%d ranks cannot form a grid of --tp %d x --cp %d x D",
               world ? world->nranks : 1, g->T, g->Cp);
    return -1;
  }
  if (!world->split) {
    train_errf(err,
               "--cp: the %s backend cannot split the job into context-parallel groups; use "
               "--backend coll",
               world->name);
    return -1;
  }
  g->D = world->nranks / W;
  g->t = world->rank % g->T;
  g->c = world->rank / g->T % g->Cp;
  g->d = world->rank / W;
  /* CP ring: the Cp ranks of one (d, t); TP: the T of one (d, c); the gradient sync group:
   * the D*Cp of one t (the world when T = 1), each ranked by its place in the job */
  train_backend *cp = NULL, *tp = NULL, *dp = world;
  int rc = world->split(world, g->d * g->T + g->t, world->rank, &cp);
  if (rc == 0 && g->T > 1) rc = world->split(world, g->d * g->Cp + g->c, world->rank, &tp);
  if (rc == 0 && g->T > 1) rc = world->split(world, g->t, world->rank, &dp);
  if (rc != 0 || !cp || (g->T > 1 && (!tp || !dp))) {
    train_errf(err, "%s", world->err);
    if (dp && dp != world) dp->destroy(dp);
    if (tp) tp->destroy(tp);
    if (cp) cp->destroy(cp);
    return -1;
  }
  g->cp = cp;
  g->tp = tp;
  g->dp = dp;
  return 0;
}

void train_grid_free(train_grid *g) {
  if (g->edp) g->edp->destroy(g->edp);
  if (g->ep) g->ep->destroy(g->ep);
  g->ep = g->edp = NULL;
  if (g->pp) g->pp->destroy(g->pp);
  if (g->dp && g->dp != g->world) g->dp->destroy(g->dp);
  if (g->tp) g->tp->destroy(g->tp);
  if (g->cp) g->cp->destroy(g->cp);
  g->tp = g->pp = g->cp = NULL;
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
