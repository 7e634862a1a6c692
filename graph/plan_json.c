/* `ebb plan --json`: the plan as one JSON object. Field names are a contract
 * (docs/cli.md); add fields, never rename them. */
#include <stdio.h>
#include <string.h>

#include "plan_internal.h"

void ebb_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (*p < 0x20)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

static void shape_json(FILE *f, const ebb_shape *s) {
    fputc('[', f);
    for (int d = 0; d < s->ndim; d++)
        fprintf(f, d ? ", %lld" : "%lld", (long long)s->dim[d]);
    fputc(']', f);
}

static void ids_json(FILE *f, const ebb_plan *p, const int *slots, int n) {
    char id[64];
    fputc('[', f);
    for (int i = 0; i < n; i++) {
        ebb_plan_value_id(p, slots[i], id, sizeof id);
        if (i)
            fputs(", ", f);
        ebb_json_string(f, id);
    }
    fputc(']', f);
}

/* "params": each parameter's name, shape, dtype, bytes and tied names. */
static void params_json(const ebb_plan *p, FILE *f) {
    fputs("],\n \"params\": [", f);
    for (int i = 0; i < p->n_params; i++) {
        const plan_param *pp = &p->params[i];
        fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
        ebb_json_string(f, pp->full_name);
        fputs(", \"shape\": ", f);
        shape_json(f, &pp->spec.shape);
        ebb_dtype dt = pp->spec.counter ? EBB_INT64 : p->dtype;
        fprintf(f, ", \"dtype\": \"%s\", \"bytes\": %lld", ebb_dtype_name(dt),
                (long long)(ebb_shape_numel(&pp->spec.shape) * (int64_t)ebb_dtype_size(dt)));
        if (pp->n_aliases) { /* the names tied nodes give it (ebb_node_share) */
            fputs(", \"aliases\": [", f);
            for (int k = 0; k < pp->n_aliases; k++) {
                if (k)
                    fputs(", ", f);
                ebb_json_string(f, pp->aliases[k]);
            }
            fputc(']', f);
        }
        fputc('}', f);
    }
}

/* "values": every slot, with its producer, last use, view and tag. */
static void values_json(const ebb_plan *p, FILE *f) {
    char id[64];
    fputs("],\n \"values\": [", f);
    for (int v = 0; v < p->n_values; v++) {
        const ebb_plan_value *val = &p->values[v];
        static const char *kinds[] = {"input", "intermediate", "output", "held", "state"};
        ebb_plan_value_id(p, v, id, sizeof id);
        fputs(v ? ",\n  {\"id\": " : "\n  {\"id\": ", f);
        ebb_json_string(f, id);
        fprintf(f, ", \"kind\": \"%s\", \"shape\": ", kinds[val->kind]);
        shape_json(f, &val->shape);
        fprintf(f, ", \"dtype\": \"%s\", \"bytes\": %lld, \"producer\": %d, \"last_use\": %d, "
                   "\"view_of\": ",
                ebb_dtype_name(val->dtype), (long long)val->nbytes, val->producer,
                ebb_plan_value_last_use(p, v));
        if (val->alias_of >= 0) {
            ebb_plan_value_id(p, val->alias_of, id, sizeof id);
            ebb_json_string(f, id);
        } else {
            fputs("null", f);
        }
        if (p->training)
            fprintf(f, ", \"saved\": %s", ebb_plan_value_saved(p, v) ? "true" : "false");
        fputs(", \"tag\": ", f);
        if (val->name && val->kind != EBB_VALUE_INPUT)
            ebb_json_string(f, val->name);
        else
            fputs("null", f);
        fputc('}', f);
    }
}

/* "steps": every step, its slots, phase, figures and jump. */
static void steps_json(const ebb_plan *p, FILE *f) {
    char id[64];
    fputs("],\n \"steps\": [", f);
    for (int i = 0; i < p->n_steps; i++) {
        const ebb_plan_step *s = &p->steps[i].pub;
        fprintf(f, "%s{\"index\": %d, \"op\": ", i ? ",\n  " : "\n  ", i);
        ebb_json_string(f, s->op);
        fputs(", \"node\": ", f);
        ebb_json_string(f, s->node);
        fputs(", \"inputs\": ", f);
        ids_json(f, p, s->in, s->n_in);
        fputs(", \"output\": ", f);
        if (s->n_out > 0) {
            ebb_plan_value_id(p, s->out[s->kind == EBB_STEP_ENTER ? 1 : 0], id, sizeof id);
            ebb_json_string(f, id);
        } else {
            fputs("null", f);
        }
        fputs(", \"outputs\": ", f);
        ids_json(f, p, s->out, s->n_out);
        fputs(", \"frees\": ", f);
        ids_json(f, p, s->frees, s->n_frees);
        fprintf(f, ", \"phase\": \"%s\"", ebb_plan_phase_name(s->phase));
        if (s->kind == EBB_STEP_UPDATE || s->kind == EBB_STEP_GRAD_SUM)
            fprintf(f, ", \"param\": %d", s->param);
        if (s->recompute)
            fputs(", \"recompute\": true", f);
        fprintf(f, ", \"live_bytes\": %lld, \"peak_bytes\": %lld, \"in_place\": %s",
                (long long)s->live_bytes, (long long)s->peak_bytes,
                p->steps[i].pub.in_place ? "true" : "false");
        if (s->jump >= 0) {
            fprintf(f, ", \"jump\": %d, \"jump_frees\": ", s->jump);
            ids_json(f, p, s->jump_frees, s->n_jump_frees);
        }
        fputc('}', f);
    }
}

/* What a training plan adds: no_decay, placement, low copies, clipping,
 * data parallel, ZeRO-1, loss scaling and the memory budget. */
static void training_json(const ebb_plan *p, FILE *f) {
    if (p->no_decay) {
        fputs(",\n \"no_decay\": [", f);
        for (int i = 0, k = 0; i < p->n_params; i++)
            if (p->no_decay[i]) {
                fputs(k++ ? ", " : "", f);
                ebb_json_string(f, p->params[i].full_name);
            }
        fputs("]", f);
    }
    if (p->n_deferred) {
        fprintf(f, ",\n \"update_placement\": {\"eager_peak_bytes\": %lld, \"deferred\": [",
                (long long)p->eager_peak_bytes);
        for (int i = 0, k = 0; i < p->n_params; i++)
            if (p->deferred[i]) {
                fputs(k++ ? ", " : "", f);
                ebb_json_string(f, p->params[i].full_name);
            }
        fputs("]}", f);
    }
    if (p->n_kept_copies || p->n_recast_copies)
        fprintf(f, ",\n \"low_weight_copies\": {\"kept\": %d, \"kept_bytes\": %lld, \"recast\": %d}",
                p->n_kept_copies, (long long)p->kept_copy_bytes, p->n_recast_copies);
    if (p->train_options.clip_grad_norm > 0 || p->train_options.clip_grad_value > 0)
        fprintf(f,
                ",\n \"clip\": {\"grad_norm\": %.17g, \"grad_value\": %.17g, \"peak_bytes\": %lld, "
                "\"unclipped_peak_bytes\": %lld}",
                p->train_options.clip_grad_norm, p->train_options.clip_grad_value,
                (long long)p->budget_peak_bytes,
                (long long)(p->train_options.clip_grad_norm > 0 ? p->unclipped_peak_bytes
                                                                : p->budget_peak_bytes));
    if (p->train_options.accumulate > 1)
        fprintf(f, ",\n \"accumulate\": {\"micro_batches\": %d, \"grad_sums_bytes\": %lld}",
                p->train_options.accumulate, (long long)ebb_plan_grad_sums_bytes(p));
    if (p->train_options.parallel.world > 1)
        fprintf(f, ",\n \"data_parallel\": {\"ranks\": %d, \"buckets\": %d}",
                p->train_options.parallel.world, p->n_buckets);
    if (p->owner) {
        fprintf(f, ",\n \"zero\": {\"rank\": %d, \"optimizer_state_bytes\": %lld, \"owner\": [",
                p->train_options.parallel.rank, (long long)ebb_plan_optimizer_state_bytes(p));
        for (int i = 0; i < p->n_params; i++)
            fprintf(f, i ? ", %d" : "%d", p->owner[i]);
        fputs("]}", f);
    }
    if (p->train_options.loss_scaling)
        fprintf(f,
                ",\n \"loss_scaling\": {\"peak_bytes\": %lld, \"updates_in_backward_peak_bytes\": "
                "%lld}",
                (long long)p->budget_peak_bytes, (long long)p->unclipped_peak_bytes);
    if (p->memory_budget) {
        int n_re = 0;
        for (int i = 0; i < p->n_steps; i++)
            n_re += p->steps[i].pub.recompute;
        fprintf(f,
                ",\n \"memory_budget\": {\"budget_bytes\": %lld, \"least\": %s, "
                "\"peak_bytes\": %lld, \"no_recompute_peak_bytes\": %lld, "
                "\"recompute_steps\": %d, \"segment\": %d, \"flops\": %lld, "
                "\"recompute_flops\": %lld}",
                (long long)p->memory_budget, p->budget_least ? "true" : "false",
                (long long)p->budget_peak_bytes, (long long)p->no_recompute_peak_bytes, n_re,
                p->remat_segment, (long long)p->flops, (long long)p->recompute_flops);
    }
}

void ebb_plan_write_json(const ebb_plan *p, FILE *f) {
    if (!p || !f)
        return;
    char id[64];
    fputs("{\"name\": ", f);
    ebb_json_string(f, p->name);
    fprintf(f, ", \"keep_all\": %s,\n \"inputs\": [", p->keep_all ? "true" : "false");
    for (int i = 0; i < p->n_inputs; i++) {
        const ebb_plan_value *v = &p->values[p->inputs[i]];
        fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
        ebb_json_string(f, v->name);
        fputs(", \"shape\": ", f);
        shape_json(f, &v->shape);
        fprintf(f, ", \"dtype\": \"%s\"}", ebb_dtype_name(v->dtype));
    }
    fputs("],\n \"outputs\": [", f);
    for (int i = 0; i < p->n_outputs; i++) {
        const ebb_plan_value *v = &p->values[p->outputs[i]];
        ebb_plan_value_id(p, p->outputs[i], id, sizeof id);
        fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
        ebb_json_string(f, p->output_names[i]);
        fputs(", \"value\": ", f);
        ebb_json_string(f, id);
        fputs(", \"shape\": ", f);
        shape_json(f, &v->shape);
        fprintf(f, ", \"dtype\": \"%s\"}", ebb_dtype_name(v->dtype));
    }
    params_json(p, f);
    values_json(p, f);
    steps_json(p, f);
    fprintf(f,
            "],\n \"peak_bytes\": %lld, \"peak_kind\": \"%s\", \"peak_step\": %d, "
            "\"keep_all_peak_bytes\": %lld, \"training\": %s, \"targets\": %d",
            (long long)p->peak_bytes, p->peak_is_bound ? "bound" : "exact", p->peak_step,
            (long long)p->keep_all_peak_bytes, p->training ? "true" : "false", p->n_targets);
    fprintf(f, ", \"param_bytes\": %lld", (long long)ebb_plan_param_bytes(p));
    if (p->kv_cache > 0)
        fprintf(f, ", \"kv_cache\": {\"positions\": %lld, \"bytes\": %lld}",
                (long long)p->kv_cache, (long long)ebb_plan_kv_cache_bytes(p));
    if (p->training)
        fprintf(f, ", \"updates_in_backward\": %s, \"optimizer_state_bytes\": %lld",
                p->updates_in_backward ? "true" : "false",
                (long long)ebb_plan_optimizer_state_bytes(p));
    training_json(p, f);
    fputs("}\n", f);
}
