/*
 * trace.c — records compute/communication slices per rank and writes them as Chrome
 * trace-event JSON (see trace.h). It only collects and formats: exchanging the events
 * between ranks is ddp.c's job. Must never print or exit.
 */
#include "trace.h"
#include "internal.h"

#include <stdlib.h>
#include <string.h>

void train_trace_add(train_trace *t, int rank, int tid, const char *name, double t0, double t1)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 1024;
        train_trace_event *ev = cap <= TRAIN_TRACE_MAX ? realloc(t->ev, cap * sizeof *ev) : NULL;
        if (!ev) {
            t->dropped++;
            return;
        }
        t->ev = ev;
        t->cap = cap;
    }
    train_trace_event *e = &t->ev[t->n++];
    memset(e, 0, sizeof *e);
    e->ts_us = t0 * 1e6;
    e->dur_us = (t1 - t0) * 1e6;
    e->rank = rank;
    e->tid = tid;
    snprintf(e->name, sizeof e->name, "%s", name);
}

void train_trace_free(train_trace *t)
{
    free(t->ev);
    memset(t, 0, sizeof *t);
}

/* names are ours (no quotes or backslashes), but keep the JSON valid whatever they hold */
static void put_name(FILE *f, const char *s)
{
    for (; *s; s++)
        if (*s == '"' || *s == '\\' || (unsigned char)*s < 32)
            fputc('_', f);
        else
            fputc(*s, f);
}

int train_trace_write(const char *path, const train_trace_event *ev, size_t n, int nranks,
                      char *err)
{
    double t0 = 0.0;
    for (size_t i = 0; i < n; i++)
        if (i == 0 || ev[i].ts_us < t0)
            t0 = ev[i].ts_us;
    train_atomic a;
    if (train_atomic_open(&a, path, err) != 0)
        return -1;
    FILE *f = a.f;
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    int first = 1;
    for (int r = 0; r < nranks; r++) {
        fprintf(f, "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,"
                   "\"args\":{\"name\":\"rank %d\"}},\n",
                first ? "" : ",", r, r);
        first = 0;
        fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":0,"
                   "\"args\":{\"name\":\"compute\"}},\n",
                r);
        fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":1,"
                   "\"args\":{\"name\":\"communication\"}}",
                r);
    }
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%s{\"ph\":\"X\",\"cat\":\"%s\",\"name\":\"", first ? "" : ",\n",
                ev[i].tid == TRAIN_TRACE_COMM ? "comm" : "compute");
        first = 0;
        put_name(f, ev[i].name);
        fprintf(f, "\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}", ev[i].rank,
                ev[i].tid, ev[i].ts_us - t0, ev[i].dur_us);
    }
    fprintf(f, "\n]}\n");
    if (ferror(f)) {
        train_errf(err, "%s: write failed", path);
        train_atomic_abort(&a);
        return -1;
    }
    return train_atomic_commit(&a, err);
}
