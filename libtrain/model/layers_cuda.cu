/*
 * layers_cuda.cu — the GPU back end: the same layer table as layers_cpu.c (internal.h),
 * with matmuls through cuBLAS (fp32, no TF32, so it can be checked against the CPU)
 * and every other layer a small CUDA kernel. All work goes to the default stream, in
 * call order; train_ops.sync waits for it.
 *
 * Row-major tensors meet column-major cuBLAS by computing the transpose: a row-major
 * (M,N) matrix is a column-major (N,M) one, so out = A·B becomes out^T = B^T·A^T with
 * the operands swapped. Each gemm below states the row-major product it computes.
 * Attention runs per sequence b as a batch over the NH heads (stride hs inside a row).
 *
 * Differences from the CPU path: scatter-adds (embedding backward) and column sums use
 * atomics, so GPU runs are reproducible only to rounding, not bit for bit.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "model/model.h"
}

static cublasHandle_t cublas;
static double *d_acc; /* one double for reductions */
static char device_name[256];
static double peak_flops;

/* CUDA reports most errors late (a kernel's fault surfaces at a later call) and the layer
 * table's calls return nothing, so a failed call is recorded, not acted on: the first
 * failure's sentence is kept (later ones are usually its echo), and train_ops.error hands
 * it to the trainer, which checks after every step and before it saves anything.  The
 * library never prints or exits (style.md). */
static char g_error[TRAIN_ERRLEN];
static int g_failed;
static void g_record(const char *what, const char *detail, const char *call, const char *file,
                     int line) {
  if (g_failed) return;
  g_failed = 1;
  snprintf(g_error, sizeof g_error, "--device cuda: %s %s in %s (%s:%d)", what, detail, call, file,
           line);
}
#define CK(call)                                                                 \
  do {                                                                           \
    cudaError_t e_ = (call);                                                     \
    if (e_ != cudaSuccess)                                                       \
      g_record("CUDA error", cudaGetErrorString(e_), #call, __FILE__, __LINE__); \
  } while (0)
#define CB(call)                                                                      \
  do {                                                                                \
    cublasStatus_t s_ = (call);                                                       \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                  \
      g_record("cuBLAS error", cublasGetStatusString(s_), #call, __FILE__, __LINE__); \
  } while (0)

static int g_status(char *err) {
  if (!g_failed) return 0;
  train_errf(err, "%s", g_error);
  return -1;
}

static inline int blocks(size_t n, int threads) { return (int)((n + threads - 1) / threads); }

/* ---- memory ---------------------------------------------------------------------- */

static void *g_alloc(size_t bytes) {
  void *p = NULL;
  if (cudaMalloc(&p, bytes ? bytes : 64) != cudaSuccess) {
    cudaGetLastError(); /* clear the error; the caller reports out of memory */
    return NULL;
  }
  CK(cudaMemset(p, 0, bytes ? bytes : 64));
  return p;
}
static void g_release(void *p) {
  if (p) cudaFree(p);
}
static void g_zero(void *p, size_t bytes) { CK(cudaMemsetAsync(p, 0, bytes, 0)); }
static void g_to_host(void *dst, const void *src, size_t b) {
  CK(cudaMemcpy(dst, src, b, cudaMemcpyDeviceToHost));
}
static void g_to_device(void *dst, const void *src, size_t b) {
  CK(cudaMemcpy(dst, src, b, cudaMemcpyHostToDevice));
}
static void g_set_threads(int) {}
static void g_sync(void) { CK(cudaDeviceSynchronize()); }

/* Marks on the compute stream (the legacy default stream every kernel here runs on): a
 * ring of events, created once, recorded in turn.  256 marks outlive any one step's
 * notifications (one per layer plus two), so a mark is never re-recorded while a backend
 * still orders a stream after it. */
#define MARKS 256
static cudaEvent_t marks[MARKS];
static unsigned next_mark;

static void *g_mark(void) {
  cudaEvent_t *e = &marks[next_mark++ % MARKS];
  if (!*e) CK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  CK(cudaEventRecord(*e, 0));
  return (void *)*e;
}

static int g_wait_mark(void *mark, char *err) {
  if (g_status(err) != 0) return -1;
  cudaError_t e = cudaEventSynchronize((cudaEvent_t)mark);
  if (e != cudaSuccess) {
    train_errf(err, "--device cuda: waiting for the compute stream: %s", cudaGetErrorString(e));
    return -1;
  }
  return 0;
}

/* ---- warp helpers ---------------------------------------------------------------- */

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* ---- encoder --------------------------------------------------------------------- */

/* out (B,T,C) = wte[inp] + wpe[t] */
__global__ void encoder_forward_k(float *out, const int *inp, const float *wte, const float *wpe,
                                  int B, int T, int C) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)B * T * C) return;
  size_t bt = i / C;
  int c = (int)(i % C), t = (int)(bt % T);
  out[i] = wte[(size_t)inp[bt] * C + c] + wpe[(size_t)t * C + c];
}
static void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                            int T, int C) {
  size_t n = (size_t)B * T * C;
  encoder_forward_k<<<blocks(n, 256), 256>>>(out, inp, wte, wpe, B, T, C);
}

/* dwte, dwpe += scatter of dout (B,T,C) */
__global__ void encoder_backward_k(float *dwte, float *dwpe, const float *dout, const int *inp,
                                   int B, int T, int C) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)B * T * C) return;
  size_t bt = i / C;
  int c = (int)(i % C), t = (int)(bt % T);
  atomicAdd(&dwte[(size_t)inp[bt] * C + c], dout[i]);
  atomicAdd(&dwpe[(size_t)t * C + c], dout[i]);
}
static void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                             int T, int C) {
  size_t n = (size_t)B * T * C;
  encoder_backward_k<<<blocks(n, 256), 256>>>(dwte, dwpe, dout, inp, B, T, C);
}

/* ---- layernorm: one warp per row -------------------------------------------------- */

__global__ void layernorm_forward_k(float *out, float *mean, float *rstd, const float *inp,
                                    const float *w, const float *b, int N, int C) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const float *x = inp + (size_t)row * C;
  float s = 0.0f;
  for (int i = lane; i < C; i += 32) s += x[i];
  float mu = warp_sum(s) / C;
  float v = 0.0f;
  for (int i = lane; i < C; i += 32) {
    float d = x[i] - mu;
    v += d * d;
  }
  float r = rsqrtf(warp_sum(v) / C + 1e-5f);
  float *o = out + (size_t)row * C;
  for (int i = lane; i < C; i += 32) o[i] = (x[i] - mu) * r * w[i] + b[i];
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = r;
  }
}
static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C) {
  layernorm_forward_k<<<blocks((size_t)N, 8), 256>>>(out, mean, rstd, inp, w, b, N, C);
}

__global__ void layernorm_backward_dinp_k(float *dinp, const float *dout, const float *inp,
                                          const float *w, const float *mean, const float *rstd,
                                          int N, int C) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const float *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
  float mu = mean[row], r = rstd[row], ds = 0.0f, dxs = 0.0f;
  for (int i = lane; i < C; i += 32) {
    float xhat = (x[i] - mu) * r, dxhat = w[i] * d[i];
    ds += dxhat;
    dxs += dxhat * xhat;
  }
  ds = warp_sum(ds) / C;
  dxs = warp_sum(dxs) / C;
  float *di = dinp + (size_t)row * C;
  for (int i = lane; i < C; i += 32) {
    float xhat = (x[i] - mu) * r, dxhat = w[i] * d[i];
    di[i] += r * (dxhat - ds - xhat * dxs);
  }
}

/* Column sums over a block of rows, added atomically: dw += sum (x-mu)*rstd*dout,
 * db += sum dout. With mean == NULL it is the plain column sum of dout into db. */
#define COLSUM_ROWS 256
__global__ void colsum_k(float *dw, float *db, const float *dout, const float *inp,
                         const float *mean, const float *rstd, int N, int C) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  int r0 = blockIdx.y * COLSUM_ROWS, r1 = min(N, r0 + COLSUM_ROWS);
  if (c >= C) return;
  float sw = 0.0f, sb = 0.0f;
  for (int n = r0; n < r1; n++) {
    float d = dout[(size_t)n * C + c];
    sb += d;
    if (mean) sw += (inp[(size_t)n * C + c] - mean[n]) * rstd[n] * d;
  }
  atomicAdd(&db[c], sb);
  if (mean) atomicAdd(&dw[c], sw);
}
static void colsum(float *dw, float *db, const float *dout, const float *inp, const float *mean,
                   const float *rstd, int N, int C) {
  dim3 grid(blocks((size_t)C, 128), blocks((size_t)N, COLSUM_ROWS));
  colsum_k<<<grid, 128>>>(dw, db, dout, inp, mean, rstd, N, C);
}

static void layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C) {
  layernorm_backward_dinp_k<<<blocks((size_t)N, 8), 256>>>(dinp, dout, inp, w, mean, rstd, N, C);
  colsum(dw, db, dout, inp, mean, rstd, N, C);
}

/* ---- matmul ---------------------------------------------------------------------- */

__global__ void add_bias_k(float *out, const float *b, size_t n, int OC) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] += b[i % OC];
}

/* out (N,OC) = inp (N,C) @ w (OC,C)^T + b */
static void matmul_forward(float *out, const float *inp, const float *w, const float *b, int N,
                           int C, int OC) {
  const float one = 1.0f, zero = 0.0f;
  CB(cublasSgemm(cublas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, w, C, inp, C, &zero, out, OC));
  if (b) {
    size_t n = (size_t)N * OC;
    add_bias_k<<<blocks(n, 256), 256>>>(out, b, n, OC);
  }
}

/* dinp (N,C) += dout @ w;  dw (OC,C) += dout^T @ inp;  db (OC) += column sums of dout */
static void matmul_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, int N, int C, int OC) {
  const float one = 1.0f;
  if (dinp)
    CB(cublasSgemm(cublas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, w, C, dout, OC, &one, dinp,
                   C));
  CB(cublasSgemm(cublas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout, OC, &one, dw, C));
  if (db) colsum(NULL, db, dout, NULL, NULL, NULL, N, OC);
}

/* ---- attention ------------------------------------------------------------------- */

/* causal softmax of each row of att (rows of length T), in place; zero above diagonal */
__global__ void causal_softmax_k(float *att, int rows, int T) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  int t = row % T;
  float *a = att + (size_t)row * T;
  float mx = -INFINITY;
  for (int u = lane; u <= t; u += 32) mx = fmaxf(mx, a[u]);
  mx = warp_max(mx);
  float s = 0.0f;
  for (int u = lane; u <= t; u += 32) {
    float e = expf(a[u] - mx);
    a[u] = e;
    s += e;
  }
  float inv = 1.0f / warp_sum(s);
  for (int u = lane; u < T; u += 32) a[u] = u <= t ? a[u] * inv : 0.0f;
}

/* da = a * (da - sum(a*da)) * scale on 0..t, 0 above */
__global__ void softmax_backward_k(float *da, const float *att, int rows, int T, float scale) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  int t = row % T;
  const float *a = att + (size_t)row * T;
  float *d = da + (size_t)row * T;
  float s = 0.0f;
  for (int u = lane; u <= t; u += 32) s += a[u] * d[u];
  s = warp_sum(s);
  for (int u = lane; u < T; u += 32) d[u] = u <= t ? a[u] * (d[u] - s) * scale : 0.0f;
}

/* qkv (B,T,3C) -> out (B,T,C); att (B,NH,T,T) */
static void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH) {
  int hs = C / NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs), one = 1.0f, zero = 0.0f;
  long long TT = (long long)T * T;
  for (int b = 0; b < B; b++) {
    const float *q = qkv + (size_t)b * T * C3, *k = q + C;
    float *a = att + (size_t)b * NH * TT;
    /* a[h] = scale * q[h] k[h]^T   (T,T) */
    CB(cublasSgemmStridedBatched(cublas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &scale, k, C3, hs, q,
                                 C3, hs, &zero, a, T, TT, NH));
  }
  int rows = B * NH * T;
  causal_softmax_k<<<blocks((size_t)rows, 8), 256>>>(att, rows, T);
  for (int b = 0; b < B; b++) {
    const float *v = qkv + (size_t)b * T * C3 + 2 * C;
    const float *a = att + (size_t)b * NH * TT;
    /* out[h] = a[h] v[h]   (T,hs), rows of stride C */
    CB(cublasSgemmStridedBatched(cublas, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &one, v, C3, hs, a, T,
                                 TT, &zero, out + (size_t)b * T * C, C, hs, NH));
  }
}

static void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH) {
  int hs = C / NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs), one = 1.0f, zero = 0.0f;
  long long TT = (long long)T * T;
  for (int b = 0; b < B; b++) {
    const float *v = qkv + (size_t)b * T * C3 + 2 * C;
    const float *a = att + (size_t)b * NH * TT;
    const float *dO = dout + (size_t)b * T * C;
    float *da = datt + (size_t)b * NH * TT;
    float *dv = dqkv + (size_t)b * T * C3 + 2 * C;
    /* da[h] = dO[h] v[h]^T   (T,T) */
    CB(cublasSgemmStridedBatched(cublas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &one, v, C3, hs, dO, C,
                                 hs, &zero, da, T, TT, NH));
    /* dv[h] += a[h]^T dO[h]   (T,hs) */
    CB(cublasSgemmStridedBatched(cublas, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, &one, dO, C, hs, a, T,
                                 TT, &one, dv, C3, hs, NH));
  }
  int rows = B * NH * T;
  softmax_backward_k<<<blocks((size_t)rows, 8), 256>>>(datt, att, rows, T, scale);
  for (int b = 0; b < B; b++) {
    const float *q = qkv + (size_t)b * T * C3, *k = q + C;
    const float *da = datt + (size_t)b * NH * TT;
    float *dq = dqkv + (size_t)b * T * C3, *dk = dq + C;
    /* dq[h] += dpre[h] k[h]   (T,hs) */
    CB(cublasSgemmStridedBatched(cublas, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &one, k, C3, hs, da, T,
                                 TT, &one, dq, C3, hs, NH));
    /* dk[h] += dpre[h]^T q[h]   (T,hs) */
    CB(cublasSgemmStridedBatched(cublas, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, &one, q, C3, hs, da, T,
                                 TT, &one, dk, C3, hs, NH));
  }
}

/* ---- elementwise ----------------------------------------------------------------- */

#define GELU_K 0.7978845608028654f

__global__ void gelu_forward_k(float *out, const float *inp, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = inp[i];
  out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
}
static void gelu_forward(float *out, const float *inp, size_t n) {
  gelu_forward_k<<<blocks(n, 256), 256>>>(out, inp, n);
}

__global__ void gelu_backward_k(float *dinp, const float *inp, const float *dout, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = inp[i];
  float th = tanhf(GELU_K * (x + 0.044715f * x * x * x));
  float g = 0.5f * (1.0f + th) +
            0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
  dinp[i] += g * dout[i];
}
static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
  gelu_backward_k<<<blocks(n, 256), 256>>>(dinp, inp, dout, n);
}

__global__ void residual_k(float *out, const float *a, const float *b, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
static void residual_forward(float *out, const float *a, const float *b, size_t n) {
  residual_k<<<blocks(n, 256), 256>>>(out, a, b, n);
}

/* ---- cross-entropy: one block per row --------------------------------------------- */

__device__ float block_reduce(float v, bool is_max) {
  __shared__ float sh[32];
  int lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
  v = is_max ? warp_max(v) : warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  float r = lane < nw ? sh[lane] : (is_max ? -INFINITY : 0.0f);
  return is_max ? warp_max(r) : warp_sum(r);
}

__global__ void crossentropy_forward_k(float *losses, float *probs, const float *logits,
                                       const int *targets, int N, int V) {
  int n = blockIdx.x;
  const float *l = logits + (size_t)n * V;
  float *p = probs + (size_t)n * V;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, l[i]);
  mx = block_reduce(mx, true);
  float s = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) s += expf(l[i] - mx);
  s = block_reduce(s, false);
  float inv = 1.0f / s;
  for (int i = threadIdx.x; i < V; i += blockDim.x) p[i] = expf(l[i] - mx) * inv;
  if (threadIdx.x == 0 && targets) losses[n] = logf(s) + mx - l[targets[n]];
}
static void crossentropy_forward(float *losses, float *probs, const float *logits,
                                 const int *targets, int N, int V) {
  crossentropy_forward_k<<<N, 256>>>(losses, probs, logits, targets, N, V);
}

__global__ void crossentropy_backward_k(float *dlogits, const float *probs, const int *targets,
                                        float dloss, int N, int V) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)N * V) return;
  int n = (int)(i / V), v = (int)(i % V);
  dlogits[i] += (probs[i] - (v == targets[n] ? 1.0f : 0.0f)) * dloss;
}
static void crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                                  float dloss, int N, int V) {
  size_t n = (size_t)N * V;
  crossentropy_backward_k<<<blocks(n, 256), 256>>>(dlogits, probs, targets, dloss, N, V);
}

/* ---- reductions, optimizer -------------------------------------------------------- */

static double g_sum(const float *x, size_t n) {
  float *h = (float *)malloc(n * sizeof(float));
  g_to_host(h, x, n * sizeof(float));
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += h[i];
  free(h);
  return s;
}

__global__ void sumsq_k(double *acc, const float *x, size_t n) {
  float s = 0.0f;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    s += x[i] * x[i];
  s = block_reduce(s, false);
  if (threadIdx.x == 0) atomicAdd(acc, (double)s);
}
static double g_sumsq(const float *x, size_t n) {
  CK(cudaMemsetAsync(d_acc, 0, sizeof(double), 0));
  int nb = blocks(n, 256);
  /* The grid in parentheses: clang-format 14 reads a bare `nb < ...` in <<< >>> as a template. */
  sumsq_k<<<(nb < 1024 ? (nb ? nb : 1) : 1024), 256>>>(d_acc, x, n);
  double h = 0.0;
  CK(cudaMemcpy(&h, d_acc, sizeof h, cudaMemcpyDeviceToHost));
  return h;
}

__global__ void scale_k(float *x, float s, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}
static void g_scale(float *x, float s, size_t n) { scale_k<<<blocks(n, 256), 256>>>(x, s, n); }

__global__ void adamw_k(float *p, const float *g, float *m, float *v, size_t n, float lr,
                        float beta1, float beta2, float eps, float wd, float bc1, float bc2) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float pi = wd != 0.0f ? p[i] * (1.0f - lr * wd) : p[i];
  float mi = m[i] * beta1 + (1.0f - beta1) * g[i];
  float vi = v[i] * beta2 + (1.0f - beta2) * g[i] * g[i];
  m[i] = mi;
  v[i] = vi;
  p[i] = pi - (lr / bc1) * (mi / (sqrtf(vi) / sqrtf(bc2) + eps));
}
static void g_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                    float beta2, float eps, float wd, float bc1, float bc2) {
  adamw_k<<<blocks(n, 256), 256>>>(p, g, m, v, n, lr, beta1, beta2, eps, wd, bc1, bc2);
}

static train_ops cuda_ops;

/* ---- entry points ------------------------------------------------------------------ */

static int cuda_init(char *err) {
  static int state = 0; /* 0 untried, 1 ok, -1 failed */
  static char why[TRAIN_ERRLEN];
  if (state == 1) return 0;
  if (state == -1) {
    train_errf(err, "%s", why);
    return -1;
  }
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    snprintf(why, sizeof why, "--device cuda: no usable CUDA GPU (%s)",
             e == cudaErrorInsufficientDriver
                 ? "no NVIDIA driver, or one older than this CUDA runtime"
             : e != cudaSuccess ? cudaGetErrorString(e)
                                : "no devices");
    state = -1;
    train_errf(err, "%s", why);
    return -1;
  }
  /* Each rank on its own GPU where there are several: local rank mod devices. */
  int dev = train_local_rank(0) % n;
  if ((e = cudaSetDevice(dev)) != cudaSuccess) {
    snprintf(why, sizeof why, "--device cuda: cudaSetDevice(%d): %s", dev, cudaGetErrorString(e));
    state = -1;
    train_errf(err, "%s", why);
    return -1;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  snprintf(device_name, sizeof device_name, "%s", prop.name);
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev);
  /* fp32 lanes per SM: 64 on sm_80 (A100), 128 on sm_86 and newer consumer/Hopper */
  int lanes = (prop.major == 8 && prop.minor == 0) ? 64 : prop.major >= 8 ? 128 : 64;
  peak_flops = 2.0 * lanes * prop.multiProcessorCount * (clock_khz * 1e3);
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) {
    snprintf(why, sizeof why, "--device cuda: cuBLAS could not be initialised on %s", device_name);
    state = -1;
    train_errf(err, "%s", why);
    return -1;
  }
  CB(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH)); /* fp32, no TF32 */
  CK(cudaMalloc(&d_acc, sizeof(double)));

  train_ops o;
  memset(&o, 0, sizeof o);
  o.name = "cuda";
  o.alloc = g_alloc;
  o.release = g_release;
  o.zero = g_zero;
  o.to_host = g_to_host;
  o.to_device = g_to_device;
  o.set_threads = g_set_threads;
  o.encoder_forward = encoder_forward;
  o.encoder_backward = encoder_backward;
  o.layernorm_forward = layernorm_forward;
  o.layernorm_backward = layernorm_backward;
  o.matmul_forward = matmul_forward;
  o.matmul_backward = matmul_backward;
  o.attention_forward = attention_forward;
  o.attention_backward = attention_backward;
  o.gelu_forward = gelu_forward;
  o.gelu_backward = gelu_backward;
  o.residual_forward = residual_forward;
  o.crossentropy_forward = crossentropy_forward;
  o.crossentropy_backward = crossentropy_backward;
  o.sum = g_sum;
  o.sumsq = g_sumsq;
  o.scale = g_scale;
  o.adamw = g_adamw;
  o.sync = g_sync;
  o.mark = g_mark;
  o.wait_mark = g_wait_mark;
  o.error = g_status;
  if (g_failed) { /* one of the CK/CB calls above */
    snprintf(why, sizeof why, "%s", g_error);
    state = -1;
    train_errf(err, "%s", why);
    return -1;
  }
  cuda_ops = o;
  state = 1;
  return 0;
}

extern "C" const train_ops *train_cuda_ops(char *err) {
  return cuda_init(err) == 0 ? &cuda_ops : NULL;
}

extern "C" const char *train_cuda_device_name(char *err) {
  return cuda_init(err) == 0 ? device_name : NULL;
}

extern "C" double train_cuda_peak_flops(void) { return peak_flops; }
