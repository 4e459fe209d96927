/*
 * trace.c — records compute/communication slices per rank and writes them, together
 * with libcoll's own records of its calls and ring steps, as Chrome trace-event JSON in
 * libcoll's trace format (see trace.h). It only collects and formats: exchanging the
 * events between ranks is ddp.c's job. Must never print or exit.
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

/* Strings in the records are ours or libcoll's, but keep the JSON valid whatever they
 * hold, and never read past the field (records arrive from other ranks as bytes). */
static void put_str(FILE *f, const char *s, size_t max)
{
    for (size_t i = 0; i < max && s[i]; i++)
        if (s[i] == '"' || s[i] == '\\' || (unsigned char)s[i] < 32)
            fputc('_', f);
        else
            fputc(s[i], f);
}
#define PUT(f, field) put_str(f, field, sizeof field)

/* A libcoll record, as libcoll/exec/trace.c's json_event writes it, two tracks down. */
static void put_lib(FILE *f, const coll_trace_event *e, double t0_us)
{
    int tid = TRAIN_TRACE_LIB + (e->step < 0 ? 0 : e->step + 1);
    double ts = (double)e->t_start_ns / 1e3 - t0_us;
    double dur = (double)(e->t_end_ns - e->t_start_ns) / 1e3;
    const char *dt = coll_dtype_name((coll_dtype)e->dtype);
    fprintf(f, ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"name\":\"",
            e->rank, tid, ts, dur);
    if (e->step < 0) {
        PUT(f, e->coll);
        fprintf(f, " #%llu\",\"cat\":\"call\",\"args\":{\"algo\":\"", (unsigned long long)e->seq);
        PUT(f, e->algo);
        fprintf(f, "\",\"count\":%llu,\"dtype\":\"%s\",\"nranks\":%d}}",
                (unsigned long long)e->count, dt ? dt : "?", e->nranks);
    } else {
        PUT(f, e->what);
        fprintf(f, " c%d\",\"cat\":\"step\",\"args\":{\"call\":\"", e->chunk);
        PUT(f, e->coll);
        fprintf(f, " #%llu\",\"step\":%d,\"chunk\":%d,\"peer_in\":%d,\"peer_out\":%d,"
                   "\"bytes_in\":%llu,\"bytes_out\":%llu,\"count\":%llu,\"reduces\":%d}}",
                (unsigned long long)e->seq, e->step, e->chunk, e->peer_in, e->peer_out,
                (unsigned long long)e->bytes_in, (unsigned long long)e->bytes_out,
                (unsigned long long)e->count, e->reduces);
    }
}

static void put_thread(FILE *f, int pid, int tid, const char *name)
{
    fprintf(f, ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{"
               "\"name\":\"%s\"}}",
            pid, tid, name);
}

int train_trace_write(const char *path, const train_trace_event *ev, size_t n,
                      const coll_trace_event *lib, size_t nlib, int nranks, char *err)
{
    double t0 = 0.0;
    int have = 0, max_step = -1;
    for (size_t i = 0; i < n; i++)
        if (!have++ || ev[i].ts_us < t0)
            t0 = ev[i].ts_us;
    for (size_t i = 0; i < nlib; i++) {
        double ts = (double)lib[i].t_start_ns / 1e3;
        if (!have++ || ts < t0)
            t0 = ts;
        if (lib[i].step > max_step && lib[i].step < 4096)
            max_step = lib[i].step;
    }
    train_atomic a;
    if (train_atomic_open(&a, path, err) != 0)
        return -1;
    FILE *f = a.f;
    fprintf(f, "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"source\":\"coll-train --trace\"},"
               "\"traceEvents\":[\n{\"ph\":\"M\",\"pid\":0,\"name\":\"process_name\",\"args\":"
               "{\"name\":\"rank 0\"}}");
    for (int r = 0; r < nranks; r++) {
        if (r > 0)
            fprintf(f, ",\n{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_name\",\"args\":{"
                       "\"name\":\"rank %d\"}}",
                    r, r);
        put_thread(f, r, TRAIN_TRACE_COMPUTE, "compute");
        put_thread(f, r, TRAIN_TRACE_COMM, "buckets (all-reduce, launch to done)");
        if (nlib) {
            put_thread(f, r, TRAIN_TRACE_LIB, "libcoll calls");
            for (int s = 0; s <= max_step; s++) {
                char nm[32];
                snprintf(nm, sizeof nm, "libcoll step %d", s);
                put_thread(f, r, TRAIN_TRACE_LIB + 1 + s, nm);
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        fprintf(f, ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"name\":\"",
                ev[i].rank, ev[i].tid, ev[i].ts_us - t0, ev[i].dur_us);
        PUT(f, ev[i].name);
        fprintf(f, "\",\"cat\":\"%s\"}", ev[i].tid == TRAIN_TRACE_COMM ? "comm" : "compute");
    }
    for (size_t i = 0; i < nlib; i++)
        put_lib(f, &lib[i], t0);
    fprintf(f, "\n]}\n");
    if (ferror(f)) {
        train_errf(err, "%s: write failed", path);
        train_atomic_abort(&a);
        return -1;
    }
    return train_atomic_commit(&a, err);
}
