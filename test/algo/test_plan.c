/* test_plan.c — invariants of every schedule, checked without starting a process.
 *
 * A small model of the executor runs all ranks' plans in one process: each directed
 * pair is a FIFO of CAP slices, each rank walks its plan round by round exactly as
 * executor.c does, and a rank may take its next slice only when the FIFO it reads has
 * data and the one it writes has room (a slot being read still counts as taken).  If at some point
 * no rank can move and not all are done, the schedule deadlocks.  Every message carries its length,
 * so a send paired with a receive of another length is caught.
 *
 * Values make double counting visible: rank r contributes (k << 32) + 4^r to element k.
 * A correct reduction of element k over N ranks is exactly (N·k << 32) + Σ 4^r: each
 * base-4 digit says how often that rank was counted (must be once) and the high half
 * says the contributions came from the same element index.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "algo.h"
#include "coll_test.h"
#include "plan.h"
#include "tree.h"

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
static uint64_t digits(int n) {
  uint64_t s = 0;
  for (int r = 0; r < n; r++) s += 1ull << (2 * r);
  return s;
}

typedef struct {
  coll_coll_kind coll;
  coll_algo algo;
  int n, root, in_place;
  size_t count, slice, cap;
  bool tick_mode;          /* one step-slice per rank per sweep, messages seen `latency` later */
  uint64_t latency;        /* tick mode: sweeps before a message can be read (0 means 1) */
  bool zero_delays;        /* run the plans with every delay cleared (to measure what delays buy) */
  const coll_hosts *hosts; /* the host layout host-aware plans read (hier), NULL: none */
  /* all_to_allv: per rank, its sendcounts, sdispls, recvcounts, rdispls (n each, one
   * after the other) */
  size_t *const *v;
} sim_case;

/* Buffer lengths (elements) rank r's call uses, as the API defines them. */
static void buf_lens(const sim_case *c, int r, size_t *send_len, size_t *recv_len) {
  size_t cnt = c->count, n = (size_t)c->n;
  *send_len = *recv_len = cnt;
  switch (c->coll) {
  case COLL_COLL_REDUCE_SCATTER: *send_len = cnt * n; break;
  case COLL_COLL_ALL_GATHER: *recv_len = cnt * n; break;
  case COLL_COLL_ALL_TO_ALL: *send_len = *recv_len = cnt * n; break;
  case COLL_COLL_GATHER: *recv_len = cnt * n; break;
  case COLL_COLL_SCATTER: *send_len = cnt * n; break;
  case COLL_COLL_ALL_TO_ALLV: {
    const size_t *v = c->v[r];
    *send_len = *recv_len = 0;
    for (size_t q = 0; q < n; q++) {
      if (v[q] && v[n + q] + v[q] > *send_len) *send_len = v[n + q] + v[q];
      if (v[2 * n + q] && v[3 * n + q] + v[2 * n + q] > *recv_len)
        *recv_len = v[3 * n + q] + v[2 * n + q];
    }
    break;
  }
  default: break;
  }
}

/* The value rank r's receive buffer must hold at element k of the newer collectives
 * (0xdeadbeef...: untouched). */
static uint64_t moved_expected(const sim_case *c, int r, size_t k) {
  size_t cnt = c->count, n = (size_t)c->n;
  switch (c->coll) {
  case COLL_COLL_ALL_TO_ALL: return contrib((int)(k / cnt), (size_t)r * cnt + k % cnt);
  case COLL_COLL_GATHER: return contrib((int)(k / cnt), k % cnt);
  case COLL_COLL_SCATTER: return contrib(c->root, (size_t)r * cnt + k);
  case COLL_COLL_ALL_TO_ALLV:
    for (size_t q = 0; q < n; q++) {
      const size_t *mine = c->v[r], *theirs = c->v[q];
      if (k >= mine[3 * n + q] && k < mine[3 * n + q] + mine[2 * n + q])
        return contrib((int)q, theirs[n + (size_t)r] + (k - mine[3 * n + q]));
    }
    return 0xdeadbeefdeadbeefull;
  default: return 0;
  }
}

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
  if (n < 1) cr_assert_fail("a case needs at least one rank, has %d", n);
  size_t cnt = c->count, maxs = coll_plan_max_steps(n);
  size_t send_len = 0, recv_len = 0; /* the largest of any rank */
  for (int r = 0; r < n; r++) {
    size_t sl, rl;
    buf_lens(c, r, &sl, &rl);
    if (sl > send_len) send_len = sl;
    if (rl > recv_len) recv_len = rl;
  }
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
      if (c->coll == COLL_COLL_REDUCE_SCATTER) {
        s = store[2 * r];
        d = s + (size_t)r * cnt;
      } else if (c->coll == COLL_COLL_ALL_GATHER) {
        d = store[2 * r + 1];
        s = d + (size_t)r * cnt;
      } else if (c->coll == COLL_COLL_GATHER) {
        if (r == c->root) {
          d = store[2 * r + 1];
          s = d + (size_t)r * cnt;
        }
      } else if (c->coll == COLL_COLL_SCATTER) {
        if (r == c->root) {
          s = store[2 * r];
          d = s + (size_t)r * cnt;
        }
      } else
        s = d;
    }
    /* Garbage first, then the contributions: when the buffers alias (in place) the
     * contributions win exactly where the API says the input lives. */
    size_t sl, rl;
    buf_lens(c, r, &sl, &rl);
    if (c->coll == COLL_COLL_SCATTER && r != c->root) sl = 0; /* not read */
    for (size_t k = 0; k < rl; k++) d[k] = 0xdeadbeefdeadbeefull;
    for (size_t k = 0; k < sl; k++) s[k] = contrib(r, k);
    rs[r].bufs[COLL_BUF_SEND] = s;
    rs[r].bufs[COLL_BUF_RECV] = d;
    rs[r].steps = calloc(maxs, sizeof(coll_step));
    coll_plan_args a = {.coll = c->coll,
                        .algo = c->algo,
                        .count = cnt,
                        .nranks = n,
                        .rank = r,
                        .root = c->root,
                        .in_place = c->in_place,
                        .hosts = c->hosts,
                        .slice = c->slice};
    if (c->coll == COLL_COLL_ALL_TO_ALLV) {
      a.sendcounts = c->v[r], a.sdispls = c->v[r] + n, a.recvcounts = c->v[r] + 2 * n;
      a.rdispls = c->v[r] + 3 * n;
    }
    if ((c->coll == COLL_COLL_GATHER || c->coll == COLL_COLL_SCATTER) && r != c->root)
      a.in_place = 0; /* only the root can be in place */
    cr_assert_eq(coll_plan_build(&a, rs[r].steps, &rs[r].nsteps), COLL_OK);
    cr_assert_leq(rs[r].nsteps, maxs);
    for (size_t i = 0; i < rs[r].nsteps; i++) {
      coll_step *st = &rs[r].steps[i];
      if (c->zero_delays) st->delay = 0;
      cr_assert_gt(st->count, 0, "zero-length steps are left out");
      size_t k = (st->count + c->slice - 1) / c->slice + st->delay;
      if (k > rs[r].rounds) rs[r].rounds = k;
      /* Ranges stay inside the buffers. */
      size_t slen = st->src_buf == COLL_BUF_SEND ? sl : rl;
      size_t dlen = st->dst_buf == COLL_BUF_SEND ? sl : rl;
      if (c->in_place && c->coll == COLL_COLL_ALL_TO_ALL) slen = dlen = rl;
      if (reads_src(st->kind)) cr_assert_leq(st->src_off + st->count, slen, "src range in bounds");
      if (writes_dst(st->kind)) cr_assert_leq(st->dst_off + st->count, dlen, "dst range in bounds");
      /* A reduce's non-root ranks have no receive buffer (the API passes NULL). */
      if ((c->coll == COLL_COLL_REDUCE || c->coll == COLL_COLL_GATHER) && r != c->root) {
        cr_assert(!(reads_src(st->kind) && st->src_buf == COLL_BUF_RECV), "non-root reads recvbuf");
        cr_assert(!writes_dst(st->kind), "non-root writes recvbuf");
      }
      if (c->coll == COLL_COLL_SCATTER && r != c->root)
        cr_assert(!reads_src(st->kind) || st->src_buf != COLL_BUF_SEND, "non-root reads sendbuf");
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
                           (c->tick_mode && ins[q]->q[ins[q]->head % ins[q]->cap].tick +
                                                    (c->latency ? c->latency : 1) >
                                                now)))
              ready = false;                                           /* nothing (yet) to read */
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
          case COLL_STEP_RECV_COPY_SEND:
            memcpy(dst, got[0], m * 8);
            result = dst;
            break;
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
        moved = true; /* an idle slot of the round passed: progress too */
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
    /* Nothing moved and nothing in flight: the next sweep would see the same. */
    for (size_t i = 0; c->tick_mode && !moved && i < (size_t)n * (size_t)n; i++)
      if (fq[i].head != fq[i].tail &&
          fq[i].q[fq[i].head % fq[i].cap].tick + (c->latency ? c->latency : 1) > now)
        moved = true;
    if (!moved && getenv("SIM_DEBUG")) {
      for (int r = 0; r < n; r++)
        fprintf(stderr, "rank %d round %zu idx %zu done %d\n", r, rs[r].round, rs[r].idx,
                rs[r].done);
      for (int i = 0; i < n * n; i++)
        if (fq[i].tail != fq[i].head)
          fprintf(stderr, "fifo %d->%d holds %zu\n", i / n, i % n, fq[i].tail - fq[i].head);
    }
    if (!moved)
      cr_assert_fail("deadlock: %s/%s n=%d count=%zu root=%d slice=%zu cap=%zu",
                     coll_algo_name(c->algo), coll_coll_name(c->coll), n, cnt, c->root, c->slice,
                     c->cap);
  }
  for (size_t i = 0; i < (size_t)n * (size_t)n; i++) {
    if (fq[i].head != fq[i].tail)
      cr_assert_fail("unreceived message from %zu to %zu", i / (size_t)n, i % (size_t)n);
    for (size_t k = 0; k < c->cap; k++) free(fq[i].q[k].data);
    free(fq[i].q);
  }
  /* Check results: AVG divides once where the result is reduced over several ranks. */
  uint64_t all = digits(n) + (reducing && n > 1 ? DIVIDED : 0);
  for (int r = 0; r < n; r++) {
    const uint64_t *d = rs[r].bufs[COLL_BUF_RECV];
    size_t sl, rl;
    buf_lens(c, r, &sl, &rl);
    for (size_t k = 0; k < rl; k++) {
      uint64_t want;
      switch (c->coll) {
      case COLL_COLL_GATHER:
        if (r != c->root) continue;
        want = moved_expected(c, r, k);
        break;
      case COLL_COLL_ALL_TO_ALL:
      case COLL_COLL_ALL_TO_ALLV:
      case COLL_COLL_SCATTER: want = moved_expected(c, r, k); break;
      case COLL_COLL_ALL_REDUCE: want = ((uint64_t)n * k << HI) + all; break;
      case COLL_COLL_REDUCE:
        if (r != c->root) continue;
        want = ((uint64_t)n * k << HI) + all;
        break;
      case COLL_COLL_BROADCAST: want = contrib(c->root, k); break;
      case COLL_COLL_REDUCE_SCATTER:
        want = ((uint64_t)n * ((size_t)r * cnt + k) << HI) + all;
        break;
      case COLL_COLL_ALL_GATHER: want = contrib((int)(k / cnt), k % cnt); break;
      default: want = 0;
      }
      if (d[k] != want)
        cr_assert_fail("%s/%s n=%d count=%zu root=%d in_place=%d slice=%zu: rank %d element %zu "
                       "is %#llx, want %#llx",
                       coll_algo_name(c->algo), coll_coll_name(c->coll), n, cnt, c->root,
                       c->in_place, c->slice, r, k, (unsigned long long)d[k],
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
                                       COLL_COLL_ALL_GATHER, COLL_COLL_BROADCAST, COLL_COLL_REDUCE};

/* Every collective `algo` serves (the others fall back to the ring, tested as the ring),
 * every root, in place and not. */
static void sweep_algo(coll_algo algo, int n, size_t count, size_t slice, size_t cap) {
  for (size_t ci = 0; ci < sizeof colls / sizeof *colls; ci++) {
    if (n > 1 && !coll_algo_serves(algo, colls[ci], n)) continue;
    bool rooted = colls[ci] == COLL_COLL_BROADCAST || colls[ci] == COLL_COLL_REDUCE;
    for (int root = 0; root < (rooted ? n : 1); root++)
      for (int ip = 0; ip < 2; ip++) {
        sim_case c = {.coll = colls[ci],
                      .algo = algo,
                      .n = n,
                      .root = root,
                      .in_place = ip,
                      .count = count,
                      .slice = slice,
                      .cap = cap};
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
       * single slot two ring neighbours can each hold the other's only slot).  Two ranks'
       * all-reduce runs each phase a round behind the last (ring.c, "Lead"), which leaves
       * up to 4 slices in a FIFO: it needs 4 slots, as many as the smallest transport's. */
      size_t cap = n == 2 ? 4 : 2;
      sweep(n, counts[i], 1, cap);
      sweep(n, counts[i], 3, cap);
      sweep(n, counts[i], 1000, 8);
    }
  }
}

/* A million and three elements: many slices of 16384 through FIFOs of 4 (4 a chunk at
 * N = 16), a count no slice or chunk divides.  Under ASan+UBSan 550,007 (still 3 slices
 * a chunk at N = 16, still indivisible); the plain build runs the million. */
#define BIG (T_SANITIZED ? (size_t)550007 : (size_t)1000003)

Test(plan, a_million_and_three, .timeout = 240) {
  for (int n = 1; n <= 16; n++) {
    /* all-reduce/broadcast/reduce: count is the whole vector; reduce-scatter/all-gather:
     * the per-rank count is chosen so the whole buffer is about 1M+3 elements too. */
    size_t big = BIG;
    for (size_t ci = 0; ci < sizeof colls / sizeof *colls; ci++) {
      coll_coll_kind k = colls[ci];
      size_t cnt = (k == COLL_COLL_REDUCE_SCATTER || k == COLL_COLL_ALL_GATHER)
                       ? big / (size_t)n + 1
                       : big;
      sim_case c = {.coll = k,
                    .n = n,
                    .root = n / 2,
                    .in_place = n % 2,
                    .count = cnt,
                    .slice = 16384,
                    .cap = 4};
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

/* ---- tree, rd, rhd ---------------------------------------------------------------- */

static void counts_for(int n, size_t *counts, size_t *nc) {
  const size_t primes[] = {2, 3, 5, 7, 13, 31, 61, 127};
  *nc = 0;
  counts[(*nc)++] = 0;
  counts[(*nc)++] = 1;
  counts[(*nc)++] = (size_t)n - 1;
  counts[(*nc)++] = (size_t)n;
  counts[(*nc)++] = (size_t)n + 1;
  counts[(*nc)++] = 3 * (size_t)n + 2;
  for (size_t i = 0; i < sizeof primes / sizeof *primes; i++) counts[(*nc)++] = primes[i];
}

/* N = 1..17, small counts, slices of 1, 3 and 1000 elements, FIFOs of min_cap to 8
 * slots.  One schedule of the ranks suffices to prove a plan deadlock-free: a rank's
 * operations come in a fixed order and another rank's move can only make them more
 * possible (add data to its inputs, free room in its outputs), never less, so every
 * schedule reaches the same end (the network is confluent, as Kahn's are). */
static void algo_sweep(coll_algo algo, size_t min_cap) {
  for (int n = 1; n <= 17; n++) {
    size_t counts[16], nc;
    counts_for(n, counts, &nc);
    for (size_t i = 0; i < nc; i++) {
      sweep_algo(algo, n, counts[i], 1, min_cap);
      sweep_algo(algo, n, counts[i], 1, 4);
      sweep_algo(algo, n, counts[i], 3, min_cap);
      sweep_algo(algo, n, counts[i], 1000, 8);
    }
  }
}

/* The tree's skew lets a child run two rounds ahead of its parent: it needs FIFOs of 3
 * slots (shm has 8, tcp 4); with 2 the n = 2 tree (both trees on one link) deadlocks. */
Test(plan, tree_sweep, .timeout = 240) { algo_sweep(COLL_ALGO_TREE, 3); }
Test(plan, rd_sweep, .timeout = 240) { algo_sweep(COLL_ALGO_RD, 1); }
Test(plan, rhd_sweep, .timeout = 240) { algo_sweep(COLL_ALGO_RHD, 1); }

Test(plan, algos_a_million_and_three, .timeout = 240) {
  const coll_algo algos[] = {COLL_ALGO_TREE, COLL_ALGO_RD, COLL_ALGO_RHD};
  for (size_t ai = 0; ai < 3; ai++)
    for (int n = 2; n <= 17; n += (n < 9 ? 1 : 4)) {
      size_t big = BIG;
      for (size_t ci = 0; ci < sizeof colls / sizeof *colls; ci++) {
        coll_coll_kind k = colls[ci];
        if (!coll_algo_serves(algos[ai], k, n)) continue;
        size_t cnt = (k == COLL_COLL_REDUCE_SCATTER || k == COLL_COLL_ALL_GATHER)
                         ? big / (size_t)n + 1
                         : big;
        sim_case c = {.coll = k,
                      .algo = algos[ai],
                      .n = n,
                      .root = n / 2,
                      .in_place = n % 2,
                      .count = cnt,
                      .slice = 16384,
                      .cap = 4};
        run_sim(&c);
      }
    }
}

Test(plan, tree_shape) {
  /* Both trees span all ranks from the root, every link is seen from both ends, no rank
   * has more than two children, none is interior (has a child) in both trees but the
   * root, and no rank is deeper than the height. */
  for (int p = 2; p <= 70; p++)
    for (int root = 0; root < p; root += (p > 17 ? 7 : 1)) {
      int H = coll_tree_height(p);
      cr_assert_eq(H, 1 + (int)floor(log2(p - 1) + 1e-9), "p=%d", p);
      int interior[70] = {0};
      for (int t = 0; t < 2; t++) {
        int deepest = 0;
        for (int r = 0; r < p; r++) {
          int par, ch[2], d;
          coll_tree_node(p, root, t, r, &par, ch, &d);
          cr_assert_leq(d, H);
          if (d > deepest) deepest = d;
          cr_assert_eq(par < 0, r == root, "p=%d root=%d t=%d r=%d", p, root, t, r);
          if (ch[0] >= 0 && r != root) interior[r]++;
          if (r == root) cr_assert(ch[0] >= 0 && ch[1] < 0, "the root has one child");
          if (par >= 0) {
            int pp, pc[2], pd;
            coll_tree_node(p, root, t, par, &pp, pc, &pd);
            cr_assert(pc[0] == r || pc[1] == r, "p=%d t=%d: %d is not a child of its parent %d", p,
                      t, r, par);
            cr_assert_eq(pd, d - 1);
          }
          for (int i = 0; i < 2; i++)
            if (ch[i] >= 0) {
              int cp, cc[2], cd;
              coll_tree_node(p, root, t, ch[i], &cp, cc, &cd);
              cr_assert_eq(cp, r, "p=%d t=%d: child %d of %d names parent %d", p, t, ch[i], r, cp);
            }
        }
        cr_assert_eq(deepest, H, "p=%d: the height is reached", p);
      }
      for (int r = 0; r < p; r++)
        cr_assert_leq(interior[r], 1, "p=%d rank %d interior twice", p, r);
    }
}

Test(plan, tree_delays_decouple_up_and_down) {
  /* Tick mode with messages that take 10 sweeps to arrive (latency well above the work
   * of one slice): with its delays a tree all-reduce of k slices takes about 5k + a few
   * trips of the tree; with every delay cleared each round is a whole up-and-down trip
   * of the tree (2H·10 sweeps) and it takes several times as long. */
  for (int n = 2; n <= 17; n++) {
    size_t k = 200, H = (size_t)coll_tree_height(n);
    for (size_t cap = 4; cap <= 8; cap += 4) {
      sim_case c = {.coll = COLL_COLL_ALL_REDUCE,
                    .algo = COLL_ALGO_TREE,
                    .n = n,
                    .count = 2 * k,
                    .slice = 1,
                    .cap = cap,
                    .tick_mode = true,
                    .latency = 10};
      uint64_t with = run_sim(&c);
      c.zero_delays = true;
      uint64_t without = run_sim(&c);
      cr_log_info(
          "tree all-reduce n=%d H=%zu cap=%zu, %zu slices per tree: %llu sweeps with delays, "
          "%llu without",
          n, H, cap, k, (unsigned long long)with, (unsigned long long)without);
      cr_assert_lt(with, 11 * k + 4 * H * c.latency, "n=%d: %llu sweeps", n,
                   (unsigned long long)with);
      cr_assert_lt((n >= 5 ? 4 : 2) * with, without, "n=%d: delays buy little (%llu vs %llu)", n,
                   (unsigned long long)with, (unsigned long long)without);
    }
  }
}

Test(plan, forced_algo_that_cannot_serve_is_the_ring) {
  for (int n = 2; n <= 9; n++)
    for (int r = 0; r < n; r++) {
      coll_step a_st[64], b_st[64];
      size_t na, nb;
      coll_plan_args a = {.coll = COLL_COLL_REDUCE_SCATTER,
                          .algo = COLL_ALGO_TREE,
                          .count = 7,
                          .nranks = n,
                          .rank = r,
                          .slice = 4};
      coll_plan_args b = a;
      b.algo = COLL_ALGO_RING;
      cr_assert(!coll_algo_serves(COLL_ALGO_TREE, COLL_COLL_REDUCE_SCATTER, n));
      cr_assert_eq(coll_plan_build(&a, a_st, &na), COLL_OK);
      cr_assert_eq(coll_plan_build(&b, b_st, &nb), COLL_OK);
      cr_assert_eq(na, nb);
      cr_assert(memcmp(a_st, b_st, na * sizeof *a_st) == 0);
    }
}

Test(plan, algo_names_and_table) {
  const char *names[] = {"auto",   "ring",   "tree",     "rd",        "rhd",         "oneshot",
                         "direct", "mapped", "pairwise", "linear",    "dev_oneshot", "dev_twoshot",
                         "hier",   "fanout", "staged",   "dev_onegpu"};
  cr_assert_eq(sizeof names / sizeof *names, COLL_NUM_ALGOS);
  for (int a = 0; a < COLL_NUM_ALGOS; a++) {
    bool ok = false;
    cr_assert_str_eq(coll_algo_name((coll_algo)a), names[a]);
    cr_assert_eq(coll_algo_from_name(names[a], &ok), (coll_algo)a);
    cr_assert(ok);
  }
  bool ok = true;
  coll_algo_from_name("bogus", &ok);
  cr_assert(!ok);
  coll_algo_from_name(NULL, &ok);
  cr_assert(!ok);
  cr_assert_eq(coll_algo_from_name("rabenseifner", &ok), COLL_ALGO_RHD);
  cr_assert_eq(coll_algo_from_name("recursive_doubling", &ok), COLL_ALGO_RD);
  cr_assert(coll_algo_serves(COLL_ALGO_TREE, COLL_COLL_BROADCAST, 5));
  cr_assert(coll_algo_serves(COLL_ALGO_TREE, COLL_COLL_REDUCE, 5));
  cr_assert(coll_algo_serves(COLL_ALGO_TREE, COLL_COLL_ALL_REDUCE, 5));
  cr_assert(!coll_algo_serves(COLL_ALGO_TREE, COLL_COLL_ALL_GATHER, 5));
  cr_assert(coll_algo_serves(COLL_ALGO_RD, COLL_COLL_ALL_GATHER, 5));
  cr_assert(!coll_algo_serves(COLL_ALGO_RD, COLL_COLL_BROADCAST, 5));
  cr_assert(!coll_algo_serves(COLL_ALGO_RHD, COLL_COLL_REDUCE_SCATTER, 5));
  cr_assert(coll_algo_serves(COLL_ALGO_ONESHOT, COLL_COLL_ALL_REDUCE, 2));
  cr_assert(!coll_algo_has_plan(COLL_ALGO_ONESHOT), "one-shot is a run function, not a schedule");
  cr_assert(coll_algo_has_plan(COLL_ALGO_RHD));
  cr_assert(coll_algo_serves(COLL_ALGO_RHD, COLL_COLL_REDUCE_SCATTER, 1),
            "one rank: no algorithm needed");
  cr_assert(coll_algo_serves(COLL_ALGO_RHD, COLL_COLL_SEND, 4));
  cr_assert(!coll_algo_serves((coll_algo)99, COLL_COLL_ALL_REDUCE, 4));
  for (int n = 1; n <= 200; n++) cr_assert_geq(coll_plan_max_steps(n), 8);
}

/* ---- costs ---------------------------------------------------------------------------- */

static double cost_of(coll_algo a, coll_coll_kind c, int p, double n, char *f, size_t fl) {
  double t = -1;
  /* 2 us per message, 0.1 ns/B moved (10 GB/s), 0.05 ns/B reduced; 64 KiB slices */
  cr_assert_eq(coll_algo_cost(a, c, p, n, 65536, 2e-6, 1e-10, 5e-11, &t, f, fl), COLL_OK,
               "%s %s p=%d", coll_algo_name(a), coll_coll_name(c), p);
  return t;
}

Test(plan, costs) {
  const coll_algo algos[] = {COLL_ALGO_RING, COLL_ALGO_TREE, COLL_ALGO_RD, COLL_ALGO_RHD};
  char f[512];
  for (size_t ai = 0; ai < 4; ai++)
    for (size_t ci = 0; ci < sizeof colls / sizeof *colls; ci++)
      for (int p = 2; p <= 17; p++) {
        coll_algo a = algos[ai];
        if (!coll_algo_serves(a, colls[ci], p)) {
          double t;
          cr_assert_eq(coll_algo_cost(a, colls[ci], p, 1024, 65536, 1e-6, 1e-10, 0, &t, f,
                                      sizeof f),
                       COLL_ERR_INVALID_ARG);
          continue;
        }
        double prev = 0;
        for (double n = 8; n <= 1 << 30; n *= 4) {
          double t = cost_of(a, colls[ci], p, n, f, sizeof f);
          cr_assert_gt(t, 0);
          cr_assert_gt(t, prev, "%s %s p=%d: not monotone at n=%.0f", coll_algo_name(a),
                       coll_coll_name(colls[ci]), p, n);
          prev = t;
          cr_assert(strstr(f, "p=") && strstr(f, " us"), "formula: %s", f);
        }
      }
  for (int p = 3; p <= 17; p++) {
    double big = 256.0 * (1 << 20);
    cr_assert_lt(cost_of(COLL_ALGO_RING, COLL_COLL_ALL_REDUCE, p, big, f, sizeof f),
                 cost_of(COLL_ALGO_TREE, COLL_COLL_ALL_REDUCE, p, big, f, sizeof f), "p=%d", p);
    cr_assert_lt(cost_of(COLL_ALGO_RING, COLL_COLL_ALL_REDUCE, p, big, f, sizeof f),
                 cost_of(COLL_ALGO_RD, COLL_COLL_ALL_REDUCE, p, big, f, sizeof f), "p=%d", p);
  }
  for (int p = 4; p <= 17; p++) {
    double ring = cost_of(COLL_ALGO_RING, COLL_COLL_ALL_REDUCE, p, 8, f, sizeof f);
    cr_assert_lt(cost_of(COLL_ALGO_TREE, COLL_COLL_ALL_REDUCE, p, 8, f, sizeof f), ring, "p=%d", p);
    cr_assert_lt(cost_of(COLL_ALGO_RD, COLL_COLL_ALL_REDUCE, p, 8, f, sizeof f), ring, "p=%d", p);
    cr_assert_lt(cost_of(COLL_ALGO_TREE, COLL_COLL_BROADCAST, p, 8, f, sizeof f),
                 cost_of(COLL_ALGO_RING, COLL_COLL_BROADCAST, p, 8, f, sizeof f), "p=%d", p);
  }
  /* The formula strings name their shape and numbers. */
  cost_of(COLL_ALGO_TREE, COLL_COLL_ALL_REDUCE, 8, 1 << 20, f, sizeof f);
  cr_assert(strstr(f, "(2H+k-1)") && strstr(f, "H=3"), "%s", f);
  cost_of(COLL_ALGO_RD, COLL_COLL_ALL_REDUCE, 6, 8, f, sizeof f);
  cr_assert(strstr(f, "(K+2f)") && strstr(f, "p'=4") && strstr(f, "f=1"), "%s", f);
  cost_of(COLL_ALGO_RHD, COLL_COLL_ALL_REDUCE, 8, 8, f, sizeof f);
  cr_assert(strstr(f, "(2K+2f)") && strstr(f, "K=3") && strstr(f, "f=0"), "%s", f);
  cost_of(COLL_ALGO_RING, COLL_COLL_ALL_REDUCE, 8, 1 << 20, f, sizeof f);
  cr_assert(strstr(f, "2(p-1)") && strstr(f, "reduced"), "%s", f);
  /* Exact values: rd at p = 4, 8 B: 2 latencies, 2*8 B moved, 2*8 B reduced. */
  double t;
  cr_assert_eq(coll_algo_cost(COLL_ALGO_RD, COLL_COLL_ALL_REDUCE, 4, 8, 65536, 1e-6, 1e-9, 1e-9, &t,
                              f, sizeof f),
               COLL_OK);
  cr_assert_float_eq(t, 2e-6 + 16e-9 + 16e-9, 1e-15);
  cr_assert_eq(coll_algo_cost(COLL_ALGO_AUTO, COLL_COLL_ALL_REDUCE, 4, 8, 65536, 1e-6, 1e-9, 0, &t,
                              f, sizeof f),
               COLL_ERR_INVALID_ARG);
}

/* ---- a group's point-to-point plan (plan.c's plan_group) ---------------------------
 * Random matched groups: every directed pair carries 0..4 messages of random lengths
 * (some zero, some many slices); each rank lists its sends and receives in a shuffled
 * order that keeps each connection's messages in order (the API's matching rule), plus
 * a local copy.  The same model of the executor as above runs all ranks round by round,
 * with FIFOs of one slot (the least the plan claims to need) and of two: it must end,
 * every slice must meet the receive of its own message at its own offset, and no
 * connection may carry two slices in one round. */

typedef struct {
  int k;
  size_t off, n;
} gmsg; /* the k-th message of the connection */

static void group_sim(int n, size_t slice, size_t cap, uint64_t seed) {
  enum { MAXM = 4 };
  size_t len[17][17][MAXM]; /* len[a][b][k]: a's k-th message to b */
  int nm[17][17];
  uint64_t rng = seed;
  for (int a = 0; a < n; a++)
    for (int b = 0; b < n; b++) {
      nm[a][b] = a == b ? 0 : (int)(t_rand(&rng) % (MAXM + 1));
      for (int k = 0; k < nm[a][b]; k++) {
        uint64_t h = t_rand(&rng);
        len[a][b][k] = h % 4 == 0   ? 0
                       : h % 4 == 1 ? (h >> 8) % (5 * slice + 1)
                                    : (h >> 8) % slice + 1;
      }
    }
  coll_group_op *ops[17];
  coll_step *steps[17];
  size_t nsteps[17], scratch[34];
  int *ks[17]; /* per op: which message of its connection it is */
  for (int r = 0; r < n; r++) {
    size_t m = 1;
    for (int p = 0; p < n; p++) m += (size_t)(nm[r][p] + nm[p][r]);
    ops[r] = calloc(m, sizeof **ops);
    steps[r] = calloc(m, sizeof **steps);
    ks[r] = calloc(m, sizeof **ks);
    /* Deal the ops out: pick a random connection with messages left, take its next. */
    int next_s[17] = {0}, next_r[17] = {0};
    size_t i = 0;
    ops[r][i++] = (coll_group_op){COLL_STEP_COPY, r, t_rand(&rng) % 50};
    while (i < m) {
      int p = (int)(t_rand(&rng) % (uint64_t)n);
      bool send = t_rand(&rng) % 2;
      if (send && next_s[p] < nm[r][p]) {
        ks[r][i] = next_s[p];
        ops[r][i++] = (coll_group_op){COLL_STEP_SEND, p, len[r][p][next_s[p]++]};
      } else if (!send && next_r[p] < nm[p][r]) {
        ks[r][i] = next_r[p];
        ops[r][i++] = (coll_group_op){COLL_STEP_RECV, p, len[p][r][next_r[p]++]};
      }
    }
    coll_plan_args a = {.coll = COLL_COLL_GROUP_P2P,
                        .nranks = n,
                        .rank = r,
                        .slice = slice,
                        .group = ops[r],
                        .ngroup = m,
                        .scratch = scratch};
    cr_assert_eq(coll_plan_build(&a, steps[r], &nsteps[r]), COLL_OK);
    /* Sends before receives; at most one slice per connection per round. */
    bool seen_recv = false;
    for (size_t s = 0; s < nsteps[r]; s++) {
      const coll_step *st = &steps[r][s];
      cr_assert_eq(st->count, ops[r][st->item].count);
      if (st->kind == COLL_STEP_RECV) seen_recv = true;
      cr_assert(!(seen_recv && st->kind == COLL_STEP_SEND), "a send after a receive");
      for (size_t t = 0; t < s; t++) {
        const coll_step *o = &steps[r][t];
        if (o->kind != st->kind || st->kind == COLL_STEP_COPY ||
            (st->kind == COLL_STEP_SEND ? o->peer_out != st->peer_out : o->peer_in != st->peer_in))
          continue;
        size_t o_end = o->delay + (o->count + slice - 1) / slice;
        cr_assert_leq(o_end, st->delay, "two slices on one connection in one round");
      }
    }
  }
  /* Run them.  fifo[a * n + b]: slices from a to b. */
  gmsg *fifo = calloc((size_t)n * (size_t)n * cap, sizeof *fifo);
  size_t *head = calloc((size_t)n * (size_t)n, sizeof *head),
         *tail = calloc((size_t)n * (size_t)n, sizeof *tail);
  size_t round[17] = {0}, idx[17] = {0}, rounds[17] = {0};
  int left = 0;
  for (int r = 0; r < n; r++) {
    for (size_t s = 0; s < nsteps[r]; s++) {
      size_t e = steps[r][s].delay + (steps[r][s].count + slice - 1) / slice;
      if (e > rounds[r]) rounds[r] = e;
    }
    left += rounds[r] > 0;
  }
  while (left > 0) {
    bool moved = false;
    for (int r = 0; r < n; r++) {
      while (round[r] < rounds[r]) {
        const coll_step *st = &steps[r][idx[r]];
        size_t j = round[r];
        if (j >= st->delay && (j - st->delay) * slice < st->count && st->kind != COLL_STEP_COPY) {
          size_t off = (j - st->delay) * slice,
                 m = st->count - off < slice ? st->count - off : slice;
          int k = ks[r][st->item];
          if (st->kind == COLL_STEP_SEND) {
            size_t q = (size_t)r * (size_t)n + (size_t)st->peer_out;
            if (tail[q] - head[q] == cap) break;
            fifo[q * cap + tail[q]++ % cap] = (gmsg){k, off, m};
          } else {
            size_t q = (size_t)st->peer_in * (size_t)n + (size_t)r;
            if (tail[q] == head[q]) break;
            gmsg g = fifo[q * cap + head[q]++ % cap];
            cr_assert(g.k == k && g.off == off && g.n == m,
                      "n=%d seed=%llu: rank %d got slice (message %d, offset %zu, %zu) from %d, "
                      "expected (%d, %zu, %zu)",
                      n, (unsigned long long)seed, r, g.k, g.off, g.n, st->peer_in, k, off, m);
          }
        }
        moved = true;
        if (++idx[r] == nsteps[r]) {
          idx[r] = 0;
          if (++round[r] == rounds[r]) left--;
        }
      }
    }
    cr_assert(moved, "deadlock: group n=%d slice=%zu cap=%zu seed=%llu", n, slice, cap,
              (unsigned long long)seed);
  }
  for (int q = 0; q < n * n; q++) cr_assert_eq(head[q], tail[q], "unreceived slices");
  for (int r = 0; r < n; r++) {
    free(ops[r]);
    free(steps[r]);
    free(ks[r]);
  }
  free(fifo);
  free(head);
  free(tail);
}

Test(plan, group_p2p_interleaves_without_deadlock, .timeout = 240) {
  for (int n = 1; n <= 17; n++)
    for (uint64_t seed = 1; seed <= 40; seed++)
      for (size_t cap = 1; cap <= 2; cap++)
        group_sim(n, seed % 3 ? 4 : 1, cap, seed * 7919 + (uint64_t)n);
}

Test(plan, group_p2p_refuses_bad_operations) {
  coll_step st[4];
  size_t ns, scratch[8];
  coll_group_op bad_peer = {COLL_STEP_SEND, 4, 10}, to_self = {COLL_STEP_RECV, 1, 10},
                copy_away = {COLL_STEP_COPY, 0, 10}, reduce = {COLL_STEP_RECV_REDUCE_COPY, 0, 1};
  coll_group_op *bad[] = {&bad_peer, &to_self, &copy_away, &reduce};
  for (size_t i = 0; i < 4; i++) {
    coll_plan_args a = {.coll = COLL_COLL_GROUP_P2P,
                        .nranks = 4,
                        .rank = 1,
                        .slice = 8,
                        .group = bad[i],
                        .ngroup = 1,
                        .scratch = scratch};
    cr_assert_eq(coll_plan_build(&a, st, &ns), COLL_ERR_INVALID_ARG, "case %zu", i);
  }
}

/* ---- all-to-all(v), gather, scatter ---------------------------------------------- */

/* Every plan of the newer collectives pairs up, cannot deadlock even with one-slot FIFOs
 * and one-element slices, and delivers every element exactly where the API says: N =
 * 1..12, every root, in place and not. */
static void newer_sweep(int n, size_t count, size_t slice, size_t cap) {
  const coll_coll_kind kinds[] = {COLL_COLL_ALL_TO_ALL, COLL_COLL_GATHER, COLL_COLL_SCATTER};
  for (size_t ki = 0; ki < 3; ki++) {
    bool rooted = kinds[ki] != COLL_COLL_ALL_TO_ALL;
    for (int root = 0; root < (rooted ? n : 1); root++)
      for (int ip = 0; ip < 2; ip++) {
        sim_case c = {.coll = kinds[ki],
                      .algo = coll_algo_default(kinds[ki]),
                      .n = n,
                      .root = root,
                      .in_place = ip,
                      .count = count,
                      .slice = slice,
                      .cap = cap};
        run_sim(&c);
      }
  }
}

Test(plan, newer_collectives_sweep, .timeout = 240) {
  const size_t counts[] = {0, 1, 2, 3, 5, 17, 64};
  for (int n = 1; n <= 12; n++)
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
      newer_sweep(n, counts[i], 1, 1);
      newer_sweep(n, counts[i], 3, 2);
      newer_sweep(n, counts[i], 1000, 8);
    }
}

/* All-to-allv: uneven counts (zeros included, the own block too), displacements in
 * another order than the ranks, with gaps between blocks that must stay untouched
 * (moved_expected says 0xdeadbeef... there). */
static void v_case(int n, unsigned seed, size_t slice, size_t cap) {
  size_t *v[32];
  size_t un = (size_t)n;
  for (int r = 0; r < n; r++) v[r] = calloc(4 * un, sizeof(size_t));
  for (int r = 0; r < n; r++)
    for (int q = 0; q < n; q++) {
      size_t m = (size_t)((r * 7 + q * 3 + (int)seed) % 5) * (seed % 3 + 1); /* r sends q */
      v[r][q] = m;                                                           /* sendcounts */
      v[q][2 * un + (size_t)r] = m; /* q's recvcounts from r */
    }
  for (int r = 0; r < n; r++) {
    size_t at = 1;
    for (int i = n - 1; i >= 0; i--) { /* send blocks in reverse rank order, gaps of 1-2 */
      v[r][un + (size_t)i] = at;
      at += v[r][i] + 1 + (size_t)i % 2;
    }
    at = 2;
    for (int i = 0; i < n; i++) { /* receive blocks in a rotated order, gaps of 1-3 */
      size_t q = ((size_t)i * 5 + (size_t)r) % un;
      if (un % 5 == 0) q = ((size_t)i + (size_t)r) % un; /* keep it a permutation */
      v[r][3 * un + q] = at;
      at += v[r][2 * un + q] + 1 + q % 3;
    }
  }
  sim_case c = {.coll = COLL_COLL_ALL_TO_ALLV,
                .algo = COLL_ALGO_PAIRWISE,
                .n = n,
                .slice = slice,
                .cap = cap,
                .v = v};
  run_sim(&c);
  for (int r = 0; r < n; r++) free(v[r]);
}

Test(plan, all_to_allv_sweep, .timeout = 240) {
  for (int n = 1; n <= 12; n++)
    for (unsigned seed = 0; seed < 6; seed++) {
      v_case(n, seed, 1, 1);
      v_case(n, seed, 2, 2);
      v_case(n, seed, 1000, 8);
    }
}

Test(plan, newer_collectives_shapes) {
  coll_step st[64];
  size_t ns;
  /* Pairwise: a send to every peer, the copy of the own block, a receive from every
   * peer, partners in the same order in both passes and symmetric (r's k-th partner has
   * r as its k-th). */
  for (int n = 1; n <= 20; n++)
    for (int r = 0; r < n; r++) {
      coll_plan_args a = {.coll = COLL_COLL_ALL_TO_ALL, .count = 3, .nranks = n, .rank = r};
      cr_assert_eq(coll_plan_build(&a, st, &ns), COLL_OK);
      cr_assert_eq(ns, 2 * (size_t)n - 1);
      cr_assert_leq(ns, coll_plan_max_steps(n));
      size_t sent = 0, i = 0;
      for (int k = 0; k < n; k++) { /* sends first, partner q = (k - r) mod n */
        int q = ((k - r) % n + n) % n;
        if (q == r) continue;
        cr_assert(st[i].kind == COLL_STEP_SEND && st[i].peer_out == q, "send %zu", i);
        cr_assert_eq(st[i].src_off, (size_t)q * 3, "block q goes to q");
        cr_assert(st[n + i].kind == COLL_STEP_RECV && st[n + i].peer_in == q &&
                      st[n + i].dst_off == (size_t)q * 3,
                  "the receives in the same order");
        sent += st[i++].count;
      }
      cr_assert_eq(st[n - 1].kind, COLL_STEP_COPY, "the own block between the two");
      cr_assert_eq(sent, 3 * (size_t)(n - 1), "(N-1)/N of the buffer leaves");
      a.in_place = 1;
      cr_assert_eq(coll_plan_build(&a, st, &ns), COLL_OK);
      cr_assert_eq(ns, 2 * (size_t)n - 2, "in place: no copy of the own block");
      /* Linear gather and scatter: the root has a step per peer (and its copy). */
      for (int root = 0; root < n; root++) {
        coll_plan_args g = {
            .coll = COLL_COLL_GATHER, .count = 2, .nranks = n, .rank = r, .root = root};
        cr_assert_eq(coll_plan_build(&g, st, &ns), COLL_OK);
        cr_assert_eq(ns, r == root ? (size_t)n : 1);
        g.coll = COLL_COLL_SCATTER;
        cr_assert_eq(coll_plan_build(&g, st, &ns), COLL_OK);
        cr_assert_eq(ns, r == root ? (size_t)n : 1);
        cr_assert_leq(ns, coll_plan_max_steps(n));
      }
    }
  /* A root outside the communicator, all_to_allv without arrays or with its own block of
   * two sizes: refused. */
  coll_plan_args g = {.coll = COLL_COLL_GATHER, .count = 2, .nranks = 4, .rank = 0, .root = 4};
  cr_assert_eq(coll_plan_build(&g, st, &ns), COLL_ERR_INVALID_ARG);
  g.coll = COLL_COLL_SCATTER, g.root = -1;
  cr_assert_eq(coll_plan_build(&g, st, &ns), COLL_ERR_INVALID_ARG);
  coll_plan_args v = {.coll = COLL_COLL_ALL_TO_ALLV, .nranks = 2, .rank = 0};
  cr_assert_eq(coll_plan_build(&v, st, &ns), COLL_ERR_INVALID_ARG);
  size_t sc[2] = {3, 1}, sd[2] = {0, 3}, rc[2] = {2, 1}, rd[2] = {0, 2};
  v.sendcounts = sc, v.sdispls = sd, v.recvcounts = rc, v.rdispls = rd;
  cr_assert_eq(coll_plan_build(&v, st, &ns), COLL_ERR_INVALID_ARG);
  rc[0] = 3;
  cr_assert_eq(coll_plan_build(&v, st, &ns), COLL_OK);
  /* Forced algorithms that cannot serve them fall back to their own schedule. */
  cr_assert(!coll_algo_serves(COLL_ALGO_RING, COLL_COLL_ALL_TO_ALL, 4));
  cr_assert(!coll_algo_serves(COLL_ALGO_TREE, COLL_COLL_GATHER, 4));
  cr_assert(coll_algo_serves(COLL_ALGO_PAIRWISE, COLL_COLL_ALL_TO_ALLV, 4));
  cr_assert(!coll_algo_serves(COLL_ALGO_PAIRWISE, COLL_COLL_ALL_REDUCE, 4));
  cr_assert(coll_algo_serves(COLL_ALGO_LINEAR, COLL_COLL_SCATTER, 4));
  coll_plan_args t = {
      .coll = COLL_COLL_ALL_TO_ALL, .algo = COLL_ALGO_TREE, .count = 3, .nranks = 4, .rank = 1};
  cr_assert_eq(coll_plan_build(&t, st, &ns), COLL_OK);
  cr_assert_eq(ns, 7);
}

Test(plan, newer_collectives_costs) {
  char f[512];
  double t, prev;
  const coll_coll_kind kinds[] = {COLL_COLL_ALL_TO_ALL, COLL_COLL_GATHER, COLL_COLL_SCATTER};
  for (size_t ki = 0; ki < 3; ki++)
    for (int p = 2; p <= 17; p++) {
      coll_algo a = coll_algo_default(kinds[ki]);
      prev = 0;
      for (double n = 8; n <= 1 << 30; n *= 4) {
        t = cost_of(a, kinds[ki], p, n, f, sizeof f);
        cr_assert_gt(t, prev);
        prev = t;
        cr_assert(strstr(f, ki ? "(p-1)*a + (p-1)/p*n*b" : "(p-1)*a + 2(p-1)/p*n*b") &&
                      strstr(f, " us"),
                  "%s", f);
      }
      /* (p-1) alphas + (p-1)/p*n betas, exactly; pairwise's rank copies twice as much
       * (its sends into slots and its receives out of them) */
      cr_assert_eq(coll_algo_cost(a, kinds[ki], p, 1000, 65536, 1e-6, 1e-9, 0, &t, f, sizeof f),
                   COLL_OK);
      cr_assert_float_eq(t, (p - 1) * 1e-6 + (ki ? 1 : 2) * (p - 1) * 1000.0 / p * 1e-9, 1e-15);
      cr_assert_eq(coll_algo_cost(COLL_ALGO_RING, kinds[ki], p, 1000, 65536, 1e-6, 1e-9, 0, &t, f,
                                  sizeof f),
                   COLL_ERR_INVALID_ARG);
    }
  /* all-to-allv has no single n: not priced. */
  cr_assert_eq(coll_algo_cost(COLL_ALGO_PAIRWISE, COLL_COLL_ALL_TO_ALLV, 4, 1000, 65536, 1e-6, 1e-9,
                              0, &t, f, sizeof f),
               COLL_ERR_INVALID_ARG);
}

/* ---- the host-aware all-reduce (algo/hier.c) -------------------------------------------
 * Layouts as comm.c builds them (coll_hosts_build from per-rank host ids), run through the
 * executor's model above: every element reduced once over all N ranks, AVG divided once,
 * no deadlock with FIFOs of two and three slots (the ring needs two), odd counts, counts below N,
 * in place. */

typedef struct {
  int host[64], local[64], by_host[64];
  coll_hosts hs;
} layout;

/* ids[r] = the host of rank r as a small number (any order: ranks need not be
 * contiguous per host). */
static void make_layout(layout *l, const int *ids, int n) {
  uint64_t u[64];
  for (int r = 0; r < n; r++) u[r] = 1000 + (uint64_t)ids[r] * 7919;
  coll_hosts_build(u, n, l->host, l->local, l->by_host, &l->hs);
}

Test(plan, hosts_build) {
  layout l;
  const int blocks[] = {0, 0, 1, 1, 2, 2};
  make_layout(&l, blocks, 6);
  cr_assert_eq(l.hs.nhosts, 3);
  cr_assert_eq(l.hs.per_host, 2);
  cr_assert(coll_hier_fits(&l.hs, 6));
  for (int r = 0; r < 6; r++) {
    cr_assert_eq(l.hs.host[r], r / 2);
    cr_assert_eq(l.hs.local[r], r % 2);
    cr_assert_eq(l.hs.by_host[r], r);
  }
  const int mixed[] = {5, 9, 5, 9}; /* interleaved: hosts numbered by first rank */
  make_layout(&l, mixed, 4);
  cr_assert_eq(l.hs.nhosts, 2);
  cr_assert_eq(l.hs.per_host, 2);
  cr_assert_eq(l.hs.host[1], 1);
  cr_assert_eq(l.hs.local[2], 1);
  cr_assert_eq(l.hs.by_host[0 * 2 + 1], 2);
  cr_assert_eq(l.hs.by_host[1 * 2 + 1], 3);
  const int unequal[] = {0, 0, 1};
  make_layout(&l, unequal, 3);
  cr_assert_eq(l.hs.nhosts, 2);
  cr_assert_eq(l.hs.per_host, 0, "2 + 1 ranks: no common number per host");
  cr_assert(!coll_hier_fits(&l.hs, 3));
  const int one_each[] = {0, 1, 2};
  make_layout(&l, one_each, 3);
  cr_assert_eq(l.hs.per_host, 1);
  cr_assert(!coll_hier_fits(&l.hs, 3), "one rank per host: nothing inside to use");
  const int one_host[] = {4, 4, 4, 4};
  make_layout(&l, one_host, 4);
  cr_assert_eq(l.hs.nhosts, 1);
  cr_assert(!coll_hier_fits(&l.hs, 4), "one host");
  cr_assert(!coll_hier_fits(NULL, 4));
}

static void hier_sim(coll_coll_kind coll, const int *ids, int n, size_t count, size_t slice,
                     size_t cap, int in_place) {
  layout l;
  make_layout(&l, ids, n);
  sim_case c = {.coll = coll,
                .algo = COLL_ALGO_HIER,
                .n = n,
                .in_place = in_place,
                .count = count,
                .slice = slice,
                .cap = cap,
                .hosts = &l.hs};
  run_sim(&c);
}

Test(plan, hier_sweep, .timeout = 240) {
  static const int l22[] = {0, 0, 1, 1}, l32[] = {0, 0, 1, 1, 2, 2}, l23[] = {0, 0, 0, 1, 1, 1},
                   l43[] = {0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3}, mix[] = {0, 1, 0, 1},
                   mix3[] = {2, 0, 1, 0, 2, 1}, l21[] = {0, 0, 1}, one[] = {0, 0, 0, 0};
  const struct {
    const int *ids;
    int n;
  } layouts[] = {{l22, 4}, {l32, 6}, {l23, 6}, {l43, 12}, {mix, 4}, {mix3, 6}, {l21, 3}, {one, 4}};
  const size_t counts[] = {0, 1, 2, 3, 5, 7, 12, 13, 64, 101, 1000};
  const size_t slices[] = {1, 3, 64, 100000};
  for (size_t li = 0; li < sizeof layouts / sizeof *layouts; li++)
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++)
      for (size_t si = 0; si < sizeof slices / sizeof *slices; si++)
        for (size_t cap = 2; cap <= 3; cap++) /* the ring needs 2 (sweep above) */
          for (int ip = 0; ip < 2; ip++) {
            hier_sim(COLL_COLL_ALL_REDUCE, layouts[li].ids, layouts[li].n, counts[ci], slices[si],
                     cap, ip);
            hier_sim(COLL_COLL_ALL_GATHER, layouts[li].ids, layouts[li].n, counts[ci], slices[si],
                     cap, ip);
          }
}

/* Where the layout does not fit (unequal hosts, one host, one rank per host, no layout) and
 * for anything but all-reduce, the row's plan is the ring's, step for step. */
Test(plan, hier_falls_back_to_the_ring) {
  static const int l21[] = {0, 0, 1}, one[] = {0, 0, 0, 0}, each[] = {0, 1, 2};
  const struct {
    const int *ids;
    int n;
  } layouts[] = {{l21, 3}, {one, 4}, {each, 3}, {NULL, 4}};
  coll_step a_st[64], b_st[64];
  for (size_t li = 0; li < 4; li++) {
    layout l;
    if (layouts[li].ids) make_layout(&l, layouts[li].ids, layouts[li].n);
    for (int r = 0; r < layouts[li].n; r++) {
      size_t na, nb;
      coll_plan_args a = {.coll = COLL_COLL_ALL_REDUCE,
                          .algo = COLL_ALGO_HIER,
                          .count = 1001,
                          .nranks = layouts[li].n,
                          .rank = r,
                          .hosts = layouts[li].ids ? &l.hs : NULL,
                          .slice = 64};
      coll_plan_args b = a;
      b.algo = COLL_ALGO_RING;
      cr_assert_eq(coll_plan_build(&a, a_st, &na), COLL_OK);
      cr_assert_eq(coll_plan_build(&b, b_st, &nb), COLL_OK);
      cr_assert_eq(na, nb);
      cr_assert(memcmp(a_st, b_st, na * sizeof *a_st) == 0, "layout %zu rank %d", li, r);
    }
  }
  cr_assert(!coll_algo_serves(COLL_ALGO_HIER, COLL_COLL_BROADCAST, 4));
  cr_assert(coll_algo_serves(COLL_ALGO_HIER, COLL_COLL_ALL_GATHER, 4));
  cr_assert(!coll_algo_serves(COLL_ALGO_HIER, COLL_COLL_REDUCE_SCATTER, 4));
  cr_assert(coll_algo_serves(COLL_ALGO_HIER, COLL_COLL_ALL_REDUCE, 4));
  cr_assert(coll_algo_has_plan(COLL_ALGO_HIER));
  bool ok;
  cr_assert_eq(coll_algo_from_name("hierarchical", &ok), COLL_ALGO_HIER);
}

/* The bytes each rank sends per link class, from the plans, against hier.c's formulas:
 * ring 2(N-1)/N*S per rank, all of it across at the H host boundaries; hier 2(n-1)/n*S
 * inside and 2(H-1)/H*S/n across per rank.  S divisible by N·H so both are exact. */
Test(plan, hier_link_bytes) {
  const int HS[] = {2, 3, 2, 4}, NS[] = {2, 2, 3, 3};
  coll_step st[64];
  for (int k = 0; k < 4; k++) {
    int H = HS[k], nn = NS[k], N = H * nn, ids[16];
    for (int r = 0; r < N; r++) ids[r] = r / nn;
    layout l;
    make_layout(&l, ids, N);
    size_t count = (size_t)N * H * 10, es = 4;
    double S = (double)(count * es);
    uint64_t ring_x = 0, hier_x = 0;
    for (int r = 0; r < N; r++) {
      uint64_t in, x;
      coll_plan_args a = {.coll = COLL_COLL_ALL_REDUCE,
                          .algo = COLL_ALGO_RING,
                          .count = count,
                          .nranks = N,
                          .rank = r,
                          .hosts = &l.hs,
                          .slice = 16};
      cr_assert_eq(coll_plan_link_bytes(&a, es, st, &in, &x), COLL_OK);
      cr_assert_float_eq((double)(in + x), 2.0 * (N - 1) / N * S, 1e-9);
      cr_assert_eq(x != 0, (r + 1) % nn == 0, "ring: only host boundaries cross (rank %d)", r);
      ring_x += x;
      a.algo = COLL_ALGO_HIER;
      cr_assert_eq(coll_plan_link_bytes(&a, es, st, &in, &x), COLL_OK);
      cr_assert_float_eq((double)in, 2.0 * (nn - 1) / nn * S, 1e-9, "H=%d n=%d", H, nn);
      cr_assert_float_eq((double)x, 2.0 * (H - 1) / H * S / nn, 1e-9, "H=%d n=%d", H, nn);
      hier_x += x;
    }
    cr_assert_float_eq((double)ring_x, H * 2.0 * (N - 1) / N * S, 1e-9);
    /* All-gather of count/N per rank (S the whole output): hier (H-1)/N*S across and
     * (n-1)/n*S inside per rank; the ring (N-1)/N*S, across at the boundaries. */
    uint64_t ag_ring_x = 0, ag_hier_x = 0;
    for (int r = 0; r < N; r++) {
      uint64_t in, x;
      coll_plan_args a = {.coll = COLL_COLL_ALL_GATHER,
                          .algo = COLL_ALGO_HIER,
                          .count = count / (size_t)N,
                          .nranks = N,
                          .rank = r,
                          .hosts = &l.hs,
                          .slice = 16};
      cr_assert_eq(coll_plan_link_bytes(&a, es, st, &in, &x), COLL_OK);
      cr_assert_float_eq((double)x, (H - 1.0) / N * S, 1e-9, "all-gather H=%d n=%d", H, nn);
      cr_assert_float_eq((double)in, (nn - 1.0) / nn * S, 1e-9, "all-gather H=%d n=%d", H, nn);
      ag_hier_x += x;
      a.algo = COLL_ALGO_RING;
      cr_assert_eq(coll_plan_link_bytes(&a, es, st, &in, &x), COLL_OK);
      ag_ring_x += x;
    }
    cr_assert_float_eq((double)ag_ring_x, H * (N - 1.0) / N * S, 1e-9);
    cr_assert_lt(ag_hier_x, ag_ring_x);
    cr_assert_float_eq((double)hier_x, 2.0 * (H - 1) * S, 1e-9);
    cr_assert_lt(hier_x, ring_x, "H=%d n=%d: the hierarchy sends less across hosts", H, nn);
  }
}

/* Its cost: applicable only with several hosts of equal size; cheaper than the ring priced
 * at its slowest link wherever the network is the slower link; the formula's parts. */
Test(plan, hier_cost) {
  coll_cost_model m = {.p = 4,
                       .slice = 65536,
                       .alpha = 1e-6,
                       .beta = 0.2e-9,
                       .gamma = 0.1e-9,
                       .hosts = 2,
                       .local = 2,
                       .alpha_net = 10e-6,
                       .beta_net = 0.8e-9};
  char f[512];
  double t, ring;
  cr_assert_eq(coll_hier_cost(COLL_COLL_ALL_REDUCE, 4000, &m, &t, f, sizeof f), COLL_OK);
  /* 2*1 us + 4000*0.2 ns + 2*10 us + 2000*0.8 ns + 3000*0.1 ns */
  cr_assert_float_eq(t, 2e-6 + 0.8e-6 + 20e-6 + 1.6e-6 + 0.3e-6, 1e-12);
  cr_assert(strstr(f, "H=2") && strstr(f, "n=2") && strstr(f, "across"), "%s", f);
  cr_assert_eq(coll_hier_cost(COLL_COLL_BROADCAST, 4000, &m, &t, f, sizeof f),
               COLL_ERR_INVALID_ARG);
  cr_assert_eq(coll_hier_cost(COLL_COLL_REDUCE_SCATTER, 4000, &m, &t, f, sizeof f),
               COLL_ERR_INVALID_ARG);
  /* all-gather of S = 4000 B: 1*10 us + 1000 B*0.8 ns + 2*1 us + 2000 B*0.2 ns */
  cr_assert_eq(coll_hier_cost(COLL_COLL_ALL_GATHER, 4000, &m, &t, f, sizeof f), COLL_OK);
  cr_assert_float_eq(t, 10e-6 + 0.8e-6 + 2e-6 + 0.4e-6, 1e-12);
  coll_cost_model flat = m;
  flat.alpha = m.alpha_net, flat.beta = m.beta_net; /* the ring at its slowest link */
  for (double S = 8; S <= 1 << 30; S *= 8) {
    cr_assert_eq(coll_hier_cost(COLL_COLL_ALL_REDUCE, S, &m, &t, f, sizeof f), COLL_OK);
    cr_assert_eq(coll_ring_cost(COLL_COLL_ALL_REDUCE, S, &flat, &ring, f, sizeof f), COLL_OK);
    cr_assert_lt(t, ring, "S=%.0f", S);
  }
  const int bad[][3] = {{1, 4, 4}, {4, 1, 4}, {2, 0, 3}, {2, 2, 6}};
  for (int k = 0; k < 4; k++) {
    coll_cost_model b = m;
    b.hosts = bad[k][0], b.local = bad[k][1], b.p = bad[k][2];
    cr_assert_eq(coll_hier_cost(COLL_COLL_ALL_REDUCE, 4000, &b, &t, f, sizeof f),
                 COLL_ERR_INVALID_ARG);
    cr_assert(strstr(f, "not applicable"), "%s", f);
  }
  /* The plain model (no link classes, as coll_algo_cost builds it): not applicable. */
  cr_assert_eq(coll_algo_cost(COLL_ALGO_HIER, COLL_COLL_ALL_REDUCE, 4, 4000, 65536, 1e-6, 1e-9, 0,
                              &t, f, sizeof f),
               COLL_ERR_INVALID_ARG);
}
