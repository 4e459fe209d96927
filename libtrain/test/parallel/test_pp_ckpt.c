/*
 * test_pp_ckpt.c — checkpoints of pipeline runs (train_stage_save: a T x 1 x P grid whose
 * stage p writes the units it holds; train_session_load; format in checkpoint.c), through
 * coll-train and its --losses files (hex floats, so "the same" means bitwise).
 *
 *  - same grid: a run at --pp 2 (1f1b, interleaved with 2 chunks, zb; with --tp 2; with
 *    DDP over D = 2) stopped after HALF steps with a checkpoint and resumed to STEPS prints
 *    bitwise the uninterrupted run's losses and writes a final manifest and shards
 *    byte-identical to the uninterrupted run's (parameters, AdamW m and v, step, data
 *    position and RNG all bitwise, the head's copy of wte included);
 *  - resharding: a --pp 2 checkpoint resumed as --pp 4, as one process (--batch M*batch),
 *    as --tp 2, as --pp 2 interleaved, as --pp 2 x D 2 and as FSDP; a one-process
 *    checkpoint resumed as --pp 2 and as --pp 4 x --tp 2; a --pp 2 --tp 2 checkpoint
 *    resumed as --pp 2 alone: every loss within RELTOL (relative) of the uninterrupted
 *    one-process run on the same global batch — the layouts sum the same numbers in
 *    different orders in three places only (the tied embedding's two halves, the loss and
 *    the norm over micro-batches and stages, TP's partial sums), so most are bitwise equal
 *    (counted in the log); a stage given another stage's blocks, a lost wte copy or a
 *    shifted data position moves a loss by far more;
 *  - version 4 (the format before pipelines, P = 1) is still read: a one-process
 *    checkpoint rewritten as version 4 resumes, in one process and at --pp 2, bitwise as
 *    the version-5 one does;
 *  - refusals: a shard missing, a shard corrupt, a manifest of another version, a forged
 *    table of stages (checksum made right), another global batch, another model: one line
 *    `coll-train: ...`, exit status 1, nothing written.
 */
#include <criterion/criterion.h>

#include "base/util.h"
#include "common/train_test.h"

#define MODEL                                                                         \
  "--layers 8 --channels 32 --heads 4 --vocab 257 --max-seq 32 --seq 16 --threads 1 " \
  "--eval-every 0 --sample-len 0 --seed 7 --lr 1e-2 --warmup 3"
#define STEPS 6
#define HALF 3
#define RELTOL 1e-5
/* every layout reads 8 rows a step: M x D x batch */
#define PP2 "--pp 2 --micro-batches 4 --batch 2"
#define ONE "--batch 8"

/* Runs coll-train MODEL --steps STEPS with args, its output in dir/tag.out and .err, its
 * losses (hex floats) read into l; returns how many steps it ran. */
static int run(const char *dir, const char *tag, const char *args, float *l) {
  char *base = th_fmt("%s/%s", dir, tag), *lf = th_fmt("%s/%s.losses", dir, tag);
  char *cmd = th_fmt("timeout 120 %s " MODEL " --steps %d --quiet %s --losses %s", th_cli(), STEPS,
                     args, lf);
  free(th_run_ok(cmd, base));
  int n = th_read_losses(lf, l, STEPS);
  free(base), free(lf), free(cmd);
  return n;
}

/* The checkpoint of step k written under dir/sub. */
static char *ckpt(const char *dir, const char *sub, int k) {
  return th_fmt("%s/%s/ckpt_%08d.bin", dir, sub, k);
}

/* Shard (t, 0, p) of a T x 1 x P checkpoint (checkpoint.c's name). */
static char *stage_shard(const char *manifest, int t, int p, int T, int P) {
  return th_fmt("%s.shard%d.0.%dof%dx1x%d", manifest, t, p, T, P);
}

/* Stops at HALF with a checkpoint, resumes to STEPS: the same losses and the same final
 * checkpoint as the uninterrupted run, bit for bit. */
static void same_grid(const char *grid, int T, int P) {
  char *dir = th_tmpdir();
  float full[STEPS], first[STEPS], rest[STEPS];
  char *a = th_fmt("%s --ckpt-dir %s/full --ckpt-every %d", grid, dir, HALF);
  cr_assert_eq(run(dir, "full", a, full), STEPS, "%s", grid);
  free(a);
  a = th_fmt("%s --ckpt-dir %s/first --ckpt-every %d --stop-after %d", grid, dir, HALF, HALF);
  cr_assert_eq(run(dir, "first", a, first), HALF, "%s", grid);
  free(a);
  char *ck = ckpt(dir, "first", HALF);
  a = th_fmt("%s --ckpt-dir %s/rest --resume %s", grid, dir, ck);
  cr_assert_eq(run(dir, "rest", a, rest), STEPS - HALF, "%s", grid);
  free(a);
  cr_assert(memcmp(first, full, HALF * sizeof(float)) == 0, "%s: the first steps differ", grid);
  for (int i = 0; i < STEPS - HALF; i++)
    cr_assert(rest[i] == full[HALF + i], "%s: resumed step %d loss %a, uninterrupted %a", grid,
              HALF + i + 1, rest[i], full[HALF + i]);
  char *m1 = ckpt(dir, "full", STEPS), *m2 = ckpt(dir, "rest", STEPS);
  th_assert_same_file(m1, m2);
  for (int t = 0; t < T; t++)
    for (int p = 0; p < P; p++) {
      char *x = stage_shard(m1, t, p, T, P), *y = stage_shard(m2, t, p, T, P);
      th_assert_same_file(x, y);
      free(x), free(y);
    }
  th_rmrf(dir);
  free(m1), free(m2), free(ck), free(dir);
}

Test(pp_ckpt, same_grid_resume_is_bitwise_1f1b, .timeout = 60) { same_grid(PP2, 1, 2); }

Test(pp_ckpt, same_grid_resume_is_bitwise_interleaved_and_zb, .timeout = 60) {
  same_grid("--pp 2 --schedule interleaved --chunks 2 --micro-batches 4 --batch 2", 1, 2);
  same_grid("--pp 2 --schedule zb --micro-batches 4 --batch 2", 1, 2);
}

Test(pp_ckpt, same_grid_resume_is_bitwise_with_tp_and_ddp, .timeout = 90) {
  same_grid("--pp 2 --tp 2 --micro-batches 4 --batch 2", 2, 2);
  same_grid("--pp 2 --ranks 4 --parallel ddp --micro-batches 2 --batch 2", 1, 2);
}

/* ZeRO-1 along D: AdamW's state is sharded over the replicas, gathered for the checkpoint
 * and cut again on resume; under bf16 the fp32 master of the other shards is gathered too
 * (the replicas gather only bf16 weights while they train). D = 3 leaves a tail. */
Test(pp_ckpt, same_grid_resume_is_bitwise_with_zero1_and_bf16, .timeout = 120) {
  same_grid("--pp 2 --ranks 4 --parallel fsdp --zero 1 --micro-batches 2 --batch 2", 1, 2);
  same_grid("--pp 2 --ranks 4 --parallel fsdp --zero 1 --micro-batches 2 --batch 2 --dtype bf16", 1,
            2);
  same_grid("--pp 2 --ranks 6 --parallel fsdp --zero 1 --micro-batches 4 --batch 2", 1, 2);
  same_grid("--pp 2 --ranks 4 --parallel ddp --micro-batches 2 --batch 2 --dtype bf16", 1, 2);
}

/* The resumed steps' losses against the uninterrupted one-process run's; 1 when bitwise. */
static int follows(const char *dir, const char *tag, const char *args, const char *ck,
                   const float *ref) {
  float l[STEPS];
  char *a = th_fmt("%s --resume %s", args, ck);
  cr_assert_eq(run(dir, tag, a, l), STEPS - HALF, "%s", a);
  int same = 1;
  for (int i = 0; i < STEPS - HALF; i++) {
    double rel = fabs((double)l[i] - ref[HALF + i]) / fabs((double)ref[HALF + i]);
    cr_assert(rel <= RELTOL, "%s: step %d loss %.9g, one process %.9g (rel %.3g)", a, HALF + i + 1,
              l[i], ref[HALF + i], rel);
    same &= l[i] == ref[HALF + i];
  }
  free(a);
  return same;
}

Test(pp_ckpt, reshards_across_p_t_and_d, .timeout = 180) {
  char *dir = th_tmpdir();
  float ref[STEPS], l[STEPS];
  char *a = th_fmt(ONE " --ckpt-dir %s/one --ckpt-every %d", dir, HALF);
  cr_assert_eq(run(dir, "one", a, ref), STEPS);
  free(a);
  a = th_fmt(PP2 " --ckpt-dir %s/pp2 --ckpt-every %d --stop-after %d", dir, HALF, HALF);
  cr_assert_eq(run(dir, "pp2", a, l), HALF);
  free(a);
  a = th_fmt("--pp 2 --tp 2 --micro-batches 4 --batch 2 --ckpt-dir %s/pp2tp2 --ckpt-every %d "
             "--stop-after %d",
             dir, HALF, HALF);
  cr_assert_eq(run(dir, "pp2tp2", a, l), HALF);
  free(a);
  char *pp2 = ckpt(dir, "pp2", HALF), *one = ckpt(dir, "one", HALF);
  char *pp2tp2 = ckpt(dir, "pp2tp2", HALF);
  static const char *from_pp2[] = {
      "--pp 4 --micro-batches 4 --batch 2",
      ONE,
      "--tp 2 " ONE,
      "--pp 2 --schedule interleaved --chunks 2 --micro-batches 4 --batch 2",
      "--pp 2 --ranks 4 --parallel ddp --micro-batches 2 --batch 2",
      "--parallel fsdp --ranks 2 --batch 4",
  };
  int runs = 0, bitwise = 0;
  for (size_t i = 0; i < sizeof from_pp2 / sizeof *from_pp2; i++, runs++)
    bitwise += follows(dir, "from_pp2", from_pp2[i], pp2, ref);
  bitwise += follows(dir, "one_as_pp2", PP2, one, ref), runs++;
  bitwise += follows(dir, "one_as_pp4tp2", "--pp 4 --tp 2 --micro-batches 4 --batch 2", one, ref),
      runs++;
  bitwise += follows(dir, "pp2tp2_as_pp2", PP2, pp2tp2, ref), runs++;
  cr_log_info("pipeline resharding: %d resumes, %d bitwise equal to one process\n", runs, bitwise);
  th_rmrf(dir);
  free(pp2), free(one), free(pp2tp2), free(dir);
}

/* ---- version 4 ------------------------------------------------------------------------ */

static uint32_t u32_at(const char *b, size_t off) {
  uint32_t x;
  memcpy(&x, b + off, 4);
  return x;
}

/* Rewrites the one-process (1 x 1 x 1) version-5 checkpoint src as version 4 at dst: the
 * manifest without the stages' table, with C after the grid, and its shard marked version
 * 4 — checksums made right (checkpoint.c's tables). */
static void as_version4(const char *src, const char *dst) {
  size_t n = 0, ns = 0;
  char *sh = th_fmt("%s.shard0.0of1x1", src), *dsh = th_fmt("%s.shard0.0of1x1", dst);
  char *m = th_read(src, &n), *s = th_read(sh, &ns);
  cr_assert(m && s, "no %s", m ? sh : src);
  uint32_t U = u32_at(m, 156);
  cr_assert(u32_at(m, 8) == 5 && u32_at(m, 148) == 1 && u32_at(m, 152) == 1 && u32_at(m, 160) == 1);
  cr_assert_eq(n, 164 + 12 * (size_t)U + 16 + 8);
  uint32_t four = 4, zero = 0;
  memcpy(s + 8, &four, 4);
  uint64_t shash = train_fnv1a(TRAIN_FNV_INIT, s, ns), sbytes = ns, C;
  memcpy(&C, s + 40, 8);
  size_t n4 = 172 + 8 * (size_t)U + 16 + 8;
  char *o = malloc(n4);
  memcpy(o, m, 164);
  memcpy(o + 8, &four, 4);
  memcpy(o + 160, &zero, 4);
  memcpy(o + 164, &C, 8);
  memcpy(o + 172, m + 164, 8 * (size_t)U);
  memcpy(o + 172 + 8 * U, &sbytes, 8);
  memcpy(o + 180 + 8 * U, &shash, 8);
  uint64_t h = train_fnv1a(TRAIN_FNV_INIT, o, n4 - 8);
  memcpy(o + n4 - 8, &h, 8);
  cr_assert_eq(th_write(dst, o, n4), 0);
  cr_assert_eq(th_write(dsh, s, ns), 0);
  free(o), free(m), free(s), free(sh), free(dsh);
}

Test(pp_ckpt, version4_checkpoints_still_resume, .timeout = 60) {
  char *dir = th_tmpdir();
  float ref[STEPS], l[STEPS], l4[STEPS];
  char *a = th_fmt(ONE " --ckpt-dir %s/one --ckpt-every %d", dir, HALF);
  cr_assert_eq(run(dir, "one", a, ref), STEPS);
  free(a);
  char *v5 = ckpt(dir, "one", HALF), *v4 = th_fmt("%s/old.bin", dir);
  as_version4(v5, v4);
  static const char *as[] = {ONE, PP2};
  for (int i = 0; i < 2; i++) {
    char *x = th_fmt("%s --resume %s", as[i], v5), *y = th_fmt("%s --resume %s", as[i], v4);
    cr_assert_eq(run(dir, "v5", x, l), STEPS - HALF);
    cr_assert_eq(run(dir, "v4", y, l4), STEPS - HALF);
    cr_assert(memcmp(l, l4, (STEPS - HALF) * sizeof(float)) == 0,
              "%s: version 4 resumed to other losses than version 5", as[i]);
    free(x), free(y);
  }
  th_rmrf(dir);
  free(v5), free(v4), free(dir);
}

/* ---- refusals ------------------------------------------------------------------------- */

/* exit status 1, one line "coll-train: ...needle...", nothing on stdout, no --ckpt-dir */
static void refused(const char *dir, const char *args, const char *needle) {
  char *base = th_fmt("%s/r", dir), *ckd = th_fmt("%s/new", dir);
  char *cmd = th_fmt("timeout 60 %s " MODEL " --steps %d --ckpt-dir %s %s", th_cli(), STEPS, ckd,
                     args);
  th_expect_refused(cmd, base, args, needle);
  cr_assert_eq(th_count_entries(ckd), -1, "%s: created %s", args, ckd);
  free(base), free(ckd), free(cmd);
}

/* Flips one bit at off in file path (-1: in the middle). */
static void flip(const char *path, long off) {
  size_t n = 0;
  char *b = th_read(path, &n);
  cr_assert(b, "no %s", path);
  b[off < 0 ? (long)n / 2 : off] ^= 0x10;
  cr_assert_eq(th_write(path, b, n), 0);
  free(b);
}

Test(pp_ckpt, refusals, .timeout = 60) {
  char *dir = th_tmpdir();
  float l[STEPS];
  char *a = th_fmt(PP2 " --ckpt-dir %s/pp2 --ckpt-every %d --stop-after %d", dir, HALF, HALF);
  cr_assert_eq(run(dir, "pp2", a, l), HALF);
  free(a);
  char *ck = ckpt(dir, "pp2", HALF), *sh = stage_shard(ck, 0, 1, 1, 2);
  char *keep = th_fmt("%s.keep", sh), *mkeep = th_fmt("%s.keep", ck);
  char *resume = th_fmt(PP2 " --resume %s", ck);
  size_t n = 0;
  char *m = th_read(ck, &n);
  cr_assert(m);
  cr_assert_eq(th_write(mkeep, m, n), 0);
  /* another global batch: 2 micro-batches of 2 rows read 4 rows a step, not 8 */
  a = th_fmt("--pp 2 --micro-batches 2 --batch 2 --resume %s", ck);
  refused(dir, a, "batch 8");
  free(a);
  /* another model */
  a = th_fmt(PP2 " --layers 6 --resume %s", ck);
  refused(dir, a, "another config");
  free(a);
  /* the last stage's shard missing, then one bit of it flipped */
  cr_assert_eq(rename(sh, keep), 0);
  refused(dir, resume, "incomplete: shard 0.0.1 of 1x1x2");
  cr_assert_eq(rename(keep, sh), 0);
  size_t ns = 0;
  char *sb = th_read(sh, &ns);
  flip(sh, (long)ns - 5);
  refused(dir, resume, "shard 0.0.1 of 1x1x2");
  refused(dir, resume, "corrupt (checksum mismatch)");
  cr_assert_eq(th_write(sh, sb, ns), 0);
  /* a version this build does not read */
  uint32_t nine = 9;
  memcpy(m + 8, &nine, 4);
  cr_assert_eq(th_write(ck, m, n), 0);
  refused(dir, resume, "unsupported version 9");
  /* the stages' table forged (unit 0 written by stage 7 of 2), its checksum made right */
  char *orig = th_read(mkeep, NULL);
  memcpy(m, orig, n);
  free(orig);
  uint32_t U = u32_at(m, 156), seven = 7;
  memcpy(m + 164 + 8 * (size_t)U, &seven, 4);
  uint64_t h = train_fnv1a(TRAIN_FNV_INIT, m, n - 8);
  memcpy(m + n - 8, &h, 8);
  cr_assert_eq(th_write(ck, m, n), 0);
  refused(dir, resume, "unit 0 written by stage 7 of 2");
  /* and the original still resumes */
  cr_assert_eq(rename(mkeep, ck), 0);
  cr_assert_eq(run(dir, "ok", resume, l), STEPS - HALF);
  th_rmrf(dir);
  free(ck), free(sh), free(keep), free(mkeep), free(resume), free(m), free(sb), free(dir);
}
