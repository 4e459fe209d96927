/* env.c — reading settings from the environment, and the clock.
 *
 * Every knob is read through here so that a malformed value is noticed (and warned
 * about) in one place.  Must never abort on bad input: a bad value means the default.
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

bool coll_env_int(const char *name, long def, long *out) {
  *out = def;
  const char *e = getenv(name);
  if (!e || !*e) return true;
  char *end;
  errno = 0;
  long v = strtol(e, &end, 10);
  if (errno || *end) {
    COLL_WARN(-1, "ignoring %s=%s: not an integer", name, e);
    return false;
  }
  *out = v;
  return true;
}

int coll_env_timeout_ms(void) {
  long v;
  coll_env_int("COLL_TIMEOUT_MS", 600000, &v);
  if (v < 0 || v > 365L * 24 * 3600 * 1000) v = 600000;
  return (int)v;
}

uint64_t coll_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
