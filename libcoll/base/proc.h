/* proc.h — is a peer's process still there?  The one liveness check that the shared
 * memory and CUDA IPC transports (and anything else waiting on a local peer) share.
 *
 * Must never block, signal the process it asks about, or be called in a hot loop: it
 * reads /proc, so callers ask only after a quiet spell (a futex wait that timed out).
 */
#ifndef COLL_PROC_H
#define COLL_PROC_H

#include <stdint.h>
#include <sys/types.h>

/* NULL while `pid` runs (or is stopped); else how it is gone, as a phrase to append to
 * "rank N (pid P) has died": "" when no such process exists, or a parenthesised note when
 * it is a zombie (killed or exited, not yet reaped by its parent).  kill(pid, 0) alone
 * cannot tell: it succeeds on a zombie, and a SIGKILLed rank stays one until its
 * launcher gets round to waitpid. */
const char *coll_process_gone(pid_t pid);
/* Field 22 of /proc/PID/stat, the start time in clock ticks after boot (0 if unreadable:
 * with the pid, it names one process even after the number is reused), and the state
 * letter of field 3 in *state: 'X' when /proc has no such process, '?' if unreadable. */
uint64_t coll_process_start(pid_t pid, char *state);

#endif
