/* test_split.c — sub-communicators: coll_comm_split and coll_comm_dup.
 *
 * Every rank computes, on its own and without the library, which parent ranks share its
 * color and in which order (key, then parent rank), so it knows the child's size, its own
 * child rank and the child's members.  check_child() then verifies the child against that:
 * size and rank; an all-gather of the parent ranks (the members in child-rank order); an
 * all-reduce of values made from the parent ranks, small (one-shot path) and over many
 * FIFO slots (the child's own FIFOs); a broadcast from the last child rank.
 *
 * Cases: one color, a color per rank, even/odd halves, NOCOLOR ranks, reversed and equal
 * keys, nested splits, dup, parent and two children used alternately (blocking, on
 * streams, and from two threads at once), destruction in either order, bad arguments on
 * one rank, a child build that fails on one rank, the parent's numbering and trace after
 * a split, COLL_TRACE=FILE.json per child, and children of COLL_TRANSPORT=tcp parents.
 * N = 1..8 where meaningful.
 *
 * Segments: every rank checks that no segment of its job (the /dev/shm names that start
 * with its secret's first 8 bytes, which children keep) exists once a split returned —
 * segments of other libcoll jobs on the machine do not count.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "coll_trace.h"
#include "coll_test.h"
#include "internal.h"
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

#define BIG 70000 /* int64 elements: 560 KB, many FIFO slots */
#define TIMEOUT_MS 30000

/* ---- what the child should be, computed independently ----------------------------- */

typedef int (*color_fn)(int rank, int n);
typedef int (*key_fn)(int rank, int n);

/* Members of `color` in child-rank order: selection by (key, parent rank). */
static int members_of(int n, color_fn cf, key_fn kf, int color, int *out) {
  bool taken[64] = {0};
  int k = 0;
  for (;;) {
    int best = -1;
    for (int p = 0; p < n; p++) {
      if (taken[p] || cf(p, n) != color) continue;
      if (best < 0 || kf(p, n) < kf(best, n) || (kf(p, n) == kf(best, n) && p < best)) best = p;
    }
    if (best < 0) return k;
    taken[best] = true;
    out[k++] = best;
  }
}

static int64_t val(int prank, size_t i, uint64_t salt) {
  return (int64_t)prank * 1000003 + (int64_t)i * 7 + (int64_t)salt * 31;
}

/* libcoll segments of this job in /dev/shm: /coll-<first 8 secret bytes>... */
static int job_segments(coll_comm_t comm) {
  char prefix[32];
  int n = snprintf(prefix, sizeof prefix, "coll-");
  for (int i = 0; i < 8; i++)
    n += snprintf(prefix + n, sizeof prefix - (size_t)n, "%02x", comm->secret[i]);
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int c = 0;
  struct dirent *e;
  while ((e = readdir(d))) c += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return c;
}

/* Checks `child` against the members computed above.  my_prank: this rank in the parent. */
static int check_child(coll_comm_t child, const int *members, int k, int my_prank, uint64_t salt) {
  int me = -1, cr = -1, cn = -1;
  for (int i = 0; i < k; i++)
    if (members[i] == my_prank) me = i;
  if (coll_comm_rank(child, &cr) != COLL_OK || coll_comm_size(child, &cn) != COLL_OK)
    return t_failf("parent rank %d: rank/size failed", my_prank);
  if (cn != k || cr != me)
    return t_failf("parent rank %d: child rank %d of %d, expected %d of %d", my_prank, cr, cn, me,
                   k);
  int32_t mine = my_prank, got[64] = {0};
  if (coll_all_gather(&mine, got, 1, COLL_INT32, child, NULL) != COLL_OK)
    return t_failf("parent rank %d: all_gather: %s", my_prank, coll_comm_last_error(child));
  for (int i = 0; i < k; i++)
    if (got[i] != members[i])
      return t_failf("parent rank %d: child rank %d is parent rank %d, expected %d", my_prank, i,
                     got[i], members[i]);
  static int64_t a[BIG], b[BIG];
  size_t counts[2] = {257, BIG};
  for (int c = 0; c < 2; c++) {
    size_t cnt = counts[c];
    for (size_t i = 0; i < cnt; i++) a[i] = val(my_prank, i, salt + c);
    if (coll_all_reduce(a, b, cnt, COLL_INT64, COLL_SUM, child, NULL) != COLL_OK)
      return t_failf("parent rank %d: all_reduce: %s", my_prank, coll_comm_last_error(child));
    for (size_t i = 0; i < cnt; i++) {
      int64_t want = 0;
      for (int m = 0; m < k; m++) want += val(members[m], i, salt + c);
      if (b[i] != want)
        return t_failf("parent rank %d: all_reduce[%zu] = %lld, expected %lld", my_prank, i,
                       (long long)b[i], (long long)want);
    }
    /* broadcast from the last child rank: its parent rank's values */
    int root = k - 1;
    for (size_t i = 0; i < cnt; i++) a[i] = me == root ? val(my_prank, i, salt + 7) : -1;
    if (coll_broadcast(a, a, cnt, COLL_INT64, root, child, NULL) != COLL_OK)
      return t_failf("parent rank %d: broadcast: %s", my_prank, coll_comm_last_error(child));
    for (size_t i = 0; i < cnt; i++)
      if (a[i] != val(members[root], i, salt + 7))
        return t_failf("parent rank %d: broadcast[%zu] = %lld, expected %lld", my_prank, i,
                       (long long)a[i], (long long)val(members[root], i, salt + 7));
  }
  return 0;
}

/* An all-reduce on the parent (n ranks, rank r), checked. */
static int check_parent(coll_comm_t comm, int r, int n, uint64_t salt) {
  int64_t x[3] = {val(r, 0, salt), val(r, 1, salt), val(r, 2, salt)}, y[3];
  if (coll_all_reduce(x, y, 3, COLL_INT64, COLL_SUM, comm, NULL) != COLL_OK)
    return t_failf("rank %d: parent all_reduce: %s", r, coll_comm_last_error(comm));
  for (int i = 0; i < 3; i++) {
    int64_t want = 0;
    for (int p = 0; p < n; p++) want += val(p, (size_t)i, salt);
    if (y[i] != want) return t_failf("rank %d: parent all_reduce[%d] wrong", r, i);
  }
  return 0;
}

/* Splits `comm` by cf/kf and checks the result; the child is destroyed. */
static int split_and_check(coll_comm_t comm, int rank, int n, color_fn cf, key_fn kf,
                           uint64_t salt) {
  coll_comm_t child = (coll_comm_t)&child; /* must be overwritten */
  int color = cf(rank, n);
  coll_result r = coll_comm_split(comm, color, kf(rank, n), &child);
  if (r != COLL_OK)
    return t_failf("rank %d of %d: split: %s: %s", rank, n, coll_result_string(r),
                   coll_comm_last_error(comm));
  if (job_segments(comm))
    return t_failf("rank %d: a segment of this job is in /dev/shm after the split", rank);
  if (color == COLL_SPLIT_NOCOLOR)
    return child == NULL ? check_parent(comm, rank, n, salt + 1)
                         : t_failf("rank %d: NOCOLOR but got a communicator", rank);
  if (!child) return t_failf("rank %d: no communicator", rank);
  int members[64];
  int k = members_of(n, cf, kf, color, members);
  int bad = check_child(child, members, k, rank, salt);
  if (coll_comm_destroy(child) != COLL_OK) bad++;
  return bad ? bad : check_parent(comm, rank, n, salt + 1);
}

static int c_zero(int r, int n) {
  (void)r, (void)n;
  return 0;
}
static int c_self(int r, int n) {
  (void)n;
  return r;
}
static int c_parity(int r, int n) {
  (void)n;
  return r % 2;
}
static int c_some_none(int r, int n) {
  (void)n;
  return r % 3 == 1 ? COLL_SPLIT_NOCOLOR : r % 3;
}
static int c_halves(int r, int n) { return r < n / 2 ? 0 : 1; }
static int k_rank(int r, int n) {
  (void)n;
  return r;
}
static int k_reversed(int r, int n) { return n - r; }
static int k_equal(int r, int n) {
  (void)r, (void)n;
  return 5;
}
static int k_scrambled(int r, int n) { return (r * 5 + 3) % n - n / 2; }

typedef struct {
  color_fn cf;
  key_fn kf;
} splitspec;

static int rank_split(coll_comm_t comm, int rank, int n, void *arg) {
  const splitspec *s = arg;
  return split_and_check(comm, rank, n, s->cf, s->kf, 11);
}

/* Under AddressSanitizer every rank looks for leaks once its body returned (ranks end
 * in _exit, where LeakSanitizer does not run): whatever a split, a failed split or a
 * destroyed child left unreachable.  The parent communicator is still reachable here. */
typedef struct {
  coll_rank_fn fn;
  void *arg;
} body;

static int leak_checked(coll_comm_t comm, int rank, int n, void *arg) {
  const body *b = arg;
  int rc = b->fn(comm, rank, n, b->arg);
#ifdef __SANITIZE_ADDRESS__
  if (rc == 0 && __lsan_do_recoverable_leak_check() != 0)
    rc = t_failf("rank %d: LeakSanitizer found leaks (above)", rank);
#endif
  return rc;
}

static void run(int n, coll_rank_fn fn, void *arg) {
  setenv("COLL_TIMEOUT_MS", "30000", 1);
  char why[256];
  body b = {fn, arg};
  int rc = t_launch(n, leak_checked, &b, 150000, why, sizeof why);
  cr_assert_eq(rc, 0, "N=%d: %s", n, why);
}

static void sweep(int lo, int hi, color_fn cf, key_fn kf) {
  splitspec s = {cf, kf};
  for (int n = lo; n <= hi; n++) run(n, rank_split, &s);
}

/* Creating communicators measures links (tuning) — slow with 8 ranks on 2 cores: the
 * sweeps skip the measurement (COLL_TUNE=0; coll_tune_init still runs), one case keeps it. */
Test(split, one_color_n1_to_8, .timeout = 600) {
  setenv("COLL_TUNE", "0", 1);
  sweep(1, 8, c_zero, k_rank);
}
Test(split, one_color_tuned_n4, .timeout = 300) { sweep(4, 4, c_zero, k_rank); }
Test(split, color_per_rank_n1_to_8, .timeout = 600) {
  setenv("COLL_TUNE", "0", 1);
  sweep(1, 8, c_self, k_rank);
}
Test(split, even_odd_n2_to_8, .timeout = 600) {
  setenv("COLL_TUNE", "0", 1);
  sweep(2, 8, c_parity, k_rank);
}
Test(split, nocolor_n1_to_8, .timeout = 600) {
  setenv("COLL_TUNE", "0", 1);
  sweep(1, 8, c_some_none, k_rank);
}
Test(split, reversed_keys_n1_to_8, .timeout = 600) {
  setenv("COLL_TUNE", "0", 1);
  sweep(1, 8, c_zero, k_reversed);
}
Test(split, equal_keys_keep_parent_order, .timeout = 300) {
  setenv("COLL_TUNE", "0", 1);
  sweep(5, 5, c_parity, k_equal);
}
Test(split, scrambled_keys_halves, .timeout = 300) {
  setenv("COLL_TUNE", "0", 1);
  sweep(7, 8, c_halves, k_scrambled);
}

static int all_nocolor(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  coll_comm_t child = (coll_comm_t)&child;
  if (coll_comm_split(comm, COLL_SPLIT_NOCOLOR, rank, &child) != COLL_OK || child)
    return t_failf("rank %d: all-NOCOLOR split: %s", rank, coll_comm_last_error(comm));
  return check_parent(comm, rank, n, 3);
}
Test(split, every_rank_nocolor, .timeout = 120) {
  setenv("COLL_TUNE", "0", 1);
  run(3, all_nocolor, NULL);
}

/* ---- nested splits and dup ----------------------------------------------------------- */

static int nested(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  coll_comm_t a, b;
  if (coll_comm_split(comm, rank % 2, rank, &a) != COLL_OK)
    return t_failf("rank %d: first split: %s", rank, coll_comm_last_error(comm));
  int ar, an;
  coll_comm_rank(a, &ar);
  coll_comm_size(a, &an);
  /* In the child: low half / high half by child rank, reversed keys. */
  int color = ar < an / 2 ? 0 : 1;
  if (coll_comm_split(a, color, -ar, &b) != COLL_OK)
    return t_failf("rank %d: nested split: %s", rank, coll_comm_last_error(a));
  /* Other children split at their own pace: only after the whole job met is every
   * nested split over. */
  if (coll_barrier(comm, NULL) != COLL_OK) return t_failf("rank %d: barrier", rank);
  if (job_segments(comm)) return t_failf("rank %d: segment left after nested split", rank);
  /* Independently: a's members are the parent ranks of my parity in order; b's are those
   * of a's members whose index is in my half, in reverse. */
  int am[64], ak = 0, bm[64], bk = 0;
  for (int p = rank % 2; p < n; p += 2) am[ak++] = p;
  for (int i = ak - 1; i >= 0; i--)
    if ((i < ak / 2 ? 0 : 1) == color) bm[bk++] = am[i];
  int bad = check_child(b, bm, bk, rank, 21) + check_child(a, am, ak, rank, 22);
  /* The grandchild outlives its parent. */
  if (coll_comm_destroy(a) != COLL_OK) bad++;
  bad += check_child(b, bm, bk, rank, 23);
  if (coll_comm_destroy(b) != COLL_OK) bad++;
  return bad ? bad : check_parent(comm, rank, n, 24);
}
Test(split, nested_n1_to_8, .timeout = 600) {
  setenv("COLL_TUNE", "0", 1);
  for (int n = 1; n <= 8; n++) run(n, nested, NULL);
}

static int dup_rank(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  coll_comm_t d = NULL, dd = NULL;
  if (coll_comm_dup(comm, &d) != COLL_OK || !d)
    return t_failf("rank %d: dup: %s", rank, coll_comm_last_error(comm));
  if (coll_comm_dup(d, &dd) != COLL_OK || !dd)
    return t_failf("rank %d: dup of dup: %s", rank, coll_comm_last_error(d));
  int all[64];
  for (int p = 0; p < n; p++) all[p] = p;
  if (memcmp(d->secret, comm->secret, 8) != 0 || memcmp(d->secret, comm->secret, 16) == 0 ||
      memcmp(dd->secret, d->secret, 16) == 0)
    return t_failf("rank %d: a dup's secret must keep the job's half and differ in the rest", rank);
  int bad = check_child(d, all, n, rank, 31) + check_child(dd, all, n, rank, 32);
  bad += check_parent(comm, rank, n, 33);
  if (coll_comm_destroy(dd) != COLL_OK || coll_comm_destroy(d) != COLL_OK) bad++;
  return bad;
}
Test(split, dup_n1_to_8, .timeout = 600) {
  setenv("COLL_TUNE", "0", 1);
  for (int n = 1; n <= 8; n++) run(n, dup_rank, NULL);
}

/* ---- parent and children used alternately, concurrently, destroyed in any order ----- */

static int alternate(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  coll_comm_t a, b;
  if (coll_comm_split(comm, rank % 2, rank, &a) != COLL_OK ||
      coll_comm_split(comm, 0, n - rank, &b) != COLL_OK)
    return t_failf("rank %d: split: %s", rank, coll_comm_last_error(comm));
  int am[64], ak = 0, bm[64];
  for (int p = rank % 2; p < n; p += 2) am[ak++] = p;
  for (int i = 0; i < n; i++) bm[i] = n - 1 - i;
  int ar = 0, br = 0;
  coll_comm_rank(a, &ar);
  coll_comm_rank(b, &br);
  /* Blocking calls, interleaved. */
  for (int it = 0; it < 40; it++) {
    int64_t x = val(rank, 0, (uint64_t)it), ya = 0, yb = 0, yp = 0, wa = 0, wb = 0, wp = 0;
    for (int i = 0; i < ak; i++) wa += val(am[i], 0, (uint64_t)it);
    for (int p = 0; p < n; p++) wp += val(p, 0, (uint64_t)it);
    wb = wp;
    if (coll_all_reduce(&x, &yp, 1, COLL_INT64, COLL_SUM, comm, NULL) != COLL_OK ||
        coll_all_reduce(&x, &ya, 1, COLL_INT64, COLL_SUM, a, NULL) != COLL_OK ||
        coll_all_reduce(&x, &yb, 1, COLL_INT64, COLL_SUM, b, NULL) != COLL_OK)
      return t_failf("rank %d: iteration %d failed", rank, it);
    if (ya != wa || yb != wb || yp != wp) return t_failf("rank %d: iteration %d wrong", rank, it);
    /* broadcast from child root 0 of b (parent rank n-1) */
    int64_t v = br == 0 ? val(rank, 1, (uint64_t)it) : 0;
    if (coll_broadcast(&v, &v, 1, COLL_INT64, 0, b, NULL) != COLL_OK ||
        v != val(bm[0], 1, (uint64_t)it))
      return t_failf("rank %d: iteration %d: broadcast from b's root gave %lld", rank, it,
                     (long long)v);
  }
  /* On streams: every call of the three communicators enqueued, then one wait each. */
  enum { K = 12 };
  static int64_t in[K][BIG / 4], outp[K][BIG / 4], outa[K][BIG / 4], outb[K][BIG / 4];
  size_t cnt = BIG / 4;
  coll_stream_t sp, sa, sb;
  coll_stream_create(&sp);
  coll_stream_create(&sa);
  coll_stream_create(&sb);
  for (int it = 0; it < K; it++) {
    for (size_t i = 0; i < cnt; i++) in[it][i] = val(rank, i, (uint64_t)it + 100);
    if (coll_all_reduce(in[it], outp[it], cnt, COLL_INT64, COLL_SUM, comm, sp) != COLL_OK ||
        coll_all_reduce(in[it], outa[it], cnt, COLL_INT64, COLL_SUM, a, sa) != COLL_OK ||
        coll_all_reduce(in[it], outb[it], cnt, COLL_INT64, COLL_MAX, b, sb) != COLL_OK)
      return t_failf("rank %d: enqueue %d failed", rank, it);
  }
  if (coll_stream_synchronize(sp) != COLL_OK || coll_stream_synchronize(sa) != COLL_OK ||
      coll_stream_synchronize(sb) != COLL_OK)
    return t_failf("rank %d: a stream failed", rank);
  coll_stream_destroy(sp);
  coll_stream_destroy(sa);
  coll_stream_destroy(sb);
  for (int it = 0; it < K; it++)
    for (size_t i = 0; i < cnt; i++) {
      int64_t wp = 0, wa = 0, wb = val(n - 1, i, (uint64_t)it + 100);
      for (int p = 0; p < n; p++) wp += val(p, i, (uint64_t)it + 100);
      for (int m = 0; m < ak; m++) wa += val(am[m], i, (uint64_t)it + 100);
      if (outp[it][i] != wp || outa[it][i] != wa || outb[it][i] != wb)
        return t_failf("rank %d: stream call %d element %zu wrong", rank, it, i);
    }
  /* A child goes; the parent and the other child go on. */
  if (coll_comm_destroy(a) != COLL_OK) return t_failf("rank %d: destroying a", rank);
  int bad = check_parent(comm, rank, n, 41) + check_child(b, bm, n, rank, 42);
  if (coll_comm_destroy(b) != COLL_OK) bad++;
  return bad ? bad : check_parent(comm, rank, n, 43);
}
Test(split, parent_and_two_children_alternate_n1_to_8, .timeout = 900) {
  setenv("COLL_TUNE", "0", 1);
  for (int n = 1; n <= 8; n++) run(n, alternate, NULL);
}

typedef struct {
  coll_comm_t comm;
  int rank, n, bad;
  const int *members;
  int k;
} thr_arg;

static void *child_loop(void *p) {
  thr_arg *t = p;
  for (int it = 0; it < 60 && !t->bad; it++) {
    static _Thread_local int64_t x[BIG / 8], y[BIG / 8];
    size_t cnt = BIG / 8;
    for (size_t i = 0; i < cnt; i++) x[i] = val(t->rank, i, (uint64_t)it + 500);
    if (coll_all_reduce(x, y, cnt, COLL_INT64, COLL_SUM, t->comm, NULL) != COLL_OK) {
      t->bad = t_failf("rank %d: child all_reduce from a thread: %s", t->rank,
                       coll_comm_last_error(t->comm));
      break;
    }
    for (size_t i = 0; i < cnt; i += 97) {
      int64_t w = 0;
      for (int m = 0; m < t->k; m++) w += val(t->members[m], i, (uint64_t)it + 500);
      if (y[i] != w) {
        t->bad = t_failf("rank %d: child result wrong in thread", t->rank);
        break;
      }
    }
  }
  return NULL;
}

/* The parent in this thread and a child in another, at the same time. */
static int concurrent(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  coll_comm_t c;
  if (coll_comm_split(comm, 0, -rank, &c) != COLL_OK)
    return t_failf("rank %d: split: %s", rank, coll_comm_last_error(comm));
  int members[64];
  for (int i = 0; i < n; i++) members[i] = n - 1 - i;
  thr_arg t = {.comm = c, .rank = rank, .n = n, .members = members, .k = n};
  pthread_t th;
  pthread_create(&th, NULL, child_loop, &t);
  int bad = 0;
  for (int it = 0; it < 60 && !bad; it++) {
    static int64_t x[BIG / 8], y[BIG / 8];
    size_t cnt = BIG / 8;
    for (size_t i = 0; i < cnt; i++) x[i] = val(rank, i, (uint64_t)it + 900);
    if (coll_all_reduce(x, y, cnt, COLL_INT64, COLL_SUM, comm, NULL) != COLL_OK) {
      bad = t_failf("rank %d: parent all_reduce: %s", rank, coll_comm_last_error(comm));
      break;
    }
    for (size_t i = 0; i < cnt; i += 97) {
      int64_t w = 0;
      for (int p = 0; p < n; p++) w += val(p, i, (uint64_t)it + 900);
      if (y[i] != w) {
        bad = t_failf("rank %d: parent result wrong", rank);
        break;
      }
    }
  }
  pthread_join(th, NULL);
  if (coll_comm_destroy(c) != COLL_OK) bad++;
  return bad + t.bad;
}
Test(split, parent_and_child_from_two_threads, .timeout = 600) {
  setenv("COLL_TUNE", "0", 1);
  for (int n = 2; n <= 4; n++) run(n, concurrent, NULL);
}

/* ---- bad arguments and failures ---------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int bad_args(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  int victim = n - 1;
  coll_comm_t c = (coll_comm_t)&c;
  /* A bad color on the last rank: everyone refuses, with a sentence. */
  coll_result r = coll_comm_split(comm, rank == victim ? -5 : 0, rank, &c);
  const char *msg = coll_comm_last_error(comm);
  if (r != COLL_ERR_INVALID_ARG || c != NULL)
    return t_failf("rank %d: bad color gave %s", rank, coll_result_string(r));
  if (rank == victim ? !strstr(msg, "color -5") : !strstr(msg, "rank") || !strstr(msg, "color -5"))
    return t_failf("rank %d: sentence: %s", rank, msg);
  char want[32];
  snprintf(want, sizeof want, "rank %d", victim);
  if (!strstr(msg, want))
    return t_failf("rank %d: sentence does not name rank %d: %s", rank, victim, msg);
  /* A NULL newcomm on rank 0. */
  c = (coll_comm_t)&c;
  r = coll_comm_split(comm, 1, 0, rank == 0 ? NULL : &c);
  msg = coll_comm_last_error(comm);
  if (r != COLL_ERR_INVALID_ARG || (rank != 0 && c != NULL) || !strstr(msg, "newcomm is NULL"))
    return t_failf("rank %d: NULL newcomm gave %s: %s", rank, coll_result_string(r), msg);
  r = coll_comm_dup(comm, NULL); /* everywhere */
  if (r != COLL_ERR_INVALID_ARG)
    return t_failf("rank %d: dup(comm, NULL) gave %s", rank, coll_result_string(r));
  /* No communicator: refused locally, nobody waits (every rank does it). */
  if (coll_comm_split(NULL, 0, 0, &c) != COLL_ERR_INVALID_ARG ||
      !strstr(coll_comm_last_error(NULL), "comm is NULL") ||
      coll_comm_dup(NULL, &c) != COLL_ERR_INVALID_ARG)
    return t_failf("rank %d: split(NULL) not refused", rank);
  if (job_segments(comm)) return t_failf("rank %d: segments left", rank);
  /* The parent still works, and so does a good split afterwards. */
  if (check_parent(comm, rank, n, 51)) return 1;
  return split_and_check(comm, rank, n, c_parity, k_reversed, 52);
}
Test(split, bad_arguments_refused_everywhere_n1_to_5, .timeout = 600) {
  setenv("COLL_TUNE", "0", 1);
  for (int n = 1; n <= 5; n++) run(n, bad_args, NULL);
}

/* One rank's child cannot be built (a setting only it has); the others must fail fast,
 * naming it, then everything works again. */
typedef struct {
  const char *name, *value; /* the setting that makes this rank's child fail */
} failspec;

static int one_fails(coll_comm_t comm, int rank, int n, void *arg) {
  const failspec *f = arg;
  const char *how = f->name;
  int victim = n > 2 ? 1 : n - 1;
  int color = n > 3 && rank == 3 ? COLL_SPLIT_NOCOLOR : rank % 2;
  if (rank == victim) setenv(how, f->value, 1);
  coll_comm_t c = (coll_comm_t)&c;
  double t0 = now_s();
  coll_result r = coll_comm_split(comm, color, rank, &c);
  double took = now_s() - t0;
  const char *msg = coll_comm_last_error(comm);
  if (rank == victim) unsetenv(how);
  if (r == COLL_OK || c != NULL) return t_failf("rank %d: split succeeded", rank);
  if (took > 10)
    return t_failf("rank %d: took %.1f s to fail (COLL_TIMEOUT_MS is 30 s)", rank, took);
  if (!strstr(msg, how)) return t_failf("rank %d: sentence does not say why: %s", rank, msg);
  if (rank == victim ? r != COLL_ERR_INVALID_ARG : r != COLL_ERR_REMOTE)
    return t_failf("rank %d: %s: %s", rank, coll_result_string(r), msg);
  char want[48];
  snprintf(want, sizeof want, "parent rank %d", victim);
  if (rank != victim && !strstr(msg, want))
    return t_failf("rank %d: does not name rank %d: %s", rank, victim, msg);
  if (job_segments(comm)) return t_failf("rank %d: segments left after a failed split", rank);
  if (check_parent(comm, rank, n, 61)) return 1;
  return split_and_check(comm, rank, n, c_some_none, k_rank, 62);
}
Test(split, child_failing_on_one_rank_fails_all_fast, .timeout = 600) {
  setenv("COLL_TUNE", "0", 1);
  failspec f = {"COLL_TRANSPORT", "carrier-pigeon"};
  for (int n = 1; n <= 5; n++) run(n, one_fails, &f);
}

/* ---- the parent's numbering, COLL_CHECK and trace after a split -------------------- */

static int numbering(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  coll_trace_start(comm);
  if (check_parent(comm, rank, n, 71)) return 1;
  coll_comm_t c;
  if (coll_comm_split(comm, rank % 2, rank, &c) != COLL_OK)
    return t_failf("rank %d: split: %s", rank, coll_comm_last_error(comm));
  if (check_parent(comm, rank, n, 72)) return 1;
  coll_comm_destroy(c);
  if (coll_comm_dup(comm, &c) != COLL_OK) return t_failf("rank %d: dup", rank);
  coll_comm_destroy(c);
  if (check_parent(comm, rank, n, 73)) return 1;
  static coll_trace_event ev[4096];
  size_t got = 0;
  coll_trace_read(comm, ev, 4096, &got);
  /* The user's three calls, numbered 0, 1, 2; nothing of the splits. */
  uint64_t seqs[8];
  int calls = 0;
  for (size_t i = 0; i < got && i < 4096; i++)
    if (ev[i].step < 0 && calls < 8) seqs[calls++] = ev[i].seq;
  if (calls != 3 || seqs[0] != 0 || seqs[1] != 1 || seqs[2] != 2)
    return t_failf("rank %d: the parent's trace has %d calls (expected 3, #0..#2)", rank, calls);
  return 0;
}
Test(split, parent_numbering_and_trace_unchanged_with_check, .timeout = 300) {
  setenv("COLL_TUNE", "0", 1);
  setenv("COLL_CHECK", "1", 1);
  for (int n = 1; n <= 4; n++) run(n, numbering, NULL);
}

/* COLL_CHECK still catches a mismatch on the parent after a split. */
static int mismatch_after(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg, (void)n;
  coll_comm_t c;
  if (coll_comm_dup(comm, &c) != COLL_OK) return t_failf("rank %d: dup", rank);
  coll_comm_destroy(c);
  int32_t x[4] = {1, 2, 3, 4}, y[4];
  coll_result r = coll_all_reduce(x, y, rank == 0 ? 3 : 4, COLL_INT32, COLL_SUM, comm, NULL);
  if (r != COLL_ERR_MISMATCH)
    return t_failf("rank %d: mismatch not caught: %s", rank, coll_result_string(r));
  if (!strstr(coll_comm_last_error(comm), "all_reduce #0"))
    return t_failf("rank %d: the user's first call is not #0: %s", rank,
                   coll_comm_last_error(comm));
  return 0;
}
Test(split, check_catches_mismatch_after_split, .timeout = 120) {
  setenv("COLL_TUNE", "0", 1);
  setenv("COLL_CHECK", "1", 1);
  /* After the mismatch the parent is broken: the launcher's destroy of it must still end. */
  run(2, mismatch_after, NULL);
}

static int traced(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  return split_and_check(comm, rank, n, c_parity, k_rank, 81);
}
Test(split, trace_json_per_child, .timeout = 300) {
  setenv("COLL_TUNE", "0", 1);
  char dir[] = "/tmp/coll-split-trace-XXXXXX";
  cr_assert(mkdtemp(dir));
  char path[128], p0[160], p1[160];
  snprintf(path, sizeof path, "%s/t.json", dir);
  snprintf(p0, sizeof p0, "%s/t.split0-color0.json", dir);
  snprintf(p1, sizeof p1, "%s/t.split0-color1.json", dir);
  setenv("COLL_TRACE", path, 1);
  run(4, traced, NULL);
  struct stat st;
  bool ok = stat(path, &st) == 0 && stat(p0, &st) == 0 && stat(p1, &st) == 0;
  unlink(path);
  unlink(p0);
  unlink(p1);
  rmdir(dir);
  cr_assert(ok, "expected %s, %s and %s", path, p0, p1);
}

/* ---- over TCP ------------------------------------------------------------------------ */

static int tcp_rank(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  coll_comm_t c;
  if (coll_comm_split(comm, rank % 2, -rank, &c) != COLL_OK)
    return t_failf("rank %d: split over tcp: %s", rank, coll_comm_last_error(comm));
  int m[64], k = 0;
  for (int p = n - 1; p >= 0; p--)
    if (p % 2 == rank % 2) m[k++] = p;
  if (k > 1 && strcmp(coll_comm_transport_name(c), "tcp") != 0)
    return t_failf("rank %d: child uses %s", rank, coll_comm_transport_name(c));
  int bad = check_child(c, m, k, rank, 91) + check_parent(comm, rank, n, 92);
  /* the parent goes first; the child goes on alone */
  coll_comm_t d;
  if (coll_comm_dup(c, &d) != COLL_OK) return t_failf("rank %d: dup over tcp", rank);
  if (coll_comm_destroy(c) != COLL_OK) bad++;
  bad += check_child(d, m, k, rank, 93);
  if (coll_comm_destroy(d) != COLL_OK) bad++;
  return bad;
}
Test(split, tcp_parent_n2_to_5, .timeout = 600) {
  setenv("COLL_TUNE", "0", 1);
  setenv("COLL_TRANSPORT", "tcp", 1);
  for (int n = 2; n <= 5; n++) run(n, tcp_rank, NULL);
}
Test(split, tcp_child_failing_on_one_rank, .timeout = 300) {
  setenv("COLL_TUNE", "0", 1);
  setenv("COLL_TRANSPORT", "tcp", 1);
  failspec f = {"COLL_SOCKS_PER_PEER", "99"};
  for (int n = 2; n <= 4; n++) run(n, one_fails, &f);
}
