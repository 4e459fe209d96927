/* test_foreign.c — coll_foreign_share tells time that went outside the job from the job's.
 *
 * Each test binds itself and a child that spins without end (bounded by alarm(), killed
 * and reaped at the end) to one CPU, then keeps itself ready to run (a busy loop) for
 * WINDOW_MS and reads the share:
 *   - the spinner a stranger: about half the window went to it (at least MIN_STRANGER);
 *   - the spinner a mate (its clock among the mates, oversubscribed): its time is the
 *     job's, so the share is lower by at least MIN_GAP than the stranger's read in the
 *     same test (anything else on this CPU, another test's ranks, counts in both);
 *   - oversubscribed, mates not known: it cannot tell (-1).
 * The quiet case (near 0) is not asserted: on a loaded machine it need not be.
 */
#include <criterion/criterion.h>

#include "base.h"
#include "coll_test.h"

#define WINDOW_MS 200
#define MIN_STRANGER 0.25
#define MIN_GAP 0.2

/* The share over WINDOW_MS in which this thread stays ready to run. */
static double busy_window(const coll_cpu_mates *m, bool known) {
  coll_foreign_since since;
  coll_foreign_mark(m, known, &since);
  uint64_t end = coll_now_ns() + WINDOW_MS * 1000000ull;
  while (coll_now_ns() < end) {}
  return coll_foreign_share(m, known, &since);
}

Test(foreign, a_stranger_counts_a_mate_does_not, .timeout = 60) {
  cr_assert(t_bind_to_first_cpu(), "could not bind to a CPU");
  pid_t spinner = t_spin_child(-1); /* on this CPU: it inherits the binding */
  cr_assert(spinner >= 0, "fork failed");
  coll_cpu_mates alone = {.oversubscribed = false, .known = true, .n = 0};
  double stranger = busy_window(&alone, true);
  coll_cpu_mates with = {.oversubscribed = true, .known = true, .n = 1};
  bool clock_ok = clock_getcpuclockid(spinner, &with.clock[0]) == 0;
  double mate = clock_ok ? busy_window(&with, true) : -1;
  t_spin_stop(spinner);
  cr_log_info("beside a busy loop: %.0f%% as a stranger, %.0f%% as a mate", stranger * 100,
              mate * 100);
  cr_assert(clock_ok, "no CPU clock for the spinner");
  cr_assert(stranger >= 0, "the share could not be read (no /proc/thread-self/schedstat?)");
  cr_assert_geq(stranger, MIN_STRANGER,
                "a busy loop on this CPU took only %.0f%% of a %d ms window", stranger * 100,
                WINDOW_MS);
  cr_assert(mate >= 0, "the share with a mate could not be read");
  cr_assert_geq(stranger - mate, MIN_GAP,
                "the same loop as a mate read %.0f%%, as a stranger %.0f%%: its time is the job's",
                mate * 100, stranger * 100);
}

Test(foreign, oversubscribed_mates_unknown_cannot_tell, .timeout = 60) {
  coll_cpu_mates m = {.oversubscribed = true, .known = false};
  coll_foreign_since since;
  coll_foreign_mark(&m, false, &since);
  cr_assert(!since.ok, "a mark was taken without knowing the mates");
  cr_assert_eq(coll_foreign_share(&m, false, &since), -1.0);
}
