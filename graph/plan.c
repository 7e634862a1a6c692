/* Reading a plan: accessors and the EXPLAIN listing. */
#include <stdio.h>
#include <string.h>
#include <zlib.h>

#include "ebb/train.h"
#include "plan_internal.h"

/* ---- values ------------------------------------------------------------------ */

void ebb_plan_value_id(const ebb_plan *p, int slot, char *buf, size_t size) {
    if (!buf || size == 0)
        return;
    if (!p || slot < 0 || slot >= p->n_values) {
        buf[0] = '\0';
        return;
    }
    const ebb_plan_value *v = &p->values[slot];
    if (v->kind == EBB_VALUE_INPUT && v->name)
        snprintf(buf, size, "%s", v->name);
    else
        snprintf(buf, size, "v%d", slot);
}

int ebb_plan_value_last_use(const ebb_plan *p, int slot) {
    int last = p && slot >= 0 && slot < p->n_values ? p->values[slot].producer : -1;
    for (int i = 0; p && i < p->n_steps; i++)
        for (int k = 0; k < p->steps[i].pub.n_in; k++)
            if (p->steps[i].pub.in[k] == slot)
                last = i;
    return last;
}

int ebb_plan_step_count(const ebb_plan *p) { return p ? p->n_steps : 0; }

int ebb_step_kind_is_collective(ebb_step_kind kind) {
    return kind >= EBB_STEP_ALLREDUCE && kind <= EBB_STEP_REDUCE_SCATTER_WAIT;
}

const ebb_plan_step *ebb_plan_step_at(const ebb_plan *p, int i) {
    return p && i >= 0 && i < p->n_steps ? &p->steps[i].pub : NULL;
}

int ebb_plan_value_count(const ebb_plan *p) { return p ? p->n_values : 0; }

const ebb_plan_value *ebb_plan_value_at(const ebb_plan *p, int slot) {
    return p && slot >= 0 && slot < p->n_values ? &p->values[slot] : NULL;
}

int ebb_plan_input_count(const ebb_plan *p) { return p ? p->n_inputs : 0; }
int ebb_plan_input_slot(const ebb_plan *p, int i) {
    return p && i >= 0 && i < p->n_inputs ? p->inputs[i] : -1;
}
int ebb_plan_output_count(const ebb_plan *p) { return p ? p->n_outputs : 0; }
int ebb_plan_output_slot(const ebb_plan *p, int i) {
    return p && i >= 0 && i < p->n_outputs ? p->outputs[i] : -1;
}
const char *ebb_plan_output_name(const ebb_plan *p, int i) {
    return p && i >= 0 && i < p->n_outputs ? p->output_names[i] : NULL;
}

int64_t ebb_plan_peak_bytes(const ebb_plan *p, int *at_step) {
    if (at_step)
        *at_step = p ? p->peak_step : -1;
    return p ? p->peak_bytes : 0;
}

int ebb_plan_peak_is_bound(const ebb_plan *p) { return p ? p->peak_is_bound : 0; }

static int64_t param_nbytes(const ebb_plan *p, int i) {
    const ebb_param_spec *s = &p->params[i].spec;
    return ebb_shape_numel(&s->shape) * (int64_t)ebb_dtype_size(s->counter ? EBB_INT64 : p->dtype);
}

int64_t ebb_plan_param_bytes(const ebb_plan *p) {
    int64_t n = 0;
    for (int i = 0; p && i < p->n_params; i++)
        n += param_nbytes(p, i);
    return n;
}

int ebb_plan_low_copies(const ebb_plan *p, int64_t *kept_bytes, int *recast) {
    if (kept_bytes)
        *kept_bytes = p ? p->kept_copy_bytes : 0;
    if (recast)
        *recast = p ? p->n_recast_copies : 0;
    return p ? p->n_kept_copies : 0;
}

/* ---- fingerprint ------------------------------------------------------------- */

static uLong crc_bytes(uLong crc, const void *b, size_t n) {
    return crc32(crc, (const Bytef *)b, (uInt)n);
}
static uLong crc_int(uLong crc, int64_t v) { return crc_bytes(crc, &v, sizeof v); }
static uLong crc_text(uLong crc, const char *s) {
    return s ? crc_bytes(crc, s, strlen(s) + 1) : crc_int(crc, -1);
}
static uLong crc_value(uLong crc, const ebb_plan_value *v) {
    crc = crc_int(crc, v->dtype);
    crc = crc_int(crc, v->shape.ndim);
    for (int d = 0; d < v->shape.ndim; d++) crc = crc_int(crc, v->shape.dim[d]);
    return crc;
}

uint32_t ebb_plan_fingerprint(const ebb_plan *p) {
    uLong crc = crc32(0L, Z_NULL, 0);
    if (!p) return 0;
    crc = crc_int(crc, p->training);
    for (int i = 0; i < p->n_params; i++) {
        crc = crc_text(crc, p->params[i].full_name);
        crc = crc_int(crc, p->params[i].spec.shape.ndim);
        for (int d = 0; d < p->params[i].spec.shape.ndim; d++)
            crc = crc_int(crc, p->params[i].spec.shape.dim[d]);
        crc = crc_int(crc, p->trained ? p->trained[i] : 0);
    }
    /* the forward and the loss: the backward and the updates follow from
     * them and the training options, while what the searches choose for
     * memory (recomputation, kept low copies, where updates go) may differ
     * by rank under ZeRO-1 without changing a value */
    for (int i = 0; i < p->n_steps; i++) {
        const plan_step *s = &p->steps[i];
        if (s->pub.phase != EBB_PHASE_FORWARD && s->pub.phase != EBB_PHASE_LOSS) continue;
        crc = crc_int(crc, s->pub.kind);
        crc = crc_text(crc, s->pub.op);
        crc = crc_text(crc, s->pub.node);
        for (int k = 0; k < s->pub.n_in; k++) crc = crc_value(crc, &p->values[s->pub.in[k]]);
        if (s->pub.n_out > 0) crc = crc_value(crc, &p->values[s->pub.out[0]]);
        for (int k = 0; s->op && s->attrs && k < s->op->n_attrs; k++) {
            const ebb_attr_value *a = &s->attrs[k];
            crc = crc_int(crc, a->set);
            crc = crc_int(crc, a->i);
            crc = crc_bytes(crc, &a->f, sizeof a->f);
            crc = crc_text(crc, a->s);
        }
    }
    return (uint32_t)crc;
}

int64_t ebb_plan_grad_sums_bytes(const ebb_plan *p) {
    int64_t n = 0;
    for (int i = 0; p && p->train_options.accumulate > 1 && i < p->n_steps; i++)
        for (int k = 0; p->steps[i].pub.kind == EBB_STEP_GRAD_SUMS && k < p->steps[i].pub.n_out; k++)
            n += p->values[p->steps[i].pub.out[k]].nbytes;
    return n;
}

int64_t ebb_plan_kv_cache_length(const ebb_plan *p) { return p ? p->kv_cache : 0; }

int64_t ebb_plan_kv_cache_bytes(const ebb_plan *p) {
    int64_t n = 0;
    for (int v = 0; p && v < p->n_values; v++)
        if (p->values[v].kind == EBB_VALUE_STATE)
            n += p->values[v].nbytes;
    return n;
}

int64_t ebb_plan_optimizer_state_bytes(const ebb_plan *p) {
    if (!p || !p->training || (p->train_options.grads_only && !p->owner))
        return 0;
    const ebb_optimizer_options *o = &p->train_options.optimizer;
    int slots = o->kind == EBB_SGD ? o->momentum != 0 : 2 + (o->amsgrad != 0);
    int64_t n = 0;
    for (int i = 0; i < p->n_params; i++)
        if (!p->params[i].spec.counter && !p->params[i].spec.buffer && p->trained[i] &&
            !(p->owner && p->owner[i] != p->train_options.parallel.rank))
            n += slots * param_nbytes(p, i);
    return n;
}

int ebb_plan_param_owner(const ebb_plan *p, int i) {
    if (!p || !p->owner || i < 0 || i >= p->n_params)
        return -1;
    return p->owner[i];
}

int ebb_plan_peak_is_bound_on(const ebb_plan *p, ebb_device device) {
    if (!p)
        return 0;
    return device.type == EBB_DEVICE_CUDA ? p->cuda_peak_is_bound : p->peak_is_bound;
}

int64_t ebb_plan_keep_all_peak_bytes(const ebb_plan *p) { return p ? p->keep_all_peak_bytes : 0; }

int64_t ebb_plan_device_peak_bytes(const ebb_plan *p, ebb_device device) {
    if (!p)
        return 0;
    return device.type == EBB_DEVICE_CUDA ? p->cuda_peak_bytes : p->peak_bytes;
}

int ebb_plan_is_training(const ebb_plan *p) { return p ? p->training : 0; }
int ebb_plan_target_count(const ebb_plan *p) { return p ? p->n_targets : 0; }
int ebb_plan_param_trained(const ebb_plan *p, int i) {
    return p && p->trained && i >= 0 && i < p->n_params ? p->trained[i] : 0;
}

int ebb_plan_keep_all(const ebb_plan *p) { return p ? p->keep_all : 0; }
const char *ebb_plan_name(const ebb_plan *p) { return p ? p->name : NULL; }

int ebb_plan_param_count(const ebb_plan *p) { return p ? p->n_params : 0; }

const ebb_param_spec *ebb_plan_param_at(const ebb_plan *p, int i, const char **full_name) {
    if (!p || i < 0 || i >= p->n_params)
        return NULL;
    if (full_name)
        *full_name = p->params[i].full_name;
    return &p->params[i].spec;
}

const char *ebb_plan_phase_name(ebb_step_phase phase) {
    switch (phase) {
    case EBB_PHASE_FORWARD: return "forward";
    case EBB_PHASE_LOSS: return "loss";
    case EBB_PHASE_BACKWARD: return "backward";
    case EBB_PHASE_UPDATE: return "update";
    }
    return "forward";
}

int ebb_plan_value_saved(const ebb_plan *p, int slot) {
    if (!p || !p->training || slot < 0 || slot >= p->n_values)
        return 0;
    int made = p->values[slot].producer;
    if (p->values[slot].kind == EBB_VALUE_INPUT ||
        (made >= 0 && p->steps[made].pub.phase == EBB_PHASE_BACKWARD))
        return 0;
    for (int i = 0; i < p->n_steps; i++)
        if (p->steps[i].pub.kind == EBB_STEP_BACKWARD || p->steps[i].pub.recompute)
            for (int k = 0; k < p->steps[i].pub.n_in; k++)
                if (p->steps[i].pub.in[k] == slot)
                    return 1;
    return 0;
}

static void slots_text(const ebb_plan *p, char *buf, size_t size, const int *slots, int n) {
    size_t at = 0;
    char id[64];
    buf[0] = '\0';
    for (int i = 0; i < n && at < size; i++) {
        ebb_plan_value_id(p, slots[i], id, sizeof id);
        at += (size_t)snprintf(buf + at, size - at, "%s%s", i ? " " : "", id);
    }
    if (n == 0)
        snprintf(buf, size, "-");
}

/* The trade a memory budget made: what is recomputed where, from what. */
static void print_remat(const ebb_plan *p, FILE *f) {
    if (!p->memory_budget)
        return;
    char bb[32], pb[32], nb[32];
    ebb_bytes_str(p->memory_budget, bb, sizeof bb);
    ebb_bytes_str(p->budget_peak_bytes, pb, sizeof pb);
    ebb_bytes_str(p->no_recompute_peak_bytes, nb, sizeof nb);
    int n_re = 0;
    for (int i = 0; i < p->n_steps; i++) {
        const ebb_plan_step *s = &p->steps[i].pub;
        if (!s->recompute)
            continue;
        /* the first step after it that reads what it makes */
        int user = -1;
        for (int j = i + 1; j < p->n_steps && user < 0; j++)
            for (int k = 0; k < p->steps[j].pub.n_in && user < 0; k++)
                if (p->steps[j].pub.in[k] == s->out[0])
                    user = j;
        char id[64];
        ebb_plan_value_id(p, s->out[0], id, sizeof id);
        fprintf(f, n_re++ ? "\n  " : "recomputed in the backward:\n  ");
        fprintf(f, "step %d (%s, %s) makes %s again for step %d (%s)", i, s->op, s->node, id,
                user, user >= 0 ? p->steps[user].pub.op : "-");
    }
    if (n_re)
        fputc('\n', f);
    double pct = p->flops > 0 ? 100.0 * (double)p->recompute_flops / (double)p->flops : 0.0;
    fprintf(f, "memory budget %s%s: peak %s (the larger of the CPU and CUDA counts) against %s keeping every value",
            p->budget_least ? "least, " : "", bb, pb, nb);
    if (p->budget_peak_bytes > 0 && n_re)
        fprintf(f, " (%.2fx less); %d steps recomputed, checkpoints every %d cut point%s, "
                   "+%.3g GFLOP (%.0f%% more compute)",
                (double)p->no_recompute_peak_bytes / (double)p->budget_peak_bytes, n_re,
                p->remat_segment, p->remat_segment == 1 ? "" : "s",
                (double)p->recompute_flops / 1e9, pct);
    else
        fputs("; nothing recomputed", f);
    fputc('\n', f);
}

/* Which updates the compiler moved to the backward's end, and what that
 * saved (graph/placement.c). */
static void print_placement(const ebb_plan *p, FILE *f) {
    if (!p->n_deferred)
        return;
    char pb[32], eb[32];
    ebb_bytes_str(p->budget_peak_bytes, pb, sizeof pb);
    ebb_bytes_str(p->eager_peak_bytes, eb, sizeof eb);
    int trained = 0;
    for (int i = 0; i < p->n_params; i++)
        trained += p->trained[i];
    fprintf(f, "updates placed by the peak: %d of %d wait for the backward's end, where the "
               "activations are gone (",
            p->n_deferred, trained);
    for (int i = 0, k = 0; i < p->n_params; i++)
        if (p->deferred[i])
            fprintf(f, k++ ? ", %s" : "%s", p->params[i].full_name);
    fprintf(f, "): peak %s (the larger of the CPU and CUDA counts) against %s with every update "
               "right after its gradient\n",
            pb, eb);
}

/* Mixed precision: which weights' low copies the forward keeps for the
 * backward, and why the others are cast again (graph/copies.c). */
static void print_low_copies(const ebb_plan *p, FILE *f) {
    if (!p->n_kept_copies && !p->n_recast_copies)
        return;
    char kb[32];
    ebb_bytes_str(p->kept_copy_bytes, kb, sizeof kb);
    fputs("low weight copies:", f);
    ebb_low_copies how = p->train_options.low_weight_copies;
    if (p->n_kept_copies)
        fprintf(f, " %d kept from the forward for the backward (%s)%s", p->n_kept_copies, kb,
                how == EBB_LOW_COPIES_AUTO ? ", which does not raise the peak" : "");
    if (p->n_recast_copies)
        fprintf(f, "%s %d cast again in the backward, %s", p->n_kept_copies ? ";" : "",
                p->n_recast_copies,
                p->memory_budget               ? "as a memory budget recomputes"
                : how == EBB_LOW_COPIES_RECAST ? "as the options ask"
                                               : "as keeping them would raise the peak");
    fputc('\n', f);
    if (!p->n_kept_copies)
        return;
    fputs("  kept at steps", f);
    for (int i = 0, k = 0; i < p->n_steps; i++)
        if (p->steps[i].keep_copy && p->steps[i].pub.kind == EBB_STEP_OP)
            fprintf(f, k++ ? ", %d" : " %d", i);
    fputc('\n', f);
}

/* What gradient clipping does to the step, and what it costs. */
static void print_clip(const ebb_plan *p, FILE *f) {
    if (p->train_options.clip_grad_value > 0)
        fprintf(f,
                "clip_grad_value %g: each update clamps its gradient to [-%g, %g] first, into "
                "a copy the size of the gradient\n",
                p->train_options.clip_grad_value, p->train_options.clip_grad_value,
                p->train_options.clip_grad_value);
    if (p->train_options.loss_scaling) {
        int at = -1;
        for (int i = 0; i < p->n_steps && at < 0; i++)
            if (p->steps[i].pub.kind == EBB_STEP_UNSCALE)
                at = i;
        fprintf(f, "loss scaling: the backward starts from the optimizer's scale; step %d divides "
                   "every gradient by it and skips the updates when one is not finite\n",
                at);
    }
    if (p->train_options.parallel.world > 1) {
        int64_t most = 0;
        int overlap = 0, scatter = 0;
        for (int i = 0; i < p->n_steps; i++) {
            const plan_step *s = &p->steps[i];
            ebb_step_kind k = s->pub.kind;
            if (k != EBB_STEP_ALLREDUCE && k != EBB_STEP_REDUCE_SCATTER &&
                k != EBB_STEP_ALLREDUCE_START && k != EBB_STEP_REDUCE_SCATTER_START)
                continue; /* not a bucket's first step */
            /* a started collective's buffers are its outputs, values */
            int started = k == EBB_STEP_ALLREDUCE_START || k == EBB_STEP_REDUCE_SCATTER_START;
            int64_t b = started ? 0 : s->workspace;
            for (int j = 0; started && j < s->pub.n_out; j++)
                b += p->values[s->pub.out[j]].nbytes;
            most = b > most ? b : most;
            overlap |= started;
            scatter += s->owners != NULL;
        }
        char mb[32], how[96];
        ebb_bytes_str(most, mb, sizeof mb);
        if (scatter == p->n_buckets)
            snprintf(how, sizeof how, "reduce-scatter: this rank gets the means of its own");
        else if (scatter)
            snprintf(how, sizeof how, "%d all-reduced, %d reduce-scattered",
                     p->n_buckets - scatter, scatter);
        else
            snprintf(how, sizeof how, "all-reduce");
        fprintf(f, "data parallel over %d ranks: %d bucket step%s average the gradients (%s), "
                   "%s; the largest bucket's buffers %s\n",
                p->train_options.parallel.world, p->n_buckets, p->n_buckets == 1 ? "" : "s", how,
                !p->updates_in_backward
                    ? (overlap ? "each travelling while the backward goes on until the next "
                                 "bucket is full, the updates after the backward"
                               : "each as it fills, the updates after the backward")
                : overlap ? "each travelling while the backward goes on until the next bucket "
                            "is full, then waited for and its updates made"
                          : "each bucket's updates right after it",
                mb);
        if (p->owner) {
            /* ZeRO-1: this rank's share of the updates and the state */
            int owned = 0, trained = 0, n_bc = 0;
            int64_t bytes = 0, all = 0, biggest = 0;
            for (int i = 0; i < p->n_params; i++) {
                if (!p->trained[i])
                    continue;
                trained++;
                all += param_nbytes(p, i);
                if (p->owner[i] == p->train_options.parallel.rank) {
                    owned++;
                    bytes += param_nbytes(p, i);
                }
            }
            for (int i = 0; i < p->n_steps; i++)
                if (p->steps[i].pub.kind == EBB_STEP_BROADCAST) {
                    n_bc++;
                    biggest = p->steps[i].workspace > biggest ? p->steps[i].workspace : biggest;
                }
            char ob[32], ab[32], sb[32], bb[32];
            ebb_bytes_str(bytes, ob, sizeof ob);
            ebb_bytes_str(all, ab, sizeof ab);
            ebb_bytes_str(ebb_plan_optimizer_state_bytes(p), sb, sizeof sb);
            ebb_bytes_str(biggest, bb, sizeof bb);
            fprintf(f,
                    "ZeRO-1, rank %d of %d: updates %d of %d parameter tensors (%s of %s) and "
                    "holds their optimizer state (%s); %d broadcast step%s send each rank's "
                    "updated parameters to the others, the largest buffer %s\n",
                    p->train_options.parallel.rank, p->train_options.parallel.world, owned, trained,
                    ob, ab, sb, n_bc, n_bc == 1 ? "" : "s", bb);
        }
    }
    if (!(p->train_options.clip_grad_norm > 0) && !p->train_options.loss_scaling)
        return;
    char pb[32], ub[32], cb[32];
    int64_t cost = p->budget_peak_bytes - p->unclipped_peak_bytes;
    ebb_bytes_str(p->budget_peak_bytes, pb, sizeof pb);
    ebb_bytes_str(p->unclipped_peak_bytes, ub, sizeof ub);
    ebb_bytes_str(cost < 0 ? -cost : cost, cb, sizeof cb);
    if (p->train_options.clip_grad_norm > 0)
        fprintf(f,
                "clip_grad_norm %g: the updates wait for every gradient (their norm needs them "
                "all): peak %s (the larger of the CPU and CUDA counts) against %s without "
                "clipping, %s%s\n",
                p->train_options.clip_grad_norm, pb, ub, cost < 0 ? "less by " : "+", cb);
    else
        fprintf(f,
                "loss scaling: the updates wait for every gradient (an overflow in any skips them "
                "all): peak %s (the larger of the CPU and CUDA counts) against %s with updates "
                "inside the backward, %s%s\n",
                pb, ub, cost < 0 ? "less by " : "+", cb);
}

void ebb_plan_print(const ebb_plan *p, FILE *f) { ebb_plan_print_ex(p, f, NULL, NULL); }

/* The step table: one row per step, the phase headers of a training plan
 * and, with `label`, the spec column. */
static void print_steps(const ebb_plan *p, FILE *f, ebb_node_label_fn label, void *user) {
    /* the op column fits the longest name ("layer_norm.backward") */
    int opw = 12;
    for (int i = 0; i < p->n_steps; i++)
        if ((int)strlen(p->steps[i].pub.op) > opw)
            opw = (int)strlen(p->steps[i].pub.op);
    fprintf(f, "%4s  %-*s %-28s %-14s %-10s %-16s %-18s %s%s\n", "step", opw, "op", "node", "in",
            "out", "shape", "frees", label ? "live        " : "live", label ? "spec" : "");
    for (int i = 0; i < p->n_steps; i++) {
        const ebb_plan_step *s = &p->steps[i].pub;
        char in[128], out[64], frees[256], shape[128] = "-", jf[192];
        if (p->training && (i == 0 || s->phase != p->steps[i - 1].pub.phase))
            fprintf(f, "      -- %s --\n", ebb_plan_phase_name(s->phase));
        slots_text(p, in, sizeof in, s->in, s->n_in);
        slots_text(p, out, sizeof out, s->out, s->n_out);
        slots_text(p, frees, sizeof frees, s->frees, s->n_frees);
        if (s->n_out > 0) {
            int v = s->out[s->kind == EBB_STEP_ENTER ? 1 : 0];
            ebb_dtype dt = p->values[v].dtype;
            /* a mixed-precision plan's low values say so */
            int low = dt == EBB_BFLOAT16 || dt == EBB_FLOAT16;
            size_t n = low ? (size_t)snprintf(shape, sizeof shape, "%s",
                                              dt == EBB_BFLOAT16 ? "bf16" : "f16")
                           : 0;
            ebb_shape_str(&p->values[v].shape, shape + n, sizeof shape - n);
        }
        fprintf(f, "%4d  %-*s %-28s %-14s %-10s %-16s %-18s %lld", i, opw, s->op, s->node, in, out,
                shape, frees, (long long)s->live_bytes);
        if (label) { /* the spec column, 12 characters after the live column starts */
            const char *l = label(user, s->node);
            int w = snprintf(NULL, 0, "%lld", (long long)s->live_bytes);
            fprintf(f, "%*s%s", w < 10 ? 12 - w : 2, "", l ? l : "-");
        }
        if (s->jump >= 0) {
            slots_text(p, jf, sizeof jf, s->jump_frees, s->n_jump_frees);
            fprintf(f, "  jump %d, frees %s", s->jump, jf);
        }
        fputc('\n', f);
    }
}

/* What the backward keeps from the forward, and until when. */
static void print_saved(const ebb_plan *p, FILE *f) {
    int n_saved = 0;
    int64_t saved_bytes = 0;
    for (int v = 0; v < p->n_values; v++)
        if (ebb_plan_value_saved(p, v)) {
            char id[64], sb[32];
            int last = ebb_plan_value_last_use(p, v), made = p->values[v].producer;
            ebb_plan_value_id(p, v, id, sizeof id);
            ebb_bytes_str(p->values[v].nbytes, sb, sizeof sb);
            fprintf(f, n_saved++ ? "\n  " : "saved for the backward:\n  ");
            int root = v;
            while (p->values[root].alias_of >= 0)
                root = p->values[root].alias_of;
            char of[80] = "";
            if (root != v) {
                char rid[64];
                ebb_plan_value_id(p, root, rid, sizeof rid);
                snprintf(of, sizeof of, " of %s's storage", rid);
            }
            ebb_bytes_str(p->values[root].nbytes, sb, sizeof sb);
            fprintf(f, "%s (%s%s, %s) from step %d (%s) to step %d (%s)", id, sb, of,
                    p->steps[made].pub.op, made, p->steps[made].pub.node, last,
                    p->steps[last].pub.op);
            saved_bytes += p->values[root].nbytes;
        }
    if (n_saved) {
        char tb[32];
        ebb_bytes_str(saved_bytes, tb, sizeof tb);
        fprintf(f, "\n%d values (%s) cross from the forward into the backward; every other "
                   "forward value dies in the forward\n",
                n_saved, tb);
    }
}

/* A training plan's summary: what it trains and how, what it costs beside
 * the step, and its searches' choices. */
static void print_training(const ebb_plan *p, FILE *f) {
    print_saved(p, f);
    int trained = 0;
    for (int i = 0; i < p->n_params; i++)
        trained += p->trained[i];
    fprintf(f, "training step: %d target(s), %d of %d parameter tensors trained, %s\n",
            p->n_targets, trained, p->n_params,
            p->train_options.grads_only            ? "gradients handed out (no updates)"
            : p->updates_in_backward && p->n_deferred
                ? "each updated as soon as its gradient is final, which frees the gradient, "
                  "but those below"
            : p->updates_in_backward ? "each updated as soon as its gradient is final, which "
                                       "frees the gradient"
                                     : "updated after the backward");
    char pb[32], ob[32];
    ebb_bytes_str(ebb_plan_param_bytes(p), pb, sizeof pb);
    ebb_bytes_str(ebb_plan_optimizer_state_bytes(p), ob, sizeof ob);
    if (!p->train_options.grads_only)
        fprintf(f, "beside the step, for the whole run: parameters %s, optimizer state %s "
                   "(made with the optimizer: no step allocates it)\n",
                pb, ob);
    if (p->train_options.accumulate > 1) {
        char sb[32];
        ebb_bytes_str(ebb_plan_grad_sums_bytes(p), sb, sizeof sb);
        fprintf(f, "accumulation: %d micro-batches a step, each gradient added into its sum as "
                   "soon as it is final; the sums (%s, made at the first micro-batch) stay "
                   "beside the parameters, and only the step's last micro-batch goes on past "
                   "grad_sums to the update\n",
                p->train_options.accumulate, sb);
    }
    if (p->no_decay && !p->train_options.grads_only) {
        fputs("without weight decay (a parameter group):", f);
        for (int i = 0, k = 0; i < p->n_params; i++)
            if (p->no_decay[i])
                fprintf(f, k++ ? ", %s" : " %s", p->params[i].full_name);
        fputc('\n', f);
    }
    print_remat(p, f);
    print_placement(p, f);
    print_low_copies(p, f);
    print_clip(p, f);
}

/* Generation's key/value cache: what it holds, for which steps. */
static void print_kv_cache(const ebb_plan *p, FILE *f) {
    char cb[32], sb[128];
    int n = 0;
    ebb_bytes_str(ebb_plan_kv_cache_bytes(p), cb, sizeof cb);
    for (int v = 0; v < p->n_values; v++)
        n += p->values[v].kind == EBB_VALUE_STATE;
    fprintf(f, "key/value cache: %lld positions, %d tensors (%s) held by the run's ebb_kv_cache "
               "beside the parameters, not in the peak; each step's tokens start where the "
               "cache's filled positions end\n",
            (long long)p->kv_cache, n, cb);
    for (int i = 0; i < p->n_steps; i++) {
        const ebb_plan_step *s = &p->steps[i].pub;
        if (s->kind != EBB_STEP_OP || !p->steps[i].op->state_inputs)
            continue;
        for (int k = 0; k < s->n_in; k++) {
            const ebb_plan_value *v = &p->values[s->in[k]];
            if (v->kind != EBB_VALUE_STATE)
                continue;
            ebb_bytes_str(v->nbytes, cb, sizeof cb);
            fprintf(f, "  v%d %s %s (%s): step %d (%s) writes %s, then reads every filled "
                       "position\n",
                    s->in[k], ebb_dtype_name(v->dtype), ebb_shape_str(&v->shape, sb, sizeof sb),
                    cb, i, s->node, k == 3 ? "the keys" : "the values");
        }
    }
}

void ebb_plan_print_ex(const ebb_plan *p, FILE *f, ebb_node_label_fn label, void *user) {
    if (!p || !f)
        return;
    /* the spec column only where some step has a label */
    int labeled = 0;
    for (int i = 0; label && i < p->n_steps && !labeled; i++)
        labeled = label(user, p->steps[i].pub.node) != NULL;
    if (!labeled)
        label = NULL;
    fprintf(f, "plan %s%s\n", p->name, p->keep_all ? " (keep_all)" : "");
    for (int i = 0; i < p->n_inputs; i++) {
        const ebb_plan_value *v = &p->values[p->inputs[i]];
        char sb[128];
        fprintf(f, "input  %s %s %s\n", v->name, ebb_dtype_name(v->dtype),
                ebb_shape_str(&v->shape, sb, sizeof sb));
    }
    print_steps(p, f, label, user);
    for (int i = 0; i < p->n_outputs; i++) {
        const ebb_plan_value *v = &p->values[p->outputs[i]];
        char sb[128];
        char id[64];
        ebb_plan_value_id(p, p->outputs[i], id, sizeof id);
        fprintf(f, "output %s = %s %s %s\n", p->output_names[i], id, ebb_dtype_name(v->dtype),
                ebb_shape_str(&v->shape, sb, sizeof sb));
    }
    int64_t param_bytes = 0;
    for (int i = 0; i < p->n_params; i++)
        param_bytes += ebb_shape_numel(&p->params[i].spec.shape) *
                       (int64_t)ebb_dtype_size(p->params[i].spec.counter ? EBB_INT64 : p->dtype);
    char pb[32], peak[32], keep[32];
    ebb_bytes_str(param_bytes, pb, sizeof pb);
    ebb_bytes_str(p->peak_bytes, peak, sizeof peak);
    ebb_bytes_str(p->keep_all_peak_bytes, keep, sizeof keep);
    fprintf(f, "%d steps, %d values, %d parameter tensors (%s)\n", p->n_steps, p->n_values,
            p->n_params, pb);
    if (p->kv_cache > 0)
        print_kv_cache(p, f);
    if (p->training)
        print_training(p, f);
    int n_in_place = 0;
    for (int i = 0; i < p->n_steps; i++)
        if (p->steps[i].pub.in_place)
            fprintf(f, n_in_place++ ? ", %d" : "in place (the output reuses its dying input): steps %d", i);
    if (n_in_place)
        fputc('\n', f);
    fprintf(f, "predicted peak %lld bytes (%s, %s) at step %d", (long long)p->peak_bytes, peak,
            p->peak_is_bound ? "upper bound" : "exact", p->peak_step);
    if (p->peak_step >= 0)
        fprintf(f, " (%s)", p->steps[p->peak_step].pub.node);
    fprintf(f, "; keep_all peak %lld bytes (%s)", (long long)p->keep_all_peak_bytes, keep);
    if (p->keep_all_peak_bytes > 0 && !p->keep_all)
        fprintf(f, ", liveness saves %.0f%%",
                100.0 * (double)(p->keep_all_peak_bytes - p->peak_bytes) /
                    (double)p->keep_all_peak_bytes);
    fputc('\n', f);
}
