/*
 * train.h — public interface of libtrain, the single-process GPT-2-style trainer.
 *
 * The model is a decoder-only transformer (token + position embeddings, L pre-LayerNorm
 * blocks of causal self-attention and a GELU MLP, final LayerNorm, LM head tied to the
 * token embedding, softmax cross-entropy). Everything a parallel layer (DDP, FSDP, TP)
 * needs to see is laid out for ranges:
 *
 *   - all parameters live in ONE flat float array; every tensor is a view (offset, numel)
 *     into it, in the order listed by train_param_info(); per-layer tensors are contiguous
 *     per block, so "block l" is one range and "all blocks after l" is one range;
 *   - gradients mirror the parameter layout exactly (same offsets), and so do the two
 *     AdamW moment arrays;
 *   - backward ACCUMULATES into the gradient array (+=): zero it once per step
 *     (train_zero_grad) and gradient accumulation over micro-batches comes for free.
 *
 * The same model runs on the CPU (OpenBLAS matmuls + plain C) or, when built with CUDA,
 * on a GPU (cuBLAS matmuls + CUDA kernels). Pointers returned by train_params() /
 * train_grads() point into device memory on the GPU; use train_copy_params_to_host().
 *
 * Errors: functions that can fail return 0 on success and -1 on failure, writing a
 * one-line message (no trailing newline) into an `err` buffer of TRAIN_ERRLEN bytes.
 */
#ifndef TRAIN_H
#define TRAIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TRAIN_API __attribute__((visibility("default")))
#define TRAIN_ERRLEN 512

/* ---- model ---------------------------------------------------------------------- */

typedef struct train_config {
  int vocab;    /* V: vocabulary size (256 for the byte tokenizer) */
  int max_seq;  /* maxT: rows of the position table; the longest sequence the model takes */
  int layers;   /* L: number of transformer blocks */
  int channels; /* C: embedding width; must be divisible by heads */
  int heads;    /* NH: attention heads; head size is C / NH */
} train_config;

typedef enum train_device { TRAIN_DEVICE_CPU = 0, TRAIN_DEVICE_CUDA = 1 } train_device;

/* One parameter tensor: a view into the flat parameter array. */
typedef struct train_param {
  char name[32]; /* e.g. "wte", "h.3.attn.qkv.w", "lnf.b" */
  size_t offset; /* in floats, from the start of the flat array */
  size_t numel;
  int ndim;     /* 1 or 2 */
  int shape[2]; /* (rows, cols) for 2-D tensors; Linear weights are (out, in) */
  int decay;    /* 1 if AdamW weight decay applies (matrices and embeddings) */
  int layer;    /* block index, or -1 for embeddings / final LayerNorm */
} train_param;

typedef struct train_model train_model;

/* Checks a configuration; returns 0 or -1 with a message naming the problem. */
TRAIN_API int train_config_check(const train_config *cfg, char *err);

/* Creates a model able to run batches of up to B sequences of up to T tokens, with
 * parameters initialised from `seed` (GPT-2 init: N(0, 0.02), residual projections
 * scaled by 1/sqrt(2L), LayerNorm 1/0, biases 0). threads <= 0 means "all CPUs". */
TRAIN_API train_model *train_model_create(const train_config *cfg, int B, int T, train_device dev,
                                          int threads, uint64_t seed, char *err);
TRAIN_API void train_model_free(train_model *m);

TRAIN_API const train_config *train_model_config(const train_model *m);
TRAIN_API train_device train_model_device(const train_model *m);
TRAIN_API size_t train_num_params(const train_model *m);
TRAIN_API int train_num_tensors(const train_model *m);
TRAIN_API const train_param *train_param_info(const train_model *m, int i);
/* Bytes of activation memory held for backward at the (B, T) the model was created for. */
TRAIN_API size_t train_activation_bytes(const train_model *m);

/* Flat arrays (device memory when the model runs on a GPU). */
TRAIN_API float *train_params(train_model *m);
TRAIN_API float *train_grads(train_model *m);
TRAIN_API void train_copy_params_to_host(const train_model *m, float *dst);
TRAIN_API void train_copy_params_from_host(train_model *m, const float *src);
TRAIN_API void train_copy_grads_to_host(const train_model *m, float *dst);

/* Forward pass over inputs (B,T) of token ids. With targets (B,T) it also computes the
 * mean cross-entropy and returns it; without (targets == NULL) it returns 0 and only
 * the logits are valid. B and T may be smaller than at creation. */
TRAIN_API float train_forward(train_model *m, const int *inputs, const int *targets, int B, int T);
/* Logits of the last forward, (B,T,V), copied to host memory `dst`. */
TRAIN_API void train_copy_logits_to_host(const train_model *m, float *dst);
TRAIN_API void train_zero_grad(train_model *m);
/* Backward of the last forward (which must have had targets): grads += dloss/dparams. */
TRAIN_API void train_backward(train_model *m);
/* Multiplies the loss seen by backward (default 1): gradients become scale * dloss/dparams.
 * Gradient accumulation over K micro-batches uses 1/K, so the sum is a mean. */
TRAIN_API void train_set_loss_scale(train_model *m, float scale);
/* Called by train_backward each time a suffix of the gradient array becomes final:
 * every gradient at flat offset >= final_from will not change again in this backward.
 * `layer` names the stage just finished: cfg.layers for the final LayerNorm (the LM head's
 * share of wte is not final yet: wte is tied), l for block l (top-down), -1 for the
 * embeddings, after which final_from is 0. A parallel layer (DDP) hangs its bucket launches
 * here; the hook must not touch gradients below final_from. NULL removes it. */
typedef void (*train_backward_hook)(void *arg, size_t final_from, int layer);
TRAIN_API void train_set_backward_hook(train_model *m, train_backward_hook fn, void *arg);
/* Called by train_forward as each stage finishes (after the device has finished it): -1
 * the embeddings, l block l, cfg.layers the final LayerNorm + LM head (+ loss). For
 * timelines (DDP --trace); it costs a device sync per stage, so leave it NULL otherwise. */
typedef void (*train_forward_hook)(void *arg, int stage);
TRAIN_API void train_set_forward_hook(train_model *m, train_forward_hook fn, void *arg);

/* ---- optimizer ------------------------------------------------------------------ */

typedef struct train_hparams {
  float lr;          /* peak learning rate */
  float min_lr_frac; /* cosine decays to lr * min_lr_frac */
  int warmup;        /* linear warmup steps */
  int steps;         /* total steps (end of the cosine) */
  float beta1, beta2, eps;
  float weight_decay; /* decoupled, on tensors with decay == 1 */
  float grad_clip;    /* clip the global gradient norm to this; <= 0 disables */
} train_hparams;

TRAIN_API train_hparams train_hparams_default(void);
/* Learning rate at 0-based `step`: linear warmup to lr over `warmup` steps, then a cosine
 * from lr down to lr*min_lr_frac at step `steps`. */
TRAIN_API float train_lr_at(const train_hparams *hp, long step);
/* Global L2 norm of the gradients; when it exceeds hp->grad_clip the gradients are
 * scaled by grad_clip / (norm + 1e-6). Returns the norm before clipping. */
TRAIN_API float train_clip_grads(train_model *m, const train_hparams *hp);
/* One AdamW step (t = 1-based step count, for bias correction) at learning rate lr. */
TRAIN_API void train_adamw_step(train_model *m, const train_hparams *hp, float lr, long t);
/* Moment arrays (device memory on GPU), NULL until the first step; to host: */
TRAIN_API int train_copy_opt_to_host(const train_model *m, float *m_dst, float *v_dst);
TRAIN_API void train_copy_opt_from_host(train_model *m, const float *m_src, const float *v_src);

/* ---- data ----------------------------------------------------------------------- */

/* Token file format (little-endian):
 *   bytes 0..7    magic "COLLTOK1"
 *   bytes 8..11   u32 version (1)
 *   bytes 12..15  u32 vocab size the ids are drawn from
 *   bytes 16..23  u64 number of tokens N
 *   bytes 24..    N x u16 token ids, each < vocab
 * Any file that does not start with the magic is raw text, tokenised byte by byte
 * (vocab 256). */
#define TRAIN_TOKFILE_MAGIC "COLLTOK1"
#define TRAIN_TOKFILE_HEADER 24

typedef struct train_data train_data;

/* path == NULL: the embedded corpus. Fails (one-line message) on a missing, unreadable,
 * empty or corrupt file, ids >= vocab, or too few tokens for one (seq+1) window in
 * either the training or the validation split (last 10%). */
TRAIN_API train_data *train_data_open(const char *path, int vocab, int seq, char *err);
TRAIN_API void train_data_free(train_data *d);
TRAIN_API size_t train_data_tokens(const train_data *d);
TRAIN_API uint64_t train_data_hash(const train_data *d);
TRAIN_API const char *train_data_name(const train_data *d);
/* Writes ids as a token file (temp file + fsync + rename). */
TRAIN_API int train_tokfile_write(const char *path, const int *ids, size_t n, int vocab, char *err);
/* The embedded public-domain corpus (raw text). */
TRAIN_API const char *train_corpus(size_t *len);

/* Deterministic order: the training split is cut into windows of seq+1 tokens starting at
 * a per-epoch random offset, and the windows are visited in a per-epoch random
 * permutation; both depend only on (seed, epoch). The position is (epoch, index). */
typedef struct train_loader_state {
  uint64_t seed;
  uint64_t epoch;
  uint64_t index;
} train_loader_state;

/* Fills inputs (B,T) and targets (B,T) with the next training batch and advances st. */
TRAIN_API void train_data_next_batch(train_data *d, train_loader_state *st, int B, int T,
                                     int *inputs, int *targets);
/* Rows [row0, row0 + nrows) of that same next batch of B rows (inputs and targets are
 * (nrows,T)), advancing st past all B rows: how a data-parallel rank reads its disjoint
 * slice of the global batch, so that N ranks together see exactly what one process
 * would. */
TRAIN_API void train_data_next_rows(train_data *d, train_loader_state *st, int B, int T, int row0,
                                    int nrows, int *inputs, int *targets);
/* Validation batch number k (deterministic, no state); returns 0 when k is past the end. */
TRAIN_API int train_data_val_batch(const train_data *d, int k, int B, int T, int *inputs,
                                   int *targets);

/* ---- training session (model + data + optimizer + step), with checkpoints --------- */

/* Activation recomputation: what forward keeps for backward. FULL keeps each block's
 * input only and runs the block's forward again in backward (Megatron's full
 * recomputation); SELECTIVE drops the attention probabilities (B·NH·T·T floats a block,
 * the largest activation) and recomputes them from q, k, v (Korthikanti et al.). */
typedef enum {
  TRAIN_RECOMPUTE_NONE = 0,
  TRAIN_RECOMPUTE_FULL = 1,
  TRAIN_RECOMPUTE_SELECTIVE = 2
} train_recompute;

/* 0, or -1 with a sentence when a --dtype bf16 model cannot be built for this device (the
 * CPU only: the kernels that widen and round are the CPU's). */
TRAIN_API int train_bf16_check(train_device dev, char *err);

typedef struct train_options {
  train_config cfg;
  train_hparams hp;
  int batch, seq;
  uint64_t seed;
  train_device device;
  int threads;
  const char *data_path; /* NULL: embedded corpus */
  /* Tensor parallelism (tp.h): the model holds rank tp_rank's slice of a model split tp
   * ways (0 or 1: the whole model). */
  int tp, tp_rank;
  int sp; /* with tp > 1: sequence parallelism (batch*seq a multiple of tp) */
  /* Pipeline parallelism (parallel/pipeline.c): the model holds stage pp_rank's pp_chunks
   * pieces of a model cut into pp * pp_chunks (0 or 1: no pipeline), with pp_slots
   * activation sets (micro-batch chunks in flight). */
  int pp, pp_rank, pp_chunks, pp_slots;
  int pp_split_w; /* zero-bubble: backward split into input (B) and weight (W) gradients */
  int recompute;  /* train_recompute */
  int bf16;       /* --dtype bf16: bf16 weights, activations and gradients, fp32 master */
  /* Mixture of experts (model/moe.h; 0 experts: the dense MLP): every block's MLP is
   * `experts` GPT-2 MLPs behind a router that sends each token to its `topk` best;
   * capacity_factor > 0 pads each expert to ceil(cf*tokens*topk/experts) rows and drops
   * the overflow (0: dropless); aux_coef weighs the load-balancing loss. With ep > 1 the
   * model holds rank ep_rank's experts/ep of them (parallel/ep.h). */
  int experts, topk, ep, ep_rank;
  float capacity_factor, aux_coef;
  /* Context parallelism (parallel/cp.h): the sequence split over cp ranks (0 or 1: none);
   * the model is made for seq/cp positions per sequence, its chunks of every sequence. */
  int cp;
} train_options;

typedef struct train_step_stats {
  long step; /* 1-based number of the step just taken */
  float loss;
  float lr;
  float grad_norm;
  double ms;
  double tokens_per_s;
} train_step_stats;

typedef struct train_session train_session;

TRAIN_API train_session *train_session_create(const train_options *opt, char *err);
TRAIN_API void train_session_free(train_session *s);
TRAIN_API train_model *train_session_model(train_session *s);
TRAIN_API train_data *train_session_data(train_session *s);
TRAIN_API long train_session_step_count(const train_session *s);
/* One optimizer step: next batch, forward, backward, clip, AdamW.  On a GPU its work can
 * fail after the calls that issued it returned: check train_session_status after it. */
TRAIN_API train_step_stats train_session_step(train_session *s);
/* 0, or -1 with a sentence in err when the device reported a failure (CUDA reports them
 * late, so a step's results count only if this is 0 after it).  Always 0 on the CPU. */
TRAIN_API int train_session_status(train_session *s, char *err);
/* Mean validation loss over up to `batches` validation batches. */
TRAIN_API float train_session_val_loss(train_session *s, int batches);
/* Generates n bytes after `prompt` by sampling (temperature 1) from the model, using
 * and advancing the session's sampling RNG. out must hold n + 1 bytes. */
TRAIN_API void train_session_sample(train_session *s, const char *prompt, int n, char *out);

/* Checkpoints (version 5, little-endian; the byte tables in parallel/checkpoint.c): a
 * manifest at `path` ("COLLTRN\0", the model config, global batch, seq, seed, step,
 * sampling RNG, data position, data size and hash, hyper-parameters, parameter count, the
 * T x S x P grid the state is cut on, the pipeline stage that wrote each unit and each
 * shard file's size and FNV-1a hash) and T*S*P shard files `path.shard<t>.<s>of<T>x<S>`
 * (P = 1) or `path.shard<t>.<s>.<p>of<T>x<S>x<P>` (params, AdamW m and v of their part).
 * save writes one process's: T = S = P = 1, the manifest and one shard, each atomically
 * (temp file in the same directory, fsync, rename, fsync of the directory), the manifest
 * last. load reads any grid (any number of ranks, tensor-parallel, sharded or pipelined;
 * version 4 too) into any session, a pipeline stage's included: it checks magic, version,
 * sizes, config, data and every hash before touching the session. */
TRAIN_API int train_session_save(train_session *s, const char *path, char *err);
TRAIN_API int train_session_load(train_session *s, const char *path, char *err);
/* Data-parallel runs read batch * mult rows per optimizer step (mult = ranks * accum; a
 * pipeline: data-parallel ranks * micro-batches):
 * sharded checkpoints record and check that global batch, so a run saved at N ranks
 * resumes at M ranks (or in one process) with the same rows per step. Default 1. */
TRAIN_API void train_session_set_batch_mult(train_session *s, int mult);

/* ---- misc ----------------------------------------------------------------------- */

/* Writes the loss curve as an SVG (atomically): loss[i] is the training loss of step
 * first_step + i; val[j] the validation loss at step val_steps[j] (may be NULL/0). */
TRAIN_API int train_plot_svg(const char *path, long first_step, const float *loss, long n,
                             const long *val_steps, const float *val, long nval, const char *title,
                             char *err);
/* Model FLOPs per token for forward+backward at sequence length T (see model.c). */
TRAIN_API double train_flops_per_token(const train_config *cfg, int T);
/* CPUs this process may run on (the default thread count). */
TRAIN_API int train_cpu_threads(void);
/* Name of the CUDA device, or NULL when CUDA is unavailable (reason in err). */
TRAIN_API const char *train_cuda_device_name(char *err);
/* Peak fp32 FLOP/s of the CUDA device (0 if unknown), for MFU. */
TRAIN_API double train_cuda_peak_flops(void);

#ifdef __cplusplus
}
#endif
#endif
