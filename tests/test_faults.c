/* Fault injection, as SQLite's tests do it: every CPU tensor allocation of a
 * training step fails in turn (ebb_memory_fail_nth(), include/ebb/memory.h),
 * and so does every file operation of a checkpoint write (ebb_file_fail_nth(),
 * src/fileio.h). For N = 1, 2, ... until the operation succeeds with no
 * failure injected, each failure must:
 *   - be reported, EBB_ERR_NOMEM or EBB_ERR_IO, with a message that says what
 *     failed (the step and node, or the file and the operation);
 *   - leave no handle and no tensor byte behind: the live-handle count and
 *     the allocator's current bytes return to their values before, plus
 *     whatever optimizer state the updates that did run created;
 *   - leave the model as ebb_train_step() promises (include/ebb/train.h):
 *     unchanged when the failure came before the first update step; after
 *     it, each parameter whose update step ran is updated (bitwise the
 *     result of an uninjected step from the same start, state and count
 *     included) and every other one unchanged;
 *   - for a checkpoint, leave the old file as it was and no temporary file,
 *     except when the failure is the directory sync after the rename, where
 *     the new file is in place and the message says so.
 * A step that left the model unchanged is retried without a fault and must
 * give exactly the uninjected result: nothing else was disturbed either.
 *
 * No update is ever left half-way: every optimizer's kernel allocates all
 * it needs before its first write (optim.h; Adam's Scalar operands are made
 * up front in ops/tensor/optim.cpp for that), and one that is fails the
 * test. One departure from the headers is tolerated and counted, not failed
 * (the count is printed; EBB_FAULTS_VERBOSE=1 prints every failure):
 *   - train.h says a plan compiled with updates_after_backward changes
 *     nothing unless the step succeeds; its update steps still run one by
 *     one, so a failure in the second leaves the first parameter updated.
 *
 * The counts (allocations per step, file operations per write) are printed. */
#define _GNU_SOURCE

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/fileio.h"
#include "test_util.h"
#include "test_dir.h"

#define MAX_PARAMS 8
#define N_STATE 8
#define MAX_N 100000

static const ebb_device CPU = {EBB_DEVICE_CPU, 0};
static const char *const STATE_NAMES[N_STATE] = {"momentum_buffer", "exp_avg",  "exp_avg_sq",
                                                 "max_exp_avg_sq",  "square_avg", "grad_avg",
                                                 "acc_delta",       "sum"};

static const char MLP_YAML[] = "ebb: 1\n"
                               "name: fault_mlp\n"
                               "inputs:\n"
                               "  x: [batch, 8]\n"
                               "targets:\n"
                               "  y: {shape: [batch], dtype: int64}\n"
                               "loss: cross_entropy\n"
                               "flow:\n"
                               "  - from: {linear: {in: 8, out: 16, name: fc1}}\n"
                               "  - relu\n"
                               "  - {linear: {out: 4, name: fc2}}\n";

static char dir[256];

static int make_dir(void **state) {
    (void)state;
    return ebb_test_dir_make(dir, sizeof dir, "faults");
}

static int remove_dir(void **state) {
    (void)state;
    return ebb_test_dir_remove(dir);
}

static int count_temporaries(void) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

/* ---- a training rig ------------------------------------------------------------ */

typedef struct rig {
    ebb_spec *spec;
    ebb_plan *plan;
    ebb_optimizer_options oo;
    ebb_tensor *x, *y;
    const char *name;
} rig;

static void rig_open(rig *r, const char *name, ebb_optimizer_options oo, int after_backward) {
    *r = (rig){.oo = oo, .name = name};
    assert_ok(ebb_spec_load_string(&r->spec, MLP_YAML, strlen(MLP_YAML), "fault_mlp.yaml"));
    ebb_shape xs = EBB_SHAPE(6, 8), ys = EBB_SHAPE(6);
    ebb_train_options t = {.target_shapes = &ys, .n_target_shapes = 1, .optimizer = oo,
                           .updates_after_backward = after_backward};
    ebb_compile_options o = {.input_shapes = &xs, .n_input_shapes = 1, .train = &t};
    assert_ok(ebb_spec_compile(&r->plan, r->spec, &o));
    assert_ok(ebb_tensor_randn(&r->x, &xs, EBB_FLOAT32, CPU, 7));
    int64_t yv[6] = {0, 1, 2, 3, 1, 2};
    assert_ok(ebb_tensor_from_host(&r->y, yv, sizeof yv, &ys, EBB_INT64, CPU));
}

static void rig_close(rig *r) {
    ebb_tensor_free(r->x);
    ebb_tensor_free(r->y);
    ebb_plan_free(r->plan);
    ebb_spec_free(r->spec);
}

/* A model and optimizer from the same start every time, after `warm` good
 * steps. */
static void rig_fresh(const rig *r, int warm, ebb_model **m, ebb_optimizer **o) {
    assert_ok(ebb_model_new(m, r->plan, CPU, 3));
    assert_ok(ebb_optimizer_new(o, *m, &r->oo));
    for (int k = 0; k < warm; k++)
        assert_ok(ebb_train_step(r->plan, *m, *o, &r->x, &r->y, NULL, NULL));
}

/* Everything a step may change: each parameter's bytes, its optimizer state
 * and its update count. */
typedef struct snapshot {
    int n;
    unsigned char *param[MAX_PARAMS];
    size_t param_n[MAX_PARAMS];
    unsigned char *state[MAX_PARAMS][N_STATE];
    size_t state_n[MAX_PARAMS][N_STATE];
    int64_t steps[MAX_PARAMS];
    int64_t handles, state_bytes;
} snapshot;

static unsigned char *host_bytes(const ebb_tensor *t, size_t *n) {
    *n = ebb_tensor_nbytes(t);
    unsigned char *b = malloc(*n + 1);
    assert_non_null(b);
    assert_ok(ebb_tensor_to_host(t, b, *n));
    return b;
}

static void snap_take(snapshot *s, const ebb_model *m, const ebb_optimizer *o) {
    memset(s, 0, sizeof *s);
    s->n = ebb_model_param_count(m);
    assert_true(s->n <= MAX_PARAMS);
    for (int i = 0; i < s->n; i++) {
        s->param[i] = host_bytes(ebb_model_param(m, ebb_model_param_name(m, i)), &s->param_n[i]);
        for (int k = 0; k < N_STATE; k++) {
            const ebb_tensor *t = ebb_optimizer_state_tensor(o, i, STATE_NAMES[k]);
            if (t) {
                s->state[i][k] = host_bytes(t, &s->state_n[i][k]);
                s->handles++;
            }
        }
        s->steps[i] = ebb_optimizer_param_step_count(o, i);
    }
    s->state_bytes = ebb_optimizer_state_bytes(o, NULL);
}

static void snap_free(snapshot *s) {
    for (int i = 0; i < s->n; i++) {
        free(s->param[i]);
        for (int k = 0; k < N_STATE; k++)
            free(s->state[i][k]);
    }
}

static int same_bytes(const unsigned char *a, size_t an, const unsigned char *b, size_t bn) {
    if (!a || !b)
        return !a && !b;
    return an == bn && memcmp(a, b, an) == 0;
}

/* Parameter i (its bytes, state and count) as in `want`. */
static int param_is(const snapshot *now, const snapshot *want, int i) {
    if (!same_bytes(now->param[i], now->param_n[i], want->param[i], want->param_n[i]) ||
        now->steps[i] != want->steps[i])
        return 0;
    for (int k = 0; k < N_STATE; k++)
        if (!same_bytes(now->state[i][k], now->state_n[i][k], want->state[i][k],
                        want->state_n[i][k]))
            return 0;
    return 1;
}

/* What changed in parameter i against `before`, in words. */
static void describe_change(char *buf, size_t size, const snapshot *now, const snapshot *before,
                            int i) {
    int n = snprintf(buf, size, "%s%s",
                     same_bytes(now->param[i], now->param_n[i], before->param[i],
                                before->param_n[i])
                         ? "values unchanged"
                         : "values changed",
                     now->steps[i] != before->steps[i] ? ", count changed" : ", count unchanged");
    for (int k = 0; k < N_STATE && n > 0 && (size_t)n < size; k++)
        if (!same_bytes(now->state[i][k], now->state_n[i][k], before->state[i][k],
                        before->state_n[i][k]))
            n += snprintf(buf + n, size - (size_t)n, ", %s changed", STATE_NAMES[k]);
}

/* The plan step that updates parameter i, or -1. */
static int update_step_of(const ebb_plan *p, int i) {
    for (int s = 0; s < ebb_plan_step_count(p); s++) {
        const ebb_plan_step *st = ebb_plan_step_at(p, s);
        if (st->kind == EBB_STEP_UPDATE && st->param == i)
            return s;
    }
    return -1;
}

/* The step index in "... step 12 (...": -1 when the message names none. */
static int failed_step(const char *msg) {
    const char *at = strstr(msg, "step ");
    while (at) {
        int k = -1;
        char paren = 0;
        if (sscanf(at, "step %d %c", &k, &paren) == 2 && paren == '(')
            return k;
        at = strstr(at + 5, "step ");
    }
    return -1;
}

typedef struct tally {
    int64_t points; /* allocations the step makes: the failures injected */
    int64_t before_update, after_update, outside_loop;
    int64_t partial;    /* the update that failed left half-way (must stay 0) */
    int64_t not_atomic; /* tolerated: updates_after_backward left earlier updates */
    int64_t retried;
    char first_partial[2600], first_not_atomic[2600];
} tally;

/* EBB_FAULTS_VERBOSE=1 prints every failure's message and outcome. */
static int verbose(void) {
    const char *v = getenv("EBB_FAULTS_VERBOSE");
    return v && *v && strcmp(v, "0") != 0;
}

/* Every allocation of one training step fails in turn. */
static void fail_every_allocation(const rig *r, int warm, tally *tl) {
    ebb_model *m = NULL;
    ebb_optimizer *o = NULL;
    snapshot before, after;

    /* the reference: one uninjected step from the same start */
    rig_fresh(r, warm, &m, &o);
    snap_take(&before, m, o);
    ebb_memory_stats s0, s1;
    assert_ok(ebb_memory_stats_get(CPU, &s0));
    assert_ok(ebb_train_step(r->plan, m, o, &r->x, &r->y, NULL, NULL));
    assert_ok(ebb_memory_stats_get(CPU, &s1));
    snap_take(&after, m, o);
    int64_t allocations = s1.allocations - s0.allocations;
    ebb_optimizer_free(o);
    ebb_model_free(m);

    int first_update = ebb_plan_step_count(r->plan);
    for (int i = 0; i < before.n; i++) {
        int u = update_step_of(r->plan, i);
        if (u >= 0 && u < first_update)
            first_update = u;
    }

    memset(tl, 0, sizeof *tl);
    for (int64_t n = 1;; n++) {
        if (n > MAX_N)
            fail_msg("%s: still failing after %d injected failures", r->name, MAX_N);
        rig_fresh(r, warm, &m, &o);
        int64_t live0 = ebb_tensor_live_count(), bytes0 = ebb_memory_current(CPU);
        snapshot b;
        snap_take(&b, m, o);
        double loss = -1;
        ebb_memory_fail_nth(n);
        ebb_status st = ebb_train_step(r->plan, m, o, &r->x, &r->y, &loss, NULL);
        int fired = ebb_memory_fail_fired();
        ebb_memory_fail_nth(0);
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", ebb_errmsg());
        snapshot now;
        snap_take(&now, m, o);

        if (st == EBB_OK) {
            if (fired)
                fail_msg("%s (warm %d), allocation %lld failed, yet the step succeeded", r->name,
                         warm, (long long)n);
            for (int i = 0; i < now.n; i++)
                if (!param_is(&now, &after, i))
                    fail_msg("%s: an uninjected step differs from the reference", r->name);
            snap_free(&now);
            snap_free(&b);
            ebb_optimizer_free(o);
            ebb_model_free(m);
            tl->points = n - 1;
            break;
        }
        if (!fired)
            fail_msg("%s (warm %d), n %lld: the step failed with no failure injected: %s",
                     r->name, warm, (long long)n, msg);
        if (st != EBB_ERR_NOMEM || !strstr(msg, "out of memory") ||
            strncmp(msg, "ebb_train_step", 14) != 0)
            fail_msg("%s (warm %d), allocation %lld: %s: \"%s\" (want EBB_ERR_NOMEM, \"out of "
                     "memory\", from ebb_train_step)",
                     r->name, warm, (long long)n, ebb_status_name(st), msg);
        /* nothing leaked: only the optimizer state that updates made */
        int64_t live = ebb_tensor_live_count() - live0, state_handles = now.handles - b.handles;
        int64_t bytes = ebb_memory_current(CPU) - bytes0,
                state_bytes = now.state_bytes - b.state_bytes;
        if (live != state_handles || bytes != state_bytes)
            fail_msg("%s (warm %d), allocation %lld: %lld handle(s) and %lld byte(s) more than "
                     "before, of which optimizer state %lld and %lld (%s)",
                     r->name, warm, (long long)n, (long long)live, (long long)bytes,
                     (long long)state_handles, (long long)state_bytes, msg);
        /* the model as train.h promises */
        int fs = failed_step(msg);
        int any_changed = 0, after_backward = !ebb_plan_updates_in_backward(r->plan),
            not_atomic = 0;
        if (verbose())
            printf("  %s, step %d, allocation %lld: %s\n", r->name, warm + 1, (long long)n, msg);
        for (int i = 0; i < now.n; i++) {
            int u = update_step_of(r->plan, i);
            int want_updated = fs >= 0 && u >= 0 && u < fs;
            const snapshot *want = want_updated ? &after : &b;
            char what[256], line[2600];
            if (want_updated && after_backward && param_is(&now, want, i)) {
                /* train.h: such a plan changes nothing unless the step succeeds */
                snprintf(line, sizeof line, "allocation %lld, %s: '%s' was updated", (long long)n,
                         msg, ebb_plan_step_at(r->plan, u)->node);
                if (!tl->not_atomic && !not_atomic)
                    snprintf(tl->first_not_atomic, sizeof tl->first_not_atomic, "%s", line);
                not_atomic = any_changed = 1;
                if (verbose())
                    printf("    %s\n", line);
                continue;
            }
            if (param_is(&now, want, i))
                continue;
            describe_change(what, sizeof what, &now, &b, i);
            if (!want_updated && u == fs && r->oo.kind != EBB_SGD && fs >= 0) {
                /* the update that failed, left half-way: counted, then failed by run_step_faults */
                snprintf(line, sizeof line, "allocation %lld, %s: '%s' %s", (long long)n, msg,
                         ebb_plan_step_at(r->plan, u)->node, what);
                if (!tl->partial++)
                    snprintf(tl->first_partial, sizeof tl->first_partial, "%s", line);
                if (verbose())
                    printf("    %s\n", line);
                any_changed = 1;
                continue;
            }
            fail_msg("%s (warm %d), allocation %lld failed at plan step %d (first update at "
                     "step %d): parameter '%s' %s, expected %s (%s); %s",
                     r->name, warm, (long long)n, fs, first_update,
                     ebb_plan_step_at(r->plan, u >= 0 ? u : 0)->node, what,
                     want_updated ? "updated" : "unchanged", msg,
                     fs < 0 ? "the failure named no step" : "");
        }
        tl->not_atomic += not_atomic;
        for (int i = 0; i < now.n; i++)
            any_changed |= !param_is(&now, &b, i);
        if (fs < 0)
            tl->outside_loop++;
        else if (fs < first_update)
            tl->before_update++;
        else
            tl->after_update++;
        /* unchanged: a retry gives exactly the reference */
        if (!any_changed) {
            assert_ok(ebb_train_step(r->plan, m, o, &r->x, &r->y, NULL, NULL));
            snapshot again;
            snap_take(&again, m, o);
            for (int i = 0; i < again.n; i++)
                if (!param_is(&again, &after, i))
                    fail_msg("%s (warm %d), allocation %lld: the retried step differs from the "
                             "reference in parameter %d",
                             r->name, warm, (long long)n, i);
            snap_free(&again);
            tl->retried++;
        }
        snap_free(&now);
        snap_free(&b);
        ebb_optimizer_free(o);
        ebb_model_free(m);
    }
    if (tl->points != allocations)
        fail_msg("%s: %lld injection points, but the allocator counted %lld allocations in an "
                 "uninjected step",
                 r->name, (long long)tl->points, (long long)allocations);
    printf("%-28s step %d: %3lld allocations fail in turn: %lld before the first update, %lld "
           "after it, %lld outside the plan's steps; %lld left the model unchanged and were "
           "retried; %lld left the parameter being updated half-way\n",
           r->name, warm + 1, (long long)tl->points, (long long)tl->before_update,
           (long long)tl->after_update, (long long)tl->outside_loop, (long long)tl->retried,
           (long long)tl->partial);
    if (tl->partial)
        printf("    half-way, the first: %s\n", tl->first_partial);
    if (tl->not_atomic)
        printf("    %lld failures left parameters updated although the plan updates after the "
               "backward; the first: %s\n",
               (long long)tl->not_atomic, tl->first_not_atomic);
    snap_free(&before);
    snap_free(&after);
}

static void run_step_faults(const char *name, ebb_optimizer_options oo, int after_backward) {
    rig r;
    rig_open(&r, name, oo, after_backward);
    tally first, later;
    fail_every_allocation(&r, 0, &first); /* the first step makes the optimizer state */
    fail_every_allocation(&r, 1, &later);
    assert_true(first.points > 0 && later.points > 0);
    assert_int_equal(first.partial + later.partial, 0);
    rig_close(&r);
}

static void test_step_sgd(void **state) {
    (void)state;
    ebb_optimizer_options oo = ebb_optimizer_defaults(EBB_SGD, 0.1);
    oo.momentum = 0.9;
    run_step_faults("SGD (momentum 0.9)", oo, 0);
}

static void test_step_adamw(void **state) {
    (void)state;
    run_step_faults("AdamW", ebb_optimizer_defaults(EBB_ADAMW, 1e-2), 0);
}

/* The adaptive kinds, each with the options that give it the most state
 * and scratch: RMSprop centered with momentum and weight decay, Adagrad
 * with a decaying rate and a starting sum, Adadelta with weight decay. */
static void test_step_rmsprop(void **state) {
    (void)state;
    ebb_optimizer_options oo = ebb_optimizer_defaults(EBB_RMSPROP, 1e-2);
    oo.momentum = 0.9;
    oo.centered = 1;
    oo.weight_decay = 0.01;
    run_step_faults("RMSprop (centered, momentum 0.9)", oo, 0);
}

static void test_step_adagrad(void **state) {
    (void)state;
    ebb_optimizer_options oo = ebb_optimizer_defaults(EBB_ADAGRAD, 1e-2);
    oo.lr_decay = 0.1;
    oo.initial_accumulator_value = 0.5;
    run_step_faults("Adagrad", oo, 0);
}

static void test_step_adadelta(void **state) {
    (void)state;
    ebb_optimizer_options oo = ebb_optimizer_defaults(EBB_ADADELTA, 1.0);
    oo.weight_decay = 0.01;
    run_step_faults("Adadelta", oo, 0);
}

static void test_step_sgd_updates_after_backward(void **state) {
    (void)state;
    ebb_optimizer_options oo = ebb_optimizer_defaults(EBB_SGD, 0.1);
    oo.momentum = 0.9;
    run_step_faults("SGD, updates after backward", oo, 1);
}

/* ---- checkpoints ------------------------------------------------------------ */

typedef enum { W_MODEL, W_OPTIMIZER, W_CHECKPOINT, W_LARGE } write_kind;
static const char *const WRITE_NAMES[] = {
    "weights (ebb_model_save)", "optimizer state (ebb_optimizer_save)",
    "checkpoint (weights + state + metadata)", "checkpoint with a 1 MiB tensor"};

/* What `ebb train` writes as a checkpoint: the parameters and the optimizer
 * state in one file, with metadata. */
static ebb_status write_checkpoint(const char *path, const ebb_model *m, const ebb_optimizer *o,
                                   ebb_tensor *extra) {
    const char *names[MAX_PARAMS * (N_STATE + 1) + 1];
    ebb_tensor *ts[MAX_PARAMS * (N_STATE + 1) + 1];
    char state_names[MAX_PARAMS * N_STATE][128];
    int n = 0, k = 0;
    for (int i = 0; i < ebb_model_param_count(m); i++) {
        names[n] = ebb_model_param_name(m, i);
        ts[n] = ebb_model_param(m, names[n]);
        n++;
        for (int s = 0; s < N_STATE; s++) {
            ebb_tensor *t = ebb_optimizer_state_tensor(o, i, STATE_NAMES[s]);
            if (!t)
                continue;
            snprintf(state_names[k], sizeof state_names[k], "optim.%s.%s",
                     ebb_model_param_name(m, i), STATE_NAMES[s]);
            names[n] = state_names[k++];
            ts[n++] = t;
        }
    }
    if (extra) { /* large enough for several write(2) calls */
        names[n] = "extra";
        ts[n++] = extra;
    }
    const char *meta[] = {"ebb_checkpoint", "1", "step", "1"};
    return ebb_safetensors_write_meta(path, names, ts, n, meta, 2);
}

static ebb_tensor *large; /* W_LARGE's extra tensor: 1 MiB */

static ebb_status do_write(write_kind w, const char *path, const ebb_model *m,
                           const ebb_optimizer *o) {
    switch (w) {
    case W_MODEL: return ebb_model_save(m, path);
    case W_OPTIMIZER: return ebb_optimizer_save(o, path);
    case W_CHECKPOINT: return write_checkpoint(path, m, o, NULL);
    default: return write_checkpoint(path, m, o, large);
    }
}

static void put_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* The old file (written from the untrained model), the new one (after two
 * steps), and the model and optimizer that write the new one. */
typedef struct ckpt_case {
    rig r;
    ebb_model *m;
    ebb_optimizer *o;
    char path[512];
    unsigned char *old_bytes, *new_bytes;
    size_t old_n, new_n;
} ckpt_case;

static void ckpt_open(ckpt_case *c, write_kind w) {
    memset(c, 0, sizeof *c);
    rig_open(&c->r, WRITE_NAMES[w], ebb_optimizer_defaults(EBB_ADAMW, 1e-2), 0);
    snprintf(c->path, sizeof c->path, "%s/ckpt%d.safetensors", dir, (int)w);
    ebb_shape s = EBB_SHAPE(1 << 18);
    if (w == W_LARGE)
        assert_ok(ebb_tensor_full(&large, &s, 0.5, EBB_FLOAT32, CPU));
    rig_fresh(&c->r, 1, &c->m, &c->o); /* the optimizer has state to write */
    assert_ok(do_write(w, c->path, c->m, c->o));
    c->old_bytes = ebb_test_read_file(c->path, &c->old_n);
    assert_ok(ebb_train_step(c->r.plan, c->m, c->o, &c->r.x, &c->r.y, NULL, NULL));
    char fresh[600];
    snprintf(fresh, sizeof fresh, "%s.new", c->path);
    assert_ok(do_write(w, fresh, c->m, c->o));
    c->new_bytes = ebb_test_read_file(fresh, &c->new_n);
    unlink(fresh);
    assert_false(c->old_n == c->new_n && !memcmp(c->old_bytes, c->new_bytes, c->old_n));
}

static void ckpt_close(ckpt_case *c) {
    ebb_tensor_free(large);
    large = NULL;
    ebb_optimizer_free(c->o);
    ebb_model_free(c->m);
    rig_close(&c->r);
    free(c->old_bytes);
    free(c->new_bytes);
    unlink(c->path);
}

/* The file holds the old bytes (0), the new ones (1), or neither (-1). */
static int which_file(const ckpt_case *c) {
    size_t n = 0;
    unsigned char *b = ebb_test_read_file(c->path, &n);
    int r = n == c->old_n && !memcmp(b, c->old_bytes, n)   ? 0
            : n == c->new_n && !memcmp(b, c->new_bytes, n) ? 1
                                                           : -1;
    free(b);
    return r;
}

/* Every allocation of a checkpoint write fails in turn: the old file stays. */
static int64_t fail_write_allocations(write_kind w) {
    ckpt_case c;
    ckpt_open(&c, w);
    int64_t n = 1;
    for (;; n++) {
        assert_true(n <= MAX_N);
        int64_t live0 = ebb_tensor_live_count(), bytes0 = ebb_memory_current(CPU);
        ebb_memory_fail_nth(n);
        ebb_status st = do_write(w, c.path, c.m, c.o);
        int fired = ebb_memory_fail_fired();
        ebb_memory_fail_nth(0);
        if (st == EBB_OK) {
            assert_false(fired);
            assert_int_equal(which_file(&c), 1);
            break;
        }
        if (!fired || st != EBB_ERR_NOMEM || !strstr(ebb_errmsg(), "out of memory"))
            fail_msg("%s, allocation %lld: %s: %s", WRITE_NAMES[w], (long long)n,
                     ebb_status_name(st), ebb_errmsg());
        if (ebb_tensor_live_count() != live0 || ebb_memory_current(CPU) != bytes0)
            fail_msg("%s, allocation %lld: %lld handle(s), %lld byte(s) left behind",
                     WRITE_NAMES[w], (long long)n, (long long)(ebb_tensor_live_count() - live0),
                     (long long)(ebb_memory_current(CPU) - bytes0));
        if (which_file(&c) != 0)
            fail_msg("%s, allocation %lld: the old file changed", WRITE_NAMES[w], (long long)n);
        assert_int_equal(count_temporaries(), 0);
    }
    ckpt_close(&c);
    return n - 1;
}

/* Every file operation of a checkpoint write fails in turn (each with an
 * errno of its own kind): the old file stays and no temporary is left, but
 * for the directory sync after the rename, where the new file is in place. */
static int64_t fail_write_file_ops(write_kind w) {
    ckpt_case c;
    ckpt_open(&c, w);
    /* the count of an uninjected write */
    ebb_file_fail_nth(0, 0);
    assert_ok(do_write(w, c.path, c.m, c.o));
    int64_t ops = ebb_file_op_count();
    assert_true(ops >= 6); /* create, a write, sync, close, rename, directory sync */
    static const int errs[] = {EIO, ENOSPC, EDQUOT};
    for (int64_t n = 1; n <= ops + 1; n++) {
        put_file(c.path, c.old_bytes, c.old_n);
        int err = errs[n % 3];
        int64_t live0 = ebb_tensor_live_count();
        ebb_file_fail_nth(n, err);
        ebb_status st = do_write(w, c.path, c.m, c.o);
        int fired = ebb_file_fail_fired();
        ebb_file_fail_nth(0, 0);
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", ebb_errmsg());
        if (n == ops + 1) {
            if (st != EBB_OK || fired)
                fail_msg("%s: %lld operations counted, yet operation %lld failed: %s",
                         WRITE_NAMES[w], (long long)ops, (long long)n, msg);
            assert_int_equal(which_file(&c), 1);
            break;
        }
        if (!fired || st != EBB_ERR_IO || !strstr(msg, c.path) || !strstr(msg, strerror(err)))
            fail_msg("%s, file operation %lld of %lld: %s: \"%s\" (want EBB_ERR_IO naming the "
                     "file and \"%s\")",
                     WRITE_NAMES[w], (long long)n, (long long)ops, ebb_status_name(st), msg,
                     strerror(err));
        assert_int_equal(ebb_tensor_live_count(), live0);
        if (count_temporaries() != 0)
            fail_msg("%s, file operation %lld of %lld: a temporary file was left (%s)",
                     WRITE_NAMES[w], (long long)n, (long long)ops, msg);
        int now = which_file(&c);
        if (n == ops) { /* the directory sync: renamed already */
            if (now != 1 || !strstr(msg, "directory") || !strstr(msg, "in place"))
                fail_msg("%s: the directory sync failed: the file is %s; \"%s\"", WRITE_NAMES[w],
                         now == 1 ? "new" : now == 0 ? "old" : "neither", msg);
        } else if (now != 0) {
            fail_msg("%s, file operation %lld of %lld: the old file changed (%s)", WRITE_NAMES[w],
                     (long long)n, (long long)ops, msg);
        }
    }
    ckpt_close(&c);
    return ops;
}

static void test_checkpoint_faults(void **state) {
    (void)state;
    for (int w = W_MODEL; w <= W_LARGE; w++) {
        int64_t allocs = fail_write_allocations((write_kind)w);
        int64_t ops = fail_write_file_ops((write_kind)w);
        printf("%-40s %lld allocations, %lld file operations fail in turn\n", WRITE_NAMES[w],
               (long long)allocs, (long long)ops);
    }
}

/* A write in flight when the process must die: a signal handler calls
 * ebb_file_remove_temporaries(), which only unlinks, and exits. Here the
 * signal is SIGXFSZ, raised by a file-size limit half-way through writing
 * 1 MiB. The old file stays, and no temporary is left. */
static void remove_and_exit(int sig) {
    (void)sig;
    ebb_file_remove_temporaries();
    _exit(9);
}

static void test_remove_in_flight(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/in_flight.safetensors", dir);
    ebb_shape s = EBB_SHAPE(4), sbig = EBB_SHAPE(1 << 18);
    ebb_tensor *a = NULL, *big = NULL;
    assert_ok(ebb_tensor_full(&a, &s, 1.0, EBB_FLOAT32, CPU));
    assert_ok(ebb_tensor_full(&big, &sbig, 3.0, EBB_FLOAT32, CPU));
    const char *names[] = {"t"};
    assert_ok(ebb_safetensors_write(path, names, &a, 1));
    size_t old_n = 0;
    unsigned char *old = ebb_test_read_file(path, &old_n);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit low = {65536, 65536};
        signal(SIGXFSZ, remove_and_exit);
        setrlimit(RLIMIT_FSIZE, &low);
        ebb_safetensors_write(path, names, &big, 1);
        _exit(3); /* not reached: the handler exits */
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 9);
    assert_int_equal(count_temporaries(), 0);
    size_t n = 0;
    unsigned char *now = ebb_test_read_file(path, &n);
    assert_int_equal(n, old_n);
    assert_memory_equal(now, old, n);
    free(now);
    free(old);
    unlink(path);
    ebb_tensor_free(a);
    ebb_tensor_free(big);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        EBB_TEST(test_step_sgd),
        EBB_TEST(test_step_adamw),
        EBB_TEST(test_step_rmsprop),
        EBB_TEST(test_step_adagrad),
        EBB_TEST(test_step_adadelta),
        EBB_TEST(test_step_sgd_updates_after_backward),
        EBB_TEST(test_checkpoint_faults),
        EBB_TEST(test_remove_in_flight),
    };
    return cmocka_run_group_tests_name("faults", tests, make_dir, remove_dir);
}
