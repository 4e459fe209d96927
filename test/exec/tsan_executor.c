/* tsan_executor.c — the executor under ThreadSanitizer (built only with b_sanitize=thread).
 *
 * Criterion's worker arena does not start under TSan, so this is a plain program: ranks
 * forked by coll_launch_local mix blocking calls (the lock-free fast path and the
 * one-shot path) with work queued on a stream (the progress thread), so the execution
 * right changes hands between threads thousands of times; every result is checked.
 * Every fifth iteration makes a group (group.c: thread-local state, an internal stream
 * per coll_group_end, the merged point-to-point work freed by the progress thread): a
 * ring exchange larger than a FIFO slot, with a NULL stream or on the stream, beside an
 * all-reduce.  Exit 0 when all ranks were right and TSan (halt_on_error=1) said nothing.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "coll.h"
#include "coll_launch.h"

enum { BIG = 4096, ITERS = 2000, G = 40000 };

static int body(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  coll_stream_t s;
  if (coll_stream_create(&s) != COLL_OK) return 1;
  int64_t a[64], b[64];
  int64_t *c = malloc(BIG * sizeof *c), *g_out = malloc(G * sizeof *g_out),
          *g_in = malloc(G * sizeof *g_in);
  if (!c || !g_out || !g_in) return 1;
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  for (int it = 0; it < ITERS; it++) {
    for (int k = 0; k < 64; k++) a[k] = rank + k;
    bool queued = it % 3 == 0;
    if (queued) {
      for (int k = 0; k < BIG; k++) c[k] = rank;
      if (coll_all_reduce(c, c, BIG, COLL_INT64, COLL_SUM, comm, s) != COLL_OK) return 2;
    }
    /* Blocking: waits behind the queued call, or takes the fast path when idle. */
    if (coll_all_reduce(a, b, 64, COLL_INT64, COLL_SUM, comm, NULL) != COLL_OK) return 3;
    for (int k = 0; k < 64; k++)
      if (b[k] != (int64_t)n * k + n * (n - 1) / 2) return 4;
    if (queued) {
      if (coll_stream_synchronize(s) != COLL_OK) return 5;
      for (int k = 0; k < BIG; k++)
        if (c[k] != n * (n - 1) / 2) return 6;
    }
    if (it % 7 == 0 && coll_barrier(comm, NULL) != COLL_OK) return 7;
    if (it % 5 == 0) {
      coll_stream_t gs = it % 10 ? NULL : s;
      for (int k = 0; k < G; k++) g_out[k] = (int64_t)rank * 1000000 + it + k;
      for (int k = 0; k < 64; k++) a[k] = rank + k;
      if (coll_group_start() != COLL_OK) return 8;
      if (coll_recv(g_in, G, COLL_INT64, prev, comm, gs) != COLL_OK) return 9;
      if (coll_all_reduce(a, b, 64, COLL_INT64, COLL_SUM, comm, NULL) != COLL_OK) return 10;
      if (coll_send(g_out, G, COLL_INT64, next, comm, gs) != COLL_OK) return 11;
      if (coll_group_end() != COLL_OK) return 12;
      if (gs && coll_stream_synchronize(gs) != COLL_OK) return 13;
      for (int k = 0; k < G; k++)
        if (g_in[k] != (int64_t)prev * 1000000 + it + k) return 14;
      for (int k = 0; k < 64; k++)
        if (b[k] != (int64_t)n * k + n * (n - 1) / 2) return 15;
    }
  }
  coll_stream_destroy(s);
  free(c);
  free(g_out);
  free(g_in);
  return 0;
}

int main(void) {
  for (int n = 2; n <= 3; n++) {
    char why[256] = "";
    int rc = coll_launch_local(n, body, NULL, 300000, why, sizeof why);
    if (rc) {
      printf("tsan_executor: %d ranks failed (%d): %s\n", n, rc, why);
      return 1;
    }
    printf("tsan_executor: %d ranks x %d iterations: ok\n", n, ITERS);
  }
  return 0;
}
