/* test_coll_cuda.c — device buffers, the CUDA kernels, cuda_ipc and cudaStream_t ordering.
 *
 * Pure parts run everywhere: pointer classification of host memory, the kernel
 * dispatch table, the sentences for device buffers that cannot run, the per-pair
 * transport selection (cuda_ipc or none, symmetric), and a communicator built with no
 * GPU still running host buffers.  Device parts skip with a message when no GPU is
 * usable: the kernels against reduce.c over every dtype × op (special values
 * included), and the whole correctness matrix on 2 and 4 ranks sharing the GPUs
 * (rank % device count), where every device result is compared with the host result of
 * the same call on the same communicator, and the host result of int32 sum is checked
 * independently.  The two need not run the same algorithm: a small host call takes the
 * one-shot path (reduced in rank order), a device call a ring, tree or recursive
 * doubling (another order).  The inputs are chosen so that order cannot matter — values
 * on a 1/8 grid, whose sums are exact in every float type (bfloat16's on a narrower
 * range) — except products of float16 and bfloat16, and of float32 from 7 ranks, which
 * round differently in another order: those are compared within the rounding of n-1
 * products (n ulps), everything else bit for bit.
 *
 * CUDA must never be initialised in a process that later forks ranks (the children
 * would inherit a driver they cannot use), so the multi-rank tests probe for a GPU in
 * a throw-away child first and only the ranks touch CUDA.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll_config.h"
#include "algo.h"
#include "cuda_internal.h"
#include "coll_test.h"
#include "device_cuda.h"
#include "device_ops.h"
#include "internal.h"
#include "reduce.h"

#if COLL_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "coll_cuda.h"
#include "coll_trace.h"
#include "cuda_kernels.h"
#endif

/* ---- pure parts ---------------------------------------------------------------------- */

static int static_var = 7;

Test(cuda, classify_host_pointers) {
  int stack_var = 1, dev = 42;
  void *heap = malloc(64);
  cr_assert_eq(coll_cuda_classify(NULL, &dev), COLL_MEM_NONE);
  cr_assert_eq(dev, -1);
  cr_assert_eq(coll_cuda_classify(&stack_var, &dev), COLL_MEM_HOST, "stack memory is host");
  cr_assert_eq(coll_cuda_classify(heap, &dev), COLL_MEM_HOST, "heap memory is host");
  cr_assert_eq(coll_cuda_classify(&static_var, &dev), COLL_MEM_HOST, "static memory is host");
  cr_assert_eq(dev, -1);
  free(heap);
  if (!coll_cuda_available())
    cr_assert_neq(coll_cuda_unavailable_reason()[0], 0, "no CUDA must come with a reason");
}

/* ---- is the driver loaded (driver.c): checked against the loader's own list ------------ */

static int find_driver(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size, (void)arg;
  const char *slash = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
  const char *base = slash ? slash + 1 : info->dlpi_name;
  return base && strncmp(base, "libcuda.so", 10) == 0;
}
static bool driver_in_list(void) { return dl_iterate_phdr(find_driver, NULL) != 0; }

/* test/cuda/libcoll_fake_object.so, copied to `to` (a new file: the loader maps it as a new
 * object, whatever its name). */
static void copy_fake_object(const char *to) {
  const char *dir = getenv("COLL_TEST_BUILD_DIR");
  cr_assert(dir && *dir, "COLL_TEST_BUILD_DIR is not set (run through meson test)");
  char from[PATH_MAX];
  snprintf(from, sizeof from, "%s/test/cuda/libcoll_fake_object.so", dir);
  FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
  cr_assert(in && out, "copying %s to %s", from, to);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) cr_assert_eq(fwrite(buf, 1, n, out), n);
  fclose(in);
  cr_assert_eq(fclose(out), 0);
}

Test(cuda, driver_seen_when_loaded) {
  char dir[] = "/tmp/coll_driver_XXXXXX", lib[PATH_MAX + 32], drv[PATH_MAX + 32];
  cr_assert(mkdtemp(dir) != NULL);
  snprintf(lib, sizeof lib, "%s/libplugin.so", dir);
  snprintf(drv, sizeof drv, "%s/libcuda.so.1", dir);
  copy_fake_object(lib);
  copy_fake_object(drv);
  bool before = driver_in_list(); /* true only where something loaded the real one */
  cr_assert_eq(coll_cuda_driver_loaded(), before);
  cr_assert_eq(coll_cuda_driver_loaded(), before, "asked again, nothing loaded between");
  /* Ordinary objects loaded and closed (the one libcoll pinned as the list's last stays
   * mapped after dlclose, the others go): the answer does not move. */
  for (int i = 0; i < 3; i++) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    cr_assert(h != NULL, "%s", dlerror());
    cr_assert_eq(coll_cuda_driver_loaded(), before);
    dlclose(h);
    cr_assert_eq(coll_cuda_driver_loaded(), before);
  }
  /* The driver, loaded after libcoll first looked: seen at the next question, and from
   * then on. */
  void *d = dlopen(drv, RTLD_NOW | RTLD_LOCAL);
  cr_assert(d != NULL, "%s", dlerror());
  cr_assert(driver_in_list());
  cr_assert(coll_cuda_driver_loaded(), "a driver loaded after the first question is seen");
  cr_assert(coll_cuda_driver_loaded(), "and stays seen");
  unlink(lib), unlink(drv), rmdir(dir); /* the mappings outlive the files */
}

/* Threads asking all the time while the main thread loads and closes objects, then the
 * driver: every answer before the driver is "no", and every question asked after the
 * driver's dlopen returned (published to the threads by an atomic flag) is "yes". */
static _Atomic int loader_phase; /* 0 ordinary objects, 1 the driver is loaded */
static bool before_driver;
static void *ask_loop(void *arg) {
  long *wrong = arg;
  for (long after = 0; after < 100000;) {
    int phase = atomic_load(&loader_phase);
    bool got = coll_cuda_driver_loaded();
    /* Before the flag a "yes" may be right (the dlopen may have just finished); a "no"
     * is wrong once the flag is up, or where the driver was there all along. */
    if ((phase == 1 || before_driver) && !got) (*wrong)++;
    after += phase == 1;
  }
  return NULL;
}

Test(cuda, driver_check_while_loading, .timeout = 120) {
  char dir[] = "/tmp/coll_driver_XXXXXX", path[PATH_MAX + 32];
  cr_assert(mkdtemp(dir) != NULL);
  before_driver = driver_in_list();
  atomic_store(&loader_phase, 0);
  pthread_t t[2];
  long wrong[2] = {0, 0};
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&t[i], NULL, ask_loop, &wrong[i]), 0);
  for (int i = 0; i < 40; i++) { /* 40 new objects, each a new last object in the list */
    snprintf(path, sizeof path, "%s/libplugin%d.so", dir, i);
    copy_fake_object(path);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert(h != NULL, "%s", dlerror());
    if (i % 2) dlclose(h);
    unlink(path);
  }
  snprintf(path, sizeof path, "%s/libcuda.so.1", dir);
  copy_fake_object(path);
  cr_assert(dlopen(path, RTLD_NOW | RTLD_LOCAL) != NULL, "%s", dlerror());
  unlink(path);
  atomic_store(&loader_phase, 1);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  rmdir(dir);
  cr_assert_eq(wrong[0] + wrong[1], 0, "%ld answers were wrong", wrong[0] + wrong[1]);
  cr_assert(coll_cuda_driver_loaded());
}

Test(cuda, kernel_table_complete) {
#if COLL_HAVE_CUDA
  for (int d = 0; d < COLL_NUM_DTYPES; d++) {
    for (int op = 0; op < COLL_NUM_OPS; op++)
      cr_assert(coll_cuda_kernel_present(d, op), "no device kernel for %s %s",
                coll_dtype_name((coll_dtype)d), coll_op_name((coll_op)op));
    cr_assert(coll_cuda_kernel_present(d, -1), "no device avg kernel for %s",
              coll_dtype_name((coll_dtype)d));
  }
  cr_assert_not(coll_cuda_kernel_present(COLL_NUM_DTYPES, 0));
  cr_assert_not(coll_cuda_kernel_present(0, COLL_NUM_OPS));
  cr_assert_not(coll_cuda_kernel_present(-1, 0));
  /* Invalid arguments are refused by the launcher itself, before any CUDA call. */
  cr_assert_neq(coll_cuda_launch_reduce(NULL, NULL, NULL, 1, COLL_NUM_DTYPES, 0, NULL), 0);
  cr_assert_neq(coll_cuda_launch_avg(NULL, 1, -1, 2, NULL), 0);
  cr_assert_eq(coll_cuda_launch_reduce(NULL, NULL, NULL, 0, COLL_FLOAT32, COLL_SUM, NULL), 0,
               "n == 0 launches nothing");
#else
  cr_skip_test("this build has no CUDA (nvcc was not found): no device kernel table");
#endif
}

Test(cuda, device_buffer_sentences) {
  const char *why = "no usable CUDA driver or GPU (cudaGetDeviceCount: cudaErrorNoDevice)";
  /* device buffers, CUDA unavailable */
  cr_assert_eq(coll_cuda_check_kinds(NULL, "coll_all_reduce", COLL_MEM_DEVICE, 0, COLL_MEM_DEVICE,
                                     0, -1, why),
               COLL_ERR_UNSUPPORTED);
  const char *s = coll_comm_last_error(NULL);
  cr_assert(strstr(s, "coll_all_reduce") && strstr(s, "CUDA device memory") && strstr(s, why),
            "sentence: %s", s);
  /* one device buffer (the other NULL) is enough to need the device path */
  cr_assert_eq(coll_cuda_check_kinds(NULL, "coll_reduce", COLL_MEM_DEVICE, 1, COLL_MEM_NONE, -1, -1,
                                     why),
               COLL_ERR_UNSUPPORTED);
  cr_assert(strstr(coll_comm_last_error(NULL), "GPU 1"));
  /* mixed host and device */
  cr_assert_eq(coll_cuda_check_kinds(NULL, "coll_all_gather", COLL_MEM_HOST, -1, COLL_MEM_DEVICE, 0,
                                     0, NULL),
               COLL_ERR_INVALID_ARG);
  s = coll_comm_last_error(NULL);
  cr_assert(strstr(s, "sendbuf is host memory but recvbuf is device memory"), "sentence: %s", s);
  /* two GPUs */
  cr_assert_eq(coll_cuda_check_kinds(NULL, "coll_broadcast", COLL_MEM_DEVICE, 0, COLL_MEM_DEVICE, 1,
                                     0, NULL),
               COLL_ERR_INVALID_ARG);
  cr_assert(strstr(coll_comm_last_error(NULL), "GPU 0 but recvbuf on GPU 1"));
  /* not the communicator's GPU */
  cr_assert_eq(coll_cuda_check_kinds(NULL, "coll_all_reduce", COLL_MEM_DEVICE, 1, COLL_MEM_DEVICE,
                                     1, 0, NULL),
               COLL_ERR_INVALID_ARG);
  cr_assert(strstr(coll_comm_last_error(NULL), "cudaSetDevice"));
  /* what is allowed */
  cr_assert_eq(coll_cuda_check_kinds(NULL, "f", COLL_MEM_HOST, -1, COLL_MEM_HOST, -1, -1, why),
               COLL_OK, "host buffers never need CUDA");
  cr_assert_eq(coll_cuda_check_kinds(NULL, "f", COLL_MEM_NONE, -1, COLL_MEM_NONE, -1, -1, why),
               COLL_OK);
  cr_assert_eq(coll_cuda_check_kinds(NULL, "f", COLL_MEM_DEVICE, 2, COLL_MEM_DEVICE, 2, 2, NULL),
               COLL_OK);
  cr_assert_eq(coll_cuda_check_kinds(NULL, "f", COLL_MEM_NONE, -1, COLL_MEM_DEVICE, 0, 0, NULL),
               COLL_OK);
}

static coll_cuda_view view(int pid, uint64_t host, uint32_t pci) {
  coll_cuda_view v = {.ok = true, .pid = pid, .host_id = host, .pci = pci};
  return v;
}

Test(cuda, select_per_pair) {
  char why[160];
  coll_cuda_view a = view(100, 1, 0x100), b = view(101, 1, 0x100);
  cr_assert_eq(coll_cuda_select(&a, &b, why, sizeof why), COLL_SEL_CUDA_IPC,
               "two processes on one GPU: %s", why);
  cr_assert_str_eq(why, "cuda_ipc");
  coll_cuda_view c = view(102, 2, 0x100);
  cr_assert_eq(coll_cuda_select(&a, &c, why, sizeof why), COLL_SEL_NONE);
  cr_assert(strstr(why, "different hosts"), "%s", why);
  coll_cuda_view d = view(100, 1, 0x100);
  cr_assert_eq(coll_cuda_select(&a, &d, why, sizeof why), COLL_SEL_NONE);
  cr_assert(strstr(why, "same process"), "%s", why);
  coll_cuda_view e = view(103, 1, 0x200);
  cr_assert_eq(coll_cuda_select(&a, &e, why, sizeof why), COLL_SEL_NONE);
  cr_assert(strstr(why, "cannot access each other"), "%s", why);
  /* peer access one way only is not enough: both ends must agree */
  a.peers[a.npeers++] = 0x200;
  cr_assert_eq(coll_cuda_select(&a, &e, why, sizeof why), COLL_SEL_NONE);
  e.peers[e.npeers++] = 0x100;
  cr_assert_eq(coll_cuda_select(&a, &e, why, sizeof why), COLL_SEL_CUDA_IPC, "%s", why);
  coll_cuda_view f = b;
  f.ok = false;
  cr_assert_eq(coll_cuda_select(&a, &f, why, sizeof why), COLL_SEL_NONE);
  cr_assert(strstr(why, "no CUDA device path"), "%s", why);
  /* symmetric over a family of views */
  coll_cuda_view vs[6] = {view(1, 1, 0x100), view(2, 1, 0x200), view(3, 1, 0x100),
                          view(4, 2, 0x100), view(1, 1, 0x300), view(5, 1, 0x300)};
  vs[1].peers[vs[1].npeers++] = 0x300;
  vs[4].peers[vs[4].npeers++] = 0x200;
  vs[5].peers[vs[5].npeers++] = 0x200;
  vs[5].ok = true;
  for (int i = 0; i < 6; i++)
    for (int j = 0; j < 6; j++)
      cr_assert_eq(coll_cuda_select(&vs[i], &vs[j], NULL, 0),
                   coll_cuda_select(&vs[j], &vs[i], NULL, 0), "not symmetric for %d, %d", i, j);
  /* a blob that is not cuda_ipc's gives a view that never selects */
  unsigned char junk[COLL_CONN_BLOB];
  memset(junk, 0x5a, sizeof junk);
  coll_cuda_view g;
  cr_assert_not(coll_cuda_ipc_blob_view(junk, &g));
  cr_assert_not(g.ok);
}

/* A host collective on a communicator built where CUDA is unusable (or turned off):
 * it runs as before, and the communicator knows why it has no device path. */
static int host_rank(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  int32_t v[5], want = 0;
  for (int r = 0; r < n; r++) want += r + 1;
  for (int i = 0; i < 5; i++) v[i] = rank + 1;
  if (coll_all_reduce(v, v, 5, COLL_INT32, COLL_SUM, comm, NULL) != COLL_OK)
    return t_failf("all_reduce: %s", coll_comm_last_error(comm));
  for (int i = 0; i < 5; i++)
    if (v[i] != want) return t_failf("element %d is %d, expected %d", i, v[i], want);
  if (!coll_cuda_built()) { /* the host device table: no CUDA state at all */
    if (comm->dev != &coll_device_host || comm->cuda)
      return t_failf("a build without CUDA runs on the host device table");
    return 0;
  }
  if (comm->dev != coll_cuda_device()) return t_failf("a build with CUDA has the CUDA table");
  if (!comm->cuda) return t_failf("no CUDA state on the communicator");
  if (comm->cuda->ready) return t_failf("COLL_CUDA=off, yet the device path is ready");
  if (coll_cuda_probed()) return t_failf("a host-only job probed for CUDA");
  return 0;
}

Test(cuda, host_path_with_cuda_off, .timeout = 60) {
  setenv("COLL_CUDA", "off", 1);
  char why[256];
  int rc = t_launch(3, host_rank, NULL, 50000, why, sizeof why);
  cr_assert_eq(rc, 0, "%s", why);
}

static int host_rank_auto(coll_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  double v = rank + 0.5, want = 0;
  for (int r = 0; r < n; r++) want += r + 0.5;
  if (coll_all_reduce(&v, &v, 1, COLL_FLOAT64, COLL_SUM, comm, NULL) != COLL_OK)
    return t_failf("all_reduce: %s", coll_comm_last_error(comm));
  if (v != want) return t_failf("got %g, expected %g", v, want);
  /* Host buffers in a process that never loaded the CUDA driver: no CUDA call at all —
   * no probe, no context, no device FIFO — whether or not the machine has a GPU. */
  if (coll_cuda_probed()) return t_failf("a host-only job probed for CUDA");
  if (!coll_cuda_built()
          ? comm->dev != &coll_device_host || comm->cuda
          : atomic_load(&comm->cuda->tried) || comm->cuda->ready || comm->cuda->stream)
    return t_failf("a host-only job set a device path up");
  float g[8] = {0};
  g[rank] = (float)rank + 1; /* in place: this rank's block is already in the output */
  if (n > 8 || coll_all_gather(&g[rank], g, 1, COLL_FLOAT32, comm, NULL) != COLL_OK)
    return t_failf("all_gather: %s", coll_comm_last_error(comm));
  for (int r = 0; r < n; r++)
    if (g[r] != (float)r + 1) return t_failf("all_gather: block %d is %g", r, g[r]);
  if (coll_cuda_probed()) return t_failf("a host-only job probed for CUDA");
  return 0;
}

Test(cuda, host_path_with_cuda_auto, .timeout = 60) {
  unsetenv("COLL_CUDA");
  char why[256];
  int rc = t_launch(2, host_rank_auto, NULL, 50000, why, sizeof why);
  cr_assert_eq(rc, 0, "%s", why);
  T_ASSERT_NO_LEFTOVERS("after the job");
}

/* The device data path's rows (algo/device.c) as the table and the tuner see them, with
 * no GPU: they serve only device buffers that the path mapped for the call (w->peer_ok);
 * the tuner prices them by their own formulas — one-shot for small all-reduces, two-shot
 * from the crossover on, which comes sooner the more ranks read N inputs each; a
 * communicator whose path is not up (peer_ok false) never gets them. */
static coll_algo device_choice(struct coll_comm *c, coll_coll_kind k, size_t count, bool peer_ok) {
  coll_work w = {
      .coll = k, .count = count, .dtype = COLL_FLOAT32, .device = true, .peer_ok = peer_ok};
  return coll_tune_choose(c, &w, 4);
}

Test(cuda, device_rows_priced_and_chosen) {
  struct coll_comm *c = calloc(1, sizeof *c);
  struct coll_peer *cc = calloc(1, sizeof *cc);
  cr_assert(c && cc);
  c->peer = cc;
  cc->ok = true;
  const coll_algo_entry *one = coll_algo_get(COLL_ALGO_DEV_ONESHOT);
  const coll_algo_entry *two = coll_algo_get(COLL_ALGO_DEV_TWOSHOT);
  cr_assert(one->device_only && two->device_only && one->run && two->run && !one->plan);
  cr_assert(coll_algo_serves(COLL_ALGO_DEV_ONESHOT, COLL_COLL_ALL_GATHER, 4));
  cr_assert(!coll_algo_serves(COLL_ALGO_DEV_TWOSHOT, COLL_COLL_ALL_GATHER, 4));
  cr_assert(!coll_algo_serves(COLL_ALGO_DEV_ONESHOT, COLL_COLL_ALL_TO_ALL, 4));
  /* host buffers, or device buffers the path did not map: not usable */
  c->nranks = 2;
  coll_work host = {.coll = COLL_COLL_ALL_REDUCE, .count = 8, .dtype = COLL_FLOAT32};
  coll_work unmapped = host, mapped = host;
  unmapped.device = true;
  mapped.device = mapped.peer_ok = true;
  cr_assert(!coll_algo_usable(one, c, &host, 4));
  cr_assert(!coll_algo_usable(one, c, &unmapped, 4));
  cr_assert(coll_algo_usable(one, c, &mapped, 4));
  /* the choice by size and ranks */
  cr_assert_eq(device_choice(c, COLL_COLL_ALL_REDUCE, 2, true), COLL_ALGO_DEV_ONESHOT);
  cr_assert_eq(device_choice(c, COLL_COLL_ALL_REDUCE, (256u << 20) / 4, true),
               COLL_ALGO_DEV_TWOSHOT);
  cr_assert_eq(device_choice(c, COLL_COLL_ALL_GATHER, (64u << 20) / 4, true),
               COLL_ALGO_DEV_ONESHOT);
  double s1, s2, s8a, s8b;
  char f[160];
  cr_assert_eq(coll_dev_oneshot_cost(COLL_COLL_ALL_REDUCE, 16e6, &(coll_cost_model){.p = 2}, &s1, f,
                                     sizeof f),
               COLL_OK);
  cr_assert_eq(coll_dev_twoshot_cost(COLL_COLL_ALL_REDUCE, 16e6, &(coll_cost_model){.p = 2}, &s2, f,
                                     sizeof f),
               COLL_OK);
  cr_assert(s1 < s2, "2 ranks, 16 MB: one-shot %g s should beat two-shot %g s", s1, s2);
  cr_assert_eq(coll_dev_oneshot_cost(COLL_COLL_ALL_REDUCE, 16e6, &(coll_cost_model){.p = 8}, &s8a,
                                     f, sizeof f),
               COLL_OK);
  cr_assert_eq(coll_dev_twoshot_cost(COLL_COLL_ALL_REDUCE, 16e6, &(coll_cost_model){.p = 8}, &s8b,
                                     f, sizeof f),
               COLL_OK);
  cr_assert(s8b < s8a, "8 ranks, 16 MB: two-shot %g s should beat one-shot %g s", s8b, s8a);
  cr_assert(strstr(f, "barriers"), "the formula names its parts: %s", f);
  cr_assert_eq(coll_dev_twoshot_cost(COLL_COLL_BROADCAST, 1e6, &(coll_cost_model){.p = 2}, &s1, f,
                                     sizeof f),
               COLL_ERR_INVALID_ARG);
  c->nranks = 8;
  cr_assert_eq(device_choice(c, COLL_COLL_ALL_REDUCE, (16u << 20) / 4, true),
               COLL_ALGO_DEV_TWOSHOT);
  /* Every rank on one GPU: the one-GPU row, whose single kernel neither time-slices nor
   * moves a byte twice, at every size; the per-rank rows priced as they ran on one H200
   * (~100 us a barrier for each extra rank, every rank's bytes through one memory). */
  const coll_algo_entry *onegpu = coll_algo_get(COLL_ALGO_DEV_ONEGPU);
  cr_assert(onegpu->device_only && onegpu->run && !onegpu->plan);
  cr_assert(!coll_algo_usable(onegpu, c, &mapped, 4), "not one GPU: not usable");
  c->dev_gpus = 1;
  c->nranks = 2;
  cr_assert(coll_algo_usable(onegpu, c, &mapped, 4));
  cr_assert(!coll_algo_usable(onegpu, c, &unmapped, 4));
  const coll_coll_kind five[] = {COLL_COLL_BROADCAST, COLL_COLL_REDUCE, COLL_COLL_ALL_REDUCE,
                                 COLL_COLL_REDUCE_SCATTER, COLL_COLL_ALL_GATHER};
  for (size_t i = 0; i < sizeof five / sizeof *five; i++) {
    cr_assert_eq(device_choice(c, five[i], 2, true), COLL_ALGO_DEV_ONEGPU, "%s",
                 coll_coll_name(five[i]));
    cr_assert_eq(device_choice(c, five[i], (256u << 20) / 4, true), COLL_ALGO_DEV_ONEGPU, "%s",
                 coll_coll_name(five[i]));
  }
  double sh1, sh2, og;
  coll_cost_model one_h200 = {.p = 2, .gpus = 1};
  cr_assert_eq(coll_dev_oneshot_cost(COLL_COLL_ALL_REDUCE, 8, &one_h200, &sh1, f, sizeof f),
               COLL_OK);
  cr_assert(strstr(f, "time-sliced"), "%s", f);
  cr_assert(sh1 > 150e-6 && sh1 < 250e-6, "8 B on one GPU, one-shot: %g s (measured 168-225 us)",
            sh1);
  cr_assert_eq(coll_dev_twoshot_cost(COLL_COLL_ALL_REDUCE, 268435456.0, &one_h200, &sh2, f,
                                     sizeof f),
               COLL_OK);
  cr_assert(sh2 > 550e-6 && sh2 < 800e-6,
            "256 MiB on one GPU, two-shot: %g s (measured 700-800 us)", sh2);
  cr_assert_eq(coll_dev_onegpu_cost(COLL_COLL_ALL_REDUCE, 268435456.0, &one_h200, &og, f, sizeof f),
               COLL_OK);
  cr_assert(og < sh2 / 2, "one kernel %g s against two two-shots %g s", og, sh2);
  cr_assert_eq(coll_dev_onegpu_cost(COLL_COLL_ALL_TO_ALL, 1e6, &one_h200, &og, f, sizeof f),
               COLL_ERR_INVALID_ARG);
  c->dev_gpus = 0;
  /* more ranks than one kernel reads, or a path that is not up: the host-driven rows */
  c->nranks = COLL_PEER_MAX + 1;
  cr_assert(!coll_algo_usable(one, c, &mapped, 4));
  cr_assert(!coll_algo_usable(onegpu, c, &mapped, 4));
  c->nranks = 2;
  cc->ok = false;
  cr_assert(!coll_algo_usable(one, c, &mapped, 4));
  coll_algo a = device_choice(c, COLL_COLL_ALL_REDUCE, 2, true);
  cr_assert(!coll_algo_get(a) || !coll_algo_get(a)->device_only, "chose %s", coll_algo_name(a));
  free(cc);
  free(c);
}

#if COLL_HAVE_CUDA
Test(cuda, stream_create_without_gpu) {
  coll_stream_t s = NULL;
  if (coll_cuda_available()) {
    /* With a GPU: a wrapped default stream gives back what it wraps. */
    cr_assert_eq(coll_stream_create_cuda(&s, 0), COLL_OK, "%s", coll_comm_last_error(NULL));
    cudaStream_t cs = (cudaStream_t)1;
    cr_assert_eq(coll_stream_get_cuda(s, &cs), COLL_OK);
    cr_assert_eq(cs, (cudaStream_t)0);
    cr_assert_eq(coll_stream_destroy(s), COLL_OK);
    return;
  }
  cr_assert_eq(coll_stream_create_cuda(&s, 0), COLL_ERR_UNSUPPORTED);
  cr_assert_null(s);
  cr_assert(strstr(coll_comm_last_error(NULL), coll_cuda_unavailable_reason()), "%s",
            coll_comm_last_error(NULL));
  coll_stream_t h;
  cr_assert_eq(coll_stream_create(&h), COLL_OK);
  cudaStream_t cs;
  cr_assert_eq(coll_stream_get_cuda(h, &cs), COLL_ERR_INVALID_ARG, "a host stream wraps nothing");
  coll_stream_destroy(h);
}
#endif

/* ---- device parts ------------------------------------------------------------------------ */

#if COLL_HAVE_CUDA
/* Asks a child process whether a GPU is usable, so this process never initialises CUDA. */
static bool gpu_in_child(char *why, size_t len) {
  int fds[2];
  if (pipe(fds) != 0) {
    snprintf(why, len, "pipe failed");
    return false;
  }
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    char msg[200];
    snprintf(msg, sizeof msg, "%s", e != cudaSuccess ? cudaGetErrorString(e) : n ? "" : "0 GPUs");
    if (write(fds[1], msg, strlen(msg) + 1) < 0) _exit(2);
    _exit(e == cudaSuccess && n > 0 ? 0 : 1);
  }
  close(fds[1]);
  char msg[200] = {0};
  ssize_t got = read(fds[0], msg, sizeof msg - 1);
  (void)got;
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  snprintf(why, len, "no usable GPU: %s", msg[0] ? msg : "the probe failed");
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static uint64_t mixh(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

/* Random bits with the special values every float kernel must agree on. */
static void fill_special(void *buf, size_t n, coll_dtype d, uint64_t seed) {
  size_t es = coll_dtype_size(d);
  uint8_t *p = buf;
  for (size_t i = 0; i < n; i++) {
    uint64_t h = mixh(seed * 0x9e3779b97f4a7c15ull + i);
    memcpy(p + i * es, &h, es);
    if (d == COLL_FLOAT32 && h % 8 == 0) {
      static const uint32_t sp[] = {0x7fc00000u, 0x7f800001u, 0x7f800000u, 0xff800000u,
                                    0x80000000u, 0u,          0x00000001u, 0x807fffffu};
      memcpy(p + i * es, &sp[(h >> 8) % 8], 4);
    } else if ((d == COLL_FLOAT16 || d == COLL_BFLOAT16) && h % 8 == 0) {
      static const uint16_t sh[] = {0x7e00u, 0x7c01u, 0x7c00u, 0xfc00u, 0x8000u, 0u, 1u, 0x7bffu};
      static const uint16_t sb[] = {0x7fc0u, 0x7f81u, 0x7f80u, 0xff80u, 0x8000u, 0u, 1u, 0x7f7fu};
      memcpy(p + i * es, d == COLL_FLOAT16 ? &sh[(h >> 8) % 8] : &sb[(h >> 8) % 8], 2);
    } else if (d == COLL_FLOAT64 && h % 8 == 0) {
      static const uint64_t sd[] = {0x7ff8000000000000ull,
                                    0x7ff0000000000001ull,
                                    0x7ff0000000000000ull,
                                    0x8000000000000000ull,
                                    0,
                                    1};
      memcpy(p + i * es, &sd[(h >> 8) % 6], 8);
    }
  }
}

static bool is_nan_elem(const uint8_t *p, coll_dtype d) {
  switch (d) {
  case COLL_FLOAT32: {
    float f;
    memcpy(&f, p, 4);
    return f != f;
  }
  case COLL_FLOAT64: {
    double f;
    memcpy(&f, p, 8);
    return f != f;
  }
  case COLL_FLOAT16: {
    uint16_t h;
    memcpy(&h, p, 2);
    return (h & 0x7fff) > 0x7c00;
  }
  case COLL_BFLOAT16: {
    uint16_t h;
    memcpy(&h, p, 2);
    return (h & 0x7fff) > 0x7f80;
  }
  default: return false;
  }
}

/* Bit for bit, except the payload of a NaN made by arithmetic (sum, prod, avg): IEEE
 * leaves it to the hardware (x86 keeps an operand's, NVIDIA GPUs return the canonical
 * one).  min/max pick an operand's NaN in integer code and must match exactly. */
static size_t first_diff(const uint8_t *a, const uint8_t *b, size_t n, coll_dtype d, bool arith) {
  size_t es = coll_dtype_size(d);
  for (size_t i = 0; i < n; i++) {
    if (memcmp(a + i * es, b + i * es, es) == 0) continue;
    if (arith && is_nan_elem(a + i * es, d) && is_nan_elem(b + i * es, d)) continue;
    return i;
  }
  return n;
}

/* For products, whose rounding depends on the order of the n-1 multiplications once
 * they need more bits than the type keeps: the inputs near 1 carry up to 4 significant
 * bits each, so n of them need up to 4n, more than float16 (11), bfloat16 (8) and, from 7
 * ranks, float32 (24; seen on the GPU at 8 ranks: 1 ulp apart) keep.  Equal bits, or
 * within n units in the last place (2^-10 relative for float16, 2^-7 for bfloat16, 2^-23
 * for float32) of the host result. */
static size_t first_far(const uint8_t *a, const uint8_t *b, size_t n, coll_dtype d, int nranks) {
  double ulp = d == COLL_FLOAT16 ? 1.0 / 1024 : d == COLL_BFLOAT16 ? 1.0 / 128 : 1.0 / 8388608;
  size_t es = coll_dtype_size(d);
  for (size_t i = 0; i < n; i++) {
    if (memcmp(a + es * i, b + es * i, es) == 0) continue;
    double fx, fy;
    if (d == COLL_FLOAT32) {
      float x, y;
      memcpy(&x, a + 4 * i, 4);
      memcpy(&y, b + 4 * i, 4);
      fx = x, fy = y;
    } else {
      uint16_t x, y;
      memcpy(&x, a + 2 * i, 2);
      memcpy(&y, b + 2 * i, 2);
      fx = d == COLL_FLOAT16 ? coll_half_to_float(x) : coll_bf16_to_float(x);
      fy = d == COLL_FLOAT16 ? coll_half_to_float(y) : coll_bf16_to_float(y);
    }
    if (!(fabs(fx - fy) <= nranks * ulp * fabs(fx))) return i;
  }
  return n;
}

#define CK(call)                                                            \
  do {                                                                      \
    cudaError_t e_ = (call);                                                \
    cr_assert_eq(e_, cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_)); \
  } while (0)

Test(cuda, kernels_match_cpu, .timeout = 300) {
  if (!coll_cuda_available()) cr_skip_test("no GPU: %s", coll_cuda_unavailable_reason());
  const size_t sizes[] = {1, 7, 1000, 262147};
  size_t maxn = 262147, maxb = maxn * 8;
  uint8_t *a = malloc(maxb), *b = malloc(maxb), *cpu = malloc(maxb), *gpu = malloc(maxb);
  void *da, *db, *dd;
  CK(cudaMalloc(&da, maxb));
  CK(cudaMalloc(&db, maxb));
  CK(cudaMalloc(&dd, maxb));
  int checked = 0;
  for (int d = 0; d < COLL_NUM_DTYPES; d++)
    for (int op = 0; op < COLL_NUM_OPS; op++)
      for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        size_t n = sizes[si], bytes = n * coll_dtype_size((coll_dtype)d);
        fill_special(a, n, (coll_dtype)d, 1000u * (unsigned)d + (unsigned)op);
        fill_special(b, n, (coll_dtype)d, 7777u + 1000u * (unsigned)d + (unsigned)op);
        CK(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(db, b, bytes, cudaMemcpyHostToDevice));
        bool arith = op == COLL_SUM || op == COLL_PROD || op == COLL_AVG;
        /* out of place */
        coll_kernel_reduce(cpu, a, b, n, (coll_dtype)d, (coll_op)op);
        cr_assert_eq(coll_cuda_launch_reduce(dd, da, db, n, d, op, NULL), 0);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(gpu, dd, bytes, cudaMemcpyDeviceToHost));
        size_t i = first_diff(cpu, gpu, n, (coll_dtype)d, arith);
        cr_assert_eq(i, n, "%s %s n=%zu: element %zu differs", coll_dtype_name((coll_dtype)d),
                     coll_op_name((coll_op)op), n, i);
        /* in place (dst == a), then the average division on the result */
        cr_assert_eq(coll_cuda_launch_reduce(da, da, db, n, d, op, NULL), 0);
        coll_kernel_reduce(a, a, b, n, (coll_dtype)d, (coll_op)op);
        for (int nr = 2; nr <= 7; nr += 5) {
          memcpy(cpu, a, bytes);
          coll_kernel_avg(cpu, n, (coll_dtype)d, nr);
          CK(cudaMemcpy(dd, da, bytes, cudaMemcpyDeviceToDevice));
          cr_assert_eq(coll_cuda_launch_avg(dd, n, d, nr, NULL), 0);
          CK(cudaDeviceSynchronize());
          CK(cudaMemcpy(gpu, dd, bytes, cudaMemcpyDeviceToHost));
          i = first_diff(cpu, gpu, n, (coll_dtype)d, true);
          cr_assert_eq(i, n, "avg/%d after %s %s n=%zu: element %zu differs", nr,
                       coll_dtype_name((coll_dtype)d), coll_op_name((coll_op)op), n, i);
        }
        CK(cudaMemcpy(gpu, da, bytes, cudaMemcpyDeviceToHost));
        i = first_diff(a, gpu, n, (coll_dtype)d, arith);
        cr_assert_eq(i, n, "in place %s %s n=%zu: element %zu differs",
                     coll_dtype_name((coll_dtype)d), coll_op_name((coll_op)op), n, i);
        checked++;
      }
  cr_assert_eq(checked, COLL_NUM_DTYPES * COLL_NUM_OPS * 4);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dd);
  free(a);
  free(b);
  free(cpu);
  free(gpu);
}

/* ---- the device correctness matrix, ranks sharing the GPUs ------------------------------- */

typedef enum {
  C_ALL_REDUCE,
  C_REDUCE,
  C_BROADCAST,
  C_REDUCE_SCATTER,
  C_ALL_GATHER,
  C_SENDRECV,
  C_NUM
} mcoll;
static const char *mname[] = {"all_reduce",     "reduce",     "broadcast",
                              "reduce_scatter", "all_gather", "sendrecv"};

/* How the device calls are made: blocking, on a cudaStream_t, or on a coll_stream_t
 * (served by the progress thread on the communicator's own CUDA stream, as a trainer's
 * DDP posts its buckets). */
typedef enum { M_BLOCKING, M_CUDA_STREAM, M_HOST_STREAM } mmode;
typedef struct {
  mmode mode;
} marg;

/* A finite value exact in every dtype (a multiple of 1/8 in [-8, 8), or near 1 for
 * products), as bits of dtype d. */
static void gen(void *dst, size_t n, coll_dtype d, coll_op op, int rank, uint64_t seed) {
  size_t es = coll_dtype_size(d);
  for (size_t i = 0; i < n; i++) {
    uint64_t h = mixh(seed ^ mixh((uint64_t)rank * 0x9e37u + i));
    // bfloat16 keeps 8 significant bits: 8 ranks' sums of values in [-8, 8) on the 1/8
    // grid need 10 (seen on the GPU: 8-rank bfloat16 sums rounded in another order), so
    // its values are in [-2, 2), whose sums over 8 ranks need 8.
    double span = d == COLL_BFLOAT16 ? 32 : 128;
    double v = op == COLL_PROD
                   ? ((h % 2) ? 1.0 + (double)(h >> 8 & 3) / 8 : 1.0 - (double)(h >> 8 & 3) / 16)
                   : ((double)(h % (uint64_t)span) - span / 2) / 8;
    uint8_t *p = (uint8_t *)dst + i * es;
    switch (d) {
    case COLL_FLOAT32: {
      float f = (float)v;
      memcpy(p, &f, 4);
      break;
    }
    case COLL_FLOAT64: memcpy(p, &v, 8); break;
    case COLL_FLOAT16: {
      uint16_t x = coll_float_to_half((float)v);
      memcpy(p, &x, 2);
      break;
    }
    case COLL_BFLOAT16: {
      uint16_t x = coll_float_to_bf16((float)v);
      memcpy(p, &x, 2);
      break;
    }
    default: memcpy(p, &h, es); break;
    }
  }
}

typedef struct {
  coll_comm_t comm;
  int rank, n;
  cudaStream_t cs; /* M_CUDA_STREAM's */
  coll_stream_t s; /* M_CUDA_STREAM's, wrapping cs, or M_HOST_STREAM's */
  mmode mode;
  size_t cap; /* bytes per buffer */
  uint8_t *hs, *hr, *back;
  void *ds, *dr;
} mctx;

/* Runs collective c on (send, recv) with `st` (NULL: blocking). */
static coll_result call(mctx *m, mcoll c, const void *sb, void *rb, size_t count, coll_dtype d,
                        coll_op op, int root, coll_stream_t st) {
  int n = m->n, r = m->rank;
  switch (c) {
  case C_ALL_REDUCE: return coll_all_reduce(sb, rb, count, d, op, m->comm, st);
  case C_REDUCE: return coll_reduce(sb, r == root ? rb : NULL, count, d, op, root, m->comm, st);
  case C_BROADCAST: return coll_broadcast(sb, rb, count, d, root, m->comm, st);
  case C_REDUCE_SCATTER: return coll_reduce_scatter(sb, rb, count, d, op, m->comm, st);
  case C_ALL_GATHER: return coll_all_gather(sb, rb, count, d, m->comm, st);
  case C_SENDRECV:
    return coll_sendrecv(sb, count, (r + 1) % n, rb, count, (r + n - 1) % n, d, m->comm, st);
  default: return COLL_ERR_INTERNAL;
  }
}

/* One case: host run, device run, compare.  Returns 0 or 1 (with a message). */
static int one_case(mctx *m, mcoll c, coll_dtype d, coll_op op, size_t count, bool in_place,
                    int root, uint64_t seed) {
  int n = m->n, r = m->rank;
  size_t es = coll_dtype_size(d);
  size_t sendn = c == C_REDUCE_SCATTER ? count * (size_t)n : count;
  size_t recvn = c == C_ALL_GATHER ? count * (size_t)n : c == C_REDUCE_SCATTER ? count : count;
  size_t big = (sendn > recvn ? sendn : recvn) * es;
  if (big > m->cap) return t_failf("case too big");
  /* inputs: in place keeps them inside the receive buffer where the API puts them */
  memset(m->hr, 0xab, big);
  memset(m->hs, 0xcd, big);
  uint8_t *hs = m->hs, *hr = m->hr, *ds = m->ds, *dr = m->dr;
  if (in_place) {
    hs = hr;
    ds = dr;
    if (c == C_REDUCE_SCATTER) {
      hr = hs + (size_t)r * count * es;
      dr = ds + (size_t)r * count * es;
    } else if (c == C_ALL_GATHER) {
      hs = hr + (size_t)r * count * es;
      ds = dr + (size_t)r * count * es;
    }
  }
  gen(hs, sendn, d, op, r, seed);
  /* Uploaded on the stream the device call will run on: a call on a cudaStream_t is
   * ordered after that stream's work only (as NCCL's), and cudaMemcpy from pageable memory
   * may return before its DMA lands (on the legacy stream, which a non-blocking stream
   * does not wait for: the first GPU run read such inputs half-landed, 2026-11-30). */
  cudaStream_t up = m->mode == M_CUDA_STREAM ? m->cs : 0;
  cudaError_t e = cudaMemcpyAsync(m->dr, m->hr, big, cudaMemcpyHostToDevice, up);
  if (e == cudaSuccess && !in_place)
    e = cudaMemcpyAsync(m->ds, m->hs, big, cudaMemcpyHostToDevice, up);
  if (e != cudaSuccess) return t_failf("cudaMemcpyAsync: %s", cudaGetErrorString(e));
  coll_result res = call(m, c, hs, hr, count, d, op, root, NULL);
  if (res != COLL_OK) return t_failf("host %s: %s", mname[c], coll_comm_last_error(m->comm));
  if (m->mode == M_HOST_STREAM) {
    /* On a coll_stream_t: ordered after the uploads on the legacy stream (the event at
     * the call), complete when the stream says so. */
    res = call(m, c, ds, dr, count, d, op, root, m->s);
    if (res == COLL_OK) res = coll_stream_synchronize(m->s);
    if (res != COLL_OK)
      return t_failf("device %s on a coll_stream_t: %s", mname[c], coll_comm_last_error(m->comm));
    e = cudaMemcpy(m->back, m->dr, big, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return t_failf("copy back: %s", cudaGetErrorString(e));
  } else if (m->s) {
    /* Through the cudaStream_t: the result is copied back on the same stream, so the
     * copy must wait for the collective. */
    res = call(m, c, ds, dr, count, d, op, root, m->s);
    if (res != COLL_OK)
      return t_failf("device %s enqueue: %s", mname[c], coll_comm_last_error(m->comm));
    e = cudaMemcpyAsync(m->back, m->dr, big, cudaMemcpyDeviceToHost, m->cs);
    if (e == cudaSuccess) e = cudaStreamSynchronize(m->cs);
    if (e != cudaSuccess) return t_failf("copy back on the stream: %s", cudaGetErrorString(e));
    if ((res = coll_stream_query(m->s)) != COLL_OK)
      return t_failf("stream after cudaStreamSynchronize: %s (%s)", coll_result_string(res),
                     coll_comm_last_error(NULL));
  } else {
    res = call(m, c, ds, dr, count, d, op, root, NULL);
    if (res != COLL_OK) return t_failf("device %s: %s", mname[c], coll_comm_last_error(m->comm));
    e = cudaMemcpy(m->back, m->dr, big, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return t_failf("copy back: %s", cudaGetErrorString(e));
  }
  /* which path ran it: the device data path's rows unless COLL_ALGO named a host-driven
   * schedule (sendrecv always takes the host-driven path) */
  if (count > 0 && c != C_SENDRECV) {
    const char *want = getenv("COLL_ALGO") && strcmp(getenv("COLL_ALGO"), "ring") == 0 ? "ring"
                                                                                       : "dev_";
    const char *ran = coll_comm_last_algo(m->comm);
    if (!ran || strncmp(ran, want, strlen(want)) != 0)
      return t_failf("rank %d/%d: %s %s count %zu ran on %s, expected %s...", r, n, mname[c],
                     coll_dtype_name(d), count, ran ? ran : "(none)", want);
  }
  /* compare the whole receive buffer: results and the bytes that must stay untouched */
  size_t cmpn = big / es;
  bool rounds = op == COLL_PROD &&
                (d == COLL_FLOAT16 || d == COLL_BFLOAT16 || (d == COLL_FLOAT32 && n > 6)) &&
                (c == C_ALL_REDUCE || c == C_REDUCE || c == C_REDUCE_SCATTER);
  size_t i = rounds ? first_far(m->hr, m->back, cmpn, d, n)
                    : first_diff(m->hr, m->back, cmpn, d, false);
  if (i != cmpn) {
    size_t ndiff = 0, last = i;
    for (size_t k = i; k < cmpn; k++)
      if (memcmp(m->hr + k * es, m->back + k * es, es) != 0) ndiff++, last = k;
    uint64_t hv = 0, dv = 0;
    memcpy(&hv, m->hr + i * es, es < 8 ? es : 8);
    memcpy(&dv, m->back + i * es, es < 8 ? es : 8);
    return t_failf("rank %d/%d: %s %s %s count %zu %s root %d: device element %zu differs from "
                   "host (bits 0x%llx, host 0x%llx; %zu elements differ, the last %zu)",
                   r, n, mname[c], coll_dtype_name(d), coll_op_name(op), count,
                   in_place ? "in-place" : "out-of-place", root, i, (unsigned long long)dv,
                   (unsigned long long)hv, ndiff, last);
  }
  /* an independent check of the host result for int32 sum all-reduce */
  if (c == C_ALL_REDUCE && d == COLL_INT32 && op == COLL_SUM) {
    int32_t *tmp = malloc(count * 4 + 4);
    for (int q = 0; q < n; q++) {
      int32_t *in = malloc(count * 4 + 4);
      gen(in, count, d, op, q, seed);
      for (size_t k = 0; k < count; k++)
        tmp[k] = q == 0 ? in[k] : (int32_t)((uint32_t)tmp[k] + (uint32_t)in[k]);
      free(in);
    }
    int bad = count && memcmp(tmp, m->hr, count * 4) != 0;
    free(tmp);
    if (bad) return t_failf("rank %d: int32 sum all-reduce differs from the reference", r);
  }
  return 0;
}

static int matrix_rank(coll_comm_t unused, int rank, int n, void *varg) {
  (void)unused;
  const marg *a = varg;
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev < 1) return t_failf("rank %d: no GPU", rank);
  if ((e = cudaSetDevice(rank % ndev)) != cudaSuccess)
    return t_failf("cudaSetDevice: %s", cudaGetErrorString(e));
  mctx m = {.rank = rank, .n = n, .mode = a->mode};
  if (coll_comm_init_rank(&m.comm, n, coll_launch_unique_id(), rank) != COLL_OK)
    return t_failf("rank %d: init: %s", rank, coll_comm_last_error(NULL));
  /* Lazy: nothing of CUDA is set up before the first call on device memory. */
  if (!m.comm->cuda || atomic_load(&m.comm->cuda->tried) || m.comm->cuda->stream)
    return t_failf("rank %d: the device path was set up before any device call", rank);
  const size_t counts[] = {0, 1, 7, 1000, 300007};
  m.cap = 300007 * 8 * (size_t)n;
  m.hs = malloc(m.cap);
  m.hr = malloc(m.cap);
  if (cudaMallocHost((void **)&m.back, m.cap) != cudaSuccess) return t_failf("cudaMallocHost");
  if (cudaMalloc(&m.ds, m.cap) != cudaSuccess || cudaMalloc(&m.dr, m.cap) != cudaSuccess)
    return t_failf("cudaMalloc of %zu bytes", m.cap);
  if (a->mode == M_CUDA_STREAM) {
    if ((e = cudaStreamCreateWithFlags(&m.cs, cudaStreamNonBlocking)) != cudaSuccess)
      return t_failf("cudaStreamCreate: %s", cudaGetErrorString(e));
    if (coll_stream_create_cuda(&m.s, m.cs) != COLL_OK)
      return t_failf("coll_stream_create_cuda: %s", coll_comm_last_error(NULL));
  } else if (a->mode == M_HOST_STREAM && coll_stream_create(&m.s) != COLL_OK) {
    return t_failf("coll_stream_create: %s", coll_comm_last_error(NULL));
  }
  int fails = 0, cases = 0;
  uint64_t seed = 1;
  for (int c = 0; c < C_NUM && !fails; c++) {
    bool reduces = c == C_ALL_REDUCE || c == C_REDUCE || c == C_REDUCE_SCATTER;
    bool rooted = c == C_REDUCE || c == C_BROADCAST;
    for (int d = 0; d < COLL_NUM_DTYPES && !fails; d++)
      for (int op = 0; op < (reduces ? COLL_NUM_OPS : 1) && !fails; op++)
        for (size_t ci = 0; ci < sizeof counts / sizeof *counts && !fails; ci++) {
          size_t count = counts[ci];
          /* the multi-slot count for a few dtypes only: it is the slow one */
          if (count > 1000 && d != COLL_FLOAT32 && d != COLL_BFLOAT16 && d != COLL_INT64) continue;
          for (int ip = 0; ip < (c == C_SENDRECV ? 1 : 2) && !fails; ip++)
            for (int root = 0; root < (rooted ? n : 1) && !fails; root += (n > 1 ? n - 1 : 1)) {
              fails += one_case(&m, (mcoll)c, (coll_dtype)d, (coll_op)op, count, ip == 1, root,
                                seed++);
              cases++;
            }
        }
  }
  /* the first device call set the path up on this rank's GPU */
  if (!fails && (!m.comm->cuda->ready || m.comm->cuda->device != rank % ndev))
    fails += t_failf("rank %d: device path %s on GPU %d, expected ready on GPU %d (%s)", rank,
                     m.comm->cuda->ready ? "ready" : "not ready", m.comm->cuda->device, rank % ndev,
                     m.comm->cuda->reason);
  /* mixed host and device buffers are refused up front, on every rank alike */
  if (!fails) {
    coll_result r = coll_all_reduce(m.hs, m.dr, 4, COLL_FLOAT32, COLL_SUM, m.comm, NULL);
    if (r != COLL_ERR_INVALID_ARG ||
        !strstr(coll_comm_last_error(m.comm), "sendbuf is host memory but recvbuf is device"))
      fails += t_failf("mixed buffers: %s: %s", coll_result_string(r),
                       coll_comm_last_error(m.comm));
  }
  if (m.s && coll_stream_destroy(m.s) != COLL_OK)
    fails += t_failf("coll_stream_destroy: %s", coll_comm_last_error(NULL));
  if (m.cs) cudaStreamDestroy(m.cs);
  cudaFree(m.ds);
  cudaFree(m.dr);
  cudaFreeHost(m.back);
  free(m.hs);
  free(m.hr);
  if (coll_comm_destroy(m.comm) != COLL_OK) fails++;
  if (!fails && rank == 0)
    fprintf(stderr, "cuda matrix: %d ranks on %d GPU(s)%s: %d cases, device == host bit for bit\n",
            n, ndev,
            a->mode == M_CUDA_STREAM   ? ", through a cudaStream_t"
            : a->mode == M_HOST_STREAM ? ", through a coll_stream_t"
                                       : "",
            cases);
  return fails ? 1 : 0;
}

static void run_matrix_algo(int n, mmode mode, const char *algo) {
  char why[256];
  if (!gpu_in_child(why, sizeof why)) cr_skip_test("%s", why);
  setenv("COLL_TIMEOUT_MS", "60000", 1);
  unsetenv("COLL_CUDA");
  if (algo)
    setenv("COLL_ALGO", algo, 1);
  else
    unsetenv("COLL_ALGO");
  marg a = {.mode = mode};
  int rc = coll_launch_local_raw(n, matrix_rank, &a, 900000, why, sizeof why);
  unsetenv("COLL_ALGO");
  cr_assert_eq(rc, 0, "device matrix on %d ranks%s%s%s: %s", n,
               mode == M_CUDA_STREAM   ? " (cudaStream_t)"
               : mode == M_HOST_STREAM ? " (coll_stream_t)"
                                       : "",
               algo ? ", COLL_ALGO=" : "", algo ? algo : "", why);
  T_ASSERT_NO_LEFTOVERS("after the job");
}
static void run_matrix(int n, mmode mode) { run_matrix_algo(n, mode, NULL); }

Test(cuda, matrix_2_ranks, .timeout = 900) { run_matrix(2, M_BLOCKING); }
Test(cuda, matrix_4_ranks, .timeout = 900) { run_matrix(4, M_BLOCKING); }
Test(cuda, matrix_8_ranks, .timeout = 900) { run_matrix(8, M_BLOCKING); }
Test(cuda, matrix_2_ranks_stream, .timeout = 900) { run_matrix(2, M_CUDA_STREAM); }
Test(cuda, matrix_4_ranks_stream, .timeout = 900) { run_matrix(4, M_CUDA_STREAM); }
Test(cuda, matrix_8_ranks_stream, .timeout = 900) { run_matrix(8, M_CUDA_STREAM); }
/* Device buffers on a coll_stream_t (a trainer's DDP buckets): the device rows from the
 * progress thread, checked bit for bit and by the row that ran (one_case). */
Test(cuda, matrix_2_ranks_coll_stream, .timeout = 900) { run_matrix(2, M_HOST_STREAM); }
Test(cuda, matrix_4_ranks_coll_stream, .timeout = 900) { run_matrix(4, M_HOST_STREAM); }
/* Each row of the device data path forced (the others' collectives take the tuner's
 * choice, with a warning): the one-shot on every collective, the two-shot on
 * all-reduce, blocking and on a stream; and the host-driven path (ring) for device
 * buffers, which the tuner no longer picks where the device path is up. */
Test(cuda, matrix_4_ranks_dev_oneshot, .timeout = 900) {
  run_matrix_algo(4, M_BLOCKING, "dev_oneshot");
}
Test(cuda, matrix_4_ranks_dev_twoshot, .timeout = 900) {
  run_matrix_algo(4, M_BLOCKING, "dev_twoshot");
}
Test(cuda, matrix_3_ranks_dev_twoshot_stream, .timeout = 900) {
  run_matrix_algo(3, M_CUDA_STREAM, "dev_twoshot");
}
Test(cuda, matrix_2_ranks_ring, .timeout = 900) { run_matrix_algo(2, M_BLOCKING, "ring"); }

/* ---- a rank that dies or aborts during device collectives ---------------------------------
 *
 * Four ranks on the GPU(s) run one device all-reduce (which sets the device path up),
 * then rank 1 is SIGKILLed (by itself) or calls coll_comm_abort, while the others enter
 * a second one that cannot finish without it: each must return COLL_ERR_REMOTE naming
 * rank 1 within 5 s (COLL_TIMEOUT_MS is 30 s), with no device work of ours left behind
 * (coll_comm_destroy and the process exit must not hang).  Children report by exit
 * status; alarm() is the last resort; the parent reaps everyone. */
#define FAULT_COUNT (1u << 20) /* floats: 4 MiB, two cuda_ipc slots */

typedef enum { DEV_KILL, DEV_ABORT } dev_fault;

static int fault_child(coll_unique_id id, int rank, int n, dev_fault f, int gate) {
  alarm(120);
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1 ||
      cudaSetDevice(rank % ndev) != cudaSuccess)
    return 10;
  coll_comm_t comm;
  if (coll_comm_init_rank(&comm, n, id, rank) != COLL_OK) {
    fprintf(stderr, "rank %d: init: %s\n", rank, coll_comm_last_error(NULL));
    return 11;
  }
  float *h = malloc(sizeof(float) * FAULT_COUNT), *d = NULL;
  for (unsigned i = 0; i < FAULT_COUNT; i++) h[i] = 1;
  if (cudaMalloc((void **)&d, sizeof(float) * FAULT_COUNT) != cudaSuccess ||
      cudaMemcpy(d, h, sizeof(float) * FAULT_COUNT, cudaMemcpyHostToDevice) != cudaSuccess)
    return 12;
  if (coll_all_reduce(d, d, FAULT_COUNT, COLL_FLOAT32, COLL_SUM, comm, NULL) != COLL_OK) {
    fprintf(stderr, "rank %d: first device all-reduce: %s\n", rank, coll_comm_last_error(comm));
    return 13;
  }
  char c = 'r';
  if (write(gate, &c, 1) != 1) return 14;
  if (rank == 1) {
    if (f == DEV_KILL) raise(SIGKILL);
    coll_comm_abort(comm);
    for (;;) pause(); /* stuck in its own code; the parent kills it */
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  coll_result r = coll_all_reduce(d, d, FAULT_COUNT, COLL_FLOAT32, COLL_SUM, comm, NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
  const char *msg = coll_comm_last_error(comm);
  fprintf(stderr, "  %s rank %d: %s in %.0f ms: %s\n", f == DEV_KILL ? "kill" : "abort", rank,
          coll_result_string(r), ms, msg);
  int bad = r != COLL_ERR_REMOTE || ms > 5000 ||
            !(strstr(msg, "rank 1 ") || strstr(msg, "rank 1:") || strstr(msg, "rank 1)"));
  if (coll_all_reduce(d, d, 4, COLL_FLOAT32, COLL_SUM, comm, NULL) == COLL_OK) bad = 1;
  coll_comm_destroy(comm);
  cudaFree(d);
  free(h);
  return bad ? 1 : 0;
}

static void run_fault(dev_fault f) {
  char why[256];
  if (!gpu_in_child(why, sizeof why)) cr_skip_test("%s", why);
  setenv("COLL_TIMEOUT_MS", "30000", 1);
  unsetenv("COLL_CUDA");
  const int n = 4;
  coll_unique_id id;
  coll_root *root;
  cr_assert_eq(coll_make_unique_id(&id, &root), COLL_OK, "%s", coll_comm_last_error(NULL));
  int gate[2];
  cr_assert_eq(pipe(gate), 0);
  pid_t pid[4];
  for (int r = 0; r < n; r++) {
    pid[r] = fork();
    cr_assert_neq(pid[r], -1);
    if (pid[r] == 0) {
      close(gate[0]);
      _exit(fault_child(id, r, n, f, gate[1]));
    }
  }
  close(gate[1]);
  cr_assert_eq(coll_bootstrap_root_run(root, false, why, sizeof why), COLL_OK, "%s", why);
  /* every rank through its first call; then the survivors, then the victim */
  char c;
  int ready = 0;
  while (ready < n && read(gate[0], &c, 1) == 1) ready++;
  close(gate[0]);
  int failed = 0;
  for (int r = 0; r < n; r++) {
    if (r == 1) continue;
    int st = 0;
    waitpid(pid[r], &st, 0);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      fprintf(stderr, "  rank %d: %s %d\n", r, WIFEXITED(st) ? "exit status" : "signal",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      failed++;
    }
  }
  kill(pid[1], SIGKILL);
  waitpid(pid[1], NULL, 0);
  coll_bootstrap_root_stop(root);
  cr_assert_eq(ready, n, "only %d of %d ranks got through the first device all-reduce", ready, n);
  cr_assert_eq(failed, 0, "%d survivor(s) did not hear of rank 1 in time (stderr says how)",
               failed);
  T_ASSERT_NO_LEFTOVERS("after the job");
}

Test(cuda, killed_rank_device, .timeout = 300) { run_fault(DEV_KILL); }
Test(cuda, aborted_rank_device, .timeout = 300) { run_fault(DEV_ABORT); }
#else
Test(cuda, device_tests) {
  cr_skip_test("this build has no CUDA (nvcc was not found): device tests not built");
}
#endif
