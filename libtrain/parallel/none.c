/*
 * none.c — the strategy of one process: each step is the session's own (next batch,
 * forward, backward, clip, AdamW), the checkpoint the session's. Under tensor
 * parallelism with no data parallelism (--tp T alone) it is the data-parallel strategy
 * of a group of one that tp.c wraps: it never communicates itself.
 */
#include "model/model.h"
#include "parallel/strategy.h"
#include "parallel/tp.h"

#include <stdlib.h>

static int none_step(train_parallel *p, train_step_report *r, char *err) {
  (void)err;
  r->step = train_session_step(p->s);
  return 0;
}

static int none_save(train_parallel *p, const char *path, char *what, size_t n, char *err) {
  snprintf(what, n, " (manifest; 1 shard %s.shard0.0of1x1)", path);
  return train_session_save(p->s, path, err);
}

static int none_save_slice(train_parallel *p, train_backend *world, train_backend *tp,
                           const char *path, char *err) {
  return train_tp_save(p->s, world, tp, NULL, NULL, NULL, path, err);
}

static int none_finish(train_parallel *p, const char *trace_path, char *err) {
  (void)p;
  (void)trace_path;
  (void)err;
  return 0;
}

static void none_describe(train_parallel *p, char *out, size_t n) {
  (void)p;
  (void)n;
  out[0] = '\0';
}

static void none_step_line(const train_parallel *p, const train_step_report *r, char *out,
                           size_t n) {
  (void)p;
  (void)r;
  (void)n;
  out[0] = '\0';
}

static void none_summary(const train_parallel *p, const train_step_report *sum, long nsteps,
                         double seconds, const train_step_report *all, long nall, char *out,
                         size_t n) {
  (void)p;
  (void)all;
  (void)nall;
  (void)sum;
  (void)nsteps;
  (void)seconds;
  (void)n;
  out[0] = '\0';
}

static int none_plan(const train_parallel *p, double fixed, train_plan_row *out, char *err) {
  const train_options *o = &p->s->opt;
  return train_plan_dt(&o->cfg, o->batch, o->seq, 1, 1, TRAIN_PLAN_NONE, o->recompute, o->bf16,
                       fixed, out, err);
}

static void none_free(train_parallel *p) { free(p); }

static const train_parallel_ops none_ops = {
    .name = "none",
    .step = none_step,
    .save = none_save,
    .save_slice = none_save_slice,
    .finish = none_finish,
    .describe = none_describe,
    .step_line = none_step_line,
    .summary = none_summary,
    .plan = none_plan,
    .free = none_free,
};

train_parallel *train_none_create(train_session *s, train_grid *g,
                                  const train_parallel_options *opt, char *err) {
  train_parallel *p = train_parallel_new(&none_ops, s, g, opt);
  if (!p) train_errf(err, "out of memory");
  return p;
}
