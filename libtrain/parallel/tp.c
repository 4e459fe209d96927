/*
 * tp.c — tensor parallelism: the tensor-parallel implementation of the model's layer
 * operations (model.h: train_layer_ops) — vocabulary-parallel embedding and
 * cross-entropy, column- and row-parallel Linear with Megatron's f and g inside them, the
 * sequence-parallel LayerNorm, the TP-aware gradient norm — which train_tp_attach
 * installs on the model (and train_tp_detach replaces with the single-process ones);
 * and shard/unshard of the parameters (the model's own slicing, train_param_slice, over
 * whole arrays). The contract and the picture are in tp.h.
 *
 * All collectives here are blocking (start + wait) on the TP group's backend: the next
 * layer needs their result. They never print or exit; a failure is kept in the context
 * and every later collective is skipped, so forward/backward run to their end on garbage
 * and the caller learns of it from train_tp_status.
 */
#include "parallel/strategy.h"
#include "parallel/tp.h"
#include "model/model.h"
#include "parallel/timeline.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* The context of the tensor-parallel layer operations (train_model.layer_ctx). */
typedef struct train_tp_ctx {
  train_backend *b;
  int failed;
  char err[TRAIN_ERRLEN];
  train_tp_stats st;
  float *buf; /* scratch for the loss's reductions: (T+2)*N floats */
  size_t buf_n;
  train_trace *trace;
  int trace_rank;
  /* sequence parallelism: staging for gathers and scatters, (N,C) each, and the
   * LayerNorm partial gradients (2C) */
  float *full, *stage, *part;
  size_t full_n, stage_n, part_n;
  /* --dtype bf16: activations cross the group in bfloat16 (the loss's statistics, the
   * gradient norm and the LayerNorms' partial weight gradients stay fp32); staging */
  uint16_t *w16a, *w16b;
  size_t w16a_n, w16b_n;
} train_tp_ctx;

static const train_layer_ops tp_layer_ops;

/* The group's context of a model whose layer operations are this file's, else NULL. */
static train_tp_ctx *ctx_of(const train_model *m) {
  /* installed, or under a table made over it (context parallelism) */
  for (const train_layer_ops *o = m->layer_ops; o; o = o->under)
    if (o == &tp_layer_ops) return m->layer_ctx;
  return NULL;
}

static void failf(train_model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void failf(train_model *m, const char *fmt, ...) {
  train_tp_ctx *c = ctx_of(m);
  if (!c || c->failed) return;
  c->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  char msg[TRAIN_ERRLEN];
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  train_errf(c->err, "%s", msg);
}

/* *p holds at least n floats (grown on demand); NULL (and the context failed) when out of
 * memory. */
static float *room(train_model *m, float **p, size_t *have, size_t n) {
  if (*have < n) {
    float *q = realloc(*p, n * sizeof(float));
    if (!q) {
      failf(m, "out of memory for %zu floats of tensor-parallel staging", n);
      return NULL;
    }
    *p = q;
    *have = n;
  }
  return *p;
}

/* ---- the split of each tensor (the model's train_param_slice) --------------------- */

int train_tp_config_check(const train_config *c, int tp, train_device dev, char *err) {
  if (train_config_check(c, err) != 0) return -1;
  return train_model_split_check(c, tp, dev, err);
}

/* The full and the local layouts, side by side (tensor i is the same tensor in both). */
static int layouts(const train_config *cfg, int tp, int rank, train_model **full, train_model **loc,
                   char *err) {
  *full = *loc = NULL;
  if (train_tp_config_check(cfg, tp, TRAIN_DEVICE_CPU, err) != 0) return -1;
  if (rank < 0 || rank >= tp) {
    train_errf(err, "tensor-parallel rank %d is not in 0..%d", rank, tp - 1);
    return -1;
  }
  /* models of batch 1 x 1: the layouts without meaningful activation memory */
  *full = train_model_create_tp(cfg, 1, 1, TRAIN_DEVICE_CPU, 1, 0, 1, 0, 0, err);
  *loc = *full ? train_model_create_tp(cfg, 1, 1, TRAIN_DEVICE_CPU, 1, 0, tp, rank, 0, err) : NULL;
  if (!*loc) {
    train_model_free(*full);
    *full = NULL;
    return -1;
  }
  return 0;
}

static int convert(const train_config *cfg, int tp, int rank, float *full, float *local,
                   int to_local, char *err) {
  train_model *fm, *lm;
  if (layouts(cfg, tp, rank, &fm, &lm, err) != 0) return -1;
  for (int i = 0; i < lm->ntensors; i++)
    train_param_slice(&fm->tensors[i], &lm->tensors[i], rank, full + fm->tensors[i].offset,
                      local + lm->tensors[i].offset, to_local);
  train_model_free(fm);
  train_model_free(lm);
  return 0;
}

int train_tp_shard(const train_config *cfg, int tp, int rank, const float *full, float *local,
                   char *err) {
  return convert(cfg, tp, rank, (float *)full, local, 1, err);
}

int train_tp_unshard(const train_config *cfg, int tp, int rank, const float *local, float *full,
                     char *err) {
  return convert(cfg, tp, rank, full, (float *)local, 0, err);
}

/* bf16 staging of n elements (grown as needed; NULL after a failure it records). */
static uint16_t *room16(train_model *m, uint16_t **p, size_t *have, size_t n) {
  if (*have < n) {
    uint16_t *q = realloc(*p, n * sizeof(uint16_t));
    if (!q) {
      failf(m, "out of memory for %zu bf16 values of tensor-parallel staging", n);
      return NULL;
    }
    *p = q;
    *have = n;
  }
  return *p;
}

/* ---- collectives inside the layer operations -------------------------------------- */

static int collective_done(train_tp_ctx *c, int rc, train_req req, const char *what) {
  train_backend *b = c->b;
  if (rc == 0) rc = b->wait(b, req);
  if (rc != 0 && !c->failed) {
    c->failed = 1;
    train_errf(c->err, "tensor-parallel %s: %s", what, b->err);
  }
  return rc;
}

static int group_sum(train_backend *b, float *x, size_t n) {
  train_req req = TRAIN_REQ_DONE;
  if (b->all_reduce(b, x, n, TRAIN_REDUCE_SUM, &req) != 0) return -1;
  return b->wait(b, req);
}

int train_tp_f_forward(train_backend *b, float *x, size_t n) {
  (void)b, (void)x, (void)n; /* every rank already holds the whole input */
  return 0;
}
int train_tp_f_backward(train_backend *b, float *dx, size_t n) { return group_sum(b, dx, n); }
int train_tp_g_forward(train_backend *b, float *x, size_t n) { return group_sum(b, x, n); }
int train_tp_g_backward(train_backend *b, float *dx, size_t n) {
  (void)b, (void)dx, (void)n; /* the sum's gradient reaches every rank's part whole */
  return 0;
}

/* Blocking sum over the group; `block` says whether it is one of the in-block f/g, `act`
 * whether it carries activations (their gradients included): bf16 on the wire under
 * --dtype bf16, the sum widened back (the model's working set is fp32). */
static void all_reduce(train_model *m, float *buf, size_t n, const char *what, int block, int act) {
  train_tp_ctx *c = ctx_of(m);
  if (c->failed) return;
  double t0 = train_now();
  int w16 = act && m->bf16;
  uint16_t *h = w16 ? room16(m, &c->w16a, &c->w16a_n, n) : NULL;
  if (w16 && !h) return;
  int rc;
  if (w16) {
    train_req req = TRAIN_REQ_DONE;
    m->ops->to_bf16(h, buf, n);
    rc = c->b->all_reduce_bf16(c->b, h, n, TRAIN_REDUCE_SUM, &req);
    if (rc == 0) rc = c->b->wait(c->b, req);
    if (rc == 0) m->ops->from_bf16(buf, h, n);
  } else {
    rc = group_sum(c->b, buf, n);
  }
  if (rc != 0) {
    c->failed = 1;
    train_errf(c->err, "tensor-parallel %s: %s", what, c->b->err);
  }
  double t1 = train_now();
  c->st.calls++;
  if (block) {
    c->st.block_calls++;
    c->st.bytes += (double)n * (w16 ? sizeof(uint16_t) : sizeof(float));
    c->st.ms += (t1 - t0) * 1e3;
  } else {
    c->st.other_ms += (t1 - t0) * 1e3;
  }
  if (c->trace) train_trace_add(c->trace, c->trace_rank, TRAIN_TRACE_COMM, what, t0, t1);
}

/* Blocking reduce-scatter (sum) of send (T*recvcount) into this rank's block, written to
 * the first recvcount floats of send itself (through the staging buffer: the backend's
 * receive buffer must not overlap its send buffer). */
static void reduce_scatter(train_model *m, float *buf, size_t recvcount, const char *what,
                           int block) {
  train_tp_ctx *c = ctx_of(m);
  float *st = room(m, &c->stage, &c->stage_n, recvcount);
  if (c->failed || !st) return;
  double t0 = train_now();
  train_req req = TRAIN_REQ_DONE;
  if (m->bf16) { /* activations: bf16 on the wire (as all_reduce) */
    uint16_t *a = room16(m, &c->w16a, &c->w16a_n, recvcount * m->tp),
             *r = room16(m, &c->w16b, &c->w16b_n, recvcount);
    if (!a || !r) return;
    m->ops->to_bf16(a, buf, recvcount * m->tp);
    int rc = c->b->reduce_scatter_bf16(c->b, a, r, recvcount, TRAIN_REDUCE_SUM, &req);
    if (collective_done(c, rc, req, what) == 0) m->ops->from_bf16(buf, r, recvcount);
  } else {
    int rc = c->b->reduce_scatter(c->b, buf, st, recvcount, TRAIN_REDUCE_SUM, &req);
    collective_done(c, rc, req, what);
    memcpy(buf, st, recvcount * sizeof(float));
  }
  double t1 = train_now();
  c->st.calls++;
  if (block) {
    c->st.block_calls++;
    c->st.bytes += (double)recvcount * m->tp * (m->bf16 ? sizeof(uint16_t) : sizeof(float));
    c->st.ms += (t1 - t0) * 1e3;
  } else {
    c->st.other_ms += (t1 - t0) * 1e3;
  }
  if (c->trace) train_trace_add(c->trace, c->trace_rank, TRAIN_TRACE_COMM, what, t0, t1);
}

/* Blocking all-gather of send (count floats) from every rank into recv (T*count). */
static void all_gather(train_model *m, const float *send, float *recv, size_t count,
                       const char *what, int block) {
  train_tp_ctx *c = ctx_of(m);
  if (c->failed) return;
  double t0 = train_now();
  train_req req = TRAIN_REQ_DONE;
  if (m->bf16) { /* activations: bf16 on the wire (as all_reduce) */
    uint16_t *a = room16(m, &c->w16a, &c->w16a_n, count),
             *r = room16(m, &c->w16b, &c->w16b_n, count * m->tp);
    if (!a || !r) return;
    m->ops->to_bf16(a, send, count);
    int rc = c->b->all_gather(c->b, a, r, count * sizeof(uint16_t), &req);
    if (collective_done(c, rc, req, what) == 0) m->ops->from_bf16(recv, r, count * m->tp);
  } else {
    int rc = c->b->all_gather(c->b, send, recv, count * sizeof(float), &req);
    collective_done(c, rc, req, what);
  }
  double t1 = train_now();
  c->st.calls++;
  if (block) {
    c->st.block_calls++;
    c->st.bytes += (double)count * m->tp * (m->bf16 ? sizeof(uint16_t) : sizeof(float));
    c->st.ms += (t1 - t0) * 1e3;
  } else {
    c->st.other_ms += (t1 - t0) * 1e3;
  }
  if (c->trace) train_trace_add(c->trace, c->trace_rank, TRAIN_TRACE_COMM, what, t0, t1);
}

/* f backward: the column-parallel Linear's input gradient, summed over the group; under
 * SP only this rank's rows of the sum are needed (the LayerNorm below holds only those).
 * `block`: one of the four per block (the LM head's is counted apart). */
static void f_backward(train_model *m, float *buf, size_t n, const char *what, int block) {
  if (m->seq_shards > 1)
    reduce_scatter(m, buf, n / m->tp, what, block);
  else
    all_reduce(m, buf, n, what, block, 1);
}

/* f forward under SP: rows [r*Nr, r*Nr + Nr) of buf, from every rank r, into buf. */
static void sp_gather(train_model *m, float *buf, int Nr, int C, const char *what) {
  train_tp_ctx *c = ctx_of(m);
  size_t n = (size_t)Nr * C;
  float *st = room(m, &c->stage, &c->stage_n, n);
  if (!st) return;
  memcpy(st, buf + (size_t)m->tp_rank * n, n * sizeof(float));
  all_gather(m, st, buf, n, what, !!strncmp(what, "f head", 6));
}

/* g backward under SP: every rank's rows of the residual gradient, (N,C). */
static const float *sp_gather_grad(train_model *m, const float *dres, int Nr, int C,
                                   const char *what) {
  train_tp_ctx *c = ctx_of(m);
  size_t n = (size_t)Nr * C;
  float *full = room(m, &c->full, &c->full_n, n * m->tp);
  if (!full) return dres; /* failed: the numbers no longer matter */
  all_gather(m, dres, full, n, what, 1);
  return full;
}

/* A zeroed (2C) buffer for a LayerNorm's partial weight/bias gradients over this rank's
 * rows. */
static float *ln_partial(train_model *m) {
  train_tp_ctx *c = ctx_of(m);
  size_t n = 2 * (size_t)m->cfg.channels;
  if (!room(m, &c->part, &c->part_n, n)) {
    static float sink[2 * 65536]; /* failed: somewhere harmless to write */
    return sink;
  }
  memset(c->part, 0, n * sizeof(float));
  return c->part;
}

/* Each rank's LayerNorm saw only its rows: dw = sum over ranks of the partial sums (the
 * reduction Megatron-LM #1446 was about: without it the replicated weights drift apart). */
static void ln_partial_done(train_model *m, float *dw, float *db, const char *what) {
  train_tp_ctx *c = ctx_of(m);
  int C = m->cfg.channels;
  if (!c->part || c->part_n < 2 * (size_t)C) return;
  all_reduce(m, c->part, 2 * (size_t)C, what, 0, 0);
  for (int i = 0; i < C; i++) {
    dw[i] += c->part[i];
    db[i] += c->part[C + i];
  }
  memset(c->part, 0, 2 * (size_t)C * sizeof(float)); /* ready for the next LayerNorm */
}

/* out (N,C) holds this rank's partial product x_r W_r^T of a row-parallel Linear:
 * y = sum_r x_r W_r^T + b, so sum first (g), then add the bias once. */
static void g_forward(train_model *m, float *out, const float *b, int N, int C, const char *what) {
  if (m->seq_shards > 1) { /* g under SP: only this rank's rows of the sum */
    N /= m->tp;
    reduce_scatter(m, out, (size_t)N * C, what, 1);
  } else {
    all_reduce(m, out, (size_t)N * C, what, 1, 1);
  }
  for (int n = 0; n < N; n++) {
    float *o = out + (size_t)n * C;
    for (int i = 0; i < C; i++) o[i] += b[i];
  }
}

/* out (B,T,C) = sum_r [id in r's rows] wte_r[id - r*Vl] + wpe[t]: exactly one rank adds
 * a non-zero row, so the sum is that row bit for bit, and wpe is added after it as on one
 * process. */
static void embed_forward(train_model *m, float *out, const int *inp, const float *wte,
                          const float *wpe, int B, int T, int C) {
  int Vl = m->vocab_local, lo = m->tp_rank * Vl;
  if (m->seq_shards > 1) { /* the sum reduce-scattered: this rank's N/T rows, then their
                            * positions */
    train_tp_ctx *c = ctx_of(m);
    int N = B * T, Nr = N / m->tp;
    float *full = room(m, &c->full, &c->full_n, (size_t)N * C);
    if (!full) return;
    for (int bt = 0; bt < N; bt++) {
      int id = inp[bt] - lo;
      if (id >= 0 && id < Vl)
        memcpy(full + (size_t)bt * C, wte + (size_t)id * C, (size_t)C * sizeof(float));
      else
        memset(full + (size_t)bt * C, 0, (size_t)C * sizeof(float));
    }
    reduce_scatter(m, full, (size_t)Nr * C, "embedding", 0);
    for (int i = 0; i < Nr; i++) {
      const float *pe = wpe + (size_t)((m->tp_rank * Nr + i) % T) * C;
      float *o = out + (size_t)i * C;
      for (int k = 0; k < C; k++) o[k] = full[(size_t)i * C + k] + pe[k];
    }
    return;
  }
  for (int bt = 0; bt < B * T; bt++) {
    float *o = out + (size_t)bt * C;
    int id = inp[bt] - lo;
    if (id >= 0 && id < Vl)
      memcpy(o, wte + (size_t)id * C, (size_t)C * sizeof(float));
    else
      memset(o, 0, (size_t)C * sizeof(float));
  }
  all_reduce(m, out, (size_t)B * T * C, "embedding", 0, 1);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      float *o = out + ((size_t)b * T + t) * C;
      const float *pe = wpe + (size_t)t * C;
      for (int i = 0; i < C; i++) o[i] += pe[i];
    }
}

/* dout (B,T,C) is whole on every rank: each rank scatters it into the rows it holds; wpe
 * (replicated) gets the same gradient on every rank. */
static void embed_backward(train_model *m, float *dwte, float *dwpe, const float *dout,
                           const int *inp, int B, int T, int C) {
  int Vl = m->vocab_local, lo = m->tp_rank * Vl;
  if (m->seq_shards > 1) { /* all rows of the gradient (reduce-scatter's backward is an
                            * all-gather) */
    train_tp_ctx *c = ctx_of(m);
    size_t n = (size_t)B * T / m->tp * C;
    float *full = room(m, &c->full, &c->full_n, n * m->tp);
    if (!full) return;
    all_gather(m, dout, full, n, "embedding bwd", 0);
    dout = full;
  }
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float *d = dout + ((size_t)b * T + t) * C;
      int id = inp[b * T + t] - lo;
      float *dpe = dwpe + (size_t)t * C;
      for (int i = 0; i < C; i++) dpe[i] += d[i];
      if (id >= 0 && id < Vl) {
        float *dwe = dwte + (size_t)id * C;
        for (int i = 0; i < C; i++) dwe[i] += d[i];
      }
    }
}

/* Columns of the local logits that are real vocabulary entries (the rest is padding). */
static int valid_cols(const train_model *m) {
  int v = m->cfg.vocab - m->tp_rank * m->vocab_local;
  return v < 0 ? 0 : v > m->vocab_local ? m->vocab_local : v;
}

/*
 * Vocabulary-parallel softmax cross-entropy over logits (N,Vl), rank r holding columns
 * [r*Vl, r*Vl + Vl):
 *   mx_n  = max_r max_j l_nj              (all-gather of the N local maxima; its max)
 *   s_n   = sum_r sum_j exp(l_nj - mx_n)  (all-reduce)
 *   z_n   = l_n,target                     (all-reduce: the holder's value, zeros elsewhere)
 *   loss_n = log s_n + mx_n - z_n,  probs_nj = exp(l_nj - mx_n) / s_n
 * s and z travel in one all-reduce of 2N floats. The full (N,V) logits never exist.
 */
static void xent_forward(train_model *m, float *losses, float *probs, const float *logits,
                         const int *targets, int N) {
  train_tp_ctx *c = ctx_of(m);
  int Vl = m->vocab_local, nv = valid_cols(m), lo = m->tp_rank * Vl, P = m->tp;
  size_t need = (size_t)(P + 3) * N;
  if (c->buf_n < need) {
    float *nb = realloc(c->buf, need * sizeof(float));
    if (!nb) {
      if (!c->failed) {
        c->failed = 1;
        train_errf(c->err, "out of memory for the vocabulary-parallel loss");
      }
      return;
    }
    c->buf = nb;
    c->buf_n = need;
  }
  float *mxl = c->buf, *mxall = c->buf + N, *sz = c->buf + (size_t)(P + 1) * N;
  for (int n = 0; n < N; n++) {
    const float *l = logits + (size_t)n * Vl;
    float mx = -INFINITY;
    for (int j = 0; j < nv; j++) mx = l[j] > mx ? l[j] : mx;
    mxl[n] = mx;
  }
  if (!c->failed) {
    double t0 = train_now();
    train_req req = TRAIN_REQ_DONE;
    int rc = c->b->all_gather(c->b, mxl, mxall, (size_t)N * sizeof(float), &req);
    collective_done(c, rc, req, "loss max");
    c->st.calls++;
    c->st.other_ms += (train_now() - t0) * 1e3;
    if (c->trace)
      train_trace_add(c->trace, c->trace_rank, TRAIN_TRACE_COMM, "loss max", t0, train_now());
  }
  for (int n = 0; n < N; n++) {
    float mx = mxall[n];
    for (int r = 1; r < P; r++) mx = mxall[(size_t)r * N + n] > mx ? mxall[(size_t)r * N + n] : mx;
    mxl[n] = mx; /* the global maximum from here on */
    const float *l = logits + (size_t)n * Vl;
    float *p = probs + (size_t)n * Vl;
    float s = 0.0f;
    for (int j = 0; j < nv; j++) {
      p[j] = expf(l[j] - mx);
      s += p[j];
    }
    for (int j = nv; j < Vl; j++) p[j] = 0.0f;
    int t = targets[n] - lo;
    sz[n] = s;
    sz[N + n] = t >= 0 && t < nv ? l[t] : 0.0f;
  }
  all_reduce(m, sz, 2 * (size_t)N, "loss sums", 0, 0);
  for (int n = 0; n < N; n++) {
    float s = sz[n], inv = 1.0f / s;
    float *p = probs + (size_t)n * Vl;
    for (int j = 0; j < nv; j++) p[j] *= inv;
    losses[n] = logf(s) + mxl[n] - sz[N + n];
  }
}

/* dlogits (N,Vl) += (probs - onehot(target)) * dloss, on the local columns. */
static void xent_backward(train_model *m, float *dlogits, const float *probs, const int *targets,
                          float dloss, int N) {
  int Vl = m->vocab_local, nv = valid_cols(m), lo = m->tp_rank * Vl;
  for (int n = 0; n < N; n++) {
    const float *p = probs + (size_t)n * Vl;
    float *d = dlogits + (size_t)n * Vl;
    for (int j = 0; j < nv; j++) d[j] += p[j] * dloss;
    int t = targets[n] - lo;
    if (t >= 0 && t < nv) d[t] -= dloss;
  }
}

/* |g|^2 = sum over the split tensors of every rank's slice + the replicated tensors once
 * (they are identical on every rank). */
static double grad_sumsq(train_model *m) {
  double split = 0.0, rep = 0.0;
  for (int i = 0; i < m->ntensors; i++) {
    const train_param *p = &m->tensors[i];
    double s = m->bf16 ? m->ops->sumsq_bf16(m->grads16 + p->offset, p->numel)
                       : m->ops->sumsq(m->grads + p->offset, p->numel);
    if (train_param_is_split(p->name))
      split += s;
    else
      rep += s;
  }
  float part = (float)split;
  all_reduce(m, &part, 1, "grad norm", 0, 0);
  return (double)part + rep;
}

int train_tp_group_sum(train_model *m, float *x, char *err) {
  all_reduce(m, x, 1, "grad norm", 0, 0);
  const train_tp_ctx *c = ctx_of(m);
  if (c && c->failed) {
    train_errf(err, "%s", c->err);
    return -1;
  }
  return 0;
}

/* ---- the layer operations ------------------------------------------------------------ */

/* The LayerNorm of this rank's rows at their place in out; under SP the other ranks'
 * rows are gathered (f forward: the column-parallel Linear after it needs all N). */
static void ln_forward(train_model *m, float *out, float *mean, float *rstd, const float *inp,
                       const float *w, const float *b, int Nr, int C, const char *what) {
  m->ops->layernorm_forward(out + (size_t)m->seq_rank * Nr * C, mean, rstd, inp, w, b, Nr, C);
  if (m->seq_shards > 1) sp_gather(m, out, Nr, C, what);
}

/* Under SP each rank's LayerNorm saw only its rows: its weight gradients are partial sums,
 * completed over the group before they are added (ln_partial_done). */
static void ln_backward(train_model *m, float *dinp, float *dw, float *db, const float *dout,
                        const float *inp, const float *w, const float *mean, const float *rstd,
                        int Nr, int C, const char *what) {
  if (m->seq_shards == 1) {
    m->ops->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, Nr, C);
    return;
  }
  float *part = ln_partial(m); /* (2C) */
  m->ops->layernorm_backward(dinp, part, part + C, dout, inp, w, mean, rstd, Nr, C);
  ln_partial_done(m, dw, db, what);
}

/* f forward is the identity: every rank holds the whole input (ln_forward gathered it) */
static void col_forward(train_model *m, float *out, const float *inp, const float *w,
                        const float *b, int N, int C, int OC) {
  m->ops->matmul_forward(out, inp, w, b, N, C, OC);
}

static void col_backward(train_model *m, float *dinp, float *dw, float *db, const float *dout,
                         const float *inp, const float *w, int N, int C, int OC, const char *what) {
  m->ops->matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC);
  f_backward(m, dinp, (size_t)N * C, what, 1);
}

static void head_backward(train_model *m, float *dinp, float *dw, const float *dout,
                          const float *inp, const float *w, int N, int C, int V) {
  m->ops->matmul_backward(dinp, dw, NULL, dout, inp, w, N, C, V);
  f_backward(m, dinp, (size_t)N * C, "f head", 0);
}

/* The bias waits for g: added to every rank's partial product it would be summed T times. */
static void row_forward(train_model *m, float *out, const float *inp, const float *w,
                        const float *b, int N, int C, int OC, const char *what) {
  m->ops->matmul_forward(out, inp, w, NULL, N, C, OC);
  g_forward(m, out, b, N, OC, what);
}

/* g backward is the identity, but under SP this rank holds only its rows of the output's
 * gradient and the matmul's backward needs all N. */
static void row_backward(train_model *m, float *dinp, float *dw, float *db, const float *dout,
                         const float *inp, const float *w, int N, int C, int OC, const char *what) {
  if (m->seq_shards > 1) dout = sp_gather_grad(m, dout, N / m->seq_shards, OC, what);
  m->ops->matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC);
}

static void fail(train_model *m, const char *msg) { failf(m, "%s", msg); }

static const train_layer_ops tp_layer_ops = {
    .name = "tensor-parallel",
    .embed_forward = embed_forward,
    .embed_backward = embed_backward,
    .ln_forward = ln_forward,
    .ln_backward = ln_backward,
    .col_forward = col_forward,
    .col_backward = col_backward,
    .head_backward = head_backward,
    .row_forward = row_forward,
    .row_backward = row_backward,
    .xent_forward = xent_forward,
    .xent_backward = xent_backward,
    .attn_forward = train_local_attn_forward, /* heads are local: nothing to communicate */
    .attn_backward = train_local_attn_backward,
    .grad_sumsq = grad_sumsq,
    .fail = fail,
};

/* ---- attaching a group -------------------------------------------------------------- */

int train_tp_attach(train_session *s, train_backend *b, char *err) {
  train_model *m = s->model;
  if (b->nranks != m->tp || b->rank != m->tp_rank) {
    train_errf(err,
               "tensor-parallel group of %d ranks (this one %d) for a model made "
               "for rank %d of %d",
               b->nranks, b->rank, m->tp_rank, m->tp);
    return -1;
  }
  if (m->tp <= 1) return 0; /* nothing to communicate */
  if (m->bf16 && (!b->all_reduce_bf16 || !b->reduce_scatter_bf16)) {
    train_errf(err,
               "--dtype bf16 with --tp: the %s backend cannot reduce bfloat16; use "
               "--backend coll",
               b->name);
    return -1;
  }
  train_tp_ctx *c = calloc(1, sizeof *c);
  if (!c) {
    train_errf(err, "out of memory for the tensor-parallel context");
    return -1;
  }
  c->b = b;
  /* every rank must hold the same replicated tensors: compare their hashes */
  uint64_t h = TRAIN_FNV_INIT;
  for (int i = 0; i < m->ntensors; i++)
    if (!train_param_is_split(m->tensors[i].name))
      h = train_fnv1a(h, m->params + m->tensors[i].offset, m->tensors[i].numel * sizeof(float));
  uint64_t *all = calloc((size_t)b->nranks, sizeof *all);
  train_req req = TRAIN_REQ_DONE;
  if (!all) {
    free(c);
    train_errf(err, "out of memory for the tensor-parallel check");
    return -1;
  }
  if (b->all_gather(b, &h, all, sizeof h, &req) != 0 || b->wait(b, req) != 0) {
    train_errf(err, "tensor-parallel start-up: %s", b->err);
    free(all);
    free(c);
    return -1;
  }
  for (int r = 1; r < b->nranks; r++)
    if (all[r] != all[0]) {
      train_errf(err,
                 "tensor-parallel ranks 0 and %d hold different replicated "
                 "weights (started from different seeds or checkpoints?)",
                 r);
      free(all);
      free(c);
      return -1;
    }
  free(all);
  m->layer_ctx = c;
  m->layer_ops = &tp_layer_ops; /* from here the passes communicate */
  return 0;
}

void train_tp_detach(train_session *s) {
  train_tp_ctx *c = s && s->model ? ctx_of(s->model) : NULL;
  if (!c) return;
  free(c->buf);
  free(c->full);
  free(c->stage);
  free(c->part);
  free(c->w16a);
  free(c->w16b);
  free(c);
  s->model->layer_ops = train_local_layer_ops();
  s->model->layer_ctx = NULL;
}

int train_tp_status(const train_session *s, char *err) {
  const train_tp_ctx *c = ctx_of(s->model);
  if (c && c->failed) {
    train_errf(err, "%s", c->err);
    return -1;
  }
  return 0;
}

void train_tp_stats_read(train_session *s, train_tp_stats *out, int reset) {
  train_tp_ctx *c = ctx_of(s->model);
  if (!c) {
    memset(out, 0, sizeof *out);
    return;
  }
  *out = c->st;
  if (reset) memset(&c->st, 0, sizeof c->st);
}

void train_tp_set_trace(train_session *s, train_trace *tr, int rank) {
  train_tp_ctx *c = ctx_of(s->model);
  if (!c) return;
  c->trace = tr;
  c->trace_rank = rank;
}

/* ---- the planner's rows ---------------------------------------------------------------- */

int train_tp_plan(const train_config *cfg, int B, int S, int tp, int dp, int sp, int zero,
                  int recompute, int bf16, double fixed, train_plan_row *r, long *inblock,
                  double *inblock_bytes, char *err) {
  if (train_tp_config_check(cfg, tp, TRAIN_DEVICE_CPU, err) != 0) return -1;
  if (train_shape_check(cfg, B, S, err) != 0) return -1; /* what a run would refuse */
  if (dp < 1 || B < 1 || S < 1) {
    train_errf(err, "impossible plan: %d data-parallel groups, batch %d, seq %d", dp, B, S);
    return -1;
  }
  if (zero < 0 || zero > 3) {
    train_errf(err, "impossible plan: ZeRO stage %d", zero);
    return -1;
  }
  size_t P = 0, A = 0, *ul = calloc((size_t)cfg->layers + 2, sizeof *ul);
  train_split split = {.tp = tp, .sp = sp, .recompute = recompute, .bf16 = bf16};
  if (!ul || train_model_sizes_split(cfg, B, S, &split, &P, &A, ul) != 0) {
    free(ul);
    train_errf(err, "out of memory planning");
    return -1;
  }
  /* one B·S·C activation on the wire (bf16: 2 bytes an element; the loss's 3·B·S and
   * the gradient norm stay fp32) */
  double f = 4.0, act = (double)B * S * cfg->channels * (bf16 ? 2.0 : f);
  double ring_t = 2.0 * (tp - 1) / tp, ring_d = 2.0 * (dp - 1) / dp;
  long nblock = 4L * cfg->layers;
  static const char *zn[2][4] = {{"", "TPxZ1", "TPxZ2", "TPxZ3"}, {"", "SPxZ1", "SPxZ2", "SPxZ3"}};
  double tp_sent = ring_t * ((double)(nblock + 2) * act + 3.0 * B * S * f);
  memset(r, 0, sizeof *r);
  if (zero > 0 && dp > 1) { /* FSDP along D over this TP rank's slice: the FSDP rows' sums
                             * over the slice's units, plus TP's own traffic */
    train_plan_fill(ul, cfg->layers, P, A, dp, 1, (train_strategy)(TRAIN_PLAN_ZERO1 + zero - 1),
                    fixed, r);
    r->name = zn[!!sp][zero];
    r->sent += tp_sent;
    free(ul);
    goto out;
  }
  free(ul);
  r->name = dp > 1 ? (sp ? "SPxDDP" : "TPxDDP") : sp ? "TP+SP" : "TP";
  r->params = f * P;
  r->grads = f * P;
  r->optim = 2 * f * P;
  r->acts = (double)A;
  r->fixed = fixed;
  r->sent = tp_sent + ring_d * f * P;
  if (bf16) { /* the slice's 2 + 2 + 12 bytes a parameter, its gradients all-reduced in bf16 */
    r->params = 2.0 * P;
    r->grads = 2.0 * P;
    r->optim = 12.0 * P;
    r->sent = tp_sent + ring_d * 2.0 * P;
  }
  r->total = r->params + r->grads + r->optim + r->acts + r->fixed;
out:
  if (inblock) *inblock = nblock;
  if (inblock_bytes) *inblock_bytes = act;
  return 0;
}

/* ---- tensor parallelism as a strategy (strategy.h) ------------------------------------
 * It wraps the data-parallel strategy of the grid's data-parallel group (`inner`): the
 * model's passes talk to the tensor-parallel group through the layer operations attached
 * here, a step is the inner strategy's step, and a checkpoint is every TP rank's slice
 * (gathered from the inner strategy's shards where it shards). Evaluation is collective
 * (every rank of a TP group runs the forward) and no rank can sample alone (it holds V/T
 * of the logits). */

typedef struct tp_strategy {
  train_trace trace; /* --trace: the collectives inside the model, and each step */
} tp_strategy;

static int tp_strategy_status(const train_parallel *p, char *err) {
  if (train_tp_status(p->s, err) != 0) return -1;
  return p->inner->ops->status ? p->inner->ops->status(p->inner, err) : 0;
}

static int tp_strategy_step(train_parallel *p, train_step_report *r, char *err) {
  if (p->inner->ops->step(p->inner, r, err) != 0) return -1;
  train_tp_stats tps;
  train_tp_stats_read(p->s, &tps, 1);
  r->tp_ms = tps.ms;
  r->tp_other_ms = tps.other_ms;
  r->tp_bytes = tps.bytes;
  r->tp_calls = tps.block_calls;
  if (p->opt.trace) {
    tp_strategy *t = p->impl;
    double now = train_now();
    train_trace_add(&t->trace, p->grid->world->rank, TRAIN_TRACE_COMPUTE, "step",
                    now - r->step.ms * 1e-3, now);
  }
  return 0;
}

static int tp_strategy_eval_begin(train_parallel *p, char *err) {
  return p->inner->ops->eval_begin ? p->inner->ops->eval_begin(p->inner, err) : 0;
}

/* Every TP rank's slice, as the inner strategy keeps it (DDP: DP rank 0 of each TP group
 * writes it; FSDP: every rank its shard of it); rank 0 writes the manifest last. */
static int tp_strategy_save(train_parallel *p, const char *path, char *what, size_t wn, char *err) {
  int S = p->inner->zero ? p->grid->D : 1;
  snprintf(what, wn, " (manifest; %d x %d shards %s.shard<t>.<s>of%dx%d)", p->grid->T, S, path,
           p->grid->T, S);
  return p->inner->ops->save_slice(p->inner, p->grid->world, p->grid->tp, path, err);
}

static int tp_strategy_finish(train_parallel *p, const char *trace_path, char *err) {
  tp_strategy *t = p->impl;
  if (p->inner->ops->finish(p->inner, NULL, err) != 0) return -1;
  return trace_path ? train_trace_gather_write(p->grid->world, &t->trace, trace_path, err) : 0;
}

static void tp_strategy_describe(train_parallel *p, char *out, size_t n) {
  const train_config *cfg = &p->s->opt.cfg;
  int T = p->grid->T;
  out[0] = '\0';
  train_appendf(out, n,
                "coll-train: tensor parallel: %d x %d grid (%s backend): T = %d "
                "ranks per tensor-parallel group (heads %d, MLP rows %d, vocabulary rows %d "
                "of %d per rank), D = %d data-parallel groups (--parallel %s); %zu "
                "parameters per rank%s\n",
                T, p->grid->D, p->grid->world->name, T, cfg->heads / T, 4 * cfg->channels / T,
                (cfg->vocab + T - 1) / T, cfg->vocab, p->grid->D, p->inner->ops->name,
                train_num_params(train_session_model(p->s)),
                p->opt.sp ? "; sequence parallel (--sp)" : "");
  p->inner->ops->describe(p->inner, out + strlen(out), n - strlen(out));
}

static void tp_strategy_step_line(const train_parallel *p, const train_step_report *r, char *out,
                                  size_t n) {
  p->inner->ops->step_line(p->inner, r, out, n);
  train_appendf(out, n, " | tp all-reduce %5.1f ms in blocks (%ld), %5.1f ms other", r->tp_ms,
                r->tp_calls, r->tp_other_ms);
}

static void tp_strategy_summary(const train_parallel *p, const train_step_report *later,
                                long nlater, double seconds, const train_step_report *all,
                                long nall, char *out, size_t n) {
  p->inner->ops->summary(p->inner, later, nlater, seconds, all, nall, out, n);
  if (nlater < 1) return;
  train_appendf(out, n,
                "tp: per step after the first: %.1f in-block collectives "
                "(all-reduces; with --sp all-gathers and reduce-scatters) over %.0f bytes, "
                "%.2f ms (%.1f%% of the step), %.2f ms in the embedding/loss/norm "
                "collectives\n",
                (double)later->tp_calls / (double)nlater,
                later->tp_calls ? later->tp_bytes / (double)later->tp_calls : 0.0,
                later->tp_ms / (double)nlater,
                seconds > 0 ? 100.0 * later->tp_ms * 1e-3 / seconds : 0.0,
                later->tp_other_ms / (double)nlater);
}

static int tp_strategy_plan(const train_parallel *p, double fixed, train_plan_row *out, char *err) {
  const train_options *o = &p->s->opt;
  return train_tp_plan(&o->cfg, o->batch, o->seq, p->grid->T, p->grid->D, p->opt.sp, p->inner->zero,
                       o->recompute, o->bf16, fixed, out, NULL, NULL, err);
}

static void tp_strategy_free(train_parallel *p) {
  tp_strategy *t = p->impl;
  train_tp_detach(p->s);
  train_parallel_free(p->inner);
  train_trace_free(&t->trace);
  free(t);
  free(p);
}

static const train_parallel_ops tp_strategy_ops = {
    .name = "tp",
    .step = tp_strategy_step,
    .eval_begin = tp_strategy_eval_begin,
    .save = tp_strategy_save,
    .finish = tp_strategy_finish,
    .describe = tp_strategy_describe,
    .step_line = tp_strategy_step_line,
    .summary = tp_strategy_summary,
    .plan = tp_strategy_plan,
    .status = tp_strategy_status,
    .free = tp_strategy_free,
};

train_parallel *train_tp_strategy_create(train_session *s, train_grid *g,
                                         const train_parallel_options *opt,
                                         train_parallel_create_fn inner, char *err) {
  train_parallel *p = train_parallel_new(&tp_strategy_ops, s, g, opt);
  tp_strategy *t = calloc(1, sizeof *t);
  if (!p || !t) {
    free(p);
    free(t);
    train_errf(err, "out of memory");
    return NULL;
  }
  p->impl = t;
  p->eval_everywhere = 1;
  p->can_sample = 0;
  if (train_tp_attach(s, g->tp, err) != 0) {
    free(t);
    free(p);
    return NULL;
  }
  if (opt->trace) train_tp_set_trace(s, &t->trace, g->world->rank);
  if (!(p->inner = inner(s, g, opt, err))) {
    train_tp_detach(s);
    train_trace_free(&t->trace);
    free(t);
    free(p);
    return NULL;
  }
  p->rows_mult = p->inner->rows_mult;
  p->zero = p->inner->zero;
  return p;
}
