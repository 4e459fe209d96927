/*
 * env_job.h — a DDP/FSDP job started the way a launcher starts one, for the fault tests
 * (test_ddp.c, test_fsdp_ckpt.c): N coll-train processes joined through the environment,
 * so the test knows every rank's pid and can kill one; rank 0's output read until a line
 * appears; the survivors checked to exit by themselves, naming themselves, in time.
 *
 * Never sleeps to synchronise (poll on the pipes with a deadline), and every path kills
 * and reaps what it started.
 */
#ifndef TRAIN_TEST_ENV_JOB_H
#define TRAIN_TEST_ENV_JOB_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

static inline int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define MAX_JOB 8

/* N coll-train processes joined through the environment (COLL_RANK, COLL_WORLD_SIZE,
 * COLL_ADDR), so the test knows every rank's pid. Each rank's stdout is a pipe the test
 * reads (only rank 0 prints), its stderr a file. */
typedef struct env_job {
    int n;
    pid_t pid[MAX_JOB];
    int outfd[MAX_JOB];
    char *errpath[MAX_JOB];
} env_job;

/* pipe_bytes > 0 shrinks rank 0's pipe: rank 0 flushes its output every step, so it can
 * then run at most that many bytes of output ahead of what the test has read. */
static inline void env_job_start(env_job *j, int n, const char *dir, const char *cli,
                                 const char *args, int pipe_bytes)
{
    cr_assert(n <= MAX_JOB);
    int port = free_port();
    memset(j, 0, sizeof *j);
    j->n = n;
    char *cmd = th_fmt("exec '%s' %s", cli, args);
    for (int r = 0; r < n; r++) {
        int p[2];
        cr_assert_eq(pipe(p), 0);
        if (pipe_bytes > 0)
            cr_assert(fcntl(p[0], F_SETPIPE_SZ, pipe_bytes) >= pipe_bytes,
                      "F_SETPIPE_SZ %d: %s", pipe_bytes, strerror(errno));
        j->errpath[r] = th_fmt("%s/rank%d.err", dir, r);
        j->pid[r] = fork();
        cr_assert(j->pid[r] >= 0);
        if (j->pid[r] == 0) {
            char rank[16], size[16], addr[32];
            snprintf(rank, sizeof rank, "%d", r);
            snprintf(size, sizeof size, "%d", n);
            snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
            setenv("COLL_RANK", rank, 1);
            setenv("COLL_WORLD_SIZE", size, 1);
            setenv("COLL_ADDR", addr, 1);
            setenv("COLL_TIMEOUT_MS", "2000", 1);
            dup2(p[1], 1);
            FILE *e = freopen(j->errpath[r], "w", stderr);
            (void)e;
            close(p[0]);
            close(p[1]);
            execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
            _exit(127);
        }
        close(p[1]);
        j->outfd[r] = p[0];
    }
    free(cmd);
}

/* Kills and reaps whatever is still running, closes the pipes. */
static inline void env_job_end(env_job *j)
{
    for (int r = 0; r < j->n; r++) {
        if (j->pid[r] > 0) {
            kill(j->pid[r], SIGKILL);
            waitpid(j->pid[r], NULL, 0);
            j->pid[r] = 0;
        }
        if (j->outfd[r] >= 0)
            close(j->outfd[r]);
        j->outfd[r] = -1;
        free(j->errpath[r]);
        j->errpath[r] = NULL;
    }
}

/* Reads rank 0's output (small reads, no sleeping) until `needle` appears; fails the test,
 * after killing the job, on EOF or after `limit_s`. */
static inline void env_job_wait_for(env_job *j, const char *needle, double limit_s)
{
    char buf[1024];
    size_t have = 0, nl = strlen(needle);
    double t_end = now_s() + limit_s;
    while (!memmem(buf, have, needle, nl)) {
        struct pollfd pf = {.fd = j->outfd[0], .events = POLLIN};
        int left = (int)((t_end - now_s()) * 1000);
        int pr = left > 0 ? poll(&pf, 1, left) : 0;
        ssize_t k = pr > 0 ? read(j->outfd[0], buf + have, 256) : -1;
        if (k <= 0) {
            char *e0 = th_read(j->errpath[0], NULL);
            env_job_end(j);
            cr_assert_fail("rank 0 never printed \"%s\" (%zu bytes read: %.*s): %s", needle, have, (int)have, buf, e0 ? e0 : "");
        }
        have += (size_t)k;
        if (memmem(buf, have, needle, nl)) /* before the trim below can drop it */
            break;
        if (have > sizeof buf - 256) { /* keep a tail long enough to hold the needle */
            memmove(buf, buf + have - nl, nl);
            have = nl;
        }
    }
}

/* Kills rank `victim`, then checks that every other rank exits by itself, non-zero, within
 * limit_s, with an error that says which rank it is. */
static inline void env_job_kill_and_expect_failures(env_job *j, int victim, double limit_s)
{
    char buf[4096];
    kill(j->pid[victim], SIGKILL);
    double t_kill = now_s();
    waitpid(j->pid[victim], NULL, 0);
    j->pid[victim] = 0;
    /* the survivors must exit by themselves: read their output to EOF, then reap */
    for (int r = 0; r < j->n; r++) {
        if (r == victim)
            continue;
        for (;;) {
            struct pollfd pf = {.fd = j->outfd[r], .events = POLLIN};
            int left = (int)((t_kill + limit_s - now_s()) * 1000);
            if (left <= 0 || poll(&pf, 1, left) <= 0) {
                env_job_end(j);
                cr_assert_fail("rank %d still running %.0f s after rank %d was killed", r,
                               limit_s, victim);
            }
            if (read(j->outfd[r], buf, sizeof buf) <= 0)
                break;
        }
        int st = 0;
        waitpid(j->pid[r], &st, 0);
        j->pid[r] = 0;
        double took = now_s() - t_kill;
        char *e = th_read(j->errpath[r], NULL);
        char want[32];
        snprintf(want, sizeof want, "rank %d of %d:", r, j->n);
        int ok_status = WIFEXITED(st) && WEXITSTATUS(st) != 0, ok_msg = e && strstr(e, want);
        if (!ok_status || !ok_msg) {
            env_job_end(j);
            cr_assert(ok_status, "rank %d did not fail after rank %d died (status %d): %s", r,
                      victim, st, e ? e : "");
            cr_assert_fail("rank %d's error does not say who it is: %s", r, e ? e : "");
        }
        cr_log_info("rank %d exited %.2f s after the kill: %s", r, took, e);
        free(e);
    }
}

#endif
