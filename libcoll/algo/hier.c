/* hier.c — the host-aware all-reduce (reduce-scatter inside each host, all-reduce across
 * hosts, all-gather inside) and all-gather (across hosts, then inside).
 *
 * N ranks on H hosts with n ranks each (N = H·n), S bytes.  Ranks of a host talk over
 * shared memory; ranks of different hosts over the network (tcp or ib), whose links are
 * slower.  Local index i of host h is the i-th rank of that host in rank order
 * (coll_hosts, built at communicator creation); ranks need not be contiguous per host.
 *
 *   phase 1  inside each host, a ring reduce-scatter of the whole vector over its n ranks:
 *            local rank i ends with shard i (coll_ring_chunk(count, n, i)) reduced over
 *            its host.
 *   phase 2  across hosts, a ring all-reduce of shard i among the H ranks with local
 *            index i (one per host, ring in host order): shard i is then reduced over
 *            all N ranks (COLL_AVG divides here, once, by N).
 *   phase 3  inside each host, a ring all-gather of the n shards.
 *
 *   2 hosts x 2 ranks (A0 A1 on host A, B0 B1 on host B), shards s0 s1:
 *
 *     phase 1 (shm)      A0 <-> A1 : A0 holds s0 of A, A1 holds s1 of A   (B likewise)
 *     phase 2 (net)      A0 <-> B0 : s0 of A+B     A1 <-> B1 : s1 of A+B
 *     phase 3 (shm)      A0 <-> A1 : both hold s0 s1                        (B likewise)
 *
 * Bytes each rank sends (the ring's chunking; exact when n divides the count and H the
 * shard):
 *   inside a host    2(n-1)/n · S          (phases 1 and 3)
 *   across hosts     2(H-1)/H · S/n        (phase 2)
 * against the flat ring's 2(N-1)/N · S per rank, of which — ranks ordered by host — the
 * H ranks at host boundaries send all across: H · 2(N-1)/N · S cross hosts in all, where
 * the hierarchy sends N · 2(H-1)/H · S/n = 2(H-1) · S.  (2 x 2: 3S across against 2S; per
 * rank at most 1.5S across against 0.5S.)  docs/bandwidth-math.md, section 6e.
 *
 * Cost (α_in, β_in inside a host, α_x, β_x across, γ per byte reduced; the phases follow
 * each other, see "delays" below):
 *   2(n-1)·α_in + 2(n-1)/n·S·β_in  +  2(H-1)·α_x + 2(H-1)/H·S/n·β_x  +  (N-1)/N·S·γ
 * The flat ring, whose every step waits for its slowest link, costs
 *   2(N-1)·α_x + 2(N-1)/N·S·β_x + (N-1)/N·S·γ        (exec/tune.c prices it so),
 * so the hierarchy pays wherever hosts hold several ranks and the network is the slower
 * link: fewer latency terms (2(n-1) + 2(H-1) < 2(N-1)), and of the same 2(N-1)/N·S bytes
 * most go over shared memory.  Not applicable (the cost says so) with one host, one rank
 * per host, or hosts holding different numbers of ranks: the shards of local index i would
 * have no partner on a host with fewer ranks.  There the plan is the flat ring's.
 *
 * All-gather (count per rank, S = N·count the whole output) the same way round, with
 * nothing to reduce and no scratch: across hosts first, a ring all-gather of the H blocks
 * of local index i, each straight into its place; then inside each host H ring all-gathers,
 * one per host's blocks, one after the other.  Per rank:
 *   across hosts  (H-1)·count = (H-1)/N·S        inside  (n-1)·H·count = (n-1)/n·S
 * against the flat ring's (N-1)/N·S, all of it across for the H ranks at host boundaries;
 *   cost  (H-1)·α_x + (H-1)/N·S·β_x + (n-1)·H·α_in + (n-1)/n·S·β_in
 * (every block of a set its own message inside).  Reduce-scatter is not served: the
 * shards a rank collects for the others of its local index would need scratch space.
 *
 * Delays: every phase starts when the one before has finished on this rank: phase 2's
 * steps wait D1 rounds (the most slices any phase-1 step has, on any rank: its first
 * chunk's), phase 3's D1 + D2.  Every rank computes the same D1 and D2, so both ends of
 * every connection meet its messages in the same rounds, and the intra-host connections
 * carry all of phase 1 before any of phase 3.
 *
 * Pure: builds steps from (count, the host layout, rank); no I/O.  Must never read a
 * layout that does not fit (coll_hier_fits): it plans the ring there instead.
 */
#include <stdio.h>
#include <string.h>

#include "algo.h"
#include "ring.h"

static int mod(int a, int n) { return ((a % n) + n) % n; }

bool coll_hier_fits(const coll_hosts *hs, int nranks) {
  return hs && hs->host && hs->local && hs->by_host && hs->nhosts >= 2 && hs->per_host >= 2 &&
         hs->nhosts * hs->per_host == nranks;
}

int coll_hosts_build(const uint64_t *ids, int nranks, int *host, int *local, int *by_host,
                     coll_hosts *out) {
  int nh = 0;
  for (int r = 0; r < nranks; r++) {
    int h = -1;
    /* the first rank with this id names the host: O(N²) comparisons, once per
     * communicator (milliseconds at N = 4096) */
    for (int q = 0; q < r && h < 0; q++)
      if (ids[q] == ids[r]) h = host[q];
    if (h < 0) h = nh++;
    host[r] = h;
    local[r] = 0;
    for (int q = 0; q < r; q++) local[r] += host[q] == h;
  }
  int per = -1;
  for (int h = 0; h < nh && per != 0; h++) {
    int k = 0;
    for (int r = 0; r < nranks; r++) k += host[r] == h;
    per = per < 0 || per == k ? k : 0;
  }
  if (per < 0) per = 0;
  if (per > 0)
    for (int r = 0; r < nranks; r++) by_host[host[r] * per + local[r]] = r;
  *out = (coll_hosts){
      .nhosts = nh, .per_host = per, .host = host, .local = local, .by_host = per ? by_host : NULL};
  return nh;
}

static void add(coll_step *steps, size_t *n, coll_step_kind kind, int in, int out, coll_buf sb,
                size_t off, coll_buf db, size_t count, int chunk, int final, uint32_t delay) {
  if (count == 0) return;
  steps[(*n)++] = (coll_step){.kind = kind,
                              .peer_in = in,
                              .peer_out = out,
                              .peer_in2 = -1,
                              .src_buf = sb,
                              .dst_buf = db,
                              .src_off = off,
                              .dst_off = off,
                              .count = count,
                              .chunk = chunk,
                              .final = final,
                              .delay = delay};
}

/* Rounds a step of `len` elements takes (slice 0: a step is never cut). */
static uint32_t rounds(size_t len, size_t slice) {
  if (len == 0) return 0;
  return slice ? (uint32_t)((len + slice - 1) / slice) : 1;
}

/* Piece p of shard i (slen elements from soff) cut by the ring over H hosts: its range in
 * the receive buffer, and its chunk number for the trace (after the n shards). */
static int piece(size_t slen, size_t soff, int n, int H, int i, int p, size_t *off, size_t *len) {
  coll_ring_chunk(slen, H, p, off, len);
  *off += soff;
  return n + i * H + p;
}

/* All-gather, count elements per rank, block b of the receive buffer rank b's:
 *   phase 1  across hosts, a ring all-gather of the H blocks of local index i (one rank
 *            per host, host order), each block straight into its place;
 *   phase 2  inside each host, H ring all-gathers one after the other: ring g passes
 *            round the n blocks of host g's ranks (each rank got host g's block of its
 *            local index in phase 1).
 * Phase 2 waits for phase 1 (D1 rounds: every phase-1 step moves one block). */
static void all_gather(const coll_plan_args *a, coll_step *st, size_t *ns) {
  const coll_hosts *hs = a->hosts;
  int n = hs->per_host, H = hs->nhosts, h = hs->host[a->rank], i = hs->local[a->rank];
  const int *at = hs->by_host;
  int in_prev = at[h * n + mod(i - 1, n)], in_next = at[h * n + mod(i + 1, n)];
  int x_prev = at[mod(h - 1, H) * n + i], x_next = at[mod(h + 1, H) * n + i];
  size_t cnt = a->count;
  uint32_t d1 = rounds(cnt, a->slice);
  int b = a->rank;
  if (!a->in_place && cnt) /* own block into its place (add() gives src and dst one offset) */
    st[(*ns)++] = (coll_step){.kind = COLL_STEP_COPY,
                              .peer_in = -1,
                              .peer_out = -1,
                              .peer_in2 = -1,
                              .src_buf = COLL_BUF_SEND,
                              .dst_buf = COLL_BUF_RECV,
                              .dst_off = (size_t)b * cnt,
                              .count = cnt,
                              .chunk = b};
  add(st, ns, COLL_STEP_SEND, -1, x_next, COLL_BUF_SEND, 0, COLL_BUF_RECV, cnt, b, 0, 0);
  for (int k = 1; k <= H - 2; k++) {
    b = at[mod(h - k, H) * n + i];
    add(st, ns, COLL_STEP_RECV_COPY_SEND, x_prev, x_next, COLL_BUF_RECV, (size_t)b * cnt,
        COLL_BUF_RECV, cnt, b, 0, 0);
  }
  b = at[mod(h + 1, H) * n + i];
  add(st, ns, COLL_STEP_RECV, x_prev, -1, COLL_BUF_RECV, (size_t)b * cnt, COLL_BUF_RECV, cnt, b, 0,
      0);
  /* Phase 2: H ring all-gathers inside the host, one after the other in step order: ring g
   * passes round the blocks of host g's ranks.  (Each ring step sending its H blocks
   * before receiving any needed FIFOs deeper than H: it deadlocked with 2 slots.) */
  for (int g = 0; g < H; g++) {
    b = at[g * n + i];
    add(st, ns, COLL_STEP_SEND, -1, in_next, COLL_BUF_RECV, (size_t)b * cnt, COLL_BUF_RECV, cnt, b,
        0, d1);
    for (int k = 1; k <= n - 2; k++) {
      b = at[g * n + mod(i - k, n)];
      add(st, ns, COLL_STEP_RECV_COPY_SEND, in_prev, in_next, COLL_BUF_RECV, (size_t)b * cnt,
          COLL_BUF_RECV, cnt, b, 0, d1);
    }
    b = at[g * n + mod(i + 1, n)];
    add(st, ns, COLL_STEP_RECV, in_prev, -1, COLL_BUF_RECV, (size_t)b * cnt, COLL_BUF_RECV, cnt, b,
        0, d1);
  }
}

coll_result coll_hier_plan(const coll_plan_args *a, coll_step *st, size_t *ns) {
  const coll_hosts *hs = a->hosts;
  *ns = 0;
  bool ag = a->coll == COLL_COLL_ALL_GATHER;
  if ((a->coll != COLL_COLL_ALL_REDUCE && !ag) || !coll_hier_fits(hs, a->nranks))
    return coll_ring_plan(a, st, ns); /* the table's promise: ring where it cannot serve */
  if (ag) {
    all_gather(a, st, ns);
    return COLL_OK;
  }
  int n = hs->per_host, H = hs->nhosts, h = hs->host[a->rank], i = hs->local[a->rank];
  const int *at = hs->by_host; /* at[h·n + i]: the rank with local index i on host h */
  int in_prev = at[h * n + mod(i - 1, n)], in_next = at[h * n + mod(i + 1, n)];
  int x_prev = at[mod(h - 1, H) * n + i], x_next = at[mod(h + 1, H) * n + i];
  size_t count = a->count, off, len, soff, slen, coff, clen;
  /* D1: phase 1's longest step, chunk 0; D2: phase 2's, piece 0 of shard 0. */
  coll_ring_chunk(count, n, 0, &off, &len);
  uint32_t d1 = rounds(len, a->slice);
  coll_ring_chunk(len, H, 0, &coff, &clen);
  uint32_t d2 = d1 + rounds(clen, a->slice);

  /* Phase 1: ring reduce-scatter inside the host; local rank i ends with shard i. */
  int c = mod(i - 1, n);
  coll_ring_chunk(count, n, c, &off, &len);
  add(st, ns, COLL_STEP_SEND, -1, in_next, COLL_BUF_SEND, off, COLL_BUF_RECV, len, c, 0, 0);
  for (int s = 1; s <= n - 2; s++) {
    c = mod(i - 1 - s, n);
    coll_ring_chunk(count, n, c, &off, &len);
    add(st, ns, COLL_STEP_RECV_REDUCE_SEND, in_prev, in_next, COLL_BUF_SEND, off, COLL_BUF_RECV,
        len, c, 0, 0);
  }
  coll_ring_chunk(count, n, i, &soff, &slen);
  add(st, ns, COLL_STEP_RECV_REDUCE_COPY, in_prev, -1, COLL_BUF_SEND, soff, COLL_BUF_RECV, slen, i,
      0, 0);

  /* Phase 2: ring all-reduce of shard i across hosts, in the receive buffer, on the
   * host ring's pieces of the shard (traced as chunks n + i·H + piece). */
  int p = mod(h - 1, H), id = piece(slen, soff, n, H, i, p, &coff, &clen);
  add(st, ns, COLL_STEP_SEND, -1, x_next, COLL_BUF_RECV, coff, COLL_BUF_RECV, clen, id, 0, d1);
  for (int s = 1; s <= H - 2; s++) {
    p = mod(h - 1 - s, H), id = piece(slen, soff, n, H, i, p, &coff, &clen);
    add(st, ns, COLL_STEP_RECV_REDUCE_SEND, x_prev, x_next, COLL_BUF_RECV, coff, COLL_BUF_RECV,
        clen, id, 0, d1);
  }
  id = piece(slen, soff, n, H, i, h, &coff, &clen);
  add(st, ns, COLL_STEP_RECV_REDUCE_COPY_SEND, x_prev, x_next, COLL_BUF_RECV, coff, COLL_BUF_RECV,
      clen, id, 1, d1);
  for (int k = 1; k <= H - 2; k++) {
    p = mod(h - k, H), id = piece(slen, soff, n, H, i, p, &coff, &clen);
    add(st, ns, COLL_STEP_RECV_COPY_SEND, x_prev, x_next, COLL_BUF_RECV, coff, COLL_BUF_RECV, clen,
        id, 0, d1);
  }
  p = mod(h + 1, H), id = piece(slen, soff, n, H, i, p, &coff, &clen);
  add(st, ns, COLL_STEP_RECV, x_prev, -1, COLL_BUF_RECV, coff, COLL_BUF_RECV, clen, id, 0, d1);

  /* Phase 3: ring all-gather of the shards inside the host. */
  add(st, ns, COLL_STEP_SEND, -1, in_next, COLL_BUF_RECV, soff, COLL_BUF_RECV, slen, i, 0, d2);
  for (int k = 1; k <= n - 2; k++) {
    c = mod(i - k, n);
    coll_ring_chunk(count, n, c, &off, &len);
    add(st, ns, COLL_STEP_RECV_COPY_SEND, in_prev, in_next, COLL_BUF_RECV, off, COLL_BUF_RECV, len,
        c, 0, d2);
  }
  c = mod(i + 1, n);
  coll_ring_chunk(count, n, c, &off, &len);
  add(st, ns, COLL_STEP_RECV, in_prev, -1, COLL_BUF_RECV, off, COLL_BUF_RECV, len, c, 0, d2);
  return COLL_OK;
}

coll_result coll_hier_cost(coll_coll_kind c, double S, const coll_cost_model *m, double *seconds,
                           char *formula, size_t formula_len) {
  char dummy[8];
  if (!formula) formula = dummy, formula_len = sizeof dummy;
  int H = m->hosts, n = m->local;
  if ((c != COLL_COLL_ALL_REDUCE && c != COLL_COLL_ALL_GATHER) || !(S >= 0))
    return COLL_ERR_INVALID_ARG;
  if (H < 2 || n < 2 || H * n != m->p) {
    snprintf(formula, formula_len,
             "not applicable: needs several hosts holding the same number (>= 2) of ranks "
             "(here %d host%s, %s)",
             H, H == 1 ? "" : "s",
             n > 0 ? (n == 1 ? "one rank each" : "several ranks each") : "unequal ranks per host");
    return COLL_ERR_INVALID_ARG;
  }
  if (c == COLL_COLL_ALL_GATHER) { /* S: the whole output, N blocks */
    double xs = H - 1.0, xb = (H - 1.0) / m->p * S, is = (n - 1.0) * H, ib = (n - 1.0) / n * S;
    double tx = xs * m->alpha_net + xb * m->beta_net, ti = is * m->alpha + ib * m->beta;
    *seconds = tx + ti;
    snprintf(formula, formula_len,
             "(H-1)*a_x + (H-1)/N*S*b_x + (n-1)H*a_in + (n-1)/n*S*b_in with H=%d hosts x n=%d, "
             "S=%.0f B: across %.0f*%.3f us + %.0f B*%.4f ns/B = %.2f us, inside %.0f*%.3f us + "
             "%.0f B*%.4f ns/B = %.2f us, = %.2f us",
             H, n, S, xs, m->alpha_net * 1e6, xb, m->beta_net * 1e9, tx * 1e6, is, m->alpha * 1e6,
             ib, m->beta * 1e9, ti * 1e6, *seconds * 1e6);
    return COLL_OK;
  }
  double in_steps = 2.0 * (n - 1), in_bytes = 2.0 * (n - 1) / n * S;
  double x_steps = 2.0 * (H - 1), x_bytes = 2.0 * (H - 1) / H * S / n;
  double red = (double)(m->p - 1) / m->p * S;
  double t_in = in_steps * m->alpha + in_bytes * m->beta;
  double t_x = x_steps * m->alpha_net + x_bytes * m->beta_net;
  *seconds = t_in + t_x + red * m->gamma;
  snprintf(formula, formula_len,
           "2(n-1)*a_in + 2(n-1)/n*S*b_in + 2(H-1)*a_x + 2(H-1)/H*S/n*b_x with H=%d hosts x n=%d, "
           "S=%.0f B: inside %.0f*%.3f us + %.0f B*%.4f ns/B = %.2f us, across %.0f*%.3f us + "
           "%.0f B*%.4f ns/B = %.2f us, + %.0f B*%.4f ns/B reduced = %.2f us",
           H, n, S, in_steps, m->alpha * 1e6, in_bytes, m->beta * 1e9, t_in * 1e6, x_steps,
           m->alpha_net * 1e6, x_bytes, m->beta_net * 1e9, t_x * 1e6, red, m->gamma * 1e9,
           *seconds * 1e6);
  return COLL_OK;
}

bool coll_hier_usable(struct coll_comm *comm, coll_coll_kind c, size_t count, size_t es) {
  (void)count, (void)es;
  return (c == COLL_COLL_ALL_REDUCE || c == COLL_COLL_ALL_GATHER) &&
         coll_hier_fits(&comm->hosts, comm->nranks);
}

coll_result coll_plan_link_bytes(const coll_plan_args *a, size_t es, coll_step *steps,
                                 uint64_t *inside, uint64_t *across) {
  size_t ns = 0;
  *inside = *across = 0;
  coll_result r = coll_plan_build(a, steps, &ns);
  if (r != COLL_OK) return r;
  const coll_hosts *hs = a->hosts;
  for (size_t k = 0; k < ns; k++) {
    if (steps[k].peer_out < 0) continue;
    bool same = !hs || !hs->host || hs->host[steps[k].peer_out] == hs->host[a->rank];
    *(same ? inside : across) += (uint64_t)steps[k].count * es;
  }
  return COLL_OK;
}
