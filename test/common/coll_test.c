/* coll_test.c — see coll_test.h. */
#include "coll_test.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>

#include "internal.h"

int t_launch(int n, coll_rank_fn fn, void *arg, int timeout_ms, char *why, size_t why_len) {
  return coll_launch_local(n, fn, arg, timeout_ms, why, why_len);
}

int t_prefix_segments(const char *prefix, int remove, char *names, size_t len) {
  if (names && len) names[0] = 0;
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  size_t used = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
    n++;
    if (names && used < len) {
      int k = snprintf(names + used, len - used, "%s%s", used ? " " : "", e->d_name);
      if (k > 0) used += (size_t)k;
    }
    if (remove) {
      char path[300];
      snprintf(path, sizeof path, "/%s", e->d_name);
      shm_unlink(path);
    }
  }
  closedir(d);
  return n;
}

int t_job_leftovers(char *names, size_t len) {
  char removed[512];
  int n = coll_launch_leftovers(removed, sizeof removed);
  /* The launcher already looked; a segment of the job still there now would be one made
   * after every rank had exited, which nothing does, but count it rather than trust. */
  coll_unique_id id = coll_launch_unique_id();
  coll_id_fields f;
  char why[64], prefix[40], still[512] = "";
  if (coll_id_decode(&id, &f, why, sizeof why) == COLL_OK) {
    coll_job_prefix(prefix, sizeof prefix, f.secret);
    n += t_prefix_segments(prefix, 1, still, sizeof still);
  }
  if (names && len)
    snprintf(names, len, "%s%s%s", removed, removed[0] && still[0] ? " " : "", still);
  return n;
}

void t_env_job_prefix(char *out, size_t len, const char *addr, int size) {
  uint8_t secret[COLL_SECRET_BYTES];
  coll_env_secret(secret, addr, size);
  coll_job_prefix(out, len, secret);
}

static bool port_free(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof a;
  bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &l) == 0;
  close(fd);
  return ok;
}

int t_free_port(void) {
  int lo = 32768;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%d", &lo) != 1) lo = 32768;
    fclose(f);
  }
  static uint64_t calls;
  uint64_t rng = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull + ++calls;
  if (lo > 12000)
    for (int tries = 0; tries < 200; tries++) {
      int port = 10000 + (int)(t_rand(&rng) % (uint64_t)(lo - 10000));
      if (port_free(port)) return port;
    }
  /* No room below the range: any port the kernel picks (the old way). */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof a;
  bind(fd, (struct sockaddr *)&a, sizeof a);
  getsockname(fd, (struct sockaddr *)&a, &l);
  close(fd);
  return ntohs(a.sin_port);
}

uint64_t t_rand(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int t_failf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return 1;
}

bool t_bind_to_first_cpu(void) {
  cpu_set_t allowed, one;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return false;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &allowed)) {
      CPU_ZERO(&one);
      CPU_SET(c, &one);
      return sched_setaffinity(0, sizeof one, &one) == 0;
    }
  return false;
}

pid_t t_spin_child(int cpu) {
  pid_t child = fork();
  if (child != 0) return child;
  if (cpu >= 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    sched_setaffinity(0, sizeof one, &one);
  }
  alarm(60);
  for (volatile unsigned long i = 0;; i++) {}
}

void t_spin_stop(pid_t child) {
  int status;
  if (child <= 0) return;
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
}
