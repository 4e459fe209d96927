/* bootstrap_parse.c — the bootstrap root's parser of bytes from its connections.
 *
 * Every byte a connection sends to the root goes through coll_boot_rx_input: first the
 * 32-byte auth message (bootstrap_wire.h), then per round a 4-byte big-endian length and
 * that many bytes.  It checks the secret before anything else, bounds every length before
 * allocating (COLL_BOOT_MAX_LEN per blob; the rank table only once a rank proved it holds
 * the secret), refuses ranks outside the job or joining twice, and treats bytes sent out
 * of turn as a protocol error.  Pure: no I/O, no globals, so test/comm/fuzz_bootstrap.c feeds
 * it arbitrary bytes in arbitrary pieces.  Must never read or write outside the buffers
 * it was given or allocated, and never trust a length it has not bounded.
 */
#include <stdio.h>
#include <stdlib.h>

#include "bootstrap_wire.h"

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* The auth message is complete: is it one of ours, and may this rank join? */
static bool admit(coll_boot_job *job, coll_boot_rx *c, char *why, size_t why_len) {
  coll_auth a;
  if (!coll_auth_parse(c->hdr, job->secret, &a)) {
    why[0] = 0; /* a stranger: nothing to tell anyone */
    return false;
  }
  if (job->nranks == 0) {
    job->by_rank = calloc(a.nranks, sizeof *job->by_rank);
    if (!job->by_rank) {
      snprintf(why, why_len, "out of memory for %u ranks", a.nranks);
      return false;
    }
    job->nranks = (int)a.nranks;
  }
  if ((int)a.nranks != job->nranks) {
    snprintf(why, why_len, "refused rank %u of %u: the job has %d ranks", a.rank, a.nranks,
             job->nranks);
    return false;
  }
  if (job->by_rank[a.rank]) {
    snprintf(why, why_len, "refused a second rank %u", a.rank);
    return false;
  }
  c->rank = (int)a.rank;
  job->by_rank[a.rank] = c;
  c->got = 0;
  return true;
}

bool coll_boot_rx_input(coll_boot_job *job, coll_boot_rx *c, const uint8_t *p, size_t n, char *why,
                        size_t why_len) {
  why[0] = 0;
  while (n) {
    size_t take;
    if (c->rank < 0) {
      take = min_size(n, COLL_AUTH_BYTES - c->got);
      memcpy(c->hdr + c->got, p, take);
      c->got += take;
      if (c->got == COLL_AUTH_BYTES && !admit(job, c, why, why_len)) return false;
    } else if (!c->have_len) {
      take = min_size(n, 4 - c->got);
      memcpy(c->hdr + c->got, p, take);
      c->got += take;
      if (c->got == 4) {
        uint32_t len = coll_get32(c->hdr);
        if (len > COLL_BOOT_MAX_LEN) {
          snprintf(why, why_len, "rank %d announced a %u-byte bootstrap blob (limit %u)", c->rank,
                   len, COLL_BOOT_MAX_LEN);
          return false;
        }
        c->data = malloc(len ? len : 1);
        if (!c->data) {
          snprintf(why, why_len, "out of memory for rank %d's %u-byte blob", c->rank, len);
          return false;
        }
        c->len = len;
        c->have_len = true;
        c->have_data = len == 0;
        c->got = 0;
      }
    } else if (!c->have_data) {
      take = min_size(n, c->len - c->got);
      memcpy(c->data + c->got, p, take);
      c->got += take;
      if (c->got == c->len) c->have_data = true;
    } else {
      /* Nothing is expected until the root has answered the round. */
      snprintf(why, why_len, "rank %d sent bytes out of turn", c->rank);
      return false;
    }
    p += take;
    n -= take;
  }
  return true;
}

void coll_boot_rx_next_round(coll_boot_rx *c) {
  free(c->data);
  c->data = NULL;
  c->have_len = c->have_data = false;
  c->got = 0;
  c->len = 0;
}

void coll_boot_rx_free(coll_boot_rx *c) {
  free(c->data);
  c->data = NULL;
}

void coll_boot_job_free(coll_boot_job *job) {
  free(job->by_rank);
  job->by_rank = NULL;
}
