/* bootstrap.c — rendezvous over TCP: how ranks find each other during init.
 *
 * The root (a thread of the process that made the unique id, or of rank 0 when the
 * launcher's environment is used) listens on one port.  It only introduces the ranks:
 *
 *   1. each rank listens on a port of its own, connects to the root, proves it belongs
 *      to the job (the 16-byte secret of the unique id), registers that port and hangs
 *      up — the root holds a bounded number of connections at a time, not one per rank;
 *   2. once all N have registered, the root connects back to each rank in turn and
 *      tells it where its ring neighbour rank+1 listens, then its thread ends;
 *   3. each rank dials rank+1 and accepts rank-1: a ring of two sockets per rank;
 *   4. each init round (coll_bootstrap_allgather) is a ring all-gather: N-1 hops, every
 *      rank sending and receiving (N-1)·len bytes.  Nothing goes through the root.
 *
 * So the root's work per rank is constant (one short connection in, one out), a rank
 * holds three descriptors whatever N is, and init moves O(N) bytes per rank instead of
 * O(N²) through one socket.  A failure anywhere — a rank that dies, gives up or sends
 * what the job does not expect — travels round the ring both ways as an error frame
 * naming its origin, and the root tells every registered rank when a rank cannot be
 * reached or the job did not assemble within COLL_TIMEOUT_MS.
 *
 * The root faces the network, so it must never trust a byte: a connection that does not
 * present the secret within a few seconds is dropped without disturbing the job, every
 * length read is bounded before anything is allocated (bootstrap_parse.c, fuzzed), and
 * all sockets are non-blocking under one poll loop so a stalled or hostile peer cannot
 * hold the others up.  The ranks' own listeners admit only hellos with the secret
 * (ring_link.c).
 *
 * Wire format (all integers big-endian):
 *   auth     rank->root  u32 magic 'CLBA', u32 version, u8 secret[16], u32 rank, u32 nranks
 *   register rank->root  u32 len (= 20), a packed address (sock.h)
 *   answer   root->rank  u32 status (0 ok, 1 error), u32 len, len bytes of text
 *   note     root->rank  a hello (ring_link.c) of kind NOTE: a = 0 and the next rank's
 *                        packed address, or a = 1 and the text of what went wrong
 *   ring     rank->rank  a hello of kind RING (a = the dialling rank), then frames:
 *                        DATA (a = the block's rank, len bytes) or ERROR (text)
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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap_wire.h"
#include "bootstrap.h"
#include "internal.h"
#include "ring_link.h"
#include "sock.h"

#define ID_MAGIC 0x434f4c4cu /* "COLL" */
#define ID_VERSION 1
#define AUTH_TIMEOUT_MS 5000             /* a registration must finish within this */
#define MAX_INFLIGHT 128                 /* registrations the root serves at once */
#define ROOT_TELL_MS 5000                /* the root's note to one rank */
#define COLL_BOOT_LINK_MAGIC 0x434c424cu /* "CLBL": the ranks' bootstrap listeners */
enum { BOOT_FRAME_DATA = 1, BOOT_FRAME_ERROR = 2 };

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

coll_result coll_id_decode(const coll_unique_id *id, coll_id_fields *f, char *why, size_t why_len) {
  const uint8_t *p = id->internal;
  memset(f, 0, sizeof *f);
  f->magic = coll_get32(p);
  f->version = (uint16_t)(p[4] << 8 | p[5]);
  f->family = (uint16_t)(p[6] << 8 | p[7]);
  f->port = (uint16_t)(p[8] << 8 | p[9]);
  memcpy(f->addr, p + 10, 16);
  memcpy(f->secret, p + 26, COLL_SECRET_BYTES);
  if (f->magic != ID_MAGIC || f->version != ID_VERSION) {
    snprintf(why, why_len,
             "the unique id was not made by coll_get_unique_id of this libcoll "
             "version (magic %08x version %u)",
             f->magic, f->version);
    return COLL_ERR_INVALID_ARG;
  }
  if ((f->family != AF_INET && f->family != AF_INET6) || f->port == 0) {
    snprintf(why, why_len, "the unique id holds no valid address (family %u port %u)", f->family,
             f->port);
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
  if (pick)
    memcpy(f->addr, &((struct sockaddr_in *)pick->ifa_addr)->sin_addr, 4);
  else if (want)
    COLL_WARN(-1, "COLL_SOCKET_IFNAME=%s has no IPv4 address; using loopback", want);
  freeifaddrs(ifs);
}

/* ---- the root server ------------------------------------------------------------- */

/* A registration in progress: one short-lived connection. */
typedef struct {
  coll_boot_rx rx; /* first: job.by_rank points at it while the rank registers */
  int fd;
  uint64_t deadline_ns;
} root_conn;

typedef struct coll_root {
  int listen_fd;
  int wake_fd;   /* eventfd: coll_bootstrap_root_stop() asks the loop to end */
  bool detached; /* the thread frees this state itself */
  pthread_t thread;
  coll_boot_job job; /* secret, nranks, rank table */
  int timeout_ms;
  root_conn *conns;            /* MAX_INFLIGHT registrations in progress (fd -1: free) */
  coll_sockaddr_packed *addrs; /* per rank: where it listens for its ring links */
  int registered;
  /* The job failed: every rank that registered has been told why, and ranks that come
   * later hear it in the answer to their registration.  `lost`: ranks that never will. */
  bool failed;
  int lost;
  char failure[COLL_LINK_NOTE_MAX];
} root_state;

/* job.by_rank[r] of a rank that finished registering (its connection is gone). */
static coll_boot_rx registered_mark;

/* Ends a registration connection; one that had authenticated but not finished takes its
 * rank's place back (the caller decides whether that fails the job). */
static void drop(root_state *st, root_conn *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  if (c->rx.rank >= 0 && st->job.by_rank && st->job.by_rank[c->rx.rank] == &c->rx)
    st->job.by_rank[c->rx.rank] = NULL;
  coll_boot_rx_free(&c->rx);
  coll_boot_rx_init(&c->rx);
}

/* Sends rank r its note: status 0 with its next neighbour's address, or 1 with `msg`.
 * False when the rank cannot be reached (it died or gave up). */
static bool tell(root_state *st, int r, uint32_t status, const void *note, uint32_t len, char *why,
                 size_t why_len) {
  struct sockaddr_storage ss;
  socklen_t sl;
  if (!coll_sock_unpack(&st->addrs[r], &ss, &sl)) {
    snprintf(why, why_len, "rank %d registered no usable address", r);
    return false;
  }
  coll_ring_link l;
  coll_ring_link_init(&l, COLL_BOOT_LINK_MAGIC, st->job.secret, -1, st->job.nranks);
  int fd = coll_link_dial(&l, &ss, sl, COLL_HELLO_NOTE, status, note, len,
                          coll_deadline_ms(ROOT_TELL_MS), why, why_len);
  if (fd < 0) return false;
  close(fd);
  return true;
}

/* Every registered rank (and every registration in progress) learns that the job failed. */
static void fail_all(root_state *st, const char *msg) {
  COLL_WARN(-1, "bootstrap root: %s", msg);
  if (!st->failed) snprintf(st->failure, sizeof st->failure, "%s", msg);
  st->failed = true;
  uint32_t len = (uint32_t)strlen(msg);
  if (len > COLL_LINK_NOTE_MAX) len = COLL_LINK_NOTE_MAX;
  uint8_t h[8];
  coll_put32(h, 1);
  coll_put32(h + 4, len);
  for (int i = 0; i < MAX_INFLIGHT; i++) {
    root_conn *c = &st->conns[i];
    if (c->fd < 0) continue;
    if (c->rx.rank >= 0 && coll_sock_write_all(c->fd, h, 8, coll_deadline_ms(1000)))
      coll_sock_write_all(c->fd, msg, len, coll_deadline_ms(1000));
    drop(st, c);
  }
  char why[160];
  for (int r = 0; r < st->job.nranks; r++)
    if (st->job.by_rank[r] == &registered_mark) tell(st, r, 1, msg, len, why, sizeof why);
}

/* A registration is complete: keep the address, answer, hang up. */
static bool registered(root_state *st, root_conn *c, char *why, size_t why_len) {
  int r = c->rx.rank;
  if (c->rx.len != sizeof(coll_sockaddr_packed)) {
    snprintf(why, why_len,
             "rank %d registered a %u-byte address (expected %zu): not a "
             "libcoll of this version",
             r, c->rx.len, sizeof(coll_sockaddr_packed));
    return false;
  }
  if (!st->addrs && !(st->addrs = calloc((size_t)st->job.nranks, sizeof *st->addrs))) {
    snprintf(why, why_len, "the bootstrap root is out of memory for %d ranks", st->job.nranks);
    return false;
  }
  memcpy(&st->addrs[r], c->rx.data, sizeof st->addrs[r]);
  uint8_t ok[8] = {0};
  uint32_t flen = (uint32_t)strlen(st->failure);
  if (st->failed) { /* too late: the job already failed, say why */
    coll_put32(ok, 1);
    coll_put32(ok + 4, flen);
  }
  if (coll_sock_write_all(c->fd, ok, sizeof ok, coll_deadline_ms(1000)) && st->failed)
    coll_sock_write_all(c->fd, st->failure, flen, coll_deadline_ms(1000));
  st->job.by_rank[r] = &registered_mark;
  c->rx.rank = -1; /* drop() must not give the place back */
  drop(st, c);
  st->registered++;
  return true;
}

/* Reads what is available on c and hands it to the parser (bootstrap_parse.c); false
 * when c should be dropped (`why` empty: a stranger, or a rank that simply finished). */
static bool feed(root_state *st, root_conn *c, char *why, size_t why_len) {
  uint8_t buf[512];
  why[0] = 0;
  for (;;) {
    ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) {
      if (c->rx.rank >= 0)
        snprintf(why, why_len,
                 "rank %d left the job during init (it hung "
                 "up before it had registered)",
                 c->rx.rank);
      return false;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return true;
      if (c->rx.rank >= 0)
        snprintf(why, why_len,
                 "rank %d left the job during init (reading "
                 "its registration failed: %s)",
                 c->rx.rank, strerror(errno));
      return false;
    }
    if (!coll_boot_rx_input(&st->job, &c->rx, buf, (size_t)n, why, why_len)) {
      if (c->rx.rank < 0 && !why[0])
        COLL_INFO(-1, "bootstrap root: dropped a connection without the job's secret");
      else if (c->rx.rank >= 0)
        snprintf(why + strlen(why), why_len - strlen(why),
                 ": rank %d left the job during "
                 "init",
                 c->rx.rank);
      return false;
    }
    if (c->rx.have_data) return registered(st, c, why, why_len) && false;
  }
}

/* Everyone registered: tell each rank where its next neighbour listens.  A rank that
 * cannot be reached any more fails the job, and everyone hears why. */
static void hand_out(root_state *st) {
  int n = st->job.nranks;
  for (int r = 0; r < n; r++) {
    char why[160];
    if (!tell(st, r, 0, &st->addrs[(r + 1) % n], sizeof *st->addrs, why, sizeof why)) {
      char msg[300];
      snprintf(msg, sizeof msg,
               "rank %d left the job during init (the root could not reach "
               "it: %s)",
               r, why);
      st->job.by_rank[r] = NULL;
      fail_all(st, msg);
      return;
    }
  }
  COLL_INFO(-1, "bootstrap root: all %d ranks registered and know their ring neighbours", n);
}

static void *root_main(void *arg) {
  root_state *st = arg;
  uint64_t last_progress = coll_now_ns();
  struct pollfd pfs[MAX_INFLIGHT + 2];
  int idx[MAX_INFLIGHT];
  for (;;) {
    if (st->job.nranks > 0 && st->registered + st->lost >= st->job.nranks) {
      if (!st->failed) hand_out(st);
      break;
    }
    int np = 0, busy = 0;
    for (int i = 0; i < MAX_INFLIGHT; i++) busy += st->conns[i].fd >= 0;
    pfs[np++] = (struct pollfd){.fd = busy < MAX_INFLIGHT ? st->listen_fd : -1, .events = POLLIN};
    pfs[np++] = (struct pollfd){.fd = st->wake_fd, .events = POLLIN};
    for (int i = 0; i < MAX_INFLIGHT; i++)
      if (st->conns[i].fd >= 0) {
        idx[np - 2] = i;
        pfs[np++] = (struct pollfd){.fd = st->conns[i].fd, .events = POLLIN};
      }
    int rc = poll(pfs, (nfds_t)np, 200);
    if (rc < 0 && errno != EINTR) break;
    if (pfs[1].revents & POLLIN) break; /* asked to stop */
    uint64_t now = coll_now_ns();
    if (st->timeout_ms && now - last_progress > (uint64_t)st->timeout_ms * 1000000u) {
      if (st->failed) break; /* told everyone who came */
      char msg[300];
      int missing = 0, shown = 0;
      size_t at = (size_t)snprintf(msg, sizeof msg,
                                   "bootstrap timed out: not every rank "
                                   "joined within COLL_TIMEOUT_MS");
      for (int r = 0; r < st->job.nranks; r++)
        if (st->job.by_rank[r] != &registered_mark) {
          missing++;
          if (shown < 8 && at < sizeof msg - 16)
            at += (size_t)snprintf(msg + at, sizeof msg - at, "%s%d",
                                   shown++ ? ", " : " (missing: rank ", r);
        }
      if (shown && at < sizeof msg - 24)
        snprintf(msg + at, sizeof msg - at, missing > shown ? ", ... %d in all)" : ")", missing);
      fail_all(st, msg);
      break;
    }
    /* Each pass accepts what is waiting (up to the in-flight bound). */
    while (pfs[0].revents & POLLIN) {
      int slot = -1;
      for (int i = 0; i < MAX_INFLIGHT && slot < 0; i++)
        if (st->conns[i].fd < 0) slot = i;
      if (slot < 0) break;
      int fd = accept4(st->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) break;
      coll_sock_tune(fd);
      st->conns[slot].fd = fd;
      st->conns[slot].deadline_ns = now + AUTH_TIMEOUT_MS * 1000000ull;
      coll_boot_rx_init(&st->conns[slot].rx);
    }
    for (int k = 2; k < np; k++) {
      root_conn *c = &st->conns[idx[k - 2]];
      if (c->fd < 0 || c->fd != pfs[k].fd) continue;
      if (now > c->deadline_ns) {
        if (c->rx.rank >= 0) {
          char msg[160];
          snprintf(msg, sizeof msg,
                   "rank %d left the job during init (it did not finish "
                   "registering within %d ms)",
                   c->rx.rank, AUTH_TIMEOUT_MS);
          drop(st, c);
          st->lost++;
          fail_all(st, msg);
          last_progress = now;
        } else {
          drop(st, c);
        }
        continue;
      }
      if (!(pfs[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char why[300];
      int before = st->registered;
      if (feed(st, c, why, sizeof why)) continue;
      if (st->registered > before) {
        last_progress = now;
        continue; /* registered and hung up: the normal end of a registration */
      }
      bool authed = c->rx.rank >= 0; /* a rank of the job that will never register now */
      drop(st, c);
      if (why[0] && authed) {
        st->lost++;
        fail_all(st, why);
        last_progress = now;
      } else if (why[0]) {
        COLL_INFO(-1, "bootstrap root: %s", why);
      }
    }
  }
  for (int i = 0; i < MAX_INFLIGHT; i++)
    if (st->conns[i].fd >= 0) drop(st, &st->conns[i]);
  close(st->listen_fd);
  st->listen_fd = -1;
  free(st->conns);
  st->conns = NULL;
  free(st->addrs);
  st->addrs = NULL;
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
  if (bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, 4096) != 0) {
    char a[80];
    addr_string(f, a, sizeof a);
    snprintf(why, why_len, "bootstrap root: cannot listen on port %u (%s): %s%s", f->port, a,
             strerror(errno),
             errno == EADDRINUSE ? " (another process holds it; set COLL_ADDR to a free port)"
                                 : "");
    close(fd);
    return COLL_ERR_SYSTEM;
  }
  if (f->port == 0) {
    sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    f->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
  }
  coll_sock_set_nonblock(fd);
  int wfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  root_state *st = calloc(1, sizeof *st);
  if (st) st->conns = calloc(MAX_INFLIGHT, sizeof *st->conns);
  if (wfd < 0 || !st || !st->conns) {
    if (st) free(st->conns);
    free(st);
    if (wfd >= 0) close(wfd);
    close(fd);
    snprintf(why, why_len, "bootstrap root: out of memory or file descriptors");
    return COLL_ERR_SYSTEM;
  }
  for (int i = 0; i < MAX_INFLIGHT; i++) {
    st->conns[i].fd = -1;
    coll_boot_rx_init(&st->conns[i].rx);
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
  if (write(st->wake_fd, &one, sizeof one) < 0) {} /* the loop still ends on its own */
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

coll_result coll_bootstrap_root_start(coll_id_fields *f, bool pick_addr, int timeout_ms, char *why,
                                      size_t why_len) {
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

/* Registers with the root over a short connection: auth, then one round carrying the
 * address where this rank listens for its ring links; the root answers ok or why not. */
static coll_result register_with_root(struct coll_comm *comm, coll_bootstrap *b,
                                      const coll_id_fields *f, const char *at, uint64_t end) {
  struct sockaddr_storage ss;
  socklen_t sl;
  to_sockaddr(f, &ss, &sl);
  int rank = b->rank;
  /* The root may not be listening yet (env launch: rank 0 starts it): retry until the
   * deadline, backing off from 10 ms to 200 ms. */
  int backoff_ms = 10, fd = -1;
  for (;;) {
    fd = socket(f->family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return coll_fail(comm, COLL_ERR_SYSTEM, "rank %d: socket() failed: %s", rank,
                       strerror(errno));
    if (connect(fd, (struct sockaddr *)&ss, sl) == 0) break;
    int e = errno;
    close(fd);
    if (coll_now_ns() > end || (e != ECONNREFUSED && e != ETIMEDOUT && e != ENETUNREACH &&
                                e != EHOSTUNREACH && e != EAGAIN && e != EINTR))
      return coll_fail(comm, e == ECONNREFUSED ? COLL_ERR_TIMEOUT : COLL_ERR_SYSTEM,
                       "rank %d: cannot reach the bootstrap root at %s: %s", rank, at, strerror(e));
    struct timespec ts = {0, backoff_ms * 1000000L};
    nanosleep(&ts, NULL);
    if (backoff_ms < 200) backoff_ms *= 2;
  }
  coll_sock_tune(fd);
  /* The route to the root says which local address peers can reach. */
  b->local_len = sizeof b->local;
  if (getsockname(fd, (struct sockaddr *)&b->local, &b->local_len) != 0) b->local_len = 0;
  char why[200];
  if (!b->local_len || !coll_ring_link_listen(&b->link, &b->local, b->local_len, why, sizeof why)) {
    close(fd);
    return coll_fail(comm, COLL_ERR_SYSTEM, "rank %d: bootstrap: %s", rank,
                     b->local_len ? why : "no local address");
  }
  uint8_t msg[COLL_AUTH_BYTES + 4 + sizeof(coll_sockaddr_packed)];
  coll_auth_build(msg, f->secret, (uint32_t)rank, (uint32_t)b->nranks);
  coll_put32(msg + COLL_AUTH_BYTES, sizeof(coll_sockaddr_packed));
  coll_sockaddr_packed me;
  coll_sock_pack(&b->link.bound, &me);
  memcpy(msg + COLL_AUTH_BYTES + 4, &me, sizeof me);
  uint8_t h[8];
  bool sent = coll_sock_write_all(fd, msg, sizeof msg, end);
  bool answered = sent && coll_sock_read_all(fd, h, 8, end);
  if (answered && coll_get32(h) != 0) {
    char text[COLL_LINK_NOTE_MAX + 1] = "";
    uint32_t n = coll_get32(h + 4);
    if (n > COLL_LINK_NOTE_MAX) n = COLL_LINK_NOTE_MAX;
    if (coll_sock_read_all(fd, text, n, coll_deadline_ms(1000))) text[n] = 0;
    close(fd);
    return coll_fail(comm, COLL_ERR_REMOTE, "rank %d: bootstrap failed: %s", rank, text);
  }
  close(fd);
  if (!answered)
    return coll_fail(comm, coll_now_ns() >= end ? COLL_ERR_TIMEOUT : COLL_ERR_REMOTE,
                     "rank %d: the bootstrap root at %s did not accept the registration (a "
                     "rank died or was refused during init?)",
                     rank, at);
  return COLL_OK;
}

/* Init failed on this rank: tell both neighbours `text` (the sentence of the failure's
 * origin, passed on unchanged) so that it goes round both ways instead of each rank
 * timing out.  Bounded: a neighbour that does not read gets a second at most. */
static void spread_failure(coll_bootstrap *b, const char *text) {
  snprintf(b->why, sizeof b->why, "%s", text);
  uint32_t len = (uint32_t)strlen(b->why);
  uint64_t d = coll_deadline_ms(1000);
  int err;
  if (b->link.next_fd >= 0) {
    /* Finish the frame in flight first: the stream must stay parseable. */
    while (!coll_frame_idle(&b->tx) && coll_frame_write(b->link.next_fd, &b->tx, &err) == 0 &&
           coll_now_ns() < d) {
      struct pollfd pf = {.fd = b->link.next_fd, .events = POLLOUT};
      poll(&pf, 1, 10);
    }
    if (coll_frame_idle(&b->tx)) {
      coll_frame_start(&b->tx, BOOT_FRAME_ERROR, (uint32_t)b->rank, b->why, len);
      coll_sock_write_all(b->link.next_fd, b->tx.buf, b->tx.len, d);
      b->tx.off = b->tx.len;
    }
    shutdown(b->link.next_fd, SHUT_WR);
  }
  if (b->link.prev_fd >= 0 && b->link.prev_fd != b->link.next_fd) {
    coll_frame_tx t;
    coll_frame_start(&t, BOOT_FRAME_ERROR, (uint32_t)b->rank, b->why, len);
    coll_sock_write_all(b->link.prev_fd, t.buf, t.len, d);
    shutdown(b->link.prev_fd, SHUT_WR);
  }
  b->failed = true;
}

static coll_result fail_ring(struct coll_comm *comm, coll_bootstrap *b, coll_result r,
                             const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static coll_result fail_ring(struct coll_comm *comm, coll_bootstrap *b, coll_result r,
                             const char *fmt, ...) {
  char msg[COLL_LINK_FRAME_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  coll_fail(comm, r, "%s", msg);
  spread_failure(b, msg);
  return r;
}

/* A failure that reached this rank from `from` (a neighbour, or -1: the root). */
static coll_result failure_arrived(struct coll_comm *comm, coll_bootstrap *b,
                                   const coll_frame_rx *rx, const char *text) {
  (void)rx;
  coll_fail(comm, COLL_ERR_REMOTE, "rank %d: bootstrap failed: %s", b->rank, text);
  spread_failure(b, text);
  return COLL_ERR_REMOTE;
}

/* A connection on the listener during init: the root's note, or the prev rank's ring
 * link.  Returns COLL_OK (possibly having taken nothing) or the failure it carried. */
static coll_result take_hello(struct coll_comm *comm, coll_bootstrap *b, uint64_t end) {
  coll_link_hello h;
  int fd = coll_link_accept(&b->link, &h, end);
  if (fd < 0) return COLL_OK;
  int prev = (b->rank + b->nranks - 1) % b->nranks;
  if (h.kind == COLL_HELLO_RING) {
    if ((int)h.a != prev || b->link.prev_fd >= 0) {
      COLL_INFO(b->rank, "bootstrap: dropped a ring link from rank %u (expected one from rank %d)",
                h.a, prev);
      close(fd);
      return COLL_OK;
    }
    b->link.prev_fd = fd;
    return COLL_OK;
  }
  close(fd);
  if (h.a != 0) { /* the root says the job failed */
    char text[COLL_LINK_NOTE_MAX + 1];
    memcpy(text, h.note, h.len);
    text[h.len] = 0;
    return failure_arrived(comm, b, NULL, text);
  }
  if (h.len != sizeof(coll_sockaddr_packed) || b->have_next) return COLL_OK;
  memcpy(&b->next_addr, h.note, sizeof b->next_addr);
  b->have_next = true;
  return COLL_OK;
}

coll_result coll_bootstrap_connect(struct coll_comm *comm, coll_bootstrap *b,
                                   const coll_id_fields *f, int rank, int nranks) {
  memset(b, 0, sizeof *b);
  b->rank = rank;
  b->nranks = nranks;
  b->timeout_ms = comm->timeout_ms;
  coll_ring_link_init(&b->link, COLL_BOOT_LINK_MAGIC, f->secret, rank, nranks);
  b->tx.off = b->tx.len = 0;
  char at[80];
  addr_string(f, at, sizeof at);
  uint64_t end = coll_deadline_ms(b->timeout_ms ? b->timeout_ms : 600000);
  coll_result r = register_with_root(comm, b, f, at, end);
  if (r != COLL_OK) return r;
  b->end_ns = end;
  return COLL_OK;
}

/* Waits for the root's note (the next rank's address), dials next, accepts prev; any of
 * them may come first.  Run by the first round, so a rank sets up its transports while
 * the others are still joining (and a rank that joined leaves a trace of itself, its
 * shared segment, before it waits: what the stale-segment check relies on). */
static coll_result form_ring(struct coll_comm *comm, coll_bootstrap *b) {
  int rank = b->rank, nranks = b->nranks;
  uint64_t end = b->end_ns;
  coll_result r;
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  bool need_ring = nranks > 1;
  while (!b->have_next || (need_ring && (b->link.next_fd < 0 || b->link.prev_fd < 0))) {
    /* The root gives up on a missing rank at the same deadline and then says which
     * ranks are missing: wait a second longer for that sentence. */
    if (coll_now_ns() >= end + (b->have_next || end == UINT64_MAX ? 0 : 1000000000ull)) {
      if (!b->have_next)
        return coll_fail(comm, COLL_ERR_TIMEOUT,
                         "rank %d: bootstrap: the root did not say "
                         "within %d ms that every rank joined",
                         rank, b->timeout_ms);
      return coll_fail(comm, COLL_ERR_TIMEOUT,
                       "rank %d: bootstrap: rank %d did not open its "
                       "ring link within %d ms",
                       rank, prev, b->timeout_ms);
    }
    if (b->have_next && need_ring && b->link.next_fd < 0) {
      struct sockaddr_storage ss;
      socklen_t sl;
      char why[200];
      if (!coll_sock_unpack(&b->next_addr, &ss, &sl))
        return coll_fail(comm, COLL_ERR_INTERNAL,
                         "rank %d: bootstrap: the root sent no usable "
                         "address for rank %d",
                         rank, next);
      b->link.next_fd = coll_link_dial(&b->link, &ss, sl, COLL_HELLO_RING, (uint32_t)rank, NULL, 0,
                                       end, why, sizeof why);
      if (b->link.next_fd < 0)
        return fail_ring(comm, b, COLL_ERR_REMOTE,
                         "rank %d: bootstrap: rank %d left the job "
                         "during init (%s)",
                         rank, next, why);
      continue;
    }
    struct pollfd pf[2] = {{.fd = b->link.listen_fd, .events = POLLIN},
                           {.fd = b->link.next_fd, .events = POLLIN}};
    int np = b->link.next_fd >= 0 ? 2 : 1;
    poll(pf, (nfds_t)np, 100);
    if (np == 2 && pf[1].revents) { /* only a failure can come from next before round 1 */
      int err = 0, k = coll_frame_read(b->link.next_fd, &b->rx_next, &err);
      if (k == 1 && b->rx_next.kind == BOOT_FRAME_ERROR) {
        char text[COLL_LINK_FRAME_MAX + 1];
        memcpy(text, b->rx_next.data, b->rx_next.len);
        text[b->rx_next.len] = 0;
        return failure_arrived(comm, b, NULL, text);
      }
      if (k < 0)
        return fail_ring(comm, b, COLL_ERR_REMOTE,
                         "rank %d: bootstrap: rank %d left the job "
                         "during init (%s)",
                         rank, next, err ? strerror(err) : "its ring link closed");
    }
    if (pf[0].revents & POLLIN) {
      if ((r = take_hello(comm, b, end)) != COLL_OK) return r;
    }
  }
  return COLL_OK;
}

/* Ring allgather: rank r sends its own block to next, then forwards each block that
 * arrives from prev, except the last (which next already has: it is next's own).
 * After N-1 steps everyone has every block.  The root carries nothing: each rank moves
 * (N-1)·len bytes each way, and the round takes N-1 hops.  Sends and receives progress
 * together under one poll, so no rank waits on a full socket while its prev waits on it. */
coll_result coll_bootstrap_allgather(struct coll_comm *comm, coll_bootstrap *b, const void *mine,
                                     void *all, size_t len) {
  int n = b->nranks, me = b->rank;
  memcpy((uint8_t *)all + (size_t)me * len, mine, len);
  if (b->failed)
    return coll_fail(comm, COLL_ERR_REMOTE, "rank %d: the bootstrap already failed", me);
  if (!b->formed) {
    coll_result fr = form_ring(comm, b);
    if (fr != COLL_OK) return fr;
    b->formed = true;
  }
  if (n == 1) return COLL_OK;
  if (len > COLL_LINK_FRAME_MAX)
    return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: a bootstrap round of %zu bytes (limit %d)",
                     me, len, COLL_LINK_FRAME_MAX);
  int prev = (me + n - 1) % n, next = (me + 1) % n;
  uint64_t end = coll_deadline_ms(b->timeout_ms);
  int sent = 0, got = 0; /* frames of this round */
  int err = 0;
  b->tx.off = b->tx.len = 0;
  while (sent < n - 1 || got < n - 1 || !coll_frame_idle(&b->tx)) {
    /* Queue every frame that can go: frame k carries block me - k, which is here once
     * k <= got.  Several go out in one send when several are ready. */
    while (sent < n - 1 && sent <= got) {
      int blk = (me - sent + n) % n;
      if (!coll_frame_append(&b->tx, BOOT_FRAME_DATA, (uint32_t)blk,
                             (uint8_t *)all + (size_t)blk * len, (uint32_t)len))
        break;
      sent++;
    }
    if (!coll_frame_idle(&b->tx)) {
      int k = coll_frame_write(b->link.next_fd, &b->tx, &err);
      if (k < 0)
        return fail_ring(comm, b, COLL_ERR_REMOTE,
                         "rank %d: bootstrap: rank %d left the job "
                         "during init (%s)",
                         me, next, strerror(err));
      if (k == 1) continue;
    }
    struct pollfd pf[3] = {{.fd = b->link.prev_fd, .events = got < n - 1 ? POLLIN : 0},
                           {.fd = b->next_done ? -1 : b->link.next_fd,
                            .events = (short)(POLLIN | (coll_frame_idle(&b->tx) ? 0 : POLLOUT))},
                           {.fd = b->link.listen_fd, .events = POLLIN}};
    uint64_t now = coll_now_ns();
    if (now >= end)
      return fail_ring(comm, b, COLL_ERR_TIMEOUT,
                       "rank %d: bootstrap: a round did not complete "
                       "within %d ms (waiting on rank %d)",
                       me, b->timeout_ms, got < n - 1 ? prev : next);
    /* Frames already staged (read with an earlier round's) need no wait. */
    bool staged = got < n - 1 && b->rx_prev.soff < b->rx_prev.slen;
    poll(pf, 3, staged ? 0 : 100);
    if (pf[0].revents || staged) {
      for (;;) {
        int k = coll_frame_read(b->link.prev_fd, &b->rx_prev, &err);
        if (k == 0) break;
        if (k < 0)
          return fail_ring(comm, b, COLL_ERR_REMOTE,
                           "rank %d: bootstrap: rank %d left the job "
                           "during init (%s)",
                           me, prev, err ? strerror(err) : "its ring link closed");
        if (b->rx_prev.kind == BOOT_FRAME_ERROR) {
          char text[COLL_LINK_FRAME_MAX + 1];
          memcpy(text, b->rx_prev.data, b->rx_prev.len);
          text[b->rx_prev.len] = 0;
          return failure_arrived(comm, b, &b->rx_prev, text);
        }
        int want = (me - 1 - got + n) % n;
        if (b->rx_prev.kind != BOOT_FRAME_DATA || b->rx_prev.len != len ||
            (int)b->rx_prev.a != want) {
          char d[120];
          snprintf(d, sizeof d,
                   "it sent block %u of %u bytes, expected block %d of %zu: the "
                   "ranks disagree about the job",
                   b->rx_prev.a, b->rx_prev.len, want, len);
          return fail_ring(comm, b, COLL_ERR_MISMATCH, "rank %d: bootstrap: rank %d %s", me, prev,
                           d);
        }
        memcpy((uint8_t *)all + (size_t)want * len, b->rx_prev.data, len);
        got++;
        if (got == n - 1) break;
      }
    }
    if (pf[1].revents) {
      int k = coll_frame_read(b->link.next_fd, &b->rx_next, &err);
      if (k == 1 && b->rx_next.kind == BOOT_FRAME_ERROR) {
        char text[COLL_LINK_FRAME_MAX + 1];
        memcpy(text, b->rx_next.data, b->rx_next.len);
        text[b->rx_next.len] = 0;
        return failure_arrived(comm, b, &b->rx_next, text);
      }
      if (k < 0) {
        /* next closes its links when it has everything; before that it left */
        if (err == 0 && sent == n - 1 && coll_frame_idle(&b->tx))
          b->next_done = true;
        else
          return fail_ring(comm, b, COLL_ERR_REMOTE,
                           "rank %d: bootstrap: rank %d left the job "
                           "during init (%s)",
                           me, next, err ? strerror(err) : "its ring link closed");
      }
    }
    if (pf[2].revents & POLLIN) {
      coll_result r = take_hello(comm, b, end);
      if (r != COLL_OK) return r;
    }
  }
  return COLL_OK;
}

void coll_bootstrap_fail(struct coll_comm *comm, coll_bootstrap *b) {
  if (!b->failed && (b->link.prev_fd >= 0 || b->link.next_fd >= 0 || b->link.listen_fd >= 0))
    spread_failure(b, comm->errbuf);
}

void coll_bootstrap_close(coll_bootstrap *b) {
  if (b->failed) {
    /* Linger a moment so the failure reaches the neighbours before the sockets go: a
     * prev rank whose link is still in the listen queue would be reset by the close
     * (and blame this rank), and a close with unread bytes resets the link and can lose
     * the error frame.  So: answer pending links with the error, read what the
     * neighbours still send, then close. */
    uint64_t d = coll_deadline_ms(200);
    uint32_t len = (uint32_t)strlen(b->why);
    bool open[2] = {b->link.prev_fd >= 0,
                    b->link.next_fd >= 0 && b->link.next_fd != b->link.prev_fd};
    while (coll_now_ns() < d) {
      struct pollfd pf[3] = {{.fd = open[0] ? b->link.prev_fd : -1, .events = POLLIN},
                             {.fd = open[1] ? b->link.next_fd : -1, .events = POLLIN},
                             {.fd = b->link.listen_fd, .events = POLLIN}};
      if (pf[0].fd < 0 && pf[1].fd < 0 && pf[2].fd < 0) break;
      if (poll(pf, 3, 20) <= 0) continue;
      for (int i = 0; i < 2; i++) {
        if (!pf[i].revents) continue;
        uint8_t junk[512];
        ssize_t k = recv(pf[i].fd, junk, sizeof junk, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) open[i] = false;
      }
      if (pf[2].revents & POLLIN) {
        coll_link_hello h;
        int fd = coll_link_accept(&b->link, &h, d);
        if (fd >= 0) {
          coll_frame_tx t;
          coll_frame_start(&t, BOOT_FRAME_ERROR, (uint32_t)b->rank, b->why, len);
          coll_sock_write_all(fd, t.buf, t.len, d);
          shutdown(fd, SHUT_WR);
          close(fd); /* its prev sent nothing after the hello: no reset */
        }
      }
    }
  }
  coll_ring_link_close(&b->link);
}
