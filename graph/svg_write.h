/* Writing SVG by hand, shared by graph/chart.c (ebb chart) and
 * src/cli/curve.c (ebb train --curve): escaping, compact numbers, text. */
#ifndef EBB_SVG_WRITE_H
#define EBB_SVG_WRITE_H

#include <stdio.h>
#include <string.h>

static inline void xml_text(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '&':
            fputs("&amp;", f);
            break;
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            /* control characters are not allowed in XML 1.0 */
            fputc((unsigned char)*s < 0x20 && *s != '\n' && *s != '\t' ? ' ' : *s, f);
        }
    }
}

/* A number with the fewest digits that still place it: "12", "12.5". */
static inline void num(FILE *f, double v, int decimals) {
    char buf[64];
    snprintf(buf, sizeof buf, "%.*f", decimals, v);
    char *dot = strchr(buf, '.');
    if (dot) {
        char *end = buf + strlen(buf) - 1;
        while (end > dot && *end == '0')
            *end-- = '\0';
        if (end == dot) *end = '\0';
    }
    fputs(strcmp(buf, "-0") ? buf : "0", f);
}

static inline void draw_text(FILE *f, double x, double y, const char *attrs, const char *text) {
    fputs("<text x=\"", f);
    num(f, x, 1);
    fputs("\" y=\"", f);
    num(f, y, 1);
    fprintf(f, "\"%s%s>", attrs ? " " : "", attrs ? attrs : "");
    xml_text(f, text);
    fputs("</text>\n", f);
}

#endif
