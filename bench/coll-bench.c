/* coll-bench — benchmark libcoll collectives the way nccl-tests does.
 *
 *   coll-bench all_reduce|all_gather|reduce_scatter|broadcast|reduce|sendrecv|
 *              all_to_all|gather|scatter|all [flags]
 *
 * Same flags, same table, same byte and bus-bandwidth conventions as nccl-tests
 * (all_reduce_perf, all_gather_perf, ...), so a number printed here can be divided by one
 * printed by nccl-tests, the MPI peers or Gloo.  `--ranks N` forks N local ranks through
 * coll_launch_local; without it the process joins the job its launcher describes
 * (mpirun, torchrun, srun) through coll_comm_init_from_env.
 *
 * How one table row is measured, per size and per placement (out-of-place, in-place):
 *   1. fill the inputs (the buffers were allocated and touched once, at the largest size);
 *   2. barrier, `-w` warmup calls, barrier;
 *   3. `-n` timed calls.  -z 0 (default): all enqueued on a stream, then one synchronize,
 *      time = elapsed / n.  -z 1, or --stats: every call waited for and timed alone;
 *   4. the time is the maximum over ranks of each rank's mean (a float64 MAX all-reduce);
 *   5. with -c 1: refill the inputs, run once, compare every output element with the
 *      exact expected value (bench_util.c), and sum the wrong counts over ranks.
 *
 * Layout of this file: options (parse_args), output sinks (table, CSV, JSON), the
 * per-rank body (rank_main -> run_collective -> run_row -> measure), then main, which
 * launches ranks and draws the plot.  A new mode that runs one collective and prints
 * something else per step (e.g. an explanation of the schedule) belongs beside
 * run_collective, selected in rank_main.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_cuda.h"
#include "bench_util.h"
#include "coll.h"
#include "explain.h"
#include "coll_launch.h"
#include "coll_trace.h"

#ifndef COLL_BENCH_DATADIR
#define COLL_BENCH_DATADIR "/usr/local/share/libcoll"
#endif

enum { EXIT_WRONG = 1, EXIT_USAGE = 2, EXIT_RUNTIME = 3 };

/* ---- options ------------------------------------------------------------------------ */

typedef struct {
  int colls[BENCH_NUM_COLLS], ncolls;
  int dtypes[COLL_NUM_DTYPES], ndtypes;
  int ops[COLL_NUM_OPS], nops;
  size_t min_bytes, max_bytes, step_bytes;
  unsigned long step_factor;
  int root;
  unsigned long iters, warmup;
  int check, blocking;
  int reg;         /* -R 1: buffers from coll_mem_alloc (every rank maps every rank's) */
  int huge;        /* -H 1: the buffers on transparent huge pages (MADV_HUGEPAGE) */
  int local_ranks; /* 0: join the job described by the environment */
  const char *algo;
  int stats;
  int explain;
  int cuda; /* --device cuda: buffers in GPU memory */
  const char *json_path;
  int csv;              /* --csv given */
  const char *csv_path; /* NULL or "-": stdout */
  const char *plot_path;
  char *cmdline;
  /* filled in before the ranks start */
  char plot_csv[256]; /* temporary CSV the plot is drawn from */
  int fault_rank;     /* COLL_BENCH_FAULT: corrupt one output element (testing aid) */
  size_t fault_index;
} bench_opts;

/* What rank 0 reports back to the parent of a --ranks run (a shared anonymous page). */
typedef struct {
  int finished;
  int failed;        /* a result was wrong */
  double bound_gbps; /* 1/beta from the probe run for --plot (0: none) */
  unsigned long long bad_results;
} bench_outcome;

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: coll-bench COLLECTIVE [flags]\n"
      "  COLLECTIVE: all_reduce | all_gather | reduce_scatter | broadcast | reduce | sendrecv |\n"
      "              all_to_all | gather | scatter | all\n"
      "\n"
      "flags (as nccl-tests):\n"
      "  -b, --minbytes SIZE       smallest size (default 32M); sizes take K, M, G suffixes\n"
      "  -e, --maxbytes SIZE       largest size (default 32M)\n"
      "  -f, --stepfactor N        multiply the size by N between rows (default 1: use -i)\n"
      "  -i, --stepbytes SIZE      add SIZE between rows when the factor is 1 (default 1M)\n"
      "  -o, --op OP               sum | prod | min | max | avg | all (default sum)\n"
      "  -d, --datatype TYPE       int8 uint8 int32 uint32 int64 uint64 float16 bfloat16\n"
      "                            float32 float64 | all (aliases: char int half bf16 float\n"
      "                            double; default float32)\n"
      "  -r, --root R              root of broadcast, reduce, gather and scatter (default 0)\n"
      "  -n, --iters N             timed iterations per size (default 20)\n"
      "  -w, --warmup_iters N      untimed iterations first (default 5)\n"
      "  -c, --check 0|1           check every result (default 1)\n"
      "  -z, --blocking 0|1        1: wait for each call; 0: enqueue all on a stream, then\n"
      "                            synchronize (default 0)\n"
      "  -R, --register 0|1        1: allocate the buffers with coll_mem_alloc, so that\n"
      "                            ranks on one host store into each other's buffers\n"
      "                            (the \"mapped\" path; default 0: posix_memalign)\n"
      "  -H, --hugepages 0|1       1: posix_memalign'd buffers on transparent huge pages\n"
      "                            (2 MiB aligned, MADV_HUGEPAGE), as IMB-MPI1's are under\n"
      "                            Intel MPI (default 0: 4 KiB pages)\n"
      "ours:\n"
      "  --ranks N                 fork N ranks on this machine (else join the job that\n"
      "                            mpirun / torchrun / srun describe in the environment)\n"
      "  --device cpu|cuda         where the buffers live (default cpu); cuda: rank r uses\n"
      "                            GPU r %% device count, several ranks may share a GPU;\n"
      "                            inputs are filled and outputs checked through host copies\n"
      "  -A, --algo NAME           algorithm, passed to libcoll as COLL_ALGO (default auto)\n"
      "  --stats                   add min / p50 / p99 / max time per size (every call is\n"
      "                            then timed alone; each figure is the slowest rank's)\n"
      "  --json FILE               one JSON record per size and collective\n"
      "  --csv [FILE]              CSV to FILE, or to stdout (the table then goes to stderr)\n"
      "  --plot FILE.svg|FILE.png  busbw against size, one line per collective (gnuplot)\n"
      "  --explain                 run each size once traced and print, step by step, what\n"
      "                            every rank sent and received, the byte totals against\n"
      "                            the formula, and the alpha-beta model (alpha and beta\n"
      "                            measured first) beside the measured time\n"
      "  -h, --help                this text\n"
      "\n"
      "Exit status: 0 all results right, 1 a result was wrong, 2 bad usage, 3 a failure.\n"
      "COLL_TRACE=text logs every step of every call; COLL_TRACE=FILE.json writes a\n"
      "Perfetto / chrome://tracing timeline of every rank when the run ends.\n"
      "COLL_BENCH_FAULT=RANK[:INDEX] corrupts that output element before each check (to\n"
      "test the checker).\n");
}

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_usage(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("coll-bench: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputs(" (see coll-bench --help)\n", stderr);
  va_end(ap);
  exit(EXIT_USAGE);
}

static size_t opt_size(const char *flag, const char *v) {
  size_t s;
  if (!bench_parse_size(v, &s))
    die_usage("%s: '%s' is not a size (bytes, with an optional K, M or G suffix)", flag, v);
  return s;
}

static unsigned long opt_uint(const char *flag, const char *v, unsigned long min,
                              unsigned long max) {
  unsigned long u;
  if (!bench_parse_uint(v, max, &u) || u < min)
    die_usage("%s: '%s' is not an integer in [%lu, %lu]", flag, v, min, max);
  return u;
}

static char *join_cmdline(int argc, char **argv) {
  size_t len = 1;
  for (int i = 0; i < argc; i++) len += strlen(argv[i]) * 4 + 3;
  char *s = malloc(len), *p = s;
  if (!s) return NULL;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    bool plain = *a != '\0';
    for (const char *c = a; *c; c++)
      if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./:,+%@", *c))
        plain = false;
    if (i) *p++ = ' ';
    if (plain) {
      p += sprintf(p, "%s", a);
    } else {
      *p++ = '\'';
      for (const char *c = a; *c; c++) {
        if (*c == '\'') {
          memcpy(p, "'\\''", 4);
          p += 4;
        } else
          *p++ = *c;
      }
      *p++ = '\'';
    }
  }
  *p = '\0';
  return s;
}

static void parse_args(int argc, char **argv, bench_opts *o) {
  memset(o, 0, sizeof *o);
  o->min_bytes = o->max_bytes = 32u << 20;
  o->step_bytes = 1u << 20;
  o->step_factor = 1;
  o->dtypes[0] = COLL_FLOAT32, o->ndtypes = 1;
  o->ops[0] = COLL_SUM, o->nops = 1;
  o->iters = 20, o->warmup = 5, o->check = 1;
  o->algo = NULL;
  o->fault_rank = -1;
  o->cmdline = join_cmdline(argc, argv);

  if (argc < 2)
    die_usage(
        "missing the collective: all_reduce, all_gather, reduce_scatter, broadcast, reduce, sendrecv, all_to_all, gather, scatter or all");
  if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
    usage(stdout);
    exit(0);
  }
  int c = bench_parse_coll(argv[1]);
  if (c == -2) {
    if (argv[1][0] == '-') die_usage("the collective comes first, before '%s'", argv[1]);
    die_usage("unknown collective '%s'", argv[1]);
  }
  if (c == -1) {
    for (int i = 0; i < BENCH_NUM_COLLS; i++) o->colls[i] = i;
    o->ncolls = BENCH_NUM_COLLS;
  } else {
    o->colls[0] = c, o->ncolls = 1;
  }

  enum { OPT_RANKS = 256, OPT_STATS, OPT_JSON, OPT_CSV, OPT_PLOT, OPT_EXPLAIN, OPT_DEVICE };
  static const struct option longs[] = {
      {"minbytes", required_argument, 0, 'b'},
      {"maxbytes", required_argument, 0, 'e'},
      {"stepfactor", required_argument, 0, 'f'},
      {"stepbytes", required_argument, 0, 'i'},
      {"op", required_argument, 0, 'o'},
      {"datatype", required_argument, 0, 'd'},
      {"root", required_argument, 0, 'r'},
      {"iters", required_argument, 0, 'n'},
      {"warmup_iters", required_argument, 0, 'w'},
      {"check", required_argument, 0, 'c'},
      {"blocking", required_argument, 0, 'z'},
      {"register", required_argument, 0, 'R'},
      {"hugepages", required_argument, 0, 'H'},
      {"algo", required_argument, 0, 'A'},
      {"help", no_argument, 0, 'h'},
      {"ranks", required_argument, 0, OPT_RANKS},
      {"stats", no_argument, 0, OPT_STATS},
      {"json", required_argument, 0, OPT_JSON},
      {"csv", optional_argument, 0, OPT_CSV},
      {"plot", required_argument, 0, OPT_PLOT},
      {"explain", no_argument, 0, OPT_EXPLAIN},
      {"device", required_argument, 0, OPT_DEVICE},
      {0, 0, 0, 0},
  };
  static const char shorts[] = "+:b:e:f:i:o:d:r:n:w:c:z:R:H:A:h";
  int sub_argc = argc - 1;
  char **sub_argv = argv + 1;
  opterr = 0;
  optind = 1;
  for (;;) {
    int prev = optind;
    int opt = getopt_long(sub_argc, sub_argv, shorts, longs, NULL);
    if (opt == -1) break;
    const char *flag = sub_argv[prev];
    switch (opt) {
    case 'b': o->min_bytes = opt_size("-b", optarg); break;
    case 'e': o->max_bytes = opt_size("-e", optarg); break;
    case 'f': o->step_factor = opt_uint("-f", optarg, 1, 1u << 20); break;
    case 'i': o->step_bytes = opt_size("-i", optarg); break;
    case 'o': {
      int op = bench_parse_op(optarg);
      if (op == -2) die_usage("-o: unknown op '%s' (sum, prod, min, max, avg or all)", optarg);
      if (op == -1) {
        for (int i = 0; i < COLL_NUM_OPS; i++) o->ops[i] = i;
        o->nops = COLL_NUM_OPS;
      } else {
        o->ops[0] = op, o->nops = 1;
      }
      break;
    }
    case 'd': {
      int t = bench_parse_dtype(optarg);
      if (t == -2) die_usage("-d: unknown datatype '%s'", optarg);
      if (t == -1) {
        for (int i = 0; i < COLL_NUM_DTYPES; i++) o->dtypes[i] = i;
        o->ndtypes = COLL_NUM_DTYPES;
      } else {
        o->dtypes[0] = t, o->ndtypes = 1;
      }
      break;
    }
    case 'r': o->root = (int)opt_uint("-r", optarg, 0, 1u << 20); break;
    case 'n': o->iters = opt_uint("-n", optarg, 1, 100000000); break;
    case 'w': o->warmup = opt_uint("-w", optarg, 0, 100000000); break;
    case 'c': o->check = (int)opt_uint("-c", optarg, 0, 1); break;
    case 'z': o->blocking = (int)opt_uint("-z", optarg, 0, 1); break;
    case 'R': o->reg = (int)opt_uint("-R", optarg, 0, 1); break;
    case 'H': o->huge = (int)opt_uint("-H", optarg, 0, 1); break;
    case 'A':
      if (!*optarg) die_usage("-A: empty algorithm name");
      o->algo = optarg;
      break;
    case 'h': usage(stdout); exit(0);
    case OPT_RANKS: o->local_ranks = (int)opt_uint("--ranks", optarg, 1, 4096); break;
    case OPT_STATS: o->stats = 1; break;
    case OPT_JSON: o->json_path = optarg; break;
    case OPT_CSV:
      o->csv = 1;
      o->csv_path = optarg;
      if (!optarg && optind < sub_argc && sub_argv[optind][0] != '-')
        o->csv_path = sub_argv[optind++];
      break;
    case OPT_PLOT: o->plot_path = optarg; break;
    case OPT_EXPLAIN: o->explain = 1; break;
    case OPT_DEVICE:
      if (strcmp(optarg, "cuda") == 0)
        o->cuda = 1;
      else if (strcmp(optarg, "cpu") == 0)
        o->cuda = 0;
      else
        die_usage("--device %s: expected cpu or cuda", optarg);
      break;
    case ':': die_usage("option %s needs a value", flag);
    case '?':
    default:
      if (optopt && optopt < 256) die_usage("unknown option -%c", optopt);
      die_usage("unknown option %s", flag);
    }
  }
  if (optind < sub_argc) die_usage("unexpected argument '%s'", sub_argv[optind]);

  if (o->min_bytes > o->max_bytes)
    die_usage("-b %zu is larger than -e %zu", o->min_bytes, o->max_bytes);
  if (o->step_factor > 1 && o->min_bytes == 0 && o->max_bytes > 0)
    die_usage("-b 0 with -f %lu: the size would never grow", o->step_factor);
  if (o->step_factor <= 1 && o->step_bytes == 0 && o->min_bytes < o->max_bytes)
    die_usage("-i 0 with -f 1: the size would never grow");
  if (o->plot_path) {
    size_t n = strlen(o->plot_path);
    if (!(n > 4 &&
          (strcmp(o->plot_path + n - 4, ".svg") == 0 || strcmp(o->plot_path + n - 4, ".png") == 0)))
      die_usage("--plot: '%s' must end in .svg or .png", o->plot_path);
  }
  if (o->csv && o->csv_path && strcmp(o->csv_path, "-") == 0) o->csv_path = NULL;

  const char *fault = getenv("COLL_BENCH_FAULT");
  if (fault && *fault) {
    char *end;
    long r = strtol(fault, &end, 10);
    unsigned long long idx = 0;
    if (*end == ':') idx = strtoull(end + 1, &end, 10);
    if (*end || r < 0) die_usage("COLL_BENCH_FAULT='%s' is not RANK[:INDEX]", fault);
    o->fault_rank = (int)r;
    o->fault_index = (size_t)idx;
  }
}

/* Next size in the sweep, exactly as nccl-tests steps: a factor when it is > 1, else an
 * increment.  Returns false at the end (or on overflow). */
static bool next_size(const bench_opts *o, size_t *size) {
  size_t s = *size, n;
  if (o->step_factor > 1) {
    if (s > SIZE_MAX / o->step_factor) return false;
    n = s * o->step_factor;
  } else {
    if (o->step_bytes == 0 || s > SIZE_MAX - o->step_bytes) return false;
    n = s + o->step_bytes;
  }
  if (n > o->max_bytes || n == s) return false;
  *size = n;
  return true;
}

/* ---- the per-rank run --------------------------------------------------------------- */

typedef struct {
  double time_us, algbw, busbw;
  unsigned long long wrong;
  double min_us, p50_us, p99_us, max_us;
  bool done;        /* false: not applicable (in-place sendrecv) */
  const char *algo; /* what libcoll ran for the timed calls (coll_comm_last_algo) */
} place_result;

typedef struct {
  const bench_opts *o;
  coll_comm_t comm;
  int rank, nranks;
  coll_stream_t stream;
  unsigned char *sendbuf, *recvbuf;
  size_t buf_bytes;
  /* --device cuda: the buffers the collectives use; sendbuf/recvbuf stage them */
  unsigned char *dsend, *drecv;
  int gpu;
  double *times;
  bench_outcome *outcome; /* NULL when not a --ranks run */
  /* rank 0 only: */
  FILE *table, *csv, *json, *plot_csv;
  int json_records;
  char host[64];
  int nhosts;
  const char *transport, *algo;
  /* counters of the current collective (global values, known on every rank) */
  unsigned long long bad_results;
  double bw_sum;
  int bw_count;
  bool printed_first_wrong;
  bool any_wrong;
  bool registered; /* buffers from coll_mem_alloc (-R 1) */
} run_ctx;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static void report_failure(run_ctx *x, const char *what, coll_result r, bool from_stream) {
  const char *why = coll_comm_last_error(from_stream ? NULL : x->comm);
  fprintf(stderr, "coll-bench: rank %d: %s failed: %s%s%s\n", x->rank, what, coll_result_string(r),
          why && *why ? ": " : "", why ? why : "");
}

#define CHECK_COLL(x, what, call)             \
  do {                                        \
    coll_result r_ = (call);                  \
    if (r_ != COLL_OK) {                      \
      report_failure((x), (what), r_, false); \
      return -1;                              \
    }                                         \
  } while (0)
#define CHECK_SYNC(x, s)                                        \
  do {                                                          \
    coll_result r_ = coll_stream_synchronize(s);                \
    if (r_ != COLL_OK) {                                        \
      report_failure((x), "coll_stream_synchronize", r_, true); \
      return -1;                                                \
    }                                                           \
  } while (0)

/* One collective call as the benchmark issues it.  sendrecv: every rank sends to rank+1
 * and receives from rank-1; libcoll runs a communicator's work in call order, so even
 * ranks send first and odd ranks receive first (no cycle of waiting sends, for any N). */
static int post(run_ctx *x, bench_coll c, const void *sb, void *rb, size_t count, coll_dtype t,
                coll_op op, coll_stream_t s) {
  int root = x->o->root;
  switch (c) {
  case BENCH_ALL_REDUCE:
    CHECK_COLL(x, "coll_all_reduce", coll_all_reduce(sb, rb, count, t, op, x->comm, s));
    break;
  case BENCH_ALL_GATHER:
    CHECK_COLL(x, "coll_all_gather", coll_all_gather(sb, rb, count, t, x->comm, s));
    break;
  case BENCH_REDUCE_SCATTER:
    CHECK_COLL(x, "coll_reduce_scatter", coll_reduce_scatter(sb, rb, count, t, op, x->comm, s));
    break;
  case BENCH_BROADCAST:
    CHECK_COLL(x, "coll_broadcast", coll_broadcast(sb, rb, count, t, root, x->comm, s));
    break;
  case BENCH_REDUCE:
    CHECK_COLL(x, "coll_reduce", coll_reduce(sb, rb, count, t, op, root, x->comm, s));
    break;
  case BENCH_ALL_TO_ALL:
    CHECK_COLL(x, "coll_all_to_all", coll_all_to_all(sb, rb, count, t, x->comm, s));
    break;
  case BENCH_GATHER:
    CHECK_COLL(x, "coll_gather", coll_gather(sb, rb, count, t, root, x->comm, s));
    break;
  case BENCH_SCATTER:
    CHECK_COLL(x, "coll_scatter", coll_scatter(sb, rb, count, t, root, x->comm, s));
    break;
  case BENCH_SENDRECV: {
    int next = (x->rank + 1) % x->nranks, prev = (x->rank - 1 + x->nranks) % x->nranks;
    if (x->rank % 2 == 0) {
      CHECK_COLL(x, "coll_send", coll_send(sb, count, t, next, x->comm, s));
      CHECK_COLL(x, "coll_recv", coll_recv(rb, count, t, prev, x->comm, s));
    } else {
      CHECK_COLL(x, "coll_recv", coll_recv(rb, count, t, prev, x->comm, s));
      CHECK_COLL(x, "coll_send", coll_send(sb, count, t, next, x->comm, s));
    }
    break;
  }
  default: return -1;
  }
  return 0;
}

/* One call, waited for. */
static int call_and_wait(run_ctx *x, bench_coll c, const void *sb, void *rb, size_t count,
                         coll_dtype t, coll_op op) {
  if (c == BENCH_SENDRECV || !x->o->blocking) {
    if (post(x, c, sb, rb, count, t, op, x->stream)) return -1;
    CHECK_SYNC(x, x->stream);
    return 0;
  }
  return post(x, c, sb, rb, count, t, op, NULL);
}

static int barrier(run_ctx *x) {
  CHECK_COLL(x, "coll_barrier", coll_barrier(x->comm, NULL));
  return 0;
}

static int max_over_ranks(run_ctx *x, double *v, size_t n) {
  CHECK_COLL(x, "coll_all_reduce (timings)",
             coll_all_reduce(v, v, n, COLL_FLOAT64, COLL_MAX, x->comm, NULL));
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Collectives whose in-place buffer holds nranks blocks (count is one block). */
static bool bench_whole(bench_coll c) {
  return c == BENCH_ALL_GATHER || c == BENCH_REDUCE_SCATTER || c == BENCH_ALL_TO_ALL ||
         c == BENCH_GATHER || c == BENCH_SCATTER;
}

/* Where the API call reads and writes for this placement, and where the input lives. */
typedef struct {
  const void *sb;
  void *rb;
  void *in;  /* input buffer to fill (send_elems elements) */
  void *out; /* output to check (recv_elems elements) */
} placement;

static placement place(run_ctx *x, bench_coll c, const bench_shape *sh, size_t es, bool in_place) {
  placement p;
  if (!in_place) {
    p.sb = p.in = x->sendbuf;
    p.rb = p.out = x->recvbuf;
    return p;
  }
  unsigned char *b = x->recvbuf;
  size_t off = (size_t)x->rank * sh->count * es;
  switch (c) {
  case BENCH_ALL_GATHER: /* input is this rank's slice of the output */
  case BENCH_GATHER:     /* (on the root; elsewhere it is just an input) */
    p.sb = p.in = b + off;
    p.rb = p.out = b;
    break;
  case BENCH_REDUCE_SCATTER: /* output is this rank's slice of the input */
  case BENCH_SCATTER:        /* (on the root) */
    p.sb = p.in = b;
    p.rb = p.out = b + off;
    break;
  default: p.sb = p.in = p.rb = p.out = b; break;
  }
  return p;
}

/* --device cuda: the device address of a host staging address. */
static void *on_dev(run_ctx *x, const void *p) {
  const unsigned char *c = p;
  if (!x->dsend || !p) return (void *)(uintptr_t)p;
  if (c >= x->sendbuf && c < x->sendbuf + x->buf_bytes) return x->dsend + (c - x->sendbuf);
  return x->drecv + (c - x->recvbuf);
}

/* --device cuda: copies the used part of the staging buffers to the GPU (up) or the
 * receive side back (down). */
static int stage(run_ctx *x, const bench_data *d, const bench_shape *sh, size_t es, bool in_place,
                 bool up) {
  if (!x->dsend) return 0;
  char why[256];
  size_t total = (bench_whole(d->coll) ? sh->count * (size_t)x->nranks : sh->count) * es;
  size_t recv = in_place ? total : sh->recv_elems * es;
  int rc = up ? bench_cuda_copy(x->drecv, x->recvbuf, recv, why, sizeof why)
              : bench_cuda_copy(x->recvbuf, x->drecv, recv, why, sizeof why);
  if (!rc && up && !in_place)
    rc = bench_cuda_copy(x->dsend, x->sendbuf, sh->send_elems * es, why, sizeof why);
  if (rc) fprintf(stderr, "coll-bench: rank %d: staging through the host: %s\n", x->rank, why);
  return rc;
}

/* Writes this rank's inputs and poisons the rest of the output. */
static void prepare(run_ctx *x, const bench_data *d, const bench_shape *sh, const placement *p,
                    size_t es, bool in_place) {
  if (in_place) {
    bench_poison(x->recvbuf,
                 (bench_whole(d->coll) ? sh->count * (size_t)x->nranks : sh->count) * es);
  } else {
    bench_poison(p->out, sh->recv_elems * es);
  }
  /* broadcast in place: only the root's buffer holds data; scatter reads the root's only */
  if (!(in_place && d->coll == BENCH_BROADCAST && x->rank != d->root) &&
      !(d->coll == BENCH_SCATTER && x->rank != d->root))
    bench_fill_input(d, x->rank, p->in, 0, sh->send_elems);
}

static void print_first_wrong(run_ctx *x, const bench_data *d, const bench_shape *sh, bool in_place,
                              const bench_check_result *cr) {
  if (x->printed_first_wrong) return;
  x->printed_first_wrong = true;
  char want[64], got[64];
  bench_format_value(d->dtype, cr->first_expected, want, sizeof want);
  bench_format_value(d->dtype, cr->first_got, got, sizeof got);
  fprintf(stderr,
          "coll-bench: rank %d: %s %s %s size %zu %s: first wrong element at index %zu: "
          "expected %s, got %s (%llu wrong on this rank)\n",
          x->rank, bench_coll_name(d->coll), bench_dtype_name(d->dtype),
          bench_coll_reduces(d->coll) ? bench_op_name(d->op) : "none", sh->bytes,
          in_place ? "in-place" : "out-of-place", cr->first_index, want, got,
          (unsigned long long)cr->wrong);
}

/* Measures one placement of one row; fills *res with global values. */
static int measure(run_ctx *x, const bench_data *d, const bench_shape *sh, bool in_place,
                   place_result *res) {
  const bench_opts *o = x->o;
  size_t es = bench_dtype_size(d->dtype);
  placement p = place(x, d->coll, sh, es, in_place);
  bench_coll c = d->coll;
  coll_dtype t = d->dtype;
  coll_op op = d->op;
  /* the collectives see device addresses with --device cuda; fill and check stay here */
  placement h = p;
  p.sb = on_dev(x, h.sb);
  p.rb = on_dev(x, h.rb);

  prepare(x, d, sh, &h, es, in_place);
  if (stage(x, d, sh, es, in_place, true)) return -1;
  if (barrier(x)) return -1;
  if (o->blocking || c == BENCH_SENDRECV || o->stats) {
    for (unsigned long i = 0; i < o->warmup; i++)
      if (call_and_wait(x, c, p.sb, p.rb, sh->count, t, op)) return -1;
  } else {
    for (unsigned long i = 0; i < o->warmup; i++)
      if (post(x, c, p.sb, p.rb, sh->count, t, op, x->stream)) return -1;
    CHECK_SYNC(x, x->stream);
  }
  if (barrier(x)) return -1;

  double mean;
  if (o->blocking || o->stats) {
    double sum = 0;
    for (unsigned long i = 0; i < o->iters; i++) {
      double t0 = now_us();
      if (call_and_wait(x, c, p.sb, p.rb, sh->count, t, op)) return -1;
      x->times[i] = now_us() - t0;
      sum += x->times[i];
    }
    mean = sum / (double)o->iters;
  } else {
    /* Enqueue everything, wait once; in batches so a bounded queue never fills. */
    double t0 = now_us();
    for (unsigned long i = 0; i < o->iters; i++) {
      if (post(x, c, p.sb, p.rb, sh->count, t, op, x->stream)) return -1;
      if (i % 256 == 255) CHECK_SYNC(x, x->stream);
    }
    CHECK_SYNC(x, x->stream);
    mean = (now_us() - t0) / (double)o->iters;
  }
  res->algo = coll_comm_last_algo(x->comm); /* before the bench's own reductions */
  if (max_over_ranks(x, &mean, 1)) return -1;
  res->time_us = mean;
  res->algbw = bench_algbw(sh->bytes, mean);
  res->busbw = res->algbw * bench_bus_factor(c, x->nranks);
  if (o->stats) {
    /* each rank's distribution over its calls; each statistic the slowest rank's (so
     * min <= time <= max holds, as it does on every single rank) */
    qsort(x->times, o->iters, sizeof *x->times, cmp_double);
    double st[4] = {x->times[0], bench_percentile(x->times, o->iters, 0.50),
                    bench_percentile(x->times, o->iters, 0.99), x->times[o->iters - 1]};
    if (max_over_ranks(x, st, 4)) return -1;
    res->min_us = st[0], res->p50_us = st[1], res->p99_us = st[2], res->max_us = st[3];
  }

  res->wrong = 0;
  if (o->check) {
    prepare(x, d, sh, &h, es, in_place);
    if (stage(x, d, sh, es, in_place, true)) return -1;
    if (barrier(x)) return -1;
    if (call_and_wait(x, c, p.sb, p.rb, sh->count, t, op)) return -1;
    if (stage(x, d, sh, es, in_place, false)) return -1;
    p = h;
    if (x->rank == o->fault_rank && o->fault_index < sh->recv_elems &&
        bench_output_checked(d, x->rank)) {
      double v = bench_load(t, p.out, o->fault_index);
      bench_store(t, p.out, o->fault_index, v + 1);
    }
    bench_check_result cr = bench_check_output(d, x->rank, sh->count, p.out, sh->recv_elems);
    if (cr.wrong) print_first_wrong(x, d, sh, in_place, &cr);
    uint64_t w = cr.wrong;
    CHECK_COLL(x, "coll_all_reduce (#wrong)",
               coll_all_reduce(&w, &w, 1, COLL_UINT64, COLL_SUM, x->comm, NULL));
    res->wrong = (unsigned long long)w;
  }
  res->done = true;
  return 0;
}

/* ---- output (rank 0) ------------------------------------------------------------------ */

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\')
      fprintf(f, "\\%c", *c);
    else if (*c < 0x20)
      fprintf(f, "\\u%04x", *c);
    else
      fputc(*c, f);
  }
  fputc('"', f);
}

static void json_number(FILE *f, double v) {
  if (isfinite(v))
    fprintf(f, "%.9g", v);
  else
    fputs("null", f);
}

static void json_place(FILE *f, const bench_opts *o, const place_result *r) {
  if (!r->done) {
    fputs("null", f);
    return;
  }
  fputs("{\"time_us\": ", f);
  json_number(f, r->time_us);
  fputs(", \"algbw_gbps\": ", f);
  json_number(f, r->algbw);
  fputs(", \"busbw_gbps\": ", f);
  json_number(f, r->busbw);
  if (o->check)
    fprintf(f, ", \"wrong\": %llu", r->wrong);
  else
    fputs(", \"wrong\": null", f);
  if (o->stats) {
    fputs(", \"min_us\": ", f);
    json_number(f, r->min_us);
    fputs(", \"p50_us\": ", f);
    json_number(f, r->p50_us);
    fputs(", \"p99_us\": ", f);
    json_number(f, r->p99_us);
    fputs(", \"max_us\": ", f);
    json_number(f, r->max_us);
  }
  fputc('}', f);
}

static void write_json(run_ctx *x, const bench_data *d, const bench_shape *sh,
                       const place_result r[2]) {
  FILE *f = x->json;
  const bench_opts *o = x->o;
  fputs(x->json_records++ ? ",\n  {" : "  {", f);
  fputs("\"collective\": ", f);
  json_string(f, bench_coll_name(d->coll));
  fputs(", \"host\": ", f);
  json_string(f, x->host);
  fprintf(f, ", \"hosts\": %d, \"nranks\": %d", x->nhosts, x->nranks);
  fputs(", \"transport\": ", f);
  json_string(f, x->transport);
  fputs(", \"algorithm\": ", f);
  json_string(f, x->algo);
  fputs(", \"version\": ", f);
  json_string(f, COLL_VERSION_STRING);
  fputs(", \"command\": ", f);
  json_string(f, o->cmdline ? o->cmdline : "");
  fprintf(f, ", \"size\": %zu, \"count\": %zu", sh->bytes, sh->count);
  fputs(", \"type\": ", f);
  json_string(f, bench_dtype_name(d->dtype));
  fputs(", \"redop\": ", f);
  json_string(f, bench_coll_reduces(d->coll) ? bench_op_name(d->op) : "none");
  fprintf(f, ", \"root\": %d, \"iters\": %lu, \"warmup_iters\": %lu, \"blocking\": %d",
          bench_coll_rooted(d->coll) ? d->root : -1, o->iters, o->warmup, o->blocking);
  fprintf(f, ", \"busbw_factor\": %.6g", bench_bus_factor(d->coll, x->nranks));
  fputs(", \"out_of_place\": ", f);
  json_place(f, o, &r[0]);
  fputs(", \"in_place\": ", f);
  json_place(f, o, &r[1]);
  fputc('}', f);
  fflush(f);
}

static const char csv_header[] =
    "collective,nranks,transport,algorithm,type,redop,root,size,count,"
    "oop_time_us,oop_algbw,oop_busbw,oop_wrong,ip_time_us,ip_algbw,ip_busbw,ip_wrong,"
    "oop_min_us,oop_p50_us,oop_p99_us,oop_max_us,ip_min_us,ip_p50_us,ip_p99_us,ip_max_us\n";

static void csv_place(FILE *f, const bench_opts *o, const place_result *r) {
  if (!r->done) {
    fputs(",,,,", f);
    return;
  }
  fprintf(f, ",%.9g,%.9g,%.9g,", r->time_us, r->algbw, r->busbw);
  if (o->check) fprintf(f, "%llu", r->wrong);
}

static void csv_stats(FILE *f, const bench_opts *o, const place_result *r) {
  if (!r->done || !o->stats) {
    fputs(",,,,", f);
    return;
  }
  fprintf(f, ",%.9g,%.9g,%.9g,%.9g", r->min_us, r->p50_us, r->p99_us, r->max_us);
}

static void write_csv(run_ctx *x, FILE *f, const bench_data *d, const bench_shape *sh,
                      const place_result r[2]) {
  fprintf(f, "%s,%d,%s,%s,%s,%s,%d,%zu,%zu", bench_coll_name(d->coll), x->nranks, x->transport,
          x->algo, bench_dtype_name(d->dtype),
          bench_coll_reduces(d->coll) ? bench_op_name(d->op) : "none",
          bench_coll_rooted(d->coll) ? d->root : -1, sh->bytes, sh->count);
  csv_place(f, x->o, &r[0]);
  csv_place(f, x->o, &r[1]);
  csv_stats(f, x->o, &r[0]);
  csv_stats(f, x->o, &r[1]);
  fputc('\n', f);
  fflush(f);
}

static void print_table_header(run_ctx *x, bench_coll c) {
  FILE *f = x->table;
  const char *factor = c == BENCH_ALL_REDUCE           ? "2(n-1)/n"
                       : bench_bus_factor(c, 2) == 0.5 ? "(n-1)/n"
                                                       : "1";
  fprintf(f, "#\n# Collective: %s   busbw = algbw * %s = algbw * %.4f\n", bench_coll_name(c),
          factor, bench_bus_factor(c, x->nranks));
  if (c == BENCH_SENDRECV)
    fprintf(f, "# (sendrecv: rank r sends to r+1 and receives from r-1; in-place is not "
               "defined, its columns read N/A)\n");
  fprintf(f, "#\n");
  fprintf(
      f,
      "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          ",
      "", "", "", "", "");
  if (x->o->stats) fprintf(f, "     out-of-place stats (us)          in-place stats (us)");
  fputc('\n', f);
  fprintf(f, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s", "size", "count",
          "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
          "#wrong");
  if (x->o->stats)
    fprintf(f, "  %7s  %7s  %7s  %7s  %7s  %7s  %7s  %7s", "min", "p50", "p99", "max", "min", "p50",
            "p99", "max");
  fprintf(f, "  %7s", "algo");
  fputc('\n', f);
  fprintf(f, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s", "(B)",
          "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  if (x->o->stats)
    fprintf(f, "  %7s  %7s  %7s  %7s  %7s  %7s  %7s  %7s", "(us)", "(us)", "(us)", "(us)", "(us)",
            "(us)", "(us)", "(us)");
  fputc('\n', f);
  fflush(f);
}

static void print_row(run_ctx *x, const bench_data *d, const bench_shape *sh,
                      const place_result r[2]) {
  FILE *f = x->table;
  fprintf(f, "%12zu  %12zu  %8s  %6s  %6d", sh->bytes, sh->count, bench_dtype_name(d->dtype),
          bench_coll_reduces(d->coll) ? bench_op_name(d->op) : "none",
          bench_coll_rooted(d->coll) ? d->root : -1);
  for (int i = 0; i < 2; i++) {
    if (!r[i].done) {
      fprintf(f, "  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
      continue;
    }
    char ts[32], wrong[32];
    bench_format_time(r[i].time_us, ts, sizeof ts);
    if (x->o->check)
      snprintf(wrong, sizeof wrong, "%llu", r[i].wrong);
    else
      snprintf(wrong, sizeof wrong, "N/A");
    fprintf(f, "  %7s  %6.2f  %6.2f  %5s", ts, r[i].algbw, r[i].busbw, wrong);
  }
  if (x->o->stats) {
    for (int i = 0; i < 2; i++) {
      if (!r[i].done) {
        fprintf(f, "  %7s  %7s  %7s  %7s", "N/A", "N/A", "N/A", "N/A");
        continue;
      }
      const double v[4] = {r[i].min_us, r[i].p50_us, r[i].p99_us, r[i].max_us};
      for (int k = 0; k < 4; k++) {
        char ts[32];
        bench_format_time(v[k], ts, sizeof ts);
        fprintf(f, "  %7s", ts);
      }
    }
  }
  /* What libcoll ran at this size (the last call was of this row); before any call,
   * the tuner's choice (see --explain for why). */
  const char *algo = d->coll == BENCH_SENDRECV ? "p2p" : r[0].done ? r[0].algo : r[1].algo;
  if (!algo) algo = coll_comm_algo_for(x->comm, bench_coll_name(d->coll), sh->bytes, NULL, 0);
  fprintf(f, "  %7s", algo ? algo : "?");
  fputc('\n', f);
  fflush(f);
}

static void print_footer(run_ctx *x) {
  FILE *f = x->table;
  fprintf(f, "# Out of bounds values : %llu %s\n", x->bad_results,
          x->bad_results ? "FAILED" : "OK");
  fprintf(f, "# Avg bus bandwidth    : %g \n", x->bw_count ? x->bw_sum / x->bw_count : 0.0);
  fprintf(f, "#\n");
  fflush(f);
}

/* ---- rows and collectives --------------------------------------------------------------- */

static int run_row(run_ctx *x, const bench_data *d, size_t size) {
  bench_shape sh = bench_shape_for(d->coll, size, bench_dtype_size(d->dtype), x->nranks);
  place_result r[2];
  memset(r, 0, sizeof r);
  for (int ip = 0; ip < 2; ip++) {
    if (ip && d->coll == BENCH_SENDRECV) continue;
    if (measure(x, d, &sh, ip == 1, &r[ip])) return -1;
    x->bw_sum += r[ip].busbw;
    x->bw_count++;
    if (r[ip].wrong) {
      x->bad_results++;
      x->any_wrong = true;
    }
  }
  if (x->rank == 0) {
    print_row(x, d, &sh, r);
    if (x->csv) write_csv(x, x->csv, d, &sh, r);
    if (x->plot_csv) write_csv(x, x->plot_csv, d, &sh, r);
    if (x->json) write_json(x, d, &sh, r);
  }
  return 0;
}

static int run_collective(run_ctx *x, bench_coll c) {
  const bench_opts *o = x->o;
  x->bad_results = 0;
  x->bw_sum = 0;
  x->bw_count = 0;
  if (c == BENCH_SENDRECV && x->nranks < 2) {
    if (x->rank == 0)
      fprintf(x->table, "#\n# Collective: sendrecv   skipped: it needs 2 or more ranks (a rank "
                        "does not send to itself)\n#\n");
    return 0;
  }
  if (x->rank == 0) print_table_header(x, c);
  int nops = bench_coll_reduces(c) ? o->nops : 1;
  for (int ti = 0; ti < o->ndtypes; ti++) {
    for (int oi = 0; oi < nops; oi++) {
      bench_data d = {.coll = c,
                      .dtype = (coll_dtype)o->dtypes[ti],
                      .op = bench_coll_reduces(c) ? (coll_op)o->ops[oi] : COLL_SUM,
                      .nranks = x->nranks,
                      .root = bench_coll_rooted(c) ? o->root : 0};
      size_t size = o->min_bytes;
      do {
        if (run_row(x, &d, size)) return -1;
      } while (next_size(o, &size));
    }
  }
  if (x->rank == 0) print_footer(x);
  return 0;
}

/* --explain: one traced call per size instead of a table (explain.c). */
static int explain_call(void *ctx, const bench_data *d, const void *sb, void *rb, size_t count) {
  run_ctx *x = ctx;
  /* Blocking calls (run on the caller's thread), except sendrecv, whose send and recv
   * are enqueued together. */
  if (d->coll == BENCH_SENDRECV) return call_and_wait(x, d->coll, sb, rb, count, d->dtype, d->op);
  return post(x, d->coll, sb, rb, count, d->dtype, d->op, NULL);
}

static int run_explain(run_ctx *x) {
  const bench_opts *o = x->o;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  bench_explain_ctx e = {.comm = x->comm,
                         .rank = x->rank,
                         .nranks = x->nranks,
                         .out = x->table ? x->table : stdout,
                         .call = explain_call,
                         .call_ctx = x,
                         .sendbuf = x->sendbuf,
                         .recvbuf = x->recvbuf,
                         .iters = o->iters,
                         .warmup = o->warmup,
                         .ranks_per_core = cores > 0 ? (double)x->nranks / (double)cores : 1,
                         .one_host = x->nhosts == 1};
  if (bench_explain_probe(&e)) return -1;
  for (int i = 0; i < o->ncolls; i++) {
    bench_coll c = (bench_coll)o->colls[i];
    if (c == BENCH_SENDRECV && x->nranks < 2) continue;
    for (int ti = 0; ti < o->ndtypes; ti++)
      for (int oi = 0; oi < (bench_coll_reduces(c) ? o->nops : 1); oi++) {
        bench_data d = {.coll = c,
                        .dtype = (coll_dtype)o->dtypes[ti],
                        .op = bench_coll_reduces(c) ? (coll_op)o->ops[oi] : COLL_SUM,
                        .nranks = x->nranks,
                        .root = bench_coll_rooted(c) ? o->root : 0};
        size_t size = o->min_bytes;
        do {
          if (bench_explain_one(&e, &d, size)) return -1;
        } while (next_size(o, &size));
      }
  }
  return 0;
}

static double plot_bound_gbps; /* rank 0 of an environment-launched run */

/* ---- rank setup ----------------------------------------------------------------------- */

typedef struct {
  int64_t pid;
  char host[56];
} rank_info;

static FILE *open_out(const char *path, const char *what) {
  FILE *f = fopen(path, "w");
  if (!f) fprintf(stderr, "coll-bench: cannot write %s %s: %s\n", what, path, strerror(errno));
  return f;
}

static void print_run_header(run_ctx *x, const rank_info *ri) {
  const bench_opts *o = x->o;
  FILE *f = x->table;
  fprintf(f, "# coll-bench %s (libcoll %s)\n", o->ncolls > 1 ? "all" : bench_coll_name(o->colls[0]),
          COLL_VERSION_STRING);
  fprintf(f, "# Command: %s\n", o->cmdline ? o->cmdline : "");
  if (o->step_factor > 1)
    fprintf(f,
            "# nRanks %d minBytes %zu maxBytes %zu step: %lu(factor) warmup iters: %lu "
            "iters: %lu validation: %d blocking: %d\n",
            x->nranks, o->min_bytes, o->max_bytes, o->step_factor, o->warmup, o->iters, o->check,
            o->blocking);
  else
    fprintf(f,
            "# nRanks %d minBytes %zu maxBytes %zu step: %zu(bytes) warmup iters: %lu "
            "iters: %lu validation: %d blocking: %d\n",
            x->nranks, o->min_bytes, o->max_bytes, o->step_bytes, o->warmup, o->iters, o->check,
            o->blocking);
  int lib_hosts = x->nhosts; /* as libcoll groups the ranks (COLL_HOST_ID may split one) */
  coll_comm_hosts(x->comm, &lib_hosts, NULL, NULL);
  fprintf(f, "# transport: %s   algorithm: %s   hosts: %d\n", x->transport, x->algo, lib_hosts);
  fprintf(f, "#\n# Using ranks\n");
  for (int r = 0; r < x->nranks; r++)
    fprintf(f, "#  Rank %2d Pid %6lld on %10s\n", r, (long long)ri[r].pid, ri[r].host);
  fflush(f);
}

static int setup_and_run(run_ctx *x) {
  const bench_opts *o = x->o;
  int rc = -1;
  rank_info *all = NULL;

  bool rooted = false;
  for (int i = 0; i < o->ncolls; i++) rooted = rooted || bench_coll_rooted(o->colls[i]);
  if (rooted && o->root >= x->nranks) {
    if (x->rank == 0)
      fprintf(stderr, "coll-bench: -r %d: the root must be below the number of ranks (%d)\n",
              o->root, x->nranks);
    return EXIT_USAGE;
  }

  /* Buffers: allocated once at the largest size and touched before any timing. */
  x->buf_bytes = o->max_bytes < 64 ? 64 : o->max_bytes;
  void *sb = NULL, *rb = NULL;
  if (o->reg && !o->cuda) {
    coll_result r = coll_mem_alloc(x->comm, x->buf_bytes, &sb);
    if (r == COLL_OK) r = coll_mem_alloc(x->comm, x->buf_bytes, &rb);
    if (r != COLL_OK) {
      report_failure(x, "coll_mem_alloc", r, false);
      return EXIT_RUNTIME;
    }
    x->registered = true;
  } else {
    size_t align = o->huge ? (size_t)2 << 20 : 4096;
    if (o->huge) x->buf_bytes = (x->buf_bytes + align - 1) & ~(align - 1);
    if (posix_memalign(&sb, align, x->buf_bytes) || posix_memalign(&rb, align, x->buf_bytes)) {
      fprintf(stderr, "coll-bench: rank %d: cannot allocate two buffers of %zu bytes\n", x->rank,
              x->buf_bytes);
      free(sb);
      return EXIT_RUNTIME;
    }
    if (o->huge &&
        (madvise(sb, x->buf_bytes, MADV_HUGEPAGE) || madvise(rb, x->buf_bytes, MADV_HUGEPAGE))) {
      fprintf(stderr, "coll-bench: rank %d: madvise(MADV_HUGEPAGE): %s\n", x->rank,
              strerror(errno));
      free(sb);
      free(rb);
      return EXIT_RUNTIME;
    }
  }
  x->sendbuf = sb;
  x->recvbuf = rb;
  memset(x->sendbuf, 0, x->buf_bytes);
  memset(x->recvbuf, 0, x->buf_bytes);
  x->times = calloc(o->iters, sizeof *x->times);
  all = calloc((size_t)x->nranks, sizeof *all);
  if (!x->times || !all) {
    fprintf(stderr, "coll-bench: rank %d: out of memory\n", x->rank);
    goto out;
  }
  if (o->cuda) {
    char why[256];
    void *ds = NULL, *dr = NULL;
    if (bench_cuda_alloc(&ds, x->buf_bytes, why, sizeof why) ||
        bench_cuda_alloc(&dr, x->buf_bytes, why, sizeof why) ||
        bench_cuda_stream(&x->stream, why, sizeof why)) {
      bench_cuda_free(ds);
      bench_cuda_free(dr);
      fprintf(stderr, "coll-bench: rank %d: --device cuda: %s\n", x->rank, why);
      goto out;
    }
    x->dsend = ds;
    x->drecv = dr;
  } else if (coll_stream_create(&x->stream) != COLL_OK) {
    report_failure(x, "coll_stream_create", COLL_ERR_SYSTEM, true);
    goto out;
  }

  /* Who is where: pid and host of every rank; one host means shared memory throughout. */
  rank_info me;
  memset(&me, 0, sizeof me);
  me.pid = getpid();
  gethostname(me.host, sizeof me.host - 1);
  snprintf(x->host, sizeof x->host, "%s", me.host);
  {
    coll_result r = coll_all_gather(&me, all, sizeof me, COLL_UINT8, x->comm, NULL);
    if (r != COLL_OK) {
      report_failure(x, "coll_all_gather (rank info)", r, false);
      goto out;
    }
  }
  x->nhosts = 0;
  for (int i = 0; i < x->nranks; i++) {
    bool seen = false;
    for (int j = 0; j < i; j++)
      if (strncmp(all[i].host, all[j].host, sizeof all[i].host) == 0) seen = true;
    if (!seen) x->nhosts++;
  }
  x->transport = coll_comm_transport_name(x->comm);
  const char *algo = getenv("COLL_ALGO");
  x->algo = algo && *algo ? algo : "auto";

  if (x->rank == 0) {
    x->table = stdout;
    if (o->csv) {
      if (o->csv_path) {
        if (!(x->csv = open_out(o->csv_path, "the CSV file"))) goto out;
      } else {
        x->csv = stdout;
        x->table = stderr;
      }
      fputs(csv_header, x->csv);
    }
    if (o->json_path) {
      if (!(x->json = open_out(o->json_path, "the JSON file"))) goto out;
      fputs("[\n", x->json);
    }
    if (o->plot_path) {
      if (!(x->plot_csv = open_out(o->plot_csv, "the plot data"))) goto out;
      fputs(csv_header, x->plot_csv);
    }
    print_run_header(x, all);
    if (o->cuda) {
      size_t cb = x->buf_bytes < (64u << 20) ? (64u << 20) : x->buf_bytes;
      fprintf(x->table,
              "# device: cuda, rank 0 on GPU %d; buffers in GPU memory, moved by "
              "cuda_ipc; device-to-device copy bandwidth %.1f GB/s (%zu MiB cudaMemcpy: the "
              "ceiling for busbw)\n",
              x->gpu, bench_cuda_copy_gbps(cb), cb >> 20);
    }
  }

  if (o->explain) {
    if (run_explain(x)) goto out;
  } else {
    if (o->plot_path && x->nranks > 1) {
      /* The link's bandwidth bound for the plot: 1/beta from the same probe --explain runs
       * (printed in the header). busbw of a bandwidth-optimal algorithm approaches it. */
      long cores = sysconf(_SC_NPROCESSORS_ONLN);
      bench_explain_ctx e = {.comm = x->comm,
                             .rank = x->rank,
                             .nranks = x->nranks,
                             .out = x->table ? x->table : stdout,
                             .ranks_per_core = cores > 0 ? (double)x->nranks / (double)cores : 1};
      if (bench_explain_probe(&e)) goto out;
      if (x->rank == 0 && e.beta > 0) plot_bound_gbps = 1e-9 / e.beta;
      if (x->rank == 0 && x->outcome) x->outcome->bound_gbps = plot_bound_gbps;
    }
    for (int i = 0; i < o->ncolls; i++)
      if (run_collective(x, (bench_coll)o->colls[i])) goto out;
  }
  if (barrier(x)) goto out;
  rc = x->any_wrong ? EXIT_WRONG : 0;

out:
  if (x->rank == 0) {
    if (x->json) {
      fputs(x->json_records ? "\n]\n" : "]\n", x->json);
      if (fclose(x->json)) rc = rc ? rc : EXIT_RUNTIME;
    }
    if (x->csv && x->csv != stdout && fclose(x->csv)) rc = rc ? rc : EXIT_RUNTIME;
    if (x->plot_csv) fclose(x->plot_csv);
    fflush(stdout);
    fflush(stderr);
  }
  if (x->stream) {
    if (o->cuda)
      bench_cuda_stream_destroy(x->stream);
    else
      coll_stream_destroy(x->stream);
  }
  bench_cuda_free(x->dsend);
  bench_cuda_free(x->drecv);
  free(all);
  free(x->times);
  if (x->registered) {
    /* collective: only when every rank got here without failing (else the
     * communicator's destruction unmaps them) */
    if (rc == 0) {
      coll_mem_free(x->comm, x->sendbuf);
      coll_mem_free(x->comm, x->recvbuf);
    }
  } else {
    free(x->sendbuf);
    free(x->recvbuf);
  }
  return rc < 0 ? EXIT_RUNTIME : rc;
}

/* Body of one rank of a --ranks run.  Wrong results are reported through the shared
 * outcome page and the rank returns 0, so the launcher never kills rank 0 while it is
 * still printing; a failure (library error) returns non-zero and ends the job. */
static int gpu_of_rank; /* --device cuda: this process's GPU */

static int rank_main(coll_comm_t comm, int rank, int nranks, void *arg) {
  bench_outcome *out = ((void **)arg)[1];
  run_ctx x;
  memset(&x, 0, sizeof x);
  x.o = ((void **)arg)[0];
  x.comm = comm;
  x.rank = rank;
  x.nranks = nranks;
  x.outcome = out;
  x.gpu = gpu_of_rank;
  int rc = setup_and_run(&x);
  if (rank == 0 && (rc == 0 || rc == EXIT_WRONG)) {
    out->bad_results = x.bad_results;
    out->failed = rc == EXIT_WRONG;
    out->finished = 1;
  }
  return rc == EXIT_WRONG ? 0 : rc;
}

/* --device cuda with --ranks: the rank binds its GPU (rank % device count) before it
 * builds its communicator, which takes the GPU current at init. */
static int rank_main_cuda(coll_comm_t unused, int rank, int nranks, void *arg) {
  (void)unused;
  char why[256];
  int dev = 0;
  if (bench_cuda_bind(rank, &dev, why, sizeof why)) {
    fprintf(stderr, "coll-bench: rank %d: --device cuda: %s\n", rank, why);
    return EXIT_RUNTIME;
  }
  coll_comm_t comm;
  coll_result r = coll_comm_init_rank(&comm, nranks, coll_launch_unique_id(), rank);
  if (r != COLL_OK) {
    fprintf(stderr, "coll-bench: rank %d: coll_comm_init_rank: %s\n", rank,
            coll_comm_last_error(NULL));
    return EXIT_RUNTIME;
  }
  gpu_of_rank = dev;
  int rc = rank_main(comm, rank, nranks, arg);
  if (rc == 0)
    coll_comm_destroy(comm);
  else
    coll_comm_abort(comm);
  return rc;
}

/* ---- plotting --------------------------------------------------------------------------- */

static bool in_path(const char *prog) {
  const char *path = getenv("PATH");
  if (!path) path = "/usr/bin:/bin";
  char buf[4096];
  while (*path) {
    size_t n = strcspn(path, ":");
    if (n && n + strlen(prog) + 2 < sizeof buf) {
      memcpy(buf, path, n);
      buf[n] = '/';
      strcpy(buf + n + 1, prog);
      if (access(buf, X_OK) == 0) return true;
    }
    path += n;
    if (*path == ':') path++;
  }
  return false;
}

/* bench/plot.sh: next to the executable (build tree), else the installed copy;
 * COLL_BENCH_PLOT_SCRIPT overrides both. */
static bool find_plot_script(char *buf, size_t len) {
  const char *env = getenv("COLL_BENCH_PLOT_SCRIPT");
  if (env && *env) {
    snprintf(buf, len, "%s", env);
    return access(buf, R_OK) == 0;
  }
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) {
      static const char name[] = "/plot.sh";
      size_t dir = (size_t)(slash - exe);
      if (dir + sizeof name <= len) {
        memcpy(buf, exe, dir);
        memcpy(buf + dir, name, sizeof name);
        if (access(buf, R_OK) == 0) return true;
      }
    }
  }
  snprintf(buf, len, "%s/plot.sh", COLL_BENCH_DATADIR);
  return access(buf, R_OK) == 0;
}

static int draw_plot(const bench_opts *o) {
  char script[4096];
  if (!find_plot_script(script, sizeof script)) {
    fprintf(stderr,
            "coll-bench: --plot: cannot find plot.sh (looked next to coll-bench and in %s; "
            "set COLL_BENCH_PLOT_SCRIPT)\n",
            COLL_BENCH_DATADIR);
    return EXIT_RUNTIME;
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "coll-bench: --plot: fork: %s\n", strerror(errno));
    return EXIT_RUNTIME;
  }
  if (pid == 0) {
    const char *title = o->cmdline ? o->cmdline : "coll-bench";
    char bound[64] = "";
    if (plot_bound_gbps > 0) snprintf(bound, sizeof bound, "%.3f", plot_bound_gbps);
    execl("/bin/sh", "sh", script, o->plot_csv, o->plot_path, title, bound, (char *)NULL);
    fprintf(stderr, "coll-bench: --plot: cannot run /bin/sh: %s\n", strerror(errno));
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return EXIT_RUNTIME;
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "coll-bench: --plot: %s failed; the data is in %s\n", script, o->plot_csv);
    return EXIT_RUNTIME;
  }
  unlink(o->plot_csv);
  fprintf(stderr, "coll-bench: wrote %s\n", o->plot_path);
  return 0;
}

static int make_plot_csv(bench_opts *o) {
  const char *tmp = getenv("TMPDIR");
  snprintf(o->plot_csv, sizeof o->plot_csv, "%s/coll-bench-plot-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  int fd = mkstemp(o->plot_csv);
  if (fd < 0) {
    fprintf(stderr, "coll-bench: --plot: cannot create a temporary file: %s\n", strerror(errno));
    return -1;
  }
  close(fd);
  return 0;
}

/* ---- main --------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  bench_opts o;
  parse_args(argc, argv, &o);

  if (o.plot_path && !in_path("gnuplot")) {
    fprintf(stderr, "coll-bench: --plot needs gnuplot, which is not installed (Debian: "
                    "apt-get install gnuplot-nox)\n");
    return EXIT_RUNTIME;
  }
  if (o.algo) {
    if (strcmp(o.algo, "auto") == 0)
      unsetenv("COLL_ALGO");
    else
      setenv("COLL_ALGO", o.algo, 1);
  }

  if (o.local_ranks > 0 && o.root >= o.local_ranks) {
    bool rooted = false;
    for (int i = 0; i < o.ncolls; i++) rooted = rooted || bench_coll_rooted(o.colls[i]);
    if (rooted) die_usage("-r %d: the root must be below --ranks %d", o.root, o.local_ranks);
  }

  if (o.cuda) {
    /* Asked in a child: this process forks the ranks and must stay CUDA-free. */
    char why[320], name[256];
    int ndev = 0;
    if (bench_cuda_probe(&ndev, name, sizeof name, why, sizeof why)) {
      fprintf(stderr, "coll-bench: --device cuda: %s\n", why);
      return EXIT_RUNTIME;
    }
    if (o.explain) die_usage("--explain runs on host buffers only (drop --device cuda)");
    fprintf(stderr, "coll-bench: --device cuda: %d GPU(s), GPU 0 is %s\n", ndev, name);
  }

  int rc;
  if (o.local_ranks > 0) {
    if (o.plot_path && make_plot_csv(&o)) return EXIT_RUNTIME;
    bench_outcome *out = mmap(NULL, sizeof *out, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                              -1, 0);
    if (out == MAP_FAILED) {
      fprintf(stderr, "coll-bench: mmap: %s\n", strerror(errno));
      return EXIT_RUNTIME;
    }
    memset(out, 0, sizeof *out);
    void *arg[2] = {&o, out};
    char why[512] = "";
    fflush(stdout);
    fflush(stderr);
    int st = o.cuda ? coll_launch_local_raw(o.local_ranks, rank_main_cuda, arg, 0, why, sizeof why)
                    : coll_launch_local(o.local_ranks, rank_main, arg, 0, why, sizeof why);
    if (st != 0) {
      if (st != EXIT_USAGE || why[0])
        fprintf(stderr, "coll-bench: the run failed: %s\n", why[0] ? why : "a rank failed");
      if (o.plot_path) unlink(o.plot_csv);
      return st == EXIT_USAGE ? EXIT_USAGE : EXIT_RUNTIME;
    }
    rc = out->failed ? EXIT_WRONG : 0;
    if (!out->finished) rc = EXIT_RUNTIME;
    plot_bound_gbps = out->bound_gbps;
    if (o.plot_path) {
      int prc = draw_plot(&o);
      if (!rc) rc = prc;
    }
  } else {
    if (o.cuda) {
      /* one GPU per local rank, as torchrun / mpirun / srun number them */
      const char *lr = getenv("LOCAL_RANK");
      if (!lr) lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
      if (!lr) lr = getenv("SLURM_LOCALID");
      char why[256];
      if (bench_cuda_bind(lr ? atoi(lr) : 0, &gpu_of_rank, why, sizeof why)) {
        fprintf(stderr, "coll-bench: --device cuda: %s\n", why);
        return EXIT_RUNTIME;
      }
    }
    coll_comm_t comm;
    coll_result r = coll_comm_init_from_env(&comm);
    if (r != COLL_OK) {
      fprintf(stderr,
              "coll-bench: cannot join a job from the environment: %s: %s "
              "(use --ranks N to start N ranks here)\n",
              coll_result_string(r), coll_comm_last_error(NULL));
      return EXIT_RUNTIME;
    }
    run_ctx x;
    memset(&x, 0, sizeof x);
    x.o = &o;
    x.comm = comm;
    x.gpu = gpu_of_rank;
    coll_comm_rank(comm, &x.rank);
    coll_comm_size(comm, &x.nranks);
    if (x.rank == 0 && o.plot_path && make_plot_csv(&o)) {
      coll_comm_abort(comm);
      return EXIT_RUNTIME;
    }
    rc = setup_and_run(&x);
    if (rc == 0 || rc == EXIT_WRONG)
      coll_comm_destroy(comm);
    else
      coll_comm_abort(comm);
    if (x.rank == 0 && o.plot_path && (rc == 0 || rc == EXIT_WRONG)) {
      int prc = draw_plot(&o);
      if (!rc) rc = prc;
    }
  }
  free(o.cmdline);
  return rc;
}
