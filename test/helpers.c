/* helpers.c — see helpers.h. */
#include "helpers.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int t_launch(int n, coll_rank_fn fn, void *arg, int timeout_ms, char *why, size_t why_len) {
  return coll_launch_local(n, fn, arg, timeout_ms, why, why_len);
}

int t_shm_segments(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strncmp(e->d_name, "coll-", 5) == 0) n++;
  closedir(d);
  return n;
}

uint64_t t_rand(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int t_failf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return 1;
}
