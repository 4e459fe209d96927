/* base.h — what every layer uses, transports included: COLL_DEBUG logging, integers from
 * the environment, the clock, and the spin-wait hint.  Knows no communicator.
 *
 * Must never: include internal.h or name struct coll_comm (libcoll/transport/ includes this file
 * and must see nothing of the communicator but its coll_comm_view).
 */
#ifndef COLL_BASE_H
#define COLL_BASE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* ---- logging (debug.c) --------------------------------------------------------- */

enum { COLL_LOG_NONE = 0, COLL_LOG_WARN = 1, COLL_LOG_INFO = 2, COLL_LOG_TRACE = 3 };
int coll_log_level(void);
void coll_log(int level, int rank, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define COLL_WARN(rank, ...)                                                           \
  do {                                                                                 \
    if (coll_log_level() >= COLL_LOG_WARN) coll_log(COLL_LOG_WARN, rank, __VA_ARGS__); \
  } while (0)
#define COLL_INFO(rank, ...)                                                           \
  do {                                                                                 \
    if (coll_log_level() >= COLL_LOG_INFO) coll_log(COLL_LOG_INFO, rank, __VA_ARGS__); \
  } while (0)
#define COLL_TRACE(rank, ...)                                                            \
  do {                                                                                   \
    if (coll_log_level() >= COLL_LOG_TRACE) coll_log(COLL_LOG_TRACE, rank, __VA_ARGS__); \
  } while (0)

/* One spin-wait iteration: tells the core (and a hyperthread sibling) we are polling. */
static inline void coll_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* ---- environment (env.c) ----------------------------------------------------------- */

/* Integer from the environment, `def` when unset; false (and *out = def) if malformed. */
bool coll_env_int(const char *name, long def, long *out);
/* COLL_TIMEOUT_MS, default 600000 (10 minutes; 0 = wait forever). */
int coll_env_timeout_ms(void);
uint64_t coll_now_ns(void);

/* ---- waiting (backoff.c) ------------------------------------------------------------ */

/* Who else of the job may run on this rank's CPU, for coll_yield to tell a yield that
 * went to the job from one that went to something else (comm.c fills it at creation). */
enum { COLL_CPU_MATES_MAX = 16 };
typedef struct coll_cpu_mates {
  bool oversubscribed; /* more local ranks than CPUs: a long yield may be the job's work */
  /* This rank may run on one CPU only, and clock[] holds the CPU-time clocks of every
   * other process of the communicator that may run there (none of the others can). */
  _Atomic bool known; /* atomic: the tuner lowers it while it measures (exec/tune.c) */
  int n;
  clockid_t clock[COLL_CPU_MATES_MAX];
} coll_cpu_mates;

/* sched_yield(), unless a recent yield in this process kept it off the core for long
 * while nothing of the job ran (something outside the job holds the core): then false
 * at once, and the caller should sleep (futex) instead of yielding again. */
bool coll_yield(const coll_cpu_mates *m);

/* ---- time that went outside the job (foreign.c) ------------------------------------- */

/* CPU time of this process and of the mates `m` lists, ns; 0 if a clock cannot be read. */
uint64_t coll_job_cpu_ns(const coll_cpu_mates *m);
typedef struct coll_foreign_since {
  bool ok; /* false: this rank cannot tell (see coll_foreign_share) */
  uint64_t wall_ns, delay_ns, job_ns;
} coll_foreign_since;
/* Marks the start of a window, for the calling thread.  `mates_known`: m->known as it was
 * (the tuner lowers it while it measures). */
void coll_foreign_mark(const coll_cpu_mates *m, bool mates_known, coll_foreign_since *out);
/* The share (0..1) of the window's wall time in which the calling thread was ready to run
 * but its CPU ran something outside the job; -1 where that cannot be told (more ranks than
 * CPUs and the mates not known, no schedstat in this kernel). */
double coll_foreign_share(const coll_cpu_mates *m, bool mates_known,
                          const coll_foreign_since *since);

#endif
