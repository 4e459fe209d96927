/*
 * checkpoint.c — checkpoints: one format for every layout, a manifest and its shards, which
 * hold everything a run needs to continue bit for bit, at the same layout or another. It
 * never prints, and never changes a session before the whole checkpoint has been read and
 * checked.
 *
 * A run's state is cut on a T x S x P grid: T tensor-parallel slices (tp.h's table: T = 1
 * is the single-process model), each cut in S data-parallel shards by FSDP's units (S = N
 * under FSDP; 1 when the data-parallel ranks hold identical state, as under DDP, or in one
 * process), and the units of a slice written by P pipeline stages (P = 1 without a
 * pipeline). The units of a slice are its embeddings (wte and wpe), each block and the
 * final LayerNorm; stage p writes the units it holds by model.h's piece rule
 * (train_pp_piece over P x chunks pieces, stage p holding pieces p, p + P, ...): the
 * embeddings on stage 0, the final LayerNorm on stage P - 1. The last stage's copy of the
 * tied wte is the first's (its gradient is summed over the pair, so both take the same
 * step): it is written once, by stage 0, and a load puts it on both. The checkpoint at
 * `path` is the manifest plus T*S*P shard files, `path.shard<t>.<s>of<T>x<S>` when P = 1
 * (version 4's names), `path.shard<t>.<s>.<p>of<T>x<S>x<P>` otherwise. One process writes
 * T = S = P = 1: the manifest and the one shard `path.shard0.0of1x1` are the whole
 * checkpoint of a one-process run.
 *
 * Manifest, version 5 (all little-endian; the Python reference reads the same table):
 *
 *   offset  field                     offset  field
 *   0       char magic[8] "COLLTRN\0" 68      u64 sample RNG state
 *   8       u32 version (5)           76      u64 data epoch
 *   12      u32 header bytes (148)    84      u64 data index (window in the epoch)
 *   16      u32 vocab                 92      u64 data tokens
 *   20      u32 max_seq               100     u64 data hash (FNV-1a of the token ids)
 *   24      u32 layers                108     f32 lr, min_lr_frac, beta1, beta2, eps,
 *   28      u32 channels                          weight_decay, grad_clip (7 x 4 bytes)
 *   32      u32 heads                 136     u32 warmup
 *   36      u32 batch (global: rows   140     u32 steps
 *               per optimizer step)   144     u32 flags (0)
 *   40      u32 seq                   148     u32 T, u32 S, u32 U (units: L + 2), u32 P
 *   44      u64 seed                  164     U x u64 unit length (floats: embeddings,
 *   52      u64 step                              each block, final LayerNorm of one slice)
 *   60      u64 nparams (of the               U x u32 the stage that writes the unit
 *               single-process model)         T*S*P x (u64 shard file bytes, u64 FNV-1a of
 *                                             the shard file), shard (t, s, p) at
 *                                             (p*T + t)*S + s;
 *                                             then u64 FNV-1a of all manifest bytes before.
 *
 * Shard (t, s, p):
 *
 *   0  char magic[8] "COLLSHD\0", 8 u32 version (5), 12 u32 t, 16 u32 s, 20 u32 T, 24 u32 S,
 *   28 u32 p, 32 u64 step, 40 u64 C, 48 params, AdamW m, AdamW v (C floats each).
 *
 * Each array of shard (t, s, p) holds, for every unit of slice t that stage p writes, in
 * order, its length padded to a multiple of S cut in S equal pieces, piece s (pad = 0): C =
 * the sum of those ceil(len/S). With S = P = 1 that is the whole slice, in the layout of TP
 * rank t's model (the moments split exactly as their parameters); with S = 1 it is the
 * stage's own arrays without the head's copy of wte; with T = 1 a slice is the
 * single-process model.
 *
 * Version 4 (read, no longer written) is version 5 with P = 1 and no table of stages: its
 * u32 at 148 + 12 is 0 and a u64 C (floats per array of one shard) follows the grid, at
 * 164, before the unit lengths; its shards have 0 at 28.
 *
 * Writing (train_ckpt_write, collective over the job): every rank that holds a shard no
 * other rank writes (under DDP, data-parallel rank 0 of each TP group and stage) writes
 * it, then the shards' sizes and checksums are gathered and rank 0 writes the manifest,
 * each file atomically (train_atomic: temp file, fsync, rename, fsync dir); the manifest
 * comes last, so a checkpoint without its manifest does not exist, and a broadcast tells
 * every rank whether it does.
 *
 * Loading validates everything before changing the session, so a bad checkpoint leaves
 * the run untouched: the manifest (magic, version, size, checksum, config, data identity,
 * the grid against this model's slices and units, the stages' table), then every shard
 * (size and checksum against the manifest, its own header). It puts the single-process
 * state back together (the pieces of every unit from its stage's S shards into slice t,
 * then train_tp_unshard of each slice) and installs it: as is in one process, or this
 * rank's slice of it (train_tp_shard) in a tensor-parallel session, and of that the
 * stage's units (wte on both end stages) in a pipeline stage; a parallel layer then cuts
 * its own shards of that. So any checkpoint resumes at any grid whose T splits the model,
 * whose P x chunks cuts it, and whose global batch is the same (resharding on load).
 * Slicing is copying, and a slice's vocabulary padding rows (zero parameters, zero
 * gradients, zero moments) are dropped when the slices are put together and zero again
 * when they are cut, so a resume at the same grid is bitwise.
 */
#include "model/model.h"
#include "parallel/checkpoint.h"
#include "parallel/tp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CKPT_MAGIC "COLLTRN"
#define CKPT_VERSION 5
#define CKPT_V4 4 /* still read: one stage, its C in the manifest */
#define CKPT_HEADER 148
#define GRID_END 164 /* the header and the grid: what the manifest's size follows */
#define V4_FIXED 172 /* version 4: the header, the grid and C */
#define SHARD_MAGIC "COLLSHD"
#define SHARD_HEADER 48
#define MAX_WAYS 65536 /* T, S and P beyond this are a corrupt manifest, not a grid */

typedef struct ckpt_header {
  uint32_t version, header_bytes;
  uint32_t vocab, max_seq, layers, channels, heads, batch, seq;
  uint64_t seed, step, nparams, sample_rng, epoch, index, data_tokens, data_hash;
  float lr, min_lr_frac, beta1, beta2, eps, weight_decay, grad_clip;
  uint32_t warmup, steps, flags;
} ckpt_header;

/* little-endian (de)serialisation of the table above */
typedef struct cursor {
  unsigned char *p;
  size_t off;
} cursor;
static void put(cursor *c, const void *v, size_t n) {
  memcpy(c->p + c->off, v, n); /* x86-64 and aarch64 hosts are little-endian */
  c->off += n;
}
static void get(cursor *c, void *v, size_t n) {
  memcpy(v, c->p + c->off, n);
  c->off += n;
}
#define FIELDS(OP, c, h)        \
  OP(c, &(h)->version, 4);      \
  OP(c, &(h)->header_bytes, 4); \
  OP(c, &(h)->vocab, 4);        \
  OP(c, &(h)->max_seq, 4);      \
  OP(c, &(h)->layers, 4);       \
  OP(c, &(h)->channels, 4);     \
  OP(c, &(h)->heads, 4);        \
  OP(c, &(h)->batch, 4);        \
  OP(c, &(h)->seq, 4);          \
  OP(c, &(h)->seed, 8);         \
  OP(c, &(h)->step, 8);         \
  OP(c, &(h)->nparams, 8);      \
  OP(c, &(h)->sample_rng, 8);   \
  OP(c, &(h)->epoch, 8);        \
  OP(c, &(h)->index, 8);        \
  OP(c, &(h)->data_tokens, 8);  \
  OP(c, &(h)->data_hash, 8);    \
  OP(c, &(h)->lr, 4);           \
  OP(c, &(h)->min_lr_frac, 4);  \
  OP(c, &(h)->beta1, 4);        \
  OP(c, &(h)->beta2, 4);        \
  OP(c, &(h)->eps, 4);          \
  OP(c, &(h)->weight_decay, 4); \
  OP(c, &(h)->grad_clip, 4);    \
  OP(c, &(h)->warmup, 4);       \
  OP(c, &(h)->steps, 4);        \
  OP(c, &(h)->flags, 4)

/* Parameters of the single-process model, whatever slice this session holds: the
 * manifest's nparams, and the length of each array of the state a load puts together. */
static size_t full_count(const train_session *s) {
  size_t np = 0, act = 0;
  if (train_model_sizes(&s->opt.cfg, 1, 1, &np, &act, NULL) != 0) return 0;
  return np;
}

static void fill_header(const train_session *s, ckpt_header *h) {
  const train_options *o = &s->opt;
  memset(h, 0, sizeof *h);
  h->version = CKPT_VERSION;
  h->header_bytes = CKPT_HEADER;
  h->vocab = (uint32_t)o->cfg.vocab;
  h->max_seq = (uint32_t)o->cfg.max_seq;
  h->layers = (uint32_t)o->cfg.layers;
  h->channels = (uint32_t)o->cfg.channels;
  h->heads = (uint32_t)o->cfg.heads;
  h->batch = (uint32_t)(o->batch * (s->batch_mult > 0 ? s->batch_mult : 1));
  h->seq = (uint32_t)o->seq;
  h->seed = o->seed;
  h->step = (uint64_t)s->step;
  h->nparams = full_count(s);
  h->sample_rng = s->sample_rng;
  h->epoch = s->pos.epoch;
  h->index = s->pos.index;
  h->data_tokens = train_data_tokens(s->data);
  h->data_hash = train_data_hash(s->data);
  h->lr = o->hp.lr;
  h->min_lr_frac = o->hp.min_lr_frac;
  h->beta1 = o->hp.beta1;
  h->beta2 = o->hp.beta2;
  h->eps = o->hp.eps;
  h->weight_decay = o->hp.weight_decay;
  h->grad_clip = o->hp.grad_clip;
  h->warmup = (uint32_t)o->hp.warmup;
  h->steps = (uint32_t)o->hp.steps;
}

static int mismatch(const char *path, const ckpt_header *h, const train_session *s, char *err) {
  const train_options *o = &s->opt;
  if (h->vocab != (uint32_t)o->cfg.vocab || h->max_seq != (uint32_t)o->cfg.max_seq ||
      h->layers != (uint32_t)o->cfg.layers || h->channels != (uint32_t)o->cfg.channels ||
      h->heads != (uint32_t)o->cfg.heads) {
    train_errf(err,
               "checkpoint %s is from another config: layers %u channels %u heads %u "
               "vocab %u max_seq %u, this run has layers %d channels %d heads %d vocab %d "
               "max_seq %d",
               path, h->layers, h->channels, h->heads, h->vocab, h->max_seq, o->cfg.layers,
               o->cfg.channels, o->cfg.heads, o->cfg.vocab, o->cfg.max_seq);
    return 1;
  }
  uint32_t rows = (uint32_t)(o->batch * (s->batch_mult > 0 ? s->batch_mult : 1));
  if (h->batch != rows || h->seq != (uint32_t)o->seq || h->seed != o->seed) {
    train_errf(err,
               "checkpoint %s is from another config: batch %u seq %u seed %llu, this "
               "run has batch %u seq %d seed %llu (batch: rows per optimizer step)",
               path, h->batch, h->seq, (unsigned long long)h->seed, rows, o->seq,
               (unsigned long long)o->seed);
    return 1;
  }
  if (h->data_tokens != train_data_tokens(s->data) || h->data_hash != train_data_hash(s->data)) {
    train_errf(err,
               "checkpoint %s was trained on other data (%llu tokens), this run reads %s "
               "(%zu tokens)",
               path, (unsigned long long)h->data_tokens, train_data_name(s->data),
               train_data_tokens(s->data));
    return 1;
  }
  if (h->nparams != full_count(s)) {
    train_errf(err, "checkpoint %s holds %llu parameters, the model has %zu", path,
               (unsigned long long)h->nparams, full_count(s));
    return 1;
  }
  return 0;
}

/* A grid against this model: one slice of the model split T ways (its U = L+2 unit lengths
 * and its ln floats), the stage that writes each unit, and the floats per array of a shard
 * of each of the P stages (each unit padded to a multiple of S, cut in S). */
typedef struct ckpt_grid {
  int T, S, P, U;
  size_t *ulen;    /* U */
  uint32_t *owner; /* U: the stage that writes the unit */
  size_t *count;   /* P */
  size_t ln;
} ckpt_grid;

static void grid_free(ckpt_grid *g) {
  free(g->ulen);
  free(g->owner);
  free(g->count);
  memset(g, 0, sizeof *g);
}

/* g's units for T x S x P, owners 0: -1 with a sentence when the model cannot be split T
 * ways. The owners are then set by the rule (grid_rule) or read from a manifest. */
static int grid_init(ckpt_grid *g, const train_config *cfg, int T, int S, int P, char *err) {
  size_t act = 0;
  memset(g, 0, sizeof *g);
  g->T = T, g->S = S, g->P = P, g->U = cfg->layers + 2;
  g->ulen = calloc((size_t)g->U, sizeof *g->ulen);
  g->owner = calloc((size_t)g->U, sizeof *g->owner);
  g->count = calloc((size_t)P, sizeof *g->count);
  if (!g->ulen || !g->owner || !g->count) {
    train_errf(err, "out of memory");
    return -1;
  }
  if (T > 1 && train_tp_config_check(cfg, T, TRAIN_DEVICE_CPU, err) != 0) return -1;
  if (train_model_sizes_tp(cfg, 1, 1, T, 0, &g->ln, &act, g->ulen) != 0) {
    train_errf(err, "out of memory");
    return -1;
  }
  return 0;
}

/* Each stage's floats per shard array, from the owners. */
static void grid_counts(ckpt_grid *g) {
  for (int p = 0; p < g->P; p++) g->count[p] = 0;
  for (int u = 0; u < g->U; u++) g->count[g->owner[u]] += (g->ulen[u] + (size_t)g->S - 1) / g->S;
}

/* The rule of the writers: stage p writes the units it holds when the model is cut in
 * P x chunks pieces (model.h's train_pp_piece; stage p holds pieces p, p + P, ...): the
 * embeddings on the first stage (the head's tied copy is the same), each block on its
 * piece's stage, the final LayerNorm on the last. */
static int grid_rule(ckpt_grid *g, const train_config *cfg, int chunks, char *err) {
  int L = cfg->layers, U = g->P * chunks;
  if (train_pp_split_check(cfg, g->P, chunks, TRAIN_DEVICE_CPU, err) != 0) return -1;
  g->owner[0] = 0;
  g->owner[L + 1] = (uint32_t)(g->P - 1);
  for (int u = 0; u < U; u++) {
    int first = 0, len = 0;
    train_pp_piece(L, U, u, &first, &len);
    for (int b = first; b < first + len; b++) g->owner[b + 1] = (uint32_t)(u % g->P);
  }
  grid_counts(g);
  return 0;
}

/* "2 x 1" (one stage: version 4's words) or "2 x 1 x 4": a grid in messages. */
static const char *grid_words(char *out, size_t n, int T, int S, int P) {
  if (P == 1)
    snprintf(out, n, "%d x %d", T, S);
  else
    snprintf(out, n, "%d x %d x %d", T, S, P);
  return out;
}

/* "shard 0.1 of 1x2" or "shard 0.0.1 of 1x1x2": a shard in messages. */
static const char *shard_words(char *out, size_t n, int t, int s, int p, int T, int S, int P) {
  if (P == 1)
    snprintf(out, n, "shard %d.%d of %dx%d", t, s, T, S);
  else
    snprintf(out, n, "shard %d.%d.%d of %dx%dx%d", t, s, p, T, S, P);
  return out;
}

void train_shard_path(char *out, size_t n, const char *manifest, int t, int s, int p, int T, int S,
                      int P) {
  if (P <= 1)
    snprintf(out, n, "%s.shard%d.%dof%dx%d", manifest, t, s, T, S);
  else
    snprintf(out, n, "%s.shard%d.%d.%dof%dx%dx%d", manifest, t, s, p, T, S, P);
}

/* ---- writing -------------------------------------------------------------------------- */

/* This rank's shard, atomically; *bytes and *hash (of the whole file) for the manifest. */
static int shard_write(const train_session *s, const char *manifest, const train_ckpt_part *pt,
                       int P, uint64_t *bytes, uint64_t *hash, char *err) {
  char path[4200];
  train_shard_path(path, sizeof path, manifest, pt->t, pt->s, pt->stage, pt->T, pt->S, P);
  unsigned char hb[SHARD_HEADER];
  cursor c = {hb, 0};
  uint32_t u32[6] = {CKPT_VERSION,    (uint32_t)pt->t, (uint32_t)pt->s,
                     (uint32_t)pt->T, (uint32_t)pt->S, (uint32_t)pt->stage};
  uint64_t step = (uint64_t)s->step, n = pt->count;
  put(&c, SHARD_MAGIC "", 8);
  put(&c, u32, sizeof u32);
  put(&c, &step, 8);
  put(&c, &n, 8);
  train_atomic a;
  if (train_atomic_open(&a, path, err) != 0) return -1;
  uint64_t h = train_fnv1a(TRAIN_FNV_INIT, hb, sizeof hb);
  fwrite(hb, 1, sizeof hb, a.f);
  const float *arr[3] = {pt->p, pt->m, pt->v};
  for (int k = 0; k < 3; k++) {
    h = train_fnv1a(h, arr[k], n * sizeof(float));
    fwrite(arr[k], sizeof(float), n, a.f);
  }
  *bytes = SHARD_HEADER + 3 * n * sizeof(float);
  *hash = h;
  return train_atomic_commit(&a, err); /* a failed write shows here (ferror, fsync) */
}

/* The manifest (rank 0, after every shard): the session's header, the grid, the units,
 * their stages and the T*S*P shards' sizes and checksums (bytes[i], hash[i] of shard
 * i = (p*T + t)*S + s). */
static int manifest_write(const train_session *s, const char *path, const ckpt_grid *g,
                          const uint64_t *bytes, const uint64_t *hash, char *err) {
  int U = g->U;
  size_t n = (size_t)g->T * g->S * g->P;
  size_t total = GRID_END + 12 * (size_t)U + 16 * n;
  unsigned char *buf = malloc(total + 8);
  if (!buf) {
    train_errf(err, "checkpoint %s: out of memory", path);
    return -1;
  }
  ckpt_header h;
  fill_header(s, &h);
  cursor c = {buf, 0};
  put(&c, CKPT_MAGIC "", 8);
  FIELDS(put, &c, &h);
  uint32_t grid[4] = {(uint32_t)g->T, (uint32_t)g->S, (uint32_t)U, (uint32_t)g->P};
  put(&c, grid, sizeof grid);
  for (int u = 0; u < U; u++) {
    uint64_t l = g->ulen[u];
    put(&c, &l, 8);
  }
  put(&c, g->owner, 4 * (size_t)U);
  for (size_t i = 0; i < n; i++) {
    put(&c, &bytes[i], 8);
    put(&c, &hash[i], 8);
  }
  uint64_t fh = train_fnv1a(TRAIN_FNV_INIT, buf, total);
  put(&c, &fh, 8);
  train_atomic a;
  if (train_atomic_open(&a, path, err) != 0) {
    free(buf);
    return -1;
  }
  fwrite(buf, 1, total + 8, a.f);
  free(buf);
  return train_atomic_commit(&a, err);
}

/* What each rank tells rank 0 about its part: failed, writes, t, s, stage, shard bytes,
 * checksum. */
enum { REC_FAILED, REC_WRITES, REC_T, REC_S, REC_P, REC_BYTES, REC_HASH, REC };

/* Rank 0: every shard of the grid written exactly once (from the gathered records of nr
 * ranks), its size and checksum in place (p*T + t)*S + s; else a sentence in why. */
static int tile_grid(const uint64_t *all, int nr, int T, int S, int P, uint64_t *bytes,
                     uint64_t *hash, const char *path, char *why) {
  size_t n = (size_t)T * S * P;
  unsigned char *seen = calloc(n, 1);
  char sw[96];
  if (!seen) {
    train_errf(why, "checkpoint %s: out of memory", path);
    return -1;
  }
  int rc = 0;
  for (int q = 0; q < nr && rc == 0; q++) {
    const uint64_t *r = all + (size_t)q * REC;
    if (!r[REC_WRITES]) continue;
    size_t i = ((size_t)r[REC_P] * T + (size_t)r[REC_T]) * (size_t)S + (size_t)r[REC_S];
    if (seen[i]++) {
      train_errf(why, "checkpoint %s: %s written by two ranks", path,
                 shard_words(sw, sizeof sw, (int)r[REC_T], (int)r[REC_S], (int)r[REC_P], T, S, P));
      rc = -1;
    }
    bytes[i] = r[REC_BYTES];
    hash[i] = r[REC_HASH];
  }
  for (size_t i = 0; i < n && rc == 0; i++)
    if (!seen[i]) {
      int s = (int)(i % (size_t)S), t = (int)(i / (size_t)S % (size_t)T),
          p = (int)(i / ((size_t)S * T));
      train_errf(why, "checkpoint %s: no rank wrote %s", path,
                 shard_words(sw, sizeof sw, t, s, p, T, S, P));
      rc = -1;
    }
  free(seen);
  return rc;
}

int train_ckpt_write(train_session *s, train_backend *world, const train_ckpt_part *pt,
                     const char *path, char *err) {
  int nr = world ? world->nranks : 1, me = world ? world->rank : 0;
  int T = pt->T, S = pt->S, P = pt->P > 0 ? pt->P : 1, V = pt->chunks > 0 ? pt->chunks : 1;
  char gw[64], sw[96];
  if (T < 1 || S < 1 || (long)T * S * P > nr) { /* the same answer on every rank */
    train_errf(err, "checkpoint %s: %d ranks cannot write the shards of a %s grid", path, nr,
               grid_words(gw, sizeof gw, T, S, P));
    return -1;
  }
  uint64_t mine[REC] = {
      0, pt->writes != 0, (uint64_t)pt->t, (uint64_t)pt->s, (uint64_t)pt->stage, 0, 0};
  uint64_t *all = calloc((size_t)nr * REC, sizeof *all);
  size_t nsh = (size_t)T * S * P;
  uint64_t *bytes = calloc(nsh * 2, sizeof *bytes), *hash = NULL;
  ckpt_grid g = {0};
  char why[TRAIN_ERRLEN] = "";
  int rc = -1;
  if (!all || !bytes) { /* the peers learn of it from the failed collective (our abort, or
                         * their timeout) */
    train_errf(err, "checkpoint %s: out of memory", path);
    goto out;
  }
  hash = bytes + nsh;
  /* this rank's part must be a shard of this model's grid, cut by the model's units */
  int good = 1;
  if (pt->failed) {
    train_errf(why, "%s", pt->failed);
    good = 0;
  } else if (pt->t < 0 || pt->t >= T || pt->s < 0 || pt->s >= S || pt->stage < 0 ||
             pt->stage >= P || grid_init(&g, &s->opt.cfg, T, S, P, why) != 0 ||
             grid_rule(&g, &s->opt.cfg, V, why) != 0) {
    if (!why[0])
      train_errf(why, "checkpoint %s: %s is not in the grid", path,
                 shard_words(sw, sizeof sw, pt->t, pt->s, pt->stage, T, S, P));
    good = 0;
  } else if (pt->count != g.count[pt->stage] ||
             (pt->unit_len && memcmp(pt->unit_len, g.ulen, (size_t)g.U * sizeof *g.ulen) != 0)) {
    train_errf(why,
               "checkpoint %s: this rank's shard (%zu floats) is not %s of the model (%zu floats)",
               path, pt->count, shard_words(sw, sizeof sw, pt->t, pt->s, pt->stage, T, S, P),
               g.count[pt->stage]);
    good = 0;
  }
  if (good && pt->writes &&
      shard_write(s, path, pt, P, &mine[REC_BYTES], &mine[REC_HASH], why) != 0)
    good = 0;
  mine[REC_FAILED] = !good;
  if (world) {
    train_req r;
    if (world->all_gather(world, mine, all, sizeof mine, &r) != 0 || world->wait(world, r) != 0) {
      train_errf(err, "checkpoint %s: gathering the shard checksums: %s", path, world->err);
      goto out;
    }
  } else {
    memcpy(all, mine, sizeof mine);
  }
  /* the checkpoint exists; the rank that failed; what failed: 0 its shard, 1 the
   * manifest (rank 0), 2 the shards do not tile the grid (rank 0) */
  int32_t ok[3] = {1, -1, 0};
  if (me == 0) {
    for (int q = 0; q < nr && ok[0]; q++)
      if (all[(size_t)q * REC + REC_FAILED]) ok[0] = 0, ok[1] = q, ok[2] = 0;
    if (ok[0] && tile_grid(all, nr, T, S, P, bytes, hash, path, why) != 0)
      ok[0] = 0, ok[1] = 0, ok[2] = 2;
    if (ok[0] && manifest_write(s, path, &g, bytes, hash, why) != 0)
      ok[0] = 0, ok[1] = 0, ok[2] = 1;
  }
  if (world) { /* everyone learns whether the checkpoint exists */
    train_req r;
    if (world->broadcast(world, ok, sizeof ok, 0, &r) != 0 || world->wait(world, r) != 0) {
      train_errf(err, "checkpoint %s: %s", path, world->err);
      goto out;
    }
  }
  if (ok[0]) {
    rc = 0;
  } else if (ok[1] == me) {
    train_errf(err, "%s", why);
  } else if (ok[2] == 0) {
    train_errf(err, "checkpoint %s: rank %d could not write its shard", path, ok[1]);
  } else if (ok[2] == 1) {
    train_errf(err, "checkpoint %s: rank 0 could not write the manifest", path);
  } else {
    train_errf(err, "checkpoint %s: rank 0 found the shards do not tile the %s grid", path,
               grid_words(gw, sizeof gw, T, S, P));
  }
out:
  free(all);
  free(bytes);
  grid_free(&g);
  return rc;
}
int train_session_save(train_session *s, const char *path, char *err) {
  if (s->model->experts) { /* the manifest's config has no experts: it could not be read back */
    train_errf(err, "checkpoint %s: checkpoints of mixture-of-experts models are not built yet",
               path);
    return -1;
  }
  if (s->model->tp > 1) { /* a slice is not a model: train_tp_save writes the T slices */
    train_errf(err,
               "checkpoint %s: a tensor-parallel rank holds a slice of the model; "
               "its checkpoints are written by every rank together (train_tp_save)",
               path);
    return -1;
  }
  size_t n = s->model->nparams;
  float *buf = malloc(n * sizeof(float) * 3);
  if (!buf) {
    train_errf(err, "checkpoint %s: out of memory", path);
    return -1;
  }
  train_copy_params_to_host(s->model, buf);
  train_copy_opt_to_host(s->model, buf + n, buf + 2 * n);
  train_ckpt_part pt = {.T = 1,
                        .S = 1,
                        .t = 0,
                        .s = 0,
                        .writes = 1,
                        .p = buf,
                        .m = buf + n,
                        .v = buf + 2 * n,
                        .count = n};
  int rc = train_ckpt_write(s, NULL, &pt, path, err);
  free(buf);
  return rc;
}

int train_tp_save(train_session *s, train_backend *world, train_backend *tp, const float *p,
                  const float *am, const float *av, const char *path, char *err) {
  int T = tp->nranks, dp = world->rank / T;
  size_t n = s->model->nparams;
  float *own = NULL;
  char why[TRAIN_ERRLEN] = "";
  /* DP rank 0 of each TP group writes its slice: the other DP ranks hold the same */
  train_ckpt_part pt = {.T = T, .S = 1, .t = tp->rank, .s = 0, .writes = dp == 0, .count = n};
  if (dp == 0 && !p) {
    own = malloc(3 * n * sizeof(float));
    if (own) {
      train_copy_params_to_host(s->model, own);
      train_copy_opt_to_host(s->model, own + n, own + 2 * n);
      p = own, am = own + n, av = own + 2 * n;
    } else {
      train_errf(why, "checkpoint %s: out of memory", path);
      pt.failed = why;
    }
  }
  pt.p = p, pt.m = am, pt.v = av;
  int rc = train_ckpt_write(s, world, &pt, path, err);
  free(own);
  return rc;
}

int train_stage_save(train_session *s, train_backend *world, int T, int t, int P, int stage,
                     int chunks, int writes, const char *path, char *err) {
  train_model *m = s->model;
  /* the stage's arrays are its units in order, but for the head's copy of the tied wte
   * at their start (the first stage writes wte) */
  size_t n = m->nparams, skip = m->has_embed ? 0 : m->tensors[0].numel;
  float *own = NULL;
  char why[TRAIN_ERRLEN] = "";
  train_ckpt_part pt = {.T = T,
                        .S = 1,
                        .P = P,
                        .chunks = chunks,
                        .t = t,
                        .s = 0,
                        .stage = stage,
                        .writes = writes,
                        .count = n - skip};
  if (writes) {
    own = malloc(3 * n * sizeof(float));
    if (own) {
      train_copy_params_to_host(m, own);
      train_copy_opt_to_host(m, own + n, own + 2 * n);
      pt.p = own + skip, pt.m = own + n + skip, pt.v = own + 2 * n + skip;
    } else {
      train_errf(why, "checkpoint %s: out of memory", path);
      pt.failed = why;
    }
  }
  int rc = train_ckpt_write(s, world, &pt, path, err);
  free(own);
  return rc;
}

void train_session_set_batch_mult(train_session *s, int rows_mult) { s->batch_mult = rows_mult; }

/* ---- loading --------------------------------------------------------------------------- */

/* Shard (t, s, p) of the checkpoint at `path` (grid g, written as `version`) into sb: it
 * must exist, have the size and checksum the manifest gives, and name itself that shard,
 * of step `step`, with g's floats per array for its stage. */
static int read_shard(const char *path, const ckpt_grid *g, uint32_t version, int t, int s, int p,
                      uint64_t step, uint64_t bytes, uint64_t hash, unsigned char *sb, char *err) {
  char sp[4200], sw[96];
  uint64_t C = g->count[p];
  size_t sbytes = SHARD_HEADER + 3 * C * sizeof(float);
  train_shard_path(sp, sizeof sp, path, t, s, p, g->T, g->S, g->P);
  shard_words(sw, sizeof sw, t, s, p, g->T, g->S, g->P);
  FILE *f = fopen(sp, "rb");
  if (!f) {
    train_errf(err, "checkpoint %s is incomplete: %s (%s): %s", path, sw, sp, strerror(errno));
    return -1;
  }
  struct stat st;
  fstat(fileno(f), &st);
  if ((uint64_t)st.st_size != bytes || bytes != sbytes) {
    train_errf(err, "checkpoint %s is incomplete: %s (%s) has %lld bytes, the manifest says %llu",
               path, sw, sp, (long long)st.st_size, (unsigned long long)bytes);
    fclose(f);
    return -1;
  }
  size_t got = fread(sb, 1, sbytes, f);
  fclose(f);
  if (got != sbytes) {
    train_errf(err, "checkpoint %s: shard %s: read error", path, sp);
    return -1;
  }
  if (train_fnv1a(TRAIN_FNV_INIT, sb, sbytes) != hash) {
    train_errf(err, "checkpoint %s: %s (%s) is corrupt (checksum mismatch)", path, sw, sp);
    return -1;
  }
  uint32_t u32[6];
  uint64_t sstep, sc;
  cursor c = {sb, 8};
  get(&c, u32, sizeof u32);
  get(&c, &sstep, 8);
  get(&c, &sc, 8);
  if (memcmp(sb, SHARD_MAGIC "", 8) != 0 || u32[0] != version || u32[1] != (uint32_t)t ||
      u32[2] != (uint32_t)s || u32[3] != (uint32_t)g->T || u32[4] != (uint32_t)g->S ||
      u32[5] != (uint32_t)p || sstep != step || sc != C) {
    train_errf(err, "checkpoint %s: shard %s belongs to another checkpoint", path, sp);
    return -1;
  }
  return 0;
}

/* Where unit u starts in a slice of units ulen. */
static size_t unit_start(const size_t *ulen, int u) {
  size_t o = 0;
  for (int k = 0; k < u; k++) o += ulen[k];
  return o;
}

/* A pipeline stage's array from the same array of a slice of the whole model (units
 * ulen, L blocks): wte (and wpe) from the slice's start, each block it holds from that
 * block's place, the final LayerNorm (where it holds it) from the end. Returns the floats
 * copied: the stage's nparams when its layout is the slice's cut into its pieces. */
static size_t stage_take(const train_model *m, const size_t *ulen, int L, const float *slice,
                         float *local) {
  const train_param *t = m->tensors;
  size_t ends = t[1].offset + t[1].numel; /* wte on both end stages, wpe on the first */
  if (ends > ulen[0]) return 0;
  memcpy(local, slice, ends * sizeof(float));
  size_t got = ends;
  for (int c = 0; c < m->nchunks; c++)
    for (int j = 0; j < m->chunk_len[c]; j++) {
      int l = m->chunk_loc0[c] + j, b = m->chunk_blk0[c] + j, k = 0;
      while (k < m->ntensors && t[k].layer != l) k++; /* the block's first tensor */
      if (k == m->ntensors || b >= L || t[k].offset + ulen[b + 1] > m->nparams) return 0;
      memcpy(local + t[k].offset, slice + unit_start(ulen, b + 1), ulen[b + 1] * sizeof(float));
      got += ulen[b + 1];
    }
  const train_param *lnf = &t[m->ntensors - 2];
  size_t tail = m->nparams - lnf->offset;
  if (tail > ulen[L + 1]) return 0;
  memcpy(local + lnf->offset, slice + unit_start(ulen, L + 1), tail * sizeof(float));
  return got + tail;
}

/* Puts the single-process state (params, m, v: n floats each, one after the other) into
 * the session: as it is on one process; this rank's slice of each array (the moments are
 * split as their parameters) in a tensor-parallel session; of that, the stage's units in
 * a pipeline stage. */
static int install(train_session *s, const float *full, size_t n, char *err) {
  train_model *m = s->model;
  if (m->tp <= 1 && m->pp <= 1) {
    train_copy_params_from_host(m, full);
    train_copy_opt_from_host(m, full + n, full + 2 * n);
    return 0;
  }
  ckpt_grid g;
  size_t np = m->nparams, ln;
  float *slice = NULL, *loc = NULL;
  int rc = -1;
  if (grid_init(&g, &s->opt.cfg, m->tp, 1, 1, err) != 0) goto out;
  ln = g.ln;
  slice = m->tp > 1 ? malloc(3 * ln * sizeof(float)) : (float *)full;
  loc = m->pp > 1 ? malloc(3 * np * sizeof(float)) : slice;
  if (!slice || !loc) {
    train_errf(err, "out of memory for this rank's part of the checkpoint");
    goto out;
  }
  for (int k = 0; m->tp > 1 && k < 3; k++)
    if (train_tp_shard(&s->opt.cfg, m->tp, m->tp_rank, full + (size_t)k * n, slice + (size_t)k * ln,
                       err) != 0)
      goto out;
  for (int k = 0; m->pp > 1 && k < 3; k++)
    if (stage_take(m, g.ulen, m->layers_total, slice + (size_t)k * ln, loc + (size_t)k * np) !=
        np) {
      train_errf(err, "checkpoint: this pipeline stage's layout is not its pieces of the model");
      goto out;
    }
  train_copy_params_from_host(m, loc);
  train_copy_opt_from_host(m, loc + np, loc + 2 * np);
  rc = 0;
out:
  if (loc != slice) free(loc);
  if (slice != full) free(slice);
  grid_free(&g);
  return rc;
}

static void set_position(train_session *s, const ckpt_header *h) {
  s->step = (long)h->step;
  s->sample_rng = h->sample_rng;
  s->pos.seed = h->seed;
  s->pos.epoch = h->epoch;
  s->pos.index = h->index;
}

/* The shards of a manifest (its table of sizes and checksums at `table`, shard (t, s, p)
 * at (p*T + t)*S + s) put back together into full (3 n floats: params, m, v of the
 * single-process model): for each slice t, the pieces of every unit from its stage's S
 * shards into the slice (3 ln floats; full itself when T = 1), then the slice into its
 * place (train_tp_unshard). */
static int assemble(const train_session *s, const char *path, const ckpt_header *h,
                    const ckpt_grid *g, const unsigned char *table, float *full, size_t n,
                    char *err) {
  int T = g->T, S = g->S, P = g->P, rc = -1;
  size_t ln = g->ln, most = 0;
  for (int p = 0; p < P; p++) most = g->count[p] > most ? g->count[p] : most;
  unsigned char *sb = malloc(SHARD_HEADER + 3 * most * sizeof(float));
  float *slice = T == 1 ? full : calloc(3 * ln, sizeof(float));
  if (!sb || !slice) {
    train_errf(err, "checkpoint %s: out of memory", path);
    goto out;
  }
  for (int t = 0; t < T; t++) {
    for (int p = 0; p < P; p++)
      for (int sh = 0; sh < S; sh++) {
        size_t i = ((size_t)p * T + t) * S + sh, C = g->count[p];
        uint64_t bytes, hash;
        memcpy(&bytes, table + 16 * i, 8);
        memcpy(&hash, table + 16 * i + 8, 8);
        if (read_shard(path, g, h->version, t, sh, p, h->step, bytes, hash, sb, err) != 0) goto out;
        const unsigned char *data = sb + SHARD_HEADER;
        for (int k = 0; k < 3; k++) {
          size_t start = 0, soff = 0;
          for (int u = 0; u < g->U; u++) {
            size_t len = g->ulen[u], piece = (len + S - 1) / S, lo = (size_t)sh * piece;
            size_t cnt = lo < len ? (len - lo < piece ? len - lo : piece) : 0;
            if (g->owner[u] == (uint32_t)p) {
              memcpy(slice + (size_t)k * ln + start + lo,
                     data + ((size_t)k * C + soff) * sizeof(float), cnt * sizeof(float));
              soff += piece;
            }
            start += len;
          }
        }
      }
    for (int k = 0; T > 1 && k < 3; k++)
      if (train_tp_unshard(&s->opt.cfg, T, t, slice + (size_t)k * ln, full + (size_t)k * n, err) !=
          0)
        goto out;
  }
  rc = 0;
out:
  free(sb);
  if (slice != full) free(slice);
  return rc;
}

int train_session_load(train_session *s, const char *path, char *err) {
  if (s->model->experts) {
    train_errf(err, "checkpoint %s: checkpoints of mixture-of-experts models are not built yet",
               path);
    return -1;
  }
  FILE *f = fopen(path, "rb");
  if (!f) {
    train_errf(err, "checkpoint %s: cannot open: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  fstat(fileno(f), &st);
  size_t fsize = (size_t)st.st_size;
  unsigned char *mb = malloc(V4_FIXED);
  ckpt_grid g = {0};
  float *full = NULL;
  char gw[64];
  int rc = -1;
  if (!mb) {
    train_errf(err, "checkpoint %s: out of memory", path);
    goto out;
  }
  size_t got = fread(mb, 1, V4_FIXED, f);
  if (got < 8 || memcmp(mb, CKPT_MAGIC "", 8) != 0) {
    train_errf(err, "checkpoint %s: not a coll-train checkpoint (bad magic)", path);
    goto out;
  }
  if (got < 16) {
    train_errf(err, "checkpoint %s: truncated (%zu bytes)", path, fsize);
    goto out;
  }
  ckpt_header h;
  cursor c = {mb, 8};
  get(&c, &h.version, 4);
  get(&c, &h.header_bytes, 4);
  if ((h.version != CKPT_VERSION && h.version != CKPT_V4) || h.header_bytes != CKPT_HEADER) {
    train_errf(err, "checkpoint %s: unsupported version %u (this build reads versions %d and %d)",
               path, h.version, CKPT_V4, CKPT_VERSION);
    goto out;
  }
  int v4 = h.version == CKPT_V4;
  size_t fixed = v4 ? V4_FIXED : GRID_END;
  if (got < fixed) {
    train_errf(err, "checkpoint %s: truncated (%zu bytes, header alone is %zu)", path, fsize,
               fixed);
    goto out;
  }
  c.off = 8;
  FIELDS(get, &c, &h);
  uint32_t grid[4];
  uint64_t C4 = 0;
  get(&c, grid, sizeof grid);
  if (v4) get(&c, &C4, 8);
  /* version 4: one stage, a 0 in the stages' place */
  uint32_t T = grid[0], S = grid[1], U = grid[2], P = v4 ? (grid[3] == 0 ? 1 : 0) : grid[3];
  if (T < 1 || S < 1 || P < 1 || T > MAX_WAYS || S > MAX_WAYS || P > MAX_WAYS || U > 1u << 20) {
    train_errf(err, "checkpoint %s: corrupt manifest (a %u x %u x %u grid of %u units)", path, T, S,
               v4 ? grid[3] : P, U);
    goto out;
  }
  /* its size before its checksum and config: truncation is the likelier problem */
  size_t nsh = (size_t)T * S * P;
  size_t want = fixed + (v4 ? 8 : 12) * (size_t)U + 16 * nsh + 8;
  if (fsize != want) {
    train_errf(err, "checkpoint %s: %s (%zu bytes, expected %zu)", path,
               fsize < want ? "truncated" : "corrupt: trailing bytes", fsize, want);
    goto out;
  }
  unsigned char *grown = realloc(mb, want);
  if (!grown) {
    train_errf(err, "checkpoint %s: out of memory", path);
    goto out;
  }
  mb = grown;
  c.p = mb; /* the cursor stays at the unit lengths, in the grown buffer */
  if (fread(mb + got, 1, want - got, f) != want - got) { /* got < want: want > V4_FIXED */
    train_errf(err, "checkpoint %s: read error", path);
    goto out;
  }
  uint64_t stored;
  memcpy(&stored, mb + want - 8, 8);
  if (train_fnv1a(TRAIN_FNV_INIT, mb, want - 8) != stored) {
    train_errf(err, "checkpoint %s: corrupt (checksum mismatch)", path);
    goto out;
  }
  if (mismatch(path, &h, s, err)) goto out;
  /* the grid against this model: T must split it, and the manifest's units and shard
   * lengths must be those of its slices */
  int L = s->opt.cfg.layers;
  size_t n = full_count(s);
  char why[TRAIN_ERRLEN];
  grid_words(gw, sizeof gw, (int)T, (int)S, (int)P);
  if (grid_init(&g, &s->opt.cfg, (int)T, (int)S, (int)P, why) != 0) {
    train_errf(err, "checkpoint %s: its %s grid's slices are not this model's split %u ways: %s",
               path, gw, T, why);
    goto out;
  }
  int same = U == (uint32_t)L + 2;
  for (uint32_t u = 0; same && u < U; u++) {
    uint64_t l;
    get(&c, &l, 8);
    same = l == g.ulen[u];
  }
  if (!same) {
    train_errf(err, "checkpoint %s: its %u units do not cut this model's %d (another model)", path,
               U, L + 2);
    goto out;
  }
  for (uint32_t u = 0; !v4 && u < U; u++) {
    get(&c, &g.owner[u], 4);
    if (g.owner[u] >= P) {
      train_errf(err, "checkpoint %s: corrupt manifest (unit %u written by stage %u of %u)", path,
                 u, g.owner[u], P);
      goto out;
    }
  }
  grid_counts(&g);
  if (v4 && C4 != g.count[0]) {
    train_errf(err, "checkpoint %s: its %s grid's shards of %llu floats are not this model's (%zu)",
               path, gw, (unsigned long long)C4, g.count[0]);
    goto out;
  }
  full = calloc(3 * n, sizeof(float));
  if (!full) {
    train_errf(err, "checkpoint %s: out of memory", path);
    goto out;
  }
  /* every shard read and checked before the session changes */
  if (assemble(s, path, &h, &g, mb + c.off, full, n, err) != 0 || install(s, full, n, err) != 0)
    goto out;
  set_position(s, &h);
  rc = 0;
out:
  fclose(f);
  free(mb);
  grid_free(&g);
  free(full);
  return rc;
}
