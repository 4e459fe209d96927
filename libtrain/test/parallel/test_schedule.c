/*
 * test_schedule.c — pipeline schedules as data (parallel/schedule.c), without processes.
 *
 *  - every kind builds and verifies for P = 1..8, M = 1..16 (interleaved: V = 2..4, M a
 *    multiple of P, P >= 2), and its simulation gives the formula's idle fraction exactly
 *    for GPipe and 1F1B always, ZB-H1 when M >= P (with fewer micro-batches the W's cannot
 *    fill the cool-down), interleaved where exact() says (not yet at P = 2, 5, 8, M > P);
 *  - the numbers at P = 4, M = 8, V = 2: 3/8 (GPipe, 1F1B), 3/16 (interleaved), 1/8 (ZB);
 *  - activations in flight: GPipe M on every stage, 1F1B min(P-s, M), interleaved
 *    min(2(P-1-s) + (V-1)P + 1, VM) (Megatron's warm-up plus the steady state's one),
 *    ZB-H1 min(P, M) on every stage (activations kept until W, bounded by 1F1B's stage-0
 *    peak P by construction);
 *  - 1F1B's steady state posts send_act with recv_grad in one group (Megatron's
 *    send_forward_recv_backward), the first stage has no recv_act, the last no send_act
 *    and no recv_grad;
 *  - the checker catches broken lists: a send and a receive swapped into a deadlock, a
 *    dropped receive, a B before its F, a wrong peer, a wrong inflight — each a sentence
 *    naming the stage;
 *  - train_pp_check's refusals, each one sentence; the picture for P = 2, M = 2 GPipe.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/schedule.h"
#include "train.h"

static void build_ok(train_pp_kind k, int P, int M, int V, train_pp_schedule *s) {
  char err[TRAIN_ERRLEN] = "";
  cr_assert_eq(train_pp_build(k, P, M, V, s, err), 0, "%s P=%d M=%d V=%d: %s",
               train_pp_kind_name(k), P, M, V, err);
}

static double idle_of(const train_pp_schedule *s) {
  char err[TRAIN_ERRLEN] = "";
  double f = -1;
  cr_assert_eq(train_pp_simulate(s, &f, NULL, err), 0, "%s", err);
  return f;
}

/* Where the lists' idle fraction equals the formula. ZB-H1 needs M >= P. Interleaved, as
 * built, is exact for P = 3, 4, 6 and for M = P; at P = 2, 5, 8 with M > P a producer
 * can end in the middle of its consumer stage's 2-unit backward, a rendezvous then costs
 * one side a unit, and the fraction exceeds the formula (see schedule.c's top: open); at
 * P = 7 the mirrored groups (one peer each, the lower peer first) cost a little more. */
static int exact(train_pp_kind k, int P, int M) {
  if (k == TRAIN_PP_ZB) return M >= P;
  if (k == TRAIN_PP_INTERLEAVED) return M == P || P == 3 || P == 4 || P == 6;
  return 1;
}

static void one(train_pp_kind k, int P, int M, int V) {
  train_pp_schedule s;
  char err[TRAIN_ERRLEN] = "";
  build_ok(k, P, M, V, &s);
  cr_assert_eq(train_pp_verify(&s, err), 0, "%s P=%d M=%d V=%d: %s", train_pp_kind_name(k), P, M, V,
               err);
  double f = idle_of(&s), want = train_pp_formula(k, P, M, V);
  if (exact(k, P, M))
    cr_assert(f == want, "%s P=%d M=%d V=%d: idle %.17g, formula %.17g", train_pp_kind_name(k), P,
              M, V, f, want);
  for (int st = 0; st < P; st++) {
    int want_in = 0;
    switch (k) {
    case TRAIN_PP_GPIPE: want_in = M; break;
    case TRAIN_PP_1F1B: want_in = P - st < M ? P - st : M; break;
    case TRAIN_PP_INTERLEAVED: {
      int w = 2 * (P - 1 - st) + (V - 1) * P + 1;
      want_in = w < V * M ? w : V * M;
      break;
    }
    default: want_in = P < M ? P : M;
    }
    cr_assert_eq(s.inflight[st], want_in, "%s P=%d M=%d V=%d stage %d: inflight %d, expected %d",
                 train_pp_kind_name(k), P, M, V, st, s.inflight[st], want_in);
  }
  train_pp_free(&s);
}

Test(schedule, every_kind_builds_and_verifies) {
  for (int P = 1; P <= 8; P++)
    for (int M = 1; M <= 16; M++) {
      one(TRAIN_PP_GPIPE, P, M, 1);
      one(TRAIN_PP_1F1B, P, M, 1);
      one(TRAIN_PP_ZB, P, M, 1);
      if (P >= 2 && M % P == 0)
        for (int V = 2; V <= 4; V++) one(TRAIN_PP_INTERLEAVED, P, M, V);
    }
}

Test(schedule, exact_idle_fractions_p4_m8) {
  static const struct {
    train_pp_kind k;
    int V;
    double want;
  } rows[] = {{TRAIN_PP_GPIPE, 1, 3.0 / 8},
              {TRAIN_PP_1F1B, 1, 3.0 / 8},
              {TRAIN_PP_INTERLEAVED, 2, 3.0 / 16},
              {TRAIN_PP_ZB, 1, 1.0 / 8}};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    train_pp_schedule s;
    build_ok(rows[i].k, 4, 8, rows[i].V, &s);
    double f = idle_of(&s);
    cr_assert(f == rows[i].want, "%s: %.17g", train_pp_kind_name(rows[i].k), f);
    cr_assert(f == train_pp_formula(rows[i].k, 4, 8, rows[i].V));
    train_pp_free(&s);
  }
  /* A few more shapes beyond the sweep's. */
  train_pp_schedule s;
  build_ok(TRAIN_PP_INTERLEAVED, 4, 16, 4, &s);
  cr_assert(idle_of(&s) == 3.0 / 64);
  train_pp_free(&s);
  build_ok(TRAIN_PP_INTERLEAVED, 6, 12, 3, &s);
  cr_assert(idle_of(&s) == 5.0 / 36);
  train_pp_free(&s);
  build_ok(TRAIN_PP_ZB, 8, 64, 1, &s);
  cr_assert(idle_of(&s) == 7.0 / 192);
  train_pp_free(&s);
  build_ok(TRAIN_PP_1F1B, 16, 3, 1, &s);
  cr_assert(idle_of(&s) == 5.0);
  train_pp_free(&s);
}

Test(schedule, inflight_p4_m8) {
  static const int want[4][4] = {{8, 8, 8, 8}, {4, 3, 2, 1}, {11, 9, 7, 5}, {4, 4, 4, 4}};
  static const int V[4] = {1, 1, 2, 1};
  for (int k = 0; k < TRAIN_PP_KINDS; k++) {
    train_pp_schedule s;
    build_ok(k, 4, 8, V[k], &s);
    for (int st = 0; st < 4; st++)
      cr_assert_eq(s.inflight[st], want[k][st], "%s stage %d: %d", train_pp_kind_name(k), st,
                   s.inflight[st]);
    train_pp_free(&s);
  }
}

/* The index of the first action of stage st matching (op, micro, chunk); -1 if none. */
static int find(const train_pp_schedule *s, int st, train_pp_op op, int micro, int chunk) {
  for (int i = 0; i < s->n[st]; i++)
    if (s->acts[st][i].op == op && s->acts[st][i].micro == micro && s->acts[st][i].chunk == chunk)
      return i;
  return -1;
}

static int is_xfer(train_pp_op op) { return op >= TRAIN_PP_SEND_ACT; }

Test(schedule, one_f_one_b_groups_as_megatron) {
  train_pp_schedule s;
  build_ok(TRAIN_PP_1F1B, 4, 8, 1, &s);
  for (int i = 0; i < s.n[0]; i++) {
    cr_assert_neq(s.acts[0][i].op, TRAIN_PP_RECV_ACT);
    cr_assert_neq(s.acts[0][i].op, TRAIN_PP_SEND_GRAD);
  }
  for (int i = 0; i < s.n[3]; i++) {
    cr_assert_neq(s.acts[3][i].op, TRAIN_PP_SEND_ACT);
    cr_assert_neq(s.acts[3][i].op, TRAIN_PP_RECV_GRAD);
  }
  /* Stage 1 (warm-up 2) in its steady state: F(3) then {send_act(3), recv_grad(1)} then
   * B(1), then {send_grad(1), recv_act(4)} before F(4). */
  int f3 = find(&s, 1, TRAIN_PP_F, 3, 0), b1 = find(&s, 1, TRAIN_PP_B, 1, 0);
  int sa = find(&s, 1, TRAIN_PP_SEND_ACT, 3, 0), rg = find(&s, 1, TRAIN_PP_RECV_GRAD, 1, 0);
  cr_assert(f3 >= 0 && b1 == f3 + 3 && f3 < sa && sa < b1 && f3 < rg && rg < b1);
  int sg = find(&s, 1, TRAIN_PP_SEND_GRAD, 1, 0), ra = find(&s, 1, TRAIN_PP_RECV_ACT, 4, 0);
  int f4 = find(&s, 1, TRAIN_PP_F, 4, 0);
  cr_assert(f4 == b1 + 3 && b1 < sg && sg < f4 && b1 < ra && ra < f4);
  for (int i = f3 + 1; i < f4; i++) cr_assert(i == b1 || is_xfer(s.acts[1][i].op));
  cr_assert_eq(s.acts[1][sa].peer, 2);
  cr_assert_eq(s.acts[1][sg].peer, 0);
  train_pp_free(&s);
}

/* Verify must fail with a sentence that names `stage`. */
static void fails_naming(const train_pp_schedule *s, int stage, const char *what) {
  char err[TRAIN_ERRLEN] = "", name[32];
  cr_assert_eq(train_pp_verify(s, err), -1, "%s: verify passed", what);
  snprintf(name, sizeof name, "stage %d", stage);
  cr_assert(strstr(err, name) != NULL, "%s: '%s' does not name %s", what, err, name);
  cr_assert(strchr(err, '\n') == NULL, "%s: '%s' is not one line", what, err);
  double f;
  cr_assert_eq(train_pp_simulate(s, &f, NULL, err), -1, "%s: simulate ran broken lists", what);
}

Test(schedule, checker_catches_a_deadlock) {
  /* 1F1B P = 4: on stage 2 move recv_grad(0) from its group after F(1) to the very front,
   * before F(0) and its send_act(0): stage 2 then waits for a gradient that stage 3 can
   * only make from the activation stage 2 has not sent — a cycle of waits. */
  train_pp_schedule s;
  build_ok(TRAIN_PP_1F1B, 4, 8, 1, &s);
  int f = find(&s, 2, TRAIN_PP_F, 0, 0), rg = find(&s, 2, TRAIN_PP_RECV_GRAD, 0, 0);
  cr_assert(f >= 0 && rg > f);
  train_pp_action *a = s.acts[2], keep = a[rg];
  memmove(&a[f + 1], &a[f], (size_t)(rg - f) * sizeof *a);
  a[f] = keep;
  char err[TRAIN_ERRLEN] = "";
  cr_assert_eq(train_pp_verify(&s, err), -1);
  cr_assert(strstr(err, "deadlock") != NULL, "%s", err);
  fails_naming(&s, 0, "deadlock"); /* the first stage held, here by the cycle behind it */
  train_pp_free(&s);
}

Test(schedule, checker_catches_a_dropped_receive) {
  train_pp_schedule s;
  build_ok(TRAIN_PP_1F1B, 4, 8, 1, &s);
  int i = find(&s, 2, TRAIN_PP_RECV_ACT, 5, 0);
  cr_assert(i >= 0);
  memmove(&s.acts[2][i], &s.acts[2][i + 1], (size_t)(s.n[2] - i - 1) * sizeof *s.acts[2]);
  s.n[2]--;
  fails_naming(&s, 1, "dropped recv_act"); /* stage 1's send_act(5) meets the wrong receive */
  train_pp_free(&s);
}

Test(schedule, checker_catches_b_before_f) {
  train_pp_schedule s;
  build_ok(TRAIN_PP_GPIPE, 3, 4, 1, &s);
  /* Stage 2 (the last, no gradient to wait for): swap F(0) and B(0). */
  int f = find(&s, 2, TRAIN_PP_F, 0, 0), b = find(&s, 2, TRAIN_PP_B, 0, 0);
  train_pp_action t = s.acts[2][f];
  s.acts[2][f] = s.acts[2][b];
  s.acts[2][b] = t;
  char err[TRAIN_ERRLEN] = "";
  cr_assert_eq(train_pp_verify(&s, err), -1);
  cr_assert(strstr(err, "stage 2") && strstr(err, "before its F"), "%s", err);
  train_pp_free(&s);
}

Test(schedule, checker_catches_a_wrong_peer) {
  train_pp_schedule s;
  build_ok(TRAIN_PP_1F1B, 4, 8, 1, &s);
  int i = find(&s, 1, TRAIN_PP_SEND_ACT, 2, 0);
  s.acts[1][i].peer = 3;
  char err[TRAIN_ERRLEN] = "";
  cr_assert_eq(train_pp_verify(&s, err), -1);
  cr_assert(strstr(err, "stage 1") && strstr(err, "expected stage 2"), "%s", err);
  train_pp_free(&s);
  /* The interleaved wrap: stage P-1's chunk 0 sends to stage 0's chunk 1. */
  build_ok(TRAIN_PP_INTERLEAVED, 2, 4, 2, &s);
  i = find(&s, 1, TRAIN_PP_SEND_ACT, 0, 0);
  cr_assert(i >= 0 && s.acts[1][i].peer == 0);
  s.acts[1][i].chunk = 1; /* the last virtual stage has no next */
  cr_assert_eq(train_pp_verify(&s, err), -1);
  cr_assert(strstr(err, "stage 1") && strstr(err, "no next"), "%s", err);
  train_pp_free(&s);
}

Test(schedule, checker_catches_wrong_micro_and_inflight) {
  train_pp_schedule s;
  build_ok(TRAIN_PP_ZB, 3, 6, 1, &s);
  int i = find(&s, 0, TRAIN_PP_SEND_ACT, 1, 0);
  s.acts[0][i].micro = 2; /* a second send of act 2, none of act 1 */
  fails_naming(&s, 0, "wrong micro");
  s.acts[0][i].micro = 1;
  char err[TRAIN_ERRLEN] = "";
  cr_assert_eq(train_pp_verify(&s, err), 0, "%s", err);
  s.inflight[1]++;
  cr_assert_eq(train_pp_verify(&s, err), -1);
  cr_assert(strstr(err, "stage 1") && strstr(err, "inflight"), "%s", err);
  train_pp_free(&s);
  /* A W in a schedule without W, and a missing W in ZB. */
  build_ok(TRAIN_PP_ZB, 2, 2, 1, &s);
  i = find(&s, 1, TRAIN_PP_W, 1, 0);
  s.n[1] = i; /* drop the last W (and anything after) */
  fails_naming(&s, 1, "missing W");
  train_pp_free(&s);
}

Test(schedule, check_refusals) {
  static const struct {
    train_pp_kind k;
    int P, M, V;
    const char *says;
  } rows[] = {{TRAIN_PP_INTERLEAVED, 4, 2, 2, "multiple of P"},
              {TRAIN_PP_INTERLEAVED, 4, 6, 2, "multiple of P"},
              {TRAIN_PP_INTERLEAVED, 4, 8, 1, "V >= 2"},
              {TRAIN_PP_INTERLEAVED, 1, 4, 2, "P >= 2"},
              {TRAIN_PP_1F1B, 4, 8, 2, "V = 1"},
              {TRAIN_PP_GPIPE, 4, 8, 3, "V = 1"},
              {TRAIN_PP_ZB, 4, 8, 2, "V = 1"},
              {TRAIN_PP_GPIPE, 0, 8, 1, "at least 1 stage"},
              {TRAIN_PP_1F1B, -1, 8, 1, "at least 1 stage"},
              {TRAIN_PP_ZB, 2, 0, 1, "at least 1 micro-batch"}};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    char err[TRAIN_ERRLEN] = "";
    cr_assert_eq(train_pp_check(rows[i].k, rows[i].P, rows[i].M, rows[i].V, err), -1);
    cr_assert(strstr(err, rows[i].says) != NULL, "row %zu: '%s'", i, err);
    cr_assert(strchr(err, '\n') == NULL && err[0] != '\0');
    train_pp_schedule s;
    cr_assert_eq(train_pp_build(rows[i].k, rows[i].P, rows[i].M, rows[i].V, &s, err), -1);
    cr_assert_null(s.acts);
  }
  char err[TRAIN_ERRLEN] = "";
  cr_assert_eq(train_pp_check(TRAIN_PP_INTERLEAVED, 4, 8, 2, err), 0, "%s", err);
}

Test(schedule, kind_names) {
  for (int k = 0; k < TRAIN_PP_KINDS; k++)
    cr_assert_eq(train_pp_kind_parse(train_pp_kind_name(k)), k);
  cr_assert_eq(train_pp_kind_parse("pipedream"), -1);
  cr_assert_eq(train_pp_kind_parse(NULL), -1);
  cr_assert_str_eq(train_pp_kind_name(TRAIN_PP_ZB), "zb");
}

Test(schedule, draw_gpipe_p2_m2) {
  train_pp_schedule s;
  build_ok(TRAIN_PP_GPIPE, 2, 2, 1, &s);
  char out[1024];
  train_pp_draw(&s, out, sizeof out);
  cr_assert_str_eq(out, "0 | F0 F1 .. .. .. B0 B0 B1 B1\n"
                        "1 | .. F0 F1 B0 B0 B1 B1 .. ..\n"
                        "idle fraction 0.5 (from the lists) = formula 0.5\n");
  /* Cut short: never past n, always terminated. */
  char small[20];
  memset(small, 'x', sizeof small);
  train_pp_draw(&s, small, 12);
  cr_assert_eq(strlen(small), 11);
  cr_assert_eq(small[12], 'x');
  train_pp_free(&s);
}

Test(schedule, slots_of_the_simulation) {
  train_pp_schedule s;
  build_ok(TRAIN_PP_1F1B, 2, 2, 1, &s);
  int *slots[2];
  for (int st = 0; st < 2; st++) slots[st] = calloc((size_t)s.n[st], sizeof **slots);
  double f;
  char err[TRAIN_ERRLEN] = "";
  cr_assert_eq(train_pp_simulate(&s, &f, slots, err), 0, "%s", err);
  /* Stage 1: F0 at 1, B0 at 2..3, F1 at 4, B1 at 5..6; transfers -1. */
  cr_assert_eq(slots[1][find(&s, 1, TRAIN_PP_F, 0, 0)], 1);
  cr_assert_eq(slots[1][find(&s, 1, TRAIN_PP_B, 0, 0)], 2);
  cr_assert_eq(slots[1][find(&s, 1, TRAIN_PP_F, 1, 0)], 4);
  cr_assert_eq(slots[1][find(&s, 1, TRAIN_PP_RECV_ACT, 1, 0)], -1);
  cr_assert(f == 0.5);
  for (int st = 0; st < 2; st++) free(slots[st]);
  train_pp_free(&s);
}
