/* ib.c — the InfiniBand / RoCE verbs transport: the FIFO protocol over RDMA writes.
 *
 * One reliable-connected queue pair joins each pair of ranks that use it, carrying both
 * directions.  Each rank owns, per peer, one registered region:
 *
 *   [receive FIFO: nslots x slot_bytes][send staging: nslots x slot_bytes][control page]
 *
 * Sending slice `tail`: the executor fills staging slot tail % nslots; send_post writes
 * it with RDMA WRITE WITH IMMEDIATE into the peer's receive FIFO at the same slot; the
 * immediate (the byte count) makes a completion on the peer, which bumps its `tail` and
 * records the size.  Receiving: when the executor releases a slot it bumps `head`, which
 * goes back to the sender as a credit; the sender may fill slot tail % nslots only while
 * tail - head < nslots (ib_wire.h).  A credit rides in the immediate of this rank's next
 * data write to that peer; it is RDMA-written into the sender's control page (the credit
 * word) on its own only when IB_CREDIT_BATCH released slots are owed, or before this rank
 * waits for anything (flush_owed), so a rank never waits while it holds a credit back.
 * In an exchange (both ranks send, then receive) no credit packet is written at all.  A
 * credit also proves the staging slot is free: the peer consumed it, so the HCA finished
 * reading it.
 * Completion-queue polling happens in every data-path call and in wait(); an error
 * completion marks the peer lost with ibv_wc_status_str's words, and every wait then
 * fails with COLL_ERR_REMOTE.  A quiet wait probes the peer with a zero-byte write once
 * a second, so a dead peer is found by the HCA's retry timeout, not by COLL_TIMEOUT_MS.
 *
 * Connections are lazy, as tcp's are: nothing is made for a peer until the executor
 * first needs it (comm.c's coll_comm_use_peer calls connect) or the peer needs this rank
 * first.  Queue-pair numbers are per pair, so they cannot ride in the one fixed-size blob
 * every rank publishes: the blob (coll_ib_port_info) carries the port's LID/GID/MTU and a
 * TCP sideband address.  connect() dials the peer's sideband; a thread per communicator
 * accepts the peers that dial first.  Both ends of one socket run the same exchange
 * (pair info: QPN, PSN, FIFO and credit addresses and rkeys, checked against the
 * communicator's secret; then the sender's port info), take the queue pair to RTR/RTS,
 * and swap a last byte so that nobody writes before the other side can receive.
 *
 * Device choice: COLL_IB_HCA=name[:port], else the first device with an active port.
 * GID: COLL_IB_GID_INDEX, else coll_ib_pick_gid (RoCE v2 IPv4-mapped first).  With no
 * device the probe says so once at INFO level and comm.c never selects this transport.
 *
 * Close drains first: it polls every queue pair until its posted writes have completed
 * (acknowledged by the peer's HCA) or a bound passes (coll_ib_drain), because destroying
 * a queue pair drops writes still in flight — the last slice of the last collective.
 *
 * Must never: sleep on the data path, post more work requests than the queues hold,
 * trust a length or address from the sideband before ib_wire.c bounds it, or leave a
 * queue pair, memory region, socket or thread behind on any exit path.  Every verbs
 * failure is a sentence naming the call and the peer (or the device, before there is one).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ib.h"
#include "ib_regcache.h"
#include "ib_wire.h"
#include "base.h"

#define IB_NSLOTS 8
#define IB_SLOT_BYTES (128 * 1024)
_Static_assert((IB_NSLOTS & (IB_NSLOTS - 1)) == 0,
               "slots index by counter % nslots across the wrap");
#define IB_PAGE 4096
#define IB_SQ_DEPTH (4 * IB_NSLOTS) /* data <= nslots, credits, probes */
/* A receiver writes a credit of its own only once this many released slots are owed
 * (or before it waits); below that the credit rides on its next data write (ib_wire.h). */
#define IB_CREDIT_BATCH (IB_NSLOTS / 2)
_Static_assert(IB_SLOT_BYTES < (1u << COLL_IB_IMM_BYTES_BITS),
               "a slice's size must fit the immediate");
#define IB_RQ_DEPTH (IB_NSLOTS + 1)
#define IB_CQ_DEPTH (IB_SQ_DEPTH + IB_RQ_DEPTH)
#define IB_POLL_BATCH 16
#define IB_PROBE_NS 1000000000ull
#define IB_REGCACHE_ENTRIES 1024

enum { WR_DATA = 1, WR_CREDIT = 2, WR_PROBE = 3, WR_RECV = 4 };

struct ib_ctx;
struct ib_peer;

typedef struct {
  coll_conn base;
  struct ib_peer *p;
  uint32_t pos; /* sender: tail; receiver: head */
} ib_conn;

typedef struct ib_peer {
  int rank;
  struct ib_ctx *ctx;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  uint32_t psn;
  uint8_t *mem; /* fifo | staging | control page */
  size_t mem_bytes;
  coll_ib_reg *reg;
  uint8_t *fifo, *staging;
  volatile uint32_t *credit_in;  /* sender side: the peer's head, written by its HCA */
  volatile uint32_t *credit_out; /* receiver side: our head, source of the credit write */
  uint32_t recv_bytes[IB_NSLOTS];
  uint32_t rtail;  /* slices landed in our FIFO (completions seen) */
  uint32_t shead;  /* sender's view of the peer's head */
  uint32_t sq_out; /* send work requests not yet completed */
  bool credit_pending;
  uint32_t credited; /* the receive head last sent to the peer (write or immediate) */
  bool owed;         /* on ctx->owed: released slots not yet credited */
  struct ib_peer *owed_next;
  coll_ib_port_info rport;
  coll_ib_pair_info remote;
  /* Under ctx->mu: built (region, CQ, QP in INIT), have_remote (QP at RTS), ready (the
   * peer's QP can receive too: the executor may write). */
  bool built, have_remote, ready;
  uint64_t last_probe_ns;
  _Atomic int dead;
  char why[300];
  ib_conn send, recv;
} ib_peer;

typedef struct ib_ctx {
  const coll_comm_view *view;
  struct ibv_context *dev;
  struct ibv_pd *pd;
  char devname[IBV_SYSFS_NAME_MAX + 1];
  int port;
  struct ibv_port_attr pattr;
  int gid_index;
  union ibv_gid gid;
  int listen_fd;
  coll_ib_port_info me;
  coll_ib_regcache rc;
  bool rc_ready;
  /* Peers are made by the executor (connect) or the sideband thread (a peer that dialled
   * first): mu guards peers, order, npeers and each peer's built/have_remote/ready. */
  pthread_mutex_t mu;
  ib_peer **peers; /* by rank */
  ib_peer *owed;   /* peers owed a credit (executor's thread only): written before a wait */
  int *order;
  int npeers;
  pthread_t sideband;
  bool sideband_started;
  int stop_fd[2]; /* close writes a byte: the sideband thread leaves its poll */
  _Atomic int stopping;
} ib_ctx;

/* ---- probe: is there a device and an active port? (once per process) ---------------- */

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static bool probe_ok;
static char probe_why[256];
static char probe_dev[IBV_SYSFS_NAME_MAX + 1];
static int probe_port;

/* The GID index a port would use (COLL_IB_GID_INDEX when set and inside the table,
 * else coll_ib_pick_gid's choice), -1 when none is usable. */
static int port_gid_index(struct ibv_context *d, int port, const struct ibv_port_attr *pa) {
  long want;
  if (!coll_env_int("COLL_IB_GID_INDEX", -1, &want) || want >= pa->gid_tbl_len) return -1;
  if (want >= 0) return (int)want;
  int n = pa->gid_tbl_len > 256 ? 256 : pa->gid_tbl_len;
  coll_ib_gid_entry *e = calloc((size_t)(n > 0 ? n : 1), sizeof *e);
  if (!e) return -1;
  for (int i = 0; i < n; i++) {
    struct ibv_gid_entry ge;
    if (ibv_query_gid_ex(d, (uint32_t)port, (uint32_t)i, &ge, 0) != 0) continue;
    memcpy(e[i].gid, ge.gid.raw, 16);
    e[i].type = ge.gid_type == IBV_GID_TYPE_ROCE_V2   ? COLL_IB_GID_TYPE_ROCE_V2
                : ge.gid_type == IBV_GID_TYPE_ROCE_V1 ? COLL_IB_GID_TYPE_ROCE_V1
                                                      : COLL_IB_GID_TYPE_IB;
    e[i].valid = true;
  }
  int ll = pa->link_layer == IBV_LINK_LAYER_ETHERNET ? COLL_IB_LL_ETHERNET : COLL_IB_LL_INFINIBAND;
  int idx = coll_ib_pick_gid(e, n, ll);
  free(e);
  return idx;
}

/* Looks at every port of every device (within COLL_IB_HCA) the way setup will use it —
 * active, a usable GID, a protection domain — and lets coll_ib_choose_port (ib_wire.c,
 * unit-tested without hardware) take one.  A device that is present but unusable is
 * skipped with a warning, so that a job on a host with, say, a RoCE port without an IP
 * address goes on over tcp instead of failing at setup. */
static void probe_run(void) {
  int n = 0;
  coll_ib_port_view *views = NULL;
  struct ibv_device **list = ibv_get_device_list(&n);
  if (!list) {
    /* ENOSYS: the kernel has no RDMA subsystem (/sys/class/infiniband is missing). */
    snprintf(probe_why, sizeof probe_why,
             "no InfiniBand device: ibv_get_device_list returned "
             "0 devices (%s)",
             errno == ENOSYS ? "no RDMA support in this kernel" : strerror(errno));
    goto out;
  }
  char want[IBV_SYSFS_NAME_MAX + 1] = "";
  int want_port = 0;
  const char *spec = getenv("COLL_IB_HCA");
  if (spec && *spec && !coll_ib_parse_hca(spec, want, sizeof want, &want_port)) {
    snprintf(probe_why, sizeof probe_why,
             "COLL_IB_HCA=%s is not of the form name[:port] (e.g. mlx5_0:1)", spec);
    goto out;
  }
  int nv = 0, cap = 0;
  for (int i = 0; i < n; i++) {
    const char *name = ibv_get_device_name(list[i]);
    if (want[0] && strcmp(name, want) != 0) continue;
    struct ibv_context *d = ibv_open_device(list[i]);
    if (!d) continue;
    struct ibv_device_attr da;
    struct ibv_pd *pd = NULL;
    if (ibv_query_device(d, &da) == 0 && (pd = ibv_alloc_pd(d)) != NULL) ibv_dealloc_pd(pd);
    for (int pt = 1; ibv_query_device(d, &da) == 0 && pt <= da.phys_port_cnt; pt++) {
      struct ibv_port_attr pa;
      if (ibv_query_port(d, (uint8_t)pt, &pa) != 0) continue;
      if (nv == cap) {
        cap = cap ? 2 * cap : 8;
        coll_ib_port_view *g = realloc(views, (size_t)cap * sizeof *views);
        if (!g) break;
        views = g;
      }
      coll_ib_port_view *v = &views[nv++];
      memset(v, 0, sizeof *v);
      snprintf(v->dev, sizeof v->dev, "%s", name);
      v->port = pt;
      v->active = pa.state == IBV_PORT_ACTIVE;
      v->link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? COLL_IB_LL_ETHERNET
                                                               : COLL_IB_LL_INFINIBAND;
      v->pd_ok = pd != NULL;
      v->gid_index = v->active ? port_gid_index(d, pt, &pa) : -1;
    }
    ibv_close_device(d);
  }
  char skipped[256] = "";
  if (nv == 0 && n > 0 && !want[0]) {
    snprintf(probe_why, sizeof probe_why,
             "%d InfiniBand device(s) present but none could be opened or queried", n);
    goto out;
  }
  int k = coll_ib_choose_port(views, nv, want, want_port, skipped, sizeof skipped, probe_why,
                              sizeof probe_why);
  if (k >= 0) {
    snprintf(probe_dev, sizeof probe_dev, "%s", views[k].dev);
    probe_port = views[k].port;
    probe_ok = true;
  }
  if (skipped[0]) COLL_WARN(-1, "ib: skipping a device that is present but unusable: %s", skipped);
out:
  free(views);
  if (list) ibv_free_device_list(list);
  if (probe_ok)
    COLL_INFO(-1, "ib: using %s port %d", probe_dev, probe_port);
  else
    COLL_INFO(-1, "ib: transport not available: %s", probe_why);
}

bool coll_ib_probe(char *why, size_t why_len) {
  pthread_once(&probe_once, probe_run);
  if (!probe_ok && why && why_len) {
    size_t n = strlen(probe_why);
    if (n >= why_len) n = why_len - 1;
    memcpy(why, probe_why, n);
    why[n] = 0;
  }
  return probe_ok;
}

/* ---- setup ------------------------------------------------------------------------- */

static int reg_cb(void *arg, uintptr_t start, size_t len, void **handle, uint32_t *lkey,
                  uint32_t *rkey, char *why, size_t why_len) {
  ib_ctx *ctx = arg;
  struct ibv_mr *mr = ibv_reg_mr(ctx->pd, (void *)start, len,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr) {
    snprintf(why, why_len, "ibv_reg_mr: %s", strerror(errno));
    return -1;
  }
  *handle = mr;
  *lkey = mr->lkey;
  *rkey = mr->rkey;
  return 0;
}

static void dereg_cb(void *arg, void *handle) {
  (void)arg;
  ibv_dereg_mr(handle);
}

static coll_result pick_gid(const coll_comm_view *view, ib_ctx *ctx) {
  long want;
  if (!coll_env_int("COLL_IB_GID_INDEX", -1, &want) || want < -1 ||
      (want >= 0 && want >= ctx->pattr.gid_tbl_len))
    return coll_view_fail(view, COLL_ERR_INVALID_ARG,
                          "rank %d: COLL_IB_GID_INDEX=%s is not an index of %s port %d's GID table "
                          "(0..%d)",
                          view->rank, getenv("COLL_IB_GID_INDEX"), ctx->devname, ctx->port,
                          ctx->pattr.gid_tbl_len - 1);
  int n = ctx->pattr.gid_tbl_len > 256 ? 256 : ctx->pattr.gid_tbl_len;
  coll_ib_gid_entry *e = calloc((size_t)(n > 0 ? n : 1), sizeof *e);
  if (!e) return coll_view_fail(view, COLL_ERR_SYSTEM, "out of memory reading the GID table");
  for (int i = 0; i < n; i++) {
    struct ibv_gid_entry ge;
    if (ibv_query_gid_ex(ctx->dev, (uint32_t)ctx->port, (uint32_t)i, &ge, 0) != 0) continue;
    memcpy(e[i].gid, ge.gid.raw, 16);
    e[i].type = ge.gid_type == IBV_GID_TYPE_ROCE_V2   ? COLL_IB_GID_TYPE_ROCE_V2
                : ge.gid_type == IBV_GID_TYPE_ROCE_V1 ? COLL_IB_GID_TYPE_ROCE_V1
                                                      : COLL_IB_GID_TYPE_IB;
    e[i].valid = true;
  }
  int ll = ctx->pattr.link_layer == IBV_LINK_LAYER_ETHERNET ? COLL_IB_LL_ETHERNET
                                                            : COLL_IB_LL_INFINIBAND;
  int idx = want >= 0 ? (int)want : coll_ib_pick_gid(e, n, ll);
  free(e);
  if (idx < 0)
    return coll_view_fail(view, COLL_ERR_UNSUPPORTED,
                          "rank %d: %s port %d is RoCE but has no usable GID (is an IP address "
                          "configured on its network interface?)",
                          view->rank, ctx->devname, ctx->port);
  if (ibv_query_gid(ctx->dev, (uint8_t)ctx->port, idx, &ctx->gid) != 0)
    return coll_view_fail(view, COLL_ERR_SYSTEM,
                          "rank %d: ibv_query_gid of GID %d on %s port %d failed: %s", view->rank,
                          idx, ctx->devname, ctx->port, strerror(errno));
  ctx->gid_index = idx;
  return COLL_OK;
}

/* The sideband listens on the address of the route to the rendezvous (as tcp does). */
static coll_result sideband_listen(const coll_comm_view *view, ib_ctx *ctx) {
  if (view->local_len == 0)
    return coll_view_fail(view, COLL_ERR_INTERNAL, "rank %d: no local address for the ib sideband",
                          view->rank);
  struct sockaddr_storage ss;
  memcpy(&ss, view->local, view->local_len);
  socklen_t sl = view->local_len;
  if (ss.ss_family == AF_INET)
    ((struct sockaddr_in *)&ss)->sin_port = 0;
  else
    ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
  ctx->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (ctx->listen_fd < 0 || bind(ctx->listen_fd, (struct sockaddr *)&ss, sl) != 0 ||
      listen(ctx->listen_fd, 1024) != 0)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "rank %d: cannot listen for the ib sideband: %s",
                          view->rank, strerror(errno));
  sl = sizeof ss;
  getsockname(ctx->listen_fd, (struct sockaddr *)&ss, &sl);
  ctx->me.tcp_family = ss.ss_family;
  if (ss.ss_family == AF_INET) {
    ctx->me.tcp_port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    memcpy(ctx->me.tcp_addr, &((struct sockaddr_in *)&ss)->sin_addr, 4);
  } else {
    ctx->me.tcp_port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    memcpy(ctx->me.tcp_addr, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
  }
  return COLL_OK;
}

static void *sideband_main(void *arg);

static coll_result ib_setup(const coll_comm_view *view, void **ctxp, void *blob) {
  char why[256];
  if (!coll_ib_probe(why, sizeof why))
    return coll_view_fail(view, COLL_ERR_UNSUPPORTED, "rank %d: the ib transport cannot run: %s",
                          view->rank, why);
  ib_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return coll_view_fail(view, COLL_ERR_SYSTEM, "out of memory setting up ib");
  *ctxp = ctx;
  ctx->view = view;
  ctx->listen_fd = -1;
  ctx->stop_fd[0] = ctx->stop_fd[1] = -1;
  pthread_mutex_init(&ctx->mu, NULL);
  ctx->peers = calloc((size_t)view->nranks, sizeof *ctx->peers);
  ctx->order = calloc((size_t)view->nranks, sizeof *ctx->order);
  if (!ctx->peers || !ctx->order)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "out of memory setting up ib");
  snprintf(ctx->devname, sizeof ctx->devname, "%s", probe_dev);
  ctx->port = probe_port;
  int n = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  for (int i = 0; list && i < n && !ctx->dev; i++)
    if (strcmp(ibv_get_device_name(list[i]), ctx->devname) == 0)
      ctx->dev = ibv_open_device(list[i]);
  if (list) ibv_free_device_list(list);
  if (!ctx->dev)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "rank %d: ibv_open_device of %s failed: %s",
                          view->rank, ctx->devname, strerror(errno));
  if (ibv_query_port(ctx->dev, (uint8_t)ctx->port, &ctx->pattr) != 0 ||
      ctx->pattr.state != IBV_PORT_ACTIVE)
    return coll_view_fail(view, COLL_ERR_SYSTEM,
                          "rank %d: ibv_query_port: %s port %d is not active", view->rank,
                          ctx->devname, ctx->port);
  ctx->pd = ibv_alloc_pd(ctx->dev);
  if (!ctx->pd)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "rank %d: ibv_alloc_pd on %s failed: %s",
                          view->rank, ctx->devname, strerror(errno));
  coll_result r = pick_gid(view, ctx);
  if (r != COLL_OK) return r;
  if ((r = sideband_listen(view, ctx)) != COLL_OK) return r;
  coll_ib_reg_ops ops = {.reg = reg_cb, .dereg = dereg_cb, .arg = ctx};
  if (coll_ib_regcache_init(&ctx->rc, &ops, IB_PAGE, IB_REGCACHE_ENTRIES, 0) != 0)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "out of memory for the ib registration cache");
  ctx->rc_ready = true;
  ctx->me.lid = ctx->pattr.lid;
  ctx->me.port = (uint8_t)ctx->port;
  ctx->me.link_layer = ctx->pattr.link_layer == IBV_LINK_LAYER_ETHERNET ? COLL_IB_LL_ETHERNET
                                                                        : COLL_IB_LL_INFINIBAND;
  ctx->me.mtu = (uint8_t)ctx->pattr.active_mtu;
  ctx->me.gid_index = (uint8_t)ctx->gid_index;
  memcpy(ctx->me.gid, ctx->gid.raw, 16);
  _Static_assert(COLL_IB_PORT_BYTES <= COLL_CONN_BLOB, "port info fits the blob");
  coll_ib_port_encode(&ctx->me, blob);
  /* Peers may dial as soon as the exchange of blobs has shown them this one. */
  if (pipe2(ctx->stop_fd, O_CLOEXEC) != 0)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "rank %d: pipe2 for the ib sideband failed: %s",
                          view->rank, strerror(errno));
  int e = pthread_create(&ctx->sideband, NULL, sideband_main, ctx);
  if (e)
    return coll_view_fail(view, COLL_ERR_SYSTEM,
                          "rank %d: starting the ib sideband thread failed: %s", view->rank,
                          strerror(e));
  ctx->sideband_started = true;
  COLL_INFO(view->rank, "ib: %s port %d, %s, LID %u, GID index %d, MTU %d", ctx->devname, ctx->port,
            ctx->me.link_layer == COLL_IB_LL_ETHERNET ? "RoCE" : "InfiniBand", ctx->me.lid,
            ctx->gid_index, 128 << ctx->me.mtu);
  return COLL_OK;
}

/* ---- peers: a queue pair and its memory, made once per peer -------------------------- */

static bool post_recv(ib_peer *p) {
  struct ibv_recv_wr wr = {.wr_id = WR_RECV, .num_sge = 0}, *bad = NULL;
  return ibv_post_recv(p->qp, &wr, &bad) == 0;
}

/* Makes p's region, completion queue and queue pair (in INIT, receives posted).  Called
 * with ctx->mu held, by the executor (connect) or the sideband thread (a peer dialled
 * first); `why` gets a sentence naming the verbs call and the peer. */
static bool peer_build(ib_ctx *ctx, ib_peer *p, char *why, size_t why_len) {
  const coll_comm_view *view = ctx->view;
  int peer = p->rank;
  char rwhy[160];
  size_t fifo = (size_t)IB_NSLOTS * IB_SLOT_BYTES;
  p->mem_bytes = 2 * fifo + IB_PAGE;
  p->mem = aligned_alloc(IB_PAGE, p->mem_bytes);
  if (!p->mem) {
    snprintf(why, why_len, "rank %d: out of memory for the ib FIFO of rank %d", view->rank, peer);
    return false;
  }
  /* First touch now (~10 us a page here), never on the data path. */
  memset(p->mem, 0, p->mem_bytes);
  p->fifo = p->mem;
  p->staging = p->mem + fifo;
  p->credit_in = (volatile uint32_t *)(p->mem + 2 * fifo);
  p->credit_out = (volatile uint32_t *)(p->mem + 2 * fifo + 64);
  p->reg = coll_ib_regcache_get(&ctx->rc, (uintptr_t)p->mem, p->mem_bytes, rwhy, sizeof rwhy);
  if (!p->reg) {
    snprintf(why, why_len, "rank %d: registering the FIFO for rank %d: %s", view->rank, peer, rwhy);
    return false;
  }
  p->cq = ibv_create_cq(ctx->dev, IB_CQ_DEPTH, NULL, NULL, 0);
  if (!p->cq) {
    snprintf(why, why_len, "rank %d: ibv_create_cq for rank %d on %s failed: %s", view->rank, peer,
             ctx->devname, strerror(errno));
    return false;
  }
  struct ibv_qp_init_attr qa = {.send_cq = p->cq,
                                .recv_cq = p->cq,
                                .qp_type = IBV_QPT_RC,
                                .sq_sig_all = 1,
                                .cap = {.max_send_wr = IB_SQ_DEPTH,
                                        .max_recv_wr = IB_RQ_DEPTH,
                                        .max_send_sge = 1,
                                        .max_recv_sge = 1}};
  p->qp = ibv_create_qp(ctx->pd, &qa);
  if (!p->qp) {
    snprintf(why, why_len, "rank %d: ibv_create_qp for rank %d on %s failed: %s", view->rank, peer,
             ctx->devname, strerror(errno));
    return false;
  }
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                          .pkey_index = 0,
                          .port_num = (uint8_t)ctx->port,
                          .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE};
  int e = ibv_modify_qp(p->qp, &a,
                        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (e) {
    snprintf(why, why_len, "rank %d: ibv_modify_qp to INIT for rank %d's queue pair failed: %s",
             view->rank, peer, strerror(e));
    return false;
  }
  for (int i = 0; i < IB_NSLOTS; i++)
    if (!post_recv(p)) {
      snprintf(why, why_len, "rank %d: ibv_post_recv for rank %d failed", view->rank, peer);
      return false;
    }
  uint64_t seed = coll_now_ns() ^ ((uint64_t)view->rank << 32) ^ (uint64_t)peer;
  p->psn = (uint32_t)(seed * 0x9e3779b97f4a7c15ull >> 40) & 0xffffff;
  p->send = (ib_conn){.base = {.t = &coll_transport_ib,
                               .peer = peer,
                               .is_send = true,
                               .slot_bytes = IB_SLOT_BYTES,
                               .nslots = IB_NSLOTS},
                      .p = p};
  p->recv = (ib_conn){.base = {.t = &coll_transport_ib,
                               .peer = peer,
                               .is_send = false,
                               .slot_bytes = IB_SLOT_BYTES,
                               .nslots = IB_NSLOTS},
                      .p = p};
  return true;
}

/* The peer `rank` (port info `rp`), made on first need.  With ctx->mu held.  NULL with a
 * sentence in `why` when it cannot be made (what was made stays in ctx->peers, for close). */
static ib_peer *peer_get(ib_ctx *ctx, int rank, const coll_ib_port_info *rp, char *why,
                         size_t why_len) {
  ib_peer *p = ctx->peers[rank];
  if (p) {
    if (!p->built) snprintf(why, why_len, "%s", p->why);
    return p->built ? p : NULL;
  }
  size_t psize = (sizeof(ib_peer) + 63) / 64 * 64;
  p = aligned_alloc(64, psize);
  if (!p) {
    snprintf(why, why_len, "rank %d: out of memory connecting to rank %d", ctx->view->rank, rank);
    return NULL;
  }
  memset(p, 0, psize);
  p->rank = rank;
  p->ctx = ctx;
  p->rport = *rp;
  ctx->peers[rank] = p;
  ctx->order[ctx->npeers++] = rank;
  if (!peer_build(ctx, p, why, why_len)) {
    snprintf(p->why, sizeof p->why, "%s", why);
    return NULL;
  }
  p->built = true;
  return p;
}

/* ---- the sideband: one exchange per pair, whoever needs it first --------------------- */

/* Sends or receives exactly len bytes by the deadline; false on EOF, error, the deadline,
 * or the transport closing (ctx->stopping). */
static bool io_all(ib_ctx *ctx, int fd, void *buf, size_t len, bool wr, uint64_t deadline) {
  uint8_t *b = buf;
  while (len) {
    ssize_t n = wr ? send(fd, b, len, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, b, len, MSG_DONTWAIT);
    if (n > 0) {
      b += n;
      len -= (size_t)n;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
    uint64_t now = coll_now_ns();
    if (now >= deadline || atomic_load(&ctx->stopping)) return false;
    struct pollfd pf = {.fd = fd, .events = wr ? POLLOUT : POLLIN};
    uint64_t left = (deadline - now) / 1000000u + 1;
    poll(&pf, 1, left > 100 ? 100 : (int)left);
  }
  return true;
}

/* Non-blocking connect bounded by the deadline (an unreachable host must not hold the
 * executor for the kernel's SYN retries).  False with errno set. */
static bool connect_until(int fd, const struct sockaddr *sa, socklen_t sl, uint64_t deadline) {
  if (connect(fd, sa, sl) == 0) return true;
  if (errno != EINPROGRESS) return false;
  for (;;) {
    uint64_t now = coll_now_ns();
    if (now >= deadline) {
      errno = ETIMEDOUT;
      return false;
    }
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    uint64_t left = (deadline - now) / 1000000u + 1;
    int rc = poll(&pf, 1, left > 1000 ? 1000 : (int)left);
    if (rc < 0 && errno != EINTR) return false;
    if (rc <= 0) continue;
    int e = 0;
    socklen_t el = sizeof e;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0) return false;
    if (e) {
      errno = e;
      return false;
    }
    return true;
  }
}

/* One sideband message: this rank's pair info for `p`, then its port info (so that the
 * side that did not dial learns the dialler's LID/GID/MTU without the init blob). */
#define IB_MSG_BYTES (COLL_IB_PAIR_BYTES + COLL_IB_PORT_BYTES)

static void my_msg(ib_ctx *ctx, ib_peer *p, uint8_t *out) {
  const coll_comm_view *view = ctx->view;
  coll_ib_pair_info pi = {.from_rank = (uint32_t)view->rank,
                          .to_rank = (uint32_t)p->rank,
                          .qpn = p->qp->qp_num,
                          .psn = p->psn,
                          .fifo_addr = (uint64_t)(uintptr_t)p->fifo,
                          .fifo_rkey = p->reg->rkey,
                          .credit_addr = (uint64_t)(uintptr_t)p->credit_in,
                          .credit_rkey = p->reg->rkey,
                          .nslots = IB_NSLOTS,
                          .slot_bytes = IB_SLOT_BYTES};
  memcpy(pi.secret, view->secret, 16);
  coll_ib_pair_encode(&pi, out);
  coll_ib_port_encode(&ctx->me, out + COLL_IB_PAIR_BYTES);
}

/* Checks a peer's message: bounds (ib_wire.c), the communicator's secret, addressed to
 * this rank, from `expect_from` (-1: any other rank), this FIFO shape, a port on this
 * link layer.  False with a sentence in `why`. */
static bool read_msg(ib_ctx *ctx, const uint8_t *msg, int expect_from, coll_ib_pair_info *pi,
                     coll_ib_port_info *port, char *why, size_t why_len) {
  const coll_comm_view *view = ctx->view;
  char w[160];
  if (!coll_ib_pair_decode(msg, COLL_IB_PAIR_BYTES, pi, w, sizeof w) ||
      !coll_ib_port_decode(msg + COLL_IB_PAIR_BYTES, COLL_IB_PORT_BYTES, port, w, sizeof w)) {
    snprintf(why, why_len, "a sideband message that is not a libcoll queue pair offer: %s", w);
    return false;
  }
  uint8_t diff = 0;
  for (int i = 0; i < 16; i++) diff |= (uint8_t)(pi->secret[i] ^ view->secret[i]);
  if (diff || pi->to_rank != (uint32_t)view->rank || pi->from_rank >= (uint32_t)view->nranks ||
      pi->from_rank == (uint32_t)view->rank ||
      (expect_from >= 0 && pi->from_rank != (uint32_t)expect_from)) {
    snprintf(why, why_len, "a sideband message not meant for this rank of this communicator");
    return false;
  }
  if (pi->nslots != IB_NSLOTS || pi->slot_bytes != IB_SLOT_BYTES ||
      port->link_layer != ctx->me.link_layer) {
    snprintf(why, why_len,
             "rank %u offers a queue pair of another shape (%u slots of %u bytes, %s): not a "
             "peer of this version on this fabric",
             pi->from_rank, pi->nslots, pi->slot_bytes,
             port->link_layer == COLL_IB_LL_ETHERNET ? "RoCE" : "InfiniBand");
    return false;
  }
  return true;
}

static coll_result to_rts(ib_ctx *ctx, ib_peer *p, char *why, size_t why_len) {
  const coll_comm_view *view = ctx->view;
  long sl = 0, tc = 0, to = 14, retry = 6;
  coll_env_int("COLL_IB_SL", 0, &sl);
  coll_env_int("COLL_IB_TC", 0, &tc);
  coll_env_int("COLL_IB_TIMEOUT", 14, &to);
  /* 6, not the field's maximum 7: soft-RoCE (rdma_rxe) reads a retry count of 7 as
   * "retry forever", so a peer behind a dead link would never turn into an error
   * completion there (seen in the soft-RoCE bed, docs/ib-bed.md). */
  coll_env_int("COLL_IB_RETRY_CNT", 6, &retry);
  if (sl < 0 || sl > 15) sl = 0;
  if (tc < 0 || tc > 255) tc = 0;
  if (to < 1 || to > 31) to = 14;
  if (retry < 0 || retry > 7) retry = 6;
  int mtu = ctx->me.mtu < p->rport.mtu ? ctx->me.mtu : p->rport.mtu;
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
                          .path_mtu = (enum ibv_mtu)mtu,
                          .dest_qp_num = p->remote.qpn,
                          .rq_psn = p->remote.psn,
                          .max_dest_rd_atomic = 1,
                          .min_rnr_timer = 12};
  a.ah_attr.dlid = p->rport.lid;
  a.ah_attr.sl = (uint8_t)sl;
  a.ah_attr.port_num = (uint8_t)ctx->port;
  /* RoCE always routes by GID; InfiniBand only needs the global header across subnets. */
  bool global = ctx->me.link_layer == COLL_IB_LL_ETHERNET ||
                memcmp(ctx->me.gid, p->rport.gid, 8) != 0;
  if (global) {
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, p->rport.gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)ctx->gid_index;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.grh.traffic_class = (uint8_t)tc;
  }
  int e = ibv_modify_qp(p->qp, &a,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (e) {
    snprintf(why, why_len,
             "rank %d: ibv_modify_qp to RTR for rank %d's queue pair failed: %s (check "
             "COLL_IB_GID_INDEX and that both ports are on one fabric)",
             view->rank, p->rank, strerror(e));
    return COLL_ERR_SYSTEM;
  }
  struct ibv_qp_attr b = {.qp_state = IBV_QPS_RTS,
                          .timeout = (uint8_t)to,
                          .retry_cnt = (uint8_t)retry,
                          .rnr_retry = 7,
                          .sq_psn = p->psn,
                          .max_rd_atomic = 1};
  e = ibv_modify_qp(p->qp, &b,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  if (e) {
    snprintf(why, why_len, "rank %d: ibv_modify_qp to RTS for rank %d's queue pair failed: %s",
             view->rank, p->rank, strerror(e));
    return COLL_ERR_SYSTEM;
  }
  return COLL_OK;
}

/* Now + COLL_TIMEOUT_MS (10 minutes when 0), at most cap_ms when cap_ms > 0. */
static uint64_t deadline_in(const coll_comm_view *view, int cap_ms) {
  int ms = view->timeout_ms > 0 ? view->timeout_ms : 600000;
  if (cap_ms > 0 && ms > cap_ms) ms = cap_ms;
  return coll_now_ns() + (uint64_t)ms * 1000000u;
}

/* One exchange per pair, on one socket, whoever dialled.  The dialler sends its message;
 * the accepting side reads it, makes the peer if this is its first word from it, takes its
 * queue pair to RTR and RTS and replies; the dialler reads the reply, does the same, and
 * sends one byte: only then may the accepting side write (its peer's queue pair can
 * receive).  The dialler may write as soon as it returns (the accepting side reached RTR
 * before replying).  When both sides dial at once, the second exchange for the pair
 * carries the same numbers (one queue pair per pair, made once under ctx->mu) and only
 * checks them.  Sends never wait for the peer (a few hundred bytes fit a socket buffer),
 * so exchanges running in opposite directions cannot deadlock.  `p` is NULL on the
 * accepting side.  Returns the peer, ready, or NULL with a sentence in `why`. */
static ib_peer *exchange(ib_ctx *ctx, int fd, ib_peer *p, uint64_t deadline, char *why,
                         size_t why_len) {
  const coll_comm_view *view = ctx->view;
  uint8_t mine[IB_MSG_BYTES], theirs[IB_MSG_BYTES], ack = 1;
  coll_ib_pair_info pi;
  coll_ib_port_info port;
  bool dialled = p != NULL;
  if (dialled) {
    my_msg(ctx, p, mine);
    if (!io_all(ctx, fd, mine, sizeof mine, true, deadline)) {
      snprintf(why, why_len, "rank %d: sending queue pair info to rank %d over the sideband failed",
               view->rank, p->rank);
      return NULL;
    }
  }
  if (!io_all(ctx, fd, theirs, sizeof theirs, false, deadline)) {
    if (dialled)
      snprintf(why, why_len,
               "rank %d: rank %d sent no queue pair info over the sideband (it closed the "
               "connection, or nothing came within the timeout)",
               view->rank, p->rank);
    else
      snprintf(why, why_len, "a caller of the ib sideband sent nothing");
    return NULL;
  }
  if (!read_msg(ctx, theirs, dialled ? p->rank : -1, &pi, &port, why, why_len)) return NULL;
  int peer = (int)pi.from_rank;
  if (!dialled) deadline = deadline_in(view, 0); /* a peer, not a stranger: its full time */
  pthread_mutex_lock(&ctx->mu);
  if (!dialled) p = peer_get(ctx, peer, &port, why, why_len);
  bool ok = p != NULL;
  if (ok && !p->have_remote) {
    p->remote = pi;
    p->rport = port;
    ok = to_rts(ctx, p, why, why_len) == COLL_OK;
    p->have_remote = ok;
  } else if (ok && (p->remote.qpn != pi.qpn || p->remote.psn != pi.psn)) {
    snprintf(why, why_len,
             "rank %d: rank %d offered a second queue pair (QPN %u where %u was joined): a "
             "restarted peer?",
             view->rank, peer, pi.qpn, p->remote.qpn);
    ok = false;
  }
  pthread_mutex_unlock(&ctx->mu);
  if (!ok) return NULL;
  if (dialled) {
    if (!io_all(ctx, fd, &ack, 1, true, deadline)) {
      snprintf(why, why_len, "rank %d: rank %d closed the ib sideband before the last byte",
               view->rank, peer);
      return NULL;
    }
  } else {
    my_msg(ctx, p, mine);
    if (!io_all(ctx, fd, mine, sizeof mine, true, deadline) ||
        !io_all(ctx, fd, &ack, 1, false, deadline)) {
      snprintf(why, why_len,
               "rank %d: rank %d dialled the ib sideband but did not finish the exchange",
               view->rank, peer);
      return NULL;
    }
  }
  pthread_mutex_lock(&ctx->mu);
  p->ready = true;
  pthread_mutex_unlock(&ctx->mu);
  return p;
}

/* The sideband thread: accepts the peers that need this rank before it needs them, one
 * exchange at a time, until close (ctx->stop_fd).  A stranger, or a peer that fails its
 * exchange, is dropped with an INFO line: that peer's own connect reports it. */
static void *sideband_main(void *arg) {
  ib_ctx *ctx = arg;
  const coll_comm_view *view = ctx->view;
  while (!atomic_load(&ctx->stopping)) {
    struct pollfd pf[2] = {{.fd = ctx->listen_fd, .events = POLLIN},
                           {.fd = ctx->stop_fd[0], .events = POLLIN}};
    if (poll(pf, 2, 1000) <= 0 || (pf[1].revents & POLLIN)) continue;
    int fd = accept4(ctx->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    char why[300];
    /* A stranger gets 5 s to say who it is; a peer then has COLL_TIMEOUT_MS (exchange). */
    if (!exchange(ctx, fd, NULL, deadline_in(view, 5000), why, sizeof why))
      COLL_INFO(view->rank, "ib: sideband: %s", why);
    close(fd);
  }
  return NULL;
}

/* The executor needs `peer` (comm.c's coll_comm_use_peer): its queue pair, joined now
 * unless the peer dialled first. */
static coll_result ib_connect(const coll_comm_view *view, void *vctx, int peer,
                              const void *peer_blob, coll_conn **send, coll_conn **recv) {
  ib_ctx *ctx = vctx;
  char why[300];
  coll_ib_port_info rp;
  if (!coll_ib_port_decode(peer_blob, COLL_CONN_BLOB, &rp, why, sizeof why))
    return coll_view_fail(view, COLL_ERR_UNSUPPORTED, "rank %d: rank %d cannot use InfiniBand: %s",
                          view->rank, peer, why);
  if (rp.link_layer != ctx->me.link_layer)
    return coll_view_fail(view, COLL_ERR_UNSUPPORTED,
                          "rank %d: rank %d's port is %s but this rank's is %s: they cannot talk",
                          view->rank, peer,
                          rp.link_layer == COLL_IB_LL_ETHERNET ? "RoCE" : "InfiniBand",
                          ctx->me.link_layer == COLL_IB_LL_ETHERNET ? "RoCE" : "InfiniBand");
  pthread_mutex_lock(&ctx->mu);
  ib_peer *p = peer_get(ctx, peer, &rp, why, sizeof why);
  bool ready = p && p->ready;
  pthread_mutex_unlock(&ctx->mu);
  if (!p) return coll_view_fail(view, COLL_ERR_SYSTEM, "%s", why);
  if (!ready) {
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    if (rp.tcp_family == AF_INET) {
      struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
      s4->sin_family = AF_INET;
      s4->sin_port = htons(rp.tcp_port);
      memcpy(&s4->sin_addr, rp.tcp_addr, 4);
      sl = sizeof *s4;
    } else {
      struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
      s6->sin6_family = AF_INET6;
      s6->sin6_port = htons(rp.tcp_port);
      memcpy(&s6->sin6_addr, rp.tcp_addr, 16);
      sl = sizeof *s6;
    }
    uint64_t deadline = deadline_in(view, 0);
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || !connect_until(fd, (struct sockaddr *)&ss, sl, deadline)) {
      int e = errno;
      if (fd >= 0) close(fd);
      return coll_view_fail(view, COLL_ERR_REMOTE,
                            "rank %d: cannot reach rank %d's ib sideband to join queue pairs: %s",
                            view->rank, peer, strerror(e));
    }
    ib_peer *q = exchange(ctx, fd, p, deadline, why, sizeof why);
    close(fd);
    if (!q) return coll_view_fail(view, COLL_ERR_REMOTE, "%s", why);
  }
  COLL_INFO(view->rank, "ib: queue pair to rank %d joined (QPN %u -> %u)", peer, p->qp->qp_num,
            p->remote.qpn);
  *send = &p->send.base;
  *recv = &p->recv.base;
  return COLL_OK;
}

/* Nothing to finish at init: peers join on first use (connect, or the sideband thread). */
static coll_result ib_ready(const coll_comm_view *view, void *vctx) {
  (void)view;
  (void)vctx;
  return COLL_OK;
}

/* ---- data path ---------------------------------------------------------------------- */

static const char *wr_name(uint64_t id) {
  switch (id) {
  case WR_DATA: return "an RDMA write of a slice";
  case WR_CREDIT: return "an RDMA write of a credit";
  case WR_PROBE: return "a liveness probe";
  default: return "a receive";
  }
}

static void lose(ib_peer *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void lose(ib_peer *p, const char *fmt, ...) {
  if (atomic_load(&p->dead)) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->why, sizeof p->why, fmt, ap);
  va_end(ap);
  atomic_store(&p->dead, 1);
}

static bool post_write(ib_peer *p, uint64_t id, void *src, uint32_t len, uint64_t raddr,
                       uint32_t rkey, bool imm, uint32_t imm_val) {
  struct ibv_sge sge = {.addr = (uintptr_t)src, .length = len, .lkey = p->reg->lkey};
  struct ibv_send_wr wr = {.wr_id = id,
                           .sg_list = &sge,
                           .num_sge = len ? 1 : 0,
                           .opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                           .send_flags = IBV_SEND_SIGNALED},
                     *bad = NULL;
  if (imm) wr.imm_data = htonl(imm_val);
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  int e = ibv_post_send(p->qp, &wr, &bad);
  if (e) {
    lose(p, "rank %d: ibv_post_send of %s to rank %d failed: %s", p->ctx->view->rank, wr_name(id),
         p->rank, strerror(e));
    return false;
  }
  p->sq_out++;
  return true;
}

static void post_credit(ib_peer *p) {
  if (p->sq_out >= IB_SQ_DEPTH) {
    p->credit_pending = true; /* posted by the next poll that frees a send entry */
    return;
  }
  p->credit_pending = false;
  p->credited = *p->credit_out;
  /* The source word may change before the HCA reads it: head only grows, so a later
   * value is still a true credit. */
  post_write(p, WR_CREDIT, (void *)p->credit_out, 4, p->remote.credit_addr, p->remote.credit_rkey,
             false, 0);
}

/* Reaps completions of p's queue pair; never blocks. */
static void poll_cq(ib_peer *p) {
  struct ibv_wc wc[IB_POLL_BATCH];
  for (;;) {
    int n = ibv_poll_cq(p->cq, IB_POLL_BATCH, wc);
    if (n < 0) {
      lose(p, "rank %d: ibv_poll_cq on the completion queue of rank %d's queue pair failed",
           p->ctx->view->rank, p->rank);
      return;
    }
    for (int i = 0; i < n; i++) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        lose(
            p,
            "rank %d: the completion (ibv_poll_cq) of %s with rank %d says %s (status %d, vendor error "
            "0x%x): the peer died, aborted, or the fabric dropped the link",
            p->ctx->view->rank, wr_name(wc[i].wr_id), p->rank, ibv_wc_status_str(wc[i].status),
            (int)wc[i].status, wc[i].vendor_err);
        if (wc[i].wr_id != WR_RECV && p->sq_out) p->sq_out--;
        continue;
      }
      if (wc[i].wr_id != WR_RECV) {
        if (p->sq_out) p->sq_out--;
        continue;
      }
      uint32_t imm = ntohl(wc[i].imm_data), bytes = coll_ib_imm_bytes(imm);
      if (!coll_ib_imm_ok(imm, IB_SLOT_BYTES)) {
        lose(p,
             "rank %d: rank %d wrote a %u-byte slice (slot %u bytes): not a libcoll peer "
             "of this version",
             p->ctx->view->rank, p->rank, bytes, (unsigned)IB_SLOT_BYTES);
        continue;
      }
      p->recv_bytes[coll_ib_slot(p->rtail, IB_NSLOTS)] = bytes;
      p->rtail++;
      if (coll_ib_imm_has_credit(imm)) /* the peer's credit for our sends, on its data */
        p->shead = coll_ib_accept_credit(p->shead, coll_ib_imm_credit(imm, p->shead), p->send.pos);
      if (!post_recv(p))
        lose(p, "rank %d: ibv_post_recv re-posting a receive for rank %d failed",
             p->ctx->view->rank, p->rank);
    }
    if (n < IB_POLL_BATCH) break;
  }
  if (p->credit_pending && !atomic_load(&p->dead)) post_credit(p);
}

static void *ib_send_slot(coll_conn *cc) {
  ib_conn *c = (ib_conn *)cc;
  ib_peer *p = c->p;
  if (atomic_load_explicit(&p->dead, memory_order_relaxed)) return NULL;
  poll_cq(p);
  p->shead = coll_ib_accept_credit(p->shead, *p->credit_in, c->pos);
  /* Keep one send entry for a credit so the other direction never starves. */
  if (!coll_ib_can_send(c->pos, p->shead, IB_NSLOTS) || p->sq_out + 2 > IB_SQ_DEPTH) return NULL;
  return p->staging + coll_ib_slot_offset(c->pos, IB_NSLOTS, IB_SLOT_BYTES);
}

static void ib_send_post(coll_conn *cc, uint32_t bytes) {
  ib_conn *c = (ib_conn *)cc;
  ib_peer *p = c->p;
  uint64_t off = coll_ib_slot_offset(c->pos, IB_NSLOTS, IB_SLOT_BYTES);
  uint32_t head = p->recv.pos;
  bool credit = head != p->credited; /* owed: it rides on this write */
  post_write(p, WR_DATA, p->staging + off, bytes, p->remote.fifo_addr + off, p->remote.fifo_rkey,
             true, coll_ib_imm_pack(bytes, credit, head));
  if (credit) p->credited = head;
  c->pos++;
}

static const void *ib_recv_slot(coll_conn *cc, uint32_t *bytes) {
  ib_conn *c = (ib_conn *)cc;
  ib_peer *p = c->p;
  if (c->pos == p->rtail) {
    poll_cq(p);
    if (c->pos == p->rtail) return NULL;
  }
  uint32_t i = coll_ib_slot(c->pos, IB_NSLOTS);
  *bytes = p->recv_bytes[i];
  return p->fifo + (size_t)i * IB_SLOT_BYTES;
}

static void ib_recv_release(coll_conn *cc) {
  ib_conn *c = (ib_conn *)cc;
  ib_peer *p = c->p;
  c->pos++;
  *p->credit_out = c->pos;
  if (c->pos - p->credited < IB_CREDIT_BATCH) {
    /* Owed, not yet written: the next data write to this peer carries it, or the next
     * wait writes it (flush_owed), so no rank ever waits while it holds a credit back. */
    if (!p->owed) {
      p->owed = true;
      p->owed_next = p->ctx->owed;
      p->ctx->owed = p;
    }
    return;
  }
  if (p->sq_out >= IB_SQ_DEPTH) poll_cq(p);
  post_credit(p);
}

/* Writes every credit this rank still owes, before it waits: the peer it owes may be
 * blocked on it, and what this rank waits for may depend on that peer. */
static void flush_owed(ib_ctx *ctx) {
  for (ib_peer *p = ctx->owed, *next; p; p = next) {
    next = p->owed_next;
    p->owed = false;
    if (p->recv.pos != p->credited && !atomic_load(&p->dead)) {
      if (p->sq_out >= IB_SQ_DEPTH) poll_cq(p);
      post_credit(p);
    }
  }
  ctx->owed = NULL;
}

static bool can_go(ib_conn *c) {
  ib_peer *p = c->p;
  if (c->base.is_send) {
    p->shead = coll_ib_accept_credit(p->shead, *p->credit_in, c->pos);
    return coll_ib_can_send(c->pos, p->shead, IB_NSLOTS) && p->sq_out + 2 <= IB_SQ_DEPTH;
  }
  return c->pos != p->rtail;
}

/* Spin polling the CQ, then yield, then nap (50 us doubling to 1 ms) until max_ms.
 * Credits arrive as plain RDMA writes, which raise no event on this side, so there is
 * nothing to block on; the naps bound the cost of a quiet wait.  A wait quiet for a
 * second probes the peer: a dead peer's HCA never acknowledges, and the retry timeout
 * turns into an error completion.
 *
 * How long to spin.  With a core of its own (not oversubscribed) a rank spins for up to
 * IB_SPIN_NS of each call (the executor waits in 100 ms calls) before it naps, as MPI's
 * and NCCL's progress loops spin: a nap that starts just before the completion arrives
 * costs up to the nap's length.  On the soft-RoCE bed, where one small message takes
 * ~0.4-0.8 ms, a count of polls (4000) can run out before the message comes (2-rank 8 B
 * calls took ~10x perftest's latency then; docs/ib-bed.md).  20 ms covers a 128 KiB
 * slice on that ~10 MB/s wire; on real hardware a wait that long is a late peer, not the
 * wire, and the rest of the call naps, so a stuck job burns a fifth of its core, not all
 * of it, and probes its peer.  Oversubscribed ranks never spin: the peer they wait for
 * may need this core. */
#define IB_SPIN_NS 20000000ull /* 20 ms */
static coll_result ib_wait(const coll_comm_view *view, coll_conn *cc, int max_ms) {
  ib_conn *c = (ib_conn *)cc;
  ib_peer *p = c->p;
  uint64_t start = coll_now_ns(), limit = (uint64_t)(max_ms < 1 ? 1 : max_ms) * 1000000u;
  uint64_t spin_ns = view->oversubscribed ? 0 : IB_SPIN_NS;
  long nap_ns = 50000;
  int yields = 0;
  flush_owed(p->ctx);
  for (;;) {
    poll_cq(p);
    if (atomic_load(&p->dead)) return coll_view_fail(view, COLL_ERR_REMOTE, "%s", p->why);
    if (can_go(c) || atomic_load(view->aborted)) return COLL_OK;
    uint64_t now = coll_now_ns();
    if (now - start >= limit) return COLL_OK;
    if (now - start < spin_ns) {
      coll_cpu_relax();
      continue;
    }
    if (yields < 64 && coll_yield(view->mates)) { /* false: a busy core (backoff.c), nap now */
      yields++;
      continue;
    }
    if (now - p->last_probe_ns > IB_PROBE_NS && p->sq_out + 1 < IB_SQ_DEPTH) {
      p->last_probe_ns = now;
      post_write(p, WR_PROBE, NULL, 0, p->remote.credit_addr, p->remote.credit_rkey, false, 0);
    }
    struct timespec ts = {0, nap_ns};
    nanosleep(&ts, NULL);
    if (nap_ns < 1000000) nap_ns *= 2;
  }
}

/* Waits nap at most 1 ms, so there is nothing to interrupt. */
static void ib_wake(coll_conn *cc) { (void)cc; }

static bool ib_can_connect(const coll_comm_view *view, int peer) {
  (void)view;
  (void)peer;
  pthread_once(&probe_once, probe_run);
  return probe_ok;
}

/* ---- close ----------------------------------------------------------------------------- */

/* coll_ib_drain's view of the peers (by position in ctx->order). */
static ib_peer *drain_peer(void *arg, int i) {
  ib_ctx *ctx = arg;
  return ctx->peers[ctx->order[i]];
}
static uint32_t drain_outstanding(void *arg, int i) {
  ib_peer *p = drain_peer(arg, i);
  return p->qp && !atomic_load(&p->dead) ? p->sq_out : 0;
}
static void drain_poll(void *arg, int i) { poll_cq(drain_peer(arg, i)); }
static uint64_t drain_now(void *arg) {
  (void)arg;
  return coll_now_ns();
}
static void drain_relax(void *arg) {
  (void)arg;
  sched_yield();
}

/* How long close waits for posted writes to complete: a completion means the peer's HCA
 * acknowledged the bytes (reliable connection), so the last slice of the last collective
 * has landed.  Bounded by COLL_TIMEOUT_MS, and at most 5 s: a peer that died meanwhile
 * is found by the HCA's retry timeout (an error completion), not by waiting it out. */
#define IB_DRAIN_MAX_MS 5000

static void ib_close(const coll_comm_view *view, void *vctx, coll_comm_end how) {
  ib_ctx *ctx = vctx;
  if (!ctx) return;
  atomic_store(&ctx->stopping, 1);
  if (ctx->sideband_started) {
    char b = 1;
    if (write(ctx->stop_fd[1], &b, 1) < 0) { /* the thread still sees `stopping` within 1 s */
    }
    pthread_join(ctx->sideband, NULL);
  }
  for (int i = 0; i < 2; i++)
    if (ctx->stop_fd[i] >= 0) close(ctx->stop_fd[i]);
  /* Drain before destroying: a queue pair destroyed with writes still posted drops them,
   * and the peer, still inside its last collective, waits for a slice that never comes.
   * Not after an abort: nobody waits for those bytes, and the peer may be gone. */
  if (ctx->peers && ctx->npeers > 0 && how != COLL_END_ABORTED) {
    long ms = view->timeout_ms > 0 && view->timeout_ms < IB_DRAIN_MAX_MS ? view->timeout_ms
                                                                         : IB_DRAIN_MAX_MS;
    int left = coll_ib_drain(ctx->npeers, drain_outstanding, drain_poll, drain_now, drain_relax,
                             ctx, coll_now_ns() + (uint64_t)ms * 1000000u);
    if (left)
      COLL_WARN(view->rank,
                "ib: %d queue pair(s) still had writes in flight %ld ms into close; "
                "destroying them anyway (a peer may miss the last slice)",
                left, ms);
  }
  if (ctx->peers)
    for (int i = 0; i < ctx->npeers; i++) {
      ib_peer *p = ctx->peers[ctx->order[i]];
      if (p->qp) ibv_destroy_qp(p->qp);
      if (p->cq) ibv_destroy_cq(p->cq);
      if (p->reg) coll_ib_regcache_put(&ctx->rc, p->reg);
    }
  if (ctx->rc_ready) {
    int held = coll_ib_regcache_destroy(&ctx->rc);
    if (held) COLL_WARN(view->rank, "ib: %d registrations were still in use at close", held);
  }
  if (ctx->peers)
    for (int i = 0; i < ctx->npeers; i++) {
      free(ctx->peers[ctx->order[i]]->mem);
      free(ctx->peers[ctx->order[i]]);
    }
  if (ctx->listen_fd >= 0) close(ctx->listen_fd);
  if (ctx->pd) ibv_dealloc_pd(ctx->pd);
  if (ctx->dev) ibv_close_device(ctx->dev);
  free(ctx->peers);
  free(ctx->order);
  pthread_mutex_destroy(&ctx->mu);
  free(ctx);
}

const coll_transport coll_transport_ib = {
    .name = "ib",
    .slot_bytes = IB_SLOT_BYTES,
    .lazy = true,
    .can_connect = ib_can_connect,
    .setup = ib_setup,
    .connect = ib_connect,
    .ready = ib_ready,
    .send_slot = ib_send_slot,
    .send_post = ib_send_post,
    .recv_slot = ib_recv_slot,
    .recv_release = ib_recv_release,
    .wait = ib_wait,
    .wake = ib_wake,
    .close = ib_close,
};
