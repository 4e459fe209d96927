/*
 * env_job.h — a DDP/FSDP/TP job started the way a launcher starts one, for the fault tests
 * (test_ddp.c, test_fsdp_ckpt.c, test_tp.c, test_tp_ckpt.c): N coll-train processes joined
 * through the environment, so the test knows every rank's pid and can kill one; rank 0's
 * output read until a line appears; the survivors checked to exit by themselves, naming
 * themselves, in time; and the whole kill-then-resume check those tests share.
 *
 * Never sleeps to synchronise (poll on the pipes with a deadline), and every path kills
 * and reaps what it started.
 */
#ifndef TRAIN_TEST_ENV_JOB_H
#define TRAIN_TEST_ENV_JOB_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/train_test.h"

static inline int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define MAX_JOB 8

/* N coll-train processes joined through the environment (COLL_RANK, COLL_WORLD_SIZE,
 * COLL_ADDR), so the test knows every rank's pid. Each rank's stdout is a pipe the test
 * reads (only rank 0 prints), its stderr a file. */
typedef struct env_job {
  int n;
  pid_t pid[MAX_JOB];
  int outfd[MAX_JOB];
  char *errpath[MAX_JOB];
} env_job;

/* pipe_bytes > 0 shrinks rank 0's pipe: rank 0 flushes its output every step, so it can
 * then run at most that many bytes of output ahead of what the test has read. */
static inline void env_job_start(env_job *j, int n, const char *dir, const char *cli,
                                 const char *args, int pipe_bytes) {
  cr_assert(n <= MAX_JOB);
  int port = free_port();
  memset(j, 0, sizeof *j);
  j->n = n;
  char *cmd = th_fmt("exec '%s' %s", cli, args);
  for (int r = 0; r < n; r++) {
    int p[2];
    cr_assert_eq(pipe(p), 0);
    if (pipe_bytes > 0)
      cr_assert(fcntl(p[0], F_SETPIPE_SZ, pipe_bytes) >= pipe_bytes, "F_SETPIPE_SZ %d: %s",
                pipe_bytes, strerror(errno));
    j->errpath[r] = th_fmt("%s/rank%d.err", dir, r);
    j->pid[r] = fork();
    cr_assert(j->pid[r] >= 0);
    if (j->pid[r] == 0) {
      char rank[16], size[16], addr[32];
      snprintf(rank, sizeof rank, "%d", r);
      snprintf(size, sizeof size, "%d", n);
      snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
      setenv("COLL_RANK", rank, 1);
      setenv("COLL_WORLD_SIZE", size, 1);
      setenv("COLL_ADDR", addr, 1);
      setenv("COLL_TIMEOUT_MS", "2000", 1);
      dup2(p[1], 1);
      FILE *e = freopen(j->errpath[r], "w", stderr);
      (void)e;
      close(p[0]);
      close(p[1]);
      execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
      _exit(127);
    }
    close(p[1]);
    j->outfd[r] = p[0];
  }
  free(cmd);
}

/* Kills and reaps whatever is still running, closes the pipes. */
static inline void env_job_end(env_job *j) {
  for (int r = 0; r < j->n; r++) {
    if (j->pid[r] > 0) {
      kill(j->pid[r], SIGKILL);
      waitpid(j->pid[r], NULL, 0);
      j->pid[r] = 0;
    }
    if (j->outfd[r] >= 0) close(j->outfd[r]);
    j->outfd[r] = -1;
    free(j->errpath[r]);
    j->errpath[r] = NULL;
  }
}

/* Reads rank 0's output (small reads, no sleeping) until `needle` appears; 0 once it has,
 * -1 on EOF or after `limit_s` (the job is left running: the caller ends it). */
static inline int env_job_try_wait_for(env_job *j, const char *needle, double limit_s) {
  char buf[1024];
  size_t have = 0, nl = strlen(needle);
  double t_end = now_s() + limit_s;
  while (!memmem(buf, have, needle, nl)) {
    struct pollfd pf = {.fd = j->outfd[0], .events = POLLIN};
    int left = (int)((t_end - now_s()) * 1000);
    int pr = left > 0 ? poll(&pf, 1, left) : 0;
    ssize_t k = pr > 0 ? read(j->outfd[0], buf + have, 256) : -1;
    if (k <= 0) return -1;
    have += (size_t)k;
    if (memmem(buf, have, needle, nl)) /* before the trim below can drop it */
      break;
    if (have > sizeof buf - 256) { /* keep a tail long enough to hold the needle */
      memmove(buf, buf + have - nl, nl);
      have = nl;
    }
  }
  return 0;
}

/* env_job_start, then env_job_try_wait_for; fails the test, after killing the job, if rank
 * 0 never prints needle. Another process may take the free port before rank 0 listens on
 * it: then (rank 0 says "cannot listen") the job is started again on a new one, three
 * attempts in all. */
static inline void env_job_start_and_wait_for(env_job *j, int n, const char *dir, const char *cli,
                                              const char *args, int pipe_bytes, const char *needle,
                                              double limit_s) {
  for (int attempt = 0;; attempt++) {
    env_job_start(j, n, dir, cli, args, pipe_bytes);
    if (env_job_try_wait_for(j, needle, limit_s) == 0) return;
    char *e0 = th_read(j->errpath[0], NULL);
    env_job_end(j);
    if (attempt < 2 && e0 && strstr(e0, "cannot listen")) {
      free(e0);
      continue;
    }
    cr_assert_fail("rank 0 never printed \"%s\": %s", needle, e0 ? e0 : "");
  }
}

/* Kills rank `victim`, then checks that every other rank exits by itself within limit_s,
 * with exit status `status` (0: any non-zero) and an error that says which rank it is
 * ("<prefix>rank r of n:"). */
static inline void env_job_kill_and_expect_failures(env_job *j, int victim, double limit_s,
                                                    int status, const char *prefix) {
  char buf[4096];
  kill(j->pid[victim], SIGKILL);
  double t_kill = now_s();
  waitpid(j->pid[victim], NULL, 0);
  j->pid[victim] = 0;
  /* the survivors must exit by themselves: read their output to EOF, then reap */
  for (int r = 0; r < j->n; r++) {
    if (r == victim) continue;
    for (;;) {
      struct pollfd pf = {.fd = j->outfd[r], .events = POLLIN};
      int left = (int)((t_kill + limit_s - now_s()) * 1000);
      if (left <= 0 || poll(&pf, 1, left) <= 0) {
        env_job_end(j);
        cr_assert_fail("rank %d still running %.0f s after rank %d was killed", r, limit_s, victim);
      }
      if (read(j->outfd[r], buf, sizeof buf) <= 0) break;
    }
    int st = 0;
    waitpid(j->pid[r], &st, 0);
    j->pid[r] = 0;
    double took = now_s() - t_kill;
    char *e = th_read(j->errpath[r], NULL);
    char want[96];
    snprintf(want, sizeof want, "%srank %d of %d:", prefix, r, j->n);
    int ok_status = WIFEXITED(st) && (status ? WEXITSTATUS(st) == status : WEXITSTATUS(st) != 0),
        ok_msg = e && strstr(e, want);
    if (!ok_status || !ok_msg) {
      env_job_end(j);
      char ws[32] = "a non-zero status";
      if (status) snprintf(ws, sizeof ws, "status %d", status);
      cr_assert(ok_status,
                "rank %d did not exit with %s after rank %d died (status "
                "%d): %s",
                r, ws, victim, st, e ? e : "");
      cr_assert_fail("rank %d's error does not say who it is: %s", r, e ? e : "");
    }
    cr_log_info("rank %d exited %.2f s after the kill: %s", r, took, e);
    free(e);
  }
}

/* A job of n ranks (coll-train `args`, which train long enough) in a temporary directory;
 * once training is under way (rank 0 printed step 3: it flushes every step), rank victim is
 * killed and env_job_kill_and_expect_failures(limit_s, status, prefix) checks the others. */
static inline void env_job_kill_under_way(int n, const char *args, int victim, double limit_s,
                                          int status, const char *prefix) {
  (void)th_cli(); /* before anything that needs cleaning up */
  char *dir = th_tmpdir();
  env_job j;
  env_job_start_and_wait_for(&j, n, dir, th_cli(), args, 0, "step     3/", 20.0);
  env_job_kill_and_expect_failures(&j, victim, limit_s, status, prefix);
  env_job_end(&j);
  th_rmrf(dir);
  free(dir);
}

/* A run killed after a checkpoint and resumed from it must be bitwise the run that never
 * stopped. In <dir>/full, the uninterrupted run; in <dir>/cut, the same as an env_job,
 * rank `victim` killed once rank 0 printed `needle` (checkpoint kill_at is complete), the
 * others failing within kill_limit_s; its last checkpoint must lie in [kill_at, steps) and
 * equal the uninterrupted run's; in <dir>/again, the run resumed from it must print the
 * same losses and write the same final checkpoint. Rank 0's pipe is shrunk to 4 KiB, so
 * the kill lands mid-run without a sleep (env_job_start). */
typedef struct th_kill_resume {
  const char *wrap;     /* put before coll-train in the direct runs ("timeout 60 ") */
  const char *run_args; /* a direct run's options (--ranks included), no --steps/--ckpt */
  const char *job_args; /* the same for the env_job's ranks (no --ranks) */
  int nranks, victim, steps, every, kill_at;
  int grid_tp, grid_dp; /* the checkpoints' grid: 1 x 1 one process's, T x 1 TP's,
                         * 1 x N FSDP's */
  int strict;           /* th_last_checkpoint's: nothing but checkpoints in <dir>/cut */
  const char *needle;
  double kill_limit_s;
} th_kill_resume;

/* Runs the check above in dir; returns the step it resumed from. */
static inline long th_kill_then_resume(const char *dir, const th_kill_resume *c) {
  char *full = th_fmt("%s/full", dir), *cut = th_fmt("%s/cut", dir),
       *again = th_fmt("%s/again", dir);
  float *lfull = malloc((size_t)c->steps * sizeof(float)),
        *lagain = malloc((size_t)c->steps * sizeof(float));

  /* 1. the uninterrupted run */
  char *cmd = th_fmt("%s%s %s --steps %d --ckpt-dir %s --ckpt-every %d", c->wrap, th_cli(),
                     c->run_args, c->steps, full, c->every);
  cr_assert_eq(th_cli_losses(cmd, full, 1, lfull, c->steps), c->steps, "%s: fewer than %d steps",
               cmd, c->steps);
  free(cmd);

  /* 2. the same run, killed after checkpoint kill_at */
  env_job j;
  char *args = th_fmt("%s --steps %d --ckpt-dir %s --ckpt-every %d", c->job_args, c->steps, cut,
                      c->every);
  env_job_start_and_wait_for(&j, c->nranks, dir, th_cli(), args, 4096, c->needle, 30.0);
  env_job_kill_and_expect_failures(&j, c->victim, c->kill_limit_s, 0, "");
  env_job_end(&j);
  free(args);

  /* 3. its last checkpoint is complete and equal to the uninterrupted run's */
  long k = th_last_checkpoint(cut, c->grid_tp, c->grid_dp, c->strict);
  cr_assert(k >= c->kill_at && k < c->steps,
            "last checkpoint at step %ld: the kill did not "
            "land mid-run",
            k);
  th_assert_same_checkpoint(cut, full, k, c->grid_tp, c->grid_dp);

  /* 4. restarted from it and run to the end */
  char *ck = th_fmt("%s/ckpt_%08ld.bin", cut, k);
  cmd = th_fmt("%s%s %s --steps %d --ckpt-dir %s --ckpt-every %d --resume %s", c->wrap, th_cli(),
               c->run_args, c->steps, again, c->every, ck);
  int n = th_cli_losses(cmd, again, k + 1, lagain, c->steps);
  cr_assert_eq(n, c->steps - k, "the resumed run printed %d steps from step %ld, not %ld", n, k + 1,
               c->steps - k);
  for (int i = 0; i < n; i++)
    cr_assert(lagain[i] == lfull[k + i], "step %ld: resumed loss %.6f, uninterrupted %.6f",
              k + 1 + i, lagain[i], lfull[k + i]);
  th_assert_same_checkpoint(again, full, c->steps, c->grid_tp, c->grid_dp);
  free(cmd), free(ck), free(lfull), free(lagain);
  free(full), free(cut), free(again);
  return k;
}

#endif
