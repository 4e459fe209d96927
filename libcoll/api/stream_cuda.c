/* stream_cuda.c — the public face of streams that wrap a cudaStream_t (coll_cuda.h): a
 * stream of exec/stream.c with a CUDA part from cuda/cuda.c.
 *
 * Must never: exist in a build without CUDA (coll_cuda.h needs the CUDA runtime's
 * headers; its functions are then simply not there).
 */
#include "coll_config.h"
#if COLL_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "coll_cuda.h"
#include "cuda_internal.h"
#include "internal.h"

coll_result coll_stream_create_cuda(coll_stream_t *out, cudaStream_t cs) {
  if (!out)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_stream_create_cuda: stream pointer is NULL");
  *out = NULL;
  if (!coll_cuda_available())
    return coll_fail(NULL, COLL_ERR_UNSUPPORTED, "coll_stream_create_cuda: %s",
                     coll_cuda_unavailable_reason());
  struct coll_cuda_stream *x = NULL;
  coll_result r = coll_cuda_stream_new(&x, (void *)cs);
  if (r != COLL_OK) return r;
  if ((r = coll_stream_create(out)) != COLL_OK) {
    coll_cuda_stream_discard(x);
    return r;
  }
  (*out)->cuda = x;
  return COLL_OK;
}

coll_result coll_stream_get_cuda(coll_stream_t s, cudaStream_t *cs) {
  if (!s || !cs)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_stream_get_cuda: %s is NULL",
                     s ? "cs" : "stream");
  if (!s->cuda)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG,
                     "coll_stream_get_cuda: the stream was not made by coll_stream_create_cuda");
  *cs = (cudaStream_t)coll_cuda_stream_user(s);
  return COLL_OK;
}
#else
typedef int coll_no_cuda_streams; /* ISO C wants something in a translation unit */
#endif
