/* run_prog.c — running a program from a test (run_prog.h).
 *
 * Output goes to temporary files, not pipes: a program that prints more than a pipe
 * holds while we only wait for it would never finish.  Must never leave a process of
 * the program's group running, or a temporary file behind.
 */
#include "run_prog.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

char *t_slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return strdup("");
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc(n > 0 ? (size_t)n + 1 : 1);
  size_t got = n > 0 ? fread(s, 1, (size_t)n, f) : 0;
  s[got] = '\0';
  fclose(f);
  return s;
}

t_run_result t_run(const char *const *argv, const char *const *env, int timeout_s) {
  t_run_result r = {-2, NULL, NULL};
  char outp[] = "/tmp/coll-test-out-XXXXXX", errp[] = "/tmp/coll-test-err-XXXXXX";
  int ofd = mkstemp(outp), efd = ofd >= 0 ? mkstemp(errp) : -1;
  if (ofd < 0 || efd < 0) {
    if (ofd >= 0) close(ofd), unlink(outp);
    r.out = strdup("");
    r.err = strdup("t_run: cannot create temporary files");
    return r;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(ofd, 1);
    dup2(efd, 2);
    for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
    execv(argv[0], (char *const *)argv);
    _exit(126);
  }
  if (pid > 0) {
    setpgid(pid, pid);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int st = 0;
    r.status = 0;
    for (;;) {
      if (waitpid(pid, &st, WNOHANG) == pid) break;
      clock_gettime(CLOCK_MONOTONIC, &now);
      if (now.tv_sec - t0.tv_sec > timeout_s) {
        kill(-pid, SIGKILL);
        waitpid(pid, &st, 0);
        r.status = -1;
        break;
      }
      usleep(10000);
    }
    if (r.status != -1) r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    kill(-pid, SIGKILL); /* a launcher that died leaves its ranks in the group */
  }
  close(ofd);
  close(efd);
  r.out = t_slurp(outp);
  r.err = pid < 0 ? strdup("t_run: fork failed") : t_slurp(errp);
  unlink(outp);
  unlink(errp);
  return r;
}

void t_run_free(t_run_result *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}
