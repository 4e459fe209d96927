/* select.c — which transport carries each peer pair, as a pure function.
 *
 * comm.c gathers the facts (same host?, can this rank and the peer use InfiniBand?,
 * COLL_TRANSPORT) and asks here; the rule lives in one place so it is unit-tested for
 * every combination.  Must never look at the environment, the network or a device.
 */
#include <string.h>

#include "internal.h"

bool coll_parse_transport_mode(const char *s, coll_transport_mode *mode) {
  *mode = COLL_MODE_AUTO;
  if (!s || !*s || strcmp(s, "auto") == 0) return true;
  if (strcmp(s, "shm") == 0)
    *mode = COLL_MODE_SHM;
  else if (strcmp(s, "tcp") == 0)
    *mode = COLL_MODE_TCP;
  else if (strcmp(s, "ib") == 0)
    *mode = COLL_MODE_IB;
  else
    return false;
  return true;
}

/* auto: same host -> shm; else ib when both ends have a usable port; else tcp.
 * Forced: that transport for every pair, or -1 where it cannot reach (shm across hosts,
 * ib when either end has no port).  Symmetric in the two ends, so both ranks of a pair
 * always agree. */
int coll_select_transport(coll_transport_mode mode, bool same_host, bool ib_here, bool ib_peer) {
  switch (mode) {
  case COLL_MODE_SHM: return same_host ? COLL_T_SHM : -1;
  case COLL_MODE_TCP: return COLL_T_TCP;
  case COLL_MODE_IB: return ib_here && ib_peer ? COLL_T_IB : -1;
  case COLL_MODE_AUTO:
  default:
    if (same_host) return COLL_T_SHM;
    return ib_here && ib_peer ? COLL_T_IB : COLL_T_TCP;
  }
}
