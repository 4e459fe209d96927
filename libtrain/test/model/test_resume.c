/*
 * test_resume.c — save -> reload -> continue gives bit-identical results to a run that
 * was never interrupted: the same losses (compared as bits, not with a tolerance), the
 * same parameters and optimizer state; through the library and through coll-train.
 */
#include <criterion/criterion.h>

#include "common/train_test.h"
#include "train.h"

static train_options small_options(void) {
  train_options o = {
      .cfg = {.vocab = 256, .max_seq = 32, .layers = 2, .channels = 32, .heads = 2},
      .hp = train_hparams_default(),
      .batch = 4,
      .seq = 16,
      .seed = 7,
      .device = TRAIN_DEVICE_CPU,
      .threads = 2,
  };
  o.hp.steps = 20;
  o.hp.warmup = 4;
  return o;
}

Test(resume, library_bit_exact, .timeout = 60) {
  char err[TRAIN_ERRLEN];
  train_options o = small_options();
  enum { N = 20, HALF = 10 };

  train_session *a = train_session_create(&o, err);
  cr_assert(a, "%s", err);
  float la[N];
  for (int i = 0; i < N; i++) la[i] = train_session_step(a).loss;

  char *dir = th_tmpdir();
  char *path = th_fmt("%s/half.ckpt", dir);
  train_session *b = train_session_create(&o, err);
  cr_assert(b, "%s", err);
  for (int i = 0; i < HALF; i++) {
    float l = train_session_step(b).loss;
    cr_assert(memcmp(&l, &la[i], sizeof l) == 0, "step %d differs before the save", i + 1);
  }
  cr_assert_eq(train_session_save(b, path, err), 0, "%s", err);
  train_session_free(b);
  cr_assert_eq(th_count_entries(dir), 2,
               "the atomic save left other files than the "
               "manifest and its one shard behind");

  train_session *c = train_session_create(&o, err); /* a fresh process, in effect */
  cr_assert(c, "%s", err);
  cr_assert_eq(train_session_load(c, path, err), 0, "%s", err);
  cr_assert_eq(train_session_step_count(c), HALF);
  for (int i = HALF; i < N; i++) {
    float l = train_session_step(c).loss;
    cr_expect(memcmp(&l, &la[i], sizeof l) == 0,
              "step %d after resume: loss %.9g, uninterrupted run %.9g", i + 1, l, la[i]);
  }
  size_t np = train_num_params(train_session_model(a));
  float *pa = malloc(np * 4), *pc = malloc(np * 4);
  float *ma = malloc(np * 4), *va = malloc(np * 4), *mc = malloc(np * 4), *vc = malloc(np * 4);
  train_copy_params_to_host(train_session_model(a), pa);
  train_copy_params_to_host(train_session_model(c), pc);
  train_copy_opt_to_host(train_session_model(a), ma, va);
  train_copy_opt_to_host(train_session_model(c), mc, vc);
  cr_expect(memcmp(pa, pc, np * 4) == 0, "parameters differ after resume");
  cr_expect(memcmp(ma, mc, np * 4) == 0 && memcmp(va, vc, np * 4) == 0,
            "AdamW state differs after resume");
  free(pa), free(pc), free(ma), free(va), free(mc), free(vc);
  train_session_free(a);
  train_session_free(c);
  th_rmrf(dir);
  free(dir);
  free(path);
}

/* The same through the CLI: the final checkpoints of an interrupted and an
 * uninterrupted run are byte-identical files (parameters, AdamW state, RNG, data
 * position, step), and the printed losses after the resume agree. */
Test(resume, cli_bit_exact, .timeout = 90) {
  const char *cli = getenv("TRAIN_CLI");
  cr_assert(cli, "TRAIN_CLI is not set");
  char *dir = th_tmpdir();
  const char *common = "--layers 2 --channels 32 --heads 2 --seq 16 --batch 4 --steps 12 "
                       "--eval-every 6 --eval-batches 2 --sample-len 16 --threads 2";
  char *o1 = th_fmt("%s/full.out", dir), *o2 = th_fmt("%s/half.out", dir),
       *o3 = th_fmt("%s/rest.out", dir), *e = th_fmt("%s/err", dir);
  char *cmd = th_fmt("%s %s --ckpt-dir %s/full", cli, common, dir);
  cr_assert_eq(th_run(cmd, o1, e), 0, "uninterrupted run failed");
  free(cmd);
  /* interrupted: stop after 6 of the 12 scheduled steps, then resume */
  cmd = th_fmt("%s %s --ckpt-dir %s/part --ckpt-every 6 --stop-after 6", cli, common, dir);
  cr_assert_eq(th_run(cmd, o2, e), 0, "first half failed");
  free(cmd);
  cmd = th_fmt("%s %s --ckpt-dir %s/part --resume %s/part/ckpt_00000006.bin", cli, common, dir,
               dir);
  cr_assert_eq(th_run(cmd, o3, e), 0, "resumed run failed");
  free(cmd);

  char *fa = th_fmt("%s/full/ckpt_00000012.bin", dir),
       *fb = th_fmt("%s/part/ckpt_00000012.bin", dir);
  size_t na = 0, nb = 0;
  char *ca = th_read(fa, &na), *cb = th_read(fb, &nb);
  cr_assert(ca && cb, "final checkpoints missing");
  cr_expect(na == nb && memcmp(ca, cb, na) == 0,
            "final checkpoint of the resumed run differs from the uninterrupted one");
  char *da = th_fmt("%s/full", dir), *db = th_fmt("%s/part", dir);
  th_assert_same_checkpoint(da, db, 12, 1, 1); /* the manifest again, and its shard */
  free(da), free(db);

  /* printed step lines 7..12 agree */
  char *full = th_read(o1, NULL), *rest = th_read(o3, NULL);
  for (int s = 7; s <= 12; s++) {
    char *key = th_fmt("step %5d/12 | loss ", s);
    char *p = strstr(full, key), *q = strstr(rest, key);
    cr_assert(p && q, "step %d line missing", s);
    cr_expect(strncmp(p, q, strlen(key) + 9) == 0, "step %d: %.40s vs %.40s", s, p, q);
    free(key);
  }
  free(full), free(rest), free(ca), free(cb), free(fa), free(fb);
  free(o1), free(o2), free(o3), free(e);
  th_rmrf(dir);
  free(dir);
}
