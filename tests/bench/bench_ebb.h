/*
 * The ebb side of the benchmark, in C over the public API only: a spec is
 * loaded (with its `params:` line replaced for the configuration), compiled
 * for the bound symbolic dimensions, given a model and an input, and run;
 * or compiled as a training step (bench_ebb_setup_train) and stepped.
 * bench_main.cpp drives it next to the hand-written libtorch twins.
 */
#ifndef EBB_BENCH_EBB_H
#define EBB_BENCH_EBB_H

#include <stddef.h>
#include <stdint.h>

#include "ebb/ebb.h"
#include "ebb/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bench_ebb bench_ebb;

typedef struct bench_ebb_memory {
    int64_t measured_peak;    /* ebb_run_stats.measured_peak_bytes */
    int64_t planned_peak;     /* ebb_plan_peak_bytes */
    int64_t keep_all_measured; /* the same graph compiled with keep_all=1, run */
    int64_t keep_all_planned;  /* ebb_plan_peak_bytes of that plan */
    int64_t steps_executed;
    int n_steps;
} bench_ebb_memory;

/* Loads `spec_path` with its single-line `params:` map replaced by
 * "params: {<params_csv>}" ("d=64,hidden=128"; empty keeps the file's),
 * resolves the symbolic dims from `bind_csv` ("batch=8,seq=16"), compiles,
 * creates the model on `device` (seeded), sets the parameters listed in
 * `fills_csv` ("halt.bias=-1000") to a constant, and draws a seeded input
 * there: randn, or for an input the spec declares int64 (a language
 * model's idx) token ids in [0, V), V the output's last dim. Returns EBB_OK or a status with the message in ebb_errmsg(). */
ebb_status bench_ebb_setup(bench_ebb **out, const char *spec_path, const char *params_csv,
                           const char *bind_csv, const char *fills_csv, uint64_t seed,
                           ebb_device device);
void bench_ebb_free(bench_ebb *b);

/* One forward: ebb_run, then the output handle is released. */
ebb_status bench_ebb_forward(bench_ebb *b);

/* Runs once with stats, then compiles and runs the keep_all twin. */
ebb_status bench_ebb_measure(bench_ebb *b, bench_ebb_memory *m);

/* A training step instead of a forward: the same spec compiled with
 * ebb_compile_options.train (loss `loss` against a seeded target: for
 * "cross_entropy" int64 classes in [0, C) for an output [B, C], or per token
 * [B, T] in [0, V) for an output [B, T, V]; else a randn tensor of the
 * output's shape), an AdamW optimizer (lr 1e-3, torch's defaults), the model seeded as bench_ebb_setup's; model, optimizer state,
 * input and target all on `device`. A spec ebb cannot train yet (routing,
 * loops) fails with EBB_ERR_UNSUPPORTED and the compiler's message. The
 * parameter and input getters below work on it too (they copy to the host);
 * its export holds "target:y" (as float32) instead of "output:y". */
ebb_status bench_ebb_setup_train(bench_ebb **out, const char *spec_path, const char *params_csv,
                                 const char *bind_csv, const char *fills_csv, const char *loss,
                                 uint64_t seed, ebb_device device);
/* bench_ebb_setup_train() with the training step compiled at `precision`
 * (ebb_compile_options.precision: EBB_PRECISION_BF16 runs the matrix
 * products in bfloat16, as torch.autocast); the model, its optimizer state,
 * the input and the target are the same whatever the precision. */
ebb_status bench_ebb_setup_train_ex(bench_ebb **out, const char *spec_path,
                                    const char *params_csv, const char *bind_csv,
                                    const char *fills_csv, const char *loss,
                                    ebb_precision precision, uint64_t seed, ebb_device device);
/* The compiled plan (owned by the bench). */
const ebb_plan *bench_ebb_plan(const bench_ebb *b);
/* Non-zero for a bench set up with bench_ebb_setup_train. */
int bench_ebb_is_training(const bench_ebb *b);
/* One training step (ebb_train_step); *loss (may be NULL) receives the loss,
 * stats (may be NULL) the measured and planned peak. */
ebb_status bench_ebb_train_step(bench_ebb *b, double *loss, ebb_run_stats *stats);
/* The training step captured into a CUDA graph (ebb_train_capture, run seed
 * 0), once; then one replay of it on the same input and target
 * (ebb_capture_train_step). */
ebb_status bench_ebb_capture_train(bench_ebb *b);
ebb_status bench_ebb_captured_step(bench_ebb *b, double *loss);
/* Whether parameter i gets a gradient (not a buffer). */
int bench_ebb_param_trained(const bench_ebb *b, int i);
/* The target's shape, and whether it holds class indices (int64). */
ebb_shape bench_ebb_target_shape(const bench_ebb *b);
int bench_ebb_target_is_class(const bench_ebb *b);
/* The target as float32 (class indices are small whole numbers). */
ebb_status bench_ebb_target_host(const bench_ebb *b, float *dst, size_t n);
/* Steps of the training plan by phase: forward, loss, backward, update. */
void bench_ebb_phase_counts(const bench_ebb *b, int counts[4]);
/* The step where the plan predicts its peak (owned by the plan). */
const ebb_plan_step *bench_ebb_peak_step(const bench_ebb *b);

/* The EXPLAIN listing of the compiled plan. */
void bench_ebb_explain(const bench_ebb *b, FILE *f);

/* Parameters in plan order (what the twins consume), the input and one
 * reference output, as float32 host copies. */
int bench_ebb_param_count(const bench_ebb *b);
const char *bench_ebb_param_name(const bench_ebb *b, int i);
ebb_shape bench_ebb_param_shape(const bench_ebb *b, int i);
ebb_status bench_ebb_param_host(const bench_ebb *b, int i, float *dst, size_t n);
ebb_shape bench_ebb_input_shape(const bench_ebb *b);
/* Non-zero when the input holds int64 token ids (the host copy is float32). */
int bench_ebb_input_is_index(const bench_ebb *b);
ebb_status bench_ebb_input_host(const bench_ebb *b, float *dst, size_t n);
/* Runs once and copies the first output. */
ebb_status bench_ebb_output_host(bench_ebb *b, ebb_shape *shape, float **dst);

/* Writes PREFIX.json (names, shapes, float offsets) and PREFIX.bin (the
 * float32 values): every parameter in plan order, then "input:x" and
 * "output:y", for the PyTorch side. */
ebb_status bench_ebb_export(bench_ebb *b, const char *prefix);

#ifdef __cplusplus
}
#endif
#endif
