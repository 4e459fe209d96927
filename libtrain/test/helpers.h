/*
 * helpers.h — small utilities shared by the libtrain tests: temporary directories,
 * running a command with its stdout/stderr captured in files, reading whole files,
 * comparing tensors by relative error, memory the forked ranks of a test share, and a
 * model's parameter count.
 */
#ifndef TRAIN_TEST_HELPERS_H
#define TRAIN_TEST_HELPERS_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "train.h"

static inline char *th_tmpdir(void)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char *p = malloc(strlen(base) + 32);
    sprintf(p, "%s/libtrain-test-XXXXXX", base);
    if (!mkdtemp(p)) {
        free(p);
        return NULL;
    }
    return p;
}

static inline void th_rmrf(const char *dir)
{
    char *cmd = NULL;
    if (asprintf(&cmd, "rm -rf '%s'", dir) < 0 || system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", dir);
    free(cmd);
}

/* Number of entries in dir (not counting . and ..), -1 if it does not exist. */
static inline int th_count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

/* Reads a whole file; returns NULL if missing. *len gets the size. */
static inline char *th_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = '\0';
    fclose(f);
    if (len)
        *len = got;
    return buf;
}

static inline int th_write(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(p, 1, n, f);
    fclose(f);
    return w == n ? 0 : -1;
}

/* Runs `cmd` through /bin/sh with stdout and stderr captured into out/err files under
 * dir; returns the exit status (or -1 if it did not exit normally). */
static inline int th_run(const char *cmd, const char *outpath, const char *errpath)
{
    char *full = NULL;
    if (asprintf(&full, "%s >'%s' 2>'%s'", cmd, outpath, errpath) < 0)
        return -1;
    int st = system(full);
    free(full);
    if (st == -1 || !WIFEXITED(st))
        return -1;
    return WEXITSTATUS(st);
}

/* printf into a new string (never truncated); abort on allocation failure. */
#include <stdarg.h>
__attribute__((format(printf, 1, 2))) static inline char *th_fmt(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        abort();
    va_end(ap);
    return s;
}

/* ||a - b|| / ||b|| (L2, accumulated in double); if ||b|| == 0, returns ||a||. */
static inline double th_relerr(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Memory every forked rank of a test writes and the parent reads (MAP_SHARED). */
static inline void *th_shared_alloc(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(p != MAP_FAILED, "mmap %zu bytes: %s", bytes, strerror(errno));
    return p;
}

/* Parameters of a model of this config (built once, on the CPU, to count them). */
static inline size_t th_num_params(const train_config *cfg)
{
    char err[TRAIN_ERRLEN];
    train_model *m = train_model_create(cfg, 1, 1, TRAIN_DEVICE_CPU, 1, 1, err);
    cr_assert(m, "%s", err);
    size_t np = train_num_params(m);
    train_model_free(m);
    return np;
}

#endif
