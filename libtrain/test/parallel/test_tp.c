/*
 * test_tp.c — tensor parallelism (tp.c) against the single-process trainer.
 *
 *  - mappings, in the style of Megatron's test_mappings: every rank's input is its rank, so
 *    a sum over the group must give 0+1+...+(T-1); f is the identity forward and that sum
 *    backward, g the sum forward and the identity backward.
 *  - gradients: after one forward/backward of the same batch, the T ranks' gradients
 *    gathered into the single-process layout (train_tp_unshard) match one process's tensor
 *    by tensor, LayerNorms and embeddings included, and every rank holds the same
 *    gradients for the replicated tensors.
 *  - parity: 20 steps at T = 2 and T = 4 (--parallel none), and T = 2 x D = 2 with DDP,
 *    give the single process's loss on the same global batch within 1e-5 relative;
 *    all of it again with sequence parallelism (--sp), gradients included — without the
 *    LayerNorm gradients' all-reduce over the group (Megatron #1446) those fail.
 *    The vocabulary is not a multiple of T (257, 258), so the padded rows are exercised.
 *  - T = 2 x D = 2 with FSDP along D (ZeRO-1, 2, 3): losses and gradient norms within 1e-5
 *    of one process's, with clipping active (the norm's TP combination matters).
 *  - a rank killed in a 2 x 2 grid (ranks started as a launcher would, each its own
 *    process) makes every other rank exit non-zero with a sentence naming itself within
 *    seconds (the libcoll timeout is set to 2 s; they go in ~0.2 s, told by libcoll's
 *    watch links).
 *  - the CLI: --tp runs and prints the same losses as one process; heads not a multiple
 *    of --tp, --ranks not a multiple of --tp, --sp without --tp are refused with one line,
 *    exit status 1 and nothing written.
 *
 * Tolerance. TP computes the same sums in another order: a row-parallel Linear's output
 * is the sum of T partial dot products of C/T (or 4C/T) terms, the softmax denominators
 * and the gradient norm are sums of T partial sums. fp32 (u = 6e-8) over K <= 256-term
 * dot products, two layers deep, gives ~1e-6 relative in gradients, and AdamW's update
 * from them ~1e-6 after 20 steps (lr 1e-2). 1e-5 (the bound) is 10x that; a
 * wrong split (a head on the wrong rank, a bias added T times, a missing f) moves losses
 * by >= 1e-3 and gradients by >= 1e-2.
 */
#include <criterion/criterion.h>

#include <coll_launch.h>
#include <sys/mman.h>

#include "parallel/ddp.h"
#include "common/env_job.h"
#include "parallel/fsdp.h"
#include "common/train_test.h"
#include "parallel/tp.h"
#include "train.h"

#define B 2
#define T 16
#define STEPS 20
#define LOSS_RELTOL 1e-5
#define GRAD_RELTOL 1e-5

static train_options options(int vocab, int batch) {
  train_config cfg = {.vocab = vocab, .max_seq = 32, .layers = 2, .channels = 32, .heads = 4};
  return th_options(cfg, batch, T, 7, STEPS, 3, 1e-2f);
}

static size_t full_params(int vocab) {
  train_options o = options(vocab, 1);
  return th_num_params(&o.cfg);
}

/* ---- mappings ------------------------------------------------------------------------ */

typedef struct mjob {
  int fails; /* ranks that saw a wrong value */
  char why[4][TRAIN_ERRLEN + 64];
} mjob;

static int mapping_rank(coll_comm_t comm, int rank, int nranks, void *arg) {
  mjob *j = arg;
  char err[TRAIN_ERRLEN];
  train_backend *b = train_backend_coll(comm, 0, err);
  if (!b) return 2;
  enum { N = 1000 };
  static float x[N];
  float sum = (float)(nranks * (nranks - 1) / 2); /* 0 + 1 + ... + (T-1) */
  int bad = 0;
#define EXPECT(op, want)                                                                       \
  for (int i = 0; i < N; i++) x[i] = (float)rank;                                              \
  if (op(b, x, N) != 0) {                                                                      \
    snprintf(j->why[rank], sizeof j->why[rank], "%s: %s", #op, b->err);                        \
    bad = 1;                                                                                   \
  }                                                                                            \
  for (int i = 0; i < N && !bad; i++)                                                          \
    if (x[i] != (want)) {                                                                      \
      snprintf(j->why[rank], sizeof j->why[rank], "%s: x[%d] = %g, expected %g", #op, i, x[i], \
               (double)(want));                                                                \
      bad = 1;                                                                                 \
    }
  EXPECT(train_tp_f_forward, (float)rank)  /* identity */
  EXPECT(train_tp_f_backward, sum)         /* all-reduce */
  EXPECT(train_tp_g_forward, sum)          /* all-reduce */
  EXPECT(train_tp_g_backward, (float)rank) /* identity */
#undef EXPECT
  if (bad) __atomic_add_fetch(&j->fails, 1, __ATOMIC_SEQ_CST);
  b->destroy(b);
  return 0;
}

Test(tp, mappings_input_is_rank, .timeout = 30) {
  for (int t = 2; t <= 4; t += 2) {
    mjob *j = th_shared_alloc(sizeof *j);
    char why[256];
    int rc = coll_launch_local(t, mapping_rank, j, 20000, why, sizeof why);
    cr_assert_eq(rc, 0, "T=%d: %s", t, why);
    for (int r = 0; r < t; r++) cr_assert(j->why[r][0] == 0, "T=%d rank %d: %s", t, r, j->why[r]);
    cr_assert_eq(j->fails, 0);
    munmap(j, sizeof *j);
  }
}

/* ---- a T x D grid of ranks ------------------------------------------------------------ */

typedef struct job {
  int tp, dp, ddp, steps, vocab, sp;
  int zero;    /* > 0: FSDP at this ZeRO stage along D instead of DDP */
  int grads;   /* 1: one forward/backward, report the gradients */
  size_t np;   /* floats per rank slot (the full model's count: a slice is smaller) */
  float *loss; /* [rank][step] */
  float *norm; /* [rank][step] gradient norm before clipping */
  float *g;    /* [rank][np] local gradients */
  char why[8][TRAIN_ERRLEN];
} job;

static int grid_rank(coll_comm_t comm, int rank, int nranks, void *arg) {
  job *j = arg;
  char *err = j->why[rank];
  int rc = 2;
  train_backend *w = train_backend_coll(comm, 0, err), *tpb = NULL, *dpb = NULL;
  train_session *s = NULL;
  train_ddp *d = NULL;
  train_fsdp *f = NULL;
  if (!w) return 2;
  /* TP groups of consecutive ranks, DP groups across them (tp.h) */
  if (w->split(w, train_dp_rank_of(rank, j->tp), rank, &tpb) != 0 ||
      w->split(w, train_tp_rank_of(rank, j->tp), rank, &dpb) != 0) {
    memcpy(err, w->err, TRAIN_ERRLEN); /* says which call failed */
    goto out;
  }
  train_options o = options(j->vocab, B);
  o.tp = j->tp;
  o.tp_rank = tpb->rank;
  o.sp = j->sp;
  s = train_session_create(&o, err);
  if (!s || train_tp_attach(s, tpb, err) != 0) goto out;
  if (j->zero) {
    train_fsdp_options fo = train_fsdp_options_default();
    fo.zero = j->zero;
    f = train_fsdp_create(s, dpb, &fo, err);
    if (!f) goto out;
  } else if (j->ddp) {
    train_ddp_options dopt = train_ddp_options_default();
    dopt.first_bucket_bytes = 16 << 10;
    dopt.bucket_bytes = 32 << 10;
    d = train_ddp_create(s, dpb, &dopt, err);
    if (!d) goto out;
  }
  train_model *m = train_session_model(s);
  if (j->grads) {
    int *in = malloc(B * T * sizeof(int)), *tg = malloc(B * T * sizeof(int));
    train_loader_state pos = {.seed = o.seed};
    train_data_next_batch(train_session_data(s), &pos, B, T, in, tg);
    j->loss[rank] = train_forward(m, in, tg, B, T);
    train_zero_grad(m);
    train_backward(m);
    train_copy_grads_to_host(m, j->g + (size_t)rank * j->np);
    free(in);
    free(tg);
  }
  for (int i = 0; !j->grads && i < j->steps; i++) {
    train_step_stats ss;
    if (f) {
      train_fsdp_stats st;
      if (train_fsdp_step(f, &st, err) != 0) goto out;
      ss = st.step;
    } else if (d) {
      train_ddp_stats st;
      if (train_ddp_step(d, &st, err) != 0) goto out;
      ss = st.step;
    } else {
      ss = train_session_step(s);
    }
    j->loss[(size_t)rank * j->steps + i] = ss.loss;
    j->norm[(size_t)rank * j->steps + i] = ss.grad_norm;
  }
  if (train_tp_status(s, err) != 0) goto out;
  rc = 0;
out:
  train_fsdp_free(f);
  train_ddp_free(d);
  train_tp_detach(s);
  train_session_free(s);
  if (dpb) dpb->destroy(dpb);
  if (tpb) tpb->destroy(tpb);
  w->destroy(w);
  (void)nranks;
  return rc;
}

static job *run_grid_z(int tp, int dp, int ddp, int grads, int vocab, int sp, int zero) {
  job *j = th_shared_alloc(sizeof *j);
  j->zero = zero;
  j->sp = sp;
  j->tp = tp;
  j->dp = dp;
  j->ddp = ddp;
  j->grads = grads;
  j->steps = grads ? 1 : STEPS;
  j->vocab = vocab;
  j->np = full_params(vocab);
  int n = tp * dp;
  j->loss = th_shared_alloc((size_t)n * j->steps * sizeof(float));
  j->norm = th_shared_alloc((size_t)n * j->steps * sizeof(float));
  j->g = th_shared_alloc((size_t)n * j->np * sizeof(float));
  th_launch(n, grid_rank, j, 60000, j->why, "T=%d D=%d", tp, dp);
  return j;
}

static job *run_grid(int tp, int dp, int ddp, int grads, int vocab, int sp) {
  return run_grid_z(tp, dp, ddp, grads, vocab, sp, 0);
}

static void free_grid(job *j) {
  int n = j->tp * j->dp;
  munmap(j->norm, (size_t)n * j->steps * sizeof(float));
  munmap(j->loss, (size_t)n * j->steps * sizeof(float));
  munmap(j->g, (size_t)n * j->np * sizeof(float));
  munmap(j, sizeof *j);
}

/* One process on the global batch (D*B rows): STEPS losses. */
static void reference_run(int vocab, int dp, float *out, float *norm) {
  char err[TRAIN_ERRLEN];
  train_options o = options(vocab, dp * B);
  train_session *s = train_session_create(&o, err);
  cr_assert(s, "%s", err);
  for (int i = 0; i < STEPS; i++) {
    train_step_stats st = train_session_step(s);
    out[i] = st.loss;
    if (norm) norm[i] = st.grad_norm;
  }
  train_session_free(s);
}

static void reference_losses(int vocab, int dp, float *out) { reference_run(vocab, dp, out, NULL); }

static void check_parity(int tp, int dp, int ddp, int vocab, int sp) {
  float ref[STEPS];
  reference_losses(vocab, dp, ref);
  job *j = run_grid(tp, dp, ddp, 0, vocab, sp);
  double worst = 0.0;
  for (int r = 0; r < tp * dp; r++)
    for (int i = 0; i < STEPS; i++) {
      float l = j->loss[(size_t)r * STEPS + i];
      double rel = fabs((double)l - ref[i]) / fabs((double)ref[i]);
      worst = rel > worst ? rel : worst;
      cr_assert(rel <= LOSS_RELTOL,
                "T=%d D=%d%s%s rank %d step %d: loss %.7f, one process %.7f (relative "
                "%.2e > %.0e)",
                tp, dp, ddp ? " DDP" : "", sp ? " SP" : "", r, i + 1, l, ref[i], rel, LOSS_RELTOL);
    }
  cr_log_info("T=%d D=%d%s%s: %d steps, worst relative loss difference %.2e (last loss "
              "%.6f)\n",
              tp, dp, ddp ? " DDP" : "", sp ? " SP" : "", STEPS, worst, ref[STEPS - 1]);
  free_grid(j);
}

Test(tp, parity_t2, .timeout = 60) { check_parity(2, 1, 0, 257, 0); }
Test(tp, parity_t4, .timeout = 60) { check_parity(4, 1, 0, 258, 0); }
Test(tp, parity_t2_ddp2, .timeout = 60) { check_parity(2, 2, 1, 256, 0); }
Test(tp, parity_t2_sp, .timeout = 60) { check_parity(2, 1, 0, 257, 1); }
Test(tp, parity_t4_sp, .timeout = 60) { check_parity(4, 1, 0, 258, 1); }
Test(tp, parity_t2_sp_ddp2, .timeout = 60) { check_parity(2, 2, 1, 256, 1); }

/* One backward on T ranks, gathered, against one process: tensor by tensor. */
static void check_grads(int tp, int vocab, int sp) {
  char err[TRAIN_ERRLEN];
  train_options o = options(vocab, B);
  train_session *s = train_session_create(&o, err);
  cr_assert(s, "%s", err);
  train_model *m = train_session_model(s);
  size_t np = train_num_params(m);
  int *in = malloc(B * T * sizeof(int)), *tg = malloc(B * T * sizeof(int));
  train_loader_state pos = {.seed = o.seed};
  train_data_next_batch(train_session_data(s), &pos, B, T, in, tg);
  float ref_loss = train_forward(m, in, tg, B, T);
  train_zero_grad(m);
  train_backward(m);
  float *ref = malloc(np * sizeof(float));
  train_copy_grads_to_host(m, ref);

  job *j = run_grid(tp, 1, 0, 1, vocab, sp);
  cr_assert_eq(j->np, np);
  /* gathered: every rank's slice in its place (the replicated tensors from rank 0, the
   * last written); then each rank's own unshard must not change it, i.e. every rank holds
   * the same replicated gradients */
  float *full = calloc(np, sizeof(float)), *mine = malloc(np * sizeof(float));
  for (int r = tp - 1; r >= 0; r--)
    cr_assert_eq(train_tp_unshard(&o.cfg, tp, r, j->g + (size_t)r * np, full, err), 0, "%s", err);
  for (int r = 1; r < tp; r++) {
    memcpy(mine, full, np * sizeof(float));
    train_tp_unshard(&o.cfg, tp, r, j->g + (size_t)r * np, mine, err);
    cr_assert(memcmp(mine, full, np * sizeof(float)) == 0,
              "T=%d: rank %d's gradients of the replicated tensors differ from rank 0's", tp, r);
  }
  for (int r = 0; r < tp; r++)
    cr_assert(fabs(j->loss[r] - ref_loss) <= LOSS_RELTOL * fabs(ref_loss),
              "T=%d rank %d: loss %.7f, one process %.7f", tp, r, j->loss[r], ref_loss);
  double worst = 0.0;
  const char *worst_name = "";
  for (int i = 0; i < train_num_tensors(m); i++) {
    const train_param *p = train_param_info(m, i);
    double rel = th_relerr(full + p->offset, ref + p->offset, p->numel);
    cr_assert(rel <= GRAD_RELTOL,
              "T=%d%s: gradient of %s differs from one process's by "
              "%.2e relative (> %.0e)",
              tp, sp ? " SP" : "", p->name, rel, GRAD_RELTOL);
    if (rel > worst) {
      worst = rel;
      worst_name = p->name;
    }
  }
  cr_log_info("T=%d%s: %d gradient tensors within %.2e relative (worst %s)\n", tp, sp ? " SP" : "",
              train_num_tensors(m), worst, worst_name);
  free(full);
  free(mine);
  free(ref);
  free(in);
  free(tg);
  free_grid(j);
  train_session_free(s);
}

Test(tp, gradients_t2, .timeout = 30) { check_grads(2, 257, 0); }
Test(tp, gradients_t4, .timeout = 30) { check_grads(4, 258, 0); }
Test(tp, gradients_t2_sp, .timeout = 30) { check_grads(2, 257, 1); }
Test(tp, gradients_t4_sp, .timeout = 30) { check_grads(4, 258, 1); }

/* shard then unshard is the identity on the single-process layout */
Test(tp, shard_unshard_roundtrip, .timeout = 10) {
  char err[TRAIN_ERRLEN];
  train_options o = options(258, 1);
  size_t np = full_params(258);
  float *full = malloc(np * sizeof(float)), *back = calloc(np, sizeof(float));
  float *loc = calloc(np, sizeof(float));
  for (size_t i = 0; i < np; i++) full[i] = (float)i;
  for (int r = 0; r < 4; r++) {
    cr_assert_eq(train_tp_shard(&o.cfg, 4, r, full, loc, err), 0, "%s", err);
    cr_assert_eq(train_tp_unshard(&o.cfg, 4, r, loc, back, err), 0, "%s", err);
  }
  cr_assert(memcmp(full, back, np * sizeof(float)) == 0, "shard/unshard lost values");
  cr_assert_neq(train_tp_shard(&o.cfg, 3, 0, full, loc, err), 0);
  cr_assert(strstr(err, "heads"), "%s", err);
  free(full);
  free(back);
  free(loc);
}

/* ---- the CLI ---------------------------------------------------------------------------- */

#define SMALL                                                          \
  "--layers 2 --channels 32 --heads 4 --seq 16 --batch 2 --threads 1 " \
  "--eval-every 0 --sample-len 0"

/* Refused: exit status 1, one line on stderr starting "coll-train:", nothing on stdout,
 * nothing written in the directory (the run was asked for a plot there). */
static void refused(const char *args, const char *needle) {
  char *dir = th_tmpdir();
  cr_assert(dir);
  char *base = th_fmt("%s/../%s", dir, strrchr(dir, '/') + 1); /* beside dir, not in it */
  char *cmd = th_fmt("timeout 30 %s " SMALL " --steps 2 --plot %s/loss.svg %s", th_cli(), dir,
                     args);
  th_expect_refused(cmd, base, args, needle);
  cr_assert_eq(th_count_entries(dir), 0, "%s: wrote into %s", args, dir);
  th_rmrf(dir);
  free(base), free(cmd), free(dir);
}

Test(tp, cli_bad_input, .timeout = 60) {
  refused("--heads 3 --channels 48 --tp 2", "heads");
  refused("--tp 2 --ranks 3 --parallel ddp", "multiple of --tp");
  refused("--sp", "--sp needs --tp");
  refused("--tp 2 --ranks 4", "--parallel ddp");
  refused("--tp 4 --sp --batch 1 --seq 3 --max-seq 8", "multiple of --tp");
}

/* coll-train --tp 2 and --tp 2 --ranks 4 --parallel ddp print one process's losses. */
static char *final_line(const char *args) {
  char *dir = th_tmpdir(), *base = th_fmt("%s/run", dir);
  char *cmd = th_fmt("timeout 60 %s " SMALL " --steps 5 --quiet %s", th_cli(), args);
  char *o = th_run_ok(cmd, base);
  char *d = strstr(o, "final loss");
  cr_assert(d, "%s: no final loss in %s", args, o);
  char *line = strndup(d, 11 + strcspn(d + 11, " |\n")); /* "final loss X" */
  th_rmrf(dir);
  free(o), free(base), free(cmd), free(dir);
  return line;
}

Test(tp, cli_losses_match_one_process, .timeout = 60) {
  char *one = final_line("--batch 4");
  char *tp2 = final_line("--batch 4 --tp 2");
  char *grid = final_line("--batch 2 --tp 2 --ranks 4 --parallel ddp");
  char *sp = final_line("--batch 4 --tp 4 --sp");
  cr_log_info("one process: %s | --tp 2: %s | --tp 2 x ddp 2: %s | --tp 4 --sp: %s\n", one, tp2,
              grid, sp);
  cr_assert_str_eq(tp2, one);
  cr_assert_str_eq(grid, one);
  cr_assert_str_eq(sp, one);
  free(one), free(tp2), free(grid), free(sp);
}

/* ---- a killed rank ---------------------------------------------------------------------- */

/* Ranks started as a launcher would (env_job.h); rank 3 is killed once training is under
 * way; the others must exit with status 1 and a sentence naming themselves
 * ("coll-train: rank r of 4:"), within 10 s. */
Test(tp, killed_rank_in_a_2x2_grid_fails_the_others, .timeout = 60) {
  env_job_kill_under_way(4,
                         "--layers 2 --channels 32 --heads 4 --max-seq 32 --seq 16 "
                         "--batch 2 --threads 1 --eval-every 0 --steps 1000000 --tp 2 "
                         "--ranks 4 --parallel ddp",
                         3, 10.0, 1, "coll-train: ");
}

/* --trace with --tp: each rank's in-block all-reduces (g attn, g mlp, f attn, f mlp). */
Test(tp, cli_trace_shows_the_in_block_all_reduces, .timeout = 60) {
  char *dir = th_tmpdir();
  char *base = th_fmt("%s/run", dir), *tr = th_fmt("%s/t.json", dir);
  char *cmd = th_fmt("timeout 60 %s " SMALL " --steps 2 --quiet --tp 2 --trace %s", th_cli(), tr);
  free(th_run_ok(cmd, base));
  char *t = th_read(tr, NULL);
  cr_assert(t, "no trace written");
  const char *names[] = {"\"g attn\"", "\"g mlp\"",     "\"f attn\"",
                         "\"f mlp\"",  "\"loss sums\"", "\"rank 1\""};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    cr_assert(strstr(t, names[i]), "the trace has no %s", names[i]);
  th_rmrf(dir);
  free(t), free(base), free(tr), free(cmd), free(dir);
}

/* The grid over Open MPI (MPI_Comm_split) prints the same final loss as one process. */
Test(tp, cli_over_open_mpi, .timeout = 120) {
  if (!train_backend_mpi_built())
    cr_skip_test("this build has no Open MPI backend (install libopenmpi-dev)");
  if (system("command -v mpirun.openmpi >/dev/null 2>&1") != 0)
    cr_skip_test("mpirun.openmpi is not installed (Debian: openmpi-bin)");
  char *one = final_line("--batch 4");
  char *grid = final_line("--batch 2 --tp 2 --sp --ranks 4 --parallel ddp --backend mpi");
  cr_log_info("one process: %s | --tp 2 --sp x ddp 2 over Open MPI: %s\n", one, grid);
  cr_assert_str_eq(grid, one);
  free(one), free(grid);
}

/* ---- T x D with FSDP along D ----------------------------------------------------------- */

/* T = 2 x D = 2, FSDP at each ZeRO stage over each TP rank's slice: the losses and the
 * global gradient norms (before clipping; clipping at 1.0 is active in the first steps, so
 * a norm counted wrongly — replicated tensors twice, split ones from one TP rank only —
 * changes the update) follow one process on the same global batch within 1e-5. */
static void check_fsdp_parity(int zero) {
  float ref[STEPS], rnorm[STEPS];
  reference_run(257, 2, ref, rnorm);
  job *j = run_grid_z(2, 2, 1, 0, 257, 0, zero);
  double worst = 0.0, worst_norm = 0.0;
  int clipped = 0;
  for (int i = 0; i < STEPS; i++) clipped += rnorm[i] > 1.0f;
  cr_assert(clipped > 0, "no step clipped: the test would not see the norm's combination");
  for (int r = 0; r < 4; r++)
    for (int i = 0; i < STEPS; i++) {
      float l = j->loss[(size_t)r * STEPS + i], nm = j->norm[(size_t)r * STEPS + i];
      double rel = fabs((double)l - ref[i]) / fabs((double)ref[i]);
      double reln = fabs((double)nm - rnorm[i]) / fabs((double)rnorm[i]);
      worst = rel > worst ? rel : worst;
      worst_norm = reln > worst_norm ? reln : worst_norm;
      cr_assert(rel <= LOSS_RELTOL,
                "T=2 x FSDP ZeRO-%d D=2 rank %d step %d: loss %.7f, "
                "one process %.7f (relative %.2e)",
                zero, r, i + 1, l, ref[i], rel);
      cr_assert(reln <= LOSS_RELTOL,
                "T=2 x FSDP ZeRO-%d D=2 rank %d step %d: gradient "
                "norm %.7f, one process %.7f (relative %.2e)",
                zero, r, i + 1, nm, rnorm[i], reln);
    }
  cr_log_info("T=2 x FSDP ZeRO-%d D=2: %d steps (%d clipped), worst relative loss "
              "difference %.2e, gradient norm %.2e\n",
              zero, STEPS, clipped, worst, worst_norm);
  free_grid(j);
}

Test(tp, parity_t2_fsdp2_zero1, .timeout = 60) { check_fsdp_parity(1); }
Test(tp, parity_t2_fsdp2_zero2, .timeout = 60) { check_fsdp_parity(2); }
Test(tp, parity_t2_fsdp2_zero3, .timeout = 60) { check_fsdp_parity(3); }
