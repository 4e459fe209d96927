/* tune.c — which algorithm runs each call, chosen from measured costs.
 *
 * At communicator creation the ranks measure the model's parameters (or read them from
 * COLL_TUNE_FILE), with the communicator's own executor:
 *   α      a token passed round the ring of all ranks, 8 bytes, 200 laps: the median
 *          lap over the number of hops (on 2 ranks, half a ping-pong).
 *   β      ranks 0 and 1 bounce 1 MiB: (half the fastest round trip - α) / 1 MiB.
 *   γ      rank 0 reduces 64 KiB of float32 in cache: seconds per byte reduced.
 *   per schedule (ring, tree, rd, rhd): an 8-byte all-reduce forced onto it, median of
 *          60, over the number of α terms in its formula — its own α; pairwise the same
 *          with a 1-byte-per-rank all-to-all, linear with a 1-byte gather.  With more ranks
 *          than cores an α is mostly the wait for a descheduled peer, and how much a
 *          pattern overlaps those waits differs (calibrate()).
 *   α_mb   the same 8-byte all-reduce on the one-shot path (oneshot.c): its fixed cost.
 *   β_cma, α_cma  per byte and per call of reading a peer's memory (direct.c), probed
 *          every time since whether ranks may do it at all must be agreed.
 * COLL_TUNE_FILE caches all but the last line per communicator shape.
 * Rank 0's figures are broadcast, so every rank builds the same table from the same
 * numbers and the same code: all ranks always choose the same algorithm for a call,
 * which they must (different schedules would not pair up).
 *
 * The table: for every collective and every power-of-two size bucket, the algorithm
 * with the smallest predicted time — the one-shot formulas in oneshot.c, the others'
 * in their own files (coll_algo_cost).  A call costs one table lookup.  Buckets are
 * judged at 1.5x their lower bound (the middle, geometrically near enough).
 *
 * COLL_ALGO=name forces an algorithm; a call it cannot serve (tree has no all-gather,
 * one-shot needs one host and a small message) takes the table's choice instead, with a
 * warning the first time.  COLL_TUNE=0 skips the measurement and uses defaults.
 *
 * All-to-all, gather and scatter are priced like the rest (pairwise.c, linear.c, and
 * the one-shot and direct formulas below); scatter uses linear's α from the gather.
 * All-to-allv has no table: its ranks do not agree on a size (coll_tune_choose).
 *
 * Must never: let ranks decide from their own measurements, or measure on the hot path.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_trace.h"
#include "internal.h"
#include "reduce.h"

#define LAPS 200
#define CAL_LAPS 60 /* 8-byte all-reduces per algorithm in calibrate() */
#define BIG (1u << 20)
#define BIG_REPS 4
#define MARGIN 0.8 /* a challenger's prediction must be below 0.8x the ring's */
/* The direct path's model (per-call and per-byte costs of process_vm_readv measured on
 * 1 MiB) was 2x optimistic here at 256 KiB - 4 MiB on 2 ranks (4 MiB all-reduce: 425 us
 * against the ring's 190 us): it must be predicted twice as fast to be chosen. */
#define MARGIN_DIRECT 0.5
#define A2A_DIRECT_MAX (4u << 20) /* all-to-all takes direct.c up to here (build_table) */

static const coll_algo candidates[] = {COLL_ALGO_RING, COLL_ALGO_TREE, COLL_ALGO_RD,
                                       COLL_ALGO_RHD, COLL_ALGO_ONESHOT, COLL_ALGO_DIRECT,
                                       COLL_ALGO_PAIRWISE, COLL_ALGO_LINEAR};
#define NCAND (sizeof candidates / sizeof candidates[0])

static int bucket_of(size_t bytes) {
  int b = 0;
  while (bytes) b++, bytes >>= 1;
  return b < COLL_TUNE_BUCKETS ? b : COLL_TUNE_BUCKETS - 1;
}

static double bucket_bytes(int b) { return b == 0 ? 0 : 1.5 * ldexp(1.0, b - 1); }

/* The one-shot path's cost (see oneshot.c), n = nccl-tests' size. */
static bool oneshot_cost(coll_coll_kind c, int p, double n, const coll_tune_params *t,
                         double *sec, char *formula, size_t flen) {
  double a = t->alpha_mb, b = t->beta, g = t->gamma, s;
  switch (c) {
  case COLL_COLL_ALL_REDUCE:
  case COLL_COLL_REDUCE:
    s = a + n * b + (p - 1) * n * (b + g);
    snprintf(formula, flen, "a_mb + n*b + (p-1)*n*(b+g) = %.3g us", s * 1e6);
    break;
  case COLL_COLL_REDUCE_SCATTER:
    s = a + n * b + (p - 1) * (n / p) * (b + g);
    snprintf(formula, flen, "a_mb + n*b + (p-1)*(n/p)*(b+g) = %.3g us", s * 1e6);
    break;
  case COLL_COLL_ALL_GATHER:
    s = a + (n / p) * b + (p - 1) * (n / p) * b;
    snprintf(formula, flen, "a_mb + n*b = %.3g us", s * 1e6);
    break;
  case COLL_COLL_BROADCAST:
    s = a + 2 * n * b;
    snprintf(formula, flen, "a_mb + 2*n*b = %.3g us", s * 1e6);
    break;
  case COLL_COLL_BARRIER:
    s = a;
    snprintf(formula, flen, "a_mb = %.3g us", s * 1e6);
    break;
  case COLL_COLL_ALL_TO_ALL:
    s = a + 2 * n * b;
    snprintf(formula, flen, "a_mb + n*b + n*b = %.3g us", s * 1e6);
    break;
  case COLL_COLL_GATHER:
    s = a + (n / p) * b + (p - 1) * (n / p) * b;
    snprintf(formula, flen, "a_mb + n/p*b + (p-1)/p*n*b = %.3g us", s * 1e6);
    break;
  case COLL_COLL_SCATTER:
    s = a + n * b + (n / p) * b;
    snprintf(formula, flen, "a_mb + n*b + n/p*b = %.3g us", s * 1e6);
    break;
  default: return false;
  }
  *sec = s;
  return true;
}

/* The direct path's cost (see direct.c), n = nccl-tests' size. */
static bool direct_cost(coll_coll_kind c, int p, double n, const coll_tune_params *t,
                        double *sec, char *formula, size_t flen) {
  /* a: one one-shot exchange; r: one process_vm_readv call (a system call, and the
   * kernel pins the pages it reads); pieces: reduce-scatter reads in COLL_DIRECT_PIECE. */
  double a = t->alpha_mb;
  double r = t->alpha_cma, b = t->beta_cma, g = t->gamma, f = (double)(p - 1) / p, s;
  double pieces = ceil(n / p / COLL_DIRECT_PIECE);
  if (pieces < 1) pieces = 1;
  switch (c) {
  case COLL_COLL_ALL_REDUCE:
    s = 3 * a + (p - 1) * (pieces + 1) * r + 2 * f * n * b + f * n * g;
    snprintf(formula, flen, "3*a_mb + (p-1)*(pieces+1)*a_cma + 2(p-1)/p*n*b_cma + (p-1)/p*n*g"
             " = %.3g us", s * 1e6);
    break;
  case COLL_COLL_REDUCE_SCATTER:
    s = 2 * a + (p - 1) * pieces * r + f * n * (b + g);
    snprintf(formula, flen, "2*a_mb + (p-1)*pieces*a_cma + (p-1)/p*n*(b_cma+g) = %.3g us",
             s * 1e6);
    break;
  case COLL_COLL_ALL_GATHER:
    s = 2 * a + (p - 1) * r + f * n * b;
    snprintf(formula, flen, "2*a_mb + (p-1)*a_cma + (p-1)/p*n*b_cma = %.3g us", s * 1e6);
    break;
  case COLL_COLL_BROADCAST:
    s = 2 * a + r + n * b;
    snprintf(formula, flen, "2*a_mb + a_cma + n*b_cma = %.3g us", s * 1e6);
    break;
  case COLL_COLL_ALL_TO_ALL:
    s = 2 * a + (p - 1) * r + f * n * b;
    snprintf(formula, flen, "2*a_mb + (p-1)*a_cma + (p-1)/p*n*b_cma = %.3g us", s * 1e6);
    break;
  default: return false;
  }
  *sec = s;
  return true;
}

/* Predicted seconds of `a` for `c` at n bytes; false if `a` cannot serve it. */
static bool predict(struct coll_comm *comm, coll_algo a, coll_coll_kind c, double n,
                    double *sec, char *formula, size_t flen) {
  const coll_tune_params *t = &comm->tune;
  int p = comm->nranks;
  if (a == COLL_ALGO_ONESHOT) {
    if (!comm->mailboxes) return false;
    return oneshot_cost(c, p, n, t, sec, formula, flen);
  }
  if (a == COLL_ALGO_DIRECT) {
    if (!coll_direct_serves(comm, c)) return false;
    return direct_cost(c, p, n, t, sec, formula, flen);
  }
  if (!coll_algo_serves(a, c, p)) return false;
  coll_coll_kind cc = c == COLL_COLL_BARRIER ? COLL_COLL_ALL_REDUCE : c;
  if (c == COLL_COLL_BARRIER) n = 1;
  double alpha = t->alpha_algo[a] > 0 ? t->alpha_algo[a] : t->alpha;
  return coll_algo_cost(a, cc, p, n, (double)comm->slot_bytes, alpha, t->beta, t->gamma,
                        sec, formula, flen) == COLL_OK;
}

static void build_table(struct coll_comm *comm) {
  static const coll_coll_kind colls[] = {COLL_COLL_BROADCAST, COLL_COLL_REDUCE,
                                         COLL_COLL_ALL_REDUCE, COLL_COLL_REDUCE_SCATTER,
                                         COLL_COLL_ALL_GATHER, COLL_COLL_BARRIER,
                                         COLL_COLL_ALL_TO_ALL, COLL_COLL_GATHER,
                                         COLL_COLL_SCATTER};
  char f[160];
  for (size_t i = 0; i < sizeof colls / sizeof colls[0]; i++) {
    coll_coll_kind c = colls[i];
    for (int b = 0; b < COLL_TUNE_BUCKETS; b++) {
      double best = INFINITY, best_fifo = INFINITY, s;
      coll_algo pick = coll_algo_default(c), pick_fifo = pick;
      /* The ring is the reference (it serves everything, pipelines every step and is
       * bandwidth-optimal); another schedule must beat its prediction by MARGIN (the
       * one-shot and direct paths are priced from their own measured costs).  The
       * model leaves out what the ring does best (its steps overlap; halving phases
       * and tree levels wait for each other), and measured here a near tie at 64 MiB
       * on 4 ranks went to Rabenseifner at 3.5 GB/s busbw against the ring's 5.4. */
      for (size_t k = 0; k < NCAND; k++) {
        if (!predict(comm, candidates[k], c, bucket_bytes(b), &s, f, sizeof f)) continue;
        if (candidates[k] == COLL_ALGO_TREE || candidates[k] == COLL_ALGO_RD ||
            candidates[k] == COLL_ALGO_RHD)
          s /= MARGIN;
        if (candidates[k] == COLL_ALGO_DIRECT && c != COLL_COLL_ALL_TO_ALL) s /= MARGIN_DIRECT;
        /* All-to-all moves no byte twice through direct.c (pairwise copies each into a
         * slot and out), and measured that way while the buffers stay in cache with a core
         * per rank (2 ranks: 256 KiB 14 us vs pairwise 60-231, 1 MiB 170-205 vs 417-968,
         * 4 MiB equal); from 16 MiB pairwise's streamed stores win (6.8-8.2 ms vs
         * 8.1-13.4), and with more ranks than cores every barrier waits for a
         * descheduled peer (4 ranks: pairwise ahead at 256 KiB, 4 and 16 MiB).  So it
         * is priced without the margin, but only there. */
        if (candidates[k] == COLL_ALGO_DIRECT && c == COLL_COLL_ALL_TO_ALL &&
            (comm->oversubscribed || bucket_bytes(b) > A2A_DIRECT_MAX))
          continue;
        if (s < best) best = s, pick = candidates[k];
        if (candidates[k] != COLL_ALGO_ONESHOT && s < best_fifo) best_fifo = s, pick_fifo = candidates[k];
      }
      comm->choice[c][b] = (uint8_t)pick;
      comm->choice_fifo[c][b] = (uint8_t)pick_fifo;
    }
  }
}

/* ---- the choice, per call -------------------------------------------------------- */

coll_algo coll_tune_choose(struct coll_comm *comm, const coll_work *w, size_t es) {
  coll_coll_kind c = w->coll;
  if (c == COLL_COLL_SEND || c == COLL_COLL_RECV || c == COLL_COLL_SENDRECV ||
      comm->nranks == 1)
    return coll_algo_default(c); /* no algorithm: plan.c schedules these itself */
  size_t bytes = w->count * es;
  if (c == COLL_COLL_ALL_GATHER || c == COLL_COLL_REDUCE_SCATTER || c == COLL_COLL_ALL_TO_ALL ||
      c == COLL_COLL_GATHER || c == COLL_COLL_SCATTER)
    bytes *= (size_t)comm->nranks;
  if (c == COLL_COLL_ALL_TO_ALLV)
    bytes = 1; /* its count is this rank's alone: the choice below must not depend on it */
  if (bytes == 0 && c != COLL_COLL_BARRIER)
    return coll_algo_default(c); /* nothing moves: the plan has no steps, whatever is forced */
  coll_algo f = comm->forced;
  if (f != COLL_ALGO_AUTO && f != COLL_ALGO_MAPPED) { /* mapped: executor.c tries it first */
    bool ok = f == COLL_ALGO_ONESHOT  ? coll_oneshot_fits(comm, c, w->count, es) &&
                                            !w->device && !w->cuda_event
              : f == COLL_ALGO_DIRECT ? coll_direct_serves(comm, c) && !w->device &&
                                            !w->cuda_event
                                      : coll_algo_serves(f, c, comm->nranks);
    if (ok) return f;
    if (!comm->warned_forced[c]) {
      comm->warned_forced[c] = true;
      COLL_WARN(comm->rank, "COLL_ALGO=%s cannot serve %s #%llu (%zu bytes, %d ranks%s); "
                "using the tuner's choice instead", coll_algo_name(f), coll_coll_name(c),
                (unsigned long long)w->seq, bytes, comm->nranks,
                f == COLL_ALGO_ONESHOT && !comm->mailboxes ? ", not all on one host" : "");
    }
  }
  if (!comm->tuned) /* measuring: the probe runs on rings, or on what it is timing */
    return comm->probe_algo != COLL_ALGO_AUTO ? comm->probe_algo : coll_algo_default(c);
  /* All-to-allv: the ranks' sizes differ and none knows the others', so there is no size
   * to look up that every rank agrees on: always the schedule (COLL_ALGO=direct or mapped
   * buffers choose the single-copy paths, the same on every rank). */
  if (c == COLL_COLL_ALL_TO_ALLV) return COLL_ALGO_PAIRWISE;
  int b = bucket_of(bytes);
  coll_algo a = (coll_algo)comm->choice[c][b];
  if (a == COLL_ALGO_ONESHOT && (!coll_oneshot_fits(comm, c, w->count, es) || w->device ||
                                 w->cuda_event)) /* mailboxes are host memory */
    a = (coll_algo)comm->choice_fifo[c][b];
  if (a == COLL_ALGO_DIRECT && (w->device || w->cuda_event))
    a = COLL_ALGO_RING; /* process_vm_readv reads host memory only */
  return a;
}

/* ---- measuring ------------------------------------------------------------------- */

/* An in-place byte call of the probe (root: the root, or the peer of send/recv). */
static coll_result run(struct coll_comm *comm, coll_coll_kind c, void *buf, size_t count,
                       int peer) {
  return coll_exec_bytes(comm, c, buf, buf, count, COLL_SUM, peer);
}
static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median: a lap that a busy machine preempted says nothing about the links. */
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Seconds per hop of an 8-byte token passed round the ring (median of LAPS laps). */
static coll_result ring_laps(struct coll_comm *comm, uint8_t *buf, double *hop) {
  int n = comm->nranks, me = comm->rank, next = (me + 1) % n, prev = (me + n - 1) % n;
  double t[LAPS];
  coll_result r;
  for (int lap = -5; lap < LAPS; lap++) {
    uint64_t t0 = coll_now_ns();
    if (me == 0) {
      if ((r = run(comm, COLL_COLL_SEND, buf, 8, next)) != COLL_OK) return r;
      if ((r = run(comm, COLL_COLL_RECV, buf, 8, prev)) != COLL_OK) return r;
    } else {
      if ((r = run(comm, COLL_COLL_RECV, buf, 8, prev)) != COLL_OK) return r;
      if ((r = run(comm, COLL_COLL_SEND, buf, 8, next)) != COLL_OK) return r;
    }
    if (lap >= 0) t[lap] = (double)(coll_now_ns() - t0) * 1e-9;
  }
  *hop = median(t, LAPS) / n;
  return COLL_OK;
}

/* Half the round trip of BIG bytes between ranks 0 and 1, the fastest of BIG_REPS
 * (others return at once). */
static coll_result big_pingpong(struct coll_comm *comm, uint8_t *buf, double *half) {
  int me = comm->rank;
  coll_result r;
  *half = 0;
  if (me > 1) return COLL_OK;
  double best = INFINITY;
  for (int i = -1; i < BIG_REPS; i++) {
    uint64_t t0 = coll_now_ns();
    if (me == 0) {
      if ((r = run(comm, COLL_COLL_SEND, buf, BIG, 1)) != COLL_OK) return r;
      if ((r = run(comm, COLL_COLL_RECV, buf, BIG, 1)) != COLL_OK) return r;
    } else {
      if ((r = run(comm, COLL_COLL_RECV, buf, BIG, 0)) != COLL_OK) return r;
      if ((r = run(comm, COLL_COLL_SEND, buf, BIG, 0)) != COLL_OK) return r;
    }
    double t = (double)(coll_now_ns() - t0) * 1e-9;
    if (i >= 0 && t < best) best = t;
  }
  *half = best / 2;
  return COLL_OK;
}

static double measure_gamma(void) {
  enum { N = 16384 }; /* 64 KiB of float32 per operand */
  static float a[N], b[N];
  for (int i = 0; i < N; i++) a[i] = (float)i, b[i] = 1.0f;
  coll_kernel_reduce(a, a, b, N, COLL_FLOAT32, COLL_SUM);
  uint64_t t0 = coll_now_ns();
  for (int i = 0; i < 20; i++) coll_kernel_reduce(a, a, b, N, COLL_FLOAT32, COLL_SUM);
  return (double)(coll_now_ns() - t0) * 1e-9 / 20 / (N * 4.0);
}

static void defaults(coll_tune_params *t) {
  memset(t, 0, sizeof *t);
  t->alpha = 1e-6;
  t->beta = 1.0 / 5e9;
  t->gamma = 1.0 / 10e9;
  t->alpha_mb = 0.5e-6;
  t->beta_cma = 1.0 / 10e9;
  t->alpha_cma = 2e-6;
  t->source = 0;
}

/* COLL_TUNE_FILE: one line per shape of communicator. */
static void key_of(struct coll_comm *comm, char *key, size_t len) {
  snprintf(key, len, "nranks=%d local=%d transport=%s", comm->nranks, comm->local_ranks,
           comm->transport ? comm->transport->name : "none");
}

static bool read_cache(struct coll_comm *comm, const char *path, coll_tune_params *t) {
  FILE *f = fopen(path, "r");
  if (!f) return false;
  char key[128], line[512];
  key_of(comm, key, sizeof key);
  bool found = false;
  while (fgets(line, sizeof line, f)) {
    char *at = strstr(line, " alpha=");
    if (strncmp(line, "libcoll-tune 2 ", 15) != 0 || !at) continue;
    if ((size_t)(at - (line + 15)) != strlen(key) || strncmp(line + 15, key, strlen(key))) continue;
    coll_tune_params x = {0};
    double *aa = x.alpha_algo;
    /* pairwise= and linear= came later: a line without them still counts (their α is
     * then the token's). */
    if (sscanf(at, " alpha=%lg beta=%lg gamma=%lg alpha_mb=%lg ring=%lg tree=%lg rd=%lg rhd=%lg"
               " pairwise=%lg linear=%lg",
               &x.alpha, &x.beta, &x.gamma, &x.alpha_mb, &aa[COLL_ALGO_RING],
               &aa[COLL_ALGO_TREE], &aa[COLL_ALGO_RD], &aa[COLL_ALGO_RHD],
               &aa[COLL_ALGO_PAIRWISE], &aa[COLL_ALGO_LINEAR]) >= 8 &&
        x.alpha > 0 && x.beta > 0 && x.gamma > 0 && x.alpha_mb >= 0) {
      x.beta_cma = t->beta_cma; /* not cached: measured by the direct probe each time */
      x.alpha_cma = t->alpha_cma;
      *t = x;
      t->source = 2;
      found = true;
    }
  }
  fclose(f);
  return found;
}

static void write_cache(struct coll_comm *comm, const char *path, const coll_tune_params *t) {
  FILE *f = fopen(path, "a");
  if (!f) {
    COLL_WARN(comm->rank, "COLL_TUNE_FILE=%s cannot be opened for appending; the "
              "measurement is not cached", path);
    return;
  }
  char key[128];
  key_of(comm, key, sizeof key);
  const double *aa = t->alpha_algo;
  fprintf(f, "libcoll-tune 2 %s alpha=%.6g beta=%.6g gamma=%.6g alpha_mb=%.6g ring=%.6g "
          "tree=%.6g rd=%.6g rhd=%.6g pairwise=%.6g linear=%.6g\n", key, t->alpha, t->beta,
          t->gamma, t->alpha_mb, aa[COLL_ALGO_RING], aa[COLL_ALGO_TREE], aa[COLL_ALGO_RD],
          aa[COLL_ALGO_RHD], aa[COLL_ALGO_PAIRWISE], aa[COLL_ALGO_LINEAR]);
  fclose(f);
}

/* The latency each algorithm really has here: an 8-byte all-reduce forced onto it, the
 * median of LAPS calls, divided by the number of α terms its formula has.  With more
 * ranks than cores a step's α is mostly the wait for a descheduled peer, which depends
 * on the pattern (a ring overlaps its waits, a butterfly does not): the token lap alone
 * mispriced them.  Rank 0's figures count, like the rest. */
static coll_result calibrate(struct coll_comm *comm, coll_tune_params *t) {
  /* Each schedule on a collective it serves: 8 bytes for the all-reduces, a byte per
   * rank for all-to-all (pairwise) and gather (linear, root 0). */
  static const struct {
    coll_algo a;
    coll_coll_kind c;
  } cal[] = {{COLL_ALGO_RING, COLL_COLL_ALL_REDUCE},  {COLL_ALGO_TREE, COLL_COLL_ALL_REDUCE},
             {COLL_ALGO_RD, COLL_COLL_ALL_REDUCE},    {COLL_ALGO_RHD, COLL_COLL_ALL_REDUCE},
             {COLL_ALGO_PAIRWISE, COLL_COLL_ALL_TO_ALL}, {COLL_ALGO_LINEAR, COLL_COLL_GATHER},
             {COLL_ALGO_ONESHOT, COLL_COLL_ALL_REDUCE}};
  size_t n = (size_t)comm->nranks;
  uint8_t *in = calloc(n > 8 ? n : 8, 1), *out = calloc(n > 8 ? n : 8, 1);
  double v[CAL_LAPS];
  coll_result r = COLL_OK;
  if (!in || !out) r = coll_fail(comm, COLL_ERR_SYSTEM, "out of memory calibrating");
  for (size_t i = 0; i < sizeof cal / sizeof *cal && r == COLL_OK; i++) {
    coll_algo a = cal[i].a;
    coll_coll_kind c = cal[i].c;
    if (a == COLL_ALGO_ONESHOT ? !comm->mailboxes : !coll_algo_serves(a, c, comm->nranks))
      continue;
    size_t count = c == COLL_COLL_ALL_REDUCE ? 8 : 1;
    comm->probe_algo = a;
    for (int k = -10; k < CAL_LAPS && r == COLL_OK; k++) {
      coll_work w = {.coll = c, .sendbuf = in, .recvbuf = out, .count = count,
                     .dtype = COLL_UINT8, .op = COLL_SUM};
      uint64_t t0 = coll_now_ns();
      r = coll_exec_submit(comm, &w);
      if (k >= 0) v[k] = (double)(coll_now_ns() - t0) * 1e-9;
    }
    if (r != COLL_OK) break;
    double L = median(v, CAL_LAPS), unit = 0;
    char f[160];
    if (a == COLL_ALGO_ONESHOT) {
      t->alpha_mb = L;
    } else if (coll_algo_cost(a, c, comm->nranks, c == COLL_COLL_ALL_REDUCE ? 8.0 : (double)n,
                              (double)comm->slot_bytes, 1.0, 0, 0, &unit, f, sizeof f) ==
                   COLL_OK && unit > 0) {
      t->alpha_algo[a] = L / unit;
    }
  }
  comm->probe_algo = COLL_ALGO_AUTO;
  free(in);
  free(out);
  return r;
}

/* Measures (rank 0's figures win) or reads the cache; every rank runs the same calls. */
static coll_result probe(struct coll_comm *comm, coll_tune_params *tp) {
  coll_tune_params t = *tp;
  const char *path = getenv("COLL_TUNE_FILE");
  /* Rank 0 decides whether to measure (its cache), then everyone does the same. */
  struct {
    double alpha, beta, gamma, alpha_mb, beta_cma, alpha_cma, alpha_algo[COLL_NUM_ALGOS];
    int32_t source, pad;
  } msg = {0};
  uint8_t buf[64];
  coll_result r;
  if (comm->rank == 0 && path && *path && read_cache(comm, path, &t))
    msg.source = 2;
  if ((r = run(comm, COLL_COLL_BROADCAST, &msg, sizeof msg, 0)) != COLL_OK) return r;
  if (msg.source != 2) {
    uint8_t *big = malloc(BIG);
    if (!big) return coll_fail(comm, COLL_ERR_SYSTEM, "out of memory measuring the links");
    memset(big, 1, BIG);
    double hop = 0, half = 0;
    memset(buf, 0, sizeof buf);
    r = ring_laps(comm, buf, &hop);
    if (r == COLL_OK) r = big_pingpong(comm, big, &half);
    if (r == COLL_OK) r = calibrate(comm, &t);
    free(big);
    if (r != COLL_OK) return r;
    if (comm->rank == 0) {
      t.alpha = hop > 0 ? hop : t.alpha;
      double b = (half - hop) / BIG;
      t.beta = b > 1e-12 ? b : t.beta;
      t.gamma = measure_gamma();
      if (t.gamma <= 0) t.gamma = 1e-12;
      t.source = 1;
      if (path && *path) write_cache(comm, path, &t);
    }
  }
  msg.alpha = t.alpha, msg.beta = t.beta, msg.gamma = t.gamma, msg.alpha_mb = t.alpha_mb;
  msg.beta_cma = t.beta_cma;
  msg.alpha_cma = t.alpha_cma;
  memcpy(msg.alpha_algo, t.alpha_algo, sizeof msg.alpha_algo);
  msg.source = t.source;
  if ((r = run(comm, COLL_COLL_BROADCAST, &msg, sizeof msg, 0)) != COLL_OK) return r;
  t.alpha = msg.alpha, t.beta = msg.beta, t.gamma = msg.gamma, t.alpha_mb = msg.alpha_mb;
  t.beta_cma = msg.beta_cma;
  t.alpha_cma = msg.alpha_cma;
  memcpy(t.alpha_algo, msg.alpha_algo, sizeof t.alpha_algo);
  t.source = msg.source;
  *tp = t;
  return COLL_OK;
}

coll_result coll_tune_init(struct coll_comm *comm) {
  coll_tune_params t;
  defaults(&t);
  comm->forced = COLL_ALGO_AUTO;
  const char *e = getenv("COLL_ALGO");
  if (e && *e && strcmp(e, "auto") != 0) {
    bool ok;
    coll_algo a = coll_algo_from_name(e, &ok);
    if (ok)
      comm->forced = a;
    else
      COLL_WARN(comm->rank, "COLL_ALGO=%s is not an algorithm (ring, tree, rd, rhd, oneshot, "
                "direct, mapped, pairwise, linear, auto); choosing automatically", e);
  }
  long on = 1;
  if (!coll_env_int("COLL_TUNE", 1, &on)) on = 1;
  /* The probe's calls are the library's own, the same on every rank by construction:
   * COLL_CHECK (which ranks may set differently) checks users' calls only. */
  bool check = comm->check;
  comm->check = false;
  /* Direct reads are probed whatever COLL_TUNE says: whether they are allowed is a fact
   * every rank must agree on, not a measurement. */
  double bcma = 0, acma = 0;
  coll_result pr = comm->nranks > 1 ? coll_direct_probe(comm, &bcma, &acma) : COLL_OK;
  if (pr == COLL_OK && comm->rank == 0 && bcma > 0 && on) t.beta_cma = bcma, t.alpha_cma = acma;
  if (pr == COLL_OK && on && comm->nranks > 1) pr = probe(comm, &t);
  comm->check = check;
  if (pr != COLL_OK) return pr;
  comm->tune = t;
  build_table(comm);
  comm->tuned = true;
  /* The probe's calls are not the user's: their first call is #0 on every rank (ranks 2
   * and up made fewer probe calls than 0 and 1). */
  pthread_mutex_lock(&comm->qmu);
  comm->next_seq = 0;
  pthread_mutex_unlock(&comm->qmu);
  COLL_INFO(comm->rank, "tuned (%s): alpha %.3f us, beta %.4f ns/B (%.2f GB/s), gamma %.4f "
            "ns/B, one-shot %.3f us, direct reads %s (%.4f ns/B)", t.source == 2 ? "from COLL_TUNE_FILE"
            : t.source == 1 ? "measured" : "defaults", t.alpha * 1e6, t.beta * 1e9,
            1e-9 / t.beta, t.gamma * 1e9, t.alpha_mb * 1e6,
            comm->direct_ok ? "allowed" : "not allowed", t.beta_cma * 1e9);
  return COLL_OK;
}

/* ---- telling users what was chosen and why (coll_trace.h) --------------------------- */

coll_result coll_comm_tune_params(coll_comm_t comm, double *alpha, double *beta, double *gamma,
                                  double *alpha_oneshot) {
  if (!comm) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_comm_tune_params: comm is NULL");
  if (alpha) *alpha = comm->tune.alpha;
  if (beta) *beta = comm->tune.beta;
  if (gamma) *gamma = comm->tune.gamma;
  if (alpha_oneshot) *alpha_oneshot = comm->tune.alpha_mb;
  return COLL_OK;
}

const char *coll_comm_last_algo(coll_comm_t comm) {
  int a = comm ? atomic_load_explicit(&comm->last_algo, memory_order_relaxed) : 0;
  return a > 0 ? coll_algo_name((coll_algo)(a - 1)) : NULL;
}

const char *coll_comm_algo_for(coll_comm_t comm, const char *coll, size_t bytes, char *why,
                               size_t why_len) {
  if (why && why_len) why[0] = 0;
  if (!comm || !coll) return NULL;
  int c = -1;
  for (int i = 0; i < COLL_NUM_COLLS; i++)
    if (strcmp(coll_coll_name((coll_coll_kind)i), coll) == 0) c = i;
  if (c < 0) return NULL;
  coll_work w = {.coll = (coll_coll_kind)c, .count = bytes, .dtype = COLL_UINT8};
  if (c == COLL_COLL_ALL_GATHER || c == COLL_COLL_REDUCE_SCATTER || c == COLL_COLL_ALL_TO_ALL ||
      c == COLL_COLL_GATHER || c == COLL_COLL_SCATTER)
    w.count = bytes / (size_t)comm->nranks;
  bool warned = comm->warned_forced[c];
  comm->warned_forced[c] = true; /* asking is not calling: no warning */
  coll_algo a = coll_tune_choose(comm, &w, 1);
  comm->warned_forced[c] = warned;
  if (why && why_len) {
    size_t used = 0;
    char f[160];
    for (size_t k = 0; k < NCAND && used + 1 < why_len; k++) {
      double s;
      if (!predict(comm, candidates[k], (coll_coll_kind)c, (double)bytes, &s, f, sizeof f))
        continue;
      if (candidates[k] == COLL_ALGO_ONESHOT &&
          !coll_oneshot_fits(comm, (coll_coll_kind)c, w.count, 1))
        continue;
      int m = snprintf(why + used, why_len - used, "%s%s %.3g us", used ? ", " : "",
                       coll_algo_name(candidates[k]), s * 1e6);
      if (m < 0) break;
      used += (size_t)m;
      if (used >= why_len) break;
    }
  }
  return coll_algo_name(a);
}
