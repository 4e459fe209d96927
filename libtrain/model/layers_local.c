/*
 * layers_local.c — the layer operations (model.h: train_layer_ops) of a model that holds
 * every layer whole: no group, nothing to communicate, each operation its kernel alone.
 * They are the calls the passes made before tensor parallelism became layer operations
 * (a Linear and its bias in one matmul, the LayerNorm over all rows), so one process
 * computes bit for bit what it did. Every model starts with them (train_model_create_tp);
 * a strategy that splits the layers installs its own over them and puts them back.
 */
#include "model/model.h"
#include "model/moe.h"

static void embed_forward(train_model *m, float *out, const int *inp, const float *wte,
                          const float *wpe, int B, int T, int C) {
  m->ops->encoder_forward(out, inp, wte, wpe, B, T, C);
}

static void embed_backward(train_model *m, float *dwte, float *dwpe, const float *dout,
                           const int *inp, int B, int T, int C) {
  m->ops->encoder_backward(dwte, dwpe, dout, inp, B, T, C);
}

/* seq_rank is 0 here unless the model was made for a rank of a sequence-parallel group
 * (and then the group's operations replace these before a pass runs) */
static void ln_forward(train_model *m, float *out, float *mean, float *rstd, const float *inp,
                       const float *w, const float *b, int Nr, int C, const char *what) {
  (void)what;
  m->ops->layernorm_forward(out + (size_t)m->seq_rank * Nr * C, mean, rstd, inp, w, b, Nr, C);
}

static void ln_backward(train_model *m, float *dinp, float *dw, float *db, const float *dout,
                        const float *inp, const float *w, const float *mean, const float *rstd,
                        int Nr, int C, const char *what) {
  (void)what;
  m->ops->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, Nr, C);
}

static void linear_forward(train_model *m, float *out, const float *inp, const float *w,
                           const float *b, int N, int C, int OC) {
  m->ops->matmul_forward(out, inp, w, b, N, C, OC);
}

static void linear_backward(train_model *m, float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC,
                            const char *what) {
  (void)what;
  m->ops->matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC);
}

static void head_backward(train_model *m, float *dinp, float *dw, const float *dout,
                          const float *inp, const float *w, int N, int C, int V) {
  m->ops->matmul_backward(dinp, dw, NULL, dout, inp, w, N, C, V);
}

/* one matmul with its bias, as the single-process pass always computed it */
static void row_forward(train_model *m, float *out, const float *inp, const float *w,
                        const float *b, int N, int C, int OC, const char *what) {
  (void)what;
  m->ops->matmul_forward(out, inp, w, b, N, C, OC);
}

static void xent_forward(train_model *m, float *losses, float *probs, const float *logits,
                         const int *targets, int N) {
  m->ops->crossentropy_forward(losses, probs, logits, targets, N, m->vocab_local);
}

static void xent_backward(train_model *m, float *dlogits, const float *probs, const int *targets,
                          float dloss, int N) {
  m->ops->crossentropy_backward(dlogits, probs, targets, dloss, N, m->vocab_local);
}

void train_local_attn_forward(train_model *m, int i, float *out, float *att, const float *qkv,
                              int B, int T, int C, int NH) {
  (void)i;
  m->ops->attention_forward(out, att, qkv, B, T, C, NH);
}

void train_local_attn_backward(train_model *m, int i, float *dqkv, float *datt, const float *dout,
                               const float *qkv, const float *att, const float *out, int B, int T,
                               int C, int NH) {
  (void)i;
  (void)out; /* the saved probabilities are enough */
  m->ops->attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
}

static double grad_sumsq(train_model *m) {
  if (m->bf16) return m->ops->sumsq_bf16(m->grads16, m->nparams);
  return m->ops->sumsq(m->grads, m->nparams);
}

/* Nothing keeps a single process's failures: the pass that fails returns NaN. */
static void fail(train_model *m, const char *msg) {
  (void)m;
  (void)msg;
}

/* every expert here: nothing crosses a rank, the router's statistics are this batch's */
static void moe_forward(train_model *m, int l, float *out, const float *inp, int N) {
  train_moe_forward(m, NULL, l, out, inp, N);
}

static void moe_backward(train_model *m, int l, float *dinp, const float *dout, const float *inp,
                         int N) {
  train_moe_backward(m, NULL, l, dinp, dout, inp, N);
}

static const train_layer_ops local_ops = {
    .name = "local",
    .embed_forward = embed_forward,
    .embed_backward = embed_backward,
    .ln_forward = ln_forward,
    .ln_backward = ln_backward,
    .col_forward = linear_forward,
    .col_backward = linear_backward,
    .head_backward = head_backward,
    .row_forward = row_forward,
    .row_backward = linear_backward,
    .xent_forward = xent_forward,
    .xent_backward = xent_backward,
    .attn_forward = train_local_attn_forward,
    .attn_backward = train_local_attn_backward,
    .grad_sumsq = grad_sumsq,
    .fail = fail,
    .moe_forward = moe_forward,
    .moe_backward = moe_backward,
};

const train_layer_ops *train_local_layer_ops(void) { return &local_ops; }
