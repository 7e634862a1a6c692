/* The tensor layer's process-wide setup (ebb_init, ops/init.c, calls it),
 * dtypes and device names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__) /* (from the headers above) */
#include <malloc.h>
#endif

#include "ebb/common.h"
#include "internal.h"

/* A plan frees most of a step's bytes by its end and the next step asks for
 * them again. glibc's default gives such memory back to the kernel (trims
 * the heap, unmaps large blocks) and the next step faults every page in
 * anew: a Fashion-MNIST CNN step spent 28% of its time there (39 ms against
 * 28 ms). Freed memory stays in the process instead, as PyTorch's callers
 * get from its allocator. A process that configured malloc itself
 * (GLIBC_TUNABLES, MALLOC_*_ variables) keeps its settings. */
static void keep_freed_memory(void) {
#if defined(__GLIBC__)
    static const char *const vars[] = {"GLIBC_TUNABLES", "MALLOC_TRIM_THRESHOLD_",
                                       "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_",
                                       "MALLOC_MMAP_MAX_"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20); /* glibc's largest: blocks below it are reused */
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

ebb_status ebb_tensor_process_init(void) {
    keep_freed_memory();
    ebb_status st = ebb_tensor_layer_init();
    return st == EBB_OK ? ebb_tensor_threads_init() : st;
}

const char *ebb_version(void) { return EBB_VERSION; }

const char *ebb_dtype_name(ebb_dtype dtype) {
    switch (dtype) {
    case EBB_FLOAT32: return "float32";
    case EBB_FLOAT16: return "float16";
    case EBB_BFLOAT16: return "bfloat16";
    case EBB_FLOAT64: return "float64";
    case EBB_INT64: return "int64";
    case EBB_INT32: return "int32";
    case EBB_UINT8: return "uint8";
    case EBB_BOOL: return "bool";
    }
    return "unknown";
}

size_t ebb_dtype_size(ebb_dtype dtype) {
    switch (dtype) {
    case EBB_FLOAT32: return 4;
    case EBB_FLOAT16: return 2;
    case EBB_BFLOAT16: return 2;
    case EBB_FLOAT64: return 8;
    case EBB_INT64: return 8;
    case EBB_INT32: return 4;
    case EBB_UINT8: return 1;
    case EBB_BOOL: return 1;
    }
    return 0;
}

ebb_status ebb_dtype_parse(ebb_dtype *out, const char *name) {
    static const ebb_dtype all[] = {EBB_FLOAT32, EBB_FLOAT16, EBB_BFLOAT16, EBB_FLOAT64,
                                    EBB_INT64,   EBB_INT32,   EBB_UINT8,    EBB_BOOL};
    if (!out || !name)
        return ebb_error_set(EBB_ERR_ARG, "ebb_dtype_parse: NULL argument");
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(name, ebb_dtype_name(all[i])) == 0) {
            *out = all[i];
            return EBB_OK;
        }
    }
    return ebb_error_set(EBB_ERR_ARG,
                         "unknown dtype '%s' (expected float32, float16, bfloat16, float64, "
                         "int64, int32, uint8 or bool)",
                         name);
}

ebb_device ebb_device_default(void) {
    return ebb_cuda_available() ? ebb_device_cuda(0) : ebb_device_cpu();
}

ebb_status ebb_device_parse(ebb_device *out, const char *text) {
    if (!out || !text)
        return ebb_error_set(EBB_ERR_ARG, "ebb_device_parse: NULL argument");
    if (strcmp(text, "cpu") == 0) {
        *out = ebb_device_cpu();
        return EBB_OK;
    }
    if (strcmp(text, "meta") == 0) {
        out->type = EBB_DEVICE_META;
        out->index = 0;
        return EBB_OK;
    }
    if (strncmp(text, "cuda", 4) == 0) {
        int index = 0;
        if (text[4] == ':') {
            char *end = NULL;
            long v = strtol(text + 5, &end, 10);
            if (end == text + 5 || *end || v < 0 || v > 1024)
                return ebb_error_set(EBB_ERR_ARG, "bad device '%s' (expected cpu, cuda or cuda:N)",
                                     text);
            index = (int)v;
        } else if (text[4]) {
            return ebb_error_set(EBB_ERR_ARG, "bad device '%s' (expected cpu, cuda or cuda:N)", text);
        }
        if (!ebb_cuda_available())
            return ebb_error_set(EBB_ERR_UNSUPPORTED,
                                 "device '%s': this build of ebb has no usable CUDA (libtorch %s)",
                                 text, ebb_torch_version());
        if (index >= ebb_cuda_device_count())
            return ebb_error_set(EBB_ERR_ARG, "device '%s': only %d CUDA device(s)", text,
                                 ebb_cuda_device_count());
        *out = ebb_device_cuda(index);
        return EBB_OK;
    }
    return ebb_error_set(EBB_ERR_ARG, "bad device '%s' (expected cpu, cuda or cuda:N)", text);
}

const char *ebb_bytes_str(int64_t b, char *buf, size_t size) {
    if (!buf || size == 0)
        return buf;
    if (b < 1024)
        snprintf(buf, size, "%lld B", (long long)b);
    else if (b < 1024 * 1024)
        snprintf(buf, size, "%.1f KiB", (double)b / 1024.0);
    else if (b < 1024LL * 1024 * 1024)
        snprintf(buf, size, "%.1f MiB", (double)b / (1024.0 * 1024.0));
    else
        snprintf(buf, size, "%.2f GiB", (double)b / (1024.0 * 1024.0 * 1024.0));
    return buf;
}

ebb_status ebb_bytes_parse(const char *text, int64_t *out) {
    static const struct {
        const char *name;
        double scale;
    } units[] = {{"", 1},      {"B", 1},      {"KiB", 0x1p10}, {"MiB", 0x1p20}, {"GiB", 0x1p30},
                 {"TiB", 0x1p40}, {"kB", 1e3}, {"KB", 1e3},   {"MB", 1e6},     {"GB", 1e9},
                 {"TB", 1e12}};
    if (!text || !out)
        return ebb_error_set(EBB_ERR_ARG, "ebb_bytes_parse: text and out are required");
    const char *p = text;
    double v = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++)
        v = v * 10 + (*p - '0');
    if (*p == '.') /* a fraction, as in 1.5GiB */
        for (double f = 0.1; *++p >= '0' && *p <= '9'; f /= 10, digits++)
            v += f * (*p - '0');
    for (size_t i = 0; digits && i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(p, units[i].name)) {
            double b = v * units[i].scale;
            if (b > 0x1p62)
                break;
            /* a fraction of a byte is not a byte: 1.5B is an error */
            if (b != (double)(int64_t)b && units[i].scale == 1)
                break;
            *out = (int64_t)b;
            return EBB_OK;
        }
    return ebb_error_set(EBB_ERR_ARG,
                         "bad byte count '%s' (expected a number with B, KiB, MiB, GiB, TiB, kB, "
                         "MB, GB or TB after it, like 64MiB)",
                         text);
}

const char *ebb_device_str(ebb_device device, char *buf, size_t size) {
    switch (device.type) {
    case EBB_DEVICE_CPU: snprintf(buf, size, "cpu"); break;
    case EBB_DEVICE_META: snprintf(buf, size, "meta"); break;
    case EBB_DEVICE_CUDA: snprintf(buf, size, "cuda:%d", device.index); break;
    default: snprintf(buf, size, "device?"); break;
    }
    return buf;
}
