/*
 * model.h — what the model's sources and the layers above share and users do not see: the
 * table of layer kernels ("ops") that the CPU (layers_cpu.c) and CUDA (layers_cuda.cu) back
 * ends both fill in, the table of layer operations ("layer ops": the layers a parallel
 * strategy may split) that layers_local.c fills in for one process and a strategy may
 * replace (parallel/tp.c), the model and session structs. It never includes anything
 * from parallel/, comm/ or app/: the model is called, it does not call up.
 *
 * model.c drives the forward and backward passes only through these tables and pointer
 * arithmetic on flat buffers, so one orchestration serves both devices and every
 * strategy.
 */
#ifndef TRAIN_MODEL_MODEL_H
#define TRAIN_MODEL_MODEL_H

#include "base/util.h"
#include "train.h"

#include <stdarg.h>

/* The most pipeline chunks (virtual stages) one rank holds. */
#define TRAIN_MAX_CHUNKS 16
#include <stdio.h>
#include <stdlib.h>

/* Layer kernels. Shapes in the comments: N = B*T rows. All backward kernels ACCUMULATE
 * (+=) into their outputs. Pointers are device pointers on the GPU. */
typedef struct train_ops {
  const char *name;
  void *(*alloc)(size_t bytes); /* zero-filled */
  void (*release)(void *p);
  void (*zero)(void *p, size_t bytes);
  void (*to_host)(void *dst, const void *src, size_t bytes);
  void (*to_device)(void *dst, const void *src, size_t bytes);
  void (*set_threads)(int threads);

  /* out (B,T,C) = wte[inp] + wpe[t]; inp (B,T) ids */
  void (*encoder_forward)(float *out, const int *inp, const float *wte, const float *wpe, int B,
                          int T, int C);
  /* dwte, dwpe += scatter of dout (B,T,C) */
  void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                           int T, int C);
  /* out (N,C) = (inp - mean) * rstd * w + b; saves mean, rstd (N) */
  void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp, const float *w,
                            const float *b, int N, int C);
  void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                             const float *w, const float *mean, const float *rstd, int N, int C);
  /* out (N,OC) = inp (N,C) @ w (OC,C)^T + b (OC), b may be NULL */
  void (*matmul_forward)(float *out, const float *inp, const float *w, const float *b, int N, int C,
                         int OC);
  /* dinp (N,C) += dout @ w; dw (OC,C) += dout^T @ inp; db (OC) += sum_rows dout */
  void (*matmul_backward)(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                          const float *w, int N, int C, int OC);
  /* qkv (B,T,3C) -> out (B,T,C); att (B,NH,T,T) saves the softmax probabilities */
  void (*attention_forward)(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
  /* dqkv (B,T,3C) +=; datt (B,NH,T,T) is scratch (overwritten) */
  void (*attention_backward)(float *dqkv, float *datt, const float *dout, const float *qkv,
                             const float *att, int B, int T, int C, int NH);
  /* out (n) = gelu_tanh(inp) */
  void (*gelu_forward)(float *out, const float *inp, size_t n);
  void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n);
  /* out (n) = a + b */
  void (*residual_forward)(float *out, const float *a, const float *b, size_t n);
  /* probs (N,V) = softmax(logits); losses (N) = -log probs[target]; the CPU's may run in
   * place (probs == logits: the bf16 model's working set does) */
  void (*crossentropy_forward)(float *losses, float *probs, const float *logits, const int *targets,
                               int N, int V);
  /* dlogits (N,V) += (probs - onehot(target)) * dloss */
  void (*crossentropy_backward)(float *dlogits, const float *probs, const int *targets, float dloss,
                                int N, int V);
  /* sum of losses (N), accumulated in double */
  double (*sum)(const float *x, size_t n);
  /* sum of squares, accumulated in double */
  double (*sumsq)(const float *x, size_t n);
  void (*scale)(float *x, float s, size_t n);
  /* AdamW on one range [0,n) (one tensor); wd = 0 for tensors without decay;
   * bc1, bc2 are the bias corrections 1 - beta^t (formula in layers_cpu.c) */
  void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                float beta2, float eps, float wd, float bc1, float bc2);
  /* bfloat16 (--dtype bf16, the CPU only; NULL on devices without them): f32 -> bf16
   * rounds to nearest even; the sums widen to float; adamw_bf16 updates fp32 master
   * weights p from bf16 gradients and writes their bf16 copy p16 */
  void (*to_bf16)(uint16_t *dst, const float *src, size_t n);
  void (*from_bf16)(float *dst, const uint16_t *src, size_t n);
  double (*sumsq_bf16)(const uint16_t *x, size_t n);
  void (*scale_bf16)(uint16_t *x, float s, size_t n);
  void (*adamw_bf16)(float *p, uint16_t *p16, const uint16_t *g, float *m, float *v, size_t n,
                     float lr, float beta1, float beta2, float eps, float wd, float bc1, float bc2);
  void (*sync)(void);
  /* Device ops only (NULL on the CPU, where work is done when its call returns): mark
   * records an event on the compute stream after the work issued so far and returns it
   * (from a ring the ops own: valid for the next 256 marks); wait_mark blocks the host
   * until the compute stream has passed it — that stream alone, never the streams that
   * communication runs on (sync, cudaDeviceSynchronize, would wait for those too, and
   * so serialise communication with backward).  0, or -1 with a sentence in err. */
  void *(*mark)(void);
  int (*wait_mark)(void *mark, char *err);
  /* Device ops only (NULL on the CPU, whose calls cannot fail): 0, or -1 with the
   * sentence of the first device call that failed.  Sticky: a device's results after a
   * failure are not to be trusted, so the trainer checks it after every step
   * (train_session_status) and stops with that sentence. */
  int (*error)(char *err);
} train_ops;

const train_ops *train_cpu_ops(void);
/* NULL when CUDA is not built in or no usable GPU is present (reason in err). */
TRAIN_API const train_ops *train_cuda_ops(char *err); /* exported: cuda_dlopen.c finds it */

/* Forward activations, views into one allocation (sizes for the B,T of creation). */
typedef struct train_acts {
  float *encoded;   /* (B,T,C) */
  float *ln1;       /* (L,B,T,C) */
  float *ln1_mean;  /* (L,B,T) */
  float *ln1_rstd;  /* (L,B,T) */
  float *qkv;       /* (L,B,T,3C) */
  float *atty;      /* (L,B,T,C) */
  float *att;       /* (L,B,NH,T,T) */
  float *residual2; /* (L,B,T,C) */
  float *ln2;       /* (L,B,T,C) */
  float *ln2_mean;  /* (L,B,T) */
  float *ln2_rstd;  /* (L,B,T) */
  float *fch;       /* (L,B,T,4C) */
  float *fch_gelu;  /* (L,B,T,4C) */
  float *residual3; /* (L,B,T,C) */
  float *lnf;       /* (B,T,C) */
  float *lnf_mean;  /* (B,T) */
  float *lnf_rstd;  /* (B,T) */
  float *logits;    /* (B,T,V) */
  float *probs;     /* (B,T,V) */
  float *losses;    /* (B,T) */
  float *branch;    /* (B,T,C) output of a block's attention or MLP projection before it
                     * is added to the residual stream: not needed by backward, so one
                     * buffer serves every block */
  /* zero-bubble (split_w) only: the output gradients B saves for W, per block of the set
   * (the inputs W multiplies them by are the activations above) */
  float *w_fcproj; /* (L,B,T,C)  of mlp.proj */
  float *w_fc;     /* (L,B,T,4C) of mlp.fc */
  float *w_proj;   /* (L,B,T,C)  of attn.proj */
  float *w_qkv;    /* (L,B,T,3C) of attn.qkv */
  float *w_logits; /* (B,T,V)    of the tied head */
  float *w_embed;  /* (B,T,C)    of the embeddings */
  float *grad_io;  /* (B,T,C), pipeline pieces only: the gradient of the piece's output
                    * received from the next piece, then (after its backward) that of its
                    * input to send to the previous one */
} train_acts;

/* bf16 (m->bf16): the activations backward needs, per set, in bfloat16 — the block
 * tensors of every block (fewer under recomputation), the residual stream at every block
 * boundary, the head's LayerNorm and probabilities, the pipeline's transfers. */
typedef struct train_acts16 {
  uint16_t *encoded, *ln1, *qkv, *atty, *att, *residual2, *ln2, *fch, *fch_gelu, *residual3;
  uint16_t *lnf, *probs, *grad_io;
} train_acts16;

/* Backward scratch: one block's worth, reused from the top block down. */
typedef struct train_scratch {
  float *dlogits;   /* (B,T,V) */
  float *dres;      /* (B,T,C) gradient of the residual stream */
  float *dln;       /* (B,T,C) */
  float *datty;     /* (B,T,C) */
  float *dqkv;      /* (B,T,3C) */
  float *dfch_gelu; /* (B,T,4C) */
  float *dfch;      /* (B,T,4C) */
  float *datt;      /* (B,NH,T,T) */
} train_scratch;

/* Parameter tensors of one block, as pointers into a flat array. */
typedef struct train_block {
  float *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb;
  float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} train_block;

/* ---- layer operations ----------------------------------------------------------------
 * The layers a parallel strategy may split, as operations the passes (model.c) call
 * unconditionally: Megatron-LM's column- and row-parallel Linear, vocabulary-parallel
 * embedding and cross-entropy, and the LayerNorm over the rows of the residual stream
 * this rank holds (sequence parallelism), with the communication inside them as named
 * operators (f, g; "what" names them in traces). The model sets the single-process table
 * (layers_local.c: the kernels alone) at creation; a strategy that splits the layers
 * installs its own with a context of its own in train_model.layer_ctx (tensor
 * parallelism does, when its group is attached) — so the model calls down into whatever
 * is installed and never names a strategy. Shapes: N = B*T rows, Nr = N/seq_shards of
 * them held here; Linear widths are this rank's (local) ones. Backward operations
 * ACCUMULATE like the kernels. A collective that fails cannot return an error from inside
 * a pass: the installed table keeps it for its strategy's status call and later
 * collectives do nothing. */
typedef struct train_layer_ops {
  const char *name;
  /* out (Nr,C): this rank's rows of wte[inp] + wpe[t] (wte: the vocabulary rows held
   * here); backward: dwte (those rows), dwpe += the scatter of dout (Nr,C) */
  void (*embed_forward)(train_model *m, float *out, const int *inp, const float *wte,
                        const float *wpe, int B, int T, int C);
  void (*embed_backward)(train_model *m, float *dwte, float *dwpe, const float *dout,
                         const int *inp, int B, int T, int C);
  /* LayerNorm of inp (Nr,C) into rows [seq_rank*Nr, +Nr) of out (N,C), mean and rstd
   * (Nr); then the parallel region is entered: all N rows of out on every rank (f
   * forward: an all-gather under sequence parallelism, else nothing to do) */
  void (*ln_forward)(train_model *m, float *out, float *mean, float *rstd, const float *inp,
                     const float *w, const float *b, int Nr, int C, const char *what);
  /* dinp (Nr,C) +=; dw, db (C) += the weight gradients over all N rows (under sequence
   * parallelism the sum over the group of each rank's partial sums over its rows) */
  void (*ln_backward)(train_model *m, float *dinp, float *dw, float *db, const float *dout,
                      const float *inp, const float *w, const float *mean, const float *rstd,
                      int Nr, int C, const char *what);
  /* column-parallel Linear: out (N,OC) = inp (N,C) @ w^T + b (b may be NULL), OC this
   * rank's output columns; backward: the matmul's, then f backward: dinp (N,C) summed
   * over the group (under sequence parallelism reduce-scattered: its first Nr rows) */
  void (*col_forward)(train_model *m, float *out, const float *inp, const float *w, const float *b,
                      int N, int C, int OC);
  void (*col_backward)(train_model *m, float *dinp, float *dw, float *db, const float *dout,
                       const float *inp, const float *w, int N, int C, int OC, const char *what);
  /* the tied LM head's backward (column-parallel over the vocabulary, no bias): as
   * col_backward, its f counted apart from the blocks' */
  void (*head_backward)(train_model *m, float *dinp, float *dw, const float *dout, const float *inp,
                        const float *w, int N, int C, int V);
  /* row-parallel Linear: out = g(inp (N,C) @ w^T) + b, C this rank's input columns; g
   * forward sums the partial products over the group (under sequence parallelism
   * reduce-scatters them: out's first Nr rows), then the bias is added once. Backward:
   * g backward (the identity; under sequence parallelism the all-gather of dout (Nr,OC)
   * to N rows), then the matmul's. */
  void (*row_forward)(train_model *m, float *out, const float *inp, const float *w, const float *b,
                      int N, int C, int OC, const char *what);
  void (*row_backward)(train_model *m, float *dinp, float *dw, float *db, const float *dout,
                       const float *inp, const float *w, int N, int C, int OC, const char *what);
  /* cross-entropy over the logits (N,vocab_local) of the vocabulary rows held here:
   * probs (N,vocab_local), losses (N); backward: dlogits += (probs - onehot) * dloss */
  void (*xent_forward)(train_model *m, float *losses, float *probs, const float *logits,
                       const int *targets, int N);
  void (*xent_backward)(train_model *m, float *dlogits, const float *probs, const int *targets,
                        float dloss, int N);
  /* causal self-attention over the heads held here: qkv (B,T,3C) -> out (B,T,C), C and NH
   * this rank's width and heads, T the positions held here; att (B,NH,T,T) is what
   * backward reads (the local operation: the softmax probabilities; context parallelism
   * keeps its own state per block and leaves it alone); i: the set's block (its state's
   * key). Backward: dqkv (B,T,3C) +=, from dout and forward's out; datt is scratch
   * (B,NH,T,T). Context parallelism (parallel/cp.c) replaces both: ring attention or
   * Ulysses over its group. */
  void (*attn_forward)(train_model *m, int i, float *out, float *att, const float *qkv, int B,
                       int T, int C, int NH);
  void (*attn_backward)(train_model *m, int i, float *dqkv, float *datt, const float *dout,
                        const float *qkv, const float *att, const float *out, int B, int T, int C,
                        int NH);
  /* squared norm of the whole model's gradient (split tensors summed over the group,
   * replicated ones counted once) */
  double (*grad_sumsq)(train_model *m);
  /* a pass cannot go on (msg: a sentence): kept for the strategy's status */
  void (*fail)(train_model *m, const char *msg);
  /* the mixture-of-experts MLP of local block l (model/moe.h; m->experts > 0): out (N,C)
   * from inp (N,C) — router, dispatch to the experts (all here, or over the
   * expert-parallel group: parallel/ep.c), experts, combine; backward: dinp (N,C) +=,
   * block l's router and expert gradients += */
  void (*moe_forward)(train_model *m, int l, float *out, const float *inp, int N);
  void (*moe_backward)(train_model *m, int l, float *dinp, const float *dout, const float *inp,
                       int N);
  /* the table this one was made over and calls for the operations it does not replace
   * (context parallelism over tensor parallelism), or NULL; layer_ctx stays the context
   * of the bottom table */
  const struct train_layer_ops *under;
} train_layer_ops;

/* The single-process operations (layers_local.c). */
const train_layer_ops *train_local_layer_ops(void);
/* The local attention operations alone (the kernels), for tables that do not replace
 * attention (parallel/tp.c). */
void train_local_attn_forward(train_model *m, int i, float *out, float *att, const float *qkv,
                              int B, int T, int C, int NH);
void train_local_attn_backward(train_model *m, int i, float *dqkv, float *datt, const float *dout,
                               const float *qkv, const float *att, const float *out, int B, int T,
                               int C, int NH);

struct train_model {
  train_config cfg;
  /* Tensor-parallel shape (1, 0 on a single process): this rank holds heads
   * [tp_rank*NH/tp, +NH/tp), MLP rows [tp_rank*4C/tp, +4C/tp) and vocabulary rows
   * [tp_rank*vocab_local, +vocab_local) of the vocabulary padded to tp*vocab_local;
   * heads_local = NH/tp heads of width_local = C/tp channels in all. */
  int tp, tp_rank, vocab_local, heads_local, width_local;
  /* Rows of the residual stream held here (model.c's top): of N = B*T rows, Nr =
   * N/seq_shards from row seq_rank*Nr; seq_shards = tp under sequence parallelism,
   * else 1 (and seq_rank 0). */
  int seq_shards, seq_rank;
  /* Pipeline pieces (model.c's top, train_pp_piece). The whole model's layers_total
   * blocks are cut into pieces; this model holds nchunks of them, chunk c being its local
   * blocks [chunk_loc0[c], +chunk_len[c]) = the whole model's [chunk_blk0[c], +chunk_len[c]).
   * has_embed: it holds the embeddings (its chunk 0 is the first piece); has_head: the
   * final LayerNorm and the tied head (its last chunk is the last piece); pp: the stages
   * of the pipeline (1: no pipeline, one chunk of every block and both ends). */
  int layers_total, nchunks, has_embed, has_head, pp;
  /* zero-bubble: train_piece_backward computes the input gradients only (B) and saves the
   * output gradients the weight gradients need; train_piece_weights computes those (W) */
  int split_w;
  /* Activation recomputation (train_recompute): what forward keeps for backward */
  int recompute;
  int chunk_blk0[TRAIN_MAX_CHUNKS], chunk_loc0[TRAIN_MAX_CHUNKS], chunk_len[TRAIN_MAX_CHUNKS];
  /* Activation sets: nslots of them, act_floats each, one per (micro-batch, chunk) in
   * flight; acts, inputs and targets view set `slot` (train_model_use_slot). A set holds
   * act_layers blocks' activations (the longest chunk). */
  int nslots, slot, act_layers;
  /* bfloat16 (--dtype bf16; the CPU, the single-process layer operations): params is the
   * fp32 master copy (AdamW's), params16 the bf16 weights the passes read, grads16 the
   * bf16 gradients (grads is NULL); a pass widens one unit at a time (the embeddings, a
   * block, the final LayerNorm) into wpar and wgrad (fp32, wunit floats each) and
   * computes each block in one shared fp32 working set (work: acts' block tensors, one
   * block), keeping what backward needs in bf16 per set (acts16, act16_n each) and the
   * LayerNorm statistics and losses in fp32 (acts' other fields, per set). */
  int bf16;
  uint16_t *params16, *grads16;
  float *wpar, *wgrad, *work;
  size_t wunit, work_floats;
  uint16_t *actmem16;
  size_t act16_n;
  train_acts16 acts16;
  int *slot_inputs, *slot_targets;  /* device, nslots * (B,T) */
  const train_layer_ops *layer_ops; /* train_local_layer_ops() unless a strategy's */
  void *layer_ctx;                  /* the installed operations' context (NULL: the local ones) */
  train_device dev;
  const train_ops *ops;
  int maxB, maxT; /* batch shape the buffers were sized for */
  int ntensors;
  train_param *tensors;
  size_t nparams;
  float *params, *grads;  /* device */
  float *adam_m, *adam_v; /* device, allocated on the first step */
  float *actmem;          /* device */
  size_t act_floats;
  train_acts acts;
  float *scratchmem;
  train_scratch scr;
  int *inputs, *targets; /* device (B,T) */
  int lastB, lastT, have_targets;
  float last_loss;
  float loss_scale;             /* dloss multiplier in backward (1; 1/K for accumulation) */
  train_backward_hook bwd_hook; /* called as gradients become final (DDP), may be NULL */
  void *bwd_hook_arg;
  void *grad_mark;             /* device: ops->mark() taken just before bwd_hook is called:
                                  the gradients it declares final are written once the
                                  compute stream passes it (NULL on the CPU) */
  train_forward_hook fwd_hook; /* called as forward stages finish (timelines), may be NULL */
  void *fwd_hook_arg;
  /* Mixture of experts (model/moe.h; experts 0: the dense MLP): topk, the capacity
   * factor (0: dropless), the auxiliary loss's coefficient; this rank holds experts
   * [ep_rank*E/ep, +E/ep) of an expert-parallel group of ep (1, 0: all of them). A block
   * has block_tensors tensors: 12, plus mlp.router.w under MoE. moe: the routing and the
   * experts' activations (moe.c). */
  int experts, topk, ep, ep_rank, block_tensors;
  float capacity, aux_coef;
  struct train_moe *moe;
  /* FSDP (ZeRO-3): block l's parameters are read from block_params[l] (its tensors at
   * the same offsets relative to the block's first tensor) instead of from `params`,
   * where that block's range is then not kept. NULL (the array or an entry): `params`. */
  float **block_params;
};

/* How a model is split across processes (train_model_create_split): tp ways of tensor
 * parallelism (rank tp_rank, sp: sequence parallelism inside), and the pipeline: pp
 * stages, this being pp_rank, each holding `chunks` pieces (virtual stages), with `slots`
 * activation sets. Zeroes mean no split: {0} is the single-process model. */
typedef struct train_split {
  int tp, tp_rank, sp;
  int pp, pp_rank, chunks, slots;
  int split_w;   /* zero-bubble: backward split into B and W (train_piece_weights) */
  int recompute; /* train_recompute: the activations forward keeps */
  int bf16;      /* bf16 weights, activations and gradients over fp32 master weights */
  /* mixture of experts (model/moe.h): 0 experts: the dense MLP; ep ranks of expert
   * parallelism, this one ep_rank */
  int experts, topk, ep, ep_rank;
  float capacity, aux_coef;
} train_split;

/* The stated rule that cuts L blocks into U pieces: piece u holds blocks [*first, +*len),
 * floor(L/U) each and one more for pieces 1..L%U, so the pieces at the ends — the first
 * carries the embeddings, the last the final LayerNorm, the head and the loss — are never
 * the longer ones. -1 when L < U (a piece without a block). */
int train_pp_piece(int L, int U, int u, int *first, int *len);
/* A model of the local shapes of split `sp` (NULL: the single-process model). Parameters
 * are those of the single-process model from the same seed, sliced and cut. */
train_model *train_model_create_split(const train_config *cfg, int B, int T, train_device dev,
                                      int threads, uint64_t seed, const train_split *sp, char *err);
/* The same sizes as train_model_sizes for rank 0 of tp and stage `pp_rank` of a split. */
int train_model_sizes_split(const train_config *cfg, int B, int T, const train_split *sp,
                            size_t *nparams, size_t *act_bytes, size_t *unit_len);
/* Selects activation set k (0 <= k < nslots) for the next piece pass. */
void train_model_use_slot(train_model *m, int k);
/* Forward of chunk c on the selected set: from the embeddings of inputs when c is the
 * first piece, else from the set's input activation (train_piece_input, written by the
 * caller); through the loss when c is the last piece (targets needed; returns the loss),
 * else to train_piece_output (returns 0). */
float train_piece_forward(train_model *m, int c, const int *inputs, const int *targets, int B,
                          int T);
/* Backward of chunk c on the selected set (forwarded with targets): from the loss when c
 * is the last piece, else from the gradient the caller wrote at train_piece_grad_io; when
 * c is not the first piece it leaves the gradient of its input at train_piece_grad_io. */
void train_piece_backward(train_model *m, int c);
/* split_w: the weight gradients of chunk c on the selected set, from what its
 * train_piece_backward saved — the Linears' weights and biases, the tied head, the
 * embeddings (the LayerNorms' are B's: they come with their input gradient). */
void train_piece_weights(train_model *m, int c);
/* (Nr,C) of the selected set, fp32 or (bf16) bfloat16: train_piece_bytes bytes each */
void *train_piece_input(train_model *m);
void *train_piece_output(train_model *m, int c);
void *train_piece_grad_io(train_model *m);
size_t train_piece_bytes(const train_model *m);

/* Clipping by a squared norm the caller summed (a pipeline stage holds part of the model:
 * the stages' sums add up); returns the norm. */
float train_clip_grads_sq(train_model *m, const train_hparams *hp, double sq);

/* Views of block l (or of embeddings / final LayerNorm) inside a flat array `base`. */
void train_block_view(const train_model *m, float *base, int l, train_block *out);
/* Without allocating: parameter count, activation + backward scratch bytes at (B,T), and
 * (unit_len: L+2 entries, may be NULL) the lengths of the embeddings, each block and the
 * final LayerNorm. -1 when out of memory. */
int train_model_sizes(const train_config *cfg, int B, int T, size_t *nparams, size_t *act_bytes,
                      size_t *unit_len);
/* The same for rank 0 of a tensor-parallel group of tp (local shapes). */
int train_model_sizes_tp(const train_config *cfg, int B, int T, int tp, int sp, size_t *nparams,
                         size_t *act_bytes, size_t *unit_len);
/* Block l's parameters, wherever they live (block_params[l] or params). */
void train_block_params_view(const train_model *m, int l, train_block *out);
float *train_tensor(const train_model *m, float *base, const char *name);
/* A model of the local shapes of tensor-parallel rank tp_rank of tp (tp = 1: the
 * single-process model; train_model_create is this with 1, 0). Parameters are those of
 * the single-process model from the same seed, sliced (so T ranks together hold it). */
train_model *train_model_create_tp(const train_config *cfg, int B, int T, train_device dev,
                                   int threads, uint64_t seed, int tp, int tp_rank, int sp,
                                   char *err);

/* How tensor-parallel ranks split the model's tensors (model.c's top: the weights of its
 * column- and row-parallel layers, and wte): 1 for a split tensor, 0 for a replicated one. */
int train_param_is_split(const char *name);
/* Copies between a full tensor fp (at full) and rank's slice lp of it (at local), to_local
 * 1: full -> local, 0: local -> its place in full. */
void train_param_slice(const train_param *fp, const train_param *lp, int rank, float *full,
                       float *local, int to_local);
/* 0, or -1 with a sentence when a batch of B sequences of T tokens does not fit the model:
 * B or T below 1, or T longer than the position table (cfg->max_seq).  A run, a session
 * and the planner all ask this one question. */
int train_shape_check(const train_config *cfg, int B, int T, char *err);
/* 0, or -1 with a sentence when the model cannot be split `ways` ways (heads not a
 * multiple of it, more ways than vocabulary entries, a device other than the CPU). */
int train_model_split_check(const train_config *cfg, int ways, train_device dev, char *err);
/* 0, or -1 with a sentence when the model cannot be cut into pp stages of `chunks` pieces
 * each (fewer blocks than pieces, too many chunks, a device other than the CPU). */
int train_pp_split_check(const train_config *cfg, int pp, int chunks, train_device dev, char *err);


/* ---- session (session.c), shared with the checkpoint code (parallel/checkpoint.c) ---- */
struct train_session {
  train_options opt;
  char data_path[4096];
  train_model *model;
  train_data *data;
  train_loader_state pos; /* data position */
  long step;              /* optimizer steps taken */
  uint64_t sample_rng;    /* state of the sampling RNG */
  int *inputs, *targets;  /* host (B,T) */
  float *logits;          /* host (T,V), for sampling */
  int batch_mult;         /* rows per optimizer step = batch * batch_mult (0: 1); what a
                           * checkpoint records as its batch */
};
#endif
