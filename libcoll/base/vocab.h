/* vocab.h — the words every layer shares: the kinds of collective, and the names and
 * sizes of collectives, dtypes and ops (the public ones, coll_dtype_size, coll_dtype_name
 * and coll_op_name, are declared in coll.h).  Defined here, at the bottom, so that no
 * layer has to call up to api/ or algo/ to print a sentence.
 *
 * Must never: hold state, or know anything of communicators, plans or transports.
 */
#ifndef COLL_VOCAB_H
#define COLL_VOCAB_H

#include "coll.h"

typedef enum {
  COLL_COLL_BROADCAST,
  COLL_COLL_REDUCE,
  COLL_COLL_ALL_REDUCE,
  COLL_COLL_REDUCE_SCATTER,
  COLL_COLL_ALL_GATHER,
  COLL_COLL_SEND,
  COLL_COLL_RECV,
  COLL_COLL_BARRIER,
  COLL_COLL_SENDRECV,
  COLL_COLL_ALL_TO_ALL,
  COLL_COLL_ALL_TO_ALLV,
  COLL_COLL_GATHER,
  COLL_COLL_SCATTER,
  COLL_COLL_GROUP_P2P /* every send/recv/sendrecv of one group on one communicator, as
                         one work ("group"; group.c builds it, its plan is below) */
} coll_coll_kind;
#define COLL_NUM_COLLS 14

/* "all_reduce", ... ("?" out of range). Inline, as coll_elem_bytes: asked on every call. */
static inline const char *coll_coll_name(coll_coll_kind c) {
  static const char *const names[] = {"broadcast",  "reduce",     "all_reduce",  "reduce_scatter",
                                      "all_gather", "send",       "recv",        "barrier",
                                      "sendrecv",   "all_to_all", "all_to_allv", "gather",
                                      "scatter",    "group"};
  return (unsigned)c < COLL_NUM_COLLS ? names[c] : "?";
}

/* Bytes of one element of d, 0 for an invalid dtype: coll_dtype_size (coll.h) for the
 * layers, inline because every call asks it on its way down. */
static inline size_t coll_elem_bytes(coll_dtype d) {
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

#endif
