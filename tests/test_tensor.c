/* The tensor layer: creation, queries, errors, byte accounting, handles. */
#include <math.h>

#include "test_util.h"

static const ebb_device CPU = {EBB_DEVICE_CPU, 0};

static void test_bytes_exact_1000x1000(void **state) {
    (void)state;
    int64_t before = ebb_memory_current(CPU);
    ebb_shape s = EBB_SHAPE(1000, 1000);
    ebb_tensor *t = NULL;
    assert_ok(ebb_tensor_zeros(&t, &s, EBB_FLOAT32, CPU));
    assert_int_equal(ebb_memory_current(CPU) - before, 4000000);
    assert_int_equal(ebb_tensor_nbytes(t), 4000000);
    ebb_tensor_free(t);
    assert_int_equal(ebb_memory_current(CPU) - before, 0);
}

static void test_peak_and_reset(void **state) {
    (void)state;
    ebb_memory_reset_peak(CPU);
    ebb_memory_stats s0, s1;
    assert_ok(ebb_memory_stats_get(CPU, &s0));
    ebb_shape s = EBB_SHAPE(256, 256);
    ebb_tensor *a = NULL, *b = NULL;
    assert_ok(ebb_tensor_ones(&a, &s, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_ones(&b, &s, EBB_FLOAT64, CPU));
    ebb_tensor_free(a);
    ebb_tensor_free(b);
    assert_ok(ebb_memory_stats_get(CPU, &s1));
    assert_int_equal(s1.peak_bytes - s0.current_bytes, 256 * 256 * (4 + 8));
    assert_int_equal(s1.current_bytes, s0.current_bytes);
    assert_true(s1.allocations >= s0.allocations + 2);
    ebb_memory_reset_peak(CPU);
    assert_ok(ebb_memory_stats_get(CPU, &s1));
    assert_int_equal(s1.peak_bytes, s1.current_bytes);
}

/* lerp_ moves a in place by weight towards b: a + w (b - a), with no
 * allocation (the weights' moving average, --ema, runs it every step). */
static void test_lerp_in_place(void **state) {
    (void)state;
    float av[4] = {1, 2, -3, 0.5f}, bv[4] = {5, 2, 1, -0.5f}, got[4];
    ebb_shape s = EBB_SHAPE(4);
    ebb_tensor *a = NULL, *b = NULL;
    assert_ok(ebb_tensor_from_host(&a, av, sizeof av, &s, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_from_host(&b, bv, sizeof bv, &s, EBB_FLOAT32, CPU));
    ebb_memory_stats s0, s1;
    assert_ok(ebb_memory_stats_get(CPU, &s0));
    assert_ok(ebb_tensor_lerp_(a, b, 0.25));
    assert_ok(ebb_memory_stats_get(CPU, &s1));
    assert_int_equal(s1.allocations, s0.allocations);
    assert_ok(ebb_tensor_to_host(a, got, sizeof got));
    for (int i = 0; i < 4; i++)
        assert_float_equal(got[i], av[i] + 0.25f * (bv[i] - av[i]), 1e-6);
    ebb_shape t = EBB_SHAPE(3);
    ebb_tensor *c = NULL;
    assert_ok(ebb_tensor_zeros(&c, &t, EBB_FLOAT32, CPU));
    assert_int_not_equal(ebb_tensor_lerp_(a, c, 0.5), EBB_OK); /* [4] with [3] */
    assert_int_equal(ebb_tensor_lerp_(NULL, c, 0.5), EBB_ERR_ARG);
    ebb_tensor_free(a);
    ebb_tensor_free(b);
    ebb_tensor_free(c);
}

static void test_views_share_storage(void **state) {
    (void)state;
    int64_t before = ebb_memory_current(CPU);
    ebb_shape s = EBB_SHAPE(4, 6), r = EBB_SHAPE(6, 4);
    ebb_tensor *x = NULL, *v = NULL, *t = NULL;
    assert_ok(ebb_tensor_zeros(&x, &s, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_reshape(&v, x, &r));
    assert_ok(ebb_tensor_transpose(&t, x, 0, 1));
    assert_int_equal(ebb_memory_current(CPU) - before, 96);
    assert_true(ebb_tensor_same_storage(x, v));
    assert_true(ebb_tensor_same_storage(x, t));
    ebb_tensor_free(x);
    /* the views keep the storage alive */
    assert_int_equal(ebb_memory_current(CPU) - before, 96);
    ebb_shape ts = ebb_tensor_shape(t);
    assert_int_equal(ts.dim[0], 6);
    assert_int_equal(ts.dim[1], 4);
    ebb_tensor_free(v);
    ebb_tensor_free(t);
    assert_int_equal(ebb_memory_current(CPU) - before, 0);
}

static void test_host_roundtrip_and_queries(void **state) {
    (void)state;
    float in[6] = {1, 2, 3, 4, 5, 6}, out[6] = {0};
    ebb_shape s = EBB_SHAPE(2, 3);
    ebb_tensor *t = NULL;
    assert_ok(ebb_tensor_from_host(&t, in, sizeof in, &s, EBB_FLOAT32, CPU));
    assert_int_equal(ebb_tensor_dtype(t), EBB_FLOAT32);
    assert_int_equal(ebb_tensor_device(t).type, EBB_DEVICE_CPU);
    assert_int_equal(ebb_tensor_numel(t), 6);
    assert_int_equal(ebb_tensor_nbytes(t), 24);
    ebb_shape got = ebb_tensor_shape(t);
    assert_true(ebb_shape_equal(&got, &s));
    assert_ok(ebb_tensor_to_host(t, out, sizeof out));
    assert_memory_equal(in, out, sizeof in);
    /* a wrong buffer size is refused and names both sizes */
    assert_int_equal(ebb_tensor_to_host(t, out, 8), EBB_ERR_SHAPE);
    assert_errmsg_contains("8 bytes");
    assert_errmsg_contains("24");
    ebb_tensor *bad = NULL;
    assert_int_equal(ebb_tensor_from_host(&bad, in, 4, &s, EBB_FLOAT32, CPU), EBB_ERR_SHAPE);
    assert_null(bad);
    ebb_tensor_free(t);
}

static void test_seeded_random_is_reproducible(void **state) {
    (void)state;
    ebb_shape s = EBB_SHAPE(64);
    ebb_tensor *a = NULL, *b = NULL, *c = NULL, *u = NULL;
    assert_ok(ebb_tensor_randn(&a, &s, EBB_FLOAT32, CPU, 7));
    assert_ok(ebb_tensor_randn(&b, &s, EBB_FLOAT32, CPU, 7));
    assert_ok(ebb_tensor_randn(&c, &s, EBB_FLOAT32, CPU, 8));
    double d;
    assert_ok(ebb_tensor_max_abs_diff(a, b, &d));
    assert_true(d == 0.0);
    assert_ok(ebb_tensor_max_abs_diff(a, c, &d));
    assert_true(d > 0.0);
    assert_ok(ebb_tensor_uniform(&u, &s, -0.5, 0.25, EBB_FLOAT32, CPU, 1));
    float v[64];
    assert_ok(ebb_tensor_to_host(u, v, sizeof v));
    for (int i = 0; i < 64; i++)
        assert_true(v[i] >= -0.5f && v[i] < 0.25f);
    ebb_tensor_free(a);
    ebb_tensor_free(b);
    ebb_tensor_free(c);
    ebb_tensor_free(u);
}

static void test_matmul_mismatch_is_a_status(void **state) {
    (void)state;
    int64_t before = ebb_memory_current(CPU);
    ebb_shape sa = EBB_SHAPE(2, 3), sb = EBB_SHAPE(4, 5);
    ebb_tensor *a = NULL, *b = NULL, *c = (ebb_tensor *)&sa; /* must be reset to NULL */
    assert_ok(ebb_tensor_ones(&a, &sa, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_ones(&b, &sb, EBB_FLOAT32, CPU));
    int64_t handles = ebb_tensor_live_count();
    assert_int_equal(ebb_tensor_matmul(&c, a, b), EBB_ERR_SHAPE);
    assert_null(c);
    assert_int_equal(ebb_errcode(), EBB_ERR_SHAPE);
    assert_errmsg_contains("ebb_tensor_matmul");
    assert_errmsg_contains("2x3");
    assert_errmsg_contains("4x5");
    /* the message carries no C++ backtrace */
    assert_null(strstr(ebb_errmsg(), "frame #"));
    assert_int_equal(ebb_tensor_live_count(), handles);
    ebb_tensor_free(a);
    ebb_tensor_free(b);
    assert_int_equal(ebb_memory_current(CPU) - before, 0);
}

static void test_linear_and_activations(void **state) {
    (void)state;
    float x[2] = {1, -2}, w[4] = {1, 2, 3, 4}, bias[2] = {0.5f, -0.5f}, y[2];
    ebb_shape sx = EBB_SHAPE(1, 2), sw = EBB_SHAPE(2, 2), sbias = EBB_SHAPE(2);
    ebb_tensor *tx = NULL, *tw = NULL, *tb = NULL, *ty = NULL, *tr = NULL;
    assert_ok(ebb_tensor_from_host(&tx, x, sizeof x, &sx, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_from_host(&tw, w, sizeof w, &sw, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_from_host(&tb, bias, sizeof bias, &sbias, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_linear(&ty, tx, tw, tb));
    assert_ok(ebb_tensor_to_host(ty, y, sizeof y));
    /* [1*1 + -2*2 + .5, 1*3 + -2*4 - .5] */
    assert_float_equal(y[0], -2.5f, 1e-6);
    assert_float_equal(y[1], -5.5f, 1e-6);
    assert_ok(ebb_tensor_unary(&tr, EBB_RELU, ty));
    assert_ok(ebb_tensor_to_host(tr, y, sizeof y));
    assert_float_equal(y[0], 0.0f, 0);
    assert_float_equal(y[1], 0.0f, 0);
    ebb_tensor_free(tx);
    ebb_tensor_free(tw);
    ebb_tensor_free(tb);
    ebb_tensor_free(ty);
    ebb_tensor_free(tr);
}

static void test_index_ops(void **state) {
    (void)state;
    float x[6] = {0, 1, 2, 3, 4, 5};
    int64_t idx[2] = {2, 0};
    ebb_shape sx = EBB_SHAPE(3, 2), si = EBB_SHAPE(2);
    ebb_tensor *tx = NULL, *ti = NULL, *sel = NULL, *z = NULL, *mask = NULL, *nz = NULL;
    assert_ok(ebb_tensor_from_host(&tx, x, sizeof x, &sx, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_from_host(&ti, idx, sizeof idx, &si, EBB_INT64, CPU));
    assert_ok(ebb_tensor_index_select(&sel, tx, 0, ti));
    float got[4];
    assert_ok(ebb_tensor_to_host(sel, got, sizeof got));
    assert_float_equal(got[0], 4, 0);
    assert_float_equal(got[3], 1, 0);
    assert_ok(ebb_tensor_zeros(&z, &sx, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_index_copy_(z, 0, ti, sel));
    float back[6];
    assert_ok(ebb_tensor_to_host(z, back, sizeof back));
    assert_float_equal(back[0], 0, 0);
    assert_float_equal(back[4], 4, 0);
    assert_float_equal(back[2], 0, 0);
    assert_ok(ebb_tensor_compare(&mask, EBB_GT, ti, 1));
    assert_ok(ebb_tensor_nonzero_1d(&nz, mask));
    assert_int_equal(ebb_tensor_numel(nz), 1);
    ebb_tensor_free(tx);
    ebb_tensor_free(ti);
    ebb_tensor_free(sel);
    ebb_tensor_free(z);
    ebb_tensor_free(mask);
    ebb_tensor_free(nz);
}

static void test_errors_and_devices(void **state) {
    (void)state;
    ebb_device d;
    assert_ok(ebb_device_parse(&d, "cpu"));
    assert_int_equal(d.type, EBB_DEVICE_CPU);
    assert_int_equal(ebb_device_parse(&d, "tpu"), EBB_ERR_ARG);
    assert_errmsg_contains("tpu");
    if (!ebb_cuda_available()) {
        assert_int_equal(ebb_device_parse(&d, "cuda:0"), EBB_ERR_UNSUPPORTED);
        assert_errmsg_contains("cuda:0");
        assert_int_equal(ebb_device_default().type, EBB_DEVICE_CPU);
    }
    /* free device memory: a CUDA figure, never a CPU one (the fit check has
     * the CPU's limits) */
    int64_t avail = 0, total = 0;
    assert_int_equal(ebb_device_memory_available(ebb_device_cpu(), &avail, &total),
                     EBB_ERR_UNSUPPORTED);
    assert_errmsg_contains("cpu");
    assert_int_equal(avail, -1);
    assert_int_equal(ebb_device_memory_available(ebb_device_cpu(), NULL, NULL), EBB_ERR_ARG);
    int64_t ws_cpu = -1;
    assert_ok(ebb_device_prepare(ebb_device_cpu(), &ws_cpu));
    assert_int_equal(ws_cpu, 0);
    if (ebb_cuda_available()) {
        assert_ok(ebb_device_memory_available(ebb_device_cuda(0), &avail, &total));
        assert_true(avail > 0 && avail <= total);
        /* the cuBLAS workspace is made once per thread and stream: a second
         * call allocates nothing and reports the same bytes */
        int64_t ws = -1, ws2 = -1;
        assert_ok(ebb_device_prepare(ebb_device_cuda(0), &ws));
        int64_t now = ebb_memory_current(ebb_device_cuda(0));
        assert_ok(ebb_device_prepare(ebb_device_cuda(0), &ws2));
        assert_int_equal(ws2, ws);
        assert_true(ws >= 0);
        assert_int_equal(ebb_memory_current(ebb_device_cuda(0)), now);
    } else {
        assert_int_not_equal(ebb_device_memory_available(ebb_device_cuda(0), &avail, NULL),
                             EBB_OK);
    }
    char buf[16];
    assert_string_equal(ebb_device_str(ebb_device_cuda(3), buf, sizeof buf), "cuda:3");
    ebb_dtype dt;
    assert_ok(ebb_dtype_parse(&dt, "bfloat16"));
    assert_int_equal(dt, EBB_BFLOAT16);
    assert_int_equal(ebb_dtype_parse(&dt, "float8"), EBB_ERR_ARG);
    assert_errmsg_contains("float8");
    /* NULL outputs and inputs are statuses, not crashes */
    assert_int_equal(ebb_tensor_unary(NULL, EBB_RELU, NULL), EBB_ERR_ARG);
    ebb_tensor *t = NULL;
    assert_int_equal(ebb_tensor_unary(&t, EBB_RELU, NULL), EBB_ERR_ARG);
    assert_null(t);
    ebb_error_set(EBB_ERR_SHAPE, "inner");
    ebb_error_prefix("node %s", "flow.3");
    assert_string_equal(ebb_errmsg(), "node flow.3: inner");
    ebb_shape s = EBB_SHAPE(2, 3);
    assert_string_equal(ebb_shape_str(&s, buf, sizeof buf), "[2, 3]");
}

static void test_handle_count(void **state) {
    (void)state;
    int64_t before = ebb_tensor_live_count();
    ebb_shape s = EBB_SHAPE(3);
    ebb_tensor *a = NULL, *b = NULL;
    assert_ok(ebb_tensor_zeros(&a, &s, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_ref(&b, a));
    assert_int_equal(ebb_tensor_live_count() - before, 2);
    ebb_tensor_free(a);
    ebb_tensor_free(b);
    ebb_tensor_free(NULL);
    assert_int_equal(ebb_tensor_live_count() - before, 0);
}

/* What each library runs here, as ebb_cpu_info reads it, and the thread
 * count: set, read back, refused outside 1..1024. */
static void test_cpu_info_and_threads(void **state) {
    (void)state;
    ebb_cpu_info ci;
    assert_int_equal(ebb_cpu_info_get(NULL), EBB_ERR_ARG);
    assert_ok(ebb_cpu_info_get(&ci));
    assert_int_equal(ci.threads, ebb_tensor_num_threads());
    assert_true(ci.threads >= 1);
    assert_true(ci.aten[0] && ci.onednn[0] && ci.blas[0]);
    /* native float16 implies native bfloat16 in oneDNN's ladder */
    assert_true(!ci.fp16_native || ci.bf16_native);
    char line[256];
    ebb_cpu_info_str(&ci, line, sizeof line);
    if (!strstr(line, ci.aten) || !strstr(line, ci.onednn) || !strstr(line, "thread"))
        fail_msg("ebb_cpu_info_str: '%s' lacks the kernels or the threads", line);

    int before = ebb_tensor_num_threads();
    assert_ok(ebb_set_num_threads(2));
    assert_int_equal(ebb_tensor_num_threads(), 2);
    assert_ok(ebb_cpu_info_get(&ci));
    assert_int_equal(ci.threads, 2);
    assert_int_equal(ebb_set_num_threads(0), EBB_ERR_ARG);
    assert_errmsg_contains("0 threads");
    assert_int_equal(ebb_set_num_threads(1025), EBB_ERR_ARG);
    assert_int_equal(ebb_tensor_num_threads(), 2);
    assert_ok(ebb_set_num_threads(before));
    assert_true(ebb_default_num_threads() >= 1);
}

/* Fills freed memory with `v`: what the allocator hands out next was there. */
static void litter(double v, int64_t elems) {
    ebb_shape s = EBB_SHAPE(elems);
    ebb_tensor *t = NULL;
    assert_ok(ebb_tensor_full(&t, &s, v, EBB_FLOAT32, CPU));
    ebb_tensor_free(t);
}

/* max |a - b| / max |b|, a in any floating dtype, b float32. */
static double rel_err(const ebb_tensor *a, const ebb_tensor *b) {
    ebb_tensor *a32 = NULL, *zero = NULL;
    ebb_shape s = ebb_tensor_shape(b);
    assert_ok(ebb_tensor_to(&a32, a, CPU, EBB_FLOAT32));
    assert_ok(ebb_tensor_zeros(&zero, &s, EBB_FLOAT32, CPU));
    double d = 0, scale = 0;
    assert_ok(ebb_tensor_max_abs_diff(a32, b, &d));
    assert_ok(ebb_tensor_max_abs_diff(b, zero, &scale));
    ebb_tensor_free(a32);
    ebb_tensor_free(zero);
    return isfinite(d) ? d / (scale > 0 ? scale : 1) : INFINITY;
}

/* oneDNN's bfloat16 weight gradient reads memory it never wrote when a
 * stride outruns its input dim (libtorch 1.13 and 2.x): resnet18 at 8x8
 * trained to NaN. ebb_tensor_conv_backward hands it the shortest stride with
 * the same output, so the gradients match float32's on the same values
 * however the freed memory was left. */
static void test_bf16_conv_backward_when_the_stride_outruns_the_input(void **state) {
    (void)state;
    assert_int_equal(ebb_tensor_conv_backward_stride(1, 3, 2, 1, 1, EBB_BFLOAT16), 1);
    assert_int_equal(ebb_tensor_conv_backward_stride(2, 5, 4, 2, 1, EBB_BFLOAT16), 2);
    assert_int_equal(ebb_tensor_conv_backward_stride(1, 1, 2, 0, 1, EBB_BFLOAT16), 1);
    assert_int_equal(ebb_tensor_conv_backward_stride(8, 3, 2, 1, 1, EBB_BFLOAT16), 2);
    assert_int_equal(ebb_tensor_conv_backward_stride(1, 3, 2, 1, 1, EBB_FLOAT32), 2);
    static const struct {
        int64_t n, c, o, h, w, k, s, p;
    } cases[] = {
        {16, 128, 256, 1, 1, 3, 2, 1}, /* resnet18's layer3.0.conv1 at 8x8 */
        {16, 128, 256, 1, 1, 1, 2, 0}, /* ... and its downsample */
        {4, 32, 32, 3, 1, 3, 2, 1},    {4, 32, 32, 1, 2, 5, 4, 2},
        {4, 32, 32, 2, 2, 3, 3, 1},
    };
    int64_t live = ebb_tensor_live_count();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ebb_shape xs = EBB_SHAPE(cases[i].n, cases[i].c, cases[i].h, cases[i].w);
        ebb_shape ws = EBB_SHAPE(cases[i].o, cases[i].c, cases[i].k, cases[i].k);
        int64_t stride[2] = {cases[i].s, cases[i].s}, pad[2] = {cases[i].p, cases[i].p};
        int64_t dil[2] = {1, 1};
        ebb_tensor *r = NULL, *x = NULL, *w = NULL, *y = NULL, *g = NULL;
        assert_ok(ebb_tensor_randn(&r, &xs, EBB_FLOAT32, CPU, 1 + i));
        assert_ok(ebb_tensor_to(&x, r, CPU, EBB_BFLOAT16));
        ebb_tensor_free(r);
        assert_ok(ebb_tensor_randn(&r, &ws, EBB_FLOAT32, CPU, 100 + i));
        assert_ok(ebb_tensor_to(&w, r, CPU, EBB_BFLOAT16));
        ebb_tensor_free(r);
        assert_ok(ebb_tensor_conv(&y, x, w, NULL, stride, pad, dil, 1));
        ebb_shape ys = ebb_tensor_shape(y);
        assert_ok(ebb_tensor_randn(&r, &ys, EBB_FLOAT32, CPU, 200 + i));
        assert_ok(ebb_tensor_to(&g, r, CPU, EBB_BFLOAT16));
        ebb_tensor_free(r);
        /* float32 on the same (bfloat16) values */
        ebb_tensor *x32 = NULL, *w32 = NULL, *g32 = NULL, *rx = NULL, *rw = NULL;
        assert_ok(ebb_tensor_to(&x32, x, CPU, EBB_FLOAT32));
        assert_ok(ebb_tensor_to(&w32, w, CPU, EBB_FLOAT32));
        assert_ok(ebb_tensor_to(&g32, g, CPU, EBB_FLOAT32));
        assert_ok(ebb_tensor_conv_backward(&rx, &rw, NULL, g32, x32, w32, stride, pad, dil, 1));
        for (int trial = 0; trial < 6; trial++) {
            int64_t wn = ebb_tensor_numel(w);
            static const int64_t more[] = {1, 2, 1 << 16, 1 << 20};
            for (size_t m = 0; m < sizeof more / sizeof more[0]; m++)
                litter(trial % 2 ? 1e30 : NAN, m < 2 ? wn * more[m] : more[m]);
            ebb_tensor *gx = NULL, *gw = NULL;
            assert_ok(ebb_tensor_conv_backward(&gx, &gw, NULL, g, x, w, stride, pad, dil, 1));
            double ex = rel_err(gx, rx), ew = rel_err(gw, rw);
            /* float32 sums rounded once to bfloat16: 2^-8 of the largest */
            if (!(ex < 1e-2 && ew < 1e-2))
                fail_msg("case %zu (input [%lld, %lld, %lld, %lld], kernel %lld, stride %lld, "
                         "padding %lld), trial %d: bfloat16 gradients off float32's by %g "
                         "(input) and %g (weight) of the largest",
                         i, (long long)cases[i].n, (long long)cases[i].c, (long long)cases[i].h,
                         (long long)cases[i].w, (long long)cases[i].k, (long long)cases[i].s,
                         (long long)cases[i].p, trial, ex, ew);
            ebb_tensor_free(gx);
            ebb_tensor_free(gw);
        }
        ebb_tensor *all[] = {x, w, y, g, x32, w32, g32, rx, rw};
        for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
            ebb_tensor_free(all[k]);
    }
    assert_int_equal(ebb_tensor_live_count(), live);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        EBB_TEST(test_cpu_info_and_threads),
        EBB_TEST(test_bytes_exact_1000x1000),
        EBB_TEST(test_peak_and_reset),
        EBB_TEST(test_lerp_in_place),
        EBB_TEST(test_views_share_storage),
        EBB_TEST(test_host_roundtrip_and_queries),
        EBB_TEST(test_seeded_random_is_reproducible),
        EBB_TEST(test_matmul_mismatch_is_a_status),
        EBB_TEST(test_linear_and_activations),
        EBB_TEST(test_index_ops),
        EBB_TEST(test_errors_and_devices),
        EBB_TEST(test_handle_count),
        EBB_TEST(test_bf16_conv_backward_when_the_stride_outruns_the_input),
    };
    return cmocka_run_group_tests_name("tensor", tests, NULL, NULL);
}
