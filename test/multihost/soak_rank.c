/* soak_rank.c — one rank of the soak: 10,000 collectives of random kind, size, op, dtype,
 * root and in-place-ness over one communicator, every result checked, with this process's
 * resident memory (VmRSS) and open descriptors sampled before and after.
 *
 * Every rank draws the same sequence from the same seed (SOAK_SEED, default 20261122), so
 * all ranks call the same thing in the same order without talking.  Sizes are mostly
 * small (that is where per-call costs and leaks show): 85 % up to 1 KiB elements, 14 % up
 * to 64 Ki elements, 1 % up to 1 Mi bytes.  The buffers are allocated and touched before
 * the first sample, and 200 calls run before it too, so the sample starts after every
 * first-touch and lazily made buffer.  Flat means: descriptors exactly equal, VmRSS grown
 * by at most SOAK_RSS_KB (default 1024 KiB) — a leak of 100 bytes per call would add
 * ~1 MiB over 10,000 calls, so anything per call shows, while the allocator's page
 * rounding of a few pages does not.  Prints one line ending in ": ok" when all is well.
 * Run by test_soak.c on 4 network-namespace hosts (scripts/netns.sh) over TCP.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"
#include "tcp_matrix.h"

static long rss_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "VmRSS:", 6) == 0) kb = strtol(line + 6, NULL, 10);
  if (f) fclose(f);
  return kb;
}

static int open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1; /* the directory's own descriptor */
}

static uint64_t next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(void) {
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  const char *e = getenv("SOAK_CALLS");
  long calls = e ? atol(e) : 10000, warm = 200;
  e = getenv("SOAK_SEED");
  uint64_t seed = e ? strtoull(e, NULL, 10) : 20261122;
  e = getenv("SOAK_RSS_KB");
  long rss_tol = e ? atol(e) : 1024;
  coll_comm_t comm;
  if (coll_comm_init_from_env(&comm) != COLL_OK) {
    fprintf(stderr, "soak on %s: init: %s\n", host, coll_comm_last_error(NULL));
    return 2;
  }
  int rank, n;
  coll_comm_rank(comm, &rank);
  coll_comm_size(comm, &n);
  static const coll_dtype dtypes[] = {COLL_INT32,   COLL_UINT8,   COLL_INT64,   COLL_UINT64,
                                      COLL_FLOAT32, COLL_FLOAT64, COLL_BFLOAT16};
  size_t cap = ((size_t)1 << 20) * (size_t)n + 4096;
  uint8_t *a = malloc(cap), *b = malloc(cap);
  if (!a || !b) return 3;
  memset(a, 1, cap);
  memset(b, 1, cap);
  long rss0 = 0;
  int fd0 = 0, wrong = 0, kinds[TM_KINDS + 1] = {0};
  long done = 0;
  double t0 = 0;
  for (long i = 0; i < warm + calls && wrong < 3; i++) {
    if (i == warm) {
      rss0 = rss_kb();
      fd0 = open_fds();
      t0 = now_s();
    }
    uint64_t r = next(&seed);
    int kind = (int)(r % (TM_KINDS + 1)); /* TM_KINDS: a barrier */
    coll_dtype d = dtypes[(r >> 8) % (sizeof dtypes / sizeof *dtypes)];
    bool fl = d == COLL_FLOAT32 || d == COLL_FLOAT64 || d == COLL_BFLOAT16;
    coll_op op = (coll_op)((r >> 16) % (fl ? 5 : 4)); /* AVG only for floats */
    size_t es = coll_dtype_size(d), count;
    unsigned p = (unsigned)((r >> 24) % 100);
    uint64_t r2 = next(&seed);
    if (p < 85)
      count = r2 % 1025;
    else if (p < 99)
      count = r2 % 65537;
    else
      count = r2 % ((1u << 20) / es + 1);
    if (kind == 1 || kind == 2) count /= (size_t)n; /* per-rank pieces: keep totals alike */
    bool reducing = kind == 0 || kind == 1 || kind == 4;
    if (!reducing) op = COLL_SUM; /* the checker's inputs for moves are op-independent */
    bool in_place = kind != 5 && ((r >> 32) & 1); /* sendrecv is out of place */
    int root = (int)((r >> 40) % (uint64_t)n);
    if (i >= warm) {
      kinds[kind]++;
      done++;
    }
    if (kind == TM_KINDS) {
      if (coll_barrier(comm, NULL) != COLL_OK) {
        fprintf(stderr, "rank %d: barrier: %s\n", rank, coll_comm_last_error(comm));
        wrong++;
      }
      continue;
    }
    wrong += tm_call(comm, rank, n, kind, d, op, in_place, count, root, r2, a, b);
  }
  double secs = now_s() - t0;
  long rss1 = rss_kb();
  int fd1 = open_fds();
  if (coll_comm_destroy(comm) != COLL_OK) wrong++;
  free(a);
  free(b);
  bool flat = fd1 == fd0 && rss1 - rss0 <= rss_tol;
  printf("soak rank %d of %d on %s: %ld calls in %.1f s (all_reduce %d, reduce_scatter %d, "
         "all_gather %d, broadcast %d, reduce %d, sendrecv %d, barrier %d), %d wrong, VmRSS "
         "%ld -> %ld kB (tolerance +%ld), fds %d -> %d: %s\n",
         rank, n, host, done, secs, kinds[0], kinds[1], kinds[2], kinds[3], kinds[4], kinds[5],
         kinds[6], wrong, rss0, rss1, rss_tol, fd0, fd1,
         wrong   ? "WRONG"
         : !flat ? "NOT FLAT"
                 : "ok");
  return wrong || !flat ? 1 : 0;
}
