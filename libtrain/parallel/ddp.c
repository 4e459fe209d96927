/*
 * ddp.c — data-parallel training over a backend (see ddp.h for the contract): bucket
 * construction, the backward hook that launches each bucket's all-reduce as soon as its
 * gradients are final, the step (data slice, micro-steps, wait, clip, AdamW), overlap
 * accounting and the timeline.
 *
 * It never looks inside the model's layers: it only sees the flat gradient array and the
 * "gradients from offset X on are final" notifications train_backward sends. It must
 * never print or exit, and never touch a gradient range that is still being written.
 */
#include "parallel/ddp.h"
#include "parallel/cp.h"
#include "parallel/strategy.h"
#include "parallel/tp.h"
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

typedef struct bucket_state {
  int launched, done;
  train_req req;
  double t_launch, t_done;
} bucket_state;

struct train_ddp {
  train_session *s;
  train_backend *b;
  train_ddp_options o;
  int nb;
  train_ddp_bucket *bk;
  bucket_state *bs;
  int next;   /* next bucket to launch (they launch in order) */
  int armed;  /* this backward is the one that all-reduces */
  int failed; /* a launch failed inside the hook */
  char hook_err[TRAIN_ERRLEN];
  int stage;       /* for messages: the last stage the hook saw */
  double t_stage;  /* when the previous stage ended (timeline) */
  double launch_s; /* time spent inside all-reduce launch calls this backward */
  train_trace trace;
  int *inputs, *targets;
  int *cp_inputs, *cp_targets; /* context parallelism: this rank's chunks (B, T/cp) */
};

train_ddp_options train_ddp_options_default(void) {
  train_ddp_options o = {
      .bucket_bytes = 25u << 20,
      .first_bucket_bytes = 1u << 20,
      .overlap = 1,
      .accum = 1,
      .trace = 0,
  };
  return o;
}

/* Buckets in reverse layout order: tensors are added from the end of the flat array down
 * until the next one would overflow the cap (a bucket holds at least one tensor). */
static int build_buckets(train_ddp *d) {
  const train_model *m = d->s->model;
  int nt = m->ntensors;
  d->bk = calloc((size_t)nt, sizeof *d->bk);
  d->bs = calloc((size_t)nt, sizeof *d->bs);
  if (!d->bk || !d->bs) return -1;
  size_t cap = d->o.first_bucket_bytes;
  int i = nt - 1;
  d->nb = 0;
  while (i >= 0) {
    train_ddp_bucket *k = &d->bk[d->nb++];
    size_t bytes = 0;
    int hi = i;
    while (i >= 0 && (i == hi || bytes + m->tensors[i].numel * sizeof(float) <= cap)) {
      bytes += m->tensors[i].numel * sizeof(float);
      i--;
    }
    int lo = i + 1;
    k->first_tensor = lo;
    k->ntensors = hi - lo + 1;
    k->start = m->tensors[lo].offset;
    k->count = m->tensors[hi].offset + m->tensors[hi].numel - k->start;
    /* the stage that makes it final is the one of its lowest tensor */
    int layer = m->tensors[lo].layer;
    if (layer < 0 && lo >= nt - 2) layer = m->cfg.layers; /* final LayerNorm */
    k->layer = layer;
    cap = d->o.bucket_bytes;
  }
  return 0;
}

int train_ddp_num_buckets(const train_ddp *d) { return d->nb; }
const train_ddp_bucket *train_ddp_bucket_info(const train_ddp *d, int i) {
  return i >= 0 && i < d->nb ? &d->bk[i] : NULL;
}

static void stage_name(const train_model *m, int layer, char *out, size_t n) {
  if (layer == m->cfg.layers)
    snprintf(out, n, "the final LayerNorm");
  else if (layer < 0)
    snprintf(out, n, "the embeddings");
  else
    snprintf(out, n, "layer %d", layer);
}

void train_ddp_describe_bucket(const train_ddp *d, int i, char *out, size_t n) {
  const train_model *m = d->s->model;
  const train_ddp_bucket *k = &d->bk[i];
  char st[32];
  stage_name(m, k->layer, st, sizeof st);
  snprintf(out, n, "bucket %d: %.2f MiB, %d tensors %s..%s, final after %s", i,
           k->count * 4.0 / 1048576.0, k->ntensors, m->tensors[k->first_tensor].name,
           m->tensors[k->first_tensor + k->ntensors - 1].name, st);
}

/* Polls launched buckets (lets MPI progress) and records when each is first seen done. */
static void poll_buckets(train_ddp *d) {
  for (int i = 0; i < d->next; i++) {
    bucket_state *bs = &d->bs[i];
    if (!bs->launched || bs->done) continue;
    int r = d->b->test(d->b, bs->req);
    if (r == 0) break; /* they complete in order */
    if (r < 0) {
      if (!d->failed) snprintf(d->hook_err, sizeof d->hook_err, "%s", d->b->err);
      d->failed = 1;
      bs->done = 1;
      continue;
    }
    bs->done = 1;
    bs->t_done = train_now();
  }
}

/* On a device: the buckets about to launch read gradients that are written once the
 * compute stream passes the model's grad_mark.  The backend orders its stream after that
 * mark where it can (NCCL); otherwise the host waits for the compute stream — that
 * stream only, so communication already in flight keeps running under backward. */
static int order_after_mark(train_ddp *d) {
  train_model *m = d->s->model;
  void *mk = m->grad_mark;
  if (!mk) return 0;
  m->grad_mark = NULL; /* once per notification, for all the buckets it makes final */
  char why[TRAIN_ERRLEN];
  if (d->b->order_after) {
    if (d->b->order_after(d->b, mk) == 0) return 0;
    snprintf(why, sizeof why, "%s", d->b->err);
  } else if (m->ops->wait_mark(mk, why) == 0) {
    return 0;
  }
  if (!d->failed) snprintf(d->hook_err, sizeof d->hook_err, "%s", why);
  d->failed = 1;
  return -1;
}

static void launch(train_ddp *d, int i) {
  train_ddp_bucket *k = &d->bk[i];
  bucket_state *bs = &d->bs[i];
  bs->t_launch = train_now();
  bs->launched = 1;
  if (order_after_mark(d) != 0) {
    bs->done = 1;
    bs->req = TRAIN_REQ_DONE;
    return;
  }
  train_model *m = d->s->model;
  int rc = m->bf16
               ? d->b->all_reduce_bf16(d->b, m->grads16 + k->start, k->count, TRAIN_REDUCE_AVG,
                                       &bs->req)
               : d->b->all_reduce(d->b, m->grads + k->start, k->count, TRAIN_REDUCE_AVG, &bs->req);
  if (rc != 0) {
    if (!d->failed) snprintf(d->hook_err, sizeof d->hook_err, "%s", d->b->err);
    d->failed = 1;
    bs->done = 1;
    bs->req = TRAIN_REQ_DONE;
  }
  double t = train_now();
  d->launch_s += t - bs->t_launch;
  if (d->o.trace) {
    char nm[40];
    snprintf(nm, sizeof nm, "launch b%d", i);
    train_trace_add(&d->trace, d->b->rank, TRAIN_TRACE_COMPUTE, nm, bs->t_launch, t);
  }
}

void train_ddp_begin_backward(train_ddp *d) {
  d->armed = 1;
  d->next = 0;
  d->launch_s = 0.0;
  d->stage = INT32_MAX;
  for (int i = 0; i < d->nb; i++) memset(&d->bs[i], 0, sizeof d->bs[i]);
  d->t_stage = train_now();
}

void train_ddp_grads_final(train_ddp *d, size_t final_from, int layer) {
  double now = train_now();
  if (d->o.trace) {
    char nm[40];
    if (layer == d->s->model->cfg.layers)
      snprintf(nm, sizeof nm, "bwd head+lnf");
    else if (layer < 0)
      snprintf(nm, sizeof nm, "bwd embeddings");
    else
      snprintf(nm, sizeof nm, "bwd layer %d", layer);
    train_trace_add(&d->trace, d->b->rank, TRAIN_TRACE_COMPUTE, nm, d->t_stage, now);
  }
  d->t_stage = now;
  if (!d->armed) return;
  d->stage = layer;
  poll_buckets(d);
  if (!d->o.overlap) return;
  while (d->next < d->nb && d->bk[d->next].start >= final_from && !d->failed) launch(d, d->next++);
}

static void hook(void *arg, size_t final_from, int layer) {
  train_ddp_grads_final(arg, final_from, layer);
}

/* With --trace: one compute slice per forward stage, from the previous stage's end. */
static void fwd_hook(void *arg, int stage) {
  train_ddp *d = arg;
  double now = train_now();
  char nm[40];
  if (stage == d->s->model->cfg.layers)
    snprintf(nm, sizeof nm, "fwd lnf+head+loss");
  else if (stage < 0)
    snprintf(nm, sizeof nm, "fwd embeddings");
  else
    snprintf(nm, sizeof nm, "fwd layer %d", stage);
  train_trace_add(&d->trace, d->b->rank, TRAIN_TRACE_COMPUTE, nm, d->t_stage, now);
  d->t_stage = now;
}

int train_ddp_wait_all(train_ddp *d, char *err) {
  int rc = 0;
  for (int i = 0; i < d->next; i++) {
    bucket_state *bs = &d->bs[i];
    if (bs->done) continue;
    if (d->b->wait(d->b, bs->req) != 0) {
      if (rc == 0) train_errf(err, "%s", d->b->err);
      rc = -1;
    }
    bs->done = 1;
    bs->t_done = train_now();
  }
  if (rc == 0 && d->failed) {
    train_errf(err, "%s", d->hook_err);
    rc = -1;
  }
  return rc;
}

int train_ddp_finish_backward(train_ddp *d, char *err) {
  d->armed = 0;
  if (!d->o.overlap)
    while (d->next < d->nb && !d->failed) launch(d, d->next++);
  if (d->next < d->nb && !d->failed) {
    char desc[TRAIN_ERRLEN / 2], st[32];
    train_ddp_describe_bucket(d, d->next, desc, sizeof desc);
    stage_name(d->s->model, d->bk[d->next].layer, st, sizeof st);
    int first = d->next;
    char drain[TRAIN_ERRLEN];
    train_ddp_wait_all(d, drain); /* drain what was launched */
    train_errf(err,
               "rank %d: backward ended with %d of %d gradient buckets never "
               "all-reduced, first %s: backward never reported %s finished",
               d->b->rank, d->nb - first, d->nb, desc, st);
    return -1;
  }
  if (d->failed) {
    train_ddp_wait_all(d, err);
    train_errf(err, "%s", d->hook_err);
    return -1;
  }
  return 0;
}

static uint64_t param_hash(train_ddp *d, float *host) {
  train_model *m = d->s->model;
  train_copy_params_to_host(m, host);
  return train_fnv1a(TRAIN_FNV_INIT, host, m->nparams * sizeof(float));
}

int train_ddp_check_identical(train_ddp *d, char *err) {
  train_backend *b = d->b;
  train_model *m = d->s->model;
  float *host = malloc(m->nparams * sizeof(float));
  uint64_t *all = calloc((size_t)b->nranks, sizeof *all);
  if (!host || !all) {
    free(host);
    free(all);
    train_errf(err, "out of memory checking the weights");
    return -1;
  }
  uint64_t h = param_hash(d, host);
  train_req req;
  int rc = 0;
  if (b->all_gather(b, &h, all, sizeof h, &req) != 0 || b->wait(b, req) != 0) {
    train_errf(err, "%s", b->err);
    rc = -1;
  }
  for (int r = 1; rc == 0 && r < b->nranks; r++)
    if (all[r] != all[0]) {
      train_errf(err,
                 "ranks hold different weights: rank 0 hash %016llx, rank %d hash "
                 "%016llx (step %ld)",
                 (unsigned long long)all[0], r, (unsigned long long)all[r], d->s->step);
      rc = -1;
    }
  free(host);
  free(all);
  return rc;
}

train_ddp *train_ddp_create(train_session *s, train_backend *b, const train_ddp_options *o,
                            char *err) {
  if (o->accum < 1 || o->bucket_bytes < sizeof(float) || o->first_bucket_bytes < sizeof(float)) {
    train_errf(err, "impossible DDP config: accum %d must be >= 1 and bucket sizes > 0", o->accum);
    return NULL;
  }
  if (s->model->bf16 && !b->all_reduce_bf16) {
    train_errf(err,
               "--dtype bf16: the %s backend cannot all-reduce bfloat16 gradients; use "
               "--backend coll",
               b->name);
    return NULL;
  }
  train_ddp *d = calloc(1, sizeof *d);
  if (!d) {
    train_errf(err, "out of memory for DDP");
    return NULL;
  }
  d->s = s;
  d->b = b;
  d->o = *o;
  train_model *m = s->model;
  size_t bt = (size_t)s->opt.batch * s->opt.seq;
  d->inputs = malloc(bt * sizeof(int));
  d->targets = malloc(bt * sizeof(int));
  if (o->cp > 1) {
    d->cp_inputs = malloc(bt / o->cp * sizeof(int));
    d->cp_targets = malloc(bt / o->cp * sizeof(int));
  }
  if (!d->inputs || !d->targets || (o->cp > 1 && (!d->cp_inputs || !d->cp_targets)) ||
      build_buckets(d) != 0) {
    train_errf(err, "out of memory for DDP buckets");
    train_ddp_free(d);
    return NULL;
  }
  /* rank 0's weights everywhere, whatever seed each rank started from */
  float *host = malloc(m->nparams * sizeof(float));
  if (!host) {
    train_errf(err, "out of memory for the parameter broadcast");
    train_ddp_free(d);
    return NULL;
  }
  train_copy_params_to_host(m, host);
  train_req req;
  if (b->broadcast(b, host, m->nparams * sizeof(float), 0, &req) != 0 || b->wait(b, req) != 0) {
    train_errf(err, "parameter broadcast from rank 0: %s", b->err);
    free(host);
    train_ddp_free(d);
    return NULL;
  }
  train_copy_params_from_host(m, host);
  free(host);
  /* and rank 0's data position and step count, so the ranks read slices of the same
   * global batches even if they were created with different seeds */
  struct {
    train_loader_state pos;
    int64_t step;
  } where = {s->pos, s->step};
  if (b->broadcast(b, &where, sizeof where, 0, &req) != 0 || b->wait(b, req) != 0) {
    train_errf(err, "data position broadcast from rank 0: %s", b->err);
    train_ddp_free(d);
    return NULL;
  }
  s->pos = where.pos;
  s->step = (long)where.step;
  if (train_ddp_check_identical(d, err) != 0) {
    train_ddp_free(d);
    return NULL;
  }
  train_set_backward_hook(m, hook, d);
  if (d->o.trace) {
    train_set_forward_hook(m, fwd_hook, d);
    /* libcoll's own records of the training's collectives (not the start-up ones) */
    if (b->trace_start && b->trace_start(b) != 0) {
      train_errf(err, "--trace: %s", b->err);
      train_ddp_free(d);
      return NULL;
    }
  }
  return d;
}

void train_ddp_free(train_ddp *d) {
  if (!d) return;
  if (d->s && d->s->model) {
    train_set_backward_hook(d->s->model, NULL, NULL);
    train_set_forward_hook(d->s->model, NULL, NULL);
  }
  free(d->bk);
  free(d->bs);
  free(d->inputs);
  free(d->targets);
  free(d->cp_inputs);
  free(d->cp_targets);
  train_trace_free(&d->trace);
  free(d);
}

int train_ddp_step(train_ddp *d, train_ddp_stats *st, char *err) {
  train_session *s = d->s;
  train_model *m = s->model;
  train_backend *b = d->b;
  int B = s->opt.batch, T = s->opt.seq, K = d->o.accum, N = b->nranks;
  int rank = b->rank;
  /* context parallelism: N/cp data ranks, each of cp ranks reading the same sequences
   * and running its chunks of them (T/cp positions) */
  int cp = d->o.cp > 1 ? d->o.cp : 1, cr = rank % cp;
  N /= cp;
  rank /= cp;
  memset(st, 0, sizeof *st);
  double t0 = train_now(), tb_end = t0;
  double loss = 0.0;

  train_zero_grad(m);
  train_set_loss_scale(m, 1.0f / (float)K);
  train_loader_state pos0 = s->pos;
  for (int k = 0; k < K; k++) {
    train_loader_state p = pos0;
    train_data_next_rows(s->data, &p, K * N * B, T, (k * N + rank) * B, B, d->inputs, d->targets);
    if (k == K - 1) s->pos = p;
    int *in = d->inputs, *tg = d->targets;
    if (cp > 1) {
      train_cp_take(d->inputs, d->cp_inputs, B, T, cp, cr);
      train_cp_take(d->targets, d->cp_targets, B, T, cp, cr);
      in = d->cp_inputs;
      tg = d->cp_targets;
    }
    double tf = train_now();
    d->t_stage = tf;
    loss += train_forward(m, in, tg, B, T / cp);
    double tb = train_now();
    st->fwd_ms += (tb - tf) * 1e3;
    int sync = k == K - 1;
    if (sync) train_ddp_begin_backward(d);
    d->t_stage = tb;
    train_backward(m);
    if (sync && train_ddp_finish_backward(d, err) != 0) {
      train_set_loss_scale(m, 1.0f);
      return -1;
    }
    /* On a device the host ran ahead of the compute stream: wait for that stream
     * alone, so that backward's time is compute and what follows is communication
     * only (a wait on everything would count communication as compute). */
    if (m->ops->mark && m->ops->wait_mark(m->ops->mark(), err) != 0) {
      train_set_loss_scale(m, 1.0f);
      train_ddp_wait_all(d, err);
      return -1;
    }
    tb_end = train_now();
    st->bwd_ms += (tb_end - tb) * 1e3;
  }
  train_set_loss_scale(m, 1.0f);

  /* the step's loss, averaged over ranks: queued behind the gradient buckets */
  float lossf = (float)(loss / K);
  train_req lreq;
  if (b->all_reduce(b, &lossf, 1, TRAIN_REDUCE_AVG, &lreq) != 0) {
    train_errf(err, "%s", b->err);
    train_ddp_wait_all(d, err);
    return -1;
  }
  if (train_ddp_wait_all(d, err) != 0) return -1;
  if (b->wait(b, lreq) != 0) {
    train_errf(err, "%s", b->err);
    return -1;
  }
  double tw = train_now();
  /* exposed communication: the launch calls (a launch may have to wait for a queue slot
   * or lose the CPU to the progress thread) plus the wait after backward */
  st->wait_ms = (tw - tb_end + d->launch_s) * 1e3;
  st->bwd_ms -= d->launch_s * 1e3;
  double first = 0.0, last = 0.0;
  for (int i = 0; i < d->nb; i++) {
    bucket_state *bs = &d->bs[i];
    if (i == 0 || bs->t_launch < first) first = bs->t_launch;
    if (bs->t_done > last) last = bs->t_done;
    if (d->o.trace) {
      char nm[40];
      snprintf(nm, sizeof nm, "allreduce b%d %.2fMiB", i, d->bk[i].count * 4.0 / 1048576);
      train_trace_add(&d->trace, b->rank, TRAIN_TRACE_COMM, nm, bs->t_launch, bs->t_done);
    }
  }
  if (d->o.trace) train_trace_add(&d->trace, b->rank, TRAIN_TRACE_COMPUTE, "wait comm", tb_end, tw);
  st->comm_ms = d->nb ? (last - first) * 1e3 : 0.0;
  double hidden = st->comm_ms > 0 ? 1.0 - st->wait_ms / st->comm_ms : 0.0;
  st->hidden = hidden < 0 ? 0 : hidden > 1 ? 1 : hidden;

  st->step.grad_norm = train_clip_grads(m, &s->opt.hp);
  st->step.lr = train_lr_at(&s->opt.hp, s->step);
  train_adamw_step(m, &s->opt.hp, st->step.lr, s->step + 1);
  m->ops->sync();
  double t1 = train_now();
  st->opt_ms = (t1 - tw) * 1e3;
  if (d->o.trace) train_trace_add(&d->trace, b->rank, TRAIN_TRACE_COMPUTE, "optimizer", tw, t1);
  s->step++;
  st->step.step = s->step;
  st->step.loss = lossf;
  st->step.ms = (t1 - t0) * 1e3;
  st->step.tokens_per_s = (double)K * N * B * T / (t1 - t0);
  return 0;
}

int train_ddp_write_trace(train_ddp *d, const char *path, char *err) {
  return train_trace_gather_write(d->b, &d->trace, path, err);
}

/* ---- DDP as a strategy (strategy.h) ---------------------------------------------------
 * Over the grid's data-parallel group: every rank steps, rank 0 of the group writes the
 * checkpoint (the others hold the same bits), and the run ends by checking that they do. */

static train_ddp *ddp_of(const train_parallel *p) { return p->impl; }

static int ddp_strategy_step(train_parallel *p, train_step_report *r, char *err) {
  train_ddp_stats ds = {0};
  if (train_ddp_step(ddp_of(p), &ds, err) != 0) return -1;
  r->step = ds.step;
  r->fwd_ms = ds.fwd_ms;
  r->bwd_ms = ds.bwd_ms;
  r->wait_ms = ds.wait_ms;
  r->comm_ms = ds.comm_ms;
  r->hidden = ds.hidden;
  return 0;
}

static int ddp_strategy_save(train_parallel *p, const char *path, char *what, size_t n, char *err) {
  snprintf(what, n, " (manifest; 1 shard %s.shard0.0of1x1, from data-parallel rank 0)", path);
  return p->grid->dp->rank == 0 ? train_session_save(p->s, path, err) : 0;
}

/* every DP rank holds the same slice: DP rank 0 of each TP group writes it */
static int ddp_strategy_save_slice(train_parallel *p, train_backend *world, train_backend *tp,
                                   const char *path, char *err) {
  return train_tp_save(p->s, world, tp, NULL, NULL, NULL, path, err);
}

static int ddp_strategy_finish(train_parallel *p, const char *trace_path, char *err) {
  if (train_ddp_check_identical(ddp_of(p), err) != 0) return -1;
  return trace_path ? train_ddp_write_trace(ddp_of(p), trace_path, err) : 0;
}

static void ddp_strategy_describe(train_parallel *p, char *out, size_t n) {
  train_ddp *d = ddp_of(p);
  const train_options *o = &p->s->opt;
  out[0] = '\0';
  train_appendf(out, n,
                "coll-train: DDP on %d ranks (%s backend), %d micro-step%s per step: "
                "global batch %d x seq %d; %s; %d gradient buckets:\n",
                d->b->nranks, d->b->name, p->opt.accum, p->opt.accum > 1 ? "s" : "",
                p->rows_mult * o->batch, o->seq,
                p->opt.overlap ? "all-reduce overlapped with backward"
                               : "all-reduce after backward (--no-overlap)",
                train_ddp_num_buckets(d));
  for (int i = 0; i < train_ddp_num_buckets(d); i++) {
    char line[TRAIN_ERRLEN];
    train_ddp_describe_bucket(d, i, line, sizeof line);
    train_appendf(out, n, "  %s\n", line);
  }
}

static void ddp_strategy_step_line(const train_parallel *p, const train_step_report *r, char *out,
                                   size_t n) {
  (void)p;
  snprintf(out, n, " | bwd %6.1f ms | exposed comm %6.1f ms | hidden %3.0f%%", r->bwd_ms,
           r->wait_ms, 100.0 * r->hidden);
}

static void ddp_strategy_summary(const train_parallel *p, const train_step_report *sum, long nsteps,
                                 double seconds, const train_step_report *all, long nall, char *out,
                                 size_t n) {
  (void)seconds;
  (void)all;
  (void)nall;
  out[0] = '\0';
  if (nsteps < 1) return;
  snprintf(out, n,
           "ddp: weights bitwise identical on all %d ranks | per step after the "
           "first: backward %.1f ms, comm %.1f ms, exposed comm %.1f ms, hidden %.0f%%\n",
           ddp_of(p)->b->nranks, sum->bwd_ms / (double)nsteps, sum->comm_ms / (double)nsteps,
           sum->wait_ms / (double)nsteps,
           sum->comm_ms > sum->wait_ms ? 100.0 * (1.0 - sum->wait_ms / sum->comm_ms) : 0.0);
}

static int ddp_strategy_plan(const train_parallel *p, double fixed, train_plan_row *out,
                             char *err) {
  const train_options *o = &p->s->opt;
  return train_plan_dt(&o->cfg, o->batch, o->seq, p->grid->dp->nranks, p->opt.accum, TRAIN_PLAN_DDP,
                       o->recompute, o->bf16, fixed, out, err);
}

static void ddp_strategy_free(train_parallel *p) {
  train_ddp_free(ddp_of(p));
  free(p);
}

static const train_parallel_ops ddp_strategy_ops = {
    .name = "ddp",
    .step = ddp_strategy_step,
    .save = ddp_strategy_save,
    .save_slice = ddp_strategy_save_slice,
    .finish = ddp_strategy_finish,
    .describe = ddp_strategy_describe,
    .step_line = ddp_strategy_step_line,
    .summary = ddp_strategy_summary,
    .plan = ddp_strategy_plan,
    .free = ddp_strategy_free,
};

train_parallel *train_ddp_strategy_create(train_session *s, train_grid *g,
                                          const train_parallel_options *opt, char *err) {
  if (!g->dp) {
    train_errf(err, "--parallel ddp needs more than one process");
    return NULL;
  }
  train_ddp_options dopt = train_ddp_options_default();
  dopt.bucket_bytes = opt->bucket_bytes < sizeof(float) ? sizeof(float) : opt->bucket_bytes;
  dopt.overlap = opt->overlap;
  dopt.accum = opt->accum;
  dopt.trace = opt->trace;
  train_parallel *p = train_parallel_new(&ddp_strategy_ops, s, g, opt);
  if (!p) {
    train_errf(err, "out of memory");
    return NULL;
  }
  dopt.cp = g->Cp;
  p->rows_mult = g->dp->nranks / (g->Cp > 1 ? g->Cp : 1) * opt->accum;
  if (!(p->impl = train_ddp_create(s, g->dp, &dopt, err))) {
    free(p);
    return NULL;
  }
  return p;
}
