/* comm.c — communicator lifetime: init (from an id or from the launcher's environment),
 * destroy and abort.
 *
 * Init is: join the bootstrap, set up the transports this rank may need, exchange (pid,
 * host, transport info) in one round, connect each peer with its transport (same host:
 * shm, else tcp; COLL_TRANSPORT=shm|tcp forces one), meet again so that every rank has
 * connected everything, let the transports finish (shm unlinks its segment, tcp accepts
 * and starts its proxy), start the progress thread.  After init nothing
 * talks to the bootstrap again.  Must never leave a half-built communicator behind: a
 * failure frees everything it made, shared segments included.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap_wire.h"
#include "internal.h"

typedef struct {
  int32_t pid;
  uint32_t pad;
  uint64_t host_id;
  uint8_t blob[COLL_MAX_TRANSPORTS][COLL_CONN_BLOB]; /* per transport, [0] shm [1] tcp */
} rank_info;

typedef enum { MODE_AUTO, MODE_SHM, MODE_TCP } transport_mode;

/* COLL_TRANSPORT=auto|shm|tcp: auto (the default) is shm within a host, tcp across. */
static coll_result read_transport_mode(struct coll_comm *comm, transport_mode *mode) {
  const char *e = getenv("COLL_TRANSPORT");
  *mode = MODE_AUTO;
  if (!e || !*e || strcmp(e, "auto") == 0) return COLL_OK;
  if (strcmp(e, "shm") == 0) *mode = MODE_SHM;
  else if (strcmp(e, "tcp") == 0) *mode = MODE_TCP;
  else
    return coll_fail(comm, COLL_ERR_INVALID_ARG,
                     "rank %d: COLL_TRANSPORT=%s is not a transport of this build (auto, shm, "
                     "tcp)", comm->rank, e);
  return COLL_OK;
}

/* Same hostname and same boot => same machine (containers with one hostname on two
 * machines differ in boot_id). */
static uint64_t host_id(void) {
  char buf[320] = {0};
  gethostname(buf, 255);
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    size_t n = strlen(buf);
    if (!fgets(buf + n, (int)(sizeof buf - n), f)) buf[n] = 0;
    fclose(f);
  }
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const char *p = buf; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
  return h;
}

void coll_comm_free(struct coll_comm *comm) {
  if (!comm) return;
  coll_exec_stop(comm);
  coll_trace_free(comm);
  for (int t = 0; t < COLL_MAX_TRANSPORTS; t++)
    if (comm->transports[t] && comm->transport_ctxs[t])
      comm->transports[t]->close(comm, comm->transport_ctxs[t]);
  free(comm->conn_send);
  free(comm->conn_recv);
  free(comm->pids);
  free(comm->host_ids);
  pthread_mutex_destroy(&comm->qmu);
  pthread_cond_destroy(&comm->qcv);
  pthread_cond_destroy(&comm->donecv);
  pthread_mutex_destroy(&comm->errmu);
  free(comm);
}

coll_result coll_comm_build(coll_comm_t *out, int nranks, const coll_id_fields *f, int rank) {
  struct coll_comm *comm = calloc(1, sizeof *comm);
  if (!comm) return coll_fail(NULL, COLL_ERR_SYSTEM, "out of memory creating a communicator");
  pthread_mutex_init(&comm->qmu, NULL);
  pthread_cond_init(&comm->qcv, NULL);
  pthread_cond_init(&comm->donecv, NULL);
  pthread_mutex_init(&comm->errmu, NULL);
  comm->rank = rank;
  comm->nranks = nranks;
  comm->timeout_ms = coll_env_timeout_ms();
  comm->check = coll_check_from_env();
  memcpy(comm->secret, f->secret, COLL_SECRET_BYTES);
  comm->pids = calloc((size_t)nranks, sizeof *comm->pids);
  comm->host_ids = calloc((size_t)nranks, sizeof *comm->host_ids);
  comm->conn_send = calloc((size_t)nranks, sizeof *comm->conn_send);
  comm->conn_recv = calloc((size_t)nranks, sizeof *comm->conn_recv);
  rank_info *all = calloc((size_t)nranks, sizeof *all);
  coll_bootstrap b = {.fd = -1};
  coll_result r = COLL_OK;
  if (!comm->pids || !comm->host_ids || !comm->conn_send || !comm->conn_recv || !all) {
    r = coll_fail(comm, COLL_ERR_SYSTEM, "out of memory creating a communicator of %d ranks",
                  nranks);
    goto fail;
  }
  if ((r = coll_bootstrap_connect(comm, &b, f, rank, nranks)) != COLL_OK) goto fail;

  /* The route we took to the rendezvous tells TCP which local address peers can reach. */
  comm->boot_local_len = sizeof comm->boot_local;
  if (getsockname(b.fd, (struct sockaddr *)&comm->boot_local, &comm->boot_local_len) != 0)
    comm->boot_local_len = 0;
  transport_mode mode;
  if ((r = read_transport_mode(comm, &mode)) != COLL_OK) goto fail;
  /* Set up every transport this rank might need before the exchange: which peers are
   * remote is only known after it.  [0] shm, [1] tcp. */
  comm->ntransports = COLL_MAX_TRANSPORTS;
  comm->transports[0] = mode != MODE_TCP ? &coll_transport_shm : NULL;
  comm->transports[1] = mode != MODE_SHM ? &coll_transport_tcp : NULL;
  rank_info me = {.pid = (int32_t)getpid(), .host_id = host_id()};
  comm->host_ids[rank] = me.host_id; /* setup may ask can_connect before the round */
  for (int t = 0; t < COLL_MAX_TRANSPORTS; t++)
    if (comm->transports[t] &&
        (r = comm->transports[t]->setup(comm, &comm->transport_ctxs[t], me.blob[t])) != COLL_OK)
      goto fail;
  if ((r = coll_bootstrap_allgather(comm, &b, &me, all, sizeof me)) != COLL_OK) goto fail;
  for (int p = 0; p < nranks; p++) {
    comm->pids[p] = all[p].pid;
    comm->host_ids[p] = all[p].host_id;
    comm->local_ranks += all[p].host_id == me.host_id;
  }
  {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    comm->oversubscribed = cores > 0 && comm->local_ranks > cores;
  }
  int uses[COLL_MAX_TRANSPORTS] = {0};
  for (int p = 0; p < nranks; p++) {
    if (p == rank) continue;
    bool same_host = all[p].host_id == me.host_id;
    int t = mode == MODE_TCP ? 1 : mode == MODE_SHM ? 0 : same_host ? 0 : 1;
    if (t == 0 && !same_host) {
      r = coll_fail(comm, COLL_ERR_UNSUPPORTED,
                    "rank %d: COLL_TRANSPORT=shm, but rank %d runs on another host: shared "
                    "memory cannot reach it (unset COLL_TRANSPORT or set it to tcp)", rank, p);
      goto fail;
    }
    uses[t]++;
    if ((r = comm->transports[t]->connect(comm, comm->transport_ctxs[t], p, all[p].blob[t],
                                          &comm->conn_send[p], &comm->conn_recv[p])) != COLL_OK)
      goto fail;
  }
  /* The executor cuts every step into slices of one slot: the smallest slot in use. */
  for (int p = 0; p < nranks; p++)
    if (comm->conn_send[p] && comm->conn_send[p]->slot_bytes < comm->slot_bytes)
      comm->slot_bytes = comm->conn_send[p]->slot_bytes;
  comm->transport = comm->transports[uses[1] > uses[0] ? 1 : 0];
  if (!comm->transport) comm->transport = comm->transports[1];
  /* Second round: everyone has mapped everyone's segment, so names can go. */
  {
    uint8_t token = 1;
    uint8_t *tokens = calloc((size_t)nranks, 1);
    if (!tokens) {
      r = coll_fail(comm, COLL_ERR_SYSTEM, "out of memory");
      goto fail;
    }
    r = coll_bootstrap_allgather(comm, &b, &token, tokens, 1);
    free(tokens);
    if (r != COLL_OK) goto fail;
  }
  for (int t = 0; t < COLL_MAX_TRANSPORTS; t++)
    if (comm->transports[t] &&
        (r = comm->transports[t]->ready(comm, comm->transport_ctxs[t])) != COLL_OK)
      goto fail;
  coll_bootstrap_close(&b);
  if ((r = coll_exec_start(comm)) != COLL_OK) goto fail;
  free(all);
  COLL_INFO(rank, "communicator ready: %d ranks, transport %s, slot %zu bytes", nranks,
            comm->transport->name, comm->slot_bytes);
  *out = comm;
  return COLL_OK;

fail:
  coll_bootstrap_close(&b);
  free(all);
  /* Keep the sentence for the caller: it has no communicator to ask. */
  coll_fail(NULL, r, "%s", comm->errbuf);
  coll_comm_free(comm);
  return r;
}

coll_result coll_comm_init_rank(coll_comm_t *comm, int nranks, coll_unique_id id, int rank) {
  if (!comm) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_comm_init_rank: comm is NULL");
  *comm = NULL;
  if (nranks < 1 || (unsigned)nranks > COLL_MAX_RANKS)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG,
                     "coll_comm_init_rank: nranks is %d, must be 1..%u", nranks, COLL_MAX_RANKS);
  if (rank < 0 || rank >= nranks)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG,
                     "coll_comm_init_rank: rank %d is outside 0..%d", rank, nranks - 1);
  coll_id_fields f;
  char why[200];
  coll_result r = coll_id_decode(&id, &f, why, sizeof why);
  if (r != COLL_OK) return coll_fail(NULL, r, "coll_comm_init_rank: %s", why);
  return coll_comm_build(comm, nranks, &f, rank);
}

coll_result coll_comm_destroy(coll_comm_t comm) {
  if (!comm) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_comm_destroy: comm is NULL");
  /* coll_exec_stop drains the queue first.  Errors met by queued work were already
   * reported through its stream; destroying a failed communicator succeeds.  With
   * COLL_TRACE=FILE.json the ranks first gather their traces (a collective step). */
  coll_trace_flush_json(comm);
  coll_comm_free(comm);
  return COLL_OK;
}

coll_result coll_comm_abort(coll_comm_t comm) {
  if (!comm) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_comm_abort: comm is NULL");
  atomic_store(&comm->aborted, 1);
  coll_exec_wake_all(comm);
  /* Wait for every other thread to leave the library (each wait inside is cut into
   * short slices that look at the aborted flag, so this is bounded). */
  while (atomic_load(&comm->users) > 0) {
    coll_exec_wake_all(comm);
    struct timespec ts = {0, 1000000L};
    nanosleep(&ts, NULL);
  }
  coll_comm_free(comm);
  return COLL_OK;
}

coll_result coll_comm_rank(coll_comm_t comm, int *rank) {
  if (!comm || !rank)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_comm_rank: %s is NULL",
                     comm ? "rank" : "comm");
  *rank = comm->rank;
  return COLL_OK;
}

coll_result coll_comm_size(coll_comm_t comm, int *nranks) {
  if (!comm || !nranks)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_comm_size: %s is NULL",
                     comm ? "nranks" : "comm");
  *nranks = comm->nranks;
  return COLL_OK;
}
