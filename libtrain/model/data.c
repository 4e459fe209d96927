/*
 * data.c — training data: the byte-level tokenizer, the token-file format, the embedded
 * corpus, and the deterministic batch order.
 *
 * A data file is either a token file (magic "COLLTOK1", format in train.h) holding
 * pre-tokenised u16 ids, or anything else, read as raw bytes = token ids 0..255. The last
 * 10% of the tokens are the validation split. Training windows of seq+1 tokens start at
 * a per-epoch random offset and are visited in a per-epoch random permutation, both
 * derived from (seed, epoch) alone, so the data position saved in a checkpoint is just
 * (epoch, index) and a resumed run sees exactly the batches it would have seen.
 */
#include "model/model.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

extern const unsigned char train_corpus_text[];
extern const size_t train_corpus_len;

const char *train_corpus(size_t *len) {
  if (len) *len = train_corpus_len;
  return (const char *)train_corpus_text;
}

struct train_data {
  char name[256];
  uint16_t *tok;
  size_t n, ntrain;
  int vocab;
  uint64_t hash;
  /* cache of the current epoch's window order */
  int cache_valid;
  uint64_t cache_seed, cache_epoch;
  int cache_T;
  size_t cache_offset, cache_nwin;
  uint32_t *perm;
};

size_t train_data_tokens(const train_data *d) { return d->n; }
uint64_t train_data_hash(const train_data *d) { return d->hash; }
const char *train_data_name(const train_data *d) { return d->name; }

void train_data_free(train_data *d) {
  if (!d) return;
  free(d->tok);
  free(d->perm);
  free(d);
}

static unsigned char *read_file(const char *path, size_t *len, char *err) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    train_errf(err, "data file %s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 16, n = 0;
  unsigned char *buf = malloc(cap);
  for (;;) {
    if (n == cap) {
      cap *= 2;
      buf = realloc(buf, cap);
    }
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (r == 0) break;
  }
  if (ferror(f)) {
    train_errf(err, "data file %s: read error: %s", path, strerror(errno));
    free(buf);
    fclose(f);
    return NULL;
  }
  fclose(f);
  *len = n;
  return buf;
}

static uint64_t rd_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static uint32_t rd_u32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

train_data *train_data_open(const char *path, int vocab, int seq, char *err) {
  const char *name = path ? path : "(embedded corpus)";
  size_t len = 0;
  unsigned char *buf;
  if (path) {
    buf = read_file(path, &len, err);
    if (!buf) return NULL;
  } else {
    const char *c = train_corpus(&len);
    buf = malloc(len ? len : 1);
    memcpy(buf, c, len);
  }
  train_data *d = calloc(1, sizeof *d);
  snprintf(d->name, sizeof d->name, "%s", name);
  d->vocab = vocab;
  if (len == 0) {
    train_errf(err, "data file %s: empty", name);
    goto fail;
  }
  if (len >= 8 && memcmp(buf, TRAIN_TOKFILE_MAGIC, 8) == 0) {
    if (len < TRAIN_TOKFILE_HEADER) {
      train_errf(err, "data file %s: corrupt token file: header truncated (%zu bytes)", name, len);
      goto fail;
    }
    uint32_t version = rd_u32(buf + 8), fvocab = rd_u32(buf + 12);
    uint64_t n = rd_u64(buf + 16);
    if (version != 1) {
      train_errf(err, "data file %s: unsupported token file version %u (expected 1)", name,
                 version);
      goto fail;
    }
    if (n > (len - TRAIN_TOKFILE_HEADER) / 2 || TRAIN_TOKFILE_HEADER + 2 * n != len) {
      train_errf(err,
                 "data file %s: corrupt token file: header says %llu tokens but the "
                 "file holds %zu bytes of tokens",
                 name, (unsigned long long)n, len - TRAIN_TOKFILE_HEADER);
      goto fail;
    }
    if (fvocab == 0 || (int64_t)fvocab > vocab) {
      train_errf(err, "data file %s: token file vocab %u does not fit the model vocab %d", name,
                 fvocab, vocab);
      goto fail;
    }
    d->n = n;
    d->tok = malloc((n ? n : 1) * sizeof *d->tok);
    for (size_t i = 0; i < n; i++) {
      uint16_t id = (uint16_t)(buf[TRAIN_TOKFILE_HEADER + 2 * i] |
                               buf[TRAIN_TOKFILE_HEADER + 2 * i + 1] << 8);
      if (id >= fvocab) {
        train_errf(err, "data file %s: corrupt token file: token %zu has id %u >= vocab %u", name,
                   i, id, fvocab);
        goto fail;
      }
      d->tok[i] = id;
    }
  } else {
    if (vocab < 256) {
      train_errf(err, "data file %s: raw text needs the byte vocab (256), model has %d", name,
                 vocab);
      goto fail;
    }
    d->n = len;
    d->tok = malloc(len * sizeof *d->tok);
    for (size_t i = 0; i < len; i++) d->tok[i] = buf[i];
  }
  free(buf);
  buf = NULL;
  size_t nval = d->n / 10;
  d->ntrain = d->n - nval;
  if (seq < 1 || d->ntrain < (size_t)seq + 1 || nval < (size_t)seq + 1) {
    train_errf(err,
               "data file %s: too small: %zu tokens; --seq %d needs at least %zu (%d+1 "
               "per window in both the training and the 10%% validation split)",
               name, d->n, seq, 10 * ((size_t)seq + 1), seq);
    goto fail;
  }
  d->hash = train_fnv1a(TRAIN_FNV_INIT, d->tok, d->n * sizeof *d->tok);
  return d;
fail:
  free(buf);
  train_data_free(d);
  return NULL;
}

int train_tokfile_write(const char *path, const int *ids, size_t n, int vocab, char *err) {
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= vocab || ids[i] > 65535) {
      train_errf(err, "%s: token %zu has id %d outside vocab %d", path, i, ids[i], vocab);
      return -1;
    }
  train_atomic a;
  if (train_atomic_open(&a, path, err) != 0) return -1;
  unsigned char h[TRAIN_TOKFILE_HEADER];
  memcpy(h, TRAIN_TOKFILE_MAGIC, 8);
  for (int i = 0; i < 4; i++) {
    h[8 + i] = (unsigned char)(1u >> (8 * i));
    h[12 + i] = (unsigned char)((uint32_t)vocab >> (8 * i));
  }
  for (int i = 0; i < 8; i++) h[16 + i] = (unsigned char)((uint64_t)n >> (8 * i));
  fwrite(h, 1, sizeof h, a.f);
  for (size_t i = 0; i < n; i++) {
    unsigned char b[2] = {(unsigned char)(ids[i] & 0xff), (unsigned char)(ids[i] >> 8)};
    fwrite(b, 1, 2, a.f);
  }
  return train_atomic_commit(&a, err);
}

/* ---- batch order ------------------------------------------------------------------ */

static void prepare_epoch(train_data *d, uint64_t seed, uint64_t epoch, int T) {
  if (d->cache_valid && d->cache_seed == seed && d->cache_epoch == epoch && d->cache_T == T) return;
  uint64_t rng = seed ^ (0x9e3779b97f4a7c15ULL * (epoch + 1));
  train_splitmix64(&rng);
  size_t span = d->ntrain - (size_t)T; /* >= 1: offsets 0..min(T,span)-1 keep a window */
  size_t nopt = span < (size_t)T ? span : (size_t)T;
  d->cache_offset = (size_t)(train_splitmix64(&rng) % nopt);
  d->cache_nwin = (d->ntrain - 1 - d->cache_offset) / (size_t)T;
  free(d->perm);
  d->perm = malloc(d->cache_nwin * sizeof *d->perm);
  for (size_t i = 0; i < d->cache_nwin; i++) d->perm[i] = (uint32_t)i;
  for (size_t i = d->cache_nwin - 1; i > 0; i--) { /* Fisher-Yates */
    size_t j = (size_t)(train_splitmix64(&rng) % (i + 1));
    uint32_t t = d->perm[i];
    d->perm[i] = d->perm[j];
    d->perm[j] = t;
  }
  d->cache_seed = seed;
  d->cache_epoch = epoch;
  d->cache_T = T;
  d->cache_valid = 1;
}

void train_data_next_rows(train_data *d, train_loader_state *st, int B, int T, int row0, int nrows,
                          int *inputs, int *targets) {
  for (int b = 0; b < B; b++) {
    prepare_epoch(d, st->seed, st->epoch, T);
    if (b >= row0 && b < row0 + nrows) {
      size_t start = d->cache_offset + (size_t)d->perm[st->index] * (size_t)T;
      int r = b - row0;
      for (int t = 0; t < T; t++) {
        inputs[r * T + t] = d->tok[start + t];
        targets[r * T + t] = d->tok[start + t + 1];
      }
    }
    if (++st->index >= d->cache_nwin) {
      st->epoch++;
      st->index = 0;
    }
  }
}

void train_data_next_batch(train_data *d, train_loader_state *st, int B, int T, int *inputs,
                           int *targets) {
  train_data_next_rows(d, st, B, T, 0, B, inputs, targets);
}

int train_data_val_batch(const train_data *d, int k, int B, int T, int *inputs, int *targets) {
  size_t nval = d->n - d->ntrain;
  size_t nwin = (nval - 1) / (size_t)T;
  size_t nbatch = nwin / (size_t)B ? nwin / (size_t)B : 1;
  if (k < 0 || (size_t)k >= nbatch) return 0;
  for (int b = 0; b < B; b++) {
    size_t w = ((size_t)k * B + b) % nwin;
    size_t start = d->ntrain + w * (size_t)T;
    for (int t = 0; t < T; t++) {
      inputs[b * T + t] = d->tok[start + t];
      targets[b * T + t] = d->tok[start + t + 1];
    }
  }
  return 1;
}
