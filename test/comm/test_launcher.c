/* test_launcher.c — joining jobs that other launchers started.
 *
 * Runs test/comm/env_rank (built beside this test) under Debian's Open MPI `mpirun -np 4`
 * with only the rendezvous address added, and under hand-made torchrun-, Slurm- and
 * PMI-style environments.  Each child must print "ok".  Skips, saying why, when mpirun
 * is not installed.  Also: the tests' leak check (common/coll_test.c) counts only its own
 * job's segments, and still sees one leaked on purpose.  And "localhost" as the rendezvous host
 * where the resolver does not know it (no /etc/hosts).
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll_test.h"
#include "internal.h" /* comm->secret names the job's segments */

static const char *prog(void) {
  static char path[1024];
  const char *b = getenv("COLL_TEST_BUILD_DIR");
  snprintf(path, sizeof path, "%s/test/comm/env_rank", b ? b : ".");
  return path;
}


/* Runs a shell command with a time limit; returns its output's count of "ok" lines. */
static int run_count_ok(const char *cmd, int *status) {
  char full[4096];
  snprintf(full, sizeof full, "timeout -s KILL 60 %s 2>&1", cmd);
  FILE *p = popen(full, "r");
  cr_assert(p);
  char line[512];
  int ok = 0;
  while (fgets(line, sizeof line, p)) {
    fprintf(stderr, "  | %s", line);
    if (strstr(line, ": ok")) ok++;
  }
  *status = pclose(p);
  return ok;
}

Test(launcher, mpirun_np4, .timeout = 120) {
  /* Debian's Open MPI, even where MPICH owns the `mpirun` alternative. */
  const char *mpirun = system("command -v mpirun.openmpi >/dev/null 2>&1") == 0 ? "mpirun.openmpi"
                       : system("command -v mpirun >/dev/null 2>&1") == 0       ? "mpirun"
                                                                                : NULL;
  if (!mpirun) cr_skip_test("mpirun not found: install Debian's openmpi-bin to run this test");
  /* A secret of this run's own, so that the leak check below can name the job's
   * segments (another libcoll job on the machine makes and removes its own). */
  char secret[64], prefix[40];
  snprintf(secret, sizeof secret, "test-launcher-%d", (int)getpid());
  setenv("COLL_SECRET", secret, 1);
  t_env_job_prefix(prefix, sizeof prefix, "", 4);
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "%s --allow-run-as-root --oversubscribe -np 4 -x COLL_ADDR=127.0.0.1:%d "
           "-x COLL_SECRET %s",
           mpirun, t_free_port(), prog());
  int st;
  int ok = run_count_ok(cmd, &st);
  cr_assert_eq(ok, 4, "expected 4 ranks to say ok (exit %d)", st);
  unsetenv("COLL_SECRET");
  cr_assert_eq(st, 0);
  char left[512];
  int k = t_prefix_segments(prefix, 1, left, sizeof left);
  cr_assert_eq(k, 0, "segments of the job left in /dev/shm: %s", left);
}

/* Runs env_rank on n ranks with the rendezvous on `port` (MASTER_ADDR=127.0.0.1, or
 * COLL_ADDR=host:port): every rank must say ok, and no segment of the job be left. */
static void env_job_on(const char *rank_var, const char *size_var, int n, bool master_vars,
                       int port, const char *host) {
  pid_t pids[8];
  int pfd[2];
  cr_assert_eq(pipe(pfd), 0);
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      char v[32];
      snprintf(v, sizeof v, "%d", r);
      setenv(rank_var, v, 1);
      snprintf(v, sizeof v, "%d", n);
      setenv(size_var, v, 1);
      if (master_vars) {
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        snprintf(v, sizeof v, "%d", port);
        setenv("MASTER_PORT", v, 1);
      } else {
        char a[96];
        snprintf(a, sizeof a, "%s:%d", host, port);
        setenv("COLL_ADDR", a, 1);
      }
      dup2(pfd[1], 1);
      alarm(60);
      execl(prog(), prog(), (char *)NULL);
      _exit(127);
    }
  }
  close(pfd[1]);
  FILE *f = fdopen(pfd[0], "r");
  char line[256];
  int ok = 0;
  while (fgets(line, sizeof line, f)) ok += strstr(line, ": ok") != NULL;
  fclose(f);
  int bad = 0;
  for (int r = 0; r < n; r++) {
    int st;
    waitpid(pids[r], &st, 0);
    bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  cr_assert_eq(ok, n, "%s/%s: %d of %d ranks ok", rank_var, size_var, ok, n);
  cr_assert_eq(bad, 0);
  /* The job's segments (its secret is derived from the rendezvous and the size, as the
   * ranks derived it: init_env.c) must all be gone. */
  char addr[64], prefix[40], left[512];
  snprintf(addr, sizeof addr, "%s:%d", master_vars ? "127.0.0.1" : host, port);
  t_env_job_prefix(prefix, sizeof prefix, addr, n);
  int k = t_prefix_segments(prefix, 1, left, sizeof left);
  cr_assert_eq(k, 0, "segments of the job left in /dev/shm: %s", left);
}

static void env_job(const char *rank_var, const char *size_var, int n, bool master_vars) {
  env_job_on(rank_var, size_var, n, master_vars, t_free_port(), "localhost");
}

Test(launcher, torchrun_style_env, .timeout = 90) { env_job("RANK", "WORLD_SIZE", 3, true); }

/* COLL_ADDR=localhost:port where the resolver does not know "localhost" (a container or
 * chroot without /etc/hosts, as a minimal debootstrap is): the ranks take the loopback
 * address (RFC 6761).  The test hides /etc/hosts behind an empty file in a mount
 * namespace of its own (Criterion runs each test in its own process), so it needs root. */
Test(launcher, localhost_without_etc_hosts, .timeout = 90) {
  if (geteuid() != 0) cr_skip_test("needs root for a private mount namespace");
  cr_assert_eq(unshare(CLONE_NEWNS), 0, "unshare: %s", strerror(errno));
  cr_assert_eq(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), 0, "%s", strerror(errno));
  char empty[] = "/tmp/coll-empty-hosts-XXXXXX";
  int fd = mkstemp(empty);
  cr_assert_geq(fd, 0);
  close(fd);
  int m = mount(empty, "/etc/hosts", NULL, MS_BIND, NULL);
  unlink(empty); /* the mount keeps the inode; nothing is left behind */
  cr_assert_eq(m, 0, "bind-mounting over /etc/hosts: %s", strerror(errno));
  env_job_on("PMI_RANK", "PMI_SIZE", 3, false, t_free_port(), "localhost");
}
Test(launcher, slurm_style_env, .timeout = 90) {
  env_job("SLURM_PROCID", "SLURM_NTASKS", 2, false);
}
Test(launcher, pmi_style_env, .timeout = 90) { env_job("PMI_RANK", "PMI_SIZE", 4, false); }

/* ---- the leak check counts the job's own segments, and sees a leak ------------------ */

/* Rank 0 leaves a segment named like one of its job's (coll-<job>-leak0) behind. */
static int leak_one(coll_comm_t comm, int rank, int n, void *arg) {
  (void)n;
  (void)arg;
  if (rank != 0) return 0;
  char prefix[40], name[64];
  coll_job_prefix(prefix, sizeof prefix, comm->secret);
  snprintf(name, sizeof name, "/%sleak0", prefix);
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return t_failf("rank 0: shm_open(%s) failed", name);
  close(fd);
  return 0;
}

static int clean_job(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  int x = rank + 1, y = 0;
  if (coll_all_reduce(&x, &y, 1, COLL_INT32, COLL_SUM, comm, NULL) != COLL_OK ||
      y != n * (n + 1) / 2)
    return t_failf("rank %d: all-reduce gave %d", rank, y);
  return 0;
}

/* A segment of another libcoll job (a name no secret of ours can have: its job part is
 * not hex) exists throughout: it must not count against our jobs. */
static const char *foreign = "/coll-zzzzzzzzzzzzzzzz-yyyyyyyyyyyyyyyy-0";

Test(launcher, leak_check_counts_only_its_job, .timeout = 60) {
  shm_unlink(foreign);
  int fd = shm_open(foreign, O_CREAT | O_EXCL | O_RDWR, 0600);
  cr_assert_geq(fd, 0, "cannot make the foreign segment");
  close(fd);
  char why[256] = "", left[512];
  int rc = t_launch(2, clean_job, NULL, 30000, why, sizeof why);
  int k = t_job_leftovers(left, sizeof left);
  int foreign_there = t_prefix_segments("coll-zzzzzzzzzzzzzzzz-", 1, NULL, 0);
  cr_assert_eq(rc, 0, "%s", why);
  cr_assert_eq(k, 0, "a clean job was charged with %d segment(s): %s", k, left);
  cr_assert_eq(foreign_there, 1, "the check removed or missed another job's segment");
}

Test(launcher, leak_check_sees_a_leaked_segment, .timeout = 60) {
  char why[256] = "", left[512];
  int rc = t_launch(2, leak_one, NULL, 30000, why, sizeof why);
  cr_assert_eq(rc, 0, "%s", why);
  int k = t_job_leftovers(left, sizeof left);
  cr_assert_eq(k, 1, "the leaked segment was not seen (%d: %s)", k, left);
  cr_assert(strstr(left, "leak0"), "the leak is not named: %s", left);
  /* Seen, and cleaned up: asking again finds nothing new in /dev/shm. */
  coll_unique_id id = coll_launch_unique_id();
  coll_id_fields f;
  char prefix[40];
  cr_assert_eq(coll_id_decode(&id, &f, why, sizeof why), COLL_OK);
  coll_job_prefix(prefix, sizeof prefix, f.secret);
  cr_assert_eq(t_prefix_segments(prefix, 1, NULL, 0), 0, "the leaked segment is still there");
}

/* ---- stale segments: a dead job's are replaced, a live job's refused ---------------- */

/* The owner record (coll_seg_owner) of the segment at /dev/shm`name`: its pid, 0 while
 * unstamped or absent. */
static int32_t stamped_pid(const char *name) {
  int fd = shm_open(name, O_RDONLY, 0);
  if (fd < 0) return 0;
  struct stat st;
  int32_t pid = 0;
  if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(coll_seg_owner)) {
    void *m = mmap(NULL, sizeof(coll_seg_owner), PROT_READ, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) {
      pid = atomic_load(&((coll_seg_owner *)m)->pid);
      munmap(m, sizeof(coll_seg_owner));
    }
  }
  close(fd);
  return pid;
}

/* Env-based init without COLL_SECRET derives the same secret every time from the same
 * environment, so a job killed during init leaves /coll-<secret>-0 behind, and the next
 * run with that environment used to fail with EEXIST.  Rank 0 of a 2-rank job alone makes
 * its segment and waits for rank 1 at the first exchange; it is killed there; then the
 * whole job runs with the same environment and must succeed. */
Test(launcher, stale_segment_of_a_killed_job_is_replaced, .timeout = 90) {
  unsetenv("COLL_SECRET");
  int port = t_free_port();
  char addr[64], prefix[40], name[96];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  uint8_t secret[COLL_SECRET_BYTES];
  coll_env_secret(secret, addr, 2);
  coll_job_prefix(prefix, sizeof prefix, secret);
  coll_shm_segment_name(name, sizeof name, secret, "", 0);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("COLL_ADDR", addr, 1);
    setenv("COLL_TIMEOUT_MS", "60000", 1);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    alarm(60);
    execl(prog(), prog(), (char *)NULL);
    _exit(127);
  }
  /* Until the segment is made and stamped by the child (bounded: 30 s). */
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int32_t owner = 0;
  for (;;) {
    if ((owner = stamped_pid(name)) != 0) break;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 30) break;
    struct timespec nap = {0, 2000000L};
    nanosleep(&nap, NULL);
  }
  kill(pid, SIGKILL);
  int st;
  waitpid(pid, &st, 0);
  if (owner == 0) t_prefix_segments(prefix, 1, NULL, 0);
  cr_assert_eq(owner, pid, "rank 0 never made its segment %s (owner %d)", name, (int)owner);
  cr_assert_eq(t_prefix_segments(prefix, 0, NULL, 0), 1, "the killed rank left no segment");
  /* The same environment again: rank 0 finds the dead job's segment and replaces it. */
  env_job_on("RANK", "WORLD_SIZE", 2, false, port, "127.0.0.1");
}

/* A segment whose owner runs (here: this process) is refused with a sentence naming it;
 * one whose pid now belongs to a process that started at another time (pid reuse) is
 * replaced. */
Test(launcher, segment_of_a_live_owner_is_refused) {
  char name[64];
  snprintf(name, sizeof name, "/coll-test-live-%d", (int)getpid());
  shm_unlink(name);
  void *a = NULL, *b = NULL;
  cr_assert_eq(coll_shm_create(NULL, name, 4096, &a), COLL_OK, "%s", coll_comm_last_error(NULL));
  coll_result r = coll_shm_create(NULL, name, 4096, &b);
  char want[32], msg[512];
  snprintf(want, sizeof want, "pid %d", (int)getpid());
  snprintf(msg, sizeof msg, "%s", coll_comm_last_error(NULL));
  /* Same pid, another start time: the process that made it is gone. */
  ((coll_seg_owner *)a)->start += 12345;
  coll_result r2 = coll_shm_create(NULL, name, 4096, &b);
  shm_unlink(name);
  munmap(a, 4096);
  if (b) munmap(b, 4096);
  cr_assert_eq(r, COLL_ERR_SYSTEM, "a live owner's segment was taken over");
  cr_assert(strstr(msg, want) && strstr(msg, "running"),
            "the sentence does not name the live "
            "owner: %s",
            msg);
  cr_assert_eq(r2, COLL_OK, "a reused pid's segment was not replaced: %s",
               coll_comm_last_error(NULL));
}

/* ---- oversubscription is counted on the CPUs the ranks may use --------------------- */

/* Each rank writes what its communicator concluded: [4r] oversubscribed, [4r+1] the
 * local ranks it counted, [4r+2] whether it knows its CPU's mates (backoff.c), [4r+3]
 * how many it has. */
static int report_placement(coll_comm_t comm, int rank, int n, void *arg) {
  (void)n;
  int *out = arg;
  out[4 * rank] = comm->oversubscribed;
  out[4 * rank + 1] = comm->local_ranks;
  out[4 * rank + 2] = comm->mates.known;
  out[4 * rank + 3] = comm->mates.n;
  return 0;
}

/* N ranks launched from this process as it is placed now: every one must agree that the
 * job is oversubscribed exactly when N exceeds the CPUs it may use.  Bound (`bound`: the
 * launcher puts rank r on the (r mod cpus)-th CPU), or on one CPU, a rank knows its
 * mates, the ranks on its CPU; unbound on several CPUs it cannot. */
static void expect_placement(int n, int cpus, bool bound, const char *how) {
  int *out = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(out, MAP_FAILED);
  for (int i = 0; i < 4 * n; i++) out[i] = -1;
  char why[256] = "";
  int rc = t_launch(n, report_placement, out, 30000, why, sizeof why);
  int got[32];
  memcpy(got, out, sizeof(int) * (size_t)(4 * n));
  munmap(out, 4096);
  cr_assert_eq(rc, 0, "%s: %s", how, why);
  for (int r = 0; r < n; r++) {
    cr_assert_eq(got[4 * r + 1], n, "%s: rank %d counted %d local ranks", how, r, got[4 * r + 1]);
    cr_assert_eq(got[4 * r], n > cpus, "%s: rank %d of %d on %d CPU(s) says oversubscribed=%d", how,
                 r, n, cpus, got[4 * r]);
    bool one_cpu = bound || cpus == 1;
    int mates = 0;
    for (int q = 0; q < n; q++) mates += q != r && q % cpus == r % cpus;
    cr_assert_eq(got[4 * r + 2], one_cpu, "%s: rank %d says its mates are known=%d", how, r,
                 got[4 * r + 2]);
    if (one_cpu)
      cr_assert_eq(got[4 * r + 3], mates, "%s: rank %d counted %d mates on its CPU, not %d", how, r,
                   got[4 * r + 3], mates);
  }
}

/* `taskset -c 0` (or a container's cpuset) around a job: its ranks share one CPU however
 * many the machine has online, and must not spin while the peer they wait for needs that
 * CPU.  Then the same job placed on every CPU it may use, bound (the launcher's default)
 * and unbound. */
Test(launcher, oversubscription_counts_the_cpus_ranks_may_use, .timeout = 90) {
  cpu_set_t all, one;
  cr_assert_eq(sched_getaffinity(0, sizeof all, &all), 0);
  int cpus = CPU_COUNT(&all);
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &all)) {
      CPU_SET(c, &one);
      break;
    }
  cr_assert_eq(sched_setaffinity(0, sizeof one, &one), 0);
  expect_placement(2, 1, true, "2 ranks under a 1-CPU affinity");
  cr_assert_eq(sched_setaffinity(0, sizeof all, &all), 0);
  expect_placement(2, cpus, true, "2 ranks bound");
  expect_placement(3, cpus, true, "3 ranks bound");
  setenv("COLL_LAUNCH_BIND", "0", 1);
  expect_placement(3, cpus, false, "3 ranks unbound");
  unsetenv("COLL_LAUNCH_BIND");
}
