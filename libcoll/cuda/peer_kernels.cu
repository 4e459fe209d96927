/* peer_kernels.cu — the kernels of the device data path (peer.c): one kernel reduces N
 * buffers into one, another copies up to N segments at once.  The sources are other
 * ranks' buffers, mapped into this process with CUDA IPC; the kernel does not care.
 *
 * Both kernels fan out too, for the one-GPU row (dev_onegpu, algo/device.c), where one
 * rank's launch serves every rank: the reduction writes its result to several outputs,
 * or reduces several segments at once (one per output, blockIdx.y); the copy writes
 * each source segment to several outputs.  Every source byte is read once either way.
 *
 * Reduction order is fixed: dst = (((s0 OP s1) OP s2) ... OP s(N-1)), rounded back to the
 * element type after every step (as reduce.c does when it folds one peer at a time), then
 * divided by N for COLL_AVG.  Every rank that reduces the same chunk gets the same bits.
 *
 * Speed: a memory-bound loop.  Each thread moves 16 bytes per source per iteration
 * (uint4 loads, all N issued before the first use, so N loads are in flight), the grid
 * strides over the vector; the few elements past the last whole vector, and buffers not
 * 16-byte aligned, take the scalar loop.  An element is read (from every source) before
 * the same thread writes it (to every output) and no thread touches another's element,
 * so an output may be one of the sources.
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

/* Outputs of a reduction: with `seg` 0, every one gets the whole result; else block row
 * y reduces the sources' elements [y*seg, y*seg + n) into dst[y] alone. */
typedef struct {
  void *dst[COLL_PEER_MAX];
  int ndst;
  size_t seg;
} dsts_t;

/* Segment k (blockIdx.y) copies bytes[k] from src[k] to dst[k][0..ndst[k]). */
typedef struct {
  void *dst[COLL_PEER_MAX][COLL_PEER_MAX];
  const void *src[COLL_PEER_MAX];
  size_t bytes[COLL_PEER_MAX];
  int ndst[COLL_PEER_MAX];
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
__global__ void reduce_n_kernel(dsts_t d, srcs_t s, int nsrc, size_t n, int nranks, int vec) {
  Op op;
  Fin fin;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  /* this block row's sources and outputs */
  const size_t base = d.seg ? (size_t)blockIdx.y * d.seg : 0;
  const int first = d.seg ? (int)blockIdx.y : 0, last = d.seg ? first + 1 : d.ndst;
  size_t done = 0;
  if (vec) {
    constexpr int V = 16 / sizeof(T);
    const size_t nv = n / V;
    for (size_t i = tid; i < nv; i += stride) {
      Vec<T> v[COLL_PEER_MAX];
#pragma unroll
      for (int k = 0; k < COLL_PEER_MAX; k++)
        if (k < nsrc) v[k].u = ((const uint4 *)((const T *)s.src[k] + base))[i];
#pragma unroll
      for (int k = 1; k < COLL_PEER_MAX; k++)
        if (k < nsrc) {
#pragma unroll
          for (int j = 0; j < V; j++) v[0].t[j] = op(v[0].t[j], v[k].t[j]);
        }
#pragma unroll
      for (int j = 0; j < V; j++) v[0].t[j] = fin(v[0].t[j], nranks);
      for (int o = first; o < last; o++) ((uint4 *)d.dst[o])[i] = v[0].u;
    }
    done = nv * V;
  }
  for (size_t i = done + tid; i < n; i += stride) {
    T acc = ((const T *)s.src[0])[base + i];
    for (int k = 1; k < nsrc; k++) acc = op(acc, ((const T *)s.src[k])[base + i]);
    acc = fin(acc, nranks);
    for (int o = first; o < last; o++) ((T *)d.dst[o])[i] = acc;
  }
}

/* blockIdx.y picks the segment; the grid's x dimension strides over it.  Each loaded
 * piece is stored to every output of the segment. */
__global__ void copy_n_kernel(segs_t g) {
  const int k = blockIdx.y, nd = g.ndst[k];
  const size_t bytes = g.bytes[k];
  const uint8_t *src = (const uint8_t *)g.src[k];
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  uintptr_t bits = (uintptr_t)src;
  for (int o = 0; o < nd; o++) bits |= (uintptr_t)g.dst[k][o];
  size_t done = 0;
  if ((bits & 15) == 0) {
    const size_t nv = bytes / 16;
    const uint4 *s4 = (const uint4 *)src;
    size_t i = tid;
    /* two loads in flight per thread before the stores */
    for (; i + stride < nv; i += 2 * stride) {
      uint4 a = s4[i], b = s4[i + stride];
      for (int o = 0; o < nd; o++) {
        uint4 *d4 = (uint4 *)g.dst[k][o];
        d4[i] = a;
        d4[i + stride] = b;
      }
    }
    if (i < nv) {
      uint4 a = s4[i];
      for (int o = 0; o < nd; o++) ((uint4 *)g.dst[k][o])[i] = a;
    }
    done = nv * 16;
  }
  for (size_t i = done + tid; i < bytes; i += stride) {
    uint8_t b = src[i];
    for (int o = 0; o < nd; o++) ((uint8_t *)g.dst[k][o])[i] = b;
  }
}

static const unsigned kThreads = 512;

static unsigned blocks_for(size_t units, unsigned max_blocks) {
  size_t b = (units + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  return (unsigned)(b < max_blocks ? b : max_blocks);
}

typedef cudaError_t (*reduce_n_launcher)(const dsts_t &, const srcs_t &, int, size_t, int, unsigned,
                                         cudaStream_t);

template <typename T, typename Op, typename Fin>
static cudaError_t launch_reduce_n(const dsts_t &d, const srcs_t &s, int nsrc, size_t n, int nranks,
                                   unsigned max_blocks, cudaStream_t st) {
  if (n == 0) { /* preload: load the kernel, launch nothing */
    cudaFuncAttributes fa;
    return cudaFuncGetAttributes(&fa, reduce_n_kernel<T, Op, Fin>);
  }
  /* the vector loop needs every block row's sources and outputs 16-byte aligned */
  uintptr_t bits = d.seg * sizeof(T);
  for (int k = 0; k < d.ndst; k++) bits |= (uintptr_t)d.dst[k];
  for (int k = 0; k < nsrc; k++) bits |= (uintptr_t)s.src[k];
  int vec = (bits & 15) == 0;
  size_t units = vec ? n / (16 / sizeof(T)) + 1 : n;
  unsigned rows = d.seg ? (unsigned)d.ndst : 1, per = max_blocks / rows;
  dim3 grid(blocks_for(units, per ? per : 1), rows);
  reduce_n_kernel<T, Op, Fin><<<grid, kThreads, 0, st>>>(d, s, nsrc, n, nranks, vec);
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

extern "C" int coll_cuda_launch_reduce_fan(void *const *dst, int ndst, size_t seg,
                                           const void *const *src, int nsrc, size_t n, int dtype,
                                           int op, int nranks, unsigned max_blocks, void *stream) {
  if (dtype < 0 || dtype >= K_NUM_DTYPES || op < 0 || op >= K_NUM_OPS || nsrc < 1 ||
      nsrc > COLL_PEER_MAX || ndst < 1 || ndst > COLL_PEER_MAX || max_blocks < 1)
    return (int)cudaErrorInvalidValue;
  if (n == 0) return (int)cudaSuccess;
  srcs_t s = {};
  for (int k = 0; k < nsrc; k++) s.src[k] = src[k];
  dsts_t d = {};
  for (int k = 0; k < ndst; k++) d.dst[k] = dst[k];
  d.ndst = ndst;
  d.seg = seg;
  return (int)table[dtype][op](d, s, nsrc, n, nranks, max_blocks, (cudaStream_t)stream);
}

extern "C" int coll_cuda_launch_reduce_n(void *dst, const void *const *src, int nsrc, size_t n,
                                         int dtype, int op, int nranks, unsigned max_blocks,
                                         void *stream) {
  return coll_cuda_launch_reduce_fan(&dst, 1, 0, src, nsrc, n, dtype, op, nranks, max_blocks,
                                     stream);
}

extern "C" int coll_cuda_launch_copy_fan(void *const *dst, int ndst, const void *const *src,
                                         const size_t *bytes, int nseg, unsigned max_blocks,
                                         void *stream) {
  if (nseg < 0 || nseg > COLL_PEER_MAX || ndst < 1 || ndst > COLL_PEER_MAX || max_blocks < 1)
    return (int)cudaErrorInvalidValue;
  segs_t g = {};
  size_t most = 0;
  int k = 0;
  for (int i = 0; i < nseg; i++) {
    int nd = 0;
    for (int o = 0; o < ndst; o++) { /* an output that is the source: nothing to move */
      void *to = dst[(size_t)i * (size_t)ndst + (size_t)o];
      if (to && to != src[i]) g.dst[k][nd++] = to;
    }
    if (!bytes[i] || !nd) continue;
    g.src[k] = src[i];
    g.bytes[k] = bytes[i];
    g.ndst[k] = nd;
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

extern "C" int coll_cuda_launch_copy_n(void *const *dst, const void *const *src,
                                       const size_t *bytes, int nseg, unsigned max_blocks,
                                       void *stream) {
  return coll_cuda_launch_copy_fan(dst, 1, src, bytes, nseg, max_blocks, stream);
}

extern "C" int coll_cuda_peer_kernel_present(int dtype, int op) {
  if (dtype < 0 || dtype >= K_NUM_DTYPES || op < 0 || op >= K_NUM_OPS) return 0;
  return table[dtype][op] != nullptr;
}

extern "C" int coll_cuda_preload_peer_kernels(void) {
  srcs_t s = {};
  for (int d = 0; d < K_NUM_DTYPES; d++)
    for (int op = 0; op < K_NUM_OPS; op++) {
      cudaError_t e = table[d][op](dsts_t{}, s, 1, 0, 1, 1, nullptr);
      if (e != cudaSuccess) return (int)e;
    }
  cudaFuncAttributes fa;
  return (int)cudaFuncGetAttributes(&fa, copy_n_kernel);
}
