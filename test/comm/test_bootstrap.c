/* test_bootstrap.c — hostile connections to a listening bootstrap root, with a job running.
 *
 * The root is made here with a held id (listening, no thread), the ranks are forked and
 * wait on a pipe, then the root's thread starts and this process plays the attacker:
 * strangers without the secret, random bytes, truncated messages, connections that say
 * nothing, and (with the secret) a length over the limit.  The root must drop each of
 * them, never crash, and the real job must still complete — or, for a "rank" whose
 * length was refused, fail at once with a sentence instead of hanging.  Every child has
 * alarm() as a last resort and is killed and reaped on every path.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap_wire.h"
#include "coll_test.h"
#include "internal.h"

#define MAXR 4

typedef struct {
  coll_unique_id id;
  coll_id_fields f;
  coll_root *root;
  int n;
  pid_t pid[MAXR];
  int gate[2]; /* closing the write end lets the ranks join */
  int out[2];  /* ranks -> parent: their result lines */
} job;

/* A real rank: join, all-reduce, check, report one line. */
static int rank_main(job *j, int rank) {
  alarm(60);
  coll_bootstrap_root_forget(j->root);
  close(j->gate[1]);
  close(j->out[0]);
  char c;
  while (read(j->gate[0], &c, 1) > 0) {}
  coll_comm_t comm;
  char line[600];
  coll_result r = coll_comm_init_rank(&comm, j->n, j->id, rank);
  if (r != COLL_OK) {
    snprintf(line, sizeof line, "rank %d init %s: %s\n", rank, coll_result_string(r),
             coll_comm_last_error(NULL));
    if (write(j->out[1], line, strlen(line)) < 0) return 3;
    return 2;
  }
  int x[64];
  for (int i = 0; i < 64; i++) x[i] = rank + i;
  r = coll_all_reduce(x, x, 64, COLL_INT32, COLL_SUM, comm, NULL);
  int bad = 0;
  for (int i = 0; i < 64; i++) bad += x[i] != j->n * (j->n - 1) / 2 + j->n * i;
  snprintf(line, sizeof line, "rank %d %s\n", rank, r == COLL_OK && !bad ? "ok" : "WRONG");
  coll_comm_destroy(comm);
  if (write(j->out[1], line, strlen(line)) < 0) return 3;
  return r == COLL_OK && !bad ? 0 : 1;
}

static void start(job *j, int n) {
  memset(j, 0, sizeof *j);
  j->n = n;
  setenv("COLL_TIMEOUT_MS", "4000", 1);
  setenv("COLL_TRANSPORT", "auto", 1);
  cr_assert_eq(coll_make_unique_id(&j->id, &j->root), COLL_OK, "%s", coll_comm_last_error(NULL));
  char why[200];
  cr_assert_eq(coll_id_decode(&j->id, &j->f, why, sizeof why), COLL_OK, "%s", why);
  cr_assert_eq(pipe(j->gate), 0);
  cr_assert_eq(pipe(j->out), 0);
  for (int r = 0; r < n; r++) {
    j->pid[r] = fork();
    cr_assert_neq(j->pid[r], -1);
    if (j->pid[r] == 0) _exit(rank_main(j, r));
  }
  close(j->gate[0]);
  close(j->out[1]);
  /* Only now a thread: every rank is forked. */
  cr_assert_eq(coll_bootstrap_root_run(j->root, false, why, sizeof why), COLL_OK, "%s", why);
}

/* Lets the ranks join; collects their lines; reaps them; stops the root. */
static int finish(job *j, char *lines, size_t len) {
  close(j->gate[1]);
  size_t got = 0;
  ssize_t k;
  while (got + 1 < len && (k = read(j->out[0], lines + got, len - 1 - got)) > 0) got += (size_t)k;
  lines[got] = 0;
  close(j->out[0]);
  int failed = 0;
  for (int r = 0; r < j->n; r++) {
    int st;
    waitpid(j->pid[r], &st, 0);
    failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  coll_bootstrap_root_stop(j->root); /* joins the root's thread: it must still be alive */
  fprintf(stderr, "%s", lines);
  return failed;
}

static int dial(const job *j) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons(j->f.port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect: %s", strerror(errno));
  return fd;
}

static void say(int fd, const void *p, size_t n) {
  cr_assert_eq(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n, "send: %s", strerror(errno));
}

/* True when the root closed fd within ms (EOF or reset), reading and discarding. */
static bool closed_by_root(int fd, int ms) {
  struct pollfd pf = {.fd = fd, .events = POLLIN};
  uint8_t junk[256];
  while (poll(&pf, 1, ms) == 1) {
    ssize_t k = recv(fd, junk, sizeof junk, 0);
    if (k == 0 || (k < 0 && errno == ECONNRESET)) return true;
    if (k < 0) return false;
  }
  return false;
}

/* Strangers and garbage while the job is waiting to join: all dropped, the job fine. */
Test(bootstrap, strangers_and_garbage_are_dropped_job_completes, .timeout = 60) {
  job j;
  start(&j, 3);
  uint64_t seed = 42;
  int keep[8], nkeep = 0;
  /* 1. a well-formed auth message with the wrong secret */
  uint8_t bad_secret[16], auth[COLL_AUTH_BYTES];
  memcpy(bad_secret, j.f.secret, 16);
  bad_secret[15] ^= 1;
  coll_auth_build(auth, bad_secret, 0, 3);
  int fd = dial(&j);
  say(fd, auth, sizeof auth);
  cr_expect(closed_by_root(fd, 3000), "the root kept a connection with the wrong secret");
  close(fd);
  /* 2. right secret, wrong magic / version */
  coll_auth_build(auth, j.f.secret, 0, 3);
  auth[0] ^= 0xff;
  fd = dial(&j);
  say(fd, auth, sizeof auth);
  cr_expect(closed_by_root(fd, 3000), "the root kept a connection with a bad magic");
  close(fd);
  /* 3. random bytes, 50 connections of 1..4096 bytes each */
  for (int c = 0; c < 50; c++) {
    uint8_t buf[4096];
    size_t n = 1 + t_rand(&seed) % sizeof buf;
    for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)t_rand(&seed);
    fd = dial(&j);
    say(fd, buf, n);
    if (n >= COLL_AUTH_BYTES)
      cr_expect(closed_by_root(fd, 3000), "the root kept a connection that sent %zu random bytes",
                n);
    close(fd);
  }
  /* 4. truncated: part of a valid auth message, the connection left open (the root
   *    must not wait for it: the job goes on) and closed in the middle later */
  coll_auth_build(auth, j.f.secret, 1, 3);
  for (int c = 0; c < 3; c++) {
    keep[nkeep] = dial(&j);
    say(keep[nkeep], auth, 5 + 9 * (size_t)c);
    nkeep++;
  }
  /* 5. connections that say nothing at all */
  for (int c = 0; c < 3; c++) keep[nkeep++] = dial(&j);
  /* 6. connect and hang up at once */
  for (int c = 0; c < 10; c++) close(dial(&j));
  char lines[2048];
  int failed = finish(&j, lines, sizeof lines);
  for (int c = 0; c < nkeep; c++) close(keep[c]);
  cr_assert_eq(failed, 0, "the job failed next to the attackers:\n%s", lines);
  cr_assert(strstr(lines, "rank 0 ok") && strstr(lines, "rank 1 ok") && strstr(lines, "rank 2 ok"),
            "%s", lines);
}

/* With the secret, a length over the limit: the root drops that connection without
 * allocating, and the real rank that waits for it fails at once with a sentence. */
Test(bootstrap, oversize_length_is_refused, .timeout = 60) {
  job j;
  start(&j, 2);            /* rank 1 is played by this process; rank 0 is real... */
  kill(j.pid[1], SIGKILL); /* ...so the forked rank 1 goes */
  waitpid(j.pid[1], NULL, 0);
  j.pid[1] = 0;
  uint8_t auth[COLL_AUTH_BYTES], len[4];
  coll_auth_build(auth, j.f.secret, 1, 2);
  int fd = dial(&j);
  say(fd, auth, sizeof auth);
  coll_put32(len, 0xfffffff0u);
  say(fd, len, 4);
  cr_expect(closed_by_root(fd, 3000), "the root kept a rank that announced a 4 GiB blob");
  close(fd);
  close(j.gate[1]);
  char lines[2048] = "";
  size_t got = 0;
  ssize_t k;
  while ((k = read(j.out[0], lines + got, sizeof lines - 1 - got)) > 0) got += (size_t)k;
  lines[got] = 0;
  close(j.out[0]);
  int st;
  waitpid(j.pid[0], &st, 0);
  coll_bootstrap_root_stop(j.root);
  fprintf(stderr, "%s", lines);
  cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "rank 0 did not fail its init");
  cr_expect(strstr(lines, "rank 0 init remote error") && strstr(lines, "rank 1 left the job"),
            "rank 0's sentence does not say rank 1 left: %s", lines);
}

/* The parser itself (the code the root and the fuzz target run), one case at a time:
 * refused ranks, pieces of one byte, bounds, bytes out of turn. */
Test(bootstrap, parser_cases) {
  coll_boot_job job = {.nranks = 0};
  for (int i = 0; i < 16; i++) job.secret[i] = (uint8_t)(3 * i + 1);
  coll_boot_rx c[6];
  for (int i = 0; i < 6; i++) coll_boot_rx_init(&c[i]);
  uint8_t auth[COLL_AUTH_BYTES], len[4];
  char why[200];
  coll_auth_build(auth, job.secret, 0, 2);
  cr_assert(coll_boot_rx_input(&job, &c[0], auth, sizeof auth, why, sizeof why), "%s", why);
  cr_assert_eq(job.nranks, 2);
  cr_assert_eq(c[0].rank, 0);
  /* the same rank again */
  cr_assert_not(coll_boot_rx_input(&job, &c[1], auth, sizeof auth, why, sizeof why));
  cr_assert_str_eq(why, "refused a second rank 0");
  /* a rank of a job of another size (its rank is beyond this job's table) */
  coll_auth_build(auth, job.secret, 2, 3);
  cr_assert_not(coll_boot_rx_input(&job, &c[2], auth, sizeof auth, why, sizeof why));
  cr_assert_str_eq(why, "refused rank 2 of 3: the job has 2 ranks");
  /* rank >= nranks in the message itself: not a valid message at all, dropped quietly */
  coll_auth_build(auth, job.secret, 5, 2);
  cr_assert_not(coll_boot_rx_input(&job, &c[3], auth, sizeof auth, why, sizeof why));
  cr_assert_str_eq(why, "");
  /* rank 1 in pieces of one byte, then a 3-byte blob in pieces */
  coll_auth_build(auth, job.secret, 1, 2);
  for (size_t i = 0; i < sizeof auth; i++)
    cr_assert(coll_boot_rx_input(&job, &c[4], auth + i, 1, why, sizeof why), "%s", why);
  cr_assert_eq(c[4].rank, 1);
  coll_put32(len, 3);
  uint8_t blob[3] = {7, 8, 9};
  cr_assert(coll_boot_rx_input(&job, &c[4], len, 4, why, sizeof why));
  cr_assert(coll_boot_rx_input(&job, &c[4], blob, 2, why, sizeof why));
  cr_assert_not(c[4].have_data);
  cr_assert(coll_boot_rx_input(&job, &c[4], blob + 2, 1, why, sizeof why));
  cr_assert(c[4].have_data && c[4].len == 3 && memcmp(c[4].data, blob, 3) == 0);
  /* a byte before the reply: out of turn */
  cr_assert_not(coll_boot_rx_input(&job, &c[4], blob, 1, why, sizeof why));
  cr_assert_str_eq(why, "rank 1 sent bytes out of turn");
  /* the limit itself is allowed, one past it is not */
  coll_put32(len, COLL_BOOT_MAX_LEN);
  cr_assert(coll_boot_rx_input(&job, &c[0], len, 4, why, sizeof why));
  coll_boot_rx_next_round(&c[0]);
  coll_put32(len, COLL_BOOT_MAX_LEN + 1);
  cr_assert_not(coll_boot_rx_input(&job, &c[0], len, 4, why, sizeof why));
  cr_assert_str_eq(why, "rank 0 announced a 65537-byte bootstrap blob (limit 65536)");
  cr_assert_null(c[0].data, "a refused length allocated memory");
  for (int i = 0; i < 6; i++) coll_boot_rx_free(&c[i]);
  coll_boot_job_free(&job);
}
