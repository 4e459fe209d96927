/* pingpong_bench.c — the round trip between two processes on this machine, four ways:
 * the floor under every small-message latency in docs/perf.md and the source of the
 * "0.49 µs spinning, 1.5 µs yielding, ~16 µs through a futex" of the design notes.
 *
 *   pingpong_bench [-n ROUND_TRIPS (default 200000; a tenth for futex and pipe)]
 *                  [-p 0|1 (pin the two processes to cpus 0 and 1, default 1)]
 *                  [-m spin|yield|futex|pipe (one mode only; default all four)]
 *
 * The spin round trip is also a reading of where the two cpus sit: on the development VM
 * the host moves its two vCPUs between a shared physical core (~0.06 µs) and cores far
 * apart (0.25-0.46 µs), and the 2-rank figures move with it (docs/perf.md, "The
 * machine's two placements"); bench/peers/side_by_side.py records it before every
 * repetition with `-m spin -n 20000`.
 *
 * Modes, each repeated 5 times (min / median / max round-trip time, the first round trip
 * of each repeat left out):
 *   spin   a flag in a shared anonymous mapping, the waiter busy-polls (with a pause)
 *   yield  the same flag, sched_yield() between polls
 *   futex  the same flag, the waiter sleeps in FUTEX_WAIT, the poster calls FUTEX_WAKE
 *   pipe   one byte written and read back over two pipes
 *
 * Must never: time anything but the round trips (the processes are forked and pinned
 * before the clock starts).  Needs no MPI and no libcoll.
 */
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  sched_setaffinity(0, sizeof s, &s); /* best effort: one cpu leaves both on it */
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static long futex(atomic_int *addr, int op, int val) {
  return syscall(SYS_futex, addr, op, val, NULL, NULL, 0);
}

struct flags {
  _Alignas(64) atomic_int ping;
  _Alignas(64) atomic_int pong;
};

enum { SPIN, YIELD, FUTEX, PIPE, NUM_MODES };
static const char *const mode_names[NUM_MODES] = {"spin", "yield", "futex", "pipe"};

static void wait_for(atomic_int *a, int v, int mode) {
  if (mode == FUTEX) {
    int cur;
    while ((cur = atomic_load_explicit(a, memory_order_acquire)) != v) futex(a, FUTEX_WAIT, cur);
    return;
  }
  while (atomic_load_explicit(a, memory_order_acquire) != v) {
    if (mode == YIELD)
      sched_yield();
    else
      cpu_relax();
  }
}

static void post(atomic_int *a, int v, int mode) {
  atomic_store_explicit(a, v, memory_order_release);
  if (mode == FUTEX) futex(a, FUTEX_WAKE, 1);
}

/* One repeat: returns seconds per round trip. */
static double once(int mode, long iters, int dopin) {
  struct flags *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                         0);
  int p1[2], p2[2];
  if (s == MAP_FAILED || pipe(p1) || pipe(p2)) {
    perror("pingpong_bench");
    exit(1);
  }
  memset(s, 0, sizeof *s);
  char c = 0;
  pid_t pid = fork();
  if (pid < 0) {
    perror("pingpong_bench: fork");
    exit(1);
  }
  if (pid == 0) {
    if (dopin) pin(1);
    for (long i = 1; i <= iters; i++) {
      if (mode == PIPE) {
        if (read(p1[0], &c, 1) != 1 || write(p2[1], &c, 1) != 1) _exit(1);
      } else {
        wait_for(&s->ping, (int)i, mode);
        post(&s->pong, (int)i, mode);
      }
    }
    _exit(0);
  }
  if (dopin) pin(0);
  double t0 = 0;
  for (long i = 1; i <= iters; i++) {
    if (i == 2) t0 = now(); /* the first round trip also wakes the child: left out */
    if (mode == PIPE) {
      if (write(p1[1], &c, 1) != 1 || read(p2[0], &c, 1) != 1) exit(1);
    } else {
      post(&s->ping, (int)i, mode);
      wait_for(&s->pong, (int)i, mode);
    }
  }
  double t = (now() - t0) / (double)(iters - 1);
  waitpid(pid, NULL, 0);
  close(p1[0]), close(p1[1]), close(p2[0]), close(p2[1]);
  munmap(s, sizeof *s);
  return t;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  long iters = 200000;
  int dopin = 1, c, only = -1;
  while ((c = getopt(argc, argv, "n:p:m:h")) != -1) {
    if (c == 'n')
      iters = atol(optarg);
    else if (c == 'p')
      dopin = atoi(optarg);
    else if (c == 'm') {
      for (int m = 0; m < NUM_MODES; m++)
        if (strcmp(optarg, mode_names[m]) == 0) only = m;
      if (only < 0) {
        fprintf(stderr, "pingpong_bench: -m %s: not one of spin, yield, futex, pipe\n", optarg);
        return 2;
      }
    } else {
      fprintf(stderr, "usage: pingpong_bench [-n ROUND_TRIPS] [-p 0|1] [-m MODE]\n");
      return 2;
    }
  }
  if (iters < 20 || optind < argc) {
    fprintf(stderr, "usage: pingpong_bench [-n ROUND_TRIPS >= 20] [-p 0|1] [-m MODE]\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IONBF, 0);
  printf("# pingpong_bench: round trip between 2 processes, pinned %d, %ld cpus online\n", dopin,
         sysconf(_SC_NPROCESSORS_ONLN));
  for (int m = 0; m < NUM_MODES; m++) {
    if (only >= 0 && m != only) continue;
    long it = m >= FUTEX ? iters / 10 : iters;
    double v[5];
    for (int r = 0; r < 5; r++) v[r] = once(m, it, dopin);
    qsort(v, 5, sizeof v[0], cmp_double);
    printf(
        "%-6s round trip us: min %8.3f  median %8.3f  max %8.3f   (%ld round trips per repeat)\n",
        mode_names[m], v[0] * 1e6, v[2] * 1e6, v[4] * 1e6, it);
  }
  return 0;
}
