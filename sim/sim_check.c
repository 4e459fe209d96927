/* sim_check.c — what the slices of a simulated call carry, symbolically, and whether
 * every output ends up as the collective promises.
 *
 * test/algo/test_plan.c gives element k of rank r the value (k << 40) + 4^r and adds real
 * numbers; that needs every element in memory and 2 bits per rank, so it stops at 16
 * ranks.  Here an element's value is a 64-bit hash instead, and buffers are kept as runs
 * in which the value is affine in the position (base + i·step, mod 2^64):
 *
 *   reductions   rank q's input element j is h(q) + j·K(q), h and K random per rank
 *                (K odd).  Sums of runs are runs, so a fully reduced element k is
 *                H + k·ΣK with H = Σ h(q): each rank counted once, each from element k.
 *                A rank counted twice or never changes H; a contribution taken from the
 *                wrong element changes the k·K(q) part (a wrong multiset or alignment
 *                passes only if random 64-bit values cancel, about 2^-64).
 *                The step that finishes a value (`final`, where AVG divides) multiplies
 *                by an odd M: done twice, or before the last addition, the result is off.
 *   moves        (broadcast, gathers, scatter) rank q's element j of its block is
 *                C + (q·cnt + j)·K0: the value says where it must end up, so a whole
 *                gathered buffer is one run; all-to-all uses a (C, K) per destination.
 *   garbage      an output buffer starts as a run marked bad; anything computed from a
 *                bad run is bad; a bad element left in an output fails the check.
 *
 * Unwritten parts of a buffer are not stored: their runs are computed from the initial
 * contents when read.  A 4096-rank ring all-reduce keeps a handful of runs per rank.
 * In-place calls alias the two buffers exactly as the API does (coll.h), so a plan that
 * overwrites its input before sending it is caught too.
 *
 * Must never: look at the plan's structure to decide what is right — only at the values
 * that arrive; the expected output of each collective is written out below, from the
 * API's definition, not from any algorithm.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

typedef struct {
  uint64_t off, len, base, step;
  uint8_t bad;
} run;

struct sim_payload {
  uint32_t n;
  run r[];
};

typedef struct {
  run *r;
  size_t n, cap;
} store;

enum { INIT_CONTRIB, INIT_GARBAGE, INIT_MIXED };

struct sim_checker {
  sim_call c;
  int n;
  store *st;       /* 2 per rank */
  uint8_t *init1;  /* per rank: store 1's initial contents */
  uint64_t *h, *k; /* per rank: its hash and odd step */
  uint64_t H, KS, C, K0, M;
  run *tmp[3]; /* scratch run lists, kept between operations */
  size_t tmpcap[3];
};

static uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static bool reducing(coll_coll_kind c) {
  return c == COLL_COLL_ALL_REDUCE || c == COLL_COLL_REDUCE || c == COLL_COLL_REDUCE_SCATTER ||
         c == COLL_COLL_BARRIER;
}

/* Elements in rank r's send and receive buffers, as the API defines them. */
static void lens(const sim_checker *ck, int r, uint64_t *sl, uint64_t *rl) {
  uint64_t cnt = ck->c.count, n = (uint64_t)ck->n;
  *sl = *rl = cnt;
  switch (ck->c.coll) {
  case COLL_COLL_REDUCE_SCATTER: *sl = cnt * n; break;
  case COLL_COLL_ALL_GATHER: *rl = cnt * n; break;
  case COLL_COLL_ALL_TO_ALL: *sl = *rl = cnt * n; break;
  case COLL_COLL_GATHER: *rl = r == ck->c.root ? cnt * n : 0; break;
  case COLL_COLL_SCATTER: *sl = r == ck->c.root ? cnt * n : 0; break;
  case COLL_COLL_REDUCE: *rl = r == ck->c.root ? cnt : 0; break;
  default: break;
  }
}

/* Where (buffer, offset) of rank r lives: which of its two stores, at what shift. */
static int store_of(const sim_checker *ck, int r, int buf, uint64_t *shift) {
  *shift = 0;
  bool ip = ck->c.in_place &&
            !((ck->c.coll == COLL_COLL_GATHER || ck->c.coll == COLL_COLL_SCATTER) &&
              r != ck->c.root);
  if (!ip) return buf;
  uint64_t cnt = ck->c.count;
  switch (ck->c.coll) {
  case COLL_COLL_REDUCE_SCATTER:
  case COLL_COLL_SCATTER:
    if (buf == COLL_BUF_RECV)
      *shift = (uint64_t)(ck->c.coll == COLL_COLL_SCATTER ? ck->c.root : r) * cnt;
    return 0;
  case COLL_COLL_ALL_GATHER:
  case COLL_COLL_GATHER:
    if (buf == COLL_BUF_SEND) *shift = (uint64_t)r * cnt;
    return 1;
  default: return 1; /* send == recv */
  }
}

/* The initial run of rank r's send buffer at element x (its contribution). */
static run contrib(const sim_checker *ck, int r, uint64_t x) {
  uint64_t cnt = ck->c.count;
  run o = {.off = x, .len = UINT64_MAX};
  switch (ck->c.coll) {
  case COLL_COLL_ALL_GATHER:
  case COLL_COLL_GATHER: o.base = ck->C + ((uint64_t)r * cnt + x) * ck->K0, o.step = ck->K0; break;
  case COLL_COLL_SCATTER: o.base = ck->C + x * ck->K0, o.step = ck->K0; break;
  case COLL_COLL_ALL_TO_ALL: {
    uint64_t p = x / cnt, j = x % cnt;
    o.base = ck->h[p] + ((uint64_t)r * cnt + j) * ck->k[p], o.step = ck->k[p];
    o.len = cnt - j;
    break;
  }
  default: o.base = ck->h[r] + x * ck->k[r], o.step = ck->k[r]; break;
  }
  return o;
}

static run initial(const sim_checker *ck, int r, int s, uint64_t x) {
  if (s == 0) return contrib(ck, r, x);
  uint64_t cnt = ck->c.count, lo = (uint64_t)r * cnt;
  switch (ck->init1[r]) {
  case INIT_CONTRIB: return contrib(ck, r, x);
  case INIT_MIXED:
    if (x >= lo && x < lo + cnt) {
      run o = contrib(ck, r, x - lo);
      o.off = x;
      o.len = lo + cnt - x;
      return o;
    }
    return (run){.off = x, .len = x < lo ? lo - x : UINT64_MAX, .base = 0xdeadbeefull, .bad = 1};
  default: return (run){.off = x, .len = UINT64_MAX, .base = 0xdeadbeefull, .bad = 1};
  }
}

sim_checker *sim_check_new(int n, const sim_call *call) {
  sim_checker *ck = calloc(1, sizeof *ck);
  if (!ck) return NULL;
  ck->c = *call, ck->n = n;
  ck->st = calloc(2 * (size_t)n, sizeof *ck->st);
  ck->init1 = calloc((size_t)n, 1);
  ck->h = malloc((size_t)n * sizeof *ck->h);
  ck->k = malloc((size_t)n * sizeof *ck->k);
  if (!ck->st || !ck->init1 || !ck->h || !ck->k) {
    sim_check_free(ck);
    return NULL;
  }
  for (int q = 0; q < n; q++) {
    ck->h[q] = splitmix(0x1234u + 2 * (uint64_t)q);
    ck->k[q] = splitmix(0x5678u + 2 * (uint64_t)q + 1) | 1;
    ck->H += ck->h[q], ck->KS += ck->k[q];
    bool ip = call->in_place &&
              !((call->coll == COLL_COLL_GATHER || call->coll == COLL_COLL_SCATTER) &&
                q != call->root);
    ck->init1[q] = INIT_GARBAGE;
    if (ip && (call->coll == COLL_COLL_ALL_GATHER || call->coll == COLL_COLL_GATHER))
      ck->init1[q] = INIT_MIXED;
    else if (ip && call->coll != COLL_COLL_REDUCE_SCATTER && call->coll != COLL_COLL_SCATTER)
      ck->init1[q] = INIT_CONTRIB;
  }
  ck->C = splitmix(77), ck->K0 = splitmix(78) | 1, ck->M = splitmix(79) | 1;
  return ck;
}

void sim_check_free(sim_checker *ck) {
  if (!ck) return;
  for (size_t i = 0; ck->st && i < 2 * (size_t)ck->n; i++) free(ck->st[i].r);
  free(ck->st);
  free(ck->init1);
  free(ck->h);
  free(ck->k);
  for (int i = 0; i < 3; i++) free(ck->tmp[i]);
  free(ck);
}

void sim_payload_free(sim_payload *pl) { free(pl); }

/* ---- run lists ---------------------------------------------------------------------- */

typedef struct {
  run *r;
  size_t n, cap;
} list;

static bool push(list *l, run x) {
  if (x.len == 0) return true;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 8;
    run *nr = realloc(l->r, cap * sizeof *nr);
    if (!nr) return false;
    l->r = nr, l->cap = cap;
  }
  l->r[l->n++] = x;
  return true;
}

/* Joins b onto a when the values continue one affine run. */
static bool joins(run *a, const run *b) {
  if (a->off + a->len != b->off || a->bad != b->bad) return false;
  uint64_t s = a->len > 1 ? a->step : b->len > 1 ? b->step : b->base - a->base;
  if ((a->len > 1 && a->step != s) || (b->len > 1 && b->step != s)) return false;
  if (b->base != a->base + a->len * s) return false;
  a->len += b->len;
  a->step = s;
  return true;
}

/* The runs of [o, o+m) of store s of rank r, shifted to start at 0. */
static bool read_range(sim_checker *ck, int r, int s, uint64_t o, uint64_t m, list *out) {
  const store *S = &ck->st[2 * (size_t)r + (size_t)s];
  out->n = 0;
  size_t lo = 0, hi = S->n; /* first run ending after o */
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (S->r[mid].off + S->r[mid].len <= o)
      lo = mid + 1;
    else
      hi = mid;
  }
  uint64_t x = o, end = o + m;
  size_t i = lo;
  while (x < end) {
    run piece;
    if (i < S->n && S->r[i].off <= x) {
      piece = S->r[i];
      uint64_t skip = x - piece.off;
      piece.base += skip * piece.step, piece.off = x, piece.len -= skip;
      i++;
    } else {
      piece = initial(ck, r, s, x);
      uint64_t stop = i < S->n ? S->r[i].off : end;
      if (piece.len > stop - x) piece.len = stop - x;
    }
    if (piece.len > end - x) piece.len = end - x;
    piece.off = x - o;
    if (!(out->n && joins(&out->r[out->n - 1], &piece)) && !push(out, piece)) return false;
    x += piece.len;
  }
  return true;
}

/* Replaces [o, o+len of runs) of store s of rank r with the runs (which start at 0). */
static bool write_range(sim_checker *ck, int r, int s, uint64_t o, const run *in, size_t nin,
                        uint64_t m) {
  store *S = &ck->st[2 * (size_t)r + (size_t)s];
  uint64_t end = o + m;
  size_t lo = 0, hi = S->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (S->r[mid].off + S->r[mid].len <= o)
      lo = mid + 1;
    else
      hi = mid;
  }
  size_t j = lo; /* runs [lo, j) overlap the range */
  while (j < S->n && S->r[j].off < end) j++;
  run left = {0}, right = {0};
  bool has_left = lo < j && S->r[lo].off < o,
       has_right = lo < j && S->r[j - 1].off + S->r[j - 1].len > end;
  if (has_left) left = S->r[lo], left.len = o - left.off;
  if (has_right) {
    right = S->r[j - 1];
    uint64_t skip = end - right.off;
    right.base += skip * right.step, right.off = end, right.len -= skip;
  }
  size_t add = nin + has_left + has_right, need = S->n - (j - lo) + add;
  if (need > S->cap) {
    size_t cap = S->cap ? S->cap : 4;
    while (cap < need) cap *= 2;
    run *nr = realloc(S->r, cap * sizeof *nr);
    if (!nr) return false;
    S->r = nr, S->cap = cap;
  }
  memmove(S->r + lo + add, S->r + j, (S->n - j) * sizeof(run));
  size_t w = lo;
  if (has_left) S->r[w++] = left;
  for (size_t i = 0; i < nin; i++) {
    S->r[w] = in[i];
    S->r[w].off += o;
    w++;
  }
  if (has_right) S->r[w++] = right;
  S->n = need;
  /* Coalesce around what was written. */
  size_t from = lo > 0 ? lo - 1 : 0, to = w < S->n ? w + 1 : S->n, k = from;
  for (size_t i = from + 1; i < to; i++)
    if (!joins(&S->r[k], &S->r[i])) S->r[++k] = S->r[i];
  size_t removed = (to - from) - (k + 1 - from);
  if (removed) {
    memmove(S->r + k + 1, S->r + to, (S->n - to) * sizeof(run));
    S->n -= removed;
  }
  return true;
}

/* out = a + b element by element (both cover [0, m)). */
static bool add_lists(const run *a, size_t na, const run *b, size_t nb, list *out) {
  out->n = 0;
  size_t i = 0, j = 0;
  uint64_t x = 0;
  while (i < na && j < nb) {
    const run *p = &a[i], *q = &b[j];
    uint64_t e = p->off + p->len < q->off + q->len ? p->off + p->len : q->off + q->len;
    run s = {.off = x,
             .len = e - x,
             .base = p->base + (x - p->off) * p->step + q->base + (x - q->off) * q->step,
             .step = p->step + q->step,
             .bad = p->bad | q->bad};
    if (!(out->n && joins(&out->r[out->n - 1], &s)) && !push(out, s)) return false;
    x = e;
    if (p->off + p->len == e) i++;
    if (q->off + q->len == e) j++;
  }
  return true;
}

static sim_payload *payload_of(const list *l) {
  sim_payload *p = malloc(sizeof *p + l->n * sizeof(run));
  if (!p) return NULL;
  p->n = (uint32_t)l->n;
  memcpy(p->r, l->r, l->n * sizeof(run));
  return p;
}

static bool fail(char *why, size_t len, const char *fmt, int r, const sim_step *s,
                 const char *what) {
  snprintf(why, len, fmt, r, coll_step_name((coll_step_kind)s->kind), what);
  return false;
}

bool sim_check_op(sim_checker *ck, int r, const sim_step *s, uint64_t off, uint64_t m,
                  const sim_payload *in[2], sim_payload **out, char *why, size_t why_len) {
  coll_step_kind k = (coll_step_kind)s->kind;
  bool rd = k == COLL_STEP_COPY || k == COLL_STEP_SEND || k == COLL_STEP_RECV_REDUCE_SEND ||
            k == COLL_STEP_RECV_REDUCE_COPY || k == COLL_STEP_RECV_REDUCE_COPY_SEND ||
            k == COLL_STEP_RECV2_REDUCE_SEND;
  bool wr = k == COLL_STEP_COPY || k == COLL_STEP_RECV || k == COLL_STEP_RECV_COPY_SEND ||
            k == COLL_STEP_RECV_REDUCE_COPY || k == COLL_STEP_RECV_REDUCE_COPY_SEND;
  uint64_t sl, rl, ss, ds;
  lens(ck, r, &sl, &rl);
  int sst = store_of(ck, r, s->src_buf, &ss), dst = store_of(ck, r, s->dst_buf, &ds);
  if (rd && s->src_off + off + m > (s->src_buf == COLL_BUF_SEND ? sl : rl))
    return fail(why, why_len, "rank %d step %s reads past the end of its %s buffer", r, s,
                s->src_buf == COLL_BUF_SEND ? "send" : "receive");
  if (wr && s->dst_off + off + m > (s->dst_buf == COLL_BUF_SEND ? sl : rl))
    return fail(why, why_len, "rank %d step %s writes past the end of its %s buffer", r, s,
                s->dst_buf == COLL_BUF_SEND ? "send" : "receive");
  *out = NULL;
  list a = {ck->tmp[0], 0, ck->tmpcap[0]}, b = {ck->tmp[1], 0, ck->tmpcap[1]},
       c = {ck->tmp[2], 0, ck->tmpcap[2]};
  bool ok = true;
  const list *result = NULL; /* what is sent */
  const list *keep = NULL;   /* what is written */
  list in0 = {0}, in1 = {0};
  if (in[0]) in0 = (list){(run *)in[0]->r, in[0]->n, 0};
  if (in[1]) in1 = (list){(run *)in[1]->r, in[1]->n, 0};
  if (rd) ok = read_range(ck, r, sst, s->src_off + off + ss, m, &a);
  switch (k) {
  case COLL_STEP_COPY: keep = &a; break;
  case COLL_STEP_SEND: result = &a; break;
  case COLL_STEP_RECV: keep = &in0; break;
  case COLL_STEP_RECV_COPY_SEND: keep = &in0, result = &in0; break;
  case COLL_STEP_RECV_REDUCE_SEND:
    ok = ok && add_lists(in0.r, in0.n, a.r, a.n, &b);
    result = &b;
    break;
  case COLL_STEP_RECV2_REDUCE_SEND:
    ok = ok && add_lists(in0.r, in0.n, a.r, a.n, &b) && add_lists(b.r, b.n, in1.r, in1.n, &c);
    result = &c;
    break;
  case COLL_STEP_RECV_REDUCE_COPY:
  case COLL_STEP_RECV_REDUCE_COPY_SEND:
    ok = ok && add_lists(in0.r, in0.n, a.r, a.n, &b);
    if (ok && s->final && ck->n > 1)
      for (size_t i = 0; i < b.n; i++) b.r[i].base *= ck->M, b.r[i].step *= ck->M;
    keep = &b;
    if (k == COLL_STEP_RECV_REDUCE_COPY_SEND) result = &b;
    break;
  }
  if (ok && keep) {
    if (s->dst_buf == COLL_BUF_RECV && rl == 0)
      return fail(why, why_len,
                  "rank %d step %s writes a receive buffer this rank does not "
                  "have (%s)",
                  r, s, coll_coll_name(ck->c.coll));
    ok = write_range(ck, r, dst, s->dst_off + off + ds, keep->r, keep->n, m);
  }
  if (ok && result && !(*out = payload_of(result))) ok = false;
  /* the scratch lists may have grown: keep them for the next operation */
  ck->tmp[0] = a.r, ck->tmp[1] = b.r, ck->tmp[2] = c.r;
  ck->tmpcap[0] = a.cap, ck->tmpcap[1] = b.cap, ck->tmpcap[2] = c.cap;
  if (!ok) snprintf(why, why_len, "out of memory checking rank %d", r);
  return ok;
}

/* The value element x of rank r's output must hold: base + x·step. */
static void expected(const sim_checker *ck, int r, uint64_t *base, uint64_t *step) {
  uint64_t cnt = ck->c.count;
  switch (ck->c.coll) {
  case COLL_COLL_ALL_REDUCE:
  case COLL_COLL_REDUCE: *base = ck->M * ck->H, *step = ck->M * ck->KS; break;
  case COLL_COLL_REDUCE_SCATTER:
    *base = ck->M * (ck->H + (uint64_t)r * cnt * ck->KS), *step = ck->M * ck->KS;
    break;
  case COLL_COLL_BROADCAST: *base = ck->h[ck->c.root], *step = ck->k[ck->c.root]; break;
  case COLL_COLL_ALL_GATHER:
  case COLL_COLL_GATHER: *base = ck->C, *step = ck->K0; break;
  case COLL_COLL_SCATTER: *base = ck->C + (uint64_t)r * cnt * ck->K0, *step = ck->K0; break;
  case COLL_COLL_ALL_TO_ALL: *base = ck->h[r], *step = ck->k[r]; break;
  default: *base = *step = 0; break;
  }
}

bool sim_check_final(sim_checker *ck, char *why, size_t why_len) {
  list l = {0};
  bool ok = true;
  for (int r = 0; r < ck->n && ok; r++) {
    uint64_t sl, rl, shift, base, step;
    lens(ck, r, &sl, &rl);
    if (rl == 0 || ck->c.coll == COLL_COLL_BARRIER) continue;
    int s = store_of(ck, r, COLL_BUF_RECV, &shift);
    if (!read_range(ck, r, s, shift, rl, &l)) {
      snprintf(why, why_len, "out of memory checking rank %d", r);
      ok = false;
      break;
    }
    expected(ck, r, &base, &step);
    for (size_t i = 0; i < l.n; i++) {
      const run *x = &l.r[i];
      bool good = !x->bad && x->base == base + x->off * step && (x->len == 1 || x->step == step);
      if (good) continue;
      const char *what = x->bad ? "was never written (or holds values computed from unwritten "
                                  "memory)"
                         : reducing(ck->c.coll)
                             ? "does not hold every rank's contribution exactly once, each from "
                               "the same element, finished once"
                             : "does not hold the block that belongs there";
      snprintf(why, why_len,
               "%s/%s N=%d count=%zu: rank %d, elements %llu..%llu of its "
               "output %s",
               coll_algo_name(ck->c.algo), coll_coll_name(ck->c.coll), ck->n, ck->c.count, r,
               (unsigned long long)x->off, (unsigned long long)(x->off + x->len - 1), what);
      ok = false;
      break;
    }
  }
  free(l.r);
  return ok;
}
