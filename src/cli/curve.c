/* Learning curves as SVG, written by hand like `ebb chart`'s memory charts
 * (graph/chart.c): the same fonts, greys and palette, so the pictures of
 * one project look like one project's. A user looks at these rather than at
 * a table of numbers, so the drawing favours a few clear marks: one thin
 * line of training loss, test loss and accuracy per epoch as dots joined by
 * lines, the last accuracy written next to its dot.
 *
 * Both loss curves share the left axis (starting at 0, so that a fall reads
 * as a fall of that size); accuracy has a fixed 0..1 right axis, so that
 * pictures of different runs compare at a glance. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include "curve.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../graph/svg_write.h"
#include "../fileio.h"

/* Geometry, in px. */
#define WIDTH 800.0
#define LEFT 64.0
#define RIGHT_AXIS 62.0 /* right margin with the accuracy axis */
#define RIGHT_NONE 24.0
#define TOP 62.0 /* the plot's top under a one-line subtitle */
#define LINE_H 14.0
#define CHAR_W 6.0 /* a generous width of an 11px character, for fitting text */
#define PLOT_H 320.0

/* The house palette (graph/chart.c's first colours). */
#define C_TRAIN "#4e79a7"
#define C_TEST "#f28e2b"
#define C_ACC "#59a14f"

typedef struct step_point {
    int64_t step, samples;
    double loss;
} step_point;

typedef struct epoch_point {
    int64_t epoch, samples;
    double loss, test_loss, test_accuracy;
} epoch_point;

struct ebb_cli_curve {
    char *name, *context;
    ebb_cli_curve_info info;
    step_point *steps;
    int n_steps, cap_steps;
    epoch_point *epochs;
    int n_epochs, cap_epochs;
    int64_t last_step;
};

static char *dup_or_empty(const char *s) {
    return strdup(s ? s : "");
}

ebb_status ebb_cli_curve_new(ebb_cli_curve **out, const ebb_cli_curve_info *info) {
    *out = NULL;
    if (info->samples_per_epoch < 1 || info->window < 1)
        return ebb_error_set(EBB_ERR_ARG, "--curve: %lld samples per epoch, a window of %lld steps",
                             (long long)info->samples_per_epoch, (long long)info->window);
    ebb_cli_curve *c = calloc(1, sizeof *c);
    if (c) {
        c->info = *info;
        c->name = dup_or_empty(info->name);
        c->context = dup_or_empty(info->context);
    }
    if (!c || !c->name || !c->context) {
        ebb_cli_curve_free(c);
        return ebb_error_set(EBB_ERR_NOMEM, "--curve: out of memory");
    }
    c->info.name = c->name;
    c->info.context = c->context;
    *out = c;
    return EBB_OK;
}

void ebb_cli_curve_free(ebb_cli_curve *c) {
    if (!c) return;
    free(c->name);
    free(c->context);
    free(c->steps);
    free(c->epochs);
    free(c);
}

/* Grows *p (of `size`-byte elements) to hold one more than *cap when full. */
static int grow(void **p, int n, int *cap, size_t size) {
    if (n < *cap) return 0;
    int nc = *cap ? 2 * *cap : 64;
    void *q = realloc(*p, (size_t)nc * size);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

ebb_status ebb_cli_curve_step(ebb_cli_curve *c, int64_t step, int64_t samples, double loss) {
    if (grow((void **)&c->steps, c->n_steps, &c->cap_steps, sizeof *c->steps))
        return ebb_error_set(EBB_ERR_NOMEM, "--curve: out of memory");
    c->steps[c->n_steps++] = (step_point){step, samples, loss};
    c->last_step = step;
    return EBB_OK;
}

ebb_status ebb_cli_curve_epoch(ebb_cli_curve *c, int64_t epoch, int64_t samples, double loss,
                               double test_loss, double test_accuracy) {
    if (grow((void **)&c->epochs, c->n_epochs, &c->cap_epochs, sizeof *c->epochs))
        return ebb_error_set(EBB_ERR_NOMEM, "--curve: out of memory");
    c->epochs[c->n_epochs++] = (epoch_point){epoch, samples, loss, test_loss, test_accuracy};
    return EBB_OK;
}

/* ---- writing (graph/svg_write.h, as ebb chart writes) ---------------------- */

/* A tick spacing of 1, 2 or 5 times a power of ten giving at most max_ticks
 * intervals over span. */
static double tick_step(double span, int max_ticks) {
    if (!(span > 0)) return 1;
    double p10 = pow(10, floor(log10(span / max_ticks)));
    static const double m[] = {1, 2, 5, 10};
    for (int k = 0; k < 4; k++)
        if (span / (m[k] * p10) <= max_ticks) return m[k] * p10;
    return 10 * p10;
}

/* A tick label: "0.25", "12", "40k", "1.2M"; one unit for a whole axis
 * (the one its largest value needs), so that 8000 does not sit beside 10k. */
static void tick_label(double v, double step, double axis_max, char *buf, size_t size) {
    double unit = axis_max >= 1e6 ? 1e6 : axis_max >= 1e4 ? 1e3 : 1;
    const char *suffix = unit == 1e6 ? "M" : unit == 1e3 ? "k" : "";
    double s = step / unit;
    int decimals = s >= 1 ? 0 : (int)ceil(-log10(s) - 1e-9);
    if (fabs(v) < step * 1e-6) v = 0; /* never "-0" */
    snprintf(buf, size, "%.*f%s", decimals, v / unit, v == 0 ? "" : suffix);
}

/* Shortens s to at most `fit` bytes ending in "...", never inside a UTF-8
 * character (half of one is not XML). */
static void cut(char *s, size_t fit) {
    if (strlen(s) <= fit || fit < 4) return;
    size_t at = fit - 3;
    while (at > 0 && ((unsigned char)s[at] & 0xC0) == 0x80)
        at--;
    memcpy(s + at, "...", 4);
}

typedef struct frame {
    FILE *f;
    double top;                    /* the plot's top */
    double plot_w, x0, x1, lo, hi; /* x in the axis' unit; loss from lo to hi */
    double per_x;                  /* samples per x unit: an epoch's, or 1 */
    double ystep;                  /* between the loss axis' ticks */
    int in_epochs;                 /* x in epochs, else samples seen */
    int acc;                       /* test accuracy drawn, on a right axis */
} frame;

static double px(const frame *g, int64_t samples) {
    return LEFT + g->plot_w * ((double)samples / g->per_x - g->x0) / (g->x1 - g->x0);
}
static double py_loss(const frame *g, double loss) {
    return g->top + PLOT_H - PLOT_H * (loss - g->lo) / (g->hi - g->lo);
}
static double py_acc(const frame *g, double acc) {
    return g->top + PLOT_H - PLOT_H * acc;
}

static void put_point(FILE *f, double x, double y, int first) {
    if (!first) fputc(' ', f);
    num(f, x, 1);
    fputc(',', f);
    num(f, y, 1);
}

/* A legend entry: a line (with a dot for per-epoch series) and its label;
 * returns the x after it. */
static double legend_item(FILE *f, double x, double y, const char *color, int dot,
                          const char *label) {
    fprintf(f, "<path d=\"M");
    num(f, x, 1);
    fputc(' ', f);
    num(f, y - 4, 1);
    fprintf(f, "h20\" stroke=\"%s\" stroke-width=\"2\" fill=\"none\"/>\n", color);
    if (dot) {
        fputs("<circle cx=\"", f);
        num(f, x + 10, 1);
        fputs("\" cy=\"", f);
        num(f, y - 4, 1);
        fprintf(f, "\" r=\"3\" fill=\"%s\"/>\n", color);
    }
    draw_text(f, x + 26, y, NULL, label);
    return x + 26 + 6.2 * (double)strlen(label) + 22;
}

static const char style[] =
    "<style>\n"
    "text{font-family:Helvetica,Arial,sans-serif;font-size:11px;fill:#222}\n"
    ".title{font-size:14px;font-weight:bold}\n"
    ".sub{fill:#555}\n"
    ".grid{stroke:#e4e4e4;stroke-width:1;fill:none}\n"
    ".frame{stroke:#888;stroke-width:1;fill:none}\n"
    ".train{fill:none;stroke:" C_TRAIN ";stroke-width:1.3;stroke-linejoin:round}\n"
    ".test{fill:none;stroke:" C_TEST ";stroke-width:2;stroke-linejoin:round}\n"
    ".acc{fill:none;stroke:" C_ACC ";stroke-width:2;stroke-linejoin:round}\n"
    ".dtrain{fill:none;stroke:" C_TRAIN ";stroke-width:5;stroke-linecap:round}\n"
    ".dtest{fill:" C_TEST "}\n"
    ".dacc{fill:" C_ACC "}\n"
    ".vacc{fill:" C_ACC ";font-weight:bold}\n"
    ".vtest{fill:#c46a12;font-weight:bold}\n"
    "</style>\n";

/* The axes' ranges: x in epochs for a run of at least one, else samples
 * seen; the loss from 0 (or below, for a loss that goes there) to a tick
 * above every loss drawn. */
static void frame_scale(const ebb_cli_curve *c, frame *g) {
    const ebb_cli_curve_info *in = &c->info;
    g->acc = in->accuracy && in->eval;
    g->plot_w = WIDTH - LEFT - (g->acc ? RIGHT_AXIS : RIGHT_NONE);
    g->in_epochs = in->last_samples >= in->samples_per_epoch;
    g->per_x = g->in_epochs ? (double)in->samples_per_epoch : 1;
    g->x0 = (double)in->first_samples / g->per_x;
    g->x1 = (double)in->last_samples / g->per_x;
    if (!(g->x1 > g->x0)) g->x1 = g->x0 + 1;
    double lmax = 0, lmin = 0;
    for (int i = 0; i < c->n_steps; i++)
        if (isfinite(c->steps[i].loss)) {
            lmax = fmax(lmax, c->steps[i].loss);
            lmin = fmin(lmin, c->steps[i].loss);
        }
    for (int i = 0; in->eval && i < c->n_epochs; i++)
        if (isfinite(c->epochs[i].test_loss)) {
            lmax = fmax(lmax, c->epochs[i].test_loss);
            lmin = fmin(lmin, c->epochs[i].test_loss);
        }
    if (!(lmax > lmin)) lmax = lmin + 1;
    g->ystep = tick_step((lmax - lmin) * 1.04, 6);
    g->lo = floor(lmin / g->ystep) * g->ystep;
    g->hi = ceil(lmax * 1.04 / g->ystep) * g->ystep;
}

/* The title; under it the context, then how far the run got, on one line
 * when they fit, else on two (sub[0], sub[1]), each cut to the picture's
 * width. Returns how many lines sub holds; sets g->top under them. */
static int headings(const ebb_cli_curve *c, frame *g, char title[512], char sub[2][768]) {
    const ebb_cli_curve_info *in = &c->info;
    char more[256];
    snprintf(title, 512, "%s: %s", c->name,
             g->acc     ? "training loss, test loss and test accuracy"
             : in->eval ? "training loss and test loss"
                        : "training loss");
    const epoch_point *last = c->n_epochs ? &c->epochs[c->n_epochs - 1] : NULL;
    int64_t epochs_total = (in->last_samples + in->samples_per_epoch - 1) / in->samples_per_epoch;
    more[0] = '\0';
    if (last && g->acc && isfinite(last->test_accuracy)) {
        int best = 0;
        for (int i = 1; i < c->n_epochs; i++)
            if (c->epochs[i].test_accuracy >= c->epochs[best].test_accuracy) /* the latest */
                best = i;
        int n = snprintf(more, sizeof more, "epoch %lld of %lld: test accuracy %.4f",
                         (long long)last->epoch, (long long)epochs_total, last->test_accuracy);
        if (best != c->n_epochs - 1 && n > 0 && (size_t)n < sizeof more)
            snprintf(more + n, sizeof more - (size_t)n, " (best %.4f, epoch %lld)",
                     c->epochs[best].test_accuracy, (long long)c->epochs[best].epoch);
    } else if (last && in->eval && isfinite(last->test_loss)) {
        snprintf(more, sizeof more, "epoch %lld of %lld: test loss %.4f", (long long)last->epoch,
                 (long long)epochs_total, last->test_loss);
    } else if (c->n_steps) {
        snprintf(more, sizeof more, "step %lld", (long long)c->last_step);
    }
    size_t fit = (size_t)((WIDTH - LEFT - 8) / CHAR_W);
    int n_sub = 1;
    snprintf(sub[0], 768, "%s%s%s", c->context, *c->context && *more ? "; " : "", more);
    if (strlen(sub[0]) > fit && *c->context && *more) {
        snprintf(sub[0], 768, "%s", c->context);
        snprintf(sub[1], 768, "%s", more);
        n_sub = 2;
    }
    for (int k = 0; k < n_sub; k++)
        cut(sub[k], fit);
    cut(title, (size_t)(fit / 1.4)); /* bold 14px */
    g->top = TOP + LINE_H * (n_sub - 1);
    return n_sub;
}

/* Loss ticks and grid on the left, accuracy on the right, x below. */
static void draw_axes(FILE *f, const frame *g) {
    double bottom = g->top + PLOT_H, right = LEFT + g->plot_w, ystep = g->ystep;
    int in_epochs = g->in_epochs, acc = g->acc;
    char buf[64];
    fputs("<g id=\"axes\">\n", f);
    for (int k = 0;; k++) {
        double v = g->lo + k * ystep;
        if (v > g->hi + ystep * 1e-6) break;
        double y = py_loss(g, v);
        fputs("<path class=\"grid\" d=\"M", f);
        num(f, LEFT, 1);
        fputc(' ', f);
        num(f, y, 1);
        fputc('H', f);
        num(f, right, 1);
        fputs("\"/>\n", f);
        tick_label(v, ystep, g->hi, buf, sizeof buf);
        draw_text(f, LEFT - 6, y + 4, "text-anchor=\"end\"", buf);
    }
    double xstep = tick_step(g->x1 - g->x0, 10);
    if (in_epochs && xstep < 1 && g->x1 - g->x0 >= 2) xstep = 1; /* whole epochs */
    for (double v = ceil(g->x0 / xstep - 1e-9) * xstep; v <= g->x1 + xstep * 1e-6; v += xstep) {
        double x = LEFT + g->plot_w * (v - g->x0) / (g->x1 - g->x0);
        fputs("<path class=\"frame\" d=\"M", f);
        num(f, x, 1);
        fputc(' ', f);
        num(f, bottom, 1);
        fputs("v4\"/>\n", f);
        tick_label(v, xstep, g->x1, buf, sizeof buf);
        draw_text(f, x, bottom + 16, "text-anchor=\"middle\"", buf);
    }
    fputs("<path class=\"frame\" d=\"M", f);
    num(f, LEFT, 1);
    fputc(' ', f);
    num(f, g->top, 1);
    fputc('V', f);
    num(f, bottom, 1);
    fputc('H', f);
    num(f, right, 1);
    if (acc) {
        fputc('V', f);
        num(f, g->top, 1);
    }
    fputs("\"/>\n", f);
    if (acc)
        for (int k = 0; k <= 5; k++) {
            double y = py_acc(g, k * 0.2);
            fputs("<path class=\"frame\" d=\"M", f);
            num(f, right, 1);
            fputc(' ', f);
            num(f, y, 1);
            fputs("h4\"/>\n", f);
            snprintf(buf, sizeof buf, "%.1f", k * 0.2);
            draw_text(f, right + 8, y + 4, NULL, buf);
        }
    draw_text(f, LEFT + g->plot_w / 2, bottom + 36, "text-anchor=\"middle\"",
              in_epochs ? "epoch" : "samples seen");
    fputs("<text transform=\"translate(18 ", f);
    num(f, g->top + PLOT_H / 2, 1);
    fputs(") rotate(-90)\" text-anchor=\"middle\">loss</text>\n", f);
    if (acc) {
        fputs("<text transform=\"translate(", f);
        num(f, WIDTH - 14, 1);
        fputc(' ', f);
        num(f, g->top + PLOT_H / 2, 1);
        fputs(") rotate(90)\" text-anchor=\"middle\">test accuracy</text>\n", f);
    }
    fputs("</g>\n", f);
}

/* The training loss: one point per window of steps. */
static void draw_train(FILE *f, const ebb_cli_curve *c, const frame *g) {
    const ebb_cli_curve_info *in = &c->info;
    fprintf(f, "<polyline id=\"train-loss\" class=\"train\" data-window=\"%lld\" points=\"",
            (long long)in->window);
    for (int i = 0, first = 1; i < c->n_steps; i++)
        if (isfinite(c->steps[i].loss)) {
            put_point(f, px(g, c->steps[i].samples), py_loss(g, c->steps[i].loss), first);
            first = 0;
        }
    fprintf(f, "\"><title>training loss, the mean of every %lld step%s</title></polyline>\n",
            (long long)in->window, in->window == 1 ? "" : "s");
    /* a few points are marked: a line alone hides how few they are */
    if (c->n_steps <= 40) {
        fputs("<path class=\"dtrain\" d=\"", f);
        for (int i = 0; i < c->n_steps; i++)
            if (isfinite(c->steps[i].loss)) {
                fputc('M', f);
                put_point(f, px(g, c->steps[i].samples), py_loss(g, c->steps[i].loss), 1);
                fputs("h0", f);
            }
        fputs("\"/>\n", f);
    }
}

/* Per epoch: test loss, test accuracy, each point with its figures. */
static void draw_epochs(FILE *f, const ebb_cli_curve *c, const frame *g) {
    const ebb_cli_curve_info *in = &c->info;
    const epoch_point *last = c->n_epochs ? &c->epochs[c->n_epochs - 1] : NULL;
    int acc = g->acc;
    char buf[64];
    for (int s = 0; s < 2; s++) {
        int is_acc = s == 1;
        if (is_acc ? !acc : !in->eval) continue;
        fprintf(f, "<polyline id=\"%s\" class=\"%s\" points=\"",
                is_acc ? "test-accuracy" : "test-loss", is_acc ? "acc" : "test");
        for (int i = 0, first = 1; i < c->n_epochs; i++) {
            double v = is_acc ? c->epochs[i].test_accuracy : c->epochs[i].test_loss;
            if (!isfinite(v)) continue;
            put_point(f, px(g, c->epochs[i].samples), is_acc ? py_acc(g, v) : py_loss(g, v),
                      first);
            first = 0;
        }
        fprintf(f, "\"><title>%s after each epoch</title></polyline>\n",
                is_acc ? "test accuracy" : "test loss");
        fprintf(f, "<g id=\"%s-points\">\n", is_acc ? "test-accuracy" : "test-loss");
        for (int i = 0; i < c->n_epochs; i++) {
            const epoch_point *e = &c->epochs[i];
            double v = is_acc ? e->test_accuracy : e->test_loss;
            if (!isfinite(v)) continue;
            fprintf(f, "<circle class=\"%s\" cx=\"", is_acc ? "dacc" : "dtest");
            num(f, px(g, e->samples), 1);
            fputs("\" cy=\"", f);
            num(f, is_acc ? py_acc(g, v) : py_loss(g, v), 1);
            fprintf(f, "\" r=\"3\"><title>epoch %lld: training loss %.4f, test loss %.4f",
                    (long long)e->epoch, e->loss, e->test_loss);
            if (acc) fprintf(f, ", test accuracy %.4f", e->test_accuracy);
            fputs("</title></circle>\n", f);
        }
        fputs("</g>\n", f);
    }
    /* the last figures, written by their dots: what a reader looks for */
    if (last && acc && isfinite(last->test_accuracy)) {
        snprintf(buf, sizeof buf, "%.4f", last->test_accuracy);
        draw_text(f, px(g, last->samples) - 6, py_acc(g, last->test_accuracy) - 9,
                  "class=\"vacc\" text-anchor=\"end\"", buf);
    }
    if (last && in->eval && isfinite(last->test_loss)) {
        snprintf(buf, sizeof buf, "%.4f", last->test_loss);
        draw_text(f, px(g, last->samples) - 6, py_loss(g, last->test_loss) - 9,
                  "class=\"vtest\" text-anchor=\"end\"", buf);
    }
}

ebb_status ebb_cli_curve_write(const ebb_cli_curve *c, FILE *f) {
    const ebb_cli_curve_info *in = &c->info;
    frame g = {.f = f};
    frame_scale(c, &g);
    char title[512], sub[2][768], buf[64];
    int n_sub = headings(c, &g, title, sub);
    double bottom = g.top + PLOT_H, height = bottom + 80;

    fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
          "width=\"",
          f);
    num(f, WIDTH, 0);
    fputs("\" height=\"", f);
    num(f, height, 0);
    fputs("\" viewBox=\"0 0 ", f);
    num(f, WIDTH, 0);
    fputc(' ', f);
    num(f, height, 0);
    fprintf(f, "\" data-steps=\"%d\" data-epochs=\"%d\" data-x=\"%s\">\n", c->n_steps, c->n_epochs,
            g.in_epochs ? "epochs" : "samples");
    fputs(style, f);
    fputs("<title>learning curves of ", f);
    xml_text(f, c->name);
    fputs("</title>\n<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n", f);
    draw_text(f, LEFT, 22, "class=\"title\"", title);
    for (int k = 0; k < n_sub; k++)
        draw_text(f, LEFT, 42 + LINE_H * k, "class=\"sub\"", sub[k]);

    draw_axes(f, &g);
    draw_train(f, c, &g);
    draw_epochs(f, c, &g);

    /* the legend, under the x axis' label */
    double ly = bottom + 64, lx = LEFT;
    fputs("<g id=\"legend\">\n", f);
    snprintf(buf, sizeof buf, "training loss (mean of every %lld step%s)", (long long)in->window,
             in->window == 1 ? "" : "s");
    lx = legend_item(f, lx, ly, C_TRAIN, 0, buf);
    if (in->eval) lx = legend_item(f, lx, ly, C_TEST, 1, "test loss");
    if (g.acc) legend_item(f, lx, ly, C_ACC, 1, "test accuracy (right axis)");
    fputs("</g>\n</svg>\n", f);
    if (ferror(f))
        return ebb_error_set(EBB_ERR_IO, "--curve: cannot write the learning curves of %s",
                             c->name);
    return EBB_OK;
}

ebb_status ebb_cli_curve_save(const ebb_cli_curve *c, const char *path, const char *who) {
    ebb_file_out *w = NULL;
    ebb_status st = ebb_file_begin(&w, path, who);
    if (st != EBB_OK) return st;
    st = ebb_cli_curve_write(c, ebb_file_stream(w));
    if (st != EBB_OK && st != EBB_ERR_IO) {
        ebb_file_abort(w);
        return st;
    }
    /* a write error is the writer's to name, with its errno */
    return ebb_file_commit(w);
}
