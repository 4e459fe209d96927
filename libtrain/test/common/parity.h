/*
 * parity.h — what the PyTorch parity tests share (model/test_parity.c on the CPU,
 * test_train_cuda.c's cuda::losses_match_pytorch on the GPU): a fresh session's
 * checkpoint and the batches it will draw written for tools/reference.py, the reference
 * run on them, and its outputs read back. It must never pick a tolerance or a Python
 * interpreter: each test states its own, and why.
 */
#ifndef TRAIN_TEST_PARITY_H
#define TRAIN_TEST_PARITY_H

#include "common/train_test.h"

/* Reads dir/name, which must hold exactly want floats (the caller frees them). */
static inline float *th_read_floats(const char *dir, const char *name, size_t want) {
  char *path = th_fmt("%s/%s", dir, name);
  size_t len = 0;
  char *buf = th_read(path, &len);
  cr_assert(buf, "reference did not write %s", path);
  free(path);
  cr_assert_eq(len, want * sizeof(float), "%s: %zu bytes, expected %zu", name, len,
               want * sizeof(float));
  return (float *)buf;
}

/* Saves the not yet stepped session s (options o) as dir/init.ckpt and the `steps`
 * batches its steps will draw (the same loader and seed) as dir/inputs.bin and
 * dir/targets.bin; in and tg (steps * batch * seq ints each) get them too. */
static inline void th_parity_write(train_session *s, const train_options *o, int steps,
                                   const char *dir, int *in, int *tg) {
  char err[TRAIN_ERRLEN];
  char *ckpt = th_fmt("%s/init.ckpt", dir), *inp = th_fmt("%s/inputs.bin", dir),
       *tgt = th_fmt("%s/targets.bin", dir);
  cr_assert_eq(train_session_save(s, ckpt, err), 0, "%s", err);
  size_t bt = (size_t)o->batch * o->seq;
  train_loader_state ls = {.seed = o->seed};
  for (int k = 0; k < steps; k++)
    train_data_next_batch(train_session_data(s), &ls, o->batch, o->seq, in + k * bt, tg + k * bt);
  cr_assert_eq(th_write(inp, in, steps * bt * sizeof(int)), 0);
  cr_assert_eq(th_write(tgt, tg, steps * bt * sizeof(int)), 0);
  free(ckpt), free(inp), free(tgt);
}

/* Runs `py` tools/reference.py (TRAIN_REFERENCE) on device ("cpu" or "cuda") over the
 * files th_parity_write left in dir, its outputs into dir; fails the test with the
 * reference's stderr unless it exits 0. */
static inline void th_reference_run(const char *py, const char *dir, int batch, int seq, int steps,
                                    const char *device) {
  const char *ref = getenv("TRAIN_REFERENCE");
  cr_assert(ref, "TRAIN_REFERENCE (path of tools/reference.py) is not set");
  char *cmd = th_fmt("'%s' '%s' --ckpt %s/init.ckpt --inputs %s/inputs.bin "
                     "--targets %s/targets.bin --batch %d --seq %d --steps %d --out %s "
                     "--device %s",
                     py, ref, dir, dir, dir, batch, seq, steps, dir, device);
  char *out = th_fmt("%s/ref.out", dir), *errf = th_fmt("%s/ref.err", dir);
  int rc = th_run(cmd, out, errf);
  char *msg = th_read(errf, NULL);
  cr_assert_eq(rc, 0, "reference.py --device %s failed (%d): %s", device, rc, msg ? msg : "");
  free(msg), free(cmd), free(out), free(errf);
}

#endif
