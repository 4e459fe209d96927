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

/* coll.h numbering, repeated here so this file needs no C header but its own. */
enum { K_INT8, K_UINT8, K_INT32, K_UINT32, K_INT64, K_UINT64, K_FLOAT16, K_BFLOAT16,
       K_FLOAT32, K_FLOAT64, K_NUM_DTYPES };
enum { K_SUM, K_PROD, K_MIN, K_MAX, K_AVG, K_NUM_OPS };

/* ---- conversions (transcribed from reduce.c) ---------------------------------------- */

__device__ __forceinline__ float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t em = h & 0x7fffu;
  uint32_t normal = (em << 13) + ((127u - 15u) << 23);
  uint32_t quiet = em > 0x7c00u ? 0x00400000u : 0u;
  uint32_t special = 0x7f800000u | ((em & 0x3ffu) << 13) | quiet;
  /* em * 2^-24: exact (em < 1024) */
  uint32_t sub = __float_as_uint((float)(int32_t)em * 5.9604644775390625e-8f);
  uint32_t mag = em >= 0x7c00u ? special : em >= 0x0400u ? normal : sub;
  return __uint_as_float(sign | mag);
}

__device__ __forceinline__ uint16_t float_to_half(float f) {
  uint32_t x = __float_as_uint(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  uint32_t nan = 0x7e00u | ((ax >> 13) & 0x3ffu);
  uint32_t y = ax - ((127u - 15u) << 23);
  uint32_t normal = (y + 0x0fffu + ((y >> 13) & 1u)) >> 13;
  uint32_t axs = ax < 0x38800000u ? ax : 0x38800000u;
  float s = __uint_as_float(axs) * 16777216.0f; /* * 2^24, exact; [0, 1024] */
  int32_t t = (int32_t)s;
  float frac = s - (float)t;
  uint32_t up = (uint32_t)(frac > 0.5f) | ((uint32_t)(frac == 0.5f) & (uint32_t)t);
  uint32_t sub = (uint32_t)t + (up & 1u);
  uint32_t r = ax > 0x7f800000u   ? nan
               : ax >= 0x47800000u ? 0x7c00u
               : ax >= 0x38800000u ? normal
                                   : sub;
  return (uint16_t)(sign | r);
}

__device__ __forceinline__ float bf16_to_float(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  if ((x & 0x7fffffffu) > 0x7f800000u) x |= 0x00400000u;
  return __uint_as_float(x);
}

__device__ __forceinline__ uint16_t float_to_bf16(float f) {
  uint32_t x = __float_as_uint(f);
  uint32_t nan = (uint32_t)(x >> 16) | 0x0040u;
  uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* ---- float min / max (reduce.c's FLOAT_MINMAX) -------------------------------------- */

__device__ __forceinline__ uint32_t fbits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ float ffrom(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ uint64_t fbits(double v) { return (uint64_t)__double_as_longlong(v); }
__device__ __forceinline__ double ffrom(uint64_t u) { return __longlong_as_double((long long)u); }

template <typename F, typename U, U QUIET, bool IS_MIN>
__device__ __forceinline__ F float_minmax(F x, F y) {
  U bx = fbits(x), by = fbits(y);
  U nan = (x != x ? bx : by) | QUIET;
  U r = (IS_MIN ? x < y : x > y) ? bx : by;
  r = x == y ? (IS_MIN ? (bx | by) : (bx & by)) : r;
  r = (x != x || y != y) ? nan : r;
  return ffrom(r);
}
__device__ __forceinline__ float min_f32(float x, float y) {
  return float_minmax<float, uint32_t, 0x00400000u, true>(x, y);
}
__device__ __forceinline__ float max_f32(float x, float y) {
  return float_minmax<float, uint32_t, 0x00400000u, false>(x, y);
}
__device__ __forceinline__ double min_f64(double x, double y) {
  return float_minmax<double, uint64_t, 0x0008000000000000ull, true>(x, y);
}
__device__ __forceinline__ double max_f64(double x, double y) {
  return float_minmax<double, uint64_t, 0x0008000000000000ull, false>(x, y);
}

/* ---- element operations, one functor per (type, op) ---------------------------------- */

template <typename T, typename U> struct IntSum {
  __device__ T operator()(T x, T y) const { return (T)(U)((U)x + (U)y); }
};
template <typename T, typename U> struct IntProd {
  __device__ T operator()(T x, T y) const { return (T)(U)((U)x * (U)y); }
};
template <typename T> struct IntMin {
  __device__ T operator()(T x, T y) const { return x < y ? x : y; }
};
template <typename T> struct IntMax {
  __device__ T operator()(T x, T y) const { return x > y ? x : y; }
};
template <typename T> struct FSum {
  __device__ T operator()(T x, T y) const { return x + y; }
};
template <typename T> struct FProd {
  __device__ T operator()(T x, T y) const { return x * y; }
};
struct F32Min { __device__ float operator()(float x, float y) const { return min_f32(x, y); } };
struct F32Max { __device__ float operator()(float x, float y) const { return max_f32(x, y); } };
struct F64Min { __device__ double operator()(double x, double y) const { return min_f64(x, y); } };
struct F64Max { __device__ double operator()(double x, double y) const { return max_f64(x, y); } };

/* Half types: widen both, combine once in float, round back once. */
struct HalfF16 {
  __device__ static float in(uint16_t h) { return half_to_float(h); }
  __device__ static uint16_t out(float f) { return float_to_half(f); }
};
struct HalfBF16 {
  __device__ static float in(uint16_t h) { return bf16_to_float(h); }
  __device__ static uint16_t out(float f) { return float_to_bf16(f); }
};
template <typename H> struct HSum {
  __device__ uint16_t operator()(uint16_t x, uint16_t y) const { return H::out(H::in(x) + H::in(y)); }
};
template <typename H> struct HProd {
  __device__ uint16_t operator()(uint16_t x, uint16_t y) const { return H::out(H::in(x) * H::in(y)); }
};
template <typename H> struct HMin {
  __device__ uint16_t operator()(uint16_t x, uint16_t y) const { return H::out(min_f32(H::in(x), H::in(y))); }
};
template <typename H> struct HMax {
  __device__ uint16_t operator()(uint16_t x, uint16_t y) const { return H::out(max_f32(H::in(x), H::in(y))); }
};

/* Averages: reduce.c's INT_AVG (division in D, truncating), float / double true
 * division, half types divide in float. */
template <typename T, typename D> struct IntAvg {
  __device__ T operator()(T v, int nranks) const { return (T)(v / (D)nranks); }
};
template <typename T> struct FAvg {
  __device__ T operator()(T v, int nranks) const { return v / (T)nranks; }
};
template <typename H> struct HAvg {
  __device__ uint16_t operator()(uint16_t v, int nranks) const {
    return H::out(H::in(v) / (float)nranks);
  }
};

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
  reduce_kernel<T, Op><<<blocks_for(n), kThreads, 0, s>>>((T *)dst, (const T *)a,
                                                          (const T *)b, n);
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

extern "C" int coll_cuda_launch_reduce(void *dst, const void *a, const void *b, size_t n,
                                       int dtype, int op, void *stream) {
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
