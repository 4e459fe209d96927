/* peer_kernels.h — the C face of peer_kernels.cu: the device data path's two kernels
 * (each also fanned out to several outputs).
 *
 * No CUDA types (streams are void *, results the launch's cudaError_t as an int, 0 =
 * cudaSuccess), so peer.c's C code and the nvcc-compiled kernels share it.  Only built in
 * when the build found nvcc (COLL_HAVE_CUDA).  Must never synchronise, allocate or print.
 */
#ifndef COLL_PEER_KERNELS_H
#define COLL_PEER_KERNELS_H

#include <stddef.h>

/* The most buffers one kernel reads: the device path serves communicators of up to this
 * many ranks (algo/device.c's rows say so to the tuner). */
#define COLL_PEER_MAX 8

#ifdef __cplusplus
extern "C" {
#endif

/* dst[i] = src[0][i] OP src[1][i] ... OP src[nsrc-1][i] for i < n, folded left to right
 * and rounded to the dtype at every step; COLL_AVG then divides by nranks.  dst may be
 * one of the sources.  At most max_blocks blocks. */
__attribute__((visibility("hidden"))) int coll_cuda_launch_reduce_n(
    void *dst, const void *const *src, int nsrc, size_t n, int dtype, int op, int nranks,
    unsigned max_blocks, void *stream);
/* Copies bytes[i] from src[i] to dst[i] for i < nseg, in one launch (empty segments and
 * dst == src are skipped). */
__attribute__((visibility("hidden"))) int coll_cuda_launch_copy_n(void *const *dst,
                                                                  const void *const *src,
                                                                  const size_t *bytes, int nseg,
                                                                  unsigned max_blocks,
                                                                  void *stream);
/* The same, fanned out (the one-GPU row): with seg 0, dst[0..ndst) all get the result;
 * with seg > 0, output o gets the reduction of the sources' elements [o*seg, o*seg + n)
 * (a reduce-scatter: ndst segments in one launch).  An output may be one of the sources
 * (in place), as above. */
__attribute__((visibility("hidden"))) int coll_cuda_launch_reduce_fan(
    void *const *dst, int ndst, size_t seg, const void *const *src, int nsrc, size_t n, int dtype,
    int op, int nranks, unsigned max_blocks, void *stream);
/* Copies bytes[i] from src[i] to each of dst[i*ndst + 0..ndst) (NULL entries and outputs
 * that are the source are skipped): every source read once. */
__attribute__((visibility("hidden"))) int coll_cuda_launch_copy_fan(void *const *dst, int ndst,
                                                                    const void *const *src,
                                                                    const size_t *bytes, int nseg,
                                                                    unsigned max_blocks,
                                                                    void *stream);
/* 1 when (dtype, op) has a kernel. */
__attribute__((visibility("hidden"))) int coll_cuda_peer_kernel_present(int dtype, int op);
/* Loads every kernel of this file (no launch); a cudaError_t. */
__attribute__((visibility("hidden"))) int coll_cuda_preload_peer_kernels(void);

#ifdef __cplusplus
}
#endif
#endif
