/*
 * backend_nccl_stub.c — stands in for backend_nccl.c in builds without CUDA or NCCL, so
 * coll-train links the same way everywhere and `--backend nccl` fails with a clear message.
 * Never prints.
 */
#include "comm/backend.h"
#include "base/util.h"

int train_backend_nccl_built(void) { return 0; }

int train_nccl_device_count(void) { return 0; }

train_backend *train_backend_nccl(coll_comm_t boot, int own, char *err) {
  (void)boot;
  (void)own;
  train_errf(err, "--backend nccl: this build of libtrain has no NCCL backend (the CUDA "
                  "toolkit, with nvcc on PATH, and nccl.h + libnccl were not found when it "
                  "was configured)");
  return NULL;
}
