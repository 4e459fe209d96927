/*
 * cuda_ops_module.c — the model's CUDA entry points (layers_cuda.cu) as found in the CUDA
 * module (base/cuda_module.c), in builds with CUDA; cuda_stub.c stands in without it.
 * Never prints: a missing module is a sentence in err.
 */
#include "model/model.h"

const train_ops *train_cuda_ops(char *err) {
  char why[TRAIN_ERRLEN];
  const train_ops *(*fn)(
      char *) = (const train_ops *(*)(char *))train_cuda_module_sym("train_cuda_ops", why);
  if (!fn) {
    train_errf(err, "--device cuda: %s", why);
    return NULL;
  }
  return fn(err);
}

const char *train_cuda_device_name(char *err) {
  char why[TRAIN_ERRLEN];
  const char *(*fn)(
      char *) = (const char *(*)(char *))train_cuda_module_sym("train_cuda_device_name", why);
  if (!fn) {
    train_errf(err, "--device cuda: %s", why);
    return NULL;
  }
  return fn(err);
}

double train_cuda_peak_flops(void) {
  char why[TRAIN_ERRLEN];
  double (*fn)(void) = (double (*)(void))train_cuda_module_sym("train_cuda_peak_flops", why);
  return fn ? fn() : 0.0;
}
