/* Numerical parity with PyTorch. For each reference model,
 * tests/parity/make_fixtures.py built the same network in plain PyTorch and
 * saved its weights, an input and PyTorch's output under
 * tests/parity/fixtures/; here specs/parity/<model>.yaml is compiled for the
 * input's shape, the weights are loaded by name (which must match exactly),
 * the plan is run and its output compared with PyTorch's. A model whose
 * weights name a spec in their metadata ("spec", relative to the source tree,
 * and "params" as `ebb plan -p` takes them, comma-separated) runs that spec
 * of specs/ at that size instead: resnet18 is specs/resnet18.yaml.
 *
 * The error measure is relative to the output's scale:
 *     rel = max_i |ebb_i - torch_i| / max_i |torch_i|
 * and must be <= 1e-5 for float32. */
#include <math.h>

#include "test_util.h"

#define PARITY_RTOL 1e-5

static const ebb_device CPU = {EBB_DEVICE_CPU, 0};

typedef struct parity_model {
    const char *name;
    /* assert measured peak <= planned peak: the model's ops allocate nothing
     * but their outputs (measured == planned), or a switch over-predicts.
     * Models whose ops keep internal temporaries only report both figures. */
    int peak_bounded;
    /* for a switch: at least this many branches must receive rows */
    int min_branches;
} parity_model;

/* Counts the branches a run entered (ENTER steps that did not jump). */
static void count_entered(const ebb_trace_event *ev, void *user) {
    if (ev->info->kind == EBB_STEP_ENTER && !ev->jumped) (*(int *)user)++;
}

static void fixture_path(char *buf, size_t size, const char *model, const char *kind) {
    snprintf(buf, size, "%s/tests/parity/fixtures/%s.%s.safetensors", EBB_SOURCE_DIR, model, kind);
}

/* The one tensor `name` of a fixture file, as a new CPU tensor. */
static ebb_tensor *load_fixture(const char *model, const char *kind, const char *name) {
    char path[1024];
    fixture_path(path, sizeof path, model, kind);
    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, path));
    ebb_tensor *t = NULL;
    ebb_status s = ebb_safetensors_load(&t, st, name, CPU);
    ebb_safetensors_close(st);
    if (s != EBB_OK) fail_msg("%s: %s", path, ebb_errmsg());
    return t;
}

/* max |a - b| / max |b| over float32 tensors of the same shape. */
static double rel_error(const ebb_tensor *a, const ebb_tensor *b, double *max_abs) {
    ebb_shape sa = ebb_tensor_shape(a), sb = ebb_tensor_shape(b);
    if (!ebb_shape_equal(&sa, &sb)) {
        char ba[128], bb[128];
        fail_msg("output shape %s, expected %s", ebb_shape_str(&sa, ba, sizeof ba),
                 ebb_shape_str(&sb, bb, sizeof bb));
    }
    assert_int_equal(ebb_tensor_dtype(a), EBB_FLOAT32);
    assert_int_equal(ebb_tensor_dtype(b), EBB_FLOAT32);
    size_t n = (size_t)ebb_tensor_numel(a);
    float *ha = malloc(n * sizeof *ha), *hb = malloc(n * sizeof *hb);
    assert_non_null(ha);
    assert_non_null(hb);
    assert_ok(ebb_tensor_to_host(a, ha, n * sizeof *ha));
    assert_ok(ebb_tensor_to_host(b, hb, n * sizeof *hb));
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)ha[i] - (double)hb[i]);
        if (!(d <= diff)) /* also catches NaN */
            diff = d;
        if (fabs((double)hb[i]) > scale) scale = fabs((double)hb[i]);
    }
    free(ha);
    free(hb);
    assert_true(scale > 0);
    *max_abs = diff;
    return diff / scale;
}

/* The model's spec: the one its weights' metadata names, at the params it
 * names, or specs/parity/<model>.yaml. */
static ebb_spec *load_model_spec(const char *model, const char *weights) {
    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, weights));
    const char *spec_file = ebb_safetensors_metadata(st, "spec");
    const char *params = ebb_safetensors_metadata(st, "params");
    char path[1024], text[512] = "";
    const char *p[16];
    int n = 0;
    if (spec_file)
        snprintf(path, sizeof path, "%s/%s", EBB_SOURCE_DIR, spec_file);
    else
        snprintf(path, sizeof path, "%s/specs/parity/%s.yaml", EBB_SOURCE_DIR, model);
    if (params) {
        snprintf(text, sizeof text, "%s", params);
        for (char *tok = strtok(text, ","); tok && n < 16; tok = strtok(NULL, ","))
            p[n++] = tok;
    }
    ebb_safetensors_close(st);
    ebb_spec_options so = {.params = p, .n_params = n};
    ebb_spec *spec = NULL;
    if (ebb_spec_load_ex(&spec, path, &so) != EBB_OK)
        fail_msg("%s: %s", path, ebb_errmsg());
    return spec;
}

static void run_parity(const parity_model *pm) {
    char weights[1024];
    fixture_path(weights, sizeof weights, pm->name, "weights");

    ebb_spec *spec = load_model_spec(pm->name, weights);
    assert_int_equal(ebb_spec_input_count(spec), 1);

    /* compile for the fixture's input shape */
    ebb_tensor *x = load_fixture(pm->name, "input", ebb_spec_input_name(spec, 0));
    ebb_shape shape = ebb_tensor_shape(x);
    ebb_compile_options o = {.input_shapes = &shape, .n_input_shapes = 1};
    ebb_plan *plan = NULL;
    assert_ok(ebb_spec_compile(&plan, spec, &o));

    /* on the device under test (EBB_TEST_DEVICE), CPU by default */
    ebb_device dev = ebb_test_device();
    if (dev.type != EBB_DEVICE_CPU) {
        ebb_tensor *xd = NULL;
        assert_ok(ebb_tensor_to(&xd, x, dev, ebb_tensor_dtype(x)));
        ebb_tensor_free(x);
        x = xd;
    }
    double rtol = dev.type == EBB_DEVICE_CPU ? PARITY_RTOL : 1e-4;

    /* the weights must name every parameter, with its shape, and nothing else */
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, plan, dev, 0));
    assert_ok(ebb_model_load(m, weights));
    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, weights));
    assert_int_equal(ebb_safetensors_count(st), ebb_model_param_count(m));
    ebb_safetensors_close(st);

    ebb_tensor *y = NULL;
    ebb_run_stats stats;
    assert_int_equal(ebb_plan_output_count(plan), 1);
    int entered = 0;
    ebb_run_options ro = {.trace = count_entered, .trace_user = &entered};
    assert_ok(ebb_spec_annotate_error(spec, ebb_run_ex(plan, m, &x, &y, &ro, &stats)));

    ebb_tensor *expected = load_fixture(pm->name, "expected", "y");
    double max_abs = 0, rel = rel_error(y, expected, &max_abs);
    char sb[128];
    ebb_shape ys = ebb_tensor_shape(y);
    printf("[ parity   ] %-20s y %-12s rel. error %.3e (max |diff| %.3e); peak bytes measured "
           "%lld, planned %lld",
           pm->name, ebb_shape_str(&ys, sb, sizeof sb), rel, max_abs,
           (long long)stats.measured_peak_bytes, (long long)stats.planned_peak_bytes);
    if (pm->min_branches) printf("; %d branches entered", entered);
    printf("\n");

    int64_t measured = stats.measured_peak_bytes, planned = stats.planned_peak_bytes;
    ebb_tensor_free(expected);
    ebb_tensor_free(y);
    ebb_tensor_free(x);
    ebb_model_free(m);
    ebb_plan_free(plan);
    ebb_spec_free(spec);

    if (!(rel <= rtol)) fail_msg("%s: relative error %g > %g", pm->name, rel, rtol);
    assert_true(planned > 0);
    if (entered < pm->min_branches)
        fail_msg("%s: the input reached %d branch(es), fewer than %d", pm->name, entered,
                 pm->min_branches);
    if (pm->peak_bounded && measured > planned)
        fail_msg("%s: measured peak %lld > planned %lld", pm->name, (long long)measured,
                 (long long)planned);
}

static void test_mlp(void **state) {
    (void)state;
    run_parity(&(parity_model){.name = "mlp", .peak_bounded = 1});
}

static void test_residual_tower(void **state) {
    (void)state;
    /* layer_norm's mean and rstd are its declared workspace */
    run_parity(&(parity_model){.name = "residual_tower", .peak_bounded = 1});
}

static void test_gate8(void **state) {
    (void)state;
    run_parity(&(parity_model){.name = "gate8", .peak_bounded = 1});
}

static void test_conv_net(void **state) {
    (void)state;
    /* conv2d's working buffer and max_pool2d's indices are declared workspace */
    run_parity(&(parity_model){.name = "conv_net", .peak_bounded = 1});
}

static void test_transformer_encoder(void **state) {
    (void)state;
    /* attention's q, k, v, scores and heads are its declared workspace */
    run_parity(&(parity_model){.name = "transformer_encoder", .peak_bounded = 1});
}

/* PyTorch's nn.TransformerEncoder (4 layers): its own state_dict keys load
 * into a spec whose `repeat` names the copies "layers.{i}". */
static void test_transformer_stack(void **state) {
    (void)state;
    run_parity(&(parity_model){.name = "transformer_stack", .peak_bounded = 1});
}

static void test_gru_loop(void **state) {
    (void)state;
    /* the cell's gate pre-activations are its declared workspace */
    run_parity(&(parity_model){.name = "gru_loop", .peak_bounded = 1});
}

static void test_switch_routed(void **state) {
    (void)state;
    /* the plan assumes every branch sees every row, so it over-predicts */
    run_parity(&(parity_model){.name = "switch_routed", .peak_bounded = 1, .min_branches = 2});
}

/* torchvision's ResNet-18 (specs/resnet18.yaml, at planes=4 and classes=10):
 * the state_dict of a torchvision-named model, num_batches_tracked included,
 * loads with nothing missing or extra, and eval-mode batch norms read their
 * running statistics. */
static void test_resnet18(void **state) {
    (void)state;
    /* conv2d's working buffer and max_pool2d's indices are declared workspace */
    run_parity(&(parity_model){.name = "resnet18", .peak_bounded = 1});
}

/* The fixtures are strict: weights saved for one model do not load into
 * another, and the error names a tensor and the file. */
static void test_wrong_weights_refused(void **state) {
    (void)state;
    char spec_path[1024], weights[1024];
    snprintf(spec_path, sizeof spec_path, "%s/specs/parity/residual_tower.yaml", EBB_SOURCE_DIR);
    fixture_path(weights, sizeof weights, "mlp", "weights");
    ebb_spec *spec = NULL;
    assert_ok(ebb_spec_load(&spec, spec_path));
    ebb_plan *plan = NULL;
    assert_ok(ebb_spec_compile(&plan, spec, NULL));
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, plan, CPU, 0));
    ebb_status s = ebb_model_load(m, weights);
    assert_int_not_equal(s, EBB_OK);
    assert_errmsg_contains("mlp.weights.safetensors");
    assert_errmsg_contains("stem.weight");
    ebb_model_free(m);
    ebb_plan_free(plan);
    ebb_spec_free(spec);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        EBB_TEST(test_mlp),           EBB_TEST(test_residual_tower),        EBB_TEST(test_gate8),
        EBB_TEST(test_conv_net),      EBB_TEST(test_transformer_encoder), EBB_TEST(test_transformer_stack),   EBB_TEST(test_gru_loop),
        EBB_TEST(test_switch_routed), EBB_TEST(test_resnet18),
        EBB_TEST(test_wrong_weights_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
