/*
 * test_cp.c — context parallelism (parallel/cp.c) through coll-train, against one process
 * on the same global batch.
 *
 *  - the chunks: for C = 1..8 the ranks' positions (chunks r and 2C-1-r of 2C) cover
 *    every position of a sequence once, and each rank has the same number of causal
 *    query-key pairs (the balance the cut is for).
 *  - parity: --cp 2 and 4, ring attention and Ulysses, 20 steps, against --parallel none
 *    with the same --batch: every step's loss within 1e-5 relative. The ring's
 *    log-sum-exp merge and the weight gradients summed over the ring's ranks round
 *    differently from one process, so most steps differ in the last bit (~1e-7 relative;
 *    the bitwise-equal steps are counted in the log). A chunk at the wrong position, a
 *    dK/dV sum that missed its owner or a mask by local instead of true positions moves
 *    the loss by >= 1e-3.
 *  - composition: --cp 2 x D 2 (DDP) on 4 ranks, ring and Ulysses (and the ring with
 *    --accum 2), against one process with the global batch; --cp 2 x --tp 2 on 4 ranks,
 *    both modes (the ring over each TP rank's heads); ZeRO-1 and ZeRO-3 (--parallel fsdp)
 *    over the CP ranks and over CP 2 x D 2.
 *  - over Open MPI (when built and installed): ring and Ulysses parity as above.
 *  - checkpoints: a context-parallel run resumed at its own layout (DDP; ZeRO-3 over
 *    CP 2 x D 2) prints bitwise the uninterrupted run's losses and writes byte-identical
 *    final checkpoints; one process resumes a CP checkpoint, and a CP run one process's,
 *    within 1e-5 of the uninterrupted run (the checkpoint is a layout-free one).
 *  - memory: the peak resident size of a ring and a Ulysses run within 15 % of the
 *    planner's row (the model's untouched (T/C)^2 buffers left out of both).
 *  - --plan, --explain and --trace say what they should: the CP rows, the ring's steps,
 *    the ring's transfers on the timeline.
 *  - bad input, refused with one line and exit status 1.
 */
#include <criterion/criterion.h>

#include "comm/backend.h"
#include "common/train_test.h"
#include "parallel/cp.h"

#define MODEL                                                                         \
  "--layers 2 --channels 32 --heads 4 --vocab 257 --max-seq 32 --seq 16 --threads 1 " \
  "--eval-every 0 --sample-len 0 --seed 7 --lr 1e-2 --warmup 3"
#define STEPS 20
#define RELTOL 1e-5

Test(cp, chunks_cover_the_sequence_and_balance_the_mask) {
  for (int C = 1; C <= 8; C++) {
    int T = 2 * C * 3, seen[48] = {0};
    long pairs0 = -1;
    for (int r = 0; r < C; r++) {
      long pairs = 0;
      for (int t = 0; t < T / C; t++) {
        int p = train_cp_pos(T, C, r, t);
        cr_assert(p >= 0 && p < T, "C %d rank %d row %d: position %d", C, r, t, p);
        seen[p]++;
        pairs += p + 1; /* the keys a causal query at p sees */
      }
      if (pairs0 < 0) pairs0 = pairs;
      cr_assert_eq(pairs, pairs0, "C %d: rank %d has %ld causal pairs, rank 0 %ld", C, r, pairs,
                   pairs0);
    }
    for (int p = 0; p < T; p++)
      cr_assert_eq(seen[p], 1, "C %d: position %d held %d times", C, p, seen[p]);
    int full[2 * 48], mine[2 * 48];
    for (int i = 0; i < 2 * T; i++) full[i] = i;
    train_cp_take(full, mine, 2, T, C, C - 1);
    for (int b = 0; b < 2; b++)
      for (int t = 0; t < T / C; t++)
        cr_assert_eq(mine[b * (T / C) + t], b * T + train_cp_pos(T, C, C - 1, t));
  }
}

/* Runs coll-train with args and --losses; reads the losses (hex floats) into l. */
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

/* The run's losses against one process's on the global batch; returns the number of
 * steps bitwise equal, *maxrel the largest relative difference. */
static int parity(const char *args, int global_batch, double *maxrel) {
  float ref[STEPS], got[STEPS];
  char *one = th_fmt("--batch %d", global_batch);
  cr_assert_eq(losses(one, ref, STEPS), STEPS);
  cr_assert_eq(losses(args, got, STEPS), STEPS, "%s: fewer than %d steps", args, STEPS);
  int same = 0;
  *maxrel = 0.0;
  for (int i = 0; i < STEPS; i++) {
    double rel = fabs((double)got[i] - ref[i]) / fabs((double)ref[i]);
    cr_assert(rel <= RELTOL, "%s: step %d loss %.9g, one process %.9g (rel %.3g)", args, i + 1,
              got[i], ref[i], rel);
    *maxrel = rel > *maxrel ? rel : *maxrel;
    same += got[i] == ref[i];
  }
  free(one);
  return same;
}

static void parity_case(const char *args, int global_batch) {
  double rel;
  int same = parity(args, global_batch, &rel);
  cr_log_info("cp parity %-60s: max rel %.3g, %d of %d steps bitwise equal\n", args, rel, same,
              STEPS);
}

Test(cp, ring_matches_one_process, .timeout = 240) {
  parity_case("--parallel ddp --cp 2 --batch 2", 2);
  parity_case("--parallel ddp --cp 4 --batch 2", 2);
}

Test(cp, ulysses_matches_one_process, .timeout = 240) {
  parity_case("--parallel ddp --cp 2 --cp-mode ulysses --batch 2", 2);
  parity_case("--parallel ddp --cp 4 --cp-mode ulysses --batch 2", 2);
}

Test(cp, cp_times_ddp_matches_one_process, .timeout = 240) {
  parity_case("--parallel ddp --cp 2 --ranks 4 --batch 2", 4);
  parity_case("--parallel ddp --cp 2 --cp-mode ulysses --ranks 4 --batch 2", 4);
  parity_case("--parallel ddp --cp 2 --ranks 4 --accum 2 --batch 2", 8); /* and accumulation */
}

/* ZeRO-1 and 3 over the D x Cp ranks: the gradients and AdamW's state sharded over both */
/* Over Open MPI: the ring through the blocking exchange (no exchange_start there), Ulysses
 * through MPI_Ialltoall */
Test(cp, over_open_mpi_matches_one_process, .timeout = 240) {
  if (!train_backend_mpi_built())
    cr_skip_test("this build has no Open MPI backend (install libopenmpi-dev)");
  if (system("command -v mpirun.openmpi >/dev/null 2>&1") != 0)
    cr_skip_test("mpirun.openmpi is not installed (Debian: openmpi-bin)");
#if defined(__SANITIZE_ADDRESS__)
  /* Open MPI's plugins keep allocations past MPI_Finalize, which LeakSanitizer reports
   * (from modules dlclose has unmapped) and which are no part of this code */
  cr_skip_test("Open MPI's own allocations are reported as leaks under AddressSanitizer");
#endif
  parity_case("--parallel ddp --cp 2 --backend mpi --batch 2", 2);
  parity_case("--parallel ddp --cp 2 --cp-mode ulysses --backend mpi --batch 2", 2);
}

/* recomputation reruns the ring (or the all-to-alls) inside backward, on every rank alike */
Test(cp, recomputation_matches_one_process, .timeout = 240) {
  parity_case("--parallel ddp --cp 2 --recompute full --batch 2", 2);
  parity_case("--parallel ddp --cp 2 --cp-mode ulysses --recompute selective --batch 2", 2);
}

Test(cp, cp_times_fsdp_matches_one_process, .timeout = 240) {
  parity_case("--parallel fsdp --zero 1 --cp 2 --batch 2", 2);
  parity_case("--parallel fsdp --zero 3 --cp 2 --ranks 4 --cp-mode ulysses --batch 2", 4);
}

/* CP 2 x TP 2 on 4 ranks: the ring (or Ulysses' all-to-all) over the heads each
 * tensor-parallel rank holds */
Test(cp, cp_times_tp_matches_one_process, .timeout = 240) {
  parity_case("--parallel ddp --cp 2 --tp 2 --ranks 4 --batch 2", 2);
  parity_case("--parallel ddp --cp 2 --tp 2 --cp-mode ulysses --ranks 4 --batch 2", 2);
}

/* --plan prints both CP rows; --explain the ring's steps; --trace puts the ring's
 * transfers and attention blocks on every rank's timeline. */
Test(cp, plan_explain_and_trace, .timeout = 120) {
  char *dir = th_tmpdir(), *base = th_fmt("%s/run", dir);
  char *cmd = th_fmt("timeout 60 %s " MODEL " --cp 2 --ranks 4 --parallel ddp --plan", th_cli());
  char *o = th_run_ok(cmd, base);
  cr_assert(strstr(o, "CP ring") && strstr(o, "Ulysses "), "no CP rows in --plan: %s", o);
  free(o), free(cmd);
  cmd = th_fmt("timeout 60 %s " MODEL " --cp 2 --explain", th_cli());
  o = th_run_ok(cmd, base);
  /* seq 16, C 2: chunks of 4; rank 0 holds 0..3 and 12..15 */
  cr_assert(strstr(o, "rank 0: positions 0..3 and 12..15"), "--explain: %s", o);
  cr_assert(strstr(o, "step 1:"), "--explain has no second ring step: %s", o);
  free(o), free(cmd);
  char *tr = th_fmt("%s/trace.json", dir);
  cmd = th_fmt("timeout 120 %s " MODEL " --cp 2 --parallel ddp --batch 2 --steps 2 --trace %s",
               th_cli(), tr);
  free(th_run_ok(cmd, base));
  char *j = th_read(tr, NULL);
  cr_assert(j, "no trace at %s", tr);
  cr_assert(strstr(j, "ring kv fwd") && strstr(j, "ring dkv bwd") && strstr(j, "ring attn fwd"),
            "the trace lacks the ring's steps");
  free(j), free(tr), free(cmd), free(base);
  th_rmrf(dir);
  free(dir);
}

Test(cp, peak_memory_within_15_percent_of_the_plan, .timeout = 240) {
#if defined(__SANITIZE_ADDRESS__)
  /* the run is this build's coll-train: ASan's shadow and redzones are no part of a plan */
  cr_skip_test("peak memory is not comparable under AddressSanitizer");
#endif
  static const char *modes[] = {"ring", "ulysses"};
  for (int u = 0; u < 2; u++) {
    char *dir = th_tmpdir(), *base = th_fmt("%s/run", dir);
    char *cmd = th_fmt("timeout 200 %s --layers 4 --channels 128 --heads 8 --max-seq 256 --seq "
                       "256 --batch 4 --threads 1 --eval-every 0 --sample-len 0 --steps 2 "
                       "--parallel ddp --cp 2 --cp-mode %s",
                       th_cli(), modes[u]);
    /* "memory: planned X MiB per rank (...); measured peak ... largest / planned = R" */
    char *o = th_run_ok(cmd, base), *p = strstr(o, "memory: planned "), *q;
    double plan = 0.0, ratio = 0.0;
    cr_assert(p && sscanf(p, "memory: planned %lf MiB", &plan) == 1, "no plan line in %s", o);
    cr_assert((q = strstr(p, "largest / planned = ")) &&
                  sscanf(q, "largest / planned = %lf", &ratio) == 1,
              "no ratio in %s", p);
    cr_log_info("cp %s: planned %.1f MiB, largest peak / planned %.3f\n", modes[u], plan, ratio);
    cr_assert(fabs(ratio - 1.0) <= 0.15, "%s: peak / planned %.3f", modes[u], ratio);
    free(o);
    th_rmrf(dir);
    free(dir), free(base), free(cmd);
  }
}

/* `args` with --steps STEPS, --ckpt-dir ckdir every HALF steps (and --resume resume); its
 * --losses into l (all STEPS lines, or STEPS - HALF after a resume). */
#define HALF 10
static int ck_run(const char *args, const char *ckdir, const char *resume, float *l) {
  char *lf = th_fmt("%s.losses", ckdir), *base = th_fmt("%s.run", ckdir);
  char *cmd = th_fmt("timeout 120 %s " MODEL " --steps %d --quiet %s --ckpt-dir %s --ckpt-every %d "
                     "--losses %s %s %s",
                     th_cli(), STEPS, args, ckdir, HALF, lf, resume ? "--resume" : "",
                     resume ? resume : "");
  free(th_run_ok(cmd, base));
  int n = th_read_losses(lf, l, STEPS);
  free(lf), free(base), free(cmd);
  return n;
}

/* The run `args` from its own checkpoint at HALF against itself uninterrupted (bitwise, and
 * its last checkpoint byte for byte, 1 x shards files), then `other` (another layout) from
 * the same checkpoint within RELTOL. */
static void resume_case(const char *args, int shards, const char *other) {
  char *dir = th_tmpdir(), *full = th_fmt("%s/full", dir), *again = th_fmt("%s/again", dir),
       *x = th_fmt("%s/other", dir), *ck = th_fmt("%s/ckpt_%08d.bin", full, HALF);
  float lf[STEPS], la[STEPS], lo[STEPS];
  cr_assert_eq(ck_run(args, full, NULL, lf), STEPS);
  cr_assert_eq(ck_run(args, again, ck, la), STEPS - HALF);
  for (int i = 0; i < STEPS - HALF; i++)
    cr_assert(la[i] == lf[HALF + i], "%s step %d: resumed %.9g, uninterrupted %.9g", args,
              HALF + 1 + i, la[i], lf[HALF + i]);
  th_assert_same_checkpoint(full, again, STEPS, 1, shards);
  cr_assert_eq(ck_run(other, x, ck, lo), STEPS - HALF);
  double mx = 0.0;
  for (int i = 0; i < STEPS - HALF; i++) {
    double rel = fabs((double)lo[i] - lf[HALF + i]) / fabs((double)lf[HALF + i]);
    cr_assert(rel <= RELTOL, "%s resumed by %s, step %d: %.9g against %.9g", args, other,
              HALF + 1 + i, lo[i], lf[HALF + i]);
    mx = rel > mx ? rel : mx;
  }
  cr_log_info("%s: resumed bitwise at its own layout; by '%s' within %.3g\n", args, other, mx);
  th_rmrf(dir);
  free(dir), free(full), free(again), free(x), free(ck);
}

Test(cp, checkpoints_resume_at_any_layout, .timeout = 240) {
  resume_case("--parallel ddp --cp 2 --batch 2", 1, "--batch 2");
  resume_case("--parallel fsdp --zero 3 --cp 2 --ranks 4 --cp-mode ulysses --batch 2", 4,
              "--parallel ddp --ranks 2 --batch 2");
  resume_case("--batch 2", 1, "--parallel ddp --cp 2 --cp-mode ulysses --batch 2");
}

static void refused(const char *args, const char *needle) {
  char *dir = th_tmpdir(), *base = th_fmt("%s/run", dir);
  char *cmd = th_fmt("timeout 60 %s " MODEL " --steps 2 %s", th_cli(), args);
  th_expect_refused(cmd, base, args, needle);
  th_rmrf(dir);
  free(dir), free(base), free(cmd);
}

Test(cp, bad_input_refused_in_one_line, .timeout = 120) {
  refused("--parallel ddp --cp 3", "not a multiple of 2 x 3"); /* seq 16 */
  refused("--parallel ddp --cp 4 --seq 12", "not a multiple of 2 x 4");
  refused("--parallel ddp --cp 2 --heads 2 --channels 32 --cp-mode ulysses --cp 4",
          "cannot be split evenly"); /* 2 heads over 4 */
  refused("--parallel ddp --cp 2 --ranks 3", "not a multiple of --cp 2 x --tp 1");
  refused("--cp 2", "--cp needs --parallel ddp or fsdp");
  refused("--parallel ddp --cp 2 --tp 2 --ranks 6", "not a multiple of --cp 2 x --tp 2");
  refused("--parallel ddp --cp 2 --tp 2 --sp --ranks 4", "--cp with --sp");
  refused("--parallel ddp --cp 2 --tp 2 --ranks 4 --cp-mode ulysses --heads 2",
          "heads must be a multiple of --cp x --tp");
  refused("--parallel ddp --cp 2 --pp 2 --ranks 4", "--cp with --pp is not built yet");
  refused("--parallel ddp --cp 2 --device cuda", "--cp runs on the CPU model only");
  refused("--parallel ddp --cp 2 --dtype bf16", "--cp with --dtype bf16");
  refused("--cp-mode ulysses", "--cp-mode needs --cp 2");
  refused("--parallel ddp --cp 2 --cp-mode tree", "not ring or ulysses");
  refused("--parallel ddp --cp 0", "--cp");
}
