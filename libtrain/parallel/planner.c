/*
 * plan.c — the planner's arithmetic (see plan.h): what each strategy holds per rank and
 * sends per step, counted the way model.c, ddp.c and fsdp.c allocate and communicate.
 * It only computes and formats; it must never print, exit or allocate a model.
 */
#include "parallel/planner.h"
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

static const char *names[TRAIN_PLAN_COUNT] = {"none", "DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"};

int train_plan(const train_config *cfg, int B, int T, int N, int accum, train_strategy st,
               double fixed, train_plan_row *r, char *err) {
  return train_plan_rc(cfg, B, T, N, accum, st, TRAIN_RECOMPUTE_NONE, fixed, r, err);
}

int train_plan_rc(const train_config *cfg, int B, int T, int N, int accum, train_strategy st,
                  int recompute, double fixed, train_plan_row *r, char *err) {
  return train_plan_dt(cfg, B, T, N, accum, st, recompute, 0, fixed, r, err);
}

/* bf16 as the seeds' table counts it (Psi parameters): 2 bytes of bf16 weights, 2 of
 * gradients, 12 of fp32 master weights and AdamW moments — 16 Psi, and the ZeRO paper's
 * stages: 1 shards the 12 (4 Psi + 12 Psi/N), 2 the gradients too (2 Psi + 14 Psi/N), 3
 * everything (16 Psi/N); what is sent halves where bf16 travels (gradients, weights). */
static void bf16_rows(double P, int N, train_strategy st, train_plan_row *r) {
  double n1 = (double)(N - 1);
  r->params = 2 * P;
  r->grads = 2 * P;
  r->optim = 12 * P;
  r->working = 0;
  switch (st) {
  case TRAIN_PLAN_NONE: r->sent = 0; break;
  case TRAIN_PLAN_DDP: r->sent = 2.0 * n1 / N * 2 * P; break;
  case TRAIN_PLAN_ZERO1:
    r->optim = 12 * P / N;
    r->sent = 2.0 * n1 / N * 2 * P;
    break;
  case TRAIN_PLAN_ZERO2:
    r->grads = 2 * P / N;
    r->optim = 12 * P / N;
    r->sent = 2.0 * n1 / N * 2 * P;
    break;
  case TRAIN_PLAN_ZERO3:
    r->params = 2 * P / N;
    r->grads = 2 * P / N;
    r->optim = 12 * P / N;
    r->sent = 3.0 * n1 / N * 2 * P; /* gather forward and backward, reduce-scatter */
    break;
  default: break;
  }
}

int train_plan_dt(const train_config *cfg, int B, int T, int N, int accum, train_strategy st,
                  int recompute, int bf16, double fixed, train_plan_row *r, char *err) {
  if (train_config_check(cfg, err) != 0) return -1;
  if (train_shape_check(cfg, B, T, err) != 0) return -1; /* what a run would refuse */
  if (N < 1 || B < 1 || T < 1 || accum < 1 || st < 0 || st >= TRAIN_PLAN_COUNT) {
    train_errf(err, "impossible plan: ranks %d, batch %d, seq %d, accum %d", N, B, T, accum);
    return -1;
  }
  int L = cfg->layers;
  size_t *ul = calloc((size_t)L + 2, sizeof *ul), P = 0, A = 0;
  train_split split = {.recompute = recompute, .bf16 = bf16};
  if (!ul || train_model_sizes_split(cfg, B, T, &split, &P, &A, ul) != 0) {
    free(ul);
    train_errf(err, "out of memory planning");
    return -1;
  }
  train_plan_fill(ul, L, P, A, N, accum, st, fixed, r);
  if (bf16) {
    bf16_rows((double)P, N, st, r);
    r->total = r->params + r->grads + r->optim + r->acts + r->working + r->fixed;
  }
  free(ul);
  return 0;
}

void train_plan_fill(const size_t *ul, int L, size_t P, size_t A, int N, int accum,
                     train_strategy st, double fixed, train_plan_row *r) {
  /* padded shard floats, the largest unit and block (padded), the root units */
  double Ps = 0, U = 0, Bk = 0, Bs = 0, maxblock = 0, root = (double)(ul[0] + ul[L + 1]);
  double rootshard = 0, rootU = 0;
  for (int u = 0; u < L + 2; u++) {
    double plen = (double)((ul[u] + (size_t)N - 1) / (size_t)N * (size_t)N);
    Ps += plen / N;
    U = plen > U ? plen : U;
    if (u >= 1 && u <= L) {
      Bk = plen > Bk ? plen : Bk;
      Bs += plen / N;
      maxblock = (double)ul[u] > maxblock ? (double)ul[u] : maxblock;
    } else {
      rootshard += plen / N;
      rootU = plen > rootU ? plen : rootU;
    }
  }
  double f = 4.0, n1 = (double)(N - 1), K = accum;
  memset(r, 0, sizeof *r);
  r->name = names[st];
  r->acts = (double)A;
  r->fixed = fixed;
  double tmp = accum > 1 ? f * Ps : 0.0; /* FSDP's accumulation buffer */
  switch (st) {
  case TRAIN_PLAN_NONE:
  case TRAIN_PLAN_DDP:
    r->params = f * P;
    r->grads = f * P;
    r->optim = 2 * f * P;
    r->sent = st == TRAIN_PLAN_DDP ? 2.0 * n1 / N * f * P : 0.0;
    break;
  case TRAIN_PLAN_ZERO1:
    r->params = f * P + f * Ps;      /* the model's copy + the master shard */
    r->grads = f * P + f * Ps + tmp; /* the full gradient stays + the reduced shard */
    r->optim = 2 * f * Ps;
    r->working = f * U;              /* staging of one unit's gather */
    r->sent = (K + 1) * n1 * f * Ps; /* reduce-scatter per micro-step + gather */
    break;
  case TRAIN_PLAN_ZERO2:
    r->params = f * P + f * Ps;
    r->grads = f * Ps + tmp;
    r->optim = 2 * f * Ps;
    /* staging + the full gradients alive at once: wte/wpe (written at the head, freed
     * last) and two blocks (the one computing, the one being reduce-scattered: fsdp.c
     * waits for the older ones before backward goes on) */
    r->working = f * U + f * (root + 2 * maxblock);
    r->sent = (K + 1) * n1 * f * Ps;
    break;
  case TRAIN_PLAN_ZERO3:
    r->params = f * Ps + f * root; /* master shard + the root units kept whole */
    r->grads = f * Ps + tmp;
    r->optim = 2 * f * Ps;
    /* two block buffers, staging of the largest root unit (the gathers of whole blocks
     * at start-up return their pages), the full gradients alive at once */
    r->working = 2 * f * Bk + f * rootU + f * (root + 2 * maxblock);
    /* per micro-step: every block gathered for forward, all but the top one again for
     * backward, every unit reduce-scattered; after the step the root units */
    r->sent = K * n1 * f * ((L > 0 ? 2.0 * Bs - Bs / L : 0.0) + Ps) + n1 * f * rootshard;
    break;
  default: break;
  }
  r->total = r->params + r->grads + r->optim + r->acts + r->working + r->fixed;
}

static double status_kb(const char *key) {
  FILE *fp = fopen("/proc/self/status", "r");
  if (!fp) return 0.0;
  char line[256];
  double v = 0.0;
  size_t k = strlen(key);
  while (fgets(line, sizeof line, fp))
    if (strncmp(line, key, k) == 0) {
      v = strtod(line + k, NULL);
      break;
    }
  fclose(fp);
  return v * 1024.0;
}

double train_rss_bytes(void) { return status_kb("VmRSS:"); }
double train_peak_rss_bytes(void) { return status_kb("VmHWM:"); }

void train_plan_header(char *out, size_t n) {
  snprintf(out, n, "%-8s %9s %9s %9s %9s %9s %9s %9s %12s", "strategy", "params", "grads", "AdamW",
           "acts", "gathered", "fixed", "total", "sent/step");
}

void train_plan_format(const train_plan_row *r, char *out, size_t n) {
  const double M = 1048576.0;
  snprintf(out, n, "%-8s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %12.2f",
           r->label[0] ? r->label : r->name, r->params / M, r->grads / M, r->optim / M, r->acts / M,
           r->working / M, r->fixed / M, r->total / M, r->sent / M);
}

/* Resident bytes of libcoll's communicator: its shared-memory segments (/dev/shm/coll-*)
 * as far as this process has touched them. */
double train_comm_rss_bytes(void) {
  FILE *fp = fopen("/proc/self/smaps", "r");
  if (!fp) return 0.0;
  char line[512];
  int in = 0;
  double kb = 0.0;
  while (fgets(line, sizeof line, fp)) {
    unsigned long a, b;
    if (sscanf(line, "%lx-%lx ", &a, &b) == 2)
      in = strstr(line, "/dev/shm/coll-") != NULL;
    else if (in && strncmp(line, "Rss:", 4) == 0)
      kb += strtod(line + 4, NULL);
  }
  fclose(fp);
  return kb * 1024.0;
}
