/* Pieces the bench programs share (bench_ebb.c, bench_fashion.c,
 * bench_remat.c, bench_first_steps.c, bench_precision.c, bench_generate.c): the error reply of
 * their protocol, the export run.py's load_export reads (a JSON manifest of
 * float32 tensors and one .bin of their values), and the seeded targets. */
#ifndef EBB_BENCH_UTIL_H
#define EBB_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>

#include "ebb/ebb.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor of the export: its manifest entry (comma-separated after the
 * first; *first is cleared) and its n float32 values at *offset (advanced). */
ebb_status bench_export_floats(FILE *js, FILE *bin, int *first, long long *offset,
                               const char *name, const ebb_shape *s, const float *data);
/* The same for a tensor of any device and dtype, converted to float32. */
ebb_status bench_export_tensor(FILE *js, FILE *bin, int *first, long long *offset,
                               const char *name, const ebb_tensor *t);

/* PREFIX.json and PREFIX.bin: the model's parameters in its order (float32;
 * an int64 counter as its values), then "input:x" and "target:y" (each left
 * out when NULL). */
ebb_status bench_export_model(const char *prefix, const ebb_model *m, const ebb_tensor *x,
                              const ebb_tensor *y);

/* `s` as a JSON string, quoted, its quotes, backslashes and newlines escaped. */
void bench_json_string(FILE *f, const char *s);

/* The protocol's reply to a failed command: one line {"error": MESSAGE} on
 * stdout with ebb_errmsg() escaped, flushed. */
void bench_reply_error(void);

/* int64 values in [0, n_classes) of shape s, from an LCG seeded with
 * `seed`: class targets, or a language model's token ids. */
ebb_status bench_seeded_indices(const ebb_shape *s, int64_t n_classes, uint64_t seed,
                                ebb_device dev, ebb_tensor **out);

/* The target a bench trains against: for "cross_entropy" on an output
 * [B, C], int64 classes in [0, C) from a seeded LCG (*dtype EBB_INT64, *ys
 * [B]), and per token on an output [B, T, V] classes in [0, V) (*ys
 * [B, T]); for any other loss a seeded randn of the output's shape. */
ebb_status bench_seeded_target(const char *loss, const ebb_shape *out, uint64_t seed,
                               ebb_device dev, ebb_tensor **y, ebb_shape *ys, ebb_dtype *dtype);

#ifdef __cplusplus
}
#endif
#endif
