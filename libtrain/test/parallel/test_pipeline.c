/*
 * test_pipeline.c — pipeline parallelism (pipeline.c) through coll-train, against one
 * process on the same global batch.
 *
 *  - parity: P = 2 and 4 stages with each schedule (gpipe, 1f1b, interleaved with 2
 *    chunks per stage, zb) at M = 1, 4 and 8 micro-batches (interleaved where M is a
 *    multiple of P), 20 steps, against --parallel none with --batch M*batch: every
 *    step's loss within 1e-5 relative. The pipeline computes the same sums in the same
 *    order but for two: the tied embedding's gradient (the embedding's half and the
 *    head's half added across the stages) and the loss and gradient norm (summed over
 *    micro-batches, then stages); fp32 over 20 steps gives ~1e-7, and most runs are
 *    bitwise equal — counted in the log. A stage that lost a micro-batch, a gradient
 *    sent to the wrong chunk or a missing embedding sync moves the loss by >= 1e-3.
 *  - data and tensor parallelism around it: P = 2 x D = 2 (DDP), T = 2 x P = 2 (with
 *    sequence parallelism too) and the 3-D grid T = 2 x P = 2 x D = 2 on 8 ranks, with
 *    DDP and with ZeRO-1 along D (also at D = 3, where the shards leave a tail).
 *  - the schedules' arithmetic as coll-train --explain prints it: P = 4, M = 8 (V = 2)
 *    gives the formulas' idle fractions exactly.
 *  - the trace at P = 2 runs the lists' order: each rank's F/B events of a step, in time
 *    order, are its list's compute actions.
 *  - memory: at P = 4 each stage's peak resident size within 15 % of the planner's row
 *    for that stage (coll-train prints both per rank).
 *  - a stage killed mid-run: every other rank exits with a sentence within seconds.
 *  - bad input, refused with one line and exit status 1 (--plan and --explain too).
 */
#include <criterion/criterion.h>

#include "common/env_job.h"
#include "common/train_test.h"

#define MODEL                                                                         \
  "--layers 8 --channels 32 --heads 4 --vocab 257 --max-seq 32 --seq 16 --threads 1 " \
  "--eval-every 0 --sample-len 0 --seed 7 --lr 1e-2 --warmup 3"
#define STEPS 20
#define RELTOL 1e-5

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

/* The pipeline run's losses against one process's on the same global batch; 1 when every
 * step is bitwise the same. */
static int parity(const char *args, int global_batch) {
  float ref[STEPS], got[STEPS];
  char *one = th_fmt("--batch %d", global_batch);
  cr_assert_eq(losses(one, ref, STEPS), STEPS);
  cr_assert_eq(losses(args, got, STEPS), STEPS, "%s: fewer than %d steps", args, STEPS);
  int same = 1;
  for (int i = 0; i < STEPS; i++) {
    double rel = fabs((double)got[i] - ref[i]) / fabs((double)ref[i]);
    cr_assert(rel <= RELTOL, "%s: step %d loss %.9g, one process %.9g (rel %.3g)", args, i + 1,
              got[i], ref[i], rel);
    same &= got[i] == ref[i];
  }
  free(one);
  return same;
}

Test(pipeline, every_schedule_matches_one_process, .timeout = 600) {
  static const char *kinds[] = {"gpipe", "1f1b", "interleaved", "zb"};
  int runs = 0, bitwise = 0;
  for (int P = 2; P <= 4; P += 2)
    for (int k = 0; k < 4; k++)
      for (int M = 1; M <= 8; M = M == 1 ? 4 : 8) {
        if (k == 2 && (M < P || M % P)) continue; /* interleaved needs M a multiple of P */
        char *args = th_fmt("--pp %d --schedule %s --micro-batches %d --batch 2", P, kinds[k], M);
        bitwise += parity(args, 2 * M);
        runs++;
        free(args);
        if (M == 8) break;
      }
  cr_log_info("pipeline parity: %d runs, %d bitwise equal to one process\n", runs, bitwise);
}

Test(pipeline, with_data_and_tensor_parallelism, .timeout = 600) {
  /* global batch 16 in every case: M * D * batch */
  static const char *grids[] = {
      "--pp 2 --ranks 4 --parallel ddp --micro-batches 4 --batch 2",
      "--pp 2 --tp 2 --micro-batches 8 --batch 2",
      "--pp 2 --tp 2 --sp --micro-batches 8 --batch 2",
      "--pp 2 --tp 2 --ranks 8 --parallel ddp --micro-batches 4 --batch 2",
      "--pp 2 --tp 2 --ranks 8 --parallel ddp --micro-batches 4 --batch 2 --schedule interleaved",
      /* ZeRO-1 along D: AdamW on a 1/D shard, the parameters all-gathered */
      "--pp 2 --ranks 4 --parallel fsdp --zero 1 --micro-batches 4 --batch 2",
      "--pp 2 --ranks 4 --parallel fsdp --zero 1 --micro-batches 4 --batch 2 --schedule zb",
      "--pp 2 --tp 2 --ranks 8 --parallel fsdp --zero 1 --micro-batches 4 --batch 2",
      /* zero-bubble's W under tensor parallelism (local weight gradients) */
      "--pp 2 --tp 2 --micro-batches 8 --batch 2 --schedule zb",
      "--pp 2 --micro-batches 8 --batch 2 --schedule zb --recompute selective",
  };
  for (size_t i = 0; i < sizeof grids / sizeof grids[0]; i++) parity(grids[i], 16);
  /* D = 3: the flat arrays do not split evenly; the tail stays replicated */
  parity("--pp 2 --ranks 6 --parallel fsdp --zero 1 --micro-batches 8 --batch 1", 24);
}

/* coll-train --explain's "idle fraction X (from the lists) = formula Y" line. */
static void explain_says(const char *args, const char *want) {
  char *dir = th_tmpdir(), *base = th_fmt("%s/run", dir);
  char *cmd = th_fmt("timeout 30 %s --layers 8 %s --explain", th_cli(), args);
  char *o = th_run_ok(cmd, base);
  cr_assert(strstr(o, want), "%s: expected '%s' in:\n%s", args, want, o);
  th_rmrf(dir);
  free(o), free(cmd), free(base), free(dir);
}

Test(pipeline, explain_prints_the_formulas_bubble, .timeout = 60) {
  explain_says("--pp 4 --micro-batches 8 --schedule gpipe",
               "idle fraction 0.375 (from the lists) = formula 0.375");
  explain_says("--pp 4 --micro-batches 8 --schedule 1f1b",
               "idle fraction 0.375 (from the lists) = formula 0.375");
  explain_says("--pp 4 --micro-batches 8 --schedule interleaved --chunks 2",
               "idle fraction 0.1875 (from the lists) = formula 0.1875");
  explain_says("--pp 4 --micro-batches 8 --schedule zb",
               "idle fraction 0.125 (from the lists) = formula 0.125");
}

/* The compute events of each rank's first step, in time order, joined by spaces. */
static char *trace_order(const char *json, int rank) {
  char *dir = th_tmpdir(), *base = th_fmt("%s/py", dir);
  char *cmd = th_fmt(
      "/usr/bin/python3 -c \"import json,sys; ev=[e for e in json.load(open('%s'))['traceEvents'] "
      "if e.get('ph')=='X' and e.get('pid')==%d and e.get('tid')==0]; ev.sort(key=lambda e: "
      "e['ts']); out=[]\n"
      "for e in ev:\n"
      "    if e['name']=='optimizer': break\n"
      "    out.append(e['name'])\n"
      "print(' '.join(out))\"",
      json, rank);
  char *o = th_run_ok(cmd, base);
  o[strcspn(o, "\n")] = 0;
  th_rmrf(dir);
  free(cmd), free(base), free(dir);
  return o;
}

Test(pipeline, trace_runs_the_lists_order, .timeout = 120) {
  char *dir = th_tmpdir(), *base = th_fmt("%s/run", dir), *json = th_fmt("%s/t.json", dir);
  char *cmd = th_fmt("timeout 60 %s " MODEL " --steps 2 --quiet --pp 2 --micro-batches 4 "
                     "--batch 2 --trace %s",
                     th_cli(), json);
  free(th_run_ok(cmd, base));
  /* 1F1B at P = 2, M = 4 (--explain's lists): stage 0 warms up with one forward */
  char *r0 = trace_order(json, 0), *r1 = trace_order(json, 1);
  cr_assert_str_eq(r0, "F0 F1 B0 F2 B1 F3 B2 B3");
  cr_assert_str_eq(r1, "F0 B0 F1 B1 F2 B2 F3 B3");
  th_rmrf(dir);
  free(r0), free(r1), free(cmd), free(json), free(base), free(dir);
}

Test(pipeline, each_stage_peak_memory_is_planned, .timeout = 300) {
  char *dir = th_tmpdir(), *base = th_fmt("%s/run", dir);
  char *cmd = th_fmt("timeout 240 %s --layers 8 --channels 256 --heads 4 --max-seq 128 --seq 128 "
                     "--batch 4 --steps 2 --eval-every 0 --sample-len 0 --threads 1 --quiet "
                     "--pp 4 --micro-batches 8",
                     th_cli());
  char *o = th_run_ok(cmd, base);
  char *line = strstr(o, "memory by rank (fixed part");
  cr_assert(line, "no per-rank memory line in:\n%s", o);
  int ranks = 0;
  for (char *p = line; (p = strstr(p, " rank ")); p++) {
    int r;
    double plan, peak, ratio;
    if (sscanf(p, " rank %d %lf -> %lf (%lf)", &r, &plan, &peak, &ratio) != 4) continue;
    cr_log_info("stage %d: planned %.1f MiB, measured %.1f MiB (%.3f)\n", r, plan, peak, ratio);
    cr_assert(ratio >= 0.85 && ratio <= 1.15, "stage %d: measured %.1f MiB, planned %.1f (%.3f)", r,
              peak, plan, ratio);
    ranks++;
  }
  cr_assert_eq(ranks, 4, "%d stages in: %s", ranks, line);
  th_rmrf(dir);
  free(o), free(cmd), free(base), free(dir);
}

/* Ranks started as a launcher would (env_job.h); a middle stage of a 4-stage pipeline is
 * killed once training is under way: the others, waiting on it in a transfer or beyond
 * it, exit with status 1 and a sentence within seconds (libcoll's watch links tell them). */
Test(pipeline, killed_stage_fails_the_others, .timeout = 60) {
  env_job_kill_under_way(4,
                         "--layers 4 --channels 32 --heads 4 --max-seq 32 --seq 16 --batch 2 "
                         "--threads 1 --eval-every 0 --steps 1000000 --pp 4 --micro-batches 4",
                         2, 10.0, 1, "coll-train: ");
}

static void refused(const char *args, const char *needle) {
  char *dir = th_tmpdir();
  char *base = th_fmt("%s/../%s", dir, strrchr(dir, '/') + 1);
  char *cmd = th_fmt("timeout 30 %s --layers 4 --channels 32 --heads 4 --seq 16 --batch 2 "
                     "--threads 1 --eval-every 0 --sample-len 0 --steps 2 %s",
                     th_cli(), args);
  th_expect_refused(cmd, base, args, needle);
  th_rmrf(dir);
  free(cmd), free(base), free(dir);
}

Test(pipeline, bad_input_is_refused, .timeout = 120) {
  refused("--pp 4 --micro-batches 2 --schedule interleaved", "micro");
  refused("--pp 2 --micro-batches 3 --schedule interleaved", "multiple");
  refused("--pp 3 --ranks 4 --parallel ddp", "--tp 1 x --pp 3");
  refused("--pp 2 --tp 2 --ranks 6 --parallel ddp", "--tp 2 x --pp 2");
  refused("--pp 8", "cannot be cut");
  refused("--pp 2 --schedule interleaved --chunks 4", "cannot be cut");
  refused("--pp 2 --ranks 4", "--parallel ddp");
  refused("--schedule zb", "need --pp");
  refused("--pp 2 --schedule fast", "not gpipe, 1f1b, interleaved or zb");
  refused("--pp 2 --tp 2 --sp --schedule zb", "zb with --sp");
  refused("--pp 2 --schedule zb --recompute full", "zb with --recompute full");
  refused("--pp 2 --accum 2 --parallel ddp --ranks 2", "micro-batches");
  refused("--pp 2 --ranks 4 --parallel fsdp --zero 2", "needs --zero 1");
  /* --plan and --explain refuse what a run refuses */
  refused("--pp 2 --micro-batches 3 --schedule interleaved --plan", "multiple");
  refused("--pp 8 --plan", "cannot be cut");
  refused("--pp 4 --micro-batches 2 --schedule interleaved --explain", "micro");
}
