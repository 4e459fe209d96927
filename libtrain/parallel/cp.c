/*
 * cp.c — context parallelism (the picture and the contract are in cp.h): the model's
 * embedding and attention as layer operations over the CP ring's group — positions of
 * the rank's two chunks for wpe, ring attention with the log-sum-exp merge, Ulysses'
 * all-to-alls — installed by cp_attach over the operations already installed (the
 * single-process ones, or tensor parallelism's, which it calls for the other layers:
 * train_layer_ops.under); and context parallelism as a strategy that wraps the
 * data-parallel one (DDP over the grid's D x Cp gradient group), or tensor parallelism
 * wrapping it under --tp.
 *
 * It must never print or exit: a failed transfer inside a pass is kept in the context
 * (every later transfer is skipped, so the pass runs to its end on garbage) and the
 * strategy's status reports it after the step. It must never name the model's
 * internals beyond model.h's tables, and never hold a second copy of the weights.
 *
 * Ring attention, for CP rank r of C with queries Q (its T/C rows) at their positions:
 *   step s = 0..C-1 holds the K/V block of rank src = (r - s) mod C; it starts the
 *   transfer of that block to rank r+1 (and the receive of the next from r-1), computes
 *   Q against the block under the causal mask by true positions (a key at position pk
 *   is seen by a query at pq iff pk <= pq), then waits for the transfer.
 *   A block's partial result for one query row and head is (o_s, lse_s):
 *     lse_s = log sum_k exp(q.k/sqrt(hs)),  o_s = sum_k exp(q.k/sqrt(hs) - lse_s) v_k
 *   (lse_s = -inf, o_s = 0 when the mask hides the whole block), merged with the running
 *   (o, lse) by
 *     lse' = m + log(e^(lse - m) + e^(lse_s - m)),  m = max(lse, lse_s)   (stable)
 *     o'   = e^(lse - lse') o + e^(lse_s - lse') o_s
 *   so that after the last step (o, lse) is the softmax attention over every key. The
 *   final lse per row and head (B,NH,T/C) is all backward keeps beside the output o the
 *   model keeps anyway (the lse in the model's att buffer, which it fits): backward
 *   recomputes each block's probabilities
 *   p = exp(q.k/sqrt(hs) - lse) as FlashAttention does, with D = dO.o per row:
 *     dv_k += p dO,  ds = p (dO.v_k - D),  dq += ds k / sqrt(hs),  dk_k += ds q / sqrt(hs)
 *   The K/V blocks go round again (started before each block's compute); each block's
 *   dK/dV partial sum follows one step behind: a rank adds its contribution to the sum
 *   it received from r-1 and passes it to r+1, so after C steps the sum reaches the
 *   block's owner (Megatron-LM's and ring attention's scheme).
 *
 * On the CPU over libcoll the transfers are started on the backend's streams
 * (train_backend.exchange_start): libcoll's progress thread moves the bytes while this
 * thread computes the block, so the ring step's transfer can overlap the block's
 * attention as far as the cores allow (the copies need a core too; the time still
 * blocked in the wait is counted and reported); on a backend without it (Open MPI here)
 * exchange is blocking and the transfer precedes the compute.
 */
#include "parallel/cp.h"
#include "model/model.h"
#include "parallel/planner.h"
#include "parallel/strategy.h"
#include "parallel/tp.h"
#include "parallel/timeline.h"

#include <cblas.h>
#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- the chunks --------------------------------------------------------------------- */

void train_cp_take(const int *full, int *mine, int B, int T, int C, int r) {
  int Tl = T / C;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < Tl; t++)
      mine[(size_t)b * Tl + t] = full[(size_t)b * T + train_cp_pos(T, C, r, t)];
}

int train_cp_check(const train_config *cfg, int T, int C, int ulysses, int tp, char *err) {
  tp = tp > 1 ? tp : 1;
  if (C < 1) {
    train_errf(err, "--cp %d: the context-parallel size must be at least 1", C);
    return -1;
  }
  if (C == 1) return 0;
  if (T % (2 * C) != 0) {
    train_errf(err,
               "--cp %d: --seq %d is not a multiple of 2 x %d: each sequence is cut into 2C "
               "chunks and CP rank r holds chunks r and 2C-1-r (causal load balancing)",
               C, T, C);
    return -1;
  }
  if (ulysses && cfg->heads % (C * tp) != 0) {
    if (tp > 1)
      train_errf(err,
                 "--cp %d --cp-mode ulysses: the %d heads of each of --tp %d ranks cannot be "
                 "split evenly over %d context-parallel ranks: heads must be a multiple of "
                 "--cp x --tp",
                 C, cfg->heads / tp, tp, C);
    else
      train_errf(err,
                 "--cp %d --cp-mode ulysses: the %d attention heads cannot be split evenly over "
                 "%d context-parallel ranks: heads must be a multiple of --cp x --tp",
                 C, cfg->heads, C);
    return -1;
  }
  return 0;
}

void train_cp_layer_bytes(const train_config *cfg, int B, int T, int C, int tp, int ulysses,
                          double *fwd, double *bwd) {
  double Tl = (double)T / C, Cm = (double)cfg->channels / (tp > 1 ? tp : 1),
         blk = (double)B * Tl * Cm * 4.0; /* one of q,k,v,o */
  if (C < 2) {
    *fwd = *bwd = 0.0;
  } else if (ulysses) { /* q, k, v out and o back: (C-1)/C of each leaves the rank */
    *fwd = (C - 1.0) / C * 4.0 * blk;
    *bwd = *fwd; /* dO out, dq, dk, dv back */
  } else {       /* C-1 K/V blocks; backward the K/V again and C dK/dV partial sums */
    *fwd = (C - 1.0) * 2.0 * blk;
    *bwd = (C - 1.0) * 2.0 * blk + C * 2.0 * blk;
  }
}

double train_cp_extra_bytes(const train_config *cfg, int B, int T, int C, int tp, int ulysses,
                            int recompute) {
  tp = tp > 1 ? tp : 1;
  double Tl = (double)T / C, Cm = (double)cfg->channels / tp, NH = (double)cfg->heads / tp,
         L = cfg->layers;
  if (C < 2) return 0.0;
  /* the model's probabilities (B,NH,T/C,T/C) per layer and their backward scratch are
   * allocated but never touched by either mode but for the ring's lse (B,NH,T/C) at the
   * start of each layer's (one shared under recomputation): the CPU allocator maps large arrays
   * lazily, so the rest is never resident and a plan of what is resident takes it off */
  double LA = recompute != TRAIN_RECOMPUTE_NONE ? 1.0 : L; /* the model's probabilities */
  double unused = 4.0 * (LA + 1) * B * NH * Tl * Tl - (ulysses ? 0.0 : 4.0 * LA * B * NH * Tl);
  if (ulysses) /* per layer q,k,v for T positions of NH/C heads and their probabilities;
                * staging: send, receive, the output, its gradient, dqkv and dprobs */
    return 4.0 * (L * ((double)B * T * 3 * Cm / C + (double)B * NH / C * T * T) +
                  2.0 * B * Tl * 3 * Cm + 2.0 * B * T * Cm / C + (double)B * T * 3 * Cm / C +
                  (double)B * NH / C * T * T) -
           unused;
  /* two K/V blocks in flight, a dK/dV sum received, one passed on, one accumulated, the
   * rows' D = dO.o (the lse lives in the model's probabilities buffer), and one sequence
   * and head's (T/C)^2 scores and their gradient, partial output and row statistics */
  return 4.0 * ((double)B * Tl * 2 * Cm * 5.0 + (double)B * NH * Tl + 2.0 * Tl * Tl + Tl * Cm +
                2.0 * Tl) -
         unused;
}

int train_cp_plan(const train_config *cfg, int B, int T, int C, int D, int tp, int zero,
                  int ulysses, int recompute, double fixed, train_plan_row *out, char *err) {
  if (train_cp_check(cfg, T, C, ulysses, tp, err) != 0) return -1;
  train_strategy st = zero > 0 ? (train_strategy)(TRAIN_PLAN_ZERO1 + zero - 1) : TRAIN_PLAN_DDP;
  int rc = tp > 1 ? train_tp_plan(cfg, B, T / C, tp, D * C, 0, zero, recompute, 0, fixed, out, NULL,
                                  NULL, err)
                  : train_plan_dt(cfg, B, T / C, D * C, 1, st, recompute, 0, fixed, out, err);
  if (rc != 0) return -1;
  double f, bw, extra = train_cp_extra_bytes(cfg, B, T, C, tp, ulysses, recompute);
  train_cp_layer_bytes(cfg, B, T, C, tp, ulysses, &f, &bw);
  out->name = ulysses ? "Ulysses" : "CP ring"; /* the table's column is 9 wide */
  out->acts += extra;
  out->total += extra;
  out->sent += (f + bw) * cfg->layers;
  return 0;
}

/* ---- the context of the layer operations -------------------------------------------- */

typedef struct cp_stats {
  double ms;    /* blocked waiting for transfers inside the passes */
  double bytes; /* sent by this rank */
  long calls;   /* transfers (ring steps, all-to-alls) */
} cp_stats;

typedef struct cp_ctx {
  train_backend *b;
  int C, r, ulysses, T; /* T: the whole sequence */
  int failed;
  char err[TRAIN_ERRLEN];
  /* the table installed before (the single-process one, or tensor parallelism's: ops.under),
   * embedding and attention replaced; the model's layer_ctx stays that table's */
  train_layer_ops ops;
  cp_stats st;
  train_trace *trace; /* --trace: each transfer, each block's attention */
  int trace_rank;
  float *wpe_mine, *dwpe_mine; /* (T/C, C): wpe's rows at this rank's positions */
  /* ring: K/V blocks (B,T/C,2Cl) x2, dK/dV sums in and out and the local contribution */
  float *kv[2], *dkv_in, *dkv_out, *acc, *dsum;
  /* ring: one sequence and head's (T/C)^2 scores / probabilities and their gradient, its
   * partial output (T/C, hs) and rows' max and sum */
  float *sp, *dpm, *os, *rmax, *rsum;
  /* Ulysses: per set block q,k,v of all T positions for NH/C heads (B,T,3Cl/C) and their
   * probabilities (B,NH/C,T,T); staging */
  float *uqkv, *uatt, *send, *recv, *uout, *udout, *udqkv, *udatt;
  size_t uqkv_n, uatt_n;
} cp_ctx;

static void attn_forward(train_model *m, int i, float *out, float *att, const float *qkv, int B,
                         int T, int C, int NH);

/* The context of a model whose operations are a context's table (the table lives inside
 * it), else NULL. */
static cp_ctx *ctx_of(const train_model *m) {
  const train_layer_ops *o = m->layer_ops;
  if (!o || o->attn_forward != attn_forward) return NULL;
  return (cp_ctx *)(void *)((char *)(void *)o - offsetof(cp_ctx, ops));
}

static void failf(train_model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void failf(train_model *m, const char *fmt, ...) {
  cp_ctx *c = ctx_of(m);
  if (!c || c->failed) return;
  c->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  char msg[TRAIN_ERRLEN];
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  train_errf(c->err, "%s", msg);
}


/* Starts the ring step's transfer: send `sbuf` to r+1, receive `rbuf` from r-1. */
static int ring_start(train_model *m, cp_ctx *c, const float *sbuf, float *rbuf, size_t n,
                      train_req *req) {
  *req = TRAIN_REQ_DONE;
  if (c->failed) return -1;
  train_backend *b = c->b;
  train_p2p ops[2] = {
      {.send = 1, .peer = (c->r + 1) % c->C, .buf = (void *)sbuf, .bytes = n * sizeof(float)},
      {.send = 0, .peer = (c->r + c->C - 1) % c->C, .buf = rbuf, .bytes = n * sizeof(float)},
  };
  c->st.bytes += (double)n * sizeof(float);
  c->st.calls++;
  int rc = b->exchange_start ? b->exchange_start(b, ops, 2, req) : b->exchange(b, ops, 2);
  if (rc != 0) {
    failf(m, "context-parallel ring step: %s", b->err);
    return -1;
  }
  return 0;
}

/* Waits for a started transfer; the time blocked counts as exposed communication. */
static void cp_wait(train_model *m, cp_ctx *c, train_req req, const char *what, double t_post) {
  if (c->failed || req == TRAIN_REQ_DONE) return;
  double t0 = train_now();
  if (c->b->wait(c->b, req) != 0) failf(m, "context-parallel %s: %s", what, c->b->err);
  double t1 = train_now();
  c->st.ms += (t1 - t0) * 1e3;
  if (c->trace) train_trace_add(c->trace, c->trace_rank, TRAIN_TRACE_COMM, what, t_post, t1);
}

static void trace_compute(cp_ctx *c, const char *what, double t0) {
  if (c->trace)
    train_trace_add(c->trace, c->trace_rank, TRAIN_TRACE_COMPUTE, what, t0, train_now());
}

/* ---- the embedding: wpe at this rank's positions ----------------------------------- */

/* The local kernel reads wpe[t] for local row t: give it wpe's rows at the rank's true
 * positions (its two chunks), and scatter their gradient back to those rows. */
static void embed_forward(train_model *m, float *out, const int *inp, const float *wte,
                          const float *wpe, int B, int T, int C) {
  cp_ctx *c = ctx_of(m);
  for (int t = 0; t < T; t++)
    memcpy(c->wpe_mine + (size_t)t * C, wpe + (size_t)train_cp_pos(c->T, c->C, c->r, t) * C,
           (size_t)C * sizeof(float));
  c->ops.under->embed_forward(m, out, inp, wte, c->wpe_mine, B, T, C);
}

static void embed_backward(train_model *m, float *dwte, float *dwpe, const float *dout,
                           const int *inp, int B, int T, int C) {
  cp_ctx *c = ctx_of(m);
  memset(c->dwpe_mine, 0, (size_t)T * C * sizeof(float));
  c->ops.under->embed_backward(m, dwte, c->dwpe_mine, dout, inp, B, T, C);
  for (int t = 0; t < T; t++) {
    float *d = dwpe + (size_t)train_cp_pos(c->T, c->C, c->r, t) * C;
    const float *s = c->dwpe_mine + (size_t)t * C;
    for (int k = 0; k < C; k++) d[k] += s[k];
  }
}

/* ---- ring attention ------------------------------------------------------------------ */

/* Packs this rank's K and V (B,T,2C) out of qkv (B,T,3C). */
static void pack_kv(float *kv, const float *qkv, int B, int T, int C) {
  for (size_t n = 0; n < (size_t)B * T; n++)
    memcpy(kv + n * 2 * C, qkv + n * 3 * C + C, 2 * (size_t)C * sizeof(float));
}

/* Queries (B,T rows of qkv) of rank r against the K/V block kv (B,T,2C) of rank src:
 * each row's partial (o_s, lse_s) merged into out (B,T,C) and lse (B,NH,T). Per sequence
 * and head the products are the BLAS's, as in the local kernel: scores S = q k^T/sqrt(hs)
 * (T x T), masked by true positions, exponentiated against each row's max, o_s = P v / the
 * row's sum. */
static void ring_block_forward(cp_ctx *c, float *out, float *lse, const float *qkv, const float *kv,
                               int src, int B, int T, int C, int NH) {
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  float *S = c->sp, *os = c->os, *rmax = c->rmax, *rsum = c->rsum;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *q = qkv + (size_t)b * T * 3 * C + h * hs;
      const float *k = kv + (size_t)b * T * 2 * C + h * hs, *v = k + C;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, 3 * C, k, 2 * C,
                  0.0f, S, T);
      for (int t = 0; t < T; t++) {
        int pq = train_cp_pos(c->T, c->C, c->r, t);
        float *row = S + (size_t)t * T, mx = -INFINITY, sum = 0.0f;
        for (int u = 0; u < T; u++)
          if (train_cp_pos(c->T, c->C, src, u) <= pq) mx = row[u] > mx ? row[u] : mx;
        for (int u = 0; u < T; u++) {
          row[u] = train_cp_pos(c->T, c->C, src, u) <= pq ? expf(row[u] - mx) : 0.0f;
          sum += row[u];
        }
        rmax[t] = mx;
        rsum[t] = sum; /* 0: the mask hides the block from this row (lse_s = -inf) */
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, S, T, v, 2 * C, 0.0f,
                  os, hs);
      for (int t = 0; t < T; t++) {
        if (rsum[t] == 0.0f) continue;
        float ls = rmax[t] + logf(rsum[t]), inv = 1.0f / rsum[t];
        float *o = out + ((size_t)b * T + t) * C + h * hs, *l = lse + ((size_t)b * NH + h) * T + t;
        const float *p = os + (size_t)t * hs;
        if (*l == -INFINITY) { /* the first block this row sees */
          for (int j = 0; j < hs; j++) o[j] = p[j] * inv;
          *l = ls;
          continue;
        }
        /* the log-sum-exp merge (top of the file) */
        float m2 = *l > ls ? *l : ls;
        float lnew = m2 + logf(expf(*l - m2) + expf(ls - m2));
        float w1 = expf(*l - lnew), w2 = expf(ls - lnew) * inv;
        for (int j = 0; j < hs; j++) o[j] = w1 * o[j] + w2 * p[j];
        *l = lnew;
      }
    }
}

static void ring_forward(train_model *m, cp_ctx *c, int i, float *out, float *lse, const float *qkv,
                         int B, int T, int C, int NH) {
  (void)i;
  size_t n = (size_t)B * T * 2 * C;
  for (size_t k = 0; k < (size_t)B * T * C; k++) out[k] = 0.0f;
  for (size_t k = 0; k < (size_t)B * NH * T; k++) lse[k] = -INFINITY;
  pack_kv(c->kv[0], qkv, B, T, C);
  int cur = 0;
  for (int s = 0; s < c->C; s++) {
    int src = (c->r - s + c->C) % c->C;
    train_req req = TRAIN_REQ_DONE;
    double tp = train_now();
    /* post the next block's transfer, compute on this one, then wait */
    if (s < c->C - 1) ring_start(m, c, c->kv[cur], c->kv[1 - cur], n, &req);
    double t0 = train_now();
    ring_block_forward(c, out, lse, qkv, c->kv[cur], src, B, T, C, NH);
    trace_compute(c, "ring attn fwd", t0);
    if (s < c->C - 1) cp_wait(m, c, req, "ring kv fwd", tp);
    cur = 1 - cur;
  }
}

/* The block's gradient contributions: dq into dqkv's q (B,T,3C), dk and dv into acc
 * (B,T,2C), from dout, the saved lse and dsum = dO.o (B,NH,T). Per sequence and head:
 * P = exp(q k^T/sqrt(hs) - lse) under the mask, dv += P^T dO, dP = dO v^T,
 * dS = P (dP - D)/sqrt(hs), dq += dS k, dk += dS^T q — the BLAS's products. */
static void ring_block_backward(cp_ctx *c, float *dqkv, float *acc, const float *dout,
                                const float *qkv, const float *kv, const float *lse,
                                const float *dsum, int src, int B, int T, int C, int NH) {
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  float *P = c->sp, *dP = c->dpm;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *q = qkv + (size_t)b * T * 3 * C + h * hs;
      const float *k = kv + (size_t)b * T * 2 * C + h * hs, *v = k + C;
      const float *dO = dout + (size_t)b * T * C + h * hs;
      float *dq = dqkv + (size_t)b * T * 3 * C + h * hs;
      float *dk = acc + (size_t)b * T * 2 * C + h * hs, *dv = dk + C;
      const float *l = lse + ((size_t)b * NH + h) * T, *D = dsum + ((size_t)b * NH + h) * T;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, 3 * C, k, 2 * C,
                  0.0f, P, T);
      for (int t = 0; t < T; t++) {
        int pq = train_cp_pos(c->T, c->C, c->r, t);
        float *row = P + (size_t)t * T;
        for (int u = 0; u < T; u++)
          row[u] = train_cp_pos(c->T, c->C, src, u) <= pq ? expf(row[u] - l[t]) : 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, P, T, dO, C, 1.0f, dv,
                  2 * C);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dO, C, v, 2 * C, 0.0f,
                  dP, T);
      for (int t = 0; t < T; t++) { /* dS in place of dP (masked p = 0 gives 0) */
        const float *pr = P + (size_t)t * T;
        float *dr = dP + (size_t)t * T;
        for (int u = 0; u < T; u++) dr[u] = pr[u] * (dr[u] - D[t]) * scale;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, dP, T, k, 2 * C, 1.0f,
                  dq, 3 * C);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, dP, T, q, 3 * C, 1.0f,
                  dk, 2 * C);
    }
}

static void ring_backward(train_model *m, cp_ctx *c, float *dqkv, const float *dout,
                          const float *qkv, const float *lse, const float *out, int B, int T, int C,
                          int NH) {
  int hs = C / NH;
  size_t n = (size_t)B * T * 2 * C;
  /* D = dO.o per row and head: the softmax backward's sum(p * dp) without the p's */
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < NH; h++) {
        const float *o = out + ((size_t)b * T + t) * C + h * hs,
                    *dO = dout + ((size_t)b * T + t) * C + h * hs;
        float d = 0.0f;
        for (int j = 0; j < hs; j++) d += dO[j] * o[j];
        c->dsum[((size_t)b * NH + h) * T + t] = d;
      }
  pack_kv(c->kv[0], qkv, B, T, C);
  int cur = 0;
  train_req dreq = TRAIN_REQ_DONE;
  double tdp = 0.0;
  for (int s = 0; s < c->C; s++) {
    int src = (c->r - s + c->C) % c->C;
    train_req req = TRAIN_REQ_DONE;
    double tp = train_now();
    if (s < c->C - 1) ring_start(m, c, c->kv[cur], c->kv[1 - cur], n, &req);
    double t0 = train_now();
    memset(c->acc, 0, n * sizeof(float));
    ring_block_backward(c, dqkv, c->acc, dout, qkv, c->kv[cur], lse, c->dsum, src, B, T, C, NH);
    trace_compute(c, "ring attn bwd", t0);
    /* the block's dK/dV sum so far, from r-1 (none at s = 0: the block is ours), plus
     * ours, passed on to r+1 — after the last step it lands at the block's owner */
    if (s > 0) {
      cp_wait(m, c, dreq, "ring dkv bwd", tdp);
      for (size_t k = 0; k < n; k++) c->dkv_out[k] = c->dkv_in[k] + c->acc[k];
    } else {
      memcpy(c->dkv_out, c->acc, n * sizeof(float));
    }
    tdp = train_now();
    ring_start(m, c, c->dkv_out, c->dkv_in, n, &dreq);
    if (s < c->C - 1) cp_wait(m, c, req, "ring kv bwd", tp);
    cur = 1 - cur;
  }
  cp_wait(m, c, dreq, "ring dkv bwd", tdp);
  if (c->failed) return;
  for (size_t nt = 0; nt < (size_t)B * T; nt++) { /* our block's dK/dV, home */
    float *d = dqkv + nt * 3 * C + C;
    const float *g = c->dkv_in + nt * 2 * C;
    for (int k = 0; k < 2 * C; k++) d[k] += g[k];
  }
}

/* ---- Ulysses ------------------------------------------------------------------------- */

/* One all-to-all of `n` floats per peer, started and waited (the next step needs it). */
static void a2a(train_model *m, cp_ctx *c, const float *send, float *recv, size_t n,
                const char *what) {
  if (c->failed) return;
  train_req req = TRAIN_REQ_DONE;
  double t0 = train_now();
  c->st.bytes += (double)(c->C - 1) * n * sizeof(float);
  c->st.calls++;
  if (c->b->all_to_all(c->b, send, recv, n * sizeof(float), &req) != 0) {
    failf(m, "context-parallel %s: %s", what, c->b->err);
    return;
  }
  cp_wait(m, c, req, what, t0);
}

/* Forward: q,k,v (B,Tl,3C) by positions -> (B,T,3Ch) by heads, Ch = C/Cp, NH/Cp heads of
 * width hs; block j of the all-to-all carries the heads of rank j. */
static void ulysses_forward(train_model *m, cp_ctx *c, int i, float *out, const float *qkv, int B,
                            int Tl, int C, int NH) {
  int P = c->C, T = c->T, Ch = C / P, NHc = NH / P;
  size_t blk3 = (size_t)B * Tl * 3 * Ch, blk1 = (size_t)B * Tl * Ch;
  float *uq = c->uqkv + (size_t)i * c->uqkv_n, *ua = c->uatt + (size_t)i * c->uatt_n;
  for (int j = 0; j < P; j++)
    for (size_t n = 0; n < (size_t)B * Tl; n++)
      for (int p = 0; p < 3; p++)
        memcpy(c->send + j * blk3 + n * 3 * Ch + p * Ch, qkv + n * 3 * C + p * C + j * Ch,
               (size_t)Ch * sizeof(float));
  a2a(m, c, c->send, c->recv, blk3, "ulysses qkv a2a");
  for (int src = 0; src < P; src++) /* rank src's rows, at their positions */
    for (int b = 0; b < B; b++)
      for (int t = 0; t < Tl; t++)
        memcpy(uq + ((size_t)b * T + train_cp_pos(T, P, src, t)) * 3 * Ch,
               c->recv + src * blk3 + ((size_t)b * Tl + t) * 3 * Ch,
               3 * (size_t)Ch * sizeof(float));
  double t0 = train_now();
  m->ops->attention_forward(c->uout, ua, uq, B, T, Ch, NHc);
  trace_compute(c, "ulysses attn fwd", t0);
  for (int dst = 0; dst < P; dst++) /* rank dst's positions of our heads */
    for (int b = 0; b < B; b++)
      for (int t = 0; t < Tl; t++)
        memcpy(c->send + dst * blk1 + ((size_t)b * Tl + t) * Ch,
               c->uout + ((size_t)b * T + train_cp_pos(T, P, dst, t)) * Ch,
               (size_t)Ch * sizeof(float));
  a2a(m, c, c->send, c->recv, blk1, "ulysses out a2a");
  for (int j = 0; j < P; j++)
    for (size_t n = 0; n < (size_t)B * Tl; n++)
      memcpy(out + n * C + j * Ch, c->recv + j * blk1 + n * Ch, (size_t)Ch * sizeof(float));
}

static void ulysses_backward(train_model *m, cp_ctx *c, int i, float *dqkv, const float *dout,
                             int B, int Tl, int C, int NH) {
  int P = c->C, T = c->T, Ch = C / P, NHc = NH / P;
  size_t blk3 = (size_t)B * Tl * 3 * Ch, blk1 = (size_t)B * Tl * Ch;
  const float *uq = c->uqkv + (size_t)i * c->uqkv_n, *ua = c->uatt + (size_t)i * c->uatt_n;
  for (int j = 0; j < P; j++) /* dO of rank j's heads at our positions */
    for (size_t n = 0; n < (size_t)B * Tl; n++)
      memcpy(c->send + j * blk1 + n * Ch, dout + n * C + j * Ch, (size_t)Ch * sizeof(float));
  a2a(m, c, c->send, c->recv, blk1, "ulysses dout a2a");
  for (int src = 0; src < P; src++)
    for (int b = 0; b < B; b++)
      for (int t = 0; t < Tl; t++)
        memcpy(c->udout + ((size_t)b * T + train_cp_pos(T, P, src, t)) * Ch,
               c->recv + src * blk1 + ((size_t)b * Tl + t) * Ch, (size_t)Ch * sizeof(float));
  memset(c->udqkv, 0, (size_t)B * T * 3 * Ch * sizeof(float));
  double t0 = train_now();
  m->ops->attention_backward(c->udqkv, c->udatt, c->udout, uq, ua, B, T, Ch, NHc);
  trace_compute(c, "ulysses attn bwd", t0);
  for (int dst = 0; dst < P; dst++)
    for (int b = 0; b < B; b++)
      for (int t = 0; t < Tl; t++)
        memcpy(c->send + dst * blk3 + ((size_t)b * Tl + t) * 3 * Ch,
               c->udqkv + ((size_t)b * T + train_cp_pos(T, P, dst, t)) * 3 * Ch,
               3 * (size_t)Ch * sizeof(float));
  a2a(m, c, c->send, c->recv, blk3, "ulysses dqkv a2a");
  if (c->failed) return;
  for (int j = 0; j < P; j++)
    for (size_t n = 0; n < (size_t)B * Tl; n++)
      for (int p = 0; p < 3; p++) {
        float *d = dqkv + n * 3 * C + p * C + j * Ch;
        const float *g = c->recv + j * blk3 + n * 3 * Ch + p * Ch;
        for (int k = 0; k < Ch; k++) d[k] += g[k];
      }
}

/* ---- the attention operations --------------------------------------------------------- */

static void attn_forward(train_model *m, int i, float *out, float *att, const float *qkv, int B,
                         int T, int C, int NH) {
  cp_ctx *c = ctx_of(m);
  if (c->ulysses)
    ulysses_forward(m, c, i, out, qkv, B, T, C, NH);
  else /* the rows' lse (B,NH,T) in the model's (B,NH,T,T) buffer */
    ring_forward(m, c, i, out, att, qkv, B, T, C, NH);
}

static void attn_backward(train_model *m, int i, float *dqkv, float *datt, const float *dout,
                          const float *qkv, const float *att, const float *out, int B, int T, int C,
                          int NH) {
  (void)datt;
  cp_ctx *c = ctx_of(m);
  if (c->ulysses)
    ulysses_backward(m, c, i, dqkv, dout, B, T, C, NH);
  else
    ring_backward(m, c, dqkv, dout, qkv, att, out, B, T, C, NH);
}

/* ---- attaching the ring ----------------------------------------------------------------- */

static void ctx_free(cp_ctx *c) {
  if (!c) return;
  free(c->wpe_mine);
  free(c->dwpe_mine);
  free(c->kv[0]);
  free(c->kv[1]);
  free(c->dkv_in);
  free(c->dkv_out);
  free(c->acc);
  free(c->dsum);
  free(c->sp);
  free(c->dpm);
  free(c->os);
  free(c->rmax);
  free(c->rsum);
  free(c->uqkv);
  free(c->uatt);
  free(c->send);
  free(c->recv);
  free(c->uout);
  free(c->udout);
  free(c->udqkv);
  free(c->udatt);
  free(c);
}

/* Installs the context-parallel operations on the session's model (made for seq/C
 * positions) over group b (C ranks, this one r). */
static int cp_attach(train_session *s, train_backend *b, int ulysses, char *err) {
  train_model *m = s->model;
  int C = b->nranks, T = s->opt.seq, Tl = m->maxT, B = m->maxB;
  if (m->layer_ops->under || m->seq_shards > 1) {
    train_errf(err, "--cp: the model's layers are already split along the sequence (%s)",
               m->layer_ops->name);
    return -1;
  }
  if (Tl * C != T || T % (2 * C) != 0) {
    train_errf(err, "--cp %d: a model made for %d positions cannot hold its share of --seq %d", C,
               Tl, T);
    return -1;
  }
  if (ulysses && !b->all_to_all) {
    train_errf(err, "--cp-mode ulysses: the %s backend has no all-to-all; use --backend coll",
               b->name);
    return -1;
  }
  if (!ulysses && !b->exchange) {
    train_errf(err, "--cp: the %s backend cannot send between ranks; use --backend coll", b->name);
    return -1;
  }
  int Cm = m->cfg.channels, Cl = m->width_local, NH = m->heads_local, L = m->act_layers;
  cp_ctx *c = calloc(1, sizeof *c);
  if (!c) {
    train_errf(err, "out of memory for the context-parallel context");
    return -1;
  }
  c->b = b;
  c->C = C;
  c->r = b->rank;
  c->ulysses = ulysses;
  c->T = T;
  size_t n = (size_t)B * Tl * 2 * Cl;
  int ok = (c->wpe_mine = malloc((size_t)Tl * Cm * sizeof(float))) &&
           (c->dwpe_mine = malloc((size_t)Tl * Cm * sizeof(float)));
  if (ok && !ulysses) {
    size_t ds = (size_t)B * NH * Tl > (size_t)Tl ? (size_t)B * NH * Tl : (size_t)Tl;
    ok = (c->kv[0] = malloc(n * sizeof(float))) && (c->kv[1] = malloc(n * sizeof(float))) &&
         (c->dkv_in = malloc(n * sizeof(float))) && (c->dkv_out = malloc(n * sizeof(float))) &&
         (c->acc = malloc(n * sizeof(float))) && (c->dsum = malloc(ds * sizeof(float))) &&
         (c->sp = malloc((size_t)Tl * Tl * sizeof(float))) &&
         (c->dpm = malloc((size_t)Tl * Tl * sizeof(float))) &&
         (c->os = malloc((size_t)Tl * Cl * sizeof(float))) &&
         (c->rmax = malloc((size_t)Tl * sizeof(float))) &&
         (c->rsum = malloc((size_t)Tl * sizeof(float)));
  } else if (ok) {
    size_t Ch = (size_t)Cl / C, NHc = (size_t)NH / C;
    c->uqkv_n = (size_t)B * T * 3 * Ch;
    c->uatt_n = (size_t)B * NHc * T * T;
    ok = (c->uqkv = calloc((size_t)L * c->uqkv_n, sizeof(float))) &&
         (c->uatt = calloc((size_t)L * c->uatt_n, sizeof(float))) &&
         (c->send = malloc((size_t)B * Tl * 3 * Cl * sizeof(float))) &&
         (c->recv = malloc((size_t)B * Tl * 3 * Cl * sizeof(float))) &&
         (c->uout = malloc((size_t)B * T * Ch * sizeof(float))) &&
         (c->udout = malloc((size_t)B * T * Ch * sizeof(float))) &&
         (c->udqkv = malloc(c->uqkv_n * sizeof(float))) &&
         (c->udatt = malloc(c->uatt_n * sizeof(float)));
  }
  if (!ok) {
    ctx_free(c);
    train_errf(err, "out of memory for the context-parallel buffers");
    return -1;
  }
  c->ops = *m->layer_ops;
  c->ops.under = m->layer_ops;
  c->ops.name = ulysses ? "context-parallel (Ulysses)" : "context-parallel (ring)";
  c->ops.embed_forward = embed_forward;
  c->ops.embed_backward = embed_backward;
  c->ops.attn_forward = attn_forward;
  c->ops.attn_backward = attn_backward;
  m->layer_ops = &c->ops; /* from here the passes communicate */
  return 0;
}

static void cp_detach(train_session *s) {
  cp_ctx *c = s && s->model ? ctx_of(s->model) : NULL;
  if (!c) return;
  s->model->layer_ops = c->ops.under; /* before that table's own detach */
  ctx_free(c);
}

/* ---- context parallelism as a strategy (strategy.h) ------------------------------------
 * It wraps the data-parallel strategy of the grid's dp group (D x Cp ranks: the CP ranks
 * sync their gradients as data-parallel ones; each rank's loss is the mean over its B*T/Cp
 * tokens, so the group's average is the global batch's mean). Evaluation is collective
 * over the ring, and no rank can sample alone (it holds T/Cp positions). */

typedef struct cp_strategy {
  train_trace trace;
  int ulysses;
} cp_strategy;

static int cp_status(const train_parallel *p, char *err) {
  const cp_ctx *c = ctx_of(p->s->model);
  if (c && c->failed) {
    train_errf(err, "%s", c->err);
    return -1;
  }
  return p->inner->ops->status ? p->inner->ops->status(p->inner, err) : 0;
}

static int cp_step(train_parallel *p, train_step_report *r, char *err) {
  cp_strategy *t = p->impl;
  cp_ctx *c = ctx_of(p->s->model);
  memset(&c->st, 0, sizeof c->st);
  if (p->inner->ops->step(p->inner, r, err) != 0) return -1;
  r->cp_ms = c->st.ms;
  r->cp_bytes = c->st.bytes;
  r->cp_calls = c->st.calls;
  if (p->opt.trace) {
    double now = train_now();
    train_trace_add(&t->trace, p->grid->world->rank, TRAIN_TRACE_COMPUTE, "step",
                    now - r->step.ms * 1e-3, now);
  }
  return 0;
}

static int cp_eval_begin(train_parallel *p, char *err) {
  return p->inner->ops->eval_begin ? p->inner->ops->eval_begin(p->inner, err) : 0;
}

/* The inner strategy's checkpoint: every rank of a ring holds the whole weights (DDP: DP
 * rank 0 writes them; FSDP: the shards over D x Cp; TP: the slices), and the session's
 * data position is that of the whole sequences, so a checkpoint of a context-parallel run
 * is the one a run without it writes at the same global batch. */
static int cp_save(train_parallel *p, const char *path, char *what, size_t wn, char *err) {
  return p->inner->ops->save(p->inner, path, what, wn, err);
}

/* Collective over the ring: the validation loss of `batches` batches, every rank its
 * chunks of the same sequences, the ring's mean of the ranks' means (equal token counts). */
static int cp_val_loss(train_parallel *p, int batches, float *out, char *err) {
  train_session *s = p->s;
  train_model *m = s->model;
  train_backend *b = p->grid->cp;
  int B = s->opt.batch, T = s->opt.seq, C = p->grid->Cp;
  int *in = malloc((size_t)B * T / C * sizeof(int)), *tg = malloc((size_t)B * T / C * sizeof(int));
  if (!in || !tg) {
    free(in);
    free(tg);
    train_errf(err, "out of memory for the context-parallel validation batch");
    return -1;
  }
  double sum = 0.0;
  int n = 0;
  for (int k = 0; k < batches; k++) {
    if (!train_data_val_batch(s->data, k, B, T, s->inputs, s->targets)) break;
    train_cp_take(s->inputs, in, B, T, C, p->grid->c);
    train_cp_take(s->targets, tg, B, T, C, p->grid->c);
    float l = train_forward(m, in, tg, B, T / C);
    train_req req = TRAIN_REQ_DONE;
    if (b->all_reduce(b, &l, 1, TRAIN_REDUCE_AVG, &req) != 0 || b->wait(b, req) != 0) {
      train_errf(err, "context-parallel validation: %s", b->err);
      free(in);
      free(tg);
      return -1;
    }
    sum += l;
    n++;
  }
  free(in);
  free(tg);
  *out = n ? (float)(sum / n) : NAN;
  return 0;
}

static int cp_finish(train_parallel *p, const char *trace_path, char *err) {
  cp_strategy *t = p->impl;
  if (p->inner->ops->finish(p->inner, NULL, err) != 0) return -1;
  return trace_path ? train_trace_gather_write(p->grid->world, &t->trace, trace_path, err) : 0;
}

static void cp_describe(train_parallel *p, char *out, size_t n) {
  const train_options *o = &p->s->opt;
  cp_strategy *t = p->impl;
  int C = p->grid->Cp, T = o->seq, Tc = T / (2 * C);
  double f, bw;
  train_cp_layer_bytes(&o->cfg, o->batch, T, C, p->grid->T, t->ulysses, &f, &bw);
  out[0] = '\0';
  train_appendf(out, n,
                "coll-train: context parallel (%s): --cp %d x D %d (%s backend); each sequence "
                "of %d cut into %d chunks of %d, CP rank r holding chunks r and %d-r (this "
                "rank %d: positions %d..%d and %d..%d); gradients sync over the %d ranks of D x "
                "Cp (under %s)\n",
                t->ulysses ? "Ulysses all-to-all" : "ring attention", C, p->grid->D,
                p->grid->world->name, T, 2 * C, Tc, 2 * C - 1, p->grid->c, p->grid->c * Tc,
                p->grid->c * Tc + Tc - 1, (2 * C - 1 - p->grid->c) * Tc,
                (2 * C - 1 - p->grid->c) * Tc + Tc - 1, p->grid->dp->nranks, p->inner->ops->name);
  train_appendf(out, n,
                "coll-train: cp sends per layer %.1f KiB forward + %.1f KiB backward per rank "
                "(%s), %.1f KiB per step over %d layers\n",
                f / 1024.0, bw / 1024.0,
                t->ulysses ? "4 all-to-alls of (C-1)/C of q, k, v, out each way"
                           : "C-1 K/V blocks forward; K/V again and C dK/dV sums backward",
                (f + bw) * o->cfg.layers / 1024.0, o->cfg.layers);
  p->inner->ops->describe(p->inner, out + strlen(out), n - strlen(out));
}

static void cp_step_line(const train_parallel *p, const train_step_report *r, char *out, size_t n) {
  p->inner->ops->step_line(p->inner, r, out, n);
  train_appendf(out, n, " | cp %5.1f ms blocked, %ld transfers, %.1f KiB", r->cp_ms, r->cp_calls,
                r->cp_bytes / 1024.0);
}

static void cp_summary(const train_parallel *p, const train_step_report *later, long nlater,
                       double seconds, const train_step_report *all, long nall, char *out,
                       size_t n) {
  p->inner->ops->summary(p->inner, later, nlater, seconds, all, nall, out, n);
  if (nlater < 1) return;
  train_appendf(out, n,
                "cp: per step after the first: %.1f transfers, %.1f KiB sent, %.2f ms blocked "
                "waiting for them (%.1f%% of the step)\n",
                (double)later->cp_calls / nlater, later->cp_bytes / 1024.0 / nlater,
                later->cp_ms / nlater, seconds > 0 ? 100.0 * later->cp_ms * 1e-3 / seconds : 0.0);
}

static int cp_plan(const train_parallel *p, double fixed, train_plan_row *out, char *err) {
  const train_options *o = &p->s->opt;
  cp_strategy *t = p->impl;
  return train_cp_plan(&o->cfg, o->batch, o->seq, p->grid->Cp, p->grid->D, p->grid->T,
                       p->inner->zero, t->ulysses, o->recompute, fixed, out, err);
}

static void cp_free(train_parallel *p) {
  cp_strategy *t = p->impl;
  cp_detach(p->s); /* ours first: it sits over tensor parallelism's table */
  train_parallel_free(p->inner);
  train_trace_free(&t->trace);
  free(t);
  free(p);
}

static const train_parallel_ops cp_strategy_ops = {
    .name = "cp",
    .step = cp_step,
    .eval_begin = cp_eval_begin,
    .save = cp_save,
    .finish = cp_finish,
    .describe = cp_describe,
    .step_line = cp_step_line,
    .summary = cp_summary,
    .plan = cp_plan,
    .status = cp_status,
    .val_loss = cp_val_loss,
    .free = cp_free,
};

train_parallel *train_cp_strategy_create(train_session *s, train_grid *g,
                                         const train_parallel_options *opt,
                                         train_parallel_create_fn inner, char *err) {
  if (g->P > 1 || opt->sp) {
    train_errf(err, "--cp with --pp or --sp is not built yet: the pipeline's pieces and "
                    "sequence parallelism would cut the sequence again");
    return NULL;
  }
  if (strcmp(opt->data, "ddp") != 0 && strcmp(opt->data, "fsdp") != 0) {
    train_errf(err,
               "--cp needs --parallel ddp or fsdp: the context-parallel ranks sync their "
               "gradients as data-parallel ones (--parallel %s)",
               opt->data);
    return NULL;
  }
  if (train_cp_check(&s->opt.cfg, s->opt.seq, g->Cp, opt->cp_ulysses, g->T, err) != 0) return NULL;
  train_parallel *p = train_parallel_new(&cp_strategy_ops, s, g, opt);
  cp_strategy *t = calloc(1, sizeof *t);
  if (!p || !t) {
    free(p);
    free(t);
    train_errf(err, "out of memory");
    return NULL;
  }
  p->impl = t;
  t->ulysses = opt->cp_ulysses;
  p->eval_everywhere = 1;
  p->can_sample = 0;
  /* under CP x TP the tensor-parallel strategy (its table attached) wraps the data-
   * parallel one, and the context-parallel table goes over the tensor-parallel one */
  p->inner = g->T > 1 ? train_tp_strategy_create(s, g, opt, inner, err) : inner(s, g, opt, err);
  if (!p->inner) {
    free(t);
    free(p);
    return NULL;
  }
  if (cp_attach(s, g->cp, opt->cp_ulysses, err) != 0) {
    train_parallel_free(p->inner);
    free(t);
    free(p);
    return NULL;
  }
  if (opt->trace) {
    cp_ctx *c = ctx_of(s->model);
    c->trace = &t->trace;
    c->trace_rank = g->world->rank;
  }
  p->rows_mult = p->inner->rows_mult;
  p->zero = p->inner->zero;
  return p;
}
