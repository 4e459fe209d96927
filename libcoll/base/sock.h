/* sock.h — the non-blocking socket helpers that the bootstrap, the watch ring and the
 * TCP transport share: listen, dial with a deadline, read and write everything before a
 * deadline, and a packed address that travels in blobs.
 *
 * Every call takes an absolute deadline (coll_now_ns() clock) and returns by it; none
 * allocates.  Must never block without a bound or raise SIGPIPE.
 */
#ifndef COLL_SOCK_H
#define COLL_SOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* An IPv4 or IPv6 address and port as it travels between ranks (20 bytes, no padding
 * that could leak stack bytes: every field is written). */
typedef struct {
  uint16_t family; /* AF_INET or AF_INET6; 0: none */
  uint16_t port;   /* host order */
  uint8_t addr[16];
} coll_sockaddr_packed;

void coll_sock_pack(const struct sockaddr_storage *ss, coll_sockaddr_packed *out);
/* False when `p` holds no usable address. */
bool coll_sock_unpack(const coll_sockaddr_packed *p, struct sockaddr_storage *ss, socklen_t *len);
/* "1.2.3.4:5" or "[::1]:5". */
void coll_sock_text(const struct sockaddr_storage *ss, char *out, size_t len);

int coll_sock_set_nonblock(int fd);
/* TCP_NODELAY and O_NONBLOCK. */
void coll_sock_tune(int fd);
/* A non-blocking socket listening on `local`'s address at a port the kernel picks;
 * `bound` receives the address with that port.  -1 with errno on failure. */
int coll_sock_listen(const struct sockaddr_storage *local, socklen_t len, int backlog,
                     struct sockaddr_storage *bound);
/* A connected, non-blocking, tuned socket to `ss` by `deadline_ns`; -1 and *err (an
 * errno value: ETIMEDOUT when time ran out) when it could not. */
int coll_sock_dial(const struct sockaddr_storage *ss, socklen_t len, uint64_t deadline_ns,
                   int *err);
/* Writes/reads all of buf by the deadline.  False on error, end of stream or time up. */
bool coll_sock_write_all(int fd, const void *buf, size_t len, uint64_t deadline_ns);
bool coll_sock_read_all(int fd, void *buf, size_t len, uint64_t deadline_ns);
/* Big-endian 32-bit words, as every length and field on our wires travels. */
static inline void coll_put32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}
static inline uint32_t coll_get32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* A deadline `ms` from now; ms <= 0 means none (UINT64_MAX). */
uint64_t coll_deadline_ms(int ms);

#endif
