/* A strict little well-formedness check for the XML ebb writes (SVG charts):
 * one root element, every tag closed in order, attributes quoted and not
 * repeated, only the five named entities and numeric references, no stray
 * '<' or '&' in text or attribute values, no control characters. No DTDs,
 * CDATA or namespaces checks: ebb writes none of those. */
#ifndef EBB_TEST_XML_H
#define EBB_TEST_XML_H

#include <stdio.h>
#include <string.h>

static inline int xml_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
static inline int xml_name_char(char c) {
    return xml_name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '.';
}
static inline int xml_space(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

/* At an '&': the length of a valid reference, or 0. */
static inline size_t xml_reference(const char *s, const char *end) {
    static const char *const named[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
    for (int i = 0; i < 5; i++) {
        size_t n = strlen(named[i]);
        if ((size_t)(end - s) >= n && !memcmp(s, named[i], n)) return n;
    }
    if (end - s >= 4 && s[1] == '#') {
        const char *p = s + 2;
        int hex = *p == 'x';
        p += hex;
        const char *digits = p;
        while (p < end && ((*p >= '0' && *p <= '9') ||
                           (hex && ((*p >= 'a' && *p <= 'f') || (*p >= 'A' && *p <= 'F')))))
            p++;
        if (p > digits && p < end && *p == ';') return (size_t)(p - s + 1);
    }
    return 0;
}

/* Character data up to the next '<' (or a quote, in an attribute). */
static inline const char *xml_chars(const char *p, const char *end, char stop, char *err,
                                    size_t size, const char *base) {
    for (; p < end && *p != stop && *p != '<'; p++) {
        if ((unsigned char)*p < 0x20 && !xml_space(*p)) {
            snprintf(err, size, "byte %ld: control character 0x%02x", (long)(p - base), *p);
            return NULL;
        }
        if (*p == '&') {
            size_t n = xml_reference(p, end);
            if (!n) {
                snprintf(err, size, "byte %ld: '&' that starts no reference", (long)(p - base));
                return NULL;
            }
            p += n - 1;
        }
    }
    return p;
}

/* NULL when `text` is well-formed; else what is wrong, and where. */
static inline const char *xml_check(const char *text, size_t len) {
    static char err[256];
    const char *p = text, *end = text + len;
    char stack[64][64];
    int depth = 0, roots = 0;
    if (len >= 5 && !memcmp(p, "<?xml", 5)) {
        const char *q = strstr(p, "?>");
        if (!q) return "an unclosed <?xml declaration";
        p = q + 2;
    }
    while (p < end) {
        if (*p != '<') {
            const char *q = xml_chars(p, end, '<', err, sizeof err, text);
            if (!q) return err;
            if (depth == 0)
                for (const char *c = p; c < q; c++)
                    if (!xml_space(*c)) {
                        snprintf(err, sizeof err, "byte %ld: text outside the root element",
                                 (long)(c - text));
                        return err;
                    }
            p = q;
            continue;
        }
        if (end - p >= 4 && !memcmp(p, "<!--", 4)) {
            const char *q = strstr(p + 4, "-->");
            if (!q) return "an unclosed comment";
            p = q + 3;
            continue;
        }
        int closing = p[1] == '/';
        const char *n = p + 1 + closing;
        if (n >= end || !xml_name_start(*n)) {
            snprintf(err, sizeof err, "byte %ld: '<' that starts no tag", (long)(p - text));
            return err;
        }
        const char *ne = n;
        while (ne < end && xml_name_char(*ne))
            ne++;
        size_t nlen = (size_t)(ne - n);
        if (nlen >= 64) return "a tag name longer than 63 characters";
        p = ne;
        if (closing) {
            while (p < end && xml_space(*p))
                p++;
            if (p >= end || *p != '>') {
                snprintf(err, sizeof err, "byte %ld: a closing tag without '>'", (long)(p - text));
                return err;
            }
            if (depth == 0 || strlen(stack[depth - 1]) != nlen ||
                memcmp(stack[depth - 1], n, nlen)) {
                snprintf(err, sizeof err, "byte %ld: </%.*s> closes <%s>", (long)(n - text),
                         (int)nlen, n, depth ? stack[depth - 1] : "(nothing)");
                return err;
            }
            depth--;
            p++;
            continue;
        }
        /* attributes */
        char names[64][64];
        int n_attr = 0;
        for (;;) {
            int spaced = 0;
            while (p < end && xml_space(*p)) {
                p++;
                spaced = 1;
            }
            if (p >= end) return "a tag that never ends";
            if (*p == '>' || (*p == '/' && p + 1 < end && p[1] == '>')) break;
            if (!spaced || !xml_name_start(*p)) {
                snprintf(err, sizeof err, "byte %ld: a bad attribute in <%.*s>", (long)(p - text),
                         (int)nlen, n);
                return err;
            }
            const char *an = p;
            while (p < end && xml_name_char(*p))
                p++;
            size_t alen = (size_t)(p - an);
            for (int k = 0; k < n_attr; k++)
                if (strlen(names[k]) == alen && !memcmp(names[k], an, alen)) {
                    snprintf(err, sizeof err, "byte %ld: attribute %.*s repeated",
                             (long)(an - text), (int)alen, an);
                    return err;
                }
            if (n_attr < 64 && alen < 64) {
                memcpy(names[n_attr], an, alen);
                names[n_attr++][alen] = '\0';
            }
            if (p + 1 >= end || *p != '=' || (p[1] != '"' && p[1] != '\'')) {
                snprintf(err, sizeof err, "byte %ld: attribute %.*s without a quoted value",
                         (long)(an - text), (int)alen, an);
                return err;
            }
            char quote = p[1];
            const char *v = xml_chars(p + 2, end, quote, err, sizeof err, text);
            if (!v) return err;
            if (v >= end || *v != quote) {
                snprintf(err, sizeof err, "byte %ld: '<' in the value of %.*s", (long)(v - text),
                         (int)alen, an);
                return err;
            }
            p = v + 1;
        }
        int empty = *p == '/';
        p += empty ? 2 : 1;
        if (depth == 0 && ++roots > 1) return "more than one root element";
        if (!empty) {
            if (depth == 64) return "elements nested more than 64 deep";
            memcpy(stack[depth], n, nlen);
            stack[depth++][nlen] = '\0';
        }
    }
    if (depth) {
        snprintf(err, sizeof err, "<%s> is never closed", stack[depth - 1]);
        return err;
    }
    return roots == 1 ? NULL : "no root element";
}

/* How often `needle` occurs in text. */
static inline int xml_count(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

#endif
