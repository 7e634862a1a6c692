/* Generation's key/value cache (run.h): the tensors a plan compiled with
 * ebb_compile_options.kv_cache reads and writes across runs, one per
 * EBB_VALUE_STATE value, and how many positions they hold. The executor
 * binds them to those values' slots (ebb_kv_cache_bind) and adds each
 * successful run's positions. */
#include <stdlib.h>

#include "ebb/run.h"
#include "plan_internal.h"
#include "run_internal.h"

struct ebb_kv_cache {
    ebb_device device;
    ebb_tensor **t; /* one per state value, in slot order */
    int n;
    int64_t capacity, length, bytes;
};

ebb_status ebb_kv_cache_new(ebb_kv_cache **out, const ebb_plan *plan, ebb_device device) {
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "ebb_kv_cache_new: out is NULL");
    *out = NULL;
    if (!plan || plan->kv_cache <= 0)
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_kv_cache_new: plan %s has no key/value cache (compile it with "
                             "ebb_compile_options.kv_cache)",
                             plan ? plan->name : "(NULL)");
    ebb_kv_cache *c = calloc(1, sizeof *c);
    int n = 0;
    for (int v = 0; v < plan->n_values; v++)
        n += plan->values[v].kind == EBB_VALUE_STATE;
    if (c)
        c->t = calloc((size_t)n + 1, sizeof *c->t);
    if (!c || !c->t) {
        free(c);
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_kv_cache_new: out of memory");
    }
    c->device = device;
    c->capacity = plan->kv_cache;
    ebb_status st = EBB_OK;
    for (int v = 0; st == EBB_OK && v < plan->n_values; v++) {
        const ebb_plan_value *pv = &plan->values[v];
        if (pv->kind != EBB_VALUE_STATE)
            continue;
        st = ebb_tensor_zeros(&c->t[c->n], &pv->shape, pv->dtype, device);
        if (st == EBB_OK)
            c->bytes += (int64_t)ebb_tensor_nbytes(c->t[c->n++]);
    }
    if (st != EBB_OK) {
        ebb_kv_cache_free(c);
        return ebb_error_prefix("ebb_kv_cache_new: plan %s", plan->name);
    }
    *out = c;
    return EBB_OK;
}

void ebb_kv_cache_free(ebb_kv_cache *c) {
    if (!c)
        return;
    for (int i = 0; i < c->n; i++)
        ebb_tensor_free(c->t[i]);
    free(c->t);
    free(c);
}

int64_t ebb_kv_cache_length(const ebb_kv_cache *c) { return c ? c->length : 0; }
int64_t ebb_kv_cache_capacity(const ebb_kv_cache *c) { return c ? c->capacity : 0; }
int64_t ebb_kv_cache_bytes(const ebb_kv_cache *c) { return c ? c->bytes : 0; }

ebb_status ebb_kv_cache_truncate(ebb_kv_cache *c, int64_t length) {
    if (!c)
        return ebb_error_set(EBB_ERR_ARG, "ebb_kv_cache_truncate: the cache is NULL");
    if (length < 0 || length > c->length)
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_kv_cache_truncate: length %lld; the cache holds %lld "
                             "positions (0 to %lld keeps that many)",
                             (long long)length, (long long)c->length, (long long)c->length);
    c->length = length;
    return EBB_OK;
}

ebb_status ebb_kv_cache_bind(const ebb_kv_cache *c, const ebb_plan *plan, ebb_device device,
                             ebb_tensor **slots, unsigned char *borrowed) {
    if (plan->kv_cache <= 0 && !c)
        return EBB_OK;
    if (plan->kv_cache <= 0)
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_run: plan %s has no key/value cache; "
                             "ebb_run_options.kv_cache is for plans compiled with one",
                             plan->name);
    if (!c)
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_run: plan %s reads and writes a key/value cache of %lld "
                             "positions; give one in ebb_run_options.kv_cache "
                             "(ebb_kv_cache_new)",
                             plan->name, (long long)plan->kv_cache);
    char dc[32], dm[32];
    if (c->device.type != device.type || c->device.index != device.index)
        return ebb_error_set(EBB_ERR_ARG, "ebb_run: the key/value cache is on %s, the model on %s",
                             ebb_device_str(c->device, dc, sizeof dc),
                             ebb_device_str(device, dm, sizeof dm));
    int k = 0;
    for (int v = 0; v < plan->n_values; v++) {
        const ebb_plan_value *pv = &plan->values[v];
        if (pv->kind != EBB_VALUE_STATE)
            continue;
        ebb_shape have = k < c->n ? ebb_tensor_shape(c->t[k]) : (ebb_shape){0};
        if (k >= c->n || !ebb_shape_equal(&have, &pv->shape) ||
            ebb_tensor_dtype(c->t[k]) != pv->dtype) {
            char a[96] = "nothing", b[96];
            if (k < c->n)
                ebb_shape_str(&have, a, sizeof a);
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "ebb_run: plan %s's key/value cache tensor %d is %s %s; the "
                                 "cache given holds %s%s%s (made for another plan: compile "
                                 "both with the same kv_cache, batch and model)",
                                 plan->name, k, ebb_dtype_name(pv->dtype),
                                 ebb_shape_str(&pv->shape, b, sizeof b),
                                 k < c->n ? ebb_dtype_name(ebb_tensor_dtype(c->t[k])) : "", 
                                 k < c->n ? " " : "", a);
        }
        slots[v] = c->t[k++];
        borrowed[v] = 1;
    }
    if (k != c->n)
        return ebb_error_set(EBB_ERR_SHAPE,
                             "ebb_run: plan %s's key/value cache has %d tensors, the cache given "
                             "%d (made for another plan)",
                             plan->name, k, c->n);
    return EBB_OK;
}

ebb_status ebb_kv_cache_advance(ebb_kv_cache *c, int64_t positions) {
    if (!c || positions <= 0)
        return EBB_OK;
    if (c->length + positions > c->capacity)
        return ebb_error_set(EBB_ERR_ARG,
                             "the key/value cache holds %lld positions: %lld are filled and the "
                             "run added %lld",
                             (long long)c->capacity, (long long)c->length, (long long)positions);
    c->length += positions;
    return EBB_OK;
}
