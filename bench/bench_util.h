/* bench_util.h — the pure parts of coll-bench: no communicator, no I/O.
 *
 * coll-bench.c drives processes, clocks and output; everything here is arithmetic that
 * can be unit-tested in one process (test/tools/test_bench.c compiles bench_util.c in):
 *
 *   - parsing what the user typed: sizes with K/M/G suffixes, dtype and op names with
 *     the nccl-tests aliases, collective names;
 *   - the nccl-tests byte and bandwidth conventions: how a size in bytes becomes element
 *     counts and buffer sizes for each collective, and the bus-bandwidth factor;
 *   - the data the benchmark feeds in and the exact result it expects back.  Inputs are
 *     small non-negative integers chosen per (collective, dtype, op, nranks) so that
 *     every partial result of any reduction order is exactly representable, even in
 *     int8 and bfloat16: the expected output is then one exact number per element.
 */
#ifndef COLL_BENCH_UTIL_H
#define COLL_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coll.h"

typedef enum {
  BENCH_ALL_REDUCE,
  BENCH_ALL_GATHER,
  BENCH_REDUCE_SCATTER,
  BENCH_BROADCAST,
  BENCH_REDUCE,
  BENCH_SENDRECV,
  BENCH_ALL_TO_ALL,
  BENCH_GATHER,
  BENCH_SCATTER,
  BENCH_NUM_COLLS
} bench_coll;

/* ---- names ------------------------------------------------------------------------- */

/* "all_reduce", ... */
const char *bench_coll_name(bench_coll c);
/* Parses a collective name (also "allreduce", "allgather", "reducescatter", "bcast").
 * Returns the collective, -1 for "all", -2 if unknown. */
int bench_parse_coll(const char *s);
/* "int8" ... "float64" (the names coll-bench prints); NULL when out of range. */
const char *bench_dtype_name(coll_dtype t);
/* Parses a dtype name or nccl-tests alias (char, int, half, float, double, bf16, ...).
 * Returns the dtype, -1 for "all", -2 if unknown. */
int bench_parse_dtype(const char *s);
const char *bench_op_name(coll_op op);
/* Returns the op, -1 for "all", -2 if unknown. */
int bench_parse_op(const char *s);
size_t bench_dtype_size(coll_dtype t);

/* Parses "4096", "8K", "64M", "1G" (binary multiples; an optional trailing "B" or "iB"
 * is accepted, case does not matter).  False on anything else, including overflow. */
bool bench_parse_size(const char *s, size_t *out);
/* Parses a non-negative decimal integer no larger than max. */
bool bench_parse_uint(const char *s, unsigned long max, unsigned long *out);

/* ---- nccl-tests conventions ----------------------------------------------------------- */

/* Whether the collective takes a reduction op / a root. */
bool bench_coll_reduces(bench_coll c);
bool bench_coll_rooted(bench_coll c);

typedef struct {
  size_t count;      /* the count argument passed to the API (per rank, in elements) */
  size_t bytes;      /* the size the table prints: nccl-tests' "size" */
  size_t send_elems; /* elements in this rank's input buffer */
  size_t recv_elems; /* elements in this rank's output buffer */
} bench_shape;

/* From a requested size in bytes: all_reduce, broadcast, reduce and sendrecv send
 * size/typesize elements per rank; all_gather, reduce_scatter, gather and scatter treat
 * the size as the whole gathered/scattered buffer, and all_to_all as one rank's whole
 * send (and receive) buffer, so each rank's part (block) is size/typesize/nranks
 * elements.  The printed size is rounded down to what is actually moved. */
bench_shape bench_shape_for(bench_coll c, size_t bytes, size_t typesize, int nranks);
/* busbw = algbw * factor: 2(n-1)/n for all_reduce, (n-1)/n for all_gather,
 * reduce_scatter, all_to_all, gather and scatter, 1 for broadcast, reduce and sendrecv. */
double bench_bus_factor(bench_coll c, int nranks);
/* GB/s (1e9 bytes per second) for `bytes` moved in `time_us` microseconds; 0 if time
 * is not positive. */
double bench_algbw(size_t bytes, double time_us);
/* The time column exactly as nccl-tests formats it (7 characters wide). */
void bench_format_time(double us, char *buf, size_t len);

/* The value at fraction q (0..1) of n sorted numbers (nearest rank). */
double bench_percentile(const double *sorted, size_t n, double q);

/* ---- data: inputs and expected outputs ----------------------------------------------- */

typedef struct {
  bench_coll coll;
  coll_dtype dtype;
  coll_op op; /* ignored by collectives that do not reduce */
  int nranks;
  int root;
} bench_data;

/* The value rank `rank` feeds at index `idx` of its input buffer (idx < send_elems). */
double bench_input_value(const bench_data *d, int rank, size_t idx);
/* The exact value expected at index `idx` of rank `rank`'s output buffer. */
double bench_expected_value(const bench_data *d, int rank, size_t count, size_t idx);
/* Whether rank `rank`'s output is defined (reduce, gather: only at the root). */
bool bench_output_checked(const bench_data *d, int rank);

/* Element access by dtype (the value is converted exactly when representable; half types
 * round to nearest even). */
void bench_store(coll_dtype t, void *buf, size_t idx, double v);
double bench_load(coll_dtype t, const void *buf, size_t idx);
/* Writes bytes that can never equal an expected value (all ones: NaN or a negative / the
 * largest integer). */
void bench_poison(void *buf, size_t bytes);

/* Fills `n` input elements of `rank` starting at input index `first`. */
void bench_fill_input(const bench_data *d, int rank, void *buf, size_t first, size_t n);

typedef struct {
  uint64_t wrong;
  size_t first_index; /* valid when wrong > 0 */
  double first_expected, first_got;
} bench_check_result;

/* Compares rank `rank`'s output (`n` elements, `count` being the API count) with the
 * expected values.  Integer types and sum/prod/min/max compare exactly; avg on floating
 * types allows a few units in the last place (division order is the library's). */
bench_check_result bench_check_output(const bench_data *d, int rank, size_t count, const void *buf,
                                      size_t n);
/* Formats an element value for messages ("12", "0.5", "nan"). */
void bench_format_value(coll_dtype t, double v, char *buf, size_t len);

/* IEEE binary16 / bfloat16 conversions, round to nearest even (our own; the library's
 * are internal). */
uint16_t bench_float_to_half(float f);
float bench_half_to_float(uint16_t h);
uint16_t bench_float_to_bf16(float f);
float bench_bf16_to_float(uint16_t h);

#endif
