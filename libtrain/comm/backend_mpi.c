/*
 * backend_mpi.c — the training backend over Open MPI's non-blocking collectives
 * (MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast) on
 * MPI_COMM_WORLD, for comparing libcoll with an established library on the same run, or
 * on a communicator split from it (MPI_Comm_split: tensor-parallel grids).
 *
 * MPI has no average: AVG is a SUM followed, when the request completes, by a division by
 * (float)nranks — the same final operation as libcoll's AVG, so the two agree bitwise
 * whenever their sums do. Open MPI progresses non-blocking collectives only inside MPI
 * calls, so test() (called by DDP after every layer of backward) is what moves them.
 *
 * Built only when meson finds Open MPI (ompi-c); must never print or exit.
 */
#include "comm/backend.h"
#include "base/util.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>

typedef struct mpi_slot {
  MPI_Request req;
  int busy;
  float *avg_buf; /* divide by nranks on completion (AVG), else NULL */
  size_t avg_count;
  int *v; /* all_to_allv: its int counts and offsets while in flight (freed by destroy) */
} mpi_slot;

typedef struct mpi_impl {
  mpi_slot slot[TRAIN_BACKEND_MAX_REQS];
  int next;
  MPI_Comm comm; /* MPI_COMM_WORLD, or a split of it (freed by destroy) */
} mpi_impl;

static int fail(train_backend *b, const char *what, int code) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  msg[0] = '\0';
  MPI_Error_string(code, msg, &len);
  train_errf(b->err, "rank %d: MPI %s failed: %s", b->rank, what, msg);
  return -1;
}

static void finish(train_backend *b, mpi_slot *s) {
  if (s->avg_buf) {
    float n = (float)b->nranks;
    for (size_t i = 0; i < s->avg_count; i++) s->avg_buf[i] /= n;
  }
  s->busy = 0;
  s->avg_buf = NULL;
}

static int mp_wait(train_backend *b, train_req req) {
  mpi_impl *p = b->impl;
  if (req == TRAIN_REQ_DONE || !p->slot[req].busy) return 0;
  int rc = MPI_Wait(&p->slot[req].req, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) {
    p->slot[req].busy = 0;
    return fail(b, "wait", rc);
  }
  finish(b, &p->slot[req]);
  return 0;
}

static int mp_test(train_backend *b, train_req req) {
  mpi_impl *p = b->impl;
  if (req == TRAIN_REQ_DONE || !p->slot[req].busy) return 1;
  int done = 0;
  int rc = MPI_Test(&p->slot[req].req, &done, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) {
    p->slot[req].busy = 0;
    return fail(b, "test", rc);
  }
  if (done) finish(b, &p->slot[req]);
  return done;
}

static int take_slot(train_backend *b, int *slot) {
  mpi_impl *p = b->impl;
  int s = p->next;
  if (p->slot[s].busy && mp_wait(b, s) != 0) return -1;
  p->next = (s + 1) % TRAIN_BACKEND_MAX_REQS;
  p->slot[s].busy = 1;
  p->slot[s].avg_buf = NULL;
  *slot = s;
  return 0;
}

static int started(train_backend *b, const char *what, int s, int rc, train_req *req) {
  mpi_impl *p = b->impl;
  if (rc != MPI_SUCCESS) {
    p->slot[s].busy = 0;
    return fail(b, what, rc);
  }
  *req = s;
  return 0;
}

static int mp_all_reduce(train_backend *b, float *buf, size_t count, train_reduce op,
                         train_req *req) {
  mpi_impl *p = b->impl;
  int s;
  if (count > (size_t)INT32_MAX) {
    train_errf(b->err, "rank %d: MPI all_reduce: count %zu does not fit an int", b->rank, count);
    return -1;
  }
  if (take_slot(b, &s) != 0) return -1;
  if (op == TRAIN_REDUCE_AVG) {
    p->slot[s].avg_buf = buf;
    p->slot[s].avg_count = count;
  }
  int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, p->comm,
                          &p->slot[s].req);
  return started(b, "Iallreduce", s, rc, req);
}

static int mp_reduce_scatter(train_backend *b, const float *send, float *recv, size_t recvcount,
                             train_reduce op, train_req *req) {
  mpi_impl *p = b->impl;
  int s;
  if (recvcount > (size_t)INT32_MAX) {
    train_errf(b->err, "rank %d: MPI reduce_scatter: count %zu does not fit an int", b->rank,
               recvcount);
    return -1;
  }
  if (take_slot(b, &s) != 0) return -1;
  if (op == TRAIN_REDUCE_AVG) {
    p->slot[s].avg_buf = recv;
    p->slot[s].avg_count = recvcount;
  }
  int rc = MPI_Ireduce_scatter_block(send, recv, (int)recvcount, MPI_FLOAT, MPI_SUM, p->comm,
                                     &p->slot[s].req);
  return started(b, "Ireduce_scatter_block", s, rc, req);
}

static int mp_all_gather(train_backend *b, const void *send, void *recv, size_t bytes,
                         train_req *req) {
  mpi_impl *p = b->impl;
  int s;
  if (bytes > (size_t)INT32_MAX) {
    train_errf(b->err, "rank %d: MPI all_gather: %zu bytes do not fit an int", b->rank, bytes);
    return -1;
  }
  if (take_slot(b, &s) != 0) return -1;
  int rc = MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, p->comm,
                          &p->slot[s].req);
  return started(b, "Iallgather", s, rc, req);
}

static int mp_all_to_all(train_backend *b, const void *send, void *recv, size_t bytes,
                         train_req *req) {
  mpi_impl *p = b->impl;
  int s;
  if (bytes > (size_t)INT32_MAX) {
    train_errf(b->err, "rank %d: MPI all_to_all: %zu bytes do not fit an int", b->rank, bytes);
    return -1;
  }
  if (take_slot(b, &s) != 0) return -1;
  int rc = MPI_Ialltoall(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, p->comm,
                         &p->slot[s].req);
  return started(b, "Ialltoall", s, rc, req);
}

static int mp_broadcast(train_backend *b, void *buf, size_t bytes, int root, train_req *req) {
  mpi_impl *p = b->impl;
  int s;
  if (bytes > (size_t)INT32_MAX) {
    train_errf(b->err, "rank %d: MPI broadcast: %zu bytes do not fit an int", b->rank, bytes);
    return -1;
  }
  if (take_slot(b, &s) != 0) return -1;
  int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, p->comm, &p->slot[s].req);
  return started(b, "Ibcast", s, rc, req);
}

/* MPI takes int counts and offsets: the arrays are converted into the slot's own, which
 * live until the request completes (MPI may read them until then). */
static int mp_all_to_allv(train_backend *b, const void *send, const size_t *sendbytes,
                          const size_t *sdispls, void *recv, const size_t *recvbytes,
                          const size_t *rdispls, train_req *req) {
  mpi_impl *p = b->impl;
  int n = b->nranks, s;
  for (int j = 0; j < n; j++)
    if (sendbytes[j] > (size_t)INT32_MAX || sdispls[j] > (size_t)INT32_MAX ||
        recvbytes[j] > (size_t)INT32_MAX || rdispls[j] > (size_t)INT32_MAX) {
      train_errf(b->err, "rank %d: MPI all_to_allv: sizes or offsets do not fit an int", b->rank);
      return -1;
    }
  if (take_slot(b, &s) != 0) return -1;
  mpi_slot *sl = &p->slot[s];
  free(sl->v);
  sl->v = malloc(4 * (size_t)n * sizeof(int));
  if (!sl->v) {
    sl->busy = 0;
    train_errf(b->err, "rank %d: MPI all_to_allv: out of memory for %d counts", b->rank, n);
    return -1;
  }
  int *sc = sl->v, *sd = sc + n, *rc = sd + n, *rd = rc + n;
  for (int j = 0; j < n; j++) {
    sc[j] = (int)sendbytes[j];
    sd[j] = (int)sdispls[j];
    rc[j] = (int)recvbytes[j];
    rd[j] = (int)rdispls[j];
  }
  int rc2 = MPI_Ialltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, p->comm, &sl->req);
  return started(b, "Ialltoallv", s, rc2, req);
}

static int mp_barrier(train_backend *b) {
  mpi_impl *p = b->impl;
  int rc = MPI_Barrier(p->comm);
  return rc == MPI_SUCCESS ? 0 : fail(b, "barrier", rc);
}

static int mp_exchange(train_backend *b, const train_p2p *ops, int n) {
  mpi_impl *p = b->impl;
  enum { MAX = 16 };
  MPI_Request rq[MAX];
  if (n > MAX) {
    train_errf(b->err, "rank %d: MPI exchange of %d transfers: at most %d at once", b->rank, n,
               MAX);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    if (ops[i].bytes > (size_t)INT32_MAX) {
      train_errf(b->err, "rank %d: MPI exchange: %zu bytes do not fit an int", b->rank,
                 ops[i].bytes);
      return -1;
    }
  }
  int posted = 0, rc = MPI_SUCCESS;
  /* the same tag for every transfer: MPI matches a pair of ranks' messages in order */
  for (; posted < n && rc == MPI_SUCCESS; posted++)
    rc = ops[posted].send ? MPI_Isend(ops[posted].buf, (int)ops[posted].bytes, MPI_BYTE,
                                      ops[posted].peer, 7, p->comm, &rq[posted])
                          : MPI_Irecv(ops[posted].buf, (int)ops[posted].bytes, MPI_BYTE,
                                      ops[posted].peer, 7, p->comm, &rq[posted]);
  if (rc != MPI_SUCCESS) posted--; /* the failed one posted nothing */
  int wrc = MPI_Waitall(posted, rq, MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) return fail(b, "Isend/Irecv", rc);
  return wrc == MPI_SUCCESS ? 0 : fail(b, "Waitall", wrc);
}

static int mp_destroy(train_backend *b) {
  mpi_impl *p = b->impl;
  int rc = 0;
  for (int i = 0; i < TRAIN_BACKEND_MAX_REQS; i++)
    if (p->slot[i].busy && mp_wait(b, i) != 0) rc = -1;
  for (int i = 0; i < TRAIN_BACKEND_MAX_REQS; i++) free(p->slot[i].v);
  if (p->comm == MPI_COMM_WORLD)
    MPI_Finalize();
  else
    MPI_Comm_free(&p->comm);
  free(p);
  free(b);
  return rc;
}

static void mp_abort(train_backend *b) {
  MPI_Abort(MPI_COMM_WORLD, 1);
  free(b->impl);
  free(b);
}

static train_backend *wrap(MPI_Comm comm, char *err);

static int mp_split(train_backend *b, int color, int key, train_backend **out) {
  mpi_impl *p = b->impl;
  MPI_Comm nc = MPI_COMM_NULL;
  *out = NULL;
  int rc = MPI_Comm_split(p->comm, color < 0 ? MPI_UNDEFINED : color, key, &nc);
  if (rc != MPI_SUCCESS) return fail(b, "Comm_split", rc);
  if (nc == MPI_COMM_NULL) return 0;
  MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
  char err[TRAIN_ERRLEN];
  *out = wrap(nc, err);
  if (!*out) {
    MPI_Comm_free(&nc);
    train_errf(b->err, "rank %d: %s", b->rank, err);
    return -1;
  }
  return 0;
}

static train_backend *wrap(MPI_Comm comm, char *err) {
  train_backend *b = calloc(1, sizeof *b);
  mpi_impl *p = calloc(1, sizeof *p);
  if (!b || !p) {
    free(b);
    free(p);
    train_errf(err, "out of memory for the MPI backend");
    return NULL;
  }
  p->comm = comm;
  b->impl = p;
  b->name = "mpi";
  MPI_Comm_rank(comm, &b->rank);
  MPI_Comm_size(comm, &b->nranks);
  b->all_reduce = mp_all_reduce;
  b->reduce_scatter = mp_reduce_scatter;
  b->all_gather = mp_all_gather;
  b->broadcast = mp_broadcast;
  b->all_to_all = mp_all_to_all;
  b->all_to_allv = mp_all_to_allv;
  b->barrier = mp_barrier;
  b->test = mp_test;
  b->wait = mp_wait;
  b->split = mp_split;
  b->exchange = mp_exchange;
  b->destroy = mp_destroy;
  b->abort = mp_abort;
  return b;
}

int train_backend_mpi_built(void) { return 1; }

train_backend *train_backend_mpi(char *err) {
  if (!getenv("OMPI_COMM_WORLD_SIZE")) {
    train_errf(err, "MPI backend: not started by Open MPI's mpirun (OMPI_COMM_WORLD_SIZE "
                    "is not set); run under mpirun.openmpi");
    return NULL;
  }
  int provided = 0;
  if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    train_errf(err, "MPI backend: MPI_Init_thread failed");
    return NULL;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  train_backend *b = wrap(MPI_COMM_WORLD, err);
  if (!b) MPI_Finalize();
  return b;
}
