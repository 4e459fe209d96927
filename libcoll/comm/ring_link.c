/* ring_link.c — hellos and frames on a rank's links to its ring neighbours (ring_link.h).
 *
 * Hello (32 bytes, big-endian): u32 magic, u8 secret[16], u32 kind, u32 a, u32 len, then
 * len bytes (<= COLL_LINK_NOTE_MAX).  COLL_HELLO_RING: a is the dialling rank, which
 * becomes the listener's prev.  COLL_HELLO_NOTE: a message from the bootstrap root
 * (bootstrap.c).  Frame: u32 kind, u32 a, u32 len, then len bytes (<= COLL_LINK_FRAME_MAX).
 *
 * Must never: read a length before bounding it, wait on a stranger for more than
 * STRANGER_MS, or compare the secret in time that depends on where it differs.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap_wire.h"
#include "internal.h"
#include "ring_link.h"

#define STRANGER_MS 5000 /* a dialler descheduled between connect and hello (ranks >> cores) */

void coll_ring_link_init(coll_ring_link *l, uint32_t magic, const uint8_t secret[16], int rank,
                         int nranks) {
  memset(l, 0, sizeof *l);
  l->magic = magic;
  memcpy(l->secret, secret, 16);
  l->rank = rank;
  l->nranks = nranks;
  l->listen_fd = l->prev_fd = l->next_fd = -1;
}

bool coll_ring_link_listen(coll_ring_link *l, const struct sockaddr_storage *local, socklen_t len,
                           char *why, size_t why_len) {
  l->listen_fd = coll_sock_listen(local, len, 64, &l->bound);
  if (l->listen_fd < 0) {
    char a[80];
    coll_sock_text(local, a, sizeof a);
    snprintf(why, why_len, "rank %d: cannot listen on %s: %s", l->rank, a, strerror(errno));
    return false;
  }
  return true;
}

void coll_ring_link_close(coll_ring_link *l) {
  if (l->listen_fd >= 0) close(l->listen_fd);
  if (l->prev_fd >= 0) close(l->prev_fd);
  if (l->next_fd >= 0 && l->next_fd != l->prev_fd) close(l->next_fd);
  l->listen_fd = l->prev_fd = l->next_fd = -1;
}

int coll_link_dial(const coll_ring_link *l, const struct sockaddr_storage *to, socklen_t len,
                   uint32_t kind, uint32_t a, const void *note, uint32_t note_len,
                   uint64_t deadline_ns, char *why, size_t why_len) {
  int err = 0;
  int fd = coll_sock_dial(to, len, deadline_ns, &err);
  char at[80];
  if (fd < 0) {
    coll_sock_text(to, at, sizeof at);
    snprintf(why, why_len, "cannot connect to %s: %s", at, strerror(err));
    return -1;
  }
  uint8_t h[COLL_LINK_HELLO_BYTES + COLL_LINK_NOTE_MAX];
  if (note_len > COLL_LINK_NOTE_MAX) note_len = COLL_LINK_NOTE_MAX;
  coll_put32(h, l->magic);
  memcpy(h + 4, l->secret, 16);
  coll_put32(h + 20, kind);
  coll_put32(h + 24, a);
  coll_put32(h + 28, note_len);
  if (note_len) memcpy(h + COLL_LINK_HELLO_BYTES, note, note_len);
  if (!coll_sock_write_all(fd, h, COLL_LINK_HELLO_BYTES + note_len, deadline_ns)) {
    coll_sock_text(to, at, sizeof at);
    snprintf(why, why_len, "the connection to %s failed while saying hello: %s", at,
             strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

int coll_link_accept(const coll_ring_link *l, coll_link_hello *h, uint64_t deadline_ns) {
  int fd = accept4(l->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return -1;
  coll_sock_tune(fd);
  uint64_t d = coll_deadline_ms(STRANGER_MS);
  if (d > deadline_ns) d = deadline_ns;
  uint8_t b[COLL_LINK_HELLO_BYTES];
  if (!coll_sock_read_all(fd, b, sizeof b, d)) {
    close(fd);
    return -1;
  }
  uint8_t diff = 0;
  for (int i = 0; i < 16; i++) diff |= (uint8_t)(b[4 + i] ^ l->secret[i]);
  h->kind = coll_get32(b + 20);
  h->a = coll_get32(b + 24);
  h->len = coll_get32(b + 28);
  if (diff || coll_get32(b) != l->magic || h->len > COLL_LINK_NOTE_MAX ||
      (h->kind != COLL_HELLO_RING && h->kind != COLL_HELLO_NOTE) ||
      (h->kind == COLL_HELLO_RING && h->a >= (uint32_t)l->nranks) ||
      (h->len && !coll_sock_read_all(fd, h->note, h->len, d))) {
    COLL_INFO(l->rank, "dropped a connection that did not present a valid hello");
    close(fd);
    return -1;
  }
  return fd;
}

int coll_frame_read(int fd, coll_frame_rx *rx, int *err) {
  for (;;) {
    if (rx->soff == rx->slen) { /* the stage is empty: one recv for whatever has come */
      ssize_t n = recv(fd, rx->stage, sizeof rx->stage, MSG_DONTWAIT);
      if (n == 0 && !(rx->got >= 12 && rx->len == rx->got - 12)) {
        *err = 0;
        return -1;
      }
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
          if (rx->got >= 12 && rx->len == rx->got - 12) goto complete; /* empty frame */
          return 0;
        }
        *err = errno;
        return -1;
      }
      rx->soff = 0;
      rx->slen = (uint32_t)(n > 0 ? n : 0);
    }
    uint32_t avail = rx->slen - rx->soff, take;
    if (rx->got < 12) {
      take = 12 - rx->got < avail ? 12 - rx->got : avail;
      memcpy(rx->hdr + rx->got, rx->stage + rx->soff, take);
    } else {
      uint32_t want = rx->len - (rx->got - 12);
      take = want < avail ? want : avail;
      memcpy(rx->data + (rx->got - 12), rx->stage + rx->soff, take);
    }
    rx->soff += take;
    rx->got += take;
    if (rx->got == 12 && take > 0 && rx->got - take < 12) {
      rx->kind = coll_get32(rx->hdr);
      rx->a = coll_get32(rx->hdr + 4);
      rx->len = coll_get32(rx->hdr + 8);
      if (rx->len > COLL_LINK_FRAME_MAX) {
        *err = EPROTO;
        return -1;
      }
    }
  complete:
    if (rx->got >= 12 && rx->got - 12 == rx->len) {
      rx->got = 0;
      return 1;
    }
  }
}

void coll_frame_start(coll_frame_tx *tx, uint32_t kind, uint32_t a, const void *data,
                      uint32_t len) {
  tx->len = tx->off = 0;
  coll_frame_append(tx, kind, a, data, len > COLL_LINK_FRAME_MAX ? COLL_LINK_FRAME_MAX : len);
}

bool coll_frame_append(coll_frame_tx *tx, uint32_t kind, uint32_t a, const void *data,
                       uint32_t len) {
  if (tx->off == tx->len) tx->off = tx->len = 0; /* everything before went out */
  if (len > COLL_LINK_FRAME_MAX || tx->len + 12 + len > sizeof tx->buf) return false;
  uint8_t *p = tx->buf + tx->len;
  coll_put32(p, kind);
  coll_put32(p + 4, a);
  coll_put32(p + 8, len);
  if (len) memcpy(p + 12, data, len);
  tx->len += 12 + len;
  return true;
}

int coll_frame_write(int fd, coll_frame_tx *tx, int *err) {
  while (tx->off < tx->len) {
    ssize_t n = send(fd, tx->buf + tx->off, tx->len - tx->off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
      *err = errno;
      return -1;
    }
    tx->off += (uint32_t)n;
  }
  return 1;
}
