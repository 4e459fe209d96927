/* trace.c — recording the steps a communicator ran, and writing them out.
 *
 * The executor hands over, after each call, the schedule it ran with per-step start and
 * end times; this file turns that into coll_trace_event records (coll_trace.h).  Three
 * consumers: coll_trace_read() (coll-bench --explain gathers every rank's records and
 * prints them), COLL_TRACE=text (each rank logs its steps as each call finishes) and
 * COLL_TRACE=FILE.json (at coll_comm_destroy the ranks gather their records to rank 0
 * with the communicator's own all-gather, and rank 0 writes one Chrome-trace /
 * Perfetto file: a process per rank, a track for calls and a track per schedule step,
 * so the pipeline shows as overlapping steps).  A sub-communicator (split.c) writes
 * FILE.split<k>-color<c>.json instead, so no two communicators of a job write one path.
 *
 * Must never: run on the data path (it is called once per call, after the call), make
 * a traced run fail (a trace that cannot be written is a warning), or record while the
 * destroy-time gather runs (that would trace the tracing).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_trace.h"
#include "internal.h"
#include "ring.h"

#define TRACE_MAX_EVENTS (1u << 22) /* per rank; beyond this events are counted, not kept */

struct coll_trace {
  pthread_mutex_t mu;
  bool on;
  bool text;      /* COLL_TRACE=text */
  char path[512]; /* COLL_TRACE=FILE.json */
  coll_trace_event *ev;
  size_t n, cap;
  uint64_t dropped;
  uint64_t *t0, *t1; /* per step of the running call (executor scratch) */
};

static coll_trace *trace_new(struct coll_comm *comm) {
  coll_trace *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  size_t ms = coll_plan_max_steps(comm->nranks);
  t->t0 = calloc(ms, sizeof *t->t0);
  t->t1 = calloc(ms, sizeof *t->t1);
  if (!t->t0 || !t->t1) {
    free(t->t0);
    free(t->t1);
    free(t);
    return NULL;
  }
  pthread_mutex_init(&t->mu, NULL);
  return t;
}

void coll_trace_free(struct coll_comm *comm) {
  coll_trace *t = comm->trace;
  if (!t) return;
  pthread_mutex_destroy(&t->mu);
  free(t->ev);
  free(t->t0);
  free(t->t1);
  free(t);
  comm->trace = NULL;
}

coll_result coll_trace_from_env(struct coll_comm *comm) {
  const char *e = getenv("COLL_TRACE");
  if (!e || !*e) return COLL_OK;
  if (!(comm->trace = trace_new(comm)))
    return coll_fail(comm, COLL_ERR_SYSTEM, "rank %d: out of memory for COLL_TRACE", comm->rank);
  if (strcmp(e, "text") == 0) {
    comm->trace->text = true;
  } else if (strlen(e) < sizeof comm->trace->path) {
    snprintf(comm->trace->path, sizeof comm->trace->path, "%s", e);
  } else {
    COLL_WARN(comm->rank, "COLL_TRACE: path longer than %zu bytes, not tracing",
              sizeof comm->trace->path);
    coll_trace_free(comm);
    return COLL_OK;
  }
  comm->trace->on = true;
  return COLL_OK;
}

void coll_trace_child_path(struct coll_comm *child, const struct coll_comm *parent,
                           const char *tag) {
  coll_trace *t = child->trace;
  if (!t || !t->path[0]) return;
  char base[sizeof t->path];
  snprintf(base, sizeof base, "%s",
           parent->trace && parent->trace->path[0] ? parent->trace->path : t->path);
  size_t n = strlen(base);
  bool json = n >= 5 && strcmp(base + n - 5, ".json") == 0;
  if (json) base[n - 5] = 0;
  int k = snprintf(t->path, sizeof t->path, "%s.%s%s", base, tag, json ? ".json" : "");
  if (k < 0 || (size_t)k >= sizeof t->path) {
    COLL_WARN(child->rank,
              "COLL_TRACE: the sub-communicator's path %s.%s.json is longer than "
              "%zu bytes; not writing its trace",
              base, tag, sizeof t->path - 1);
    t->path[0] = 0;
  }
}

bool coll_trace_on(struct coll_comm *comm) { return comm->trace && comm->trace->on; }
uint64_t *coll_trace_t0(struct coll_comm *comm) { return comm->trace->t0; }
uint64_t *coll_trace_t1(struct coll_comm *comm) { return comm->trace->t1; }

static void fill_common(coll_trace_event *e, struct coll_comm *comm, const coll_work *w,
                        coll_algo algo) {
  memset(e, 0, sizeof *e);
  e->seq = w->seq;
  e->rank = comm->rank;
  e->nranks = comm->nranks;
  e->dtype = (int32_t)w->dtype;
  snprintf(e->coll, sizeof e->coll, "%s", coll_coll_name(w->coll));
  /* A group's point-to-point work ("group") has no algorithm: its steps are its calls. */
  snprintf(e->algo, sizeof e->algo, "%s",
           w->coll == COLL_COLL_GROUP_P2P ? "p2p" : coll_algo_name(algo));
}

static bool reserve(coll_trace *t, size_t more) {
  if (t->n + more <= t->cap) return true;
  if (t->n + more > TRACE_MAX_EVENTS) return false;
  size_t cap = t->cap ? t->cap : 1024;
  while (cap < t->n + more) cap *= 2;
  if (cap > TRACE_MAX_EVENTS) cap = TRACE_MAX_EVENTS;
  coll_trace_event *ev = realloc(t->ev, cap * sizeof *ev);
  if (!ev) return false;
  t->ev = ev;
  t->cap = cap;
  return true;
}

static void log_text(struct coll_comm *comm, const coll_trace_event *e) {
  if (e->step < 0) {
    coll_log(COLL_LOG_INFO, comm->rank, "trace %s #%llu (%s, %llu elements, %d ranks): %.1f us",
             e->coll, (unsigned long long)e->seq, e->algo, (unsigned long long)e->count, e->nranks,
             (double)(e->t_end_ns - e->t_start_ns) / 1e3);
    return;
  }
  char from[24] = "", to[24] = "";
  if (e->peer_in >= 0) snprintf(from, sizeof from, " from rank %d", e->peer_in);
  if (e->peer_out >= 0) snprintf(to, sizeof to, " to rank %d", e->peer_out);
  coll_log(COLL_LOG_INFO, comm->rank,
           "trace %s #%llu step %d: %s chunk %d%s%s: %llu B in, %llu B out%s", e->coll,
           (unsigned long long)e->seq, e->step, e->what, e->chunk, from, to,
           (unsigned long long)e->bytes_in, (unsigned long long)e->bytes_out,
           e->reduces ? " (reduced with own data)" : "");
}

void coll_trace_record(struct coll_comm *comm, const coll_work *w, coll_algo algo,
                       const coll_step *steps, size_t nsteps, size_t es, uint64_t t_start,
                       uint64_t t_end) {
  coll_trace *t = comm->trace;
  if (w->internal) return; /* the library's own exchange (split.c), not a call of the user's */
  coll_trace_event call;
  fill_common(&call, comm, w, algo);
  call.step = -1;
  call.peer_in = call.peer_out = call.chunk = -1;
  snprintf(call.what, sizeof call.what, "call");
  call.count = w->count;
  call.t_start_ns = t_start;
  call.t_end_ns = t_end;
  pthread_mutex_lock(&t->mu);
  bool keep = t->on && reserve(t, nsteps + 1);
  if (!t->on) {
    pthread_mutex_unlock(&t->mu);
    return;
  }
  if (!keep) t->dropped += nsteps + 1;
  coll_trace_event *e = keep ? &t->ev[t->n] : NULL;
  for (size_t i = 0; i <= nsteps; i++) {
    coll_trace_event ev;
    if (i == 0) {
      ev = call;
    } else {
      const coll_step *s = &steps[i - 1];
      fill_common(&ev, comm, w, algo);
      ev.step = (int32_t)(i - 1);
      snprintf(ev.what, sizeof ev.what, "%s", coll_step_name(s->kind));
      ev.peer_in = s->peer_in;
      ev.peer_out = s->peer_out;
      ev.chunk = s->chunk;
      ev.reduces = s->kind == COLL_STEP_RECV_REDUCE_SEND || s->kind == COLL_STEP_RECV_REDUCE_COPY ||
                   s->kind == COLL_STEP_RECV_REDUCE_COPY_SEND ||
                   s->kind == COLL_STEP_RECV2_REDUCE_SEND;
      ev.count = s->count;
      /* A tree node with two children receives the range twice. */
      ev.bytes_in = (s->peer_in >= 0 ? s->count * es : 0) +
                    (s->kind == COLL_STEP_RECV2_REDUCE_SEND && s->peer_in2 >= 0 ? s->count * es
                                                                                : 0);
      ev.bytes_out = s->peer_out >= 0 ? s->count * es : 0;
      ev.t_start_ns = t->t0[i - 1];
      ev.t_end_ns = t->t1[i - 1];
    }
    if (keep) e[i] = ev;
    if (t->text) log_text(comm, &ev);
    if (t->text && i == 0 && comm->hosts.nhosts > 1 && comm->hosts.host) {
      /* Several hosts: what this rank sent over each link class in the call. */
      unsigned long long in = 0, x = 0;
      for (size_t k = 0; k < nsteps; k++)
        if (steps[k].peer_out >= 0 && steps[k].peer_out < comm->nranks)
          *(comm->hosts.host[steps[k].peer_out] == comm->hosts.host[comm->rank]
                ? &in
                : &x) += (unsigned long long)steps[k].count * es;
      coll_log(COLL_LOG_INFO, comm->rank,
               "trace %s #%llu: sent %llu B inside host %d, %llu B across hosts", ev.coll,
               (unsigned long long)ev.seq, in, comm->hosts.host[comm->rank], x);
    }
  }
  if (keep) t->n += nsteps + 1;
  pthread_mutex_unlock(&t->mu);
}

/* ---- public API ------------------------------------------------------------------- */

coll_result coll_trace_start(coll_comm_t comm) {
  if (!comm) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_trace_start: comm is NULL");
  if (!comm->trace) {
    coll_trace *t = trace_new(comm);
    if (!t) return coll_fail(comm, COLL_ERR_SYSTEM, "coll_trace_start: out of memory");
    /* Published before any call can see it: the caller owns the communicator here, and
     * the executor reads comm->trace only inside calls the caller makes afterwards. */
    comm->trace = t;
  }
  pthread_mutex_lock(&comm->trace->mu);
  comm->trace->n = 0;
  comm->trace->dropped = 0;
  comm->trace->on = true;
  pthread_mutex_unlock(&comm->trace->mu);
  return COLL_OK;
}

coll_result coll_trace_stop(coll_comm_t comm) {
  if (!comm) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_trace_stop: comm is NULL");
  if (!comm->trace) return COLL_OK;
  pthread_mutex_lock(&comm->trace->mu);
  comm->trace->on = false;
  pthread_mutex_unlock(&comm->trace->mu);
  return COLL_OK;
}

coll_result coll_trace_read(coll_comm_t comm, coll_trace_event *ev, size_t cap, size_t *n) {
  if (!comm || !n || (cap && !ev))
    return coll_fail(comm, COLL_ERR_INVALID_ARG, "coll_trace_read: %s is NULL",
                     !comm ? "comm"
                     : !n  ? "n"
                           : "ev");
  *n = 0;
  if (!comm->trace) return COLL_OK;
  pthread_mutex_lock(&comm->trace->mu);
  size_t k = comm->trace->n < cap ? comm->trace->n : cap;
  if (k) memcpy(ev, comm->trace->ev, k * sizeof *ev);
  *n = comm->trace->n;
  pthread_mutex_unlock(&comm->trace->mu);
  return COLL_OK;
}

coll_result coll_comm_slice_bytes(coll_comm_t comm, size_t *bytes) {
  if (!comm || !bytes)
    return coll_fail(comm, COLL_ERR_INVALID_ARG, "coll_comm_slice_bytes: %s is NULL",
                     comm ? "bytes" : "comm");
  *bytes = comm->slot_bytes;
  return COLL_OK;
}

const char *coll_comm_transport_name(coll_comm_t comm) {
  return comm && comm->transport ? comm->transport->name : "none";
}

coll_result coll_cost_predict(const char *coll, int nranks, size_t bytes, size_t slice_bytes,
                              double alpha, double beta, double *seconds, char *formula,
                              size_t formula_len) {
  if (!coll || !seconds || nranks < 1 || slice_bytes == 0)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG,
                     "coll_cost_predict: need a collective name, nranks >= 1, a slice size "
                     "and somewhere to put the result");
  char dummy[8];
  if (!formula) {
    formula = dummy;
    formula_len = sizeof dummy;
  }
  for (int c = 0; c < COLL_NUM_COLLS; c++) {
    if (strcmp(coll, coll_coll_name((coll_coll_kind)c)) != 0) continue;
    /* The collective's default schedule: the ring, pairwise for all-to-all, linear for
     * gather and scatter. */
    if (coll_algo_cost(coll_algo_default((coll_coll_kind)c), (coll_coll_kind)c, nranks,
                       (double)bytes, (double)slice_bytes, alpha, beta, 0, seconds, formula,
                       formula_len) == COLL_OK)
      return COLL_OK;
    return coll_fail(NULL, COLL_ERR_INVALID_ARG,
                     "coll_cost_predict: %s has no size every "
                     "rank shares, so no single cost",
                     coll);
  }
  return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_cost_predict: unknown collective \"%s\"",
                   coll);
}

/* ---- COLL_TRACE=FILE.json --------------------------------------------------------- */

static void json_event(FILE *f, const coll_trace_event *e, uint64_t t_base, bool *first) {
  int tid = e->step < 0 ? 0 : e->step + 1;
  double ts = (double)(e->t_start_ns - t_base) / 1e3;
  double dur = (double)(e->t_end_ns - e->t_start_ns) / 1e3;
  fprintf(f, "%s\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,", *first ? "" : ",",
          e->rank, tid, ts, dur);
  *first = false;
  if (e->step < 0)
    fprintf(f,
            "\"name\":\"%s #%llu\",\"cat\":\"call\",\"args\":{\"algo\":\"%s\",\"count\":%llu,"
            "\"dtype\":\"%s\",\"nranks\":%d}}",
            e->coll, (unsigned long long)e->seq, e->algo, (unsigned long long)e->count,
            coll_dtype_name((coll_dtype)e->dtype), e->nranks);
  else
    fprintf(f,
            "\"name\":\"%s c%d\",\"cat\":\"step\",\"args\":{\"call\":\"%s #%llu\",\"step\":%d,"
            "\"chunk\":%d,\"peer_in\":%d,\"peer_out\":%d,\"bytes_in\":%llu,\"bytes_out\":%llu,"
            "\"count\":%llu,\"reduces\":%d}}",
            e->what, e->chunk, e->coll, (unsigned long long)e->seq, e->step, e->chunk, e->peer_in,
            e->peer_out, (unsigned long long)e->bytes_in, (unsigned long long)e->bytes_out,
            (unsigned long long)e->count, e->reduces);
}

/* Writes events of `nranks` ranks (rank r's at ev + r*stride, counts[r] of them). */
static bool write_json(const char *path, const coll_trace_event *ev, const uint64_t *counts,
                       int nranks, size_t stride, int max_steps) {
  char tmp[600];
  /* a path too long for the temporary name is refused, never cut to another file's name */
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid()) >= sizeof tmp)
    return false;
  FILE *f = fopen(tmp, "w");
  if (!f) return false;
  uint64_t base = UINT64_MAX;
  for (int r = 0; r < nranks; r++)
    for (uint64_t i = 0; i < counts[r]; i++)
      if (ev[(size_t)r * stride + i].t_start_ns < base)
        base = ev[(size_t)r * stride + i].t_start_ns;
  if (base == UINT64_MAX) base = 0;
  fprintf(f, "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"source\":\"libcoll COLL_TRACE\"},"
             "\"traceEvents\":[");
  bool first = true;
  for (int r = 0; r < nranks; r++) {
    fprintf(f,
            "%s\n{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_name\",\"args\":{\"name\":"
            "\"rank %d\"}}",
            first ? "" : ",", r, r);
    first = false;
    fprintf(f,
            ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"thread_name\",\"args\":{\"name\":"
            "\"calls\"}}",
            r);
    for (int s = 0; s < max_steps; s++)
      fprintf(f,
              ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":"
              "{\"name\":\"step %d\"}}",
              r, s + 1, s);
    for (uint64_t i = 0; i < counts[r]; i++)
      json_event(f, &ev[(size_t)r * stride + i], base, &first);
  }
  fprintf(f, "\n]}\n");
  bool ok = fflush(f) == 0 && !ferror(f);
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(tmp, path) != 0) {
    unlink(tmp);
    return false;
  }
  return true;
}

void coll_trace_flush_json(struct coll_comm *comm) {
  coll_trace *t = comm->trace;
  if (!t || !t->path[0]) return;
  pthread_mutex_lock(&t->mu);
  t->on = false; /* the gather below is not part of the trace */
  pthread_mutex_unlock(&t->mu);
  int n = comm->nranks, ms = (int)coll_plan_max_steps(n);
  uint64_t mine = t->n, *counts = calloc((size_t)n, sizeof *counts);
  coll_trace_event *all = NULL;
  bool gathered = false;
  if (counts && (n == 1 || atomic_load(&comm->aborted) == 0)) {
    coll_result r = n == 1 ? COLL_OK
                           : comm->exec_ops->bytes(comm, COLL_COLL_ALL_GATHER, &mine, counts,
                                                   sizeof mine, COLL_SUM, 0);
    if (n == 1) counts[0] = mine;
    uint64_t most = 0;
    for (int i = 0; r == COLL_OK && i < n; i++)
      if (counts[i] > most) most = counts[i];
    size_t bytes = (size_t)most * sizeof(coll_trace_event);
    if (r == COLL_OK && (all = calloc((size_t)n * (most ? most : 1), sizeof *all))) {
      coll_trace_event *mine_padded = calloc(most ? most : 1, sizeof *mine_padded);
      if (mine_padded) {
        if (t->n) memcpy(mine_padded, t->ev, t->n * sizeof *t->ev);
        r = n == 1 ? COLL_OK
                   : comm->exec_ops->bytes(comm, COLL_COLL_ALL_GATHER, mine_padded, all, bytes,
                                           COLL_SUM, 0);
        if (n == 1 && t->n) memcpy(all, t->ev, t->n * sizeof *t->ev);
        gathered = r == COLL_OK;
        free(mine_padded);
      }
    }
    if (gathered && comm->rank == 0) {
      if (!write_json(t->path, all, counts, n, most, ms))
        COLL_WARN(comm->rank, "COLL_TRACE: could not write %s: %s", t->path, strerror(errno));
      else
        COLL_INFO(comm->rank, "COLL_TRACE: wrote %s (%d ranks)", t->path, n);
    }
  }
  if (!gathered) {
    /* The ranks could not gather (a failed communicator): each keeps its own part. */
    char p[600];
    snprintf(p, sizeof p, "%s.rank%d.json", t->path, comm->rank);
    uint64_t c = t->n;
    if (!write_json(p, t->ev, &c, 1, t->n, ms))
      COLL_WARN(comm->rank, "COLL_TRACE: could not write %s", p);
    else
      COLL_WARN(comm->rank, "COLL_TRACE: ranks could not gather their traces; wrote %s", p);
  }
  if (t->dropped)
    COLL_WARN(comm->rank, "COLL_TRACE: %llu events were not kept (over %u per rank)",
              (unsigned long long)t->dropped, TRACE_MAX_EVENTS);
  free(all);
  free(counts);
}
