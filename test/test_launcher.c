/* test_launcher.c — joining jobs that other launchers started.
 *
 * Runs test/env_rank (built beside this test) under Debian's Open MPI `mpirun -np 4`
 * with only the rendezvous address added, and under hand-made torchrun-, Slurm- and
 * PMI-style environments.  Each child must print "ok".  Skips, saying why, when mpirun
 * is not installed.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

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
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "%s --allow-run-as-root --oversubscribe -np 4 -x COLL_ADDR=127.0.0.1:%d %s", mpirun,
           free_port(), prog());
  int st;
  int ok = run_count_ok(cmd, &st);
  cr_assert_eq(ok, 4, "expected 4 ranks to say ok (exit %d)", st);
  cr_assert_eq(st, 0);
  cr_assert_eq(t_shm_segments(), 0);
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
}

Test(launcher, torchrun_style_env, .timeout = 90) { env_job("RANK", "WORLD_SIZE", 3, true); }
Test(launcher, slurm_style_env, .timeout = 90) { env_job("SLURM_PROCID", "SLURM_NTASKS", 2, false); }
Test(launcher, pmi_style_env, .timeout = 90) { env_job("PMI_RANK", "PMI_SIZE", 4, false); }
