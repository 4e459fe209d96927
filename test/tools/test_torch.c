/* test_torch.c — the PyTorch backend (torch/, docs/pytorch.md) in the suite: each case runs
 * test/tools/torch_check.py with the Python of meson's -Dtorch_python (COLL_TORCH_PYTHON: by
 * default the torch 2.15 venv of scripts/setup.sh) on N forked ranks, the built libcoll_torch on
 * PYTHONPATH, and checks its exit status and what it printed.
 *
 *   ops   N = 2, 3, 4: every operation x dtype on the world and on a subgroup, against
 *         results the script computes itself from rank-dependent inputs (all_reduce both
 *         ways: blocking through the direct path, async through a Work; mixed-dtype
 *         all_reduce_coalesced)
 *   async N = 2, 3: Work.wait / is_completed / futures with then(); Work.wait(timeout)
 *         on a receive not sent yet raises, then completes
 *   badop a bitwise ReduceOp, an unreducible dtype, bool AVG and a send libcoll refuses
 *         raise RuntimeError with the backend's or libcoll's sentence
 *   kill  N = 3: a rank SIGKILLs itself; the survivors raise within seconds
 *   drop  N = 2: async Works dropped unwaited, then destroy_process_group returns
 *   pytorch_suite_2, _3: PyTorch's own distributed_test (scripts/torch_dist_suite.py),
 *         whole, at WORLD_SIZE 2 and 3: no failure, no error; _8_groups: the 18 *_group
 *         tests it runs only from 8 ranks, at 8
 *   parallel_*: torch/tools/parallel_compare.py, PyTorch's own parallelism trained 20 steps
 *         on libcoll and on Gloo (or a single-process reference where Gloo cannot):
 *         DDP, FSDP2, tensor parallelism, pipelining (1F1B and interleaved 1F1B) at N = 2,
 *         and a 2 x 2 DeviceMesh (FSDP x TP) at N = 4; losses within 1e-5 relative
 *
 * Built only when meson built the module (COLL_TORCH_MODULE_DIR).  Every run is bounded
 * (t_run kills its process group); the script reaps its ranks and removes its store.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_prog.h"

// PYTHONPATH=<the built module>, then whatever the caller's PYTHONPATH holds (the GPU
// machine's torch stage puts expecttest there).
static void module_path(char *pp, size_t len, const char *dir) {
  const char *old = getenv("PYTHONPATH");
  snprintf(pp, len, "PYTHONPATH=%s%s%s", dir, old && *old ? ":" : "", old && *old ? old : "");
}

// The Python the module was built for.
static const char *python(void) {
  const char *p = getenv("COLL_TORCH_PYTHON");
  return p && *p ? p : "/opt/libcoll/torch-2.15/bin/python3";
}

static t_run_result check(const char *mode, const char *n) {
  const char *dir = getenv("COLL_TORCH_MODULE_DIR"), *src = getenv("COLL_TEST_SOURCE_DIR");
  cr_assert(dir && src, "COLL_TORCH_MODULE_DIR and COLL_TEST_SOURCE_DIR must be set (meson test)");
  char script[4096], pp[4096];
  snprintf(script, sizeof script, "%s/test/tools/torch_check.py", src);
  module_path(pp, sizeof pp, dir);
  const char *argv[] = {python(), script, mode, n, NULL};
  const char *env[] = {pp, "OMP_NUM_THREADS=1", NULL};
  t_run_result r = t_run(argv, env, 150);
  cr_assert_neq(r.status, -2, "%s", r.err);
  char want[64];
  snprintf(want, sizeof want, "torch_check %s %s: OK", mode, n);
  if (r.status != 0 || !strstr(r.out, want))
    cr_assert_fail("torch_check.py %s %s: status %d\n--- stdout\n%s\n--- stderr\n%s", mode, n,
                   r.status, r.out, r.err);
  return r;
}

static void run_ok(const char *mode, const char *n) {
  t_run_result r = check(mode, n);
  t_run_free(&r);
}

Test(torch, ops_2, .timeout = 160) { run_ok("ops", "2"); }
Test(torch, ops_3, .timeout = 160) { run_ok("ops", "3"); }
Test(torch, ops_4, .timeout = 160) { run_ok("ops", "4"); }
static void run_async(const char *n) {
  t_run_result r = check("async", n);
  cr_expect(strstr(r.out, "libcoll recv: did not finish within 100 ms (Work.wait timeout)"), "%s",
            r.out);
  t_run_free(&r);
}

Test(torch, async_2, .timeout = 160) { run_async("2"); }
Test(torch, async_3, .timeout = 160) { run_async("3"); }

/* Dropped async Works, then destroy_process_group: returns (it deadlocked on the GIL once). */
Test(torch, destroy_after_dropped_works, .timeout = 160) { run_ok("drop", "2"); }

Test(torch, bad_op_raises, .timeout = 160) {
  t_run_result r = check("badop", "2");
  cr_expect(strstr(r.out, "ReduceOp.BAND is not supported by the libcoll backend"), "%s", r.out);
  cr_expect(strstr(r.out, "coll_send on rank 0: peer 7 is outside 0..1"), "%s", r.out);
  t_run_free(&r);
}

Test(torch, killed_rank_raises, .timeout = 160) {
  t_run_result r = check("kill", "3");
  for (int rank = 0; rank < 2; rank++) {
    char want[96];
    snprintf(want, sizeof want,
             "rank %d: all_reduce with a dead rank raised: libcoll all_reduce failed", rank);
    cr_expect(strstr(r.out, want), "rank %d did not raise libcoll's sentence:\n%s", rank, r.out);
  }
  /* libcoll's sentence names the dead rank: "peer rank 2 (pid P) has died" where the call
   * ran on the caller's thread, "rank 2 died or was killed" from the progress thread */
  cr_expect(strstr(r.out, "peer rank 2 (pid") || strstr(r.out, "rank 2 died or was killed"), "%s",
            r.out);
  cr_expect(!strstr(r.out, "peer rank 0") && !strstr(r.out, "peer rank 1"), "%s", r.out);
  t_run_free(&r);
}

/* PyTorch's own distributed_test, whole, at WORLD_SIZE 2 and 3 (scripts/torch_dist_suite.py:
 * forked ranks, ~70 s a world size here when idle; docs/pytorch.md lists what it skips and
 * why).  Every test that is not skipped must pass: unittest's last line is "OK (skipped=K)"
 * and the count of tests run is the whole suite's. */
static void whole_suite(const char *world_size) {
  const char *dir = getenv("COLL_TORCH_MODULE_DIR"), *src = getenv("COLL_TEST_SOURCE_DIR");
  cr_assert(dir && src, "COLL_TORCH_MODULE_DIR and COLL_TEST_SOURCE_DIR must be set (meson test)");
  char script[4096], pp[4096], ws[32];
  snprintf(script, sizeof script, "%s/scripts/torch_dist_suite.py", src);
  snprintf(ws, sizeof ws, "WORLD_SIZE=%s", world_size);
  module_path(pp, sizeof pp, dir);
  const char *argv[] = {python(), script, NULL};
  const char *env[] = {pp, ws, "OMP_NUM_THREADS=1", NULL};
  t_run_result r = t_run(argv, env, 560);
  cr_assert_neq(r.status, -2, "%s", r.err);
  const char *ran = strstr(r.err, "\nRan ");
  int n = ran ? atoi(ran + 5) : 0;
  /* unittest reports on stderr */
  cr_expect(r.status == 0 && n >= 280 && strstr(r.err, "\nOK (skipped="),
            "torch_dist_suite.py at WORLD_SIZE %s: status %d, %d tests ran, expected OK\n"
            "--- stderr (tail)\n%s",
            world_size, r.status, n, strlen(r.err) > 6000 ? r.err + strlen(r.err) - 6000 : r.err);
  t_run_free(&r);
}

Test(torch, pytorch_suite_2, .timeout = 600) { whole_suite("2"); }
Test(torch, pytorch_suite_3, .timeout = 600) { whole_suite("3"); }

/* The *_group tests torch 2.15 skips below 8 ranks (skip_if_small_worldsize), at
 * WORLD_SIZE 8: each on a subgroup of ranks 0..1 and its full-group twin (~18 s here). */
static const char *const group_tests[] = {
    "test_all_gather_coalesced_group",
    "test_all_gather_group",
    "test_all_reduce_group_max",
    "test_all_reduce_group_min",
    "test_all_reduce_group_product",
    "test_all_reduce_group_sum",
    "test_all_to_all_group",
    "test_all_to_all_single_equal_split_group",
    "test_all_to_all_single_unequal_split_group",
    "test_barrier_group",
    "test_barrier_timeout_group",
    "test_broadcast_group",
    "test_gather_group",
    "test_reduce_group_max",
    "test_reduce_group_min",
    "test_reduce_group_product",
    "test_reduce_group_sum",
    "test_scatter_group",
};

Test(torch, pytorch_suite_8_groups, .timeout = 400) {
  const char *dir = getenv("COLL_TORCH_MODULE_DIR"), *src = getenv("COLL_TEST_SOURCE_DIR");
  cr_assert(dir && src, "COLL_TORCH_MODULE_DIR and COLL_TEST_SOURCE_DIR must be set (meson test)");
  enum { N_GROUP = sizeof group_tests / sizeof group_tests[0] };
  char script[4096], pp[4096], pat[N_GROUP][96];
  snprintf(script, sizeof script, "%s/scripts/torch_dist_suite.py", src);
  module_path(pp, sizeof pp, dir);
  const char *argv[2 + 2 * N_GROUP + 1] = {python(), script};
  for (int i = 0; i < N_GROUP; i++) {
    /* "*." anchors the pattern at the test's name in unittest's -k matching */
    snprintf(pat[i], sizeof pat[i], "*.%s", group_tests[i]);
    argv[2 + 2 * i] = "-k";
    argv[3 + 2 * i] = pat[i];
  }
  argv[2 + 2 * N_GROUP] = NULL;
  const char *env[] = {pp, "WORLD_SIZE=8", "OMP_NUM_THREADS=1", NULL};
  t_run_result r = t_run(argv, env, 360);
  cr_assert_neq(r.status, -2, "%s", r.err);
  char ran[64];
  snprintf(ran, sizeof ran, "Ran %d tests", N_GROUP);
  cr_expect(r.status == 0 && strstr(r.err, ran) && strstr(r.err, "\nOK\n"),
            "torch_dist_suite.py at WORLD_SIZE 8: status %d, expected \"%s\" and OK, no skip\n"
            "--- stderr (tail)\n%s",
            r.status, ran, strlen(r.err) > 6000 ? r.err + strlen(r.err) - 6000 : r.err);
  t_run_free(&r);
}

/* parallel_compare.py --mode MODE --ranks N: its "OK" line and exit status 0.  Each of its
 * three runs (libcoll, Gloo, the reference where Gloo fails) is bounded by run_s, so that
 * the script, not t_run, reports a hang; t_run's bound covers all three.  Wall times of
 * each case on this project's 2-core machine at a load of 2-4 (another build beside it):
 * ddp 4-6 s, fsdp2 6-9 s, tp 7-12 s, pp-1f1b 4-7 s, pp-interleaved 5-8 s, mesh2d 13-22 s
 * (4 ranks on 2 cores); the bounds leave 7x or more. */
static void parallel(const char *mode, const char *n, const char *run_s, int timeout_s) {
  const char *dir = getenv("COLL_TORCH_MODULE_DIR"), *src = getenv("COLL_TEST_SOURCE_DIR");
  cr_assert(dir && src, "COLL_TORCH_MODULE_DIR and COLL_TEST_SOURCE_DIR must be set (meson test)");
  char script[4096], pp[4096];
  snprintf(script, sizeof script, "%s/torch/tools/parallel_compare.py", src);
  module_path(pp, sizeof pp, dir);
  const char *argv[] = {python(),  script, "--mode",    mode,  "--ranks", n,
                        "--steps", "20",   "--timeout", run_s, NULL};
  const char *env[] = {pp, "OMP_NUM_THREADS=1", NULL};
  t_run_result r = t_run(argv, env, timeout_s);
  cr_assert_neq(r.status, -2, "%s", r.err);
  char want[64];
  snprintf(want, sizeof want, "parallel_compare %s %s: OK", mode, n);
  const char *tail = strlen(r.err) > 6000 ? r.err + strlen(r.err) - 6000 : r.err;
  cr_expect(r.status == 0 && strstr(r.out, want),
            "parallel_compare.py --mode %s --ranks %s: status %d (-1: killed after %d s)\n"
            "--- stdout\n%s\n--- stderr (tail)\n%s",
            mode, n, r.status, timeout_s, r.out, tail);
  t_run_free(&r);
}

Test(torch, parallel_ddp_2, .timeout = 160) { parallel("ddp", "2", "45", 150); }
Test(torch, parallel_fsdp2_2, .timeout = 160) { parallel("fsdp2", "2", "45", 150); }
Test(torch, parallel_tp_2, .timeout = 160) { parallel("tp", "2", "45", 150); }
Test(torch, parallel_pp_1f1b_2, .timeout = 160) { parallel("pp-1f1b", "2", "45", 150); }
Test(torch, parallel_pp_interleaved_2, .timeout = 160) {
  parallel("pp-interleaved", "2", "45", 150);
}
Test(torch, parallel_mesh2d_4, .timeout = 250) { parallel("mesh2d", "4", "75", 240); }
