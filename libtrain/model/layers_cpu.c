/*
 * layers_cpu.c — the CPU back end: every layer of the model as a forward/backward pair.
 *
 * Matmuls (the Linear layers, the LM head and the two products inside attention) go to
 * the BLAS (OpenBLAS, row-major cblas_sgemm), which is where the threads are used
 * (--threads sets OpenBLAS's thread count). Everything else is plain single-threaded C
 * written so the compiler vectorises it: after the matmuls it is ~25% of a step, and
 * an OpenMP version was much slower on a shared machine (spinning barriers losing
 * their time slices). Reductions run in a fixed order, so results do not depend on the
 * thread count: reruns and resumes are bit-exact.
 *
 * Conventions (shared with layers_cuda.cu, listed in model.h): N = B*T rows,
 * row-major tensors, Linear weights stored (out, in) like torch.nn.Linear, and backward
 * kernels ACCUMULATE (+=) into their outputs.
 */
#include "model/model.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Hot element-wise loops get an AVX2 clone picked at load time (the default build
 * targets baseline x86-64, i.e. SSE2); same arithmetic, so same results. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* ---- memory ---------------------------------------------------------------------- */

/* Every block carries a 64-byte header saying how it was made. Large blocks come straight
 * from mmap: the kernel hands out zeroed pages and makes them resident only when touched,
 * so an array a parallel layer never uses (FSDP's gradients, ZeRO-3's blocks) costs no
 * memory; small ones come from the heap and are zeroed here. Alignment: 64 bytes. */
#define CPU_HDR 64
#define CPU_MMAP_MIN ((size_t)1 << 20)
#define CPU_MAGIC_HEAP 0x7261696e68656170ULL
#define CPU_MAGIC_MMAP 0x7261696e6d6d6170ULL

static void *cpu_alloc(size_t bytes) {
  size_t total = CPU_HDR + ((bytes + 63) & ~(size_t)63);
  uint64_t *h;
  if (total >= CPU_MMAP_MIN) {
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    h = p;
    h[0] = CPU_MAGIC_MMAP;
  } else {
    void *p = NULL;
    if (posix_memalign(&p, 64, total) != 0) return NULL;
    memset(p, 0, total);
    h = p;
    h[0] = CPU_MAGIC_HEAP;
  }
  h[1] = total;
  return (char *)h + CPU_HDR;
}
static void cpu_release(void *p) {
  if (!p) return;
  uint64_t *h = (uint64_t *)((char *)p - CPU_HDR);
  if (h[0] == CPU_MAGIC_MMAP)
    munmap(h, (size_t)h[1]);
  else
    free(h);
}
static void cpu_zero(void *p, size_t bytes) { memset(p, 0, bytes); }
static void cpu_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void cpu_sync(void) {}

static void cpu_set_threads(int threads) { openblas_set_num_threads(threads); }

/* ---- encoder: token + position embedding ----------------------------------------- */

/* inp is (B,T) token ids, wte is (V,C), wpe is (maxT,C), out is (B,T,C) */
static void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                            int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      float *o = out + ((size_t)b * T + t) * C;
      const float *we = wte + (size_t)inp[b * T + t] * C;
      const float *pe = wpe + (size_t)t * C;
      for (int i = 0; i < C; i++) o[i] = we[i] + pe[i];
    }
}

/* dout is (B,T,C); dwte (V,C) and dwpe (maxT,C) += scattered rows */
static void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                             int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float *d = dout + ((size_t)b * T + t) * C;
      float *dwe = dwte + (size_t)inp[b * T + t] * C;
      float *dpe = dwpe + (size_t)t * C;
      for (int i = 0; i < C; i++) {
        dwe[i] += d[i];
        dpe[i] += d[i];
      }
    }
}

/* ---- layernorm ------------------------------------------------------------------- */

/* inp, out are (N,C); w, b are (C); mean, rstd are (N) */
VECTOR_CLONES static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                            const float *w, const float *b, int N, int C) {
  const float eps = 1e-5f;
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    float *o = out + (size_t)n * C;
    float s = 0.0f;
    for (int i = 0; i < C; i++) s += x[i];
    float mu = s / C;
    float v = 0.0f;
    for (int i = 0; i < C; i++) {
      float d = x[i] - mu;
      v += d * d;
    }
    float r = 1.0f / sqrtf(v / C + eps);
    for (int i = 0; i < C; i++) o[i] = (x[i] - mu) * r * w[i] + b[i];
    mean[n] = mu;
    rstd[n] = r;
  }
}

/* dout, inp, dinp are (N,C); w, dw, db are (C); mean, rstd are (N) */
VECTOR_CLONES static void layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                             const float *inp, const float *w, const float *mean,
                                             const float *rstd, int N, int C) {
  /* dinp: one row per iteration */
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    const float *d = dout + (size_t)n * C;
    float *di = dinp + (size_t)n * C;
    float mu = mean[n], r = rstd[n];
    float dsum = 0.0f, dxsum = 0.0f;
    for (int i = 0; i < C; i++) {
      float xhat = (x[i] - mu) * r;
      float dxhat = w[i] * d[i];
      dsum += dxhat;
      dxsum += dxhat * xhat;
    }
    dsum /= C;
    dxsum /= C;
    for (int i = 0; i < C; i++) {
      float xhat = (x[i] - mu) * r;
      float dxhat = w[i] * d[i];
      di[i] += r * (dxhat - dsum - xhat * dxsum);
    }
  }
  /* dw, db: reduce over rows, a block of columns at a time (cache-friendly) */
  enum { CB = 64 };
  int nblk = (C + CB - 1) / CB;
  for (int blk = 0; blk < nblk; blk++) {
    int i0 = blk * CB, i1 = i0 + CB < C ? i0 + CB : C;
    float sw[CB], sb[CB];
    for (int i = 0; i < CB; i++) sw[i] = sb[i] = 0.0f;
    for (int n = 0; n < N; n++) {
      const float *x = inp + (size_t)n * C;
      const float *d = dout + (size_t)n * C;
      float mu = mean[n], r = rstd[n];
      for (int i = i0; i < i1; i++) {
        sw[i - i0] += (x[i] - mu) * r * d[i];
        sb[i - i0] += d[i];
      }
    }
    for (int i = i0; i < i1; i++) {
      dw[i] += sw[i - i0];
      db[i] += sb[i - i0];
    }
  }
}

/* ---- matmul (Linear) ------------------------------------------------------------- */

/* inp is (N,C), w is (OC,C), b is (OC) or NULL, out is (N,OC) */
static void matmul_forward(float *out, const float *inp, const float *w, const float *b, int N,
                           int C, int OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, 0.0f, out, OC);
  if (b) {
    for (int n = 0; n < N; n++) {
      float *o = out + (size_t)n * OC;
      for (int j = 0; j < OC; j++) o[j] += b[j];
    }
  }
}

/* dout is (N,OC): dinp (N,C) += dout @ w; dw (OC,C) += dout^T @ inp; db (OC) += colsum */
static void matmul_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, int N, int C, int OC) {
  if (dinp)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C, 1.0f,
                dinp, C);
  if (dw) /* NULL: the input gradient only (zero-bubble's B; its W computes dw later) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw,
                C);
  if (db) {
    enum { CB = 64 };
    int nblk = (OC + CB - 1) / CB;
    for (int blk = 0; blk < nblk; blk++) {
      int j0 = blk * CB, j1 = j0 + CB < OC ? j0 + CB : OC;
      float s[CB];
      for (int j = 0; j < CB; j++) s[j] = 0.0f;
      for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t)n * OC;
        for (int j = j0; j < j1; j++) s[j - j0] += d[j];
      }
      for (int j = j0; j < j1; j++) db[j] += s[j - j0];
    }
  }
}

/* ---- causal self-attention -------------------------------------------------------- */

/*
 * qkv is (B,T,3C) holding q | k | v for each token, heads interleaved inside each third
 * (head h uses channels h*hs .. h*hs+hs-1). att is (B,NH,T,T): the softmax probabilities,
 * zero above the diagonal. out is (B,T,C).
 *   att = softmax(mask(q k^T / sqrt(hs)));  out = att v
 */
static void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH) {
  int hs = C / NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *q = qkv + (size_t)b * T * C3 + h * hs;
      float *a = att + ((size_t)b * NH + h) * T * T;
      /* the gemm also fills the masked upper triangle; the softmax zeroes it */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, q + C, C3, 0.0f,
                  a, T);
      for (int t = 0; t < T; t++) {
        float *row = a + (size_t)t * T;
        float mx = row[0];
        for (int u = 1; u <= t; u++) mx = row[u] > mx ? row[u] : mx;
        float s = 0.0f;
        for (int u = 0; u <= t; u++) {
          row[u] = expf(row[u] - mx);
          s += row[u];
        }
        float inv = 1.0f / s;
        for (int u = 0; u <= t; u++) row[u] *= inv;
        for (int u = t + 1; u < T; u++) row[u] = 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, q + 2 * C, C3,
                  0.0f, out + (size_t)b * T * C + h * hs, C);
    }
}

/* dout is (B,T,C); dqkv (B,T,3C) +=; datt (B,NH,T,T) is scratch */
static void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH) {
  int hs = C / NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *q = qkv + (size_t)b * T * C3 + h * hs;
      const float *k = q + C, *v = q + 2 * C;
      float *dq = dqkv + (size_t)b * T * C3 + h * hs;
      float *dk = dq + C, *dv = dq + 2 * C;
      const float *a = att + ((size_t)b * NH + h) * T * T;
      float *da = datt + ((size_t)b * NH + h) * T * T;
      const float *dO = dout + (size_t)b * T * C + h * hs;
      /* out = a v:  da = dO v^T;  dv += a^T dO */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dO, C, v, C3, 0.0f, da,
                  T);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, dO, C, 1.0f, dv,
                  C3);
      /* softmax backward, in place: dpre = a * (da - sum(a * da)) * scale */
      for (int t = 0; t < T; t++) {
        const float *ar = a + (size_t)t * T;
        float *dr = da + (size_t)t * T;
        float s = 0.0f;
        for (int u = 0; u <= t; u++) s += ar[u] * dr[u];
        for (int u = 0; u <= t; u++) dr[u] = ar[u] * (dr[u] - s) * scale;
        for (int u = t + 1; u < T; u++) dr[u] = 0.0f;
      }
      /* pre = q k^T:  dq += dpre k;  dk += dpre^T q */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, da, T, k, C3, 1.0f, dq,
                  C3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, da, T, q, C3, 1.0f, dk,
                  C3);
    }
}

/* ---- GELU (tanh approximation, as GPT-2) ----------------------------------------- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* tanh through exp(-2|u|) with exp done in plain arithmetic (round-to-nearest by the
 * 1.5*2^23 trick, Cody-Waite reduction, degree-6 Taylor polynomial, exponent built from
 * bits), so the GELU loops vectorise; glibc's scalar tanhf was 40% of a training step.
 * Absolute error < 2e-7 against tanh in double, which is what 1 + tanh needs. */
static inline float tanh_fast(float u) {
  float a = fabsf(u) * -2.0f;
  a = a < -87.0f ? -87.0f : a;
  float k = (a * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(a/ln2) */
  float r = (a - k * 0.693145751953125f) - k * 1.42860682030941723e-6f;
  float p = 1.0f +
            r * (1.0f + r * (0.5f + r * (1.0f / 6 +
                                         r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
  int32_t bits = ((int32_t)k + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  float e = p * scale; /* exp(-2|u|) in (0, 1] */
  float t = (1.0f - e) / (1.0f + e);
  return copysignf(t, u);
}

/* inp, out are (n) */
VECTOR_CLONES static void gelu_forward(float *out, const float *inp, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float u = GELU_K * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanh_fast(u));
  }
}

/* dinp (n) += gelu'(inp) * dout */
VECTOR_CLONES static void gelu_backward(float *dinp, const float *inp, const float *dout,
                                        size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float u = GELU_K * (x + 0.044715f * x * x * x);
    float th = tanh_fast(u);
    float sech2 = 1.0f - th * th;
    float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += g * dout[i];
  }
}

/* ---- residual -------------------------------------------------------------------- */

/* a, b, out are (n) */
static void residual_forward(float *out, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* ---- softmax cross-entropy --------------------------------------------------------- */

/* logits, probs are (N,V); targets, losses are (N) */
/* probs may be logits (in place: the target's logit is read first) */
static void crossentropy_forward(float *losses, float *probs, const float *logits,
                                 const int *targets, int N, int V) {
  for (int n = 0; n < N; n++) {
    const float *l = logits + (size_t)n * V;
    float *p = probs + (size_t)n * V;
    float lt = targets ? l[targets[n]] : 0.0f;
    float mx = l[0];
    for (int i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    float s = 0.0f;
    for (int i = 0; i < V; i++) {
      p[i] = expf(l[i] - mx);
      s += p[i];
    }
    float inv = 1.0f / s;
    for (int i = 0; i < V; i++) p[i] *= inv;
    if (targets) /* log-sum-exp form: accurate even when p[target] underflows */
      losses[n] = logf(s) + mx - lt;
  }
}

/* dlogits (N,V) += (probs - onehot(targets)) * dloss */
static void crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                                  float dloss, int N, int V) {
  for (int n = 0; n < N; n++) {
    const float *p = probs + (size_t)n * V;
    float *d = dlogits + (size_t)n * V;
    for (int i = 0; i < V; i++) d[i] += p[i] * dloss;
    d[targets[n]] -= dloss;
  }
}

/* ---- reductions and the optimizer ------------------------------------------------- */

static double cpu_sum(const float *x, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += x[i];
  return s;
}

static double cpu_sumsq(const float *x, size_t n) {
  /* fixed-size blocks summed in float, the block sums in double */
  enum { BLK = 4096 };
  size_t nblk = (n + BLK - 1) / BLK;
  double *part = malloc((nblk ? nblk : 1) * sizeof *part);
  for (size_t k = 0; k < nblk; k++) {
    size_t i0 = k * BLK, i1 = i0 + BLK < n ? i0 + BLK : n;
    float s = 0.0f;
    for (size_t i = i0; i < i1; i++) s += x[i] * x[i];
    part[k] = s;
  }
  double s = 0.0;
  for (size_t k = 0; k < nblk; k++) s += part[k];
  free(part);
  return s;
}

static void cpu_scale(float *x, float s, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* AdamW, in the same order of operations as torch.optim.AdamW (PyTorch 1.13):
 *   p *= 1 - lr*wd   (wd = 0 for tensors without decay)
 *   m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g*g
 *   p -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps),   bc_i = 1 - beta_i^t */
VECTOR_CLONES static void cpu_adamw(float *p, const float *g, float *m, float *v, size_t n,
                                    float lr, float beta1, float beta2, float eps, float wd,
                                    float bc1, float bc2) {
  float step = lr / bc1, bc2s = sqrtf(bc2), keep = 1.0f - lr * wd;
  for (size_t i = 0; i < n; i++) {
    float pi = wd != 0.0f ? p[i] * keep : p[i];
    float mi = m[i] * beta1 + (1.0f - beta1) * g[i];
    float vi = v[i] * beta2 + (1.0f - beta2) * g[i] * g[i];
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step * (mi / (sqrtf(vi) / bc2s + eps));
  }
}

/* bfloat16: the top half of a float32. To bf16 rounds to nearest, ties to even (a NaN
 * stays a NaN: its quiet bit is set so the rounding cannot carry it into infinity); from
 * bf16 is exact. */
static inline uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static inline float bf2f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static void cpu_to_bf16(uint16_t *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = f2bf(src[i]);
}

static void cpu_from_bf16(float *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = bf2f(src[i]);
}

/* as cpu_sumsq, the blocks widened to float */
static double cpu_sumsq_bf16(const uint16_t *x, size_t n) {
  enum { BLK = 4096 };
  double s = 0.0;
  for (size_t i0 = 0; i0 < n; i0 += BLK) {
    size_t i1 = i0 + BLK < n ? i0 + BLK : n;
    float b = 0.0f;
    for (size_t i = i0; i < i1; i++) b += bf2f(x[i]) * bf2f(x[i]);
    s += b;
  }
  return s;
}

static void cpu_scale_bf16(uint16_t *x, float s, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = f2bf(bf2f(x[i]) * s);
}

/* AdamW on fp32 master weights p from bf16 gradients g (cpu_adamw's arithmetic), then the
 * bf16 copy p16 the passes read: round(p). */
static void cpu_adamw_bf16(float *p, uint16_t *p16, const uint16_t *g, float *m, float *v, size_t n,
                           float lr, float beta1, float beta2, float eps, float wd, float bc1,
                           float bc2) {
  float step = lr / bc1, bc2s = sqrtf(bc2), keep = 1.0f - lr * wd;
  for (size_t i = 0; i < n; i++) {
    float gi = bf2f(g[i]);
    float pi = wd != 0.0f ? p[i] * keep : p[i];
    float mi = m[i] * beta1 + (1.0f - beta1) * gi;
    float vi = v[i] * beta2 + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step * (mi / (sqrtf(vi) / bc2s + eps));
    p16[i] = f2bf(p[i]);
  }
}

static const train_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .release = cpu_release,
    .zero = cpu_zero,
    .to_host = cpu_copy,
    .to_device = cpu_copy,
    .set_threads = cpu_set_threads,
    .encoder_forward = encoder_forward,
    .encoder_backward = encoder_backward,
    .layernorm_forward = layernorm_forward,
    .layernorm_backward = layernorm_backward,
    .matmul_forward = matmul_forward,
    .matmul_backward = matmul_backward,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .gelu_forward = gelu_forward,
    .gelu_backward = gelu_backward,
    .residual_forward = residual_forward,
    .crossentropy_forward = crossentropy_forward,
    .crossentropy_backward = crossentropy_backward,
    .sum = cpu_sum,
    .sumsq = cpu_sumsq,
    .scale = cpu_scale,
    .adamw = cpu_adamw,
    .to_bf16 = cpu_to_bf16,
    .from_bf16 = cpu_from_bf16,
    .sumsq_bf16 = cpu_sumsq_bf16,
    .scale_bf16 = cpu_scale_bf16,
    .adamw_bf16 = cpu_adamw_bf16,
    .sync = cpu_sync,
};

const train_ops *train_cpu_ops(void) { return &cpu_ops; }
