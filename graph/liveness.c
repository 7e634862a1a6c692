/* Liveness: a backward dataflow over the steps' control-flow edges. A slot
 * is freed on an edge where it is live before and dead after, so every value
 * dies right after its last use on every path. Then in-place marking, which
 * reads the free lists. */
#include <stdlib.h>
#include <string.h>

#include "compile_internal.h"

typedef uint64_t word;
#define WBITS 64

static int bit_get(const word *s, int i) { return (int)((s[i / WBITS] >> (i % WBITS)) & 1u); }
static void bit_set(word *s, int i) { s[i / WBITS] |= (word)1 << (i % WBITS); }

/* The successors of step i: fall-through (i+1, or -1) and jump (or -1). */
static void successors(const ebb_plan *p, int i, int *fall, int *jump) {
    const plan_step *s = &p->steps[i];
    *fall = i + 1;
    *jump = s->pub.jump;
    (void)p;
}

/* Computes per-edge free lists. live_in[n_steps] (the exit) holds the outputs. */
int ebb_pass_liveness(compiler *c) {
    ebb_plan *p = c->plan;
    int n = p->n_steps, nv = p->n_values;
    int words = (nv + WBITS - 1) / WBITS;
    if (words == 0)
        words = 1;
    word *live = calloc((size_t)(n + 1) * (size_t)words, sizeof *live);
    word *keep = calloc((size_t)words, sizeof *keep);
    int *list = malloc((size_t)(nv ? nv : 1) * sizeof *list);
    if (!live || !keep || !list) {
        free(live);
        free(keep);
        free(list);
        return ebb_compiler_oom(c);
    }
    for (int i = 0; i < p->n_inputs; i++)
        bit_set(keep, p->inputs[i]);
    for (int v = 0; v < nv; v++) /* a key/value cache: the caller's, like the inputs */
        if (p->values[v].kind == EBB_VALUE_STATE)
            bit_set(keep, v);
    /* Outputs are live at the exit, so no edge frees the value they end with;
     * a slot that is rewritten before the end (a loop state that is also the
     * output) may still drop its earlier values. */
    for (int i = 0; i < p->n_outputs; i++)
        bit_set(&live[(size_t)n * words], p->outputs[i]);
    /* backward iteration to a fixed point */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = n - 1; i >= 0; i--) {
            const plan_step *s = &p->steps[i];
            word *in = &live[(size_t)i * words];
            int fall, jump;
            successors(p, i, &fall, &jump);
            for (int w = 0; w < words; w++) {
                word out = live[(size_t)fall * words + w];
                if (jump >= 0)
                    out |= live[(size_t)jump * words + w];
                word def = 0, use = 0;
                for (int k = 0; k < s->pub.n_out; k++)
                    if (s->pub.out[k] / WBITS == w)
                        def |= (word)1 << (s->pub.out[k] % WBITS);
                for (int k = 0; k < s->pub.n_in; k++)
                    if (s->pub.in[k] / WBITS == w)
                        use |= (word)1 << (s->pub.in[k] % WBITS);
                word nw = use | (out & ~def);
                if (nw != in[w]) {
                    in[w] = nw;
                    changed = 1;
                }
            }
        }
    }
    /* Which slots may hold a value on entry to each step: a forward dataflow
     * (union over incoming edges) from the inputs. A slot no path has
     * written yet is never freed: a training plan's backward of a branch
     * that may have been skipped makes such slots live on paths the run
     * never takes. */
    word *wr = calloc((size_t)(n + 1) * (size_t)words, sizeof *wr);
    if (!wr) {
        free(live);
        free(keep);
        free(list);
        return ebb_compiler_oom(c);
    }
    for (int w = 0; w < words; w++)
        wr[w] = keep[w];
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < n; i++) {
            const plan_step *s = &p->steps[i];
            int fall, jump;
            successors(p, i, &fall, &jump);
            for (int e = 0; e < 2; e++) {
                int t = e == 0 ? fall : jump;
                if (t < 0)
                    continue;
                int writes = !(e == 1 && s->pub.kind == EBB_STEP_ENTER);
                for (int w = 0; w < words; w++) {
                    word out = wr[(size_t)i * words + w];
                    for (int k = 0; writes && k < s->pub.n_out; k++)
                        if (s->pub.out[k] / WBITS == w)
                            out |= (word)1 << (s->pub.out[k] % WBITS);
                    word *to = &wr[(size_t)t * words + w];
                    if ((*to | out) != *to) {
                        *to |= out;
                        changed = 1;
                    }
                }
            }
        }
    }
    /* frees on an edge i -> t: (live_in(i) | def(i)) & ~live_in(t), minus
     * the caller's inputs, and only what may have been written. keep_all:
     * nothing. */
    for (int i = 0; i < n && !p->keep_all; i++) {
        plan_step *s = &p->steps[i];
        int fall, jump;
        successors(p, i, &fall, &jump);
        for (int e = 0; e < 2; e++) {
            int t = e == 0 ? fall : jump;
            if (t < 0)
                continue;
            int count = 0;
            for (int v = 0; v < nv; v++) {
                int here = bit_get(&live[(size_t)i * words], v) && bit_get(&wr[(size_t)i * words], v);
                /* an enter that jumps (its branch got no rows) writes nothing */
                int writes = !(e == 1 && s->pub.kind == EBB_STEP_ENTER);
                for (int k = 0; !here && writes && k < s->pub.n_out; k++)
                    here = s->pub.out[k] == v;
                if (here && !bit_get(&live[(size_t)t * words], v) && !bit_get(keep, v))
                    list[count++] = v;
            }
            int *copy = ebb_compiler_dup_ints(list, count);
            if (count && !copy) {
                free(wr);
                free(live);
                free(keep);
                free(list);
                return ebb_compiler_oom(c);
            }
            if (e == 0) {
                s->pub.frees = copy;
                s->pub.n_frees = count;
            } else {
                s->pub.jump_frees = copy;
                s->pub.n_jump_frees = count;
            }
        }
    }
    free(wr);
    free(live);
    free(keep);
    free(list);
    return 0;
}

/* ---- in-place steps ---------------------------------------------------- */

/* Whether step s may write its output into input slot x: x dies at s and
 * owns its storage outright (made by a step, not a view or alias of
 * anything, looked at by no other value, written by no other step). The
 * executor re-checks at run time that nothing else holds the storage. */
static int may_overwrite(const ebb_plan *p, const plan_step *s, int x) {
    int y = s->pub.out[0];
    const ebb_plan_value *xv = &p->values[x], *yv = &p->values[y];
    if (xv->kind != EBB_VALUE_INTERMEDIATE || xv->alias_of >= 0 || xv->nbytes <= 0 ||
        yv->alias_of >= 0 || yv->dtype != xv->dtype || !ebb_shape_equal(&yv->shape, &xv->shape))
        return 0;
    int dies = 0;
    for (int k = 0; k < s->pub.n_frees; k++)
        dies |= s->pub.frees[k] == x;
    if (!dies)
        return 0;
    for (int v = 0; v < p->n_values; v++)
        if (v != y && p->values[v].alias_of == x)
            return 0;
    /* the slot must not be written again elsewhere (loop state, accumulator) */
    for (int j = 0; j < p->n_steps; j++)
        for (int k = 0; k < p->steps[j].pub.n_out; k++)
            if (j != xv->producer && p->steps[j].pub.out[k] == x)
                return 0;
    return 1;
}

/* Elementwise ops with an in-place form, and gradient sums, overwrite an
 * input that dies at the step. A sum may take either addend: the second is
 * swapped to the front when only it can be overwritten. */
void ebb_pass_in_place(compiler *c) {
    ebb_plan *p = c->plan;
    if (p->keep_all)
        return;
    for (int i = 0; i < p->n_steps; i++) {
        plan_step *s = &p->steps[i];
        int x;
        if (s->pub.kind == EBB_STEP_OP && s->op->forward_inplace && s->pub.n_in == 1 && !s->train &&
            s->pub.n_out == 1) {
            x = s->pub.in[0];
            if (!may_overwrite(p, s, x))
                continue;
        } else if (s->pub.kind == EBB_STEP_ACCUM && s->pub.in[0] != s->pub.in[1]) {
            int *in = (int *)s->pub.in;
            if (!may_overwrite(p, s, in[0])) {
                if (!may_overwrite(p, s, in[1]))
                    continue;
                int t = in[0];
                in[0] = in[1];
                in[1] = t;
            }
            x = in[0];
        } else {
            continue;
        }
        s->pub.in_place = 1;
        p->values[s->pub.out[0]].alias_of = x;
        p->values[s->pub.out[0]].nbytes = 0;
    }
}
