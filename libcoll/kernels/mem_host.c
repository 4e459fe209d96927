/* mem_host.c — coll_mem_host, the memory-ops table (mem_ops.h) of host buffers: what
 * the executor runs host slices through (its large-call paths that stream into the
 * user's buffer call copy.c and reduce.c themselves).
 *
 * copy is memcpy, reduce and avg are reduce.c's kernels, fence does nothing: the
 * transport's publish of a slot (a release store, or a send) already orders this
 * thread's stores before the peer can see them.  It sits beside the kernels it calls,
 * so a host slice goes from the executor down to here and on down to reduce.c without
 * passing through the cuda layer.
 *
 * Must never: allocate, lock, make a system call or fail (every op returns COLL_OK): it
 * runs on the hot path of every collective; or know about device memory (cuda.c has
 * the device table).
 */
#include <string.h>

#include "mem_ops.h"
#include "reduce.h"

static coll_result host_copy(struct coll_comm *c, void *dst, const void *src, size_t bytes) {
  (void)c;
  memcpy(dst, src, bytes);
  return COLL_OK;
}
static coll_result host_reduce(struct coll_comm *c, void *dst, const void *a, const void *b,
                               size_t n, coll_dtype dtype, coll_op op) {
  (void)c;
  coll_kernel_reduce(dst, a, b, n, dtype, op);
  return COLL_OK;
}
static coll_result host_avg(struct coll_comm *c, void *buf, size_t n, coll_dtype dtype,
                            int nranks) {
  (void)c;
  coll_kernel_avg(buf, n, dtype, nranks);
  return COLL_OK;
}
static coll_result host_fence(struct coll_comm *c) {
  (void)c;
  return COLL_OK;
}

const coll_mem_ops coll_mem_host = {
    .name = "host", .copy = host_copy, .reduce = host_reduce, .avg = host_avg, .fence = host_fence};
