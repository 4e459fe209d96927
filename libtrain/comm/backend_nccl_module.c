/*
 * backend_nccl_module.c — the NCCL backend (backend_nccl.c) as found in the CUDA module
 * (base/cuda_module.c), in builds with CUDA; backend_nccl_stub.c stands in without it.
 * Never prints: a missing module or backend is a sentence in err.
 */
#include "comm/backend.h"
#include "base/util.h"

int train_backend_nccl_built(void) {
  char why[TRAIN_ERRLEN];
  int (*fn)(void) = (int (*)(void))train_cuda_module_sym("train_backend_nccl_built", why);
  return fn ? fn() : 0;
}

int train_nccl_device_count(void) {
  char why[TRAIN_ERRLEN];
  int (*fn)(void) = (int (*)(void))train_cuda_module_sym("train_nccl_device_count", why);
  return fn ? fn() : 0;
}

train_backend *train_backend_nccl(coll_comm_t boot, int own, char *err) {
  char why[TRAIN_ERRLEN];
  train_backend *(*fn)(coll_comm_t, int, char *) = (train_backend * (*)(coll_comm_t, int, char *))
      train_cuda_module_sym("train_backend_nccl", why);
  if (!fn) {
    train_errf(err, "--backend nccl: %s", why);
    return NULL;
  }
  return fn(boot, own, err);
}
