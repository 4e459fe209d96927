/*
 * schedule.h — a pipeline schedule as data: for P stages (ranks of the pipeline group),
 * M micro-batches and V model chunks per stage, the ordered list of actions each stage
 * takes in one optimizer step — compute (F, B, W) and the point-to-point transfers of
 * activations and their gradients — computed up front by a pure function, checked
 * without processes (every send meets its receive, no cycle of waits, every backward
 * after its forward, the activations in flight as stated), drawn as the classic picture
 * and priced (the idle fraction). pipeline.c interprets the same lists, so what is
 * checked and drawn is what runs. Nothing here allocates a model, talks to a peer or
 * prints: the picture is written into a buffer.
 *
 * Virtual stages. The model's L blocks are cut into P*V consecutive pieces; virtual stage
 * u = c*P + s (chunk c = 0..V-1 of stage s) holds piece u: stage s holds pieces s, s+P,
 * ..., as Megatron's interleaved schedule places them. Virtual stage 0 also holds the
 * embeddings and virtual stage P*V-1 the final LayerNorm and the (tied) head. V = 1 for
 * every schedule but interleaved.
 *
 * Schedules (kind):
 *   GPIPE        all M forwards, then all M backwards (GPipe's fill and drain);
 *   1F1B         P-1-s warm-up forwards on stage s, then one forward / one backward
 *                alternating, then the cool-down backwards (PipeDream-flush / Megatron);
 *   INTERLEAVED  1F1B over V chunks per stage (Megatron's interleaved schedule; needs
 *                M a multiple of P);
 *   ZB           ZB-H1 (Qi et al., zero bubble): backward split into B (the input
 *                gradient, on the critical path) and W (the weight gradient), W
 *                deferred into the cool-down bubble, the activations in flight no
 *                more than 1F1B's.
 * GPipe, 1F1B and ZB need M >= 1 (1F1B's warm-up is min(P-1-s, M)); interleaved needs
 * P >= 2, M >= P and M % P == 0 (train_pp_check says so in one sentence). The lists'
 * idle fraction equals the formula below for GPipe and 1F1B, for ZB when M >= P, and for
 * interleaved at P = 3, 4, 6 or M = P; elsewhere interleaved's is larger (schedule.c).
 *
 * Transfers. A SEND_ACT of (micro, chunk) carries the output of that virtual stage's
 * forward to the next virtual stage (its RECV_ACT of the same micro and the receiving
 * stage's chunk); SEND_GRAD carries the gradient of a virtual stage's input back to the
 * previous one. Transfers are posted in groups: consecutive transfer actions with the
 * same `group` number, all with one peer, which the executor posts together (libcoll's
 * coll_group_start/end, MPI's Isend/Irecv and Waitall). A group has a mirror on its peer:
 * the peer's group holding the partners of its transfers holds nothing else — the pairs
 * Megatron posts (send_forward_recv_backward on one stage, send_backward_recv_forward on
 * the next). The checker holds the lists to the strictest semantics any of those has: a
 * group completes only when its mirror is posted, all of it at once (libcoll's grouped
 * calls run a group's slices in lock-step rounds, and COLL_CHECK compares the two ends'
 * traffic group by group), and a send only when its receive is posted. So a schedule
 * that passes cannot deadlock on any transport, with or without COLL_CHECK.
 *
 * Idle fraction (the bubble). With unit costs per chunk — F = 1 and B = 2 (the whole
 * backward) for GPipe, 1F1B and interleaved; F = B = W = 1 for ZB — and zero transfer
 * time, the stages' lists are simulated; a stage's idle time is the makespan
 * less its busy time, and the fraction is idle / busy (the pipeline papers' t_bubble /
 * t_ideal): (P-1)/M for GPipe and 1F1B, (P-1)/(V*M) interleaved, (P-1)/(3M) for ZB-H1.
 */
#ifndef TRAIN_PARALLEL_SCHEDULE_H
#define TRAIN_PARALLEL_SCHEDULE_H

#include "train.h"

#include <stddef.h>

typedef enum {
  TRAIN_PP_GPIPE = 0,
  TRAIN_PP_1F1B,
  TRAIN_PP_INTERLEAVED,
  TRAIN_PP_ZB,
  TRAIN_PP_KINDS
} train_pp_kind;

typedef enum {
  TRAIN_PP_F = 0,     /* forward of (micro, chunk) */
  TRAIN_PP_B,         /* backward: the whole backward, or (ZB) the input gradient only */
  TRAIN_PP_W,         /* ZB only: the weight gradient of (micro, chunk) */
  TRAIN_PP_SEND_ACT,  /* to the stage holding virtual stage u+1 */
  TRAIN_PP_RECV_ACT,  /* from the stage holding virtual stage u-1 */
  TRAIN_PP_SEND_GRAD, /* to the stage holding virtual stage u-1 */
  TRAIN_PP_RECV_GRAD, /* from the stage holding virtual stage u+1 */
  TRAIN_PP_ACTIONS
} train_pp_op;

typedef struct train_pp_action {
  train_pp_op op;
  int micro; /* 0..M-1 */
  int chunk; /* 0..V-1, this stage's chunk the action belongs to */
  int peer;  /* transfers: the other stage (0..P-1); -1 for compute */
  int group; /* transfers: the group it is posted in (numbered along the list); -1 compute */
} train_pp_action;

typedef struct train_pp_schedule {
  train_pp_kind kind;
  int P, M, V;
  int *n;                 /* n[s]: actions of stage s */
  train_pp_action **acts; /* acts[s][0..n[s]) */
  int *inflight;          /* inflight[s]: most micro-batch chunks whose activations stage s
                           * holds at once (F done, last backward action not yet) */
} train_pp_schedule;

/* "gpipe", "1f1b", "interleaved", "zb" -> kind; -1 when none. */
TRAIN_API int train_pp_kind_parse(const char *name);
TRAIN_API const char *train_pp_kind_name(train_pp_kind kind);

/* 0, or -1 with one sentence when (kind, P, M, V) is not a schedule this trainer runs
 * (P < 1, M < 1, V != 1 outside interleaved, V < 2, P < 2 or M not a multiple of P for
 * it). */
TRAIN_API int train_pp_check(train_pp_kind kind, int P, int M, int V, char *err);

/* Builds the lists (train_pp_check first); 0, or -1 with err (also out of memory). */
TRAIN_API int train_pp_build(train_pp_kind kind, int P, int M, int V, train_pp_schedule *out,
                             char *err);
TRAIN_API void train_pp_free(train_pp_schedule *s);

/* The checker: 0 when every transfer meets its partner (same micro, adjacent virtual
 * stages, opposite direction, inside groups as the executor posts them), the lists run to
 * their ends under rendezvous semantics with no cycle of waits, every (micro, virtual
 * stage) has exactly one F, one B (and one W for ZB) with B after F and W after B, B of
 * virtual stage u after B of u+1 (its gradient arrived), F of u after F of u-1, and
 * inflight[] equals the count the lists imply; else -1 with the first violation as a
 * sentence (stage, action index, what was expected). */
TRAIN_API int train_pp_verify(const train_pp_schedule *s, char *err);

/* The unit-cost simulation above: *idle_frac (idle / busy, the largest over stages) and,
 * when slots is not NULL, the time slot each action starts in (slots[s][i], -1 for
 * transfers) — arrays owned by the caller, shaped like acts. 0, or -1 with err. */
TRAIN_API int train_pp_simulate(const train_pp_schedule *s, double *idle_frac, int **slots,
                                char *err);
/* The formula's idle fraction for (kind, P, M, V): (P-1)/M, (P-1)/(V*M), (P-1)/(3M). */
TRAIN_API double train_pp_formula(train_pp_kind kind, int P, int M, int V);

/* The classic picture into out (n bytes): one row per stage, one cell per time slot of
 * the simulation showing the action (F/B/W), its micro-batch and, when V > 1, its chunk;
 * idle slots drawn as dots; then the idle fraction computed from the lists beside the
 * formula's. Lines end in '\n'; truncated, never overflowed, when n is short. */
TRAIN_API void train_pp_draw(const train_pp_schedule *s, char *out, size_t n);

#endif
