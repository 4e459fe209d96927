/*
 * test_ddp.c — data-parallel training (ddp.c) against the single-process trainer.
 *
 *  - parity: the same model and seed trained STEPS steps by one process on the global
 *    batch (N*B sequences, the unmodified train_session_step) and by N = 2, 3, 4 forked
 *    ranks each on its B-row slice, over libcoll. After every step the ranks' parameters
 *    must be bitwise identical to each other, and equal to the single process's within
 *    PARAM_TOL (see below). Ranks other than 0 start from different seeds: the broadcast
 *    from rank 0 is what makes them agree.
 *  - --accum K on N ranks equals one process accumulating K*N micro-batches.
 *  - buckets tile the gradient array in reverse layer order; a backward that never
 *    reports a layer finished is caught at its end, naming the bucket and the layer.
 *  - backend swap: coll-train over libcoll and over Open MPI print the same losses.
 *  - a rank killed mid-training makes the survivors exit with an error within the timeout.
 *
 * Tolerance. DDP computes the same mathematics in another order: each rank's weight
 * gradients sum B*T rows instead of N*B*T, and the ranks' means are averaged in fp32
 * (u = 6e-8), so gradients differ by a few ulps relative. AdamW divides m by sqrt(v):
 * where a gradient is much larger than its rounding noise the update moves by ~1e-6
 * relative, but where it is of the order of that noise (a cancelling sum) the update
 * can change by up to lr per step, so single elements drift further than the bulk.
 * Measured here (20 steps, lr 1e-2, N = 2, 3, 4): max |p_ddp - p_1proc| = 3.6e-5, 4.5e-5,
 * 6.7e-5 and relative L2 ||p_ddp - p_1proc|| / ||p_1proc|| = 5.4e-6, 7.1e-6, 8.0e-6.
 * Tolerances: PARAM_TOL = 1e-3 absolute per element (lr/10, 15x the worst seen) and
 * PARAM_RELTOL = 1e-4 relative L2 (12x). A real bug (a bucket not reduced, a rank reading
 * the wrong rows, weights not broadcast) moves the bulk of the parameters by ~lr = 1e-2
 * per step, and breaks the bitwise equality across ranks at once. AdamW is blind to a
 * gradient scaled by a constant (a missing 1/N), so the gradient norms are compared too
 * (GNORM_RELTOL 1e-4 relative). Losses: LOSS_TOL 1e-5 absolute (values near 5).
 */
#include <criterion/criterion.h>

#include <coll_launch.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>

#include "ddp.h"
#include "helpers.h"
#include "train.h"

#define B 2
#define T 16
#define STEPS 20
#define PARAM_TOL 1e-3
#define PARAM_RELTOL 1e-4
#define GNORM_RELTOL 1e-4
#define LOSS_TOL 1e-5

static train_options small_options(int batch, uint64_t seed)
{
    train_options o = {
        .cfg = {.vocab = 256, .max_seq = 32, .layers = 2, .channels = 64, .heads = 4},
        .hp = train_hparams_default(),
        .batch = batch,
        .seq = T,
        .seed = seed,
        .device = TRAIN_DEVICE_CPU,
        .threads = 1,
    };
    o.hp.steps = STEPS;
    o.hp.warmup = 3;
    o.hp.lr = 1e-2f;
    return o;
}

/* What the ranks report back to the test process: parameters after every step and the
 * losses, in memory shared across fork. */
typedef struct job {
    int nranks, steps, accum;
    size_t np;
    float *params; /* [rank][step][np] */
    float *loss;   /* [rank][step] */
    float *norm;   /* [rank][step] gradient norm before clipping */
} job;

static void *shared_alloc(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(p != MAP_FAILED, "mmap %zu bytes: %s", bytes, strerror(errno));
    return p;
}

static size_t count_params(void)
{
    char err[TRAIN_ERRLEN];
    train_options o = small_options(B, 1);
    train_model *m = train_model_create(&o.cfg, 1, 1, TRAIN_DEVICE_CPU, 1, 1, err);
    cr_assert(m, "%s", err);
    size_t np = train_num_params(m);
    train_model_free(m);
    return np;
}

static job *job_new(int nranks, int steps, int accum)
{
    job *j = shared_alloc(sizeof *j);
    j->nranks = nranks;
    j->steps = steps;
    j->accum = accum;
    j->np = count_params();
    j->params = shared_alloc((size_t)nranks * steps * j->np * sizeof(float));
    j->loss = shared_alloc((size_t)nranks * steps * sizeof(float));
    j->norm = shared_alloc((size_t)nranks * steps * sizeof(float));
    return j;
}

static void job_free(job *j)
{
    munmap(j->params, (size_t)j->nranks * j->steps * j->np * sizeof(float));
    munmap(j->loss, (size_t)j->nranks * j->steps * sizeof(float));
    munmap(j->norm, (size_t)j->nranks * j->steps * sizeof(float));
    munmap(j, sizeof *j);
}

/* One DDP rank: its own seed (rank 0's wins through the broadcast), STEPS steps. */
static int ddp_rank(coll_comm_t comm, int rank, int nranks, void *arg)
{
    job *j = arg;
    char err[TRAIN_ERRLEN];
    train_options o = small_options(B, 42 + 1000 * (uint64_t)rank);
    train_session *s = train_session_create(&o, err);
    train_backend *b = s ? train_backend_coll(comm, 0, err) : NULL;
    if (!b) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 2;
    }
    train_ddp_options dopt = train_ddp_options_default();
    dopt.accum = j->accum;
    dopt.first_bucket_bytes = 64 << 10; /* several buckets even for this small model */
    dopt.bucket_bytes = 128 << 10;
    train_ddp *d = train_ddp_create(s, b, &dopt, err);
    if (!d) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 3;
    }
    for (int i = 0; i < j->steps; i++) {
        train_ddp_stats st;
        if (train_ddp_step(d, &st, err) != 0) {
            fprintf(stderr, "rank %d: %s\n", rank, err);
            return 4;
        }
        j->loss[(size_t)rank * j->steps + i] = st.step.loss;
        j->norm[(size_t)rank * j->steps + i] = st.step.grad_norm;
        train_copy_params_to_host(train_session_model(s),
                                  j->params + ((size_t)rank * j->steps + i) * j->np);
    }
    int rc = train_ddp_check_identical(d, err) == 0 ? 0 : 5;
    train_ddp_free(d);
    b->destroy(b);
    train_session_free(s);
    (void)nranks;
    return rc;
}

static double max_abs_diff(const float *a, const float *b, size_t n, size_t *where)
{
    double mx = 0.0;
    for (size_t i = 0; i < n; i++) {
        double dd = fabs((double)a[i] - (double)b[i]);
        if (dd > mx || dd != dd) {
            mx = dd;
            *where = i;
        }
    }
    return mx;
}

/* Ranks bitwise equal to each other, rank 0 within PARAM_TOL of ref (steps x np). */
static void check_against(job *j, const float *ref, const float *refloss, const float *refnorm,
                          const char *what)
{
    size_t np = j->np;
    double worst = 0.0, worst_rel = 0.0;
    for (int i = 0; i < j->steps; i++) {
        const float *p0 = j->params + (size_t)i * np;
        for (int r = 1; r < j->nranks; r++)
            cr_assert(memcmp(p0, j->params + ((size_t)r * j->steps + i) * np,
                             np * sizeof(float)) == 0,
                      "%s N=%d: rank %d's parameters differ from rank 0's after step %d",
                      what, j->nranks, r, i + 1);
        size_t at = 0;
        double dd = max_abs_diff(p0, ref + (size_t)i * np, np, &at);
        cr_assert(dd <= PARAM_TOL,
                  "%s N=%d: after step %d parameter %zu differs from one process by %g "
                  "(tolerance %g)",
                  what, j->nranks, i + 1, at, dd, PARAM_TOL);
        cr_assert(fabs(j->loss[i] - refloss[i]) <= LOSS_TOL,
                  "%s N=%d: step %d loss %.9g, one process %.9g", what, j->nranks, i + 1,
                  j->loss[i], refloss[i]);
        cr_assert(fabs(j->norm[i] - refnorm[i]) <= GNORM_RELTOL * refnorm[i],
                  "%s N=%d: step %d gradient norm %.9g, one process %.9g", what, j->nranks,
                  i + 1, j->norm[i], refnorm[i]);
        double rel = th_relerr(p0, ref + (size_t)i * np, np);
        cr_assert(rel <= PARAM_RELTOL,
                  "%s N=%d: after step %d ||p_ddp - p_1proc|| / ||p_1proc|| = %g (tolerance %g)",
                  what, j->nranks, i + 1, rel, PARAM_RELTOL);
        worst = dd > worst ? dd : worst;
        worst_rel = rel > worst_rel ? rel : worst_rel;
    }
    cr_log_info("%s N=%d: %d steps, max |p_ddp - p_1proc| = %.3g, max relative L2 %.3g", what,
                j->nranks, j->steps, worst, worst_rel);
}

Test(ddp, parity_with_one_process_n234, .timeout = 150)
{
    char err[TRAIN_ERRLEN], why[256];
    for (int n = 2; n <= 4; n++) {
        job *j = job_new(n, STEPS, 1);
        int rc = coll_launch_local(n, ddp_rank, j, 120000, why, sizeof why);
        cr_assert_eq(rc, 0, "N=%d DDP job failed: %s", n, why);

        /* the single process: batch N*B, the plain trainer, seed 42 */
        train_options o = small_options(n * B, 42);
        train_session *s = train_session_create(&o, err);
        cr_assert(s, "%s", err);
        float *ref = malloc((size_t)STEPS * j->np * sizeof(float)), refloss[STEPS],
              refnorm[STEPS];
        for (int i = 0; i < STEPS; i++) {
            train_step_stats st = train_session_step(s);
            refloss[i] = st.loss;
            refnorm[i] = st.grad_norm;
            train_copy_params_to_host(train_session_model(s), ref + (size_t)i * j->np);
        }
        train_session_free(s);
        check_against(j, ref, refloss, refnorm, "parity");
        free(ref);
        job_free(j);
    }
}

Test(ddp, accum_equals_one_process_with_kn_microbatches, .timeout = 120)
{
    enum { N = 2, K = 3, S = 8 };
    char err[TRAIN_ERRLEN], why[256];
    job *j = job_new(N, S, K);
    int rc = coll_launch_local(N, ddp_rank, j, 100000, why, sizeof why);
    cr_assert_eq(rc, 0, "DDP job failed: %s", why);

    /* one process: K*N micro-batches of B rows, each scaled 1/(K*N), one AdamW step */
    train_options o = small_options(B, 42);
    train_session *s = train_session_create(&o, err);
    cr_assert(s, "%s", err);
    train_model *m = train_session_model(s);
    train_data *data = train_session_data(s);
    train_loader_state pos = {.seed = o.seed};
    int in[B * T], tg[B * T];
    float *ref = malloc((size_t)S * j->np * sizeof(float)), refloss[S], refnorm[S];
    for (int i = 0; i < S; i++) {
        train_zero_grad(m);
        train_set_loss_scale(m, 1.0f / (K * N));
        double loss = 0.0;
        train_loader_state p = pos;
        for (int mb = 0; mb < K * N; mb++) {
            p = pos;
            train_data_next_rows(data, &p, K * N * B, T, mb * B, B, in, tg);
            loss += train_forward(m, in, tg, B, T);
            train_backward(m);
        }
        pos = p;
        refloss[i] = (float)(loss / (K * N));
        refnorm[i] = train_clip_grads(m, &o.hp);
        train_adamw_step(m, &o.hp, train_lr_at(&o.hp, i), i + 1);
        train_copy_params_to_host(m, ref + (size_t)i * j->np);
    }
    train_session_free(s);
    check_against(j, ref, refloss, refnorm, "accum K=3");
    free(ref);
    job_free(j);
}

/* A 1-rank backend in this process, for the tests that need no peers. */
static train_backend *solo_backend(void)
{
    coll_unique_id id;
    coll_comm_t comm;
    char err[TRAIN_ERRLEN];
    cr_assert_eq(coll_get_unique_id(&id), COLL_OK, "%s", coll_comm_last_error(NULL));
    cr_assert_eq(coll_comm_init_rank(&comm, 1, id, 0), COLL_OK, "%s",
                 coll_comm_last_error(NULL));
    train_backend *b = train_backend_coll(comm, 1, err);
    cr_assert(b, "%s", err);
    return b;
}

Test(ddp, buckets_tile_the_gradients_in_reverse_order, .timeout = 30)
{
    char err[TRAIN_ERRLEN];
    train_options o = small_options(B, 1);
    train_session *s = train_session_create(&o, err);
    cr_assert(s, "%s", err);
    train_backend *b = solo_backend();
    train_ddp_options dopt = train_ddp_options_default();
    dopt.first_bucket_bytes = 20000;
    dopt.bucket_bytes = 70000;
    train_ddp *d = train_ddp_create(s, b, &dopt, err);
    cr_assert(d, "%s", err);
    train_model *m = train_session_model(s);
    size_t end = train_num_params(m);
    int nb = train_ddp_num_buckets(d);
    cr_assert(nb > 3, "only %d buckets", nb);
    for (int i = 0; i < nb; i++) {
        const train_ddp_bucket *k = train_ddp_bucket_info(d, i);
        cr_assert_eq(k->start + k->count, end, "bucket %d does not end where %d began", i,
                     i - 1);
        size_t cap = i == 0 ? dopt.first_bucket_bytes : dopt.bucket_bytes;
        cr_assert(k->count * 4 <= cap || k->ntensors == 1,
                  "bucket %d: %zu bytes over the cap %zu with %d tensors", i, k->count * 4,
                  cap, k->ntensors);
        end = k->start;
    }
    cr_assert_eq(end, 0, "buckets do not reach offset 0");
    /* reverse layer order: the stage that finalises each bucket never goes back up */
    for (int i = 1; i < nb; i++)
        cr_assert(train_ddp_bucket_info(d, i)->layer <= train_ddp_bucket_info(d, i - 1)->layer,
                  "bucket %d is final after layer %d, bucket %d only after layer %d", i,
                  train_ddp_bucket_info(d, i)->layer, i - 1,
                  train_ddp_bucket_info(d, i - 1)->layer);
    cr_assert_eq(train_ddp_bucket_info(d, nb - 1)->layer, -1,
                 "the last bucket is not the embeddings'");
    train_ddp_free(d);
    cr_assert_eq(b->destroy(b), 0);
    train_session_free(s);
}

Test(ddp, bucket_never_launched_is_named_at_end_of_backward, .timeout = 30)
{
    char err[TRAIN_ERRLEN];
    train_options o = small_options(B, 1);
    train_session *s = train_session_create(&o, err);
    cr_assert(s, "%s", err);
    train_backend *b = solo_backend();
    train_ddp_options dopt = train_ddp_options_default();
    dopt.first_bucket_bytes = 20000;
    dopt.bucket_bytes = 70000;
    train_ddp *d = train_ddp_create(s, b, &dopt, err);
    cr_assert(d, "%s", err);
    train_model *m = train_session_model(s);
    /* a backward that reports the final LayerNorm and block 1, then stops */
    train_ddp_begin_backward(d);
    size_t lnf = 0, h1 = 0;
    for (int i = 0; i < train_num_tensors(m); i++) {
        const train_param *p = train_param_info(m, i);
        if (strcmp(p->name, "lnf.w") == 0)
            lnf = p->offset;
        if (strcmp(p->name, "h.1.ln1.w") == 0)
            h1 = p->offset;
    }
    train_ddp_grads_final(d, lnf, o.cfg.layers);
    train_ddp_grads_final(d, h1, 1);
    cr_assert_eq(train_ddp_finish_backward(d, err), -1, "a missing layer went unnoticed");
    cr_assert(strstr(err, "never reported layer 0 finished") && strstr(err, "h.0."),
              "message does not name the bucket and layer: %s", err);
    cr_log_info("%s", err);
    /* and a complete backward passes */
    train_ddp_stats st;
    cr_assert_eq(train_ddp_step(d, &st, err), 0, "%s", err);
    train_ddp_free(d);
    cr_assert_eq(b->destroy(b), 0);
    train_session_free(s);
}

/* ---- through coll-train --------------------------------------------------------- */

static const char *cli(void)
{
    const char *c = getenv("TRAIN_CLI");
    cr_assert(c, "TRAIN_CLI is not set");
    return c;
}

#define CLI_MODEL "--layers 2 --channels 64 --heads 4 --max-seq 32 --seq 16 --batch 2 " \
                  "--lr 1e-2 --warmup 3 --eval-every 0 --threads 1"

/* The losses printed by coll-train (rank 0's "step i/n | loss X" lines). */
static int read_losses(const char *path, float *loss, int max)
{
    char *txt = th_read(path, NULL);
    cr_assert(txt, "no output %s", path);
    int n = 0;
    for (char *p = txt; (p = strstr(p, "step ")) && n < max; p++) {
        long st, tot;
        float l;
        if (sscanf(p, "step %ld/%ld | loss %f", &st, &tot, &l) == 3 && st == n + 1)
            loss[n++] = l;
    }
    free(txt);
    return n;
}

Test(ddp, backend_swap_coll_vs_mpi_same_losses, .timeout = 120)
{
    if (!train_backend_mpi_built())
        cr_skip_test("this build has no Open MPI backend (install libopenmpi-dev)");
    if (system("command -v mpirun.openmpi >/dev/null 2>&1") != 0)
        cr_skip_test("mpirun.openmpi is not installed (Debian: openmpi-bin)");
    char *dir = th_tmpdir();
    for (int n = 2; n <= 3; n++) {
        float lc[STEPS], lm[STEPS];
        const char *be[2] = {"coll", "mpi"};
        float *dst[2] = {lc, lm};
        for (int k = 0; k < 2; k++) {
            char *out = th_fmt("%s/%s%d.out", dir, be[k], n),
                 *errp = th_fmt("%s/%s%d.err", dir, be[k], n);
            char *cmd = th_fmt("%s " CLI_MODEL " --steps %d --parallel ddp --ranks %d "
                               "--backend %s --bucket-mb 0.1",
                               cli(), STEPS, n, be[k]);
            int rc = th_run(cmd, out, errp);
            char *e = th_read(errp, NULL);
            cr_assert_eq(rc, 0, "%s failed (%d): %s", cmd, rc, e ? e : "");
            cr_assert_eq(read_losses(out, dst[k], STEPS), STEPS, "%s: fewer than %d steps",
                         cmd, STEPS);
            free(e);
            free(cmd);
            free(out);
            free(errp);
        }
        for (int i = 0; i < STEPS; i++) {
            /* N = 2: both sum two numbers (commutative) and divide by 2: bitwise equal;
             * other N: the summation order may differ: LOSS_TOL */
            if (n == 2)
                cr_assert(lc[i] == lm[i], "N=2 step %d: libcoll loss %.9g, MPI %.9g", i + 1,
                          lc[i], lm[i]);
            else
                cr_assert(fabsf(lc[i] - lm[i]) <= LOSS_TOL,
                          "N=%d step %d: libcoll loss %.9g, MPI %.9g", n, i + 1, lc[i], lm[i]);
        }
    }
    th_rmrf(dir);
    free(dir);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

Test(ddp, killed_rank_makes_the_others_fail_within_the_timeout, .timeout = 60)
{
    enum { N = 3, VICTIM = 1 };
    char *dir = th_tmpdir();
    int port = free_port();
    pid_t pid[N];
    int outfd[N];
    char *errpath[N];
    for (int r = 0; r < N; r++) {
        int p[2];
        cr_assert_eq(pipe(p), 0);
        errpath[r] = th_fmt("%s/rank%d.err", dir, r);
        pid[r] = fork();
        cr_assert(pid[r] >= 0);
        if (pid[r] == 0) {
            char rank[8], size[8], addr[32];
            snprintf(rank, sizeof rank, "%d", r);
            snprintf(size, sizeof size, "%d", N);
            snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
            setenv("COLL_RANK", rank, 1);
            setenv("COLL_WORLD_SIZE", size, 1);
            setenv("COLL_ADDR", addr, 1);
            setenv("COLL_TIMEOUT_MS", "2000", 1);
            /* every rank prints nothing but rank 0; give each one a pipe all the same */
            dup2(p[1], 1);
            FILE *e = freopen(errpath[r], "w", stderr);
            (void)e;
            close(p[0]);
            close(p[1]);
            execl(cli(), cli(), "--layers", "2", "--channels", "64", "--heads", "4",
                  "--max-seq", "32", "--seq", "16", "--batch", "2", "--eval-every", "0",
                  "--threads", "1", "--steps", "1000000", "--parallel", "ddp", (char *)NULL);
            _exit(127);
        }
        close(p[1]);
        outfd[r] = p[0];
    }
    /* wait (on rank 0's output, no sleeping) until training is under way */
    char buf[4096];
    size_t have = 0;
    double t0 = now_s();
    while (!memmem(buf, have, "step     3/", 11)) {
        struct pollfd pf = {.fd = outfd[0], .events = POLLIN};
        int pr = poll(&pf, 1, 20000);
        ssize_t k = pr > 0 ? read(outfd[0], buf + have, sizeof buf - 1 - have) : -1;
        if (k <= 0) {
            for (int r = 0; r < N; r++)
                kill(pid[r], SIGKILL);
            char *e0 = th_read(errpath[0], NULL);
            cr_assert_fail("rank 0 never reached step 3: %s", e0 ? e0 : "");
        }
        have += (size_t)k;
        if (have > sizeof buf / 2) { /* keep the tail */
            memmove(buf, buf + have - 64, 64);
            have = 64;
        }
    }
    kill(pid[VICTIM], SIGKILL);
    double t_kill = now_s();
    waitpid(pid[VICTIM], NULL, 0);
    /* the survivors must exit by themselves: read their output to EOF, then reap */
    for (int r = 0; r < N; r++) {
        if (r == VICTIM)
            continue;
        for (;;) {
            struct pollfd pf = {.fd = outfd[r], .events = POLLIN};
            int left = (int)((t_kill + 20.0 - now_s()) * 1000);
            if (left <= 0 || poll(&pf, 1, left) <= 0) {
                for (int q = 0; q < N; q++)
                    kill(pid[q], SIGKILL);
                cr_assert_fail("rank %d still running 20 s after rank %d was killed", r,
                               VICTIM);
            }
            if (read(outfd[r], buf, sizeof buf) <= 0)
                break;
        }
        int st = 0;
        waitpid(pid[r], &st, 0);
        double took = now_s() - t_kill;
        char *e = th_read(errpath[r], NULL);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0,
                  "rank %d did not fail after rank %d died (status %d): %s", r, VICTIM, st,
                  e ? e : "");
        char want[32];
        snprintf(want, sizeof want, "rank %d of %d:", r, N);
        cr_assert(e && strstr(e, want), "rank %d's error does not say who it is: %s", r,
                  e ? e : "");
        cr_log_info("rank %d exited %.2f s after the kill: %s", r, took, e);
        free(e);
    }
    cr_log_info("started %.2f s before the kill", t_kill - t0);
    for (int r = 0; r < N; r++) {
        close(outfd[r]);
        free(errpath[r]);
    }
    th_rmrf(dir);
    free(dir);
}
