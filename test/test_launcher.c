/* test_launcher.c — joining jobs that other launchers started.
 *
 * Runs test/env_rank (built beside this test) under Debian's Open MPI `mpirun -np 4`
 * with only the rendezvous address added, and under hand-made torchrun-, Slurm- and
 * PMI-style environments.  Each child must print "ok".  Skips, saying why, when mpirun
 * is not installed.  Also: the tests' leak check (helpers.c) counts only its own job's
 * segments, and still sees one leaked on purpose.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "internal.h" /* comm->secret names the job's segments */

static const char *prog(void) {
  static char path[1024];
  const char *b = getenv("COLL_TEST_BUILD_DIR");
  snprintf(path, sizeof path, "%s/test/env_rank", b ? b : ".");
  return path;
}

/* A port nobody listens on right now (the kernel picks it). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof a;
  bind(fd, (struct sockaddr *)&a, sizeof a);
  getsockname(fd, (struct sockaddr *)&a, &l);
  close(fd);
  return ntohs(a.sin_port);
}

/* Runs a shell command with a time limit; returns its output's count of "ok" lines. */
static int run_count_ok(const char *cmd, int *status) {
  char full[4096];
  snprintf(full, sizeof full, "timeout -s KILL 60 %s 2>&1", cmd);
  FILE *p = popen(full, "r");
  cr_assert(p);
  char line[512];
  int ok = 0;
  while (fgets(line, sizeof line, p)) {
    fprintf(stderr, "  | %s", line);
    if (strstr(line, ": ok")) ok++;
  }
  *status = pclose(p);
  return ok;
}

Test(launcher, mpirun_np4, .timeout = 120) {
  /* Debian's Open MPI, even where MPICH owns the `mpirun` alternative. */
  const char *mpirun = system("command -v mpirun.openmpi >/dev/null 2>&1") == 0 ? "mpirun.openmpi"
                       : system("command -v mpirun >/dev/null 2>&1") == 0      ? "mpirun"
                                                                                : NULL;
  if (!mpirun) cr_skip_test("mpirun not found: install Debian's openmpi-bin to run this test");
  /* A secret of this run's own, so that the leak check below can name the job's
   * segments (another libcoll job on the machine makes and removes its own). */
  char secret[64], prefix[40];
  snprintf(secret, sizeof secret, "test-launcher-%d", (int)getpid());
  setenv("COLL_SECRET", secret, 1);
  t_env_job_prefix(prefix, sizeof prefix, "", 4);
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "%s --allow-run-as-root --oversubscribe -np 4 -x COLL_ADDR=127.0.0.1:%d "
           "-x COLL_SECRET %s", mpirun, free_port(), prog());
  int st;
  int ok = run_count_ok(cmd, &st);
  cr_assert_eq(ok, 4, "expected 4 ranks to say ok (exit %d)", st);
  unsetenv("COLL_SECRET");
  cr_assert_eq(st, 0);
  char left[512];
  int k = t_prefix_segments(prefix, 1, left, sizeof left);
  cr_assert_eq(k, 0, "segments of the job left in /dev/shm: %s", left);
}

static void env_job(const char *rank_var, const char *size_var, int n, bool master_vars) {
  int port = free_port();
  pid_t pids[8];
  int pfd[2];
  cr_assert_eq(pipe(pfd), 0);
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      char v[32];
      snprintf(v, sizeof v, "%d", r);
      setenv(rank_var, v, 1);
      snprintf(v, sizeof v, "%d", n);
      setenv(size_var, v, 1);
      if (master_vars) {
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        snprintf(v, sizeof v, "%d", port);
        setenv("MASTER_PORT", v, 1);
      } else {
        snprintf(v, sizeof v, "localhost:%d", port);
        setenv("COLL_ADDR", v, 1);
      }
      dup2(pfd[1], 1);
      alarm(60);
      execl(prog(), prog(), (char *)NULL);
      _exit(127);
    }
  }
  close(pfd[1]);
  FILE *f = fdopen(pfd[0], "r");
  char line[256];
  int ok = 0;
  while (fgets(line, sizeof line, f)) ok += strstr(line, ": ok") != NULL;
  fclose(f);
  int bad = 0;
  for (int r = 0; r < n; r++) {
    int st;
    waitpid(pids[r], &st, 0);
    bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  cr_assert_eq(ok, n, "%s/%s: %d of %d ranks ok", rank_var, size_var, ok, n);
  cr_assert_eq(bad, 0);
  /* The job's segments (its secret is derived from the rendezvous and the size, as the
   * ranks derived it: init_env.c) must all be gone. */
  char addr[64], prefix[40], left[512];
  snprintf(addr, sizeof addr, "%s:%d", master_vars ? "127.0.0.1" : "localhost", port);
  t_env_job_prefix(prefix, sizeof prefix, addr, n);
  int k = t_prefix_segments(prefix, 1, left, sizeof left);
  cr_assert_eq(k, 0, "segments of the job left in /dev/shm: %s", left);
}

Test(launcher, torchrun_style_env, .timeout = 90) { env_job("RANK", "WORLD_SIZE", 3, true); }
Test(launcher, slurm_style_env, .timeout = 90) { env_job("SLURM_PROCID", "SLURM_NTASKS", 2, false); }
Test(launcher, pmi_style_env, .timeout = 90) { env_job("PMI_RANK", "PMI_SIZE", 4, false); }

/* ---- the leak check counts the job's own segments, and sees a leak ------------------ */

/* Rank 0 leaves a segment named like one of its job's (coll-<job>-leak0) behind. */
static int leak_one(coll_comm_t comm, int rank, int n, void *arg) {
  (void)n; (void)arg;
  if (rank != 0) return 0;
  char prefix[40], name[64];
  coll_job_prefix(prefix, sizeof prefix, comm->secret);
  snprintf(name, sizeof name, "/%sleak0", prefix);
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return t_failf("rank 0: shm_open(%s) failed", name);
  close(fd);
  return 0;
}

static int clean_job(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  int x = rank + 1, y = 0;
  if (coll_all_reduce(&x, &y, 1, COLL_INT32, COLL_SUM, comm, NULL) != COLL_OK ||
      y != n * (n + 1) / 2)
    return t_failf("rank %d: all-reduce gave %d", rank, y);
  return 0;
}

/* A segment of another libcoll job (a name no secret of ours can have: its job part is
 * not hex) exists throughout: it must not count against our jobs. */
static const char *foreign = "/coll-zzzzzzzzzzzzzzzz-yyyyyyyyyyyyyyyy-0";

Test(launcher, leak_check_counts_only_its_job, .timeout = 60) {
  shm_unlink(foreign);
  int fd = shm_open(foreign, O_CREAT | O_EXCL | O_RDWR, 0600);
  cr_assert_geq(fd, 0, "cannot make the foreign segment");
  close(fd);
  char why[256] = "", left[512];
  int rc = t_launch(2, clean_job, NULL, 30000, why, sizeof why);
  int k = t_job_leftovers(left, sizeof left);
  int foreign_there = t_prefix_segments("coll-zzzzzzzzzzzzzzzz-", 1, NULL, 0);
  cr_assert_eq(rc, 0, "%s", why);
  cr_assert_eq(k, 0, "a clean job was charged with %d segment(s): %s", k, left);
  cr_assert_eq(foreign_there, 1, "the check removed or missed another job's segment");
}

Test(launcher, leak_check_sees_a_leaked_segment, .timeout = 60) {
  char why[256] = "", left[512];
  int rc = t_launch(2, leak_one, NULL, 30000, why, sizeof why);
  cr_assert_eq(rc, 0, "%s", why);
  int k = t_job_leftovers(left, sizeof left);
  cr_assert_eq(k, 1, "the leaked segment was not seen (%d: %s)", k, left);
  cr_assert(strstr(left, "leak0"), "the leak is not named: %s", left);
  /* Seen, and cleaned up: asking again finds nothing new in /dev/shm. */
  coll_unique_id id = coll_launch_unique_id();
  coll_id_fields f;
  char prefix[40];
  cr_assert_eq(coll_id_decode(&id, &f, why, sizeof why), COLL_OK);
  coll_job_prefix(prefix, sizeof prefix, f.secret);
  cr_assert_eq(t_prefix_segments(prefix, 1, NULL, 0), 0, "the leaked segment is still there");
}
