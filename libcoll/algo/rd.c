/* rd.c — recursive doubling (all-reduce, all-gather, barrier) and recursive
 * halving/doubling, Rabenseifner's all-reduce.
 *
 * Non-powers of two fold first.  With p' = 2^floor(log2 p) and rem = p - p', the ranks
 * r < 2·rem pair up as (even r, r+1): the even rank hands its data to r+1 and sits out,
 * r+1 carries both under the new id r/2; ranks r >= 2·rem take the new id r - rem.  The
 * p' new ids run the power-of-two algorithm, then r+1 hands the result back to r.  New
 * ids keep the order of the ranks, so a run of new ids covers a contiguous run of the
 * ranks' blocks (needed by all-gather).
 *
 * Recursive doubling all-reduce: in phase k = 0..log2(p')-1 new id i exchanges its whole
 * current vector with i XOR 2^k and both add what they received (a OP b on one side,
 * b OP a on the other: the same bits, since add/mul/min/max commute bitwise).  Picture,
 * p = 4 (what each rank holds after each phase):
 *
 *            rank0   rank1   rank2   rank3
 *   start     a0      a1      a2      a3
 *   k = 0    a0+a1   a0+a1   a2+a3   a2+a3        (0<->1, 2<->3)
 *   k = 1    all     all     all     all          (0<->2, 1<->3)
 *
 * All phases cover the same elements, so phase k simply starts k rounds after phase 0
 * (delay k) and the phases pipeline slice by slice.
 *
 * Rabenseifner: reduce-scatter by recursive halving (partner i XOR p'/2, then p'/4, ...,
 * 1: each phase keeps the half of the current block range on the side of the new id's
 * bit, sends the other half, and adds the partner's copy of the kept half; after the
 * last phase new id i holds block i, divided once for AVG), then all-gather by recursive
 * doubling (partner i XOR 1, 2, ..., p'/2: exchange the blocks gathered so far).  p = 4,
 * blocks b0..b3, after each phase:
 *
 *            rank0      rank1      rank2      rank3
 *   RS m=2   b0,b1      b0,b1      b2,b3      b2,b3     (halves, 2 ranks each summed)
 *   RS m=1   b0         b1         b2         b3        (each block summed over all)
 *   AG m=1   b0,b1      b0,b1      b2,b3      b2,b3
 *   AG m=2   b0..b3     b0..b3     b0..b3     b0..b3
 *
 * A phase reads what the previous one wrote at other offsets, so each phase starts
 * after the previous one's last slice: its delay is the previous phases' rounds, which
 * is why plans take the executor's slice size (coll_plan_args.slice).  Reduce-scatter
 * by recursive halving needs a scratch half of the input at the first phase, which the
 * user's buffers do not offer (the receive buffer holds one block), so it is left to
 * the ring.
 *
 * Cost (p ranks, n bytes, p' = 2^floor(log2 p), K = log2 p', f = 1 if p != p' else 0,
 * α per message, β per byte sent, γ per byte reduced):
 *   rd  all-reduce   (K+2f)·α + (K+2f)·n·β + (K+f)·n·γ
 *   rd  barrier      (K+2f)·α
 *   all-gather       (K+2f)·α + ((p'-1)/p' + f·(1 + 1/p))·n·β        (n = whole output)
 *   rhd all-reduce   (2K+2f)·α + (2(p'-1)/p' + 2f)·n·β + ((p'-1)/p' + f)·n·γ
 * Recursive doubling has the fewest latency terms of all (log2 p) and moves n·log2 p
 * bytes: the small-message algorithm.  Rabenseifner moves about the ring's 2n bytes
 * with 2·log2 p latencies: between the two.
 *
 * Pure: builds steps, touches no memory but `steps`, never fails for valid arguments.
 */
#include <math.h>
#include <stdio.h>

#include "algo.h"
#include "rd.h"

static int floor_log2(int v) {
  int k = 0;
  while (v > 1) v >>= 1, k++;
  return k;
}

typedef struct {
  int pp, rem, K, id;
  bool out; /* even rank below 2·rem: hands its data over and sits out */
  bool in;  /* odd rank below 2·rem: carries its even neighbour's data too */
} fold;

static fold fold_of(int p, int r) {
  fold f = {.K = floor_log2(p)};
  f.pp = 1 << f.K, f.rem = p - f.pp;
  f.out = r < 2 * f.rem && r % 2 == 0;
  f.in = r < 2 * f.rem && r % 2 == 1;
  f.id = r < 2 * f.rem ? r / 2 : r - f.rem;
  return f;
}

static int real_of(int id, int rem) { return id < rem ? 2 * id + 1 : id + rem; }

static size_t rounds_of(size_t count, size_t slice) {
  if (count == 0) return 0;
  return slice ? (count + slice - 1) / slice : 1;
}

static size_t max2(size_t a, size_t b) { return a > b ? a : b; }

static void put(coll_step *st, size_t *n, coll_step_kind kind, int in, int out, coll_buf sb,
                size_t so, coll_buf db, size_t doff, size_t count, int chunk, int final,
                size_t delay) {
  if (count == 0) return;
  st[(*n)++] = (coll_step){.kind = kind,
                           .peer_in = in,
                           .peer_out = out,
                           .peer_in2 = -1,
                           .src_buf = sb,
                           .dst_buf = db,
                           .src_off = so,
                           .dst_off = doff,
                           .count = count,
                           .chunk = chunk,
                           .final = final,
                           .delay = (uint32_t)delay};
}

/* ---- recursive doubling all-reduce --------------------------------------------- */

static void rd_all_reduce(int p, int r, size_t c, coll_step *st, size_t *n) {
  fold f = fold_of(p, r);
  size_t lag = f.rem > 0; /* phases wait one round for the fold */
  if (f.out) {
    put(st, n, COLL_STEP_SEND, -1, r + 1, COLL_BUF_SEND, 0, COLL_BUF_RECV, 0, c, -1, 0, 0);
    put(st, n, COLL_STEP_RECV, r + 1, -1, COLL_BUF_RECV, 0, COLL_BUF_RECV, 0, c, -1, 0,
        (size_t)f.K + lag);
    return;
  }
  coll_buf cur = COLL_BUF_SEND;
  if (f.in) {
    put(st, n, COLL_STEP_RECV_REDUCE_COPY, r - 1, -1, COLL_BUF_SEND, 0, COLL_BUF_RECV, 0, c, -1, 0,
        0);
    cur = COLL_BUF_RECV;
  }
  for (int k = 0; k < f.K; k++) {
    int partner = real_of(f.id ^ (1 << k), f.rem);
    put(st, n, COLL_STEP_SEND, -1, partner, cur, 0, COLL_BUF_RECV, 0, c, -1, 0, (size_t)k + lag);
    put(st, n, COLL_STEP_RECV_REDUCE_COPY, partner, -1, cur, 0, COLL_BUF_RECV, 0, c, -1,
        k == f.K - 1, (size_t)k + lag);
    cur = COLL_BUF_RECV;
  }
  if (f.in)
    put(st, n, COLL_STEP_SEND, -1, r - 1, COLL_BUF_RECV, 0, COLL_BUF_RECV, 0, c, -1, 0,
        (size_t)f.K + lag);
}

/* ---- recursive doubling all-gather --------------------------------------------- */

/* First rank block and one past the last of new ids [a, b). */
static int first_block(int id, int rem) { return id < rem ? 2 * id : id + rem; }
static int end_block(int id, int rem) { return id < rem ? 2 * id + 2 : id + rem + 1; }

static void all_gather(int p, int r, size_t sc, int in_place, size_t slice, coll_step *st,
                       size_t *n) {
  fold f = fold_of(p, r);
  size_t total = sc * (size_t)p, mine = (size_t)r * sc;
  if (!in_place)
    put(st, n, COLL_STEP_COPY, -1, -1, COLL_BUF_SEND, 0, COLL_BUF_RECV, mine, sc, r, 0, 0);
  if (f.out) {
    size_t d = rounds_of(sc, slice);
    put(st, n, COLL_STEP_SEND, -1, r + 1, COLL_BUF_SEND, 0, COLL_BUF_RECV, 0, sc, r, 0, 0);
    put(st, n, COLL_STEP_RECV, r + 1, -1, COLL_BUF_RECV, 0, COLL_BUF_RECV, 0, mine, -1, 0, d);
    put(st, n, COLL_STEP_RECV, r + 1, -1, COLL_BUF_RECV, mine + sc, COLL_BUF_RECV, mine + sc,
        total - mine - sc, -1, 0, d);
    return;
  }
  size_t d = 0;
  if (f.in) {
    size_t o = mine - sc;
    put(st, n, COLL_STEP_RECV, r - 1, -1, COLL_BUF_RECV, o, COLL_BUF_RECV, o, sc, r - 1, 0, 0);
    d = rounds_of(sc, slice);
  }
  for (int m = 1; m < f.pp; m *= 2) {
    int g = f.id & ~(m - 1), h = g ^ m, partner = real_of(f.id ^ m, f.rem);
    size_t mo = (size_t)first_block(g, f.rem) * sc;
    size_t ml = (size_t)end_block(g + m - 1, f.rem) * sc - mo;
    size_t to = (size_t)first_block(h, f.rem) * sc;
    size_t tl = (size_t)end_block(h + m - 1, f.rem) * sc - to;
    put(st, n, COLL_STEP_SEND, -1, partner, COLL_BUF_RECV, mo, COLL_BUF_RECV, mo, ml, -1, 0, d);
    put(st, n, COLL_STEP_RECV, partner, -1, COLL_BUF_RECV, to, COLL_BUF_RECV, to, tl, -1, 0, d);
    d += max2(rounds_of(ml, slice), rounds_of(tl, slice));
  }
  if (f.in) {
    size_t o = mine - sc; /* everything but the even neighbour's own block */
    put(st, n, COLL_STEP_SEND, -1, r - 1, COLL_BUF_RECV, 0, COLL_BUF_RECV, 0, o, -1, 0, d);
    put(st, n, COLL_STEP_SEND, -1, r - 1, COLL_BUF_RECV, mine, COLL_BUF_RECV, mine, total - mine,
        -1, 0, d);
  }
}

/* ---- Rabenseifner all-reduce ---------------------------------------------------- */

static size_t block_off(size_t count, int pp, int b) {
  size_t off, len;
  if (b >= pp) return count;
  coll_ring_chunk(count, pp, b, &off, &len);
  return off;
}

static void rhd_all_reduce(int p, int r, size_t c, size_t slice, coll_step *st, size_t *n) {
  fold f = fold_of(p, r);
  if (f.out) {
    put(st, n, COLL_STEP_SEND, -1, r + 1, COLL_BUF_SEND, 0, COLL_BUF_RECV, 0, c, -1, 0, 0);
    put(st, n, COLL_STEP_RECV, r + 1, -1, COLL_BUF_RECV, 0, COLL_BUF_RECV, 0, c, -1, 0,
        rounds_of(c, slice));
    return;
  }
  size_t d = 0;
  coll_buf cur = COLL_BUF_SEND;
  if (f.in) {
    put(st, n, COLL_STEP_RECV_REDUCE_COPY, r - 1, -1, COLL_BUF_SEND, 0, COLL_BUF_RECV, 0, c, -1, 0,
        0);
    d = rounds_of(c, slice);
    cur = COLL_BUF_RECV;
  }
  int lo = 0, hi = f.pp;
  for (int m = f.pp / 2; m >= 1; m /= 2) {
    int partner = real_of(f.id ^ m, f.rem), mid = lo + m;
    int klo = (f.id & m) ? mid : lo, khi = (f.id & m) ? hi : mid;
    int glo = (f.id & m) ? lo : mid, ghi = (f.id & m) ? mid : hi;
    size_t ko = block_off(c, f.pp, klo), kl = block_off(c, f.pp, khi) - ko;
    size_t go = block_off(c, f.pp, glo), gl = block_off(c, f.pp, ghi) - go;
    put(st, n, COLL_STEP_SEND, -1, partner, cur, go, COLL_BUF_RECV, go, gl, glo, 0, d);
    put(st, n, COLL_STEP_RECV_REDUCE_COPY, partner, -1, cur, ko, COLL_BUF_RECV, ko, kl, klo, m == 1,
        d);
    d += max2(rounds_of(kl, slice), rounds_of(gl, slice));
    cur = COLL_BUF_RECV;
    lo = klo, hi = khi;
  }
  for (int m = 1; m < f.pp; m *= 2) {
    int g = f.id & ~(m - 1), h = g ^ m, partner = real_of(f.id ^ m, f.rem);
    size_t mo = block_off(c, f.pp, g), ml = block_off(c, f.pp, g + m) - mo;
    size_t to = block_off(c, f.pp, h), tl = block_off(c, f.pp, h + m) - to;
    put(st, n, COLL_STEP_SEND, -1, partner, COLL_BUF_RECV, mo, COLL_BUF_RECV, mo, ml, g, 0, d);
    put(st, n, COLL_STEP_RECV, partner, -1, COLL_BUF_RECV, to, COLL_BUF_RECV, to, tl, h, 0, d);
    d += max2(rounds_of(ml, slice), rounds_of(tl, slice));
  }
  if (f.in) put(st, n, COLL_STEP_SEND, -1, r - 1, COLL_BUF_RECV, 0, COLL_BUF_RECV, 0, c, -1, 0, d);
}

coll_result coll_rd_plan(const coll_plan_args *a, coll_step *st, size_t *n) {
  *n = 0;
  if (a->nranks < 2) return COLL_ERR_INVALID_ARG;
  switch (a->coll) {
  case COLL_COLL_ALL_REDUCE: rd_all_reduce(a->nranks, a->rank, a->count, st, n); break;
  case COLL_COLL_BARRIER: rd_all_reduce(a->nranks, a->rank, 1, st, n); break;
  case COLL_COLL_ALL_GATHER:
    all_gather(a->nranks, a->rank, a->count, a->in_place, a->slice, st, n);
    break;
  default: return COLL_ERR_INVALID_ARG;
  }
  return COLL_OK;
}

coll_result coll_rhd_plan(const coll_plan_args *a, coll_step *st, size_t *n) {
  *n = 0;
  if (a->nranks < 2) return COLL_ERR_INVALID_ARG;
  switch (a->coll) {
  case COLL_COLL_ALL_REDUCE: rhd_all_reduce(a->nranks, a->rank, a->count, a->slice, st, n); break;
  case COLL_COLL_ALL_GATHER:
    all_gather(a->nranks, a->rank, a->count, a->in_place, a->slice, st, n);
    break;
  default: return COLL_ERR_INVALID_ARG;
  }
  return COLL_OK;
}

/* ---- costs ---------------------------------------------------------------------- */

static coll_result cost(bool rhd, coll_coll_kind coll, int p, double n, double alpha, double beta,
                        double gamma, double *seconds, char *formula, size_t formula_len) {
  if (p < 1 || n < 0) return COLL_ERR_INVALID_ARG;
  bool ok = coll == COLL_COLL_ALL_REDUCE || coll == COLL_COLL_ALL_GATHER ||
            (!rhd && coll == COLL_COLL_BARRIER);
  if (!ok) return COLL_ERR_INVALID_ARG;
  if (p == 1) {
    *seconds = 0;
    snprintf(formula, formula_len, "one rank: a local copy, no messages");
    return COLL_OK;
  }
  int K = floor_log2(p), pp = 1 << K, f = p != pp;
  double lat, bytes, red; /* latency terms, bytes sent on the critical path, bytes reduced */
  const char *shape;
  if (coll == COLL_COLL_ALL_GATHER) {
    lat = K + 2 * f, red = 0;
    bytes = ((double)(pp - 1) / pp + f * (1 + 1.0 / p)) * n;
    shape = "(K+2f)*a + ((p'-1)/p' + f(1+1/p))*n*b";
  } else if (coll == COLL_COLL_BARRIER) {
    lat = K + 2 * f, bytes = 0, red = 0;
    shape = "(K+2f)*a";
  } else if (!rhd) {
    lat = K + 2 * f, bytes = (K + 2 * f) * n, red = (K + f) * n;
    shape = "(K+2f)*a + (K+2f)*n*b + (K+f)*n*g";
  } else {
    lat = 2 * K + 2 * f;
    bytes = (2.0 * (pp - 1) / pp + 2 * f) * n;
    red = ((double)(pp - 1) / pp + f) * n;
    shape = "(2K+2f)*a + (2(p'-1)/p' + 2f)*n*b + ((p'-1)/p' + f)*n*g";
  }
  *seconds = lat * alpha + bytes * beta + red * gamma;
  snprintf(formula, formula_len,
           "%s with p=%d, p'=%d, K=%d, f=%d, n=%.0f B: %.0f*%.3f us + %.0f B*%.4f ns/B + "
           "%.0f B*%.4f ns/B = %.2f us",
           shape, p, pp, K, f, n, lat, alpha * 1e6, bytes, beta * 1e9, red, gamma * 1e9,
           *seconds * 1e6);
  return COLL_OK;
}

/* The phases pipeline: slices change nothing in this model. */
coll_result coll_rd_cost(coll_coll_kind coll, double n, const coll_cost_model *m, double *seconds,
                         char *formula, size_t formula_len) {
  return cost(false, coll, m->p, n, m->alpha, m->beta, m->gamma, seconds, formula, formula_len);
}

coll_result coll_rhd_cost(coll_coll_kind coll, double n, const coll_cost_model *m, double *seconds,
                          char *formula, size_t formula_len) {
  return cost(true, coll, m->p, n, m->alpha, m->beta, m->gamma, seconds, formula, formula_len);
}
