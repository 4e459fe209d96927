/* foreign.c — how much of a rank's time went to processes outside the job.
 *
 * The tuner measures latencies and bandwidths once and caches them (exec/tune.c); a
 * measurement taken while something else held the ranks' cores prices every call wrongly
 * for as long as the cache keeps it.  This file lets the tuner tell.
 *
 * Linux counts, per thread, the time the thread was ready to run but waited for its CPU
 * (run_delay, the second field of /proc/thread-self/schedstat, in ns; CONFIG_SCHED_INFO).
 * A rank with a core to itself waits for its CPU only while another thread holds it:
 *   foreign = Δrun_delay − Δ(this process's other threads' CPU time) − Δ(the mates' CPU time)
 * over a window, divided by the window's wall time, is the share of the window that went
 * to processes outside the job.  The other threads (a progress thread) and the mates (the
 * other ranks bound to the same one CPU, comm.c) are the job's own work, so they are taken
 * off.  A thread that sleeps on a futex is not ready and adds nothing, so sleeping waits
 * do not count as foreign.
 *
 * Measured on this 2-vCPU machine (a tuning run takes 10-40 ms): quiet, 2 to 8 bound
 * ranks read 0-3 % in most runs and up to 44 % in about one run of fifteen (a kernel
 * worker or the launcher held a core for a few ms); beside `while :; do :; done` on one
 * of the ranks' CPUs, 57-75 % at 2 ranks, 99 % at 3 and 4.  Unbound, 2 ranks: quiet 0-3 %
 * (one of ten 42 %), beside the loop 50-54 %.
 *
 * Ranks with a core each but not bound (torchrun, mpirun without binding) are read the
 * same way: a wait behind another rank of the job that the kernel put on the same CPU
 * for a while then counts as foreign, which only makes the tuner measure again next
 * time.  Where it cannot tell — more ranks than CPUs and the mates not known (unbound),
 * a kernel without schedstat, a mate's clock gone — it says so (-1) and the caller
 * trusts the measurement, as before this file.  Underestimating is the safe side:
 * it only keeps what the cache always kept.
 *
 * Must never: block, allocate, or name a communicator.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "base.h"

/* ns from a timespec */
static uint64_t ns_of(const struct timespec *ts) {
  return (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec;
}

uint64_t coll_job_cpu_ns(const coll_cpu_mates *m) {
  struct timespec ts;
  uint64_t sum = 0;
  for (int i = -1; i < m->n; i++) {
    if (clock_gettime(i < 0 ? CLOCK_PROCESS_CPUTIME_ID : m->clock[i], &ts) != 0) return 0;
    sum += ns_of(&ts);
  }
  return sum;
}

/* run_delay of the calling thread, ns; false where the kernel does not count it.  The
 * file is "cpu_time run_delay timeslices\n", read with open/read (no stdio buffer). */
static bool run_delay_ns(uint64_t *out) {
  int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[96];
  ssize_t got = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (got <= 0) return false;
  buf[got] = 0;
  char *end;
  strtoull(buf, &end, 10); /* the thread's CPU time: not needed */
  if (end == buf || *end != ' ') return false;
  const char *delay = end + 1;
  unsigned long long v = strtoull(delay, &end, 10);
  if (end == delay) return false;
  *out = v;
  return true;
}

void coll_foreign_mark(const coll_cpu_mates *m, bool mates_known, coll_foreign_since *out) {
  struct timespec self;
  out->ok = false;
  /* With more ranks than CPUs a wait may be for another rank of the job: only the mates'
   * clocks (known where the rank is bound to one CPU) can say how much. */
  if (m->oversubscribed && !mates_known) return;
  if (!run_delay_ns(&out->delay_ns) || clock_gettime(CLOCK_THREAD_CPUTIME_ID, &self) != 0) return;
  /* Unbound, a rank has no mates to count: this process's other threads are the job's. */
  coll_cpu_mates none = {.n = 0};
  uint64_t job = coll_job_cpu_ns(mates_known ? m : &none);
  if (!job) return;
  out->job_ns = job - ns_of(&self); /* the job's time but this thread's own */
  out->wall_ns = coll_now_ns();
  out->ok = true;
}

double coll_foreign_share(const coll_cpu_mates *m, bool mates_known,
                          const coll_foreign_since *since) {
  coll_foreign_since now;
  if (!since->ok) return -1;
  coll_foreign_mark(m, mates_known, &now);
  if (!now.ok || now.wall_ns <= since->wall_ns) return -1;
  double delay = (double)now.delay_ns - (double)since->delay_ns;
  double job = (double)now.job_ns - (double)since->job_ns;
  double share = (delay - (job > 0 ? job : 0)) / (double)(now.wall_ns - since->wall_ns);
  return share < 0 ? 0 : share > 1 ? 1 : share;
}
