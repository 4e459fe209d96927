/*
 * test_units.c — unit tests of the pieces around the model: token files, the
 * deterministic batch order, the learning-rate schedule, gradient clipping, config
 * checks, atomic checkpoint writes and the SVG plot.
 */
#include <criterion/criterion.h>

#include "common/train_test.h"
#include "model/model.h"
#include "train.h"

Test(data, tokfile_roundtrip_and_order) {
  char *dir = th_tmpdir(), *p = th_fmt("%s/t.tok", dir), err[TRAIN_ERRLEN];
  enum { N = 5000, T = 8, B = 3 };
  static int ids[N];
  for (int i = 0; i < N; i++) ids[i] = (i * 7919) % 5003; /* all distinct */
  cr_assert_eq(train_tokfile_write(p, ids, N, 5003, err), 0, "%s", err);
  cr_assert_eq(th_count_entries(dir), 1, "temp file left behind");
  train_data *d = train_data_open(p, 5003, T, err);
  cr_assert(d, "%s", err);
  cr_assert_eq(train_data_tokens(d), N);

  /* every window of an epoch exactly once, targets = inputs shifted by one */
  size_t ntrain = N - N / 10;
  train_loader_state st = {.seed = 3};
  static unsigned char seen[N];
  int in[B * T], tg[B * T];
  long windows = 0;
  while (st.epoch == 0) {
    train_data_next_batch(d, &st, 1, T, in, tg);
    int start = -1;
    for (int s = 0; s + T < (int)ntrain && start < 0; s++)
      if (memcmp(&ids[s], in, sizeof(int) * T) == 0 && ids[s + T] == tg[T - 1]) start = s;
    cr_assert(start >= 0, "batch is not a window of the training split");
    cr_assert_eq(seen[start], 0, "window at %d visited twice in one epoch", start);
    seen[start] = 1;
    for (int t = 0; t + 1 < T; t++) cr_assert_eq(tg[t], in[t + 1]);
    windows++;
  }
  cr_expect(windows >= (long)(ntrain - T) / T, "an epoch visited only %ld windows", windows);

  /* same seed, same batches; other seed, other batches */
  train_loader_state a = {.seed = 11}, b = {.seed = 11}, c = {.seed = 12};
  int ia[B * T], ta[B * T], ib[B * T], tb[B * T], ic[B * T], tc[B * T];
  int differ = 0;
  for (int k = 0; k < 50; k++) {
    train_data_next_batch(d, &a, B, T, ia, ta);
    train_data_next_batch(d, &b, B, T, ib, tb);
    train_data_next_batch(d, &c, B, T, ic, tc);
    cr_assert(memcmp(ia, ib, sizeof ia) == 0 && memcmp(ta, tb, sizeof ta) == 0);
    differ |= memcmp(ia, ic, sizeof ia) != 0;
  }
  cr_expect(differ, "seed does not change the order");
  /* validation batches come from the last 10% and are deterministic */
  cr_assert(train_data_val_batch(d, 0, B, T, ia, ta));
  cr_assert(train_data_val_batch(d, 0, B, T, ib, tb));
  cr_assert(memcmp(ia, ib, sizeof ia) == 0);
  cr_expect_eq(ia[0], ids[ntrain]);
  train_data_free(d);
  th_rmrf(dir);
  free(dir), free(p);
}

Test(data, embedded_corpus_is_bytes) {
  char err[TRAIN_ERRLEN];
  size_t len = 0;
  const char *text = train_corpus(&len);
  cr_assert(len > 20000, "embedded corpus is only %zu bytes", len);
  train_data *d = train_data_open(NULL, 256, 64, err);
  cr_assert(d, "%s", err);
  cr_assert_eq(train_data_tokens(d), len);
  int in[64], tg[64];
  train_data_val_batch(d, 0, 1, 64, in, tg);
  cr_assert_eq(in[0], (unsigned char)text[len - len / 10]);
  train_data_free(d);
}

Test(optim, lr_schedule) {
  train_hparams hp = train_hparams_default();
  hp.lr = 1.0f;
  hp.min_lr_frac = 0.1f;
  hp.warmup = 10;
  hp.steps = 110;
  cr_expect_float_eq(train_lr_at(&hp, 0), 0.1f, 1e-7);
  cr_expect_float_eq(train_lr_at(&hp, 9), 1.0f, 1e-7);
  cr_expect_float_eq(train_lr_at(&hp, 10), 1.0f, 1e-7);
  cr_expect_float_eq(train_lr_at(&hp, 60), 0.55f, 1e-6); /* half way down the cosine */
  cr_expect_float_eq(train_lr_at(&hp, 110), 0.1f, 1e-7);
  cr_expect_float_eq(train_lr_at(&hp, 500), 0.1f, 1e-7);
  for (long s = 11; s < 110; s++)
    cr_assert(train_lr_at(&hp, s) <= train_lr_at(&hp, s - 1), "not decreasing at %ld", s);
}

Test(optim, clip_by_global_norm) {
  char err[TRAIN_ERRLEN];
  train_config c = {.vocab = 16, .max_seq = 4, .layers = 1, .channels = 8, .heads = 2};
  train_model *m = train_model_create(&c, 1, 4, TRAIN_DEVICE_CPU, 1, 1, err);
  cr_assert(m, "%s", err);
  size_t n = train_num_params(m);
  float *g = train_grads(m);
  for (size_t i = 0; i < n; i++) g[i] = (i % 2) ? 3.0f : -3.0f;
  train_hparams hp = train_hparams_default();
  hp.grad_clip = 1.0f;
  float norm = train_clip_grads(m, &hp);
  cr_expect_float_eq(norm, 3.0f * sqrtf((float)n), 1e-3f * norm);
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
  cr_expect_float_eq(sqrt(s), 1.0, 1e-5, "clipped norm %g", sqrt(s));
  hp.grad_clip = 100.0f; /* below the limit: untouched */
  float before = g[0];
  train_clip_grads(m, &hp);
  cr_expect_eq(g[0], before);
  train_model_free(m);
}

Test(model, config_checks_and_layout) {
  char err[TRAIN_ERRLEN];
  train_config c = {.vocab = 256, .max_seq = 64, .layers = 3, .channels = 48, .heads = 5};
  cr_expect_neq(train_config_check(&c, err), 0);
  cr_expect(strstr(err, "not divisible") != NULL, "%s", err);
  c.heads = 4;
  cr_assert_eq(train_config_check(&c, err), 0, "%s", err);
  cr_expect_null(train_model_create(&c, 2, 65, TRAIN_DEVICE_CPU, 1, 1, err));
  cr_expect(strstr(err, "position table") != NULL, "%s", err);
  train_model *m = train_model_create(&c, 2, 64, TRAIN_DEVICE_CPU, 1, 1, err);
  cr_assert(m, "%s", err);
  /* tensors tile the flat array, blocks are contiguous ranges, count is 12LC^2+... */
  size_t off = 0, C = 48;
  for (int i = 0; i < train_num_tensors(m); i++) {
    const train_param *p = train_param_info(m, i);
    cr_assert_eq(p->offset, off, "%s not contiguous", p->name);
    off += p->numel;
  }
  cr_assert_eq(off, train_num_params(m));
  size_t expect = 256 * C + 64 * C + 3 * (12 * C * C + 13 * C) + 2 * C;
  cr_expect_eq(train_num_params(m), expect);
  cr_expect_str_eq(train_param_info(m, 2)->name, "h.0.ln1.w");
  cr_expect_str_eq(train_param_info(m, 4)->name, "h.0.attn.qkv.w");
  cr_expect_eq(train_param_info(m, 4)->shape[0], 3 * 48);
  train_model_free(m);
}

Test(model, gradient_accumulates) {
  /* backward adds into the gradients: two backwards = twice one backward */
  char err[TRAIN_ERRLEN];
  train_config c = {.vocab = 32, .max_seq = 8, .layers = 2, .channels = 16, .heads = 2};
  train_model *m = train_model_create(&c, 2, 8, TRAIN_DEVICE_CPU, 1, 5, err);
  cr_assert(m, "%s", err);
  int in[16], tg[16];
  for (int i = 0; i < 16; i++) in[i] = (i * 5) % 32, tg[i] = (i * 3 + 1) % 32;
  size_t n = train_num_params(m);
  float *g1 = malloc(n * 4);
  train_forward(m, in, tg, 2, 8);
  train_zero_grad(m);
  train_backward(m);
  memcpy(g1, train_grads(m), n * 4);
  train_backward(m);
  const float *g2 = train_grads(m);
  for (size_t i = 0; i < n; i++)
    cr_assert_float_eq(g2[i], 2.0f * g1[i], 1e-6f * (1.0f + fabsf(g1[i])), "at %zu", i);
  free(g1);
  train_model_free(m);
}

Test(output, plot_svg) {
  char *dir = th_tmpdir(), *p = th_fmt("%s/loss.svg", dir), err[TRAIN_ERRLEN];
  float loss[50], val[2] = {3.0f, 2.5f};
  long vs[2] = {25, 50};
  for (int i = 0; i < 50; i++) loss[i] = 5.0f - 0.05f * i;
  cr_assert_eq(train_plot_svg(p, 1, loss, 50, vs, val, 2, "a <title> & more", err), 0, "%s", err);
  char *svg = th_read(p, NULL);
  cr_assert(svg && strncmp(svg, "<svg", 4) == 0);
  cr_expect(strstr(svg, "&lt;title> &amp; more") != NULL);
  cr_expect(strstr(svg, "</svg>") != NULL);
  cr_expect_eq(th_count_entries(dir), 1);
  free(svg);
  th_rmrf(dir);
  free(dir), free(p);
}

/* The checkpoint loader against damaged files: every truncation and a few hundred single
 * bit flips, of the manifest and of its one shard, must be refused with a message, and
 * must leave the session untouched. */
Test(ckpt, damaged_files_are_refused, .timeout = 60) {
  char err[TRAIN_ERRLEN];
  train_options o = {
      .cfg = {.vocab = 256, .max_seq = 16, .layers = 1, .channels = 16, .heads = 2},
      .hp = train_hparams_default(),
      .batch = 2,
      .seq = 8,
      .seed = 3,
      .threads = 1,
  };
  train_session *s = train_session_create(&o, err);
  cr_assert(s, "%s", err);
  train_session_step(s);
  char *dir = th_tmpdir(), *good = th_fmt("%s/good.ckpt", dir), *bad = th_fmt("%s/bad.ckpt", dir);
  cr_assert_eq(train_session_save(s, good, err), 0, "%s", err);
  cr_assert_eq(th_count_entries(dir), 2, "one process: a manifest and one shard");
  size_t np = train_num_params(train_session_model(s));
  float *before = malloc(np * 4), *after = malloc(np * 4);
  train_copy_params_to_host(train_session_model(s), before);

  /* bad: a copy of the checkpoint with either file damaged, the other intact */
  char *files[2][2] = {{good, bad},
                       {th_fmt("%s.shard0.0of1x1", good), th_fmt("%s.shard0.0of1x1", bad)}};
  for (int which = 0; which < 2; which++) {
    size_t n = 0, on = 0;
    char *buf = th_read(files[which][0], &n), *other = th_read(files[!which][0], &on);
    cr_assert(buf && other);
    th_write(files[!which][1], other, on);
    const char *dst = files[which][1], *what = which ? "shard" : "manifest";
    for (size_t len = 0; len < n; len += len < 200 ? 1 : 997) {
      th_write(dst, buf, len);
      err[0] = '\0';
      cr_assert_neq(train_session_load(s, bad, err), 0,
                    "%s truncated to %zu bytes: "
                    "accepted",
                    what, len);
      cr_assert(strlen(err) > 0 && strchr(err, '\n') == NULL);
    }
    uint64_t rng = 12345;
    for (int k = 0; k < 300; k++) {
      rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
      size_t pos = (size_t)(rng >> 33) % n;
      buf[pos] ^= (char)(1 << (k % 8));
      th_write(dst, buf, n);
      cr_assert_neq(train_session_load(s, bad, err), 0,
                    "%s: bit flip at byte %zu "
                    "accepted",
                    what, pos);
      buf[pos] ^= (char)(1 << (k % 8));
    }
    free(buf), free(other);
  }
  free(files[1][0]), free(files[1][1]);
  train_copy_params_to_host(train_session_model(s), after);
  cr_expect(memcmp(before, after, np * 4) == 0, "a refused load changed the parameters");
  cr_expect_eq(train_session_step_count(s), 1);
  cr_expect_eq(train_session_load(s, good, err), 0, "%s", err); /* the original still loads */
  free(before), free(after), free(good), free(bad);
  train_session_free(s);
  th_rmrf(dir);
  free(dir);
}

/* Which GPU a rank takes: its local rank, from coll-train's own fork (TRAIN_LOCAL_RANK)
 * first, then the launchers' variables, else the caller's fallback. */
Test(units, local_rank_from_the_launchers_variables) {
  static const char *vars[] = {"TRAIN_LOCAL_RANK", "LOCAL_RANK",      "OMPI_COMM_WORLD_LOCAL_RANK",
                               "SLURM_LOCALID",    "MPI_LOCALRANKID", "PMI_LOCAL_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
  cr_assert_eq(train_local_rank(5), 5, "no variable: the fallback");
  setenv("SLURM_LOCALID", "2", 1);
  cr_assert_eq(train_local_rank(5), 2);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
  cr_assert_eq(train_local_rank(5), 3, "Open MPI's before Slurm's");
  setenv("TRAIN_LOCAL_RANK", "1", 1);
  cr_assert_eq(train_local_rank(5), 1, "coll-train's own before any launcher's");
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

/* bf16 rounding (layers_cpu.c): to nearest, ties to even, NaN kept a NaN, infinities and
 * the largest finite values where IEEE puts them; widening is exact. */
Test(bf16, rounds_to_nearest_even) {
  const train_ops *o = train_cpu_ops();
  float in[] = {1.0f,
                1.0f + 0x1p-8f,            /* a tie between 1 and 1 + 2^-7: even is 1 */
                1.0f + 3 * 0x1p-8f,        /* a tie between 1 + 2^-7 and 1 + 2^-6: 1 + 2^-6 */
                1.0f + 0x1p-8f + 0x1p-20f, /* just above the tie: up */
                -2.5f,
                0x1.fffffep127f, /* FLT_MAX: past the last tie, up into infinity as IEEE rounds */
                INFINITY,
                NAN};
  float want[] = {1.0f, 1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -2.5f, INFINITY, INFINITY, NAN};
  enum { N = sizeof in / sizeof in[0] };
  uint16_t h[N];
  float back[N];
  o->to_bf16(h, in, N);
  o->from_bf16(back, h, N);
  for (int i = 0; i < N; i++) {
    if (isnan(want[i]))
      cr_assert(isnan(back[i]), "%d: %a -> %a, expected a NaN", i, (double)in[i], (double)back[i]);
    else
      cr_assert_eq(back[i], want[i], "%d: %a -> %a, expected %a", i, (double)in[i], (double)back[i],
                   (double)want[i]);
  }
  /* the sums widen: 3 * 1.5^2 */
  uint16_t x[3];
  float v[3] = {1.5f, -1.5f, 1.5f};
  o->to_bf16(x, v, 3);
  cr_assert_eq(o->sumsq_bf16(x, 3), 6.75);
}
