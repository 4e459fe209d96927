/* coll_test.h — what the multi-process tests share: launching ranks with a bound on time,
 * checking that a job left nothing in /dev/shm, deterministic data, busy loops.
 *
 * Leak checks count only the segments of the jobs the test itself made (by their name
 * prefix, /dev/shm/coll-<job>-..., libcoll/transport/shm.c), never every libcoll segment on the
 * machine: another libcoll job running meanwhile (another test program, a coll-bench
 * loop) makes and removes its own. */
#ifndef COLL_TEST_COLL_TEST_H
#define COLL_TEST_COLL_TEST_H
#include <stddef.h>
#include <stdint.h>
#include "coll.h"
#include "coll_launch.h"

/* T_SANITIZED: 1 in the ASan+UBSan build (-O1: 2-4x slower).  The few tests that run less
 * there say what they leave to the plain build, which runs everything. */
#if defined(__SANITIZE_ADDRESS__)
#define T_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define T_SANITIZED 1
#endif
#endif
#ifndef T_SANITIZED
#define T_SANITIZED 0
#endif

/* What a loaded machine (CI runs two test programs on 2 cores) may add between a timeout
 * firing and the test hearing of it: bounds on a reported timeout are the timeout plus
 * this.  Bounds on a failure that must beat the timeout are a fraction of the timeout. */
#define T_SLACK_MS 6000

/* Runs fn on n forked ranks (timeout in ms); returns the launcher's status and fills why. */
int t_launch(int n, coll_rank_fn fn, void *arg, int timeout_ms, char *why, size_t why_len);
/* Segments the last job launched from this process (t_launch, coll_launch_local(_raw))
 * left behind: those the launcher had to remove after every rank exited plus any of the
 * job still in /dev/shm.  0 for a clean job.  Names (space-separated) into `names` when
 * it is not NULL. */
int t_job_leftovers(char *names, size_t len);
/* Criterion's assert that the last launched job left no segment (for the test process,
 * not for rank functions). */
#define T_ASSERT_NO_LEFTOVERS(what)                                                            \
  do {                                                                                         \
    char left_[512];                                                                           \
    int n_ = t_job_leftovers(left_, sizeof left_);                                             \
    cr_assert_eq(n_, 0, "%s: %d segment(s) of the job left in /dev/shm: %s", what, n_, left_); \
  } while (0)
/* Segments in /dev/shm whose names begin with `prefix` (coll-<job>-), removed when
 * `remove` is true.  Names into `names` as above. */
int t_prefix_segments(const char *prefix, int remove, char *names, size_t len);
/* The prefix of the jobs coll_comm_init_from_env builds with this environment's
 * COLL_SECRET (which must be set), or with rendezvous `addr` ("host:port") and `size`
 * when it is not. */
void t_env_job_prefix(char *out, size_t len, const char *addr, int size);
/* A TCP port on 127.0.0.1 that nobody listens on now, below the kernel's ephemeral range
 * (ip_local_port_range): a port the kernel hands out for outgoing connections can be
 * taken by another process's connection (another libcoll job's bootstrap) between the
 * moment we find it free and the moment a rank listens on it. */
int t_free_port(void);
/* splitmix64: a fixed-seed stream of random numbers. */
uint64_t t_rand(uint64_t *state);
/* Prints (to stderr) and returns 1 — for use inside rank functions, which must not call
 * Criterion's asserts (they run in forked children). */
int t_failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Busy loops beside the code under test (the waits' backoff, the tuner's busy rule). */
#include <stdbool.h>
#include <sys/types.h>
/* Binds the calling process to the first CPU it may use; false if it cannot. */
bool t_bind_to_first_cpu(void);
/* A child that spins without end on `cpu` (-1: wherever this process may run), until
 * killed or 60 s (alarm: it never outlives a lost test by long); -1 if fork failed. */
pid_t t_spin_child(int cpu);
/* SIGKILL and reap a child of t_spin_child. */
void t_spin_stop(pid_t child);
#endif
