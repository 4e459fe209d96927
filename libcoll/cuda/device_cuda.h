/* device_cuda.h — the one question comm/ may ask of cuda/: its device table.
 *
 * comm.c asks it once per communicator, at creation, and holds the answer as comm->dev
 * (or, NULL, takes the host table, kernels/device_host.c); after that every layer above
 * reaches CUDA only through the table.  layers.rules forbids api/, comm/ and exec/ any
 * other arrow into cuda/ and allows comm.c this one, to this header and device_cuda.c.
 *
 * Must never: declare anything else, or name a CUDA type.
 */
#ifndef COLL_DEVICE_CUDA_H
#define COLL_DEVICE_CUDA_H

#include "device_ops.h"

/* The CUDA back end's table in a build with CUDA, NULL without.  Makes no CUDA call:
 * whether this process has a driver, a GPU, or COLL_CUDA=off is decided inside the
 * table's hooks, lazily and once per process (cuda.c's probe), as before. */
const coll_device_ops *coll_cuda_device(void);

#endif
