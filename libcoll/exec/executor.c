/* executor.c — runs schedules, slice by slice, through the connectors.
 *
 * One progress thread per communicator takes work from the communicator's queue in call
 * order.  A blocking call that finds the queue empty runs its work inline on the
 * caller's thread instead (no hand-off: that saves two thread wake-ups per small call,
 * which is most of the latency when ranks outnumber cores).
 *
 * Running a plan: every step's range is cut into slices of one FIFO slot.  Steps are
 * interleaved round by round — round j does slice j - delay of every step, in step order —
 * which is what lets a ring make progress with a FIFO of any depth: a rank never has
 * to push a whole chunk before it starts receiving, so the sends of all ranks can never
 * fill every FIFO at once and wait on each other.  Within a round the order is the same
 * on both ends of every connection, so slices pair up without negotiation.
 *
 * A group's point-to-point work (COLL_COLL_GROUP_P2P, group.c) arrives with its plan
 * already built: one step per grouped send or receive, each over its own buffer (the
 * step's `item`), in bytes.  It runs through the same rounds.
 *
 * Device work (device buffers, or a call waiting for a cudaStream_t's event) runs the same
 * plan: only the memory ops, connectors and slot size change, handed over by the
 * communicator's device table (comm->dev->exec_begin, kernels/device_ops.h; cuda.c's).
 * This file never calls cuda/ by name.
 *
 * Must never: allocate or take a lock on the data path, wait without a bound (every
 * wait is cut into slices of at most 100 ms to look at abort, deadline and peer health),
 * or touch a user buffer outside the ranges the plan names.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "device_ops.h"
#include "mem_ops.h"
#include "reduce.h"

#define WAIT_SLICE_MS 100

typedef struct {
  struct coll_comm *comm;
  const coll_work *w;
  const coll_step *step;
  int step_index;
  size_t done_bytes, total_bytes;
  bool nt; /* non-temporal: final copies into user buffers bypass the cache (copy.c) */
  /* How bytes move (host: kernels/mem_host.c; device: what comm->dev's exec_begin hands
   * over, cuda.c's) and over which connectors (host: shm/tcp; device: cuda_ipc). */
  const coll_mem_ops *ops;
  coll_conn **conn_send, **conn_recv;
} wait_ctx;

/* A copy into the user's buffer: streaming stores for large host calls (copy.c). */
static coll_result put(const wait_ctx *x, void *dst, const void *src, size_t bytes) {
  if (x->nt && x->ops == &coll_mem_host) {
    coll_copy_nt(dst, src, bytes);
    return COLL_OK;
  }
  return x->ops->copy(x->comm, dst, src, bytes);
}

static coll_result waited_too_long(wait_ctx *x, int peer, const char *what) {
  struct coll_comm *c = x->comm;
  return coll_fail(c, COLL_ERR_TIMEOUT,
                   "rank %d timed out after %d ms waiting %s rank %d in step %d (%s, chunk %d)"
                   " of %s #%llu (count %zu, %s): %zu of %zu bytes of this step had moved",
                   c->rank, c->timeout_ms, what, peer, x->step_index, coll_step_name(x->step->kind),
                   x->step->chunk, coll_coll_name(x->w->coll), (unsigned long long)x->w->seq,
                   x->w->count, coll_dtype_name(x->w->dtype), x->done_bytes, x->total_bytes);
}

/* The rank whose failure alone would doom `w`: its peer for point-to-point work, -1
 * (any rank) for everything else. */
static int involved(const coll_work *w) {
  return w->coll == COLL_COLL_SEND || w->coll == COLL_COLL_RECV ? w->root : -1;
}

coll_result coll_exec_watch(struct coll_comm *comm, const coll_work *w) {
  if (!comm->hooks->attention(comm)) return COLL_OK;
  char what[64];
  snprintf(what, sizeof what, "%s #%llu", coll_coll_name(w->coll), (unsigned long long)w->seq);
  return comm->hooks->doomed(comm, w->seq, involved(w), what);
}

static coll_result check_abort(wait_ctx *x) {
  if (atomic_load_explicit(&x->comm->aborted, memory_order_relaxed))
    return coll_fail(x->comm, COLL_ERR_REMOTE, "rank %d: communicator aborted during %s #%llu",
                     x->comm->rank, coll_coll_name(x->w->coll), (unsigned long long)x->w->seq);
  return coll_exec_watch(x->comm, x->w);
}

/* A call failed while running here: sticky for this rank, and every peer hears of it
 * (watch.c) instead of waiting for this rank until its timeout. */
static void failed(struct coll_comm *comm, coll_result r) {
  if (r == COLL_OK) return;
  if (comm->sticky == COLL_OK) comm->sticky = r;
  comm->hooks->failed(comm);
}
void coll_exec_failed(struct coll_comm *comm, coll_result r) { failed(comm, r); }

/* Has this wait for a slot run past COLL_TIMEOUT_MS?  Asked after each wait slice that
 * came back empty-handed.  The clock starts there, not before the first slice: most
 * waits end inside the transport's spin, and a clock read costs 25 ns on our VM: at
 * two or three waits per call, 5 % of a 2-rank all-reduce of 4 KiB.  So a timeout fires
 * up to one slice (WAIT_SLICE_MS) late, never early. */
static bool too_long(wait_ctx *x, uint64_t *start) {
  uint64_t now = coll_now_ns();
  if (!*start) {
    *start = now;
    return false;
  }
  return x->comm->timeout_ms && now - *start > (uint64_t)x->comm->timeout_ms * 1000000u;
}

static coll_result get_send(wait_ctx *x, coll_conn *c, void **slot) {
  const coll_transport *t = c->t;
  if ((*slot = t->send_slot(c))) return COLL_OK;
  uint64_t start = 0;
  for (;;) {
    coll_result r = check_abort(x);
    if (r != COLL_OK) return r;
    if ((r = t->wait(&x->comm->view, c, WAIT_SLICE_MS)) != COLL_OK) return r;
    if ((*slot = t->send_slot(c))) return COLL_OK;
    if (too_long(x, &start)) return waited_too_long(x, c->peer, "for FIFO space from");
  }
}

static coll_result get_recv(wait_ctx *x, coll_conn *c, size_t want, const void **slot) {
  const coll_transport *t = c->t;
  uint32_t bytes = 0;
  *slot = t->recv_slot(c, &bytes);
  if (!*slot) {
    uint64_t start = 0;
    for (;;) {
      coll_result r = check_abort(x);
      if (r != COLL_OK) return r;
      if ((r = t->wait(&x->comm->view, c, WAIT_SLICE_MS)) != COLL_OK) return r;
      if ((*slot = t->recv_slot(c, &bytes))) break;
      if (too_long(x, &start)) return waited_too_long(x, c->peer, "for data from");
    }
  }
  if (bytes != want) {
    struct coll_comm *cm = x->comm;
    return coll_fail(cm, COLL_ERR_MISMATCH,
                     "rank %d received a %u-byte slice from rank %d in step %d (%s) of %s "
                     "#%llu (count %zu, %s) but expected %zu bytes: the ranks called "
                     "different collectives, counts or types",
                     cm->rank, bytes, c->peer, x->step_index, coll_step_name(x->step->kind),
                     coll_coll_name(x->w->coll), (unsigned long long)x->w->seq, x->w->count,
                     coll_dtype_name(x->w->dtype), want);
  }
  return COLL_OK;
}

/* Executes slice [off, off+n) (elements) of one step. */
static coll_result run_slice(wait_ctx *x, uint8_t *const bufs[2], size_t off, size_t n, size_t es) {
  struct coll_comm *comm = x->comm;
  const coll_step *s = x->step;
  const coll_work *w = x->w;
  size_t bytes = n * es;
  const uint8_t *src = bufs[s->src_buf] ? bufs[s->src_buf] + (s->src_off + off) * es : NULL;
  uint8_t *dst = bufs[s->dst_buf] ? bufs[s->dst_buf] + (s->dst_off + off) * es : NULL;
  coll_conn *in = s->peer_in >= 0 ? x->conn_recv[s->peer_in] : NULL;
  coll_conn *out = s->peer_out >= 0 ? x->conn_send[s->peer_out] : NULL;
  bool avg = s->final && w->op == COLL_AVG && comm->nranks > 1;
  const coll_mem_ops *m = x->ops;
  const void *p = NULL;
  void *q = NULL;
  coll_result r;
  /* Every op may fail (device ops return CUDA errors); `fence` makes the bytes final
   * before a slot is published to the peer or handed back to it. */
#define M(call)                            \
  do {                                     \
    if ((r = (call)) != COLL_OK) return r; \
  } while (0)

  switch (s->kind) {
  case COLL_STEP_COPY:
    if (src != dst) M(put(x, dst, src, bytes));
    return COLL_OK;
  case COLL_STEP_SEND:
    M(get_send(x, out, &q));
    M(m->copy(comm, q, src, bytes));
    M(m->fence(comm));
    out->t->send_post(out, (uint32_t)bytes);
    return COLL_OK;
  case COLL_STEP_RECV:
    M(get_recv(x, in, bytes, &p));
    M(put(x, dst, p, bytes));
    M(m->fence(comm));
    in->t->recv_release(in);
    return COLL_OK;
  case COLL_STEP_RECV_COPY_SEND:
    M(get_recv(x, in, bytes, &p));
    M(get_send(x, out, &q));
    M(m->copy(comm, q, p, bytes));
    M(m->fence(comm));
    out->t->send_post(out, (uint32_t)bytes);
    M(put(x, dst, p, bytes));
    M(m->fence(comm));
    in->t->recv_release(in);
    return COLL_OK;
  case COLL_STEP_RECV_REDUCE_SEND:
    M(get_recv(x, in, bytes, &p));
    M(get_send(x, out, &q));
    M(m->reduce(comm, q, p, src, n, w->dtype, w->op));
    M(m->fence(comm));
    out->t->send_post(out, (uint32_t)bytes);
    in->t->recv_release(in);
    return COLL_OK;
  case COLL_STEP_RECV_REDUCE_COPY:
    M(get_recv(x, in, bytes, &p));
    if (x->nt && m == &coll_mem_host && bytes <= comm->scratch_bytes) {
      /* Large call: reduce in cache, then stream out (no read-for-ownership of dst). */
      coll_kernel_reduce(comm->scratch, p, src, n, w->dtype, w->op);
      if (avg) coll_kernel_avg(comm->scratch, n, w->dtype, comm->nranks);
      coll_copy_nt(dst, comm->scratch, bytes);
    } else {
      M(m->reduce(comm, dst, p, src, n, w->dtype, w->op));
      if (avg) M(m->avg(comm, dst, n, w->dtype, comm->nranks));
      M(m->fence(comm));
    }
    in->t->recv_release(in);
    return COLL_OK;
  case COLL_STEP_RECV_REDUCE_COPY_SEND:
    M(get_recv(x, in, bytes, &p));
    M(get_send(x, out, &q));
    if (x->nt && m == &coll_mem_host && bytes <= comm->scratch_bytes) {
      /* Large call: reduce into a scratch slice that stays in cache, then stream it to
       * the user's buffer (written once, never read back: no read-for-ownership) and
       * copy it to the outgoing slot.  Reducing straight into the slot was slower: its
       * lines live in the peer's cache. */
      coll_kernel_reduce(comm->scratch, p, src, n, w->dtype, w->op);
      if (avg) coll_kernel_avg(comm->scratch, n, w->dtype, comm->nranks);
      memcpy(q, comm->scratch, bytes);
      coll_copy_nt(dst, comm->scratch, bytes);
    } else {
      M(m->reduce(comm, dst, p, src, n, w->dtype, w->op));
      if (avg) M(m->avg(comm, dst, n, w->dtype, comm->nranks));
      M(m->copy(comm, q, dst, bytes));
      M(m->fence(comm));
    }
    out->t->send_post(out, (uint32_t)bytes);
    in->t->recv_release(in);
    return COLL_OK;
  case COLL_STEP_RECV2_REDUCE_SEND: { /* a tree node's two children and its own data */
    coll_conn *in2 = x->conn_recv[s->peer_in2];
    const void *p2 = NULL;
    M(get_recv(x, in, bytes, &p));
    M(get_recv(x, in2, bytes, &p2));
    M(get_send(x, out, &q));
    M(m->reduce(comm, q, p, src, n, w->dtype, w->op));
    M(m->reduce(comm, q, q, p2, n, w->dtype, w->op));
    M(m->fence(comm));
    out->t->send_post(out, (uint32_t)bytes);
    in->t->recv_release(in);
    in2->t->recv_release(in2);
    return COLL_OK;
  }
  }
#undef M
  return coll_fail(comm, COLL_ERR_INTERNAL, "unknown step kind %d", (int)s->kind);
}

/* A step's peer p (-1: none) readied for slices of `bytes`: one load once it is. */
static inline coll_result use_peer(struct coll_comm *comm, int p, int dir, size_t bytes) {
  return p < 0 || coll_comm_peer_ready(comm, p, dir, bytes)
             ? COLL_OK
             : comm->hooks->use_peer(comm, p, dir, bytes);
}

/* One all-gather of `len` bytes per rank over the host path, as the library's own call
 * (no sequence number, no COLL_CHECK): handed to the device back end (comm->dev's
 * comm_lazy) for the device path's set-up. */
static coll_result exchange(struct coll_comm *comm, const void *mine, void *all, size_t len) {
  coll_work x = {.coll = COLL_COLL_ALL_GATHER,
                 .sendbuf = mine,
                 .recvbuf = all,
                 .count = len,
                 .dtype = COLL_UINT8,
                 .internal = true};
  coll_result r = coll_exec_run(comm, &x);
  if (r != COLL_OK)
    return coll_fail(comm, r,
                     "rank %d: setting up the device path: the exchange over the "
                     "host path failed: %s",
                     comm->rank, coll_comm_last_error(comm));
  return COLL_OK;
}

static void number(struct coll_comm *comm, coll_work *w);

/* The device data path's exchange for a queued call (device_path.c), run here by the
 * thread that holds the right to execute: it takes the call's own number, as the
 * caller's thread's exchange takes the number the call would have had (submit.c). */
static coll_result exchange_in_place(struct coll_comm *comm, coll_work *x, coll_work *call) {
  x->seq = call->seq;
  return coll_exec_run(comm, x);
}

/* Device buffers on a coll_stream_t (w->peer_queued): the device data path, as for a
 * blocking call, on the communicator's CUDA stream, from this thread.  Not served: the
 * host-driven path runs the call under the next number, as a caller's thread would
 * after its exchange. */
static coll_result device_queued(struct coll_comm *comm, coll_work *w, bool *served) {
  bool exchanged = false;
  coll_result r = coll_device_path(comm, coll_coll_name(w->coll), w, served, &exchanged,
                                   exchange_in_place);
  if (r == COLL_OK && !*served && exchanged) number(comm, w);
  return r;
}

coll_result coll_exec_run(struct coll_comm *comm, coll_work *w) {
  /* A user's call that ends before any row runs it (a failure already known, a peer
   * already dead) ran none: coll_comm_last_algo must not name the call before it. */
  if (!w->internal && !w->inner && !w->peer_exchange)
    atomic_store_explicit(&comm->last_algo, 0, memory_order_relaxed);
  if (atomic_load(&comm->aborted))
    return coll_fail(comm, COLL_ERR_REMOTE, "rank %d: communicator was aborted", comm->rank);
  if (comm->sticky != COLL_OK)
    return comm->sticky; /* the sentence of the first failure stays in errbuf */
  coll_result wr = coll_exec_watch(comm, w);
  if (wr != COLL_OK) return wr;
  if (w->peer_queued) {
    bool served = false;
    coll_result dr = device_queued(comm, w, &served);
    if (dr != COLL_OK || served) return dr;
  }
  /* COLL_CHECK, on the user's calls only */
  coll_result cr = comm->check && !w->internal && !w->peer_exchange ? coll_check_call(comm, w)
                                                                    : COLL_OK;
  if (cr != COLL_OK) return cr;
  /* The communicator's first call on device memory sets its device path up (comm->dev:
   * cuda.c); a device-path exchange (cuda/peer.c) is such a call. */
  if ((w->device || w->peer_exchange) &&
      (cr = comm->dev->comm_lazy(comm, w, coll_coll_name(w->coll), exchange)) != COLL_OK)
    return cr;

  size_t es = w->coll == COLL_COLL_BARRIER ? 1 : coll_elem_bytes(w->dtype);
  /* A group's point-to-point work (api/group.c) carries its plan: no algorithm.  Else
   * the tuner picks a row of the algorithm table (algo.h) and returns the row itself.  A
   * row with a run function runs the call itself; one that finds, with every other rank,
   * that it cannot (mapped: some buffer is not in a window) hands the call to the
   * tuner's next choice: the only time the tuner is asked twice, since only it knows
   * what comes after a declined row.  Rows with a plan fall through to the schedule
   * below, which gets the row (a.row): plan.c does not look it up again. */
  const coll_group_p2p *g = w->group;
  const coll_algo_entry *e = g ? NULL : coll_tune_row(comm, w, es, 0);
  uint32_t declined = 0; /* rows that found, on every rank, they cannot run this call */
  while (e && e->run) {
    bool ran = true;
    coll_result r = e->run(comm, w, &ran);
    if (ran || r != COLL_OK) {
      atomic_store_explicit(&comm->last_algo, (int)e->id + 1, memory_order_relaxed);
      return r;
    }
    declined |= 1u << e->id;
    e = coll_tune_row(comm, w, es, declined);
  }
  coll_algo algo = e ? e->id : COLL_ALGO_RING;
  atomic_store_explicit(&comm->last_algo, (int)algo + 1, memory_order_relaxed);
  uint8_t *bufs[2] = {(uint8_t *)(uintptr_t)w->sendbuf, (uint8_t *)w->recvbuf};
  coll_plan_args a = {.coll = w->coll,
                      .algo = algo,
                      .row = e,
                      .count = w->count,
                      .nranks = comm->nranks,
                      .rank = comm->rank,
                      .root = w->root,
                      .recv_count = w->recv_count,
                      .recv_peer = w->recv_peer,
                      .hosts = &comm->hosts,
                      .slice = comm->slot_bytes / es,
                      .sendcounts = w->sendcounts,
                      .sdispls = w->sdispls,
                      .recvcounts = w->recvcounts,
                      .rdispls = w->rdispls};
  switch (w->coll) {
  case COLL_COLL_ALL_REDUCE: a.in_place = w->sendbuf == w->recvbuf; break;
  case COLL_COLL_BROADCAST:
  case COLL_COLL_REDUCE: a.in_place = w->sendbuf == w->recvbuf; break;
  case COLL_COLL_REDUCE_SCATTER:
    a.in_place = bufs[0] && bufs[0] + (size_t)comm->rank * w->count * es == bufs[1];
    break;
  case COLL_COLL_ALL_GATHER:
    a.in_place = bufs[1] && bufs[1] + (size_t)comm->rank * w->count * es == bufs[0];
    break;
  case COLL_COLL_BARRIER:
    bufs[0] = bufs[1] = comm->barrier_buf;
    a.count = 1;
    a.in_place = 1;
    break;
  case COLL_COLL_ALL_TO_ALL: a.in_place = w->sendbuf == w->recvbuf; break;
  case COLL_COLL_GATHER: /* on the root: its block already in place */
    a.in_place = bufs[1] && bufs[1] + (size_t)w->root * w->count * es == bufs[0];
    break;
  case COLL_COLL_SCATTER:
    a.in_place = bufs[0] && bufs[0] + (size_t)w->root * w->count * es == bufs[1];
    break;
  default: break;
  }
  size_t nsteps = 0;
  uint64_t t_call = 0;
  const coll_step *steps = g ? g->steps : comm->steps;
  coll_result r = g ? COLL_OK : coll_plan_build(&a, comm->steps, &nsteps);
  if (g) nsteps = g->nsteps;
  if (r != COLL_OK)
    return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: no plan for %s #%llu", comm->rank,
                     coll_coll_name(w->coll), (unsigned long long)w->seq);

  COLL_TRACE(comm->rank, "%s #%llu count %zu %s: %zu steps", coll_coll_name(w->coll),
             (unsigned long long)w->seq, w->count, coll_dtype_name(w->dtype), nsteps);

  wait_ctx x = {.comm = comm,
                .w = w,
                .ops = &coll_mem_host,
                .conn_send = comm->conn_send,
                .conn_recv = comm->conn_recv};
  size_t slot_bytes = comm->slot_bytes;
  /* Device buffers or a cudaStream_t: the device back end (comm->dev, cuda.c) swaps in
   * its ops, connectors and slot.
   * (Never a group's point-to-point work: group.c refuses device memory there, and its
   * plan was cut by comm->slot_bytes.) */
  const coll_device_ops *dev = comm->dev;
  bool on_dev = w->device || w->cuda_event;
  if (on_dev &&
      (r = dev->exec_begin(comm, w, &x.ops, &x.conn_send, &x.conn_recv, &slot_bytes)) != COLL_OK)
    return dev->exec_end(comm, w, r);
  if (slot_bytes != comm->slot_bytes) { /* plans that cut by slice must cut like we do */
    a.slice = slot_bytes / es;
    if ((r = coll_plan_build(&a, comm->steps, &nsteps)) != COLL_OK)
      return dev->exec_end(comm, w,
                           coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: no plan for %s #%llu",
                                     comm->rank, coll_coll_name(w->coll),
                                     (unsigned long long)w->seq));
  }
  /* Each direction a plan uses is readied the first time (a lazy transport's peer is
   * connected, shm's FIFO pages are made resident), so a communicator holds the
   * connections and memory of the peers its algorithms use, not of all N-1. */
  for (size_t i = 0; !on_dev && i < nsteps; i++) {
    const coll_step *s = &steps[i];
    size_t b = (s->count < slot_bytes / es ? s->count : slot_bytes / es) * es; /* its slices */
    int in2 = s->kind == COLL_STEP_RECV2_REDUCE_SEND ? s->peer_in2 : -1;       /* else unused */
    if ((r = use_peer(comm, s->peer_in, COLL_USE_RECV, b)) != COLL_OK ||
        (r = use_peer(comm, s->peer_out, COLL_USE_SEND, b)) != COLL_OK ||
        (r = use_peer(comm, in2, COLL_USE_RECV, b)) != COLL_OK)
      return r;
  }
  size_t slice = slot_bytes / es, rounds = 0;
  for (size_t i = 0; i < nsteps; i++) {
    size_t k = (steps[i].count + slice - 1) / slice + steps[i].delay;
    if (k > rounds) rounds = k;
  }
  x.nt = !g && coll_copy_streams(w->coll, w->count, es, comm->nranks, a.in_place, comm->nt_bytes);
  /* Tracing: when each step's first slice starts and its last slice ends.  The trace
   * holds coll_plan_max_steps() steps per call: a larger group has only those traced. */
  uint64_t *t0 = NULL, *t1 = NULL;
  size_t traced = nsteps;
  if (coll_trace_on(comm)) {
    t0 = coll_trace_t0(comm);
    t1 = coll_trace_t1(comm);
    t_call = coll_now_ns();
    if (traced > coll_plan_max_steps(comm->nranks)) traced = coll_plan_max_steps(comm->nranks);
  }
  for (size_t j = 0; j < rounds; j++) {
    for (size_t i = 0; i < nsteps; i++) {
      const coll_step *s = &steps[i];
      if (j < s->delay) continue; /* slice k of a step runs in round k + delay */
      size_t off = (j - s->delay) * slice;
      if (off >= s->count) continue;
      size_t n = s->count - off < slice ? s->count - off : slice;
      x.step = s;
      x.step_index = (int)i;
      x.done_bytes = off * es;
      x.total_bytes = s->count * es;
      uint8_t *own[2]; /* a grouped operation's buffers */
      if (g) {
        own[0] = (uint8_t *)(uintptr_t)g->src[s->item];
        own[1] = (uint8_t *)g->dst[s->item];
      }
      if (t0 && off == 0 && i < traced) t0[i] = coll_now_ns();
      if ((r = run_slice(&x, g ? own : bufs, off, n, es)) != COLL_OK)
        return on_dev ? dev->exec_end(comm, w, r) : r;
      if (t1 && off + n == s->count && i < traced) t1[i] = coll_now_ns();
    }
  }
  if (x.nt) coll_copy_nt_fence(); /* non-temporal output before the completion */
  if (on_dev && (r = dev->exec_end(comm, w, COLL_OK)) != COLL_OK) return r;
  if (t0) coll_trace_record(comm, w, a.algo, steps, traced, es, t_call, coll_now_ns());
  return COLL_OK;
}

/* ---- the queue and the progress thread ----------------------------------------- */

static void finish(struct coll_comm *comm, coll_work *w, coll_result r, coll_work *waiter) {
  failed(comm, r);
  free(w->group); /* a group's point-to-point lists and plan (group.c) */
  w->group = NULL;
  free(w->v_copy); /* all_to_allv's arrays, copied at the enqueue (api.c) */
  w->v_copy = NULL;
  comm->dev->work_done(w); /* its cudaStream_t event, if any */
  if (w->stream) {
    const char *msg = r == COLL_OK ? "" : coll_comm_last_error(comm);
    coll_stream_complete(w->stream, r, msg, w->cuda_ticket);
  }
  if (waiter) {
    waiter->result = r;
    atomic_store(&waiter->done, 1);
  }
}

typedef struct {
  coll_work w;
  coll_work *waiter; /* the blocked caller's record, or NULL */
} queued;

static queued *qslot(struct coll_comm *comm, uint64_t i);

/* How often the progress thread yields, with the queue empty, before it sleeps.  A caller
 * enqueueing on a stream (coll-bench -z 0, a trainer posting its buckets) shares a core
 * with this thread when ranks are bound one to a core.  Asleep, the thread was woken by
 * the first post, took the core from the caller, ran that one call, found the queue
 * empty and slept again: a wake-up and two switches per call, 8-10 us at 16 KiB on two
 * ranks where the call takes 3.  Yielding instead hands the core to the caller, which
 * posts the rest without waking anybody.  64 yields are 20-40 us of a core nobody else
 * wanted (a yield returns at once when nothing else is runnable); none while another
 * process holds the core (coll_yield, backoff.c). */
enum { EXEC_IDLE_YIELDS = 64 };

/* Takes the right to execute (the one flag the progress thread, inline blocking calls
 * and the lock-free fast path all claim by compare-and-swap). */
static bool claim(struct coll_comm *comm) {
  bool idle = false;
  return atomic_compare_exchange_strong(&comm->running, &idle, true);
}

/* The call's sequence number, taken by whoever holds the execution right (`running`),
 * just before it runs: so numbers follow the order calls actually run on this rank,
 * whichever path (fast path, inline under the lock, progress thread) each took.  Taken
 * at submission instead, a fast-path call that claimed the executor and a queued call
 * that got its number under the lock could run in the opposite order to their numbers,
 * and COLL_CHECK reported a mismatch between ranks that ran the same calls.  Internal
 * work (split.c) takes none.  Only the holder of `running` writes the counter (its claim
 * and release order one holder after the next), so a load and a store do: no locked
 * read-modify-write on the path of every call.  Others only read it (api.c). */
static void number(struct coll_comm *comm, coll_work *w) {
  uint64_t s = atomic_load_explicit(&comm->next_seq, memory_order_relaxed);
  w->seq = s;
  if (!w->internal) atomic_store_explicit(&comm->next_seq, s + 1, memory_order_relaxed);
}

static void *progress_main(void *arg) {
  struct coll_comm *comm = arg;
  int idle_yields = EXEC_IDLE_YIELDS; /* asleep until the first work */
  pthread_mutex_lock(&comm->qmu);
  for (;;) {
    for (;;) {
      if (comm->qhead != comm->qtail) {
        if (claim(comm)) break;
      } else if (comm->shutdown && !atomic_load(&comm->running)) {
        goto out; /* shutdown with nothing left */
      } else if (idle_yields < EXEC_IDLE_YIELDS) {
        pthread_mutex_unlock(&comm->qmu);
        idle_yields = coll_yield(&comm->mates) ? idle_yields + 1
                                               : EXEC_IDLE_YIELDS; /* busy core: sleep */
        pthread_mutex_lock(&comm->qmu);
        continue;
      }
      pthread_cond_wait(&comm->qcv, &comm->qmu);
    }
    idle_yields = 0;
    queued item = *qslot(comm, comm->qhead);
    number(comm, &item.w);
    pthread_mutex_unlock(&comm->qmu);
    coll_result r = coll_exec_run(comm, &item.w);
    pthread_mutex_lock(&comm->qmu);
    comm->qhead++;
    finish(comm, &item.w, r, item.waiter); /* sticky is written by whoever runs */
    atomic_store(&comm->running, false);
    pthread_cond_broadcast(&comm->donecv);
  }
out:
  pthread_mutex_unlock(&comm->qmu);
  return NULL;
}

/* The queue stores `queued` records; comm->queue is sized for them via a cast-free
 * side array allocated at start. */
static queued *queue_mem(struct coll_comm *comm) { return (queued *)comm->queue_store; }
static queued *qslot(struct coll_comm *comm, uint64_t i) {
  return &queue_mem(comm)[i % COLL_QUEUE_SLOTS];
}

/* Handed to the rows that run themselves (internal.h, coll_exec_ops). */
static const coll_exec_ops exec_ops = {
    .bytes = coll_exec_bytes,
    .submit = coll_exec_submit,
    .watch = coll_exec_watch,
    .trace_on = coll_trace_on,
    .trace_t0 = coll_trace_t0,
    .trace_t1 = coll_trace_t1,
    .trace_record = coll_trace_record,
};

coll_result coll_exec_start(struct coll_comm *comm) {
  comm->exec_ops = &exec_ops;
  comm->queue_store = calloc(COLL_QUEUE_SLOTS, sizeof(queued));
  comm->steps = calloc(coll_plan_max_steps(comm->nranks), sizeof(coll_step));
  comm->barrier_buf = calloc(64, 1);
  /* One slice of scratch for large reductions (touched now: calloc of this size may
   * map fresh pages). */
  comm->scratch_bytes = comm->slot_bytes;
  comm->scratch = malloc(comm->scratch_bytes);
  if (comm->scratch) memset(comm->scratch, 0, comm->scratch_bytes);
  if (!comm->queue_store || !comm->steps || !comm->barrier_buf || !comm->scratch)
    return coll_fail(comm, COLL_ERR_SYSTEM, "out of memory creating the executor");
  coll_result tr = coll_trace_from_env(comm);
  if (tr != COLL_OK) return tr;
  int e = pthread_create(&comm->thread, NULL, progress_main, comm);
  if (e)
    return coll_fail(comm, COLL_ERR_SYSTEM, "rank %d: starting the progress thread failed: %s",
                     comm->rank, strerror(e));
  comm->thread_started = true;
  return COLL_OK;
}

/* Waits until the queue is empty and nothing runs, then stops the thread. */
void coll_exec_stop(struct coll_comm *comm) {
  if (comm->thread_started) {
    pthread_mutex_lock(&comm->qmu);
    comm->shutdown = true;
    pthread_cond_broadcast(&comm->qcv);
    pthread_mutex_unlock(&comm->qmu);
    pthread_join(comm->thread, NULL);
    comm->thread_started = false;
  }
  free(comm->queue_store);
  free(comm->steps);
  free(comm->barrier_buf);
  free(comm->scratch);
  comm->scratch = NULL;
  comm->queue_store = NULL;
  comm->steps = NULL;
  comm->barrier_buf = NULL;
}

void coll_exec_wake_all(struct coll_comm *comm) {
  pthread_mutex_lock(&comm->connmu);
  for (int p = 0; p < comm->nranks; p++) {
    if (comm->conn_send && comm->conn_send[p]) comm->conn_send[p]->t->wake(comm->conn_send[p]);
    if (comm->conn_recv && comm->conn_recv[p]) comm->conn_recv[p]->t->wake(comm->conn_recv[p]);
  }
  pthread_mutex_unlock(&comm->connmu);
  comm->dev->comm_wake(comm); /* cuda_ipc's connectors, the device data path's waits */
  pthread_mutex_lock(&comm->qmu);
  pthread_cond_broadcast(&comm->qcv);
  pthread_cond_broadcast(&comm->donecv);
  pthread_mutex_unlock(&comm->qmu);
}

/* Work the executor will never run (refused after an abort): what it owns is freed here,
 * as finish() would have, and its stream is not told of it (it was never enqueued). */
static coll_result refuse(struct coll_comm *comm, coll_work *w) {
  free(w->group);
  w->group = NULL;
  free(w->v_copy);
  w->v_copy = NULL;
  return coll_fail(comm, COLL_ERR_REMOTE, "rank %d: communicator was aborted: %s not run",
                   comm->rank, coll_coll_name(w->coll));
}

coll_result coll_exec_submit(struct coll_comm *comm, const coll_work *wk) {
  coll_work w = *wk;
  /* Nobody sees w yet: the queue's lock publishes it if it is queued. */
  atomic_store_explicit(&w.done, 0, memory_order_relaxed);
  /* Fast path: a blocking call that finds nothing queued and nobody executing runs
   * right here without touching the lock (two lock/unlock pairs were a fifth of an
   * 8-byte all-reduce).  The queue is checked again after the claim: work queued by
   * another thread in between goes first, through the slow path. */
  if (!w.stream && comm->qtail == comm->qhead && claim(comm)) {
    if (comm->qtail == comm->qhead) {
      number(comm, &w);
      coll_result r = coll_exec_run(comm, &w);
      failed(comm, r);
      atomic_store(&comm->running, false);
      /* Work queued meanwhile found `running` set and sleeps: wake the progress thread.
       * (Sequentially consistent atomics: either it sees running false, or we see its
       * tail.) */
      if (comm->qtail != comm->qhead) {
        pthread_mutex_lock(&comm->qmu);
        pthread_cond_broadcast(&comm->qcv);
        pthread_mutex_unlock(&comm->qmu);
      }
      return r;
    }
    atomic_store(&comm->running, false);
    pthread_mutex_lock(&comm->qmu);
    pthread_cond_broadcast(&comm->qcv);
    pthread_mutex_unlock(&comm->qmu);
  }
  pthread_mutex_lock(&comm->qmu);
  while (comm->qtail - comm->qhead >= COLL_QUEUE_SLOTS && !atomic_load(&comm->aborted))
    pthread_cond_wait(&comm->donecv, &comm->qmu);
  /* Aborted: nothing new goes in.  Enqueueing anyway (as this once did) could write past
   * a full queue over work not yet taken, whose waiter or stream then never heard back. */
  if (atomic_load(&comm->aborted)) {
    pthread_mutex_unlock(&comm->qmu);
    return refuse(comm, &w);
  }
  if (!w.stream && comm->qhead == comm->qtail && claim(comm)) {
    number(comm, &w);
    pthread_mutex_unlock(&comm->qmu);
    coll_result r = coll_exec_run(comm, &w);
    pthread_mutex_lock(&comm->qmu);
    failed(comm, r);
    atomic_store(&comm->running, false);
    if (comm->qhead != comm->qtail) pthread_cond_broadcast(&comm->qcv);
    pthread_mutex_unlock(&comm->qmu);
    return r;
  }
  queued *q = qslot(comm, comm->qtail);
  q->w = w;
  q->waiter = w.stream ? NULL : &w;
  comm->qtail++;
  if (w.stream) coll_stream_enqueued(w.stream);
  pthread_cond_broadcast(&comm->qcv);
  coll_result r = COLL_OK;
  if (!w.stream) {
    /* The progress thread finishes every queued work, aborted or not (each fails at
     * once then), so this wait ends. */
    while (!atomic_load(&w.done)) pthread_cond_wait(&comm->donecv, &comm->qmu);
    r = w.result;
  }
  pthread_mutex_unlock(&comm->qmu);
  return r;
}

coll_result coll_exec_bytes(struct coll_comm *comm, coll_coll_kind c, const void *sendbuf,
                            void *recvbuf, size_t bytes, coll_op op, int root) {
  coll_work w = {.coll = c,
                 .sendbuf = sendbuf,
                 .recvbuf = recvbuf,
                 .count = bytes,
                 .dtype = COLL_UINT8,
                 .op = op,
                 .root = root};
  return coll_exec_submit(comm, &w);
}
