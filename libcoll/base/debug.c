/* debug.c — COLL_DEBUG logging and the "last error" sentences.
 *
 * COLL_DEBUG=WARN|INFO|TRACE writes lines to stderr prefixed with host, pid and rank,
 * like NCCL_DEBUG.  Errors are recorded, never printed-and-exited: the caller gets a
 * coll_result and can read the sentence with coll_comm_last_error().  This file must
 * never be called on the data path with logging off in a way that costs more than one
 * load and compare (the level is read once).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "internal.h"

static _Atomic int log_level = -1;

int coll_log_level(void) {
  int l = atomic_load_explicit(&log_level, memory_order_relaxed);
  if (l >= 0) return l;
  const char *e = getenv("COLL_DEBUG");
  l = COLL_LOG_NONE;
  if (e) {
    if (!strcasecmp(e, "WARN"))
      l = COLL_LOG_WARN;
    else if (!strcasecmp(e, "INFO"))
      l = COLL_LOG_INFO;
    else if (!strcasecmp(e, "TRACE"))
      l = COLL_LOG_TRACE;
  }
  atomic_store(&log_level, l);
  return l;
}

void coll_log(int level, int rank, const char *fmt, ...) {
  static const char *names[] = {"", "WARN", "INFO", "TRACE"};
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  char line[1024];
  int n;
  if (rank >= 0)
    n = snprintf(line, sizeof line, "%s:%d:rank %d [coll %s] ", host, (int)getpid(), rank,
                 names[level]);
  else
    n = snprintf(line, sizeof line, "%s:%d [coll %s] ", host, (int)getpid(), names[level]);
  va_list ap;
  va_start(ap, fmt);
  if (n > 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s\n", line);
}

static _Thread_local char thread_err[COLL_ERRBUF];

coll_result coll_fail_at(struct coll_comm *comm, coll_result r, const char *file, int line,
                         const char *fmt, ...) {
  char msg[COLL_ERRBUF];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (comm) {
    pthread_mutex_lock(&comm->errmu);
    snprintf(comm->errbuf, sizeof comm->errbuf, "%s", msg);
    pthread_mutex_unlock(&comm->errmu);
  }
  snprintf(thread_err, sizeof thread_err, "%s", msg);
  if (r != COLL_OK && r != COLL_IN_PROGRESS) {
    if (coll_log_level() >= COLL_LOG_TRACE)
      coll_log(COLL_LOG_TRACE, comm ? comm->rank : -1, "%s:%d %s: %s", file, line,
               coll_result_string(r), msg);
    else
      COLL_INFO(comm ? comm->rank : -1, "%s: %s", coll_result_string(r), msg);
  }
  return r;
}

coll_result coll_view_fail_at(const coll_comm_view *view, coll_result r, const char *file, int line,
                              const char *fmt, ...) {
  char msg[COLL_ERRBUF];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return coll_fail_at(view ? view->owner : NULL, r, file, line, "%s", msg);
}

const char *coll_comm_last_error(coll_comm_t comm) {
  if (!comm) return thread_err;
  /* The buffer is stable after the failing call returned; copying it under the lock
   * into a thread-local keeps a concurrent failure from tearing the sentence. */
  static _Thread_local char copy[COLL_ERRBUF];
  pthread_mutex_lock(&comm->errmu);
  memcpy(copy, comm->errbuf, sizeof copy);
  pthread_mutex_unlock(&comm->errmu);
  return copy;
}

const char *coll_result_string(coll_result r) {
  switch (r) {
  case COLL_OK: return "success";
  case COLL_ERR_INVALID_ARG: return "invalid argument";
  case COLL_ERR_SYSTEM: return "system error";
  case COLL_ERR_REMOTE: return "remote error";
  case COLL_ERR_TIMEOUT: return "timeout";
  case COLL_ERR_MISMATCH: return "mismatched collective calls";
  case COLL_ERR_UNSUPPORTED: return "unsupported";
  case COLL_ERR_INTERNAL: return "internal error";
  case COLL_IN_PROGRESS: return "in progress";
  }
  return "unknown result";
}
