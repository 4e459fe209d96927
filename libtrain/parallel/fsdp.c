/*
 * fsdp.c — ZeRO-1/2/3 over a backend (contract in fsdp.h): units and shards, the forward
 * and backward hooks that gather blocks (ZeRO-3, with prefetch) and reduce-scatter each
 * unit's gradient as it becomes final, the sharded clip + AdamW, and the gathers back.
 *
 * Like ddp.c it never looks inside a layer: it sees the flat arrays, the model's stage
 * hooks and block_params (where ZeRO-3 puts a gathered block). It must never print or
 * exit, never touch a gradient range backward may still write, and never reuse a block
 * buffer the model may still read.
 *
 * Padding. A unit of len floats is padded to plen = ceil(len/N)*N, shard = plen/N. The
 * reduce-scatter sends grads[start .. start+plen): the pad tail overlaps the next unit's
 * first floats (or the zero tail of our own gradient array), so the reduced values that
 * land in the last rank's pad are meaningless and are never used: norms and AdamW run on
 * the real elements only, and pad elements of the master parameters stay 0. For the same
 * reason a unit's gradient is released only after the reduce-scatter of the unit below
 * it (launched next, reading our head as its pad) has finished.
 */
#include "parallel/checkpoint.h"
#include "parallel/fsdp.h"
#include "parallel/cp.h"
#include "parallel/planner.h"
#include "parallel/strategy.h"
#include "parallel/tp.h"
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct fsdp_unit {
  size_t start, len;    /* range of the flat arrays, in floats */
  size_t plen, shard;   /* padded length (multiple of N) and plen / N */
  size_t soff;          /* where this unit's shard starts in the shard arrays */
  size_t own_lo, own_n; /* this rank's real elements: flat [own_lo, own_lo + own_n) */
  int block;            /* -1 embeddings, 0..L-1 a block, L the final LayerNorm */
} fsdp_unit;

typedef struct rs_state {
  int unit;
  train_req req;
  int done;
  double t0, t1;
} rs_state;

struct train_fsdp {
  train_session *s;
  train_backend *b;
  train_fsdp_options o;
  int N, rank, L, nu;
  fsdp_unit *u;
  size_t S; /* floats per shard array */
  float *pshard, *gshard, *mshard, *vshard, *gtmp;
  float *grads; /* our gradient array (mmap, nparams + N floats) */
  size_t grads_bytes;
  float *model_grads; /* the model's own, put back at free */
  float *stage;       /* staging for gathers of whole units (max plen) */
  size_t stagecap;    /* its floats */
  float *blockbuf[2]; /* ZeRO-3: block l lives in blockbuf[l % 2] */
  size_t blockcap;
  float **block_params; /* given to the model */
  int bufblock[2];      /* which block each buffer holds or is receiving, -1 none */
  train_req bufreq[2];
  int bufready[2];
  double buft0[2];
  rs_state *rs; /* reduce-scatters of this backward, in launch order */
  int nrs, rs_polled, micro;
  int failed;
  char hook_err[TRAIN_ERRLEN];
  double wait_s; /* blocked on the backend this step */
  uint64_t sent; /* bytes sent this step by the ring formulas */
  double t_stage;
  train_trace trace;
  int *inputs, *targets;
  int *cp_inputs, *cp_targets; /* context parallelism: this rank's chunks (B, T/cp) */
  int materialized;
  coll_trace_event *tev; /* libcoll's records of one step (measured bytes sent) */
  size_t tcap;
};

train_fsdp_options train_fsdp_options_default(void) {
  train_fsdp_options o = {.zero = 3, .accum = 1, .trace = 0};
  return o;
}

int train_fsdp_zero(const train_fsdp *f) { return f->o.zero; }
int train_fsdp_num_units(const train_fsdp *f) { return f->nu; }

static const char *unit_name(const train_fsdp *f, int u, char *buf, size_t n) {
  int bl = f->u[u].block;
  if (bl < 0)
    snprintf(buf, n, "embeddings");
  else if (bl == f->L)
    snprintf(buf, n, "final LayerNorm");
  else
    snprintf(buf, n, "block %d", bl);
  return buf;
}

void train_fsdp_describe_unit(const train_fsdp *f, int u, char *out, size_t n) {
  char nm[32];
  const fsdp_unit *x = &f->u[u];
  snprintf(out, n, "unit %d: %s, %.2f MiB, %zu -> %d x %zu floats (%zu padding)", u,
           unit_name(f, u, nm, sizeof nm), x->len * 4.0 / 1048576.0, x->len, f->N, x->shard,
           x->plen - x->len);
}

/* Returns the pages wholly inside [p, p + n floats) to the system (they read as zero
 * afterwards) and zeroes the partial pages at both ends. */
static void release_range(float *p, size_t n) {
  uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)p, e = (uintptr_t)(p + n);
  uintptr_t a2 = (a + pg - 1) & ~(pg - 1), e2 = e & ~(pg - 1);
  if (e2 > a2) {
    memset(p, 0, a2 - a);
    madvise((void *)a2, e2 - a2, MADV_DONTNEED);
    memset((void *)e2, 0, e - e2);
  } else {
    memset(p, 0, n * sizeof(float));
  }
}

/* Zeroed arrays from the device's allocator: on the CPU large ones are fresh mmap pages,
 * resident only once touched, so a shard array costs memory when it is first written. */
static const train_ops *zops;
static void *zalloc(size_t bytes) { return zops->alloc(bytes ? bytes : 64); }
static void zfree(void *p) {
  if (p) zops->release(p);
}

static void build_units(train_fsdp *f) {
  const train_model *m = f->s->model;
  int L = f->L, N = f->N;
  f->nu = L + 2;
  for (int u = 0; u < f->nu; u++) {
    fsdp_unit *x = &f->u[u];
    x->block = u - 1;
    if (u == 0) {
      x->start = 0;
      x->len = m->tensors[2].offset;
    } else if (u <= L) {
      x->start = m->tensors[2 + (u - 1) * 12].offset;
      x->len = (u < L ? m->tensors[2 + u * 12].offset : m->tensors[m->ntensors - 2].offset) -
               x->start;
    } else {
      x->start = m->tensors[m->ntensors - 2].offset;
      x->len = m->nparams - x->start;
    }
    x->plen = (x->len + (size_t)N - 1) / (size_t)N * (size_t)N;
    x->shard = x->plen / (size_t)N;
    x->soff = f->S;
    f->S += x->shard;
    size_t lo = (size_t)f->rank * x->shard;
    size_t hi = lo + x->shard < x->len ? lo + x->shard : x->len;
    x->own_lo = x->start + (lo < x->len ? lo : x->len);
    x->own_n = hi > lo ? hi - lo : 0;
  }
}

static void note_fail(train_fsdp *f, const char *what) {
  if (!f->failed) train_errf(f->hook_err, "%s: %s", what, f->b->err);
  f->failed = 1;
}

/* Blocking wait that counts as exposed communication. */
static int wait_req(train_fsdp *f, train_req r) {
  double t = train_now();
  int rc = f->b->wait(f->b, r);
  f->wait_s += train_now() - t;
  return rc;
}

/* ---- ZeRO-3 block gathers ---------------------------------------------------------- */

static void gather_start(train_fsdp *f, int bl) {
  int k = bl & 1;
  if (f->failed || f->bufblock[k] == bl) return;
  const fsdp_unit *x = &f->u[bl + 1];
  f->bufblock[k] = bl;
  f->bufready[k] = 0;
  f->buft0[k] = train_now();
  if (f->b->all_gather(f->b, f->pshard + x->soff, f->blockbuf[k], x->shard * sizeof(float),
                       &f->bufreq[k]) != 0) {
    note_fail(f, "all-gather of a block");
    f->bufreq[k] = TRAIN_REQ_DONE;
  }
  f->sent += (uint64_t)(f->N - 1) * x->shard * sizeof(float);
}

static void gather_wait(train_fsdp *f, int bl) {
  int k = bl & 1;
  if (f->bufblock[k] != bl) gather_start(f, bl);
  if (!f->bufready[k]) {
    if (!f->failed && wait_req(f, f->bufreq[k]) != 0) note_fail(f, "all-gather of a block");
    f->bufready[k] = 1;
    if (f->o.trace) {
      char nm[40];
      snprintf(nm, sizeof nm, "allgather block %d", bl);
      train_trace_add(&f->trace, f->rank, TRAIN_TRACE_COMM, nm, f->buft0[k], train_now());
    }
  }
  f->block_params[bl] = f->blockbuf[k];
}

static void block_free(train_fsdp *f, int bl) {
  int k = bl & 1;
  f->block_params[bl] = NULL;
  if (f->bufblock[k] == bl && f->bufready[k]) f->bufblock[k] = -1;
}

/* ---- reduce-scatter of unit gradients ---------------------------------------------- */

static void rs_finished(train_fsdp *f, int i) {
  rs_state *r = &f->rs[i];
  r->done = 1;
  r->t1 = train_now();
  const fsdp_unit *x = &f->u[r->unit];
  if (f->micro > 0) { /* accumulate this micro-step's mean into the shard */
    float *g = f->gshard + x->soff, *t = f->gtmp + x->soff;
    for (size_t j = 0; j < x->shard; j++) g[j] += t[j];
  }
  /* ZeRO-2/3: this unit's full gradient is no longer needed. (The reduce-scatter of the
   * unit below may still read our first floats as its padding: what lands in padding is
   * never used, so zeroes there are as good as gradients.) */
  if (f->o.zero >= 2) release_range(f->grads + x->start, x->len);
  if (f->o.trace) {
    char nm[40], un[24];
    snprintf(nm, sizeof nm, "reducescatter %.24s", unit_name(f, r->unit, un, sizeof un));
    train_trace_add(&f->trace, f->rank, TRAIN_TRACE_COMM, nm, r->t0, r->t1);
  }
}

static void rs_poll(train_fsdp *f) {
  while (f->rs_polled < f->nrs) {
    rs_state *r = &f->rs[f->rs_polled];
    int t = f->b->test(f->b, r->req);
    if (t == 0) return;
    if (t < 0) note_fail(f, "reduce-scatter of gradients");
    rs_finished(f, f->rs_polled++);
  }
}

static int rs_wait_all(train_fsdp *f) {
  while (f->rs_polled < f->nrs) {
    rs_state *r = &f->rs[f->rs_polled];
    if (!f->failed && wait_req(f, r->req) != 0) note_fail(f, "reduce-scatter of gradients");
    rs_finished(f, f->rs_polled++);
  }
  return f->failed ? -1 : 0;
}

static void rs_launch(train_fsdp *f, int u) {
  const fsdp_unit *x = &f->u[u];
  rs_state *r = &f->rs[f->nrs++];
  r->unit = u;
  r->done = 0;
  r->t0 = train_now();
  r->req = TRAIN_REQ_DONE;
  float *recv = (f->micro > 0 ? f->gtmp : f->gshard) + x->soff;
  if (!f->failed && f->b->reduce_scatter(f->b, f->grads + x->start, recv, x->shard,
                                         TRAIN_REDUCE_AVG, &r->req) != 0)
    note_fail(f, "reduce-scatter of gradients");
  f->sent += (uint64_t)(f->N - 1) * x->shard * sizeof(float);
  /* ZeRO-2/3: at most two units' full gradients at once — the one just launched and the
   * one backward computes next. The previous reduce-scatter had the whole of this unit's
   * backward to finish; if it has not, backward waits for it here (exposed). */
  if (f->o.zero >= 2)
    while (f->rs_polled < f->nrs - 1) {
      rs_state *o = &f->rs[f->rs_polled];
      if (!f->failed && wait_req(f, o->req) != 0) note_fail(f, "reduce-scatter of gradients");
      rs_finished(f, f->rs_polled++);
    }
}

/* ---- hooks ------------------------------------------------------------------------- */

static void stage_slice(train_fsdp *f, const char *dir, int stage) {
  double now = train_now();
  if (f->o.trace) {
    char nm[40];
    if (stage == f->L)
      snprintf(nm, sizeof nm, "%s head+lnf", dir);
    else if (stage < 0)
      snprintf(nm, sizeof nm, "%s embeddings", dir);
    else
      snprintf(nm, sizeof nm, "%s block %d", dir, stage);
    train_trace_add(&f->trace, f->rank, TRAIN_TRACE_COMPUTE, nm, f->t_stage, now);
  }
  f->t_stage = now;
}

static void fwd_hook(void *arg, int stage) {
  train_fsdp *f = arg;
  stage_slice(f, "fwd", stage);
  if (f->o.zero < 3 || f->materialized) return;
  int L = f->L;
  if (stage == -1) {
    gather_wait(f, 0);
    if (L > 1) gather_start(f, 1);
  } else if (stage >= 0 && stage < L - 1) {
    block_free(f, stage);
    gather_wait(f, stage + 1);
    if (stage + 2 < L) gather_start(f, stage + 2);
  } else if (stage == L - 1 && L >= 2) {
    /* the top block stays for backward; prefetch the one below it for backward */
    gather_start(f, L - 2);
  }
  f->t_stage = train_now();
}

static void bwd_hook(void *arg, size_t final_from, int layer) {
  train_fsdp *f = arg;
  (void)final_from;
  stage_slice(f, "bwd", layer);
  rs_poll(f);
  if (layer == f->L) {
    rs_launch(f, f->nu - 1); /* the final LayerNorm; wte waits for the embeddings */
  } else if (layer >= 0) {
    rs_launch(f, layer + 1);
    if (f->o.zero == 3 && !f->materialized) {
      block_free(f, layer);
      if (layer >= 1) gather_wait(f, layer - 1);
      if (layer >= 2) gather_start(f, layer - 2);
    }
  } else {
    rs_launch(f, 0); /* wte now holds the LM head's and the embedding's share */
  }
  f->t_stage = train_now();
}

/* ---- gathers of whole units -------------------------------------------------------- */

/* ZeRO-3 gathers only the root units into the staging buffer at every step: after a
 * gather of whole blocks its pages go back to the system. (ZeRO-1/2 use all of it every
 * step.) */
static void release_stage(train_fsdp *f) {
  if (f->o.zero == 3) release_range(f->stage, f->stagecap);
}

/* All-gathers unit u into f->stage (blocking). */
static int gather_unit(train_fsdp *f, int u, const float *src_shards, char *err) {
  const fsdp_unit *x = &f->u[u];
  train_req r;
  if (f->b->all_gather(f->b, src_shards + x->soff, f->stage, x->shard * sizeof(float), &r) != 0 ||
      wait_req(f, r) != 0) {
    train_errf(err, "all-gather of parameters: %s", f->b->err);
    return -1;
  }
  return 0;
}

/* After the step: the units the stage keeps whole go back into the model. */
static int gather_params_after_step(train_fsdp *f, char *err) {
  train_model *m = f->s->model;
  for (int u = 0; u < f->nu; u++) {
    const fsdp_unit *x = &f->u[u];
    if (f->o.zero == 3 && x->block >= 0 && x->block < f->L) continue;
    if (gather_unit(f, u, f->pshard, err) != 0) return -1;
    f->sent += (uint64_t)(f->N - 1) * x->shard * sizeof(float);
    memcpy(m->params + x->start, f->stage, x->len * sizeof(float));
  }
  return 0;
}

int train_fsdp_gather(train_fsdp *f, float *dst, float *m_dst, float *v_dst, uint64_t *hash,
                      char *err) {
  uint64_t h = TRAIN_FNV_INIT;
  for (int u = 0; u < f->nu; u++) {
    const fsdp_unit *x = &f->u[u];
    if (gather_unit(f, u, f->pshard, err) != 0) return -1;
    h = train_fnv1a(h, f->stage, x->len * sizeof(float));
    if (dst) memcpy(dst + x->start, f->stage, x->len * sizeof(float));
    if (m_dst) {
      if (gather_unit(f, u, f->mshard, err) != 0) return -1;
      memcpy(m_dst + x->start, f->stage, x->len * sizeof(float));
    }
    if (v_dst) {
      if (gather_unit(f, u, f->vshard, err) != 0) return -1;
      memcpy(v_dst + x->start, f->stage, x->len * sizeof(float));
    }
  }
  if (hash) *hash = h;
  release_stage(f);
  return 0;
}

int train_fsdp_check_identical(train_fsdp *f, char *err) {
  uint64_t h;
  if (train_fsdp_gather(f, NULL, NULL, NULL, &h, err) != 0) return -1;
  uint64_t *all = calloc((size_t)f->N, sizeof *all);
  train_req r;
  if (!all) {
    train_errf(err, "out of memory checking the weights");
    return -1;
  }
  int rc = 0;
  if (f->b->all_gather(f->b, &h, all, sizeof h, &r) != 0 || f->b->wait(f->b, r) != 0) {
    train_errf(err, "%s", f->b->err);
    rc = -1;
  }
  for (int q = 1; rc == 0 && q < f->N; q++)
    if (all[q] != all[0]) {
      train_errf(err,
                 "ranks gather different weights: rank 0 hash %016llx, rank %d hash "
                 "%016llx (step %ld)",
                 (unsigned long long)all[0], q, (unsigned long long)all[q], f->s->step);
      rc = -1;
    }
  free(all);
  return rc;
}

int train_fsdp_materialize(train_fsdp *f, char *err) {
  if (f->o.zero < 3) return 0;
  if (train_fsdp_gather(f, f->s->model->params, NULL, NULL, NULL, err) != 0) return -1;
  f->materialized = 1;
  return 0;
}

/* Drops what train_fsdp_materialize added (ZeRO-3: the blocks' range of the model). */
static void dematerialize(train_fsdp *f) {
  if (!f->materialized) return;
  const fsdp_unit *a = &f->u[1], *z = &f->u[f->L];
  release_range(f->s->model->params + a->start, z->start + z->len - a->start);
  f->materialized = 0;
}

/* ---- create / free ----------------------------------------------------------------- */

train_fsdp *train_fsdp_create(train_session *s, train_backend *b, const train_fsdp_options *o,
                              char *err) {
  if (o->zero < 1 || o->zero > 3 || o->accum < 1) {
    train_errf(err, "impossible FSDP config: --zero %d must be 1, 2 or 3 and accum %d >= 1",
               o->zero, o->accum);
    return NULL;
  }
  train_model *m = s->model;
  if (m->bf16) { /* its units, shards and gathers are fp32 arrays of the model */
    train_errf(err, "--dtype bf16 with --parallel fsdp is not built yet: use --parallel ddp");
    return NULL;
  }
  if (m->dev != TRAIN_DEVICE_CPU) {
    train_errf(err, "--parallel fsdp runs on the CPU model only: its shards, gathers and "
                    "released pages are host memory (use --parallel ddp on GPUs)");
    return NULL;
  }
  zops = m->ops;
  train_fsdp *f = calloc(1, sizeof *f);
  if (!f) {
    train_errf(err, "out of memory for FSDP");
    return NULL;
  }
  f->s = s;
  f->b = b;
  f->o = *o;
  f->N = b->nranks;
  f->rank = b->rank;
  f->L = m->cfg.layers;
  f->u = calloc((size_t)f->L + 2, sizeof *f->u);
  f->rs = calloc((size_t)f->L + 2, sizeof *f->rs);
  f->block_params = calloc((size_t)f->L, sizeof *f->block_params);
  if (!f->u || !f->rs || !f->block_params) goto oom;
  build_units(f);
  size_t maxp = 0, maxb = 0;
  for (int u = 0; u < f->nu; u++) {
    maxp = f->u[u].plen > maxp ? f->u[u].plen : maxp;
    if (f->u[u].block >= 0 && f->u[u].block < f->L)
      maxb = f->u[u].plen > maxb ? f->u[u].plen : maxb;
  }
  size_t sb = f->S * sizeof(float);
  f->pshard = zalloc(sb);
  f->gshard = zalloc(sb);
  f->mshard = zalloc(sb);
  f->vshard = zalloc(sb);
  f->stage = zalloc(maxp * sizeof(float));
  f->stagecap = maxp;
  f->gtmp = o->accum > 1 ? zalloc(sb) : NULL;
  size_t bt = (size_t)s->opt.batch * s->opt.seq;
  f->inputs = malloc(bt * sizeof(int));
  f->targets = malloc(bt * sizeof(int));
  if (o->cp > 1) {
    f->cp_inputs = malloc(bt / o->cp * sizeof(int));
    f->cp_targets = malloc(bt / o->cp * sizeof(int));
  }
  if (!f->pshard || !f->gshard || !f->mshard || !f->vshard || !f->stage ||
      (o->accum > 1 && !f->gtmp) || !f->inputs || !f->targets ||
      (o->cp > 1 && (!f->cp_inputs || !f->cp_targets)))
    goto oom;
  f->bufblock[0] = f->bufblock[1] = -1;
  if (o->zero == 3) {
    f->blockcap = maxb;
    for (int k = 0; k < 2; k++)
      if (!(f->blockbuf[k] = zalloc(maxb * sizeof(float)))) goto oom;
  }
  /* our gradient array: untouched pages cost nothing, a tail of N floats for the last
   * unit's padding */
  f->grads_bytes = (m->nparams + (size_t)f->N) * sizeof(float);
  f->grads = mmap(NULL, f->grads_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (f->grads == MAP_FAILED) {
    f->grads = NULL;
    goto oom;
  }

  /* rank 0's weights, unit by unit: each rank keeps its shard */
  for (int u = 0; u < f->nu; u++) {
    const fsdp_unit *x = &f->u[u];
    train_req r;
    memcpy(f->stage, m->params + x->start, x->len * sizeof(float));
    if (b->broadcast(b, f->stage, x->len * sizeof(float), 0, &r) != 0 || b->wait(b, r) != 0) {
      train_errf(err, "parameter broadcast from rank 0: %s", b->err);
      train_fsdp_free(f);
      return NULL;
    }
    memcpy(m->params + x->start, f->stage, x->len * sizeof(float));
    memcpy(f->pshard + x->soff, m->params + x->own_lo, x->own_n * sizeof(float));
    if (m->adam_m) { /* a resumed session: every rank loaded the same full state */
      memcpy(f->mshard + x->soff, m->adam_m + x->own_lo, x->own_n * sizeof(float));
      memcpy(f->vshard + x->soff, m->adam_v + x->own_lo, x->own_n * sizeof(float));
    }
    if (o->zero == 3 && x->block >= 0 && x->block < f->L) /* not kept: no peak of 4P */
      release_range(m->params + x->start, x->len);
  }
  if (m->adam_m) { /* the shards hold it now */
    m->ops->release(m->adam_m);
    m->ops->release(m->adam_v);
    m->adam_m = m->adam_v = NULL;
  }
  struct {
    train_loader_state pos;
    int64_t step;
    uint64_t rng;
  } where = {s->pos, s->step, s->sample_rng};
  train_req r;
  if (b->broadcast(b, &where, sizeof where, 0, &r) != 0 || b->wait(b, r) != 0) {
    train_errf(err, "data position broadcast from rank 0: %s", b->err);
    train_fsdp_free(f);
    return NULL;
  }
  s->pos = where.pos;
  s->step = (long)where.step;
  s->sample_rng = where.rng;
  f->materialized = o->zero == 3; /* the check gathers unit by unit, not into params */
  if (train_fsdp_check_identical(f, err) != 0) {
    train_fsdp_free(f);
    return NULL;
  }
  /* the model computes into our gradient array; its own goes back at free */
  f->model_grads = m->grads;
  m->grads = f->grads;
  if (f->model_grads) {
    const train_ops *ops = m->ops;
    ops->release(f->model_grads);
    f->model_grads = NULL;
  }
  if (o->zero == 3) {
    f->materialized = 1; /* the blocks' range of params: released now */
    dematerialize(f);
    m->block_params = f->block_params;
  }
  train_set_forward_hook(m, fwd_hook, f);
  train_set_backward_hook(m, bwd_hook, f);
  if (o->trace && b->trace_start && b->trace_start(b) != 0) {
    train_errf(err, "--trace: %s", b->err);
    train_fsdp_free(f);
    return NULL;
  }
  return f;
oom:
  train_errf(err, "out of memory for FSDP shards");
  train_fsdp_free(f);
  return NULL;
}

void train_fsdp_free(train_fsdp *f) {
  if (!f) return;
  train_model *m = f->s ? f->s->model : NULL;
  if (m) {
    if (m->bwd_hook_arg == f) train_set_backward_hook(m, NULL, NULL);
    if (m->fwd_hook_arg == f) train_set_forward_hook(m, NULL, NULL);
    if (m->block_params == f->block_params) m->block_params = NULL;
    if (m->grads == f->grads) /* give the model a gradient array of its own again */
      m->grads = m->ops->alloc(m->nparams * sizeof(float));
  }
  if (f->grads) munmap(f->grads, f->grads_bytes);
  free(f->u);
  free(f->rs);
  free(f->block_params);
  zfree(f->pshard);
  zfree(f->gshard);
  zfree(f->mshard);
  zfree(f->vshard);
  zfree(f->gtmp);
  zfree(f->stage);
  zfree(f->blockbuf[0]);
  zfree(f->blockbuf[1]);
  free(f->inputs);
  free(f->targets);
  free(f->cp_inputs);
  free(f->cp_targets);
  free(f->tev);
  train_trace_free(&f->trace);
  free(f);
}

/* ---- the step ---------------------------------------------------------------------- */

/* Squared norms of this rank's real shard elements: sq[0] over the tensors a tensor-parallel
 * group splits, sq[1] over the ones it replicates (all of them in sq[1] without TP). */
static void shard_sumsq(const train_fsdp *f, double sq[2]) {
  const train_model *m = f->s->model;
  sq[0] = sq[1] = 0.0;
  for (int u = 0; u < f->nu; u++) {
    const fsdp_unit *x = &f->u[u];
    if (!m->layer_ctx) {
      sq[1] += m->ops->sumsq(f->gshard + x->soff, x->own_n);
      continue;
    }
    size_t lo = x->own_lo, hi = x->own_lo + x->own_n;
    for (int i = 0; i < m->ntensors && lo < hi; i++) {
      const train_param *p = &m->tensors[i];
      size_t a = p->offset > lo ? p->offset : lo;
      size_t e = p->offset + p->numel < hi ? p->offset + p->numel : hi;
      if (a < e)
        sq[train_param_is_split(p->name) ? 0 : 1] += m->ops->sumsq(f->gshard + x->soff +
                                                                       (a - x->own_lo),
                                                                   e - a);
    }
  }
}

/* Global L2 norm over the shards (real elements only), clipping as train_clip_grads. With
 * tensor parallelism (the shards are of this TP rank's slice) the split tensors' squares are
 * also summed over the TP group, the replicated ones counted once (every TP rank holds the
 * same): |g|^2 = sum_tp sum_dp split + sum_dp replicated. */
static int clip_shards(train_fsdp *f, float *norm_out, char *err) {
  const train_ops *ops = f->s->model->ops;
  double local[2];
  shard_sumsq(f, local);
  float sq2[2] = {(float)local[0], (float)local[1]};
  train_req r;
  if (f->b->all_reduce(f->b, sq2, 2, TRAIN_REDUCE_SUM, &r) != 0 || wait_req(f, r) != 0) {
    train_errf(err, "all-reduce of the gradient norm: %s", f->b->err);
    return -1;
  }
  f->sent += (uint64_t)2 * (f->N - 1) * 2 * sizeof(float) / (uint64_t)f->N;
  if (f->s->model->layer_ctx && train_tp_group_sum(f->s->model, &sq2[0], err) != 0) return -1;
  float sq = sq2[0] + sq2[1];
  float norm = sqrtf(sq);
  float clip = f->s->opt.hp.grad_clip;
  if (clip > 0.0f) {
    float coef = clip / (norm + 1e-6f);
    if (coef < 1.0f) ops->scale(f->gshard, coef, f->S);
  }
  *norm_out = norm;
  return 0;
}

/* AdamW on this rank's real elements, one tensor piece at a time (decay per tensor). */
static void adamw_shards(train_fsdp *f, float lr, long t) {
  const train_model *m = f->s->model;
  const train_hparams *hp = &f->s->opt.hp;
  float bc1 = (float)(1.0 - pow(hp->beta1, (double)t));
  float bc2 = (float)(1.0 - pow(hp->beta2, (double)t));
  for (int u = 0; u < f->nu; u++) {
    const fsdp_unit *x = &f->u[u];
    size_t lo = x->own_lo, hi = x->own_lo + x->own_n;
    for (int i = 0; i < m->ntensors && lo < hi; i++) {
      const train_param *p = &m->tensors[i];
      size_t a = p->offset > lo ? p->offset : lo;
      size_t e = p->offset + p->numel < hi ? p->offset + p->numel : hi;
      if (a >= e) continue;
      size_t k = x->soff + (a - x->own_lo);
      m->ops->adamw(f->pshard + k, f->gshard + k, f->mshard + k, f->vshard + k, e - a, lr,
                    hp->beta1, hp->beta2, hp->eps, p->decay ? hp->weight_decay : 0.0f, bc1, bc2);
    }
  }
}

/* What this rank's calls of the step really moved, from libcoll's own records (every
 * work is finished: the step waited for all of it): the bytes it received from peers,
 * summed over the steps libcoll ran for it.  Received, not sent, because every algorithm
 * records what it receives — a ring's steps, and also the direct and one-shot paths,
 * where a rank loads its peers' data and so sends nothing itself; for the all-gathers
 * and reduce-scatters of a step every rank receives exactly what it sends. */
static int measured_sent(train_fsdp *f, uint64_t *out, char *err) {
  train_backend *b = f->b;
  size_t n = 0;
  if (b->trace_stop(b) != 0 || b->trace_read(b, f->tev, f->tcap, &n) != 0) {
    train_errf(err, "reading libcoll's trace counters: %s", b->err);
    return -1;
  }
  if (n > f->tcap) { /* first step: grow to fit, then read again */
    coll_trace_event *ev = realloc(f->tev, n * sizeof *ev);
    if (!ev) {
      train_errf(err, "out of memory reading libcoll's trace counters");
      return -1;
    }
    f->tev = ev;
    f->tcap = n;
    if (b->trace_read(b, f->tev, f->tcap, &n) != 0) {
      train_errf(err, "reading libcoll's trace counters: %s", b->err);
      return -1;
    }
  }
  uint64_t sum = 0;
  for (size_t i = 0; i < n && i < f->tcap; i++)
    if (f->tev[i].step >= 0 && f->tev[i].rank == f->rank) sum += f->tev[i].bytes_in;
  *out = sum;
  return 0;
}

int train_fsdp_step(train_fsdp *f, train_fsdp_stats *st, char *err) {
  train_session *s = f->s;
  train_model *m = s->model;
  train_backend *b = f->b;
  int B = s->opt.batch, T = s->opt.seq, K = f->o.accum, N = f->N;
  /* context parallelism: N/cp data ranks, each of cp ranks reading the same sequences
   * and running its chunks of them (T/cp positions) */
  int cp = f->o.cp > 1 ? f->o.cp : 1, drank = f->rank / cp;
  N /= cp;
  memset(st, 0, sizeof *st);
  int measure = !f->o.trace && b->trace_start && b->trace_read;
  if (measure && b->trace_start(b) != 0) {
    train_errf(err, "starting libcoll's trace counters: %s", b->err);
    return -1;
  }
  dematerialize(f);
  f->wait_s = 0.0;
  f->sent = 0;
  double t0 = train_now(), loss = 0.0;
  train_set_loss_scale(m, 1.0f / (float)K);
  train_loader_state pos0 = s->pos;
  for (int k = 0; k < K; k++) {
    train_loader_state p = pos0;
    train_data_next_rows(s->data, &p, K * N * B, T, (k * N + drank) * B, B, f->inputs, f->targets);
    int *in = f->inputs, *tg = f->targets;
    if (cp > 1) {
      train_cp_take(f->inputs, f->cp_inputs, B, T, cp, f->rank % cp);
      train_cp_take(f->targets, f->cp_targets, B, T, cp, f->rank % cp);
      in = f->cp_inputs;
      tg = f->cp_targets;
    }
    if (k == K - 1) s->pos = p;
    f->micro = k;
    f->nrs = f->rs_polled = 0;
    double tf = train_now();
    f->t_stage = tf;
    if (f->o.zero == 3) gather_start(f, 0); /* in flight while the embeddings compute */
    loss += train_forward(m, in, tg, B, T / cp);
    double tb = train_now();
    st->fwd_ms += (tb - tf) * 1e3;
    f->t_stage = tb;
    train_backward(m);
    if (f->o.zero == 3) block_free(f, 0);
    int rc = rs_wait_all(f);
    if (f->o.zero == 1) /* the full gradient stays allocated, zeroed for the next one */
      memset(f->grads, 0, m->nparams * sizeof(float));
    st->bwd_ms += (train_now() - tb) * 1e3;
    if (rc != 0) {
      train_set_loss_scale(m, 1.0f);
      train_errf(err, "%s", f->hook_err);
      return -1;
    }
  }
  train_set_loss_scale(m, 1.0f);
  double tw = train_now();
  float lossf = (float)(loss / K);
  train_req lr;
  if (b->all_reduce(b, &lossf, 1, TRAIN_REDUCE_AVG, &lr) != 0 || wait_req(f, lr) != 0) {
    train_errf(err, "all-reduce of the loss: %s", b->err);
    return -1;
  }
  if (clip_shards(f, &st->step.grad_norm, err) != 0) return -1;
  st->step.lr = train_lr_at(&s->opt.hp, s->step);
  adamw_shards(f, st->step.lr, s->step + 1);
  memset(f->gshard, 0, f->S * sizeof(float));
  if (gather_params_after_step(f, err) != 0) return -1;
  double t1 = train_now();
  st->opt_ms = (t1 - tw) * 1e3;
  if (f->o.trace)
    train_trace_add(&f->trace, f->rank, TRAIN_TRACE_COMPUTE, "optimizer+gather", tw, t1);
  s->step++;
  st->step.step = s->step;
  st->step.loss = lossf;
  st->step.ms = (t1 - t0) * 1e3;
  st->step.tokens_per_s = (double)K * N * B * T / (t1 - t0);
  st->wait_ms = f->wait_s * 1e3;
  st->sent_bytes = f->sent;
  if (measure && measured_sent(f, &st->measured_bytes, err) != 0) return -1;
  return 0;
}

/* ---- checkpoints ------------------------------------------------------------------- */

/* Shard (t, f->rank) of a T x N checkpoint: this rank's pieces of every unit of its slice
 * (the master parameters and both moments), written directly, collective over `world`. */
static int fsdp_write(train_fsdp *f, train_backend *world, int t, int T, const char *path,
                      char *err) {
  size_t *ulen = calloc((size_t)f->nu, sizeof *ulen);
  char why[TRAIN_ERRLEN] = "";
  train_ckpt_part pt = {.T = T,
                        .S = f->N,
                        .t = t,
                        .s = f->rank,
                        .writes = 1,
                        .p = f->pshard,
                        .m = f->mshard,
                        .v = f->vshard,
                        .count = f->S,
                        .unit_len = ulen};
  if (ulen) {
    for (int u = 0; u < f->nu; u++) ulen[u] = f->u[u].len;
  } else { /* still take part: the others must learn there is no checkpoint */
    train_errf(why, "checkpoint %s: out of memory", path);
    pt.failed = why;
  }
  int rc = train_ckpt_write(f->s, world, &pt, path, err);
  free(ulen);
  return rc;
}

int train_fsdp_save(train_fsdp *f, const char *path, char *err) {
  if (f->s->model->tp > 1) { /* the same answer on every rank: nobody waits */
    train_errf(err,
               "checkpoint %s: FSDP over a tensor-parallel slice is saved by every "
               "rank of the grid together (train_tp_fsdp_save)",
               path);
    return -1;
  }
  return fsdp_write(f, f->b, 0, 1, path, err);
}

int train_tp_fsdp_save(train_fsdp *f, train_backend *world, train_backend *tp, const char *path,
                       char *err) {
  if (f->s->model->tp != tp->nranks || world->nranks != tp->nranks * f->N) {
    train_errf(err,
               "checkpoint %s: a %d-rank job is not %d tensor-parallel slices x %d "
               "FSDP shards (the model is split %d ways)",
               path, world->nranks, tp->nranks, f->N, f->s->model->tp);
    return -1;
  }
  return fsdp_write(f, world, tp->rank, tp->nranks, path, err);
}

/* ---- timeline ---------------------------------------------------------------------- */

int train_fsdp_write_trace(train_fsdp *f, const char *path, char *err) {
  return train_trace_gather_write(f->b, &f->trace, path, err);
}

/* ---- FSDP as a strategy (strategy.h) --------------------------------------------------
 * Over the grid's data-parallel group: every rank steps and writes its shard of every
 * checkpoint; an evaluation first gathers the parameters into the model. */

static train_fsdp *fsdp_of(const train_parallel *p) { return p->impl; }

static int fsdp_strategy_step(train_parallel *p, train_step_report *r, char *err) {
  train_fsdp_stats fst = {0};
  if (train_fsdp_step(fsdp_of(p), &fst, err) != 0) return -1;
  r->step = fst.step;
  r->fwd_ms = fst.fwd_ms;
  r->bwd_ms = fst.bwd_ms;
  r->wait_ms = fst.wait_ms;
  r->sent_bytes = (double)fst.sent_bytes;
  r->measured_bytes = (double)fst.measured_bytes;
  return 0;
}

static int fsdp_strategy_eval_begin(train_parallel *p, char *err) {
  return train_fsdp_materialize(fsdp_of(p), err);
}

static int fsdp_strategy_save(train_parallel *p, const char *path, char *what, size_t n,
                              char *err) {
  int N = fsdp_of(p)->b->nranks;
  snprintf(what, n, " (manifest; %d shards %s.shard0.<r>of1x%d)", N, path, N);
  return train_fsdp_save(fsdp_of(p), path, err);
}

/* each rank writes its own shard of its slice: T x N shards, nothing gathered */
static int fsdp_strategy_save_slice(train_parallel *p, train_backend *world, train_backend *tp,
                                    const char *path, char *err) {
  return train_tp_fsdp_save(fsdp_of(p), world, tp, path, err);
}

static int fsdp_strategy_finish(train_parallel *p, const char *trace_path, char *err) {
  if (train_fsdp_check_identical(fsdp_of(p), err) != 0) return -1;
  return trace_path ? train_fsdp_write_trace(fsdp_of(p), trace_path, err) : 0;
}

static void fsdp_strategy_describe(train_parallel *p, char *out, size_t n) {
  train_fsdp *f = fsdp_of(p);
  const train_options *o = &p->s->opt;
  out[0] = '\0';
  train_appendf(out, n,
                "coll-train: FSDP ZeRO-%d on %d ranks (%s backend), %d micro-step%s "
                "per step: global batch %d x seq %d; %d units:\n",
                f->o.zero, f->b->nranks, f->b->name, p->opt.accum, p->opt.accum > 1 ? "s" : "",
                p->rows_mult * o->batch, o->seq, train_fsdp_num_units(f));
  for (int i = 0; i < train_fsdp_num_units(f); i++) {
    char line[TRAIN_ERRLEN];
    train_fsdp_describe_unit(f, i, line, sizeof line);
    train_appendf(out, n, "  %s\n", line);
  }
}

static void fsdp_strategy_step_line(const train_parallel *p, const train_step_report *r, char *out,
                                    size_t n) {
  (void)p;
  snprintf(out, n, " | bwd %6.1f ms | exposed comm %6.1f ms | sent %.2f MiB", r->bwd_ms, r->wait_ms,
           r->sent_bytes / 1048576.0);
}

static int fsdp_strategy_plan(const train_parallel *p, double fixed, train_plan_row *out,
                              char *err) {
  const train_options *o = &p->s->opt;
  return train_plan_rc(&o->cfg, o->batch, o->seq, p->grid->dp->nranks, p->opt.accum,
                       (train_strategy)(TRAIN_PLAN_ZERO1 + p->zero - 1), o->recompute, fixed, out,
                       err);
}

static void fsdp_strategy_summary(const train_parallel *p, const train_step_report *later,
                                  long nlater, double seconds, const train_step_report *all,
                                  long nall, char *out, size_t n) {
  (void)seconds;
  out[0] = '\0';
  if (nlater > 0)
    train_appendf(out, n,
                  "fsdp: per step after the first: backward %.1f ms, exposed comm "
                  "%.1f ms (blocked on gathers, reduce-scatters and the step's "
                  "collectives)\n",
                  later->bwd_ms / (double)nlater, later->wait_ms / (double)nlater);
  train_plan_row pr;
  char err[TRAIN_ERRLEN];
  if (nall > 0 && p->grid->T == 1 && fsdp_strategy_plan(p, 0.0, &pr, err) == 0)
    train_appendf(out, n,
                  "communication: bytes per rank per step: planned %.0f (ring "
                  "formulas: what each rank sends, and receives), measured %.0f (rank 0, "
                  "libcoll's trace counters: what it received in every step it ran, the "
                  "direct path's loads from peers included%s), counted %.0f (ring formulas "
                  "over the calls made)\n",
                  pr.sent, all->measured_bytes / (double)nall,
                  all->measured_bytes > 0 ? "" : ": not available with --trace or this backend",
                  all->sent_bytes / (double)nall);
  if (nall > 0)
    train_appendf(out, n,
                  "fsdp: every rank gathers bitwise the same weights | sent per "
                  "rank per step %.0f bytes (ring formulas over the calls made)\n",
                  all->sent_bytes / (double)nall);
}

static void fsdp_strategy_free(train_parallel *p) {
  train_fsdp_free(fsdp_of(p));
  free(p);
}

static const train_parallel_ops fsdp_strategy_ops = {
    .name = "fsdp",
    .step = fsdp_strategy_step,
    .eval_begin = fsdp_strategy_eval_begin,
    .save = fsdp_strategy_save,
    .save_slice = fsdp_strategy_save_slice,
    .finish = fsdp_strategy_finish,
    .describe = fsdp_strategy_describe,
    .step_line = fsdp_strategy_step_line,
    .summary = fsdp_strategy_summary,
    .plan = fsdp_strategy_plan,
    .free = fsdp_strategy_free,
};

train_parallel *train_fsdp_strategy_create(train_session *s, train_grid *g,
                                           const train_parallel_options *opt, char *err) {
  if (!g->dp) {
    train_errf(err, "--parallel fsdp needs more than one process");
    return NULL;
  }
  train_fsdp_options fo = train_fsdp_options_default();
  fo.zero = opt->zero;
  fo.accum = opt->accum;
  fo.trace = opt->trace;
  fo.cp = g->Cp;
  train_parallel *p = train_parallel_new(&fsdp_strategy_ops, s, g, opt);
  if (!p) {
    train_errf(err, "out of memory");
    return NULL;
  }
  p->rows_mult = g->dp->nranks / (g->Cp > 1 ? g->Cp : 1) * opt->accum;
  p->zero = opt->zero;
  if (!(p->impl = train_fsdp_create(s, g->dp, &fo, err))) {
    free(p);
    return NULL;
  }
  return p;
}
