/* tune.c — which row of the algorithm table runs each call, chosen from measured costs.
 *
 * At communicator creation the ranks measure the model's parameters (or read them from
 * the cache), with the communicator's own executor:
 *   α      a token passed round the ring of all ranks, 8 bytes, 200 laps: the median
 *          lap over the number of hops (on 2 ranks, half a ping-pong).
 *   β      ranks 0 and 1 bounce 1 MiB: (half the fastest round trip - α) / 1 MiB.
 *   γ      rank 0 reduces 64 KiB of float32 in cache: seconds per byte reduced.
 *   on several hosts (comm->hosts): β between rank 0 and the first other rank of its
 *          host, α the median half round trip of 8 bytes to it (the token's hop mixes
 *          the classes); α_x and β_x the same to the first rank of another host.  Flat
 *          rows are priced at the slower class, host-aware rows (hier) per class.
 *   per schedule (every row with a plan): a small call forced onto it — an 8-byte
 *          all-reduce, or a byte per rank of all-to-all (pairwise) or gather (linear) —
 *          median of 60, over the number of α terms in its formula: its own α.  With more
 *          ranks than cores an α is mostly the wait for a descheduled peer, and how much
 *          a pattern overlaps those waits differs (calibrate()).
 *   α_mb   the same 8-byte all-reduce on the one-shot row: its fixed cost.
 *   β_cma, α_cma  per byte and per call of reading a peer's memory (direct.c); whether
 *          ranks may do it at all is probed every time (a fact all must agree on).
 * Rank 0's figures are broadcast, so every rank builds the same table from the same
 * numbers and the same code: all ranks always choose the same algorithm for a call,
 * which they must (different schedules would not pair up).
 *
 * The same job gives the same bits.  Different algorithms add in different orders, so a
 * choice that wanders between runs changes the result's last bits.  Three things keep it
 * still: (1) every figure is rounded to a quarter octave (a factor 2^(1/4) = 1.19), so
 * the ±10% a quiet machine wanders mostly lands on the same value; (2) the figures are
 * cached by default, per shape of communicator (ranks, ranks on this host, hosts,
 * transport, slot size), in $XDG_CACHE_HOME/libcoll/tune (else ~/.cache/libcoll/tune): the first
 * run measures, every later run on this machine reads the same numbers and so builds
 * the same table; COLL_TUNE_FILE=path moves the cache, COLL_TUNE_FILE=none turns it off;
 * (3) COLL_ALGO=name pins the algorithm outright, and COLL_TUNE=0 uses fixed defaults.
 * The cache keeps a shape's first figures, but only figures measured on a quiet machine:
 * each rank reads how much of its time went to other processes while it measured
 * (base/foreign.c), and above COLL_TUNE_BUSY per cent (default 10) the figures are thrown
 * away: the communicator takes the fixed defaults (COLL_TUNE=0's), nothing is written,
 * and the next communicator of that shape measures again (judge()).  The ranks look once
 * early, after a few token laps, so a busy machine stops the measuring in a tenth of the
 * time (probe()).  The line records the share (foreign=).  COLL_TUNE=refresh measures
 * again on demand.
 *
 * The table: for every collective and every power-of-two size bucket, the row with the
 * smallest predicted time × its handicap (algo/table.c), each priced by its own formula
 * (algo.h) with the same model; and the best row with a plan, for calls the winner
 * cannot serve (device buffers, a message too big for a mailbox).  Rows usable only call
 * by call (mapped: buffers in windows) are priced per bucket too and taken at the call
 * when usable — before any FIFO schedule, since they move each byte once, and against
 * the other run paths by formula.  A call costs one table lookup.  Buckets are judged at
 * 1.5x their lower bound (the middle, geometrically near enough).
 *
 * COLL_ALGO=name forces a row; a call it cannot serve (tree has no all-gather, one-shot
 * needs one host and a small message) takes the table's choice instead, with a warning
 * the first time.
 *
 * Must never: let ranks decide from their own measurements, or measure on the hot path.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "algo.h"
#include "coll_trace.h"
#include "reduce.h"

#define LAPS 200
#define CAL_LAPS 60 /* 8-byte all-reduces per algorithm in calibrate() */
#define BIG (1u << 20)
#define BIG_REPS 4

static int bucket_of(size_t bytes) {
  int b = 0;
  while (bytes) b++, bytes >>= 1;
  return b < COLL_TUNE_BUCKETS ? b : COLL_TUNE_BUCKETS - 1;
}

static double bucket_bytes(int b) { return b == 0 ? 0 : 1.5 * ldexp(1.0, b - 1); }

/* The collectives the table covers (point-to-point needs no algorithm). */
static bool tabled(coll_coll_kind c) {
  return c != COLL_COLL_SEND && c != COLL_COLL_RECV && c != COLL_COLL_SENDRECV &&
         c != COLL_COLL_GROUP_P2P;
}

/* Predicted seconds of row e for c at n bytes on this communicator; false if it cannot
 * serve c.  A barrier is a one-byte all-reduce to a schedule. */
static bool price(struct coll_comm *comm, const coll_algo_entry *e, coll_coll_kind c, double n,
                  double *sec, char *formula, size_t flen) {
  const coll_tune_params *t = &comm->tune;
  if (!e || !e->cost || !coll_algo_serves(e->id, c, comm->nranks)) return false;
  if (c == COLL_COLL_BARRIER && e->plan) c = COLL_COLL_ALL_REDUCE, n = 1;
  coll_cost_model m = {.p = comm->nranks,
                       .slice = (double)comm->slot_bytes,
                       .alpha = t->alpha_algo[e->id] > 0 ? t->alpha_algo[e->id] : t->alpha,
                       .beta = t->beta,
                       .gamma = t->gamma,
                       .alpha_mb = t->alpha_mb,
                       .beta_cma = t->beta_cma,
                       .alpha_cma = t->alpha_cma,
                       .cores = comm->cores,
                       .hosts = comm->hosts.nhosts,
                       .local = comm->hosts.per_host,
                       .alpha_net = t->alpha_net,
                       .beta_net = t->beta_net,
                       .gpus = comm->dev_gpus};
  /* Link classes: a host-aware row prices each class with its own α and β (α inside a
   * host: the token's hop, never a row's own calibration, which a whole job measured);
   * a flat schedule on several hosts waits, step after step, for its slowest link. */
  if (e->link_classes)
    m.alpha = t->alpha;
  else if (comm->hosts.nhosts > 1) {
    if (t->alpha_algo[e->id] <= 0 && t->alpha_net > m.alpha) m.alpha = t->alpha_net;
    if (t->beta_net > m.beta) m.beta = t->beta_net;
  }
  return e->cost(c, n, &m, sec, formula, flen) == COLL_OK;
}

/* The elements of a call of c moving `bytes` (nccl-tests' size) of 1-byte elements. */
static size_t count_of(struct coll_comm *comm, coll_coll_kind c, size_t bytes) {
  return c == COLL_COLL_ALL_GATHER || c == COLL_COLL_REDUCE_SCATTER || c == COLL_COLL_ALL_TO_ALL ||
                 c == COLL_COLL_GATHER || c == COLL_COLL_SCATTER
             ? bytes / (size_t)comm->nranks
             : bytes;
}

static void build_table(struct coll_comm *comm) {
  char f[160];
  comm->per_call_rows = 0;
  for (int a = 0; a < COLL_NUM_ALGOS; a++)
    if (coll_algo_table[a].per_call) comm->per_call_rows |= 1u << a;
  for (int c = 0; c < COLL_NUM_COLLS; c++) {
    if (!tabled((coll_coll_kind)c)) continue;
    for (int b = 0; b < COLL_TUNE_BUCKETS; b++) {
      double n = bucket_bytes(b), best = INFINITY, best_plan = INFINITY, s;
      coll_algo pick = coll_algo_default((coll_coll_kind)c), pick_plan = pick;
      coll_work w = {.coll = (coll_coll_kind)c,
                     .count = count_of(comm, (coll_coll_kind)c, (size_t)n),
                     .dtype = COLL_UINT8};
      for (int a = 0; a < COLL_NUM_ALGOS; a++) {
        const coll_algo_entry *e = coll_algo_get((coll_algo)a);
        comm->cost_at[a][c][b] = INFINITY;
        if (!e || !price(comm, e, (coll_coll_kind)c, n, &s, f, sizeof f)) continue;
        s *= e->coll_handicap[c] > 0 ? e->coll_handicap[c] : e->handicap;
        comm->cost_at[a][c][b] = s;
        if (e->per_call || !coll_algo_usable(e, comm, &w, 1)) continue;
        if (e->preferable && !e->preferable(comm, (coll_coll_kind)c, n)) continue;
        if (s < best) best = s, pick = (coll_algo)a;
        if (e->plan && s < best_plan) best_plan = s, pick_plan = (coll_algo)a;
      }
      comm->choice[c][b] = (uint8_t)pick;
      comm->choice_plan[c][b] = (uint8_t)pick_plan;
    }
  }
}

/* ---- the choice, per call -------------------------------------------------------- */

static coll_algo choose(struct coll_comm *comm, const coll_work *w, size_t es, uint32_t declined) {
  coll_coll_kind c = w->coll;
  if (!tabled(c) || comm->nranks == 1)
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
  if (f != COLL_ALGO_AUTO && !(declined & (1u << f))) {
    if (coll_algo_usable(&coll_algo_table[f], comm, w, es)) return f;
    if (!comm->warned_forced[c]) {
      comm->warned_forced[c] = true;
      COLL_WARN(comm->rank,
                "COLL_ALGO=%s cannot serve %s #%llu (%zu bytes, %d ranks%s%s); "
                "using the tuner's choice instead",
                coll_algo_name(f), coll_coll_name(c), (unsigned long long)w->seq, bytes,
                comm->nranks, w->device || w->cuda_event ? ", device buffers" : "",
                f == COLL_ALGO_ONESHOT && !comm->mailboxes ? ", not all on one host" : "");
    }
  }
  /* Device buffers that the device path mapped for this call (w->peer_ok): its rows, by
   * their own formulas, which do not depend on the host links measured below. */
  if (w->device && w->peer_ok) {
    double best = INFINITY, s;
    coll_algo pick = COLL_ALGO_AUTO;
    for (int k = 0; k < COLL_NUM_ALGOS; k++) {
      const coll_algo_entry *e = coll_algo_get((coll_algo)k);
      if (!e || !e->device_only || (declined & (1u << k)) || !coll_algo_usable(e, comm, w, es))
        continue;
      if (price(comm, e, c, (double)bytes, &s, NULL, 0) && s < best) best = s, pick = (coll_algo)k;
    }
    if (pick != COLL_ALGO_AUTO) return pick;
  }
  if (!comm->tuned) /* measuring: the probe runs on rings, or on what it is timing */
    return comm->probe_algo != COLL_ALGO_AUTO ? comm->probe_algo : coll_algo_default(c);
  /* All-to-allv: the ranks' sizes differ and none knows the others', so there is no size
   * to look up that every rank agrees on: always its default schedule (COLL_ALGO=direct,
   * or mapped buffers, choose the single-copy paths, the same on every rank). */
  if (c == COLL_COLL_ALL_TO_ALLV) return coll_algo_default(c);
  int b = bucket_of(bytes);
  coll_algo a = (coll_algo)comm->choice[c][b];
  if ((declined & (1u << a)) || !coll_algo_usable(&coll_algo_table[a], comm, w, es))
    a = (coll_algo)comm->choice_plan[c][b]; /* a schedule serves whatever the call holds */
  /* The per-call rows only (a mask made with the table: this runs on every call).  A row
   * is asked whether it can serve the call only where it would win (`usable` is pure),
   * so a call it cannot beat never enters its file. */
  for (uint32_t m = comm->per_call_rows & ~declined; m; m &= m - 1) {
    int k = __builtin_ctz(m);
    if (!coll_algo_table[a].plan && !(comm->cost_at[k][c][b] < comm->cost_at[a][c][b])) continue;
    if (coll_algo_usable(&coll_algo_table[k], comm, w, es)) a = (coll_algo)k;
  }
  return a;
}

/* choose() names a row of the table on every path (never AUTO: the defaults, COLL_ALGO
 * and the choice tables all hold rows), so the row is an index away. */
const coll_algo_entry *coll_tune_row(struct coll_comm *comm, const coll_work *w, size_t es,
                                     uint32_t declined) {
  return &coll_algo_table[choose(comm, w, es, declined)];
}

coll_algo coll_tune_choose(struct coll_comm *comm, const coll_work *w, size_t es) {
  return choose(comm, w, es, 0);
}

/* ---- measuring ------------------------------------------------------------------- */

/* An in-place byte call of the probe (root: the root, or the peer of send/recv). */
static coll_result run(struct coll_comm *comm, coll_coll_kind c, void *buf, size_t count,
                       int peer) {
  return comm->exec_ops->bytes(comm, c, buf, buf, count, COLL_SUM, peer);
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

/* Seconds per hop of an 8-byte token passed round the ring (median of `laps` <= LAPS). */
static coll_result ring_laps(struct coll_comm *comm, uint8_t *buf, int laps, double *hop) {
  int n = comm->nranks, me = comm->rank, next = (me + 1) % n, prev = (me + n - 1) % n;
  double t[LAPS];
  coll_result r;
  for (int lap = -5; lap < laps; lap++) {
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
  *hop = median(t, laps) / n;
  return COLL_OK;
}

/* Half the round trip of `bytes` between rank 0 and `peer` (others return at once): the
 * fastest of `reps`, or with `median` the median (a small message's round trip is mostly
 * waiting, and the fastest would flatter it). */
static coll_result pingpong(struct coll_comm *comm, uint8_t *buf, size_t bytes, int peer, int reps,
                            bool med, double *half) {
  int me = comm->rank;
  coll_result r;
  double t[LAPS];
  *half = 0;
  if ((me != 0 && me != peer) || peer <= 0 || reps > LAPS) return COLL_OK;
  for (int i = -1; i < reps; i++) {
    uint64_t t0 = coll_now_ns();
    if (me == 0) {
      if ((r = run(comm, COLL_COLL_SEND, buf, bytes, peer)) != COLL_OK) return r;
      if ((r = run(comm, COLL_COLL_RECV, buf, bytes, peer)) != COLL_OK) return r;
    } else {
      if ((r = run(comm, COLL_COLL_RECV, buf, bytes, 0)) != COLL_OK) return r;
      if ((r = run(comm, COLL_COLL_SEND, buf, bytes, 0)) != COLL_OK) return r;
    }
    if (i >= 0) t[i] = (double)(coll_now_ns() - t0) * 1e-9;
  }
  qsort(t, (size_t)reps, sizeof *t, cmp_double);
  *half = (med ? median(t, reps) : t[0]) / 2;
  return COLL_OK;
}

/* The peers rank 0 measures the links with: the first other rank on its host (else rank
 * 1), and the first rank on another host (-1 on one host).  The same on every rank. */
static void probe_peers(const struct coll_comm *comm, int *inside, int *across) {
  const coll_hosts *hs = &comm->hosts;
  *inside = -1, *across = -1;
  for (int q = 1; q < comm->nranks; q++) {
    bool same = !hs->host || hs->host[q] == hs->host[0];
    if (same && *inside < 0) *inside = q;
    if (!same && *across < 0) *across = q;
  }
  if (*inside < 0) *inside = 1;
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
  /* Across hosts: 10 us and 10 Gb/s Ethernet, until measured. */
  t->alpha_net = 10e-6;
  t->beta_net = 1.0 / 1.25e9;
  t->source = COLL_TUNE_FROM_DEFAULTS;
  t->foreign = -1;
}

/* ---- the cache: one line per shape of communicator ------------------------------------ */

/* 6: lines carry foreign=, the share of the measuring that went elsewhere; lines of 5
 * and before may have been measured on a busy machine, so they are measured again. */
#define CACHE_FORMAT "libcoll-tune 6 "

static void key_of(struct coll_comm *comm, char *key, size_t len) {
  snprintf(key, len, "nranks=%d local=%d hosts=%d transport=%s slot=%zu", comm->nranks,
           comm->local_ranks, comm->hosts.nhosts, comm->transport ? comm->transport->name : "none",
           comm->slot_bytes);
}

/* COLL_TUNE_FILE, else $XDG_CACHE_HOME/libcoll/tune, else $HOME/.cache/libcoll/tune;
 * false when caching is off (COLL_TUNE_FILE=none or empty, or no home to put it in).
 * `mkdirs`: create the folders (rank 0, before writing). */
static bool cache_path(char *out, size_t len, bool mkdirs) {
  const char *e = getenv("COLL_TUNE_FILE");
  if (e) {
    if (!*e || strcmp(e, "none") == 0) return false;
    return (size_t)snprintf(out, len, "%s", e) < len;
  }
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  char dir[512];
  if (xdg && *xdg) {
    if ((size_t)snprintf(dir, sizeof dir, "%s", xdg) >= sizeof dir) return false;
  } else if (home && *home) {
    if ((size_t)snprintf(dir, sizeof dir, "%s/.cache", home) >= sizeof dir) return false;
    if (mkdirs) mkdir(dir, 0700);
  } else {
    return false;
  }
  if ((size_t)snprintf(out, len, "%s/libcoll", dir) >= len) return false;
  if (mkdirs) mkdir(out, 0700);
  size_t used = strlen(out);
  return (size_t)snprintf(out + used, len - used, "/tune") < len - used;
}

static bool read_cache(struct coll_comm *comm, const char *path, coll_tune_params *t) {
  FILE *f = fopen(path, "r");
  if (!f) return false;
  char key[160], line[768];
  key_of(comm, key, sizeof key);
  size_t fl = strlen(CACHE_FORMAT), kl = strlen(key);
  bool found = false;
  while (fgets(line, sizeof line, f)) {
    char *at = strstr(line, " alpha=");
    if (strncmp(line, CACHE_FORMAT, fl) != 0 || !at) continue;
    if ((size_t)(at - (line + fl)) != kl || strncmp(line + fl, key, kl)) continue;
    coll_tune_params x = {0};
    double *aa = x.alpha_algo;
    if (sscanf(at,
               " alpha=%lg beta=%lg gamma=%lg alpha_mb=%lg beta_cma=%lg alpha_cma=%lg "
               "ring=%lg tree=%lg rd=%lg rhd=%lg pairwise=%lg linear=%lg alpha_net=%lg "
               "beta_net=%lg",
               &x.alpha, &x.beta, &x.gamma, &x.alpha_mb, &x.beta_cma, &x.alpha_cma,
               &aa[COLL_ALGO_RING], &aa[COLL_ALGO_TREE], &aa[COLL_ALGO_RD], &aa[COLL_ALGO_RHD],
               &aa[COLL_ALGO_PAIRWISE], &aa[COLL_ALGO_LINEAR], &x.alpha_net, &x.beta_net) == 14 &&
        x.alpha > 0 && x.beta > 0 && x.gamma > 0 && x.alpha_mb >= 0 && x.beta_cma > 0 &&
        x.alpha_cma >= 0 && x.alpha_net > 0 && x.beta_net > 0) {
      const char *fo = strstr(at, " foreign=");
      if (!fo || sscanf(fo, " foreign=%lg", &x.foreign) != 1) x.foreign = -1;
      *t = x;
      t->source = COLL_TUNE_FROM_CACHE;
      found = true;
    }
  }
  fclose(f);
  return found;
}

/* Rewrites the file with this shape's line replaced: into a temporary file beside it,
 * then rename(), so a reader never sees half a file and two jobs writing at once leave
 * one whole file (one of them loses its line and measures again next time). */
static void write_cache(struct coll_comm *comm, const char *path, const coll_tune_params *t) {
  char key[160], line[768], tmp[600];
  key_of(comm, key, sizeof key);
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid()) >= sizeof tmp) return;
  FILE *out = fopen(tmp, "w");
  if (!out) {
    COLL_WARN(comm->rank,
              "the tuning cache %s cannot be written (%s); the measurement is "
              "not cached (COLL_TUNE_FILE=none turns the cache off)",
              path, strerror(errno));
    return;
  }
  FILE *in = fopen(path, "r");
  size_t fl = strlen(CACHE_FORMAT), kl = strlen(key);
  while (in && fgets(line, sizeof line, in)) {
    bool same = strncmp(line, CACHE_FORMAT, fl) == 0 && strncmp(line + fl, key, kl) == 0 &&
                line[fl + kl] == ' ';
    if (!same && strchr(line, '\n')) fputs(line, out);
  }
  if (in) fclose(in);
  const double *aa = t->alpha_algo;
  fprintf(out,
          CACHE_FORMAT "%s alpha=%.17g beta=%.17g gamma=%.17g alpha_mb=%.17g "
                       "beta_cma=%.17g alpha_cma=%.17g ring=%.17g tree=%.17g rd=%.17g rhd=%.17g "
                       "pairwise=%.17g linear=%.17g alpha_net=%.17g beta_net=%.17g foreign=%.3f\n",
          key, t->alpha, t->beta, t->gamma, t->alpha_mb, t->beta_cma, t->alpha_cma,
          aa[COLL_ALGO_RING], aa[COLL_ALGO_TREE], aa[COLL_ALGO_RD], aa[COLL_ALGO_RHD],
          aa[COLL_ALGO_PAIRWISE], aa[COLL_ALGO_LINEAR], t->alpha_net, t->beta_net, t->foreign);
  bool ok = fflush(out) == 0 && fsync(fileno(out)) == 0;
  ok = fclose(out) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) {
    COLL_WARN(comm->rank, "the tuning cache %s could not be replaced (%s)", path, strerror(errno));
    unlink(tmp);
  }
}

/* x rounded to a quarter octave: 2^(round(4·log2 x)/4).  Noise of a few percent between
 * runs then mostly gives the same figure, and so the same table. */
static double quantize(double x) { return x > 0 ? exp2(round(4 * log2(x)) / 4) : x; }

static void quantize_all(coll_tune_params *t) {
  t->alpha = quantize(t->alpha);
  t->beta = quantize(t->beta);
  t->gamma = quantize(t->gamma);
  t->alpha_mb = quantize(t->alpha_mb);
  t->beta_cma = quantize(t->beta_cma);
  t->alpha_cma = quantize(t->alpha_cma);
  t->alpha_net = quantize(t->alpha_net);
  t->beta_net = quantize(t->beta_net);
  for (int a = 0; a < COLL_NUM_ALGOS; a++) t->alpha_algo[a] = quantize(t->alpha_algo[a]);
}

/* The latency each algorithm really has here: an 8-byte all-reduce forced onto it, the
 * median of LAPS calls, divided by the number of α terms its formula has.  With more
 * ranks than cores a step's α is mostly the wait for a descheduled peer, which depends
 * on the pattern (a ring overlaps its waits, a butterfly does not): the token lap alone
 * mispriced them.  Rank 0's figures count, like the rest. */
static coll_result calibrate(struct coll_comm *comm, coll_tune_params *t) {
  size_t n = (size_t)comm->nranks;
  uint8_t *in = calloc(n > 8 ? n : 8, 1), *out = calloc(n > 8 ? n : 8, 1);
  double v[CAL_LAPS];
  coll_result r = COLL_OK;
  if (!in || !out) r = coll_fail(comm, COLL_ERR_SYSTEM, "out of memory calibrating");
  /* Every row with a schedule, on the first of these collectives it serves (8 bytes of
   * all-reduce; a byte per rank of all-to-all or gather), then the one-shot row. */
  static const coll_coll_kind probes[] = {COLL_COLL_ALL_REDUCE, COLL_COLL_ALL_TO_ALL,
                                          COLL_COLL_GATHER};
  for (int i = 0; i < COLL_NUM_ALGOS && r == COLL_OK; i++) {
    coll_algo a = (coll_algo)i;
    coll_coll_kind c = COLL_COLL_ALL_REDUCE;
    bool found = false;
    for (size_t k = 0; k < sizeof probes / sizeof *probes && !found; k++)
      if (coll_algo_serves(a, probes[k], comm->nranks)) c = probes[k], found = true;
    size_t count = c == COLL_COLL_ALL_REDUCE ? 8 : 1;
    coll_work probe = {.coll = c, .count = count, .dtype = COLL_UINT8};
    if (a == COLL_ALGO_ONESHOT ? !coll_algo_usable(coll_algo_get(a), comm, &probe, 1)
                               : !coll_algo_has_plan(a) || !found)
      continue;
    /* A host-aware row has no single α to calibrate: its classes are measured apart. */
    if (coll_algo_get(a)->link_classes) continue;
    comm->probe_algo = a;
    for (int k = -10; k < CAL_LAPS && r == COLL_OK; k++) {
      coll_work w = {.coll = c,
                     .sendbuf = in,
                     .recvbuf = out,
                     .count = count,
                     .dtype = COLL_UINT8,
                     .op = COLL_SUM};
      uint64_t t0 = coll_now_ns();
      r = comm->exec_ops->submit(comm, &w);
      if (k >= 0) v[k] = (double)(coll_now_ns() - t0) * 1e-9;
    }
    if (r != COLL_OK) break;
    double L = median(v, CAL_LAPS), unit = 0;
    char f[160];
    if (a == COLL_ALGO_ONESHOT) {
      t->alpha_mb = L;
    } else if (coll_algo_cost(a, c, comm->nranks, c == COLL_COLL_ALL_REDUCE ? 8.0 : (double)n,
                              (double)comm->slot_bytes, 1.0, 0, 0, &unit, f, sizeof f) == COLL_OK &&
               unit > 0) {
      t->alpha_algo[a] = L / unit;
    }
  }
  comm->probe_algo = COLL_ALGO_AUTO;
  free(in);
  free(out);
  return r;
}

/* ---- is the machine quiet enough to measure? ------------------------------------------ */

/* COLL_TUNE_BUSY: the per cent of a rank's time that may go to other processes while the
 * tuner measures (default BUSY_PCT; 100: always measure and cache).  Rank 0's counts. */
#define BUSY_PCT 10
#define BUSY_EARLY_LAPS 20        /* token laps before the first look */
#define BUSY_EARLY_NS 20000000ull /* 20 ms: a shorter window is not judged early */
static double busy_limit(struct coll_comm *comm) {
  long pct = BUSY_PCT;
  if (!coll_env_int("COLL_TUNE_BUSY", BUSY_PCT, &pct) || pct < 0 || pct > 100) {
    COLL_WARN(comm->rank, "COLL_TUNE_BUSY must be a percentage, 0 to 100; using %d", BUSY_PCT);
    pct = BUSY_PCT;
  }
  return (double)pct / 100;
}

/* The largest share, over the ranks, of their time since `since` that went to processes
 * outside the job (base/foreign.c), the same on every rank; -1 where none could tell.  A
 * rank whose window is shorter than `min_ns` does not judge (a quiet start-up is a few
 * ms, and one kernel worker's millisecond in it would read as a large share). */
static coll_result busy_share(struct coll_comm *comm, const coll_foreign_since *since,
                              bool mates_known, uint64_t min_ns, double *share) {
  *share = since->ok && coll_now_ns() - since->wall_ns >= min_ns
               ? coll_foreign_share(&comm->mates, mates_known, since)
               : -1;
  coll_work w = {.coll = COLL_COLL_ALL_REDUCE,
                 .sendbuf = share,
                 .recvbuf = share,
                 .count = 1,
                 .dtype = COLL_FLOAT64,
                 .op = COLL_MAX};
  return comm->exec_ops->submit(comm, &w);
}

/* Measures (rank 0's figures win) or reads the cache; every rank runs the same calls.
 * After BUSY_EARLY_LAPS token laps, if they took BUSY_EARLY_NS or more, the ranks look at
 * how busy the machine is: above the limit they stop (*busy set; judge() then gives the
 * communicator the defaults).  Beside a busy loop on one of two cores, 4 ranks took
 * 3.7 s to measure everything; the first laps take a tenth of that. */
static coll_result probe(struct coll_comm *comm, coll_tune_params *tp,
                         const coll_foreign_since *since, bool mates_known, double *busy,
                         double *limit) {
  coll_tune_params t = *tp;
  char path[640];
  bool cached = comm->rank == 0 && cache_path(path, sizeof path, false);
  /* Rank 0 decides whether to measure (its cache), then everyone does the same. */
  struct {
    double alpha, beta, gamma, alpha_mb, beta_cma, alpha_cma, alpha_algo[COLL_NUM_ALGOS];
    double alpha_net, beta_net, foreign, busy_limit;
    int32_t source, pad;
  } msg = {0};
  uint8_t buf[64];
  coll_result r;
  /* COLL_TUNE=refresh: measure again and replace this shape's cached figures (the cache
   * keeps the first run's measurement; one taken on a busy machine misprices). */
  const char *mode = getenv("COLL_TUNE");
  bool refresh = mode && strcmp(mode, "refresh") == 0;
  if (cached && !refresh && read_cache(comm, path, &t)) msg.source = COLL_TUNE_FROM_CACHE;
  /* Rank 0's limit counts too: ranks that stopped at different limits would not pair up. */
  if (comm->rank == 0) msg.busy_limit = busy_limit(comm);
  if ((r = run(comm, COLL_COLL_BROADCAST, &msg, sizeof msg, 0)) != COLL_OK) return r;
  *limit = msg.busy_limit;
  if (msg.source != COLL_TUNE_FROM_CACHE) {
    uint8_t *big = malloc(BIG);
    if (!big) return coll_fail(comm, COLL_ERR_SYSTEM, "out of memory measuring the links");
    memset(big, 1, BIG);
    double hop = 0, half = 0, in_small = 0, x_small = 0, x_big = 0;
    int inside, across;
    probe_peers(comm, &inside, &across);
    memset(buf, 0, sizeof buf);
    r = ring_laps(comm, buf, BUSY_EARLY_LAPS, &hop);
    if (r == COLL_OK) r = busy_share(comm, since, mates_known, BUSY_EARLY_NS, busy);
    if (r == COLL_OK && *busy > *limit) {
      free(big);
      t.source = COLL_TUNE_FROM_MEASURED;
      *tp = t;
      return COLL_OK;
    }
    *busy = -1;
    if (r == COLL_OK) r = ring_laps(comm, buf, LAPS, &hop);
    /* β inside a host (ranks 0 and its first neighbour there); across hosts, α and β
     * between rank 0 and the first rank of another host. */
    if (r == COLL_OK) r = pingpong(comm, big, BIG, inside, BIG_REPS, false, &half);
    if (r == COLL_OK && across > 0) r = pingpong(comm, big, 8, inside, CAL_LAPS, true, &in_small);
    if (r == COLL_OK && across > 0) r = pingpong(comm, big, 8, across, CAL_LAPS, true, &x_small);
    if (r == COLL_OK && across > 0) r = pingpong(comm, big, BIG, across, BIG_REPS, false, &x_big);
    if (r == COLL_OK) r = calibrate(comm, &t);
    free(big);
    if (r != COLL_OK) return r;
    if (comm->rank == 0) {
      t.alpha = hop > 0 ? hop : t.alpha;
      double b = (half - hop) / BIG;
      t.beta = b > 1e-12 ? b : t.beta;
      if (across > 0 && x_small > 0) {
        /* Several hosts: the token's hop averages both classes; α is the one inside (a
         * flat row is priced at the slower of the two anyway: price()). */
        if (in_small > 0) t.alpha = in_small;
        t.alpha_net = x_small;
        double bx = (x_big - x_small) / BIG;
        t.beta_net = bx > 1e-12 ? bx : t.beta_net;
      }
      t.gamma = measure_gamma();
      if (t.gamma <= 0) t.gamma = 1e-12;
      t.source = COLL_TUNE_FROM_MEASURED;
      quantize_all(&t);
    }
  }
  msg.alpha = t.alpha, msg.beta = t.beta, msg.gamma = t.gamma, msg.alpha_mb = t.alpha_mb;
  msg.beta_cma = t.beta_cma;
  msg.alpha_cma = t.alpha_cma;
  msg.alpha_net = t.alpha_net, msg.beta_net = t.beta_net, msg.foreign = t.foreign;
  memcpy(msg.alpha_algo, t.alpha_algo, sizeof msg.alpha_algo);
  msg.source = t.source;
  if ((r = run(comm, COLL_COLL_BROADCAST, &msg, sizeof msg, 0)) != COLL_OK) return r;
  t.alpha = msg.alpha, t.beta = msg.beta, t.gamma = msg.gamma, t.alpha_mb = msg.alpha_mb;
  t.beta_cma = msg.beta_cma;
  t.alpha_cma = msg.alpha_cma;
  t.alpha_net = msg.alpha_net, t.beta_net = msg.beta_net, t.foreign = msg.foreign;
  memcpy(t.alpha_algo, msg.alpha_algo, sizeof t.alpha_algo);
  t.source = (coll_tune_from)msg.source;
  *tp = t;
  return COLL_OK;
}

/* A measurement just taken (COLL_TUNE_FROM_MEASURED): how much of it went elsewhere (`early`: the
 * share probe() stopped at, else -1 and it is read now over the whole measuring).  The
 * largest share over the ranks counts, as the slowest rank set every figure it took
 * part in.  Up to the limit, the figures serve and rank 0 caches them with their share.
 * Above it they serve nobody: measured beside a busy loop, 4 ranks on 2 cores read α =
 * 1,953 µs where a quiet machine reads 1.6-2.3, and the table then chose rd for a 128 KiB
 * all-reduce (199-283 µs beside the loop, where staged took 90-167).  This communicator
 * takes the fixed defaults (COLL_TUNE=0's figures) and nothing is cached: the cache keeps
 * a shape's figures for good (the same table in every later run), and the next
 * communicator of that shape measures again. */
static coll_result judge(struct coll_comm *comm, coll_tune_params *t,
                         const coll_foreign_since *since, bool mates_known, double early,
                         double limit) {
  double share = early;
  coll_result r = COLL_OK;
  if (share < 0) r = busy_share(comm, since, mates_known, 0, &share);
  if (r != COLL_OK) return r;
  if (share > limit) {
    COLL_INFO(comm->rank,
              "the tuner measured while %.0f%% of a rank's time went to other processes "
              "(above COLL_TUNE_BUSY=%.0f%%): this communicator takes the fixed defaults "
              "and nothing is cached; the next one of this shape measures again",
              share * 100, limit * 100);
    defaults(t);
    t->source = COLL_TUNE_FROM_BUSY;
    t->foreign = share;
    return COLL_OK;
  }
  t->foreign = share;
  char path[640];
  if (comm->rank == 0 && cache_path(path, sizeof path, true)) write_cache(comm, path, t);
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
    if (ok) {
      comm->forced = a;
    } else {
      char names[160];
      coll_algo_names(names, sizeof names);
      COLL_WARN(comm->rank, "COLL_ALGO=%s is not an algorithm (%s); choosing automatically", e,
                names);
    }
  }
  long on = 1;
  if (!coll_env_int("COLL_TUNE", 1, &on)) on = 1; /* "refresh" too: probe() reads it */
  /* The probe's calls are the library's own, the same on every rank by construction:
   * COLL_CHECK (which ranks may set differently) checks users' calls only. */
  bool check = comm->check;
  comm->check = false;
  /* Nor is their waiting judged (backoff.c): at start-up the launcher and the kernel's
   * workers take the cores for milliseconds, and a table measured in futex mode would
   * misprice every small call (an oversubscribed rank yields plainly, as it did before
   * it knew its mates). */
  bool mates_known = atomic_exchange(&comm->mates.known, false);
  coll_foreign_since since;
  coll_foreign_mark(&comm->mates, mates_known, &since);
  /* Direct reads are probed whatever COLL_TUNE says: whether they are allowed is a fact
   * every rank must agree on, not a measurement. */
  double bcma = 0, acma = 0;
  coll_result pr = comm->nranks > 1 ? coll_direct_probe(comm, &bcma, &acma) : COLL_OK;
  if (pr == COLL_OK && comm->rank == 0 && bcma > 0 && on) t.beta_cma = bcma, t.alpha_cma = acma;
  double busy = -1, limit = 1;
  if (pr == COLL_OK && on && comm->nranks > 1)
    pr = probe(comm, &t, &since, mates_known, &busy, &limit);
  if (pr == COLL_OK && t.source == COLL_TUNE_FROM_MEASURED)
    pr = judge(comm, &t, &since, mates_known, busy, limit);
  comm->check = check;
  atomic_store(&comm->mates.known, mates_known);
  if (pr != COLL_OK) return pr;
  comm->tune = t;
  build_table(comm);
  comm->tuned = true;
  /* The probe's calls are not the user's: their first call is #0 on every rank (ranks 2
   * and up made fewer probe calls than 0 and 1). */
  pthread_mutex_lock(&comm->qmu);
  comm->next_seq = 0;
  pthread_mutex_unlock(&comm->qmu);
  char busy_words[96] = "";
  if (t.source != COLL_TUNE_FROM_DEFAULTS && t.foreign >= 0)
    snprintf(busy_words, sizeof busy_words, "%.0f%% of a rank's time went elsewhere meanwhile",
             t.foreign * 100);
  else if (t.source != COLL_TUNE_FROM_DEFAULTS)
    snprintf(busy_words, sizeof busy_words, "whether the machine was busy meanwhile is unknown");
  COLL_INFO(comm->rank,
            "tuned (%s): alpha %.3f us, beta %.4f ns/B (%.2f GB/s), gamma %.4f "
            "ns/B, one-shot %.3f us, direct reads %s (%.4f ns/B); %s",
            t.source == COLL_TUNE_FROM_CACHE      ? "from the cache"
            : t.source == COLL_TUNE_FROM_MEASURED ? "measured"
            : t.source == COLL_TUNE_FROM_BUSY     ? "defaults: the machine was busy"
                                                  : "defaults",
            t.alpha * 1e6, t.beta * 1e9, 1e-9 / t.beta, t.gamma * 1e9, t.alpha_mb * 1e6,
            comm->direct_ok ? "allowed" : "not allowed", t.beta_cma * 1e9, busy_words);
  if (comm->hosts.nhosts > 1)
    COLL_INFO(comm->rank,
              "%d hosts (%s ranks each): across hosts alpha %.3f us, beta %.4f ns/B (%.2f GB/s)",
              comm->hosts.nhosts, comm->hosts.per_host ? "the same number of" : "different",
              t.alpha_net * 1e6, t.beta_net * 1e9, 1e-9 / t.beta_net);
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

const char *coll_comm_tune_source(coll_comm_t comm, double *foreign) {
  if (foreign) *foreign = -1;
  if (!comm) return NULL;
  const coll_tune_params *t = &comm->tune;
  if (foreign && t->source != COLL_TUNE_FROM_DEFAULTS) *foreign = t->foreign;
  switch (t->source) {
  case COLL_TUNE_FROM_MEASURED: return "measured";
  case COLL_TUNE_FROM_CACHE: return "cache";
  case COLL_TUNE_FROM_BUSY: return "busy";
  case COLL_TUNE_FROM_DEFAULTS: break;
  }
  return "defaults";
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
  if (c == COLL_COLL_ALL_GATHER || c == COLL_COLL_REDUCE_SCATTER)
    w.count = bytes / (size_t)comm->nranks;
  bool warned = comm->warned_forced[c];
  comm->warned_forced[c] = true; /* asking is not calling: no warning */
  coll_algo a = coll_tune_choose(comm, &w, 1);
  comm->warned_forced[c] = warned;
  if (why && why_len) {
    size_t used = 0;
    char f[160];
    /* Every row usable for this call, at its word (the handicaps are not added). */
    for (int k = 0; k < COLL_NUM_ALGOS && used + 1 < why_len; k++) {
      const coll_algo_entry *e = coll_algo_get((coll_algo)k);
      double s;
      if (!e || !coll_algo_usable(e, comm, &w, 1) ||
          !price(comm, e, (coll_coll_kind)c, (double)bytes, &s, f, sizeof f))
        continue;
      int m = snprintf(why + used, why_len - used, "%s%s %.3g us", used ? ", " : "", e->name,
                       s * 1e6);
      if (m < 0) break;
      used += (size_t)m;
      if (used >= why_len) break;
    }
  }
  return coll_algo_name(a);
}

coll_result coll_comm_algo_cost(coll_comm_t comm, const char *coll, size_t bytes, const char *algo,
                                double *seconds, char *formula, size_t formula_len) {
  char dummy[8];
  if (!formula) formula = dummy, formula_len = sizeof dummy;
  if (!comm || !coll || !algo || !seconds)
    return coll_fail(comm, COLL_ERR_INVALID_ARG,
                     "coll_comm_algo_cost: comm, coll, algo and "
                     "seconds must not be NULL");
  int c = -1;
  for (int i = 0; i < COLL_NUM_COLLS; i++)
    if (strcmp(coll_coll_name((coll_coll_kind)i), coll) == 0) c = i;
  bool ok = false;
  coll_algo a = coll_algo_from_name(algo, &ok);
  if (c < 0 || !ok ||
      !price(comm, coll_algo_get(a), (coll_coll_kind)c, (double)bytes, seconds, formula,
             formula_len))
    return coll_fail(comm, COLL_ERR_INVALID_ARG,
                     "coll_comm_algo_cost: \"%s\" has no row \"%s\" "
                     "that serves it",
                     coll, algo);
  return COLL_OK;
}

coll_result coll_comm_hosts(coll_comm_t comm, int *nhosts, int *per_host, int *host_of) {
  if (!comm) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_comm_hosts: comm is NULL");
  const coll_hosts *hs = &comm->hosts;
  if (nhosts) *nhosts = hs->nhosts;
  if (per_host) *per_host = hs->per_host;
  for (int r = 0; host_of && r < comm->nranks; r++) host_of[r] = hs->host ? hs->host[r] : 0;
  return COLL_OK;
}

coll_result coll_comm_net_params(coll_comm_t comm, double *alpha_net, double *beta_net) {
  if (!comm) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_comm_net_params: comm is NULL");
  if (alpha_net) *alpha_net = comm->tune.alpha_net;
  if (beta_net) *beta_net = comm->tune.beta_net;
  return COLL_OK;
}

coll_result coll_comm_link_bytes(coll_comm_t comm, const char *coll, size_t count, coll_dtype dtype,
                                 const char *algo, int rank, uint64_t *inside, uint64_t *across) {
  if (!comm || !coll || !algo || !inside || !across)
    return coll_fail(comm, COLL_ERR_INVALID_ARG,
                     "coll_comm_link_bytes: comm, coll, algo, inside and across must not be NULL");
  int c = -1;
  for (int i = 0; i < COLL_NUM_COLLS; i++)
    if (strcmp(coll_coll_name((coll_coll_kind)i), coll) == 0) c = i;
  bool ok = false;
  coll_algo a = coll_algo_from_name(algo, &ok);
  size_t es = coll_elem_bytes(dtype);
  if (c < 0 || !ok || !coll_algo_has_plan(a) || rank < 0 || rank >= comm->nranks || !es)
    return coll_fail(comm, COLL_ERR_INVALID_ARG,
                     "coll_comm_link_bytes: \"%s\" by \"%s\" on rank %d: no such collective, "
                     "schedule or rank (%d ranks)",
                     coll, algo, rank, comm->nranks);
  coll_step *steps = calloc(coll_plan_max_steps(comm->nranks), sizeof *steps);
  if (!steps) return coll_fail(comm, COLL_ERR_SYSTEM, "coll_comm_link_bytes: out of memory");
  coll_plan_args pa = {.coll = (coll_coll_kind)c,
                       .algo = a,
                       .count = count,
                       .nranks = comm->nranks,
                       .rank = rank,
                       .hosts = &comm->hosts,
                       .slice = comm->slot_bytes / es};
  coll_result r = coll_plan_link_bytes(&pa, es, steps, inside, across);
  free(steps);
  if (r != COLL_OK)
    return coll_fail(comm, r, "coll_comm_link_bytes: no schedule for %s by %s", coll, algo);
  return COLL_OK;
}
