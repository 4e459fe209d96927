/*
 * model.c — the GPT-2-style model: parameter layout, initialisation, and the forward and
 * backward passes written out layer by layer.
 *
 * Layout (one flat float array; gradients and AdamW moments mirror it):
 *
 *   wte (V,C) | wpe (maxT,C) | block 0 | block 1 | ... | block L-1 | lnf.w (C) | lnf.b (C)
 *   block l = ln1.w (C)  ln1.b (C)  attn.qkv.w (3C,C)  attn.qkv.b (3C)
 *             attn.proj.w (C,C)  attn.proj.b (C)  ln2.w (C)  ln2.b (C)
 *             mlp.fc.w (4C,C)  mlp.fc.b (4C)  mlp.proj.w (C,4C)  mlp.proj.b (C)
 *
 * so a block is one contiguous range (what FSDP gathers, what a DDP bucket covers) and
 * the LM head reuses wte (tied weights: its gradient is the sum of both uses). A mixture
 * of experts (moe.h) stacks this rank's experts in the four MLP tensors (mlp.fc.w
 * (El*4C,C) ... mlp.proj.b (El*C)) and adds mlp.router.w (E,C) as a block's 13th tensor
 * (m->block_tensors); its MLP is then the layer operation moe_forward/moe_backward.
 *
 * All arithmetic goes through m->ops (layers_cpu.c or layers_cuda.cu); this file only
 * does pointer arithmetic, so the same code drives both devices.
 *
 * The layers a strategy may split are called as layer operations (model.h:
 * train_layer_ops, m->layer_ops), the rest as kernels: the embedding, the LayerNorms, the
 * column-parallel Linears (attn.qkv, mlp.fc, the LM head), the row-parallel ones
 * (attn.proj, mlp.proj), the cross-entropy, attention (context parallelism's ring or
 * Ulysses, parallel/cp.c, replaces it and the embedding's positions). The passes call them
 * the same way whatever is installed: the single-process operations (layers_local.c) or the
 * tensor-parallel ones (parallel/tp.c), which carry Megatron's f and g inside them. The passes hold
 * no branch per strategy; what differs between them is shape, fixed at creation:
 *
 * Tensor parallelism is the same layout at local widths: with T ranks a block holds NH/T
 * heads (attn.qkv.w (3C/T,C), attn.proj.w (C,C/T)), 4C/T MLP rows (mlp.fc.w (4C/T,C),
 * mlp.proj.w (C,4C/T)) and wte holds V/T vocabulary rows; the residual width C and the
 * LayerNorms do not change (train_param_slice: the slice of each tensor).
 *
 * Sequence parallelism (m->seq_shards = T, under TP) shards the residual stream and the
 * LayerNorms along the rows: of the N = B*T rows this rank holds Nr = N/T, rows
 * [seq_rank*Nr, +Nr). Those buffers (encoded, residual2/3, the LayerNorm statistics) hold
 * Nr rows; a LayerNorm writes its rows at their place in its full (N,C) output, and its
 * operation gathers the rest for the column-parallel Linear; the row-parallel Linear's
 * output comes back as Nr rows. On one process or without SP, seq_shards is 1 and Nr = N.
 */
#include "model/model.h"
#include "model/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK_TENSORS 12

int train_config_check(const train_config *c, char *err) {
  if (c->vocab < 2 || c->vocab > 65536) {
    train_errf(err, "impossible config: vocab %d must be in 2..65536", c->vocab);
    return -1;
  }
  if (c->layers < 1 || c->layers > 1024) {
    train_errf(err, "impossible config: layers %d must be in 1..1024", c->layers);
    return -1;
  }
  if (c->heads < 1) {
    train_errf(err, "impossible config: heads %d must be at least 1", c->heads);
    return -1;
  }
  if (c->channels < 1 || c->channels > 65536) {
    train_errf(err, "impossible config: channels %d must be in 1..65536", c->channels);
    return -1;
  }
  if (c->channels % c->heads != 0) {
    train_errf(err, "impossible config: channels %d is not divisible by heads %d", c->channels,
               c->heads);
    return -1;
  }
  if (c->max_seq < 1 || c->max_seq > 1 << 20) {
    train_errf(err, "impossible config: max_seq %d must be in 1..1048576", c->max_seq);
    return -1;
  }
  return 0;
}

int train_shape_check(const train_config *cfg, int B, int T, char *err) {
  if (B < 1 || T < 1) {
    train_errf(err, "impossible config: batch %d and sequence length %d must be >= 1", B, T);
    return -1;
  }
  if (T > cfg->max_seq) {
    train_errf(err,
               "impossible config: sequence length %d is longer than the position "
               "table (max_seq %d)",
               T, cfg->max_seq);
    return -1;
  }
  return 0;
}

/* The splits of the layout below: heads, MLP rows and vocabulary rows, `ways` ways each
 * (the messages name the option that asks for them). */
int train_model_split_check(const train_config *c, int ways, train_device dev, char *err) {
  if (ways < 1) {
    train_errf(err, "--tp %d: the tensor-parallel size must be at least 1", ways);
    return -1;
  }
  if (c->heads % ways != 0) {
    train_errf(err,
               "--tp %d: the %d attention heads cannot be split evenly over %d "
               "tensor-parallel ranks (heads must be a multiple of --tp)",
               ways, c->heads, ways);
    return -1;
  }
  if (ways > c->vocab) {
    train_errf(err, "--tp %d: more tensor-parallel ranks than vocabulary entries (%d)", ways,
               c->vocab);
    return -1;
  }
  /* the tensor-parallel layer operations work on host memory */
  if (ways > 1 && dev != TRAIN_DEVICE_CPU) {
    train_errf(err, "--tp %d: tensor parallelism runs on the CPU model only (--device cpu)", ways);
    return -1;
  }
  return 0;
}

int train_pp_split_check(const train_config *c, int pp, int chunks, train_device dev, char *err) {
  pp = pp > 1 ? pp : 1;
  chunks = chunks > 1 ? chunks : 1;
  if (pp == 1 && chunks == 1) return 0;
  if (chunks > TRAIN_MAX_CHUNKS) {
    train_errf(err, "--chunks %d: at most %d model chunks per pipeline stage", chunks,
               TRAIN_MAX_CHUNKS);
    return -1;
  }
  if (c->layers < pp * chunks) {
    train_errf(err,
               "--layers %d cannot be cut into %d pipeline pieces (--pp %d x --chunks %d): "
               "each piece needs a block",
               c->layers, pp * chunks, pp, chunks);
    return -1;
  }
  if (dev != TRAIN_DEVICE_CPU) { /* the pieces' transfers go through host memory */
    train_errf(err, "--pp %d: pipeline parallelism runs on the CPU model only (--device cpu)", pp);
    return -1;
  }
  return 0;
}

int train_bf16_check(train_device dev, char *err) {
  if (dev != TRAIN_DEVICE_CPU) {
    train_errf(err, "--dtype bf16 runs on the CPU model only (--device cpu)");
    return -1;
  }
  return 0;
}

static void add_tensor(train_model *m, const char *name, int layer, int rows, int cols, int decay) {
  train_param *p = &m->tensors[m->ntensors++];
  snprintf(p->name, sizeof p->name, "%s", name);
  p->offset = m->nparams;
  p->ndim = cols > 0 ? 2 : 1;
  p->shape[0] = rows;
  p->shape[1] = cols > 0 ? cols : 1;
  p->numel = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
  p->decay = decay;
  p->layer = layer;
  m->nparams += p->numel;
}

/* The shape of rank `rank` of a tensor-parallel group of tp (1, 0: the whole model), with
 * sp: sequence parallelism inside it. Every pass and layout reads these fields. */
int train_pp_piece(int L, int U, int u, int *first, int *len) {
  if (U < 1 || L < U || u < 0 || u >= U) return -1;
  int q = L / U, r = L % U;
  /* pieces 1..r get q + 1 blocks: piece u starts after u pieces of q and min(u-1, r)
   * (or none, u = 0) extra blocks */
  int extra_before = u == 0 ? 0 : (u - 1 < r ? u - 1 : r);
  *first = u * q + extra_before;
  *len = q + (u >= 1 && u <= r ? 1 : 0);
  return 0;
}

/* The pipeline shape: stage pp_rank of pp holds pieces pp_rank, pp_rank + pp, ... of
 * pp*chunks; {0,0,0}: one chunk of every block with both ends. -1 when L cannot be cut. */
static int set_pieces(train_model *m, int pp, int pp_rank, int chunks) {
  int L = m->cfg.layers;
  pp = pp > 1 ? pp : 1;
  chunks = chunks > 1 ? chunks : 1;
  if (chunks > TRAIN_MAX_CHUNKS) return -1;
  m->pp = pp;
  m->layers_total = L;
  m->nchunks = chunks;
  int U = pp * chunks, loc = 0;
  for (int c = 0; c < chunks; c++) {
    int u = c * pp + pp_rank;
    if (train_pp_piece(L, U, u, &m->chunk_blk0[c], &m->chunk_len[c]) != 0) return -1;
    m->chunk_loc0[c] = loc;
    loc += m->chunk_len[c];
  }
  m->has_embed = pp_rank == 0;
  m->has_head = pp_rank == pp - 1;
  m->cfg.layers = loc; /* the blocks held here: every pass and layout reads cfg.layers */
  int mx = 0;
  for (int c = 0; c < chunks; c++) mx = m->chunk_len[c] > mx ? m->chunk_len[c] : mx;
  m->act_layers = mx;
  return 0;
}

/* The whole model's index of local block l. */
static int global_block(const train_model *m, int l) {
  for (int c = 0; c < m->nchunks; c++)
    if (l < m->chunk_loc0[c] + m->chunk_len[c]) return m->chunk_blk0[c] + (l - m->chunk_loc0[c]);
  return l;
}

static void set_shape(train_model *m, int tp, int rank, int sp) {
  m->tp = tp > 1 ? tp : 1;
  m->tp_rank = tp > 1 ? rank : 0;
  m->vocab_local = (m->cfg.vocab + m->tp - 1) / m->tp; /* V padded to a multiple of T */
  m->heads_local = m->cfg.heads / m->tp;
  m->width_local = m->cfg.channels / m->tp;
  m->seq_shards = sp && m->tp > 1 ? m->tp : 1;
  m->seq_rank = m->seq_shards > 1 ? m->tp_rank : 0;
}

/* The mixture-of-experts shape (split: experts 0 for the dense MLP): a block gets the
 * router as its 13th tensor, and its MLP tensors hold this rank's experts stacked. */
static void set_moe(train_model *m, const train_split *sp) {
  m->experts = sp && sp->experts > 0 ? sp->experts : 0;
  m->topk = m->experts ? sp->topk : 0;
  m->ep = m->experts && sp->ep > 1 ? sp->ep : 1;
  m->ep_rank = m->ep > 1 ? sp->ep_rank : 0;
  m->capacity = m->experts ? sp->capacity : 0.0f;
  m->aux_coef = m->experts ? sp->aux_coef : 0.0f;
  m->block_tensors = BLOCK_TENSORS + (m->experts ? 1 : 0);
}

static void build_layout(train_model *m) {
  const train_config *c = &m->cfg;
  int C = c->channels, Cl = m->width_local;     /* Cl: this rank's attention width */
  int El = m->experts ? m->experts / m->ep : 1; /* the MLPs held per block (moe.h) */
  char nm[32];
  m->tensors = calloc((size_t)c->layers * m->block_tensors + 4, sizeof *m->tensors);
  if (!m->tensors) return;
  /* a pipeline stage keeps every tensor's place in the list, with no elements where it
   * holds none: wte on the stages with the embeddings or the head (tied), wpe with the
   * embeddings, the final LayerNorm with the head; blocks keep the whole model's names */
  add_tensor(m, "wte", -1, m->has_embed || m->has_head ? m->vocab_local : 0, C, 1);
  add_tensor(m, "wpe", -1, m->has_embed ? c->max_seq : 0, C, 1);
  for (int l = 0; l < c->layers; l++) {
    int gl = global_block(m, l);
#define T_(suffix, rows, cols, decay)          \
  snprintf(nm, sizeof nm, "h.%d." suffix, gl); \
  add_tensor(m, nm, l, rows, cols, decay)
    T_("ln1.w", C, 0, 0);
    T_("ln1.b", C, 0, 0);
    T_("attn.qkv.w", 3 * Cl, C, 1);
    T_("attn.qkv.b", 3 * Cl, 0, 0);
    T_("attn.proj.w", C, Cl, 1);
    T_("attn.proj.b", C, 0, 0);
    T_("ln2.w", C, 0, 0);
    T_("ln2.b", C, 0, 0);
    T_("mlp.fc.w", El * 4 * Cl, C, 1);
    T_("mlp.fc.b", El * 4 * Cl, 0, 0);
    T_("mlp.proj.w", El * C, 4 * Cl, 1);
    T_("mlp.proj.b", El * C, 0, 0);
    if (m->experts) { T_("mlp.router.w", m->experts, C, 1); }
#undef T_
  }
  add_tensor(m, "lnf.w", -1, m->has_head ? C : 0, 0, 0);
  add_tensor(m, "lnf.b", -1, m->has_head ? C : 0, 0, 0);
}

void train_block_view(const train_model *m, float *base, int l, train_block *o) {
  const train_param *t = &m->tensors[2 + l * m->block_tensors];
  float **dst[BLOCK_TENSORS] = {&o->ln1w, &o->ln1b, &o->qkvw, &o->qkvb, &o->projw,   &o->projb,
                                &o->ln2w, &o->ln2b, &o->fcw,  &o->fcb,  &o->fcprojw, &o->fcprojb};
  for (int i = 0; i < BLOCK_TENSORS; i++) *dst[i] = base + t[i].offset;
}

void train_block_params_view(const train_model *m, int l, train_block *o) {
  if (!m->block_params || !m->block_params[l]) {
    train_block_view(m, m->params, l, o);
    return;
  }
  const train_param *t = &m->tensors[2 + l * m->block_tensors];
  float *base = m->block_params[l];
  float **dst[BLOCK_TENSORS] = {&o->ln1w, &o->ln1b, &o->qkvw, &o->qkvb, &o->projw,   &o->projb,
                                &o->ln2w, &o->ln2b, &o->fcw,  &o->fcb,  &o->fcprojw, &o->fcprojb};
  for (int i = 0; i < BLOCK_TENSORS; i++) *dst[i] = base + (t[i].offset - t[0].offset);
}

float *train_tensor(const train_model *m, float *base, const char *name) {
  for (int i = 0; i < m->ntensors; i++)
    if (strcmp(m->tensors[i].name, name) == 0) return base + m->tensors[i].offset;
  return NULL;
}

/* Carves the activation views out of one allocation (or, with mem == NULL, counts). */
/* bf16: the largest unit a pass widens at once, in floats: the embeddings (wte and wpe
 * together: the encoder reads both), a block, the final LayerNorm. */
static size_t bf16_unit(const train_model *m) {
  size_t u = m->tensors[0].numel + m->tensors[1].numel;
  for (int l = 0; l <= m->cfg.layers; l++) { /* l = L: the final LayerNorm */
    size_t a = m->tensors[2 + l * m->block_tensors].offset;
    size_t e = l < m->cfg.layers ? m->tensors[2 + (l + 1) * m->block_tensors].offset : m->nparams;
    u = e - a > u ? e - a : u;
  }
  return u;
}

/* bf16: the per-set fp32 fields (statistics, losses) into mem, the working set into
 * m->work (one block; NULL mem or work: counting). Returns the per-set floats; sets
 * m->work_floats. */
static size_t layout_acts_bf16(train_model *m, float *mem) {
  const train_config *c = &m->cfg;
  size_t B = m->maxB, T = m->maxT, C = c->channels, L = m->act_layers,
         V = m->has_head ? m->vocab_local : 0, NH = m->heads_local, Cl = m->width_local, BT = B * T,
         H = m->has_head ? 1 : 0;
  size_t BTr = BT / m->seq_shards, off = 0, woff = 0, W1 = L > 0 ? 1 : 0;
  train_acts *a = &m->acts;
  float *work = m->work;
  memset(a, 0, sizeof *a);
#define S_(field, n)                 \
  a->field = mem ? mem + off : NULL; \
  off += (n)
#define W_(field, n)                    \
  a->field = work ? work + woff : NULL; \
  woff += (n)
  S_(ln1_mean, L * BTr);
  S_(ln1_rstd, L * BTr);
  S_(ln2_mean, L * BTr);
  S_(ln2_rstd, L * BTr);
  S_(lnf_mean, H * BTr);
  S_(lnf_rstd, H * BTr);
  S_(losses, H * BT);
  size_t Z = m->split_w ? 1 : 0; /* zero-bubble's saved output gradients: fp32, per set */
  S_(w_fcproj, Z * L * BT * C);
  S_(w_fc, Z * L * BT * 4 * Cl);
  S_(w_proj, Z * L * BT * C);
  S_(w_qkv, Z * L * BT * 3 * Cl);
  S_(w_logits, Z * BT * V);
  S_(w_embed, Z * (m->has_embed ? BTr * C : 0));
  W_(encoded, BTr * C); /* the block's input, widened */
  W_(ln1, W1 * BT * C);
  W_(qkv, W1 * BT * 3 * Cl);
  W_(atty, W1 * BT * Cl);
  W_(att, W1 * B * NH * T * T);
  W_(residual2, W1 * BTr * C);
  W_(ln2, W1 * BT * C);
  W_(fch, W1 * BT * 4 * Cl);
  W_(fch_gelu, W1 * BT * 4 * Cl);
  W_(residual3, W1 * BTr * C);
  W_(lnf, H * BT * C);
  W_(logits, BT * V);
  /* the local softmax runs in place (forward needs the logits no longer); the
   * vocabulary-parallel one (tp.c) reads the logits after writing probabilities */
  if (m->tp > 1) {
    W_(probs, BT * V);
  } else {
    a->probs = a->logits;
  }
  W_(branch, BT * C);
#undef S_
#undef W_
  m->work_floats = woff;
  return off;
}

/* bf16: one set's stored activations (NULL mem: counting), in bf16 elements. */
static size_t layout_acts16(train_model *m, uint16_t *mem) {
  const train_config *c = &m->cfg;
  size_t B = m->maxB, T = m->maxT, C = c->channels, L = m->act_layers,
         V = m->has_head ? m->vocab_local : 0, NH = m->heads_local, Cl = m->width_local, BT = B * T,
         H = m->has_head ? 1 : 0, G = m->pp > 1 ? 1 : 0;
  size_t BTr = BT / m->seq_shards, off = 0;
  /* recomputation stores fewer: full none of a block's tensors, selective all but att */
  size_t LB = m->recompute == TRAIN_RECOMPUTE_FULL ? 0 : L;
  size_t LA = m->recompute != TRAIN_RECOMPUTE_NONE ? 0 : L;
  train_acts16 *a = &m->acts16;
#define A_(field, n)                 \
  a->field = mem ? mem + off : NULL; \
  off += (n)
  A_(encoded, BTr * C);
  A_(ln1, LB * BT * C);
  A_(qkv, LB * BT * 3 * Cl);
  A_(atty, LB * BT * Cl);
  A_(att, LA * B * NH * T * T);
  A_(residual2, LB * BTr * C);
  A_(ln2, LB * BT * C);
  A_(fch, LB * BT * 4 * Cl);
  A_(fch_gelu, LB * BT * 4 * Cl);
  A_(residual3, L * BTr * C);
  A_(lnf, H * BT * C);
  A_(probs, BT * V);
  A_(grad_io, G * BTr * C);
#undef A_
  return off;
}

static size_t layout_acts(train_model *m, float *mem) {
  if (m->bf16) return layout_acts_bf16(m, mem);
  const train_config *c = &m->cfg;
  /* one set: the longest chunk's blocks; the head's tensors only where the head is */
  size_t B = m->maxB, T = m->maxT, C = c->channels, L = m->act_layers,
         V = m->has_head ? m->vocab_local : 0, NH = m->heads_local, Cl = m->width_local, BT = B * T,
         H = m->has_head ? 1 : 0, G = m->pp > 1 ? 1 : 0;
  size_t BTr = BT / m->seq_shards; /* rows of the residual stream held here */
  size_t off = 0;
  train_acts *a = &m->acts;
#define A_(field, n)                 \
  a->field = mem ? mem + off : NULL; \
  off += (n)
  /* recomputation keeps fewer blocks of what backward needs: LB blocks of the block's
   * activations (full: one, shared), LA of the attention probabilities (selective: one);
   * every block's output (residual3, the next block's input) always */
  size_t LB = m->recompute == TRAIN_RECOMPUTE_FULL ? (L > 0 ? 1 : 0) : L;
  size_t LA = m->recompute != TRAIN_RECOMPUTE_NONE ? (L > 0 ? 1 : 0) : L;
  A_(encoded, BTr * C);
  A_(ln1, LB * BT * C);
  A_(ln1_mean, LB * BTr);
  A_(ln1_rstd, LB * BTr);
  A_(qkv, LB * BT * 3 * Cl);
  A_(atty, LB * BT * Cl);
  A_(att, LA * B * NH * T * T);
  A_(residual2, LB * BTr * C);
  A_(ln2, LB * BT * C);
  A_(ln2_mean, LB * BTr);
  A_(ln2_rstd, LB * BTr);
  A_(fch, LB * BT * 4 * Cl);
  A_(fch_gelu, LB * BT * 4 * Cl);
  A_(residual3, L * BTr * C);
  A_(lnf, H * BT * C);
  A_(lnf_mean, H * BTr);
  A_(lnf_rstd, H * BTr);
  A_(logits, BT * V);
  A_(probs, BT * V);
  A_(losses, H * BT);
  A_(branch, BT * C);
  size_t Z = m->split_w ? 1 : 0; /* zero-bubble's saved output gradients */
  A_(w_fcproj, Z * L * BT * C);
  A_(w_fc, Z * L * BT * 4 * Cl);
  A_(w_proj, Z * L * BT * C);
  A_(w_qkv, Z * L * BT * 3 * Cl);
  A_(w_logits, Z * BT * V);
  A_(w_embed, Z * (m->has_embed ? BTr * C : 0));
  A_(grad_io, G * BTr * C);
#undef A_
  return off;
}

static size_t layout_scratch(train_model *m, float *mem) {
  size_t B = m->maxB, T = m->maxT, C = m->cfg.channels, V = m->has_head ? m->vocab_local : 0,
         NH = m->heads_local, Cl = m->width_local, BT = B * T;
  size_t off = 0;
  train_scratch *s = &m->scr;
#define S_(field, n)                 \
  s->field = mem ? mem + off : NULL; \
  off += (n)
  S_(dlogits, BT * V);
  S_(dres, BT * C);
  S_(dln, BT * C);
  S_(datty, BT * Cl);
  S_(dqkv, BT * 3 * Cl);
  S_(dfch_gelu, BT * 4 * Cl);
  S_(dfch, BT * 4 * Cl);
  S_(datt, B * NH * T * T);
#undef S_
  return off;
}

int train_model_sizes(const train_config *cfg, int B, int T, size_t *nparams, size_t *act_bytes,
                      size_t *unit_len) {
  return train_model_sizes_tp(cfg, B, T, 1, 0, nparams, act_bytes, unit_len);
}

int train_model_sizes_tp(const train_config *cfg, int B, int T, int tp, int sp, size_t *nparams,
                         size_t *act_bytes, size_t *unit_len) {
  train_split split = {.tp = tp, .sp = sp};
  return train_model_sizes_split(cfg, B, T, &split, nparams, act_bytes, unit_len);
}

int train_model_sizes_split(const train_config *cfg, int B, int T, const train_split *sp,
                            size_t *nparams, size_t *act_bytes, size_t *unit_len) {
  train_model m;
  memset(&m, 0, sizeof m);
  m.cfg = *cfg;
  int tp = sp->tp;
  if (set_pieces(&m, sp->pp, sp->pp_rank, sp->chunks) != 0) return -1;
  m.nslots = sp->slots > 1 ? sp->slots : 1;
  m.split_w = sp->split_w;
  m.recompute = sp->recompute;
  m.bf16 = sp->bf16;
  set_shape(&m, tp, 0, sp->sp && tp > 1 && (B * T) % tp == 0);
  set_moe(&m, sp);
  m.maxB = B;
  m.maxT = T;
  build_layout(&m);
  if (!m.tensors) return -1;
  *nparams = m.nparams;
  *act_bytes = (m.nslots * layout_acts(&m, NULL) + layout_scratch(&m, NULL)) * sizeof(float);
  if (m.bf16) /* the stored bf16 sets and the shared fp32 working set (and units) */
    *act_bytes += m.nslots * layout_acts16(&m, NULL) * sizeof(uint16_t) +
                  (m.work_floats + 2 * bf16_unit(&m)) * sizeof(float);
  int L = m.cfg.layers; /* the blocks held here */
  if (unit_len) {
    unit_len[0] = m.tensors[2].offset;
    for (int l = 0; l < L; l++)
      unit_len[l + 1] = m.tensors[2 + (l + 1) * m.block_tensors].offset -
                        m.tensors[2 + l * m.block_tensors].offset;
    unit_len[L + 1] = m.nparams - m.tensors[2 + L * m.block_tensors].offset;
  }
  free(m.tensors);
  return 0;
}

/* GPT-2 initialisation of one tensor p into x, drawing from rng. */
static void init_tensor(const train_param *p, float *x, uint64_t *rng, float resid_std) {
  const char *dot = strrchr(p->name, '.');
  int is_ln = strstr(p->name, "ln") != NULL;
  if (p->ndim == 2) {
    int resid = strstr(p->name, "attn.proj.w") || strstr(p->name, "mlp.proj.w");
    float std = resid ? resid_std : 0.02f;
    for (size_t k = 0; k < p->numel; k++) x[k] = std * train_rand_normal(rng);
  } else if (is_ln && dot && strcmp(dot, ".w") == 0) {
    for (size_t k = 0; k < p->numel; k++) x[k] = 1.0f;
  } else {
    memset(x, 0, p->numel * sizeof *x);
  }
}

/* The weights of the column-parallel layers (attn.qkv, mlp.fc) are split by output rows,
 * those of the row-parallel ones (attn.proj, mlp.proj) by input columns, wte (embedding and
 * LM head) by vocabulary rows; the biases of row-parallel layers, the LayerNorms and wpe
 * are replicated. */
int train_param_is_split(const char *name) {
  return strcmp(name, "wte") == 0 || strstr(name, "attn.qkv.") || strstr(name, "attn.proj.w") ||
         strstr(name, "mlp.fc.") || strstr(name, "mlp.proj.w");
}

/* Rows split: local row c*Rl + i is full row c*Rc + rank*Rl + i, over `chunks` chunks
 * (3 for qkv: q, k and v are each split by heads; 1 otherwise). Full rows past the end
 * are wte's padding (zero locally). Columns split: local column j of every row is full
 * column rank*Kl + j. */
void train_param_slice(const train_param *fp, const train_param *lp, int rank, float *full,
                       float *local, int to_local) {
  size_t K = (size_t)lp->shape[1];
  if (!train_param_is_split(lp->name)) {
    if (to_local)
      memcpy(local, full, lp->numel * sizeof(float));
    else
      memcpy(full, local, lp->numel * sizeof(float));
    return;
  }
  if (fp->shape[1] != lp->shape[1]) { /* columns */
    size_t Kf = (size_t)fp->shape[1], R = (size_t)lp->shape[0];
    for (size_t j = 0; j < R; j++) {
      float *f = full + j * Kf + (size_t)rank * K, *l = local + j * K;
      if (to_local)
        memcpy(l, f, K * sizeof(float));
      else
        memcpy(f, l, K * sizeof(float));
    }
    return;
  }
  int chunks = strstr(lp->name, "attn.qkv.") ? 3 : 1;
  size_t Rl = (size_t)lp->shape[0] / chunks, Rc = (size_t)fp->shape[0] / chunks;
  for (int c = 0; c < chunks; c++)
    for (size_t i = 0; i < Rl; i++) {
      size_t grow = c * Rc + (size_t)rank * Rl + i;
      float *l = local + (c * Rl + i) * K;
      if (grow >= (size_t)fp->shape[0]) { /* vocabulary padding */
        if (to_local) memset(l, 0, K * sizeof(float));
        continue;
      }
      if (to_local)
        memcpy(l, full + grow * K, K * sizeof(float));
      else
        memcpy(full + grow * K, l, K * sizeof(float));
    }
}

/* The local index of the whole model's tensor i (its layout: wte, wpe, 12 per block, the
 * final LayerNorm), or -1 when this model holds none of it. */
static int local_tensor(const train_model *m, int i, int Ltot) {
  int k = -1;
  if (i < 2)
    k = i;
  else if (i >= 2 + Ltot * m->block_tensors)
    k = m->ntensors - (2 + Ltot * m->block_tensors + 2 - i);
  else {
    int gl = (i - 2) / m->block_tensors, j = (i - 2) % m->block_tensors;
    for (int c = 0; c < m->nchunks && k < 0; c++)
      if (gl >= m->chunk_blk0[c] && gl < m->chunk_blk0[c] + m->chunk_len[c])
        k = 2 + (m->chunk_loc0[c] + gl - m->chunk_blk0[c]) * m->block_tensors + j;
  }
  return k >= 0 && m->tensors[k].numel > 0 ? k : -1;
}

/* Drawn in the whole model's layout order from one splitmix64 stream. A split rank (a
 * tensor-parallel slice, a pipeline stage) draws every full-size tensor in the same order
 * into `full` (room for the largest tensor) and keeps what it holds of it, so the ranks
 * together hold exactly the single-process model of the same seed. */
static int init_params(const train_model *m, float *host, uint64_t seed) {
  uint64_t rng = seed;
  float resid_std = 0.02f / sqrtf(2.0f * (float)m->layers_total);
  if (m->tp <= 1 && m->pp <= 1 && m->ep <= 1) {
    for (int i = 0; i < m->ntensors; i++)
      init_tensor(&m->tensors[i], host + m->tensors[i].offset, &rng, resid_std);
    return 0;
  }
  train_model full;
  memset(&full, 0, sizeof full);
  full.cfg = m->cfg;
  full.cfg.layers = m->layers_total;
  set_pieces(&full, 1, 0, 1);
  set_shape(&full, 1, 0, 0);
  train_split whole = {.experts = m->experts, .topk = m->topk};
  set_moe(&full, &whole); /* every expert */
  build_layout(&full);
  size_t big = 0;
  for (int i = 0; full.tensors && i < full.ntensors; i++)
    big = full.tensors[i].numel > big ? full.tensors[i].numel : big;
  float *x = full.tensors ? malloc(big * sizeof *x) : NULL;
  if (!x) {
    free(full.tensors);
    return -1;
  }
  for (int i = 0; i < full.ntensors; i++) {
    init_tensor(&full.tensors[i], x, &rng, resid_std);
    int k = local_tensor(m, i, m->layers_total);
    if (k >= 0 && m->tensors[k].numel != full.tensors[i].numel && m->ep > 1)
      /* an expert tensor: this rank's experts, contiguous in the stack (moe.h) */
      memcpy(host + m->tensors[k].offset, x + (size_t)m->ep_rank * m->tensors[k].numel,
             m->tensors[k].numel * sizeof(float));
    else if (k >= 0)
      train_param_slice(&full.tensors[i], &m->tensors[k], m->tp_rank, x,
                        host + m->tensors[k].offset, 1);
  }
  free(x);
  free(full.tensors);
  return 0;
}

train_model *train_model_create(const train_config *cfg, int B, int T, train_device dev,
                                int threads, uint64_t seed, char *err) {
  return train_model_create_tp(cfg, B, T, dev, threads, seed, 1, 0, 0, err);
}

train_model *train_model_create_tp(const train_config *cfg, int B, int T, train_device dev,
                                   int threads, uint64_t seed, int tp, int tp_rank, int sp,
                                   char *err) {
  train_split split = {.tp = tp, .tp_rank = tp_rank, .sp = sp};
  return train_model_create_split(cfg, B, T, dev, threads, seed, &split, err);
}

train_model *train_model_create_split(const train_config *cfg, int B, int T, train_device dev,
                                      int threads, uint64_t seed, const train_split *split,
                                      char *err) {
  static const train_split whole;
  if (!split) split = &whole;
  int tp = split->tp, tp_rank = split->tp_rank, sp = split->sp;
  if (train_config_check(cfg, err) != 0) return NULL;
  if (train_pp_split_check(cfg, split->pp, split->chunks, dev, err) != 0) return NULL;
  if (train_model_split_check(cfg, tp > 1 ? tp : 1, dev, err) != 0) return NULL;
  if (sp && (tp < 2 || (B * T) % tp != 0)) {
    train_errf(err,
               "--sp: sequence parallelism needs --tp 2 or more and batch x seq "
               "(%d x %d) a multiple of --tp %d: each rank holds B*T/T rows",
               B, T, tp);
    return NULL;
  }
  if (train_shape_check(cfg, B, T, err) != 0) return NULL;
  if (split->bf16 && train_bf16_check(dev, err) != 0) return NULL;
  if (split->experts &&
      train_moe_check(cfg, split->experts, split->topk, split->ep > 1 ? split->ep : 1,
                      split->capacity, split->aux_coef, dev, tp, split->pp, split->bf16,
                      split->recompute, err) != 0)
    return NULL;
  const train_ops *ops = train_cpu_ops();
  if (dev == TRAIN_DEVICE_CUDA) {
    ops = train_cuda_ops(err);
    if (!ops) return NULL;
  }
  train_model *m = calloc(1, sizeof *m);
  m->cfg = *cfg;
  m->dev = dev;
  m->ops = ops;
  set_pieces(m, split->pp, split->pp_rank, split->chunks); /* checked above */
  m->nslots = split->slots > 1 ? split->slots : 1;
  m->split_w = split->split_w;
  m->recompute = split->recompute;
  m->bf16 = split->bf16;
  set_shape(m, tp, tp_rank, sp);
  set_moe(m, split);
  m->layer_ops = train_local_layer_ops(); /* a strategy's replace them when it attaches */
  m->maxB = B;
  m->maxT = T;
  ops->set_threads(threads > 0 ? threads : train_cpu_count());
  build_layout(m);

  size_t pbytes = m->nparams * sizeof(float);
  m->act_floats = layout_acts(m, NULL);
  size_t sfloats = layout_scratch(m, NULL);
  m->params = ops->alloc(pbytes);
  /* bf16: the gradients, the weights the passes read, the fp32 units and working set and
   * the stored sets; fp32: the gradients */
  if (m->bf16) {
    m->grads16 = ops->alloc(m->nparams * sizeof(uint16_t));
    m->params16 = ops->alloc(m->nparams * sizeof(uint16_t));
    m->wunit = bf16_unit(m);
    m->wpar = ops->alloc(m->wunit * sizeof(float));
    m->wgrad = ops->alloc(m->wunit * sizeof(float));
    m->act16_n = layout_acts16(m, NULL);
    m->actmem16 = ops->alloc(m->nslots * m->act16_n * sizeof(uint16_t));
    m->work = ops->alloc(m->work_floats * sizeof(float)); /* sized by layout_acts above */
    if (!m->grads16 || !m->params16 || !m->wpar || !m->wgrad || !m->actmem16 || !m->work) {
      train_errf(err, "out of memory for the bf16 model's %zu parameters", m->nparams);
      train_model_free(m);
      return NULL;
    }
    m->act_floats = layout_acts(m, NULL); /* the same count; m->work is set now */
  } else {
    m->grads = ops->alloc(pbytes);
  }
  m->actmem = ops->alloc(m->nslots * m->act_floats * sizeof(float));
  m->scratchmem = ops->alloc(sfloats * sizeof(float));
  m->slot_inputs = ops->alloc(m->nslots * (size_t)B * T * sizeof(int));
  m->slot_targets = ops->alloc(m->nslots * (size_t)B * T * sizeof(int));
  if (!m->params || (!m->grads && !m->grads16) || !m->actmem || !m->scratchmem || !m->slot_inputs ||
      !m->slot_targets) {
    train_errf(err,
               "out of %s memory: %zu parameters and %zu activation floats "
               "need %.1f MiB",
               ops->name, m->nparams, m->act_floats,
               (2.0 * pbytes + (m->nslots * m->act_floats + sfloats) * 4.0) / 1048576.0);
    train_model_free(m);
    return NULL;
  }
  m->loss_scale = 1.0f;
  if (m->experts && !(m->moe = train_moe_create(m, err))) {
    train_model_free(m);
    return NULL;
  }
  train_model_use_slot(m, 0);
  layout_scratch(m, m->scratchmem);

  if (dev == TRAIN_DEVICE_CPU) { /* no second copy: it would count in the peak memory */
    if (init_params(m, m->params, seed) != 0) {
      train_errf(err, "out of host memory initialising %zu parameters", m->nparams);
      train_model_free(m);
      return NULL;
    }
    if (m->bf16) ops->to_bf16(m->params16, m->params, m->nparams); /* the weights read */
    return m;
  }
  float *host = malloc(pbytes);
  if (!host) {
    train_errf(err, "out of host memory for %zu parameters", m->nparams);
    train_model_free(m);
    return NULL;
  }
  if (init_params(m, host, seed) != 0) {
    train_errf(err, "out of host memory initialising %zu parameters", m->nparams);
    free(host);
    train_model_free(m);
    return NULL;
  }
  ops->to_device(m->params, host, pbytes);
  free(host);
  return m;
}

void train_model_free(train_model *m) {
  if (!m) return;
  const train_ops *o = m->ops;
  o->release(m->params);
  o->release(m->grads);
  o->release(m->adam_m);
  o->release(m->adam_v);
  o->release(m->actmem);
  o->release(m->scratchmem);
  o->release(m->slot_inputs);
  o->release(m->slot_targets);
  o->release(m->params16);
  o->release(m->grads16);
  o->release(m->wpar);
  o->release(m->wgrad);
  o->release(m->work);
  o->release(m->actmem16);
  train_moe_free(m->moe);
  free(m->tensors);
  free(m);
}

const train_config *train_model_config(const train_model *m) { return &m->cfg; }
train_device train_model_device(const train_model *m) { return m->dev; }
size_t train_num_params(const train_model *m) { return m->nparams; }
int train_num_tensors(const train_model *m) { return m->ntensors; }
const train_param *train_param_info(const train_model *m, int i) {
  return i >= 0 && i < m->ntensors ? &m->tensors[i] : NULL;
}
size_t train_activation_bytes(const train_model *m) {
  size_t b = m->nslots * m->act_floats * sizeof(float);
  if (m->bf16) /* the stored bf16 sets, the shared fp32 working set and units */
    b += m->nslots * m->act16_n * sizeof(uint16_t) +
         (m->work_floats + 2 * m->wunit) * sizeof(float);
  return b;
}
float *train_params(train_model *m) { return m->params; }
float *train_grads(train_model *m) { return m->grads; } /* NULL under bf16 */

/* Under bf16 the parameters are the fp32 master weights (what AdamW and checkpoints
 * hold); setting them sets the bf16 weights the passes read. */
void train_copy_params_to_host(const train_model *m, float *dst) {
  m->ops->to_host(dst, m->params, m->nparams * sizeof(float));
}
void train_copy_params_from_host(train_model *m, const float *src) {
  m->ops->to_device(m->params, src, m->nparams * sizeof(float));
  if (m->bf16) m->ops->to_bf16(m->params16, m->params, m->nparams);
}
void train_copy_grads_to_host(const train_model *m, float *dst) {
  if (m->bf16)
    m->ops->from_bf16(dst, m->grads16, m->nparams);
  else
    m->ops->to_host(dst, m->grads, m->nparams * sizeof(float));
}
void train_copy_logits_to_host(const train_model *m, float *dst) {
  m->ops->to_host(dst, m->acts.logits,
                  (size_t)m->lastB * m->lastT * m->vocab_local * sizeof(float));
}

double train_flops_per_token(const train_config *c, int T) {
  /* 2 FLOPs per multiply-add; backward costs twice the forward. Matmul weights per
   * token: 12*L*C^2 (qkv 3C^2, proj C^2, fc 4C^2, fc proj 4C^2) plus the LM head V*C;
   * attention does q k^T and att v: 2*T*C per layer and token (PaLM's accounting). */
  double C = c->channels, L = c->layers, V = c->vocab;
  double n = 12.0 * L * C * C + V * C;
  return 6.0 * n + 6.0 * 2.0 * L * T * C;
}

/* ---- forward --------------------------------------------------------------------- */

void train_set_forward_hook(train_model *m, train_forward_hook fn, void *arg) {
  m->fwd_hook = fn;
  m->fwd_hook_arg = arg;
}

static void forward_stage_done(train_model *m, int stage) {
  if (!m->fwd_hook) return;
  m->ops->sync();
  m->fwd_hook(m->fwd_hook_arg, stage);
}

/* Block i's activations in the selected set (i: the chunk's i-th block). With full
 * recomputation every block shares set block 0 (only the block inputs, residual3, are
 * kept per block); with selective recomputation the attention probabilities alone are
 * shared. */
typedef struct block_acts {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch,
      *fch_gelu, *res3;
} block_acts;

static void block_view(const train_model *m, int i, block_acts *b) {
  const train_acts *a = &m->acts;
  size_t C = m->cfg.channels, Cl = m->width_local, bt = (size_t)m->maxB * m->maxT,
         btr = bt / m->seq_shards, batt = (size_t)m->maxB * m->heads_local * m->maxT * m->maxT;
  size_t k = m->recompute == TRAIN_RECOMPUTE_FULL ? 0 : (size_t)i;
  size_t ka = m->recompute == TRAIN_RECOMPUTE_NONE ? (size_t)i : 0;
  size_t ks = k, kr = (size_t)i; /* the statistics; the block's output */
  if (m->bf16) { /* the shared working set: its statistics are kept per block (fp32) */
    k = ka = kr = 0;
    ks = (size_t)i;
  }
  b->ln1 = a->ln1 + k * bt * C;
  b->ln1_mean = a->ln1_mean + ks * btr;
  b->ln1_rstd = a->ln1_rstd + ks * btr;
  b->qkv = a->qkv + k * bt * 3 * Cl;
  b->atty = a->atty + k * bt * Cl;
  b->att = a->att + ka * batt;
  b->res2 = a->residual2 + k * btr * C;
  b->ln2 = a->ln2 + k * bt * C;
  b->ln2_mean = a->ln2_mean + ks * btr;
  b->ln2_rstd = a->ln2_rstd + ks * btr;
  b->fch = a->fch + k * bt * 4 * Cl;
  b->fch_gelu = a->fch_gelu + k * bt * 4 * Cl;
  b->res3 = a->residual3 + kr * btr * C; /* every block's output: the next's input */
}

/* ---- bf16: units widened to fp32 and stored back -------------------------------------
 * A block's weights (or gradients) are the contiguous range of its tensors; the views
 * point into wpar (wgrad) at the same relative offsets. */
static size_t block_off(const train_model *m, int l) {
  return m->tensors[2 + l * m->block_tensors].offset;
}
static size_t block_len(const train_model *m, int l) {
  size_t e = l + 1 < m->cfg.layers ? block_off(m, l + 1) : m->tensors[m->ntensors - 2].offset;
  return e - block_off(m, l);
}
static void view_at(const train_model *m, int l, float *at, train_block *o) {
  const train_param *t = &m->tensors[2 + l * m->block_tensors];
  float **dst[BLOCK_TENSORS] = {&o->ln1w, &o->ln1b, &o->qkvw, &o->qkvb, &o->projw,   &o->projb,
                                &o->ln2w, &o->ln2b, &o->fcw,  &o->fcb,  &o->fcprojw, &o->fcprojb};
  for (int i = 0; i < BLOCK_TENSORS; i++) *dst[i] = at + (t[i].offset - t[0].offset);
}
/* Block l's weights for a pass: bf16 widened into wpar, else where they live. */
static void block_weights(train_model *m, int l, train_block *w) {
  if (!m->bf16) {
    train_block_params_view(m, l, w);
    return;
  }
  m->ops->from_bf16(m->wpar, m->params16 + block_off(m, l), block_len(m, l));
  view_at(m, l, m->wpar, w);
}
/* Block l's gradients for backward to accumulate into: bf16 widened into wgrad (stored
 * back by grads_done), else the flat array. */
static void block_grads(train_model *m, int l, train_block *g) {
  if (!m->bf16) {
    train_block_view(m, m->grads, l, g);
    return;
  }
  m->ops->from_bf16(m->wgrad, m->grads16 + block_off(m, l), block_len(m, l));
  view_at(m, l, m->wgrad, g);
}
/* Root tensors [first, first+n) of params (grads: 1): pointers into the widened copy. */
static float *root_widen(train_model *m, int first, int count, int grads) {
  if (!m->bf16) return (grads ? m->grads : m->params) + m->tensors[first].offset;
  size_t off = m->tensors[first].offset, n = 0;
  for (int i = first; i < first + count; i++) n += m->tensors[i].numel;
  m->ops->from_bf16(grads ? m->wgrad : m->wpar, (grads ? m->grads16 : m->params16) + off, n);
  return grads ? m->wgrad : m->wpar;
}
/* Stores widened gradients back: [off, off+n) of the flat array from wgrad. */
static void grads_done(train_model *m, size_t off, size_t n) {
  if (m->bf16) m->ops->to_bf16(m->grads16 + off, m->wgrad, n);
}

/* The working set's block tensors into set block i (what backward needs), and back. */
static void store_block(train_model *m, int i) {
  const train_acts *a = &m->acts;
  train_acts16 *s = &m->acts16;
  size_t C = m->cfg.channels, Cl = m->width_local, bt = (size_t)m->maxB * m->maxT,
         btr = bt / m->seq_shards, batt = (size_t)m->maxB * m->heads_local * m->maxT * m->maxT;
  void (*f)(uint16_t *, const float *, size_t) = m->ops->to_bf16;
  f(s->residual3 + i * btr * C, a->residual3, btr * C);
  if (m->recompute == TRAIN_RECOMPUTE_FULL) return; /* the block's input is enough */
  f(s->ln1 + i * bt * C, a->ln1, bt * C);
  f(s->qkv + i * bt * 3 * Cl, a->qkv, bt * 3 * Cl);
  f(s->atty + i * bt * Cl, a->atty, bt * Cl);
  if (m->recompute == TRAIN_RECOMPUTE_NONE) f(s->att + i * batt, a->att, batt);
  f(s->residual2 + i * btr * C, a->residual2, btr * C);
  f(s->ln2 + i * bt * C, a->ln2, bt * C);
  f(s->fch + i * bt * 4 * Cl, a->fch, bt * 4 * Cl);
  f(s->fch_gelu + i * bt * 4 * Cl, a->fch_gelu, bt * 4 * Cl);
}
static void load_block(train_model *m, int i) {
  const train_acts *a = &m->acts;
  const train_acts16 *s = &m->acts16;
  size_t C = m->cfg.channels, Cl = m->width_local, bt = (size_t)m->maxB * m->maxT,
         btr = bt / m->seq_shards, batt = (size_t)m->maxB * m->heads_local * m->maxT * m->maxT;
  void (*f)(float *, const uint16_t *, size_t) = m->ops->from_bf16;
  if (m->recompute == TRAIN_RECOMPUTE_FULL) return;
  f(a->ln1, s->ln1 + i * bt * C, bt * C);
  f(a->qkv, s->qkv + i * bt * 3 * Cl, bt * 3 * Cl);
  f(a->atty, s->atty + i * bt * Cl, bt * Cl);
  if (m->recompute == TRAIN_RECOMPUTE_NONE) f(a->att, s->att + i * batt, batt);
  f(a->residual2, s->residual2 + i * btr * C, btr * C);
  f(a->ln2, s->ln2 + i * bt * C, bt * C);
  f(a->fch, s->fch + i * bt * 4 * Cl, bt * 4 * Cl);
  f(a->fch_gelu, s->fch_gelu + i * bt * 4 * Cl, bt * 4 * Cl);
}
/* Block i's input (Nr,C): the piece's input for i = 0, else block i-1's output; under bf16
 * widened into the working input buffer. */
static float *block_input(train_model *m, int i) {
  size_t btr = (size_t)m->maxB * m->maxT / m->seq_shards, C = m->cfg.channels;
  if (!m->bf16) return i == 0 ? m->acts.encoded : m->acts.residual3 + (size_t)(i - 1) * btr * C;
  m->ops->from_bf16(m->acts.encoded,
                    i == 0 ? m->acts16.encoded : m->acts16.residual3 + (size_t)(i - 1) * btr * C,
                    btr * C);
  return m->acts.encoded;
}

/* Local block l's forward from x (Nr,C) into the set's block i (what the passes and the
 * recomputation both run). */
static void block_forward(train_model *m, int l, int i, const float *x, int B, int T) {
  const train_ops *o = m->ops;
  const train_layer_ops *lo = m->layer_ops;
  int C = m->cfg.channels, NH = m->heads_local, Cl = m->width_local;
  int N = B * T, Nr = N / m->seq_shards;
  train_acts *a = &m->acts;
  train_block w;
  block_acts b;
  block_weights(m, l, &w);
  block_view(m, i, &b);
  /* ln1 into the parallel region (f), qkv column-parallel, attention on the local
   * heads, proj row-parallel (its partial products summed by g, then its bias) */
  lo->ln_forward(m, b.ln1, b.ln1_mean, b.ln1_rstd, x, w.ln1w, w.ln1b, Nr, C, "f attn");
  lo->col_forward(m, b.qkv, b.ln1, w.qkvw, w.qkvb, N, C, 3 * Cl);
  lo->attn_forward(m, i, b.atty, b.att, b.qkv, B, T, Cl, NH);
  lo->row_forward(m, a->branch, b.atty, w.projw, w.projb, N, Cl, C, "g attn");
  o->residual_forward(b.res2, x, a->branch, (size_t)Nr * C);
  /* the MLP likewise: fc column-parallel (4C/T rows), proj row-parallel */
  lo->ln_forward(m, b.ln2, b.ln2_mean, b.ln2_rstd, b.res2, w.ln2w, w.ln2b, Nr, C, "f mlp");
  if (m->experts) { /* the mixture of experts in the MLP's place (moe.h) */
    lo->moe_forward(m, l, a->branch, b.ln2, N);
  } else {
    lo->col_forward(m, b.fch, b.ln2, w.fcw, w.fcb, N, C, 4 * Cl);
    o->gelu_forward(b.fch_gelu, b.fch, (size_t)N * 4 * Cl);
    lo->row_forward(m, a->branch, b.fch_gelu, w.fcprojw, w.fcprojb, N, 4 * Cl, C, "g mlp");
  }
  o->residual_forward(b.res3, b.res2, a->branch, (size_t)Nr * C);
}

void train_model_use_slot(train_model *m, int k) {
  size_t bt = (size_t)m->maxB * m->maxT;
  m->slot = k;
  layout_acts(m, m->actmem + (size_t)k * m->act_floats);
  if (m->bf16) layout_acts16(m, m->actmem16 + (size_t)k * m->act16_n);
  m->inputs = m->slot_inputs + (size_t)k * bt;
  m->targets = m->slot_targets + (size_t)k * bt;
}

/* The pipeline's transfers: bf16 storage under bf16 (what travels is bf16), else fp32. */
void *train_piece_input(train_model *m) {
  return m->bf16 ? (void *)m->acts16.encoded : (void *)m->acts.encoded;
}
void *train_piece_grad_io(train_model *m) {
  return m->bf16 ? (void *)m->acts16.grad_io : (void *)m->acts.grad_io;
}
void *train_piece_output(train_model *m, int c) {
  size_t at = (size_t)(m->chunk_len[c] - 1) * m->maxB * m->maxT / m->seq_shards * m->cfg.channels;
  return m->bf16 ? (void *)(m->acts16.residual3 + at) : (void *)(m->acts.residual3 + at);
}
size_t train_piece_bytes(const train_model *m) {
  return (size_t)m->maxB * m->maxT / m->seq_shards * m->cfg.channels *
         (m->bf16 ? sizeof(uint16_t) : sizeof(float));
}

float train_forward(train_model *m, const int *inputs, const int *targets, int B, int T) {
  /* the whole model in one piece (a pipeline stage runs its chunks by train_piece_*) */
  return train_piece_forward(m, 0, inputs, targets, B, T);
}

float train_piece_forward(train_model *m, int chunk, const int *inputs, const int *targets, int B,
                          int T) {
  const train_ops *o = m->ops;
  const train_layer_ops *lo = m->layer_ops;
  const train_config *c = &m->cfg;
  /* V: this rank's vocabulary rows (all on one process) */
  int C = c->channels, V = m->vocab_local;
  int first = m->has_embed && chunk == 0, last = m->has_head && chunk == m->nchunks - 1;
  int l0 = m->chunk_loc0[chunk], L = m->chunk_len[chunk]; /* this chunk's local blocks */
  int N = B * T, Nr = N / m->seq_shards; /* rows of the residual stream held here */
  size_t btr = (size_t)m->maxB * m->maxT / m->seq_shards; /* per-block stride of (Nr) */
  train_acts *a = &m->acts;
  if (N % m->seq_shards != 0) {
    char msg[TRAIN_ERRLEN];
    snprintf(msg, sizeof msg, "sequence parallel forward of %d x %d rows: not a multiple of --tp",
             B, T);
    lo->fail(m, msg);
    return NAN;
  }

  if (first) o->to_device(m->inputs, inputs, (size_t)N * sizeof(int));
  if (last && targets) o->to_device(m->targets, targets, (size_t)N * sizeof(int));
  m->lastB = B;
  m->lastT = T;
  m->have_targets = !last || targets != NULL;

  if (first) {
    float *wte = root_widen(m, 0, 2, 0), *wpe = wte + m->tensors[0].numel; /* contiguous */
    lo->embed_forward(m, a->encoded, m->inputs, wte, wpe, B, T, C);
    if (m->bf16) o->to_bf16(m->acts16.encoded, a->encoded, btr * C);
    forward_stage_done(m, -1);
  } else if (m->bf16) { /* the received input, widened */
    o->from_bf16(a->encoded, m->acts16.encoded, btr * C);
  }

  float *x = a->encoded; /* (Nr,C) input of the current block: embedded, or received */
  for (int i = 0; i < L; i++) {
    int l = l0 + i; /* the local block; its activations are the set's block i */
    block_forward(m, l, i, x, B, T);
    if (m->bf16) { /* what backward needs, stored; the output is the next block's input */
      store_block(m, i);
      memcpy(a->encoded, a->residual3, btr * C * sizeof(float));
    } else {
      x = m->acts.residual3 + (size_t)i * btr * C;
    }
    forward_stage_done(m, l);
  }
  if (!last) return 0.0f;
  float *lnfw = root_widen(m, m->ntensors - 2, 2, 0), *lnfb = lnfw + C;
  lo->ln_forward(m, a->lnf, a->lnf_mean, a->lnf_rstd, x, lnfw, lnfb, Nr, C, "f head");
  float *wte = root_widen(m, 0, 1, 0);
  lo->col_forward(m, a->logits, a->lnf, wte, NULL, N, C, V); /* tied LM head */
  if (!targets) {
    m->last_loss = 0.0f;
    forward_stage_done(m, m->cfg.layers);
    return 0.0f;
  }
  /* vocabulary-parallel: the full logits never need to exist on one rank */
  lo->xent_forward(m, a->losses, a->probs, a->logits, m->targets, N);
  if (m->bf16) {
    o->to_bf16(m->acts16.lnf, a->lnf, (size_t)N * C);
    o->to_bf16(m->acts16.probs, a->probs, (size_t)N * V);
  }
  m->last_loss = (float)(o->sum(a->losses, (size_t)N) / N);
  forward_stage_done(m, m->cfg.layers);
  return m->last_loss;
}

/* ---- backward -------------------------------------------------------------------- */

void train_zero_grad(train_model *m) {
  if (m->bf16)
    m->ops->zero(m->grads16, m->nparams * sizeof(uint16_t));
  else
    m->ops->zero(m->grads, m->nparams * sizeof(float));
}

void train_set_loss_scale(train_model *m, float scale) { m->loss_scale = scale; }

void train_set_backward_hook(train_model *m, train_backward_hook fn, void *arg) {
  m->bwd_hook = fn;
  m->bwd_hook_arg = arg;
}

/* Tells the hook that gradients from `from` on are final.  On a device they are final
 * once the compute stream passes the mark taken here: the hook orders its communication
 * after that mark (on the device where the backend can, else by waiting on the host for
 * the compute stream alone) — never by a device-wide sync, which would also wait for the
 * communication already in flight and so serialise it with the rest of backward. */
static void gradients_final(train_model *m, size_t from, int layer) {
  if (!m->bwd_hook) return;
  m->grad_mark = m->ops->mark ? m->ops->mark() : NULL;
  m->bwd_hook(m->bwd_hook_arg, from, layer);
}

void train_backward(train_model *m) { train_piece_backward(m, 0); }

void train_piece_backward(train_model *m, int chunk) {
  if (!m->have_targets) return;
  const train_ops *o = m->ops;
  const train_layer_ops *lo = m->layer_ops;
  const train_config *c = &m->cfg;
  int C = c->channels, V = m->vocab_local, NH = m->heads_local, Cl = m->width_local;
  int first = m->has_embed && chunk == 0, last = m->has_head && chunk == m->nchunks - 1;
  int l0 = m->chunk_loc0[chunk], L = m->chunk_len[chunk];
  int B = m->lastB, T = m->lastT, N = B * T;
  size_t NC = (size_t)N * C, NCl = (size_t)N * Cl;
  /* dres holds this rank's Nr rows of the residual stream's gradient */
  int Nr = N / m->seq_shards;
  size_t bt = (size_t)m->maxB * m->maxT, btr = bt / m->seq_shards;
  train_acts *a = &m->acts;
  train_scratch *s = &m->scr;

  const train_param *pwte = &m->tensors[0], *pwpe = &m->tensors[1],
                    *plnf = &m->tensors[m->ntensors - 2];
  (void)btr;

  int W = m->split_w; /* B only: weight gradients left to train_piece_weights */
  if (last) {
    float *xlast = block_input(m, L); /* the chunk's output: the final LayerNorm's input */
    if (m->bf16) {                    /* what the head's backward reads, widened */
      o->from_bf16(a->lnf, m->acts16.lnf, NC);
      o->from_bf16(a->probs, m->acts16.probs, (size_t)N * V);
    }
    /* loss = mean over the N positions, so dloss/dlosses[n] = 1/N */
    float *dlogits = W ? a->w_logits : s->dlogits;
    o->zero(dlogits, (size_t)N * V * sizeof(float));
    lo->xent_backward(m, dlogits, a->probs, m->targets, m->loss_scale / N, N);
    o->zero(s->dln, NC * sizeof(float));
    float *wte = root_widen(m, 0, 1, 0), *dwte = W ? NULL : root_widen(m, 0, 1, 1);
    lo->head_backward(m, s->dln, dwte, dlogits, a->lnf, wte, N, C, V);
    if (!W) grads_done(m, pwte->offset, pwte->numel);
    o->zero(s->dres, NC * sizeof(float));
    float *lnfw = root_widen(m, m->ntensors - 2, 1, 0),
          *dlnfw = root_widen(m, m->ntensors - 2, 2, 1);
    lo->ln_backward(m, s->dres, dlnfw, dlnfw + C, s->dln, xlast, lnfw, a->lnf_mean, a->lnf_rstd, Nr,
                    C, "lnf grads");
    grads_done(m, plnf->offset, 2 * (size_t)C);
    gradients_final(m, plnf->offset, m->cfg.layers);
  } else if (m->bf16) { /* the gradient of this piece's output, from the next piece */
    o->from_bf16(s->dres, m->acts16.grad_io, (size_t)Nr * C);
  } else {
    memcpy(s->dres, a->grad_io, (size_t)Nr * C * sizeof(float));
  }

  /* s->dres now holds dloss/d(output of the chunk's top block); walk its blocks top-down.
   * The residual connections pass dres straight through; each branch adds its part. */
  for (int i = L - 1; i >= 0; i--) {
    int l = l0 + i;
    train_block w, g;
    float *x = block_input(m, i);
    block_acts ba;
    block_view(m, i, &ba);
    if (m->bf16) load_block(m, i); /* the stored block, widened into the working set */
    if (m->recompute == TRAIN_RECOMPUTE_FULL) {
      /* the block's activations again, from its input (kept), over the one shared set;
       * its output res3 is rewritten with the same bits */
      block_forward(m, l, i, x, B, T);
    } else if (m->recompute == TRAIN_RECOMPUTE_SELECTIVE) {
      /* the attention probabilities again from q, k, v (the largest tensor, T^2 per head,
       * the cheapest to recompute); its output goes to the spare branch buffer */
      lo->attn_forward(m, i, a->branch, ba.att, ba.qkv, B, T, Cl, NH);
    }
    block_weights(m, l, &w);
    block_grads(m, l, &g);
    float *ln1 = ba.ln1, *ln1_mean = ba.ln1_mean, *ln1_rstd = ba.ln1_rstd, *qkv = ba.qkv,
          *atty = ba.atty, *att = ba.att, *res2 = ba.res2, *ln2 = ba.ln2, *ln2_mean = ba.ln2_mean,
          *ln2_rstd = ba.ln2_rstd, *fch = ba.fch, *fch_gelu = ba.fch_gelu;
    /* zero-bubble: the output gradients W needs, kept in the set (else scratch) */
    float *dfch = W ? a->w_fc + i * bt * 4 * Cl : s->dfch,
          *dqkv = W ? a->w_qkv + i * bt * 3 * Cl : s->dqkv;
    if (W) memcpy(a->w_fcproj + i * bt * C, s->dres, NC * sizeof(float));

    /* MLP branch: res3 = res2 + proj(gelu(fc(ln2(res2)))). The row-parallel proj sees
     * the whole output gradient on every rank, so its replicated bias gets the same
     * gradient everywhere; fc's input gradient is a partial sum until its f. */
    if (m->experts) { /* the mixture of experts (moe.h): its gradients are its own */
      o->zero(s->dln, NC * sizeof(float));
      lo->moe_backward(m, l, s->dln, s->dres, ln2, N);
    } else {
      o->zero(s->dfch_gelu, NCl * 4 * sizeof(float));
      lo->row_backward(m, s->dfch_gelu, W ? NULL : g.fcprojw, W ? NULL : g.fcprojb, s->dres,
                       fch_gelu, w.fcprojw, N, 4 * Cl, C, "g mlp");
      o->zero(dfch, NCl * 4 * sizeof(float));
      o->gelu_backward(dfch, fch, s->dfch_gelu, NCl * 4);
      o->zero(s->dln, NC * sizeof(float));
      lo->col_backward(m, s->dln, W ? NULL : g.fcw, W ? NULL : g.fcb, dfch, ln2, w.fcw, N, C,
                       4 * Cl, "f mlp");
    }
    lo->ln_backward(m, s->dres, g.ln2w, g.ln2b, s->dln, res2, w.ln2w, ln2_mean, ln2_rstd, Nr, C,
                    "ln2 grads");

    /* attention branch: res2 = x + proj(attention(qkv(ln1(x)))) */
    if (W) memcpy(a->w_proj + i * bt * C, s->dres, NC * sizeof(float));
    o->zero(s->datty, NCl * sizeof(float));
    lo->row_backward(m, s->datty, W ? NULL : g.projw, W ? NULL : g.projb, s->dres, atty, w.projw, N,
                     Cl, C, "g attn");
    o->zero(dqkv, NCl * 3 * sizeof(float));
    lo->attn_backward(m, i, dqkv, s->datt, s->datty, qkv, att, atty, B, T, Cl, NH);
    o->zero(s->dln, NC * sizeof(float));
    lo->col_backward(m, s->dln, W ? NULL : g.qkvw, W ? NULL : g.qkvb, dqkv, ln1, w.qkvw, N, C,
                     3 * Cl, "f attn");
    lo->ln_backward(m, s->dres, g.ln1w, g.ln1b, s->dln, x, w.ln1w, ln1_mean, ln1_rstd, Nr, C,
                    "ln1 grads");
    grads_done(m, block_off(m, l), block_len(m, l));
    gradients_final(m, m->tensors[2 + l * m->block_tensors].offset, l);
  }
  if (first && W) {
    memcpy(a->w_embed, s->dres, (size_t)Nr * C * sizeof(float));
  } else if (first) {
    float *dwte = root_widen(m, 0, 2, 1), *dwpe = dwte + pwte->numel;
    lo->embed_backward(m, dwte, dwpe, s->dres, m->inputs, B, T, C);
    grads_done(m, 0, pwte->numel + pwpe->numel);
    gradients_final(m, 0, -1);
  } else if (m->bf16) { /* the gradient of this piece's input, for the previous piece */
    o->to_bf16(m->acts16.grad_io, s->dres, (size_t)Nr * C);
  } else {
    memcpy(a->grad_io, s->dres, (size_t)Nr * C * sizeof(float));
  }
}

/* W: dw += dout^T @ inp and db += the rows of dout, for every Linear of the chunk, from
 * the output gradients B saved; the head's and the embeddings' likewise. The local
 * kernels only (zero-bubble is refused under tensor parallelism, whose Linears do their
 * communication inside one call). */
void train_piece_weights(train_model *m, int chunk) {
  if (!m->have_targets || !m->split_w) return;
  const train_ops *o = m->ops;
  int C = m->cfg.channels, V = m->vocab_local, Cl = m->width_local;
  int first = m->has_embed && chunk == 0, last = m->has_head && chunk == m->nchunks - 1;
  int l0 = m->chunk_loc0[chunk], L = m->chunk_len[chunk];
  int B = m->lastB, T = m->lastT, N = B * T;
  size_t bt = (size_t)m->maxB * m->maxT;
  train_acts *a = &m->acts;
  const train_param *pwte = &m->tensors[0], *pwpe = &m->tensors[1];
  if (last) { /* bf16: the stored final LayerNorm widened, the gradients of wte widened */
    if (m->bf16) o->from_bf16(a->lnf, m->acts16.lnf, (size_t)N * C);
    o->matmul_backward(NULL, root_widen(m, 0, 1, 1), NULL, a->w_logits, a->lnf, NULL, N, C, V);
    grads_done(m, pwte->offset, pwte->numel);
  }
  for (int i = L - 1; i >= 0; i--) {
    train_block g;
    block_acts ba;
    block_view(m, i, &ba);
    if (m->bf16) load_block(m, i); /* the Linears' inputs, widened */
    block_grads(m, l0 + i, &g);
    o->matmul_backward(NULL, g.fcprojw, g.fcprojb, a->w_fcproj + i * bt * C, ba.fch_gelu, NULL, N,
                       4 * Cl, C);
    o->matmul_backward(NULL, g.fcw, g.fcb, a->w_fc + i * bt * 4 * Cl, ba.ln2, NULL, N, C, 4 * Cl);
    o->matmul_backward(NULL, g.projw, g.projb, a->w_proj + i * bt * C, ba.atty, NULL, N, Cl, C);
    o->matmul_backward(NULL, g.qkvw, g.qkvb, a->w_qkv + i * bt * 3 * Cl, ba.ln1, NULL, N, C,
                       3 * Cl);
    grads_done(m, block_off(m, l0 + i), block_len(m, l0 + i));
  }
  if (first) {
    float *dwte = root_widen(m, 0, 2, 1), *dwpe = dwte + pwte->numel;
    m->layer_ops->embed_backward(m, dwte, dwpe, a->w_embed, m->inputs, B, T, C);
    grads_done(m, 0, pwte->numel + pwpe->numel);
  }
}
