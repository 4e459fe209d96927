/* backoff.c — the yield every wait in libcoll takes before it sleeps, and when not to take it.
 *
 * A rank that waits for a peer spins (when it has a core to itself), then yields, then
 * sleeps on a futex until the peer's post wakes it.  Yielding is the right middle step when
 * what else wants this core is another rank of the job: the yield hands it the core at
 * once, and the core comes back when that rank waits in turn (microseconds for a small
 * call; 0.1-0.3 ms for a 256 KiB slot).  It is the wrong step when the core is shared with a
 * process that does not wait (a build, someone else's benchmark, a busy loop): Linux's
 * scheduler (EEVDF, as CFS before it) then puts the yielding task behind that process for a
 * whole slice, 1.5-4 ms here, and a wait that yields 64 times pays 64 slices.  Measured on
 * this 2-vCPU machine with `while :; do :; done` bound to CPU 1 (docs/perf.md, "Steadiness"):
 * a 2-rank 64 MiB all-reduce took 1.5-1.9 s instead of 17-20 ms, a 2-rank 1 MiB one 19 ms
 * instead of 0.17 ms.  Never yielding (spin, then futex) avoids that, but costs the quiet
 * case: a 4-rank 64 KiB all-reduce on 2 cores took 170 us instead of 27, every hand-over
 * between two ranks of one core becoming a futex sleep and a cross-core wake.
 *
 * So coll_yield() times its own yield, when the job's ranks have a core each (not
 * oversubscribed: ranks are bound one to a core, api/launch.c), so that nothing of the job
 * but the rank's own progress thread can take the core it yields.  A yield that kept the
 * caller off the core longer than YIELD_LONG_NS then says something outside the job holds
 * the core; a second within YIELD_PAIR_NS of the first confirms it (a kernel worker may
 * take a millisecond once).  Then for YIELD_OFF_NS every coll_yield() in this process returns false
 * at once and its caller sleeps instead (a futex wake puts a sleeper back ahead of a busy loop; a
 * yield puts it behind).  After that, yields are tried again: beside a busy loop that costs two
 * slices per YIELD_OFF_NS, a few per cent.  The state is per process (the core is the process's):
 * two atomic words, written only on a long yield.
 *
 * With more ranks than cores the yield goes to another rank of the job as often as not,
 * and that rank may work for milliseconds (the tuner's 1 MiB ping-pong at start-up, a
 * peer faulting in its buffers): timed there, the rule fired in quiet 4-rank runs on 2
 * cores, the tuner then measured its latencies in futex mode (15 µs for an 8-byte
 * one-shot against 1.6) and chose the tree for 8 B.  So oversubscribed callers yield
 * plainly, as before: beside a busy loop they still pay its slices (docs/perf.md,
 * "Steadiness").
 *
 * Must never: block, sleep or allocate; name a communicator.
 */
#include <sched.h>
#include <stdatomic.h>

#include "base.h"

#define YIELD_LONG_NS 1000000ull  /* 1 ms: above a slot's work, below a slice beside a hog */
#define YIELD_PAIR_NS 20000000ull /* 20 ms */
#define YIELD_OFF_NS 100000000ull /* 100 ms */

static _Atomic uint64_t yields_off_until; /* coll_now_ns() before which no one yields */
static _Atomic uint64_t last_long;        /* when the last long yield ended */

bool coll_yield(bool oversubscribed) {
  if (oversubscribed) { /* a long yield may be a rank of the job at work: no telling */
    sched_yield();
    return true;
  }
  uint64_t t0 = coll_now_ns();
  if (t0 < atomic_load_explicit(&yields_off_until, memory_order_relaxed)) return false;
  sched_yield();
  uint64_t t1 = coll_now_ns();
  if (t1 - t0 > YIELD_LONG_NS) {
    uint64_t prev = atomic_exchange_explicit(&last_long, t1, memory_order_relaxed);
    if (prev && t1 - prev < YIELD_PAIR_NS)
      atomic_store_explicit(&yields_off_until, t1 + YIELD_OFF_NS, memory_order_relaxed);
  }
  return true;
}
