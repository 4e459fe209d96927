/* sock.c — non-blocking socket helpers with deadlines (see sock.h).
 *
 * Waits are poll() slices of at most 100 ms, so a caller's deadline is kept to within
 * that even when the system clock and poll disagree.  Must never block without a bound,
 * allocate, or raise SIGPIPE (every send has MSG_NOSIGNAL).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "sock.h"

void coll_sock_pack(const struct sockaddr_storage *ss, coll_sockaddr_packed *out) {
  memset(out, 0, sizeof *out);
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
    out->family = AF_INET;
    out->port = ntohs(s4->sin_port);
    memcpy(out->addr, &s4->sin_addr, 4);
  } else if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
    out->family = AF_INET6;
    out->port = ntohs(s6->sin6_port);
    memcpy(out->addr, &s6->sin6_addr, 16);
  }
}

bool coll_sock_unpack(const coll_sockaddr_packed *p, struct sockaddr_storage *ss, socklen_t *len) {
  memset(ss, 0, sizeof *ss);
  if (p->port == 0) return false;
  if (p->family == AF_INET) {
    struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
    s4->sin_family = AF_INET;
    s4->sin_port = htons(p->port);
    memcpy(&s4->sin_addr, p->addr, 4);
    *len = sizeof *s4;
    return true;
  }
  if (p->family == AF_INET6) {
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(p->port);
    memcpy(&s6->sin6_addr, p->addr, 16);
    *len = sizeof *s6;
    return true;
  }
  return false;
}

void coll_sock_text(const struct sockaddr_storage *ss, char *out, size_t len) {
  char a[INET6_ADDRSTRLEN] = "?";
  if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
    inet_ntop(AF_INET6, &s6->sin6_addr, a, sizeof a);
    snprintf(out, len, "[%s]:%u", a, ntohs(s6->sin6_port));
  } else {
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
    inet_ntop(AF_INET, &s4->sin_addr, a, sizeof a);
    snprintf(out, len, "%s:%u", a, ntohs(s4->sin_port));
  }
}

int coll_sock_set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

void coll_sock_tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  coll_sock_set_nonblock(fd);
}

int coll_sock_listen(const struct sockaddr_storage *local, socklen_t len, int backlog,
                     struct sockaddr_storage *bound) {
  struct sockaddr_storage ss = *local;
  if (ss.ss_family == AF_INET)
    ((struct sockaddr_in *)&ss)->sin_port = 0;
  else
    ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, backlog) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  socklen_t bl = sizeof *bound;
  if (getsockname(fd, (struct sockaddr *)bound, &bl) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

uint64_t coll_deadline_ms(int ms) {
  return ms > 0 ? coll_now_ns() + (uint64_t)ms * 1000000u : UINT64_MAX;
}

/* Sleeps in poll() for `events` on fd, at most 100 ms and not past the deadline; false
 * when the deadline has passed. */
static bool wait_fd(int fd, short events, uint64_t deadline_ns) {
  uint64_t now = coll_now_ns();
  if (now >= deadline_ns) return false;
  uint64_t left = (deadline_ns - now) / 1000000u + 1;
  struct pollfd pf = {.fd = fd, .events = events};
  poll(&pf, 1, left > 100 ? 100 : (int)left);
  return true;
}

int coll_sock_dial(const struct sockaddr_storage *ss, socklen_t len, uint64_t deadline_ns,
                   int *err) {
  int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  int e = 0;
  if (connect(fd, (const struct sockaddr *)ss, len) != 0) {
    e = errno;
    if (e == EINPROGRESS) {
      e = ETIMEDOUT;
      for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        uint64_t now = coll_now_ns();
        if (now >= deadline_ns) break;
        uint64_t left = (deadline_ns - now) / 1000000u + 1;
        if (poll(&pf, 1, left > 100 ? 100 : (int)left) > 0) {
          socklen_t el = sizeof e;
          e = 0;
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
          break;
        }
      }
    }
  }
  if (e) {
    close(fd);
    *err = e;
    return -1;
  }
  coll_sock_tune(fd);
  return fd;
}

bool coll_sock_write_all(int fd, const void *buf, size_t len, uint64_t deadline_ns) {
  const uint8_t *p = buf;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    if (!wait_fd(fd, POLLOUT, deadline_ns)) return false;
  }
  return true;
}

bool coll_sock_read_all(int fd, void *buf, size_t len, uint64_t deadline_ns) {
  uint8_t *p = buf;
  while (len) {
    ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
    if (!wait_fd(fd, POLLIN, deadline_ns)) return false;
  }
  return true;
}
