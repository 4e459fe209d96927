/* device.c — the device data path's schedules: one-shot, two-shot and one-GPU, every
 * rank's buffers read directly by GPU kernels (cuda/peer.c maps them and gives the
 * primitives).
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
 * One-GPU (dev_onegpu), where every rank's buffers are on the same GPU: one rank (the
 * leader, rank 0) launches the whole collective as one kernel; the others launch none.
 *   every rank but the leader:  arrive (flag to the leader), wait for the leader's flag
 *   the leader:                 wait for every arrival; the kernel; a flag to everyone
 * An arrival says the rank's inputs are ready and its outputs free (both are stream
 * order on its own stream), the leader's flag that every output is written and no input
 * is read any more.  The kernel reads each input once and writes every output:
 *   all-reduce      out_r = in_0 OP ... OP in_(N-1), for every r, from one read
 *   reduce-scatter  out_r = chunk r of in_0 OP ... OP chunk r of in_(N-1)
 *   all-gather      chunk j of out_r = in_j, for every r, from one read of in_j
 *   broadcast       out_r = in_root;  reduce: out_root = in_0 OP ... OP in_(N-1)
 * Why: ranks that share a GPU time-slice it, one context at a time.  When every rank
 * launches kernels between barriers, each barrier waits for the GPU to switch contexts:
 * on one H200 (2026-11-30) the 8-byte all-reduce took 168 us (p50) at 2 ranks and ~600
 * at 4 on the one- and two-shot rows, but an in-place broadcast, where one rank alone
 * launches a kernel, 24 us.  It also moves less: N inputs and N outputs, 2N·S bytes for
 * an all-reduce, against N·(3 − 1/N)·S for N two-shots.  On several GPUs it would put
 * all the work on one of them: it serves one GPU only (usable).
 *
 * Cost (S bytes, nccl-tests' size; N ranks; α a barrier; β a byte through device memory,
 * read or written; on one GPU shared by N ranks, a barrier of the per-rank rows costs
 * α_s·(N − 1) — the context switches — and their bytes add up on the one memory, N
 * times a rank's):
 *   per rank          one-shot all-reduce:  2α + (N + 1)·S·β   (N inputs read, one written)
 *                     two-shot all-reduce:  3α + (3 − 1/N)·S·β (S read + S/N written;
 *                                           (N−1)/N·S read and written again)
 *                     reduce-scatter:       2α + (1 + 1/N)·S·β;  all-gather, broadcast:
 *                                           2α + 2·S·β;  reduce: 2α + (N + 1)·S·β/N (the
 *                                           ranks' average)
 *   one GPU, per call one-GPU all-reduce:   2α + 2N·S·β;  the other four: 2α + (N + 1)·S·β
 * Measured on one H200 (2026-11-30, docs/perf.md): β = 1/(4.2 TB/s) (a 1 GiB copy moved
 * 2.08 TB/s, each byte read and written); α_s = 100 us (above).  α on separate GPUs is
 * still a default (10 us; not measured: no machine with several GPUs has run this).
 * The two-shot wins from 2α/(N − 2 + 1/N)/β: at N = 2 about 2α/(0.5β), at N = 8 much
 * sooner.
 *
 * Must never: run for host buffers (the rows are device_only), or write a buffer a peer
 * may still read before the barrier after its last reader.
 */
#include <stdio.h>

#include "algo.h"
#include "peer.h"

/* A barrier of stream memory operations (default), a barrier's context switches per
 * extra rank on one shared GPU, and a byte of device memory traffic (both measured). */
#define DEV_ALPHA 10e-6
#define DEV_ALPHA_SLICED 100e-6
#define DEV_BETA (1.0 / 4.2e12)

static coll_result price(coll_coll_kind c, double n, const coll_cost_model *m, bool two,
                         double *seconds, char *f, size_t flen) {
  double p = m->p, bytes, barriers = two ? 3 : 2;
  bool shared = m->gpus == 1 && p > 1; /* every rank's kernels on one GPU */
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
  double alpha = shared ? DEV_ALPHA_SLICED * (p - 1) : DEV_ALPHA;
  if (shared) bytes *= p;
  *seconds = barriers * alpha + bytes * DEV_BETA;
  if (f && flen)
    snprintf(f, flen, "%.0f*%.3gus (barriers%s) + %.4g bytes*%.3gns (device memory)", barriers,
             alpha * 1e6, shared ? ", one GPU time-sliced" : "", bytes, DEV_BETA * 1e9);
  return COLL_OK;
}

coll_result coll_dev_onegpu_cost(coll_coll_kind c, double n, const coll_cost_model *m,
                                 double *seconds, char *f, size_t flen) {
  double p = m->p, bytes;
  switch (c) {
  case COLL_COLL_ALL_REDUCE: bytes = 2 * p * n; break;
  case COLL_COLL_REDUCE:
  case COLL_COLL_REDUCE_SCATTER:
  case COLL_COLL_ALL_GATHER:
  case COLL_COLL_BROADCAST: bytes = (p + 1) * n; break;
  default: return COLL_ERR_INVALID_ARG;
  }
  *seconds = 2 * DEV_ALPHA + bytes * DEV_BETA;
  if (f && flen)
    snprintf(f, flen, "2*%.3gus (arrivals, release) + %.4g bytes*%.3gns (one kernel)",
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

bool coll_dev_onegpu_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es) {
  /* dev_gpus counts distinct GPUs once the device path is up (peer.c): one GPU, two or
   * more ranks on it. */
  return coll_dev_usable(comm, c, count, es) && comm->dev_gpus == 1 && comm->nranks > 1;
}

/* The leader's kernel for the call (the table at the top). */
static coll_result onegpu_kernel(struct coll_comm *comm, const coll_work *w) {
  const coll_dev_call *d = w->dev;
  int n = comm->nranks;
  size_t es = coll_elem_bytes(w->dtype), bytes = w->count * es;
  const void *src[COLL_PEER_MAX];
  void *dst[COLL_PEER_MAX * COLL_PEER_MAX];
  size_t len[COLL_PEER_MAX];
  for (int k = 0; k < n; k++) src[k] = d->send[k];
  switch (w->coll) {
  case COLL_COLL_ALL_REDUCE:
  case COLL_COLL_REDUCE_SCATTER:
    for (int r = 0; r < n; r++) dst[r] = d->recv[r];
    return coll_dev_reduce_fan(comm, d, dst, n, w->coll == COLL_COLL_REDUCE_SCATTER ? w->count : 0,
                               src, n, w->count, w->dtype, w->op);
  case COLL_COLL_REDUCE:
    dst[0] = d->recv[w->root];
    return coll_dev_reduce_fan(comm, d, dst, 1, 0, src, n, w->count, w->dtype, w->op);
  case COLL_COLL_ALL_GATHER:
    for (int j = 0; j < n; j++) { /* segment j: rank j's input to block j of every output */
      len[j] = bytes;
      for (int r = 0; r < n; r++) dst[j * n + r] = chunk(d->recv[r], j, w->count, es);
    }
    return coll_dev_copy_fan(comm, d, dst, n, src, len, n);
  case COLL_COLL_BROADCAST:
    for (int r = 0; r < n; r++) dst[r] = d->recv[r];
    src[0] = d->send[w->root];
    len[0] = bytes;
    return coll_dev_copy_fan(comm, d, dst, n, src, len, 1);
  default:
    return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: dev_onegpu was handed %s", comm->rank,
                     coll_coll_name(w->coll));
  }
}

coll_result coll_dev_onegpu_run(struct coll_comm *comm, const coll_work *w, bool *ran) {
  *ran = true;
  if (!w->dev)
    return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: dev_onegpu without mapped buffers",
                     comm->rank);
  const int leader = 0;
  int n = comm->nranks, k = 0, others[COLL_PEER_MAX];
  uint32_t epoch = coll_dev_epoch(comm);
  if (comm->rank != leader) /* arrive, then wait for the leader's release */
    return coll_dev_signal(comm, w->dev, epoch, &leader, 1, &leader, 1);
  for (int p = 0; p < n; p++)
    if (p != leader) others[k++] = p;
  coll_result r = coll_dev_signal(comm, w->dev, epoch, NULL, 0, others, k);
  if (r == COLL_OK) r = onegpu_kernel(comm, w);
  if (r == COLL_OK) r = coll_dev_signal(comm, w->dev, epoch, others, k, NULL, 0);
  return r;
}

coll_result coll_dev_twoshot_run(struct coll_comm *comm, const coll_work *w, bool *ran) {
  *ran = true;
  if (!w->dev || w->coll != COLL_COLL_ALL_REDUCE)
    return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: dev_twoshot was handed %s%s", comm->rank,
                     coll_coll_name(w->coll), w->dev ? "" : " without mapped buffers");
  return all_reduce_twoshot(comm, w);
}
