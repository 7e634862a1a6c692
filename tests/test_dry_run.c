/* The compiler's dry run allocates nothing real: every registered op computes
 * its output shape on meta tensors, so planning a graph whose activations
 * would need many gigabytes stays small and quick, and reports the peak.
 * User ops without a meta kernel give a shape function; those with neither
 * may fall back on CPU stand-ins only while those stay small. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

static const ebb_device CPU = {EBB_DEVICE_CPU, 0};

/* ---- one-op graphs for every op in the registry --------------------------- */

#define MAX_CASE_INPUTS 5

/* A valid call of an op: attributes in ebb_node_op() text, input shapes and
 * dtypes (0 is float32). An op may have several cases (input counts, modes). */
typedef struct op_case {
    const char *op;
    const char *attrs;
    int n_in;
    ebb_shape shapes[MAX_CASE_INPUTS];
    ebb_dtype dtypes[MAX_CASE_INPUTS];
} op_case;

#define S EBB_SHAPE
static const op_case cases[] = {
    /* activations */
    {"relu", NULL, 1, {S(4, 8)}, {0}},
    {"gelu", NULL, 1, {S(4, 8)}, {0}},
    {"tanh", NULL, 1, {S(4, 8)}, {0}},
    {"sigmoid", NULL, 1, {S(4, 8)}, {0}},
    {"silu", NULL, 1, {S(4, 8)}, {0}},
    {"identity", NULL, 1, {S(4, 8)}, {0}},
    {"dropout", "p=0.1", 1, {S(4, 8)}, {0}},
    {"softmax", "dim=-1", 1, {S(4, 8)}, {0}},
    {"log_softmax", "dim=0", 1, {S(4, 8)}, {0}},
    /* linear */
    {"linear", "out=16", 1, {S(4, 8)}, {0}},
    {"linear", "out=16, bias=false", 1, {S(2, 3, 8)}, {0}},
    {"learned_halt", NULL, 1, {S(4, 8)}, {0}},
    /* normalisation */
    {"layer_norm", NULL, 1, {S(4, 8)}, {0}},
    {"layer_norm", "affine=false", 1, {S(2, 3, 8)}, {EBB_FLOAT64}},
    {"batch_norm", NULL, 1, {S(2, 3, 5, 5)}, {0}},
    {"batch_norm", "affine=false", 1, {S(2, 3)}, {0}},
    {"rms_norm", NULL, 1, {S(4, 8)}, {0}},
    {"group_norm", "num_groups=2", 1, {S(2, 4, 5, 5)}, {0}},
    /* combining */
    {"add", NULL, 2, {S(4, 8), S(4, 8)}, {0}},
    {"add", NULL, 3, {S(4, 8), S(4, 8), S(8)}, {0}},
    {"mul", NULL, 3, {S(4, 8), S(4, 8), S(4, 8)}, {0}},
    {"average", NULL, 3, {S(4, 8), S(4, 8), S(4, 8)}, {0}},
    {"maximum", NULL, 3, {S(4, 8), S(4, 8), S(4, 8)}, {0}},
    {"cat", "dim=1", 2, {S(4, 8), S(4, 3)}, {0}},
    {"stack", "dim=0", 2, {S(4, 8), S(4, 8)}, {0}},
    {"stack", NULL, 1, {S(4, 8)}, {0}},
    /* routing */
    {"threshold_halt", "threshold=0.1", 1, {S(4, 8)}, {0}},
    {"_gate_mix", "index=1", 2, {S(4, 3), S(4, 8)}, {0}},
    {"_gate_mix", "index=2", 3, {S(4, 8), S(4, 3), S(4, 8)}, {0}},
    /* convolution and pooling */
    {"conv1d", "out=6, kernel=3", 1, {S(2, 3, 10)}, {0}},
    {"conv2d", "out=6, kernel=3, padding=1, groups=3", 1, {S(2, 3, 10, 10)}, {0}},
    {"max_pool2d", "kernel=2", 1, {S(2, 3, 8, 8)}, {0}},
    {"max_pool2d", "kernel=3, stride=2, padding=1, ceil_mode=true", 1, {S(3, 9, 9)}, {0}},
    {"avg_pool2d", "kernel=2", 1, {S(2, 3, 8, 8)}, {0}},
    {"adaptive_avg_pool2d", "output_size=1", 1, {S(2, 3, 8, 8)}, {0}},
    /* embedding */
    {"embedding", "num=10, dim=4", 1, {S(2, 5)}, {EBB_INT64}},
    {"embedding", "num=10, dim=4", 1, {S(7)}, {EBB_INT32}},
    {"positions", NULL, 1, {S(2, 5, 4)}, {0}},
    {"positions", "dim=0", 1, {S(3)}, {EBB_INT64}},
    {"scaled_dot_product_attention", "causal=true", 3, {S(2, 4, 5, 8), S(2, 4, 5, 8), S(2, 4, 5, 8)},
     {0}},
    {"scaled_dot_product_attention", NULL, 3, {S(3, 5, 8), S(3, 7, 8), S(3, 7, 6)}, {0}},
    {"_cached_attention", "repeats=2", 5,
     {S(2, 4, 3, 8), S(2, 2, 3, 8), S(2, 2, 3, 8), S(2, 2, 10, 8), S(2, 2, 10, 8)}, {0}},
    /* attention */
    {"multi_head_attention", "num_heads=2", 1, {S(2, 5, 8)}, {0}},
    {"multi_head_attention", "num_heads=2, causal=true, bias=false", 2, {S(2, 5, 8), S(2, 7, 8)},
     {0}},
    {"multi_head_attention", "num_heads=4", 3, {S(2, 5, 8), S(2, 7, 8), S(2, 7, 8)}, {0}},
    /* recurrent cells */
    {"gru_cell", "hidden=8", 1, {S(4, 8)}, {0}},
    {"gru_cell", "hidden=8", 2, {S(4, 8), S(4, 5)}, {0}},
    {"lstm_cell", "hidden=8", 1, {S(4, 16)}, {0}},
    {"lstm_cell", "hidden=8, bias=false", 2, {S(4, 16), S(4, 5)}, {0}},
    /* shape */
    {"flatten", NULL, 1, {S(2, 3, 4)}, {0}},
    {"reshape", "shape=\"-1,4\"", 1, {S(2, 3, 4)}, {0}},
    {"permute", "dims=\"2,0,1\"", 1, {S(2, 3, 4)}, {0}},
    {"transpose", "dim0=0, dim1=2", 1, {S(2, 3, 4)}, {0}},
    {"narrow", "dim=1, start=1, length=2", 1, {S(2, 3, 4)}, {0}},
    {"matmul", NULL, 2, {S(2, 3, 4, 5), S(5, 6)}, {0}},
    {"masked_fill", NULL, 2, {S(2, 4, 4), S(4, 4)}, {0, EBB_BOOL}},
    {"causal_mask", NULL, 1, {S(2, 4, 4)}, {0}},
    {"unsqueeze", "dim=1", 1, {S(2, 3)}, {0}},
    {"squeeze", "dim=1", 1, {S(2, 1, 4)}, {0}},
    {"squeeze", NULL, 1, {S(2, 1, 4, 1)}, {0}},
    /* math */
    {"cast", "dtype=bfloat16", 1, {S(4, 8)}, {0}},
    {"scale", "factor=0.5", 1, {S(4, 8)}, {0}},
    {"rotary_embedding", NULL, 1, {S(2, 4, 16, 8)}, {0}},
    {"repeat_kv", "repeats=4", 1, {S(2, 2, 16, 8)}, {0}},
    {"neg", NULL, 1, {S(4, 8)}, {0}},
    {"exp", NULL, 1, {S(4, 8)}, {0}},
    {"log", NULL, 1, {S(4, 8)}, {0}},
    {"sqrt", NULL, 1, {S(4, 8)}, {0}},
    {"rsqrt", NULL, 1, {S(4, 8)}, {0}},
    {"abs", NULL, 1, {S(4, 8)}, {0}},
    {"sin", NULL, 1, {S(4, 8)}, {0}},
    {"cos", NULL, 1, {S(4, 8)}, {0}},
    {"pow", "exponent=3", 1, {S(4, 8)}, {0}},
    {"clamp", "min=-1, max=1", 1, {S(4, 8)}, {0}},
    {"sub", NULL, 2, {S(4, 8), S(8)}, {0}},
    {"where", NULL, 3, {S(4, 8), S(4, 1), S(8)}, {0, EBB_BOOL, 0}},
    {"div", NULL, 2, {S(4, 1), S(4, 8)}, {0}},
    {"mean", "dim=1", 1, {S(4, 8)}, {0}},
    {"mean", NULL, 1, {S(4, 8)}, {0}},
    {"sum", "dims=\"0,1\", keepdim=true", 1, {S(2, 3, 4)}, {0}},
    /* losses: in[1] is the target */
    {"cross_entropy", "label_smoothing=0.1", 2, {S(4, 10), S(4)}, {0, EBB_INT64}},
    {"nll", NULL, 2, {S(4, 10), S(4)}, {0, EBB_INT64}},
    {"mse", NULL, 2, {S(4, 8), S(4, 8)}, {0}},
    {"bce_with_logits", NULL, 2, {S(4, 8), S(4, 8)}, {0}},
};
#undef S

static const char *const input_names[MAX_CASE_INPUTS] = {"x0", "x1", "x2", "x3", "x4"};

/* One graph: the op applied to x0, with x1.. given by `using`. */
static ebb_graph *one_op_graph(const op_case *c) {
    ebb_builder *b = ebb_builder_new(c->op);
    for (int i = 0; i < c->n_in; i++)
        ebb_input(b, input_names[i]);
    if (c->n_in > 1)
        ebb_usingv(b, input_names + 1, c->n_in - 1);
    ebb_from(b, ebb_node_op(b, c->op, c->attrs));
    ebb_graph *g = ebb_build(b);
    ebb_builder_free(b);
    return g;
}

/* Compiles one case and returns the real CPU bytes its compile allocated at
 * its highest, or -1 on failure (with the error in ebb_errmsg()). */
static int64_t compile_bytes(const op_case *c, int64_t *allocations) {
    ebb_graph *g = one_op_graph(c);
    if (!g)
        return -1;
    ebb_dtype dts[MAX_CASE_INPUTS];
    for (int i = 0; i < c->n_in; i++)
        dts[i] = c->dtypes[i] ? c->dtypes[i] : EBB_FLOAT32;
    ebb_compile_options o = {.input_shapes = c->shapes, .n_input_shapes = c->n_in,
                             .input_dtypes = dts};
    ebb_memory_stats before, after;
    ebb_memory_reset_peak(CPU);
    assert_ok(ebb_memory_stats_get(CPU, &before));
    ebb_plan *p = NULL;
    ebb_status st = ebb_compile(&p, g, &o);
    assert_ok(ebb_memory_stats_get(CPU, &after));
    ebb_plan_free(p);
    ebb_graph_free(g);
    if (st != EBB_OK)
        return -1;
    *allocations = after.allocations - before.allocations;
    return after.peak_bytes - before.current_bytes;
}

/* The user ops the tests below register (not built in, no case here). */
static ebb_status cpu_only_fwd(const ebb_op_call *c, ebb_tensor **out);
static ebb_status shaped_fwd(const ebb_op_call *c, ebb_tensor **out);

static void test_every_op_dry_runs_on_meta(void **state) {
    (void)state;
    int n_ops = ebb_op_count(), checked = 0;
    assert_true(n_ops > 0);
    /* every failure is listed, so one run names every op to fix */
    static char failures[16384];
    size_t at = 0;
    failures[0] = 0;
#define FAILURE(...)                                                                               \
    do {                                                                                           \
        if (at < sizeof failures)                                                                  \
            at += (size_t)snprintf(failures + at, sizeof failures - at, __VA_ARGS__);              \
    } while (0)
    for (int i = 0; i < n_ops; i++) {
        const ebb_op *op = ebb_op_at(i);
        if (op->forward == cpu_only_fwd || op->forward == shaped_fwd)
            continue;
        int n_cases = 0;
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            const op_case *c = &cases[k];
            if (strcmp(c->op, op->name) != 0)
                continue;
            n_cases++;
            checked++;
            int64_t allocs = 0, bytes = compile_bytes(c, &allocs);
            if (bytes < 0)
                FAILURE("\n  op %s (attrs \"%s\"): compile failed: %.300s", op->name,
                        c->attrs ? c->attrs : "", ebb_errmsg());
            else if (bytes != 0 || allocs != 0)
                FAILURE("\n  op %s (attrs \"%s\"): the dry run allocated %lld real CPU bytes in "
                        "%lld allocations",
                        op->name, c->attrs ? c->attrs : "", (long long)bytes, (long long)allocs);
        }
        if (n_cases == 0)
            FAILURE("\n  op %s is registered but has no case in tests/test_dry_run.c: add valid "
                    "attributes and input shapes for it to the table",
                    op->name);
    }
#undef FAILURE
    if (failures[0])
        fail_msg("every op must dry-run on meta tensors, and have a case here:%s", failures);
    assert_true(checked >= n_ops - 2);
}

/* ---- huge specs, planned under an address-space limit ------------------------ */

typedef struct child_result {
    int status;         /* ebb_status of load + compile */
    int64_t peak;       /* the plan's predicted peak */
    double seconds;     /* load + compile */
    int64_t cpu_peak;   /* real CPU bytes the compile allocated at its highest */
    int limit_bites;    /* a 1 GiB tensor could not be made under the limit */
    char msg[512];
} child_result;

/* Virtual memory the process maps now, from /proc/self/statm. */
static int64_t address_space_now(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long long pages = 0;
    if (!f)
        return -1;
    if (fscanf(f, "%lld", &pages) != 1)
        pages = -1;
    fclose(f);
    return pages < 0 ? -1 : pages * (int64_t)sysconf(_SC_PAGESIZE);
}

/* The address space a plan may add to the process. Real activations of any
 * of the specs below would need gigabytes. */
#define HEADROOM ((int64_t)384 << 20)

static void plan_in_child(const char *yaml, const char *path, const char *binding,
                          child_result *r) {
    int64_t as = address_space_now();
    struct rlimit lim = {.rlim_cur = (rlim_t)(as + HEADROOM), .rlim_max = (rlim_t)(as + HEADROOM)};
    if (as < 0 || setrlimit(RLIMIT_AS, &lim) != 0) {
        snprintf(r->msg, sizeof r->msg, "setrlimit(RLIMIT_AS): %s", strerror(errno));
        r->status = EBB_ERR_IO;
        return;
    }
    /* the limit is real: the activations of these specs could not be made */
    ebb_shape gib = EBB_SHAPE((int64_t)1 << 28);
    ebb_tensor *probe = NULL;
    r->limit_bites = ebb_tensor_zeros(&probe, &gib, EBB_FLOAT32, CPU) == EBB_ERR_NOMEM;
    ebb_tensor_free(probe);
    alarm(60); /* a dry run that computes for real would take minutes */
    double t0 = ebb_test_now_s();
    ebb_memory_stats before, after;
    ebb_memory_reset_peak(CPU);
    ebb_memory_stats_get(CPU, &before);
    ebb_spec *s = NULL;
    ebb_plan *p = NULL;
    ebb_status st = yaml ? ebb_spec_load_string(&s, yaml, strlen(yaml), "huge.yaml")
                         : ebb_spec_load(&s, path);
    ebb_shape shapes[4];
    const char *bind[1] = {binding};
    if (st == EBB_OK)
        st = ebb_spec_resolve_shapes(s, bind, binding ? 1 : 0, shapes, 4);
    ebb_compile_options o = {.input_shapes = shapes,
                             .n_input_shapes = s ? ebb_spec_input_count(s) : 0};
    if (st == EBB_OK)
        st = ebb_spec_compile(&p, s, &o);
    ebb_memory_stats_get(CPU, &after);
    r->seconds = ebb_test_now_s() - t0;
    r->status = st;
    r->cpu_peak = after.peak_bytes - before.current_bytes;
    if (st == EBB_OK)
        r->peak = ebb_plan_peak_bytes(p, NULL);
    else
        snprintf(r->msg, sizeof r->msg, "%s", ebb_errmsg());
    ebb_plan_free(p);
    ebb_spec_free(s);
}

/* Plans the spec (YAML text, or a file) in a forked child whose address space
 * is limited to what it maps now plus HEADROOM, so the limit stays out of
 * the other tests. */
static child_result plan_limited(const char *yaml, const char *path, const char *binding) {
    child_result r = {0};
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        plan_in_child(yaml, path, binding, &r);
        ssize_t w = write(fds[1], &r, sizeof r);
        _exit(w == (ssize_t)sizeof r ? 0 : 3);
    }
    close(fds[1]);
    ssize_t got = read(fds[0], &r, sizeof r);
    close(fds[0]);
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    if (WIFSIGNALED(ws))
        fail_msg("planning %s died with signal %d (%s)", path ? path : "the spec",
                 WTERMSIG(ws), WTERMSIG(ws) == SIGALRM ? "over 60 s" : "out of address space?");
    assert_int_equal(WEXITSTATUS(ws), 0);
    assert_int_equal(got, (ssize_t)sizeof r);
    return r;
}

static void expect_huge_plan(const char *what, child_result r, int64_t min_peak) {
    if (r.status != EBB_OK)
        fail_msg("%s: %s", what, r.msg);
    printf("  %s: predicted peak %.1f GiB, planned in %.2f s, %lld real CPU bytes\n", what,
           (double)r.peak / (1 << 30), r.seconds, (long long)r.cpu_peak);
    if (r.peak < min_peak)
        fail_msg("%s: predicted peak %lld bytes, expected at least %lld", what, (long long)r.peak,
                 (long long)min_peak);
    assert_int_equal(r.cpu_peak, 0);
    assert_true(r.limit_bites);
}

#define GiB ((int64_t)1 << 30)

/* conv2d to 17,777,777 channels, then batch_norm and relu: each activation
 * is [1, 17777777, 30, 30] float32, 64 GB. */
static void test_huge_conv_plans_without_memory(void **state) {
    (void)state;
    const char *yaml = "ebb: 1\n"
                       "inputs:\n"
                       "  x: [1, 3, 32, 32]\n"
                       "flow:\n"
                       "  - from: {conv2d: {out: 17777777, kernel: 3}}\n"
                       "  - batch_norm\n"
                       "  - relu\n"
                       "  - {max_pool2d: {kernel: 2}}\n";
    /* the conv output and batch_norm's at once (relu runs in place) */
    expect_huge_plan("conv2d 17777777", plan_limited(yaml, NULL, NULL), 2 * 63999997200LL);
}

/* linear to 4e9 features, then gelu and layer_norm: 16 GB a row. */
static void test_huge_linear_plans_without_memory(void **state) {
    (void)state;
    const char *yaml = "ebb: 1\n"
                       "inputs:\n"
                       "  x: [batch, 64]\n"
                       "flow:\n"
                       "  - from: {linear: {out: 4000000000}}\n"
                       "  - gelu\n"
                       "  - layer_norm\n"
                       "  - {threshold_halt: {threshold: 0.5}}\n";
    /* layer_norm's input and output, [2, 4e9] float32 each (gelu runs in place) */
    expect_huge_plan("linear 4e9", plan_limited(yaml, NULL, "batch=2"), 2 * 32000000000LL);
}

/* specs/mlp.yaml with four million rows: 3.8 GiB at its peak. */
static void test_mlp_with_huge_batch_plans_without_memory(void **state) {
    (void)state;
    child_result r = plan_limited(NULL, EBB_SOURCE_DIR "/specs/mlp.yaml", "batch=4000000");
    expect_huge_plan("mlp batch=4000000", r, 4096000000LL);
    assert_int_equal(r.peak, 4096000000LL); /* 2 x [4e6, 128] float32 */
}

/* The fuzzer's find: a repeat of `also: [linear, stack, layer_norm]`. stack of
 * one tensor adds a dim of size 1, and the residual add broadcasts it against
 * the stream, so each round multiplies the stream by 64: 256 GiB by round 4. */
static void test_growing_repeat_plans_without_memory(void **state) {
    (void)state;
    const char *yaml = "ebb: 1\n"
                       "inputs:\n"
                       "  x: [64, 64]\n"
                       "flow:\n"
                       "  - from: {linear: {out: 64}}\n"
                       "  - repeat: {times: 4, body: [{also: [{linear: {out: 64}}, stack, "
                       "layer_norm]}]}\n";
    expect_huge_plan("growing repeat", plan_limited(yaml, NULL, NULL), 256 * GiB);
}

/* A forward computing for real: x + zeros of x's shape. */
static ebb_status real_forward(const ebb_op_call *c, ebb_tensor **out) {
    ebb_shape s = ebb_tensor_shape(c->in[0]);
    ebb_tensor *z = NULL;
    ebb_status st = ebb_tensor_zeros(&z, &s, ebb_tensor_dtype(c->in[0]), CPU);
    if (st == EBB_OK)
        st = ebb_tensor_binary(out, EBB_ADD, c->in[0], z);
    ebb_tensor_free(z);
    return st;
}

/* ---- user ops: shape functions and the CPU fallback's limit ----------------- */

/* An op with no meta kernel: it computes on CPU zeros of its input's shape,
 * which fails on the meta device. */
static int cpu_only_calls;
static ebb_status cpu_only_fwd(const ebb_op_call *c, ebb_tensor **out) {
    cpu_only_calls++;
    if (ebb_tensor_device(c->in[0]).type == EBB_DEVICE_META)
        return ebb_error_set(EBB_ERR_UNSUPPORTED, "cpu_only: no meta kernel");
    return real_forward(c, out);
}

/* Doubles the last dim: its shape function says so without running it. */
static int shaped_calls, shape_calls;
static ebb_status shaped_fwd(const ebb_op_call *c, ebb_tensor **out) {
    shaped_calls++;
    if (ebb_tensor_device(c->in[0]).type == EBB_DEVICE_META)
        return ebb_error_set(EBB_ERR_UNSUPPORTED, "shaped: no meta kernel");
    ebb_tensor *pair[2] = {c->in[0], c->in[0]};
    return ebb_tensor_cat(out, pair, 2, -1);
}

static ebb_status shaped_shape(const ebb_attr_value *attrs, const ebb_shape *in,
                               const ebb_dtype *in_dtypes, int n_in, ebb_shape *out,
                               ebb_dtype *out_dtype) {
    (void)attrs;
    (void)n_in;
    shape_calls++;
    if (in[0].ndim < 1)
        return ebb_error_set(EBB_ERR_SHAPE, "shaped: input is a scalar");
    *out = in[0];
    out->dim[out->ndim - 1] *= 2;
    *out_dtype = in_dtypes[0] == EBB_FLOAT16 ? EBB_FLOAT32 : in_dtypes[0];
    return EBB_OK;
}

static const ebb_op cpu_only_op = {.name = "test_cpu_only", .min_inputs = 1, .max_inputs = 1,
                                   .forward = cpu_only_fwd};
static const ebb_op shaped_op = {.name = "test_shaped", .min_inputs = 1, .max_inputs = 1,
                                 .forward = shaped_fwd, .shape = shaped_shape};

static void register_test_ops(void) {
    if (!ebb_op_find(cpu_only_op.name))
        assert_ok(ebb_op_register(&cpu_only_op));
    if (!ebb_op_find(shaped_op.name))
        assert_ok(ebb_op_register(&shaped_op));
}

static ebb_status compile_chain(ebb_plan **p, const char *op, const ebb_shape *x, ebb_dtype dt) {
    ebb_builder *b = ebb_builder_new("user");
    ebb_input(b, "x");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    ebb_through(b, ebb_node_op(b, op, NULL));
    ebb_through(b, ebb_node_op(b, "tanh", NULL));
    ebb_graph *g = ebb_build(b);
    ebb_builder_free(b);
    if (!g)
        return ebb_errcode();
    ebb_compile_options o = {.input_shapes = x, .n_input_shapes = 1, .dtype = dt};
    ebb_status st = ebb_compile(p, g, &o);
    ebb_graph_free(g);
    return st;
}

static void test_shape_function_replaces_the_dry_run(void **state) {
    (void)state;
    register_test_ops();
    /* 2^40 rows: only a shape function can say what this makes */
    ebb_shape x = EBB_SHAPE((int64_t)1 << 40, 8);
    ebb_plan *p = NULL;
    shaped_calls = shape_calls = 0;
    ebb_memory_reset_peak(CPU);
    int64_t cur = ebb_memory_current(CPU);
    assert_ok(compile_chain(&p, "test_shaped", &x, EBB_FLOAT16));
    ebb_memory_stats ms;
    assert_ok(ebb_memory_stats_get(CPU, &ms));
    assert_int_equal(ms.peak_bytes, cur);
    assert_int_equal(shape_calls, 1);
    assert_int_equal(shaped_calls, 0); /* the forward never ran */
    const ebb_plan_step *s = ebb_plan_step_at(p, 1);
    assert_string_equal(s->op, "test_shaped");
    const ebb_plan_value *v = ebb_plan_value_at(p, s->out[0]);
    assert_int_equal(v->shape.ndim, 2);
    assert_true(v->shape.dim[0] == (int64_t)1 << 40);
    assert_int_equal(v->shape.dim[1], 16);
    assert_int_equal(v->dtype, EBB_FLOAT32);
    assert_true(v->nbytes == ((int64_t)1 << 40) * 16 * 4);
    ebb_plan_free(p);

    /* its errors are the compile's, naming the node */
    ebb_shape scalar = {0};
    assert_int_equal(compile_chain(&p, "test_shaped", &scalar, EBB_FLOAT32), EBB_ERR_SHAPE);
    assert_null(p);
    assert_errmsg_contains("node flow.1 (test_shaped)");
    assert_errmsg_contains("shaped: input is a scalar");

    /* and the plan runs the real forward */
    ebb_shape small = EBB_SHAPE(3, 4);
    assert_ok(compile_chain(&p, "test_shaped", &small, EBB_FLOAT32));
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, p, CPU, 1));
    ebb_tensor *in = NULL, *out = NULL;
    assert_ok(ebb_tensor_randn(&in, &small, EBB_FLOAT32, CPU, 7));
    assert_ok(ebb_run(p, m, &in, &out, NULL));
    ebb_shape os = ebb_tensor_shape(out);
    assert_int_equal(os.dim[1], 8);
    assert_true(shaped_calls > 0);
    ebb_tensor_free(in);
    ebb_tensor_free(out);
    ebb_model_free(m);
    ebb_plan_free(p);
}

static void test_cpu_fallback_small_and_refused_large(void **state) {
    (void)state;
    register_test_ops();
    /* small stand-ins: the last resort still works, and frees what it made */
    ebb_shape small = EBB_SHAPE(16, 32);
    ebb_plan *p = NULL;
    cpu_only_calls = 0;
    int64_t cur = ebb_memory_current(CPU);
    assert_ok(compile_chain(&p, "test_cpu_only", &small, EBB_FLOAT32));
    assert_int_equal(ebb_memory_current(CPU), cur);
    assert_int_equal(cpu_only_calls, 2); /* on meta, then on CPU zeros */
    const ebb_plan_value *v = ebb_plan_value_at(p, ebb_plan_step_at(p, 1)->out[0]);
    assert_true(ebb_shape_equal(&v->shape, &small));
    ebb_plan_free(p);

    /* 96 MiB of input: over the 64 MiB limit, refused before anything is
     * allocated */
    ebb_shape big = EBB_SHAPE(3 << 20, 8);
    ebb_memory_reset_peak(CPU);
    assert_int_equal(compile_chain(&p, "test_cpu_only", &big, EBB_FLOAT32), EBB_ERR_UNSUPPORTED);
    assert_null(p);
    assert_errmsg_contains("node flow.1 (test_cpu_only): op test_cpu_only has no meta kernel "
                           "and no shape function");
    assert_errmsg_contains("100663296 bytes of input and parameters (96.0 MiB; the limit is "
                           "64 MiB)");
    assert_errmsg_contains("Give the op a shape function (ebb_op.shape) or make its forward "
                           "work on meta tensors (on meta: cpu_only: no meta kernel)");
    ebb_memory_stats ms;
    assert_ok(ebb_memory_stats_get(CPU, &ms));
    assert_int_equal(ms.peak_bytes, cur);

    /* 40 MiB in and 40 out: the output takes the stand-ins over the limit */
    ebb_shape mid = EBB_SHAPE(5 << 18, 8);
    assert_int_equal(compile_chain(&p, "test_cpu_only", &mid, EBB_FLOAT32), EBB_ERR_UNSUPPORTED);
    assert_null(p);
    assert_errmsg_contains("node flow.1 (test_cpu_only)");
    assert_errmsg_contains("83886080 bytes of input, parameters and output");
    assert_int_equal(ebb_memory_current(CPU), cur);

    /* huge: refused at once, not an out-of-memory after minutes */
    ebb_shape huge = EBB_SHAPE((int64_t)1 << 36, 8);
    assert_int_equal(compile_chain(&p, "test_cpu_only", &huge, EBB_FLOAT32), EBB_ERR_UNSUPPORTED);
    assert_errmsg_contains("test_cpu_only");
    assert_errmsg_contains("2199023255552 bytes");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        EBB_TEST(test_every_op_dry_runs_on_meta),
        EBB_TEST(test_huge_conv_plans_without_memory),
        EBB_TEST(test_huge_linear_plans_without_memory),
        EBB_TEST(test_mlp_with_huge_batch_plans_without_memory),
        EBB_TEST(test_growing_repeat_plans_without_memory),
        EBB_TEST(test_shape_function_replaces_the_dry_run),
        EBB_TEST(test_cpu_fallback_small_and_refused_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
