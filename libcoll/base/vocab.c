/* vocab.c — the names and sizes of vocab.h and coll.h: collectives, dtypes, ops.
 *
 * The two that every call asks on its way down, the element size and the collective's
 * name, are inline in vocab.h (coll_elem_bytes, coll_coll_name): a call's path does not
 * come back to this file for a table lookup.
 *
 * Must never: hold state or call anything (every layer calls these).
 */
#include "vocab.h"

size_t coll_dtype_size(coll_dtype d) { return coll_elem_bytes(d); }

const char *coll_dtype_name(coll_dtype d) {
  static const char *names[] = {"int8",   "uint8",   "int32",    "uint32",  "int64",
                                "uint64", "float16", "bfloat16", "float32", "float64"};
  return (unsigned)d < COLL_NUM_DTYPES ? names[d] : NULL;
}

const char *coll_op_name(coll_op op) {
  static const char *names[] = {"sum", "prod", "min", "max", "avg"};
  return (unsigned)op < COLL_NUM_OPS ? names[op] : NULL;
}
