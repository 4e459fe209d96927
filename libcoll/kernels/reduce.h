/* reduce.h — the reduction kernels: the only code in libcoll that knows dtypes.
 *
 * Each kernel computes dst[i] = a[i] OP b[i] for i < n, element by element, with dst
 * allowed to alias a or b exactly (never partially).  It must never allocate, lock or
 * make a system call: it runs on the hot path of every reducing collective.
 *
 * COLL_AVG reduces as COLL_SUM; the algorithm then calls coll_kernel_avg once on the
 * fully reduced data (sum / nranks; integer types truncate toward zero, as C does).
 * Half types (float16, bfloat16) are widened to float, combined, and rounded back to
 * nearest-even after every operation, so every hop of a ring rounds exactly once.
 * Integer sums and products wrap (computed in the unsigned type, so no UB).
 * min/max on floats: if either operand is NaN the result is NaN (like fmin/fmax's
 * opposite: NaN propagates so a bad gradient is never silently dropped).
 */
#ifndef COLL_REDUCE_H
#define COLL_REDUCE_H

#include <stddef.h>
#include <stdint.h>
#include "coll.h"

/* dst = a OP b over n elements (COLL_AVG behaves as COLL_SUM here). */
void coll_kernel_reduce(void *dst, const void *a, const void *b, size_t n, coll_dtype dtype,
                        coll_op op);
/* buf[i] = buf[i] / nranks in place: the last step of COLL_AVG. */
void coll_kernel_avg(void *buf, size_t n, coll_dtype dtype, int nranks);

/* IEEE binary16 and bfloat16 conversions, round to nearest even, NaN kept NaN. */
float coll_half_to_float(uint16_t h);
uint16_t coll_float_to_half(float f);
float coll_bf16_to_float(uint16_t h);
uint16_t coll_float_to_bf16(float f);

#endif
