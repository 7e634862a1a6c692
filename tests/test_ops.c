/* The op families added beside linear: conv, pool, norm, embedding,
 * attention, recurrent cells, shape and math ops. Each op is called through
 * the registry as the executor calls it (attributes resolved against the
 * schema, parameters from op->params) and checked against a reference written
 * here as plain loops over host floats, or against hand-computed values. */
#include <float.h>
#include <math.h>

#include "test_util.h"

static const ebb_device CPU = {EBB_DEVICE_CPU, 0};
static const ebb_device META = {EBB_DEVICE_META, 0};

/* ---- calling an op the way the executor does ---------------------------------- */

typedef struct opcall {
    const ebb_op *op;
    ebb_attr_value attrs[EBB_MAX_ATTRS];
    char text[512]; /* owns STRING attribute values */
    ebb_param_spec spec[EBB_MAX_PARAMS];
    ebb_tensor *params[EBB_MAX_PARAMS];
    int n_params;
} opcall;

/* Resolves "k=v k=v" (commas or spaces between pairs, "quoted" values)
 * against the op's schema with the builder's rules: defaults applied, an
 * optional attribute without a default left unset. */
static void opcall_init(opcall *c, const char *name, const char *attrs) {
    memset(c, 0, sizeof *c);
    c->op = ebb_op_find(name);
    if (!c->op)
        fail_msg("op '%s' is not registered", name);
    for (int i = 0; i < c->op->n_attrs; i++) {
        const ebb_attr_spec *a = &c->op->attrs[i];
        ebb_attr_value *v = &c->attrs[i];
        v->type = a->type;
        if (a->required)
            continue;
        if (a->type == EBB_ATTR_STRING) {
            v->s = a->default_string;
            v->set = a->default_string != NULL;
        } else {
            v->i = (int64_t)a->default_number;
            v->f = a->default_number;
            v->set = !a->optional;
        }
    }
    snprintf(c->text, sizeof c->text, "%s", attrs ? attrs : "");
    char *p = c->text;
    for (;;) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            break;
        char *key = p;
        while (*p && *p != '=')
            p++;
        if (*p != '=')
            fail_msg("attribute text '%s' lacks '='", key);
        *p++ = '\0';
        char *val = p;
        if (*p == '"') {
            val = ++p;
            while (*p && *p != '"')
                p++;
        } else {
            while (*p && *p != ' ' && *p != ',')
                p++;
        }
        if (*p)
            *p++ = '\0';
        int i = ebb_op_attr_index(c->op, key);
        if (i < 0)
            fail_msg("%s has no attribute '%s'", name, key);
        ebb_attr_value *v = &c->attrs[i];
        v->set = 1;
        switch (c->op->attrs[i].type) {
        case EBB_ATTR_INT: v->i = strtoll(val, NULL, 10); v->f = (double)v->i; break;
        case EBB_ATTR_FLOAT: v->f = strtod(val, NULL); break;
        case EBB_ATTR_BOOL: v->i = strcmp(val, "true") == 0 || strcmp(val, "1") == 0; break;
        case EBB_ATTR_STRING: v->s = val; break;
        }
    }
    for (int i = 0; i < c->op->n_attrs; i++)
        if (c->op->attrs[i].required && !c->attrs[i].set)
            fail_msg("%s needs attribute '%s'", name, c->op->attrs[i].name);
}

/* Lists the parameters for these inputs and creates them as ebb_model would:
 * PyTorch's default init, seeded. */
static ebb_status opcall_params(opcall *c, ebb_tensor *const *in, int n_in, ebb_dtype dtype,
                                ebb_device dev) {
    ebb_shape shapes[4];
    for (int i = 0; i < n_in; i++)
        shapes[i] = ebb_tensor_shape(in[i]);
    c->n_params = 0;
    if (!c->op->params)
        return EBB_OK;
    int n = 0;
    ebb_status st = c->op->params(c->attrs, shapes, n_in, c->spec, &n);
    if (st != EBB_OK)
        return st;
    for (int i = 0; i < n; i++) {
        const ebb_param_spec *p = &c->spec[i];
        ebb_tensor **t = &c->params[i];
        if (dev.type == EBB_DEVICE_META) {
            st = ebb_tensor_empty(t, &p->shape, dtype, dev);
        } else {
            switch (p->init) {
            case EBB_INIT_ZEROS:
                st = ebb_tensor_zeros(t, &p->shape, p->counter ? EBB_INT64 : dtype, dev);
                break;
            case EBB_INIT_ONES: st = ebb_tensor_ones(t, &p->shape, dtype, dev); break;
            case EBB_INIT_NORMAL: st = ebb_tensor_randn(t, &p->shape, dtype, dev, 100 + i); break;
            case EBB_INIT_UNIFORM_FAN_IN: {
                double b = 1.0 / sqrt((double)p->fan_in);
                st = ebb_tensor_uniform(t, &p->shape, -b, b, dtype, dev, 100 + i);
                break;
            }
            }
        }
        if (st != EBB_OK)
            return st;
        c->n_params++;
    }
    return EBB_OK;
}

/* Replaces parameter i with uniform values in [lo, hi). */
static void opcall_randomize(opcall *c, int i, double lo, double hi, uint64_t seed) {
    ebb_tensor *t = NULL;
    assert_ok(ebb_tensor_uniform(&t, &c->spec[i].shape, lo, hi, ebb_tensor_dtype(c->params[i]),
                                 ebb_tensor_device(c->params[i]), seed));
    ebb_tensor_free(c->params[i]);
    c->params[i] = t;
}

static ebb_status opcall_forward(opcall *c, ebb_tensor *const *in, int n_in, ebb_tensor **out) {
    ebb_op_call call = {.op = c->op, .attrs = c->attrs, .in = in, .n_in = n_in,
                        .params = c->params, .n_params = c->n_params, .node = "test"};
    static char sentinel;
    *out = (ebb_tensor *)&sentinel; /* a forward must reset it on failure */
    ebb_status st = c->op->forward(&call, out);
    if (st != EBB_OK && *out != NULL)
        fail_msg("%s failed but left *out set", c->op->name);
    return st;
}

static void opcall_done(opcall *c) {
    for (int i = 0; i < c->n_params; i++)
        ebb_tensor_free(c->params[i]);
    c->n_params = 0;
}

/* Params + forward, both required to succeed. */
static ebb_tensor *opcall_run(opcall *c, ebb_tensor *const *in, int n_in) {
    ebb_tensor *out = NULL;
    assert_ok(opcall_params(
        c, in, n_in, ebb_tensor_dtype(in[0]) == EBB_INT64 ? EBB_FLOAT32 : ebb_tensor_dtype(in[0]),
        ebb_tensor_device(in[0])));
    assert_ok(opcall_forward(c, in, n_in, &out));
    return out;
}

/* ---- host data helpers ------------------------------------------------------------- */

static ebb_tensor *tensor_of(const float *v, ebb_shape s) {
    ebb_tensor *t = NULL;
    assert_ok(ebb_tensor_from_host(&t, v, sizeof(float) * (size_t)ebb_shape_numel(&s), &s,
                                   EBB_FLOAT32, CPU));
    return t;
}

static ebb_tensor *randn(ebb_shape s, uint64_t seed) {
    ebb_tensor *t = NULL;
    assert_ok(ebb_tensor_randn(&t, &s, EBB_FLOAT32, CPU, seed));
    return t;
}

/* The tensor's values as float32 (malloc'ed; the caller frees). */
static float *host(const ebb_tensor *t) {
    ebb_tensor *f = NULL;
    assert_ok(ebb_tensor_cast(&f, t, EBB_FLOAT32));
    size_t n = (size_t)ebb_tensor_numel(f);
    float *v = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(v);
    assert_ok(ebb_tensor_to_host(f, v, sizeof(float) * n));
    ebb_tensor_free(f);
    return v;
}

static void assert_shape(const ebb_tensor *t, ebb_shape want) {
    ebb_shape got = ebb_tensor_shape(t);
    if (!ebb_shape_equal(&got, &want)) {
        char a[128], b[128];
        fail_msg("shape %s, expected %s", ebb_shape_str(&got, a, sizeof a),
                 ebb_shape_str(&want, b, sizeof b));
    }
}

/* Compares t with n reference values. */
static void assert_values(const ebb_tensor *t, const float *want, size_t n, double tol) {
    assert_int_equal(ebb_tensor_numel(t), n);
    float *got = host(t);
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - (double)want[i]) <= tol * (1.0 + fabs((double)want[i])))) {
            float g = got[i];
            free(got);
            fail_msg("element %zu is %.6f, expected %.6f", i, (double)g, (double)want[i]);
        }
    free(got);
}

static void assert_close(const ebb_tensor *got, const ebb_tensor *want, double rtol, double atol) {
    int ok = 0;
    assert_ok(ebb_tensor_allclose(got, want, rtol, atol, &ok));
    if (!ok) {
        double d = -1;
        ebb_tensor_max_abs_diff(got, want, &d);
        fail_msg("tensors differ: max abs diff %g (rtol %g, atol %g)", d, rtol, atol);
    }
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* ---- the registry ------------------------------------------------------------------- */

static void test_ops_registered(void **state) {
    (void)state;
    static const char *names[] = {
        "conv1d",    "conv2d",   "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
        "batch_norm", "rms_norm", "group_norm", "embedding", "multi_head_attention",
        "gru_cell",  "lstm_cell", "flatten",   "reshape",    "permute",
        "transpose", "unsqueeze", "squeeze",   "scale",      "mean",
        "sum",       "narrow",   "positions",  "scaled_dot_product_attention",
        "matmul",    "masked_fill", "causal_mask", "cast",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const ebb_op *op = ebb_op_find(names[i]);
        if (!op) {
            fail_msg("%s is not registered", names[i]);
            continue;
        }
        assert_non_null(op->doc);
        assert_true(op->n_attrs <= EBB_MAX_ATTRS);
        for (int a = 0; a < op->n_attrs; a++) {
            assert_non_null(op->attrs[a].doc);
            /* required and optional exclude each other */
            assert_false(op->attrs[a].required && op->attrs[a].optional);
        }
        int view = strcmp(names[i], "flatten") == 0 || strcmp(names[i], "reshape") == 0 ||
                   strcmp(names[i], "permute") == 0 || strcmp(names[i], "transpose") == 0 ||
                   strcmp(names[i], "unsqueeze") == 0 || strcmp(names[i], "squeeze") == 0 ||
                   strcmp(names[i], "narrow") == 0;
        assert_int_equal(op->is_view, view);
    }
}

/* ---- conv ------------------------------------------------------------------------ */

/* Direct convolution over host floats: x [N, C, H, W], w [O, C/g, K, K]. */
static void ref_conv2d(const float *x, int n, int c, int h, int w, const float *wt, const float *b,
                       int o, int k, int s, int p, int d, int g, float *y, int oh, int ow) {
    int cpg = c / g, opg = o / g;
    for (int ni = 0; ni < n; ni++)
        for (int oi = 0; oi < o; oi++)
            for (int yi = 0; yi < oh; yi++)
                for (int xi = 0; xi < ow; xi++) {
                    double acc = b ? b[oi] : 0.0;
                    for (int ci = 0; ci < cpg; ci++) {
                        int cc = (oi / opg) * cpg + ci;
                        for (int ky = 0; ky < k; ky++)
                            for (int kx = 0; kx < k; kx++) {
                                int iy = yi * s - p + ky * d, ix = xi * s - p + kx * d;
                                if (iy < 0 || iy >= h || ix < 0 || ix >= w)
                                    continue;
                                acc += (double)x[((ni * c + cc) * h + iy) * w + ix] *
                                       wt[((oi * cpg + ci) * k + ky) * k + kx];
                            }
                    }
                    y[((ni * o + oi) * oh + yi) * ow + xi] = (float)acc;
                }
}

static void check_conv2d(const char *attrs, int n, int c, int h, int w, int o, int k, int s, int p,
                         int d, int g, int bias) {
    opcall oc;
    opcall_init(&oc, "conv2d", attrs);
    ebb_tensor *x = randn(EBB_SHAPE(n, c, h, w), 1);
    ebb_tensor *y = opcall_run(&oc, &x, 1);
    int oh = (h + 2 * p - d * (k - 1) - 1) / s + 1, ow = (w + 2 * p - d * (k - 1) - 1) / s + 1;
    assert_shape(y, EBB_SHAPE(n, o, oh, ow));
    assert_int_equal(oc.n_params, bias ? 2 : 1);
    assert_string_equal(oc.spec[0].name, "weight");
    ebb_shape ws = EBB_SHAPE(o, c / g, k, k);
    assert_true(ebb_shape_equal(&oc.spec[0].shape, &ws));
    assert_int_equal(oc.spec[0].init, EBB_INIT_UNIFORM_FAN_IN);
    assert_int_equal(oc.spec[0].fan_in, c / g * k * k);
    if (bias) {
        assert_string_equal(oc.spec[1].name, "bias");
        assert_int_equal(oc.spec[1].fan_in, c / g * k * k);
    }
    float *xv = host(x), *wv = host(oc.params[0]), *bv = bias ? host(oc.params[1]) : NULL;
    size_t ny = (size_t)(n * o * oh * ow);
    float *ref = malloc(sizeof(float) * ny);
    ref_conv2d(xv, n, c, h, w, wv, bv, o, k, s, p, d, g, ref, oh, ow);
    assert_values(y, ref, ny, 1e-4);
    free(xv);
    free(wv);
    free(bv);
    free(ref);
    ebb_tensor_free(x);
    ebb_tensor_free(y);
    opcall_done(&oc);
}

static void test_conv2d(void **state) {
    (void)state;
    check_conv2d("out=6 kernel=3 stride=2 padding=1 groups=2", 2, 4, 7, 6, 6, 3, 2, 1, 1, 2, 1);
    check_conv2d("out=3, kernel=2, dilation=2, bias=false, in=2", 1, 2, 6, 5, 3, 2, 1, 0, 2, 1, 0);
    check_conv2d("out=4 kernel=1", 2, 3, 4, 4, 4, 1, 1, 0, 1, 1, 1);
}

static void test_conv1d(void **state) {
    (void)state;
    opcall oc;
    opcall_init(&oc, "conv1d", "out=4 kernel=3 padding=2 dilation=2 stride=2");
    const int n = 2, c = 3, l = 10, o = 4, k = 3, s = 2, p = 2, d = 2;
    ebb_tensor *x = randn(EBB_SHAPE(n, c, l), 2);
    ebb_tensor *y = opcall_run(&oc, &x, 1);
    int ol = (l + 2 * p - d * (k - 1) - 1) / s + 1;
    assert_shape(y, EBB_SHAPE(n, o, ol));
    ebb_shape ws = EBB_SHAPE(o, c, k);
    assert_true(ebb_shape_equal(&oc.spec[0].shape, &ws));
    assert_int_equal(oc.spec[0].fan_in, c * k);
    float *xv = host(x), *wv = host(oc.params[0]), *bv = host(oc.params[1]);
    float ref[2 * 4 * 5];
    assert_int_equal(ol, 5);
    for (int ni = 0; ni < n; ni++)
        for (int oi = 0; oi < o; oi++)
            for (int t = 0; t < ol; t++) {
                double acc = bv[oi];
                for (int ci = 0; ci < c; ci++)
                    for (int kk = 0; kk < k; kk++) {
                        int i = t * s - p + kk * d;
                        if (i >= 0 && i < l)
                            acc += (double)xv[(ni * c + ci) * l + i] * wv[(oi * c + ci) * k + kk];
                    }
                ref[(ni * o + oi) * ol + t] = (float)acc;
            }
    assert_values(y, ref, sizeof ref / sizeof ref[0], 1e-4);
    free(xv);
    free(wv);
    free(bv);
    ebb_tensor_free(x);
    ebb_tensor_free(y);
    opcall_done(&oc);

    /* unbatched [C, L] works too; the channel count comes from dim 0 */
    opcall_init(&oc, "conv1d", "out=2 kernel=3");
    x = randn(EBB_SHAPE(3, 8), 3);
    y = opcall_run(&oc, &x, 1);
    assert_shape(y, EBB_SHAPE(2, 6));
    ebb_tensor_free(x);
    ebb_tensor_free(y);
    opcall_done(&oc);
}

static void test_conv_errors(void **state) {
    (void)state;
    opcall oc;
    ebb_tensor *x = randn(EBB_SHAPE(3, 4), 1), *y = NULL;
    opcall_init(&oc, "conv2d", "out=2 kernel=3");
    assert_int_equal(opcall_params(&oc, &x, 1, EBB_FLOAT32, CPU), EBB_ERR_SHAPE);
    assert_errmsg_contains("conv2d");
    assert_errmsg_contains("[3, 4]");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_SHAPE);
    assert_errmsg_contains("[3, 4]");
    ebb_tensor_free(x);

    x = randn(EBB_SHAPE(2, 4, 7, 6), 1);
    opcall_init(&oc, "conv2d", "out=2 kernel=3 in=5");
    assert_int_equal(opcall_params(&oc, &x, 1, EBB_FLOAT32, CPU), EBB_ERR_SHAPE);
    assert_errmsg_contains("in=5");
    assert_errmsg_contains("[2, 4, 7, 6]");
    opcall_init(&oc, "conv2d", "out=6 kernel=3 groups=3");
    assert_int_equal(opcall_params(&oc, &x, 1, EBB_FLOAT32, CPU), EBB_ERR_SHAPE);
    assert_errmsg_contains("groups=3");
    opcall_init(&oc, "conv2d", "out=2 kernel=9");
    assert_int_equal(opcall_params(&oc, &x, 1, EBB_FLOAT32, CPU), EBB_ERR_SHAPE);
    assert_errmsg_contains("[2, 4, 7, 6]");
    assert_errmsg_contains("kernel 9");
    opcall_init(&oc, "conv2d", "out=2 kernel=3 stride=0");
    assert_int_equal(opcall_params(&oc, &x, 1, EBB_FLOAT32, CPU), EBB_ERR_ARG);
    assert_errmsg_contains("stride=0");

    /* a weight that does not fit the input is refused by the tensor layer */
    ebb_tensor *w = randn(EBB_SHAPE(2, 3, 3, 3), 2);
    int64_t one[2] = {1, 1}, zero[2] = {0, 0};
    assert_int_equal(ebb_tensor_conv(&y, x, w, NULL, one, zero, one, 1), EBB_ERR_SHAPE);
    assert_null(y);
    assert_errmsg_contains("[2, 4, 7, 6]");
    assert_errmsg_contains("[2, 3, 3, 3]");
    ebb_tensor_free(w);
    ebb_tensor_free(x);
}

/* ---- pooling ----------------------------------------------------------------------- */

static void test_pool_values(void **state) {
    (void)state;
    float v[16];
    for (int i = 0; i < 16; i++)
        v[i] = (float)i;
    ebb_tensor *x = tensor_of(v, EBB_SHAPE(1, 1, 4, 4)), *y = NULL;
    opcall oc;

    opcall_init(&oc, "max_pool2d", "kernel=2");
    y = opcall_run(&oc, &x, 1);
    assert_shape(y, EBB_SHAPE(1, 1, 2, 2));
    assert_values(y, (float[]){5, 7, 13, 15}, 4, 0);
    ebb_tensor_free(y);

    opcall_init(&oc, "avg_pool2d", "kernel=2");
    y = opcall_run(&oc, &x, 1);
    assert_values(y, (float[]){2.5f, 4.5f, 10.5f, 12.5f}, 4, 1e-6);
    ebb_tensor_free(y);

    /* stride 1, padding 1: the max of each 3x3 neighbourhood */
    opcall_init(&oc, "max_pool2d", "kernel=3 stride=1 padding=1");
    y = opcall_run(&oc, &x, 1);
    assert_shape(y, EBB_SHAPE(1, 1, 4, 4));
    assert_values(y, (float[]){5, 6, 7, 7, 9, 10, 11, 11, 13, 14, 15, 15, 13, 14, 15, 15}, 16, 0);
    ebb_tensor_free(y);

    /* ceil_mode keeps the partial last window */
    opcall_init(&oc, "max_pool2d", "kernel=3 stride=2 ceil_mode=true");
    y = opcall_run(&oc, &x, 1);
    assert_shape(y, EBB_SHAPE(1, 1, 2, 2));
    assert_values(y, (float[]){10, 11, 14, 15}, 4, 0);
    ebb_tensor_free(y);
    ebb_tensor_free(x);

    /* count_include_pad decides whether padded zeros count in the average */
    ebb_tensor *ones = NULL;
    ebb_shape s = EBB_SHAPE(1, 1, 2, 2);
    assert_ok(ebb_tensor_ones(&ones, &s, EBB_FLOAT32, CPU));
    opcall_init(&oc, "avg_pool2d", "kernel=3 stride=1 padding=1");
    y = opcall_run(&oc, &ones, 1);
    assert_values(y, (float[]){4.f / 9, 4.f / 9, 4.f / 9, 4.f / 9}, 4, 1e-6);
    ebb_tensor_free(y);
    opcall_init(&oc, "avg_pool2d", "kernel=3 stride=1 padding=1 count_include_pad=false");
    y = opcall_run(&oc, &ones, 1);
    assert_values(y, (float[]){1, 1, 1, 1}, 4, 1e-6);
    ebb_tensor_free(y);
    ebb_tensor_free(ones);
}

static void test_adaptive_avg_pool(void **state) {
    (void)state;
    const int n = 2, c = 3, h = 5, w = 7, o = 3;
    ebb_tensor *x = randn(EBB_SHAPE(n, c, h, w), 4), *y = NULL;
    opcall oc;
    opcall_init(&oc, "adaptive_avg_pool2d", "output_size=3");
    y = opcall_run(&oc, &x, 1);
    assert_shape(y, EBB_SHAPE(n, c, o, o));
    /* PyTorch's bins: [floor(i*in/out), ceil((i+1)*in/out)) */
    float *xv = host(x), ref[2 * 3 * 3 * 3];
    for (int ni = 0; ni < n * c; ni++)
        for (int i = 0; i < o; i++)
            for (int j = 0; j < o; j++) {
                int y0 = i * h / o, y1 = ((i + 1) * h + o - 1) / o;
                int x0 = j * w / o, x1 = ((j + 1) * w + o - 1) / o;
                double acc = 0;
                for (int a = y0; a < y1; a++)
                    for (int b = x0; b < x1; b++)
                        acc += xv[(ni * h + a) * w + b];
                ref[(ni * o + i) * o + j] = (float)(acc / ((y1 - y0) * (x1 - x0)));
            }
    assert_values(y, ref, sizeof ref / sizeof ref[0], 1e-5);
    free(xv);
    ebb_tensor_free(y);

    /* output_size=1 is the global average */
    ebb_tensor *mean = NULL;
    int64_t dims[2] = {2, 3};
    assert_ok(ebb_tensor_reduce(&mean, EBB_REDUCE_MEAN, x, dims, 2, true));
    opcall_init(&oc, "adaptive_avg_pool2d", "output_size=1");
    y = opcall_run(&oc, &x, 1);
    assert_close(y, mean, 1e-5, 1e-6);
    ebb_tensor_free(mean);
    ebb_tensor_free(y);
    ebb_tensor_free(x);
}

static void test_pool_errors(void **state) {
    (void)state;
    ebb_tensor *x = randn(EBB_SHAPE(4, 4), 1), *y = NULL;
    opcall oc;
    opcall_init(&oc, "max_pool2d", "kernel=2");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_SHAPE);
    assert_errmsg_contains("max_pool2d");
    assert_errmsg_contains("[4, 4]");
    opcall_init(&oc, "adaptive_avg_pool2d", "output_size=2");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_SHAPE);
    assert_errmsg_contains("[4, 4]");
    ebb_tensor_free(x);

    x = randn(EBB_SHAPE(1, 1, 4, 4), 1);
    opcall_init(&oc, "avg_pool2d", "kernel=2 padding=2");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_ARG);
    assert_errmsg_contains("padding 2");
    opcall_init(&oc, "max_pool2d", "kernel=6");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_SHAPE);
    assert_errmsg_contains("[1, 1, 4, 4]");
    ebb_tensor_free(x);
}

/* ---- normalisation ----------------------------------------------------------------- */

static void check_batch_norm(ebb_shape s) {
    opcall oc;
    opcall_init(&oc, "batch_norm", "eps=0.001");
    ebb_tensor *x = randn(s, 5);
    assert_ok(opcall_params(&oc, &x, 1, EBB_FLOAT32, CPU));
    int64_t c = s.dim[1];
    static const char *names[] = {"weight", "bias", "running_mean", "running_var"};
    static const ebb_init_kind inits[] = {EBB_INIT_ONES, EBB_INIT_ZEROS, EBB_INIT_ZEROS,
                                          EBB_INIT_ONES};
    /* ... and PyTorch's int64 batch counter, last */
    assert_int_equal(oc.n_params, 5);
    assert_string_equal(oc.spec[4].name, "num_batches_tracked");
    assert_int_equal(ebb_tensor_dtype(oc.params[4]), EBB_INT64);
    for (int i = 0; i < 4; i++) {
        assert_string_equal(oc.spec[i].name, names[i]);
        assert_int_equal(oc.spec[i].init, inits[i]);
        ebb_shape want = EBB_SHAPE(c);
        assert_true(ebb_shape_equal(&oc.spec[i].shape, &want));
    }
    opcall_randomize(&oc, 0, 0.5, 1.5, 11);
    opcall_randomize(&oc, 1, -1, 1, 12);
    opcall_randomize(&oc, 2, -1, 1, 13);
    opcall_randomize(&oc, 3, 0.25, 2, 14);
    ebb_tensor *y = NULL;
    assert_ok(opcall_forward(&oc, &x, 1, &y));
    assert_shape(y, s);
    float *xv = host(x), *w = host(oc.params[0]), *b = host(oc.params[1]),
          *m = host(oc.params[2]), *v = host(oc.params[3]);
    int64_t n = ebb_shape_numel(&s), inner = n / (s.dim[0] * c);
    float *ref = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        int64_t ch = (i / inner) % c;
        ref[i] = (float)((xv[i] - m[ch]) / sqrt(v[ch] + 0.001) * w[ch] + b[ch]);
    }
    assert_values(y, ref, (size_t)n, 1e-5);
    free(xv);
    free(w);
    free(b);
    free(m);
    free(v);
    free(ref);
    ebb_tensor_free(y);
    ebb_tensor_free(x);
    opcall_done(&oc);
}

static void test_batch_norm(void **state) {
    (void)state;
    check_batch_norm(EBB_SHAPE(4, 3));
    check_batch_norm(EBB_SHAPE(2, 3, 5));
    check_batch_norm(EBB_SHAPE(2, 3, 4, 4));

    /* without affine only the running statistics remain */
    opcall oc;
    opcall_init(&oc, "batch_norm", "affine=false");
    ebb_tensor *x = randn(EBB_SHAPE(2, 3, 4), 1);
    ebb_tensor *y = opcall_run(&oc, &x, 1);
    assert_int_equal(oc.n_params, 3);
    assert_string_equal(oc.spec[0].name, "running_mean");
    assert_string_equal(oc.spec[1].name, "running_var");
    /* PyTorch's batch counter, an int64 buffer */
    assert_string_equal(oc.spec[2].name, "num_batches_tracked");
    assert_true(oc.spec[2].buffer && oc.spec[2].counter && oc.spec[2].shape.ndim == 0);
    assert_close(y, x, 1e-4, 1e-4); /* mean 0, var 1: x / sqrt(1 + eps) */
    ebb_tensor_free(y);
    opcall_done(&oc);

    opcall_init(&oc, "batch_norm", "num_features=5");
    assert_int_equal(opcall_params(&oc, &x, 1, EBB_FLOAT32, CPU), EBB_ERR_SHAPE);
    assert_errmsg_contains("num_features=5");
    assert_errmsg_contains("[2, 3, 4]");
    ebb_tensor_free(x);
    x = randn(EBB_SHAPE(7), 1);
    opcall_init(&oc, "batch_norm", NULL);
    assert_int_equal(opcall_params(&oc, &x, 1, EBB_FLOAT32, CPU), EBB_ERR_SHAPE);
    assert_errmsg_contains("[7]");
    ebb_tensor_free(x);
}

static void check_rms_norm(const char *attrs, double eps) {
    opcall oc;
    opcall_init(&oc, "rms_norm", attrs);
    const int rows = 6, d = 8;
    ebb_tensor *x = randn(EBB_SHAPE(2, 3, d), 6);
    assert_ok(opcall_params(&oc, &x, 1, EBB_FLOAT32, CPU));
    assert_int_equal(oc.n_params, 1);
    assert_string_equal(oc.spec[0].name, "weight");
    assert_int_equal(oc.spec[0].init, EBB_INIT_ONES);
    opcall_randomize(&oc, 0, 0.5, 1.5, 7);
    ebb_tensor *y = NULL;
    assert_ok(opcall_forward(&oc, &x, 1, &y));
    assert_shape(y, EBB_SHAPE(2, 3, d));
    float *xv = host(x), *w = host(oc.params[0]), ref[6 * 8];
    for (int r = 0; r < rows; r++) {
        double ms = 0;
        for (int i = 0; i < d; i++)
            ms += (double)xv[r * d + i] * xv[r * d + i];
        double inv = 1.0 / sqrt(ms / d + eps);
        for (int i = 0; i < d; i++)
            ref[r * d + i] = (float)(xv[r * d + i] * inv * w[i]);
    }
    assert_values(y, ref, sizeof ref / sizeof ref[0], 1e-5);
    free(xv);
    free(w);
    ebb_tensor_free(y);
    ebb_tensor_free(x);
    opcall_done(&oc);
}

static void test_rms_norm(void **state) {
    (void)state;
    check_rms_norm(NULL, FLT_EPSILON);
    check_rms_norm("eps=0.5", 0.5);

    /* a hand-computed row: rms of (3, 4) is sqrt(12.5) */
    opcall oc;
    opcall_init(&oc, "rms_norm", "affine=false eps=0");
    ebb_tensor *x = tensor_of((float[]){3, 4}, EBB_SHAPE(1, 2));
    ebb_tensor *y = opcall_run(&oc, &x, 1);
    assert_int_equal(oc.n_params, 0);
    assert_values(y, (float[]){(float)(3 / sqrt(12.5)), (float)(4 / sqrt(12.5))}, 2, 1e-6);
    ebb_tensor_free(y);
    ebb_tensor_free(x);
}

static void test_group_norm(void **state) {
    (void)state;
    const int n = 2, c = 6, g = 3, hw = 6;
    opcall oc;
    opcall_init(&oc, "group_norm", "num_groups=3 eps=0.01");
    ebb_tensor *x = randn(EBB_SHAPE(n, c, 3, 2), 8);
    assert_ok(opcall_params(&oc, &x, 1, EBB_FLOAT32, CPU));
    assert_int_equal(oc.n_params, 2);
    assert_string_equal(oc.spec[0].name, "weight");
    assert_string_equal(oc.spec[1].name, "bias");
    opcall_randomize(&oc, 0, 0.5, 1.5, 1);
    opcall_randomize(&oc, 1, -1, 1, 2);
    ebb_tensor *y = NULL;
    assert_ok(opcall_forward(&oc, &x, 1, &y));
    assert_shape(y, EBB_SHAPE(n, c, 3, 2));
    float *xv = host(x), *w = host(oc.params[0]), *b = host(oc.params[1]), ref[2 * 6 * 6];
    int per = c / g * hw;
    for (int ni = 0; ni < n; ni++)
        for (int gi = 0; gi < g; gi++) {
            const float *p = xv + (ni * c + gi * (c / g)) * hw;
            double mean = 0, var = 0;
            for (int i = 0; i < per; i++)
                mean += p[i];
            mean /= per;
            for (int i = 0; i < per; i++)
                var += (p[i] - mean) * (p[i] - mean);
            var /= per;
            for (int i = 0; i < per; i++) {
                int ch = gi * (c / g) + i / hw;
                ref[(ni * c + gi * (c / g)) * hw + i] =
                    (float)((p[i] - mean) / sqrt(var + 0.01) * w[ch] + b[ch]);
            }
        }
    assert_values(y, ref, sizeof ref / sizeof ref[0], 1e-5);
    free(xv);
    free(w);
    free(b);
    ebb_tensor_free(y);
    opcall_done(&oc);

    opcall_init(&oc, "group_norm", "num_groups=4");
    assert_int_equal(opcall_params(&oc, &x, 1, EBB_FLOAT32, CPU), EBB_ERR_SHAPE);
    assert_errmsg_contains("num_groups=4");
    assert_errmsg_contains("6 channels");
    assert_errmsg_contains("[2, 6, 3, 2]");
    ebb_tensor_free(x);
}

/* ---- embedding --------------------------------------------------------------------- */

static void test_embedding(void **state) {
    (void)state;
    int64_t idx[6] = {0, 9, 3, 3, 7, 1};
    ebb_shape is = EBB_SHAPE(2, 3);
    ebb_tensor *x = NULL, *y = NULL;
    assert_ok(ebb_tensor_from_host(&x, idx, sizeof idx, &is, EBB_INT64, CPU));
    opcall oc;
    opcall_init(&oc, "embedding", "num=10 dim=4");
    y = opcall_run(&oc, &x, 1);
    assert_int_equal(oc.n_params, 1);
    assert_string_equal(oc.spec[0].name, "weight");
    assert_int_equal(oc.spec[0].init, EBB_INIT_NORMAL);
    ebb_shape ws = EBB_SHAPE(10, 4);
    assert_true(ebb_shape_equal(&oc.spec[0].shape, &ws));
    assert_shape(y, EBB_SHAPE(2, 3, 4));
    assert_int_equal(ebb_tensor_dtype(y), EBB_FLOAT32);
    float *w = host(oc.params[0]), ref[24];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 4; j++)
            ref[i * 4 + j] = w[idx[i] * 4 + j];
    assert_values(y, ref, 24, 0);
    free(w);
    ebb_tensor_free(y);

    /* int32 indices pick the same rows */
    int32_t idx32[6] = {0, 9, 3, 3, 7, 1};
    ebb_tensor *x32 = NULL;
    assert_ok(ebb_tensor_from_host(&x32, idx32, sizeof idx32, &is, EBB_INT32, CPU));
    assert_ok(opcall_forward(&oc, &x32, 1, &y));
    assert_values(y, ref, 24, 0);
    ebb_tensor_free(y);
    ebb_tensor_free(x32);

    /* out-of-range and negative indices are errors, not crashes */
    int64_t bad[2] = {2, 10}, neg[2] = {-1, 0};
    ebb_shape bs = EBB_SHAPE(2);
    ebb_tensor *xb = NULL;
    assert_ok(ebb_tensor_from_host(&xb, bad, sizeof bad, &bs, EBB_INT64, CPU));
    assert_int_equal(opcall_forward(&oc, &xb, 1, &y), EBB_ERR_ARG);
    assert_errmsg_contains("embedding");
    assert_errmsg_contains("index 10");
    assert_errmsg_contains("10 embeddings");
    ebb_tensor_free(xb);
    assert_ok(ebb_tensor_from_host(&xb, neg, sizeof neg, &bs, EBB_INT64, CPU));
    assert_int_equal(opcall_forward(&oc, &xb, 1, &y), EBB_ERR_ARG);
    assert_errmsg_contains("index -1");
    ebb_tensor_free(xb);

    /* float indices are refused with their dtype and shape */
    xb = randn(EBB_SHAPE(2, 3), 1);
    assert_int_equal(opcall_forward(&oc, &xb, 1, &y), EBB_ERR_ARG);
    assert_errmsg_contains("float32");
    assert_errmsg_contains("[2, 3]");
    ebb_tensor_free(xb);
    opcall_done(&oc);
    ebb_tensor_free(x);
}

/* ---- attention --------------------------------------------------------------------- */

/* nn.MultiheadAttention (batch_first) over host floats. q [B, T, E],
 * kv [B, S, E] (key and value source), w [3E, E], b [3E], wo [E, E], bo [E]. */
static void ref_mha(const float *q, const float *k, const float *v, int bsz, int t, int s, int e,
                    int heads, int causal, const float *w, const float *b, const float *wo,
                    const float *bo, float *y) {
    int d = e / heads;
    double *qp = calloc((size_t)(bsz * t * e), sizeof(double));
    double *kp = calloc((size_t)(bsz * s * e), sizeof(double));
    double *vp = calloc((size_t)(bsz * s * e), sizeof(double));
    double *o = calloc((size_t)(bsz * t * e), sizeof(double));
    double *p = calloc((size_t)s, sizeof(double));
    for (int bi = 0; bi < bsz; bi++)
        for (int j = 0; j < e; j++) {
            for (int ti = 0; ti < t; ti++) {
                double acc = b ? b[j] : 0;
                for (int m = 0; m < e; m++)
                    acc += (double)w[j * e + m] * q[(bi * t + ti) * e + m];
                qp[(bi * t + ti) * e + j] = acc;
            }
            for (int si = 0; si < s; si++) {
                double ak = b ? b[e + j] : 0, av = b ? b[2 * e + j] : 0;
                for (int m = 0; m < e; m++) {
                    ak += (double)w[(e + j) * e + m] * k[(bi * s + si) * e + m];
                    av += (double)w[(2 * e + j) * e + m] * v[(bi * s + si) * e + m];
                }
                kp[(bi * s + si) * e + j] = ak;
                vp[(bi * s + si) * e + j] = av;
            }
        }
    for (int bi = 0; bi < bsz; bi++)
        for (int h = 0; h < heads; h++)
            for (int ti = 0; ti < t; ti++) {
                double mx = -INFINITY, sum = 0;
                for (int si = 0; si < s; si++) {
                    double dot = 0;
                    for (int m = 0; m < d; m++)
                        dot +=
                            qp[(bi * t + ti) * e + h * d + m] * kp[(bi * s + si) * e + h * d + m];
                    p[si] = causal && si > ti ? -INFINITY : dot / sqrt((double)d);
                    if (p[si] > mx)
                        mx = p[si];
                }
                for (int si = 0; si < s; si++)
                    sum += p[si] = exp(p[si] - mx);
                for (int m = 0; m < d; m++) {
                    double acc = 0;
                    for (int si = 0; si < s; si++)
                        acc += p[si] / sum * vp[(bi * s + si) * e + h * d + m];
                    o[(bi * t + ti) * e + h * d + m] = acc;
                }
            }
    for (int r = 0; r < bsz * t; r++)
        for (int j = 0; j < e; j++) {
            double acc = bo ? bo[j] : 0;
            for (int m = 0; m < e; m++)
                acc += (double)wo[j * e + m] * o[r * e + m];
            y[r * e + j] = (float)acc;
        }
    free(qp);
    free(kp);
    free(vp);
    free(o);
    free(p);
}

static void check_mha(const char *attrs, int causal, int cross, int bias) {
    const int bsz = 2, t = 5, s = cross ? 3 : 5, e = 8, heads = 2;
    opcall oc;
    opcall_init(&oc, "multi_head_attention", attrs);
    ebb_tensor *in[3] = {randn(EBB_SHAPE(bsz, t, e), 20), NULL, NULL};
    int n_in = 1;
    if (cross) {
        in[1] = randn(EBB_SHAPE(bsz, s, e), 21);
        in[2] = randn(EBB_SHAPE(bsz, s, e), 22);
        n_in = 3;
    }
    assert_ok(opcall_params(&oc, in, n_in, EBB_FLOAT32, CPU));
    assert_int_equal(oc.n_params, bias ? 4 : 2);
    assert_string_equal(oc.spec[0].name, "in_proj_weight");
    ebb_shape w3 = EBB_SHAPE(3 * e, e), we = EBB_SHAPE(e, e);
    assert_true(ebb_shape_equal(&oc.spec[0].shape, &w3));
    assert_int_equal(oc.spec[0].init, EBB_INIT_UNIFORM_FAN_IN);
    assert_int_equal(oc.spec[0].fan_in, e);
    int wo = bias ? 2 : 1;
    assert_string_equal(oc.spec[wo].name, "out_proj.weight");
    assert_true(ebb_shape_equal(&oc.spec[wo].shape, &we));
    if (bias) {
        assert_string_equal(oc.spec[1].name, "in_proj_bias");
        assert_string_equal(oc.spec[3].name, "out_proj.bias");
        assert_int_equal(oc.spec[1].init, EBB_INIT_ZEROS);
        assert_int_equal(oc.spec[3].init, EBB_INIT_ZEROS);
        /* non-zero biases so the reference checks where they are added */
        opcall_randomize(&oc, 1, -0.5, 0.5, 31);
        opcall_randomize(&oc, 3, -0.5, 0.5, 32);
    }
    ebb_tensor *y = NULL;
    assert_ok(opcall_forward(&oc, in, n_in, &y));
    assert_shape(y, EBB_SHAPE(bsz, t, e));
    float *q = host(in[0]), *k = host(in[cross ? 1 : 0]), *v = host(in[cross ? 2 : 0]);
    float *w = host(oc.params[0]), *wov = host(oc.params[wo]);
    float *b = bias ? host(oc.params[1]) : NULL, *bo = bias ? host(oc.params[3]) : NULL;
    float ref[2 * 5 * 8];
    ref_mha(q, k, v, bsz, t, s, e, heads, causal, w, b, wov, bo, ref);
    assert_values(y, ref, sizeof ref / sizeof ref[0], 1e-4);
    free(q);
    free(k);
    free(v);
    free(w);
    free(wov);
    free(b);
    free(bo);
    ebb_tensor_free(y);
    for (int i = 0; i < 3; i++)
        ebb_tensor_free(in[i]);
    opcall_done(&oc);
}

static void test_multi_head_attention(void **state) {
    (void)state;
    check_mha("num_heads=2", 0, 0, 1);
    check_mha("num_heads=2 causal=true", 1, 0, 1);
    check_mha("num_heads=2 bias=false embed_dim=8", 0, 0, 0);
    check_mha("num_heads=2", 0, 1, 1);

    /* causal: the first position sees only itself, so it does not change
     * when later positions do */
    opcall oc;
    opcall_init(&oc, "multi_head_attention", "num_heads=2 causal=true");
    ebb_tensor *x = randn(EBB_SHAPE(1, 4, 8), 3), *x2 = NULL, *tail = NULL, *y = NULL, *y2 = NULL;
    y = opcall_run(&oc, &x, 1);
    assert_ok(ebb_tensor_clone(&x2, x));
    assert_ok(ebb_tensor_narrow(&tail, x2, 1, 1, 3));
    ebb_tensor *noise = randn(EBB_SHAPE(1, 3, 8), 9);
    assert_ok(ebb_tensor_add_(tail, noise));
    assert_ok(opcall_forward(&oc, &x2, 1, &y2));
    float *a = host(y), *b = host(y2);
    for (int i = 0; i < 8; i++)
        assert_float_equal(a[i], b[i], 1e-6);
    assert_true(fabsf(a[8] - b[8]) > 1e-6f || fabsf(a[9] - b[9]) > 1e-6f);
    free(a);
    free(b);
    ebb_tensor_free(noise);
    ebb_tensor_free(tail);
    ebb_tensor_free(y);
    ebb_tensor_free(y2);
    ebb_tensor_free(x2);
    opcall_done(&oc);

    opcall_init(&oc, "multi_head_attention", "num_heads=3");
    assert_int_equal(opcall_params(&oc, &x, 1, EBB_FLOAT32, CPU), EBB_ERR_SHAPE);
    assert_errmsg_contains("num_heads=3");
    assert_errmsg_contains("embed_dim=8");
    ebb_tensor_free(x);
    x = randn(EBB_SHAPE(5, 8), 1);
    opcall_init(&oc, "multi_head_attention", "num_heads=2");
    assert_int_equal(opcall_params(&oc, &x, 1, EBB_FLOAT32, CPU), EBB_ERR_SHAPE);
    assert_errmsg_contains("[5, 8]");
    ebb_tensor_free(x);

    /* a key whose batch or width does not fit the query */
    ebb_tensor *qk[2] = {randn(EBB_SHAPE(2, 5, 8), 1), randn(EBB_SHAPE(3, 4, 8), 2)};
    assert_int_equal(opcall_params(&oc, qk, 2, EBB_FLOAT32, CPU), EBB_ERR_SHAPE);
    assert_errmsg_contains("[2, 5, 8]");
    assert_errmsg_contains("[3, 4, 8]");
    ebb_tensor_free(qk[0]);
    ebb_tensor_free(qk[1]);
}

/* ---- recurrent cells ----------------------------------------------------------------- */

/* out[j] = W[j, :] . x + b[j] for j < rows. */
static void matvec(const float *w, const float *b, const float *x, int rows, int cols,
                   double *out) {
    for (int j = 0; j < rows; j++) {
        double acc = b ? b[j] : 0;
        for (int m = 0; m < cols; m++)
            acc += (double)w[j * cols + m] * x[m];
        out[j] = acc;
    }
}

static void check_gru(int with_x, int bias) {
    const int bsz = 3, h = 4, in = with_x ? 5 : 4;
    char attrs[64];
    snprintf(attrs, sizeof attrs, "hidden=%d bias=%s", h, bias ? "true" : "false");
    opcall oc;
    opcall_init(&oc, "gru_cell", attrs);
    ebb_tensor *st[2] = {randn(EBB_SHAPE(bsz, h), 40),
                         with_x ? randn(EBB_SHAPE(bsz, in), 41) : NULL};
    assert_ok(opcall_params(&oc, st, with_x ? 2 : 1, EBB_FLOAT32, CPU));
    assert_int_equal(oc.n_params, bias ? 4 : 2);
    static const char *names[] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    for (int i = 0; i < oc.n_params; i++) {
        assert_string_equal(oc.spec[i].name, names[i]);
        assert_int_equal(oc.spec[i].init, EBB_INIT_UNIFORM_FAN_IN);
        assert_int_equal(oc.spec[i].fan_in, h);
    }
    ebb_shape wih = EBB_SHAPE(3 * h, in), whh = EBB_SHAPE(3 * h, h);
    assert_true(ebb_shape_equal(&oc.spec[0].shape, &wih));
    assert_true(ebb_shape_equal(&oc.spec[1].shape, &whh));
    ebb_tensor *y = NULL;
    assert_ok(opcall_forward(&oc, st, with_x ? 2 : 1, &y));
    assert_shape(y, EBB_SHAPE(bsz, h));
    float *hv = host(st[0]), *xv = with_x ? host(st[1]) : hv;
    float *w1 = host(oc.params[0]), *w2 = host(oc.params[1]);
    float *b1 = bias ? host(oc.params[2]) : NULL, *b2 = bias ? host(oc.params[3]) : NULL;
    float ref[3 * 4];
    for (int r = 0; r < bsz; r++) {
        double gi[12], gh[12];
        matvec(w1, b1, xv + r * in, 3 * h, in, gi);
        matvec(w2, b2, hv + r * h, 3 * h, h, gh);
        for (int j = 0; j < h; j++) {
            double rg = sigmoid(gi[j] + gh[j]), z = sigmoid(gi[h + j] + gh[h + j]);
            double n = tanh(gi[2 * h + j] + rg * gh[2 * h + j]);
            ref[r * h + j] = (float)((1 - z) * n + z * hv[r * h + j]);
        }
    }
    assert_values(y, ref, sizeof ref / sizeof ref[0], 1e-5);
    free(hv);
    if (with_x)
        free(xv);
    free(w1);
    free(w2);
    free(b1);
    free(b2);
    ebb_tensor_free(y);
    ebb_tensor_free(st[0]);
    ebb_tensor_free(st[1]);
    opcall_done(&oc);
}

static void test_gru_cell(void **state) {
    (void)state;
    check_gru(0, 1);
    check_gru(1, 1);
    check_gru(0, 0);

    /* one input, one output of the same shape: usable as a loop body */
    opcall oc;
    opcall_init(&oc, "gru_cell", "hidden=4");
    ebb_tensor *h = randn(EBB_SHAPE(2, 4), 1), *h1 = opcall_run(&oc, &h, 1), *h2 = NULL;
    assert_ok(opcall_forward(&oc, &h1, 1, &h2));
    assert_shape(h2, EBB_SHAPE(2, 4));
    ebb_tensor_free(h1);
    ebb_tensor_free(h2);
    opcall_done(&oc);

    opcall_init(&oc, "gru_cell", "hidden=4 input_size=6");
    assert_int_equal(opcall_params(&oc, &h, 1, EBB_FLOAT32, CPU), EBB_ERR_SHAPE);
    assert_errmsg_contains("input_size=6");
    opcall_init(&oc, "gru_cell", "hidden=5");
    assert_int_equal(opcall_params(&oc, &h, 1, EBB_FLOAT32, CPU), EBB_ERR_SHAPE);
    assert_errmsg_contains("[2, 4]");
    ebb_tensor_free(h);
}

static void check_lstm(int with_x) {
    const int bsz = 2, h = 3, in = with_x ? 5 : 3;
    opcall oc;
    opcall_init(&oc, "lstm_cell", "hidden=3");
    ebb_tensor *st[2] = {randn(EBB_SHAPE(bsz, 2 * h), 50),
                         with_x ? randn(EBB_SHAPE(bsz, in), 51) : NULL};
    assert_ok(opcall_params(&oc, st, with_x ? 2 : 1, EBB_FLOAT32, CPU));
    assert_int_equal(oc.n_params, 4);
    ebb_shape wih = EBB_SHAPE(4 * h, in), whh = EBB_SHAPE(4 * h, h), b = EBB_SHAPE(4 * h);
    assert_true(ebb_shape_equal(&oc.spec[0].shape, &wih));
    assert_true(ebb_shape_equal(&oc.spec[1].shape, &whh));
    assert_true(ebb_shape_equal(&oc.spec[3].shape, &b));
    assert_string_equal(oc.spec[3].name, "bias_hh");
    ebb_tensor *y = NULL;
    assert_ok(opcall_forward(&oc, st, with_x ? 2 : 1, &y));
    assert_shape(y, EBB_SHAPE(bsz, 2 * h));
    float *sv = host(st[0]), *xv = with_x ? host(st[1]) : NULL;
    float *w1 = host(oc.params[0]), *w2 = host(oc.params[1]), *b1 = host(oc.params[2]),
          *b2 = host(oc.params[3]);
    float ref[2 * 6];
    for (int r = 0; r < bsz; r++) {
        const float *hr = sv + r * 2 * h, *cr = hr + h, *xr = with_x ? xv + r * in : hr;
        double gi[12], gh[12];
        matvec(w1, b1, xr, 4 * h, in, gi);
        matvec(w2, b2, hr, 4 * h, h, gh);
        for (int j = 0; j < h; j++) {
            double ig = sigmoid(gi[j] + gh[j]), fg = sigmoid(gi[h + j] + gh[h + j]);
            double gg = tanh(gi[2 * h + j] + gh[2 * h + j]),
                   og = sigmoid(gi[3 * h + j] + gh[3 * h + j]);
            double c2 = fg * cr[j] + ig * gg;
            ref[r * 2 * h + j] = (float)(og * tanh(c2));
            ref[r * 2 * h + h + j] = (float)c2;
        }
    }
    assert_values(y, ref, sizeof ref / sizeof ref[0], 1e-5);
    free(sv);
    free(xv);
    free(w1);
    free(w2);
    free(b1);
    free(b2);
    ebb_tensor_free(y);
    ebb_tensor_free(st[0]);
    ebb_tensor_free(st[1]);
    opcall_done(&oc);
}

static void test_lstm_cell(void **state) {
    (void)state;
    check_lstm(0);
    check_lstm(1);
    opcall oc;
    opcall_init(&oc, "lstm_cell", "hidden=3");
    ebb_tensor *s = randn(EBB_SHAPE(2, 5), 1);
    assert_int_equal(opcall_params(&oc, &s, 1, EBB_FLOAT32, CPU), EBB_ERR_SHAPE);
    assert_errmsg_contains("[2, 5]");
    assert_errmsg_contains("2*hidden");
    ebb_tensor_free(s);
}

/* ---- shape ops ----------------------------------------------------------------------- */

/* Runs a view op and checks its shape and that it shares x's storage. */
static ebb_tensor *view_of(const char *op, const char *attrs, ebb_tensor *x, ebb_shape want) {
    opcall oc;
    opcall_init(&oc, op, attrs);
    ebb_tensor *y = opcall_run(&oc, &x, 1);
    assert_shape(y, want);
    assert_true(ebb_tensor_same_storage(x, y));
    return y;
}

static void test_shape_ops(void **state) {
    (void)state;
    float v[24];
    for (int i = 0; i < 24; i++)
        v[i] = (float)i;
    ebb_tensor *x = tensor_of(v, EBB_SHAPE(2, 3, 4)), *y;
    int64_t before = ebb_memory_current(CPU);

    ebb_tensor_free(view_of("flatten", NULL, x, EBB_SHAPE(2, 12)));
    ebb_tensor_free(view_of("flatten", "start_dim=0", x, EBB_SHAPE(24)));
    ebb_tensor_free(view_of("flatten", "start_dim=0 end_dim=1", x, EBB_SHAPE(6, 4)));
    ebb_tensor_free(view_of("reshape", "shape=\"-1,6\"", x, EBB_SHAPE(4, 6)));
    ebb_tensor_free(view_of("reshape", "shape=\"[4, 3, 2]\"", x, EBB_SHAPE(4, 3, 2)));
    ebb_tensor_free(view_of("transpose", "dim0=0 dim1=-1", x, EBB_SHAPE(4, 3, 2)));
    ebb_tensor_free(view_of("unsqueeze", "dim=1", x, EBB_SHAPE(2, 1, 3, 4)));
    ebb_tensor_free(view_of("unsqueeze", "dim=-1", x, EBB_SHAPE(2, 3, 4, 1)));
    ebb_tensor_free(view_of("squeeze", NULL, x, EBB_SHAPE(2, 3, 4)));

    /* permute moves element [i, j, k] to [k, i, j] */
    y = view_of("permute", "dims=\"2,0,1\"", x, EBB_SHAPE(4, 2, 3));
    float got[24];
    ebb_tensor *c = NULL;
    assert_ok(ebb_tensor_contiguous(&c, y));
    assert_ok(ebb_tensor_to_host(c, got, sizeof got));
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++)
                assert_float_equal(got[(k * 2 + i) * 3 + j], v[(i * 3 + j) * 4 + k], 0);
    ebb_tensor_free(c);

    /* flatten merges dims 1 and 2 of the permuted [4, 2, 3] without a copy,
     * but flattening all of it must copy (libtorch's reshape rules) */
    opcall oc;
    opcall_init(&oc, "flatten", NULL);
    ebb_tensor *f = opcall_run(&oc, &y, 1);
    assert_shape(f, EBB_SHAPE(4, 6));
    assert_true(ebb_tensor_same_storage(f, y));
    ebb_tensor_free(f);
    opcall_init(&oc, "flatten", "start_dim=0");
    f = opcall_run(&oc, &y, 1);
    assert_shape(f, EBB_SHAPE(24));
    assert_false(ebb_tensor_same_storage(f, y));
    ebb_tensor_free(f);
    ebb_tensor_free(y);

    /* squeeze: one dim, or every size-1 dim; a dim of size > 1 stays */
    ebb_tensor *u = view_of("unsqueeze", "dim=0", x, EBB_SHAPE(1, 2, 3, 4));
    ebb_tensor *u2 = view_of("unsqueeze", "dim=3", u, EBB_SHAPE(1, 2, 3, 1, 4));
    ebb_tensor_free(view_of("squeeze", "dim=3", u2, EBB_SHAPE(1, 2, 3, 4)));
    ebb_tensor_free(view_of("squeeze", NULL, u2, EBB_SHAPE(2, 3, 4)));
    ebb_tensor_free(view_of("squeeze", "dim=1", u2, EBB_SHAPE(1, 2, 3, 1, 4)));
    ebb_tensor_free(u);
    ebb_tensor_free(u2);

    /* views allocate nothing */
    assert_int_equal(ebb_memory_current(CPU), before);
    ebb_tensor_free(x);
}

static void test_shape_errors(void **state) {
    (void)state;
    ebb_tensor *x = randn(EBB_SHAPE(2, 3, 4), 1), *y = NULL;
    opcall oc;
    opcall_init(&oc, "reshape", "shape=\"5,-1\"");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_SHAPE);
    assert_errmsg_contains("[2, 3, 4]");
    assert_errmsg_contains("24 elements");
    assert_errmsg_contains("[5, -1]");
    opcall_init(&oc, "reshape", "shape=\"-1,-1\"");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_SHAPE);
    opcall_init(&oc, "reshape", "shape=\"4,x\"");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_ARG);
    assert_errmsg_contains("shape=\"4,x\"");
    opcall_init(&oc, "reshape", "shape=\"[4,6\"");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_ARG);
    opcall_init(&oc, "reshape", "shape=\"1,1,1,1,1,1,1,2,12\"");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_ARG);
    assert_errmsg_contains("more than 8");
    opcall_init(&oc, "permute", "dims=\"1,0\"");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_SHAPE);
    assert_errmsg_contains("[2, 3, 4]");
    opcall_init(&oc, "permute", "dims=\"1,1,0\"");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_ARG);
    assert_errmsg_contains("repeats");
    opcall_init(&oc, "transpose", "dim0=0 dim1=3");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_SHAPE);
    assert_errmsg_contains("dim 3");
    assert_errmsg_contains("[2, 3, 4]");
    opcall_init(&oc, "unsqueeze", "dim=5");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_SHAPE);
    opcall_init(&oc, "squeeze", "dim=-4");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_SHAPE);
    opcall_init(&oc, "flatten", "start_dim=2 end_dim=1");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_ARG);
    ebb_tensor_free(x);
}

/* ---- math ------------------------------------------------------------------------------ */

static void test_math_ops(void **state) {
    (void)state;
    float v[6] = {1, 2, 3, 4, 5, 6};
    ebb_tensor *x = tensor_of(v, EBB_SHAPE(2, 3)), *y;
    opcall oc;

    opcall_init(&oc, "scale", "factor=2.5");
    y = opcall_run(&oc, &x, 1);
    assert_values(y, (float[]){2.5f, 5, 7.5f, 10, 12.5f, 15}, 6, 1e-6);
    assert_false(ebb_tensor_same_storage(x, y));
    ebb_tensor_free(y);

    opcall_init(&oc, "mean", "dim=1");
    y = opcall_run(&oc, &x, 1);
    assert_shape(y, EBB_SHAPE(2));
    assert_values(y, (float[]){2, 5}, 2, 1e-6);
    ebb_tensor_free(y);

    opcall_init(&oc, "sum", "dim=0 keepdim=true");
    y = opcall_run(&oc, &x, 1);
    assert_shape(y, EBB_SHAPE(1, 3));
    assert_values(y, (float[]){5, 7, 9}, 3, 1e-6);
    ebb_tensor_free(y);

    opcall_init(&oc, "sum", "dims=\"0,1\"");
    y = opcall_run(&oc, &x, 1);
    assert_shape(y, (ebb_shape){0, {0}});
    assert_values(y, (float[]){21}, 1, 1e-6);
    ebb_tensor_free(y);

    opcall_init(&oc, "mean", NULL); /* every dim */
    y = opcall_run(&oc, &x, 1);
    assert_shape(y, (ebb_shape){0, {0}});
    assert_values(y, (float[]){3.5f}, 1, 1e-6);
    ebb_tensor_free(y);

    opcall_init(&oc, "mean", "keepdim=true");
    y = opcall_run(&oc, &x, 1);
    assert_shape(y, EBB_SHAPE(1, 1));
    ebb_tensor_free(y);

    opcall_init(&oc, "mean", "dims=\"-1\"");
    y = opcall_run(&oc, &x, 1);
    assert_values(y, (float[]){2, 5}, 2, 1e-6);
    ebb_tensor_free(y);

    y = NULL;
    opcall_init(&oc, "mean", "dims=\"0\" dim=1");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_ARG);
    assert_errmsg_contains("not both");
    opcall_init(&oc, "sum", "dim=2");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_SHAPE);
    assert_errmsg_contains("dim 2");
    assert_errmsg_contains("[2, 3]");
    opcall_init(&oc, "sum", "dims=\"1,1\"");
    assert_int_equal(opcall_forward(&oc, &x, 1, &y), EBB_ERR_ARG);
    ebb_tensor_free(x);
}

/* ---- every op: low precision and the meta device --------------------------------------- */

typedef struct op_case {
    const char *op, *attrs;
    ebb_shape in;
    int int_input; /* int64 indices in [0, 10) */
} op_case;

static const op_case cases[] = {
    {"conv1d", "out=4 kernel=3 padding=1", {3, {2, 3, 9}}, 0},
    {"conv2d", "out=4 kernel=3 stride=2 groups=2", {4, {2, 4, 8, 8}}, 0},
    {"max_pool2d", "kernel=2", {4, {2, 3, 6, 6}}, 0},
    {"avg_pool2d", "kernel=3 stride=2 padding=1", {4, {2, 3, 7, 7}}, 0},
    {"adaptive_avg_pool2d", "output_size=3", {4, {2, 3, 7, 7}}, 0},
    {"batch_norm", NULL, {3, {4, 3, 5}}, 0},
    {"rms_norm", NULL, {3, {2, 5, 8}}, 0},
    {"group_norm", "num_groups=2", {4, {2, 4, 3, 3}}, 0},
    {"embedding", "num=10 dim=4", {2, {2, 3}}, 1},
    {"multi_head_attention", "num_heads=2 causal=true", {3, {2, 5, 8}}, 0},
    {"gru_cell", "hidden=6", {2, {3, 6}}, 0},
    {"lstm_cell", "hidden=4", {2, {3, 8}}, 0},
    {"flatten", NULL, {3, {2, 3, 4}}, 0},
    {"reshape", "shape=\"-1,4\"", {3, {2, 3, 4}}, 0},
    {"permute", "dims=\"1,0,2\"", {3, {2, 3, 4}}, 0},
    {"transpose", "dim0=0 dim1=1", {3, {2, 3, 4}}, 0},
    {"unsqueeze", "dim=0", {3, {2, 3, 4}}, 0},
    {"squeeze", NULL, {3, {2, 1, 4}}, 0},
    {"scale", "factor=0.5", {2, {2, 3}}, 0},
    {"mean", "dims=\"1\"", {3, {2, 3, 4}}, 0},
    {"sum", "dim=2 keepdim=true", {3, {2, 3, 4}}, 0},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

static ebb_tensor *case_input(const op_case *k, ebb_dtype dtype, ebb_device dev) {
    ebb_tensor *x = NULL, *y = NULL;
    if (dev.type == EBB_DEVICE_META) {
        assert_ok(ebb_tensor_empty(&x, &k->in, k->int_input ? EBB_INT64 : dtype, dev));
        return x;
    }
    if (k->int_input) {
        int64_t idx[64];
        for (int i = 0; i < ebb_shape_numel(&k->in); i++)
            idx[i] = (i * 7) % 10;
        assert_ok(ebb_tensor_from_host(&x, idx, sizeof(int64_t) * (size_t)ebb_shape_numel(&k->in),
                                       &k->in, EBB_INT64, dev));
        return x;
    }
    x = randn(k->in, 60);
    assert_ok(ebb_tensor_cast(&y, x, dtype));
    ebb_tensor_free(x);
    return y;
}

/* Whether this libtorch has a float16 CPU matmul (1.13 has not): ops built on
 * ebb_tensor_linear need it. */
static int half_linear_on_cpu(void) {
    ebb_shape s = EBB_SHAPE(2, 2);
    ebb_tensor *a = NULL, *y = NULL;
    assert_ok(ebb_tensor_ones(&a, &s, EBB_FLOAT16, CPU));
    ebb_status st = ebb_tensor_linear(&y, a, a, NULL);
    ebb_tensor_free(a);
    ebb_tensor_free(y);
    ebb_error_clear();
    return st == EBB_OK;
}

/* float16 and bfloat16 inputs give float16 and bfloat16 outputs close to the
 * float32 result on the same (rounded) values. */
static void test_low_precision(void **state) {
    (void)state;
    const ebb_dtype low[2] = {EBB_FLOAT16, EBB_BFLOAT16};
    int half_linear = half_linear_on_cpu();
    const char *no_bf16 = ebb_test_bf16_unusable();
    if (no_bf16)
        fprintf(stderr, "bfloat16 cases skipped: %s\n", no_bf16);
    for (int i = 0; i < N_CASES; i++)
        for (int l = 0; l < 2; l++) {
            const op_case *k = &cases[i];
            if (low[l] == EBB_BFLOAT16 && no_bf16)
                continue;
            if (low[l] == EBB_FLOAT16 && !half_linear &&
                strcmp(k->op, "multi_head_attention") == 0) {
                /* projections go through ebb_tensor_linear: a clean error */
                opcall oc;
                ebb_tensor *x = case_input(k, EBB_FLOAT16, CPU), *y = NULL;
                opcall_init(&oc, k->op, k->attrs);
                assert_ok(opcall_params(&oc, &x, 1, EBB_FLOAT16, CPU));
                assert_int_not_equal(opcall_forward(&oc, &x, 1, &y), EBB_OK);
                assert_errmsg_contains("Half");
                ebb_tensor_free(x);
                opcall_done(&oc);
                continue;
            }
            /* the float32 reference sees the low-precision values */
            ebb_tensor *xl = case_input(k, low[l], CPU), *xf = NULL;
            assert_ok(ebb_tensor_cast(&xf, xl, k->int_input ? EBB_INT64 : EBB_FLOAT32));
            opcall of, ol;
            opcall_init(&of, k->op, k->attrs);
            opcall_init(&ol, k->op, k->attrs);
            assert_ok(opcall_params(&ol, &xl, 1, low[l], CPU));
            assert_ok(opcall_params(&of, &xf, 1, EBB_FLOAT32, CPU));
            for (int p = 0; p < ol.n_params; p++) { /* same values in both */
                ebb_tensor_free(of.params[p]);
                of.params[p] = NULL;
                assert_ok(ebb_tensor_cast(&of.params[p], ol.params[p], EBB_FLOAT32));
            }
            ebb_tensor *yf = NULL, *yl = NULL, *yc = NULL;
            assert_ok(opcall_forward(&of, &xf, 1, &yf));
            if (opcall_forward(&ol, &xl, 1, &yl) != EBB_OK)
                fail_msg("%s in %s: %s", k->op, ebb_dtype_name(low[l]), ebb_errmsg());
            assert_int_equal(ebb_tensor_dtype(yl), low[l]);
            assert_ok(ebb_tensor_cast(&yc, yl, EBB_FLOAT32));
            int ok = 0;
            double tol = low[l] == EBB_FLOAT16 ? 1e-2 : 5e-2;
            assert_ok(ebb_tensor_allclose(yc, yf, tol, tol, &ok));
            if (!ok) {
                double d = 0;
                ebb_tensor_max_abs_diff(yc, yf, &d);
                fail_msg("%s in %s differs from float32 by %g", k->op, ebb_dtype_name(low[l]), d);
            }
            ebb_tensor_free(xl);
            ebb_tensor_free(xf);
            ebb_tensor_free(yf);
            ebb_tensor_free(yl);
            ebb_tensor_free(yc);
            opcall_done(&of);
            opcall_done(&ol);
        }
}

/* The compiler's dry run: every op gives the CPU's output shape on meta
 * tensors, without touching data. */
static void test_meta_shapes(void **state) {
    (void)state;
    for (int i = 0; i < N_CASES; i++) {
        const op_case *k = &cases[i];
        ebb_tensor *xc = case_input(k, EBB_FLOAT32, CPU), *xm = case_input(k, EBB_FLOAT32, META);
        opcall oc, om;
        opcall_init(&oc, k->op, k->attrs);
        opcall_init(&om, k->op, k->attrs);
        ebb_tensor *yc = opcall_run(&oc, &xc, 1), *ym = NULL;
        assert_ok(opcall_params(&om, &xm, 1, EBB_FLOAT32, META));
        if (opcall_forward(&om, &xm, 1, &ym) != EBB_OK)
            fail_msg("%s on meta: %s", k->op, ebb_errmsg());
        assert_int_equal(ebb_tensor_device(ym).type, EBB_DEVICE_META);
        assert_shape(ym, ebb_tensor_shape(yc));
        assert_int_equal(ebb_tensor_dtype(ym), ebb_tensor_dtype(yc));
        if (om.op->is_view)
            assert_true(ebb_tensor_same_storage(xm, ym));
        ebb_tensor_free(xc);
        ebb_tensor_free(xm);
        ebb_tensor_free(yc);
        ebb_tensor_free(ym);
        opcall_done(&oc);
        opcall_done(&om);
    }
}

/* ---- the tensor-layer primitives directly --------------------------------------------- */

static void test_copy_from_host(void **state) {
    (void)state;
    ebb_shape s = EBB_SHAPE(2, 3);
    ebb_tensor *t = NULL, *tt = NULL;
    assert_ok(ebb_tensor_zeros(&t, &s, EBB_FLOAT32, CPU));
    float v[6] = {1, 2, 3, 4, 5, 6};
    assert_ok(ebb_tensor_copy_from_host(t, v, sizeof v));
    assert_values(t, v, 6, 0);
    /* a strided destination is filled in its logical order */
    assert_ok(ebb_tensor_transpose(&tt, t, 0, 1));
    assert_ok(ebb_tensor_copy_from_host(tt, v, sizeof v));
    assert_values(tt, v, 6, 0);
    assert_values(t, (float[]){1, 3, 5, 2, 4, 6}, 6, 0);
    /* misaligned source bytes */
    unsigned char raw[sizeof v + 1];
    memcpy(raw + 1, v, sizeof v);
    assert_ok(ebb_tensor_copy_from_host(tt, raw + 1, sizeof v));
    assert_values(tt, v, 6, 0);
    assert_int_equal(ebb_tensor_copy_from_host(t, v, 8), EBB_ERR_SHAPE);
    assert_errmsg_contains("8 bytes");
    assert_errmsg_contains("[2, 3]");
    ebb_tensor_free(tt);
    ebb_tensor_free(t);
    assert_ok(ebb_tensor_empty(&t, &s, EBB_FLOAT32, META));
    assert_int_equal(ebb_tensor_copy_from_host(t, v, sizeof v), EBB_ERR_ARG);
    assert_errmsg_contains("meta");
    ebb_tensor_free(t);
}

static void test_attention_primitive(void **state) {
    (void)state;
    /* one key: the output is its value whatever the scores */
    ebb_tensor *q = randn(EBB_SHAPE(2, 3, 4), 1), *k = randn(EBB_SHAPE(2, 1, 4), 2),
               *v = randn(EBB_SHAPE(2, 1, 5), 3), *o = NULL;
    assert_ok(ebb_tensor_attention(&o, q, k, v, false));
    assert_shape(o, EBB_SHAPE(2, 3, 5));
    float *ov = host(o), *vv = host(v);
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 3; t++)
            for (int j = 0; j < 5; j++)
                assert_float_equal(ov[(b * 3 + t) * 5 + j], vv[b * 5 + j], 1e-5);
    free(ov);
    free(vv);
    ebb_tensor_free(o);
    ebb_tensor_free(v);
    v = randn(EBB_SHAPE(2, 2, 5), 3);
    assert_int_equal(ebb_tensor_attention(&o, q, k, v, false), EBB_ERR_SHAPE);
    assert_null(o);
    assert_errmsg_contains("[2, 3, 4]");
    assert_errmsg_contains("[2, 2, 5]");
    ebb_tensor_free(q);
    ebb_tensor_free(k);
    ebb_tensor_free(v);
}

/* ---- losses -------------------------------------------------------------------------- */

static ebb_tensor *f64_of(const double *v, ebb_shape s) {
    ebb_tensor *t = NULL;
    assert_ok(ebb_tensor_from_host(&t, v, sizeof(double) * (size_t)ebb_shape_numel(&s), &s,
                                   EBB_FLOAT64, CPU));
    return t;
}

static ebb_tensor *i64_of(const int64_t *v, ebb_shape s) {
    ebb_tensor *t = NULL;
    assert_ok(ebb_tensor_from_host(&t, v, sizeof(int64_t) * (size_t)ebb_shape_numel(&s), &s,
                                   EBB_INT64, CPU));
    return t;
}

/* Runs a loss on (x, t) and checks its value against PyTorch's. */
static void expect_loss(const char *op, const char *attrs, ebb_tensor *x, ebb_tensor *t,
                        double want) {
    opcall oc;
    opcall_init(&oc, op, attrs);
    ebb_tensor *in[2] = {x, t}, *y = NULL;
    assert_ok(opcall_forward(&oc, in, 2, &y));
    assert_int_equal(ebb_tensor_ndim(y), 0);
    assert_int_equal(ebb_tensor_dtype(y), ebb_tensor_dtype(x));
    double v = 0;
    assert_ok(ebb_tensor_item(y, &v));
    ebb_tensor_free(y);
    if (!(fabs(v - want) <= 1e-14 * fabs(want)))
        fail_msg("%s(%s) = %.17g, PyTorch gives %.17g", op, attrs ? attrs : "", v, want);
}

/* A loss that must fail with `status`; returns with its message in ebb_errmsg(). */
static void expect_loss_error(const char *op, const char *attrs, ebb_tensor *x, ebb_tensor *t,
                              ebb_status status) {
    opcall oc;
    opcall_init(&oc, op, attrs);
    ebb_tensor *in[2] = {x, t}, *y = NULL;
    assert_int_equal(opcall_forward(&oc, in, 2, &y), status);
    assert_null(y);
}

/* The four losses give torch.nn.functional's values (PyTorch 1.13, float64):
 *   x = [[0.5, -1.25, 2, 0.125], [1.5, 0.25, -0.75, -2], [-0.5, 3, 0, 1]]
 *   y = [[0, 1, 0.25, 0.5], [1, 0.75, 0, 0.125], [0.5, 0.5, 1, 0]]
 *   F.cross_entropy(x, [1, 0, 3])                              2.048151876210923
 *   F.cross_entropy(x, [1, 0, 3], label_smoothing=0.2)         2.066901876210923
 *   F.cross_entropy(x, [1, -100, 3])                           2.896159994185325
 *   F.cross_entropy(x, [1, -100, 3], label_smoothing=0.2)      2.749284994185325
 *   F.cross_entropy(x, [1, 0, 3], ignore_index=3)              1.974724215029588
 *   F.cross_entropy(x[2], 1, label_smoothing=0.1)              0.40750719857359397
 *   F.nll_loss(x, [1, 0, 3])                                   -0.4166666666666667
 *   F.nll_loss(x, [1, -100, 3])                                0.125
 *   F.mse_loss(x, y)                                           1.9453125
 *   F.binary_cross_entropy_with_logits(x, y)                   0.8900631692280921
 * (equal to the bit with the libtorch that made them; 1e-14 relative leaves
 * room for other CPUs' vector kernels), and refuse what PyTorch refuses,
 * naming the op and both inputs. */
static void test_losses(void **state) {
    (void)state;
    const double xv[] = {0.5, -1.25, 2, 0.125, 1.5, 0.25, -0.75, -2, -0.5, 3, 0, 1};
    const double yv[] = {0, 1, 0.25, 0.5, 1, 0.75, 0, 0.125, 0.5, 0.5, 1, 0};
    ebb_tensor *x = f64_of(xv, EBB_SHAPE(3, 4)), *y = f64_of(yv, EBB_SHAPE(3, 4));
    ebb_tensor *t = i64_of((int64_t[]){1, 0, 3}, EBB_SHAPE(3));
    ebb_tensor *ti = i64_of((int64_t[]){1, -100, 3}, EBB_SHAPE(3));
    ebb_tensor *x1 = f64_of(xv + 8, EBB_SHAPE(4)), *t1 = i64_of((int64_t[]){1}, (ebb_shape){0});
    expect_loss("cross_entropy", NULL, x, t, 2.048151876210923);
    expect_loss("cross_entropy", "label_smoothing=0.2", x, t, 2.066901876210923);
    expect_loss("cross_entropy", NULL, x, ti, 2.896159994185325);
    expect_loss("cross_entropy", "label_smoothing=0.2", x, ti, 2.749284994185325);
    expect_loss("cross_entropy", "ignore_index=3", x, t, 1.974724215029588);
    expect_loss("cross_entropy", "label_smoothing=0.1", x1, t1, 0.40750719857359397);
    expect_loss("nll", NULL, x, t, -0.4166666666666667);
    expect_loss("nll", NULL, x, ti, 0.125);
    expect_loss("mse", NULL, x, y, 1.9453125);
    expect_loss("bce_with_logits", NULL, x, y, 0.8900631692280921);

    /* a float target: cross_entropy wants class indices */
    ebb_tensor *tf = f64_of((double[]){1, 0, 3}, EBB_SHAPE(3));
    expect_loss_error("cross_entropy", NULL, x, tf, EBB_ERR_ARG);
    assert_errmsg_contains("cross_entropy: target is float64 [3]; it needs int64 class indices");
    assert_errmsg_contains("logits float64 [3, 4]");
    /* a target that does not fit the batch */
    ebb_tensor *t2 = i64_of((int64_t[]){1, 0}, EBB_SHAPE(2));
    expect_loss_error("nll", NULL, x, t2, EBB_ERR_SHAPE);
    assert_errmsg_contains("nll: target [2] does not fit log_probs [3, 4]: expected [3]");
    /* a class index out of range, as ATen reports it */
    ebb_tensor *t7 = i64_of((int64_t[]){1, 7, 3}, EBB_SHAPE(3));
    expect_loss_error("cross_entropy", NULL, x, t7, EBB_ERR_TORCH);
    assert_errmsg_contains("cross_entropy (logits float64 [3, 4], target int64 [3])");
    assert_errmsg_contains("Target 7 is out of bounds");
    expect_loss_error("cross_entropy", "label_smoothing=1.5", x, t, EBB_ERR_ARG);
    assert_errmsg_contains("label_smoothing must be in [0, 1], got 1.5");
    expect_loss_error("cross_entropy", "label_smoothing=-0.1", x, t, EBB_ERR_ARG);
    /* regression losses: one shape, one dtype */
    expect_loss_error("mse", NULL, x, x1, EBB_ERR_SHAPE);
    assert_errmsg_contains("mse: pred [3, 4] and target [4] differ in shape");
    ebb_tensor *y32 = NULL;
    assert_ok(ebb_tensor_cast(&y32, y, EBB_FLOAT32));
    expect_loss_error("bce_with_logits", NULL, x, y32, EBB_ERR_ARG);
    assert_errmsg_contains("logits float64 [3, 4] and target float32 [3, 4]");

    /* the compiler asks the shape function, which refuses the same */
    ebb_builder *b = ebb_builder_new("loss");
    ebb_input(b, "x");
    ebb_input(b, "t");
    const char *using_t[] = {"t"};
    ebb_usingv(b, using_t, 1);
    ebb_from(b, ebb_node_op(b, "cross_entropy", NULL));
    ebb_graph *g = ebb_build(b);
    ebb_builder_free(b);
    assert_non_null(g);
    ebb_shape shapes[2] = {EBB_SHAPE(8, 5), EBB_SHAPE(8)};
    ebb_dtype dts[2] = {EBB_FLOAT32, EBB_FLOAT32};
    ebb_compile_options o = {.input_shapes = shapes, .n_input_shapes = 2, .input_dtypes = dts};
    ebb_plan *p = NULL;
    assert_int_equal(ebb_compile(&p, g, &o), EBB_ERR_ARG);
    assert_errmsg_contains("target is float32 [8]; it needs int64 class indices");
    dts[1] = EBB_INT64;
    assert_ok(ebb_compile(&p, g, &o));
    const ebb_plan_value *v = ebb_plan_value_at(p, ebb_plan_output_slot(p, 0));
    assert_int_equal(v->shape.ndim, 0);
    assert_int_equal(v->dtype, EBB_FLOAT32);
    ebb_plan_free(p);
    ebb_graph_free(g);

    ebb_tensor *all[] = {x, y, t, ti, x1, t1, tf, t2, t7, y32};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ebb_tensor_free(all[i]);
}

/* docs/ops.md documents every registered op and each of its attributes. */
static void test_docs_cover_every_op(void **state) {
    (void)state;
    FILE *f = fopen(EBB_SOURCE_DIR "/docs/ops.md", "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *doc = malloc((size_t)n + 1);
    assert_non_null(doc);
    assert_int_equal(fread(doc, 1, (size_t)n, f), (size_t)n);
    doc[n] = '\0';
    fclose(f);
    for (int i = 0; i < ebb_op_count(); i++) {
        const ebb_op *op = ebb_op_at(i);
        char name[96];
        snprintf(name, sizeof name, "`%s`", op->name);
        /* the op's "### " heading, and its section up to the next "## " */
        const char *at = doc, *head = NULL;
        while ((at = strstr(at, "\n### ")) != NULL) {
            const char *eol = strchr(at + 1, '\n');
            const char *hit = strstr(at, name);
            if (hit && eol && hit < eol) {
                head = at;
                break;
            }
            at++;
        }
        if (!head) {
            fail_msg("docs/ops.md has no heading for op %s", op->name);
            continue; /* fail_msg does not return; said for the compiler */
        }
        const char *end = strstr(head + 1, "\n## ");
        size_t len = end ? (size_t)(end - head) : strlen(head);
        for (int a = 0; a < op->n_attrs; a++) {
            char row[96];
            snprintf(row, sizeof row, "| `%s` |", op->attrs[a].name);
            const char *r = strstr(head, row);
            if (!r || (size_t)(r - head) > len)
                fail_msg("docs/ops.md: op %s lacks a row for attribute %s", op->name,
                         op->attrs[a].name);
        }
    }
    free(doc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        EBB_TEST(test_ops_registered),
        EBB_TEST(test_conv2d),
        EBB_TEST(test_conv1d),
        EBB_TEST(test_conv_errors),
        EBB_TEST(test_pool_values),
        EBB_TEST(test_adaptive_avg_pool),
        EBB_TEST(test_pool_errors),
        EBB_TEST(test_batch_norm),
        EBB_TEST(test_rms_norm),
        EBB_TEST(test_group_norm),
        EBB_TEST(test_embedding),
        EBB_TEST(test_multi_head_attention),
        EBB_TEST(test_gru_cell),
        EBB_TEST(test_lstm_cell),
        EBB_TEST(test_shape_ops),
        EBB_TEST(test_shape_errors),
        EBB_TEST(test_math_ops),
        EBB_TEST(test_low_precision),
        EBB_TEST(test_meta_shapes),
        EBB_TEST(test_copy_from_host),
        EBB_TEST(test_attention_primitive),
        EBB_TEST(test_losses),
        EBB_TEST(test_docs_cover_every_op),
    };
    return cmocka_run_group_tests_name("ops", tests, NULL, NULL);
}
