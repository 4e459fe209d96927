/*
 * strategies.c — the table of strategies (strategy.h): the one place that names them.
 *
 * The table names each data-parallel strategy once; tensor parallelism is the one
 * dimension that composes with them (it wraps the row the table picked), so it is applied
 * here, around the row, when the grid has T > 1. Nothing here knows what a strategy does;
 * the strategies do not know this file (they use strategy.c), so the table sits on top.
 */
#include "parallel/strategy.h"

#include <string.h>

static const struct {
  const char *name;
  train_parallel_create_fn create;
} strategy_rows[] = {
    {"none", train_none_create},
    {"ddp", train_ddp_strategy_create},
    {"fsdp", train_fsdp_strategy_create},
};

train_parallel *train_parallel_create(train_session *s, train_grid *g,
                                      const train_parallel_options *opt, char *err) {
  train_parallel_create_fn create = NULL;
  for (size_t i = 0; i < sizeof strategy_rows / sizeof strategy_rows[0]; i++)
    if (strcmp(strategy_rows[i].name, opt->data) == 0) create = strategy_rows[i].create;
  if (!create) {
    train_errf(err, "--parallel: '%s' is not none, ddp or fsdp", opt->data);
    return NULL;
  }
  /* the pipeline runs its own step (a schedule of micro-batches) and syncs each stage's
   * gradients over its data-parallel group itself; it takes the TP group when T > 1 */
  if (g->P > 1) { return train_pp_strategy_create(s, g, opt, err); }
  /* a mixture of experts over several ranks: DDP for the dense part, the experts over
   * their own groups (ep.c); one process steps it as any model */
  if (opt->experts > 0 && strcmp(opt->data, "none") != 0) {
    if ((strcmp(opt->data, "ddp") != 0 && !(strcmp(opt->data, "fsdp") == 0 && opt->zero == 1)) ||
        g->T > 1) {
      train_errf(err, "--experts runs with --parallel ddp or fsdp --zero 1 (or one process) "
                      "only: ZeRO-2/3 shard each block's gradients and parameters over every "
                      "data-parallel rank, while an expert's weights live on its "
                      "expert-parallel ranks only");
      return NULL;
    }
    return train_ep_strategy_create(s, g, opt, err);
  }
  /* context parallelism wraps the data-parallel row (and tensor parallelism around it
   * when T > 1): its ranks sync their gradients as data-parallel ones */
  if (g->Cp > 1) return train_cp_strategy_create(s, g, opt, create, err);
  return g->T > 1 ? train_tp_strategy_create(s, g, opt, create, err) : create(s, g, opt, err);
}
