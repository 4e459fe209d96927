/* cuda_kernels.cu — the device twins of reduce.c: dst = a OP b for every dtype × op,
 * the in-place division that finishes COLL_AVG, and the float16 / bfloat16 conversions.
 *
 * Results must be bit for bit those of reduce.c (test_cuda checks every dtype × op,
 * special values included), so every formula here is a line-by-line transcription of
 * the CPU one: the half conversions are the same integer bit manipulation (not the
 * cuda_fp16 intrinsics, whose NaN payloads differ), min/max order -0 below +0 and
 * return the quiet NaN operand, integer sums and products wrap in the unsigned type,
 * integer averages truncate toward zero, float averages are a true division.  The
 * build compiles this file with -fmad=false -ftz=false -prec-div=true so that nvcc can
 * neither contract, flush subnormals nor approximate a division.
 *
 * Each kernel is a grid-stride loop in which thread i reads a[i] and b[i] before it
 * writes dst[i] and touches no other element, so dst may alias a or b exactly.
 *
 * Must never: synchronise, allocate, print, or use fast-math intrinsics.  The host
 * launchers only launch on the stream they are given and return the launch's error.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_kernels.h"

#include "elem_ops.cuh"

/* ---- kernels and launchers ---------------------------------------------------------- */

template <typename T, typename Op>
__global__ void reduce_kernel(T *dst, const T *a, const T *b, size_t n) {
  Op op;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    T x = a[i], y = b[i];
    dst[i] = op(x, y);
  }
}

template <typename T, typename Op>
__global__ void avg_kernel(T *buf, size_t n, int nranks) {
  Op op;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    buf[i] = op(buf[i], nranks);
}

static const unsigned kThreads = 256;
/* Enough blocks to fill any current GPU several times over; the loop covers the rest. */
static const size_t kMaxBlocks = 4096;

static unsigned blocks_for(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < kMaxBlocks ? b : kMaxBlocks);
}

typedef cudaError_t (*reduce_launcher)(void *, const void *, const void *, size_t, cudaStream_t);
typedef cudaError_t (*avg_launcher)(void *, size_t, int, cudaStream_t);

template <typename T, typename Op>
static cudaError_t launch_reduce(void *dst, const void *a, const void *b, size_t n,
                                 cudaStream_t s) {
  if (n == 0) {  // coll_cuda_preload_kernels: load the kernel, launch nothing
    cudaFuncAttributes fa;
    return cudaFuncGetAttributes(&fa, reduce_kernel<T, Op>);
  }
  reduce_kernel<T, Op><<<blocks_for(n), kThreads, 0, s>>>((T *)dst, (const T *)a, (const T *)b, n);
  return cudaGetLastError();
}

template <typename T, typename Op>
static cudaError_t launch_avg(void *buf, size_t n, int nranks, cudaStream_t s) {
  if (n == 0) {  // coll_cuda_preload_kernels
    cudaFuncAttributes fa;
    return cudaFuncGetAttributes(&fa, avg_kernel<T, Op>);
  }
  avg_kernel<T, Op><<<blocks_for(n), kThreads, 0, s>>>((T *)buf, n, nranks);
  return cudaGetLastError();
}

/* Not formatted: the launcher table and its row macros, laid out by hand (clang-format
 * would take a macro's braced row for a block). */
/* clang-format off */
#define INT_ROW(T, U)                                                                  \
  { launch_reduce<T, IntSum<T, U>>, launch_reduce<T, IntProd<T, U>>,                   \
    launch_reduce<T, IntMin<T>>, launch_reduce<T, IntMax<T>>,                          \
    launch_reduce<T, IntSum<T, U>> }
#define HALF_ROW(H)                                                                    \
  { launch_reduce<uint16_t, HSum<H>>, launch_reduce<uint16_t, HProd<H>>,               \
    launch_reduce<uint16_t, HMin<H>>, launch_reduce<uint16_t, HMax<H>>,                \
    launch_reduce<uint16_t, HSum<H>> }

/* [dtype][op], in coll.h order; COLL_AVG reduces as COLL_SUM. */
static const reduce_launcher reduce_table[K_NUM_DTYPES][K_NUM_OPS] = {
    INT_ROW(int8_t, uint8_t),
    INT_ROW(uint8_t, uint8_t),
    INT_ROW(int32_t, uint32_t),
    INT_ROW(uint32_t, uint32_t),
    INT_ROW(int64_t, uint64_t),
    INT_ROW(uint64_t, uint64_t),
    HALF_ROW(HalfF16),
    HALF_ROW(HalfBF16),
    {launch_reduce<float, FSum<float>>, launch_reduce<float, FProd<float>>,
     launch_reduce<float, F32Min>, launch_reduce<float, F32Max>,
     launch_reduce<float, FSum<float>>},
    {launch_reduce<double, FSum<double>>, launch_reduce<double, FProd<double>>,
     launch_reduce<double, F64Min>, launch_reduce<double, F64Max>,
     launch_reduce<double, FSum<double>>},
};
/* clang-format on */

static const avg_launcher avg_table[K_NUM_DTYPES] = {
    launch_avg<int8_t, IntAvg<int8_t, int>>,
    launch_avg<uint8_t, IntAvg<uint8_t, int>>,
    launch_avg<int32_t, IntAvg<int32_t, int32_t>>,
    launch_avg<uint32_t, IntAvg<uint32_t, uint32_t>>,
    launch_avg<int64_t, IntAvg<int64_t, int64_t>>,
    launch_avg<uint64_t, IntAvg<uint64_t, uint64_t>>,
    launch_avg<uint16_t, HAvg<HalfF16>>,
    launch_avg<uint16_t, HAvg<HalfBF16>>,
    launch_avg<float, FAvg<float>>,
    launch_avg<double, FAvg<double>>,
};

extern "C" int coll_cuda_launch_reduce(void *dst, const void *a, const void *b, size_t n, int dtype,
                                       int op, void *stream) {
  if (dtype < 0 || dtype >= K_NUM_DTYPES || op < 0 || op >= K_NUM_OPS)
    return (int)cudaErrorInvalidValue;
  if (n == 0) return (int)cudaSuccess;
  return (int)reduce_table[dtype][op](dst, a, b, n, (cudaStream_t)stream);
}

extern "C" int coll_cuda_launch_avg(void *buf, size_t n, int dtype, int nranks, void *stream) {
  if (dtype < 0 || dtype >= K_NUM_DTYPES) return (int)cudaErrorInvalidValue;
  if (n == 0 || nranks <= 1) return (int)cudaSuccess;
  return (int)avg_table[dtype](buf, n, nranks, (cudaStream_t)stream);
}

extern "C" int coll_cuda_kernel_present(int dtype, int op) {
  if (dtype < 0 || dtype >= K_NUM_DTYPES) return 0;
  if (op == -1) return avg_table[dtype] != nullptr;
  if (op < 0 || op >= K_NUM_OPS) return 0;
  return reduce_table[dtype][op] != nullptr;
}

/* Loads every kernel now.  CUDA 12.2+ loads kernels lazily, at their first launch, and a
 * load may synchronise the context: if that first launch comes while a user's stream
 * waits (cuStreamWaitValue32) for this very call, the two wait for each other — the likely
 * cause of the stream-ordered hang of the first GPU run (not yet confirmed on a GPU).
 * Called once, when a communicator's device path is set up. */
extern "C" int coll_cuda_preload_kernels(void) {
  for (int d = 0; d < K_NUM_DTYPES; d++) {
    for (int op = 0; op < K_NUM_OPS; op++) {
      cudaError_t e = reduce_table[d][op](nullptr, nullptr, nullptr, 0, nullptr);
      if (e != cudaSuccess) return (int)e;
    }
    cudaError_t e = avg_table[d](nullptr, 0, 2, nullptr);
    if (e != cudaSuccess) return (int)e;
  }
  return (int)cudaSuccess;
}
