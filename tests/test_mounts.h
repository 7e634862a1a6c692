/* For tests that need a filesystem of their own (a full or read-only tmpfs):
 * a forked child enters a private mount namespace, as root or, for other
 * users, as root of a user namespace of its own, which may mount a tmpfs.
 * Include after defining _GNU_SOURCE (unshare, CLONE_NEWNS). */
#ifndef EBB_TEST_MOUNTS_H
#define EBB_TEST_MOUNTS_H

#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

/* Returns 0 once mounts made by this process are private to it, -1 when
 * this machine does not allow that. Call it in a forked child only. */
static inline int ebb_test_private_mounts(void) {
    uid_t uid = geteuid();
    gid_t gid = getegid();
    if (uid == 0 ? unshare(CLONE_NEWNS) != 0 : unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0)
        return -1;
    if (uid != 0) {
        static const char *const files[] = {"/proc/self/setgroups", "/proc/self/uid_map",
                                            "/proc/self/gid_map"};
        char text[3][64];
        snprintf(text[0], sizeof text[0], "deny");
        snprintf(text[1], sizeof text[1], "0 %u 1", (unsigned)uid);
        snprintf(text[2], sizeof text[2], "0 %u 1", (unsigned)gid);
        for (int i = 0; i < 3; i++) {
            int fd = open(files[i], O_WRONLY);
            ssize_t len = (ssize_t)strlen(text[i]);
            int ok = fd >= 0 && write(fd, text[i], (size_t)len) == len;
            if (fd >= 0)
                close(fd);
            /* setgroups is missing on old kernels; the maps are not optional */
            if (!ok && i > 0)
                return -1;
        }
    }
    return mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 ? 0 : -1;
}

#endif
