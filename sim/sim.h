/* sim.h — the scale simulator's parts (sim/coll-sim.c is the tool that drives them).
 *
 * The same plans the executor runs (libcoll/algo/: every table row with a `plan`) are
 * built for every rank of a job this machine cannot start — N = 2..4096 ranks over
 * hosts × ranks per host — and run against a model of the executor:
 *
 *   sim_plans.c   all ranks' plans, kept compactly (a ring of 4096 ranks is 33 million
 *                 steps: identical steps, peers taken relative to the rank, are stored
 *                 once and each rank keeps 4-byte references to them);
 *   sim_engine.c  a discrete-event run of those plans exactly as executor.c walks them
 *                 (round j runs slice j - delay of every step, in step order, each rank
 *                 one sequential thread, FIFOs of `depth` slots per connection), priced
 *                 with the α-β-γ model below: it predicts the time of a call, and finds
 *                 deadlocks, unpaired messages and slices of the wrong length;
 *   sim_check.c   what the slices carry, symbolically: every element is a 64-bit hash
 *                 of the contributions in it, kept as affine runs, so that at N = 4096
 *                 the run can still say "every output element holds every rank's
 *                 contribution exactly once" (reductions) or "every block arrived where
 *                 it belongs" (gathers) in seconds, without N^2 elements of memory.
 *
 * Must never: call the network, the transports or a communicator; these files only
 * read plans (pure functions) and do arithmetic.
 */
#ifndef COLL_SIM_H
#define COLL_SIM_H

#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

#include "plan.h"

enum { SIM_SHM = 0, SIM_NET = 1 }; /* the two kinds of link */

/* The executor's CPU work, priced as its passes over memory (sim/sim_cpu.c has the
 * math); on = false leaves the plain α-β-γ model (β_shm per byte sent, γ per byte
 * reduced, beta_copy per byte kept). */
typedef struct {
  bool on;
  double copy[2], nt_copy[2], reduce[2]; /* s per byte of output: [0] in cache, [1] memory */
  double slot_in[2], slot_out[2];        /* a copy out of a slot the peer just wrote, into a slot
                                            the peer last read (sim-membw handover); 0: as copy */
  double cache_bytes;                    /* the host's last-level cache (C) */
  int cache_ways; /* its associativity A: lines fall on its sets at random, and a set
                     given more than A of them keeps A (sim_cpu_hit); 0: f =
                     min(1, C/W), a cache that keeps any C of the W bytes */
  /* Optional: the kernels' measured cost against W itself (sim-membw's table, W the
   * host's total), used instead of the two-point mixture for copy, nt copy and reduce. */
  int ncurve;
  double curve_ws[32], curve[3][32]; /* [0] copy, [1] nt copy, [2] reduce; s per byte */
  double op;                         /* s of CPU per slice operation, whatever its bytes */
  double call;                       /* s per call outside the slices (enqueue, plan, completion) */
  double switch_cost;                /* s of CPU per operation when the host's ranks outnumber its
                                        cores: the ranks hand the cores to each other (yield, futex);
                                        the fixed-cost stand-in for `sched` below (0 when it is on) */
  /* The scheduler of a host whose ranks outnumber its cores (sim_engine.c, "the
   * scheduler"): off, the cores are a pool any ready rank takes at once. */
  bool sched;
  bool bound;          /* sched: a host's rank i runs only on core i mod cores, as
                          coll_launch_local binds them (a queue per core); false: the
                          kernel places them (one queue per host, any core) */
  double yield_switch; /* s a sched_yield takes that hands the core to another rank */
  double yield_alone;  /* s a sched_yield takes with no other rank to run */
  double wake_idle;    /* s from a futex wake to the sleeper running on an idle core */
  double wake_cost;    /* s of the waker's CPU for a FUTEX_WAKE that wakes a sleeper */
  int spin_yields;     /* yields a waiting rank makes before it sleeps (fifo.c: 64) */
  double footprint;    /* s per byte a slot access costs more when the host's FIFOs
                          (depth x slot each) exceed the cache: times max(0, 1 - C/F) */
  double mem_alone;    /* what a byte from memory costs an operation whose core is the
                          only one of its host running one, against all `cores` running
                          (sim-membw 1 against 2 threads: 0.64); between, linear in the
                          cores running; 0 or 1: memory always at the all-cores price */
  double rfo;          /* s per byte more to write into a slot the receiver's core read
                          last and still holds (a read-for-ownership across cores;
                          sim-membw pingpong), times the share it still holds: */
  double l2_bytes;     /* a core's private cache: 1 - bytes it streamed since / this */
  double nt_bytes;     /* the executor's non-temporal threshold (COLL_NT_BYTES) */
  /* per call (sim_call_run fills them in): */
  double ws; /* the host's ranks' user buffers in the call (sim_call_run); the
                engine adds the slots of the host's FIFOs, from the plans, to
                make W, the bytes the host's ranks touch in the call */
  bool nt;   /* the call's final copies are non-temporal */
} sim_cpu;

/* The machine being simulated.  Rank r lives on host r / per_host. */
typedef struct {
  int nranks, per_host;
  int cores;        /* per host: at most this many ranks' CPU work at once (0: per_host) */
  double alpha[2];  /* s from a slice being posted to it being visible at the receiver */
  double beta[2];   /* s per byte a slice occupies its link: on shm the sender's CPU (it
                       copies into the peer's slot), on the network the sending host's NIC
                       out and the receiving host's NIC in, shared by all their flows */
  double gamma;     /* s per byte reduced (CPU) */
  double beta_copy; /* s per byte of a copy that is not a message: a COPY step, a
                       received slice kept in the user's buffer (CPU); 0 in the plain
                       α-β model */
  size_t slot;      /* bytes per FIFO slot (the executor's slice) */
  int depth;        /* slots per connection */
  sim_cpu cpu;      /* the CPU model (off: the plain α-β-γ costs above) */
  /* A token-bucket shaper on every NIC direction (tc tbf, as scripts/netns.sh caps its
   * links): `burst` bytes of tokens, refilled at the NIC's rate (1/beta[SIM_NET]) while
   * below it; bytes covered by tokens leave at beta_line s/byte (the unshaped link),
   * the rest at the rate.  0: no shaper, every byte at the rate (a real NIC). */
  double burst, beta_line;
  /* Calls run back to back (a benchmark's warm-up and timed loop): `calls` of them, the
   * NICs' queues and buckets carried from one to the next, the result the mean of the
   * last calls - warmup.  0 or 1: one call from idle. */
  int calls, warmup;
  /* A loop of `loop` calls as coll-bench times them (-n after a barrier): every rank
   * starts its next call as soon as it finished its last, without waiting for the
   * others; the result is the makespan over `loop`.  0 or 1: one call. */
  int loop;
  /* The timeline, as a Perfetto/Chrome trace (coll-sim --trace): NULL for none. */
  struct sim_trace *trace;
} sim_model;

/* Where a run writes its timeline: every rank a process (pid `pid` + rank, named
 * "`label`: rank r"), its operations on one track and, with the scheduler, its time on a
 * core on another, in the format of COLL_TRACE's JSON so the two open side by side.  The
 * caller writes the file's head and tail (sim_trace_open, sim_trace_close); each run
 * advances pid by its ranks. */
typedef struct sim_trace {
  FILE *f;
  int pid;
  bool any; /* an event is written: the next needs a comma */
  char label[96];
} sim_trace;
bool sim_trace_open(sim_trace *t, const char *path);
bool sim_trace_close(sim_trace *t);

/* One collective call, as coll_plan_args describes it (count in elements of es bytes). */
typedef struct {
  coll_coll_kind coll;
  coll_algo algo;
  size_t count, es;
  int root, in_place;
} sim_call;

/* A change made to a rank's plan after it is built (tests: a plan with a send dropped). */
typedef void (*sim_edit_fn)(int rank, coll_step *steps, size_t *nsteps, void *ctx);

/* ---- sim_plans.c ------------------------------------------------------------------ */

/* A step with its peers relative to the rank that runs it ((peer - rank) mod N, -1 for
 * none), so that the ring's 2N-1 steps of every rank are mostly the same few entries. */
typedef struct {
  uint64_t count, src_off, dst_off;
  uint32_t delay;
  int32_t din, dout, din2;
  uint8_t kind, final, src_buf, dst_buf;
} sim_step;

typedef struct {
  int nranks;
  sim_step *table; /* the distinct steps */
  size_t ntable, captable;
  uint32_t *refs;   /* every rank's steps, rank after rank, as indices into table */
  size_t *first;    /* rank r's steps are refs[first[r] .. first[r+1]) */
  uint64_t *rounds; /* rounds rank r's executor runs: max over steps of slices + delay */
  size_t *hash;     /* open addressing over table (index + 1; 0 empty) */
  size_t hashcap;
} sim_plans;

/* Builds every rank's plan for `call` with slices of `slice` elements.  why gets a
 * sentence on failure (a plan function refused, or a step out of what the compact form
 * holds). */
coll_result sim_plans_build(sim_plans *p, int nranks, const sim_call *call, size_t slice,
                            sim_edit_fn edit, void *edit_ctx, char *why, size_t why_len);
void sim_plans_free(sim_plans *p);
static inline const sim_step *sim_plans_step(const sim_plans *p, int r, size_t i) {
  return &p->table[p->refs[p->first[r] + i]];
}
static inline size_t sim_plans_nsteps(const sim_plans *p, int r) {
  return p->first[r + 1] - p->first[r];
}
/* The absolute peer of a relative one. */
static inline int sim_peer(int r, int32_t d, int n) { return d < 0 ? -1 : (int)((r + d) % n); }

/* ---- sim_check.c ------------------------------------------------------------------ */

typedef struct sim_checker sim_checker;
/* What one slice carries (owned by the checker). */
typedef struct sim_payload sim_payload;

sim_checker *sim_check_new(int nranks, const sim_call *call);
void sim_check_free(sim_checker *ck);
/* Runs slice [off, off+m) of step s on rank r: reads in[0..1] (NULL where unused),
 * writes the rank's buffers, and returns what goes out (*out; NULL when nothing is
 * sent).  False with a sentence in why when the step breaks an invariant. */
bool sim_check_op(sim_checker *ck, int r, const sim_step *s, uint64_t off, uint64_t m,
                  const sim_payload *in[2], sim_payload **out, char *why, size_t why_len);
void sim_payload_free(sim_payload *pl);
/* After the run: every rank's output holds what the collective promises. */
bool sim_check_final(sim_checker *ck, char *why, size_t why_len);

/* ---- sim_cpu.c -------------------------------------------------------------------- */

/* The hit ratio p of a cache of L bytes with random replacement swept again and again
 * over r·L bytes, in steady state: the root of p = exp(-r(1 - p)) below 1 (1 for r <= 1). */
double sim_cache_hit(double r);
/* f, the share of a call's accesses that hit the host's last-level cache when its ranks
 * touch ws bytes (sim_cpu.c: the sets' occupancy with cache_ways, min(1, C/W) without). */
double sim_cpu_hit(const sim_cpu *c, double ws);
/* cost = f·x[0] + (1-f)·x[1]·mem, f = hit (sim_cpu_hit): s per byte of a pass, mem the
 * memory price's share factor (1: every core streaming). */
double sim_cpu_per_byte(const double x[2], double hit, double mem);
/* CPU seconds of one slice operation of kind k moving b bytes (its passes + op), on a
 * host whose ranks touch ws bytes in the call (hit: sim_cpu_hit of it), `running` of its
 * cores (this one included) running an operation as it starts. */
double sim_cpu_work(const sim_cpu *c, coll_step_kind k, double b, double ws, double hit,
                    int running, int cores);
/* Bytes of FIFO slots the operation reads and writes. */
double sim_cpu_slot_bytes(coll_step_kind k, double b);
/* The user buffers a host's ranks touch in a call on model m (W less the FIFOs' slots,
 * which the engine counts from the plans), and the executor's nt rule for it. */
double sim_cpu_buffers(const sim_model *m, const sim_call *call);
bool sim_cpu_nt(const sim_call *call, int nranks, double nt_bytes);

/* ---- sim_engine.c ----------------------------------------------------------------- */

typedef struct {
  double seconds;    /* when the last rank finished */
  uint64_t ops;      /* slice operations run */
  uint64_t messages; /* slices sent */
  double net_bytes;  /* bytes that crossed hosts */
  double shm_bytes;
  double busiest_nic; /* s the busiest NIC direction was busy */
} sim_result;

/* Runs the plans on the model.  With ck, every slice's contents go through the checker
 * too (the times do not change).  COLL_ERR_MISMATCH with a sentence for a deadlock, an
 * unreceived message or a slice of the wrong length; the checker's own findings too. */
coll_result sim_run(const sim_plans *p, const sim_model *m, size_t es, sim_checker *ck,
                    sim_result *res, char *why, size_t why_len);

/* Convenience: plans + run (+ checks when `check`), for one call on one model. */
coll_result sim_call_run(const sim_model *m, const sim_call *call, bool check, sim_edit_fn edit,
                         void *edit_ctx, sim_result *res, char *why, size_t why_len);

/* The count and slice (elements) --validate and test_sim use for collective c by algorithm
 * a on n ranks: uneven chunks (counts not divisible by n) and, up to 64 ranks, steps of
 * several slices; above that one slice per ring chunk or block, which keeps a 4096-rank
 * check to seconds (a rank's rounds then write its output in order, so its runs join). */
void sim_validation_case(coll_coll_kind c, coll_algo a, int n, size_t *count, size_t *slice);

/* nccl-tests' size of a call (bytes) from its count, and its count from a size. */
double sim_call_bytes(const sim_call *c, int nranks);
size_t sim_count_for(coll_coll_kind c, double bytes, size_t es, int nranks);
/* busbw factor of nccl-tests (bench_bus_factor's, by collective kind). */
double sim_bus_factor(coll_coll_kind c, int nranks);

#endif
