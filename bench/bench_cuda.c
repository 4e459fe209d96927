/* bench_cuda.c — see bench_cuda.h.  The only file of coll-bench that calls CUDA. */
#include "bench_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll_config.h"

#if COLL_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "coll_cuda.h"

#define FAIL(e, what)                                                                        \
  do {                                                                                       \
    snprintf(why, why_len, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e)); \
    return -1;                                                                               \
  } while (0)

int bench_cuda_probe(int *ndev, char *name, size_t name_len, char *why, size_t why_len) {
  int fds[2];
  if (pipe(fds) != 0) {
    snprintf(why, why_len, "pipe failed");
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(why, why_len, "fork failed");
    return -1;
  }
  if (pid == 0) {
    close(fds[0]);
    char msg[320];
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    struct cudaDeviceProp prop;
    if (e == cudaSuccess && n > 0) e = cudaGetDeviceProperties(&prop, 0);
    if (e != cudaSuccess)
      snprintf(msg, sizeof msg, "0\n%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    else if (n == 0)
      snprintf(msg, sizeof msg, "0\nthe CUDA driver sees no GPU");
    else
      snprintf(msg, sizeof msg, "%d\n%s", n, prop.name);
    ssize_t w = write(fds[1], msg, strlen(msg) + 1);
    _exit(w > 0 ? 0 : 1);
  }
  close(fds[1]);
  char msg[320] = {0};
  size_t got = 0;
  ssize_t r;
  while (got < sizeof msg - 1 && (r = read(fds[0], msg + got, sizeof msg - 1 - got)) > 0)
    got += (size_t)r;
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  char *nl = strchr(msg, '\n');
  *ndev = nl ? atoi(msg) : 0;
  if (*ndev <= 0) {
    snprintf(why, why_len, "no usable GPU: %s", nl ? nl + 1 : "the probe process failed");
    return -1;
  }
  snprintf(name, name_len, "%s", nl + 1);
  return 0;
}

int bench_cuda_bind(int rank, int *dev, char *why, size_t why_len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) FAIL(e, "cudaGetDeviceCount");
  if (n < 1) {
    snprintf(why, why_len, "no GPU");
    return -1;
  }
  *dev = rank % n;
  if ((e = cudaSetDevice(*dev)) != cudaSuccess) FAIL(e, "cudaSetDevice");
  return 0;
}

int bench_cuda_alloc(void **p, size_t bytes, char *why, size_t why_len) {
  cudaError_t e = cudaMalloc(p, bytes);
  if (e != cudaSuccess) FAIL(e, "cudaMalloc");
  if ((e = cudaMemset(*p, 0, bytes)) != cudaSuccess) FAIL(e, "cudaMemset");
  return 0;
}

void bench_cuda_free(void *p) {
  if (p) cudaFree(p);
}

int bench_cuda_copy(void *dst, const void *src, size_t bytes, char *why, size_t why_len) {
  cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  if (e != cudaSuccess) FAIL(e, "cudaMemcpy");
  return 0;
}

int bench_cuda_stream(coll_stream_t *s, char *why, size_t why_len) {
  cudaStream_t cs;
  cudaError_t e = cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
  if (e != cudaSuccess) FAIL(e, "cudaStreamCreate");
  coll_result r = coll_stream_create_cuda(s, cs);
  if (r != COLL_OK) {
    snprintf(why, why_len, "coll_stream_create_cuda: %s", coll_comm_last_error(NULL));
    cudaStreamDestroy(cs);
    return -1;
  }
  return 0;
}

void bench_cuda_stream_destroy(coll_stream_t s) {
  cudaStream_t cs = 0;
  if (!s) return;
  coll_result r = coll_stream_get_cuda(s, &cs);
  coll_stream_destroy(s);
  if (r == COLL_OK) cudaStreamDestroy(cs);
}

double bench_cuda_copy_gbps(size_t bytes) {
  void *a = NULL, *b = NULL;
  cudaEvent_t t0 = NULL, t1 = NULL;
  double best = 0;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) goto out;
  if (cudaEventCreate(&t0) != cudaSuccess || cudaEventCreate(&t1) != cudaSuccess) goto out;
  cudaMemset(a, 1, bytes);
  for (int i = 0; i < 6; i++) {
    float ms = 0;
    cudaEventRecord(t0, 0);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0);
    cudaEventRecord(t1, 0);
    if (cudaEventSynchronize(t1) != cudaSuccess) goto out;
    cudaEventElapsedTime(&ms, t0, t1);
    double gbps = ms > 0 ? (double)bytes / (ms * 1e-3) / 1e9 : 0;
    if (i > 0 && gbps > best) best = gbps; /* the first run warms up */
  }
out:
  if (t0) cudaEventDestroy(t0);
  if (t1) cudaEventDestroy(t1);
  if (a) cudaFree(a);
  if (b) cudaFree(b);
  cudaGetLastError();
  return best;
}

#else /* no CUDA in this build */

#define NO_CUDA                                                                \
  snprintf(why, why_len,                                                       \
           "this build of coll-bench has no CUDA support (nvcc was not found " \
           "when it was configured)");                                         \
  return -1

int bench_cuda_probe(int *ndev, char *name, size_t name_len, char *why, size_t why_len) {
  (void)name, (void)name_len;
  *ndev = 0;
  NO_CUDA;
}
int bench_cuda_bind(int rank, int *dev, char *why, size_t why_len) {
  (void)rank, (void)dev;
  NO_CUDA;
}
int bench_cuda_alloc(void **p, size_t bytes, char *why, size_t why_len) {
  (void)p, (void)bytes;
  NO_CUDA;
}
void bench_cuda_free(void *p) { (void)p; }
int bench_cuda_copy(void *dst, const void *src, size_t bytes, char *why, size_t why_len) {
  (void)dst, (void)src, (void)bytes;
  NO_CUDA;
}
int bench_cuda_stream(coll_stream_t *s, char *why, size_t why_len) {
  (void)s;
  NO_CUDA;
}
void bench_cuda_stream_destroy(coll_stream_t s) { (void)s; }
double bench_cuda_copy_gbps(size_t bytes) {
  (void)bytes;
  return 0;
}
#endif
