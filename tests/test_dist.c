/* Process groups (include/ebb/dist.h): ranks of this very program, started
 * as child processes on loopback, join a group and check what its
 * collectives give; a rank that is killed, one that hangs and a rendezvous
 * nobody serves must fail the others with EBB_ERR_DIST within their timeout,
 * naming the rank. Every child is waited for with a deadline, and killed
 * past it, so no test can hang. Two ranks also run as two "machines": two
 * network namespaces joined by a veth pair. */
#define _GNU_SOURCE /* posix_spawn, clock_gettime, setns, unshare, pipe2 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_net.h"
#include "test_util.h"

extern char **environ;

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

/* ZeRO's collectives. The reduce-scatter: tensors of two dtypes with
 * owners spread so that rank 0 owns two of one dtype, rank 1 all of the
 * other, the last rank one, and with 4 ranks rank 2 none (it only sends); a
 * NULL entry skipped. Each owner's tensor becomes the mean of every rank's
 * (10 (i + 1) + rank), the others keep their own values; an owner that is
 * not a rank is refused before anything travels. Then ebb_dist_sum and the
 * sharded clip_grad_norm_. */
static int child_zero(ebb_dist *d, int rank, int world) {
    enum { N = 6 };
    const int64_t size[N] = {3, 1, 0, 4, 2, 5};
    const int owner[N] = {0, world - 1, 0, 0, 1, 1};
    ebb_tensor *ts[N] = {0};
    int rc = 0;
    for (int i = 0; i < N; i++)
        if (size[i] && !(ts[i] = filled(size[i], 10.0 * (i + 1) + rank,
                                        i < 4 ? EBB_FLOAT32 : EBB_FLOAT64)))
            rc = fprintf(stderr, "[rank %d] filled: %s\n", rank, ebb_errmsg());
    if (!rc && ebb_dist_reduce_scatter_mean_(d, ts, owner, N) != EBB_OK)
        rc = fprintf(stderr, "[rank %d] reduce_scatter: %s\n", rank, ebb_errmsg());
    for (int i = 0; !rc && i < N; i++) {
        double want = 10.0 * (i + 1) + (owner[i] == rank ? (world - 1) / 2.0 : rank);
        if (ts[i] && !all_equal(ts[i], want))
            rc = fprintf(stderr, "[rank %d] reduce_scatter: tensor %d (owner %d) is not %g\n",
                         rank, i, owner[i], want);
    }
    /* the sum of host values, and the norm of gradients spread over the
     * ranks: rank r holds [r + 1] x 4 (the last of 4 ranks holds none), the
     * norm of them all is sqrt(4 sum (r + 1)^2), and max_norm half of it
     * scales every rank's by about 1/2 */
    double v[2] = {rank, 1};
    if (!rc && (ebb_dist_sum(d, v, 2) != EBB_OK || v[0] != world * (world - 1) / 2.0 ||
                v[1] != world))
        rc = fprintf(stderr, "[rank %d] sum: %g %g (%s)\n", rank, v[0], v[1], ebb_errmsg());
    int holds = !(world == 4 && rank == 3);
    ebb_tensor *g = holds ? filled(4, rank + 1, EBB_FLOAT32) : NULL;
    double sq = 0, total = -1;
    for (int r = 0; r < world; r++)
        sq += (world == 4 && r == 3) ? 0 : 4.0 * (r + 1) * (r + 1);
    if (!rc && ebb_dist_clip_grad_norm_(d, &g, 1, sqrt(sq) / 2, &total) != EBB_OK)
        rc = fprintf(stderr, "[rank %d] clip: %s\n", rank, ebb_errmsg());
    float got[4] = {0};
    if (!rc && g && ebb_tensor_to_host(g, got, sizeof got) != EBB_OK)
        rc = fprintf(stderr, "[rank %d] clip: %s\n", rank, ebb_errmsg());
    if (!rc && (fabs(total - sqrt(sq)) > 1e-6 * sqrt(sq) ||
                (g && fabs(got[0] - (rank + 1) * 0.5) > 1e-5 * (rank + 1))))
        rc = fprintf(stderr, "[rank %d] clip: norm %.9g (want %.9g), %.9g (want %.9g)\n", rank,
                     total, sqrt(sq), got[0], (rank + 1) * 0.5);
    ebb_tensor_free(g);
    /* one tensor listed twice (two gradients of one tensor): averaged once,
     * by the all-reduce and by the reduce-scatter (one owner for both) */
    ebb_tensor *twice = filled(3, 2.0 * rank, EBB_FLOAT32);
    ebb_tensor *pair[2] = {twice, twice};
    const int pair_owner[2] = {world - 1, world - 1};
    if (!rc && (ebb_dist_allreduce_mean_(d, pair, 2) != EBB_OK || !all_equal(twice, world - 1.0)))
        rc = fprintf(stderr, "[rank %d] allreduce of a tensor listed twice: %s\n", rank,
                     ebb_errmsg());
    ebb_tensor_free(twice);
    pair[0] = pair[1] = twice = filled(3, 2.0 * rank, EBB_FLOAT32);
    if (!rc && (ebb_dist_reduce_scatter_mean_(d, pair, pair_owner, 2) != EBB_OK ||
                !all_equal(twice, rank == world - 1 ? world - 1.0 : 2.0 * rank)))
        rc = fprintf(stderr, "[rank %d] reduce-scatter of a tensor listed twice: %s\n", rank,
                     ebb_errmsg());
    ebb_tensor_free(twice);
    int bad[N] = {0, world, 0, 0, 0, 0};
    char who[32];
    snprintf(who, sizeof who, "owner is rank %d", world);
    if (!rc && (ebb_dist_reduce_scatter_mean_(d, ts, bad, N) != EBB_ERR_ARG ||
                !strstr(ebb_errmsg(), who)))
        rc = fprintf(stderr, "[rank %d] an owner past the ranks: %s\n", rank, ebb_errmsg());
    for (int i = 0; i < N; i++)
        ebb_tensor_free(ts[i]);
    return rc;
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
    if (!rc)
        rc = child_zero(d, rank, world);
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
    double t0 = ebb_test_now_s();
    ebb_status st = ebb_dist_allreduce_mean_(d, &t, 1);
    double took = ebb_test_now_s() - t0;
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

/* A data-parallel training plan (ebb_train_options.parallel): buckets
 * of 4 KiB make several all-reduce steps, each followed by its parameters'
 * updates inside the backward; two AdamW steps run as planned (the second
 * to the byte), and every rank ends with the same parameters. `mode` 1:
 * the same sharded by ZeRO-1, loss-scaled and clipped by the norm, so the
 * buckets are reduce-scattered as they fill and every update waits for the
 * sharded unscale and clip after the backward; 2: sharded, the buckets'
 * reduce-scatters started while the backward goes on (parallel.overlap)
 * and their updates made when each is waited for. */
static int child_plan_of(ebb_dist *d, int rank, int world, int mode) {
    int zero = mode != 0, held = mode == 1, overlap = mode == 2;
    ebb_spec *s = NULL;
    if (ebb_spec_load(&s, EBB_SOURCE_DIR "/specs/mlp.yaml") != EBB_OK)
        CHILD_FAIL("spec: %s", ebb_errmsg());
    ebb_shape xs = {2, {8, 64}}, ys = {1, {8}};
    ebb_dtype yd = EBB_INT64;
    ebb_train_options t = {.target_shapes = &ys, .n_target_shapes = 1, .target_dtypes = &yd,
                           .optimizer = {.kind = EBB_ADAMW, .lr = 1e-2},
                           .parallel = {.world = world,
                                        .bucket_bytes = 4096,
                                        .zero = zero,
                                        .rank = zero ? rank : 0,
                                        .overlap = overlap},
                           .clip_grad_norm = held ? 0.5 : 0, .loss_scaling = held};
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
    int scattered = 0, in_backward = 0, started = 0;
    for (int k = 0; k < ebb_plan_step_count(p); k++) {
        const ebb_plan_step *st = ebb_plan_step_at(p, k);
        buckets += ebb_test_bucket_step(st->kind);
        scattered += ebb_test_scatter_step(st->kind);
        started += st->kind == EBB_STEP_ALLREDUCE_START ||
                   st->kind == EBB_STEP_REDUCE_SCATTER_START;
        int meets = ebb_test_bucket_step(st->kind) || st->kind == EBB_STEP_ALLREDUCE_WAIT ||
                    st->kind == EBB_STEP_REDUCE_SCATTER_WAIT || st->kind == EBB_STEP_BROADCAST;
        if (ebb_step_kind_is_collective(st->kind) != meets) {
            fprintf(stderr, "[rank %d] step %d (%s): collective %d, expected %d\n", rank, k,
                    st->op, ebb_step_kind_is_collective(st->kind), meets);
            rc = 1;
        }
        /* each kind is its op */
        if (ebb_test_bucket_step(st->kind) &&
            ((strncmp(st->op, "reduce_scatter", 14) == 0) != ebb_test_scatter_step(st->kind) ||
             (strstr(st->op, ".start") != NULL) !=
                 (st->kind == EBB_STEP_ALLREDUCE_START ||
                  st->kind == EBB_STEP_REDUCE_SCATTER_START))) {
            fprintf(stderr, "[rank %d] step %d: op %s of kind %d\n", rank, k, st->op,
                    (int)st->kind);
            rc = 1;
        }
        /* a bucket with backward steps after it travelled during the backward */
        in_backward |= seen && st->phase == EBB_PHASE_BACKWARD;
        seen |= ebb_test_bucket_step(st->kind);
        inside |= seen && st->kind == EBB_STEP_UPDATE && k + 1 < ebb_plan_step_count(p) &&
                  ebb_plan_step_at(p, k + 1)->phase == EBB_PHASE_BACKWARD;
    }
    /* (a sharded rank's own updates may all come after the backward) */
    if (buckets < 2 || !in_backward || (!zero && !inside) || (held && inside) ||
        (!zero && !ebb_plan_updates_in_backward(p)) ||
        (held && ebb_plan_updates_in_backward(p)) || scattered != (zero ? buckets : 0) ||
        (started > 0) != overlap)
        rc = fprintf(stderr, "[rank %d] %d buckets (%d reduce-scattered, %d started), one "
                     "during the backward %d, updates inside it %d\n", rank, buckets,
                     scattered, started, in_backward, inside);
    /* each rank its own batch, the same initial weights (seed 1) */
    if (!rc && (ebb_model_new(&m, p, ebb_device_cpu(), 1) != EBB_OK ||
                ebb_optimizer_new(&opt, m, &t.optimizer) != EBB_OK ||
                (held && ebb_optimizer_set_loss_scaling(opt, NULL) != EBB_OK) ||
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

static int child_plan(ebb_dist *d, int rank, int world) {
    int rc = 0;
    for (int mode = 0; mode < 3; mode++) /* the other ranks run every mode */
        rc |= child_plan_of(d, rank, world, mode);
    return rc;
}

/* ---- two machines ---------------------------------------------------------- */

/* Each rank's "machine": a network namespace of its own with loopback and
 * one end of a veth pair on this /24. Rank 0 serves the rendezvous on its
 * end's address, which rank 1 is given as its master_addr (MASTER_ADDR). */
static const char *const machine_addr[2] = {"10.77.0.1", "10.77.0.2"};

/* Moves this process into the network namespace at `path`
 * (/proc/PID/ns/net); 0, or errno. */
static int enter_netns(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int err = fd < 0 || setns(fd, CLONE_NEWNET) ? errno : 0;
    if (fd >= 0)
        close(fd);
    return err;
}

/* 0 when a TCP connection to addr:port is accepted, else its errno (a
 * connect is bounded by 2 s, should a packet vanish). */
static int tcp_reach(const char *addr, int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return errno;
    struct timeval tv = {.tv_sec = 2};
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, addr, &a.sin_addr);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int err = connect(fd, (struct sockaddr *)&a, sizeof a) ? errno : 0;
    close(fd);
    return err;
}

/* This namespace's IPv4 addresses are loopback's and `mine`, nothing else
 * (not the other machine's); *veth receives the interface that holds mine. */
static int child_own_addresses(int rank, const char *mine, char veth[IF_NAMESIZE]) {
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs))
        CHILD_FAIL("getifaddrs: %s", strerror(errno));
    int n = 0, others = 0;
    veth[0] = 0;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
            continue;
        char a[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, a, sizeof a);
        n++;
        if (!strcmp(a, mine)) {
            snprintf(veth, IF_NAMESIZE, "%s", i->ifa_name);
        } else if (strcmp(a, "127.0.0.1")) {
            fprintf(stderr, "[rank %d] %s has %s here\n", rank, i->ifa_name, a);
            others++;
        }
    }
    freeifaddrs(ifs);
    if (n != 2 || others || !veth[0])
        CHILD_FAIL("%d IPv4 addresses here, %d not loopback's nor %s", n, others, mine);
    return 0;
}

/* The bytes this namespace's interface `dev` has received and sent, from
 * /proc/self/net/dev (which shows the reader's namespace); 0 if not found. */
static int link_bytes(const char *dev, long long *rx, long long *tx) {
    FILE *f = fopen("/proc/self/net/dev", "r");
    char line[512];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        *colon = 0;
        long long v[9];
        found = !strcmp(line + strspn(line, " "), dev) &&
                sscanf(colon + 1, "%lld %lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1],
                       &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8]) == 9;
        if (found) {
            *rx = v[0];
            *tx = v[8];
        }
    }
    if (f)
        fclose(f);
    return found;
}

/* One rank on its own machine, after joining: its namespace has its own
 * address only; the rendezvous port answers on loopback on rank 0's machine
 * but is refused on rank 1's, while rank 0's veth address answers there, so
 * rank 1 reached the store over the link. Then the collectives and the
 * bucketed training plan run across it, and its counters show their bytes:
 * the MLP's 26,122 parameters (102 KiB) cross it three times each way (two
 * steps' buckets, then the final comparison). Every part runs even after
 * one failed, so that the other rank's collectives are met. */
static int child_machine(ebb_dist *d, int rank, int world, int port, double joined_s) {
    char veth[IF_NAMESIZE];
    long long rx0 = 0, tx0 = 0, rx = 0, tx = 0;
    int rc = child_own_addresses(rank, machine_addr[rank], veth);
    int lo = tcp_reach("127.0.0.1", port), master = tcp_reach(machine_addr[0], port);
    if (master != 0 || (rank == 0 ? lo != 0 : lo != ECONNREFUSED))
        rc = fprintf(stderr, "[rank %d] 127.0.0.1:%d here: %s; %s:%d: %s\n", rank, port,
                     lo ? strerror(lo) : "accepted", machine_addr[0], port,
                     master ? strerror(master) : "accepted");
    if (!rc && !link_bytes(veth, &rx0, &tx0))
        rc = fprintf(stderr, "[rank %d] no %s in /proc/self/net/dev\n", rank, veth);
    double t0 = ebb_test_now_s();
    if (child_collectives(d, rank, world))
        rc = 1;
    if (child_plan(d, rank, world))
        rc = 1;
    double took = ebb_test_now_s() - t0;
    if (!rc && (!link_bytes(veth, &rx, &tx) || rx - rx0 < 100 * 1024 || tx - tx0 < 100 * 1024))
        rc = fprintf(stderr, "[rank %d] %s carried %lld bytes in, %lld out\n", rank, veth,
                     rx - rx0, tx - tx0);
    if (!rc)
        printf("[rank %d] %s on %s: joined in %.2f s; collectives and 2 training steps in "
               "%.2f s, %lld KiB in and %lld KiB out over it; 127.0.0.1:%d %s\n",
               rank, machine_addr[rank], veth, joined_s, took, (rx - rx0) / 1024,
               (tx - tx0) / 1024, port, lo ? strerror(lo) : "accepted");
    return rc != 0;
}

static int child_main(int argc, char **argv) {
    if (argc != 7 && argc != 8)
        return 2;
    const char *scenario = argv[2];
    int rank = atoi(argv[3]), world = atoi(argv[4]), port = atoi(argv[5]);
    int timeout_ms = atoi(argv[6]);
    /* a machine of its own: its namespace before anything opens a socket */
    int err = argc == 8 ? enter_netns(argv[7]) : 0;
    if (err)
        CHILD_FAIL("setns %s: %s", argv[7], strerror(err));
    if (ebb_init() != EBB_OK)
        return 2;
    ebb_dist_options o = {.rank = rank, .world_size = world, .master_port = port,
                          .timeout_ms = timeout_ms};
    if (argc == 8)
        o.master_addr = machine_addr[0]; /* MASTER_ADDR: rank 0's machine */
    /* "job:ID" joins as job ID, "stranger" as another job */
    if (!strncmp(scenario, "job:", 4))
        o.job_id = scenario + 4;
    else if (!strcmp(scenario, "stranger"))
        o.job_id = "another";
    ebb_dist *d = NULL;
    double t0 = ebb_test_now_s();
    ebb_status st = ebb_dist_open(&d, &o);
    double took = ebb_test_now_s() - t0;
    const char *refused = !strcmp(scenario, "partial")    ? "ranks came within"
                          : !strcmp(scenario, "stranger") ? "its rank 0 runs job 'mine'"
                                                          : NULL;
    if (refused) {
        /* the rendezvous refuses this rank, within its timeout */
        if (st != EBB_ERR_DIST || !strstr(ebb_errmsg(), refused))
            CHILD_FAIL("open gave %s: %s", ebb_status_name(st), ebb_errmsg());
        if (took > timeout_ms / 1000.0 + 3.0)
            CHILD_FAIL("open failed after %.2f s, long past its %d ms", took, timeout_ms);
        printf("[rank %d] refused in %.2f s: %s\n", rank, took, ebb_errmsg());
        return 0;
    }
    if (!strcmp(scenario, "twin") && st != EBB_OK) {
        /* one of two processes given the same rank: refused by name */
        if (st != EBB_ERR_DIST || !strstr(ebb_errmsg(), "already joined as rank 1"))
            CHILD_FAIL("open gave %s: %s", ebb_status_name(st), ebb_errmsg());
        printf("[rank %d] refused: %s\n", rank, ebb_errmsg());
        return 3;
    }
    if (!strcmp(scenario, "no_master")) {
        /* rank 1 of 2 alone: nobody serves the rendezvous */
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
    } else if (!strcmp(scenario, "machine")) {
        rc = child_machine(d, rank, world, port, ebb_test_now_s() - t0);
    } else if (!strncmp(scenario, "job:", 4) || !strcmp(scenario, "twin")) {
        rc = ebb_dist_barrier(d) != EBB_OK;
        /* rank 0 serves the store until the parent has seen the other twin
         * turned away (twin_done), however late that one comes */
        char done[64];
        snprintf(done, sizeof done, "/tmp/ebb_twin_%d", port);
        for (int i = 0; !strcmp(scenario, "twin") && i < 600 && access(done, F_OK) != 0; i++)
            usleep(50 * 1000);
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

/* Waits for `pid` until `end` (ebb_test_now_s()), killing it then: its wait status,
 * or -1 when it had to be killed. */
static int reap(pid_t pid, double end) {
    int status = 0;
    pid_t r;
    while ((r = waitpid(pid, &status, WNOHANG)) == 0 || (r < 0 && errno == EINTR)) {
        if (ebb_test_now_s() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return -1;
        }
        usleep(1000);
    }
    return r == pid ? status : -1;
}

/* The two machines' network, built before their ranks start. */
typedef struct machines {
    pid_t holder[2]; /* a process in each namespace, keeping it alive */
    char skip[256];  /* why this machine cannot build them: the test skips */
    char error[512]; /* what failed once it could: the test fails */
} machines;

static const char *ip_path(void) {
    static const char *const where[] = {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"};
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++)
        if (access(where[i], X_OK) == 0)
            return where[i];
    return NULL;
}

/* Runs `ip` with the words of `fmt` inside the network namespace of process
 * `holder`, for at most 5 s: 0 when it succeeded, else -1 with the command
 * and what it printed in `why`. fork, not posix_spawn: the child must
 * setns() before it execs, and calls nothing else that is not
 * async-signal-safe (libtorch's threads run in this process). */
static int ip_in(pid_t holder, char *why, size_t len, const char *fmt, ...) {
    char cmd[160], words[160], out[256] = "", ns[32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    memcpy(words, cmd, sizeof words);
    char *argv[16] = {"ip"}, *save = NULL;
    int argc = 1;
    for (char *w = strtok_r(words, " ", &save); w && argc < 15; w = strtok_r(NULL, " ", &save))
        argv[argc++] = w;
    argv[argc] = NULL;
    const char *ip = ip_path();
    snprintf(ns, sizeof ns, "/proc/%d/ns/net", (int)holder);
    int fd = open(ns, O_RDONLY | O_CLOEXEC), p[2] = {-1, -1};
    pid_t pid = -1;
    if (ip && fd >= 0 && pipe2(p, O_CLOEXEC) == 0 && (pid = fork()) == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        if (setns(fd, CLONE_NEWNET) == 0)
            execv(ip, argv);
        _exit(127);
    }
    int err = errno;
    if (fd >= 0)
        close(fd);
    if (p[1] >= 0)
        close(p[1]);
    if (pid < 0) {
        if (p[0] >= 0)
            close(p[0]);
        snprintf(why, len, "ip %s: %s", cmd, ip ? strerror(err) : "no ip command");
        return -1;
    }
    /* what it prints, until it closes its end or the 5 s are up */
    double end = ebb_test_now_s() + 5;
    size_t got = 0;
    struct pollfd pf = {.fd = p[0], .events = POLLIN};
    while (got + 1 < sizeof out && ebb_test_now_s() < end) {
        if (poll(&pf, 1, 100) <= 0)
            continue;
        ssize_t r = read(p[0], out + got, sizeof out - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(p[0]);
    out[got] = 0;
    out[strcspn(out, "\n")] = 0;
    int status = reap(pid, end);
    if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    snprintf(why, len, "ip %s: %s", cmd,
             status == -1 ? "ran past 5 s" : *out ? out : "failed (exec or setns)");
    return -1;
}

/* A process alone in a new network namespace, keeping it alive: forked,
 * it unshares and pauses, and dies with this process (PR_SET_PDEATHSIG), so
 * the namespace and its end of the veth pair vanish even if the test is
 * killed; nothing is named under /run/netns. Its pid, or -1 with why. */
static pid_t netns_holder(char *why, size_t len) {
    int p[2];
    if (pipe2(p, O_CLOEXEC)) {
        snprintf(why, len, "pipe: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        int err = prctl(PR_SET_PDEATHSIG, SIGKILL) || unshare(CLONE_NEWNET) ? errno : 0;
        if (write(p[1], &err, sizeof err) != sizeof err || err)
            _exit(1);
        for (;;)
            pause();
    }
    int err = pid < 0 ? errno : ETIMEDOUT;
    close(p[1]);
    struct pollfd pf = {.fd = p[0], .events = POLLIN};
    if (pid > 0 && poll(&pf, 1, 5000) == 1 && read(p[0], &err, sizeof err) != sizeof err)
        err = EIO;
    close(p[0]);
    if (!err)
        return pid;
    snprintf(why, len, "unshare(CLONE_NEWNET): %s", strerror(err));
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return -1;
}

/* Builds the two machines: a namespace each, a veth pair made inside the
 * first with its peer moved to the second (so it never appears in this
 * one), each end's address, the links and loopback up. What this machine
 * does not permit (no ip, no new namespace, no veth) goes to skip. */
static int machines_setup(void **state) {
    if (ebb_test_setup(state))
        return -1;
    machines *m = calloc(1, sizeof *m);
    if (!m)
        return -1;
    *state = m;
    char veth[2][16];
    snprintf(veth[0], sizeof veth[0], "ebb%da", (int)getpid());
    snprintf(veth[1], sizeof veth[1], "ebb%db", (int)getpid());
    if (!ip_path()) {
        snprintf(m->skip, sizeof m->skip,
                 "no ip command (iproute2) in /usr/sbin, /sbin, /usr/bin or /bin");
        return 0;
    }
    for (int i = 0; i < 2; i++)
        if ((m->holder[i] = netns_holder(m->skip, sizeof m->skip)) < 0)
            return 0;
    if (ip_in(m->holder[0], m->skip, sizeof m->skip, "link add %s type veth peer name %s netns %d",
              veth[0], veth[1], (int)m->holder[1]))
        return 0;
    for (int i = 0; i < 2; i++)
        if (ip_in(m->holder[i], m->error, sizeof m->error, "addr add %s/24 dev %s", machine_addr[i],
                  veth[i]) ||
            ip_in(m->holder[i], m->error, sizeof m->error, "link set %s up", veth[i]) ||
            ip_in(m->holder[i], m->error, sizeof m->error, "link set lo up"))
            break;
    return 0;
}

/* Ends the holders, whatever the test did: the namespaces and the veth
 * pair go with them. */
static int machines_teardown(void **state) {
    machines *m = *state;
    for (int i = 0; m && i < 2; i++)
        if (m->holder[i] > 0) {
            kill(m->holder[i], SIGKILL);
            waitpid(m->holder[i], NULL, 0);
        }
    free(m);
    return ebb_test_teardown(state);
}

/* Starts ranks first .. first+n-1 of `world` running `scenario`, on
 * loopback, or each on its machine of `m` when not NULL; waits for them
 * until `deadline_s` (killing any left then), and returns how many exited 0;
 * *killed (may be NULL) receives how many died by a signal. */
/* Starts this test as a child: `scenario` as rank `rank` of `world` at
 * `port`, in the network namespace `netns` (NULL: this one's). */
static pid_t spawn_child(const char *scenario, int rank, int world, int port, int timeout_ms,
                         const char *netns) {
    char sp[16], sw[16], sr[16], st[16];
    snprintf(sp, sizeof sp, "%d", port);
    snprintf(sw, sizeof sw, "%d", world);
    snprintf(sr, sizeof sr, "%d", rank);
    snprintf(st, sizeof st, "%d", timeout_ms);
    char *argv[] = {"/proc/self/exe", "--child", (char *)scenario, sr, sw, sp, st,
                    (char *)netns, NULL};
    pid_t pid = 0;
    assert_int_equal(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ), 0);
    return pid;
}

/* Waits for the children pids[0..n) (0: one already reaped) until
 * deadline_s from now, killing those still running then; status[i] is each
 * one's wait status, or -1 for one that had to be killed. */
static void reap_children(pid_t *pids, int n, double deadline_s, int *status) {
    int left = 0;
    for (int i = 0; i < n; i++) left += pids[i] > 0; /* 0: reaped before */
    double end = ebb_test_now_s() + deadline_s;
    while (left > 0) {
        for (int i = 0; i < n; i++) {
            if (pids[i] <= 0 || waitpid(pids[i], &status[i], WNOHANG) != pids[i])
                continue;
            pids[i] = 0;
            left--;
        }
        if (left > 0 && ebb_test_now_s() > end) {
            for (int i = 0; i < n; i++)
                if (pids[i] > 0) {
                    kill(pids[i], SIGKILL);
                    waitpid(pids[i], NULL, 0);
                    fprintf(stderr, "child %d ran past %.0f s: killed\n", i, deadline_s);
                    status[i] = -1;
                }
            break;
        }
        usleep(20 * 1000);
    }
}

static int run_ranks_on(const machines *m, const char *scenario, int world, int first, int n,
                        int timeout_ms, double deadline_s, int *killed) {
    int port = ebb_test_free_port();
    pid_t pids[8];
    int status[8];
    assert_true(n <= 8 && (!m || first + n <= 2));
    for (int i = 0; i < n; i++) {
        char ns[32];
        snprintf(ns, sizeof ns, "/proc/%d/ns/net", m ? (int)m->holder[first + i] : 0);
        pids[i] = spawn_child(scenario, first + i, world, port, timeout_ms, m ? ns : NULL);
    }
    reap_children(pids, n, deadline_s, status);
    int ok = 0, dead = 0;
    for (int i = 0; i < n; i++) {
        ok += status[i] != -1 && WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0;
        dead += status[i] != -1 && WIFSIGNALED(status[i]);
    }
    if (killed)
        *killed = dead;
    return ok;
}

static int run_ranks(const char *scenario, int world, int first, int n, int timeout_ms,
                     double deadline_s, int *killed) {
    return run_ranks_on(NULL, scenario, world, first, n, timeout_ms, deadline_s, killed);
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

/* Two ranks as two machines (machines_setup): rank 0 at 10.77.0.1 serves
 * the rendezvous there, rank 1 at 10.77.0.2 joins it over the veth pair;
 * then collectives and the bucketed training plan across the link. */
static void two_machines_over_a_veth_pair(void **state) {
    machines *m = *state;
    if (m->error[0])
        fail_msg("the two machines: %s", m->error);
    if (m->skip[0]) {
        printf("skipped: two network namespaces joined by a veth pair need CAP_SYS_ADMIN and "
               "CAP_NET_ADMIN (root, or root in a user namespace: unshare -U -r), iproute2's ip "
               "and the veth driver; here: %s\n", m->skip);
        skip();
    }
    double t0 = ebb_test_now_s();
    assert_int_equal(run_ranks_on(m, "machine", 2, 0, 2, 10000, 60, NULL), 2);
    printf("two machines: %.2f s in all\n", ebb_test_now_s() - t0);
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

/* 2 ranks of a world of 8 come: both are refused, saying how many came,
 * within the timeout (Gloo's own connect would not keep to it) */
static void a_partial_world_times_out(void **state) {
    (void)state;
    double t0 = ebb_test_now_s();
    assert_int_equal(run_ranks("partial", 8, 0, 2, 2000, 60, NULL), 2);
    printf("refused in %.2f s with the libtorch loads\n", ebb_test_now_s() - t0);
}

/* Two jobs on one port: a rank of another job is refused by its job id,
 * and a second process given rank 1 by its rank; the job itself runs. */
static void strangers_are_refused(void **state) {
    (void)state;
    int port = ebb_test_free_port(), status[4];
    pid_t pids[4];
    pids[0] = spawn_child("job:mine", 0, 2, port, 8000, NULL);
    pids[1] = spawn_child("stranger", 1, 2, port, 8000, NULL);
    reap_children(pids + 1, 1, 60, status + 1); /* refused before anyone claims rank 1 */
    pids[2] = spawn_child("job:mine", 1, 2, port, 8000, NULL);
    reap_children(pids, 3, 60, status);
    for (int i = 0; i < 3; i++)
        assert_true(status[i] != -1 && WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0);
    /* hand-started, with no job id: one of two rank 1s is turned away; the
     * two that joined wait for it (a file) before they leave */
    port = ebb_test_free_port();
    char done[64];
    snprintf(done, sizeof done, "/tmp/ebb_twin_%d", port);
    unlink(done);
    pids[0] = spawn_child("twin", 0, 2, port, 20000, NULL);
    pids[1] = spawn_child("twin", 1, 2, port, 20000, NULL);
    pids[2] = spawn_child("twin", 1, 2, port, 20000, NULL);
    int first = -1;
    for (double end = ebb_test_now_s() + 60; first < 0 && ebb_test_now_s() < end;) {
        for (int i = 0; i < 3 && first < 0; i++)
            if (waitpid(pids[i], &status[i], WNOHANG) == pids[i]) first = i;
        usleep(20 * 1000);
    }
    FILE *f = fopen(done, "w");
    assert_non_null(f);
    fclose(f);
    if (first >= 0) pids[first] = 0;
    reap_children(pids, 3, 60, status);
    unlink(done);
    assert_true(first >= 0);
    int joined = 0, refused = 0;
    for (int i = 0; i < 3; i++) {
        assert_true(status[i] != -1 && WIFEXITED(status[i]));
        joined += WEXITSTATUS(status[i]) == 0;
        refused += WEXITSTATUS(status[i]) == 3;
    }
    assert_int_equal(joined, 2);
    assert_int_equal(refused, 1);
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
    o.master_port = ebb_test_free_port();
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
    unsetenv("EBB_JOB_ID");
    unsetenv("TORCHELASTIC_RUN_ID");
    assert_ok(ebb_dist_options_from_env(&o));
    assert_int_equal(o.rank, 3);
    assert_int_equal(o.world_size, 4);
    assert_string_equal(o.master_addr, "10.0.0.7");
    assert_int_equal(o.master_port, 29511);
    assert_int_equal(o.timeout_ms, 0);
    assert_null(o.job_id);
    setenv("TORCHELASTIC_RUN_ID", "torchrun-id", 1);
    assert_ok(ebb_dist_options_from_env(&o));
    assert_string_equal(o.job_id, "torchrun-id");
    setenv("EBB_JOB_ID", "ebb-id", 1);
    assert_ok(ebb_dist_options_from_env(&o));
    assert_string_equal(o.job_id, "ebb-id");
    unsetenv("EBB_JOB_ID");
    unsetenv("TORCHELASTIC_RUN_ID");
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

/* A group on a CUDA device runs NCCL's collectives. Without a GPU (or in
 * a build without NCCL) the open is refused, naming why; with one
 * (EBB_TEST_DEVICE=cuda), a group of one on it runs every collective
 * through NCCL (one GPU per rank: NCCL refuses two ranks on one device, so
 * a machine with one GPU can run no more) and refuses CPU tensors. */
static void nccl_on_a_gpu(void **state) {
    (void)state;
    ebb_device dev = ebb_test_device();
    ebb_dist *d = NULL;
    ebb_dist_options o = {.rank = 0, .world_size = 1, .master_port = ebb_test_free_port(),
                          .timeout_ms = 20000, .device = ebb_device_cuda(0)};
    /* torchrun's variables leave the device as it was */
    setenv("WORLD_SIZE", "1", 1);
    setenv("RANK", "0", 1);
    char port[16];
    snprintf(port, sizeof port, "%d", o.master_port);
    setenv("MASTER_PORT", port, 1);
    assert_ok(ebb_dist_options_from_env(&o));
    unsetenv("WORLD_SIZE");
    unsetenv("RANK");
    unsetenv("MASTER_PORT");
    assert_int_equal(o.device.type, EBB_DEVICE_CUDA);
    o.timeout_ms = 20000;
    if (dev.type != EBB_DEVICE_CUDA) {
        ebb_status st = ebb_dist_open(&d, &o);
        assert_null(d);
        if (st == EBB_ERR_UNSUPPORTED)
            assert_errmsg_contains("needs NCCL, and this build has none");
        else {
            assert_int_equal(st, EBB_ERR_ARG);
            assert_errmsg_contains("cuda:0 is not one of this machine's");
        }
        return;
    }
    ebb_status st = ebb_dist_open(&d, &o);
    if (st != EBB_OK)
        fail_msg("ebb_dist_open on cuda:0: %s", ebb_errmsg());
    assert_int_equal(ebb_dist_device(d).type, EBB_DEVICE_CUDA);
    ebb_tensor *h = filled(5, 2.5, EBB_FLOAT32), *t = NULL, *u = NULL, *flat = NULL;
    assert_ok(ebb_tensor_to(&t, h, dev, EBB_FLOAT32));
    assert_ok(ebb_tensor_to(&u, h, dev, EBB_FLOAT64));
    ebb_tensor *both[2] = {t, u};
    assert_ok(ebb_dist_allreduce_mean_(d, both, 2));
    assert_true(all_equal(t, 2.5) && all_equal(u, 2.5));
    assert_ok(ebb_dist_broadcast_(d, both, 2, 0));
    assert_true(all_equal(t, 2.5) && all_equal(u, 2.5));
    ebb_dist_work *w = NULL;
    assert_ok(ebb_dist_allreduce_mean_start(d, &t, 1, &flat, &w));
    assert_ok(ebb_dist_work_finish(w));
    assert_true(all_equal(t, 2.5));
    assert_ok(ebb_dist_barrier(d));
    /* a CPU tensor is not the group's */
    assert_int_equal(ebb_dist_allreduce_mean_(d, &h, 1), EBB_ERR_ARG);
    assert_errmsg_contains("on cuda:0");
    ebb_tensor_free(flat);
    ebb_tensor_free(h);
    ebb_tensor_free(t);
    ebb_tensor_free(u);
    ebb_dist_free(d);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--child"))
        return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        EBB_TEST(options_checked),
        EBB_TEST(collectives_2_ranks),
        EBB_TEST(collectives_4_ranks),
        EBB_TEST(training_plan_averages_in_buckets),
        cmocka_unit_test_setup_teardown(two_machines_over_a_veth_pair, machines_setup,
                                        machines_teardown),
        EBB_TEST(killed_rank_fails_the_others),
        EBB_TEST(hanging_rank_times_out),
        EBB_TEST(unreachable_rendezvous),
        EBB_TEST(a_partial_world_times_out),
        EBB_TEST(strangers_are_refused),
        EBB_TEST(nccl_on_a_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
