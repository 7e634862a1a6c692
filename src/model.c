/* Models: a plan's parameters instantiated on a device. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ebb/run.h"
#include "ebb/safetensors.h"
#include "model_internal.h"
#include "plan_internal.h"

/* FNV-1a of the name mixed with the seed: each parameter's values depend on
 * the seed and its own name only, not on how many parameters precede it. */
static uint64_t param_seed(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ULL ^ seed;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 1099511628211ULL;
    }
    return h;
}

static ebb_status init_param(ebb_tensor **out, const ebb_param_spec *s, ebb_dtype dt,
                             ebb_device dev, uint64_t seed) {
    switch (s->init) {
    case EBB_INIT_ZEROS: return ebb_tensor_zeros(out, &s->shape, dt, dev);
    case EBB_INIT_ONES: return ebb_tensor_ones(out, &s->shape, dt, dev);
    case EBB_INIT_NORMAL: return ebb_tensor_randn(out, &s->shape, dt, dev, seed);
    case EBB_INIT_UNIFORM_FAN_IN: {
        double bound = s->fan_in > 0 ? 1.0 / sqrt((double)s->fan_in) : 0.0;
        return ebb_tensor_uniform(out, &s->shape, -bound, bound, dt, dev, seed);
    }
    }
    return ebb_error_set(EBB_ERR_ARG, "unknown init kind %d", (int)s->init);
}

void ebb_model_free(ebb_model *m) {
    if (!m)
        return;
    for (int i = 0; i < m->n_params; i++) {
        ebb_tensor_free(m->params[i]);
        free(m->names[i]);
    }
    free(m->params);
    free(m->names);
    free(m);
}

ebb_status ebb_model_new(ebb_model **out, const ebb_plan *plan, ebb_device device, uint64_t seed) {
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "ebb_model_new: out is NULL");
    *out = NULL;
    if (!plan)
        return ebb_error_set(EBB_ERR_ARG, "ebb_model_new: plan is NULL");
    if (device.type == EBB_DEVICE_META)
        return ebb_error_set(EBB_ERR_ARG, "ebb_model_new: a model needs a real device, not meta");
    ebb_status ist = ebb_init();
    if (ist != EBB_OK)
        return ist;
    ebb_model *m = calloc(1, sizeof *m);
    if (!m)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_model_new: out of memory");
    m->device = device;
    m->dtype = plan->dtype;
    m->params = calloc((size_t)plan->n_params + 1, sizeof *m->params);
    m->names = calloc((size_t)plan->n_params + 1, sizeof *m->names);
    if (!m->params || !m->names) {
        ebb_model_free(m);
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_model_new: out of memory");
    }
    m->n_params = plan->n_params;
    for (int i = 0; i < plan->n_params; i++) {
        const plan_param *pp = &plan->params[i];
        size_t n = strlen(pp->full_name) + 1;
        m->names[i] = malloc(n);
        if (!m->names[i]) {
            ebb_model_free(m);
            return ebb_error_set(EBB_ERR_NOMEM, "ebb_model_new: out of memory");
        }
        memcpy(m->names[i], pp->full_name, n);
        ebb_status st =
            init_param(&m->params[i], &pp->spec, plan->dtype, device, param_seed(seed, pp->full_name));
        if (st != EBB_OK) {
            ebb_error_prefix("ebb_model_new: parameter %s", pp->full_name);
            ebb_model_free(m);
            return st;
        }
    }
    *out = m;
    return EBB_OK;
}

ebb_device ebb_model_device(const ebb_model *m) { return m ? m->device : ebb_device_cpu(); }
int ebb_model_param_count(const ebb_model *m) { return m ? m->n_params : 0; }
const char *ebb_model_param_name(const ebb_model *m, int i) {
    return m && i >= 0 && i < m->n_params ? m->names[i] : NULL;
}

int ebb_model_param_index(const ebb_model *m, const char *name) {
    if (!m || !name)
        return -1;
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->names[i], name) == 0)
            return i;
    return -1;
}

ebb_tensor *ebb_model_param(const ebb_model *m, const char *name) {
    int i = ebb_model_param_index(m, name);
    return i >= 0 ? m->params[i] : NULL;
}

ebb_status ebb_model_set_param(ebb_model *m, const char *name, const ebb_tensor *value) {
    int i = ebb_model_param_index(m, name);
    if (i < 0)
        return ebb_error_set(EBB_ERR_ARG, "ebb_model_set_param: no parameter named '%s'",
                             name ? name : "(null)");
    if (!value)
        return ebb_error_set(EBB_ERR_ARG, "ebb_model_set_param: value is NULL");
    ebb_shape have = ebb_tensor_shape(m->params[i]), got = ebb_tensor_shape(value);
    if (!ebb_shape_equal(&have, &got)) {
        char a[96], b[96];
        return ebb_error_set(EBB_ERR_SHAPE, "ebb_model_set_param: %s is %s, value is %s", name,
                             ebb_shape_str(&have, a, sizeof a), ebb_shape_str(&got, b, sizeof b));
    }
    ebb_tensor *copy = NULL;
    ebb_status st = ebb_tensor_to(&copy, value, m->device, m->dtype);
    if (st != EBB_OK)
        return ebb_error_prefix("ebb_model_set_param: %s", name);
    /* a fresh tensor, never a second handle on the caller's storage */
    if (ebb_tensor_same_storage(copy, value)) {
        ebb_tensor *deep = NULL;
        st = ebb_tensor_clone(&deep, copy);
        ebb_tensor_free(copy);
        if (st != EBB_OK)
            return st;
        copy = deep;
    }
    ebb_tensor_free(m->params[i]);
    m->params[i] = copy;
    return EBB_OK;
}

/* ---- safetensors ------------------------------------------------------------ */

ebb_status ebb_model_save(const ebb_model *m, const char *path) {
    if (!m || !path)
        return ebb_error_set(EBB_ERR_ARG, "ebb_model_save: model and path are required");
    return ebb_safetensors_write(path, (const char *const *)m->names, m->params, m->n_params);
}

ebb_status ebb_model_load(ebb_model *m, const char *path) {
    return ebb_model_load_ex(m, path, NULL);
}

ebb_status ebb_model_load_ex(ebb_model *m, const char *path, const ebb_model_load_options *opts) {
    if (!m || !path)
        return ebb_error_set(EBB_ERR_ARG, "ebb_model_load: model and path are required");
    ebb_safetensors *st = NULL;
    ebb_status s = ebb_safetensors_open(&st, path);
    if (s != EBB_OK)
        return s;
    /* Check names first, so a wrong file changes nothing. */
    for (int i = 0; s == EBB_OK && i < m->n_params; i++) {
        ebb_shape shape, want = ebb_tensor_shape(m->params[i]);
        ebb_dtype dt, need = ebb_tensor_dtype(m->params[i]);
        char a[96], b[96];
        const char *file_dtype = ebb_safetensors_dtype_str(st, m->names[i]);
        if (!file_dtype) {
            s = ebb_error_set(EBB_ERR_ARG, "%s: missing parameter '%s'", path, m->names[i]);
        } else if (ebb_safetensors_find(st, m->names[i], &dt, &shape) != EBB_OK) {
            /* the tensor is there, in a dtype ebb has no tensors of */
            s = ebb_error_set(EBB_ERR_SHAPE,
                              "%s: parameter '%s' has dtype %s, which ebb does not support (the "
                              "model needs %s %s)",
                              path, m->names[i], file_dtype, ebb_dtype_name(need),
                              ebb_shape_str(&want, b, sizeof b));
        } else if (!ebb_shape_equal(&shape, &want) || dt != need) {
            s = ebb_error_set(EBB_ERR_SHAPE, "%s: parameter '%s' is %s %s in the file, the model "
                                             "needs %s %s",
                              path, m->names[i], ebb_dtype_name(dt), ebb_shape_str(&shape, a, sizeof a),
                              ebb_dtype_name(need), ebb_shape_str(&want, b, sizeof b));
        }
    }
    for (int i = 0; s == EBB_OK && i < ebb_safetensors_count(st); i++) {
        const char *name = ebb_safetensors_name_at(st, i);
        if (ebb_model_param_index(m, name) < 0)
            s = ebb_error_set(EBB_ERR_ARG, "%s: unexpected tensor '%s' (the model has no such "
                                           "parameter)",
                              path, name);
    }
    int count = opts && (opts->strict_finite || opts->nonfinite);
    for (int i = 0; s == EBB_OK && i < m->n_params; i++) {
        int64_t bad = 0;
        s = ebb_safetensors_load_into_ex(st, m->names[i], m->params[i], count ? &bad : NULL);
        if (s != EBB_OK || bad == 0)
            continue;
        if (opts->strict_finite)
            s = ebb_error_set(EBB_ERR_ARG,
                              "%s: parameter '%s' holds %lld NaN or infinite values (of %lld)",
                              path, m->names[i], (long long)bad,
                              (long long)ebb_tensor_numel(m->params[i]));
        else
            opts->nonfinite(path, m->names[i], bad, ebb_tensor_numel(m->params[i]), opts->user);
    }
    ebb_safetensors_close(st);
    return s;
}
