/*
 * test_moe.c — the mixture of experts (model/moe.c) and expert parallelism (parallel/ep.c):
 *  - gradients: the MoE block's backward (router, experts, gates, the auxiliary loss)
 *    against central finite differences of cross-entropy + auxiliary loss, dropless and
 *    with a capacity that drops;
 *  - one MoE block, forward and backward, at EP = 2 and 4 against one process on the same
 *    rows: its outputs, input gradients and expert gradients bitwise equal;
 *  - parity: E = 4 and 8, top-1 and top-2, dropless, 20 steps, against --parallel none
 *    with the global batch: DP 2 with every expert on each rank (EP = 1), EP = 2 on 2
 *    ranks, EP = 4 on 4 ranks, and EP 2 x DP 2 on 4 ranks (experts synced over the
 *    2-rank expert-data-parallel group), and the DP 2 and EP 2 x DP 2 grids with
 *    --parallel fsdp --zero 1: every step's loss within 1e-5 relative. The
 *    expert matmuls run over the same rows in the same order as one process's; the dense
 *    part is DDP's (its gradient sums cut by rank), so a few ulps move — the bitwise runs
 *    are counted in the log. A misrouted row, a wrong gradient scale or a missed sync
 *    moves the loss by >= 1e-3.
 *  - the same runs over Open MPI: libcoll's bits at 2 ranks, within 1e-5 at 4 (when the
 *    MPI backend is built);
 *  - capacity mode: EP = 2 against DP 2 with every expert local (the same capacity per
 *    rank, so the same drops), and the drops reported;
 *  - the auxiliary loss lowers the max/mean expert load at the end of a short run;
 *  - --plan and --explain print the all-to-all bytes of the formula;
 *  - bad input, refused with one line and exit status 1.
 */
#include <criterion/criterion.h>

#include "comm/backend.h"
#include "parallel/strategy.h"
#include "common/train_test.h"
#include "model/model.h"
#include "model/moe.h"
#include "train.h"

#define MODEL                                                                         \
  "--layers 2 --channels 32 --heads 4 --vocab 256 --max-seq 32 --seq 16 --threads 1 " \
  "--eval-every 0 --sample-len 0 --seed 7 --lr 1e-2 --warmup 3"
#define STEPS 20
#define RELTOL 1e-5

/* ---- gradients ------------------------------------------------------------------------ */

/* cross-entropy + the auxiliary loss of one forward */
static double objective(train_model *m, const int *in, const int *tg, int B, int T) {
  double ce = train_forward(m, in, tg, B, T);
  train_moe_stats st;
  train_moe_stats_read(m, &st);
  return ce + st.aux;
}

static void check_gradients(float capacity) {
  train_config cfg = {.vocab = 64, .max_seq = 8, .layers = 1, .channels = 16, .heads = 2};
  int B = 2, T = 8, N = B * T;
  char err[TRAIN_ERRLEN];
  train_split sp = {.experts = 4, .topk = 2, .capacity = capacity, .aux_coef = 0.5f};
  train_model *m = train_model_create_split(&cfg, B, T, TRAIN_DEVICE_CPU, 1, 11, &sp, err);
  cr_assert(m, "%s", err);
  int in[16], tg[16];
  for (int i = 0; i < N; i++) in[i] = (i * 7 + 3) % 64, tg[i] = (i * 5 + 1) % 64;
  /* larger router and expert weights than init's, so every part has a visible gradient
   * (the input of the block is checked through attn.qkv: the embeddings' finite
   * differences of 1e-2 move tokens across the top-k boundary) */
  float *p = train_params(m);
  for (int i = 0; i < train_num_tensors(m); i++) {
    const train_param *t = train_param_info(m, i);
    if (strstr(t->name, "mlp.") && t->ndim == 2)
      for (size_t k = 0; k < t->numel; k++) p[t->offset + k] *= 20.0f;
  }
  objective(m, in, tg, B, T);
  train_zero_grad(m);
  train_backward(m);
  float *g = train_grads(m);
  static const char *names[] = {"h.0.mlp.router.w", "h.0.mlp.fc.w",   "h.0.mlp.fc.b",
                                "h.0.mlp.proj.w",   "h.0.mlp.proj.b", "h.0.ln2.w",
                                "h.0.attn.qkv.w"};
  int checked = 0;
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
    const train_param *t = NULL;
    for (int i = 0; i < train_num_tensors(m); i++)
      if (!strcmp(train_param_info(m, i)->name, names[k])) t = train_param_info(m, i);
    cr_assert(t, "no tensor %s", names[k]);
    /* its 4 largest gradients */
    size_t picked[4];
    for (int rep = 0; rep < 4; rep++) {
      size_t best = 0;
      float bg = -1.0f;
      for (size_t j = 0; j < t->numel; j++) {
        int taken = 0;
        for (int q = 0; q < rep; q++) taken |= picked[q] == j;
        if (!taken && fabsf(g[t->offset + j]) > bg) {
          bg = fabsf(g[t->offset + j]);
          best = j;
        }
      }
      picked[rep] = best;
      size_t at = t->offset + best;
      float keep = p[at], h = 1e-2f;
      p[at] = keep + h;
      double up = objective(m, in, tg, B, T);
      p[at] = keep - h;
      double dn = objective(m, in, tg, B, T);
      p[at] = keep;
      double fd = (up - dn) / (2.0 * h), an = g[at];
      cr_expect(fabs(fd - an) <= 2e-3 + 3e-2 * fabs(an), "%s[%zu]: backward %.6g, finite diff %.6g",
                t->name, best, an, fd);
      checked++;
    }
  }
  cr_log_info("moe gradients (capacity %g): %d checked", (double)capacity, checked);
  train_model_free(m);
}

Test(moe, gradients_match_finite_differences, .timeout = 60) { check_gradients(0.0f); }
Test(moe, gradients_with_capacity_drops, .timeout = 60) { check_gradients(0.75f); }

/* ---- the experts see one process's rows, in its order --------------------------------------
 * One MoE block, forward and backward, on the same rows: the N_g rows of one process
 * against X ranks of expert parallelism holding N_g/X rows each (rank-major), the loss
 * scaled by 1/X there so the auxiliary loss's gradient is one process's per row. Every
 * expert's matmuls must then run over the same rows in the same order: each rank's block
 * output and input gradient rows, and its expert gradients, bitwise equal to one
 * process's. (Through the whole model they are not: OpenBLAS's sgemm rounds a row
 * differently at another row count for some shapes — the LM head's backward, K = V — so
 * the rows reaching a block already differ in the last bit.) */

typedef struct bits_job {
  int X, N, C;
  size_t np_rank;
  float *grads, *out, *dinp; /* X * np_rank; N*C each, rank r's rows at r*N/X */
} bits_job;

static train_split bits_split(int X, int rank) {
  train_split sp = {.experts = 8, .topk = 2, .aux_coef = 0.01f, .ep = X, .ep_rank = rank};
  return sp;
}
static const train_config bits_cfg = {
    .vocab = 256, .max_seq = 16, .layers = 1, .channels = 32, .heads = 4};

/* row t of the block's input and of its output gradient: the same on every layout */
static void bits_rows(float *x, float *dout, int t0, int n, int C) {
  for (int t = 0; t < n; t++)
    for (int c = 0; c < C; c++) {
      int g = t0 + t;
      x[(size_t)t * C + c] = sinf(0.37f * g + 0.11f * c) + 0.05f * (float)(c % 7);
      dout[(size_t)t * C + c] = 1e-3f * cosf(0.23f * g - 0.19f * c);
    }
}

/* forward and backward of block 0 on rows [t0, +n) through the model's layer operations */
static void bits_pass(train_model *m, int t0, int n, float *out, float *dinp, float scale) {
  int C = m->cfg.channels;
  float *x = malloc(sizeof(float) * n * C), *dout = malloc(sizeof(float) * n * C);
  bits_rows(x, dout, t0, n, C);
  m->have_targets = 1; /* the router's statistics over the group, the auxiliary loss */
  train_set_loss_scale(m, scale);
  train_zero_grad(m);
  m->layer_ops->moe_forward(m, 0, out, x, n);
  memset(dinp, 0, sizeof(float) * n * C);
  m->layer_ops->moe_backward(m, 0, dinp, dout, x, n);
  free(x), free(dout);
}

static int bits_rank(coll_comm_t comm, int rank, int nranks, void *arg) {
  bits_job *j = arg;
  char err[TRAIN_ERRLEN];
  int n = j->N / nranks;
  train_options o = th_options(bits_cfg, n / 8, 8, 7, 20, 3, 1e-2f);
  train_split sp = bits_split(nranks, rank);
  o.experts = sp.experts, o.topk = sp.topk, o.aux_coef = sp.aux_coef, o.ep = nranks;
  o.ep_rank = rank;
  train_session *s = train_session_create(&o, err);
  train_backend *b = s ? train_backend_coll(comm, 0, err) : NULL;
  if (!b) return th_rank_fail(rank, "start", err, 2);
  train_grid g;
  if (train_grid_create(&g, b, 1, err) != 0 || train_grid_add_ep(&g, nranks, err) != 0)
    return th_rank_fail(rank, "grid", err, 3);
  train_parallel_options po = {.data = "ddp", .accum = 1, .overlap = 1, .experts = o.experts};
  train_parallel *p = train_parallel_create(s, &g, &po, err);
  if (!p) return th_rank_fail(rank, "strategy", err, 4);
  train_model *m = train_session_model(s);
  size_t at = (size_t)rank * n * j->C;
  bits_pass(m, rank * n, n, j->out + at, j->dinp + at, 1.0f / (float)nranks);
  int rc = p->ops->status(p, err) == 0 ? 0 : th_rank_fail(rank, "pass", err, 5);
  train_copy_grads_to_host(m, j->grads + (size_t)rank * j->np_rank);
  train_parallel_free(p);
  train_grid_free(&g);
  b->destroy(b);
  train_session_free(s);
  return rc;
}

static void expert_bits(int X) {
  char err[TRAIN_ERRLEN];
  int N = 64, C = bits_cfg.channels;
  train_split s1 = bits_split(1, 0), sx = bits_split(X, 0);
  train_model *m1 = train_model_create_split(&bits_cfg, N / 8, 8, TRAIN_DEVICE_CPU, 1, 7, &s1, err);
  train_model *ml = m1 ? train_model_create_split(&bits_cfg, N / X / 8, 8, TRAIN_DEVICE_CPU, 1, 7,
                                                  &sx, err)
                       : NULL;
  cr_assert(ml, "%s", err);
  float *out1 = malloc(sizeof(float) * N * C), *dinp1 = malloc(sizeof(float) * N * C);
  bits_pass(m1, 0, N, out1, dinp1, 1.0f);
  bits_job *j = th_shared_alloc(sizeof *j);
  j->X = X;
  j->N = N;
  j->C = C;
  j->np_rank = train_num_params(ml);
  j->grads = th_shared_alloc((size_t)X * j->np_rank * sizeof(float));
  j->out = th_shared_alloc(sizeof(float) * N * C);
  j->dinp = th_shared_alloc(sizeof(float) * N * C);
  th_launch(X, bits_rank, j, 60000, NULL, "EP %d, one MoE block", X);
  for (size_t k = 0; k < (size_t)N * C; k++) {
    cr_assert(j->out[k] == out1[k], "EP %d: output row %zu col %zu: %a, one process %a", X, k / C,
              k % C, j->out[k], out1[k]);
    cr_assert(j->dinp[k] == dinp1[k], "EP %d: input gradient row %zu col %zu: %a, one process %a",
              X, k / C, k % C, j->dinp[k], dinp1[k]);
  }
  float *g1 = train_grads(m1);
  int experts = 0;
  for (int i = 0; i < train_num_tensors(ml); i++) {
    const train_param *lp = train_param_info(ml, i), *fp = train_param_info(m1, i);
    cr_assert_str_eq(lp->name, fp->name);
    if (!train_moe_is_expert_tensor(lp)) continue;
    for (int r = 0; r < X; r++) {
      const float *got = j->grads + (size_t)r * j->np_rank + lp->offset,
                  *want = g1 + fp->offset + (size_t)r * lp->numel;
      for (size_t k = 0; k < lp->numel; k++)
        cr_assert(got[k] == want[k], "EP %d rank %d %s[%zu]: %a, one process %a", X, r, lp->name, k,
                  got[k], want[k]);
    }
    experts++;
  }
  cr_log_info("EP %d: the block's output and input gradient rows and %d expert tensors on every "
              "rank bitwise equal to one process's\n",
              X, experts);
  munmap(j->grads, (size_t)X * j->np_rank * sizeof(float));
  munmap(j->out, sizeof(float) * N * C);
  munmap(j->dinp, sizeof(float) * N * C);
  munmap(j, sizeof *j);
  free(out1), free(dinp1);
  train_model_free(ml);
  train_model_free(m1);
}

Test(moe, expert_rows_are_one_process_bits, .timeout = 120) {
  expert_bits(2);
  expert_bits(4);
}

/* ---- parity ------------------------------------------------------------------------------- */

static int losses(const char *args, float *l, int max) {
  char *dir = th_tmpdir(), *base = th_fmt("%s/run", dir), *lf = th_fmt("%s/losses", dir);
  char *cmd = th_fmt("timeout 120 %s " MODEL " --steps %d --quiet %s --losses %s", th_cli(), STEPS,
                     args, lf);
  free(th_run_ok(cmd, base));
  int n = th_read_losses(lf, l, max);
  th_rmrf(dir);
  free(dir), free(base), free(lf), free(cmd);
  return n;
}

/* every step within RELTOL of ref; 1 when bitwise equal */
static int compare(const char *args, const float *ref, const float *got, double *worst) {
  int same = 1;
  for (int i = 0; i < STEPS; i++) {
    double rel = fabs((double)got[i] - ref[i]) / fabs((double)ref[i]);
    cr_assert(rel <= RELTOL, "%s: step %d loss %.9g, one process %.9g (rel %.3g)", args, i + 1,
              got[i], ref[i], rel);
    *worst = rel > *worst ? rel : *worst;
    same &= got[i] == ref[i];
  }
  return same;
}

Test(moe, expert_parallel_matches_one_process, .timeout = 400) {
  /* global batch 4 x 16 tokens in every case */
  static const char *grids[] = {
      "--ranks 2 --parallel ddp --batch 2", /* EP = 1: every expert on both ranks */
      "--ep 2 --batch 2",                   /* EP = 2 on 2 ranks */
      "--ep 4 --batch 1",                   /* EP = 4 on 4 ranks */
      "--ranks 4 --ep 2 --batch 1",         /* EP 2 x DP 2: expert-DP groups of 2 */
      /* ZeRO-1: AdamW's state sharded, dense over every rank, experts over expert-DP */
      "--ranks 2 --parallel fsdp --zero 1 --batch 2",
      "--ranks 4 --ep 2 --parallel fsdp --zero 1 --batch 1",
  };
  int runs = 0, bitwise = 0;
  double worst = 0.0;
  for (int E = 4; E <= 8; E += 4)
    for (int K = 1; K <= 2; K++) {
      float ref[STEPS], got[STEPS];
      char *one = th_fmt("--batch 4 --experts %d --topk %d", E, K);
      cr_assert_eq(losses(one, ref, STEPS), STEPS);
      for (size_t g = 0; g < sizeof grids / sizeof grids[0]; g++) {
        char *args = th_fmt("%s --experts %d --topk %d", grids[g], E, K);
        cr_assert_eq(losses(args, got, STEPS), STEPS, "%s: fewer than %d steps", args, STEPS);
        bitwise += compare(args, ref, got, &worst);
        runs++;
        free(args);
      }
      free(one);
    }
  cr_log_info("moe parity: %d runs, %d bitwise equal to one process, worst rel %.3g\n", runs,
              bitwise, worst);
}

Test(moe, capacity_mode_matches_data_parallel, .timeout = 200) {
  float ref[STEPS], got[STEPS];
  double worst = 0.0;
  const char *moe = "--experts 4 --topk 2 --capacity-factor 0.75 --batch 2";
  char *a = th_fmt("--ranks 2 --parallel ddp %s", moe), *b = th_fmt("--ep 2 %s", moe);
  cr_assert_eq(losses(a, ref, STEPS), STEPS);
  cr_assert_eq(losses(b, got, STEPS), STEPS);
  compare(b, ref, got, &worst);
  /* and the drops are reported on the step lines */
  char *dir = th_tmpdir(), *base = th_fmt("%s/run", dir);
  char *cmd = th_fmt("timeout 60 %s " MODEL " --steps 2 --ep 2 %s", th_cli(), moe);
  char *out = th_run_ok(cmd, base);
  cr_assert(strstr(out, "dropped "), "no drops reported: %s", out);
  th_rmrf(dir);
  free(a), free(b), free(dir), free(base), free(cmd), free(out);
}

/* The same EP runs over Open MPI (MPI_Ialltoall(v) behind the backend's all_to_all(v)):
 * the all-to-alls only move rows. */
Test(moe, mpi_backend_same_losses, .timeout = 200) {
#if defined(__SANITIZE_ADDRESS__)
  /* Open MPI's own start-up allocations are reported as leaks (the dense DDP run over
   * MPI too), and mpirun under ASan takes half a minute a run */
  cr_skip_test("Open MPI under AddressSanitizer: its own allocations are reported as leaks");
#endif
  if (!train_backend_mpi_built())
    cr_skip_test("this build has no Open MPI backend (install libopenmpi-dev)");
  if (system("command -v mpirun.openmpi >/dev/null 2>&1") != 0)
    cr_skip_test("mpirun.openmpi is not installed (Debian: openmpi-bin)");
  static const char *runs[] = {"--ep 2 --batch 2 --experts 8 --topk 2",
                               "--ranks 4 --ep 2 --batch 1 --experts 4 --topk 1 "
                               "--capacity-factor 1.5"};
  for (int k = 0; k < 2; k++) {
    float lc[STEPS], lm[STEPS];
    char *a = th_fmt("%s --backend coll", runs[k]), *b = th_fmt("%s --backend mpi", runs[k]);
    cr_assert_eq(losses(a, lc, STEPS), STEPS);
    cr_assert_eq(losses(b, lm, STEPS), STEPS);
    /* 2 ranks: a sum of two is the same whichever library adds; 4: the libraries' reduction
     * orders differ (the dense all-reduce), within the parity tolerance */
    for (int i = 0; i < STEPS; i++)
      cr_assert(k == 0 ? lc[i] == lm[i] : fabs((double)lc[i] - lm[i]) <= RELTOL * fabs(lc[i]),
                "%s: step %d loss %a over libcoll, %a over MPI", runs[k], i + 1, lc[i], lm[i]);
    free(a), free(b);
  }
}

/* ---- the auxiliary loss --------------------------------------------------------------------- */

static double load_at_end(const char *args) {
  char *dir = th_tmpdir(), *base = th_fmt("%s/run", dir);
  char *cmd = th_fmt("timeout 120 %s " MODEL " --steps 60 --quiet --batch 4 %s", th_cli(), args);
  char *out = th_run_ok(cmd, base);
  char *p = strstr(out, "mean of the last ");
  double load = 0.0;
  long w;
  cr_assert(p && sscanf(p, "mean of the last %ld steps %lf", &w, &load) == 2, "no moe line: %s",
            out);
  th_rmrf(dir);
  free(dir), free(base), free(cmd), free(out);
  return load;
}

/* At lr 3e-3 the router without the auxiliary loss sends nearly every token to the same
 * two of the 8 experts (max/mean 3.99 of at most E/K = 4); the default coefficient 0.01
 * brings it to 2.24 (docs/training.md: the same at a larger model). */
Test(moe, aux_loss_lowers_the_expert_load, .timeout = 120) {
  double off = load_at_end("--lr 3e-3 --experts 8 --topk 2 --aux-loss-coef 0");
  double on = load_at_end("--lr 3e-3 --experts 8 --topk 2");
  cr_log_info("max/mean expert load over the last 10 of 60 steps: %.3f without, %.3f with "
              "the default --aux-loss-coef 0.01\n",
              off, on);
  cr_assert(on < off - 0.5, "the auxiliary loss did not lower the load: %.3f vs %.3f", on, off);
}

/* ---- --plan and --explain ------------------------------------------------------------------- */

Test(moe, explain_states_the_dispatch_bytes, .timeout = 30) {
  char *dir = th_tmpdir(), *base = th_fmt("%s/run", dir);
  /* N = 2 x 16 tokens, K = 2, X = 2, C = 32: 4 * 2 * 32 * 1/2 * 32 * 4 = 16384 bytes of
   * rows per block, plus the counts: 2 ints to the other rank */
  char *cmd = th_fmt("%s " MODEL " --batch 2 --experts 4 --topk 2 --ep 2 --explain", th_cli());
  char *out = th_run_ok(cmd, base);
  cr_assert(strstr(out, "formula 4 x K x N x (X-1)/X x C x 4 = 16384"), "%s", out);
  cr_assert(strstr(out, "a rank sends 16392 bytes in all-to-alls"), "%s", out);
  free(cmd);
  free(out);
  cmd = th_fmt("%s " MODEL " --batch 2 --experts 4 --topk 2 --ep 2 --plan", th_cli());
  out = th_run_ok(cmd, base);
  cr_assert(strstr(out, "D=2 x EP=2: 16392 bytes of all-to-all per block"), "%s", out);
  th_rmrf(dir);
  free(dir), free(base), free(cmd), free(out);
}

/* ---- bad input ---------------------------------------------------------------------------- */

Test(moe, bad_input_is_refused_with_one_line, .timeout = 60) {
  static const struct {
    const char *args, *needle;
  } cases[] = {
      {"--experts 6 --ep 4", "--experts must be a multiple of --ep"},
      {"--experts 4 --topk 5", "--topk 5"},
      {"--experts 4 --topk 0", "--topk 0"},
      {"--experts 4 --ep 2 --ranks 3", "--ranks 3 is not a multiple of --ep 2"},
      {"--experts 4 --capacity-factor 0", "--capacity-factor 0: must be above 0"},
      {"--experts 4 --capacity-factor -1", "--capacity-factor -1: must be above 0"},
      {"--topk 2", "need --experts"},
      {"--ep 2", "need --experts"},
      {"--experts 4 --device cuda", "CPU model only"},
      {"--experts 4 --tp 2", "--experts with --tp or --pp"},
      {"--experts 4 --pp 2", "--experts with --tp or --pp"},
      {"--experts 4 --dtype bf16", "--dtype bf16"},
      {"--experts 4 --recompute full", "--recompute"},
      {"--experts 4 --ranks 2 --parallel fsdp", "--parallel fsdp needs --zero 1"},
      {"--experts 4 --ranks 2 --parallel fsdp --zero 2", "--parallel fsdp needs --zero 1"},
      {"--experts 4 --ranks 2 --parallel ddp --accum 2", "--accum"},
      {"--experts 4 --ckpt-dir ck", "checkpoints of mixture-of-experts models"},
      {"--experts 4 --aux-loss-coef -1", "--aux-loss-coef"},
      {"--experts 4 --cp 2 --ranks 2 --parallel ddp", "--experts with --cp"},
  };
  char *dir = th_tmpdir(), *base = th_fmt("%s/run", dir);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *cmd = th_fmt("cd '%s' && timeout 30 %s " MODEL " --batch 2 --steps 2 %s", dir, th_cli(),
                       cases[i].args);
    th_expect_refused(cmd, base, cases[i].args, cases[i].needle);
    free(cmd);
  }
  cr_assert_eq(th_count_entries(dir), 0, "refused runs left files behind");
  th_rmrf(dir);
  free(dir), free(base);
}
