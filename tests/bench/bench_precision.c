#define _POSIX_C_SOURCE 200809L
/* `ebb_bench precision`: the ebb side of the mixed-precision training rows
 * (tests/bench/precision.py, `make bench`, issue 29). One workload's
 * training step compiled at several precisions (ebb_compile_options.
 * precision: fp32, bf16), each with its own model and AdamW (lr 1e-3,
 * torch's defaults) from the same seed, so every precision starts from the
 * same weights, input and target; stepped, measured and timed through the
 * public C API, in C.
 *
 * Protocol: one command per line on stdin, one JSON line back on stdout (an
 * {"error": ...} line when a command fails; "-" for an empty argument).
 *   setup PREC WORKLOAD SPEC PREFIX PARAMS_CSV BIND_CSV FILLS_CSV LOSS CHECKS
 *       compile the step at PREC (fp32, bf16, fp16) and make its model,
 *       optimizer, input and target (bench_ebb_setup_train_ex, seed 42, as
 *       ebb_bench's training rows); write PREFIX.json/.bin (the initial
 *       values, input and target) for the PyTorch side; run CHECKS steps,
 *       whose losses come back; reply with the plan's facts: its peak, what
 *       the forward keeps for the backward, its cast steps. {"skipped": why}
 *       when ebb cannot train the workload.
 *   measure PREC     one step's measured and planned peak (ebb_run_stats)
 *   round PREC N     N steps; each one's wall-clock and thread CPU ms
 *   has_op NAME      whether ebb has the op (workloads without are skipped)
 *   teardown         free every precision's; the live-handle count
 *   quit
 * Threads: ebb_bench has set libtorch's from EBB_BENCH_THREADS. */
#include "bench_precision.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_ebb.h"
#include "bench_util.h"

#define N_PREC 4 /* indexed by ebb_precision */
#define MAX_CHECKS 8
#define MAX_ROUND 1000

static double clock_ms(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* What the forward keeps for the backward, from the public plan API: the
 * values made in the forward or the loss and read by a backward step (or by
 * a forward step the backward runs again), as `ebb plan`'s listing names
 * them ("N values (X) cross from the forward into the backward"). Their
 * bytes are the distinct storage the plan allocates for them: a view is
 * counted as its storage, once however many of its views are kept, and a
 * view of a graph input (the caller's) not at all. */
typedef struct kept {
    int values;
    int64_t bytes;
    int64_t float32, low, other; /* the bytes by dtype: float32, bf16 or fp16, the rest
                                    (dropout's bool masks, int64 indices) */
} kept;

static int storage_of(const ebb_plan *p, int slot) {
    while (ebb_plan_value_at(p, slot)->alias_of >= 0)
        slot = ebb_plan_value_at(p, slot)->alias_of;
    return slot;
}

static ebb_status kept_for_backward(const ebb_plan *p, kept *out) {
    int nv = ebb_plan_value_count(p), ns = ebb_plan_step_count(p);
    char *read = calloc((size_t)nv + 1, 1), *counted = calloc((size_t)nv + 1, 1);
    memset(out, 0, sizeof *out);
    if (!read || !counted) {
        free(read);
        free(counted);
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < ns; i++) {
        const ebb_plan_step *s = ebb_plan_step_at(p, i);
        if (s->kind == EBB_STEP_BACKWARD || s->recompute)
            for (int k = 0; k < s->n_in; k++)
                if (s->in[k] >= 0 && s->in[k] < nv)
                    read[s->in[k]] = 1;
    }
    for (int v = 0; v < nv; v++) {
        const ebb_plan_value *val = ebb_plan_value_at(p, v);
        if (!read[v] || val->kind == EBB_VALUE_INPUT || val->producer < 0 ||
            ebb_plan_step_at(p, val->producer)->phase == EBB_PHASE_BACKWARD)
            continue;
        out->values++;
        int root = storage_of(p, v);
        if (counted[root] || ebb_plan_value_at(p, root)->kind == EBB_VALUE_INPUT)
            continue;
        counted[root] = 1;
        const ebb_plan_value *r = ebb_plan_value_at(p, root);
        out->bytes += r->nbytes;
        if (r->dtype == EBB_FLOAT32)
            out->float32 += r->nbytes;
        else if (r->dtype == EBB_BFLOAT16 || r->dtype == EBB_FLOAT16)
            out->low += r->nbytes;
        else
            out->other += r->nbytes;
    }
    free(read);
    free(counted);
    return EBB_OK;
}

/* The plan's steps that change a value's dtype, and the bytes they make. */
static void cast_steps(const ebb_plan *p, int *n, int64_t *bytes) {
    *n = 0;
    *bytes = 0;
    for (int i = 0; i < ebb_plan_step_count(p); i++) {
        const ebb_plan_step *s = ebb_plan_step_at(p, i);
        if (s->kind == EBB_STEP_OP && s->op && !strcmp(s->op, "cast")) {
            (*n)++;
            for (int k = 0; k < s->n_out; k++)
                *bytes += ebb_plan_value_at(p, s->out[k])->nbytes;
        }
    }
}

static const char *arg(const char *s) { return strcmp(s, "-") ? s : ""; }

static ebb_status parse_prec(const char *name, ebb_precision *p) {
    ebb_status st = ebb_precision_parse(p, name);
    if (st == EBB_OK && ((int)*p <= 0 || (int)*p >= N_PREC))
        st = ebb_error_set(EBB_ERR_ARG, "precision %s: fp32, bf16 or fp16", name);
    return st;
}

static void print_list(const char *key, const double *v, int n, int last) {
    printf("\"%s\": [", key);
    for (int i = 0; i < n; i++)
        printf(i ? ", %.9g" : "%.9g", v[i]);
    printf(last ? "]}\n" : "], ");
}

static ebb_status setup(bench_ebb **side, ebb_precision prec, const char *spec,
                        const char *prefix, const char *params, const char *binds,
                        const char *fills, const char *loss, int checks) {
    if (checks < 0 || checks > MAX_CHECKS)
        return ebb_error_set(EBB_ERR_ARG, "setup: 0 to %d check steps", MAX_CHECKS);
    bench_ebb_free(*side);
    *side = NULL;
    ebb_status st = bench_ebb_setup_train_ex(side, spec, arg(params), arg(binds), arg(fills),
                                             loss, prec, 42, ebb_device_cpu());
    if (st == EBB_ERR_UNSUPPORTED) {
        printf("{\"skipped\": ");
        bench_json_string(stdout, ebb_errmsg());
        printf("}\n");
        fflush(stdout);
        return EBB_OK;
    }
    if (st == EBB_OK && strcmp(prefix, "-"))
        st = bench_ebb_export(*side, prefix);
    double losses[MAX_CHECKS];
    for (int i = 0; st == EBB_OK && i < checks; i++)
        st = bench_ebb_train_step(*side, &losses[i], NULL);
    const ebb_plan *p = *side ? bench_ebb_plan(*side) : NULL;
    kept k = {0};
    if (st == EBB_OK)
        st = kept_for_backward(p, &k);
    if (st != EBB_OK) {
        bench_ebb_free(*side);
        *side = NULL;
        return st;
    }
    int n_cast = 0;
    int64_t cast_bytes = 0;
    cast_steps(p, &n_cast, &cast_bytes);
    int peak_at = -1;
    int64_t peak = ebb_plan_peak_bytes(p, &peak_at);
    const ebb_plan_step *at = ebb_plan_step_at(p, peak_at);
    int phases[4];
    bench_ebb_phase_counts(*side, phases);
    printf("{\"precision\": \"%s\", \"planned_peak\": %lld, \"peak_is_bound\": %d, "
           "\"peak_phase\": %d, \"peak_op\": ",
           ebb_precision_name(prec), (long long)peak, ebb_plan_peak_is_bound(p),
           at ? (int)at->phase : -1);
    bench_json_string(stdout, at && at->op ? at->op : "");
    printf(", \"kept_values\": %d, \"kept_bytes\": %lld, \"kept_float32\": %lld, "
           "\"kept_low\": %lld, \"kept_other\": %lld, \"cast_steps\": %d, "
           "\"cast_bytes\": %lld, \"steps\": %d, \"phases\": [%d, %d, %d, %d], "
           "\"param_bytes\": %lld, \"optimizer_state_bytes\": %lld, ",
           k.values, (long long)k.bytes, (long long)k.float32, (long long)k.low,
           (long long)k.other, n_cast, (long long)cast_bytes, ebb_plan_step_count(p),
           phases[0], phases[1], phases[2], phases[3], (long long)ebb_plan_param_bytes(p),
           (long long)ebb_plan_optimizer_state_bytes(p));
    print_list("loss", losses, checks, 1);
    fflush(stdout);
    return EBB_OK;
}

static ebb_status measure(bench_ebb *b) {
    ebb_run_stats rs;
    memset(&rs, 0, sizeof rs);
    ebb_status st = bench_ebb_train_step(b, NULL, &rs);
    if (st != EBB_OK)
        return st;
    printf("{\"measured\": %lld, \"planned\": %lld, \"over_step\": %d, \"over_bytes\": %lld}\n",
           (long long)rs.measured_peak_bytes, (long long)rs.planned_peak_bytes, rs.over_step,
           (long long)rs.over_bytes);
    fflush(stdout);
    return EBB_OK;
}

static ebb_status round_of(bench_ebb *b, int n) {
    static double wall[MAX_ROUND], cpu[MAX_ROUND];
    if (n < 0 || n > MAX_ROUND)
        return ebb_error_set(EBB_ERR_ARG, "round: 0 to %d steps", MAX_ROUND);
    for (int i = 0; i < n; i++) {
        double c0 = clock_ms(CLOCK_THREAD_CPUTIME_ID), t0 = clock_ms(CLOCK_MONOTONIC);
        ebb_status st = bench_ebb_train_step(b, NULL, NULL);
        wall[i] = clock_ms(CLOCK_MONOTONIC) - t0;
        cpu[i] = clock_ms(CLOCK_THREAD_CPUTIME_ID) - c0;
        if (st != EBB_OK)
            return st;
    }
    printf("{");
    print_list("wall", wall, n, 0);
    print_list("cpu", cpu, n, 1);
    fflush(stdout);
    return EBB_OK;
}

int bench_precision_main(void) {
    printf("{\"ready\": 1, \"libtorch\": \"%s\", \"ebb\": \"%s\", \"threads\": %d}\n",
           ebb_torch_version(), ebb_version(), ebb_tensor_num_threads());
    fflush(stdout);
    bench_ebb *sides[N_PREC] = {NULL};
    char line[4096], cmd[32], pname[32], workload[64], spec[1024], prefix[1024], params[256],
        binds[256], fills[256], loss[64];
    while (fgets(line, sizeof line, stdin)) {
        int n = 0;
        ebb_precision prec = EBB_PRECISION_DEFAULT;
        if (sscanf(line, "%31s", cmd) != 1 || !strcmp(cmd, "quit"))
            break;
        ebb_status st = EBB_OK;
        if (!strcmp(cmd, "setup") &&
            sscanf(line, "%*s %31s %63s %1023s %1023s %255s %255s %255s %63s %d", pname,
                   workload, spec, prefix, params, binds, fills, loss, &n) == 9) {
            st = parse_prec(pname, &prec);
            if (st == EBB_OK)
                st = setup(&sides[prec], prec, spec, prefix, params, binds, fills, loss, n);
        } else if (!strcmp(cmd, "measure") && sscanf(line, "%*s %31s", pname) == 1) {
            st = parse_prec(pname, &prec);
            if (st == EBB_OK && !sides[prec])
                st = ebb_error_set(EBB_ERR_ARG, "measure %s before its setup", pname);
            if (st == EBB_OK)
                st = measure(sides[prec]);
        } else if (!strcmp(cmd, "round") && sscanf(line, "%*s %31s %d", pname, &n) == 2) {
            st = parse_prec(pname, &prec);
            if (st == EBB_OK && !sides[prec])
                st = ebb_error_set(EBB_ERR_ARG, "round %s before its setup", pname);
            if (st == EBB_OK)
                st = round_of(sides[prec], n);
        } else if (!strcmp(cmd, "has_op") && sscanf(line, "%*s %63s", workload) == 1) {
            printf("{\"has\": %d}\n", ebb_op_find(workload) ? 1 : 0);
            fflush(stdout);
        } else if (!strcmp(cmd, "teardown")) {
            for (int i = 0; i < N_PREC; i++) {
                bench_ebb_free(sides[i]);
                sides[i] = NULL;
            }
            printf("{\"live_handles\": %lld}\n", (long long)ebb_tensor_live_count());
            fflush(stdout);
        } else {
            st = ebb_error_set(EBB_ERR_ARG, "unknown command or arguments: %s", cmd);
        }
        if (st != EBB_OK)
            bench_reply_error();
    }
    for (int i = 0; i < N_PREC; i++)
        bench_ebb_free(sides[i]);
    return 0;
}
