/* test_shm.c — shm holds memory only for the peers and slice sizes its plans use.
 *
 * A rank's segment has room for a FIFO from every peer, but it stays sparse: a FIFO's
 * pages become resident when a plan first uses it (libcoll/transport/shm.c, warm), so that N
 * ranks on one host do not each hold N-1 FIFOs (32 ranks did: 2 GiB).  Each rank here
 * reads, with mincore, how much of every FIFO in its own segment is resident:
 *
 *   - after init (tuning off): at most a page of each slot (init's own small calls,
 *     the direct-read probe's, run on the default schedules);
 *   - after a ring all-reduce of 64 KiB chunks: the FIFO from its ring predecessor holds
 *     its control page and 64 KiB of each of its 8 slots, every other FIFO nothing;
 *   - after a one-int all-to-all (every peer, one page per slot): every other FIFO
 *     holds its control page and one page of each slot, the ring's FIFO is unchanged.
 *
 * The results of both calls are checked too.  Exact sizes need MADV_POPULATE_WRITE
 * (Linux 5.14); on an older kernel pages fault on first use and only the bounds hold.
 *
 * And a full /dev/shm (a 1 MiB tmpfs mounted over it in a private mount namespace) is a
 * failed call with a sentence on the rank that could not get its FIFO's pages, and
 * COLL_ERR_REMOTE on its peer — not a SIGBUS in the middle of a copy.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <unistd.h>

#include "coll_test.h"
#include "internal.h"
#include "shm.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define CHUNK (64 * 1024) /* bytes of the ring's chunk: one slice per step */
#define PG 4096L
#define SLOTS 8

static bool populate_supported(void) {
  void *p = mmap(NULL, PG, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  bool ok = madvise(p, PG, MADV_POPULATE_WRITE) == 0 || errno != EINVAL;
  munmap(p, PG);
  return ok;
}

/* Compares every FIFO of this rank's segment with what is expected: `ring` bytes for the
 * one from the predecessor, `other` for the rest; each exactly when its flag says so, else
 * at most. */
static int check_resident(coll_comm_t comm, const char *when, long ring, bool ring_exact,
                          long other, bool other_exact) {
  int n = comm->nranks, me = comm->rank, prev = (me + n - 1) % n;
  for (int p = 0; p < n; p++) {
    if (p == me) continue;
    long got = coll_shm_fifo_resident(&comm->view, comm->transport_ctxs[COLL_T_SHM], p);
    long want = p == prev ? ring : other;
    bool exact = p == prev ? ring_exact : other_exact;
    if (got < 0) return t_failf("rank %d %s: no FIFO from rank %d\n", me, when, p);
    if (exact ? got != want : got > want)
      return t_failf("rank %d %s: the FIFO from rank %d holds %ld resident bytes, expected %s%ld\n",
                     me, when, p, got, exact ? "" : "at most ", want);
  }
  return 0;
}

static int rank_fn(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  bool exact = populate_supported();
  long small = PG + SLOTS * PG; /* a page of each slot and the control page */
  if (check_resident(comm, "after init", small, false, small, false)) return 1;
  /* Nobody's next call may populate a FIFO (the sender warms its end too) before every
   * rank has looked. */
  if (coll_barrier(comm, NULL) != COLL_OK)
    return t_failf("rank %d: barrier: %s\n", rank, coll_comm_last_error(comm));

  /* Ring all-reduce: n chunks of CHUNK bytes, each step one slice. */
  size_t count = (size_t)n * CHUNK / sizeof(float);
  float *x = malloc(count * sizeof *x), *y = malloc(count * sizeof *y);
  if (!x || !y) return t_failf("out of memory\n");
  for (size_t i = 0; i < count; i++) x[i] = (float)(rank + 1) * (float)(i % 7);
  comm->forced = COLL_ALGO_RING;
  if (coll_all_reduce(x, y, count, COLL_FLOAT32, COLL_SUM, comm, NULL) != COLL_OK)
    return t_failf("rank %d: all-reduce: %s\n", rank, coll_comm_last_error(comm));
  float total = (float)(n * (n + 1) / 2);
  for (size_t i = 0; i < count; i++)
    if (y[i] != total * (float)(i % 7))
      return t_failf("rank %d: all-reduce element %zu is %g\n", rank, i, (double)y[i]);
  long ring = PG + SLOTS * (long)CHUNK;
  if (check_resident(comm, "after a ring all-reduce", ring, exact, small, false)) return 1;

  /* All-to-all of one int per peer, on the pairwise schedule: every peer, one page per
   * slot. */
  int32_t *s = malloc((size_t)n * sizeof *s), *r = malloc((size_t)n * sizeof *r);
  if (!s || !r) return t_failf("out of memory\n");
  for (int j = 0; j < n; j++) s[j] = rank * 100 + j;
  comm->forced = COLL_ALGO_PAIRWISE;
  if (coll_all_to_all(s, r, 1, COLL_INT32, comm, NULL) != COLL_OK)
    return t_failf("rank %d: all-to-all: %s\n", rank, coll_comm_last_error(comm));
  for (int j = 0; j < n; j++)
    if (r[j] != j * 100 + rank)
      return t_failf("rank %d: all-to-all block %d is %d\n", rank, j, r[j]);
  if (check_resident(comm, "after a one-int all-to-all", ring, exact, small, exact)) return 1;
  free(x), free(y), free(s), free(r);
  return 0;
}

static void run(int n) {
  setenv("COLL_TUNE", "0", 1);
  unsetenv("COLL_ALGO");
  char why[512] = "";
  int rc = t_launch(n, rank_fn, NULL, 60000, why, sizeof why);
  cr_assert_eq(rc, 0, "%d ranks: %s", n, why);
  T_ASSERT_NO_LEFTOVERS("shm");
}

Test(shm, fifos_resident_only_where_used_n3, .timeout = 120) { run(3); }
Test(shm, fifos_resident_only_where_used_n8, .timeout = 120) { run(8); }

/* 2 ranks, a ring all-reduce whose FIFOs need 8 slots x 64 KiB x 2 directions, on a
 * /dev/shm of 1 MiB that the mailboxes already use 280 KiB of. */
static int full_fn(coll_comm_t comm, int rank, int n, void *arg) {
  (void)n, (void)arg;
  size_t count = 2 * CHUNK; /* floats: 512 KiB per rank, 2 chunks of 256 KiB */
  float *x = calloc(count, sizeof *x), *y = calloc(count, sizeof *y);
  if (!x || !y) return t_failf("out of memory\n");
  comm->forced = COLL_ALGO_RING;
  coll_result r = coll_all_reduce(x, y, count, COLL_FLOAT32, COLL_SUM, comm, NULL);
  const char *why = coll_comm_last_error(comm);
  fprintf(stderr, "rank %d: %s: %s\n", rank, coll_result_string(r), why);
  free(x), free(y);
  if (r == COLL_OK) return t_failf("rank %d: the all-reduce succeeded on a full /dev/shm\n", rank);
  if (r == COLL_ERR_SYSTEM && !strstr(why, "/dev/shm full"))
    return t_failf("rank %d: the sentence does not say why\n", rank);
  if (r != COLL_ERR_SYSTEM && r != COLL_ERR_REMOTE)
    return t_failf("rank %d: %s, expected a system error or its peer's\n", rank,
                   coll_result_string(r));
  return r == COLL_ERR_SYSTEM ? 10 : 11; /* which end ran out, for the test to count */
}

Test(shm, full_dev_shm_is_a_sentence_not_a_crash, .timeout = 120) {
  if (geteuid() != 0) cr_skip_test("needs root for a private mount namespace");
  cr_assert_eq(unshare(CLONE_NEWNS), 0, "unshare: %s", strerror(errno));
  cr_assert_eq(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), 0, "%s", strerror(errno));
  cr_assert_eq(mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=1m,mode=1777"), 0,
               "mounting a small tmpfs on /dev/shm: %s", strerror(errno));
  setenv("COLL_TUNE", "0", 1);
  char why[512] = "";
  int rc = t_launch(2, full_fn, NULL, 60000, why, sizeof why);
  /* The launcher reports the first rank's non-zero status: 10 or 11, never a signal. */
  cr_assert(rc == 10 || rc == 11, "status %d: %s", rc, why);
  cr_assert(!strstr(why, "signal"), "%s", why);
}
