/* proc.c — what /proc says of a local process: whether it is gone, and when it started
 * (proc.h).
 *
 * Must never block, signal the process it asks about, or allocate.
 */
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

uint64_t coll_process_start(pid_t pid, char *state) {
  char path[64], buf[1024];
  *state = '?';
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) *state = 'X';
    return 0;
  }
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  /* Fields are counted after the last ')': the command name before it may itself hold
   * spaces and parentheses. */
  const char *p = strrchr(buf, ')');
  if (!p || p[1] != ' ') return 0;
  *state = p[2];
  p += 2; /* field 3 */
  for (int f = 3; f < 22; f++) {
    if (!(p = strchr(p, ' '))) return 0;
    p++;
  }
  return strtoull(p, NULL, 10);
}

const char *coll_process_gone(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return "";
  char state;
  coll_process_start(pid, &state);
  if (state == 'Z') return " (killed or exited; not yet reaped by its parent)";
  if (state == 'X') return ""; /* being reaped, or /proc no longer has it */
  return NULL;                 /* running, stopped, or /proc unreadable: alive */
}
