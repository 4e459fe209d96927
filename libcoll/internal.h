/* internal.h — the communicator and the pieces every libcoll file shares.
 *
 * Layers (data flows down, never up; libcoll/layers.rules, checked by the suite): api.c
 * validates; exec/submit.c enqueues; executor.c runs a plan (plan.c, ring.c) slice by
 * slice through connectors (libcoll/transport/); reduce.c does arithmetic; bootstrap.c
 * only runs during init.  A lower layer reaches a higher one only through comm->hooks
 * and comm->exec_ops below.  Nothing in here may print and exit: every failure becomes
 * a coll_result plus a sentence in the communicator.  Every layer includes this file, so
 * it includes headers of include/, base/ and transport/ only, never a layer's
 * (layers.rules holds it so): a schedule's types are base/schedule.h's, the bootstrap's
 * state comm/bootstrap.h's.
 */
#ifndef COLL_INTERNAL_H
#define COLL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "base.h"
#include "coll.h"
#include "schedule.h"
#include "shm.h"
#include "transport.h"
#include "vocab.h"

#define COLL_ERRBUF 512
#define COLL_QUEUE_SLOTS 1024 /* asynchronous operations in flight per communicator */

/* ---- errors (debug.c) ------------------------------------------------------------ */

struct coll_comm;
/* Records `r` with a sentence on comm (or, comm == NULL, in this thread) and returns r.
 * At TRACE level the sentence is also logged with the file:line of the caller. */
coll_result coll_fail_at(struct coll_comm *comm, coll_result r, const char *file, int line,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));
#define coll_fail(comm, r, ...) coll_fail_at(comm, r, __FILE__, __LINE__, __VA_ARGS__)

/* ---- bootstrap (bootstrap.c) ---------------------------------------------------------
 * Every rank registers with the rendezvous root, which tells it where its ring
 * neighbour listens; allgather rounds around that ring of sockets exchange connection
 * info during init.  The root is served by a thread of the process that created the
 * unique id (or by rank 0 for env-based init). */

typedef struct {
  uint32_t magic;
  uint16_t version;
  uint16_t family; /* AF_INET or AF_INET6 */
  uint16_t port;   /* host order */
  uint8_t addr[16];
  uint8_t secret[COLL_SECRET_BYTES];
} coll_id_fields;

coll_result coll_id_encode(const coll_id_fields *f, coll_unique_id *id);
coll_result coll_id_decode(const coll_unique_id *id, coll_id_fields *f, char *why, size_t why_len);

/* Starts the root server for `f` (fills port when 0 and addr from the chosen interface
 * when `pick_addr`).  The server thread exits once every rank has closed its link. */
coll_result coll_bootstrap_root_start(coll_id_fields *f, bool pick_addr, int timeout_ms, char *why,
                                      size_t why_len);

/* The same in two halves, for a process that forks ranks: listen first (no thread yet),
 * fork, then run.  A process must not fork while the root thread might hold a lock that
 * the child would need (ASan's allocator, for one, has no fork handler in GCC 12), so the
 * launcher forks every rank before the thread exists and stops it before returning. */
typedef struct coll_root coll_root;
coll_result coll_bootstrap_root_listen(coll_id_fields *f, bool pick_addr, int timeout_ms,
                                       coll_root **out, char *why, size_t why_len);
/* Starts the thread; detached roots free themselves, others end in root_stop().  On
 * failure the root is discarded. */
coll_result coll_bootstrap_root_run(coll_root *r, bool detached, char *why, size_t why_len);
/* Ends a joinable root's loop, joins its thread and frees it. */
void coll_bootstrap_root_stop(coll_root *r);
/* Frees a root that never ran. */
void coll_bootstrap_root_discard(coll_root *r);
/* In a forked child: closes the root's descriptors, touches nothing else. */
void coll_bootstrap_root_forget(coll_root *r);
/* A fresh id; with `held`, the listening root is handed back without a thread. */
coll_result coll_make_unique_id(coll_unique_id *id, coll_root **held);

/* ---- env-based init (init_env.c) ------------------------------------------------------ */

/* The job's secret when the launcher cannot carry one: from COLL_SECRET when set, else a
 * hash of the rendezvous "host:port", the size and the launcher's job id variables. */
void coll_env_secret(uint8_t out[COLL_SECRET_BYTES], const char *addr, long size);
/* The job the launcher's variables describe: the rendezvous and secret, this rank and the
 * size (coll_comm_init_from_env's first half; the fault tests join a job by it and leave
 * mid-init).  Starts nothing; the error's sentence is in coll_comm_last_error(NULL). */
coll_result coll_env_job(coll_id_fields *f, int *rank, int *size);

/* ---- the local launcher (launch.c) -------------------------------------------------- */

/* Segments of the last job coll_launch_local(_raw) ran from this process that were still
 * in /dev/shm after every rank exited (the launcher removed them): their number, and
 * their names (space-separated, cut at len) in `names` when not NULL. */
int coll_launch_leftovers(char *names, size_t len);

/* ---- transport selection (select.c) --------------------------------------------------- */

/* Index of each transport in comm->transports[] and in the exchanged blobs. */
enum { COLL_T_SHM = 0, COLL_T_TCP = 1, COLL_T_IB = 2 };
#define COLL_MAX_TRANSPORTS 3
typedef enum { COLL_MODE_AUTO, COLL_MODE_SHM, COLL_MODE_TCP, COLL_MODE_IB } coll_transport_mode;
/* COLL_TRANSPORT's value (NULL or "" = auto); false if it names no transport. */
bool coll_parse_transport_mode(const char *s, coll_transport_mode *mode);
/* The COLL_T_* for one peer pair, or -1 when the forced mode cannot reach the peer. */
int coll_select_transport(coll_transport_mode mode, bool same_host, bool ib_here, bool ib_peer);

/* ---- operations, streams and the executor --------------------------------------- */

struct coll_device_ops; /* kernels/device_ops.h */

struct coll_stream {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t enqueued, completed;
  coll_result err;
  char errmsg[COLL_ERRBUF];
  /* The device back end that made the stream (device_ops.h): coll_device_host for
   * coll_stream_create's, cuda/'s for coll_stream_create_cuda's.  stream.c waits and
   * frees through it: a stream is waited on without a communicator. */
  const struct coll_device_ops *dev;
  struct coll_cuda_stream *cuda; /* wraps a cudaStream_t (coll_cuda.h), else NULL */
};

/* A stream's lock, condition and back end, the rest zero: for every place that makes one
 * (exec/stream.c's coll_stream_create; cuda/cuda.c's coll_stream_create_cuda, which may
 * not call up into exec/; api/group.c's stream on its stack for calls without one). */
static inline void coll_stream_init(struct coll_stream *s, const struct coll_device_ops *dev) {
  memset(s, 0, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->dev = dev;
}

/* COLL_COLL_GROUP_P2P: the point-to-point calls of one group on one communicator,
 * merged into one work.  group.c allocates it (one block) and builds its plan at
 * coll_group_end; the executor frees it when the work completes (finish()). */
typedef struct coll_group_p2p {
  size_t n, nsteps;
  coll_group_op *ops; /* [n] in call order, counts in bytes */
  const void **src;   /* [n] what a SEND or COPY reads */
  void **dst;         /* [n] where a RECV or COPY writes */
  coll_step *steps;   /* [n] the plan (plan.c), nsteps of them used */
} coll_group_p2p;

typedef struct {
  coll_coll_kind coll;
  const void *sendbuf;
  void *recvbuf;
  size_t count;
  coll_dtype dtype;
  coll_op op;
  int root;          /* root, or peer for send/recv, or destination for sendrecv */
  size_t recv_count; /* sendrecv */
  int recv_peer;     /* sendrecv */
  uint64_t seq;
  struct coll_stream *stream; /* NULL for a blocking call */
  _Atomic int done;
  coll_result result;
  /* CUDA (cuda.c): buffers in device memory; the event recorded on the cudaStream_t
   * that the collective waits for, and its ticket on that stream. */
  bool device;
  int cuda_dev; /* the buffers' GPU when device */
  void *cuda_event;
  uint32_t cuda_ticket;
  /* The device data path (cuda/peer.c, algo/device.c): a call it may serve; its
   * exchange of buffers (an all-gather numbered as the user's call, not COLL_CHECKed);
   * every rank's buffers mapped (peer_ok) and where (dev). */
  bool peer_candidate, peer_exchange, peer_ok;
  /* Device buffers on a coll_stream_t: the progress thread tries the device data path
   * for it when it runs (executor.c), with the communicator's own CUDA stream. */
  bool peer_queued;
  struct coll_dev_call *dev;
  /* A step of another path (mapped.c's and direct.c's exchanges and barriers through
   * the one-shot mailboxes): not traced as a call of its own. */
  bool inner;
  /* The library's own call on a communicator the user owns (split.c's exchanges over
   * the parent): takes no sequence number, skips COLL_CHECK, is not traced, so the
   * user's calls are numbered and checked as if it had not happened. */
  bool internal;
  /* COLL_COLL_GROUP_P2P: its operations, owned by the work (count is the bytes this rank
   * sends and receives, dtype COLL_UINT8); such work always carries a stream. */
  coll_group_p2p *group;
  /* all_to_allv's arrays, nranks entries each (count holds the sum of sendcounts, for
   * logs).  A blocking call points at the caller's arrays; a call on a stream at a copy
   * made by api.c in one allocation, v_copy, which the executor frees when the work
   * finishes (executor.c, finish()). */
  const size_t *sendcounts, *sdispls, *recvcounts, *rdispls;
  size_t *v_copy;
} coll_work;

/* The cost model's parameters (tune.c), the same on every rank. */
/* Where a communicator's tune figures came from (coll_comm_tune_source names them). */
typedef enum {
  COLL_TUNE_FROM_DEFAULTS = 0, /* COLL_TUNE=0, or a single rank: the fixed defaults */
  COLL_TUNE_FROM_MEASURED = 1, /* measured at creation */
  COLL_TUNE_FROM_CACHE = 2,    /* read from COLL_TUNE_FILE / the default cache */
  COLL_TUNE_FROM_BUSY = 3,     /* measured while busy, thrown away: the fixed defaults */
} coll_tune_from;

typedef struct {
  double alpha, beta, gamma; /* s per message, per byte moved, per byte reduced */
  double alpha_mb;           /* fixed cost of a one-shot call */
  double beta_cma;           /* s per byte read from a peer's memory (direct.c); 0: none */
  double alpha_cma;          /* s per process_vm_readv call, beyond its bytes */
  /* Per schedule (by coll_algo): its α as an 8-byte all-reduce measured it, 0: use alpha */
  double alpha_algo[COLL_NUM_ALGOS];
  /* The links across hosts, on a communicator of several hosts (alpha and beta are then
   * the links inside one, where the ranks have any): s per message, s per byte. */
  double alpha_net, beta_net;
  coll_tune_from source;
  /* Measured: the largest share of a rank's time that went to processes outside the job
   * while it measured (base/foreign.c); -1 where no rank could tell. */
  double foreign;
} coll_tune_params;
#define COLL_TUNE_BUCKETS 48 /* size buckets: bit length of the byte count */

/* What the layers below comm/ may ask of it, handed to them in every communicator
 * (comm.c fills it): a lower layer reaches a higher one only through something it was
 * handed.  The executor connects a lazy peer (use_peer) and asks the failure watch
 * (watch.c) whether a call is doomed, and tells it when a call failed. */
typedef struct coll_comm_hooks {
  coll_result (*use_peer)(struct coll_comm *comm, int p, int dir, size_t bytes);
  bool (*attention)(const struct coll_comm *comm);
  coll_result (*doomed)(struct coll_comm *comm, uint64_t seq, int peer, const char *what);
  void (*failed)(struct coll_comm *comm);
  /* windows (window.c), for algo/mapped.c: the caller holds comm->winmu */
  bool (*window_find)(struct coll_comm *comm, const void *p, size_t bytes, int32_t *slot,
                      uint64_t *off);
  uint8_t *(*window_peer)(struct coll_comm *comm, int32_t slot, int p, uint64_t off, size_t bytes);
} coll_comm_hooks;

/* What the executor hands the table's rows that run themselves (algo/oneshot.c,
 * direct.c, mapped.c), and the parts of exec/ it drives (check.c, tune.c, trace.c), in
 * every communicator (coll_exec_start fills it): exchanges of bytes between the ranks,
 * the failure watch, and tracing — so that nothing below the executor calls back up
 * into it. */
typedef struct coll_exec_ops {
  /* A blocking call on bytes (COLL_UINT8), as coll_exec_bytes. */
  coll_result (*bytes)(struct coll_comm *comm, coll_coll_kind c, const void *sendbuf, void *recvbuf,
                       size_t bytes, coll_op op, int root);
  /* Any work, as coll_exec_submit (the tuner's probes). */
  coll_result (*submit)(struct coll_comm *comm, const coll_work *w);
  /* COLL_ERR_REMOTE with the sentence when a failure elsewhere dooms w. */
  coll_result (*watch)(struct coll_comm *comm, const coll_work *w);
  bool (*trace_on)(struct coll_comm *comm);
  uint64_t *(*trace_t0)(struct coll_comm *comm);
  uint64_t *(*trace_t1)(struct coll_comm *comm);
  void (*trace_record)(struct coll_comm *comm, const coll_work *w, coll_algo algo,
                       const coll_step *steps, size_t nsteps, size_t es, uint64_t t_start,
                       uint64_t t_end);
} coll_exec_ops;

struct coll_comm {
  int rank, nranks;
  const coll_comm_hooks *hooks;  /* comm.c's, for the layers below */
  const coll_exec_ops *exec_ops; /* executor.c's, for the rows that run themselves */
  /* The device back end (kernels/device_ops.h), chosen once at creation (comm.c): cuda/'s
   * in a build with CUDA, else coll_device_host.  exec/ reaches devices only through it. */
  const struct coll_device_ops *dev;
  struct coll_peer *peer; /* the device data path (cuda/peer.c), once set up */
  int dev_gpus;           /* distinct GPUs the device path's ranks run on (peer.c; 0: not set up):
                           * the tuner prices the device rows with it (coll_cost_model.gpus) */
  uint8_t secret[COLL_SECRET_BYTES];
  int timeout_ms;
  pid_t *pids;        /* per rank, for liveness checks on this host */
  uint64_t *host_ids; /* per rank */
  /* The hosts the ranks run on, as the algorithms see them (schedule.h): built from
   * host_ids after the exchange (comm.c), its arrays in host_layout (3 × nranks ints). */
  coll_hosts hosts;
  int *host_layout;
  /* What the transports see of this communicator (transport.h): comm.c fills it, and
   * every transport callback gets it instead of the communicator. */
  coll_comm_view view;

  /* connectors: conn_send[p] moves data to p, conn_recv[p] from p (NULL for self, and
   * for a peer of a lazy transport until the executor first needs it) */
  coll_conn **conn_send, **conn_recv;
  pthread_mutex_t connmu; /* a lazy connector being published vs coll_exec_wake_all */
  int8_t *peer_t;         /* per rank: its lazy transport (COLL_T_*), -1: none or eager */
  /* [2p + dir]: the largest slice readied on the connection to (dir 0) / from (dir 1)
   * rank p (connected, and that many bytes of each slot resident: coll_comm_use_peer);
   * 0 before its first use.  Read and written by the executor's thread only. */
  uint32_t *peer_warm;
  uint8_t *peer_blob; /* per rank: COLL_CONN_BLOB bytes of that transport's info */
  /* Transports in use, indexed by COLL_T_*, chosen per peer pair by
   * coll_select_transport; each connector points at its own. */
  const coll_transport *transports[COLL_MAX_TRANSPORTS];
  void *transport_ctxs[COLL_MAX_TRANSPORTS];
  int ntransports;
  const coll_transport *transport; /* the one most peers use (for logs) */
  /* This rank's address on the route to the rendezvous (TCP listens there). */
  struct sockaddr_storage boot_local;
  socklen_t boot_local_len;
  size_t slot_bytes;
  /* One-shot path (oneshot.c): every peer is reached through shm mailboxes. */
  bool mailboxes;
  size_t nt_bytes;               /* calls this large stream their final copies (copy.c) */
  uint32_t mb_seq;               /* one-shot calls made on this communicator */
  uint32_t *mb_seen;             /* per rank: the highest one-shot call seen in its mailbox */
  coll_mailbox **mb;             /* [2p + parity]: rank p's mailboxes */
  _Atomic uint32_t **mb_waiters; /* per rank: sleepers on its mailboxes */
  bool fanout_warm;              /* this rank's fan-out ring is resident (fanout.c) */
  bool direct_ok;                /* ranks may read each other's memory (direct.c) */
  uint8_t *direct_scratch;
  void *direct_addrs;   /* per rank: its buffers' addresses in the running call */
  uint64_t *direct_got; /* per rank: bytes read from it in the running call (while
                           tracing: direct.c's trace steps), else NULL */
  /* Windows (window.c): memory from coll_mem_alloc, the same slots on every rank. */
  pthread_mutex_t winmu;
  struct coll_window *windows; /* COLL_MAX_WINDOWS slots */
  _Atomic int nshared;         /* windows every rank has mapped: mapped.c may run */
  bool warned_mapped;
  _Atomic int last_algo; /* coll_algo + 1 of the last call run (0: none yet) */
  void *mapped_where;    /* [nranks] coll_mapped_where of the running call */
  int local_ranks;       /* ranks on this host */
  bool oversubscribed;   /* more local ranks than the CPUs they may run on: spinning only hurts */
  int cores;             /* the CPUs this host's ranks may run on (0: unknown) */

  /* executor */
  pthread_mutex_t qmu;
  pthread_cond_t qcv;    /* work arrived / runner released / shutdown */
  pthread_cond_t donecv; /* some work finished */
  void *queue_store;     /* COLL_QUEUE_SLOTS queued records (executor.c) */
  /* queue[qhead % N] is the oldest pending; atomics so that a blocking call can see an
   * empty queue without the lock (executor.c's fast path) */
  _Atomic uint64_t qhead, qtail;
  _Atomic bool running; /* some thread is executing work: taken by compare-and-swap */
  bool shutdown;
  pthread_t thread;
  bool thread_started;
  _Atomic uint64_t next_seq;
  uint32_t nsplits; /* coll_comm_split calls made on this communicator (split.c) */
  coll_step *steps; /* scratch for one plan */
  uint8_t *barrier_buf;
  uint8_t *scratch; /* one slice, for large reductions that stream their output */
  size_t scratch_bytes;

  /* tuning (tune.c) */
  coll_tune_params tune;
  bool tuned;
  coll_algo forced;     /* COLL_ALGO, or AUTO */
  coll_algo probe_algo; /* while measuring: the algorithm being timed (AUTO: ring) */
  bool warned_forced[COLL_NUM_COLLS];
  uint8_t choice[COLL_NUM_COLLS][COLL_TUNE_BUCKETS];      /* best row */
  uint8_t choice_plan[COLL_NUM_COLLS][COLL_TUNE_BUCKETS]; /* best row with a schedule */
  /* every row's predicted seconds × handicap per bucket (INFINITY: cannot serve) */
  double cost_at[COLL_NUM_ALGOS][COLL_NUM_COLLS][COLL_TUNE_BUCKETS];
  uint32_t per_call_rows;      /* bit a: row a is usable only call by call (algo.h) */
  struct coll_cuda_comm *cuda; /* cuda/'s state (comm->dev's comm_setup), else NULL */

  struct coll_trace *trace; /* NULL unless COLL_TRACE or coll_trace_start (trace.c) */
  bool check;               /* COLL_CHECK: exchange call descriptors before each call (check.c) */

  struct coll_watch *watch; /* failures of other ranks reach this one (watch.c) */
  _Atomic int ready;        /* init (tuning included) is over: the user's calls begin */
  _Atomic int aborted;
  _Atomic int users;  /* API calls inside the communicator right now */
  coll_result sticky; /* first asynchronous failure: every later call fails too */

  pthread_mutex_t errmu;
  char errbuf[COLL_ERRBUF];
  coll_cpu_mates mates; /* view.mates: who else may run on this rank's CPU (backoff.c) */
};

coll_result coll_exec_start(struct coll_comm *comm);
void coll_exec_stop(struct coll_comm *comm);
/* Enqueues `w` (copied) and, for a blocking call (w->stream == NULL), waits for it. */
coll_result coll_exec_submit(struct coll_comm *comm, const coll_work *w);
/* A blocking call on bytes (COLL_UINT8), for the library's own probes (tune.c,
 * direct.c); root is the root, or the peer of send/recv.  (split.c builds its own
 * coll_work with .internal set instead: the user's numbering must not move.) */
coll_result coll_exec_bytes(struct coll_comm *comm, coll_coll_kind c, const void *sendbuf,
                            void *recvbuf, size_t bytes, coll_op op, int root);
/* A call failed outside the executor (the device path, cuda/peer.c): sticky for this
 * rank, and every peer hears of it, as a failure inside the executor does. */
void coll_exec_failed(struct coll_comm *comm, coll_result r);
/* Runs one piece of work to completion on the calling thread. */
coll_result coll_exec_run(struct coll_comm *comm, coll_work *w);
/* Wakes every thread of this process blocked on one of comm's connectors. */
void coll_exec_wake_all(struct coll_comm *comm);
/* A failure elsewhere (watch.c) that dooms `w`: COLL_ERR_REMOTE with its sentence.  Every
 * wait loop asks it once per slice (executor.c, check.c, oneshot.c). */
coll_result coll_exec_watch(struct coll_comm *comm, const coll_work *w);

/* ---- entry points (api.c, exec/submit.c) and grouped calls (group.c) ---------------- */

/* Hands checked work to the executor (exec/submit.c): device buffers, the device data
 * path and cudaStream_t handled. */
coll_result coll_submit(struct coll_comm *comm, const char *fn, coll_work *w);
/* How the device data path's exchange of descriptors `x` runs for the user's call `call`:
 * submitted from the caller's thread, or run in place by the progress thread. */
typedef coll_result (*coll_device_run_exchange)(struct coll_comm *comm, coll_work *x,
                                                coll_work *call);
/* One call of the device data path (exec/device_path.c).  *served: a device row ran it
 * (else the host-driven path must, on every rank alike); *exchanged: the exchange was
 * made, so every peer is in this call and a failure must reach them. */
coll_result coll_device_path(struct coll_comm *comm, const char *fn, coll_work *w, bool *served,
                             bool *exchanged, coll_device_run_exchange xchg);
/* Classifies w's buffers (w->device) and refuses what cannot run, as coll_submit would,
 * without running anything (group.c's look at a grouped point-to-point call). */
coll_result coll_submit_classify(struct coll_comm *comm, const char *fn, coll_work *w);
/* Is a coll_group_start open in this thread? */
bool coll_group_open(void);
/* Inside a group: keeps `w` (checked by api.c) for the outermost coll_group_end. */
coll_result coll_group_record(struct coll_comm *comm, const char *fn, const coll_work *w);
/* Does this thread's open group hold calls on comm? */
bool coll_group_holds(const struct coll_comm *comm);
/* Drops this thread's recorded calls on comm (it is being aborted). */
void coll_group_forget(const struct coll_comm *comm);

/* ---- mismatch detection (check.c) ------------------------------------------------ */

/* COLL_CHECK from the environment; unset: on in debug builds (COLL_CHECK_DEFAULT). */
bool coll_check_from_env(void);
/* Exchanges descriptors of `w` with the ranks it involves; COLL_ERR_MISMATCH with a
 * sentence naming both calls when they disagree. */
coll_result coll_check_call(struct coll_comm *comm, const coll_work *w);

/* ticket: the work's place on a cudaStream_t (streams of coll_stream_create_cuda), released in the
 * same critical section, so a cudaStream_t that passed its wait always finds the work complete. */
void coll_stream_complete(struct coll_stream *s, coll_result r, const char *msg, uint32_t ticket);
void coll_stream_enqueued(struct coll_stream *s);

/* ---- copies (copy.c) ----------------------------------------------------------------- */

/* memcpy with streaming stores for large outputs nobody reads soon (see copy.c). */
void coll_copy_nt(void *dst, const void *src, size_t n);
/* memcpy for bytes another core wrote a moment ago or reads next (a fan-out ring). */
void coll_copy_shared(void *dst, const void *src, size_t n);
/* Orders every streamed store before what follows (the call's completion). */
void coll_copy_nt_fence(void);
/* Calls whose user buffers exceed this stream their final copies (COLL_NT_BYTES). */
#define COLL_NT_DEFAULT (16u << 20)
/* Does a host call of collective c, count elements of es bytes on nranks ranks, stream
 * its final copies at this threshold?  The executor's rule, and the simulator's. */
bool coll_copy_streams(coll_coll_kind c, size_t count, size_t es, int nranks, bool in_place,
                       size_t nt_bytes);

/* ---- one-shot small collectives (oneshot.c) ----------------------------------------- */

/* Can the one-shot path serve this call (every peer on shm, the data fits a mailbox)?
 * Depends only on what every rank agrees on, so all ranks take the same path. */
bool coll_oneshot_fits(struct coll_comm *comm, coll_coll_kind coll, size_t count, size_t es);
coll_result coll_oneshot_run(struct coll_comm *comm, const coll_work *w);
/* Caches every rank's mailbox addresses (after the transports connected). */
coll_result coll_oneshot_setup(struct coll_comm *comm);

/* ---- windows: memory every rank maps (window.c) ----------------------------------- */

#define COLL_MAX_WINDOWS 64
typedef struct coll_window {
  uint8_t *base; /* this rank's memory (NULL: free slot) */
  size_t bytes;
  bool shared;    /* every rank mapped every other rank's memory */
  uint8_t **peer; /* [nranks]: rank p's memory in this address space */
  size_t *peer_bytes;
} coll_window;
/* Is [p, p+bytes) inside a shared window?  Then its slot and offset.  This and
 * coll_window_peer read the table: the caller holds comm->winmu. */
bool coll_window_find(struct coll_comm *comm, const void *p, size_t bytes, int32_t *slot,
                      uint64_t *off);
/* Rank p's window `slot` at `off` in this address space, NULL if [off, off+bytes) is
 * not inside it. */
uint8_t *coll_window_peer(struct coll_comm *comm, int32_t slot, int p, uint64_t off, size_t bytes);
void coll_windows_free(struct coll_comm *comm);

/* ---- collectives on windows, by loads and stores into peers' memory (mapped.c) ---- */

/* Runs `w` on the mapped path when every rank's buffers lie in shared windows (*ran);
 * otherwise leaves *ran false and the call to the other paths.  Only called when the
 * communicator has shared windows: the ranks exchange where their buffers are first. */
coll_result coll_mapped_run(struct coll_comm *comm, const coll_work *w, bool *ran);
#define COLL_MAX_RANKS_MAPPED 64 /* larger communicators take the other paths */
/* Where a rank's buffers of the running call are (exchanged at the start of the call). */
typedef struct {
  int32_t send_slot, recv_slot; /* -1: not in a shared window */
  uint64_t send_off, recv_off;
} coll_mapped_where;
bool coll_mapped_serves(coll_coll_kind c);

/* ---- direct (single-copy) large collectives on one host (direct.c) ---------------- */

#define COLL_DIRECT_PIECE (256u << 10) /* reduce-scatter reads this much per pass */
/* Can the direct path run `c` on this communicator (probed at creation)? */
bool coll_direct_serves(struct coll_comm *comm, coll_coll_kind c);
/* *ran false (and COLL_OK): an all-to-all that some rank called in place, which no rank
 * can read from while its owner overwrites it; every rank learns it from the same
 * exchange and takes the schedule instead. */
coll_result coll_direct_run(struct coll_comm *comm, const coll_work *w, bool *ran);
/* Collective, at creation: may ranks read each other's memory?  Sets comm->direct_ok
 * (the same on every rank) and, on rank 0, *beta_cma (s per byte read) and *alpha_cma
 * (s per read call). */
coll_result coll_direct_probe(struct coll_comm *comm, double *beta_cma, double *alpha_cma);

/* ---- tuning (tune.c) ------------------------------------------------------------------ */

/* Measures (or reads) the model's parameters and builds the choice table.  Collective:
 * every rank calls it once the executor runs. */
coll_result coll_tune_init(struct coll_comm *comm);
/* The row of the algorithm table for this call: COLL_ALGO if it can serve it, else the
 * tuner's table's.  The same on every rank for the same call. */
coll_algo coll_tune_choose(struct coll_comm *comm, const coll_work *w, size_t es);
/* The same choice as the row itself (algo.h; never NULL), which the executor runs and
 * hands on to coll_plan_build, so that neither looks it up again.  `declined` (bit
 * 1 << coll_algo each): rows every rank found cannot run this call (their run reported
 * *ran = false); the next choice is never one of them.  The table's choice with a plan
 * is never declined, so the executor's asking ends. */
struct coll_algo_entry;
const struct coll_algo_entry *coll_tune_row(struct coll_comm *comm, const coll_work *w, size_t es,
                                            uint32_t declined);

/* ---- tracing (trace.c) ------------------------------------------------------------ */

typedef struct coll_trace coll_trace;
/* Reads COLL_TRACE (text, or a .json path) and turns recording on. */
coll_result coll_trace_from_env(struct coll_comm *comm);
bool coll_trace_on(struct coll_comm *comm);
/* Per-step start / end times of the running call, filled by the executor. */
uint64_t *coll_trace_t0(struct coll_comm *comm);
uint64_t *coll_trace_t1(struct coll_comm *comm);
/* Called by the executor after a call that succeeded. */
void coll_trace_record(struct coll_comm *comm, const coll_work *w, coll_algo algo,
                       const coll_step *steps, size_t nsteps, size_t es, uint64_t t_start,
                       uint64_t t_end);
/* COLL_TRACE=FILE.json: gathers every rank's events to rank 0, which writes the file.
 * Collective: every rank calls it (from coll_comm_destroy). */
void coll_trace_flush_json(struct coll_comm *comm);
/* A sub-communicator's COLL_TRACE=FILE.json goes to FILE.<tag>.json (FILE from the
 * parent's path when the parent writes one), so no two communicators of a job write
 * one file.  Called by split.c once the child is built. */
void coll_trace_child_path(struct coll_comm *child, const struct coll_comm *parent,
                           const char *tag);
void coll_trace_free(struct coll_comm *comm);

/* ---- communicator lifetime (comm.c) ------------------------------------------------ */

/* How the ranks of a communicator being built find each other and exchange their
 * connection info: the TCP bootstrap of a new job (comm.c), or the parent communicator
 * of a split (split.c).  Build calls join once, then exactly COLL_BUILD_ROUNDS
 * allgathers when all goes well (fewer when it fails half-way: split.c makes up the
 * rest), then leave (on failure too). */
#define COLL_BUILD_ROUNDS 2
#define COLL_RV_MAX_BYTES 1536 /* the most one allgather of build carries per rank */
typedef struct coll_rendezvous {
  /* Meets the others; sets comm->boot_local (the address TCP and IB listen on). */
  coll_result (*join)(struct coll_rendezvous *rv, struct coll_comm *comm);
  /* Every rank of the new communicator contributes `len` bytes (the same len on all,
   * at most COLL_RV_MAX_BYTES); `all` receives nranks*len, rank i's at i*len. */
  coll_result (*allgather)(struct coll_rendezvous *rv, struct coll_comm *comm, const void *mine,
                           void *all, size_t len);
  void (*leave)(struct coll_rendezvous *rv);
  /* Optional: init failed on this rank (sentence in comm->errbuf); tell the others now
   * rather than let them find out by a timeout.  Called before leave. */
  void (*fail)(struct coll_rendezvous *rv, struct coll_comm *comm);
  void *ctx;
} coll_rendezvous;

/* Builds rank `rank` of `nranks` with this secret (shm names and TCP/IB hellos derive
 * from it), meeting the others through `rv`. */
coll_result coll_comm_build_rv(coll_comm_t *out, int nranks, int rank,
                               const uint8_t secret[COLL_SECRET_BYTES], coll_rendezvous *rv);
/* The same through the TCP bootstrap of `f` (coll_comm_init_rank, init_from_env). */
coll_result coll_comm_build(coll_comm_t *out, int nranks, const coll_id_fields *f, int rank);
/* Readies one direction to p for slices of up to `bytes`: connects p the first time when
 * its transport is lazy (tcp: makes conn_send[p]/conn_recv[p]), then lets the transport
 * make that much of the connection's slots resident (shm: warm).  The executor's thread
 * calls it before a plan uses p; when nothing grows it is one load (coll_comm_peer_ready). */
/* coll_comm_destroy and coll_comm_abort (api/comm_entry.c) once the caller's open group
 * has been dealt with: drain and free; abort (fail everything pending, wake every
 * waiter, wait for every thread to leave) and free. */
coll_result coll_comm_close(struct coll_comm *comm);
coll_result coll_comm_abort_close(struct coll_comm *comm);
enum { COLL_USE_SEND = 0, COLL_USE_RECV = 1 };
coll_result coll_comm_use_peer(struct coll_comm *comm, int p, int dir, size_t bytes);
static inline bool coll_comm_peer_ready(const struct coll_comm *comm, int p, int dir,
                                        size_t bytes) {
  return comm->peer_warm[2 * (size_t)p + (size_t)dir] >= (bytes ? bytes : 1);
}
void coll_comm_free(struct coll_comm *comm);
/* How comm ends, for the transports' close(): aborted (or init failed), failed (a call
 * failed: the sticky error), or clean.  Read at close time. */
coll_comm_end coll_comm_ending(struct coll_comm *comm);
/* Raises/lowers the count of API calls inside comm (abort waits for zero). */
static inline void coll_comm_enter(struct coll_comm *c) { atomic_fetch_add(&c->users, 1); }
static inline void coll_comm_leave(struct coll_comm *c) { atomic_fetch_sub(&c->users, 1); }

#endif
