/* A test group's scratch directory, for the tests that write files. Include
 * it after test_util.h, in a file that asks for POSIX 2008 (mkdtemp) with
 * _POSIX_C_SOURCE or _GNU_SOURCE before its first #include. */
#ifndef EBB_TEST_DIR_H
#define EBB_TEST_DIR_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Makes /tmp/ebb_test_NAME_XXXXXX in `dir` (0 on success: a group setup);
 * removes it with the files and empty directories in it (a group teardown). */
static inline int ebb_test_dir_make(char *dir, size_t size, const char *name) {
    snprintf(dir, size, "/tmp/ebb_test_%s_XXXXXX", name);
    return mkdtemp(dir) ? 0 : -1;
}

static inline int ebb_test_dir_remove(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (unlink(p) != 0)
            rmdir(p);
    }
    closedir(d);
    rmdir(dir);
    return 0;
}

#endif
