/* Graphviz DOT for graphs (what the user declared) and plans (what runs).
 *
 * Graph view: op nodes are boxes; split fans out and merge fans in; gate and
 * switch are diamonds with each branch in a cluster; a loop body is a cluster
 * with a dashed back edge; `using` reads are dashed edges from the tagged
 * value. Plan view: one node per step, top to bottom in step order, data
 * edges labelled with value, shape and bytes, fill by predicted live bytes,
 * the peak step outlined. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_internal.h"

/* DOT strings use the same escapes as JSON for what we emit. */
static void q(FILE *f, const char *s) { ebb_json_string(f, s); }

/* ---- graph view ------------------------------------------------------------ */

typedef struct tagmap {
    const char *name[256];
    int id[256];
    int n;
    const struct tagmap *parent;
} tagmap;

typedef struct dotctx {
    FILE *f;
    FILE *edges; /* edges go after every node: an edge written inside a
                    cluster would pull both its ends into that cluster */
    int next_id;
    int next_cluster;
} dotctx;

static int tag_find(const tagmap *t, const char *name) {
    for (; t; t = t->parent)
        for (int i = t->n - 1; i >= 0; i--)
            if (strcmp(t->name[i], name) == 0)
                return t->id[i];
    return -1;
}

static int new_node(dotctx *c, const char *shape, const char *label, const char *extra) {
    int id = c->next_id++;
    fprintf(c->f, "  n%d [shape=%s, label=", id, shape);
    q(c->f, label);
    fprintf(c->f, "%s%s];\n", extra ? ", " : "", extra ? extra : "");
    return id;
}

static void edge(dotctx *c, int a, int b, const char *attrs) {
    if (a < 0 || b < 0)
        return;
    fprintf(c->edges, "  n%d -> n%d%s%s%s;\n", a, b, attrs ? " [" : "", attrs ? attrs : "",
            attrs ? "]" : "");
}

static int dot_flow(dotctx *c, const ebb_graph *g, const char *prefix, tagmap *tags, int stream);

/* Draws a node fed by `in`; returns the id of the node holding its result. */
static int dot_node(dotctx *c, const ebb_node *n, const char *path, tagmap *tags, int in) {
    char label[256];
    switch (n->kind) {
    case NODE_OP: {
        snprintf(label, sizeof label, "%s\n%s", n->op->name, n->name ? n->name : path);
        int id = new_node(c, "box", label, "style=rounded");
        edge(c, in, id, NULL);
        return id;
    }
    case NODE_SEQ: {
        int cur = in;
        for (int j = 0; j < n->n_children; j++) {
            char cp[256];
            snprintf(cp, sizeof cp, "%s.%d", path, j);
            cur = dot_node(c, n->children[j], cp, tags, cur);
        }
        return cur;
    }
    case NODE_GRAPH:
    case NODE_SUBFLOW: {
        fprintf(c->f, "  subgraph cluster_%d {\n  label=", c->next_cluster++);
        q(c->f, n->kind == NODE_GRAPH ? n->graph->name : (n->name ? n->name : path));
        fputs(";\n  style=dashed;\n", c->f);
        tagmap inner = {.parent = n->kind == NODE_SUBFLOW ? tags : NULL};
        int out = dot_flow(c, n->graph, n->name ? n->name : path, &inner, in);
        fputs("  }\n", c->f);
        return out;
    }
    }
    return in;
}

static void cluster_open(dotctx *c, const char *label) {
    fprintf(c->f, "  subgraph cluster_%d {\n  label=", c->next_cluster++);
    q(c->f, label);
    fputs(";\n", c->f);
}

static int dot_flow(dotctx *c, const ebb_graph *g, const char *prefix, tagmap *tags, int stream) {
    int open[256], n_open = stream >= 0 ? 1 : 0;
    open[0] = stream;
    for (int i = 0; i < g->n_steps; i++) {
        const graph_step *st = &g->steps[i];
        char sp[256], label[256];
        snprintf(sp, sizeof sp, "%s.%d", prefix, i);
        int x = open[0], out = x;
        switch (st->kind) {
        case STEP_FROM:
        case STEP_THROUGH: {
            int src = st->kind == STEP_FROM ? tag_find(tags, g->inputs.items[0]) : x;
            out = dot_node(c, st->node, sp, tags, src);
            for (int u = 0; u < st->using_tags.n; u++) {
                snprintf(label, sizeof label, "label=\"using %s\", style=dashed",
                         st->using_tags.items[u]);
                /* the edge goes to the first node the step created */
                edge(c, tag_find(tags, st->using_tags.items[u]), out, label);
            }
            break;
        }
        case STEP_ALSO: {
            char np[512];
            snprintf(np, sizeof np, "%s.also", sp);
            int y = dot_node(c, st->node, np, tags, x);
            out = new_node(c, "circle", "+", "width=0.3");
            edge(c, y, out, NULL);
            edge(c, x, out, "style=bold, label=\"residual\"");
            break;
        }
        case STEP_SPLIT:
            for (int j = 0; j < st->n_nodes; j++) {
                char np[512];
                snprintf(np, sizeof np, "%s.split.%d", sp, j);
                open[j] = dot_node(c, st->nodes[j], np, tags, x);
            }
            n_open = st->n_nodes;
            out = open[0];
            break;
        case STEP_MERGE: {
            static const char *names[] = {"add", "mean", "mul", "max", "cat", "stack"};
            if (st->merge == EBB_MERGE_CAT || st->merge == EBB_MERGE_STACK)
                snprintf(label, sizeof label, "merge %s(%lld)", names[st->merge], (long long)st->dim);
            else
                snprintf(label, sizeof label, "merge %s", names[st->merge]);
            out = new_node(c, "invtrapezium", label, NULL);
            for (int j = 0; j < n_open; j++)
                edge(c, open[j], out, NULL);
            n_open = 1;
            break;
        }
        case STEP_GATE:
        case STEP_SWITCH: {
            int is_gate = st->kind == STEP_GATE;
            char np[512];
            snprintf(np, sizeof np, "%s.%s.%s", sp, is_gate ? "gate" : "switch",
                     is_gate ? "router" : "selector");
            int r = dot_node(c, st->aux, np, tags, x);
            if (is_gate && st->top_k)
                snprintf(label, sizeof label, "gate top-%d", st->top_k);
            else
                snprintf(label, sizeof label, "%s", is_gate ? "gate" : "switch");
            int d = new_node(c, "diamond", label, NULL);
            edge(c, r, d, NULL);
            edge(c, x, d, NULL);
            out = new_node(c, "invtriangle", is_gate ? "weighted sum" : "scatter rows", NULL);
            for (int j = 0; j < st->n_nodes; j++) {
                snprintf(np, sizeof np, "%s.%s.%d", sp, is_gate ? "gate" : "switch", j);
                snprintf(label, sizeof label, "%s %d", is_gate ? "expert" : "branch", j);
                cluster_open(c, label);
                int y = dot_node(c, st->nodes[j], np, tags, d);
                fputs("  }\n", c->f);
                edge(c, y, out, NULL);
            }
            break;
        }
        case STEP_LOOP: {
            static const char *kinds[] = {"for", "while", "until"};
            snprintf(label, sizeof label, "loop %s %s %lld", kinds[st->loop],
                     st->loop == LOOP_FOR ? "times" : "max", (long long)st->count);
            cluster_open(c, label);
            int head = new_node(c, "point", "", NULL);
            edge(c, x, head, NULL);
            char np[512];
            int from = head, test = -1;
            if (st->loop == LOOP_WHILE) { /* tested before each iteration */
                snprintf(np, sizeof np, "%s.loop.cond", sp);
                int cond = dot_node(c, st->aux, np, tags, head);
                test = from = new_node(c, "diamond", "while", NULL);
                edge(c, cond, test, NULL);
            }
            snprintf(np, sizeof np, "%s.loop.body", sp);
            int y = dot_node(c, st->node, np, tags, from);
            if (st->loop == LOOP_UNTIL) { /* tested after each iteration */
                snprintf(np, sizeof np, "%s.loop.cond", sp);
                int cond = dot_node(c, st->aux, np, tags, y);
                test = new_node(c, "diamond", "until", NULL);
                edge(c, cond, test, NULL);
            }
            edge(c, test >= 0 && st->loop == LOOP_UNTIL ? test : y, head,
                 "style=dashed, label=\"next\", constraint=false");
            fputs("  }\n", c->f);
            out = y;
            break;
        }
        case STEP_TAG: {
            snprintf(label, sizeof label, "tag %s", st->tag);
            int t = new_node(c, "note", label, "fontsize=10");
            edge(c, x, t, "arrowhead=none, style=dotted");
            if (tags->n < 256) {
                tags->name[tags->n] = st->tag;
                tags->id[tags->n++] = x;
            }
            break;
        }
        }
        if (st->kind != STEP_SPLIT)
            open[0] = out;
    }
    return open[0];
}

void ebb_graph_write_dot(const ebb_graph *g, FILE *f) {
    if (!g || !f)
        return;
    char *edges = NULL;
    size_t edges_len = 0;
    dotctx c = {.f = f, .edges = open_memstream(&edges, &edges_len)};
    if (!c.edges)
        return;
    fputs("digraph ", f);
    q(f, g->name);
    fputs(" {\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=11];\n", f);
    tagmap tags = {0};
    for (int i = 0; i < g->inputs.n && i < 256; i++) {
        int id = new_node(&c, "ellipse", g->inputs.items[i], "style=filled, fillcolor=\"#dde8f5\"");
        tags.name[tags.n] = g->inputs.items[i];
        tags.id[tags.n++] = id;
    }
    int y = dot_flow(&c, g, "flow", &tags, -1);
    int out = new_node(&c, "ellipse", g->final_name, "style=filled, fillcolor=\"#e3f2d9\"");
    edge(&c, y, out, NULL);
    for (int i = 0; i < g->outputs.n; i++) {
        int o = new_node(&c, "ellipse", g->outputs.items[i], "style=filled, fillcolor=\"#e3f2d9\"");
        edge(&c, tag_find(&tags, g->outputs.items[i]), o, NULL);
    }
    fclose(c.edges);
    fwrite(edges, 1, edges_len, f);
    free(edges);
    fputs("}\n", f);
}

/* ---- plan view ---------------------------------------------------------------- */

void ebb_plan_write_dot(const ebb_plan *p, FILE *f) {
    if (!p || !f)
        return;
    fputs("digraph ", f);
    q(f, p->name);
    fputs(" {\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10, shape=box, "
          "style=\"rounded,filled\"];\n  edge [fontname=\"Helvetica\", fontsize=9];\n",
          f);
    char id[64], sb[96], hb[32];
    for (int i = 0; i < p->n_inputs; i++) {
        fprintf(f, "  v%d [shape=ellipse, fillcolor=\"#dde8f5\", label=", p->inputs[i]);
        q(f, p->values[p->inputs[i]].name);
        fputs("];\n", f);
    }
    int64_t peak = p->peak_bytes > 0 ? p->peak_bytes : 1;
    for (int i = 0; i < p->n_steps; i++) {
        const ebb_plan_step *s = &p->steps[i].pub;
        char label[1024];
        size_t at = (size_t)snprintf(label, sizeof label, "%d: %s\n%s", i, s->op, s->node);
        ebb_bytes_str(s->live_bytes, hb, sizeof hb);
        at += (size_t)snprintf(label + at, sizeof label - at, "\nlive %s", hb);
        if (s->n_frees && at < sizeof label) {
            at += (size_t)snprintf(label + at, sizeof label - at, "\nfrees");
            for (int k = 0; k < s->n_frees && at < sizeof label; k++) {
                ebb_plan_value_id(p, s->frees[k], id, sizeof id);
                at += (size_t)snprintf(label + at, sizeof label - at, " %s", id);
            }
        }
        /* heat: white at 0 bytes to saturated orange at the peak */
        double heat = (double)s->peak_bytes / (double)peak;
        if (heat > 1)
            heat = 1;
        fprintf(f, "  s%d [label=", i);
        q(f, label);
        fprintf(f, ", fillcolor=\"0.08 %.3f 1.0\"", 0.85 * heat);
        if (i == p->peak_step)
            fputs(", color=red, penwidth=3, xlabel=\"peak\"", f);
        if (s->kind != EBB_STEP_OP)
            fputs(", shape=diamond", f);
        fputs("];\n", f);
    }
    /* keep step order top to bottom */
    for (int i = 0; i + 1 < p->n_steps; i++)
        fprintf(f, "  s%d -> s%d [style=invis, weight=10];\n", i, i + 1);
    for (int i = 0; i < p->n_steps; i++) {
        const ebb_plan_step *s = &p->steps[i].pub;
        for (int k = 0; k < s->n_in; k++) {
            int v = s->in[k];
            const ebb_plan_value *val = &p->values[v];
            ebb_plan_value_id(p, v, id, sizeof id);
            ebb_shape_str(&val->shape, sb, sizeof sb);
            ebb_bytes_str(val->nbytes, hb, sizeof hb);
            if (val->producer < 0)
                fprintf(f, "  v%d -> s%d [label=\"%s %s\"];\n", v, i, id, sb);
            else
                fprintf(f, "  s%d -> s%d [label=\"%s %s %s\"];\n", val->producer, i, id, sb, hb);
        }
        if (s->jump >= 0)
            fprintf(f, "  s%d -> s%d [style=dashed, color=gray40, label=\"jump\", constraint=false];\n",
                    i, s->jump);
    }
    for (int i = 0; i < p->n_outputs; i++) {
        int v = p->outputs[i];
        fprintf(f, "  out%d [shape=ellipse, fillcolor=\"#e3f2d9\", label=", i);
        q(f, p->output_names[i]);
        fputs("];\n", f);
        if (p->values[v].producer >= 0)
            fprintf(f, "  s%d -> out%d;\n", p->values[v].producer, i);
        else
            fprintf(f, "  v%d -> out%d;\n", v, i);
    }
    fputs("}\n", f);
}
