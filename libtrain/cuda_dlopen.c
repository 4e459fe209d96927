/*
 * cuda_dlopen.c — the CUDA model and the NCCL backend live in a module of their own
 * (libtrain_cuda.so: layers_cuda.cu, backend_nccl.c), opened here on first use, so a CPU
 * run never loads cudart, cuBLAS, cuBLASLt or NCCL (about 130 MB resident measured before
 * this split in a run that never touched a GPU).
 *
 * The module is looked for in $TRAIN_CUDA_MODULE, beside the running program, one
 * directory up (the tests), then on the loader's path. It must never print or exit: a
 * module that cannot be opened is a sentence in err.
 */
#include "backend.h"
#include "internal.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

static void *mod;
static char mod_err[TRAIN_ERRLEN];

static void *module(void)
{
    if (mod || mod_err[0])
        return mod;
    char exe[PATH_MAX], path[PATH_MAX + 64];
    const char *env = getenv("TRAIN_CUDA_MODULE");
    if (env && *env)
        mod = dlopen(env, RTLD_NOW | RTLD_LOCAL);
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
    if (!mod)
        mod = dlopen("libtrain_cuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!mod) {
        const char *e = dlerror();
        train_errf(mod_err, "--device cuda: cannot open libtrain's CUDA module "
                            "libtrain_cuda.so (set TRAIN_CUDA_MODULE to its path): %s",
                   e ? e : "not found");
    }
    return mod;
}

static void *sym(const char *name)
{
    void *m = module();
    return m ? dlsym(m, name) : NULL;
}

const train_ops *train_cuda_ops(char *err)
{
    const train_ops *(*fn)(char *) = (const train_ops *(*)(char *))sym("train_cuda_ops");
    if (!fn) {
        train_errf(err, "%s", mod_err[0] ? mod_err : "--device cuda: the CUDA module lacks train_cuda_ops");
        return NULL;
    }
    return fn(err);
}

const char *train_cuda_device_name(char *err)
{
    const char *(*fn)(char *) = (const char *(*)(char *))sym("train_cuda_device_name");
    if (!fn) {
        train_errf(err, "%s", mod_err[0] ? mod_err : "--device cuda: the CUDA module is incomplete");
        return NULL;
    }
    return fn(err);
}

double train_cuda_peak_flops(void)
{
    double (*fn)(void) = (double (*)(void))sym("train_cuda_peak_flops");
    return fn ? fn() : 0.0;
}

int train_backend_nccl_built(void)
{
    int (*fn)(void) = (int (*)(void))sym("train_backend_nccl_built");
    return fn ? fn() : 0;
}

int train_nccl_device_count(void)
{
    int (*fn)(void) = (int (*)(void))sym("train_nccl_device_count");
    return fn ? fn() : 0;
}

train_backend *train_backend_nccl(coll_comm_t boot, int own, char *err)
{
    train_backend *(*fn)(coll_comm_t, int, char *) =
        (train_backend * (*)(coll_comm_t, int, char *)) sym("train_backend_nccl");
    if (!fn) {
        train_errf(err, "--backend nccl: %s", mod_err[0] ? mod_err : "the CUDA module has no NCCL backend");
        return NULL;
    }
    return fn(boot, own, err);
}
