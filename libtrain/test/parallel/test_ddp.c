/*
 * test_ddp.c — data-parallel training (ddp.c) against the single-process trainer.
 *
 *  - parity: the same model and seed trained STEPS steps by one process on the global
 *    batch (N*B sequences, the unmodified train_session_step) and by N = 2, 3, 4 forked
 *    ranks each on its B-row slice, over libcoll. After every step the ranks' parameters
 *    must be bitwise identical to each other, and equal to the single process's within
 *    PARAM_TOL (see below). Ranks other than 0 start from different seeds: the broadcast
 *    from rank 0 is what makes them agree.
 *  - --accum K on N ranks equals one process accumulating K*N micro-batches.
 *  - buckets tile the gradient array in reverse layer order; a backward that never
 *    reports a layer finished is caught at its end, naming the bucket and the layer.
 *  - backend swap: coll-train over libcoll and over Open MPI print the same losses.
 *  - --backend nccl: refused with a clear sentence without --device cuda, without NCCL in
 *    the build or without a GPU (every rank says so); with a GPU, its losses match one GPU
 *    process on the global batch (skipped, saying why, without one).
 *  - --trace writes JSON (checked with python3's json) holding, for every rank, forward
 *    and backward slices per stage, the optimizer, each bucket's all-reduce and libcoll's
 *    own call and step records.
 *  - a rank killed mid-training makes the survivors exit with an error within the timeout;
 *    and a run killed that way, restarted from the last checkpoint rank 0 wrote, ends
 *    bitwise equal to the uninterrupted run (losses and final checkpoint).
 *
 * Tolerance. DDP computes the same mathematics in another order: each rank's weight
 * gradients sum B*T rows instead of N*B*T, and the ranks' means are averaged in fp32
 * (u = 6e-8), so gradients differ by a few ulps relative. AdamW divides m by sqrt(v):
 * where a gradient is much larger than its rounding noise the update moves by ~1e-6
 * relative, but where it is of the order of that noise (a cancelling sum) the update
 * can change by up to lr per step, so single elements drift further than the bulk.
 * Measured here (20 steps, lr 1e-2, N = 2, 3, 4): max |p_ddp - p_1proc| = 3.6e-5, 4.5e-5,
 * 6.7e-5 and relative L2 ||p_ddp - p_1proc|| / ||p_1proc|| = 5.4e-6, 7.1e-6, 8.0e-6.
 * Tolerances: PARAM_TOL = 1e-3 absolute per element (lr/10, 15x the worst seen) and
 * PARAM_RELTOL = 1e-4 relative L2 (12x). A real bug (a bucket not reduced, a rank reading
 * the wrong rows, weights not broadcast) moves the bulk of the parameters by ~lr = 1e-2
 * per step, and breaks the bitwise equality across ranks at once. AdamW is blind to a
 * gradient scaled by a constant (a missing 1/N), so the gradient norms are compared too
 * (GNORM_RELTOL 1e-4 relative). Losses: LOSS_TOL 1e-5 absolute (values near 5).
 */
#include <criterion/criterion.h>

#include <coll_launch.h>
#include <sys/mman.h>

#include "parallel/ddp.h"
#include "common/env_job.h"
#include "common/train_test.h"
#include "model/model.h"
#include "train.h"

#define B 2
#define T 16
#define STEPS 20
#define PARAM_TOL 1e-3
#define PARAM_RELTOL 1e-4
#define GNORM_RELTOL 1e-4
#define LOSS_TOL 1e-5

static train_options small_options(int batch, uint64_t seed) {
  train_config cfg = {.vocab = 256, .max_seq = 32, .layers = 2, .channels = 64, .heads = 4};
  return th_options(cfg, batch, T, seed, STEPS, 3, 1e-2f);
}

/* What the ranks report back to the test process: parameters after every step and the
 * losses, in memory shared across fork. */
typedef struct job {
  int nranks, steps, accum;
  size_t np;
  float *params; /* [rank][step][np] */
  float *loss;   /* [rank][step] */
  float *norm;   /* [rank][step] gradient norm before clipping */
} job;

static size_t count_params(void) {
  train_options o = small_options(B, 1);
  return th_num_params(&o.cfg);
}

static job *job_new(int nranks, int steps, int accum) {
  job *j = th_shared_alloc(sizeof *j);
  j->nranks = nranks;
  j->steps = steps;
  j->accum = accum;
  j->np = count_params();
  j->params = th_shared_alloc((size_t)nranks * steps * j->np * sizeof(float));
  j->loss = th_shared_alloc((size_t)nranks * steps * sizeof(float));
  j->norm = th_shared_alloc((size_t)nranks * steps * sizeof(float));
  return j;
}

static void job_free(job *j) {
  munmap(j->params, (size_t)j->nranks * j->steps * j->np * sizeof(float));
  munmap(j->loss, (size_t)j->nranks * j->steps * sizeof(float));
  munmap(j->norm, (size_t)j->nranks * j->steps * sizeof(float));
  munmap(j, sizeof *j);
}

/* One DDP rank: its own seed (rank 0's wins through the broadcast), STEPS steps. */
static int ddp_rank(coll_comm_t comm, int rank, int nranks, void *arg) {
  job *j = arg;
  char err[TRAIN_ERRLEN];
  train_options o = small_options(B, 42 + 1000 * (uint64_t)rank);
  train_session *s = train_session_create(&o, err);
  train_backend *b = s ? train_backend_coll(comm, 0, err) : NULL;
  if (!b) return th_rank_fail(rank, "start", err, 2);
  train_ddp_options dopt = train_ddp_options_default();
  dopt.accum = j->accum;
  dopt.first_bucket_bytes = 64 << 10; /* several buckets even for this small model */
  dopt.bucket_bytes = 128 << 10;
  train_ddp *d = train_ddp_create(s, b, &dopt, err);
  if (!d) return th_rank_fail(rank, "create", err, 3);
  for (int i = 0; i < j->steps; i++) {
    train_ddp_stats st;
    if (train_ddp_step(d, &st, err) != 0) return th_rank_fail(rank, "step", err, 4);
    j->loss[(size_t)rank * j->steps + i] = st.step.loss;
    j->norm[(size_t)rank * j->steps + i] = st.step.grad_norm;
    train_copy_params_to_host(train_session_model(s),
                              j->params + ((size_t)rank * j->steps + i) * j->np);
  }
  int rc = train_ddp_check_identical(d, err) == 0 ? 0 : 5;
  train_ddp_free(d);
  b->destroy(b);
  train_session_free(s);
  (void)nranks;
  return rc;
}

/* Ranks bitwise equal to each other, rank 0 within PARAM_TOL of ref (steps x np). */
static void check_against(job *j, const float *ref, const float *refloss, const float *refnorm,
                          const char *what) {
  size_t np = j->np;
  double worst = 0.0, worst_rel = 0.0;
  for (int i = 0; i < j->steps; i++) {
    const float *p0 = j->params + (size_t)i * np;
    for (int r = 1; r < j->nranks; r++)
      cr_assert(memcmp(p0, j->params + ((size_t)r * j->steps + i) * np, np * sizeof(float)) == 0,
                "%s N=%d: rank %d's parameters differ from rank 0's after step %d", what, j->nranks,
                r, i + 1);
    size_t at = 0;
    double dd = th_max_abs_diff(p0, ref + (size_t)i * np, np, &at);
    cr_assert(dd <= PARAM_TOL,
              "%s N=%d: after step %d parameter %zu differs from one process by %g "
              "(tolerance %g)",
              what, j->nranks, i + 1, at, dd, PARAM_TOL);
    cr_assert(fabs(j->loss[i] - refloss[i]) <= LOSS_TOL,
              "%s N=%d: step %d loss %.9g, one process %.9g", what, j->nranks, i + 1, j->loss[i],
              refloss[i]);
    cr_assert(fabs(j->norm[i] - refnorm[i]) <= GNORM_RELTOL * refnorm[i],
              "%s N=%d: step %d gradient norm %.9g, one process %.9g", what, j->nranks, i + 1,
              j->norm[i], refnorm[i]);
    double rel = th_relerr(p0, ref + (size_t)i * np, np);
    cr_assert(rel <= PARAM_RELTOL,
              "%s N=%d: after step %d ||p_ddp - p_1proc|| / ||p_1proc|| = %g (tolerance %g)", what,
              j->nranks, i + 1, rel, PARAM_RELTOL);
    worst = dd > worst ? dd : worst;
    worst_rel = rel > worst_rel ? rel : worst_rel;
  }
  cr_log_info("%s N=%d: %d steps, max |p_ddp - p_1proc| = %.3g, max relative L2 %.3g", what,
              j->nranks, j->steps, worst, worst_rel);
}

Test(ddp, parity_with_one_process_n234, .timeout = 150) {
  char err[TRAIN_ERRLEN];
  for (int n = 2; n <= 4; n++) {
    job *j = job_new(n, STEPS, 1);
    th_launch(n, ddp_rank, j, 120000, NULL, "N=%d DDP job", n);

    /* the single process: batch N*B, the plain trainer, seed 42 */
    train_options o = small_options(n * B, 42);
    train_session *s = train_session_create(&o, err);
    cr_assert(s, "%s", err);
    float *ref = malloc((size_t)STEPS * j->np * sizeof(float)), refloss[STEPS], refnorm[STEPS];
    for (int i = 0; i < STEPS; i++) {
      train_step_stats st = train_session_step(s);
      refloss[i] = st.loss;
      refnorm[i] = st.grad_norm;
      train_copy_params_to_host(train_session_model(s), ref + (size_t)i * j->np);
    }
    train_session_free(s);
    check_against(j, ref, refloss, refnorm, "parity");
    free(ref);
    job_free(j);
  }
}

Test(ddp, accum_equals_one_process_with_kn_microbatches, .timeout = 120) {
  enum { N = 2, K = 3, S = 8 };
  char err[TRAIN_ERRLEN];
  job *j = job_new(N, S, K);
  th_launch(N, ddp_rank, j, 100000, NULL, "DDP job");

  /* one process: K*N micro-batches of B rows, each scaled 1/(K*N), one AdamW step */
  train_options o = small_options(B, 42);
  train_session *s = train_session_create(&o, err);
  cr_assert(s, "%s", err);
  train_model *m = train_session_model(s);
  train_data *data = train_session_data(s);
  train_loader_state pos = {.seed = o.seed};
  int in[B * T], tg[B * T];
  float *ref = malloc((size_t)S * j->np * sizeof(float)), refloss[S], refnorm[S];
  for (int i = 0; i < S; i++) {
    train_zero_grad(m);
    train_set_loss_scale(m, 1.0f / (K * N));
    double loss = 0.0;
    train_loader_state p = pos;
    for (int mb = 0; mb < K * N; mb++) {
      p = pos;
      train_data_next_rows(data, &p, K * N * B, T, mb * B, B, in, tg);
      loss += train_forward(m, in, tg, B, T);
      train_backward(m);
    }
    pos = p;
    refloss[i] = (float)(loss / (K * N));
    refnorm[i] = train_clip_grads(m, &o.hp);
    train_adamw_step(m, &o.hp, train_lr_at(&o.hp, i), i + 1);
    train_copy_params_to_host(m, ref + (size_t)i * j->np);
  }
  train_session_free(s);
  check_against(j, ref, refloss, refnorm, "accum K=3");
  free(ref);
  job_free(j);
}

/* DDP in this process over a 1-rank libcoll backend, buckets of 20000 then 70000 bytes:
 * for the tests that need no peers. */
typedef struct solo {
  train_options o;
  train_session *s;
  train_backend *b;
  train_ddp_options dopt;
  train_ddp *d;
} solo;

static void solo_start(solo *x) {
  coll_unique_id id;
  coll_comm_t comm;
  char err[TRAIN_ERRLEN];
  x->o = small_options(B, 1);
  x->s = train_session_create(&x->o, err);
  cr_assert(x->s, "%s", err);
  cr_assert_eq(coll_get_unique_id(&id), COLL_OK, "%s", coll_comm_last_error(NULL));
  cr_assert_eq(coll_comm_init_rank(&comm, 1, id, 0), COLL_OK, "%s", coll_comm_last_error(NULL));
  x->b = train_backend_coll(comm, 1, err);
  cr_assert(x->b, "%s", err);
  x->dopt = train_ddp_options_default();
  x->dopt.first_bucket_bytes = 20000;
  x->dopt.bucket_bytes = 70000;
  x->d = train_ddp_create(x->s, x->b, &x->dopt, err);
  cr_assert(x->d, "%s", err);
}

static void solo_end(solo *x) {
  train_ddp_free(x->d);
  cr_assert_eq(x->b->destroy(x->b), 0);
  train_session_free(x->s);
}

Test(ddp, buckets_tile_the_gradients_in_reverse_order, .timeout = 30) {
  solo x;
  solo_start(&x);
  train_ddp *d = x.d;
  train_model *m = train_session_model(x.s);
  size_t end = train_num_params(m);
  int nb = train_ddp_num_buckets(d);
  cr_assert(nb > 3, "only %d buckets", nb);
  for (int i = 0; i < nb; i++) {
    const train_ddp_bucket *k = train_ddp_bucket_info(d, i);
    cr_assert_eq(k->start + k->count, end, "bucket %d does not end where %d began", i, i - 1);
    size_t cap = i == 0 ? x.dopt.first_bucket_bytes : x.dopt.bucket_bytes;
    cr_assert(k->count * 4 <= cap || k->ntensors == 1,
              "bucket %d: %zu bytes over the cap %zu with %d tensors", i, k->count * 4, cap,
              k->ntensors);
    end = k->start;
  }
  cr_assert_eq(end, 0, "buckets do not reach offset 0");
  /* reverse layer order: the stage that finalises each bucket never goes back up */
  for (int i = 1; i < nb; i++)
    cr_assert(train_ddp_bucket_info(d, i)->layer <= train_ddp_bucket_info(d, i - 1)->layer,
              "bucket %d is final after layer %d, bucket %d only after layer %d", i,
              train_ddp_bucket_info(d, i)->layer, i - 1, train_ddp_bucket_info(d, i - 1)->layer);
  cr_assert_eq(train_ddp_bucket_info(d, nb - 1)->layer, -1,
               "the last bucket is not the embeddings'");
  solo_end(&x);
}

Test(ddp, bucket_never_launched_is_named_at_end_of_backward, .timeout = 30) {
  char err[TRAIN_ERRLEN];
  solo x;
  solo_start(&x);
  train_ddp *d = x.d;
  train_model *m = train_session_model(x.s);
  /* a backward that reports the final LayerNorm and block 1, then stops */
  train_ddp_begin_backward(d);
  size_t lnf = 0, h1 = 0;
  for (int i = 0; i < train_num_tensors(m); i++) {
    const train_param *p = train_param_info(m, i);
    if (strcmp(p->name, "lnf.w") == 0) lnf = p->offset;
    if (strcmp(p->name, "h.1.ln1.w") == 0) h1 = p->offset;
  }
  train_ddp_grads_final(d, lnf, x.o.cfg.layers);
  train_ddp_grads_final(d, h1, 1);
  cr_assert_eq(train_ddp_finish_backward(d, err), -1, "a missing layer went unnoticed");
  cr_assert(strstr(err, "never reported layer 0 finished") && strstr(err, "h.0."),
            "message does not name the bucket and layer: %s", err);
  cr_log_info("%s", err);
  /* and a complete backward passes */
  train_ddp_stats st;
  cr_assert_eq(train_ddp_step(d, &st, err), 0, "%s", err);
  solo_end(&x);
}

/* ---- ordering with a device's compute stream ------------------------------------ *
 * A device's ops give marks on the compute stream (ops->mark / wait_mark).  DDP must
 * order each bucket after the mark the model took before declaring its gradients final,
 * and must never synchronise the whole device during backward: that would also wait for
 * the all-reduces in flight.  A CPU model with instrumented ops stands in for the device:
 * every mark is a distinct token, and the counts say who waited on what. */
static struct {
  int marks, waits, syncs, bad_waits;
  int token[4096];
  int in_step;
} dev;

static void *fake_mark(void) {
  if (dev.marks >= 4096) return NULL;
  dev.token[dev.marks] = dev.marks;
  return &dev.token[dev.marks++];
}
static int fake_wait_mark(void *mark, char *err) {
  (void)err;
  int *t = mark;
  if (!t || t < dev.token || t >= dev.token + dev.marks) dev.bad_waits++;
  dev.waits++;
  return 0;
}
static void fake_sync(void) { dev.syncs++; }

Test(ddp, device_ordering_uses_marks_not_a_device_sync, .timeout = 30) {
  char err[TRAIN_ERRLEN];
  solo x;
  solo_start(&x);
  cr_assert_null(x.b->order_after); /* libcoll: no order_after, so the host waits */
  train_ddp *d = x.d;
  train_model *m = train_session_model(x.s);
  train_ops ops = *m->ops;
  ops.mark = fake_mark;
  ops.wait_mark = fake_wait_mark;
  ops.sync = fake_sync;
  const train_ops *cpu = m->ops;
  m->ops = &ops;
  memset(&dev, 0, sizeof dev);
  train_ddp_stats st;
  cr_assert_eq(train_ddp_step(d, &st, err), 0, "%s", err);
  /* one mark per "gradients final" notification (L blocks, the final LayerNorm, the
   * embeddings) plus the one that ends backward's compute */
  int notes = x.o.cfg.layers + 2;
  cr_assert_eq(dev.marks, notes + 1, "%d marks for %d notifications", dev.marks, notes);
  /* the host waited for a mark before the buckets it made final (the backend cannot
   * order on the device), and once at the end of backward: never on anything else */
  cr_assert(dev.waits >= 2 && dev.waits <= notes + 1, "%d waits on marks", dev.waits);
  cr_assert_eq(dev.bad_waits, 0, "a wait on something that is not a mark");
  /* the only device-wide sync of a step is the one after AdamW */
  cr_assert_eq(dev.syncs, 1, "%d device-wide syncs in one step (backward must have none)",
               dev.syncs);
  m->ops = cpu;
  solo_end(&x);
}

/* ---- through coll-train --------------------------------------------------------- */

#define CLI_MODEL                                                       \
  "--layers 2 --channels 64 --heads 4 --max-seq 32 --seq 16 --batch 2 " \
  "--lr 1e-2 --warmup 3 --eval-every 0 --threads 1"

Test(ddp, backend_swap_coll_vs_mpi_same_losses, .timeout = 120) {
  if (!train_backend_mpi_built())
    cr_skip_test("this build has no Open MPI backend (install libopenmpi-dev)");
  if (system("command -v mpirun.openmpi >/dev/null 2>&1") != 0)
    cr_skip_test("mpirun.openmpi is not installed (Debian: openmpi-bin)");
  char *dir = th_tmpdir();
  for (int n = 2; n <= 3; n++) {
    float lc[STEPS], lm[STEPS];
    const char *be[2] = {"coll", "mpi"};
    float *dst[2] = {lc, lm};
    for (int k = 0; k < 2; k++) {
      char *base = th_fmt("%s/%s%d", dir, be[k], n);
      char *cmd = th_fmt("%s " CLI_MODEL " --steps %d --parallel ddp --ranks %d "
                         "--backend %s --bucket-mb 0.1",
                         th_cli(), STEPS, n, be[k]);
      cr_assert_eq(th_cli_losses(cmd, base, 1, dst[k], STEPS), STEPS, "%s: fewer than %d steps",
                   cmd, STEPS);
      free(cmd);
      free(base);
    }
    for (int i = 0; i < STEPS; i++) {
      /* N = 2: both sum two numbers (commutative) and divide by 2: bitwise equal;
       * other N: the summation order may differ: LOSS_TOL */
      if (n == 2)
        cr_assert(lc[i] == lm[i], "N=2 step %d: libcoll loss %.9g, MPI %.9g", i + 1, lc[i], lm[i]);
      else
        cr_assert(fabsf(lc[i] - lm[i]) <= LOSS_TOL, "N=%d step %d: libcoll loss %.9g, MPI %.9g", n,
                  i + 1, lc[i], lm[i]);
    }
  }
  th_rmrf(dir);
  free(dir);
}

/* A checker run by python3's json module on the --trace file: every rank has compute
 * slices (forward and backward per stage, the optimizer), bucket all-reduces, and
 * libcoll's own call and step records in libcoll's format; exits non-zero naming what is
 * missing. */
static const char trace_check_py[] =
    "import json, sys\n"
    "d = json.load(open(sys.argv[1]))\n"
    "n, steps = int(sys.argv[2]), int(sys.argv[3])\n"
    "ev = d['traceEvents']\n"
    "x = [e for e in ev if e['ph'] == 'X']\n"
    "bad = [e for e in x if not (isinstance(e['ts'], (int, float)) and e['dur'] >= 0)]\n"
    "assert not bad, 'bad times: %s' % bad[:2]\n"
    "for r in range(n):\n"
    "    names = [e['name'] for e in ev if e['ph'] == 'M' and e['pid'] == r]\n"
    "    assert 'process_name' in names, 'rank %d has no process_name' % r\n"
    "    mine = [e for e in x if e['pid'] == r]\n"
    "    def count(f): return sum(1 for e in mine if f(e))\n"
    "    want = {\n"
    "      'fwd embeddings': count(lambda e: e['tid'] == 0 and e['name'] == 'fwd embeddings'),\n"
    "      'fwd layer 1': count(lambda e: e['tid'] == 0 and e['name'] == 'fwd layer 1'),\n"
    "      'bwd layer 0': count(lambda e: e['tid'] == 0 and e['name'] == 'bwd layer 0'),\n"
    "      'optimizer': count(lambda e: e['tid'] == 0 and e['name'] == 'optimizer'),\n"
    "      'bucket all-reduce': count(lambda e: e['tid'] == 1 and e['cat'] == 'comm' and\n"
    "                                e['name'].startswith('allreduce b')),\n"
    "      'libcoll all_reduce call': count(lambda e: e['cat'] == 'call' and\n"
    "                                e['name'].startswith('all_reduce #') and\n"
    "                                e['args']['nranks'] == n),\n"
    "      'libcoll step': count(lambda e: e['cat'] == 'step' and e['tid'] >= 3),\n"
    "    }\n"
    "    for k, v in want.items():\n"
    "        assert v >= steps, 'rank %d: %d %s events for %d steps' % (r, v, k, steps)\n"
    "    buckets = count(lambda e: e['tid'] == 1)\n"
    "    print('rank %d: %d events, %d bucket all-reduces, %d libcoll records' %\n"
    "          (r, len(mine), buckets, count(lambda e: e['tid'] >= 2)))\n";

Test(ddp, trace_has_compute_and_comm_per_rank_in_libcoll_format, .timeout = 60) {
  enum { N = 2, S = 3 };
  (void)th_cli();
  char *dir = th_tmpdir();
  const char *py = getenv("TRAIN_PYTHON") ? getenv("TRAIN_PYTHON") : "python3";
  char *json = th_fmt("%s/t.json", dir), *script = th_fmt("%s/check.py", dir),
       *out = th_fmt("%s/out", dir), *errp = th_fmt("%s/err", dir), *run = th_fmt("%s/run", dir);
  cr_assert_eq(th_write(script, trace_check_py, strlen(trace_check_py)), 0);
  char *cmd = th_fmt("%s " CLI_MODEL " --steps %d --parallel ddp --ranks %d --bucket-mb 0.1 "
                     "--trace %s",
                     th_cli(), S, N, json);
  free(th_run_ok(cmd, run));
  free(cmd);
  cmd = th_fmt("%s %s %s %d %d", py, script, json, N, S);
  int rc = th_run(cmd, out, errp);
  char *e = th_read(errp, NULL);
  char *o = th_read(out, NULL);
  cr_assert_eq(rc, 0, "the trace does not check out: %s", e ? e : "");
  cr_log_info("%s", o ? o : "");
  free(o);
  free(e);
  free(cmd);
  free(json);
  free(script);
  free(out);
  free(errp);
  free(run);
  th_rmrf(dir);
  free(dir);
}

/* ---- NCCL (--backend nccl) ------------------------------------------------------ */

/* Runs cmd; expects failure with every string of want[] in its stderr. */
static void expect_refusal(const char *dir, const char *cmd, const char **want, int nwant) {
  char *out = th_fmt("%s/refuse.out", dir), *errp = th_fmt("%s/refuse.err", dir);
  int rc = th_run(cmd, out, errp);
  char *e = th_read(errp, NULL);
  cr_assert(rc != 0, "%s succeeded; expected a refusal", cmd);
  for (int i = 0; i < nwant; i++)
    cr_assert(e && strstr(e, want[i]), "%s: stderr lacks \"%s\": %s", cmd, want[i], e ? e : "");
  cr_log_info("%s -> %s", cmd, e);
  free(e);
  free(out);
  free(errp);
}

Test(ddp, nccl_backend_refuses_clearly_without_the_gpu_path, .timeout = 60) {
  (void)th_cli();
  char *dir = th_tmpdir();
  char *cmd = th_fmt("%s " CLI_MODEL " --steps 2 --parallel ddp --ranks 2 --backend nccl",
                     th_cli());
  const char *cpu[] = {"--backend nccl needs --device cuda"};
  expect_refusal(dir, cmd, cpu, 1);
  free(cmd);
  cmd = th_fmt("%s " CLI_MODEL " --steps 2 --parallel ddp --ranks 2 --backend nccl "
               "--device cuda",
               th_cli());
  if (!train_backend_nccl_built()) {
    const char *w[] = {"has no NCCL backend"};
    expect_refusal(dir, cmd, w, 1);
  } else if (train_nccl_device_count() == 0) {
    /* Every rank checks before any collective, so none waits for the others; but the
     * first to refuse ends the job (the launcher kills the rest), so which of them
     * gets to say so is a race: the refusal must name the rank that made it. */
    const char *w[] = {"--backend nccl: no usable CUDA GPU"};
    expect_refusal(dir, cmd, w, 1);
    char *errp = th_fmt("%s/refuse.err", dir), *e = th_read(errp, NULL);
    cr_assert(e && (strstr(e, "rank 0: --backend nccl: no usable CUDA GPU") ||
                    strstr(e, "rank 1: --backend nccl: no usable CUDA GPU")),
              "the refusal names no rank: %s", e ? e : "");
    free(e);
    free(errp);
  } else {
    cr_log_info("a GPU is present: the NCCL run itself is checked by "
                "nccl_matches_one_gpu_process");
  }
  free(cmd);
  th_rmrf(dir);
  free(dir);
}

/* GPU kernels sum with atomics in places (order not fixed) on top of DDP's own summation
 * order: the loss tolerance is 1e-4 (10x LOSS_TOL), not measured for want of a GPU. */
#define LOSS_TOL_GPU 1e-4

Test(ddp, nccl_matches_one_gpu_process, .timeout = 120) {
  if (!train_backend_nccl_built())
    cr_skip_test("NCCL check skipped: this build has no NCCL backend (needs the CUDA "
                 "toolkit with nvcc on PATH, nccl.h and libnccl at configure time)");
  int ndev = train_nccl_device_count();
  if (ndev == 0) cr_skip_test("NCCL check skipped: no usable CUDA GPU on this machine");
  int n = ndev >= 2 ? 2 : 1; /* NCCL refuses two ranks on one GPU */
  char *dir = th_tmpdir();
  float ln[STEPS], l1[STEPS];
  const char *what[2] = {"nccl", "one"};
  float *dst[2] = {ln, l1};
  for (int k = 0; k < 2; k++) {
    char *base = th_fmt("%s/%s", dir, what[k]);
    char *cmd = k == 0 ? th_fmt("%s " CLI_MODEL " --device cuda --steps %d --parallel ddp "
                                "--ranks %d --backend nccl --bucket-mb 0.1",
                                th_cli(), STEPS, n)
                       : th_fmt("%s " CLI_MODEL " --device cuda --steps %d --batch %d", th_cli(),
                                STEPS, n * B);
    cr_assert_eq(th_cli_losses(cmd, base, 1, dst[k], STEPS), STEPS, "%s: fewer than %d steps", cmd,
                 STEPS);
    free(cmd);
    free(base);
  }
  for (int i = 0; i < STEPS; i++)
    cr_assert(fabsf(ln[i] - l1[i]) <= LOSS_TOL_GPU,
              "step %d: NCCL on %d GPU rank(s) loss %.9g, one GPU process %.9g", i + 1, n, ln[i],
              l1[i]);
  cr_log_info("NCCL on %d rank(s): %d losses within %g of one GPU process", n, STEPS, LOSS_TOL_GPU);
  th_rmrf(dir);
  free(dir);
}

Test(ddp, killed_rank_makes_the_others_fail_within_the_timeout, .timeout = 60) {
  env_job_kill_under_way(3,
                         "--layers 2 --channels 64 --heads 4 --max-seq 32 --seq 16 "
                         "--batch 2 --eval-every 0 --threads 1 --steps 1000000 "
                         "--parallel ddp",
                         1, 20.0, 0, "");
}

/* Train 2 ranks with checkpoints every EVERY steps; kill rank 1 mid-run (rank 0 must fail
 * with a clear error); restart from the last checkpoint rank 0 wrote and run to the end.
 * The resumed run must be bitwise the uninterrupted one: the same losses from the restart
 * on, and the same final checkpoint (parameters, AdamW moments, step and data position).
 * Rank 0's output pipe is shrunk to 4 KiB and the test reads 256 bytes at a time, so once
 * the test has seen checkpoint KILL_AT rank 0 is at most ~4.3 KiB of output (~30 step
 * lines of ~150 bytes) further: the kill always lands mid-run, with no sleep and no race
 * with the end of training. Only rank 0 writes a checkpoint (one process's: a manifest and
 * one shard), and it fails cleanly: nothing but complete checkpoints may be left in its
 * directory. */
Test(ddp, restart_after_a_kill_resumes_exactly, .timeout = 90) {
  enum { N = 2, VICTIM = 1, STEPS_R = 120, EVERY = 10, KILL_AT = 20 };
  (void)th_cli(); /* before anything that needs cleaning up */
  char *dir = th_tmpdir(), *needle = th_fmt("ckpt_%08d.bin", KILL_AT),
       *run = th_fmt(CLI_MODEL " --parallel ddp --ranks %d", N);
  th_kill_resume c = {
      .wrap = "",
      .run_args = run,
      .job_args = CLI_MODEL " --parallel ddp",
      .nranks = N,
      .victim = VICTIM,
      .steps = STEPS_R,
      .every = EVERY,
      .kill_at = KILL_AT,
      .grid_tp = 1,
      .grid_dp = 1,
      .strict = 1,
      .needle = needle,
      .kill_limit_s = 20.0,
  };
  long k = th_kill_then_resume(dir, &c);
  cr_log_info("killed rank %d after checkpoint %d; resumed from step %ld; %ld steps and the "
              "final checkpoint bitwise equal to the uninterrupted run",
              VICTIM, KILL_AT, k, STEPS_R - k);
  th_rmrf(dir);
  free(needle), free(run), free(dir);
}
