/* net_rank.c — one rank of the multi-host correctness matrix: joins the job from the
 * environment (scripts/netns.sh starts one per network namespace), runs tcp_matrix with
 * ~1 MiB counts, checks nothing of libcoll is left in /dev/shm, prints one line, and
 * exits 0 when everything was correct.  NET_RANK_SMALL=1 leaves out the big counts. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll.h"
#include "tcp_matrix.h"

static int shm_leftovers(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += strncmp(e->d_name, "coll-", 5) == 0;
  closedir(d);
  return n;
}

int main(void) {
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  coll_comm_t comm;
  coll_result r = coll_comm_init_from_env(&comm);
  if (r != COLL_OK) {
    fprintf(stderr, "init_from_env on %s: %s: %s\n", host, coll_result_string(r),
            coll_comm_last_error(NULL));
    return 2;
  }
  int rank, n;
  coll_comm_rank(comm, &rank);
  coll_comm_size(comm, &n);
  const char *small = getenv("NET_RANK_SMALL");
  int fails = tm_run(comm, rank, n, !(small && *small == '1'));
  if (coll_comm_destroy(comm) != COLL_OK) fails++;
  int left = shm_leftovers();
  printf("rank %d of %d on %s: %s\n", rank, n, host,
         fails ? "WRONG" : left ? "LEFT SEGMENTS IN /dev/shm" : "ok");
  return fails || left ? 1 : 0;
}
