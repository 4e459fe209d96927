/*
 * cuda_module.c — the CUDA model and the NCCL backend live in a module of their own
 * (libtrain_cuda.so: layers_cuda.cu, backend_nccl.c), opened here on first use, so a CPU
 * run never loads cudart, cuBLAS, cuBLASLt or NCCL (about 130 MB resident measured before
 * this split in a run that never touched a GPU).
 *
 * The module is looked for in $TRAIN_CUDA_MODULE, beside the running program, one
 * directory up (the tests), then on the loader's path. It must never print or exit: a
 * module that cannot be opened is a sentence in err. The model's device ops
 * (model/cuda_ops_module.c) and the NCCL backend (comm/backend_nccl_module.c) look their
 * entry points up through train_cuda_module_sym; this file knows neither.
 */
#include "base/util.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

static void *mod;
static char mod_err[TRAIN_ERRLEN];

static void *module(void) {
  if (mod || mod_err[0]) return mod;
  char exe[PATH_MAX], path[PATH_MAX + 64];
  const char *env = getenv("TRAIN_CUDA_MODULE");
  if (env && *env) mod = dlopen(env, RTLD_NOW | RTLD_LOCAL);
  ssize_t n = mod ? -1 : readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = '\0';
      snprintf(path, sizeof path, "%s/libtrain_cuda.so", exe);
      mod = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (!mod) {
        snprintf(path, sizeof path, "%s/../libtrain_cuda.so", exe);
        mod = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      }
    }
  }
  if (!mod) mod = dlopen("libtrain_cuda.so", RTLD_NOW | RTLD_LOCAL);
  if (!mod) {
    const char *e = dlerror();
    train_errf(mod_err,
               "cannot open libtrain's CUDA module "
               "libtrain_cuda.so (set TRAIN_CUDA_MODULE to its path): %s",
               e ? e : "not found");
  }
  return mod;
}

void *train_cuda_module_sym(const char *name, char *err) {
  void *m = module();
  void *p = m ? dlsym(m, name) : NULL;
  if (!p)
    train_errf(err, "%s",
               mod_err[0] ? mod_err : "the CUDA module (libtrain_cuda.so) is incomplete");
  return p;
}
