/* test/shim/criterion/criterion.h — the few Criterion calls the CUDA tests use, for a
 * machine where Criterion cannot start its workers (scripts/gpu_check.sh: on the GPU
 * machine, boxfort's worker came up as a second runner — "Re-entering criterion from a
 * test worker" — and the device tests never ran).  Built only with -Dcriterion_shim=true,
 * for test_cuda and libtrain's test_train_cuda; CI and every other test use Criterion.
 *
 * Each case runs in a fresh process (the runner forks and re-executes itself, as Criterion
 * does), bounded by its .timeout (SIGALRM); a failed cr_assert ends the case, a
 * failed cr_expect marks it failed and goes on, cr_skip_test ends it as skipped.  The
 * runner prints Criterion's "[PASS]/[FAIL]/[SKIP] suite::case" lines and its closing
 * "Synthesis:" line, so scripts/summary.py counts these programs as it counts Criterion's,
 * and exits 1 when a case failed.  Arguments: case names (suite::case) to run only those.
 * It must never run a case in the runner's own process (that may have touched CUDA).
 */
#ifndef COLL_TEST_SHIM_CRITERION_H
#define COLL_TEST_SHIM_CRITERION_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct shim_opts {
  double timeout;  // seconds; 0 = none
  int unused_;
};
struct shim_case {
  const char *suite, *name;
  void (*fn)(void);
  struct shim_opts opts;
};

// The registry and the runner live in test/shim/criterion_shim_main.c.
enum { SHIM_MAX_CASES = 256, SHIM_SKIP_STATUS = 77 };
extern struct shim_case shim_cases[SHIM_MAX_CASES];
extern int shim_ncases;
extern int shim_expect_failed;
extern char shim_current[256];
void shim_register(const char *suite, const char *name, void (*fn)(void), struct shim_opts o);

// Criterion's entry points, for a test program with its own main (test_train_cuda).
struct criterion_test_set;
struct criterion_test_set *criterion_initialize(void);
int criterion_handle_args(int argc, char *argv[], bool handle_unknown_arg);
int criterion_run_all_tests(struct criterion_test_set *tests);
void criterion_finalize(struct criterion_test_set *tests);

#define Test(suite, name, ...)                                               \
  static void shim_##suite##_##name(void);                                   \
  __attribute__((constructor)) static void shim_reg_##suite##_##name(void) { \
    shim_register(#suite, #name, shim_##suite##_##name,                      \
                  (struct shim_opts){.unused_ = 0, __VA_ARGS__});            \
  }                                                                          \
  static void shim_##suite##_##name(void)

static inline void shim_report(const char *file, int line, const char *expr, const char *fmt, ...) {
  fprintf(stderr, "%s:%d: Assertion failed: %s", file, line, expr);
  if (fmt && *fmt) {
    va_list ap;
    va_start(ap, fmt);
    fputs(": ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
  }
  fputc('\n', stderr);
  fflush(stderr);
}

// "" __VA_ARGS__ makes an absent message an empty format (messages are literals).
#define cr_assert(cond, ...)                                  \
  do {                                                        \
    if (!(cond)) {                                            \
      shim_report(__FILE__, __LINE__, #cond, "" __VA_ARGS__); \
      _exit(1);                                               \
    }                                                         \
  } while (0)
#define cr_expect(cond, ...)                                  \
  do {                                                        \
    if (!(cond)) {                                            \
      shim_report(__FILE__, __LINE__, #cond, "" __VA_ARGS__); \
      shim_expect_failed = 1;                                 \
    }                                                         \
  } while (0)
#define cr_assert_not(cond, ...) cr_assert(!(cond), __VA_ARGS__)
#define cr_assert_eq(a, b, ...) cr_assert((a) == (b), __VA_ARGS__)
#define cr_assert_neq(a, b, ...) cr_assert((a) != (b), __VA_ARGS__)
#define cr_assert_null(p, ...) cr_assert((p) == NULL, __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...) cr_assert(strcmp((a), (b)) == 0, __VA_ARGS__)
#define cr_assert_fail(...) cr_assert(0, __VA_ARGS__)
#define cr_log_info(...)                    \
  do {                                      \
    fprintf(stderr, "[----] " __VA_ARGS__); \
    fputc('\n', stderr);                    \
  } while (0)
#define cr_skip_test(...)                         \
  do {                                            \
    fprintf(stderr, "[SKIP] %s: ", shim_current); \
    fprintf(stderr, "" __VA_ARGS__);              \
    fputc('\n', stderr);                          \
    fflush(stderr);                               \
    _exit(SHIM_SKIP_STATUS);                      \
  } while (0)

#endif
