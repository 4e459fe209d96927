/* tcp.c — the TCP transport: the same FIFO protocol as shm, carried over sockets.
 *
 * Each connection keeps its FIFO (nslots slots, tail and head counters) in *local*
 * memory.  On the send side the executor fills a slot and bumps `tail`; a proxy thread
 * (one per communicator) writes the slot to a socket and bumps `head` once the kernel
 * holds every byte, freeing the slot.  On the receive side the proxy reads a slice off
 * the socket straight into the next free slot and bumps `tail`; the executor consumes it
 * and bumps `head`.  The receiver's proxy reads from a socket only while it has a free
 * slot, so TCP's own window is the credit that flows back to the sender: a full FIFO
 * stops the reader, the peer's socket buffer fills, and the peer's proxy stops writing.
 *
 * A peer pair holds `nsocks` sockets (COLL_SOCKS_PER_PEER, default 2) used in both
 * directions; slice s travels on socket s % nsocks, each slice framed by a 4-byte
 * big-endian length.  The counter advances to the lowest slice not yet complete on any
 * socket, so slices land in order whatever socket is fastest.  A communicator that is
 * destroyed normally flushes what it posted and sends a "goodbye" frame first; a socket
 * that ends (EOF, reset) without one means the peer died or aborted, and every wait of
 * this communicator then fails with COLL_ERR_REMOTE naming that rank.
 *
 * Sockets are made lazily, when the executor first needs a peer (coll_comm_use_peer
 * in comm.c calls connect()): a communicator holds sockets only to the peers its
 * algorithms use (a ring: two), not to all N-1.  The lower rank of a pair dials, sending
 * a hello (magic, the communicator's secret, its rank, the socket's index); the higher
 * rank's proxy accepts at any time and hands the sockets to the peer's entry, and its
 * connect() waits (bounded, watching for aborts and failures elsewhere) until all of
 * them arrived.  Anything that does not present the secret is dropped.  The listen
 * address is COLL_SOCKET_IFNAME's, else the local address of the route this rank used to
 * reach the rendezvous (so a host with a real interface never advertises loopback unless
 * the rendezvous itself is on loopback, which means every rank is on this host).
 *
 * Must never: block the executor (only wait() sleeps, bounded), allocate or make a
 * system call on the data path while the proxy is awake, read a length from the wire
 * without bounding it, or let the proxy spin when there is nothing to move.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/futex.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base.h"
#include "sock.h"
#include "transport.h"

#define TCP_NSLOTS 4
#define TCP_SLOT_BYTES (256 * 1024)
#define TCP_MAX_SOCKS 8
#define TCP_HELLO_MAGIC 0x434c5443u /* "CLTC" */
#define TCP_HELLO_BYTES 28
#define TCP_GOODBYE 0xffffffffu
#define TCP_IDLE_POLL_MS 1000
#define TCP_DRAIN_MS 10000
#define PENDING 32     /* accepted sockets waiting for their hello */
#define HELLO_MS 10000 /* ...for at most this long */

typedef struct {
  _Alignas(64) _Atomic uint32_t tail; /* slices filled (sender: by the executor) */
  _Atomic uint32_t tail_waiter;       /* a thread sleeps on tail */
  _Alignas(64) _Atomic uint32_t head; /* slices freed (sender: by the proxy) */
  _Atomic uint32_t head_waiter;       /* a thread sleeps on head */
  _Alignas(64) uint32_t bytes[TCP_NSLOTS];
} tcp_ctl;

struct tcp_ctx;
struct tcp_peer;

typedef struct {
  coll_conn base;
  tcp_ctl ctl;
  uint8_t *slots;
  uint32_t pos;    /* the executor's own counter: sender tail, receiver head */
  uint32_t cached; /* last value seen of the other counter */
  struct tcp_peer *peer;
  struct tcp_ctx *ctx;
} tcp_conn;

typedef struct {
  int fd;
  /* sending: slice sseq (this socket's next), soff bytes of header+data written */
  uint32_t sseq, soff;
  bool sactive;
  uint8_t shdr[4];
  /* receiving: slice rseq, roff bytes of header+data read */
  uint32_t rseq, roff, rlen;
  uint8_t rhdr[4];
  bool said_goodbye; /* the peer's goodbye frame arrived on this socket */
} tcp_sock;

typedef struct tcp_peer {
  int rank;
  int nsocks;
  /* Sockets carry one direction each: `out` this rank dialed (its sends to the peer),
   * `in` the peer dialed (the peer's sends, accepted by the proxy at any time). */
  _Atomic uint32_t out_ready; /* every out socket is connected: the proxy may send */
  tcp_sock out[TCP_MAX_SOCKS];
  tcp_sock in[TCP_MAX_SOCKS]; /* fd -1 until it arrives */
  tcp_conn send, recv;
  _Atomic int dead; /* set by the proxy; `why` is written before */
  _Atomic int gone; /* said goodbye on every socket: destroyed its communicator */
  char why[200];
  char addr[64];
} tcp_peer;

typedef struct tcp_ctx {
  const coll_comm_view *view;
  int listen_fd, evfd;
  int nsocks;
  struct sockaddr_storage addr;
  socklen_t addr_len;
  pthread_mutex_t mu; /* adding peers (the executor's connect, the proxy's accept) */
  tcp_peer **peers;   /* by rank; NULL until the peer is first used */
  int *order;         /* ranks of tcp peers, in the order they were added */
  _Atomic int npeers; /* order[0..npeers) are stable once published */
  /* Accepted sockets whose hello has not arrived yet (the dialer may be descheduled
   * between its connect and its hello when ranks outnumber cores): read as it comes,
   * dropped after HELLO_MS.  While all PENDING slots are taken the listener waits. */
  struct {
    int fd;
    uint32_t got;
    uint64_t deadline;
    uint8_t buf[TCP_HELLO_BYTES];
  } pend[PENDING];
  int npend;
  int pfd_cap;
  struct pollfd *pfds;
  tcp_sock **pfd_sock;
  tcp_peer **pfd_peer;
  pthread_t thread;
  bool thread_started;
  _Atomic int stop;       /* 1: flush, say goodbye and leave; 2: leave now */
  _Atomic int sleeping;   /* the proxy is (about to be) in poll(): wake it via evfd */
  _Atomic int first_dead; /* rank of the first peer lost, -1 while none */
} tcp_ctx;

typedef struct {
  uint16_t family, port; /* port in host order */
  uint32_t nsocks;
  uint8_t addr[16];
} tcp_blob;

static void put32(uint8_t *p, uint32_t v) { coll_put32(p, v); }

static void futex_wake_all(_Atomic uint32_t *addr) {
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, 64, NULL, NULL, 0);
}


static bool tcp_can_connect(const coll_comm_view *view, int peer) {
  (void)view;
  (void)peer;
  return true;
}


/* The address peers should connect to: COLL_SOCKET_IFNAME's, else the one this rank's
 * route to the rendezvous leaves from. */
static coll_result pick_addr(const coll_comm_view *view, struct sockaddr_storage *ss,
                             socklen_t *len) {
  const char *want = getenv("COLL_SOCKET_IFNAME");
  memset(ss, 0, sizeof *ss);
  if (want && *want) {
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
      return coll_view_fail(view, COLL_ERR_SYSTEM, "rank %d: listing interfaces failed: %s",
                            view->rank, strerror(errno));
    bool found = false;
    for (int fam = 0; fam < 2 && !found; fam++) /* IPv4 first, then IPv6 */
      for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || strcmp(i->ifa_name, want) != 0 || !(i->ifa_flags & IFF_UP)) continue;
        if (i->ifa_addr->sa_family != (fam ? AF_INET6 : AF_INET)) continue;
        *len = fam ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
        memcpy(ss, i->ifa_addr, *len);
        found = true;
      }
    freeifaddrs(ifs);
    if (!found)
      return coll_view_fail(view, COLL_ERR_INVALID_ARG,
                            "rank %d: COLL_SOCKET_IFNAME=%s names no interface that is up with an "
                            "IP address on this host",
                            view->rank, want);
  } else {
    if (view->local_len == 0)
      return coll_view_fail(view, COLL_ERR_INTERNAL, "rank %d: no local address for TCP",
                            view->rank);
    memcpy(ss, view->local, view->local_len);
    *len = view->local_len;
  }
  if (ss->ss_family == AF_INET)
    ((struct sockaddr_in *)ss)->sin_port = 0;
  else
    ((struct sockaddr_in6 *)ss)->sin6_port = 0;
  return COLL_OK;
}

static coll_result tcp_setup(const coll_comm_view *view, void **ctxp, void *blob) {
  tcp_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return coll_view_fail(view, COLL_ERR_SYSTEM, "out of memory setting up tcp");
  *ctxp = ctx;
  ctx->view = view;
  ctx->listen_fd = ctx->evfd = -1;
  pthread_mutex_init(&ctx->mu, NULL);
  atomic_store(&ctx->first_dead, -1);
  ctx->peers = calloc((size_t)view->nranks, sizeof *ctx->peers);
  ctx->order = calloc((size_t)view->nranks, sizeof *ctx->order);
  if (!ctx->peers || !ctx->order)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "out of memory setting up tcp");
  long ns;
  coll_env_int("COLL_SOCKS_PER_PEER", 2, &ns);
  if (ns < 1 || ns > TCP_MAX_SOCKS)
    return coll_view_fail(view, COLL_ERR_INVALID_ARG, "COLL_SOCKS_PER_PEER=%ld must be 1..%d", ns,
                          TCP_MAX_SOCKS);
  ctx->nsocks = (int)ns;
  coll_result r = pick_addr(view, &ctx->addr, &ctx->addr_len);
  if (r != COLL_OK) return r;
  ctx->listen_fd = socket(ctx->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (ctx->listen_fd < 0)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "rank %d: socket() failed: %s", view->rank,
                          strerror(errno));
  char a[80];
  coll_sock_text(&ctx->addr, a, sizeof a);
  if (bind(ctx->listen_fd, (struct sockaddr *)&ctx->addr, ctx->addr_len) != 0 ||
      listen(ctx->listen_fd, 1024) != 0)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "rank %d: cannot listen for TCP peers on %s: %s",
                          view->rank, a, strerror(errno));
  ctx->addr_len = sizeof ctx->addr;
  getsockname(ctx->listen_fd, (struct sockaddr *)&ctx->addr, &ctx->addr_len);
  coll_sock_set_nonblock(ctx->listen_fd);
  ctx->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (ctx->evfd < 0)
    return coll_view_fail(view, COLL_ERR_SYSTEM, "rank %d: eventfd failed: %s", view->rank,
                          strerror(errno));

  tcp_blob b;
  memset(&b, 0, sizeof b);
  b.family = ctx->addr.ss_family;
  b.nsocks = (uint32_t)ctx->nsocks;
  if (b.family == AF_INET) {
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ctx->addr;
    b.port = ntohs(s4->sin_port);
    memcpy(b.addr, &s4->sin_addr, 4);
  } else {
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ctx->addr;
    b.port = ntohs(s6->sin6_port);
    memcpy(b.addr, &s6->sin6_addr, 16);
  }
  _Static_assert(sizeof b <= COLL_CONN_BLOB, "blob fits");
  memcpy(blob, &b, sizeof b);
  coll_sock_text(&ctx->addr, a, sizeof a);
  COLL_INFO(view->rank, "tcp: listening at %s, %d sockets per peer", a, ctx->nsocks);
  return COLL_OK;
}


static uint64_t setup_deadline(const coll_comm_view *view) {
  int ms = view->timeout_ms > 0 ? view->timeout_ms : 600000;
  return coll_now_ns() + (uint64_t)ms * 1000000u;
}


static void kick_proxy(tcp_ctx *ctx);

/* The entry of `peer`, made on first use by whichever thread needs it first: the
 * executor (connect) or the proxy (an accepted socket from a lower rank).  NULL when out
 * of memory. */
static tcp_peer *peer_entry(tcp_ctx *ctx, int peer) {
  pthread_mutex_lock(&ctx->mu);
  tcp_peer *p = ctx->peers[peer];
  if (p) {
    pthread_mutex_unlock(&ctx->mu);
    return p;
  }
  /* tcp_peer holds cache-line-aligned counters: calloc only promises 16 bytes. */
  size_t psize = (sizeof(tcp_peer) + 63) / 64 * 64;
  p = aligned_alloc(64, psize);
  uint8_t *mem = malloc(2 * (size_t)TCP_NSLOTS * TCP_SLOT_BYTES);
  if (!p || !mem) {
    free(p);
    free(mem);
    pthread_mutex_unlock(&ctx->mu);
    return NULL;
  }
  memset(p, 0, psize);
  /* Touch the FIFOs now: first touch costs ~10 us a page, never on the data path. */
  memset(mem, 0, 2 * (size_t)TCP_NSLOTS * TCP_SLOT_BYTES);
  p->rank = peer;
  p->nsocks = ctx->nsocks;
  for (int k = 0; k < p->nsocks; k++) {
    p->out[k] = (tcp_sock){.fd = -1, .sseq = (uint32_t)k, .rseq = (uint32_t)k};
    p->in[k] = (tcp_sock){.fd = -1, .sseq = (uint32_t)k, .rseq = (uint32_t)k};
  }
  p->send = (tcp_conn){.base = {.t = &coll_transport_tcp,
                                .peer = peer,
                                .is_send = true,
                                .slot_bytes = TCP_SLOT_BYTES,
                                .nslots = TCP_NSLOTS},
                       .slots = mem,
                       .peer = p,
                       .ctx = ctx};
  p->recv = (tcp_conn){.base = {.t = &coll_transport_tcp,
                                .peer = peer,
                                .is_send = false,
                                .slot_bytes = TCP_SLOT_BYTES,
                                .nslots = TCP_NSLOTS},
                       .slots = mem + (size_t)TCP_NSLOTS * TCP_SLOT_BYTES,
                       .peer = p,
                       .ctx = ctx};
  snprintf(p->addr, sizeof p->addr, "rank %d's listener", peer);
  ctx->peers[peer] = p;
  int i = atomic_load(&ctx->npeers);
  ctx->order[i] = peer;
  atomic_store_explicit(&ctx->npeers, i + 1, memory_order_release);
  pthread_mutex_unlock(&ctx->mu);
  return p;
}

/* Called when the executor first needs `peer` (comm.c's coll_comm_use_peer). */
static coll_result tcp_connect(const coll_comm_view *view, void *vctx, int peer,
                               const void *peer_blob, coll_conn **send, coll_conn **recv) {
  tcp_ctx *ctx = vctx;
  tcp_blob b;
  memcpy(&b, peer_blob, sizeof b);
  if ((b.family != AF_INET && b.family != AF_INET6) || b.port == 0 || b.nsocks < 1 ||
      b.nsocks > TCP_MAX_SOCKS)
    return coll_view_fail(view, COLL_ERR_INTERNAL, "rank %d: rank %d sent no usable TCP address",
                          view->rank, peer);
  if ((int)b.nsocks != ctx->nsocks)
    return coll_view_fail(view, COLL_ERR_INVALID_ARG,
                          "rank %d: rank %d uses %u sockets per peer but this rank uses %d: set "
                          "COLL_SOCKS_PER_PEER alike on every rank",
                          view->rank, peer, b.nsocks, ctx->nsocks);
  tcp_peer *p = peer_entry(ctx, peer);
  if (!p) return coll_view_fail(view, COLL_ERR_SYSTEM, "out of memory connecting to rank %d", peer);
  coll_sockaddr_packed pk = {.family = b.family, .port = b.port};
  memcpy(pk.addr, b.addr, sizeof pk.addr);
  struct sockaddr_storage ss;
  socklen_t sl;
  coll_sock_unpack(&pk, &ss, &sl);
  coll_sock_text(&ss, p->addr, sizeof p->addr);
  /* Dial the peer for this rank's sends.  Nothing here waits for the peer's executor:
   * its proxy accepts whenever the sockets arrive, and its sends to this rank come on
   * sockets it dials itself. */
  uint64_t deadline = setup_deadline(view);
  if (!atomic_load(&p->out_ready)) {
    for (int k = 0; k < p->nsocks; k++) {
      int e = 0;
      int fd = coll_sock_dial(&ss, sl, deadline, &e);
      if (fd < 0)
        return coll_view_fail(view, COLL_ERR_REMOTE,
                              "rank %d: cannot open a TCP connection to rank "
                              "%d at %s: %s (is that address reachable from this host? set "
                              "COLL_SOCKET_IFNAME to choose the interface)",
                              view->rank, peer, p->addr, strerror(e));
      p->out[k].fd = fd;
      uint8_t hello[TCP_HELLO_BYTES];
      put32(hello, TCP_HELLO_MAGIC);
      memcpy(hello + 4, view->secret, COLL_SECRET_BYTES);
      put32(hello + 20, (uint32_t)view->rank);
      put32(hello + 24, (uint32_t)k);
      if (!coll_sock_write_all(fd, hello, sizeof hello, deadline))
        return coll_view_fail(view, COLL_ERR_REMOTE,
                              "rank %d: sending the TCP hello to rank %d at "
                              "%s failed",
                              view->rank, peer, p->addr);
    }
    atomic_store_explicit(&p->out_ready, 1, memory_order_release);
    kick_proxy(ctx);
  }
  *send = &p->send.base;
  *recv = &p->recv.base;
  return COLL_OK;
}

/* ---- the proxy ---------------------------------------------------------------------- */

static void wake_conn(tcp_conn *c) {
  futex_wake_all(&c->ctl.tail);
  futex_wake_all(&c->ctl.head);
}

static void lose_peer(tcp_ctx *ctx, tcp_peer *p, const char *fmt, int err) {
  if (atomic_load(&p->dead)) return;
  const coll_comm_view *view = ctx->view;
  if (err)
    snprintf(p->why, sizeof p->why, "rank %d: lost rank %d (TCP %s): %s: %s", view->rank, p->rank,
             p->addr, fmt, strerror(err));
  else
    snprintf(p->why, sizeof p->why, "rank %d: lost rank %d (TCP %s): %s", view->rank, p->rank,
             p->addr, fmt);
  atomic_store(&p->dead, 1);
  int none = -1;
  atomic_compare_exchange_strong(&ctx->first_dead, &none, p->rank);
  COLL_WARN(view->rank, "%s", p->why);
  int np = atomic_load_explicit(&ctx->npeers, memory_order_acquire);
  for (int i = 0; i < np; i++) {
    wake_conn(&ctx->peers[ctx->order[i]]->send);
    wake_conn(&ctx->peers[ctx->order[i]]->recv);
  }
}

static void publish(tcp_conn *c, _Atomic uint32_t *word, _Atomic uint32_t *waiter, uint32_t v) {
  (void)c;
  atomic_store_explicit(word, v, memory_order_release);
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(waiter, memory_order_relaxed)) futex_wake_all(word);
}

/* Moves what can move on peer p's sockets without blocking; true if any byte moved. */
static bool progress_peer(tcp_ctx *ctx, tcp_peer *p, bool *sends_pending) {
  bool moved = false, all_goodbyes = false;
  tcp_conn *s = &p->send, *r = &p->recv;
  uint32_t stail = atomic_load_explicit(&s->ctl.tail, memory_order_acquire);
  uint32_t rhead = atomic_load_explicit(&r->ctl.head, memory_order_acquire);
  bool out_ok = atomic_load_explicit(&p->out_ready, memory_order_acquire);
  /* send every slice the executor has posted, slice k on out socket k % nsocks */
  for (int k = 0; k < p->nsocks && out_ok && !atomic_load(&p->dead); k++) {
    tcp_sock *so = &p->out[k];
    for (;;) {
      if (!so->sactive) {
        if ((int32_t)(stail - so->sseq) <= 0) break;
        put32(so->shdr, s->ctl.bytes[so->sseq % TCP_NSLOTS]);
        so->soff = 0;
        so->sactive = true;
      }
      uint32_t len = coll_get32(so->shdr);
      struct iovec iov[2];
      int n = 0;
      if (so->soff < 4) iov[n++] = (struct iovec){so->shdr + so->soff, 4 - so->soff};
      uint32_t doff = so->soff < 4 ? 0 : so->soff - 4;
      if (len > doff)
        iov[n++] = (struct iovec){s->slots + (size_t)(so->sseq % TCP_NSLOTS) * TCP_SLOT_BYTES +
                                      doff,
                                  len - doff};
      struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
      ssize_t w = sendmsg(so->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        lose_peer(ctx, p, "sending failed", errno);
        return moved;
      }
      moved = true;
      so->soff += (uint32_t)w;
      if (so->soff < 4 + len) break; /* the socket buffer is full */
      so->sactive = false;
      so->sseq += (uint32_t)p->nsocks;
    }
  }
  /* receive into free slots, slice k from in socket k % nsocks (those that arrived) */
  for (int k = 0; k < p->nsocks && !atomic_load(&p->dead); k++) {
    tcp_sock *so = &p->in[k];
    if (so->fd < 0) continue;
    for (;;) {
      if (so->said_goodbye) break;
      if (so->rseq - rhead >= TCP_NSLOTS) break; /* no free slot: TCP holds the rest */
      ssize_t got;
      if (so->roff < 4) {
        got = recv(so->fd, so->rhdr + so->roff, 4 - so->roff, MSG_DONTWAIT);
      } else {
        uint8_t *dst = r->slots + (size_t)(so->rseq % TCP_NSLOTS) * TCP_SLOT_BYTES;
        got = recv(so->fd, dst + so->roff - 4, so->rlen - (so->roff - 4), MSG_DONTWAIT);
      }
      if (got == 0) {
        lose_peer(ctx, p,
                  "the connection was closed without a goodbye: the process died or "
                  "aborted its communicator",
                  0);
        return moved;
      }
      if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        lose_peer(ctx, p, "receiving failed", errno);
        return moved;
      }
      moved = true;
      so->roff += (uint32_t)got;
      if (so->roff == 4) {
        so->rlen = coll_get32(so->rhdr);
        if (so->rlen == TCP_GOODBYE) {
          so->said_goodbye = true;
          so->roff = 0;
          bool all = true;
          for (int j = 0; j < p->nsocks; j++) all = all && p->in[j].said_goodbye;
          all_goodbyes = all;
          break;
        }
        if (so->rlen > TCP_SLOT_BYTES) {
          char msg[96];
          snprintf(msg, sizeof msg,
                   "it sent a %u-byte slice (limit %u): not a libcoll peer of "
                   "this version",
                   so->rlen, TCP_SLOT_BYTES);
          lose_peer(ctx, p, msg, 0);
          return moved;
        }
      }
      if (so->roff >= 4 && so->roff == 4 + so->rlen) {
        r->ctl.bytes[so->rseq % TCP_NSLOTS] = so->rlen;
        so->rseq += (uint32_t)p->nsocks;
        so->roff = 0;
      }
    }
  }
  if (atomic_load(&p->dead)) return moved;
  /* The counters advance to the first slice not yet complete on any socket (a socket
   * that has not arrived yet holds its first slice back). */
  uint32_t shead = atomic_load_explicit(&s->ctl.head, memory_order_relaxed);
  uint32_t h = p->out[0].sseq, t = p->in[0].rseq;
  for (int k = 1; k < p->nsocks; k++) {
    if ((int32_t)(p->out[k].sseq - h) < 0) h = p->out[k].sseq;
    if ((int32_t)(p->in[k].rseq - t) < 0) t = p->in[k].rseq;
  }
  if ((int32_t)(h - stail) > 0) h = stail;
  if (h != shead) publish(s, &s->ctl.head, &s->ctl.head_waiter, h);
  uint32_t rtail = atomic_load_explicit(&r->ctl.tail, memory_order_relaxed);
  if (t != rtail) publish(r, &r->ctl.tail, &r->ctl.tail_waiter, t);
  /* Only now: the slices read in this same pass, just ahead of the goodbyes, are
   * published above, and a waiter that sees `gone` must find them. */
  if (all_goodbyes) {
    atomic_store(&p->gone, 1);
    wake_conn(r);
  }
  if (h != stail) *sends_pending = true;
  return moved;
}

/* Poll events for each socket, given the counters now, then the listener (lower ranks
 * dial whenever they first need this rank) and the eventfd.  Returns the count of
 * pollfds, or -1 when out of memory. */
static int build_poll(tcp_ctx *ctx) {
  int np = atomic_load_explicit(&ctx->npeers, memory_order_acquire);
  int need = 2 * np * ctx->nsocks + PENDING + 2;
  if (need > ctx->pfd_cap) {
    int cap = need * 2;
    struct pollfd *a = realloc(ctx->pfds, (size_t)cap * sizeof *a);
    if (a) ctx->pfds = a;
    tcp_sock **b = realloc(ctx->pfd_sock, (size_t)cap * sizeof *b);
    if (b) ctx->pfd_sock = b;
    tcp_peer **c = realloc(ctx->pfd_peer, (size_t)cap * sizeof *c);
    if (c) ctx->pfd_peer = c;
    if (!a || !b || !c) return -1;
    ctx->pfd_cap = cap;
  }
  int n = 0;
  for (int i = 0; i < np; i++) {
    tcp_peer *p = ctx->peers[ctx->order[i]];
    if (atomic_load(&p->dead)) continue;
    uint32_t stail = atomic_load_explicit(&p->send.ctl.tail, memory_order_acquire);
    uint32_t rhead = atomic_load_explicit(&p->recv.ctl.head, memory_order_acquire);
    bool out_ok = atomic_load_explicit(&p->out_ready, memory_order_acquire);
    for (int k = 0; k < p->nsocks; k++) {
      tcp_sock *so = &p->out[k];
      if (out_ok && (so->sactive || (int32_t)(stail - so->sseq) > 0)) {
        ctx->pfds[n] = (struct pollfd){.fd = so->fd, .events = POLLOUT};
        ctx->pfd_sock[n] = so;
        ctx->pfd_peer[n] = p;
        n++;
      }
      so = &p->in[k];
      if (so->fd >= 0 && !so->said_goodbye) {
        ctx->pfds[n] = (struct pollfd){.fd = so->fd,
                                       .events = so->rseq - rhead < TCP_NSLOTS ? POLLIN : 0};
        ctx->pfd_sock[n] = so;
        ctx->pfd_peer[n] = p;
        n++;
      }
    }
  }
  for (int i = 0; i < ctx->npend; i++) {
    ctx->pfds[n] = (struct pollfd){.fd = ctx->pend[i].fd, .events = POLLIN};
    ctx->pfd_sock[n] = NULL; /* a hello, not a peer's socket */
    ctx->pfd_peer[n] = NULL;
    n++;
  }
  ctx->pfds[n++] = (struct pollfd){.fd = ctx->npend < PENDING ? ctx->listen_fd : -1,
                                   .events = POLLIN};
  ctx->pfds[n++] = (struct pollfd){.fd = ctx->evfd, .events = POLLIN};
  return n;
}

/* Takes the connections waiting on the listener (as many as there are free PENDING
 * slots) and reads the hellos that have arrived.  A hello of a rank of this
 * communicator makes its socket in socket k of that rank's entry; anything else, or
 * nothing within HELLO_MS, is dropped. */
static void accept_peers(tcp_ctx *ctx) {
  const coll_comm_view *view = ctx->view;
  while (ctx->npend < PENDING) {
    int fd = accept4(ctx->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) break;
    ctx->pend[ctx->npend].fd = fd;
    ctx->pend[ctx->npend].got = 0;
    ctx->pend[ctx->npend].deadline = coll_now_ns() + HELLO_MS * 1000000ull;
    ctx->npend++;
  }
  uint64_t now = coll_now_ns();
  for (int i = 0; i < ctx->npend;) {
    __typeof__(ctx->pend[0]) *h = &ctx->pend[i];
    ssize_t k = recv(h->fd, h->buf + h->got, TCP_HELLO_BYTES - h->got, MSG_DONTWAIT);
    if (k > 0) h->got += (uint32_t)k;
    bool done = h->got == TCP_HELLO_BYTES;
    bool gone = k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ||
                now > h->deadline;
    if (!done && !gone) {
      i++;
      continue;
    }
    int fd = h->fd;
    tcp_peer *p = NULL;
    uint32_t from = 0, sk = 0;
    if (done) {
      uint8_t diff = 0;
      for (int j = 0; j < COLL_SECRET_BYTES; j++)
        diff |= (uint8_t)(h->buf[4 + j] ^ view->secret[j]);
      from = coll_get32(h->buf + 20);
      sk = coll_get32(h->buf + 24);
      if (!diff && coll_get32(h->buf) == TCP_HELLO_MAGIC && from < (uint32_t)view->nranks &&
          (int)from != view->rank && sk < (uint32_t)ctx->nsocks)
        p = peer_entry(ctx, (int)from);
    }
    ctx->pend[i] = ctx->pend[--ctx->npend]; /* this slot is free either way */
    if (!p || p->in[sk].fd >= 0) {
      COLL_INFO(view->rank, "tcp: dropped a connection that did not present a valid hello");
      close(fd);
      continue;
    }
    coll_sock_tune(fd);
    p->in[sk].fd = fd;
  }
}

static void send_goodbyes(tcp_ctx *ctx, uint64_t deadline) {
  uint8_t bye[4];
  put32(bye, TCP_GOODBYE);
  int np = atomic_load_explicit(&ctx->npeers, memory_order_acquire);
  for (int i = 0; i < np; i++) {
    tcp_peer *p = ctx->peers[ctx->order[i]];
    if (atomic_load(&p->dead) || !atomic_load(&p->out_ready)) continue;
    for (int k = 0; k < p->nsocks; k++) {
      if (!coll_sock_write_all(p->out[k].fd, bye, 4, deadline)) break;
      shutdown(p->out[k].fd, SHUT_WR);
    }
  }
}

static void *proxy_main(void *arg) {
  tcp_ctx *ctx = arg;
  uint64_t drain_deadline = 0;
  for (;;) {
    int stop = atomic_load(&ctx->stop);
    if (stop == 2) break;
    bool pending = false, moved = false;
    int np = atomic_load_explicit(&ctx->npeers, memory_order_acquire);
    for (int i = 0; i < np; i++) moved |= progress_peer(ctx, ctx->peers[ctx->order[i]], &pending);
    if (stop == 1) {
      if (!drain_deadline) drain_deadline = coll_now_ns() + TCP_DRAIN_MS * 1000000ull;
      if (!pending || coll_now_ns() > drain_deadline) {
        send_goodbyes(ctx, drain_deadline + 1000000000ull);
        break;
      }
    }
    if (moved) continue;
    /* Nothing moved: sleep in poll.  Raise `sleeping` first and build the poll set from
     * the counters after a full fence, so a post that the set misses sees the flag and
     * writes the eventfd (Dekker, as in shm). */
    atomic_store(&ctx->sleeping, 1);
    atomic_thread_fence(memory_order_seq_cst);
    int n = build_poll(ctx);
    if (n < 0) { /* out of memory for the poll set: try again shortly */
      atomic_store(&ctx->sleeping, 0);
      struct timespec ts = {0, 10000000L};
      nanosleep(&ts, NULL);
      continue;
    }
    int rc = poll(ctx->pfds, (nfds_t)n, stop == 1 ? 10 : TCP_IDLE_POLL_MS);
    atomic_store(&ctx->sleeping, 0);
    if (rc > 0 && (ctx->pfds[n - 1].revents & POLLIN)) {
      uint64_t v;
      if (read(ctx->evfd, &v, sizeof v) < 0) {} /* nothing to drain */
    }
    if (ctx->npend || (rc > 0 && (ctx->pfds[n - 2].revents & POLLIN))) accept_peers(ctx);
    /* A hang-up or error with nothing to read shows up as POLLHUP/POLLERR only. */
    for (int i = 0; rc > 0 && i < n - 2; i++)
      if (ctx->pfd_sock[i] && (ctx->pfds[i].revents & (POLLHUP | POLLERR)) &&
          !(ctx->pfds[i].events & POLLIN) && !ctx->pfd_sock[i]->said_goodbye) {
        int e = 0;
        socklen_t el = sizeof e;
        getsockopt(ctx->pfds[i].fd, SOL_SOCKET, SO_ERROR, &e, &el);
        lose_peer(ctx, ctx->pfd_peer[i], "the connection failed", e ? e : ECONNRESET);
      }
  }
  return NULL;
}

static void kick_proxy(tcp_ctx *ctx) {
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&ctx->sleeping, memory_order_relaxed) &&
      atomic_exchange(&ctx->sleeping, 0)) {
    uint64_t one = 1;
    if (write(ctx->evfd, &one, sizeof one) < 0) {} /* the proxy wakes within its poll bound */
  }
}

/* Starts the proxy: from now on it accepts lower ranks' connections as they come. */
static coll_result tcp_ready(const coll_comm_view *view, void *vctx) {
  tcp_ctx *ctx = vctx;
  int e = pthread_create(&ctx->thread, NULL, proxy_main, ctx);
  if (e)
    return coll_view_fail(view, COLL_ERR_SYSTEM,
                          "rank %d: starting the tcp proxy thread failed: %s", view->rank,
                          strerror(e));
  ctx->thread_started = true;
  return COLL_OK;
}

/* ---- data path ------------------------------------------------------------------------ */

static void *tcp_send_slot(coll_conn *cc) {
  tcp_conn *c = (tcp_conn *)cc;
  if (c->pos - c->cached >= TCP_NSLOTS) {
    c->cached = atomic_load_explicit(&c->ctl.head, memory_order_acquire);
    if (c->pos - c->cached >= TCP_NSLOTS) return NULL;
  }
  return c->slots + (size_t)(c->pos % TCP_NSLOTS) * TCP_SLOT_BYTES;
}

static void tcp_send_post(coll_conn *cc, uint32_t bytes) {
  tcp_conn *c = (tcp_conn *)cc;
  c->ctl.bytes[c->pos % TCP_NSLOTS] = bytes;
  c->pos++;
  atomic_store_explicit(&c->ctl.tail, c->pos, memory_order_release);
  kick_proxy(c->ctx);
}

static const void *tcp_recv_slot(coll_conn *cc, uint32_t *bytes) {
  tcp_conn *c = (tcp_conn *)cc;
  if (c->pos == c->cached) {
    c->cached = atomic_load_explicit(&c->ctl.tail, memory_order_acquire);
    if (c->pos == c->cached) return NULL;
  }
  uint32_t i = c->pos % TCP_NSLOTS;
  *bytes = c->ctl.bytes[i];
  return c->slots + (size_t)i * TCP_SLOT_BYTES;
}

static void tcp_recv_release(coll_conn *cc) {
  tcp_conn *c = (tcp_conn *)cc;
  c->pos++;
  atomic_store_explicit(&c->ctl.head, c->pos, memory_order_release);
  kick_proxy(c->ctx);
}

static bool can_go(tcp_conn *c) {
  if (c->base.is_send)
    return c->pos - atomic_load_explicit(&c->ctl.head, memory_order_acquire) < TCP_NSLOTS;
  return atomic_load_explicit(&c->ctl.tail, memory_order_acquire) != c->pos;
}

/* Why this connection can never go on, or NULL. */
static coll_result peer_trouble(const coll_comm_view *view, tcp_conn *c) {
  tcp_ctx *ctx = c->ctx;
  int lost = atomic_load(&ctx->first_dead);
  if (lost >= 0) return coll_view_fail(view, COLL_ERR_REMOTE, "%s", ctx->peers[lost]->why);
  /* Gone, then the counter: the proxy publishes the last slices before `gone`, and a
   * caller that looked at the counter before `gone` was set may have missed them. */
  if (!c->base.is_send && atomic_load(&c->peer->gone) && !can_go(c))
    return coll_view_fail(view, COLL_ERR_REMOTE,
                          "rank %d: rank %d destroyed its communicator while this rank still waits "
                          "for its data (did the ranks call different collectives?)",
                          view->rank, c->peer->rank);
  return COLL_OK;
}

static coll_result tcp_wait(const coll_comm_view *view, coll_conn *cc, int max_ms) {
  tcp_conn *c = (tcp_conn *)cc;
  int spins = view->oversubscribed ? 0 : 2000;
  for (int i = 0; i < spins; i++) {
    if (can_go(c)) return COLL_OK;
    coll_cpu_relax();
  }
  coll_result r = peer_trouble(view, c);
  if (r != COLL_OK) return r;
  _Atomic uint32_t *word = c->base.is_send ? &c->ctl.head : &c->ctl.tail;
  _Atomic uint32_t *flag = c->base.is_send ? &c->ctl.head_waiter : &c->ctl.tail_waiter;
  uint32_t seen = atomic_load(word);
  atomic_store(flag, 1);
  atomic_thread_fence(memory_order_seq_cst);
  if (!can_go(c) && !atomic_load(view->aborted) && atomic_load(&c->ctx->first_dead) < 0 &&
      !atomic_load(&c->peer->gone)) {
    int ms = max_ms < 1 ? 1 : max_ms;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, &ts, NULL, 0);
  }
  atomic_store(flag, 0);
  if (!can_go(c)) return peer_trouble(view, c);
  return COLL_OK;
}

static void tcp_wake(coll_conn *cc) { wake_conn((tcp_conn *)cc); }

static void tcp_close(const coll_comm_view *view, void *vctx, coll_comm_end how) {
  (void)view;
  tcp_ctx *ctx = vctx;
  if (!ctx) return;
  if (ctx->thread_started) {
    /* A healthy communicator flushes what it posted and says goodbye, so peers can tell
     * a normal end from a death; a failed or aborted one just leaves. */
    bool healthy = how == COLL_END_CLEAN && atomic_load(&ctx->first_dead) < 0;
    atomic_store(&ctx->stop, healthy ? 1 : 2);
    uint64_t one = 1;
    if (write(ctx->evfd, &one, sizeof one) < 0) {} /* the proxy polls with a bound anyway */
    pthread_join(ctx->thread, NULL);
  }
  if (ctx->listen_fd >= 0) close(ctx->listen_fd);
  if (ctx->evfd >= 0) close(ctx->evfd);
  for (int i = 0; i < ctx->npend; i++) close(ctx->pend[i].fd);
  if (ctx->peers) {
    int np = atomic_load(&ctx->npeers);
    for (int i = 0; i < np; i++) {
      tcp_peer *p = ctx->peers[ctx->order[i]];
      for (int k = 0; k < p->nsocks; k++) {
        if (p->out[k].fd >= 0) close(p->out[k].fd);
        if (p->in[k].fd >= 0) close(p->in[k].fd);
      }
      free(p->send.slots);
      free(p);
    }
  }
  free(ctx->peers);
  free(ctx->order);
  free(ctx->pfds);
  free(ctx->pfd_sock);
  free(ctx->pfd_peer);
  pthread_mutex_destroy(&ctx->mu);
  free(ctx);
}

const coll_transport coll_transport_tcp = {
    .name = "tcp",
    .slot_bytes = TCP_SLOT_BYTES,
    .lazy = true,
    .can_connect = tcp_can_connect,
    .setup = tcp_setup,
    .connect = tcp_connect,
    .ready = tcp_ready,
    .send_slot = tcp_send_slot,
    .send_post = tcp_send_post,
    .recv_slot = tcp_recv_slot,
    .recv_release = tcp_recv_release,
    .wait = tcp_wait,
    .wake = tcp_wake,
    .close = tcp_close,
};
