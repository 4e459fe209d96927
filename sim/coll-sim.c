/* coll-sim — the scale simulator: libcoll's own plans run on a model of N = 2..4096 ranks.
 *
 * For every algorithm with a plan (ring, tree, rd, rhd, pairwise, linear: the rows of
 * libcoll/algo/table.c that have one) and every collective it serves, coll-sim builds
 * every rank's schedule with the library's plan functions and runs them through a
 * discrete-event model of the executor (sim/sim_engine.c: slices of one slot, rounds,
 * FIFOs of bounded depth; α and β per link, shm within a host and the network across
 * hosts, a host's NIC shared by all its ranks' flows).  It prints, per size, the
 * predicted time, algbw and busbw (nccl-tests' factors), the crossover table (which
 * algorithm wins at each size and N), and with --validate it checks every plan's
 * invariants at each N (sends and receives pair up with equal lengths, no deadlock with
 * FIFOs of --depth slots, every output element holds every contribution exactly once or
 * the block that belongs there: sim/sim_check.c).
 *
 * The model's numbers: the tuner's defaults (exec/tune.c) unless given, or the tuner's
 * cache of measured figures (--tune-cache), or flags.  docs/bandwidth-math.md reads the
 * crossover tables; lab/perf-log.md-style agreement with measured runs is in that section.
 *
 * Must never: start processes, open sockets or touch a communicator — it predicts; the
 * measurements are coll-bench's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "sim.h"

#define MAXN 32
#define MAXSIZES 64

static const coll_coll_kind all_colls[] = {COLL_COLL_ALL_REDUCE,     COLL_COLL_ALL_GATHER,
                                           COLL_COLL_REDUCE_SCATTER, COLL_COLL_BROADCAST,
                                           COLL_COLL_REDUCE,         COLL_COLL_ALL_TO_ALL,
                                           COLL_COLL_GATHER,         COLL_COLL_SCATTER};
#define NCOLLS (sizeof all_colls / sizeof *all_colls)

static void usage(void) {
  printf("usage: coll-sim [options]\n"
         "Runs libcoll's plans on a model of many ranks: predicted time, algbw and busbw per\n"
         "algorithm, crossover tables, and (--validate) each plan's invariants at each N.\n\n"
         "  -N, --ranks LIST      rank counts, e.g. 2,8,64,512,4096 (default), or A:B for the\n"
         "                        powers of two from A to B\n"
         "  -H, --per-host R      ranks per host (default 8; 1 = every rank its own host)\n"
         "      --cores C         cores per host for CPU work (default: R, one per rank)\n"
         "  -c, --colls LIST      all_reduce,all_gather,reduce_scatter,broadcast,reduce,\n"
         "                        all_to_all,gather,scatter or all (default: the first five\n"
         "                        and all_to_all)\n"
         "  -A, --algos LIST      ring,tree,rd,rhd,pairwise,linear (default: every one with a\n"
         "                        plan that serves the collective)\n"
         "  -b, -e, -f            smallest size, largest size, factor (default 8, 1G, 8)\n"
         "      --alpha-shm US    latency per message within a host, us (default 1: tune.c)\n"
         "      --bw-shm GBS      bytes per second of a copy into a peer's slot (default 5)\n"
         "      --alpha-net US    latency per message across hosts, us (default 10)\n"
         "      --bw-net GBS      one NIC direction, GB/s, shared by the host (default 12.5)\n"
         "      --burst BYTES     a token bucket of BYTES on every NIC direction, refilled at\n"
         "                        --bw-net (tc tbf, as scripts/netns.sh -r caps its links);\n"
         "                        bytes it covers go at --bw-line (default 0: no bucket)\n"
         "      --bw-line GBS     the unshaped link, GB/s (default 3: tcp over loopback, the\n"
         "                        tuner's beta)\n"
         "      --calls C         C calls back to back, NIC queues and buckets carried over;\n"
         "                        print the mean of the last C - W (default 1: one call)\n"
         "      --warmup W        calls not counted (default 0), as coll-bench's -w\n"
         "      --loop L          L calls as coll-bench's timed loop runs them: each rank\n"
         "                        starts its next call when it finished its last, no barrier\n"
         "                        between; prints the makespan / L (not with --calls)\n"
         "      --in-place        the calls in place, as coll-bench's in-place columns (the\n"
         "                        CPU model's W then counts one buffer per rank, not two)\n"
         "      --gamma-bw GBS    reduction speed, GB/s of input (default 10: tune.c)\n"
         "      --copy-bw GBS     local copies (COPY steps, kept slices); 0 = free (default)\n"
         "      --tune-cache[=F]  take alpha, beta, gamma for shm from the tuner's cache line\n"
         "                        of this shape (default file ~/.cache/libcoll/tune)\n"
         "      --cpu-model       price the executor's CPU work as its passes over memory\n"
         "                        (sim/sim_cpu.c), with this host's fitted figures below\n"
         "                        unless given; off: the plain alpha-beta-gamma model\n"
         "      --copy-ns C,M     memcpy, ns per byte in cache, from memory (0.020,0.11)\n"
         "      --nt-ns C,M       non-temporal copy, the same (0.035,0.080)\n"
         "      --reduce-ns C,M   reduction kernel, the same (0.029,0.165)\n"
         "      --slot-in-ns C,M  a copy out of a slot the peer wrote (0.0226,0.053)\n"
         "      --slot-out-ns C,M a copy into a slot the peer last read (0.026,0.088)\n"
         "      --cache MIB       last-level cache per host, MiB (20)\n"
         "      --cache-ways A    its associativity: lines fall on its sets at random and a\n"
         "                        set given more than A keeps A of them (16: sysfs; 0: the\n"
         "                        cache keeps any C of the W bytes, f = min(1, C/W))\n"
         "      --op-us US        CPU per slice operation (CPU model; default 0)\n"
         "      --call-us US      per call outside the slices (CPU model; 1, measured)\n"
         "      --switch-us US    CPU per operation when ranks outnumber cores, the fixed-\n"
         "                        cost stand-in for the scheduler (--no-sched only; 3.5)\n"
         "      --sched, --no-sched  when ranks outnumber cores, run the host's scheduler:\n"
         "                        ranks queue for a core, yield while they wait, sleep after\n"
         "                        --spin-yields and are woken by the post (default on)\n"
         "      --bind, --no-bind  with --sched: a host's rank i runs only on core i mod C,\n"
         "                        as coll_launch_local binds them (default), or anywhere the\n"
         "                        kernel puts it (COLL_LAUNCH_BIND=0)\n"
         "      --yield-us S,A    a yield that hands the core over, one with nobody to run\n"
         "                        (1.33,0.5: measured, sim-sched)\n"
         "      --wake-us I,C     a futex wake: to the sleeper running on an idle core, and\n"
         "                        the waker's CPU for it (21.6,1.86: sim-sched)\n"
         "      --spin-yields K   yields before a waiting rank sleeps (64: fifo.c)\n"
         "      --footprint-ns X  what a slot byte costs more when a host's FIFOs (depth x\n"
         "                        slot each) exceed the cache, times 1 - C/F (0.035,\n"
         "                        fitted; 0: off)\n"
         "      --rfo-ns X        what a byte written into a slot costs more while the\n"
         "                        receiver's core still holds it (0.09: sim-membw pingpong)\n"
         "      --l2 MIB          a core's private cache for --rfo-ns (1)\n"
         "      --mem-alone A     a byte from memory costs an operation running alone on its\n"
         "                        host A times what it costs with every core running one\n"
         "                        (0.64: sim-membw 1 against 2 threads; 1: off)\n"
         "      --membw FILE      copy, nt copy and reduce priced from sim-membw's table in\n"
         "                        FILE (its W times its threads = the host's W; several runs:\n"
         "                        the smallest per W) instead of the two-point mixture\n"
         "      --slot BYTES      FIFO slot = slice (default 64K, 256K when --cores is less\n"
         "                        than the ranks per host: shm.c's rule)\n"
         "      --depth D         slots per FIFO (default 8, shm's)\n"
         "      --max-a2a N       largest N for all-to-all and gather/scatter timing (its\n"
         "                        plans and FIFOs grow as N^2; default 1024)\n"
         "      --no-table        skip the per-size tables\n"
         "      --crossover       print the crossover tables (which algorithm wins)\n"
         "      --validate        check every plan's invariants at each N\n"
         "      --trace FILE      write the predicted timeline as a Perfetto/Chrome trace\n"
         "                        (ui.perfetto.dev), in COLL_TRACE's format: each case's ranks\n"
         "                        as processes, their calls, operations and (scheduler) time\n"
         "                        on a core; meant for one case (-N, -c, -A, -b = -e)\n"
         "  -h, --help            this text\n");
}

typedef struct {
  int ns[MAXN], nn;
  int per_host, cores;
  bool colls[NCOLLS];
  bool algos[COLL_NUM_ALGOS], algo_given;
  double sizes[MAXSIZES];
  int nsizes;
  double alpha_shm, bw_shm, alpha_net, bw_net, gamma_bw, copy_bw;
  double burst, bw_line;
  int calls, warmup, loop;
  const char *tune_cache;
  size_t slot;
  int depth, max_a2a;
  bool table, crossover, validate;
  bool in_place; /* --in-place: the calls in place (sendbuf == recvbuf) */
  bool slot_given, alpha_given;
  sim_cpu cpu; /* --cpu-model and its figures */
  const char *trace_path;
  sim_trace *trace; /* --trace: open while predict runs */
} opts;

/* This host's CPU model (2-core AMD EPYC VM; docs/bandwidth-math.md section 8 says how
 * each figure was obtained): the kernels' speeds, slot_in and C measured with
 * build/sim/sim-membw (two threads: both cores busy), mem_alone with one thread against
 * two, rfo with `sim-membw pingpong`; call from coll-bench's 64-512 B all-reduce at N=2
 * (1 us); l2_bytes from lscpu; fitted: slot_out in cache on ring all-reduce N=2 and N=3
 * at 1 MiB (set G, least squares; the rfo term carries most of what it once stood for),
 * the core hand-over on ring N=3 1 MiB (--no-sched only), the FIFOs' footprint on tree
 * N=8 16 MiB (sim/data/runs_sched_c.csv); op is 0 (a slice's fixed cost is not separable
 * from α and call on this data).  Everything else the model is compared with is
 * predicted. */
static const sim_cpu host_cpu = {.on = true,
                                 .copy = {0.020e-9, 0.11e-9},
                                 .nt_copy = {0.035e-9, 0.080e-9},
                                 .reduce = {0.029e-9, 0.165e-9},
                                 .slot_in = {0.0226e-9, 0.053e-9},
                                 .slot_out = {0.026e-9, 0.088e-9},
                                 .cache_bytes = 20.0 * 1024 * 1024,
                                 .cache_ways = 16,
                                 .op = 0.0,
                                 .call = 1e-6,
                                 .switch_cost = 3.5e-6,
                                 .nt_bytes = 16.0 * 1024 * 1024,
                                 .sched = true,
                                 .bound = true,
                                 .yield_switch = 1.33e-6,
                                 .yield_alone = 0.5e-6,
                                 .wake_idle = 21.6e-6,
                                 .wake_cost = 1.86e-6,
                                 .spin_yields = 64,
                                 .footprint = 0.035e-9,
                                 .mem_alone = 0.64,
                                 .rfo = 0.09e-9,
                                 .l2_bytes = 1024.0 * 1024};
/* α of a hop on this host, the tuner's ring-lap figure: 0.2 us with a core per rank
 * (it spins), 1.6 us when ranks outnumber cores (they yield and sleep). */
#define HOST_ALPHA_US 0.2
#define HOST_ALPHA_OVERSUB_US 1.6

static bool parse_pair(const char *v, double x[2]) {
  double a, b;
  if (sscanf(v, "%lg,%lg", &a, &b) != 2 || a < 0 || b < 0) return false;
  x[0] = a * 1e-9, x[1] = b * 1e-9;
  return true;
}

static bool parse_list_n(const char *s, opts *o) {
  o->nn = 0;
  const char *colon = strchr(s, ':');
  if (colon) {
    int a = atoi(s), b = atoi(colon + 1);
    if (a < 2 || b < a || b > 32767) return false;
    for (long v = 1; v <= b && o->nn < MAXN; v *= 2)
      if (v >= a) o->ns[o->nn++] = (int)v;
    return o->nn > 0;
  }
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *t = strtok(buf, ","); t && o->nn < MAXN; t = strtok(NULL, ",")) {
    int v = atoi(t);
    if (v < 2 || v > 32767) return false;
    o->ns[o->nn++] = v;
  }
  return o->nn > 0;
}

static int coll_index(const char *s) {
  for (size_t i = 0; i < NCOLLS; i++)
    if (strcmp(s, coll_coll_name(all_colls[i])) == 0) return (int)i;
  return -1;
}

/* The tuner's cache line for nranks=n local=n transport=shm (exec/tune.c's format). */
static bool read_tune_cache(const char *path, int n, opts *o) {
  FILE *f = fopen(path, "r");
  if (!f) return false;
  char line[1024], key[96];
  snprintf(key, sizeof key, "nranks=%d local=%d transport=shm ", n, n);
  bool found = false;
  while (fgets(line, sizeof line, f)) {
    char *k = strstr(line, key), *a = strstr(line, " alpha=");
    double al, be, ga;
    if (!k || !a || sscanf(a, " alpha=%lg beta=%lg gamma=%lg", &al, &be, &ga) != 3) continue;
    o->alpha_shm = al * 1e6, o->bw_shm = 1e-9 / be, o->gamma_bw = 1e-9 / ga;
    o->alpha_given = true;
    found = true;
  }
  fclose(f);
  return found;
}

/* sim-membw's output (one run or several appended): per W the smallest cost over the
 * runs, W times the run's threads (the model's W is the host's total), in W order. */
static bool read_membw(const char *path, sim_cpu *c) {
  FILE *f = fopen(path, "r");
  if (!f) return false;
  char line[512];
  int threads = 0;
  c->ncurve = 0;
  while (fgets(line, sizeof line, f)) {
    const char *t = strstr(line, "ns per byte of output, ");
    if (line[0] == '#') {
      if (t) threads = atoi(t + strlen("ns per byte of output, "));
      continue;
    }
    double w, x[3];
    if (threads < 1 || sscanf(line, "%lg %lg %lg %lg", &w, &x[0], &x[1], &x[2]) != 4) continue;
    w *= threads;
    int i = 0;
    while (i < c->ncurve && c->curve_ws[i] < w) i++;
    if (i < c->ncurve && c->curve_ws[i] == w) {
      for (int k = 0; k < 3; k++)
        if (x[k] * 1e-9 < c->curve[k][i]) c->curve[k][i] = x[k] * 1e-9;
      continue;
    }
    if (c->ncurve == 32) break;
    for (int j = c->ncurve; j > i; j--) {
      c->curve_ws[j] = c->curve_ws[j - 1];
      for (int k = 0; k < 3; k++) c->curve[k][j] = c->curve[k][j - 1];
    }
    c->curve_ws[i] = w;
    for (int k = 0; k < 3; k++) c->curve[k][i] = x[k] * 1e-9;
    c->ncurve++;
  }
  fclose(f);
  return c->ncurve >= 2;
}

static sim_model model_for(const opts *o, int n) {
  sim_model m = {.nranks = n,
                 .per_host = o->per_host < n ? o->per_host : n,
                 .cores = o->cores,
                 .slot = o->slot,
                 .depth = o->depth};
  m.alpha[SIM_SHM] = o->alpha_shm * 1e-6, m.beta[SIM_SHM] = 1e-9 / o->bw_shm;
  m.alpha[SIM_NET] = o->alpha_net * 1e-6, m.beta[SIM_NET] = 1e-9 / o->bw_net;
  m.burst = o->burst, m.beta_line = 1e-9 / o->bw_line;
  m.calls = o->calls, m.warmup = o->warmup, m.loop = o->loop;
  m.gamma = o->gamma_bw > 0 ? 1e-9 / o->gamma_bw : 0;
  m.beta_copy = o->copy_bw > 0 ? 1e-9 / o->copy_bw : 0;
  m.cpu = o->cpu;
  int cores = o->cores > 0 ? o->cores : m.per_host;
  /* shm.c: when a host's ranks outnumber its cores the slots are 256 KiB */
  if (!o->slot_given && m.per_host > cores) m.slot = 256 * 1024;
  if (m.cpu.on && !o->alpha_given) /* the scheduler model prices the yields itself */
    m.alpha[SIM_SHM] = (m.per_host > cores && !m.cpu.sched ? HOST_ALPHA_OVERSUB_US
                                                           : HOST_ALPHA_US) *
                       1e-6;
  return m;
}

static bool big_n_ok(const opts *o, coll_coll_kind c, int n) {
  bool square = c == COLL_COLL_ALL_TO_ALL || c == COLL_COLL_GATHER || c == COLL_COLL_SCATTER;
  return !square || n <= o->max_a2a;
}

static bool algo_serves(const opts *o, coll_algo a, coll_coll_kind c, int n) {
  if (!coll_algo_has_plan(a) || !coll_algo_serves(a, c, n)) return false;
  return !o->algo_given || o->algos[a];
}

static void print_size(double b, char *out, size_t len) {
  const char *u[] = {"B", "K", "M", "G", "T"};
  int i = 0;
  while (b >= 1024 && i < 4 && fmod(b, 1024) == 0) b /= 1024, i++;
  snprintf(out, len, "%.0f%s", b, u[i]);
}

/* ---- validation ----------------------------------------------------------------------- */

static int validate(const opts *o) {
  int failures = 0;
  printf("# Validation: every plan at each N, FIFOs of %d slots; counts chosen so chunks are "
         "uneven and steps take several slices\n",
         o->depth);
  for (int ni = 0; ni < o->nn; ni++) {
    int n = o->ns[ni];
    for (size_t ci = 0; ci < NCOLLS; ci++) {
      coll_coll_kind c = all_colls[ci];
      if (!o->colls[ci] || !big_n_ok(o, c, n)) continue;
      for (int a = 1; a < COLL_NUM_ALGOS; a++) {
        if (!algo_serves(o, (coll_algo)a, c, n)) continue;
        bool rooted = c == COLL_COLL_BROADCAST || c == COLL_COLL_REDUCE || c == COLL_COLL_GATHER ||
                      c == COLL_COLL_SCATTER;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int cases = 0;
        char why[512] = "";
        coll_result rc = COLL_OK;
        for (int root = 0; root < (rooted ? 2 : 1) && rc == COLL_OK; root++)
          for (int ip = 0; ip < 2 && rc == COLL_OK; ip++) {
            size_t count, slice;
            sim_validation_case(c, (coll_algo)a, n, &count, &slice);
            sim_call call = {.coll = c,
                             .algo = (coll_algo)a,
                             .count = count,
                             .es = 1,
                             .root = root ? n / 2 + 1 : 0,
                             .in_place = ip};
            if (call.root >= n) call.root = n - 1;
            sim_model m = {.nranks = n, .per_host = n, .slot = slice, .depth = o->depth};
            sim_result res;
            rc = sim_call_run(&m, &call, true, NULL, NULL, &res, why, sizeof why);
            cases++;
          }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        printf("#   N=%-5d %-15s %-9s %s  (%d cases, %.2f s)%s%s\n", n, coll_coll_name(c),
               coll_algo_name((coll_algo)a), rc == COLL_OK ? "ok  " : "FAIL", cases, s,
               rc == COLL_OK ? "" : ": ", rc == COLL_OK ? "" : why);
        if (rc != COLL_OK) failures++;
      }
    }
  }
  return failures;
}

/* ---- prediction ---------------------------------------------------------------------- */

static int predict(const opts *o) {
  const size_t es = 4; /* float32, as coll-bench's default */
  int failures = 0;
  static char winner[NCOLLS][MAXN][MAXSIZES][12];
  memset(winner, 0, sizeof winner);
  for (size_t ci = 0; ci < NCOLLS; ci++) {
    coll_coll_kind c = all_colls[ci];
    if (!o->colls[ci]) continue;
    for (int ni = 0; ni < o->nn; ni++) {
      int n = o->ns[ni];
      if (!big_n_ok(o, c, n)) {
        printf("# %s N=%d: skipped (all-to-all, gather and scatter stop at --max-a2a %d)\n",
               coll_coll_name(c), n, o->max_a2a);
        continue;
      }
      sim_model m = model_for(o, n);
      if (o->table)
        printf("# %s, N=%d (%d hosts x %d ranks, %d cores per host)\n#%11s %12s %-9s "
               "%12s %9s %9s\n",
               coll_coll_name(c), n, (n + m.per_host - 1) / m.per_host, m.per_host,
               m.cores ? m.cores : m.per_host, "size", "count", "algo", "time(us)", "algbw",
               "busbw");
      for (int si = 0; si < o->nsizes; si++) {
        size_t count = sim_count_for(c, o->sizes[si], es, n);
        if (count == 0) continue;
        double best = INFINITY;
        for (int a = 1; a < COLL_NUM_ALGOS; a++) {
          if (!algo_serves(o, (coll_algo)a, c, n)) continue;
          sim_call call = {
              .coll = c, .algo = (coll_algo)a, .count = count, .es = es, .in_place = o->in_place};
          sim_result res;
          char why[512];
          if (o->trace) {
            char sz[32];
            print_size(sim_call_bytes(&call, n), sz, sizeof sz);
            snprintf(o->trace->label, sizeof o->trace->label, "%s %s N=%d %s", coll_coll_name(c),
                     coll_algo_name((coll_algo)a), n, sz);
            m.trace = o->trace;
          }
          coll_result rc = sim_call_run(&m, &call, false, NULL, NULL, &res, why, sizeof why);
          if (rc != COLL_OK) {
            printf("# %s/%s N=%d: %s\n", coll_algo_name((coll_algo)a), coll_coll_name(c), n, why);
            failures++;
            continue;
          }
          double bytes = sim_call_bytes(&call, n);
          double algbw = bytes / 1e9 / res.seconds;
          if (o->table) {
            char sz[32];
            print_size(bytes, sz, sizeof sz);
            printf("%12s %12zu %-9s %12.2f %9.2f %9.2f\n", sz, count, coll_algo_name((coll_algo)a),
                   res.seconds * 1e6, algbw, algbw * sim_bus_factor(c, n));
          }
          if (res.seconds < best) {
            best = res.seconds;
            snprintf(winner[ci][ni][si], sizeof winner[ci][ni][si], "%s",
                     coll_algo_name((coll_algo)a));
          }
        }
      }
    }
  }
  if (o->crossover) {
    for (size_t ci = 0; ci < NCOLLS; ci++) {
      if (!o->colls[ci]) continue;
      printf("# Crossover: %s, the fastest plan per size (rows: N)\n#%6s",
             coll_coll_name(all_colls[ci]), "N");
      for (int si = 0; si < o->nsizes; si++) {
        char sz[32];
        print_size(o->sizes[si], sz, sizeof sz);
        printf(" %6s", sz);
      }
      printf("\n");
      for (int ni = 0; ni < o->nn; ni++) {
        printf(" %6d", o->ns[ni]);
        for (int si = 0; si < o->nsizes; si++)
          printf(" %6s", winner[ci][ni][si][0] ? winner[ci][ni][si] : "-");
        printf("\n");
      }
    }
  }
  return failures;
}

int main(int argc, char **argv) {
  opts o = {.per_host = 8,
            .alpha_shm = 1.0,
            .bw_shm = 5.0,
            .alpha_net = 10.0,
            .bw_net = 12.5,
            .bw_line = 3.0,
            .gamma_bw = 10.0,
            .slot = 65536,
            .depth = 8,
            .max_a2a = 1024,
            .table = true};
  parse_list_n("2,8,64,512,4096", &o);
  for (size_t i = 0; i < NCOLLS; i++) o.colls[i] = i < 6;
  double b = 8, e = 1 << 30, f = 8;
  bool used_cache = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(s, l) ((strcmp(a, s) == 0 || strcmp(a, l) == 0) && v && ++i)
#define LONG(l) (strcmp(a, l) == 0 && v && ++i)
    size_t sz;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage();
      return 0;
    } else if (ARG("-N", "--ranks")) {
      if (!parse_list_n(v, &o)) {
        fprintf(stderr, "coll-sim: bad rank list %s (2..32767)\n", v);
        return 2;
      }
    } else if (ARG("-H", "--per-host")) {
      o.per_host = atoi(v);
    } else if (LONG("--cores")) {
      o.cores = atoi(v);
    } else if (ARG("-c", "--colls")) {
      if (strcmp(v, "all") == 0) {
        for (size_t k = 0; k < NCOLLS; k++) o.colls[k] = true;
      } else {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", v);
        memset(o.colls, 0, sizeof o.colls);
        for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
          int k = coll_index(t);
          if (k < 0) {
            fprintf(stderr, "coll-sim: unknown collective %s\n", t);
            return 2;
          }
          o.colls[k] = true;
        }
      }
    } else if (ARG("-A", "--algos")) {
      char buf[256];
      snprintf(buf, sizeof buf, "%s", v);
      o.algo_given = true;
      for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        bool ok;
        coll_algo al = coll_algo_from_name(t, &ok);
        if (!ok || !coll_algo_has_plan(al)) {
          fprintf(stderr, "coll-sim: %s is not an algorithm with a plan\n", t);
          return 2;
        }
        o.algos[al] = true;
      }
    } else if (ARG("-b", "--minbytes") || ARG("-e", "--maxbytes") || LONG("--slot") ||
               LONG("--burst")) {
      if (!bench_parse_size(v, &sz)) {
        fprintf(stderr, "coll-sim: bad size %s\n", v);
        return 2;
      }
      if (a[1] == 'b' || strcmp(a, "--minbytes") == 0)
        b = (double)sz;
      else if (a[1] == 'e' || strcmp(a, "--maxbytes") == 0)
        e = (double)sz;
      else if (strcmp(a, "--burst") == 0)
        o.burst = (double)sz;
      else
        o.slot = sz, o.slot_given = true;
    } else if (LONG("--bw-line")) {
      o.bw_line = atof(v);
    } else if (LONG("--calls")) {
      o.calls = atoi(v);
    } else if (LONG("--warmup")) {
      o.warmup = atoi(v);
    } else if (LONG("--loop")) {
      o.loop = atoi(v);
    } else if (strcmp(a, "--in-place") == 0) {
      o.in_place = true;
    } else if (ARG("-f", "--stepfactor")) {
      f = atof(v);
    } else if (strcmp(a, "--cpu-model") == 0) {
      sim_cpu keep = o.cpu;
      o.cpu = host_cpu;
      if (keep.on) o.cpu = keep; /* given twice: keep what was set */
      o.cpu.on = true;
    } else if (LONG("--copy-ns") || LONG("--nt-ns") || LONG("--reduce-ns") ||
               LONG("--slot-in-ns") || LONG("--slot-out-ns")) {
      if (!o.cpu.on) o.cpu = host_cpu;
      double *x = a[2] == 'c'   ? o.cpu.copy
                  : a[2] == 'n' ? o.cpu.nt_copy
                  : a[2] == 'r' ? o.cpu.reduce
                  : a[7] == 'i' ? o.cpu.slot_in
                                : o.cpu.slot_out;
      if (!parse_pair(v, x)) {
        fprintf(stderr, "coll-sim: %s takes C,M (ns per byte)\n", a);
        return 2;
      }
    } else if (LONG("--cache")) {
      if (!o.cpu.on) o.cpu = host_cpu;
      o.cpu.cache_bytes = atof(v) * 1048576.0;
    } else if (LONG("--cache-ways")) {
      if (!o.cpu.on) o.cpu = host_cpu;
      o.cpu.cache_ways = atoi(v);
    } else if (LONG("--op-us")) {
      if (!o.cpu.on) o.cpu = host_cpu;
      o.cpu.op = atof(v) * 1e-6;
    } else if (LONG("--call-us")) {
      if (!o.cpu.on) o.cpu = host_cpu;
      o.cpu.call = atof(v) * 1e-6;
    } else if (LONG("--switch-us")) {
      if (!o.cpu.on) o.cpu = host_cpu;
      o.cpu.switch_cost = atof(v) * 1e-6;
    } else if (strcmp(a, "--sched") == 0 || strcmp(a, "--no-sched") == 0) {
      if (!o.cpu.on) o.cpu = host_cpu;
      o.cpu.sched = a[2] == 's';
    } else if (strcmp(a, "--bind") == 0 || strcmp(a, "--no-bind") == 0) {
      if (!o.cpu.on) o.cpu = host_cpu;
      o.cpu.bound = a[2] == 'b';
    } else if (LONG("--rfo-ns")) {
      if (!o.cpu.on) o.cpu = host_cpu;
      o.cpu.rfo = atof(v) * 1e-9;
    } else if (LONG("--l2")) {
      if (!o.cpu.on) o.cpu = host_cpu;
      o.cpu.l2_bytes = atof(v) * 1048576.0;
    } else if (LONG("--mem-alone")) {
      if (!o.cpu.on) o.cpu = host_cpu;
      o.cpu.mem_alone = atof(v);
    } else if (LONG("--yield-us")) {
      if (!o.cpu.on) o.cpu = host_cpu;
      double y1, y2;
      if (sscanf(v, "%lg,%lg", &y1, &y2) != 2 || y1 < 0 || y2 < 0) {
        fprintf(stderr, "coll-sim: --yield-us takes SWITCH,ALONE\n");
        return 2;
      }
      o.cpu.yield_switch = y1 * 1e-6, o.cpu.yield_alone = y2 * 1e-6;
    } else if (LONG("--membw")) {
      if (!o.cpu.on) o.cpu = host_cpu;
      if (!read_membw(v, &o.cpu)) {
        fprintf(stderr, "coll-sim: --membw %s: no sim-membw table in it\n", v);
        return 2;
      }
    } else if (LONG("--wake-us")) {
      if (!o.cpu.on) o.cpu = host_cpu;
      double w1, w2 = o.cpu.wake_cost * 1e6;
      if (sscanf(v, "%lg,%lg", &w1, &w2) < 1 || w1 < 0 || w2 < 0) {
        fprintf(stderr, "coll-sim: --wake-us takes IDLE[,COST]\n");
        return 2;
      }
      o.cpu.wake_idle = w1 * 1e-6, o.cpu.wake_cost = w2 * 1e-6;
    } else if (LONG("--footprint-ns")) {
      if (!o.cpu.on) o.cpu = host_cpu;
      o.cpu.footprint = atof(v) * 1e-9;
    } else if (LONG("--spin-yields")) {
      if (!o.cpu.on) o.cpu = host_cpu;
      o.cpu.spin_yields = atoi(v);
    } else if (LONG("--alpha-shm")) {
      o.alpha_shm = atof(v), o.alpha_given = true;
    } else if (LONG("--bw-shm")) {
      o.bw_shm = atof(v);
    } else if (LONG("--alpha-net")) {
      o.alpha_net = atof(v);
    } else if (LONG("--bw-net")) {
      o.bw_net = atof(v);
    } else if (LONG("--gamma-bw")) {
      o.gamma_bw = atof(v);
    } else if (LONG("--copy-bw")) {
      o.copy_bw = atof(v);
    } else if (LONG("--depth")) {
      o.depth = atoi(v);
    } else if (LONG("--max-a2a")) {
      o.max_a2a = atoi(v);
    } else if (strncmp(a, "--tune-cache", 12) == 0) {
      o.tune_cache = a[12] == '=' ? a + 13 : "";
      used_cache = true;
    } else if (strcmp(a, "--no-table") == 0) {
      o.table = false;
    } else if (strcmp(a, "--crossover") == 0) {
      o.crossover = true;
    } else if (strcmp(a, "--validate") == 0) {
      o.validate = true;
    } else if (LONG("--trace")) {
      o.trace_path = v;
    } else {
      fprintf(stderr, "coll-sim: unknown or incomplete option %s (see --help)\n", a);
      return 2;
    }
  }
  if (o.per_host < 1 || o.depth < 1 || o.slot < 4 || !(f > 1) || !(b >= 1) || e < b ||
      !(o.bw_shm > 0) || !(o.bw_net > 0) || !(o.bw_line > 0) || o.cores < 0 || o.calls < 0 ||
      o.warmup < 0 || (o.warmup > 0 && o.warmup >= o.calls) || o.loop < 0 ||
      (o.loop > 1 && o.calls > 1)) {
    fprintf(stderr, "coll-sim: need ranks per host >= 1, depth >= 1, slot >= 4, factor > 1, "
                    "sizes 1 <= -b <= -e, positive bandwidths, --warmup below --calls, and "
                    "--calls or --loop, not both\n");
    return 2;
  }
  for (double s = b; s <= e && o.nsizes < MAXSIZES; s *= f) o.sizes[o.nsizes++] = s;
  if (used_cache) {
    char path[600];
    const char *home = getenv("HOME");
    if (*o.tune_cache)
      snprintf(path, sizeof path, "%s", o.tune_cache);
    else
      snprintf(path, sizeof path, "%s/.cache/libcoll/tune", home ? home : ".");
    int n = o.per_host < o.ns[0] ? o.per_host : o.ns[0];
    if (!read_tune_cache(path, n, &o)) {
      fprintf(stderr, "coll-sim: no shm line for %d ranks in the tuner's cache %s\n", n, path);
      return 2;
    }
  }
  printf("# coll-sim: model alpha_shm %.3f us, shm %.2f GB/s, alpha_net %.3f us, NIC %.2f GB/s, "
         "reduce %.2f GB/s, copies %s, slot %zu B, %d slots per FIFO%s\n",
         o.alpha_shm, o.bw_shm, o.alpha_net, o.bw_net, o.gamma_bw,
         o.copy_bw > 0 ? "counted" : "free", o.slot, o.depth,
         used_cache ? " (shm figures from the tuner's cache)" : "");
  if (o.burst > 0 || o.calls > 1)
    printf("# NIC bucket %.0f B (line %.2f GB/s); %d calls back to back, the last %d timed\n",
           o.burst, o.bw_line, o.calls > 1 ? o.calls : 1, (o.calls > 1 ? o.calls : 1) - o.warmup);
  if (o.loop > 1)
    printf("# a loop of %d calls, each rank starting its next when it finished its last; "
           "the time per call is the makespan / %d\n",
           o.loop, o.loop);
  if (o.cpu.on)
    printf("# CPU model: copy %.3f/%.3f, nt %.3f/%.3f, reduce %.3f/%.3f ns/B (cache/memory), "
           "cache %.0f MiB %d-way, memory alone %.2fx, op %.2f us, call %.2f us, switch %.2f us, "
           "footprint %.3f ns/B; alpha_shm %s\n",
           o.cpu.copy[0] * 1e9, o.cpu.copy[1] * 1e9, o.cpu.nt_copy[0] * 1e9, o.cpu.nt_copy[1] * 1e9,
           o.cpu.reduce[0] * 1e9, o.cpu.reduce[1] * 1e9, o.cpu.cache_bytes / 1048576.0,
           o.cpu.cache_ways, o.cpu.mem_alone > 0 && o.cpu.mem_alone < 1 ? o.cpu.mem_alone : 1.0,
           o.cpu.op * 1e6, o.cpu.call * 1e6, o.cpu.switch_cost * 1e6, o.cpu.footprint * 1e9,
           o.alpha_given ? "as given"
           : o.cpu.sched ? "0.2 us"
                         : "0.2 us (1.6 us oversubscribed)");
  if (o.cpu.on && o.cpu.sched)
    printf("# scheduler (where ranks outnumber cores): %s; yield %.2f us handing over, "
           "%.2f us alone; sleep after %d yields; futex wake %.1f us to an idle core, %.2f us "
           "of the waker's CPU; the switch figure is not used\n",
           o.cpu.bound ? "ranks bound round-robin to cores" : "ranks placed by the kernel",
           o.cpu.yield_switch * 1e6, o.cpu.yield_alone * 1e6, o.cpu.spin_yields,
           o.cpu.wake_idle * 1e6, o.cpu.wake_cost * 1e6);
  int failures = 0;
  if (o.validate) failures += validate(&o);
  sim_trace trace;
  if (o.trace_path) {
    if (!sim_trace_open(&trace, o.trace_path)) {
      fprintf(stderr, "coll-sim: cannot write the trace %s\n", o.trace_path);
      return 2;
    }
    o.trace = &trace;
  }
  if (o.table || o.crossover) failures += predict(&o);
  if (o.trace && !sim_trace_close(&trace)) {
    fprintf(stderr, "coll-sim: writing the trace %s failed\n", o.trace_path);
    return 2;
  }
  return failures ? 1 : 0;
}
