/* explain.c — coll-bench --explain: what every rank sent and received, step by step, and
 * how that compares with the α-β cost model.
 *
 * Nothing here describes an algorithm.  The collective runs once with tracing on; the
 * executor records each step it ran (coll_trace.h); the ranks gather those records to
 * rank 0 with an all-gather, and rank 0 prints them grouped by step.  So what is taught
 * is what ran.  Around that:
 *   - α and β are measured first, on this machine and transport, by a ping-pong between
 *     ranks 0 and 1: α = half the median round trip of an 8-byte message, β = (half the
 *     median round trip of a 32 MiB message − α) / 32 MiB;
 *   - the per-rank byte totals are summed from the recorded steps and set beside the
 *     formula (all-reduce: 2(N-1)/N·S per rank; exactly (S−|c_r|) + (S−|c_{r+1}|) for
 *     ring chunks c_i when N does not divide S; all-to-all: (N-1)/N·S sent and received
 *     by every rank, S its whole buffer; gather and scatter: (N-1)/N·S through the root,
 *     S the root's whole buffer);
 *   - the prediction comes from the library's own cost model (coll_cost_predict), the
 *     same formulas the algorithm files state, and the measured time (mean of -n calls,
 *     slowest rank) sits beside it.
 * Must never print anything that was not measured or recorded in this run.
 */
#include "explain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll_trace.h"

#define PROBE_BIG \
  (32u << 20) /* larger than the last-level cache, like the messages that need beta */

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int fail(const bench_explain_ctx *e, const char *what, coll_result r) {
  fprintf(stderr, "coll-bench: rank %d: --explain: %s failed: %s: %s\n", e->rank, what,
          coll_result_string(r), coll_comm_last_error(e->comm));
  return -1;
}

/* Median round trip (us) of `reps` ping-pongs of `bytes` between ranks 0 and 1. */
static int pingpong(bench_explain_ctx *e, void *buf, size_t bytes, int reps, double *median) {
  double *t = calloc((size_t)reps, sizeof *t);
  if (!t) return -1;
  coll_result r = COLL_OK;
  for (int i = 0; i < reps && r == COLL_OK; i++) {
    double t0 = now_us();
    if (e->rank == 0) {
      r = coll_send(buf, bytes, COLL_UINT8, 1, e->comm, NULL);
      if (r == COLL_OK) r = coll_recv(buf, bytes, COLL_UINT8, 1, e->comm, NULL);
    } else if (e->rank == 1) {
      r = coll_recv(buf, bytes, COLL_UINT8, 0, e->comm, NULL);
      if (r == COLL_OK) r = coll_send(buf, bytes, COLL_UINT8, 0, e->comm, NULL);
    }
    t[i] = now_us() - t0;
  }
  if (r != COLL_OK) {
    free(t);
    return fail(e, "the ping-pong probe", r);
  }
  qsort(t, (size_t)reps, sizeof *t, cmp_double);
  *median = t[reps / 2];
  free(t);
  return 0;
}

static void human(double b, char *out, size_t len) {
  if (b >= 1 << 20)
    snprintf(out, len, "%g MiB", b / (1 << 20));
  else if (b >= 1024)
    snprintf(out, len, "%g KiB", b / 1024);
  else
    snprintf(out, len, "%g B", b);
}

/* What the library measured when the communicator was created, and the algorithm it
 * picks at each size: the crossovers follow from those numbers and the cost formulas. */
static void print_choices(bench_explain_ctx *e) {
  FILE *f = e->out;
  double a, b, g, amb;
  if (coll_comm_tune_params(e->comm, &a, &b, &g, &amb) != COLL_OK) return;
  double foreign = -1;
  const char *src = coll_comm_tune_source(e->comm, &foreign);
  const char *how = strcmp(src, "measured") == 0 ? "measured at communicator creation"
                    : strcmp(src, "cache") == 0  ? "read from the tuner's cache"
                    : strcmp(src, "busy") == 0
                        ? "the fixed defaults, as the machine was busy while it measured"
                        : "the fixed defaults of COLL_TUNE=0";
  char share[96] = "";
  if (foreign >= 0)
    snprintf(share, sizeof share, "; %.0f%% of a rank's time went to other processes meanwhile",
             foreign * 100);
  fprintf(f,
          "# libcoll's own model, %s (tune.c; rank 0's figures used by all ranks%s):\n"
          "#   alpha %.3f us per step (token round the ring), beta %.4f ns/B (%.2f GB/s),"
          " gamma %.4f ns/B reduced, one-shot call %.3f us\n",
          how, share, a * 1e6, b * 1e9, b > 0 ? 1e-9 / b : 0.0, g * 1e9, amb * 1e6);
  int nh = 0, per = 0;
  double ax = 0, bx = 0;
  if (coll_comm_hosts(e->comm, &nh, &per, NULL) == COLL_OK && nh > 1 &&
      coll_comm_net_params(e->comm, &ax, &bx) == COLL_OK)
    fprintf(f,
            "#   %d hosts (%s): alpha and beta above are the links inside a host; across hosts "
            "alpha %.3f us, beta %.4f ns/B (%.2f GB/s)\n",
            nh, per ? "the same number of ranks on each" : "different numbers of ranks on each",
            ax * 1e6, bx * 1e9, bx > 0 ? 1e-9 / bx : 0.0);
  static const char *colls[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                "reduce",     "all_to_all", "gather",         "scatter"};
  fprintf(f, "# Algorithm chosen per size (COLL_ALGO=%s):\n",
          getenv("COLL_ALGO") ? getenv("COLL_ALGO") : "auto");
  for (size_t c = 0; c < sizeof colls / sizeof *colls; c++) {
    fprintf(f, "#   %-15s", colls[c]);
    const char *prev = NULL;
    double from = 0;
    for (int k = 0; k <= 31; k++) {
      double bytes = k ? (double)(1ull << (k - 1)) * 2 : 1; /* 1, 2, 4, ... 2 GiB */
      const char *now = coll_comm_algo_for(e->comm, colls[c], (size_t)bytes, NULL, 0);
      if (!now) break;
      if (prev && strcmp(now, prev) != 0) {
        char h1[32], h2[32];
        human(from, h1, sizeof h1);
        human(bytes / 2, h2, sizeof h2);
        fprintf(f, " %s %s..%s,", prev, h1, h2);
        from = bytes;
      }
      if (!prev) from = bytes;
      prev = now;
    }
    char h1[32];
    human(from, h1, sizeof h1);
    fprintf(f, " %s from %s\n", prev ? prev : "?", h1);
  }
  fprintf(f, "#\n");
}

int bench_explain_probe(bench_explain_ctx *e) {
  e->alpha = e->beta = 0;
  if (e->nranks < 2) {
    if (e->rank == 0)
      fprintf(e->out, "# alpha-beta probe: skipped, one rank sends no messages\n#\n");
    return 0;
  }
  void *buf = calloc(1, PROBE_BIG);
  if (!buf) return -1;
  double rt_small = 0, rt_big = 0;
  int rc = 0;
  if (e->rank <= 1) {
    if (pingpong(e, buf, 8, 50, &rt_small) || pingpong(e, buf, 8, 400, &rt_small) ||
        pingpong(e, buf, PROBE_BIG, 2, &rt_big) || pingpong(e, buf, PROBE_BIG, 9, &rt_big))
      rc = -1;
  }
  free(buf);
  double ab[2] = {rt_small / 2 * 1e-6, 0};
  if (rt_big / 2 > rt_small / 2) ab[1] = (rt_big / 2 - rt_small / 2) * 1e-6 / PROBE_BIG;
  coll_result r = coll_barrier(e->comm, NULL);
  if (rc || r != COLL_OK) return rc ? rc : fail(e, "coll_barrier", r);
  if ((r = coll_broadcast(ab, ab, 2, COLL_FLOAT64, 0, e->comm, NULL)) != COLL_OK)
    return fail(e, "coll_broadcast", r);
  e->alpha = ab[0];
  e->beta = ab[1];
  if (e->rank == 0)
    fprintf(
        e->out,
        "# alpha-beta probe (%s transport, ranks 0 and 1, blocking coll_send/coll_recv):\n"
        "#   alpha = half the median round trip of 8 B (of 400)           = %8.3f us per message\n"
        "#   beta  = (half the median round trip of 32 MiB (of 9) - alpha) / 32 MiB\n"
        "#         = %.4f ns/B, i.e. %.2f GB/s per link\n#\n",
        coll_comm_transport_name(e->comm), e->alpha * 1e6, e->beta * 1e9,
        e->beta > 0 ? 1e-9 / e->beta : 0.0);
  if (e->rank == 0) print_choices(e);
  return 0;
}

/* What one step did, in words. */
static void describe(const coll_trace_event *ev, const char *opname, char *buf, size_t len) {
  char c[16], in[16] = "", out[16] = "";
  snprintf(c, sizeof c, "c%d", ev->chunk);
  if (ev->peer_in >= 0) snprintf(in, sizeof in, "rank %d", ev->peer_in);
  if (ev->peer_out >= 0) snprintf(out, sizeof out, "rank %d", ev->peer_out);
  const char *w = ev->what;
  if (!strcmp(w, "send"))
    snprintf(buf, len, "send %s -> %s", c, out);
  else if (!strcmp(w, "recv"))
    snprintf(buf, len, "recv %s <- %s (final, keep)", c, in);
  else if (!strcmp(w, "recv-copy-send"))
    snprintf(buf, len, "recv %s <- %s, keep, pass -> %s", c, in, out);
  else if (!strcmp(w, "recv-reduce-send"))
    snprintf(buf, len, "recv %s <- %s, %s own %s, send -> %s", c, in, opname, c, out);
  else if (!strcmp(w, "recv-reduce-copy"))
    snprintf(buf, len, "recv %s <- %s, %s own %s = final %s", c, in, opname, c, c);
  else if (!strcmp(w, "recv-reduce-copy-send"))
    snprintf(buf, len, "recv %s <- %s, %s own %s = final, keep, send -> %s", c, in, opname, c, out);
  else if (!strcmp(w, "copy"))
    snprintf(buf, len, "copy own %s into place (local)", c);
  else
    snprintf(buf, len, "%s %s", w, c);
}

/* Expected bytes each rank sends, from the collective's definition (not the trace). */
static void expected_sent(bench_coll c, int n, int rank, int root, size_t count, size_t es,
                          double *formula, char *name, size_t name_len) {
  double S = (double)count * (double)es;
  switch (c) {
  case BENCH_ALL_REDUCE:
    *formula = 2.0 * (n - 1) / n * S;
    snprintf(name, name_len, "2(N-1)/N*S");
    break;
  case BENCH_ALL_GATHER:
  case BENCH_REDUCE_SCATTER: /* count is per rank here: S = N*count */
    *formula = (double)(n - 1) * S;
    snprintf(name, name_len, "(N-1)/N*(N*count)");
    break;
  case BENCH_BROADCAST: /* a chain: every rank but the last forwards the whole buffer */
    *formula = ((rank - root + n) % n == n - 1) ? 0 : S;
    snprintf(name, name_len, "S (0 at chain end)");
    break;
  case BENCH_REDUCE:
    *formula = rank == root ? 0 : S;
    snprintf(name, name_len, "S (0 at root)");
    break;
  case BENCH_ALL_TO_ALL: /* count is per block: S = N*count, every block but its own */
    *formula = (double)(n - 1) * S;
    snprintf(name, name_len, "(N-1)/N*(N*count)");
    break;
  case BENCH_GATHER: /* every rank but the root sends its block */
    *formula = rank == root ? 0 : S;
    snprintf(name, name_len, "count (0 at root)");
    break;
  case BENCH_SCATTER: /* the root sends every block but its own */
    *formula = rank == root ? (double)(n - 1) * S : 0;
    snprintf(name, name_len, "(N-1)*count at root");
    break;
  default:
    *formula = S;
    snprintf(name, name_len, "S");
    break;
  }
}

/* Several hosts: the bytes each rank sent over links inside its host and across hosts —
 * this call's from the trace, and the flat ring's and the host-aware all-reduce's from
 * their schedules (coll_comm_link_bytes: the plans the executor would run) — so that
 * "moves fewer bytes across hosts" is read off per rank and in all.  Formulas beside
 * them (N ranks, H hosts of n, S bytes): ring 2(N-1)/N*S per rank, all of it across for
 * a rank whose successor is on another host; hier 2(n-1)/n*S inside, 2(H-1)/H*S/n
 * across (algo/hier.c). */
static void print_link_classes(bench_explain_ctx *e, const bench_data *d, const bench_shape *sh,
                               const coll_trace_event *all, const uint64_t *counts, size_t stride,
                               const char *algo, const char *lib_coll) {
  FILE *f = e->out;
  int n = e->nranks, nh = 0, per = 0;
  int *host = calloc((size_t)n, sizeof *host);
  if (!host || coll_comm_hosts(e->comm, &nh, &per, host) != COLL_OK || nh < 2) {
    free(host);
    return;
  }
  /* the collectives hier serves: the ring's and hier's plans beside the call */
  bool ag = d->coll == BENCH_ALL_GATHER, ar = d->coll == BENCH_ALL_REDUCE || ag;
  fprintf(f,
          "# Bytes each rank sent per link class (%d hosts, %s; inside a host: shared memory, "
          "across hosts: the network):\n",
          nh, per ? "the same number of ranks on each" : "different numbers of ranks");
  fprintf(f, "#    rank    host %-25s%s\n", "  this call (traced)",
          ar ? "  flat ring (its plan)       hier (its plan)" : "");
  fprintf(f, "#                       inside       across%s\n",
          ar ? "        inside       across        inside       across" : "");
  unsigned long long tot[6] = {0};
  for (int r = 0; r < n; r++) {
    unsigned long long v[6] = {0};
    for (uint64_t i = 0; i < counts[r]; i++) {
      const coll_trace_event *ev = &all[(size_t)r * stride + i];
      if (ev->step < 0 || ev->peer_out < 0 || ev->peer_out >= n) continue;
      v[host[ev->peer_out] == host[r] ? 0 : 1] += ev->bytes_out;
    }
    uint64_t in, x;
    if (ar &&
        coll_comm_link_bytes(e->comm, lib_coll, sh->count, d->dtype, "ring", r, &in, &x) == COLL_OK)
      v[2] = in, v[3] = x;
    if (ar &&
        coll_comm_link_bytes(e->comm, lib_coll, sh->count, d->dtype, "hier", r, &in, &x) == COLL_OK)
      v[4] = in, v[5] = x;
    fprintf(f, "#    rank %-3d @ %-3d  %12llu %12llu", r, host[r], v[0], v[1]);
    if (ar) fprintf(f, "  %12llu %12llu  %12llu %12llu", v[2], v[3], v[4], v[5]);
    fprintf(f, "\n");
    for (int k = 0; k < 6; k++) tot[k] += v[k];
  }
  fprintf(f, "#    all ranks       %12llu %12llu", tot[0], tot[1]);
  if (ar) fprintf(f, "  %12llu %12llu  %12llu %12llu", tot[2], tot[3], tot[4], tot[5]);
  fprintf(f, "\n");
  if (ar) {
    double S = (double)sh->bytes;
    int boundaries = 0;
    for (int r = 0; r < n; r++) boundaries += host[r] != host[(r + 1) % n];
    fprintf(f,
            "# Across hosts in all: this call (%s) %llu B, the flat ring %llu B, hier %llu B.\n"
            "#   flat ring: %s = %.0f B per rank; the %d ranks whose next rank is on "
            "another host send all of it across\n",
            algo, tot[1], tot[3], tot[5], ag ? "(N-1)/N*S" : "2(N-1)/N*S",
            (ag ? 1.0 : 2.0) * (n - 1) / n * S, boundaries);
    if (per && ag)
      fprintf(f,
              "#   hier (H=%d hosts x n=%d): (n-1)/n*S = %.0f B inside and (H-1)/N*S = %.0f B "
              "across per rank\n",
              nh, per, (per - 1.0) / per * S, (nh - 1.0) / n * S);
    else if (per)
      fprintf(f,
              "#   hier (H=%d hosts x n=%d): 2(n-1)/n*S = %.0f B inside and 2(H-1)/H*S/n = %.0f "
              "B across per rank\n",
              nh, per, 2.0 * (per - 1) / per * S, 2.0 * (nh - 1) / nh * S / per);
    else
      fprintf(f, "#   hier: not applicable (hosts hold different numbers of ranks): its plan "
                 "is the flat ring's\n");
  }
  free(host);
}

static void print_explanation(bench_explain_ctx *e, const bench_data *d, const bench_shape *sh,
                              const coll_trace_event *all, const uint64_t *counts, size_t stride,
                              double measured_us) {
  FILE *f = e->out;
  int n = e->nranks;
  size_t es = bench_dtype_size(d->dtype);
  const char *opname = bench_coll_reduces(d->coll) ? bench_op_name(d->op) : "";
  const char *algo = "?";
  double traced_us = 0;
  uint64_t first = UINT64_MAX, last = 0;
  int max_step = -1;
  for (int r = 0; r < n; r++)
    for (uint64_t i = 0; i < counts[r]; i++) {
      const coll_trace_event *ev = &all[(size_t)r * stride + i];
      if (ev->step < 0) {
        algo = ev->algo;
        double us = (double)(ev->t_end_ns - ev->t_start_ns) / 1e3;
        if (us > traced_us) traced_us = us;
        if (ev->t_start_ns < first) first = ev->t_start_ns;
        if (ev->t_end_ns > last) last = ev->t_end_ns;
      }
      if (ev->step > max_step) max_step = ev->step;
    }
  fprintf(f,
          "#\n# Explain: %s, %d ranks, size %zu B (%zu %s per rank%s), %s%salgorithm %s, "
          "transport %s\n",
          bench_coll_name(d->coll), n, sh->bytes, sh->count, bench_dtype_name(d->dtype),
          d->coll == BENCH_ALL_GATHER || d->coll == BENCH_REDUCE_SCATTER ||
                  d->coll == BENCH_ALL_TO_ALL || d->coll == BENCH_GATHER || d->coll == BENCH_SCATTER
              ? ", S = N*count"
              : "",
          opname, *opname ? ", " : "", algo, coll_comm_transport_name(e->comm));

  /* Chunks, as the steps named them (sizes from the recorded step counts). */
  int maxc = -1;
  for (int r = 0; r < n; r++)
    for (uint64_t i = 0; i < counts[r]; i++)
      if (all[(size_t)r * stride + i].step >= 0 && all[(size_t)r * stride + i].chunk > maxc)
        maxc = all[(size_t)r * stride + i].chunk;
  if (maxc >= 0 && d->coll != BENCH_SENDRECV) {
    fprintf(f, "# Chunks moved (elements):");
    for (int c = 0; c <= maxc; c++) {
      uint64_t len = 0;
      for (int r = 0; r < n && !len; r++)
        for (uint64_t i = 0; i < counts[r]; i++) {
          const coll_trace_event *ev = &all[(size_t)r * stride + i];
          if (ev->step >= 0 && ev->chunk == c && ev->count) {
            len = ev->count;
            break;
          }
        }
      fprintf(f, " c%d=%llu", c, (unsigned long long)len);
    }
    fprintf(f, "\n");
  }
  if (max_step < 0 && (strcmp(algo, "mapped") == 0 || strcmp(algo, "direct") == 0)) {
    /* No schedule ran: the call loaded (and, mapped, stored into) the peers' buffers in
     * place, so there are no steps to list. */
    double S = (double)sh->bytes, cross = S * (n - 1) / n;
    bool reduces = bench_coll_reduces(d->coll);
    if (strcmp(algo, "direct") == 0) {
      fprintf(f, "# No FIFO steps: ranks read each other's buffers with process_vm_readv "
                 "(direct.c).\n");
    } else if (reduces) {
      const char *into = d->coll == BENCH_ALL_REDUCE ? "every rank's receive buffer"
                         : d->coll == BENCH_REDUCE   ? "the root's receive buffer"
                                                     : "its own receive buffer";
      fprintf(f,
              "# No FIFO steps: every rank's buffers are coll_mem_alloc memory that all "
              "ranks map (mapped.c).\n"
              "#   rank r loaded block r (S/N = %.0f B) of every rank's send buffer, "
              "reduced it in rank order,\n#   and stored it into block r of %s.\n"
              "#   Per rank it loaded S = %.0f B, of which (N-1)/N*S = %.0f B from other "
              "ranks' memory; no byte went\n#   through a slot (the ring sends "
              "2(N-1)/N*S per rank, each byte copied into a slot and out again).\n",
              S / n, into, S, cross);
    } else {
      fprintf(f,
              "# No FIFO steps: every rank's buffers are coll_mem_alloc memory that all "
              "ranks map (mapped.c).\n"
              "#   rank r stored its block (S/N = %.0f B) into block r of every rank's "
              "receive buffer:\n#   (N-1)/N*S = %.0f B per rank into other ranks' "
              "memory, none through a slot.\n",
              S / n, cross);
    }
    fprintf(f,
            "#   Traced %.2f us for the call (its two one-shot exchanges included); "
            "measured %.2f us per call.\n",
            traced_us, measured_us);
    return;
  }
  fprintf(f, "# Steps, as the executor ran them on every rank (slices of a step stream "
             "through the FIFO while later steps start):\n");
  int nh = 0, per = 0; /* hier's phases: n steps, 2H-1 steps, n steps (algo/hier.c) */
  bool hier = d->coll == BENCH_ALL_REDUCE && strcmp(algo, "hier") == 0 &&
              coll_comm_hosts(e->comm, &nh, &per, NULL) == COLL_OK && per > 1 &&
              sh->count >= (size_t)n;
  for (int s = 0; s <= max_step; s++) {
    const char *phase = "";
    if (hier)
      phase = s < per                ? "  (reduce-scatter inside each host)"
              : s < per + 2 * nh - 1 ? "  (all-reduce across hosts, shard by shard)"
                                     : "  (all-gather inside each host)";
    if (d->coll == BENCH_ALL_REDUCE && n > 1 && strcmp(algo, "ring") == 0)
      phase = s < n - 1    ? "  (reduce-scatter)"
              : s == n - 1 ? "  (receive ends the reduce-scatter, send starts the all-gather)"
                           : "  (all-gather)";
    fprintf(f, "#  step %d%s\n", s, phase);
    for (int r = 0; r < n; r++)
      for (uint64_t i = 0; i < counts[r]; i++) {
        const coll_trace_event *ev = &all[(size_t)r * stride + i];
        if (ev->step != s) continue;
        char what[160];
        describe(ev, opname, what, sizeof what);
        fprintf(f, "#    rank %-3d %-58s in %9llu B  out %9llu B\n", r, what,
                (unsigned long long)ev->bytes_in, (unsigned long long)ev->bytes_out);
      }
  }
  /* Totals per rank against the formula. */
  fprintf(f, "# Bytes per rank (summed from the steps above):\n");
  fprintf(f, "#    rank       sent(B)    received(B)   formula%s\n",
          d->coll == BENCH_ALL_REDUCE ? "                        exact: (S-|c_r|)+(S-|c_r+1|)"
                                      : "");
  unsigned long long tot_out = 0, tot_in = 0;
  double tot_formula = 0;
  char fname[32] = "";
  for (int r = 0; r < n; r++) {
    unsigned long long out = 0, in = 0;
    for (uint64_t i = 0; i < counts[r]; i++) {
      const coll_trace_event *ev = &all[(size_t)r * stride + i];
      if (ev->step < 0) continue;
      out += ev->bytes_out;
      in += ev->bytes_in;
    }
    double fv;
    expected_sent(d->coll, n, r, d->root, sh->count, es, &fv, fname, sizeof fname);
    if (d->coll == BENCH_ALL_REDUCE && n > 1) {
      /* ring chunks: count split into n parts, the first count % n one element longer */
      size_t base = sh->count / (size_t)n, extra = sh->count % (size_t)n;
      size_t c0 = base + ((size_t)r < extra), c1 = base + ((size_t)((r + 1) % n) < extra);
      unsigned long long exact = 2ull * sh->count * es - (c0 + c1) * es;
      fprintf(f, "#    rank %-3d %12llu %14llu   %s = %-12.1f  exact = %llu\n", r, out, in, fname,
              fv, exact);
    } else {
      fprintf(f, "#    rank %-3d %12llu %14llu   %s = %.1f\n", r, out, in, fname, fv);
    }
    tot_out += out;
    tot_in += in;
    tot_formula += fv;
  }
  fprintf(f, "#    total    %12llu %14llu   %.1f\n", tot_out, tot_in, tot_formula);
  if (d->coll == BENCH_ALL_REDUCE && n > 1) {
    size_t S = sh->count * es;
    fprintf(f,
            "# All-reduce = reduce-scatter (N-1 steps) + all-gather (N-1 steps): each rank "
            "sends every chunk but its own once\n# in each half, (S - |c_r|) + (S - "
            "|c_r+1|) bytes, which is 2(N-1)/N*S when N divides S; all ranks together "
            "send 2(N-1)*S = %llu B.\n",
            (unsigned long long)(2ull * (unsigned long long)(n - 1) * S));
  }
  /* The model. */
  static const char *lib_names[] = {"all_reduce", "all_gather", "reduce_scatter",
                                    "broadcast",  "reduce",     "sendrecv",
                                    "all_to_all", "gather",     "scatter"};
  print_link_classes(e, d, sh, all, counts, stride, algo, lib_names[d->coll]);
  size_t slice = 0;
  coll_comm_slice_bytes(e->comm, &slice);
  double predicted = 0;
  char formula[320] = "";
  if (coll_cost_predict(lib_names[d->coll], n, sh->bytes, slice, e->alpha, e->beta, &predicted,
                        formula, sizeof formula) == COLL_OK) {
    fprintf(f, "# Model (alpha %.3f us, beta %.4f ns/B, slice %zu B):\n#   %s\n", e->alpha * 1e6,
            e->beta * 1e9, slice, formula);
  }
  {
    char why[512];
    const char *chosen = coll_comm_algo_for(e->comm, lib_names[d->coll], sh->bytes, why,
                                            sizeof why);
    if (chosen && d->coll != BENCH_SENDRECV)
      fprintf(f, "# Why %s: the tuner's predictions at %zu B: %s\n", chosen, sh->bytes, why);
    const char *model = d->coll == BENCH_ALL_TO_ALL                           ? "pairwise"
                        : d->coll == BENCH_GATHER || d->coll == BENCH_SCATTER ? "linear"
                                                                              : "ring";
    double sec = 0;
    char rowf[320];
    if (chosen && strcmp(chosen, model) != 0 && d->coll != BENCH_SENDRECV &&
        coll_comm_algo_cost(e->comm, lib_names[d->coll], sh->bytes, chosen, &sec, rowf,
                            sizeof rowf) == COLL_OK)
      fprintf(f,
              "# (The %s model above is for comparison: this call ran %s, whose row in the "
              "algorithm table prices it as\n#   %s)\n",
              model, chosen, rowf);
  }
  fprintf(f,
          "# Measured: %.2f us (mean of %lu blocking calls, slowest rank); model/measured = "
          "%.2f\n",
          measured_us, e->iters, measured_us > 0 ? predicted * 1e6 / measured_us : 0);
  if (e->one_host)
    fprintf(f,
            "# The traced call: %.2f us from the first rank's start to the last rank's end "
            "(the longest single rank: %.2f us)\n",
            (double)(last - first) / 1e3, traced_us);
  else
    fprintf(f,
            "# The traced call: the longest single rank took %.2f us (hosts' clocks differ, so "
            "no span across ranks)\n",
            traced_us);
  if (e->ranks_per_core > 1.0)
    fprintf(f,
            "# Note: %.1f ranks per core here, so ranks take turns on the CPU and the model "
            "(which assumes every rank runs at once) is optimistic.\n",
            e->ranks_per_core);
  fflush(f);
}

int bench_explain_one(bench_explain_ctx *e, const bench_data *d, size_t size) {
  size_t es = bench_dtype_size(d->dtype);
  bench_shape sh = bench_shape_for(d->coll, size, es, e->nranks);
  void *sb = e->sendbuf, *rb = e->recvbuf;
  bench_fill_input(d, e->rank, sb, 0, sh.send_elems);
  coll_result r;
  for (unsigned long i = 0; i < e->warmup; i++)
    if (e->call(e->call_ctx, d, sb, rb, sh.count)) return -1;
  if ((r = coll_barrier(e->comm, NULL)) != COLL_OK) return fail(e, "coll_barrier", r);
  double t0 = now_us();
  for (unsigned long i = 0; i < e->iters; i++)
    if (e->call(e->call_ctx, d, sb, rb, sh.count)) return -1;
  double mean = (now_us() - t0) / (double)e->iters;
  if ((r = coll_all_reduce(&mean, &mean, 1, COLL_FLOAT64, COLL_MAX, e->comm, NULL)) != COLL_OK)
    return fail(e, "coll_all_reduce (timing)", r);

  /* One traced call. */
  if ((r = coll_barrier(e->comm, NULL)) != COLL_OK) return fail(e, "coll_barrier", r);
  if ((r = coll_trace_start(e->comm)) != COLL_OK) return fail(e, "coll_trace_start", r);
  int crc = e->call(e->call_ctx, d, sb, rb, sh.count);
  coll_trace_stop(e->comm);
  if (crc) return -1;
  size_t cap = 8 + 4 * (size_t)e->nranks, got = 0;
  coll_trace_event *mine = calloc(cap, sizeof *mine);
  coll_trace_event *all = calloc(cap * (size_t)e->nranks, sizeof *all);
  uint64_t *counts = calloc((size_t)e->nranks, sizeof *counts);
  int rc = -1;
  if (!mine || !all || !counts) goto out;
  if ((r = coll_trace_read(e->comm, mine, cap, &got)) != COLL_OK) {
    fail(e, "coll_trace_read", r);
    goto out;
  }
  uint64_t g = got < cap ? got : cap;
  if ((r = coll_all_gather(&g, counts, 1, COLL_UINT64, e->comm, NULL)) != COLL_OK ||
      (r = coll_all_gather(mine, all, cap * sizeof *mine, COLL_UINT8, e->comm, NULL)) != COLL_OK) {
    fail(e, "coll_all_gather (trace)", r);
    goto out;
  }
  if (e->rank == 0) print_explanation(e, d, &sh, all, counts, cap, mean);
  rc = 0;
out:
  free(mine);
  free(all);
  free(counts);
  return rc;
}
