/* bootstrap.c — rendezvous over TCP: how ranks find each other during init.
 *
 * The root (a thread of the process that made the unique id, or of rank 0 when the
 * launcher's environment is used) listens on one port.  Each rank connects, proves it
 * belongs to the job by presenting the 16-byte secret carried in the unique id, and then
 * takes part in "rounds": every rank sends one blob, the root answers each rank with all
 * blobs in rank order (an allgather through a star).  Init uses two rounds: connection
 * info, then "everyone has mapped everything" (a barrier).  When every rank has hung up
 * the root thread exits.
 *
 * The root faces the network, so it must never trust a byte: a connection that does not
 * present the secret within a few seconds is dropped without disturbing the job, every
 * length read is bounded before anything is allocated, and all sockets are non-blocking
 * under one poll loop so a stalled or hostile peer cannot hold the others up.
 *
 * Wire format (all integers big-endian):
 *   auth   client->root  u32 magic 'CLBA', u32 version, u8 secret[16], u32 rank, u32 nranks
 *   round  client->root  u32 len (<= COLL_BOOT_MAX_LEN), len bytes
 *   reply  root->client  u32 status (0 ok, 1 error), u32 len, then nranks*len bytes
 *                        (status 1: len bytes of text saying what went wrong)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap_wire.h"
#include "internal.h"

#define ID_MAGIC 0x434f4c4cu /* "COLL" */
#define ID_VERSION 1
#define AUTH_TIMEOUT_MS 5000
#define MAX_CONNS 512

/* ---- unique id ------------------------------------------------------------------- */

coll_result coll_id_encode(const coll_id_fields *f, coll_unique_id *id) {
  memset(id, 0, sizeof *id);
  uint8_t *p = id->internal;
  coll_put32(p, ID_MAGIC);
  p[4] = ID_VERSION >> 8;
  p[5] = ID_VERSION & 0xff;
  p[6] = (uint8_t)(f->family >> 8);
  p[7] = (uint8_t)f->family;
  p[8] = (uint8_t)(f->port >> 8);
  p[9] = (uint8_t)f->port;
  memcpy(p + 10, f->addr, 16);
  memcpy(p + 26, f->secret, COLL_SECRET_BYTES);
  return COLL_OK;
}

coll_result coll_id_decode(const coll_unique_id *id, coll_id_fields *f, char *why,
                           size_t why_len) {
  const uint8_t *p = id->internal;
  memset(f, 0, sizeof *f);
  f->magic = coll_get32(p);
  f->version = (uint16_t)(p[4] << 8 | p[5]);
  f->family = (uint16_t)(p[6] << 8 | p[7]);
  f->port = (uint16_t)(p[8] << 8 | p[9]);
  memcpy(f->addr, p + 10, 16);
  memcpy(f->secret, p + 26, COLL_SECRET_BYTES);
  if (f->magic != ID_MAGIC || f->version != ID_VERSION) {
    snprintf(why, why_len, "the unique id was not made by coll_get_unique_id of this libcoll "
             "version (magic %08x version %u)", f->magic, f->version);
    return COLL_ERR_INVALID_ARG;
  }
  if ((f->family != AF_INET && f->family != AF_INET6) || f->port == 0) {
    snprintf(why, why_len, "the unique id holds no valid address (family %u port %u)",
             f->family, f->port);
    return COLL_ERR_INVALID_ARG;
  }
  return COLL_OK;
}

static void to_sockaddr(const coll_id_fields *f, struct sockaddr_storage *ss, socklen_t *len) {
  memset(ss, 0, sizeof *ss);
  if (f->family == AF_INET6) {
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(f->port);
    memcpy(&s6->sin6_addr, f->addr, 16);
    *len = sizeof *s6;
  } else {
    struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
    s4->sin_family = AF_INET;
    s4->sin_port = htons(f->port);
    memcpy(&s4->sin_addr, f->addr, 4);
    *len = sizeof *s4;
  }
}

static void addr_string(const coll_id_fields *f, char *out, size_t len) {
  char a[INET6_ADDRSTRLEN] = "?";
  inet_ntop(f->family, f->addr, a, sizeof a);
  snprintf(out, len, f->family == AF_INET6 ? "[%s]:%u" : "%s:%u", a, f->port);
}

/* The address peers should use to reach this host: COLL_SOCKET_IFNAME's, else the first
 * interface that is up and not loopback, else loopback. */
static void pick_local_addr(coll_id_fields *f) {
  const char *want = getenv("COLL_SOCKET_IFNAME");
  struct ifaddrs *ifs = NULL, *pick = NULL;
  f->family = AF_INET;
  uint32_t lo = htonl(INADDR_LOOPBACK);
  memcpy(f->addr, &lo, 4);
  if (getifaddrs(&ifs) != 0) return;
  for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    if (want ? strcmp(i->ifa_name, want) == 0 : !(i->ifa_flags & IFF_LOOPBACK)) {
      pick = i;
      break;
    }
  }
  if (pick) memcpy(f->addr, &((struct sockaddr_in *)pick->ifa_addr)->sin_addr, 4);
  else if (want) COLL_WARN(-1, "COLL_SOCKET_IFNAME=%s has no IPv4 address; using loopback", want);
  freeifaddrs(ifs);
}

/* ---- the root server ------------------------------------------------------------- */

typedef struct {
  coll_boot_rx rx; /* first: job.by_rank points at it (bootstrap_parse.c parses into it) */
  int fd;
  uint64_t deadline_ns;
  bool closed;
} root_conn;

typedef struct coll_root {
  int listen_fd;
  int wake_fd;     /* eventfd: coll_bootstrap_root_stop() asks the loop to end */
  bool detached;   /* the thread frees this state itself */
  pthread_t thread;
  coll_boot_job job; /* secret, nranks, rank table */
  int timeout_ms;
  root_conn *conns;
  int nconns;
} root_state;

/* The connection of rank r, or NULL before it joined. */
static root_conn *by_rank(root_state *st, int r) { return (root_conn *)st->job.by_rank[r]; }

static int set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Writes all of buf to a non-blocking socket, waiting at most timeout_ms in total. */
static bool write_all(int fd, const void *buf, size_t len, int timeout_ms) {
  const uint8_t *p = buf;
  uint64_t end = coll_now_ns() + (uint64_t)timeout_ms * 1000000u;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    uint64_t now = coll_now_ns();
    if (now >= end) return false;
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    poll(&pf, 1, (int)((end - now) / 1000000u) + 1);
  }
  return true;
}

static void drop(root_conn *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  coll_boot_rx_free(&c->rx);
  c->closed = true;
}

static void fail_all(root_state *st, const char *msg) {
  uint8_t h[8];
  size_t len = strlen(msg);
  coll_put32(h, 1);
  coll_put32(h + 4, (uint32_t)len);
  for (int i = 0; i < st->nconns; i++) {
    root_conn *c = &st->conns[i];
    if (c->fd < 0) continue;
    if (c->rx.rank >= 0 && write_all(c->fd, h, 8, 1000)) write_all(c->fd, msg, len, 1000);
    drop(c);
  }
  COLL_WARN(-1, "bootstrap root: %s", msg);
}

/* Every registered rank has sent this round's blob: answer all of them. */
static bool serve_round(root_state *st) {
  uint32_t len = by_rank(st, 0)->rx.len;
  for (int r = 1; r < st->job.nranks; r++)
    if (by_rank(st, r)->rx.len != len) {
      char msg[160];
      snprintf(msg, sizeof msg, "rank 0 sent %u bytes in a bootstrap round but rank %d sent "
               "%u: the ranks disagree about the job", len, r, by_rank(st, r)->rx.len);
      fail_all(st, msg);
      return false;
    }
  size_t total = (size_t)len * (size_t)st->job.nranks;
  uint8_t *all = malloc(8 + total);
  if (!all) {
    fail_all(st, "bootstrap root is out of memory");
    return false;
  }
  coll_put32(all, 0);
  coll_put32(all + 4, len);
  for (int r = 0; r < st->job.nranks; r++) {
    if (len) memcpy(all + 8 + (size_t)r * len, by_rank(st, r)->rx.data, len);
    coll_boot_rx_next_round(&by_rank(st, r)->rx);
  }
  for (int r = 0; r < st->job.nranks; r++)
    if (!write_all(by_rank(st, r)->fd, all, 8 + total, st->timeout_ms ? st->timeout_ms : 60000)) {
      free(all);
      char msg[120];
      snprintf(msg, sizeof msg, "could not send the bootstrap reply to rank %d", r);
      fail_all(st, msg);
      return false;
    }
  free(all);
  return true;
}

/* Reads what is available on c and hands it to the parser (bootstrap_parse.c); returns
 * false when c should be dropped. */
static bool feed(root_state *st, root_conn *c, char *why, size_t why_len) {
  uint8_t buf[4096];
  for (;;) {
    ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) {
      if (c->rx.rank >= 0 && (c->rx.have_len || c->rx.got))
        snprintf(why, why_len, "rank %d hung up in the middle of a bootstrap round", c->rx.rank);
      else if (c->rx.rank >= 0)
        snprintf(why, why_len, "rank %d hung up", c->rx.rank);
      else
        why[0] = 0;
      return false;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return true;
      snprintf(why, why_len, "reading from rank %d failed: %s", c->rx.rank, strerror(errno));
      return false;
    }
    if (!coll_boot_rx_input(&st->job, &c->rx, buf, (size_t)n, why, why_len)) {
      if (c->rx.rank < 0 && !why[0])
        COLL_INFO(-1, "bootstrap root: dropped a connection without the job's secret");
      else if (c->rx.rank < 0)
        COLL_WARN(-1, "bootstrap root: %s", why);
      return false;
    }
  }
}

static void *root_main(void *arg) {
  root_state *st = arg;
  bool any_joined = false;
  uint64_t last_progress = coll_now_ns();
  struct pollfd *pfs = calloc(MAX_CONNS + 2, sizeof *pfs);
  if (!pfs) {
    fail_all(st, "bootstrap root is out of memory");
    goto out;
  }
  for (;;) {
    /* Everyone who joined has hung up after the last round: done. */
    if (any_joined) {
      bool all_gone = true;
      for (int r = 0; r < st->job.nranks; r++)
        if (!by_rank(st, r) || !by_rank(st, r)->closed) all_gone = false;
      if (all_gone) break;
    }
    int np = 0;
    pfs[np++] = (struct pollfd){.fd = st->nconns < MAX_CONNS ? st->listen_fd : -1,
                                .events = POLLIN};
    for (int i = 0; i < st->nconns; i++)
      pfs[np++] = (struct pollfd){.fd = st->conns[i].fd, .events = POLLIN};
    pfs[np] = (struct pollfd){.fd = st->wake_fd, .events = POLLIN};
    int rc = poll(pfs, (nfds_t)np + 1, 200);
    if (rc < 0 && errno != EINTR) break;
    if (pfs[np].revents & POLLIN) break; /* asked to stop */
    uint64_t now = coll_now_ns();
    if (st->timeout_ms && now - last_progress > (uint64_t)st->timeout_ms * 1000000u) {
      fail_all(st, "bootstrap timed out: not every rank joined within COLL_TIMEOUT_MS");
      break;
    }
    if (pfs[0].revents & POLLIN) {
      int fd = accept(st->listen_fd, NULL, NULL);
      if (fd >= 0) {
        set_nonblock(fd);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        /* Reuse a dead slot before growing. */
        int slot = -1;
        for (int i = 0; i < st->nconns; i++)
          if (st->conns[i].fd < 0 && st->conns[i].rx.rank < 0) { slot = i; break; }
        if (slot < 0) slot = st->nconns++;
        st->conns[slot] = (root_conn){.fd = fd, .deadline_ns = now + AUTH_TIMEOUT_MS * 1000000ull};
        coll_boot_rx_init(&st->conns[slot].rx);
      }
    }
    bool failed = false;
    for (int i = 1; i < np && !failed; i++) {
      root_conn *c = &st->conns[i - 1];
      if (c->fd < 0 || c->fd != pfs[i].fd) continue;
      if (c->rx.rank < 0 && now > c->deadline_ns) { drop(c); continue; }
      if (!(pfs[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char why[200] = "";
      int before = c->rx.rank;
      if (!feed(st, c, why, sizeof why)) {
        if (why[0]) COLL_INFO(-1, "bootstrap root: %s", why);
        drop(c);
        continue;
      }
      if (before < 0 && c->rx.rank >= 0) { any_joined = true; last_progress = now; }
    }
    /* A rank that hung up while others are in a round can never answer it. */
    for (int r = 0; r < st->job.nranks && !failed; r++) {
      if (!by_rank(st, r) || !by_rank(st, r)->closed) continue;
      for (int o = 0; o < st->job.nranks; o++)
        if (by_rank(st, o) && !by_rank(st, o)->closed && by_rank(st, o)->rx.have_len) {
          char msg[160];
          snprintf(msg, sizeof msg, "rank %d left the job during init (died or gave up)", r);
          fail_all(st, msg);
          failed = true;
          break;
        }
    }
    if (failed) break;
    /* Answer a round once every rank has sent its blob. */
    if (st->job.nranks > 0) {
      bool ready = true;
      for (int r = 0; r < st->job.nranks; r++)
        if (!by_rank(st, r) || by_rank(st, r)->closed || !by_rank(st, r)->rx.have_data) ready = false;
      if (ready) {
        if (!serve_round(st)) break;
        last_progress = coll_now_ns();
      }
    }
  }
out:
  for (int i = 0; i < st->nconns; i++)
    if (st->conns[i].fd >= 0) drop(&st->conns[i]);
  close(st->listen_fd);
  st->listen_fd = -1;
  free(pfs);
  free(st->conns);
  st->conns = NULL;
  coll_boot_job_free(&st->job);
  if (st->detached) {
    close(st->wake_fd);
    free(st);
  }
  return NULL;
}

coll_result coll_bootstrap_root_listen(coll_id_fields *f, bool pick_addr, int timeout_ms,
                                       coll_root **out, char *why, size_t why_len) {
  *out = NULL;
  if (pick_addr) pick_local_addr(f);
  int fd = socket(f->family == AF_INET6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(why, why_len, "bootstrap root: socket() failed: %s", strerror(errno));
    return COLL_ERR_SYSTEM;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_storage ss;
  socklen_t sl;
  coll_id_fields any = *f;
  memset(any.addr, 0, sizeof any.addr); /* listen on every interface */
  to_sockaddr(&any, &ss, &sl);
  if (bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, 128) != 0) {
    char a[80];
    addr_string(f, a, sizeof a);
    snprintf(why, why_len, "bootstrap root: cannot listen on port %u (%s): %s%s", f->port, a,
             strerror(errno),
             errno == EADDRINUSE ? " (another process holds it; set COLL_ADDR to a free port)" : "");
    close(fd);
    return COLL_ERR_SYSTEM;
  }
  if (f->port == 0) {
    sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    f->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
  }
  set_nonblock(fd);
  int wfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  root_state *st = calloc(1, sizeof *st);
  if (st) st->conns = calloc(MAX_CONNS, sizeof *st->conns);
  if (wfd < 0 || !st || !st->conns) {
    if (st) free(st->conns);
    free(st);
    if (wfd >= 0) close(wfd);
    close(fd);
    snprintf(why, why_len, "bootstrap root: out of memory or file descriptors");
    return COLL_ERR_SYSTEM;
  }
  st->listen_fd = fd;
  st->wake_fd = wfd;
  memcpy(st->job.secret, f->secret, COLL_SECRET_BYTES);
  st->timeout_ms = timeout_ms;
  *out = st;
  return COLL_OK;
}

coll_result coll_bootstrap_root_run(coll_root *st, bool detached, char *why, size_t why_len) {
  st->detached = detached;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  if (detached) pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int e = pthread_create(&st->thread, &attr, root_main, st);
  pthread_attr_destroy(&attr);
  if (e) {
    coll_bootstrap_root_discard(st);
    snprintf(why, why_len, "bootstrap root: cannot start its thread: %s", strerror(e));
    return COLL_ERR_SYSTEM;
  }
  return COLL_OK;
}

void coll_bootstrap_root_stop(coll_root *st) {
  if (!st) return;
  uint64_t one = 1;
  if (write(st->wake_fd, &one, sizeof one) < 0) { /* the loop still ends on its own */ }
  pthread_join(st->thread, NULL);
  close(st->wake_fd);
  free(st);
}

void coll_bootstrap_root_forget(coll_root *st) {
  if (!st) return;
  close(st->listen_fd);
  close(st->wake_fd);
}

void coll_bootstrap_root_discard(coll_root *st) {
  if (!st) return;
  coll_bootstrap_root_forget(st);
  free(st->conns);
  free(st);
}

coll_result coll_bootstrap_root_start(coll_id_fields *f, bool pick_addr, int timeout_ms,
                                      char *why, size_t why_len) {
  coll_root *st;
  coll_result r = coll_bootstrap_root_listen(f, pick_addr, timeout_ms, &st, why, why_len);
  if (r != COLL_OK) return r;
  char a[80];
  addr_string(f, a, sizeof a);
  COLL_INFO(-1, "bootstrap root listening at %s", a);
  return coll_bootstrap_root_run(st, true, why, why_len);
}

coll_result coll_make_unique_id(coll_unique_id *id, coll_root **held) {
  coll_id_fields f = {.magic = ID_MAGIC, .version = ID_VERSION};
  if (getrandom(f.secret, sizeof f.secret, 0) != (ssize_t)sizeof f.secret)
    return coll_fail(NULL, COLL_ERR_SYSTEM, "coll_get_unique_id: getrandom failed: %s",
                     strerror(errno));
  char why[256];
  coll_root *st;
  coll_result r = coll_bootstrap_root_listen(&f, true, coll_env_timeout_ms(), &st, why, sizeof why);
  if (r != COLL_OK) return coll_fail(NULL, r, "%s", why);
  char a[80];
  addr_string(&f, a, sizeof a);
  COLL_INFO(-1, "bootstrap root listening at %s", a);
  if (held) {
    *held = st;
  } else if ((r = coll_bootstrap_root_run(st, true, why, sizeof why)) != COLL_OK) {
    return coll_fail(NULL, r, "%s", why);
  }
  return coll_id_encode(&f, id);
}

coll_result coll_get_unique_id(coll_unique_id *id) {
  if (!id) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_get_unique_id: id is NULL");
  return coll_make_unique_id(id, NULL);
}

/* ---- the client side -------------------------------------------------------------- */

static coll_result read_full(struct coll_comm *comm, coll_bootstrap *b, void *buf, size_t len) {
  uint8_t *p = buf;
  uint64_t end = b->timeout_ms ? coll_now_ns() + (uint64_t)b->timeout_ms * 1000000u : UINT64_MAX;
  while (len) {
    ssize_t n = recv(b->fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n == 0)
      return coll_fail(comm, COLL_ERR_REMOTE, "rank %d: the bootstrap root closed the "
                       "connection (a rank died or was refused during init?)", b->rank);
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return coll_fail(comm, COLL_ERR_SYSTEM, "rank %d: bootstrap read failed: %s", b->rank,
                       strerror(errno));
    uint64_t now = coll_now_ns();
    if (now >= end)
      return coll_fail(comm, COLL_ERR_TIMEOUT, "rank %d: no answer from the bootstrap root "
                       "within %d ms: not every rank joined", b->rank, b->timeout_ms);
    struct pollfd pf = {.fd = b->fd, .events = POLLIN};
    uint64_t left = (end - now) / 1000000u + 1;
    poll(&pf, 1, left > 1000 ? 1000 : (int)left);
  }
  return COLL_OK;
}

coll_result coll_bootstrap_connect(struct coll_comm *comm, coll_bootstrap *b,
                                   const coll_id_fields *f, int rank, int nranks) {
  b->fd = -1;
  b->rank = rank;
  b->nranks = nranks;
  b->timeout_ms = comm->timeout_ms;
  struct sockaddr_storage ss;
  socklen_t sl;
  to_sockaddr(f, &ss, &sl);
  char a[80];
  addr_string(f, a, sizeof a);
  uint64_t end = coll_now_ns() + (uint64_t)(b->timeout_ms ? b->timeout_ms : 600000) * 1000000u;
  /* The root may not be listening yet (env launch: rank 0 starts it): retry until the
   * deadline, backing off from 10 ms to 200 ms. */
  int backoff_ms = 10;
  for (;;) {
    int fd = socket(f->family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return coll_fail(comm, COLL_ERR_SYSTEM, "rank %d: socket() failed: %s", rank, strerror(errno));
    if (connect(fd, (struct sockaddr *)&ss, sl) == 0) {
      b->fd = fd;
      break;
    }
    int e = errno;
    close(fd);
    if (coll_now_ns() > end || (e != ECONNREFUSED && e != ETIMEDOUT && e != ENETUNREACH &&
                                e != EHOSTUNREACH && e != EAGAIN && e != EINTR))
      return coll_fail(comm, e == ECONNREFUSED ? COLL_ERR_TIMEOUT : COLL_ERR_SYSTEM,
                       "rank %d: cannot reach the bootstrap root at %s: %s", rank, a,
                       strerror(e));
    struct timespec ts = {0, backoff_ms * 1000000L};
    nanosleep(&ts, NULL);
    if (backoff_ms < 200) backoff_ms *= 2;
  }
  int one = 1;
  setsockopt(b->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  set_nonblock(b->fd);
  uint8_t auth[COLL_AUTH_BYTES];
  coll_auth_build(auth, f->secret, (uint32_t)rank, (uint32_t)nranks);
  if (!write_all(b->fd, auth, sizeof auth, 10000)) {
    coll_bootstrap_close(b);
    return coll_fail(comm, COLL_ERR_SYSTEM, "rank %d: sending to the bootstrap root at %s "
                     "failed", rank, a);
  }
  return COLL_OK;
}

coll_result coll_bootstrap_allgather(struct coll_comm *comm, coll_bootstrap *b,
                                     const void *mine, void *all, size_t len) {
  uint8_t h[8];
  coll_put32(h, (uint32_t)len);
  if (!write_all(b->fd, h, 4, 10000) || !write_all(b->fd, mine, len, 10000))
    return coll_fail(comm, COLL_ERR_REMOTE, "rank %d: the bootstrap root went away", b->rank);
  coll_result r = read_full(comm, b, h, 8);
  if (r != COLL_OK) return r;
  uint32_t status = coll_get32(h), n = coll_get32(h + 4);
  if (status != 0) {
    char msg[256] = "";
    if (n >= sizeof msg) n = sizeof msg - 1;
    if (read_full(comm, b, msg, n) == COLL_OK) msg[n] = 0;
    return coll_fail(comm, COLL_ERR_REMOTE, "rank %d: bootstrap failed: %s", b->rank, msg);
  }
  if (n != len)
    return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: bootstrap reply of %u bytes per rank, "
                     "expected %zu", b->rank, n, len);
  return read_full(comm, b, all, len * (size_t)b->nranks);
}

void coll_bootstrap_close(coll_bootstrap *b) {
  if (b->fd >= 0) close(b->fd);
  b->fd = -1;
}
