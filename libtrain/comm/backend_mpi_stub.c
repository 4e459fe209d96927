/*
 * backend_mpi_stub.c — stands in for backend_mpi.c when meson did not find Open MPI:
 * asking for the MPI backend fails with a sentence saying how to get it. Never prints.
 */
#include "comm/backend.h"
#include "base/util.h"

int train_backend_mpi_built(void) { return 0; }

train_backend *train_backend_mpi(char *err) {
  train_errf(err, "MPI backend: this build has no Open MPI (install libopenmpi-dev and "
                  "reconfigure with meson)");
  return NULL;
}
