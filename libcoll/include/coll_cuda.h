/* coll_cuda.h — libcoll on CUDA device buffers: streams that wrap a cudaStream_t.
 *
 * Every collective of coll.h accepts device buffers (memory from cudaMalloc on the GPU
 * that was current when the communicator was built) when libcoll finds a CUDA runtime
 * and a GPU at run time; both buffers of a call must be on that GPU.  With a NULL
 * stream such a call blocks until the result is in place, and starts after the work
 * enqueued before it on the legacy default stream (stream 0: cudaMemcpy, and kernels
 * launched without a stream), as NCCL's calls on stream 0 do; work on other streams
 * must be synchronised first.
 *
 * To order collectives with GPU work, wrap the cudaStream_t in a coll_stream_t and pass
 * it to the collective, like NCCL's stream argument:
 *
 *     coll_stream_t s;  coll_stream_create_cuda(&s, cs);
 *     my_kernel<<<g, b, 0, cs>>>(grad);                 // produces grad
 *     coll_all_reduce(grad, grad, n, COLL_FLOAT32, COLL_SUM, comm, s);  // returns at once
 *     my_update<<<g, b, 0, cs>>>(grad);                 // runs after the all-reduce
 *     cudaStreamSynchronize(cs);  // or coll_stream_synchronize(s), which also reports errors
 *
 * The collective starts after the work enqueued on `cs` before it, and work enqueued
 * on `cs` after it starts after it finishes.  Errors are reported by
 * coll_stream_synchronize / coll_stream_query, as for host streams; a collective that
 * fails still releases `cs`.  coll_stream_destroy synchronizes the stream (both).
 *
 * This header needs the CUDA runtime headers; coll.h does not.
 */
#ifndef COLL_CUDA_H
#define COLL_CUDA_H

#include <cuda_runtime_api.h>

#include "coll.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A stream whose collectives are ordered with `cs` (0 = the legacy default stream).
 * COLL_ERR_UNSUPPORTED (with the reason) when no CUDA driver or GPU is usable. */
COLL_API coll_result coll_stream_create_cuda(coll_stream_t *s, cudaStream_t cs);
/* The cudaStream_t a stream wraps; COLL_ERR_INVALID_ARG for a host stream. */
COLL_API coll_result coll_stream_get_cuda(coll_stream_t s, cudaStream_t *cs);

#ifdef __cplusplus
}
#endif
#endif
