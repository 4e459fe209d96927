/* sim-sched — the scheduler figures coll-sim's --sched model needs, measured here.
 *
 * When a host's ranks outnumber its cores, a rank waiting for a slice yields (fifo.c:
 * sched_yield up to 64 times), then sleeps on a futex that the peer's post wakes.  What
 * that costs is the kernel's, not the library's, so it is measured with processes that
 * do only that (shared memory between forked processes, as ranks are):
 *
 *   yield, alone     one process calling sched_yield with nothing else to run
 *                    (coll-sim --yield-us S,A: A);
 *   yield, switching 2 and 4 processes per core all yielding: each yield hands the core
 *                    to another; cores x time / yields is one hand-over (S);
 *   futex hop        2 processes passing a token by FUTEX_WAIT / FUTEX_WAKE only, the
 *                    other cores idle: from the waker's store to the sleeper running
 *                    (--wake-us I,C: I);
 *   waker's cost     the FUTEX_WAKE call that wakes a sleeper, timed in the waker (C).
 *
 * Must never: be part of a prediction — it measures; coll-sim takes its numbers as flags.
 * Every process it forks is reaped before it returns.
 */
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  _Atomic uint32_t word; /* the futex: the token's count */
  _Atomic int stop, asleep;
  _Atomic long count[64];
} shared;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void fwait(_Atomic uint32_t *w, uint32_t seen) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, seen, NULL, NULL, 0);
}
static long fwake(_Atomic uint32_t *w) {
  return syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, 1, NULL, NULL, 0);
}

static void reap(void) {
  while (wait(NULL) > 0) {}
}

/* P processes yielding for `secs`: seconds of core time per yield. */
static double yields(shared *s, int p, int cores, double secs) {
  memset(s, 0, sizeof *s);
  for (int i = 0; i < p; i++)
    if (fork() == 0) {
      long c = 0;
      while (!atomic_load(&s->stop)) sched_yield(), c++;
      s->count[i] = c;
      _exit(0);
    }
  struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
  nanosleep(&ts, NULL);
  atomic_store(&s->stop, 1);
  reap();
  long total = 0;
  for (int i = 0; i < p; i++) total += s->count[i];
  int busy = p < cores ? p : cores;
  return total ? busy * secs / (double)total : 0;
}

/* Two processes pass the token `hops` times by futex only: seconds per hop. */
static double futex_hops(shared *s, int hops) {
  memset(s, 0, sizeof *s);
  double t0 = now_s();
  for (uint32_t me = 0; me < 2; me++)
    if (fork() == 0) {
      for (;;) {
        uint32_t t = atomic_load(&s->word);
        if (t >= (uint32_t)hops) _exit(0);
        if ((t & 1) != me) {
          fwait(&s->word, t);
          continue;
        }
        atomic_store(&s->word, t + 1);
        fwake(&s->word);
      }
    }
  reap();
  return (now_s() - t0) / hops;
}

/* The waker's side: a FUTEX_WAKE that wakes a sleeping process, `n` times. */
static double wake_cost(shared *s, int n) {
  memset(s, 0, sizeof *s);
  if (fork() == 0) {
    for (;;) {
      uint32_t t = atomic_load(&s->word);
      if (t >= (uint32_t)n) _exit(0);
      atomic_store(&s->asleep, 1);
      fwait(&s->word, t);
    }
  }
  double sum = 0;
  int woke = 0;
  for (int i = 0; i < n; i++) {
    while (!atomic_load(&s->asleep)) sched_yield();
    struct timespec settle = {0, 50000}; /* let it reach FUTEX_WAIT */
    nanosleep(&settle, NULL);
    atomic_store(&s->asleep, 0);
    atomic_fetch_add(&s->word, 1);
    double a = now_s();
    long r = fwake(&s->word);
    double b = now_s();
    if (r == 1) sum += b - a, woke++;
  }
  reap();
  return woke ? sum / woke : 0;
}

int main(int argc, char **argv) {
  if (argc > 1) {
    bool help = strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0;
    fprintf(help ? stdout : stderr,
            "usage: sim-sched\nMeasures the yield and futex figures of coll-sim's scheduler "
            "model (about 3 s)\nand prints them, with the coll-sim flags that take them.\n");
    return help ? 0 : 2;
  }
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int cores = ncpu < 1 ? 1 : ncpu > 16 ? 16 : (int)ncpu;
  shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (s == MAP_FAILED) {
    perror("sim-sched: mmap");
    return 1;
  }
  double alone = yields(s, 1, cores, 0.5);
  double sw2 = yields(s, 2 * cores, cores, 0.5), sw4 = yields(s, 4 * cores, cores, 0.5);
  double hop = futex_hops(s, 20000), cost = wake_cost(s, 2000);
  printf("# sim-sched: %d cores\n", cores);
  printf("yield, alone                      %6.2f us\n", alone * 1e6);
  printf("yield, %2d processes per core      %6.2f us per hand-over\n", 2, sw2 * 1e6);
  printf("yield, %2d processes per core      %6.2f us per hand-over\n", 4, sw4 * 1e6);
  printf("futex hop to an idle core         %6.2f us\n", hop * 1e6);
  printf("FUTEX_WAKE of a sleeper (waker)   %6.2f us\n", cost * 1e6);
  printf("# coll-sim --yield-us %.2f,%.2f --wake-us %.1f,%.2f\n", (sw2 + sw4) / 2 * 1e6,
         alone * 1e6, hop * 1e6, cost * 1e6);
  munmap(s, sizeof *s);
  return 0;
}
