/* Optimizers against torch.optim. tests/parity/make_optim_fixtures.py ran
 * SGD (plain, momentum, Nesterov with weight decay, dampening with weight
 * decay), Adam (weight decay; amsgrad) and AdamW (default; amsgrad) for ten
 * steps on an 8->16->4 MLP with fixed gradients, some of them None; here the
 * same gradients go through ebb_optimizer_step() and ebb_optimizer_update()
 * and every step's parameters, and the final state, must match.
 *
 * The match criterion, per element: |ebb - torch| <= 1e-6 * max(|torch|, 1e-2),
 * that is 1e-6 relative, and 1e-8 absolute for values below 0.01 (float32
 * resolves about 1e-9 there). State tensors, whose values span many orders
 * of magnitude (exp_avg_sq of a 1e-7 gradient), use 1e-6 relative with an
 * absolute floor of 1e-9 of the tensor's largest value. Each case prints the
 * largest deviation it saw.
 *
 * Also: the defaults, option checks, errors that change nothing, save/load
 * round trips that continue bit for bit, load errors, and state and scratch
 * bytes against the allocator. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <unistd.h>

#include "test_util.h"
#include "test_dir.h"

#define STEPS 10
#define MAX_PARAMS 8

static const ebb_device CPU = {EBB_DEVICE_CPU, 0};

/* ---- fixtures ---------------------------------------------------------------- */

static void fixture_path(char *buf, size_t size, const char *file) {
    snprintf(buf, size, "%s/tests/parity/fixtures/optim_%s.safetensors", EBB_SOURCE_DIR, file);
}

static ebb_safetensors *open_fixture(const char *file) {
    char path[1024];
    fixture_path(path, sizeof path, file);
    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, path));
    return st;
}

/* The named tensor on `device`, or NULL when the file has none. */
static ebb_tensor *maybe_load(const ebb_safetensors *st, const char *name, ebb_device device) {
    if (ebb_safetensors_find(st, name, NULL, NULL) == EBB_ERR_ARG) return NULL;
    ebb_tensor *t = NULL;
    assert_ok(ebb_safetensors_load(&t, st, name, device));
    return t;
}

static double scalar(const ebb_safetensors *st, const char *name) {
    ebb_tensor *t = maybe_load(st, name, CPU);
    if (!t) fail_msg("%s: no tensor '%s'", ebb_safetensors_path(st), name);
    double v = 0;
    assert_ok(ebb_tensor_item(t, &v));
    ebb_tensor_free(t);
    return v;
}

/* The case's options as torch.optim resolved them, marked complete. */
static ebb_optimizer_options case_options(const ebb_safetensors *st) {
    ebb_optimizer_options o = {
        .kind = (ebb_optimizer_kind)scalar(st, "hp.kind"),
        .lr = scalar(st, "hp.lr"),
        .momentum = scalar(st, "hp.momentum"),
        .dampening = scalar(st, "hp.dampening"),
        .nesterov = scalar(st, "hp.nesterov") != 0,
        .weight_decay = scalar(st, "hp.weight_decay"),
        .beta1 = scalar(st, "hp.beta1"),
        .beta2 = scalar(st, "hp.beta2"),
        .eps = scalar(st, "hp.eps"),
        .amsgrad = scalar(st, "hp.amsgrad") != 0,
        .rho = scalar(st, "hp.rho"),
        .centered = scalar(st, "hp.centered") != 0,
        .lr_decay = scalar(st, "hp.lr_decay"),
        .initial_accumulator_value = scalar(st, "hp.initial_accumulator_value"),
        .complete = 1,
    };
    return o;
}

/* The MLP the fixtures were made with: fc1 (8 -> 16), relu, fc2 (16 -> 4). */
static ebb_plan *mlp_plan(void) {
    ebb_builder *b = ebb_builder_new("optim_mlp");
    ebb_input(b, "x");
    ebb_from(b, ebb_node_op(b, "linear", "out=16, name=fc1"));
    ebb_through(b, ebb_node_op(b, "relu", NULL));
    ebb_through(b, ebb_node_op(b, "linear", "out=4, name=fc2"));
    ebb_graph *g = ebb_build(b);
    ebb_builder_free(b);
    if (!g) fail_msg("ebb_build: %s", ebb_errmsg());
    ebb_shape xs = EBB_SHAPE(2, 8);
    ebb_compile_options co = {.input_shapes = &xs, .n_input_shapes = 1};
    ebb_plan *plan = NULL;
    ebb_status s = ebb_compile(&plan, g, &co);
    ebb_graph_free(g);
    assert_ok(s);
    return plan;
}

/* A model holding the fixture's initial parameters. */
static ebb_model *mlp_model(const ebb_plan *plan, ebb_device device) {
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, plan, device, 7));
    char path[1024];
    fixture_path(path, sizeof path, "mlp.params");
    assert_ok(ebb_model_load(m, path));
    assert_int_equal(ebb_model_param_count(m), 4);
    return m;
}

/* Step t's gradients in the model's order (NULL where torch's was None). */
static void load_grads(ebb_tensor **grads, const ebb_safetensors *gst, const ebb_model *m, int t,
                       ebb_device device) {
    for (int i = 0; i < ebb_model_param_count(m); i++) {
        char name[256];
        snprintf(name, sizeof name, "grad.%d.%s", t, ebb_model_param_name(m, i));
        grads[i] = maybe_load(gst, name, device);
    }
}

static void free_all(ebb_tensor **ts, int n) {
    for (int i = 0; i < n; i++) {
        ebb_tensor_free(ts[i]);
        ts[i] = NULL;
    }
}

/* max_i |a_i - b_i| / max(|b_i|, floor), and max_i |a_i - b_i| into *abs_out,
 * over two tensors of one shape, in float64 on the host. */
static double deviation(const ebb_tensor *a, const ebb_tensor *b, double floor, double *abs_out) {
    ebb_shape sa = ebb_tensor_shape(a), sb = ebb_tensor_shape(b);
    assert_true(ebb_shape_equal(&sa, &sb));
    ebb_tensor *da = NULL, *db = NULL;
    assert_ok(ebb_tensor_to(&da, a, CPU, EBB_FLOAT64));
    assert_ok(ebb_tensor_to(&db, b, CPU, EBB_FLOAT64));
    size_t n = (size_t)ebb_tensor_numel(a);
    double *ha = malloc(n * sizeof *ha + 1), *hb = malloc(n * sizeof *hb + 1);
    assert_non_null(ha);
    assert_non_null(hb);
    assert_ok(ebb_tensor_to_host(da, ha, n * sizeof *ha));
    assert_ok(ebb_tensor_to_host(db, hb, n * sizeof *hb));
    double rel = 0, absd = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(ha[i] - hb[i]);
        double r = d / fmax(fabs(hb[i]), floor);
        if (!(d <= absd)) /* NaN too */
            absd = d;
        if (!(r <= rel)) rel = r;
    }
    free(ha);
    free(hb);
    ebb_tensor_free(da);
    ebb_tensor_free(db);
    if (abs_out) *abs_out = absd;
    return rel;
}

static double max_abs(const ebb_tensor *t) {
    ebb_tensor *a = NULL, *r = NULL;
    double v = 0;
    assert_ok(ebb_tensor_unary(&a, EBB_ABS, t));
    assert_ok(ebb_tensor_reduce(&r, EBB_REDUCE_MAX, a, NULL, 0, false));
    assert_ok(ebb_tensor_item(r, &v));
    ebb_tensor_free(a);
    ebb_tensor_free(r);
    return v;
}

/* Non-zero when two tensors hold the same values bit for bit (as far as a
 * float64 difference can tell). */
static int identical(const ebb_tensor *a, const ebb_tensor *b) {
    double d = 0;
    deviation(a, b, 1.0, &d);
    return d == 0;
}

static int same_options(ebb_optimizer_options a, ebb_optimizer_options b) {
    return a.kind == b.kind && a.lr == b.lr && a.momentum == b.momentum &&
           a.dampening == b.dampening && !a.nesterov == !b.nesterov &&
           a.weight_decay == b.weight_decay && a.beta1 == b.beta1 && a.beta2 == b.beta2 &&
           a.eps == b.eps && !a.amsgrad == !b.amsgrad && !a.complete == !b.complete;
}

static const char *const SLOTS[] = {"momentum_buffer", "exp_avg",  "exp_avg_sq",
                                    "max_exp_avg_sq",  "square_avg", "grad_avg",
                                    "acc_delta",       "sum"};
#define N_SLOTS 8

/* ---- parity with torch.optim ---------------------------------------------------- */

#define PARAM_FLOOR 1e-2
/* torch.optim's fixtures were made on the CPU; a CUDA kernel's other
 * operation order (fused multiply-adds, lerp) moves the last bits, so the
 * device is held to the GPU check's 1e-4 relative */
#define TOL_CPU 1e-6
#define TOL_DEVICE 1e-4
/* and against another libtorch's CPU kernels (pip's 2.x: its vectorised sqrt
 * and division round otherwise in the last place), which RMSprop and
 * Adagrad, dividing by running square roots, carry to a few 1e-6 */
#define TOL_OTHER_TORCH 1e-5

static void test_parity(void **state) {
    const char *name = *state;
    ebb_device dev = ebb_test_device();
    const int fixtures_torch = strncmp(ebb_torch_version(), "1.13", 4) == 0;
    const double TOL = dev.type != EBB_DEVICE_CPU ? TOL_DEVICE
                       : fixtures_torch           ? TOL_CPU
                                                  : TOL_OTHER_TORCH;
    ebb_safetensors *cst = open_fixture(name), *gst = open_fixture("mlp.grads");
    ebb_plan *plan = mlp_plan();
    ebb_model *m = mlp_model(plan, dev);
    int n = ebb_model_param_count(m);
    ebb_optimizer_options o = case_options(cst);
    ebb_optimizer *opt = NULL;
    assert_ok(ebb_optimizer_new(&opt, m, &o));

    double worst_rel = 0, worst_abs = 0;
    for (int t = 0; t < STEPS; t++) {
        ebb_tensor *grads[MAX_PARAMS] = {0};
        load_grads(grads, gst, m, t, dev);
        /* odd steps go one parameter at a time, as a training plan's update
         * steps do; each gradient is freed as soon as its update has read it */
        if (t % 2 == 0) {
            assert_ok(ebb_optimizer_step(opt, grads));
        } else {
            for (int i = n - 1; i >= 0; i--) {
                if (!grads[i]) continue;
                assert_ok(ebb_optimizer_update(opt, i, grads[i]));
                ebb_tensor_free(grads[i]);
                grads[i] = NULL;
            }
        }
        free_all(grads, n);
        for (int i = 0; i < n; i++) {
            const char *pn = ebb_model_param_name(m, i);
            char key[256];
            snprintf(key, sizeof key, "after.%d.%s", t, pn);
            ebb_tensor *want = maybe_load(cst, key, CPU);
            assert_non_null(want);
            double d_abs = 0;
            double rel = deviation(ebb_model_param(m, pn), want, PARAM_FLOOR, &d_abs);
            ebb_tensor_free(want);
            if (!(rel <= TOL))
                fail_msg("%s: step %d, %s: deviation %.3g (max abs %.3g) > %g", name, t, pn, rel,
                         d_abs, TOL);
            worst_rel = fmax(worst_rel, rel);
            worst_abs = fmax(worst_abs, d_abs);
        }
    }

    /* the state after the last step, and the update counts */
    double worst_state = 0;
    for (int i = 0; i < n; i++) {
        const char *pn = ebb_model_param_name(m, i);
        char key[256];
        for (int k = 0; k < N_SLOTS; k++) {
            snprintf(key, sizeof key, "optim.%s.%s", pn, SLOTS[k]);
            ebb_tensor *want = maybe_load(cst, key, CPU);
            ebb_tensor *have = ebb_optimizer_state_tensor(opt, i, SLOTS[k]);
            if (!want) {
                if (have) fail_msg("%s: ebb keeps %s, torch.optim does not", name, key);
                continue;
            }
            if (!have) fail_msg("%s: torch.optim keeps %s, ebb does not", name, key);
            double rel = deviation(have, want, 1e-9 * max_abs(want), NULL);
            ebb_tensor_free(want);
            if (!(rel <= TOL)) fail_msg("%s: %s deviates by %.3g", name, key, rel);
            worst_state = fmax(worst_state, rel);
        }
        snprintf(key, sizeof key, "optim.%s.step", pn);
        assert_int_equal(ebb_optimizer_param_step_count(opt, i), (int64_t)scalar(cst, key));
    }
    /* fc1.bias had no gradient at step 0, fc2.bias none at step 4 */
    assert_int_equal(ebb_optimizer_step_count(opt), STEPS);
    assert_int_equal(ebb_optimizer_param_step_count(opt, 1), STEPS - 1);
    assert_int_equal(ebb_optimizer_param_step_count(opt, 3), STEPS - 1);
    print_message(
        "%-18s max |ebb - torch.optim|: params %.3g (relative measure %.3g), state %.3g relative\n",
        name, worst_abs, worst_rel, worst_state);

    ebb_optimizer_free(opt);
    ebb_model_free(m);
    ebb_plan_free(plan);
    ebb_safetensors_close(cst);
    ebb_safetensors_close(gst);
}

/* torch.optim's state, written by the fixture script under ebb's names,
 * loads into an ebb optimizer: the same names, layout and options. */
static void test_load_torch_state(void **state) {
    (void)state;
    const char *cases[] = {"sgd", "sgd_momentum", "adam_amsgrad", "adamw"};
    ebb_plan *plan = mlp_plan();
    ebb_model *m = mlp_model(plan, CPU);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ebb_safetensors *cst = open_fixture(cases[c]);
        ebb_optimizer_options want = case_options(cst);
        /* created with other hyperparameters of the same kind: the file's win */
        ebb_optimizer_options start = ebb_optimizer_defaults(want.kind, 0.5);
        ebb_optimizer *opt = NULL;
        assert_ok(ebb_optimizer_new(&opt, m, &start));
        char path[1024];
        fixture_path(path, sizeof path, cases[c]);
        assert_ok(ebb_optimizer_load(opt, path));
        assert_true(same_options(ebb_optimizer_get_options(opt), want));
        for (int i = 0; i < 4; i++) {
            char key[256];
            snprintf(key, sizeof key, "optim.%s.step", ebb_model_param_name(m, i));
            assert_int_equal(ebb_optimizer_param_step_count(opt, i), (int64_t)scalar(cst, key));
            for (int k = 0; k < N_SLOTS; k++) {
                snprintf(key, sizeof key, "optim.%s.%s", ebb_model_param_name(m, i), SLOTS[k]);
                ebb_tensor *f = maybe_load(cst, key, CPU);
                ebb_tensor *have = ebb_optimizer_state_tensor(opt, i, SLOTS[k]);
                assert_int_equal(f != NULL, have != NULL);
                if (f) assert_true(identical(have, f));
                ebb_tensor_free(f);
            }
        }
        ebb_optimizer_free(opt);
        ebb_safetensors_close(cst);
    }
    ebb_model_free(m);
    ebb_plan_free(plan);
}

/* ---- options ------------------------------------------------------------------ */

static void test_defaults(void **state) {
    (void)state;
    ebb_plan *plan = mlp_plan();
    ebb_model *m = mlp_model(plan, CPU);
    ebb_optimizer *opt = NULL;

    /* the example: zeros take torch.optim.AdamW's defaults */
    assert_ok(ebb_optimizer_new(&opt, m, &(ebb_optimizer_options){.kind = EBB_ADAMW, .lr = 1e-3}));
    ebb_optimizer_options o = ebb_optimizer_get_options(opt);
    assert_true(o.complete);
    assert_true(o.lr == 1e-3 && o.beta1 == 0.9 && o.beta2 == 0.999 && o.eps == 1e-8 &&
                o.weight_decay == 1e-2 && !o.amsgrad);
    ebb_optimizer_free(opt);

    /* Adam: lr defaults too, and weight decay stays 0 */
    assert_ok(ebb_optimizer_new(&opt, m, &(ebb_optimizer_options){.kind = EBB_ADAM}));
    o = ebb_optimizer_get_options(opt);
    assert_true(o.lr == 1e-3 && o.beta1 == 0.9 && o.beta2 == 0.999 && o.eps == 1e-8 &&
                o.weight_decay == 0);
    ebb_optimizer_free(opt);

    /* SGD: everything but lr defaults to 0 */
    assert_ok(ebb_optimizer_new(&opt, m, &(ebb_optimizer_options){.kind = EBB_SGD, .lr = 0.1}));
    o = ebb_optimizer_get_options(opt);
    assert_true(o.lr == 0.1 && o.momentum == 0 && o.dampening == 0 && !o.nesterov &&
                o.weight_decay == 0 && o.beta1 == 0 && o.eps == 0);
    ebb_optimizer_free(opt);
    /* ... and has no default learning rate, as torch.optim.SGD has none */
    assert_int_equal(ebb_optimizer_new(&opt, m, &(ebb_optimizer_options){.kind = EBB_SGD}),
                     EBB_ERR_ARG);
    assert_errmsg_contains("SGD has no default learning rate");
    assert_null(opt);

    /* a real zero, through the complete defaults */
    ebb_optimizer_options d = ebb_optimizer_defaults(EBB_ADAMW, 1e-3);
    assert_true(d.complete && d.weight_decay == 1e-2 && d.beta1 == 0.9);
    d.weight_decay = 0;
    d.beta1 = 0;
    assert_ok(ebb_optimizer_new(&opt, m, &d));
    o = ebb_optimizer_get_options(opt);
    assert_true(o.weight_decay == 0 && o.beta1 == 0 && o.beta2 == 0.999);
    /* a learning-rate schedule */
    assert_ok(ebb_optimizer_set_lr(opt, 5e-4));
    assert_true(ebb_optimizer_get_options(opt).lr == 5e-4);
    assert_int_equal(ebb_optimizer_set_lr(opt, -1), EBB_ERR_ARG);
    assert_int_equal(ebb_optimizer_set_lr(opt, NAN), EBB_ERR_ARG);
    assert_true(ebb_optimizer_get_options(opt).lr == 5e-4);
    ebb_optimizer_free(opt);

    d = ebb_optimizer_defaults(EBB_SGD, 0);
    assert_ok(ebb_optimizer_new(&opt, m, &d)); /* lr 0, asked for */
    assert_true(ebb_optimizer_get_options(opt).lr == 0);
    ebb_optimizer_free(opt);

    ebb_model_free(m);
    ebb_plan_free(plan);
}

static void test_bad_options(void **state) {
    (void)state;
    ebb_plan *plan = mlp_plan();
    ebb_model *m = mlp_model(plan, CPU);
    const struct {
        ebb_optimizer_options o;
        const char *needle;
    } bad[] = {
        {{.kind = EBB_SGD, .lr = -0.1}, "lr is -0.1"},
        {{.kind = EBB_SGD, .lr = 0.1, .momentum = -1}, "momentum is -1"},
        {{.kind = EBB_SGD, .lr = 0.1, .nesterov = 1}, "nesterov needs momentum > 0"},
        {{.kind = EBB_SGD, .lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = 1},
         "dampening 0.1"},
        {{.kind = EBB_SGD, .lr = 0.1, .beta1 = 0.9}, "beta1 is an Adam and AdamW option"},
        {{.kind = EBB_SGD, .lr = 0.1, .weight_decay = -1e-4}, "weight_decay is -0.0001"},
        {{.kind = EBB_ADAM, .beta1 = 1.0}, "beta1 is 1"},
        {{.kind = EBB_ADAM, .beta2 = -0.5}, "beta2 is -0.5"},
        {{.kind = EBB_ADAMW, .eps = -1e-8}, "eps is -1e-08"},
        {{.kind = EBB_ADAMW, .momentum = 0.9}, "momentum is an SGD option; AdamW has none"},
        {{.kind = EBB_ADAM, .lr = NAN}, "lr is nan"},
        {{.kind = EBB_ADAM, .weight_decay = INFINITY}, "weight_decay is inf"},
        {{.kind = (ebb_optimizer_kind)7, .lr = 0.1}, "unknown optimizer kind 7"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ebb_optimizer *opt = (ebb_optimizer *)&bad; /* must be cleared */
        assert_int_equal(ebb_optimizer_new(&opt, m, &bad[i].o), EBB_ERR_ARG);
        assert_null(opt);
        assert_errmsg_contains("ebb_optimizer_new");
        assert_errmsg_contains(bad[i].needle);
    }
    ebb_optimizer *opt = NULL;
    ebb_optimizer_options ok = {.kind = EBB_ADAM};
    assert_int_equal(ebb_optimizer_new(&opt, NULL, &ok), EBB_ERR_ARG);
    assert_errmsg_contains("model is NULL");
    assert_int_equal(ebb_optimizer_new(&opt, m, NULL), EBB_ERR_ARG);
    assert_int_equal(ebb_optimizer_new(NULL, m, &ok), EBB_ERR_ARG);
    ebb_optimizer_free(NULL);
    ebb_model_free(m);
    ebb_plan_free(plan);
}

/* ---- errors change nothing ------------------------------------------------------- */

/* Clones of every parameter and state tensor, and the step counts. */
typedef struct snapshot {
    ebb_tensor *params[MAX_PARAMS];
    ebb_tensor *slots[MAX_PARAMS][N_SLOTS];
    int64_t steps[MAX_PARAMS];
} snapshot;

static void take(snapshot *s, const ebb_model *m, const ebb_optimizer *opt) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < ebb_model_param_count(m); i++) {
        assert_ok(ebb_tensor_clone(&s->params[i], ebb_model_param(m, ebb_model_param_name(m, i))));
        for (int k = 0; k < N_SLOTS; k++) {
            ebb_tensor *t = ebb_optimizer_state_tensor(opt, i, SLOTS[k]);
            if (t) assert_ok(ebb_tensor_clone(&s->slots[i][k], t));
        }
        s->steps[i] = ebb_optimizer_param_step_count(opt, i);
    }
}

/* Asserts the model and optimizer are as the snapshot, and frees it. */
static void unchanged(snapshot *s, const ebb_model *m, const ebb_optimizer *opt) {
    for (int i = 0; i < ebb_model_param_count(m); i++) {
        assert_true(identical(ebb_model_param(m, ebb_model_param_name(m, i)), s->params[i]));
        for (int k = 0; k < N_SLOTS; k++) {
            ebb_tensor *t = ebb_optimizer_state_tensor(opt, i, SLOTS[k]);
            assert_int_equal(t != NULL, s->slots[i][k] != NULL);
            if (t) assert_true(identical(t, s->slots[i][k]));
            ebb_tensor_free(s->slots[i][k]);
        }
        assert_int_equal(ebb_optimizer_param_step_count(opt, i), s->steps[i]);
        ebb_tensor_free(s->params[i]);
    }
}

static void test_errors_change_nothing(void **state) {
    (void)state;
    ebb_plan *plan = mlp_plan();
    ebb_model *m = mlp_model(plan, CPU);
    ebb_safetensors *gst = open_fixture("mlp.grads");
    ebb_optimizer_options kinds[] = {
        {.kind = EBB_ADAM, .weight_decay = 0.1, .amsgrad = 1},
        {.kind = EBB_SGD, .lr = 0.1, .momentum = 0.9, .nesterov = 1, .weight_decay = 0.01},
        {.kind = EBB_RMSPROP, .momentum = 0.9, .centered = 1, .weight_decay = 0.01},
        {.kind = EBB_ADAGRAD, .lr_decay = 0.1, .initial_accumulator_value = 0.5},
        {.kind = EBB_ADADELTA, .weight_decay = 0.01}};
    for (size_t kk = 0; kk < sizeof kinds / sizeof kinds[0]; kk++) {
        ebb_optimizer *opt = NULL;
        assert_ok(ebb_optimizer_new(&opt, m, &kinds[kk]));
        ebb_tensor *grads[MAX_PARAMS] = {0};

        /* a failing first step leaves the state as the optimizer made it */
        load_grads(grads, gst, m, 1, CPU);
        ebb_tensor *good = grads[2], *wrong = NULL;
        ebb_shape ws = EBB_SHAPE(16, 4);
        assert_ok(ebb_tensor_ones(&wrong, &ws, EBB_FLOAT32, CPU));
        grads[2] = wrong;
        snapshot s;
        take(&s, m, opt);
        assert_int_equal(ebb_optimizer_step(opt, grads), EBB_ERR_SHAPE);
        assert_errmsg_contains("ebb_optimizer_step: parameter 'fc2.weight': the gradient is "
                               "float32 [16, 4], the parameter is float32 [4, 16]");
        unchanged(&s, m, opt);
        int64_t most = 0, now = ebb_optimizer_state_bytes(opt, &most);
        assert_int_equal(now, most);
        assert_true(most > 0);
        assert_int_equal(ebb_optimizer_step_count(opt), 0);
        grads[2] = good;
        assert_ok(ebb_optimizer_step(opt, grads));
        free_all(grads, 4);

        /* and a failing later update leaves parameter and state as they were */
        take(&s, m, opt);
        assert_int_equal(ebb_optimizer_update(opt, 0, wrong), EBB_ERR_SHAPE);
        assert_errmsg_contains("parameter 'fc1.weight': the gradient is float32 [16, 4], the "
                               "parameter is float32 [16, 8]");
        ebb_tensor *g64 = NULL;
        ebb_shape s16 = EBB_SHAPE(16);
        assert_ok(ebb_tensor_ones(&g64, &s16, EBB_FLOAT64, CPU));
        assert_int_equal(ebb_optimizer_update(opt, 1, g64), EBB_ERR_SHAPE);
        assert_errmsg_contains(
            "parameter 'fc1.bias': the gradient is float64 [16], the parameter is float32 [16]");
        ebb_tensor *meta = NULL;
        ebb_shape s168 = EBB_SHAPE(16, 8);
        ebb_device meta_dev = {EBB_DEVICE_META, 0};
        assert_ok(ebb_tensor_empty(&meta, &s168, EBB_FLOAT32, meta_dev));
        assert_int_equal(ebb_optimizer_update(opt, 0, meta), EBB_ERR_ARG);
        assert_errmsg_contains(
            "parameter 'fc1.weight': the gradient is on meta, the parameter on cpu");
        ebb_tensor_free(meta);
        assert_int_equal(ebb_optimizer_update(opt, 4, g64), EBB_ERR_ARG);
        assert_errmsg_contains("parameter index 4 is out of range (the model has 4 parameters)");
        assert_int_equal(ebb_optimizer_update(opt, -1, g64), EBB_ERR_ARG);
        assert_int_equal(ebb_optimizer_update(opt, 0, NULL), EBB_ERR_ARG);
        assert_errmsg_contains("grad is NULL");
        assert_int_equal(ebb_optimizer_update(NULL, 0, g64), EBB_ERR_ARG);
        assert_int_equal(ebb_optimizer_step(opt, NULL), EBB_ERR_ARG);
        unchanged(&s, m, opt);

        /* a step whose last gradient is wrong changes no parameter at all */
        load_grads(grads, gst, m, 2, CPU);
        ebb_tensor_free(grads[3]);
        grads[3] = g64;
        take(&s, m, opt);
        assert_int_equal(ebb_optimizer_step(opt, grads), EBB_ERR_SHAPE);
        assert_errmsg_contains(
            "'fc2.bias': the gradient is float64 [16], the parameter is float32 [4]");
        unchanged(&s, m, opt);
        free_all(grads, 4);
        ebb_tensor_free(wrong);
        ebb_optimizer_free(opt);
    }
    ebb_safetensors_close(gst);
    ebb_model_free(m);
    ebb_plan_free(plan);
}

/* The kernels check everything they are given before writing anything. */
static void test_kernels(void **state) {
    (void)state;
    ebb_shape s = EBB_SHAPE(3, 2), other = EBB_SHAPE(2, 3);
    ebb_tensor *p = NULL, *g = NULL, *ea = NULL, *eas = NULL, *bad = NULL, *before = NULL;
    assert_ok(ebb_tensor_randn(&p, &s, EBB_FLOAT32, CPU, 1));
    assert_ok(ebb_tensor_randn(&g, &s, EBB_FLOAT32, CPU, 2));
    assert_ok(ebb_tensor_zeros(&ea, &s, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_zeros(&eas, &s, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_zeros(&bad, &other, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_clone(&before, p));
    ebb_optimizer_options adam = ebb_optimizer_defaults(EBB_ADAM, 0.1);

    assert_int_equal(ebb_tensor_adam_update_(p, g, ea, bad, NULL, 1, &adam), EBB_ERR_SHAPE);
    assert_errmsg_contains("exp_avg_sq is float32 [2, 3] on cpu, the parameter is float32 [3, 2]");
    assert_int_equal(ebb_tensor_adam_update_(p, g, ea, eas, NULL, 0, &adam), EBB_ERR_ARG);
    assert_errmsg_contains("the first update is step 1");
    adam.amsgrad = 1;
    assert_int_equal(ebb_tensor_adam_update_(p, g, ea, eas, NULL, 1, &adam), EBB_ERR_ARG);
    assert_errmsg_contains("max_exp_avg_sq is NULL");
    assert_true(identical(p, before));
    assert_true(max_abs(ea) == 0 && max_abs(eas) == 0);

    ebb_optimizer_options sgd = ebb_optimizer_defaults(EBB_SGD, 0.1);
    sgd.momentum = 0.9;
    ebb_tensor *buf = NULL;
    assert_int_equal(ebb_tensor_sgd_update_(p, bad, &buf, &sgd), EBB_ERR_SHAPE);
    assert_errmsg_contains(
        "the gradient is float32 [2, 3] on cpu, the parameter is float32 [3, 2]");
    assert_null(buf);
    assert_int_equal(ebb_tensor_sgd_update_(p, g, NULL, &sgd), EBB_ERR_ARG);
    assert_true(identical(p, before));
    /* the first update makes the buffer, a copy of the gradient */
    assert_ok(ebb_tensor_sgd_update_(p, g, &buf, &sgd));
    assert_non_null(buf);
    assert_false(ebb_tensor_same_storage(buf, g));
    assert_true(identical(buf, g));
    assert_false(identical(p, before));

    ebb_tensor *ints = NULL;
    assert_ok(ebb_tensor_zeros(&ints, &s, EBB_INT64, CPU));
    assert_int_equal(ebb_tensor_sgd_update_(ints, ints, &buf, &sgd), EBB_ERR_ARG);
    assert_errmsg_contains("floating-point tensors only");

    ebb_tensor *all[] = {p, g, ea, eas, bad, before, buf, ints};
    free_all(all, 8);
}

/* ---- saving and loading ------------------------------------------------------------ */

static char dir[256];

static int make_dir(void **state) {
    (void)state;
    return ebb_test_dir_make(dir, sizeof dir, "optim");
}

static int remove_dir(void **state) {
    (void)state;
    return ebb_test_dir_remove(dir);
}

static void tmp_path(char *buf, size_t size, const char *file) {
    snprintf(buf, size, "%s/%s", dir, file);
}

/* Five steps, save, then the remaining five both in the original and in a
 * fresh model and optimizer that loaded the saved state: they must agree
 * bit for bit, and with torch.optim. */
static void roundtrip(const char *case_name) {
    ebb_safetensors *cst = open_fixture(case_name), *gst = open_fixture("mlp.grads");
    ebb_plan *plan = mlp_plan();
    ebb_model *a = mlp_model(plan, CPU), *b = NULL;
    ebb_optimizer_options o = case_options(cst);
    ebb_optimizer *oa = NULL, *ob = NULL;
    assert_ok(ebb_optimizer_new(&oa, a, &o));
    ebb_tensor *grads[MAX_PARAMS] = {0};
    for (int t = 0; t < STEPS / 2; t++) {
        load_grads(grads, gst, a, t, CPU);
        assert_ok(ebb_optimizer_step(oa, grads));
        free_all(grads, 4);
    }
    char opath[512], mpath[512];
    tmp_path(opath, sizeof opath, "a.safetensors");
    tmp_path(mpath, sizeof mpath, "m.safetensors");
    assert_ok(ebb_optimizer_save(oa, opath));
    assert_ok(ebb_model_save(a, mpath));

    assert_ok(ebb_model_new(&b, plan, CPU, 99));
    assert_ok(ebb_model_load(b, mpath));
    ebb_optimizer_options other = ebb_optimizer_defaults(o.kind, 0.25);
    assert_ok(ebb_optimizer_new(&ob, b, &other));
    assert_ok(ebb_optimizer_load(ob, opath));
    assert_true(same_options(ebb_optimizer_get_options(ob), o));
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ebb_optimizer_param_step_count(ob, i),
                         ebb_optimizer_param_step_count(oa, i));
        for (int k = 0; k < N_SLOTS; k++) {
            ebb_tensor *x = ebb_optimizer_state_tensor(oa, i, SLOTS[k]);
            ebb_tensor *y = ebb_optimizer_state_tensor(ob, i, SLOTS[k]);
            assert_int_equal(x != NULL, y != NULL);
            if (x) assert_true(identical(x, y));
        }
    }
    int64_t most_a = 0, most_b = 0;
    assert_int_equal(ebb_optimizer_state_bytes(ob, &most_b),
                     ebb_optimizer_state_bytes(oa, &most_a));
    assert_int_equal(most_a, most_b);

    for (int t = STEPS / 2; t < STEPS; t++) {
        load_grads(grads, gst, a, t, CPU);
        assert_ok(ebb_optimizer_step(oa, grads));
        assert_ok(ebb_optimizer_step(ob, grads));
        free_all(grads, 4);
    }
    for (int i = 0; i < 4; i++) {
        const char *pn = ebb_model_param_name(a, i);
        assert_true(identical(ebb_model_param(a, pn), ebb_model_param(b, pn)));
        char key[256];
        snprintf(key, sizeof key, "after.%d.%s", STEPS - 1, pn);
        ebb_tensor *want = maybe_load(cst, key, CPU);
        assert_true(deviation(ebb_model_param(b, pn), want, PARAM_FLOOR, NULL) <= TOL_CPU);
        ebb_tensor_free(want);
    }
    assert_int_equal(ebb_optimizer_step_count(ob), STEPS);

    ebb_optimizer_free(oa);
    ebb_optimizer_free(ob);
    ebb_model_free(a);
    ebb_model_free(b);
    ebb_plan_free(plan);
    ebb_safetensors_close(cst);
    ebb_safetensors_close(gst);
}

static void test_save_load_roundtrip(void **state) {
    (void)state;
    roundtrip("sgd_momentum");
    roundtrip("sgd_nesterov_wd");
    roundtrip("adam_amsgrad");
    roundtrip("adamw");

    /* before any update: only the options, and loading gives no state */
    ebb_plan *plan = mlp_plan();
    ebb_model *m = mlp_model(plan, CPU);
    ebb_optimizer *opt = NULL;
    assert_ok(ebb_optimizer_new(&opt, m, &(ebb_optimizer_options){.kind = EBB_ADAM}));
    char path[512];
    tmp_path(path, sizeof path, "a.safetensors");
    assert_ok(ebb_optimizer_save(opt, path));
    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, path));
    assert_int_equal(ebb_safetensors_count(st), 1);
    assert_string_equal(ebb_safetensors_name_at(st, 0), "optim.options");
    ebb_safetensors_close(st);
    assert_ok(ebb_optimizer_load(opt, path));
    /* no state in the file: zeros for every parameter, as when made */
    int64_t most = 0, now = ebb_optimizer_state_bytes(opt, &most);
    assert_int_equal(now, most);
    assert_true(most > 0);
    assert_int_equal(ebb_optimizer_step_count(opt), 0);
    ebb_optimizer_free(opt);
    ebb_model_free(m);
    ebb_plan_free(plan);
}

/* Every tensor of a file, for writing altered copies. */
typedef struct entries {
    int n;
    char *names[64];
    ebb_tensor *ts[64];
} entries;

static void read_entries(entries *e, const char *path) {
    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, path));
    e->n = ebb_safetensors_count(st);
    assert_true(e->n <= 64);
    for (int i = 0; i < e->n; i++) {
        const char *name = ebb_safetensors_name_at(st, i);
        e->names[i] = malloc(strlen(name) + 1);
        assert_non_null(e->names[i]);
        strcpy(e->names[i], name);
        assert_ok(ebb_safetensors_load(&e->ts[i], st, name, CPU));
    }
    ebb_safetensors_close(st);
}

static void free_entries(entries *e) {
    for (int i = 0; i < e->n; i++) {
        free(e->names[i]);
        ebb_tensor_free(e->ts[i]);
    }
    e->n = 0;
}

static int find_entry(const entries *e, const char *name) {
    for (int i = 0; i < e->n; i++)
        if (strcmp(e->names[i], name) == 0) return i;
    fail_msg("no entry '%s'", name);
    return -1;
}

/* Writes e to bad.safetensors without entry `skip` (-1: none), with entry
 * `swap` replaced by `with`, and with (`extra_name`, `extra`) added. */
static void write_variant(const entries *e, int skip, int swap, ebb_tensor *with,
                          const char *extra_name, ebb_tensor *extra, char *path, size_t size) {
    const char *names[66];
    ebb_tensor *ts[66];
    int n = 0;
    for (int i = 0; i < e->n; i++) {
        if (i == skip) continue;
        names[n] = e->names[i];
        ts[n++] = i == swap ? with : e->ts[i];
    }
    if (extra_name) {
        names[n] = extra_name;
        ts[n++] = extra;
    }
    tmp_path(path, size, "bad.safetensors");
    assert_ok(ebb_safetensors_write(path, names, ts, n));
}

static void test_load_errors(void **state) {
    (void)state;
    ebb_plan *plan = mlp_plan();
    ebb_model *m = mlp_model(plan, CPU);
    ebb_safetensors *gst = open_fixture("mlp.grads");
    ebb_optimizer *opt = NULL, *sgd = NULL;
    assert_ok(ebb_optimizer_new(&opt, m, &(ebb_optimizer_options){.kind = EBB_ADAM}));
    ebb_tensor *grads[MAX_PARAMS] = {0};
    for (int t = 0; t < 3; t++) {
        load_grads(grads, gst, m, t, CPU);
        assert_ok(ebb_optimizer_step(opt, grads));
        free_all(grads, 4);
    }
    char good[512], bad[512];
    tmp_path(good, sizeof good, "b.safetensors");
    assert_ok(ebb_optimizer_save(opt, good));
    entries e;
    read_entries(&e, good);
    /* 4 parameters x (exp_avg, exp_avg_sq, step) + options */
    assert_int_equal(e.n, 13);

    /* a different state to load over: more steps, other options */
    load_grads(grads, gst, m, 3, CPU);
    assert_ok(ebb_optimizer_step(opt, grads));
    free_all(grads, 4);
    assert_ok(ebb_optimizer_set_lr(opt, 0.125));

    /* the model's parameters in the same file are fine */
    ebb_tensor *w = ebb_model_param(m, "fc1.weight");
    write_variant(&e, -1, -1, NULL, "fc1.weight", w, bad, sizeof bad);
    assert_ok(ebb_optimizer_load(opt, bad));
    assert_int_equal(ebb_optimizer_step_count(opt), 3);
    assert_int_equal(ebb_optimizer_param_step_count(opt, 1), 2); /* fc1.bias starts at step 1 */
    assert_true(ebb_optimizer_get_options(opt).lr == 1e-3);
    /* and so is a step stored as float32, as torch.optim keeps it */
    ebb_tensor *step32 = NULL;
    ebb_shape scalar_shape = {0, {0}};
    assert_ok(ebb_tensor_full(&step32, &scalar_shape, 7, EBB_FLOAT32, CPU));
    write_variant(&e, -1, find_entry(&e, "optim.fc1.bias.step"), step32, NULL, NULL, bad,
                  sizeof bad);
    ebb_tensor_free(step32);
    assert_ok(ebb_optimizer_load(opt, bad));
    assert_int_equal(ebb_optimizer_param_step_count(opt, 1), 7);

    load_grads(grads, gst, m, 3, CPU);
    assert_ok(ebb_optimizer_step(opt, grads));
    free_all(grads, 4);
    assert_ok(ebb_optimizer_set_lr(opt, 0.125));
    snapshot s;

    struct {
        int skip, swap;
        const char *extra_name;
        ebb_status status;
        const char *needle;
    } cases[] = {
        {find_entry(&e, "optim.fc1.bias.exp_avg_sq"), -1, NULL, EBB_ERR_ARG,
         "'optim.fc1.bias.exp_avg_sq' is missing (the file has 'optim.fc1.bias.step')"},
        {find_entry(&e, "optim.fc2.weight.step"), -1, NULL, EBB_ERR_ARG,
         "'optim.fc2.weight.step' is missing"},
        {find_entry(&e, "optim.options"), -1, NULL, EBB_ERR_ARG, "no 'optim.options' tensor"},
        {-1, find_entry(&e, "optim.fc2.weight.exp_avg"), NULL, EBB_ERR_SHAPE,
         "'optim.fc2.weight.exp_avg' is float32 [16, 4] in the file, the parameter is float32 [4, "
         "16]"},
        {-1, -1, "optim.fc3.weight.exp_avg", EBB_ERR_ARG,
         "unexpected tensor 'optim.fc3.weight.exp_avg'"},
        {-1, -1, "optim.fc1.weight.momentum_buffer", EBB_ERR_ARG,
         "unexpected tensor 'optim.fc1.weight.momentum_buffer' (the model has no such parameter, "
         "or Adam keeps no such state)"},
        {-1, find_entry(&e, "optim.fc1.bias.step"), NULL, EBB_ERR_ARG,
         "'optim.fc1.bias.step' is 2.5; a step is a whole number >= 0"},
    };
    ebb_tensor *wrong = NULL, *frac = NULL;
    ebb_shape ws = EBB_SHAPE(16, 4);
    assert_ok(ebb_tensor_zeros(&wrong, &ws, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_full(&frac, &scalar_shape, 2.5, EBB_FLOAT64, CPU));
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ebb_tensor *with = c == sizeof cases / sizeof cases[0] - 1 ? frac : wrong;
        write_variant(&e, cases[c].skip, cases[c].swap, with, cases[c].extra_name, wrong, bad,
                      sizeof bad);
        take(&s, m, opt);
        assert_int_equal(ebb_optimizer_load(opt, bad), cases[c].status);
        assert_errmsg_contains("ebb_optimizer_load");
        assert_errmsg_contains(bad);
        assert_errmsg_contains(cases[c].needle);
        unchanged(&s, m, opt);
        assert_true(ebb_optimizer_get_options(opt).lr == 0.125);
    }

    /* another kind's state */
    assert_ok(ebb_optimizer_new(&sgd, m, &(ebb_optimizer_options){.kind = EBB_SGD, .lr = 0.1}));
    take(&s, m, sgd);
    assert_int_equal(ebb_optimizer_load(sgd, good), EBB_ERR_ARG);
    assert_errmsg_contains("the file holds Adam state; this optimizer is SGD");
    unchanged(&s, m, sgd);
    /* a file that is not there */
    assert_int_equal(ebb_optimizer_load(sgd, "/nonexistent/optim.safetensors"), EBB_ERR_IO);
    assert_int_equal(ebb_optimizer_load(sgd, NULL), EBB_ERR_ARG);
    assert_int_equal(ebb_optimizer_save(NULL, good), EBB_ERR_ARG);

    ebb_tensor_free(wrong);
    ebb_tensor_free(frac);
    free_entries(&e);
    ebb_optimizer_free(opt);
    ebb_optimizer_free(sgd);
    ebb_safetensors_close(gst);
    ebb_model_free(m);
    ebb_plan_free(plan);
}

/* ---- bytes ----------------------------------------------------------------------- */

/* The state the optimizer reports is the state the allocator sees, all of it
 * made with the optimizer (no update allocates state), and the scratch it
 * predicts for an update is what the update allocates on top of that, to the
 * byte (on the CPU, where the allocator counts exactly). */
static void test_state_bytes(void **state) {
    (void)state;
    ebb_plan *plan = mlp_plan();
    ebb_model *m = mlp_model(plan, CPU);
    ebb_safetensors *gst = open_fixture("mlp.grads");
    const int64_t param_bytes = (16 * 8 + 16 + 4 * 16 + 4) * 4; /* 848 */
    const int64_t w1 = 16 * 8 * 4, scalar = 8 + 4; /* fc1.weight; a wrapped float32 Scalar */
    /* Adam's operands, made before its first write: beta1, beta2, the bias
     * correction and eps, and AdamW's decay factor, 4 bytes each */
    const int64_t adam = 4 * 4, adamw = 5 * 4;
    const struct {
        ebb_optimizer_options o;
        int slots;
        int64_t first, later; /* scratch of fc1.weight's first and later updates */
    } cases[] = {
        {{.kind = EBB_SGD, .lr = 0.1}, 0, 0, 0},
        {{.kind = EBB_SGD, .lr = 0.1, .weight_decay = 0.1}, 0, w1, w1},
        {{.kind = EBB_SGD, .lr = 0.1, .momentum = 0.9}, 1, 0, scalar},
        {{.kind = EBB_SGD, .lr = 0.1, .momentum = 0.9, .nesterov = 1}, 1, w1, w1 + scalar},
        {{.kind = EBB_SGD, .lr = 0.1, .momentum = 0.9, .weight_decay = 0.1}, 1, 0, w1 + scalar},
        {{.kind = EBB_ADAM}, 2, w1 + adam, w1 + adam},
        {{.kind = EBB_ADAM, .weight_decay = 0.1}, 2, w1 + adam, w1 + adam},
        {{.kind = EBB_ADAMW, .amsgrad = 1}, 3, w1 + adamw, w1 + adamw},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ebb_optimizer *opt = NULL;
        int64_t made = ebb_memory_current(CPU);
        assert_ok(ebb_optimizer_new(&opt, m, &cases[c].o));
        made = ebb_memory_current(CPU) - made;
        int64_t most = -1;
        assert_int_equal(ebb_optimizer_state_bytes(opt, &most), cases[c].slots * param_bytes);
        assert_int_equal(most, cases[c].slots * param_bytes);
        assert_int_equal(made, most);
        assert_int_equal(ebb_optimizer_scratch_bytes(opt, 0), cases[c].first);
        assert_int_equal(ebb_optimizer_scratch_bytes(opt, 4), -1);
        assert_int_equal(ebb_optimizer_scratch_bytes(NULL, 0), -1);

        ebb_tensor *grads[MAX_PARAMS] = {0};
        for (int t = 0; t < 3; t++) {
            load_grads(grads, gst, m, t, CPU);
            for (int i = 0; i < 4; i++) {
                if (!grads[i]) continue;
                int64_t state_before = ebb_optimizer_state_bytes(opt, NULL);
                int64_t scratch = ebb_optimizer_scratch_bytes(opt, i);
                int64_t before = ebb_memory_current(CPU);
                ebb_memory_reset_peak(CPU);
                assert_ok(ebb_optimizer_update(opt, i, grads[i]));
                ebb_memory_stats ms;
                assert_ok(ebb_memory_stats_get(CPU, &ms));
                /* an update keeps nothing: its state was made with the optimizer */
                assert_int_equal(ebb_optimizer_state_bytes(opt, NULL), state_before);
                assert_int_equal(ms.current_bytes, before);
                assert_int_equal(ms.peak_bytes - before, scratch);
            }
            free_all(grads, 4);
        }
        assert_int_equal(ebb_optimizer_scratch_bytes(opt, 0), cases[c].later);
        assert_int_equal(ebb_optimizer_state_bytes(opt, &most), most);
        ebb_optimizer_free(opt);
    }
    ebb_safetensors_close(gst);
    ebb_model_free(m);
    ebb_plan_free(plan);
}

#define PARITY(name)                                                                               \
    cmocka_unit_test_prestate_setup_teardown(test_parity, ebb_test_setup, ebb_test_teardown,       \
                                             (void *)name)

/* ---- learning-rate schedules ------------------------------------------------------------- */

/* Every schedule of tests/parity/fixtures/lr_schedules.safetensors (torch
 * 1.13's rates for 100 steps from lr 0.1, named by the schedule's text
 * form): parsed, printed and parsed back to the same schedule, its rates
 * equal to PyTorch's within 1e-12 relative at every step, and a scheduler
 * restored halfway (as from a checkpoint) continuing to the same bits. */
static void test_lr_schedules(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/parity/fixtures/lr_schedules.safetensors",
             EBB_SOURCE_DIR);
    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, path));
    ebb_plan *plan = mlp_plan();
    ebb_model *m = mlp_model(plan, CPU);
    int n = ebb_safetensors_count(st);
    assert_true(n >= 10);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        const char *text = ebb_safetensors_name_at(st, i);
        ebb_tensor *want_t = NULL;
        assert_ok(ebb_safetensors_load(&want_t, st, text, CPU));
        int64_t steps = ebb_tensor_numel(want_t);
        double *want = malloc((size_t)steps * sizeof *want);
        assert_non_null(want);
        assert_ok(ebb_tensor_to_host(want_t, want, (size_t)steps * sizeof *want));
        ebb_tensor_free(want_t);

        ebb_lr_schedule sc, back;
        char again[256];
        assert_ok(ebb_lr_schedule_parse(&sc, text));
        assert_ok(ebb_lr_schedule_parse(&back, ebb_lr_schedule_str(&sc, again, sizeof again)));
        if (memcmp(&sc, &back, sizeof sc) != 0)
            fail_msg("%s: printed as %s, which parses to another schedule", text, again);

        ebb_optimizer_options oo = ebb_optimizer_defaults(EBB_SGD, 0.1);
        ebb_optimizer *opt = NULL, *opt2 = NULL;
        assert_ok(ebb_optimizer_new(&opt, m, &oo));
        assert_ok(ebb_optimizer_new(&opt2, m, &oo));
        ebb_lr_scheduler *r = NULL, *r2 = NULL;
        assert_ok(ebb_lr_scheduler_new(&r, opt, &sc));
        assert_ok(ebb_lr_scheduler_new(&r2, opt2, &sc));
        for (int64_t t = 0; t < steps; t++) {
            double got = ebb_optimizer_get_options(opt).lr;
            assert_true(got == ebb_lr_scheduler_lr(r));
            double d = fabs(got - want[t]) / fmax(fabs(want[t]), 1e-300);
            if (want[t] == 0.0)
                d = fabs(got);
            if (!(d <= 1e-12))
                fail_msg("%s: step %lld: rate %.17g, torch %.17g", text, (long long)t, got,
                         want[t]);
            worst = fmax(worst, d);
            if (t == steps / 2) /* a checkpoint: the second scheduler resumes here */
                assert_ok(ebb_lr_scheduler_restore(r2, ebb_lr_scheduler_steps(r),
                                                   ebb_lr_scheduler_lr(r),
                                                   ebb_lr_scheduler_base_lr(r)));
            if (t >= steps / 2 && ebb_lr_scheduler_lr(r2) != got)
                fail_msg("%s: step %lld: restored scheduler gives %.17g, the first %.17g", text,
                         (long long)t, ebb_lr_scheduler_lr(r2), got);
            if (t + 1 < steps) {
                assert_ok(ebb_lr_scheduler_step(r));
                if (t >= steps / 2)
                    assert_ok(ebb_lr_scheduler_step(r2));
            }
        }
        ebb_lr_scheduler_free(r);
        ebb_lr_scheduler_free(r2);
        ebb_optimizer_free(opt);
        ebb_optimizer_free(opt2);
        free(want);
    }
    print_message("%d schedules, 100 steps each: largest deviation from torch %.2e relative\n", n,
                  worst);

    /* what is refused, and how */
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"cosin:10", "unknown kind 'cosin'; did you mean 'cosine'? (cosine:T_MAX[:ETA_MIN])"},
        {"sawtooth", "unknown kind 'sawtooth' (one of constant, step, multistep"},
        {"step:0", "SIZE must be a whole number of steps >= 1"},
        {"step:ten", "SIZE must be a whole number of steps >= 1"},
        {"exponential", "takes one number, the factor per step"},
        {"multistep:", "no milestones"},
        {"onecycle:0.1", "takes the peak rate and the total steps"},
        {"constant:3", "takes no fields"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ebb_lr_schedule sc;
        assert_int_equal(ebb_lr_schedule_parse(&sc, bad[i].text), EBB_ERR_ARG);
        assert_errmsg_contains(bad[i].msg);
    }
    /* parsed but refused by the scheduler, as PyTorch's constructors refuse */
    ebb_optimizer_options oo = ebb_optimizer_defaults(EBB_SGD, 0.1);
    ebb_optimizer *opt = NULL;
    assert_ok(ebb_optimizer_new(&opt, m, &oo));
    ebb_lr_scheduler *r = NULL;
    ebb_lr_schedule sc;
    assert_ok(ebb_lr_schedule_parse(&sc, "multistep:30,10"));
    assert_int_equal(ebb_lr_scheduler_new(&r, opt, &sc), EBB_ERR_ARG);
    assert_errmsg_contains("the milestones must increase");
    assert_null(r);
    assert_ok(ebb_lr_schedule_parse(&sc, "linear:5:1.5"));
    assert_int_equal(ebb_lr_scheduler_new(&r, opt, &sc), EBB_ERR_ARG);
    assert_errmsg_contains("the start factor must be in (0, 1]");
    /* one-cycle ends: a step past it is refused and changes nothing */
    assert_ok(ebb_lr_schedule_parse(&sc, "onecycle:0.5:3"));
    assert_ok(ebb_lr_scheduler_new(&r, opt, &sc));
    for (int k = 0; k < 3; k++)
        assert_ok(ebb_lr_scheduler_step(r));
    double lr = ebb_optimizer_get_options(opt).lr;
    assert_int_equal(ebb_lr_scheduler_step(r), EBB_ERR_ARG);
    assert_errmsg_contains("one-cycle schedule of 3 steps stepped 5 times");
    assert_true(ebb_optimizer_get_options(opt).lr == lr);
    ebb_lr_scheduler_free(r);
    ebb_optimizer_free(opt);
    ebb_model_free(m);
    ebb_plan_free(plan);
    ebb_safetensors_close(st);
}

/* One tensor for two parameters' gradients (lstm_cell's biases): clipping
 * by the norm counts it twice, as torch's two .grad tensors would count,
 * but scales it once; unscaling divides it once. */
static void test_shared_gradient_scaled_once(void **state) {
    (void)state;
    const float v[2] = {3, 4};
    ebb_shape sh = {1, {2}};
    ebb_tensor *g = NULL;
    assert_int_equal(ebb_tensor_from_host(&g, v, sizeof v, &sh, EBB_FLOAT32, CPU), EBB_OK);
    ebb_tensor *both[2] = {g, g};
    double total = 0;
    assert_int_equal(ebb_tensor_clip_grad_norm_(both, 2, 1.0, &total), EBB_OK);
    float got[2];
    assert_int_equal(ebb_tensor_to_host(g, got, sizeof got), EBB_OK);
    double f = 1.0 / (sqrt(50.0) + 1e-6);
    assert_true(fabs(total - sqrt(50.0)) < 1e-5);
    assert_true(fabs(got[0] - 3 * f) < 1e-6 && fabs(got[1] - 4 * f) < 1e-6);
    int found = 1;
    assert_int_equal(ebb_tensor_unscale_(both, 2, 0.5, &found), EBB_OK);
    assert_int_equal(ebb_tensor_to_host(g, got, sizeof got), EBB_OK);
    assert_int_equal(found, 0);
    assert_true(fabs(got[0] - 1.5 * f) < 1e-6 && fabs(got[1] - 2 * f) < 1e-6);
    ebb_tensor_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        PARITY("sgd"),
        PARITY("sgd_momentum"),
        PARITY("sgd_nesterov_wd"),
        PARITY("sgd_dampening_wd"),
        PARITY("adam_wd"),
        PARITY("adam_amsgrad"),
        PARITY("adamw"),
        PARITY("adamw_amsgrad"),
        PARITY("rmsprop"),
        PARITY("rmsprop_centered_momentum"),
        PARITY("adagrad"),
        PARITY("adagrad_decay"),
        PARITY("adadelta"),
        PARITY("adadelta_wd"),
        EBB_TEST(test_load_torch_state),
        EBB_TEST(test_defaults),
        EBB_TEST(test_bad_options),
        EBB_TEST(test_errors_change_nothing),
        EBB_TEST(test_kernels),
        EBB_TEST(test_save_load_roundtrip),
        EBB_TEST(test_load_errors),
        EBB_TEST(test_state_bytes),
        EBB_TEST(test_lr_schedules),
        EBB_TEST(test_shared_gradient_scaled_once),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
