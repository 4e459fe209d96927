/*
 * checkpoint.c — checkpoints: one format for every layout, a manifest and its shards, which
 * hold everything a run needs to continue bit for bit, at the same layout or another.
 *
 * A run's state is cut on a T x S grid: T tensor-parallel slices (tp.h's table: T = 1 is
 * the single-process model), each cut in S data-parallel shards by FSDP's units (S = N
 * under FSDP; 1 when the data-parallel ranks hold identical state, as under DDP, or in one
 * process). The checkpoint at `path` is the manifest plus T*S shard files
 * `path.shard<t>.<s>of<T>x<S>`. One process writes T = S = 1: the manifest and the one
 * shard `path.shard0.0of1x1` are the whole checkpoint of a one-process run.
 *
 * Manifest, version 4 (all little-endian; the Python reference reads the same table):
 *
 *   offset  field                     offset  field
 *   0       char magic[8] "COLLTRN\0" 68      u64 sample RNG state
 *   8       u32 version (4)           76      u64 data epoch
 *   12      u32 header bytes (148)    84      u64 data index (window in the epoch)
 *   16      u32 vocab                 92      u64 data tokens
 *   20      u32 max_seq               100     u64 data hash (FNV-1a of the token ids)
 *   24      u32 layers                108     f32 lr, min_lr_frac, beta1, beta2, eps,
 *   28      u32 channels                          weight_decay, grad_clip (7 x 4 bytes)
 *   32      u32 heads                 136     u32 warmup
 *   36      u32 batch (global: rows   140     u32 steps
 *               per optimizer step)   144     u32 flags (0)
 *   40      u32 seq                   148     u32 T, u32 S, u32 U (units: L + 2), u32 0
 *   44      u64 seed                  164     u64 C (floats per array in one shard)
 *   52      u64 step                  172     U x u64 unit length (floats: embeddings,
 *   60      u64 nparams (of the                   each block, final LayerNorm of one slice)
 *               single-process model)         T*S x (u64 shard file bytes, u64 FNV-1a of
 *                                             the shard file), shard (t, s) at t*S + s;
 *                                             then u64 FNV-1a of all manifest bytes before.
 *
 * Shard (t, s):
 *
 *   0  char magic[8] "COLLSHD\0", 8 u32 version (4), 12 u32 t, 16 u32 s, 20 u32 T, 24 u32 S,
 *   28 u32 0, 32 u64 step, 40 u64 C, 48 params, AdamW m, AdamW v (C floats each).
 *
 * Each array of shard (t, s) holds, for every unit of slice t in order, its length padded
 * to a multiple of S cut in S equal pieces, piece s (pad = 0): C = sum of ceil(len/S).
 * With S = 1 that is the whole slice, in the layout of TP rank t's model (the moments
 * split exactly as their parameters); with T = 1 a slice is the single-process model.
 *
 * Writing (train_ckpt_write, collective over the job): every rank that holds a shard no
 * other rank writes (under DDP, data-parallel rank 0 of each TP group) writes it, then the
 * shards' sizes and checksums are gathered and rank 0 writes the manifest, each file
 * atomically (train_atomic: temp file, fsync, rename, fsync dir); the manifest comes last,
 * so a checkpoint without its manifest does not exist, and a broadcast tells every rank
 * whether it does.
 *
 * Loading validates everything before changing the session, so a bad checkpoint leaves
 * the run untouched: the manifest (magic, version, size, checksum, config, data identity,
 * the grid against this model's slices and units), then every shard (size and checksum
 * against the manifest, its own header). It puts the single-process state back together
 * (the S pieces of every unit into slice t, then train_tp_unshard of each slice) and
 * installs it: as is in one process, or this rank's slice of it (train_tp_shard) in a
 * tensor-parallel session; a parallel layer then cuts its own shards of that. So any
 * checkpoint resumes at any grid whose T splits the model and whose global batch is the
 * same (resharding on load). Slicing is copying, and a slice's vocabulary padding rows
 * (zero parameters, zero gradients, zero moments) are dropped when the slices are put
 * together and zero again when they are cut, so a resume at the same grid is bitwise.
 */
#include "model/model.h"
#include "parallel/checkpoint.h"
#include "parallel/tp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CKPT_MAGIC "COLLTRN"
#define CKPT_VERSION 4
#define CKPT_HEADER 148
#define MANIFEST_FIXED 172 /* the header, the grid and C: what the manifest's size follows */
#define SHARD_MAGIC "COLLSHD"
#define SHARD_HEADER 48
#define MAX_WAYS 65536 /* T and S beyond this are a corrupt manifest, not a grid */

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

/* The L+2 unit lengths of one slice of the model split T ways (ulen), the slice's floats
 * (*ln) and the floats of one of its S shards (*count: each unit padded to a multiple of
 * S); -1 with a sentence when the model cannot be split T ways. */
static int grid_units(const train_config *cfg, int T, int S, size_t *ulen, size_t *ln,
                      size_t *count, char *err) {
  size_t act = 0;
  if (T > 1 && train_tp_config_check(cfg, T, TRAIN_DEVICE_CPU, err) != 0) return -1;
  if (train_model_sizes_tp(cfg, 1, 1, T, 0, ln, &act, ulen) != 0) {
    train_errf(err, "out of memory");
    return -1;
  }
  *count = 0;
  for (int u = 0; u < cfg->layers + 2; u++) *count += (ulen[u] + (size_t)S - 1) / (size_t)S;
  return 0;
}

void train_shard_path(char *out, size_t n, const char *manifest, int t, int s, int T, int S) {
  snprintf(out, n, "%s.shard%d.%dof%dx%d", manifest, t, s, T, S);
}

/* ---- writing -------------------------------------------------------------------------- */

/* This rank's shard, atomically; *bytes and *hash (of the whole file) for the manifest. */
static int shard_write(const train_session *s, const char *manifest, const train_ckpt_part *pt,
                       uint64_t *bytes, uint64_t *hash, char *err) {
  char path[4200];
  train_shard_path(path, sizeof path, manifest, pt->t, pt->s, pt->T, pt->S);
  unsigned char hb[SHARD_HEADER];
  cursor c = {hb, 0};
  uint32_t u32[6] = {CKPT_VERSION,    (uint32_t)pt->t, (uint32_t)pt->s,
                     (uint32_t)pt->T, (uint32_t)pt->S, 0};
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

/* The manifest (rank 0, after every shard): the session's header, the grid, the units and
 * the T*S shards' sizes and checksums (bytes[i], hash[i] of shard i = t*S + s). */
static int manifest_write(const train_session *s, const char *path, int T, int S,
                          const size_t *ulen, size_t count, const uint64_t *bytes,
                          const uint64_t *hash, char *err) {
  int U = s->opt.cfg.layers + 2, n = T * S;
  size_t total = MANIFEST_FIXED + 8 * (size_t)U + 16 * (size_t)n;
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
  uint32_t grid[4] = {(uint32_t)T, (uint32_t)S, (uint32_t)U, 0};
  uint64_t c64 = count;
  put(&c, grid, sizeof grid);
  put(&c, &c64, 8);
  for (int u = 0; u < U; u++) {
    uint64_t l = ulen[u];
    put(&c, &l, 8);
  }
  for (int i = 0; i < n; i++) {
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

/* What each rank tells rank 0 about its part: failed, writes, t, s, shard bytes, checksum. */
enum { REC_FAILED, REC_WRITES, REC_T, REC_S, REC_BYTES, REC_HASH, REC };

/* Rank 0: every shard of the grid written exactly once (from the gathered records of nr
 * ranks), its size and checksum in place t*S + s; else a sentence in why. */
static int tile_grid(const uint64_t *all, int nr, int T, int S, uint64_t *bytes, uint64_t *hash,
                     const char *path, char *why) {
  int n = T * S;
  unsigned char *seen = calloc((size_t)n, 1);
  if (!seen) {
    train_errf(why, "checkpoint %s: out of memory", path);
    return -1;
  }
  int rc = 0;
  for (int q = 0; q < nr && rc == 0; q++) {
    const uint64_t *r = all + (size_t)q * REC;
    if (!r[REC_WRITES]) continue;
    size_t i = (size_t)r[REC_T] * (size_t)S + (size_t)r[REC_S];
    if (seen[i]++) {
      train_errf(why, "checkpoint %s: shard %d.%d of %dx%d written by two ranks", path,
                 (int)r[REC_T], (int)r[REC_S], T, S);
      rc = -1;
    }
    bytes[i] = r[REC_BYTES];
    hash[i] = r[REC_HASH];
  }
  for (int i = 0; i < n && rc == 0; i++)
    if (!seen[i]) {
      train_errf(why, "checkpoint %s: no rank wrote shard %d.%d of %dx%d", path, i / S, i % S, T,
                 S);
      rc = -1;
    }
  free(seen);
  return rc;
}

int train_ckpt_write(train_session *s, train_backend *world, const train_ckpt_part *pt,
                     const char *path, char *err) {
  int nr = world ? world->nranks : 1, me = world ? world->rank : 0;
  int T = pt->T, S = pt->S, U = s->opt.cfg.layers + 2;
  if (T < 1 || S < 1 || (long)T * S > nr) { /* the same answer on every rank */
    train_errf(err,
               "checkpoint %s: %d ranks cannot write the %d x %d shards of a %d x %d "
               "grid",
               path, nr, T, S, T, S);
    return -1;
  }
  uint64_t mine[REC] = {0, pt->writes != 0, (uint64_t)pt->t, (uint64_t)pt->s, 0, 0};
  uint64_t *all = calloc((size_t)nr * REC, sizeof *all);
  uint64_t *bytes = calloc((size_t)T * (size_t)S * 2, sizeof *bytes), *hash = NULL;
  size_t *ulen = calloc((size_t)U, sizeof *ulen), ln = 0, count = 0;
  char why[TRAIN_ERRLEN] = "";
  int rc = -1;
  if (!all || !bytes || !ulen) { /* the peers learn of it from the failed collective (our
                                  * abort, or their timeout) */
    train_errf(err, "checkpoint %s: out of memory", path);
    goto out;
  }
  hash = bytes + (size_t)T * (size_t)S;
  /* this rank's part must be a shard of this model's grid, cut by the model's units */
  int good = 1;
  if (pt->failed) {
    train_errf(why, "%s", pt->failed);
    good = 0;
  } else if (pt->t < 0 || pt->t >= T || pt->s < 0 || pt->s >= S ||
             grid_units(&s->opt.cfg, T, S, ulen, &ln, &count, why) != 0) {
    if (!why[0])
      train_errf(why, "checkpoint %s: shard %d.%d is not in a %dx%d grid", path, pt->t, pt->s, T,
                 S);
    good = 0;
  } else if (pt->count != count ||
             (pt->unit_len && memcmp(pt->unit_len, ulen, (size_t)U * sizeof *ulen) != 0)) {
    train_errf(why,
               "checkpoint %s: this rank's shard (%zu floats) is not shard %d.%d of "
               "the model's %dx%d grid (%zu floats)",
               path, pt->count, pt->t, pt->s, T, S, count);
    good = 0;
  }
  if (good && pt->writes && shard_write(s, path, pt, &mine[REC_BYTES], &mine[REC_HASH], why) != 0)
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
    if (ok[0] && tile_grid(all, nr, T, S, bytes, hash, path, why) != 0)
      ok[0] = 0, ok[1] = 0, ok[2] = 2;
    if (ok[0] && manifest_write(s, path, T, S, ulen, count, bytes, hash, why) != 0)
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
    train_errf(err, "checkpoint %s: rank 0 found the shards do not tile the %dx%d grid", path, T,
               S);
  }
out:
  free(all);
  free(bytes);
  free(ulen);
  return rc;
}

int train_session_save(train_session *s, const char *path, char *err) {
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

void train_session_set_batch_mult(train_session *s, int rows_mult) { s->batch_mult = rows_mult; }

/* ---- loading --------------------------------------------------------------------------- */

/* Shard (t, s) of the checkpoint at `path` into sb (sbytes): it must exist, have the size
 * and checksum the manifest gives, and name itself shard (t, s) of the T x S grid, of step
 * `step`, with C floats per array. */
static int read_shard(const char *path, uint32_t t, uint32_t s, uint32_t T, uint32_t S,
                      uint64_t step, uint64_t C, uint64_t bytes, uint64_t hash, unsigned char *sb,
                      size_t sbytes, char *err) {
  char sp[4200];
  train_shard_path(sp, sizeof sp, path, (int)t, (int)s, (int)T, (int)S);
  FILE *f = fopen(sp, "rb");
  if (!f) {
    train_errf(err, "checkpoint %s is incomplete: shard %u.%u of %ux%u (%s): %s", path, t, s, T, S,
               sp, strerror(errno));
    return -1;
  }
  struct stat st;
  fstat(fileno(f), &st);
  if ((uint64_t)st.st_size != bytes || bytes != sbytes) {
    train_errf(err,
               "checkpoint %s is incomplete: shard %u.%u of %ux%u (%s) has %lld "
               "bytes, the manifest says %llu",
               path, t, s, T, S, sp, (long long)st.st_size, (unsigned long long)bytes);
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
    train_errf(err,
               "checkpoint %s: shard %u.%u of %ux%u (%s) is corrupt (checksum "
               "mismatch)",
               path, t, s, T, S, sp);
    return -1;
  }
  uint32_t u32[6];
  uint64_t sstep, sc;
  cursor c = {sb, 8};
  get(&c, u32, sizeof u32);
  get(&c, &sstep, 8);
  get(&c, &sc, 8);
  if (memcmp(sb, SHARD_MAGIC "", 8) != 0 || u32[0] != CKPT_VERSION || u32[1] != t || u32[2] != s ||
      u32[3] != T || u32[4] != S || sstep != step || sc != C) {
    train_errf(err, "checkpoint %s: shard %s belongs to another checkpoint", path, sp);
    return -1;
  }
  return 0;
}

/* Puts the single-process state (params, m, v: n floats each, one after the other) into
 * the session: as it is on one process; this rank's slice of each array (the moments are
 * split as their parameters) in a tensor-parallel session. */
static int install(train_session *s, const float *full, size_t n, char *err) {
  train_model *m = s->model;
  if (m->tp <= 1) {
    train_copy_params_from_host(m, full);
    train_copy_opt_from_host(m, full + n, full + 2 * n);
    return 0;
  }
  size_t ln = m->nparams;
  float *loc = malloc(3 * ln * sizeof(float));
  if (!loc) {
    train_errf(err, "out of memory for this rank's slice of the checkpoint");
    return -1;
  }
  for (int k = 0; k < 3; k++)
    if (train_tp_shard(&s->opt.cfg, m->tp, m->tp_rank, full + (size_t)k * n, loc + (size_t)k * ln,
                       err) != 0) {
      free(loc);
      return -1;
    }
  train_copy_params_from_host(m, loc);
  train_copy_opt_from_host(m, loc + ln, loc + 2 * ln);
  free(loc);
  return 0;
}

static void set_position(train_session *s, const ckpt_header *h) {
  s->step = (long)h->step;
  s->sample_rng = h->sample_rng;
  s->pos.seed = h->seed;
  s->pos.epoch = h->epoch;
  s->pos.index = h->index;
}

/* The shards of a manifest (mb, checked: its table of sizes and checksums at c) put back
 * together into full (3 n floats: params, m, v of the single-process model): for each
 * slice t, the S shards' pieces of every unit into slice (3 ln floats; full itself when
 * T = 1), then the slice into its place (train_tp_unshard). */
static int assemble(const train_session *s, const char *path, const ckpt_header *h, cursor *c,
                    uint32_t T, uint32_t S, const size_t *ulen, size_t ln, size_t C, float *full,
                    size_t n, char *err) {
  int U = s->opt.cfg.layers + 2, rc = -1;
  size_t sbytes = SHARD_HEADER + 3 * C * sizeof(float);
  unsigned char *sb = malloc(sbytes);
  float *slice = T == 1 ? full : calloc(3 * ln, sizeof(float));
  if (!sb || !slice) {
    train_errf(err, "checkpoint %s: out of memory", path);
    goto out;
  }
  for (uint32_t t = 0; t < T; t++) {
    for (uint32_t sh = 0; sh < S; sh++) {
      uint64_t bytes, hash;
      get(c, &bytes, 8);
      get(c, &hash, 8);
      if (read_shard(path, t, sh, T, S, h->step, C, bytes, hash, sb, sbytes, err) != 0) goto out;
      const float *loc = (const float *)(sb + SHARD_HEADER);
      for (int k = 0; k < 3; k++) {
        size_t start = 0, soff = 0;
        for (int u = 0; u < U; u++) {
          size_t piece = (ulen[u] + S - 1) / S, lo = (size_t)sh * piece;
          size_t cnt = lo < ulen[u] ? (ulen[u] - lo < piece ? ulen[u] - lo : piece) : 0;
          memcpy(slice + (size_t)k * ln + start + lo, loc + (size_t)k * C + soff,
                 cnt * sizeof(float));
          start += ulen[u];
          soff += piece;
        }
      }
    }
    for (int k = 0; T > 1 && k < 3; k++)
      if (train_tp_unshard(&s->opt.cfg, (int)T, (int)t, slice + (size_t)k * ln,
                           full + (size_t)k * n, err) != 0)
        goto out;
  }
  rc = 0;
out:
  free(sb);
  if (slice != full) free(slice);
  return rc;
}

int train_session_load(train_session *s, const char *path, char *err) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    train_errf(err, "checkpoint %s: cannot open: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  fstat(fileno(f), &st);
  size_t fsize = (size_t)st.st_size;
  unsigned char *mb = malloc(MANIFEST_FIXED);
  size_t *ulen = NULL;
  float *full = NULL;
  int rc = -1;
  if (!mb) {
    train_errf(err, "checkpoint %s: out of memory", path);
    goto out;
  }
  size_t got = fread(mb, 1, MANIFEST_FIXED, f);
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
  if (h.version != CKPT_VERSION || h.header_bytes != CKPT_HEADER) {
    train_errf(err, "checkpoint %s: unsupported version %u (this build reads version %d)", path,
               h.version, CKPT_VERSION);
    goto out;
  }
  if (got < MANIFEST_FIXED) {
    train_errf(err, "checkpoint %s: truncated (%zu bytes, header alone is %d)", path, fsize,
               MANIFEST_FIXED);
    goto out;
  }
  c.off = 8;
  FIELDS(get, &c, &h);
  uint32_t grid[4];
  uint64_t C;
  get(&c, grid, sizeof grid);
  get(&c, &C, 8);
  uint32_t T = grid[0], S = grid[1], U = grid[2];
  if (T < 1 || S < 1 || T > MAX_WAYS || S > MAX_WAYS || U > 1u << 20 || grid[3] != 0) {
    train_errf(err, "checkpoint %s: corrupt manifest (a %u x %u grid of %u units)", path, T, S, U);
    goto out;
  }
  /* its size before its checksum and config: truncation is the likelier problem */
  size_t want = MANIFEST_FIXED + 8 * (size_t)U + 16 * (size_t)T * S + 8;
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
  if (fread(mb + MANIFEST_FIXED, 1, want - MANIFEST_FIXED, f) != want - MANIFEST_FIXED) {
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
   * length must be those of its slices */
  int L = s->opt.cfg.layers;
  size_t ln = 0, count = 0, n = full_count(s);
  char why[TRAIN_ERRLEN];
  ulen = calloc((size_t)L + 2, sizeof *ulen);
  if (!ulen) {
    train_errf(err, "checkpoint %s: out of memory", path);
    goto out;
  }
  if (grid_units(&s->opt.cfg, (int)T, (int)S, ulen, &ln, &count, why) != 0) {
    train_errf(err,
               "checkpoint %s: its %u x %u grid's slices are not this model's split "
               "%u ways: %s",
               path, T, S, T, why);
    goto out;
  }
  int same = U == (uint32_t)L + 2;
  for (uint32_t u = 0; same && u < U; u++) {
    uint64_t l;
    get(&c, &l, 8);
    same = l == ulen[u];
  }
  if (!same) {
    train_errf(err,
               "checkpoint %s: its %u units do not cut this model's %d (another "
               "model)",
               path, U, L + 2);
    goto out;
  }
  if (C != count) {
    train_errf(err,
               "checkpoint %s: its %u x %u grid's shards of %llu floats are not "
               "this model's (%zu)",
               path, T, S, (unsigned long long)C, count);
    goto out;
  }
  full = calloc(3 * n, sizeof(float));
  if (!full) {
    train_errf(err, "checkpoint %s: out of memory", path);
    goto out;
  }
  /* every shard read and checked before the session changes */
  if (assemble(s, path, &h, &c, T, S, ulen, ln, count, full, n, err) != 0 ||
      install(s, full, n, err) != 0)
    goto out;
  set_position(s, &h);
  rc = 0;
out:
  fclose(f);
  free(mb);
  free(ulen);
  free(full);
  return rc;
}
