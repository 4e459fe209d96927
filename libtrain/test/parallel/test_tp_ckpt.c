/*
 * test_tp_ckpt.c — tensor-parallel checkpoints (train_tp_save: a T x 1 grid;
 * train_tp_fsdp_save: T x D; train_session_load; format in checkpoint.c):
 *
 *  - same grid, through coll-train: runs at T = 2, T = 2 x D = 2 with DDP and with FSDP
 *    (ZeRO-3: each TP rank's slice gathered from its DP group's shards at the save) write
 *    checkpoints every HALF steps; resuming from step HALF at the same grid prints the same
 *    losses and writes a final manifest and shards byte-identical to the uninterrupted
 *    run's (parameters, AdamW m and v, step, data position and RNG all bitwise);
 *  - conversion, in the library: T = 2 ranks save after HALF steps; one process loads the
 *    checkpoint and holds bitwise the consolidated state (each rank's parameters, m and v
 *    put together with train_tp_unshard); and the other way, a one-process checkpoint
 *    loaded by T = 2 ranks gives each rank bitwise its slice. Both continue, and their
 *    losses follow the uninterrupted run of the other layout within LOSS_RELTOL (only the
 *    summation order differs: see test_tp.c);
 *  - TP x FSDP, in the library: a 2 x 2 grid (ZeRO-3 along D) saves every rank's own FSDP
 *    shard of its TP slice after HALF steps (2 x 2 shards, no gather); the same grid
 *    resumed from it prints bitwise the uninterrupted grid's losses and writes a
 *    byte-identical final checkpoint; one process and a 1 x 2 FSDP grid load it holding
 *    bitwise the grid's consolidated state, and their losses follow the uninterrupted
 *    grid's within LOSS_RELTOL;
 *  - refusals, through coll-train: a checkpoint with a shard missing, a grid whose global
 *    batch differs, heads not a multiple of the new T, a truncated manifest: one line
 *    `coll-train: ...`, exit status 1, nothing written;
 *  - a rank of a 2 x 2 grid (ranks started as a launcher starts them) is killed (SIGKILL)
 *    once rank 0 has reported checkpoint KILL_AT complete; the others exit with a
 *    `coll-train: rank r of 4:` sentence within KILL_LIMIT_S; the last checkpoint on disk
 *    is byte-identical to the uninterrupted run's, and resuming from it prints the
 *    uninterrupted run's losses.
 */
#include <criterion/criterion.h>

#include <coll_launch.h>
#include <sys/mman.h>

#include "common/env_job.h"
#include "common/train_test.h"
#include "parallel/fsdp.h"
#include "parallel/tp.h"
#include "train.h"

#define B 2
#define T 16
#define STEPS 10
#define HALF 5
#define LOSS_RELTOL 1e-5
#define KILL_LIMIT_S 5.0

static train_options options(int batch) {
  train_config cfg = {.vocab = 257, .max_seq = 16, .layers = 2, .channels = 32, .heads = 4};
  return th_options(cfg, batch, T, 11, STEPS, 2, 1e-2f);
}

static size_t full_params(void) {
  train_options o = options(1);
  return th_num_params(&o.cfg);
}

/* ---- the library: T ranks load (optionally), step, save (optionally) ----------------- */

typedef struct job {
  int tp, steps;
  char load[512], save[512];
  size_t np;    /* the full model's count: each rank's slot in state */
  float *loss;  /* [rank][steps] */
  float *state; /* [rank][3 np]: local params, m, v right after the load (or the
                 * creation) when after_load, else at the end */
  int after_load;
  char why[4][TRAIN_ERRLEN];
} job;

static int tp_rank(coll_comm_t comm, int rank, int nranks, void *arg) {
  job *j = arg;
  char *err = j->why[rank];
  int rc = 2;
  train_backend *w = train_backend_coll(comm, 0, err);
  train_session *s = NULL;
  if (!w) return 2;
  train_options o = options(B);
  o.tp = j->tp;
  o.tp_rank = rank;
  s = train_session_create(&o, err);
  if (!s || train_tp_attach(s, w, err) != 0) goto out;
  train_session_set_batch_mult(s, 1);
  if (j->load[0] && train_session_load(s, j->load, err) != 0) goto out;
  train_model *m = train_session_model(s);
  float *st = j->state + (size_t)rank * 3 * j->np;
  if (j->after_load) th_state_to_host(m, st);
  for (int i = 0; i < j->steps; i++) j->loss[(size_t)rank * STEPS + i] = train_session_step(s).loss;
  if (train_tp_status(s, err) != 0) goto out;
  if (j->save[0] && train_tp_save(s, w, w, NULL, NULL, NULL, j->save, err) != 0) goto out;
  if (!j->after_load) th_state_to_host(m, st);
  rc = 0;
out:
  train_tp_detach(s);
  train_session_free(s);
  w->destroy(w);
  (void)nranks;
  return rc;
}

static job *run_tp(int tp, int steps, const char *load, const char *save, int after_load) {
  job *j = th_shared_alloc(sizeof *j);
  j->tp = tp;
  j->steps = steps;
  j->after_load = after_load;
  snprintf(j->load, sizeof j->load, "%s", load ? load : "");
  snprintf(j->save, sizeof j->save, "%s", save ? save : "");
  j->np = full_params();
  j->loss = th_shared_alloc((size_t)tp * STEPS * sizeof(float));
  j->state = th_shared_alloc((size_t)tp * 3 * j->np * sizeof(float));
  th_launch(tp, tp_rank, j, 20000, j->why, "T=%d", tp);
  return j;
}

static void free_job(job *j) {
  munmap(j->loss, (size_t)j->tp * STEPS * sizeof(float));
  munmap(j->state, (size_t)j->tp * 3 * j->np * sizeof(float));
  munmap(j, sizeof *j);
}

/* The tp slices' states (state + r * 3 np: the local params, m, v of TP rank r) put
 * together in the single-process layout (3 np floats). */
static float *consolidate_slices(const float *state, int tp, size_t np) {
  char err[TRAIN_ERRLEN];
  train_options o = options(B);
  o.tp = tp; /* a slice's count: its params are followed by its m at offset ln */
  train_session *s = train_session_create(&o, err);
  cr_assert(s, "%s", err);
  size_t ln = train_num_params(train_session_model(s));
  train_session_free(s);
  float *full = calloc(3 * np, sizeof(float));
  for (int r = 0; r < tp; r++) {
    const float *st = state + (size_t)r * 3 * np;
    for (int k = 0; k < 3; k++)
      cr_assert_eq(train_tp_unshard(&o.cfg, tp, r, st + (size_t)k * ln, full + (size_t)k * np, err),
                   0, "%s", err);
  }
  return full;
}

/* The ranks' local states put together in the single-process layout (3 np floats). */
static float *consolidate(const job *j) { return consolidate_slices(j->state, j->tp, j->np); }

/* One process of `batch` rows: load (optionally), the state right after it, `steps`
 * losses, save. */
static float *one_process(int batch, const char *load, const char *save, int steps, float *loss) {
  char err[TRAIN_ERRLEN];
  train_options o = options(batch);
  train_session *s = train_session_create(&o, err);
  cr_assert(s, "%s", err);
  if (load) cr_assert_eq(train_session_load(s, load, err), 0, "%s", err);
  train_model *m = train_session_model(s);
  float *st = calloc(3 * train_num_params(m), sizeof(float));
  th_state_to_host(m, st);
  for (int i = 0; i < steps; i++) loss[i] = train_session_step(s).loss;
  if (save) cr_assert_eq(train_session_save(s, save, err), 0, "%s", err);
  train_session_free(s);
  return st;
}

static void expect_close(const float *a, const float *ref, int n, const char *who) {
  for (int i = 0; i < n; i++) {
    double rel = fabs((double)a[i] - ref[i]) / fabs((double)ref[i]);
    cr_assert(rel <= LOSS_RELTOL,
              "%s, step %d after the load: loss %.7f, the other "
              "layout's %.7f (relative %.2e)",
              who, HALF + i + 1, a[i], ref[i], rel);
  }
}

Test(tp_ckpt, tp_checkpoint_to_one_process_and_back, .timeout = 30) {
  char *dir = th_tmpdir();
  char *tpck = th_fmt("%s/tp.bin", dir), *onck = th_fmt("%s/one.bin", dir);
  size_t np = full_params();

  /* T = 2 -> one process */
  job *full_tp = run_tp(2, STEPS, NULL, NULL, 0); /* uninterrupted, for the losses */
  job *half_tp = run_tp(2, HALF, NULL, tpck, 0);
  float *cons = consolidate(half_tp), loss1[STEPS];
  float *loaded = one_process(B, tpck, NULL, STEPS - HALF, loss1);
  cr_assert(memcmp(loaded, cons, np * sizeof(float)) == 0, "parameters differ after the load");
  cr_assert(memcmp(loaded + np, cons + np, np * sizeof(float)) == 0, "AdamW m differs");
  cr_assert(memcmp(loaded + 2 * np, cons + 2 * np, np * sizeof(float)) == 0, "AdamW v differs");
  expect_close(loss1, full_tp->loss + HALF, STEPS - HALF, "T=2 checkpoint in one process");

  /* one process -> T = 2 */
  float lone[STEPS], lhalf[HALF];
  free(one_process(B, NULL, NULL, STEPS, lone));
  float *saved = NULL;
  free(one_process(B, NULL, onck, HALF, lhalf));
  saved = one_process(B, onck, NULL, 0, lhalf); /* the state in the file, read back */
  job *tp_from_one = run_tp(2, STEPS - HALF, onck, NULL, 1);
  float *cons2 = consolidate(tp_from_one);
  cr_assert(memcmp(cons2, saved, 3 * np * sizeof(float)) == 0,
            "the T=2 ranks' slices of a one-process checkpoint are not its state");
  for (int r = 0; r < 2; r++)
    expect_close(tp_from_one->loss + r * STEPS, lone + HALF, STEPS - HALF,
                 "one-process checkpoint at T=2");
  cr_log_info("T=2 -> one process and one process -> T=2: parameters, m, v bitwise after "
              "the load; losses within %.0e of the other layout",
              LOSS_RELTOL);
  free(cons), free(cons2), free(loaded), free(saved);
  free_job(full_tp), free_job(half_tp), free_job(tp_from_one);
  th_rmrf(dir);
  free(tpck), free(onck), free(dir);
}

/* ---- TP x FSDP: every rank's own shard of its slice ------------------------------------ */

/* A grid of tp x dp ranks (tp = 1: FSDP alone over the job), ZeRO-3 along D, per-rank batch
 * B: load (optionally), `steps` steps, save (train_tp_fsdp_save; optionally). */
typedef struct gjob {
  int tp, dp, steps;
  char load[512], save[512];
  size_t np;         /* the full model's count: each slice's slot in state */
  float loss[STEPS]; /* rank 0's (the mean over the DP group) */
  float *state;      /* [t][3 np]: TP rank t's slice (params, m, v) gathered from its DP
                      * group right after the load when after_load, else at the end */
  int after_load;
  char why[4][TRAIN_ERRLEN];
} gjob;

/* Collective over f's DP group: the slice gathered; its DP rank 0 puts it in j->state. */
static int gather_slice(gjob *j, train_fsdp *f, train_session *s, int t, int dp_rank, char *err) {
  size_t ln = train_num_params(train_session_model(s));
  float *sl = malloc(3 * ln * sizeof(float));
  int rc = sl ? train_fsdp_gather(f, sl, sl + ln, sl + 2 * ln, NULL, err) : -1;
  if (rc == 0 && dp_rank == 0) memcpy(j->state + (size_t)t * 3 * j->np, sl, 3 * ln * sizeof(float));
  free(sl);
  return rc;
}

static int fsdp_grid_rank(coll_comm_t comm, int rank, int nranks, void *arg) {
  gjob *j = arg;
  char *err = j->why[rank];
  int rc = 2;
  train_backend *w = train_backend_coll(comm, 0, err), *tpb = NULL, *dpb = NULL;
  train_session *s = NULL;
  train_fsdp *f = NULL;
  if (!w) return 2;
  /* TP groups of consecutive ranks, DP groups across them (tp.h) */
  if (j->tp > 1 && (w->split(w, train_dp_rank_of(rank, j->tp), rank, &tpb) != 0 ||
                    w->split(w, train_tp_rank_of(rank, j->tp), rank, &dpb) != 0)) {
    memcpy(err, w->err, TRAIN_ERRLEN);
    goto out;
  }
  train_backend *db = dpb ? dpb : w;
  int t = tpb ? tpb->rank : 0;
  train_options o = options(B);
  o.tp = j->tp;
  o.tp_rank = t;
  s = train_session_create(&o, err);
  if (!s || (tpb && train_tp_attach(s, tpb, err) != 0)) goto out;
  train_session_set_batch_mult(s, db->nranks); /* the checkpoint's batch: the global one */
  if (j->load[0] && train_session_load(s, j->load, err) != 0) goto out;
  train_fsdp_options fo = train_fsdp_options_default();
  fo.zero = 3;
  if (!(f = train_fsdp_create(s, db, &fo, err))) goto out;
  if (j->after_load && gather_slice(j, f, s, t, db->rank, err) != 0) goto out;
  for (int i = 0; i < j->steps; i++) {
    train_fsdp_stats st;
    if (train_fsdp_step(f, &st, err) != 0) goto out;
    if (rank == 0) j->loss[i] = st.step.loss;
  }
  if (tpb && train_tp_status(s, err) != 0) goto out;
  if (j->save[0] &&
      (tpb ? train_tp_fsdp_save(f, w, tpb, j->save, err) : train_fsdp_save(f, j->save, err)) != 0)
    goto out;
  if (!j->after_load && gather_slice(j, f, s, t, db->rank, err) != 0) goto out;
  rc = 0;
out:
  train_fsdp_free(f);
  train_tp_detach(s);
  train_session_free(s);
  if (dpb) dpb->destroy(dpb);
  if (tpb) tpb->destroy(tpb);
  w->destroy(w);
  (void)nranks;
  return rc;
}

static gjob *run_fsdp_grid(int tp, int dp, int steps, const char *load, const char *save,
                           int after_load) {
  gjob *j = th_shared_alloc(sizeof *j);
  j->tp = tp;
  j->dp = dp;
  j->steps = steps;
  j->after_load = after_load;
  snprintf(j->load, sizeof j->load, "%s", load ? load : "");
  snprintf(j->save, sizeof j->save, "%s", save ? save : "");
  j->np = full_params();
  j->state = th_shared_alloc((size_t)tp * 3 * j->np * sizeof(float));
  th_launch(tp * dp, fsdp_grid_rank, j, 30000, j->why, "T=%d x FSDP D=%d", tp, dp);
  return j;
}

static void free_gjob(gjob *j) {
  munmap(j->state, (size_t)j->tp * 3 * j->np * sizeof(float));
  munmap(j, sizeof *j);
}

/* The manifests a and b and their 2 x 2 shards hold the same bytes. */
static void same_2x2(const char *a, const char *b) {
  th_assert_same_file(a, b);
  for (int i = 0; i < 4; i++) {
    char *x = th_fmt("%s.shard%d.%dof2x2", a, i / 2, i % 2),
         *y = th_fmt("%s.shard%d.%dof2x2", b, i / 2, i % 2);
    th_assert_same_file(x, y);
    free(x), free(y);
  }
}

Test(tp_ckpt, tp_x_fsdp_shards_resume_same_grid_one_process_and_1x2, .timeout = 60) {
  char *dir = th_tmpdir();
  char *fin = th_fmt("%s/full.bin", dir), *half = th_fmt("%s/half.bin", dir),
       *rest = th_fmt("%s/rest.bin", dir);
  size_t np = full_params(), bytes = 3 * np * sizeof(float);
  gjob *full = run_fsdp_grid(2, 2, STEPS, NULL, fin, 0);
  gjob *first = run_fsdp_grid(2, 2, HALF, NULL, half, 0);
  cr_assert_eq(th_count_entries(dir), 10,
               "two checkpoints of a manifest and 2 x 2 shards "
               "each, nothing else (temp files?)");
  for (int i = 0; i < HALF; i++)
    cr_assert(first->loss[i] == full->loss[i], "step %d differs before the save", i + 1);
  float *cons = consolidate_slices(first->state, 2, np);

  /* the same grid: bitwise, and the same final checkpoint */
  gjob *again = run_fsdp_grid(2, 2, STEPS - HALF, half, rest, 0);
  for (int i = 0; i < STEPS - HALF; i++)
    cr_assert(memcmp(&again->loss[i], &full->loss[HALF + i], sizeof(float)) == 0,
              "2x2 resumed, step %d: loss %.9g, uninterrupted %.9g", HALF + i + 1, again->loss[i],
              full->loss[HALF + i]);
  same_2x2(fin, rest);

  /* one process of the global batch: the consolidated state, then close losses */
  float l1[STEPS];
  float *loaded = one_process(2 * B, half, NULL, STEPS - HALF, l1);
  cr_assert(memcmp(loaded, cons, bytes) == 0, "one process: the loaded parameters + AdamW "
                                              "state differ from the 2x2 grid's at the save");
  expect_close(l1, full->loss + HALF, STEPS - HALF, "2x2 TP x FSDP checkpoint in one process");

  /* another grid: FSDP alone over 2 ranks of batch B (T = 1) */
  gjob *at1x2 = run_fsdp_grid(1, 2, STEPS - HALF, half, NULL, 1);
  cr_assert(memcmp(at1x2->state, cons, bytes) == 0, "1x2 FSDP: the state after the load "
                                                    "differs from the 2x2 grid's at the save");
  expect_close(at1x2->loss, full->loss + HALF, STEPS - HALF,
               "2x2 TP x FSDP checkpoint at 1x2 FSDP");
  cr_log_info("2x2 TP x FSDP (ZeRO-3) checkpoint of 4 shards: same grid bitwise (losses and "
              "final checkpoint); one process and 1x2 FSDP: state bitwise after the load, "
              "losses within %.0e",
              LOSS_RELTOL);
  free(cons), free(loaded);
  free_gjob(full), free_gjob(first), free_gjob(again), free_gjob(at1x2);
  th_rmrf(dir);
  free(fin), free(half), free(rest), free(dir);
}

/* ---- through coll-train ---------------------------------------------------------------- */

#define MODEL                                                             \
  "--layers 2 --channels 32 --heads 4 --max-seq 16 --seq 16 --vocab 257 " \
  "--lr 1e-2 --warmup 3 --eval-every 0 --threads 1"

/* `args` with --steps `steps` --ckpt-dir `ckdir` (and --resume `resume`): exit 0; its losses
 * from step `first` into loss. */
static int run_cli(const char *args, int steps, const char *ckdir, const char *resume, long first,
                   float *loss) {
  char *cmd = th_fmt("timeout 60 %s " MODEL " %s --steps %d --ckpt-dir %s --ckpt-every %d "
                     "%s %s",
                     th_cli(), args, steps, ckdir, HALF, resume ? "--resume" : "",
                     resume ? resume : "");
  int n = th_cli_losses(cmd, ckdir, first, loss, STEPS);
  free(cmd);
  return n;
}

/* tp x shards: the checkpoint's grid (FSDP: every rank writes its own shard of its slice) */
static void same_grid(const char *args, int tp, int shards) {
  char *dir = th_tmpdir();
  char *full = th_fmt("%s/full", dir), *again = th_fmt("%s/again", dir),
       *ck = th_fmt("%s/ckpt_%08d.bin", full, HALF);
  float lfull[STEPS], lagain[STEPS];
  cr_assert_eq(run_cli(args, STEPS, full, NULL, 1, lfull), STEPS);
  int n = run_cli(args, STEPS, again, ck, HALF + 1, lagain);
  cr_assert_eq(n, STEPS - HALF, "%s: the resumed run printed %d steps from %d", args, n, HALF + 1);
  for (int i = 0; i < n; i++)
    cr_assert(lagain[i] == lfull[HALF + i], "%s step %d: resumed %.6f, uninterrupted %.6f", args,
              HALF + 1 + i, lagain[i], lfull[HALF + i]);
  th_assert_same_checkpoint(full, again, STEPS, tp, shards);
  cr_log_info("%s: resumed at step %d, final manifest and %d x %d shards byte-identical to "
              "the uninterrupted run's",
              args, HALF, tp, shards);
  th_rmrf(dir);
  free(full), free(again), free(ck), free(dir);
}

Test(tp_ckpt, same_grid_resume_is_bitwise_t2, .timeout = 30) {
  same_grid("--batch 4 --tp 2", 2, 1);
}

Test(tp_ckpt, same_grid_resume_is_bitwise_2x2_ddp, .timeout = 30) {
  same_grid("--batch 2 --tp 2 --ranks 4 --parallel ddp", 2, 1);
}

Test(tp_ckpt, same_grid_resume_is_bitwise_2x2_fsdp_zero3, .timeout = 30) {
  same_grid("--batch 2 --tp 2 --ranks 4 --parallel fsdp --zero 3", 2, 2);
}

/* exit status 1, one line "coll-train: ...needle...", nothing on stdout, no --ckpt-dir */
static void refused(const char *dir, const char *args, const char *needle) {
  char *base = th_fmt("%s/r", dir), *ckd = th_fmt("%s/new", dir);
  char *cmd = th_fmt("timeout 30 %s " MODEL " --steps %d --ckpt-dir %s %s", th_cli(), STEPS, ckd,
                     args);
  th_expect_refused(cmd, base, args, needle);
  cr_assert_eq(th_count_entries(ckd), -1, "%s: created %s", args, ckd);
  free(base), free(ckd), free(cmd);
}

Test(tp_ckpt, refusals, .timeout = 30) {
  char *dir = th_tmpdir();
  char *grid = th_fmt("%s/grid", dir), *ck = th_fmt("%s/ckpt_%08d.bin", grid, HALF);
  float l[STEPS];
  run_cli("--batch 2 --tp 2 --ranks 4 --parallel ddp", HALF, grid, NULL, 1, l);
  char *a;
  /* a grid whose global batch is another (2 x 2 at batch 2 read 4 rows a step) */
  a = th_fmt("--batch 2 --tp 2 --resume %s", ck);
  refused(dir, a, "batch 4");
  free(a);
  /* heads (4) not a multiple of the new T */
  a = th_fmt("--batch 4 --tp 3 --resume %s", ck);
  refused(dir, a, "heads");
  free(a);
  /* partial: a shard missing, then the manifest cut short */
  char *sh = th_shard_path(grid, HALF, 1, 0, 2, 1), *keep = th_fmt("%s.keep", sh);
  cr_assert_eq(rename(sh, keep), 0);
  a = th_fmt("--batch 2 --tp 2 --ranks 4 --parallel ddp --resume %s", ck);
  refused(dir, a, "incomplete");
  cr_assert_eq(rename(keep, sh), 0);
  cr_assert_eq(truncate(ck, 100), 0);
  refused(dir, a, "truncated");
  free(a), free(sh), free(keep);
  th_rmrf(dir);
  free(grid), free(ck), free(dir);
}

/* ---- a rank of a 2 x 2 grid killed after checkpoint KILL_AT --------------------------- */

/* Rank 0's pipe is shrunk to 4 KiB (test_fsdp_ckpt.c's reasoning): the kill lands at most
 * ~25 step lines after rank 0 reported checkpoint KILL_AT complete, mid-run, no sleep. */
Test(tp_ckpt, killed_rank_in_2x2_after_checkpoint_then_resume, .timeout = 60) {
  enum { N = 4, VICTIM = 3, STEPS_R = 80, EVERY = 5, KILL_AT = 10 };
  (void)th_cli();
  char *dir = th_tmpdir(), *needle = th_fmt("ckpt_%08d.bin (manifest", KILL_AT);
  /* the ranks of a launched job know they are 4 from the environment, and still get
   * --ranks 4, as in a direct run */
  const char *grid = MODEL " --batch 2 --tp 2 --ranks 4 --parallel ddp";
  th_kill_resume c = {
      .wrap = "timeout 60 ",
      .run_args = grid,
      .job_args = grid,
      .nranks = N,
      .victim = VICTIM,
      .steps = STEPS_R,
      .every = EVERY,
      .kill_at = KILL_AT,
      .grid_tp = 2,
      .grid_dp = 1,
      .strict = 0,
      .needle = needle,
      .kill_limit_s = KILL_LIMIT_S,
  };
  long k = th_kill_then_resume(dir, &c);
  cr_log_info("2x2 grid: killed rank %d after checkpoint %d; checkpoint %ld intact, resumed: "
              "%ld losses and the final checkpoint bitwise the uninterrupted run's",
              VICTIM, KILL_AT, k, STEPS_R - k);
  th_rmrf(dir);
  free(needle), free(dir);
}
