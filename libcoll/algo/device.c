/* device.c — the device data path's two schedules: one-shot and two-shot, every rank's
 * buffers read directly by GPU kernels (cuda/peer.c maps them and gives the primitives).
 *
 * One-shot (dev_oneshot), each collective one kernel between two barriers (B):
 *   all-reduce      B; recv_i = send_0 OP ... OP send_(N-1)                    ; B
 *   reduce          B; on the root: recv = send_0 OP ... OP send_(N-1)         ; B
 *   reduce-scatter  B; recv_i = chunk i of send_0 OP ... OP chunk i of send_(N-1); B
 *   all-gather      B; chunk j of recv_i = send_j, for every j                  ; B
 *   broadcast       B; recv_i = send_root                                       ; B
 * The first barrier says every input is ready on its rank's stream, the last that nobody
 * reads a buffer any more.  An in-place all-reduce would overwrite its input while peers
 * still read it: it reduces into the communicator's scratch, and copies out after the
 * last barrier (larger ones take the two-shot).  The other four never write what a peer
 * reads (reduce-scatter in place writes only its own chunk, which only it reads).
 *
 * Two-shot (dev_twoshot), all-reduce as reduce-scatter then all-gather, in place or not:
 *   B; chunk i of recv_i = chunk i of send_0 OP ... OP send_(N-1); B;
 *      chunk j of recv_i = chunk j of recv_j, for every j != i; B
 *
 * Cost (per rank, S bytes, N ranks, α a barrier, β a byte through device memory, read
 * or written — on one GPU shared by N ranks every rank's bytes go through the same memory,
 * so the call takes about N times this; on N GPUs the peers' reads cross the links):
 *   one-shot all-reduce:  2α + (N + 1)·S·β           (N inputs read, one output written)
 *   two-shot all-reduce:  3α + (3 − 1/N)·S·β         (S read + S/N written; (N−1)/N·S
 *                                                     read and written again)
 *   reduce-scatter:       2α + (1 + 1/N)·S·β;  all-gather, broadcast: 2α + 2·S·β (S the
 *                          whole vector, nccl-tests' size); reduce: 2α + (N + 1)·S·β/N
 *                          on average over the ranks.
 * α and β are defaults until a GPU run measures them (docs/perf.md has that run).  The
 * two-shot wins from 2α/(N − 2 + 1/N)/β: at N = 2 about 2α/(0.5β), at N = 8 much sooner.
 *
 * Must never: run for host buffers (the rows are device_only), or write a buffer a peer
 * may still read before the barrier after its last reader.
 */
#include <stdio.h>

#include "algo.h"
#include "peer.h"

/* Defaults: a barrier of stream memory operations, and a byte of device memory traffic
 * (an H100's copy moves about 3 TB/s counting bytes read and written). */
#define DEV_ALPHA 10e-6
#define DEV_BETA (1.0 / 3.0e12)

static coll_result price(coll_coll_kind c, double n, const coll_cost_model *m, bool two,
                         double *seconds, char *f, size_t flen) {
  double p = m->p, bytes, barriers = two ? 3 : 2;
  switch (c) {
  case COLL_COLL_ALL_REDUCE: bytes = two ? (3 - 1 / p) * n : (p + 1) * n; break;
  case COLL_COLL_REDUCE:
    if (two) return COLL_ERR_INVALID_ARG;
    bytes = (p + 1) * n / p;
    break;
  case COLL_COLL_REDUCE_SCATTER:
    if (two) return COLL_ERR_INVALID_ARG;
    bytes = (1 + 1 / p) * n;
    break;
  case COLL_COLL_ALL_GATHER:
  case COLL_COLL_BROADCAST:
    if (two) return COLL_ERR_INVALID_ARG;
    bytes = 2 * n;
    break;
  default: return COLL_ERR_INVALID_ARG;
  }
  *seconds = barriers * DEV_ALPHA + bytes * DEV_BETA;
  if (f && flen)
    snprintf(f, flen, "%.0f*%.3gus (barriers) + %.4g bytes*%.3gns (device memory)", barriers,
             DEV_ALPHA * 1e6, bytes, DEV_BETA * 1e9);
  return COLL_OK;
}

coll_result coll_dev_oneshot_cost(coll_coll_kind c, double n, const coll_cost_model *m,
                                  double *seconds, char *formula, size_t formula_len) {
  return price(c, n, m, false, seconds, formula, formula_len);
}
coll_result coll_dev_twoshot_cost(coll_coll_kind c, double n, const coll_cost_model *m,
                                  double *seconds, char *formula, size_t formula_len) {
  return price(c, n, m, true, seconds, formula, formula_len);
}

bool coll_dev_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es) {
  (void)c, (void)count, (void)es;
  return comm->peer && comm->peer->ok && comm->nranks <= COLL_PEER_MAX;
}

/* chunk k of a buffer of N chunks of `count` elements */
static const void *cchunk(const void *b, int k, size_t count, size_t es) {
  return (const uint8_t *)b + (size_t)k * count * es;
}
static void *chunk(void *b, int k, size_t count, size_t es) {
  return (uint8_t *)b + (size_t)k * count * es;
}

static coll_result all_reduce_twoshot(struct coll_comm *comm, const coll_work *w) {
  const coll_dev_call *d = w->dev;
  int n = comm->nranks, me = comm->rank;
  size_t es = coll_elem_bytes(w->dtype);
  /* chunk k: elements [k*q + min(k, rem), ...), the first `rem` chunks one longer */
  size_t q = w->count / (size_t)n, rem = w->count % (size_t)n;
  size_t off[COLL_PEER_MAX + 1];
  for (int k = 0; k <= n; k++) off[k] = (size_t)k * q + ((size_t)k < rem ? (size_t)k : rem);
  const void *src[COLL_PEER_MAX];
  for (int k = 0; k < n; k++) src[k] = (const uint8_t *)d->send[k] + off[me] * es;
  coll_result r = coll_dev_barrier(comm, d);
  if (r == COLL_OK)
    r = coll_dev_reduce(comm, d, (uint8_t *)d->recv[me] + off[me] * es, src, n,
                        off[me + 1] - off[me], w->dtype, w->op);
  if (r == COLL_OK) r = coll_dev_barrier(comm, d);
  void *dst[COLL_PEER_MAX];
  const void *from[COLL_PEER_MAX];
  size_t bytes[COLL_PEER_MAX];
  int k = 0;
  for (int j = 0; j < n; j++) {
    if (j == me) continue;
    dst[k] = (uint8_t *)d->recv[me] + off[j] * es;
    from[k] = (const uint8_t *)d->recv[j] + off[j] * es;
    bytes[k++] = (off[j + 1] - off[j]) * es;
  }
  if (r == COLL_OK) r = coll_dev_copy(comm, d, dst, from, bytes, k);
  if (r == COLL_OK) r = coll_dev_barrier(comm, d);
  return r;
}

static coll_result oneshot(struct coll_comm *comm, const coll_work *w) {
  const coll_dev_call *d = w->dev;
  int n = comm->nranks, me = comm->rank;
  size_t es = coll_elem_bytes(w->dtype), bytes = w->count * es;
  const void *src[COLL_PEER_MAX];
  void *dst[COLL_PEER_MAX];
  size_t len[COLL_PEER_MAX];
  coll_result r = coll_dev_barrier(comm, d);
  if (r != COLL_OK) return r;
  switch (w->coll) {
  case COLL_COLL_ALL_REDUCE: {
    bool in_place = w->sendbuf == w->recvbuf;
    void *out = in_place ? coll_dev_scratch(comm) : w->recvbuf;
    for (int k = 0; k < n; k++) src[k] = d->send[k];
    r = coll_dev_reduce(comm, d, out, src, n, w->count, w->dtype, w->op);
    if (r == COLL_OK) r = coll_dev_barrier(comm, d);
    if (r == COLL_OK && in_place) {
      dst[0] = w->recvbuf;
      src[0] = out;
      len[0] = bytes;
      r = coll_dev_copy(comm, d, dst, src, len, 1);
    }
    return r;
  }
  case COLL_COLL_REDUCE:
    for (int k = 0; k < n; k++) src[k] = d->send[k];
    if (me == w->root) r = coll_dev_reduce(comm, d, w->recvbuf, src, n, w->count, w->dtype, w->op);
    break;
  case COLL_COLL_REDUCE_SCATTER:
    for (int k = 0; k < n; k++) src[k] = cchunk(d->send[k], me, w->count, es);
    r = coll_dev_reduce(comm, d, w->recvbuf, src, n, w->count, w->dtype, w->op);
    break;
  case COLL_COLL_ALL_GATHER:
    for (int j = 0; j < n; j++) {
      dst[j] = chunk(w->recvbuf, j, w->count, es);
      src[j] = d->send[j];
      len[j] = bytes;
    }
    r = coll_dev_copy(comm, d, dst, src, len, n);
    break;
  case COLL_COLL_BROADCAST:
    dst[0] = w->recvbuf;
    src[0] = d->send[w->root];
    len[0] = bytes;
    r = coll_dev_copy(comm, d, dst, src, len, 1);
    break;
  default:
    return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: dev_oneshot was handed %s", me,
                     coll_coll_name(w->coll));
  }
  if (r == COLL_OK) r = coll_dev_barrier(comm, d);
  return r;
}

coll_result coll_dev_oneshot_run(struct coll_comm *comm, const coll_work *w, bool *ran) {
  *ran = true;
  if (!w->dev)
    return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: dev_oneshot without mapped buffers",
                     comm->rank);
  /* In place, past the scratch: the two-shot, which never overwrites what a peer reads.
   * Whether a call is in place may differ between ranks, and every rank must take the
   * same schedule (its barriers count the same epochs): any rank in place decides. */
  if (w->coll == COLL_COLL_ALL_REDUCE && w->dev->any_in_place &&
      w->count * coll_elem_bytes(w->dtype) > COLL_DEV_SCRATCH)
    return all_reduce_twoshot(comm, w);
  return oneshot(comm, w);
}

coll_result coll_dev_twoshot_run(struct coll_comm *comm, const coll_work *w, bool *ran) {
  *ran = true;
  if (!w->dev || w->coll != COLL_COLL_ALL_REDUCE)
    return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: dev_twoshot was handed %s%s", comm->rank,
                     coll_coll_name(w->coll), w->dev ? "" : " without mapped buffers");
  return all_reduce_twoshot(comm, w);
}
