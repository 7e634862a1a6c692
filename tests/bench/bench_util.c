/* See bench_util.h. */
#include "bench_util.h"

#include <stdlib.h>
#include <string.h>

ebb_status bench_export_floats(FILE *js, FILE *bin, int *first, long long *offset,
                               const char *name, const ebb_shape *s, const float *data) {
    size_t n = (size_t)ebb_shape_numel(s);
    fprintf(js, "%s\n  {\"name\": \"%s\", \"shape\": [", *first ? "" : ",", name);
    for (int d = 0; d < s->ndim; d++)
        fprintf(js, d ? ", %lld" : "%lld", (long long)s->dim[d]);
    fprintf(js, "], \"offset\": %lld}", *offset);
    *first = 0;
    *offset += (long long)n;
    if (fwrite(data, sizeof(float), n, bin) != n)
        return ebb_error_set(EBB_ERR_IO, "bench: short write exporting %s", name);
    return EBB_OK;
}

ebb_status bench_export_tensor(FILE *js, FILE *bin, int *first, long long *offset,
                               const char *name, const ebb_tensor *t) {
    ebb_tensor *f = NULL;
    ebb_status st = ebb_tensor_to(&f, t, ebb_device_cpu(), EBB_FLOAT32);
    ebb_shape s = {0};
    if (st == EBB_OK)
        s = ebb_tensor_shape(f);
    size_t n = (size_t)ebb_shape_numel(&s);
    float *buf = st == EBB_OK ? malloc((n ? n : 1) * sizeof *buf) : NULL;
    if (st == EBB_OK && !buf)
        st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    if (st == EBB_OK)
        st = ebb_tensor_to_host(f, buf, n * sizeof *buf);
    if (st == EBB_OK)
        st = bench_export_floats(js, bin, first, offset, name, &s, buf);
    free(buf);
    ebb_tensor_free(f);
    return st;
}

ebb_status bench_seeded_indices(const ebb_shape *s, int64_t n_classes, uint64_t seed,
                                ebb_device dev, ebb_tensor **out) {
    if (n_classes < 1)
        return ebb_error_set(EBB_ERR_ARG, "bench: indices need at least one class");
    int64_t n = ebb_shape_numel(s);
    int64_t *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v)
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    uint64_t r = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int64_t i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (int64_t)((r >> 33) % (uint64_t)n_classes);
    }
    ebb_status st = ebb_tensor_from_host(out, v, (size_t)n * sizeof *v, s, EBB_INT64, dev);
    free(v);
    return st;
}

ebb_status bench_seeded_target(const char *loss, const ebb_shape *out, uint64_t seed,
                               ebb_device dev, ebb_tensor **y, ebb_shape *ys, ebb_dtype *dtype) {
    if (loss && strcmp(loss, "cross_entropy") == 0) {
        /* classes last: [B, C] against [B], per token [B, T, V] against [B, T] */
        if (out->ndim != 2 && out->ndim != 3)
            return ebb_error_set(EBB_ERR_ARG, "bench: cross_entropy needs a [B, C] or "
                                              "[B, T, V] output");
        *ys = *out;
        ys->dim[--ys->ndim] = 0;
        *dtype = EBB_INT64;
        return bench_seeded_indices(ys, out->dim[out->ndim - 1], seed, dev, y);
    }
    *ys = *out;
    *dtype = EBB_FLOAT32;
    return ebb_tensor_randn(y, ys, EBB_FLOAT32, dev, seed);
}

void bench_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const char *c = s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fputc('\\', f);
        if (*c == '\n')
            fputs("\\n", f);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}

void bench_reply_error(void) {
    printf("{\"error\": ");
    bench_json_string(stdout, ebb_errmsg());
    printf("}\n");
    fflush(stdout);
}

ebb_status bench_export_model(const char *prefix, const ebb_model *m, const ebb_tensor *x,
                              const ebb_tensor *y) {
    char path[4200];
    snprintf(path, sizeof path, "%s.json", prefix);
    FILE *js = fopen(path, "w");
    snprintf(path, sizeof path, "%s.bin", prefix);
    FILE *bin = fopen(path, "wb");
    ebb_status st = js && bin ? EBB_OK : ebb_error_set(EBB_ERR_IO, "bench: cannot write %s", path);
    long long offset = 0;
    int first = 1;
    if (st == EBB_OK)
        fprintf(js, "{\"tensors\": [");
    for (int i = 0; st == EBB_OK && i < ebb_model_param_count(m); i++) {
        const char *name = ebb_model_param_name(m, i);
        st = bench_export_tensor(js, bin, &first, &offset, name, ebb_model_param(m, name));
    }
    if (st == EBB_OK && x)
        st = bench_export_tensor(js, bin, &first, &offset, "input:x", x);
    if (st == EBB_OK && y)
        st = bench_export_tensor(js, bin, &first, &offset, "target:y", y);
    if (st == EBB_OK)
        fprintf(js, "\n]}\n");
    if (js)
        fclose(js);
    if (bin)
        fclose(bin);
    return st;
}
