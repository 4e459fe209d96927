/*
 * test_fsdp_ckpt.c — sharded checkpoints of the fully sharded trainer (train_fsdp_save,
 * train_session_load of a manifest):
 *
 *  - same N: N ranks save after HALF steps; a fresh job of N ranks loads it and its losses
 *    are bitwise those of the job that never stopped (ZeRO-1, 2, 3 at N = 2);
 *  - another N: a ZeRO-3 job of 4 ranks saves after HALF steps; a job of 2 ranks and one
 *    process (--parallel none) load it: the consolidated state (parameters, AdamW m and v)
 *    after the load is bitwise the state the 4 ranks gathered at the save, and the next
 *    steps' losses follow the 4-rank job within LOSS_RELTOL (only the summation order
 *    differs);
 *  - a plain (one-process) checkpoint resumes under FSDP with the same state;
 *  - through coll-train at N = 4, ZeRO-3: rank 1 is killed (SIGKILL) once rank 0 has
 *    reported checkpoint KILL_AT complete; the survivors exit non-zero within KILL_LIMIT_S
 *    with a `coll-train: rank r of 4:` sentence; the checkpoint on disk is complete, and
 *    resuming from it at the same N prints the uninterrupted run's losses and writes
 *    byte-identical final shards and manifest.
 */
#include <criterion/criterion.h>

#include <coll_launch.h>
#include <sys/mman.h>

#include "parallel/fsdp.h"
#include "common/env_job.h"
#include "common/train_test.h"
#include "train.h"

#define B 2
#define T 16
#define STEPS 10
#define HALF 5
#define LOSS_RELTOL 1e-5
#define KILL_LIMIT_S 5.0

static train_options small_options(int batch) {
  train_config cfg = {.vocab = 256, .max_seq = 16, .layers = 2, .channels = 32, .heads = 2};
  return th_options(cfg, batch, T, 42, STEPS, 2, 1e-2f);
}

/* What one job does: load `load` first (if set), run `steps` steps, save to `save` (if
 * set) and gather the consolidated state right after the load (`state_after_load`) or at
 * the end. Shared memory, so the parent sees what the ranks wrote. */
typedef struct job {
  int nranks, zero, steps, batch;
  char load[512], save[512];
  size_t np;
  float *loss;  /* [steps], rank 0 */
  float *state; /* params, m, v (3 np) gathered by rank 0 */
  int state_after_load;
} job;

static size_t count_params(void) {
  train_options o = small_options(B);
  return th_num_params(&o.cfg);
}

static job *job_new(int nranks, int zero, int steps) {
  job *j = th_shared_alloc(sizeof *j);
  j->nranks = nranks;
  j->zero = zero;
  j->steps = steps;
  j->batch = B;
  j->np = count_params();
  j->loss = th_shared_alloc(STEPS * sizeof(float));
  j->state = th_shared_alloc(3 * j->np * sizeof(float));
  return j;
}

static void job_free(job *j) {
  munmap(j->loss, STEPS * sizeof(float));
  munmap(j->state, 3 * j->np * sizeof(float));
  munmap(j, sizeof *j);
}

static int ckpt_rank(coll_comm_t comm, int rank, int nranks, void *arg) {
  job *j = arg;
  char err[TRAIN_ERRLEN];
  train_options o = small_options(j->batch);
  train_session *s = train_session_create(&o, err);
  train_backend *b = s ? train_backend_coll(comm, 0, err) : NULL;
  if (!b) return th_rank_fail(rank, "start", err, 2);
  train_session_set_batch_mult(s, nranks);
  if (j->load[0] && train_session_load(s, j->load, err) != 0)
    return th_rank_fail(rank, "load", err, 3);
  train_fsdp_options fo = train_fsdp_options_default();
  fo.zero = j->zero;
  train_fsdp *f = train_fsdp_create(s, b, &fo, err);
  if (!f) return th_rank_fail(rank, "create", err, 4);
  size_t np = j->np;
  float *st = rank == 0 ? j->state : malloc(3 * np * sizeof(float));
  if (j->state_after_load && train_fsdp_gather(f, st, st + np, st + 2 * np, NULL, err) != 0)
    return th_rank_fail(rank, "gather", err, 5);
  for (int i = 0; i < j->steps; i++) {
    train_fsdp_stats fs;
    if (train_fsdp_step(f, &fs, err) != 0) return th_rank_fail(rank, "step", err, 6);
    if (rank == 0) j->loss[i] = fs.step.loss;
  }
  if (j->save[0] && train_fsdp_save(f, j->save, err) != 0)
    return th_rank_fail(rank, "save", err, 7);
  if (!j->state_after_load && train_fsdp_gather(f, st, st + np, st + 2 * np, NULL, err) != 0)
    return th_rank_fail(rank, "gather", err, 8);
  if (rank != 0) free(st);
  train_fsdp_free(f);
  b->destroy(b);
  train_session_free(s);
  return 0;
}

static void run_job(job *j) {
  th_launch(j->nranks, ckpt_rank, j, 60000, NULL, "N=%d ZeRO-%d job", j->nranks, j->zero);
}

Test(fsdp_ckpt, same_n_resume_is_bitwise, .timeout = 60) {
  char *dir = th_tmpdir();
  for (int z = 1; z <= 3; z++) {
    job *full = job_new(2, z, STEPS), *first = job_new(2, z, HALF),
        *rest = job_new(2, z, STEPS - HALF);
    run_job(full);
    snprintf(first->save, sizeof first->save, "%s/z%d.bin", dir, z);
    run_job(first);
    cr_assert_eq(th_count_entries(dir), 3 * z,
                 "ZeRO-%d: expected a manifest and 2 "
                 "shards, nothing else (temp files?)",
                 z);
    snprintf(rest->load, sizeof rest->load, "%s", first->save);
    run_job(rest);
    for (int i = 0; i < HALF; i++)
      cr_assert(memcmp(&first->loss[i], &full->loss[i], sizeof(float)) == 0,
                "ZeRO-%d: step %d differs before the save", z, i + 1);
    for (int i = 0; i < STEPS - HALF; i++)
      cr_assert(memcmp(&rest->loss[i], &full->loss[HALF + i], sizeof(float)) == 0,
                "ZeRO-%d: step %d after the resume: loss %.9g, uninterrupted %.9g", z, HALF + i + 1,
                rest->loss[i], full->loss[HALF + i]);
    cr_assert(memcmp(rest->state, full->state, 3 * full->np * sizeof(float)) == 0,
              "ZeRO-%d: final parameters or AdamW state differ after the resume", z);
    job_free(full), job_free(first), job_free(rest);
  }
  th_rmrf(dir);
  free(dir);
}

/* One process from a checkpoint: its consolidated state after the load and its losses. */
static void one_process(const char *path, int batch, int steps, float *state, float *loss) {
  char err[TRAIN_ERRLEN];
  train_options o = small_options(batch);
  train_session *s = train_session_create(&o, err);
  cr_assert(s, "%s", err);
  cr_assert_eq(train_session_load(s, path, err), 0, "%s", err);
  cr_assert_eq(th_state_to_host(train_session_model(s), state), 1,
               "the loaded session has no AdamW state");
  for (int i = 0; i < steps; i++) loss[i] = train_session_step(s).loss;
  train_session_free(s);
}

static void expect_close(const float *a, const float *ref, int n, const char *who) {
  for (int i = 0; i < n; i++) {
    double rel = fabs((double)a[i] - ref[i]) / fabs((double)ref[i]);
    cr_expect(rel <= LOSS_RELTOL, "%s: step %d loss %.9g, 4 ranks %.9g", who, HALF + i + 1, a[i],
              ref[i]);
  }
}

Test(fsdp_ckpt, reshard_4_to_2_and_to_1, .timeout = 60) {
  char *dir = th_tmpdir();
  job *saver = job_new(4, 3, HALF), *cont4 = job_new(4, 3, STEPS - HALF),
      *at2 = job_new(2, 3, STEPS - HALF);
  snprintf(saver->save, sizeof saver->save, "%s/n4.bin", dir);
  run_job(saver); /* its state: gathered right after the save */
  snprintf(cont4->load, sizeof cont4->load, "%s", saver->save);
  run_job(cont4);
  size_t np = saver->np, bytes = 3 * np * sizeof(float);

  /* 2 ranks of batch 2B read the rows 4 ranks of batch B read */
  snprintf(at2->load, sizeof at2->load, "%s", saver->save);
  at2->batch = 2 * B;
  at2->state_after_load = 1;
  run_job(at2);
  cr_assert(memcmp(at2->state, saver->state, bytes) == 0,
            "4 -> 2 ranks: the consolidated parameters + AdamW state after the load differ "
            "from what the 4 ranks saved");
  expect_close(at2->loss, cont4->loss, STEPS - HALF, "4 -> 2 ranks");

  /* one process (--parallel none) of batch 4B */
  float *st1 = malloc(bytes), l1[STEPS];
  one_process(saver->save, 4 * B, STEPS - HALF, st1, l1);
  cr_assert(memcmp(st1, saver->state, bytes) == 0,
            "4 ranks -> one process: the loaded parameters + AdamW state differ from what "
            "the 4 ranks saved");
  expect_close(l1, cont4->loss, STEPS - HALF, "4 ranks -> one process");
  cr_log_info("4 -> 2 ranks and 4 -> 1 process: state after the load bitwise equal (%zu "
              "floats x 3); %d steps on within %g",
              np, STEPS - HALF, LOSS_RELTOL);
  free(st1);
  job_free(saver), job_free(cont4), job_free(at2);
  th_rmrf(dir);
  free(dir);
}

/* A plain checkpoint (one process, batch 4B) resumes under FSDP on 4 ranks of batch B. */
Test(fsdp_ckpt, plain_checkpoint_resumes_under_fsdp, .timeout = 60) {
  char err[TRAIN_ERRLEN];
  char *dir = th_tmpdir(), *path = th_fmt("%s/plain.bin", dir);
  train_options o = small_options(4 * B);
  train_session *s = train_session_create(&o, err);
  cr_assert(s, "%s", err);
  for (int i = 0; i < HALF; i++) train_session_step(s);
  cr_assert_eq(train_session_save(s, path, err), 0, "%s", err);
  size_t np = train_num_params(train_session_model(s));
  float *want = malloc(3 * np * sizeof(float));
  th_state_to_host(train_session_model(s), want);
  train_session_free(s);
  job *j = job_new(4, 3, 1);
  snprintf(j->load, sizeof j->load, "%s", path);
  j->state_after_load = 1;
  run_job(j);
  cr_assert(memcmp(j->state, want, 3 * np * sizeof(float)) == 0,
            "plain checkpoint -> 4 FSDP ranks: the state after the load differs");
  free(want);
  job_free(j);
  th_rmrf(dir);
  free(dir);
  free(path);
}

/* ---- through coll-train: a rank killed after checkpoint KILL_AT -------------------- */

#define FSDP_MODEL                                                      \
  "--layers 2 --channels 32 --heads 2 --max-seq 16 --seq 16 --batch 2 " \
  "--lr 1e-2 --warmup 3 --eval-every 0 --threads 1 --parallel fsdp --zero 3"

/* N = 4, ZeRO-3, checkpoints every EVERY steps. Rank 0's output pipe is shrunk to 4 KiB
 * and read 256 bytes at a time: once the test has read "checkpoint ...KILL_AT" rank 0 is
 * at most ~4 KiB of output (~25 step lines) further, so the kill lands mid-run, after
 * checkpoint KILL_AT is complete (rank 0 prints it after every rank has learnt that the
 * manifest is written), with no sleep. The checkpoint must have all N shards, and every
 * shard and the manifest must equal the uninterrupted run's (a rank killed while writing
 * a later one may leave its temp file: the directory is not checked for those). */
Test(fsdp_ckpt, killed_rank_after_checkpoint_then_resume_at_same_n, .timeout = 90) {
  enum { N = 4, VICTIM = 1, STEPS_R = 80, EVERY = 5, KILL_AT = 10 };
  (void)th_cli();
  char *dir = th_tmpdir(), *needle = th_fmt("ckpt_%08d.bin (manifest", KILL_AT);
  char *run = th_fmt(FSDP_MODEL " --ranks %d", N);
  th_kill_resume c = {
      .wrap = "",
      .run_args = run,
      .job_args = FSDP_MODEL,
      .nranks = N,
      .victim = VICTIM,
      .steps = STEPS_R,
      .every = EVERY,
      .kill_at = KILL_AT,
      .grid_tp = 1,
      .grid_dp = N,
      .strict = 0,
      .needle = needle,
      .kill_limit_s = KILL_LIMIT_S,
  };
  long k = th_kill_then_resume(dir, &c);
  cr_log_info("killed rank %d after checkpoint %d (N=%d, ZeRO-3); resumed from step %ld; "
              "%ld losses and the final shards + manifest bitwise the uninterrupted run's",
              VICTIM, KILL_AT, N, k, STEPS_R - k);
  th_rmrf(dir);
  free(needle), free(run), free(dir);
}
