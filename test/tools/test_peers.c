/* test_peers.c — the peer benchmarks of bench/peers run, check their results and print
 * coll-bench's table, so the MPI and Gloo figures of docs/perf.md can be reproduced.
 *
 * The MPI part runs every mpi_coll_bench binary meson built (COLL_PEERS_MPI lists them as
 * flavour:launcher, e.g. "openmpi:/usr/bin/mpirun.openmpi mpich:/usr/bin/mpirun.mpich")
 * on 2 ranks over small sizes of all eight collectives, then one MPI on 3 ranks with every
 * dtype and op and a root that is not 0, and checks: exit status 0, one table per
 * collective in coll-bench's column layout, size and count as nccl-tests define them,
 * busbw = algbw * the collective's factor, #wrong 0 in every measured column; then that
 * an injected wrong element (PEERS_BENCH_FAULT) is counted and fails the exit status,
 * and that a dtype or op MPI lacks is refused with status 2.  It skips only when meson
 * found no MPI (then COLL_PEERS_WHY says why); scripts/setup.sh installs Open MPI and MPICH.
 *
 * The Gloo part runs bench/peers/gloo_bench.py once on 2 ranks with COLL_PEERS_PYTHON (the
 * Python with torch; skipped when it has none) and checks the same, the clean rows and
 * the injected wrong elements in one run.
 *
 * Every run is bounded in time; its whole process group is killed on a timeout.
 */
#include <criterion/criterion.h>
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
  if (strcmp(p->flavour, "openmpi") == 0) {
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
  /* an unknown MPI (flavour "mpi") may be Open MPI: these let it run as root, oversubscribed */
  const char *envs[16] = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                          "OMPI_MCA_rmaps_base_oversubscribe=1", "PEERS_BENCH_FAULT="};
  int ne = 4;
  for (int i = 0; env && env[i] && ne < 15; i++) envs[ne++] = env[i];
  envs[ne] = NULL;
  return run(argv, envs, 120);
}

Test(peers_mpi, every_collective_2_ranks, .timeout = 300) {
  mpi_peer p[4];
  int n = mpi_peers(p, 4);
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
  mpi_peer p[4];
  mpi_peers(p, 4);
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
  mpi_peer p[4];
  int n = mpi_peers(p, 4);
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
  mpi_peer p[4];
  int n = mpi_peers(p, 4);
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
