/*
 * helpers.h — small utilities shared by the libtrain tests: temporary directories,
 * running a command with its stdout/stderr captured in files, reading whole files,
 * comparing tensors by relative error, memory the forked ranks of a test share, a test
 * model's options and parameter count, launching forked ranks, and running coll-train:
 * its losses, its refusals, its checkpoints compared byte for byte.
 */
#ifndef TRAIN_TEST_HELPERS_H
#define TRAIN_TEST_HELPERS_H

#include <coll_launch.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "train.h"

/* A fresh directory under $TMPDIR (or /tmp); the case fails here if none can be made. */
static inline char *th_tmpdir(void) {
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  char *p = malloc(strlen(base) + 32);
  if (!p) abort();
  sprintf(p, "%s/libtrain-test-XXXXXX", base);
  if (!mkdtemp(p)) cr_assert_fail("cannot make a directory under %s: %s", base, strerror(errno));
  return p;
}

static inline void th_rmrf(const char *dir) {
  char *cmd = NULL;
  if (asprintf(&cmd, "rm -rf '%s'", dir) < 0 || system(cmd) != 0)
    fprintf(stderr, "warning: could not remove %s\n", dir);
  free(cmd);
}

/* Number of entries in dir (not counting . and ..), -1 if it does not exist. */
static inline int th_count_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

/* Reads a whole file; returns NULL if missing. *len gets the size. */
static inline char *th_read(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  size_t got = fread(buf, 1, (size_t)n, f);
  buf[got] = '\0';
  fclose(f);
  if (len) *len = got;
  return buf;
}

static inline int th_write(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = fwrite(p, 1, n, f);
  fclose(f);
  return w == n ? 0 : -1;
}

/* Runs `cmd` through /bin/sh with stdout and stderr captured into out/err files under
 * dir; returns the exit status (or -1 if it did not exit normally). */
static inline int th_run(const char *cmd, const char *outpath, const char *errpath) {
  char *full = NULL;
  if (asprintf(&full, "%s >'%s' 2>'%s'", cmd, outpath, errpath) < 0) return -1;
  int st = system(full);
  free(full);
  if (st == -1 || !WIFEXITED(st)) return -1;
  return WEXITSTATUS(st);
}

/* printf into a new string (never truncated); abort on allocation failure. */
__attribute__((format(printf, 1, 2))) static inline char *th_fmt(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) abort();
  va_end(ap);
  return s;
}

/* ||a - b|| / ||b|| (L2, accumulated in double); if ||b|| == 0, returns ||a||. */
static inline double th_relerr(const float *a, const float *b, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)b[i];
    num += d * d;
    den += (double)b[i] * (double)b[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* max |a[i] - b[i]| (a NaN wins, so it is never hidden); *where (if set) gets its index. */
static inline double th_max_abs_diff(const float *a, const float *b, size_t n, size_t *where) {
  double mx = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (d > mx || d != d) {
      mx = d;
      if (where) *where = i;
    }
  }
  return mx;
}

/* Memory every forked rank of a test writes and the parent reads (MAP_SHARED). */
static inline void *th_shared_alloc(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert(p != MAP_FAILED, "mmap %zu bytes: %s", bytes, strerror(errno));
  return p;
}

/* Parameters of a model of this config (built once, on the CPU, to count them). */
static inline size_t th_num_params(const train_config *cfg) {
  char err[TRAIN_ERRLEN];
  train_model *m = train_model_create(cfg, 1, 1, TRAIN_DEVICE_CPU, 1, 1, err);
  cr_assert(m, "%s", err);
  size_t np = train_num_params(m);
  train_model_free(m);
  return np;
}

/* The options every test model starts from: CPU, one thread, the default hyperparameters
 * but for steps, warmup and lr. */
static inline train_options th_options(train_config cfg, int batch, int seq, uint64_t seed,
                                       int steps, int warmup, float lr) {
  train_options o = {
      .cfg = cfg,
      .hp = train_hparams_default(),
      .batch = batch,
      .seq = seq,
      .seed = seed,
      .device = TRAIN_DEVICE_CPU,
      .threads = 1,
  };
  o.hp.steps = steps;
  o.hp.warmup = warmup;
  o.hp.lr = lr;
  return o;
}

/* The model's parameters, AdamW m and v one after the other into st (3 np floats); returns
 * train_copy_opt_to_host's answer (0: the model has no AdamW state yet). */
static inline int th_state_to_host(train_model *m, float *st) {
  size_t np = train_num_params(m);
  train_copy_params_to_host(m, st);
  return train_copy_opt_to_host(m, st + np, st + 2 * np);
}

/* ---- forked ranks ------------------------------------------------------------------ */

/* A rank's failure: says which rank and what it was doing on stderr, returns code. */
static inline int th_rank_fail(int rank, const char *what, const char *err, int code) {
  fprintf(stderr, "rank %d: %s: %s\n", rank, what, err);
  return code;
}

/* Runs fn on n forked ranks (coll_launch_local); fails the test, its message starting with
 * the printf-style label, if a rank left a sentence in why[rank] (when why is set) or the
 * job failed. */
__attribute__((format(printf, 6, 7))) static inline void th_launch(
    int n, int (*fn)(coll_comm_t, int, int, void *), void *arg, int timeout_ms,
    char (*why)[TRAIN_ERRLEN], const char *label, ...) {
  char what[256], fail[256];
  va_list ap;
  va_start(ap, label);
  vsnprintf(what, sizeof what, label, ap);
  va_end(ap);
  int rc = coll_launch_local(n, fn, arg, timeout_ms, fail, sizeof fail);
  for (int r = 0; why && r < n; r++) cr_assert(why[r][0] == 0, "%s rank %d: %s", what, r, why[r]);
  cr_assert_eq(rc, 0, "%s: %s", what, fail);
}

/* ---- coll-train -------------------------------------------------------------------- */

/* The coll-train the build made (meson sets TRAIN_CLI). */
static inline const char *th_cli(void) {
  const char *c = getenv("TRAIN_CLI");
  cr_assert(c, "TRAIN_CLI (path of coll-train) is not set");
  return c;
}

/* Runs cmd with its stdout in <base>.out and its stderr in <base>.err; fails the test,
 * showing the stderr, unless it exits 0. Returns the stdout (the caller frees it). */
static inline char *th_run_ok(const char *cmd, const char *base) {
  char *out = th_fmt("%s.out", base), *errp = th_fmt("%s.err", base);
  int rc = th_run(cmd, out, errp);
  char *e = th_read(errp, NULL), *o = th_read(out, NULL);
  cr_assert_eq(rc, 0, "%s failed (%d): %s", cmd, rc, e ? e : "");
  cr_assert(o, "no output %s", out);
  free(e), free(out), free(errp);
  return o;
}

/* th_run_ok, then the losses coll-train printed (rank 0's "step i/n | loss X" lines) from
 * step `first` on, at most max of them; returns how many. */
static inline int th_cli_losses(const char *cmd, const char *base, long first, float *loss,
                                int max) {
  char *txt = th_run_ok(cmd, base);
  int n = 0;
  for (char *p = txt; (p = strstr(p, "step ")) && n < max; p++) {
    long st, tot;
    float l;
    if (sscanf(p, "step %ld/%ld | loss %f", &st, &tot, &l) == 3 && st == first + n) loss[n++] = l;
  }
  free(txt);
  return n;
}

/* The losses a run wrote with --losses FILE ("step hexfloat" lines) into l, at most max;
 * fails the test when the file is missing. Returns how many. */
static inline int th_read_losses(const char *path, float *l, int max) {
  FILE *f = fopen(path, "r");
  cr_assert(f, "no losses file %s", path);
  int n = 0;
  long st;
  float x;
  while (n < max && fscanf(f, "%ld %a", &st, &x) == 2) l[n++] = x;
  fclose(f);
  return n;
}

/* Runs cmd (th_run_ok, its output beside base) and reads the run's planned total and
 * measured peak (MiB) from its line "memory: planned X MiB ... (VmHWM) Y MiB". */
static inline void th_memory_of(const char *cmd, const char *base, double *plan, double *peak) {
  char *o = th_run_ok(cmd, base);
  char *p = strstr(o, "memory: planned ");
  cr_assert(p && sscanf(p, "memory: planned %lf MiB", plan) == 1, "no plan line in %s", o);
  char *q = strstr(p, "(VmHWM) ");
  cr_assert(q && sscanf(q, "(VmHWM) %lf MiB", peak) == 1, "no peak in %s", p);
  free(o);
}

/* s is exactly one line, ending in its only newline. */
static inline int th_one_line(const char *s) {
  const char *nl = strchr(s, '\n');
  return nl && nl[1] == '\0';
}

/* Runs cmd (stdout and stderr in <base>.out, <base>.err, removed after) and checks that it
 * is refused: exit status 1, one line on stderr starting "coll-train: " and mentioning
 * needle, nothing on stdout. `what` names the case in the messages. */
static inline void th_expect_refused(const char *cmd, const char *base, const char *what,
                                     const char *needle) {
  char *out = th_fmt("%s.out", base), *errp = th_fmt("%s.err", base);
  int rc = th_run(cmd, out, errp);
  char *e = th_read(errp, NULL), *o = th_read(out, NULL);
  cr_assert(e && o, "%s: no output", what);
  cr_assert_eq(rc, 1, "%s: exit status %d, stderr: %s", what, rc, e);
  cr_assert(strncmp(e, "coll-train: ", 12) == 0,
            "%s: stderr does not start with "
            "'coll-train: ': %s",
            what, e);
  cr_assert(th_one_line(e), "%s: more than one line: %s", what, e);
  cr_assert(strstr(e, needle), "%s: the message does not mention '%s': %s", what, needle, e);
  cr_assert(o[0] == 0, "%s: wrote to stdout: %s", what, o);
  cr_log_info("refused %s: %s", what, e);
  unlink(out), unlink(errp);
  free(e), free(o), free(out), free(errp);
}

/* Files a and b exist and hold the same bytes. */
static inline void th_assert_same_file(const char *a, const char *b) {
  size_t na = 0, nb = 0;
  char *x = th_read(a, &na), *y = th_read(b, &nb);
  cr_assert(x && y, "missing %s", x ? b : a);
  cr_assert(na == nb && memcmp(x, y, na) == 0, "%s (%zu bytes) and %s (%zu bytes) differ", a, na, b,
            nb);
  free(x);
  free(y);
}

/* Shard (t, s) of the tp x dp checkpoint ckpt_<step>.bin in dir (checkpoint.c's name). */
static inline char *th_shard_path(const char *dir, long step, int t, int s, int tp, int dp) {
  return th_fmt("%s/ckpt_%08ld.bin.shard%d.%dof%dx%d", dir, step, t, s, tp, dp);
}

/* Checkpoint ckpt_<step>.bin (its manifest and the tp x dp shards) in dirs a and b is byte
 * for byte the same. */
static inline void th_assert_same_checkpoint(const char *a, const char *b, long step, int tp,
                                             int dp) {
  for (int i = 0; i <= tp * dp; i++) {
    char *x = i < tp * dp ? th_shard_path(a, step, i / dp, i % dp, tp, dp)
                          : th_fmt("%s/ckpt_%08ld.bin", a, step);
    char *y = i < tp * dp ? th_shard_path(b, step, i / dp, i % dp, tp, dp)
                          : th_fmt("%s/ckpt_%08ld.bin", b, step);
    th_assert_same_file(x, y);
    free(x), free(y);
  }
}

/* The highest step k of dir's ckpt_<k>.bin manifests (-1: none); fails unless its tp x dp
 * shards are there too. With strict, fails on anything in dir but manifests and shards of
 * that grid beside their manifest: a temp file left behind would mean a checkpoint was not
 * written atomically (not for runs whose killed rank may die while writing its shard). */
static inline long th_last_checkpoint(const char *dir, int tp, int dp, int strict) {
  DIR *d = opendir(dir);
  cr_assert(d, "%s: %s", dir, strerror(errno));
  long best = -1;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    long k;
    char tail[8];
    int manifest = strlen(e->d_name) == strlen("ckpt_00000000.bin") &&
                   sscanf(e->d_name, "ckpt_%8ld.%7s", &k, tail) == 2 && !strcmp(tail, "bin");
    int shard = 0; /* one of the tp x dp shard names of its step */
    if (!manifest && sscanf(e->d_name, "ckpt_%8ld", &k) == 1)
      for (int i = 0; i < tp * dp && !shard; i++) {
        char *p = th_shard_path(".", k, i / dp, i % dp, tp, dp);
        shard = !strcmp(p + 2, e->d_name);
        free(p);
      }
    if (shard) { /* a shard without its manifest is not a checkpoint either */
      char *m = th_fmt("%s/ckpt_%08ld.bin", dir, k);
      struct stat st;
      shard = stat(m, &st) == 0;
      free(m);
    }
    cr_assert(manifest || shard || !strict,
              "%s holds %s, which is not part of a complete "
              "checkpoint",
              dir, e->d_name);
    if (manifest) best = k > best ? k : best;
  }
  closedir(d);
  for (int i = 0; best >= 0 && i < tp * dp; i++) {
    char *p = th_shard_path(dir, best, i / dp, i % dp, tp, dp);
    struct stat st;
    cr_assert(stat(p, &st) == 0, "checkpoint %ld has a manifest but no %s", best, p);
    free(p);
  }
  return best;
}

#endif
