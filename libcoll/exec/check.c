/* check.c — COLL_CHECK: catch ranks that called different collectives before any data
 * moves, instead of hanging or producing garbage.
 *
 * With the check on, every call first exchanges a 48-byte descriptor of itself
 * (collective, sequence number, count, dtype, op, root; peers and counts for
 * point-to-point) through the same connectors the data uses.  The schedule of that
 * exchange does not depend on what the rank called, so it completes whatever the
 * ranks disagree about:
 *   collectives   every rank posts its descriptor to every other rank, then receives
 *                 one from each rank in rank order, so every rank sees all N descriptors
 *                 and reports the same first disagreement between ranks r-1 and r.
 *                 (One hop of latency instead of the N-1 of a ring all-gather; N-1 slots
 *                 sent per rank, which is nothing next to any collective's own traffic.)
 *   send / recv / sendrecv
 *                 only the pair (or the two pairs of a sendrecv) exchange descriptors,
 *                 both ways, so both ends of a mismatched pair report it.
 *   a group's point-to-point work (group.c)
 *                 involves several peers: with each peer it names, the rank exchanges
 *                 one descriptor of its traffic with that peer alone (messages and bytes
 *                 each way; a group may mix dtypes, so bytes), and both ends compare.  A
 *                 plain send/recv/sendrecv on the other side is compared the same way,
 *                 so a group with one message each way per peer may meet plain calls;
 *                 a group with several messages to a peer must meet a group there (the
 *                 plain calls would exchange one descriptor each: reported as a
 *                 mismatch).  Dtypes are not compared across a group.
 *   all_to_allv   as collectives, but the descriptor sent to rank q carries what this
 *                 rank sends q and expects from q (count, recv_count), and q checks them
 *                 against its own recvcounts and sendcounts; the rest is compared as for
 *                 any collective.
 * Posting every send before the first receive cannot deadlock: a FIFO that is full holds
 * slices of the previous call, which the peer consumes without waiting for us (our part
 * of that call is complete).  Every wait is bounded exactly like the executor's.
 *
 * All ranks must run with the same COLL_CHECK setting: a descriptor where data was
 * expected (or the reverse) shows up as a slice of the wrong size or without the magic,
 * reported as COLL_ERR_MISMATCH with a sentence that says so.  A rank mixing a
 * collective with point-to-point calls of other ranks is caught by the ranks it
 * exchanges with; the others time out, as they would without the check.
 *
 * Must never: allocate, run any part of the call's own plan, or let a mismatch pass
 * silently; it never touches user buffers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_config.h"
#include "internal.h"

#ifndef COLL_CHECK_DEFAULT
#define COLL_CHECK_DEFAULT 0
#endif

#define CHECK_MAGIC 0x434b4453u /* "CKDS" */
#define WAIT_SLICE_MS 100

typedef struct {
  uint32_t magic;
  uint8_t coll, dtype, op, pad;
  int32_t root;      /* collectives: root; point-to-point: the peer sent to, or -1 */
  int32_t recv_peer; /* point-to-point: the peer received from, or -1 */
  uint64_t seq;
  uint64_t count;        /* point-to-point: elements sent (group: bytes) */
  uint64_t recv_count;   /* point-to-point: elements received (group: bytes) */
  uint32_t sends, recvs; /* group: messages to / from the one peer it describes */
} desc;
_Static_assert(sizeof(desc) == 48, "descriptor layout");

bool coll_check_from_env(void) {
  long v;
  coll_env_int("COLL_CHECK", COLL_CHECK_DEFAULT, &v);
  return v != 0;
}

static bool is_p2p(int coll) {
  return coll == COLL_COLL_SEND || coll == COLL_COLL_RECV || coll == COLL_COLL_SENDRECV ||
         coll == COLL_COLL_GROUP_P2P;
}
static bool reducing(int coll) {
  return coll == COLL_COLL_ALL_REDUCE || coll == COLL_COLL_REDUCE ||
         coll == COLL_COLL_REDUCE_SCATTER;
}
static bool rooted(int coll) {
  return coll == COLL_COLL_BROADCAST || coll == COLL_COLL_REDUCE || coll == COLL_COLL_GATHER ||
         coll == COLL_COLL_SCATTER;
}

static desc describe(const coll_work *w) {
  desc d = {.magic = CHECK_MAGIC,
            .coll = (uint8_t)w->coll,
            .dtype = (uint8_t)w->dtype,
            .op = (uint8_t)w->op,
            .root = -1,
            .recv_peer = -1,
            .seq = w->seq};
  switch (w->coll) {
  case COLL_COLL_SEND:
    d.root = w->root;
    d.count = w->count;
    break;
  case COLL_COLL_RECV:
    d.recv_peer = w->root;
    d.recv_count = w->count;
    break;
  case COLL_COLL_SENDRECV:
    d.root = w->root;
    d.count = w->count;
    d.recv_peer = w->recv_peer;
    d.recv_count = w->recv_count;
    break;
  case COLL_COLL_BARRIER:
    d.dtype = 0;
    d.op = 0;
    d.count = 0;
    break;
  case COLL_COLL_ALL_TO_ALLV:
    d.op = 0;
    d.count = 0;
    break; /* per peer: check_collective */
  default:
    d.count = w->count;
    if (!reducing(w->coll)) d.op = 0;
    if (rooted(w->coll)) d.root = w->root;
  }
  return d;
}

/* "all_reduce #7 (count 1000, float32, sum)" — what rank `r` called, as it said. */
static void say(char *out, size_t len, const desc *d) {
  const char *dt = coll_dtype_name((coll_dtype)d->dtype);
  const char *op = coll_op_name((coll_op)d->op);
  int n = snprintf(out, len, "%s #%llu", coll_coll_name((coll_coll_kind)d->coll),
                   (unsigned long long)d->seq);
  if (n < 0 || (size_t)n >= len) return;
  out += n;
  len -= (size_t)n;
  dt = dt ? dt : "?";
  op = op ? op : "?";
  switch (d->coll) {
  case COLL_COLL_BARRIER: break;
  case COLL_COLL_SEND:
    snprintf(out, len, " (count %llu, %s, to rank %d)", (unsigned long long)d->count, dt, d->root);
    break;
  case COLL_COLL_RECV:
    snprintf(out, len, " (count %llu, %s, from rank %d)", (unsigned long long)d->recv_count, dt,
             d->recv_peer);
    break;
  case COLL_COLL_SENDRECV:
    snprintf(out, len, " (send count %llu to rank %d, receive count %llu from rank %d, %s)",
             (unsigned long long)d->count, d->root, (unsigned long long)d->recv_count, d->recv_peer,
             dt);
    break;
  case COLL_COLL_GROUP_P2P:
    snprintf(out, len,
             " (with rank %d: %u sends of %llu bytes in all, %u receives of %llu "
             "bytes in all)",
             d->root, d->sends, (unsigned long long)d->count, d->recvs,
             (unsigned long long)d->recv_count);
    break;
  case COLL_COLL_REDUCE:
    snprintf(out, len, " (count %llu, %s, %s, root %d)", (unsigned long long)d->count, dt, op,
             d->root);
    break;
  case COLL_COLL_BROADCAST:
  case COLL_COLL_GATHER:
  case COLL_COLL_SCATTER:
    snprintf(out, len, " (count %llu, %s, root %d)", (unsigned long long)d->count, dt, d->root);
    break;
  case COLL_COLL_ALL_TO_ALLV: snprintf(out, len, " (%s)", dt); break;
  default:
    if (reducing(d->coll))
      snprintf(out, len, " (count %llu, %s, %s)", (unsigned long long)d->count, dt, op);
    else
      snprintf(out, len, " (count %llu, %s)", (unsigned long long)d->count, dt);
  }
}

/* Same collective call?  (describe() zeroes the fields a collective ignores.) */
static bool same(const desc *a, const desc *b) {
  return a->coll == b->coll && a->dtype == b->dtype && a->op == b->op && a->root == b->root &&
         a->count == b->count;
}

static coll_result mismatch(struct coll_comm *comm, int ra, const desc *a, int rb, const desc *b) {
  char sa[160], sb[160];
  say(sa, sizeof sa, a);
  say(sb, sizeof sb, b);
  return coll_fail(comm, COLL_ERR_MISMATCH,
                   "mismatched calls (COLL_CHECK, seen by rank %d): rank %d called %s but "
                   "rank %d called %s",
                   comm->rank, ra, sa, rb, sb);
}

/* ---- bounded waits, as in the executor ---------------------------------------------- */

static coll_result too_long(struct coll_comm *comm, const coll_work *w, int peer,
                            const char *what) {
  /* Shaped like the executor's timeout sentence, so readers (and tools) find the same
   * facts in the same places. */
  return coll_fail(comm, COLL_ERR_TIMEOUT,
                   "rank %d timed out after %d ms waiting %s rank %d in step 0 (COLL_CHECK "
                   "descriptor exchange) of %s #%llu (count %zu, %s): 0 of %zu bytes of this "
                   "step had moved",
                   comm->rank, comm->timeout_ms, what, peer, coll_coll_name(w->coll),
                   (unsigned long long)w->seq, w->count, coll_dtype_name(w->dtype), sizeof(desc));
}

static coll_result wait_once(struct coll_comm *comm, const coll_work *w, coll_conn *c,
                             uint64_t start, const char *what) {
  if (atomic_load_explicit(&comm->aborted, memory_order_relaxed))
    return coll_fail(comm, COLL_ERR_REMOTE, "rank %d: communicator aborted during %s #%llu",
                     comm->rank, coll_coll_name(w->coll), (unsigned long long)w->seq);
  coll_result wr = comm->exec_ops->watch(comm, w); /* a failure elsewhere dooms this call */
  if (wr != COLL_OK) return wr;
  coll_result r = c->t->wait(&comm->view, c, WAIT_SLICE_MS);
  if (r != COLL_OK) return r;
  if (comm->timeout_ms && coll_now_ns() - start > (uint64_t)comm->timeout_ms * 1000000u)
    return too_long(comm, w, c->peer, what);
  return COLL_OK;
}

static coll_result put(struct coll_comm *comm, const coll_work *w, int peer, const desc *d) {
  coll_result cr = comm->hooks->use_peer(comm, peer, COLL_USE_SEND, sizeof *d);
  if (cr != COLL_OK) return cr;
  coll_conn *c = comm->conn_send[peer];
  void *slot;
  uint64_t start = coll_now_ns();
  coll_result r;
  while (!(slot = c->t->send_slot(c)))
    if ((r = wait_once(comm, w, c, start, "for FIFO space from")) != COLL_OK) return r;
  memcpy(slot, d, sizeof *d);
  c->t->send_post(c, (uint32_t)sizeof *d);
  return COLL_OK;
}

static coll_result get(struct coll_comm *comm, const coll_work *w, int peer, desc *d) {
  coll_result cr = comm->hooks->use_peer(comm, peer, COLL_USE_RECV, sizeof *d);
  if (cr != COLL_OK) return cr;
  coll_conn *c = comm->conn_recv[peer];
  const void *slot;
  uint32_t bytes = 0;
  uint64_t start = coll_now_ns();
  coll_result r;
  while (!(slot = c->t->recv_slot(c, &bytes)))
    if ((r = wait_once(comm, w, c, start, "for the call descriptor of")) != COLL_OK) return r;
  bool ok = bytes == sizeof *d;
  if (ok) memcpy(d, slot, sizeof *d);
  c->t->recv_release(c);
  if (!ok || d->magic != CHECK_MAGIC)
    return coll_fail(comm, COLL_ERR_MISMATCH,
                     "rank %d received a %u-byte slice from rank %d where the COLL_CHECK "
                     "descriptor of %s #%llu was expected: every rank must run with the same "
                     "COLL_CHECK setting",
                     comm->rank, bytes, peer, coll_coll_name(w->coll), (unsigned long long)w->seq);
  return COLL_OK;
}

/* ---- the two schedules -------------------------------------------------------------- */

/* all_to_allv: rank q's descriptor for this rank says what q sends here (count) and
 * expects from here (recv_count); both must match this rank's own arrays. */
static coll_result v_pair(struct coll_comm *comm, const coll_work *w, int q, const desc *d) {
  if (d->coll != COLL_COLL_ALL_TO_ALLV) return COLL_OK; /* another call: reported below */
  int me = comm->rank;
  if (d->count == w->recvcounts[q] && d->recv_count == w->sendcounts[q]) return COLL_OK;
  bool sends = d->count != w->recvcounts[q];
  return coll_fail(comm, COLL_ERR_MISMATCH,
                   "mismatched calls (COLL_CHECK, seen by rank %d): in all_to_allv #%llu rank "
                   "%d %s %llu elements %s rank %d, but rank %d's %s[%d] is %zu",
                   me, (unsigned long long)w->seq, q, sends ? "sends" : "expects",
                   (unsigned long long)(sends ? d->count : d->recv_count), sends ? "to" : "from",
                   me, me, sends ? "recvcounts" : "sendcounts", q,
                   sends ? w->recvcounts[q] : w->sendcounts[q]);
}

static coll_result check_collective(struct coll_comm *comm, const coll_work *w) {
  desc me = describe(w), prev = {0}, cur;
  int n = comm->nranks;
  bool v = w->coll == COLL_COLL_ALL_TO_ALLV;
  coll_result r, first = COLL_OK;
  for (int p = 0; p < n; p++) {
    if (p == comm->rank) continue;
    desc to = me;
    if (v) to.count = w->sendcounts[p], to.recv_count = w->recvcounts[p];
    if ((r = put(comm, w, p, &to)) != COLL_OK) return r;
  }
  /* Receive everything even after a disagreement, so every rank reports the same first
   * one (between the lowest pair of neighbouring ranks that differ). */
  for (int p = 0; p < n; p++) {
    if (p == comm->rank)
      cur = me;
    else if ((r = get(comm, w, p, &cur)) != COLL_OK)
      return r;
    if (v && p != comm->rank && first == COLL_OK) first = v_pair(comm, w, p, &cur);
    if (cur.coll == COLL_COLL_ALL_TO_ALLV) cur.count = cur.recv_count = 0; /* compared above */
    if (p > 0 && first == COLL_OK && (is_p2p(cur.coll) || !same(&prev, &cur)))
      first = mismatch(comm, p - 1, &prev, p, &cur);
    prev = cur;
  }
  return first;
}

/* A point-to-point descriptor's traffic with rank q: messages and bytes to and from q. */
typedef struct {
  uint64_t sends, sent, recvs, received;
} traffic;
static traffic with(const desc *d, int q) {
  traffic t = {0, 0, 0, 0};
  if (d->coll == COLL_COLL_GROUP_P2P) /* it describes its traffic with q alone */
    return (traffic){d->sends, d->count, d->recvs, d->recv_count};
  uint64_t es = coll_elem_bytes((coll_dtype)d->dtype);
  if (d->root == q) t.sends = 1, t.sent = d->count * es;
  if (d->recv_peer == q) t.recvs = 1, t.received = d->recv_count * es;
  return t;
}

/* Does peer q's call `d` match my call `me` on the directions we share? */
static bool pair_ok(int me_rank, const desc *me, int q, const desc *d) {
  if (!is_p2p(d->coll)) return false;
  if (me->coll == COLL_COLL_GROUP_P2P || d->coll == COLL_COLL_GROUP_P2P) {
    traffic a = with(me, q), b = with(d, me_rank);
    return a.sends == b.recvs && a.sent == b.received && a.recvs == b.sends && a.received == b.sent;
  }
  if (d->dtype != me->dtype) return false;
  if (me->root == q && !(d->recv_peer == me_rank && d->recv_count == me->count)) return false;
  if (me->recv_peer == q && !(d->root == me_rank && d->count == me->recv_count)) return false;
  return true;
}

static coll_result check_p2p(struct coll_comm *comm, const coll_work *w) {
  desc me = describe(w), d;
  int peers[2], np = 0;
  if (me.root >= 0) peers[np++] = me.root;
  if (me.recv_peer >= 0 && me.recv_peer != me.root) peers[np++] = me.recv_peer;
  if (np == 2 && peers[1] < peers[0]) {
    int t = peers[0];
    peers[0] = peers[1];
    peers[1] = t;
  }
  coll_result r, first = COLL_OK;
  for (int i = 0; i < np; i++)
    if ((r = put(comm, w, peers[i], &me)) != COLL_OK) return r;
  for (int i = 0; i < np; i++) {
    if ((r = get(comm, w, peers[i], &d)) != COLL_OK) return r;
    if (first == COLL_OK && !pair_ok(comm->rank, &me, peers[i], &d))
      first = comm->rank < peers[i] ? mismatch(comm, comm->rank, &me, peers[i], &d)
                                    : mismatch(comm, peers[i], &d, comm->rank, &me);
  }
  return first;
}

/* My group's descriptor for peer q: my traffic with q alone (bytes; copies excluded). */
static desc describe_group(const coll_work *w, int q, bool *involved) {
  desc d = {.magic = CHECK_MAGIC,
            .coll = COLL_COLL_GROUP_P2P,
            .dtype = COLL_UINT8,
            .root = q,
            .recv_peer = q,
            .seq = w->seq};
  const coll_group_p2p *g = w->group;
  *involved = false;
  for (size_t i = 0; i < g->n; i++) {
    if (g->ops[i].peer != q || g->ops[i].kind == COLL_STEP_COPY) continue;
    *involved = true;
    if (g->ops[i].kind == COLL_STEP_SEND)
      d.sends++, d.count += g->ops[i].count;
    else
      d.recvs++, d.recv_count += g->ops[i].count;
  }
  return d;
}

static coll_result check_group(struct coll_comm *comm, const coll_work *w) {
  coll_result r, first = COLL_OK;
  bool involved;
  desc me, d;
  for (int q = 0; q < comm->nranks; q++) {
    me = describe_group(w, q, &involved);
    if (involved && (r = put(comm, w, q, &me)) != COLL_OK) return r;
  }
  for (int q = 0; q < comm->nranks; q++) {
    me = describe_group(w, q, &involved);
    if (!involved) continue;
    if ((r = get(comm, w, q, &d)) != COLL_OK) return r;
    if (first == COLL_OK && !pair_ok(comm->rank, &me, q, &d))
      first = comm->rank < q ? mismatch(comm, comm->rank, &me, q, &d)
                             : mismatch(comm, q, &d, comm->rank, &me);
  }
  return first;
}

coll_result coll_check_call(struct coll_comm *comm, const coll_work *w) {
  if (comm->nranks == 1) return COLL_OK;
  if (w->coll == COLL_COLL_GROUP_P2P) return check_group(comm, w);
  if (is_p2p(w->coll)) {
    if (w->coll == COLL_COLL_SENDRECV && w->root == comm->rank) return COLL_OK; /* a copy */
    return check_p2p(comm, w);
  }
  return check_collective(comm, w);
}
