/* mem_ops.h — the memory-ops table: the executor's only way to touch bytes.
 *
 * The executor (exec/executor.c) runs every slice of a plan through one of these tables:
 * coll_mem_host (mem_host.c: memcpy and reduce.c's kernels) unless a collective's
 * buffers are device memory, when cuda.c's coll_cuda_exec_begin hands over its device
 * table (cudaMemcpyAsync and cuda_kernels.cu on the communicator's own CUDA stream,
 * with `fence` waiting for that stream).  The type lives here, in the kernels layer,
 * so that a host slice goes executor -> mem_host.c -> reduce.c, straight down, and
 * the cuda layer only adds a second implementation of it.
 *
 * Declarations only.  Must never: name a CUDA type (every file includes this in every
 * build), or grow an op that the host table cannot do as a plain loop.
 */
#ifndef COLL_MEM_OPS_H
#define COLL_MEM_OPS_H

#include <stddef.h>

#include "coll.h"

struct coll_comm;

typedef struct coll_mem_ops {
  const char *name;
  coll_result (*copy)(struct coll_comm *comm, void *dst, const void *src, size_t bytes);
  /* dst = a OP b over n elements (COLL_AVG as COLL_SUM), as coll_kernel_reduce. */
  coll_result (*reduce)(struct coll_comm *comm, void *dst, const void *a, const void *b, size_t n,
                        coll_dtype dtype, coll_op op);
  coll_result (*avg)(struct coll_comm *comm, void *buf, size_t n, coll_dtype dtype, int nranks);
  /* Everything issued so far has finished and is visible to the peer: called before a
   * slot is published or released, and once at the end of a collective. */
  coll_result (*fence)(struct coll_comm *comm);
} coll_mem_ops;

/* Host memory (mem_host.c): memcpy and reduce.c, done when they return (fence: nothing). */
extern const coll_mem_ops coll_mem_host;

#endif
