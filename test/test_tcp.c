/* test_tcp.c — the correctness matrix over the TCP transport on one host.
 *
 * COLL_TRANSPORT=tcp forces every peer pair onto sockets even though all ranks share
 * this machine, so the proxy, the framing, the striping over several sockets per pair
 * and the flow control all run for real.  N in 2, 3, 4, with one and with three sockets
 * per pair; the ~1 MiB counts run at N=4 (their two-socket striping is the common case).
 * Also: COLL_TRANSPORT=shm and nonsense values are refused or honoured as documented.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "tcp_matrix.h"

typedef struct {
  bool big;
} targ;

static int rank_matrix(coll_comm_t comm, int rank, int n, void *varg) {
  const targ *a = varg;
  return tm_run(comm, rank, n, a->big) ? 1 : 0;
}

static void run(int n, bool big, const char *socks) {
  setenv("COLL_TRANSPORT", "tcp", 1);
  setenv("COLL_TIMEOUT_MS", "30000", 1);
  setenv("COLL_SOCKS_PER_PEER", socks, 1);
  targ a = {.big = big};
  char why[256];
  int before = t_shm_segments();
  int rc = t_launch(n, rank_matrix, &a, 150000, why, sizeof why);
  cr_assert_eq(rc, 0, "tcp matrix on %d ranks (%s sockets per pair%s): %s", n, socks,
               big ? ", ~1 MiB counts" : "", why);
  cr_assert_eq(t_shm_segments(), before, "a shared segment was left in /dev/shm");
}

Test(tcp, n2, .timeout = 120) { run(2, false, "2"); }
Test(tcp, n3, .timeout = 120) { run(3, false, "2"); }
Test(tcp, n4, .timeout = 120) { run(4, false, "2"); }
Test(tcp, n3_one_socket, .timeout = 120) { run(3, false, "1"); }
Test(tcp, n2_three_sockets_big, .timeout = 160) { run(2, true, "3"); }
Test(tcp, n4_big, .timeout = 160) { run(4, true, "2"); }

/* ---- transport selection ------------------------------------------------------------ */

static int init_only(coll_comm_t comm, int rank, int n, void *arg) {
  (void)comm; (void)n; (void)arg;
  coll_unique_id id = coll_launch_unique_id();
  coll_comm_t c;
  coll_result r = coll_comm_init_rank(&c, 2, id, rank);
  const char *want = getenv("T_EXPECT");
  if (strcmp(want, "ok") == 0) {
    if (r != COLL_OK) return t_failf("rank %d: init failed: %s", rank, coll_comm_last_error(NULL));
    int x = rank + 1, y = 0;
    r = coll_all_reduce(&x, &y, 1, COLL_INT32, COLL_SUM, c, NULL);
    coll_comm_destroy(c);
    return r == COLL_OK && y == 3 ? 0 : t_failf("rank %d: all-reduce gave %d", rank, y);
  }
  if (r != COLL_ERR_INVALID_ARG) return t_failf("rank %d: init returned %s", rank, coll_result_string(r));
  if (!strstr(coll_comm_last_error(NULL), "COLL_TRANSPORT"))
    return t_failf("rank %d: sentence does not name COLL_TRANSPORT: %s", rank, coll_comm_last_error(NULL));
  return 0;
}

static void selection(const char *value, const char *expect) {
  setenv("COLL_TRANSPORT", value, 1);
  setenv("COLL_TIMEOUT_MS", "10000", 1);
  setenv("T_EXPECT", expect, 1);
  char why[256];
  int rc = coll_launch_local_raw(2, init_only, NULL, 30000, why, sizeof why);
  cr_assert_eq(rc, 0, "COLL_TRANSPORT=%s: %s", value, why);
  cr_assert_eq(t_shm_segments(), 0);
}

Test(tcp, transport_shm_on_one_host, .timeout = 60) { selection("shm", "ok"); }
Test(tcp, transport_auto, .timeout = 60) { selection("auto", "ok"); }
Test(tcp, transport_unknown_refused, .timeout = 60) { selection("carrier-pigeon", "refused"); }
