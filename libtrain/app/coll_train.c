/*
 * main.c — coll-train: trains the GPT-2-style model of libtrain on one process, or
 * data-parallel (--parallel ddp) on N ranks over libcoll, Open MPI or (GPU) NCCL.
 *
 * With --tp T the N ranks form a T x D grid (tp.h): tensor-parallel groups of T
 * consecutive ranks, each a sub-communicator split from the job's, and data-parallel
 * groups across them on which --parallel ddp or fsdp runs; its checkpoints are sharded by
 * TP rank (train_tp_save). With --pp P they form T x P x D (pipeline.h), and each stage's
 * data-parallel rank 0 writes that stage's units of each TP slice (train_stage_save); any
 * checkpoint resumes at any grid that can hold it, with the same global batch.
 * With no arguments it trains the default small model on the embedded corpus on the CPU.
 * With --parallel ddp it forks --ranks local ranks (libcoll), re-runs itself under
 * mpirun.openmpi (--backend mpi), or joins the job a launcher describes in the
 * environment (torchrun, mpirun, Slurm: then --ranks may be left out); rank 0 prints.
 * Every problem with the input (flags, data file, checkpoint) is reported as one line on
 * stderr, the exit status is non-zero, and nothing is written: all validation happens
 * before the first file is created, and every file is written atomically.
 */
#include "model/moe.h"
#include "parallel/ep.h"
#include "parallel/pipeline.h"
#include "parallel/planner.h"
#include "parallel/strategy.h"
#include "parallel/tp.h"
#include "parallel/cp.h"
#include "train.h"

#include <coll_launch.h>

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f) {
  fprintf(f, "usage: coll-train [options]\n"
             "model:\n"
             "  --layers N        transformer blocks (4)\n"
             "  --channels N      embedding width, divisible by --heads (128)\n"
             "  --heads N         attention heads (4)\n"
             "  --max-seq N       rows of the position table (256)\n"
             "  --vocab N         vocabulary size; 256 = bytes (256)\n"
             "training:\n"
             "  --seq N           tokens per sequence, <= --max-seq (64)\n"
             "  --batch N         sequences per step (16)\n"
             "  --steps N         optimizer steps (400)\n"
             "  --lr X            peak learning rate (3e-3)\n"
             "  --warmup N        linear warmup steps (20)\n"
             "  --min-lr-frac X   cosine floor as a fraction of --lr (0.1)\n"
             "  --weight-decay X  AdamW decoupled weight decay (0.1)\n"
             "  --clip X          clip the global gradient norm; 0 = off (1.0)\n"
             "  --seed N          init, data order and sampling seed (1337)\n"
             "  --device cpu|cuda (cpu)\n"
             "  --threads N       CPU threads; 0 = all available (0)\n"
             "data:\n"
             "  --data FILE       token file (COLLTOK1) or raw text; default: embedded corpus\n"
             "checkpoints:\n"
             "  --ckpt-dir DIR    where checkpoints go (created if missing)\n"
             "  --ckpt-every N    write one every N steps (0 = only at the end)\n"
             "  --resume FILE     continue from a checkpoint, bit-exactly\n"
             "  --stop-after N    stop after step N (the schedule still ends at --steps)\n"
             "evaluation and output:\n"
             "  --eval-every N    validation loss + a sample every N steps; 0 = off (100)\n"
             "  --eval-batches N  validation batches per evaluation (8)\n"
             "  --sample-len N    bytes generated per sample; 0 = none (120)\n"
             "  --prompt TEXT     start of the sample (a newline)\n"
             "  --plot FILE.svg   draw the loss curve at the end\n"
             "  --quiet           only evaluations and the summary\n"
             "data parallel:\n"
             "  --parallel none|ddp|fsdp  (none)\n"
             "  --zero 1|2|3      with fsdp: shard optimizer state (1), + gradients (2),\n"
             "                    + parameters (3) (3)\n"
             "  --ranks N         local ranks to start (1); under a launcher: its world size\n"
             "  --backend coll|mpi|nccl  libcoll, Open MPI via mpirun.openmpi, or NCCL (needs\n"
             "                    --device cuda; its id goes over libcoll's bootstrap) (coll)\n"
             "  --bucket-mb X     gradient bucket cap in MiB; the first is 1 MiB (25)\n"
             "  --no-overlap      all-reduce the buckets after backward, not during it\n"
             "  --accum K         micro-steps per optimizer step; only the last syncs (1)\n"
             "  --plan            print the memory/communication planner's table for this model,\n"
             "                    --batch and --ranks (none, DDP, ZeRO-1/2/3) and exit\n"
             "  --trace FILE.json timeline of compute and communication per rank (Perfetto)\n"
             "tensor parallel:\n"
             "  --tp T            split every block (heads, MLP rows) and the vocabulary over T\n"
             "                    ranks (Megatron layout); --ranks N = T x D, --parallel along D\n"
             "  --sp              with --tp: sequence parallelism (residual stream and\n"
             "                    LayerNorms sharded along batch*seq over the TP group)\n"
             "context parallel:\n"
             "  --cp C            split every sequence over C ranks (2C chunks, rank r holding\n"
             "                    chunks r and 2C-1-r); --ranks N = T x C x D with --parallel\n"
             "                    ddp or fsdp (and --tp T)\n"
             "  --cp-mode ring|ulysses  ring attention (K/V passed round the ring, merged by\n"
             "                    log-sum-exp) or Ulysses (all-to-all to heads and back) (ring)\n"
             "                    --explain with --cp prints the ring's steps and exits\n"
             "pipeline parallel:\n"
             "  --pp P            cut the blocks into P stages (embeddings on the first, the\n"
             "                    head on the last); --ranks N = T x P x D, TP innermost,\n"
             "                    pipeline outermost\n"
             "  --schedule gpipe|1f1b|interleaved|zb  the order of forwards and backwards\n"
             "                    (1f1b); zb = zero-bubble ZB-H1\n"
             "  --micro-batches M micro-batches of --batch rows per step (2P)\n"
             "  --chunks V        with interleaved: model chunks per stage (2)\n"
             "  --explain         print the schedule as the pipeline picture with its bubble\n"
             "                    and exit\n"
             "mixture of experts:\n"
             "  --experts E       every block's MLP becomes E expert MLPs (4C wide each) behind\n"
             "                    a learned router (softmax, top-k; gates not renormalised)\n"
             "  --topk K          experts per token, 1..E (1)\n"
             "  --capacity-factor C  pad each expert to ceil(C*tokens*K/E) rows per rank and\n"
             "                    drop the overflow (fixed all-to-all splits); default dropless\n"
             "  --aux-loss-coef X the load-balancing loss X*E*sum_i f_i*P_i over the global\n"
             "                    batch; 0 = off (0.01)\n"
             "  --ep X            spread the experts over X ranks (consecutive data-parallel\n"
             "                    ranks); the rest is DDP over all --ranks (default X)\n"
             "  --explain         with --experts: the all-to-alls of one block and their bytes\n"
             "memory:\n"
             "  --dtype fp32|bf16 bf16: bf16 weights, activations and gradients (and on the\n"
             "                    wire), fp32 master weights and AdamW state (fp32)\n"
             "  --recompute none|full|selective  activations kept for backward: all, each\n"
             "                    block's input only (the block's forward runs again), or all\n"
             "                    but the attention probabilities (recomputed from q, k, v)\n"
             "  --batch is per rank and micro-step: a step reads accum*ranks*batch sequences\n"
             "                    (pipeline: M*D*batch)\n");
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *msg) {
  fprintf(stderr, "coll-train: %s\n", msg);
  exit(1);
}

static long parse_int(const char *flag, const char *s, long lo, long hi) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  char msg[TRAIN_ERRLEN];
  if (errno || end == s || *end) {
    snprintf(msg, sizeof msg, "%s: '%s' is not an integer", flag, s);
    die(msg);
  }
  if (v < lo || v > hi) {
    snprintf(msg, sizeof msg, "%s: %ld is out of range %ld..%ld", flag, v, lo, hi);
    die(msg);
  }
  return v;
}

static float parse_float(const char *flag, const char *s, double lo, double hi) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  char msg[TRAIN_ERRLEN];
  if (errno || end == s || *end || !isfinite(v)) {
    snprintf(msg, sizeof msg, "%s: '%s' is not a number", flag, s);
    die(msg);
  }
  if (v < lo || v > hi) {
    snprintf(msg, sizeof msg, "%s: %g is out of range %g..%g", flag, v, lo, hi);
    die(msg);
  }
  return (float)v;
}

/* Directory part of path must exist and be writable (checked before training). */
static void check_writable_dir_of(const char *flag, const char *path) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash)
    strcpy(dir, ".");
  else if (slash == dir)
    dir[1] = '\0';
  else
    *slash = '\0';
  if (access(dir, W_OK) != 0) {
    char msg[TRAIN_ERRLEN];
    snprintf(msg, sizeof msg, "%s %s: directory %s is not writable: %s", flag, path, dir,
             strerror(errno));
    die(msg);
  }
}

static void print_escaped(const char *s, int n) {
  for (int i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\n')
      fputs("\n    ", stdout);
    else if (c >= 32 && c < 127)
      putchar(c);
    else
      printf("\\x%02x", c);
  }
  putchar('\n');
}

enum {
  O_LAYERS = 256,
  O_CHANNELS,
  O_HEADS,
  O_MAXSEQ,
  O_VOCAB,
  O_SEQ,
  O_BATCH,
  O_STEPS,
  O_LR,
  O_WARMUP,
  O_MINLR,
  O_WD,
  O_CLIP,
  O_SEED,
  O_DEVICE,
  O_THREADS,
  O_DATA,
  O_CKPTDIR,
  O_CKPTEVERY,
  O_RESUME,
  O_EVALEVERY,
  O_EVALBATCHES,
  O_SAMPLELEN,
  O_PROMPT,
  O_PLOT,
  O_QUIET,
  O_HELP,
  O_STOPAFTER,
  O_PARALLEL,
  O_RANKS,
  O_BACKEND,
  O_BUCKETMB,
  O_NOOVERLAP,
  O_ACCUM,
  O_TRACE,
  O_ZERO,
  O_PLAN,
  O_TP,
  O_SP,
  O_LOSSES,
  O_PP,
  O_SCHEDULE,
  O_MICRO,
  O_CHUNKS,
  O_EXPLAIN,
  O_RECOMPUTE,
  O_DTYPE,
  O_EXPERTS,
  O_TOPK,
  O_CAPACITY,
  O_AUXCOEF,
  O_EP,
  O_CP,
  O_CPMODE
};

/* Everything parsed from the command line. */
typedef struct cli {
  train_options o;
  const char *ckpt_dir, *resume, *plot, *prompt, *trace, *losses;
  long stop_after, ckpt_every, eval_every, eval_batches, sample_len;
  int quiet;
  int ddp, fsdp, zero, ranks, ranks_given, mpi, nccl, overlap, accum;
  int tp, sp;                      /* tensor-parallel size (1: none), sequence parallelism */
  int pp, schedule, micro, chunks; /* pipeline stages (1: none), schedule, M, V */
  int experts, ep;                 /* mixture of experts (0: dense), expert parallel size */
  int cp, cp_ulysses;              /* context-parallel size (1: none), Ulysses (else ring) */
  double bucket_mb;
  double fixed; /* resident bytes at start, before any model: the planner's fixed part */
  char **argv;
} cli;

/* A failure on one rank: say which, leave the group at once so the others fail fast
 * instead of waiting for their timeout, and exit. */
static void die_rank(train_backend *b, const char *msg) {
  if (!b) die(msg);
  fprintf(stderr, "coll-train: rank %d of %d: %s\n", b->rank, b->nranks, msg);
  fflush(stderr);
  b->abort(b);
  exit(1);
}

/* --plan: the table for every strategy. */
static int print_plan(const train_options *o, int N, int accum, int tp, int sp, double fixed) {
  char line[256], msg[TRAIN_ERRLEN];
  size_t np = 0;
  /* a configuration a run refuses gets no table, just the run's sentence (the planner
   * asks the model what a run asks: it once printed a table for --seq 1024 over the
   * default --max-seq 256) */
  train_plan_row first;
  if (train_plan_dt(&o->cfg, o->batch, o->seq, N, accum, (train_strategy)0, o->recompute, o->bf16,
                    fixed, &first, msg) != 0)
    die(msg);
  printf(
      "coll-train: plan for layers %d channels %d heads %d vocab %d max_seq %d, batch %d "
      "x seq %d per rank, %d rank%s, accum %d, %s%s; MiB per rank, sent = MiB per rank per "
      "step (ring); fixed = measured resident size of this process before any model (a run "
      "adds libcoll's communicator, measured after start-up: ~8 MiB at 4 ranks)\n",
      o->cfg.layers, o->cfg.channels, o->cfg.heads, o->cfg.vocab, o->cfg.max_seq, o->batch, o->seq,
      N, N > 1 ? "s" : "", accum,
      o->bf16
          ? "bf16 (2 + 2 + 12 bytes a parameter; the ZeRO rows as the ZeRO paper counts them: --parallel fsdp runs fp32 only)"
          : "fp32",
      o->recompute == TRAIN_RECOMPUTE_FULL        ? ", full recomputation"
      : o->recompute == TRAIN_RECOMPUTE_SELECTIVE ? ", selective recomputation"
                                                  : "");
  (void)np;
  train_plan_header(line, sizeof line);
  printf("%s\n", line);
  for (int st = 0; st < TRAIN_PLAN_COUNT; st++) {
    train_plan_row r;
    if (train_plan_dt(&o->cfg, o->batch, o->seq, N, accum, (train_strategy)st, o->recompute,
                      o->bf16, fixed, &r, msg) != 0)
      die(msg);
    train_plan_format(&r, line, sizeof line);
    printf("%s\n", line);
  }
  /* tensor parallel: T = --tp alone, and T x D = --ranks */
  for (int k = 0; tp > 1 && k < (N > tp && N % tp == 0 ? 5 : 1); k++) {
    train_plan_row r;
    long nb;
    double ab;
    int dp = k ? N / tp : 1, zero = k > 1 ? k - 1 : 0; /* TP, TPxDDP, TPxZ1..3 */
    if (train_tp_plan(&o->cfg, o->batch, o->seq, tp, dp, sp, zero, o->recompute, o->bf16, fixed, &r,
                      &nb, &ab, msg) != 0)
      die(msg);
    train_plan_format(&r, line, sizeof line);
    printf("%s   (T=%d x D=%d: %ld in-block all-reduces per step of B*T*C = %.0f "
           "bytes, %.2f MiB)\n",
           line, tp, dp, nb, ab, nb * ab / 1048576.0);
  }
  return 0;
}

/* --plan --cp: ring and Ulysses rows at C x D = N (D = 1 when N < C), beside the table
 * above (whose rows run the whole sequence on every rank). */
static int print_cp_plan(const train_options *o, int N, int C, int tp, double fixed) {
  char line[256], msg[TRAIN_ERRLEN];
  int D = N >= C * tp && N % (C * tp) == 0 ? N / (C * tp) : 1;
  printf("context parallel: --cp %d x D %d, seq %d cut into %d chunks of %d (each rank %d "
         "positions); acts include the ring's buffers or Ulysses' head-sharded q,k,v and "
         "probabilities; sent adds the attention traffic to DDP's over the %d ranks\n",
         C, D, o->seq, 2 * C, o->seq / (2 * C), o->seq / C, C * D);
  for (int u = 0; u < 2; u++) {
    train_plan_row r;
    double f, b;
    if (u && o->cfg.heads % (C * tp) != 0) continue; /* Ulysses: heads a multiple of C x T */
    if (train_cp_plan(&o->cfg, o->batch, o->seq, C, D, tp, 0, u, o->recompute, fixed, &r, msg) != 0)
      die(msg);
    train_cp_layer_bytes(&o->cfg, o->batch, o->seq, C, tp, u, &f, &b);
    train_plan_format(&r, line, sizeof line);
    printf("%s   (per layer per rank: %.1f KiB forward + %.1f KiB backward; attention "
           "matrix per head %s)\n",
           line, f / 1024.0, b / 1024.0,
           u ? "T x T kept for NH/C heads"
             : "(T/C) log-sum-exps kept, in the model's (T/C)^2 buffer; blocks recomputed");
  }
  return 0;
}

/* --explain --cp: the ring's steps (which rank's K/V block each rank holds at each step,
 * and how much of it the causal mask leaves), or Ulysses' all-to-alls. */
static int print_cp_explain(const train_options *o, int C, int tp, int ulysses) {
  int T = o->seq, Tc = T / (2 * C);
  double f, b;
  train_cp_layer_bytes(&o->cfg, o->batch, T, C, tp, ulysses, &f, &b);
  printf("context parallel --cp %d (%s), seq %d in %d chunks of %d: rank r holds chunks r and "
         "%d-r\n",
         C, ulysses ? "Ulysses" : "ring attention", T, 2 * C, Tc, 2 * C - 1);
  for (int r = 0; r < C; r++)
    printf("  rank %d: positions %d..%d and %d..%d\n", r, r * Tc, r * Tc + Tc - 1,
           (2 * C - 1 - r) * Tc, (2 * C - 1 - r) * Tc + Tc - 1);
  if (ulysses) {
    printf("per layer: all-to-all q,k,v (rank gets %d of %d heads for all %d positions), full "
           "causal attention, all-to-all out; backward: all-to-all dout, attention backward, "
           "all-to-all dq,dk,dv\n",
           o->cfg.heads / (C * tp), o->cfg.heads / tp, T);
  } else {
    printf("per layer forward: step s, rank r attends to rank (r-s) mod C's K/V while it sends "
           "that block to r+1 and receives the next from r-1; unmasked query-key pairs of "
           "each step (of %d x %d):\n",
           T / C, T / C);
    for (int s = 0; s < C; s++) {
      printf("  step %d:", s);
      for (int r = 0; r < C; r++) {
        int src = (r - s + C) % C;
        long n = 0;
        for (int t = 0; t < T / C; t++)
          for (int u = 0; u < T / C; u++)
            n += train_cp_pos(T, C, src, u) <= train_cp_pos(T, C, r, t);
        printf(" r%d<-kv%d %ld", r, src, n);
      }
      printf("\n");
    }
    printf("backward: the same steps, K/V sent again ahead of each block; each block's dK/dV "
           "partial sum one step behind, reaching its owner after %d steps\n",
           C);
  }
  printf("sent per rank per layer: %.1f KiB forward, %.1f KiB backward (batch %d, channels "
         "%d)\n",
         f / 1024.0, b / 1024.0, o->batch, o->cfg.channels);
  return 0;
}

/* --plan --pp: a row per stage of the run's grid (T x P x D = N). */
static int print_pp_plan(const train_options *o, int N, int tp, int sp, int P, int kind, int M,
                         int V, int zero1) {
  char line[256], msg[TRAIN_ERRLEN];
  int D = N / (tp * P);
  printf("pipeline %s: --pp %d x --tp %d x D %d, %d micro-batches of %d rows%s; acts = the "
         "stage's activation sets (micro-batches in flight) + backward scratch\n",
         train_pp_kind_name((train_pp_kind)kind), P, tp, D, M, o->batch,
         V > 1 ? ", chunks per stage" : "");
  for (int st = 0; st < P; st++) {
    train_plan_row r;
    if (train_pp_plan(&o->cfg, o->batch, o->seq, tp, sp, P, st, (train_pp_kind)kind, M, V, D, zero1,
                      o->recompute, o->bf16, 0, &r, msg) != 0)
      die(msg);
    train_plan_format(&r, line, sizeof line);
    int sets = train_pp_slots((train_pp_kind)kind, P, M, V, st, msg);
    printf("%s   (%d activation sets)\n", line, sets);
  }
  printf("pipeline: idle fraction of the schedule (bubble / compute) %.4f\n",
         train_pp_formula((train_pp_kind)kind, P, M, V));
  return 0;
}

/* --explain: the schedule's picture. */
static int print_explain(int P, int kind, int M, int V) {
  char msg[TRAIN_ERRLEN];
  train_pp_schedule sc;
  if (train_pp_build((train_pp_kind)kind, P, M, V, &sc, msg) != 0) die(msg);
  if (train_pp_verify(&sc, msg) != 0) {
    train_pp_free(&sc);
    die(msg);
  }
  static char pic[1 << 18];
  train_pp_draw(&sc, pic, sizeof pic);
  printf("coll-train: %s schedule, %d stages, %d micro-batches",
         train_pp_kind_name((train_pp_kind)kind), P, M);
  if (V > 1) printf(", %d chunks per stage", V);
  putchar('\n');
  fputs(pic, stdout);
  for (int st = 0; st < P; st++)
    printf("stage %d holds at most %d micro-batch chunks' activations (%d sets as run)\n", st,
           sc.inflight[st], train_pp_slots((train_pp_kind)kind, P, M, V, st, msg));
  /* the lists themselves, as the executor runs them: [...] is one group of transfers */
  static const char *ops[] = {"F", "B", "W", "send act", "recv act", "send grad", "recv grad"};
  for (int st = 0; st < P; st++) {
    printf("stage %d:", st);
    for (int i = 0; i < sc.n[st]; i++) {
      const train_pp_action *a = &sc.acts[st][i];
      int x = a->op >= TRAIN_PP_SEND_ACT;
      int open = x && (i == 0 || sc.acts[st][i - 1].group != a->group);
      int close = x && (i + 1 == sc.n[st] || sc.acts[st][i + 1].group != a->group);
      printf(" %s%s%d", open ? "[" : (x ? ", " : ""), ops[a->op], a->micro);
      if (V > 1) printf(".%d", a->chunk);
      if (x)
        printf(a->op == TRAIN_PP_SEND_ACT || a->op == TRAIN_PP_SEND_GRAD ? "->%d" : "<-%d",
               a->peer);
      if (close) putchar(']');
    }
    putchar('\n');
  }
  train_pp_free(&sc);
  return 0;
}

/* --plan --experts: the mixture of experts' rows (one process, and the run's D x EP). */
static int print_moe_plan(const train_options *o, int N, int X, double fixed) {
  char line[256], msg[TRAIN_ERRLEN];
  printf("mixture of experts: %d experts, top-%d, %s; rows for one process and for %d "
         "ranks with --ep %d (sent includes the all-to-alls at balanced routing)\n",
         o->experts, o->topk, o->capacity_factor > 0 ? "capacity-padded" : "dropless", N, X);
  for (int k = 0; k < (N > 1 ? 3 : 1); k++) { /* one process, D x EP, D x EP with ZeRO-1 */
    train_plan_row r;
    double a2a = 0.0;
    int D = k ? N : 1, x = k ? X : 1;
    if (train_ep_plan(&o->cfg, o->batch, o->seq, D, x, o->experts, o->topk, o->capacity_factor,
                      k == 2, fixed, &r, &a2a, msg) != 0)
      die(msg);
    train_plan_format(&r, line, sizeof line);
    printf("%s   (D=%d x EP=%d: %.0f bytes of all-to-all per block per step)\n", line, D, x, a2a);
  }
  return 0;
}

/* --explain --experts: one block's steps, with the bytes a rank sends in each. */
static int print_moe_explain(const train_options *o, int D, int X) {
  char msg[TRAIN_ERRLEN];
  train_plan_row r;
  double a2a = 0.0;
  if (train_ep_plan(&o->cfg, o->batch, o->seq, D, X, o->experts, o->topk, o->capacity_factor, 0, 0,
                    &r, &a2a, msg) != 0)
    die(msg);
  int E = o->experts, K = o->topk, C = o->cfg.channels, N = o->batch * o->seq;
  int cap = train_moe_capacity(N, E, K, o->capacity_factor);
  double S = cap ? (double)E * cap : (double)N * K, out = S * (X - 1) / X;
  printf("coll-train: mixture of experts, %d experts top-%d (%s), %d ranks, --ep %d: rank d "
         "holds experts [(d %% %d)*%d, +%d) of every block; %d tokens per rank\n",
         E, K, cap ? "capacity" : "dropless", D, X, X, E / X, E / X, N);
  printf("one block, forward:\n");
  printf("  router      probs = softmax(x @ Wr^T) (%d x %d), top-%d, gates not renormalised\n", N,
         E, K);
  printf("  all-reduce  router statistics over %d ranks: %d floats (counts, prob sums, N, "
         "dropped)\n",
         D, 2 * E + 2);
  if (X > 1 && !cap) printf("  all-to-all  counts: %d ints to each of the %d EP ranks\n", E / X, X);
  if (cap)
    printf("  capacity    %d rows per expert per rank (ceil(%g x %d x %d / %d)), overflow "
           "dropped, padded: fixed splits\n",
           cap, (double)o->capacity_factor, N, K, E);
  printf("  dispatch    all-to-all%s of %.0f rows (%s): %.0f to other ranks = %.0f bytes\n",
         cap ? "" : "v", S, cap ? "E x cap" : "K x N at most, balanced", out, out * C * 4);
  printf("  experts     %d local experts, each fc %d->%d, gelu, proj %d->%d over its rows\n", E / X,
         C, 4 * C, 4 * C, C);
  printf("  combine     the mirror all-to-all%s: %.0f bytes back; out = sum_k gate_k y_k\n",
         cap ? "" : "v", out * C * 4);
  printf("one block, backward: dispatch of the output gradients (%.0f bytes), the experts' "
         "backward, combine of the input gradients (%.0f bytes), the router's backward\n",
         out * C * 4, out * C * 4);
  printf("per block and step a rank sends %.0f bytes in all-to-alls (%d blocks: %.0f); "
         "formula 4 x K x N x (X-1)/X x C x 4 = %.0f (dropless, balanced)\n",
         a2a, o->cfg.layers, a2a * o->cfg.layers, 4.0 * K * N * (X - 1) / X * C * 4);
  printf("after backward: dense gradients all-reduced over %d ranks, expert gradients over "
         "the %d ranks holding the same experts\n",
         D, D / X);
  return 0;
}

static int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

/* Sums of the steps' reports (the loop's totals). */
static void report_add(train_step_report *sum, const train_step_report *r) {
  sum->fwd_ms += r->fwd_ms;
  sum->bwd_ms += r->bwd_ms;
  sum->wait_ms += r->wait_ms;
  sum->comm_ms += r->comm_ms;
  sum->sent_bytes += r->sent_bytes;
  sum->measured_bytes += r->measured_bytes;
  sum->tp_ms += r->tp_ms;
  sum->tp_other_ms += r->tp_other_ms;
  sum->tp_bytes += r->tp_bytes;
  sum->tp_calls += r->tp_calls;
  sum->ep_ms += r->ep_ms;
  sum->ep_bytes += r->ep_bytes;
  sum->ep_calls += r->ep_calls;
  sum->cp_ms += r->cp_ms;
  sum->cp_bytes += r->cp_bytes;
  sum->cp_calls += r->cp_calls;
}

/* The strategy's lines (several, each ending in '\n'), printed as they are. */
static void print_lines(const char *text) { fputs(text, stdout); }

/* The planner's row of this run, or 0 when the planner cannot say. */
static int plan_row(train_parallel *p, double fixed, train_plan_row *pr) {
  char msg[TRAIN_ERRLEN];
  return p->ops->plan(p, fixed, pr, msg) == 0;
}

/* One process's run: the single-process trainer (b == NULL) or one rank of a job, under
 * whatever strategy the command line chose (parallel/strategy.h): the loop below is the
 * same for all of them. */
static int run(const cli *c, train_backend *b) {
  train_options o = c->o;
  const char *ckpt_dir = c->ckpt_dir, *resume = c->resume, *plot = c->plot, *prompt = c->prompt;
  long stop_after = c->stop_after, ckpt_every = c->ckpt_every, eval_every = c->eval_every,
       eval_batches = c->eval_batches, sample_len = c->sample_len;
  int quiet = c->quiet;
  int root = !b || b->rank == 0;
  char msg[TRAIN_ERRLEN];
  static char text[1 << 16]; /* a strategy's lines */

  int W = c->tp * c->pp; /* ranks of one model replica */
  if (b && W > 1 && (b->nranks % W != 0 || (!c->ddp && b->nranks != W))) {
    snprintf(msg, sizeof msg, "%d ranks cannot form --tp %d x --pp %d groups%s", b->nranks, c->tp,
             c->pp, c->ddp ? "" : " without --parallel ddp");
    die_rank(b, msg);
  }
  if (b && c->cp > 1 && b->nranks % (c->cp * c->tp) != 0) {
    snprintf(msg, sizeof msg, "%d ranks cannot form --cp %d rings (--ranks must be C x D)",
             b->nranks, c->cp);
    die_rank(b, msg);
  }
  /* the job as T x D x P ranks: every group a split of b (tensor parallel innermost,
   * pipeline outermost); with --cp, T x Cp x D (context parallel between the two) */
  train_grid g;
  if (c->cp > 1 ? train_grid_create_cp(&g, b, c->tp, c->cp, msg) != 0
                : train_grid_create_pp(&g, b, c->tp, c->pp, msg) != 0)
    die_rank(b, msg);
  o.cp = g.Cp;
  if (c->experts && b && train_grid_add_ep(&g, c->ep, msg) != 0) die_rank(b, msg);
  o.ep = c->experts ? c->ep : 1;
  o.ep_rank = c->experts && b ? g.e : 0;
  o.tp = g.T;
  o.tp_rank = g.tp ? g.tp->rank : 0;
  o.sp = c->sp;
  if (g.P > 1) { /* this stage's pieces, with the activation sets its list needs */
    o.pp = g.P;
    o.pp_rank = g.p;
    o.pp_chunks = c->chunks;
    o.pp_slots = train_pp_slots((train_pp_kind)c->schedule, g.P, c->micro, c->chunks, g.p, msg);
    o.pp_split_w = c->schedule == TRAIN_PP_ZB;
    if (o.pp_slots < 0) die_rank(b, msg);
  }
  if (b && o.threads == 0) { /* share the CPUs between the ranks on this machine */
    int local = env_int("LOCAL_WORLD_SIZE", env_int("OMPI_COMM_WORLD_LOCAL_SIZE", b->nranks));
    o.threads = train_cpu_threads() / (local > 0 ? local : 1);
    if (o.threads < 1) o.threads = 1;
  }

  /* Everything that can fail on the input fails here, before any file is written. */
  train_session *s = train_session_create(&o, msg);
  if (!s) die_rank(b, msg);
  /* every strategy reads D * accum rows per step, and its checkpoints say so: a resume
   * at another layout checks it reads the same global batch */
  train_session_set_batch_mult(s, g.D * (g.P > 1 ? c->micro : c->accum));
  if (resume && train_session_load(s, resume, msg) != 0) {
    train_session_free(s);
    die_rank(b, msg);
  }
  if (ckpt_dir && root) {
    struct stat st;
    if (stat(ckpt_dir, &st) != 0) {
      if (mkdir(ckpt_dir, 0755) != 0) {
        snprintf(msg, sizeof msg, "--ckpt-dir %s: cannot create: %s", ckpt_dir, strerror(errno));
        train_session_free(s);
        die_rank(b, msg);
      }
    } else if (!S_ISDIR(st.st_mode)) {
      snprintf(msg, sizeof msg, "--ckpt-dir %s: not a directory", ckpt_dir);
      train_session_free(s);
      die_rank(b, msg);
    }
  }

  train_parallel_options po = {
      .data = c->fsdp  ? "fsdp"
              : c->ddp ? "ddp"
                       : "none",
      .zero = c->zero,
      .accum = c->accum,
      .overlap = c->overlap,
      .bucket_bytes = (size_t)(c->bucket_mb * 1048576.0),
      .sp = c->sp,
      .trace = c->trace != NULL,
      .schedule = c->schedule,
      .micro = c->micro,
      .chunks = c->chunks,
      .experts = c->experts,
      .cp_ulysses = c->cp_ulysses,
  };
  train_parallel *p = train_parallel_create(s, &g, &po, msg);
  if (!p) die_rank(b, msg);
  /* the planner's fixed part: this process before any model, plus libcoll's
   * communicator as the start-up broadcasts have left it resident */
  double comm_rss = b ? train_comm_rss_bytes() : 0.0, fixed = c->fixed + comm_rss;
  train_model *m = train_session_model(s);
  /* the whole model's shape and size (a pipeline stage's model holds some of its blocks) */
  const train_config *cfg = &o.cfg;
  size_t np = train_num_params(m);
  if (g.P > 1) {
    train_plan_row whole;
    if (train_plan(cfg, o.batch, o.seq, 1, 1, TRAIN_PLAN_NONE, 0, &whole, msg) == 0)
      np = (size_t)(whole.params / 4);
  }
  const char *devname = "cpu";
  char gpuname_err[TRAIN_ERRLEN];
  if (o.device == TRAIN_DEVICE_CUDA) devname = train_cuda_device_name(gpuname_err);
  double peak = o.device == TRAIN_DEVICE_CUDA ? train_cuda_peak_flops() : 0.0;
  double fpt = train_flops_per_token(cfg, o.seq);
  train_plan_row pr;
  char line[256];
  if (root) {
    /* bf16: 2-byte weights and gradients, the fp32 master with AdamW's moments */
    double wb = o.bf16 ? 2.0 : 4.0, ob = o.bf16 ? 12.0 : 8.0;
    printf("coll-train: GPT  layers %d  channels %d  heads %d  vocab %d  max_seq %d  "
           "= %zu parameters (%.1f MiB%s; +%.1f MiB grads, +%.1f MiB %s, %.1f MiB "
           "activations)\n",
           cfg->layers, cfg->channels, cfg->heads, cfg->vocab, cfg->max_seq, np, np * wb / 1048576,
           o.bf16 ? " bf16" : "", np * wb / 1048576, np * ob / 1048576,
           o.bf16 ? "fp32 master + AdamW" : "AdamW", train_activation_bytes(m) / 1048576.0);
    printf("coll-train: data %s (%zu tokens, last 10%% for validation)  batch %d x seq %d  "
           "steps %d  lr %g  device %s",
           o.data_path ? o.data_path : "embedded corpus (Shakespeare's sonnets)",
           train_data_tokens(train_session_data(s)), o.batch, o.seq, o.hp.steps, o.hp.lr,
           devname ? devname : "cuda");
    if (o.device == TRAIN_DEVICE_CPU)
      printf(" (%d threads)", o.threads ? o.threads : train_cpu_threads());
    putchar('\n');
    if (resume)
      printf("coll-train: resumed from %s at step %ld\n", resume, train_session_step_count(s));
    p->ops->describe(p, text, sizeof text);
    print_lines(text);
    if (plan_row(p, fixed, &pr)) {
      train_plan_header(line, sizeof line);
      printf("plan (MiB per rank): %s\n", line);
      train_plan_format(&pr, line, sizeof line);
      printf("plan (MiB per rank): %s\n", line);
    }
    fflush(stdout);
  }

  long first = train_session_step_count(s) + 1;
  long total = o.hp.steps, last_step = total;
  if (stop_after >= 0 && stop_after < last_step) last_step = stop_after;
  long n = last_step >= first ? last_step - first + 1 : 0;
  float *losses = calloc((size_t)n + 1, sizeof *losses);
  double *moe_load = calloc((size_t)n + 1, sizeof *moe_load),
         *moe_aux = calloc((size_t)n + 1, sizeof *moe_aux);
  long *vsteps = calloc((size_t)(n / (eval_every ? eval_every : n + 1)) + 2, sizeof *vsteps);
  float *vloss = calloc((size_t)(n / (eval_every ? eval_every : n + 1)) + 2, sizeof *vloss);
  long nv = 0;
  char *sample = malloc((size_t)sample_len + 1);
  double t_start = now_s();
  double tok_total = 0, time_total = 0;
  train_step_stats st = {0};
  train_step_report later = {0}, all = {0}; /* sums: the steps after the first; every step */
  long nlater = 0;
  char path[4200];

  for (long i = 0; i < n; i++) {
    train_step_report r = {0};
    if (p->ops->step(p, &r, msg) != 0) die_rank(b, msg);
    st = r.step;
    if (train_session_status(s, msg) != 0 || (p->ops->status && p->ops->status(p, msg) != 0))
      die_rank(b, msg);
    losses[i] = st.loss;
    if (o.experts) { /* the expert load of the global batch (every rank sees the same) */
      train_moe_stats ms;
      train_moe_stats_read(m, &ms);
      moe_load[i] = ms.load;
      moe_aux[i] = ms.aux;
    }
    report_add(&all, &r);
    if (st.step > first) { /* the first step warms caches; keep it out of the mean */
      tok_total += (double)p->rows_mult * o.batch * o.seq;
      time_total += st.ms * 1e-3;
      report_add(&later, &r);
      nlater++;
    }
    if (!quiet && root) {
      printf("step %5ld/%ld | loss %.6f | lr %.2e | norm %.4f | %7.1f ms | %8.0f tok/s", st.step,
             total, st.loss, st.lr, st.grad_norm, st.ms, st.tokens_per_s);
      if (peak > 0) printf(" | MFU %.1f%%", 100.0 * fpt * st.tokens_per_s / peak);
      p->ops->step_line(p, &r, text, sizeof text);
      printf("%s", text);
      if (o.experts) {
        train_moe_stats ms;
        train_moe_stats_read(m, &ms);
        printf(" | moe aux %.5f load max/mean %.3f", ms.aux, ms.load);
        if (o.capacity_factor > 0) printf(" dropped %.1f%%", 100.0 * ms.dropped);
      }
      putchar('\n');
    }
    int last = st.step == last_step;
    int eval_now = (eval_every && st.step % eval_every == 0) || (last && eval_every);
    if (eval_now && p->ops->eval_begin && p->ops->eval_begin(p, msg) != 0) /* collective */
      die_rank(b, msg);
    if ((root || p->eval_everywhere) && eval_now) {
      float vl = 0.0f;
      if (!p->ops->val_loss)
        vl = train_session_val_loss(s, (int)eval_batches);
      else if (p->ops->val_loss(p, (int)eval_batches, &vl, msg) != 0) /* collective */
        die_rank(b, msg);
      if (p->ops->status && p->ops->status(p, msg) != 0) die_rank(b, msg);
      vsteps[nv] = st.step;
      vloss[nv++] = vl;
      if (root) printf("eval step %ld | val loss %.6f\n", st.step, vl);
      if (root && sample_len > 0 && p->can_sample) {
        train_session_sample(s, prompt, (int)sample_len, sample);
        printf("sample: ");
        print_escaped(sample, (int)sample_len);
      }
    }
    if (train_session_status(s, msg) != 0) /* validation and sampling ran on it too */
      die_rank(b, msg);
    if (ckpt_dir && ((ckpt_every && st.step % ckpt_every == 0) || last)) {
      snprintf(path, sizeof path, "%s/ckpt_%08ld.bin", ckpt_dir, st.step);
      if (p->ops->save(p, path, text, sizeof text, msg) != 0) /* collective */
        die_rank(b, msg);
      if (root) printf("checkpoint %s%s\n", path, text);
    }
    fflush(stdout);
  }
  double wall = now_s() - t_start;
  double peak_rss = train_peak_rss_bytes(), *peaks = NULL, *planned = NULL;
  if (b) { /* every rank's peak, and what the planner says of its own part */
    peaks = calloc((size_t)b->nranks, sizeof *peaks);
    planned = calloc((size_t)b->nranks, sizeof *planned);
    /* the communicator's part as it stands now: the transfers between pipeline stages
     * touch FIFO pages start-up did not (measured, like the rest of the fixed part) */
    train_plan_row mine;
    double own = plan_row(p, c->fixed + train_comm_rss_bytes(), &mine) ? mine.total : 0.0;
    train_req preq, qreq;
    if (!peaks || !planned || b->all_gather(b, &peak_rss, peaks, sizeof peak_rss, &preq) != 0 ||
        b->wait(b, preq) != 0 || b->all_gather(b, &own, planned, sizeof own, &qreq) != 0 ||
        b->wait(b, qreq) != 0)
      die_rank(b, peaks && planned ? b->err : "out of memory gathering the peak memory");
  }
  if (p->ops->finish(p, c->trace, msg) != 0) /* collective: checks, the timeline */
    die_rank(b, msg);
  if (root) {
    p->ops->summary(p, &later, nlater, time_total, &all, n, text, sizeof text);
    print_lines(text);
    if (plan_row(p, fixed, &pr)) {
      printf("memory: planned %.1f MiB per rank (%s); measured peak resident (VmHWM)",
             pr.total / 1048576.0, pr.name);
      double mx = peak_rss;
      for (int r = 0; b && r < b->nranks; r++) {
        printf(" rank %d %.1f", r, peaks[r] / 1048576.0);
        mx = peaks[r] > mx ? peaks[r] : mx;
      }
      if (!b) printf(" %.1f", peak_rss / 1048576.0);
      printf(" MiB; largest / planned = %.3f\n", mx / pr.total);
      int differ = 0; /* ranks with plans of their own (pipeline stages): each beside its own */
      for (int r = 0; b && r < b->nranks; r++) differ |= planned[r] != planned[0];
      if (differ) {
        printf("memory by rank (fixed part with the communicator as it ends), planned -> "
               "measured peak (MiB):");
        for (int r = 0; r < b->nranks; r++)
          printf(" rank %d %.1f -> %.1f (%.3f)", r, planned[r] / 1048576.0, peaks[r] / 1048576.0,
                 planned[r] > 0 ? peaks[r] / planned[r] : 0.0);
        putchar('\n');
      }
      printf("memory: fixed part %.1f MiB = process before any model %.1f + libcoll "
             "communicator %.1f (after start-up; %.1f at the end on rank 0)\n",
             fixed / 1048576.0, c->fixed / 1048576.0, comm_rss / 1048576.0,
             (b ? train_comm_rss_bytes() : 0.0) / 1048576.0);
    }
    if (o.experts && n > 0) { /* what the auxiliary loss does to the balance */
      long w = n < 10 ? n : 10;
      double lw = 0.0, aw = 0.0;
      for (long i = n - w; i < n; i++) lw += moe_load[i] / w, aw += moe_aux[i] / w;
      printf("moe: %d experts top-%d, aux coef %g: expert load max/mean (mean over blocks) step 1 "
             "%.3f, mean of the last %ld steps %.3f; aux loss %.5f\n",
             o.experts, o.topk, (double)o.aux_coef, moe_load[0], w, lw, aw);
    }
    if (c->trace) printf("trace %s\n", c->trace);
    printf("done: %ld steps in %.1f s | final loss %.6f", n, wall, n ? st.loss : NAN);
    if (nv) printf(" | val loss %.6f", vloss[nv - 1]);
    if (time_total > 0) {
      printf(" | %.0f tok/s", tok_total / time_total);
      if (peak > 0) printf(" | MFU %.1f%%", 100.0 * fpt * (tok_total / time_total) / peak);
    }
    putchar('\n');
    if (c->losses) {
      FILE *lf = fopen(c->losses, "w");
      for (long i = 0; lf && i < n; i++) fprintf(lf, "%ld %a\n", first + i, losses[i]);
      if (!lf || fclose(lf) != 0) {
        snprintf(msg, sizeof msg, "--losses %s: cannot write: %s", c->losses, strerror(errno));
        die_rank(b, msg);
      }
    }
    if (plot) {
      char title[256];
      snprintf(title, sizeof title, "coll-train: L=%d C=%d H=%d, batch %d x %d, lr %g", cfg->layers,
               cfg->channels, cfg->heads, o.batch, o.seq, o.hp.lr);
      if (train_plot_svg(plot, first, losses, n, vsteps, vloss, nv, title, msg) != 0)
        die_rank(b, msg);
      printf("plot %s\n", plot);
    }
  }
  free(peaks);
  free(planned);
  free(losses);
  free(moe_load);
  free(moe_aux);
  free(vsteps);
  free(vloss);
  free(sample);
  train_parallel_free(p);
  train_grid_free(&g);
  train_session_free(s);
  return 0;
}

static int rank_main(coll_comm_t comm, int rank, int nranks, void *arg) {
  (void)nranks;
  char msg[TRAIN_ERRLEN];
  const cli *c = arg;
  /* forked on this machine: the rank is the local rank, which picks the GPU */
  char lr[16];
  snprintf(lr, sizeof lr, "%d", rank);
  setenv("TRAIN_LOCAL_RANK", lr, 1);
  train_backend *b = c->nccl ? train_backend_nccl(comm, 0, msg) : train_backend_coll(comm, 0, msg);
  if (!b) die(msg);
  int rc = run(arg, b);
  if (b->destroy(b) != 0) rc = 1;
  return rc;
}

static int launched_by_someone(void) {
  static const char *vars[] = {"COLL_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                               "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (getenv(vars[i])) return 1;
  return 0;
}

/* --parallel ddp: join the launcher's job, start mpirun, or fork local ranks. */
static int run_ddp(cli *c) {
  char msg[TRAIN_ERRLEN];
  if (c->mpi && !getenv("OMPI_COMM_WORLD_SIZE")) {
    /* start ourselves under Open MPI's launcher (mpirun may be MPICH's) */
    int argc = 0;
    while (c->argv[argc]) argc++;
    char np[16];
    snprintf(np, sizeof np, "%d", c->ranks);
    char **av = calloc((size_t)argc + 12, sizeof *av);
    int k = 0;
    av[k++] = "mpirun.openmpi";
    if (geteuid() == 0) av[k++] = "--allow-run-as-root";
    av[k++] = "--oversubscribe";
    av[k++] = "--bind-to";
    av[k++] = "none";
    av[k++] = "-np";
    av[k++] = np;
    for (int i = 0; i < argc; i++) av[k++] = c->argv[i];
    av[k] = NULL;
    fflush(stdout);
    execvp(av[0], av);
    snprintf(msg, sizeof msg,
             "--backend mpi: cannot run mpirun.openmpi: %s (install "
             "openmpi-bin)",
             strerror(errno));
    die(msg);
  }
  if (c->mpi || launched_by_someone()) {
    train_backend *b = NULL;
    if (c->nccl) { /* NCCL's unique id travels over a libcoll communicator */
      coll_comm_t boot;
      if (coll_comm_init_from_env(&boot) != COLL_OK) {
        snprintf(msg, sizeof msg, "libcoll: cannot join the job from the environment: %s",
                 coll_comm_last_error(NULL));
        die(msg);
      }
      b = train_backend_nccl(boot, 1, msg);
      if (!b) {
        coll_comm_abort(boot);
        die(msg);
      }
    } else {
      b = c->mpi ? train_backend_mpi(msg) : train_backend_coll_from_env(msg);
    }
    if (!b) die(msg);
    if (c->ranks_given && c->ranks != b->nranks) {
      snprintf(msg, sizeof msg, "--ranks %d but the launcher started %d ranks", c->ranks,
               b->nranks);
      die_rank(b, msg);
    }
    int rc = run(c, b);
    if (b->destroy(b) != 0) rc = 1;
    return rc;
  }
  if (c->resume) { /* one line from here, not one per rank, for a bad checkpoint */
    train_options o = c->o;
    o.threads = 1;
    train_session *s = train_session_create(&o, msg);
    if (s) /* the global batch, as run() sets it: D x accum, or D x micro-batches */
      train_session_set_batch_mult(s, c->ranks / (c->tp * c->pp * c->cp) *
                                          (c->pp > 1 ? c->micro : c->accum));
    if (!s || train_session_load(s, c->resume, msg) != 0) {
      train_session_free(s);
      die(msg);
    }
    train_session_free(s);
  }
  fflush(stdout);
  int rc = coll_launch_local(c->ranks, rank_main, c, 0, msg, sizeof msg);
  if (rc != 0) fprintf(stderr, "coll-train: %s\n", msg);
  return rc;
}

int main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"layers", required_argument, 0, O_LAYERS},
      {"channels", required_argument, 0, O_CHANNELS},
      {"heads", required_argument, 0, O_HEADS},
      {"max-seq", required_argument, 0, O_MAXSEQ},
      {"vocab", required_argument, 0, O_VOCAB},
      {"seq", required_argument, 0, O_SEQ},
      {"batch", required_argument, 0, O_BATCH},
      {"steps", required_argument, 0, O_STEPS},
      {"lr", required_argument, 0, O_LR},
      {"warmup", required_argument, 0, O_WARMUP},
      {"min-lr-frac", required_argument, 0, O_MINLR},
      {"weight-decay", required_argument, 0, O_WD},
      {"clip", required_argument, 0, O_CLIP},
      {"seed", required_argument, 0, O_SEED},
      {"device", required_argument, 0, O_DEVICE},
      {"threads", required_argument, 0, O_THREADS},
      {"data", required_argument, 0, O_DATA},
      {"ckpt-dir", required_argument, 0, O_CKPTDIR},
      {"ckpt-every", required_argument, 0, O_CKPTEVERY},
      {"resume", required_argument, 0, O_RESUME},
      {"eval-every", required_argument, 0, O_EVALEVERY},
      {"eval-batches", required_argument, 0, O_EVALBATCHES},
      {"sample-len", required_argument, 0, O_SAMPLELEN},
      {"prompt", required_argument, 0, O_PROMPT},
      {"plot", required_argument, 0, O_PLOT},
      {"quiet", no_argument, 0, O_QUIET},
      {"stop-after", required_argument, 0, O_STOPAFTER},
      {"help", no_argument, 0, O_HELP},
      {"parallel", required_argument, 0, O_PARALLEL},
      {"ranks", required_argument, 0, O_RANKS},
      {"backend", required_argument, 0, O_BACKEND},
      {"bucket-mb", required_argument, 0, O_BUCKETMB},
      {"no-overlap", no_argument, 0, O_NOOVERLAP},
      {"accum", required_argument, 0, O_ACCUM},
      {"trace", required_argument, 0, O_TRACE},
      {"zero", required_argument, 0, O_ZERO},
      {"plan", no_argument, 0, O_PLAN},
      {"tp", required_argument, 0, O_TP},
      {"sp", no_argument, 0, O_SP},
      {"losses", required_argument, 0, O_LOSSES},
      {"pp", required_argument, 0, O_PP},
      {"schedule", required_argument, 0, O_SCHEDULE},
      {"micro-batches", required_argument, 0, O_MICRO},
      {"chunks", required_argument, 0, O_CHUNKS},
      {"explain", no_argument, 0, O_EXPLAIN},
      {"recompute", required_argument, 0, O_RECOMPUTE},
      {"dtype", required_argument, 0, O_DTYPE},
      {"experts", required_argument, 0, O_EXPERTS},
      {"topk", required_argument, 0, O_TOPK},
      {"capacity-factor", required_argument, 0, O_CAPACITY},
      {"aux-loss-coef", required_argument, 0, O_AUXCOEF},
      {"ep", required_argument, 0, O_EP},
      {"cp", required_argument, 0, O_CP},
      {"cp-mode", required_argument, 0, O_CPMODE},
      {0, 0, 0, 0},
  };
  train_options o = {
      .cfg = {.vocab = 256, .max_seq = 256, .layers = 4, .channels = 128, .heads = 4},
      .hp = train_hparams_default(),
      .batch = 16,
      .seq = 64,
      .seed = 1337,
      .device = TRAIN_DEVICE_CPU,
      .threads = 0,
      .data_path = NULL,
  };
  o.hp.steps = 400;
  const char *ckpt_dir = NULL, *resume = NULL, *plot = NULL, *prompt = "\n";
  long stop_after = -1, ckpt_every = 0, eval_every = 100, eval_batches = 8, sample_len = 120;
  int quiet = 0;
  char msg[TRAIN_ERRLEN];
  int zero_given = 0, plan = 0, explain = 0, micro_given = 0, chunks_given = 0;
  int topk_given = 0, cf_given = 0, aux_given = 0, ep_given = 0;
  o.topk = 1;
  o.aux_coef = 0.01f;
  double fixed = train_rss_bytes();
  int cpmode_given = 0;
  cli cl = {.tp = 1,
            .cp = 1,
            .pp = 1,
            .schedule = TRAIN_PP_1F1B,
            .zero = 3,
            .ranks = 1,
            .overlap = 1,
            .accum = 1,
            .bucket_mb = 25.0,
            .argv = argv};

  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    const char *a = optarg;
    switch (c) {
    case O_LAYERS: o.cfg.layers = (int)parse_int("--layers", a, 1, 1024); break;
    case O_CHANNELS: o.cfg.channels = (int)parse_int("--channels", a, 1, 65536); break;
    case O_HEADS: o.cfg.heads = (int)parse_int("--heads", a, 1, 65536); break;
    case O_MAXSEQ: o.cfg.max_seq = (int)parse_int("--max-seq", a, 1, 1 << 20); break;
    case O_VOCAB: o.cfg.vocab = (int)parse_int("--vocab", a, 2, 65536); break;
    case O_SEQ: o.seq = (int)parse_int("--seq", a, 1, 1 << 20); break;
    case O_BATCH: o.batch = (int)parse_int("--batch", a, 1, 1 << 20); break;
    case O_STEPS: o.hp.steps = (int)parse_int("--steps", a, 0, INT_MAX); break;
    case O_LR: o.hp.lr = parse_float("--lr", a, 0.0, 10.0); break;
    case O_WARMUP: o.hp.warmup = (int)parse_int("--warmup", a, 0, INT_MAX); break;
    case O_MINLR: o.hp.min_lr_frac = parse_float("--min-lr-frac", a, 0.0, 1.0); break;
    case O_WD: o.hp.weight_decay = parse_float("--weight-decay", a, 0.0, 10.0); break;
    case O_CLIP: o.hp.grad_clip = parse_float("--clip", a, 0.0, 1e30); break;
    case O_SEED: o.seed = (uint64_t)parse_int("--seed", a, 0, LONG_MAX); break;
    case O_DEVICE:
      if (strcmp(a, "cpu") == 0)
        o.device = TRAIN_DEVICE_CPU;
      else if (strcmp(a, "cuda") == 0)
        o.device = TRAIN_DEVICE_CUDA;
      else {
        snprintf(msg, sizeof msg, "--device: '%s' is not cpu or cuda", a);
        die(msg);
      }
      break;
    case O_THREADS: o.threads = (int)parse_int("--threads", a, 0, 4096); break;
    case O_DATA: o.data_path = a; break;
    case O_CKPTDIR: ckpt_dir = a; break;
    case O_CKPTEVERY: ckpt_every = parse_int("--ckpt-every", a, 0, LONG_MAX); break;
    case O_RESUME: resume = a; break;
    case O_EVALEVERY: eval_every = parse_int("--eval-every", a, 0, LONG_MAX); break;
    case O_EVALBATCHES: eval_batches = parse_int("--eval-batches", a, 1, 1 << 20); break;
    case O_SAMPLELEN: sample_len = parse_int("--sample-len", a, 0, 1 << 20); break;
    case O_PROMPT: prompt = a; break;
    case O_PLOT: plot = a; break;
    case O_QUIET: quiet = 1; break;
    case O_STOPAFTER: stop_after = parse_int("--stop-after", a, 0, LONG_MAX); break;
    case O_PARALLEL:
      cl.ddp = cl.fsdp = 0;
      if (strcmp(a, "ddp") == 0)
        cl.ddp = 1;
      else if (strcmp(a, "fsdp") == 0)
        cl.ddp = cl.fsdp = 1; /* launched like DDP */
      else if (strcmp(a, "none") != 0) {
        snprintf(msg, sizeof msg, "--parallel: '%s' is not none, ddp or fsdp", a);
        die(msg);
      }
      break;
    case O_RANKS:
      cl.ranks = (int)parse_int("--ranks", a, 1, 1024);
      cl.ranks_given = 1;
      break;
    case O_BACKEND:
      cl.mpi = strcmp(a, "mpi") == 0;
      cl.nccl = strcmp(a, "nccl") == 0;
      if (!cl.mpi && !cl.nccl && strcmp(a, "coll") != 0) {
        snprintf(msg, sizeof msg, "--backend: '%s' is not coll, mpi or nccl", a);
        die(msg);
      }
      break;
    case O_BUCKETMB: cl.bucket_mb = parse_float("--bucket-mb", a, 1e-6, 1e6); break;
    case O_NOOVERLAP: cl.overlap = 0; break;
    case O_ACCUM: cl.accum = (int)parse_int("--accum", a, 1, 1 << 20); break;
    case O_TRACE: cl.trace = a; break;
    case O_PLAN: plan = 1; break;
    case O_TP: cl.tp = (int)parse_int("--tp", a, 1, 1024); break;
    case O_SP: cl.sp = 1; break;
    case O_CP: cl.cp = (int)parse_int("--cp", a, 1, 1024); break;
    case O_CPMODE:
      cpmode_given = 1;
      if (strcmp(a, "ulysses") == 0)
        cl.cp_ulysses = 1;
      else if (strcmp(a, "ring") == 0)
        cl.cp_ulysses = 0;
      else {
        snprintf(msg, sizeof msg, "--cp-mode: '%s' is not ring or ulysses", a);
        die(msg);
      }
      break;
    case O_LOSSES: cl.losses = a; break;
    case O_PP: cl.pp = (int)parse_int("--pp", a, 1, 1024); break;
    case O_SCHEDULE:
      cl.schedule = train_pp_kind_parse(a);
      if (cl.schedule < 0) {
        snprintf(msg, sizeof msg, "--schedule: '%s' is not gpipe, 1f1b, interleaved or zb", a);
        die(msg);
      }
      break;
    case O_MICRO:
      cl.micro = (int)parse_int("--micro-batches", a, 1, 1 << 16);
      micro_given = 1;
      break;
    case O_CHUNKS:
      cl.chunks = (int)parse_int("--chunks", a, 1, 1024);
      chunks_given = 1;
      break;
    case O_EXPLAIN: explain = 1; break;
    case O_DTYPE:
      if (strcmp(a, "fp32") == 0)
        o.bf16 = 0;
      else if (strcmp(a, "bf16") == 0)
        o.bf16 = 1;
      else {
        snprintf(msg, sizeof msg, "--dtype: '%s' is not fp32 or bf16", a);
        die(msg);
      }
      break;
    case O_RECOMPUTE:
      if (strcmp(a, "none") == 0)
        o.recompute = TRAIN_RECOMPUTE_NONE;
      else if (strcmp(a, "full") == 0)
        o.recompute = TRAIN_RECOMPUTE_FULL;
      else if (strcmp(a, "selective") == 0)
        o.recompute = TRAIN_RECOMPUTE_SELECTIVE;
      else {
        snprintf(msg, sizeof msg, "--recompute: '%s' is not none, full or selective", a);
        die(msg);
      }
      break;
    case O_EXPERTS: o.experts = (int)parse_int("--experts", a, 1, 4096); break;
    case O_TOPK:
      o.topk = (int)parse_int("--topk", a, -1000000, 1000000);
      topk_given = 1;
      break;
    case O_CAPACITY:
      o.capacity_factor = parse_float("--capacity-factor", a, -1e30, 1e6);
      if (!(o.capacity_factor > 0.0f)) {
        snprintf(msg, sizeof msg,
                 "--capacity-factor %s: must be above 0 (leave it out for dropless routing)", a);
        die(msg);
      }
      cf_given = 1;
      break;
    case O_AUXCOEF:
      o.aux_coef = parse_float("--aux-loss-coef", a, 0.0, 1e6);
      aux_given = 1;
      break;
    case O_EP:
      cl.ep = (int)parse_int("--ep", a, 1, 1024);
      ep_given = 1;
      break;
    case O_ZERO:
      cl.zero = (int)parse_int("--zero", a, 1, 3);
      zero_given = 1;
      break;
    case O_HELP:
    case 'h': usage(stdout); return 0;
    default:
      if (optopt)
        snprintf(msg, sizeof msg, "option %s needs an argument (see --help)", argv[optind - 1]);
      else
        snprintf(msg, sizeof msg, "unknown option %s (see --help)", argv[optind - 1]);
      die(msg);
    }
  }
  if (optind < argc) {
    snprintf(msg, sizeof msg, "unexpected argument '%s' (see --help)", argv[optind]);
    die(msg);
  }
  if (ckpt_every > 0 && !ckpt_dir) die("--ckpt-every needs --ckpt-dir");
  if (plot) check_writable_dir_of("--plot", plot);

  /* the mixture of experts' flags, before --plan and --explain: they refuse what a run
   * refuses */
  if (!o.experts && (topk_given || cf_given || aux_given || ep_given))
    die("--topk, --capacity-factor, --aux-loss-coef and --ep need --experts");
  if (!ep_given) cl.ep = 1;
  cl.experts = o.experts;
  if (o.experts) {
    if (train_moe_check(&o.cfg, o.experts, o.topk, cl.ep, o.capacity_factor, o.aux_coef, o.device,
                        cl.tp, cl.pp, o.bf16, o.recompute, msg) != 0)
      die(msg);
    int launched = launched_by_someone() && !cl.ranks_given;
    if (cl.ep > 1 && !cl.ranks_given && !launched) cl.ranks = cl.ep;
    if (cl.ep > 1) cl.ddp = 1; /* the dense part is data parallel over every rank */
    if (!launched && cl.ranks % cl.ep != 0) {
      snprintf(msg, sizeof msg,
               "--ranks %d is not a multiple of --ep %d: the expert-parallel groups are %d "
               "consecutive data-parallel ranks",
               cl.ranks, cl.ep, cl.ep);
      die(msg);
    }
    if (cl.fsdp && cl.zero != 1)
      die("--experts with --parallel fsdp needs --zero 1: ZeRO-2/3 shard each block's "
          "gradients and parameters over every data-parallel rank, while an expert's weights "
          "live on its expert-parallel ranks only (ZeRO-1 shards AdamW's state: the dense "
          "part over every rank, the experts over their expert-data-parallel group)");
    if (cl.accum > 1)
      die("--accum with --experts is not built yet: the router's statistics are those of one "
          "batch");
    if (ckpt_dir || resume)
      die("--ckpt-dir and --resume with --experts: checkpoints of mixture-of-experts models "
          "are not built yet (the format has no expert-parallel shards)");
    if (cl.nccl) die("--experts runs on the CPU model over libcoll or Open MPI");
    if (cl.cp > 1)
      die("--experts with --cp is not built yet: the router's statistics and the expert "
          "groups would be taken over the D x Cp ranks that share the weights, untested");
    if (explain) return print_moe_explain(&o, cl.ranks, cl.ep);
  }

  /* the pipeline's flags, checked before --plan and --explain: they refuse what a run
   * refuses */
  if (!micro_given) cl.micro = 2 * cl.pp;
  if (!chunks_given) cl.chunks = cl.schedule == TRAIN_PP_INTERLEAVED ? 2 : 1;
  if (cl.pp < 2 &&
      (micro_given || chunks_given || cl.schedule != TRAIN_PP_1F1B || (explain && cl.cp < 2)))
    die("--schedule, --micro-batches, --chunks and --explain need --pp 2 or more (--explain: "
        "or --cp 2 or more)");
  if (cpmode_given && cl.cp < 2)
    die("--cp-mode needs --cp 2 or more: it chooses how the context-parallel ranks attend");
  if (cl.cp > 1) { /* context parallelism's flags, checked before --plan and --explain */
    if (train_config_check(&o.cfg, msg) != 0 ||
        train_cp_check(&o.cfg, o.seq, cl.cp, cl.cp_ulysses, cl.tp, msg) != 0)
      die(msg);
    if (o.device == TRAIN_DEVICE_CUDA || cl.nccl)
      die("--cp runs on the CPU model only (--device cpu, --backend coll or mpi): the CUDA "
          "back end has no ring or Ulysses attention yet");
    if (cl.pp > 1)
      die("--cp with --pp is not built yet: the pipeline's pieces would carry T/C positions "
          "and the stages' rings would need their own groups");
    if (cl.sp) die("--cp with --sp is not built yet: both would shard the sequence");
    if (!cl.ddp && !plan && !explain) /* --plan, --explain: every layout */
      die("--cp needs --parallel ddp or fsdp: the context-parallel ranks sync their gradients "
          "as data-parallel ones");
    if (o.bf16)
      die("--cp with --dtype bf16 is not built yet: ring attention keeps its log-sum-exp in "
          "the fp32 buffer that bf16 stores in 16 bits");
    if (!cl.ranks_given && !launched_by_someone()) cl.ranks = cl.cp * cl.tp;
    if (!launched_by_someone() && cl.ranks % (cl.cp * cl.tp) != 0) {
      snprintf(msg, sizeof msg,
               "--ranks %d is not a multiple of --cp %d x --tp %d: the ranks form T x C x D "
               "context-parallel rings",
               cl.ranks, cl.cp, cl.tp);
      die(msg);
    }
  }
  if (cl.pp > 1) {
    if (train_pp_check((train_pp_kind)cl.schedule, cl.pp, cl.micro, cl.chunks, msg) != 0) die(msg);
    if (train_config_check(&o.cfg, msg) != 0 ||
        train_pp_config_check(&o.cfg, cl.pp, cl.chunks, o.device, msg) != 0)
      die(msg);
    if (cl.tp > 1 && train_tp_config_check(&o.cfg, cl.tp, o.device, msg) != 0) die(msg);
    int W = cl.tp * cl.pp;
    /* under a launcher (or mpirun re-running us) the world size is checked by run() */
    int launched = launched_by_someone() && !cl.ranks_given;
    if (!cl.ranks_given && !launched) cl.ranks = W;
    if (!launched && cl.ranks % W != 0) {
      snprintf(msg, sizeof msg,
               "--ranks %d is not --tp %d x --pp %d x D for any D: the ranks form a T x P x D "
               "grid",
               cl.ranks, cl.tp, cl.pp);
      die(msg);
    }
    if (!launched && !cl.ddp && cl.ranks != W) {
      snprintf(msg, sizeof msg,
               "--ranks %d with --tp %d x --pp %d makes %d data-parallel replicas: say "
               "--parallel ddp (or --ranks %d)",
               cl.ranks, cl.tp, cl.pp, cl.ranks / W, W);
      die(msg);
    }
    if (cl.fsdp && cl.zero != 1)
      die("--pp with --parallel fsdp needs --zero 1: a pipeline accumulates every "
          "micro-batch's gradients in full, so only AdamW's state is sharded (DeepSpeed "
          "refuses ZeRO-2 and 3 with pipelines too)");
    if (cl.accum > 1)
      die("--accum with --pp: the pipeline's micro-batches are its accumulation "
          "(--micro-batches)");
    if (cl.nccl) die("--pp runs on the CPU model over libcoll or Open MPI");
    /* zero-bubble's W multiplies the saved output gradients by the Linears' inputs, which
     * it reads from the activation set after B: full recomputation has none left there,
     * and under sequence parallelism the saved gradients are this rank's rows only (the
     * row-parallel Linear gathers them inside B) */
    if (cl.schedule == TRAIN_PP_ZB && o.recompute == TRAIN_RECOMPUTE_FULL)
      die("--schedule zb with --recompute full is not built yet: W reads the Linears' inputs, "
          "which full recomputation does not keep (--recompute selective works)");
    if (cl.schedule == TRAIN_PP_ZB && cl.sp)
      die("--schedule zb with --sp is not built yet: W would need the row-parallel Linears' "
          "gathered output gradients");
  }
  if (o.bf16) { /* what bf16 runs on, before --plan: it refuses what a run refuses */
    if (train_bf16_check(o.device, msg) != 0) die(msg);
    if (cl.fsdp && cl.pp < 2)
      die("--dtype bf16 with --parallel fsdp is not built yet: use --parallel ddp (or --pp "
          "with --parallel fsdp --zero 1)");
    if (cl.mpi || cl.nccl)
      die("--dtype bf16 all-reduces bfloat16 gradients, which only --backend coll can");
  }
  if (explain && cl.cp > 1) return print_cp_explain(&o, cl.cp, cl.tp, cl.cp_ulysses);
  if (explain) return print_explain(cl.pp, cl.schedule, cl.micro, cl.chunks);
  if (plan) { /* a table for every strategy: --ranks and --accum need no --parallel */
    int rc = print_plan(&o, cl.ranks, cl.accum, cl.tp, cl.sp, fixed);
    if (rc == 0 && o.experts) rc = print_moe_plan(&o, cl.ranks, cl.ep, fixed);
    if (rc == 0 && cl.cp > 1) rc = print_cp_plan(&o, cl.ranks, cl.cp, cl.tp, fixed);
    if (rc == 0 && cl.pp > 1)
      rc = print_pp_plan(&o, cl.ranks, cl.tp, cl.sp, cl.pp, cl.schedule, cl.micro, cl.chunks,
                         cl.fsdp);
    return rc;
  }
  if (cl.sp && cl.tp < 2)
    die("--sp needs --tp 2 or more: sequence parallelism shards the regions that tensor "
        "parallelism leaves replicated");
  if (cl.sp && ((long)o.batch * o.seq) % cl.tp != 0) {
    snprintf(msg, sizeof msg,
             "--sp: batch x seq (%d x %d) is not a multiple of --tp %d: "
             "each rank holds batch*seq/T rows of the residual stream",
             o.batch, o.seq, cl.tp);
    die(msg);
  }
  if (cl.tp > 1 && cl.pp < 2) {
    if (train_tp_config_check(&o.cfg, cl.tp, o.device, msg) != 0) die(msg);
    /* under a launcher (or mpirun re-running us) the world size is checked by run() */
    int launched = launched_by_someone() && !cl.ranks_given;
    if (!cl.ranks_given && !launched) cl.ranks = cl.tp * cl.cp;
    if (!launched && cl.ranks % cl.tp != 0) {
      snprintf(msg, sizeof msg,
               "--ranks %d is not a multiple of --tp %d: the ranks "
               "form a T x D grid",
               cl.ranks, cl.tp);
      die(msg);
    }
    if (!launched && !cl.ddp && cl.ranks != cl.tp) {
      snprintf(msg, sizeof msg,
               "--ranks %d with --tp %d makes %d data-parallel groups: "
               "say --parallel ddp (or --ranks %d)",
               cl.ranks, cl.tp, cl.ranks / cl.tp, cl.tp);
      die(msg);
    }
    if (cl.nccl)
      die("--tp runs on the CPU model over libcoll or Open MPI; --backend nccl is for "
          "--parallel ddp");
    if (cl.trace && cl.ddp)
      die("--trace with --tp records the tensor-parallel collectives with --parallel "
          "none only for now");
    if (cl.accum > 1 && !cl.ddp) die("--accum with --tp needs --parallel ddp");
  }
  if (!cl.ddp && cl.tp < 2 && cl.pp < 2 && (cl.ranks > 1 || cl.accum > 1 || cl.trace))
    die("--ranks, --accum and --trace need --parallel ddp or fsdp");
  if (zero_given && !cl.fsdp)
    die("--zero needs --parallel fsdp: it chooses what the fully sharded trainer shards");
  if (cl.fsdp && cl.nccl)
    die("--parallel fsdp runs on the CPU model over libcoll or Open MPI; --backend nccl "
        "is for --parallel ddp");
  if (cl.fsdp && o.device == TRAIN_DEVICE_CUDA)
    die("--parallel fsdp runs on the CPU model only (--device cpu); use --parallel ddp "
        "on GPUs");
  if (cl.trace) check_writable_dir_of("--trace", cl.trace);
  if (cl.nccl && o.device != TRAIN_DEVICE_CUDA)
    die("--backend nccl needs --device cuda: NCCL reduces GPU memory, and only the CUDA "
        "model keeps its gradients there");
  if (cl.nccl && !train_backend_nccl_built()) {
    train_backend_nccl(NULL, 0, msg); /* the stub says why */
    die(msg);
  }
  cl.fixed = fixed;
  cl.o = o;
  cl.ckpt_dir = ckpt_dir;
  cl.resume = resume;
  cl.plot = plot;
  cl.prompt = prompt;
  cl.stop_after = stop_after;
  cl.ckpt_every = ckpt_every;
  cl.eval_every = eval_every;
  cl.eval_batches = eval_batches;
  cl.sample_len = sample_len;
  cl.quiet = quiet;
  if (!cl.ddp && cl.tp < 2 && cl.pp < 2) return run(&cl, NULL);
  return run_ddp(&cl);
}
