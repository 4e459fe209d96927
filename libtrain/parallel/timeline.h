/*
 * trace.h — a timeline of what each rank did, written in libcoll's trace format (the one
 * COLL_TRACE=FILE.json writes, libcoll/exec/trace.c): Chrome trace-event JSON that Perfetto
 * (ui.perfetto.dev) and chrome://tracing open, one process per rank ("rank r"), "X"
 * (complete) events with microsecond timestamps from CLOCK_MONOTONIC (comparable between
 * the processes of one machine), all shifted by the earliest event.
 *
 * Tracks (threads) of each rank:
 *   0      compute: forward and backward one slice per stage (embeddings, each block, head),
 *          the bucket launch calls, the exposed wait for communication, the optimizer;
 *   1      buckets: each gradient bucket's all-reduce from launch to observed completion
 *          (and so for any backend);
 *   2      libcoll calls, 3 + s libcoll schedule step s: libcoll's own records
 *          (coll_trace_event, read with coll_trace_read), written exactly as libcoll
 *          writes them (same names, categories "call"/"step" and args) two tracks down.
 *
 * Recording appends to a growable array and never fails loudly: past TRAIN_TRACE_MAX
 * events it counts what it dropped. Writing is atomic (temp file + rename).
 */
#ifndef TRAIN_PARALLEL_TIMELINE_H
#define TRAIN_PARALLEL_TIMELINE_H

#include "train.h"

#include <coll_trace.h>

#define TRAIN_TRACE_MAX (1u << 20)
#define TRAIN_TRACE_COMPUTE 0
#define TRAIN_TRACE_COMM 1
#define TRAIN_TRACE_LIB 2 /* libcoll's calls; its step s is on TRAIN_TRACE_LIB + 1 + s */

typedef struct train_trace_event {
  double ts_us, dur_us;
  int32_t rank, tid;
  char name[40];
} train_trace_event; /* 64 bytes, plain data: ranks exchange them as bytes */

typedef struct train_trace {
  train_trace_event *ev;
  size_t n, cap, dropped;
} train_trace;

/* Seconds (train_now) to a slice [t0, t1] on thread tid of `rank`. */
TRAIN_API void train_trace_add(train_trace *t, int rank, int tid, const char *name, double t0,
                               double t1);
TRAIN_API void train_trace_free(train_trace *t);
/* Writes the ranks' events ev[0..n) and libcoll records lib[0..nlib) (of any rank, either
 * may be empty) as {"traceEvents": [...]}, times relative to the earliest of them all. */
TRAIN_API int train_trace_write(const char *path, const train_trace_event *ev, size_t n,
                                const coll_trace_event *lib, size_t nlib, int nranks, char *err);

typedef struct train_backend train_backend;
/* Collective: gathers every rank's events `t` and the backend's own records (when it keeps
 * any: libcoll); rank 0 writes them to `path`. A local failure still takes part in the
 * gathers (with zero records), so no rank is left waiting. */
TRAIN_API int train_trace_gather_write(train_backend *b, train_trace *t, const char *path,
                                       char *err);

#endif
