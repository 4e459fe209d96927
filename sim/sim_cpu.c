/* sim_cpu.c — what one slice operation costs the CPU, as executor.c's run_slice does it.
 *
 * The plain α-β model charges a slice b·β_shm for the copy into the peer's slot and b·γ
 * per reduction, and nothing else.  run_slice does more, and measured 2-rank times were
 * 61-95 % slower than that model.  Here every slice is priced as the passes over memory
 * it really makes (executor.c, host memory):
 *
 *   step kind               passes per slice of b bytes
 *   COPY                    put (1 copy; non-temporal when the call is "nt")
 *   SEND                    1 copy (user buffer -> slot)
 *   RECV                    put
 *   RECV_COPY_SEND          1 copy (slot -> slot) + put
 *   RECV_REDUCE_SEND        1 reduce (slot, user buffer -> slot)
 *   RECV_REDUCE_COPY        1 reduce, + 1 non-temporal copy when nt (reduced in scratch,
 *                           then streamed out)
 *   RECV_REDUCE_COPY_SEND   1 reduce + 1 copy (to the slot), + 1 non-temporal copy when
 *                           nt (the scratch path); without nt reduce into the user's
 *                           buffer, then copy it to the slot: the same 2 passes
 *   RECV2_REDUCE_SEND       2 reduces
 *
 * where "nt" is the executor's rule: out of place and the user's buffer at least
 * COLL_NT_BYTES (16 MiB), and put is a non-temporal copy then, else a memcpy.
 *
 * A pass's cost per byte depends on where its operands are.  Let W be every byte the
 * host's ranks touch in one call: each rank's send and receive buffers
 * (sim_cpu_buffers), and the slots of every FIFO with an end on the host, depth slots of
 * what its largest slice fills (the engine counts them from the plans: a FIFO between
 * two of the host's ranks once, one to another host on each side, whose transport keeps
 * its own slots).  A benchmark repeats the call, so when W fits the last-level cache of
 * C bytes everything is found in cache; when W is larger, a cache that resists thrashing
 * keeps about C of the W bytes between two touches, so a fraction C/W of the accesses hit
 * and the rest go to memory.  But the cache is A-way set-associative, and W's lines fall
 * on its sets at random (a page's frame decides its lines' sets, and a VM's frames are
 * scattered), so a set gets k ~ Poisson(λ) of them, λ = A·W/C, not exactly its share: a
 * set given k <= A holds all k, one given more keeps A.  The share of lines that hit:
 *
 *     cost(W) = f·x_cache + (1 - f)·x_mem,   f = sum over k of P(k)·min(k, A) / λ
 *
 * (sim_cpu_hit; cache_ways = 0 keeps the old f = min(1, C/W)).  It softens the knee at C
 * and changes nothing far from it: with C = 20 MiB and A = 16, f = 0.97 at W = 16 MiB,
 * 0.92 at 19, 0.80 at 24, 0.42 at 48, where min(1, C/W) gives 1, 1, 0.83, 0.42.
 * sim-membw itself (knee) finds 0.93-0.98 at 16 MiB and 0.89 at 19 (docs/bandwidth-math.md 8).
 *
 * with x_cache and x_mem the kernel's speed in cache and from memory, measured apart
 * (sim/sim_membw.c, with as many threads as ranks can run at once on the host).  The
 * host's cores share its memory bandwidth: an operation that starts while only k of the
 * C cores run one pays x_mem·(a + (1 - a)(k - 1)/(C - 1)), a = cpu.mem_alone (0.64 here:
 * sim-membw with 1 thread against 2) — it matters where ranks leave a core idle part of
 * the time, as 3 ranks bound to 2 cores do.
 *
 * A slot is shared by two cores: the sender's writes must first take its lines from the
 * receiver's cache (which read them last), the receiver's reads fetch what the sender
 * just wrote.  So a pass that writes into a peer's slot costs, per byte, t_out(W) more
 * than the same pass between a rank's own buffers, and one that reads a received slot
 * t_in(W) more, with
 *
 *     t_out = slot_out - copy,   t_in = slot_in - copy       (each by the formula above)
 *
 * slot_out and slot_in being the two sides of a copy through a FIFO of slots between two
 * threads (sim-membw handover).  A reduction that reads a slot and writes one pays both;
 * RECV_COPY_SEND's second copy (slot -> user's buffer) reads lines already fetched.  Each
 * operation also pays a fixed `op` seconds of CPU (acquiring the FIFO slots, the
 * counters' atomics and cache-line transfers, the loop's bookkeeping): at 64 KiB slices
 * it is what separates a slice's cost from its bytes.
 *
 * The engine adds the FIFOs' footprint (sim_engine.c): per slot byte an operation reads
 * or writes (sim_cpu_slot_bytes), cpu.footprint·(1 - C/F) when the host's FIFOs cycle
 * through F > C bytes of slots.
 *
 * Must never: depend on anything but its arguments.
 */
#include <math.h>

#include "internal.h"
#include "sim.h"

/* Kernel k's cost at the call's W from a measured curve: linear in log W between the
 * two measured points around it, flat beyond the ends. */
static double curve_at(const sim_cpu *c, int k, double ws) {
  const double *w = c->curve_ws, *y = c->curve[k];
  if (ws <= w[0]) return y[0];
  for (int i = 1; i < c->ncurve; i++)
    if (ws <= w[i]) {
      double t = log(ws / w[i - 1]) / log(w[i] / w[i - 1]);
      return y[i - 1] + t * (y[i] - y[i - 1]);
    }
  return y[c->ncurve - 1];
}

/* Random replacement in steady state: a line survives the M bytes inserted (missed)
 * between two of its uses with probability exp(-M/L), and M is the r·L bytes swept in
 * between times the miss ratio, so the hit ratio p solves p = exp(-r·(1 - p)).  r <= 1:
 * p = 1; r large: p -> 0.  (p = 1 solves it for every r; for r > 1 the root that holds is
 * the smaller one, found by bisection on [0, 1).)  The engine prices a core's L2 by it. */
double sim_cache_hit(double r) {
  if (!(r > 1)) return 1;
  double lo = 0, hi = 1 - 1e-12; /* p - exp(-r(1-p)): below zero at 0, above just below 1 */
  for (int i = 0; i < 80; i++) {
    double p = 0.5 * (lo + hi);
    if (p - exp(-r * (1 - p)) < 0)
      lo = p;
    else
      hi = p;
  }
  return 0.5 * (lo + hi);
}

/* The sets' occupancy (see the top of the file): k ~ Poisson(λ) lines per set, λ = A·W/C;
 * a set holds min(k, A) of its k lines, so f = sum over k of P(k)·min(k, A) / λ.  The sum
 * runs over λ ± (12·sqrt(λ) + 40), where all but a negligible share of P lies, each term
 * from its log (P(k) underflows for large λ). */
double sim_cpu_hit(const sim_cpu *c, double ws) {
  if (ws <= 0) return 1;
  if (c->cache_bytes <= 0) return 0; /* no cache: everything from memory */
  if (c->cache_ways <= 0) return ws <= c->cache_bytes ? 1.0 : c->cache_bytes / ws;
  double a = c->cache_ways, lam = a * ws / c->cache_bytes, sum = 0;
  double spread = 12 * sqrt(lam) + 40;
  long lo = lam - spread > 0 ? (long)(lam - spread) : 0, hi = (long)(lam + spread);
  for (long k = lo > 1 ? lo : 1; k <= hi; k++) {
    double pk = exp((double)k * log(lam) - lam - lgamma((double)k + 1));
    sum += pk * (k <= (long)a ? (double)k : a);
  }
  double f = sum / lam;
  return f > 1 ? 1 : f;
}

double sim_cpu_per_byte(const double x[2], double hit, double mem) {
  return hit * x[0] + (1 - hit) * x[1] * mem;
}

/* The memory price's factor with `running` of `cores` cores streaming: the host's memory
 * bandwidth is shared (sim-membw: a thread alone moves a byte in 0.64 of the time it
 * takes with both cores streaming), linear between one core and all. */
static double mem_share(const sim_cpu *c, int running, int cores) {
  if (c->mem_alone <= 0 || c->mem_alone >= 1 || cores < 2) return 1.0;
  if (running < 1) running = 1;
  if (running > cores) running = cores;
  return c->mem_alone + (1 - c->mem_alone) * (double)(running - 1) / (double)(cores - 1);
}

double sim_cpu_work(const sim_cpu *c, coll_step_kind k, double b, double ws, double hit,
                    int running, int cores) {
  double mem = mem_share(c, running, cores);
  double mix_copy = sim_cpu_per_byte(c->copy, hit, mem);
  double copy = mix_copy, red = sim_cpu_per_byte(c->reduce, hit, mem);
  double nt = sim_cpu_per_byte(c->nt_copy, hit, mem);
  if (c->ncurve >= 2) /* the measured curve instead of the mixture (taken at all cores) */
    copy = curve_at(c, 0, ws), nt = curve_at(c, 1, ws), red = curve_at(c, 2, ws);
  double put = c->nt ? nt : copy;
  /* The hand-over terms stay the mixture's differences (slot_in/out were measured as two
   * points, like the mixture's copy they are set against).  t_in is negative from
   * memory: a slot the peer just wrote is read from its cache, not from memory. */
  double t_in = c->slot_in[0] > 0 ? sim_cpu_per_byte(c->slot_in, hit, mem) - mix_copy : 0;
  double t_out = c->slot_out[0] > 0 ? sim_cpu_per_byte(c->slot_out, hit, mem) - mix_copy : 0;
  double passes = 0;
  switch (k) {
  case COLL_STEP_COPY: passes = put; break;
  case COLL_STEP_SEND: passes = copy + t_out; break;
  case COLL_STEP_RECV: passes = put + t_in; break;
  case COLL_STEP_RECV_COPY_SEND: passes = copy + t_in + t_out + put; break;
  case COLL_STEP_RECV_REDUCE_SEND: passes = red + t_in + t_out; break;
  case COLL_STEP_RECV_REDUCE_COPY: passes = red + t_in + (c->nt ? put : 0); break;
  case COLL_STEP_RECV_REDUCE_COPY_SEND:
    passes = red + t_in + copy + t_out + (c->nt ? put : 0);
    break;
  case COLL_STEP_RECV2_REDUCE_SEND: passes = 2 * red + 2 * t_in + t_out; break;
  }
  return c->op + b * passes;
}

double sim_cpu_slot_bytes(coll_step_kind k, double b) {
  switch (k) {
  case COLL_STEP_COPY: return 0;
  case COLL_STEP_SEND:
  case COLL_STEP_RECV:
  case COLL_STEP_RECV_REDUCE_COPY: return b;
  case COLL_STEP_RECV_COPY_SEND:
  case COLL_STEP_RECV_REDUCE_SEND:
  case COLL_STEP_RECV_REDUCE_COPY_SEND: return 2 * b;
  case COLL_STEP_RECV2_REDUCE_SEND: return 3 * b;
  }
  return 0;
}

/* The user buffers of one call on this model: per rank its send and receive buffers as
 * coll-bench allocates them out of place (all-gather: count in, count·N out;
 * reduce-scatter the reverse; all-reduce, broadcast, reduce: count each), times the ranks
 * of the host.  W adds the FIFOs' slots, which only the plans know (the engine). */
double sim_cpu_buffers(const sim_model *m, const sim_call *call) {
  double e = (double)call->count * (double)call->es, n = m->nranks, in = e, out = e;
  switch (call->coll) {
  case COLL_COLL_ALL_GATHER:
  case COLL_COLL_GATHER: out = e * n; break;
  case COLL_COLL_REDUCE_SCATTER:
  case COLL_COLL_SCATTER: in = e * n; break;
  case COLL_COLL_ALL_TO_ALL: in = out = e * n; break;
  default: break;
  }
  if (call->in_place) in = 0;
  int local = m->per_host < m->nranks ? m->per_host : m->nranks;
  return local * (in + out);
}

/* The executor's nt rule (copy.c: coll_copy_streams), for one call. */
bool sim_cpu_nt(const sim_call *call, int nranks, double nt_bytes) {
  return nt_bytes > 0 && coll_copy_streams(call->coll, call->count, call->es, nranks,
                                           call->in_place, (size_t)nt_bytes);
}
