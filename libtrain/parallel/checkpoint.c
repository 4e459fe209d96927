/*
 * ckpt.c — checkpoints: one file holds everything a run needs to continue bit for bit.
 *
 * Format, version 1 (all little-endian; the Python reference reads the same table):
 *
 *   offset  field                     offset  field
 *   0       char magic[8] "COLLTRN\0" 68      u64 sample RNG state
 *   8       u32 version (1)           76      u64 data epoch
 *   12      u32 header bytes (148)    84      u64 data index (window in the epoch)
 *   16      u32 vocab                 92      u64 data tokens
 *   20      u32 max_seq               100     u64 data hash (FNV-1a of the token ids)
 *   24      u32 layers                108     f32 lr, min_lr_frac, beta1, beta2, eps,
 *   28      u32 channels                          weight_decay, grad_clip (7 x 4 bytes)
 *   32      u32 heads                 136     u32 warmup
 *   36      u32 batch                 140     u32 steps
 *   40      u32 seq                   144     u32 flags (0)
 *   44      u64 seed
 *   52      u64 step
 *   60      u64 nparams
 *
 *   148     params, adam m, adam v (nparams f32 each), then u64 FNV-1a of all bytes before.
 *
 * Sharded checkpoints (version 2, written by --parallel fsdp: train_fsdp_save). The file
 * at `path` is the manifest: the same 148-byte header with version 2, flags 1 and `batch`
 * the global batch (rows per optimizer step), then
 *
 *   u32 nranks N, u32 nunits U, U x u64 unit length (floats: embeddings, each block,
 *   final LayerNorm), N x (u64 shard file bytes, u64 FNV-1a of the shard file),
 *   u64 FNV-1a of all manifest bytes before it.
 *
 * Rank r's shard is the file `path.shard<r>of<N>`:
 *
 *   char magic[8] "COLLSHD\0", u32 version (1), u32 rank, u32 nranks, u32 0, u64 step,
 *   u64 S (floats per array), then params, adam m, adam v (S floats each): for every unit
 *   in order, its padded length ceil(len/N)*N cut in N equal pieces, piece r (pad = 0).
 *
 * Every shard is written (temp, fsync, rename) before rank 0 writes the manifest the
 * same way, so a checkpoint without its manifest does not exist. Loading a manifest reads
 * every shard, checks its size and checksum against the manifest, and puts the full
 * ranges back together: the session then holds the whole state, whatever N saved it, and
 * a parallel layer cuts it for its own N (resharding on load).
 *
 * Tensor-parallel checkpoints (version 3, written by --tp: train_tp_save). The manifest at
 * `path` is the 148-byte header with version 3, flags 2, `nparams` the single-process
 * model's count and `batch` the global batch, then
 *
 *   u32 T, u32 D (the grid), u64 S (floats per array of one TP rank's slice),
 *   T x (u64 shard file bytes, u64 FNV-1a of the shard file), u64 FNV-1a of all before.
 *
 * TP rank t's shard is `path.shard<t>of<T>`, the shard layout above with S = the local
 * parameter count: that rank's slice (tp.h's table) of the parameters, AdamW m and AdamW
 * v (the moments are split exactly as their parameters). Only data-parallel rank 0 of
 * each TP group writes (DDP keeps every DP rank's state identical); the shards are written
 * before the manifest, which rank 0 writes last.
 *
 * Every loader first assembles the single-process state (params, m, v in the layout of
 * the T = 1 model: train_tp_unshard of each shard), then installs it: as is in one
 * process, or this rank's slice of it (train_tp_shard) in a tensor-parallel session —
 * so any checkpoint (plain, FSDP-sharded, tensor-parallel at any T) resumes at any grid
 * whose T splits the model and whose global batch is the same. Slicing is copying, and
 * the vocabulary padding rows (zero parameters, zero gradients, zero moments) are not
 * stored, so a resume at the same grid is bitwise.
 *
 * Writes go through train_atomic (temp file, fsync, rename, fsync dir). Loads validate
 * everything (magic, version, size, config, data identity, hash) before changing the
 * session, so a bad checkpoint leaves the run untouched.
 */
#include "model/model.h"
#include "parallel/checkpoint.h"
#include "parallel/tp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CKPT_MAGIC "COLLTRN"
#define CKPT_VERSION 1
#define CKPT_VERSION_SHARDED 2
#define CKPT_VERSION_TP 3
#define CKPT_HEADER 148
#define SHARD_MAGIC "COLLSHD"
#define SHARD_HEADER 32

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
static void put(cursor *c, const void *v, size_t n)
{
    memcpy(c->p + c->off, v, n); /* x86-64 and aarch64 hosts are little-endian */
    c->off += n;
}
static void get(cursor *c, void *v, size_t n)
{
    memcpy(v, c->p + c->off, n);
    c->off += n;
}
#define FIELDS(OP, c, h)                                                                   \
    OP(c, &(h)->version, 4); OP(c, &(h)->header_bytes, 4);                                 \
    OP(c, &(h)->vocab, 4); OP(c, &(h)->max_seq, 4); OP(c, &(h)->layers, 4);                \
    OP(c, &(h)->channels, 4); OP(c, &(h)->heads, 4); OP(c, &(h)->batch, 4);                \
    OP(c, &(h)->seq, 4); OP(c, &(h)->seed, 8); OP(c, &(h)->step, 8);                       \
    OP(c, &(h)->nparams, 8); OP(c, &(h)->sample_rng, 8); OP(c, &(h)->epoch, 8);            \
    OP(c, &(h)->index, 8); OP(c, &(h)->data_tokens, 8); OP(c, &(h)->data_hash, 8);         \
    OP(c, &(h)->lr, 4); OP(c, &(h)->min_lr_frac, 4); OP(c, &(h)->beta1, 4);                \
    OP(c, &(h)->beta2, 4); OP(c, &(h)->eps, 4); OP(c, &(h)->weight_decay, 4);              \
    OP(c, &(h)->grad_clip, 4); OP(c, &(h)->warmup, 4); OP(c, &(h)->steps, 4);              \
    OP(c, &(h)->flags, 4)

/* Parameters of the single-process model (what every checkpoint's arrays are counted in,
 * whatever slice this session holds). */
static size_t full_count(const train_session *s)
{
    size_t np = 0, act = 0;
    if (train_model_sizes(&s->opt.cfg, 1, 1, &np, &act, NULL) != 0)
        return 0;
    return np;
}

static void fill_header(const train_session *s, ckpt_header *h)
{
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

int train_session_save(train_session *s, const char *path, char *err)
{
    if (s->model->tp > 1) { /* a slice is not a model: train_tp_save writes the T slices */
        train_errf(err, "checkpoint %s: a tensor-parallel rank holds a slice of the model; "
                   "its checkpoints are written by every rank together (train_tp_save)", path);
        return -1;
    }
    ckpt_header h;
    fill_header(s, &h);
    unsigned char hb[CKPT_HEADER];
    cursor c = {hb, 0};
    put(&c, CKPT_MAGIC "", 8);
    FIELDS(put, &c, &h);
    size_t n = s->model->nparams;
    float *buf = malloc(n * sizeof(float) * 3);
    if (!buf) {
        train_errf(err, "checkpoint %s: out of memory", path);
        return -1;
    }
    train_copy_params_to_host(s->model, buf);
    train_copy_opt_to_host(s->model, buf + n, buf + 2 * n);

    train_atomic a;
    if (train_atomic_open(&a, path, err) != 0) {
        free(buf);
        return -1;
    }
    uint64_t hash = train_fnv1a(TRAIN_FNV_INIT, hb, sizeof hb);
    hash = train_fnv1a(hash, buf, n * sizeof(float) * 3);
    fwrite(hb, 1, sizeof hb, a.f);
    fwrite(buf, sizeof(float), n * 3, a.f);
    fwrite(&hash, 8, 1, a.f);
    free(buf);
    return train_atomic_commit(&a, err);
}

static int mismatch(const char *path, const ckpt_header *h, const train_session *s, char *err)
{
    const train_options *o = &s->opt;
    if (h->vocab != (uint32_t)o->cfg.vocab || h->max_seq != (uint32_t)o->cfg.max_seq ||
        h->layers != (uint32_t)o->cfg.layers || h->channels != (uint32_t)o->cfg.channels ||
        h->heads != (uint32_t)o->cfg.heads) {
        train_errf(err,
                   "checkpoint %s is from another config: layers %u channels %u heads %u "
                   "vocab %u max_seq %u, this run has layers %d channels %d heads %d vocab %d "
                   "max_seq %d",
                   path, h->layers, h->channels, h->heads, h->vocab, h->max_seq,
                   o->cfg.layers, o->cfg.channels, o->cfg.heads, o->cfg.vocab,
                   o->cfg.max_seq);
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
    if (h->data_tokens != train_data_tokens(s->data) ||
        h->data_hash != train_data_hash(s->data)) {
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

/* ---- sharded checkpoints ------------------------------------------------------------ */

void train_shard_path(char *out, size_t n, const char *manifest, int rank, int nranks)
{
    snprintf(out, n, "%s.shard%dof%d", manifest, rank, nranks);
}

int train_shard_write(const train_session *s, const char *manifest, int rank, int nranks,
                      const float *p, const float *m, const float *v, size_t S,
                      uint64_t *bytes, uint64_t *hash, char *err)
{
    char path[4200];
    train_shard_path(path, sizeof path, manifest, rank, nranks);
    unsigned char hb[SHARD_HEADER] = {0};
    cursor c = {hb, 0};
    uint32_t ver = 1, r = (uint32_t)rank, nr = (uint32_t)nranks, zero = 0;
    uint64_t step = (uint64_t)s->step, n = S;
    put(&c, SHARD_MAGIC "", 8);
    put(&c, &ver, 4);
    put(&c, &r, 4);
    put(&c, &nr, 4);
    put(&c, &zero, 4);
    put(&c, &step, 8);
    train_atomic a;
    if (train_atomic_open(&a, path, err) != 0)
        return -1;
    uint64_t h = train_fnv1a(TRAIN_FNV_INIT, hb, sizeof hb);
    fwrite(hb, 1, sizeof hb, a.f);
    const float *arr[3] = {p, m, v};
    for (int k = 0; k < 3; k++) {
        h = train_fnv1a(h, arr[k], S * sizeof(float));
        fwrite(arr[k], sizeof(float), S, a.f);
    }
    (void)n;
    *bytes = SHARD_HEADER + 3 * S * sizeof(float);
    *hash = h;
    return train_atomic_commit(&a, err);
}

/* A manifest of `total` bytes before its checksum, in memory: the session's header (of
 * this version and flags) written, the cursor c after it. NULL when out of memory. */
static unsigned char *manifest_start(const train_session *s, const char *path, uint32_t version,
                                     uint32_t flags, size_t total, cursor *c, char *err)
{
    ckpt_header h;
    fill_header(s, &h);
    h.version = version;
    h.flags = flags;
    unsigned char *buf = malloc(total + 8);
    if (!buf) {
        train_errf(err, "checkpoint %s: out of memory", path);
        return NULL;
    }
    *c = (cursor){buf, 0};
    put(c, CKPT_MAGIC "", 8);
    FIELDS(put, c, &h);
    return buf;
}

/* Appends the checksum of the manifest's `total` bytes and writes it to path atomically;
 * frees buf. */
static int manifest_finish(const char *path, unsigned char *buf, size_t total, cursor *c,
                           char *err)
{
    uint64_t fh = train_fnv1a(TRAIN_FNV_INIT, buf, total);
    put(c, &fh, 8);
    train_atomic a;
    if (train_atomic_open(&a, path, err) != 0) {
        free(buf);
        return -1;
    }
    fwrite(buf, 1, total + 8, a.f);
    free(buf);
    return train_atomic_commit(&a, err);
}

int train_manifest_write(train_session *s, const char *path, int nranks, int nunits,
                         const size_t *unit_len, const uint64_t *bytes, const uint64_t *hash,
                         char *err)
{
    size_t total = CKPT_HEADER + 8 + 8 * (size_t)nunits + 16 * (size_t)nranks;
    cursor c;
    unsigned char *buf = manifest_start(s, path, CKPT_VERSION_SHARDED, 1, total, &c, err);
    if (!buf)
        return -1;
    uint32_t nr = (uint32_t)nranks, nu = (uint32_t)nunits;
    put(&c, &nr, 4);
    put(&c, &nu, 4);
    for (int u = 0; u < nunits; u++) {
        uint64_t l = unit_len[u];
        put(&c, &l, 8);
    }
    for (int r = 0; r < nranks; r++) {
        put(&c, &bytes[r], 8);
        put(&c, &hash[r], 8);
    }
    return manifest_finish(path, buf, total, &c, err);
}

/* Reads shard r (already checked against the manifest's size and hash) into the full
 * arrays: piece r of every unit. */
static void unshard(const float *sh, size_t S, int r, int N, int nu, const size_t *ulen,
                    float *full, size_t n)
{
    for (int k = 0; k < 3; k++) {
        size_t start = 0, soff = 0;
        for (int u = 0; u < nu; u++) {
            size_t piece = (ulen[u] + (size_t)N - 1) / (size_t)N;
            size_t lo = (size_t)r * piece;
            size_t cnt = lo < ulen[u] ? (ulen[u] - lo < piece ? ulen[u] - lo : piece) : 0;
            memcpy(full + (size_t)k * n + start + lo, sh + (size_t)k * S + soff,
                   cnt * sizeof(float));
            start += ulen[u];
            soff += piece;
        }
    }
}

/* Puts the single-process state (params, m, v: n floats each, one after the other) into
 * the session: as it is on one process; this rank's slice of each array (the moments are
 * split as their parameters) in a tensor-parallel session. */
static int install(train_session *s, const float *full, size_t n, char *err)
{
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
        if (train_tp_shard(&s->opt.cfg, m->tp, m->tp_rank, full + (size_t)k * n,
                           loc + (size_t)k * ln, err) != 0) {
            free(loc);
            return -1;
        }
    train_copy_params_from_host(m, loc);
    train_copy_opt_from_host(m, loc + ln, loc + 2 * ln);
    free(loc);
    return 0;
}

static void set_position(train_session *s, const ckpt_header *h)
{
    s->step = (long)h->step;
    s->sample_rng = h->sample_rng;
    s->pos.seed = h->seed;
    s->pos.epoch = h->epoch;
    s->pos.index = h->index;
}

/* Shard r of N of the checkpoint at `path` into sb (sbytes): it must exist, have the size
 * and checksum the manifest gives, and name itself shard r of N of step `step`. */
static int read_shard(const char *path, uint32_t r, uint32_t N, uint64_t step, uint64_t bytes,
                      uint64_t hash, unsigned char *sb, size_t sbytes, char *err)
{
    char sp[4200];
    train_shard_path(sp, sizeof sp, path, (int)r, (int)N);
    FILE *f = fopen(sp, "rb");
    if (!f) {
        train_errf(err, "checkpoint %s is incomplete: shard %u of %u (%s): %s", path, r, N, sp,
                   strerror(errno));
        return -1;
    }
    struct stat st;
    fstat(fileno(f), &st);
    if ((uint64_t)st.st_size != bytes || bytes != sbytes) {
        train_errf(err, "checkpoint %s is incomplete: shard %u of %u (%s) has %lld bytes, "
                   "the manifest says %llu", path, r, N, sp, (long long)st.st_size,
                   (unsigned long long)bytes);
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
        train_errf(err, "checkpoint %s: shard %u of %u (%s) is corrupt (checksum mismatch)",
                   path, r, N, sp);
        return -1;
    }
    uint32_t sr, sn;
    uint64_t sstep;
    memcpy(&sr, sb + 12, 4);
    memcpy(&sn, sb + 16, 4);
    memcpy(&sstep, sb + 24, 8);
    if (memcmp(sb, SHARD_MAGIC "", 8) != 0 || sr != r || sn != N || sstep != step) {
        train_errf(err, "checkpoint %s: shard %s belongs to another checkpoint", path, sp);
        return -1;
    }
    return 0;
}

/* Puts shard r of N's params, m and v (S floats each, one after the other) in their
 * places in the single-process state (n floats each); how depends on the layout. */
typedef int (*place_fn)(const float *loc, size_t S, uint32_t r, uint32_t N, float *full,
                        size_t n, const void *how, char *err);

/* The N shards a manifest lists from cursor c on (size and checksum of each), each with S
 * floats of params, m and v: read and checked, put together with place, installed in the
 * session with the data position of h. The FSDP and TP loaders differ only in how a shard
 * is placed (place, how). */
static int load_shards(train_session *s, const char *path, const ckpt_header *h, cursor *c,
                       uint32_t N, size_t S, place_fn place, const void *how, char *err)
{
    size_t n = full_count(s), sbytes = SHARD_HEADER + 3 * S * sizeof(float);
    float *full = calloc(3 * n, sizeof(float));
    unsigned char *sb = malloc(sbytes);
    int rc = -1;
    if (!full || !sb) {
        train_errf(err, "checkpoint %s: out of memory", path);
        goto out;
    }
    for (uint32_t r = 0; r < N; r++) {
        uint64_t bytes, hash;
        get(c, &bytes, 8);
        get(c, &hash, 8);
        if (read_shard(path, r, N, h->step, bytes, hash, sb, sbytes, err) != 0 ||
            place((const float *)(sb + SHARD_HEADER), S, r, N, full, n, how, err) != 0)
            goto out;
    }
    if (install(s, full, n, err) != 0)
        goto out;
    set_position(s, h);
    rc = 0;
out:
    free(sb);
    free(full);
    return rc;
}

/* The whole manifest (fsize bytes) in memory, its length and checksum checked against
 * `want(fsize, manifest)`, which gives the size the manifest's own counts imply (0 when
 * they are impossible). */
static unsigned char *read_manifest(const char *path, size_t fsize,
                                    size_t (*want)(const unsigned char *, size_t), char *err)
{
    unsigned char *mb = malloc(fsize > CKPT_HEADER + 32 ? fsize : CKPT_HEADER + 32);
    FILE *f = fopen(path, "rb");
    if (!mb || !f || fread(mb, 1, fsize, f) != fsize) {
        train_errf(err, "checkpoint %s: %s", path, f ? "read error" : strerror(errno));
        if (f)
            fclose(f);
        free(mb);
        return NULL;
    }
    fclose(f);
    size_t w = want(mb, fsize);
    if (w == 0 || fsize != w) {
        train_errf(err, "checkpoint %s: manifest %s (%zu bytes)", path,
                   w && fsize < w ? "truncated" : "corrupt", fsize);
        free(mb);
        return NULL;
    }
    uint64_t stored;
    memcpy(&stored, mb + w - 8, 8);
    if (train_fnv1a(TRAIN_FNV_INIT, mb, w - 8) != stored) {
        train_errf(err, "checkpoint %s: corrupt manifest (checksum mismatch)", path);
        free(mb);
        return NULL;
    }
    return mb;
}

static size_t fsdp_manifest_size(const unsigned char *mb, size_t fsize)
{
    uint32_t N, nu;
    if (fsize < CKPT_HEADER + 8)
        return CKPT_HEADER + 8 + 8;
    memcpy(&N, mb + CKPT_HEADER, 4);
    memcpy(&nu, mb + CKPT_HEADER + 4, 4);
    if (N < 1 || N > 65536 || nu > 1u << 20)
        return 0;
    return CKPT_HEADER + 8 + 8 * (size_t)nu + 16 * (size_t)N + 8;
}

/* An FSDP shard holds piece r of every unit (unshard). */
typedef struct fsdp_units {
    int nu;
    const size_t *ulen;
} fsdp_units;

static int place_fsdp(const float *loc, size_t S, uint32_t r, uint32_t N, float *full, size_t n,
                      const void *how, char *err)
{
    const fsdp_units *u = how;
    (void)err;
    unshard(loc, S, (int)r, (int)N, u->nu, u->ulen, full, n);
    return 0;
}

static int load_sharded(train_session *s, const char *path, const ckpt_header *h, size_t fsize,
                        char *err)
{
    unsigned char *mb = NULL;
    size_t *ulen = NULL;
    int rc = -1;
    mb = read_manifest(path, fsize, fsdp_manifest_size, err);
    if (!mb)
        return -1;
    cursor c = {mb, CKPT_HEADER};
    uint32_t N = 0, nu = 0;
    get(&c, &N, 4);
    get(&c, &nu, 4);
    if (mismatch(path, h, s, err))
        goto out;
    int L = s->opt.cfg.layers;
    size_t np_, act_;
    ulen = calloc((size_t)L + 2, sizeof *ulen);
    if (!ulen || train_model_sizes(&s->opt.cfg, 1, 1, &np_, &act_, ulen) != 0) {
        train_errf(err, "checkpoint %s: out of memory", path);
        goto out;
    }
    int same = nu == (uint32_t)L + 2;
    for (uint32_t u = 0; same && u < nu; u++) {
        uint64_t l;
        get(&c, &l, 8);
        same = l == ulen[u];
    }
    if (!same) {
        train_errf(err, "checkpoint %s: its %u units do not cut this model's %d (another "
                   "model)", path, nu, L + 2);
        goto out;
    }
    size_t S = 0;
    for (int u = 0; u < L + 2; u++)
        S += (ulen[u] + N - 1) / N;
    fsdp_units units = {L + 2, ulen};
    rc = load_shards(s, path, h, &c, N, S, place_fsdp, &units, err);
out:
    free(mb);
    free(ulen);
    return rc;
}

/* ---- tensor-parallel checkpoints ---------------------------------------------------- */

static size_t tp_manifest_size(const unsigned char *mb, size_t fsize)
{
    uint32_t T;
    if (fsize < CKPT_HEADER + 16)
        return CKPT_HEADER + 16 + 8;
    memcpy(&T, mb + CKPT_HEADER, 4);
    if (T < 1 || T > 65536)
        return 0;
    return CKPT_HEADER + 16 + 16 * (size_t)T + 8;
}

/* A TP shard holds rank r's slice of each of params, m and v (train_tp_unshard); how is the
 * model's config. */
static int place_tp(const float *loc, size_t S, uint32_t r, uint32_t N, float *full, size_t n,
                    const void *how, char *err)
{
    for (int k = 0; k < 3; k++)
        if (train_tp_unshard(how, (int)N, (int)r, loc + (size_t)k * S, full + (size_t)k * n,
                             err) != 0)
            return -1;
    return 0;
}

static int load_tp(train_session *s, const char *path, const ckpt_header *h, size_t fsize,
                   char *err)
{
    unsigned char *mb = read_manifest(path, fsize, tp_manifest_size, err);
    int rc = -1;
    if (!mb)
        return -1;
    cursor c = {mb, CKPT_HEADER};
    uint32_t T = 0, D = 0;
    uint64_t S = 0;
    get(&c, &T, 4);
    get(&c, &D, 4);
    get(&c, &S, 8);
    if (mismatch(path, h, s, err))
        goto out;
    size_t ln = 0, act = 0;
    char why[TRAIN_ERRLEN];
    if (train_tp_config_check(&s->opt.cfg, (int)T, TRAIN_DEVICE_CPU, why) != 0 ||
        train_model_sizes_tp(&s->opt.cfg, 1, 1, (int)T, 0, &ln, &act, NULL) != 0 || ln != S) {
        train_errf(err, "checkpoint %s: its %u x %u grid's slices (%llu floats) are not this "
                   "model's split %u ways", path, T, D, (unsigned long long)S, T);
        goto out;
    }
    rc = load_shards(s, path, h, &c, T, (size_t)S, place_tp, &s->opt.cfg, err);
out:
    free(mb);
    return rc;
}

static int tp_manifest_write(train_session *s, const char *path, int T, int D, size_t S,
                             const uint64_t *all, char *err)
{
    size_t total = CKPT_HEADER + 16 + 16 * (size_t)T;
    cursor c;
    unsigned char *buf = manifest_start(s, path, CKPT_VERSION_TP, 2, total, &c, err);
    if (!buf)
        return -1;
    uint32_t t = (uint32_t)T, d = (uint32_t)D;
    uint64_t s64 = S;
    put(&c, &t, 4);
    put(&c, &d, 4);
    put(&c, &s64, 8);
    for (int r = 0; r < T; r++) {
        put(&c, &all[3 * r], 8);
        put(&c, &all[3 * r + 1], 8);
    }
    return manifest_finish(path, buf, total, &c, err);
}

int train_tp_save(train_session *s, train_backend *world, train_backend *tp, const float *p,
                  const float *am, const float *av, const char *path, char *err)
{
    int T = tp->nranks, D = world->nranks / T, dp = world->rank / T;
    size_t S = s->model->nparams;
    uint64_t mine[3] = {0, 0, 0}; /* bytes, hash, failed */
    uint64_t *all = calloc((size_t)T * 3, sizeof *all);
    float *own = NULL;
    char why[TRAIN_ERRLEN] = "";
    int rc = 0;
    if (!all) { /* the peers learn of it from the failed collective (our abort, or timeout) */
        train_errf(err, "checkpoint %s: out of memory", path);
        return -1;
    }
    if (dp == 0) { /* DP rank 0 of each TP group: the others hold the same */
        if (!p) {
            own = malloc(3 * S * sizeof(float));
            if (own) {
                train_copy_params_to_host(s->model, own);
                train_copy_opt_to_host(s->model, own + S, own + 2 * S);
                p = own, am = own + S, av = own + 2 * S;
            }
        }
        if (!p) {
            train_errf(why, "checkpoint %s: out of memory", path);
            mine[2] = 1;
        } else if (train_shard_write(s, path, tp->rank, T, p, am, av, S, &mine[0], &mine[1],
                                     why) != 0) {
            mine[2] = 1;
        }
    }
    free(own);
    train_req r;
    if (tp->all_gather(tp, mine, all, sizeof mine, &r) != 0 ||
        tp->wait(tp, r) != 0) {
        train_errf(err, "checkpoint %s: gathering the shard checksums: %s", path, tp->err);
        free(all);
        return -1;
    }
    int32_t ok[2] = {1, -1}; /* manifest written; the rank that failed */
    if (world->rank == 0) {
        for (int q = 0; q < T && ok[0]; q++)
            if (all[3 * q + 2])
                ok[0] = 0, ok[1] = q;
        if (ok[0] && tp_manifest_write(s, path, T, D, S, all, why) != 0)
            ok[0] = 0, ok[1] = 0;
    }
    /* everyone learns whether the checkpoint exists */
    if (world->broadcast(world, ok, sizeof ok, 0, &r) != 0 || world->wait(world, r) != 0) {
        train_errf(err, "checkpoint %s: %s", path, world->err);
        rc = -1;
    } else if (!ok[0]) {
        if (ok[1] == world->rank || (world->rank == 0 && why[0]))
            train_errf(err, "%s", why);
        else
            train_errf(err, "checkpoint %s: rank %d could not write its part", path, ok[1]);
        rc = -1;
    }
    free(all);
    return rc;
}

void train_session_set_batch_mult(train_session *s, int rows_mult) { s->batch_mult = rows_mult; }

int train_session_load(train_session *s, const char *path, char *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        train_errf(err, "checkpoint %s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    fstat(fileno(f), &st);
    size_t fsize = (size_t)st.st_size;
    unsigned char hb[CKPT_HEADER];
    ckpt_header h;
    float *buf = NULL;
    size_t got = fread(hb, 1, sizeof hb, f);
    if (got < 8 || memcmp(hb, CKPT_MAGIC "", 8) != 0) {
        train_errf(err, "checkpoint %s: not a coll-train checkpoint (bad magic)", path);
        goto fail;
    }
    if (got < 16) {
        train_errf(err, "checkpoint %s: truncated (%zu bytes)", path, fsize);
        goto fail;
    }
    cursor c = {hb, 8};
    get(&c, &h.version, 4);
    get(&c, &h.header_bytes, 4);
    if (h.version < CKPT_VERSION || h.version > CKPT_VERSION_TP ||
        h.header_bytes != CKPT_HEADER) {
        train_errf(err, "checkpoint %s: unsupported version %u (this build reads versions %d "
                   "to %d)", path, h.version, CKPT_VERSION, CKPT_VERSION_TP);
        goto fail;
    }
    if (got < CKPT_HEADER) {
        train_errf(err, "checkpoint %s: truncated (%zu bytes, header alone is %d)", path,
                   fsize, CKPT_HEADER);
        goto fail;
    }
    if (h.version != CKPT_VERSION) { /* a manifest: shards beside it */
        c.off = 8;
        FIELDS(get, &c, &h);
        fclose(f);
        return h.version == CKPT_VERSION_TP ? load_tp(s, path, &h, fsize, err)
                                            : load_sharded(s, path, &h, fsize, err);
    }
    c.off = 8;
    FIELDS(get, &c, &h);
    size_t n = full_count(s);
    if (h.nparams == n) { /* check the size before the config: truncation is the problem */
        size_t want = CKPT_HEADER + n * 12 + 8;
        if (fsize != want) {
            train_errf(err, "checkpoint %s: %s (%zu bytes, expected %zu)", path,
                       fsize < want ? "truncated" : "corrupt: trailing bytes", fsize, want);
            goto fail;
        }
    }
    if (mismatch(path, &h, s, err))
        goto fail;
    buf = malloc(n * 12);
    uint64_t stored = 0;
    if (!buf || fread(buf, 1, n * 12, f) != n * 12 || fread(&stored, 8, 1, f) != 1) {
        train_errf(err, "checkpoint %s: read error", path);
        goto fail;
    }
    uint64_t hash = train_fnv1a(TRAIN_FNV_INIT, hb, sizeof hb);
    hash = train_fnv1a(hash, buf, n * 12);
    if (hash != stored) {
        train_errf(err, "checkpoint %s: corrupt (checksum mismatch)", path);
        goto fail;
    }
    fclose(f);
    if (install(s, buf, n, err) != 0) {
        free(buf);
        return -1;
    }
    free(buf);
    set_position(s, &h);
    return 0;
fail:
    free(buf);
    fclose(f);
    return -1;
}
