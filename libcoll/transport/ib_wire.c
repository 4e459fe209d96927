/* ib_wire.c — encoding, decoding and choices of the InfiniBand transport that need no
 * hardware (see ib_wire.h).  Compiled into every build, with or without libibverbs, so
 * its unit tests run everywhere.  Must never read past the given length or trust a
 * field from the wire before bounding it.
 */
#include "ib_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Big-endian cursor helpers: every write/read moves the cursor by the field's size. */
static void w8(uint8_t **p, uint8_t v) { *(*p)++ = v; }
static void w16(uint8_t **p, uint16_t v) {
  w8(p, (uint8_t)(v >> 8));
  w8(p, (uint8_t)v);
}
static void w32(uint8_t **p, uint32_t v) {
  w16(p, (uint16_t)(v >> 16));
  w16(p, (uint16_t)v);
}
static void w64(uint8_t **p, uint64_t v) {
  w32(p, (uint32_t)(v >> 32));
  w32(p, (uint32_t)v);
}
static void wb(uint8_t **p, const uint8_t *b, size_t n) {
  memcpy(*p, b, n);
  *p += n;
}
static uint8_t r8(const uint8_t **p) { return *(*p)++; }
static uint16_t r16(const uint8_t **p) {
  uint16_t h = r8(p);
  return (uint16_t)(h << 8 | r8(p));
}
static uint32_t r32(const uint8_t **p) {
  uint32_t h = r16(p);
  return h << 16 | r16(p);
}
static uint64_t r64(const uint8_t **p) {
  uint64_t h = r32(p);
  return h << 32 | r32(p);
}
static void rb(const uint8_t **p, uint8_t *b, size_t n) {
  memcpy(b, *p, n);
  *p += n;
}

static bool fail(char *why, size_t len, const char *msg) {
  if (why && len) snprintf(why, len, "%s", msg);
  return false;
}

/* Port info layout: magic 4 | version 2 | lid 2 | port 1 | link 1 | mtu 1 | gid_index 1 |
 * gid 16 | tcp_family 2 | tcp_port 2 | tcp_addr 16  = 48 bytes, zero-padded to 64. */
void coll_ib_port_encode(const coll_ib_port_info *in, uint8_t *out) {
  memset(out, 0, COLL_IB_PORT_BYTES);
  uint8_t *p = out;
  w32(&p, COLL_IB_MAGIC_PORT);
  w16(&p, COLL_IB_WIRE_VERSION);
  w16(&p, in->lid);
  w8(&p, in->port);
  w8(&p, in->link_layer);
  w8(&p, in->mtu);
  w8(&p, in->gid_index);
  wb(&p, in->gid, 16);
  w16(&p, in->tcp_family);
  w16(&p, in->tcp_port);
  wb(&p, in->tcp_addr, 16);
}

bool coll_ib_port_decode(const uint8_t *in, size_t len, coll_ib_port_info *out, char *why,
                         size_t why_len) {
  if (!in || len < COLL_IB_PORT_BYTES) return fail(why, why_len, "port info is truncated");
  const uint8_t *p = in;
  if (r32(&p) != COLL_IB_MAGIC_PORT)
    return fail(why, why_len,
                "port info has the wrong magic (the peer has no usable "
                "InfiniBand port, or is not libcoll)");
  if (r16(&p) != COLL_IB_WIRE_VERSION)
    return fail(why, why_len, "port info is from another libcoll version");
  coll_ib_port_info o;
  o.lid = r16(&p);
  o.port = r8(&p);
  o.link_layer = r8(&p);
  o.mtu = r8(&p);
  o.gid_index = r8(&p);
  rb(&p, o.gid, 16);
  o.tcp_family = r16(&p);
  o.tcp_port = r16(&p);
  rb(&p, o.tcp_addr, 16);
  if (o.port == 0) return fail(why, why_len, "port info names port 0");
  if (o.link_layer != COLL_IB_LL_INFINIBAND && o.link_layer != COLL_IB_LL_ETHERNET)
    return fail(why, why_len, "port info has an unknown link layer");
  if (o.mtu < 1 || o.mtu > 5) return fail(why, why_len, "port info has an MTU code outside 1..5");
  if (o.tcp_family != AF_INET && o.tcp_family != AF_INET6)
    return fail(why, why_len, "port info has no sideband address");
  if (o.tcp_port == 0) return fail(why, why_len, "port info has sideband port 0");
  if (o.link_layer == COLL_IB_LL_INFINIBAND && (o.lid == 0 || o.lid >= 0xc000))
    return fail(why, why_len, "port info has no unicast LID on an InfiniBand port");
  if (o.link_layer == COLL_IB_LL_ETHERNET) {
    uint8_t any = 0;
    for (int i = 0; i < 16; i++) any |= o.gid[i];
    if (!any) return fail(why, why_len, "port info has no GID on a RoCE port");
  }
  *out = o;
  return true;
}

/* Pair info layout: magic 4 | version 2 | pad 2 | from 4 | to 4 | secret 16 | qpn 4 |
 * psn 4 | fifo_addr 8 | fifo_rkey 4 | credit_addr 8 | credit_rkey 4 | nslots 4 |
 * slot_bytes 4 = 76 bytes, zero-padded to 96. */
void coll_ib_pair_encode(const coll_ib_pair_info *in, uint8_t *out) {
  memset(out, 0, COLL_IB_PAIR_BYTES);
  uint8_t *p = out;
  w32(&p, COLL_IB_MAGIC_PAIR);
  w16(&p, COLL_IB_WIRE_VERSION);
  w16(&p, 0);
  w32(&p, in->from_rank);
  w32(&p, in->to_rank);
  wb(&p, in->secret, 16);
  w32(&p, in->qpn);
  w32(&p, in->psn);
  w64(&p, in->fifo_addr);
  w32(&p, in->fifo_rkey);
  w64(&p, in->credit_addr);
  w32(&p, in->credit_rkey);
  w32(&p, in->nslots);
  w32(&p, in->slot_bytes);
}

bool coll_ib_pair_decode(const uint8_t *in, size_t len, coll_ib_pair_info *out, char *why,
                         size_t why_len) {
  if (!in || len < COLL_IB_PAIR_BYTES) return fail(why, why_len, "queue pair info is truncated");
  const uint8_t *p = in;
  if (r32(&p) != COLL_IB_MAGIC_PAIR)
    return fail(why, why_len, "queue pair info has the wrong magic (not a libcoll peer)");
  if (r16(&p) != COLL_IB_WIRE_VERSION)
    return fail(why, why_len, "queue pair info is from another libcoll version");
  (void)r16(&p);
  coll_ib_pair_info o;
  o.from_rank = r32(&p);
  o.to_rank = r32(&p);
  rb(&p, o.secret, 16);
  o.qpn = r32(&p);
  o.psn = r32(&p);
  o.fifo_addr = r64(&p);
  o.fifo_rkey = r32(&p);
  o.credit_addr = r64(&p);
  o.credit_rkey = r32(&p);
  o.nslots = r32(&p);
  o.slot_bytes = r32(&p);
  if (o.qpn == 0 || o.qpn > 0xffffff)
    return fail(why, why_len, "queue pair info has a QP number outside 1..2^24-1");
  if (o.psn > 0xffffff) return fail(why, why_len, "queue pair info has a PSN wider than 24 bits");
  if (o.nslots < 1 || o.nslots > COLL_IB_MAX_SLOTS || (o.nslots & (o.nslots - 1)))
    return fail(why, why_len,
                "queue pair info has a slot count that is not a power of two "
                "in 1..64");
  if (o.slot_bytes < 64 || o.slot_bytes > COLL_IB_MAX_SLOT_BYTES || o.slot_bytes % 64)
    return fail(why, why_len,
                "queue pair info has a slot size that is not a multiple of 64 "
                "in 64 B..16 MiB");
  if (o.fifo_addr == 0 || o.credit_addr == 0)
    return fail(why, why_len, "queue pair info has a null FIFO or credit address");
  /* The FIFO must not wrap the address space: the last slot's end is fifo_addr + total. */
  uint64_t total = (uint64_t)o.nslots * o.slot_bytes;
  if (o.fifo_addr > UINT64_MAX - total)
    return fail(why, why_len, "queue pair info has a FIFO that wraps the address space");
  if (o.credit_addr > UINT64_MAX - 4)
    return fail(why, why_len, "queue pair info has a credit word that wraps the address space");
  *out = o;
  return true;
}

bool coll_ib_parse_hca(const char *spec, char *name, size_t name_len, int *port) {
  if (!spec || !name || name_len < 2) return false;
  const char *colon = strchr(spec, ':');
  size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
  if (n == 0 || n >= name_len) return false;
  for (size_t i = 0; i < n; i++)
    if (spec[i] == ',' || spec[i] == ' ' || spec[i] == '/') return false;
  int pt = 0;
  if (colon) {
    const char *d = colon + 1;
    if (!*d) return false;
    long v = 0;
    for (; *d; d++) {
      if (*d < '0' || *d > '9') return false;
      v = v * 10 + (*d - '0');
      if (v > 255) return false;
    }
    if (v < 1) return false;
    pt = (int)v;
  }
  memcpy(name, spec, n);
  name[n] = 0;
  *port = pt;
  return true;
}

static int gid_rank(const coll_ib_gid_entry *e) {
  uint8_t any = 0;
  for (int i = 0; i < 16; i++) any |= e->gid[i];
  if (!e->valid || !any) return 0;
  static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  bool is_v4 = memcmp(e->gid, v4mapped, 12) == 0;
  bool link_local = e->gid[0] == 0xfe && (e->gid[1] & 0xc0) == 0x80;
  switch (e->type) {
  case COLL_IB_GID_TYPE_ROCE_V2: return is_v4 ? 4 : !link_local ? 3 : 2;
  case COLL_IB_GID_TYPE_ROCE_V1: return 1;
  default: return 0;
  }
}

int coll_ib_pick_gid(const coll_ib_gid_entry *e, int n, int link_layer) {
  if (link_layer != COLL_IB_LL_ETHERNET) return n > 0 ? 0 : -1;
  int best = -1, best_rank = 0;
  for (int i = 0; i < n; i++) {
    int r = gid_rank(&e[i]);
    if (r > best_rank) { /* strict: the lowest index wins a tie */
      best_rank = r;
      best = i;
    }
  }
  return best;
}

/* Appends to a bounded sentence (never past len, always terminated). */
static void add(char *out, size_t len, const char *fmt, const char *dev, int port,
                const char *what) {
  if (!out || !len) return;
  size_t used = strlen(out);
  if (used + 1 >= len) return;
  snprintf(out + used, len - used, fmt, used ? "; " : "", dev, port, what);
}

int coll_ib_choose_port(const coll_ib_port_view *v, int n, const char *want_dev, int want_port,
                        char *skipped, size_t skipped_len, char *why, size_t why_len) {
  if (skipped && skipped_len) skipped[0] = 0;
  if (why && why_len) why[0] = 0;
  int chosen = -1, considered = 0;
  char seen[160] = "";
  for (int i = 0; i < n; i++) {
    if (want_dev && want_dev[0] && strcmp(v[i].dev, want_dev) != 0) continue;
    if (want_port && v[i].port != want_port) continue;
    considered++;
    if (!v[i].active) {
      add(seen, sizeof seen, "%s%s port %d %s", v[i].dev, v[i].port, "not active");
      continue;
    }
    const char *bad = !v[i].pd_ok ? "refuses a protection domain (ibv_alloc_pd)"
                      : v[i].gid_index < 0
                          ? (v[i].link_layer == COLL_IB_LL_ETHERNET
                                 ? "is RoCE without a usable GID (no IP address on its interface?)"
                                 : "has no GID")
                          : NULL;
    if (bad) {
      add(skipped, skipped_len, "%s%s port %d %s", v[i].dev, v[i].port, bad);
      add(seen, sizeof seen, "%s%s port %d %s", v[i].dev, v[i].port, bad);
      continue;
    }
    if (chosen < 0) chosen = i;
  }
  if (chosen >= 0 || !why || !why_len) return chosen;
  if (want_dev && want_dev[0])
    snprintf(why, why_len, "COLL_IB_HCA=%s%s%.0d: no usable port (%s)", want_dev,
             want_port ? ":" : "", want_port, considered ? seen : "no such device");
  else if (n == 0)
    snprintf(why, why_len, "no InfiniBand device: ibv_get_device_list returned 0 devices");
  else
    snprintf(why, why_len, "no InfiniBand device with an active, usable port (%s)", seen);
  return -1;
}

int coll_ib_drain(int n, uint32_t (*outstanding)(void *arg, int i), void (*poll)(void *arg, int i),
                  uint64_t (*now)(void *arg), void (*relax)(void *arg), void *arg,
                  uint64_t deadline) {
  for (;;) {
    int left = 0;
    for (int i = 0; i < n; i++)
      if (outstanding(arg, i) > 0) {
        poll(arg, i);
        left += outstanding(arg, i) > 0;
      }
    if (left == 0 || now(arg) >= deadline) return left;
    if (relax) relax(arg);
  }
}
