/* Training plans against PyTorch autograd and torch.optim.
 * tests/parity/make_grad_fixtures.py wrote, under tests/parity/fixtures/:
 *
 *   grad_<model>.safetensors   for every parity model (specs/parity/<model>.yaml):
 *                              the weights, the input x, the target y, the loss
 *                              and grad.<param> from autograd in training mode;
 *                              the loss op in the header's metadata;
 *   grad_<spec>.safetensors    the same for specs/switch.yaml, gate_topk.yaml,
 *                              loop_while.yaml, loop_until.yaml, repeat.yaml
 *                              and tag_using.yaml, whose path is the metadata's
 *                              "spec": routed rows (two branches; three experts
 *                              of four, the fourth chosen by no row), loops
 *                              that stop before their max (3 of 6 and 3 of 5
 *                              iterations), copies, tags;
 *   grad_steps_mlp.safetensors ten steps of an 8 -> 16 -> 4 MLP under SGD with
 *                              momentum, Adam and AdamW: the data of each step,
 *                              every loss and the parameters after ten steps;
 *   grad_steps_bn.safetensors  the same with a batch_norm (running statistics
 *                              included), SGD with momentum;
 *   grad_steps20_<model>.safetensors  twenty AdamW steps of conv_net (its
 *                              convolutions without bias) and transformer_encoder,
 *                              smaller, in float32 and under
 *                              torch.autocast(bfloat16): every loss and the
 *                              parameters after twenty steps of both, which ebb
 *                              follows in float32 and with EBB_PRECISION_BF16
 *                              (the bounds for bfloat16 at STEPS20).
 *
 * The error measure, for gradients and parameters alike:
 *     rel = max_i |ebb_i - torch_i| / max(max_i |torch_i|, 1e-6)
 * at most 1e-5 for gradients and the loss, 1e-6 for parameters after ten
 * steps. A gradient that is zero in exact arithmetic (the fixture's
 * "zero_grads": a conv bias under a training batch_norm) is float32 noise on
 * both sides; it must stay below 1e-5 of the model's largest gradient. One
 * that autograd leaves None ("none_grads": switch_routed's selector, read
 * only by an argmax) ebb may instead leave untrained, saying so
 * (ebb_plan_param_trained) and handing out no gradient. The fixtures of
 * specs/ are stricter ("untrained" in their metadata): for a None ebb_grad
 * must hand out no gradient, and the plan must leave untrained those that
 * only a hard decision reads (a selector, a loop's learned test); a branch
 * no row chose is trained in the plan but gets no gradient in this run.
 *
 * Besides the numbers:
 *   - memory: each run's measured peak against the planned one, and every
 *     step's measured live and in-step peak bytes against the plan's (equal,
 *     to the byte, when the plan says it is exact; never above it for a
 *     bound; the first training step, whose updates make the optimizer
 *     state, need only stay within the plan), and the training plan's peak
 *     below its keep_all peak; a keep_all plan computes the same gradients
 *     bitwise;
 *   - liveness from the trace: the run follows the plan's control flow
 *     (jumps past branches no row chose and iterations that did not run
 *     included); every value a step writes, forward and backward, is freed
 *     once, on the edge where it stops being live (right after its last
 *     reader on a straight line; ebb_plan_value_last_use), never while a
 *     step may still read it, never an input, target or output;
 *   - the plan's shape: phases in order, an update per trained parameter;
 *   - failures: a target of the wrong shape or dtype, or a class out of
 *     range, leaves the parameters, batch_norm's running statistics and the
 *     optimizer state bitwise as they were, and no handle behind; the API's
 *     refusals (a grads_only plan to ebb_train_step, an optimizer of another
 *     kind, ebb_grad on a plan with updates or an inference plan) too;
 *   - gru_loop and switch_routed are refused for training by name (train.h)
 *     until they are trainable; then their gradients are checked like the
 *     others'.
 * The parity specs get their target and loss through ebb_train_options; the
 * specs of specs/ and the step models declare theirs (`targets:`, `loss:`),
 * and the plan's loss must be the fixture's. Each test collects its problems
 * and reports them all at its end. Every test ends with no ebb_tensor handle
 * alive.
 *
 * The parity "mlp" has a dropout (p 0.1); ebb draws its masks from its own
 * seed, which PyTorch cannot follow, so both sides run it with p 0. */

#define _POSIX_C_SOURCE 200809L /* open_memstream, getpid */
#include <math.h>

#include <unistd.h>

#include "test_util.h"

#define GRAD_RTOL 1e-5
#define LOSS_RTOL 1e-5
#define STEP_RTOL 1e-6
#define ZERO_GRAD_TOL 1e-5
#define STEPS 10
/* The bfloat16 autocast cases (*_bf16) compare with torch's autocast run
 * made on this machine (open_reference), whose kernels ebb calls in the same
 * order: they are held to the float32 bounds (measured: bit for bit). */
#define N_STATE 4

static const ebb_device CPU = {EBB_DEVICE_CPU, 0};
static const char *const STATE_NAMES[N_STATE] = {"momentum_buffer", "exp_avg", "exp_avg_sq",
                                                 "max_exp_avg_sq"};

/* ---- fixtures and tensors ------------------------------------------------------- */

static ebb_safetensors *open_fixture(const char *file) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/parity/fixtures/%s.safetensors", EBB_SOURCE_DIR, file);
    ebb_safetensors *st = NULL;
    assert_ok(ebb_safetensors_open(&st, path));
    return st;
}

/* The fixture as torch computed it on this machine, at test time, from the
 * committed inputs and initial parameters (ctest's reference_runs:
 * make_grad_fixtures.py --replay into EBB_REFERENCE_DIR, with the python
 * whose torch is the libtorch ebb runs on): NULL when there is none. The
 * bfloat16 cases compare with it, since bfloat16's rounding differs with
 * the CPU's kernels (AVX-512 or AVX2, oneDNN's or ATen's), and a committed
 * run from one CPU says little about another's. */
static ebb_safetensors *open_reference(const char *file) {
    const char *dir = getenv("EBB_REFERENCE_DIR");
    char path[1024];
    if (!dir || !*dir)
        return NULL;
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, file);
    ebb_safetensors *st = NULL;
    if (ebb_safetensors_open(&st, path) != EBB_OK)
        fail_msg("EBB_REFERENCE_DIR=%s: %s", dir, ebb_errmsg());
    return st;
}

static int fx_has(const ebb_safetensors *st, const char *name) {
    return ebb_safetensors_find(st, name, NULL, NULL) == EBB_OK;
}

/* The named tensor as a new CPU tensor; failing the test when it is missing. */
static ebb_tensor *fx_load(const ebb_safetensors *st, const char *name) {
    ebb_tensor *t = NULL;
    if (ebb_safetensors_load(&t, st, name, CPU) != EBB_OK)
        fail_msg("%s: '%s': %s", ebb_safetensors_path(st), name, ebb_errmsg());
    return t;
}

static double fx_scalar(const ebb_safetensors *st, const char *name) {
    ebb_tensor *t = fx_load(st, name);
    double v = 0;
    assert_ok(ebb_tensor_item(t, &v));
    ebb_tensor_free(t);
    return v;
}

/* The tensor's values as float64 on the host (free() them); *n the count. */
static double *host_f64(const ebb_tensor *t, size_t *n) {
    ebb_tensor *d = NULL;
    assert_ok(ebb_tensor_to(&d, t, CPU, EBB_FLOAT64));
    *n = (size_t)ebb_tensor_numel(d);
    double *h = malloc(*n * sizeof *h + 1);
    assert_non_null(h);
    assert_ok(ebb_tensor_to_host(d, h, *n * sizeof *h));
    ebb_tensor_free(d);
    return h;
}

static void check_same_shape(const ebb_tensor *a, const ebb_tensor *b, const char *what) {
    ebb_shape sa = ebb_tensor_shape(a), sb = ebb_tensor_shape(b);
    if (!ebb_shape_equal(&sa, &sb) || ebb_tensor_dtype(a) != ebb_tensor_dtype(b)) {
        char ba[128], bb[128];
        fail_msg("%s: ebb gives %s %s, the reference is %s %s", what,
                 ebb_dtype_name(ebb_tensor_dtype(a)), ebb_shape_str(&sa, ba, sizeof ba),
                 ebb_dtype_name(ebb_tensor_dtype(b)), ebb_shape_str(&sb, bb, sizeof bb));
    }
}

/* max|a - b| / max(max|b|, 1e-6); *max_abs (may be NULL) gets max|a - b|.
 * NaN anywhere gives NaN, which fails every "<= tol". */
static double rel_error(const ebb_tensor *a, const ebb_tensor *b, const char *what,
                        double *max_abs) {
    check_same_shape(a, b, what);
    size_t n = 0, m = 0;
    double *ha = host_f64(a, &n), *hb = host_f64(b, &m);
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(ha[i] - hb[i]);
        if (!(d <= diff)) diff = d;
        if (fabs(hb[i]) > scale) scale = fabs(hb[i]);
    }
    free(ha);
    free(hb);
    if (max_abs) *max_abs = diff;
    return diff / fmax(scale, 1e-6);
}

static double max_abs_of(const ebb_tensor *t) {
    size_t n = 0;
    double *h = host_f64(t, &n), m = 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabs(h[i]) <= m)) m = fabs(h[i]);
    free(h);
    return m;
}

/* Non-zero when a and b have one dtype and shape and the same bytes. */
static int same_bits(const ebb_tensor *a, const ebb_tensor *b) {
    ebb_shape sa = ebb_tensor_shape(a), sb = ebb_tensor_shape(b);
    if (!ebb_shape_equal(&sa, &sb) || ebb_tensor_dtype(a) != ebb_tensor_dtype(b)) return 0;
    size_t n = ebb_tensor_nbytes(a);
    unsigned char *ha = malloc(n + 1), *hb = malloc(n + 1);
    assert_non_null(ha);
    assert_non_null(hb);
    assert_ok(ebb_tensor_to_host(a, ha, n));
    assert_ok(ebb_tensor_to_host(b, hb, n));
    int same = memcmp(ha, hb, n) == 0;
    free(ha);
    free(hb);
    return same;
}

static double rel_scalar(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-6); }

/* What went wrong in one test, collected so that one run reports every
 * problem (and frees what it holds) before failing. */
typedef struct problems {
    char text[16384];
    size_t len;
    int n;
} problems;

static void problem(problems *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(problems *p, const char *fmt, ...) {
    p->n++;
    if (p->len + 2 >= sizeof p->text) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(p->text + p->len, sizeof p->text - p->len - 1, fmt, ap);
    va_end(ap);
    if (w < 0) return;
    p->len += (size_t)w;
    if (p->len > sizeof p->text - 2) p->len = sizeof p->text - 2;
    p->text[p->len++] = '\n';
    p->text[p->len] = '\0';
}

static void fail_on_problems(const problems *p, const char *what) {
    if (p->n) fail_msg("%s: %d problem(s):\n%s", what, p->n, p->text);
}

/* Sets every parameter of m from `<prefix><name>` in st. */
static void load_params(ebb_model *m, const ebb_safetensors *st, const char *prefix) {
    for (int i = 0; i < ebb_model_param_count(m); i++) {
        char key[512];
        snprintf(key, sizeof key, "%s%s", prefix, ebb_model_param_name(m, i));
        ebb_tensor *t = fx_load(st, key);
        ebb_status s = ebb_model_set_param(m, ebb_model_param_name(m, i), t);
        ebb_tensor_free(t);
        if (s != EBB_OK) fail_msg("%s: %s", key, ebb_errmsg());
    }
}

static int param_is_buffer(const ebb_plan *plan, int i) {
    const ebb_param_spec *ps = ebb_plan_param_at(plan, i, NULL);
    assert_non_null(ps);
    return ps->buffer;
}

/* Is `name` in the comma-separated list? */
static int in_list(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        p = comma ? comma + 1 : NULL;
    }
    return 0;
}

/* ---- the trace ---------------------------------------------------------------- */

typedef struct trace_event_copy {
    int step;
    int *freed;
    int n_freed;
    int jumped;
    int64_t live, peak;
} trace_event_copy;

typedef struct trace_log {
    trace_event_copy *ev;
    int n, cap;
} trace_log;

static void record(const ebb_trace_event *ev, void *user) {
    trace_log *log = user;
    if (log->n == log->cap) {
        log->cap = log->cap ? 2 * log->cap : 64;
        log->ev = realloc(log->ev, (size_t)log->cap * sizeof *log->ev);
        if (!log->ev) abort();
    }
    trace_event_copy *c = &log->ev[log->n++];
    c->step = ev->step;
    c->n_freed = ev->n_freed;
    c->freed = malloc((size_t)ev->n_freed * sizeof *c->freed + 1);
    if (!c->freed) abort();
    if (ev->n_freed) memcpy(c->freed, ev->freed, (size_t)ev->n_freed * sizeof *c->freed);
    c->jumped = ev->jumped;
    c->live = ev->live_bytes;
    c->peak = ev->peak_bytes;
}

static void log_clear(trace_log *log) {
    for (int i = 0; i < log->n; i++) free(log->ev[i].freed);
    free(log->ev);
    *log = (trace_log){0};
}

static const char *phase_name(ebb_step_phase ph) {
    switch (ph) {
    case EBB_PHASE_FORWARD: return "forward";
    case EBB_PHASE_LOSS: return "loss";
    case EBB_PHASE_BACKWARD: return "backward";
    case EBB_PHASE_UPDATE: return "update";
    }
    return "?";
}

static int step_reads(const ebb_plan_step *s, int v) {
    for (int k = 0; k < s->n_in; k++)
        if (s->in[k] == v) return 1;
    return 0;
}

static int step_writes(const ebb_plan_step *s, int v) {
    for (int k = 0; k < s->n_out; k++)
        if (s->out[k] == v) return 1;
    return 0;
}

/* At most this many lines per check; the rest are counted. */
#define MAX_LINES 8
#define REPORT(p, count, ...)                                                                      \
    do {                                                                                           \
        if ((count)++ < MAX_LINES) problem((p), __VA_ARGS__);                                      \
    } while (0)

/* Which values are live where each step begins, worked out here from the
 * steps' inputs and outputs alone, independently of the compiler: the
 * textbook backward dataflow over the plan's control flow (each step goes on
 * to the next, and to its jump target when it has one; after the last step
 * nothing is live), live_in(s) = reads(s) + (live_out(s) - writes(s)). Row
 * n_steps is the run's end. Only intermediates are tracked. */
typedef struct liveness {
    int n_steps, words;
    uint64_t *in; /* n_steps + 1 rows of `words` */
} liveness;

static int live_at(const liveness *lv, int step, int v) {
    return (int)(lv->in[(size_t)step * (size_t)lv->words + (size_t)(v / 64)] >> (v % 64) & 1u);
}

static int is_intermediate(const ebb_plan *plan, int v) {
    const ebb_plan_value *pv = ebb_plan_value_at(plan, v);
    return pv && pv->kind == EBB_VALUE_INTERMEDIATE;
}

/* 0 when a jump leads outside the plan (reported). */
static int liveness_compute(liveness *lv, const ebb_plan *plan, const char *what,
                            problems *pr) {
    int n = ebb_plan_step_count(plan), n_values = ebb_plan_value_count(plan);
    int words = (n_values + 63) / 64;
    *lv = (liveness){.n_steps = n, .words = words};
    lv->in = calloc((size_t)(n + 1) * (size_t)words + 1, sizeof *lv->in);
    uint64_t *row = calloc((size_t)words + 1, sizeof *row);
    assert_non_null(lv->in);
    assert_non_null(row);
    for (int s = 0; s < n; s++) {
        int j = ebb_plan_step_at(plan, s)->jump;
        if (j < -1 || j > n) {
            problem(pr, "%s: step %d jumps to step %d of %d", what, s, j, n);
            free(row);
            return 0;
        }
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int s = n - 1; s >= 0; s--) {
            const ebb_plan_step *st = ebb_plan_step_at(plan, s);
            const uint64_t *next = lv->in + (size_t)(s + 1) * (size_t)words;
            const uint64_t *target =
                st->jump >= 0 ? lv->in + (size_t)st->jump * (size_t)words : NULL;
            for (int w = 0; w < words; w++) row[w] = next[w] | (target ? target[w] : 0);
            for (int k = 0; k < st->n_out; k++)
                if (is_intermediate(plan, st->out[k]))
                    row[st->out[k] / 64] &= ~((uint64_t)1 << (st->out[k] % 64));
            for (int k = 0; k < st->n_in; k++)
                if (is_intermediate(plan, st->in[k]))
                    row[st->in[k] / 64] |= (uint64_t)1 << (st->in[k] % 64);
            uint64_t *in = lv->in + (size_t)s * (size_t)words;
            if (memcmp(in, row, (size_t)words * sizeof *row) != 0) {
                memcpy(in, row, (size_t)words * sizeof *row);
                changed = 1;
            }
        }
    }
    free(row);
    return 1;
}

/* Liveness as the run did it. The trace must follow the plan's control flow
 * (from step 0, each step to the next or, when it says it jumped, to its
 * jump target, and on to the end) and free after each step what the plan
 * lists for the edge taken. Following it, a value is held from the step that
 * writes it until it is freed, and:
 *   - no step reads a value it does not hold, but a skip (whose read asks
 *     whether a branch or an iteration ran) and a read of a value whose
 *     writers the run jumped past: an absent gradient, which sums and
 *     backward steps take as none (a branch no row chose, an iteration that
 *     did not run);
 *   - nothing is freed where it is still live (liveness_compute) or freed
 *     twice; a value whose writer did not run may be listed, as a jump past a
 *     branch lists what the branch would have made;
 *   - every value held where it stops being live is freed on that very edge:
 *     right after its last reader on a straight line, on the jump when a jump
 *     passes its remaining readers, at the end of the run at the latest;
 *   - inputs, targets and outputs are never freed.
 * ebb_plan_value_last_use must name each intermediate's last reader in
 * listing order (its producer when none reads it). Counts the values written,
 * per phase of the step that wrote them, the jumps taken and the absent
 * values read. */
static void check_liveness(const ebb_plan *plan, const trace_log *log, const char *what,
                           int per_phase[4], int *jumps, int *absent, problems *pr) {
    int n_steps = ebb_plan_step_count(plan), n_values = ebb_plan_value_count(plan), count = 0;
    liveness lv;
    if (!liveness_compute(&lv, plan, what, pr)) {
        free(lv.in);
        return;
    }
    char *held = calloc((size_t)n_values + 1, 1), *told = calloc((size_t)n_values + 1, 1);
    int *written_by = malloc((size_t)n_values * sizeof *written_by + 1);
    int *freed_after = malloc((size_t)n_values * sizeof *freed_after + 1);
    char *wrote = calloc((size_t)n_steps + 1, 1); /* the step ran and did not jump */
    assert_non_null(wrote);
    assert_non_null(held);
    assert_non_null(told);
    assert_non_null(written_by);
    assert_non_null(freed_after);
    for (int v = 0; v < n_values; v++) written_by[v] = freed_after[v] = -1;
    *jumps = *absent = 0;
    int at = 0, e = 0; /* where the control flow leads, the event that should be there */
    for (; e < log->n && at < n_steps; e++) {
        const trace_event_copy *ev = &log->ev[e];
        if (ev->step != at) {
            problem(pr, "%s: trace event %d is step %d; the plan's control flow leads to step %d",
                    what, e, ev->step, at);
            at = -1;
            break;
        }
        const ebb_plan_step *s = ebb_plan_step_at(plan, at);
        if (ev->jumped && s->jump < 0) {
            problem(pr, "%s: step %d (%s %s) jumped, but it has no jump", what, at, s->op, s->node);
            at = -1;
            break;
        }
        char id[64];
        if (s->kind != EBB_STEP_SKIP)
            for (int k = 0; k < s->n_in; k++) {
                int v = s->in[k];
                if (!is_intermediate(plan, v) || held[v]) continue;
                ebb_plan_value_id(plan, v, id, sizeof id);
                int skipped_writer = 0;
                for (int i = 0; i < at && !skipped_writer; i++)
                    skipped_writer = !wrote[i] && step_writes(ebb_plan_step_at(plan, i), v);
                if (written_by[v] < 0 && skipped_writer)
                    ++*absent;
                else if (written_by[v] < 0)
                    REPORT(pr, count, "%s: step %d (%s %s) reads %s, which no step has written",
                           what, at, s->op, s->node, id);
                else
                    REPORT(pr, count, "%s: step %d (%s %s) reads %s, freed after step %d", what,
                           at, s->op, s->node, id, freed_after[v]);
            }
        wrote[at] = !ev->jumped;
        if (!ev->jumped)
            for (int k = 0; k < s->n_out; k++) {
                int v = s->out[k];
                if (!is_intermediate(plan, v)) continue;
                held[v] = 1;
                told[v] = 0;
                written_by[v] = at;
                per_phase[s->phase]++;
            }
        int to = ev->jumped ? s->jump : at + 1;
        *jumps += ev->jumped != 0;
        const int *list = ev->jumped ? s->jump_frees : s->frees;
        int n_list = ev->jumped ? s->n_jump_frees : s->n_frees;
        int same = ev->n_freed == n_list;
        for (int k = 0; same && k < n_list; k++) same = list[k] == ev->freed[k];
        if (!same)
            REPORT(pr, count, "%s: step %d (%s %s) freed %d values, not the %d the plan lists for "
                   "its edge to step %d", what, at, s->op, s->node, ev->n_freed, n_list, to);
        for (int k = 0; k < ev->n_freed; k++) {
            int v = ev->freed[k];
            if (v < 0 || v >= n_values) {
                REPORT(pr, count, "%s: step %d freed slot %d", what, at, v);
                continue;
            }
            const ebb_plan_value *pv = ebb_plan_value_at(plan, v);
            ebb_plan_value_id(plan, v, id, sizeof id);
            if (pv->kind != EBB_VALUE_INTERMEDIATE) {
                REPORT(pr, count, "%s: step %d (%s %s) freed %s, a%s", what, at, s->op, s->node,
                       id, pv->kind == EBB_VALUE_INPUT ? "n input or target" : "n output");
                continue;
            }
            if (to < n_steps && live_at(&lv, to, v))
                REPORT(pr, count, "%s: step %d (%s %s) frees %s on its edge to step %d, where "
                       "it is still live", what, at, s->op, s->node, id, to);
            if (held[v]) {
                held[v] = 0;
                freed_after[v] = at;
            } else if (written_by[v] >= 0) {
                REPORT(pr, count, "%s: step %d (%s %s) frees %s, already freed after step %d",
                       what, at, s->op, s->node, id, freed_after[v]);
            }
        }
        for (int v = 0; v < n_values; v++) {
            if (!held[v] || told[v] || live_at(&lv, to, v)) continue;
            told[v] = 1;
            const ebb_plan_step *w = ebb_plan_step_at(plan, written_by[v]);
            ebb_plan_value_id(plan, v, id, sizeof id);
            if (to == n_steps)
                REPORT(pr, count, "%s: %s (%s, written by step %d %s %s) was never freed", what,
                       id, phase_name(w->phase), written_by[v], w->op, w->node);
            else
                REPORT(pr, count, "%s: %s (%s, written by step %d %s %s) was not freed after "
                       "step %d (%s %s), on its edge to step %d, where it is no longer live",
                       what, id, phase_name(w->phase), written_by[v], w->op, w->node, at, s->op,
                       s->node, to);
        }
        at = to;
    }
    if (at >= 0 && at != n_steps)
        problem(pr, "%s: the trace ends at step %d of %d", what, at, n_steps);
    else if (at == n_steps && e != log->n)
        problem(pr, "%s: the trace goes on for %d events past the plan's end", what, log->n - e);
    for (int v = 0; v < n_values; v++) {
        if (!is_intermediate(plan, v)) continue;
        int last = ebb_plan_value_at(plan, v)->producer;
        for (int i = 0; i < n_steps; i++)
            if (step_reads(ebb_plan_step_at(plan, i), v)) last = i;
        int planned = ebb_plan_value_last_use(plan, v);
        if (planned != last) {
            char id[64];
            ebb_plan_value_id(plan, v, id, sizeof id);
            REPORT(pr, count, "%s: %s: ebb_plan_value_last_use says step %d, the steps' inputs "
                   "say %d", what, id, planned, last);
        }
    }
    if (count > MAX_LINES) problem(pr, "%s: and %d more liveness problems", what, count - MAX_LINES);
    free(lv.in);
    free(held);
    free(told);
    free(written_by);
    free(freed_after);
    free(wrote);
}

/* Every step's measured bytes against the plan's: equal for a plan whose
 * peak is exact, at most the plan's for a bound or when `at_most` is set. */
static void compare_steps(const ebb_plan *plan, const trace_log *log, const char *what,
                          int at_most, problems *pr) {
    int bound = ebb_plan_peak_is_bound(plan) || at_most, count = 0;
    for (int e = 0; e < log->n; e++) {
        const trace_event_copy *ev = &log->ev[e];
        const ebb_plan_step *s = ebb_plan_step_at(plan, ev->step);
        int ok = bound ? ev->live <= s->live_bytes && ev->peak <= s->peak_bytes
                       : ev->live == s->live_bytes && ev->peak == s->peak_bytes;
        if (!ok)
            REPORT(pr, count,
                   "%s: step %d (%s %s, %s): live bytes measured %lld, planned %lld; peak "
                   "measured %lld, planned %lld (%s)",
                   what, ev->step, s->op, s->node, phase_name(s->phase), (long long)ev->live,
                   (long long)s->live_bytes, (long long)ev->peak, (long long)s->peak_bytes,
                   ebb_plan_peak_is_bound(plan) ? "bound" : at_most ? "at most" : "exact");
    }
    if (count > MAX_LINES) problem(pr, "%s: and %d more steps", what, count - MAX_LINES);
}

/* The shape of a training plan: phases in order (forward, loss, backward,
 * update; by default an update follows the backward step that makes its
 * gradient final, and the backward goes on after it), each update the last
 * step to touch its gradient, at least one
 * loss and one backward step, every parameter but the buffers trained (or
 * left untrained, for those in `may_be_untrained`: no path from the loss
 * reaches them), and one update step per trained parameter unless
 * grads_only. */
static void check_plan_shape(const ebb_plan *plan, int grads_only, const char *may_be_untrained,
                             const char *what, problems *pr) {
    if (!ebb_plan_is_training(plan)) problem(pr, "%s: not a training plan", what);
    if (ebb_plan_target_count(plan) != 1)
        problem(pr, "%s: %d targets, expected 1", what, ebb_plan_target_count(plan));
    int n = ebb_plan_step_count(plan), n_params = ebb_plan_param_count(plan), count = 0;
    int per_phase[4] = {0};
    int *updates = calloc((size_t)n_params + 1, sizeof *updates);
    assert_non_null(updates);
    ebb_step_phase prev = EBB_PHASE_FORWARD;
    for (int i = 0; i < n; i++) {
        const ebb_plan_step *s = ebb_plan_step_at(plan, i);
        int interleaved = prev == EBB_PHASE_UPDATE && s->phase == EBB_PHASE_BACKWARD &&
                          ebb_plan_updates_in_backward(plan);
        if (s->phase < prev && !interleaved)
            REPORT(pr, count, "%s: step %d (%s %s) is in the %s phase, after a %s step", what, i,
                   s->op, s->node, phase_name(s->phase), phase_name(prev));
        prev = s->phase;
        per_phase[s->phase]++;
        for (int j = i + 1; s->kind == EBB_STEP_UPDATE && j < n; j++) {
            const ebb_plan_step *t = ebb_plan_step_at(plan, j);
            for (int k = 0; k < t->n_in + t->n_out; k++)
                if ((k < t->n_in ? t->in[k] : t->out[k - t->n_in]) == s->in[0])
                    REPORT(pr, count, "%s: step %d (%s %s) touches the gradient update step %d "
                                      "has read",
                           what, j, t->op, t->node, i);
        }
        if (s->kind == EBB_STEP_UPDATE) {
            if (s->param < 0 || s->param >= n_params)
                REPORT(pr, count, "%s: update step %d names parameter %d", what, i, s->param);
            else
                updates[s->param]++;
        }
    }
    if (!per_phase[EBB_PHASE_FORWARD] || !per_phase[EBB_PHASE_LOSS] ||
        !per_phase[EBB_PHASE_BACKWARD])
        problem(pr, "%s: %d forward, %d loss, %d backward steps", what, per_phase[0],
                per_phase[1], per_phase[2]);
    for (int i = 0; i < n_params; i++) {
        const char *name = NULL;
        const ebb_param_spec *ps = ebb_plan_param_at(plan, i, &name);
        int trained = ebb_plan_param_trained(plan, i) != 0;
        if (trained == ps->buffer && !(!trained && in_list(may_be_untrained, name)))
            REPORT(pr, count, "%s: parameter %s is %s and %s", what, name,
                   ps->buffer ? "a buffer" : "no buffer", trained ? "trained" : "not trained");
        int want = grads_only ? 0 : trained;
        if (updates[i] != want)
            REPORT(pr, count, "%s: %d update steps for %s, expected %d", what, updates[i], name,
                   want);
    }
    free(updates);
}

/* ---- gradients of the parity models --------------------------------------------- */

typedef struct grad_case {
    const char *name;
    /* the plan's peak must be exact (no routing, no machine-chosen kernels) */
    int exact;
    /* the run must take a jump: past a branch no row chose, or past the
     * iterations of a loop that stopped before its max */
    int jumps;
    /* what ebb_compile() refuses for training today (train.h), by the word that
     * names the node kind in the message; when it accepts the model, the
     * gradients are checked like any other's */
    const char *refused_as;
    /* compiled with EBB_MEMORY_BUDGET_LEAST: the same gradients and the same
     * liveness promises, with forward values recomputed in the backward */
    int least;
} grad_case;

/* The parity spec, as test_parity.c compiles it; the mlp's dropout at p 0. */
static ebb_spec *load_spec(const char *model) {
    char path[1024];
    snprintf(path, sizeof path, "%s/specs/parity/%s.yaml", EBB_SOURCE_DIR, model);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    static char text[1 << 16];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    if (strcmp(model, "mlp") == 0) {
        static const char from[] = "{dropout: {p: 0.1}}", to[] = "{dropout: {p: 0.0}}";
        char *at = strstr(text, from);
        if (!at) fail_msg("%s no longer has '%s'", path, from);
        memcpy(at, to, sizeof to - 1);
    }
    ebb_spec *spec = NULL;
    assert_ok(ebb_spec_load_string(&spec, text, len, path));
    return spec;
}

/* A spec of specs/ (the fixture's "spec", relative to the source tree): it
 * declares its target and its loss. `params` (the fixture's "params", or
 * NULL) sets its size: "name=value,..." as `ebb plan -p` takes them. */
static ebb_spec *load_spec_file(const char *relative, const char *params) {
    char path[1024], text[512] = "";
    const char *p[16];
    int n = 0;
    snprintf(path, sizeof path, "%s/%s", EBB_SOURCE_DIR, relative);
    if (params) {
        snprintf(text, sizeof text, "%s", params);
        for (char *tok = strtok(text, ","); tok && n < 16; tok = strtok(NULL, ","))
            p[n++] = tok;
    }
    ebb_spec_options so = {.params = p, .n_params = n};
    ebb_spec *spec = NULL;
    if (ebb_spec_load_ex(&spec, path, &so) != EBB_OK) fail_msg("%s: %s", path, ebb_errmsg());
    return spec;
}

/* The op of the plan's loss step, or "" when it has none. */
static const char *plan_loss_op(const ebb_plan *plan) {
    for (int i = 0; i < ebb_plan_step_count(plan); i++) {
        const ebb_plan_step *s = ebb_plan_step_at(plan, i);
        if (s->phase == EBB_PHASE_LOSS && s->kind == EBB_STEP_OP) return s->op;
    }
    return "";
}

/* Training options for the fixture's target and loss (metadata). */
static ebb_train_options fixture_train_options(const ebb_safetensors *st, ebb_shape *y_shape,
                                               ebb_dtype *y_dtype) {
    assert_ok(ebb_safetensors_find(st, "y", y_dtype, y_shape));
    const char *loss = ebb_safetensors_metadata(st, "loss");
    const char *attrs = ebb_safetensors_metadata(st, "loss_attrs");
    assert_non_null(loss);
    return (ebb_train_options){.target_shapes = y_shape, .n_target_shapes = 1,
                               .target_dtypes = y_dtype, .loss = loss,
                               .loss_attrs = attrs && *attrs ? attrs : NULL, .grads_only = 1};
}

/* The gradients against the fixture's. */
static void check_grads(const ebb_plan *plan, const ebb_model *m, ebb_tensor *const *grads,
                        const ebb_safetensors *st, const char *what, problems *pr) {
    int n = ebb_model_param_count(m);
    const char *zero = ebb_safetensors_metadata(st, "zero_grads");
    const char *none = ebb_safetensors_metadata(st, "none_grads");
    /* with "untrained" (the fixtures of specs/), autograd's None means no
     * gradient from ebb either */
    const char *untrained = ebb_safetensors_metadata(st, "untrained");
    double top = 0, worst = 0;
    int n_zero = 0;
    const char *worst_name = "-";
    for (int i = 0; i < n; i++) {
        char key[512];
        snprintf(key, sizeof key, "grad.%s", ebb_model_param_name(m, i));
        if (fx_has(st, key)) {
            ebb_tensor *want = fx_load(st, key);
            top = fmax(top, max_abs_of(want));
            ebb_tensor_free(want);
        }
    }
    for (int i = 0; i < n; i++) {
        const char *pn = ebb_model_param_name(m, i);
        char key[512];
        snprintf(key, sizeof key, "grad.%s", pn);
        if (param_is_buffer(plan, i) || !fx_has(st, key)) {
            if (grads[i]) problem(pr, "%s: ebb_grad gives %s a gradient", what, pn);
            if (!param_is_buffer(plan, i)) problem(pr, "%s: the fixture lacks %s", what, key);
            continue;
        }
        if (untrained && in_list(none, pn)) {
            int hard = in_list(untrained, pn);
            if (grads[i])
                problem(pr, "%s: ebb_grad gives %s a gradient; autograd gives None (%s)", what,
                        pn, hard ? "only a hard decision reads it" : "no row chose its branch");
            if (hard && ebb_plan_param_trained(plan, i))
                problem(pr, "%s: the plan trains %s, which only a hard decision reads", what, pn);
            continue;
        }
        if (!grads[i]) {
            /* autograd's None: ebb may leave it untrained, and then says so */
            if (!in_list(none, pn))
                problem(pr, "%s: no gradient for %s", what, pn);
            else if (ebb_plan_param_trained(plan, i))
                problem(pr, "%s: no gradient for %s, which the plan says it trains", what, pn);
            continue;
        }
        ebb_tensor *want = fx_load(st, key);
        if (in_list(zero, pn)) {
            n_zero++;
            check_same_shape(grads[i], want, key);
            double a = max_abs_of(grads[i]);
            if (!(a <= ZERO_GRAD_TOL * top))
                problem(pr,
                        "%s: %s is zero in exact arithmetic; ebb gives up to %.3g (the largest "
                        "gradient is %.3g)",
                        what, key, a, top);
        } else {
            double abs_diff = 0, r = rel_error(grads[i], want, key, &abs_diff);
            if (!(r <= GRAD_RTOL))
                problem(pr, "%s: %s: relative error %.3g > %g (max |diff| %.3g, max |torch| %.3g)",
                        what, key, r, GRAD_RTOL, abs_diff, max_abs_of(want));
            if (r > worst) {
                worst = r;
                worst_name = pn;
            }
        }
        ebb_tensor_free(want);
    }
    printf("[ grad     ] %-20s worst gradient rel. error %.2e (%s)%s%s\n", what, worst,
           worst_name, n_zero ? "; zero gradients within tolerance" : "",
           untrained && none && *none ? "; none where autograd has None" : "");
}

static void run_grad_case(const grad_case *gc) {
    char file[128];
    snprintf(file, sizeof file, "grad_%s", gc->name);
    ebb_safetensors *st = open_fixture(file);
    /* a fixture of specs/ names its spec, which declares its target and loss */
    const char *spec_file = ebb_safetensors_metadata(st, "spec");
    ebb_spec *spec = spec_file ? load_spec_file(spec_file, ebb_safetensors_metadata(st, "params"))
                               : load_spec(gc->name);
    assert_int_equal(ebb_spec_input_count(spec), 1);

    ebb_tensor *x = fx_load(st, "x"), *y = fx_load(st, "y");
    ebb_shape x_shape = ebb_tensor_shape(x), y_shape;
    ebb_dtype y_dtype;
    ebb_train_options t = fixture_train_options(st, &y_shape, &y_dtype);
    if (spec_file) {
        /* the spec's dtype and loss; the shape from the data (the spec's
         * `batch` would be 1) */
        assert_int_equal(ebb_spec_target_count(spec), 1);
        t.target_dtypes = NULL;
        t.loss = t.loss_attrs = NULL;
    }
    ebb_compile_options o = {.input_shapes = &x_shape, .n_input_shapes = 1, .train = &t,
                             .memory_budget = gc->least ? EBB_MEMORY_BUDGET_LEAST : 0};
    ebb_plan *plan = NULL;
    ebb_status s = ebb_spec_compile(&plan, spec, &o);
    if (s != EBB_OK) {
        ebb_tensor_free(x);
        ebb_tensor_free(y);
        ebb_spec_free(spec);
        ebb_safetensors_close(st);
        if (!gc->refused_as)
            fail_msg("%s: compile: %s: %s", gc->name, ebb_status_name(s), ebb_errmsg());
        /* train.h: routing and loops are refused, naming the node */
        if (s != EBB_ERR_UNSUPPORTED)
            fail_msg("%s: refused with %s, not EBB_ERR_UNSUPPORTED: %s", gc->name,
                     ebb_status_name(s), ebb_errmsg());
        assert_errmsg_contains(gc->refused_as);
        printf("[ grad     ] %-20s refused for training: %s\n", gc->name, ebb_errmsg());
        return;
    }
    problems pr = {0};
    const char *untrained = ebb_safetensors_metadata(st, "untrained");
    check_plan_shape(plan, 1, untrained ? untrained : ebb_safetensors_metadata(st, "none_grads"),
                     gc->name, &pr);
    if (strcmp(plan_loss_op(plan), ebb_safetensors_metadata(st, "loss")) != 0)
        problem(&pr, "%s: the plan's loss is '%s', torch's %s", gc->name, plan_loss_op(plan),
                ebb_safetensors_metadata(st, "loss"));

    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, plan, CPU, 0));
    load_params(m, st, "");
    int n = ebb_model_param_count(m);
    /* the fixture holds the weights, x, y, loss and one grad.<param> per trained one */
    int n_trained = 0, n_tied = 0;
    for (int i = 0; i < n; i++) n_trained += !param_is_buffer(plan, i);
    /* and a tied weight's second key (nanoGPT's lm_head.weight), as torch saves it */
    for (int i = 0; i < ebb_safetensors_count(st); i++) {
        const char *key = ebb_safetensors_name_at(st, i);
        int primary = 0;
        for (int j = 0; j < n && !primary; j++) primary = strcmp(key, ebb_model_param_name(m, j)) == 0;
        n_tied += !primary && ebb_model_param(m, key) != NULL;
    }
    assert_int_equal(ebb_safetensors_count(st), n + 3 + n_trained + n_tied);

    ebb_tensor **grads = calloc((size_t)n, sizeof *grads);
    assert_non_null(grads);
    double loss = NAN;
    trace_log log = {0};
    ebb_run_options ro = {.trace = record, .trace_user = &log};
    ebb_run_stats stats = {0};
    int64_t live_before = ebb_tensor_live_count();
    s = ebb_spec_annotate_error(spec, ebb_grad_ex(plan, m, &x, &y, &loss, grads, &ro, &stats));
    if (s != EBB_OK) {
        problem(&pr, "%s: ebb_grad: %s: %s", gc->name, ebb_status_name(s), ebb_errmsg());
    } else {
        check_grads(plan, m, grads, st, gc->name, &pr);
        double want_loss = fx_scalar(st, "loss"), loss_rel = rel_scalar(loss, want_loss);
        if (!(loss_rel <= LOSS_RTOL))
            problem(&pr, "%s: loss %.9g, torch %.9g (relative error %.3g)", gc->name, loss,
                    want_loss, loss_rel);

        /* ebb_grad changes nothing in the model, batch_norm's running
         * statistics included */
        for (int i = 0; i < n; i++) {
            const char *pn = ebb_model_param_name(m, i);
            ebb_tensor *was = fx_load(st, pn);
            if (!same_bits(ebb_model_param(m, pn), was))
                problem(&pr, "%s: ebb_grad changed parameter %s", gc->name, pn);
            ebb_tensor_free(was);
        }

        /* memory: the run against the plan, the plan against keep_all */
        int64_t planned = stats.planned_peak_bytes, measured = stats.measured_peak_bytes;
        int64_t peak = ebb_plan_peak_bytes(plan, NULL);
        int64_t keep_all = ebb_plan_keep_all_peak_bytes(plan);
        int bound = ebb_plan_peak_is_bound(plan);
        printf("[ grad     ] %-20s loss %.6f (torch %.6f); peak bytes measured %lld, planned "
               "%lld (%s), keep_all %lld\n",
               gc->name, loss, want_loss, (long long)measured, (long long)planned,
               bound ? "bound" : "exact", (long long)keep_all);
        if (planned != peak)
            problem(&pr, "%s: stats say planned %lld, ebb_plan_peak_bytes %lld", gc->name,
                    (long long)planned, (long long)peak);
        if (gc->exact && bound)
            problem(&pr, "%s: the training plan says its peak is only a bound", gc->name);
        if (!bound && measured != planned)
            problem(&pr, "%s: measured peak %lld != planned %lld (an exact plan)", gc->name,
                    (long long)measured, (long long)planned);
        if (bound && measured > planned)
            problem(&pr, "%s: measured peak %lld > planned %lld (a bound)", gc->name,
                    (long long)measured, (long long)planned);
        compare_steps(plan, &log, gc->name, 0, &pr);
        if (!(peak < keep_all))
            problem(&pr, "%s: training peak %lld is not below the keep_all peak %lld", gc->name,
                    (long long)peak, (long long)keep_all);

        /* liveness, forward and backward */
        int per_phase[4] = {0}, jumps = 0, absent = 0;
        check_liveness(plan, &log, gc->name, per_phase, &jumps, &absent, &pr);
        printf("[ liveness ] %-20s %d forward, %d loss, %d backward values checked; %d of %d "
               "steps ran, %d jumps, %d absent gradients read\n",
               gc->name, per_phase[EBB_PHASE_FORWARD], per_phase[EBB_PHASE_LOSS],
               per_phase[EBB_PHASE_BACKWARD], log.n, ebb_plan_step_count(plan), jumps, absent);
        if (gc->least) {
            ebb_remat_stats r;
            assert_ok(ebb_plan_remat_stats(plan, &r));
            printf("[ least    ] %-20s peak %lld, keeping everything %lld: %d steps recomputed "
                   "from %d checkpoints\n",
                   gc->name, (long long)r.peak_bytes, (long long)r.no_recompute_peak_bytes,
                   r.n_recompute_steps, r.n_checkpoints);
            if (r.peak_bytes > r.no_recompute_peak_bytes ||
                (r.n_recompute_steps > 0) != (r.peak_bytes < r.no_recompute_peak_bytes))
                problem(&pr, "%s: least peak %lld against %lld keeping everything, with %d "
                             "recompute steps",
                        gc->name, (long long)r.peak_bytes, (long long)r.no_recompute_peak_bytes,
                        r.n_recompute_steps);
        }
        if (gc->jumps && !jumps)
            problem(&pr, "%s: no step jumped: the fixture skips nothing", gc->name);
        if (!per_phase[EBB_PHASE_FORWARD] || !per_phase[EBB_PHASE_BACKWARD])
            problem(&pr, "%s: values checked: %d forward, %d backward", gc->name,
                    per_phase[EBB_PHASE_FORWARD], per_phase[EBB_PHASE_BACKWARD]);
    }
    for (int i = 0; i < n; i++) {
        if (s != EBB_OK && grads[i])
            problem(&pr, "%s: grads[%d] is set after a failure", gc->name, i);
        ebb_tensor_free(grads[i]);
    }
    free(grads);
    if (ebb_tensor_live_count() != live_before)
        problem(&pr, "%s: %lld handles left by the run", gc->name,
                (long long)(ebb_tensor_live_count() - live_before));
    log_clear(&log);
    ebb_model_free(m);
    ebb_plan_free(plan);
    ebb_tensor_free(x);
    ebb_tensor_free(y);
    ebb_spec_free(spec);
    ebb_safetensors_close(st);
    fail_on_problems(&pr, gc->name);
}

static void test_grad(void **state) { run_grad_case(*state); }

static const grad_case GRAD_CASES[] = {
    {.name = "mlp", .exact = 1},
    {.name = "residual_tower", .exact = 1},
    {.name = "gate8", .exact = 1},
    {.name = "conv_net"}, /* oneDNN picks convolution kernels per machine: a bound */
    {.name = "transformer_encoder", .exact = 1},
    {.name = "transformer_stack", .exact = 1},
    {.name = "gru_loop", .refused_as = "loop"},
    {.name = "switch_routed", .refused_as = "switch"},
    /* specs/: one per node kind that routes, loops, repeats or tags */
    {.name = "switch"},
    {.name = "gate_topk", .jumps = 1},
    {.name = "loop_while", .jumps = 1},
    {.name = "loop_until", .jumps = 1},
    {.name = "repeat", .exact = 1},
    {.name = "tag_using", .exact = 1},
    /* nanoGPT: attention over head-split views is a bound on 1.13 (a batched
     * product may copy them, depending on strides) */
    {.name = "gpt"},
    /* LLaMA (specs/llama.yaml, Hugging Face's keys): rotary positions,
     * grouped-query heads, SwiGLU and RMSNorm; attention a bound as gpt's */
    {.name = "llama"},
    /* torchvision's ResNet-18 (specs/resnet18.yaml at the fixture's params):
     * twenty training batch norms; convolutions are a bound, as conv_net's */
    {.name = "resnet18"},
};

/* Weight tying (specs/gpt.yaml's lm_head shares transformer.wte.weight): one
 * parameter under the name of the node that made it; a weights file may hold
 * it under either name or both, as torch's state_dict holds both keys, and
 * a save writes it once. */
static void test_tied_weights(void **state) {
    (void)state;
    ebb_safetensors *st = open_fixture("grad_gpt");
    ebb_spec *spec = load_spec_file("specs/gpt.yaml", ebb_safetensors_metadata(st, "params"));
    ebb_shape xs = EBB_SHAPE(2, 8);
    ebb_compile_options o = {.input_shapes = &xs, .n_input_shapes = 1};
    ebb_plan *plan = NULL;
    assert_ok(ebb_spec_compile(&plan, spec, &o));
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, plan, CPU, 0));
    ebb_tensor *wte = ebb_model_param(m, "transformer.wte.weight");
    assert_non_null(wte);
    assert_ptr_equal(ebb_model_param(m, "lm_head.weight"), wte);
    for (int i = 0; i < ebb_model_param_count(m); i++)
        assert_string_not_equal(ebb_model_param_name(m, i), "lm_head.weight");
    /* the plan's JSON names the tied key beside the parameter */
    char *json = NULL;
    size_t json_len = 0;
    FILE *jf = open_memstream(&json, &json_len);
    assert_non_null(jf);
    ebb_plan_write_json(plan, jf);
    fclose(jf);
    assert_non_null(strstr(json, "\"name\": \"transformer.wte.weight\", \"shape\": [64, 32], "
                                 "\"dtype\": \"float32\", \"bytes\": 8192, "
                                 "\"aliases\": [\"lm_head.weight\"]}"));
    free(json);

    /* the state_dict's keys: the fixture's tensors but x, y, loss and grad.* */
    const char *names[64];
    ebb_tensor *ts[64];
    int n = 0;
    for (int i = 0; i < ebb_safetensors_count(st); i++) {
        const char *k = ebb_safetensors_name_at(st, i);
        if (strcmp(k, "x") && strcmp(k, "y") && strcmp(k, "loss") && strncmp(k, "grad.", 5)) {
            assert_true(n < 64);
            names[n] = k;
            ts[n++] = fx_load(st, k);
        }
    }
    ebb_tensor *want = fx_load(st, "transformer.wte.weight");
    char path[4096];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/ebb_tied_%ld.safetensors", tmp && *tmp ? tmp : "/tmp",
             (long)getpid());
    const char *drop[] = {NULL, "lm_head.weight", "transformer.wte.weight"};
    for (int d = 0; d < 3; d++) {
        const char *kept[64];
        ebb_tensor *kt[64];
        int k = 0;
        for (int i = 0; i < n; i++)
            if (!drop[d] || strcmp(names[i], drop[d])) {
                kept[k] = names[i];
                kt[k++] = ts[i];
            }
        assert_int_equal(k, drop[d] ? n - 1 : n);
        assert_ok(ebb_safetensors_write(path, kept, kt, k));
        ebb_model *fresh = NULL;
        assert_ok(ebb_model_new(&fresh, plan, CPU, 1));
        if (ebb_model_load(fresh, path) != EBB_OK)
            fail_msg("loading the state_dict %s%s: %s", drop[d] ? "without " : "with both keys",
                     drop[d] ? drop[d] : "", ebb_errmsg());
        double diff = 1;
        assert_ok(ebb_tensor_max_abs_diff(ebb_model_param(fresh, "lm_head.weight"), want, &diff));
        assert_true(diff == 0);
        ebb_model_free(fresh);
    }
    /* a save writes the tied weight once, under its own name */
    assert_ok(ebb_model_load(m, path));
    assert_ok(ebb_model_save(m, path));
    ebb_safetensors *saved = NULL;
    assert_ok(ebb_safetensors_open(&saved, path));
    assert_int_equal(ebb_safetensors_count(saved), ebb_model_param_count(m));
    assert_true(fx_has(saved, "transformer.wte.weight"));
    assert_false(fx_has(saved, "lm_head.weight"));
    ebb_safetensors_close(saved);
    remove(path);

    for (int i = 0; i < n; i++) ebb_tensor_free(ts[i]);
    ebb_tensor_free(want);
    ebb_model_free(m);
    ebb_plan_free(plan);
    ebb_spec_free(spec);
    ebb_safetensors_close(st);
}

/* A training plan of a small classifier with `extra` after its relu. */
static ebb_plan *classifier_plan(const char *extra) {
    char text[512];
    snprintf(text, sizeof text,
             "ebb: 1\ninputs: {x: {shape: [batch, 16]}}\n"
             "targets: {y: {shape: [batch], dtype: int64}}\nloss: cross_entropy\n"
             "flow:\n  - from: {linear: {out: 32}}\n  - relu\n%s  - {linear: {out: 4}}\n",
             extra);
    ebb_spec *spec = NULL;
    assert_ok(ebb_spec_load_string(&spec, text, strlen(text), "dropout.yaml"));
    ebb_shape xs = EBB_SHAPE(8, 16), ys = EBB_SHAPE(8);
    ebb_train_options t = {.target_shapes = &ys, .n_target_shapes = 1,
                           .optimizer = ebb_optimizer_defaults(EBB_SGD, 0.1)};
    ebb_compile_options o = {.input_shapes = &xs, .n_input_shapes = 1, .train = &t};
    ebb_plan *plan = NULL;
    if (ebb_spec_compile(&plan, spec, &o) != EBB_OK)
        fail_msg("compile with '%s': %s", extra, ebb_errmsg());
    ebb_spec_free(spec);
    return plan;
}

/* Whether a plan has a step of `op`. */
static int has_op_step(const ebb_plan *p, const char *op) {
    for (int i = 0; i < ebb_plan_step_count(p); i++) {
        const ebb_plan_step *s = ebb_plan_step_at(p, i);
        if (s->op && !strcmp(s->op, op)) return 1;
    }
    return 0;
}

/* Dropout at p = 0 gives its input back, in training too (F.dropout's):
 * the compiler lowers it to identity, so the step keeps no mask and makes
 * no copy, and the plan's peak is that of the model without it. */
static void test_dropout_zero_costs_nothing(void **state) {
    (void)state;
    ebb_plan *none = classifier_plan(""), *zero = classifier_plan("  - {dropout: {p: 0}}\n"),
             *some = classifier_plan("  - {dropout: {p: 0.1}}\n");
    assert_false(has_op_step(zero, "dropout"));
    assert_true(has_op_step(zero, "identity"));
    assert_true(has_op_step(some, "dropout"));
    assert_int_equal(ebb_plan_peak_bytes(zero, NULL), ebb_plan_peak_bytes(none, NULL));
    assert_true(ebb_plan_peak_bytes(some, NULL) > ebb_plan_peak_bytes(none, NULL));
    ebb_plan_free(none);
    ebb_plan_free(zero);
    ebb_plan_free(some);
}

/* keep_all frees nothing and computes the same: its gradients are bitwise
 * the liveness plan's, its peak is the figure the liveness plan reports as
 * its keep_all peak, and its run measures what it plans. */
static void test_keep_all(void **state) {
    (void)state;
    const char *models[] = {"mlp", "residual_tower"};
    problems pr = {0};
    for (size_t k = 0; k < sizeof models / sizeof *models; k++) {
        const char *name = models[k];
        char file[128];
        snprintf(file, sizeof file, "grad_%s", name);
        ebb_safetensors *st = open_fixture(file);
        ebb_spec *spec = load_spec(name);
        ebb_tensor *x = fx_load(st, "x"), *y = fx_load(st, "y");
        ebb_shape xs = ebb_tensor_shape(x), ys;
        ebb_dtype yd;
        ebb_train_options t = fixture_train_options(st, &ys, &yd);
        ebb_plan *plans[2] = {NULL, NULL};
        for (int ka = 0; ka < 2; ka++) {
            ebb_compile_options o = {.input_shapes = &xs, .n_input_shapes = 1, .train = &t,
                                     .keep_all = ka};
            assert_ok(ebb_spec_compile(&plans[ka], spec, &o));
        }
        assert_true(ebb_plan_keep_all(plans[1]));
        if (ebb_plan_peak_bytes(plans[1], NULL) != ebb_plan_keep_all_peak_bytes(plans[0]))
            problem(&pr, "%s: the keep_all plan's peak is %lld, the liveness plan says %lld", name,
                    (long long)ebb_plan_peak_bytes(plans[1], NULL),
                    (long long)ebb_plan_keep_all_peak_bytes(plans[0]));
        ebb_model *m = NULL;
        assert_ok(ebb_model_new(&m, plans[0], CPU, 0));
        load_params(m, st, "");
        int n = ebb_model_param_count(m);
        ebb_tensor **g[2];
        double loss[2];
        ebb_run_stats stats[2];
        trace_log log = {0};
        for (int ka = 0; ka < 2; ka++) {
            g[ka] = calloc((size_t)n, sizeof *g[ka]);
            assert_non_null(g[ka]);
            ebb_run_options ro = {.trace = record, .trace_user = &log};
            assert_ok(ebb_grad_ex(plans[ka], m, &x, &y, &loss[ka], g[ka], ka ? &ro : NULL,
                                  &stats[ka]));
        }
        printf("[ keep_all ] %-20s peak bytes measured %lld, planned %lld; with liveness "
               "measured %lld, planned %lld\n",
               name, (long long)stats[1].measured_peak_bytes,
               (long long)stats[1].planned_peak_bytes, (long long)stats[0].measured_peak_bytes,
               (long long)stats[0].planned_peak_bytes);
        if (loss[0] != loss[1])
            problem(&pr, "%s: keep_all gives the loss %.9g, liveness %.9g", name, loss[1],
                    loss[0]);
        for (int i = 0; i < n; i++) {
            if (!g[0][i] != !g[1][i])
                problem(&pr, "%s: %s: a gradient from one plan only", name,
                        ebb_model_param_name(m, i));
            else if (g[0][i] && !same_bits(g[0][i], g[1][i]))
                problem(&pr, "%s: %s: keep_all gives another gradient", name,
                        ebb_model_param_name(m, i));
        }
        char what[128];
        snprintf(what, sizeof what, "%s keep_all", name);
        if (!ebb_plan_peak_is_bound(plans[1]) &&
            stats[1].measured_peak_bytes != stats[1].planned_peak_bytes)
            problem(&pr, "%s: measured peak %lld != planned %lld", what,
                    (long long)stats[1].measured_peak_bytes,
                    (long long)stats[1].planned_peak_bytes);
        compare_steps(plans[1], &log, what, 0, &pr);
        /* the liveness check can fail: a plan that frees nothing fails it */
        problems none = {0};
        int per_phase[4] = {0}, jumps = 0, absent = 0;
        check_liveness(plans[1], &log, what, per_phase, &jumps, &absent, &none);
        if (!none.n || !strstr(none.text, "was not freed after step"))
            problem(&pr, "%s: the liveness check passes a plan that frees nothing", what);
        /* nothing but outputs is freed */
        for (int e = 0; e < log.n; e++)
            if (log.ev[e].n_freed)
                problem(&pr, "%s: step %d frees %d values", what, log.ev[e].step,
                        log.ev[e].n_freed);
        if (!(stats[0].measured_peak_bytes < stats[1].measured_peak_bytes))
            problem(&pr, "%s: liveness measures %lld, keep_all %lld", name,
                    (long long)stats[0].measured_peak_bytes,
                    (long long)stats[1].measured_peak_bytes);
        log_clear(&log);
        for (int ka = 0; ka < 2; ka++) {
            for (int i = 0; i < n; i++) ebb_tensor_free(g[ka][i]);
            free(g[ka]);
            ebb_plan_free(plans[ka]);
        }
        ebb_model_free(m);
        ebb_tensor_free(x);
        ebb_tensor_free(y);
        ebb_spec_free(spec);
        ebb_safetensors_close(st);
    }
    fail_on_problems(&pr, "keep_all");
}

/* ---- ten training steps ----------------------------------------------------------- */

/* The step models declare their target and loss in the spec. */

static const char MLP_YAML[] = "ebb: 1\n"
                               "name: train_mlp\n"
                               "inputs:\n"
                               "  x: [batch, 8]\n"
                               "targets:\n"
                               "  y: {shape: [batch], dtype: int64}\n"
                               "loss: cross_entropy\n"
                               "flow:\n"
                               "  - from: {linear: {in: 8, out: 16, name: fc1}}\n"
                               "  - relu\n"
                               "  - {linear: {out: 4, name: fc2}}\n";

static const char BN_YAML[] = "ebb: 1\n"
                              "name: train_bn\n"
                              "inputs:\n"
                              "  x: [batch, 8]\n"
                              "targets:\n"
                              "  y: {shape: [batch], dtype: int64}\n"
                              "loss: cross_entropy\n"
                              "flow:\n"
                              "  - from: {linear: {in: 8, out: 16, name: fc1}}\n"
                              "  - {batch_norm: {name: bn1}}\n"
                              "  - relu\n"
                              "  - {linear: {out: 4, name: fc2}}\n";

/* Updates placed by the peak (specs/mlp.yaml): where the weights outweigh
 * the activations (a batch of 2) every update waits for the backward's end,
 * the peak below the placement right after each gradient; a step measures
 * that plan to the byte. At batch 512 the activations dominate and the
 * updates stay. */
static void test_update_placement(void **state) {
    (void)state;
    ebb_spec *spec = NULL;
    assert_ok(ebb_spec_load(&spec, EBB_SOURCE_DIR "/specs/mlp.yaml"));
    for (int k = 0; k < 2; k++) {
        int64_t batch = k ? 512 : 2;
        ebb_shape xs = EBB_SHAPE(batch, 64), ys = EBB_SHAPE(batch);
        ebb_dtype yd = EBB_INT64;
        ebb_train_options t = {.target_shapes = &ys, .n_target_shapes = 1, .target_dtypes = &yd,
                               .optimizer = ebb_optimizer_defaults(EBB_ADAM, 1e-3)};
        ebb_compile_options o = {.input_shapes = &xs, .n_input_shapes = 1, .train = &t};
        ebb_plan *p = NULL;
        assert_ok(ebb_spec_compile(&p, spec, &o));
        int64_t peak = ebb_plan_peak_bytes(p, NULL), eager = ebb_plan_eager_peak_bytes(p);
        int64_t budget = peak; /* the compared figure: the larger of the CPU and CUDA counts */
        ebb_remat_stats rs;
        assert_ok(ebb_plan_remat_stats(p, &rs));
        budget = rs.peak_bytes;
        if (k == 0 && (ebb_plan_updates_in_backward(p) || !(budget < eager)))
            fail_msg("batch 2: updates in the backward %d, peak %lld against %lld eager",
                     ebb_plan_updates_in_backward(p), (long long)budget, (long long)eager);
        if (k == 1 && (!ebb_plan_updates_in_backward(p) || budget != eager))
            fail_msg("batch 512: updates in the backward %d, peak %lld against %lld eager",
                     ebb_plan_updates_in_backward(p), (long long)budget, (long long)eager);
        /* the plan runs as planned, every step after the first to the byte */
        ebb_model *m = NULL;
        ebb_optimizer *opt = NULL;
        ebb_tensor *x = NULL, *y = NULL;
        assert_ok(ebb_model_new(&m, p, CPU, 1));
        assert_ok(ebb_optimizer_new(&opt, m, &t.optimizer));
        assert_ok(ebb_tensor_randn(&x, &xs, EBB_FLOAT32, CPU, 3));
        assert_ok(ebb_tensor_zeros(&y, &ys, EBB_INT64, CPU));
        for (int s = 0; s < 2; s++) {
            ebb_run_stats st = {0};
            double loss = 0;
            assert_ok(ebb_train_step(p, m, opt, &x, &y, &loss, &st));
            if ((s ? st.measured_peak_bytes != st.planned_peak_bytes
                   : st.measured_peak_bytes > st.planned_peak_bytes) ||
                st.planned_peak_bytes != peak)
                fail_msg("batch %lld step %d: measured %lld, planned %lld (plan %lld)",
                         (long long)batch, s, (long long)st.measured_peak_bytes,
                         (long long)st.planned_peak_bytes, (long long)peak);
        }
        ebb_tensor_free(x);
        ebb_tensor_free(y);
        ebb_optimizer_free(opt);
        ebb_model_free(m);
        ebb_plan_free(p);
    }
    ebb_spec_free(spec);
}

/* The case's options as torch.optim resolved them. */
static ebb_optimizer_options case_options(const ebb_safetensors *st, const char *c) {
    char k[10][128];
    const char *names[10] = {"kind",         "lr",    "momentum", "dampening", "nesterov",
                             "weight_decay", "beta1", "beta2",    "eps",       "amsgrad"};
    for (int i = 0; i < 10; i++) snprintf(k[i], sizeof k[i], "%s.hp.%s", c, names[i]);
    return (ebb_optimizer_options){
        .kind = (ebb_optimizer_kind)fx_scalar(st, k[0]),
        .lr = fx_scalar(st, k[1]),
        .momentum = fx_scalar(st, k[2]),
        .dampening = fx_scalar(st, k[3]),
        .nesterov = fx_scalar(st, k[4]) != 0,
        .weight_decay = fx_scalar(st, k[5]),
        .beta1 = fx_scalar(st, k[6]),
        .beta2 = fx_scalar(st, k[7]),
        .eps = fx_scalar(st, k[8]),
        .amsgrad = fx_scalar(st, k[9]) != 0,
        .complete = 1,
    };
}

typedef struct trainer {
    ebb_safetensors *st;
    ebb_spec *spec;
    ebb_plan *plan;
    ebb_model *model;
    ebb_optimizer *opt;
    ebb_optimizer_options oo;
    ebb_tensor *x[STEPS], *y[STEPS];
    const char *name; /* for messages */
    double loss_tol, step_tol; /* the case's bounds: float32's, or bfloat16's */
} trainer;

static void trainer_close(trainer *tr) {
    ebb_optimizer_free(tr->opt);
    ebb_model_free(tr->model);
    ebb_plan_free(tr->plan);
    for (int t = 0; t < STEPS; t++) {
        ebb_tensor_free(tr->x[t]);
        ebb_tensor_free(tr->y[t]);
    }
    ebb_spec_free(tr->spec);
    ebb_safetensors_close(tr->st);
    *tr = (trainer){0};
}

/* trainer_open's flags */
enum { OPEN_GRADS_ONLY = 1, OPEN_LOSS_SCALING = 2, OPEN_KEEP_COPIES = 4, OPEN_RECAST_COPIES = 8,
       OPEN_ACCUMULATE = 16 /* two micro-batches a step, each half the fixture's batch */ };

/* Compiles the step model for the fixture's case c, with the fixture's
 * initial parameters and an optimizer of the case's options. */
static void trainer_open(trainer *tr, const char *fixture, const char *yaml, const char *c,
                         int flags, problems *pr) {
    int grads_only = flags & OPEN_GRADS_ONLY;
    *tr = (trainer){.name = c, .loss_tol = LOSS_RTOL, .step_tol = STEP_RTOL};
    tr->st = open_fixture(fixture);
    if (strstr(c, "_bf16")) {
        const char *why = ebb_test_bf16_unusable();
        ebb_safetensors *ref = why ? NULL : open_reference(fixture);
        if (why || !ref) {
            ebb_safetensors_close(tr->st);
            tr->st = NULL;
            fprintf(stderr, "skipped %s: %s\n", c,
                    why ? why : "no torch reference on this machine (EBB_REFERENCE_DIR)");
            skip();
        }
        ebb_safetensors_close(tr->st);
        tr->st = ref;
    }
    assert_ok(ebb_spec_load_string(&tr->spec, yaml, strlen(yaml), fixture));
    for (int t = 0; t < STEPS; t++) {
        char k[32];
        snprintf(k, sizeof k, "x.%d", t);
        tr->x[t] = fx_load(tr->st, k);
        snprintf(k, sizeof k, "y.%d", t);
        tr->y[t] = fx_load(tr->st, k);
    }
    tr->oo = case_options(tr->st, c);
    ebb_shape xs = ebb_tensor_shape(tr->x[0]), ys = ebb_tensor_shape(tr->y[0]);
    if (flags & OPEN_ACCUMULATE)
        xs.dim[0] = ys.dim[0] = (xs.dim[0] + 1) / 2;
    /* the target's dtype and the loss come from the spec's `targets:` and
     * `loss:`; its shape from the data (the spec's `batch` would be 1) */
    ebb_train_options t = {.target_shapes = &ys, .n_target_shapes = 1, .optimizer = tr->oo,
                           .grads_only = grads_only,
                           .accumulate = flags & OPEN_ACCUMULATE ? 2 : 0,
                           .loss_scaling = (flags & OPEN_LOSS_SCALING) != 0,
                           .low_weight_copies = flags & OPEN_KEEP_COPIES     ? EBB_LOW_COPIES_KEEP
                                                : flags & OPEN_RECAST_COPIES ? EBB_LOW_COPIES_RECAST
                                                                             : EBB_LOW_COPIES_AUTO};
    /* clipping, as torch.nn.utils did it between backward() and step() */
    char ck[2][64];
    snprintf(ck[0], sizeof ck[0], "%s.clip.norm", c);
    snprintf(ck[1], sizeof ck[1], "%s.clip.value", c);
    if (ebb_safetensors_dtype_str(tr->st, ck[0])) t.clip_grad_norm = fx_scalar(tr->st, ck[0]);
    if (ebb_safetensors_dtype_str(tr->st, ck[1])) t.clip_grad_value = fx_scalar(tr->st, ck[1]);
    /* the *_no_decay cases: torch's second param group, the biases, without decay */
    static const char *const biases[] = {"*.bias"};
    if (strstr(c, "no_decay")) {
        t.no_decay = biases;
        t.n_no_decay = 1;
    }
    ebb_compile_options o = {.input_shapes = &xs, .n_input_shapes = 1, .train = &t};
    /* the *_bf16 cases: torch.autocast's bfloat16 around the model */
    char ak[64];
    snprintf(ak, sizeof ak, "%s.clip.autocast", c);
    if (ebb_safetensors_dtype_str(tr->st, ak))
        o.precision = EBB_PRECISION_BF16;
    assert_ok(ebb_spec_compile(&tr->plan, tr->spec, &o));
    check_plan_shape(tr->plan, grads_only, NULL, fixture, pr);
    assert_ok(ebb_model_new(&tr->model, tr->plan, CPU, 0));
    load_params(tr->model, tr->st, "init.");
    ebb_status s = ebb_optimizer_new(&tr->opt, tr->model, &tr->oo);
    for (int i = 0; s == EBB_OK && t.n_no_decay && i < ebb_model_param_count(tr->model); i++)
        if (ebb_plan_param_trained(tr->plan, i) && !ebb_plan_param_decays(tr->plan, i))
            s = ebb_optimizer_set_weight_decay(tr->opt, i, 0);
    /* the *_bias_lr cases: torch's second param group, the biases, at their own rate */
    char bk[64];
    snprintf(bk, sizeof bk, "%s.clip.bias_lr", c);
    if (ebb_safetensors_dtype_str(tr->st, bk)) {
        double scale = fx_scalar(tr->st, bk) / ebb_optimizer_get_options(tr->opt).lr;
        for (int i = 0; s == EBB_OK && i < ebb_model_param_count(tr->model); i++) {
            const char *pn = ebb_model_param_name(tr->model, i);
            size_t n = strlen(pn);
            if (n > 5 && !strcmp(pn + n - 5, ".bias"))
                s = ebb_optimizer_set_lr_scale(tr->opt, i, scale);
        }
    }
    if (s != EBB_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ebb_errmsg());
        trainer_close(tr);
        fail_msg("%s %s: ebb_optimizer_new: %s: %s", fixture, c, ebb_status_name(s), msg);
    }
}

/* Handles the optimizer holds (its state tensors). */
static int64_t state_handles(const ebb_optimizer *opt, int n) {
    int64_t h = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < N_STATE; k++) h += ebb_optimizer_state_tensor(opt, i, STATE_NAMES[k]) != NULL;
    return h;
}

/* One training step t of a plan, with the run's checks: within its plan,
 * its values freed right after their last readers (the gradients at their
 * updates), and no handle left but new optimizer state. Returns 0 when the
 * step failed; *loss and *stats get the step's loss and figures. */
static int checked_step(const ebb_plan *plan, ebb_model *model, ebb_optimizer *opt, ebb_tensor **x,
                        ebb_tensor **y, int t, const char *what, double *loss, ebb_run_stats *stats,
                        problems *pr) {
    trace_log log = {0};
    ebb_run_options ro = {.trace = record, .trace_user = &log};
    int n = ebb_model_param_count(model);
    int64_t live_before = ebb_tensor_live_count() - state_handles(opt, n);
    ebb_status s = ebb_train_step_ex(plan, model, opt, x, y, loss, &ro, stats);
    if (s != EBB_OK) {
        problem(pr, "%s: %s: %s", what, ebb_status_name(s), ebb_errmsg());
        log_clear(&log);
        return 0;
    }
    if (ebb_tensor_live_count() - state_handles(opt, n) != live_before)
        problem(pr, "%s: %lld handles left behind", what,
                (long long)(ebb_tensor_live_count() - state_handles(opt, n) - live_before));
    int bound = ebb_plan_peak_is_bound(plan);
    /* an update's scratch differs between a parameter's first update (which
     * makes its state) and the later ones (ebb_optimizer_scratch_bytes): a
     * plan can be exact for one of them, so the first step need only stay
     * within it */
    if (bound || t == 0 ? stats->measured_peak_bytes > stats->planned_peak_bytes
                       : stats->measured_peak_bytes != stats->planned_peak_bytes)
        problem(pr, "%s: measured peak %lld, planned %lld (%s)", what,
                (long long)stats->measured_peak_bytes, (long long)stats->planned_peak_bytes,
                bound ? "bound" : t == 0 ? "at most" : "exact");
    compare_steps(plan, &log, what, t == 0, pr);
    int per_phase[4] = {0}, jumps = 0, absent = 0;
    check_liveness(plan, &log, what, per_phase, &jumps, &absent, pr);
    if (!per_phase[EBB_PHASE_FORWARD] || !per_phase[EBB_PHASE_BACKWARD])
        problem(pr, "%s: values checked: %d forward, %d backward", what, per_phase[0],
                per_phase[2]);
    log_clear(&log);
    return 1;
}

/* One good step t: the loss is torch's, and checked_step's checks. Returns 0
 * when the step failed. */
static int good_step(trainer *tr, int t, problems *pr) {
    ebb_run_stats stats = {0};
    double loss = NAN;
    char what[96];
    snprintf(what, sizeof what, "%s step %d", tr->name, t);
    if (!checked_step(tr->plan, tr->model, tr->opt, &tr->x[t], &tr->y[t], t, what, &loss, &stats,
                      pr))
        return 0;
    char k[64];
    snprintf(k, sizeof k, "%s.loss.%d", tr->name, t);
    double want = fx_scalar(tr->st, k);
    if (!(rel_scalar(loss, want) <= tr->loss_tol))
        problem(pr, "%s: loss %.9g, torch %.9g", what, loss, want);
    if (t == 0 || t == STEPS - 1)
        printf("[ steps    ] %-14s step %d: loss %.6f (torch %.6f); peak bytes measured %lld, "
               "planned %lld (%s)\n",
               tr->name, t, loss, want, (long long)stats.measured_peak_bytes,
               (long long)stats.planned_peak_bytes,
               ebb_plan_peak_is_bound(tr->plan) ? "bound" : "exact");
    return 1;
}

/* The parameters (buffers too) after ten steps against torch's. */
static void check_final(const trainer *tr, problems *pr) {
    double worst = 0;
    const char *worst_name = "-";
    for (int i = 0; i < ebb_model_param_count(tr->model); i++) {
        const char *pn = ebb_model_param_name(tr->model, i);
        char k[256];
        snprintf(k, sizeof k, "%s.final.%s", tr->name, pn);
        ebb_tensor *want = fx_load(tr->st, k);
        const ebb_tensor *have = ebb_model_param(tr->model, pn);
        if (ebb_tensor_dtype(want) == EBB_INT64) {
            if (!same_bits(have, want)) problem(pr, "%s: %s differs from torch's", tr->name, pn);
        } else {
            double abs_diff = 0, r = rel_error(have, want, k, &abs_diff);
            double tol = tr->step_tol;
            if (!(r <= tol))
                problem(pr, "%s: %s after %d steps: relative error %.3g > %g (max |diff| %.3g)",
                        tr->name, pn, STEPS, r, tol, abs_diff);
            if (r > worst) {
                worst = r;
                worst_name = pn;
            }
        }
        ebb_tensor_free(want);
        int64_t updates = ebb_optimizer_param_step_count(tr->opt, i);
        if (updates != (param_is_buffer(tr->plan, i) ? 0 : STEPS))
            problem(pr, "%s: %s was updated %lld times", tr->name, pn, (long long)updates);
    }
    if (ebb_optimizer_step_count(tr->opt) != STEPS)
        problem(pr, "%s: the optimizer counts %lld steps", tr->name,
                (long long)ebb_optimizer_step_count(tr->opt));
    printf("[ steps    ] %-14s after %d steps: worst parameter rel. error %.2e (%s)\n", tr->name,
           STEPS, worst, worst_name);
}

static void run_steps(const char *fixture, const char *yaml, const char *c) {
    problems pr = {0};
    trainer tr;
    trainer_open(&tr, fixture, yaml, c, 0, &pr);
    int t = 0;
    while (t < STEPS && good_step(&tr, t, &pr)) t++;
    if (t == STEPS) check_final(&tr, &pr);
    trainer_close(&tr);
    fail_on_problems(&pr, c);
}

static void test_steps(void **state) { run_steps("grad_steps_mlp", MLP_YAML, *state); }

/* batch_norm in training mode: batch statistics forward, running statistics
 * and num_batches_tracked updated as torch does. */
static void test_steps_batch_norm(void **state) {
    (void)state;
    run_steps("grad_steps_bn", BN_YAML, "sgd_momentum");
}

/* ---- twenty steps against torch.autocast ------------------------------------------- */

/* Two parity models (make_grad_fixtures.py's steps20) trained for twenty
 * AdamW steps from the fixture's initial parameters on its five batches in
 * turn, once in float32 and once with EBB_PRECISION_BF16, against torch in
 * float32 and under torch.autocast("cpu", dtype=torch.bfloat16) with the
 * loss on float32 outputs. */
#define STEPS20 20
#define MAX_BATCHES20 8
/* float32: the ten-step bounds, LOSS_RTOL and STEP_RTOL, hold after twenty
 * steps. The fixtures' float32 runs are 1.2e-7 (conv_net) and 3.3e-7
 * (transformer_encoder) from float64 runs of the same steps in the losses,
 * 8.9e-7 and 8.0e-7 in the parameters; ebb on torch 1.13 is 0 and 1.2e-7 /
 * 0 and 2.0e-7 from the fixtures, on torch 2.11 1.2e-7 and 1.1e-7 / 1.7e-7
 * and 1.9e-7, where torch 2.11 itself is 1.2e-7 / 1.9e-7 from them.
 *
 * bfloat16 keeps 8 significant bits (unit roundoff 2^-8, 3.9e-3), and
 * AdamW, which divides each element by its own root mean square, turns an
 * ulp in an element whose gradient is near zero into a step of up to lr
 * either way: after twenty steps, two runs that round at different points
 * are about as far apart as a bfloat16 run is from a float32 one. Where the
 * rounding falls depends on the CPU's kernels (AVX-512 or AVX2, oneDNN's or
 * ATen's own), so the bfloat16 run is compared with torch.autocast's run
 * made on this machine at test time by the torch of the libtorch ebb runs
 * on (open_reference), never with a committed run from another CPU:
 *  - same_kernels: ebb calls the kernels torch's modules call, in their
 *    order, so the run is float32's bounds from torch's (measured: bit for
 *    bit on 1.13 with AVX-512 and under the AVX2 caps; 1.1e-7 in the
 *    parameters on 2.11);
 *  - otherwise ebb rounds some products at other points (a matrix product
 *    over [B, T, E] where nn.MultiheadAttention projects the [T, B, E]
 *    transpose), a perturbation as large as bfloat16's own: the run may be
 *    twice as far from torch's as torch's autocast run is from its float32
 *    run on this machine (each bfloat16 run within that distance of the
 *    float32 trajectory, which ebb's float32 run follows to LOSS_RTOL and
 *    STEP_RTOL), measured at 0.35 (losses) and 0.05 to 0.85 (parameters) of
 *    that bound on 1.13 and 2.11.
 * A loss rounded to bfloat16 rather than computed in float32, as ebb plans
 * it, would be up to 3.7e-3 off, beyond either bound. What the bounds
 * cannot tell from float32, check_precision checks on the plan. */

typedef struct steps20_model {
    const char *name; /* grad_steps20_<name>.safetensors; the spec is its "spec" */
    /* text replaced in the spec to make the fixture's model: its "params"
     * set the sizes, these anything else */
    const char *edit[2][2];
    int same_kernels; /* bfloat16 within float32's bounds of torch (above) */
} steps20_model;

static const steps20_model STEPS20_MODELS[] = {
    /* conv -> batch_norm without the convolutions' biases (make_grad_fixtures.py's
     * ConvNet8: a bias before a training batch norm has a zero gradient,
     * which AdamW would turn into steps of noise, and the batch norm's
     * running mean would follow it) */
    {"conv_net",
     {{"name: conv1}", "bias: false, name: conv1}"}, {"name: conv2}", "bias: false, name: conv2}"}},
     1},
    {"transformer_encoder", {{NULL, NULL}}, 0},
};

/* The spec `relative` (to the source tree) at `params` ("name=value,...",
 * may be NULL), with the edits applied. */
static ebb_spec *load_spec_edited(const char *relative, const char *params,
                                  const char *const edit[][2], int n_edit) {
    char path[1024], ptext[512] = "";
    snprintf(path, sizeof path, "%s/%s", EBB_SOURCE_DIR, relative);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    static char text[1 << 16];
    size_t len = fread(text, 1, sizeof text / 2, f);
    fclose(f);
    text[len] = '\0';
    for (int i = 0; i < n_edit && edit[i][0]; i++) {
        char *at = strstr(text, edit[i][0]);
        size_t from = strlen(edit[i][0]), to = strlen(edit[i][1]);
        if (!at) fail_msg("%s no longer has '%s'", path, edit[i][0]);
        memmove(at + to, at + from, len - (size_t)(at - text) - from + 1);
        memcpy(at, edit[i][1], to);
        len = len - from + to;
    }
    const char *p[16];
    int n = 0;
    if (params) {
        snprintf(ptext, sizeof ptext, "%s", params);
        for (char *tok = strtok(ptext, ","); tok && n < 16; tok = strtok(NULL, ","))
            p[n++] = tok;
    }
    ebb_spec_options so = {.params = p, .n_params = n};
    ebb_spec *spec = NULL;
    if (ebb_spec_load_string_ex(&spec, text, len, path, &so) != EBB_OK)
        fail_msg("%s: %s", path, ebb_errmsg());
    return spec;
}

/* The most AdamW's steps move a parameter in `steps` updates beyond its
 * weight decay, whatever its gradients (make_grad_fixtures.py's
 * adamw_drift): m_hat = sum a_k g_k and v_hat = sum c_k g_k^2 give
 * |m_hat| / sqrt(v_hat) <= sqrt(sum a_k^2 / c_k) (Cauchy-Schwarz); eps only
 * shrinks a step. 21.17 lr for twenty steps at betas (0.9, 0.999). */
static double adamw_drift(int steps, double lr, double beta1, double beta2) {
    double total = 0;
    for (int t = 1; t <= steps; t++) {
        double sum = 0;
        for (int k = 1; k <= t; k++) {
            double a = (1 - beta1) * pow(beta1, t - k) / (1 - pow(beta1, t));
            double c = (1 - beta2) * pow(beta2, t - k) / (1 - pow(beta2, t));
            sum += a * a / c;
        }
        total += sqrt(sum);
    }
    return lr * total;
}

/* What one run (float32 or bf16) measured. */
typedef struct run20 {
    int steps;                                  /* the steps that ran */
    double loss[STEPS20], want[STEPS20];        /* ebb's and torch's */
    double worst_loss, worst_param, drift_used; /* rel. errors; |p - decayed| / drift */
    int worst_step, n_zero;                     /* n_zero: tensors with zero-gradient elements */
    char worst_name[128];
    int64_t measured, planned;
    int bound;
    double loss_tol, step_tol; /* the bounds it was held to */
} run20;

/* The parameters after twenty steps against `<c>.final.`: each float tensor
 * by rel_error over its elements whose gradient is not zero in exact
 * arithmetic (the fixture's zero_grad.<param>: 1 where it is), those held
 * to the drift of AdamW's steps around the decayed initial value, which is
 * where exact arithmetic leaves them; integer buffers bit for bit. */
static void check_final20(const ebb_model *m, const ebb_plan *plan, const ebb_optimizer *opt,
                          const ebb_safetensors *st, const char *c, double tol, const char *what,
                          run20 *r, problems *pr) {
    ebb_optimizer_options oo = ebb_optimizer_get_options(opt);
    double drift = adamw_drift(STEPS20, oo.lr, oo.beta1, oo.beta2);
    double decay = pow(1 - oo.lr * oo.weight_decay, STEPS20);
    for (int i = 0; i < ebb_model_param_count(m); i++) {
        const char *pn = ebb_model_param_name(m, i);
        char k[256];
        snprintf(k, sizeof k, "%s.final.%s", c, pn);
        ebb_tensor *want = fx_load(st, k);
        const ebb_tensor *have = ebb_model_param(m, pn);
        if (ebb_tensor_dtype(want) == EBB_INT64) {
            if (!same_bits(have, want)) problem(pr, "%s: %s differs from torch's", what, pn);
            ebb_tensor_free(want);
            continue;
        }
        check_same_shape(have, want, k);
        size_t n = 0, nm = 0;
        double *a = host_f64(have, &n), *b = host_f64(want, &n), *mask = NULL, *init = NULL;
        snprintf(k, sizeof k, "zero_grad.%s", pn);
        if (fx_has(st, k)) {
            ebb_tensor *t = fx_load(st, k);
            mask = host_f64(t, &nm);
            ebb_tensor_free(t);
            snprintf(k, sizeof k, "init.%s", pn);
            t = fx_load(st, k);
            init = host_f64(t, &nm);
            ebb_tensor_free(t);
        }
        double diff = 0, scale = 0, far = 0;
        for (size_t j = 0; j < n; j++) {
            if (mask && mask[j] != 0) {
                double d = fabs(a[j] - init[j] * decay);
                if (!(d <= far)) far = d;
                continue;
            }
            double d = fabs(a[j] - b[j]);
            if (!(d <= diff)) diff = d;
            if (fabs(b[j]) > scale) scale = fabs(b[j]);
        }
        double rel = diff / fmax(scale, 1e-6);
        if (!(rel <= tol))
            problem(pr, "%s: %s after %d steps: relative error %.3g > %g (max |diff| %.3g)", what,
                    pn, STEPS20, rel, tol, diff);
        if (!(far <= drift))
            problem(pr,
                    "%s: %s's zero-gradient elements are %.3g from their decayed initial "
                    "values, beyond AdamW's %d steps (%.4g)",
                    what, pn, far, STEPS20, drift);
        if (mask) {
            r->n_zero++;
            if (!(far / drift <= r->drift_used)) r->drift_used = far / drift;
        }
        if (!r->worst_name[0] || !(rel <= r->worst_param)) {
            r->worst_param = rel;
            snprintf(r->worst_name, sizeof r->worst_name, "%s", pn);
        }
        free(a);
        free(b);
        free(mask);
        free(init);
        ebb_tensor_free(want);
        /* float32 weights and AdamW state, whatever the plan's precision */
        for (int k = 0; k < N_STATE; k++) {
            const ebb_tensor *state = ebb_optimizer_state_tensor(opt, i, STATE_NAMES[k]);
            if (state && ebb_tensor_dtype(state) != EBB_FLOAT32)
                problem(pr, "%s: %s's %s is %s", what, pn, STATE_NAMES[k],
                        ebb_dtype_name(ebb_tensor_dtype(state)));
        }
        int64_t updates = ebb_optimizer_param_step_count(opt, i);
        if (updates != (param_is_buffer(plan, i) ? 0 : STEPS20))
            problem(pr, "%s: %s was updated %lld times", what, pn, (long long)updates);
    }
    if (ebb_optimizer_step_count(opt) != STEPS20)
        problem(pr, "%s: the optimizer counts %lld steps", what,
                (long long)ebb_optimizer_step_count(opt));
}

/* autocast's policy in the plan, which the numbers above cannot tell from
 * float32 after twenty steps: every matrix product of the forward (linear,
 * conv2d, multi_head_attention) makes bfloat16 in a bf16 plan and float32
 * in a float32 one, and the loss is float32 in both. */
static void check_precision(const ebb_plan *plan, int bf16, const char *what, problems *pr) {
    static const char *const products[] = {"linear", "conv2d", "multi_head_attention"};
    int n_products = 0, n_loss = 0;
    for (int i = 0; i < ebb_plan_step_count(plan); i++) {
        const ebb_plan_step *s = ebb_plan_step_at(plan, i);
        if (s->kind != EBB_STEP_OP || s->n_out < 1 || s->recompute) continue;
        ebb_dtype dt = ebb_plan_value_at(plan, s->out[0])->dtype;
        int product = 0;
        for (size_t k = 0; k < sizeof products / sizeof *products; k++)
            product |= strcmp(s->op, products[k]) == 0;
        if (s->phase == EBB_PHASE_FORWARD && product) {
            n_products++;
            if (dt != (bf16 ? EBB_BFLOAT16 : EBB_FLOAT32))
                problem(pr, "%s: step %d (%s %s) makes %s", what, i, s->op, s->node,
                        ebb_dtype_name(dt));
        }
        if (s->phase == EBB_PHASE_LOSS) {
            n_loss++;
            if (dt != EBB_FLOAT32)
                problem(pr, "%s: loss step %d (%s) makes %s", what, i, s->op, ebb_dtype_name(dt));
        }
    }
    if (!n_products || !n_loss)
        problem(pr, "%s: %d matrix products, %d loss steps", what, n_products, n_loss);
}

/* Twenty steps of the fixture's model at one precision, as its case c. */
static void run20_case(const ebb_safetensors *st, const ebb_spec *spec, const steps20_model *sm,
                       int bf16, ebb_tensor **x, ebb_tensor **y, int n_batches, double loss_tol,
                       double step_tol, run20 *r, problems *pr) {
    const char *c = bf16 ? "adamw_bf16" : "adamw";
    char what[96];
    snprintf(what, sizeof what, "%s %s", sm->name, bf16 ? "bf16" : "fp32");
    *r = (run20){.loss_tol = loss_tol, .step_tol = step_tol};
    ebb_shape xs = ebb_tensor_shape(x[0]), ys = ebb_tensor_shape(y[0]);
    ebb_dtype yd = ebb_tensor_dtype(y[0]);
    const char *loss = ebb_safetensors_metadata(st, "loss");
    assert_non_null(loss);
    ebb_optimizer_options oo = case_options(st, "adamw"); /* one optimizer for both */
    ebb_train_options t = {.target_shapes = &ys,
                           .n_target_shapes = 1,
                           .target_dtypes = &yd,
                           .loss = loss,
                           .optimizer = oo};
    ebb_compile_options o = {.input_shapes = &xs,
                             .n_input_shapes = 1,
                             .train = &t,
                             .precision = bf16 ? EBB_PRECISION_BF16 : EBB_PRECISION_FP32};
    ebb_plan *plan = NULL;
    if (ebb_spec_compile(&plan, spec, &o) != EBB_OK) {
        problem(pr, "%s: compile: %s", what, ebb_errmsg());
        return;
    }
    check_plan_shape(plan, 0, NULL, what, pr);
    check_precision(plan, bf16, what, pr);
    if (strcmp(plan_loss_op(plan), loss) != 0)
        problem(pr, "%s: the plan's loss is '%s', torch's %s", what, plan_loss_op(plan), loss);
    r->bound = ebb_plan_peak_is_bound(plan);
    ebb_model *m = NULL;
    ebb_optimizer *opt = NULL;
    assert_ok(ebb_model_new(&m, plan, CPU, 0));
    load_params(m, st, "init.");
    if (ebb_optimizer_new(&opt, m, &oo) != EBB_OK) {
        problem(pr, "%s: ebb_optimizer_new: %s", what, ebb_errmsg());
        ebb_model_free(m);
        ebb_plan_free(plan);
        return;
    }
    for (int k = 0; k < STEPS20; k++) {
        char sw[128], key[64];
        snprintf(sw, sizeof sw, "%s step %d", what, k + 1);
        ebb_run_stats stats = {0};
        if (!checked_step(plan, m, opt, &x[k % n_batches], &y[k % n_batches], k, sw, &r->loss[k],
                          &stats, pr))
            break;
        r->steps++;
        snprintf(key, sizeof key, "%s.loss.%d", c, k);
        r->want[k] = fx_scalar(st, key);
        double e = rel_scalar(r->loss[k], r->want[k]);
        if (!(e <= loss_tol))
            problem(pr, "%s: loss %.9g, torch %.9g: relative error %.3g > %g", sw, r->loss[k],
                    r->want[k], e, loss_tol);
        if (r->worst_step == 0 || !(e <= r->worst_loss)) {
            r->worst_loss = e;
            r->worst_step = k + 1;
        }
        if (stats.measured_peak_bytes > r->measured) r->measured = stats.measured_peak_bytes;
        if (stats.planned_peak_bytes > r->planned) r->planned = stats.planned_peak_bytes;
    }
    if (r->steps == STEPS20) check_final20(m, plan, opt, st, c, step_tol, what, r, pr);
    ebb_optimizer_free(opt);
    ebb_model_free(m);
    ebb_plan_free(plan);
}

/* The largest rel_scalar between the fixture's float32 and autocast losses,
 * and rel_error between their parameters after twenty steps (zero-gradient
 * elements left out): how far bfloat16 takes torch itself, for scale. */
static void torch_bf16_gap(const ebb_safetensors *st, double *loss, double *param) {
    *loss = *param = 0;
    for (int k = 0; k < STEPS20; k++) {
        char a[64], b[64];
        snprintf(a, sizeof a, "adamw_bf16.loss.%d", k);
        snprintf(b, sizeof b, "adamw.loss.%d", k);
        *loss = fmax(*loss, rel_scalar(fx_scalar(st, a), fx_scalar(st, b)));
    }
    for (int i = 0; i < ebb_safetensors_count(st); i++) {
        const char *key = ebb_safetensors_name_at(st, i);
        if (strncmp(key, "adamw.final.", 12) != 0) continue;
        char other[256], mk[256];
        snprintf(other, sizeof other, "adamw_bf16.final.%s", key + 12);
        snprintf(mk, sizeof mk, "zero_grad.%s", key + 12);
        ebb_tensor *f = fx_load(st, key), *h = fx_load(st, other);
        if (ebb_tensor_dtype(f) != EBB_INT64) {
            size_t n = 0, nm = 0;
            double *fa = host_f64(f, &n), *ha = host_f64(h, &n), *mask = NULL;
            if (fx_has(st, mk)) {
                ebb_tensor *t = fx_load(st, mk);
                mask = host_f64(t, &nm);
                ebb_tensor_free(t);
            }
            double diff = 0, scale = 0;
            for (size_t j = 0; j < n; j++) {
                if (mask && mask[j] != 0) continue;
                diff = fmax(diff, fabs(ha[j] - fa[j]));
                scale = fmax(scale, fabs(fa[j]));
            }
            *param = fmax(*param, diff / fmax(scale, 1e-6));
            free(fa);
            free(ha);
            free(mask);
        }
        ebb_tensor_free(f);
        ebb_tensor_free(h);
    }
}

static void test_steps20(void **state) {
    const steps20_model *sm = *state;
    char file[128];
    snprintf(file, sizeof file, "grad_steps20_%s", sm->name);
    ebb_safetensors *st = open_fixture(file);
    const char *spec_file = ebb_safetensors_metadata(st, "spec");
    const char *steps = ebb_safetensors_metadata(st, "steps");
    assert_non_null(spec_file);
    if (!steps || atoi(steps) != STEPS20)
        fail_msg("%s: %s steps, the test runs %d", file, steps ? steps : "no", STEPS20);
    ebb_spec *spec =
        load_spec_edited(spec_file, ebb_safetensors_metadata(st, "params"), sm->edit, 2);
    ebb_tensor *x[MAX_BATCHES20] = {0}, *y[MAX_BATCHES20] = {0};
    int nb = 0;
    for (; nb < MAX_BATCHES20; nb++) {
        char k[32];
        snprintf(k, sizeof k, "x.%d", nb);
        if (!fx_has(st, k)) break;
        x[nb] = fx_load(st, k);
        snprintf(k, sizeof k, "y.%d", nb);
        y[nb] = fx_load(st, k);
    }
    assert_true(nb > 0);
    problems pr = {0};
    run20 r[2] = {0};
    /* bfloat16 against torch's autocast run on this machine (open_reference) */
    const char *skip_bf16 = ebb_test_bf16_unusable();
    ebb_safetensors *ref = skip_bf16 ? NULL : open_reference(file);
    if (!skip_bf16 && !ref)
        skip_bf16 = "no torch reference on this machine (EBB_REFERENCE_DIR)";
    run20_case(st, spec, sm, 0, x, y, nb, LOSS_RTOL, STEP_RTOL, &r[0], &pr);
    double gap_loss = 0, gap_param = 0;
    if (ref) {
        torch_bf16_gap(ref, &gap_loss, &gap_param);
        double loss_tol = sm->same_kernels ? LOSS_RTOL : 2 * gap_loss + LOSS_RTOL;
        double step_tol = sm->same_kernels ? STEP_RTOL : 2 * gap_param + STEP_RTOL;
        run20_case(ref, spec, sm, 1, x, y, nb, loss_tol, step_tol, &r[1], &pr);
    }

    /* the trajectories side by side */
    printf("[ steps20  ] %s (libtorch %s), %d batches in turn; loss at each step (relative "
           "error):\n",
           sm->name, ebb_torch_version(), nb);
    printf("[ steps20  ]   step   torch fp32     ebb fp32             torch autocast "
           "ebb bf16\n");
    for (int k = 0; k < STEPS20 && k < r[0].steps; k++) {
        printf("[ steps20  ]   %4d   %.6f  %.6f (%.1e)", k + 1, r[0].want[k], r[0].loss[k],
               rel_scalar(r[0].loss[k], r[0].want[k]));
        if (k < r[1].steps)
            printf("   %.6f  %.6f (%.1e)", r[1].want[k], r[1].loss[k],
                   rel_scalar(r[1].loss[k], r[1].want[k]));
        printf("\n");
    }
    if (skip_bf16)
        printf("[ steps20  ] %s bf16: not run: %s\n", sm->name, skip_bf16);
    for (int bf16 = 0; bf16 < (skip_bf16 ? 1 : 2); bf16++) {
        char drift_text[96] = "";
        if (r[bf16].n_zero)
            snprintf(drift_text, sizeof drift_text,
                     "; zero-gradient elements at %.2f of AdamW's drift", r[bf16].drift_used);
        printf("[ steps20  ] %s %s: worst loss rel. error %.2e (step %d; bound %g), parameters "
               "after %d steps %.2e (%s; bound %g)%s; peak bytes measured %lld, planned %lld "
               "(%s)\n",
               sm->name, bf16 ? "bf16" : "fp32", r[bf16].worst_loss, r[bf16].worst_step,
               r[bf16].loss_tol, STEPS20, r[bf16].worst_param, r[bf16].worst_name,
               r[bf16].step_tol, drift_text,
               (long long)r[bf16].measured, (long long)r[bf16].planned,
               r[bf16].bound ? "bound" : "exact");
    }
    if (ref)
        printf("[ steps20  ] %s torch autocast vs torch fp32 on this machine: losses %.2e, "
               "parameters %.2e\n",
               sm->name, gap_loss, gap_param);

    for (int i = 0; i < nb; i++) {
        ebb_tensor_free(x[i]);
        ebb_tensor_free(y[i]);
    }
    ebb_spec_free(spec);
    ebb_safetensors_close(st);
    ebb_safetensors_close(ref);
    fail_on_problems(&pr, sm->name);
}

/* The optimizer keeps state for the trained parameters only, made with it:
 * the plan's figure, and nothing for batch_norm's running statistics, which
 * an update refuses by name. */
static void test_state_for_trained_parameters(void **state) {
    (void)state;
    problems pr = {0};
    trainer tr;
    trainer_open(&tr, "grad_steps_bn", BN_YAML, "sgd_momentum", 0, &pr);
    int64_t most = 0, now = ebb_optimizer_state_bytes(tr.opt, &most);
    assert_int_equal(now, most);
    assert_int_equal(now, ebb_plan_optimizer_state_bytes(tr.plan));
    int buffers = 0;
    for (int i = 0; i < ebb_model_param_count(tr.model); i++) {
        const char *name = ebb_model_param_name(tr.model, i);
        if (!strstr(name, "running_mean"))
            continue;
        buffers++;
        assert_null(ebb_optimizer_state_tensor(tr.opt, i, "momentum_buffer"));
        ebb_tensor *g = NULL;
        assert_ok(ebb_tensor_clone(&g, ebb_model_param(tr.model, name)));
        assert_int_equal(ebb_optimizer_update(tr.opt, i, g), EBB_ERR_ARG);
        assert_errmsg_contains("is a buffer");
        assert_errmsg_contains(name);
        ebb_tensor_free(g);
    }
    assert_true(buffers > 0);
    assert_int_equal(ebb_optimizer_state_bytes(tr.opt, NULL), now);
    trainer_close(&tr);
}

/* ---- failed steps change nothing -------------------------------------------------- */

typedef struct snapshot {
    int n;
    ebb_tensor **params;
    ebb_tensor **state; /* n * N_STATE, NULL where there is none */
    int64_t *counts;
    int64_t steps, state_bytes;
} snapshot;

static void snap_take(snapshot *sn, const trainer *tr) {
    int n = ebb_model_param_count(tr->model);
    sn->n = n;
    sn->params = calloc((size_t)n, sizeof *sn->params);
    sn->state = calloc((size_t)n * N_STATE, sizeof *sn->state);
    sn->counts = calloc((size_t)n, sizeof *sn->counts);
    assert_true(sn->params && sn->state && sn->counts);
    for (int i = 0; i < n; i++) {
        assert_ok(ebb_tensor_clone(&sn->params[i],
                                   ebb_model_param(tr->model, ebb_model_param_name(tr->model, i))));
        for (int k = 0; k < N_STATE; k++) {
            const ebb_tensor *s = ebb_optimizer_state_tensor(tr->opt, i, STATE_NAMES[k]);
            if (s) assert_ok(ebb_tensor_clone(&sn->state[i * N_STATE + k], s));
        }
        sn->counts[i] = ebb_optimizer_param_step_count(tr->opt, i);
    }
    sn->steps = ebb_optimizer_step_count(tr->opt);
    sn->state_bytes = ebb_optimizer_state_bytes(tr->opt, NULL);
}

/* Everything bitwise as in the snapshot. */
static void snap_check(const snapshot *sn, const trainer *tr, const char *what, problems *pr) {
    for (int i = 0; i < sn->n; i++) {
        const char *pn = ebb_model_param_name(tr->model, i);
        if (!same_bits(ebb_model_param(tr->model, pn), sn->params[i]))
            problem(pr, "%s: parameter %s changed", what, pn);
        for (int k = 0; k < N_STATE; k++) {
            const ebb_tensor *s = ebb_optimizer_state_tensor(tr->opt, i, STATE_NAMES[k]);
            const ebb_tensor *was = sn->state[i * N_STATE + k];
            if (!s != !was || (s && !same_bits(s, was)))
                problem(pr, "%s: optimizer state %s of %s changed", what, STATE_NAMES[k], pn);
        }
        if (ebb_optimizer_param_step_count(tr->opt, i) != sn->counts[i])
            problem(pr, "%s: the update count of %s changed", what, pn);
    }
    if (ebb_optimizer_step_count(tr->opt) != sn->steps)
        problem(pr, "%s: the optimizer's step count changed", what);
    if (ebb_optimizer_state_bytes(tr->opt, NULL) != sn->state_bytes)
        problem(pr, "%s: the optimizer's state bytes changed", what);
}

static void snap_free(snapshot *sn) {
    for (int i = 0; i < sn->n; i++) {
        ebb_tensor_free(sn->params[i]);
        for (int k = 0; k < N_STATE; k++) ebb_tensor_free(sn->state[i * N_STATE + k]);
    }
    free(sn->params);
    free(sn->state);
    free(sn->counts);
    *sn = (snapshot){0};
}

/* Rows [from, from + n) of x, a tensor of its own. */
static ebb_tensor *rows_of(const ebb_tensor *x, int64_t from, int64_t n) {
    ebb_tensor *view = NULL, *copy = NULL;
    assert_ok(ebb_tensor_narrow(&view, x, 0, from, n));
    assert_ok(ebb_tensor_clone(&copy, view));
    ebb_tensor_free(view);
    return copy;
}

/* An accumulating plan's shape: one grad_sum per trained parameter, in
 * the backward; one grad_sums step, whose jump ends the plan and whose
 * outputs are the optimizer's sums (held, counted beside the parameters). */
static void check_accumulating_plan(const ebb_plan *plan, const char *what, problems *pr) {
    int n = ebb_plan_step_count(plan), n_sums = 0, n_trained = 0;
    int64_t held = 0, trained_bytes = 0;
    int *sums = calloc((size_t)ebb_plan_param_count(plan) + 1, sizeof *sums);
    assert_non_null(sums);
    for (int i = 0; i < n; i++) {
        const ebb_plan_step *s = ebb_plan_step_at(plan, i);
        if (s->kind == EBB_STEP_GRAD_SUM && s->phase == EBB_PHASE_BACKWARD && s->n_in == 1 &&
            s->n_out == 0 && s->param >= 0)
            sums[s->param]++;
        if (s->kind != EBB_STEP_GRAD_SUMS) continue;
        n_sums++;
        if (s->jump != n || s->n_in != 0)
            problem(pr, "%s: grad_sums (step %d) jumps to %d of %d steps, reads %d", what, i,
                    s->jump, n, s->n_in);
        for (int k = 0; k < s->n_out; k++) {
            const ebb_plan_value *v = ebb_plan_value_at(plan, s->out[k]);
            if (v->kind != EBB_VALUE_HELD) problem(pr, "%s: a sum is no held value", what);
            held += v->nbytes;
        }
    }
    for (int i = 0; i < ebb_plan_param_count(plan); i++) {
        if (!ebb_plan_param_trained(plan, i)) continue;
        n_trained++;
        const char *name = NULL;
        const ebb_param_spec *ps = ebb_plan_param_at(plan, i, &name);
        trained_bytes += ebb_shape_numel(&ps->shape) * 4;
        if (sums[i] != 1) problem(pr, "%s: %d grad_sum steps for %s", what, sums[i], name);
    }
    if (n_sums != 1 || held != trained_bytes || ebb_plan_grad_sums_bytes(plan) != held)
        problem(pr, "%s: %d grad_sums steps holding %lld bytes (plan: %lld), %d trained "
                    "parameters of %lld bytes",
                what, n_sums, (long long)held, (long long)ebb_plan_grad_sums_bytes(plan),
                n_trained, (long long)trained_bytes);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    ebb_plan_print(plan, f);
    fclose(f);
    if (!strstr(text, "accumulation: 2 micro-batches a step") || !strstr(text, "grad_sums"))
        problem(pr, "%s: the listing does not show the accumulation:\n%s", what, text);
    free(text);
    free(sums);
}

/* Every steps case again, each batch as two micro-batches of an
 * accumulating plan (ebb_train_options.accumulate 2), each micro-batch's
 * loss weighted by its share: after ten steps the parameters are torch's
 * within the case's bounds. The first micro-batch of a step changes no
 * parameter and no state (it stops at grad_sums); every run stays within
 * its plan, and the step's last, after the first step, meets it to the
 * byte; no handle is left but the optimizer's state and sums. */
static void test_accumulated_steps(void **state) {
    const char *c = *state;
    problems pr = {0};
    trainer tr;
    trainer_open(&tr, "grad_steps_mlp", MLP_YAML, c, OPEN_ACCUMULATE, &pr);
    char what[96];
    snprintf(what, sizeof what, "%s, accumulated", c);
    check_plan_shape(tr.plan, 0, NULL, what, &pr);
    check_accumulating_plan(tr.plan, what, &pr);
    int n = ebb_model_param_count(tr.model), sum_handles = 0;
    for (int i = 0; i < n; i++) sum_handles += ebb_plan_param_trained(tr.plan, i) != 0;
    for (int t = 0; t < STEPS && !pr.n; t++) {
        int64_t b = ebb_tensor_shape(tr.x[t]).dim[0], half = (b + 1) / 2;
        double step_loss = 0;
        for (int k = 0; k < 2; k++) {
            int64_t from = k ? half : 0, cnt = k ? b - half : half;
            ebb_tensor *x = rows_of(tr.x[t], from, cnt), *y = rows_of(tr.y[t], from, cnt);
            snapshot sn = {0};
            if (k == 0) snap_take(&sn, &tr);
            int64_t live = ebb_tensor_live_count() - state_handles(tr.opt, n);
            ebb_run_options ro = {.loss_scale = (double)cnt / (double)b,
                                  .micro_batch = k,
                                  .micro_batches = 2};
            ebb_run_stats rs = {0};
            double l = NAN;
            ebb_status st = ebb_train_step_ex(tr.plan, tr.model, tr.opt, &x, &y, &l, &ro, &rs);
            if (st != EBB_OK)
                problem(&pr, "%s step %d micro-batch %d: %s", what, t, k, ebb_errmsg());
            step_loss += l * (double)cnt / (double)b;
            int64_t left = ebb_tensor_live_count() - state_handles(tr.opt, n) - live;
            if (left != (t == 0 && k == 0 ? sum_handles : 0))
                problem(&pr, "%s step %d micro-batch %d: %lld handles left", what, t, k,
                        (long long)left);
            if (rs.measured_peak_bytes > rs.planned_peak_bytes || rs.over_step >= 0 ||
                (t > 0 && k == 1 && cnt == half &&
                 rs.measured_peak_bytes != rs.planned_peak_bytes))
                problem(&pr, "%s step %d micro-batch %d: measured %lld, planned %lld (step %d "
                             "over)",
                        what, t, k, (long long)rs.measured_peak_bytes,
                        (long long)rs.planned_peak_bytes, rs.over_step);
            if (k == 0) {
                snap_check(&sn, &tr, "a step's first micro-batch", &pr);
                snap_free(&sn);
                if (rs.steps_executed >= ebb_plan_step_count(tr.plan))
                    problem(&pr, "%s: the first micro-batch ran all %lld steps", what,
                            (long long)rs.steps_executed);
            }
            ebb_tensor_free(x);
            ebb_tensor_free(y);
        }
        char k[64];
        snprintf(k, sizeof k, "%s.loss.%d", c, t);
        if (!(rel_scalar(step_loss, fx_scalar(tr.st, k)) <= tr.loss_tol))
            problem(&pr, "%s step %d: loss %.9g, torch %.9g", what, t, step_loss,
                    fx_scalar(tr.st, k));
    }
    if (!pr.n) check_final(&tr, &pr);
    trainer_close(&tr);
    fail_on_problems(&pr, what);
}

/* A step given `x` and `target` (and `opt`, or the trainer's) must fail with
 * a message (containing `needle` when given), leave everything bitwise as it
 * was and no handle behind. */
static void failing_step(trainer *tr, ebb_tensor *x, ebb_tensor *target, ebb_optimizer *opt,
                         const char *what, const char *needle, problems *pr) {
    snapshot sn = {0};
    snap_take(&sn, tr);
    int64_t live = ebb_tensor_live_count();
    double loss = 12345.0;
    ebb_run_stats stats;
    ebb_error_clear();
    ebb_status s = ebb_train_step(tr->plan, tr->model, opt ? opt : tr->opt, &x, &target, &loss,
                                  &stats);
    if (s == EBB_OK) {
        problem(pr, "%s: the step succeeded", what);
    } else {
        printf("[ failure  ] %s: %s: %s\n", what, ebb_status_name(s), ebb_errmsg());
        if (!*ebb_errmsg()) problem(pr, "%s: no message", what);
        if (needle && !strstr(ebb_errmsg(), needle))
            problem(pr, "%s: the message lacks \"%s\"", what, needle);
    }
    if (ebb_tensor_live_count() != live)
        problem(pr, "%s: %lld handles left behind", what,
                (long long)(ebb_tensor_live_count() - live));
    snap_check(&sn, tr, what, pr);
    snap_free(&sn);
}

/* Dynamic loss scaling (GradScaler's rules) on the MLP's ten AdamW steps: a
 * scale that is a power of two changes no bit of a float32 gradient, so the
 * scaled steps end bit for bit where the plain ones do (and where torch's
 * do, to the usual tolerance), except that one step fed a NaN is skipped:
 * nothing changes, and the scale backs off. The scale grows after every
 * growth_interval good steps, is saved with the optimizer, and a plan that
 * scales refuses an optimizer without a scale. */
static void test_loss_scaling(void **state) {
    (void)state;
    problems pr = {0};
    trainer plain, scaled;
    trainer_open(&plain, "grad_steps_mlp", MLP_YAML, "adamw", 0, &pr);
    trainer_open(&scaled, "grad_steps_mlp", MLP_YAML, "adamw", OPEN_LOSS_SCALING, &pr);
    assert_true(ebb_plan_loss_scaling(scaled.plan) && !ebb_plan_loss_scaling(plain.plan));
    assert_false(ebb_plan_updates_in_backward(scaled.plan));

    /* the listing says where the gradients are unscaled and what waiting costs */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    ebb_plan_print(scaled.plan, f);
    fclose(f);
    if (!strstr(text, "unscale") || !strstr(text, "loss scaling: the updates wait"))
        problem(&pr, "the listing does not show the unscale step and its cost:\n%s", text);
    free(text);

    ebb_loss_scaling ls = {.init_scale = 1024, .growth_interval = 3};
    assert_ok(ebb_optimizer_set_loss_scaling(scaled.opt, &ls));
    assert_true(ebb_optimizer_loss_scale(scaled.opt) == 1024.0);
    assert_true(ebb_optimizer_loss_scale(plain.opt) == 0.0);
    ebb_loss_scaling bad = {.backoff_factor = 1.5};
    assert_int_equal(ebb_optimizer_set_loss_scaling(scaled.opt, &bad), EBB_ERR_ARG);
    assert_errmsg_contains("backoff_factor 1.5");
    assert_true(ebb_optimizer_loss_scale(scaled.opt) == 1024.0);

    /* an optimizer without a scale: refused before anything runs */
    ebb_optimizer *unscaled = NULL;
    assert_ok(ebb_optimizer_new(&unscaled, scaled.model, &scaled.oo));
    failing_step(&scaled, scaled.x[0], scaled.y[0], unscaled, "an optimizer without a scale",
                 "has no loss scale", &pr);
    ebb_optimizer_free(unscaled);

    /* a NaN in the batch: every gradient is NaN, the step is skipped */
    ebb_tensor *nan_x = NULL;
    {
        ebb_shape xs = ebb_tensor_shape(scaled.x[0]);
        size_t n = (size_t)ebb_shape_numel(&xs);
        float *v = malloc(n * sizeof *v);
        assert_non_null(v);
        assert_ok(ebb_tensor_to_host(scaled.x[0], v, n * sizeof *v));
        v[0] = NAN;
        assert_ok(ebb_tensor_from_host(&nan_x, v, n * sizeof *v, &xs, EBB_FLOAT32, CPU));
        free(v);
    }
    double want_scale[STEPS] = {1024, 1024, 2048, 2048, 1024, 1024, 2048, 2048, 2048, 4096};
    char path[256];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/ebb_scaler_%ld.safetensors", tmp && *tmp ? tmp : "/tmp",
             (long)getpid());
    for (int t = 0; t < STEPS; t++) {
        if (t == 8) {
            /* the scale and its count of good steps (1 of 3 here) are saved
             * with the optimizer: the step after next grows the scale only
             * if the count came back */
            ebb_optimizer *back = NULL;
            assert_ok(ebb_optimizer_save(scaled.opt, path));
            assert_ok(ebb_optimizer_new(&back, scaled.model, &scaled.oo));
            assert_ok(ebb_optimizer_load(back, path));
            unlink(path);
            if (ebb_optimizer_loss_scale(back) != 2048.0)
                problem(&pr, "the loaded scale is %g", ebb_optimizer_loss_scale(back));
            ebb_optimizer_free(scaled.opt);
            scaled.opt = back;
        }
        if (t == 4) {
            snapshot sn = {0};
            snap_take(&sn, &scaled);
            ebb_run_stats rs = {0};
            double loss = 0;
            int64_t live = ebb_tensor_live_count();
            assert_ok(ebb_train_step(scaled.plan, scaled.model, scaled.opt, &nan_x, &scaled.y[t],
                                     &loss, &rs));
            if (!isnan(loss)) problem(&pr, "the NaN step's loss is %g", loss);
            if (ebb_tensor_live_count() != live)
                problem(&pr, "the skipped step left %lld handles",
                        (long long)(ebb_tensor_live_count() - live));
            if (rs.measured_peak_bytes > rs.planned_peak_bytes)
                problem(&pr, "the skipped step measured %lld, over its plan %lld",
                        (long long)rs.measured_peak_bytes, (long long)rs.planned_peak_bytes);
            snap_check(&sn, &scaled, "the skipped step", &pr);
            snap_free(&sn);
            if (ebb_optimizer_loss_scale(scaled.opt) != 1024.0 ||
                ebb_optimizer_scaled_skips(scaled.opt) != 1)
                problem(&pr, "after the skipped step: scale %g, %lld skipped",
                        ebb_optimizer_loss_scale(scaled.opt),
                        (long long)ebb_optimizer_scaled_skips(scaled.opt));
        }
        if (!good_step(&plain, t, &pr) || !good_step(&scaled, t, &pr)) break;
        if (ebb_optimizer_loss_scale(scaled.opt) != want_scale[t])
            problem(&pr, "after step %d the scale is %g, GradScaler's %g", t,
                    ebb_optimizer_loss_scale(scaled.opt), want_scale[t]);
    }
    check_final(&scaled, &pr);
    for (int i = 0; i < ebb_model_param_count(plain.model); i++) {
        const char *pn = ebb_model_param_name(plain.model, i);
        if (!same_bits(ebb_model_param(plain.model, pn), ebb_model_param(scaled.model, pn)))
            problem(&pr, "%s differs from the unscaled steps'", pn);
    }

    /* a gradient plan has no update to skip */
    ebb_shape xs = ebb_tensor_shape(scaled.x[0]), ys = ebb_tensor_shape(scaled.y[0]);
    ebb_train_options go = {.target_shapes = &ys, .n_target_shapes = 1, .optimizer = scaled.oo,
                            .grads_only = 1, .loss_scaling = 1};
    ebb_compile_options co = {.input_shapes = &xs, .n_input_shapes = 1, .train = &go};
    ebb_plan *p = NULL;
    assert_int_equal(ebb_spec_compile(&p, scaled.spec, &co), EBB_ERR_ARG);
    assert_errmsg_contains("loss_scaling needs update steps");
    assert_null(p);

    ebb_tensor_free(nan_x);
    trainer_close(&plain);
    trainer_close(&scaled);
    fail_on_problems(&pr, "loss scaling");
}

/* Mixed precision: a weight's low copy kept from the forward for the
 * backward, or cast again there (graph/copies.c). Casting is exact, so the
 * ten bf16 AdamW steps end bit for bit alike either way, each within
 * torch.autocast's tolerance and at its own plan's peak to the byte; the
 * compiler's own choice never plans a higher peak than casting again. */
static void test_low_weight_copies(void **state) {
    (void)state;
    problems pr = {0};
    trainer tr[3];
    static const int flags[3] = {0, OPEN_KEEP_COPIES, OPEN_RECAST_COPIES};
    static const char *const how[3] = {"chosen", "kept", "recast"};
    int kept[3], recast[3];
    int64_t kept_bytes[3];
    for (int k = 0; k < 3; k++) {
        trainer_open(&tr[k], "grad_steps_mlp", MLP_YAML, "adamw_bf16", flags[k], &pr);
        kept[k] = ebb_plan_low_copies(tr[k].plan, &kept_bytes[k], &recast[k]);
        printf("[ copies   ] %-6s: %d kept (%lld bytes), %d cast again; peak %lld bytes, CUDA "
               "%lld\n",
               how[k], kept[k], (long long)kept_bytes[k], recast[k],
               (long long)ebb_plan_peak_bytes(tr[k].plan, NULL),
               (long long)ebb_plan_device_peak_bytes(tr[k].plan, (ebb_device){EBB_DEVICE_CUDA, 0}));
    }
    int total = kept[1] + recast[1];
    if (total == 0 || recast[1] != 0 || kept[2] != 0 || kept[0] + recast[0] != total ||
        kept[2] + recast[2] != total)
        problem(&pr, "copies kept/cast again: chosen %d/%d, keep %d/%d, recast %d/%d", kept[0],
                recast[0], kept[1], recast[1], kept[2], recast[2]);
    /* every parameter of the MLP is a linear's, so every copy kept is half
     * the float32 parameters' bytes */
    if (kept_bytes[1] != ebb_plan_param_bytes(tr[1].plan) / 2)
        problem(&pr, "every copy kept is %lld bytes, the parameters %lld", (long long)kept_bytes[1],
                (long long)ebb_plan_param_bytes(tr[1].plan));
    for (int d = 0; d < 2; d++) {
        ebb_device dev = {d ? EBB_DEVICE_CUDA : EBB_DEVICE_CPU, 0};
        if (ebb_plan_device_peak_bytes(tr[0].plan, dev) > ebb_plan_device_peak_bytes(tr[2].plan, dev))
            problem(&pr, "the chosen copies raise the %s peak: %lld, casting again %lld",
                    d ? "CUDA" : "CPU", (long long)ebb_plan_device_peak_bytes(tr[0].plan, dev),
                    (long long)ebb_plan_device_peak_bytes(tr[2].plan, dev));
    }
    /* the listing says which, and why */
    static const char *const says[3][2] = {{"low weight copies:", "peak"},
                                           {"kept from the forward for the backward", "kept at steps"},
                                           {"cast again in the backward", "as the options ask"}};
    for (int k = 0; k < 3; k++) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        assert_non_null(f);
        ebb_plan_print(tr[k].plan, f);
        fclose(f);
        if (!strstr(text, says[k][0]) || !strstr(text, says[k][1]))
            problem(&pr, "the %s listing lacks '%s' or '%s'", how[k], says[k][0], says[k][1]);
        free(text);
    }
    for (int t = 0; t < STEPS; t++)
        for (int k = 0; k < 3; k++)
            good_step(&tr[k], t, &pr);
    for (int k = 0; k < 3; k++)
        check_final(&tr[k], &pr);
    for (int i = 0; i < ebb_model_param_count(tr[0].model); i++) {
        const char *pn = ebb_model_param_name(tr[0].model, i);
        for (int k = 1; k < 3; k++)
            if (!same_bits(ebb_model_param(tr[0].model, pn), ebb_model_param(tr[k].model, pn)))
                problem(&pr, "%s differs between the %s and %s copies' steps", pn, how[0], how[k]);
    }

    /* refusals: keeping under a budget, and no such choice */
    ebb_shape xs = ebb_tensor_shape(tr[0].x[0]), ys = ebb_tensor_shape(tr[0].y[0]);
    ebb_train_options to = {.target_shapes = &ys, .n_target_shapes = 1, .optimizer = tr[0].oo,
                            .low_weight_copies = EBB_LOW_COPIES_KEEP};
    ebb_compile_options co = {.input_shapes = &xs, .n_input_shapes = 1, .train = &to,
                              .precision = EBB_PRECISION_BF16,
                              .memory_budget = EBB_MEMORY_BUDGET_LEAST};
    ebb_plan *p = NULL;
    assert_int_equal(ebb_spec_compile(&p, tr[0].spec, &co), EBB_ERR_ARG);
    assert_errmsg_contains("low_weight_copies KEEP with a memory budget");
    to.low_weight_copies = (ebb_low_copies)7;
    co.memory_budget = 0;
    assert_int_equal(ebb_spec_compile(&p, tr[0].spec, &co), EBB_ERR_ARG);
    assert_errmsg_contains("low_weight_copies is 7");
    assert_null(p);
    for (int k = 0; k < 3; k++)
        trainer_close(&tr[k]);
    fail_on_problems(&pr, "low weight copies");
}

static ebb_tensor *int64_tensor(const int64_t *v, int64_t n) {
    ebb_tensor *t = NULL;
    ebb_shape s = EBB_SHAPE(n);
    assert_ok(ebb_tensor_from_host(&t, v, (size_t)n * sizeof *v, &s, EBB_INT64, CPU));
    return t;
}

/* Adam on the MLP, with failed steps before the first good one (the state as
 * the optimizer made it, zeros) and between good ones: each changes nothing, so the ten good steps
 * still end where torch.optim's do. */
static void test_failed_steps_change_nothing(void **state) {
    (void)state;
    problems pr = {0};
    trainer tr;
    trainer_open(&tr, "grad_steps_mlp", MLP_YAML, "adam", 0, &pr);
    int64_t short_y[5] = {0, 1, 2, 3, 0};
    int64_t bad_class[6] = {0, 1, 2, 4, 0, 1}; /* 4 classes: 4 is out of range */
    ebb_tensor *wrong_shape = int64_tensor(short_y, 5), *out_of_range = int64_tensor(bad_class, 6);
    ebb_tensor *float_y = NULL;
    assert_ok(ebb_tensor_cast(&float_y, tr.y[0], EBB_FLOAT32));

    int64_t made = ebb_optimizer_state_bytes(tr.opt, NULL);
    failing_step(&tr, tr.x[0], out_of_range, NULL, "class 4 of 4 before any step", NULL, &pr);
    if (ebb_optimizer_state_bytes(tr.opt, NULL) != made || ebb_optimizer_step_count(tr.opt) != 0)
        problem(&pr, "a failed first step changed the optimizer state made with the optimizer");
    int t = 0;
    for (; t < STEPS; t++) {
        if (t == 2)
            failing_step(&tr, tr.x[t], wrong_shape, NULL, "target [5] for a batch of 6", NULL,
                         &pr);
        if (t == 3)
            failing_step(&tr, tr.x[t], out_of_range, NULL, "class 4 of 4 after 3 steps",
                         "cross_entropy", &pr);
        if (t == 5)
            failing_step(&tr, tr.x[t], float_y, NULL, "float32 target for int64 classes", NULL,
                         &pr);
        if (!good_step(&tr, t, &pr)) break;
    }
    if (t == STEPS) check_final(&tr, &pr);
    ebb_tensor_free(wrong_shape);
    ebb_tensor_free(out_of_range);
    ebb_tensor_free(float_y);
    trainer_close(&tr);
    fail_on_problems(&pr, "failed steps");
}

/* batch_norm's training forward updates its running statistics before the
 * loss fails: they are restored, and num_batches_tracked too. */
static void test_failed_step_restores_batch_norm(void **state) {
    (void)state;
    problems pr = {0};
    trainer tr;
    trainer_open(&tr, "grad_steps_bn", BN_YAML, "sgd_momentum", 0, &pr);
    int64_t bad_class[6] = {0, 1, 2, 3, 0, 7};
    ebb_tensor *out_of_range = int64_tensor(bad_class, 6);
    int t = 0;
    for (; t < STEPS; t++) {
        if (t == 0 || t == 4)
            failing_step(&tr, tr.x[t], out_of_range, NULL, "bn: class 7 of 4", NULL, &pr);
        if (!good_step(&tr, t, &pr)) break;
    }
    if (t == STEPS) check_final(&tr, &pr);
    ebb_tensor_free(out_of_range);
    trainer_close(&tr);
    fail_on_problems(&pr, "failed batch_norm steps");
}

/* A failed ebb_grad leaves every entry NULL and no handle behind, and the
 * plan still works. */
static void test_failed_grad(void **state) {
    (void)state;
    ebb_safetensors *st = open_fixture("grad_residual_tower");
    ebb_spec *spec = load_spec("residual_tower");
    ebb_tensor *x = fx_load(st, "x"), *y = fx_load(st, "y");
    ebb_shape xs = ebb_tensor_shape(x), ys;
    ebb_dtype yd;
    ebb_train_options t = fixture_train_options(st, &ys, &yd);
    ebb_compile_options o = {.input_shapes = &xs, .n_input_shapes = 1, .train = &t};
    ebb_plan *plan = NULL;
    assert_ok(ebb_spec_compile(&plan, spec, &o));
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, plan, CPU, 0));
    load_params(m, st, "");
    int n = ebb_model_param_count(m);
    ebb_tensor **grads = calloc((size_t)n, sizeof *grads);
    assert_non_null(grads);
    int64_t classes[8] = {0, 1, 2, 3, 4, 5, 6, 8}; /* 8 classes: 8 is out of range */
    ebb_tensor *bad = int64_tensor(classes, 8);
    problems pr = {0};
    int64_t live = ebb_tensor_live_count();
    double loss = 0;
    ebb_status s = ebb_grad(plan, m, &x, &bad, &loss, grads, NULL);
    if (s == EBB_OK) problem(&pr, "ebb_grad with class 8 of 8 succeeded");
    printf("[ failure  ] ebb_grad, class 8 of 8: %s: %s\n", ebb_status_name(s), ebb_errmsg());
    for (int i = 0; i < n; i++) {
        if (grads[i]) problem(&pr, "grads[%d] (%s) is set after a failure", i, ebb_model_param_name(m, i));
        ebb_tensor_free(grads[i]);
        grads[i] = NULL;
    }
    if (ebb_tensor_live_count() != live)
        problem(&pr, "a failed ebb_grad left %lld handles", (long long)(ebb_tensor_live_count() - live));
    s = ebb_grad(plan, m, &x, &y, &loss, grads, NULL);
    if (s != EBB_OK) problem(&pr, "ebb_grad after a failure: %s", ebb_errmsg());
    for (int i = 0; i < n; i++) ebb_tensor_free(grads[i]);
    free(grads);
    ebb_tensor_free(bad);
    ebb_model_free(m);
    ebb_plan_free(plan);
    ebb_tensor_free(x);
    ebb_tensor_free(y);
    ebb_spec_free(spec);
    ebb_safetensors_close(st);
    fail_on_problems(&pr, "failed ebb_grad");
}

/* What the API refuses, changing nothing: ebb_train_step on a grads_only plan
 * or with an optimizer of another kind, ebb_grad on a plan with updates or on
 * an inference plan. */
static void test_refusals(void **state) {
    (void)state;
    problems pr = {0};
    trainer tr, go;
    trainer_open(&tr, "grad_steps_mlp", MLP_YAML, "adam", 0, &pr);
    trainer_open(&go, "grad_steps_mlp", MLP_YAML, "adam", OPEN_GRADS_ONLY, &pr);

    failing_step(&go, go.x[0], go.y[0], NULL, "ebb_train_step on a grads_only plan", NULL, &pr);

    ebb_optimizer *sgd = NULL;
    ebb_optimizer_options so = ebb_optimizer_defaults(EBB_SGD, 0.1);
    assert_ok(ebb_optimizer_new(&sgd, tr.model, &so));
    failing_step(&tr, tr.x[0], tr.y[0], sgd, "an SGD optimizer for an Adam plan", NULL, &pr);
    if (ebb_optimizer_state_bytes(sgd, NULL) != 0 || ebb_optimizer_step_count(sgd) != 0)
        problem(&pr, "the refused SGD optimizer has state");
    ebb_optimizer_free(sgd);

    int n = ebb_model_param_count(tr.model);
    ebb_tensor **grads = calloc((size_t)n, sizeof *grads);
    assert_non_null(grads);
    int64_t live = ebb_tensor_live_count();
    double loss = 0;
    if (ebb_grad(tr.plan, tr.model, &tr.x[0], &tr.y[0], &loss, grads, NULL) == EBB_OK)
        problem(&pr, "ebb_grad on a plan with updates succeeded");
    printf("[ failure  ] ebb_grad on a plan with updates: %s\n", ebb_errmsg());

    ebb_shape xs = ebb_tensor_shape(tr.x[0]);
    ebb_compile_options io = {.input_shapes = &xs, .n_input_shapes = 1};
    ebb_plan *inference = NULL;
    assert_ok(ebb_spec_compile(&inference, tr.spec, &io));
    if (ebb_plan_is_training(inference) || ebb_plan_target_count(inference) != 0)
        problem(&pr, "an inference plan says it trains");
    if (ebb_grad(inference, tr.model, &tr.x[0], &tr.y[0], &loss, grads, NULL) == EBB_OK)
        problem(&pr, "ebb_grad on an inference plan succeeded");
    printf("[ failure  ] ebb_grad on an inference plan: %s\n", ebb_errmsg());
    for (int i = 0; i < n; i++) {
        if (grads[i]) problem(&pr, "grads[%d] is set after a refusal", i);
        ebb_tensor_free(grads[i]);
    }
    if (ebb_tensor_live_count() != live)
        problem(&pr, "refused ebb_grad calls left %lld handles",
                (long long)(ebb_tensor_live_count() - live));
    ebb_plan_free(inference);
    free(grads);

    /* the plan was not harmed */
    good_step(&tr, 0, &pr);
    trainer_close(&go);
    trainer_close(&tr);
    fail_on_problems(&pr, "refusals");
}

/* ---- a training step in a CUDA graph ------------------------------------------------------ */

static const char DROP_YAML[] = "ebb: 1\n"
                                "name: train_drop\n"
                                "inputs:\n"
                                "  x: [batch, 8]\n"
                                "targets:\n"
                                "  y: {shape: [batch], dtype: int64}\n"
                                "loss: cross_entropy\n"
                                "flow:\n"
                                "  - from: {linear: {in: 8, out: 32, name: fc1}}\n"
                                "  - relu\n"
                                "  - {batch_norm: {name: bn1}}\n"
                                "  - {dropout: {p: 0.25}}\n"
                                "  - {linear: {out: 4, name: fc2}}\n";

typedef struct captured_run {
    ebb_model *model;
    ebb_optimizer *opt;
} captured_run;

static void captured_run_open(captured_run *r, const ebb_plan *plan, ebb_device dev,
                              const ebb_optimizer_options *oo) {
    assert_ok(ebb_model_new(&r->model, plan, dev, 7));
    assert_ok(ebb_optimizer_new(&r->opt, r->model, oo));
}

static void captured_run_close(captured_run *r) {
    ebb_optimizer_free(r->opt);
    ebb_model_free(r->model);
    *r = (captured_run){0};
}

/* Largest relative difference over every parameter of two models; the
 * parameter it is in goes to *where when asked. */
static double models_rel_diff_at(const ebb_model *a, const ebb_model *b, const char **where) {
    double worst = 0;
    if (where)
        *where = "(none)";
    for (int i = 0; i < ebb_model_param_count(a); i++) {
        const char *name = ebb_model_param_name(a, i);
        ebb_tensor *pa = ebb_model_param(a, name), *pb = ebb_model_param(b, name);
        ebb_dtype dt = ebb_tensor_dtype(pa);
        if (dt != EBB_FLOAT32 && dt != EBB_FLOAT64)
            continue; /* batch_norm's counter */
        double d = 0, m = max_abs_of(pb);
        assert_ok(ebb_tensor_max_abs_diff(pa, pb, &d));
        double r = d / fmax(m, 1e-6);
        if (r > worst && where)
            *where = name;
        worst = fmax(worst, r);
    }
    return worst;
}

static double models_rel_diff(const ebb_model *a, const ebb_model *b) {
    return models_rel_diff_at(a, b, NULL);
}

/* Two models' parameters within tol of each other, else a failure naming
 * the parameter furthest apart. */
static void assert_models_close(const ebb_model *got, const ebb_model *want, double tol,
                                const char *what) {
    const char *where = NULL;
    double d = models_rel_diff_at(got, want, &where);
    if (!(d <= tol))
        fail_msg("%s: parameter %s is %.3e relative from the eager run's (at most %.0e)", what,
                 where, d, tol);
}

/* A captured step's loss within tol of the eager step's, else a failure
 * with both. */
static void assert_loss_close(double got, double want, double tol, const char *what, int step) {
    if (!(rel_scalar(got, want) <= tol))
        fail_msg("%s, step %d: loss %.9g, the eager step's %.9g (%.3e relative, at most %.0e)",
                 what, step, got, want, rel_scalar(got, want), tol);
}

/* Eager steps and the captured step, from the same initial weights and
 * batches and seed, must leave the same losses and weights (dropout's masks
 * included): exactly the same but for the optimizer's fused multiply-adds.
 * (batch_norm follows relu: right after a linear layer it would cancel the
 * bias, whose gradient is then rounding noise that Adam scales up to whole
 * steps, different in each engine.) On the CPU, and for what a graph cannot
 * hold, the refusals. */
static void test_train_capture(void **state) {
    (void)state;
    ebb_device dev = ebb_test_device();
    ebb_spec *spec = NULL;
    assert_ok(ebb_spec_load_string(&spec, DROP_YAML, strlen(DROP_YAML), "train_drop"));
    enum { B = 16, N_STEPS = 5 };
    ebb_shape xs = {2, {B, 8}}, ys = {1, {B}};
    ebb_optimizer_options oo = ebb_optimizer_defaults(EBB_ADAMW, 1e-2);
    ebb_train_options t = {.target_shapes = &ys, .n_target_shapes = 1, .optimizer = oo};
    ebb_compile_options co = {.input_shapes = &xs, .n_input_shapes = 1, .train = &t};
    ebb_plan *plan = NULL, *inference = NULL;
    assert_ok(ebb_spec_compile(&plan, spec, &co));
    ebb_compile_options io = {.input_shapes = &xs, .n_input_shapes = 1};
    assert_ok(ebb_spec_compile(&inference, spec, &io));
    ebb_tensor *x[N_STEPS], *y[N_STEPS];
    for (int k = 0; k < N_STEPS; k++) {
        ebb_tensor *u = NULL, *xc = NULL, *yc = NULL;
        assert_ok(ebb_tensor_randn(&xc, &xs, EBB_FLOAT32, CPU, 100 + k));
        assert_ok(ebb_tensor_uniform(&u, &ys, 0.0, 4.0, EBB_FLOAT64, CPU, 200 + k));
        assert_ok(ebb_tensor_cast(&yc, u, EBB_INT64));
        assert_ok(ebb_tensor_to(&x[k], xc, dev, EBB_FLOAT32));
        assert_ok(ebb_tensor_to(&y[k], yc, dev, EBB_INT64));
        ebb_tensor_free(u);
        ebb_tensor_free(xc);
        ebb_tensor_free(yc);
    }
    captured_run eager, graph;
    captured_run_open(&eager, plan, dev, &oo);
    captured_run_open(&graph, plan, dev, &oo);
    ebb_capture *cap = NULL;

    /* what no graph can be: an inference capture of a training plan and
     * the reverse, and a model off the GPU */
    assert_int_equal(ebb_plan_capture(&cap, plan, graph.model, x), EBB_ERR_ARG);
    assert_errmsg_contains("is a training plan; capture its step with ebb_train_capture()");
    assert_int_equal(ebb_train_capture(&cap, inference, graph.model, graph.opt, x, y, 0),
                     EBB_ERR_ARG);
    assert_errmsg_contains("has no update steps");
    assert_null(cap);
    if (dev.type == EBB_DEVICE_CPU) {
        assert_int_equal(ebb_train_capture(&cap, plan, graph.model, graph.opt, x, y, 0),
                         EBB_ERR_UNSUPPORTED);
        assert_errmsg_contains("need a CUDA device; the model is on cpu");
        assert_null(cap);
        goto done;
    }

    /* capturing leaves the model and the optimizer as they were */
    ebb_status st = ebb_train_capture(&cap, plan, graph.model, graph.opt, x, y, 0);
    if (st != EBB_OK)
        fail_msg("ebb_train_capture: %s: %s", ebb_status_name(st), ebb_errmsg());
    assert_true(models_rel_diff(graph.model, eager.model) == 0.0);
    assert_int_equal(ebb_optimizer_step_count(graph.opt), 0);

    ebb_run_options ro = {.seed = 0};
    double worst_loss = 0;
    for (int k = 0; k < N_STEPS; k++) {
        if (k == 3) { /* a new learning rate reaches the graph */
            assert_ok(ebb_optimizer_set_lr(eager.opt, 3e-3));
            assert_ok(ebb_optimizer_set_lr(graph.opt, 3e-3));
        }
        double le = 0, lg = 0;
        assert_ok(ebb_train_step_ex(plan, eager.model, eager.opt, &x[k], &y[k], &le, &ro, NULL));
        assert_ok(ebb_capture_train_step(cap, &x[k], &y[k], &lg));
        worst_loss = fmax(worst_loss, rel_scalar(lg, le));
        assert_int_equal(ebb_optimizer_step_count(graph.opt), k + 1);
    }
    double worst_w = models_rel_diff(graph.model, eager.model);
    print_message("captured step against eager: losses %.2e, weights %.2e relative\n", worst_loss,
                  worst_w);
    assert_true(worst_loss <= 1e-5);
    assert_true(worst_w <= 1e-5);

    /* a class index out of range is refused before the graph runs */
    {
        int64_t bad[B] = {0};
        bad[5] = 9;
        ebb_tensor *hb = NULL, *yb = NULL;
        assert_ok(ebb_tensor_from_host(&hb, bad, sizeof bad, &ys, EBB_INT64, CPU));
        assert_ok(ebb_tensor_to(&yb, hb, dev, EBB_INT64));
        assert_int_equal(ebb_capture_train_step(cap, &x[0], &yb, NULL), EBB_ERR_ARG);
        assert_errmsg_contains("class index 9");
        assert_int_equal(ebb_optimizer_step_count(graph.opt), N_STEPS);
        ebb_tensor_free(hb);
        ebb_tensor_free(yb);
        /* and a batch of another shape */
        ebb_shape small = {2, {B / 2, 8}};
        ebb_tensor *xs2 = NULL;
        assert_ok(ebb_tensor_zeros(&xs2, &small, EBB_FLOAT32, dev));
        assert_int_equal(ebb_capture_train_step(cap, &xs2, &y[0], NULL), EBB_ERR_SHAPE);
        assert_errmsg_contains("it was captured with float32 [16, 8]");
        ebb_tensor_free(xs2);
        assert_int_equal(ebb_capture_replay(cap, x, NULL), EBB_ERR_ARG);
    }
    ebb_capture_free(cap);
    cap = NULL;

    /* SGD with momentum makes its buffers at the first step */
    {
        ebb_optimizer_options so = ebb_optimizer_defaults(EBB_SGD, 0.1);
        so.momentum = 0.9;
        ebb_train_options ts = t;
        ts.optimizer = so;
        ebb_compile_options cs = co;
        cs.train = &ts;
        ebb_plan *sp = NULL;
        assert_ok(ebb_spec_compile(&sp, spec, &cs));
        captured_run a, b;
        captured_run_open(&a, sp, dev, &so);
        captured_run_open(&b, sp, dev, &so);
        assert_int_equal(ebb_train_capture(&cap, sp, b.model, b.opt, x, y, 0),
                         EBB_ERR_UNSUPPORTED);
        assert_errmsg_contains("run one ebb_train_step() before capturing");
        double la = 0, lb = 0;
        assert_ok(ebb_train_step_ex(sp, a.model, a.opt, &x[0], &y[0], &la, &ro, NULL));
        assert_ok(ebb_train_step_ex(sp, b.model, b.opt, &x[0], &y[0], &lb, &ro, NULL));
        assert_ok(ebb_train_capture(&cap, sp, b.model, b.opt, x, y, 0));
        for (int k = 1; k < N_STEPS; k++) {
            assert_ok(ebb_train_step_ex(sp, a.model, a.opt, &x[k], &y[k], &la, &ro, NULL));
            assert_ok(ebb_capture_train_step(cap, &x[k], &y[k], &lb));
            assert_loss_close(lb, la, 1e-5, "SGD with momentum, captured", k);
        }
        assert_models_close(b.model, a.model, 1e-5, "SGD with momentum, captured");
        ebb_capture_free(cap);
        cap = NULL;
        captured_run_close(&a);
        captured_run_close(&b);
        ebb_plan_free(sp);
    }

done:
    captured_run_close(&eager);
    captured_run_close(&graph);
    for (int k = 0; k < N_STEPS; k++) {
        ebb_tensor_free(x[k]);
        ebb_tensor_free(y[k]);
    }
    ebb_plan_free(inference);
    ebb_plan_free(plan);
    ebb_spec_free(spec);
}

/* A language model's plan (token ids into an embedding, a causal
 * attention, logits per token) captured whole, forward and training step:
 * the replays equal the eager runs, and a token id outside the vocabulary
 * is refused before the graph runs, as the embedding's own check cannot
 * read the ids back inside a graph. On the CPU, the refusal. */
static const char LM_YAML[] = "ebb: 1\n"
                              "name: tiny_lm\n"
                              "inputs:\n"
                              "  idx: {shape: [batch, seq], dtype: int64}\n"
                              "targets:\n"
                              "  y: {shape: [batch, seq], dtype: int64}\n"
                              "loss: cross_entropy\n"
                              "flow:\n"
                              "  - from: {embedding: {num: 16, dim: 8, name: wte}}\n"
                              "  - tag: tok\n"
                              "  - positions\n"
                              "  - {embedding: {num: 6, dim: 8, name: wpe}}\n"
                              "  - {through: add, using: [tok]}\n"
                              "  - {multi_head_attention: {num_heads: 2, causal: true}}\n"
                              "  - {linear: {out: 16, name: head}}\n";

static void test_capture_token_ids(void **state) {
    (void)state;
    ebb_device dev = ebb_test_device();
    ebb_spec *spec = NULL;
    assert_ok(ebb_spec_load_string(&spec, LM_YAML, strlen(LM_YAML), "tiny_lm"));
    enum { B = 3, T = 6, N_STEPS = 3 };
    ebb_shape xs = {2, {B, T}};
    /* plain SGD: attention's key bias has no true gradient (softmax ignores
     * what is added to every score of a row), and Adam would scale its
     * rounding noise, which differs between the graph's kernels and eager
     * ones, up to whole steps (the H200 measured 7% on in_proj_bias) */
    ebb_optimizer_options oo = ebb_optimizer_defaults(EBB_SGD, 0.1);
    ebb_train_options t = {.target_shapes = &xs, .n_target_shapes = 1, .optimizer = oo};
    ebb_compile_options io = {.input_shapes = &xs, .n_input_shapes = 1};
    ebb_compile_options co = io;
    co.train = &t;
    ebb_plan *inference = NULL, *plan = NULL;
    assert_ok(ebb_spec_compile(&inference, spec, &io));
    assert_ok(ebb_spec_compile(&plan, spec, &co));
    ebb_tensor *x[N_STEPS], *y[N_STEPS], *bad = NULL;
    for (int k = 0; k <= N_STEPS; k++) {
        ebb_tensor *u = NULL, *v = NULL, *xc = NULL, *yc = NULL;
        /* the last: one id past the vocabulary */
        double hi = k == N_STEPS ? 16.0 : 15.999;
        assert_ok(ebb_tensor_uniform(&u, &xs, k == N_STEPS ? 16.0 : 0.0, hi, EBB_FLOAT64, CPU,
                                     300 + k));
        assert_ok(ebb_tensor_uniform(&v, &xs, 0.0, 15.999, EBB_FLOAT64, CPU, 400 + k));
        assert_ok(ebb_tensor_cast(&xc, u, EBB_INT64));
        assert_ok(ebb_tensor_cast(&yc, v, EBB_INT64));
        if (k < N_STEPS) {
            assert_ok(ebb_tensor_to(&x[k], xc, dev, EBB_INT64));
            assert_ok(ebb_tensor_to(&y[k], yc, dev, EBB_INT64));
        } else {
            assert_ok(ebb_tensor_to(&bad, xc, dev, EBB_INT64));
        }
        ebb_tensor_free(u);
        ebb_tensor_free(v);
        ebb_tensor_free(xc);
        ebb_tensor_free(yc);
    }
    /* the eager forward refuses the bad ids itself */
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, inference, dev, 7));
    ebb_tensor *want = NULL, *got = NULL;
    assert_int_equal(ebb_run(inference, m, &bad, &want, NULL), EBB_ERR_ARG);
    assert_errmsg_contains("index 16 in indices [3, 6] is out of range for 16 embeddings");
    assert_null(want);
    assert_ok(ebb_run(inference, m, x, &want, NULL));
    ebb_capture *cap = NULL;
    captured_run eager, graph;
    captured_run_open(&eager, plan, dev, &oo);
    captured_run_open(&graph, plan, dev, &oo);
    if (dev.type == EBB_DEVICE_CPU) {
        assert_int_equal(ebb_plan_capture(&cap, inference, m, x), EBB_ERR_UNSUPPORTED);
        assert_errmsg_contains("need a CUDA device");
        assert_null(cap);
        goto done;
    }

    /* the forward */
    ebb_status st = ebb_plan_capture(&cap, inference, m, x);
    if (st != EBB_OK)
        fail_msg("ebb_plan_capture: %s: %s", ebb_status_name(st), ebb_errmsg());
    assert_ok(ebb_capture_replay(cap, x, &got));
    double d = -1;
    assert_ok(ebb_tensor_max_abs_diff(got, want, &d));
    assert_true(d == 0.0);
    ebb_tensor_free(got);
    got = NULL;
    assert_int_equal(ebb_capture_replay(cap, &bad, &got), EBB_ERR_ARG);
    assert_errmsg_contains("ebb_capture_replay: input 0 (step 0, wte)");
    assert_errmsg_contains("index 16 in indices [3, 6] is out of range for 16 embeddings");
    assert_null(got);
    ebb_capture_free(cap);
    cap = NULL;

    /* the training step */
    st = ebb_train_capture(&cap, plan, graph.model, graph.opt, x, y, 0);
    if (st != EBB_OK)
        fail_msg("ebb_train_capture: %s: %s", ebb_status_name(st), ebb_errmsg());
    ebb_run_options ro = {.seed = 0};
    for (int k = 0; k < N_STEPS; k++) {
        double le = 0, lg = 0;
        assert_ok(ebb_train_step_ex(plan, eager.model, eager.opt, &x[k], &y[k], &le, &ro, NULL));
        assert_ok(ebb_capture_train_step(cap, &x[k], &y[k], &lg));
        assert_loss_close(lg, le, 1e-5, "gpt, captured", k);
    }
    assert_models_close(graph.model, eager.model, 1e-5, "gpt, captured");
    assert_int_equal(ebb_capture_train_step(cap, &bad, &y[0], NULL), EBB_ERR_ARG);
    assert_errmsg_contains("index 16");
    /* a class index past the vocabulary: the scores are [B, T, 16], classes last */
    assert_int_equal(ebb_capture_train_step(cap, &x[0], &bad, NULL), EBB_ERR_ARG);
    assert_errmsg_contains("target 0 (step");
    assert_errmsg_contains("class index 16 in target [3, 6] is out of range for 16 classes");
    assert_int_equal(ebb_optimizer_step_count(graph.opt), N_STEPS);
    ebb_capture_free(cap);

done:
    captured_run_close(&eager);
    captured_run_close(&graph);
    for (int k = 0; k < N_STEPS; k++) {
        ebb_tensor_free(x[k]);
        ebb_tensor_free(y[k]);
    }
    ebb_tensor_free(bad);
    ebb_tensor_free(want);
    ebb_model_free(m);
    ebb_plan_free(inference);
    ebb_plan_free(plan);
    ebb_spec_free(spec);
}

/* A test per case, named after it (cmocka's macros would name them all
 * after the function). */
static struct CMUnitTest named_test(const char *name, CMUnitTestFunction fn, void *state) {
    return (struct CMUnitTest){.name = name, .test_func = fn, .setup_func = ebb_test_setup,
                               .teardown_func = ebb_test_teardown, .initial_state = state};
}

int main(void) {
    static const char *const grad_names[] = {
        "grad_mlp",          "grad_residual_tower",     "grad_gate8",
        "grad_conv_net",     "grad_transformer_encoder", "grad_transformer_stack",
        "grad_gru_loop",     "grad_switch_routed",      "grad_switch",
        "grad_gate_topk",    "grad_loop_while",         "grad_loop_until",
        "grad_repeat",       "grad_tag_using",          "grad_gpt",
        "grad_llama",        "grad_resnet18",
    };
    enum { N_GRAD = sizeof GRAD_CASES / sizeof *GRAD_CASES };
    static grad_case least[N_GRAD];
    static char least_names[N_GRAD][64];
    /* the float32 steps cases, each again as two micro-batches a step (a
     * bfloat16 case's micro-batch gradients are rounded to bfloat16 each,
     * as under torch.autocast, and so differ from the whole batch's by
     * more than its tolerance) */
    static const char *const step_cases[] = {
        "sgd_momentum",     "adam",           "adamw",        "sgd_clip_norm",
        "adamw_clip_value", "adam_clip_both", "sgd_no_decay", "adamw_no_decay",
        "sgd_bias_lr",      "adamw_bias_lr",
    };
    enum { N_STEP_CASES = sizeof step_cases / sizeof *step_cases };
    static char accumulated_names[N_STEP_CASES][64];
    struct CMUnitTest tests[27 + 2 * N_GRAD + N_STEP_CASES];
    int n = 0;
    for (size_t i = 0; i < N_GRAD; i++)
        tests[n++] = named_test(grad_names[i], test_grad, (void *)&GRAD_CASES[i]);
    /* the same cases under the least memory budget */
    for (size_t i = 0; i < N_GRAD; i++) {
        least[i] = GRAD_CASES[i];
        least[i].least = 1;
        snprintf(least_names[i], sizeof least_names[i], "%s_least_memory", grad_names[i]);
        tests[n++] = named_test(least_names[i], test_grad, &least[i]);
    }
    tests[n++] = (struct CMUnitTest)EBB_TEST(test_keep_all);
    tests[n++] = (struct CMUnitTest)EBB_TEST(test_dropout_zero_costs_nothing);
    tests[n++] = (struct CMUnitTest)EBB_TEST(test_tied_weights);
    tests[n++] = (struct CMUnitTest)EBB_TEST(test_update_placement);
    tests[n++] = named_test("steps_sgd_momentum", test_steps, (void *)"sgd_momentum");
    tests[n++] = named_test("steps_adam", test_steps, (void *)"adam");
    tests[n++] = named_test("steps_adamw", test_steps, (void *)"adamw");
    tests[n++] = named_test("steps_sgd_clip_norm", test_steps, (void *)"sgd_clip_norm");
    tests[n++] = named_test("steps_adamw_clip_value", test_steps, (void *)"adamw_clip_value");
    tests[n++] = named_test("steps_adam_clip_both", test_steps, (void *)"adam_clip_both");
    tests[n++] = named_test("steps_sgd_no_decay", test_steps, (void *)"sgd_no_decay");
    tests[n++] = named_test("steps_adamw_no_decay", test_steps, (void *)"adamw_no_decay");
    tests[n++] = named_test("steps_sgd_bias_lr", test_steps, (void *)"sgd_bias_lr");
    tests[n++] = named_test("steps_adamw_bias_lr", test_steps, (void *)"adamw_bias_lr");
    tests[n++] = named_test("steps_adamw_bf16", test_steps, (void *)"adamw_bf16");
    tests[n++] = (struct CMUnitTest)EBB_TEST(test_steps_batch_norm);
    for (size_t i = 0; i < N_STEP_CASES; i++) {
        snprintf(accumulated_names[i], sizeof accumulated_names[i], "accumulated_steps_%s",
                 step_cases[i]);
        tests[n++] = named_test(accumulated_names[i], test_accumulated_steps,
                                (void *)step_cases[i]);
    }
    tests[n++] = named_test("steps20_conv_net", test_steps20, (void *)&STEPS20_MODELS[0]);
    tests[n++] = named_test("steps20_transformer_encoder", test_steps20,
                            (void *)&STEPS20_MODELS[1]);
    tests[n++] = (struct CMUnitTest)EBB_TEST(test_loss_scaling);
    tests[n++] = (struct CMUnitTest)EBB_TEST(test_low_weight_copies);
    tests[n++] = (struct CMUnitTest)EBB_TEST(test_state_for_trained_parameters);
    tests[n++] = (struct CMUnitTest)EBB_TEST(test_failed_steps_change_nothing);
    tests[n++] = (struct CMUnitTest)EBB_TEST(test_failed_step_restores_batch_norm);
    tests[n++] = (struct CMUnitTest)EBB_TEST(test_failed_grad);
    tests[n++] = (struct CMUnitTest)EBB_TEST(test_refusals);
    tests[n++] = (struct CMUnitTest)EBB_TEST(test_train_capture);
    tests[n++] = (struct CMUnitTest)EBB_TEST(test_capture_token_ids);
    if (n != (int)(sizeof tests / sizeof *tests)) {
        fprintf(stderr, "test_train: %d tests for a table of %zu\n", n, sizeof tests / sizeof *tests);
        return 1;
    }
    return ebb_test_run("test_train", tests, NULL, NULL); /* CMOCKA_FILTER, EBB_TEST_SHARD */
}
