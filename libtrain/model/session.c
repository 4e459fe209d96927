/*
 * session.c — a training run as an object: the model, the data, the optimizer state,
 * the step counter and the RNGs, i.e. exactly what a checkpoint (parallel/checkpoint.c) must hold
 * for a resumed run to continue bit for bit. coll-train (main.c) and the tests drive it.
 */
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

train_session *train_session_create(const train_options *opt, char *err) {
  if (train_config_check(&opt->cfg, err) != 0) return NULL;
  if (train_shape_check(&opt->cfg, opt->batch, opt->seq, err) != 0) return NULL;
  if (opt->hp.steps < 0 || opt->hp.warmup < 0 || !(opt->hp.lr >= 0.0f)) {
    train_errf(err, "impossible config: steps, warmup and lr must be >= 0");
    return NULL;
  }
  train_session *s = calloc(1, sizeof *s);
  s->opt = *opt;
  if (opt->data_path) {
    snprintf(s->data_path, sizeof s->data_path, "%s", opt->data_path);
    s->opt.data_path = s->data_path;
  }
  s->data = train_data_open(opt->data_path, opt->cfg.vocab, opt->seq, err);
  if (!s->data) goto fail;
  train_split split = {.tp = opt->tp,
                       .tp_rank = opt->tp_rank,
                       .sp = opt->sp,
                       .pp = opt->pp,
                       .pp_rank = opt->pp_rank,
                       .chunks = opt->pp_chunks,
                       .slots = opt->pp_slots,
                       .split_w = opt->pp_split_w,
                       .recompute = opt->recompute,
                       .bf16 = opt->bf16,
                       .experts = opt->experts,
                       .topk = opt->topk,
                       .ep = opt->ep,
                       .ep_rank = opt->ep_rank,
                       .capacity = opt->capacity_factor,
                       .aux_coef = opt->aux_coef};
  /* context parallelism: this rank's positions of every sequence (parallel/cp.c reads
   * the whole sequences and hands the model its chunks) */
  int seq_here = opt->cp > 1 ? opt->seq / opt->cp : opt->seq;
  s->model = train_model_create_split(&opt->cfg, opt->batch, seq_here, opt->device, opt->threads,
                                      opt->seed, &split, err);
  if (!s->model) goto fail;
  s->pos.seed = opt->seed;
  s->sample_rng = opt->seed ^ 0x5851f42d4c957f2dULL;
  size_t bt = (size_t)opt->batch * opt->seq;
  s->inputs = malloc(bt * sizeof(int));
  s->targets = malloc(bt * sizeof(int));
  s->logits = malloc((size_t)opt->seq * opt->cfg.vocab * sizeof(float));
  return s;
fail:
  train_session_free(s);
  return NULL;
}

void train_session_free(train_session *s) {
  if (!s) return;
  train_model_free(s->model);
  train_data_free(s->data);
  free(s->inputs);
  free(s->targets);
  free(s->logits);
  free(s);
}

train_model *train_session_model(train_session *s) { return s->model; }
train_data *train_session_data(train_session *s) { return s->data; }
long train_session_step_count(const train_session *s) { return s->step; }

train_step_stats train_session_step(train_session *s) {
  train_model *m = s->model;
  int B = s->opt.batch, T = s->opt.seq;
  double t0 = train_now();
  train_data_next_batch(s->data, &s->pos, B, T, s->inputs, s->targets);
  train_step_stats st;
  st.loss = train_forward(m, s->inputs, s->targets, B, T);
  train_zero_grad(m);
  train_backward(m);
  st.grad_norm = train_clip_grads(m, &s->opt.hp);
  st.lr = train_lr_at(&s->opt.hp, s->step);
  train_adamw_step(m, &s->opt.hp, st.lr, s->step + 1);
  m->ops->sync();
  s->step++;
  st.step = s->step;
  st.ms = (train_now() - t0) * 1e3;
  st.tokens_per_s = (double)B * T / (st.ms * 1e-3);
  return st;
}

int train_session_status(train_session *s, char *err) {
  const train_ops *ops = s->model->ops;
  return ops->error ? ops->error(err) : 0;
}

float train_session_val_loss(train_session *s, int batches) {
  int B = s->opt.batch, T = s->opt.seq;
  double sum = 0.0;
  int n = 0;
  for (int k = 0; k < batches; k++) {
    if (!train_data_val_batch(s->data, k, B, T, s->inputs, s->targets)) break;
    sum += train_forward(s->model, s->inputs, s->targets, B, T);
    n++;
  }
  return n ? (float)(sum / n) : NAN;
}

void train_session_sample(train_session *s, const char *prompt, int n, char *out) {
  int T = s->opt.seq, V = s->opt.cfg.vocab;
  if (s->model->tp > 1) { /* a tensor-parallel rank holds V/T logits: nothing to draw from */
    memset(out, 0, (size_t)n + 1);
    return;
  }
  size_t plen = prompt ? strlen(prompt) : 0;
  int *ctx = malloc((plen + (size_t)n + 1) * sizeof(int));
  size_t len = 0;
  for (size_t i = 0; i < plen; i++) ctx[len++] = (unsigned char)prompt[i] % V;
  if (len == 0) ctx[len++] = '\n' % V;
  for (int i = 0; i < n; i++) {
    int t = len < (size_t)T ? (int)len : T;
    const int *win = ctx + len - t;
    train_forward(s->model, win, NULL, 1, t);
    train_copy_logits_to_host(s->model, s->logits);
    const float *l = s->logits + (size_t)(t - 1) * V;
    float mx = l[0];
    for (int v = 1; v < V; v++) mx = l[v] > mx ? l[v] : mx;
    double z = 0.0;
    for (int v = 0; v < V; v++) z += exp((double)(l[v] - mx));
    double r = train_rand_uniform(&s->sample_rng) * z, c = 0.0;
    int pick = V - 1;
    for (int v = 0; v < V; v++) {
      c += exp((double)(l[v] - mx));
      if (r < c) {
        pick = v;
        break;
      }
    }
    ctx[len++] = pick;
    out[i] = (char)(pick & 0xff);
  }
  out[n] = '\0';
  free(ctx);
}
