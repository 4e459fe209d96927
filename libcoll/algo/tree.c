/* tree.c — pipelined double binary tree: broadcast, reduce, all-reduce (and barrier).
 *
 * Two binary trees (Sanders, Speck & Träff) each carry half of the data, so a rank that
 * forwards to two children in one tree is a leaf in the other and no rank moves much
 * more than the whole vector each way.  Ranks are labelled L = (rank - root) mod p; the
 * root (L = 0) sits on top of both trees with a single child each.  Labels 1..m
 * (m = p-1) are placed at in-order positions 1..m of a binary tree whose root is the
 * largest power of two <= m; a position's height is its number of trailing zero bits,
 * so odd positions are leaves and even positions are interior.  Tree 0 puts label L at
 * position L; tree 1 mirrors (L -> m+1-L, m even) or shifts (L -> L mod m + 1, m odd)
 * the labels, which turns every interior label of tree 0 into a leaf of tree 1.  For
 * p = 8 (m = 7; labels shown, rank = (label + root) mod p):
 *
 *      tree 0 (first half)          tree 1 (second half)
 *              0                            0
 *              |                            |
 *              4                            3
 *            /   \                        /   \
 *           2     6                      1     5
 *          / \   / \                    / \   / \
 *         1   3 5   7                  7   2 4   6
 *
 * When m is not 2^j - 1 the right subtrees are cut at m: a right child v + 2^(h-1) that
 * does not exist is replaced by the highest v + 2^i <= m, which keeps every position's
 * parent well defined (walk up through the missing positions).
 *
 * Steps: reduce sends partial results up (leaf: SEND; one child: RECV_REDUCE_SEND; two:
 * RECV2_REDUCE_SEND), the root combines its single child's result with its own
 * (RECV_REDUCE_COPY, `final`).  Broadcast sends down (RECV, RECV_COPY_SEND, and a SEND
 * from the received copy for a second child).  All-reduce is reduce up to label 0
 * followed by broadcast down, the root's two halves of the turn being one
 * RECV_REDUCE_COPY_SEND; every rank then holds the bits the root computed once.
 *
 * Pipelining and delays.  The executor runs slice j of every step in round j.  Without
 * delays a rank's round j would need its parent to have sent slice j down, which needs
 * the root to have slice j from every leaf: each round would be a whole up-and-down trip
 * of the tree.  So a rank at depth d starts its up steps SKEW·(H-d) rounds late and its
 * down steps SKEW·(H+d) late (H: the height).  On every tree edge the child then runs up
 * to 2·SKEW rounds ahead of its parent, the FIFOs absorb that, and a round costs about
 * one hop instead of 2H.  Both ends of a connection must meet its messages in the same
 * order, and a pair of ranks can be neighbours in both trees (one connection then
 * carries two steps): on every directed tree edge the receiver's delay exceeds the
 * sender's by exactly SKEW (up: parent SKEW·(H-d) vs child at depth d+1 SKEW·(H-d-1);
 * down: child SKEW·(H+d+1) vs parent SKEW·(H+d)), and every rank orders its steps up0,
 * up1, down0, down1, so the (round, step) order of two steps sharing a connection is the
 * same at both ends.  A
 * rank's down delay is never below its up delay, so in place its result never
 * overwrites its input before the input went up.
 *
 * Cost (p ranks, n bytes, each tree n/2 in k = ceil(n/2 / slice) slices of s = n/2k
 * bytes, H = 1 + floor(log2(p-1)) levels, α per message, β per byte, γ per byte reduced;
 * per round the busiest rank sends 2 slices in broadcast and reduce, 4 in all-reduce):
 *   broadcast    (H + k - 1)·(α + 2s·β)
 *   reduce       (H + k - 1)·(α + 2s·(β + γ))
 *   all-reduce  (2H + k - 1)·(α + 4s·β + 2s·γ)     -> 2H·α at 8 B, 2n·β + n·γ at large n
 *   barrier      2H·α
 * against the ring's 2(p-1)·α + 2(p-1)/p·n·β: the tree wins while n is small.
 *
 * Pure: builds steps, touches no memory but `steps`, never fails for valid arguments.
 */
#include <math.h>
#include <stdio.h>

#include "algo.h"
#include "tree.h"

/* Rounds of skew per tree level (see above).  1 already lets a round cost one hop. */
#define SKEW 1

static int ctz(unsigned v) {
  int h = 0;
  while (!(v & 1u)) v >>= 1, h++;
  return h;
}

static int floor_log2(int v) {
  int k = 0;
  while (v > 1) v >>= 1, k++;
  return k;
}

static int top_pos(int m) { return 1 << floor_log2(m); }

/* Parent position of v != top in the in-order tree cut at m. */
static int pos_parent(int v, int m) {
  int h = ctz((unsigned)v);
  for (;;) {
    int q = ((v >> (h + 1)) & 1) ? v - (1 << h) : v + (1 << h);
    if (q <= m) return q;
    v = q, h++;
  }
}

static void pos_children(int v, int m, int c[2]) {
  int h = ctz((unsigned)v);
  c[0] = c[1] = -1;
  if (h == 0) return;
  c[0] = v - (1 << (h - 1));
  for (int j = h - 1; j >= 0; j--)
    if (v + (1 << j) <= m) {
      c[1] = v + (1 << j);
      break;
    }
}

static int pos_of(int t, int label, int m) {
  if (t == 0) return label;
  return m % 2 == 0 ? m + 1 - label : label % m + 1;
}

static int label_of(int t, int pos, int m) {
  if (t == 0) return pos;
  return m % 2 == 0 ? m + 1 - pos : (pos == 1 ? m : pos - 1);
}

int coll_tree_height(int p) { return p < 2 ? 0 : 1 + floor_log2(p - 1); }

void coll_tree_node(int p, int root, int t, int rank, int *parent, int children[2], int *depth) {
  int m = p - 1, label = ((rank - root) % p + p) % p, top = top_pos(m);
  children[0] = children[1] = -1;
  if (label == 0) {
    *parent = -1;
    *depth = 0;
    children[0] = (label_of(t, top, m) + root) % p;
    return;
  }
  int pos = pos_of(t, label, m), c[2];
  *parent = pos == top ? root : (label_of(t, pos_parent(pos, m), m) + root) % p;
  *depth = 1;
  for (int v = pos; v != top; v = pos_parent(v, m)) (*depth)++;
  pos_children(pos, m, c);
  for (int i = 0; i < 2; i++)
    if (c[i] > 0) children[i] = (label_of(t, c[i], m) + root) % p;
}

static void add(coll_step *st, size_t *n, coll_step s) {
  if (s.count > 0) st[(*n)++] = s;
}

static coll_step mk(coll_step_kind kind, int in, int out, coll_buf sb, coll_buf db, size_t off,
                    size_t count, int chunk, int final, int delay) {
  return (coll_step){.kind = kind,
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
                     .delay = (uint32_t)delay};
}

typedef struct {
  int parent, ch[2], depth, nch;
  size_t off, len; /* this tree's half */
} node;

/* Up: own data (SEND buffer) combined with the children's partial results, sent on. */
static void up(const node *t, int ti, int delay, coll_step *st, size_t *n) {
  coll_step s;
  if (t->nch == 0)
    s = mk(COLL_STEP_SEND, -1, t->parent, COLL_BUF_SEND, COLL_BUF_RECV, t->off, t->len, ti, 0,
           delay);
  else if (t->nch == 1)
    s = mk(COLL_STEP_RECV_REDUCE_SEND, t->ch[0], t->parent, COLL_BUF_SEND, COLL_BUF_RECV, t->off,
           t->len, ti, 0, delay);
  else {
    s = mk(COLL_STEP_RECV2_REDUCE_SEND, t->ch[0], t->parent, COLL_BUF_SEND, COLL_BUF_RECV, t->off,
           t->len, ti, 0, delay);
    s.peer_in2 = t->ch[1];
  }
  add(st, n, s);
}

/* Down: the parent's data into the RECV buffer and on to the children. */
static void down(const node *t, int ti, int delay, coll_step *st, size_t *n) {
  if (t->nch == 0) {
    add(st, n,
        mk(COLL_STEP_RECV, t->parent, -1, COLL_BUF_RECV, COLL_BUF_RECV, t->off, t->len, ti, 0,
           delay));
    return;
  }
  add(st, n,
      mk(COLL_STEP_RECV_COPY_SEND, t->parent, t->ch[0], COLL_BUF_RECV, COLL_BUF_RECV, t->off,
         t->len, ti, 0, delay));
  if (t->nch == 2) /* same round, next in order: reads what the step above just wrote */
    add(st, n,
        mk(COLL_STEP_SEND, -1, t->ch[1], COLL_BUF_RECV, COLL_BUF_RECV, t->off, t->len, ti, 0,
           delay));
}

coll_result coll_tree_plan(const coll_plan_args *a, coll_step *st, size_t *n) {
  int p = a->nranks, r = a->rank;
  int root = (a->coll == COLL_COLL_BROADCAST || a->coll == COLL_COLL_REDUCE) ? a->root : 0;
  size_t count = a->coll == COLL_COLL_BARRIER ? 1 : a->count;
  *n = 0;
  if (p < 2 || (a->coll != COLL_COLL_BROADCAST && a->coll != COLL_COLL_REDUCE &&
                a->coll != COLL_COLL_ALL_REDUCE && a->coll != COLL_COLL_BARRIER))
    return COLL_ERR_INVALID_ARG;
  int H = coll_tree_height(p);
  node t[2];
  for (int i = 0; i < 2; i++) {
    coll_tree_node(p, root, i, r, &t[i].parent, t[i].ch, &t[i].depth);
    t[i].nch = (t[i].ch[0] >= 0) + (t[i].ch[1] >= 0);
  }
  t[0].off = 0, t[0].len = (count + 1) / 2;
  t[1].off = t[0].len, t[1].len = count - t[0].len;
  bool is_root = r == root;

  switch (a->coll) {
  case COLL_COLL_BROADCAST:
    if (is_root) {
      if (!a->in_place)
        add(st, n, mk(COLL_STEP_COPY, -1, -1, COLL_BUF_SEND, COLL_BUF_RECV, 0, count, -1, 0, 0));
      for (int i = 0; i < 2; i++)
        add(st, n,
            mk(COLL_STEP_SEND, -1, t[i].ch[0], COLL_BUF_SEND, COLL_BUF_RECV, t[i].off, t[i].len, i,
               0, 0));
    } else {
      for (int i = 0; i < 2; i++) down(&t[i], i, SKEW * t[i].depth, st, n);
    }
    break;
  case COLL_COLL_REDUCE:
    for (int i = 0; i < 2; i++) {
      if (is_root)
        add(st, n,
            mk(COLL_STEP_RECV_REDUCE_COPY, t[i].ch[0], -1, COLL_BUF_SEND, COLL_BUF_RECV, t[i].off,
               t[i].len, i, 1, SKEW * H));
      else
        up(&t[i], i, SKEW * (H - t[i].depth), st, n);
    }
    break;
  default: /* all-reduce, barrier */
    if (is_root) {
      for (int i = 0; i < 2; i++)
        add(st, n,
            mk(COLL_STEP_RECV_REDUCE_COPY_SEND, t[i].ch[0], t[i].ch[0], COLL_BUF_SEND,
               COLL_BUF_RECV, t[i].off, t[i].len, i, 1, SKEW * H));
    } else {
      for (int i = 0; i < 2; i++) up(&t[i], i, SKEW * (H - t[i].depth), st, n);
      for (int i = 0; i < 2; i++) down(&t[i], i, SKEW * (H + t[i].depth), st, n);
    }
    break;
  }
  return COLL_OK;
}

coll_result coll_tree_cost(coll_coll_kind coll, double n, const coll_cost_model *m, double *seconds,
                           char *formula, size_t formula_len) {
  int p = m->p;
  double slice = m->slice, alpha = m->alpha, beta = m->beta, gamma = m->gamma;
  double A = alpha * 1e6, B = beta * 1e9, G = gamma * 1e9; /* us, ns/B, ns/B */
  if (p < 1 || n < 0 || slice <= 0) return COLL_ERR_INVALID_ARG;
  if (p == 1) {
    *seconds = 0;
    snprintf(formula, formula_len, "one rank: a local copy, no messages");
    return COLL_OK;
  }
  int H = coll_tree_height(p);
  double half = n / 2, k = half > slice ? ceil(half / slice) : 1, s = half / k;
  double rounds, per_b, per_g; /* per round: bytes sent, bytes reduced */
  const char *shape;
  switch (coll) {
  case COLL_COLL_BROADCAST:
    rounds = H + k - 1, per_b = 2 * s, per_g = 0;
    shape = "(H+k-1)*(a + 2s*b)";
    break;
  case COLL_COLL_REDUCE:
    rounds = H + k - 1, per_b = 2 * s, per_g = 2 * s;
    shape = "(H+k-1)*(a + 2s*(b+g))";
    break;
  case COLL_COLL_ALL_REDUCE:
    rounds = 2 * H + k - 1, per_b = 4 * s, per_g = 2 * s;
    shape = "(2H+k-1)*(a + 4s*b + 2s*g)";
    break;
  case COLL_COLL_BARRIER:
    rounds = 2 * H, per_b = 0, per_g = 0, k = 1, s = 0;
    shape = "2H*a";
    break;
  default: return COLL_ERR_INVALID_ARG;
  }
  *seconds = rounds * (alpha + per_b * beta + per_g * gamma);
  snprintf(formula, formula_len,
           "%s with p=%d, H=%d, n=%.0f B, k=%.0f slices of s=%.0f B: %.0f*(%.3f us + %.0f B*%.4f "
           "ns/B + %.0f B*%.4f ns/B) = %.2f us",
           shape, p, H, n, k, s, rounds, A, per_b, B, per_g, G, *seconds * 1e6);
  return COLL_OK;
}
