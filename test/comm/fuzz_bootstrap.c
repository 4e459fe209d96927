/* fuzz_bootstrap.c — libFuzzer target for the bootstrap root's parser of connection bytes
 * (libcoll/comm/bootstrap_parse.c, the very code the root runs on what it reads).
 *
 * The input is a script of commands for four connections to one root: "feed the next k
 * input bytes to connection c" (arbitrary bytes, cut into arbitrary pieces), and
 * "connection c presents the job's secret as rank r of n" (the fuzzer could never guess
 * a 16-byte secret, so this lets it reach the length and blob parsing, with any rank and
 * size, valid or not).  When every rank of a job of at most four has sent a blob, the
 * round is answered as the root does.  After every step the parser's invariants are
 * checked and a violation aborts (libFuzzer reports it as a crash); ASan and UBSan catch
 * any read or write out of bounds and any leak.
 *
 * Built only with clang -fsanitize=fuzzer (test/comm/meson.build); run by test_fuzz.c for a
 * bounded time.  Must never do I/O or keep state between inputs.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap_wire.h"

#define NCONN 4

static const uint8_t secret[16] = {0x5e, 0xc7, 0x31, 0x02, 0x9a, 0x44, 0xd0, 0x1b,
                                   0x77, 0x86, 0xe2, 0x3f, 0x10, 0xc9, 0x5b, 0xa8};

static void must(int ok) {
  if (!ok) abort();
}

static void check(const coll_boot_job *job, const coll_boot_rx *c, const coll_boot_rx *conns) {
  must(c->rank < 0 ? c->got <= COLL_AUTH_BYTES : 1);
  if (c->rank >= 0) {
    must(job->nranks > 0 && c->rank < job->nranks && job->by_rank[c->rank] == c);
    must(c->have_len ? c->len <= COLL_BOOT_MAX_LEN && c->got <= c->len && c->data : c->got < 4);
    must(!c->have_data || c->have_len);
  }
  for (int r = 0; r < job->nranks; r++)
    if (job->by_rank[r]) must(job->by_rank[r] >= conns && job->by_rank[r] < conns + NCONN);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  coll_boot_job job = {.nranks = 0};
  memcpy(job.secret, secret, 16);
  coll_boot_rx conns[NCONN];
  int alive[NCONN];
  for (int i = 0; i < NCONN; i++) {
    coll_boot_rx_init(&conns[i]);
    alive[i] = 1;
  }
  char why[256];
  size_t i = 0;
  while (i < size) {
    uint8_t cmd = data[i++];
    int c = cmd & (NCONN - 1);
    const uint8_t *p;
    size_t n;
    uint8_t auth[COLL_AUTH_BYTES];
    if ((cmd >> 2 & 3) == 3) { /* present the secret as rank r of nr */
      if (i + 2 > size) break;
      uint32_t r = data[i], nr = data[i + 1];
      if (cmd & 0x80) r |= 0xffff0000u; /* and sometimes absurd ranks and sizes */
      if (cmd & 0x40) nr = nr << 16 | nr;
      i += 2;
      coll_auth_build(auth, secret, r, nr);
      p = auth;
      n = sizeof auth;
    } else { /* the next k bytes as they are */
      if (i >= size) break;
      n = data[i++];
      if (n > size - i) n = size - i;
      p = data + i;
      i += n;
    }
    if (!alive[c]) continue;
    if (!coll_boot_rx_input(&job, &conns[c], p, n, why, sizeof why)) {
      must(strlen(why) < sizeof why);
      coll_boot_rx_free(&conns[c]); /* the root's drop() */
      alive[c] = 0;
      continue;
    }
    check(&job, &conns[c], conns);
    /* Every rank has sent its blob: the root answers the round and expects the next. */
    if (job.nranks > 0 && job.nranks <= NCONN) {
      int ready = 1;
      for (int r = 0; r < job.nranks; r++) {
        coll_boot_rx *x = job.by_rank[r];
        ready &= x && alive[x - conns] && x->have_data;
      }
      if (ready)
        for (int r = 0; r < job.nranks; r++) coll_boot_rx_next_round(job.by_rank[r]);
    }
  }
  for (int k = 0; k < NCONN; k++) coll_boot_rx_free(&conns[k]);
  coll_boot_job_free(&job);
  return 0;
}
