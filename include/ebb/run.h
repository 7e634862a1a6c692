/*
 * ebb/run.h - models (parameters on a device) and running plans.
 *
 *     ebb_model *m = NULL;
 *     ebb_model_new(&m, plan, ebb_device_cpu(), 42);  // PyTorch-default init
 *     ebb_tensor *y = NULL;
 *     ebb_run_stats st;
 *     if (ebb_run(plan, m, &x, &y, &st) != EBB_OK) ... ebb_errmsg() ...
 *     printf("measured %lld, planned %lld\n", st.measured_peak_bytes, st.planned_peak_bytes);
 *     ebb_tensor_free(y);
 *     ebb_model_free(m);
 *
 * A plan is immutable and a run keeps its state (value slots, loop counters)
 * in a context of its own, so one plan and one model can serve several
 * threads at once. A run that fails part-way frees every intermediate it made
 * and returns a status whose message names the step and the node.
 */
#ifndef EBB_RUN_H
#define EBB_RUN_H

#include "dist.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Generation's key/value cache: see "key/value cache" below. */
typedef struct ebb_kv_cache ebb_kv_cache;

/* (declared in optim.h and run.h alike; C99 allows one typedef) */
#ifndef EBB_MODEL_TYPEDEF
#define EBB_MODEL_TYPEDEF
typedef struct ebb_model ebb_model;
#endif

/* Creates the plan's parameters on `device`, initialised as PyTorch's modules
 * do (nn.Linear: U(-1/sqrt(in), 1/sqrt(in)); LayerNorm: ones and zeros), from
 * a generator seeded with `seed` and the parameter's name. Names follow
 * PyTorch: "<node name or path>.<param>", e.g. "stem.weight". */
EBB_API ebb_status ebb_model_new(ebb_model **out, const ebb_plan *plan, ebb_device device, uint64_t seed);
/* Frees the model and its parameter tensors (handles from ebb_model_param()
 * die with it). NULL is allowed. */
EBB_API void ebb_model_free(ebb_model *m);
/* The device the parameters live on. NULL m: the CPU. */
EBB_API ebb_device ebb_model_device(const ebb_model *m);
/* Number of parameters. NULL m: 0. */
EBB_API int ebb_model_param_count(const ebb_model *m);
/* The full name of parameter i ("stem.weight"), owned by the model. NULL m or
 * i out of range: NULL. */
EBB_API const char *ebb_model_param_name(const ebb_model *m, int i);
/* The parameter tensor (borrowed: do not free), or NULL. */
EBB_API ebb_tensor *ebb_model_param(const ebb_model *m, const char *name);
/* Reads every parameter from a safetensors file, by name. Every name,
 * dtype and shape is checked before any value changes; when anything does
 * not match, the call fails (EBB_ERR_SHAPE when some tensor has the wrong
 * dtype or shape, else EBB_ERR_ARG), leaves the model as it was, and its
 * one message names the file and lists every problem, as PyTorch's
 * load_state_dict does: the missing parameters, the unexpected tensors
 * (names the model has no parameter for, such as the `num_batches_tracked`
 * of a BatchNorm the model keeps no counter for), and
 * each tensor of the wrong shape or dtype with both shapes:
 *     w.safetensors: 4 tensors do not match the model (2 missing, 1
 *     unexpected, 1 of the wrong dtype or shape): missing parameters
 *     'fc1.weight', 'fc2.bias'; unexpected tensor 'head.weight' (the model
 *     has no such parameter); parameter 'fc3.weight' is float32 [10, 64] in
 *     the file, the model needs float32 [10, 128]
 * A single problem reads "w.safetensors: missing parameter 'fc1.bias'". A
 * tensor in a dtype ebb has no tensors of (I8, F8_E4M3) is listed with its
 * dtype, not as missing. Past about 2 KiB the names are counted ("and 12
 * more not listed"); ebb_model_load_ex() with non_strict and a mismatch
 * callback gets the whole list. Each tensor is read (pread) straight into
 * its parameter. A file that shrinks during the load (truncated by another
 * process) is an EBB_ERR_IO error, and the parameters read until then hold
 * the file's values: discard or reload the model. So is a tensor whose
 * bytes do not match the CRC-32 ebb wrote beside it, EBB_ERR_CORRUPT naming
 * the tensor (see ebb_model_load_options.damaged). */
EBB_API ebb_status ebb_model_load(ebb_model *m, const char *path);

/* Called by ebb_model_load_ex() for each parameter that holds NaN or
 * infinite values: the file, the parameter's name, how many and of how many. */
typedef void (*ebb_nonfinite_fn)(const char *path, const char *name, int64_t count, int64_t numel,
                                 void *user);

/* What a non-strict load skipped (see ebb_model_load_options.non_strict). */
typedef struct ebb_load_report {
    const char *path;  /* the file */
    const char *text;  /* the message a strict load fails with, every name listed */
    int n_missing;     /* parameters the file lacks: they keep their values */
    int n_unexpected;  /* tensors of the file the model has no parameter for: ignored */
    int n_mismatched;  /* tensors of the wrong dtype or shape: not read, the parameter kept */
    int n_loaded;      /* parameters read from the file */
} ebb_load_report;
typedef void (*ebb_load_mismatch_fn)(const ebb_load_report *report, void *user);
/* Called for a tensor whose bytes do not match the checksum ebb wrote beside
 * it (see ebb_model_load_options.damaged): the file, the parameter's name,
 * and the message a strict load fails with. */
typedef void (*ebb_damaged_fn)(const char *path, const char *name, const char *message,
                               void *user);

/* Zero-initialised options give ebb_model_load()'s behaviour. */
typedef struct ebb_model_load_options {
    int strict_finite;          /* a parameter holding NaN or Inf is an error (EBB_ERR_ARG) */
    ebb_nonfinite_fn nonfinite; /* else, when not NULL, called for each such parameter */
    void *user;                 /* passed to nonfinite and mismatch */
    /* Like load_state_dict(strict=False), and further: missing parameters,
     * unexpected tensors and tensors of the wrong dtype or shape are not an
     * error. The parameters that match are read; every other parameter
     * keeps the value it had. */
    int non_strict;
    /* With non_strict, when not NULL: called once, before any value is
     * read, when something does not match (never when all matches). */
    ebb_load_mismatch_fn mismatch;
    /* A tensor whose bytes do not match their checksum (flipped bits) is
     * an error, EBB_ERR_CORRUPT naming it; when `damaged` is not NULL, it
     * is read as the file has it and reported here instead (--non-strict). */
    ebb_damaged_fn damaged;
} ebb_model_load_options;
/* ebb_model_load() with options (NULL: none, a strict load). The NaN and Inf
 * count is taken from the bytes as they are read, not in a second pass. With
 * strict_finite the parameters before the offending one have been loaded when
 * it fails. */
EBB_API ebb_status ebb_model_load_ex(ebb_model *m, const char *path, const ebb_model_load_options *opts);

/* Writes every parameter to a safetensors file, as ebb_safetensors_write()
 * does: a regular file is replaced atomically (a temporary file renamed into
 * place, keeping the old file's permissions), a link is followed, a
 * character device or pipe written into, anything else refused. */
EBB_API ebb_status ebb_model_save(const ebb_model *m, const char *path);
/* Replaces a parameter's values (shape and dtype must match; copied). */
EBB_API ebb_status ebb_model_set_param(ebb_model *m, const char *name, const ebb_tensor *value);

/* What the trace callback sees for each executed step. */
typedef struct ebb_trace_event {
    int step; /* index into the plan */
    const ebb_plan_step *info;
    const int *freed; /* slots released after the step (the edge taken) */
    int n_freed;
    int jumped;             /* the step took its jump */
    int64_t live_bytes;     /* measured: allocator bytes above the run's start, after the
                               step's frees */
    int64_t peak_bytes;     /* measured: the allocator's high-water mark during the step
                               (its call, outputs and scratch), above the run's start;
                               compare with info->peak_bytes, the plan's figure */
    double seconds;         /* wall time of the step (synchronised on CUDA) */
    int64_t planned_peak_bytes; /* the plan's figure for the step on the run's device:
                                   info->peak_bytes on the CPU; on CUDA with the
                                   allocator's 512-byte blocks and the kernels' scratch */
} ebb_trace_event;

typedef void (*ebb_trace_fn)(const ebb_trace_event *ev, void *user);

typedef struct ebb_run_stats {
    int64_t measured_peak_bytes; /* allocator peak above the bytes at run start */
    int64_t planned_peak_bytes;  /* ebb_plan_device_peak_bytes() for the model's device */
    int64_t steps_executed;
    double seconds;
    /* The first step whose own measured peak went above the plan's figure
     * for it (ebb_plan_step.peak_bytes), and by how many bytes; -1 and 0 when
     * none did. Checked on the CPU, where every step is measured (with
     * another thread allocating at the same time the figures are not the
     * run's); on CUDA compare measured_peak_bytes with planned_peak_bytes. A
     * step above its plan is a bug in an op's declared scratch: `ebb run`,
     * `ebb grad` and `ebb train` warn, and fail with --strict-memory. */
    int over_step;
    int64_t over_bytes;
} ebb_run_stats;

typedef struct ebb_run_options {
    ebb_trace_fn trace; /* called after every step, or NULL */
    void *trace_user;
    int check_fits;     /* refuse, before any step, a run that ebb_plan_check_fits()
                           says cannot fit (EBB_ERR_NOMEM) */
    uint64_t seed;      /* training plans: the seed dropout's masks are drawn from */
    /* training plans: the gradient the backward starts from, d(loss)/d(loss);
     * 0 means 1. Every gradient comes out scaled by it, as from
     * (loss * loss_scale).backward() in PyTorch (gradient accumulation's
     * 1/N, a loss scaler's factor); the loss read back is not scaled. */
    double loss_scale;
    /* training plans compiled with ebb_train_options.parallel: the
     * group their all-reduce steps average over (its world size must be the
     * plan's); NULL for other plans. */
    ebb_dist *dist;
    /* Training plans compiled with ebb_train_options.accumulate: this run
     * is micro-batch `micro_batch` (from 0) of the `micro_batches` that
     * make one update. Its gradients are added into the sums (the first
     * copied); only the last goes on to the update. 0 and 0: the whole
     * step in one run. */
    int micro_batch, micro_batches;
    /* Plans compiled with ebb_compile_options.kv_cache (and only those):
     * the key/value cache the run reads and writes. The run's tokens stand
     * at the positions after those the cache holds (ebb_kv_cache_length);
     * a run that succeeds adds its positions to them, one that fails
     * leaves the count as it was. */
    ebb_kv_cache *kv_cache;
} ebb_run_options;

/* Runs the plan. `inputs` holds one tensor per graph input (borrowed; never
 * freed by the run), on the model's device, with the compiled dtype and rank.
 * Sizes may differ from the compiled shapes where the ops allow it (another
 * batch size, say); the plan's byte predictions are for the compiled ones. On success `outputs` receives one
 * new handle per graph output, which the caller frees. `stats` may be NULL.
 * Measured peak bytes are exact on the CPU when no other thread allocates
 * at the same time. */
EBB_API ebb_status ebb_run(const ebb_plan *plan, const ebb_model *model, ebb_tensor *const *inputs,
                   ebb_tensor **outputs, ebb_run_stats *stats);
/* ebb_run() with options (NULL: none): a per-step trace callback and the
 * check_fits refusal. NULL plan, model or outputs, NULL inputs for a plan with
 * inputs, or a NULL input tensor: EBB_ERR_ARG. */
EBB_API ebb_status ebb_run_ex(const ebb_plan *plan, const ebb_model *model, ebb_tensor *const *inputs,
                      ebb_tensor **outputs, const ebb_run_options *opts, ebb_run_stats *stats);

/* ---- key/value cache ------------------------------------------------------
 *
 * Generation compiles two plans from one graph with the same kv_cache
 * length (ebb_compile_options.kv_cache): one for the prompt, [B, T], and
 * one for each next token, [B, 1]. Both read and write one ebb_kv_cache:
 *
 *     ebb_kv_cache *kv = NULL;
 *     ebb_kv_cache_new(&kv, prompt_plan, ebb_model_device(m));
 *     ebb_run_options ro = {.kv_cache = kv};
 *     ebb_run_ex(prompt_plan, m, &prompt, &logits, &ro, NULL);  // fills 0..T-1
 *     ebb_run_ex(next_plan, m, &token, &logits, &ro, NULL);     // position T
 *     ...
 *     ebb_kv_cache_free(kv);
 *
 * The cache holds each causal attention's keys and values for every
 * position so far: one tensor per EBB_VALUE_STATE value of the plan,
 * ebb_plan_kv_cache_bytes() in all, made once. A cache serves one model
 * and one sequence batch at a time, so a thread runs its own. */

/* A cache of zeros for `plan`'s keys and values, on `device` (the model's),
 * with no position filled. EBB_ERR_ARG when the plan has no cache, or
 * EBB_ERR_NOMEM. Free with ebb_kv_cache_free(). */
EBB_API ebb_status ebb_kv_cache_new(ebb_kv_cache **out, const ebb_plan *plan, ebb_device device);
/* Frees the cache and its tensors. NULL is allowed. */
EBB_API void ebb_kv_cache_free(ebb_kv_cache *c);
/* The positions filled so far: where the next run's tokens start. NULL c: 0. */
EBB_API int64_t ebb_kv_cache_length(const ebb_kv_cache *c);
/* How many positions the cache can hold (the plan's kv_cache). NULL c: 0. */
EBB_API int64_t ebb_kv_cache_capacity(const ebb_kv_cache *c);
/* The bytes its tensors hold. NULL c: 0. */
EBB_API int64_t ebb_kv_cache_bytes(const ebb_kv_cache *c);
/* Forgets the positions from `length` on, which the next run writes again:
 * 0 starts a new sequence. EBB_ERR_ARG when length is negative or more than
 * the positions filled. */
EBB_API ebb_status ebb_kv_cache_truncate(ebb_kv_cache *c, int64_t length);

/* ---- will it fit? ------------------------------------------------------ */

/* A plan's needs against what the process can get (ebb_plan_check_fits). */
typedef struct ebb_fit {
    int64_t needed_bytes;    /* the sum of the four below */
    int64_t peak_bytes;      /* ebb_plan_device_peak_bytes(plan, device) */
    int64_t param_bytes;     /* the plan's parameters and a training plan's optimizer state
                                (ebb_plan_optimizer_state_bytes); 0 when a model holds them */
    int64_t input_bytes;     /* as passed: inputs (or anything else) not allocated yet */
    int64_t reserve_bytes;   /* CPU: what running ops maps besides tensors (BLAS
                                buffers, one stack per intra-op thread); 0 on CUDA */
    int peak_step;           /* the step where the peak is */
    int64_t available_bytes; /* what the process can still get; -1 when unknown */
    const char *limit;       /* the limit that gives it: "RLIMIT_AS", "RLIMIT_DATA",
                                "cgroup memory limit", "MemAvailable", "free CUDA
                                memory"; NULL if unknown */
} ebb_fit;

/* Compares what a run of `plan` on `device` needs with what this process can
 * still get, before anything runs. On the CPU the process can get the least
 * of: RLIMIT_AS minus its mapped address space, RLIMIT_DATA minus its data
 * segment, its memory cgroup's limit minus usage (v1 or v2, every ancestor,
 * reclaimable page cache counted as free), and the system's MemAvailable.
 * On CUDA it can get the driver's free bytes plus the caching allocator's
 * unused blocks (ebb_device_memory_available()); a build without CUDA has no
 * figure, and the check passes with available_bytes -1.
 *
 * `model` is the model that will run it, or NULL when its parameters are not
 * allocated yet (they are then counted); `input_bytes` adds inputs the caller
 * has yet to allocate. `fit` (may be NULL) receives the figures either way.
 * Returns EBB_OK when the run fits or nothing is known, and EBB_ERR_NOMEM
 * when it cannot fit, with one line naming both figures:
 *     plan mlp needs 2.1 GiB at step 3 (fc2), this process can get 1.2 GiB
 *     (RLIMIT_AS): 2.0 GiB intermediates + 102.0 KiB parameters + ...
 * A plan whose peak is a bound (routing, while loops) is held to the bound.
 * Reading the limits costs a few /proc reads: call it once before a series
 * of runs, not before each. */
EBB_API ebb_status ebb_plan_check_fits(const ebb_plan *plan, ebb_device device, const ebb_model *model,
                               int64_t input_bytes, ebb_fit *fit);

/* ---- CUDA graph replay ---------------------------------------------------- */

typedef struct ebb_capture ebb_capture;

/* Captures one run of the plan, for the shapes of `inputs`, into a CUDA
 * graph that ebb_capture_replay() relaunches with one call. The plan being
 * static is what makes this possible; plans whose control flow depends on
 * data (a switch, a top-k gate, a while/until loop) cannot be captured whole,
 * and the call says so (EBB_ERR_UNSUPPORTED, naming the step) instead of
 * capturing one path. `for` loops are fine. A plan with a key/value cache is
 * refused too (EBB_ERR_UNSUPPORTED): its positions are handed to its steps
 * by each run, which a graph would record once. Needs a model on a CUDA
 * device and a build with CUDA. The capture keeps its own copies of the
 * inputs. */
EBB_API ebb_status ebb_plan_capture(ebb_capture **out, const ebb_plan *plan, const ebb_model *model,
                            ebb_tensor *const *inputs);
/* Copies `inputs` (same shapes as at capture) into the graph's input buffers,
 * replays it, and returns new handles on the graph's output buffers: their
 * values are overwritten by the next replay. Inputs that an embedding looks
 * up (token ids) are checked against its table before the replay (a read
 * back): CUDA's kernel would assert on one out of range, which a graph
 * cannot report. */
EBB_API ebb_status ebb_capture_replay(ebb_capture *c, ebb_tensor *const *inputs, ebb_tensor **outputs);
/* Frees a capture from ebb_plan_capture(): its CUDA graph and its own input
 * and output handles (the caller still frees handles it got from replays).
 * NULL is allowed. */
EBB_API void ebb_capture_free(ebb_capture *c);

#ifdef __cplusplus
}
#endif
#endif /* EBB_RUN_H */
