/*
 * test_parity.c — libtrain against an independent PyTorch implementation.
 *
 * The C side creates a small model, saves its initial weights in the checkpoint format
 * and writes ten training batches; tools/reference.py (Debian's python3-torch, CPU, fp32)
 * builds the same model from that checkpoint and writes logits, loss and all parameter
 * gradients for batch 0, then the losses and gradient norms of ten AdamW steps. The test
 * compares tensor by tensor.
 *
 * Tolerance: relative error ||c - torch|| / ||torch|| <= 1e-5 for every tensor. Both
 * sides compute in fp32 (unit roundoff u = 6e-8) but sum in different orders (BLAS
 * blocking, fused vs separate softmax, our log-sum-exp loss); the forward error of a
 * K-term dot product grows like sqrt(K)*u for random-order rounding, and the longest
 * reductions here (K = 4C = 256 in the MLP, N = B*T = 64 rows in weight gradients,
 * a few layers deep) give ~1e-6. 1e-5 leaves a 10x margin yet is three orders of
 * magnitude below what a wrong formula (a missing scale, a transposed weight, an
 * off-by-one mask) produces (>= 1e-2).
 */
#include <criterion/criterion.h>

#include "common/parity.h"
#include "common/train_test.h"
#include "train.h"

#define B 4
#define T 16
#define STEPS 10
#define TOL 1e-5

Test(parity, pytorch_forward_backward_and_adamw, .timeout = 120) {
  const char *py = getenv("TRAIN_PYTHON") ? getenv("TRAIN_PYTHON") : "/usr/bin/python3";
  char *cmd = th_fmt("%s -c 'import torch, numpy' >/dev/null 2>&1", py);
  if (system(cmd) != 0)
    cr_assert_fail("%s cannot import torch and numpy: install python3-torch "
                   "python3-numpy (Debian) to run the PyTorch parity test",
                   py);
  free(cmd);

  char *dir = th_tmpdir();
  cr_assert(dir);
  char err[TRAIN_ERRLEN];
  train_config cfg = {.vocab = 256, .max_seq = 32, .layers = 2, .channels = 64, .heads = 4};
  /* lr 1e-2: large enough that ten steps move the loss a lot */
  train_options o = th_options(cfg, B, T, 42, STEPS, 3, 1e-2f);
  train_session *s = train_session_create(&o, err);
  cr_assert(s, "%s", err);
  train_model *m = train_session_model(s);
  size_t np = train_num_params(m);

  /* the initial weights and the batches the session will draw, then torch on them */
  static int in[STEPS][B * T], tg[STEPS][B * T];
  th_parity_write(s, &o, STEPS, dir, &in[0][0], &tg[0][0]);
  th_reference_run(py, dir, B, T, STEPS, "cpu");

  /* 1. forward + backward of batch 0 */
  int V = o.cfg.vocab;
  float *rlogits = th_read_floats(dir, "logits.bin", (size_t)B * T * V);
  float *rloss = th_read_floats(dir, "loss.bin", 1);
  float *rgrads = th_read_floats(dir, "grads.bin", np);
  float loss = train_forward(m, in[0], tg[0], B, T);
  train_zero_grad(m);
  train_backward(m);
  float *logits = malloc((size_t)B * T * V * sizeof(float));
  float *grads = malloc(np * sizeof(float));
  train_copy_logits_to_host(m, logits);
  train_copy_grads_to_host(m, grads);

  double e = th_relerr(logits, rlogits, (size_t)B * T * V);
  cr_log_info("logits: rel err %.2e", e);
  cr_expect(e <= TOL, "logits: relative error %.3e > %.0e", e, TOL);
  e = fabs((double)loss - rloss[0]) / fabs(rloss[0]);
  cr_log_info("loss: C %.7f torch %.7f rel err %.2e", loss, rloss[0], e);
  cr_expect(e <= TOL, "loss: C %.8f torch %.8f relative error %.3e", loss, rloss[0], e);
  double worst = 0;
  const char *worst_name = "";
  for (int i = 0; i < train_num_tensors(m); i++) {
    const train_param *p = train_param_info(m, i);
    e = th_relerr(grads + p->offset, rgrads + p->offset, p->numel);
    cr_expect(e <= TOL, "gradient of %s: relative error %.3e > %.0e", p->name, e, TOL);
    if (e > worst) {
      worst = e;
      worst_name = p->name;
    }
  }
  cr_log_info("gradients: %d tensors, worst rel err %.2e (%s)", train_num_tensors(m), worst,
              worst_name);

  /* 2. ten AdamW steps (warmup + cosine lr, clipping, weight decay) */
  float *rlosses = th_read_floats(dir, "losses.bin", STEPS);
  float *rnorms = th_read_floats(dir, "norms.bin", STEPS);
  for (int k = 0; k < STEPS; k++) {
    train_step_stats st = train_session_step(s);
    double el = fabs((double)st.loss - rlosses[k]) / fabs(rlosses[k]);
    double en = fabs((double)st.grad_norm - rnorms[k]) / fabs(rnorms[k]);
    cr_log_info("step %2d: loss C %.7f torch %.7f (rel %.1e)  norm C %.5f torch %.5f "
                "(rel %.1e)",
                k + 1, st.loss, rlosses[k], el, st.grad_norm, rnorms[k], en);
    cr_expect(el <= TOL, "step %d loss: C %.8f torch %.8f relative error %.3e", k + 1, st.loss,
              rlosses[k], el);
    cr_expect(en <= 1e-4, "step %d grad norm: C %.6f torch %.6f", k + 1, st.grad_norm, rnorms[k]);
  }
  cr_expect(rlosses[STEPS - 1] < rlosses[0] - 0.5f, "ten steps should reduce the loss");

  free(rlogits);
  free(rloss);
  free(rgrads);
  free(rlosses);
  free(rnorms);
  free(logits);
  free(grads);
  train_session_free(s);
  th_rmrf(dir);
  free(dir);
}
