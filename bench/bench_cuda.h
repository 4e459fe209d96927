/* bench_cuda.h — what coll-bench needs of CUDA for --device cuda: a GPU probe that keeps
 * the parent process CUDA-free (it forks ranks afterwards), binding a rank to a GPU,
 * device buffers staged through the host buffers, a coll_stream_t wrapping a
 * cudaStream_t, and the device's own copy bandwidth (the ceiling for busbw).
 *
 * Every function returns 0 on success, or -1 with a sentence in `why`.  In a build
 * without CUDA they all fail and say so.  Must never be called in a process that will
 * fork ranks later, except bench_cuda_probe (which asks a child).
 */
#ifndef BENCH_CUDA_H
#define BENCH_CUDA_H

#include <stddef.h>

#include "coll.h"

/* Forks a child that counts the GPUs; fills *ndev and the device name of GPU 0. */
int bench_cuda_probe(int *ndev, char *name, size_t name_len, char *why, size_t why_len);
/* cudaSetDevice(rank % device count); *dev gets the ordinal. */
int bench_cuda_bind(int rank, int *dev, char *why, size_t why_len);
int bench_cuda_alloc(void **p, size_t bytes, char *why, size_t why_len);
void bench_cuda_free(void *p);
int bench_cuda_copy(void *dst, const void *src, size_t bytes, char *why, size_t why_len);
/* A coll_stream_t over a new non-blocking cudaStream_t; bench_cuda_stream_destroy frees both. */
int bench_cuda_stream(coll_stream_t *s, char *why, size_t why_len);
void bench_cuda_stream_destroy(coll_stream_t s);
/* Device-to-device cudaMemcpy bandwidth in GB/s (read + write of `bytes` counted once,
 * as busbw counts bytes), best of a few runs. */
double bench_cuda_copy_gbps(size_t bytes);

#endif
