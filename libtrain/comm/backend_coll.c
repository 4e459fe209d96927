/*
 * backend_coll.c — the training backend over libcoll, through its public API only
 * (coll.h): each request is one libcoll stream from a fixed pool, so a request can be
 * tested (coll_stream_query) or waited on (coll_stream_synchronize) on its own while later
 * ones stay in flight. libcoll runs a communicator's work in call order on its progress
 * thread, so the collectives progress while backward computes.
 *
 * It must never print, exit, or reach into libcoll's internals.
 */
#include "comm/backend.h"
#include "base/util.h"

#include <stdlib.h>
#include <string.h>

typedef struct coll_impl {
  coll_comm_t comm;
  int own;
  coll_stream_t streams[TRAIN_BACKEND_MAX_REQS];
  int busy[TRAIN_BACKEND_MAX_REQS];
  int next; /* round-robin: the oldest slot is reused first */
} coll_impl;

static int fail(train_backend *b, const char *what, coll_result r, const char *detail) {
  train_errf(b->err, "rank %d: libcoll %s failed: %s: %s", b->rank, what, coll_result_string(r),
             detail && *detail ? detail : "(no detail)");
  return -1;
}

static int cl_wait(train_backend *b, train_req req) {
  coll_impl *c = b->impl;
  if (req == TRAIN_REQ_DONE || !c->busy[req]) return 0;
  coll_result r = coll_stream_synchronize(c->streams[req]);
  c->busy[req] = 0;
  return r == COLL_OK ? 0 : fail(b, "wait", r, coll_comm_last_error(NULL));
}

static int cl_test(train_backend *b, train_req req) {
  coll_impl *c = b->impl;
  if (req == TRAIN_REQ_DONE || !c->busy[req]) return 1;
  coll_result r = coll_stream_query(c->streams[req]);
  if (r == COLL_IN_PROGRESS) return 0;
  c->busy[req] = 0;
  return r == COLL_OK ? 1 : fail(b, "test", r, coll_comm_last_error(NULL));
}

/* A free stream for the next request (waiting for the oldest one if all are taken). */
static int take_slot(train_backend *b, int *slot) {
  coll_impl *c = b->impl;
  int s = c->next;
  if (c->busy[s] && cl_wait(b, s) != 0) return -1;
  c->next = (s + 1) % TRAIN_BACKEND_MAX_REQS;
  c->busy[s] = 1;
  *slot = s;
  return 0;
}

static int started(train_backend *b, const char *what, int slot, coll_result r, train_req *req) {
  coll_impl *c = b->impl;
  if (r != COLL_OK) {
    c->busy[slot] = 0;
    return fail(b, what, r, coll_comm_last_error(c->comm));
  }
  *req = slot;
  return 0;
}

/* A reduction started on a free stream: all-reduce in place (send == recv) or
 * reduce-scatter, of `dt` elements. */
static int reduce_as(train_backend *b, const void *send, void *recv, size_t count, coll_dtype dt,
                     int scatter, train_reduce op, train_req *req, const char *what) {
  coll_impl *c = b->impl;
  coll_op o = op == TRAIN_REDUCE_AVG ? COLL_AVG : COLL_SUM;
  int s;
  if (take_slot(b, &s) != 0) return -1;
  coll_result r = scatter ? coll_reduce_scatter(send, recv, count, dt, o, c->comm, c->streams[s])
                          : coll_all_reduce(send, recv, count, dt, o, c->comm, c->streams[s]);
  return started(b, what, s, r, req);
}

static int cl_all_reduce(train_backend *b, float *buf, size_t count, train_reduce op,
                         train_req *req) {
  return reduce_as(b, buf, buf, count, COLL_FLOAT32, 0, op, req, "all_reduce");
}

static int cl_all_reduce_bf16(train_backend *b, uint16_t *buf, size_t count, train_reduce op,
                              train_req *req) {
  return reduce_as(b, buf, buf, count, COLL_BFLOAT16, 0, op, req, "all_reduce (bf16)");
}

static int cl_reduce_scatter(train_backend *b, const float *send, float *recv, size_t recvcount,
                             train_reduce op, train_req *req) {
  return reduce_as(b, send, recv, recvcount, COLL_FLOAT32, 1, op, req, "reduce_scatter");
}

static int cl_reduce_scatter_bf16(train_backend *b, const uint16_t *send, uint16_t *recv,
                                  size_t recvcount, train_reduce op, train_req *req) {
  return reduce_as(b, send, recv, recvcount, COLL_BFLOAT16, 1, op, req, "reduce_scatter (bf16)");
}

static int cl_all_gather(train_backend *b, const void *send, void *recv, size_t bytes,
                         train_req *req) {
  coll_impl *c = b->impl;
  int s;
  if (take_slot(b, &s) != 0) return -1;
  coll_result r = coll_all_gather(send, recv, bytes, COLL_UINT8, c->comm, c->streams[s]);
  return started(b, "all_gather", s, r, req);
}

static int cl_broadcast(train_backend *b, void *buf, size_t bytes, int root, train_req *req) {
  coll_impl *c = b->impl;
  int s;
  if (take_slot(b, &s) != 0) return -1;
  coll_result r = coll_broadcast(buf, buf, bytes, COLL_UINT8, root, c->comm, c->streams[s]);
  return started(b, "broadcast", s, r, req);
}

static int cl_all_to_all(train_backend *b, const void *send, void *recv, size_t bytes,
                         train_req *req) {
  coll_impl *c = b->impl;
  int s;
  if (take_slot(b, &s) != 0) return -1;
  coll_result r = coll_all_to_all(send, recv, bytes, COLL_UINT8, c->comm, c->streams[s]);
  return started(b, "all_to_all", s, r, req);
}

static int cl_all_to_allv(train_backend *b, const void *send, const size_t *sendbytes,
                          const size_t *sdispls, void *recv, const size_t *recvbytes,
                          const size_t *rdispls, train_req *req) {
  coll_impl *c = b->impl;
  int s;
  if (take_slot(b, &s) != 0) return -1;
  coll_result r = coll_all_to_allv(send, sendbytes, sdispls, recv, recvbytes, rdispls, COLL_UINT8,
                                   c->comm, c->streams[s]);
  return started(b, "all_to_allv", s, r, req);
}

static int cl_barrier(train_backend *b) {
  coll_impl *c = b->impl;
  coll_result r = coll_barrier(c->comm, NULL);
  return r == COLL_OK ? 0 : fail(b, "barrier", r, coll_comm_last_error(c->comm));
}

static int cl_exchange(train_backend *b, const train_p2p *ops, int n) {
  coll_impl *c = b->impl;
  /* libcoll runs a communicator's work in call order: the requests already started
   * finish first, so the exchange needs no wait of its own here */
  coll_result r = coll_group_start();
  if (r != COLL_OK) return fail(b, "group_start", r, coll_comm_last_error(c->comm));
  for (int i = 0; i < n && r == COLL_OK; i++)
    r = ops[i].send ? coll_send(ops[i].buf, ops[i].bytes, COLL_UINT8, ops[i].peer, c->comm, NULL)
                    : coll_recv(ops[i].buf, ops[i].bytes, COLL_UINT8, ops[i].peer, c->comm, NULL);
  coll_result e = coll_group_end(); /* always closes the group, even after a refused call */
  if (r != COLL_OK) return fail(b, "send/recv", r, coll_comm_last_error(c->comm));
  return e == COLL_OK ? 0 : fail(b, "group of send/recv", e, coll_comm_last_error(c->comm));
}

static int cl_exchange_start(train_backend *b, const train_p2p *ops, int n, train_req *req) {
  coll_impl *c = b->impl;
  int s;
  if (take_slot(b, &s) != 0) return -1;
  /* every call of the group on the slot's stream: coll_group_end enqueues them and
   * returns, and the stream reports their completion (cl_wait) */
  coll_result r = coll_group_start();
  if (r != COLL_OK) {
    c->busy[s] = 0;
    return fail(b, "group_start", r, coll_comm_last_error(c->comm));
  }
  for (int i = 0; i < n && r == COLL_OK; i++)
    r = ops[i].send
            ? coll_send(ops[i].buf, ops[i].bytes, COLL_UINT8, ops[i].peer, c->comm, c->streams[s])
            : coll_recv(ops[i].buf, ops[i].bytes, COLL_UINT8, ops[i].peer, c->comm, c->streams[s]);
  coll_result e = coll_group_end(); /* always closes the group, even after a refused call */
  return started(b, "send/recv (started)", s, r != COLL_OK ? r : e, req);
}

static int cl_trace_start(train_backend *b) {
  coll_impl *c = b->impl;
  coll_result r = coll_trace_start(c->comm);
  return r == COLL_OK ? 0 : fail(b, "trace_start", r, coll_comm_last_error(c->comm));
}

static int cl_trace_stop(train_backend *b) {
  coll_impl *c = b->impl;
  coll_result r = coll_trace_stop(c->comm);
  return r == COLL_OK ? 0 : fail(b, "trace_stop", r, coll_comm_last_error(c->comm));
}

static int cl_trace_read(train_backend *b, coll_trace_event *ev, size_t cap, size_t *n) {
  coll_impl *c = b->impl;
  coll_result r = coll_trace_read(c->comm, ev, cap, n);
  return r == COLL_OK ? 0 : fail(b, "trace_read", r, coll_comm_last_error(c->comm));
}

static int cl_split(train_backend *b, int color, int key, train_backend **out) {
  coll_impl *c = b->impl;
  coll_comm_t child = NULL;
  *out = NULL;
  coll_result r = coll_comm_split(c->comm, color, key, &child);
  if (r != COLL_OK) return fail(b, "comm_split", r, coll_comm_last_error(c->comm));
  if (!child) return 0;
  char err[TRAIN_ERRLEN];
  *out = train_backend_coll(child, 1, err);
  if (!*out) {
    coll_comm_destroy(child);
    train_errf(b->err, "rank %d: %s", b->rank, err);
    return -1;
  }
  return 0;
}

static void release(train_backend *b) {
  coll_impl *c = b->impl;
  free(c);
  free(b);
}

static int cl_destroy(train_backend *b) {
  coll_impl *c = b->impl;
  int rc = 0;
  for (int i = 0; i < TRAIN_BACKEND_MAX_REQS; i++)
    if (c->streams[i] && coll_stream_destroy(c->streams[i]) != COLL_OK) rc = -1;
  if (c->own && coll_comm_destroy(c->comm) != COLL_OK) rc = -1;
  release(b);
  return rc;
}

static void cl_abort(train_backend *b) {
  coll_impl *c = b->impl;
  coll_comm_abort(c->comm);
  /* coll_comm_abort returns once no thread is left inside libcoll, so nothing will touch
   * the streams again: free those whose work all finished (failed, mostly). A stream
   * with work that never ran stays allocated, since destroying it would wait forever. */
  for (int i = 0; i < TRAIN_BACKEND_MAX_REQS; i++)
    if (c->streams[i] && coll_stream_query(c->streams[i]) != COLL_IN_PROGRESS)
      coll_stream_destroy(c->streams[i]);
  release(b);
}

train_backend *train_backend_coll(coll_comm_t comm, int own, char *err) {
  train_backend *b = calloc(1, sizeof *b);
  coll_impl *c = calloc(1, sizeof *c);
  if (!b || !c) {
    free(b);
    free(c);
    train_errf(err, "out of memory for the libcoll backend");
    return NULL;
  }
  c->comm = comm;
  c->own = own;
  b->impl = c;
  b->name = "coll";
  if (coll_comm_rank(comm, &b->rank) != COLL_OK || coll_comm_size(comm, &b->nranks) != COLL_OK) {
    train_errf(err, "libcoll backend: %s", coll_comm_last_error(comm));
    release(b);
    return NULL;
  }
  for (int i = 0; i < TRAIN_BACKEND_MAX_REQS; i++)
    if (coll_stream_create(&c->streams[i]) != COLL_OK) {
      train_errf(err, "libcoll backend: %s", coll_comm_last_error(NULL));
      for (int j = 0; j < i; j++) coll_stream_destroy(c->streams[j]);
      release(b);
      return NULL;
    }
  b->all_reduce = cl_all_reduce;
  b->all_reduce_bf16 = cl_all_reduce_bf16;
  b->reduce_scatter_bf16 = cl_reduce_scatter_bf16;
  b->reduce_scatter = cl_reduce_scatter;
  b->all_gather = cl_all_gather;
  b->broadcast = cl_broadcast;
  b->all_to_all = cl_all_to_all;
  b->all_to_allv = cl_all_to_allv;
  b->barrier = cl_barrier;
  b->split = cl_split;
  b->exchange = cl_exchange;
  b->exchange_start = cl_exchange_start;
  b->test = cl_test;
  b->wait = cl_wait;
  b->destroy = cl_destroy;
  b->abort = cl_abort;
  b->trace_start = cl_trace_start;
  b->trace_stop = cl_trace_stop;
  b->trace_read = cl_trace_read;
  return b;
}

train_backend *train_backend_coll_from_env(char *err) {
  coll_comm_t comm;
  coll_result r = coll_comm_init_from_env(&comm);
  if (r != COLL_OK) {
    train_errf(err, "libcoll: cannot join the job from the environment: %s",
               coll_comm_last_error(NULL));
    return NULL;
  }
  train_backend *b = train_backend_coll(comm, 1, err);
  if (!b) coll_comm_destroy(comm);
  return b;
}
