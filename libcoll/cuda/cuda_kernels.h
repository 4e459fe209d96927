/* cuda_kernels.h — the C face of cuda_kernels.cu: launch the device reduction kernels.
 *
 * Shared by the nvcc-compiled kernels and the C code of cuda.c, so it holds no CUDA
 * types: streams are passed as void * (a cudaStream_t) and results come back as the
 * cudaError_t of the launch, as an int (0 = cudaSuccess).  Only compiled in when the
 * build found nvcc (COLL_HAVE_CUDA).  Must never synchronise, allocate or print: the
 * executor calls these on its hot path and checks every return code itself.
 */
#ifndef COLL_CUDA_KERNELS_H
#define COLL_CUDA_KERNELS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst[i] = a[i] OP b[i] for i < n on `stream` (COLL_AVG reduces as COLL_SUM), dtype and
 * op numbered as coll_dtype / coll_op.  dst may be exactly a or b.  Returns the launch's
 * cudaError_t (an invalid dtype/op gives cudaErrorInvalidValue; n == 0 launches nothing). */
__attribute__((visibility("hidden"))) int coll_cuda_launch_reduce(void *dst, const void *a,
                                                                  const void *b, size_t n,
                                                                  int dtype, int op, void *stream);
/* buf[i] = buf[i] / nranks in place (the last step of COLL_AVG), as coll_kernel_avg. */
__attribute__((visibility("hidden"))) int coll_cuda_launch_avg(void *buf, size_t n, int dtype,
                                                               int nranks, void *stream);
/* 1 when the dispatch table has a kernel for (dtype, op) (op == -1: the avg kernel). */
__attribute__((visibility("hidden"))) int coll_cuda_kernel_present(int dtype, int op);
/* Loads every kernel (no launch); a cudaError_t. */
__attribute__((visibility("hidden"))) int coll_cuda_preload_kernels(void);

#ifdef __cplusplus
}
#endif
#endif
