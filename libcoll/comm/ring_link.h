/* ring_link.h — a rank's two TCP links to its ring neighbours, and the frames on them.
 *
 * The bootstrap (bootstrap.c) and the watch (watch.c) both arrange the ranks in a ring
 * of sockets: rank r dials rank r+1 and accepts rank r-1, so every rank holds two links
 * whatever the job's size.  Anything that connects presents a hello: a magic naming the
 * use (bootstrap or watch), the job's secret, a kind, two words and at most
 * COLL_LINK_NOTE_MAX bytes; a stranger is dropped.  On a formed ring the ranks exchange
 * frames: a 12-byte header (kind, a, len) and len bytes.
 *
 * Must never: trust a length before bounding it, block without a deadline, or admit a
 * connection that did not present the secret.
 */
#ifndef COLL_RING_LINK_H
#define COLL_RING_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "sock.h"

#define COLL_LINK_NOTE_MAX 512   /* bytes a hello may carry */
#define COLL_LINK_FRAME_MAX 4096 /* bytes a frame may carry */
#define COLL_LINK_HELLO_BYTES 32
#define COLL_LINK_STAGE 16384 /* bytes one recv or send moves at most */

enum { COLL_HELLO_RING = 1, COLL_HELLO_NOTE = 2 };

typedef struct {
  uint32_t magic;
  uint8_t secret[16];
  int rank, nranks;
  int listen_fd, prev_fd, next_fd;
  struct sockaddr_storage bound; /* where listen_fd listens */
} coll_ring_link;

/* A hello that arrived on the listener. */
typedef struct {
  uint32_t kind, a, len;
  uint8_t note[COLL_LINK_NOTE_MAX];
} coll_link_hello;

/* Incoming frames on one link.  One recv takes up to COLL_LINK_STAGE bytes, so a rank
 * that was descheduled while frames piled up reads them all in one system call (in a
 * ring all-gather of N ranks a rank receives N-1 frames a round: with a thousand ranks
 * on a few cores, one call per frame was most of init). */
typedef struct {
  uint8_t hdr[12];
  uint32_t got, kind, a, len;
  uint8_t data[COLL_LINK_FRAME_MAX];
  uint8_t stage[COLL_LINK_STAGE];
  uint32_t slen, soff; /* stage[soff..slen) not parsed yet */
} coll_frame_rx;

/* Outgoing frames being written: several may be queued (coll_frame_append) and go out
 * in one send. */
typedef struct {
  uint8_t buf[COLL_LINK_STAGE];
  uint32_t len, off;
} coll_frame_tx;
_Static_assert(COLL_LINK_STAGE >= 12 + COLL_LINK_FRAME_MAX, "a frame fits the stage");

void coll_ring_link_init(coll_ring_link *l, uint32_t magic, const uint8_t secret[16], int rank,
                         int nranks);
/* Listens on `local`'s address (a port the kernel picks). */
bool coll_ring_link_listen(coll_ring_link *l, const struct sockaddr_storage *local, socklen_t len,
                           char *why, size_t why_len);
void coll_ring_link_close(coll_ring_link *l);

/* Dials `to` and sends a hello; -1 with a sentence on failure. */
int coll_link_dial(const coll_ring_link *l, const struct sockaddr_storage *to, socklen_t len,
                   uint32_t kind, uint32_t a, const void *note, uint32_t note_len,
                   uint64_t deadline_ns, char *why, size_t why_len);
/* Accepts one connection on the listener and reads its hello (bounded by `deadline_ns`
 * and by five seconds for a stranger).  Returns the socket, or -1 when nothing valid
 * arrived (a stranger was dropped, or nothing was pending). */
int coll_link_accept(const coll_ring_link *l, coll_link_hello *h, uint64_t deadline_ns);

/* Reads what is available on fd into rx.  1: a frame is complete (rx->kind, a, len,
 * data; the next call starts a new one); 0: not yet; -1: the link ended (*err: 0 for an
 * orderly end of stream, else an errno value) or sent a frame over the limit (*err
 * EPROTO). */
int coll_frame_read(int fd, coll_frame_rx *rx, int *err);
/* Starts a frame in tx (which must be idle: tx->off == tx->len). */
void coll_frame_start(coll_frame_tx *tx, uint32_t kind, uint32_t a, const void *data, uint32_t len);
/* Queues one more frame behind those in tx; false when it does not fit now. */
bool coll_frame_append(coll_frame_tx *tx, uint32_t kind, uint32_t a, const void *data,
                       uint32_t len);
/* Writes what fits.  1: every queued frame is out; 0: not yet; -1: the link failed (*err). */
int coll_frame_write(int fd, coll_frame_tx *tx, int *err);
static inline bool coll_frame_idle(const coll_frame_tx *tx) { return tx->off == tx->len; }

#endif
