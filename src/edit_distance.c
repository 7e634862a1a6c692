/* Levenshtein distance for "did you mean" hints: the spec loader's unknown
 * names, the CLI's unknown options and dataset names. Compiled into the
 * library and, as fileio.c is, into the `ebb` command, which cannot see the
 * library's hidden symbols. */
#include <string.h>

#include "edit_distance.h"

int ebb_edit_distance(const char *a, const char *b, int cap) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return cap + 1;
    if ((la > lb ? la - lb : lb - la) > (size_t)cap)
        return cap + 1;
    int row[65];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0], best = row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int v = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < v)
                v = up + 1;
            if (row[j - 1] + 1 < v)
                v = row[j - 1] + 1;
            row[j] = v;
            diag = up;
            if (v < best)
                best = v;
        }
        if (best > cap)
            return cap + 1;
    }
    return row[lb];
}
