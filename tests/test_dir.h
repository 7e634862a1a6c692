/* A test group's scratch directory and a file reader, for the tests that
 * write files. Include
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

/* The whole file at `path` in a new buffer (free it), one byte longer than
 * its *n bytes; a file that cannot be read fails the test. */
static inline unsigned char *ebb_test_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)len + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return buf;
}

#endif
