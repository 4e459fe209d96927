/* vocab.c — the names and sizes of vocab.h and coll.h: collectives, dtypes, ops.
 *
 * Must never: hold state or call anything (every layer calls these).
 */
#include "vocab.h"

size_t coll_dtype_size(coll_dtype d) {
  switch (d) {
  case COLL_INT8:
  case COLL_UINT8: return 1;
  case COLL_FLOAT16:
  case COLL_BFLOAT16: return 2;
  case COLL_INT32:
  case COLL_UINT32:
  case COLL_FLOAT32: return 4;
  case COLL_INT64:
  case COLL_UINT64:
  case COLL_FLOAT64: return 8;
  }
  return 0;
}

const char *coll_dtype_name(coll_dtype d) {
  static const char *names[] = {"int8",   "uint8",   "int32",    "uint32",  "int64",
                                "uint64", "float16", "bfloat16", "float32", "float64"};
  return (unsigned)d < COLL_NUM_DTYPES ? names[d] : NULL;
}

const char *coll_op_name(coll_op op) {
  static const char *names[] = {"sum", "prod", "min", "max", "avg"};
  return (unsigned)op < COLL_NUM_OPS ? names[op] : NULL;
}

const char *coll_coll_name(coll_coll_kind c) {
  static const char *names[] = {"broadcast",  "reduce",     "all_reduce",  "reduce_scatter",
                                "all_gather", "send",       "recv",        "barrier",
                                "sendrecv",   "all_to_all", "all_to_allv", "gather",
                                "scatter",    "group"};
  return (unsigned)c < COLL_NUM_COLLS ? names[c] : "?";
}
