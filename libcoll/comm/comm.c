/* comm.c — communicator lifetime: init (from an id or from the launcher's environment),
 * destroy and abort, and connecting a peer on first use.
 *
 * Init is: join the rendezvous, set up the transports this rank may need and its watch
 * listener, exchange (pid, host, transport info, watch address) in one round, start the
 * watch (watch.c: failures anywhere reach this rank at once), pick each peer's transport
 * (same host: shm, else ib where both ends have a port, else tcp; COLL_TRANSPORT=
 * shm|tcp|ib forces one; the rule is coll_select_transport in select.c) and connect the
 * eager one (shm) now — a lazy one (tcp, ib) keeps the peer's blob and is connected by
 * coll_comm_use_peer when the executor first needs that peer, which is also when shm's
 * FIFO pages for that peer become resident (warm) — meet again so that
 * every rank has mapped everything, let the transports finish (shm unlinks its segment, tcp starts
 * its proxy), start the progress thread, tune.  No CUDA call: the communicator gets its device
 * table (comm->dev, kernels/device_ops.h) here — cuda/'s, asked through device_cuda.h, the one
 * thing comm/ may ask of cuda/ (layers.rules), or the host table — and its device path is set
 * up by its first call on device memory, through that table.  The rendezvous is the TCP bootstrap
 * for a new job (coll_comm_build) or the parent communicator for a split (split.c):
 * coll_comm_build_rv only sees its two allgather rounds.  After init nothing talks to the
 * rendezvous again. Must never leave a half-built communicator behind: a failure frees everything
 * it made, shared segments included, tells the rendezvous and the watch why, and marks it aborted
 * so that peers already connected fail fast.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "algo.h"
#include "bootstrap_wire.h"
#include "coll_config.h"
#include "ib_wire.h"
#include "bootstrap.h"
#include "device_cuda.h"
#include "device_ops.h"
#include "internal.h"
#include "watch.h"
#if COLL_HAVE_IBVERBS
#include "ib.h"
#endif

typedef struct {
  int32_t pid;
  uint32_t pad;
  uint64_t host_id;
  uint8_t blob[COLL_MAX_TRANSPORTS][COLL_CONN_BLOB]; /* per transport, by COLL_T_* */
  coll_sockaddr_packed watch;                        /* where the watch link listens (watch.c) */
  cpu_set_t cpus;                                    /* the CPUs this rank may run on */
} rank_info;
_Static_assert(sizeof(rank_info) <= COLL_RV_MAX_BYTES, "a rendezvous round carries a rank_info");

/* The CPUs this rank may run on (its affinity: taskset, a cgroup's cpuset, the
 * launcher's binding); every online CPU when the kernel will not say. */
static void my_cpus(cpu_set_t *set) {
  if (sched_getaffinity(0, sizeof *set, set) == 0 && CPU_COUNT(set) > 0) return;
  CPU_ZERO(set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  for (long c = 0; c < n && c < CPU_SETSIZE; c++) CPU_SET((int)c, set);
}

/* How many cores this host's ranks have among them: the CPUs in the union of their
 * affinities.  Not the machine's online CPUs: 4 ranks under `taskset -c 0,1` or in a
 * container given 2 CPUs of 64 share 2 cores, and a wait that spins there burns the
 * time slice the peer it waits for needs (2 ranks on one CPU of this VM: a 1 MiB ring
 * all-reduce took 561 us spinning, 136 us yielding: lab/perf-log.md).  Every rank of the host
 * computes it from the same exchange, so they agree (shm sizes its slots by it). */
static int host_cores(const rank_info *all, int nranks, uint64_t host) {
  cpu_set_t u;
  CPU_ZERO(&u);
  for (int p = 0; p < nranks; p++)
    if (all[p].host_id == host) CPU_OR(&u, &u, &all[p].cpus);
  return CPU_COUNT(&u);
}

/* The other processes of this host's ranks that may run on this rank's CPU (backoff.c's
 * mates): known only when this rank may run on one CPU and every other rank of the host
 * may run on exactly that CPU too or not on it at all; a rank whose affinity only
 * overlaps it comes and goes, and then nobody can tell whose a long yield was.  Ranks in
 * this process are covered by its own clock. */
static void cpu_mates(const rank_info *all, int nranks, int rank, bool oversubscribed,
                      coll_cpu_mates *m) {
  memset(m, 0, sizeof *m);
  m->oversubscribed = oversubscribed;
  const cpu_set_t *mine = &all[rank].cpus;
  if (CPU_COUNT(mine) != 1) return;
  for (int p = 0; p < nranks; p++) {
    if (all[p].host_id != all[rank].host_id || all[p].pid == all[rank].pid) continue;
    cpu_set_t both;
    CPU_AND(&both, mine, &all[p].cpus);
    if (CPU_COUNT(&both) == 0) continue; /* never on this CPU */
    if (!CPU_EQUAL(&all[p].cpus, mine) || m->n == COLL_CPU_MATES_MAX ||
        clock_getcpuclockid(all[p].pid, &m->clock[m->n]) != 0)
      return;
    m->n++;
  }
  m->known = true;
}

/* COLL_TRANSPORT=auto|shm|tcp|ib: auto (the default) is shm within a host, ib across
 * where both ends have an InfiniBand/RoCE port, else tcp. */
static coll_result read_transport_mode(struct coll_comm *comm, coll_transport_mode *mode) {
  const char *e = getenv("COLL_TRANSPORT");
  if (!coll_parse_transport_mode(e, mode))
    return coll_fail(comm, COLL_ERR_INVALID_ARG,
                     "rank %d: COLL_TRANSPORT=%s is not a transport of this build (auto, shm, "
                     "tcp, ib)",
                     comm->rank, e);
  return COLL_OK;
}

/* Can this rank use InfiniBand?  False, with the reason, when there is no device or the
 * build has no libibverbs. */
static bool ib_usable(char *why, size_t len) {
#if COLL_HAVE_IBVERBS
  return coll_ib_probe(why, len);
#else
  snprintf(why, len, "this libcoll was built without libibverbs");
  return false;
#endif
}

/* Same hostname and same boot => same machine (containers with one hostname on two
 * machines differ in boot_id).  COLL_HOST_ID=name replaces both (as NCCL_HOSTID does):
 * ranks with the same name are one host (shared memory between them, the host-aware
 * algorithms group them), ranks with different names are different hosts (the network
 * between them) — for clusters whose nodes share a hostname, or to split one machine
 * into several "hosts" (the local launcher's COLL_LAUNCH_RANKS_PER_HOST sets it). */
static uint64_t host_id(void) {
  char buf[320] = {0};
  const char *forced = getenv("COLL_HOST_ID");
  if (forced && *forced) {
    snprintf(buf, sizeof buf, "COLL_HOST_ID=%s", forced);
    uint64_t h = 1469598103934665603ull;
    for (const char *p = buf; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return h;
  }
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

coll_comm_end coll_comm_ending(struct coll_comm *comm) {
  if (atomic_load(&comm->aborted)) return COLL_END_ABORTED;
  return comm->sticky == COLL_OK ? COLL_END_CLEAN : COLL_END_FAILED;
}

/* What the transports see of comm (transport.h): what is known at creation; the rest is
 * filled in as it becomes known (local_len after the join, oversubscribed after the
 * exchange, cuda_device by cuda.c). */
static void view_init(struct coll_comm *comm) {
  comm->view = (coll_comm_view){.rank = comm->rank,
                                .nranks = comm->nranks,
                                .secret = comm->secret,
                                .host_ids = comm->host_ids,
                                .pids = comm->pids,
                                .timeout_ms = comm->timeout_ms,
                                .mates = &comm->mates,
                                .aborted = &comm->aborted,
                                .local = &comm->boot_local,
                                .cuda_device = -1,
                                .owner = comm};
}

void coll_comm_free(struct coll_comm *comm) {
  if (!comm) return;
  coll_exec_stop(comm);
  coll_watch_stop(comm, atomic_load(&comm->aborted) ? COLL_WATCH_ABORT : COLL_WATCH_BYE);
  comm->dev->comm_free(comm, coll_comm_ending(comm));
  coll_trace_free(comm);
  coll_comm_end how = coll_comm_ending(comm);
  for (int t = 0; t < COLL_MAX_TRANSPORTS; t++)
    if (comm->transports[t] && comm->transport_ctxs[t])
      comm->transports[t]->close(&comm->view, comm->transport_ctxs[t], how);
  free(comm->conn_send);
  free(comm->conn_recv);
  free(comm->peer_t);
  free(comm->peer_warm);
  free(comm->peer_blob);
  pthread_mutex_destroy(&comm->connmu);
  free(comm->pids);
  free(comm->host_ids);
  free(comm->host_layout);
  free(comm->mb_seen);
  free(comm->mb);
  free(comm->mb_waiters);
  coll_windows_free(comm);
  pthread_mutex_destroy(&comm->winmu);
  free(comm->direct_scratch);
  free(comm->direct_addrs);
  free(comm->direct_got);
  pthread_mutex_destroy(&comm->qmu);
  pthread_cond_destroy(&comm->qcv);
  pthread_cond_destroy(&comm->donecv);
  pthread_mutex_destroy(&comm->errmu);
  free(comm);
}

/* Handed to the layers below in every communicator (internal.h). */
static const coll_comm_hooks comm_hooks = {
    .use_peer = coll_comm_use_peer,
    .attention = coll_watch_attention,
    .doomed = coll_watch_check,
    .failed = coll_watch_failed,
    .window_find = coll_window_find,
    .window_peer = coll_window_peer,
};

coll_result coll_comm_build_rv(coll_comm_t *out, int nranks, int rank,
                               const uint8_t secret[COLL_SECRET_BYTES], coll_rendezvous *rv) {
  struct coll_comm *comm = calloc(1, sizeof *comm);
  if (comm) comm->hooks = &comm_hooks;
  /* The device back end, once, before anything can fail (coll_comm_free calls it): CUDA's
   * table in a build with CUDA — COLL_CUDA=off, no driver or no GPU are decided inside it,
   * lazily and once per process, as a creation that makes no CUDA call must leave them —
   * else the host table.  Asking is no CUDA call. */
  const coll_device_ops *cuda = coll_cuda_device();
  if (comm) comm->dev = cuda ? cuda : &coll_device_host;
  if (!comm) {
    rv->leave(rv);
    return coll_fail(NULL, COLL_ERR_SYSTEM, "out of memory creating a communicator");
  }
  pthread_mutex_init(&comm->qmu, NULL);
  pthread_cond_init(&comm->qcv, NULL);
  pthread_cond_init(&comm->donecv, NULL);
  pthread_mutex_init(&comm->errmu, NULL);
  pthread_mutex_init(&comm->winmu, NULL);
  pthread_mutex_init(&comm->connmu, NULL);
  comm->rank = rank;
  comm->nranks = nranks;
  comm->timeout_ms = coll_env_timeout_ms();
  {
    long sb;
    if (!coll_env_int("COLL_NT_BYTES", COLL_NT_DEFAULT, &sb) || sb < 0) sb = COLL_NT_DEFAULT;
    comm->nt_bytes = (size_t)sb;
  }
  comm->check = coll_check_from_env();
  memcpy(comm->secret, secret, COLL_SECRET_BYTES);
  comm->pids = calloc((size_t)nranks, sizeof *comm->pids);
  comm->host_ids = calloc((size_t)nranks, sizeof *comm->host_ids);
  comm->host_layout = calloc(3 * (size_t)nranks, sizeof *comm->host_layout);
  comm->conn_send = calloc((size_t)nranks, sizeof *comm->conn_send);
  comm->conn_recv = calloc((size_t)nranks, sizeof *comm->conn_recv);
  comm->peer_t = malloc((size_t)nranks);
  comm->peer_warm = calloc(2 * (size_t)nranks, sizeof *comm->peer_warm);
  comm->peer_blob = calloc((size_t)nranks, COLL_CONN_BLOB);
  if (comm->peer_t) memset(comm->peer_t, -1, (size_t)nranks);
  comm->mb_seen = calloc((size_t)nranks, sizeof *comm->mb_seen);
  comm->windows = calloc(COLL_MAX_WINDOWS, sizeof *comm->windows);
  view_init(comm);
  rank_info *all = calloc((size_t)nranks, sizeof *all);
  coll_result r = COLL_OK;
  bool left = false; /* rv->leave called */
  if (!comm->pids || !comm->host_ids || !comm->host_layout || !comm->conn_send ||
      !comm->conn_recv || !comm->peer_t || !comm->peer_warm || !comm->peer_blob || !comm->mb_seen ||
      !comm->windows || !all) {
    r = coll_fail(comm, COLL_ERR_SYSTEM, "out of memory creating a communicator of %d ranks",
                  nranks);
    goto fail;
  }
  /* Joining sets boot_local: the route to the others tells TCP which local address
   * peers can reach. */
  if ((r = rv->join(rv, comm)) != COLL_OK) goto fail;
  comm->view.local_len = comm->boot_local_len;
  coll_transport_mode mode;
  if ((r = read_transport_mode(comm, &mode)) != COLL_OK) goto fail;
  char ib_why[256] = "";
  bool ib_here = (mode == COLL_MODE_AUTO || mode == COLL_MODE_IB) &&
                 ib_usable(ib_why, sizeof ib_why);
  if (mode == COLL_MODE_IB && !ib_here) {
    r = coll_fail(comm, COLL_ERR_UNSUPPORTED,
                  "rank %d: COLL_TRANSPORT=ib, but this rank cannot "
                  "use InfiniBand: %s (unset COLL_TRANSPORT to fall back to shm/tcp)",
                  rank, ib_why);
    goto fail;
  }
  /* Set up every transport this rank might need before the exchange: which peers are
   * remote is only known after it. */
  comm->ntransports = COLL_MAX_TRANSPORTS;
  comm->transports[COLL_T_SHM] = mode == COLL_MODE_AUTO || mode == COLL_MODE_SHM
                                     ? &coll_transport_shm
                                     : NULL;
  comm->transports[COLL_T_TCP] = mode == COLL_MODE_AUTO || mode == COLL_MODE_TCP
                                     ? &coll_transport_tcp
                                     : NULL;
#if COLL_HAVE_IBVERBS
  comm->transports[COLL_T_IB] = ib_here ? &coll_transport_ib : NULL;
#endif
  rank_info me = {.pid = (int32_t)getpid(), .host_id = host_id()};
  my_cpus(&me.cpus);
  comm->host_ids[rank] = me.host_id; /* setup may ask can_connect before the round */
  for (int t = 0; t < COLL_MAX_TRANSPORTS; t++) {
    if (!comm->transports[t]) continue;
    r = comm->transports[t]->setup(&comm->view, &comm->transport_ctxs[t], me.blob[t]);
    if (r != COLL_OK && t == COLL_T_IB && mode == COLL_MODE_AUTO) {
      /* A device that probed fine but cannot be set up: go on without it (peers see no
       * port in this rank's blob and pick tcp). */
      COLL_WARN(rank, "InfiniBand setup failed, going on over shm/tcp: %s", comm->errbuf);
      comm->transports[t]->close(&comm->view, comm->transport_ctxs[t], COLL_END_FAILED);
      comm->transport_ctxs[t] = NULL;
      comm->transports[t] = NULL;
      memset(me.blob[t], 0, sizeof me.blob[t]);
      ib_here = false;
      r = COLL_OK;
    }
    if (r != COLL_OK) goto fail;
  }
  /* The executor cuts every step into slices of one slot: start from the smallest
   * largest-slot of the transports set up; eager connectors may lower it below. */
  for (int t = 0; t < COLL_MAX_TRANSPORTS; t++)
    if (comm->transports[t] &&
        (comm->slot_bytes == 0 || comm->transports[t]->slot_bytes < comm->slot_bytes))
      comm->slot_bytes = comm->transports[t]->slot_bytes;
  /* No CUDA call here: the device path is set up by the first call on device memory. */
  if ((r = comm->dev->comm_setup(comm)) != COLL_OK) goto fail;
  if ((r = coll_watch_listen(comm, &me.watch)) != COLL_OK) goto fail;
  if ((r = rv->allgather(rv, comm, &me, all, sizeof me)) != COLL_OK) goto fail;
  /* From here a failure on any rank reaches every other rank at once (watch.c). */
  if ((r = coll_watch_start(comm, &all[(rank + 1) % nranks].watch)) != COLL_OK) goto fail;
  for (int p = 0; p < nranks; p++) {
    comm->pids[p] = all[p].pid;
    comm->host_ids[p] = all[p].host_id;
    comm->local_ranks += all[p].host_id == me.host_id;
  }
  coll_hosts_build(comm->host_ids, nranks, comm->host_layout, comm->host_layout + nranks,
                   comm->host_layout + 2 * (size_t)nranks, &comm->hosts);
  {
    int cores = host_cores(all, nranks, me.host_id);
    comm->cores = cores;
    comm->oversubscribed = cores > 0 && comm->local_ranks > cores;
    comm->view.oversubscribed = comm->oversubscribed;
    cpu_mates(all, nranks, rank, comm->oversubscribed, &comm->mates);
  }
  int uses[COLL_MAX_TRANSPORTS] = {0};
  for (int p = 0; p < nranks; p++) {
    if (p == rank) continue;
    bool same_host = all[p].host_id == me.host_id;
    coll_ib_port_info pi;
    char pwhy[160] = "";
    bool ib_peer = coll_ib_port_decode(all[p].blob[COLL_T_IB], COLL_CONN_BLOB, &pi, pwhy,
                                       sizeof pwhy);
    int t = coll_select_transport(mode, same_host, ib_here, ib_peer);
    if (t < 0 && mode == COLL_MODE_SHM) {
      r = coll_fail(comm, COLL_ERR_UNSUPPORTED,
                    "rank %d: COLL_TRANSPORT=shm, but rank %d runs on another host: shared "
                    "memory cannot reach it (unset COLL_TRANSPORT or set it to tcp)",
                    rank, p);
      goto fail;
    }
    if (t < 0 || !comm->transports[t]) {
      r = coll_fail(comm, COLL_ERR_UNSUPPORTED,
                    "rank %d: COLL_TRANSPORT=ib, but rank %d cannot use InfiniBand (%s)", rank, p,
                    pwhy);
      goto fail;
    }
    uses[t]++;
    if (comm->transports[t]->lazy) { /* connected when first needed (coll_comm_use_peer) */
      comm->peer_t[p] = (int8_t)t;
      memcpy(comm->peer_blob + (size_t)p * COLL_CONN_BLOB, all[p].blob[t], COLL_CONN_BLOB);
      continue;
    }
    if ((r = comm->transports[t]->connect(&comm->view, comm->transport_ctxs[t], p, all[p].blob[t],
                                          &comm->conn_send[p], &comm->conn_recv[p])) != COLL_OK)
      goto fail;
  }
  /* The executor cuts every step into slices of one slot: the smallest slot in use. */
  for (int p = 0; p < nranks; p++)
    if (comm->conn_send[p] && comm->conn_send[p]->slot_bytes < comm->slot_bytes)
      comm->slot_bytes = comm->conn_send[p]->slot_bytes;
  int most = -1;
  for (int t = 0; t < COLL_MAX_TRANSPORTS; t++)
    if (comm->transports[t] && (most < 0 || uses[t] > uses[most])) most = t;
  comm->transport = comm->transports[most];
  /* The one-shot path needs every peer's mailbox mapped: one host, all shm. */
  comm->mailboxes = nranks > 1 && uses[COLL_T_SHM] == nranks - 1;
  /* Second round: everyone has mapped everyone's segment, so names can go.  Each rank's
   * slot goes with it and all take the least: the executor cuts every step into slices of
   * one slot, and the two ends of a connection must cut alike.  Ranks can differ: one
   * alone on its host has only tcp peers (256 KiB slots) where ranks with shm peers too
   * took shm's 64 KiB (2 + 1 ranks on two hosts failed with "received a 65536-byte
   * slice ... but expected 262144"). */
  {
    uint64_t mine = comm->slot_bytes, *slots = calloc((size_t)nranks, sizeof *slots);
    if (!slots) {
      r = coll_fail(comm, COLL_ERR_SYSTEM, "out of memory");
      goto fail;
    }
    r = rv->allgather(rv, comm, &mine, slots, sizeof mine);
    for (int p = 0; r == COLL_OK && p < nranks; p++)
      if (slots[p] > 0 && slots[p] < comm->slot_bytes) comm->slot_bytes = (size_t)slots[p];
    free(slots);
    if (r != COLL_OK) goto fail;
  }
  for (int t = 0; t < COLL_MAX_TRANSPORTS; t++)
    if (comm->transports[t] &&
        (r = comm->transports[t]->ready(&comm->view, comm->transport_ctxs[t])) != COLL_OK)
      goto fail;
  if ((r = coll_oneshot_setup(comm)) != COLL_OK) goto fail;
  rv->leave(rv);
  left = true;
  if ((r = coll_exec_start(comm)) != COLL_OK) goto fail;
  if ((r = coll_tune_init(comm)) != COLL_OK) goto fail;
  atomic_store(&comm->ready, 1); /* peers' refused calls concern this rank from now on */
  free(all);
  COLL_INFO(rank, "communicator ready: %d ranks, transport %s, slot %zu bytes", nranks,
            comm->transport->name, comm->slot_bytes);
  *out = comm;
  return COLL_OK;

fail:
  /* Peers hear why at once: through the rendezvous while it is open, and through the
   * watch once it runs (a failure on the way out of init, e.g. in the tuner). */
  if (!left && rv->fail) rv->fail(rv, comm);
  coll_watch_stop(comm, COLL_WATCH_FAILED);
  if (!left) rv->leave(rv);
  free(all);
  /* Keep the sentence for the caller: it has no communicator to ask. */
  coll_fail(NULL, r, "%s", comm->errbuf);
  /* Peers already connected to us learn at once that we are gone (shm marks the
   * segment closed; tcp ends without a goodbye) instead of waiting for a timeout. */
  atomic_store(&comm->aborted, 1);
  coll_comm_free(comm);
  return r;
}

static coll_result connect_peer(struct coll_comm *comm, int p) {
  if (comm->conn_send[p]) return COLL_OK;
  int t = comm->peer_t[p];
  if (t < 0 || !comm->transports[t])
    return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: no transport reaches rank %d", comm->rank,
                     p);
  coll_conn *send = NULL, *recv = NULL;
  coll_result r = comm->transports[t]->connect(&comm->view, comm->transport_ctxs[t], p,
                                               comm->peer_blob + (size_t)p * COLL_CONN_BLOB, &send,
                                               &recv);
  if (r != COLL_OK) return r;
  /* Published under connmu: coll_exec_wake_all (another thread) walks these arrays. */
  pthread_mutex_lock(&comm->connmu);
  comm->conn_recv[p] = recv;
  comm->conn_send[p] = send;
  pthread_mutex_unlock(&comm->connmu);
  COLL_INFO(comm->rank, "connected to rank %d (%s) on first use", p, comm->transports[t]->name);
  return COLL_OK;
}

coll_result coll_comm_use_peer(struct coll_comm *comm, int p, int dir, size_t bytes) {
  if (p < 0 || p == comm->rank || coll_comm_peer_ready(comm, p, dir, bytes)) return COLL_OK;
  if (bytes == 0) bytes = 1; /* connected, nothing resident yet: 1 marks it */
  uint32_t *have = &comm->peer_warm[2 * (size_t)p + (size_t)dir];
  coll_result r = connect_peer(comm, p);
  if (r != COLL_OK) return r;
  coll_conn *c = dir == COLL_USE_SEND ? comm->conn_send[p] : comm->conn_recv[p];
  if (bytes > c->slot_bytes) bytes = c->slot_bytes;
  if (c->t->warm && (r = c->t->warm(&comm->view, c, *have, bytes)) != COLL_OK) return r;
  *have = (uint32_t)bytes;
  return COLL_OK;
}

/* ---- the TCP bootstrap as a rendezvous ------------------------------------------- */

typedef struct {
  const coll_id_fields *f;
  coll_bootstrap b;
} boot_rv;

static coll_result boot_join(coll_rendezvous *rv, struct coll_comm *comm) {
  boot_rv *x = rv->ctx;
  coll_result r = coll_bootstrap_connect(comm, &x->b, x->f, comm->rank, comm->nranks);
  if (r != COLL_OK) return r;
  memcpy(&comm->boot_local, &x->b.local, sizeof comm->boot_local);
  comm->boot_local_len = x->b.local_len;
  return COLL_OK;
}

static coll_result boot_allgather(coll_rendezvous *rv, struct coll_comm *comm, const void *mine,
                                  void *all, size_t len) {
  boot_rv *x = rv->ctx;
  return coll_bootstrap_allgather(comm, &x->b, mine, all, len);
}

static void boot_fail(coll_rendezvous *rv, struct coll_comm *comm) {
  boot_rv *x = rv->ctx;
  coll_bootstrap_fail(comm, &x->b);
}

static void boot_leave(coll_rendezvous *rv) {
  boot_rv *x = rv->ctx;
  coll_bootstrap_close(&x->b);
}

coll_result coll_comm_build(coll_comm_t *out, int nranks, const coll_id_fields *f, int rank) {
  boot_rv x = {.f = f};
  coll_ring_link_init(&x.b.link, 0, f->secret, rank, nranks); /* closed even if join fails */
  coll_rendezvous rv = {.join = boot_join,
                        .allgather = boot_allgather,
                        .leave = boot_leave,
                        .fail = boot_fail,
                        .ctx = &x};
  return coll_comm_build_rv(out, nranks, rank, f->secret, &rv);
}

coll_result coll_comm_init_rank(coll_comm_t *comm, int nranks, coll_unique_id id, int rank) {
  if (!comm) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_comm_init_rank: comm is NULL");
  *comm = NULL;
  if (nranks < 1 || (unsigned)nranks > COLL_MAX_RANKS)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_comm_init_rank: nranks is %d, must be 1..%u",
                     nranks, COLL_MAX_RANKS);
  if (rank < 0 || rank >= nranks)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_comm_init_rank: rank %d is outside 0..%d",
                     rank, nranks - 1);
  coll_id_fields f;
  char why[200];
  coll_result r = coll_id_decode(&id, &f, why, sizeof why);
  if (r != COLL_OK) return coll_fail(NULL, r, "coll_comm_init_rank: %s", why);
  return coll_comm_build(comm, nranks, &f, rank);
}

coll_result coll_comm_close(struct coll_comm *comm) {
  /* coll_exec_stop drains the queue first.  Errors met by queued work were already
   * reported through its stream; destroying a failed communicator succeeds.  With
   * COLL_TRACE=FILE.json the ranks first gather their traces (a collective step). */
  coll_trace_flush_json(comm);
  coll_comm_free(comm);
  return COLL_OK;
}

coll_result coll_comm_abort_close(struct coll_comm *comm) {
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

coll_result coll_comm_set_timeout(coll_comm_t comm, int ms) {
  if (!comm) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_comm_set_timeout: comm is NULL");
  if (ms < 0)
    return coll_fail(comm, COLL_ERR_INVALID_ARG,
                     "rank %d: coll_comm_set_timeout: %d ms is negative (0 means never)",
                     comm->rank, ms);
  comm->timeout_ms = ms;
  return COLL_OK;
}
