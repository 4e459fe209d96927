/* bootstrap_wire.h — encoding and checking of the bootstrap's authentication message.
 *
 * Kept apart from bootstrap.c so the parser of bytes that arrive from the network can
 * be unit-tested and fuzzed on its own.  Must never read past COLL_AUTH_BYTES or accept
 * a message whose secret, magic, version, rank or size is not what the job expects.
 */
#ifndef COLL_BOOTSTRAP_WIRE_H
#define COLL_BOOTSTRAP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "sock.h"

#define COLL_AUTH_MAGIC 0x434c4241u /* "CLBA" */
#define COLL_AUTH_VERSION 1u
#define COLL_AUTH_BYTES 32
#define COLL_BOOT_MAX_LEN (64u * 1024u) /* largest blob a rank may send in a round */
#define COLL_MAX_RANKS (1u << 16)


typedef struct {
  uint32_t rank, nranks;
} coll_auth;

static inline void coll_auth_build(uint8_t out[COLL_AUTH_BYTES], const uint8_t secret[16],
                                   uint32_t rank, uint32_t nranks) {
  coll_put32(out, COLL_AUTH_MAGIC);
  coll_put32(out + 4, COLL_AUTH_VERSION);
  memcpy(out + 8, secret, 16);
  coll_put32(out + 24, rank);
  coll_put32(out + 28, nranks);
}

/* True when `in` is a valid auth message for a job with this secret.  The secret is
 * compared in constant time so a stranger learns nothing from timing. */
static inline bool coll_auth_parse(const uint8_t in[COLL_AUTH_BYTES], const uint8_t secret[16],
                                   coll_auth *out) {
  uint8_t diff = 0;
  for (int i = 0; i < 16; i++) diff |= (uint8_t)(in[8 + i] ^ secret[i]);
  uint32_t magic = coll_get32(in), version = coll_get32(in + 4);
  out->rank = coll_get32(in + 24);
  out->nranks = coll_get32(in + 28);
  return diff == 0 && magic == COLL_AUTH_MAGIC && version == COLL_AUTH_VERSION &&
         out->nranks >= 1 && out->nranks <= COLL_MAX_RANKS && out->rank < out->nranks;
}

/* ---- the root's parser of what a connection sends (bootstrap_parse.c) ---------------
 * Pure: bytes in, state changes out; no sockets, so the fuzz target
 * (test/comm/fuzz_bootstrap.c) runs exactly the code the root runs on bytes off the wire. */

/* What one connection to the root has sent so far. */
typedef struct {
  int rank;                     /* -1 until it presented the job's secret */
  uint8_t hdr[COLL_AUTH_BYTES]; /* the auth message, then a round's 4-byte length */
  size_t got;                   /* bytes of the current piece so far */
  uint32_t len;                 /* this round's blob length (<= COLL_BOOT_MAX_LEN) */
  uint8_t *data;                /* this round's blob (malloc'd once the length is known) */
  bool have_len, have_data;
} coll_boot_rx;

/* What the root knows about the job. */
typedef struct {
  uint8_t secret[16];
  int nranks;             /* 0 until the first rank authenticates */
  coll_boot_rx **by_rank; /* nranks entries, NULL until that rank joined */
} coll_boot_job;

static inline void coll_boot_rx_init(coll_boot_rx *c) {
  memset(c, 0, sizeof *c);
  c->rank = -1;
}
/* Consumes all `n` bytes that arrived on connection `c`.  False: drop the connection;
 * `why` says why, or is empty for a stranger (dropped without a word). */
bool coll_boot_rx_input(coll_boot_job *job, coll_boot_rx *c, const uint8_t *p, size_t n, char *why,
                        size_t why_len);
/* After a round was answered: forget its blob, expect the next round. */
void coll_boot_rx_next_round(coll_boot_rx *c);
/* Frees what the connection holds (not `c` itself). */
void coll_boot_rx_free(coll_boot_rx *c);
/* Frees the job's rank table. */
void coll_boot_job_free(coll_boot_job *job);

#endif
