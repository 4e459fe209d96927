/* test_backoff.c — coll_yield stops yielding when the core is held by a process outside the job.
 *
 * The test binds itself and a child that spins without end (bounded by alarm(), killed
 * and reaped at the end) to one CPU, then yields.  Each yield hands the core to the
 * spinner for a scheduler slice, so two in a row are long, and coll_yield must then answer
 * false — the caller sleeps on its futex instead — within a few slices, and keep answering
 * false without yielding (each such call returns at once).  Its converse (a quiet core
 * keeps yielding) is not asserted here: on a loaded machine a yield may well be long.
 */
#include <criterion/criterion.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base.h"

static bool bind_to_first_cpu(void) {
  cpu_set_t allowed, one;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return false;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &allowed)) {
      CPU_ZERO(&one);
      CPU_SET(c, &one);
      return sched_setaffinity(0, sizeof one, &one) == 0;
    }
  return false;
}

Test(backoff, a_busy_core_turns_yields_off, .timeout = 60) {
  cr_assert(bind_to_first_cpu(), "could not bind to a CPU");
  pid_t spinner = fork(); /* inherits the binding */
  cr_assert(spinner >= 0, "fork failed");
  if (spinner == 0) {
    alarm(30); /* never outlives a lost parent by long */
    for (volatile unsigned long i = 0;; i++) {}
  }
  int yields = 0;
  bool off = false;
  while (yields < 200 && !off) {
    off = !coll_yield(false);
    if (!off) yields++;
  }
  uint64_t t0 = coll_now_ns();
  bool still_off = true;
  for (int i = 0; i < 1000; i++) still_off = still_off && !coll_yield(false);
  uint64_t dt = coll_now_ns() - t0;
  kill(spinner, SIGKILL);
  int status;
  waitpid(spinner, &status, 0);
  cr_assert(off, "200 yields to a busy loop on the same core and coll_yield kept yielding");
  cr_expect(yields <= 20, "coll_yield turned off only after %d yields (two long ones suffice)",
            yields);
  cr_assert(still_off, "coll_yield yielded again within its off time");
  cr_assert(dt < 50000000ull, "1000 calls while off took %llu ns: they must not yield",
            (unsigned long long)dt);
}
