/* test_ib_bed.c — the InfiniBand transport for real: a bounded part of the correctness
 * matrix (net_rank, NET_RANK_SMALL) over COLL_TRANSPORT=ib in the soft-RoCE test bed
 * (scripts/ib-bed.sh: QEMU guests with rdma_rxe on their NICs), and the faults over ib
 * (a SIGKILLed rank, a guest's link set down, netem loss) that must end in the right
 * result or a sentence naming the peer within the timeout.
 *
 * Skips, saying why, when the machine cannot run the bed (not root and packages missing,
 * no kernel package, QEMU refusing to start: ib-bed.sh's exit status 77) or when
 * COLL_IB_BED=0.  Each case runs ib-bed.sh as a child in its own process group with a
 * parent-death signal, so a Criterion timeout or crash still ends the bed, whose trap
 * kills every QEMU and removes its temporary folder; ib-bed.sh's own -t bound is shorter
 * than the case's timeout (the five cases' bounds add up to 1280 s, meson's is 1500 s;
 * they took about 8 minutes here).  Must never: count a skipped bed as passed, or leave QEMU or
 * a results folder behind.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
  int code;                 /* ib-bed.sh's exit status */
  int remote;               /* lines saying "remote error" */
  int synth;                /* Criterion's summary of a test program run in a guest: 2 of 2 */
  int ok, wrong, named;     /* lines "...: ok", "WRONG", and those naming `name` */
  int leftover_qp, said_77; /* "[gG rdma] ... type RC" lines; the skip reason was printed */
  char reason[512];         /* the last "ib-bed:" line (why it skipped or failed) */
} bed_run;

/* Runs scripts/ib-bed.sh with `args` (a shell word list) and reads its output. */
static bed_run bed(const char *args, const char *name) {
  bed_run r = {0};
  const char *e = getenv("COLL_IB_BED");
  if (e && strcmp(e, "0") == 0) cr_skip_test("COLL_IB_BED=0: the soft-RoCE bed is turned off");
  const char *src = getenv("COLL_TEST_SOURCE_DIR"), *build = getenv("COLL_TEST_BUILD_DIR");
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "B=%s; S=%s; exec $S/scripts/ib-bed.sh -q %s 2>&1", build ? build : ".",
           src ? src : ".", args);
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* the test died: the bed's trap tears down */
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    execl("/bin/bash", "bash", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  FILE *p = fdopen(fds[0], "r");
  char line[2048];
  while (fgets(line, sizeof line, p)) {
    fprintf(stderr, "  | %s", line);
    r.ok += strstr(line, ": ok") != NULL;
    r.wrong += strstr(line, "WRONG") != NULL;
    r.remote += strstr(line, "remote error") != NULL;
    r.synth += strstr(line, "Synthesis: Tested: 2 | Passing: 2 | Failing: 0") != NULL;
    if (name && strstr(line, name)) r.named++;
    if (strstr(line, " rdma] ") && strstr(line, "type RC")) r.leftover_qp++;
    if (strncmp(line, "ib-bed: ", 8) == 0) {
      size_t len = strcspn(line + 8, "\n");
      if (len >= sizeof r.reason) len = sizeof r.reason - 1;
      memcpy(r.reason, line + 8, len);
      r.reason[len] = 0;
    }
  }
  fclose(p);
  int st = 0;
  waitpid(pid, &st, 0);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  if (r.code == 77) cr_skip_test("the soft-RoCE bed cannot run here: %s", r.reason);
  return r;
}

/* The sanitizer build (scripts/test.sh runs the suite twice) runs only the matrix in the
 * bed, under ASan inside the guests: the faults once, in the plain build, keep CI's added
 * time near 5 minutes. */
#if defined(__SANITIZE_ADDRESS__)
#define PLAIN_BUILD_ONLY() \
  cr_skip_test("the faults run in the plain build; the sanitizer build runs the bed's matrix only")
#else
#define PLAIN_BUILD_ONLY() ((void)0)
#endif

/* The matrix's bound: the plain build's ranks take ~70 s of it; under ASan+UBSan they took
 * 126 s of a 150 s bound here and were killed at it in CI on a loaded machine, so the
 * sanitizer build, which runs only this case, gives it 330 s.  Every bound here is about
 * twice what the case took on this machine while CI ran beside it. */
#if defined(__SANITIZE_ADDRESS__)
#define MATRIX_BED_S "330"
#define MATRIX_TIMEOUT_S 400
#else
#define MATRIX_BED_S "200"
#define MATRIX_TIMEOUT_S 250
#endif

/* 2 guests x 1 rank: every byte between the ranks crosses rxe and the UDP wire. */
Test(ib_bed, matrix_2x1, .timeout = MATRIX_TIMEOUT_S) {
  bed_run r = bed("-k 2 -n 1 -t " MATRIX_BED_S " -e COLL_TRANSPORT=ib -e NET_RANK_SMALL=1 "
                  "-e NET_RANK_RDMA_CHECK=1 -e COLL_TIMEOUT_MS=60000 "
                  "-- $B/test/multihost/net_rank",
                  NULL);
  cr_assert_eq(r.code, 0, "the bed ended with %d: %s", r.code, r.reason);
  cr_assert_eq(r.ok, 2, "%d of 2 ranks said ok", r.ok);
  cr_assert_eq(r.leftover_qp, 0, "%d queue pairs were left after the job", r.leftover_qp);
}

/* 2 guests x 2 ranks, all over ib (loopback through rxe inside a guest): rank 1 is
 * SIGKILLed after a barrier; ranks 0, 2 and 3 must each return COLL_ERR_REMOTE naming
 * rank 1 within 2 s (net_rank's fault mode).  The victim's own status is not checked. */
Test(ib_bed, fault_sigkill, .timeout = 150) {
  PLAIN_BUILD_ONLY();
  bed_run r = bed("-k 2 -n 2 -t 100 -e COLL_TRANSPORT=ib -e NET_RANK_FAULT=kill "
                  "-e COLL_TIMEOUT_MS=20000 -- $B/test/multihost/net_rank",
                  NULL);
  cr_assert_eq(r.wrong, 0, "a survivor did not hear of rank 1's death in time");
  cr_assert_eq(r.ok, 3, "%d of 3 survivors said ok (the bed: %s)", r.ok, r.reason);
  cr_assert_eq(r.leftover_qp, 0, "%d queue pairs were left after the job", r.leftover_qp);
}

/* 2 guests x 1 rank all-reducing in a loop; guest 1's link goes down once both have
 * started (its hook waits for net_rank's marker file).  Both ranks must fail with a
 * sentence naming the other within COLL_TIMEOUT_MS (20 s) + 5 s — what the issue asks.
 * Most runs hear it from the fabric on both sides (COLL_ERR_REMOTE from an error
 * completion, ~0.1-1.5 s), but a rank with nothing posted towards the dead link when it
 * goes (waiting to receive) learns it only from its timeout: seen once in CI on a loaded
 * machine, so how many heard it from the fabric is logged, not asserted. */
Test(ib_bed, fault_link_down, .timeout = 150) {
  PLAIN_BUILD_ONLY();
  bed_run r = bed("-k 2 -n 1 -t 100 -e COLL_TRANSPORT=ib -e NET_RANK_FAULT=link "
                  "-e COLL_TIMEOUT_MS=20000 -d '[ $BED_GUEST = 1 ] || exit 0; "
                  "for i in $(seq 600); do [ -e /run/tmp/net_rank.started ] && break; "
                  "sleep 0.1; done; ip link set eth0 down' -- $B/test/multihost/net_rank",
                  NULL);
  cr_assert_eq(r.wrong, 0, "a rank did not fail with a sentence naming its peer in time");
  cr_assert_eq(r.ok, 2, "%d of 2 ranks said ok (the bed: %s)", r.ok, r.reason);
  cr_log_info("%d of 2 ranks heard of the dead link from the fabric, the rest from the timeout\n",
              r.remote);
}

/* 2 guests x 1 rank, netem dropping 2 % of each guest's packets and delaying the rest by
 * 1 ms: RC retransmits, and the matrix must come out right, with no queue pair or memory
 * region of a rank left after coll_comm_destroy (NET_RANK_RDMA_CHECK).  With
 * COLL_IB_RETRY_CNT=7, which rxe reads as "retransmit forever": at the default 6 rxe
 * gave up on this path (transport retry counter exceeded, the peer named) within half
 * a minute here, a failure the issue allows but one that shows nothing of retransmission. */
Test(ib_bed, fault_netem_loss, .timeout = 460) {
  PLAIN_BUILD_ONLY();
  bed_run r = bed("-k 2 -n 1 -t 400 -e COLL_TRANSPORT=ib -e NET_RANK_SMALL=1 "
                  "-e NET_RANK_RDMA_CHECK=1 -e COLL_TIMEOUT_MS=60000 -e COLL_IB_RETRY_CNT=7 "
                  "-p 'tc qdisc add dev eth0 root netem loss 2% delay 1ms' "
                  "-- $B/test/multihost/net_rank",
                  NULL);
  cr_assert_eq(r.code, 0, "the bed ended with %d: %s", r.code, r.reason);
  cr_assert_eq(r.ok, 2, "%d of 2 ranks said ok through 2 %% loss", r.ok);
}

/* test_ib's own device cases (ib_device::matrix_n2, matrix_n3: the matrix on 2 and 3
 * local ranks over COLL_TRANSPORT=ib, loopback through rxe, /dev/shm left clean), run
 * inside one guest, where they find the device they skip without on this host. */
Test(ib_bed, test_ib_device_cases_in_a_guest, .timeout = 270) {
  PLAIN_BUILD_ONLY();
  bed_run r = bed("-k 1 -n 1 -t 220 -e COLL_TEST_BUILD_DIR=$B -e COLL_TEST_SOURCE_DIR=$S "
                  "-e COLL_TUNE_FILE=none -- env -u RANK -u WORLD_SIZE -u MASTER_ADDR "
                  "-u MASTER_PORT -u LOCAL_RANK -u LOCAL_WORLD_SIZE $B/test/transport/test_ib "
                  "--jobs 1 --filter 'ib_device/*'",
                  NULL);
  cr_assert_eq(r.code, 0, "test_ib in the guest ended with %d: %s", r.code, r.reason);
  cr_assert_eq(r.synth, 1, "test_ib's device cases did not both pass in the guest");
}
