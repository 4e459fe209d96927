/* launch.c — the local launcher: fork N ranks, run a function in each, reap them all.
 *
 * The parent makes the unique id (so the rendezvous root runs in the parent, which
 * outlives every rank), forks, and only then starts the root's thread: a process with a
 * second thread that forks can hand its child a lock held forever (ASan's allocator in
 * GCC 12 has no fork handler; CI hung that way).  The thread is stopped and joined before
 * returning, so the next launch forks from a single-threaded process again.  It waits on
 * pidfds so it notices at once when a rank
 * crashes — then kills the others rather than letting them wait for a peer that will
 * never come.  Afterwards it removes any shared segment of the job left in /dev/shm
 * (normally none: ranks unlink their segments during init; this covers a rank killed
 * during init itself).  When every rank can have a CPU of its own, rank r is bound to
 * the r-th allowed CPU (bind_rank).  Must never leave a child running or unreaped when
 * it returns.
 */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll_launch.h"
#include "internal.h"

#define PIDFD_RANKS 256 /* ranks watched by a pidfd each */
#define POLL_MS 50      /* otherwise: how often the parent looks for ended ranks */

static coll_unique_id launched_id;

coll_unique_id coll_launch_unique_id(void) { return launched_id; }

static int pidfd_open_(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

/* What the last launch's clean-up found: segments of the job still in /dev/shm once
 * every rank had exited.  Normally none (ranks unlink theirs during init); tests assert
 * that, because the clean-up itself would otherwise hide a leak. */
static int leftover_count;
static char leftover_names[512];

static void cleanup_segments(const coll_unique_id *id) {
  leftover_count = 0;
  leftover_names[0] = 0;
  coll_id_fields f;
  char why[64];
  if (coll_id_decode(id, &f, why, sizeof why) != COLL_OK) return;
  char prefix[32];
  coll_job_prefix(prefix, sizeof prefix, f.secret);
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  struct dirent *e;
  size_t used = 0;
  while ((e = readdir(d)))
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
      char name[300];
      snprintf(name, sizeof name, "/%s", e->d_name);
      if (shm_unlink(name) != 0) continue;
      leftover_count++;
      if (used < sizeof leftover_names) {
        int k = snprintf(leftover_names + used, sizeof leftover_names - used, "%s%s",
                         used ? " " : "", e->d_name);
        if (k > 0) used += (size_t)k;
      }
    }
  closedir(d);
}

int coll_launch_leftovers(char *names, size_t len) {
  if (names && len) snprintf(names, len, "%s", leftover_names);
  return leftover_count;
}

/* Rank r on the (r mod C)-th of the C CPUs this process may use (as mpirun binds to
 * cores by default; COLL_LAUNCH_BIND=0 leaves placement to the kernel).  Unbound, the
 * scheduler often kept both ranks of a 2-rank job on one core of this busy 2-vCPU VM, and
 * every wait then spun out its budget before the peer could run: a 1 KiB all-to-all took
 * ~30 us in 4 runs of 6, against 0.2-1.7 us bound (Open MPI 0.4-2.2).  With more ranks
 * than CPUs (mpirun binds none then) round-robin still pays: ring neighbours land on
 * different cores every run.  On 2 CPUs, 4- and 8-rank rings alternated 9 times each way:
 * bound, every median was lower (1-35 %) and the slowest run 1.5-2.0x the fastest,
 * against 1.3-4.2x unbound (lab/perf-log.md, "Placement"). */
static void bind_rank(int r) {
  const char *e = getenv("COLL_LAUNCH_BIND");
  if (e && strcmp(e, "0") == 0) return;
  cpu_set_t allowed, one;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 1) return;
  r %= CPU_COUNT(&allowed);
  for (int c = 0, k = 0; c < CPU_SETSIZE; c++) {
    if (!CPU_ISSET(c, &allowed) || k++ != r) continue;
    CPU_ZERO(&one);
    CPU_SET(c, &one);
    sched_setaffinity(0, sizeof one, &one); /* best effort: placement, not correctness */
    return;
  }
}

/* COLL_LAUNCH_RANKS_PER_HOST=k (or a list "k0,k1,...": host h holds k_h ranks, the last
 * number repeating): rank r is told it runs on host "launch-host-<h>" (COLL_HOST_ID,
 * comm.c), ranks in order filling host 0 first.  One machine then looks like several
 * hosts to the library: shared memory inside each, the network (tcp over loopback)
 * between them, and the host-aware algorithms see the layout.  Unset: nothing is set
 * (ranks keep any COLL_HOST_ID they were given).  A malformed list is ignored. */
static void emulate_host(int r) {
  const char *e = getenv("COLL_LAUNCH_RANKS_PER_HOST");
  if (!e || !*e) return;
  int h = 0, before = 0, k = 0;
  const char *p = e;
  for (;;) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 1 || v > 1 << 20 || (*end && *end != ',')) return;
    k = (int)v;
    if (r < before + k) break;
    before += k, h++;
    if (*end == ',') {
      p = end + 1;
      continue;
    }
    h += (r - before) / k; /* the last number repeats */
    break;
  }
  char name[48];
  snprintf(name, sizeof name, "launch-host-%d", h);
  setenv("COLL_HOST_ID", name, 1);
}

static int launch(int nranks, coll_rank_fn fn, void *arg, int timeout_ms, char *why, size_t why_len,
                  bool raw) {
  char dummy[8];
  if (!why) {
    why = dummy;
    why_len = sizeof dummy;
  }
  why[0] = 0;
  if (nranks < 1 || !fn) {
    snprintf(why, why_len, "coll_launch_local: need nranks >= 1 and a function");
    return 2;
  }
  coll_unique_id id;
  coll_root *root = NULL;
  if (coll_make_unique_id(&id, &root) != COLL_OK) {
    snprintf(why, why_len, "coll_launch_local: %s", coll_comm_last_error(NULL));
    return 2;
  }
  launched_id = id;
  pid_t *pids = calloc((size_t)nranks, sizeof *pids);
  struct pollfd *pfs = calloc((size_t)nranks, sizeof *pfs);
  if (!pids || !pfs) {
    coll_bootstrap_root_discard(root);
    free(pids);
    free(pfs);
    snprintf(why, why_len, "coll_launch_local: out of memory");
    return 2;
  }
  fflush(stdout);
  fflush(stderr);
  int status = 0, alive = 0;
  for (int r = 0; r < nranks; r++) {
    pid_t pid = fork();
    if (pid == 0) {
      coll_bootstrap_root_forget(root);
      /* The parent's watches on the ranks forked before this one are not this rank's:
       * with a thousand ranks they would be most of its descriptors. */
      for (int o = 0; o < r; o++)
        if (pfs[o].fd >= 0) close(pfs[o].fd);
      /* The parent's bookkeeping is not the rank's either: a leak check in the rank
       * (LeakSanitizer, which tests run) would count it once the compiler no longer
       * keeps the pointers on the stack. */
      free(pids);
      free(pfs);
      bind_rank(r);
      emulate_host(r);
      char buf[16];
      snprintf(buf, sizeof buf, "%d", r);
      setenv("COLL_LAUNCH_RANK", buf, 1);
      snprintf(buf, sizeof buf, "%d", nranks);
      setenv("COLL_LAUNCH_NRANKS", buf, 1);
      int rc;
      if (raw) {
        rc = fn(NULL, r, nranks, arg);
      } else {
        coll_comm_t comm;
        coll_result cr = coll_comm_init_rank(&comm, nranks, id, r);
        if (cr != COLL_OK) {
          fprintf(stderr, "rank %d: init failed: %s: %s\n", r, coll_result_string(cr),
                  coll_comm_last_error(NULL));
          rc = 3;
        } else {
          rc = fn(comm, r, nranks, arg);
          coll_comm_destroy(comm);
        }
      }
      fflush(stdout);
      fflush(stderr);
      _exit(rc & 0xff);
    }
    if (pid < 0) {
      snprintf(why, why_len, "coll_launch_local: fork failed for rank %d: %s", r, strerror(errno));
      status = 2;
      break;
    }
    pids[r] = pid;
    /* A pidfd per rank wakes the wait below at once when a rank ends; past PIDFD_RANKS
     * the parent would spend the descriptors the bootstrap root (in this process)
     * needs, so larger jobs are polled every POLL_MS instead. */
    pfs[r] = (struct pollfd){.fd = nranks <= PIDFD_RANKS ? pidfd_open_(pid) : -1, .events = POLLIN};
    alive++;
  }
  if (status == 0) {
    char rwhy[256];
    if (coll_bootstrap_root_run(root, false, rwhy, sizeof rwhy) != COLL_OK) {
      snprintf(why, why_len, "coll_launch_local: %s", rwhy);
      status = 2;
    }
  } else {
    coll_bootstrap_root_discard(root);
  }
  if (status != 0) root = NULL;
  uint64_t end = timeout_ms > 0 ? coll_now_ns() + (uint64_t)timeout_ms * 1000000u : 0;
  bool killed = status != 0;
  if (killed)
    for (int r = 0; r < nranks; r++)
      if (pids[r] > 0) kill(pids[r], SIGKILL);
  while (alive > 0) {
    int wait_ms = nranks <= PIDFD_RANKS ? 1000 : POLL_MS;
    if (end && !killed) {
      uint64_t now = coll_now_ns();
      if (now >= end) {
        if (!status) {
          status = 124;
          snprintf(why, why_len, "job of %d ranks ran longer than %d ms: killed", nranks,
                   timeout_ms);
        }
        for (int r = 0; r < nranks; r++)
          if (pids[r] > 0) kill(pids[r], SIGKILL);
        killed = true;
      } else {
        int left = (int)((end - now) / 1000000u) + 1;
        if (left < wait_ms) wait_ms = left;
      }
    }
    poll(pfs, (nfds_t)nranks, wait_ms);
    for (int r = 0; r < nranks; r++) {
      if (pids[r] <= 0) continue;
      int st;
      pid_t got = waitpid(pids[r], &st, WNOHANG);
      if (got != pids[r]) continue;
      pids[r] = 0;
      if (pfs[r].fd >= 0) close(pfs[r].fd);
      pfs[r].fd = -1;
      alive--;
      int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (code != 0 && !status) {
        status = code;
        if (WIFEXITED(st))
          snprintf(why, why_len, "rank %d exited with status %d", r, code);
        else
          snprintf(why, why_len, "rank %d was killed by signal %d (%s)", r, WTERMSIG(st),
                   strsignal(WTERMSIG(st)));
      }
      if (code != 0 && !killed) {
        for (int o = 0; o < nranks; o++)
          if (pids[o] > 0) kill(pids[o], SIGKILL);
        killed = true;
      }
    }
  }
  coll_bootstrap_root_stop(root);
  free(pids);
  free(pfs);
  cleanup_segments(&id);
  return status;
}

int coll_launch_local(int nranks, coll_rank_fn fn, void *arg, int timeout_ms, char *why,
                      size_t why_len) {
  return launch(nranks, fn, arg, timeout_ms, why, why_len, false);
}

int coll_launch_local_raw(int nranks, coll_rank_fn fn, void *arg, int timeout_ms, char *why,
                          size_t why_len) {
  return launch(nranks, fn, arg, timeout_ms, why, why_len, true);
}
