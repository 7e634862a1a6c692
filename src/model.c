/* Models: a plan's parameters instantiated on a device. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
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
    if (s->counter) /* a count, int64 as PyTorch keeps num_batches_tracked */
        return ebb_tensor_zeros(out, &s->shape, EBB_INT64, dev);
    switch (s->init) {
    case EBB_INIT_ZEROS: return ebb_tensor_zeros(out, &s->shape, dt, dev);
    case EBB_INIT_ONES: return ebb_tensor_ones(out, &s->shape, dt, dev);
    case EBB_INIT_NORMAL: {
        ebb_status st = ebb_tensor_randn(out, &s->shape, dt, dev, seed);
        if (st == EBB_OK && s->std > 0 && s->std != 1.0)
            st = ebb_tensor_affine_(*out, s->std, 0.0);
        return st;
    }
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
    for (int k = 0; k < m->n_aliases; k++)
        free(m->aliases[k]);
    free(m->aliases);
    free(m->alias_of);
    free(m->params);
    free(m->names);
    free(m->buffer);
    free(m->frozen);
    free(m);
}

static ebb_status copy_aliases(ebb_model *m, const ebb_plan *plan) {
    int n = 0;
    for (int i = 0; i < plan->n_params; i++)
        n += plan->params[i].n_aliases;
    if (n == 0)
        return EBB_OK;
    m->aliases = calloc((size_t)n, sizeof *m->aliases);
    m->alias_of = calloc((size_t)n, sizeof *m->alias_of);
    if (!m->aliases || !m->alias_of)
        return EBB_ERR_NOMEM;
    for (int i = 0; i < plan->n_params; i++)
        for (int k = 0; k < plan->params[i].n_aliases; k++) {
            const char *a = plan->params[i].aliases[k];
            size_t len = strlen(a) + 1;
            if (!(m->aliases[m->n_aliases] = malloc(len)))
                return EBB_ERR_NOMEM;
            memcpy(m->aliases[m->n_aliases], a, len);
            m->alias_of[m->n_aliases++] = i;
        }
    return EBB_OK;
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
    m->buffer = calloc((size_t)plan->n_params + 1, 1);
    m->frozen = calloc((size_t)plan->n_params + 1, 1);
    if (!m->params || !m->names || !m->buffer || !m->frozen) {
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
        m->buffer[i] = pp->spec.buffer || pp->spec.counter;
        /* no optimizer state for what the plan does not train, nor for
         * what another ZeRO-1 rank owns (a grads_only plan's caller
         * updates), which still gets its gradients */
        m->frozen[i] = plan->training && !m->buffer[i] &&
                       ((!plan->train_options.grads_only && !plan->trained[i]) ||
                        (plan->owner && plan->owner[i] != plan->train_options.parallel.rank));
        ebb_status st =
            init_param(&m->params[i], &pp->spec, plan->dtype, device, param_seed(seed, pp->full_name));
        if (st != EBB_OK) {
            ebb_error_prefix("ebb_model_new: parameter %s", pp->full_name);
            ebb_model_free(m);
            return st;
        }
    }
    if (copy_aliases(m, plan) != EBB_OK) {
        ebb_model_free(m);
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_model_new: out of memory");
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
    for (int k = 0; k < m->n_aliases; k++)
        if (strcmp(m->aliases[k], name) == 0)
            return m->alias_of[k];
    return -1;
}

/* The name parameter i has in the file: its own, else the first of its
 * aliases the file holds (a tied weight saved under the other node's key),
 * else its own (missing). */
static const char *name_in_file(const ebb_model *m, const ebb_safetensors *st, int i) {
    if (ebb_safetensors_dtype_str(st, m->names[i]))
        return m->names[i];
    for (int k = 0; k < m->n_aliases; k++)
        if (m->alias_of[k] == i && ebb_safetensors_dtype_str(st, m->aliases[k]))
            return m->aliases[k];
    return m->names[i];
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
    ebb_status st = ebb_tensor_to(&copy, value, m->device, ebb_tensor_dtype(m->params[i]));
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

/* A growing string for the mismatch report: a model can miss hundreds of
 * names, more than any fixed buffer holds. */
typedef struct strbuf {
    char *p;
    size_t len, cap;
    int oom;
} strbuf;

static void sb_add(strbuf *b, const char *fmt, ...) {
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 256;
        while (cap <= b->len + (size_t)n)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

enum { PARAM_OK, PARAM_MISSING, PARAM_MISMATCH };

/* What is wrong with parameter i in the file, in the words of one item. */
static void describe_mismatch(strbuf *b, const ebb_model *m, const ebb_safetensors *st, int i) {
    ebb_shape shape, want = ebb_tensor_shape(m->params[i]);
    ebb_dtype dt, need = ebb_tensor_dtype(m->params[i]);
    char x[96], y[96];
    const char *name = name_in_file(m, st, i);
    if (ebb_safetensors_find(st, name, &dt, &shape) != EBB_OK)
        /* there, in a dtype ebb has no tensors of: not "missing" */
        sb_add(b, "parameter '%s' has dtype %s, which ebb does not support (the model needs %s %s)",
               name, ebb_safetensors_dtype_str(st, name), ebb_dtype_name(need),
               ebb_shape_str(&want, y, sizeof y));
    else
        sb_add(b, "parameter '%s' is %s %s in the file, the model needs %s %s", name,
               ebb_dtype_name(dt), ebb_shape_str(&shape, x, sizeof x), ebb_dtype_name(need),
               ebb_shape_str(&want, y, sizeof y));
}

/* Every problem in one text, as PyTorch's load_state_dict lists them:
 * missing parameters, then unexpected tensors, then wrong dtypes or shapes.
 * Past `limit` bytes names are counted instead of listed, so that the text
 * fits the error buffer and still says how much it left out. */
static char *describe_problems(const ebb_model *m, const ebb_safetensors *st, const char *path,
                               const unsigned char *state, int n_missing, int n_unexpected,
                               int n_mismatch, size_t limit) {
    strbuf b = {0};
    int total = n_missing + n_unexpected + n_mismatch, left_out = 0, group = 0;
    if (total > 1) {
        sb_add(&b, "%s: %d tensors do not match the model (", path, total);
        const char *sep = "";
        if (n_missing)
            sb_add(&b, "%d missing", n_missing), sep = ", ";
        if (n_unexpected)
            sb_add(&b, "%s%d unexpected", sep, n_unexpected), sep = ", ";
        if (n_mismatch)
            sb_add(&b, "%s%d of the wrong dtype or shape", sep, n_mismatch);
        sb_add(&b, "): ");
    } else
        sb_add(&b, "%s: ", path);
    /* an item is listed when it leaves room for the tail */
#define ROOM(extra) (b.len + (extra) + 64 < limit)
    if (n_missing) {
        sb_add(&b, "missing parameter%s ", n_missing > 1 ? "s" : "");
        for (int i = 0, k = 0; i < m->n_params; i++) {
            if (state[i] != PARAM_MISSING)
                continue;
            if (ROOM(strlen(m->names[i])))
                sb_add(&b, "%s'%s'", k++ ? ", " : "", m->names[i]);
            else
                left_out++;
        }
        group++;
    }
    if (n_unexpected) {
        sb_add(&b, "%sunexpected tensor%s ", group ? "; " : "", n_unexpected > 1 ? "s" : "");
        for (int i = 0, k = 0; i < ebb_safetensors_count(st); i++) {
            const char *name = ebb_safetensors_name_at(st, i);
            if (ebb_model_param_index(m, name) >= 0)
                continue;
            if (ROOM(strlen(name)))
                sb_add(&b, "%s'%s'", k++ ? ", " : "", name);
            else
                left_out++;
        }
        sb_add(&b, " (the model has no such parameter%s)", n_unexpected > 1 ? "s" : "");
        group++;
    }
    for (int i = 0; i < m->n_params; i++) {
        if (state[i] != PARAM_MISMATCH)
            continue;
        size_t at = b.len;
        if (group++)
            sb_add(&b, "; ");
        describe_mismatch(&b, m, st, i);
        if (!b.oom && !ROOM(0)) {
            b.len = at; /* the item does not fit: take it back */
            b.p[at] = '\0';
            left_out++;
        }
    }
#undef ROOM
    if (left_out)
        sb_add(&b, "; and %d more not listed", left_out);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

ebb_status ebb_model_load_ex(ebb_model *m, const char *path, const ebb_model_load_options *opts) {
    if (!m || !path)
        return ebb_error_set(EBB_ERR_ARG, "ebb_model_load: model and path are required");
    ebb_safetensors *st = NULL;
    ebb_status s = ebb_safetensors_open(&st, path);
    if (s != EBB_OK)
        return s;
    unsigned char *state = calloc((size_t)m->n_params + 1, 1);
    if (!state) {
        ebb_safetensors_close(st);
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_model_load: out of memory");
    }
    /* Every name, dtype and shape is checked before any value changes, so a
     * wrong file in strict mode leaves the model as it was. */
    int n_missing = 0, n_unexpected = 0, n_mismatch = 0;
    for (int i = 0; i < m->n_params; i++) {
        ebb_shape shape, want = ebb_tensor_shape(m->params[i]);
        ebb_dtype dt;
        const char *name = name_in_file(m, st, i);
        if (!ebb_safetensors_dtype_str(st, name))
            state[i] = PARAM_MISSING;
        else if (ebb_safetensors_find(st, name, &dt, &shape) != EBB_OK ||
                 !ebb_shape_equal(&shape, &want) || dt != ebb_tensor_dtype(m->params[i]))
            state[i] = PARAM_MISMATCH;
        n_missing += state[i] == PARAM_MISSING;
        n_mismatch += state[i] == PARAM_MISMATCH;
    }
    for (int i = 0; i < ebb_safetensors_count(st); i++)
        n_unexpected += ebb_model_param_index(m, ebb_safetensors_name_at(st, i)) < 0;
    int non_strict = opts && opts->non_strict;
    if (n_missing + n_unexpected + n_mismatch) {
        /* the error buffer holds about 2 KiB; a callback gets everything */
        char *text = describe_problems(m, st, path, state, n_missing, n_unexpected, n_mismatch,
                                       non_strict ? (size_t)-1 : 2000);
        if (!text)
            s = ebb_error_set(EBB_ERR_NOMEM, "ebb_model_load: out of memory");
        else if (!non_strict)
            s = ebb_error_set(n_mismatch ? EBB_ERR_SHAPE : EBB_ERR_ARG, "%s", text);
        else if (opts->mismatch) {
            ebb_load_report r = {.path = path,
                                 .text = text,
                                 .n_missing = n_missing,
                                 .n_unexpected = n_unexpected,
                                 .n_mismatched = n_mismatch,
                                 .n_loaded = m->n_params - n_missing - n_mismatch};
            opts->mismatch(&r, opts->user);
        }
        free(text);
    }
    int count = opts && (opts->strict_finite || opts->nonfinite);
    for (int i = 0; s == EBB_OK && i < m->n_params; i++) {
        if (state[i] != PARAM_OK)
            continue; /* non-strict: the model keeps its own values */
        int64_t bad = 0;
        s = ebb_safetensors_load_into_ex(st, name_in_file(m, st, i), m->params[i],
                                         count ? &bad : NULL);
        if (s == EBB_ERR_CORRUPT && opts && opts->damaged) {
            /* read as the file has it: the caller was told */
            opts->damaged(path, m->names[i], ebb_errmsg(), opts->user);
            ebb_error_clear();
            s = EBB_OK;
        }
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
    free(state);
    ebb_safetensors_close(st);
    return s;
}
