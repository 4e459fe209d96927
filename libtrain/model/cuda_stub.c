/*
 * cuda_stub.c — stands in for layers_cuda.cu in builds without nvcc, so the library and
 * coll-train link the same way everywhere and `--device cuda` fails with a clear message.
 */
#include "model/model.h"

const train_ops *train_cuda_ops(char *err) {
  train_errf(err, "--device cuda: this build of libtrain has no CUDA support (nvcc was "
                  "not found when it was configured)");
  return NULL;
}

const char *train_cuda_device_name(char *err) {
  train_cuda_ops(err);
  return NULL;
}

double train_cuda_peak_flops(void) { return 0.0; }
