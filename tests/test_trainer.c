/* The trainer (include/ebb/trainer.h) on small datasets written here:
 *   - metrics: a linear classifier whose weights are the identity predicts
 *     the argmax of its input, so the confusion matrix, the accuracies and
 *     the cross-entropy are known from the data alone (computed here in
 *     double precision), over batches that leave a partial last one;
 *   - a run: the callbacks' events (steps, partial last batches, epochs,
 *     evaluations), and a loss that falls on separable data;
 *   - resume: a run stopped at step 5 by its callback, checkpointed and
 *     resumed, ends with the weights of a run straight through, bit for bit;
 *   - early stopping, and a callback's stop;
 *   - text data: byte windows of a file, its held-out split, and a bigram
 *     language model trained on it, its perplexity measured;
 *   - data parallel: 2 and 4 ranks (this program, started as processes on
 *     loopback) reach one process's weights at the same global batch;
 *   - refusals, each naming what is wrong, with nothing leaked.
 * The test's teardown checks that no tensor handle is left alive. */
#define _GNU_SOURCE /* fmemopen, mkdtemp, posix_spawn */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_net.h"
#include "test_util.h"
#include "test_dir.h"

#include "ebb/safetensors.h"
#include "ebb/trainer.h"

#define N 50
#define F 4 /* features = classes */

static const char SPEC[] = "ebb: 1\n"
                           "inputs:\n"
                           "  x: [batch, 4]\n"
                           "flow:\n"
                           "  - from: {linear: {in: 4, out: 4, name: fc}}\n"
                           "targets:\n"
                           "  y: {shape: [batch], dtype: int64}\n"
                           "loss: cross_entropy\n";

static char dir[256], data_path[300], ckpt_path[300];
static float xs[N][F];
static int64_t ys[N];

/* Data a linear layer can separate: class y's samples are largest at
 * feature y, except every seventh sample, whose largest feature is the next
 * class's (so the identity classifier gets it wrong in a known way). */
static void make_data(void) {
    for (int i = 0; i < N; i++) {
        int y = i % F, top = i % 7 == 0 ? (y + 1) % F : y;
        ys[i] = y;
        for (int k = 0; k < F; k++)
            xs[i][k] = (float)(0.1 * ((i * 3 + k * 5) % 7) - 0.3);
        xs[i][top] = 2.0f + 0.01f * (float)i;
    }
}

static int setup_files(void **state) {
    (void)state;
    if (ebb_test_dir_make(dir, sizeof dir, "trainer") != 0) return -1;
    snprintf(data_path, sizeof data_path, "%s/data.safetensors", dir);
    snprintf(ckpt_path, sizeof ckpt_path, "%s/ckpt.safetensors", dir);
    if (ebb_init() != EBB_OK) return -1;
    make_data();
    ebb_tensor *t[2] = {NULL, NULL};
    ebb_shape sx = EBB_SHAPE(N, F), sy = EBB_SHAPE(N);
    const char *names[] = {"x", "y"};
    ebb_status st = ebb_tensor_from_host(&t[0], xs, sizeof xs, &sx, EBB_FLOAT32, ebb_device_cpu());
    if (st == EBB_OK)
        st = ebb_tensor_from_host(&t[1], ys, sizeof ys, &sy, EBB_INT64, ebb_device_cpu());
    if (st == EBB_OK) st = ebb_safetensors_write(data_path, names, t, 2);
    ebb_tensor_free(t[0]);
    ebb_tensor_free(t[1]);
    if (st != EBB_OK) fprintf(stderr, "test_trainer: %s\n", ebb_errmsg());
    return st == EBB_OK ? 0 : -1;
}

static int teardown_files(void **state) {
    (void)state;
    ebb_test_dir_remove(dir);
    return 0;
}

static ebb_spec *load_spec(void) {
    ebb_spec *s = NULL;
    if (ebb_spec_load_string(&s, SPEC, sizeof SPEC - 1, "trainer.yaml") != EBB_OK)
        fail_msg("spec: %s", ebb_errmsg());
    return s;
}

static ebb_trainer_options options(void) {
    ebb_trainer_options o = ebb_trainer_defaults();
    o.data = data_path;
    o.eval_data = data_path;
    o.batch = 16; /* 50 samples: three full batches and one of 2 */
    o.seed = 3;
    o.optimizer = ebb_optimizer_defaults(EBB_ADAM, 0.05);
    o.top_k = 2;
    o.warning = NULL;
    return o;
}

static void set_identity(ebb_model *m) {
    float w[F * F] = {0}, b[F] = {0};
    for (int k = 0; k < F; k++)
        w[k * F + k] = 1;
    ebb_tensor *tw = NULL, *tb = NULL;
    ebb_shape sw = EBB_SHAPE(F, F), sb = EBB_SHAPE(F);
    assert_int_equal(ebb_tensor_from_host(&tw, w, sizeof w, &sw, EBB_FLOAT32, ebb_device_cpu()), EBB_OK);
    assert_int_equal(ebb_tensor_from_host(&tb, b, sizeof b, &sb, EBB_FLOAT32, ebb_device_cpu()), EBB_OK);
    assert_int_equal(ebb_tensor_copy_(ebb_model_param(m, "fc.weight"), tw), EBB_OK);
    assert_int_equal(ebb_tensor_copy_(ebb_model_param(m, "fc.bias"), tb), EBB_OK);
    ebb_tensor_free(tw);
    ebb_tensor_free(tb);
}

static void test_metrics_of_a_known_classifier(void **state) {
    (void)state;
    ebb_spec *spec = load_spec();
    ebb_trainer_options o = options();
    o.evaluate_only = 1;
    o.data = NULL;
    ebb_trainer *t = NULL;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK) fail_msg("open: %s", ebb_errmsg());
    assert_null(ebb_trainer_optimizer(t));
    assert_null(ebb_trainer_train_plan(t));
    set_identity(ebb_trainer_model(t));
    ebb_metrics m;
    if (ebb_trainer_evaluate(t, &m) != EBB_OK) fail_msg("evaluate: %s", ebb_errmsg());

    /* expected, from the data: prediction = argmax x; top-2 = the two largest */
    int64_t conf[F][F] = {{0}};
    double loss = 0;
    int correct = 0, top2 = 0;
    for (int i = 0; i < N; i++) {
        int best = 0;
        double mx = xs[i][0], z = 0;
        for (int k = 1; k < F; k++)
            if (xs[i][k] > xs[i][best]) best = k;
        for (int k = 0; k < F; k++)
            mx = xs[i][k] > mx ? xs[i][k] : mx;
        for (int k = 0; k < F; k++)
            z += exp(xs[i][k] - mx);
        loss += mx + log(z) - xs[i][ys[i]];
        int above = 0;
        for (int k = 0; k < F; k++)
            above += xs[i][k] > xs[i][ys[i]];
        conf[ys[i]][best]++;
        correct += best == ys[i];
        top2 += above < 2;
    }
    assert_int_equal(m.samples, N);
    assert_int_equal(m.predictions, N);
    assert_int_equal(m.classes, F);
    assert_int_equal(m.top_k, 2);
    assert_true(correct < N && correct > N / 2); /* the data makes some wrong */
    assert_true(fabs(m.accuracy - (double)correct / N) < 1e-12);
    assert_true(fabs(m.top_k_accuracy - (double)top2 / N) < 1e-12);
    assert_true(fabs(m.loss - loss / N) < 1e-5);
    for (int r = 0; r < F; r++) {
        int64_t row = 0;
        for (int k = 0; k < F; k++) {
            if (m.confusion[r * F + k] != conf[r][k])
                fail_msg("confusion[%d][%d] = %lld, want %lld", r, k,
                         (long long)m.confusion[r * F + k], (long long)conf[r][k]);
            row += conf[r][k];
        }
        assert_true(fabs(ebb_metrics_class_accuracy(&m, r) - (double)conf[r][r] / (double)row) <
                    1e-12);
    }
    assert_true(isnan(ebb_metrics_class_accuracy(&m, F)));
    /* the printed table names every class */
    char buf[4096] = "";
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    ebb_metrics_print(&m, f);
    fclose(f);
    assert_non_null(strstr(buf, "accuracy "));
    assert_non_null(strstr(buf, "top-2 "));
    assert_non_null(strstr(buf, "class  accuracy |"));
    ebb_metrics_free(&m);
    assert_null(m.confusion);
    /* evaluation-only trainers do not train */
    assert_int_equal(ebb_trainer_run(t), EBB_ERR_ARG);
    assert_int_equal(ebb_trainer_step(t, NULL), EBB_ERR_ARG);
    ebb_trainer_free(t);
    ebb_spec_free(spec);
}

typedef struct events {
    int steps, epochs, partial, evals, stop_at;
    int64_t batches[64];
    double first_eval_loss, last_eval_loss;
} events;

static int count_step(ebb_trainer *t, const ebb_train_event *e, void *user) {
    events *ev = user;
    assert_int_equal(e->kind, EBB_TRAIN_STEP);
    assert_int_equal(e->step, ebb_trainer_get_stats(t).step);
    assert_true(isfinite(e->loss));
    assert_non_null(e->stats);
    if (ev->steps < 64) ev->batches[ev->steps] = e->batch;
    ev->steps++;
    ev->partial += e->batch < 16;
    return ev->stop_at && e->step == ev->stop_at;
}

static int count_epoch(ebb_trainer *t, const ebb_train_event *e, void *user) {
    (void)t;
    events *ev = user;
    assert_int_equal(e->kind, EBB_TRAIN_EPOCH);
    assert_int_equal(e->epoch, ++ev->epochs);
    assert_int_equal(e->epoch_steps, 4);
    if (e->eval) {
        if (!ev->evals++) ev->first_eval_loss = e->eval->loss;
        ev->last_eval_loss = e->eval->loss;
        assert_int_equal(e->eval->samples, N);
    }
    return 0;
}

static void test_run_calls_back_and_learns(void **state) {
    (void)state;
    ebb_spec *spec = load_spec();
    events ev = {0};
    ebb_trainer_options o = options();
    o.epochs = 5;
    o.on_step = count_step;
    o.on_epoch = count_epoch;
    o.user = &ev;
    ebb_trainer *t = NULL;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK) fail_msg("open: %s", ebb_errmsg());
    ebb_trainer_stats s = ebb_trainer_get_stats(t);
    assert_int_equal(s.steps_per_epoch, 4);
    assert_int_equal(s.total_steps, 20);
    assert_int_equal(s.samples, N);
    ebb_metrics before;
    assert_int_equal(ebb_trainer_evaluate(t, &before), EBB_OK);
    if (ebb_trainer_run(t) != EBB_OK) fail_msg("run: %s", ebb_errmsg());
    assert_null(ebb_trainer_stop_reason(t));
    assert_int_equal(ev.steps, 20);
    assert_int_equal(ev.epochs, 5);
    assert_int_equal(ev.evals, 5);
    assert_int_equal(ev.partial, 5); /* each epoch's last batch: 2 samples */
    assert_int_equal(ev.batches[3], 2);
    assert_int_equal(ev.batches[4], 16);
    if (!(ev.last_eval_loss < 0.5 * before.loss))
        fail_msg("the evaluation loss went from %g to %g in 20 steps", before.loss,
                 ev.last_eval_loss);
    s = ebb_trainer_get_stats(t);
    assert_int_equal(s.step, 20);
    assert_int_equal(s.done_steps, 20);
    assert_int_equal(s.over_plan, 0);
    assert_true(s.measured_peak_bytes > 0 && s.measured_peak_bytes <= s.planned_peak_bytes);
    /* past the end */
    assert_int_equal(ebb_trainer_step(t, NULL), EBB_ERR_ARG);
    assert_non_null(strstr(ebb_errmsg(), "last step"));
    ebb_metrics_free(&before);
    ebb_trainer_free(t);
    ebb_spec_free(spec);
}

/* The parameters as host floats. */
static void weights_of(const ebb_trainer *t, float *w) {
    ebb_model *m = ebb_trainer_model(t);
    assert_int_equal(ebb_tensor_to_host(ebb_model_param(m, "fc.weight"), w, sizeof(float) * F * F),
                     EBB_OK);
    assert_int_equal(ebb_tensor_to_host(ebb_model_param(m, "fc.bias"), w + F * F, sizeof(float) * F),
                     EBB_OK);
}

static void test_resume_is_bit_identical(void **state) {
    (void)state;
    ebb_spec *spec = load_spec();
    static const ebb_lr_schedule cosine = {.kind = EBB_LR_COSINE, .t_max = 11};
    float straight[F * F + F], resumed[F * F + F];
    ebb_trainer_options o = options();
    o.steps = 11;
    o.schedule = &cosine;
    o.clip_grad_norm = 0.5; /* the updates after the backward, every gradient scaled */
    ebb_trainer *t = NULL;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK)
        fail_msg("straight: %s", ebb_errmsg());
    weights_of(t, straight);
    ebb_trainer_free(t);

    /* stopped by its callback after step 5, checkpointed, resumed */
    events ev = {.stop_at = 5};
    o.on_step = count_step;
    o.user = &ev;
    o.checkpoint = ckpt_path;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK)
        fail_msg("first half: %s", ebb_errmsg());
    assert_non_null(ebb_trainer_stop_reason(t));
    assert_non_null(strstr(ebb_trainer_stop_reason(t), "step callback at step 5"));
    assert_int_equal(ev.steps, 5);
    if (ebb_trainer_checkpoint(t, NULL) != EBB_OK) fail_msg("checkpoint: %s", ebb_errmsg());
    ebb_trainer_free(t);

    ebb_checkpoint_info ci;
    assert_int_equal(ebb_checkpoint_read_info(ckpt_path, &ci), EBB_OK);
    assert_int_equal(ci.step, 5);
    assert_int_equal(ci.batch, 16);
    assert_int_equal(ci.seed, 3);
    assert_int_equal(ci.optimizer.kind, EBB_ADAM);
    assert_true(ci.has_schedule);
    assert_int_equal(ci.schedule_steps, 5);
    assert_true(ci.clip_grad_norm == 0.5 && ci.clip_grad_value == 0);
    ebb_checkpoint_info_free(&ci);

    ev = (events){0};
    o.resume = ckpt_path;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK)
        fail_msg("resumed: %s", ebb_errmsg());
    assert_int_equal(ev.steps, 6);
    weights_of(t, resumed);
    assert_memory_equal(straight, resumed, sizeof straight);
    ebb_trainer_free(t);
    ebb_spec_free(spec);
}

/* SPEC's model built with the builder calls. */
static ebb_graph *built_model(const char *loss) {
    ebb_builder *b = ebb_builder_new("built");
    ebb_input(b, "x");
    ebb_from(b, ebb_node_op(b, "linear", "in=4, out=4, name=fc"));
    ebb_target(b, "y");
    if (loss) ebb_loss(b, loss, NULL);
    ebb_graph *g = ebb_build(b);
    ebb_builder_free(b);
    if (!g) fail_msg("build: %s", ebb_errmsg());
    return g;
}

/* A graph built in C trains as the spec that declares it does: the same
 * steps from the same seed end on the same weights, bit for bit. The
 * trainer holds its own reference to the graph, and a field list that does
 * not fit the graph is refused, naming the field. */
static void test_graph_built_in_c(void **state) {
    (void)state;
    ebb_spec *spec = load_spec();
    float from_spec[F * F + F], from_c[F * F + F];
    ebb_trainer_options o = options();
    o.steps = 7;
    o.clip_grad_norm = 0.5;
    ebb_trainer *t = NULL;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK)
        fail_msg("spec: %s", ebb_errmsg());
    weights_of(t, from_spec);
    ebb_trainer_free(t);
    ebb_spec_free(spec);

    ebb_graph *g = built_model("cross_entropy");
    const ebb_spec_field fields[] = {{"y", "[batch]", "int64"}, {"x", "batch, 4", NULL}};
    if (ebb_trainer_open_graph(&t, g, fields, 2, &o) != EBB_OK) fail_msg("open: %s", ebb_errmsg());
    ebb_graph_free(g); /* the trainer keeps its own reference */
    if (ebb_trainer_run(t) != EBB_OK) fail_msg("graph: %s", ebb_errmsg());
    assert_int_equal(ebb_trainer_get_stats(t).step, 7);
    weights_of(t, from_c);
    assert_memory_equal(from_spec, from_c, sizeof from_spec);
    ebb_trainer_free(t);

    /* what a wrapped spec says of itself */
    g = built_model("cross_entropy");
    assert_int_equal(ebb_spec_from_graph(&spec, g, fields, 2), EBB_OK);
    ebb_graph_free(g);
    assert_string_equal(ebb_spec_name(spec), "built");
    assert_int_equal(ebb_spec_input_count(spec), 1);
    assert_int_equal(ebb_spec_input_ndim(spec, 0), 2);
    const char *sym = NULL;
    assert_int_equal(ebb_spec_input_dim(spec, 0, 0, &sym), -1);
    assert_string_equal(sym, "batch");
    assert_int_equal(ebb_spec_input_dim(spec, 0, 1, &sym), 4);
    ebb_dtype dt = EBB_FLOAT32;
    assert_true(ebb_spec_target_dtype(spec, 0, &dt));
    assert_int_equal(dt, EBB_INT64);
    assert_false(ebb_spec_input_dtype(spec, 0, &dt));
    ebb_spec_free(spec);

    /* refusals, each naming the field */
    static const struct {
        ebb_spec_field f[3];
        int n;
        const char *says;
    } bad[] = {
        {{{"x", "batch, 4", NULL}}, 1, "target 'y' has no field"},
        {{{"y", "batch", "int64"}}, 1, "input 'x' has no field"},
        {{{"x", "batch, 4", NULL}, {"y", "batch", "int64"}, {"z", "3", NULL}}, 3,
         "field 2 ('z') is neither an input nor a target"},
        {{{"x", "batch, 4", NULL}, {"x", "batch, 4", NULL}, {"y", "batch", NULL}}, 3,
         "input 'x' is declared twice"},
        {{{"x", "batch, -4", NULL}, {"y", "batch", "int64"}}, 2, "got '-4'"},
        {{{"x", "[batch, 4", NULL}, {"y", "batch", "int64"}}, 2, "expected dimensions like"},
        {{{"x", "batch, 4", NULL}, {"y", "batch", "int65"}}, 2, "target 'y' has dtype 'int65'"},
    };
    g = built_model("cross_entropy");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        spec = (ebb_spec *)1;
        assert_int_equal(ebb_spec_from_graph(&spec, g, bad[i].f, bad[i].n), EBB_ERR_ARG);
        assert_null(spec);
        if (!strstr(ebb_errmsg(), bad[i].says) || strncmp(ebb_errmsg(), "built: ", 7) != 0)
            fail_msg("case %zu: \"%s\" does not say \"%s\"", i, ebb_errmsg(), bad[i].says);
    }
    ebb_graph_free(g);
    /* a graph without a loss cannot be trained, and nothing is left open */
    g = built_model(NULL);
    t = (ebb_trainer *)1;
    assert_int_equal(ebb_trainer_open_graph(&t, g, fields, 2, &o), EBB_ERR_SPEC);
    assert_null(t);
    assert_non_null(strstr(ebb_errmsg(), "built declares no `loss:`"));
    ebb_graph_free(g);
}

/* The weights after each step, for the moving average's test. */
typedef struct weight_log {
    float w[16][F * F + F];
    int n, stop_at;
} weight_log;

static int log_weights(ebb_trainer *t, const ebb_train_event *e, void *user) {
    weight_log *l = user;
    if (l->n < 16) weights_of(t, l->w[l->n++]);
    return l->stop_at && e->step == l->stop_at;
}

/* fc's weight and bias as a weights file holds them. */
static void weights_in(const char *path, float *w) {
    ebb_safetensors *sf = NULL;
    assert_int_equal(ebb_safetensors_open(&sf, path), EBB_OK);
    ebb_tensor *tw = NULL, *tb = NULL;
    assert_int_equal(ebb_safetensors_load(&tw, sf, "fc.weight", ebb_device_cpu()), EBB_OK);
    assert_int_equal(ebb_safetensors_load(&tb, sf, "fc.bias", ebb_device_cpu()), EBB_OK);
    assert_int_equal(ebb_tensor_to_host(tw, w, sizeof(float) * F * F), EBB_OK);
    assert_int_equal(ebb_tensor_to_host(tb, w + F * F, sizeof(float) * F), EBB_OK);
    ebb_tensor_free(tw);
    ebb_tensor_free(tb);
    ebb_safetensors_close(sf);
}

/* ema_decay keeps torch's EMA of the weights: the first step's weights,
 * then avg += (1 - decay) * (w - avg) after each step (computed here in
 * double from the weights the step callback sees). save_weights writes the
 * average and evaluation reads it; a checkpoint holds it, so a run stopped
 * and resumed ends on the straight run's average, bit for bit. */
static void test_ema(void **state) {
    (void)state;
    ebb_spec *spec = load_spec();
    const double decay = 0.75;
    char avg_path[320], avg2_path[320];
    snprintf(avg_path, sizeof avg_path, "%s/avg.safetensors", dir);
    snprintf(avg2_path, sizeof avg2_path, "%s/avg2.safetensors", dir);
    weight_log *log = calloc(1, sizeof *log);
    assert_non_null(log);
    ebb_trainer_options o = options();
    o.steps = 9;
    o.ema_decay = decay;
    o.on_step = log_weights;
    o.user = log;
    ebb_trainer *t = NULL;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK)
        fail_msg("ema: %s", ebb_errmsg());
    assert_int_equal(log->n, 9);
    assert_int_equal(ebb_trainer_save_weights(t, avg_path), EBB_OK);
    float got[F * F + F], last[F * F + F];
    weights_in(avg_path, got);
    weights_of(t, last); /* the trained weights themselves are not the average */
    double worst = 0, apart = 0;
    for (int i = 0; i < F * F + F; i++) {
        double avg = log->w[0][i];
        for (int k = 1; k < log->n; k++) avg += (1 - decay) * (log->w[k][i] - avg);
        worst = fmax(worst, fabs(avg - got[i]) / fmax(1, fabs(avg)));
        apart = fmax(apart, fabs((double)last[i] - got[i]));
    }
    if (worst > 1e-6) fail_msg("the average is %g from torch's formula", worst);
    assert_true(apart > 1e-3);
    /* evaluation reads the average: as a model loaded from the saved file */
    ebb_metrics m1, m2;
    assert_int_equal(ebb_trainer_evaluate(t, &m1), EBB_OK);
    ebb_trainer_free(t);
    ebb_trainer_options eo = options();
    eo.evaluate_only = 1;
    eo.weights = avg_path;
    if (ebb_trainer_open(&t, spec, &eo) != EBB_OK) fail_msg("eval: %s", ebb_errmsg());
    assert_int_equal(ebb_trainer_evaluate(t, &m2), EBB_OK);
    assert_true(m1.loss == m2.loss && m1.accuracy == m2.accuracy);
    ebb_metrics_free(&m1);
    ebb_metrics_free(&m2);
    ebb_trainer_free(t);

    /* stopped after step 4 and resumed: the same average */
    *log = (weight_log){.stop_at = 4};
    o.checkpoint = ckpt_path;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK ||
        ebb_trainer_checkpoint(t, NULL) != EBB_OK)
        fail_msg("first half: %s", ebb_errmsg());
    ebb_trainer_free(t);
    ebb_checkpoint_info ci;
    assert_int_equal(ebb_checkpoint_read_info(ckpt_path, &ci), EBB_OK);
    assert_true(ci.ema_decay == decay);
    assert_int_equal(ci.ema_updates, 4);
    ebb_checkpoint_info_free(&ci);
    *log = (weight_log){0};
    o.resume = ckpt_path;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK ||
        ebb_trainer_save_weights(t, avg2_path) != EBB_OK)
        fail_msg("resumed: %s", ebb_errmsg());
    assert_int_equal(log->n, 5);
    ebb_trainer_free(t);
    float resumed[F * F + F];
    weights_in(avg2_path, resumed);
    assert_memory_equal(got, resumed, sizeof got);

    /* a decay outside (0, 1) is refused, naming it */
    o = options();
    o.ema_decay = 1;
    t = (ebb_trainer *)1;
    assert_int_equal(ebb_trainer_open(&t, spec, &o), EBB_ERR_ARG);
    assert_null(t);
    assert_non_null(strstr(ebb_errmsg(), "ema_decay 1"));
    free(log);
    ebb_spec_free(spec);
}

/* Three micro-batches of 6 make the update of one batch of 18: the same
 * samples per step, each micro-batch's gradients weighted by its share
 * (the epoch's last step has micro-batches of 6, 6 and 2, weighted 6/14,
 * 6/14 and 2/14, as the whole batch of 14 there), so the weights after a
 * run match the whole batches' to rounding; clipping applies to the sum,
 * and the buffers are held for the run. */
static void test_accumulate(void **state) {
    (void)state;
    ebb_spec *spec = load_spec();
    float whole[F * F + F], micro[F * F + F];
    ebb_trainer_options o = options();
    o.epochs = 2;
    o.clip_grad_norm = 1.0;
    /* plain SGD: the update is the gradient, so a wrong weighting shows */
    o.optimizer = ebb_optimizer_defaults(EBB_SGD, 0.5);
    o.batch = 18;
    ebb_trainer *t = NULL;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK)
        fail_msg("whole batches: %s", ebb_errmsg());
    weights_of(t, whole);
    ebb_trainer_free(t);
    events ev = {0};
    o.batch = 6;
    o.accumulate = 3;
    o.on_step = count_step;
    o.user = &ev;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK) fail_msg("open: %s", ebb_errmsg());
    ebb_trainer_stats s = ebb_trainer_get_stats(t);
    assert_int_equal(s.steps_per_epoch, 3);
    assert_int_equal(s.accumulate_bytes, (F * F + F) * (int64_t)sizeof(float));
    if (ebb_trainer_run(t) != EBB_OK) fail_msg("accumulated: %s", ebb_errmsg());
    assert_int_equal(ev.steps, 6);
    assert_int_equal(ev.batches[0], 18);
    assert_int_equal(ev.batches[2], 14);
    weights_of(t, micro);
    double worst = 0, top = 0;
    for (int i = 0; i < F * F + F; i++) {
        worst = fmax(worst, fabs((double)micro[i] - (double)whole[i]));
        top = fmax(top, fabs((double)whole[i]));
    }
    if (worst / top > 1e-5)
        fail_msg("accumulated weights differ from whole batches' by %g (of %g)", worst, top);
    ebb_checkpoint_info ci;
    assert_int_equal(ebb_trainer_checkpoint(t, ckpt_path), EBB_OK);
    assert_int_equal(ebb_checkpoint_read_info(ckpt_path, &ci), EBB_OK);
    assert_int_equal(ci.accumulate, 3);
    ebb_checkpoint_info_free(&ci);
    ebb_trainer_free(t);
    ebb_spec_free(spec);
}

/* Datasets hand out float16 and bfloat16 batches: the float32 batch's
 * values rounded to the dtype. */
static void test_half_batches(void **state) {
    (void)state;
    ebb_dataset *d = NULL;
    const char *names[] = {"x", "y"};
    assert_int_equal(ebb_dataset_open(&d, data_path, names, 2), EBB_OK);
    int64_t index[] = {3, 0, 7};
    ebb_shape sh = EBB_SHAPE(3, F);
    ebb_tensor *f32 = NULL;
    assert_int_equal(ebb_dataset_batch(&f32, d, 0, index, 3, &sh, EBB_FLOAT32, ebb_device_cpu()),
                     EBB_OK);
    static const ebb_dtype halves[] = {EBB_BFLOAT16, EBB_FLOAT16};
    for (int k = 0; k < 2; k++) {
        ebb_tensor *h = NULL, *want = NULL, *back = NULL;
        assert_int_equal(ebb_dataset_batch(&h, d, 0, index, 3, &sh, halves[k], ebb_device_cpu()),
                         EBB_OK);
        assert_int_equal(ebb_tensor_dtype(h), halves[k]);
        assert_int_equal(ebb_tensor_to(&want, f32, ebb_device_cpu(), halves[k]), EBB_OK);
        assert_int_equal(ebb_tensor_to(&back, h, ebb_device_cpu(), EBB_FLOAT32), EBB_OK);
        float got[3 * F], ref[3 * F];
        ebb_tensor *wb = NULL;
        assert_int_equal(ebb_tensor_to(&wb, want, ebb_device_cpu(), EBB_FLOAT32), EBB_OK);
        assert_int_equal(ebb_tensor_to_host(back, got, sizeof got), EBB_OK);
        assert_int_equal(ebb_tensor_to_host(wb, ref, sizeof ref), EBB_OK);
        assert_memory_equal(got, ref, sizeof got);
        /* and near the data: bfloat16 keeps 8 bits of mantissa, float16 11 */
        for (int i = 0; i < 3 * F; i++) {
            float x = xs[index[i / F]][i % F];
            assert_true(fabsf(got[i] - x) <= fabsf(x) * (k ? 1e-3f : 8e-3f) + 1e-6f);
        }
        ebb_tensor_free(h);
        ebb_tensor_free(want);
        ebb_tensor_free(back);
        ebb_tensor_free(wb);
    }
    ebb_tensor_free(f32);
    ebb_dataset_free(d);
}

/* A per-token model (a bigram language model: [B, T] tokens in, [B, T, V]
 * scores, [B, T] next tokens): it trains through the trainer, its loss
 * falls, and evaluation counts every token (B*T predictions, the confusion
 * matrix summing to them). */
static void test_per_token(void **state) {
    (void)state;
    static const char lm[] = "ebb: 1\n"
                             "inputs:\n"
                             "  x: {shape: [batch, 6], dtype: int64}\n"
                             "flow:\n"
                             "  - from: {embedding: {num: 5, dim: 4, name: wte}}\n"
                             "  - {linear: {out: 5, name: lm_head}}\n"
                             "targets:\n"
                             "  y: {shape: [batch, 6], dtype: int64}\n"
                             "loss: cross_entropy\n";
    enum { NS = 40, T = 6, V = 5 };
    static int64_t x[NS][T], y[NS][T];
    for (int i = 0; i < NS; i++) /* the next token is the current one plus 2 */
        for (int t = 0; t < T; t++) {
            x[i][t] = (i + t * 2) % V;
            y[i][t] = (x[i][t] + 2) % V;
        }
    char path[400];
    snprintf(path, sizeof path, "%s/tokens.safetensors", dir);
    ebb_tensor *ts[2] = {NULL, NULL};
    ebb_shape sh = EBB_SHAPE(NS, T);
    const char *names[] = {"x", "y"};
    assert_int_equal(ebb_tensor_from_host(&ts[0], x, sizeof x, &sh, EBB_INT64, ebb_device_cpu()), EBB_OK);
    assert_int_equal(ebb_tensor_from_host(&ts[1], y, sizeof y, &sh, EBB_INT64, ebb_device_cpu()), EBB_OK);
    assert_int_equal(ebb_safetensors_write(path, names, ts, 2), EBB_OK);
    ebb_tensor_free(ts[0]);
    ebb_tensor_free(ts[1]);
    ebb_spec *spec = NULL;
    assert_int_equal(ebb_spec_load_string(&spec, lm, sizeof lm - 1, "lm.yaml"), EBB_OK);
    ebb_trainer_options o = options();
    o.data = o.eval_data = path;
    o.batch = 8;
    o.epochs = 20;
    o.optimizer = ebb_optimizer_defaults(EBB_ADAM, 0.05);
    ebb_trainer *t = NULL;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK) fail_msg("open: %s", ebb_errmsg());
    ebb_metrics before, after;
    assert_int_equal(ebb_trainer_evaluate(t, &before), EBB_OK);
    if (ebb_trainer_run(t) != EBB_OK) fail_msg("run: %s", ebb_errmsg());
    assert_int_equal(ebb_trainer_evaluate(t, &after), EBB_OK);
    assert_int_equal(after.samples, NS);
    assert_int_equal(after.predictions, NS * T);
    assert_int_equal(after.classes, V);
    int64_t total = 0;
    for (int k = 0; k < V * V; k++)
        total += after.confusion[k];
    assert_int_equal(total, NS * T);
    if (!(after.loss < 0.25 * before.loss) || !(after.accuracy > 0.99))
        fail_msg("per-token loss %g -> %g, accuracy %g", before.loss, after.loss, after.accuracy);
    ebb_metrics_free(&before);
    ebb_metrics_free(&after);
    ebb_trainer_free(t);
    ebb_spec_free(spec);
}

/* ---- text data: byte tokens in windows ------------------------------------ */

/* Writes `len` bytes to DIR/name; the path into `path`. */
static void write_text(char *path, size_t size, const char *name, const void *bytes, size_t len) {
    snprintf(path, size, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* Batch `count` samples `index` of field i as int64 and compare them with
 * the bytes they must be: text[start + k] for window sample start. */
static void expect_windows(const ebb_dataset *d, int i, const int64_t *index, const int64_t *start,
                           int count, int64_t T, const unsigned char *text) {
    ebb_tensor *b = NULL;
    ebb_shape sh = EBB_SHAPE(count, T);
    assert_ok(ebb_dataset_batch(&b, d, i, index, count, &sh, EBB_INT64, ebb_device_cpu()));
    int64_t got[64];
    assert_true(count * T <= 64);
    assert_ok(ebb_tensor_to_host(b, got, sizeof(int64_t) * (size_t)(count * T)));
    ebb_tensor_free(b);
    for (int r = 0; r < count; r++)
        for (int64_t k = 0; k < T; k++)
            if (got[r * T + k] != text[start[r] + k])
                fail_msg("field %d, sample %lld, token %lld: %lld, expected byte %lld ('%c')", i,
                         (long long)index[r], (long long)k, (long long)got[r * T + k],
                         (long long)start[r] + k, text[start[r] + k]);
}

static void expect_open_fails(const char *desc, const ebb_dataset_expect *ex, int n,
                              ebb_status status, const char *needle) {
    static const char *const names3[] = {"x", "y", "z"};
    ebb_dataset *d = (ebb_dataset *)1;
    ebb_status st = ebb_dataset_open_ex(&d, desc, names3, n, ex);
    if (d) fail_msg("%s: opened (status %s), expected %s naming '%s'", desc, ebb_status_name(st),
                    ebb_status_name(status), needle);
    if (st != status || !strstr(ebb_errmsg(), needle))
        fail_msg("%s: status %s, '%s'; want %s naming '%s'", desc, ebb_status_name(st),
                 ebb_errmsg(), ebb_status_name(status), needle);
}

/* "tokens:FILE": nanoGPT's prepare.py's uint16 tokens (and uint32 with
 * :u32), windows as text's, any vocabulary; a token file given as text or
 * as a dataset file is refused, saying tokens:FILE reads it. */
#define NTOK 100 /* tokens in test_token_data's files */
static void test_token_data(void **state) {
    (void)state;
    unsigned char u16[2 * NTOK], u32[4 * NTOK];
    int64_t tok[NTOK];
    for (int i = 0; i < NTOK; i++) {
        tok[i] = (i * 389 + 7) % 1000 + (i == 77 ? 40000 : 0); /* past int16, one past 1000 */
        u16[2 * i] = (unsigned char)(tok[i] & 0xff), u16[2 * i + 1] = (unsigned char)(tok[i] >> 8);
        for (int k = 0; k < 4; k++)
            u32[4 * i + k] = (unsigned char)(tok[i] >> (8 * k));
    }
    char p16[400], p32[400], desc[460];
    write_text(p16, sizeof p16, "train.bin", u16, sizeof u16);
    write_text(p32, sizeof p32, "train32.bin", u32, sizeof u32);
    const char *names[] = {"x", "y"};
    ebb_shape want[2] = {EBB_SHAPE(8, 4), EBB_SHAPE(8, 4)};
    ebb_dataset_expect ex = {.shapes = want, .n_shapes = 2};
    for (int w = 0; w < 2; w++) {
        ebb_dataset *d = NULL;
        snprintf(desc, sizeof desc, w ? "tokens:%s:u32:all" : "tokens:%s:all", w ? p32 : p16);
        assert_ok(ebb_dataset_open_ex(&d, desc, names, 2, &ex));
        assert_int_equal(ebb_dataset_size(d), NTOK - 4);
        assert_int_equal(ebb_dataset_field_dtype(d, 0), EBB_INT32);
        int64_t idx[3] = {0, 74, 95}, got[12];
        ebb_tensor *b = NULL;
        for (int f = 0; f < 2; f++) { /* the target is the input one token on */
            ebb_shape sh = EBB_SHAPE(3, 4);
            assert_ok(ebb_dataset_batch(&b, d, f, idx, 3, &sh, EBB_INT64, ebb_device_cpu()));
            assert_ok(ebb_tensor_to_host(b, got, sizeof got));
            ebb_tensor_free(b);
            for (int r = 0; r < 3; r++)
                for (int k = 0; k < 4; k++)
                    assert_int_equal(got[r * 4 + k], tok[idx[r] + f + k]);
        }
        /* against a vocabulary of 1000: token 77 is 40000 + ... */
        assert_int_equal(ebb_dataset_check_classes(d, 1, 1000), EBB_ERR_ARG);
        char says[96];
        snprintf(says, sizeof says, "token 77 (at byte %d) is %lld", w ? 308 : 154,
                 (long long)tok[77]);
        assert_errmsg_contains(says);
        assert_ok(ebb_dataset_check_classes(d, 1, 50000));
        ebb_dataset_free(d);
    }
    /* the splits count tokens: the test split is the last 10 */
    ebb_dataset *d = NULL;
    snprintf(desc, sizeof desc, "tokens:%s:test", p16);
    assert_ok(ebb_dataset_open_ex(&d, desc, names, 2, &ex));
    assert_int_equal(ebb_dataset_size(d), 2); /* (10 - 1) / 4 */
    ebb_dataset_free(d);
    /* refusals */
    char odd[400];
    write_text(odd, sizeof odd, "odd.bin", u16, 2 * NTOK - 1);
    snprintf(desc, sizeof desc, "tokens:%s", odd);
    expect_open_fails(desc, &ex, 2, EBB_ERR_ARG, "is 199 bytes, not a whole number of 2-byte");
    unsigned char big[8] = {0, 0, 0, 0xff, 1, 0, 0, 0};
    char pbig[400];
    write_text(pbig, sizeof pbig, "big.bin", big, sizeof big);
    snprintf(desc, sizeof desc, "tokens:%s:u32:all", pbig);
    ebb_shape one[2] = {EBB_SHAPE(1, 1), EBB_SHAPE(1, 1)};
    ebb_dataset_expect ex1 = {.shapes = one, .n_shapes = 2};
    expect_open_fails(desc, &ex1, 2, EBB_ERR_ARG, "token 0 is 4278190080, past the 2^31 - 1");
    snprintf(desc, sizeof desc, "text:%s", p16); /* tokens read as text */
    expect_open_fails(desc, &ex, 2, EBB_ERR_ARG, "holds a NUL byte at offset 1, so it is not text");
    expect_open_fails(p16, &ex, 2, EBB_ERR_IO, "give tokens:");
    snprintf(desc, sizeof desc, "tokens:%s:all", p16);
    ebb_shape long_[2] = {EBB_SHAPE(8, 100), EBB_SHAPE(8, 100)};
    ex.shapes = long_;
    expect_open_fails(desc, &ex, 2, EBB_ERR_ARG,
                      "is 100 tokens (of 100), shorter than one window of 100 tokens");
    expect_open_fails("tokens:", &ex, 2, EBB_ERR_ARG, "no file after tokens:");
}

#undef NTOK

/* "text:FILE": sample i is bytes [i, i+T) and the target the same one byte
 * on; the training split is the first 90% with a window at every byte, the
 * test split the last 10% in windows one after another; every refusal
 * names what is wrong, before reading. */
static void test_text_data(void **state) {
    (void)state;
    unsigned char text[100];
    for (int i = 0; i < 100; i++) /* 'a'..'z' and, every 13th byte, a byte above 127 */
        text[i] = i % 13 == 12 ? (unsigned char)(200 + i % 50)
                               : (unsigned char)('a' + (i * 7) % 26);
    char path[400], desc[420];
    write_text(path, sizeof path, "text.txt", text, sizeof text);
    const char *names[] = {"x", "y"};
    ebb_dataset *d = NULL;

    /* the whole file: 100 - 4 windows at every byte */
    assert_ok(ebb_dataset_open_text(&d, path, names, 4, EBB_TEXT_ALL));
    assert_int_equal(ebb_dataset_size(d), 96);
    ebb_shape fs = ebb_dataset_field_shape(d, 0);
    assert_int_equal(fs.ndim, 2);
    assert_int_equal(fs.dim[0], 96);
    assert_int_equal(fs.dim[1], 4);
    assert_int_equal(ebb_dataset_field_dtype(d, 1), EBB_UINT8);
    assert_string_equal(ebb_dataset_field_file(d, 1), path);
    int64_t idx[3] = {0, 5, 95}, xs[3] = {0, 5, 95}, ys[3] = {1, 6, 96};
    expect_windows(d, 0, idx, xs, 3, 4, text);
    expect_windows(d, 1, idx, ys, 3, 4, text);
    /* a byte token is never an image: no float batches */
    ebb_tensor *b = NULL;
    ebb_shape sh = EBB_SHAPE(1, 4);
    assert_int_equal(ebb_dataset_batch(&b, d, 0, idx, 1, &sh, EBB_FLOAT32, ebb_device_cpu()),
                     EBB_ERR_ARG);
    assert_null(b);
    assert_errmsg_contains("byte tokens");
    /* the tokens checked against a vocabulary: the first byte over 127 is at 12 */
    assert_int_equal(ebb_dataset_check_classes(d, 1, 128), EBB_ERR_ARG);
    assert_errmsg_contains("the byte at offset 12 is 212");
    assert_ok(ebb_dataset_check_classes(d, 1, 256));
    ebb_dataset_free(d);

    /* the training split: the first 90 bytes, 86 windows, the last ending at byte 89 */
    snprintf(desc, sizeof desc, "text:%s", path);
    ebb_shape want[2] = {EBB_SHAPE(8, 4), EBB_SHAPE(8, 4)};
    ebb_dataset_expect ex = {.shapes = want, .n_shapes = 2};
    assert_ok(ebb_dataset_open_ex(&d, desc, names, 2, &ex));
    assert_int_equal(ebb_dataset_size(d), 86);
    int64_t last = 85, lx = 85, ly = 86;
    expect_windows(d, 0, &last, &lx, 1, 4, text);
    expect_windows(d, 1, &last, &ly, 1, 4, text);
    ebb_dataset_free(d);

    /* the test split: bytes 90..99 in windows of 4 one after another: 2 */
    snprintf(desc, sizeof desc, "text:%s:test", path);
    assert_ok(ebb_dataset_open_ex(&d, desc, names, 2, &ex));
    assert_int_equal(ebb_dataset_size(d), 2);
    int64_t tidx[2] = {0, 1}, tx[2] = {90, 94}, ty[2] = {91, 95};
    expect_windows(d, 0, tidx, tx, 2, 4, text);
    expect_windows(d, 1, tidx, ty, 2, 4, text);
    assert_ok(ebb_dataset_check_classes(d, 1, 256));
    ebb_dataset_free(d);

    /* refusals */
    assert_int_equal(ebb_dataset_open(&d, desc, names, 2), EBB_ERR_ARG); /* no window length */
    assert_errmsg_contains("ebb_dataset_open_text()");
    snprintf(desc, sizeof desc, "text:%s:test", path);
    ebb_shape big[2] = {EBB_SHAPE(8, 10), EBB_SHAPE(8, 10)};
    ex.shapes = big; /* 10 held-out bytes hold no window of 10 and the byte after it */
    expect_open_fails(desc, &ex, 2, EBB_ERR_ARG, "the test split (its last 10%) is 10 bytes");
    snprintf(desc, sizeof desc, "text:%s", path);
    ebb_shape flat[2] = {EBB_SHAPE(8), EBB_SHAPE(8)};
    ex.shapes = flat; /* not [B, T] */
    expect_open_fails(desc, &ex, 2, EBB_ERR_SHAPE, "'x' is expected as [8]");
    ebb_shape other[2] = {EBB_SHAPE(8, 4), EBB_SHAPE(8, 5)};
    ex.shapes = other; /* a target of another window */
    expect_open_fails(desc, &ex, 2, EBB_ERR_SHAPE, "'y' is expected as [8, 5]");
    ebb_shape three[3] = {EBB_SHAPE(8, 4), EBB_SHAPE(8, 4), EBB_SHAPE(8, 4)};
    ebb_dataset_expect ex3 = {.shapes = three, .n_shapes = 3};
    expect_open_fails(desc, &ex3, 3, EBB_ERR_ARG, "text data has two fields");
    ex.shapes = want;
    ex.max_bytes = 50; /* 90 bytes to read: refused before reading */
    expect_open_fails(desc, &ex, 2, EBB_ERR_NOMEM, "nothing was read");
    ex.max_bytes = 0;
    char missing[420];
    snprintf(missing, sizeof missing, "text:%s/nothere.txt", dir);
    expect_open_fails(missing, &ex, 2, EBB_ERR_IO, "nothere.txt");
    snprintf(missing, sizeof missing, "text:%s", dir);
    expect_open_fails(missing, &ex, 2, EBB_ERR_IO, "is a directory");
    char empty[400];
    write_text(empty, sizeof empty, "empty.txt", "", 0);
    snprintf(missing, sizeof missing, "text:%s:all", empty);
    expect_open_fails(missing, &ex, 2, EBB_ERR_ARG, "the whole file is 0 bytes");
    assert_int_equal(ebb_dataset_open_text(&d, path, names, 0, EBB_TEXT_ALL), EBB_ERR_ARG);
    assert_null(d);

    /* real text: the Debian package fortunes (make deps), its last tenth */
    static const char fortunes[] = "/usr/share/games/fortunes/fortunes";
    struct stat sb;
    if (stat(fortunes, &sb) != 0) {
        print_message("skipped: %s is missing (the Debian package fortunes)\n", fortunes);
        return;
    }
    int64_t held = (int64_t)sb.st_size / 10;
    assert_ok(ebb_dataset_open_text(&d, fortunes, names, 64, EBB_TEXT_TEST));
    assert_int_equal(ebb_dataset_size(d), (held - 1) / 64);
    assert_ok(ebb_dataset_check_classes(d, 1, 256));
    ebb_dataset_free(d);
}

/* A bigram language model (embedding, then a linear layer to 256 scores)
 * learns a repetitive text through the trainer: `block` sizes its symbolic
 * sequence, evaluation on the held-out split counts every token, and the
 * loss falls to near the text's own entropy, the perplexity being its
 * exponential. Specs that cannot take text are refused by name. */
static void test_text_language_model(void **state) {
    (void)state;
    static const char lm[] = "ebb: 1\n"
                             "inputs:\n"
                             "  x: {shape: [batch, seq], dtype: int64}\n"
                             "flow:\n"
                             "  - from: {embedding: {num: 256, dim: 16, name: wte}}\n"
                             "  - {linear: {out: 256, name: lm_head}}\n"
                             "targets:\n"
                             "  y: {shape: [batch, seq], dtype: int64}\n"
                             "loss: cross_entropy\n";
    /* each byte follows from the one before: a bigram can learn it all */
    static const char phrase[] = "abcdefgh";
    char text[800], path[400], train[420], test[420];
    for (size_t i = 0; i < sizeof text; i++)
        text[i] = phrase[i % 8];
    write_text(path, sizeof path, "abc.txt", text, sizeof text);
    snprintf(train, sizeof train, "text:%s", path);
    snprintf(test, sizeof test, "text:%s:test", path);
    ebb_spec *spec = NULL;
    assert_ok(ebb_spec_load_string(&spec, lm, sizeof lm - 1, "bigram.yaml"));
    ebb_trainer_options o = options();
    o.data = train;
    o.eval_data = test;
    o.block = 16;
    o.batch = 32;
    o.steps = 40;
    o.optimizer = ebb_optimizer_defaults(EBB_ADAM, 0.05);
    ebb_trainer *t = NULL;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK) fail_msg("open: %s", ebb_errmsg());
    ebb_trainer_stats s = ebb_trainer_get_stats(t);
    assert_int_equal(s.samples, 720 - 16); /* a window at every byte of the first 90% */
    assert_true(s.per_token);
    ebb_metrics before, after;
    assert_ok(ebb_trainer_evaluate(t, &before));
    assert_int_equal(before.samples, (80 - 1) / 16); /* 4 windows of the last 80 bytes */
    assert_int_equal(before.predictions, 4 * 16);
    assert_int_equal(before.classes, 256);
    if (!(before.loss > 4.0) ||
        fabs(before.perplexity - exp(before.loss)) > 1e-9 * before.perplexity)
        fail_msg("untrained: loss %g, perplexity %g", before.loss, before.perplexity);
    if (ebb_trainer_run(t) != EBB_OK) fail_msg("run: %s", ebb_errmsg());
    assert_ok(ebb_trainer_evaluate(t, &after));
    if (!(after.loss < 0.1) || !(after.accuracy == 1.0) || !(after.perplexity < 1.11))
        fail_msg("after 40 steps: loss %g -> %g, accuracy %g, perplexity %g", before.loss,
                 after.loss, after.accuracy, after.perplexity);
    char line[256] = "";
    FILE *mem = fmemopen(line, sizeof line, "w");
    ebb_metrics_print(&(ebb_metrics){.loss = after.loss, .samples = after.samples,
                                     .predictions = after.predictions,
                                     .perplexity = after.perplexity},
                      mem);
    fclose(mem);
    assert_non_null(strstr(line, " perplexity 1."));
    assert_non_null(strstr(line, "on 4 samples (64 tokens)"));
    ebb_metrics_free(&before);
    ebb_metrics_free(&after);
    ebb_trainer_free(t);

    /* refusals, each before any data is read */
    o.block = 0; /* the sequence is a symbol: text needs its length */
    assert_int_equal(ebb_trainer_open(&t, spec, &o), EBB_ERR_ARG);
    assert_errmsg_contains("--block N is needed");
    assert_errmsg_contains("'seq'");
    o.block = 200; /* longer than the held-out text */
    assert_int_equal(ebb_trainer_open(&t, spec, &o), EBB_ERR_ARG);
    assert_errmsg_contains("shorter than one window of 200 bytes");
    ebb_spec_free(spec);
    spec = load_spec(); /* [batch, 4] float32 */
    o.block = 4;
    assert_int_equal(ebb_trainer_open(&t, spec, &o), EBB_ERR_ARG);
    assert_errmsg_contains("input 'x' is float32");
    o.block = 8; /* a fixed second dimension must be the block */
    o.data = data_path;
    o.eval_data = NULL;
    assert_int_equal(ebb_trainer_open(&t, spec, &o), EBB_ERR_ARG);
    assert_errmsg_contains("--block 8: trainer.yaml's input 'x' has 4 as its second dimension");
    assert_null(t);
    ebb_spec_free(spec);
}

/* A frozen parameter keeps its value and gets no optimizer state. */
static void test_freeze(void **state) {
    (void)state;
    ebb_spec *spec = load_spec();
    static const char *const frozen[] = {"*.bias"};
    ebb_trainer_options o = options();
    o.steps = 4;
    o.freeze = frozen;
    o.n_freeze = 1;
    ebb_trainer *t = NULL;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK) fail_msg("open: %s", ebb_errmsg());
    float before[F * F + F], after[F * F + F];
    weights_of(t, before);
    if (ebb_trainer_run(t) != EBB_OK) fail_msg("run: %s", ebb_errmsg());
    weights_of(t, after);
    assert_memory_equal(before + F * F, after + F * F, sizeof(float) * F); /* the bias */
    assert_memory_not_equal(before, after, sizeof(float) * F * F);         /* the weight */
    const ebb_plan *plan = ebb_trainer_train_plan(t);
    ebb_model *m = ebb_trainer_model(t);
    for (int i = 0; i < ebb_model_param_count(m); i++) {
        int bias = strstr(ebb_model_param_name(m, i), "bias") != NULL;
        assert_int_equal(ebb_plan_param_trained(plan, i) != 0, !bias);
        assert_int_equal(ebb_optimizer_state_tensor(ebb_trainer_optimizer(t), i, "exp_avg") == NULL,
                         bias);
    }
    ebb_trainer_free(t);
    /* a pattern that matches nothing, and one that matches everything */
    static const char *const none[] = {"conv*"}, *const all[] = {"*"};
    o.freeze = none;
    assert_int_equal(ebb_trainer_open(&t, spec, &o), EBB_ERR_ARG);
    assert_non_null(strstr(ebb_errmsg(), "'conv*' matches no parameter"));
    o.freeze = all;
    assert_int_equal(ebb_trainer_open(&t, spec, &o), EBB_ERR_ARG);
    assert_non_null(strstr(ebb_errmsg(), "leaves no parameter to train"));
    assert_null(t);
    ebb_spec_free(spec);
}

/* A parameter group at its own rate: a scale of 0 leaves the bias as it was
 * (its optimizer state still kept), the weight moves; bad entries refused. */
static void test_lr_scale(void **state) {
    (void)state;
    ebb_spec *spec = load_spec();
    static const char *const scales[] = {"*=3", "*.bias=0"};
    ebb_trainer_options o = options();
    o.steps = 4;
    o.lr_scale = scales;
    o.n_lr_scale = 2;
    ebb_trainer *t = NULL;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK) fail_msg("open: %s", ebb_errmsg());
    ebb_model *m = ebb_trainer_model(t);
    ebb_optimizer *opt = ebb_trainer_optimizer(t);
    for (int i = 0; i < ebb_model_param_count(m); i++) /* the later pattern wins */
        assert_true(ebb_optimizer_get_lr_scale(opt, i) ==
                    (strstr(ebb_model_param_name(m, i), "bias") ? 0.0 : 3.0));
    float before[F * F + F], after[F * F + F];
    weights_of(t, before);
    if (ebb_trainer_run(t) != EBB_OK) fail_msg("run: %s", ebb_errmsg());
    weights_of(t, after);
    assert_memory_equal(before + F * F, after + F * F, sizeof(float) * F); /* the bias */
    assert_memory_not_equal(before, after, sizeof(float) * F * F);         /* the weight */
    ebb_trainer_free(t);
    static const char *const none[] = {"conv*=2"}, *const bad[] = {"*.bias=-1"},
                             *const no_eq[] = {"*.bias"};
    const char *const *cases[] = {none, bad, no_eq};
    const char *want[] = {"'conv*=2' matches no trained parameter", "expected PATTERN=FACTOR",
                          "expected PATTERN=FACTOR"};
    for (int k = 0; k < 3; k++) {
        o.lr_scale = cases[k];
        o.n_lr_scale = 1;
        assert_int_equal(ebb_trainer_open(&t, spec, &o), EBB_ERR_ARG);
        assert_non_null(strstr(ebb_errmsg(), want[k]));
        assert_null(t);
    }
    ebb_spec_free(spec);
}

static void test_early_stopping(void **state) {
    (void)state;
    ebb_spec *spec = load_spec();
    ebb_trainer_options o = options();
    events ev = {0};
    o.optimizer = ebb_optimizer_defaults(EBB_SGD, 0.0); /* nothing changes: no improvement */
    o.epochs = 10;
    o.early_stop_patience = 2;
    o.on_epoch = count_epoch;
    o.user = &ev;
    ebb_trainer *t = NULL;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK)
        fail_msg("%s", ebb_errmsg());
    assert_int_equal(ev.epochs, 3); /* the first is the best; two more without improvement */
    const char *why = ebb_trainer_stop_reason(t);
    assert_non_null(why);
    assert_non_null(strstr(why, "early stopping after epoch 3"));
    assert_int_equal(ebb_trainer_get_stats(t).step, 12);
    ebb_trainer_free(t);

    /* stopped after epoch 2 (one epoch without improvement so far) and
     * resumed: the checkpoint carries the count, so the run stops after
     * epoch 3, as the straight one did */
    o.epochs = 2;
    o.checkpoint = ckpt_path;
    ev = (events){0};
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK)
        fail_msg("first two epochs: %s", ebb_errmsg());
    assert_null(ebb_trainer_stop_reason(t));
    ebb_trainer_free(t);
    ebb_checkpoint_info ci;
    assert_int_equal(ebb_checkpoint_read_info(ckpt_path, &ci), EBB_OK);
    assert_int_equal(ci.early_stop_best_epoch, 1);
    assert_int_equal(ci.early_stop_bad_epochs, 1);
    assert_true(isfinite(ci.early_stop_best_loss) && ci.early_stop_best_loss > 0);
    ebb_checkpoint_info_free(&ci);
    o.epochs = 10;
    o.resume = ckpt_path;
    ev = (events){.epochs = 2}; /* count_epoch checks the epochs' numbers */
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK)
        fail_msg("resumed: %s", ebb_errmsg());
    assert_int_equal(ev.epochs, 3);
    why = ebb_trainer_stop_reason(t);
    if (!why || !strstr(why, "early stopping after epoch 3:") || !strstr(why, "(epoch 1)"))
        fail_msg("resumed run: stop reason '%s'", why ? why : "(none)");
    /* a step taken by hand after the stop goes on: no stop, and no
     * checkpoint until one is due (the run's was written at step 12) */
    double loss = NAN;
    assert_int_equal(ebb_trainer_step(t, &loss), EBB_OK);
    assert_true(isfinite(loss));
    assert_null(ebb_trainer_stop_reason(t));
    assert_int_equal(ebb_trainer_get_stats(t).step, 13);
    assert_int_equal(ebb_trainer_get_stats(t).last_checkpoint, 12);
    ebb_trainer_free(t);
    remove(ckpt_path);
    ebb_spec_free(spec);
}

/* ---- what `ebb train` prints, and the checkpoints it keeps ------------------ */

typedef struct logged {
    int steps, epochs;
    double lr[16]; /* each step's event: the rate it used */
    double epoch_rate[4], epoch_samples[4], epoch_seconds[4];
} logged;

static int log_step(ebb_trainer *t, const ebb_train_event *e, void *user) {
    (void)t;
    logged *l = user;
    if (l->steps < 16) l->lr[l->steps] = e->lr;
    l->steps++;
    return 0;
}

static int log_epoch(ebb_trainer *t, const ebb_train_event *e, void *user) {
    (void)t;
    logged *l = user;
    if (l->epochs < 4) {
        l->epoch_rate[l->epochs] = e->samples_per_s;
        l->epoch_seconds[l->epochs] = e->seconds;
        l->epoch_samples[l->epochs] = (double)(e->samples - (int64_t)N * l->epochs);
    }
    l->epochs++;
    return 0;
}

/* A progress file read back whole (free it). */
static char *read_progress(FILE *f) {
    long len = ftell(f);
    char *text = calloc((size_t)len + 1, 1);
    assert_non_null(text);
    rewind(f);
    assert_int_equal(fread(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    return text;
}

/* The progress lines say what the steps did: each log line the rate its
 * step used (a cosine's last step is not 0, the next step's rate), the
 * epoch's rate its samples over its time (as the epoch event and the CSV
 * give it), and the start line the step's peak as the run's device counts
 * it, not the larger of the CPU and CUDA counts. */
static void test_progress_reports(void **state) {
    (void)state;
    ebb_spec *spec = load_spec();
    static const ebb_lr_schedule cosine = {.kind = EBB_LR_COSINE, .t_max = 8};
    logged l = {0};
    ebb_trainer_options o = options();
    o.epochs = 2; /* 4 steps each, the last of 2 samples */
    o.eval_data = NULL;
    o.schedule = &cosine;
    o.clip_grad_norm = 0.5;
    o.log_every = 1;
    o.on_step = log_step;
    o.on_epoch = log_epoch;
    o.user = &l;
    o.progress = tmpfile();
    assert_non_null(o.progress);
    ebb_trainer *t = NULL;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK)
        fail_msg("%s", ebb_errmsg());
    char *text = read_progress(o.progress);
    assert_int_equal(l.steps, 8);
    assert_true(l.lr[7] > 0); /* cosine:8's last step: the text printed 0, the next one's */
    for (int k = 0; k < 8; k++) {
        char want[64];
        snprintf(want, sizeof want, "step %d/8 loss ", k + 1);
        const char *line = strstr(text, want), *at = line ? strstr(line, " lr ") : NULL;
        if (!at || strchr(line, '\n') < at) fail_msg("no '%s... lr' line in:\n%s", want, text);
        snprintf(want, sizeof want, " lr %.6g ", l.lr[k]);
        if (strncmp(at, want, strlen(want)))
            fail_msg("step %d used lr %.9g; its log line says '%.24s'", k + 1, l.lr[k], at);
    }
    assert_int_equal(l.epochs, 2);
    for (int e = 0; e < 2; e++) {
        double want = l.epoch_samples[e] / l.epoch_seconds[e];
        if (!(l.epoch_samples[e] == N && fabs(l.epoch_rate[e] - want) <= 1e-9 * want))
            fail_msg("epoch %d: %g samples/s, its %g samples over %g s are %g", e + 1,
                     l.epoch_rate[e], l.epoch_samples[e], l.epoch_seconds[e], want);
        char line[96];
        snprintf(line, sizeof line, "(4 steps, %.1f s, %.0f samples/s)", l.epoch_seconds[e],
                 l.epoch_rate[e]);
        if (!strstr(text, line)) fail_msg("no epoch line with '%s' in:\n%s", line, text);
    }
    /* the CPU's figure, which the larger count would overstate here */
    const ebb_plan *plan = ebb_trainer_train_plan(t);
    ebb_remat_stats rs;
    char cpu[32], larger[32], want[96];
    assert_int_equal(ebb_plan_remat_stats(plan, &rs), EBB_OK);
    ebb_bytes_str(ebb_plan_device_peak_bytes(plan, ebb_device_cpu()), cpu, sizeof cpu);
    ebb_bytes_str(rs.peak_bytes, larger, sizeof larger);
    assert_string_not_equal(cpu, larger);
    snprintf(want, sizeof want, "backward: the step's peak %s, about ", cpu);
    if (!strstr(text, want)) fail_msg("the start line lacks '%s':\n%s", want, text);
    free(text);
    ebb_trainer_free(t);
    ebb_spec_free(spec);
}

static int64_t checkpoint_step(const char *path) {
    ebb_checkpoint_info ci;
    if (ebb_checkpoint_read_info(path, &ci) != EBB_OK) fail_msg("%s", ebb_errmsg());
    int64_t step = ci.step;
    ebb_checkpoint_info_free(&ci);
    return step;
}

/* At step 5 the checkpoint holds the first epoch's end. */
static int check_epoch_checkpoint(ebb_trainer *t, const ebb_train_event *e, void *user) {
    (void)user;
    if (e->step == 5) assert_int_equal(checkpoint_step(ebb_trainer_get_options(t)->checkpoint), 4);
    return 0;
}

/* options.checkpoint alone writes one at every epoch's end and at the
 * run's end; checkpoint_every N every N steps and at the end, a step at a
 * time too. */
static void test_checkpoint_every_epoch(void **state) {
    (void)state;
    ebb_spec *spec = load_spec();
    char path[400];
    snprintf(path, sizeof path, "%s/epochs.safetensors", dir);
    unlink(path);
    ebb_trainer_options o = options();
    o.eval_data = NULL;
    o.steps = 6; /* an epoch of 4 steps, then 2 */
    o.checkpoint = path;
    o.on_step = check_epoch_checkpoint;
    ebb_trainer *t = NULL;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK)
        fail_msg("%s", ebb_errmsg());
    assert_int_equal(checkpoint_step(path), 6);
    assert_int_equal(ebb_trainer_get_stats(t).last_checkpoint, 6);
    ebb_trainer_free(t);
    /* step by step, every 4 steps: the last step is the run's end too */
    unlink(path);
    o.on_step = NULL;
    o.checkpoint_every = 4;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK) fail_msg("%s", ebb_errmsg());
    for (int k = 1; k <= 6; k++) {
        if (ebb_trainer_step(t, NULL) != EBB_OK) fail_msg("step %d: %s", k, ebb_errmsg());
        assert_int_equal(ebb_trainer_get_stats(t).last_checkpoint, k < 4 ? -1 : k < 6 ? 4 : 6);
    }
    assert_int_equal(checkpoint_step(path), 6);
    ebb_trainer_free(t);
    ebb_spec_free(spec);
}

typedef struct watched {
    int epochs;
    double value[8];
    float w[8][F * F + F]; /* the weights each epoch ended with */
} watched;

static int watch_eval(ebb_trainer *t, const ebb_train_event *e, void *user) {
    watched *w = user;
    if (w->epochs < 8) {
        w->value[w->epochs] = e->eval->loss;
        weights_of(t, w->w[w->epochs]);
    }
    w->epochs++;
    return 0;
}

static int watch_accuracy(ebb_trainer *t, const ebb_train_event *e, void *user) {
    (void)t;
    watched *w = user;
    if (w->epochs < 8) w->value[w->epochs] = e->eval->accuracy;
    w->epochs++;
    return 0;
}

/* The first epoch (from `from`) with the least value (max: the most). */
static int best_epoch(const watched *w, int from, int max) {
    int b = from;
    for (int e = from; e < w->epochs; e++)
        if (max ? w->value[e] > w->value[b] : w->value[e] < w->value[b]) b = e;
    return b;
}

/* The weight in a checkpoint as host floats. */
static void checkpoint_weights(const char *path, float *w) {
    ebb_safetensors *sf = NULL;
    ebb_tensor *a = NULL, *b = NULL;
    assert_int_equal(ebb_safetensors_open(&sf, path), EBB_OK);
    assert_int_equal(ebb_safetensors_load(&a, sf, "fc.weight", ebb_device_cpu()), EBB_OK);
    assert_int_equal(ebb_safetensors_load(&b, sf, "fc.bias", ebb_device_cpu()), EBB_OK);
    assert_int_equal(ebb_tensor_to_host(a, w, sizeof(float) * F * F), EBB_OK);
    assert_int_equal(ebb_tensor_to_host(b, w + F * F, sizeof(float) * F), EBB_OK);
    ebb_tensor_free(a);
    ebb_tensor_free(b);
    ebb_safetensors_close(sf);
}

/* keep_best: evaluated on the data's labels shifted by one, the loss rises
 * as training learns the true ones, so the best epoch is an early one: its
 * checkpoint (its weights, its step, the value) is kept beside the last,
 * and a run resumed from the last keeps it until an epoch beats it.
 * Accuracy is best highest. */
static void test_keep_best(void **state) {
    (void)state;
    ebb_spec *spec = load_spec();
    char anti[400], ck[400], best[400];
    snprintf(anti, sizeof anti, "%s/anti.safetensors", dir);
    snprintf(ck, sizeof ck, "%s/kb.safetensors", dir);
    snprintf(best, sizeof best, "%s/kb.best.safetensors", dir);
    int64_t shifted[N];
    for (int i = 0; i < N; i++) shifted[i] = (ys[i] + 1) % F;
    ebb_tensor *ts[2] = {NULL, NULL};
    ebb_shape sx = EBB_SHAPE(N, F), sy = EBB_SHAPE(N);
    const char *names[] = {"x", "y"};
    ebb_device cpu = ebb_device_cpu();
    assert_int_equal(ebb_tensor_from_host(&ts[0], xs, sizeof xs, &sx, EBB_FLOAT32, cpu), EBB_OK);
    assert_int_equal(ebb_tensor_from_host(&ts[1], shifted, sizeof shifted, &sy, EBB_INT64, cpu),
                     EBB_OK);
    assert_int_equal(ebb_safetensors_write(anti, names, ts, 2), EBB_OK);
    ebb_tensor_free(ts[0]);
    ebb_tensor_free(ts[1]);

    watched w = {0};
    ebb_trainer_options o = options();
    o.eval_data = anti;
    o.epochs = 4;
    o.checkpoint = ck;
    o.keep_best = "eval_loss";
    o.on_epoch = watch_eval;
    o.user = &w;
    ebb_trainer *t = NULL;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK)
        fail_msg("%s", ebb_errmsg());
    int b = best_epoch(&w, 0, 0);
    assert_true(b < 3); /* else the last checkpoint would be the best one too */
    ebb_trainer_stats s = ebb_trainer_get_stats(t);
    assert_string_equal(s.best_checkpoint, best);
    assert_int_equal(s.best_step, 4 * (b + 1));
    assert_true(s.best_value == w.value[b]);
    ebb_trainer_free(t);
    ebb_checkpoint_info ci;
    assert_int_equal(ebb_checkpoint_read_info(best, &ci), EBB_OK);
    assert_int_equal(ci.step, 4 * (b + 1));
    assert_string_equal(ci.keep_best, "eval_loss");
    assert_true(ci.keep_best_value == w.value[b] && ci.keep_best_step == ci.step);
    ebb_checkpoint_info_free(&ci);
    float kept[F * F + F];
    checkpoint_weights(best, kept);
    assert_memory_equal(kept, w.w[b], sizeof kept);
    assert_int_equal(checkpoint_step(ck), 16);

    /* resumed for two epochs more, none better: the best stays */
    o.resume = ck;
    o.epochs = 6;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK)
        fail_msg("resumed: %s", ebb_errmsg());
    assert_int_equal(w.epochs, 6);
    assert_true(best_epoch(&w, 4, 0) == 4 && w.value[4] > w.value[b]);
    assert_int_equal(ebb_trainer_get_stats(t).best_step, 4 * (b + 1));
    ebb_trainer_free(t);
    assert_int_equal(checkpoint_step(best), 4 * (b + 1));

    /* the highest accuracy, the first epoch to reach it */
    w = (watched){0};
    o = options();
    o.epochs = 3;
    o.checkpoint = ck;
    o.keep_best = "eval_accuracy";
    o.on_epoch = watch_accuracy;
    o.user = &w;
    if (ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK)
        fail_msg("%s", ebb_errmsg());
    b = best_epoch(&w, 0, 1);
    assert_true(ebb_trainer_get_stats(t).best_value == w.value[b]);
    assert_int_equal(checkpoint_step(best), 4 * (b + 1));
    ebb_trainer_free(t);
    ebb_spec_free(spec);
}

/* Every refusal names what is wrong and leaves nothing behind. */
static void test_refusals(void **state) {
    (void)state;
    ebb_spec *spec = load_spec();
    ebb_trainer *t = NULL;
    static const struct {
        const char *what, *needle;
        ebb_status status;
    } cases[] = {
        {"no data", "needs training data", EBB_ERR_ARG},
        {"early stop without eval data", "needs eval_data", EBB_ERR_ARG},
        {"batch 0", "batch 0", EBB_ERR_ARG},
        {"a file that is not there", "nothere.safetensors", EBB_ERR_IO},
        {"resume a file that is not a checkpoint", "not an ebb train checkpoint", EBB_ERR_ARG},
        {"drop_last past the data", "leaves no step", EBB_ERR_ARG},
        {"checkpoint_every without a path", "checkpoint path", EBB_ERR_ARG},
        {"keep_best without a path", "--keep-best eval_loss needs a checkpoint path", EBB_ERR_ARG},
        {"keep_best of no such figure", "--keep-best val_loss: not a figure", EBB_ERR_ARG},
        {"keep_best of an evaluation without eval_data",
         "--keep-best eval_accuracy: it needs eval_data", EBB_ERR_ARG},
        {"keep_best of a perplexity not per token",
         "--keep-best perplexity: the loss is not per token", EBB_ERR_ARG},
    };
    char missing[400];
    snprintf(missing, sizeof missing, "%s/nothere.safetensors", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ebb_trainer_options o = options();
        switch (i) {
        case 0: o.data = NULL; break;
        case 1: o.eval_data = NULL, o.early_stop_patience = 1; break;
        case 2: o.batch = 0; break;
        case 3: o.data = missing; break;
        case 4: o.resume = data_path; break;
        case 5: o.batch = 64, o.drop_last = 1; break;
        case 6: o.checkpoint_every = 2; break;
        case 7: o.keep_best = "eval_loss"; break;
        case 8: o.keep_best = "val_loss", o.checkpoint = ckpt_path; break;
        case 9: o.keep_best = "eval_accuracy", o.checkpoint = ckpt_path, o.eval_data = NULL; break;
        case 10: o.keep_best = "perplexity", o.checkpoint = ckpt_path; break;
        }
        ebb_status st = ebb_trainer_open(&t, spec, &o);
        assert_null(t);
        if (st != cases[i].status || !strstr(ebb_errmsg(), cases[i].needle))
            fail_msg("%s: status %s, message '%s'; want %s naming '%s'", cases[i].what,
                     ebb_status_name(st), ebb_errmsg(), ebb_status_name(cases[i].status),
                     cases[i].needle);
    }
    /* a spec without targets */
    static const char bare[] = "ebb: 1\ninputs:\n  x: [batch, 4]\nflow:\n  - from: relu\n";
    ebb_spec *s2 = NULL;
    assert_int_equal(ebb_spec_load_string(&s2, bare, sizeof bare - 1, "bare.yaml"), EBB_OK);
    ebb_trainer_options o = options();
    assert_int_equal(ebb_trainer_open(&t, s2, &o), EBB_ERR_SPEC);
    assert_non_null(strstr(ebb_errmsg(), "declares no `targets:`"));
    ebb_spec_free(s2);
    /* no evaluation data to evaluate */
    o.eval_data = NULL;
    assert_int_equal(ebb_trainer_open(&t, spec, &o), EBB_OK);
    ebb_metrics m;
    assert_int_equal(ebb_trainer_evaluate(t, &m), EBB_ERR_ARG);
    assert_null(m.confusion);
    assert_int_equal(ebb_trainer_checkpoint(t, NULL), EBB_ERR_ARG);
    ebb_trainer_free(t);
    ebb_spec_free(spec);
    ebb_trainer_free(NULL);
    ebb_metrics_free(NULL);
    ebb_checkpoint_info_free(NULL);
}

/* ---- data parallel ---------------------------------------------------------- */

extern char **environ;

/* The options both sides train with: SGD (the update is the gradient, so a
 * wrongly weighted mean shows), two epochs of global batch 16 over 50
 * samples, shuffled, the last partial batch dropped. */
static ebb_trainer_options dp_options(void) {
    ebb_trainer_options o = options();
    o.eval_data = NULL;
    o.epochs = 2;
    o.drop_last = 1;
    o.optimizer = ebb_optimizer_defaults(EBB_SGD, 0.5);
    return o;
}

/* A rank: trains with the group and, on rank 0, saves the weights to
 * `out`; every rank also asks for a checkpoint, which only rank 0 writes. */
static int dp_child(int rank, int world, int port, const char *data, const char *out,
                    const char *ckpt) {
    if (ebb_init() != EBB_OK) return 2;
    snprintf(data_path, sizeof data_path, "%s", data);
    ebb_dist *d = NULL;
    ebb_dist_options dopt = {.rank = rank, .world_size = world, .master_port = port,
                             .timeout_ms = 20000};
    ebb_spec *spec = NULL;
    ebb_trainer *t = NULL;
    ebb_trainer_options o = dp_options();
    o.dist = NULL;
    ebb_status st = ebb_dist_open(&d, &dopt);
    if (st == EBB_OK) st = ebb_spec_load_string(&spec, SPEC, sizeof SPEC - 1, "trainer.yaml");
    o.dist = d;
    o.checkpoint = ckpt;
    /* a rank with other options: every rank refuses at open, that one
     * naming the difference */
    int mismatch = getenv("EBB_TEST_DP_MISMATCH") != NULL;
    int half = getenv("EBB_TEST_DP_HALF") != NULL; /* one epoch of the two */
    if (half) o.epochs = 1;
    /* AdamW, whose state ZeRO-1 shards ("1") or not ("0") */
    const char *zero = getenv("EBB_TEST_DP_ZERO");
    if (zero) {
        o.optimizer = ebb_optimizer_defaults(EBB_ADAMW, 0.05);
        o.parallel.zero = atoi(zero);
        o.parallel.bucket_bytes = 64; /* a bucket per gradient */
    }
    o.resume = getenv("EBB_TEST_DP_RESUME"); /* a checkpoint to go on from */
    if (getenv("EBB_TEST_DP_OVERLAP")) { /* buckets that travel during the backward */
        o.parallel.overlap = 1;
        o.parallel.bucket_bytes = 64;
    }
    /* a rate whose updates overflow: after the first, the steps' losses
     * are not finite, and every rank undoes them together */
    int skip = getenv("EBB_TEST_DP_SKIP") != NULL;
    if (skip) {
        o.skip_nonfinite = 1;
        o.optimizer = ebb_optimizer_defaults(EBB_SGD, 1e38);
        o.optimizer.momentum = 0.9;
    }
    /* SGD with momentum, loss-scaled and clipped by the norm ("1"), or
     * loss-scaled only ("0"): ZeRO-1's ranks unscale and clip their own
     * shares, agreeing on the overflow check and the norm */
    const char *clip = getenv("EBB_TEST_DP_CLIP");
    if (clip) {
        o.optimizer = ebb_optimizer_defaults(EBB_SGD, 0.5);
        o.optimizer.momentum = 0.9;
        o.loss_scale = 1024;
        o.clip_grad_norm = atoi(clip) ? 0.05 : 0;
    }
    if (getenv("EBB_TEST_DP_ACCUMULATE")) { /* the same update in micro-batches */
        o.accumulate = atoi(getenv("EBB_TEST_DP_ACCUMULATE"));
        o.batch /= o.accumulate;
    }
    if (mismatch && rank == 1) o.optimizer.lr = 0.25;
    if (st == EBB_OK && mismatch) {
        st = ebb_trainer_open(&t, spec, &o);
        const char *want = rank == 1 ? "is not training what rank 0 is: lr 0.25 here, 0.5 on rank 0"
                                     : "another rank is not training what rank 0 is";
        int ok = st == EBB_ERR_ARG && strstr(ebb_errmsg(), want) && !t;
        if (!ok) fprintf(stderr, "[rank %d] %s: %s\n", rank, ebb_status_name(st), ebb_errmsg());
        ebb_spec_free(spec);
        ebb_dist_free(d);
        return ok && ebb_tensor_live_count() == 0 ? 0 : 1;
    }
    if (st == EBB_OK) st = ebb_trainer_open(&t, spec, &o);
    if (st == EBB_OK) st = ebb_trainer_run(t);
    if (st == EBB_OK) st = ebb_trainer_checkpoint(t, NULL);
    if (st == EBB_OK) st = ebb_trainer_save_weights(t, out);
    /* every rank's steps ran as planned, to the byte: the all-reduce
     * steps' buffers included */
    ebb_trainer_stats ts = ebb_trainer_get_stats(t);
    if (st == EBB_OK && (ts.step != (half ? 3 : 6) || ts.over_plan != 0 ||
                         ts.measured_peak_bytes != ts.planned_peak_bytes ||
                         (skip ? ts.skipped == 0 : ts.skipped != 0))) {
        fprintf(stderr, "[rank %d] %lld steps (%lld undone), %lld over their plan, peak %lld "
                "planned %lld\n",
                rank, (long long)ts.step, (long long)ts.skipped, (long long)ts.over_plan,
                (long long)ts.measured_peak_bytes, (long long)ts.planned_peak_bytes);
        st = EBB_ERR_RUNTIME;
    }
    /* ZeRO-1: this rank holds the state of the parameters it owns, and only
     * that, as its plan says */
    const ebb_plan *plan = st == EBB_OK ? ebb_trainer_train_plan(t) : NULL;
    for (int i = 0; plan && zero && i < ebb_plan_param_count(plan); i++) {
        int owner = ebb_plan_param_owner(plan, i), mine = ebb_trainer_optimizer(t) &&
            ebb_optimizer_state_tensor(ebb_trainer_optimizer(t), i,
                                       skip || clip ? "momentum_buffer" : "exp_avg") != NULL;
        if ((o.parallel.zero && (owner < 0 || mine != (owner == rank))) || (!o.parallel.zero && (owner != -1 || !mine))) {
            fprintf(stderr, "[rank %d] parameter %d: owner %d, state here: %d\n", rank, i, owner,
                    mine);
            st = EBB_ERR_RUNTIME;
        }
    }
    if (plan && zero &&
        ebb_optimizer_state_bytes(ebb_trainer_optimizer(t), NULL) != ebb_plan_optimizer_state_bytes(plan)) {
        fprintf(stderr, "[rank %d] optimizer state %lld bytes, planned %lld\n", rank,
                (long long)ebb_optimizer_state_bytes(ebb_trainer_optimizer(t), NULL),
                (long long)ebb_plan_optimizer_state_bytes(plan));
        st = EBB_ERR_RUNTIME;
    }
    /* ZeRO-1 reduce-scatters its buckets, so each rank computed only its
     * own gradients' means */
    int n_buckets = 0, n_scatter = 0;
    for (int i = 0; plan && i < ebb_plan_step_count(plan); i++) {
        const ebb_plan_step *s = ebb_plan_step_at(plan, i);
        n_buckets += ebb_test_bucket_step(s->kind);
        n_scatter += s->kind == EBB_STEP_REDUCE_SCATTER;
    }
    if (plan && o.parallel.zero && (n_buckets < 1 || n_scatter != n_buckets)) {
        fprintf(stderr, "[rank %d] %d of %d buckets reduce-scattered\n", rank, n_scatter,
                n_buckets);
        st = EBB_ERR_RUNTIME;
    }
    if (st != EBB_OK) fprintf(stderr, "[rank %d] %s\n", rank, ebb_errmsg());
    ebb_trainer_free(t);
    ebb_spec_free(spec);
    ebb_dist_free(d);
    return st == EBB_OK && ebb_tensor_live_count() == 0 ? 0 : 1;
}

/* Runs `world` ranks; returns how many exited 0 within 90 s (the rest are
 * killed then). */
static int dp_run(int world, const char *out, const char *ckpt) {
    char sp[16], sw[16], sr[16];
    snprintf(sp, sizeof sp, "%d", ebb_test_free_port());
    snprintf(sw, sizeof sw, "%d", world);
    pid_t pids[8];
    for (int r = 0; r < world; r++) {
        snprintf(sr, sizeof sr, "%d", r);
        char *argv[] = {"/proc/self/exe", "--dp-rank", sr, sw, sp, data_path, (char *)out,
                        (char *)ckpt, NULL};
        assert_int_equal(posix_spawn(&pids[r], "/proc/self/exe", NULL, NULL, argv, environ), 0);
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    time_t end = ts.tv_sec + 90;
    int ok = 0, left = world;
    while (left > 0) {
        for (int r = 0; r < world; r++) {
            int status = 0;
            if (pids[r] <= 0 || waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
            ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
            pids[r] = 0;
            left--;
        }
        clock_gettime(CLOCK_MONOTONIC, &ts);
        if (left > 0 && ts.tv_sec > end) {
            for (int r = 0; r < world; r++)
                if (pids[r] > 0) {
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], NULL, 0);
                }
            break;
        }
        usleep(20 * 1000);
    }
    return ok;
}

/* The largest difference between two weight sets over the largest weight. */
static double rel_diff(const float *got, const float *want) {
    double worst = 0, top = 0;
    for (int i = 0; i < F * F + F; i++) {
        worst = fmax(worst, fabs((double)got[i] - (double)want[i]));
        top = fmax(top, fabs((double)want[i]));
    }
    return worst / top;
}

/* The weights rank 0 saved to `path`, as weights_of() gives them. */
static void weights_file(const char *path, float *out) {
    ebb_safetensors *sf = NULL;
    ebb_tensor *w = NULL, *b = NULL;
    assert_int_equal(ebb_safetensors_open(&sf, path), EBB_OK);
    assert_int_equal(ebb_safetensors_load(&w, sf, "fc.weight", ebb_device_cpu()), EBB_OK);
    assert_int_equal(ebb_safetensors_load(&b, sf, "fc.bias", ebb_device_cpu()), EBB_OK);
    ebb_safetensors_close(sf);
    assert_int_equal(ebb_tensor_to_host(w, out, sizeof(float) * F * F), EBB_OK);
    assert_int_equal(ebb_tensor_to_host(b, out + F * F, sizeof(float) * F), EBB_OK);
    ebb_tensor_free(w);
    ebb_tensor_free(b);
}

/* One process trained with options o: its weights into w (weights_of),
 * and its step count, which the caller checks. */
static int64_t one_process(const ebb_trainer_options *o, float *w, const char *what) {
    ebb_spec *spec = load_spec();
    ebb_trainer *t = NULL;
    if (ebb_trainer_open(&t, spec, o) != EBB_OK || ebb_trainer_run(t) != EBB_OK)
        fail_msg("%s: %s", what, ebb_errmsg());
    weights_of(t, w);
    int64_t steps = ebb_trainer_get_stats(t).step;
    ebb_trainer_free(t);
    ebb_spec_free(spec);
    return steps;
}

/* 2 ranks with environment variable `var` set to `val` (dp_child reads
 * it): rank 0's weights within 1e-6 relative of `want`, one process's. */
static void dp_variant(const char *var, const char *val, const char *what, const float *want) {
    char w[320], c[320];
    snprintf(w, sizeof w, "%s/dp_variant.safetensors", dir);
    snprintf(c, sizeof c, "%s/dp_variant_ckpt.safetensors", dir);
    setenv(var, val, 1);
    assert_int_equal(dp_run(2, w, c), 2);
    unsetenv(var);
    float got[F * F + F];
    weights_file(w, got);
    double rel = rel_diff(got, want);
    printf("[ dp       ] 2 ranks, %s: weights within %.3g of one process's\n", what, rel);
    if (rel > 1e-6)
        fail_msg("2 ranks, %s: weights differ from one process's by %g relative", what, rel);
    unlink(w);
    unlink(c);
}

/* 2 and 4 ranks at global batch 16 leave the weights one process leaves at
 * batch 16 (the means summed in another order: 1e-6 relative), take the
 * same number of steps, and only rank 0 writes. */
static void test_data_parallel(void **state) {
    (void)state;
    ebb_trainer_options o = dp_options();
    float one[F * F + F];
    assert_int_equal(one_process(&o, one, "one process"), 6);
    for (int world = 2; world <= 4; world += 2) {
        char out[320], ckpt[320];
        snprintf(out, sizeof out, "%s/dp%d.safetensors", dir, world);
        snprintf(ckpt, sizeof ckpt, "%s/dp%d_ckpt.safetensors", dir, world);
        assert_int_equal(dp_run(world, out, ckpt), world);
        float got[F * F + F];
        weights_file(out, got);
        double rel = rel_diff(got, one);
        printf("[ dp       ] %d ranks: weights within %.3g of one process's\n", world, rel);
        if (rel > 1e-6)
            fail_msg("%d ranks: weights differ from one process's by %g relative", world, rel);
        struct stat sb;
        assert_int_equal(stat(ckpt, &sb), 0); /* rank 0's checkpoint */
        unlink(out);
        unlink(ckpt);
    }
    /* the first epoch in 2 ranks, checkpointed by rank 0, resumed in one
     * process: the weights of the straight single run */
    char ckpt[320], half_w[320];
    snprintf(ckpt, sizeof ckpt, "%s/dp_half_ckpt.safetensors", dir);
    snprintf(half_w, sizeof half_w, "%s/dp_half.safetensors", dir);
    setenv("EBB_TEST_DP_HALF", "1", 1);
    assert_int_equal(dp_run(2, half_w, ckpt), 2);
    unlink(half_w);
    unsetenv("EBB_TEST_DP_HALF");
    o = dp_options();
    o.resume = ckpt;
    float resumed[F * F + F];
    assert_int_equal(one_process(&o, resumed, "resumed in one process"), 6);
    double rel = rel_diff(resumed, one);
    printf("[ dp       ] 2 ranks then 1 (resumed): weights within %.3g of one process's\n", rel);
    if (rel > 1e-6)
        fail_msg("resumed on another world size: weights differ by %g relative", rel);
    unlink(ckpt);
    /* a bucket per gradient, each travelling while the backward goes on
     * (every step at its plan's peak: the child checks); and a global batch
     * of 8 in two micro-batches a step, the update of batch 16 */
    dp_variant("EBB_TEST_DP_OVERLAP", "1", "all-reduces overlapping the backward", one);
    dp_variant("EBB_TEST_DP_ACCUMULATE", "2", "2 micro-batches of 4 each a step", one);
    /* updates that overflow, unsharded and under ZeRO-1: the ranks undo
     * the steps together (each rank checks the count), and ZeRO-1's undo
     * leaves each rank its own share of the state (the child checks), so
     * both end on the same weights */
    float undone[2][F * F + F];
    char sk_w[320], sk_c[320];
    snprintf(sk_w, sizeof sk_w, "%s/dp_skip.safetensors", dir);
    snprintf(sk_c, sizeof sk_c, "%s/dp_skip_ckpt.safetensors", dir);
    setenv("EBB_TEST_DP_SKIP", "1", 1);
    for (int z = 0; z < 2; z++) {
        setenv("EBB_TEST_DP_ZERO", z ? "1" : "0", 1);
        assert_int_equal(dp_run(2, sk_w, sk_c), 2);
        weights_file(sk_w, undone[z]);
        unlink(sk_w);
        unlink(sk_c);
    }
    if (memcmp(undone[0], undone[1], sizeof undone[0]) != 0)
        fail_msg("2 ranks undoing steps: ZeRO-1's weights differ from the unsharded run's");
    unsetenv("EBB_TEST_DP_ZERO");
    unsetenv("EBB_TEST_DP_SKIP");
    /* ranks that do not train the same thing refuse together */
    setenv("EBB_TEST_DP_MISMATCH", "1", 1);
    assert_int_equal(dp_run(2, "/nonexistent/w", "/nonexistent/c"), 2);
    unsetenv("EBB_TEST_DP_MISMATCH");
}

/* A group of one on the model's device: the trainer runs a data-parallel
 * run's collectives (Gloo's on the CPU; NCCL's on a GPU, with
 * EBB_TEST_DEVICE=cuda: a group of one still runs them there) and leaves
 * one process's weights to the bit. A group on another device than the
 * model's is refused, naming both. */
static void test_one_rank_on_its_device(void **state) {
    (void)state;
    ebb_device dev = ebb_test_device();
    ebb_trainer_options o = dp_options();
    o.device = dev;
    float want[F * F + F], got[F * F + F];
    int64_t steps = one_process(&o, want, "one process");
    ebb_dist *d = NULL;
    ebb_dist_options one = {.world_size = 1, .master_port = ebb_test_free_port(), .timeout_ms = 20000,
                            .device = dev};
    if (ebb_dist_open(&d, &one) != EBB_OK)
        fail_msg("a group of one on the model's device: %s", ebb_errmsg());
    o.dist = d;
    assert_int_equal(one_process(&o, got, "a group of one"), steps);
    assert_memory_equal(got, want, sizeof want);
    o.device = dev.type == EBB_DEVICE_CPU ? ebb_device_cuda(0) : ebb_device_cpu();
    ebb_spec *spec = load_spec();
    ebb_trainer *t = NULL;
    assert_int_equal(ebb_trainer_open(&t, spec, &o), EBB_ERR_ARG);
    assert_errmsg_contains("they must be the same device");
    assert_null(t);
    ebb_spec_free(spec);
    ebb_dist_free(d);
}

/* The whole file's bytes into *buf (*n of them); fails the test when it
 * cannot be read. */
static void read_all(const char *path, unsigned char **buf, size_t *n);

/* Whether two files hold the same bytes. */
static int same_file(const char *a, const char *b) {
    unsigned char *ba = NULL, *bb = NULL;
    size_t na = 0, nb = 0;
    read_all(a, &ba, &na);
    read_all(b, &bb, &nb);
    int same = na == nb && memcmp(ba, bb, na) == 0;
    free(ba);
    free(bb);
    return same;
}

static void read_all(const char *path, unsigned char **buf, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc((size_t)len + 1);
    assert_non_null(*buf);
    *n = fread(*buf, 1, (size_t)len, f);
    fclose(f);
    assert_int_equal(*n, (size_t)len);
}

/* ZeRO-1 over 2 ranks, AdamW: each rank holds the state of the parameters
 * its plan gives it (the weight to rank 0, the bias to rank 1) and none
 * other; the steps are the unsharded run's to the bit, so the weights and
 * the checkpoint rank 0 writes (the whole state, gathered from rank 1) are
 * the same files; that checkpoint resumes in one process, and in 2 ranks
 * with ZeRO-1, to the same weights as the unsharded one. */
static void test_zero(void **state) {
    (void)state;
    char w[2][320], c[2][320];
    for (int z = 0; z < 2; z++) {
        snprintf(w[z], sizeof w[z], "%s/zero%d.safetensors", dir, z);
        snprintf(c[z], sizeof c[z], "%s/zero%d_ckpt.safetensors", dir, z);
        setenv("EBB_TEST_DP_ZERO", z ? "1" : "0", 1);
        assert_int_equal(dp_run(2, w[z], c[z]), 2);
    }
    for (int k = 0; k < 2; k++) {
        int same = same_file(k ? c[0] : w[0], k ? c[1] : w[1]);
        printf("[ zero     ] %s: %s the unsharded run's\n", k ? "checkpoint" : "weights",
               same ? "the same bytes as" : "NOT");
        if (!same) fail_msg("ZeRO-1's %s differs from the unsharded run's", k ? "checkpoint" : "weights");
    }
    /* with --accumulate: 2 micro-batches a step, each rank updating its
     * share of the averaged sums, then sending it (the trainer, not the
     * plan, does both): the unsharded accumulation's bytes */
    char aw[2][320], ac[2][320];
    setenv("EBB_TEST_DP_ACCUMULATE", "2", 1);
    for (int z = 0; z < 2; z++) {
        snprintf(aw[z], sizeof aw[z], "%s/zero_acc%d.safetensors", dir, z);
        snprintf(ac[z], sizeof ac[z], "%s/zero_acc%d_ckpt.safetensors", dir, z);
        setenv("EBB_TEST_DP_ZERO", z ? "1" : "0", 1);
        assert_int_equal(dp_run(2, aw[z], ac[z]), 2);
    }
    unsetenv("EBB_TEST_DP_ACCUMULATE");
    for (int k = 0; k < 2; k++) {
        int same = same_file(k ? ac[0] : aw[0], k ? ac[1] : aw[1]);
        printf("[ zero     ] accumulating 2 micro-batches, %s: %s the unsharded run's\n",
               k ? "checkpoint" : "weights", same ? "the same bytes as" : "NOT");
        if (!same)
            fail_msg("ZeRO-1 with --accumulate: its %s differs from the unsharded run's",
                     k ? "checkpoint" : "weights");
    }
    for (int z = 0; z < 2; z++) {
        unlink(aw[z]);
        unlink(ac[z]);
    }
    /* loss-scaled and clipped by the norm of all the gradients, which each
     * rank computes from its share and the others' (summed in float64):
     * within rounding of the unsharded run, which the clipping changed */
    char cw[5][320];
    float cwt[5][F * F + F];
    for (int k = 0; k < 5; k++) { /* 0, 1: unsharded and sharded; 2: unclipped; 3, 4: accumulating */
        snprintf(cw[k], sizeof cw[k], "%s/zero_clip%d.safetensors", dir, k);
        setenv("EBB_TEST_DP_CLIP", k == 2 ? "0" : "1", 1);
        setenv("EBB_TEST_DP_ZERO", k == 1 || k == 4 ? "1" : "0", 1);
        if (k >= 3) setenv("EBB_TEST_DP_ACCUMULATE", "2", 1);
        assert_int_equal(dp_run(2, cw[k], ac[0]), 2);
        unsetenv("EBB_TEST_DP_ACCUMULATE");
        weights_file(cw[k], cwt[k]);
        unlink(cw[k]);
    }
    unlink(ac[0]);
    unsetenv("EBB_TEST_DP_CLIP");
    double crel = rel_diff(cwt[1], cwt[0]), clipped = rel_diff(cwt[2], cwt[0]);
    double arel = rel_diff(cwt[4], cwt[3]);
    printf("[ zero     ] clipped and loss-scaled: weights within %.3g of the unsharded run's "
           "(%.3g from the unclipped run's); accumulating 2 micro-batches: within %.3g\n",
           crel, clipped, arel);
    if (crel > 1e-6 || arel > 1e-6)
        fail_msg("ZeRO-1, clipped: weights differ from the unsharded run's by %g (accumulating: "
                 "%g)", crel, arel);
    if (clipped < 1e-3) fail_msg("clip_grad_norm 0.05 left the weights within %g", clipped);
    setenv("EBB_TEST_DP_ZERO", "1", 1);
    /* half the run sharded, then resumed: one process, and 2 ranks sharded */
    setenv("EBB_TEST_DP_HALF", "1", 1);
    assert_int_equal(dp_run(2, w[1], c[1]), 2);
    unsetenv("EBB_TEST_DP_HALF");
    ebb_trainer_options o = dp_options();
    o.optimizer = ebb_optimizer_defaults(EBB_ADAMW, 0.05);
    o.resume = c[1];
    float resumed[F * F + F], straight[F * F + F];
    assert_int_equal(one_process(&o, resumed, "resumed in one process"), 6);
    weights_file(w[0], straight);
    double rel = rel_diff(resumed, straight);
    printf("[ zero     ] sharded over 2 ranks, resumed in 1: weights within %.3g of 2 ranks'\n", rel);
    if (rel > 1e-6) fail_msg("resumed from a ZeRO-1 checkpoint: weights differ by %g", rel);
    /* and resumed in 2 ranks, sharded again: the straight run's bits */
    char again[320];
    snprintf(again, sizeof again, "%s/zero_again.safetensors", dir);
    setenv("EBB_TEST_DP_RESUME", c[1], 1);
    assert_int_equal(dp_run(2, again, c[1]), 2);
    unsetenv("EBB_TEST_DP_RESUME");
    int same = same_file(again, w[0]);
    unlink(again);
    if (!same) fail_msg("resumed in 2 ranks with ZeRO-1: the weights differ from the straight run's");
    unsetenv("EBB_TEST_DP_ZERO");
    for (int z = 0; z < 2; z++) {
        unlink(w[z]);
        unlink(c[z]);
    }
}

int main(int argc, char **argv) {
    if (argc == 8 && !strcmp(argv[1], "--dp-rank"))
        return dp_child(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), argv[5], argv[6], argv[7]);
    const struct CMUnitTest tests[] = {
        EBB_TEST(test_metrics_of_a_known_classifier),
        EBB_TEST(test_run_calls_back_and_learns),
        EBB_TEST(test_resume_is_bit_identical),
        EBB_TEST(test_graph_built_in_c),
        EBB_TEST(test_ema),
        EBB_TEST(test_freeze),
        EBB_TEST(test_lr_scale),
        EBB_TEST(test_half_batches),
        EBB_TEST(test_per_token),
        EBB_TEST(test_text_data),
        EBB_TEST(test_token_data),
        EBB_TEST(test_text_language_model),
        EBB_TEST(test_accumulate),
        EBB_TEST(test_early_stopping),
        EBB_TEST(test_progress_reports),
        EBB_TEST(test_checkpoint_every_epoch),
        EBB_TEST(test_keep_best),
        EBB_TEST(test_data_parallel),
        EBB_TEST(test_one_rank_on_its_device),
        EBB_TEST(test_zero),
        EBB_TEST(test_refusals),
    };
    return ebb_test_run("test_trainer", tests, setup_files, teardown_files); /* EBB_TEST_SHARD */
}
