/* mpi_coll_bench.c — the MPI peer: MPI's collectives measured and printed exactly as
 * coll-bench prints libcoll's, so a row here and a row there can be divided.
 *
 *   mpirun -np N mpi_coll_bench COLLECTIVE[,COLLECTIVE...]|all [flags]
 *   COLLECTIVE: all_reduce all_gather reduce_scatter broadcast reduce all_to_all gather
 *               scatter (aliases allreduce allgather reducescatter bcast alltoall)
 *
 * Built against Open MPI and MPICH alike (bench/peers/meson.build builds one binary per
 * MPI it finds: mpi_coll_bench.openmpi with mpicc.openmpi, mpi_coll_bench.mpich with
 * mpicc.mpich); by hand: mpicc -O2 -o mpi_coll_bench mpi_coll_bench.c -lm.
 *
 * The table is coll-bench's (and nccl-tests'): size, count, type, redop, root, then
 * time (us), algbw, busbw (GB/s = 1e9 B/s) and #wrong for out-of-place and for in-place,
 * then `iters`, the timed calls of each row (coll-bench prints its algorithm there).
 * Sizes and bus-bandwidth factors follow nccl-tests, per collective (n = ranks, es =
 * element size, S = the size printed, algbw = S / time, busbw = algbw * factor):
 *
 *   collective      count (API argument)   rank's input   rank's output  factor
 *   all_reduce      S/es                   count          count          2(n-1)/n
 *   broadcast       S/es                   count (root)   count          1
 *   reduce          S/es                   count          count (root)   1
 *   all_gather      S/es/n                 count          n*count        (n-1)/n
 *   reduce_scatter  S/es/n                 n*count        count          (n-1)/n
 *   all_to_all      S/es/n (per peer)      n*count        n*count        (n-1)/n
 *   gather          S/es/n                 count          n*count (root) (n-1)/n
 *   scatter         S/es/n                 n*count (root) count          (n-1)/n
 *
 * So for all_to_all, gather and scatter the size is the whole per-rank buffer (all_to_all:
 * each rank's send buffer, = its receive buffer; gather: the root's receive buffer;
 * scatter: the root's send buffer), as nccl-tests' alltoall_perf, gather_perf and
 * scatter_perf print it, and the printed size is rounded down to what is moved:
 * n*count*es.  (Recent nccl-tests also round the per-peer count of these three down to
 * a multiple of 16 bytes; at sizes that are multiples of 16*n bytes, e.g. powers of two
 * from 64 B on 4 ranks, the two agree.)
 *
 * Placements.  Out-of-place: separate send and receive buffers.  In-place: MPI_IN_PLACE,
 * with every rank's block where nccl-tests puts it in its in-place runs: all_gather and
 * gather read rank r's block at offset r*count of the receive buffer, scatter leaves it
 * there, reduce_scatter and all_to_all read and write the one buffer (MPI writes the
 * reduce_scatter result at offset 0 of it).  MPI_Bcast has one buffer only: it is timed
 * in the in-place columns and the out-of-place ones read N/A.
 *
 * Per row and placement (as coll-bench does): fill the inputs; barrier; -w warmup calls;
 * barrier; the timed calls back to back; time = the slowest rank's mean (MPI_MAX over
 * ranks).  The calls are -n, or with -t SECONDS as many as fill about SECONDS after a
 * calibration (batches of 1, 2, 4, ... calls until one takes 10 ms on the slowest rank;
 * at least -n, at most 10^6): the method the figures of docs/perf.md were taken with.
 * Then with -c 1 the inputs are written again, one more call runs, and every element of
 * every checked output is compared with its exact expected value; #wrong is the sum over
 * ranks.  Buffers are allocated once at the largest size and touched before any timing.
 *
 * Data: the patterns of coll-bench (bench/bench_util.c), so every partial result of any
 * reduction order is exact in every dtype: sum (j + r) mod K, prod 2 or 1, min/max
 * (j + r) mod 100, and (i + 13 r) mod 97 for collectives that do not reduce.  MPI has no
 * datatype for float16/bfloat16 and no op for avg: those are refused (and left out of
 * -d all / -o all).
 *
 * Must never: link or call libcoll (a number printed here is MPI's alone); allocate,
 * fill or check inside a timed loop; print a time it did not measure.  Exit status: 0
 * all results right, 1 a result was wrong, 2 bad usage, 3 an MPI call failed.
 * PEERS_BENCH_FAULT=RANK[:INDEX] corrupts that output element before each check (so the
 * test can see #wrong counted).
 */
#include <mpi.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { EXIT_WRONG = 1, EXIT_USAGE = 2, EXIT_RUNTIME = 3 };

/* ---- names ---------------------------------------------------------------------------- */

typedef enum {
  ALL_REDUCE,
  ALL_GATHER,
  REDUCE_SCATTER,
  BROADCAST,
  REDUCE,
  ALL_TO_ALL,
  GATHER,
  SCATTER,
  NUM_COLLS
} coll_kind;

static const char *const coll_names[NUM_COLLS] = {"all_reduce", "all_gather", "reduce_scatter",
                                                  "broadcast",  "reduce",     "all_to_all",
                                                  "gather",     "scatter"};

static int parse_coll(const char *s) {
  static const struct {
    const char *name;
    int coll;
  } aliases[] = {
      {"allreduce", ALL_REDUCE}, {"allgather", ALL_GATHER}, {"reducescatter", REDUCE_SCATTER},
      {"bcast", BROADCAST},      {"alltoall", ALL_TO_ALL},
  };
  for (int c = 0; c < NUM_COLLS; c++)
    if (strcmp(s, coll_names[c]) == 0) return c;
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(s, aliases[i].name) == 0) return aliases[i].coll;
  return -1;
}

static bool reduces(coll_kind c) { return c == ALL_REDUCE || c == REDUCE_SCATTER || c == REDUCE; }
static bool rooted(coll_kind c) {
  return c == BROADCAST || c == REDUCE || c == GATHER || c == SCATTER;
}
/* count is per rank's block and the buffer holds n blocks */
static bool blocked(coll_kind c) { return !(c == ALL_REDUCE || c == BROADCAST || c == REDUCE); }

static double bus_factor(coll_kind c, int nranks) {
  double n = nranks;
  if (c == ALL_REDUCE) return 2.0 * (n - 1) / n;
  if (c == BROADCAST || c == REDUCE) return 1.0;
  return (n - 1) / n;
}

static const char *factor_text(coll_kind c) {
  return c == ALL_REDUCE ? "2(n-1)/n" : (c == BROADCAST || c == REDUCE) ? "1" : "(n-1)/n";
}

/* The dtypes MPI has, named as coll-bench names them. */
typedef enum {
  T_INT8,
  T_UINT8,
  T_INT32,
  T_UINT32,
  T_INT64,
  T_UINT64,
  T_FLOAT32,
  T_FLOAT64,
  NUM_TYPES
} dtype;
static const char *const type_names[NUM_TYPES] = {"int8",  "uint8",  "int32",   "uint32",
                                                  "int64", "uint64", "float32", "float64"};
static const size_t type_sizes[NUM_TYPES] = {1, 1, 4, 4, 8, 8, 4, 8};

static MPI_Datatype mpi_type(dtype t) {
  switch (t) {
  case T_INT8: return MPI_INT8_T;
  case T_UINT8: return MPI_UINT8_T;
  case T_INT32: return MPI_INT32_T;
  case T_UINT32: return MPI_UINT32_T;
  case T_INT64: return MPI_INT64_T;
  case T_UINT64: return MPI_UINT64_T;
  case T_FLOAT32: return MPI_FLOAT;
  case T_FLOAT64: return MPI_DOUBLE;
  default: return MPI_DATATYPE_NULL;
  }
}

/* -2 unknown, -3 known to coll-bench but not to MPI, -1 all */
static int parse_dtype(const char *s) {
  static const struct {
    const char *name;
    int t;
  } aliases[] = {
      {"char", T_INT8},      {"int", T_INT32},    {"float", T_FLOAT32}, {"fp32", T_FLOAT32},
      {"double", T_FLOAT64}, {"fp64", T_FLOAT64}, {"float16", -3},      {"half", -3},
      {"fp16", -3},          {"bfloat16", -3},    {"bf16", -3},
  };
  if (strcmp(s, "all") == 0) return -1;
  for (int t = 0; t < NUM_TYPES; t++)
    if (strcmp(s, type_names[t]) == 0) return t;
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(s, aliases[i].name) == 0) return aliases[i].t;
  return -2;
}

typedef enum { OP_SUM, OP_PROD, OP_MIN, OP_MAX, NUM_OPS } redop;
static const char *const op_names[NUM_OPS] = {"sum", "prod", "min", "max"};

static MPI_Op mpi_op(redop o) {
  switch (o) {
  case OP_SUM: return MPI_SUM;
  case OP_PROD: return MPI_PROD;
  case OP_MIN: return MPI_MIN;
  default: return MPI_MAX;
  }
}

/* -2 unknown, -3 avg (no MPI op), -1 all */
static int parse_op(const char *s) {
  if (strcmp(s, "all") == 0) return -1;
  if (strcmp(s, "avg") == 0) return -3;
  for (int o = 0; o < NUM_OPS; o++)
    if (strcmp(s, op_names[o]) == 0) return o;
  return -2;
}

/* ---- options -------------------------------------------------------------------------- */

typedef struct {
  int colls[NUM_COLLS], ncolls;
  int dtypes[NUM_TYPES], ndtypes;
  int ops[NUM_OPS], nops;
  size_t min_bytes, max_bytes, step_bytes;
  unsigned long step_factor;
  size_t *list; /* -s: explicit sizes (overrides -b/-e/-f/-i) */
  int nlist;
  int root;
  unsigned long iters, warmup;
  double target_s; /* -t: iterations chosen to fill this many seconds (0: -n exactly) */
  int check;
  int huge;       /* -H 1: the buffers on transparent huge pages (MADV_HUGEPAGE) */
  int fault_rank; /* PEERS_BENCH_FAULT */
  size_t fault_index;
  char *cmdline;
} opts;

static int rank, nranks;

static void usage(FILE *f) {
  fprintf(f,
          "usage: mpirun -np N mpi_coll_bench COLLECTIVE[,COLLECTIVE...] [flags]\n"
          "  COLLECTIVE: all_reduce | all_gather | reduce_scatter | broadcast | reduce |\n"
          "              all_to_all | gather | scatter | all\n"
          "\n"
          "flags (as coll-bench and nccl-tests):\n"
          "  -b, --minbytes SIZE    smallest size (default 32M); K, M, G suffixes\n"
          "  -e, --maxbytes SIZE    largest size (default 32M)\n"
          "  -f, --stepfactor N     multiply the size by N between rows (default 1: use -i)\n"
          "  -i, --stepbytes SIZE   add SIZE between rows when the factor is 1 (default 1M)\n"
          "  -o, --op OP            sum | prod | min | max | all (default sum; MPI has no avg)\n"
          "  -d, --datatype TYPE    int8 uint8 int32 uint32 int64 uint64 float32 float64 | all\n"
          "                         (aliases char int float double; MPI has no float16/bfloat16)\n"
          "  -r, --root R           root of broadcast, reduce, gather and scatter (default 0)\n"
          "  -n, --iters N          timed calls per row and placement (default 20)\n"
          "  -w, --warmup_iters N   untimed calls first (default 5)\n"
          "  -c, --check 0|1        check every result (default 1)\n"
          "ours:\n"
          "  -s, --sizes LIST       explicit sizes, e.g. 8,1K,64M (instead of -b/-e/-f/-i)\n"
          "  -H, --hugepages 0|1    1: the buffers on transparent huge pages (2 MiB aligned,\n"
          "                         MADV_HUGEPAGE), as IMB-MPI1's are under Intel MPI\n"
          "  -t, --target SECONDS   time about SECONDS per row and placement (at least -n\n"
          "                         calls, at most 10^6) after a calibration\n"
          "  -h, --help             this text\n"
          "\n"
          "Exit status: 0 all results right, 1 a result was wrong, 2 bad usage, 3 MPI failed.\n");
}

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_usage(const char *fmt, ...) {
  if (rank == 0) {
    va_list ap;
    va_start(ap, fmt);
    fputs("mpi_coll_bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see mpi_coll_bench --help)\n", stderr);
    va_end(ap);
  }
  MPI_Finalize();
  exit(EXIT_USAGE);
}

static bool parse_size(const char *s, size_t *out) {
  if (!s || *s < '0' || *s > '9') return false;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return false;
  unsigned shift = 0;
  switch (*end) {
  case 'k':
  case 'K':
    shift = 10;
    end++;
    break;
  case 'm':
  case 'M':
    shift = 20;
    end++;
    break;
  case 'g':
  case 'G':
    shift = 30;
    end++;
    break;
  default: break;
  }
  if (shift && (*end == 'i' || *end == 'I')) {
    end++;
    if (*end != 'b' && *end != 'B') return false;
  }
  if (*end == 'b' || *end == 'B') end++;
  if (*end || (shift && v > (SIZE_MAX >> shift)) || v > SIZE_MAX) return false;
  *out = (size_t)(v << shift);
  return true;
}

static size_t opt_size(const char *flag, const char *s) {
  size_t v;
  if (!parse_size(s, &v)) die_usage("%s: '%s' is not a size", flag, s);
  return v;
}

static unsigned long opt_uint(const char *flag, const char *s, unsigned long lo, unsigned long hi) {
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (*s < '0' || *s > '9' || errno || *end || v < lo || v > hi)
    die_usage("%s: '%s' is not a whole number in %lu..%lu", flag, s, lo, hi);
  return v;
}

static char *join_cmdline(int argc, char **argv) {
  size_t len = 1;
  for (int i = 0; i < argc; i++) len += strlen(argv[i]) + 1;
  char *s = malloc(len);
  if (!s) return NULL;
  char *p = s;
  for (int i = 0; i < argc; i++) p += sprintf(p, "%s%s", i ? " " : "", argv[i]);
  return s;
}

/* coll-bench's long flag names, mapped onto the short ones (flags take their value as
 * the next argument: -n 20, --iters 20). */
static const char *long_to_short(const char *a) {
  static const struct {
    const char *l, *s;
  } m[] = {
      {"--minbytes", "-b"},     {"--maxbytes", "-e"}, {"--stepfactor", "-f"}, {"--stepbytes", "-i"},
      {"--op", "-o"},           {"--datatype", "-d"}, {"--root", "-r"},       {"--iters", "-n"},
      {"--warmup_iters", "-w"}, {"--check", "-c"},    {"--sizes", "-s"},      {"--target", "-t"},
      {"--hugepages", "-H"},    {"--help", "-h"},
  };
  for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
    if (strcmp(a, m[i].l) == 0) return m[i].s;
  return a;
}

static void parse_args(int argc, char **argv, opts *o) {
  memset(o, 0, sizeof *o);
  o->min_bytes = o->max_bytes = 32u << 20;
  o->step_bytes = 1u << 20;
  o->step_factor = 1;
  o->dtypes[0] = T_FLOAT32, o->ndtypes = 1;
  o->ops[0] = OP_SUM, o->nops = 1;
  o->iters = 20, o->warmup = 5, o->check = 1;
  o->fault_rank = -1;
  o->cmdline = join_cmdline(argc, argv);

  if (argc < 2) die_usage("missing the collective (all_reduce, ..., or all)");
  if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
    if (rank == 0) usage(stdout);
    MPI_Finalize();
    exit(0);
  }
  if (argv[1][0] == '-') die_usage("the collective comes first, before '%s'", argv[1]);
  if (strcmp(argv[1], "all") == 0) {
    for (int c = 0; c < NUM_COLLS; c++) o->colls[o->ncolls++] = c;
  } else {
    char *dup = strdup(argv[1]), *save = NULL;
    for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
      int c = parse_coll(tok);
      if (c < 0) die_usage("unknown collective '%s'", tok);
      if (o->ncolls < NUM_COLLS) o->colls[o->ncolls++] = c;
    }
    free(dup);
    if (o->ncolls == 0) die_usage("missing the collective");
  }

  for (int i = 2; i < argc; i++) {
    const char *flag = long_to_short(argv[i]);
    if (strcmp(flag, "-h") == 0) {
      if (rank == 0) usage(stdout);
      MPI_Finalize();
      exit(0);
    }
    if (flag[0] != '-' || strlen(flag) != 2) die_usage("unexpected argument '%s'", argv[i]);
    if (i + 1 >= argc) die_usage("option %s needs a value", argv[i]);
    const char *v = argv[++i];
    switch (flag[1]) {
    case 'b': o->min_bytes = opt_size("-b", v); break;
    case 'e': o->max_bytes = opt_size("-e", v); break;
    case 'f': o->step_factor = opt_uint("-f", v, 1, 1u << 20); break;
    case 'i': o->step_bytes = opt_size("-i", v); break;
    case 'o': {
      int op = parse_op(v);
      if (op == -3) die_usage("-o avg: MPI has no averaging op");
      if (op == -2) die_usage("-o: unknown op '%s' (sum, prod, min, max or all)", v);
      o->nops = 0;
      if (op == -1)
        for (int k = 0; k < NUM_OPS; k++) o->ops[o->nops++] = k;
      else
        o->ops[o->nops++] = op;
      break;
    }
    case 'd': {
      int t = parse_dtype(v);
      if (t == -3) die_usage("-d %s: MPI has no datatype for it", v);
      if (t == -2) die_usage("-d: unknown datatype '%s'", v);
      o->ndtypes = 0;
      if (t == -1)
        for (int k = 0; k < NUM_TYPES; k++) o->dtypes[o->ndtypes++] = k;
      else
        o->dtypes[o->ndtypes++] = t;
      break;
    }
    case 'r': o->root = (int)opt_uint("-r", v, 0, 1u << 20); break;
    case 'n': o->iters = opt_uint("-n", v, 1, 100000000); break;
    case 'w': o->warmup = opt_uint("-w", v, 0, 100000000); break;
    case 'c': o->check = (int)opt_uint("-c", v, 0, 1); break;
    case 'H': o->huge = (int)opt_uint("-H", v, 0, 1); break;
    case 't': {
      char *end;
      o->target_s = strtod(v, &end);
      if (*end || !(o->target_s > 0 && o->target_s <= 3600))
        die_usage("-t: '%s' is not a number of seconds in (0, 3600]", v);
      break;
    }
    case 's': {
      char *dup = strdup(v), *save = NULL;
      free(o->list);
      o->list = calloc(strlen(v) / 2 + 1, sizeof *o->list);
      o->nlist = 0;
      for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        o->list[o->nlist++] = opt_size("-s", tok);
      free(dup);
      if (o->nlist == 0) die_usage("-s: no sizes in '%s'", v);
      break;
    }
    default: die_usage("unknown option %s", argv[i - 1]);
    }
  }
  if (o->min_bytes > o->max_bytes)
    die_usage("-b %zu is larger than -e %zu", o->min_bytes, o->max_bytes);
  if (o->step_factor > 1 && o->min_bytes == 0 && o->max_bytes > 0)
    die_usage("-b 0 with -f %lu: the size would never grow", o->step_factor);
  if (o->step_factor <= 1 && o->step_bytes == 0 && o->min_bytes < o->max_bytes)
    die_usage("-i 0 with -f 1: the size would never grow");
  if (o->nlist) {
    o->max_bytes = 0;
    for (int i = 0; i < o->nlist; i++)
      if (o->list[i] > o->max_bytes) o->max_bytes = o->list[i];
  }
  bool any_rooted = false;
  for (int i = 0; i < o->ncolls; i++) any_rooted = any_rooted || rooted(o->colls[i]);
  if (any_rooted && o->root >= nranks)
    die_usage("-r %d: the root must be below the number of ranks (%d)", o->root, nranks);

  const char *fault = getenv("PEERS_BENCH_FAULT");
  if (fault && *fault) {
    char *end;
    long r = strtol(fault, &end, 10);
    unsigned long long idx = 0;
    if (*end == ':') idx = strtoull(end + 1, &end, 10);
    if (*end || r < 0) die_usage("PEERS_BENCH_FAULT='%s' is not RANK[:INDEX]", fault);
    o->fault_rank = (int)r;
    o->fault_index = (size_t)idx;
  }
}

/* The sizes of a sweep: -s as given, else as nccl-tests steps (factor when > 1, else
 * increment), from -b to -e. */
static int next_size(const opts *o, int i, size_t *size) {
  if (o->nlist) {
    if (i >= o->nlist) return 0;
    *size = o->list[i];
    return 1;
  }
  if (i == 0) {
    *size = o->min_bytes;
    return 1;
  }
  size_t s = *size, n;
  if (o->step_factor > 1) {
    if (s > SIZE_MAX / o->step_factor) return 0;
    n = s * o->step_factor;
  } else {
    if (o->step_bytes == 0 || s > SIZE_MAX - o->step_bytes) return 0;
    n = s + o->step_bytes;
  }
  if (n > o->max_bytes || n == s) return 0;
  *size = n;
  return 1;
}

/* ---- data ------------------------------------------------------------------------------ */

typedef struct {
  coll_kind coll;
  dtype t;
  redop op;
  int root;
} row_kind;

/* The largest L such that 0..L are all exact in the dtype (capped: patterns stay small). */
static uint64_t exact_limit(dtype t) {
  switch (t) {
  case T_INT8: return 127;
  case T_UINT8: return 255;
  case T_FLOAT32: return 1u << 24;
  default: return 1ull << 31;
  }
}

/* How many factors of two a product may collect without leaving the exact range. */
static int max_twos(dtype t) {
  switch (t) {
  case T_INT8: return 6;
  case T_UINT8: return 7;
  case T_INT32: return 30;
  case T_UINT32: return 31;
  case T_INT64: return 62;
  case T_UINT64: return 63;
  case T_FLOAT32: return 127;
  default: return 1023;
  }
}

static uint64_t sum_modulus(dtype t) {
  uint64_t k = exact_limit(t) / (uint64_t)nranks + 1;
  return k > 8 ? 8 : k; /* < 2: one-hot */
}

static uint64_t prod_period(dtype t) {
  uint64_t n = (uint64_t)nranks, m = (uint64_t)max_twos(t);
  uint64_t p = (n + m - 1) / m;
  return p < 3 ? 3 : p;
}

/* What rank r feeds at index j of its input buffer. */
static double input_value(const row_kind *k, int r, uint64_t j) {
  if (!reduces(k->coll)) return (double)((j + 13u * (uint64_t)r) % 97u);
  uint64_t n = (uint64_t)nranks, ur = (uint64_t)r;
  switch (k->op) {
  case OP_SUM: {
    uint64_t m = sum_modulus(k->t);
    if (m < 2) return j % n == ur ? 1.0 : 0.0;
    return (double)((j + ur) % m);
  }
  case OP_PROD: return (j + ur) % prod_period(k->t) == 0 ? 2.0 : 1.0;
  default: return (double)((j + ur) % 100u);
  }
}

/* The reduction over all ranks of input index j. */
static double reduced_value(const row_kind *k, uint64_t j) {
  uint64_t n = (uint64_t)nranks;
  switch (k->op) {
  case OP_SUM: {
    uint64_t m = sum_modulus(k->t);
    if (m < 2) return 1.0;
    uint64_t s = (n / m) * (m * (m - 1) / 2);
    for (uint64_t t = 0; t < n % m; t++) s += (j + t) % m;
    return (double)s;
  }
  case OP_PROD: {
    uint64_t p = prod_period(k->t), r0 = (p - j % p) % p;
    int twos = r0 < n ? (int)((n - 1 - r0) / p + 1) : 0;
    return ldexp(1.0, twos);
  }
  default: {
    uint64_t s = j % 100u;
    bool wraps = n >= 100u || s + n - 1 >= 100u;
    if (k->op == OP_MAX) return (double)(wraps ? 99 : s + n - 1);
    return (double)(wraps ? 0 : s);
  }
  }
}

/* What rank r must find at index i of its output (count = the API count). */
static double expected_value(const row_kind *k, int r, size_t count, size_t i) {
  switch (k->coll) {
  case ALL_REDUCE:
  case REDUCE: return reduced_value(k, i);
  case REDUCE_SCATTER: return reduced_value(k, (uint64_t)r * count + i);
  case BROADCAST: return input_value(k, k->root, i);
  case ALL_GATHER:
  case GATHER: return input_value(k, (int)(i / count), i % count);
  case ALL_TO_ALL: /* block s came from rank s, which sent it from its block r */
    return input_value(k, (int)(i / count), (uint64_t)r * count + i % count);
  case SCATTER: return input_value(k, k->root, (uint64_t)r * count + i);
  default: return NAN;
  }
}

static void store(dtype t, void *buf, size_t i, double v) {
  switch (t) {
  case T_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
  case T_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
  case T_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
  case T_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
  case T_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
  case T_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
  case T_FLOAT32: ((float *)buf)[i] = (float)v; break;
  default: ((double *)buf)[i] = v; break;
  }
}

static double load(dtype t, const void *buf, size_t i) {
  switch (t) {
  case T_INT8: return ((const int8_t *)buf)[i];
  case T_UINT8: return ((const uint8_t *)buf)[i];
  case T_INT32: return ((const int32_t *)buf)[i];
  case T_UINT32: return ((const uint32_t *)buf)[i];
  case T_INT64: return (double)((const int64_t *)buf)[i];
  case T_UINT64: return (double)((const uint64_t *)buf)[i];
  case T_FLOAT32: return ((const float *)buf)[i];
  default: return ((const double *)buf)[i];
  }
}

/* ---- one row ----------------------------------------------------------------------------- */

typedef struct {
  size_t count; /* the API count (per rank's block for blocked collectives) */
  size_t bytes; /* the size printed */
} shape;

static shape shape_for(coll_kind c, size_t bytes, size_t es) {
  shape s;
  size_t n = (size_t)nranks;
  s.count = blocked(c) ? bytes / es / n : bytes / es;
  s.bytes = blocked(c) ? s.count * n * es : s.count * es;
  return s;
}

/* Where the call reads and writes, where this rank's input goes (NULL: it has none) and
 * which output is checked (NULL: none on this rank). */
typedef struct {
  const void *sb;
  void *rb;
  void *in, *out;
  size_t in_elems, out_elems, poison_bytes;
} placement;

static placement place(const row_kind *k, const shape *sh, void *sendbuf, void *recvbuf,
                       bool in_place) {
  placement p;
  memset(&p, 0, sizeof p);
  size_t es = type_sizes[k->t], n = (size_t)nranks, cnt = sh->count;
  size_t mine = (size_t)rank * cnt * es;
  bool root = rank == k->root;
  unsigned char *s = sendbuf, *r = recvbuf;
  size_t full = blocked(k->coll) ? n * cnt : cnt;
  p.sb = in_place ? MPI_IN_PLACE : s;
  p.rb = r;
  p.poison_bytes = full * es;
  switch (k->coll) {
  case ALL_REDUCE:
  case BROADCAST:
    p.in = (k->coll == BROADCAST && !root) ? NULL : in_place ? r : s;
    p.in_elems = cnt;
    p.out = r, p.out_elems = cnt;
    break;
  case REDUCE:
    if (in_place && !root) p.sb = r, p.rb = NULL; /* only the root passes MPI_IN_PLACE */
    p.in = in_place ? r : s, p.in_elems = cnt;
    p.out = root ? r : NULL, p.out_elems = cnt;
    break;
  case REDUCE_SCATTER:
    p.in = in_place ? r : s, p.in_elems = n * cnt;
    p.out = r, p.out_elems = cnt;
    break;
  case ALL_GATHER:
    p.in = in_place ? r + mine : s, p.in_elems = cnt;
    p.out = r, p.out_elems = n * cnt;
    break;
  case ALL_TO_ALL:
    p.in = in_place ? r : s, p.in_elems = n * cnt;
    p.out = r, p.out_elems = n * cnt;
    break;
  case GATHER:
    if (in_place && !root) p.sb = r + mine, p.rb = NULL;
    p.in = in_place ? r + mine : s, p.in_elems = cnt;
    p.out = root ? r : NULL, p.out_elems = n * cnt;
    break;
  case SCATTER:
    /* root: the whole send buffer; in place its own block stays where it is */
    if (in_place) {
      p.sb = root ? r : NULL;
      p.rb = root ? MPI_IN_PLACE : r + mine;
    }
    p.in = root ? (in_place ? r : s) : NULL, p.in_elems = n * cnt;
    p.out = in_place ? r + mine : r, p.out_elems = cnt;
    break;
  default: break;
  }
  return p;
}

typedef struct {
  bool done;
  double time_us, algbw, busbw;
  unsigned long long wrong;
  unsigned long iters;
} place_result;

static void fail_mpi(const char *what, const row_kind *k, size_t bytes, int err) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(err, msg, &len);
  fprintf(stderr, "mpi_coll_bench: rank %d: %s failed (%s %s size %zu): %s\n", rank, what,
          k ? coll_names[k->coll] : "-", k ? type_names[k->t] : "-", bytes, msg);
  MPI_Abort(MPI_COMM_WORLD, EXIT_RUNTIME);
  exit(EXIT_RUNTIME);
}

#define MPI_CHECK(what, k, bytes, call)                      \
  do {                                                       \
    int err_ = (call);                                       \
    if (err_ != MPI_SUCCESS) fail_mpi(what, k, bytes, err_); \
  } while (0)

/* One call of the row's collective. */
static int run_once(const row_kind *k, const placement *p, size_t count) {
  MPI_Datatype t = mpi_type(k->t);
  int c = (int)count, root = k->root;
  switch (k->coll) {
  case ALL_REDUCE: return MPI_Allreduce(p->sb, p->rb, c, t, mpi_op(k->op), MPI_COMM_WORLD);
  case REDUCE: return MPI_Reduce(p->sb, p->rb, c, t, mpi_op(k->op), root, MPI_COMM_WORLD);
  case REDUCE_SCATTER:
    return MPI_Reduce_scatter_block(p->sb, p->rb, c, t, mpi_op(k->op), MPI_COMM_WORLD);
  case BROADCAST: return MPI_Bcast(p->rb, c, t, root, MPI_COMM_WORLD);
  case ALL_GATHER:
    return p->sb == MPI_IN_PLACE
               ? MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p->rb, c, t, MPI_COMM_WORLD)
               : MPI_Allgather(p->sb, c, t, p->rb, c, t, MPI_COMM_WORLD);
  case ALL_TO_ALL:
    return p->sb == MPI_IN_PLACE
               ? MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p->rb, c, t, MPI_COMM_WORLD)
               : MPI_Alltoall(p->sb, c, t, p->rb, c, t, MPI_COMM_WORLD);
  case GATHER:
    return p->sb == MPI_IN_PLACE
               ? MPI_Gather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p->rb, c, t, root, MPI_COMM_WORLD)
               : MPI_Gather(p->sb, c, t, p->rb, c, t, root, MPI_COMM_WORLD);
  case SCATTER:
    return p->rb == MPI_IN_PLACE
               ? MPI_Scatter(p->sb, c, t, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, root, MPI_COMM_WORLD)
               : MPI_Scatter(p->sb, c, t, p->rb, c, t, root, MPI_COMM_WORLD);
  default: return MPI_ERR_OTHER;
  }
}

static void prepare(const row_kind *k, const placement *p, void *recvbuf) {
  memset(recvbuf, 0xff, p->poison_bytes); /* NaN, -1 or the largest value: never expected */
  if (p->in)
    for (size_t i = 0; i < p->in_elems; i++) store(k->t, p->in, i, input_value(k, rank, i));
}

/* Back-to-back calls; returns the slowest rank's mean seconds per call. */
static double time_calls(const row_kind *k, const placement *p, const shape *sh,
                         unsigned long iters) {
  MPI_CHECK("MPI_Barrier", k, sh->bytes, MPI_Barrier(MPI_COMM_WORLD));
  double t0 = MPI_Wtime();
  for (unsigned long i = 0; i < iters; i++)
    MPI_CHECK(coll_names[k->coll], k, sh->bytes, run_once(k, p, sh->count));
  double mean = (MPI_Wtime() - t0) / (double)iters, slowest = 0;
  MPI_CHECK("MPI_Allreduce (timings)", k, sh->bytes,
            MPI_Allreduce(&mean, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return slowest;
}

static void measure(const opts *o, const row_kind *k, const shape *sh, void *sendbuf, void *recvbuf,
                    bool in_place, place_result *res) {
  placement p = place(k, sh, sendbuf, recvbuf, in_place);
  prepare(k, &p, recvbuf);
  MPI_CHECK("MPI_Barrier", k, sh->bytes, MPI_Barrier(MPI_COMM_WORLD));
  for (unsigned long i = 0; i < o->warmup; i++)
    MPI_CHECK(coll_names[k->coll], k, sh->bytes, run_once(k, &p, sh->count));

  unsigned long iters = o->iters;
  if (o->target_s > 0) { /* calibrate: double a batch until it takes 10 ms */
    unsigned long batch = 1;
    double per;
    for (;;) {
      per = time_calls(k, &p, sh, batch);
      if (per * (double)batch >= 0.01 || batch >= 1000000) break;
      batch *= 2;
    }
    double want = ceil(o->target_s / (per > 0 ? per : 1e-9));
    iters = want > 1e6 ? 1000000 : want < (double)o->iters ? o->iters : (unsigned long)want;
  }
  double sec = time_calls(k, &p, sh, iters);
  res->iters = iters;
  res->time_us = sec * 1e6;
  res->algbw = sec > 0 ? (double)sh->bytes / 1e9 / sec : 0.0;
  res->busbw = res->algbw * bus_factor(k->coll, nranks);

  res->wrong = 0;
  if (o->check) {
    prepare(k, &p, recvbuf);
    MPI_CHECK("MPI_Barrier", k, sh->bytes, MPI_Barrier(MPI_COMM_WORLD));
    MPI_CHECK(coll_names[k->coll], k, sh->bytes, run_once(k, &p, sh->count));
    unsigned long long wrong = 0, total = 0;
    if (p.out) {
      if (rank == o->fault_rank && o->fault_index < p.out_elems)
        store(k->t, p.out, o->fault_index, load(k->t, p.out, o->fault_index) + 1);
      size_t first = 0;
      double want0 = 0, got0 = 0;
      for (size_t i = 0; i < p.out_elems; i++) {
        double want = expected_value(k, rank, sh->count, i), got = load(k->t, p.out, i);
        if (got != want) {
          if (!wrong) first = i, want0 = want, got0 = got;
          wrong++;
        }
      }
      if (wrong)
        fprintf(stderr,
                "mpi_coll_bench: rank %d: %s %s %s size %zu %s: first wrong element at index "
                "%zu: expected %.9g, got %.9g (%llu wrong on this rank)\n",
                rank, coll_names[k->coll], type_names[k->t],
                reduces(k->coll) ? op_names[k->op] : "none", sh->bytes,
                in_place ? "in-place" : "out-of-place", first, want0, got0, wrong);
    }
    MPI_CHECK("MPI_Allreduce (#wrong)", k, sh->bytes,
              MPI_Allreduce(&wrong, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));
    res->wrong = total;
  }
  res->done = true;
}

/* ---- output (rank 0) ------------------------------------------------------------------ */

/* The time column as nccl-tests and coll-bench format it. */
static void format_time(double us, char *buf, size_t len) {
  if (us >= 10000.0)
    snprintf(buf, len, "%7.0f", us);
  else if (us >= 100.0)
    snprintf(buf, len, "%7.1f", us);
  else
    snprintf(buf, len, "%7.2f", us);
}

static void print_table_header(coll_kind c) {
  printf("#\n# Collective: %s   busbw = algbw * %s = algbw * %.4f\n", coll_names[c], factor_text(c),
         bus_factor(c, nranks));
  if (c == BROADCAST)
    printf("# (MPI_Bcast has one buffer: it is timed in the in-place columns; out-of-place "
           "reads N/A)\n");
  printf("#\n");
  printf(
      "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n",
      "", "", "", "", "");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s  %7s\n", "size",
         "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
         "busbw", "#wrong", "iters");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)",
         "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  fflush(stdout);
}

static void print_row(const opts *o, const row_kind *k, const shape *sh, const place_result r[2]) {
  printf("%12zu  %12zu  %8s  %6s  %6d", sh->bytes, sh->count, type_names[k->t],
         reduces(k->coll) ? op_names[k->op] : "none", rooted(k->coll) ? k->root : -1);
  for (int i = 0; i < 2; i++) {
    if (!r[i].done) {
      printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
      continue;
    }
    char ts[32], wrong[32];
    format_time(r[i].time_us, ts, sizeof ts);
    if (o->check)
      snprintf(wrong, sizeof wrong, "%llu", r[i].wrong);
    else
      snprintf(wrong, sizeof wrong, "N/A");
    printf("  %7s  %6.2f  %6.2f  %5s", ts, r[i].algbw, r[i].busbw, wrong);
  }
  char it[48];
  if (r[0].done && r[1].done && r[0].iters != r[1].iters)
    snprintf(it, sizeof it, "%lu/%lu", r[0].iters, r[1].iters);
  else
    snprintf(it, sizeof it, "%lu", r[0].done ? r[0].iters : r[1].iters);
  printf("  %7s\n", it);
  fflush(stdout);
}

static void print_run_header(const opts *o) {
  char ver[MPI_MAX_LIBRARY_VERSION_STRING] = "";
  int len = 0;
  MPI_Get_library_version(ver, &len);
  char *nl = strchr(ver, '\n');
  if (nl) *nl = '\0';
  for (char *c = ver; *c; c++)
    if (*c == '\t') *c = ' ';
  if (o->ncolls == NUM_COLLS)
    printf("# mpi_coll_bench all");
  else {
    printf("# mpi_coll_bench ");
    for (int i = 0; i < o->ncolls; i++) printf("%s%s", i ? "," : "", coll_names[o->colls[i]]);
  }
  printf(" (%s)\n", ver);
  printf("# Command: %s\n", o->cmdline ? o->cmdline : "");
  if (o->nlist) {
    printf("# nRanks %d sizes:", nranks);
    for (int i = 0; i < o->nlist; i++) printf("%s%zu", i ? "," : " ", o->list[i]);
    printf(" warmup iters: %lu iters: %lu validation: %d\n", o->warmup, o->iters, o->check);
  } else if (o->step_factor > 1) {
    printf("# nRanks %d minBytes %zu maxBytes %zu step: %lu(factor) warmup iters: %lu "
           "iters: %lu validation: %d\n",
           nranks, o->min_bytes, o->max_bytes, o->step_factor, o->warmup, o->iters, o->check);
  } else {
    printf("# nRanks %d minBytes %zu maxBytes %zu step: %zu(bytes) warmup iters: %lu "
           "iters: %lu validation: %d\n",
           nranks, o->min_bytes, o->max_bytes, o->step_bytes, o->warmup, o->iters, o->check);
  }
  if (o->target_s > 0)
    printf("# -t %g: each row and placement times about %g s of back-to-back calls (at "
           "least %lu)\n",
           o->target_s, o->target_s, o->iters);
  printf("# time: the slowest rank's mean over the timed calls (us)\n");
}

static void print_ranks(void) {
  char host[MPI_MAX_PROCESSOR_NAME] = "";
  int len = 0;
  MPI_Get_processor_name(host, &len);
  long long pid = (long long)getpid();
  char(*hosts)[MPI_MAX_PROCESSOR_NAME] = NULL;
  long long *pids = NULL;
  if (rank == 0) {
    hosts = calloc((size_t)nranks, sizeof *hosts);
    pids = calloc((size_t)nranks, sizeof *pids);
    if (!hosts || !pids) {
      fprintf(stderr, "mpi_coll_bench: out of memory\n");
      MPI_Abort(MPI_COMM_WORLD, EXIT_RUNTIME);
    }
  }
  MPI_CHECK("MPI_Gather", NULL, 0,
            MPI_Gather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts, MPI_MAX_PROCESSOR_NAME,
                       MPI_CHAR, 0, MPI_COMM_WORLD));
  MPI_CHECK("MPI_Gather", NULL, 0,
            MPI_Gather(&pid, 1, MPI_LONG_LONG, pids, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD));
  if (rank == 0) {
    printf("#\n# Using ranks\n");
    for (int r = 0; r < nranks; r++)
      printf("#  Rank %2d Pid %6lld on %10s\n", r, pids[r], hosts[r]);
    fflush(stdout);
  }
  free(hosts);
  free(pids);
}

/* ---- main --------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  /* errors come back to us, so a failure says which call, collective and size */
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);

  opts o;
  parse_args(argc, argv, &o);

  /* every count must fit MPI's int */
  for (int ti = 0; ti < o.ndtypes; ti++)
    if (o.max_bytes / type_sizes[o.dtypes[ti]] > (size_t)INT_MAX)
      die_usage("-e %zu: %zu %s elements do not fit an MPI count", o.max_bytes,
                o.max_bytes / type_sizes[o.dtypes[ti]], type_names[o.dtypes[ti]]);

  /* Two buffers of the largest size (every placement's data fits: blocked collectives
   * round the size down to n*count elements), allocated and touched once. */
  size_t buf_bytes = o.max_bytes < 64 ? 64 : o.max_bytes;
  buf_bytes = (buf_bytes + 4095) & ~(size_t)4095;
  void *sendbuf = NULL, *recvbuf = NULL;
  size_t align = o.huge ? (size_t)2 << 20 : 4096;
  if (o.huge) buf_bytes = (buf_bytes + align - 1) & ~(align - 1);
  if (posix_memalign(&sendbuf, align, buf_bytes) || posix_memalign(&recvbuf, align, buf_bytes)) {
    fprintf(stderr, "mpi_coll_bench: rank %d: cannot allocate two buffers of %zu bytes\n", rank,
            buf_bytes);
    MPI_Abort(MPI_COMM_WORLD, EXIT_RUNTIME);
  }
  if (o.huge &&
      (madvise(sendbuf, buf_bytes, MADV_HUGEPAGE) || madvise(recvbuf, buf_bytes, MADV_HUGEPAGE))) {
    fprintf(stderr, "mpi_coll_bench: rank %d: madvise(MADV_HUGEPAGE): %s\n", rank, strerror(errno));
    MPI_Abort(MPI_COMM_WORLD, EXIT_RUNTIME);
  }
  memset(sendbuf, 0, buf_bytes);
  memset(recvbuf, 0, buf_bytes);

  if (rank == 0) print_run_header(&o);
  print_ranks();

  bool any_wrong = false;
  for (int ci = 0; ci < o.ncolls; ci++) {
    coll_kind c = (coll_kind)o.colls[ci];
    if (rank == 0) print_table_header(c);
    unsigned long long bad = 0;
    double bw_sum = 0;
    int bw_count = 0;
    int nops = reduces(c) ? o.nops : 1;
    for (int ti = 0; ti < o.ndtypes; ti++) {
      for (int oi = 0; oi < nops; oi++) {
        row_kind k = {.coll = c,
                      .t = (dtype)o.dtypes[ti],
                      .op = reduces(c) ? (redop)o.ops[oi] : OP_SUM,
                      .root = rooted(c) ? o.root : 0};
        size_t size = 0;
        for (int si = 0; next_size(&o, si, &size); si++) {
          shape sh = shape_for(c, size, type_sizes[k.t]);
          place_result r[2];
          memset(r, 0, sizeof r);
          for (int ip = 0; ip < 2; ip++) {
            if (!ip && c == BROADCAST) continue;
            measure(&o, &k, &sh, sendbuf, recvbuf, ip == 1, &r[ip]);
            bw_sum += r[ip].busbw;
            bw_count++;
            if (r[ip].wrong) bad++;
          }
          if (rank == 0) print_row(&o, &k, &sh, r);
        }
      }
    }
    any_wrong = any_wrong || bad;
    if (rank == 0) {
      printf("# Out of bounds values : %llu %s\n", bad, bad ? "FAILED" : "OK");
      printf("# Avg bus bandwidth    : %g \n#\n", bw_count ? bw_sum / bw_count : 0.0);
      fflush(stdout);
    }
  }
  free(sendbuf);
  free(recvbuf);
  free(o.list);
  free(o.cmdline);
  MPI_Finalize();
  return any_wrong ? EXIT_WRONG : 0;
}
