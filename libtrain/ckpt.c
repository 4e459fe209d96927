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
 * Writes go through train_atomic (temp file, fsync, rename, fsync dir). Loads validate
 * everything (magic, version, size, config, data identity, hash) before changing the
 * session, so a bad checkpoint leaves the run untouched.
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CKPT_MAGIC "COLLTRN"
#define CKPT_VERSION 1
#define CKPT_HEADER 148

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
    h->batch = (uint32_t)o->batch;
    h->seq = (uint32_t)o->seq;
    h->seed = o->seed;
    h->step = (uint64_t)s->step;
    h->nparams = s->model->nparams;
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
    if (s->model->tp > 1) { /* a slice is not a model: TP checkpoints are not written yet */
        train_errf(err, "checkpoint %s: tensor-parallel checkpoints are not supported yet",
                   path);
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
    if (h->batch != (uint32_t)o->batch || h->seq != (uint32_t)o->seq || h->seed != o->seed) {
        train_errf(err,
                   "checkpoint %s is from another config: batch %u seq %u seed %llu, this "
                   "run has batch %d seq %d seed %llu",
                   path, h->batch, h->seq, (unsigned long long)h->seed, o->batch, o->seq,
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
    if (h->nparams != s->model->nparams) {
        train_errf(err, "checkpoint %s holds %llu parameters, the model has %zu", path,
                   (unsigned long long)h->nparams, s->model->nparams);
        return 1;
    }
    return 0;
}

int train_session_load(train_session *s, const char *path, char *err)
{
    if (s->model->tp > 1) {
        train_errf(err, "checkpoint %s: tensor-parallel sessions cannot resume yet", path);
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
    if (h.version != CKPT_VERSION || h.header_bytes != CKPT_HEADER) {
        train_errf(err, "checkpoint %s: unsupported version %u (this build reads version %d)",
                   path, h.version, CKPT_VERSION);
        goto fail;
    }
    if (got < CKPT_HEADER) {
        train_errf(err, "checkpoint %s: truncated (%zu bytes, header alone is %d)", path,
                   fsize, CKPT_HEADER);
        goto fail;
    }
    c.off = 8;
    FIELDS(get, &c, &h);
    size_t n = s->model->nparams;
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
    train_copy_params_from_host(s->model, buf);
    train_copy_opt_from_host(s->model, buf + n, buf + 2 * n);
    free(buf);
    s->step = (long)h.step;
    s->sample_rng = h.sample_rng;
    s->pos.seed = h.seed;
    s->pos.epoch = h.epoch;
    s->pos.index = h.index;
    return 0;
fail:
    free(buf);
    fclose(f);
    return -1;
}
