/*
 * pipeline.c — pipeline parallelism (pipeline.h): the strategy that runs one optimizer
 * step as the schedule's action lists (schedule.h) say, on this stage's model pieces.
 *
 * The interpreter walks the stage's list in order: F and B (and ZB's W) call the model's
 * piece passes on the activation set of that (micro-batch, chunk); the transfers of one
 * group (consecutive, same group number, one peer) become one train_backend.exchange (one
 * libcoll group), met by its mirror on the peer as the checker proved. It never reorders
 * the list: a schedule that the checker passed is what runs, and a schedule's memory is
 * what the walk below counts.
 *
 * Activation sets. A (micro-batch, chunk) takes a set when its activation is received
 * (or, on the first piece, at its forward) and gives it back once its backward is done
 * and its input gradient sent (ZB: and its W done) — walk_sets counts the most held at
 * once for a list, which is the number the model is created with; the executor takes
 * sets from a free list by the same rules and fails with a sentence rather than
 * overwrite a set in use.
 *
 * It must never print, never reorder a list, and never wait for a peer without a bound: a
 * failed transfer or collective returns its sentence at once, the application aborts the
 * job, and libcoll tells every rank waiting on this one within about a second (its
 * timeout bounds the rest).
 */
#include "parallel/pipeline.h"

#include "model/model.h"
#include "parallel/checkpoint.h"
#include "parallel/timeline.h"
#include "parallel/tp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- activation sets, by the same rules for counting and for running ------------- */

typedef struct sets {
  int M, V, first_piece_chunk; /* chunk that is the model's first piece here, or -1 */
  int zb;
  int *slot;   /* [micro*V + chunk]: the set held, -1 none */
  char *bdone; /* backward done */
  char *sent;  /* input gradient sent (or nothing to send) */
  char *wdone; /* ZB: weight gradient done (1 when not ZB) */
  int *freel;  /* free sets */
  int nfree, cap, held, most;
} sets;

static int sets_init(sets *st, int M, int V, int stage, int zb, int cap) {
  memset(st, 0, sizeof *st);
  st->M = M;
  st->V = V;
  st->zb = zb;
  st->first_piece_chunk = stage == 0 ? 0 : -1;
  st->cap = cap;
  size_t n = (size_t)M * V;
  st->slot = malloc(n * sizeof *st->slot);
  st->bdone = calloc(n, 1);
  st->sent = calloc(n, 1);
  st->wdone = calloc(n, 1);
  st->freel = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *st->freel);
  if (!st->slot || !st->bdone || !st->sent || !st->wdone || !st->freel) return -1;
  for (size_t i = 0; i < n; i++) st->slot[i] = -1;
  for (int k = 0; k < cap; k++) st->freel[k] = cap - 1 - k;
  st->nfree = cap;
  return 0;
}

static void sets_reset(sets *st) {
  size_t n = (size_t)st->M * st->V;
  for (size_t i = 0; i < n; i++) st->slot[i] = -1;
  memset(st->bdone, 0, n);
  memset(st->sent, 0, n);
  memset(st->wdone, 0, n);
  for (int k = 0; k < st->cap; k++) st->freel[k] = st->cap - 1 - k;
  st->nfree = st->cap;
  st->held = 0;
}

static void sets_free(sets *st) {
  free(st->slot);
  free(st->bdone);
  free(st->sent);
  free(st->wdone);
  free(st->freel);
}

/* The set of (micro, chunk), taking one if it holds none; -1 when none is free. */
static int sets_take(sets *st, int micro, int chunk) {
  int key = micro * st->V + chunk;
  if (st->slot[key] >= 0) return st->slot[key];
  if (st->nfree == 0) return -1;
  st->slot[key] = st->freel[--st->nfree];
  st->held++;
  st->most = st->held > st->most ? st->held : st->most;
  st->sent[key] = chunk == st->first_piece_chunk; /* the first piece sends nothing back */
  st->wdone[key] = !st->zb;
  return st->slot[key];
}

static void sets_maybe_release(sets *st, int micro, int chunk) {
  int key = micro * st->V + chunk;
  if (st->slot[key] < 0 || !st->bdone[key] || !st->sent[key] || !st->wdone[key]) return;
  st->freel[st->nfree++] = st->slot[key];
  st->slot[key] = -1;
  st->held--;
}

static int is_xfer(train_pp_op op) { return op >= TRAIN_PP_SEND_ACT; }

/* The most sets stage s holds walking its list (no model, no peers). */
static int walk_sets(const train_pp_schedule *sc, int s) {
  sets st;
  int cap = sc->M * sc->V, most = -1;
  if (sets_init(&st, sc->M, sc->V, s, sc->kind == TRAIN_PP_ZB, cap) != 0) goto out;
  for (int i = 0; i < sc->n[s]; i++) {
    const train_pp_action *a = &sc->acts[s][i];
    int key = a->micro * sc->V + a->chunk;
    switch (a->op) {
    case TRAIN_PP_F:
    case TRAIN_PP_RECV_ACT: sets_take(&st, a->micro, a->chunk); break;
    case TRAIN_PP_B: st.bdone[key] = 1; break;
    case TRAIN_PP_W: st.wdone[key] = 1; break;
    case TRAIN_PP_SEND_GRAD: st.sent[key] = 1; break;
    default: break;
    }
    /* a group's sends complete with the group: release after its last transfer */
    int group_end = !is_xfer(a->op) || i + 1 == sc->n[s] || !is_xfer(sc->acts[s][i + 1].op) ||
                    sc->acts[s][i + 1].group != a->group;
    if (!group_end) continue;
    for (int j = i; j >= 0; j--) {
      sets_maybe_release(&st, sc->acts[s][j].micro, sc->acts[s][j].chunk);
      if (!is_xfer(sc->acts[s][j].op) || (j > 0 && sc->acts[s][j - 1].group != a->group)) break;
    }
  }
  most = st.most;
out:
  sets_free(&st);
  return most;
}

int train_pp_config_check(const train_config *cfg, int P, int V, train_device dev, char *err) {
  return train_pp_split_check(cfg, P, V, dev, err);
}

int train_pp_slots(train_pp_kind kind, int P, int M, int V, int stage, char *err) {
  train_pp_schedule sc;
  if (train_pp_build(kind, P, M, V, &sc, err) != 0) return -1;
  int n = walk_sets(&sc, stage);
  train_pp_free(&sc);
  if (n < 1) train_errf(err, "out of memory counting the pipeline's activation sets");
  return n < 1 ? -1 : n;
}

int train_pp_plan(const train_config *cfg, int B, int S, int tp, int sp, int P, int stage,
                  train_pp_kind kind, int M, int V, int D, int zero1, int recompute, int bf16,
                  double fixed, train_plan_row *out, char *err) {
  train_pp_schedule sc;
  if (train_pp_split_check(cfg, P, V, TRAIN_DEVICE_CPU, err) != 0) return -1;
  if (train_pp_build(kind, P, M, V, &sc, err) != 0) return -1;
  int slots = walk_sets(&sc, stage);
  long sends = 0;
  for (int i = 0; i < sc.n[stage]; i++)
    sends += sc.acts[stage][i].op == TRAIN_PP_SEND_ACT ||
             sc.acts[stage][i].op == TRAIN_PP_SEND_GRAD;
  train_pp_free(&sc);
  tp = tp > 1 ? tp : 1;
  train_split split = {.tp = tp,
                       .sp = sp,
                       .pp = P,
                       .pp_rank = stage,
                       .chunks = V,
                       .slots = slots,
                       .split_w = kind == TRAIN_PP_ZB,
                       .recompute = recompute,
                       .bf16 = bf16};
  size_t np = 0, ab = 0;
  if (slots < 1 || train_model_sizes_split(cfg, B, S, &split, &np, &ab, NULL) != 0) {
    train_errf(err, "the planner could not lay out pipeline stage %d", stage);
    return -1;
  }
  /* f: bytes of what travels and what the passes hold (bf16: 2), the rest fp32 */
  double f = bf16 ? 2.0 : 4.0, C = cfg->channels, rows = (double)B * S / (sp && tp > 1 ? tp : 1);
  memset(out, 0, sizeof *out);
  out->name = "PP";
  snprintf(out->label, sizeof out->label, "%s s%d", zero1 && D > 1 ? "PPxZ1" : "PP", stage);
  out->params = f * np;
  out->grads = f * np;
  out->optim = bf16 ? 12.0 * np : 2 * f * np; /* bf16: fp32 master weights and moments */
  if (zero1 && D > 1) { /* AdamW's moments of the shard (and the tail, < D floats) */
    double sh = (double)(np / (size_t)D), tail = (double)(np - (np / (size_t)D) * (size_t)D);
    out->name = "PPxZ1";
    /* bf16 keeps the fp32 master whole (a checkpoint gathers the other shards' into it) */
    out->optim = (bf16 ? 4.0 * np : 0.0) + 8.0 * (sh + tail);
    out->grads += f * sh; /* the reduced shard */
  }
  out->acts = (double)ab;
  out->fixed = fixed;
  out->total = out->params + out->grads + out->optim + out->acts + out->fixed;
  out->sent = sends * rows * C * f;
  if (P > 1 && (stage == 0 || stage == P - 1)) /* wte's all-reduce over the pair: ring, n = 2 */
    out->sent += f * ((double)(cfg->vocab + tp - 1) / tp) * C;
  if (D > 1) out->sent += 2.0 * (D - 1) / D * f * np;
  if (tp > 1) { /* 4 in-block all-reduces (or SP's gather + scatter) per block per micro-batch */
    int first = 0, len = 0;
    double blocks = 0;
    for (int c = 0; c < V; c++)
      if (train_pp_piece(cfg->layers, P * V, c * P + stage, &first, &len) == 0) blocks += len;
    out->sent += M * blocks * 4 * 2.0 * (tp - 1) / tp * (double)B * S * C * f;
  }
  return 0;
}

/* ---- the strategy ------------------------------------------------------------------ */

typedef struct train_pp {
  train_session *s;
  train_model *m;
  train_grid *g;
  train_pp_schedule sc;
  int stage, P, M, V, B, T, D;
  train_backend *pp, *emb, *dp; /* emb: stages 0 and P-1 (NULL when P = 1 or off them) */
  int tp_attached;
  sets st;
  int *inputs, *targets; /* host: the step's M micro-batches of (B,T) */
  size_t act_bytes;      /* one transfer: (Nr,C) floats */
  train_trace trace;
  int tracing; /* --trace: record every action */
  /* --parallel fsdp --zero 1 along D: this rank's shard [d*shard, +shard) of the flat
   * arrays' first D*shard floats (the last np - D*shard < D floats, the tail, stay
   * replicated); the reduced gradient shard and AdamW's moments of shard + tail */
  int zero1;
  size_t shard, tail;
  float *gshard, *am, *av;
  uint16_t *gshard16; /* bf16: the reduced gradient shard (gshard unused) */
  double xfer_ms, sync_ms, xfer_bytes;
} train_pp;

static train_pp *pp_of(const train_parallel *p) { return p->impl; }

/* The squared norm of this stage's gradients with the tied embedding counted once over the
 * pipeline (the first stage's copy), summed over the tensor-parallel group as the layer
 * operations count it. Not yet summed over stages. */
static double stage_sumsq(train_pp *q) {
  train_model *m = q->m;
  double sq = m->layer_ops->grad_sumsq(m);
  if (q->P > 1 && q->stage == q->P - 1) {
    /* the head's wte is the first stage's: take it out (summed over TP as it was put in) */
    const train_param *w = &m->tensors[0];
    float wsq = (float)(m->bf16 ? m->ops->sumsq_bf16(m->grads16 + w->offset, w->numel)
                                : m->ops->sumsq(m->grads + w->offset, w->numel));
    if (q->g->tp) {
      train_req r;
      if (q->g->tp->all_reduce(q->g->tp, &wsq, 1, TRAIN_REDUCE_SUM, &r) == 0)
        q->g->tp->wait(q->g->tp, r);
    }
    sq -= wsq;
  }
  return sq;
}

static int ar(train_backend *b, float *x, size_t n, train_reduce op, char *err) {
  train_req r;
  if (b->all_reduce(b, x, n, op, &r) != 0 || b->wait(b, r) != 0) {
    train_errf(err, "%s", b->err);
    return -1;
  }
  return 0;
}

/* The model's gradients [off, off+n) all-reduced in their own type (bf16 on the wire
 * under --dtype bf16). */
static int ar_grads(train_backend *b, train_model *m, size_t off, size_t n, train_reduce op,
                    char *err) {
  if (!m->bf16) return ar(b, m->grads + off, n, op, err);
  train_req r;
  if (b->all_reduce_bf16(b, m->grads16 + off, n, op, &r) != 0 || b->wait(b, r) != 0) {
    train_errf(err, "%s", b->err);
    return -1;
  }
  return 0;
}

/* Points a transfer's buffer at its activation set (taking one for a receive). */
static int xfer_buffer(train_pp *q, const train_pp_action *a, train_p2p *x, char *err) {
  int k = a->op == TRAIN_PP_RECV_ACT ? sets_take(&q->st, a->micro, a->chunk)
                                     : q->st.slot[a->micro * q->V + a->chunk];
  if (k < 0) {
    train_errf(err,
               "pipeline stage %d: no activation set for micro-batch %d chunk %d (%d sets; "
               "the schedule's count is wrong)",
               q->stage, a->micro, a->chunk, q->st.cap);
    return -1;
  }
  train_model_use_slot(q->m, k);
  x->send = a->op == TRAIN_PP_SEND_ACT || a->op == TRAIN_PP_SEND_GRAD;
  x->peer = a->peer;
  x->bytes = q->act_bytes;
  x->buf = a->op == TRAIN_PP_SEND_ACT   ? (void *)train_piece_output(q->m, a->chunk)
           : a->op == TRAIN_PP_RECV_ACT ? (void *)train_piece_input(q->m)
                                        : (void *)train_piece_grad_io(q->m);
  return 0;
}

/* Squared norm of this rank's part of the reduced gradients (ZeRO-1): the shard, the tail
 * counted on data-parallel rank 0 only; sq[0] over tensors a tensor-parallel group splits,
 * sq[1] over replicated ones; the last stage's wte left out (the first stage's counts). */
static void zero1_sumsq(const train_pp *q, double sq[2]) {
  const train_model *m = q->m;
  size_t lo = (size_t)q->g->d * q->shard, n0 = (size_t)q->D * q->shard;
  int skip_wte = q->P > 1 && q->stage == q->P - 1;
  sq[0] = sq[1] = 0.0;
  for (int i = 0; i < m->ntensors; i++) {
    const train_param *p = &m->tensors[i];
    if (i == 0 && skip_wte) continue;
    int k = q->g->tp && train_param_is_split(p->name) ? 0 : 1;
    size_t a = p->offset > lo ? p->offset : lo, e = p->offset + p->numel;
    size_t e1 = e < lo + q->shard ? e : lo + q->shard;
    if (a < e1)
      sq[k] += m->bf16 ? m->ops->sumsq_bf16(q->gshard16 + (a - lo), e1 - a)
                       : m->ops->sumsq(q->gshard + (a - lo), e1 - a);
    size_t t = p->offset > n0 ? p->offset : n0; /* the tail */
    if (q->g->d == 0 && t < e)
      sq[k] += m->bf16 ? m->ops->sumsq_bf16(m->grads16 + t, e - t)
                       : m->ops->sumsq(m->grads + t, e - t);
  }
}

/* AdamW over [lo, lo+n) of the flat arrays, gradients at g (g[0] is element lo), moments
 * at am/av, one tensor piece at a time (decay is per tensor). */
static void adamw_range(train_model *m, const train_hparams *hp, float lr, long t, size_t lo,
                        size_t n, const void *g, float *am, float *av) {
  float bc1 = (float)(1.0 - pow(hp->beta1, (double)t));
  float bc2 = (float)(1.0 - pow(hp->beta2, (double)t));
  for (int i = 0; i < m->ntensors; i++) {
    const train_param *p = &m->tensors[i];
    size_t a = p->offset > lo ? p->offset : lo;
    size_t e = p->offset + p->numel < lo + n ? p->offset + p->numel : lo + n;
    if (a >= e) continue;
    float wd = p->decay ? hp->weight_decay : 0.0f;
    if (m->bf16) /* the master from bf16 gradients, and its bf16 copy */
      m->ops->adamw_bf16(m->params + a, m->params16 + a, (const uint16_t *)g + (a - lo),
                         am + (a - lo), av + (a - lo), e - a, lr, hp->beta1, hp->beta2, hp->eps, wd,
                         bc1, bc2);
    else
      m->ops->adamw(m->params + a, (const float *)g + (a - lo), am + (a - lo), av + (a - lo), e - a,
                    lr, hp->beta1, hp->beta2, hp->eps, wd, bc1, bc2);
  }
}

/* ZeRO-1 along D after the last micro-batch: reduce-scatter the gradients (average),
 * the norm over the shards, the stages and the TP group, clip, AdamW on the shard (and
 * the tail), all-gather the parameters. *sq gets the squared norm. */
static int zero1_update(train_pp *q, float lr, long t, float *norm, char *err) {
  train_model *m = q->m;
  train_backend *dp = q->dp;
  size_t n0 = (size_t)q->D * q->shard, lo = (size_t)q->g->d * q->shard;
  train_req r;
  int rc = m->bf16 ? dp->reduce_scatter_bf16(dp, m->grads16, q->gshard16, q->shard,
                                             TRAIN_REDUCE_AVG, &r)
                   : dp->reduce_scatter(dp, m->grads, q->gshard, q->shard, TRAIN_REDUCE_AVG, &r);
  if (rc != 0 || dp->wait(dp, r) != 0) {
    train_errf(err, "pipeline stage %d: reduce-scatter of the gradients: %s", q->stage, dp->err);
    return -1;
  }
  if (q->tail && ar_grads(dp, m, n0, q->tail, TRAIN_REDUCE_AVG, err) != 0) return -1;
  double part[2];
  zero1_sumsq(q, part);
  float sq2[2] = {(float)part[0], (float)part[1]};
  if (ar(dp, sq2, 2, TRAIN_REDUCE_SUM, err) != 0) return -1;
  if (q->g->tp && ar(q->g->tp, &sq2[0], 1, TRAIN_REDUCE_SUM, err) != 0) return -1;
  float sq = sq2[0] + sq2[1];
  if (ar(q->pp, &sq, 1, TRAIN_REDUCE_SUM, err) != 0) return -1;
  *norm = sqrtf(sq);
  const train_hparams *hp = &q->s->opt.hp;
  if (hp->grad_clip > 0.0f) { /* as train_clip_grads */
    float coef = hp->grad_clip / (*norm + 1e-6f);
    if (coef < 1.0f && m->bf16) {
      m->ops->scale_bf16(q->gshard16, coef, q->shard);
      m->ops->scale_bf16(m->grads16 + n0, coef, q->tail);
    } else if (coef < 1.0f) {
      m->ops->scale(q->gshard, coef, q->shard);
      m->ops->scale(m->grads + n0, coef, q->tail);
    }
  }
  const void *gs = m->bf16 ? (const void *)q->gshard16 : (const void *)q->gshard;
  const void *gt = m->bf16 ? (const void *)(m->grads16 + n0) : (const void *)(m->grads + n0);
  adamw_range(m, hp, lr, t, lo, q->shard, gs, q->am, q->av);
  adamw_range(m, hp, lr, t, n0, q->tail, gt, q->am + q->shard, q->av + q->shard);
  /* the weights the passes read, gathered: bf16 under --dtype bf16 (the fp32 master of
   * the other shards then stays behind: pp_save gathers it before a checkpoint) */
  rc = m->bf16 ? dp->all_gather(dp, m->params16 + lo, m->params16, q->shard * sizeof(uint16_t), &r)
               : dp->all_gather(dp, m->params + lo, m->params, q->shard * sizeof(float), &r);
  if (rc != 0 || dp->wait(dp, r) != 0) {
    train_errf(err, "pipeline stage %d: all-gather of the parameters: %s", q->stage, dp->err);
    return -1;
  }
  return 0;
}

/* bf16 ZeRO-1: the fp32 master of every shard, gathered (a checkpoint holds all of it). */
static int zero1_gather_master(train_pp *q, char *err) {
  train_model *m = q->m;
  train_req r;
  size_t lo = (size_t)q->g->d * q->shard;
  if (q->dp->all_gather(q->dp, m->params + lo, m->params, q->shard * sizeof(float), &r) != 0 ||
      q->dp->wait(q->dp, r) != 0) {
    train_errf(err, "pipeline stage %d: all-gather of the master weights: %s", q->stage,
               q->dp->err);
    return -1;
  }
  return 0;
}

/* The tied embedding's two copies, made the same bits again after the update: with D > 1
 * each end stage averages wte's gradient over its own data-parallel group, whose reduction
 * order follows the stage's own array length, so the copies may differ in the last bit;
 * the first stage's is sent to the last (and, bf16, rounded the same way there). */
static int sync_tied(train_pp *q, char *err) {
  train_model *m = q->m;
  const train_param *w = &m->tensors[0];
  train_req r;
  if (!q->emb || q->D < 2) return 0;
  /* bf16 under ZeRO-1: the master of the other shards is behind (only the gathered bf16
   * weights are whole), so the weights the passes read are what is sent */
  int w16 = m->bf16 && q->zero1;
  void *buf = w16 ? (void *)(m->params16 + w->offset) : (void *)(m->params + w->offset);
  size_t bytes = w->numel * (w16 ? sizeof(uint16_t) : sizeof(float));
  if (q->emb->broadcast(q->emb, buf, bytes, 0, &r) != 0 || q->emb->wait(q->emb, r) != 0) {
    train_errf(err, "pipeline stage %d: broadcast of the tied embedding: %s", q->stage,
               q->emb->err);
    return -1;
  }
  if (m->bf16 && !w16) m->ops->to_bf16(m->params16 + w->offset, m->params + w->offset, w->numel);
  return 0;
}

static const char *op_names[] = {"F", "B", "W", "send act", "recv act", "send grad", "recv grad"};

/* Runs the stage's list once. Returns 0 or -1 with err; *loss gets the sum of the last
 * piece's micro-batch losses (0 elsewhere). */
static int run_list(train_pp *q, double *loss, train_step_report *r, char *err) {
  train_model *m = q->m;
  int rank = q->g->world ? q->g->world->rank : 0;
  size_t bt = (size_t)q->B * q->T;
  *loss = 0.0;
  sets_reset(&q->st);
  const train_pp_action *list = q->sc.acts[q->stage];
  int n = q->sc.n[q->stage];
  for (int i = 0; i < n;) {
    const train_pp_action *a = &list[i];
    double t0 = train_now();
    if (is_xfer(a->op)) {
      train_p2p x[16];
      int j = i, nx = 0;
      char nm[40];
      for (; j < n && is_xfer(list[j].op) && list[j].group == a->group; j++) {
        if (nx == 16) {
          train_errf(err, "pipeline stage %d: more than 16 transfers in one group", q->stage);
          return -1;
        }
        if (xfer_buffer(q, &list[j], &x[nx++], err) != 0) return -1;
      }
      if (q->pp->exchange(q->pp, x, nx) != 0) {
        train_errf(err, "pipeline stage %d: %s", q->stage, q->pp->err);
        return -1;
      }
      for (int k = i; k < j; k++) {
        if (list[k].op == TRAIN_PP_SEND_GRAD) q->st.sent[list[k].micro * q->V + list[k].chunk] = 1;
        if (list[k].op == TRAIN_PP_SEND_ACT || list[k].op == TRAIN_PP_SEND_GRAD)
          q->xfer_bytes += (double)q->act_bytes;
      }
      for (int k = i; k < j; k++) sets_maybe_release(&q->st, list[k].micro, list[k].chunk);
      double t1 = train_now();
      q->xfer_ms += (t1 - t0) * 1e3;
      if (q->tracing) {
        snprintf(nm, sizeof nm, "%s %d%s", op_names[a->op], a->micro, j - i > 1 ? " +" : "");
        train_trace_add(&q->trace, rank, TRAIN_TRACE_COMM, nm, t0, t1);
      }
      i = j;
      continue;
    }
    int key = a->micro * q->V + a->chunk;
    int k = a->op == TRAIN_PP_F ? sets_take(&q->st, a->micro, a->chunk) : q->st.slot[key];
    if (k < 0) {
      train_errf(err, "pipeline stage %d: no activation set for %s of micro-batch %d chunk %d",
                 q->stage, op_names[a->op], a->micro, a->chunk);
      return -1;
    }
    train_model_use_slot(m, k);
    if (a->op == TRAIN_PP_F) {
      const int *in = q->inputs + (size_t)a->micro * bt, *tg = q->targets + (size_t)a->micro * bt;
      *loss += train_piece_forward(m, a->chunk, in, tg, q->B, q->T);
      if (r) r->fwd_ms += (train_now() - t0) * 1e3;
    } else if (a->op == TRAIN_PP_B) {
      train_piece_backward(m, a->chunk);
      q->st.bdone[key] = 1;
      if (r) r->bwd_ms += (train_now() - t0) * 1e3;
    } else { /* W: the weight gradients B left (ZB) */
      train_piece_weights(m, a->chunk);
      q->st.wdone[key] = 1;
      if (r) r->bwd_ms += (train_now() - t0) * 1e3;
    }
    sets_maybe_release(&q->st, a->micro, a->chunk);
    if (q->tracing) {
      char nm[40];
      snprintf(nm, sizeof nm, "%s%d%s", op_names[a->op], a->micro,
               q->V > 1 ? (a->chunk ? "'" : "") : "");
      train_trace_add(&q->trace, rank, TRAIN_TRACE_COMPUTE, nm, t0, train_now());
    }
    i++;
  }
  return 0;
}

static int pp_step(train_parallel *p, train_step_report *r, char *err) {
  train_pp *q = pp_of(p);
  train_session *s = q->s;
  train_model *m = q->m;
  int M = q->M, D = q->D, B = q->B, T = q->T, d = q->g->d;
  size_t bt = (size_t)B * T;
  int rank = q->g->world ? q->g->world->rank : 0;
  double t0 = train_now();
  memset(r, 0, sizeof *r);
  q->xfer_ms = q->sync_ms = q->xfer_bytes = 0;

  /* the step's rows: micro-batch k of data rank d is rows (k*D + d)*B of M*D*B */
  train_loader_state pos = s->pos;
  for (int k = 0; k < M; k++) {
    train_loader_state pk = pos;
    train_data_next_rows(s->data, &pk, M * D * B, T, (k * D + d) * B, B, q->inputs + k * bt,
                         q->targets + k * bt);
    if (k == M - 1) s->pos = pk;
  }

  train_zero_grad(m);
  train_set_loss_scale(m, 1.0f / (float)M);
  double loss = 0.0;
  int rc = run_list(q, &loss, r, err);
  train_set_loss_scale(m, 1.0f);
  if (rc != 0) return -1;
  if (q->tp_attached && train_tp_status(s, err) != 0) return -1;

  double ts = train_now();
  /* the tied embedding: its gradient is the sum of the embedding's and the head's */
  if (q->emb) {
    const train_param *w = &m->tensors[0];
    if (ar_grads(q->emb, m, w->offset, w->numel, TRAIN_REDUCE_SUM, err) != 0) return -1;
  }
  /* the loss (the last stage's), summed over the stages, averaged over the replicas */
  float v[2] = {q->stage == q->P - 1 ? (float)(loss / M) : 0.0f, 0.0f};
  r->step.lr = train_lr_at(&s->opt.hp, s->step);
  double te;
  if (q->zero1) {
    if (ar(q->pp, v, 1, TRAIN_REDUCE_SUM, err) != 0) return -1;
    if (D > 1 && ar(q->dp, v, 1, TRAIN_REDUCE_AVG, err) != 0) return -1;
    te = train_now();
    if (zero1_update(q, r->step.lr, s->step + 1, &r->step.grad_norm, err) != 0) return -1;
  } else {
    /* data parallel: the average over the stage's replicas, once, after the last
     * micro-batch; the squared norm summed over the stages */
    if (D > 1 && ar_grads(q->dp, m, 0, m->nparams, TRAIN_REDUCE_AVG, err) != 0) return -1;
    v[1] = (float)stage_sumsq(q);
    if (ar(q->pp, v, 2, TRAIN_REDUCE_SUM, err) != 0) return -1;
    if (D > 1 && ar(q->dp, v, 1, TRAIN_REDUCE_AVG, err) != 0) return -1;
    te = train_now();
    r->step.grad_norm = train_clip_grads_sq(m, &s->opt.hp, (double)v[1]);
    train_adamw_step(m, &s->opt.hp, r->step.lr, s->step + 1);
  }
  if (sync_tied(q, err) != 0) return -1;
  q->sync_ms = (te - ts) * 1e3;
  if (q->tracing) train_trace_add(&q->trace, rank, TRAIN_TRACE_COMM, "grad sync", ts, te);
  double t1 = train_now();
  if (q->tracing) train_trace_add(&q->trace, rank, TRAIN_TRACE_COMPUTE, "optimizer", te, t1);
  s->step++;
  r->step.step = s->step;
  r->step.loss = v[0];
  r->step.ms = (t1 - t0) * 1e3;
  r->step.tokens_per_s = (double)M * D * B * T / (t1 - t0);
  r->wait_ms = q->xfer_ms;
  r->comm_ms = q->sync_ms;
  r->sent_bytes = q->xfer_bytes;
  return 0;
}

/* Forward only, piece after piece along the virtual stages, one activation set. */
static int pp_val_loss(train_parallel *p, int batches, float *out, char *err) {
  train_pp *q = pp_of(p);
  train_session *s = q->s;
  int B = q->B, T = q->T, U = q->P * q->V, rc = 0;
  double sum = 0.0;
  int n = 0;
  for (int k = 0; k < batches; k++) {
    if (!train_data_val_batch(s->data, k, B, T, q->inputs, q->targets)) break;
    train_model_use_slot(q->m, 0);
    for (int u = 0; u < U && rc == 0; u++) {
      int c = u / q->P;
      if (u % q->P != q->stage) continue;
      if (u > 0) {
        train_p2p x = {0, (u - 1) % q->P, train_piece_input(q->m), q->act_bytes};
        if (q->pp->exchange(q->pp, &x, 1) != 0) rc = -1;
      }
      if (rc == 0) {
        float l = train_piece_forward(q->m, c, q->inputs, q->targets, B, T);
        if (u == U - 1) sum += l;
      }
      if (rc == 0 && u < U - 1) {
        train_p2p x = {1, (u + 1) % q->P, train_piece_output(q->m, c), q->act_bytes};
        if (q->pp->exchange(q->pp, &x, 1) != 0) rc = -1;
      }
    }
    if (rc != 0) {
      train_errf(err, "pipeline stage %d, validation: %s", q->stage, q->pp->err);
      return -1;
    }
    n++;
  }
  float v = (float)(n ? sum / n : NAN);
  if (q->stage != q->P - 1) v = 0.0f;
  if (ar(q->pp, &v, 1, TRAIN_REDUCE_SUM, err) != 0) return -1;
  *out = v;
  return 0;
}

/* Collective over the job: data-parallel rank 0 of each (TP rank, stage) writes its units
 * of the T x 1 x P grid (checkpoint.c), rank 0 the manifest last. */
/* ZeRO-1: the whole AdamW state (and, bf16, the master weights) of the stage gathered into
 * the model's arrays for a checkpoint, which holds every replica's state once; released
 * again after (flag 0). Collective over the data-parallel group. */
static int zero1_state(train_pp *q, int gather, char *err) {
  train_model *m = q->m;
  size_t n0 = (size_t)q->D * q->shard, lo = (size_t)q->g->d * q->shard;
  if (!gather) {
    m->ops->release(m->adam_m);
    m->ops->release(m->adam_v);
    m->adam_m = m->adam_v = NULL;
    return 0;
  }
  m->adam_m = m->ops->alloc(m->nparams * sizeof(float));
  m->adam_v = m->ops->alloc(m->nparams * sizeof(float));
  if (!m->adam_m || !m->adam_v) {
    zero1_state(q, 0, err);
    train_errf(err, "pipeline stage %d: out of memory gathering AdamW's state", q->stage);
    return -1;
  }
  float *mine[2] = {q->am, q->av}, *all[2] = {m->adam_m, m->adam_v};
  for (int k = 0; k < 2; k++) {
    train_req r;
    memcpy(all[k] + lo, mine[k], q->shard * sizeof(float));
    memcpy(all[k] + n0, mine[k] + q->shard, q->tail * sizeof(float)); /* the same everywhere */
    if (q->dp->all_gather(q->dp, all[k] + lo, all[k], q->shard * sizeof(float), &r) != 0 ||
        q->dp->wait(q->dp, r) != 0) {
      train_errf(err, "pipeline stage %d: all-gather of AdamW's state: %s", q->stage, q->dp->err);
      zero1_state(q, 0, err);
      return -1;
    }
  }
  return m->bf16 ? zero1_gather_master(q, err) : 0;
}

static int pp_save(train_parallel *p, const char *path, char *what, size_t n, char *err) {
  train_pp *q = pp_of(p);
  train_grid *g = q->g;
  snprintf(what, n, " (manifest; %d x 1 x %d shards %s.shard<t>.0.<p>of%dx1x%d)", g->T, q->P, path,
           g->T, q->P);
  if (q->zero1 && q->D > 1 && zero1_state(q, 1, err) != 0) return -1;
  int rc = train_stage_save(q->s, g->world, g->T, g->t, q->P, q->stage, q->V, g->d == 0, path, err);
  if (q->zero1 && q->D > 1) zero1_state(q, 0, err);
  return rc;
}

static int pp_finish(train_parallel *p, const char *trace_path, char *err) {
  train_pp *q = pp_of(p);
  if (!trace_path || !q->tracing || !q->g->world) return 0;
  return train_trace_gather_write(q->g->world, &q->trace, trace_path, err);
}

static void pp_describe(train_parallel *p, char *out, size_t n) {
  train_pp *q = pp_of(p);
  train_model *m = q->m;
  out[0] = '\0';
  train_appendf(out, n,
                "pipeline: %d stages x %d data-parallel x %d tensor-parallel over %s, schedule "
                "%s, %d micro-batches of %d rows",
                q->P, q->D, q->g->T, q->pp->name, train_pp_kind_name(q->sc.kind), q->M, q->B);
  if (q->V > 1) train_appendf(out, n, ", %d chunks per stage", q->V);
  if (q->zero1)
    train_appendf(out, n, "; ZeRO-1 along D (AdamW on %zu of %zu floats, then all-gather)",
                  q->shard + q->tail, m->nparams);
  train_appendf(out, n, "\npipeline: stage %d holds", q->stage);
  for (int c = 0; c < m->nchunks; c++)
    train_appendf(out, n, "%s blocks %d..%d", c ? "," : "", m->chunk_blk0[c],
                  m->chunk_blk0[c] + m->chunk_len[c] - 1);
  train_appendf(out, n, "%s%s, %zu parameters, %d activation sets\n",
                m->has_embed ? ", the embeddings" : "", m->has_head ? ", the head" : "", m->nparams,
                q->st.cap);
}

static void pp_step_line(const train_parallel *p, const train_step_report *r, char *out, size_t n) {
  (void)p;
  snprintf(out, n, " | fwd %.0f bwd %.0f p2p %.0f sync %.0f ms", r->fwd_ms, r->bwd_ms, r->wait_ms,
           r->comm_ms);
}

static void pp_summary(const train_parallel *p, const train_step_report *sum, long nsteps,
                       double seconds, const train_step_report *all, long nall, char *out,
                       size_t n) {
  train_pp *q = pp_of(p);
  (void)all;
  (void)nall;
  (void)seconds;
  out[0] = '\0';
  if (nsteps < 1) return;
  double busy = (sum->fwd_ms + sum->bwd_ms) / nsteps, step = sum->step.ms / nsteps;
  train_appendf(out, n,
                "pipeline (rank 0, stage %d, steps after the first): compute %.1f ms of a %.1f ms "
                "step, p2p %.1f ms, gradient sync %.1f ms; the schedule's bubble (P-1)/M-like "
                "formula says %.3f of compute\n",
                q->stage, busy, step, sum->wait_ms / nsteps, sum->comm_ms / nsteps,
                train_pp_formula(q->sc.kind, q->P, q->M, q->V));
}

static int pp_status(const train_parallel *p, char *err) {
  train_pp *q = pp_of(p);
  return q->tp_attached ? train_tp_status(q->s, err) : 0;
}

static int pp_plan(const train_parallel *p, double fixed, train_plan_row *out, char *err) {
  train_pp *q = pp_of(p);
  const train_options *o = &q->s->opt;
  return train_pp_plan(&o->cfg, o->batch, o->seq, q->g->T, o->sp, q->P, q->stage, q->sc.kind, q->M,
                       q->V, q->D, q->zero1, o->recompute, o->bf16, fixed, out, err);
}

static void pp_free(train_parallel *p) {
  train_pp *q = pp_of(p);
  if (q) {
    if (q->tp_attached) train_tp_detach(q->s);
    if (q->emb) q->emb->destroy(q->emb);
    train_pp_free(&q->sc);
    sets_free(&q->st);
    free(q->inputs);
    free(q->targets);
    free(q->gshard);
    free(q->gshard16);
    free(q->am);
    free(q->av);
    train_trace_free(&q->trace);
    free(q);
  }
  free(p);
}

static const train_parallel_ops pp_ops = {
    .name = "pp",
    .step = pp_step,
    .save = pp_save,
    .finish = pp_finish,
    .describe = pp_describe,
    .step_line = pp_step_line,
    .summary = pp_summary,
    .status = pp_status,
    .plan = pp_plan,
    .val_loss = pp_val_loss,
    .free = pp_free,
};

train_parallel *train_pp_strategy_create(train_session *s, train_grid *g,
                                         const train_parallel_options *opt, char *err) {
  train_model *m = train_session_model(s);
  train_parallel *p = train_parallel_new(&pp_ops, s, g, opt);
  train_pp *q = p ? calloc(1, sizeof *q) : NULL;
  if (!q) {
    free(p);
    train_errf(err, "out of memory for the pipeline");
    return NULL;
  }
  p->impl = q;
  q->s = s;
  q->m = m;
  q->g = g;
  q->P = g->P;
  q->D = g->D;
  q->stage = g->p;
  q->pp = g->pp;
  q->dp = g->dp;
  q->M = opt->micro;
  q->V = opt->chunks > 1 ? opt->chunks : 1;
  q->B = s->opt.batch;
  q->T = s->opt.seq;
  q->tracing = opt->trace;
  if (m->pp != q->P || m->nchunks != q->V || (q->stage == 0) != m->has_embed ||
      m->split_w != (opt->schedule == TRAIN_PP_ZB)) {
    train_errf(err, "pipeline stage %d: the session's model was not cut for --pp %d --chunks %d",
               q->stage, q->P, q->V);
    goto fail;
  }
  if (train_pp_build((train_pp_kind)opt->schedule, q->P, q->M, q->V, &q->sc, err) != 0) goto fail;
  if (m->nslots < walk_sets(&q->sc, q->stage)) {
    train_errf(err, "pipeline stage %d: the model has %d activation sets, the schedule needs %d",
               q->stage, m->nslots, walk_sets(&q->sc, q->stage));
    goto fail;
  }
  if (sets_init(&q->st, q->M, q->V, q->stage, q->sc.kind == TRAIN_PP_ZB, m->nslots) != 0) {
    train_errf(err, "out of memory for the pipeline's activation sets");
    goto fail;
  }
  size_t bt = (size_t)q->B * q->T;
  q->inputs = malloc((size_t)q->M * bt * sizeof(int));
  q->targets = malloc((size_t)q->M * bt * sizeof(int));
  if (!q->inputs || !q->targets) {
    train_errf(err, "out of memory for the pipeline's micro-batches");
    goto fail;
  }
  q->act_bytes = train_piece_bytes(m); /* bf16 on the wire under --dtype bf16 */
  if (m->bf16 && !q->pp->all_reduce_bf16) {
    train_errf(err,
               "--dtype bf16: the %s backend cannot all-reduce bfloat16 gradients; use "
               "--backend coll",
               q->pp->name);
    goto fail;
  }
  if (strcmp(opt->data, "fsdp") == 0) {
    if (m->bf16 && !q->dp->reduce_scatter_bf16) {
      train_errf(err,
                 "--dtype bf16: the %s backend cannot reduce-scatter bfloat16 gradients; "
                 "use --backend coll",
                 q->dp->name);
      goto fail;
    }
    /* ZeRO-1 only: stages 2 and 3 shard the gradients, which the pipeline accumulates
     * over its micro-batches in full (DeepSpeed refuses them with pipelines too) */
    if (opt->zero != 1) {
      train_errf(err,
                 "--pp with --parallel fsdp --zero %d: a pipeline accumulates every "
                 "micro-batch's gradients in full, so only --zero 1 (sharded AdamW state) applies",
                 opt->zero);
      goto fail;
    }
    q->zero1 = 1;
    q->shard = m->nparams / (size_t)q->D;
    q->tail = m->nparams - q->shard * (size_t)q->D;
    if (m->bf16)
      q->gshard16 = calloc(q->shard + 1, sizeof(uint16_t));
    else
      q->gshard = calloc(q->shard + 1, sizeof(float));
    q->am = calloc(q->shard + q->tail + 1, sizeof(float));
    q->av = calloc(q->shard + q->tail + 1, sizeof(float));
    if ((!q->gshard && !q->gshard16) || !q->am || !q->av) {
      train_errf(err, "out of memory for the pipeline's ZeRO-1 shards");
      goto fail;
    }
    if (m->adam_m) { /* a resumed run: this rank's shard of the loaded AdamW state */
      size_t lo = (size_t)q->g->d * q->shard, n0 = q->shard * (size_t)q->D;
      memcpy(q->am, m->adam_m + lo, q->shard * sizeof(float));
      memcpy(q->av, m->adam_v + lo, q->shard * sizeof(float));
      memcpy(q->am + q->shard, m->adam_m + n0, q->tail * sizeof(float));
      memcpy(q->av + q->shard, m->adam_v + n0, q->tail * sizeof(float));
      zero1_state(q, 0, err); /* the whole state is not kept: that is the point of ZeRO-1 */
    }
    p->zero = 1;
  }
  /* the pair holding the tied embedding: stage 0 (embedding) and stage P-1 (head) */
  if (q->P > 1) {
    int in = q->stage == 0 || q->stage == q->P - 1;
    if (q->pp->split(q->pp, in ? 0 : -1, q->stage, &q->emb) != 0) {
      train_errf(err, "%s", q->pp->err);
      goto fail;
    }
  }
  if (g->T > 1) {
    if (train_tp_attach(s, g->tp, err) != 0) goto fail;
    q->tp_attached = 1;
  }
  p->eval_everywhere = 1;
  p->can_sample = 0;
  p->rows_mult = q->M * q->D;
  return p;
fail:
  pp_free(p);
  return NULL;
}
