/* Generation through a key/value cache (ebb_compile_options.kv_cache,
 * ebb_kv_cache): for every spec in specs/ with causal attention, a plan for
 * the prompt and a plan for one next token, sharing one cache, give the
 * scores the plan without a cache gives for the whole sequence, position by
 * position; every run stays within its plan's figures; the cache's bytes
 * are what grouped-query attention needs ([B, kv_heads, C, D], not the
 * repeated heads); and every misuse is refused, naming what is wrong. */
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <math.h>

#include "test_util.h"

static const ebb_device CPU = {EBB_DEVICE_CPU, 0};

/* A language model from specs/, small. */
typedef struct lm_case {
    const char *spec;
    const char *params[4];
    int n_params;
    int64_t vocab, layers, kv_heads, head_dim;
} lm_case;

static const lm_case lms[] = {
    {"gpt.yaml", {"layers=2", "d=32", "heads=4", "block=16"}, 4, 256, 2, 4, 8},
    {"llama.yaml", {"layers=2", "d=32", "heads=4", "kv_heads=2"}, 4, 256, 2, 2, 8},
    {"llama.yaml", {"layers=1", "d=32", "heads=2", "kv_heads=2"}, 4, 256, 1, 2, 16},
};

#define SEQ 12    /* positions generated in all */
#define PROMPT 5  /* of them the prompt's */
#define BATCH 2

static ebb_spec *load_lm(const lm_case *c) {
    char path[512];
    snprintf(path, sizeof path, "%s/specs/%s", EBB_SOURCE_DIR, c->spec);
    ebb_spec_options o = {.params = c->params, .n_params = c->n_params};
    ebb_spec *s = NULL;
    assert_ok(ebb_spec_load_ex(&s, path, &o));
    return s;
}

static ebb_plan *compile_lm(const ebb_spec *s, int64_t t, int64_t kv) {
    ebb_shape shape = EBB_SHAPE(BATCH, t);
    ebb_compile_options co = {.input_shapes = &shape, .n_input_shapes = 1, .kv_cache = kv};
    ebb_plan *p = NULL;
    assert_ok(ebb_spec_compile(&p, s, &co));
    return p;
}

/* Tokens [BATCH, n] from column `from` of the sequence, as an input. */
static ebb_tensor *tokens(const int64_t *seq, int from, int n) {
    int64_t buf[BATCH * SEQ];
    for (int b = 0; b < BATCH; b++)
        for (int j = 0; j < n; j++)
            buf[b * n + j] = seq[b * SEQ + from + j];
    ebb_tensor *t = NULL;
    assert_ok(ebb_tensor_zeros(&t, &EBB_SHAPE(BATCH, n), EBB_INT64, CPU));
    assert_ok(ebb_tensor_copy_from_host(t, buf, sizeof(int64_t) * BATCH * (size_t)n));
    return t;
}

/* The scores [BATCH, n, V] on the host, as float64. */
static double *scores(const ebb_tensor *y, int64_t n, int64_t v) {
    double *h = malloc(sizeof *h * (size_t)(BATCH * n * v));
    ebb_tensor *d = NULL;
    assert_ok(ebb_tensor_to(&d, y, CPU, EBB_FLOAT64));
    assert_ok(ebb_tensor_to_host(d, h, sizeof *h * (size_t)(BATCH * n * v)));
    ebb_tensor_free(d);
    return h;
}

static void run_checked(const ebb_plan *p, const ebb_model *m, ebb_tensor *x, ebb_tensor **y,
                        ebb_kv_cache *kv) {
    ebb_run_options ro = {.kv_cache = kv};
    ebb_run_stats st;
    assert_ok(ebb_run_ex(p, m, &x, y, &ro, &st));
    /* every step within its figure, and the run within the plan's peak */
    if (st.over_step >= 0)
        fail_msg("plan %s: step %d measured %lld bytes over its figure", ebb_plan_name(p),
                 st.over_step, (long long)st.over_bytes);
    assert_true(st.measured_peak_bytes <= st.planned_peak_bytes);
}

/* The largest difference between the cached scores at position `at` (row
 * `row` of y's [BATCH, rows, V]) and the full run's, over its largest
 * score, for both sequences; and whether the highest score is the same. */
static double compare_at(const double *full, const double *y, int64_t rows, int64_t row, int at,
                         int64_t v, int *same_argmax) {
    double worst = 0;
    *same_argmax = 1;
    for (int b = 0; b < BATCH; b++) {
        const double *f = full + ((int64_t)b * SEQ + at) * v, *g = y + (b * rows + row) * v;
        double big = 1e-30;
        int af = 0, ag = 0;
        for (int64_t i = 0; i < v; i++) {
            big = fmax(big, fabs(f[i]));
            if (f[i] > f[af]) af = (int)i;
            if (g[i] > g[ag]) ag = (int)i;
        }
        for (int64_t i = 0; i < v; i++)
            worst = fmax(worst, fabs(f[i] - g[i]) / big);
        *same_argmax &= af == ag;
    }
    return worst;
}

/* float32 scores through a few layers: the cached attention reads the same
 * keys by other calls (a shorter product, another blocking), so the scores
 * agree to float32's roundoff over the reductions, not to the bit. */
#define SCORE_TOL 1e-5

static void test_cache_matches_full_sequence(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof lms / sizeof *lms; k++) {
        const lm_case *c = &lms[k];
        ebb_spec *s = load_lm(c);
        ebb_plan *full = compile_lm(s, SEQ, 0);
        ebb_plan *prompt = compile_lm(s, PROMPT, SEQ), *next = compile_lm(s, 1, SEQ);
        ebb_model *m = NULL;
        assert_ok(ebb_model_new(&m, full, CPU, 7 + k));
        int64_t seq[BATCH * SEQ];
        for (int i = 0; i < BATCH * SEQ; i++)
            seq[i] = (i * 37 + 11) % c->vocab;

        /* the cache: keys and values per layer at their own head count */
        int64_t want = 2 * c->layers * BATCH * c->kv_heads * SEQ * c->head_dim * 4;
        assert_int_equal(ebb_plan_kv_cache_bytes(prompt), want);
        assert_int_equal(ebb_plan_kv_cache_bytes(next), want);
        assert_int_equal(ebb_plan_kv_cache_length(next), SEQ);
        assert_int_equal(ebb_plan_kv_cache_bytes(full), 0);
        for (int i = 0; i < ebb_plan_step_count(next); i++) {
            const char *op = ebb_plan_step_at(next, i)->op;
            assert_true(strcmp(op, "repeat_kv") != 0);
            assert_true(strcmp(op, "scaled_dot_product_attention") != 0);
        }
        assert_true(ebb_plan_peak_is_bound(next));

        ebb_tensor *x = tokens(seq, 0, SEQ), *y = NULL;
        run_checked(full, m, x, &y, NULL);
        double *ref = scores(y, SEQ, c->vocab);
        ebb_tensor_free(x);
        ebb_tensor_free(y);

        ebb_kv_cache *kv = NULL;
        assert_ok(ebb_kv_cache_new(&kv, prompt, CPU));
        assert_int_equal(ebb_kv_cache_bytes(kv), want);
        assert_int_equal(ebb_kv_cache_capacity(kv), SEQ);
        for (int round = 0; round < 2; round++) { /* the second after a truncate */
            assert_int_equal(ebb_kv_cache_length(kv), 0);
            x = tokens(seq, 0, PROMPT);
            run_checked(prompt, m, x, &y, kv);
            ebb_tensor_free(x);
            double *got = scores(y, PROMPT, c->vocab);
            ebb_tensor_free(y);
            int same;
            for (int t = 0; t < PROMPT; t++) {
                double d = compare_at(ref, got, PROMPT, t, t, c->vocab, &same);
                if (d > SCORE_TOL || !same)
                    fail_msg("%s: prompt position %d differs by %g (argmax same: %d)", c->spec,
                             t, d, same);
            }
            free(got);
            assert_int_equal(ebb_kv_cache_length(kv), PROMPT);
            for (int t = PROMPT; t < SEQ; t++) {
                x = tokens(seq, t, 1);
                run_checked(next, m, x, &y, kv);
                ebb_tensor_free(x);
                got = scores(y, 1, c->vocab);
                ebb_tensor_free(y);
                double d = compare_at(ref, got, 1, 0, t, c->vocab, &same);
                if (d > SCORE_TOL || !same)
                    fail_msg("%s: position %d through the cache differs by %g (argmax same: %d)",
                             c->spec, t, d, same);
                free(got);
                assert_int_equal(ebb_kv_cache_length(kv), t + 1);
            }
            /* full: one more position is refused, the count unchanged */
            x = tokens(seq, 0, 1);
            ebb_run_options ro = {.kv_cache = kv};
            assert_int_equal(ebb_run_ex(next, m, &x, &y, &ro, NULL), EBB_ERR_ARG);
            assert_errmsg_contains("holds 12 positions: 12 are filled and this run adds 1");
            assert_null(y);
            ebb_tensor_free(x);
            assert_int_equal(ebb_kv_cache_length(kv), SEQ);
            assert_ok(ebb_kv_cache_truncate(kv, 0));
        }
        free(ref);
        ebb_kv_cache_free(kv);
        ebb_model_free(m);
        ebb_plan_free(full);
        ebb_plan_free(prompt);
        ebb_plan_free(next);
        ebb_spec_free(s);
    }
}

/* What `write` prints of plan p, as a new string (free it). */
static char *printed(void (*write)(const ebb_plan *, FILE *), const ebb_plan *p) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    write(p, f);
    fclose(f);
    return text;
}

/* The listing names the cache, its tensors and the steps that write them. */
static void test_plan_lists_the_cache(void **state) {
    (void)state;
    ebb_spec *s = load_lm(&lms[1]);
    ebb_plan *p = compile_lm(s, 1, SEQ);
    char *text = printed(ebb_plan_print, p);
    if (!strstr(text, "key/value cache: 12 positions, 4 tensors (6.0 KiB)") ||
        !strstr(text, "float32 [2, 2, 12, 8]") || !strstr(text, "_cached_attention") ||
        !strstr(text, "upper bound"))
        fail_msg("listing lacks the cache:\n%s", text);
    free(text);
    text = printed(ebb_plan_write_json, p);
    assert_non_null(strstr(text, "\"kv_cache\": {\"positions\": 12, \"bytes\": 6144}"));
    assert_non_null(strstr(text, "\"kind\": \"state\""));
    free(text);
    ebb_plan_free(p);
    ebb_spec_free(s);
}

/* Misuse, each refused naming what is wrong, nothing leaked. */
static void test_misuse_is_refused(void **state) {
    (void)state;
    ebb_spec *s = load_lm(&lms[0]);
    ebb_plan *plain = compile_lm(s, 4, 0), *next = compile_lm(s, 1, 8);
    ebb_plan *other = compile_lm(s, 1, 6);
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, plain, CPU, 1));
    ebb_tensor *x = NULL, *y = NULL;
    assert_ok(ebb_tensor_zeros(&x, &EBB_SHAPE(BATCH, 1), EBB_INT64, CPU));
    ebb_kv_cache *kv = NULL;
    assert_int_equal(ebb_kv_cache_new(&kv, plain, CPU), EBB_ERR_ARG);
    assert_errmsg_contains("has no key/value cache");
    assert_null(kv);
    /* not captured: each run hands the steps their positions */
    ebb_capture *cap = NULL;
    assert_int_equal(ebb_plan_capture(&cap, next, m, &x), EBB_ERR_UNSUPPORTED);
    assert_errmsg_contains("reads and writes a key/value cache");
    assert_null(cap);
    /* a plan with a cache run without one, and a cache for another length */
    assert_int_equal(ebb_run(next, m, &x, &y, NULL), EBB_ERR_ARG);
    assert_errmsg_contains("reads and writes a key/value cache of 8 positions");
    assert_ok(ebb_kv_cache_new(&kv, other, CPU));
    ebb_run_options ro = {.kv_cache = kv};
    assert_int_equal(ebb_run_ex(next, m, &x, &y, &ro, NULL), EBB_ERR_SHAPE);
    assert_errmsg_contains("float32 [2, 4, 8, 8]; the cache given holds float32 [2, 4, 6, 8]");
    /* a cache handed to a plan without one */
    ebb_tensor *x4 = NULL;
    assert_ok(ebb_tensor_zeros(&x4, &EBB_SHAPE(BATCH, 4), EBB_INT64, CPU));
    assert_int_equal(ebb_run_ex(plain, m, &x4, &y, &ro, NULL), EBB_ERR_ARG);
    assert_errmsg_contains("has no key/value cache");
    assert_null(y);
    assert_int_equal(ebb_kv_cache_truncate(kv, 1), EBB_ERR_ARG);
    assert_errmsg_contains("length 1; the cache holds 0 positions");
    /* a prompt after the first position */
    ebb_plan *prompt = compile_lm(s, 4, 6);
    ebb_tensor *x1 = NULL;
    assert_ok(ebb_tensor_zeros(&x1, &EBB_SHAPE(BATCH, 1), EBB_INT64, CPU));
    assert_ok(ebb_run_ex(other, m, &x1, &y, &ro, NULL));
    ebb_tensor_free(y);
    y = NULL;
    assert_int_equal(ebb_run_ex(prompt, m, &x4, &y, &ro, NULL), EBB_ERR_UNSUPPORTED);
    assert_errmsg_contains("a run of 4 positions after 1 in the key/value cache");
    assert_int_equal(ebb_kv_cache_length(kv), 1);
    ebb_tensor_free(x1);
    ebb_tensor_free(x4);
    ebb_tensor_free(x);
    ebb_kv_cache_free(kv);
    ebb_model_free(m);
    ebb_plan_free(plain);
    ebb_plan_free(next);
    ebb_plan_free(other);
    ebb_plan_free(prompt);
    ebb_spec_free(s);
}

/* Graphs a cache cannot serve, refused at compile, naming the node. */
static void test_graphs_without_a_cache_are_refused(void **state) {
    (void)state;
    static const struct {
        const char *yaml, *says;
        ebb_status st;
    } bad[] = {
        {"ebb: 1\nname: mlp\ninputs: {x: [2, 4]}\nflow:\n  - from: {linear: {out: 3}}\n",
         "graph mlp has no causal scaled_dot_product_attention", EBB_ERR_UNSUPPORTED},
        {"ebb: 1\nname: mha\ninputs: {x: [2, 4, 8]}\nflow:\n"
         "  - from: {multi_head_attention: {num_heads: 2, causal: true, name: att}}\n",
         "node att (multi_head_attention): multi_head_attention makes its keys", EBB_ERR_UNSUPPORTED},
        {"ebb: 1\nname: open\ninputs: {x: [2, 2, 4, 8]}\nflow:\n"
         "  - from: identity\n  - split: [identity, identity, identity]\n"
         "  - merge: {scaled_dot_product_attention: {causal: false}}\n",
         "attention without `causal: true` reads later positions", EBB_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ebb_spec *s = NULL;
        assert_ok(ebb_spec_load_string(&s, bad[i].yaml, strlen(bad[i].yaml), "bad.yaml"));
        ebb_compile_options co = {.kv_cache = 8};
        ebb_plan *p = NULL;
        assert_int_equal(ebb_spec_compile(&p, s, &co), bad[i].st);
        assert_errmsg_contains(bad[i].says);
        assert_null(p);
        ebb_spec_free(s);
    }
    /* a training plan has no cache */
    ebb_spec *s = load_lm(&lms[0]);
    ebb_shape shape = EBB_SHAPE(BATCH, 4);
    ebb_train_options to = {0};
    ebb_compile_options co = {.input_shapes = &shape, .n_input_shapes = 1, .kv_cache = 8,
                              .train = &to};
    ebb_plan *p = NULL;
    assert_int_not_equal(ebb_spec_compile(&p, s, &co), EBB_OK);
    assert_errmsg_contains("a training plan cannot have one");
    assert_null(p);
    ebb_spec_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        EBB_TEST(test_cache_matches_full_sequence),
        EBB_TEST(test_plan_lists_the_cache),
        EBB_TEST(test_misuse_is_refused),
        EBB_TEST(test_graphs_without_a_cache_are_refused),
    };
    return ebb_test_run("generate", tests, NULL, NULL);
}
