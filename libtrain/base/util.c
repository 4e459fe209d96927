/*
 * util.c — small helpers shared by libtrain: the RNG (splitmix64: one 64-bit word of
 * state, so saving it in a checkpoint is trivial), FNV-1a hashing for checkpoint and
 * data integrity, one-line error formatting, a clock, and atomic file writes
 * (temp file in the target's directory, fsync, rename, fsync of the directory), so a
 * crash or an error never leaves a half-written file under the final name.
 */
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

uint64_t train_splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

float train_rand_uniform(uint64_t *state) {
  return (float)(train_splitmix64(state) >> 40) / 16777216.0f; /* 24 random bits */
}

float train_rand_normal(uint64_t *state) {
  /* Box-Muller on two uniforms in (0,1]; one normal per call keeps the state simple. */
  double u1 = ((double)(train_splitmix64(state) >> 11) + 1.0) / 9007199254740992.0;
  double u2 = (double)(train_splitmix64(state) >> 11) / 9007199254740992.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

uint64_t train_fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  /* Hash 8 bytes per round (FNV-1a over 64-bit words): fast enough for GB checkpoints. */
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    h ^= w;
    h *= 0x100000001b3ULL;
  }
  for (; i < n; i++) {
    h ^= b[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

void train_errf(char *err, const char *fmt, ...) {
  if (!err) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, TRAIN_ERRLEN, fmt, ap);
  va_end(ap);
  for (char *c = err; *c; c++) /* errors are one line, always */
    if (*c == '\n') *c = ' ';
}

double train_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int train_cpu_count(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

int train_cpu_threads(void) { return train_cpu_count(); }

int train_atomic_open(train_atomic *a, const char *path, char *err) {
  memset(a, 0, sizeof *a);
  if (strlen(path) >= sizeof a->path) {
    train_errf(err, "%s: path too long", path);
    return -1;
  }
  strcpy(a->path, path);
  snprintf(a->tmp, sizeof a->tmp, "%s.tmp.%ld", path, (long)getpid());
  int fd = open(a->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    train_errf(err, "%s: cannot create: %s", path, strerror(errno));
    return -1;
  }
  a->f = fdopen(fd, "wb");
  if (!a->f) {
    train_errf(err, "%s: cannot create: %s", path, strerror(errno));
    close(fd);
    unlink(a->tmp);
    return -1;
  }
  return 0;
}

void train_atomic_abort(train_atomic *a) {
  if (a->f) {
    fclose(a->f);
    a->f = NULL;
    unlink(a->tmp);
  }
}

int train_atomic_commit(train_atomic *a, char *err) {
  int bad = fflush(a->f) != 0 || ferror(a->f);
  int e = errno;
  if (!bad && fsync(fileno(a->f)) != 0) {
    bad = 1;
    e = errno;
  }
  if (fclose(a->f) != 0 && !bad) {
    bad = 1;
    e = errno;
  }
  a->f = NULL;
  if (bad) {
    unlink(a->tmp);
    train_errf(err, "%s: write failed: %s", a->path, strerror(e));
    return -1;
  }
  if (rename(a->tmp, a->path) != 0) {
    e = errno;
    unlink(a->tmp);
    train_errf(err, "%s: rename failed: %s", a->path, strerror(e));
    return -1;
  }
  /* fsync the directory so the rename itself is durable */
  char dir[4096];
  strcpy(dir, a->path);
  char *slash = strrchr(dir, '/');
  if (slash == dir)
    dir[1] = '\0';
  else if (slash)
    *slash = '\0';
  else
    strcpy(dir, ".");
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return 0;
}
