/* Process groups (include/ebb/dist.h): ranks of this very program, started
 * as child processes on loopback, join a group and check what its
 * collectives give; a rank that is killed, one that hangs and a rendezvous
 * nobody serves must fail the others with EBB_ERR_DIST within their timeout,
 * naming the rank. Every child is waited for with a deadline, and killed
 * past it, so no test can hang. */
#define _GNU_SOURCE /* posix_spawn, clock_gettime */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

extern char **environ;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A port nobody listens on now: the kernel's choice for a socket bound to 0. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* ---- the children ---------------------------------------------------------- */

#define CHILD_FAIL(...)                                                                            \
    do {                                                                                           \
        fprintf(stderr, "[rank %d] ", rank);                                                       \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        return 1;                                                                                  \
    } while (0)

static ebb_tensor *filled(int64_t n, double v, ebb_dtype dt) {
    ebb_shape s = {1, {n}};
    ebb_tensor *t = NULL;
    return ebb_tensor_full(&t, &s, v, dt, ebb_device_cpu()) == EBB_OK ? t : NULL;
}

static int all_equal(const ebb_tensor *t, double v) {
    double h[64];
    int64_t n = ebb_shape_numel(&(ebb_shape){ebb_tensor_ndim(t), {0}}) ? 0 : 0;
    ebb_shape s = ebb_tensor_shape(t);
    n = ebb_shape_numel(&s);
    ebb_tensor *d = NULL;
    if (n > 64 || ebb_tensor_cast(&d, t, EBB_FLOAT64) != EBB_OK)
        return 0;
    int ok = ebb_tensor_to_host(d, h, (size_t)n * sizeof h[0]) == EBB_OK;
    ebb_tensor_free(d);
    for (int64_t i = 0; ok && i < n; i++)
        ok = h[i] == v;
    return ok;
}

/* Every collective, checked: broadcast from the last rank, the mean of
 * rank-dependent values, skipped NULL entries, a refused integer tensor,
 * a barrier. */
static int child_collectives(ebb_dist *d, int rank, int world) {
    if (ebb_dist_rank(d) != rank || ebb_dist_world_size(d) != world)
        CHILD_FAIL("rank %d, world %d", ebb_dist_rank(d), ebb_dist_world_size(d));
    ebb_tensor *a = filled(5, 10.0 + rank, EBB_FLOAT32), *b = filled(3, rank, EBB_FLOAT64);
    ebb_tensor *ints = filled(2, rank, EBB_INT64);
    ebb_tensor *list[3] = {a, NULL, b};
    int rc = 0;
    if (ebb_dist_broadcast_(d, &a, 1, world - 1) != EBB_OK || !all_equal(a, 10.0 + world - 1))
        rc = fprintf(stderr, "[rank %d] broadcast: %s\n", rank, ebb_errmsg());
    /* the mean of 0 .. world-1 for b; a is now the same everywhere */
    if (!rc && (ebb_dist_allreduce_mean_(d, list, 3) != EBB_OK || !all_equal(b, (world - 1) / 2.0) ||
                !all_equal(a, 10.0 + world - 1)))
        rc = fprintf(stderr, "[rank %d] allreduce: %s\n", rank, ebb_errmsg());
    if (!rc && ebb_dist_allreduce_mean_(d, &ints, 1) != EBB_ERR_ARG)
        rc = fprintf(stderr, "[rank %d] an int64 tensor was averaged\n", rank);
    if (!rc && ebb_dist_barrier(d) != EBB_OK)
        rc = fprintf(stderr, "[rank %d] barrier: %s\n", rank, ebb_errmsg());
    ebb_tensor_free(a);
    ebb_tensor_free(b);
    ebb_tensor_free(ints);
    return rc != 0 || ebb_tensor_live_count() != 0;
}

/* A collective with a rank gone (killed) or never joining (hanging): it must
 * fail with EBB_ERR_DIST naming this rank, within the timeout and a second. */
static int child_survivor(ebb_dist *d, int rank, int world, int timeout_ms) {
    usleep(300 * 1000); /* the victim is gone, or asleep */
    ebb_tensor *t = filled(4, 1.0, EBB_FLOAT32);
    double t0 = now_s();
    ebb_status st = ebb_dist_allreduce_mean_(d, &t, 1);
    double took = now_s() - t0;
    ebb_tensor_free(t);
    char want[32];
    snprintf(want, sizeof want, "rank %d of %d", rank, world);
    if (st != EBB_ERR_DIST || !strstr(ebb_errmsg(), want))
        CHILD_FAIL("the collective gave %s: %s", ebb_status_name(st), ebb_errmsg());
    if (took > timeout_ms / 1000.0 + 1.0)
        CHILD_FAIL("the collective failed after %.2f s, past its %d ms", took, timeout_ms);
    printf("[rank %d] %.2f s: %s\n", rank, took, ebb_errmsg());
    return 0;
}

/* A data-parallel training plan (ebb_train_options.data_parallel): buckets
 * of 4 KiB make several all-reduce steps, each followed by its parameters'
 * updates inside the backward; two AdamW steps run as planned (the second
 * to the byte), and every rank ends with the same parameters. */
static int child_plan(ebb_dist *d, int rank, int world) {
    ebb_spec *s = NULL;
    if (ebb_spec_load(&s, EBB_SOURCE_DIR "/specs/mlp.yaml") != EBB_OK)
        CHILD_FAIL("spec: %s", ebb_errmsg());
    ebb_shape xs = {2, {8, 64}}, ys = {1, {8}};
    ebb_dtype yd = EBB_INT64;
    ebb_train_options t = {.target_shapes = &ys, .n_target_shapes = 1, .target_dtypes = &yd,
                           .optimizer = {.kind = EBB_ADAMW, .lr = 1e-2},
                           .data_parallel = world, .allreduce_bucket_bytes = 4096};
    ebb_compile_options o = {.input_shapes = &xs, .n_input_shapes = 1, .train = &t};
    ebb_plan *p = NULL;
    ebb_model *m = NULL;
    ebb_optimizer *opt = NULL;
    ebb_tensor *x = NULL, *y = NULL;
    int rc = 0, buckets = 0, seen = 0, inside = 0;
    if (ebb_spec_compile(&p, s, &o) != EBB_OK) {
        fprintf(stderr, "[rank %d] compile: %s\n", rank, ebb_errmsg());
        ebb_spec_free(s);
        return 1;
    }
    for (int k = 0; k < ebb_plan_step_count(p); k++) {
        const ebb_plan_step *st = ebb_plan_step_at(p, k);
        buckets += st->kind == EBB_STEP_ALLREDUCE;
        seen |= st->kind == EBB_STEP_ALLREDUCE;
        inside |= seen && st->kind == EBB_STEP_UPDATE && k + 1 < ebb_plan_step_count(p) &&
                  ebb_plan_step_at(p, k + 1)->phase == EBB_PHASE_BACKWARD;
    }
    if (buckets < 2 || !inside || !ebb_plan_updates_in_backward(p))
        rc = fprintf(stderr, "[rank %d] %d buckets, updates inside the backward %d\n", rank,
                     buckets, inside);
    /* each rank its own batch, the same initial weights (seed 1) */
    if (!rc && (ebb_model_new(&m, p, ebb_device_cpu(), 1) != EBB_OK ||
                ebb_optimizer_new(&opt, m, &t.optimizer) != EBB_OK ||
                ebb_tensor_randn(&x, &xs, EBB_FLOAT32, ebb_device_cpu(), 10 + (uint64_t)rank) !=
                    EBB_OK ||
                ebb_tensor_zeros(&y, &ys, EBB_INT64, ebb_device_cpu()) != EBB_OK))
        rc = fprintf(stderr, "[rank %d] setup: %s\n", rank, ebb_errmsg());
    ebb_run_options ro = {.dist = d};
    for (int step = 0; !rc && step < 2; step++) {
        ebb_run_stats st = {0};
        double loss = 0;
        if (ebb_train_step_ex(p, m, opt, &x, &y, &loss, &ro, &st) != EBB_OK)
            rc = fprintf(stderr, "[rank %d] step %d: %s\n", rank, step, ebb_errmsg());
        else if (step ? st.measured_peak_bytes != st.planned_peak_bytes
                      : st.measured_peak_bytes > st.planned_peak_bytes)
            rc = fprintf(stderr, "[rank %d] step %d measured %lld, planned %lld\n", rank, step,
                         (long long)st.measured_peak_bytes, (long long)st.planned_peak_bytes);
    }
    /* the same parameters everywhere: each equals the ranks' mean of it */
    for (int i = 0; !rc && i < ebb_model_param_count(m); i++) {
        ebb_tensor *mine = ebb_model_param(m, ebb_model_param_name(m, i)), *mean = NULL;
        ebb_shape sh = ebb_tensor_shape(mine);
        size_t n = (size_t)ebb_shape_numel(&sh);
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        if (!a || !b || ebb_tensor_clone(&mean, mine) != EBB_OK ||
            ebb_dist_allreduce_mean_(d, &mean, 1) != EBB_OK ||
            ebb_tensor_to_host(mine, a, n * sizeof *a) != EBB_OK ||
            ebb_tensor_to_host(mean, b, n * sizeof *b) != EBB_OK)
            rc = fprintf(stderr, "[rank %d] compare: %s\n", rank, ebb_errmsg());
        for (size_t j = 0; !rc && j < n; j++)
            if (fabsf(a[j] - b[j]) > 1e-6f * (1.0f + fabsf(a[j])))
                rc = fprintf(stderr, "[rank %d] %s[%zu] is %g here, %g on average\n", rank,
                             ebb_model_param_name(m, i), j, a[j], b[j]);
        free(a);
        free(b);
        ebb_tensor_free(mean);
    }
    /* without its group the plan refuses to run */
    if (!rc) {
        double loss = 0;
        if (ebb_train_step(p, m, opt, &x, &y, &loss, NULL) != EBB_ERR_ARG ||
            !strstr(ebb_errmsg(), "averages its gradients over"))
            rc = fprintf(stderr, "[rank %d] ran without its group: %s\n", rank, ebb_errmsg());
    }
    ebb_tensor_free(x);
    ebb_tensor_free(y);
    ebb_optimizer_free(opt);
    ebb_model_free(m);
    ebb_plan_free(p);
    ebb_spec_free(s);
    return rc != 0;
}

static int child_main(int argc, char **argv) {
    if (argc != 7)
        return 2;
    const char *scenario = argv[2];
    int rank = atoi(argv[3]), world = atoi(argv[4]), port = atoi(argv[5]);
    int timeout_ms = atoi(argv[6]);
    if (ebb_init() != EBB_OK)
        return 2;
    ebb_dist_options o = {.rank = rank, .world_size = world, .master_port = port,
                          .timeout_ms = timeout_ms};
    ebb_dist *d = NULL;
    double t0 = now_s();
    ebb_status st = ebb_dist_open(&d, &o);
    if (!strcmp(scenario, "no_master")) {
        /* rank 1 of 2 alone: nobody serves the rendezvous */
        double took = now_s() - t0;
        char want[64];
        snprintf(want, sizeof want, "the rendezvous at 127.0.0.1:%d", port);
        if (st != EBB_ERR_DIST || !strstr(ebb_errmsg(), want) || !strstr(ebb_errmsg(), "rank 1 of 2"))
            CHILD_FAIL("open gave %s: %s", ebb_status_name(st), ebb_errmsg());
        if (took > timeout_ms / 1000.0 + 6.0)
            CHILD_FAIL("open failed after %.2f s, long past its %d ms", took, timeout_ms);
        printf("[rank %d] %.2f s: %s\n", rank, took, ebb_errmsg());
        return 0;
    }
    if (st != EBB_OK)
        CHILD_FAIL("open: %s", ebb_errmsg());
    int rc = 0;
    if (!strcmp(scenario, "collectives")) {
        rc = child_collectives(d, rank, world);
    } else if (!strcmp(scenario, "plan")) {
        rc = child_plan(d, rank, world);
    } else if (!strcmp(scenario, "killed") || !strcmp(scenario, "hanging")) {
        if (rank == world - 1) {
            if (!strcmp(scenario, "killed"))
                raise(SIGKILL);
            sleep((unsigned)(timeout_ms / 1000 + 3)); /* alive, never joining */
            _exit(0); /* the group's connections are the survivors' business */
        }
        rc = child_survivor(d, rank, world, timeout_ms);
        /* a group that failed cannot be left cleanly: what a trainer does too */
        fflush(stdout);
        _exit(rc);
    } else {
        rc = 2;
    }
    ebb_dist_free(d);
    return rc;
}

/* ---- the parent ------------------------------------------------------------ */

/* Starts ranks first .. first+n-1 of `world` running `scenario`, waits for
 * them until `deadline_s` (killing any left then), and returns how many
 * exited 0; *killed (may be NULL) receives how many died by a signal. */
static int run_ranks(const char *scenario, int world, int first, int n, int timeout_ms,
                     double deadline_s, int *killed) {
    int port = free_port();
    pid_t pids[8];
    assert_true(n <= 8);
    char sp[16], sw[16], sr[16], st[16];
    snprintf(sp, sizeof sp, "%d", port);
    snprintf(sw, sizeof sw, "%d", world);
    snprintf(st, sizeof st, "%d", timeout_ms);
    for (int i = 0; i < n; i++) {
        snprintf(sr, sizeof sr, "%d", first + i);
        char *argv[] = {"/proc/self/exe", "--child", (char *)scenario, sr, sw, sp, st, NULL};
        assert_int_equal(posix_spawn(&pids[i], "/proc/self/exe", NULL, NULL, argv, environ), 0);
    }
    int ok = 0, dead = 0, left = n;
    double end = now_s() + deadline_s;
    while (left > 0) {
        for (int i = 0; i < n; i++) {
            int status = 0;
            if (pids[i] <= 0 || waitpid(pids[i], &status, WNOHANG) != pids[i])
                continue;
            ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
            dead += WIFSIGNALED(status);
            pids[i] = 0;
            left--;
        }
        if (left > 0 && now_s() > end) {
            for (int i = 0; i < n; i++)
                if (pids[i] > 0) {
                    kill(pids[i], SIGKILL);
                    waitpid(pids[i], NULL, 0);
                    fprintf(stderr, "rank %d of %s ran past %.0f s: killed\n", first + i,
                            scenario, deadline_s);
                }
            break;
        }
        usleep(20 * 1000);
    }
    if (killed)
        *killed = dead;
    return ok;
}

static void collectives_2_ranks(void **state) {
    (void)state;
    assert_int_equal(run_ranks("collectives", 2, 0, 2, 10000, 60, NULL), 2);
}

static void collectives_4_ranks(void **state) {
    (void)state;
    assert_int_equal(run_ranks("collectives", 4, 0, 4, 10000, 90, NULL), 4);
}

static void training_plan_averages_in_buckets(void **state) {
    (void)state;
    assert_int_equal(run_ranks("plan", 2, 0, 2, 10000, 60, NULL), 2);
}

/* rank 1 of 2 is killed after joining: rank 0's collective fails at once */
static void killed_rank_fails_the_others(void **state) {
    (void)state;
    int killed = 0;
    assert_int_equal(run_ranks("killed", 2, 0, 2, 3000, 60, &killed), 1);
    assert_int_equal(killed, 1);
}

/* rank 1 of 2 joins and sleeps: rank 0 fails after the timeout (long
 * enough for both to load libtorch and meet on a busy machine) */
static void hanging_rank_times_out(void **state) {
    (void)state;
    assert_int_equal(run_ranks("hanging", 2, 0, 2, 4000, 60, NULL), 2);
}

/* rank 1 of 2, started alone: the rendezvous fails after its timeout */
static void unreachable_rendezvous(void **state) {
    (void)state;
    assert_int_equal(run_ranks("no_master", 2, 1, 1, 1000, 60, NULL), 1);
}

/* Options: refused out of range, and read from torchrun's environment. */
static void options_checked(void **state) {
    (void)state;
    ebb_dist *d = NULL;
    ebb_dist_options o = {.rank = 2, .world_size = 2, .master_port = 29500};
    assert_int_equal(ebb_dist_open(&d, &o), EBB_ERR_ARG);
    assert_errmsg_contains("rank 2 of world_size 2");
    o = (ebb_dist_options){.rank = 0, .world_size = 1, .master_port = 70000};
    assert_int_equal(ebb_dist_open(&d, &o), EBB_ERR_ARG);
    assert_errmsg_contains("master_port 70000");
    assert_null(d);
    /* a world of one needs no peer: every collective leaves the tensors */
    o.master_port = free_port();
    o.timeout_ms = 5000;
    assert_ok(ebb_dist_open(&d, &o));
    ebb_tensor *t = filled(3, 2.5, EBB_FLOAT32);
    assert_ok(ebb_dist_allreduce_mean_(d, &t, 1));
    assert_true(all_equal(t, 2.5));
    assert_ok(ebb_dist_broadcast_(d, &t, 1, 0));
    assert_int_equal(ebb_dist_broadcast_(d, &t, 1, 1), EBB_ERR_ARG);
    assert_ok(ebb_dist_barrier(d));
    ebb_tensor_free(t);
    ebb_dist_free(d);

    setenv("WORLD_SIZE", "4", 1);
    setenv("RANK", "3", 1);
    setenv("MASTER_ADDR", "10.0.0.7", 1);
    setenv("MASTER_PORT", "29511", 1);
    unsetenv("EBB_DIST_TIMEOUT_MS");
    assert_ok(ebb_dist_options_from_env(&o));
    assert_int_equal(o.rank, 3);
    assert_int_equal(o.world_size, 4);
    assert_string_equal(o.master_addr, "10.0.0.7");
    assert_int_equal(o.master_port, 29511);
    assert_int_equal(o.timeout_ms, 0);
    setenv("RANK", "4", 1);
    assert_int_equal(ebb_dist_options_from_env(&o), EBB_ERR_ARG);
    assert_errmsg_contains("RANK 4 is not below WORLD_SIZE 4");
    setenv("RANK", "x1", 1);
    assert_int_equal(ebb_dist_options_from_env(&o), EBB_ERR_ARG);
    assert_errmsg_contains("RANK is 'x1'");
    unsetenv("MASTER_PORT");
    setenv("RANK", "1", 1);
    assert_int_equal(ebb_dist_options_from_env(&o), EBB_ERR_ARG);
    assert_errmsg_contains("MASTER_PORT is not set");
    unsetenv("WORLD_SIZE");
    unsetenv("RANK");
    unsetenv("MASTER_ADDR");
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--child"))
        return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        EBB_TEST(options_checked),
        EBB_TEST(collectives_2_ranks),
        EBB_TEST(collectives_4_ranks),
        EBB_TEST(training_plan_averages_in_buckets),
        EBB_TEST(killed_rank_fails_the_others),
        EBB_TEST(hanging_rank_times_out),
        EBB_TEST(unreachable_rendezvous),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
