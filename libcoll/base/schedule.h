/* schedule.h — the vocabulary of a schedule: which algorithm (coll_algo), which buffer a
 * range lives in, the kinds of step, a step, and one operation of a group's
 * point-to-point work.  Types only, at the bottom, so that internal.h (struct coll_comm
 * holds a plan's steps, a group's operations, the tuner's per-algorithm figures) can
 * name them without including algo/plan.h, and so pull the algo layer's header into
 * every layer.  algo/plan.h includes this file and builds schedules out of it.
 *
 * Must never: declare a function, or include anything but the C library's headers: it
 * is a dictionary, not a layer.
 */
#ifndef COLL_SCHEDULE_H
#define COLL_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

/* One value per row of the algorithm table (algo.h, table.c), where each is described.
 * AUTO: the tuner's choice (exec/tune.c), not a row that runs. */
typedef enum {
  COLL_ALGO_AUTO = 0,
  COLL_ALGO_RING,
  COLL_ALGO_TREE,
  COLL_ALGO_RD,
  COLL_ALGO_RHD,
  COLL_ALGO_ONESHOT,
  COLL_ALGO_DIRECT,
  COLL_ALGO_MAPPED,
  COLL_ALGO_PAIRWISE,
  COLL_ALGO_LINEAR,
  COLL_ALGO_DEV_ONESHOT,
  COLL_ALGO_DEV_TWOSHOT,
  COLL_ALGO_HIER,
  COLL_ALGO_FANOUT,
  COLL_ALGO_STAGED,
  COLL_ALGO_DEV_ONEGPU
} coll_algo;
#define COLL_NUM_ALGOS 16

/* Which user buffer a range lives in. */
typedef enum { COLL_BUF_SEND = 0, COLL_BUF_RECV = 1 } coll_buf;

/* One step.  Field use by kind:
 *   COPY:                 dst <- src                       (local, no peer)
 *   SEND:                 peer_out <- src
 *   RECV:                 dst <- peer_in
 *   RECV_COPY_SEND:       dst <- peer_in; peer_out <- same data
 *   RECV_REDUCE_SEND:     peer_out <- (peer_in OP src)
 *   RECV_REDUCE_COPY:     dst <- (peer_in OP src)          (+avg when `final`)
 *   RECV_REDUCE_COPY_SEND dst <- (peer_in OP src); peer_out <- dst   (+avg when `final`)
 *   RECV2_REDUCE_SEND     peer_out <- ((peer_in OP src) OP peer_in2)
 *     (a tree node with two children: it combines both children's partial results with
 *     its own without a buffer of its own, which a non-root rank of a reduce lacks)
 * A range is (buffer, offset, count) in elements; src and dst always have `count`
 * elements.  `chunk` is the chunk index the step moves (for the trace), -1 if none.
 * `delay` (rounds): the executor runs slice k of the step in round k + delay, so a plan
 * can start a step late — after the steps whose results it reads have finished, or
 * skewed by a tree node's depth so the up and down pipelines of a tree decouple.  Both
 * ends of a connection must still meet its messages in the same order: see tree.c. */
typedef enum {
  COLL_STEP_COPY,
  COLL_STEP_SEND,
  COLL_STEP_RECV,
  COLL_STEP_RECV_COPY_SEND,
  COLL_STEP_RECV_REDUCE_SEND,
  COLL_STEP_RECV_REDUCE_COPY,
  COLL_STEP_RECV_REDUCE_COPY_SEND,
  COLL_STEP_RECV2_REDUCE_SEND
} coll_step_kind;

typedef struct {
  coll_step_kind kind;
  int peer_in, peer_out; /* -1 when unused */
  int peer_in2; /* RECV2_REDUCE_SEND's second input; -1 otherwise (read for that kind only) */
  coll_buf src_buf, dst_buf;
  size_t src_off, dst_off; /* elements */
  size_t count;            /* elements */
  int chunk;
  int final;      /* this step produces the final reduced value (AVG divides) */
  uint32_t delay; /* rounds before the step's first slice runs */
  int32_t item;   /* group point-to-point only: the grouped operation (its index
                     in coll_plan_args.group) whose buffers the step uses */
} coll_step;

/* The hosts a communicator's ranks run on (comm.c builds it from the exchanged host ids,
 * algo/hier.c's coll_hosts_build): host[r] in 0..nhosts-1, numbered in order of first
 * appearance, so ranks with equal values share memory; local[r] the rank's index among
 * its host's ranks, in rank order.  per_host: the ranks on every host when all hosts hold
 * the same number, else 0; by_host[h·per_host + i] is then the rank with local index i on
 * host h (NULL when per_host is 0). */
typedef struct {
  int nhosts, per_host;
  const int *host, *local, *by_host;
} coll_hosts;

/* One operation of a group's point-to-point work, in bytes (a group may mix dtypes):
 * SEND `count` bytes to `peer`, RECV `count` bytes from `peer`, or COPY them locally (a
 * sendrecv to this rank itself; peer is this rank). */
typedef struct {
  coll_step_kind kind; /* COLL_STEP_SEND, COLL_STEP_RECV or COLL_STEP_COPY */
  int peer;
  size_t count;
} coll_group_op;

#endif
