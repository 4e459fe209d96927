/* sim-membw — the copy and reduce speeds coll-sim's CPU model needs, measured here.
 *
 * The executor's CPU work per slice is passes over memory: a copy (memcpy into a peer's
 * slot, or into the user's buffer), a non-temporal copy (the final copy of a large
 * out-of-place call, copy.c), a reduction (coll_kernel_reduce: reads two inputs, writes
 * one).  What each pass costs per byte depends on where its operands are: in cache when
 * everything the call touches on the host (users' buffers and slots, every rank's)
 * fits the last-level cache, else memory.  This program times those three kernels, the
 * library's own, in slices of 64 KiB walking buffers of a working set W, with T threads
 * at once (the ranks that share the host's memory bus), and prints ns per byte against
 * W.  coll-sim takes two points of each curve (W well inside the cache, W far outside)
 * and the cache size; sim/sim_cpu.c explains how it interpolates between them.
 *
 * `sim-membw pingpong` measures what writing into a slot costs more when the other core
 * has just read it (coll-sim --rfo-ns).
 *
 * Must never: be part of a prediction — it measures; coll-sim only takes its numbers as
 * flags.
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kernels/reduce.h"

enum { SLICE = 64 * 1024 };
typedef enum { K_COPY, K_NT, K_REDUCE } kernel;

typedef struct {
  kernel k;
  size_t ws; /* working set of this thread, bytes */
  int reps;
  double ns_per_byte;
  pthread_barrier_t *bar;
} job;

/* One pass over the working set: copies move ws/2 bytes (src half to dst half); a
 * reduction reads two thirds and writes one (dst = a + b), ws/3 bytes of output.  The
 * figure is per byte of the pass's output, the unit the engine prices a slice in. */
static void *run(void *arg) {
  job *j = arg;
  size_t part = j->k == K_REDUCE ? j->ws / 3 : j->ws / 2;
  part = part / SLICE * SLICE;
  if (part < SLICE) part = SLICE;
  uint8_t *a = aligned_alloc(4096, part), *b = aligned_alloc(4096, part),
          *c = aligned_alloc(4096, part);
  if (!a || !b || !c) abort();
  memset(a, 1, part), memset(b, 2, part), memset(c, 3, part);
  double best = 1e30;
  for (int r = 0; r < j->reps + 1; r++) {
    pthread_barrier_wait(j->bar);
    uint64_t t0 = coll_now_ns();
    for (size_t off = 0; off < part; off += SLICE) {
      switch (j->k) {
      case K_COPY: memcpy(c + off, a + off, SLICE); break;
      case K_NT: coll_copy_nt(c + off, a + off, SLICE); break;
      case K_REDUCE:
        coll_kernel_reduce(c + off, a + off, b + off, SLICE / 4, COLL_FLOAT32, COLL_SUM);
        break;
      }
    }
    if (j->k == K_NT) coll_copy_nt_fence();
    double t = (double)(coll_now_ns() - t0) / (double)part;
    if (r > 0 && t < best) best = t; /* the first pass warms the pages and the cache */
  }
  j->ns_per_byte = best;
  free(a), free(b), free(c);
  return NULL;
}

/* ---- the slot hand-over: what a byte costs extra for passing between cores ---------
 *
 * A slice goes through a slot: the sender copies it in (the slot's lines were last read
 * by the receiver, on another core: the writes must first take them over), the
 * receiver copies it out (the lines were just written on the other core: the reads
 * fetch them from there).  Two threads do exactly that through a FIFO of 8 slots of
 * 64 KiB, the producer copying from its own buffer of ws/2 bytes, the consumer into
 * its own; each times only its copies (not its waits).  Their excess over a copy
 * between one thread's own buffers is t_out (writing a peer's slot) and t_in (reading
 * one), per byte. */
enum { NSLOTS = 8 };
typedef struct {
  _Alignas(64) _Atomic uint64_t tail;
  _Alignas(64) _Atomic uint64_t head;
  uint8_t *slots;
  size_t part;
  int passes;
  double ns[2]; /* producer, consumer: best ns per byte over the passes */
} fifo;

static void *producer(void *arg) {
  fifo *f = arg;
  uint8_t *src = aligned_alloc(4096, f->part);
  if (!src) abort();
  memset(src, 5, f->part);
  uint64_t pos = 0;
  double best = 1e30;
  for (int p = 0; p < f->passes; p++) {
    uint64_t busy = 0;
    for (size_t off = 0; off < f->part; off += SLICE, pos++) {
      while (pos - atomic_load_explicit(&f->head, memory_order_acquire) >= NSLOTS) {}
      uint64_t t0 = coll_now_ns();
      memcpy(f->slots + (pos % NSLOTS) * SLICE, src + off, SLICE);
      busy += coll_now_ns() - t0;
      atomic_store_explicit(&f->tail, pos + 1, memory_order_release);
    }
    if (p > 0 && (double)busy / (double)f->part < best) best = (double)busy / (double)f->part;
  }
  f->ns[0] = best;
  free(src);
  return NULL;
}

static void *consumer(void *arg) {
  fifo *f = arg;
  uint8_t *dst = aligned_alloc(4096, f->part);
  if (!dst) abort();
  memset(dst, 6, f->part);
  uint64_t pos = 0;
  double best = 1e30;
  for (int p = 0; p < f->passes; p++) {
    uint64_t busy = 0;
    for (size_t off = 0; off < f->part; off += SLICE, pos++) {
      while (atomic_load_explicit(&f->tail, memory_order_acquire) == pos) {}
      uint64_t t0 = coll_now_ns();
      memcpy(dst + off, f->slots + (pos % NSLOTS) * SLICE, SLICE);
      busy += coll_now_ns() - t0;
      atomic_store_explicit(&f->head, pos + 1, memory_order_release);
    }
    if (p > 0 && (double)busy / (double)f->part < best) best = (double)busy / (double)f->part;
  }
  f->ns[1] = best;
  free(dst);
  return NULL;
}

static void handover(void) {
  printf("# hand-over through a FIFO of 8 x 64 KiB slots between two threads: ns per byte "
         "of the producer's copy in, the consumer's copy out\n#%10s %10s %10s\n",
         "W", "in", "out");
  for (size_t ws = 192 * 1024; ws <= (size_t)192 << 20; ws *= 4) {
    fifo f = {.part = ws / 2 / SLICE * SLICE, .passes = ws <= (4u << 20) ? 40 : 5};
    f.slots = aligned_alloc(4096, NSLOTS * SLICE);
    if (!f.slots) abort();
    memset(f.slots, 0, NSLOTS * SLICE);
    pthread_t a, b;
    pthread_create(&a, NULL, producer, &f);
    pthread_create(&b, NULL, consumer, &f);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("%11zu %10.4f %10.4f\n", ws, f.ns[0], f.ns[1]);
    fflush(stdout);
    free(f.slots);
  }
}

/* ---- pingpong: writing a slot the other core has just read ---------------------------
 *
 * Two threads on two different CPUs pass one slot of b bytes back and forth: the first
 * copies b bytes into it and raises a flag, the second copies them out and answers, and
 * again.  So every write finds the slot's lines in the other core's private cache (it
 * read them last) and must take them back first.  The writer's copy is timed alone and
 * set against the same copy with both ends on one thread: the difference per byte is
 * coll-sim's --rfo-ns (the read-for-ownership across cores). */
typedef struct {
  char *slot, *src, *dst;
  size_t b;
  int iters, cpu;
  _Atomic long flag;
} pingpong_t;

static void pin_to(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  pthread_setaffinity_np(pthread_self(), sizeof one, &one); /* best effort */
}

static void *pong(void *arg) {
  pingpong_t *p = arg;
  pin_to(p->cpu);
  for (long i = 0; i < p->iters; i++) {
    while (atomic_load_explicit(&p->flag, memory_order_acquire) != 2 * i + 1) {}
    memcpy(p->dst, p->slot, p->b);
    atomic_store_explicit(&p->flag, 2 * i + 2, memory_order_release);
  }
  return NULL;
}

static void pingpong(void) {
  cpu_set_t allowed;
  int cpus[2] = {-1, -1};
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
    for (int c = 0, k = 0; c < CPU_SETSIZE && k < 2; c++)
      if (CPU_ISSET(c, &allowed)) cpus[k++] = c;
  if (cpus[1] < 0) {
    fprintf(stderr, "sim-membw pingpong: needs two CPUs\n");
    return;
  }
  printf("# pingpong: a slot written on CPU %d and read on CPU %d in turn; ns per byte of the "
         "writer's copy, of the same copy with both ends on one CPU, and the difference\n"
         "#%10s %10s %10s %10s\n",
         cpus[0], cpus[1], "slot", "write", "local", "rfo");
  for (size_t b = 16 * 1024; b <= 256 * 1024; b *= 2) {
    pingpong_t p = {.b = b, .iters = 2000, .cpu = cpus[1]};
    p.slot = aligned_alloc(4096, b), p.src = aligned_alloc(4096, b), p.dst = aligned_alloc(4096, b);
    if (!p.slot || !p.src || !p.dst) abort();
    memset(p.slot, 1, b), memset(p.src, 2, b), memset(p.dst, 3, b);
    pin_to(cpus[0]);
    pthread_t t;
    pthread_create(&t, NULL, pong, &p);
    uint64_t write = 0;
    for (long i = 0; i < p.iters; i++) {
      uint64_t t0 = coll_now_ns();
      memcpy(p.slot, p.src, b);
      write += coll_now_ns() - t0;
      atomic_store_explicit(&p.flag, 2 * i + 1, memory_order_release);
      while (atomic_load_explicit(&p.flag, memory_order_acquire) != 2 * i + 2) {}
    }
    pthread_join(t, NULL);
    uint64_t local = 0; /* the same copy, the slot's lines in this core's cache */
    for (long i = 0; i < p.iters; i++) {
      uint64_t t0 = coll_now_ns();
      memcpy(p.slot, p.src, b);
      local += coll_now_ns() - t0;
      memcpy(p.dst, p.slot, b);
    }
    double w = (double)write / (double)p.iters / (double)b;
    double l = (double)local / (double)p.iters / (double)b;
    printf("%11zu %10.4f %10.4f %10.4f\n", b, w, l, w - l);
    fflush(stdout);
    free(p.slot), free(p.src), free(p.dst);
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "handover") == 0) {
    handover();
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "pingpong") == 0) {
    pingpong();
    return 0;
  }
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  bool knee = argc > 2 && strcmp(argv[2], "knee") == 0;
  if (threads < 1 || threads > 64 || (argc > 2 && !knee)) {
    fprintf(stderr, "usage: sim-membw [THREADS [knee] | handover | pingpong]\n");
    return 2;
  }
  /* The whole curve in steps of 2; knee: W per thread 4-32 MiB in steps of 2^(1/4), where
   * the host's W (threads x W) crosses the last-level cache (coll-sim --cache-ways). */
  size_t from = knee ? (size_t)4 << 20 : 192 * 1024,
         to = knee ? (size_t)32 << 20 : (size_t)768 << 20;
  printf("# sim-membw: ns per byte of output, %d thread(s) at once, slices of 64 KiB; "
         "W = bytes touched per thread\n#%10s %10s %10s %10s\n",
         threads, "W", "copy", "nt-copy", "reduce");
  for (int i = 0;; i++) {
    size_t ws = (size_t)((double)from * pow(2, knee ? i / 4.0 : i)) / 4096 * 4096;
    if (ws > to) break;
    printf("%11zu", ws);
    for (int k = 0; k < 3; k++) {
      pthread_barrier_t bar;
      pthread_barrier_init(&bar, NULL, (unsigned)threads);
      job js[64];
      pthread_t th[64];
      int reps = ws <= (4u << 20) ? 50 : ws <= (64u << 20) ? 8 : 3;
      for (int t = 0; t < threads; t++) {
        js[t] = (job){.k = (kernel)k, .ws = ws, .reps = reps, .bar = &bar};
        pthread_create(&th[t], NULL, run, &js[t]);
      }
      double worst = 0;
      for (int t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        if (js[t].ns_per_byte > worst) worst = js[t].ns_per_byte;
      }
      pthread_barrier_destroy(&bar);
      printf(" %10.4f", worst);
    }
    printf("\n");
    fflush(stdout);
  }
  return 0;
}
