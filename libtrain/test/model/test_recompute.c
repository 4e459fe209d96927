/*
 * test_recompute.c — activation recomputation (--recompute full|selective, model.c).
 *
 *  - the same bits: recomputing a block's forward (full) or its attention probabilities
 *    (selective) runs the same kernels on the same inputs, so every step's loss is
 *    bitwise the run without recomputation — on one process, under tensor parallelism
 *    with sequence parallelism (the recomputed LayerNorms gather again), under FSDP
 *    (the recomputed block reads its gathered parameters) and in a pipeline.
 *  - the memory: the measured peak resident size falls by what --plan says it falls,
 *    within 15 %, at a shape where activations are most of the memory (seq 256: the
 *    attention probabilities are B·NH·T² floats a block).
 *  - bad input: an unknown mode, and zb (whose W needs what recomputation gives back).
 */
#include <criterion/criterion.h>

#include "common/train_test.h"

#define SMALL                                                                            \
  "--layers 4 --channels 64 --heads 4 --max-seq 64 --seq 64 --threads 1 --eval-every 0 " \
  "--sample-len 0 --seed 7 --steps 8 --quiet"

/* The --losses file of a run, whole. */
static char *losses(const char *args) {
  char *dir = th_tmpdir(), *base = th_fmt("%s/run", dir), *lf = th_fmt("%s/l", dir);
  char *cmd = th_fmt("timeout 120 %s " SMALL " %s --losses %s", th_cli(), args, lf);
  free(th_run_ok(cmd, base));
  char *l = th_read(lf, NULL);
  cr_assert(l && *l, "%s: no losses", args);
  th_rmrf(dir);
  free(dir), free(base), free(lf), free(cmd);
  return l;
}

Test(recompute, same_bits_under_every_strategy, .timeout = 300) {
  static const char *runs[] = {
      "--batch 4",
      "--batch 4 --tp 2 --sp",
      "--batch 2 --parallel fsdp --ranks 2",
      "--batch 2 --pp 2 --micro-batches 2",
  };
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
    char *none = losses(runs[i]);
    for (int mode = 0; mode < 2; mode++) {
      char *args = th_fmt("%s --recompute %s", runs[i], mode ? "selective" : "full");
      char *got = losses(args);
      cr_assert_str_eq(got, none, "%s: losses differ from the run without recomputation", args);
      free(got), free(args);
    }
    free(none);
  }
}

/* Planned total and measured peak (MiB) from a run's "memory: planned X MiB ... VmHWM Y" line. */
static void memory_of(const char *mode, double *plan, double *peak) {
  char *dir = th_tmpdir(), *base = th_fmt("%s/run", dir);
  char *cmd = th_fmt("timeout 120 %s --layers 4 --channels 64 --heads 4 --max-seq 256 --seq 256 "
                     "--batch 8 --threads 1 --eval-every 0 --sample-len 0 --steps 2 --quiet "
                     "--recompute %s",
                     th_cli(), mode);
  th_memory_of(cmd, base, plan, peak);
  th_rmrf(dir);
  free(cmd), free(base), free(dir);
}

Test(recompute, lowers_the_peak_by_what_the_plan_says, .timeout = 120) {
  double plan0, peak0;
  memory_of("none", &plan0, &peak0);
  for (int mode = 0; mode < 2; mode++) {
    double plan, peak;
    memory_of(mode ? "selective" : "full", &plan, &peak);
    double planned = plan0 - plan, measured = peak0 - peak;
    cr_log_info("--recompute %s: plan %.1f -> %.1f MiB (-%.1f), measured %.1f -> %.1f (-%.1f)\n",
                mode ? "selective" : "full", plan0, plan, planned, peak0, peak, measured);
    cr_assert(planned > 0, "the plan says --recompute saves nothing");
    cr_assert(fabs(measured - planned) <= 0.15 * planned,
              "--recompute %s: measured saving %.1f MiB, planned %.1f", mode ? "selective" : "full",
              measured, planned);
  }
}

static void refused(const char *args, const char *needle) {
  char *dir = th_tmpdir();
  char *base = th_fmt("%s/../%s", dir, strrchr(dir, '/') + 1);
  char *cmd = th_fmt("timeout 30 %s " SMALL " --batch 2 %s", th_cli(), args);
  th_expect_refused(cmd, base, args, needle);
  th_rmrf(dir);
  free(cmd), free(base), free(dir);
}

Test(recompute, bad_input_is_refused, .timeout = 60) {
  refused("--recompute some", "not none, full or selective");
  refused("--pp 2 --schedule zb --recompute full", "zb with --recompute full");
}
