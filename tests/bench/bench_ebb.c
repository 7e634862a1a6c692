#define _POSIX_C_SOURCE 200809L
/* The ebb side of the benchmark: only the public C API, as a user would
 * call it (ebb_spec_load_ex with the configuration's params ->
 * ebb_spec_compile -> ebb_model_new -> ebb_run; for training, the same
 * spec compiled with ebb_train_options -> ebb_optimizer_new ->
 * ebb_train_step). */
#include "bench_ebb.h"
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BIND 8

struct bench_ebb {
    ebb_spec *spec;
    ebb_plan *plan;
    ebb_model *model;
    ebb_tensor *x;
    ebb_shape xs;
    ebb_dtype x_dtype; /* float32, or int64 token ids (bench_ebb_input_is_index) */
    ebb_device dev;
    ebb_compile_options opts;
    ebb_shape shapes[MAX_BIND];
    /* training only: the step's options, optimizer and target */
    int training;
    ebb_train_options train;
    ebb_optimizer *opt;
    ebb_tensor *y;
    ebb_shape ys;
    ebb_dtype y_dtype;
    ebb_capture *cap; /* the step in a CUDA graph (bench_ebb_capture_train) */
};

/* Splits a comma list into at most `max` pointers into `buf`. */
static int split_csv(char *buf, char **items, int max) {
    int n = 0;
    for (char *tok = strtok(buf, ","); tok && n < max; tok = strtok(NULL, ","))
        items[n++] = tok;
    return n;
}

static ebb_status fill_param(bench_ebb *b, const char *assign) {
    char name[128];
    const char *eq = strchr(assign, '=');
    if (!eq || (size_t)(eq - assign) >= sizeof name)
        return ebb_error_set(EBB_ERR_ARG, "bench: bad fill '%s' (want name=value)", assign);
    memcpy(name, assign, (size_t)(eq - assign));
    name[eq - assign] = '\0';
    ebb_tensor *p = ebb_model_param(b->model, name), *v = NULL;
    if (!p)
        return ebb_error_set(EBB_ERR_ARG, "bench: the model has no parameter '%s'", name);
    ebb_shape s = ebb_tensor_shape(p);
    ebb_status st = ebb_tensor_full(&v, &s, atof(eq + 1), ebb_tensor_dtype(p), b->dev);
    if (st == EBB_OK)
        st = ebb_model_set_param(b->model, name, v);
    ebb_tensor_free(v);
    return st;
}

/* A seeded target for the forward's output `out` (bench_seeded_target). */
static ebb_status make_target(bench_ebb *b, const ebb_plan_value *out, const char *loss,
                              uint64_t seed) {
    return bench_seeded_target(loss, &out->shape, seed, b->dev, &b->y, &b->ys, &b->y_dtype);
}

/* `loss` NULL: an inference plan; else a training step with that loss,
 * compiled at `precision` (the inference plan that gives the target's shape
 * stays at the spec's). */
static ebb_status setup(bench_ebb **out, const char *spec_path, const char *params_csv,
                        const char *bind_csv, const char *fills_csv, const char *loss,
                        ebb_precision precision, uint64_t seed, ebb_device device) {
    *out = NULL;
    bench_ebb *b = calloc(1, sizeof *b);
    if (!b)
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    b->dev = device;
    /* the configuration's sizes replace the spec's params */
    char param_buf[256] = "";
    char *params[MAX_BIND];
    int np = 0;
    if (params_csv) {
        snprintf(param_buf, sizeof param_buf, "%s", params_csv);
        np = split_csv(param_buf, params, MAX_BIND);
    }
    ebb_spec_options so = {.params = (const char *const *)params, .n_params = np};
    ebb_status st = ebb_spec_load_ex(&b->spec, spec_path, &so);

    char bind_buf[256] = "";
    char *binds[MAX_BIND];
    int nb = 0;
    if (bind_csv) {
        snprintf(bind_buf, sizeof bind_buf, "%s", bind_csv);
        nb = split_csv(bind_buf, binds, MAX_BIND);
    }
    if (st == EBB_OK)
        st = ebb_spec_resolve_shapes(b->spec, (const char *const *)binds, nb, b->shapes, MAX_BIND);
    if (st == EBB_OK) {
        b->opts.input_shapes = b->shapes;
        b->opts.n_input_shapes = ebb_spec_input_count(b->spec);
        b->opts.device = b->dev;
        st = ebb_spec_compile(&b->plan, b->spec, &b->opts);
    }
    /* An int64 input holds token ids below the output's last dim (a
     * language model's vocabulary, which its embedding and its logits share). */
    int64_t x_classes = 0;
    ebb_dtype declared = EBB_FLOAT32;
    b->x_dtype = EBB_FLOAT32;
    if (st == EBB_OK && ebb_spec_input_dtype(b->spec, 0, &declared) && declared == EBB_INT64) {
        const ebb_plan_value *y = ebb_plan_value_at(b->plan, ebb_plan_output_slot(b->plan, 0));
        x_classes = y->shape.ndim ? y->shape.dim[y->shape.ndim - 1] : 0;
        b->x_dtype = EBB_INT64;
    }
    if (st == EBB_OK && loss) {
        /* the inference plan gives the output's shape, the target's */
        const ebb_plan_value *y = ebb_plan_value_at(b->plan, ebb_plan_output_slot(b->plan, 0));
        st = make_target(b, y, loss, seed + 2);
        ebb_plan_free(b->plan);
        b->plan = NULL;
        b->training = 1;
        b->train = (ebb_train_options){.target_shapes = &b->ys, .n_target_shapes = 1,
                                       .target_dtypes = &b->y_dtype, .loss = loss,
                                       .optimizer = {.kind = EBB_ADAMW, .lr = 1e-3}};
        b->opts.train = &b->train;
        b->opts.precision = precision;
        if (st == EBB_OK)
            st = ebb_spec_compile(&b->plan, b->spec, &b->opts);
    }
    if (st == EBB_OK)
        st = ebb_model_new(&b->model, b->plan, b->dev, seed);
    if (st == EBB_OK && fills_csv && *fills_csv) {
        char fbuf[256];
        char *fills[8];
        snprintf(fbuf, sizeof fbuf, "%s", fills_csv);
        int nf = split_csv(fbuf, fills, 8);
        for (int i = 0; st == EBB_OK && i < nf; i++)
            st = fill_param(b, fills[i]);
    }
    if (st == EBB_OK && loss)
        st = ebb_optimizer_new(&b->opt, b->model, &b->train.optimizer);
    if (st == EBB_OK) {
        b->xs = b->shapes[0];
        st = b->x_dtype == EBB_INT64
                 ? bench_seeded_indices(&b->xs, x_classes, seed + 1, b->dev, &b->x)
                 : ebb_tensor_randn(&b->x, &b->xs, EBB_FLOAT32, b->dev, seed + 1);
    }
    if (st != EBB_OK) {
        bench_ebb_free(b);
        return st;
    }
    *out = b;
    return EBB_OK;
}

ebb_status bench_ebb_setup(bench_ebb **out, const char *spec_path, const char *params_csv,
                           const char *bind_csv, const char *fills_csv, uint64_t seed,
                           ebb_device device) {
    return setup(out, spec_path, params_csv, bind_csv, fills_csv, NULL, EBB_PRECISION_DEFAULT,
                 seed, device);
}

ebb_status bench_ebb_setup_train(bench_ebb **out, const char *spec_path, const char *params_csv,
                                 const char *bind_csv, const char *fills_csv, const char *loss,
                                 uint64_t seed, ebb_device device) {
    if (!loss)
        return ebb_error_set(EBB_ERR_ARG, "bench: a training step needs a loss");
    return setup(out, spec_path, params_csv, bind_csv, fills_csv, loss, EBB_PRECISION_DEFAULT,
                 seed, device);
}

ebb_status bench_ebb_setup_train_ex(bench_ebb **out, const char *spec_path,
                                    const char *params_csv, const char *bind_csv,
                                    const char *fills_csv, const char *loss,
                                    ebb_precision precision, uint64_t seed, ebb_device device) {
    if (!loss)
        return ebb_error_set(EBB_ERR_ARG, "bench: a training step needs a loss");
    return setup(out, spec_path, params_csv, bind_csv, fills_csv, loss, precision, seed, device);
}

const ebb_plan *bench_ebb_plan(const bench_ebb *b) { return b->plan; }

int bench_ebb_is_training(const bench_ebb *b) { return b->training; }

ebb_status bench_ebb_train_step(bench_ebb *b, double *loss, ebb_run_stats *stats) {
    return ebb_train_step(b->plan, b->model, b->opt, &b->x, &b->y, loss, stats);
}

ebb_status bench_ebb_capture_train(bench_ebb *b) {
    if (b->cap)
        return EBB_OK;
    return ebb_train_capture(&b->cap, b->plan, b->model, b->opt, &b->x, &b->y, 0);
}

ebb_status bench_ebb_captured_step(bench_ebb *b, double *loss) {
    if (!b->cap)
        return ebb_error_set(EBB_ERR_ARG, "bench_ebb_captured_step: no capture");
    return ebb_capture_train_step(b->cap, &b->x, &b->y, loss);
}

int bench_ebb_param_trained(const bench_ebb *b, int i) {
    return b->training && ebb_plan_param_trained(b->plan, i);
}

ebb_shape bench_ebb_target_shape(const bench_ebb *b) { return b->ys; }

int bench_ebb_target_is_class(const bench_ebb *b) { return b->y_dtype == EBB_INT64; }

ebb_status bench_ebb_target_host(const bench_ebb *b, float *dst, size_t n) {
    ebb_tensor *f = NULL;
    ebb_status st = ebb_tensor_to(&f, b->y, ebb_device_cpu(), EBB_FLOAT32);
    if (st == EBB_OK)
        st = ebb_tensor_to_host(f, dst, n * sizeof(float));
    ebb_tensor_free(f);
    return st;
}

void bench_ebb_phase_counts(const bench_ebb *b, int counts[4]) {
    counts[0] = counts[1] = counts[2] = counts[3] = 0;
    for (int i = 0; i < ebb_plan_step_count(b->plan); i++) {
        ebb_step_phase ph = ebb_plan_step_at(b->plan, i)->phase;
        if ((int)ph >= 0 && (int)ph < 4)
            counts[ph]++;
    }
}

void bench_ebb_free(bench_ebb *b) {
    if (!b)
        return;
    ebb_capture_free(b->cap);
    ebb_tensor_free(b->x);
    ebb_tensor_free(b->y);
    ebb_optimizer_free(b->opt); /* before the model it borrows */
    ebb_model_free(b->model);
    ebb_plan_free(b->plan);
    ebb_spec_free(b->spec);
    free(b);
}

#define MAX_OUT 8

static void free_outputs(ebb_tensor **ys, int n) {
    for (int i = 0; i < n; i++)
        ebb_tensor_free(ys[i]);
}

ebb_status bench_ebb_forward(bench_ebb *b) {
    ebb_tensor *ys[MAX_OUT] = {NULL};
    ebb_status st = ebb_run(b->plan, b->model, &b->x, ys, NULL);
    free_outputs(ys, ebb_plan_output_count(b->plan));
    return st;
}

ebb_status bench_ebb_measure(bench_ebb *b, bench_ebb_memory *m) {
    ebb_tensor *ys[MAX_OUT] = {NULL};
    ebb_run_stats rs;
    memset(m, 0, sizeof *m);
    ebb_status st = ebb_run(b->plan, b->model, &b->x, ys, &rs);
    free_outputs(ys, ebb_plan_output_count(b->plan));
    if (st != EBB_OK)
        return st;
    m->measured_peak = rs.measured_peak_bytes;
    m->planned_peak = rs.planned_peak_bytes;
    m->steps_executed = rs.steps_executed;
    m->n_steps = ebb_plan_step_count(b->plan);

    ebb_compile_options keep = b->opts;
    keep.keep_all = 1;
    ebb_plan *kp = NULL;
    st = ebb_spec_compile(&kp, b->spec, &keep);
    if (st == EBB_OK)
        st = ebb_run(kp, b->model, &b->x, ys, &rs);
    if (st == EBB_OK) {
        free_outputs(ys, ebb_plan_output_count(kp));
        m->keep_all_measured = rs.measured_peak_bytes;
        m->keep_all_planned = ebb_plan_peak_bytes(kp, NULL);
    }
    ebb_plan_free(kp);
    return st;
}

void bench_ebb_explain(const bench_ebb *b, FILE *f) { ebb_plan_print(b->plan, f); }

int bench_ebb_param_count(const bench_ebb *b) { return ebb_plan_param_count(b->plan); }

const char *bench_ebb_param_name(const bench_ebb *b, int i) {
    const char *name = NULL;
    ebb_plan_param_at(b->plan, i, &name);
    return name;
}

ebb_shape bench_ebb_param_shape(const bench_ebb *b, int i) {
    return ebb_tensor_shape(ebb_model_param(b->model, bench_ebb_param_name(b, i)));
}

/* As float32 whatever the parameter's dtype (batch_norm's num_batches_tracked
 * is an int64 count). */
ebb_status bench_ebb_param_host(const bench_ebb *b, int i, float *dst, size_t n) {
    ebb_tensor *f = NULL;
    ebb_status st = ebb_tensor_to(&f, ebb_model_param(b->model, bench_ebb_param_name(b, i)),
                                  ebb_device_cpu(), EBB_FLOAT32);
    if (st == EBB_OK)
        st = ebb_tensor_to_host(f, dst, n * sizeof(float));
    ebb_tensor_free(f);
    return st;
}

ebb_shape bench_ebb_input_shape(const bench_ebb *b) { return b->xs; }

int bench_ebb_input_is_index(const bench_ebb *b) { return b->x_dtype == EBB_INT64; }

/* As float32 whatever its dtype (token ids are small whole numbers). */
ebb_status bench_ebb_input_host(const bench_ebb *b, float *dst, size_t n) {
    ebb_tensor *f = NULL;
    ebb_status st = ebb_tensor_to(&f, b->x, ebb_device_cpu(), EBB_FLOAT32);
    if (st == EBB_OK)
        st = ebb_tensor_to_host(f, dst, n * sizeof(float));
    ebb_tensor_free(f);
    return st;
}

ebb_status bench_ebb_output_host(bench_ebb *b, ebb_shape *shape, float **dst) {
    ebb_tensor *ys[MAX_OUT] = {NULL};
    *dst = NULL;
    ebb_status st = ebb_run(b->plan, b->model, &b->x, ys, NULL);
    if (st == EBB_OK) {
        *shape = ebb_tensor_shape(ys[0]);
        size_t n = (size_t)ebb_shape_numel(shape);
        *dst = malloc((n ? n : 1) * sizeof(float));
        st = *dst ? ebb_tensor_to_host(ys[0], *dst, n * sizeof(float))
                  : ebb_error_set(EBB_ERR_NOMEM, "out of memory");
        if (st != EBB_OK) {
            free(*dst);
            *dst = NULL;
        }
    }
    free_outputs(ys, ebb_plan_output_count(b->plan));
    return st;
}

const ebb_plan_step *bench_ebb_peak_step(const bench_ebb *b) {
    int at = -1;
    ebb_plan_peak_bytes(b->plan, &at);
    return ebb_plan_step_at(b->plan, at);
}


ebb_status bench_ebb_export(bench_ebb *b, const char *prefix) {
    char path[1024];
    snprintf(path, sizeof path, "%s.json", prefix);
    FILE *js = fopen(path, "w");
    snprintf(path, sizeof path, "%s.bin", prefix);
    FILE *bin = fopen(path, "wb");
    ebb_status st = EBB_OK;
    if (!js || !bin)
        st = ebb_error_set(EBB_ERR_IO, "bench: cannot write %s.json/.bin", prefix);
    int first = 1;
    long long offset = 0;
    if (st == EBB_OK)
        fprintf(js, "{\"tensors\": [");
    for (int i = 0; st == EBB_OK && i < bench_ebb_param_count(b); i++) {
        ebb_shape s = bench_ebb_param_shape(b, i);
        size_t n = (size_t)ebb_shape_numel(&s);
        float *buf = malloc((n ? n : 1) * sizeof *buf);
        st = buf ? bench_ebb_param_host(b, i, buf, n) : ebb_error_set(EBB_ERR_NOMEM, "oom");
        if (st == EBB_OK)
            st = bench_export_floats(js, bin, &first, &offset, bench_ebb_param_name(b, i), &s, buf);
        free(buf);
    }
    if (st == EBB_OK) {
        size_t n = (size_t)ebb_shape_numel(&b->xs);
        float *buf = malloc(n * sizeof *buf);
        st = buf ? bench_ebb_input_host(b, buf, n) : ebb_error_set(EBB_ERR_NOMEM, "oom");
        if (st == EBB_OK)
            st = bench_export_floats(js, bin, &first, &offset, "input:x", &b->xs, buf);
        free(buf);
    }
    if (st == EBB_OK && b->training) {
        size_t n = (size_t)ebb_shape_numel(&b->ys);
        float *buf = malloc((n ? n : 1) * sizeof *buf);
        st = buf ? bench_ebb_target_host(b, buf, n) : ebb_error_set(EBB_ERR_NOMEM, "oom");
        if (st == EBB_OK)
            st = bench_export_floats(js, bin, &first, &offset, "target:y", &b->ys, buf);
        free(buf);
    } else if (st == EBB_OK) {
        ebb_shape ys;
        float *buf = NULL;
        st = bench_ebb_output_host(b, &ys, &buf);
        if (st == EBB_OK)
            st = bench_export_floats(js, bin, &first, &offset, "output:y", &ys, buf);
        free(buf);
    }
    if (st == EBB_OK)
        fprintf(js, "\n]}\n");
    if (js)
        fclose(js);
    if (bin)
        fclose(bin);
    return st;
}
