/* run_prog.h — running a program from a test: its exit status and everything it printed,
 * bounded in time.  Shared by the tests of coll-bench and of the peer benchmarks. */
#ifndef COLL_TEST_RUN_PROG_H
#define COLL_TEST_RUN_PROG_H

typedef struct {
  int status; /* exit status, 128+signal, -1 on timeout, -2 if it could not be started */
  char *out, *err;
} t_run_result;

/* Runs argv (NULL-terminated, argv[0] the path) with extra environment assignments
 * ("NAME=value", NULL-terminated, may be NULL) in a process group of its own, killed
 * after timeout_s; whatever is left of the group (a launcher's ranks) is killed too. */
t_run_result t_run(const char *const *argv, const char *const *env, int timeout_s);
void t_run_free(t_run_result *r);
/* The whole file as a string (malloc'd; "" if it cannot be read). */
char *t_slurp(const char *path);

#endif
