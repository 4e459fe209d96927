/* watch.c — failures reach every rank of a communicator within a hop time per rank.
 *
 * Each communicator of more than one rank keeps a ring of TCP links beside its
 * transports (ring_link.c: rank r dials r+1, accepts r-1) and a thread that reads them.
 * Three notes travel on the ring, each sent both ways by its origin and forwarded by
 * every rank to the side it did not come from, so they reach all N ranks within N/2
 * hops whatever the transports are:
 *
 *   POISON(origin, code, sentence)  a call failed while running on `origin`, or it
 *                             aborted, or its init failed: every call of every rank now
 *                             fails with that sentence, as COLL_ERR_REMOTE — or as
 *                             COLL_ERR_MISMATCH when that is what `origin` found
 *                             (COLL_CHECK: every rank sees the same disagreement, so
 *                             every rank reports it the same way);
 *   REFUSED(origin, k, sentence)  `origin` refused its call number k before anything
 *                             moved (invalid arguments).  If every rank refused it too,
 *                             nothing happens (the same bad call everywhere returns at
 *                             once and the communicator goes on); a rank that made call
 *                             k, or a later one, validly fails it instead of waiting for
 *                             `origin`, and that failure POISONs the communicator;
 *   BYE                       a normal destroy: the link's end is not a death.
 *                             Sent on both links even when a neighbour said its own
 *                             first (two neighbours destroying at once must each hear
 *                             the other), and once a rank has said it, links that end
 *                             under it are not reported: it is leaving, and the rank
 *                             on the link's other side sees a real death itself.
 *
 * A link that ends without a BYE means the neighbour died (SIGKILL, a crash): the rank
 * that sees it POISONs the communicator naming the neighbour.  A rank that is stopped
 * (SIGSTOP) ends nothing and sends nothing; its peers reach COLL_ERR_TIMEOUT as before.
 * The executor asks coll_watch_check() only when a wait has to sleep and before each
 * call, so the data path pays one relaxed load.
 *
 * Must never: block the executor (only the watch thread reads the links; writers hold a
 * mutex for at most a second), forward a note back where it came from (that would
 * circle forever), or let a note from outside the job in (links carry the secret).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "bootstrap_wire.h"
#include "internal.h"
#include "ring_link.h"
#include "watch.h"

#define WATCH_MAGIC 0x434c5757u /* "CLWW" */
#define WRITE_MS 1000
enum { NOTE_POISON = 1, NOTE_REFUSED = 2, NOTE_BYE = 3 };
enum { PREV = 0, NEXT = 1 };

struct coll_watch {
  struct coll_comm *comm;
  coll_ring_link link;
  int evfd;
  pthread_t thread;
  bool started;
  _Atomic int stop;
  pthread_mutex_t wmu;   /* one writer at a time on the links */
  _Atomic bool ended[2]; /* PREV/NEXT: said goodbye, or ended (read by writers too) */
  _Atomic bool leaving;  /* this rank is destroying the communicator: a link that ends
                          * now is not news to spread (its other neighbour sees it too) */
  coll_frame_rx rx[2];
  _Atomic int attention; /* something below is set */
  _Atomic int poisoned;
  char why[COLL_ERRBUF]; /* the POISON sentence, written before `poisoned` */
  coll_result code;      /* what calls return: COLL_ERR_REMOTE or COLL_ERR_MISMATCH */
  pthread_mutex_t mu;    /* the refusal fields */
  uint64_t my_refused;   /* 1 + the number of this rank's last refused call, 0: none */
  uint64_t pend_seq;     /* 1 + k of a peer's refusal this rank has not matched, 0: none */
  int pend_origin;
  char pend_why[400];
  uint64_t *seen; /* per origin: 1 + k of its last REFUSED forwarded */
};

static void put64(uint8_t *p, uint64_t v) {
  coll_put32(p, (uint32_t)(v >> 32));
  coll_put32(p + 4, (uint32_t)v);
}
static uint64_t get64(const uint8_t *p) {
  return (uint64_t)coll_get32(p) << 32 | coll_get32(p + 4);
}

static int side_fd(coll_watch *w, int side) {
  return side == PREV ? w->link.prev_fd : w->link.next_fd;
}

/* Sends a note on one side (skipped when that link is gone).  Bounded: a neighbour that
 * reads nothing for a second loses the note, and its own link will end soon. */
static void send_note(coll_watch *w, int side, uint32_t kind, uint32_t origin, uint64_t seq,
                      const char *text) {
  pthread_mutex_lock(&w->wmu);
  int fd = side_fd(w, side);
  /* A goodbye goes out even on a side that already said its own: when two neighbours
   * destroy at once, each must still hear the other's, or the one whose watch runs on
   * would take the closed link for a death. */
  if (fd >= 0 && (!w->ended[side] || kind == NOTE_BYE)) {
    uint8_t data[8 + 600];
    size_t tl = text ? strlen(text) : 0;
    if (tl > 600) tl = 600;
    put64(data, seq);
    if (tl) memcpy(data + 8, text, tl);
    coll_frame_tx tx;
    coll_frame_start(&tx, kind, origin, data, (uint32_t)(8 + tl));
    coll_sock_write_all(fd, tx.buf, tx.len, coll_deadline_ms(WRITE_MS));
  }
  pthread_mutex_unlock(&w->wmu);
}

static void send_both(coll_watch *w, uint32_t kind, uint32_t origin, uint64_t seq,
                      const char *text) {
  send_note(w, NEXT, kind, origin, seq, text);
  if (w->link.prev_fd != w->link.next_fd) send_note(w, PREV, kind, origin, seq, text);
}

/* Marks the communicator failed with `text`; true if it was not already.  `wake`: wake
 * this rank's waiters (a failure from elsewhere; never from the executor's own thread,
 * which may hold the queue lock that waking takes). */
static bool poison(coll_watch *w, const char *text, coll_result code, bool wake) {
  pthread_mutex_lock(&w->mu);
  bool first = !atomic_load(&w->poisoned);
  if (first) {
    w->code = code == COLL_ERR_MISMATCH ? COLL_ERR_MISMATCH : COLL_ERR_REMOTE;
    size_t tl = strlen(text) < sizeof w->why - 1 ? strlen(text) : sizeof w->why - 1;
    memcpy(w->why, text, tl);
    w->why[tl] = 0;
    atomic_store(&w->poisoned, 1);
    atomic_store(&w->attention, 1);
  }
  pthread_mutex_unlock(&w->mu);
  if (first) {
    COLL_INFO(w->comm->rank, "watch: the communicator failed: %s", text);
    if (wake) coll_exec_wake_all(w->comm); /* waiters look at the watch when they wake */
  }
  return first;
}

static void on_note(coll_watch *w, int from, const coll_frame_rx *rx) {
  struct coll_comm *comm = w->comm;
  int other = from == PREV ? NEXT : PREV;
  if (rx->kind == NOTE_BYE) {
    w->ended[from] = true;
    return;
  }
  if (rx->len < 8 || rx->a >= (uint32_t)comm->nranks || (int)rx->a == comm->rank) return;
  char text[COLL_LINK_FRAME_MAX + 1];
  uint64_t seq = get64(rx->data);
  size_t tl = rx->len - 8;
  memcpy(text, rx->data + 8, tl);
  text[tl] = 0;
  if (rx->kind == NOTE_POISON) {
    if (poison(w, text, (coll_result)seq, true)) send_note(w, other, NOTE_POISON, rx->a, seq, text);
    return;
  }
  if (rx->kind != NOTE_REFUSED || w->seen[rx->a] == seq + 1) return;
  w->seen[rx->a] = seq + 1;
  send_note(w, other, NOTE_REFUSED, rx->a, seq, text);
  pthread_mutex_lock(&w->mu);
  bool wake = false;
  if (w->my_refused != seq + 1 && !w->pend_seq) {
    w->pend_seq = seq + 1;
    w->pend_origin = (int)rx->a;
    size_t tl2 = strlen(text) < sizeof w->pend_why - 1 ? strlen(text) : sizeof w->pend_why - 1;
    memcpy(w->pend_why, text, tl2);
    w->pend_why[tl2] = 0;
    atomic_store(&w->attention, 1);
    wake = true;
  }
  pthread_mutex_unlock(&w->mu);
  if (wake) coll_exec_wake_all(comm);
}

/* The link to a neighbour ended without a goodbye: it died. */
static void on_lost(coll_watch *w, int side, int err) {
  struct coll_comm *comm = w->comm;
  int n = comm->nranks;
  int who = side == PREV ? (comm->rank + n - 1) % n : (comm->rank + 1) % n;
  char text[300];
  snprintf(text, sizeof text,
           "rank %d died or was killed (its watch link to rank %d %s "
           "without a goodbye)",
           who, comm->rank, err ? strerror(err) : "closed");
  w->ended[side] = true;
  if (atomic_load(&w->leaving)) return; /* a neighbour gone while we leave: nobody waits */
  if (poison(w, text, COLL_ERR_REMOTE, true))
    send_both(w, NOTE_POISON, (uint32_t)who, COLL_ERR_REMOTE, text);
}

static void *watch_main(void *arg) {
  coll_watch *w = arg;
  struct coll_comm *comm = w->comm;
  int prev = (comm->rank + comm->nranks - 1) % comm->nranks;
  while (!atomic_load(&w->stop)) {
    struct pollfd pf[4] = {{.fd = w->ended[PREV] ? -1 : w->link.prev_fd, .events = POLLIN},
                           {.fd = w->ended[NEXT] ? -1 : w->link.next_fd, .events = POLLIN},
                           {.fd = w->link.prev_fd < 0 ? w->link.listen_fd : -1, .events = POLLIN},
                           {.fd = w->evfd, .events = POLLIN}};
    if (w->link.prev_fd == w->link.next_fd) pf[PREV].fd = -1; /* one link for both sides */
    if (poll(pf, 4, 1000) <= 0) continue;
    if (pf[3].revents & POLLIN) {
      uint64_t v;
      if (read(w->evfd, &v, sizeof v) < 0) {} /* drained or not: the loop looks at stop */
    }
    if (pf[2].revents & POLLIN) {
      coll_link_hello h;
      int fd = coll_link_accept(&w->link, &h, coll_deadline_ms(WRITE_MS));
      if (fd >= 0 && h.kind == COLL_HELLO_RING && (int)h.a == prev) {
        pthread_mutex_lock(&w->wmu);
        w->link.prev_fd = fd;
        pthread_mutex_unlock(&w->wmu);
        close(w->link.listen_fd);
        w->link.listen_fd = -1;
      } else if (fd >= 0) {
        close(fd);
      }
    }
    for (int side = 0; side < 2; side++) {
      if (pf[side].fd < 0 || !pf[side].revents) continue;
      for (;;) {
        int err = 0, k = coll_frame_read(pf[side].fd, &w->rx[side], &err);
        if (k == 0) break;
        if (k < 0) {
          if (!w->ended[side]) on_lost(w, side, err == EPROTO ? 0 : err);
          w->ended[side] = true;
          break;
        }
        on_note(w, side, &w->rx[side]);
        if (w->ended[side]) break;
      }
    }
  }
  return NULL;
}

coll_result coll_watch_listen(struct coll_comm *comm, coll_sockaddr_packed *where) {
  memset(where, 0, sizeof *where);
  if (comm->nranks < 2) return COLL_OK;
  if (comm->boot_local_len == 0)
    return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: no local address for the watch link",
                     comm->rank);
  coll_watch *w = calloc(1, sizeof *w);
  if (w) w->seen = calloc((size_t)comm->nranks, sizeof *w->seen);
  if (!w || !w->seen) {
    if (w) free(w->seen);
    free(w);
    return coll_fail(comm, COLL_ERR_SYSTEM, "rank %d: out of memory for the watch", comm->rank);
  }
  w->comm = comm;
  w->evfd = -1;
  pthread_mutex_init(&w->wmu, NULL);
  pthread_mutex_init(&w->mu, NULL);
  coll_ring_link_init(&w->link, WATCH_MAGIC, comm->secret, comm->rank, comm->nranks);
  comm->watch = w;
  char why[200];
  if (!coll_ring_link_listen(&w->link, &comm->boot_local, comm->boot_local_len, why, sizeof why))
    return coll_fail(comm, COLL_ERR_SYSTEM, "%s (watch link)", why);
  w->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (w->evfd < 0)
    return coll_fail(comm, COLL_ERR_SYSTEM, "rank %d: eventfd failed: %s", comm->rank,
                     strerror(errno));
  coll_sock_pack(&w->link.bound, where);
  return COLL_OK;
}

coll_result coll_watch_start(struct coll_comm *comm, const coll_sockaddr_packed *next) {
  coll_watch *w = comm->watch;
  if (!w) return COLL_OK;
  struct sockaddr_storage ss;
  socklen_t sl;
  int nx = (comm->rank + 1) % comm->nranks;
  if (!coll_sock_unpack(next, &ss, &sl))
    return coll_fail(comm, COLL_ERR_INTERNAL, "rank %d: rank %d published no watch address",
                     comm->rank, nx);
  char why[200];
  w->link.next_fd = coll_link_dial(&w->link, &ss, sl, COLL_HELLO_RING, (uint32_t)comm->rank, NULL,
                                   0, coll_deadline_ms(comm->timeout_ms), why, sizeof why);
  if (w->link.next_fd < 0)
    return coll_fail(comm, COLL_ERR_REMOTE, "rank %d: rank %d left during init (watch link: %s)",
                     comm->rank, nx, why);
  int e = pthread_create(&w->thread, NULL, watch_main, w);
  if (e)
    return coll_fail(comm, COLL_ERR_SYSTEM, "rank %d: starting the watch thread failed: %s",
                     comm->rank, strerror(e));
  w->started = true;
  return COLL_OK;
}

void coll_watch_stop(struct coll_comm *comm, int how) {
  coll_watch *w = comm->watch;
  if (!w) return;
  if (how == COLL_WATCH_BYE) {
    atomic_store(&w->leaving, true);
    send_both(w, NOTE_BYE, (uint32_t)comm->rank, 0, NULL);
  } else if (!atomic_load(&w->poisoned)) {
    char text[COLL_ERRBUF + 64];
    if (how == COLL_WATCH_ABORT)
      snprintf(text, sizeof text, "rank %d aborted its communicator (coll_comm_abort)", comm->rank);
    else
      snprintf(text, sizeof text, "rank %d failed during init: %s", comm->rank, comm->errbuf);
    atomic_store(&w->poisoned, 1);
    send_both(w, NOTE_POISON, (uint32_t)comm->rank, COLL_ERR_REMOTE, text);
  }
  if (w->started) {
    atomic_store(&w->stop, 1);
    uint64_t one = 1;
    if (write(w->evfd, &one, sizeof one) < 0) {} /* the thread polls with a bound anyway */
    pthread_join(w->thread, NULL);
  }
  coll_ring_link_close(&w->link);
  if (w->evfd >= 0) close(w->evfd);
  pthread_mutex_destroy(&w->wmu);
  pthread_mutex_destroy(&w->mu);
  free(w->seen);
  free(w);
  comm->watch = NULL;
}

bool coll_watch_attention(const struct coll_comm *comm) {
  return comm->watch && atomic_load_explicit(&comm->watch->attention, memory_order_relaxed);
}

coll_result coll_watch_check(struct coll_comm *comm, uint64_t seq, int peer, const char *what) {
  coll_watch *w = comm->watch;
  if (!w || !atomic_load_explicit(&w->attention, memory_order_acquire)) return COLL_OK;
  if (atomic_load(&w->poisoned))
    return coll_fail(comm, w->code, "rank %d: %s cannot complete: %s", comm->rank, what, w->why);
  /* A refusal is about the user's numbered calls: the library's own calls during init
   * (the tuner's probes) are numbered apart and must not fail on a peer that finished
   * init first and refused its first call. */
  if (!atomic_load(&comm->ready)) return COLL_OK;
  pthread_mutex_lock(&w->mu);
  bool hit = w->pend_seq && seq + 1 >= w->pend_seq && (peer < 0 || peer == w->pend_origin);
  int origin = w->pend_origin;
  uint64_t k = w->pend_seq - 1;
  char text[400];
  if (hit) snprintf(text, sizeof text, "%s", w->pend_why);
  pthread_mutex_unlock(&w->mu);
  if (!hit) return COLL_OK;
  return coll_fail(comm, COLL_ERR_REMOTE,
                   "rank %d: %s cannot complete: rank %d refused its "
                   "call #%llu (%s)",
                   comm->rank, what, origin, (unsigned long long)k, text);
}

void coll_watch_refused(struct coll_comm *comm, uint64_t seq) {
  coll_watch *w = comm->watch;
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  w->my_refused = seq + 1;
  if (w->pend_seq == seq + 1) w->pend_seq = 0; /* it refused the same call: nothing lost */
  pthread_mutex_unlock(&w->mu);
  send_both(w, NOTE_REFUSED, (uint32_t)comm->rank, seq, comm->errbuf);
}

void coll_watch_failed(struct coll_comm *comm) {
  coll_watch *w = comm->watch;
  if (!w || atomic_load(&w->poisoned)) return; /* a failure that came from elsewhere */
  char text[COLL_ERRBUF];
  snprintf(text, sizeof text, "%s", comm->errbuf);
  coll_result code = comm->sticky == COLL_ERR_MISMATCH ? COLL_ERR_MISMATCH : COLL_ERR_REMOTE;
  if (poison(w, text, code, false)) send_both(w, NOTE_POISON, (uint32_t)comm->rank, code, text);
}
