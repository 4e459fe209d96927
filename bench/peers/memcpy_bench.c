/* memcpy_bench.c — the memory-bandwidth ceiling of this machine, and what touching fresh
 * memory costs: the two numbers every large-message figure of docs/perf.md is read
 * against ("43–47 GB/s with two threads", "~10 µs per 4 KiB page").
 *
 *   memcpy_bench [-s BYTES (per buffer, default 64M; K, M, G suffixes)]
 *                [-t MAX_THREADS (default 2)] [-r SECONDS per measurement (default 1)]
 *                [-R REPEATS (default 5)]
 *
 * What it prints:
 *   - private buffers, T = 1..MAX_THREADS: every thread copies its own src -> dst pair of
 *     BYTES (touched beforehand) in a loop; copy GB/s = bytes copied per second over all
 *     threads (bytes read plus written is twice that);
 *   - one buffer split in T (T >= 2): T threads copy one BYTES buffer, a 1/T slice each;
 *   - first touch: the time to fault in a fresh mmap of BYTES, 4 KiB pages and then with
 *     MADV_HUGEPAGE, and the copy into it once faulted in — what a library pays when it
 *     allocates a large scratch buffer per call (glibc maps fresh memory above 32 MiB).
 * Each bandwidth is measured REPEATS times: min / median / max.  GB/s = 1e9 B/s.
 *
 * Must never: time the first touch of the copy buffers (they are written before any
 * measurement) or print a figure it did not measure.  Needs no MPI and no libcoll.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 64
#define MAX_REPEATS 64

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
  char *src, *dst;
  size_t len;
  long iters;
  pthread_barrier_t *bar;
} job;

static void *copier(void *arg) {
  job *j = arg;
  pthread_barrier_wait(j->bar);
  for (long i = 0; i < j->iters; i++) {
    memcpy(j->dst, j->src, j->len);
    __asm__ __volatile__("" ::: "memory"); /* every copy happens */
  }
  pthread_barrier_wait(j->bar);
  return NULL;
}

/* T threads copy src[i] -> dst[i] iters times; returns bytes copied per second. */
static double run(int T, char **src, char **dst, size_t len, long iters) {
  pthread_t th[MAX_THREADS];
  job jobs[MAX_THREADS];
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, (unsigned)T + 1);
  for (int i = 0; i < T; i++) {
    jobs[i] = (job){src[i], dst[i], len, iters, &bar};
    if (pthread_create(&th[i], NULL, copier, &jobs[i])) {
      fprintf(stderr, "memcpy_bench: pthread_create failed\n");
      exit(1);
    }
  }
  pthread_barrier_wait(&bar);
  double t0 = now();
  pthread_barrier_wait(&bar);
  double t = now() - t0;
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&bar);
  return (double)len * T * (double)iters / t;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void report(const char *label, int T, double *v, int R) {
  qsort(v, (size_t)R, sizeof *v, cmp_double);
  double med = v[R / 2];
  printf("%-24s T=%d  copy GB/s: min %6.2f  median %6.2f  max %6.2f   (read+write median %6.2f)\n",
         label, T, v[0] / 1e9, med / 1e9, v[R - 1] / 1e9, 2 * med / 1e9);
  fflush(stdout);
}

/* Calibrates with 2 copies, then measures R times at about `secs` each. */
static void measure(const char *label, int T, char **src, char **dst, size_t len, double secs,
                    int R) {
  double v[MAX_REPEATS];
  double bw = run(T, src, dst, len, 2);
  long iters = (long)(secs * bw / ((double)len * T)) + 1;
  for (int r = 0; r < R; r++) v[r] = run(T, src, dst, len, iters);
  report(label, T, v, R);
}

static void usage(void) {
  fprintf(stderr, "usage: memcpy_bench [-s BYTES] [-t MAX_THREADS] [-r SECONDS] [-R REPEATS]\n");
  exit(2);
}

static size_t parse_size(const char *s) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  unsigned shift = *end == 'K' || *end == 'k'   ? 10
                   : *end == 'M' || *end == 'm' ? 20
                   : *end == 'G' || *end == 'g' ? 30
                                                : 0;
  if (shift) end++;
  if (errno || *end || *s < '0' || *s > '9' || v == 0 || v > (SIZE_MAX >> shift)) usage();
  return (size_t)(v << shift);
}

int main(int argc, char **argv) {
  size_t bytes = 64u << 20;
  int max_t = 2, R = 5;
  double secs = 1.0;
  int c;
  while ((c = getopt(argc, argv, "s:t:r:R:h")) != -1) {
    switch (c) {
    case 's': bytes = parse_size(optarg); break;
    case 't': max_t = atoi(optarg); break;
    case 'r': secs = atof(optarg); break;
    case 'R': R = atoi(optarg); break;
    default: usage();
    }
  }
  if (optind < argc || max_t < 1 || max_t > MAX_THREADS || R < 1 || R > MAX_REPEATS || !(secs > 0))
    usage();
  bytes = (bytes + 4095) & ~(size_t)4095;
  printf("# memcpy_bench: %zu bytes per buffer, 1..%d threads, %.2f s per measurement, %d "
         "repeats, %ld cpus online\n",
         bytes, max_t, secs, R, sysconf(_SC_NPROCESSORS_ONLN));

  char *src[MAX_THREADS], *dst[MAX_THREADS];
  for (int i = 0; i < max_t; i++) {
    src[i] = aligned_alloc(4096, bytes);
    dst[i] = aligned_alloc(4096, bytes);
    if (!src[i] || !dst[i]) {
      fprintf(stderr, "memcpy_bench: cannot allocate 2 x %d buffers of %zu bytes\n", max_t, bytes);
      return 1;
    }
    memset(src[i], 1 + i, bytes); /* touched before anything is timed */
    memset(dst[i], 0, bytes);
  }
  for (int T = 1; T <= max_t; T++) measure("private buffers", T, src, dst, bytes, secs, R);
  for (int T = 2; T <= max_t; T++) {
    char *s2[MAX_THREADS], *d2[MAX_THREADS];
    size_t slice = bytes / (size_t)T;
    for (int i = 0; i < T; i++)
      s2[i] = src[0] + (size_t)i * slice, d2[i] = dst[0] + (size_t)i * slice;
    measure("one buffer split in T", T, s2, d2, slice, secs, R);
  }

  /* first touch of fresh memory, 4 KiB pages, then transparent huge pages */
  for (int r = 0; r < 2 * R; r++) {
    int huge = r >= R;
    char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      perror("memcpy_bench: mmap");
      return 1;
    }
    if (huge) madvise(p, bytes, MADV_HUGEPAGE);
    double t0 = now();
    for (size_t off = 0; off < bytes; off += 4096) p[off] = 1;
    double t1 = now();
    memcpy(p, src[0], bytes);
    double t2 = now();
    munmap(p, bytes);
    double t3 = now();
    printf("%s first touch of a fresh mmap(%zu): %.2f ms (%.2f us per 4 KiB page, %.2f GB/s), "
           "then a copy into it %.2f ms, munmap %.2f ms\n",
           huge ? "[MADV_HUGEPAGE]" : "[4 KiB pages]  ", bytes, (t1 - t0) * 1e3,
           (t1 - t0) * 1e6 / (double)(bytes / 4096), (double)bytes / (t1 - t0) / 1e9,
           (t2 - t1) * 1e3, (t3 - t2) * 1e3);
  }
  for (int i = 0; i < max_t; i++) free(src[i]), free(dst[i]);
  return 0;
}
