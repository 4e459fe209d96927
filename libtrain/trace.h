/*
 * trace.h — a timeline of what each rank did (compute and communication slices), written
 * as Chrome trace-event JSON that Perfetto (ui.perfetto.dev) and chrome://tracing open:
 * one process per rank, thread 0 = compute, thread 1 = communication, "X" (complete)
 * events with microsecond timestamps from CLOCK_MONOTONIC (comparable between processes
 * of one machine).
 *
 * Recording appends to a growable array and never fails loudly: past TRAIN_TRACE_MAX
 * events it counts what it dropped. Writing is atomic (temp file + rename).
 */
#ifndef TRAIN_TRACE_H
#define TRAIN_TRACE_H

#include "train.h"

#define TRAIN_TRACE_MAX (1u << 20)
#define TRAIN_TRACE_COMPUTE 0
#define TRAIN_TRACE_COMM 1

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
/* Writes events (from all ranks) as {"traceEvents": [...]}, times relative to the
 * earliest event. */
TRAIN_API int train_trace_write(const char *path, const train_trace_event *ev, size_t n,
                                int nranks, char *err);

#endif
