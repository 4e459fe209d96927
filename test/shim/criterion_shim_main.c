/* test/shim/criterion_shim_main.c — the runner of test/shim/criterion/criterion.h (see
 * there): runs each registered case in a fresh process, which it starts by forking and
 * re-executing this program with SHIM_CASE=suite::case, so that no case inherits a CUDA
 * context or a half-run case's state; prints Criterion's case lines and its "Synthesis:"
 * line.
 * It must never run a case in the runner's process.
 */
#include <criterion/criterion.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>

struct shim_case shim_cases[SHIM_MAX_CASES];
int shim_ncases;
int shim_expect_failed;
char shim_current[256];
static char **shim_argv;
static int shim_argc;

void shim_register(const char *suite, const char *name, void (*fn)(void), struct shim_opts o) {
  if (shim_ncases < SHIM_MAX_CASES)
    shim_cases[shim_ncases++] = (struct shim_case){suite, name, fn, o};
}

struct criterion_test_set *criterion_initialize(void) {
  const char *want = getenv("SHIM_CASE");
  if (!want) return (struct criterion_test_set *)shim_cases;  // the runner: an opaque token
  for (int i = 0; i < shim_ncases; i++) {                     // a case's process: run it and exit
    struct shim_case *c = &shim_cases[i];
    snprintf(shim_current, sizeof shim_current, "%s::%s", c->suite, c->name);
    if (strcmp(shim_current, want) != 0) continue;
    if (c->opts.timeout > 0) alarm((unsigned)(c->opts.timeout + 0.999));
    c->fn();
    fflush(stdout);
    _exit(shim_expect_failed ? 1 : 0);
  }
  fprintf(stderr, "shim: no case %s\n", want);
  _exit(2);
}

int criterion_handle_args(int argc, char *argv[], bool handle_unknown_arg) {
  (void)handle_unknown_arg;
  shim_argc = argc, shim_argv = argv;
  return 1;
}

// Case names on the command line select cases; Criterion's options are ignored.
static bool wanted(const char *id) {
  bool any = false;
  for (int i = 1; i < shim_argc; i++) {
    if (shim_argv[i][0] == '-' || strcmp(shim_argv[i - 1], "--jobs") == 0) continue;
    any = true;
    if (strcmp(shim_argv[i], id) == 0) return true;
  }
  return !any;
}

int criterion_run_all_tests(struct criterion_test_set *tests) {
  (void)tests;
  int tested = 0, passing = 0, failing = 0, crashing = 0;
  for (int i = 0; i < shim_ncases; i++) {
    struct shim_case *c = &shim_cases[i];
    char id[256];
    snprintf(id, sizeof id, "%s::%s", c->suite, c->name);
    if (!wanted(id)) continue;
    fprintf(stderr, "[RUN ] %s\n", id);
    fflush(stderr);
    fflush(stdout);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid < 0) {
      perror("shim: fork");
      return 0;
    }
    if (pid == 0) {
      setpgid(0, 0);  // the case and the ranks it forks: one group to kill afterwards
      setenv("SHIM_CASE", id, 1);
      execv("/proc/self/exe", shim_argv);
      perror("shim: execv /proc/self/exe");
      _exit(2);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0) {}
    kill(-pid, SIGKILL);  // whatever the case left running
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (WIFEXITED(st) && WEXITSTATUS(st) == SHIM_SKIP_STATUS) continue;  // [SKIP] printed
    tested++;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
      passing++;
      fprintf(stderr, "[PASS] %s: (%.2fs)\n", id, s);
    } else if (WIFSIGNALED(st)) {
      crashing++;
      fprintf(stderr, "[FAIL] %s: CRASH: signal %d%s (%.2fs)\n", id, WTERMSIG(st),
              WTERMSIG(st) == SIGALRM ? ", timed out" : "", s);
    } else {
      failing++;
      fprintf(stderr, "[FAIL] %s: exit %d (%.2fs)\n", id, WEXITSTATUS(st), s);
    }
  }
  fprintf(stderr, "[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | Crashing: %d\n",
          tested, passing, failing, crashing);
  return failing + crashing == 0;
}

void criterion_finalize(struct criterion_test_set *tests) { (void)tests; }

__attribute__((weak)) int main(int argc, char *argv[]) {
  struct criterion_test_set *t = criterion_initialize();
  int ok = criterion_handle_args(argc, argv, true) ? criterion_run_all_tests(t) : 0;
  criterion_finalize(t);
  return ok ? 0 : 1;
}
