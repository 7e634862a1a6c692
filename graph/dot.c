/* Graphviz DOT for graphs (what the user declared) and plans (what runs).
 *
 * Graph view: op nodes are boxes; split fans out and merge fans in; gate and
 * switch are diamonds with each branch in a cluster; a loop body is a cluster
 * with a dashed back edge; `using` reads are dashed edges from the tagged
 * value. Plan view: one node per step, in columns of steps read top to
 * bottom, each naming the value it makes and its live bytes, fill by
 * predicted bytes, the peak step outlined with the peak figure; edges only
 * between nearby steps, farther reads named on the reader. */
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
    ebb_node_label_fn label; /* names op nodes where it gives a label */
    void *user;
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
        const char *l = !n->name && c->label ? c->label(c->user, path) : NULL;
        snprintf(label, sizeof label, "%s\n%s", n->op->name, n->name ? n->name : l ? l : path);
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
            if (st->node) {
                char np[512];
                snprintf(np, sizeof np, "%s.merge", sp);
                out = dot_node(c, st->node, np, tags, open[0]);
                for (int j = 1; j < n_open; j++)
                    edge(c, open[j], out, NULL);
                n_open = 1;
                break;
            }
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

void ebb_graph_write_dot(const ebb_graph *g, FILE *f,
                            const char *(*label)(void *user, const char *node), void *user) {
    if (!g || !f)
        return;
    char *edges = NULL;
    size_t edges_len = 0;
    dotctx c = {.f = f, .edges = open_memstream(&edges, &edges_len), .label = label,
                .user = user};
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

/* Steps run top to bottom in columns, left to right, so that a long plan is
 * a page rather than a strip. Each step names the value it makes, so edges
 * need only the value's id. An edge is drawn only from a producer at most
 * NEAR_STEPS above in the same column; a value read from further away (a
 * graph input, a routing table, a residual, a tag read far below) is named
 * in its reader's label instead ("reads v3 from 2"), so no edge crosses
 * the drawing. */
#define NEAR_STEPS 2
#define COLUMN_STEPS 10 /* at most, before another column */

static int plan_rows(int n) {
    int cols = (n + COLUMN_STEPS - 1) / COLUMN_STEPS;
    if (cols < 1)
        cols = 1;
    return n > 0 ? (n + cols - 1) / cols : 1;
}

/* Appends to label[*at..size) without overrunning it. */
static void label_add(char *label, size_t size, size_t *at, const char *fmt, const char *a,
                      int b) {
    if (*at >= size)
        return;
    int n = snprintf(label + *at, size - *at, fmt, a, b);
    *at += n > 0 ? (size_t)n : 0;
}

/* Whether step i reads slot v from near enough to draw the edge. */
static int near_read(const ebb_plan *p, int rows, int v, int i) {
    int prod = p->values[v].producer;
    if (prod < 0) /* a graph input, drawn above the first column */
        return i / rows == 0 && i < NEAR_STEPS;
    return prod / rows == i / rows && i - prod <= NEAR_STEPS && i > prod;
}

/* Step i's node: its op, node, the value it makes, its live bytes and
 * frees, the far reads it names rather than draws, its jump; shaded by its
 * peak against the plan's (`peak`; `pb` its text). */
static void dot_step(const ebb_plan *p, FILE *f, int i, int rows, const char *pb, int64_t peak,
                     ebb_node_label_fn node_label, void *user) {
    char id[64], sb[96], hb[32], label[1024];
    const ebb_plan_step *s = &p->steps[i].pub;
    size_t at = 0;
    label_add(label, sizeof label, &at, "%s%d: ", "", i);
    label_add(label, sizeof label, &at, "%s", s->op, 0);
    const char *named = node_label ? node_label(user, s->node) : NULL;
    if (named)
        label_add(label, sizeof label, &at, "\n%s", named, 0);
    else if (strcmp(s->node, s->op))
        label_add(label, sizeof label, &at, "\n%s", s->node, 0);
    /* the value it makes */
    if (s->n_out > 0) {
        int v = s->out[s->kind == EBB_STEP_ENTER ? 1 : 0];
        const ebb_plan_value *val = &p->values[v];
        ebb_plan_value_id(p, v, id, sizeof id);
        ebb_shape_str(&val->shape, sb, sizeof sb);
        label_add(label, sizeof label, &at, "\n%s ", id, 0);
        label_add(label, sizeof label, &at, "%s", sb, 0);
        if (val->nbytes > 0)
            label_add(label, sizeof label, &at, " %s",
                      ebb_bytes_str(val->nbytes, hb, sizeof hb), 0);
        else if (s->in_place)
            label_add(label, sizeof label, &at, "%s", " in place", 0);
        else if (val->alias_of >= 0)
            label_add(label, sizeof label, &at, "%s", " view", 0);
    }
    ebb_bytes_str(s->live_bytes, hb, sizeof hb);
    if (i == p->peak_step) {
        label_add(label, sizeof label, &at, "\npeak %s", pb, 0);
        label_add(label, sizeof label, &at, ", live %s after", hb, 0);
    } else {
        label_add(label, sizeof label, &at, "\nlive %s", hb, 0);
    }
    for (int k = 0; k < s->n_frees; k++) {
        ebb_plan_value_id(p, s->frees[k], id, sizeof id);
        label_add(label, sizeof label, &at, k == 0 ? "\nfrees %s" : k % 5 ? " %s" : "\n%s", id,
                  0);
    }
    /* the far reads, named rather than drawn */
    int far = 0;
    for (int k = 0; k < s->n_in; k++) {
        int v = s->in[k], dup = 0;
        for (int j = 0; j < k; j++)
            dup |= s->in[j] == v;
        if (dup || near_read(p, rows, v, i))
            continue;
        ebb_plan_value_id(p, v, id, sizeof id);
        const char *fmt = far == 0 ? "\nreads %s" : far % 2 ? ", %s" : ",\n%s";
        label_add(label, sizeof label, &at, fmt, id, 0);
        if (p->values[v].producer >= 0)
            label_add(label, sizeof label, &at, "%s from %d", "", p->values[v].producer);
        far++;
    }
    if (s->jump >= 0)
        label_add(label, sizeof label, &at, "%sjumps to %d", "\n", s->jump);
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
        fputs(", style=\"filled,diagonals\"", f);
    if (s->recompute) /* the trade a memory budget made: drawn apart */
        fputs(", style=\"rounded,filled,dashed\", color=\"#2b6cb0\", penwidth=2, "
              "fontcolor=\"#2b6cb0\"",
              f);
    fputs("];\n", f);
}

/* The near reads as edges, each labelled with the value it carries. */
static void dot_read_edges(const ebb_plan *p, FILE *f, int rows) {
    char id[64];
    for (int i = 0; i < p->n_steps; i++) {
        const ebb_plan_step *s = &p->steps[i].pub;
        for (int k = 0; k < s->n_in; k++) {
            int v = s->in[k], dup = 0;
            for (int j = 0; j < k; j++)
                dup |= s->in[j] == v;
            if (dup || !near_read(p, rows, v, i))
                continue;
            int prod = p->values[v].producer;
            ebb_plan_value_id(p, v, id, sizeof id);
            if (prod < 0)
                fprintf(f, "  v%d -> s%d [label=\"%s\"];\n", v, i, id);
            else
                fprintf(f, "  s%d -> s%d [label=\"%s\"%s];\n", prod, i, id,
                        i - prod > 1 ? ", constraint=false" : "");
        }
    }
}

void ebb_plan_write_dot(const ebb_plan *p, FILE *f, ebb_node_label_fn node_label, void *user) {
    if (!p || !f)
        return;
    int rows = plan_rows(p->n_steps);
    char sb[96], pb[32], label[1024];
    fputs("digraph ", f);
    q(f, p->name);
    ebb_bytes_str(p->peak_bytes, pb, sizeof pb);
    if (p->peak_step >= 0)
        snprintf(label, sizeof label, "plan %s: %d steps, %speak %s at step %d (%s)", p->name,
                 p->n_steps, p->peak_is_bound ? "upper bound of the " : "", pb, p->peak_step,
                 p->steps[p->peak_step].pub.node);
    else
        snprintf(label, sizeof label, "plan %s: %d steps", p->name, p->n_steps);
    fputs(" {\n  rankdir=TB;\n  newrank=true;\n  graph [fontname=\"Helvetica\", fontsize=14, "
          "labelloc=t, nodesep=0.25, ranksep=0.3, label=",
          f);
    q(f, label);
    fputs("];\n  node [fontname=\"Helvetica\", fontsize=11, shape=box, "
          "style=\"rounded,filled\", margin=\"0.1,0.04\"];\n  edge [fontname=\"Helvetica\", "
          "fontsize=9, color=gray35, arrowsize=0.6];\n",
          f);
    for (int i = 0; i < p->n_inputs; i++) {
        const ebb_plan_value *v = &p->values[p->inputs[i]];
        snprintf(label, sizeof label, "%s %s", v->name ? v->name : "?",
                 ebb_shape_str(&v->shape, sb, sizeof sb));
        fprintf(f, "  v%d [shape=ellipse, fillcolor=\"#dde8f5\", label=", p->inputs[i]);
        q(f, label);
        fputs("];\n", f);
    }
    int64_t peak = p->peak_bytes > 0 ? p->peak_bytes : 1;
    for (int i = 0; i < p->n_steps; i++)
        dot_step(p, f, i, rows, pb, peak, node_label, user);
    /* columns: steps chained top to bottom; rows: one rank, in column order */
    for (int i = 0; i + 1 < p->n_steps; i++)
        if ((i + 1) % rows)
            fprintf(f, "  s%d -> s%d [style=invis, weight=10];\n", i, i + 1);
    for (int r = 0; r < rows && r + rows < p->n_steps; r++) {
        fprintf(f, "  { rank=same; s%d", r);
        for (int i = r + rows; i < p->n_steps; i += rows)
            fprintf(f, " -> s%d", i);
        fputs(" [style=invis]; }\n", f);
    }
    /* inputs above the first column, drawn there even when read far away */
    for (int i = 0; i < p->n_inputs && p->n_steps > 0; i++) {
        int read_first = 0;
        for (int k = 0; k < p->steps[0].pub.n_in; k++)
            read_first |= p->steps[0].pub.in[k] == p->inputs[i];
        if (!read_first)
            fprintf(f, "  v%d -> s0 [style=invis];\n", p->inputs[i]);
    }
    dot_read_edges(p, f, rows);
    for (int i = 0; i < p->n_outputs; i++) {
        int v = p->outputs[i];
        snprintf(label, sizeof label, "%s %s", p->output_names[i],
                 ebb_shape_str(&p->values[v].shape, sb, sizeof sb));
        fprintf(f, "  out%d [shape=ellipse, fillcolor=\"#e3f2d9\", label=", i);
        q(f, label);
        fputs("];\n", f);
        /* from the step that writes it last (a loop's state is written again) */
        int last = -1;
        for (int j = 0; j < p->n_steps; j++)
            for (int k = 0; k < p->steps[j].pub.n_out; k++)
                if (p->steps[j].pub.out[k] == v)
                    last = j;
        if (last >= 0)
            fprintf(f, "  s%d -> out%d;\n", last, i);
        else
            fprintf(f, "  v%d -> out%d;\n", v, i);
    }
    fputs("}\n", f);
}
