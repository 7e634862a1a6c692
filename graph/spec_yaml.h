/* Shared by the spec loader's files: a small YAML tree with positions, built
 * from libyaml events under explicit limits, and the arena that owns it. */
#ifndef EBB_SPEC_YAML_H
#define EBB_SPEC_YAML_H

#include <stddef.h>

#include "ebb/spec.h"

/* ---- arena: every tree node and string of one load, freed at once ------- */

typedef struct arena_chunk arena_chunk;
typedef struct arena {
    arena_chunk *head;
} arena;

void *ebb_arena_alloc(arena *a, size_t n); /* zeroed; NULL when out of memory */
char *ebb_arena_strndup(arena *a, const char *s, size_t n);
char *ebb_arena_strdup(arena *a, const char *s);
void ebb_arena_free(arena *a);

/* ---- the YAML tree -------------------------------------------------------- */

typedef enum ynode_kind { Y_SCALAR, Y_SEQ, Y_MAP } ynode_kind;

typedef struct ynode ynode;
struct ynode {
    ynode_kind kind;
    int line, col; /* 1-based */
    /* Y_SCALAR */
    const char *text; /* NUL-terminated; scalars with NUL bytes are rejected */
    size_t len;
    int plain; /* written without quotes or block style: may be a number */
    /* Y_SEQ: items[0..n-1]; Y_MAP: keys items[2i], values items[2i+1], n pairs */
    ynode **items;
    int n;
};

static inline const ynode *ymap_key(const ynode *m, int i) { return m->items[2 * i]; }
static inline const ynode *ymap_value(const ynode *m, int i) { return m->items[2 * i + 1]; }
/* The value for `key` in map m, or NULL (keys are unique once parsed). */
const ynode *ebb_ymap_get(const ynode *m, const char *key);

/* Parses `len` bytes of YAML into a tree allocated in `a`. On success returns
 * 0 and sets *root (NULL for an empty stream). On failure returns -1 with
 * "FILE:LINE:COL: error: MESSAGE" in err. Enforces EBB_SPEC_MAX_DEPTH and
 * EBB_SPEC_MAX_YAML_NODES; rejects anchors, aliases, tags, merge keys,
 * duplicate keys, non-scalar keys, NUL bytes and a second document. */
int ebb_spec_yaml_parse(arena *a, const char *text, size_t len, const char *file, ynode **root,
                    char *err, size_t err_size);


#endif
