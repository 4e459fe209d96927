/* api.c — the collective entry points: check every argument, then hand the work to the
 * executor (or, inside coll_group_start/end, to group.c, which keeps it for the group's
 * end).
 *
 * Everything a caller can get wrong is refused here, before a byte moves, with
 * COLL_ERR_INVALID_ARG and a sentence naming the call and the argument: so a rank that
 * passes bad arguments fails at once instead of leaving its peers waiting half-way
 * through a ring.  Must never block or touch the user's buffers, and allocates only one
 * thing: the copy of all_to_allv's counts and displacements for a call on a stream,
 * which returns before the call runs (the executor frees it when the work finishes).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "watch.h"

typedef struct {
  const char *fn;
  coll_comm_t comm;
} ctx;

/* A refused call: the sentence, and the peers hear of it (watch.c) so that a rank that
 * made this call validly fails it at once instead of waiting for this one. */
static coll_result refused(struct coll_comm *comm, coll_result r) {
  coll_watch_refused(comm, atomic_load(&comm->next_seq));
  return r;
}
#define BAD(c, ...) refused((c)->comm, coll_fail((c)->comm, COLL_ERR_INVALID_ARG, __VA_ARGS__))

static coll_result check_comm(ctx *c) {
  if (!c->comm) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "%s: comm is NULL", c->fn);
  return COLL_OK;
}

static coll_result check_dtype(ctx *c, coll_dtype d) {
  if ((unsigned)d >= COLL_NUM_DTYPES)
    return BAD(c, "%s on rank %d: dtype %d is not a coll_dtype", c->fn, c->comm->rank, (int)d);
  return COLL_OK;
}

static coll_result check_op(ctx *c, coll_op op) {
  if ((unsigned)op >= COLL_NUM_OPS)
    return BAD(c, "%s on rank %d: op %d is not a coll_op", c->fn, c->comm->rank, (int)op);
  return COLL_OK;
}

static coll_result check_rank_arg(ctx *c, int r, const char *what) {
  if (r < 0 || r >= c->comm->nranks)
    return BAD(c, "%s on rank %d: %s %d is outside 0..%d", c->fn, c->comm->rank, what, r,
               c->comm->nranks - 1);
  return COLL_OK;
}

/* bytes = count * elem * mult, refusing anything that does not fit a size_t or a pointer
 * range (count near SIZE_MAX is a classic negative-int-cast bug in callers). */
static coll_result check_bytes(ctx *c, size_t count, coll_dtype d, size_t mult, size_t *bytes) {
  size_t es = coll_elem_bytes(d), b;
  if (__builtin_mul_overflow(count, es, &b) || __builtin_mul_overflow(b, mult, &b) ||
      b > (size_t)PTRDIFF_MAX)
    return BAD(c, "%s on rank %d: count %zu of %s%s overflows the address space", c->fn,
               c->comm->rank, count, coll_dtype_name(d), mult > 1 ? " times nranks" : "");
  *bytes = b;
  return COLL_OK;
}

static coll_result check_buf(ctx *c, const void *p, size_t bytes, const char *name) {
  if (!p && bytes > 0)
    return BAD(c, "%s on rank %d: %s is NULL but %zu bytes are to be moved", c->fn, c->comm->rank,
               name, bytes);
  return COLL_OK;
}

/* Out-of-place buffers must not overlap at all: a partial overlap would be overwritten
 * while still being read. */
static coll_result check_overlap(ctx *c, const void *a, size_t alen, const void *b, size_t blen) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  if (!a || !b || !alen || !blen) return COLL_OK;
  if (x < y + blen && y < x + alen)
    return BAD(c,
               "%s on rank %d: send and receive buffers overlap but are not the in-place "
               "arrangement",
               c->fn, c->comm->rank);
  return COLL_OK;
}

static coll_result submit(ctx *c, coll_work *w) {
  if (coll_group_open()) return coll_group_record(c->comm, c->fn, w); /* runs at group end */
  return coll_submit(c->comm, c->fn, w);
}

#define TRY(x)                    \
  do {                            \
    coll_result r_ = (x);         \
    if (r_ != COLL_OK) return r_; \
  } while (0)

coll_result coll_all_reduce(const void *sendbuf, void *recvbuf, size_t count, coll_dtype dtype,
                            coll_op op, coll_comm_t comm, coll_stream_t s) {
  ctx c = {"coll_all_reduce", comm};
  size_t bytes = 0;
  TRY(check_comm(&c));
  TRY(check_dtype(&c, dtype));
  TRY(check_op(&c, op));
  TRY(check_bytes(&c, count, dtype, 1, &bytes));
  TRY(check_buf(&c, sendbuf, bytes, "sendbuf"));
  TRY(check_buf(&c, recvbuf, bytes, "recvbuf"));
  if (sendbuf != recvbuf) TRY(check_overlap(&c, sendbuf, bytes, recvbuf, bytes));
  coll_work w = {.coll = COLL_COLL_ALL_REDUCE,
                 .sendbuf = sendbuf,
                 .recvbuf = recvbuf,
                 .count = count,
                 .dtype = dtype,
                 .op = op,
                 .stream = s};
  return submit(&c, &w);
}

coll_result coll_broadcast(const void *sendbuf, void *recvbuf, size_t count, coll_dtype dtype,
                           int root, coll_comm_t comm, coll_stream_t s) {
  ctx c = {"coll_broadcast", comm};
  size_t bytes = 0;
  TRY(check_comm(&c));
  TRY(check_dtype(&c, dtype));
  TRY(check_rank_arg(&c, root, "root"));
  TRY(check_bytes(&c, count, dtype, 1, &bytes));
  if (comm->rank == root) {
    TRY(check_buf(&c, sendbuf, bytes, "sendbuf"));
    if (sendbuf != recvbuf) TRY(check_overlap(&c, sendbuf, bytes, recvbuf, bytes));
  }
  TRY(check_buf(&c, recvbuf, bytes, "recvbuf"));
  coll_work w = {.coll = COLL_COLL_BROADCAST,
                 .sendbuf = comm->rank == root ? sendbuf : recvbuf,
                 .recvbuf = recvbuf,
                 .count = count,
                 .dtype = dtype,
                 .root = root,
                 .stream = s};
  return submit(&c, &w);
}

coll_result coll_reduce(const void *sendbuf, void *recvbuf, size_t count, coll_dtype dtype,
                        coll_op op, int root, coll_comm_t comm, coll_stream_t s) {
  ctx c = {"coll_reduce", comm};
  size_t bytes = 0;
  TRY(check_comm(&c));
  TRY(check_dtype(&c, dtype));
  TRY(check_op(&c, op));
  TRY(check_rank_arg(&c, root, "root"));
  TRY(check_bytes(&c, count, dtype, 1, &bytes));
  TRY(check_buf(&c, sendbuf, bytes, "sendbuf"));
  if (comm->rank == root) {
    TRY(check_buf(&c, recvbuf, bytes, "recvbuf"));
    if (sendbuf != recvbuf) TRY(check_overlap(&c, sendbuf, bytes, recvbuf, bytes));
  }
  coll_work w = {.coll = COLL_COLL_REDUCE,
                 .sendbuf = sendbuf,
                 .recvbuf = comm->rank == root ? recvbuf : NULL,
                 .count = count,
                 .dtype = dtype,
                 .op = op,
                 .root = root,
                 .stream = s};
  return submit(&c, &w);
}

coll_result coll_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                coll_dtype dtype, coll_op op, coll_comm_t comm, coll_stream_t s) {
  ctx c = {"coll_reduce_scatter", comm};
  size_t bytes = 0, total = 0;
  TRY(check_comm(&c));
  TRY(check_dtype(&c, dtype));
  TRY(check_op(&c, op));
  TRY(check_bytes(&c, recvcount, dtype, 1, &bytes));
  TRY(check_bytes(&c, recvcount, dtype, (size_t)comm->nranks, &total));
  TRY(check_buf(&c, sendbuf, total, "sendbuf"));
  TRY(check_buf(&c, recvbuf, bytes, "recvbuf"));
  bool in_place = sendbuf && (const char *)sendbuf + (size_t)comm->rank * bytes == recvbuf;
  if (!in_place) TRY(check_overlap(&c, sendbuf, total, recvbuf, bytes));
  coll_work w = {.coll = COLL_COLL_REDUCE_SCATTER,
                 .sendbuf = sendbuf,
                 .recvbuf = recvbuf,
                 .count = recvcount,
                 .dtype = dtype,
                 .op = op,
                 .stream = s};
  return submit(&c, &w);
}

coll_result coll_all_gather(const void *sendbuf, void *recvbuf, size_t sendcount, coll_dtype dtype,
                            coll_comm_t comm, coll_stream_t s) {
  ctx c = {"coll_all_gather", comm};
  size_t bytes = 0, total = 0;
  TRY(check_comm(&c));
  TRY(check_dtype(&c, dtype));
  TRY(check_bytes(&c, sendcount, dtype, 1, &bytes));
  TRY(check_bytes(&c, sendcount, dtype, (size_t)comm->nranks, &total));
  TRY(check_buf(&c, sendbuf, bytes, "sendbuf"));
  TRY(check_buf(&c, recvbuf, total, "recvbuf"));
  bool in_place = recvbuf && (const char *)recvbuf + (size_t)comm->rank * bytes == sendbuf;
  if (!in_place) TRY(check_overlap(&c, sendbuf, bytes, recvbuf, total));
  coll_work w = {.coll = COLL_COLL_ALL_GATHER,
                 .sendbuf = sendbuf,
                 .recvbuf = recvbuf,
                 .count = sendcount,
                 .dtype = dtype,
                 .stream = s};
  return submit(&c, &w);
}

static coll_result p2p(ctx *c, bool send, void *buf, size_t count, coll_dtype dtype, int peer,
                       coll_stream_t s) {
  size_t bytes = 0;
  TRY(check_comm(c));
  TRY(check_dtype(c, dtype));
  TRY(check_rank_arg(c, peer, "peer"));
  if (peer == c->comm->rank)
    return BAD(c, "%s on rank %d: peer is this rank itself (copy locally instead)", c->fn,
               c->comm->rank);
  TRY(check_bytes(c, count, dtype, 1, &bytes));
  TRY(check_buf(c, buf, bytes, "buf"));
  coll_work w = {.coll = send ? COLL_COLL_SEND : COLL_COLL_RECV,
                 .sendbuf = buf,
                 .recvbuf = buf,
                 .count = count,
                 .dtype = dtype,
                 .root = peer,
                 .stream = s};
  return submit(c, &w);
}

coll_result coll_send(const void *buf, size_t count, coll_dtype dtype, int peer, coll_comm_t comm,
                      coll_stream_t s) {
  ctx c = {"coll_send", comm};
  return p2p(&c, true, (void *)(uintptr_t)buf, count, dtype, peer, s);
}

coll_result coll_recv(void *buf, size_t count, coll_dtype dtype, int peer, coll_comm_t comm,
                      coll_stream_t s) {
  ctx c = {"coll_recv", comm};
  return p2p(&c, false, buf, count, dtype, peer, s);
}

coll_result coll_sendrecv(const void *sendbuf, size_t sendcount, int dst, void *recvbuf,
                          size_t recvcount, int src, coll_dtype dtype, coll_comm_t comm,
                          coll_stream_t s) {
  ctx c = {"coll_sendrecv", comm};
  size_t sbytes = 0, rbytes = 0;
  TRY(check_comm(&c));
  TRY(check_dtype(&c, dtype));
  TRY(check_rank_arg(&c, dst, "dst"));
  TRY(check_rank_arg(&c, src, "src"));
  if ((dst == comm->rank) != (src == comm->rank))
    return BAD(&c,
               "coll_sendrecv on rank %d: dst %d and src %d must both be this rank or "
               "both be other ranks",
               comm->rank, dst, src);
  TRY(check_bytes(&c, sendcount, dtype, 1, &sbytes));
  TRY(check_bytes(&c, recvcount, dtype, 1, &rbytes));
  if (dst == comm->rank && sendcount != recvcount)
    return BAD(&c,
               "coll_sendrecv on rank %d: a copy to itself needs sendcount (%zu) == "
               "recvcount (%zu)",
               comm->rank, sendcount, recvcount);
  TRY(check_buf(&c, sendbuf, sbytes, "sendbuf"));
  TRY(check_buf(&c, recvbuf, rbytes, "recvbuf"));
  if (sendbuf != recvbuf || dst != comm->rank)
    TRY(check_overlap(&c, sendbuf, sbytes, recvbuf, rbytes));
  coll_work w = {.coll = COLL_COLL_SENDRECV,
                 .sendbuf = sendbuf,
                 .recvbuf = recvbuf,
                 .count = sendcount,
                 .dtype = dtype,
                 .root = dst,
                 .recv_count = recvcount,
                 .recv_peer = src,
                 .stream = s};
  return submit(&c, &w);
}

coll_result coll_barrier(coll_comm_t comm, coll_stream_t s) {
  ctx c = {"coll_barrier", comm};
  TRY(check_comm(&c));
  coll_work w = {
      .coll = COLL_COLL_BARRIER, .count = 1, .dtype = COLL_UINT8, .op = COLL_MAX, .stream = s};
  return submit(&c, &w);
}

/* ---- all-to-all, gather, scatter -------------------------------------------------- */

coll_result coll_all_to_all(const void *sendbuf, void *recvbuf, size_t count, coll_dtype dtype,
                            coll_comm_t comm, coll_stream_t s) {
  ctx c = {"coll_all_to_all", comm};
  size_t total = 0;
  TRY(check_comm(&c));
  TRY(check_dtype(&c, dtype));
  TRY(check_bytes(&c, count, dtype, (size_t)comm->nranks, &total));
  TRY(check_buf(&c, sendbuf, total, "sendbuf"));
  TRY(check_buf(&c, recvbuf, total, "recvbuf"));
  if (sendbuf != recvbuf) TRY(check_overlap(&c, sendbuf, total, recvbuf, total));
  coll_work w = {.coll = COLL_COLL_ALL_TO_ALL,
                 .sendbuf = sendbuf,
                 .recvbuf = recvbuf,
                 .count = count,
                 .dtype = dtype,
                 .stream = s};
  return submit(&c, &w);
}

/* The elements [0, *extent) of a v-form buffer that its blocks reach, refusing a block
 * whose end does not fit the address space. */
static coll_result v_extent(ctx *c, const size_t *counts, const size_t *displs, const char *cname,
                            const char *dname, coll_dtype d, size_t *extent) {
  size_t es = coll_elem_bytes(d), end, bytes;
  *extent = 0;
  for (int j = 0; j < c->comm->nranks; j++) {
    if (counts[j] == 0) continue;
    if (__builtin_add_overflow(displs[j], counts[j], &end) ||
        __builtin_mul_overflow(end, es, &bytes) || bytes > (size_t)PTRDIFF_MAX)
      return BAD(c,
                 "%s on rank %d: %s[%d] + %s[%d] (%zu + %zu elements of %s) overflows the "
                 "address space",
                 c->fn, c->comm->rank, dname, j, cname, j, displs[j], counts[j],
                 coll_dtype_name(d));
    if (bytes > *extent) *extent = bytes;
  }
  return COLL_OK;
}

coll_result coll_all_to_allv(const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                             void *recvbuf, const size_t *recvcounts, const size_t *rdispls,
                             coll_dtype dtype, coll_comm_t comm, coll_stream_t s) {
  ctx c = {"coll_all_to_allv", comm};
  TRY(check_comm(&c));
  TRY(check_dtype(&c, dtype));
  const size_t *arr[4] = {sendcounts, sdispls, recvcounts, rdispls};
  static const char *const names[4] = {"sendcounts", "sdispls", "recvcounts", "rdispls"};
  for (int i = 0; i < 4; i++)
    if (!arr[i])
      return BAD(&c, "coll_all_to_allv on rank %d: %s is NULL (it needs one entry per rank)",
                 comm->rank, names[i]);
  int me = comm->rank, n = comm->nranks;
  if (sendcounts[me] != recvcounts[me])
    return BAD(&c,
               "coll_all_to_allv on rank %d: sendcounts[%d] (%zu) must equal "
               "recvcounts[%d] (%zu): it is the block this rank sends itself",
               me, me, sendcounts[me], me, recvcounts[me]);
  size_t sext, rext, total = 0;
  TRY(v_extent(&c, sendcounts, sdispls, "sendcounts", "sdispls", dtype, &sext));
  TRY(v_extent(&c, recvcounts, rdispls, "recvcounts", "rdispls", dtype, &rext));
  TRY(check_buf(&c, sendbuf, sext, "sendbuf"));
  TRY(check_buf(&c, recvbuf, rext, "recvbuf"));
  if (sendbuf && sendbuf == recvbuf && sext && rext)
    return BAD(&c,
               "coll_all_to_allv on rank %d: sendbuf == recvbuf, but all_to_allv does "
               "not work in place (blocks of different sizes would overwrite blocks not yet "
               "sent): use separate buffers",
               me);
  TRY(check_overlap(&c, sendbuf, sext, recvbuf, rext));
  for (int j = 0; j < n; j++)
    total = __builtin_add_overflow(total, sendcounts[j], &total) ? SIZE_MAX : total;
  coll_work w = {.coll = COLL_COLL_ALL_TO_ALLV,
                 .sendbuf = sendbuf,
                 .recvbuf = recvbuf,
                 .count = total,
                 .dtype = dtype,
                 .stream = s,
                 .sendcounts = sendcounts,
                 .sdispls = sdispls,
                 .recvcounts = recvcounts,
                 .rdispls = rdispls};
  if (s) {
    /* The call runs after we return: keep our own copy of the arrays. */
    size_t *v = malloc(4 * (size_t)n * sizeof *v);
    if (!v)
      return coll_fail(comm, COLL_ERR_SYSTEM,
                       "coll_all_to_allv on rank %d: out of memory "
                       "copying the counts and displacements (%zu bytes)",
                       me, 4 * (size_t)n * sizeof *v);
    for (int i = 0; i < 4; i++) memcpy(v + (size_t)i * (size_t)n, arr[i], (size_t)n * sizeof *v);
    w.v_copy = v;
    w.sendcounts = v, w.sdispls = v + n, w.recvcounts = v + 2 * (size_t)n,
    w.rdispls = v + 3 * (size_t)n;
  }
  return submit(&c, &w);
}

coll_result coll_gather(const void *sendbuf, void *recvbuf, size_t sendcount, coll_dtype dtype,
                        int root, coll_comm_t comm, coll_stream_t s) {
  ctx c = {"coll_gather", comm};
  size_t bytes = 0, total = 0;
  TRY(check_comm(&c));
  TRY(check_dtype(&c, dtype));
  TRY(check_rank_arg(&c, root, "root"));
  TRY(check_bytes(&c, sendcount, dtype, 1, &bytes));
  TRY(check_bytes(&c, sendcount, dtype, (size_t)comm->nranks, &total));
  TRY(check_buf(&c, sendbuf, bytes, "sendbuf"));
  bool is_root = comm->rank == root;
  if (is_root) {
    TRY(check_buf(&c, recvbuf, total, "recvbuf"));
    bool in_place = recvbuf && (const char *)recvbuf + (size_t)root * bytes == sendbuf;
    if (!in_place) TRY(check_overlap(&c, sendbuf, bytes, recvbuf, total));
  }
  coll_work w = {.coll = COLL_COLL_GATHER,
                 .sendbuf = sendbuf,
                 .recvbuf = is_root ? recvbuf : NULL,
                 .count = sendcount,
                 .dtype = dtype,
                 .root = root,
                 .stream = s};
  return submit(&c, &w);
}

coll_result coll_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, coll_dtype dtype,
                         int root, coll_comm_t comm, coll_stream_t s) {
  ctx c = {"coll_scatter", comm};
  size_t bytes = 0, total = 0;
  TRY(check_comm(&c));
  TRY(check_dtype(&c, dtype));
  TRY(check_rank_arg(&c, root, "root"));
  TRY(check_bytes(&c, recvcount, dtype, 1, &bytes));
  TRY(check_bytes(&c, recvcount, dtype, (size_t)comm->nranks, &total));
  TRY(check_buf(&c, recvbuf, bytes, "recvbuf"));
  bool is_root = comm->rank == root;
  if (is_root) {
    TRY(check_buf(&c, sendbuf, total, "sendbuf"));
    bool in_place = sendbuf && (const char *)sendbuf + (size_t)root * bytes == recvbuf;
    if (!in_place) TRY(check_overlap(&c, sendbuf, total, recvbuf, bytes));
  }
  coll_work w = {.coll = COLL_COLL_SCATTER,
                 .sendbuf = is_root ? sendbuf : NULL,
                 .recvbuf = recvbuf,
                 .count = recvcount,
                 .dtype = dtype,
                 .root = root,
                 .stream = s};
  return submit(&c, &w);
}
