/*
 * schedule.c — pipeline schedules as data (schedule.h): builds each stage's list of
 * actions for GPipe, 1F1B, interleaved 1F1B and ZB-H1, checks any such lists by running
 * them under rendezvous semantics, simulates them at unit costs and draws the picture.
 * Pure functions of (kind, P, M, V): it must never talk to a peer, touch a model, print or
 * exit; memory is the caller's to free (train_pp_free).
 *
 * How a schedule is built, for every kind the same three steps:
 *
 *  1. The order of the compute actions on each stage (the only thing that differs):
 *       GPipe        F0..F(M-1), then B0..B(M-1);
 *       1F1B         w = min(P-1-s, M) forwards, then (F, B) pairs, then w backwards;
 *       interleaved  Megatron's order: the k-th forward is micro (k / PV)·P + k % P of
 *                    chunk (k / P) % V, the k-th backward the same micro of chunk
 *                    V-1 - (k / P) % V; w = min(2(P-1-s) + (V-1)P, MV) forwards, then
 *                    (F, B) pairs, then w backwards;
 *       ZB-H1        list scheduling at unit time: each stage runs, each time unit, the
 *                    first that is ready of F (its input arrived, fewer than P-s
 *                    micro-batches waiting for their B and fewer than P for their W — the
 *                    1F1B bound on stage 0), B (its gradient arrived), W (the oldest).
 *                    The W's fall into the slots 1F1B leaves idle while a gradient is on
 *                    its way, and the tail fills with them: at F = B = W every stage's
 *                    idle time is P-1, the makespan 3M + P-1 (for M >= P).
 *  2. The earliest-start timeline of those orders (a compute starts when its stage is
 *     free and its producer — F of u-1, B of u+1, or the stage's own F or B — has ended).
 *  3. Each transfer placed at the first time t in [producer's end, consumer's start] at
 *     which both stages sit between two computes. The transfers of one moment between one
 *     pair of stages form a group — the same transfers at both ends, so each group has
 *     its mirror on the peer (what libcoll's lock-step grouped calls and COLL_CHECK
 *     need, schedule.h) — and at one moment a stage meets its lower-numbered peer first.
 *     In 1F1B's steady state that gives Megatron's pairs: send_act(i) with recv_grad(j)
 *     (send_forward_recv_backward) and send_grad(j) with recv_act(i+1) on the next stage.
 *     Every transfer has one time and a stage's groups are ordered by time, and at one
 *     moment a stage waits only for a lower-numbered one, so the lists run (by induction
 *     on t every stage reaches its group at t) at the timeline's speed: the idle fraction
 *     of the lists is the timeline's, (P-1)/M for GPipe and 1F1B, (P-1)/(VM) interleaved,
 *     (P-1)/(3M) ZB-H1 when M >= P. Open: with B = 2F a producer can end in the middle of
 *     its consumer stage's backward and start-to-start there is no moment both sit
 *     between computes; the transfer then goes alone (a group of its own) right after the
 *     producer and right before the consumer, and one side waits. That happens in
 *     interleaved at P = 2, 5, 7 and 8 with M > P, whose idle fraction then exceeds the
 *     formula (P = 2, M = 4, V = 2: 0.208 against 0.125) — still verified, but no faster
 *     than 1F1B there; a timeline built with the rendezvous in mind would fix it. Within
 *     a group the transfers are sorted by (act before grad, micro, sending virtual
 *     stage), the same key on both ends, so between two stages the sends and the
 *     receives come in the same order — as NCCL and libcoll match them (in posting
 *     order, no tags).
 *
 * The checker (train_pp_verify) trusts none of that: it pairs the k-th send from s to r
 * with the k-th receive on r from s (the transports' order), checks each pair is the same
 * tensor (act or grad, micro, adjacent virtual stages), then runs the lists: a stage at a
 * group posts all of it and passes when each op's partner has been posted (rendezvous: a
 * send completes only when its receive is posted); no stage able to move before all end
 * is a deadlock. Computes are checked against what the stage holds (F of u > 0 after its
 * activation arrived, B after its F and its gradient, W after its B, a send after the
 * compute that produced it).
 */
#include "parallel/schedule.h"
#include "base/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[TRAIN_PP_KINDS] = {"gpipe", "1f1b", "interleaved", "zb"};
static const char *const op_names[TRAIN_PP_ACTIONS] = {"F",        "B",        "W",
                                                       "send_act", "recv_act", "send_grad",
                                                       "recv_grad"};

int train_pp_kind_parse(const char *name) {
  for (int k = 0; name && k < TRAIN_PP_KINDS; k++)
    if (!strcmp(name, kind_names[k])) return k;
  return -1;
}

const char *train_pp_kind_name(train_pp_kind kind) {
  return kind >= 0 && kind < TRAIN_PP_KINDS ? kind_names[kind] : "unknown";
}

int train_pp_check(train_pp_kind kind, int P, int M, int V, char *err) {
  if (kind < 0 || kind >= TRAIN_PP_KINDS)
    return train_errf(err, "unknown pipeline schedule %d", (int)kind), -1;
  if (P < 1) return train_errf(err, "a pipeline needs at least 1 stage, got P = %d", P), -1;
  if (M < 1) return train_errf(err, "a pipeline needs at least 1 micro-batch, got M = %d", M), -1;
  if (kind != TRAIN_PP_INTERLEAVED) {
    if (V != 1)
      return train_errf(err, "the %s schedule has one chunk per stage (V = 1), got V = %d",
                        kind_names[kind], V),
             -1;
    return 0;
  }
  if (V < 2)
    return train_errf(err, "the interleaved schedule needs V >= 2 chunks per stage, got V = %d", V),
           -1;
  /* One stage would send its chunks' activations to itself: nothing to interleave. */
  if (P < 2)
    return train_errf(err, "the interleaved schedule needs P >= 2 stages, got P = %d", P), -1;
  if (M < P || M % P)
    return train_errf(err,
                      "the interleaved schedule needs M a multiple of P (micro-batches go "
                      "round the stages in groups of P), got M = %d for P = %d",
                      M, P),
           -1;
  return 0;
}

double train_pp_formula(train_pp_kind kind, int P, int M, int V) {
  if (P < 1 || M < 1 || V < 1) return 0;
  switch (kind) {
  case TRAIN_PP_INTERLEAVED: return (double)(P - 1) / ((double)V * M);
  case TRAIN_PP_ZB: return (double)(P - 1) / (3.0 * M);
  default: return (double)(P - 1) / M;
  }
}

/* Unit costs: the whole backward is twice the forward; ZB splits it into B and W of one. */
static int cost_of(train_pp_kind kind, train_pp_op op) {
  if (kind == TRAIN_PP_ZB) return 1;
  return op == TRAIN_PP_B ? 2 : 1;
}

static int is_compute(train_pp_op op) {
  return op == TRAIN_PP_F || op == TRAIN_PP_B || op == TRAIN_PP_W;
}

void train_pp_free(train_pp_schedule *s) {
  if (!s) return;
  if (s->acts)
    for (int i = 0; i < s->P; i++) free(s->acts[i]);
  free(s->acts);
  free(s->n);
  free(s->inflight);
  memset(s, 0, sizeof *s);
}

/* ---- building ---------------------------------------------------------------------- */

typedef struct {
  train_pp_op op;
  int micro, chunk;
  long start, end; /* the timeline of step 2 */
} comp;

typedef struct {
  long t;
  int alone;         /* placed apart at each end (no common moment): a group of its own */
  int grad;          /* 0 act, 1 grad: the key's second field */
  int micro, u_from; /* the sending virtual stage */
  int gap;           /* computes of this stage before it */
  train_pp_action a;
} xfer;

static comp mk(train_pp_op op, int micro, int chunk) {
  comp c = {op, micro, chunk, -1, -1};
  return c;
}

/* Step 1 for ZB-H1: list scheduling at unit time (see the top). c[s] holds 3M entries. */
static int zb_order(int P, int M, comp **c, char *err) {
  int *nf = calloc((size_t)P, sizeof *nf), *nb = calloc((size_t)P, sizeof *nb);
  int *nw = calloc((size_t)P, sizeof *nw), *pick = calloc((size_t)P, sizeof *pick);
  long *endF = malloc((size_t)P * M * sizeof *endF), *endB = malloc((size_t)P * M * sizeof *endB);
  int rc = -1;
  if (!nf || !nb || !nw || !pick || !endF || !endB) {
    train_errf(err, "out of memory building a %d-stage schedule", P);
    goto out;
  }
  for (long i = 0; i < (long)P * M; i++) endF[i] = endB[i] = -1;
  int left = P;
  /* Each unit step every stage runs at most one action, so 3M + 2P steps suffice; the
   * bound only guards against a bug here. */
  for (long t = 0; left > 0; t++) {
    if (t > 6L * (M + P)) {
      train_errf(err, "building the zb schedule for P = %d, M = %d did not finish", P, M);
      goto out;
    }
    for (int s = 0; s < P; s++) {
      pick[s] = -1;
      int f = nf[s], b = nb[s];
      int f_ready = f < M && (s == 0 || (endF[(s - 1) * M + f] >= 0 && endF[(s - 1) * M + f] <= t));
      int b_ready = b < f &&
                    (s == P - 1 || (endB[(s + 1) * M + b] >= 0 && endB[(s + 1) * M + b] <= t));
      if (f_ready && f - b < P - s && f - nw[s] < P)
        pick[s] = TRAIN_PP_F;
      else if (b_ready)
        pick[s] = TRAIN_PP_B;
      else if (nw[s] < b)
        pick[s] = TRAIN_PP_W;
    }
    for (int s = 0; s < P; s++) {
      if (pick[s] < 0) continue;
      int k = nf[s] + nb[s] + nw[s];
      if (pick[s] == TRAIN_PP_F)
        c[s][k] = mk(TRAIN_PP_F, nf[s], 0), endF[s * M + nf[s]++] = t + 1;
      else if (pick[s] == TRAIN_PP_B)
        c[s][k] = mk(TRAIN_PP_B, nb[s], 0), endB[s * M + nb[s]++] = t + 1;
      else {
        c[s][k] = mk(TRAIN_PP_W, nw[s]++, 0);
        if (nw[s] == M) left--;
      }
    }
  }
  rc = 0;
out:
  free(nf), free(nb), free(nw), free(pick), free(endF), free(endB);
  return rc;
}

/* Step 1: the compute order of every stage into c[s][0..nc). */
static int compute_order(train_pp_kind kind, int P, int M, int V, comp **c, int nc, char *err) {
  if (kind == TRAIN_PP_ZB) return zb_order(P, M, c, err);
  for (int s = 0; s < P; s++) {
    int k = 0, total = M * V, w;
    if (kind == TRAIN_PP_GPIPE) {
      for (int i = 0; i < M; i++) c[s][k++] = mk(TRAIN_PP_F, i, 0);
      for (int i = 0; i < M; i++) c[s][k++] = mk(TRAIN_PP_B, i, 0);
      continue;
    }
    /* f[j], b[j]: the stage's j-th forward and backward. */
    comp *f = malloc(2 * (size_t)total * sizeof *f), *b = f + total;
    if (!f) return train_errf(err, "out of memory building a %d-stage schedule", P), -1;
    for (int j = 0; j < total; j++) {
      int micro = (j / (P * V)) * P + j % P, grp = (j / P) % V;
      f[j] = mk(TRAIN_PP_F, micro, grp);
      b[j] = mk(TRAIN_PP_B, micro, V - 1 - grp);
    }
    /* Warm-up: 1F1B's P-1-s; interleaved adds a round of P per extra chunk and doubles the
     * stage term (Megatron), so that the first backward of the last chunk finds its
     * gradient without a wait. */
    w = kind == TRAIN_PP_1F1B ? P - 1 - s : 2 * (P - 1 - s) + (V - 1) * P;
    if (w > total) w = total;
    for (int j = 0; j < w; j++) c[s][k++] = f[j];
    for (int j = 0; j < total - w; j++) c[s][k++] = f[w + j], c[s][k++] = b[j];
    for (int j = total - w; j < total; j++) c[s][k++] = b[j];
    free(f);
  }
  (void)nc;
  return 0;
}

/* Step 2: earliest starts. Producer of F of u: F of u-1; of B of u: B of u+1 (the last
 * virtual stage: its own F); of W: its B. */
static int timeline(train_pp_kind kind, int P, int M, int V, comp **c, int nc, long *startF,
                    long *startB, long *endF, long *endB, char *err) {
  int U = P * V, *pos = calloc((size_t)P, sizeof *pos);
  long *free_at = calloc((size_t)P, sizeof *free_at);
  if (!pos || !free_at) {
    free(pos), free(free_at);
    return train_errf(err, "out of memory building a %d-stage schedule", P), -1;
  }
  for (long i = 0; i < (long)U * M; i++) startF[i] = startB[i] = endF[i] = endB[i] = -1;
  for (int moved = 1; moved;) {
    moved = 0;
    for (int s = 0; s < P; s++)
      for (; pos[s] < nc; pos[s]++) {
        comp *x = &c[s][pos[s]];
        int u = x->chunk * P + s;
        long dep = 0;
        if (x->op == TRAIN_PP_F && u > 0)
          dep = endF[(u - 1) * M + x->micro];
        else if (x->op == TRAIN_PP_B)
          dep = u < U - 1 ? endB[(u + 1) * M + x->micro] : endF[u * M + x->micro];
        else if (x->op == TRAIN_PP_W)
          dep = endB[u * M + x->micro];
        if (dep < 0) break;
        x->start = free_at[s] > dep ? free_at[s] : dep;
        x->end = free_at[s] = x->start + cost_of(kind, x->op);
        long *st = x->op == TRAIN_PP_F ? startF : x->op == TRAIN_PP_B ? startB : NULL;
        long *en = x->op == TRAIN_PP_F ? endF : x->op == TRAIN_PP_B ? endB : NULL;
        if (st) st[u * M + x->micro] = x->start, en[u * M + x->micro] = x->end;
        moved = 1;
      }
  }
  int rc = 0;
  for (int s = 0; s < P && !rc; s++)
    if (pos[s] < nc)
      rc = -1, train_errf(err, "the %s order for P = %d, M = %d, V = %d stalls on stage %d",
                          kind_names[kind], P, M, V, s);
  free(pos), free(free_at);
  return rc;
}

/* Stage s sits between two computes at time t (no compute runs across t). */
static int between(const comp *c, int nc, long t) {
  for (int k = 0; k < nc; k++)
    if (c[k].start < t && t < c[k].end) return 0;
  return 1;
}

static int computes_before(const comp *c, int nc, long t) {
  int k = 0;
  while (k < nc && c[k].end <= t) k++;
  return k;
}

static int xfer_cmp(const void *pa, const void *pb) {
  const xfer *a = pa, *b = pb;
  if (a->gap != b->gap) return a->gap - b->gap;
  if (a->t != b->t) return a->t < b->t ? -1 : 1;
  /* at one moment a stage meets its lower-numbered peer first: the stage each one waits
   * for then waits only for a lower one, so no cycle of waits (the ring of interleaved
   * included) */
  if (a->a.peer != b->a.peer) return a->a.peer - b->a.peer;
  if (a->alone != b->alone) return a->alone - b->alone;
  if (a->grad != b->grad) return a->grad - b->grad;
  if (a->micro != b->micro) return a->micro - b->micro;
  return a->u_from - b->u_from;
}

/* Step 3 for one tensor: from virtual stage u_from (stage sf) to u_to (stage st), produced
 * by time e, needed by time y. Both ends get one action at the chosen time. */
static int place(comp **c, int nc, xfer **x, int *nx, int grad, int micro, int u_from, int u_to,
                 int P, long e, long y, char *err) {
  int sf = u_from % P, st = u_to % P;
  long t = e;
  while (t <= y && !(between(c[sf], nc, t) && between(c[st], nc, t))) t++;
  long ts = t, tr = t;
  int alone = 0;
  if (t > y) {
    /* No moment both stages sit between computes: the sender posts right after its
     * producer, the receiver right before its consumer, and one of them waits. */
    ts = e, tr = y, alone = 1;
    (void)err;
  }
  xfer *a = &x[sf][nx[sf]++], *b = &x[st][nx[st]++];
  a->t = b->t = ts;
  a->alone = b->alone = alone;
  a->grad = b->grad = grad;
  a->micro = b->micro = micro;
  a->u_from = b->u_from = u_from;
  a->gap = computes_before(c[sf], nc, ts);
  b->gap = computes_before(c[st], nc, tr);
  a->a = (train_pp_action){grad ? TRAIN_PP_SEND_GRAD : TRAIN_PP_SEND_ACT, micro, u_from / P, st, 0};
  b->a = (train_pp_action){grad ? TRAIN_PP_RECV_GRAD : TRAIN_PP_RECV_ACT, micro, u_to / P, sf, 0};
  return 0;
}

static int count_inflight(const train_pp_schedule *s, int stage);

int train_pp_build(train_pp_kind kind, int P, int M, int V, train_pp_schedule *out, char *err) {
  memset(out, 0, sizeof *out);
  if (train_pp_check(kind, P, M, V, err)) return -1;
  int U = P * V, nc = M * V * (kind == TRAIN_PP_ZB ? 3 : 2), rc = -1;
  comp **c = calloc((size_t)P, sizeof *c);
  xfer **x = calloc((size_t)P, sizeof *x);
  int *nx = calloc((size_t)P, sizeof *nx);
  long *tl = malloc(4 * (size_t)U * M * sizeof *tl);
  out->kind = kind, out->P = P, out->M = M, out->V = V;
  out->n = calloc((size_t)P, sizeof *out->n);
  out->acts = calloc((size_t)P, sizeof *out->acts);
  out->inflight = calloc((size_t)P, sizeof *out->inflight);
  if (!c || !x || !nx || !tl || !out->n || !out->acts || !out->inflight) goto oom;
  for (int s = 0; s < P; s++) {
    /* Each compute sends at most one tensor and receives at most one. */
    c[s] = calloc((size_t)nc, sizeof **c);
    x[s] = calloc(2 * (size_t)nc, sizeof **x);
    out->acts[s] = calloc(3 * (size_t)nc, sizeof **out->acts);
    if (!c[s] || !x[s] || !out->acts[s]) goto oom;
  }
  long *startF = tl, *startB = tl + (size_t)U * M, *endF = tl + 2 * (size_t)U * M,
       *endB = tl + 3 * (size_t)U * M;
  if (compute_order(kind, P, M, V, c, nc, err) ||
      timeline(kind, P, M, V, c, nc, startF, startB, endF, endB, err))
    goto fail;
  for (int u = 0; u < U; u++)
    for (int m = 0; m < M; m++) {
      if (u + 1 < U &&
          place(c, nc, x, nx, 0, m, u, u + 1, P, endF[u * M + m], startF[(u + 1) * M + m], err))
        goto fail;
      if (u > 0 &&
          place(c, nc, x, nx, 1, m, u, u - 1, P, endB[u * M + m], startB[(u - 1) * M + m], err))
        goto fail;
    }
  for (int s = 0; s < P; s++) {
    qsort(x[s], (size_t)nx[s], sizeof *x[s], xfer_cmp);
    int k = 0, j = 0, n = 0, grp = -1;
    for (; k <= nc; k++) {
      for (; j < nx[s] && x[s][j].gap == k; j++) {
        /* a group: the transfers of one moment with one peer (one alone when placed apart),
         * so that its mirror on the peer holds the same ones */
        const xfer *p = j > 0 ? &x[s][j - 1] : NULL, *q = &x[s][j];
        if (!p || p->gap != q->gap || p->t != q->t || p->a.peer != q->a.peer || p->alone ||
            q->alone)
          grp++;
        out->acts[s][n] = q->a;
        out->acts[s][n++].group = grp;
      }
      if (k < nc)
        out->acts[s][n++] = (train_pp_action){c[s][k].op, c[s][k].micro, c[s][k].chunk, -1, -1};
    }
    out->n[s] = n;
    out->inflight[s] = count_inflight(out, s);
  }
  rc = 0;
  goto done;
oom:
  train_errf(err, "out of memory building a %d-stage %s schedule", P, kind_names[kind]);
fail:
  train_pp_free(out);
done:
  for (int s = 0; c && s < P; s++) free(c[s]);
  for (int s = 0; x && s < P; s++) free(x[s]);
  free(c), free(x), free(nx), free(tl);
  return rc;
}

/* Micro-batch chunks whose activations stage `stage` holds at once, at most: from the F
 * to the last backward action (B, or W for ZB — this trainer keeps a micro-batch's
 * activations until its weight gradient is taken). */
static int count_inflight(const train_pp_schedule *s, int stage) {
  train_pp_op last = s->kind == TRAIN_PP_ZB ? TRAIN_PP_W : TRAIN_PP_B;
  int now = 0, peak = 0;
  for (int i = 0; i < s->n[stage]; i++) {
    if (s->acts[stage][i].op == TRAIN_PP_F && ++now > peak) peak = now;
    if (s->acts[stage][i].op == last) now--;
  }
  return peak;
}

/* ---- running the lists (the checker and the simulation) --------------------------- */

enum { HAVE_ACT = 1, HAVE_GRAD = 2, DONE_F = 4, DONE_B = 8, DONE_W = 16 };

typedef struct {
  const train_pp_schedule *s;
  int *base;            /* base[st]: st's first action's index into the flat arrays below */
  int *partner;         /* flat index of the matching transfer */
  long *posted;         /* when the action's stage reached its group; -1 before */
  int *grp_end;         /* for a transfer: one past the last action of its group */
  unsigned char *state; /* per (stage, micro, chunk): HAVE_* | DONE_* */
} runner;

static void describe(const train_pp_action *a, char *buf, size_t n) {
  const char *name = a->op >= 0 && a->op < TRAIN_PP_ACTIONS ? op_names[a->op] : "?";
  if (is_compute(a->op))
    snprintf(buf, n, "%s of micro %d chunk %d", name, a->micro, a->chunk);
  else
    snprintf(buf, n, "%s of micro %d chunk %d %s stage %d", name, a->micro, a->chunk,
             a->op == TRAIN_PP_SEND_ACT || a->op == TRAIN_PP_SEND_GRAD ? "to" : "from", a->peer);
}

/* Each action alone: in range, W only for ZB, transfers to the stage of the adjacent
 * virtual stage and not off either end of the model. */
static int check_action(const train_pp_schedule *s, int st, int i, char *err) {
  const train_pp_action *a = &s->acts[st][i];
  int P = s->P, U = P * s->V;
  char d[96];
  if (a->op < 0 || a->op >= TRAIN_PP_ACTIONS)
    return train_errf(err, "stage %d, action %d: unknown op %d", st, i, (int)a->op), -1;
  describe(a, d, sizeof d);
  if (a->micro < 0 || a->micro >= s->M || a->chunk < 0 || a->chunk >= s->V)
    return train_errf(err, "stage %d, action %d: %s is outside M = %d, V = %d", st, i, d, s->M,
                      s->V),
           -1;
  if (a->op == TRAIN_PP_W && s->kind != TRAIN_PP_ZB)
    return train_errf(err, "stage %d, action %d: %s in a %s schedule (W is zb's)", st, i, d,
                      kind_names[s->kind]),
           -1;
  if (is_compute(a->op)) {
    if (a->peer != -1)
      return train_errf(err, "stage %d, action %d: %s has peer %d, expected -1", st, i, d, a->peer),
             -1;
    return 0;
  }
  int u = a->chunk * P + st, up = a->op == TRAIN_PP_SEND_ACT || a->op == TRAIN_PP_RECV_GRAD;
  if ((up && u == U - 1) || (!up && u == 0))
    return train_errf(err, "stage %d, action %d: %s, but virtual stage %d has no %s neighbour", st,
                      i, d, u, up ? "next" : "previous"),
           -1;
  int want = up ? (st + 1) % P : (st + P - 1) % P;
  if (a->peer != want)
    return train_errf(err, "stage %d, action %d: %s, expected stage %d (virtual stage %d)", st, i,
                      d, want, up ? u + 1 : u - 1),
           -1;
  return 0;
}

/* The transports' order: the k-th send from a to b meets the k-th receive on b from a. */
static int pair_transfers(runner *r, char *err) {
  const train_pp_schedule *s = r->s;
  int P = s->P, U = P * s->V;
  int *cnt = calloc((size_t)P * P + 1, sizeof *cnt), *cur = calloc((size_t)P * P, sizeof *cur);
  int *rq = calloc((size_t)r->base[P] + 1, sizeof *rq), rc = -1;
  if (!cnt || !cur || !rq) {
    train_errf(err, "out of memory checking a %d-stage schedule", P);
    goto out;
  }
  /* Receives queued per channel (from, to) in list order: offsets by counting first. */
  for (int st = 0; st < P; st++)
    for (int i = 0; i < s->n[st]; i++) {
      train_pp_op op = s->acts[st][i].op;
      if (op == TRAIN_PP_RECV_ACT || op == TRAIN_PP_RECV_GRAD)
        cnt[s->acts[st][i].peer * P + st + 1]++;
    }
  for (int k = 0; k < P * P; k++) cnt[k + 1] += cnt[k];
  for (int st = 0; st < P; st++)
    for (int i = 0; i < s->n[st]; i++) {
      train_pp_op op = s->acts[st][i].op;
      int ch = s->acts[st][i].peer * P + st;
      if (op == TRAIN_PP_RECV_ACT || op == TRAIN_PP_RECV_GRAD)
        rq[cnt[ch] + cur[ch]++] = r->base[st] + i;
    }
  memset(cur, 0, (size_t)P * P * sizeof *cur);
  for (int st = 0; st < P; st++)
    for (int i = 0; i < s->n[st]; i++) {
      const train_pp_action *a = &s->acts[st][i];
      if (a->op != TRAIN_PP_SEND_ACT && a->op != TRAIN_PP_SEND_GRAD) continue;
      int ch = st * P + a->peer, to = a->peer;
      char d[96], e[96];
      describe(a, d, sizeof d);
      if (cnt[ch] + cur[ch] == cnt[ch + 1]) {
        train_errf(err,
                   "stage %d, action %d: %s has no receive on stage %d (its receives from "
                   "stage %d are all taken)",
                   st, i, d, to, st);
        goto out;
      }
      int j = rq[cnt[ch] + cur[ch]++] - r->base[to];
      const train_pp_action *b = &s->acts[to][j];
      train_pp_op want = a->op == TRAIN_PP_SEND_ACT ? TRAIN_PP_RECV_ACT : TRAIN_PP_RECV_GRAD;
      int u = a->chunk * P + st, ub = b->chunk * P + to;
      int uw = a->op == TRAIN_PP_SEND_ACT ? u + 1 : u - 1;
      if (b->op != want || b->micro != a->micro || ub != uw) {
        describe(b, e, sizeof e);
        train_errf(err,
                   "stage %d, action %d: %s meets stage %d's action %d, %s; expected %s of "
                   "micro %d for virtual stage %d",
                   st, i, d, to, j, e, op_names[want], a->micro, uw);
        goto out;
      }
      r->partner[r->base[st] + i] = r->base[to] + j;
      r->partner[r->base[to] + j] = r->base[st] + i;
    }
  for (int ch = 0; ch < P * P; ch++)
    if (cur[ch] < cnt[ch + 1] - cnt[ch]) {
      int to = ch % P, j = rq[cnt[ch] + cur[ch]] - r->base[to];
      char e[96];
      describe(&s->acts[to][j], e, sizeof e);
      train_errf(err, "stage %d, action %d: %s has no send on stage %d", to, j, e, ch / P);
      goto out;
    }
  rc = 0;
  (void)U;
out:
  free(cnt), free(cur), free(rq);
  return rc;
}

/* Runs the lists under rendezvous semantics at unit costs. slots as in train_pp_simulate
 * (may be NULL); *makespan and busy[P] out. */
static int run_lists(const train_pp_schedule *s, int **slots, long *makespan, long *busy,
                     char *err) {
  int P = s->P, M = s->M, V = s->V, U = P * V, rc = -1;
  runner r = {s, NULL, NULL, NULL, NULL, NULL};
  int *pos = calloc((size_t)P, sizeof *pos);
  long *clock = calloc((size_t)P, sizeof *clock);
  r.base = calloc((size_t)P + 1, sizeof *r.base);
  if (!pos || !clock || !r.base) goto oom;
  for (int st = 0; st < P; st++) {
    if (s->n[st] < 0 || (s->n[st] > 0 && !s->acts[st])) {
      train_errf(err, "stage %d: %d actions, no list", st, s->n[st]);
      goto out;
    }
    r.base[st + 1] = r.base[st] + s->n[st];
  }
  int N = r.base[P];
  r.partner = malloc(((size_t)N + 1) * sizeof *r.partner);
  r.posted = malloc(((size_t)N + 1) * sizeof *r.posted);
  r.grp_end = malloc(((size_t)N + 1) * sizeof *r.grp_end);
  r.state = calloc((size_t)P * M * V, 1);
  if (!r.partner || !r.posted || !r.grp_end || !r.state) goto oom;
  for (int st = 0; st < P; st++) {
    for (int i = 0; i < s->n[st]; i++) {
      if (check_action(s, st, i, err)) goto out;
      r.partner[r.base[st] + i] = -1;
      r.posted[r.base[st] + i] = -1;
    }
    for (int i = s->n[st] - 1, end = s->n[st]; i >= 0; i--) {
      const train_pp_action *a = &s->acts[st][i];
      if (is_compute(a->op)) {
        end = i;
        continue;
      }
      if (i + 1 < s->n[st] && !is_compute(s->acts[st][i + 1].op) &&
          s->acts[st][i + 1].group != a->group)
        end = i + 1; /* the next transfer starts a group of its own */
      r.grp_end[r.base[st] + i] = end;
      if (end > i + 1 && s->acts[st][i + 1].peer != a->peer) {
        train_errf(err,
                   "stage %d, actions %d and %d: one group with stages %d and %d; a group's "
                   "transfers all go to one peer",
                   st, i, i + 1, a->peer, s->acts[st][i + 1].peer);
        goto out;
      }
    }
    busy[st] = 0;
  }
  if (pair_transfers(&r, err)) goto out;
  *makespan = 0;
  for (int moved = 1, left = P; left > 0;) {
    if (!moved) {
      /* Deadlock: name the first stage that waits and the op nobody meets. */
      for (int st = 0; st < P; st++) {
        if (pos[st] >= s->n[st]) continue;
        int g = r.base[st] + pos[st], e = r.base[st] + r.grp_end[g];
        for (int k = g; k < e; k++) {
          int p = r.partner[k], ps = 0;
          if (r.posted[p] >= 0) continue;
          while (r.base[ps + 1] <= p) ps++;
          char d[96];
          describe(&s->acts[st][k - r.base[st]], d, sizeof d);
          train_errf(err,
                     "stage %d, action %d: %s waits for stage %d's action %d, which it never "
                     "reaches (stage %d is held at action %d): the lists deadlock",
                     st, k - r.base[st], d, ps, p - r.base[ps], ps, pos[ps]);
          goto out;
        }
      }
      train_errf(err, "the lists deadlock");
      goto out;
    }
    moved = 0;
    for (int st = 0; st < P; st++) {
      while (pos[st] < s->n[st]) {
        int i = pos[st];
        const train_pp_action *a = &s->acts[st][i];
        unsigned char *h = &r.state[((size_t)st * M + a->micro) * V + a->chunk];
        int u = a->chunk * P + st;
        char d[96];
        describe(a, d, sizeof d);
        if (is_compute(a->op)) {
          const char *why = NULL;
          unsigned char done = a->op == TRAIN_PP_F ? DONE_F : a->op == TRAIN_PP_B ? DONE_B : DONE_W;
          if (*h & done)
            why = "it was done already";
          else if (a->op == TRAIN_PP_F && u > 0 && !(*h & HAVE_ACT))
            why = "its activation has not arrived";
          else if (a->op == TRAIN_PP_B && !(*h & DONE_F))
            why = "it comes before its F";
          else if (a->op == TRAIN_PP_B && u < U - 1 && !(*h & HAVE_GRAD))
            why = "its gradient has not arrived";
          else if (a->op == TRAIN_PP_W && !(*h & DONE_B))
            why = "it comes before its B";
          if (why) {
            train_errf(err, "stage %d, action %d: %s, but %s", st, i, d, why);
            goto out;
          }
          *h |= done;
          if (slots) slots[st][i] = (int)clock[st];
          clock[st] += cost_of(s->kind, a->op);
          busy[st] += cost_of(s->kind, a->op);
          if (clock[st] > *makespan) *makespan = clock[st];
          pos[st]++, moved = 1;
          if (pos[st] == s->n[st]) left--;
          continue;
        }
        /* A group: post it all, then pass when every partner has been posted. */
        int g = r.base[st] + i, e = r.base[st] + r.grp_end[g];
        if (r.posted[g] < 0)
          for (int k = g; k < e; k++) {
            const train_pp_action *b = &s->acts[st][k - r.base[st]];
            unsigned char hb = r.state[((size_t)st * M + b->micro) * V + b->chunk];
            if ((b->op == TRAIN_PP_SEND_ACT && !(hb & DONE_F)) ||
                (b->op == TRAIN_PP_SEND_GRAD && !(hb & DONE_B))) {
              describe(b, d, sizeof d);
              train_errf(err, "stage %d, action %d: %s, but its %s has not run", st, k - r.base[st],
                         d, b->op == TRAIN_PP_SEND_ACT ? "F" : "B");
              goto out;
            }
            r.posted[k] = clock[st];
          }
        long t = clock[st];
        int ready = 1;
        for (int k = g; k < e && ready; k++) {
          long q = r.posted[r.partner[k]];
          if (q < 0)
            ready = 0;
          else if (q > t)
            t = q;
        }
        if (!ready) break;
        /* the mirror: the partners' group on the peer holds exactly the partners */
        {
          int p0 = r.partner[g], ps = 0;
          while (r.base[ps + 1] <= p0) ps++;
          int pg = p0 - r.base[ps];
          while (pg > 0 && !is_compute(s->acts[ps][pg - 1].op) &&
                 s->acts[ps][pg - 1].group == s->acts[ps][p0 - r.base[ps]].group)
            pg--;
          int pe = r.grp_end[r.base[ps] + pg] + r.base[ps], mirror = pe - r.base[ps] - pg == e - g;
          for (int k = g; k < e && mirror; k++)
            mirror = r.partner[k] >= r.base[ps] + pg && r.partner[k] < pe;
          if (!mirror) {
            describe(a, d, sizeof d);
            train_errf(err,
                       "stage %d, action %d: %s is in a group of %d transfers with stage %d, "
                       "whose group of its partner (from action %d) holds %d: a group and its "
                       "mirror on the peer must hold the same transfers",
                       st, i, d, e - g, ps, pg, pe - r.base[ps] - pg);
            goto out;
          }
        }
        for (int k = g; k < e; k++) {
          const train_pp_action *b = &s->acts[st][k - r.base[st]];
          if (slots) slots[st][k - r.base[st]] = -1;
          unsigned char *hb = &r.state[((size_t)st * M + b->micro) * V + b->chunk];
          if (b->op == TRAIN_PP_RECV_ACT) *hb |= HAVE_ACT;
          if (b->op == TRAIN_PP_RECV_GRAD) *hb |= HAVE_GRAD;
        }
        clock[st] = t;
        pos[st] = e - r.base[st], moved = 1;
        if (pos[st] == s->n[st]) left--;
      }
    }
  }
  /* Every (micro, chunk) of every stage ran its F and B (and W). */
  for (int st = 0; st < P; st++)
    for (int m = 0; m < M; m++)
      for (int c = 0; c < V; c++) {
        unsigned char h = r.state[((size_t)st * M + m) * V + c];
        const char *miss = !(h & DONE_F)                             ? "F"
                           : !(h & DONE_B)                           ? "B"
                           : s->kind == TRAIN_PP_ZB && !(h & DONE_W) ? "W"
                                                                     : NULL;
        if (miss) {
          train_errf(err, "stage %d: no %s of micro %d chunk %d in its %d actions", st, miss, m, c,
                     s->n[st]);
          goto out;
        }
      }
  rc = 0;
  goto out;
oom:
  train_errf(err, "out of memory checking a %d-stage schedule", P);
out:
  free(pos), free(clock), free(r.base), free(r.partner), free(r.posted), free(r.grp_end);
  free(r.state);
  return rc;
}

static int check_shape(const train_pp_schedule *s, char *err) {
  if (!s || !s->n || !s->acts || !s->inflight)
    return train_errf(err, "the schedule has no lists (not built, or freed)"), -1;
  if (s->kind < 0 || s->kind >= TRAIN_PP_KINDS || s->P < 1 || s->M < 1 || s->V < 1)
    return train_errf(err,
                      "the schedule's shape (kind %d, P = %d, M = %d, V = %d) is not one "
                      "this trainer runs",
                      (int)s->kind, s->P, s->M, s->V),
           -1;
  return 0;
}

int train_pp_verify(const train_pp_schedule *s, char *err) {
  if (check_shape(s, err)) return -1;
  long makespan, *busy = calloc((size_t)s->P, sizeof *busy);
  if (!busy) return train_errf(err, "out of memory checking a %d-stage schedule", s->P), -1;
  int rc = run_lists(s, NULL, &makespan, busy, err);
  free(busy);
  if (rc) return -1;
  for (int st = 0; st < s->P; st++) {
    int want = count_inflight(s, st);
    if (s->inflight[st] != want)
      return train_errf(err,
                        "stage %d: inflight says %d micro-batch chunks, the list holds up to %d",
                        st, s->inflight[st], want),
             -1;
  }
  return 0;
}

int train_pp_simulate(const train_pp_schedule *s, double *idle_frac, int **slots, char *err) {
  if (check_shape(s, err)) return -1;
  long makespan, *busy = calloc((size_t)s->P, sizeof *busy);
  if (!busy) return train_errf(err, "out of memory simulating a %d-stage schedule", s->P), -1;
  int rc = run_lists(s, slots, &makespan, busy, err);
  if (!rc) {
    /* idle / busy per stage, the largest: every stage waits for the slowest one's end. */
    double worst = 0;
    for (int st = 0; st < s->P; st++) {
      double f = busy[st] ? (double)(makespan - busy[st]) / (double)busy[st] : 0;
      if (f > worst) worst = f;
    }
    *idle_frac = worst;
  }
  free(busy);
  return rc;
}

/* ---- the picture --------------------------------------------------------------------- */

/* Appends to out[*at..n) like snprintf, never past n-1; keeps counting when cut. */
static void put(char *out, size_t n, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put(char *out, size_t n, size_t *at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(*at < n ? out + *at : NULL, *at < n ? n - *at : 0, fmt, ap);
  va_end(ap);
  if (k > 0) *at += (size_t)k;
}

void train_pp_draw(const train_pp_schedule *s, char *out, size_t n) {
  size_t at = 0;
  char err[TRAIN_ERRLEN];
  if (!out || n == 0) return;
  out[0] = '\0';
  if (check_shape(s, err)) {
    put(out, n, &at, "no picture: %s\n", err);
    return;
  }
  int P = s->P, **slots = calloc((size_t)P, sizeof *slots), ok = slots != NULL;
  for (int st = 0; ok && st < P; st++)
    ok = (slots[st] = calloc((size_t)s->n[st] + 1, sizeof **slots)) != NULL;
  double idle = 0;
  if (!ok)
    put(out, n, &at, "no picture: out of memory\n");
  else if (train_pp_simulate(s, &idle, slots, err))
    put(out, n, &at, "no picture: %s\n", err);
  else {
    /* The cell's width: the longest label ("F12", or "F12.1" with chunks). */
    long end = 0;
    int w = 2;
    for (int st = 0; st < P; st++)
      for (int i = 0; i < s->n[st]; i++) {
        const train_pp_action *a = &s->acts[st][i];
        if (!is_compute(a->op)) continue;
        char lab[32];
        int k = s->V > 1 ? snprintf(lab, sizeof lab, "F%d.%d", a->micro, a->chunk)
                         : snprintf(lab, sizeof lab, "F%d", a->micro);
        if (k > w) w = k;
        long e = slots[st][i] + cost_of(s->kind, a->op);
        if (e > end) end = e;
      }
    for (int st = 0; st < P; st++) {
      put(out, n, &at, "%d |", st);
      long t = 0;
      for (int i = 0; i < s->n[st]; i++) {
        const train_pp_action *a = &s->acts[st][i];
        if (!is_compute(a->op)) continue;
        char lab[32];
        if (s->V > 1)
          snprintf(lab, sizeof lab, "%s%d.%d", op_names[a->op], a->micro, a->chunk);
        else
          snprintf(lab, sizeof lab, "%s%d", op_names[a->op], a->micro);
        for (; t < slots[st][i]; t++) put(out, n, &at, " %.*s", w, "..........................");
        for (int k = 0; k < cost_of(s->kind, a->op); k++, t++) put(out, n, &at, " %-*s", w, lab);
      }
      for (; t < end; t++) put(out, n, &at, " %.*s", w, "..........................");
      put(out, n, &at, "\n");
    }
    double f = train_pp_formula(s->kind, P, s->M, s->V);
    double diff = idle > f ? idle - f : f - idle;
    put(out, n, &at, "idle fraction %.4g (from the lists) %s formula %.4g\n", idle,
        diff < 1e-12 ? "=" : "vs", f);
  }
  for (int st = 0; slots && st < P; st++) free(slots[st]);
  free(slots);
  if (at >= n) out[n - 1] = '\0';
}
