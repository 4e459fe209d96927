/* test_plan.c — invariants of every schedule, checked without starting a process.
 *
 * A small model of the executor runs all ranks' plans in one process: each directed
 * pair is a FIFO of CAP slices, each rank walks its plan round by round exactly as
 * executor.c does, and a rank may take its next slice only when the FIFO it reads has
 * data and the one it writes has room (a slot being read still counts as taken).  If at some point no rank can move and not all
 * are done, the schedule deadlocks.  Every message carries its length, so a send paired
 * with a receive of another length is caught.
 *
 * Values make double counting visible: rank r contributes (k << 32) + 4^r to element k.
 * A correct reduction of element k over N ranks is exactly (N·k << 32) + Σ 4^r: each
 * base-4 digit says how often that rank was counted (must be once) and the high half
 * says the contributions came from the same element index.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

typedef struct {
  uint64_t *data;
  size_t n;
  uint64_t tick; /* the sweep that sent it (tick mode: visible from the next one) */
} msg;

typedef struct {
  msg *q;
  size_t head, tail, cap;
} fifo;

typedef struct {
  coll_step *steps;
  size_t nsteps, round, idx, rounds;
  uint64_t *bufs[2];
  bool done;
} rank_state;

/* Rank r's element k: the index in the high bits, one base-4 digit per rank below. */
#define HI 40
/* A division (AVG's `final`) adds this: it must happen once, after every addition. */
#define DIVIDED (1ull << 36)
#define DIV_MASK (15ull << 36)
static uint64_t contrib(int r, size_t k) { return ((uint64_t)k << HI) + (1ull << (2 * r)); }
static uint64_t digits(int n) { uint64_t s = 0; for (int r = 0; r < n; r++) s += 1ull << (2 * r); return s; }

typedef struct {
  coll_coll_kind coll;
  coll_algo algo;
  int n, root, in_place;
  size_t count, slice, cap;
  bool tick_mode;   /* one step-slice per rank per sweep, messages seen a sweep later */
  bool zero_delays; /* run the plans with every delay cleared (to measure what delays buy) */
} sim_case;

static bool reads_src(coll_step_kind k) {
  return k == COLL_STEP_COPY || k == COLL_STEP_SEND || k == COLL_STEP_RECV_REDUCE_SEND ||
         k == COLL_STEP_RECV_REDUCE_COPY || k == COLL_STEP_RECV_REDUCE_COPY_SEND ||
         k == COLL_STEP_RECV2_REDUCE_SEND;
}
static bool writes_dst(coll_step_kind k) {
  return k == COLL_STEP_COPY || k == COLL_STEP_RECV || k == COLL_STEP_RECV_COPY_SEND ||
         k == COLL_STEP_RECV_REDUCE_COPY || k == COLL_STEP_RECV_REDUCE_COPY_SEND;
}

static uint64_t add_checked(uint64_t a, uint64_t b, const sim_case *c, int r) {
  if ((a | b) & DIV_MASK)
    cr_assert_fail("%s/%s n=%d count=%zu: rank %d adds to a value already divided",
                   coll_algo_name(c->algo), coll_coll_name(c->coll), c->n, c->count, r);
  return a + b;
}

/* Runs every rank's plan; returns the number of sweeps (ticks in tick mode). */
static uint64_t run_sim(const sim_case *c) {
  int n = c->n;
  size_t cnt = c->count, maxs = coll_plan_max_steps(n);
  size_t send_len = cnt, recv_len = cnt;
  if (c->coll == COLL_COLL_REDUCE_SCATTER) send_len = cnt * (size_t)n;
  if (c->coll == COLL_COLL_ALL_GATHER) recv_len = cnt * (size_t)n;
  bool reducing = c->coll == COLL_COLL_ALL_REDUCE || c->coll == COLL_COLL_REDUCE ||
                  c->coll == COLL_COLL_REDUCE_SCATTER;
  rank_state *rs = calloc((size_t)n, sizeof *rs);
  fifo *fq = calloc((size_t)n * (size_t)n, sizeof *fq);
  uint64_t **store = calloc((size_t)n * 2, sizeof *store);
  for (int r = 0; r < n; r++) {
    /* +1 so a zero count still gets a distinct pointer */
    store[2 * r] = calloc(send_len + 1, 8);
    store[2 * r + 1] = calloc(recv_len + 1, 8);
    uint64_t *s = store[2 * r], *d = store[2 * r + 1];
    if (c->in_place) {
      if (c->coll == COLL_COLL_REDUCE_SCATTER) { s = store[2 * r]; d = s + (size_t)r * cnt; }
      else if (c->coll == COLL_COLL_ALL_GATHER) { d = store[2 * r + 1]; s = d + (size_t)r * cnt; }
      else s = d;
    }
    /* Garbage first, then the contributions: when the buffers alias (in place) the
     * contributions win exactly where the API says the input lives. */
    size_t sl = c->coll == COLL_COLL_REDUCE_SCATTER ? send_len : cnt;
    for (size_t k = 0; k < recv_len; k++) d[k] = 0xdeadbeefdeadbeefull;
    for (size_t k = 0; k < sl; k++) s[k] = contrib(r, k);
    rs[r].bufs[COLL_BUF_SEND] = s;
    rs[r].bufs[COLL_BUF_RECV] = d;
    rs[r].steps = calloc(maxs, sizeof(coll_step));
    coll_plan_args a = {.coll = c->coll, .algo = c->algo, .count = cnt, .nranks = n,
                        .rank = r, .root = c->root, .in_place = c->in_place, .slice = c->slice};
    cr_assert_eq(coll_plan_build(&a, rs[r].steps, &rs[r].nsteps), COLL_OK);
    cr_assert_leq(rs[r].nsteps, maxs);
    for (size_t i = 0; i < rs[r].nsteps; i++) {
      coll_step *st = &rs[r].steps[i];
      if (c->zero_delays) st->delay = 0;
      cr_assert_gt(st->count, 0, "zero-length steps are left out");
      size_t k = (st->count + c->slice - 1) / c->slice + st->delay;
      if (k > rs[r].rounds) rs[r].rounds = k;
      /* Ranges stay inside the buffers. */
      size_t slen = st->src_buf == COLL_BUF_SEND ? (c->coll == COLL_COLL_REDUCE_SCATTER ? send_len : cnt) : recv_len;
      size_t dlen = st->dst_buf == COLL_BUF_SEND ? send_len : recv_len;
      if (reads_src(st->kind)) cr_assert_leq(st->src_off + st->count, slen, "src range in bounds");
      if (writes_dst(st->kind)) cr_assert_leq(st->dst_off + st->count, dlen, "dst range in bounds");
      /* A reduce's non-root ranks have no receive buffer (the API passes NULL). */
      if (c->coll == COLL_COLL_REDUCE && r != c->root) {
        cr_assert(!(reads_src(st->kind) && st->src_buf == COLL_BUF_RECV), "reduce: non-root reads recvbuf");
        cr_assert(!writes_dst(st->kind), "reduce: non-root writes recvbuf");
      }
      int peers[3] = {st->peer_in, st->peer_out,
                      st->kind == COLL_STEP_RECV2_REDUCE_SEND ? st->peer_in2 : -1};
      for (int q = 0; q < 3; q++) cr_assert(peers[q] < n && peers[q] != r, "peer in range");
    }
    rs[r].done = rs[r].rounds == 0;
  }
  for (size_t i = 0; i < (size_t)n * (size_t)n; i++) {
    fq[i].cap = c->cap;
    fq[i].q = calloc(c->cap, sizeof(msg));
    /* A slot never holds more than a slice nor more than the largest buffer. */
    size_t most = send_len > recv_len ? send_len : recv_len;
    for (size_t k = 0; k < c->cap; k++)
      fq[i].q[k].data = malloc((c->slice < most ? c->slice : most) * 8 + 8);
  }
  uint64_t *tmp = calloc(c->slice < send_len + 1 ? c->slice : send_len + 1, 8);
  int remaining = 0;
  for (int r = 0; r < n; r++) remaining += !rs[r].done;
  uint64_t now = 0;
  while (remaining > 0) {
    bool moved = false;
    now++;
    for (int r = 0; r < n; r++) {
      rank_state *s = &rs[r];
      while (!s->done) {
        const coll_step *st = &s->steps[s->idx];
        bool active = s->round >= st->delay && (s->round - st->delay) * c->slice < st->count;
        if (active) {
          size_t off = (s->round - st->delay) * c->slice;
          size_t m = st->count - off < c->slice ? st->count - off : c->slice;
          fifo *in = st->peer_in >= 0 ? &fq[st->peer_in * n + r] : NULL;
          fifo *in2 = st->kind == COLL_STEP_RECV2_REDUCE_SEND ? &fq[st->peer_in2 * n + r] : NULL;
          fifo *out = st->peer_out >= 0 ? &fq[r * n + st->peer_out] : NULL;
          fifo *ins[2] = {in, in2};
          bool ready = true;
          for (int q = 0; q < 2; q++)
            if (ins[q] && (ins[q]->head == ins[q]->tail ||
                           (c->tick_mode && ins[q]->q[ins[q]->head % ins[q]->cap].tick >= now)))
              ready = false; /* nothing (yet) to read */
          if (out && out->tail - out->head == out->cap) ready = false; /* no room */
          if (!ready) break;
          uint64_t *src = s->bufs[st->src_buf] + st->src_off + off;
          uint64_t *dst = s->bufs[st->dst_buf] + st->dst_off + off;
          const uint64_t *got[2] = {NULL, NULL};
          for (int q = 0; q < 2; q++) {
            if (!ins[q]) continue;
            msg *mm = &ins[q]->q[ins[q]->head % ins[q]->cap];
            if (mm->n != m)
              cr_assert_fail("%s/%s n=%d: rank %d step %zu (%s) got %zu elements, expected %zu",
                             coll_algo_name(c->algo), coll_coll_name(c->coll), n, r, s->idx,
                             coll_step_name(st->kind), mm->n, m);
            got[q] = mm->data;
          }
          bool divide = st->final && n > 1;
          const uint64_t *result = NULL;
          switch (st->kind) {
          case COLL_STEP_COPY: memmove(dst, src, m * 8); break;
          case COLL_STEP_SEND: result = src; break;
          case COLL_STEP_RECV: memcpy(dst, got[0], m * 8); break;
          case COLL_STEP_RECV_COPY_SEND: memcpy(dst, got[0], m * 8); result = dst; break;
          case COLL_STEP_RECV_REDUCE_SEND:
            for (size_t k = 0; k < m; k++) tmp[k] = add_checked(got[0][k], src[k], c, r);
            result = tmp;
            break;
          case COLL_STEP_RECV2_REDUCE_SEND:
            for (size_t k = 0; k < m; k++)
              tmp[k] = add_checked(add_checked(got[0][k], src[k], c, r), got[1][k], c, r);
            result = tmp;
            break;
          case COLL_STEP_RECV_REDUCE_COPY:
          case COLL_STEP_RECV_REDUCE_COPY_SEND:
            for (size_t k = 0; k < m; k++)
              dst[k] = add_checked(got[0][k], src[k], c, r) + (divide ? DIVIDED : 0);
            result = st->kind == COLL_STEP_RECV_REDUCE_COPY_SEND ? dst : NULL;
            break;
          }
          for (int q = 0; q < 2; q++)
            if (ins[q]) ins[q]->head++;
          if (out) {
            msg *mm = &out->q[out->tail % out->cap];
            memcpy(mm->data, result, m * 8);
            mm->n = m;
            mm->tick = now;
            out->tail++;
          }
          moved = true;
        }
        if (++s->idx == s->nsteps) {
          s->idx = 0;
          if (++s->round == s->rounds) {
            s->done = true;
            remaining--;
          }
        }
        if (active && c->tick_mode) break;
      }
    }
    /* Nothing moved: nothing was sent either, so the next sweep would see the same. */
    if (!moved)
      cr_assert_fail("deadlock: %s/%s n=%d count=%zu root=%d slice=%zu cap=%zu",
                     coll_algo_name(c->algo), coll_coll_name(c->coll), n, cnt, c->root, c->slice,
                     c->cap);
  }
  for (size_t i = 0; i < (size_t)n * (size_t)n; i++) {
    if (fq[i].head != fq[i].tail) cr_assert_fail("unreceived message from %zu to %zu", i / (size_t)n,
                 i % (size_t)n);
    for (size_t k = 0; k < c->cap; k++) free(fq[i].q[k].data);
    free(fq[i].q);
  }
  /* Check results: AVG divides once where the result is reduced over several ranks. */
  uint64_t all = digits(n) + (reducing && n > 1 ? DIVIDED : 0);
  for (int r = 0; r < n; r++) {
    const uint64_t *d = rs[r].bufs[COLL_BUF_RECV];
    for (size_t k = 0; k < recv_len; k++) {
      uint64_t want;
      switch (c->coll) {
      case COLL_COLL_ALL_REDUCE: want = ((uint64_t)n * k << HI) + all; break;
      case COLL_COLL_REDUCE:
        if (r != c->root) continue;
        want = ((uint64_t)n * k << HI) + all;
        break;
      case COLL_COLL_BROADCAST: want = contrib(c->root, k); break;
      case COLL_COLL_REDUCE_SCATTER: want = ((uint64_t)n * ((size_t)r * cnt + k) << HI) + all; break;
      case COLL_COLL_ALL_GATHER: want = contrib((int)(k / cnt), k % cnt); break;
      default: want = 0;
      }
      if (d[k] != want)
        cr_assert_fail("%s/%s n=%d count=%zu root=%d in_place=%d slice=%zu: rank %d element %zu "
                       "is %#llx, want %#llx", coll_algo_name(c->algo), coll_coll_name(c->coll),
                       n, cnt, c->root, c->in_place, c->slice, r, k, (unsigned long long)d[k],
                       (unsigned long long)want);
    }
  }
  for (int r = 0; r < 2 * n; r++) free(store[r]);
  for (int r = 0; r < n; r++) free(rs[r].steps);
  free(store);
  free(tmp);
  free(rs);
  free(fq);
  return now;
}

static const coll_coll_kind colls[] = {COLL_COLL_ALL_REDUCE, COLL_COLL_REDUCE_SCATTER,
                                       COLL_COLL_ALL_GATHER, COLL_COLL_BROADCAST,
                                       COLL_COLL_REDUCE};

/* Every collective `algo` serves (the others fall back to the ring, tested as the ring),
 * every root, in place and not. */
static void sweep_algo(coll_algo algo, int n, size_t count, size_t slice, size_t cap) {
  for (size_t ci = 0; ci < sizeof colls / sizeof *colls; ci++) {
    if (n > 1 && !coll_algo_serves(algo, colls[ci], n)) continue;
    bool rooted = colls[ci] == COLL_COLL_BROADCAST || colls[ci] == COLL_COLL_REDUCE;
    for (int root = 0; root < (rooted ? n : 1); root++)
      for (int ip = 0; ip < 2; ip++) {
        sim_case c = {.coll = colls[ci], .algo = algo, .n = n, .root = root, .in_place = ip,
                      .count = count, .slice = slice, .cap = cap};
        run_sim(&c);
      }
  }
}

static void sweep(int n, size_t count, size_t slice, size_t cap) {
  sweep_algo(COLL_ALGO_RING, n, count, slice, cap);
}

Test(plan, small_counts_all_n) {
  const size_t primes[] = {2, 3, 5, 7, 11, 13, 17, 31, 61, 127};
  for (int n = 1; n <= 16; n++) {
    size_t counts[6 + sizeof primes / sizeof *primes];
    size_t nc = 0;
    counts[nc++] = 0;
    counts[nc++] = 1;
    counts[nc++] = (size_t)n - 1;
    counts[nc++] = (size_t)n;
    counts[nc++] = (size_t)n + 1;
    counts[nc++] = 3 * (size_t)n + 2;
    for (size_t i = 0; i < sizeof primes / sizeof *primes; i++) counts[nc++] = primes[i];
    for (size_t i = 0; i < nc; i++) {
      /* One element per slice and two slots: the strictest the executor allows (with a
       * single slot two ring neighbours can each hold the other's only slot). */
      sweep(n, counts[i], 1, 2);
      sweep(n, counts[i], 3, 2);
      sweep(n, counts[i], 1000, 8);
    }
  }
}

Test(plan, a_million_and_three, .timeout = 240) {
  for (int n = 1; n <= 16; n++) {
    /* all-reduce/broadcast/reduce: count is the whole vector; reduce-scatter/all-gather:
     * the per-rank count is chosen so the whole buffer is about 1M+3 elements too. */
    size_t big = 1000003;
    for (size_t ci = 0; ci < sizeof colls / sizeof *colls; ci++) {
      coll_coll_kind k = colls[ci];
      size_t cnt = (k == COLL_COLL_REDUCE_SCATTER || k == COLL_COLL_ALL_GATHER) ? big / (size_t)n + 1 : big;
      sim_case c = {.coll = k, .n = n, .root = n / 2, .in_place = n % 2, .count = cnt,
                    .slice = 16384, .cap = 4};
      run_sim(&c);
    }
  }
}

Test(plan, ring_chunks_cover_exactly) {
  for (int n = 1; n <= 16; n++)
    for (size_t count = 0; count < 100; count++) {
      size_t next = 0;
      for (int i = 0; i < n; i++) {
        size_t off, len;
        coll_ring_chunk(count, n, i, &off, &len);
        cr_assert_eq(off, next);
        cr_assert(len == count / (size_t)n || len == count / (size_t)n + 1);
        next = off + len;
      }
      cr_assert_eq(next, count);
    }
}

Test(plan, every_rank_sends_the_bandwidth_bound) {
  /* Ring all-reduce: each rank sends exactly 2(N-1)/N of the data (to within the
   * chunk rounding): the number the trace output teaches. */
  for (int n = 2; n <= 16; n++) {
    size_t count = 1000 * (size_t)n;
    for (int r = 0; r < n; r++) {
      coll_step st[64];
      size_t ns;
      coll_plan_args a = {.coll = COLL_COLL_ALL_REDUCE, .count = count, .nranks = n, .rank = r};
      cr_assert_eq(coll_plan_build(&a, st, &ns), COLL_OK);
      size_t sent = 0;
      for (size_t i = 0; i < ns; i++)
        if (st[i].peer_out >= 0) sent += st[i].count;
      cr_assert_eq(sent, 2 * (size_t)(n - 1) * count / (size_t)n);
    }
  }
}

Test(plan, refuses_bad_arguments) {
  coll_step st[64];
  size_t ns;
  coll_plan_args a = {.coll = COLL_COLL_BROADCAST, .count = 4, .nranks = 4, .rank = 0, .root = 4};
  cr_assert_eq(coll_plan_build(&a, st, &ns), COLL_ERR_INVALID_ARG);
  a.root = -1;
  cr_assert_eq(coll_plan_build(&a, st, &ns), COLL_ERR_INVALID_ARG);
  a = (coll_plan_args){.coll = COLL_COLL_SEND, .count = 4, .nranks = 4, .rank = 2, .root = 2};
  cr_assert_eq(coll_plan_build(&a, st, &ns), COLL_ERR_INVALID_ARG);
  a = (coll_plan_args){.coll = COLL_COLL_ALL_REDUCE, .count = 4, .nranks = 4, .rank = 4};
  cr_assert_eq(coll_plan_build(&a, st, &ns), COLL_ERR_INVALID_ARG);
}

Test(plan, send_recv_pair) {
  coll_step st[8];
  size_t ns;
  coll_plan_args a = {.coll = COLL_COLL_SEND, .count = 7, .nranks = 3, .rank = 0, .root = 2};
  cr_assert_eq(coll_plan_build(&a, st, &ns), COLL_OK);
  cr_assert_eq(ns, 1);
  cr_assert_eq(st[0].kind, COLL_STEP_SEND);
  cr_assert_eq(st[0].peer_out, 2);
  a.coll = COLL_COLL_RECV;
  a.rank = 2;
  a.root = 0;
  cr_assert_eq(coll_plan_build(&a, st, &ns), COLL_OK);
  cr_assert_eq(st[0].kind, COLL_STEP_RECV);
  cr_assert_eq(st[0].peer_in, 0);
  cr_assert_eq(st[0].count, 7);
}
