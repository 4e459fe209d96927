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
 * four atomic words, written only on a long yield.
 *
 * With more ranks than cores the yield goes to another rank of the job as often as not,
 * and that rank may work for milliseconds (the tuner's 1 MiB ping-pong at start-up, a
 * peer faulting in its buffers): timed alone, the rule fired in quiet 4-rank runs on 2
 * cores, the tuner then measured its latencies in futex mode (15 µs for an 8-byte
 * one-shot against 1.6) and chose the tree for 8 B.  Yielding plainly instead left such
 * jobs paying the busy loop's slices: beside one on CPU 1, a 4-rank 64 KiB all-reduce on 2
 * cores took 3.9 ms, a 1 MiB one 13 ms (Intel MPI in wait mode: 0.25 and 1.9).  So there
 * a long yield asks whose it was.  Where the rank is bound to one CPU it knows the other
 * ranks that may run there, its mates (comm.c).  The first long yield opens YIELD_PAIR_NS
 * in which every yield reads the CPU-time clocks of the mates and of its own process (its
 * progress thread's time is the job's too) before and after itself.  A long one in which
 * the job got less than an eighth of the time went elsewhere: a busy loop's slice leaves
 * the mates a few microseconds, a mate at work takes nearly all of a yield it lengthens.
 * FOREIGN_RUN such yields in a row, each within YIELD_PAIR_NS of the last, stop yields as
 * above; one that was the job's breaks the run.  Not two, as with a core each: at
 * start-up the launcher and the kernel's workers hold a core for a few milliseconds
 * (seen: two foreign long yields 8 ms apart in a quiet 4-rank run).  The clocks cost 0.2 µs
 * each, read only within YIELD_PAIR_NS of a long yield.  Where the mates are not known
 * (ranks not bound one to a CPU, more than COLL_CPU_MATES_MAX of them) an oversubscribed
 * rank yields plainly, as before, and so does the tuner's measuring (exec/tune.c).
 *
 * Must never: block, sleep or allocate; name a communicator.
 */
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "base.h"

#define YIELD_LONG_NS 1000000ull  /* 1 ms: above a slot's work, below a slice beside a hog */
#define YIELD_PAIR_NS 20000000ull /* 20 ms */
#define YIELD_OFF_NS 100000000ull /* 100 ms */
#define FOREIGN_RUN 3 /* oversubscribed: foreign long yields in a row that stop yields */

static _Atomic uint64_t yields_off_until; /* coll_now_ns() before which no one yields */
static _Atomic uint64_t last_long;        /* when the last long yield (not the job's) ended */
static _Atomic int long_run;              /* such yields in a row, each within YIELD_PAIR_NS */
static _Atomic uint64_t ask_until; /* oversubscribed: time yields with the clocks till then */

bool coll_yield(const coll_cpu_mates *m) {
  /* Oversubscribed, its mates not known: a long yield may be a rank of the job at work,
   * and nothing can tell. */
  if (m->oversubscribed && !atomic_load_explicit(&m->known, memory_order_relaxed)) {
    sched_yield();
    return true;
  }
  uint64_t t0 = coll_now_ns();
  if (t0 < atomic_load_explicit(&yields_off_until, memory_order_relaxed)) return false;
  bool ask = m->oversubscribed && t0 < atomic_load_explicit(&ask_until, memory_order_relaxed);
  uint64_t c0 = ask ? coll_job_cpu_ns(m) : 0;
  sched_yield();
  uint64_t t1 = coll_now_ns();
  if (t1 - t0 <= YIELD_LONG_NS) return true;
  int need = 2;
  if (m->oversubscribed) {
    /* Whose was it?  The first long yield cannot say (its clocks were not read before
     * it); it starts YIELD_PAIR_NS in which every yield reads them.  One in which the job
     * got an eighth of the time or more was the job's, and breaks a run. */
    uint64_t c1 = ask ? coll_job_cpu_ns(m) : 0;
    atomic_store_explicit(&ask_until, t1 + YIELD_PAIR_NS, memory_order_relaxed);
    if (!c0 || !c1) return true;
    if (c1 - c0 >= (t1 - t0) / 8) {
      atomic_store_explicit(&long_run, 0, memory_order_relaxed);
      return true;
    }
    need = FOREIGN_RUN;
  }
  uint64_t prev = atomic_exchange_explicit(&last_long, t1, memory_order_relaxed);
  int run = 1;
  if (prev && t1 - prev < YIELD_PAIR_NS)
    run = atomic_fetch_add_explicit(&long_run, 1, memory_order_relaxed) + 1;
  else
    atomic_store_explicit(&long_run, 1, memory_order_relaxed);
  if (run >= need) {
    atomic_store_explicit(&yields_off_until, t1 + YIELD_OFF_NS, memory_order_relaxed);
    atomic_store_explicit(&long_run, 0, memory_order_relaxed);
  }
  return true;
}
