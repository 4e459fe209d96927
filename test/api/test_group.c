/* test_group.c — grouped calls (coll_group_start / coll_group_end, libcoll/api/group.c)
 * over the real shared-memory transport.
 *
 * The heart of it: every rank sends to and receives from every other rank inside one
 * group, in a call order shuffled per rank (seeded by rank and repetition), for N = 2..8
 * and 1,000 repetitions each (250 under ASan+UBSan: the plain build runs the 1,000,
 * the sanitizers need the paths, not the count); most messages are small (0..~600
 * bytes, mixed dtypes), one repetition in 25 sends messages of one to three FIFO slots
 * and a bit, so slicing and the per-connection delays run.  Every received byte is checked against
 * a value computed from (source, destination, repetition, index), and the byte after each message
 * must still hold its sentinel.  Around it: several sends to one peer (they meet the peer's
 * receives in call order), nesting (nothing runs before the outermost end: the inner end would
 * deadlock otherwise), a group over two communicators, collectives inside a group, a pipeline stage
 * sending forward and backward at once, streams, COLL_CHECK with groups, the trace, and the errors
 * (end without start, a bad peer inside a group, ranks whose grouped messages disagree).  No
 * segment of the test's jobs may be left in /dev/shm.
 *
 * Messages "larger than a FIFO's capacity" (all slots of a connection) are what makes
 * the deadlock cases real: with blocking calls in the orders used here they would hang,
 * so a wrong implementation fails by the test's timeout, not by luck.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "coll_trace.h"
#include "coll_test.h"
#include "internal.h" /* comm->secret names the job's shared segments */

#define TIMEOUT_MS 600000

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

/* Byte i of message `tag` from src to dst in repetition rep. */
static uint8_t val(int src, int dst, uint64_t rep, int tag, size_t i) {
  uint64_t h = mix(((uint64_t)src << 48) ^ ((uint64_t)dst << 40) ^ (rep << 8) ^ (uint64_t)tag);
  return (uint8_t)((h >> (i % 8 * 8)) ^ (i * 31) ^ (i >> 8));
}

static void fill(uint8_t *p, size_t bytes, int src, int dst, uint64_t rep, int tag) {
  for (size_t i = 0; i < bytes; i++) p[i] = val(src, dst, rep, tag, i);
}

#define SENTINEL 0xEE

/* Checks a received message and the sentinel after it; prints and returns 1 if wrong. */
static int check(const uint8_t *p, size_t bytes, size_t cap, int src, int dst, uint64_t rep,
                 int tag) {
  for (size_t i = 0; i < bytes; i++)
    if (p[i] != val(src, dst, rep, tag, i))
      return t_failf("rank %d: message %d from rank %d (rep %llu, %zu bytes): byte %zu is %u, "
                     "expected %u",
                     dst, tag, src, (unsigned long long)rep, bytes, i, p[i],
                     val(src, dst, rep, tag, i));
  if (bytes < cap && p[bytes] != SENTINEL)
    return t_failf("rank %d: message %d from rank %d (rep %llu): wrote past its %zu bytes", dst,
                   tag, src, (unsigned long long)rep, bytes);
  return 0;
}

static size_t slot_of(coll_comm_t comm) {
  size_t slot = 0;
  coll_comm_slice_bytes(comm, &slot);
  return slot;
}

static void shuffle(int *a, int n, uint64_t *rng) {
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(t_rand(rng) % (uint64_t)(i + 1)), t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
}

/* Shared segments: only this job's count (other libcoll jobs on the machine make and
 * remove their own meanwhile): coll_test.c asks the launcher what it had to clean up. */
static void run_ranks(int n, coll_rank_fn fn, void *arg) {
  char why[256] = "";
  int rc = t_launch(n, fn, arg, TIMEOUT_MS, why, sizeof why);
  cr_assert_eq(rc, 0, "%d ranks: %s", n, why);
  T_ASSERT_NO_LEFTOVERS("after the job");
}

#define TRY(call)                                                                        \
  do {                                                                                   \
    coll_result r_ = (call);                                                             \
    if (r_ != COLL_OK)                                                                   \
      return t_failf("rank %d: %s failed (%s): %s", rank, #call, coll_result_string(r_), \
                     coll_comm_last_error(comm));                                        \
  } while (0)

/* ---- every rank with every rank, shuffled -------------------------------------------- */

static const coll_dtype dtypes[] = {COLL_UINT8, COLL_INT32, COLL_FLOAT64, COLL_BFLOAT16};

/* The message src sends dst in repetition rep: its dtype and element count. */
static void msg(int src, int dst, uint64_t rep, size_t slot, coll_dtype *dt, size_t *count) {
  uint64_t h = mix(((uint64_t)src << 32) ^ ((uint64_t)dst << 16) ^ rep ^ 0x5151);
  *dt = dtypes[h % 4];
  size_t es = coll_dtype_size(*dt);
  size_t bytes = rep % 25 == 3 ? slot + (h >> 8) % (2 * slot + 1) + 1 : (h >> 8) % 600;
  *count = bytes / es;
}

typedef struct {
  int reps;
} a2a_arg;

static int a2a_body(coll_comm_t comm, int rank, int n, void *argp) {
  const a2a_arg *arg = argp;
  size_t slot = slot_of(comm), cap = 3 * slot + 16;
  uint8_t *sb = malloc((size_t)n * cap), *rb = malloc((size_t)n * cap);
  int *order = malloc(2 * (size_t)n * sizeof *order);
  if (!sb || !rb || !order) return t_failf("rank %d: out of memory", rank);
  uint64_t rng = 0x6a09e667f3bcc908ull ^ ((uint64_t)rank << 20) ^ (uint64_t)n;
  for (int rep = 0; rep < arg->reps; rep++) {
    int nops = 0;
    for (int p = 0; p < n; p++) {
      if (p == rank) continue;
      coll_dtype dt;
      size_t count;
      msg(rank, p, (uint64_t)rep, slot, &dt, &count);
      fill(sb + (size_t)p * cap, count * coll_dtype_size(dt), rank, p, (uint64_t)rep, 0);
      memset(rb + (size_t)p * cap, SENTINEL, cap);
      order[nops++] = p;     /* send to p */
      order[nops++] = n + p; /* receive from p */
    }
    shuffle(order, nops, &rng);
    TRY(coll_group_start());
    for (int k = 0; k < nops; k++) {
      int p = order[k] % n;
      coll_dtype dt;
      size_t count;
      if (order[k] < n) {
        msg(rank, p, (uint64_t)rep, slot, &dt, &count);
        TRY(coll_send(sb + (size_t)p * cap, count, dt, p, comm, NULL));
      } else {
        msg(p, rank, (uint64_t)rep, slot, &dt, &count);
        TRY(coll_recv(rb + (size_t)p * cap, count, dt, p, comm, NULL));
      }
    }
    TRY(coll_group_end());
    for (int p = 0; p < n; p++) {
      if (p == rank) continue;
      coll_dtype dt;
      size_t count;
      msg(p, rank, (uint64_t)rep, slot, &dt, &count);
      if (check(rb + (size_t)p * cap, count * coll_dtype_size(dt), cap, p, rank, (uint64_t)rep, 0))
        return 1;
    }
  }
  free(sb);
  free(rb);
  free(order);
  return 0;
}

#define A2A(N)                                            \
  Test(group, all_to_all_shuffled_n##N, .timeout = 900) { \
    a2a_arg a = {T_SANITIZED ? 250 : 1000};               \
    run_ranks(N, a2a_body, &a);                           \
  }
A2A(2)
A2A(3)
A2A(4)
A2A(5)
A2A(6)
A2A(7)
A2A(8)

/* ---- several sends to one peer: they meet its receives in call order --------------- */

/* More messages per connection than a FIFO has slots (shm 8, tcp 4): were they not
 * delayed one behind the other, a rank would post more slices to one peer in one round
 * than its FIFO holds, and two ranks doing that to each other would wait forever. */
enum { MULTI = 12 };

static size_t multi_bytes(int k, uint64_t rep, size_t slot) {
  static const size_t small[4] = {100, 0, 7, 3000};
  /* large, small, large, small... in even repetitions; all small in odd ones */
  if (rep % 2 == 0 && k % 2 == 0) return slot * (size_t)(k % 3 + 1) + 1 + (size_t)rep;
  return small[k % 4];
}

static int multi_body(coll_comm_t comm, int rank, int n, void *argp) {
  (void)argp;
  size_t slot = slot_of(comm), cap = 3 * slot + 64;
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  uint8_t *sb = malloc(MULTI * cap), *rb = malloc(MULTI * cap);
  if (!sb || !rb) return t_failf("rank %d: out of memory", rank);
  uint64_t rng = 0xbb67ae8584caa73bull ^ (uint64_t)rank;
  for (uint64_t rep = 0; rep < 40; rep++) {
    for (int k = 0; k < MULTI; k++) {
      fill(sb + k * cap, multi_bytes(k, rep, slot), rank, next, rep, k);
      memset(rb + k * cap, SENTINEL, cap);
    }
    /* Sends keep their order among themselves, receives theirs; the two interleave at
     * random (and with n = 2 the peer is the same both ways). */
    int ks = 0, kr = 0;
    TRY(coll_group_start());
    while (ks < MULTI || kr < MULTI) {
      bool send = kr == MULTI || (ks < MULTI && t_rand(&rng) % 2);
      if (send) {
        TRY(coll_send(sb + ks * cap, multi_bytes(ks, rep, slot), COLL_UINT8, next, comm, NULL));
        ks++;
      } else {
        TRY(coll_recv(rb + kr * cap, multi_bytes(kr, rep, slot), COLL_UINT8, prev, comm, NULL));
        kr++;
      }
    }
    TRY(coll_group_end());
    for (int k = 0; k < MULTI; k++)
      if (check(rb + k * cap, multi_bytes(k, rep, slot), cap, prev, rank, rep, k)) return 1;
  }
  free(sb);
  free(rb);
  return 0;
}

Test(group, several_sends_to_one_peer_keep_call_order, .timeout = 600) {
  for (int n = 2; n <= 5; n += 3) run_ranks(n, multi_body, NULL);
  run_ranks(3, multi_body, NULL);
}

/* ---- nesting: nothing runs before the outermost end -------------------------------- */

static int nested_body(coll_comm_t comm, int rank, int n, void *argp) {
  (void)argp;
  /* More than a connection's FIFO holds: a send that ran at an inner end would wait for
   * a receive that is only made after it, on both ranks. */
  size_t bytes = 16 * slot_of(comm) + 5;
  int peer = (rank + 1) % n, from = (rank + n - 1) % n;
  uint8_t *sb = malloc(bytes), *rb = malloc(bytes + 1);
  if (!sb || !rb) return t_failf("rank %d: out of memory", rank);
  fill(sb, bytes, rank, peer, 0, 0);
  memset(rb, SENTINEL, bytes + 1);
  TRY(coll_group_start());
  TRY(coll_group_start());
  TRY(coll_group_start());
  TRY(coll_send(sb, bytes, COLL_UINT8, peer, comm, NULL));
  TRY(coll_group_end());
  TRY(coll_group_end());
  if (rb[0] != SENTINEL || rb[bytes - 1] != SENTINEL)
    return t_failf("rank %d: the receive buffer changed before the outermost end", rank);
  TRY(coll_recv(rb, bytes, COLL_UINT8, from, comm, NULL));
  if (rb[0] != SENTINEL) return t_failf("rank %d: a grouped receive ran early", rank);
  TRY(coll_group_end());
  if (check(rb, bytes, bytes + 1, from, rank, 0, 0)) return 1;
  free(sb);
  free(rb);
  return 0;
}

Test(group, nested_groups_run_at_the_outermost_end, .timeout = 300) {
  run_ranks(2, nested_body, NULL);
  run_ranks(3, nested_body, NULL);
}

/* ---- one group over two communicators ------------------------------------------------ */

static int two_comms_body(coll_comm_t comm, int rank, int n, void *argp) {
  (void)argp;
  coll_unique_id id;
  coll_comm_t comm2 = NULL;
  if (rank == 0) TRY(coll_get_unique_id(&id));
  TRY(coll_broadcast(&id, &id, sizeof id, COLL_UINT8, 0, comm, NULL));
  TRY(coll_comm_init_rank(&comm2, n, id, rank));
  size_t bytes = 12 * slot_of(comm) + 3; /* more than a FIFO holds */
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  uint8_t *f_out = malloc(bytes), *b_out = malloc(bytes), *f_in = malloc(bytes + 1),
          *b_in = malloc(bytes + 1);
  if (!f_out || !b_out || !f_in || !b_in) return t_failf("rank %d: out of memory", rank);
  for (uint64_t rep = 0; rep < 6; rep++) {
    fill(f_out, bytes, rank, next, rep, 1);
    fill(b_out, bytes, rank, prev, rep, 2);
    memset(f_in, SENTINEL, bytes + 1);
    memset(b_in, SENTINEL, bytes + 1);
    TRY(coll_group_start());
    /* Forward on comm, backward on comm2; even ranks start with comm2, odd with comm,
     * and each sends before it receives: blocking, this would hang. */
    for (int half = 0; half < 2; half++) {
      if ((half == 0) == (rank % 2 == 0)) {
        TRY(coll_send(b_out, bytes, COLL_UINT8, prev, comm2, NULL));
        TRY(coll_recv(b_in, bytes, COLL_UINT8, next, comm2, NULL));
      } else {
        TRY(coll_send(f_out, bytes, COLL_UINT8, next, comm, NULL));
        TRY(coll_recv(f_in, bytes, COLL_UINT8, prev, comm, NULL));
      }
    }
    TRY(coll_group_end());
    if (check(f_in, bytes, bytes + 1, prev, rank, rep, 1) ||
        check(b_in, bytes, bytes + 1, next, rank, rep, 2))
      return 1;
  }
  /* comm2 is a job of its own, which the launcher knows nothing about: every rank has
   * been through ready() (the exchanges above needed it), so none of comm2's segments
   * may be left.  Only comm2's prefix counts (other jobs on the machine have theirs). */
  char prefix[40], left[512];
  coll_job_prefix(prefix, sizeof prefix, comm2->secret);
  TRY(coll_comm_destroy(comm2));
  if (rank == 0 && t_prefix_segments(prefix, 1, left, sizeof left) != 0)
    return t_failf("rank 0: the second communicator left segments: %s", left);
  free(f_out);
  free(b_out);
  free(f_in);
  free(b_in);
  return 0;
}

Test(group, one_group_over_two_communicators, .timeout = 600) {
  for (int n = 2; n <= 4; n++) run_ranks(n, two_comms_body, NULL);
}

/* ---- collectives inside a group -------------------------------------------------------- */

enum { AR = 1000 };

static int colls_body(coll_comm_t comm, int rank, int n, void *argp) {
  (void)argp;
  size_t bytes = 3 * slot_of(comm) + 11;
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  int64_t *ar = malloc(AR * sizeof *ar), *bc = malloc(AR * sizeof *bc);
  uint8_t *out = malloc(bytes), *in = malloc(bytes + 1), self_in[64], self_out[64];
  if (!ar || !bc || !out || !in) return t_failf("rank %d: out of memory", rank);
  uint64_t rng = 0x3c6ef372fe94f82bull ^ (uint64_t)rank;
  for (uint64_t rep = 0; rep < 20; rep++) {
    for (int k = 0; k < AR; k++) ar[k] = rank * 1000 + k, bc[k] = rank == 1 % n ? k * 7 : -1;
    fill(out, bytes, rank, next, rep, 3);
    fill(self_out, sizeof self_out, rank, rank, rep, 4);
    memset(in, SENTINEL, bytes + 1);
    memset(self_in, SENTINEL, sizeof self_in);
    /* The collectives keep their order; the point-to-point calls go anywhere around them. */
    int where = (int)(t_rand(&rng) % 3);
    TRY(coll_group_start());
    if (where == 0) TRY(coll_recv(in, bytes, COLL_UINT8, prev, comm, NULL));
    TRY(coll_all_reduce(ar, ar, AR, COLL_INT64, COLL_SUM, comm, NULL));
    if (where == 1) TRY(coll_recv(in, bytes, COLL_UINT8, prev, comm, NULL));
    TRY(coll_sendrecv(self_out, sizeof self_out, rank, self_in, sizeof self_in, rank, COLL_UINT8,
                      comm, NULL));
    TRY(coll_send(out, bytes, COLL_UINT8, next, comm, NULL));
    TRY(coll_broadcast(bc, bc, AR, COLL_INT64, 1 % n, comm, NULL));
    if (where == 2) TRY(coll_recv(in, bytes, COLL_UINT8, prev, comm, NULL));
    TRY(coll_group_end());
    for (int k = 0; k < AR; k++) {
      int64_t want = 1000 * (int64_t)n * (n - 1) / 2 + (int64_t)n * k;
      if (ar[k] != want)
        return t_failf("rank %d: all_reduce[%d] = %lld, expected %lld", rank, k, (long long)ar[k],
                       (long long)want);
      if (bc[k] != k * 7)
        return t_failf("rank %d: broadcast[%d] = %lld, expected %d", rank, k, (long long)bc[k],
                       k * 7);
    }
    if (check(in, bytes, bytes + 1, prev, rank, rep, 3) ||
        check(self_in, sizeof self_in, sizeof self_in, rank, rank, rep, 4))
      return 1;
  }
  free(ar);
  free(bc);
  free(out);
  free(in);
  return 0;
}

Test(group, collectives_and_point_to_point_in_one_group, .timeout = 600) {
  for (int n = 2; n <= 5; n++) run_ranks(n, colls_body, NULL);
}

/* ---- a pipeline stage: forward and backward at once ------------------------------------ */

static int pipeline_body(coll_comm_t comm, int rank, int n, void *argp) {
  (void)argp;
  size_t bytes = 10 * slot_of(comm) + 1; /* activations / gradients: more than a FIFO holds */
  uint8_t *act_out = malloc(bytes), *grad_out = malloc(bytes), *act_in = malloc(bytes + 1),
          *grad_in = malloc(bytes + 1);
  if (!act_out || !grad_out || !act_in || !grad_in) return t_failf("rank %d: out of memory", rank);
  bool first = rank == 0, last = rank == n - 1;
  for (uint64_t rep = 0; rep < 8; rep++) {
    if (!last) fill(act_out, bytes, rank, rank + 1, rep, 5);
    if (!first) fill(grad_out, bytes, rank, rank - 1, rep, 6);
    memset(act_in, SENTINEL, bytes + 1);
    memset(grad_in, SENTINEL, bytes + 1);
    /* The naive order: both sends, then both receives. */
    TRY(coll_group_start());
    if (!last) TRY(coll_send(act_out, bytes, COLL_UINT8, rank + 1, comm, NULL));
    if (!first) TRY(coll_send(grad_out, bytes, COLL_UINT8, rank - 1, comm, NULL));
    if (!first) TRY(coll_recv(act_in, bytes, COLL_UINT8, rank - 1, comm, NULL));
    if (!last) TRY(coll_recv(grad_in, bytes, COLL_UINT8, rank + 1, comm, NULL));
    TRY(coll_group_end());
    if ((!first && check(act_in, bytes, bytes + 1, rank - 1, rank, rep, 5)) ||
        (!last && check(grad_in, bytes, bytes + 1, rank + 1, rank, rep, 6)))
      return 1;
  }
  free(act_out);
  free(grad_out);
  free(act_in);
  free(grad_in);
  return 0;
}

Test(group, pipeline_stage_sends_forward_and_backward, .timeout = 300) {
  run_ranks(2, pipeline_body, NULL);
  run_ranks(4, pipeline_body, NULL);
}

/* ---- streams ---------------------------------------------------------------------------- */

static int streams_body(coll_comm_t comm, int rank, int n, void *argp) {
  (void)argp;
  coll_stream_t s;
  TRY(coll_stream_create(&s));
  size_t bytes = 6 * slot_of(comm) + 9;
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  uint8_t *out = malloc(bytes), *in = malloc(bytes + 1);
  int64_t ar[16];
  if (!out || !in) return t_failf("rank %d: out of memory", rank);
  for (uint64_t rep = 0; rep < 10; rep++) {
    fill(out, bytes, rank, next, rep, 7);
    memset(in, SENTINEL, bytes + 1);
    for (int k = 0; k < 16; k++) ar[k] = rank + k;
    /* Point-to-point on s; an all-reduce with a NULL stream in the same group: the end
     * waits for the all-reduce only, the stream reports the rest. */
    TRY(coll_group_start());
    TRY(coll_recv(in, bytes, COLL_UINT8, prev, comm, s));
    if (rep % 2) TRY(coll_all_reduce(ar, ar, 16, COLL_INT64, COLL_SUM, comm, NULL));
    TRY(coll_send(out, bytes, COLL_UINT8, next, comm, s));
    /* The same communicator's grouped point-to-point calls must share a stream. */
    coll_result r = coll_send(out, 1, COLL_UINT8, next, comm, NULL);
    if (r != COLL_ERR_INVALID_ARG || !strstr(coll_comm_last_error(comm), "same stream"))
      return t_failf("rank %d: a send on another stream in the group gave %s: %s", rank,
                     coll_result_string(r), coll_comm_last_error(comm));
    TRY(coll_group_end());
    if (rep % 2)
      for (int k = 0; k < 16; k++)
        if (ar[k] != (int64_t)n * k + n * (n - 1) / 2)
          return t_failf("rank %d: all_reduce[%d] = %lld", rank, k, (long long)ar[k]);
    TRY(coll_stream_synchronize(s));
    if (check(in, bytes, bytes + 1, prev, rank, rep, 7)) return 1;
  }
  TRY(coll_stream_destroy(s));
  free(out);
  free(in);
  return 0;
}

Test(group, streams_are_asynchronous, .timeout = 300) {
  run_ranks(2, streams_body, NULL);
  run_ranks(3, streams_body, NULL);
}

/* ---- COLL_CHECK with groups, and the trace ---------------------------------------------- */

static int checked_body(coll_comm_t comm, int rank, int n, void *argp) {
  (void)argp;
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  uint8_t out[300], in[301];
  TRY(coll_trace_start(comm));
  /* A group against plain calls: one message each way per peer. */
  fill(out, sizeof out, rank, next, 0, 8);
  memset(in, SENTINEL, sizeof in);
  if (rank % 2 == 0) {
    TRY(coll_group_start());
    TRY(coll_recv(in, sizeof out, COLL_UINT8, prev, comm, NULL));
    TRY(coll_send(out, sizeof out, COLL_UINT8, next, comm, NULL));
    TRY(coll_group_end());
  } else {
    TRY(coll_sendrecv(out, sizeof out, next, in, sizeof out, prev, COLL_UINT8, comm, NULL));
  }
  if (check(in, sizeof out, sizeof in, prev, rank, 0, 8)) return 1;
  /* The trace names the grouped work "group" (only even ranks made one). */
  coll_trace_event ev[64];
  size_t got = 0;
  TRY(coll_trace_read(comm, ev, 64, &got));
  bool seen = false;
  for (size_t i = 0; i < got && i < 64; i++)
    if (strcmp(ev[i].coll, "group") == 0 && ev[i].step == -1) seen = true;
  if (seen != (rank % 2 == 0))
    return t_failf("rank %d: the trace %s a \"group\" call", rank, seen ? "has" : "lacks");
  /* Groups against groups, a few hundred times with small messages. */
  a2a_arg a = {200};
  return a2a_body(comm, rank, n, &a);
}

Test(group, coll_check_and_trace, .timeout = 600) {
  setenv("COLL_CHECK", "1", 1);
  run_ranks(3, checked_body, NULL);
  run_ranks(4, checked_body, NULL);
}

/* ---- errors ------------------------------------------------------------------------------- */

Test(group, end_without_start_is_refused) {
  cr_assert_eq(coll_group_end(), COLL_ERR_INVALID_ARG);
  cr_assert(strstr(coll_comm_last_error(NULL), "coll_group_start"), "%s",
            coll_comm_last_error(NULL));
  cr_assert_eq(coll_group_start(), COLL_OK);
  cr_assert_eq(coll_group_start(), COLL_OK);
  cr_assert_eq(coll_group_end(), COLL_OK);
  cr_assert_eq(coll_group_end(), COLL_OK); /* empty groups run nothing */
  cr_assert_eq(coll_group_end(), COLL_ERR_INVALID_ARG);
}

static int bad_peer_body(coll_comm_t comm, int rank, int n, void *argp) {
  (void)argp;
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  uint8_t out[1000], in[1001];
  fill(out, sizeof out, rank, next, 0, 9);
  memset(in, SENTINEL, sizeof in);
  TRY(coll_group_start());
  TRY(coll_send(out, sizeof out, COLL_UINT8, next, comm, NULL));
  /* Refused at once, with a sentence; the group stays usable. */
  coll_result r = coll_send(out, 10, COLL_UINT8, n, comm, NULL);
  if (r != COLL_ERR_INVALID_ARG || !strstr(coll_comm_last_error(comm), "peer"))
    return t_failf("rank %d: a bad peer inside a group gave %s: %s", rank, coll_result_string(r),
                   coll_comm_last_error(comm));
  r = coll_recv(in, 10, COLL_UINT8, rank, comm, NULL);
  if (r != COLL_ERR_INVALID_ARG)
    return t_failf("rank %d: a receive from itself was accepted", rank);
  TRY(coll_recv(in, sizeof out, COLL_UINT8, prev, comm, NULL));
  TRY(coll_group_end());
  if (check(in, sizeof out, sizeof in, prev, rank, 0, 9)) return 1;
  /* Ranks that disagree inside a group: rank 1 expects fewer bytes than rank 0 sends.
   * Its group end reports it (rank 0's send may complete before anything is noticed;
   * with COLL_CHECK on, rank 0 is told too). */
  if (rank > 1) return 0;
  TRY(coll_group_start());
  if (rank == 0)
    TRY(coll_send(out, 100, COLL_UINT8, 1, comm, NULL));
  else
    TRY(coll_recv(in, 50, COLL_UINT8, 0, comm, NULL));
  r = coll_group_end();
  if (rank == 1 && (r != COLL_ERR_MISMATCH || !strstr(coll_comm_last_error(comm), "rank 0")))
    return t_failf("rank 1: a group that disagrees with rank 0 ended with %s: %s",
                   coll_result_string(r), coll_comm_last_error(comm));
  if (rank == 0 && r != COLL_OK && r != COLL_ERR_MISMATCH)
    return t_failf("rank 0: %s: %s", coll_result_string(r), coll_comm_last_error(comm));
  return 0;
}

Test(group, errors_inside_a_group_are_reported, .timeout = 300) {
  run_ranks(2, bad_peer_body, NULL);
  run_ranks(3, bad_peer_body, NULL);
}
