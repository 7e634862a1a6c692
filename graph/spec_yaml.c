/* YAML text -> a position-annotated tree, through libyaml's event API. The
 * event API lets us refuse things as they arrive (an alias, a 65th level of
 * nesting, the 100001st node) instead of after libyaml has built them all. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "spec_yaml.h"

/* ---- arena ------------------------------------------------------------------ */

struct arena_chunk {
    arena_chunk *next;
    size_t used, size;
    max_align_t data[];
};

#define ARENA_CHUNK (64 * 1024)

void *ebb_arena_alloc(arena *a, size_t n) {
    size_t align = sizeof(max_align_t);
    n = (n + align - 1) / align * align;
    if (n == 0)
        n = align;
    arena_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > ARENA_CHUNK ? n : ARENA_CHUNK;
        c = malloc(sizeof *c + size);
        if (!c)
            return NULL;
        c->size = size;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *ebb_arena_strndup(arena *a, const char *s, size_t n) {
    if (n >= SIZE_MAX / 2)
        return NULL;
    char *d = ebb_arena_alloc(a, n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

char *ebb_arena_strdup(arena *a, const char *s) { return ebb_arena_strndup(a, s, strlen(s)); }

void ebb_arena_free(arena *a) {
    arena_chunk *c = a->head;
    while (c) {
        arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
}

/* ---- helpers ------------------------------------------------------------------ */

const ynode *ebb_ymap_get(const ynode *m, const char *key) {
    if (!m || m->kind != Y_MAP)
        return NULL;
    for (int i = 0; i < m->n; i++)
        if (strcmp(ymap_key(m, i)->text, key) == 0)
            return ymap_value(m, i);
    return NULL;
}

/* ---- the event loop --------------------------------------------------------------- */

typedef struct frame {
    ynode *node;  /* the open list or map */
    size_t start; /* its first child on the pending stack */
} frame;

typedef struct tree_parser {
    arena *a;
    const char *file;
    char *err;
    size_t err_size;
    ynode **pending; /* children of open collections, innermost last */
    size_t n_pending, cap_pending;
    frame frames[EBB_SPEC_MAX_DEPTH];
    int depth;
    long nodes;
} tree_parser;

static int perr(tree_parser *tp, int line, int col, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static int perr(tree_parser *tp, int line, int col, const char *fmt, ...) {
    int k = snprintf(tp->err, tp->err_size, "%s:%d:%d: error: ", tp->file, line, col);
    if (k < 0 || (size_t)k >= tp->err_size)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tp->err + k, tp->err_size - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static int push_pending(tree_parser *tp, ynode *n) {
    if (tp->n_pending == tp->cap_pending) {
        size_t cap = tp->cap_pending ? tp->cap_pending * 2 : 64;
        ynode **p = realloc(tp->pending, cap * sizeof *p);
        if (!p)
            return -1;
        tp->pending = p;
        tp->cap_pending = cap;
    }
    tp->pending[tp->n_pending++] = n;
    return 0;
}

static ynode *new_node(tree_parser *tp, ynode_kind kind, yaml_mark_t mark) {
    if (++tp->nodes > EBB_SPEC_MAX_YAML_NODES) {
        perr(tp, (int)mark.line + 1, (int)mark.column + 1,
             "the spec has more than %d YAML nodes (the limit)", EBB_SPEC_MAX_YAML_NODES);
        return NULL;
    }
    ynode *n = ebb_arena_alloc(tp->a, sizeof *n);
    if (!n) {
        perr(tp, (int)mark.line + 1, (int)mark.column + 1, "out of memory");
        return NULL;
    }
    n->kind = kind;
    n->line = (int)mark.line + 1;
    n->col = (int)mark.column + 1;
    return n;
}

/* Anchors, aliases and explicit tags are refused wherever they appear. */
static int check_props(tree_parser *tp, const yaml_char_t *anchor, const yaml_char_t *tag,
                       yaml_mark_t mark) {
    if (anchor)
        return perr(tp, (int)mark.line + 1, (int)mark.column + 1,
                     "anchors (&%.64s) and aliases are not supported in specs; use blocks",
                     (const char *)anchor);
    if (tag)
        return perr(tp, (int)mark.line + 1, (int)mark.column + 1,
                    "YAML tags (%.64s) are not supported in specs", (const char *)tag);
    return 0;
}

typedef struct key_ref {
    const ynode *key;
    int index;
} key_ref;

static int key_cmp(const void *pa, const void *pb) {
    const key_ref *a = pa, *b = pb;
    int c = strcmp(a->key->text, b->key->text);
    return c ? c : (a->index > b->index) - (a->index < b->index);
}

/* Checks the keys of a finished map: scalars, no `<<`, no duplicates. Sorting
 * keeps a map with thousands of keys from taking quadratic time. */
static int check_map_keys(tree_parser *tp, const ynode *m) {
    for (int i = 0; i < m->n; i++) {
        const ynode *k = ymap_key(m, i);
        if (k->kind != Y_SCALAR)
            return perr(tp, k->line, k->col, "map keys must be plain names, not %s",
                        k->kind == Y_SEQ ? "lists" : "maps");
        if (k->plain && strcmp(k->text, "<<") == 0)
            return perr(tp, k->line, k->col, "merge keys (<<) are not supported in specs");
    }
    if (m->n < 2)
        return 0;
    key_ref *refs = malloc((size_t)m->n * sizeof *refs);
    if (!refs)
        return perr(tp, m->line, m->col, "out of memory");
    for (int i = 0; i < m->n; i++)
        refs[i] = (key_ref){ymap_key(m, i), i};
    qsort(refs, (size_t)m->n, sizeof *refs, key_cmp);
    /* report the duplicate that comes first in the file */
    const ynode *dup = NULL, *first = NULL;
    int dup_index = m->n;
    for (int i = 1; i < m->n; i++)
        if (strcmp(refs[i].key->text, refs[i - 1].key->text) == 0 && refs[i].index < dup_index) {
            int j = i - 1;
            while (j > 0 && strcmp(refs[j - 1].key->text, refs[i].key->text) == 0)
                j--;
            dup = refs[i].key;
            first = refs[j].key;
            dup_index = refs[i].index;
        }
    free(refs);
    if (dup)
        return perr(tp, dup->line, dup->col, "duplicate key '%.64s' (first at line %d, column %d)",
                    dup->text, first->line, first->col);
    return 0;
}

static int attach(tree_parser *tp, ynode *n, ynode **root) {
    if (tp->depth == 0) {
        *root = n;
        return 0;
    }
    if (push_pending(tp, n) != 0)
        return perr(tp, n->line, n->col, "out of memory");
    return 0;
}

static int open_collection(tree_parser *tp, ynode_kind kind, yaml_mark_t mark, ynode **root) {
    (void)root;
    if (tp->depth == EBB_SPEC_MAX_DEPTH)
        return perr(tp, (int)mark.line + 1, (int)mark.column + 1,
                    "lists and maps are nested more than %d deep (the limit)", EBB_SPEC_MAX_DEPTH);
    ynode *n = new_node(tp, kind, mark);
    if (!n)
        return -1;
    tp->frames[tp->depth].node = n;
    tp->frames[tp->depth].start = tp->n_pending;
    tp->depth++;
    return 0;
}

static int close_collection(tree_parser *tp, ynode **root) {
    frame *f = &tp->frames[--tp->depth];
    ynode *n = f->node;
    size_t count = tp->n_pending - f->start;
    if (count > 0) {
        n->items = ebb_arena_alloc(tp->a, count * sizeof *n->items);
        if (!n->items)
            return perr(tp, n->line, n->col, "out of memory");
        memcpy(n->items, tp->pending + f->start, count * sizeof *n->items);
    }
    tp->n_pending = f->start;
    n->n = (int)(n->kind == Y_MAP ? count / 2 : count);
    if (n->kind == Y_MAP && check_map_keys(tp, n) != 0)
        return -1;
    return attach(tp, n, root);
}

int ebb_spec_yaml_parse(arena *a, const char *text, size_t len, const char *file, ynode **root,
                    char *err, size_t err_size) {
    tree_parser tp = {.a = a, .file = file, .err = err, .err_size = err_size};
    *root = NULL;
    if (memchr(text, '\0', len)) {
        /* libyaml would stop at it silently in places; say where it is */
        const char *z = memchr(text, '\0', len);
        int line = 1, col = 1;
        for (const char *p = text; p < z; p++) {
            if (*p == '\n') {
                line++;
                col = 1;
            } else if (((unsigned char)*p & 0xC0) != 0x80) {
                col++;
            }
        }
        return perr(&tp, line, col, "the spec contains a NUL byte");
    }
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return perr(&tp, 1, 1, "out of memory");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    int documents = 0, rc = 0, done = 0;
    while (!done && rc == 0) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            yaml_mark_t m = parser.problem_mark;
            if (parser.error == YAML_MEMORY_ERROR) {
                rc = perr(&tp, 1, 1, "out of memory");
            } else if (parser.error == YAML_READER_ERROR) {
                /* reader errors carry a byte offset, not a mark */
                int line = 1, col = 1;
                size_t end = parser.problem_offset < len ? parser.problem_offset : len;
                for (size_t i = 0; i < end; i++) {
                    if (text[i] == '\n') {
                        line++;
                        col = 1;
                    } else if (((unsigned char)text[i] & 0xC0) != 0x80) {
                        col++;
                    }
                }
                if (parser.problem_value >= 0)
                    rc = perr(&tp, line, col, "YAML: %s (byte 0x%02X)",
                              parser.problem ? parser.problem : "unreadable input",
                              (unsigned)parser.problem_value & 0xFFu);
                else
                    rc = perr(&tp, line, col, "YAML: %s",
                              parser.problem ? parser.problem : "unreadable input");
            }
            else if (parser.context && parser.context_mark.line != m.line)
                rc = perr(&tp, (int)m.line + 1, (int)m.column + 1,
                          "YAML syntax: %s (%s that started at line %d)",
                          parser.problem ? parser.problem : "error", parser.context,
                          (int)parser.context_mark.line + 1);
            else if (parser.context)
                rc = perr(&tp, (int)m.line + 1, (int)m.column + 1, "YAML syntax: %s (%s)",
                          parser.problem ? parser.problem : "error", parser.context);
            else
                rc = perr(&tp, (int)m.line + 1, (int)m.column + 1, "YAML syntax: %s",
                          parser.problem ? parser.problem : "error");
            break;
        }
        yaml_mark_t mark = ev.start_mark;
        ynode *n;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT: done = 1; break;
        case YAML_DOCUMENT_START_EVENT:
            if (++documents > 1)
                rc = perr(&tp, (int)mark.line + 1, (int)mark.column + 1,
                          "a spec is one YAML document; found a second one");
            break;
        case YAML_ALIAS_EVENT:
            rc = perr(&tp, (int)mark.line + 1, (int)mark.column + 1,
                      "aliases (*%.64s) and anchors are not supported in specs; use blocks",
                      (const char *)ev.data.alias.anchor);
            break;
        case YAML_SCALAR_EVENT:
            if ((rc = check_props(&tp, ev.data.scalar.anchor, ev.data.scalar.tag, mark)) != 0)
                break;
            if (!(n = new_node(&tp, Y_SCALAR, mark))) {
                rc = -1;
                break;
            }
            n->text = ebb_arena_strndup(a, (const char *)ev.data.scalar.value, ev.data.scalar.length);
            if (!n->text) {
                rc = perr(&tp, n->line, n->col, "out of memory");
                break;
            }
            if (memchr(ev.data.scalar.value, '\0', ev.data.scalar.length)) {
                rc = perr(&tp, n->line, n->col, "a scalar contains a NUL character");
                break;
            }
            n->len = ev.data.scalar.length;
            n->plain = ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
            rc = attach(&tp, n, root);
            break;
        case YAML_SEQUENCE_START_EVENT:
            if ((rc = check_props(&tp, ev.data.sequence_start.anchor, ev.data.sequence_start.tag,
                                  mark)) == 0)
                rc = open_collection(&tp, Y_SEQ, mark, root);
            break;
        case YAML_MAPPING_START_EVENT:
            if ((rc = check_props(&tp, ev.data.mapping_start.anchor, ev.data.mapping_start.tag,
                                  mark)) == 0)
                rc = open_collection(&tp, Y_MAP, mark, root);
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT: rc = close_collection(&tp, root); break;
        default: break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    free(tp.pending);
    return rc;
}
