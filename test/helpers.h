/* helpers.h — what the multi-process tests share: launching ranks with a bound on time,
 * checking /dev/shm is clean, deterministic data. */
#ifndef COLL_TEST_HELPERS_H
#define COLL_TEST_HELPERS_H
#include <stddef.h>
#include <stdint.h>
#include "coll.h"
#include "coll_launch.h"

/* Runs fn on n forked ranks (timeout in ms); returns the launcher's status and fills why. */
int t_launch(int n, coll_rank_fn fn, void *arg, int timeout_ms, char *why, size_t why_len);
/* Number of libcoll segments currently in /dev/shm. */
int t_shm_segments(void);
/* splitmix64: a fixed-seed stream of random numbers. */
uint64_t t_rand(uint64_t *state);
/* Prints (to stderr) and returns 1 — for use inside rank functions, which must not call
 * Criterion's asserts (they run in forked children). */
int t_failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#endif
