/* test_bench.c — coll-bench: its pure arithmetic, and the built binary end to end.
 *
 * Part 1 compiles bench/bench_util.c in and checks what can be checked in one process:
 * size and name parsing, the nccl-tests byte / algbw / busbw arithmetic against numbers
 * worked out by hand, the half-type conversions, and that every data pattern gives an
 * exactly representable result for every dtype, op and rank count (by simulating the
 * reduction in the dtype's own arithmetic), and that the checker counts wrong elements.
 *
 * Part 2 runs $COLL_TEST_BUILD_DIR/bench/coll-bench with --ranks 2 and 3 on small sizes
 * for every collective and checks the exit status, the shape of the nccl-tests table,
 * #wrong == 0, the CSV / JSON outputs, that an injected wrong element (COLL_BENCH_FAULT)
 * is counted and fails the exit status, and that bad flags give one line and status 2.
 * Every run is bounded in time; its whole process group is killed on a timeout.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../bench/bench_util.c"
#include "run_prog.h"

/* An assertion that reaches Criterion only when it fails: the loops below check millions
 * of values, and `meson test` runs with --full-stats, which reports every passed
 * assertion through a pipe. */
#define CHECK(cond, ...)                      \
  do {                                        \
    if (!(cond)) cr_assert_fail(__VA_ARGS__); \
  } while (0)

/* ===================================================================================== */
/* Part 1: pure parts                                                                      */
/* ===================================================================================== */

Test(bench_units, parse_size) {
  static const struct {
    const char *s;
    size_t v;
  } good[] = {
      {"0", 0},
      {"8", 8},
      {"1K", 1024},
      {"1k", 1024},
      {"64M", 64u << 20},
      {"1G", 1u << 30},
      {"4KiB", 4096},
      {"16B", 16},
      {"3m", 3u << 20},
      {"2GB", 2ull << 30},
      {"1048576", 1048576},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    size_t v = 12345;
    cr_assert(bench_parse_size(good[i].s, &v), "'%s' should parse", good[i].s);
    cr_assert_eq(v, good[i].v, "'%s' -> %zu, want %zu", good[i].s, v, good[i].v);
  }
  static const char *const bad[] = {"",
                                    "-1",
                                    "K",
                                    "1X",
                                    "1.5M",
                                    " 8",
                                    "8 ",
                                    "1KK",
                                    "1Ki",
                                    "99999999999999999999",
                                    "17179869184G",
                                    "0x10"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    size_t v;
    cr_assert_not(bench_parse_size(bad[i], &v), "'%s' should be refused", bad[i]);
  }
}

Test(bench_units, parse_names) {
  cr_assert_eq(bench_parse_coll("all_reduce"), BENCH_ALL_REDUCE);
  cr_assert_eq(bench_parse_coll("allgather"), BENCH_ALL_GATHER);
  cr_assert_eq(bench_parse_coll("reduce_scatter"), BENCH_REDUCE_SCATTER);
  cr_assert_eq(bench_parse_coll("bcast"), BENCH_BROADCAST);
  cr_assert_eq(bench_parse_coll("sendrecv"), BENCH_SENDRECV);
  cr_assert_eq(bench_parse_coll("all"), -1);
  cr_assert_eq(bench_parse_coll("alltoall"), BENCH_ALL_TO_ALL);
  cr_assert_eq(bench_parse_coll("all_to_all"), BENCH_ALL_TO_ALL);
  cr_assert_eq(bench_parse_coll("gather"), BENCH_GATHER);
  cr_assert_eq(bench_parse_coll("scatter"), BENCH_SCATTER);
  cr_assert_eq(bench_parse_coll("alltoallv"), -2);

  static const struct {
    const char *s;
    int t;
  } types[] = {
      {"int8", COLL_INT8},
      {"char", COLL_INT8},
      {"uint8", COLL_UINT8},
      {"int32", COLL_INT32},
      {"int", COLL_INT32},
      {"uint32", COLL_UINT32},
      {"int64", COLL_INT64},
      {"uint64", COLL_UINT64},
      {"float16", COLL_FLOAT16},
      {"half", COLL_FLOAT16},
      {"bfloat16", COLL_BFLOAT16},
      {"bf16", COLL_BFLOAT16},
      {"float32", COLL_FLOAT32},
      {"float", COLL_FLOAT32},
      {"float64", COLL_FLOAT64},
      {"double", COLL_FLOAT64},
      {"all", -1},
      {"float8", -2},
  };
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    cr_assert_eq(bench_parse_dtype(types[i].s), types[i].t, "dtype '%s'", types[i].s);
  for (int t = 0; t < COLL_NUM_DTYPES; t++) {
    cr_assert_eq(bench_parse_dtype(bench_dtype_name((coll_dtype)t)), t);
    cr_assert_eq(bench_dtype_size((coll_dtype)t), coll_dtype_size((coll_dtype)t),
                 "size of %s disagrees with libcoll", bench_dtype_name((coll_dtype)t));
  }
  for (int o = 0; o < COLL_NUM_OPS; o++) cr_assert_eq(bench_parse_op(bench_op_name((coll_op)o)), o);
  cr_assert_eq(bench_parse_op("all"), -1);
  cr_assert_eq(bench_parse_op("xor"), -2);
}

static void assert_close(double got, double want, const char *what) {
  cr_assert(fabs(got - want) <= 1e-12 * fmax(1.0, fabs(want)), "%s: got %.15g, want %.15g", what,
            got, want);
}

Test(bench_units, bus_factors) {
  /* nccl-tests: all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, others 1 */
  assert_close(bench_bus_factor(BENCH_ALL_REDUCE, 1), 0.0, "all_reduce n=1");
  assert_close(bench_bus_factor(BENCH_ALL_REDUCE, 2), 1.0, "all_reduce n=2");
  assert_close(bench_bus_factor(BENCH_ALL_REDUCE, 4), 1.5, "all_reduce n=4");
  assert_close(bench_bus_factor(BENCH_ALL_REDUCE, 8), 1.75, "all_reduce n=8");
  assert_close(bench_bus_factor(BENCH_ALL_GATHER, 4), 0.75, "all_gather n=4");
  assert_close(bench_bus_factor(BENCH_ALL_GATHER, 3), 2.0 / 3.0, "all_gather n=3");
  assert_close(bench_bus_factor(BENCH_REDUCE_SCATTER, 2), 0.5, "reduce_scatter n=2");
  assert_close(bench_bus_factor(BENCH_REDUCE_SCATTER, 5), 0.8, "reduce_scatter n=5");
  for (int n = 1; n <= 8; n++) {
    assert_close(bench_bus_factor(BENCH_BROADCAST, n), 1.0, "broadcast");
    assert_close(bench_bus_factor(BENCH_REDUCE, n), 1.0, "reduce");
    assert_close(bench_bus_factor(BENCH_SENDRECV, n), 1.0, "sendrecv");
    /* nccl-tests' alltoall_perf, gather_perf, scatter_perf: (n-1)/n */
    assert_close(bench_bus_factor(BENCH_ALL_TO_ALL, n), (n - 1.0) / n, "all_to_all");
    assert_close(bench_bus_factor(BENCH_GATHER, n), (n - 1.0) / n, "gather");
    assert_close(bench_bus_factor(BENCH_SCATTER, n), (n - 1.0) / n, "scatter");
  }
}

Test(bench_units, algbw_busbw_by_hand) {
  /* 1 GB in one second is 1 GB/s (1e9 bytes, as nccl-tests) */
  assert_close(bench_algbw(1000000000u, 1e6), 1.0, "1e9 B in 1 s");
  /* 64 MiB in 10 ms: 67108864 / 1e9 / 0.01 = 6.7108864 GB/s */
  assert_close(bench_algbw(67108864u, 10000.0), 6.7108864, "64 MiB in 10 ms");
  /* all_reduce of 64 MiB on 4 ranks in 10 ms: busbw = 6.7108864 * 1.5 = 10.0663296 */
  assert_close(bench_algbw(67108864u, 10000.0) * bench_bus_factor(BENCH_ALL_REDUCE, 4), 10.0663296,
               "all_reduce busbw");
  /* all_gather of 3 MiB total on 3 ranks in 1 ms: algbw 3.145728, busbw 2.097152 */
  assert_close(bench_algbw(3145728u, 1000.0) * bench_bus_factor(BENCH_ALL_GATHER, 3), 2.097152,
               "all_gather busbw");
  /* reduce_scatter of 1 MB on 2 ranks in 250 us: algbw 4, busbw 2 */
  assert_close(bench_algbw(1000000u, 250.0) * bench_bus_factor(BENCH_REDUCE_SCATTER, 2), 2.0,
               "reduce_scatter busbw");
  /* broadcast / reduce / sendrecv: busbw == algbw; 8 B in 2 us = 0.004 GB/s */
  assert_close(bench_algbw(8u, 2.0) * bench_bus_factor(BENCH_SENDRECV, 2), 0.004, "sendrecv");
  cr_assert_eq(bench_algbw(100, 0.0), 0.0);
  cr_assert_eq(bench_algbw(0, 5.0), 0.0);
}

Test(bench_units, shapes) {
  bench_shape s = bench_shape_for(BENCH_ALL_REDUCE, 10, 4, 4);
  cr_assert(s.count == 2 && s.bytes == 8 && s.send_elems == 2 && s.recv_elems == 2);
  s = bench_shape_for(BENCH_ALL_GATHER, 1024, 4, 4); /* size = the whole gathered buffer */
  cr_assert(s.count == 64 && s.bytes == 1024 && s.send_elems == 64 && s.recv_elems == 256);
  s = bench_shape_for(BENCH_ALL_GATHER, 1024, 4, 3);
  cr_assert(s.count == 85 && s.bytes == 1020 && s.recv_elems == 255);
  s = bench_shape_for(BENCH_REDUCE_SCATTER, 1024, 2, 4);
  cr_assert(s.count == 128 && s.bytes == 1024 && s.send_elems == 512 && s.recv_elems == 128);
  s = bench_shape_for(BENCH_REDUCE_SCATTER, 8, 4, 4); /* too small: nothing per rank */
  cr_assert(s.count == 0 && s.bytes == 0);
  s = bench_shape_for(BENCH_BROADCAST, 4096, 8, 5);
  cr_assert(s.count == 512 && s.bytes == 4096);
  s = bench_shape_for(BENCH_SENDRECV, 7, 1, 2);
  cr_assert(s.count == 7 && s.bytes == 7);
  /* all_to_all: size = one rank's whole buffer, count = one block */
  s = bench_shape_for(BENCH_ALL_TO_ALL, 1024, 4, 3);
  cr_assert(s.count == 85 && s.bytes == 1020 && s.send_elems == 255 && s.recv_elems == 255);
  /* gather / scatter: size = the root's whole buffer */
  s = bench_shape_for(BENCH_GATHER, 1024, 4, 4);
  cr_assert(s.count == 64 && s.bytes == 1024 && s.send_elems == 64 && s.recv_elems == 256);
  s = bench_shape_for(BENCH_SCATTER, 1024, 4, 4);
  cr_assert(s.count == 64 && s.bytes == 1024 && s.send_elems == 256 && s.recv_elems == 64);
}

Test(bench_units, time_format) {
  char b[32];
  bench_format_time(5.126, b, sizeof b);
  cr_assert_str_eq(b, "   5.13");
  bench_format_time(99.994, b, sizeof b);
  cr_assert_str_eq(b, "  99.99");
  bench_format_time(123.3, b, sizeof b);
  cr_assert_str_eq(b, "  123.3");
  bench_format_time(12345.6, b, sizeof b);
  cr_assert_str_eq(b, "  12346");
  double sorted[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  cr_assert_eq(bench_percentile(sorted, 10, 0.5), 5);
  cr_assert_eq(bench_percentile(sorted, 10, 0.99), 10);
  cr_assert_eq(bench_percentile(sorted, 10, 0.0), 1);
  cr_assert_eq(bench_percentile(sorted, 1, 0.5), 1);
}

Test(bench_units, half_conversions) {
  for (int i = -2048; i <= 2048; i++) {
    CHECK(bench_half_to_float(bench_float_to_half((float)i)) == (float)i, "half %d", i);
    if (i >= -256 && i <= 256)
      CHECK(bench_bf16_to_float(bench_float_to_bf16((float)i)) == (float)i, "bf16 %d", i);
  }
  cr_assert_eq(bench_float_to_half(1.0f), 0x3c00);
  cr_assert_eq(bench_float_to_half(65504.0f), 0x7bff);
  cr_assert_eq(bench_float_to_half(65520.0f), 0x7c00); /* rounds up to infinity */
  cr_assert_eq(bench_float_to_half(2049.0f), bench_float_to_half(2048.0f)); /* tie to even */
  cr_assert_eq(bench_float_to_half(2051.0f), bench_float_to_half(2052.0f));
  cr_assert_eq(bench_float_to_half(ldexpf(1.0f, -24)), 0x0001); /* smallest subnormal */
  cr_assert(isnan(bench_half_to_float(0xffff)));
  cr_assert_eq(bench_float_to_bf16(257.0f), bench_float_to_bf16(256.0f)); /* tie to even */
  cr_assert_eq(bench_float_to_bf16(259.0f), bench_float_to_bf16(260.0f));
  cr_assert(isnan(bench_bf16_to_float(0xffff)));
}

/* Rounds v to the dtype (what storing it there gives back). */
static double in_dtype(coll_dtype t, double v) {
  unsigned char buf[8];
  bench_store(t, buf, 0, v);
  return bench_load(t, buf, 0);
}

/* The reduction as the library does it for one element, in rank order: combine, round
 * to the dtype after every step; avg divides the sum once at the end. */
static double simulate(const bench_data *d, size_t j) {
  double acc = bench_input_value(d, 0, j);
  for (int r = 1; r < d->nranks; r++) {
    double v = bench_input_value(d, r, j);
    switch (d->op) {
    case COLL_SUM:
    case COLL_AVG: acc = acc + v; break;
    case COLL_PROD: acc = acc * v; break;
    case COLL_MIN: acc = fmin(acc, v); break;
    case COLL_MAX: acc = fmax(acc, v); break;
    }
    acc = in_dtype(d->dtype, acc);
  }
  if (d->op == COLL_AVG) acc = in_dtype(d->dtype, trunc(acc / d->nranks));
  return acc;
}

static double dtype_max(coll_dtype t) {
  switch (t) {
  case COLL_INT8: return 127;
  case COLL_UINT8: return 255;
  case COLL_INT32: return 2147483647.0;
  case COLL_UINT32: return 4294967295.0;
  case COLL_FLOAT16: return 65504;
  default: return 1e300;
  }
}

Test(bench_units, patterns_are_exact_in_every_dtype) {
  static const int ns[] = {1, 2, 3, 4, 5, 7, 8, 16, 33, 64, 100, 130, 300};
  for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
    for (int t = 0; t < COLL_NUM_DTYPES; t++) {
      for (int op = 0; op < COLL_NUM_OPS; op++) {
        bench_data d = {BENCH_ALL_REDUCE, (coll_dtype)t, (coll_op)op, ns[ni], 0};
        for (size_t j = 0; j < 211; j++) {
          for (int r = 0; r < d.nranks; r++) {
            double v = bench_input_value(&d, r, j);
            CHECK(v >= 0 && v <= dtype_max(d.dtype) && in_dtype(d.dtype, v) == v,
                  "input %g not exact: %s %s n=%d", v, bench_dtype_name(d.dtype),
                  bench_op_name(d.op), d.nranks);
          }
          double want = bench_expected_value(&d, 0, 0, j);
          double got = simulate(&d, j);
          CHECK(got == want, "%s %s n=%d j=%zu: simulated %g, expected %g",
                bench_dtype_name(d.dtype), bench_op_name(d.op), d.nranks, j, got, want);
          CHECK(want <= dtype_max(d.dtype), "expected %g out of range", want);
        }
      }
    }
  }
}

Test(bench_units, patterns_depend_on_rank) {
  /* a result that dropped or doubled a rank's contribution must differ somewhere */
  for (int op = 0; op < COLL_NUM_OPS; op++) {
    bench_data d = {BENCH_ALL_REDUCE, COLL_FLOAT32, (coll_op)op, 3, 0};
    bool differs = false;
    for (size_t j = 0; j < 64 && !differs; j++)
      differs = bench_input_value(&d, 0, j) != bench_input_value(&d, 1, j);
    cr_assert(differs, "op %s: ranks feed the same data", bench_op_name(d.op));
  }
  bench_data g = {BENCH_ALL_GATHER, COLL_INT8, COLL_SUM, 4, 0};
  cr_assert_neq(bench_input_value(&g, 0, 5), bench_input_value(&g, 1, 5));
}

Test(bench_units, expected_per_collective) {
  bench_data d = {BENCH_ALL_GATHER, COLL_INT32, COLL_SUM, 3, 0};
  /* all_gather: element i of the output is element i % count of rank i / count */
  for (size_t i = 0; i < 30; i++)
    cr_assert_eq(bench_expected_value(&d, 2, 10, i), bench_input_value(&d, (int)(i / 10), i % 10));
  d.coll = BENCH_SENDRECV; /* from the previous rank */
  cr_assert_eq(bench_expected_value(&d, 0, 10, 4), bench_input_value(&d, 2, 4));
  cr_assert_eq(bench_expected_value(&d, 1, 10, 4), bench_input_value(&d, 0, 4));
  d.coll = BENCH_BROADCAST, d.root = 1;
  cr_assert_eq(bench_expected_value(&d, 2, 10, 7), bench_input_value(&d, 1, 7));
  d.coll = BENCH_REDUCE_SCATTER; /* rank r gets the reduction of block r */
  bench_data a = d;
  a.coll = BENCH_ALL_REDUCE;
  cr_assert_eq(bench_expected_value(&d, 2, 10, 3), bench_expected_value(&a, 0, 0, 23));
  d.coll = BENCH_REDUCE;
  cr_assert(bench_output_checked(&d, 1));
  cr_assert_not(bench_output_checked(&d, 0));
  /* all_to_all: block b of rank 2's output is block 2 of rank b's input */
  d.coll = BENCH_ALL_TO_ALL;
  for (size_t i = 0; i < 30; i++)
    cr_assert_eq(bench_expected_value(&d, 2, 10, i),
                 bench_input_value(&d, (int)(i / 10), 20 + i % 10));
  d.coll = BENCH_GATHER, d.root = 1; /* the root's output, in rank order */
  cr_assert(bench_output_checked(&d, 1));
  cr_assert_not(bench_output_checked(&d, 2));
  cr_assert_eq(bench_expected_value(&d, 1, 10, 27), bench_input_value(&d, 2, 7));
  d.coll = BENCH_SCATTER; /* block r of the root's input */
  cr_assert(bench_output_checked(&d, 2));
  cr_assert_eq(bench_expected_value(&d, 2, 10, 3), bench_input_value(&d, 1, 23));
}

Test(bench_units, checker_counts_wrong_elements) {
  for (int t = 0; t < COLL_NUM_DTYPES; t++) {
    bench_data d = {BENCH_ALL_REDUCE, (coll_dtype)t, COLL_SUM, 4, 0};
    size_t n = 100, es = bench_dtype_size(d.dtype);
    unsigned char *buf = malloc(n * es);
    for (size_t i = 0; i < n; i++) bench_store(d.dtype, buf, i, bench_expected_value(&d, 0, n, i));
    bench_check_result cr = bench_check_output(&d, 0, n, buf, n);
    cr_assert_eq(cr.wrong, 0, "%s: clean output counted wrong", bench_dtype_name(d.dtype));
    bench_store(d.dtype, buf, 17, bench_load(d.dtype, buf, 17) + 1);
    bench_store(d.dtype, buf, 50, bench_load(d.dtype, buf, 50) + 1);
    bench_poison((unsigned char *)buf + 99 * es, es);
    cr = bench_check_output(&d, 0, n, buf, n);
    cr_assert_eq(cr.wrong, 3, "%s: %llu wrong, want 3", bench_dtype_name(d.dtype),
                 (unsigned long long)cr.wrong);
    cr_assert_eq(cr.first_index, 17);
    cr_assert_eq(cr.first_got, cr.first_expected + 1);
    free(buf);
  }
}

/* ===================================================================================== */
/* Part 2: the binary                                                                      */
/* ===================================================================================== */

typedef t_run_result run_result;

static const char *bench_path(void) {
  static char path[4096];
  const char *dir = getenv("COLL_TEST_BUILD_DIR");
  cr_assert(dir && *dir, "COLL_TEST_BUILD_DIR is not set (run through meson test)");
  snprintf(path, sizeof path, "%s/bench/coll-bench", dir);
  cr_assert(
      access(path, X_OK) == 0,
      "%s is not built (meson test builds only what the selected tests depend on: run ninja first)",
      path);
  return path;
}

/* Runs coll-bench with argv (NULL-terminated, without argv[0]) and extra environment
 * assignments ("NAME=value", NULL-terminated, may be NULL), killing its process group
 * after timeout_s. */
static run_result run_bench(const char *const *args, const char *const *env, int timeout_s) {
  const char *argv[64];
  int argc = 0;
  argv[argc++] = bench_path();
  for (; args[argc - 1] && argc < 63; argc++) argv[argc] = args[argc - 1];
  argv[argc] = NULL;
  run_result r = t_run(argv, env, timeout_s);
  cr_assert_neq(r.status, -2, "%s", r.err);
  return r;
}

static void free_run(run_result *r) { t_run_free(r); }

/* Splits a line into whitespace-separated fields (modifies it). */
static int split(char *line, char **f, int max) {
  int n = 0;
  for (char *tok = strtok(line, " \t"); tok && n < max; tok = strtok(NULL, " \t")) f[n++] = tok;
  return n;
}

typedef struct {
  int tables, rows, footers_ok;
  unsigned long long wrong;
} table_summary;

/* Checks the nccl-tests shape of every table in `out`; returns counts. */
static table_summary check_tables(const char *out, const char *coll, int nranks, bool stats) {
  table_summary s = {0, 0, 0, 0};
  char *text = strdup(out), *save = NULL;
  bool in_table = false, saw_header = false;
  const char *cur = NULL;
  static const char *const names[] = {"all_reduce", "all_gather", "reduce_scatter",
                                      "broadcast",  "reduce",     "sendrecv",
                                      "all_to_all", "gather",     "scatter"};
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (strncmp(line, "# Collective: ", 14) == 0) {
      cur = NULL;
      for (int i = 0; i < 9; i++)
        if (strncmp(line + 14, names[i], strlen(names[i])) == 0 &&
            line[14 + strlen(names[i])] == ' ')
          cur = names[i];
      CHECK(cur, "unknown collective line: %s", line);
      if (coll) CHECK(strcmp(cur, coll) == 0, "table of %s, want %s", cur, coll);
      if (!strstr(line, "skipped")) {
        s.tables++;
        in_table = true;
        saw_header = false;
      }
      continue;
    }
    if (strstr(
            line,
            "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong") ==
        line) {
      CHECK(in_table, "column header outside a table");
      saw_header = true;
      continue;
    }
    if (strncmp(line, "# Out of bounds values : ", 25) == 0) {
      CHECK(in_table && saw_header, "footer without a table");
      if (strcmp(line + 25, "0 OK") == 0) s.footers_ok++;
      continue;
    }
    if (strncmp(line, "# Avg bus bandwidth    : ", 25) == 0) {
      in_table = false;
      continue;
    }
    if (line[0] == '#' || !in_table) continue;
    CHECK(saw_header, "row before the column header: %s", line);
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", line);
    char *f[32];
    int nf = split(copy, f, 32);
    CHECK(nf == (stats ? 22 : 14), "row has %d fields: %s", nf, line);
    {
      static const char *const algos[] = {"ring",     "tree",   "rd",     "rhd",
                                          "oneshot",  "direct", "mapped", "p2p",
                                          "pairwise", "linear", "fanout", "staged"};
      bool known = false;
      for (size_t i = 0; i < sizeof algos / sizeof *algos; i++)
        known = known || strcmp(f[nf - 1], algos[i]) == 0;
      CHECK(known, "unknown algorithm column: %s", line);
    }
    size_t size = strtoull(f[0], NULL, 10), count = strtoull(f[1], NULL, 10);
    coll_dtype t = (coll_dtype)bench_parse_dtype(f[2]);
    CHECK((int)t >= 0, "bad type column: %s", line);
    size_t per = strcmp(cur, "all_gather") == 0 || strcmp(cur, "reduce_scatter") == 0 ||
                         strcmp(cur, "all_to_all") == 0 || strcmp(cur, "gather") == 0 ||
                         strcmp(cur, "scatter") == 0
                     ? (size_t)nranks
                     : 1;
    CHECK(size == count * per * bench_dtype_size(t), "size/count mismatch: %s", line);
    bool reduces = strcmp(cur, "all_reduce") == 0 || strcmp(cur, "reduce") == 0 ||
                   strcmp(cur, "reduce_scatter") == 0;
    if (!reduces)
      CHECK(strcmp(f[3], "none") == 0, "redop of %s: %s", cur, line);
    else
      CHECK(bench_parse_op(f[3]) >= 0, "bad redop column: %s", line);
    bool rooted = strcmp(cur, "broadcast") == 0 || strcmp(cur, "reduce") == 0 ||
                  strcmp(cur, "gather") == 0 || strcmp(cur, "scatter") == 0;
    if (!rooted) CHECK(strcmp(f[4], "-1") == 0, "root of %s: %s", cur, line);
    CHECK(strtod(f[5], NULL) >= 0, "negative time: %s", line);
    CHECK(strcmp(f[8], "N/A") != 0, "out-of-place #wrong is N/A: %s", line);
    s.wrong += strtoull(f[8], NULL, 10);
    if (strcmp(cur, "sendrecv") == 0) {
      CHECK(strcmp(f[9], "N/A") == 0 && strcmp(f[12], "N/A") == 0, "sendrecv in-place: %s", line);
    } else {
      s.wrong += strtoull(f[12], NULL, 10);
    }
    if (stats && strcmp(f[13], "N/A") != 0) {
      double mn = strtod(f[13], NULL), p50 = strtod(f[14], NULL), p99 = strtod(f[15], NULL),
             mx = strtod(f[16], NULL), mean = strtod(f[5], NULL);
      CHECK(mn <= p50 && p50 <= p99 && p99 <= mx, "stats out of order: %s", line);
      CHECK(mn <= mean * 1.001 + 0.01 && mean <= mx * 1.001 + 0.01, "mean outside [min, max]: %s",
            line);
    }
    s.rows++;
  }
  free(text);
  return s;
}

static const char *const all_colls[] = {"all_reduce", "all_gather", "reduce_scatter",
                                        "broadcast",  "reduce",     "sendrecv",
                                        "all_to_all", "gather",     "scatter"};
#define NCOLLS ((int)(sizeof all_colls / sizeof *all_colls))

static void run_and_check(const char *coll, const char *ranks, const char *const *extra,
                          int want_rows) {
  const char *args[40] = {coll, "--ranks", ranks, "-b", "8",  "-e", "4K",
                          "-f", "4",       "-n",  "3",  "-w", "1"};
  int n = 13;
  for (int i = 0; extra && extra[i]; i++) args[n++] = extra[i];
  args[n] = NULL;
  run_result r = run_bench(args, NULL, 120);
  cr_assert_eq(r.status, 0, "coll-bench %s --ranks %s: status %d\nstdout:\n%s\nstderr:\n%s", coll,
               ranks, r.status, r.out, r.err);
  table_summary s = check_tables(r.out, coll, atoi(ranks), false);
  cr_assert_eq(s.tables, 1, "%s: %d tables\n%s", coll, s.tables, r.out);
  cr_assert_eq(s.rows, want_rows, "%s: %d rows, want %d\n%s", coll, s.rows, want_rows, r.out);
  cr_assert_eq(s.wrong, 0);
  cr_assert_eq(s.footers_ok, 1);
  cr_assert(strstr(r.out, "# Avg bus bandwidth    : "));
  free_run(&r);
}

/* 8, 32, 128, 512, 2048: five sizes */
Test(bench_run, every_collective_2_ranks, .timeout = 300) {
  for (int i = 0; i < NCOLLS; i++) run_and_check(all_colls[i], "2", NULL, 5);
}

Test(bench_run, every_collective_3_ranks, .timeout = 300) {
  for (int i = 0; i < NCOLLS; i++) run_and_check(all_colls[i], "3", NULL, 5);
}

Test(bench_run, blocking_and_other_roots, .timeout = 300) {
  static const char *const blk[] = {"-z", "1", NULL};
  static const char *const root2[] = {"-r", "2", NULL};
  for (int i = 0; i < NCOLLS; i++) run_and_check(all_colls[i], "3", blk, 5);
  run_and_check("broadcast", "3", root2, 5);
  run_and_check("reduce", "3", root2, 5);
  run_and_check("gather", "3", root2, 5);
  run_and_check("scatter", "3", root2, 5);
}

/* -R 1: buffers from coll_mem_alloc; with COLL_ALGO=mapped every collective but
 * sendrecv must run on the mapped path (the algo column says what ran), and be right. */
Test(bench_run, registered_buffers_take_the_mapped_path, .timeout = 300) {
  for (int i = 0; i < NCOLLS; i++) {
    const char *args[] = {all_colls[i], "--ranks", "3",  "-b", "24", "-e", "1M", "-f",     "32",
                          "-n",         "3",       "-w", "1",  "-R", "1",  "-A", "mapped", NULL};
    run_result r = run_bench(args, NULL, 120);
    cr_assert_eq(r.status, 0, "-R 1 %s: status %d\n%s\n%s", all_colls[i], r.status, r.out, r.err);
    table_summary s = check_tables(r.out, all_colls[i], 3, false);
    cr_assert_eq(s.rows, 4, "%s: %d rows\n%s", all_colls[i], s.rows, r.out);
    cr_assert_eq(s.wrong, 0);
    bool p2p = strcmp(all_colls[i], "sendrecv") == 0;
    int mapped = 0;
    for (const char *p = r.out; (p = strstr(p, " mapped\n")); p++) {
      const char *bol = p;
      while (bol > r.out && bol[-1] != '\n') bol--;
      mapped += *bol != '#'; /* table rows, not the header's command line */
    }
    cr_assert_eq(mapped, p2p ? 0 : 4, "%s: %d rows ran mapped\n%s", all_colls[i], mapped, r.out);
    free_run(&r);
  }
}

/* -H 1: the buffers 2 MiB aligned and madvised onto huge pages (as IMB-MPI1's are);
 * every collective still right, up to sizes that span several huge pages. */
Test(bench_run, huge_page_buffers, .timeout = 300) {
  static const char *const huge[] = {"-H", "1", "-e", "8M", "-f", "32", NULL};
  for (int i = 0; i < NCOLLS; i++) run_and_check(all_colls[i], "2", huge, 5);
}

/* --explain on windows: no FIFO steps to list, and it says so and why (not the
 * one-shot exchanges of the call dressed up as steps). */
Test(bench_explain, registered_buffers_explain_the_mapped_path, .timeout = 120) {
  const char *args[] = {"all_reduce", "--ranks", "3", "--explain", "-b", "1M", "-e",
                        "1M",         "-n",      "3", "-R",        "1",  NULL};
  run_result r = run_bench(args, NULL, 120);
  cr_assert_eq(r.status, 0, "status %d\n%s\n%s", r.status, r.out, r.err);
  cr_assert(strstr(r.out, "algorithm mapped"), "%s", r.out);
  cr_assert(strstr(r.out, "# No FIFO steps: every rank's buffers are coll_mem_alloc memory"), "%s",
            r.out);
  cr_assert(strstr(r.out, "(N-1)/N*S = 699051 B from other ranks' memory"), "%s", r.out);
  cr_assert(!strstr(r.out, "# Steps, as the executor ran them"), "%s", r.out);
  free_run(&r);
}

Test(bench_run, all_dtypes_and_ops, .timeout = 300) {
  /* 10 dtypes x 5 ops x 5 sizes for each reducing collective; 10 x 5 for the others */
  static const char *const all[] = {"-d", "all", "-o", "all", NULL};
  run_and_check("all_reduce", "3", all, 250);
  run_and_check("reduce_scatter", "2", all, 250);
  run_and_check("reduce", "3", all, 250);
  run_and_check("all_gather", "3", all, 50);
}

Test(bench_run, all_collectives_in_one_run, .timeout = 300) {
  const char *args[] = {"all", "--ranks", "2",  "-b", "1K", "-e",   "64K", "-f",  "8",
                        "-n",  "2",       "-w", "1",  "-d", "bf16", "-o",  "avg", NULL};
  run_result r = run_bench(args, NULL, 120);
  cr_assert_eq(r.status, 0, "status %d\n%s\n%s", r.status, r.out, r.err);
  table_summary s = check_tables(r.out, NULL, 2, false);
  cr_assert_eq(s.tables, NCOLLS);
  cr_assert_eq(s.footers_ok, NCOLLS);
  cr_assert_eq(s.rows, NCOLLS * 3); /* 1K, 8K, 64K */
  cr_assert_eq(s.wrong, 0);
  for (int i = 0; i < NCOLLS; i++) {
    char want[64];
    snprintf(want, sizeof want, "# Collective: %s ", all_colls[i]);
    cr_assert(strstr(r.out, want), "missing %s", want);
  }
  free_run(&r);
}

Test(bench_run, stats_columns, .timeout = 120) {
  const char *args[] = {"all_reduce", "--ranks", "2",  "-b", "64",      "-e", "64K",
                        "-f",         "32",      "-n", "10", "--stats", NULL};
  run_result r = run_bench(args, NULL, 120);
  cr_assert_eq(r.status, 0, "status %d\n%s\n%s", r.status, r.out, r.err);
  table_summary s = check_tables(r.out, "all_reduce", 2, true);
  cr_assert_eq(s.rows, 3);
  free_run(&r);
}

/* A deliberately wrong element must be counted in #wrong, fail the footer and the exit
 * status, and be printed. */
Test(bench_run, wrong_result_fails, .timeout = 120) {
  const char *args[] = {"all_reduce", "--ranks", "3",  "-b", "1K", "-e", "4K",
                        "-f",         "4",       "-n", "2",  "-w", "0",  NULL};
  const char *env[] = {"COLL_BENCH_FAULT=1:7", NULL};
  run_result r = run_bench(args, env, 120);
  cr_assert_eq(r.status, 1, "status %d\n%s\n%s", r.status, r.out, r.err);
  table_summary s = check_tables(r.out, "all_reduce", 3, false);
  cr_assert_eq(s.rows, 2);
  cr_assert_eq(s.wrong, 4, "one wrong element per row and placement, got %llu\n%s", s.wrong, r.out);
  cr_assert(strstr(r.out, "# Out of bounds values : 4 FAILED"), "%s", r.out);
  cr_assert(strstr(r.err, "rank 1: all_reduce float32 sum size 1024 out-of-place: first wrong "
                          "element at index 7: expected "),
            "%s", r.err);
  free_run(&r);

  /* reduce: only the root's output is defined, so a fault elsewhere changes nothing */
  const char *args2[] = {"reduce", "--ranks", "2", "-b", "1K", "-e", "1K", "-r", "1", NULL};
  const char *env2[] = {"COLL_BENCH_FAULT=0:0", NULL};
  r = run_bench(args2, env2, 120);
  cr_assert_eq(r.status, 0, "status %d\n%s\n%s", r.status, r.out, r.err);
  free_run(&r);
  const char *env3[] = {"COLL_BENCH_FAULT=1:0", NULL};
  r = run_bench(args2, env3, 120);
  cr_assert_eq(r.status, 1, "status %d\n%s\n%s", r.status, r.out, r.err);
  free_run(&r);
}

static size_t count_lines(const char *s) {
  size_t n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

Test(bench_run, csv_and_json, .timeout = 120) {
  char csv[] = "/tmp/test_bench_csv_XXXXXX", json[] = "/tmp/test_bench_json_XXXXXX";
  close(mkstemp(csv));
  close(mkstemp(json));
  const char *args[] = {"all", "--ranks", "3", "-b",    "8K", "-e",     "32K", "-f",
                        "4",   "-n",      "3", "--csv", csv,  "--json", json,  NULL};
  run_result r = run_bench(args, NULL, 120);
  cr_assert_eq(r.status, 0, "status %d\n%s\n%s", r.status, r.out, r.err);
  free_run(&r);

  /* CSV: a header and 18 rows (9 collectives x 2 sizes); busbw = algbw x factor, and
   * algbw = size / time */
  char *c = t_slurp(csv);
  cr_assert_eq(count_lines(c), 1 + 2 * NCOLLS, "%s", c);
  static const char head[] = "collective,nranks,transport,algorithm,type,redop,root,size,count,"
                             "oop_time_us,oop_algbw,oop_busbw,oop_wrong,ip_time_us";
  cr_assert(strncmp(c, head, strlen(head)) == 0, "%s", c);
  char *save = NULL;
  strtok_r(c, "\n", &save);
  for (char *line = strtok_r(NULL, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *f[32], *p = line;
    int nf = 0;
    for (;;) { /* keep empty fields */
      f[nf++] = p;
      char *comma = strchr(p, ',');
      if (!comma || nf == 32) break;
      *comma = '\0';
      p = comma + 1;
    }
    cr_assert_eq(nf, 25, "CSV row has %d fields", nf);
    bench_coll bc = (bench_coll)bench_parse_coll(f[0]);
    cr_assert_str_eq(f[1], "3");
    cr_assert_str_eq(f[2], "shm");
    double size = strtod(f[7], NULL), t = strtod(f[9], NULL), alg = strtod(f[10], NULL),
           bus = strtod(f[11], NULL);
    cr_assert(t > 0);
    cr_assert(fabs(alg - size / 1e3 / t) <= 1e-6 * alg, "%s: algbw %g != %g / %g us", f[0], alg,
              size, t);
    cr_assert(fabs(bus - alg * bench_bus_factor(bc, 3)) <= 1e-6 * alg, "%s: busbw %g", f[0], bus);
    cr_assert_str_eq(f[12], "0");
    if (bc == BENCH_SENDRECV)
      cr_assert_str_eq(f[13], "");
    else
      cr_assert_str_eq(f[16], "0");
  }
  free(c);

  /* JSON: an array of 18 records carrying the run's context */
  char *j = t_slurp(json);
  cr_assert(j[0] == '[' && strstr(j, "\n]\n"), "%s", j);
  size_t records = 0;
  for (const char *p = j; (p = strstr(p, "{\"collective\": ")); p++) records++;
  cr_assert_eq(records, 2 * NCOLLS, "%zu records\n%s", records, j);
  cr_assert(strstr(j, "\"nranks\": 3"));
  cr_assert(strstr(j, "\"transport\": \"shm\""));
  cr_assert(strstr(j, "\"algorithm\": \"auto\""));
  cr_assert(strstr(j, "\"version\": \"" COLL_VERSION_STRING "\""));
  cr_assert(strstr(j, "\"command\": \""));
  cr_assert(strstr(j, "--json"));
  cr_assert(strstr(j, "\"in_place\": null")); /* sendrecv */
  free(j);
  unlink(csv);
  unlink(json);
}

Test(bench_run, csv_to_stdout_moves_the_table, .timeout = 120) {
  const char *args[] = {"broadcast", "--ranks", "2", "-b",    "1K", "-e",
                        "2K",        "-f",      "2", "--csv", NULL};
  run_result r = run_bench(args, NULL, 120);
  cr_assert_eq(r.status, 0, "status %d\n%s\n%s", r.status, r.out, r.err);
  cr_assert(strncmp(r.out, "collective,", 11) == 0, "%s", r.out);
  cr_assert_eq(count_lines(r.out), 3);
  cr_assert(strstr(r.err, "# Out of bounds values : 0 OK"));
  free_run(&r);
}

static bool have_gnuplot(void) { return system("command -v gnuplot >/dev/null 2>&1") == 0; }

Test(bench_run, plot, .timeout = 120) {
  const char *args[] = {"all",
                        "--ranks",
                        "2",
                        "-b",
                        "1K",
                        "-e",
                        "64K",
                        "-f",
                        "8",
                        "-n",
                        "2",
                        "--plot",
                        "/tmp/test_bench_plot.svg",
                        NULL};
  if (have_gnuplot()) {
    unlink("/tmp/test_bench_plot.svg");
    run_result r = run_bench(args, NULL, 120);
    cr_assert_eq(r.status, 0, "status %d\n%s\n%s", r.status, r.out, r.err);
    char *svg = t_slurp("/tmp/test_bench_plot.svg");
    cr_assert(strstr(svg, "<svg"), "not an SVG");
    cr_assert(strstr(svg, "all_reduce") && strstr(svg, "sendrecv"), "a collective is missing");
    free(svg);
    unlink("/tmp/test_bench_plot.svg");
    free_run(&r);
  }
  /* without gnuplot: a clear message and a failure, before anything runs */
  const char *env[] = {"PATH=/nonexistent", NULL};
  run_result r = run_bench(args, env, 60);
  cr_assert_neq(r.status, 0);
  cr_assert(strstr(r.err, "gnuplot"), "%s", r.err);
  cr_assert_eq(r.out[0], '\0', "%s", r.out);
  free_run(&r);
}

Test(bench_run, bad_flags_one_line_and_status_2, .timeout = 120) {
  static const char *const cases[][8] = {
      {NULL},
      {"nope", NULL},
      {"-b", "8", NULL},
      {"all_reduce", "-x", NULL},
      {"all_reduce", "--bogus", NULL},
      {"all_reduce", "-b", NULL},
      {"all_reduce", "-b", "1Q", NULL},
      {"all_reduce", "-e", "-5", NULL},
      {"all_reduce", "-b", "1M", "-e", "1K", NULL},
      {"all_reduce", "-o", "xor", NULL},
      {"all_reduce", "-d", "float7", NULL},
      {"all_reduce", "-c", "2", NULL},
      {"all_reduce", "-H", "2", NULL},
      {"all_reduce", "-z", "yes", NULL},
      {"all_reduce", "-n", "0", NULL},
      {"all_reduce", "-f", "0", NULL},
      {"all_reduce", "-i", "0", "-b", "1", "-e", "2", NULL},
      {"all_reduce", "--ranks", "0", NULL},
      {"broadcast", "--ranks", "2", "-r", "2", NULL},
      {"all_reduce", "--plot", "out.pdf", NULL},
      {"all_reduce", "--ranks", "2", "stray", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    run_result r = run_bench(cases[i], NULL, 30);
    char desc[256] = "";
    for (int k = 0; cases[i][k]; k++) {
      strcat(desc, " ");
      strcat(desc, cases[i][k]);
    }
    cr_assert_eq(r.status, 2, "coll-bench%s: status %d\n%s", desc, r.status, r.err);
    cr_assert_eq(count_lines(r.err), 1, "coll-bench%s: not one line:\n%s", desc, r.err);
    cr_assert(strncmp(r.err, "coll-bench: ", 12) == 0, "coll-bench%s: %s", desc, r.err);
    cr_assert_eq(r.out[0], '\0', "coll-bench%s printed on stdout: %s", desc, r.out);
    free_run(&r);
  }
  const char *help[] = {"--help", NULL};
  run_result r = run_bench(help, NULL, 30);
  cr_assert_eq(r.status, 0);
  cr_assert(strstr(r.out, "usage: coll-bench"));
  free_run(&r);
}

/* ---- --explain and COLL_TRACE ------------------------------------------------------- */

/* Ring chunk i of `count` elements over n ranks, computed here from the definition
 * (the first count % n chunks are one element longer), not taken from the library. */
static size_t chunk_len(size_t count, int n, int i) {
  return count / (size_t)n + ((size_t)i < count % (size_t)n ? 1 : 0);
}

/* --explain on 2 emulated hosts x 2 ranks (COLL_LAUNCH_RANKS_PER_HOST): the tuner picks
 * hier, and the bytes per link class are the formulas' (algo/hier.c): S = 4000 B, the flat
 * ring sends 3S across hosts in all (1.5S from each of the 2 ranks at a host boundary),
 * hier 2S (0.5S from every rank) and S inside per rank. */
Test(bench_explain, hosts_bytes_per_link_class, .timeout = 120) {
  const char *args[] = {"all_reduce", "--ranks", "4",  "--explain", "-b", "4000",  "-e", "4000",
                        "-n",         "2",       "-w", "1",         "-d", "float", NULL};
  const char *env[] = {"COLL_LAUNCH_RANKS_PER_HOST=2", "COLL_TUNE=0", NULL};
  run_result r = run_bench(args, env, 100);
  if (r.status != 0) free_run(&r);
  cr_assert_eq(r.status, 0, "--explain on 2 x 2 hosts: status %d", r.status);
  const char *want[] = {"Bytes each rank sent per link class (2 hosts", "Why hier:",
                        "Across hosts in all: this call (hier) 8000 B, the flat ring 12000 B, "
                        "hier 8000 B.",
                        "2(n-1)/n*S = 4000 B inside and 2(H-1)/H*S/n = 2000 B across per rank",
                        "across hosts alpha"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    cr_expect(strstr(r.out, want[i]), "no \"%s\" in:\n%s", want[i], r.out);
  int rows = 0;
  char *text = strdup(r.out), *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    int rk, h;
    unsigned long long v[6];
    if (sscanf(line, "#    rank %d @ %d %llu %llu %llu %llu %llu %llu", &rk, &h, &v[0], &v[1],
               &v[2], &v[3], &v[4], &v[5]) != 8)
      continue;
    rows++;
    cr_expect_eq(h, rk / 2, "rank %d on host %d", rk, h);
    cr_expect(v[0] == 4000 && v[1] == 2000, "rank %d: this call %llu inside, %llu across", rk, v[0],
              v[1]);
    cr_expect_eq(v[2] + v[3], 6000, "rank %d: the ring sends 2(N-1)/N*S", rk);
    cr_expect_eq(v[3], rk % 2 ? 6000ull : 0ull, "rank %d: ring across %llu", rk, v[3]);
    cr_expect(v[4] == 4000 && v[5] == 2000, "rank %d: hier %llu inside, %llu across", rk, v[4],
              v[5]);
  }
  free(text);
  cr_expect_eq(rows, 4, "per-rank link rows:\n%s", r.out);
  free_run(&r);
}

/* --explain for all-reduce: per-rank sent bytes are (S-|c_r|)+(S-|c_r+1|), which is
 * 2(N-1)/N*S when N divides S; received = what the previous rank sent; the total is
 * 2(N-1)*S; and there are 2N-1 schedule steps (the middle one receives and sends). */
Test(bench_explain, all_reduce_byte_totals, .timeout = 300) {
  static const size_t counts[] = {1001, 1000, 65536};
  for (int n = 2; n <= 5; n++) {
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
      size_t count = counts[ci], S = count * 4;
      char ranks[16], size[32];
      snprintf(ranks, sizeof ranks, "%d", n);
      snprintf(size, sizeof size, "%zu", S);
      /* The ring's accounting: force it (small sizes would go one-shot). */
      const char *args[] = {"all_reduce", "--ranks", ranks, "--explain", "-b", size,   "-e", size,
                            "-n",         "2",       "-w",  "1",         "-A", "ring", NULL};
      run_result r = run_bench(args, NULL, 120);
      if (r.status != 0) free_run(&r);
      cr_assert_eq(r.status, 0, "--explain N=%d S=%zu: status %d", n, S, r.status);
      unsigned long long sent[8] = {0}, recv[8] = {0}, tot_sent = 0;
      int seen = 0, steps = 0;
      char *text = strdup(r.out), *save = NULL;
      for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        int rk;
        unsigned long long a, b;
        if (sscanf(line, "#    rank %d %llu %llu", &rk, &a, &b) == 3 && rk >= 0 && rk < n) {
          sent[rk] = a, recv[rk] = b;
          seen++;
        }
        if (sscanf(line, "#    total %llu", &a) == 1) tot_sent = a;
        if (strncmp(line, "#  step ", 8) == 0) steps++;
      }
      free(text);
      if (seen != n || steps != 2 * n - 1) free_run(&r);
      cr_assert_eq(seen, n, "N=%d S=%zu: %d per-rank lines", n, S, seen);
      cr_assert_eq(steps, 2 * n - 1, "N=%d S=%zu: %d steps", n, S, steps);
      for (int rk = 0; rk < n; rk++) {
        unsigned long long want = 2ull * S - 4ull * (chunk_len(count, n, rk) +
                                                     chunk_len(count, n, (rk + 1) % n));
        cr_expect_eq(sent[rk], want, "N=%d S=%zu rank %d sent %llu, want %llu", n, S, rk, sent[rk],
                     want);
        cr_expect_eq(recv[rk], sent[(rk + n - 1) % n], "N=%d rank %d received %llu", n, rk,
                     recv[rk]);
        if (count % (size_t)n == 0)
          cr_expect_eq(sent[rk] * (unsigned long long)n, 2ull * (unsigned long long)(n - 1) * S);
      }
      cr_expect_eq(tot_sent, 2ull * (unsigned long long)(n - 1) * S);
      cr_expect(strstr(r.out, "# Model (alpha ") && strstr(r.out, "# Measured: "),
                "no model / measurement lines:\n%s", r.out);
      free_run(&r);
    }
  }
}

Test(bench_explain, every_collective, .timeout = 300) {
  for (int i = 0; i < NCOLLS; i++) {
    const char *args[] = {all_colls[i], "--ranks", "3",  "--explain", "-b", "3K", "-e", "3K",
                          "-n",         "2",       "-w", "1",         "-r", "1",  NULL};
    run_result r = run_bench(args, NULL, 120);
    if (r.status != 0) free_run(&r);
    cr_assert_eq(r.status, 0, "--explain %s: status %d", all_colls[i], r.status);
    cr_expect(strstr(r.out, "# Explain: ") && strstr(r.out, "#    total "),
              "%s: no explanation:\n%s", all_colls[i], r.out);
    free_run(&r);
  }
}

/* COLL_TRACE=FILE.json: one valid Chrome-trace file for all ranks; python3's json module
 * parses it and checks every event's fields and that each rank has calls and steps. */
Test(bench_explain, json_trace_is_valid_chrome_trace, .timeout = 300) {
  char path[] = "/tmp/test_trace_XXXXXX.json";
  int fd = mkstemps(path, 5);
  cr_assert(fd >= 0);
  close(fd);
  char env_trace[600];
  snprintf(env_trace, sizeof env_trace, "COLL_TRACE=%s", path);
  const char *env[] = {env_trace, NULL};
  const char *args[] = {"all_reduce", "--ranks", "3",  "-b", "1K", "-e", "1M",
                        "-f",         "32",      "-n", "2",  "-w", "1",  NULL};
  run_result r = run_bench(args, env, 120);
  int status = r.status;
  free_run(&r);
  cr_assert_eq(status, 0);
  char cmd[2048];
  snprintf(
      cmd, sizeof cmd,
      "python3 -c '\n"
      "import json, sys\n"
      "d = json.load(open(\"%s\"))\n"
      "ev = d[\"traceEvents\"]\n"
      "x = [e for e in ev if e[\"ph\"] == \"X\"]\n"
      "assert all(isinstance(e[\"ts\"], (int, float)) and e[\"dur\"] >= 0 and \"name\" in e "
      "and \"tid\" in e for e in x)\n"
      "for r in range(3):\n"
      "  calls = [e for e in x if e[\"pid\"] == r and e[\"cat\"] == \"call\"]\n"
      "  steps = [e for e in x if e[\"pid\"] == r and e[\"cat\"] == \"step\"]\n"
      "  assert len(calls) > 0 and len(steps) > 0, r\n"
      "  assert all(\"bytes_out\" in e[\"args\"] and \"peer_in\" in e[\"args\"] for e in steps)\n"
      "assert any(e[\"ph\"] == \"M\" and e[\"name\"] == \"process_name\" for e in ev)\n"
      "'",
      path);
  int rc = system(cmd);
  unlink(path);
  cr_assert_eq(rc, 0, "the trace is not valid Chrome-trace JSON (python3 said so above)");
}

Test(bench_explain, text_trace_logs_steps, .timeout = 120) {
  const char *env[] = {"COLL_TRACE=text", NULL};
  const char *args[] = {"broadcast", "--ranks", "2", "-b", "64", "-e",
                        "64",        "-n",      "1", "-w", "0",  NULL};
  run_result r = run_bench(args, env, 60);
  bool ok = r.status == 0 && strstr(r.err, "trace broadcast #") && strstr(r.err, " step 0: ");
  if (!ok) fprintf(stderr, "status %d, stderr:\n%s\n", r.status, r.err);
  free_run(&r);
  cr_assert(ok, "COLL_TRACE=text logged no steps");
}

/* --explain says where its model came from: COLL_TUNE=0's fixed figures are not called a
 * measurement (test_tune checks every source through coll_comm_tune_source). */
Test(bench_explain, says_where_the_model_came_from, .timeout = 60) {
  const char *args[] = {"all_reduce", "--ranks", "2", "--explain", "-b", "8", "-e",
                        "8",          "-n",      "1", "-w",        "0",  NULL};
  const char *env[] = {"COLL_TUNE=0", NULL};
  run_result r = run_bench(args, env, 60);
  cr_assert_eq(r.status, 0, "status %d\n%s\n%s", r.status, r.out, r.err);
  cr_assert(strstr(r.out, "# libcoll's own model, the fixed defaults of COLL_TUNE=0"), "%s", r.out);
  free_run(&r);
}

/* --explain with the tuner: the measured parameters, the choice per size with its
 * crossovers, and for every size why the chosen algorithm won; the table's algo column
 * agrees with the explanation. */
Test(bench_explain, shows_the_choice_and_why, .timeout = 120) {
  const char *args[] = {"all_reduce", "--ranks", "3",  "--explain", "-b", "8", "-e", "4M",
                        "-f",         "512",     "-n", "2",         "-w", "1", NULL};
  /* measured here, not read from the suite's cache (COLL_TUNE_BUSY=100 in the suite: never
   * thrown away as busy) */
  const char *env[] = {"COLL_TUNE_FILE=none", NULL};
  run_result r = run_bench(args, env, 120);
  cr_assert_eq(r.status, 0, "status %d\n%s\n%s", r.status, r.out, r.err);
  cr_assert(strstr(r.out, "# libcoll's own model, measured at communicator creation"), "%s", r.out);
  cr_assert(strstr(r.out, "#   alpha ") && strstr(r.out, " one-shot call "), "%s", r.out);
  cr_assert(strstr(r.out, "# Algorithm chosen per size (COLL_ALGO=auto):"), "%s", r.out);
  static const char *colls[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                "reduce"};
  for (int c = 0; c < 5; c++) {
    char want[64];
    snprintf(want, sizeof want, "#   %-15s", colls[c]);
    cr_assert(strstr(r.out, want), "no choice line for %s:\n%s", colls[c], r.out);
  }
  int whys = 0;
  for (const char *p = r.out; (p = strstr(p, "# Why ")); p++) {
    whys++;
    cr_assert(strncmp(strstr(p, ": ") ? strstr(p, "the tuner's predictions at") : "", "the tuner",
                      9) == 0,
              "why line without predictions: %.120s", p);
  }
  cr_assert_eq(whys, 3, "one 'Why' per size (8 B, 4 KiB, 2 MiB), got %d:\n%s", whys, r.out);
  /* The 8 B call runs what the explanation says ran. */
  const char *ex = strstr(r.out, "# Explain: all_reduce, 3 ranks, size 8 B");
  cr_assert(ex, "%s", r.out);
  const char *algo = strstr(ex, "algorithm ");
  const char *why = strstr(ex, "# Why ");
  cr_assert(algo && why);
  char a1[16] = "", a2[16] = "";
  sscanf(algo, "algorithm %15[a-z]", a1);
  sscanf(why, "# Why %15[a-z]", a2);
  cr_assert_str_eq(a1, a2, "traced call ran %s, the tuner says %s", a1, a2);
  free_run(&r);
}
