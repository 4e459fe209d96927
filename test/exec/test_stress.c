/* test_stress.c — a thousand back-to-back collectives of random kinds and sizes on one
 * communicator, every result checked, blocking and queued calls mixed. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "coll_test.h"

static int stress(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  enum { CALLS = 1000, MAXC = 1 << 17 };
  uint64_t seed = 777; /* same on every rank: every rank draws the same call sequence */
  int64_t *in = malloc(sizeof(int64_t) * MAXC * (size_t)n),
          *out = malloc(sizeof(int64_t) * MAXC * (size_t)n);
  coll_stream_t s;
  coll_stream_create(&s);
  for (int call = 0; call < CALLS; call++) {
    int kind = (int)(t_rand(&seed) % 5);
    size_t count = (size_t)(t_rand(&seed) % (t_rand(&seed) % 8 == 0 ? MAXC : 300));
    int root = (int)(t_rand(&seed) % (uint64_t)n);
    bool queued = t_rand(&seed) % 3 == 0;
    coll_stream_t st = queued ? s : NULL;
    size_t in_len = kind == 1 ? count * (size_t)n : count;
    for (size_t i = 0; i < in_len; i++) in[i] = (int64_t)(rank * 1000003 + call + (int64_t)i);
    coll_result r = COLL_OK;
    switch (kind) {
    case 0: r = coll_all_reduce(in, out, count, COLL_INT64, COLL_SUM, comm, st); break;
    case 1: r = coll_reduce_scatter(in, out, count, COLL_INT64, COLL_SUM, comm, st); break;
    case 2: r = coll_all_gather(in, out, count, COLL_INT64, comm, st); break;
    case 3: r = coll_broadcast(in, out, count, COLL_INT64, root, comm, st); break;
    case 4: r = coll_reduce(in, out, count, COLL_INT64, COLL_SUM, root, comm, st); break;
    }
    if (r == COLL_OK && queued) r = coll_stream_synchronize(s);
    if (r != COLL_OK) return t_failf("rank %d call %d: %s", rank, call, coll_comm_last_error(comm));
    int64_t base = (int64_t)n * (n - 1) / 2 * 1000003 + (int64_t)n * call;
    for (size_t i = 0; i < (kind == 2 ? count * (size_t)n : count); i++) {
      int64_t want;
      switch (kind) {
      case 0: want = base + (int64_t)n * (int64_t)i; break;
      case 1: want = base + (int64_t)n * (int64_t)(rank * (int64_t)count + (int64_t)i); break;
      case 2: want = (int64_t)(i / count) * 1000003 + call + (int64_t)(i % count); break;
      case 3: want = root * 1000003 + call + (int64_t)i; break;
      default:
        if (rank != root) {
          want = out[i];
          break;
        }
        want = base + (int64_t)n * (int64_t)i;
      }
      if (out[i] != want)
        return t_failf(
            "rank %d call %d (kind %d count %zu root %d): element %zu is %lld, want %lld", rank,
            call, kind, count, root, i, (long long)out[i], (long long)want);
    }
  }
  coll_stream_destroy(s);
  free(in);
  free(out);
  return 0;
}

Test(stress, thousand_random_collectives_n3, .timeout = 300) {
  char why[256];
  cr_assert_eq(t_launch(3, stress, NULL, 280000, why, sizeof why), 0, "%s", why);
}

Test(stress, thousand_random_collectives_n8_oversubscribed, .timeout = 300) {
  char why[256];
  cr_assert_eq(t_launch(8, stress, NULL, 280000, why, sizeof why), 0, "%s", why);
}
