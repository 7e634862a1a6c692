/* Levenshtein distance, capped (src/edit_distance.c). */
#ifndef EBB_EDIT_DISTANCE_H
#define EBB_EDIT_DISTANCE_H

/* The edits (insert, delete, replace a character) that make a into b, or
 * cap + 1 as soon as it must be more than cap (and for strings over 64
 * characters). */
int ebb_edit_distance(const char *a, const char *b, int cap);

#endif
