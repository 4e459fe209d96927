/* test_fuzz.c — runs the libFuzzer target of the bootstrap root's parser
 * (test/comm/fuzz_bootstrap.c) for a bounded time: fixed seed, at most 2 million inputs
 * or 25 s, whichever comes first.  The target is built by clang -fsanitize=fuzzer, ASan and
 * UBSan when meson found a clang that can link libFuzzer (Debian: clang and
 * libclang-rt-14-dev, see scripts/setup.sh); otherwise this test skips and says so.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

Test(fuzz, bootstrap_parser, .timeout = 90) {
  const char *exe = getenv("COLL_FUZZ_BOOTSTRAP");
  const char *why = getenv("COLL_FUZZ_WHY");
  if (!exe || !*exe)
    cr_skip_test("no fuzz target: %s (install clang and libclang-rt-14-dev, then "
                 "reconfigure)",
                 why && *why ? why : "COLL_FUZZ_BOOTSTRAP is not set");
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "%s -seed=1 -runs=2000000 -max_total_time=25 -timeout=10 "
           "-rss_limit_mb=1024 -max_len=4096 2>&1",
           exe);
  FILE *p = popen(cmd, "r");
  cr_assert(p, "cannot run %s", cmd);
  char line[1024], last[4][1024] = {{0}};
  int nl = 0;
  while (fgets(line, sizeof line, p)) {
    snprintf(last[nl % 4], sizeof last[0], "%s", line);
    nl++;
    if (strstr(line, "ERROR") || strstr(line, "runtime error") || strstr(line, "Done "))
      fprintf(stderr, "  | %s", line);
  }
  int st = pclose(p);
  for (int i = 0; i < 4 && i < nl; i++) fprintf(stderr, "  | %s", last[(nl + i) % 4]);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
            "the fuzzer found a crash (status %d): see above", st);
}
