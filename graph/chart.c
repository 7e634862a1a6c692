/* Memory lifetime charts: a plan's values as stacked bands over its steps,
 * written as SVG by hand (rectangles, paths and text; no drawing library).
 *
 * The bands come from one walk over the steps in listing order that counts
 * storage the way the predictor does (predict.c): each output that owns
 * storage opens a band; a view, an alias or an in-place output joins its
 * source's band; a band closes when the last slot holding its storage is
 * freed or written again. Column i is the state *during* step i: the bands
 * alive then, with the op's workspace on top, which is what the plan's
 * per-step peak counts, so on a straight-line plan the stack's outline is
 * the plan's own figure. Routed and looping plans also count storage that no
 * value names (row gathers, routing scratch, a loop's other iterations);
 * that difference is hatched between the stack and the plan's outline.
 *
 * Bands stack in order of birth, older below, as on an allocator's timeline:
 * a band slides down when one below it dies. A training step's saved
 * activations therefore lie at the bottom, crossing from the forward into
 * the backward.
 *
 * Mixed precision: a band whose storage is bfloat16 or float16 is hatched in
 * its own colour (the merged "other" area's low share too), and a line per
 * low dtype gives those bands' sum during each step: the same bands as the
 * stack, so on a straight-line plan the line is the plan's own count of the
 * bytes held in that dtype, to the byte (storage no value names, hatched
 * grey above the stack, has no dtype here). A float32 plan's chart has none
 * of it: not a byte of its SVG changes.
 *
 * Size: bands under a pixel merge into one "other" area past a few hundred
 * values or steps, and the lines and hover areas are drawn per pixel
 * column, so the file grows with the steps by a few hundred bytes each. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ebb/train.h"
#include "plan_internal.h"
#include "svg_write.h"

/* Past this many bands (or steps), bands too small to see merge into "other". */
#define MERGE_BANDS 300
#define MERGE_STEPS 300
#define MIN_BAND_H 1.0 /* px */
#define MIN_BAND_W 2.0 /* px */
/* Lines and hover areas are drawn per group of steps at least this wide. */
#define MIN_COLUMN_W 1.5 /* px */
/* Steps a hover area's tooltip lists before "and N more". */
#define TITLE_STEPS 8

/* Geometry, in px. */
#define LEFT 78.0
#define RIGHT 24.0
#define PLOT_H 360.0
#define MIN_PLOT_W 640.0
#define MAX_PLOT_W 1800.0
#define STEP_W 28.0

/* The low-precision dtypes the chart marks, in drawing order. */
#define N_LOW 2
static const ebb_dtype low_dtypes[N_LOW] = {EBB_BFLOAT16, EBB_FLOAT16};
/* Their band classes (hatched), line classes and pattern ids' stems. */
static const char *const low_cls[N_LOW] = {"lb", "lh"};
static const char *const low_line_cls[N_LOW] = {"lwb", "lwh"};
static const char *const low_key_cls[N_LOW] = {"oth lb key", "oth lh key"};

/* Index into low_dtypes + 1, or 0 for any other dtype. */
static int low_of(ebb_dtype dt) {
    for (int d = 0; d < N_LOW; d++)
        if (low_dtypes[d] == dt) return d + 1;
    return 0;
}

typedef struct band {
    int root; /* the slot whose storage it is */
    int64_t bytes;
    int birth, death; /* the steps it is live during, inclusive */
    int family;
    int refs;       /* slots holding it now */
    int last_read;  /* last step (listing order) reading any of its slots */
    int n_members;  /* slots that held it */
    int members[6]; /* the first few, for the tooltip */
    int held;       /* never freed: an output */
    int kept;       /* drawn on its own, else merged into "other" */
    int backward;   /* made by a loss, backward or update step */
    int saved;      /* made in the forward, freed in the backward */
    int alt;        /* every other band of a family is a shade lighter */
    int low;        /* its storage's dtype is low_dtypes[low - 1]; 0: another */
} band;

typedef struct family {
    const char *name; /* points into a step's op name */
    int len;          /* up to the first '.' ("linear.backward" is "linear") */
    int n_bands;
} family;

/* A change of a kept band's offset, at a column. */
typedef struct offset_at {
    int band, col;
    int64_t off;
} offset_at;

typedef struct chart {
    const ebb_plan *p;
    FILE *f;
    int n; /* steps */
    band *bands;
    int n_bands, cap_bands;
    family *fams;
    int n_fams;
    int *cls;                                   /* slot -> band, or -1 */
    int64_t *kept_sum, *other_sum, *ws, *stack; /* per step */
    int *count;                                 /* bands alive in each step */
    int n_other, n_over, any_saved;
    /* per low dtype: its bands' bytes alive during each step (all bands,
     * then those merged into "other"), and whether the plan has any */
    int64_t *low_sum[N_LOW], *other_low[N_LOW], *low_base;
    int any_low[N_LOW], any_low_other[N_LOW];
    int64_t low_fams[N_LOW]; /* palette colours with a hatched band, a bit each */
    /* geometry */
    double top, plot_w, dx, scale; /* y of the plot's top; px per step; px per byte */
    int64_t ymax;
    int x_decimals;
    int bin; /* steps per drawn column of lines and hover areas */
    /* the trace, per step: the largest figures over its executions */
    const ebb_chart_trace *trace;
    int64_t *m_live, *m_peak;
    unsigned char *seen;
    ebb_node_label_fn label; /* a step's name beside its node path, or NULL */
    void *user;
    int oom;
} chart;

/* ---- writing (escaping, numbers and text: svg_write.h) ------------------------ */

static double xs(const chart *c, int col) {
    return LEFT + c->dx * col;
}
static double ys(const chart *c, int64_t bytes) {
    return c->top + PLOT_H - c->scale * (double)bytes;
}
static void put_x(const chart *c, int col) {
    num(c->f, xs(c, col), c->x_decimals);
}
static void put_y(const chart *c, int64_t bytes) {
    num(c->f, ys(c, bytes), 1);
}
static void put_xy(const chart *c, char cmd, int col, int64_t bytes) {
    fputc(cmd, c->f);
    put_x(c, col);
    fputc(' ', c->f);
    put_y(c, bytes);
}

static const char *bytes_text(int64_t n, char *buf, size_t size) {
    return ebb_bytes_str(n, buf, size);
}

/* ---- the walk ------------------------------------------------------------------- */

static int family_of(chart *c, const char *op) {
    int len = (int)(strchr(op, '.') ? strchr(op, '.') - op : (long)strlen(op));
    for (int i = 0; i < c->n_fams; i++)
        if (c->fams[i].len == len && !strncmp(c->fams[i].name, op, (size_t)len)) return i;
    c->fams[c->n_fams] = (family){op, len, 0};
    return c->n_fams++;
}

static int new_band(chart *c, int slot, int step) {
    if (c->n_bands == c->cap_bands) {
        int cap = c->cap_bands ? 2 * c->cap_bands : 64;
        band *b = realloc(c->bands, (size_t)cap * sizeof *b);
        if (!b) {
            c->oom = 1;
            return -1;
        }
        c->bands = b;
        c->cap_bands = cap;
    }
    const ebb_plan_step *s = &c->p->steps[step].pub;
    band *b = &c->bands[c->n_bands];
    memset(b, 0, sizeof *b);
    b->root = slot;
    b->bytes = c->p->values[slot].nbytes;
    b->birth = step;
    b->death = -1;
    b->last_read = step;
    b->family = family_of(c, s->op);
    b->alt = c->fams[b->family].n_bands++ & 1;
    b->backward = s->phase != EBB_PHASE_FORWARD;
    b->low = low_of(c->p->values[slot].dtype);
    return c->n_bands++;
}

/* Slot v now holds band `to` (-1: nothing); its old band closes at `step`
 * when v held it last. */
static void move_slot(chart *c, int v, int to, int step) {
    int from = c->cls[v];
    if (to == from) return;
    if (from >= 0 && --c->bands[from].refs == 0) c->bands[from].death = step;
    if (to >= 0) {
        band *b = &c->bands[to];
        b->refs++;
        int known = 0;
        for (int k = 0; k < b->n_members && k < 6; k++)
            known |= b->members[k] == v;
        if (!known) {
            if (b->n_members < 6) b->members[b->n_members] = v;
            b->n_members++;
        }
    }
    c->cls[v] = to;
}

/* The band a step's k-th output joins (the predictor's rules, less the
 * storage no value names). */
static int output_band(chart *c, int i, int k) {
    const ebb_plan_step *s = &c->p->steps[i].pub;
    int v = s->out[k];
    const ebb_plan_value *val = &c->p->values[v];
    switch (s->kind) {
    case EBB_STEP_ALIAS:
        return c->cls[s->in[0]];
    case EBB_STEP_ROUTE:
        if (k == 1) return -1; /* the accumulator starts empty; the first exit fills it */
        break;
    case EBB_STEP_EXIT:
        if (c->cls[v] >= 0) return c->cls[v];
        break;
    default:
        break;
    }
    if (val->alias_of >= 0) return c->cls[val->alias_of];
    return val->nbytes > 0 ? new_band(c, v, i) : -1;
}

static void walk(chart *c) {
    const ebb_plan *p = c->p;
    for (int v = 0; v < p->n_values; v++)
        c->cls[v] = -1;
    for (int i = 0; i < c->n && !c->oom; i++) {
        const ebb_plan_step *s = &p->steps[i].pub;
        for (int k = 0; k < s->n_in; k++)
            if (c->cls[s->in[k]] >= 0) c->bands[c->cls[s->in[k]]].last_read = i;
        for (int k = 0; k < s->n_out && !c->oom; k++) {
            int to = output_band(c, i, k);
            if (!c->oom) move_slot(c, s->out[k], to, i);
        }
        for (int k = 0; k < s->n_frees; k++)
            move_slot(c, s->frees[k], -1, i);
    }
    for (int b = 0; b < c->n_bands; b++) {
        band *bd = &c->bands[b];
        if (bd->death < 0) {
            bd->death = c->n - 1;
            bd->held = 1;
        }
        bd->saved = !bd->backward && p->steps[bd->death].pub.phase == EBB_PHASE_BACKWARD;
        c->any_saved |= bd->saved;
    }
}

/* ---- scale --------------------------------------------------------------------- */

/* The y axis: a top that is a whole number of ticks of 1, 2 or 5 times a
 * power of ten in binary units (B, KiB, MiB...), at most six ticks high. */
static int64_t tick_step(int64_t top, int64_t *axis_top) {
    if (top <= 0) top = 1;
    double unit = 1;
    while ((double)top / unit >= 1024 && unit < 1e18)
        unit *= 1024;
    double v = (double)top / unit, step = 1;
    static const double m[] = {1, 2, 5};
    for (double p10 = 1e-3, found = 0; !found; p10 *= 10)
        for (int k = 0; k < 3 && !found; k++)
            if (v / (m[k] * p10) <= 6) {
                step = m[k] * p10;
                found = 1;
            }
    int64_t st = (int64_t)llround(step * unit);
    if (st < 1) st = 1;
    *axis_top = (top + st - 1) / st * st;
    return st;
}

/* The steps drawn as drawn column b (of `bin` steps each). */
static int bin_first(const chart *c, int b) {
    return b * c->bin;
}
static int bin_end(const chart *c, int b) {
    int e = (b + 1) * c->bin;
    return e < c->n ? e : c->n;
}
static int n_bins(const chart *c) {
    return (c->n + c->bin - 1) / c->bin;
}

/* The largest of a[] over bin b's steps (those the trace saw, when `seen`);
 * 0 with *any 0 when none. */
static int64_t bin_max(const chart *c, const int64_t *a, int b, const unsigned char *seen,
                       int *any) {
    int64_t m = 0;
    *any = 0;
    for (int i = bin_first(c, b); i < bin_end(c, b); i++)
        if (!seen || seen[i]) {
            m = !*any || a[i] > m ? a[i] : m;
            *any = 1;
        }
    return m;
}

/* ---- drawing ------------------------------------------------------------------- */

static const char *const palette[] = {
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#86bcb6", "#d4a6c8", "#a0cbe8", "#8cd17d", "#f1ce63", "#ffbe7d", "#bab0ac",
};
#define N_PALETTE (int)(sizeof palette / sizeof palette[0])

static const char *const phase_names[] = {"forward", "loss", "backward", "update"};
static const char *const phase_fill[] = {"#eef3fa", "#fcf1df", "#f2edf8", "#e9f5e8"};

static void step_text(const chart *c, int i, char *buf, size_t size) {
    const ebb_plan_step *s = &c->p->steps[i].pub;
    const char *l = c->label ? c->label(c->user, s->node) : NULL;
    if (l)
        snprintf(buf, size, "step %d (%s %s, %s)", i, s->op, l, s->node);
    else
        snprintf(buf, size, "step %d (%s %s)", i, s->op, s->node);
}

static void band_title(const chart *c, const band *b) {
    FILE *f = c->f;
    const ebb_plan_value *val = &c->p->values[b->root];
    char id[96], sb[96], hb[32], st[320];
    ebb_plan_value_id(c->p, b->root, id, sizeof id);
    fputs("<title>", f);
    xml_text(f, id);
    if (val->name && val->kind != EBB_VALUE_INPUT) {
        fputs(" (tag ", f);
        xml_text(f, val->name);
        fputc(')', f);
    }
    fprintf(f, " %s %s, %s (%lld bytes)\n", ebb_shape_str(&val->shape, sb, sizeof sb),
            ebb_dtype_name(val->dtype), bytes_text(b->bytes, hb, sizeof hb), (long long)b->bytes);
    step_text(c, b->birth, st, sizeof st);
    fputs("made by ", f);
    xml_text(f, st);
    step_text(c, b->last_read, st, sizeof st);
    fputs("\nlast read by ", f);
    xml_text(f, st);
    if (b->held)
        fputs(c->p->keep_all ? "\nheld to the end (keep_all)" : "\nheld to the end (an output)", f);
    else
        fprintf(f, "\nfreed after step %d", b->death);
    if (b->saved) fputs("\nsaved for the backward", f);
    if (b->n_members > 1) {
        fputs("\nshared by", f);
        for (int k = 0; k < b->n_members && k < 6; k++) {
            int v = b->members[k];
            if (v == b->root) continue;
            ebb_plan_value_id(c->p, v, id, sizeof id);
            fputc(' ', f);
            xml_text(f, id);
            int prod = c->p->values[v].producer;
            if (prod >= 0 && c->p->steps[prod].pub.in_place && c->p->values[v].alias_of >= 0)
                fputs(" (in place)", f);
            else if (c->p->values[v].alias_of >= 0)
                fputs(" (view)", f);
        }
        if (b->n_members > 6) fprintf(f, " and %d more", b->n_members - 6);
    }
    fputs("</title>", f);
}

static int cmp_offset(const void *a, const void *b) {
    const offset_at *x = a, *y = b;
    if (x->band != y->band) return x->band < y->band ? -1 : 1;
    return (x->col > y->col) - (x->col < y->col);
}

/* The kept bands, one path each: along the bottom edge left to right, up,
 * and back along the top edge. */
static void draw_bands(chart *c) {
    FILE *f = c->f;
    size_t cap = 256, n_off = 0;
    size_t nb = (size_t)(c->n_bands ? c->n_bands : 1);
    offset_at *offs = malloc(cap * sizeof *offs);
    int *active = malloc(nb * sizeof *active);
    int64_t *last = malloc(nb * sizeof *last);
    if (!offs || !active || !last) {
        c->oom = 1;
        goto out;
    }
    int n_active = 0, next = 0;
    for (int col = 0; col < c->n; col++) {
        int w = 0;
        for (int k = 0; k < n_active; k++)
            if (c->bands[active[k]].death >= col) active[w++] = active[k];
        n_active = w;
        for (; next < c->n_bands && c->bands[next].birth <= col; next++)
            if (c->bands[next].kept) active[n_active++] = next;
        int64_t off = 0;
        for (int k = 0; k < n_active; k++) {
            int b = active[k];
            if (c->bands[b].birth == col || last[b] != off) {
                if (n_off == cap) {
                    offset_at *o = realloc(offs, 2 * cap * sizeof *offs);
                    if (!o) {
                        c->oom = 1;
                        goto out;
                    }
                    offs = o;
                    cap *= 2;
                }
                offs[n_off++] = (offset_at){b, col, off};
                last[b] = off;
            }
            off += c->bands[b].bytes;
        }
    }
    qsort(offs, n_off, sizeof *offs, cmp_offset);
    /* white seams between bands, where bands are wide enough to show them */
    fprintf(f, "<g id=\"bands\"%s>\n", c->dx >= 4 ? " class=\"seams\"" : "");
    for (size_t a = 0; a < n_off;) {
        size_t e = a;
        while (e < n_off && offs[e].band == offs[a].band)
            e++;
        const band *b = &c->bands[offs[a].band];
        fprintf(f, "<path class=\"b f%d%s%s%s%s%s\" data-value=\"v%d\" data-bytes=\"%lld\" d=\"",
                b->family % N_PALETTE, b->low ? " " : "", b->low ? low_cls[b->low - 1] : "",
                b->alt ? " a" : "", b->backward ? " g" : "", b->saved ? " s" : "", b->root,
                (long long)b->bytes);
        put_xy(c, 'M', b->birth, offs[a].off);
        for (size_t k = a + 1; k < e; k++) {
            fputc('H', f);
            put_x(c, offs[k].col);
            fputc('V', f);
            put_y(c, offs[k].off);
        }
        fputc('H', f);
        put_x(c, b->death + 1);
        fputc('V', f);
        put_y(c, offs[e - 1].off + b->bytes);
        for (size_t k = e - 1; k > a; k--) {
            fputc('H', f);
            put_x(c, offs[k].col);
            fputc('V', f);
            put_y(c, offs[k - 1].off + b->bytes);
        }
        fputc('H', f);
        put_x(c, b->birth);
        fputs("Z\">", f);
        band_title(c, b);
        fputs("</path>\n", f);
        a = e;
    }
    fputs("</g>\n", f);
out:
    free(offs);
    free(active);
    free(last);
}

/* The area from base[i] to base[i] + h[i] over each step i, as one outline
 * (a path's d, without the closing Z). */
static void area(chart *c, const int64_t *base, const int64_t *h) {
    FILE *f = c->f;
    put_xy(c, 'M', 0, base[0]);
    for (int i = 0; i < c->n; i++) {
        if (i > 0 && base[i] != base[i - 1]) {
            fputc('V', f);
            put_y(c, base[i]);
        }
        fputc('H', f);
        put_x(c, i + 1);
    }
    fputc('V', f);
    put_y(c, base[c->n - 1] + h[c->n - 1]);
    for (int i = c->n - 1; i >= 0; i--) {
        fputc('H', f);
        put_x(c, i);
        if (i > 0 && base[i] + h[i] != base[i - 1] + h[i - 1]) {
            fputc('V', f);
            put_y(c, base[i - 1] + h[i - 1]);
        }
    }
}

/* "other": the merged bands' bytes on top of the kept ones, one path; the
 * share of a low dtype in it hatched, at its bottom. */
static void draw_other(chart *c) {
    if (!c->n_other) return;
    FILE *f = c->f;
    fprintf(f, "<path id=\"other\" class=\"oth\" data-values=\"%d\" d=\"", c->n_other);
    area(c, c->kept_sum, c->other_sum);
    fprintf(f,
            "Z\"><title>other: %d values too small to draw at this scale, merged</title></path>\n",
            c->n_other);
    int64_t *base = c->low_base;
    for (int i = 0; i < c->n; i++)
        base[i] = c->kept_sum[i];
    for (int d = 0; d < N_LOW; d++) {
        if (!c->any_low_other[d]) continue;
        const char *name = ebb_dtype_name(low_dtypes[d]);
        fprintf(f, "<path id=\"other-%s\" class=\"oth %s\" d=\"", name, low_cls[d]);
        area(c, base, c->other_low[d]);
        fprintf(f, "Z\"><title>other: the %s values among them</title></path>\n", name);
        for (int i = 0; i < c->n; i++)
            base[i] += c->other_low[d][i];
    }
}

static void draw_axes(chart *c, int64_t tick, double op_drop) {
    FILE *f = c->f;
    char hb[32], buf[32];
    fputs("<g id=\"axes\">\n", f);
    for (int64_t v = 0; v <= c->ymax; v += tick) {
        double y = ys(c, v);
        fputs("<path class=\"grid\" d=\"M", f);
        num(f, LEFT, 1);
        fputc(' ', f);
        num(f, y, 1);
        fputc('H', f);
        num(f, LEFT + c->plot_w, 1);
        fputs("\"/>\n", f);
        draw_text(f, LEFT - 6, y + 4, "text-anchor=\"end\"", bytes_text(v, hb, sizeof hb));
    }
    fputs("<path class=\"frame\" d=\"M", f);
    num(f, LEFT, 1);
    fputc(' ', f);
    num(f, c->top, 1);
    fputs("V", f);
    num(f, c->top + PLOT_H, 1);
    fputs("H", f);
    num(f, LEFT + c->plot_w, 1);
    fputs("\"/>\n", f);
    /* every k-th step, k = 1, 2, 5, 10, 20, ... keeping labels ~40 px apart */
    int k = 1;
    for (int m = 0; c->dx * k < 40 && k < 100000000; m++)
        k = m % 3 == 1 ? k / 2 * 5 : k * 2;
    for (int i = 0; i < c->n; i += k) {
        double x = xs(c, i) + c->dx / 2;
        fputs("<path class=\"frame\" d=\"M", f);
        num(f, x, 1);
        fputc(' ', f);
        num(f, c->top + PLOT_H, 1);
        fputs("v4\"/>\n", f);
        snprintf(buf, sizeof buf, "%d", i);
        draw_text(f, x, c->top + PLOT_H + 16, "text-anchor=\"middle\"", buf);
    }
    /* with room, each step's op under it */
    if (op_drop > 0)
        for (int i = 0; i < c->n; i++) {
            fputs("<text class=\"op\" transform=\"translate(", f);
            num(f, xs(c, i) + c->dx / 2 + 3, 1);
            fputc(' ', f);
            num(f, c->top + PLOT_H + 24, 1);
            fputs(") rotate(-55)\" text-anchor=\"end\">", f);
            xml_text(f, c->p->steps[i].pub.op);
            fputs("</text>\n", f);
        }
    draw_text(f, LEFT + c->plot_w / 2, c->top + PLOT_H + 36 + op_drop, "text-anchor=\"middle\"",
              "step");
    fputs("<text transform=\"translate(16 ", f);
    num(f, c->top + PLOT_H / 2, 1);
    fputs(") rotate(-90)\" text-anchor=\"middle\">live bytes</text>\n</g>\n", f);
}

static void step_line(const chart *c, int i) {
    FILE *f = c->f;
    const plan_step *ps = &c->p->steps[i];
    const ebb_plan_step *s = &ps->pub;
    char hb[32], pb[32];
    fprintf(f, "step %d: ", i);
    if (ps->pub.phase != EBB_PHASE_FORWARD) fprintf(f, "%s ", phase_names[s->phase & 3]);
    xml_text(f, s->op);
    fputc(' ', f);
    const char *l = c->label ? c->label(c->user, s->node) : NULL;
    if (l) {
        xml_text(f, l);
        fputs(", ", f);
    }
    xml_text(f, s->node);
    fprintf(f, ", planned %s during, %s after", bytes_text(s->peak_bytes, pb, sizeof pb),
            bytes_text(s->live_bytes, hb, sizeof hb));
    for (int d = 0; d < N_LOW; d++)
        if (c->any_low[d])
            fprintf(f, " (%s values %s during)", ebb_dtype_name(low_dtypes[d]),
                    bytes_text(c->low_sum[d][i], pb, sizeof pb));
    if (c->seen && c->seen[i])
        fprintf(f, "; measured %s, %s", bytes_text(c->m_peak[i], pb, sizeof pb),
                bytes_text(c->m_live[i], hb, sizeof hb));
}

/* Transparent hover areas under the bands, one per drawn column: where no
 * band is, the pointer names the step(s) and their figures. */
static void draw_step_columns(chart *c) {
    FILE *f = c->f;
    char wb[32], id[64];
    fputs("<g id=\"steps\" class=\"col\">\n", f);
    for (int b = 0; b < n_bins(c); b++) {
        int a = bin_first(c, b), e = bin_end(c, b);
        fputs("<path d=\"M", f);
        put_x(c, a);
        fputc(' ', f);
        num(f, c->top, 1);
        fputs("V", f);
        num(f, c->top + PLOT_H, 1);
        fputs("H", f);
        put_x(c, e);
        fputs("V", f);
        num(f, c->top, 1);
        fputs("Z\"><title>", f);
        for (int i = a; i < e && i < a + TITLE_STEPS; i++) {
            if (i > a) fputc('\n', f);
            step_line(c, i);
        }
        if (e - a > TITLE_STEPS) fprintf(f, "\nand %d more steps", e - a - TITLE_STEPS);
        if (e - a == 1) {
            const plan_step *ps = &c->p->steps[a];
            if (ps->workspace > 0)
                fprintf(f, "\nworkspace %s", bytes_text(ps->workspace, wb, sizeof wb));
            for (int k = 0; k < ps->pub.n_frees; k++) {
                ebb_plan_value_id(c->p, ps->pub.frees[k], id, sizeof id);
                fputs(k ? " " : "\nfrees ", f);
                xml_text(f, id);
            }
        }
        fputs("</title></path>\n", f);
    }
    fputs("</g>\n", f);
}

static void draw_phases(chart *c) {
    FILE *f = c->f;
    int training = 0;
    for (int i = 0; i < c->n; i++)
        training |= c->p->steps[i].pub.phase != EBB_PHASE_FORWARD;
    if (!training) return;
    fputs("<g id=\"phases\">\n", f);
    for (int a = 0; a < c->n;) {
        int ph = c->p->steps[a].pub.phase & 3, e = a;
        while (e < c->n && (int)(c->p->steps[e].pub.phase & 3) == ph)
            e++;
        fprintf(f, "<rect class=\"phase\" data-phase=\"%s\" fill=\"%s\" x=\"", phase_names[ph],
                phase_fill[ph]);
        put_x(c, a);
        fputs("\" y=\"", f);
        num(f, c->top, 1);
        fputs("\" width=\"", f);
        num(f, c->dx * (e - a), c->x_decimals);
        fputs("\" height=\"", f);
        num(f, PLOT_H, 1);
        fprintf(f, "\"><title>%s: steps %d to %d</title></rect>\n", phase_names[ph], a, e - 1);
        if (c->dx * (e - a) >= 7.0 * (double)strlen(phase_names[ph]))
            draw_text(f, xs(c, a) + c->dx * (e - a) / 2, c->top + 14,
                      "class=\"phlabel\" text-anchor=\"middle\"", phase_names[ph]);
        a = e;
    }
    fputs("</g>\n", f);
}

static int has_workspace(const chart *c) {
    for (int i = 0; i < c->n; i++)
        if (c->ws[i] > 0) return 1;
    return 0;
}

/* Each op's scratch, on top of the stack at its step. */
static void draw_workspace(chart *c) {
    FILE *f = c->f;
    if (!has_workspace(c)) return;
    fputs("<path id=\"workspace\" class=\"ws\" d=\"", f);
    for (int i = 0; i < c->n; i++) {
        if (c->ws[i] <= 0) continue;
        int64_t base = c->kept_sum[i] + c->other_sum[i];
        put_xy(c, 'M', i, base);
        fputc('V', f);
        put_y(c, base + c->ws[i]);
        fputc('H', f);
        put_x(c, i + 1);
        fputc('V', f);
        put_y(c, base);
        fputc('Z', f);
    }
    fputs("\"><title>workspace: scratch an op allocates and frees inside its call</title></path>\n",
          f);
}

/* Where the plan counts more than the values drawn (routing's row gathers
 * and scratch, a loop's other iterations): hatched up to its outline. */
static int draw_unnamed(chart *c) {
    FILE *f = c->f;
    int any = 0;
    for (int i = 0; i < c->n; i++) {
        int64_t plan = c->p->steps[i].pub.peak_bytes;
        if ((double)(plan - c->stack[i]) * c->scale < 0.5) continue;
        if (!any) fputs("<path id=\"unnamed\" class=\"un\" d=\"", f);
        any = 1;
        put_xy(c, 'M', i, c->stack[i]);
        fputc('V', f);
        put_y(c, plan);
        fputc('H', f);
        put_x(c, i + 1);
        fputc('V', f);
        put_y(c, c->stack[i]);
        fputc('Z', f);
    }
    if (any)
        fputs("\"><title>counted by the plan beyond the values drawn: the row gathers and "
              "scratch of a switch or gate, a loop's other iterations; an upper bound</title>"
              "</path>\n",
              f);
    return any;
}

/* The plan's own figure during each step, as an outline. */
static void draw_planned(chart *c) {
    FILE *f = c->f;
    fputs("<path id=\"planned\" class=\"plan\" d=\"", f);
    for (int b = 0; b < n_bins(c); b++) {
        int64_t v = 0;
        for (int i = bin_first(c, b); i < bin_end(c, b); i++)
            v = c->p->steps[i].pub.peak_bytes > v ? c->p->steps[i].pub.peak_bytes : v;
        if (b == 0)
            put_xy(c, 'M', 0, v);
        else {
            fputc('V', f);
            put_y(c, v);
        }
        fputc('H', f);
        put_x(c, bin_end(c, b));
    }
    fputs("\"><title>planned bytes during each step (ebb_plan_step.peak_bytes)</title></path>\n",
          f);
}

/* Per low dtype, its values' bytes during each step as an outline from the
 * bottom (the largest per drawn column), every step's figure in
 * data-low-bytes. */
static void draw_low(chart *c) {
    FILE *f = c->f;
    const ebb_plan *p = c->p;
    char hb[32];
    for (int d = 0; d < N_LOW; d++) {
        if (!c->any_low[d]) continue;
        const char *name = ebb_dtype_name(low_dtypes[d]);
        const int64_t *low = c->low_sum[d];
        fprintf(f, "<path id=\"low-%s\" class=\"%s\" data-dtype=\"%s\" data-low-bytes=\"", name,
                low_line_cls[d], name);
        for (int i = 0; i < c->n; i++)
            fprintf(f, i ? " %lld" : "%lld", (long long)low[i]);
        fputs("\" d=\"", f);
        for (int b = 0; b < n_bins(c); b++) {
            int any;
            int64_t v = bin_max(c, low, b, NULL, &any);
            if (b == 0)
                put_xy(c, 'M', 0, v);
            else {
                fputc('V', f);
                put_y(c, v);
            }
            fputc('H', f);
            put_x(c, bin_end(c, b));
        }
        fprintf(f, "\"><title>%s values: their bytes during each step", name);
        if (p->peak_step >= 0 && p->peak_step < c->n)
            fprintf(f, "; %s during the planned peak (step %d)",
                    bytes_text(low[p->peak_step], hb, sizeof hb), p->peak_step);
        fputs("</title></path>\n", f);
    }
}

static void draw_peak(chart *c) {
    FILE *f = c->f;
    const ebb_plan *p = c->p;
    char hb[32], label[256];
    int at = p->peak_step;
    double y = ys(c, p->peak_bytes);
    fprintf(f, "<g id=\"peak\" data-bytes=\"%lld\" data-step=\"%d\"><title>",
            (long long)p->peak_bytes, at);
    if (at >= 0 && at < c->n) {
        fprintf(f, "the planned peak%s, during ", p->peak_is_bound ? " (an upper bound)" : "");
        step_text(c, at, label, sizeof label);
        xml_text(f, label);
    }
    fputs("</title>\n<path class=\"peak\" d=\"M", f);
    num(f, LEFT, 1);
    fputc(' ', f);
    num(f, y, 1);
    fputc('H', f);
    num(f, LEFT + c->plot_w, 1);
    fputs("\"/>\n", f);
    if (at >= 0 && at < c->n) {
        double x = xs(c, at) + c->dx / 2;
        fputs("<path class=\"peakmark\" d=\"M", f);
        num(f, x, 1);
        fputc(' ', f);
        num(f, y, 1);
        fputs("l-5 -8h10Z\"/>\n", f);
        snprintf(label, sizeof label, "%s %s (%lld bytes) at step %d",
                 p->peak_is_bound ? "planned peak, an upper bound:" : "planned peak",
                 bytes_text(p->peak_bytes, hb, sizeof hb), (long long)p->peak_bytes, at);
        /* beside the mark where it fits, else from the left edge */
        double w = 6.6 * (double)strlen(label), right_edge = LEFT + c->plot_w;
        double ly = y - 12 < c->top + 12 ? y + 16 : y - 12;
        if (x + 8 + w <= right_edge)
            draw_text(f, x + 8, ly, "class=\"peaklabel\"", label);
        else if (x - 8 - w >= LEFT)
            draw_text(f, x - 8, ly, "class=\"peaklabel\" text-anchor=\"end\"", label);
        else
            draw_text(f, right_edge - 4, ly, "class=\"peaklabel\" text-anchor=\"end\"", label);
    }
    fputs("</g>\n", f);
}

static int step_over(const chart *c, int i, int *over_peak, int *over_live) {
    const ebb_plan_step *s = &c->p->steps[i].pub;
    /* CUDA rounds every block up to 512 bytes; the plan's per-step
     * figures are unrounded */
    int64_t slack = c->trace->device.type == EBB_DEVICE_CUDA ? 512 * (int64_t)(c->count[i] + 8) : 0;
    *over_peak = c->seen[i] && c->m_peak[i] > s->peak_bytes + slack;
    *over_live = c->seen[i] && c->m_live[i] > s->live_bytes + slack;
    return *over_peak || *over_live;
}

/* A line through the right edge of each drawn column at the column's
 * largest figure, broken where no step of a column ran. */
static void series(chart *c, const int64_t *a, const unsigned char *seen, int dots) {
    FILE *f = c->f;
    int prev = 0;
    for (int b = 0; b < n_bins(c); b++) {
        int any;
        int64_t v = bin_max(c, a, b, seen, &any);
        if (any) put_xy(c, prev ? 'L' : 'M', bin_end(c, b), v);
        if (any && dots) fputs("h0", f);
        prev = any && !dots;
    }
}

static void list_numbers(chart *c, const char *attr, const int64_t *a) {
    fprintf(c->f, " %s=\"", attr);
    for (int i = 0, first = 1; i < c->n; i++)
        if (c->seen[i]) {
            fprintf(c->f, first ? "%lld" : " %lld", (long long)(a ? a[i] : i));
            first = 0;
        }
    fputc('"', c->f);
}

/* The measured run: live bytes after each step (a line through the right
 * edge of its column, with the plan's own after-step figure dashed beneath
 * it), the in-step peaks as ticks, and red where a step measured more than
 * the plan promised. Every step's figures are in data attributes, for
 * tools; the drawing takes the largest per pixel column. */
static void draw_trace(chart *c) {
    FILE *f = c->f;
    const ebb_plan *p = c->p;
    char hb[32], pb[32];
    int64_t *planned_live = malloc((size_t)c->n * sizeof *planned_live);
    if (!planned_live) {
        c->oom = 1;
        return;
    }
    for (int i = 0; i < c->n; i++)
        planned_live[i] = p->steps[i].pub.live_bytes;
    fputs("<g id=\"trace\">\n", f);
    for (int i = 0; i < c->n; i++) {
        int over_peak, over_live;
        if (!step_over(c, i, &over_peak, &over_live)) continue;
        const ebb_plan_step *s = &p->steps[i].pub;
        fprintf(f, "<rect class=\"over\" data-step=\"%d\" x=\"", i);
        put_x(c, i);
        fputs("\" y=\"", f);
        num(f, c->top, 1);
        fputs("\" width=\"", f);
        num(f, c->dx < 2 ? 2 : c->dx, c->x_decimals);
        fputs("\" height=\"", f);
        num(f, PLOT_H, 1);
        fprintf(f, "\"><title>step %d measured more than planned: ", i);
        if (over_peak)
            fprintf(f, "%s during (planned %s)", bytes_text(c->m_peak[i], hb, sizeof hb),
                    bytes_text(s->peak_bytes, pb, sizeof pb));
        if (over_live)
            fprintf(f, "%s%s after (planned %s)", over_peak ? ", " : "",
                    bytes_text(c->m_live[i], hb, sizeof hb),
                    bytes_text(s->live_bytes, pb, sizeof pb));
        fputs("</title></rect>\n", f);
    }
    fputs("<path id=\"planned-live\" class=\"plive\" d=\"", f);
    series(c, planned_live, c->seen, 0);
    fputs("\"><title>planned live bytes after each step</title></path>\n", f);
    fputs("<path id=\"measured-live\" class=\"mlive\"", f);
    list_numbers(c, "data-steps", NULL);
    list_numbers(c, "data-live-bytes", c->m_live);
    fputs(" d=\"", f);
    series(c, c->m_live, c->seen, 0);
    fputs("\"><title>measured live bytes after each step</title></path>\n", f);
    if (c->bin == 1 && c->dx >= 6) {
        fputs("<path class=\"mdot\" d=\"", f);
        series(c, c->m_live, c->seen, 1);
        fputs("\"/>\n", f);
    }
    fputs("<path id=\"measured-peak\" class=\"mpeak\"", f);
    list_numbers(c, "data-peak-bytes", c->m_peak);
    fputs(" d=\"", f);
    for (int b = 0; b < n_bins(c); b++) {
        int any;
        int64_t v = bin_max(c, c->m_peak, b, c->seen, &any);
        if (!any) continue;
        put_xy(c, 'M', bin_first(c, b), v);
        fputc('H', f);
        put_x(c, bin_end(c, b));
    }
    fputs("\"><title>measured peak during each step</title></path>\n</g>\n", f);
    free(planned_live);
}

/* A legend entry: a swatch ("box"), a line or nothing, then its label. */
typedef struct legend_item {
    const char *cls;
    int line;
    char label[96];
} legend_item;

static int legend_items(const chart *c, legend_item *it, int unnamed) {
    int n = 0;
    int shown = c->n_fams < 24 ? c->n_fams : 24;
    for (int k = 0; k < shown; k++) {
        it[n] = (legend_item){NULL, 0, ""};
        snprintf(it[n++].label, sizeof it->label, "%.*s", c->fams[k].len, c->fams[k].name);
    }
    if (c->n_fams > shown)
        snprintf(it[n++].label, sizeof it->label, "and %d more ops", c->n_fams - shown);
#define ITEM(k, l, text)                                                                           \
    (it[n] = (legend_item){k, l, ""}, snprintf(it[n++].label, sizeof it->label, "%s", text))
    if (c->n_other) ITEM("oth", 0, "other (small values, merged)");
    if (c->any_saved) ITEM("b s f0 key", 0, "saved for the backward (outlined)");
    for (int d = 0; d < N_LOW; d++) {
        if (!c->any_low[d]) continue;
        char label[64];
        snprintf(label, sizeof label, "%s values (hatched)", ebb_dtype_name(low_dtypes[d]));
        ITEM(low_key_cls[d], 0, label);
        snprintf(label, sizeof label, "%s values, during each step", ebb_dtype_name(low_dtypes[d]));
        ITEM(low_line_cls[d], 1, label);
    }
    if (has_workspace(c)) ITEM("ws", 0, "workspace");
    if (unnamed) ITEM("un", 0, "counted by the plan, no value drawn");
    ITEM("plan", 1, "planned, during each step");
    ITEM("peak", 1, "planned peak");
    if (c->trace) {
        ITEM("plive", 1, "planned, after each step");
        ITEM("mlive", 1, "measured, after each step");
        ITEM("mpeak", 1, "measured peak in the step");
    }
    if (c->n_over) ITEM("over key", 0, "measured more than planned");
#undef ITEM
    return n;
}

/* Swatches under the chart, wrapping at its width; returns the rows used. */
static int draw_legend(chart *c, const legend_item *it, int n, double y0, double width, int draw) {
    FILE *f = c->f;
    double x = LEFT, y = y0;
    int rows = n ? 1 : 0;
    if (draw) fputs("<g id=\"legend\">\n", f);
    for (int k = 0; k < n; k++) {
        double w = 22 + 6.4 * (double)strlen(it[k].label) + 16;
        if (x + w > width - RIGHT && x > LEFT) {
            x = LEFT;
            y += 18;
            rows++;
        }
        if (draw && !it[k].line && strncmp(it[k].label, "and ", 4)) {
            char fam[16];
            const char *cls = it[k].cls;
            if (!cls) {
                snprintf(fam, sizeof fam, "f%d", k % N_PALETTE);
                cls = fam;
            }
            fprintf(f, "<rect class=\"%s\" x=\"", cls);
            num(f, x, 1);
            fputs("\" y=\"", f);
            num(f, y - 9, 1);
            fputs("\" width=\"16\" height=\"10\"/>\n", f);
        } else if (draw && it[k].line) {
            fprintf(f, "<path class=\"%s\" d=\"M", it[k].cls);
            num(f, x, 1);
            fputc(' ', f);
            num(f, y - 4, 1);
            fputs("h16\"/>\n", f);
        }
        if (draw) draw_text(f, x + 22, y, NULL, it[k].label);
        x += w;
    }
    if (draw) fputs("</g>\n", f);
    return rows;
}

static const char style[] =
    "<defs><pattern id=\"hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
    "patternTransform=\"rotate(45)\"><path d=\"M0 0V6\" stroke=\"#999\" stroke-width=\"1.5\"/>"
    "</pattern></defs>\n"
    "<style>\n"
    "text{font-family:Helvetica,Arial,sans-serif;font-size:11px;fill:#222}\n"
    ".title{font-size:14px;font-weight:bold}\n"
    ".sub{fill:#555}\n"
    ".op{font-size:10px;fill:#444}\n"
    ".grid{stroke:#e4e4e4;stroke-width:1;fill:none}\n"
    ".frame{stroke:#888;stroke-width:1;fill:none}\n"
    ".col path{fill:#000;fill-opacity:0}\n"
    ".seams .b{stroke:#fff;stroke-width:.6}\n"
    ".a{fill-opacity:.78}\n"
    ".g{fill-opacity:.55}\n"
    ".g.a{fill-opacity:.42}\n"
    ".b.s,.seams .b.s{stroke:#222;stroke-width:1}\n"
    ".oth{fill:#c8c8c8}\n"
    ".ws{fill:#555;fill-opacity:.45}\n"
    ".un{fill:url(#hatch)}\n"
    ".plan{fill:none;stroke:#333;stroke-width:1}\n"
    ".peak{fill:none;stroke:#c0392b;stroke-width:1.2;stroke-dasharray:6 3}\n"
    ".peakmark{fill:#c0392b}\n"
    ".peaklabel{fill:#c0392b;font-weight:bold}\n"
    ".phlabel{fill:#666;font-size:12px}\n"
    ".plive{fill:none;stroke:#777;stroke-width:1;stroke-dasharray:3 2}\n"
    ".mlive{fill:none;stroke:#111;stroke-width:1.6}\n"
    ".mdot{fill:none;stroke:#111;stroke-width:5;stroke-linecap:round}\n"
    ".mpeak{fill:none;stroke:#111;stroke-width:2}\n"
    ".over{fill:#e8251f;fill-opacity:.35}\n";

/* Mixed precision: per low dtype a hatch in each palette colour its bands
 * use and one in the "other" grey (its legend swatch), defined where the
 * plan has values of that dtype; bfloat16 leans one way, float16 the other. */
static const char *const low_line_style[N_LOW] = {
    "{fill:none;stroke:#0a6e80;stroke-width:1.6;stroke-dasharray:8 2 2 2}",
    "{fill:none;stroke:#8a4b08;stroke-width:1.6;stroke-dasharray:8 2 2 2}",
};

static void low_pattern(FILE *f, const char *id, const char *fill, int d) {
    fprintf(f,
            "<pattern id=\"%s\" width=\"5\" height=\"5\" patternUnits=\"userSpaceOnUse\" "
            "patternTransform=\"rotate(%d)\"><rect width=\"5\" height=\"5\" fill=\"%s\"/>"
            "<path d=\"M0 0V5\" stroke=\"#fff\" stroke-opacity=\".75\" stroke-width=\"1.6\"/>"
            "</pattern>",
            id, d == 0 ? 45 : -45, fill);
}

static void low_defs(const chart *c) {
    FILE *f = c->f;
    for (int d = 0; d < N_LOW; d++) {
        if (!c->any_low[d]) continue;
        fputs("<defs>", f);
        low_pattern(f, low_cls[d], "#c8c8c8", d);
        for (int k = 0; k < N_PALETTE; k++)
            if (c->low_fams[d] >> k & 1) {
                char id[16];
                snprintf(id, sizeof id, "%s%d", low_cls[d], k);
                low_pattern(f, id, palette[k], d);
            }
        fputs("</defs>\n", f);
    }
}

/* The rules using them, inside <style>. */
static void low_style(const chart *c) {
    FILE *f = c->f;
    for (int d = 0; d < N_LOW; d++) {
        if (!c->any_low[d]) continue;
        const char *cls = low_cls[d];
        fprintf(f, ".oth.%s{fill:url(#%s)}\n", cls, cls);
        for (int k = 0; k < N_PALETTE; k++)
            if (c->low_fams[d] >> k & 1) fprintf(f, ".b.f%d.%s{fill:url(#%s%d)}\n", k, cls, cls, k);
        fprintf(f, ".%s%s\n", low_line_cls[d], low_line_style[d]);
    }
}

ebb_status ebb_plan_chart_svg(const ebb_plan *p, const ebb_chart_trace *trace, FILE *f) {
    return ebb_plan_chart_svg_ex(p, trace, f, NULL, NULL);
}

/* The chart's per-step arrays (and the legend's items, *items); c->oom
 * says whether any allocation failed. */
static void chart_alloc(chart *c, legend_item **items) {
    const ebb_plan *p = c->p;
    size_t n1 = (size_t)(c->n ? c->n : 1);
    *items = calloc(n1 + 24, sizeof **items);
    c->fams = calloc(n1, sizeof *c->fams);
    c->cls = malloc((size_t)(p->n_values ? p->n_values : 1) * sizeof *c->cls);
    c->kept_sum = calloc(n1 + 1, sizeof *c->kept_sum);
    c->other_sum = calloc(n1 + 1, sizeof *c->other_sum);
    c->stack = calloc(n1 + 1, sizeof *c->stack);
    c->ws = calloc(n1, sizeof *c->ws);
    c->count = calloc(n1 + 1, sizeof *c->count);
    c->low_base = calloc(n1, sizeof *c->low_base);
    int low_oom = !c->low_base;
    for (int d = 0; d < N_LOW; d++) {
        c->low_sum[d] = calloc(n1 + 1, sizeof *c->low_sum[d]);
        c->other_low[d] = calloc(n1 + 1, sizeof *c->other_low[d]);
        low_oom |= !c->low_sum[d] || !c->other_low[d];
    }
    if (c->trace) {
        c->m_live = calloc(n1, sizeof *c->m_live);
        c->m_peak = calloc(n1, sizeof *c->m_peak);
        c->seen = calloc(n1, 1);
    }
    if (!*items || !c->fams || !c->cls || !c->kept_sum || !c->other_sum || !c->stack || !c->ws ||
        !c->count || low_oom || (c->trace && (!c->m_live || !c->m_peak || !c->seen)))
        c->oom = 1;
}

static void chart_free(chart *c, legend_item *items) {
    free(items);
    free(c->bands);
    free(c->fams);
    free(c->cls);
    free(c->kept_sum);
    free(c->other_sum);
    free(c->stack);
    free(c->ws);
    free(c->count);
    free(c->low_base);
    for (int d = 0; d < N_LOW; d++) {
        free(c->low_sum[d]);
        free(c->other_low[d]);
    }
    free(c->m_live);
    free(c->m_peak);
    free(c->seen);
}

/* Big plans: bands too small to see merge into "other"; the kept and
 * merged sums per step, and per low dtype, then each step's stack. */
static void split_bands(chart *c) {
    int merge = c->n_bands > MERGE_BANDS || c->n > MERGE_STEPS;
    for (int b = 0; b < c->n_bands; b++) {
        band *bd = &c->bands[b];
        bd->kept = !merge || ((double)bd->bytes * c->scale >= MIN_BAND_H &&
                              c->dx * (bd->death - bd->birth + 1) >= MIN_BAND_W);
        int64_t *sum = bd->kept ? c->kept_sum : c->other_sum;
        sum[bd->birth] += bd->bytes;
        sum[bd->death + 1] -= bd->bytes;
        c->n_other += !bd->kept;
        if (bd->low) {
            /* a low dtype's bands, all and merged: the same sums, per dtype */
            int d = bd->low - 1;
            c->any_low[d] = 1;
            c->low_sum[d][bd->birth] += bd->bytes;
            c->low_sum[d][bd->death + 1] -= bd->bytes;
            if (bd->kept) {
                c->low_fams[d] |= (int64_t)1 << (bd->family % N_PALETTE);
            } else {
                c->any_low_other[d] = 1;
                c->other_low[d][bd->birth] += bd->bytes;
                c->other_low[d][bd->death + 1] -= bd->bytes;
            }
        }
    }
    for (int i = 0; i < c->n; i++) {
        if (i > 0) {
            c->kept_sum[i] += c->kept_sum[i - 1];
            c->other_sum[i] += c->other_sum[i - 1];
            for (int d = 0; d < N_LOW; d++) {
                c->low_sum[d][i] += c->low_sum[d][i - 1];
                c->other_low[d][i] += c->other_low[d][i - 1];
            }
        }
        c->stack[i] = c->kept_sum[i] + c->other_sum[i] + c->ws[i];
    }
}

/* The title and the lines under it: the planned peak, what lies beside
 * the step, clipping's cost, and a trace's measured peak. */
static void draw_titles(chart *c) {
    const ebb_plan *p = c->p;
    FILE *f = c->f;
    const ebb_chart_trace *trace = c->trace;
    char head[512], hb[32], kb[32];
    snprintf(head, sizeof head, "%s: live intermediate bytes over %d steps", p->name, c->n);
    draw_text(f, LEFT, 22, "class=\"title\"", head);
    size_t at = (size_t)snprintf(head, sizeof head, "planned peak %s (%s), keep_all %s; %d values",
                                 bytes_text(p->peak_bytes, hb, sizeof hb),
                                 p->keep_all        ? "nothing freed: keep_all"
                                 : p->peak_is_bound ? "an upper bound"
                                                    : "exact",
                                 bytes_text(p->keep_all_peak_bytes, kb, sizeof kb), c->n_bands);
    if (c->n_other && at < sizeof head)
        at += (size_t)snprintf(head + at, sizeof head - at, " (%d too small to draw, merged)",
                               c->n_other);
    if (p->training && !p->train_options.grads_only && at < sizeof head) {
        char pb[32], ob[32];
        at += (size_t)snprintf(head + at, sizeof head - at,
                               "; beside them parameters %s, optimizer state %s",
                               bytes_text(ebb_plan_param_bytes(p), pb, sizeof pb),
                               bytes_text(ebb_plan_optimizer_state_bytes(p), ob, sizeof ob));
    }
    if (p->train_options.clip_grad_norm > 0 && at < sizeof head) {
        /* clipping by norm holds every gradient until the updates: its cost */
        char cb[32];
        int64_t cost = ebb_plan_clip_cost_bytes(p);
        snprintf(head + at, sizeof head - at,
                 "; clip_grad_norm %g: updates after the backward, peak %s%s than without "
                 "clipping",
                 p->train_options.clip_grad_norm,
                 bytes_text(cost < 0 ? -cost : cost, cb, sizeof cb),
                 cost < 0 ? " lower" : " higher");
    }
    draw_text(f, LEFT, 40, "class=\"sub\"", head);
    if (trace) {
        int64_t mp = 0;
        for (int i = 0; i < c->n; i++)
            mp = c->seen[i] && c->m_peak[i] > mp ? c->m_peak[i] : mp;
        at = (size_t)snprintf(head, sizeof head, "measured peak %s over %d executed steps",
                              bytes_text(mp, hb, sizeof hb), trace->n_samples);
        if (c->n_over && at < sizeof head)
            snprintf(head + at, sizeof head - at, "; %d step%s measured more than planned",
                     c->n_over, c->n_over == 1 ? "" : "s");
        draw_text(f, LEFT, 56, "class=\"sub\"", head);
    }
}

ebb_status ebb_plan_chart_svg_ex(const ebb_plan *p, const ebb_chart_trace *trace, FILE *f,
                                 ebb_node_label_fn label, void *user) {
    if (!p || !f)
        return ebb_error_set(EBB_ERR_ARG, "ebb_plan_chart_svg: NULL %s", !p ? "plan" : "file");
    if (trace && trace->n_samples > 0 && !trace->samples)
        return ebb_error_set(EBB_ERR_ARG, "ebb_plan_chart_svg: %d trace samples at NULL",
                             trace->n_samples);
    for (int k = 0; trace && k < trace->n_samples; k++)
        if (trace->samples[k].step < 0 || trace->samples[k].step >= p->n_steps)
            return ebb_error_set(EBB_ERR_ARG,
                                 "ebb_plan_chart_svg: trace sample %d names step %d, but plan %s "
                                 "has %d steps (a trace of another plan?)",
                                 k, trace->samples[k].step, p->name, p->n_steps);
    chart c = {.p = p, .f = f, .n = p->n_steps, .trace = trace, .bin = 1, .label = label,
               .user = user};
    legend_item *items = NULL;
    chart_alloc(&c, &items);
    ebb_status st = EBB_OK;
    if (!c.oom) walk(&c);
    if (c.oom) goto out;
    for (int k = 0; trace && k < trace->n_samples; k++) {
        const ebb_chart_sample *sm = &trace->samples[k];
        int i = sm->step;
        if (!c.seen[i] || sm->live_bytes > c.m_live[i]) c.m_live[i] = sm->live_bytes;
        if (!c.seen[i] || sm->peak_bytes > c.m_peak[i]) c.m_peak[i] = sm->peak_bytes;
        c.seen[i] = 1;
    }

    /* the canvas: as wide as the steps need, within limits */
    c.plot_w = STEP_W * c.n;
    c.plot_w = c.plot_w < MIN_PLOT_W ? MIN_PLOT_W : c.plot_w > MAX_PLOT_W ? MAX_PLOT_W : c.plot_w;
    c.dx = c.n ? c.plot_w / c.n : c.plot_w;
    c.x_decimals = c.dx < 1 ? 2 : 1;
    if (c.dx < MIN_COLUMN_W) c.bin = (int)ceil(MIN_COLUMN_W / c.dx);

    /* the y range: everything drawn must fit */
    int64_t *all = c.stack; /* every band, before the split into kept and other */
    for (int b = 0; b < c.n_bands; b++) {
        all[c.bands[b].birth] += c.bands[b].bytes;
        all[c.bands[b].death + 1] -= c.bands[b].bytes;
        c.count[c.bands[b].birth]++;
        c.count[c.bands[b].death + 1]--;
    }
    int64_t top = p->peak_bytes;
    for (int i = 0; i < c.n; i++) {
        if (i > 0) {
            all[i] += all[i - 1];
            c.count[i] += c.count[i - 1];
        }
        c.ws[i] = p->steps[i].workspace > 0 ? p->steps[i].workspace : 0;
        int64_t v = all[i] + c.ws[i];
        top = v > top ? v : top;
        top = p->steps[i].pub.peak_bytes > top ? p->steps[i].pub.peak_bytes : top;
        if (c.seen && c.seen[i]) {
            top = c.m_live[i] > top ? c.m_live[i] : top;
            top = c.m_peak[i] > top ? c.m_peak[i] : top;
        }
    }
    int64_t tick = tick_step(top + top / 16, &c.ymax);
    c.scale = PLOT_H / (double)c.ymax;

    split_bands(&c);
    int unnamed = 0;
    for (int i = 0; i < c.n; i++)
        unnamed |= (double)(p->steps[i].pub.peak_bytes - c.stack[i]) * c.scale >= 0.5;
    for (int i = 0; trace && i < c.n; i++) {
        int a, b;
        c.n_over += step_over(&c, i, &a, &b);
    }

    /* the page: title lines, the plot, step labels, the legend */
    size_t max_op = 0;
    for (int i = 0; i < c.n; i++)
        max_op = strlen(p->steps[i].pub.op) > max_op ? strlen(p->steps[i].pub.op) : max_op;
    double op_drop = c.dx >= 12 ? 12 + 5.6 * 0.82 * (double)max_op : 0;
    c.top = trace ? 74 : 58;
    double width = LEFT + c.plot_w + RIGHT;
    double legend_y = c.top + PLOT_H + 66 + op_drop;
    int n_items = legend_items(&c, items, unnamed);
    double height = legend_y + 18 * draw_legend(&c, items, n_items, legend_y, width, 0) + 4;
    fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
          "width=\"",
          f);
    num(f, width, 0);
    fputs("\" height=\"", f);
    num(f, height, 0);
    fputs("\" viewBox=\"0 0 ", f);
    num(f, width, 0);
    fputc(' ', f);
    num(f, height, 0);
    fprintf(f, "\" data-plan-steps=\"%d\" data-bands=\"%d\" data-other=\"%d\">\n", c.n, c.n_bands,
            c.n_other);
    fputs(style, f);
    for (int k = 0; k < N_PALETTE; k++)
        fprintf(f, ".f%d{fill:%s}\n", k, palette[k]);
    low_style(&c);
    fputs("</style>\n", f);
    low_defs(&c);
    fputs("<title>memory of plan ", f);
    xml_text(f, p->name);
    fputs("</title>\n<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n", f);

    draw_titles(&c);

    if (c.n > 0) {
        draw_phases(&c);
        draw_axes(&c, tick, op_drop);
        draw_step_columns(&c);
        draw_bands(&c);
        if (c.oom) goto out;
        draw_other(&c);
        draw_workspace(&c);
        draw_unnamed(&c);
        draw_planned(&c);
        draw_low(&c);
        if (trace) draw_trace(&c);
        if (c.oom) goto out;
        draw_peak(&c);
    }
    draw_legend(&c, items, n_items, legend_y, width, 1);
    fputs("</svg>\n", f);
    if (ferror(f)) /* the caller flushes; what failed so far is known */
        st = ebb_error_set(EBB_ERR_IO, "ebb_plan_chart_svg: cannot write the chart of plan %s",
                           p->name);
out:
    if (c.oom) st = ebb_error_set(EBB_ERR_NOMEM, "ebb_plan_chart_svg: out of memory");
    chart_free(&c, items);
    return st;
}
