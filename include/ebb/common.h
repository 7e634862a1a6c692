/*
 * ebb/common.h - status codes, the last error, initialisation, devices, dtypes.
 *
 * Every fallible ebb function returns an ebb_status; EBB_OK is 0. On failure
 * the message is in ebb_errmsg(), kept per thread like sqlite3_errmsg() and
 * git_error_last(). Messages name the thing that failed: the node path, the
 * spec FILE:LINE:COL, both shapes of a mismatch.
 *
 *     if (ebb_init() != EBB_OK) { fprintf(stderr, "%s\n", ebb_errmsg()); ... }
 */
#ifndef EBB_COMMON_H
#define EBB_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* Marks the public API: libebb is built with hidden visibility, so only
 * functions declared with EBB_API are exported from the shared library. */
#if defined(__GNUC__) || defined(__clang__)
#define EBB_API __attribute__((visibility("default")))
#else
#define EBB_API
#endif

/* Variadic builder calls end their node lists with NULL; the compiler checks. */
#if defined(__GNUC__) || defined(__clang__)
#define EBB_SENTINEL __attribute__((sentinel))
#else
#define EBB_SENTINEL
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ebb_status {
    EBB_OK = 0,
    EBB_ERR_ARG,         /* a bad argument: NULL, unknown name, wrong count */
    EBB_ERR_SHAPE,       /* shapes or dtypes that do not fit together */
    EBB_ERR_NOMEM,       /* host or device memory exhausted */
    EBB_ERR_TORCH,       /* libtorch raised an error not covered above */
    EBB_ERR_BUILD,       /* a graph builder call was invalid (sticky) */
    EBB_ERR_SPEC,        /* a YAML spec is malformed */
    EBB_ERR_IO,          /* a file could not be read or written */
    EBB_ERR_RUNTIME,     /* a data-dependent failure while running a plan */
    EBB_ERR_UNSUPPORTED, /* not available in this build or on this device */
    EBB_ERR_BUDGET,      /* a plan cannot meet the memory budget it was compiled for
                            (ebb_compile_options.memory_budget): the caller's number,
                            not memory that ran out */
    EBB_ERR_DIST,        /* another process of a process group was lost, or a collective
                            or the rendezvous timed out (ebb/dist.h) */
    EBB_ERR_CORRUPT,     /* a file's bytes do not match the checksum written beside
                            them: flipped bits, a bad disk or a bad copy */
} ebb_status;

/* A short constant name for a status, e.g. "EBB_ERR_SHAPE" (a static string);
 * "EBB_ERR_UNKNOWN" for a value outside the enum. */
EBB_API const char *ebb_status_name(ebb_status status);

/* The message of the last error raised on this thread, or "" if none. The
 * pointer stays valid until the next failing ebb call on the same thread. */
EBB_API const char *ebb_errmsg(void);

/* The status of the last error raised on this thread (EBB_OK if none). */
EBB_API ebb_status ebb_errcode(void);

/* Records `status` and a printf-style message as this thread's last error and
 * returns `status`. User-registered operators call it to report failures:
 *     return ebb_error_set(EBB_ERR_SHAPE, "myop: expected 2-D input, got %d-D", nd); */
EBB_API ebb_status ebb_error_set(ebb_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Prefixes the current error message with "prefix: " (used to add context
 * such as a node path as an error travels up). Returns the current status. */
EBB_API ebb_status ebb_error_prefix(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* Clears this thread's last error. */
EBB_API void ebb_error_clear(void);

/* Initialises the library once per process: installs the accounting CPU
 * allocator and registers the built-in operators. Safe to call repeatedly
 * and from several threads; call it before any other ebb function. */
EBB_API ebb_status ebb_init(void);

/* ebb's version, e.g. "0.1.0". */
EBB_API const char *ebb_version(void);

/* The version of libtorch ebb was built against, e.g. "1.13.0". */
EBB_API const char *ebb_torch_version(void);

/* ---- dtypes ------------------------------------------------------------ */

typedef enum ebb_dtype {
    EBB_FLOAT32 = 0,
    EBB_FLOAT16,
    EBB_BFLOAT16,
    EBB_FLOAT64,
    EBB_INT64,
    EBB_INT32,
    EBB_UINT8,
    EBB_BOOL,
} ebb_dtype;

/* "float32", "int64", ... (a static string); "unknown" outside the enum. */
EBB_API const char *ebb_dtype_name(ebb_dtype dtype);
/* Bytes per element; 0 for a value outside the enum. */
EBB_API size_t ebb_dtype_size(ebb_dtype dtype);
/* Parses a dtype name; EBB_ERR_ARG for an unknown one or a NULL argument. */
EBB_API ebb_status ebb_dtype_parse(ebb_dtype *out, const char *name);

/* ---- devices ----------------------------------------------------------- */

typedef enum ebb_device_type {
    EBB_DEVICE_CPU = 0,
    EBB_DEVICE_CUDA = 1,
    EBB_DEVICE_META = 2, /* shapes only, no storage: used by the compiler */
} ebb_device_type;

typedef struct ebb_device {
    ebb_device_type type;
    int index; /* CUDA ordinal; 0 for CPU */
} ebb_device;

static inline ebb_device ebb_device_cpu(void) {
    ebb_device d = {EBB_DEVICE_CPU, 0};
    return d;
}
static inline ebb_device ebb_device_cuda(int index) {
    ebb_device d = {EBB_DEVICE_CUDA, index};
    return d;
}

/* Non-zero when this build has CUDA and a CUDA device is present. */
EBB_API int ebb_cuda_available(void);
/* Number of CUDA devices (0 without CUDA). */
EBB_API int ebb_cuda_device_count(void);
/* CUDA device 0 when available, else the CPU. */
EBB_API ebb_device ebb_device_default(void);
/* Parses "cpu", "cuda" or "cuda:N". Fails for CUDA in a build without it;
 * NULL out or text: EBB_ERR_ARG. */
EBB_API ebb_status ebb_device_parse(ebb_device *out, const char *text);
/* Writes "cpu" or "cuda:N" into buf (always NUL-terminated); returns buf. */
EBB_API const char *ebb_device_str(ebb_device device, char *buf, size_t size);
/* Writes a byte count for people into buf ("512 B", "8.0 KiB", "1.4 MiB",
 * "2.25 GiB"; always NUL-terminated unless size is 0); returns buf. */
EBB_API const char *ebb_bytes_str(int64_t bytes, char *buf, size_t size);
/* Reads a byte count as people write it: a number, a decimal fraction
 * allowed, then nothing (bytes) or a unit B, KiB, MiB, GiB, TiB (powers of
 * 1024) or kB, KB, MB, GB, TB (powers of 1000), with no space: "64MiB",
 * "1.5GiB", "300000". EBB_ERR_ARG, naming the text, for anything else,
 * a negative count or one past 2^62; *out is then untouched. */
EBB_API ebb_status ebb_bytes_parse(const char *text, int64_t *out);
/* Waits for all queued work on the device (a no-op on CPU). Call it before
 * reading a clock. */
EBB_API ebb_status ebb_device_synchronize(ebb_device device);
/* Allows or forbids TF32 in CUDA matmuls and convolutions (a no-op in a build
 * without CUDA). Comparisons against float32 CPU results need it off. */
EBB_API ebb_status ebb_cuda_set_tf32(int enabled);

#ifdef __cplusplus
}
#endif
#endif /* EBB_COMMON_H */
