/*
 * ep.c — expert parallelism (ep.h): the layer operations that carry a mixture-of-experts
 * block's rows over the expert-parallel group (counts all-to-all, dispatch and combine
 * all-to-allv, the router's statistics all-reduced over the data-parallel group), and the
 * strategy that steps such a model: one batch slice per DP rank, forward, backward, then
 * the gradients — dense ones averaged over the D ranks, the experts' summed over the
 * ranks holding the same experts and divided by D — clipping by the norm of the whole
 * model, AdamW.
 *
 * The collectives are blocking (start + wait): the next layer needs their result. Nothing
 * here prints or exits; a failure inside a pass is kept (the passes cannot return errors)
 * and every later collective is skipped, so forward/backward run to their end on garbage
 * and the loop learns of it from the strategy's status. The MoE arithmetic itself is
 * model/moe.c's: this file moves its rows and never looks inside them.
 */
#include "parallel/ep.h"
#include "model/model.h"
#include "model/moe.h"
#include "parallel/timeline.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct ep_ctx {
  train_backend *dp, *ep, *edp; /* D ranks; X of one EP group; D/X holding these experts */
  int D, X;
  int failed;
  char err[TRAIN_ERRLEN];
  train_layer_ops ops; /* the local ones, with the MoE and the norm replaced */
  train_moe_comm comm;
  double ms, bytes; /* blocked in the all-to-alls; bytes sent to other ranks */
  long calls;
  int trace_on;
  train_trace trace;
  size_t *v; /* 4*X: all_to_allv's sizes and offsets in bytes */
  int *inputs, *targets;
  /* --parallel fsdp --zero 1: AdamW's state sharded. A run is a maximal range of tensors
   * of one kind (dense, expert) in the flat array; its group (dense: the D ranks,
   * experts: the expert-DP ranks) cuts it into shards of rc = ceil(n/g) floats, this rank
   * holding [off + r*rc, +rc) clipped to the run, with its moments m, v. */
  int zero1, nruns;
  struct zrun {
    train_backend *b; /* NULL: a group of one */
    size_t off, n, rc, lo, hi;
    int expert, g, r;
    float *m, *v;
  } * runs;
  float *stage, *shard; /* (g*rc) and (rc) of the largest run */
} ep_ctx;

static ep_ctx *ctx_of(const train_model *m) { return m->layer_ctx; }

static void failf(ep_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void failf(ep_ctx *c, const char *fmt, ...) {
  if (c->failed) return;
  c->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
}

static int done(ep_ctx *c, train_backend *b, int rc, train_req req, const char *what) {
  if (rc == 0 && b->wait(b, req) == 0) return 0;
  failf(c, "expert parallel %s: %s", what, b->err);
  return -1;
}

/* ---- the communication of moe.c (train_moe_comm) ------------------------------------ */

static void stats_sum(train_model *m, float *x, int n) {
  ep_ctx *c = ctx_of(m);
  if (c->failed || c->D < 2) return;
  train_req req = TRAIN_REQ_DONE;
  int rc = c->dp->all_reduce(c->dp, x, (size_t)n, TRAIN_REDUCE_SUM, &req);
  done(c, c->dp, rc, req, "router statistics all-reduce");
}

static void counts(train_model *m, const int *send, int *recv, int per) {
  ep_ctx *c = ctx_of(m);
  if (!c->ep) {
    memcpy(recv, send, (size_t)per * sizeof(int));
    return;
  }
  double t0 = train_now();
  train_req req = TRAIN_REQ_DONE;
  int rc = c->failed ? -1 : c->ep->all_to_all(c->ep, send, recv, (size_t)per * sizeof(int), &req);
  if (c->failed || done(c, c->ep, rc, req, "counts all-to-all") != 0) {
    memset(recv, 0, (size_t)per * c->X * sizeof(int)); /* garbage never sizes a copy */
    return;
  }
  double t1 = train_now();
  c->ms += (t1 - t0) * 1e3;
  c->bytes += (double)per * sizeof(int) * (c->X - 1);
  c->calls++;
}

static void rows(train_model *m, const float *send, const int *scount, float *recv,
                 const int *rcount, int C, int fixed, const char *what) {
  ep_ctx *c = ctx_of(m);
  size_t row = (size_t)C * sizeof(float);
  if (!c->ep) {
    memcpy(recv, send, (size_t)scount[0] * row);
    return;
  }
  if (c->failed) return;
  int X = c->X, me = c->ep->rank;
  size_t *sb = c->v, *sd = sb + X, *rb = sd + X, *rd = rb + X, so = 0, ro = 0;
  double out = 0.0;
  for (int j = 0; j < X; j++) {
    sb[j] = (size_t)scount[j] * row;
    sd[j] = so;
    so += sb[j];
    rb[j] = (size_t)rcount[j] * row;
    rd[j] = ro;
    ro += rb[j];
    if (j != me) out += (double)sb[j];
  }
  double t0 = train_now();
  train_req req = TRAIN_REQ_DONE;
  /* capacity mode: every split is cap rows — the fixed-size all-to-all */
  int rc = fixed ? c->ep->all_to_all(c->ep, send, recv, sb[0], &req)
                 : c->ep->all_to_allv(c->ep, send, sb, sd, recv, rb, rd, &req);
  if (done(c, c->ep, rc, req, what) != 0) return;
  double t1 = train_now();
  c->ms += (t1 - t0) * 1e3;
  c->bytes += out;
  c->calls++;
  if (c->trace_on) {
    char nm[40];
    snprintf(nm, sizeof nm, "a2a %s", what);
    train_trace_add(&c->trace, c->dp->rank, TRAIN_TRACE_COMM, nm, t0, t1);
  }
}

/* ---- the layer operations ------------------------------------------------------------ */

static void moe_forward(train_model *m, int l, float *out, const float *inp, int N) {
  train_moe_forward(m, &ctx_of(m)->comm, l, out, inp, N);
}

static void moe_backward(train_model *m, int l, float *dinp, const float *dout, const float *inp,
                         int N) {
  train_moe_backward(m, &ctx_of(m)->comm, l, dinp, dout, inp, N);
}

/* The whole model's squared norm: the replicated tensors once, each EP rank's experts
 * added in rank order (every rank gets the same sum). */
static double grad_sumsq(train_model *m) {
  ep_ctx *c = ctx_of(m);
  double dense = 0.0, ex = 0.0;
  for (int i = 0; i < m->ntensors; i++) {
    const train_param *t = &m->tensors[i];
    double q = m->ops->sumsq(m->grads + t->offset, t->numel);
    if (train_moe_is_expert_tensor(t))
      ex += q;
    else
      dense += q;
  }
  if (c->ep && !c->failed) {
    double all[1024];
    train_req req = TRAIN_REQ_DONE;
    int rc = c->ep->all_gather(c->ep, &ex, all, sizeof ex, &req);
    if (done(c, c->ep, rc, req, "gradient norm all-gather") == 0) {
      ex = 0.0;
      for (int r = 0; r < c->X; r++) ex += all[r];
    }
  }
  return dense + ex;
}

static void fail(train_model *m, const char *msg) { failf(ctx_of(m), "%s", msg); }

/* ---- the strategy ---------------------------------------------------------------------- */

/* Every rank of `b` holds the same bits of the tensors of one kind (expert 1/0). */
static int check_same(ep_ctx *c, train_model *m, train_backend *b, int expert, char *err) {
  if (!b || b->nranks < 2) return 0;
  uint64_t h = TRAIN_FNV_INIT;
  for (int i = 0; i < m->ntensors; i++)
    if (train_moe_is_expert_tensor(&m->tensors[i]) == expert)
      h = train_fnv1a(h, m->params + m->tensors[i].offset, m->tensors[i].numel * sizeof(float));
  uint64_t *all = calloc((size_t)b->nranks, sizeof *all);
  train_req req = TRAIN_REQ_DONE;
  if (!all) {
    train_errf(err, "out of memory checking the weights");
    return -1;
  }
  if (b->all_gather(b, &h, all, sizeof h, &req) != 0 || b->wait(b, req) != 0) {
    train_errf(err, "%s", b->err);
    free(all);
    return -1;
  }
  int rc = 0;
  for (int r = 1; r < b->nranks && rc == 0; r++)
    if (all[r] != all[0]) {
      train_errf(err,
                 "ranks hold different %s weights: %s ranks 0 and %d differ (hash %016llx vs "
                 "%016llx)",
                 expert ? "expert" : "dense", expert ? "expert-data-parallel" : "data-parallel", r,
                 (unsigned long long)all[0], (unsigned long long)all[r]);
      rc = -1;
    }
  (void)c;
  free(all);
  return rc;
}

/* The run of consecutive tensors of one kind (expert or dense) from tensor i: its kind,
 * its range [off, end) of the flat arrays; returns the index after it.  Both syncs (DDP's
 * all-reduces, ZeRO-1's shards) cut the model into these runs, since each kind syncs
 * over its own group. */
static int kind_run(const train_model *m, int i, int *ex, size_t *off, size_t *end) {
  *ex = train_moe_is_expert_tensor(&m->tensors[i]);
  *off = *end = m->tensors[i].offset;
  for (; i < m->ntensors && train_moe_is_expert_tensor(&m->tensors[i]) == *ex; i++)
    *end = m->tensors[i].offset + m->tensors[i].numel;
  return i;
}

/* The gradients after backward: runs of tensors of one kind, each one all-reduce — the
 * dense ones averaged over the D ranks, the experts' summed over the expert-DP group and
 * divided by D (each rank's experts saw the tokens of its whole EP group). */
static int sync_grads(ep_ctx *c, train_model *m, char *err) {
  typedef struct {
    train_backend *b;
    train_req req;
    size_t off, n;
    int expert;
  } run;
  run *runs = calloc((size_t)m->ntensors, sizeof *runs);
  if (!runs) {
    train_errf(err, "out of memory for the gradient all-reduces");
    return -1;
  }
  int nr = 0, rc = 0;
  for (int i = 0; i < m->ntensors;) {
    int ex;
    size_t off, end;
    i = kind_run(m, i, &ex, &off, &end);
    if (end == off) continue;
    run *r = &runs[nr++];
    r->off = off;
    r->n = end - off;
    r->expert = ex;
    r->req = TRAIN_REQ_DONE;
    r->b = ex ? c->edp : (c->D > 1 ? c->dp : NULL);
    if (r->b && rc == 0 &&
        r->b->all_reduce(r->b, m->grads + off, r->n, ex ? TRAIN_REDUCE_SUM : TRAIN_REDUCE_AVG,
                         &r->req) != 0) {
      train_errf(err, "%s", r->b->err);
      rc = -1;
      r->b = NULL;
    }
  }
  for (int k = 0; k < nr; k++) {
    run *r = &runs[k];
    if (r->b && r->b->wait(r->b, r->req) != 0 && rc == 0) {
      train_errf(err, "%s", r->b->err);
      rc = -1;
    }
    if (rc == 0 && r->expert && c->D > 1)
      m->ops->scale(m->grads + r->off, 1.0f / (float)c->D, r->n);
  }
  free(runs);
  return rc;
}

/* ---- ZeRO-1 (--parallel fsdp --zero 1) ------------------------------------------------ */

static int zero1_setup(ep_ctx *c, train_model *m, char *err) {
  c->runs = calloc((size_t)m->ntensors, sizeof *c->runs);
  if (!c->runs) goto oom;
  size_t big = 0, bigs = 0;
  for (int i = 0; i < m->ntensors;) {
    int ex;
    size_t off, end;
    i = kind_run(m, i, &ex, &off, &end);
    if (end == off) continue;
    struct zrun *z = &c->runs[c->nruns++];
    z->expert = ex;
    z->b = ex ? c->edp : (c->D > 1 ? c->dp : NULL);
    z->g = z->b ? z->b->nranks : 1;
    z->r = z->b ? z->b->rank : 0;
    z->off = off;
    z->n = end - off;
    z->rc = (z->n + z->g - 1) / z->g;
    z->lo = off + (size_t)z->r * z->rc;
    z->hi = z->lo + z->rc < end ? z->lo + z->rc : end;
    if (z->lo > z->hi) z->lo = z->hi;
    z->m = calloc(z->rc + 1, sizeof(float));
    z->v = calloc(z->rc + 1, sizeof(float));
    if (!z->m || !z->v) goto oom;
    big = z->g * z->rc > big ? z->g * z->rc : big;
    bigs = z->rc > bigs ? z->rc : bigs;
  }
  c->stage = calloc(big + 1, sizeof(float));
  c->shard = calloc(bigs + 1, sizeof(float));
  if (!c->stage || !c->shard) goto oom;
  return 0;
oom:
  train_errf(err, "out of memory for ZeRO-1's optimizer shards");
  return -1;
}

static void zero1_free(ep_ctx *c) {
  for (int k = 0; c->runs && k < c->nruns; k++) free(c->runs[k].m), free(c->runs[k].v);
  free(c->runs);
  free(c->stage);
  free(c->shard);
}

/* Each run's gradients reduce-scattered over its group (dense averaged, experts summed
 * and divided by D): this rank's shard lands at its place in m->grads. */
static int zero1_reduce(ep_ctx *c, train_model *m, char *err) {
  for (int k = 0; k < c->nruns; k++) {
    struct zrun *z = &c->runs[k];
    float *g = m->grads;
    if (z->b) {
      memset(c->stage, 0, z->g * z->rc * sizeof(float));
      memcpy(c->stage, g + z->off, z->n * sizeof(float));
      train_req req = TRAIN_REQ_DONE;
      if (z->b->reduce_scatter(z->b, c->stage, c->shard, z->rc,
                               z->expert ? TRAIN_REDUCE_SUM : TRAIN_REDUCE_AVG, &req) != 0 ||
          z->b->wait(z->b, req) != 0) {
        train_errf(err, "%s", z->b->err);
        return -1;
      }
      memcpy(g + z->lo, c->shard, (z->hi - z->lo) * sizeof(float));
    }
    if (z->expert && c->D > 1) m->ops->scale(g + z->lo, 1.0f / (float)c->D, z->hi - z->lo);
  }
  return 0;
}

/* sum of x over b's ranks, in rank order (every rank the same double) */
static int sum_over(train_backend *b, double *x, char *err) {
  if (!b || b->nranks < 2) return 0;
  double *all = calloc((size_t)b->nranks, sizeof *all);
  train_req req = TRAIN_REQ_DONE;
  if (!all || b->all_gather(b, x, all, sizeof *x, &req) != 0 || b->wait(b, req) != 0) {
    train_errf(err, "%s", all ? b->err : "out of memory for the gradient norm");
    free(all);
    return -1;
  }
  *x = 0.0;
  for (int r = 0; r < b->nranks; r++) *x += all[r];
  free(all);
  return 0;
}

/* The norm from the shards, the clipping, AdamW on this rank's shards, the shards of the
 * parameters all-gathered back into every rank's whole runs. */
static int zero1_update(ep_ctx *c, train_session *s, train_step_report *r, char *err) {
  train_model *m = s->model;
  const train_hparams *hp = &s->opt.hp;
  double dense = 0.0, ex = 0.0;
  for (int k = 0; k < c->nruns; k++) {
    struct zrun *z = &c->runs[k];
    double q = m->ops->sumsq(m->grads + z->lo, z->hi - z->lo);
    if (z->expert)
      ex += q;
    else
      dense += q;
  }
  if (sum_over(c->D > 1 ? c->dp : NULL, &dense, err) != 0 || sum_over(c->edp, &ex, err) != 0 ||
      sum_over(c->ep, &ex, err) != 0)
    return -1;
  r->step.grad_norm = train_clip_grads_sq(m, hp, dense + ex);
  r->step.lr = train_lr_at(hp, s->step);
  long t = s->step + 1;
  float bc1 = (float)(1.0 - pow(hp->beta1, (double)t));
  float bc2 = (float)(1.0 - pow(hp->beta2, (double)t));
  int k = 0;
  for (int i = 0; i < m->ntensors; i++) { /* each tensor's part of its run's shard */
    const train_param *p = &m->tensors[i];
    while (k < c->nruns && c->runs[k].off + c->runs[k].n <= p->offset) k++;
    if (k == c->nruns || p->numel == 0) continue;
    struct zrun *z = &c->runs[k];
    size_t a = p->offset > z->lo ? p->offset : z->lo,
           e = p->offset + p->numel < z->hi ? p->offset + p->numel : z->hi;
    if (a >= e) continue;
    m->ops->adamw(m->params + a, m->grads + a, z->m + (a - z->lo), z->v + (a - z->lo), e - a,
                  r->step.lr, hp->beta1, hp->beta2, hp->eps, p->decay ? hp->weight_decay : 0.0f,
                  bc1, bc2);
  }
  for (k = 0; k < c->nruns; k++) {
    struct zrun *z = &c->runs[k];
    if (!z->b) continue;
    memset(c->shard, 0, z->rc * sizeof(float));
    memcpy(c->shard, m->params + z->lo, (z->hi - z->lo) * sizeof(float));
    train_req req = TRAIN_REQ_DONE;
    if (z->b->all_gather(z->b, c->shard, c->stage, z->rc * sizeof(float), &req) != 0 ||
        z->b->wait(z->b, req) != 0) {
      train_errf(err, "%s", z->b->err);
      return -1;
    }
    memcpy(m->params + z->off, c->stage, z->n * sizeof(float));
  }
  return 0;
}

static int ep_status(const train_parallel *p, char *err) {
  ep_ctx *c = p->impl;
  if (!c->failed) return 0;
  train_errf(err, "%s", c->err);
  return -1;
}

static int ep_step(train_parallel *p, train_step_report *r, char *err) {
  ep_ctx *c = p->impl;
  train_session *s = p->s;
  train_model *m = s->model;
  int B = s->opt.batch, T = s->opt.seq, D = c->D, d = c->dp->rank;
  double t0 = train_now();
  c->ms = c->bytes = 0.0;
  c->calls = 0;
  train_zero_grad(m);
  train_set_loss_scale(m, 1.0f);
  /* rows [d*B, +B) of the global batch of D*B: rank-major, as one process reads it */
  train_data_next_rows(s->data, &s->pos, D * B, T, d * B, B, c->inputs, c->targets);
  float loss = train_forward(m, c->inputs, c->targets, B, T);
  double tf = train_now();
  train_backward(m);
  double tb = train_now();
  if (ep_status(p, err) != 0) return -1;
  if ((c->zero1 ? zero1_reduce(c, m, err) : sync_grads(c, m, err)) != 0) return -1;
  train_req lreq = TRAIN_REQ_DONE;
  if (D > 1 && (c->dp->all_reduce(c->dp, &loss, 1, TRAIN_REDUCE_AVG, &lreq) != 0 ||
                c->dp->wait(c->dp, lreq) != 0)) {
    train_errf(err, "%s", c->dp->err);
    return -1;
  }
  double tw = train_now();
  if (c->zero1) {
    if (zero1_update(c, s, r, err) != 0) return -1;
  } else {
    r->step.grad_norm = train_clip_grads(m, &s->opt.hp);
    if (ep_status(p, err) != 0) return -1;
    r->step.lr = train_lr_at(&s->opt.hp, s->step);
    train_adamw_step(m, &s->opt.hp, r->step.lr, s->step + 1);
  }
  double t1 = train_now();
  s->step++;
  r->step.step = s->step;
  r->step.loss = loss;
  r->step.ms = (t1 - t0) * 1e3;
  r->step.tokens_per_s = (double)D * B * T / (t1 - t0);
  r->fwd_ms = (tf - t0) * 1e3;
  r->bwd_ms = (tb - tf) * 1e3;
  r->wait_ms = (tw - tb) * 1e3;
  r->ep_ms = c->ms;
  r->ep_bytes = c->bytes;
  r->ep_calls = c->calls;
  if (c->trace_on) {
    int rk = c->dp->rank;
    train_trace_add(&c->trace, rk, TRAIN_TRACE_COMPUTE, "forward", t0, tf);
    train_trace_add(&c->trace, rk, TRAIN_TRACE_COMPUTE, "backward", tf, tb);
    train_trace_add(&c->trace, rk, TRAIN_TRACE_COMM, "gradient all-reduces", tb, tw);
    train_trace_add(&c->trace, rk, TRAIN_TRACE_COMPUTE, "optimizer", tw, t1);
  }
  return 0;
}

static int ep_save(train_parallel *p, const char *path, char *what, size_t n, char *err) {
  (void)p;
  (void)what;
  (void)n;
  train_errf(err, "%s: checkpoints of mixture-of-experts models are not built yet", path);
  return -1;
}

static int ep_finish(train_parallel *p, const char *trace_path, char *err) {
  ep_ctx *c = p->impl;
  train_model *m = p->s->model;
  if (check_same(c, m, c->dp, 0, err) != 0 || check_same(c, m, c->edp, 1, err) != 0) return -1;
  return trace_path ? train_trace_gather_write(c->dp, &c->trace, trace_path, err) : 0;
}

static void ep_describe(train_parallel *p, char *out, size_t n) {
  ep_ctx *c = p->impl;
  const train_model *m = p->s->model;
  const train_options *o = &p->s->opt;
  int El = m->experts / c->X;
  out[0] = '\0';
  train_appendf(out, n,
                "coll-train: mixture of experts on %d ranks (%s backend): %d experts, top-%d, "
                "%s; expert parallel X = %d (rank 0 holds experts 0..%d of every block), "
                "expert-data-parallel groups of %d; global batch %d x seq %d\n",
                c->D, c->dp->name, m->experts, m->topk,
                m->capacity > 0 ? "capacity-padded splits" : "dropless", c->X, El - 1, c->D / c->X,
                c->D * o->batch, o->seq);
  train_appendf(out, n,
                "coll-train: per block: router statistics all-reduced over %d ranks; %s; after "
                "backward the dense gradients averaged over %d ranks, the experts' summed over "
                "%d and divided by %d%s\n",
                c->D,
                c->X == 1 ? "every expert local: nothing dispatched"
                : m->capacity > 0
                    ? "dispatch and combine as fixed-size all-to-alls of E x capacity rows (and "
                      "their mirror in backward) over the EP group"
                    : "counts all-to-all, dispatch and combine all-to-allv (and their mirror in "
                      "backward) over the EP group",
                c->D, c->D / c->X, c->D,
                c->zero1 ? " — ZeRO-1: both reduce-scattered, AdamW on this rank's shards (dense "
                           "1/D, experts 1/(D/X)), the parameters all-gathered"
                         : "");
}

static void ep_step_line(const train_parallel *p, const train_step_report *r, char *out, size_t n) {
  (void)p;
  snprintf(out, n, " | bwd %6.1f ms | a2a %5.1f ms (%ld, %.0f B sent) | grad sync %5.1f ms",
           r->bwd_ms, r->ep_ms, r->ep_calls, r->ep_bytes, r->wait_ms);
}

static void ep_summary(const train_parallel *p, const train_step_report *later, long nlater,
                       double seconds, const train_step_report *all, long nall, char *out,
                       size_t n) {
  ep_ctx *c = p->impl;
  (void)all;
  (void)nall;
  out[0] = '\0';
  if (nlater < 1) return;
  double a2a = 0.0;
  const train_options *o = &p->s->opt;
  train_plan_row pr;
  char err[TRAIN_ERRLEN];
  if (train_ep_plan(&o->cfg, o->batch, o->seq, c->D, c->X, o->experts, o->topk, o->capacity_factor,
                    c->zero1, 0, &pr, &a2a, err) != 0)
    a2a = 0.0;
  train_appendf(out, n,
                "ep: weights identical over the data-parallel (dense) and expert-data-parallel "
                "(experts) groups | per step after the first: %.1f all-to-alls, %.0f bytes "
                "sent by this rank (planned at balanced routing %.0f), %.2f ms (%.1f%% of the "
                "step)\n",
                (double)later->ep_calls / nlater, later->ep_bytes / nlater, a2a * o->cfg.layers,
                later->ep_ms / nlater, seconds > 0 ? 100.0 * later->ep_ms * 1e-3 / seconds : 0.0);
}

static int ep_plan_row(const train_parallel *p, double fixed, train_plan_row *out, char *err) {
  ep_ctx *c = p->impl;
  const train_options *o = &p->s->opt;
  return train_ep_plan(&o->cfg, o->batch, o->seq, c->D, c->X, o->experts, o->topk,
                       o->capacity_factor, c->zero1, fixed, out, NULL, err);
}

static void ep_free(train_parallel *p) {
  ep_ctx *c = p->impl;
  if (c) {
    train_model *m = p->s->model;
    if (m->layer_ctx == c) {
      m->layer_ops = train_local_layer_ops();
      m->layer_ctx = NULL;
    }
    train_trace_free(&c->trace);
    zero1_free(c);
    free(c->v);
    free(c->inputs);
    free(c->targets);
    free(c);
  }
  free(p);
}

static const train_parallel_ops ep_strategy_ops = {
    .name = "ep",
    .step = ep_step,
    .save = ep_save,
    .finish = ep_finish,
    .describe = ep_describe,
    .step_line = ep_step_line,
    .summary = ep_summary,
    .status = ep_status,
    .plan = ep_plan_row,
    .free = ep_free,
};

train_parallel *train_ep_strategy_create(train_session *s, train_grid *g,
                                         const train_parallel_options *opt, char *err) {
  train_model *m = s->model;
  int X = g->X > 1 ? g->X : 1;
  if (!g->dp) {
    train_errf(err, "--experts over ranks needs more than one process");
    return NULL;
  }
  if (!m->experts) {
    train_errf(err, "expert parallelism needs a model with --experts");
    return NULL;
  }
  if (opt->accum > 1) {
    train_errf(err, "--accum with --experts is not built yet: the router's statistics are "
                    "those of one batch");
    return NULL;
  }
  if (m->ep != X || m->ep_rank != g->e) {
    train_errf(err, "a model made for expert-parallel rank %d of %d on rank %d of %d", m->ep_rank,
               m->ep, g->e, X);
    return NULL;
  }
  if (X > 1 && (!g->ep->all_to_all || !g->ep->all_to_allv)) {
    train_errf(err, "--ep: the %s backend has no all-to-all; use --backend coll or mpi",
               g->ep->name);
    return NULL;
  }
  if (X > 1024) {
    train_errf(err, "--ep %d: at most 1024 expert-parallel ranks", X);
    return NULL;
  }
  train_parallel *p = train_parallel_new(&ep_strategy_ops, s, g, opt);
  ep_ctx *c = calloc(1, sizeof *c);
  size_t bt = (size_t)s->opt.batch * s->opt.seq;
  if (c) {
    c->v = calloc(4 * (size_t)X, sizeof(size_t));
    c->inputs = malloc(bt * sizeof(int));
    c->targets = malloc(bt * sizeof(int));
  }
  if (!p || !c || !c->v || !c->inputs || !c->targets) {
    if (c) free(c->v), free(c->inputs), free(c->targets);
    free(c);
    free(p);
    train_errf(err, "out of memory for expert parallelism");
    return NULL;
  }
  p->impl = c;
  c->dp = g->dp;
  c->ep = g->ep;
  c->edp = g->edp;
  c->D = g->dp->nranks;
  c->X = X;
  c->trace_on = opt->trace;
  c->zero1 = strcmp(opt->data, "fsdp") == 0;
  p->zero = c->zero1;
  p->rows_mult = c->D;
  p->eval_everywhere = 1; /* the router's statistics are all-reduced in forward */
  p->can_sample = X == 1; /* a forward without targets exchanges nothing when X = 1 */
  /* one seed, the same full model drawn everywhere: check it rather than broadcast */
  if (check_same(c, m, c->dp, 0, err) != 0 || check_same(c, m, c->edp, 1, err) != 0) {
    ep_free(p);
    return NULL;
  }
  if (c->zero1 && zero1_setup(c, m, err) != 0) {
    ep_free(p);
    return NULL;
  }
  c->ops = *m->layer_ops;
  c->ops.name = "expert-parallel";
  c->ops.moe_forward = moe_forward;
  c->ops.moe_backward = moe_backward;
  c->ops.grad_sumsq = grad_sumsq;
  c->ops.fail = fail;
  c->comm.stats_sum = stats_sum;
  c->comm.counts = counts;
  c->comm.rows = rows;
  m->layer_ctx = c;
  m->layer_ops = &c->ops;
  return p;
}

/* ---- the planner's row ------------------------------------------------------------------ */

int train_ep_plan(const train_config *cfg, int B, int T, int D, int X, int experts, int topk,
                  float capacity, int zero1, double fixed, train_plan_row *r, double *a2a_layer,
                  char *err) {
  if (train_moe_check(cfg, experts, topk, X, capacity, 0.0f, TRAIN_DEVICE_CPU, 1, 1, 0, 0, err) !=
      0)
    return -1;
  if (train_shape_check(cfg, B, T, err) != 0) return -1;
  if (D < 1 || D % X != 0) {
    train_errf(err, "--ep %d: %d ranks are not a multiple of it", X, D);
    return -1;
  }
  size_t P = 0, A = 0;
  train_split split = {.experts = experts, .topk = topk, .ep = X, .capacity = capacity};
  if (train_model_sizes_split(cfg, B, T, &split, &P, &A, NULL) != 0) {
    train_errf(err, "out of memory planning");
    return -1;
  }
  double C = cfg->channels, L = cfg->layers, E = experts, K = topk, El = E / X, N = (double)B * T;
  double Pexp = L * El * (8.0 * C * C + 5.0 * C), Pdense = (double)P - Pexp;
  double cap = train_moe_capacity(B * T, experts, topk, capacity);
  /* rows this rank sends per block (and receives, at balanced routing) */
  double S = cap > 0 ? E * cap : N * K;
  double moe_acts = L * (N * E * 4 + N * K * 12 + E * 12 + S * C * 4 /* yback */ + S * C * 4 +
                         2 * S * 4 * C * 4 /* xin, h, gelu(h) */) +
                    3 * S * C * 4 + 2 * S * 4 * C * 4 + N * E * 4; /* staging */
  double f = 4.0, G = (double)D / X;
  double a2a = 4.0 * S * (X - 1) / X * C * f; /* dispatch + combine, forward and backward */
  if (cap == 0) a2a += (X - 1.0) / X * E * sizeof(int); /* the counts (dropless) */
  double stats = D > 1 ? 2.0 * (D - 1) / D * (2 * E + 2) * f : 0.0;
  memset(r, 0, sizeof *r);
  r->name = X > 1 ? (D > X ? "EPxDP" : "EP") : (D > 1 ? "MoE DDP" : "MoE");
  r->params = f * P;
  r->grads = f * P;
  r->optim = 2 * f * P;
  if (zero1) { /* AdamW's moments: the dense part over D, the experts over the D/X */
    r->name = X > 1 ? "EPxZ1" : "MoE Z1";
    r->optim = 2 * f * (ceil(Pdense / D) + ceil(Pexp / G));
  }
  r->acts = (double)A + moe_acts;
  r->fixed = fixed;
  r->sent = L * (a2a + stats) + (D > 1 ? 2.0 * (D - 1) / D * f * Pdense : 0.0) +
            (G > 1 ? 2.0 * (G - 1) / G * f * Pexp : 0.0);
  r->total = r->params + r->grads + r->optim + r->acts + r->fixed;
  if (a2a_layer) *a2a_layer = a2a;
  return 0;
}
