/* sim_plans.c — every rank's plan of one call, built by the library's own plan functions
 * and kept small enough for thousands of ranks.
 *
 * A ring all-reduce on N ranks has 2N-1 steps per rank: N(2N-1) = 33.5 million steps at
 * N = 4096, 1.6 GB as coll_step.  But rank r's steps differ from rank r+1's only in
 * which chunk they move and in peers that are r±1: with peers stored relative to the
 * rank ((peer - r) mod N), the whole job has about 5N distinct steps.  So the distinct
 * steps go in a table (found through a hash), and each rank keeps a 4-byte index per
 * step: 134 MB at N = 4096 for the ring, a few MB for trees and recursive doubling.
 * All-to-all (pairwise) has N^2 distinct steps (every block has its own offset) and is
 * the one plan whose memory grows as N^2 here.
 *
 * The plans are checked as they are stored, the way test/algo/test_plan.c checks them: no
 * zero-length step (both ends leave those out), peers in range and never the rank itself.
 *
 * Must never: change a plan (except through the caller's `edit`, which the tests use to
 * break one on purpose), or guess at a step the compact form cannot hold — refuse it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

static uint64_t step_hash(const sim_step *s) {
  uint64_t h = 1469598103934665603ull;
  h = mix(h, s->count);
  h = mix(h, s->src_off);
  h = mix(h, s->dst_off);
  h = mix(h, s->delay);
  h = mix(h, ((uint64_t)(uint32_t)s->din << 32) | (uint32_t)s->dout);
  h = mix(h, ((uint64_t)(uint32_t)s->din2 << 32) | ((uint64_t)s->kind << 24) |
                 ((uint64_t)s->final << 16) | ((uint64_t)s->src_buf << 8) | s->dst_buf);
  return h;
}

static bool same(const sim_step *a, const sim_step *b) {
  return a->count == b->count && a->src_off == b->src_off && a->dst_off == b->dst_off &&
         a->delay == b->delay && a->din == b->din && a->dout == b->dout && a->din2 == b->din2 &&
         a->kind == b->kind && a->final == b->final && a->src_buf == b->src_buf &&
         a->dst_buf == b->dst_buf;
}

static bool rehash(sim_plans *p, size_t cap) {
  size_t *h = calloc(cap, sizeof *h);
  if (!h) return false;
  for (size_t i = 0; i < p->ntable; i++) {
    size_t k = step_hash(&p->table[i]) & (cap - 1);
    while (h[k]) k = (k + 1) & (cap - 1);
    h[k] = i + 1;
  }
  free(p->hash);
  p->hash = h;
  p->hashcap = cap;
  return true;
}

/* The table index of s, adding it if new; false when out of memory. */
static bool intern(sim_plans *p, const sim_step *s, uint32_t *idx) {
  if (2 * (p->ntable + 1) > p->hashcap && !rehash(p, p->hashcap ? 2 * p->hashcap : 1024))
    return false;
  size_t k = step_hash(s) & (p->hashcap - 1);
  for (; p->hash[k]; k = (k + 1) & (p->hashcap - 1))
    if (same(&p->table[p->hash[k] - 1], s)) {
      *idx = (uint32_t)(p->hash[k] - 1);
      return true;
    }
  if (p->ntable == p->captable) {
    size_t cap = p->captable ? 2 * p->captable : 1024;
    sim_step *t = realloc(p->table, cap * sizeof *t);
    if (!t) return false;
    p->table = t, p->captable = cap;
  }
  if (p->ntable >= UINT32_MAX) return false;
  p->table[p->ntable] = *s;
  p->hash[k] = p->ntable + 1;
  *idx = (uint32_t)p->ntable++;
  return true;
}

void sim_plans_free(sim_plans *p) {
  free(p->table);
  free(p->refs);
  free(p->first);
  free(p->rounds);
  free(p->hash);
  memset(p, 0, sizeof *p);
}

static int32_t rel(int peer, int r, int n) {
  return peer < 0 ? -1 : (int32_t)(((peer - r) % n + n) % n);
}

coll_result sim_plans_build(sim_plans *p, int n, const sim_call *call, size_t slice,
                            sim_edit_fn edit, void *edit_ctx, char *why, size_t why_len) {
  memset(p, 0, sizeof *p);
  p->nranks = n;
  if (n < 1 || slice == 0) {
    snprintf(why, why_len, "need at least one rank and a slice of at least one element");
    return COLL_ERR_INVALID_ARG;
  }
  size_t maxs = coll_plan_max_steps(n) + 4; /* + room for an edit that adds a step */
  coll_step *st = calloc(maxs, sizeof *st);
  size_t caprefs = (size_t)n * 4;
  p->refs = malloc(caprefs * sizeof *p->refs);
  p->first = calloc((size_t)n + 1, sizeof *p->first);
  p->rounds = calloc((size_t)n, sizeof *p->rounds);
  coll_result res = COLL_OK;
  if (!st || !p->refs || !p->first || !p->rounds) goto oom;
  for (int r = 0; r < n; r++) {
    coll_plan_args a = {.coll = call->coll,
                        .algo = call->algo,
                        .count = call->count,
                        .nranks = n,
                        .rank = r,
                        .root = call->root,
                        .in_place = call->in_place,
                        .slice = slice};
    if ((call->coll == COLL_COLL_GATHER || call->coll == COLL_COLL_SCATTER) && r != call->root)
      a.in_place = 0; /* only the root can be in place */
    size_t ns = 0;
    res = coll_plan_build(&a, st, &ns);
    if (res != COLL_OK) {
      snprintf(why, why_len, "%s/%s has no plan for rank %d of %d (count %zu, root %d)",
               coll_algo_name(call->algo), coll_coll_name(call->coll), r, n, call->count,
               call->root);
      goto out;
    }
    if (edit) edit(r, st, &ns, edit_ctx);
    size_t at = p->first[r];
    if (at + ns > caprefs) {
      while (at + ns > caprefs) caprefs *= 2;
      uint32_t *nr = realloc(p->refs, caprefs * sizeof *nr);
      if (!nr) goto oom;
      p->refs = nr;
    }
    for (size_t i = 0; i < ns; i++) {
      const coll_step *s = &st[i];
      int peers[3] = {s->peer_in, s->peer_out,
                      s->kind == COLL_STEP_RECV2_REDUCE_SEND ? s->peer_in2 : -1};
      for (int q = 0; q < 3; q++)
        if (peers[q] >= n || peers[q] == r || peers[q] < -1) {
          snprintf(why, why_len, "%s/%s N=%d: rank %d step %zu (%s) names peer %d",
                   coll_algo_name(call->algo), coll_coll_name(call->coll), n, r, i,
                   coll_step_name(s->kind), peers[q]);
          res = COLL_ERR_MISMATCH;
          goto out;
        }
      if (s->count == 0) {
        snprintf(why, why_len,
                 "%s/%s N=%d: rank %d step %zu has no elements (plans leave "
                 "those out on both ends)",
                 coll_algo_name(call->algo), coll_coll_name(call->coll), n, r, i);
        res = COLL_ERR_MISMATCH;
        goto out;
      }
      sim_step c = {.count = s->count,
                    .src_off = s->src_off,
                    .dst_off = s->dst_off,
                    .delay = s->delay,
                    .din = rel(s->peer_in, r, n),
                    .dout = rel(s->peer_out, r, n),
                    .din2 = rel(peers[2], r, n),
                    .kind = (uint8_t)s->kind,
                    .final = (uint8_t)(s->final != 0),
                    .src_buf = (uint8_t)s->src_buf,
                    .dst_buf = (uint8_t)s->dst_buf};
      if (!intern(p, &c, &p->refs[at + i])) goto oom;
      uint64_t k = (s->count + slice - 1) / slice + s->delay;
      if (k > p->rounds[r]) p->rounds[r] = k;
    }
    p->first[r + 1] = at + ns;
  }
  goto out;
oom:
  snprintf(why, why_len, "out of memory holding the plans of %d ranks", n);
  res = COLL_ERR_SYSTEM;
out:
  free(st);
  if (res != COLL_OK) sim_plans_free(p);
  return res;
}
