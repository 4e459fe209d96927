/*
 * test_fsdp.c — fully sharded training (fsdp.c) against the single-process trainer.
 *
 *  - parity: for N = 2, 3, 4 (3 exercises the padding: no unit of this model is a multiple
 *    of 3) and ZeRO-1, 2, 3, N forked ranks over libcoll, each on its B-row slice, follow
 *    one process on the global batch N*B (same seed, same data) for STEPS steps: every
 *    loss within LOSS_RELTOL relative, every gradient norm within GNORM_RELTOL, and the
 *    gathered final parameters within PARAM_RELTOL (relative L2) and PARAM_TOL (per
 *    element). Ranks other than 0 start from other seeds: rank 0's broadcast must win.
 *  - --accum 2 on 2 ranks equals one process on 4 micro-batches' worth of rows.
 *  - determinism: the same job run twice gives bitwise the same losses and parameters.
 *
 * Tolerance. The sharded step computes the same mathematics as DDP in a different order
 * (per-rank row sums averaged by the reduce-scatter, the global norm summed from shard
 * partial sums in fp32); test_ddp.c explains why AdamW turns ulp-level gradient
 * differences into parameter differences up to ~lr for elements whose gradient is at the
 * level of rounding noise. Measured here (20 steps, lr 3e-3, N = 2, 3, 4, all stages):
 * losses within 1.2e-7 relative, final parameters within 8e-7 relative L2 and 4.4e-6 per
 * element; the tolerances (1e-5, the issue's) leave 2x on the worst element.
 */
#include <criterion/criterion.h>

#include <coll_launch.h>
#include <errno.h>
#include <sys/mman.h>

#include "parallel/fsdp.h"
#include "parallel/planner.h"
#include "common/train_test.h"
#include "train.h"

#define B 2
#define T 16
#define STEPS 20
#define LOSS_RELTOL 1e-5
#define GNORM_RELTOL 1e-4
#define PARAM_RELTOL 1e-5
#define PARAM_TOL 1e-5

static train_options small_options(int batch, uint64_t seed) {
  train_config cfg = {.vocab = 256, .max_seq = 16, .layers = 2, .channels = 32, .heads = 2};
  return th_options(cfg, batch, T, seed, STEPS, 3, 3e-3f);
}

typedef struct job {
  int nranks, steps, accum, zero;
  size_t np;
  float *params;            /* [rank][np] gathered after the last step */
  float *loss;              /* [rank][step] */
  float *norm;              /* [rank][step] */
  double measured, counted; /* rank 0: mean bytes sent per step (trace counters, formulas) */
} job;

static size_t count_params(void) {
  train_options o = small_options(B, 1);
  return th_num_params(&o.cfg);
}

static job *job_new(int nranks, int zero, int accum) {
  job *j = th_shared_alloc(sizeof *j);
  j->nranks = nranks;
  j->steps = STEPS;
  j->accum = accum;
  j->zero = zero;
  j->np = count_params();
  j->params = th_shared_alloc((size_t)nranks * j->np * sizeof(float));
  j->loss = th_shared_alloc((size_t)nranks * STEPS * sizeof(float));
  j->norm = th_shared_alloc((size_t)nranks * STEPS * sizeof(float));
  return j;
}

static void job_free(job *j) {
  munmap(j->params, (size_t)j->nranks * j->np * sizeof(float));
  munmap(j->loss, (size_t)j->nranks * STEPS * sizeof(float));
  munmap(j->norm, (size_t)j->nranks * STEPS * sizeof(float));
  munmap(j, sizeof *j);
}

static int fsdp_rank(coll_comm_t comm, int rank, int nranks, void *arg) {
  job *j = arg;
  char err[TRAIN_ERRLEN];
  (void)nranks;
  train_options o = small_options(B, 42 + 1000 * (uint64_t)rank);
  train_session *s = train_session_create(&o, err);
  train_backend *b = s ? train_backend_coll(comm, 0, err) : NULL;
  if (!b) return th_rank_fail(rank, "start", err, 2);
  train_fsdp_options fo = train_fsdp_options_default();
  fo.zero = j->zero;
  fo.accum = j->accum;
  train_fsdp *f = train_fsdp_create(s, b, &fo, err);
  if (!f) return th_rank_fail(rank, "create", err, 3);
  for (int i = 0; i < j->steps; i++) {
    train_fsdp_stats st;
    if (train_fsdp_step(f, &st, err) != 0) return th_rank_fail(rank, "step", err, 4);
    j->loss[(size_t)rank * j->steps + i] = st.step.loss;
    if (rank == 0) {
      j->measured += (double)st.measured_bytes / j->steps;
      j->counted += (double)st.sent_bytes / j->steps;
    }
    j->norm[(size_t)rank * j->steps + i] = st.step.grad_norm;
  }
  int rc = train_fsdp_gather(f, j->params + (size_t)rank * j->np, NULL, NULL, NULL, err);
  if (rc == 0) rc = train_fsdp_check_identical(f, err);
  if (rc != 0) th_rank_fail(rank, "gather or check", err, 5);
  train_fsdp_free(f);
  b->destroy(b);
  train_session_free(s);
  return rc == 0 ? 0 : 5;
}

/* One process on the global batch: losses, norms and final parameters. */
static void reference(int batch, float *loss, float *norm, float *params) {
  char err[TRAIN_ERRLEN];
  train_options o = small_options(batch, 42);
  train_session *s = train_session_create(&o, err);
  cr_assert(s, "%s", err);
  for (int i = 0; i < STEPS; i++) {
    train_step_stats st = train_session_step(s);
    loss[i] = st.loss;
    norm[i] = st.grad_norm;
  }
  train_copy_params_to_host(train_session_model(s), params);
  train_session_free(s);
}

static void run_job(job *j) {
  th_launch(j->nranks, fsdp_rank, j, 60000, NULL, "N=%d ZeRO-%d job", j->nranks, j->zero);
}

static void check(job *j, const float *loss, const float *norm, const float *params) {
  size_t np = j->np;
  double worst_loss = 0.0;
  for (int r = 1; r < j->nranks; r++)
    cr_assert(memcmp(j->params, j->params + (size_t)r * np, np * sizeof(float)) == 0,
              "N=%d ZeRO-%d: rank %d gathered other parameters than rank 0", j->nranks, j->zero, r);
  for (int i = 0; i < STEPS; i++) {
    double rel = fabs((double)j->loss[i] - loss[i]) / fabs((double)loss[i]);
    cr_assert(rel <= LOSS_RELTOL, "N=%d ZeRO-%d: step %d loss %.9g, one process %.9g", j->nranks,
              j->zero, i + 1, j->loss[i], loss[i]);
    cr_assert(fabs(j->norm[i] - norm[i]) <= GNORM_RELTOL * norm[i],
              "N=%d ZeRO-%d: step %d gradient norm %.9g, one process %.9g", j->nranks, j->zero,
              i + 1, j->norm[i], norm[i]);
    worst_loss = rel > worst_loss ? rel : worst_loss;
  }
  double mx = th_max_abs_diff(j->params, params, np, NULL);
  double rel = th_relerr(j->params, params, np);
  cr_assert(rel <= PARAM_RELTOL && mx <= PARAM_TOL,
            "N=%d ZeRO-%d: final parameters differ: relative L2 %g (tolerance %g), max %g "
            "(tolerance %g)",
            j->nranks, j->zero, rel, PARAM_RELTOL, mx, PARAM_TOL);
  cr_log_info("N=%d ZeRO-%d accum %d: max loss rel diff %.3g, params rel L2 %.3g, max %.3g",
              j->nranks, j->zero, j->accum, worst_loss, rel, mx);
}

Test(fsdp, parity_with_one_process_n234_zero123, .timeout = 150) {
  size_t np = count_params();
  float loss[STEPS], norm[STEPS], *params = malloc(np * sizeof(float));
  for (int n = 2; n <= 4; n++) {
    reference(n * B, loss, norm, params);
    for (int z = 1; z <= 3; z++) {
      job *j = job_new(n, z, 1);
      run_job(j);
      check(j, loss, norm, params);
      job_free(j);
    }
  }
  free(params);
}

Test(fsdp, accum_equals_one_process, .timeout = 60) {
  size_t np = count_params();
  float loss[STEPS], norm[STEPS], *params = malloc(np * sizeof(float));
  reference(2 * 2 * B, loss, norm, params);
  for (int z = 1; z <= 3; z += 2) {
    job *j = job_new(2, z, 2);
    run_job(j);
    check(j, loss, norm, params);
    job_free(j);
  }
  free(params);
}

Test(fsdp, same_job_twice_is_bitwise_identical, .timeout = 60) {
  job *a = job_new(3, 3, 1), *c = job_new(3, 3, 1);
  run_job(a);
  run_job(c);
  cr_assert(memcmp(a->loss, c->loss, STEPS * sizeof(float)) == 0,
            "two identical ZeRO-3 jobs gave different losses");
  cr_assert(memcmp(a->params, c->params, a->np * sizeof(float)) == 0,
            "two identical ZeRO-3 jobs gave different parameters");
  job_free(a);
  job_free(c);
}

/* Acceptance 3: the bytes each rank moves per step, read from libcoll's trace counters
 * (the bytes_in of every step it ran for this rank: a ring's, or the direct path's loads
 * from each peer), equal the planner's ring formula within the padding (the planner
 * counts padded shards too; the loss and norm all-reduces are a few bytes).  Once with
 * the ring forced, once with the tuner's own choice (direct reads at these sizes). */
Test(fsdp, bytes_sent_measured_by_libcoll_equal_the_plan, .timeout = 90) {
  char err[TRAIN_ERRLEN];
  int cases[][3] = {{2, 1, 1}, {3, 1, 1}, {3, 2, 1}, {3, 3, 1}, {4, 3, 1}, {3, 3, 0}, {4, 3, 0}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int n = cases[c][0], z = cases[c][1];
    if (cases[c][2])
      setenv("COLL_ALGO", "ring", 1);
    else
      unsetenv("COLL_ALGO");
    job *j = job_new(n, z, 1);
    j->steps = 3;
    run_job(j);
    train_options o = small_options(B, 42);
    train_plan_row pr;
    cr_assert_eq(train_plan(&o.cfg, B, T, n, 1, (train_strategy)(TRAIN_PLAN_ZERO1 + z - 1), 0.0,
                            &pr, err),
                 0, "%s", err);
    double tol = 64.0 + 4.0 * n * n; /* the scalar all-reduces, ring chunks of padding */
    cr_expect(fabs(j->measured - pr.sent) <= tol,
              "N=%d ZeRO-%d (%s): measured %.0f bytes per step, planned %.0f (tolerance "
              "%.0f)",
              n, z, cases[c][2] ? "ring" : "tuner's choice", j->measured, pr.sent, tol);
    cr_log_info("N=%d ZeRO-%d (%s): bytes per rank per step: planned %.0f, measured "
                "(libcoll trace) %.0f, counted (formulas per call) %.0f",
                n, z, cases[c][2] ? "ring" : "tuner's choice", pr.sent, j->measured, j->counted);
    job_free(j);
  }
  unsetenv("COLL_ALGO");
}
