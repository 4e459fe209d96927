/* peer_kernels.cu — the kernels of the device data path (peer.c): one kernel reduces N
 * buffers into one, another copies up to N segments at once.  The sources are other
 * ranks' buffers, mapped into this process with CUDA IPC; the kernel does not care.
 *
 * Reduction order is fixed: dst = (((s0 OP s1) OP s2) ... OP s(N-1)), rounded back to the
 * element type after every step (as reduce.c does when it folds one peer at a time), then
 * divided by N for COLL_AVG.  Every rank that reduces the same chunk gets the same bits.
 *
 * Speed: a memory-bound loop.  Each thread moves 16 bytes per source per iteration
 * (uint4 loads, all N issued before the first use, so N loads are in flight), the grid
 * strides over the vector; the few elements past the last whole vector, and buffers not
 * 16-byte aligned, take the scalar loop.  An element is read before the same thread
 * writes it and no thread touches another's element, so dst may be one of the sources.
 *
 * Must never: synchronise, allocate, print, or use fast-math intrinsics (the build gives
 * this file the exact-arithmetic flags of cuda_kernels.cu).
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "peer_kernels.h"

#include "elem_ops.cuh"

typedef struct {
  const void *src[COLL_PEER_MAX];
} srcs_t;

typedef struct {
  void *dst[COLL_PEER_MAX];
  const void *src[COLL_PEER_MAX];
  size_t bytes[COLL_PEER_MAX];
} segs_t;

struct NoFinish {
  template <typename T>
  __device__ T operator()(T v, int) const {
    return v;
  }
};

template <typename T>
union Vec {
  uint4 u;
  T t[16 / sizeof(T)];
};

template <typename T, typename Op, typename Fin>
__global__ void reduce_n_kernel(T *dst, srcs_t s, int nsrc, size_t n, int nranks, int vec) {
  Op op;
  Fin fin;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  size_t done = 0;
  if (vec) {
    constexpr int V = 16 / sizeof(T);
    const size_t nv = n / V;
    for (size_t i = tid; i < nv; i += stride) {
      Vec<T> v[COLL_PEER_MAX];
#pragma unroll
      for (int k = 0; k < COLL_PEER_MAX; k++)
        if (k < nsrc) v[k].u = ((const uint4 *)s.src[k])[i];
#pragma unroll
      for (int k = 1; k < COLL_PEER_MAX; k++)
        if (k < nsrc) {
#pragma unroll
          for (int j = 0; j < V; j++) v[0].t[j] = op(v[0].t[j], v[k].t[j]);
        }
#pragma unroll
      for (int j = 0; j < V; j++) v[0].t[j] = fin(v[0].t[j], nranks);
      ((uint4 *)dst)[i] = v[0].u;
    }
    done = nv * V;
  }
  for (size_t i = done + tid; i < n; i += stride) {
    T acc = ((const T *)s.src[0])[i];
    for (int k = 1; k < nsrc; k++) acc = op(acc, ((const T *)s.src[k])[i]);
    dst[i] = fin(acc, nranks);
  }
}

/* blockIdx.y picks the segment; the grid's x dimension strides over it. */
__global__ void copy_n_kernel(segs_t g) {
  const int k = blockIdx.y;
  const size_t bytes = g.bytes[k];
  const uint8_t *src = (const uint8_t *)g.src[k];
  uint8_t *dst = (uint8_t *)g.dst[k];
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  size_t done = 0;
  if ((((uintptr_t)src | (uintptr_t)dst) & 15) == 0) {
    const size_t nv = bytes / 16;
    const uint4 *s4 = (const uint4 *)src;
    uint4 *d4 = (uint4 *)dst;
    size_t i = tid;
    /* two loads in flight per thread before the stores */
    for (; i + stride < nv; i += 2 * stride) {
      uint4 a = s4[i], b = s4[i + stride];
      d4[i] = a;
      d4[i + stride] = b;
    }
    if (i < nv) d4[i] = s4[i];
    done = nv * 16;
  }
  for (size_t i = done + tid; i < bytes; i += stride) dst[i] = src[i];
}

static const unsigned kThreads = 512;

static unsigned blocks_for(size_t units, unsigned max_blocks) {
  size_t b = (units + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  return (unsigned)(b < max_blocks ? b : max_blocks);
}

typedef cudaError_t (*reduce_n_launcher)(void *, const srcs_t &, int, size_t, int, unsigned,
                                         cudaStream_t);

template <typename T, typename Op, typename Fin>
static cudaError_t launch_reduce_n(void *dst, const srcs_t &s, int nsrc, size_t n, int nranks,
                                   unsigned max_blocks, cudaStream_t st) {
  if (n == 0) { /* preload: load the kernel, launch nothing */
    cudaFuncAttributes fa;
    return cudaFuncGetAttributes(&fa, reduce_n_kernel<T, Op, Fin>);
  }
  uintptr_t bits = (uintptr_t)dst;
  for (int k = 0; k < nsrc; k++) bits |= (uintptr_t)s.src[k];
  int vec = (bits & 15) == 0;
  size_t units = vec ? n / (16 / sizeof(T)) + 1 : n;
  reduce_n_kernel<T, Op, Fin>
      <<<blocks_for(units, max_blocks), kThreads, 0, st>>>((T *)dst, s, nsrc, n, nranks, vec);
  return cudaGetLastError();
}

#define INT_ROW(T, U, D)                                                                     \
  {                                                                                          \
    launch_reduce_n<T, IntSum<T, U>, NoFinish>, launch_reduce_n<T, IntProd<T, U>, NoFinish>, \
        launch_reduce_n<T, IntMin<T>, NoFinish>, launch_reduce_n<T, IntMax<T>, NoFinish>,    \
        launch_reduce_n<T, IntSum<T, U>, IntAvg<T, D>>                                       \
  }
#define HALF_ROW(H)                                                                               \
  {                                                                                               \
    launch_reduce_n<uint16_t, HSum<H>, NoFinish>, launch_reduce_n<uint16_t, HProd<H>, NoFinish>,  \
        launch_reduce_n<uint16_t, HMin<H>, NoFinish>,                                             \
        launch_reduce_n<uint16_t, HMax<H>, NoFinish>, launch_reduce_n<uint16_t, HSum<H>, HAvg<H>> \
  }

/* [dtype][op] in coll.h order; the avg column sums, then divides by nranks in the same
 * pass (the averages of elem_ops.cuh, as reduce.c's coll_kernel_avg). */
static const reduce_n_launcher table[K_NUM_DTYPES][K_NUM_OPS] = {
    INT_ROW(int8_t, uint8_t, int),
    INT_ROW(uint8_t, uint8_t, int),
    INT_ROW(int32_t, uint32_t, int32_t),
    INT_ROW(uint32_t, uint32_t, uint32_t),
    INT_ROW(int64_t, uint64_t, int64_t),
    INT_ROW(uint64_t, uint64_t, uint64_t),
    HALF_ROW(HalfF16),
    HALF_ROW(HalfBF16),
    {launch_reduce_n<float, FSum<float>, NoFinish>, launch_reduce_n<float, FProd<float>, NoFinish>,
     launch_reduce_n<float, F32Min, NoFinish>, launch_reduce_n<float, F32Max, NoFinish>,
     launch_reduce_n<float, FSum<float>, FAvg<float>>},
    {launch_reduce_n<double, FSum<double>, NoFinish>,
     launch_reduce_n<double, FProd<double>, NoFinish>, launch_reduce_n<double, F64Min, NoFinish>,
     launch_reduce_n<double, F64Max, NoFinish>,
     launch_reduce_n<double, FSum<double>, FAvg<double>>},
};

extern "C" int coll_cuda_launch_reduce_n(void *dst, const void *const *src, int nsrc, size_t n,
                                         int dtype, int op, int nranks, unsigned max_blocks,
                                         void *stream) {
  if (dtype < 0 || dtype >= K_NUM_DTYPES || op < 0 || op >= K_NUM_OPS || nsrc < 1 ||
      nsrc > COLL_PEER_MAX || max_blocks < 1)
    return (int)cudaErrorInvalidValue;
  if (n == 0) return (int)cudaSuccess;
  srcs_t s = {};
  for (int k = 0; k < nsrc; k++) s.src[k] = src[k];
  return (int)table[dtype][op](dst, s, nsrc, n, nranks, max_blocks, (cudaStream_t)stream);
}

extern "C" int coll_cuda_launch_copy_n(void *const *dst, const void *const *src,
                                       const size_t *bytes, int nseg, unsigned max_blocks,
                                       void *stream) {
  if (nseg < 0 || nseg > COLL_PEER_MAX || max_blocks < 1) return (int)cudaErrorInvalidValue;
  segs_t g = {};
  size_t most = 0;
  int k = 0;
  for (int i = 0; i < nseg; i++) {
    if (!bytes[i] || dst[i] == src[i]) continue; /* nothing to move */
    g.dst[k] = dst[i];
    g.src[k] = src[i];
    g.bytes[k] = bytes[i];
    if (bytes[i] > most) most = bytes[i];
    k++;
  }
  if (!k) return (int)cudaSuccess;
  /* Spread the blocks over the segments: the grid as a whole, not each segment, fills the
   * GPU. */
  unsigned per = max_blocks / (unsigned)k;
  if (per < 1) per = 1;
  dim3 grid(blocks_for(most / 16 + 1, per), (unsigned)k);
  copy_n_kernel<<<grid, kThreads, 0, (cudaStream_t)stream>>>(g);
  return (int)cudaGetLastError();
}

extern "C" int coll_cuda_peer_kernel_present(int dtype, int op) {
  if (dtype < 0 || dtype >= K_NUM_DTYPES || op < 0 || op >= K_NUM_OPS) return 0;
  return table[dtype][op] != nullptr;
}

extern "C" int coll_cuda_preload_peer_kernels(void) {
  srcs_t s = {};
  for (int d = 0; d < K_NUM_DTYPES; d++)
    for (int op = 0; op < K_NUM_OPS; op++) {
      cudaError_t e = table[d][op](nullptr, s, 1, 0, 1, 1, nullptr);
      if (e != cudaSuccess) return (int)e;
    }
  cudaFuncAttributes fa;
  return (int)cudaFuncGetAttributes(&fa, copy_n_kernel);
}
