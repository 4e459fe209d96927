/* elem_ops.cuh — the element operations every libcoll kernel shares: the dtype and op
 * numbering, the float16 / bfloat16 conversions, and one functor per (type, op).
 *
 * Results must be bit for bit those of kernels/reduce.c (test_cuda checks every dtype x
 * op, special values included), so every formula here is a line-by-line transcription of
 * the CPU one: the half conversions are the same integer bit manipulation (not the
 * cuda_fp16 intrinsics, whose NaN payloads differ), min/max order -0 below +0 and return
 * the quiet NaN operand, integer sums and products wrap in the unsigned type, integer
 * averages truncate toward zero, float averages are a true division.  Every file that
 * includes this is compiled with -fmad=false -ftz=false -prec-div=true.
 *
 * Must never: use fast-math intrinsics, or hold anything but __device__ inline code.
 */
#ifndef COLL_ELEM_OPS_CUH
#define COLL_ELEM_OPS_CUH

#include <stdint.h>

/* coll.h numbering, repeated here so this file needs no C header but its own. */
enum {
  K_INT8,
  K_UINT8,
  K_INT32,
  K_UINT32,
  K_INT64,
  K_UINT64,
  K_FLOAT16,
  K_BFLOAT16,
  K_FLOAT32,
  K_FLOAT64,
  K_NUM_DTYPES
};
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
  uint32_t r = ax > 0x7f800000u    ? nan
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

template <typename T, typename U>
struct IntSum {
  __device__ T operator()(T x, T y) const { return (T)(U)((U)x + (U)y); }
};
template <typename T, typename U>
struct IntProd {
  __device__ T operator()(T x, T y) const { return (T)(U)((U)x * (U)y); }
};
template <typename T>
struct IntMin {
  __device__ T operator()(T x, T y) const { return x < y ? x : y; }
};
template <typename T>
struct IntMax {
  __device__ T operator()(T x, T y) const { return x > y ? x : y; }
};
template <typename T>
struct FSum {
  __device__ T operator()(T x, T y) const { return x + y; }
};
template <typename T>
struct FProd {
  __device__ T operator()(T x, T y) const { return x * y; }
};
struct F32Min {
  __device__ float operator()(float x, float y) const { return min_f32(x, y); }
};
struct F32Max {
  __device__ float operator()(float x, float y) const { return max_f32(x, y); }
};
struct F64Min {
  __device__ double operator()(double x, double y) const { return min_f64(x, y); }
};
struct F64Max {
  __device__ double operator()(double x, double y) const { return max_f64(x, y); }
};

/* Half types: widen both, combine once in float, round back once. */
struct HalfF16 {
  __device__ static float in(uint16_t h) { return half_to_float(h); }
  __device__ static uint16_t out(float f) { return float_to_half(f); }
};
struct HalfBF16 {
  __device__ static float in(uint16_t h) { return bf16_to_float(h); }
  __device__ static uint16_t out(float f) { return float_to_bf16(f); }
};
template <typename H>
struct HSum {
  __device__ uint16_t operator()(uint16_t x, uint16_t y) const {
    return H::out(H::in(x) + H::in(y));
  }
};
template <typename H>
struct HProd {
  __device__ uint16_t operator()(uint16_t x, uint16_t y) const { return H::out(H::in(x)*H::in(y)); }
};
template <typename H>
struct HMin {
  __device__ uint16_t operator()(uint16_t x, uint16_t y) const {
    return H::out(min_f32(H::in(x), H::in(y)));
  }
};
template <typename H>
struct HMax {
  __device__ uint16_t operator()(uint16_t x, uint16_t y) const {
    return H::out(max_f32(H::in(x), H::in(y)));
  }
};

/* Averages: reduce.c's INT_AVG (division in D, truncating), float / double true
 * division, half types divide in float. */
template <typename T, typename D>
struct IntAvg {
  __device__ T operator()(T v, int nranks) const { return (T)(v / (D)nranks); }
};
template <typename T>
struct FAvg {
  __device__ T operator()(T v, int nranks) const { return v / (T)nranks; }
};
template <typename H>
struct HAvg {
  __device__ uint16_t operator()(uint16_t v, int nranks) const {
    return H::out(H::in(v) / (float)nranks);
  }
};

#endif
