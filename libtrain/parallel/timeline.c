/*
 * trace.c — records compute/communication slices per rank and writes them, together
 * with libcoll's own records of its calls and ring steps, as Chrome trace-event JSON in
 * libcoll's trace format (see trace.h). train_trace_gather_write exchanges
 * the events between the ranks (DDP and FSDP timelines) over the training backend. Must never print
 * or exit.
 */
#include "parallel/timeline.h"
#include "comm/backend.h"
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

void train_trace_add(train_trace *t, int rank, int tid, const char *name, double t0, double t1) {
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

void train_trace_free(train_trace *t) {
  free(t->ev);
  memset(t, 0, sizeof *t);
}

/* Strings in the records are ours or libcoll's, but keep the JSON valid whatever they
 * hold, and never read past the field (records arrive from other ranks as bytes). */
static void put_str(FILE *f, const char *s, size_t max) {
  for (size_t i = 0; i < max && s[i]; i++)
    if (s[i] == '"' || s[i] == '\\' || (unsigned char)s[i] < 32)
      fputc('_', f);
    else
      fputc(s[i], f);
}
#define PUT(f, field) put_str(f, field, sizeof field)

/* A libcoll record, as libcoll/exec/trace.c's json_event writes it, two tracks down. */
static void put_lib(FILE *f, const coll_trace_event *e, double t0_us) {
  int tid = TRAIN_TRACE_LIB + (e->step < 0 ? 0 : e->step + 1);
  double ts = (double)e->t_start_ns / 1e3 - t0_us;
  double dur = (double)(e->t_end_ns - e->t_start_ns) / 1e3;
  const char *dt = coll_dtype_name((coll_dtype)e->dtype);
  fprintf(f, ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"name\":\"", e->rank,
          tid, ts, dur);
  if (e->step < 0) {
    PUT(f, e->coll);
    fprintf(f, " #%llu\",\"cat\":\"call\",\"args\":{\"algo\":\"", (unsigned long long)e->seq);
    PUT(f, e->algo);
    fprintf(f, "\",\"count\":%llu,\"dtype\":\"%s\",\"nranks\":%d}}", (unsigned long long)e->count,
            dt ? dt : "?", e->nranks);
  } else {
    PUT(f, e->what);
    fprintf(f, " c%d\",\"cat\":\"step\",\"args\":{\"call\":\"", e->chunk);
    PUT(f, e->coll);
    fprintf(f,
            " #%llu\",\"step\":%d,\"chunk\":%d,\"peer_in\":%d,\"peer_out\":%d,"
            "\"bytes_in\":%llu,\"bytes_out\":%llu,\"count\":%llu,\"reduces\":%d}}",
            (unsigned long long)e->seq, e->step, e->chunk, e->peer_in, e->peer_out,
            (unsigned long long)e->bytes_in, (unsigned long long)e->bytes_out,
            (unsigned long long)e->count, e->reduces);
  }
}

static void put_thread(FILE *f, int pid, int tid, const char *name) {
  fprintf(f,
          ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{"
          "\"name\":\"%s\"}}",
          pid, tid, name);
}

int train_trace_write(const char *path, const train_trace_event *ev, size_t n,
                      const coll_trace_event *lib, size_t nlib, int nranks, char *err) {
  double t0 = 0.0;
  int have = 0, max_step = -1;
  for (size_t i = 0; i < n; i++)
    if (!have++ || ev[i].ts_us < t0) t0 = ev[i].ts_us;
  for (size_t i = 0; i < nlib; i++) {
    double ts = (double)lib[i].t_start_ns / 1e3;
    if (!have++ || ts < t0) t0 = ts;
    if (lib[i].step > max_step && lib[i].step < 4096) max_step = lib[i].step;
  }
  train_atomic a;
  if (train_atomic_open(&a, path, err) != 0) return -1;
  FILE *f = a.f;
  fprintf(f, "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"source\":\"coll-train --trace\"},"
             "\"traceEvents\":[\n{\"ph\":\"M\",\"pid\":0,\"name\":\"process_name\",\"args\":"
             "{\"name\":\"rank 0\"}}");
  for (int r = 0; r < nranks; r++) {
    if (r > 0)
      fprintf(f,
              ",\n{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_name\",\"args\":{"
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
  for (size_t i = 0; i < nlib; i++) put_lib(f, &lib[i], t0);
  fprintf(f, "\n]}\n");
  if (ferror(f)) {
    train_errf(err, "%s: write failed", path);
    train_atomic_abort(&a);
    return -1;
  }
  return train_atomic_commit(&a, err);
}

/* Every rank's `mine` (n records of `size` bytes) gathered to every rank: *counts gets each
 * rank's n, *all nranks blocks of max(n) records (rank r's at r * *per). Collective. */
static int gather_records(train_backend *b, const void *mine, uint64_t n, size_t size,
                          uint64_t **counts, void **all, size_t *per, char *err) {
  int N = b->nranks;
  train_req req;
  *all = NULL;
  *counts = calloc((size_t)N, sizeof **counts);
  if (!*counts) {
    train_errf(err, "out of memory gathering the trace");
    return -1;
  }
  if (b->all_gather(b, &n, *counts, sizeof n, &req) != 0 || b->wait(b, req) != 0) {
    train_errf(err, "gathering the trace: %s", b->err);
    return -1;
  }
  uint64_t mx = 1;
  for (int r = 0; r < N; r++) mx = (*counts)[r] > mx ? (*counts)[r] : mx;
  *per = (size_t)mx;
  void *send = calloc((size_t)mx, size);
  *all = calloc((size_t)N * mx, size);
  int rc = 0;
  if (!send || !*all) {
    train_errf(err, "out of memory gathering the trace");
    rc = -1;
  } else {
    if (n) memcpy(send, mine, (size_t)n * size);
    if (b->all_gather(b, send, *all, (size_t)mx * size, &req) != 0 || b->wait(b, req) != 0) {
      train_errf(err, "gathering the trace: %s", b->err);
      rc = -1;
    }
  }
  free(send);
  return rc;
}

/* Packs rank blocks of `per` records (counts[r] used in block r) together; returns the total. */
static size_t pack(void *all, const uint64_t *counts, int N, size_t per, size_t size) {
  size_t n = 0;
  char *p = all;
  for (int r = 0; r < N; r++) {
    memmove(p + n * size, p + (size_t)r * per * size, (size_t)counts[r] * size);
    n += (size_t)counts[r];
  }
  return n;
}

int train_trace_gather_write(train_backend *b, train_trace *t, const char *path, char *err) {
  int N = b->nranks;
  /* this rank's libcoll records (the gathers below are not part of the trace) */
  coll_trace_event *lib = NULL;
  size_t nlib = 0;
  int rc = 0;
  if (b->trace_stop && b->trace_read) {
    size_t have = 0;
    if (b->trace_stop(b) != 0 || b->trace_read(b, NULL, 0, &have) != 0) {
      train_errf(err, "--trace: %s", b->err);
      rc = -1;
    } else if (have && !(lib = malloc(have * sizeof *lib))) {
      train_errf(err, "out of memory reading libcoll's trace");
      rc = -1;
    } else if (have && b->trace_read(b, lib, have, &nlib) != 0) {
      train_errf(err, "--trace: %s", b->err);
      rc = -1;
    }
    nlib = nlib < have ? nlib : have;
  }
  /* gather even after a local failure would leave the others waiting: fail collectively
   * by gathering zero records instead */
  uint64_t *c1 = NULL, *c2 = NULL;
  void *a1 = NULL, *a2 = NULL;
  size_t per1 = 0, per2 = 0;
  if (gather_records(b, t->ev, rc == 0 ? t->n : 0, sizeof(train_trace_event), &c1, &a1, &per1,
                     err) != 0 ||
      gather_records(b, lib, rc == 0 ? nlib : 0, sizeof(coll_trace_event), &c2, &a2, &per2, err) !=
          0)
    rc = -1;
  if (rc == 0 && b->rank == 0) {
    size_t n1 = pack(a1, c1, N, per1, sizeof(train_trace_event));
    size_t n2 = pack(a2, c2, N, per2, sizeof(coll_trace_event));
    rc = train_trace_write(path, a1, n1, a2, n2, N, err);
  }
  free(lib);
  free(c1);
  free(c2);
  free(a1);
  free(a2);
  return rc;
}
