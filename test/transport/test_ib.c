/* test_ib.c — the InfiniBand transport: its pure parts exhaustively, its device paths
 * where a device exists, and transport selection.
 *
 * Pure (run everywhere): port/pair info encoding with every truncation, every foreign
 * magic/version and every bound; the FIFO slot/credit rules against a model that delays
 * and reorders credits across the 2^32 wrap; COLL_IB_HCA parsing; GID index choice; the
 * registration cache (hits, merges, LRU eviction, limits, refcounts, invalidation) plus
 * a randomized run checked against its invariants after every step; the per-pair
 * selection rule for every combination.  Processes: COLL_TRANSPORT=ib without a device
 * must fail init on 2 local ranks with a sentence naming the reason, bounded in time and
 * leaving /dev/shm clean.  Device: the correctness matrix over ib (skips with the
 * probe's reason when there is no device).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coll_config.h"
#include "coll_test.h"
#include "ib_regcache.h"
#include "ib_wire.h"
#include "internal.h"
#include "tcp_matrix.h"
#if COLL_HAVE_IBVERBS
#include "ib.h"
#endif

/* ---- port info ------------------------------------------------------------------------ */

static coll_ib_port_info good_port(int ll) {
  coll_ib_port_info p = {.lid = 7,
                         .port = 1,
                         .link_layer = (uint8_t)ll,
                         .mtu = 5,
                         .gid_index = 3,
                         .tcp_family = AF_INET,
                         .tcp_port = 40000};
  for (int i = 0; i < 16; i++) p.gid[i] = (uint8_t)(0xa0 + i);
  p.tcp_addr[0] = 10;
  p.tcp_addr[3] = 9;
  return p;
}

Test(ib_wire, port_round_trip) {
  for (int ll = COLL_IB_LL_INFINIBAND; ll <= COLL_IB_LL_ETHERNET; ll++) {
    coll_ib_port_info in = good_port(ll), out;
    uint8_t buf[COLL_IB_PORT_BYTES];
    coll_ib_port_encode(&in, buf);
    char why[128];
    cr_assert(coll_ib_port_decode(buf, sizeof buf, &out, why, sizeof why), "%s", why);
    cr_assert_eq(memcmp(&in, &out, sizeof in), 0);
  }
}

Test(ib_wire, port_truncated_and_foreign) {
  coll_ib_port_info in = good_port(COLL_IB_LL_INFINIBAND), out;
  uint8_t buf[COLL_IB_PORT_BYTES];
  coll_ib_port_encode(&in, buf);
  char why[128];
  for (size_t len = 0; len < sizeof buf; len++)
    cr_assert(!coll_ib_port_decode(buf, len, &out, why, sizeof why), "accepted %zu bytes", len);
  cr_assert(strstr(why, "truncated"));
  cr_assert(!coll_ib_port_decode(NULL, 64, &out, why, sizeof why));
  /* A zero blob is what comm.c sees from a rank that set up no ib transport. */
  uint8_t zero[256] = {0};
  cr_assert(!coll_ib_port_decode(zero, sizeof zero, &out, why, sizeof why));
  cr_assert(strstr(why, "magic"), "%s", why);
  /* Every single-bit flip of magic and version is refused. */
  for (int byte = 0; byte < 6; byte++)
    for (int bit = 0; bit < 8; bit++) {
      uint8_t b[COLL_IB_PORT_BYTES];
      memcpy(b, buf, sizeof b);
      b[byte] ^= (uint8_t)(1u << bit);
      cr_assert(!coll_ib_port_decode(b, sizeof b, &out, why, sizeof why), "flip %d.%d", byte, bit);
    }
}

static bool port_ok_with(void (*mut)(coll_ib_port_info *)) {
  coll_ib_port_info in = good_port(COLL_IB_LL_INFINIBAND), out;
  mut(&in);
  uint8_t buf[COLL_IB_PORT_BYTES];
  coll_ib_port_encode(&in, buf);
  char why[128];
  return coll_ib_port_decode(buf, sizeof buf, &out, why, sizeof why);
}
static void m_port0(coll_ib_port_info *p) { p->port = 0; }
static void m_ll0(coll_ib_port_info *p) { p->link_layer = 0; }
static void m_ll3(coll_ib_port_info *p) { p->link_layer = 3; }
static void m_mtu0(coll_ib_port_info *p) { p->mtu = 0; }
static void m_mtu6(coll_ib_port_info *p) { p->mtu = 6; }
static void m_fam(coll_ib_port_info *p) { p->tcp_family = AF_UNIX; }
static void m_tport(coll_ib_port_info *p) { p->tcp_port = 0; }
static void m_lid0(coll_ib_port_info *p) { p->lid = 0; }
static void m_lidmc(coll_ib_port_info *p) { p->lid = 0xc001; }
static void m_roce_nogid(coll_ib_port_info *p) {
  p->link_layer = COLL_IB_LL_ETHERNET;
  p->lid = 0;
  memset(p->gid, 0, 16);
}
static void m_roce_lid0(coll_ib_port_info *p) {
  p->link_layer = COLL_IB_LL_ETHERNET;
  p->lid = 0;
}
static void m_v6(coll_ib_port_info *p) { p->tcp_family = AF_INET6; }
static void m_mtu1(coll_ib_port_info *p) { p->mtu = 1; }

Test(ib_wire, port_bounds) {
  void (*bad[])(coll_ib_port_info *) = {m_port0, m_ll0,   m_ll3,  m_mtu0,  m_mtu6,
                                        m_fam,   m_tport, m_lid0, m_lidmc, m_roce_nogid};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    cr_assert(!port_ok_with(bad[i]), "bad port info #%zu accepted", i);
  void (*good[])(coll_ib_port_info *) = {m_roce_lid0, m_v6, m_mtu1};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++)
    cr_assert(port_ok_with(good[i]), "good port info #%zu refused", i);
}

/* ---- pair info ------------------------------------------------------------------------ */

static coll_ib_pair_info good_pair(void) {
  coll_ib_pair_info p = {.from_rank = 3,
                         .to_rank = 65535,
                         .qpn = 0x123456,
                         .psn = 0xabcdef,
                         .fifo_addr = 0x7f0000001000ull,
                         .fifo_rkey = 0xdeadbeef,
                         .credit_addr = 0x7f0000900000ull,
                         .credit_rkey = 0x01020304,
                         .nslots = 8,
                         .slot_bytes = 128 * 1024};
  for (int i = 0; i < 16; i++) p.secret[i] = (uint8_t)(i * 17);
  return p;
}

static bool pair_eq(const coll_ib_pair_info *a, const coll_ib_pair_info *b) {
  return a->from_rank == b->from_rank && a->to_rank == b->to_rank &&
         !memcmp(a->secret, b->secret, 16) && a->qpn == b->qpn && a->psn == b->psn &&
         a->fifo_addr == b->fifo_addr && a->fifo_rkey == b->fifo_rkey &&
         a->credit_addr == b->credit_addr && a->credit_rkey == b->credit_rkey &&
         a->nslots == b->nslots && a->slot_bytes == b->slot_bytes;
}

Test(ib_wire, pair_round_trip_and_truncation) {
  coll_ib_pair_info in = good_pair(), out;
  uint8_t buf[COLL_IB_PAIR_BYTES];
  coll_ib_pair_encode(&in, buf);
  char why[128];
  cr_assert(coll_ib_pair_decode(buf, sizeof buf, &out, why, sizeof why), "%s", why);
  cr_assert(pair_eq(&in, &out));
  for (size_t len = 0; len < sizeof buf; len++)
    cr_assert(!coll_ib_pair_decode(buf, len, &out, why, sizeof why), "accepted %zu bytes", len);
  for (int byte = 0; byte < 6; byte++)
    for (int bit = 0; bit < 8; bit++) {
      uint8_t b[COLL_IB_PAIR_BYTES];
      memcpy(b, buf, sizeof b);
      b[byte] ^= (uint8_t)(1u << bit);
      cr_assert(!coll_ib_pair_decode(b, sizeof b, &out, why, sizeof why), "flip %d.%d", byte, bit);
    }
}

static bool pair_ok(coll_ib_pair_info p) {
  uint8_t buf[COLL_IB_PAIR_BYTES];
  coll_ib_pair_encode(&p, buf);
  coll_ib_pair_info out;
  char why[128];
  return coll_ib_pair_decode(buf, sizeof buf, &out, why, sizeof why);
}

Test(ib_wire, pair_bounds) {
  coll_ib_pair_info p;
#define BAD(stmt)                               \
  do {                                          \
    p = good_pair();                            \
    stmt;                                       \
    cr_assert(!pair_ok(p), "accepted: " #stmt); \
  } while (0)
#define GOOD(stmt)                            \
  do {                                        \
    p = good_pair();                          \
    stmt;                                     \
    cr_assert(pair_ok(p), "refused: " #stmt); \
  } while (0)
  BAD(p.qpn = 0);
  BAD(p.qpn = 0x1000000);
  GOOD(p.qpn = 0xffffff);
  BAD(p.psn = 0x1000000);
  GOOD(p.psn = 0);
  BAD(p.nslots = 0);
  BAD(p.nslots = COLL_IB_MAX_SLOTS * 2);
  GOOD(p.nslots = COLL_IB_MAX_SLOTS);
  GOOD(p.nslots = 1);
  for (uint32_t k = 3; k < COLL_IB_MAX_SLOTS; k++) /* the wrap rule: powers of two only */
    if (k & (k - 1)) BAD(p.nslots = k);
  BAD(p.slot_bytes = 0);
  BAD(p.slot_bytes = 32);
  BAD(p.slot_bytes = 4096 + 8);
  BAD(p.slot_bytes = COLL_IB_MAX_SLOT_BYTES + 64);
  GOOD(p.slot_bytes = COLL_IB_MAX_SLOT_BYTES);
  GOOD(p.slot_bytes = 64);
  BAD(p.fifo_addr = 0);
  BAD(p.credit_addr = 0);
  BAD(p.fifo_addr = UINT64_MAX - 1000);
  GOOD(p.fifo_addr = UINT64_MAX - (uint64_t)8 * 128 * 1024);
  BAD(p.credit_addr = UINT64_MAX - 2);
#undef BAD
#undef GOOD
}

/* Random bytes: the decoders never read out of bounds (ASan watches) and whatever they
 * accept re-encodes to the same bytes. */
Test(ib_wire, random_bytes) {
  uint64_t st = 42;
  for (int it = 0; it < 200000; it++) {
    uint8_t b[COLL_IB_PAIR_BYTES];
    for (size_t i = 0; i < sizeof b; i++) b[i] = (uint8_t)t_rand(&st);
    /* Half the time keep a valid header so the field checks are reached. */
    if (it & 1) {
      uint8_t h[6] = {0x43, 0x4c, 0x49, (uint8_t)((it & 2) ? 0x50 : 0x51), 0, 1};
      memcpy(b, h, 6);
    }
    size_t len = (size_t)(t_rand(&st) % (sizeof b + 1));
    uint8_t *heap = malloc(len ? len : 1);
    memcpy(heap, b, len);
    coll_ib_port_info po;
    coll_ib_pair_info pa;
    char why[128];
    if (coll_ib_port_decode(heap, len, &po, why, sizeof why)) {
      uint8_t re[COLL_IB_PORT_BYTES];
      coll_ib_port_encode(&po, re);
      cr_assert_eq(memcmp(re, heap, 48), 0);
    }
    if (coll_ib_pair_decode(heap, len, &pa, why, sizeof why)) {
      uint8_t re[COLL_IB_PAIR_BYTES];
      coll_ib_pair_encode(&pa, re);
      cr_assert_eq(memcmp(re, heap, 6), 0);
      cr_assert_eq(memcmp(re + 8, heap + 8, 68), 0);
    }
    free(heap);
  }
}

/* ---- FIFO arithmetic ------------------------------------------------------------------- */

Test(ib_fifo, slot_math_across_wrap) {
  for (uint32_t ns = 1; ns <= 16; ns++)
    for (uint32_t k = 0; k < 64; k++) {
      uint32_t t = 0xffffffe0u + k;
      cr_assert_eq(coll_ib_slot(t, ns), t % ns);
      cr_assert_eq(coll_ib_slot_offset(t, ns, 4096), (uint64_t)(t % ns) * 4096);
      for (uint32_t d = 0; d <= ns + 2; d++) {
        uint32_t h = t - d;
        cr_assert_eq(coll_ib_can_send(t, h, ns), d < ns, "tail %u head %u nslots %u", t, h, ns);
        cr_assert_eq(coll_ib_filled(t, h), d);
      }
    }
  cr_assert(coll_ib_imm_ok(0, 64));
  cr_assert(coll_ib_imm_ok(64, 64));
  cr_assert(!coll_ib_imm_ok(65, 64));
  cr_assert(!coll_ib_imm_ok(UINT32_MAX, 64));
}

/* The immediate carries the byte count and, when flagged, the low bits of a head that the
 * receiver rebuilds from the head it knows: exact whenever the true head is no more than
 * 2^13 - 1 ahead (it is at most nslots ahead), across the 2^32 wrap too. */
Test(ib_fifo, immediate_carries_bytes_and_credit) {
  const uint32_t sizes[] = {0, 1, 64, 4096, 131072, (1u << COLL_IB_IMM_BYTES_BITS) - 1};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    uint32_t plain = coll_ib_imm_pack(sizes[i], false, 12345);
    cr_assert_eq(coll_ib_imm_bytes(plain), sizes[i]);
    cr_assert(!coll_ib_imm_has_credit(plain));
    for (uint32_t head = 0xffffffc0u; head != 0x40u; head++)
      for (uint32_t behind = 0; behind <= COLL_IB_MAX_SLOTS; behind++) {
        uint32_t imm = coll_ib_imm_pack(sizes[i], true, head);
        cr_assert_eq(coll_ib_imm_bytes(imm), sizes[i]);
        cr_assert(coll_ib_imm_has_credit(imm));
        cr_assert_eq(coll_ib_imm_credit(imm, head - behind), head, "head %u known %u", head,
                     head - behind);
      }
  }
  /* A slot's worth of bytes is fine; the flag and credit bits never read as a size. */
  cr_assert(coll_ib_imm_ok(coll_ib_imm_pack(131072, true, 0xffffffffu), 131072));
  cr_assert(!coll_ib_imm_ok(coll_ib_imm_pack(131073, false, 0), 131072));
}

Test(ib_fifo, credit_acceptance) {
  /* known 10, tail 14: credits 10..14 move forward, anything else (stale, from the
   * future, wrapped) is ignored. */
  for (uint32_t base = 0xfffffff0u; base != 0x20u; base++) {
    uint32_t known = base, tail = base + 4;
    for (uint32_t d = 0; d <= 4; d++)
      cr_assert_eq(coll_ib_accept_credit(known, base + d, tail), base + d);
    cr_assert_eq(coll_ib_accept_credit(known, base - 1, tail), known);
    cr_assert_eq(coll_ib_accept_credit(known, base + 5, tail), known);
    cr_assert_eq(coll_ib_accept_credit(known, base + 0x80000000u, tail), known);
  }
}

/* Why nslots must be a power of two: counter % nslots must step by one across the 2^32
 * wrap, else two consecutive slices share a slot. */
Test(ib_fifo, wrap_needs_power_of_two) {
  for (uint32_t ns = 1; ns <= COLL_IB_MAX_SLOTS; ns++) {
    bool steps = coll_ib_slot(0u, ns) == (coll_ib_slot(UINT32_MAX, ns) + 1) % ns;
    cr_assert_eq(steps, (ns & (ns - 1)) == 0, "nslots %u", ns);
  }
}

/* A model of one connection: the sender writes slices, the receiver consumes them and
 * returns credits that arrive late, duplicated and out of order.  Starting near the 2^32
 * wrap.  Safety: the sender never reuses a slot the receiver has not consumed; liveness:
 * every slice arrives, in order. */
Test(ib_fifo, model_with_reordered_credits) {
  for (uint32_t ns = 1; ns <= 16; ns *= 2) {
    uint64_t st = 1000 + ns;
    uint32_t start = 0xffffff00u;
    uint32_t tail = start, shead = start, rtail = start, rhead = start;
    uint32_t slot_owner[16]; /* which slice sits in each slot */
    bool slot_full[16] = {0};
    uint32_t credits[64];
    int ncred = 0;
    uint32_t want = start;
    for (int step = 0; step < 200000; step++) {
      int act = (int)(t_rand(&st) % 4);
      if (act == 0 && coll_ib_can_send(tail, shead, ns)) {
        uint32_t s = coll_ib_slot(tail, ns);
        cr_assert(!slot_full[s], "ns %u: slot %u overwritten before it was consumed", ns, s);
        slot_full[s] = true;
        slot_owner[s] = tail;
        tail++;
        rtail = tail; /* the write with immediate lands */
      } else if (act == 1 && coll_ib_filled(rtail, rhead) > 0) {
        uint32_t s = coll_ib_slot(rhead, ns);
        cr_assert(slot_full[s]);
        cr_assert_eq(slot_owner[s], want, "out of order");
        want++;
        slot_full[s] = false;
        rhead++;
        if (ncred < 64) credits[ncred++] = rhead;
      } else if (act >= 2 && ncred > 0) {
        /* deliver a random pending credit (reordering); sometimes keep it (dup) */
        int i = (int)(t_rand(&st) % (uint64_t)ncred);
        shead = coll_ib_accept_credit(shead, credits[i], tail);
        if (t_rand(&st) % 3) credits[i] = credits[--ncred];
      }
      cr_assert(coll_ib_filled(tail, shead) <= ns);
      cr_assert((uint32_t)(rhead - shead) < 0x80000000u, "sender's head ran ahead of the receiver");
    }
    cr_assert((uint32_t)(want - start) > 1000, "ns %u: only %u slices moved", ns, want - start);
  }
}

/* ---- COLL_IB_HCA and GID choice -------------------------------------------------------- */

Test(ib_choice, parse_hca) {
  char name[16];
  int port = -1;
  cr_assert(coll_ib_parse_hca("mlx5_0:1", name, sizeof name, &port));
  cr_assert_str_eq(name, "mlx5_0");
  cr_assert_eq(port, 1);
  cr_assert(coll_ib_parse_hca("mlx5_3", name, sizeof name, &port));
  cr_assert_str_eq(name, "mlx5_3");
  cr_assert_eq(port, 0);
  cr_assert(coll_ib_parse_hca("rxe0:255", name, sizeof name, &port));
  cr_assert_eq(port, 255);
  const char *bad[] = {"",
                       ":1",
                       "mlx5_0:",
                       "mlx5_0:0",
                       "mlx5_0:256",
                       "mlx5_0:1x",
                       "mlx5_0:-1",
                       "a,b",
                       "mlx5 0",
                       "a/b",
                       "way_too_long_device_name:1",
                       "mlx5_0:99999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    cr_assert(!coll_ib_parse_hca(bad[i], name, sizeof name, &port), "accepted '%s'", bad[i]);
  cr_assert(!coll_ib_parse_hca(NULL, name, sizeof name, &port));
  char tiny[6];
  cr_assert(coll_ib_parse_hca("mlx5_", tiny, sizeof tiny, &port));
  cr_assert(!coll_ib_parse_hca("mlx5_0", tiny, sizeof tiny, &port));
}

static coll_ib_gid_entry gid(int type, const char *kind) {
  coll_ib_gid_entry e = {.type = type, .valid = true};
  if (!strcmp(kind, "v4")) {
    e.gid[10] = e.gid[11] = 0xff;
    e.gid[12] = 10;
    e.gid[15] = 1;
  } else if (!strcmp(kind, "ll")) {
    e.gid[0] = 0xfe;
    e.gid[1] = 0x80;
    e.gid[15] = 5;
  } else if (!strcmp(kind, "global")) {
    e.gid[0] = 0x20;
    e.gid[1] = 0x01;
    e.gid[15] = 7;
  } /* "zero": all zero */
  return e;
}

Test(ib_choice, pick_gid) {
  coll_ib_gid_entry t[8];
  /* InfiniBand: always the port GID, index 0. */
  t[0] = gid(COLL_IB_GID_TYPE_IB, "ll");
  cr_assert_eq(coll_ib_pick_gid(t, 1, COLL_IB_LL_INFINIBAND), 0);
  cr_assert_eq(coll_ib_pick_gid(t, 0, COLL_IB_LL_INFINIBAND), -1);
  /* A typical RoCE table: v1/v2 link-local, v1/v2 IPv4-mapped. */
  t[0] = gid(COLL_IB_GID_TYPE_ROCE_V1, "ll");
  t[1] = gid(COLL_IB_GID_TYPE_ROCE_V2, "ll");
  t[2] = gid(COLL_IB_GID_TYPE_ROCE_V1, "v4");
  t[3] = gid(COLL_IB_GID_TYPE_ROCE_V2, "v4");
  t[4] = gid(COLL_IB_GID_TYPE_ROCE_V2, "global");
  cr_assert_eq(coll_ib_pick_gid(t, 5, COLL_IB_LL_ETHERNET), 3);
  cr_assert_eq(coll_ib_pick_gid(t, 3, COLL_IB_LL_ETHERNET), 1, "v2 link-local beats v1");
  t[3] = gid(COLL_IB_GID_TYPE_ROCE_V2, "zero");
  cr_assert_eq(coll_ib_pick_gid(t, 5, COLL_IB_LL_ETHERNET), 4, "global v6 when no v4");
  t[4].valid = false;
  cr_assert_eq(coll_ib_pick_gid(t, 5, COLL_IB_LL_ETHERNET), 1);
  t[0] = gid(COLL_IB_GID_TYPE_ROCE_V1, "v4");
  cr_assert_eq(coll_ib_pick_gid(t, 1, COLL_IB_LL_ETHERNET), 0, "v1 alone is usable");
  t[0] = gid(COLL_IB_GID_TYPE_ROCE_V2, "zero");
  t[1] = gid(COLL_IB_GID_TYPE_IB, "v4");
  cr_assert_eq(coll_ib_pick_gid(t, 2, COLL_IB_LL_ETHERNET), -1, "nothing usable");
  /* Ties go to the lowest index. */
  t[0] = gid(COLL_IB_GID_TYPE_ROCE_V2, "v4");
  t[1] = gid(COLL_IB_GID_TYPE_ROCE_V2, "v4");
  cr_assert_eq(coll_ib_pick_gid(t, 2, COLL_IB_LL_ETHERNET), 0);
}

/* Present is not usable: a RoCE port without a usable GID or a device that refuses a
 * protection domain is skipped (and named, for the warning), the next usable port taken;
 * with none usable the probe says why and the job goes on without ib. */
static coll_ib_port_view port_view(const char *dev, int port, bool active, int ll, int gid,
                                   bool pd) {
  coll_ib_port_view v = {
      .port = port, .active = active, .link_layer = ll, .gid_index = gid, .pd_ok = pd};
  snprintf(v.dev, sizeof v.dev, "%s", dev);
  return v;
}

Test(ib_choice, unusable_ports_are_skipped) {
  char skipped[256], why[256];
  coll_ib_port_view v[4];
  v[0] = port_view("roce0", 1, true, COLL_IB_LL_ETHERNET, -1, true); /* no IP: no GID */
  v[1] = port_view("mlx5_0", 1, false, COLL_IB_LL_INFINIBAND, -1, true);
  v[2] = port_view("mlx5_1", 1, true, COLL_IB_LL_INFINIBAND, 0, false); /* no PD */
  v[3] = port_view("mlx5_1", 2, true, COLL_IB_LL_INFINIBAND, 0, true);
  cr_assert_eq(coll_ib_choose_port(v, 4, "", 0, skipped, sizeof skipped, why, sizeof why), 3);
  cr_assert(strstr(skipped, "roce0 port 1 is RoCE without a usable GID"), "%s", skipped);
  cr_assert(strstr(skipped, "mlx5_1 port 1 refuses a protection domain"), "%s", skipped);
  cr_assert(!strstr(skipped, "mlx5_0"), "an inactive port is not a warning: %s", skipped);
  /* Only unusable ones: none is taken, and the reason names each. */
  cr_assert_eq(coll_ib_choose_port(v, 3, "", 0, skipped, sizeof skipped, why, sizeof why), -1);
  cr_assert(strstr(why, "roce0 port 1 is RoCE without a usable GID") &&
                strstr(why, "mlx5_0 port 1 not active"),
            "%s", why);
  /* The RoCE port alone, as on a host whose RoCE NIC has no address. */
  cr_assert_eq(coll_ib_choose_port(v, 1, "", 0, skipped, sizeof skipped, why, sizeof why), -1);
  cr_assert(strstr(why, "without a usable GID"), "%s", why);
  cr_assert(strstr(skipped, "roce0"), "%s", skipped);
  /* COLL_IB_HCA narrows the choice and is named when it finds nothing usable. */
  cr_assert_eq(coll_ib_choose_port(v, 4, "mlx5_1", 0, NULL, 0, why, sizeof why), 3);
  cr_assert_eq(coll_ib_choose_port(v, 4, "mlx5_1", 1, NULL, 0, why, sizeof why), -1);
  cr_assert(strstr(why, "COLL_IB_HCA=mlx5_1:1") && strstr(why, "protection domain"), "%s", why);
  cr_assert_eq(coll_ib_choose_port(v, 4, "nonesuch", 0, NULL, 0, why, sizeof why), -1);
  cr_assert(strstr(why, "no such device"), "%s", why);
  cr_assert_eq(coll_ib_choose_port(v, 0, "", 0, NULL, 0, why, sizeof why), -1);
  cr_assert(strstr(why, "no InfiniBand device"), "%s", why);
}

/* ---- close drains posted writes, within a bound ------------------------------------ */

typedef struct {
  uint32_t out[4]; /* writes outstanding per queue */
  bool stuck[4];   /* this queue's completions never come */
  int polls[4];
  uint64_t clock; /* advances 1 per look, so the bound is reached without sleeping */
  int relaxes;
} fake_queues;

static uint32_t fq_out(void *a, int i) { return ((fake_queues *)a)->out[i]; }
static void fq_poll(void *a, int i) {
  fake_queues *f = a;
  f->polls[i]++;
  if (!f->stuck[i] && f->out[i]) f->out[i]--; /* one completion per poll */
}
static uint64_t fq_now(void *a) { return ++((fake_queues *)a)->clock; }
static void fq_relax(void *a) { ((fake_queues *)a)->relaxes++; }

Test(ib_close, drain_waits_for_every_posted_write) {
  fake_queues f = {.out = {2, 0, 5, 1}};
  cr_assert_eq(coll_ib_drain(4, fq_out, fq_poll, fq_now, fq_relax, &f, 1000), 0);
  for (int i = 0; i < 4; i++) cr_assert_eq(f.out[i], 0u, "queue %d not drained", i);
  cr_assert_eq(f.polls[1], 0, "a queue with nothing posted was polled");
  cr_assert_eq(f.polls[2], 5);
  cr_assert_lt(f.clock, 1000u);
}

Test(ib_close, drain_is_bounded) {
  fake_queues f = {.out = {3, 2}, .stuck = {false, true}};
  cr_assert_eq(coll_ib_drain(2, fq_out, fq_poll, fq_now, fq_relax, &f, 50), 1,
               "a queue whose completions never come must be given up at the deadline");
  cr_assert_eq(f.out[0], 0u);
  cr_assert_eq(f.clock, 50u, "it stopped at the deadline, not before or long after");
  /* Nothing posted anywhere: returns at once. */
  fake_queues g = {.clock = 0};
  cr_assert_eq(coll_ib_drain(2, fq_out, fq_poll, fq_now, fq_relax, &g, 50), 0);
  cr_assert_eq(g.polls[0] + g.polls[1] + g.relaxes, 0);
}

/* ---- registration cache ----------------------------------------------------------------- */

#define FAKE_MAX 65536
typedef struct {
  uintptr_t start[FAKE_MAX];
  size_t len[FAKE_MAX];
  bool live[FAKE_MAX];
  int regs, deregs, nlive;
  bool fail_next;
} fake_hca;

static int fake_reg(void *arg, uintptr_t start, size_t len, void **handle, uint32_t *lkey,
                    uint32_t *rkey, char *why, size_t why_len) {
  fake_hca *f = arg;
  if (f->fail_next) {
    f->fail_next = false;
    snprintf(why, why_len, "Cannot allocate memory (fake)");
    return -1;
  }
  int i = f->regs++;
  cr_assert(i < FAKE_MAX);
  f->start[i] = start;
  f->len[i] = len;
  f->live[i] = true;
  f->nlive++;
  *handle = (void *)(uintptr_t)(i + 1);
  *lkey = (uint32_t)(1000 + i);
  *rkey = (uint32_t)(2000 + i);
  return 0;
}

static void fake_dereg(void *arg, void *handle) {
  fake_hca *f = arg;
  int i = (int)(uintptr_t)handle - 1;
  cr_assert(i >= 0 && i < f->regs && f->live[i], "deregistered a handle twice or never made");
  f->live[i] = false;
  f->nlive--;
  f->deregs++;
}

static fake_hca *fake_new(coll_ib_regcache *c, int cap, size_t max_bytes) {
  fake_hca *f = calloc(1, sizeof *f);
  coll_ib_reg_ops ops = {.reg = fake_reg, .dereg = fake_dereg, .arg = f};
  cr_assert_eq(coll_ib_regcache_init(c, &ops, 4096, cap, max_bytes), 0);
  return f;
}

#define PG 4096u
#define BASE ((uintptr_t)0x10000000u)

Test(ib_regcache, init_refuses_bad_arguments) {
  coll_ib_regcache c;
  fake_hca f = {0};
  coll_ib_reg_ops ops = {.reg = fake_reg, .dereg = fake_dereg, .arg = &f};
  cr_assert_eq(coll_ib_regcache_init(&c, &ops, 3000, 4, 0), -1);
  cr_assert_eq(coll_ib_regcache_init(&c, &ops, 4096, 0, 0), -1);
  cr_assert_eq(coll_ib_regcache_init(&c, NULL, 4096, 4, 0), -1);
}

Test(ib_regcache, hit_covers_and_aligns) {
  coll_ib_regcache c;
  fake_hca *f = fake_new(&c, 8, 0);
  char why[160];
  coll_ib_reg *a = coll_ib_regcache_get(&c, BASE + 100, 3 * PG, why, sizeof why);
  cr_assert(a, "%s", why);
  cr_assert_eq(a->start, BASE);
  cr_assert_eq(a->end, BASE + 4 * PG, "page-aligned end");
  cr_assert_eq(a->refs, 1);
  cr_assert_eq(a->lkey, 1000);
  coll_ib_reg *b = coll_ib_regcache_get(&c, BASE + PG, PG, why, sizeof why);
  cr_assert_eq(b, a, "a sub-range hits");
  cr_assert_eq(a->refs, 2);
  coll_ib_reg *z = coll_ib_regcache_get(&c, BASE + 4 * PG - 1, 0, why, sizeof why);
  cr_assert_eq(z, a, "length 0 counts as one byte");
  cr_assert_eq(f->regs, 1);
  cr_assert_eq(c.hits, 2);
  cr_assert_eq(c.misses, 1);
  coll_ib_regcache_put(&c, a);
  coll_ib_regcache_put(&c, b);
  coll_ib_regcache_put(&c, z);
  cr_assert_eq(a->refs, 0);
  coll_ib_regcache_put(&c, a); /* one too many: ignored */
  cr_assert_eq(a->refs, 0);
  cr_assert_eq(f->nlive, 1, "unused entries stay registered (that is the point)");
  cr_assert_eq(coll_ib_regcache_destroy(&c), 0);
  cr_assert_eq(f->nlive, 0);
  free(f);
}

Test(ib_regcache, merges_unused_neighbours_only) {
  coll_ib_regcache c;
  fake_hca *f = fake_new(&c, 8, 0);
  char why[160];
  coll_ib_reg *a = coll_ib_regcache_get(&c, BASE, PG, why, sizeof why);
  coll_ib_regcache_put(&c, a);
  coll_ib_reg *b = coll_ib_regcache_get(&c, BASE + 2 * PG, PG, why, sizeof why);
  coll_ib_regcache_put(&c, b);
  cr_assert_eq(c.n, 2);
  /* [PG, 2PG) touches both: one registration [0, 3PG) replaces all three. */
  coll_ib_reg *m = coll_ib_regcache_get(&c, BASE + PG, PG, why, sizeof why);
  cr_assert(m, "%s", why);
  cr_assert_eq(m->start, BASE);
  cr_assert_eq(m->end, BASE + 3 * PG);
  cr_assert_eq(c.n, 1);
  cr_assert_eq(f->nlive, 1);
  cr_assert_eq(c.merges, 2);
  cr_assert_eq(c.bytes, 3 * PG);
  /* m is in use: a neighbour gets its own entry and m is not touched. */
  coll_ib_reg *n = coll_ib_regcache_get(&c, BASE + 2 * PG, 2 * PG, why, sizeof why);
  cr_assert(n && n != m);
  cr_assert_eq(n->start, BASE + 2 * PG);
  cr_assert_eq(m->refs, 1);
  cr_assert_eq(c.n, 2, "overlapping entries while one is in use");
  /* A range both cover is served by one of them. */
  coll_ib_reg *h = coll_ib_regcache_get(&c, BASE + 2 * PG, 10, why, sizeof why);
  cr_assert(h == m || h == n);
  coll_ib_regcache_put(&c, h);
  coll_ib_regcache_put(&c, m);
  coll_ib_regcache_put(&c, n);
  cr_assert_eq(coll_ib_regcache_destroy(&c), 0);
  cr_assert_eq(f->nlive, 0);
  free(f);
}

Test(ib_regcache, lru_eviction_and_full_cache) {
  coll_ib_regcache c;
  fake_hca *f = fake_new(&c, 3, 0);
  char why[160];
  coll_ib_reg *r[3];
  for (int i = 0; i < 3; i++) { /* separated by a gap: no merging */
    r[i] = coll_ib_regcache_get(&c, BASE + (uintptr_t)(4 * i) * PG, PG, why, sizeof why);
    coll_ib_regcache_put(&c, r[i]);
  }
  /* Use entry 0 again: entry 1 is now the least recently used. */
  coll_ib_regcache_put(&c, coll_ib_regcache_get(&c, BASE, PG, why, sizeof why));
  coll_ib_reg *x = coll_ib_regcache_get(&c, BASE + 40 * PG, PG, why, sizeof why);
  cr_assert(x, "%s", why);
  cr_assert_eq(c.evictions, 1);
  cr_assert_eq(c.n, 3);
  bool has1 = false;
  for (int i = 0; i < c.n; i++) has1 |= c.sorted[i]->start == BASE + 4 * PG;
  cr_assert(!has1, "the LRU entry was evicted");
  /* Hold all three: a fourth cannot be made, and nothing held is touched. */
  coll_ib_reg *h0 = coll_ib_regcache_get(&c, BASE, PG, why, sizeof why);
  coll_ib_reg *h1 = coll_ib_regcache_get(&c, BASE + 8 * PG, PG, why, sizeof why);
  int deregs = f->deregs;
  coll_ib_reg *no = coll_ib_regcache_get(&c, BASE + 80 * PG, PG, why, sizeof why);
  cr_assert_null(no);
  cr_assert(strstr(why, "full"), "%s", why);
  cr_assert_eq(f->deregs, deregs);
  cr_assert_eq(coll_ib_regcache_destroy(&c), 3, "three references were still held");
  cr_assert_eq(f->nlive, 0);
  (void)h0;
  (void)h1;
  free(f);
}

Test(ib_regcache, byte_limit) {
  coll_ib_regcache c;
  fake_hca *f = fake_new(&c, 16, 4 * PG);
  char why[160];
  coll_ib_reg *a = coll_ib_regcache_get(&c, BASE, 3 * PG, why, sizeof why);
  coll_ib_regcache_put(&c, a);
  coll_ib_reg *b = coll_ib_regcache_get(&c, BASE + 10 * PG, 2 * PG, why, sizeof why);
  cr_assert(b, "%s", why);
  cr_assert_eq(c.evictions, 1, "3 + 2 pages exceed the 4-page limit");
  cr_assert_eq(c.bytes, 2 * PG);
  cr_assert_null(coll_ib_regcache_get(&c, BASE + 20 * PG, 5 * PG, why, sizeof why));
  cr_assert(strstr(why, "exceeds"), "%s", why);
  cr_assert_null(coll_ib_regcache_get(&c, BASE + 20 * PG, 3 * PG, why, sizeof why),
                 "b is held: 2 + 3 pages cannot fit");
  coll_ib_regcache_put(&c, b);
  /* A merge that would exceed the limit is skipped: a separate entry instead. */
  coll_ib_reg *d = coll_ib_regcache_get(&c, BASE + 12 * PG, 3 * PG, why, sizeof why);
  cr_assert(d, "%s", why);
  cr_assert_leq(c.bytes, 4 * PG);
  coll_ib_regcache_put(&c, d);
  coll_ib_regcache_destroy(&c);
  cr_assert_eq(f->nlive, 0);
  free(f);
}

Test(ib_regcache, invalidate_and_stale) {
  coll_ib_regcache c;
  fake_hca *f = fake_new(&c, 8, 0);
  char why[160];
  coll_ib_reg *a = coll_ib_regcache_get(&c, BASE, PG, why, sizeof why);
  coll_ib_reg *b = coll_ib_regcache_get(&c, BASE + 8 * PG, PG, why, sizeof why);
  coll_ib_regcache_put(&c, b);
  cr_assert_eq(coll_ib_regcache_invalidate(&c, BASE, 16 * PG), 1, "only the unused one now");
  cr_assert_eq(f->nlive, 1);
  cr_assert(a->stale);
  /* The stale entry is never hit again: a new registration is made. */
  coll_ib_reg *a2 = coll_ib_regcache_get(&c, BASE, PG, why, sizeof why);
  cr_assert(a2 && a2 != a);
  cr_assert_eq(f->nlive, 2);
  coll_ib_regcache_put(&c, a); /* last user: dropped now */
  cr_assert_eq(f->nlive, 1);
  cr_assert_eq(c.n, 1);
  cr_assert_eq(coll_ib_regcache_invalidate(&c, BASE + PG, PG), 0, "no overlap, nothing dropped");
  cr_assert_eq(coll_ib_regcache_invalidate(&c, BASE, 0), 0);
  coll_ib_regcache_put(&c, a2);
  coll_ib_regcache_destroy(&c);
  cr_assert_eq(f->nlive, 0);
  free(f);
}

Test(ib_regcache, failed_registration_changes_nothing) {
  coll_ib_regcache c;
  fake_hca *f = fake_new(&c, 4, 0);
  char why[160];
  coll_ib_reg *a = coll_ib_regcache_get(&c, BASE, PG, why, sizeof why);
  coll_ib_regcache_put(&c, a);
  f->fail_next = true;
  cr_assert_null(coll_ib_regcache_get(&c, BASE + PG, PG, why, sizeof why));
  cr_assert(strstr(why, "fake"), "the reason is passed on: %s", why);
  cr_assert_eq(c.n, 1, "the neighbour that would have merged is still there");
  cr_assert_eq(f->nlive, 1);
  cr_assert_null(coll_ib_regcache_get(&c, UINTPTR_MAX - 10, 100, why, sizeof why));
  cr_assert(strstr(why, "wraps"), "%s", why);
  coll_ib_regcache_destroy(&c);
  free(f);
}

/* Random gets, puts and invalidations over a 64-page arena; after every step the cache's
 * entries and the fake HCA's live registrations must agree, and every handed-out entry
 * must still be registered and cover what was asked. */
Test(ib_regcache, randomized_invariants) {
  for (int cfg = 0; cfg < 4; cfg++) {
    int cap = cfg == 0 ? 2 : cfg == 1 ? 5 : 16;
    size_t maxb = cfg == 3 ? 24 * PG : 0;
    coll_ib_regcache c;
    fake_hca *f = fake_new(&c, cap, maxb);
    typedef struct {
      coll_ib_reg *r;
      uintptr_t a;
      size_t len;
      int handle;
    } held_t;
    held_t held[64];
    int nheld = 0;
    uint64_t st = 7 + (uint64_t)cfg;
    char why[160];
    for (int step = 0; step < 20000; step++) {
      int op = (int)(t_rand(&st) % 10);
      if (op < 5 && nheld < 64) {
        uintptr_t a = BASE + (uintptr_t)(t_rand(&st) % (64 * PG));
        size_t len = (size_t)(t_rand(&st) % (6 * PG));
        coll_ib_reg *r = coll_ib_regcache_get(&c, a, len, why, sizeof why);
        if (r) {
          cr_assert(r->start <= a && r->end >= a + (len ? len : 1));
          cr_assert(!r->stale);
          held[nheld++] = (held_t){r, a, len, (int)(uintptr_t)r->handle};
        } else {
          cr_assert(strstr(why, "full") || strstr(why, "exceeds"), "%s", why);
        }
      } else if (op < 9 && nheld > 0) {
        int i = (int)(t_rand(&st) % (uint64_t)nheld);
        coll_ib_regcache_put(&c, held[i].r);
        held[i] = held[--nheld];
      } else {
        uintptr_t a = BASE + (uintptr_t)(t_rand(&st) % (64 * PG));
        coll_ib_regcache_invalidate(&c, a, (size_t)(t_rand(&st) % (8 * PG)));
      }
      /* invariants */
      cr_assert_leq(c.n, cap);
      size_t bytes = 0;
      for (int i = 0; i < c.n; i++) {
        coll_ib_reg *r = c.sorted[i];
        cr_assert(r->used && r->start < r->end);
        cr_assert_eq(r->start % PG, 0);
        cr_assert_eq(r->end % PG, 0);
        if (i) cr_assert_leq(c.sorted[i - 1]->start, r->start, "sorted by start");
        int h = (int)(uintptr_t)r->handle - 1;
        cr_assert(f->live[h] && f->start[h] == r->start && f->len[h] == r->end - r->start);
        bytes += r->end - r->start;
      }
      cr_assert_eq(bytes, c.bytes);
      cr_assert_eq(f->nlive, c.n, "a registration leaked or vanished");
      if (maxb) cr_assert_leq(c.bytes, maxb);
      for (int i = 0; i < nheld; i++) {
        cr_assert(f->live[held[i].handle - 1], "a held registration was deregistered");
        cr_assert_eq((int)(uintptr_t)held[i].r->handle, held[i].handle, "a held entry was reused");
      }
    }
    for (int i = 0; i < nheld; i++) coll_ib_regcache_put(&c, held[i].r);
    cr_assert_eq(coll_ib_regcache_destroy(&c), 0);
    cr_assert_eq(f->nlive, 0);
    cr_assert_gt(c.hits + (uint64_t)f->regs, 0);
    free(f);
  }
}

/* ---- selection ----------------------------------------------------------------------- */

Test(ib_select, every_combination) {
  for (int m = COLL_MODE_AUTO; m <= COLL_MODE_IB; m++)
    for (int same = 0; same < 2; same++)
      for (int here = 0; here < 2; here++)
        for (int peer = 0; peer < 2; peer++) {
          int t = coll_select_transport((coll_transport_mode)m, same, here, peer);
          int want;
          switch (m) {
          case COLL_MODE_AUTO:
            want = same ? COLL_T_SHM : (here && peer) ? COLL_T_IB : COLL_T_TCP;
            break;
          case COLL_MODE_SHM: want = same ? COLL_T_SHM : -1; break;
          case COLL_MODE_TCP: want = COLL_T_TCP; break;
          default: want = here && peer ? COLL_T_IB : -1; break;
          }
          cr_assert_eq(t, want, "mode %d same_host %d ib_here %d ib_peer %d: got %d", m, same, here,
                       peer, t);
          cr_assert_eq(t, coll_select_transport((coll_transport_mode)m, same, peer, here),
                       "both ends of a pair must choose alike");
        }
}

Test(ib_select, parse_mode) {
  coll_transport_mode m;
  cr_assert(coll_parse_transport_mode(NULL, &m) && m == COLL_MODE_AUTO);
  cr_assert(coll_parse_transport_mode("", &m) && m == COLL_MODE_AUTO);
  cr_assert(coll_parse_transport_mode("auto", &m) && m == COLL_MODE_AUTO);
  cr_assert(coll_parse_transport_mode("shm", &m) && m == COLL_MODE_SHM);
  cr_assert(coll_parse_transport_mode("tcp", &m) && m == COLL_MODE_TCP);
  cr_assert(coll_parse_transport_mode("ib", &m) && m == COLL_MODE_IB);
  cr_assert(!coll_parse_transport_mode("IB", &m));
  cr_assert(!coll_parse_transport_mode("verbs", &m));
}

/* ---- processes ------------------------------------------------------------------------ */

/* Whether this process can use InfiniBand, and if not why. */
static bool ib_present(char *why, size_t len) {
#if COLL_HAVE_IBVERBS
  return coll_ib_probe(why, len);
#else
  snprintf(why, len, "libcoll was built without libibverbs");
  return false;
#endif
}

static int init_must_fail(coll_comm_t comm, int rank, int n, void *arg) {
  (void)comm;
  (void)arg;
  coll_unique_id id = coll_launch_unique_id();
  coll_comm_t c = NULL;
  coll_result r = coll_comm_init_rank(&c, n, id, rank);
  const char *msg = coll_comm_last_error(NULL);
  if (r == COLL_OK) {
    coll_comm_destroy(c);
    return t_failf("rank %d: init with COLL_TRANSPORT=ib succeeded without a device", rank);
  }
  if (r != COLL_ERR_UNSUPPORTED && r != COLL_ERR_REMOTE)
    return t_failf("rank %d: init returned %s: %s", rank, coll_result_string(r), msg);
  /* The rank that failed first names the reason; a rank whose peer left first may see
   * the bootstrap break instead (COLL_ERR_REMOTE), but never a hang. */
  if (r == COLL_ERR_UNSUPPORTED &&
      (!strstr(msg, "COLL_TRANSPORT=ib") ||
       !(strstr(msg, "ibv_get_device_list returned 0 devices") ||
         strstr(msg, "built without libibverbs") || strstr(msg, "active port"))))
    return t_failf("rank %d: sentence does not name the reason: %s", rank, msg);
  fprintf(stderr, "%s\n", msg);
  return 0;
}

Test(ib_proc, forced_ib_without_device_fails_cleanly, .timeout = 60) {
  char why[256];
  if (ib_present(why, sizeof why))
    cr_skip_test("an InfiniBand device is present: this test is for machines without one");
  setenv("COLL_TRANSPORT", "ib", 1);
  setenv("COLL_TIMEOUT_MS", "10000", 1);
  char lwhy[256];
  uint64_t t0 = coll_now_ns();
  int rc = coll_launch_local_raw(2, init_must_fail, NULL, 30000, lwhy, sizeof lwhy);
  uint64_t ms = (coll_now_ns() - t0) / 1000000u;
  cr_assert_eq(rc, 0, "%s", lwhy);
  cr_assert_lt(ms, 10000, "init took %llu ms to fail", (unsigned long long)ms);
  T_ASSERT_NO_LEFTOVERS("after the job");
}

Test(ib_proc, probe_reason_is_stable) {
  char a[256] = "", b[256] = "";
  bool x = ib_present(a, sizeof a), y = ib_present(b, sizeof b);
  cr_assert_eq(x, y);
  if (x) cr_skip_test("an InfiniBand device is present");
  cr_assert_str_eq(a, b);
  cr_assert(strstr(a, "no InfiniBand device") || strstr(a, "without libibverbs") ||
                strstr(a, "active port"),
            "%s", a);
}

/* "Says so once at INFO level": three probes, one line. */
Test(ib_proc, no_device_said_once_at_info) {
  char why[256];
  setenv("COLL_DEBUG", "INFO", 1);
  fflush(stderr);
  FILE *tmp = tmpfile();
  cr_assert(tmp);
  int saved = dup(2);
  dup2(fileno(tmp), 2);
  bool here = ib_present(why, sizeof why);
  ib_present(why, sizeof why);
  ib_present(why, sizeof why);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  if (here) cr_skip_test("an InfiniBand device is present");
  rewind(tmp);
  char line[512];
  int said = 0;
#if COLL_HAVE_IBVERBS
  while (fgets(line, sizeof line, tmp))
    said += strstr(line, "[coll INFO] ib: transport not available") != NULL;
  cr_assert_eq(said, 1, "the missing device was reported %d times", said);
#else
  (void)line;
  (void)said;
#endif
  fclose(tmp);
}

static int auto_works(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  int x = rank + 1, y = 0;
  coll_result r = coll_all_reduce(&x, &y, 1, COLL_INT32, COLL_SUM, comm, NULL);
  if (r != COLL_OK) return t_failf("rank %d: %s", rank, coll_comm_last_error(comm));
  return y == n * (n + 1) / 2 ? 0 : t_failf("rank %d: all-reduce gave %d", rank, y);
}

/* With no device, auto selection never picks ib: a normal job still runs. */
Test(ib_proc, auto_without_device_runs, .timeout = 60) {
  char why[256];
  if (ib_present(why, sizeof why)) cr_skip_test("an InfiniBand device is present");
  setenv("COLL_TRANSPORT", "auto", 1);
  setenv("COLL_TIMEOUT_MS", "10000", 1);
  char lwhy[256];
  cr_assert_eq(t_launch(3, auto_works, NULL, 30000, lwhy, sizeof lwhy), 0, "%s", lwhy);
  T_ASSERT_NO_LEFTOVERS("after the job");
}

static int rank_matrix(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  return tm_run(comm, rank, n, false) ? 1 : 0;
}

/* With a device: every pair over ib on this host (loopback through the HCA). */
static void device_matrix(int n) {
  char why[256];
  if (!ib_present(why, sizeof why)) cr_skip_test("%s", why);
  setenv("COLL_TRANSPORT", "ib", 1);
  setenv("COLL_TIMEOUT_MS", "30000", 1);
  char lwhy[256];
  int rc = t_launch(n, rank_matrix, NULL, 150000, lwhy, sizeof lwhy);
  cr_assert_eq(rc, 0, "ib matrix on %d ranks: %s", n, lwhy);
  T_ASSERT_NO_LEFTOVERS("after the job");
}

Test(ib_device, matrix_n2, .timeout = 180) { device_matrix(2); }
Test(ib_device, matrix_n3, .timeout = 180) { device_matrix(3); }
