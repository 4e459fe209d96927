/* group.c — grouped calls: coll_group_start / coll_group_end, as NCCL's ncclGroupStart /
 * ncclGroupEnd.
 *
 * Between the outermost start and its end (per thread; starts nest), api.c checks each
 * call's arguments and hands the work here instead of to the executor.  The call returns
 * COLL_OK, or its argument error at once (that call is left out; the group stays open
 * and usable), and nothing runs.  The outermost end then enqueues, for each
 * communicator in the order the group first used it:
 *   1. its collectives (and barriers), in call order, each as the work it would have been;
 *   2. ALL its send / recv / sendrecv calls merged into one work, COLL_COLL_GROUP_P2P,
 *      whose plan (plan.c) has one step per call.  The executor interleaves every step's
 *      slices round by round, so all the group's sends and receives progress together.
 * "Collectives first, point-to-point last" is a rule every rank applies the same way
 * whatever order it made its calls in, so the ranks' queues stay in step.  Every work is
 * enqueued asynchronously, on the caller's stream or, for calls made with a NULL stream,
 * on one internal stream of this coll_group_end; each communicator's progress thread
 * runs its own queue, so a group spanning communicators progresses on all of them at
 * once.  The end then waits for the internal stream and returns the first error; work
 * on the caller's streams reports its errors through coll_stream_synchronize.
 *
 * Why the merged point-to-point work cannot deadlock, whatever the call order.  Its plan
 * puts every send step before every receive step, and delays each step so that one
 * connection (a peer and a direction) carries at most one slice per round; both ends
 * count the same slices from matching counts, so the k-th slice of a connection is sent
 * and received in the same round.  The executor runs round j's slice of every step in
 * step order, and a receive hands its slot back within its round.  So a rank waiting in
 * round j
 *   - to send to q finds q's FIFO full: it holds a slice (every transport has at least
 *     one slot: shm 8, tcp 4 plus the socket's buffers, ib 8, cuda_ipc 4) that was sent
 *     in an earlier round and not yet handed back, so q is still in a round below j;
 *   - to receive from q lacks q's round-j slice: q is in a round below j, or in round j
 *     but not yet past its sends, i.e. itself waiting to send, on a rank below round j.
 * Hence the ranks waiting in the lowest round wait for nobody: one of them moves.  (This
 * needs each rank's matching calls in its own group; a group met by plain calls on the
 * other side works when their order allows it, as plain calls do.)
 *
 * Calls on device memory or a cudaStream_t: collectives are deferred as they are;
 * grouped point-to-point calls on them are refused (COLL_ERR_UNSUPPORTED) — the merged
 * work runs on host memory only.  All grouped point-to-point calls on one communicator
 * must use one stream (they become one work); a call that does not is refused.
 *
 * Must never: run anything before the outermost end, reorder a communicator's
 * collectives, allocate on the executor's data path (the merged work's lists and plan
 * are made here; the executor frees them when the work completes), or leave the
 * thread's group state half-cleared on any path out of coll_group_end.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "device_ops.h"
#include "internal.h"
#include "plan.h"

typedef struct {
  struct coll_comm *comm;
  const char *fn; /* the API call, for sentences */
  coll_work w;    /* as api.c built it, arguments checked */
} rec;

/* This thread's group: how deep the starts nest, and the calls recorded so far. */
static _Thread_local struct {
  int depth;
  rec *recs;
  size_t n, cap;
} G;

static bool is_p2p(coll_coll_kind c) {
  return c == COLL_COLL_SEND || c == COLL_COLL_RECV || c == COLL_COLL_SENDRECV;
}

bool coll_group_open(void) { return G.depth > 0; }

coll_result coll_group_start(void) {
  if (G.depth == INT_MAX)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_group_start: groups nested %d deep",
                     INT_MAX);
  G.depth++;
  return COLL_OK;
}

coll_result coll_group_record(struct coll_comm *comm, const char *fn, const coll_work *w) {
  if (is_p2p(w->coll)) {
    if (w->stream && w->stream->cuda)
      return coll_fail(comm, COLL_ERR_UNSUPPORTED,
                       "%s on rank %d inside a group: grouped point-to-point calls on a "
                       "cudaStream_t are not supported; make this call outside the group",
                       fn, comm->rank);
    coll_work probe = *w; /* no stream: only tells host from device memory */
    probe.stream = NULL;
    coll_result r = coll_submit_classify(comm, fn, &probe);
    if (r != COLL_OK) return r;
    if (probe.device)
      return coll_fail(comm, COLL_ERR_UNSUPPORTED,
                       "%s on rank %d inside a group: grouped point-to-point calls on device "
                       "memory are not supported; make this call outside the group",
                       fn, comm->rank);
    /* The latest earlier one decides: every one before it already agreed with it. */
    for (size_t i = G.n; i-- > 0;)
      if (G.recs[i].comm == comm && is_p2p(G.recs[i].w.coll)) {
        if (G.recs[i].w.stream != w->stream)
          return coll_fail(comm, COLL_ERR_INVALID_ARG,
                           "%s on rank %d inside a group: the group's send/recv calls on one "
                           "communicator run as one piece of work, so they must all use the "
                           "same stream (%s before used %s)",
                           fn, comm->rank, G.recs[i].fn,
                           G.recs[i].w.stream ? "another stream" : "a NULL stream");
        break;
      }
  }
  if (G.n == G.cap) {
    size_t cap = G.cap ? 2 * G.cap : 16;
    rec *more = cap > SIZE_MAX / sizeof *more ? NULL : realloc(G.recs, cap * sizeof *more);
    if (!more)
      return coll_fail(comm, COLL_ERR_SYSTEM,
                       "%s on rank %d: out of memory recording the call "
                       "in its group",
                       fn, comm->rank);
    G.recs = more;
    G.cap = cap;
  }
  G.recs[G.n++] = (rec){.comm = comm, .fn = fn, .w = *w};
  return COLL_OK;
}

bool coll_group_holds(const struct coll_comm *comm) {
  for (size_t i = 0; i < G.n; i++)
    if (G.recs[i].comm == comm) return true;
  return false;
}

void coll_group_forget(const struct coll_comm *comm) {
  size_t k = 0;
  for (size_t i = 0; i < G.n; i++)
    if (G.recs[i].comm != comm) G.recs[k++] = G.recs[i];
  G.n = k;
}

/* ---- the outermost end ---------------------------------------------------------------- */

static size_t ops_of(const coll_work *w, int rank) {
  return w->coll == COLL_COLL_SENDRECV && w->root != rank ? 2 : 1;
}

/* Merges comm's point-to-point calls among recs[from..n) into one work on stream s. */
static coll_result submit_p2p(struct coll_comm *comm, const rec *recs, size_t from, size_t n,
                              struct coll_stream *s) {
  size_t nops = 0, total = 0, each = sizeof(coll_step) + sizeof(coll_group_op) + 2 * sizeof(void *);
  for (size_t k = from; k < n; k++)
    if (recs[k].comm == comm && is_p2p(recs[k].w.coll)) nops += ops_of(&recs[k].w, comm->rank);
  size_t bytes;
  coll_group_p2p *g = NULL;
  size_t *scratch = calloc(2 * (size_t)comm->nranks, sizeof *scratch);
  if (!__builtin_mul_overflow(nops, each, &bytes) &&
      !__builtin_add_overflow(bytes, sizeof *g, &bytes))
    g = malloc(bytes);
  if (!g || !scratch) {
    free(g);
    free(scratch);
    return coll_fail(comm, COLL_ERR_SYSTEM,
                     "coll_group_end on rank %d: out of memory for the "
                     "group's %zu point-to-point operations",
                     comm->rank, nops);
  }
  /* One block: the struct, then steps, ops, src, dst (each a multiple of 8 bytes). */
  g->n = nops;
  g->nsteps = 0;
  g->steps = (coll_step *)(g + 1);
  g->ops = (coll_group_op *)(g->steps + nops);
  g->src = (const void **)(g->ops + nops);
  g->dst = (void **)(g->src + nops);
  size_t i = 0;
  for (size_t k = from; k < n; k++) {
    const coll_work *w = &recs[k].w;
    if (recs[k].comm != comm || !is_p2p(w->coll)) continue;
    size_t es = coll_elem_bytes(w->dtype); /* api.c checked count * es fits */
    switch (w->coll) {
    case COLL_COLL_SEND:
      g->ops[i] = (coll_group_op){COLL_STEP_SEND, w->root, w->count * es};
      g->src[i] = w->sendbuf, g->dst[i++] = NULL;
      break;
    case COLL_COLL_RECV:
      g->ops[i] = (coll_group_op){COLL_STEP_RECV, w->root, w->count * es};
      g->src[i] = NULL, g->dst[i++] = w->recvbuf;
      break;
    default: /* sendrecv: a copy when to itself, else a send and a receive */
      if (w->root == comm->rank) {
        g->ops[i] = (coll_group_op){COLL_STEP_COPY, w->root, w->count * es};
        g->src[i] = w->sendbuf, g->dst[i++] = w->recvbuf;
        break;
      }
      g->ops[i] = (coll_group_op){COLL_STEP_SEND, w->root, w->count * es};
      g->src[i] = w->sendbuf, g->dst[i++] = NULL;
      g->ops[i] = (coll_group_op){COLL_STEP_RECV, w->recv_peer, w->recv_count * es};
      g->src[i] = NULL, g->dst[i++] = w->recvbuf;
    }
  }
  for (i = 0; i < nops; i++) total += g->ops[i].count;
  /* The executor cuts this work into slices of comm->slot_bytes (es = 1): so do we. */
  coll_plan_args a = {.coll = COLL_COLL_GROUP_P2P,
                      .nranks = comm->nranks,
                      .rank = comm->rank,
                      .slice = comm->slot_bytes,
                      .group = g->ops,
                      .ngroup = nops,
                      .scratch = scratch};
  coll_result r = coll_plan_build(&a, g->steps, &g->nsteps);
  free(scratch);
  if (r != COLL_OK) {
    free(g);
    return coll_fail(comm, COLL_ERR_INTERNAL,
                     "coll_group_end on rank %d: no plan for the "
                     "group's %zu point-to-point operations",
                     comm->rank, nops);
  }
  coll_work w = {
      .coll = COLL_COLL_GROUP_P2P, .count = total, .dtype = COLL_UINT8, .stream = s, .group = g};
  coll_comm_enter(comm);
  r = coll_exec_submit(comm, &w); /* enqueued, or refused and freed: g is not ours now */
  coll_comm_leave(comm);
  return r;
}

/* Enqueues every recorded call (see the top comment) and waits for those that had no
 * stream.  Returns the first error. */
static coll_result run(rec *recs, size_t n) {
  struct coll_stream local; /* the calls made with a NULL stream: a host stream */
  coll_stream_init(&local, &coll_device_host);
  coll_result first = COLL_OK, r;
  for (size_t i = 0; i < n; i++) {
    struct coll_comm *comm = recs[i].comm;
    if (!comm) continue; /* its communicator was done at its first appearance */
    struct coll_stream *ps = NULL;
    bool p2p = false;
    for (size_t k = i; k < n; k++) {
      if (recs[k].comm != comm) continue;
      if (is_p2p(recs[k].w.coll)) {
        p2p = true;
        ps = recs[k].w.stream; /* the same for all of them (coll_group_record) */
        continue;
      }
      coll_work w = recs[k].w;
      if (!w.stream) w.stream = &local;
      if ((r = coll_submit(comm, recs[k].fn, &w)) != COLL_OK && first == COLL_OK) first = r;
    }
    if (p2p && (r = submit_p2p(comm, recs, i, n, ps ? ps : &local)) != COLL_OK && first == COLL_OK)
      first = r;
    for (size_t k = i; k < n; k++)
      if (recs[k].comm == comm) recs[k].comm = NULL;
  }
  pthread_mutex_lock(&local.mu);
  while (local.completed < local.enqueued) pthread_cond_wait(&local.cv, &local.mu);
  pthread_mutex_unlock(&local.mu);
  if (local.err != COLL_OK && first == COLL_OK) {
    first = local.err;
    coll_fail(NULL, first, "%s", local.errmsg); /* its communicator has the sentence too */
  }
  pthread_mutex_destroy(&local.mu);
  pthread_cond_destroy(&local.cv);
  return first;
}

coll_result coll_group_end(void) {
  if (G.depth == 0)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG,
                     "coll_group_end: no group is open in this thread (every coll_group_end "
                     "needs a coll_group_start before it)");
  if (--G.depth > 0) return COLL_OK; /* an inner end: the outermost one runs the group */
  rec *recs = G.recs;
  size_t n = G.n;
  G.recs = NULL;
  G.n = G.cap = 0;
  coll_result r = n ? run(recs, n) : COLL_OK;
  free(recs);
  return r;
}
