/*
 * moe.c — the mixture-of-experts MLP of a block (moe.h): router, top-k, the permutation of
 * tokens by expert, the expert MLPs, the weighted combine, the load-balancing auxiliary
 * loss, and their backward. It computes through the kernels (m->ops) and moves rows
 * between ranks only through the train_moe_comm it is handed (NULL: one rank holds every
 * expert); it must never include anything from comm/ or parallel/, print, or exit.
 *
 * Forward of one block, N tokens x (N,C):
 *   probs = softmax(x @ Wr^T)                     (N,E), the router (no bias)
 *   for each token the K largest probabilities (ties: the lower expert), gate = that
 *   probability, NOT renormalised over the K (Switch Transformer, GShard and Megatron-core's
 *   default): the router then learns from the language-model loss even at top-1.
 *   send order: expert-major, inside an expert by token index — rows for the experts of
 *   rank j are contiguous, so that order is also the all-to-all's rank order.
 *   capacity mode (cf > 0): each expert takes at most cap = ceil(cf*N*K/E) rows from each
 *   rank, the first in token order, padded with zero rows to exactly cap: fixed splits;
 *   the assignments past cap are dropped (their token's MoE output lacks that term).
 *   dispatch: the counts go to the experts' ranks, then the rows (all-to-allv); each rank
 *   reorders what it received expert-major, source rank by source rank — the global token
 *   order (rank-major, then local index), which is exactly the order a single process
 *   that sees the global batch (rank 0's rows first) gives each expert: every expert's
 *   matmuls run over the same rows in the same order.
 *   expert e: y = gelu(x @ Wfc_e^T + bfc_e) @ Wproj_e^T + bproj_e, one matmul per expert.
 *   combine: the rows go back (the mirror all-to-allv), out[t] = sum_k gate[t,k] y[t,k].
 *
 * Auxiliary loss (Switch Transformer's): aux = coef * E * sum_i f_i * P_i with
 *   f_i = (token-assignments routed to i, before any drop) / (N_g * K)
 *   P_i = (sum over tokens of probs[t,i]) / N_g
 * over the global batch of N_g tokens: the counts and probability sums (and N) are summed
 * over the data-parallel group (comm->stats_sum) before it is formed, so a parallel run
 * and one process see the same f and P. f is a count (no gradient through the top-k):
 *   d aux / d probs[t,i] = coef * E * f_i / N_g,
 * which a rank applies as coef * E * f_i / N (its N tokens, N_g = D*N) because the strategy
 * averages gradients over the D ranks, as it does the cross-entropy's 1/N. It is added to
 * the gradient, and reported apart from the loss (train_moe_stats).
 *
 * Backward (dout (N,C)): dgate[t,k] = dout[t].y[t,k]; the rows gate*dout go to the experts
 * (the dispatch's splits), through each expert's backward (weights += over its rows), and
 * their input gradients come back (the combine's splits) and add to dinp in k order; the
 * router: dprobs from dgate and the auxiliary loss, through the softmax, then the router's
 * matmul (dinp += dlogits @ Wr, dWr += dlogits^T @ x).
 */
#include "model/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct moe_block {
  float *probs;  /* (Nmax,E) softmax of the router */
  int *choice;   /* (Nmax,K) global expert of each assignment */
  float *gate;   /* (Nmax,K) its probability */
  int *pos;      /* (Nmax,K) its row in the send order, -1: dropped */
  int *scnt;     /* (E) rows sent to each global expert (cap each in capacity mode) */
  int *rcnt;     /* (X*El) rows received from rank s for local expert e: [s*El + e] */
  float *frac;   /* (E) f_i of the auxiliary loss (global) */
  float *xin;    /* (Rmax,C) the experts' input rows, expert-major */
  float *h, *hg; /* (Rmax,4C) fc output, after gelu */
  float *yback;  /* (Smax,C) the experts' outputs, back here in send order */
  int N, S, R;   /* tokens, rows sent, rows received */
  int targets;   /* the forward had targets: f is set, the aux gradient applies */
  double aux, load, dropped, sent;
} moe_block;

struct train_moe {
  int L, E, K, X, El, C, Nmax;
  size_t Smax, Rmax;
  float cf, coef;
  moe_block *b;
  float *bufA, *bufB, *bufC; /* (max(Smax,Rmax),C) row staging */
  float *d1, *d2;            /* (Rmax,4C) expert backward */
  float *dp;                 /* (Nmax,E) router backward */
  float *stats;              /* 2E+2 */
  int *off;                  /* scratch: counts, starts and fills per expert (3E) */
};

int train_moe_capacity(int N, int experts, int topk, float cf) {
  if (!(cf > 0.0f) || experts < 1) return 0;
  double c = ceil((double)cf * N * topk / experts - 1e-9);
  return c < 1 ? 1 : (int)c;
}

int train_moe_check(const train_config *cfg, int experts, int topk, int ep, float capacity,
                    float aux_coef, train_device dev, int tp, int pp, int bf16, int recompute,
                    char *err) {
  (void)cfg;
  if (experts < 1) {
    train_errf(err, "--experts %d: a mixture of experts needs at least 1 expert", experts);
    return -1;
  }
  if (topk < 1 || topk > experts) {
    train_errf(err, "--topk %d: each token goes to between 1 and --experts %d experts", topk,
               experts);
    return -1;
  }
  if (ep < 1 || experts % ep != 0) {
    train_errf(err,
               "--ep %d: the %d experts cannot be spread evenly over %d expert-parallel ranks "
               "(--experts must be a multiple of --ep)",
               ep, experts, ep);
    return -1;
  }
  if (!(capacity >= 0.0f)) {
    train_errf(err, "--capacity-factor %g: must be above 0 (leave it out for dropless routing)",
               (double)capacity);
    return -1;
  }
  if (!(aux_coef >= 0.0f)) {
    train_errf(err, "--aux-loss-coef %g: must be 0 (off) or more", (double)aux_coef);
    return -1;
  }
  if (dev != TRAIN_DEVICE_CPU) {
    train_errf(err, "--experts runs on the CPU model only (--device cpu): the router, the "
                    "permutation and the combine have no CUDA kernels yet");
    return -1;
  }
  if (tp > 1 || pp > 1) {
    train_errf(err, "--experts with --tp or --pp is not built yet: experts are whole on each "
                    "rank (no tensor-parallel expert slices) and the pipeline's pieces do not "
                    "carry the routing");
    return -1;
  }
  if (bf16) {
    train_errf(err, "--experts with --dtype bf16 is not built yet: the experts run in fp32");
    return -1;
  }
  if (recompute) {
    train_errf(err, "--experts with --recompute is not built yet: recomputing a block would "
                    "route and exchange its tokens again");
    return -1;
  }
  return 0;
}

int train_moe_is_expert_tensor(const train_param *p) {
  /* the four expert tensors of an MoE block; the router (mlp.router.w) is replicated */
  return p->layer >= 0 && (strstr(p->name, ".mlp.fc.") || strstr(p->name, ".mlp.proj."));
}

/* ---- state ------------------------------------------------------------------------- */

void train_moe_free(struct train_moe *s) {
  if (!s) return;
  for (int l = 0; s->b && l < s->L; l++) {
    moe_block *b = &s->b[l];
    free(b->probs), free(b->choice), free(b->gate), free(b->pos), free(b->scnt);
    free(b->rcnt), free(b->frac), free(b->xin), free(b->h), free(b->hg), free(b->yback);
  }
  free(s->b);
  free(s->bufA), free(s->bufB), free(s->bufC), free(s->d1), free(s->d2), free(s->dp);
  free(s->stats), free(s->off);
  free(s);
}

struct train_moe *train_moe_create(train_model *m, char *err) {
  struct train_moe *s = calloc(1, sizeof *s);
  if (!s) goto oom;
  s->L = m->cfg.layers;
  s->E = m->experts;
  s->K = m->topk;
  s->X = m->ep > 1 ? m->ep : 1;
  s->El = s->E / s->X;
  s->C = m->cfg.channels;
  s->Nmax = m->maxB * m->maxT;
  s->cf = m->capacity;
  s->coef = m->aux_coef;
  size_t N = (size_t)s->Nmax, E = s->E, K = s->K, C = s->C;
  size_t cap = (size_t)train_moe_capacity(s->Nmax, s->E, s->K, s->cf);
  size_t kl = K < (size_t)s->El ? K : (size_t)s->El; /* a token visits an expert once */
  s->Smax = cap ? (E * cap > N * K ? E * cap : N * K) : N * K;
  s->Rmax = cap ? (size_t)s->X * s->El * cap : (size_t)s->X * N * kl;
  size_t rows = s->Smax > s->Rmax ? s->Smax : s->Rmax;
  s->b = calloc((size_t)s->L, sizeof *s->b);
  if (!s->b) goto oom;
  for (int l = 0; l < s->L; l++) {
    moe_block *b = &s->b[l];
    b->probs = calloc(N * E, sizeof(float));
    b->choice = calloc(N * K, sizeof(int));
    b->gate = calloc(N * K, sizeof(float));
    b->pos = calloc(N * K, sizeof(int));
    b->scnt = calloc(E, sizeof(int));
    b->rcnt = calloc(E, sizeof(int));
    b->frac = calloc(E, sizeof(float));
    b->xin = calloc(s->Rmax * C + 1, sizeof(float));
    b->h = calloc(s->Rmax * 4 * C + 1, sizeof(float));
    b->hg = calloc(s->Rmax * 4 * C + 1, sizeof(float));
    b->yback = calloc(s->Smax * C + 1, sizeof(float));
    if (!b->probs || !b->choice || !b->gate || !b->pos || !b->scnt || !b->rcnt || !b->frac ||
        !b->xin || !b->h || !b->hg || !b->yback)
      goto oom;
  }
  s->bufA = calloc(rows * C + 1, sizeof(float));
  s->bufB = calloc(rows * C + 1, sizeof(float));
  s->bufC = calloc(rows * C + 1, sizeof(float));
  s->d1 = calloc(s->Rmax * 4 * C + 1, sizeof(float));
  s->d2 = calloc(s->Rmax * 4 * C + 1, sizeof(float));
  s->dp = calloc(N * E, sizeof(float));
  s->stats = calloc(2 * E + 2, sizeof(float));
  s->off = calloc(3 * E, sizeof(int)); /* counts, starts, fills */
  if (!s->bufA || !s->bufB || !s->bufC || !s->d1 || !s->d2 || !s->dp || !s->stats || !s->off)
    goto oom;
  return s;
oom:
  train_moe_free(s);
  train_errf(err, "out of memory for the mixture of experts' routing and activations");
  return NULL;
}

/* ---- pieces ------------------------------------------------------------------------- */

/* Block l's tensor j (8 fc.w, 9 fc.b, 10 proj.w, 11 proj.b, 12 router.w) in base. */
static float *tensor(const train_model *m, float *base, int l, int j) {
  return base + m->tensors[2 + l * m->block_tensors + j].offset;
}

/* Rows per rank of a list of per-expert counts grouped by rank (X groups of El). */
static void per_rank(const int *cnt, int X, int El, int *out) {
  for (int j = 0; j < X; j++) {
    out[j] = 0;
    for (int e = 0; e < El; e++) out[j] += cnt[j * El + e];
  }
}

/* The exchange of rows: comm's, or with one rank the identity. */
static void exchange(train_model *m, const train_moe_comm *comm, const float *send,
                     const int *scount, float *recv, const int *rcount, int X, int C, int fixed,
                     const char *what) {
  if (comm) {
    comm->rows(m, send, scount, recv, rcount, C, fixed, what);
    return;
  }
  (void)X;
  memcpy(recv, send, (size_t)scount[0] * C * sizeof(float));
}

/* Source-major (block s: local expert e's rcnt[s*El+e] rows) <-> expert-major (expert e:
 * source s's rows); to_expert 1: src is source-major. */
static void permute(const moe_block *b, int X, int El, int C, const float *src, float *dst,
                    int to_expert) {
  size_t at_src = 0; /* walking the source-major order */
  for (int s = 0; s < X; s++)
    for (int e = 0; e < El; e++) {
      /* expert-major offset of (e, s): rows of experts < e, then of (e, sources < s) */
      size_t at_exp = 0;
      for (int e2 = 0; e2 < e; e2++)
        for (int s2 = 0; s2 < X; s2++) at_exp += (size_t)b->rcnt[s2 * El + e2];
      for (int s2 = 0; s2 < s; s2++) at_exp += (size_t)b->rcnt[s2 * El + e];
      size_t n = (size_t)b->rcnt[s * El + e] * C;
      if (to_expert)
        memcpy(dst + at_exp * C, src + at_src * C, n * sizeof(float));
      else
        memcpy(dst + at_src * C, src + at_exp * C, n * sizeof(float));
      at_src += (size_t)b->rcnt[s * El + e];
    }
}

/* Rows and first row (expert-major) of local expert e. */
static int expert_rows(const moe_block *b, int X, int El, int e, size_t *first) {
  size_t at = 0;
  for (int e2 = 0; e2 < e; e2++)
    for (int s = 0; s < X; s++) at += (size_t)b->rcnt[s * El + e2];
  int n = 0;
  for (int s = 0; s < X; s++) n += b->rcnt[s * El + e];
  *first = at;
  return n;
}

/* Router, top-k, the send order and the statistics of block l. */
static void route(train_model *m, const train_moe_comm *comm, struct train_moe *s, moe_block *b,
                  int l, const float *x, int N) {
  int E = s->E, K = s->K, C = s->C;
  float *Wr = tensor(m, m->params, l, 12);
  m->ops->matmul_forward(b->probs, x, Wr, NULL, N, C, E);
  for (int t = 0; t < N; t++) { /* softmax, in place */
    float *p = b->probs + (size_t)t * E, mx = p[0];
    for (int i = 1; i < E; i++) mx = p[i] > mx ? p[i] : mx;
    double z = 0.0;
    for (int i = 0; i < E; i++) {
      p[i] = expf(p[i] - mx);
      z += p[i];
    }
    float inv = (float)(1.0 / z);
    for (int i = 0; i < E; i++) p[i] *= inv;
  }
  int *cnt = s->off; /* assignments per expert, before any drop */
  memset(cnt, 0, (size_t)E * sizeof(int));
  for (int t = 0; t < N; t++) {
    const float *p = b->probs + (size_t)t * E;
    for (int k = 0; k < K; k++) { /* the k-th largest not yet taken; ties: lower expert */
      int best = -1;
      for (int i = 0; i < E; i++) {
        int taken = 0;
        for (int k2 = 0; k2 < k; k2++) taken |= b->choice[(size_t)t * K + k2] == i;
        if (!taken && (best < 0 || p[i] > p[best])) best = i;
      }
      b->choice[(size_t)t * K + k] = best;
      b->gate[(size_t)t * K + k] = p[best];
      cnt[best]++;
    }
  }
  /* the send order: expert-major, token order inside; capacity keeps the first cap */
  int cap = train_moe_capacity(N, E, K, s->cf);
  int *start = s->off + E, *used = s->off + 2 * E;
  double dropped = 0.0;
  int at = 0;
  for (int i = 0; i < E; i++) {
    b->scnt[i] = cap ? cap : cnt[i];
    start[i] = at;
    at += b->scnt[i];
  }
  b->S = at;
  memset(used, 0, (size_t)E * sizeof(int));
  for (int t = 0; t < N; t++)
    for (int k = 0; k < K; k++) {
      int i = b->choice[(size_t)t * K + k];
      if (!cap || used[i] < cap) {
        b->pos[(size_t)t * K + k] = start[i] + used[i]++;
      } else {
        b->pos[(size_t)t * K + k] = -1;
        dropped += 1.0;
      }
    }
  /* the statistics, over the global batch */
  float *st = s->stats;
  for (int i = 0; i < E; i++) {
    double ps = 0.0;
    for (int t = 0; t < N; t++) ps += b->probs[(size_t)t * E + i];
    st[i] = (float)cnt[i];
    st[E + i] = (float)ps;
  }
  st[2 * E] = (float)N;
  st[2 * E + 1] = (float)dropped;
  b->targets = m->have_targets;
  if (b->targets && comm) comm->stats_sum(m, st, 2 * E + 2);
  double gN = st[2 * E] > 0 ? st[2 * E] : 1.0, aux = 0.0, mx = 0.0;
  for (int i = 0; i < E; i++) {
    b->frac[i] = (float)(st[i] / (gN * K));
    aux += (double)b->frac[i] * (st[E + i] / gN);
    mx = st[i] > mx ? st[i] : mx;
  }
  b->aux = s->coef * E * aux;
  b->load = mx / (gN * K / E);
  b->dropped = st[2 * E + 1] / (gN * K);
}

void train_moe_forward(train_model *m, const train_moe_comm *comm, int l, float *out,
                       const float *x, int N) {
  struct train_moe *s = m->moe;
  moe_block *b = &s->b[l];
  const train_ops *o = m->ops;
  int E = s->E, K = s->K, C = s->C, X = comm ? s->X : 1, El = E / X;
  b->N = N;
  route(m, comm, s, b, l, x, N);
  int cap = train_moe_capacity(N, E, K, s->cf);

  /* dispatch: the rows in send order, then the counts and the rows to the experts */
  float *send = s->bufA;
  if (cap) memset(send, 0, (size_t)b->S * C * sizeof(float)); /* the padding */
  for (int t = 0; t < N; t++)
    for (int k = 0; k < K; k++) {
      int p = b->pos[(size_t)t * K + k];
      if (p >= 0) memcpy(send + (size_t)p * C, x + (size_t)t * C, (size_t)C * sizeof(float));
    }
  int sc[1024], rc[1024]; /* rows per rank (X <= 1024: the launcher's limit) */
  per_rank(b->scnt, X, El, sc);
  if (!comm)
    memcpy(b->rcnt, b->scnt, (size_t)E * sizeof(int));
  else if (cap)
    for (int i = 0; i < X * El; i++) b->rcnt[i] = cap;
  else
    comm->counts(m, b->scnt, b->rcnt, El);
  per_rank(b->rcnt, X, El, rc);
  b->R = 0;
  for (int j = 0; j < X; j++) b->R += rc[j];
  if ((size_t)b->R > s->Rmax) { /* a peer's counts beyond what any routing can give */
    if (m->layer_ops->fail) m->layer_ops->fail(m, "expert dispatch: more rows than any routing");
    memset(b->rcnt, 0, (size_t)E * sizeof(int));
    memset(rc, 0, sizeof(int) * (size_t)X);
    b->R = 0;
  }
  char what[32];
  snprintf(what, sizeof what, "dispatch %d", l);
  exchange(m, comm, send, sc, s->bufB, rc, X, C, cap > 0, what);
  double sent = 0.0;
  for (int j = 0; j < X; j++)
    if (j != (comm ? m->ep_rank : 0)) sent += sc[j];
  b->sent = sent;
  permute(b, X, El, C, s->bufB, b->xin, 1);

  /* the local experts, one matmul each over its rows */
  float *Wfc = tensor(m, m->params, l, 8), *bfc = tensor(m, m->params, l, 9),
        *Wpr = tensor(m, m->params, l, 10), *bpr = tensor(m, m->params, l, 11);
  float *y = s->bufA;
  for (int e = 0; e < El; e++) {
    size_t r0;
    int n = expert_rows(b, X, El, e, &r0);
    if (n == 0) continue;
    o->matmul_forward(b->h + r0 * 4 * C, b->xin + r0 * C, Wfc + (size_t)e * 4 * C * C,
                      bfc + (size_t)e * 4 * C, n, C, 4 * C);
    o->gelu_forward(b->hg + r0 * 4 * C, b->h + r0 * 4 * C, (size_t)n * 4 * C);
    o->matmul_forward(y + r0 * C, b->hg + r0 * 4 * C, Wpr + (size_t)e * C * 4 * C,
                      bpr + (size_t)e * C, n, 4 * C, C);
  }

  /* combine: back to the tokens' ranks (the mirror splits), weighted by the gates */
  permute(b, X, El, C, y, s->bufB, 0);
  snprintf(what, sizeof what, "combine %d", l);
  exchange(m, comm, s->bufB, rc, b->yback, sc, X, C, cap > 0, what);
  memset(out, 0, (size_t)N * C * sizeof(float));
  for (int t = 0; t < N; t++)
    for (int k = 0; k < K; k++) {
      int p = b->pos[(size_t)t * K + k];
      if (p < 0) continue;
      float g = b->gate[(size_t)t * K + k];
      float *ot = out + (size_t)t * C;
      const float *yt = b->yback + (size_t)p * C;
      for (int c = 0; c < C; c++) ot[c] += g * yt[c];
    }
}

void train_moe_backward(train_model *m, const train_moe_comm *comm, int l, float *dinp,
                        const float *dout, const float *x, int N) {
  struct train_moe *s = m->moe;
  moe_block *b = &s->b[l];
  const train_ops *o = m->ops;
  int E = s->E, K = s->K, C = s->C, X = comm ? s->X : 1, El = E / X;
  int cap = train_moe_capacity(N, E, K, s->cf);
  float *dp = s->dp;
  memset(dp, 0, (size_t)N * E * sizeof(float));

  /* the gates' gradients, and the experts' output gradients in send order */
  float *dy = s->bufA;
  memset(dy, 0, (size_t)b->S * C * sizeof(float));
  for (int t = 0; t < N; t++)
    for (int k = 0; k < K; k++) {
      int p = b->pos[(size_t)t * K + k];
      if (p < 0) continue;
      float g = b->gate[(size_t)t * K + k], dg = 0.0f;
      const float *dt = dout + (size_t)t * C, *yt = b->yback + (size_t)p * C;
      float *d = dy + (size_t)p * C;
      for (int c = 0; c < C; c++) {
        d[c] = g * dt[c];
        dg += dt[c] * yt[c];
      }
      dp[(size_t)t * E + b->choice[(size_t)t * K + k]] += dg;
    }
  int sc[1024], rc[1024];
  per_rank(b->scnt, X, El, sc);
  per_rank(b->rcnt, X, El, rc);
  char what[32];
  snprintf(what, sizeof what, "dispatch grad %d", l);
  exchange(m, comm, dy, sc, s->bufB, rc, X, C, cap > 0, what);
  permute(b, X, El, C, s->bufB, s->bufC, 1);

  /* each local expert's backward over its rows: weights += and the input gradient */
  float *Wfc = tensor(m, m->params, l, 8), *Wpr = tensor(m, m->params, l, 10);
  float *gWfc = tensor(m, m->grads, l, 8), *gbfc = tensor(m, m->grads, l, 9),
        *gWpr = tensor(m, m->grads, l, 10), *gbpr = tensor(m, m->grads, l, 11);
  float *dxin = s->bufA;
  memset(dxin, 0, (size_t)b->R * C * sizeof(float));
  for (int e = 0; e < El; e++) {
    size_t r0;
    int n = expert_rows(b, X, El, e, &r0);
    if (n == 0) continue;
    size_t n4 = (size_t)n * 4 * C;
    memset(s->d1, 0, n4 * sizeof(float));
    o->matmul_backward(s->d1, gWpr + (size_t)e * C * 4 * C, gbpr + (size_t)e * C, s->bufC + r0 * C,
                       b->hg + r0 * 4 * C, Wpr + (size_t)e * C * 4 * C, n, 4 * C, C);
    memset(s->d2, 0, n4 * sizeof(float));
    o->gelu_backward(s->d2, b->h + r0 * 4 * C, s->d1, n4);
    o->matmul_backward(dxin + r0 * C, gWfc + (size_t)e * 4 * C * C, gbfc + (size_t)e * 4 * C, s->d2,
                       b->xin + r0 * C, Wfc + (size_t)e * 4 * C * C, n, C, 4 * C);
  }
  permute(b, X, El, C, dxin, s->bufB, 0);
  snprintf(what, sizeof what, "combine grad %d", l);
  exchange(m, comm, s->bufB, rc, s->bufC, sc, X, C, cap > 0, what);
  for (int t = 0; t < N; t++)
    for (int k = 0; k < K; k++) {
      int p = b->pos[(size_t)t * K + k];
      if (p < 0) continue;
      float *di = dinp + (size_t)t * C;
      const float *dx = s->bufC + (size_t)p * C;
      for (int c = 0; c < C; c++) di[c] += dx[c];
    }

  /* the router: the auxiliary loss's gradient, the softmax's, the matmul's */
  if (b->targets && s->coef > 0.0f)
    for (int i = 0; i < E; i++) {
      float a = m->loss_scale * s->coef * (float)E * b->frac[i] / (float)N;
      for (int t = 0; t < N; t++) dp[(size_t)t * E + i] += a;
    }
  for (int t = 0; t < N; t++) {
    const float *p = b->probs + (size_t)t * E;
    float *d = dp + (size_t)t * E, dot = 0.0f;
    for (int i = 0; i < E; i++) dot += p[i] * d[i];
    for (int i = 0; i < E; i++) d[i] = p[i] * (d[i] - dot);
  }
  float *Wr = tensor(m, m->params, l, 12), *gWr = tensor(m, m->grads, l, 12);
  o->matmul_backward(dinp, gWr, NULL, dp, x, Wr, N, C, E);
}

void train_moe_stats_read(const train_model *m, train_moe_stats *out) {
  memset(out, 0, sizeof *out);
  const struct train_moe *s = m->moe;
  if (!s || s->L < 1) return;
  for (int l = 0; l < s->L; l++) {
    const moe_block *b = &s->b[l];
    out->aux += b->aux;
    out->load += b->load / s->L;
    out->load_max = b->load > out->load_max ? b->load : out->load_max;
    out->dropped += b->dropped / s->L;
    out->rows_sent += b->sent;
  }
}
