/* exchange_bound.c — how fast can this machine move bytes between its two CPUs at all?
 *
 * A 2-rank all-reduce of n bytes must bring n bytes' worth of the peer's data into each
 * rank (its half of the peer's input, then the peer's half of the result; or the
 * peer's whole input).  This probe does only that and nothing else: two threads, pinned
 * to CPUs 0 and 1, stream M bytes each way at once through a ring of NS slots of B
 * bytes in memory both can see (the shape of libcoll's FIFO, transport/fifo.h), the
 * sender copying its source into a slot, the receiver copying (or, with -r, adding) the
 * slot into its destination.  No library, no reduction schedule, no syscalls: whatever
 * time it takes is the machine's floor for moving those bytes this way.
 *
 * Each repetition starts both threads on a barrier; its time is from the later start
 * to the later finish.  Prints min and median over the repetitions, and the GB/s each
 * way at the median.  That is not how coll-bench and mpi_coll_bench time a call: they
 * run the calls back to back and divide.  With -b the repetitions run back to back too
 * (one barrier before the first), and the line gives that mean; compare a library with
 * the -b line, not with the median (2026-11-30: at 1 MiB the median read 145-152 µs
 * while the back-to-back mean read 172-192, level with libcoll's ring).
 *
 * Usage: exchange_bound M_KiB B_KiB NS REPS [-r] [-1] [-b] [-i] [-n] [-d] [-pK] [-c]
 *   -r  the receiver adds the slot to its own source into the destination (a reduce)
 *   -1  one way only: CPU 0 sends, CPU 1 receives
 *   -b  back to back: also print the mean over the repetitions run without a barrier
 *   -i  in place: the destination is the source (the footprint of an in-place call)
 * and the variants tried on 2026-11-30 (lab/perf-log.md; none was faster):
 *   -n  the sender fills a slot with non-temporal stores
 *   -d  the sender cldemotes every line of a slot it filled (push it towards the L3)
 *   -pK the adder prefetches the slot K lines ahead
 *   -c  the receiver copies the slot into the destination, then adds there
 * Build: cc -O2 -mavx512f -pthread lab/scripts/exchange_bound.c -o /tmp/exchange_bound
 * Lab only: not built by meson, not part of the library.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  _Alignas(64) _Atomic uint32_t tail; /* slots filled, by the sender */
  _Alignas(64) _Atomic uint32_t head; /* slots emptied, by the receiver */
} ring_ctl;

static size_t M, B;
static uint32_t NS;
static int REPS, REDUCE, ONEWAY, BACK_TO_BACK, IN_PLACE, NT_FILL, DEMOTE, PREFETCH, COPY_ADD;

static void fill_nt(uint8_t *d, const uint8_t *s, size_t n) {
  for (size_t i = 0; i < n; i += 64) _mm512_stream_si512((void *)(d + i), _mm512_load_si512(s + i));
  _mm_sfence();
}

__attribute__((target("cldemote"))) static void demote(uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i += 64) _cldemote(p + i);
}
static ring_ctl ctl[2]; /* ctl[r]: the ring that CPU r sends on */
static uint8_t *slots[2];
static pthread_barrier_t bar;
static double *t_start[2], *t_end[2];

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void add(float *o, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    if (PREFETCH) _mm_prefetch((const char *)(a + i) + 64 * PREFETCH, _MM_HINT_T0);
    _mm512_store_ps(o + i, _mm512_add_ps(_mm512_load_ps(a + i), _mm512_load_ps(b + i)));
  }
}

static void *run(void *arg) {
  int me = (int)(intptr_t)arg, pe = 1 - me;
  cpu_set_t cs;
  CPU_ZERO(&cs);
  CPU_SET(me, &cs);
  pthread_setaffinity_np(pthread_self(), sizeof cs, &cs);
  uint8_t *src = aligned_alloc(4096, M), *dst = IN_PLACE ? src : aligned_alloc(4096, M);
  memset(src, 1, M);
  if (dst != src) memset(dst, 0, M);
  ring_ctl *out = &ctl[me], *in = &ctl[pe];
  uint32_t sent_total = 0, got_total = 0;
  size_t chunks = M / B;
  for (int it = 0; it < REPS; it++) {
    if (!BACK_TO_BACK || it == 0) pthread_barrier_wait(&bar);
    t_start[me][it] = now();
    size_t sent = ONEWAY && me == 1 ? chunks : 0, got = ONEWAY && me == 0 ? chunks : 0;
    while (sent < chunks || got < chunks) {
      /* Send while the ring has room, else receive what has arrived. */
      if (sent < chunks &&
          sent_total - atomic_load_explicit(&out->head, memory_order_acquire) < NS) {
        uint8_t *slot = slots[me] + (sent_total % NS) * B;
        if (NT_FILL)
          fill_nt(slot, src + sent * B, B);
        else
          memcpy(slot, src + sent * B, B);
        if (DEMOTE) demote(slot, B);
        atomic_store_explicit(&out->tail, ++sent_total, memory_order_release);
        sent++;
      } else if (got < chunks &&
                 atomic_load_explicit(&in->tail, memory_order_acquire) != got_total) {
        const uint8_t *s = slots[pe] + (got_total % NS) * B;
        if (REDUCE && COPY_ADD) {
          memcpy(dst + got * B, s, B);
          add((float *)(dst + got * B), (const float *)(dst + got * B),
              (const float *)(src + got * B), B / 4);
        } else if (REDUCE)
          add((float *)(dst + got * B), (const float *)s, (const float *)(src + got * B), B / 4);
        else
          memcpy(dst + got * B, s, B);
        atomic_store_explicit(&in->head, ++got_total, memory_order_release);
        got++;
      } else {
        _mm_pause();
      }
    }
    t_end[me][it] = now();
  }
  if (dst != src) free(dst);
  free(src);
  return NULL;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s M_KiB B_KiB NS REPS [-r] [-1] [-b] [-i] [-n] [-d] [-pK] [-c]\n", argv[0]);
    return 2;
  }
  M = (size_t)atol(argv[1]) << 10;
  B = (size_t)atol(argv[2]) << 10;
  NS = (uint32_t)atoi(argv[3]);
  REPS = atoi(argv[4]);
  for (int i = 5; i < argc; i++) {
    if (!strcmp(argv[i], "-r")) REDUCE = 1;
    if (!strcmp(argv[i], "-1")) ONEWAY = 1;
    if (!strcmp(argv[i], "-b")) BACK_TO_BACK = 1;
    if (!strcmp(argv[i], "-i")) IN_PLACE = 1;
    if (!strcmp(argv[i], "-n")) NT_FILL = 1;
    if (!strcmp(argv[i], "-d")) DEMOTE = 1;
    if (!strncmp(argv[i], "-p", 2)) PREFETCH = atoi(argv[i] + 2);
    if (!strcmp(argv[i], "-c")) COPY_ADD = 1;
  }
  if (!M || !B || M % B || B % 64 || !NS || REPS < 1) {
    fprintf(stderr, "M must be a multiple of B, B of 64 bytes; NS, REPS >= 1\n");
    return 2;
  }
  for (int i = 0; i < 2; i++) {
    slots[i] = aligned_alloc(4096, B * NS);
    memset(slots[i], 0, B * NS);
    t_start[i] = calloc((size_t)REPS, sizeof(double));
    t_end[i] = calloc((size_t)REPS, sizeof(double));
  }
  pthread_barrier_init(&bar, NULL, 2);
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, run, (void *)(intptr_t)i);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  if (BACK_TO_BACK) { /* from the later first start to the later last end */
    double s = t_start[0][0] > t_start[1][0] ? t_start[0][0] : t_start[1][0];
    double e = t_end[0][REPS - 1] > t_end[1][REPS - 1] ? t_end[0][REPS - 1] : t_end[1][REPS - 1];
    printf("back to back: mean %.1f us over %d repetitions\n", (e - s) * 1e6 / REPS, REPS);
  }
  double *d = calloc((size_t)REPS, sizeof(double));
  for (int it = 0; it < REPS; it++) {
    double s = t_start[0][it] > t_start[1][it] ? t_start[0][it] : t_start[1][it];
    double e = t_end[0][it] > t_end[1][it] ? t_end[0][it] : t_end[1][it];
    d[it] = (e - s) * 1e6;
  }
  qsort(d, (size_t)REPS, sizeof(double), cmp);
  double med = d[REPS / 2];
  printf("%s%s %zu KiB each way, slots %u x %zu KiB: min %.1f us  median %.1f us  (%.2f GB/s each "
         "way at the median)\n",
         ONEWAY ? "one-way" : (REDUCE ? "exchange+add" : "exchange"), IN_PLACE ? " in place" : "",
         M >> 10, NS, B >> 10, d[0],
         med, (double)M / med / 1e3);
  return 0;
}
