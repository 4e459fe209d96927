/* sim_engine.c — a discrete-event run of every rank's plan, the way executor.c runs it.
 *
 * What is modelled, and why it is the executor:
 *   - Each rank is one sequential thread walking its plan round by round: round j runs
 *     slice j - delay of every step, in step order (executor.c's double loop).  An
 *     operation needs, at once, a slice in every FIFO it reads and a free slot in the
 *     FIFO it writes; until then the rank waits, doing nothing else (the real executor
 *     blocks in get_recv / get_send).  The slot it read stays taken until the operation
 *     ends (recv_release comes last).
 *   - Each directed pair of ranks is a FIFO of `depth` slots.  A slice posted at time t
 *     is visible to the receiver at t + α (+ its time on the link, below).
 *   - Costs, per slice of b bytes (the α-β-γ model of the tuner, coll_cost_model, with
 *     two kinds of link):
 *       shm   (same host)   the sender's CPU copies the slice into the peer's slot:
 *                           b·β_shm of CPU, then visible α_shm later;
 *       net   (other host)  the slice goes through the sending host's NIC out and the
 *                           receiving host's NIC in, b·β_net each, in the order slices
 *                           reach them (a FIFO server per NIC direction: the flows of all
 *                           the host's ranks share its bandwidth), then α_net;
 *       CPU                 b·γ per reduction (RECV2 reduces twice), b·β_copy per copy
 *                           that is not a message (COPY steps; a received slice kept in
 *                           the user's buffer), on one of the host's `cores`.
 *     With γ = β_copy = 0 and one kind of link, a ring all-reduce whose chunks fit one
 *     slot takes exactly 2(N-1)·(α + n/N·β), the closed form in ring.c; with chunks of
 *     k slices, 2(N-1)·(k·α + n/N·β): every round is a full wave of 2(N-1) hops, since a
 *     rank starts round j+1 only after its last step of round j (test_sim checks both).
 *   - Events: each rank has at most one pending event (its operation ends, or the slice
 *     it waits for arrives); a rank blocked on an empty FIFO or a full one is woken by
 *     the post or the release that unblocks it.  Ties are broken by order of scheduling,
 *     so a run is deterministic.  No pending event and a rank not done is a deadlock;
 *     a message left in a FIFO at the end was never received.
 *
 * With the CPU model on (m->cpu, sim_cpu.c) the CPU costs above are replaced by the
 * passes over memory run_slice really makes, priced by whether the call's working set
 * fits the cache, plus a fixed cost per operation and per call, and per operation a
 * core hand-over when ranks outnumber cores.  And the FIFOs' footprint: when the FIFOs
 * between a host's ranks cycle through more slot bytes F (depth slots of what each
 * FIFO's largest slice fills) than its cache C, every slot byte an operation reads or
 * writes costs cpu.footprint·(1 - C/F) more — the 8-rank tree ran 1.4-1.6x faster with
 * 2 slots per FIFO than with 8, and no faster with 8 slots of which a sender may fill 2
 * ahead, so it is the bytes cycled through, not how long a slice waits
 * (docs/bandwidth-math.md, section 8).  Two more terms per operation: the memory price
 * by how many of the host's cores are running one (they share its bandwidth), and the
 * read-for-ownership of a slot the receiver's core still holds (rfo_cost).
 *
 * A NIC direction may sit behind a token bucket (m->burst: tc tbf, how scripts/netns.sh
 * caps a link): bytes its tokens cover leave at line speed, the rest at the rate, and it
 * refills at the rate while below `burst` (nic_time).  Calls can run back to back
 * (m->calls, m->warmup: a benchmark's loop), the NICs' queues and buckets carried from
 * one call to the next, every rank starting the next call when the last one ended.
 *
 * When a host's ranks outnumber its cores and m->cpu.sched is on, the cores are not a
 * pool: ranks queue for them, yield, sleep and are woken as fifo.c and the kernel do it
 * ("the scheduler" below); off, a ready rank takes the earliest free core at once and
 * pays a fixed hand-over per operation.
 *
 * What it leaves out: the kernel preempting a rank mid-operation, cache lost when a core
 * changes hands, the proxy threads of tcp, and fair sharing (a NIC serves slices in
 * arrival order; for the whole of a collective the total is the same).
 *
 * Must never: depend on wall-clock time or on anything but its arguments (the same call
 * gives the same prediction), or change the plans it runs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

typedef struct {
  double t;   /* when the slice is visible to the receiver */
  uint64_t n; /* elements */
  sim_payload *pl;
  bool read;   /* the receiver has read this slot (CPU model: its core's cache */
  double mark; /* may still hold it): that core's bytes touched then */
} slot;

typedef struct {
  int src, dst;
  uint64_t tail, head, released; /* posted, taken by the receiver, slots given back */
  slot *q;                       /* depth slots, allocated at the first post */
  double used;                   /* bytes of a slot its largest slice fills */
  int wait_recv, wait_send;      /* a rank blocked on this FIFO (empty / full), or -1 */
} conn;

/* Where a rank is, for the scheduler (sched mode only). */
enum { ON_CORE = 0, QUEUED, ASLEEP, WAKING };

typedef struct {
  uint64_t round, idx; /* the executor's position: round j, step i */
  int call;            /* loop: the calls this rank has finished */
  bool done, busy;
  double busy_until;
  uint32_t held[2];        /* FIFOs whose slots the running operation holds (conn index + 1) */
  uint8_t where;           /* sched: ON_CORE, QUEUED, ASLEEP, or WAKING (a wake event due) */
  int yields;              /* sched: yields since it last ran an operation */
  double call_t0, core_t0; /* trace: when its call began, when it last took a core */
} rank_state;

typedef struct {
  double t;
  uint64_t seq;
  int r;
} event;

typedef struct {
  const sim_plans *p;
  const sim_model *m;
  size_t es;
  sim_checker *ck;
  int n, depth;
  rank_state *rs;
  conn *conns;
  size_t nconns;
  uint64_t *ckeys; /* open addressing: (src*n + dst) + 1 -> conn index in cval */
  uint32_t *cval;
  size_t ccap;
  event *heap;
  size_t nheap;
  uint64_t seq;
  double *core_free; /* per host, `cores` entries */
  double *fp;        /* per host: max(0, 1 - C/F), F its FIFOs' slot bytes */
  double *ws;        /* per host: W, its ranks' buffers and its FIFOs' slots */
  double *hit;       /* per host: the share of its accesses the last-level cache holds */
  int *running;      /* per host: its ranks running an operation now */
  double *touched;   /* per private cache (a core's, bound or a core per rank; else a
                        rank's): the bytes its operations have streamed so far, */
  double *wcore;     /* and its working set: its ranks' buffers, their FIFOs' slots; */
  double *miss;      /* and what share of what it streams misses its cache (rfo_cost) */
  double *nic_tx, *nic_rx, *nic_busy;
  double *tok;   /* per host: tokens of the tx [2h] and rx [2h+1] shapers, */
  double *tok_t; /* as of this time */
  int cores, hosts;
  bool oversub; /* a host's ranks outnumber its cores */
  bool sched;   /* ... and the scheduler is modelled (m->cpu.sched) */
  /* sched: a run queue per host (unbound) or per core (bound): a ring of per_host ranks
   * waiting for one of its cores, the ring's front and length, and its idle cores */
  int *rq, *rq_head, *rq_len, *idle;
  int nq, qcores; /* queues, and cores per queue */
  sim_result res;
  char *why;
  size_t why_len;
} engine;

/* ---- connections ------------------------------------------------------------------- */

static size_t ckey_slot(const engine *e, uint64_t key) {
  uint64_t h = key * 0x9e3779b97f4a7c15ull;
  size_t k = (size_t)(h >> 17) & (e->ccap - 1);
  while (e->ckeys[k] && e->ckeys[k] != key) k = (k + 1) & (e->ccap - 1);
  return k;
}

static bool add_conn(engine *e, int src, int dst) {
  uint64_t key = (uint64_t)src * (uint64_t)e->n + (uint64_t)dst + 1;
  if (2 * (e->nconns + 1) > e->ccap) {
    size_t cap = e->ccap ? 2 * e->ccap : 4096;
    uint64_t *ok = e->ckeys;
    uint32_t *ov = e->cval;
    size_t ocap = e->ccap;
    e->ckeys = calloc(cap, sizeof *e->ckeys);
    e->cval = calloc(cap, sizeof *e->cval);
    if (!e->ckeys || !e->cval) return false;
    e->ccap = cap;
    for (size_t i = 0; i < ocap; i++)
      if (ok[i]) {
        size_t k = ckey_slot(e, ok[i]);
        e->ckeys[k] = ok[i], e->cval[k] = ov[i];
      }
    free(ok);
    free(ov);
  }
  size_t k = ckey_slot(e, key);
  if (e->ckeys[k]) return true;
  if ((e->nconns & (e->nconns + 1)) == 0 || e->nconns == 0) {
    /* grow the array at powers of two */
    size_t cap = e->nconns ? 2 * (e->nconns + 1) : 1024;
    conn *c = realloc(e->conns, cap * sizeof *c);
    if (!c) return false;
    e->conns = c;
  }
  e->conns[e->nconns] = (conn){.src = src, .dst = dst, .wait_recv = -1, .wait_send = -1};
  e->ckeys[k] = key;
  e->cval[k] = (uint32_t)e->nconns++;
  return true;
}

static conn *get_conn(engine *e, int src, int dst) {
  uint64_t key = (uint64_t)src * (uint64_t)e->n + (uint64_t)dst + 1;
  size_t k = ckey_slot(e, key);
  return e->ckeys[k] ? &e->conns[e->cval[k]] : NULL;
}

/* ---- the event heap ---------------------------------------------------------------- */

static bool before(const event *a, const event *b) {
  return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static void schedule(engine *e, int r, double t) {
  event ev = {.t = t, .seq = e->seq++, .r = r};
  size_t i = e->nheap++;
  while (i > 0) {
    size_t up = (i - 1) / 2;
    if (!before(&ev, &e->heap[up])) break;
    e->heap[i] = e->heap[up];
    i = up;
  }
  e->heap[i] = ev;
}

static event pop(engine *e) {
  event top = e->heap[0], last = e->heap[--e->nheap];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= e->nheap) break;
    if (c + 1 < e->nheap && before(&e->heap[c + 1], &e->heap[c])) c++;
    if (!before(&e->heap[c], &last)) break;
    e->heap[i] = e->heap[c];
    i = c;
  }
  if (e->nheap) e->heap[i] = last;
  return top;
}

/* ---- the model's costs -------------------------------------------------------------- */

static int host_of(const engine *e, int r) { return r / e->m->per_host; }

/* ---- the timeline (m->trace) ---------------------------------------------------------
 * Track 0 of a rank: its calls; 1: its operations; 2 (scheduler only): its time on a
 * core, from taking one to yielding it, sleeping or finishing.  Nothing without a trace. */
static void trace_span(engine *e, int r, int tid, double t0, double t1, const char *name,
                       const char *cat, const char *args) {
  sim_trace *t = e->m->trace;
  if (!t || t1 < t0) return;
  fprintf(t->f,
          "%s{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
          "\"name\":\"%s\",\"cat\":\"%s\"%s%s%s}",
          t->any ? ",\n" : "", t->pid + r, tid, t0 * 1e6, (t1 - t0) * 1e6, name, cat,
          args ? ",\"args\":{" : "", args ? args : "", args ? "}" : "");
  t->any = true;
}

static void trace_names(engine *e) {
  sim_trace *t = e->m->trace;
  static const char *tracks[] = {"calls", "operations", "on a core"};
  for (int r = 0; r < e->n; r++) {
    fprintf(t->f,
            "%s{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_name\",\"args\":"
            "{\"name\":\"%s: rank %d\"}}",
            t->any ? ",\n" : "", t->pid + r, t->label, r);
    t->any = true;
    for (int k = 0; k < (e->sched ? 3 : 2); k++)
      fprintf(t->f,
              ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\","
              "\"args\":{\"name\":\"%s\"}}",
              t->pid + r, k, tracks[k]);
  }
}

/* Rank r leaves its core at t (scheduler): its span on the core track. */
static void trace_core_end(engine *e, int r, double t) {
  trace_span(e, r, 2, e->rs[r].core_t0, t, "on core", "sched", NULL);
}

/* Takes the host's earliest free core for `work` seconds from `ready`; returns the end. */
static double on_core(engine *e, int r, double ready, double work) {
  if (work <= 0) return ready;
  double *c = &e->core_free[(size_t)host_of(e, r) * (size_t)e->cores];
  int best = 0;
  for (int i = 1; i < e->cores; i++)
    if (c[i] < c[best]) best = i;
  double start = c[best] > ready ? c[best] : ready;
  c[best] = start + work;
  return start + work;
}

/* Whose private cache rank r's operations fill: its core's when ranks are bound or have
 * a core each (coll_launch_local binds rank i to core i mod C), else its own (the kernel
 * moves it; its own bytes are the best guess of what displaced its lines). */
static size_t cache_of(const engine *e, int r) {
  int local = r % e->m->per_host;
  if (!e->oversub || e->m->cpu.bound)
    return (size_t)host_of(e, r) * (size_t)e->cores + (size_t)(local % e->cores);
  return (size_t)e->hosts * (size_t)e->cores + (size_t)r;
}

/* The extra cost of rank src writing b bytes into slot sl of its FIFO to rank dst.  The
 * receiver's core read the slot last; when that is another core than the writer's, what
 * of those lines its private cache still holds the writer must first take from it (a
 * read-for-ownership across cores: cpu.rfo per byte more).
 * When that core's working set W fits its cache L2, nothing evicts them: all of them;
 * else exp(-m·X/L2) of them, X the bytes its operations streamed since it read the slot
 * and m the share of them that missed (only a miss inserts a line; m = 1 -
 * sim_cache_hit(W/L2), the steady state of sweeping W): a line survives m·X/64
 * insertions into L2/64 lines each evicting one at random with probability
 * (1 - 64/L2)^(m·X/64).  (An exact LRU keeps 1 - X/L2, none once X >= L2;
 * with it the 2-rank ring at 256 KiB, whose core cycles through 1.5 MiB, was predicted
 * 20-41 % too fast in every set.  This host's L2 is a pseudo-LRU; which of the two it is
 * nearer was not measured, only that this rule agrees better: docs/bandwidth-math.md 8.) */
static double rfo_cost(const engine *e, const slot *sl, int src, int dst, double b) {
  const sim_cpu *c = &e->m->cpu;
  size_t k = cache_of(e, dst);
  if (c->rfo <= 0 || c->l2_bytes <= 0 || !sl->read || k == cache_of(e, src)) return 0;
  double left = exp(-(e->touched[k] - sl->mark) * e->miss[k] / c->l2_bytes);
  return c->rfo * b * left;
}

/* ---- the scheduler (sched mode) -----------------------------------------------------
 *
 * When a host's ranks outnumber its cores, a rank whose next operation can run does not
 * run at once: it needs a core, and the cores are held by other ranks, each either
 * running an operation or waiting for one in fifo.c's loop — sched_yield up to 64 times
 * (no spinning when oversubscribed), then sleep on a futex until the peer's post or
 * release wakes it.  Modelled as the kernel runs it:
 *   - per host, `cores` cores and a queue of ranks ready to take one;
 *   - a rank on a core runs operations back to back while it can; when it cannot, it
 *     yields: with a rank queued, that rank gets the core after yield_switch and the
 *     yielder goes to the back of the queue; with none, it keeps the core and looks again
 *     after yield_alone;
 *   - after spin_yields fruitless yields it sleeps (leaves the queue and the core); a
 *     core handed over by a sleep or by a rank that finished costs yield_switch too;
 *   - the post or release it waits for wakes it: onto an idle core after wake_idle (a
 *     halted core comes back: ~22 us on this VM), else at the front of the queue (the
 *     kernel places a woken sleeper ahead of tasks that have been running); the waker
 *     spends wake_cost of its core on the FUTEX_WAKE;
 *   - an operation is not preempted (they last microseconds, a time slice milliseconds);
 *   - bound (m->cpu.bound, coll_launch_local's default): a host's rank i runs only on
 *     core i mod cores, so each core has its own queue and a rank queued on a busy core
 *     waits even while another core idles; unbound, a host has one queue and a ready rank
 *     takes any free core.
 * Every figure is measured (sim/sim_sched.c), none fitted (docs/bandwidth-math.md,
 * section 8). */

/* The run queue rank r waits in: its host's, or when bound its core's. */
static int queue_of(const engine *e, int r) {
  return e->m->cpu.bound ? (int)cache_of(e, r) : host_of(e, r);
}

static void rq_push(engine *e, int r, bool front) {
  int h = queue_of(e, r), ph = e->m->per_host;
  int i = front ? (e->rq_head[h] = (e->rq_head[h] + ph - 1) % ph)
                : (e->rq_head[h] + e->rq_len[h]) % ph;
  e->rq[(size_t)h * (size_t)ph + (size_t)i] = r;
  e->rq_len[h]++;
  e->rs[r].where = QUEUED;
}
static int rq_pop(engine *e, int h) {
  int r = e->rq[(size_t)h * (size_t)e->m->per_host + (size_t)e->rq_head[h]];
  e->rq_head[h] = (e->rq_head[h] + 1) % e->m->per_host;
  e->rq_len[h]--;
  return r;
}

/* A core of queue h is free at t: the queue's front rank takes it, or it idles. */
static void core_free_at(engine *e, int h, double t) {
  if (e->rq_len[h] == 0) {
    e->idle[h]++;
    return;
  }
  int q = rq_pop(e, h);
  e->rs[q].where = ON_CORE;
  e->rs[q].core_t0 = t;
  schedule(e, q, t);
}

/* Rank r, on a core at `now`, cannot run its next operation: it yields, or sleeps. */
static void sched_wait(engine *e, int r, double now) {
  rank_state *s = &e->rs[r];
  int h = queue_of(e, r);
  const sim_cpu *c = &e->m->cpu;
  if (s->yields >= c->spin_yields) { /* futex sleep: a post or release wakes it */
    s->where = ASLEEP;
    trace_core_end(e, r, now);
    core_free_at(e, h, now + c->yield_switch); /* the sleep hands the core over too */
    return;
  }
  s->yields++;
  if (e->rq_len[h] == 0) { /* nobody to hand the core to: look again after the yield */
    schedule(e, r, now + c->yield_alone);
    return;
  }
  trace_core_end(e, r, now);
  core_free_at(e, h, now + c->yield_switch); /* the queue's front takes it */
  rq_push(e, r, false);
}

/* The futex wake reaches sleeping rank r at t (its wake event): it runs. */
static void sched_woken(engine *e, int r, double t) {
  rank_state *s = &e->rs[r];
  int h = queue_of(e, r);
  if (e->idle[h] > 0) {
    e->idle[h]--;
    s->where = ON_CORE;
    s->core_t0 = t + e->m->cpu.wake_idle;
    schedule(e, r, t + e->m->cpu.wake_idle);
  } else {
    rq_push(e, r, true);
  }
}

/* The rank blocked on a FIFO is told that what it waits for is there at t: an event at
 * t; with the scheduler, a rank on a core or queued sees it when it next looks, and a
 * sleeping one gets a wake event at t (an event of rank -1 - r).  Returns what the wake
 * costs the rank that does it: the FUTEX_WAKE of a sleeper (fifo.c wakes only those). */
static double notify(engine *e, int r, double t) {
  if (!e->sched) {
    schedule(e, r, t);
    return 0;
  }
  rank_state *s = &e->rs[r];
  if (s->where != ASLEEP || s->done) return 0;
  s->where = WAKING;
  schedule(e, -1 - r, t);
  return e->m->cpu.wake_cost;
}

/* How long b bytes take through NIC direction k starting at t: all of them at the rate
 * without a shaper; with one, the bucket first fills at the rate up to `burst` since its
 * last use, the bytes its tokens cover leave at line speed and the rest at the rate
 * (tokens then stay at zero: what arrives is spent at once). */
static double nic_time(engine *e, int k, double t, double b) {
  const sim_model *m = e->m;
  double rate_s = m->beta[SIM_NET];
  if (m->burst <= 0) return b * rate_s;
  double tok = e->tok[k] + (t - e->tok_t[k]) / rate_s;
  if (tok > m->burst) tok = m->burst;
  double d;
  if (tok >= b) {
    d = b * m->beta_line;
    tok -= b;
  } else {
    d = tok * m->beta_line + (b - tok) * rate_s;
    tok = 0;
  }
  e->tok[k] = tok;
  e->tok_t[k] = t + d;
  return d;
}

/* When a slice of b bytes posted at t by `src` (after its CPU part) is visible at dst. */
static double deliver(engine *e, int src, int dst, double t, double b) {
  int hs = host_of(e, src), hd = host_of(e, dst);
  if (hs == hd) {
    e->res.shm_bytes += b;
    return t + e->m->alpha[SIM_SHM];
  }
  double tx0 = e->nic_tx[hs] > t ? e->nic_tx[hs] : t;
  double w = nic_time(e, 2 * hs, tx0, b), tx1 = tx0 + w;
  e->nic_tx[hs] = tx1;
  /* The receiving NIC takes the bytes as they come; it finishes no earlier than the
   * sender's NIC and no earlier than its own earlier slices plus this one. */
  double rx0 = e->nic_rx[hd] > tx0 ? e->nic_rx[hd] : tx0;
  double wr = nic_time(e, 2 * hd + 1, rx0, b);
  double rx1 = rx0 + wr > tx1 ? rx0 + wr : tx1;
  e->nic_rx[hd] = rx1;
  e->nic_busy[2 * hs] += w;
  e->nic_busy[2 * hd + 1] += wr;
  e->res.net_bytes += b;
  return rx1 + e->m->alpha[SIM_NET];
}

static bool reduces(coll_step_kind k) {
  return k == COLL_STEP_RECV_REDUCE_SEND || k == COLL_STEP_RECV_REDUCE_COPY ||
         k == COLL_STEP_RECV_REDUCE_COPY_SEND || k == COLL_STEP_RECV2_REDUCE_SEND;
}
/* Copies into the user's buffer that are not the message itself. */
static int keeps(coll_step_kind k) {
  return k == COLL_STEP_COPY || k == COLL_STEP_RECV_COPY_SEND || k == COLL_STEP_RECV;
}

/* ---- running ------------------------------------------------------------------------ */

/* Gives back the slots rank r's operation read; returns the CPU its wakes cost it. */
static double release(engine *e, int r, double now) {
  double cost = 0;
  rank_state *s = &e->rs[r];
  for (int i = 0; i < 2; i++) {
    if (!s->held[i]) continue;
    conn *c = &e->conns[s->held[i] - 1];
    c->released++;
    s->held[i] = 0;
    if (c->wait_send >= 0) {
      cost += notify(e, c->wait_send, now);
      c->wait_send = -1;
    }
  }
  return cost;
}

static coll_result fail(engine *e, const char *msg) {
  snprintf(e->why, e->why_len, "%s", msg);
  return COLL_ERR_MISMATCH;
}

/* Rank r at time now: finish its operation if one ended, then run what it can. */
static coll_result step_rank(engine *e, int r, double now) {
  rank_state *s = &e->rs[r];
  const sim_plans *p = e->p;
  int n = e->n;
  size_t ns = sim_plans_nsteps(p, r);
  uint64_t slice = e->m->slot / e->es;
  if (s->busy) {
    if (now < s->busy_until) return COLL_OK; /* a stale wake-up; its own event comes */
    s->busy = false;
    e->running[host_of(e, r)]--;
    now += release(e, r, now); /* a wake it does keeps it on its core a little longer */
  }
  while (!s->done) {
    if (s->round >= p->rounds[r]) {
      if (s->call + 1 < e->m->loop) { /* the benchmark's loop: its next call at once */
        trace_span(e, r, 0, s->call_t0, now, "call", "call", NULL);
        s->call++;
        s->round = s->idx = 0;
        now += e->m->cpu.on ? e->m->cpu.call : 0;
        s->call_t0 = now;
        continue;
      }
      s->done = true;
      if (now > e->res.seconds) e->res.seconds = now;
      trace_span(e, r, 0, s->call_t0, now, "call", "call", NULL);
      if (e->sched) { /* its thread sleeps till the next call: the core goes to another */
        trace_core_end(e, r, now);
        core_free_at(e, queue_of(e, r), now + e->m->cpu.yield_switch);
      }
      return COLL_OK;
    }
    const sim_step *st = sim_plans_step(p, r, s->idx);
    bool active = s->round >= st->delay && (s->round - st->delay) * slice < st->count;
    if (!active) {
      if (++s->idx == ns) s->idx = 0, s->round++;
      continue;
    }
    uint64_t off = (s->round - st->delay) * slice;
    uint64_t m = st->count - off < slice ? st->count - off : slice;
    int pin = sim_peer(r, st->din, n), pout = sim_peer(r, st->dout, n);
    int pin2 = st->kind == COLL_STEP_RECV2_REDUCE_SEND ? sim_peer(r, st->din2, n) : -1;
    conn *in[2] = {pin >= 0 ? get_conn(e, pin, r) : NULL, pin2 >= 0 ? get_conn(e, pin2, r) : NULL};
    conn *out = pout >= 0 ? get_conn(e, r, pout) : NULL;
    for (int q = 0; q < 2; q++) {
      conn *c = in[q];
      if (!c) continue;
      if (c->head == c->tail) { /* nothing posted yet: the post wakes us */
        c->wait_recv = r;
        if (e->sched) sched_wait(e, r, now);
        return COLL_OK;
      }
      slot *sl = &c->q[c->head % (uint64_t)e->depth];
      if (sl->t > now) {
        schedule(e, r, sl->t);
        return COLL_OK;
      }
      if (sl->n != m) {
        char msg[320];
        snprintf(msg, sizeof msg,
                 "rank %d step %llu (%s) round %llu expected a slice of %llu "
                 "elements from rank %d but the next one on that FIFO has %llu: sends and "
                 "receives do not pair up",
                 r, (unsigned long long)s->idx, coll_step_name((coll_step_kind)st->kind),
                 (unsigned long long)s->round, (unsigned long long)m, c->src,
                 (unsigned long long)sl->n);
        return fail(e, msg);
      }
    }
    if (out && out->tail - out->released >= (uint64_t)e->depth) { /* full: a release wakes us */
      out->wait_send = r;
      if (e->sched) sched_wait(e, r, now);
      return COLL_OK;
    }
    /* Run it. */
    const sim_payload *got[2] = {NULL, NULL};
    for (int q = 0; q < 2; q++)
      if (in[q]) got[q] = in[q]->q[in[q]->head % (uint64_t)e->depth].pl;
    sim_payload *sent = NULL;
    if (e->ck && !sim_check_op(e->ck, r, st, off, m, got, &sent, e->why, e->why_len))
      return COLL_ERR_MISMATCH;
    double b = (double)m * (double)e->es;
    coll_step_kind k = (coll_step_kind)st->kind;
    double work;
    if (e->m->cpu.on) {
      /* The CPU model (sim_cpu.c): the slice's passes over memory and its fixed cost,
       * whatever link it goes out on (the executor copies into a tcp slot too); the
       * network's β is the NIC's, in deliver().  When the host's ranks outnumber its
       * cores and the scheduler is off, each operation also pays a fixed hand-over. */
      int h = host_of(e, r);
      work = sim_cpu_work(&e->m->cpu, k, b, e->ws[h], e->hit[h], e->running[h] + 1, e->cores) +
             (e->oversub && !e->sched ? e->m->cpu.switch_cost : 0) +
             e->m->cpu.footprint * e->fp[h] * sim_cpu_slot_bytes(k, b) +
             (out && out->q && host_of(e, pout) == h
                  ? rfo_cost(e, &out->q[out->tail % (uint64_t)e->depth], r, pout, b)
                  : 0);
      /* what the operation streams through its core's cache: the slice in the user's
       * buffer and every slot it reads or writes */
      e->touched[cache_of(e, r)] += b + sim_cpu_slot_bytes(k, b);
    } else {
      work = (reduces(k) ? (k == COLL_STEP_RECV2_REDUCE_SEND ? 2 : 1) * b * e->m->gamma : 0) +
             (keeps(k) ? b * e->m->beta_copy : 0);
      bool shm_out = out && host_of(e, r) == host_of(e, pout);
      if (shm_out) work += b * e->m->beta[SIM_SHM];
    }
    double end = e->sched ? now + work : on_core(e, r, now, work); /* sched: r holds a core */
    s->yields = 0;
    for (int q = 0; q < 2; q++) {
      if (!in[q]) continue;
      slot *sl = &in[q]->q[in[q]->head % (uint64_t)e->depth];
      if (e->ck) sim_payload_free(sl->pl);
      sl->pl = NULL;
      sl->read = true;
      sl->mark = e->touched[cache_of(e, r)];
      in[q]->head++;
      s->held[q] = (uint32_t)(in[q] - e->conns) + 1;
    }
    if (out) {
      if (!out->q && !(out->q = calloc((size_t)e->depth, sizeof *out->q))) {
        sim_payload_free(sent);
        snprintf(e->why, e->why_len, "out of memory for the FIFO of rank %d to %d", r, pout);
        return COLL_ERR_SYSTEM;
      }
      slot *sl = &out->q[out->tail % (uint64_t)e->depth];
      sl->t = deliver(e, r, pout, end, b);
      sl->n = m;
      sl->pl = sent;
      out->tail++;
      e->res.messages++;
      if (out->wait_recv >= 0) {
        end += notify(e, out->wait_recv, sl->t > now ? sl->t : now); /* after the post */
        out->wait_recv = -1;
      }
    } else if (sent) {
      sim_payload_free(sent);
    }
    e->res.ops++;
    if (e->m->trace) {
      char args[160];
      snprintf(args, sizeof args,
               "\"step\":%llu,\"slice\":%llu,\"bytes\":%.0f,"
               "\"peer_in\":%d,\"peer_out\":%d",
               (unsigned long long)s->idx, (unsigned long long)(s->round - st->delay), b, pin,
               pout);
      trace_span(e, r, 1, now, end, coll_step_name(k), "step", args);
    }
    if (++s->idx == ns) s->idx = 0, s->round++;
    if (end > now) {
      s->busy = true;
      s->busy_until = end;
      e->running[host_of(e, r)]++;
      schedule(e, r, end);
      return COLL_OK;
    }
    now += release(e, r, now);
  }
  return COLL_OK;
}

/* One call: every rank starts at `start`; runs until no event is left, then says what
 * went wrong if a rank could not finish or a message was never received.  The makespan
 * goes into e->res.seconds. */
static coll_result run_call(engine *e, double start) {
  const sim_plans *p = e->p;
  coll_result rc = COLL_OK;
  for (int r = 0; r < e->n; r++) e->rs[r].call_t0 = e->rs[r].core_t0 = start;
  if (e->sched) { /* each queue's first ranks start on its cores, the rest queue */
    for (int h = 0; h < e->nq; h++) e->rq_head[h] = e->rq_len[h] = 0, e->idle[h] = e->qcores;
    for (int r = 0; r < e->n; r++) {
      int h = queue_of(e, r);
      if (e->idle[h] > 0) {
        e->idle[h]--;
        e->rs[r].where = ON_CORE;
        schedule(e, r, start);
      } else {
        rq_push(e, r, false);
      }
    }
  } else {
    for (int r = 0; r < e->n; r++) schedule(e, r, start);
  }
  while (e->nheap && rc == COLL_OK) {
    event ev = pop(e);
    if (ev.r < 0) { /* a sleeping rank's wake */
      sched_woken(e, -1 - ev.r, ev.t);
      continue;
    }
    rc = step_rank(e, ev.r, ev.t);
    /* A rank has at most one pending event; the heap holds at most 2N (stale ones). */
    if (e->nheap >= 2 * (size_t)e->n) {
      /* cannot happen with one event per rank plus wake-ups; guard the array anyway */
      event *h = realloc(e->heap, (e->nheap + 1) * 2 * sizeof *h);
      if (!h) {
        snprintf(e->why, e->why_len, "out of memory simulating %d ranks", e->n);
        return COLL_ERR_SYSTEM;
      }
      e->heap = h;
    }
  }
  if (rc != COLL_OK) return rc;
  int stuck = -1, count = 0;
  for (int r = 0; r < e->n; r++)
    if (!e->rs[r].done) {
      if (stuck < 0) stuck = r;
      count++;
    }
  if (stuck >= 0) {
    const rank_state *s = &e->rs[stuck];
    const sim_step *st = sim_plans_step(p, stuck, s->idx);
    snprintf(e->why, e->why_len,
             "deadlock with FIFOs of %d slots: %d ranks can never finish; "
             "rank %d waits in round %llu at step %llu (%s, from %d to %d)",
             e->depth, count, stuck, (unsigned long long)s->round, (unsigned long long)s->idx,
             coll_step_name((coll_step_kind)st->kind), sim_peer(stuck, st->din, e->n),
             sim_peer(stuck, st->dout, e->n));
    return COLL_ERR_MISMATCH;
  }
  for (size_t i = 0; i < e->nconns; i++)
    if (e->conns[i].head != e->conns[i].tail) {
      snprintf(e->why, e->why_len, "rank %d sent %llu slices to rank %d that it never received",
               e->conns[i].src, (unsigned long long)(e->conns[i].tail - e->conns[i].head),
               e->conns[i].dst);
      return COLL_ERR_MISMATCH;
    }
  return COLL_OK;
}

coll_result sim_run(const sim_plans *p, const sim_model *m, size_t es, sim_checker *ck,
                    sim_result *res, char *why, size_t why_len) {
  engine e = {.p = p,
              .m = m,
              .es = es,
              .ck = ck,
              .n = p->nranks,
              .depth = m->depth,
              .why = why,
              .why_len = why_len};
  coll_result rc = COLL_OK;
  memset(res, 0, sizeof *res);
  if (m->per_host < 1 || m->depth < 1 || m->slot < es || es == 0 || p->nranks != m->nranks ||
      m->burst < 0 || (m->burst > 0 && (m->beta_line < 0 || m->beta[SIM_NET] <= 0)) ||
      (ck && (m->calls > 1 || m->loop > 1)) || (m->loop > 1 && m->calls > 1)) {
    snprintf(why, why_len,
             "the model needs ranks per host >= 1, FIFO depth >= 1, a slot of "
             "at least one element, the plans' number of ranks, a shaper (if any) with a "
             "rate and a line speed, one call when its contents are checked, and calls "
             "with barriers or a loop, not both");
    return COLL_ERR_INVALID_ARG;
  }
  e.hosts = (e.n + m->per_host - 1) / m->per_host;
  e.cores = m->cores > 0 ? m->cores : m->per_host;
  e.oversub = (m->per_host < e.n ? m->per_host : e.n) > e.cores;
  e.sched = e.oversub && m->cpu.on && m->cpu.sched;
  if (e.sched) {
    e.nq = m->cpu.bound ? e.hosts * e.cores : e.hosts;
    e.qcores = m->cpu.bound ? 1 : e.cores;
    e.rq = malloc((size_t)e.nq * (size_t)m->per_host * sizeof *e.rq);
    e.rq_head = calloc((size_t)e.nq, sizeof *e.rq_head);
    e.rq_len = calloc((size_t)e.nq, sizeof *e.rq_len);
    e.idle = calloc((size_t)e.nq, sizeof *e.idle);
    if (!e.rq || !e.rq_head || !e.rq_len || !e.idle) goto oom;
  }
  e.rs = calloc((size_t)e.n, sizeof *e.rs);
  e.heap = malloc(((size_t)e.n + 1) * 2 * sizeof *e.heap);
  e.core_free = calloc((size_t)e.hosts * (size_t)e.cores, sizeof *e.core_free);
  e.fp = calloc((size_t)e.hosts, sizeof *e.fp);
  e.ws = calloc((size_t)e.hosts, sizeof *e.ws);
  e.hit = calloc((size_t)e.hosts, sizeof *e.hit);
  e.running = calloc((size_t)e.hosts, sizeof *e.running);
  e.touched = calloc((size_t)e.hosts * (size_t)e.cores + (size_t)e.n, sizeof *e.touched);
  e.wcore = calloc((size_t)e.hosts * (size_t)e.cores + (size_t)e.n, sizeof *e.wcore);
  e.miss = calloc((size_t)e.hosts * (size_t)e.cores + (size_t)e.n, sizeof *e.miss);
  e.nic_tx = calloc((size_t)e.hosts, sizeof(double));
  e.nic_rx = calloc((size_t)e.hosts, sizeof(double));
  e.nic_busy = calloc(2 * (size_t)e.hosts, sizeof(double));
  e.tok = calloc(2 * (size_t)e.hosts, sizeof(double));
  e.tok_t = calloc(2 * (size_t)e.hosts, sizeof(double));
  if (!e.rs || !e.heap || !e.core_free || !e.fp || !e.ws || !e.hit || !e.running || !e.touched ||
      !e.wcore || !e.miss || !e.nic_tx || !e.nic_rx || !e.nic_busy || !e.tok || !e.tok_t)
    goto oom;
  for (int k = 0; k < 2 * e.hosts; k++) e.tok[k] = m->burst; /* idle before: full */
  if (m->trace) trace_names(&e);
  /* Every FIFO the plans use, from both ends' point of view (a send without its receive
   * still gets a FIFO: the message is then found unreceived). */
  for (int r = 0; r < e.n; r++)
    for (size_t i = 0; i < sim_plans_nsteps(p, r); i++) {
      const sim_step *st = sim_plans_step(p, r, i);
      int pin = sim_peer(r, st->din, e.n), pout = sim_peer(r, st->dout, e.n);
      int pin2 = st->kind == COLL_STEP_RECV2_REDUCE_SEND ? sim_peer(r, st->din2, e.n) : -1;
      if ((pin >= 0 && !add_conn(&e, pin, r)) || (pin2 >= 0 && !add_conn(&e, pin2, r)) ||
          (pout >= 0 && !add_conn(&e, r, pout)))
        goto oom;
      if (pout >= 0) { /* what of its slots the FIFO fills */
        conn *c = get_conn(&e, r, pout);
        double b = (double)(st->count < m->slot / es ? st->count : m->slot / es) * (double)es;
        if (b > c->used) c->used = b;
      }
    }
  /* W per host (CPU model): its ranks' buffers, and depth slots of what its largest slice
   * fills for every FIFO with an end on the host — one between two of its ranks once, one
   * to another host on both sides (each end's transport has its own slots). */
  for (int h = 0; h < e.hosts; h++) e.ws[h] = m->cpu.ws;
  for (size_t i = 0; i < e.nconns; i++) {
    int hs = host_of(&e, e.conns[i].src), hd = host_of(&e, e.conns[i].dst);
    e.ws[hs] += (double)m->depth * e.conns[i].used;
    if (hd != hs) e.ws[hd] += (double)m->depth * e.conns[i].used;
  }
  if (m->cpu.on) /* its share of hits in the last-level cache, once per distinct W */
    for (int h = 0; h < e.hosts; h++)
      e.hit[h] = h > 0 && e.ws[h] == e.ws[h - 1] ? e.hit[h - 1] : sim_cpu_hit(&m->cpu, e.ws[h]);
  /* Per private cache, its working set (rfo_cost): the buffers of the ranks it serves
   * and the slots of every FIFO on the host those ranks read or write. */
  if (m->cpu.on && m->cpu.rfo > 0) {
    int local = m->per_host < e.n ? m->per_host : e.n;
    for (int r = 0; r < e.n; r++) e.wcore[cache_of(&e, r)] += m->cpu.ws / local;
    for (size_t i = 0; i < e.nconns; i++) {
      const conn *c = &e.conns[i];
      if (host_of(&e, c->src) != host_of(&e, c->dst)) continue;
      size_t a = cache_of(&e, c->src), b = cache_of(&e, c->dst);
      e.wcore[a] += (double)m->depth * c->used;
      if (b != a) e.wcore[b] += (double)m->depth * c->used;
    }
    for (size_t k = 0; k < (size_t)e.hosts * (size_t)e.cores + (size_t)e.n; k++)
      e.miss[k] = 1 - sim_cache_hit(e.wcore[k] / m->cpu.l2_bytes);
  }
  /* The FIFOs' footprint per host (CPU model): every FIFO between two of its ranks cycles
   * through depth slots of what its largest slice fills. */
  if (m->cpu.on && m->cpu.footprint > 0 && m->cpu.cache_bytes > 0) {
    for (size_t i = 0; i < e.nconns; i++)
      if (host_of(&e, e.conns[i].src) == host_of(&e, e.conns[i].dst))
        e.fp[host_of(&e, e.conns[i].src)] += (double)m->depth * e.conns[i].used;
    for (int h = 0; h < e.hosts; h++)
      e.fp[h] = e.fp[h] > m->cpu.cache_bytes ? 1 - m->cpu.cache_bytes / e.fp[h] : 0;
  }
  /* The call's fixed cost outside its slices (CPU model only): every rank pays it once,
   * before its first slice and after its last, so it adds to the makespan — and, with
   * calls back to back, separates one call from the next. */
  double call_cost = m->cpu.on ? m->cpu.call : 0;
  int calls = m->calls > 1 ? m->calls : 1;
  int warmup = m->warmup < 0 ? 0 : m->warmup >= calls ? calls - 1 : m->warmup;
  double start = 0, timed_from = 0;
  for (int call = 0; call < calls && rc == COLL_OK; call++) {
    if (call > 0) { /* every rank as new; the FIFOs go on from where they were (empty:
                     * the last call received all), and the NICs' queues and buckets and
                     * the caches are as the last call left them */
      memset(e.rs, 0, (size_t)e.n * sizeof *e.rs);
      memset(e.running, 0, (size_t)e.hosts * sizeof *e.running);
      start = e.res.seconds + call_cost;
      for (size_t c = 0; c < (size_t)e.hosts * (size_t)e.cores; c++)
        if (e.core_free[c] < start) e.core_free[c] = start;
    }
    if (call == warmup) timed_from = start;
    rc = run_call(&e, start);
  }
  for (int h = 0; h < 2 * e.hosts; h++)
    if (e.nic_busy[h] > e.res.busiest_nic) e.res.busiest_nic = e.nic_busy[h];
  if (rc == COLL_OK) /* one call: its makespan; several: the mean of the timed ones */
    e.res.seconds = (e.res.seconds + call_cost - timed_from) / (calls - warmup);
  if (rc == COLL_OK && m->loop > 1) e.res.seconds /= m->loop; /* the loop's calls */
  *res = e.res;
  if (m->trace) m->trace->pid += e.n;
  goto out;
oom:
  snprintf(why, why_len, "out of memory simulating %d ranks", e.n);
  rc = COLL_ERR_SYSTEM;
out:
  for (size_t i = 0; i < e.nconns; i++) {
    if (e.conns[i].q && ck)
      for (int k = 0; k < e.depth; k++) sim_payload_free(e.conns[i].q[k].pl);
    free(e.conns[i].q);
  }
  free(e.conns);
  free(e.ckeys);
  free(e.cval);
  free(e.rs);
  free(e.heap);
  free(e.core_free);
  free(e.fp);
  free(e.ws);
  free(e.hit);
  free(e.running);
  free(e.touched);
  free(e.wcore);
  free(e.miss);
  free(e.nic_tx);
  free(e.nic_rx);
  free(e.nic_busy);
  free(e.tok);
  free(e.tok_t);
  free(e.rq);
  free(e.rq_head);
  free(e.rq_len);
  free(e.idle);
  return rc;
}

/* ---- conveniences ------------------------------------------------------------------- */

void sim_validation_case(coll_coll_kind c, coll_algo a, int n, size_t *count, size_t *slice) {
  bool small = n <= 64;
  bool rooted = c == COLL_COLL_BROADCAST || c == COLL_COLL_REDUCE;
  if (c == COLL_COLL_ALL_REDUCE || rooted) {
    *count = 2 * (size_t)n + 3; /* ring chunks of 2 and 3 elements */
    if (a == COLL_ALGO_RING && !rooted)
      *slice = small ? 2 : 3;
    else
      *slice = *count / (small ? 16 : 4) + 1; /* whole-vector steps: a few slices */
  } else {
    *count = 3; /* blocks (per rank) */
    *slice = small ? 2 : 3;
  }
}

double sim_call_bytes(const sim_call *c, int n) {
  double b = (double)c->count * (double)c->es;
  switch (c->coll) {
  case COLL_COLL_ALL_GATHER:
  case COLL_COLL_REDUCE_SCATTER:
  case COLL_COLL_GATHER:
  case COLL_COLL_SCATTER:
  case COLL_COLL_ALL_TO_ALL: return b * n;
  default: return b;
  }
}

size_t sim_count_for(coll_coll_kind c, double bytes, size_t es, int n) {
  double e = bytes / (double)es;
  switch (c) {
  case COLL_COLL_ALL_GATHER:
  case COLL_COLL_REDUCE_SCATTER:
  case COLL_COLL_GATHER:
  case COLL_COLL_SCATTER:
  case COLL_COLL_ALL_TO_ALL: e /= n; break;
  default: break;
  }
  return (size_t)floor(e);
}

double sim_bus_factor(coll_coll_kind c, int n) {
  switch (c) {
  case COLL_COLL_ALL_REDUCE: return 2.0 * (n - 1) / n;
  case COLL_COLL_ALL_GATHER:
  case COLL_COLL_REDUCE_SCATTER:
  case COLL_COLL_ALL_TO_ALL:
  case COLL_COLL_GATHER:
  case COLL_COLL_SCATTER: return (double)(n - 1) / n;
  default: return 1.0;
  }
}

coll_result sim_call_run(const sim_model *m, const sim_call *call, bool check, sim_edit_fn edit,
                         void *edit_ctx, sim_result *res, char *why, size_t why_len) {
  sim_plans p;
  size_t slice = m->slot / (call->es ? call->es : 1);
  coll_result rc = sim_plans_build(&p, m->nranks, call, slice ? slice : 1, edit, edit_ctx, why,
                                   why_len);
  if (rc != COLL_OK) return rc;
  sim_checker *ck = NULL;
  if (check && !(ck = sim_check_new(m->nranks, call))) {
    sim_plans_free(&p);
    snprintf(why, why_len, "out of memory for the checker of %d ranks", m->nranks);
    return COLL_ERR_SYSTEM;
  }
  sim_model mc = *m; /* the CPU model's per-call figures: W and the nt rule */
  if (mc.cpu.on) {
    mc.cpu.ws = sim_cpu_buffers(&mc, call);
    mc.cpu.nt = sim_cpu_nt(call, mc.nranks, mc.cpu.nt_bytes);
  }
  rc = sim_run(&p, &mc, call->es, ck, res, why, why_len);
  if (rc == COLL_OK && ck && !sim_check_final(ck, why, why_len)) rc = COLL_ERR_MISMATCH;
  sim_check_free(ck);
  sim_plans_free(&p);
  return rc;
}

/* ---- the trace file ----------------------------------------------------------------- */

bool sim_trace_open(sim_trace *t, const char *path) {
  memset(t, 0, sizeof *t);
  if (!(t->f = fopen(path, "w"))) return false;
  fprintf(t->f, "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"source\":\"coll-sim\"},"
                "\"traceEvents\":[\n");
  return true;
}

bool sim_trace_close(sim_trace *t) {
  fprintf(t->f, "\n]}\n");
  bool ok = !ferror(t->f);
  return fclose(t->f) == 0 && ok;
}
