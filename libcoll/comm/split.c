/* split.c — sub-communicators: coll_comm_split and coll_comm_dup, rendezvousing over
 * the parent communicator.
 *
 * A split is collective over the parent: every parent rank calls it, including ranks
 * that pass COLL_SPLIT_NOCOLOR and ranks of other colors.  The children are built by
 * comm.c's coll_comm_build_rv like any communicator, with the parent as the rendezvous
 * instead of the TCP bootstrap (no listener, no unique id).  Every parent rank takes
 * part in the same rounds, each one all-gather of fixed-size records over the parent:
 *
 *   round 0      (color, key, arguments ok?)        every rank learns every child's
 *                members, ordered by (key, parent rank); a bad argument on any rank
 *                (color < -1, newcomm NULL) makes every rank refuse the split.
 *   rounds 1..2  comm.c's two build rounds (rank_info; "everyone has connected"),
 *                carried for all children at once: each child picks its members'
 *                records in child-rank order.  A rank without a child sends nothing.
 *   last round   "built and tuned?"
 *
 * Every record carries failed_at (-1, or the parent rank where a failure started, with
 * its sentence).  A rank whose child fails half-way keeps taking part in the remaining
 * rounds with that flag set, so its peers fail at the next round instead of waiting for
 * COLL_TIMEOUT_MS; a failure that strikes after the last build round (ready, tuning)
 * reaches the child's members through the child itself (a failed build marks itself
 * aborted) and everyone else through the last round.  The outcome is the same on every
 * parent rank: all children exist, or none (a child built on one rank is freed again
 * when any rank failed), and every rank returns the same kind of error.
 *
 * Names: a child's secret keeps the parent's first 8 bytes (the job's: shared-segment
 * names start with them, so the launcher's clean-up and the tests see every segment
 * of a job) and takes hash(parent's secret, this parent's split count, color) as its
 * last 8, so segment names and TCP/IB hellos differ per child and every rank derives
 * the same secret without exchanging it.  TCP listens on the parent's local address.
 *
 * The exchanges are the library's own calls on the user's communicator: coll_work
 * `internal` (no sequence number, no COLL_CHECK, not traced), so the user's numbering
 * and checking on the parent are as if the split had not happened.
 *
 * Cost: 4 parent all-gathers, records of 16 bytes (round 0) and 16 + 1536 bytes, plus
 * the child's own set-up (transports, tuning) — the same as coll_comm_init_rank.
 *
 * Must never: share anything with the parent after it returns (connections, FIFOs,
 * executor, tuning: parent and children are used concurrently and destroyed in any
 * order), leave any parent rank waiting for a round another rank skipped, or return a
 * child on one rank that another rank of its color does not have.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { ARG_OK = 0, ARG_NULL_NEWCOMM = 1, ARG_BAD_COLOR = 2 };

typedef struct {
  int32_t failed_at; /* -1: fine so far; else the parent rank whose failure this is */
  int32_t color, key;
  int32_t arg; /* round 0: ARG_* */
  /* rounds 1..: build payload, or (failed_at >= 0) the failure's sentence */
  uint8_t payload[COLL_RV_MAX_BYTES];
} split_rec;
#define HEAD_BYTES offsetof(split_rec, payload)
_Static_assert(COLL_ERRBUF <= COLL_RV_MAX_BYTES, "a sentence fits a record");

typedef struct {
  struct coll_comm *parent;
  split_rec mine;
  uint8_t *all; /* nranks(parent) records of the round's length */
  int *members; /* parent ranks of this rank's child, by child rank */
  int nmembers;
  int rounds;    /* build rounds done (0..COLL_BUILD_ROUNDS) */
  bool broken;   /* the parent itself failed: no further rounds are possible */
  int failed_at; /* -1, or the parent rank where the first failure seen started */
  char why[COLL_ERRBUF];
} split_ctx;

static split_rec *rec(split_ctx *x, int p, size_t len) {
  return (split_rec *)(x->all + (size_t)p * len);
}

/* One all-gather of `len`-byte records over the parent, as the library's own call. */
static coll_result exchange(split_ctx *x, size_t len) {
  coll_work w = {.coll = COLL_COLL_ALL_GATHER,
                 .sendbuf = &x->mine,
                 .recvbuf = x->all,
                 .count = len,
                 .dtype = COLL_UINT8,
                 .internal = true};
  coll_result r = coll_exec_submit(x->parent, &w);
  if (r != COLL_OK) {
    x->broken = true;
    return coll_fail(x->parent, r,
                     "coll_comm_split on rank %d: the exchange over the "
                     "parent communicator failed: %s",
                     x->parent->rank, coll_comm_last_error(x->parent));
  }
  return COLL_OK;
}

/* After a round: adopt the first failure any rank reported (lowest parent rank). */
static void observe(split_ctx *x, size_t len) {
  if (x->failed_at >= 0) return;
  for (int p = 0; p < x->parent->nranks; p++) {
    split_rec *q = rec(x, p, len);
    if (q->failed_at >= 0 && q->failed_at < x->parent->nranks) {
      x->failed_at = q->failed_at;
      snprintf(x->why, sizeof x->why, "%.*s", (int)sizeof x->why - 1, (const char *)q->payload);
      return;
    }
  }
}

/* Fills this rank's record for a round after round 0: its failure, if any. */
static void post_state(split_ctx *x) {
  memset(&x->mine, 0, sizeof x->mine);
  x->mine.failed_at = x->failed_at;
  if (x->failed_at >= 0) snprintf((char *)x->mine.payload, COLL_ERRBUF, "%s", x->why);
}

/* ---- the parent as the child's rendezvous ----------------------------------------- */

static coll_result rv_join(coll_rendezvous *rv, struct coll_comm *child) {
  split_ctx *x = rv->ctx;
  /* TCP (and IB) listen on the address this rank's parent reached its peers by. */
  memcpy(&child->boot_local, &x->parent->boot_local, sizeof child->boot_local);
  child->boot_local_len = x->parent->boot_local_len;
  return COLL_OK;
}

static coll_result rv_allgather(coll_rendezvous *rv, struct coll_comm *child, const void *mine,
                                void *all, size_t len) {
  split_ctx *x = rv->ctx;
  const size_t full = sizeof(split_rec);
  if (len > COLL_RV_MAX_BYTES || x->rounds >= COLL_BUILD_ROUNDS)
    return coll_fail(child, COLL_ERR_INTERNAL,
                     "coll_comm_split on rank %d: build round %d "
                     "of %zu bytes does not fit the split's %d rounds of %d bytes",
                     x->parent->rank, x->rounds + 1, len, COLL_BUILD_ROUNDS, COLL_RV_MAX_BYTES);
  post_state(x);
  memcpy(x->mine.payload, mine, len);
  x->rounds++;
  coll_result r = exchange(x, full);
  if (r != COLL_OK) return coll_fail(child, r, "%s", coll_comm_last_error(x->parent));
  observe(x, full);
  if (x->failed_at >= 0)
    return coll_fail(child, COLL_ERR_REMOTE,
                     "coll_comm_split: parent rank %d could not "
                     "create its sub-communicator: %s",
                     x->failed_at, x->why);
  for (int i = 0; i < x->nmembers; i++)
    memcpy((uint8_t *)all + (size_t)i * len, rec(x, x->members[i], full)->payload, len);
  return COLL_OK;
}

static void rv_leave(coll_rendezvous *rv) { (void)rv; /* the parent stays */ }

/* Takes part in the build rounds this rank has not done (it has no child, or its
 * build stopped early), then in the last round.  Everyone must run all of them. */
static void finish_rounds(split_ctx *x) {
  const size_t full = sizeof(split_rec);
  while (x->rounds < COLL_BUILD_ROUNDS && !x->broken) {
    post_state(x);
    x->rounds++;
    if (exchange(x, full) == COLL_OK) observe(x, full);
  }
  if (x->broken) return;
  post_state(x);
  if (exchange(x, full) == COLL_OK) observe(x, full);
}

/* ---- secrets ----------------------------------------------------------------------- */

static void child_secret(const struct coll_comm *parent, uint32_t count, int32_t color,
                         uint8_t out[COLL_SECRET_BYTES]) {
  uint8_t in[COLL_SECRET_BYTES + 8];
  memcpy(in, parent->secret, COLL_SECRET_BYTES);
  for (int i = 0; i < 4; i++) {
    in[COLL_SECRET_BYTES + i] = (uint8_t)(count >> (8 * i));
    in[COLL_SECRET_BYTES + 4 + i] = (uint8_t)((uint32_t)color >> (8 * i));
  }
  uint64_t h = 1469598103934665603ull; /* FNV-1a, then splitmix64's finaliser */
  for (size_t i = 0; i < sizeof in; i++) h = (h ^ in[i]) * 1099511628211ull;
  h ^= h >> 30, h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27, h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  memcpy(out, parent->secret, 8);
  for (int i = 0; i < 8; i++) out[8 + i] = (uint8_t)(h >> (8 * i));
}

/* ---- the split ----------------------------------------------------------------------- */

typedef struct {
  int32_t key;
  int32_t prank;
} member;

static int by_key(const void *a, const void *b) {
  const member *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->prank > y->prank) - (x->prank < y->prank);
}

/* What rank p's round-0 record says was wrong with its arguments. */
static void arg_problem(const split_rec *q, char *out, size_t len) {
  if (q->arg == ARG_NULL_NEWCOMM)
    snprintf(out, len, "newcomm is NULL");
  else
    snprintf(out, len, "color %d is neither >= 0 nor COLL_SPLIT_NOCOLOR (-1)", (int)q->color);
}

/* Round 0 and the child's members.  COLL_OK with x->nmembers == 0 for NOCOLOR. */
static coll_result who(split_ctx *x, int color, int key, int arg) {
  struct coll_comm *parent = x->parent;
  int n = parent->nranks;
  memset(&x->mine, 0, sizeof x->mine);
  x->mine.failed_at = -1;
  x->mine.color = color;
  x->mine.key = key;
  x->mine.arg = arg;
  coll_result r = exchange(x, HEAD_BYTES);
  if (r != COLL_OK) return r;
  /* A rank that passed bad arguments names its own; the others name the first such. */
  char what[96];
  if (arg != ARG_OK) {
    arg_problem(rec(x, parent->rank, HEAD_BYTES), what, sizeof what);
    return coll_fail(parent, COLL_ERR_INVALID_ARG,
                     "coll_comm_split on rank %d: %s; no rank "
                     "splits",
                     parent->rank, what);
  }
  for (int p = 0; p < n; p++) {
    split_rec *q = rec(x, p, HEAD_BYTES);
    if (q->arg == ARG_OK) continue;
    arg_problem(q, what, sizeof what);
    return coll_fail(parent, COLL_ERR_INVALID_ARG,
                     "coll_comm_split on rank %d: rank %d passed "
                     "bad arguments (%s), so no rank splits",
                     parent->rank, p, what);
  }
  if (color == COLL_SPLIT_NOCOLOR) return COLL_OK;
  member *m = malloc((size_t)n * sizeof *m);
  x->members = malloc((size_t)n * sizeof *x->members);
  if (!m || !x->members) {
    free(m);
    return coll_fail(parent, COLL_ERR_SYSTEM, "coll_comm_split on rank %d: out of memory",
                     parent->rank);
  }
  int k = 0;
  for (int p = 0; p < n; p++) {
    split_rec *q = rec(x, p, HEAD_BYTES);
    if (q->color == color) m[k++] = (member){.key = q->key, .prank = p};
  }
  qsort(m, (size_t)k, sizeof *m, by_key);
  for (int i = 0; i < k; i++) x->members[i] = m[i].prank;
  x->nmembers = k;
  free(m);
  return COLL_OK;
}

coll_result coll_comm_split(coll_comm_t comm, int color, int key, coll_comm_t *newcomm) {
  if (!comm)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG,
                     "coll_comm_split: comm is NULL (the other "
                     "ranks wait for this one until COLL_TIMEOUT_MS)");
  if (newcomm) *newcomm = NULL;
  int arg = !newcomm ? ARG_NULL_NEWCOMM : color < COLL_SPLIT_NOCOLOR ? ARG_BAD_COLOR : ARG_OK;
  split_ctx x = {.parent = comm, .failed_at = -1};
  coll_comm_enter(comm);
  x.all = calloc((size_t)comm->nranks, sizeof(split_rec));
  if (!x.all) {
    /* Cannot take part: the others see this rank fail as an exchange that never comes. */
    coll_comm_leave(comm);
    return coll_fail(comm, COLL_ERR_SYSTEM,
                     "coll_comm_split on rank %d: out of memory for "
                     "%d records",
                     comm->rank, comm->nranks);
  }
  coll_result r = who(&x, color, key, arg);
  if (r != COLL_OK && (x.broken || r == COLL_ERR_INVALID_ARG)) {
    /* Every rank saw the same round 0: all refuse here, or the parent is broken. */
    free(x.all);
    free(x.members);
    coll_comm_leave(comm);
    return r;
  }
  /* Every rank counts every split that got past round 0: the same count everywhere. */
  uint32_t count = comm->nsplits++;
  if (r != COLL_OK) { /* out of memory after round 0: fail in the rounds to come */
    x.failed_at = comm->rank;
    snprintf(x.why, sizeof x.why, "%s", coll_comm_last_error(comm));
  }

  coll_comm_t child = NULL;
  coll_result own = r;
  if (r == COLL_OK && x.nmembers > 0) {
    int me = 0;
    while (x.members[me] != comm->rank) me++;
    uint8_t secret[COLL_SECRET_BYTES];
    child_secret(comm, count, color, secret);
    coll_rendezvous rv = {.join = rv_join, .allgather = rv_allgather, .leave = rv_leave, .ctx = &x};
    own = coll_comm_build_rv(&child, x.nmembers, me, secret, &rv);
    if (own != COLL_OK && x.failed_at < 0) { /* this rank's own failure: tell the others */
      x.failed_at = comm->rank;
      snprintf(x.why, sizeof x.why, "%s", coll_comm_last_error(NULL));
    }
    if (own == COLL_OK) {
      char tag[48];
      snprintf(tag, sizeof tag, "split%u-color%d", count, color);
      coll_trace_child_path(child, comm, tag);
    }
  }
  finish_rounds(&x);

  if (own == COLL_OK && !x.broken && x.failed_at < 0) {
    free(x.all);
    free(x.members);
    coll_comm_leave(comm);
    if (child)
      COLL_INFO(comm->rank, "coll_comm_split #%u: color %d key %d -> rank %d of %d", count, color,
                key, child->rank, child->nranks);
    *newcomm = child;
    return COLL_OK;
  }
  /* Someone failed: no rank keeps a child (its members free theirs too). */
  if (child) coll_comm_free(child);
  if (own != COLL_OK && x.failed_at == comm->rank)
    r = coll_fail(comm, own, "%s", x.why); /* this rank's own failure, as it happened */
  else if (x.broken)
    r = coll_fail(comm, COLL_ERR_REMOTE, "%s", coll_comm_last_error(comm));
  else
    r = coll_fail(comm, COLL_ERR_REMOTE,
                  "coll_comm_split on rank %d: parent rank %d could "
                  "not create its sub-communicator, so no rank keeps one: %s",
                  comm->rank, x.failed_at, x.why);
  free(x.all);
  free(x.members);
  coll_comm_leave(comm);
  return r;
}

coll_result coll_comm_dup(coll_comm_t comm, coll_comm_t *newcomm) {
  if (!comm)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG,
                     "coll_comm_dup: comm is NULL (the other "
                     "ranks wait for this one until COLL_TIMEOUT_MS)");
  return coll_comm_split(comm, 0, comm->rank, newcomm);
}
