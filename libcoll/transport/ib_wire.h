/* ib_wire.h — the parts of the InfiniBand transport that need no hardware: what one rank
 * tells the others about its HCA port, what two ranks tell each other about the queue
 * pair that joins them, the FIFO slot/credit arithmetic, COLL_IB_HCA parsing, GID
 * index choice and which port (if any) the probe takes.
 *
 * Kept apart from ib.c (which needs libibverbs and a device) so that every byte parser
 * and every counter rule is unit-tested here, on a machine with no HCA.  Must never read
 * past the length it is given, accept a message whose magic, version or bounds are
 * wrong, or include <infiniband/verbs.h>.
 */
#ifndef COLL_IB_WIRE_H
#define COLL_IB_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define COLL_IB_MAGIC_PORT 0x434c4950u /* "CLIP": a rank's port info (setup blob) */
#define COLL_IB_MAGIC_PAIR 0x434c4951u /* "CLIQ": one queue pair's info (sideband) */
#define COLL_IB_WIRE_VERSION 2u        /* 2: credits ride in the immediate (below) */

#define COLL_IB_PORT_BYTES 64 /* encoded coll_ib_port_info, fits COLL_CONN_BLOB */
#define COLL_IB_PAIR_BYTES 96 /* encoded coll_ib_pair_info */
#define COLL_IB_MAX_SLOTS 64  /* bounds accepted from a peer */
#define COLL_IB_MAX_SLOT_BYTES (16u << 20)

/* Link layers as ibv_port_attr.link_layer spells them (IBV_LINK_LAYER_*). */
enum { COLL_IB_LL_UNSPEC = 0, COLL_IB_LL_INFINIBAND = 1, COLL_IB_LL_ETHERNET = 2 };

/* What every rank publishes once (in the setup blob): enough to address its port, plus
 * a TCP address on which it exchanges per-pair info (queue pair numbers are per pair,
 * and a communicator of 65536 ranks could not carry them in one fixed-size blob). */
typedef struct {
  uint16_t lid;
  uint8_t port;       /* HCA port number (1-based) */
  uint8_t link_layer; /* COLL_IB_LL_* */
  uint8_t mtu;        /* enum ibv_mtu: 1=256 .. 5=4096 */
  uint8_t gid_index;
  uint8_t gid[16];
  uint16_t tcp_family; /* AF_INET / AF_INET6 */
  uint16_t tcp_port;   /* host order */
  uint8_t tcp_addr[16];
} coll_ib_port_info;

/* What the two ends of one queue pair tell each other (over the sideband socket). */
typedef struct {
  uint32_t from_rank, to_rank;
  uint8_t secret[16]; /* the communicator's: a stranger cannot inject a pair */
  uint32_t qpn;       /* 24 bits */
  uint32_t psn;       /* 24 bits */
  uint64_t fifo_addr; /* where the sender writes slot i: fifo_addr + i * slot_bytes */
  uint32_t fifo_rkey;
  uint64_t credit_addr; /* where the receiver writes its head counter (4 bytes) */
  uint32_t credit_rkey;
  uint32_t nslots, slot_bytes;
} coll_ib_pair_info;

/* Encoders write exactly COLL_IB_*_BYTES (big-endian fields, zero padding).  Decoders
 * take the length actually held and return false, with a reason in `why`, for anything
 * short, foreign, from another version, or out of bounds. */
void coll_ib_port_encode(const coll_ib_port_info *in, uint8_t *out);
bool coll_ib_port_decode(const uint8_t *in, size_t len, coll_ib_port_info *out, char *why,
                         size_t why_len);
void coll_ib_pair_encode(const coll_ib_pair_info *in, uint8_t *out);
bool coll_ib_pair_decode(const uint8_t *in, size_t len, coll_ib_pair_info *out, char *why,
                         size_t why_len);

/* ---- FIFO arithmetic ----------------------------------------------------------------
 * Counters are 32-bit and wrap; every comparison is on the unsigned difference, which is
 * right as long as the two counters are never more than 2^31 apart (they are at most
 * nslots apart).  The sender writes slot tail % nslots of the peer's FIFO at byte offset
 * (tail % nslots) * slot_bytes, and may do so only while tail - head < nslots.  nslots
 * must be a power of two: only then does counter % nslots step by one across the 2^32
 * wrap (with 5 slots, 0xffffffff and 0 would both land in slot 0). */
static inline bool coll_ib_can_send(uint32_t tail, uint32_t head, uint32_t nslots) {
  return (uint32_t)(tail - head) < nslots;
}
static inline uint32_t coll_ib_slot(uint32_t counter, uint32_t nslots) { return counter % nslots; }
static inline uint64_t coll_ib_slot_offset(uint32_t counter, uint32_t nslots, uint32_t slot_bytes) {
  return (uint64_t)(counter % nslots) * slot_bytes;
}
/* Slots the receiver has filled and not yet consumed. */
static inline uint32_t coll_ib_filled(uint32_t tail, uint32_t head) {
  return (uint32_t)(tail - head);
}
/* A credit (the receiver's head, RDMA-written back) may move the sender's view of head
 * only forward, and never past what the sender has written: anything else is a stale or
 * corrupt write and is ignored.  Returns the head to use. */
static inline uint32_t coll_ib_accept_credit(uint32_t known_head, uint32_t credit, uint32_t tail) {
  uint32_t ahead = credit - known_head, outstanding = tail - known_head;
  return ahead <= outstanding ? credit : known_head;
}
/* The immediate of the write that fills a slot carries the slice's byte count and, when
 * the writer owes its peer a credit for the other direction, that credit: the writer's
 * receive head, low COLL_IB_IMM_CREDIT_BITS bits.
 *
 *   bits  0-17  bytes (a slot is at most 2^18 - 1 bytes)
 *   bit   18    a credit follows
 *   bits 19-31  head mod 2^13
 *
 * The low bits suffice: the head the sender of the data is owed lies between the head it
 * already knows and its own tail, at most nslots (<= COLL_IB_MAX_SLOTS) apart, so
 * known + ((low - known) mod 2^13) is the head itself (coll_ib_imm_credit), and
 * coll_ib_accept_credit bounds it like any credit.  A credit that rides on data costs no
 * packet; on soft-RoCE, where every packet is a round of the kernel's work, a credit
 * written on its own doubled the packets of a small exchange.  The receiver refuses a
 * byte count larger than a slot. */
#define COLL_IB_IMM_BYTES_BITS 18
#define COLL_IB_IMM_CREDIT_BITS 13
static inline uint32_t coll_ib_imm_pack(uint32_t bytes, bool credit, uint32_t head) {
  uint32_t imm = bytes & ((1u << COLL_IB_IMM_BYTES_BITS) - 1);
  if (credit)
    imm |= 1u << COLL_IB_IMM_BYTES_BITS | (head & ((1u << COLL_IB_IMM_CREDIT_BITS) - 1))
                                              << (COLL_IB_IMM_BYTES_BITS + 1);
  return imm;
}
static inline uint32_t coll_ib_imm_bytes(uint32_t imm) {
  return imm & ((1u << COLL_IB_IMM_BYTES_BITS) - 1);
}
static inline bool coll_ib_imm_has_credit(uint32_t imm) {
  return imm >> COLL_IB_IMM_BYTES_BITS & 1u;
}
/* The head the immediate's low bits name, given the head the receiver knows. */
static inline uint32_t coll_ib_imm_credit(uint32_t imm, uint32_t known_head) {
  uint32_t low = imm >> (COLL_IB_IMM_BYTES_BITS + 1), mask = (1u << COLL_IB_IMM_CREDIT_BITS) - 1;
  return known_head + ((low - known_head) & mask);
}
static inline bool coll_ib_imm_ok(uint32_t imm, uint32_t slot_bytes) {
  return coll_ib_imm_bytes(imm) <= slot_bytes;
}

/* ---- device / port / GID choice ------------------------------------------------------ */

/* COLL_IB_HCA: "name" or "name:port" (e.g. mlx5_0:1).  Port 0 means "first active".
 * False for an empty name, a name longer than name_len-1, or a port outside 1..255. */
bool coll_ib_parse_hca(const char *spec, char *name, size_t name_len, int *port);

enum { COLL_IB_GID_TYPE_IB = 0, COLL_IB_GID_TYPE_ROCE_V1 = 1, COLL_IB_GID_TYPE_ROCE_V2 = 2 };
typedef struct {
  uint8_t gid[16];
  int type; /* COLL_IB_GID_TYPE_* */
  bool valid;
} coll_ib_gid_entry;

/* The GID index to use on a port: on InfiniBand 0 (the port GID; the LID routes);
 * on Ethernet (RoCE) the best of: RoCE v2 with an IPv4-mapped address, RoCE v2 with a
 * global IPv6 address, any RoCE v2, then RoCE v1; -1 if no entry is usable.  An all-zero
 * GID is never usable. */
int coll_ib_pick_gid(const coll_ib_gid_entry *e, int n, int link_layer);

/* ---- close: drain before destroying -------------------------------------------------- */

/* Bounded drain of n send queues before their queue pairs are destroyed (a write still
 * in flight when its queue pair goes is lost: the peer never gets the last slice).
 * Round after round: poll(arg, i) each queue that still has work outstanding(arg, i) > 0;
 * stop when none has, or when now(arg) reaches deadline; relax(arg) (may be NULL) between
 * rounds.  Returns how many queues still had work outstanding (0: all drained). */
int coll_ib_drain(int n, uint32_t (*outstanding)(void *arg, int i), void (*poll)(void *arg, int i),
                  uint64_t (*now)(void *arg), void (*relax)(void *arg), void *arg,
                  uint64_t deadline);
/* One HCA port as the probe saw it: present is not the same as usable. */
typedef struct {
  char dev[64];   /* device name (ibv_get_device_name) */
  int port;       /* 1-based */
  bool active;    /* IBV_PORT_ACTIVE */
  int link_layer; /* COLL_IB_LL_* */
  int gid_index;  /* coll_ib_pick_gid's choice, or COLL_IB_GID_INDEX; -1: none usable */
  bool pd_ok;     /* the device gave a protection domain (it answers verbs) */
} coll_ib_port_view;

/* The port the transport uses among `n` seen: the first active, usable one, within
 * COLL_IB_HCA's `want_dev` ("" = any) and `want_port` (0 = any); -1 if none.  A port
 * that is active but unusable (RoCE without a usable GID, no protection domain) is
 * skipped, and `skipped` (when not NULL) gets a sentence naming each such port and why
 * ("" when none was skipped), which the caller logs as a warning: the device is there but
 * the job goes on without it.  On -1, `why` says what was found. */
int coll_ib_choose_port(const coll_ib_port_view *v, int n, const char *want_dev, int want_port,
                        char *skipped, size_t skipped_len, char *why, size_t why_len);

#endif
