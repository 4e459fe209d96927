/* oneshot.c — small collectives in one shot, through shared-memory mailboxes.
 *
 * A ring moves a small message through 2(p-1) FIFO handshakes; for 8 bytes that is all
 * latency.  Here every rank instead writes its whole contribution once into its own
 * mailbox (a flag word and the data: up to 56 bytes in the flag's cache line, longer
 * data from the next line on, see shm.h) and every rank that needs it reads it straight
 * from there:
 *
 *   call k:  rank r   writes data_r into mailbox[r][k % 2], then seq = k (release)
 *            reader   waits for seq >= k (acquire) in each mailbox it needs, reads
 *
 *   all-reduce      everyone writes, everyone reads all, reduces in rank order
 *   reduce          everyone writes, the root reads all
 *   broadcast       the root writes, everyone reads it
 *   all-gather      everyone writes, everyone reads all
 *   reduce-scatter  everyone writes its whole input, rank r reads block r of each
 *   barrier         everyone writes nothing, everyone waits for all
 *   all-to-all      everyone writes its whole send buffer, rank r reads block r of each
 *   gather          everyone but the root writes its block, the root reads all
 *   scatter         the root writes its whole send buffer, rank r reads block r of it
 *
 * Reuse without a handshake: a rank writes mailbox[k % 2] again at call k+2 only once
 * every peer has arrived at call k+1 (its seq in mailbox[(k+1) % 2] is >= k+1; ranks
 * that write nothing still post seq to say they arrived).  A rank arrives at k+1 only
 * after it finished call k, so nobody still reads the old data.  In an all-reduce every
 * rank has already seen that while reading call k+1, so the check costs nothing.
 *
 * Results are the same bits on every rank: every rank combines the contributions in
 * rank order, ((c0 op c1) op c2) ..., from the same bytes.
 *
 * Cost (p ranks, n bytes, α_mb one cache-line hand-over between cores, β_mem per byte
 * copied or read from another core's cache, γ per byte reduced):
 *   all-reduce       α_mb + n·β_mem + (p-1)·n·(β_mem + γ)
 *   all-gather       α_mb + n·β_mem + (p-1)·n·β_mem
 *   broadcast        α_mb + 2·n·β_mem
 *   all-to-all       α_mb + n·β_mem + n·β_mem      (n = one rank's whole send buffer)
 *   gather           α_mb + n/p·β_mem + (p-1)/p·n·β_mem    (n = the root's buffer)
 *   scatter          α_mb + n·β_mem + n/p·β_mem
 * one hand-over instead of 2(p-1), but (p-1)·n bytes read per rank instead of
 * 2(p-1)/p·n: it wins below a crossover the tuner computes (tune.c).  All-to-allv is not
 * served: whether it fits a mailbox depends on counts the other ranks do not know.
 *
 * Waiting (shm_wait.c, shared with the fan-out ring): spin (cores to spare), then yield
 * (coll_yield: not while something outside the job holds the core, backoff.c), then sleep
 * on a futex on the flag word after announcing it in the owner's waiter count, which
 * the owner reads after every call (one load of a line nobody else writes while busy).
 *
 * Must never: write a mailbox before every peer has arrived at the previous call,
 * allocate, or wait without checking abort, peer health and the deadline.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "shm_wait.h"
#include "reduce.h"


bool coll_oneshot_fits(struct coll_comm *comm, coll_coll_kind coll, size_t count, size_t es) {
  if (!comm->mailboxes || comm->nranks < 2) return false;
  size_t bytes = count * es, max = COLL_MAILBOX_BYTES;
  switch (coll) {
  case COLL_COLL_ALL_REDUCE:
  case COLL_COLL_REDUCE:
  case COLL_COLL_BROADCAST:
  case COLL_COLL_ALL_GATHER: return bytes <= max;
  case COLL_COLL_REDUCE_SCATTER: return bytes <= max / (size_t)comm->nranks;
  case COLL_COLL_GATHER: return bytes <= max;
  case COLL_COLL_ALL_TO_ALL:
  case COLL_COLL_SCATTER: return bytes <= max / (size_t)comm->nranks;
  case COLL_COLL_BARRIER: return true;
  default: return false;
  }
}

/* Waits until `peer`'s mailbox `mb` says seq >= want. */
static coll_result wait_seq(struct coll_comm *comm, const coll_work *w, int peer, coll_mailbox *mb,
                            uint32_t want) {
  return coll_shm_wait(comm, w, peer, &mb->seq, want, comm->mb_waiters[peer], "one-shot call");
}

/* Publishes call k in my mailbox (after the data, if any, was written).  No fence here:
 * the store needs the line back from every reader (they hold it shared), and a fence
 * would stall until that round trip ends.  Instead the store drains while we wait for
 * the peers' data, and wake_sleepers() fences once the call is done. */
static void post(coll_mailbox *mine, uint32_t k) {
  atomic_store_explicit(&mine->seq, k, memory_order_release);
}

static void wake_sleepers(struct coll_comm *comm, coll_mailbox *mine) {
  coll_shm_wake(&mine->seq, comm->mb_waiters[comm->rank]);
}

/* Before writing mailbox[k % 2]: every peer has arrived at call k-1. */
static coll_result may_write(struct coll_comm *comm, const coll_work *w, uint32_t k) {
  for (int p = 0; p < comm->nranks; p++) {
    if (p == comm->rank || coll_shm_reached(comm->mb_seen[p], k - 1)) continue;
    coll_result r = wait_seq(comm, w, p, comm->mb[2 * p + ((k - 1) & 1)], k - 1);
    if (r != COLL_OK) return r;
    comm->mb_seen[p] = k - 1;
  }
  return COLL_OK;
}

/* Does a rank write its whole input of nranks blocks (count elements each)?  And the
 * bytes a writer puts in its mailbox in this call: that whole input for reduce-scatter,
 * all-to-all and scatter, else its one buffer. */
static bool whole_input(coll_coll_kind c) {
  return c == COLL_COLL_REDUCE_SCATTER || c == COLL_COLL_ALL_TO_ALL || c == COLL_COLL_SCATTER;
}
static size_t written_bytes(const struct coll_comm *comm, const coll_work *w) {
  size_t es = w->coll == COLL_COLL_BARRIER ? 1 : coll_elem_bytes(w->dtype);
  size_t bytes = w->count * es;
  return whole_input(w->coll) ? bytes * (size_t)comm->nranks : bytes;
}

/* Where the data of a mailbox starts.  Up to 56 bytes ride in the flag's cache line, so a
 * reader that sees `seq` change has them already.  Longer data starts on the next line:
 * 8 bytes past a line, every 64-byte load of the reduction spans two lines (2 ranks,
 * 1 KiB all-reduce: 0.76 us against Intel MPI's 0.70).  Every rank computes the same
 * offset from the call (the segment leaves a page of room behind each mailbox). */
static uint8_t *data_of(coll_mailbox *mb, size_t wbytes) {
  return wbytes <= COLL_MAILBOX_INLINE ? mb->data : (uint8_t *)mb + 64;
}

/* Mailbox of `p` for call k, once it holds call k's data. */
static coll_result fetch(struct coll_comm *comm, const coll_work *w, int p, uint32_t k,
                         const uint8_t **data) {
  coll_mailbox *mb = comm->mb[2 * p + (k & 1)];
  if (p != comm->rank) {
    coll_result r = wait_seq(comm, w, p, mb, k);
    if (r != COLL_OK) return r;
    comm->mb_seen[p] = k;
  }
  *data = data_of(mb, written_bytes(comm, w));
  return COLL_OK;
}

/* dst = c_0 op c_1 op ... op c_{p-1} (rank order), each c_p at byte offset `off` of p's
 * mailbox; AVG divides once at the end. */
static coll_result reduce_all(struct coll_comm *comm, const coll_work *w, uint32_t k, size_t off,
                              size_t count, uint8_t *dst) {
  int n = comm->nranks;
  const uint8_t *a, *b;
  coll_result r;
  if ((r = fetch(comm, w, 0, k, &a)) != COLL_OK) return r;
  if ((r = fetch(comm, w, 1, k, &b)) != COLL_OK) return r;
  coll_kernel_reduce(dst, a + off, b + off, count, w->dtype, w->op);
  for (int p = 2; p < n; p++) {
    if ((r = fetch(comm, w, p, k, &b)) != COLL_OK) return r;
    coll_kernel_reduce(dst, dst, b + off, count, w->dtype, w->op);
  }
  if (w->op == COLL_AVG) coll_kernel_avg(dst, count, w->dtype, n);
  return COLL_OK;
}

/* Does rank `me` write its mailbox in this call?  (Ranks that do not still post seq.) */
static bool writes_mailbox(const coll_work *w, int me) {
  switch (w->coll) {
  case COLL_COLL_BARRIER: return false;
  case COLL_COLL_BROADCAST:
  case COLL_COLL_SCATTER: return me == w->root;
  case COLL_COLL_GATHER: return me != w->root; /* the root copies its own block directly */
  default: return true;
  }
}

/* Does rank `me` read rank p's mailbox in this call? */
static bool reads_mailbox_of(const coll_work *w, int me, int p) {
  if (p == me) return false;
  switch (w->coll) {
  case COLL_COLL_BROADCAST:
  case COLL_COLL_SCATTER: return p == w->root;
  case COLL_COLL_REDUCE:
  case COLL_COLL_GATHER: return me == w->root;
  default: return true;
  }
}

static coll_result run_call(struct coll_comm *comm, const coll_work *w, coll_mailbox *mine,
                            uint32_t k) {
  int n = comm->nranks, me = comm->rank;
  size_t es = w->coll == COLL_COLL_BARRIER ? 1 : coll_elem_bytes(w->dtype);
  const uint8_t *src = w->sendbuf;
  uint8_t *dst = w->recvbuf;
  size_t bytes = w->count * es;
  coll_result r;
  bool writes = writes_mailbox(w, me);
  size_t wbytes = written_bytes(comm, w);
  if (writes) {
    if ((r = may_write(comm, w, k)) != COLL_OK) return r;
    memcpy(data_of(mine, wbytes), src, wbytes);
  }
  post(mine, k);

  const uint8_t *d;
  switch (w->coll) {
  case COLL_COLL_ALL_REDUCE: return reduce_all(comm, w, k, 0, w->count, dst);
  case COLL_COLL_REDUCE: return me == w->root ? reduce_all(comm, w, k, 0, w->count, dst) : COLL_OK;
  case COLL_COLL_REDUCE_SCATTER: return reduce_all(comm, w, k, (size_t)me * bytes, w->count, dst);
  case COLL_COLL_BROADCAST:
    if (me == w->root) {
      if (dst != src) memcpy(dst, src, bytes);
      return COLL_OK;
    }
    if ((r = fetch(comm, w, w->root, k, &d)) != COLL_OK) return r;
    memcpy(dst, d, bytes);
    return COLL_OK;
  case COLL_COLL_GATHER:
    if (me != w->root) return COLL_OK; /* written: the root reads it from the mailbox */
    /* the root gathers as every rank of an all-gather does */
    __attribute__((fallthrough));
  case COLL_COLL_ALL_GATHER:
    for (int i = 1; i <= n; i++) {
      int p = (me + i) % n; /* own block last: in place it is already there */
      uint8_t *out = dst + (size_t)p * bytes;
      if (p == me) {
        if (out != src) memcpy(out, src, bytes);
        continue;
      }
      if ((r = fetch(comm, w, p, k, &d)) != COLL_OK) return r;
      memcpy(out, d, bytes);
    }
    return COLL_OK;
  case COLL_COLL_BARRIER:
    for (int p = 0; p < n; p++)
      if (p != me && (r = fetch(comm, w, p, k, &d)) != COLL_OK) return r;
    return COLL_OK;
  case COLL_COLL_ALL_TO_ALL:
    /* Each peer's block `me` into place; the own block last (in place it is there). */
    for (int i = 1; i <= n; i++) {
      int p = (me + i) % n;
      uint8_t *out = dst + (size_t)p * bytes;
      if (p == me) {
        if (out != src + (size_t)me * bytes) memcpy(out, src + (size_t)me * bytes, bytes);
        continue;
      }
      if ((r = fetch(comm, w, p, k, &d)) != COLL_OK) return r;
      memcpy(out, d + (size_t)me * bytes, bytes);
    }
    return COLL_OK;
  case COLL_COLL_SCATTER:
    if (me == w->root) {
      if (dst != src + (size_t)me * bytes) memcpy(dst, src + (size_t)me * bytes, bytes);
      return COLL_OK;
    }
    if ((r = fetch(comm, w, w->root, k, &d)) != COLL_OK) return r;
    memcpy(dst, d + (size_t)me * bytes, bytes);
    return COLL_OK;
  default:
    return coll_fail(comm, COLL_ERR_INTERNAL, "one-shot path asked to run %s",
                     coll_coll_name(w->coll));
  }
}

/* For the trace: what a one-shot call moved, as steps (a write of the own mailbox, then
 * one read per peer mailbox it needed), all timed as the whole call. */
static void record(struct coll_comm *comm, const coll_work *w, size_t es, uint64_t t_start,
                   uint64_t t_end) {
  int n = comm->nranks, me = comm->rank;
  size_t cnt = w->count, ns = 0;
  coll_step *st = comm->steps;
  if (writes_mailbox(w, me))
    st[ns++] = (coll_step){.kind = COLL_STEP_COPY,
                           .peer_in = -1,
                           .peer_out = -1,
                           .count = whole_input(w->coll) ? cnt * (size_t)n : cnt,
                           .chunk = me};
  for (int p = 0; p < n; p++) {
    if (!reads_mailbox_of(w, me, p)) continue;
    st[ns++] = (coll_step){.kind = COLL_STEP_RECV,
                           .peer_in = p,
                           .peer_out = -1,
                           .count = w->coll == COLL_COLL_BARRIER ? 0 : cnt,
                           .chunk = p};
  }
  uint64_t *t0 = comm->exec_ops->trace_t0(comm), *t1 = comm->exec_ops->trace_t1(comm);
  for (size_t i = 0; i < ns; i++) t0[i] = t_start, t1[i] = t_end;
  comm->exec_ops->trace_record(comm, w, COLL_ALGO_ONESHOT, st, ns, es, t_start, t_end);
}

coll_result coll_oneshot_run(struct coll_comm *comm, const coll_work *w) {
  uint32_t k = ++comm->mb_seq;
  coll_mailbox *mine = comm->mb[2 * comm->rank + (k & 1)];
  uint64_t t_start = comm->exec_ops->trace_on(comm) ? coll_now_ns() : 0;
  coll_result r = run_call(comm, w, mine, k);
  wake_sleepers(comm, mine);
  if (t_start && r == COLL_OK && !w->inner)
    record(comm, w, w->coll == COLL_COLL_BARRIER ? 1 : coll_elem_bytes(w->dtype), t_start,
           coll_now_ns());
  return r;
}

coll_result coll_oneshot_setup(struct coll_comm *comm) {
  int n = comm->nranks;
  if (!comm->mailboxes) return COLL_OK;
  comm->mb = calloc(2 * (size_t)n, sizeof *comm->mb);
  comm->mb_waiters = calloc((size_t)n, sizeof *comm->mb_waiters);
  if (!comm->mb || !comm->mb_waiters)
    return coll_fail(comm, COLL_ERR_SYSTEM, "out of memory setting up one-shot mailboxes");
  void *shm = coll_shm_ctx(comm);
  for (int p = 0; p < n; p++) {
    comm->mb[2 * p] = coll_shm_mailbox(&comm->view, shm, p, 0);
    comm->mb[2 * p + 1] = coll_shm_mailbox(&comm->view, shm, p, 1);
    comm->mb_waiters[p] = coll_shm_mailbox_waiters(&comm->view, shm, p);
    if (!comm->mb[2 * p] || !comm->mb[2 * p + 1] || !comm->mb_waiters[p])
      return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: rank %d's mailboxes are not mapped",
                       comm->rank, p);
  }
  return COLL_OK;
}

/* ---- the row in the algorithm table (algo.h) ----------------------------------------- */

bool coll_oneshot_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es) {
  return coll_oneshot_fits(comm, c, count, es);
}

coll_result coll_oneshot_run_row(struct coll_comm *comm, const coll_work *w, bool *ran) {
  *ran = true;
  return coll_oneshot_run(comm, w);
}

/* The formulas at the top of this file, n = nccl-tests' size. */
coll_result coll_oneshot_cost(coll_coll_kind c, double n, const coll_cost_model *m, double *seconds,
                              char *formula, size_t flen) {
  double a = m->alpha_mb, b = m->beta, g = m->gamma, s;
  int p = m->p;
  switch (c) {
  case COLL_COLL_ALL_REDUCE:
  case COLL_COLL_REDUCE:
    s = a + n * b + (p - 1) * n * (b + g);
    snprintf(formula, flen, "a_mb + n*b + (p-1)*n*(b+g) = %.3g us", s * 1e6);
    break;
  case COLL_COLL_REDUCE_SCATTER:
    s = a + n * b + (p - 1) * (n / p) * (b + g);
    snprintf(formula, flen, "a_mb + n*b + (p-1)*(n/p)*(b+g) = %.3g us", s * 1e6);
    break;
  case COLL_COLL_ALL_GATHER:
    s = a + (n / p) * b + (p - 1) * (n / p) * b;
    snprintf(formula, flen, "a_mb + n*b = %.3g us", s * 1e6);
    break;
  case COLL_COLL_BROADCAST:
    s = a + 2 * n * b;
    snprintf(formula, flen, "a_mb + 2*n*b = %.3g us", s * 1e6);
    break;
  case COLL_COLL_BARRIER:
    s = a;
    snprintf(formula, flen, "a_mb = %.3g us", s * 1e6);
    break;
  case COLL_COLL_ALL_TO_ALL:
    s = a + 2 * n * b;
    snprintf(formula, flen, "a_mb + n*b + n*b = %.3g us", s * 1e6);
    break;
  case COLL_COLL_GATHER:
    s = a + (n / p) * b + (p - 1) * (n / p) * b;
    snprintf(formula, flen, "a_mb + n/p*b + (p-1)/p*n*b = %.3g us", s * 1e6);
    break;
  case COLL_COLL_SCATTER:
    s = a + n * b + (n / p) * b;
    snprintf(formula, flen, "a_mb + n*b + n/p*b = %.3g us", s * 1e6);
    break;
  default: return COLL_ERR_INVALID_ARG;
  }
  *seconds = s;
  return COLL_OK;
}
