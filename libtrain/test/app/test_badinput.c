/*
 * test_badinput.c — every bad input makes coll-train exit non-zero with ONE line on
 * stderr that names the problem, and leaves nothing behind: no checkpoint directory,
 * no checkpoint, no plot, no temp file (the directory the run was pointed at holds
 * exactly what it held before).
 */
#include <criterion/criterion.h>

#include "common/train_test.h"
#include "train.h"

#define SMALL                                                        \
  "--layers 1 --channels 32 --heads 2 --seq 16 --batch 2 --steps 2 " \
  "--eval-every 0 --threads 1"

/* Runs coll-train with args (with %D replaced by dir) plus --ckpt-dir DIR/ck and
 * --plot DIR/loss.svg, and checks: non-zero exit, one stderr line containing `want`,
 * and that dir has the same number of entries as before. */
static void expect_failure(const char *dir, const char *args, const char *want) {
  int before = th_count_entries(dir);
  const char *slash = strrchr(dir, '/'), *name = slash ? slash + 1 : dir;
  char *out = th_fmt("%s/../%s.out", dir, name);
  char *err = th_fmt("%s/../%s.err", dir, name);
  char *cmd = th_fmt("cd '%s' && %s %s --ckpt-dir '%s/ck' --plot '%s/loss.svg'", dir, th_cli(),
                     args, dir, dir);
  int rc = th_run(cmd, out, err);
  char *msg = th_read(err, NULL);
  cr_assert(msg);
  cr_expect(rc != 0 && rc != -1, "%s: exit status %d, expected a failure", args, rc);
  cr_expect(th_one_line(msg), "%s: stderr should be exactly one line, got: %s", args, msg);
  cr_expect(strstr(msg, want) != NULL, "%s: message '%s' does not mention '%s'", args, msg, want);
  cr_expect(strncmp(msg, "coll-train: ", 12) == 0, "message not prefixed: %s", msg);
  cr_expect_eq(th_count_entries(dir), before, "%s: left files behind (%d entries, had %d)", args,
               th_count_entries(dir), before);
  cr_log_info("%-60.60s -> %s", args, msg);
  unlink(out);
  unlink(err);
  free(out), free(err), free(cmd), free(msg);
}

static char *dir;
static void setup(void) { dir = th_tmpdir(); }
static void teardown(void) {
  th_rmrf(dir);
  free(dir);
}
TestSuite(badinput, .init = setup, .fini = teardown, .timeout = 60);

Test(badinput, missing_data_file) {
  expect_failure(dir, SMALL " --data no-such-file.txt", "no-such-file.txt: cannot open");
}

/* Writes n bytes into dir/name, then expects a run on that data to fail saying want. */
static void expect_bad_data(const char *name, const void *bytes, size_t n, const char *want) {
  char *p = th_fmt("%s/%s", dir, name), *args = th_fmt(SMALL " --data %s", name);
  cr_assert_eq(th_write(p, bytes, n), 0, "cannot write %s", p);
  expect_failure(dir, args, want);
  free(p), free(args);
}

Test(badinput, empty_data_file) { expect_bad_data("empty.txt", "", 0, "empty.txt: empty"); }

Test(badinput, corrupt_token_file_size) {
  /* header says 1000 tokens, the file holds 10 */
  unsigned char f[24 + 20] = "COLLTOK1";
  f[8] = 1;             /* version */
  f[12] = 0, f[13] = 1; /* vocab 256 */
  f[16] = 1000 & 0xff, f[17] = 1000 >> 8;
  expect_bad_data("bad.tok", f, sizeof f, "corrupt token file");
}

Test(badinput, corrupt_token_file_ids) {
  int ids[400];
  for (int i = 0; i < 400; i++) ids[i] = i % 200;
  char *p = th_fmt("%s/ids.tok", dir), err[TRAIN_ERRLEN];
  cr_assert_eq(train_tokfile_write(p, ids, 400, 200, err), 0, "%s", err);
  /* patch token 7 to id 250 >= vocab 200 */
  FILE *f = fopen(p, "r+b");
  fseek(f, 24 + 2 * 7, SEEK_SET);
  fputc(250, f);
  fclose(f);
  expect_failure(dir, SMALL " --data ids.tok", "token 7 has id 250 >= vocab 200");
  free(p);
}

Test(badinput, token_file_bad_version) {
  unsigned char f[24] = "COLLTOK1";
  f[8] = 9;
  expect_bad_data("v9.tok", f, sizeof f, "unsupported token file version 9");
}

Test(badinput, data_too_small_for_seq) {
  expect_bad_data("tiny.txt", "just a few bytes of text", 24, "too small");
}

Test(badinput, channels_not_divisible_by_heads) {
  expect_failure(dir, "--channels 30 --heads 4", "channels 30 is not divisible by heads 4");
}

Test(badinput, seq_longer_than_position_table) {
  expect_failure(dir, "--seq 300 --max-seq 256",
                 "sequence length 300 is longer than the position table (max_seq 256)");
}

/* --plan refuses what a run refuses, with the run's sentence, and prints no table (it once
 * planned --seq 1024 over the default --max-seq 256). */
Test(badinput, plan_refuses_what_a_run_refuses) {
  expect_failure(dir, "--plan --ranks 8 --seq 300",
                 "sequence length 300 is longer than the position table (max_seq 256)");
  expect_failure(dir, "--plan --tp 2 --ranks 4 --seq 300",
                 "sequence length 300 is longer than the position table (max_seq 256)");
}

Test(badinput, bad_flag_value) {
  expect_failure(dir, "--layers four", "--layers: 'four' is not an integer");
  expect_failure(dir, "--device tpu", "--device: 'tpu' is not cpu or cuda");
  expect_failure(dir, "--bogus", "unknown option --bogus");
}

Test(badinput, cuda_without_gpu) {
  char err[TRAIN_ERRLEN];
  if (train_cuda_device_name(err)) cr_skip_test("a CUDA device is present; nothing to check here");
  expect_failure(dir, SMALL " --device cuda", "cuda");
}

/* Makes a real checkpoint of the SMALL model (2 steps, `how`: its parallel flags) in
 * dir/sub; returns its path, dir/sub/ckpt_00000002.bin. Its output goes beside dir. */
static char *make_checkpoint_in(const char *sub, const char *how) {
  char *out = th_fmt("%s.%s.out", dir, sub), *err = th_fmt("%s.%s.err", dir, sub);
  char *cmd = th_fmt("cd '%s' && %s " SMALL "%s --ckpt-dir %s", dir, th_cli(), how, sub);
  cr_assert_eq(th_run(cmd, out, err), 0, "could not make a checkpoint (%s)", cmd);
  unlink(out), unlink(err);
  free(out), free(err), free(cmd);
  return th_fmt("%s/%s/ckpt_00000002.bin", dir, sub);
}

/* A plain checkpoint in dir/good. */
static char *make_checkpoint(void) { return make_checkpoint_in("good", ""); }

Test(badinput, checkpoint_from_another_config) {
  char *ck = make_checkpoint();
  char *args = th_fmt("--layers 2 --channels 32 --heads 2 --seq 16 --batch 2 --steps 4 "
                      "--eval-every 0 --resume '%s'",
                      ck);
  expect_failure(dir, args, "is from another config: layers 1 channels 32");
  free(args);
  args = th_fmt(SMALL " --batch 3 --resume '%s'", ck);
  expect_failure(dir, args, "is from another config: batch 2 seq 16 seed 1337");
  free(args);
  char *other = th_fmt("%s/other.txt", dir);
  char text[4000];
  for (int i = 0; i < 4000; i++) text[i] = "abcdefgh \n"[i % 10];
  th_write(other, text, sizeof text);
  args = th_fmt(SMALL " --data other.txt --resume '%s'", ck);
  expect_failure(dir, args, "was trained on other data");
  free(args);
  free(other);
  free(ck);
}

/* The checkpoint of one process is its manifest and one shard (a 1 x 1 grid). */
static char *one_shard(const char *manifest) { return th_fmt("%s.shard0.0of1x1", manifest); }

/* Copies manifest and shard (the shard's first shard_len bytes, one bit flipped at
 * flip_at unless it is -1) to dir/name and dir/name's shard. */
static void copy_checkpoint(const char *ck, const char *name, size_t shard_len, long flip_at) {
  char *sh = one_shard(ck), *to = th_fmt("%s/%s", dir, name), *to_sh = one_shard(to);
  size_t n = 0, ns = 0;
  char *m = th_read(ck, &n), *s = th_read(sh, &ns);
  cr_assert(m && s && shard_len <= ns);
  if (flip_at >= 0) s[flip_at] ^= 0x10;
  th_write(to, m, n);
  th_write(to_sh, s, shard_len);
  free(m), free(s), free(sh), free(to), free(to_sh);
}

Test(badinput, truncated_checkpoint) {
  char *ck = make_checkpoint();
  size_t n = 0, ns = 0;
  char *buf = th_read(ck, &n), *sh = one_shard(ck), *sbuf = th_read(sh, &ns);
  char *half = th_fmt("%s/half.bin", dir), *hdr = th_fmt("%s/hdr.bin", dir);
  th_write(half, buf, n / 2);
  th_write(hdr, buf, 40);
  char *args = th_fmt(SMALL " --resume half.bin");
  expect_failure(dir, args, "half.bin: truncated");
  free(args);
  args = th_fmt(SMALL " --resume hdr.bin");
  expect_failure(dir, args, "hdr.bin: truncated");
  free(args);
  /* the manifest whole, its shard cut in half */
  copy_checkpoint(ck, "short.bin", ns / 2, -1);
  expect_failure(dir, SMALL " --resume short.bin",
                 "short.bin is incomplete: shard 0.0 of "
                 "1x1 (short.bin.shard0.0of1x1) has");
  free(buf), free(sbuf), free(sh), free(half), free(hdr), free(ck);
}

Test(badinput, corrupt_checkpoint) {
  char *ck = make_checkpoint();
  size_t n = 0;
  char *buf = th_read(ck, &n);
  buf[n / 2] ^= 0x10; /* one flipped bit in the manifest */
  char *p = th_fmt("%s/flip.bin", dir), *q = th_fmt("%s/text.bin", dir);
  th_write(p, buf, n);
  th_write(q, "hello, not a checkpoint\n", 24);
  expect_failure(dir, SMALL " --resume flip.bin", "flip.bin: corrupt (checksum mismatch)");
  /* one flipped bit in the parameters: in the shard */
  char *sh = one_shard(ck);
  size_t ns = 0;
  free(th_read(sh, &ns));
  copy_checkpoint(ck, "pflip.bin", ns, (long)ns / 3);
  expect_failure(dir, SMALL " --resume pflip.bin",
                 "shard 0.0 of 1x1 (pflip.bin.shard0.0of1x1) is corrupt (checksum mismatch)");
  free(sh);
  expect_failure(dir, SMALL " --resume text.bin", "not a coll-train checkpoint");
  expect_failure(dir, SMALL " --resume missing.bin", "missing.bin: cannot open");
  free(buf), free(p), free(q), free(ck);
}

Test(badinput, fsdp_flags) {
  expect_failure(dir, SMALL " --parallel fsdp --ranks 2 --zero 4",
                 "--zero: 4 is out of range 1..3");
  expect_failure(dir, SMALL " --zero 2", "--zero needs --parallel fsdp");
  expect_failure(dir, SMALL " --parallel ddp --zero 2", "--zero needs --parallel fsdp");
  expect_failure(dir, SMALL " --parallel fsdp --ranks 0", "--ranks: 0 is out of range");
}

/* A sharded checkpoint (2 ranks, ZeRO-3, 2 steps) in dir/fs; returns its manifest path. */
static char *make_fsdp_checkpoint(void) {
  return make_checkpoint_in("fs", " --parallel fsdp --ranks 2");
}

/* A shard missing, short or corrupt, or a checkpoint of another model: refused before any
 * rank starts, at the same N, at another N and in one process; nothing written. */
Test(badinput, fsdp_checkpoint_incomplete_corrupt_or_other_model) {
  char *man = make_fsdp_checkpoint();
  char *s1 = th_fmt("%s.shard0.1of1x2", man);
  size_t n = 0;
  char *buf = th_read(s1, &n);
  cr_assert(buf && n > 64);
  const char *fsdp2 = SMALL " --parallel fsdp --ranks 2 --resume fs/ckpt_00000002.bin";
  const char *none = " --layers 1 --channels 32 --heads 2 --seq 16 --batch 4 --steps 2 "
                     "--eval-every 0 --threads 1 --resume fs/ckpt_00000002.bin";
  /* another model: one layer more */
  expect_failure(dir,
                 SMALL " --layers 2 --parallel fsdp --ranks 2 --resume "
                       "fs/ckpt_00000002.bin",
                 "is from another config: layers 1");
  /* the batch per step must match: 2 ranks x 2 rows, one process of 2 rows is not it */
  expect_failure(dir, SMALL " --resume fs/ckpt_00000002.bin", "this run has batch 2");
  th_write(s1, buf, n / 2); /* short */
  expect_failure(dir, fsdp2, "is incomplete: shard 0.1 of 1x2");
  expect_failure(dir, none, "is incomplete: shard 0.1 of 1x2");
  buf[n - 5] ^= 0x10; /* right size, one flipped bit */
  th_write(s1, buf, n);
  expect_failure(dir, fsdp2, "shard 0.1 of 1x2 (fs/ckpt_00000002.bin.shard0.1of1x2) is corrupt");
  unlink(s1); /* missing */
  expect_failure(dir, fsdp2, "is incomplete: shard 0.1 of 1x2");
  expect_failure(dir,
                 SMALL " --batch 1 --parallel fsdp --ranks 4 --resume "
                       "fs/ckpt_00000002.bin",
                 "is incomplete: shard 0.1 of 1x2");
  free(buf), free(s1), free(man);
}
