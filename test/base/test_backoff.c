/* test_backoff.c — coll_yield stops yielding when the core is held by a process outside the job.
 *
 * Each test binds itself and a child that spins without end (bounded by alarm(), killed
 * and reaped at the end) to one CPU, then yields.  Each yield hands the core to the
 * spinner for a scheduler slice, so every yield is long.
 *   - ranks with a core each: coll_yield must answer false (the caller sleeps on its
 *     futex instead) within a few slices, and keep answering false without yielding;
 *   - oversubscribed, the spinner not of the job (this rank's mates known, and it is not
 *     one): the same, after the run of foreign yields backoff.c asks for;
 *   - oversubscribed, the spinner one of the job's ranks (its clock among the mates): it
 *     gets every long yield, so coll_yield must keep yielding;
 *   - oversubscribed, mates not known: it must keep yielding, whoever spins.
 * The converse of the first two (a quiet core keeps yielding) is not asserted: on a
 * loaded machine a yield may well be long.
 */
#include <criterion/criterion.h>
#include <time.h>
#include <unistd.h>

#include "base.h"
#include "coll_test.h"

/* A child bound to this process's CPU that spins until killed (or 60 s). */
static pid_t spin_beside(void) {
  cr_assert(t_bind_to_first_cpu(), "could not bind to a CPU");
  pid_t spinner = t_spin_child(-1); /* inherits the binding */
  cr_assert(spinner >= 0, "fork failed");
  return spinner;
}

/* Yields until coll_yield answers false or `max` yields went by; the yields taken. */
static int yields_until_off(const coll_cpu_mates *m, int max, bool *off) {
  int yields = 0;
  *off = false;
  while (yields < max && !*off) {
    *off = !coll_yield(m);
    if (!*off) yields++;
  }
  return yields;
}

/* After yields went off: 1000 more calls answer false at once. */
static void stays_off(const coll_cpu_mates *m) {
  uint64_t t0 = coll_now_ns();
  bool still_off = true;
  for (int i = 0; i < 1000; i++) still_off = still_off && !coll_yield(m);
  uint64_t dt = coll_now_ns() - t0;
  cr_assert(still_off, "coll_yield yielded again within its off time");
  cr_assert(dt < 50000000ull, "1000 calls while off took %llu ns: they must not yield",
            (unsigned long long)dt);
}

/* Beside a busy loop on its CPU, a rank with mates `m` stops yielding within `within`
 * yields, and stays off. */
static void expect_yields_off(const coll_cpu_mates *m, int within, const char *who) {
  pid_t spinner = spin_beside();
  bool off;
  int yields = yields_until_off(m, 200, &off);
  if (off) stays_off(m);
  t_spin_stop(spinner);
  cr_assert(off, "%s: 200 yields to a busy loop on the same core and coll_yield kept yielding",
            who);
  cr_expect(yields <= within, "%s: coll_yield turned off only after %d yields", who, yields);
}

Test(backoff, a_busy_core_turns_yields_off, .timeout = 60) {
  coll_cpu_mates alone = {.oversubscribed = false};
  expect_yields_off(&alone, 20, "a core each (two long yields suffice)");
}

Test(backoff, oversubscribed_a_stranger_turns_yields_off, .timeout = 60) {
  coll_cpu_mates m = {.oversubscribed = true, .known = true, .n = 0}; /* the job: this process */
  expect_yields_off(&m, 30, "oversubscribed, the loop not of the job (four long yields suffice)");
}

Test(backoff, oversubscribed_a_working_mate_keeps_yields_on, .timeout = 60) {
  pid_t spinner = spin_beside();
  coll_cpu_mates m = {.oversubscribed = true, .known = true, .n = 1};
  cr_assert(clock_getcpuclockid(spinner, &m.clock[0]) == 0, "no CPU clock for the mate");
  bool off;
  int yields = yields_until_off(&m, 60, &off);
  t_spin_stop(spinner);
  cr_assert(!off, "coll_yield stopped yielding after %d yields to a rank of the job", yields);
}

Test(backoff, oversubscribed_mates_unknown_keeps_yields_on, .timeout = 60) {
  pid_t spinner = spin_beside();
  coll_cpu_mates m = {.oversubscribed = true, .known = false};
  bool off;
  int yields = yields_until_off(&m, 60, &off);
  t_spin_stop(spinner);
  cr_assert(!off, "coll_yield stopped yielding after %d yields, its mates unknown", yields);
}
