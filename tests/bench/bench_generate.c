#define _POSIX_C_SOURCE 200809L
/* ebb_generate_bench: the ebb side of the generation bench
 * (tests/bench/generate.py, `make bench`, issue 46): a language model from
 * specs/ generating greedily through a key/value cache, through the public
 * C API as `ebb generate` runs it: a plan for the prompt [1, P] and one for
 * each next token [1, 1], sharing one ebb_kv_cache of P + N positions.
 *
 * Protocol: one command per line on stdin, one JSON line back on stdout
 * (an {"error": ...} line when a command fails).
 *   setup SPEC PROMPT NEW PREFIX [NAME=VALUE]...
 *                 load SPEC with those params, compile both plans, make the
 *                 model (seed 0) and the cache; write PREFIX.json/.bin (the
 *                 parameters in model order) for the PyTorch side; reply
 *                 with both plans' peaks and the cache's bytes
 *   generate ROUNDS
 *                 ROUNDS times: the cache emptied, the prompt (tokens
 *                 (37 i + 11) mod V) run, then NEW tokens, each the most
 *                 likely next one fed back; reply with each round's prompt
 *                 and decode seconds (wall and this thread's CPU time), the
 *                 tokens of the last round, and the most each plan measured
 *   quit
 * Threads: libtorch's intra-op pool follows OMP_NUM_THREADS, which the
 * driver sets; the ready line reports the count in use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ebb/ebb.h"
#include "ebb/spec.h"

#include "bench_util.h"

#define MAX_TOKENS 4096
#define MAX_ROUNDS 64

typedef struct gbench {
    ebb_spec *spec;
    ebb_plan *prompt, *next;
    ebb_model *model;
    ebb_kv_cache *kv;
    ebb_tensor *xp, *x1;
    int64_t p, n, vocab;
} gbench;

static void gbench_free(gbench *b) {
    ebb_tensor_free(b->xp);
    ebb_tensor_free(b->x1);
    ebb_kv_cache_free(b->kv);
    ebb_model_free(b->model);
    ebb_plan_free(b->prompt);
    ebb_plan_free(b->next);
    ebb_spec_free(b->spec);
    memset(b, 0, sizeof *b);
}

/* Seconds on the wall clock, or of this thread's CPU time (run.py's
 * --clock cpu, for a busy machine; one intra-op thread). */
static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static ebb_status compile_for(gbench *b, int64_t t, ebb_plan **out, ebb_tensor **x) {
    ebb_shape shape = EBB_SHAPE(1, t);
    ebb_compile_options co = {.input_shapes = &shape, .n_input_shapes = 1,
                              .measure_scratch = 1, .kv_cache = b->p + b->n};
    ebb_status st = ebb_spec_compile(out, b->spec, &co);
    if (st == EBB_OK)
        st = ebb_tensor_zeros(x, &shape, EBB_INT64, ebb_device_cpu());
    return st;
}

static ebb_status setup(gbench *b, const char *spec, int64_t p, int64_t n, const char *prefix,
                        const char *const *params, int n_params) {
    if (p < 1 || n < 1 || p + n > MAX_TOKENS)
        return ebb_error_set(EBB_ERR_ARG, "setup: a prompt of %lld and %lld new tokens (at "
                             "most %d in all)", (long long)p, (long long)n, MAX_TOKENS);
    b->p = p;
    b->n = n;
    ebb_spec_options so = {.params = params, .n_params = n_params};
    ebb_status st = ebb_spec_load_ex(&b->spec, spec, &so);
    if (st == EBB_OK)
        st = compile_for(b, p, &b->prompt, &b->xp);
    if (st == EBB_OK)
        st = compile_for(b, 1, &b->next, &b->x1);
    if (st == EBB_OK)
        st = ebb_model_new(&b->model, b->prompt, ebb_device_cpu(), 0);
    if (st == EBB_OK)
        st = ebb_kv_cache_new(&b->kv, b->next, ebb_device_cpu());
    if (st == EBB_OK)
        st = bench_export_model(prefix, b->model, NULL, NULL);
    if (st != EBB_OK)
        return st;
    const ebb_plan_value *out = ebb_plan_value_at(b->next, ebb_plan_output_slot(b->next, 0));
    b->vocab = out->shape.dim[out->shape.ndim - 1];
    printf("{\"prompt_planned\": %lld, \"next_planned\": %lld, \"next_bound\": %s, "
           "\"cache_bytes\": %lld, \"param_bytes\": %lld, \"vocab\": %lld}\n",
           (long long)ebb_plan_peak_bytes(b->prompt, NULL),
           (long long)ebb_plan_peak_bytes(b->next, NULL),
           ebb_plan_peak_is_bound(b->next) ? "true" : "false",
           (long long)ebb_kv_cache_bytes(b->kv), (long long)ebb_plan_param_bytes(b->next),
           (long long)b->vocab);
    fflush(stdout);
    return EBB_OK;
}

/* The most likely token of row `row` of scores [1, t, V]. */
static ebb_status argmax_at(const ebb_tensor *y, int64_t row, int64_t vocab, int64_t *tok) {
    float buf[65536];
    if (vocab > 65536)
        return ebb_error_set(EBB_ERR_ARG, "a vocabulary of %lld", (long long)vocab);
    ebb_tensor *r0 = NULL, *r = NULL;
    ebb_status st = ebb_tensor_select(&r0, y, 0, 0);
    if (st == EBB_OK)
        st = ebb_tensor_select(&r, r0, 0, row);
    if (st == EBB_OK)
        st = ebb_tensor_to_host(r, buf, sizeof(float) * (size_t)vocab);
    ebb_tensor_free(r);
    ebb_tensor_free(r0);
    int64_t best = 0;
    for (int64_t i = 1; st == EBB_OK && i < vocab; i++)
        if (buf[i] > buf[best])
            best = i;
    *tok = best;
    return st;
}

static ebb_status run_once(gbench *b, ebb_plan *p, ebb_tensor *x, const int64_t *tokens,
                           int64_t t, int64_t *next, int64_t *measured) {
    ebb_run_options ro = {.kv_cache = b->kv};
    ebb_run_stats stats;
    ebb_tensor *y = NULL;
    ebb_status st = ebb_tensor_copy_from_host(x, tokens, sizeof *tokens * (size_t)t);
    if (st == EBB_OK)
        st = ebb_run_ex(p, b->model, &x, &y, &ro, &stats);
    if (st == EBB_OK)
        st = argmax_at(y, t - 1, b->vocab, next);
    ebb_tensor_free(y);
    if (st == EBB_OK && stats.measured_peak_bytes > *measured)
        *measured = stats.measured_peak_bytes;
    return st;
}

static ebb_status generate(gbench *b, int rounds) {
    if (!b->kv)
        return ebb_error_set(EBB_ERR_ARG, "generate before setup");
    if (rounds < 1 || rounds > MAX_ROUNDS)
        return ebb_error_set(EBB_ERR_ARG, "generate: 1 to %d rounds", MAX_ROUNDS);
    int64_t seq[MAX_TOKENS], mp = 0, mn = 0;
    double prompt_s[2][MAX_ROUNDS], decode_s[2][MAX_ROUNDS];
    const clockid_t clocks[2] = {CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID};
    ebb_status st = EBB_OK;
    for (int r = 0; st == EBB_OK && r < rounds; r++) {
        for (int64_t i = 0; i < b->p; i++)
            seq[i] = (37 * i + 11) % b->vocab;
        st = ebb_kv_cache_truncate(b->kv, 0);
        double t0[2], t1[2];
        for (int c = 0; c < 2; c++)
            t0[c] = clock_s(clocks[c]);
        if (st == EBB_OK)
            st = run_once(b, b->prompt, b->xp, seq, b->p, &seq[b->p], &mp);
        for (int c = 0; c < 2; c++)
            t1[c] = clock_s(clocks[c]);
        for (int64_t k = 1; st == EBB_OK && k < b->n; k++)
            st = run_once(b, b->next, b->x1, &seq[b->p + k - 1], 1, &seq[b->p + k], &mn);
        for (int c = 0; c < 2; c++) {
            prompt_s[c][r] = t1[c] - t0[c];
            decode_s[c][r] = clock_s(clocks[c]) - t1[c];
        }
    }
    if (st != EBB_OK)
        return st;
    static const char *names[2] = {"wall", "cpu"};
    printf("{");
    for (int c = 0; c < 2; c++) {
        printf("%s\"prompt_s_%s\": [", c ? ", " : "", names[c]);
        for (int r = 0; r < rounds; r++)
            printf(r ? ", %.9f" : "%.9f", prompt_s[c][r]);
        printf("], \"decode_s_%s\": [", names[c]);
        for (int r = 0; r < rounds; r++)
            printf(r ? ", %.9f" : "%.9f", decode_s[c][r]);
        printf("]");
    }
    printf(", \"decode_tokens\": %lld, \"tokens\": [", (long long)(b->n - 1));
    for (int64_t k = 0; k < b->n; k++)
        printf(k ? ", %lld" : "%lld", (long long)seq[b->p + k]);
    printf("], \"prompt_measured\": %lld, \"next_measured\": %lld, \"live\": %lld}\n",
           (long long)mp, (long long)mn, (long long)ebb_tensor_live_count());
    fflush(stdout);
    return EBB_OK;
}

int main(void) {
    if (ebb_init() != EBB_OK) {
        bench_reply_error();
        return 1;
    }
    printf("{\"ready\": true, \"threads\": %d}\n", ebb_tensor_num_threads());
    fflush(stdout);
    gbench b;
    memset(&b, 0, sizeof b);
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        char *words[40];
        int n = 0;
        for (char *w = strtok(line, " \t\r\n"); w && n < 40; w = strtok(NULL, " \t\r\n"))
            words[n++] = w;
        if (n == 0)
            continue;
        ebb_status st = EBB_OK;
        if (!strcmp(words[0], "quit"))
            break;
        if (!strcmp(words[0], "setup") && n >= 5) {
            gbench_free(&b);
            st = setup(&b, words[1], atoll(words[2]), atoll(words[3]), words[4],
                       (const char *const *)(words + 5), n - 5);
        } else if (!strcmp(words[0], "generate") && n == 2) {
            st = generate(&b, atoi(words[1]));
        } else {
            st = ebb_error_set(EBB_ERR_ARG, "unknown command '%s'", words[0]);
        }
        if (st != EBB_OK)
            bench_reply_error();
    }
    gbench_free(&b);
    return 0;
}
