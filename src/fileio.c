/* Opening files to read and writing files: see fileio.h for the rules. The
 * writer is a stdio stream over a cookie, so that the errno of the first
 * failed write() survives until commit reports it (a plain FILE keeps only
 * an error flag). Every file operation of a write passes
 * ebb_file_fault_point() first, where the tests make it fail. */
#define _GNU_SOURCE /* fopencookie */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fileio.h"

/* Links followed before giving up, as the kernel does (ELOOP). */
#define MAX_LINK_HOPS 40

const char *ebb_file_kind_name(unsigned mode) {
    switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
    default: return "not a regular file";
    }
}

ebb_status ebb_file_open_read(int *fd, int64_t *size, const char *path, const char *who) {
    *fd = -1;
    if (size)
        *size = 0;
    /* O_NONBLOCK: a FIFO would otherwise block open() until a writer comes,
     * before fstat could tell what it is */
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (f < 0)
        return ebb_error_set(EBB_ERR_IO, "%s: cannot open '%s': %s", who, path, strerror(errno));
    struct stat sb;
    if (fstat(f, &sb) != 0) {
        int e = errno;
        close(f);
        return ebb_error_set(EBB_ERR_IO, "%s: cannot stat '%s': %s", who, path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(f);
        return ebb_error_set(EBB_ERR_IO, "%s: '%s' is %s, not a regular file", who, path,
                             ebb_file_kind_name(sb.st_mode));
    }
    int flags = fcntl(f, F_GETFL);
    if (flags >= 0)
        (void)fcntl(f, F_SETFL, flags & ~O_NONBLOCK);
    *fd = f;
    if (size)
        *size = (int64_t)sb.st_size;
    return EBB_OK;
}

/* ---- where a path leads ------------------------------------------------------ */

typedef enum target_kind {
    TARGET_NEW,    /* nothing there yet: create it */
    TARGET_FILE,   /* a regular file: replace it */
    TARGET_STREAM, /* a character device or a pipe: write into it */
} target_kind;

typedef struct target {
    char path[PATH_MAX]; /* the links followed: the file to create, replace or open */
    struct stat sb;      /* of that file, when it exists */
    target_kind kind;
} target;

/* /proc/self/fd/N and friends are links the kernel resolves to an open file,
 * which may have no path (a pipe) or a deleted one: only stat() and open()
 * through the link itself reach what the descriptor holds. */
static int is_fd_link(const char *p) {
    if (!strncmp(p, "/dev/fd/", 8) || !strncmp(p, "/proc/self/fd/", 14) ||
        !strncmp(p, "/proc/thread-self/fd/", 21))
        return 1;
    if (strncmp(p, "/proc/", 6) != 0)
        return 0;
    const char *q = p + 6;
    if (*q < '0' || *q > '9')
        return 0;
    while (*q >= '0' && *q <= '9')
        q++;
    return !strncmp(q, "/fd/", 4);
}

/* The directory part of a path: "a/b" -> "a", "b" -> ".", "/b" -> "/". */
static void dir_of(const char *path, char *dir, size_t size) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, size, ".");
    else if (slash == path)
        snprintf(dir, size, "/");
    else
        snprintf(dir, size, "%.*s", (int)(slash - path), path);
}

/* " (a link to 'T')" when links were followed, else "". */
static const char *via(const target *t, const char *path, char *buf, size_t size) {
    if (strcmp(t->path, path) == 0)
        return "";
    snprintf(buf, size, " (a link to '%s')", t->path);
    return buf;
}

static ebb_status resolve(target *t, const char *path, const char *who) {
    if (!path || !path[0])
        return ebb_error_set(EBB_ERR_ARG, "%s: the output path is empty", who);
    if (strlen(path) >= sizeof t->path)
        return ebb_error_set(EBB_ERR_IO, "%s: cannot write '%s': %s", who, path,
                             strerror(ENAMETOOLONG));
    snprintf(t->path, sizeof t->path, "%s", path);
    for (int hops = 0;; hops++) {
        if (hops > MAX_LINK_HOPS)
            return ebb_error_set(EBB_ERR_IO, "%s: cannot write '%s': %s", who, path,
                                 strerror(ELOOP));
        if (is_fd_link(t->path)) {
            if (stat(t->path, &t->sb) != 0)
                return ebb_error_set(EBB_ERR_IO, "%s: cannot write '%s': %s", who, path,
                                     strerror(errno));
            /* whatever the descriptor holds, even a regular file, is written
             * through it: it has no name to rename onto */
            if (S_ISDIR(t->sb.st_mode))
                break;
            t->kind = TARGET_STREAM;
            return EBB_OK;
        }
        if (lstat(t->path, &t->sb) != 0) {
            if (errno == ENOENT) {
                t->kind = TARGET_NEW;
                return EBB_OK;
            }
            return ebb_error_set(EBB_ERR_IO, "%s: cannot write '%s': %s", who, path,
                                 strerror(errno));
        }
        if (!S_ISLNK(t->sb.st_mode))
            break;
        char link[PATH_MAX], next[PATH_MAX], dir[PATH_MAX];
        ssize_t n = readlink(t->path, link, sizeof link - 1);
        if (n < 0)
            return ebb_error_set(EBB_ERR_IO, "%s: cannot read the link '%s': %s", who, t->path,
                                 strerror(errno));
        link[n] = '\0';
        dir_of(t->path, dir, sizeof dir);
        int w = link[0] == '/' ? snprintf(next, sizeof next, "%s", link)
                               : snprintf(next, sizeof next, "%s/%s", dir, link);
        if (w < 0 || (size_t)w >= sizeof next)
            return ebb_error_set(EBB_ERR_IO, "%s: cannot write '%s': %s", who, path,
                                 strerror(ENAMETOOLONG));
        memcpy(t->path, next, (size_t)w + 1);
    }
    if (S_ISREG(t->sb.st_mode)) {
        t->kind = TARGET_FILE;
        return EBB_OK;
    }
    if (S_ISCHR(t->sb.st_mode) || S_ISFIFO(t->sb.st_mode)) {
        t->kind = TARGET_STREAM;
        return EBB_OK;
    }
    char vb[PATH_MAX + 32];
    return ebb_error_set(EBB_ERR_IO,
                         "%s: cannot write '%s'%s: it is %s; ebb replaces regular files and "
                         "writes into character devices and pipes, nothing else",
                         who, path, via(t, path, vb, sizeof vb), ebb_file_kind_name(t->sb.st_mode));
}

/* The directory that will hold the new file exists and accepts files. */
static ebb_status check_dir(const target *t, const char *path, const char *who) {
    char dir[PATH_MAX], vb[PATH_MAX + 32];
    struct stat sb;
    dir_of(t->path, dir, sizeof dir);
    if (stat(dir, &sb) != 0)
        return ebb_error_set(EBB_ERR_IO, "%s: cannot write '%s'%s: directory '%s': %s", who, path,
                             via(t, path, vb, sizeof vb), dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return ebb_error_set(EBB_ERR_IO, "%s: cannot write '%s'%s: '%s' is %s, not a directory",
                             who, path, via(t, path, vb, sizeof vb), dir,
                             ebb_file_kind_name(sb.st_mode));
    if (access(dir, W_OK | X_OK) != 0)
        return ebb_error_set(EBB_ERR_IO,
                             "%s: cannot write '%s'%s: cannot create files in directory '%s': %s",
                             who, path, via(t, path, vb, sizeof vb), dir, strerror(errno));
    return EBB_OK;
}

ebb_status ebb_file_check_writable(const char *path, const char *who) {
    target t;
    ebb_status s = resolve(&t, path, who);
    if (s != EBB_OK)
        return s;
    if (t.kind != TARGET_STREAM)
        return check_dir(&t, path, who);
    /* Not opened: a FIFO's reader would see an end of file. */
    if (access(t.path, W_OK) != 0)
        return ebb_error_set(EBB_ERR_IO, "%s: cannot write '%s': %s", who, path, strerror(errno));
    return EBB_OK;
}

/* ---- the writer ------------------------------------------------------------------- */

struct ebb_file_out {
    FILE *f;
    int fd;
    int err; /* errno of the first failed write, 0 if none */
    int in_place;
    int slot; /* in the registry of temporaries in flight, or -1 */
    const char *who;
    char *path; /* as given, for messages */
    char *tmp;  /* the temporary file, renamed onto target.path at commit */
    target t;
};

/* A failure returns the bytes written before it, 0 when none, never -1:
 * glibc (2.36) takes a -1 from a cookie's write for a count when fwrite
 * passes a large buffer straight through, and copies past the end of its
 * own buffer. A short count sets the stream's error flag just the same, and
 * w->err keeps the errno for commit. */
static ssize_t cookie_write(void *cookie, const char *buf, size_t size) {
    ebb_file_out *w = cookie;
    size_t done = 0;
    while (done < size) {
        int injected = ebb_file_fault_point();
        ssize_t n = injected ? -1 : write(w->fd, buf + done, size - done);
        if (injected)
            errno = injected;
        else if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (!w->err)
                w->err = n < 0 ? errno : EIO;
            break;
        }
        done += (size_t)n;
    }
    return (ssize_t)done;
}

static int cookie_close(void *cookie) {
    (void)cookie; /* the descriptor is closed by commit or abort */
    return 0;
}

static void writer_free(ebb_file_out *w) {
    free(w->path);
    free(w->tmp);
    free(w);
}

static const char SUFFIX_CHARS[] = "abcdefghijklmnopqrstuvwxyz0123456789";

/* The PID in NAME when NAME is BASE.tmp.PID.XXXXXX, else 0. */
static pid_t temp_pid(const char *name, const char *base, size_t blen) {
    if (strncmp(name, base, blen) != 0 || strncmp(name + blen, ".tmp.", 5) != 0)
        return 0;
    const char *p = name + blen + 5, *q = p;
    long long pid = 0;
    while (*q >= '0' && *q <= '9' && q - p < 10)
        pid = pid * 10 + (*q++ - '0');
    if (q == p || *p == '0' || *q != '.' || pid > INT_MAX)
        return 0;
    q++;
    if (strlen(q) != 6 || strspn(q, SUFFIX_CHARS) != 6)
        return 0;
    return (pid_t)pid;
}

/* Removes the temporaries of this target that killed writers left (see
 * fileio.h for when one is stale). Best effort: whatever cannot be looked at
 * is left. */
static void remove_stale(const target *t) {
    char dir[PATH_MAX];
    dir_of(t->path, dir, sizeof dir);
    const char *slash = strrchr(t->path, '/'), *base = slash ? slash + 1 : t->path;
    size_t blen = strlen(base);
    DIR *d = opendir(dir);
    if (!d)
        return;
    int dfd = dirfd(d);
    pid_t self = getpid();
    time_t now = time(NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        pid_t pid = temp_pid(e->d_name, base, blen);
        /* EPERM: a live process of another user */
        if (pid <= 0 || pid == self || kill(pid, 0) == 0 || errno != ESRCH)
            continue;
        struct stat sb;
        if (fstatat(dfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode) ||
            sb.st_mtime > now - EBB_FILE_STALE_SECONDS)
            continue;
        int fd = openat(dfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0)
            continue;
        /* a lock held: a live writer whose PID means nothing here; no locks
         * on this filesystem (ENOLCK, EINVAL): the PID and the age decide */
        if (flock(fd, LOCK_EX | LOCK_NB) == 0 || (errno != EWOULDBLOCK && errno != EINTR))
            unlinkat(dfd, e->d_name, 0);
        close(fd);
    }
    closedir(d);
}

/* Creates w->tmp (n bytes) as TARGET.tmp.PID.XXXXXX, a name no file has yet. */
static int open_temp(ebb_file_out *w, size_t n, mode_t mode) {
    static atomic_uint counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 20);
    for (int attempt = 0; attempt < 100; attempt++) {
        uint64_t x = seed + 0x9e3779b97f4a7c15ULL * (atomic_fetch_add(&counter, 1) + 1u);
        char suffix[7];
        for (int i = 0; i < 6; i++, x /= 36)
            suffix[i] = SUFFIX_CHARS[x % 36];
        suffix[6] = '\0';
        snprintf(w->tmp, n, "%s.tmp.%d.%s", w->t.path, (int)getpid(), suffix);
        int fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    return -1;
}

/* A new file next to the target, never replacing anything, named with this
 * process's PID and locked while it is written (see remove_stale); mode as
 * open(2) takes it (the umask applies). On failure w->tmp is NULL: no file
 * of ours for abort to remove. */
static int create_temp(ebb_file_out *w, mode_t mode) {
    size_t n = strlen(w->t.path) + 32;
    w->tmp = malloc(n);
    if (!w->tmp) {
        errno = ENOMEM;
        return -1;
    }
    int fd = -1, injected = ebb_file_fault_point();
    if (injected)
        errno = injected;
    else
        fd = open_temp(w, n, mode);
    if (fd >= 0) {
        (void)flock(fd, LOCK_EX | LOCK_NB); /* where locks exist: ours, it is new */
        w->slot = ebb_file_track(w->tmp);
        return fd;
    }
    int e = errno;
    free(w->tmp);
    w->tmp = NULL;
    errno = e;
    return -1;
}

ebb_status ebb_file_begin(ebb_file_out **out, const char *path, const char *who) {
    *out = NULL;
    ebb_file_out *w = calloc(1, sizeof *w);
    if (!w)
        return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", who);
    w->who = who;
    w->fd = -1;
    w->slot = -1;
    ebb_status s = resolve(&w->t, path, who);
    size_t plen = path ? strlen(path) + 1 : 1;
    if (s == EBB_OK && !(w->path = malloc(plen)))
        s = ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", who);
    if (s != EBB_OK) {
        writer_free(w);
        return s;
    }
    memcpy(w->path, path, plen);
    char vb[PATH_MAX + 32];
    if (w->t.kind == TARGET_STREAM) {
        /* O_NONBLOCK: opening a FIFO that nobody reads fails (ENXIO) instead
         * of waiting for a reader forever */
        w->in_place = 1;
        int injected = ebb_file_fault_point();
        w->fd = injected ? -1
                         : open(w->t.path, O_WRONLY | O_APPEND | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
        if (injected)
            errno = injected;
        if (w->fd < 0) {
            int e = errno;
            s = e == ENXIO && S_ISFIFO(w->t.sb.st_mode)
                    ? ebb_error_set(EBB_ERR_IO, "%s: cannot write '%s'%s: it is a FIFO that no "
                                                "process is reading",
                                    who, path, via(&w->t, path, vb, sizeof vb))
                    : ebb_error_set(EBB_ERR_IO, "%s: cannot write '%s'%s: %s", who, path,
                                    via(&w->t, path, vb, sizeof vb), strerror(e));
        } else {
            int flags = fcntl(w->fd, F_GETFL);
            if (flags >= 0)
                (void)fcntl(w->fd, F_SETFL, flags & ~O_NONBLOCK);
            /* text already printed to stdout comes first when the target is
             * stdout itself */
            fflush(stdout);
        }
    } else {
        /* never more open than the old file while the new one is written */
        mode_t mode = w->t.kind == TARGET_FILE ? (w->t.sb.st_mode & 0777) : 0666;
        remove_stale(&w->t);
        w->fd = create_temp(w, mode);
        if (w->fd < 0) {
            int e = errno;
            s = check_dir(&w->t, path, who);
            if (s == EBB_OK)
                s = ebb_error_set(EBB_ERR_IO, "%s: cannot write '%s'%s: cannot create a file "
                                              "next to it: %s",
                                  who, path, via(&w->t, path, vb, sizeof vb), strerror(e));
        } else if (w->t.kind == TARGET_FILE) {
            /* owner first: chown clears set-user-ID bits that chmod restores */
            struct stat mine;
            if (fstat(w->fd, &mine) == 0 &&
                (mine.st_uid != w->t.sb.st_uid || mine.st_gid != w->t.sb.st_gid))
                (void)!fchown(w->fd, w->t.sb.st_uid, w->t.sb.st_gid);
            (void)fchmod(w->fd, w->t.sb.st_mode & 07777);
        }
    }
    if (s == EBB_OK) {
        cookie_io_functions_t io = {.write = cookie_write, .close = cookie_close};
        w->f = fopencookie(w, "w", io);
        if (!w->f)
            s = ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", who);
    }
    if (s != EBB_OK) {
        ebb_file_abort(w);
        return s;
    }
    *out = w;
    return EBB_OK;
}

FILE *ebb_file_stream(ebb_file_out *w) { return w ? w->f : NULL; }

int ebb_file_fd(ebb_file_out *w) {
    if (!w)
        return -1;
    fflush(w->f);
    return w->fd;
}

int ebb_file_in_place(const ebb_file_out *w) { return w ? w->in_place : 0; }

void ebb_file_abort(ebb_file_out *w) {
    if (!w)
        return;
    if (w->f)
        fclose(w->f);
    if (w->fd >= 0)
        close(w->fd);
    ebb_file_untrack(w->slot);
    if (w->tmp && !w->in_place)
        unlink(w->tmp);
    writer_free(w);
}

/* After the rename: the directory entry must reach the disk too, or a crash
 * could bring back the old file, or no file where there was none. */
static int sync_dir(const char *path) {
    int injected = ebb_file_fault_point();
    if (injected)
        return injected;
    char dir[PATH_MAX];
    dir_of(path, dir, sizeof dir);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    /* a directory we may write but not read (mode 0300) cannot be opened:
     * nothing to do about it */
    if (fd < 0)
        return errno == EACCES ? 0 : errno;
    int err = fsync(fd) == 0 || errno == EINVAL ? 0 : errno; /* EINVAL: cannot be synced */
    close(fd);
    return err;
}

ebb_status ebb_file_commit(ebb_file_out *w) {
    if (!w)
        return ebb_error_set(EBB_ERR_ARG, "ebb_file_commit: no writer");
    if (fflush(w->f) != 0 && !w->err)
        w->err = errno ? errno : EIO;
    if (ferror(w->f) && !w->err)
        w->err = EIO;
    fclose(w->f);
    w->f = NULL;
    /* the data must be on disk before the name points at it, or a crash
     * could leave an empty file where the old one was */
    const char *doing = ""; /* what failed, when it was not a write */
    if (!w->err && !w->in_place) {
        int injected = ebb_file_fault_point();
        if (injected || fsync(w->fd) != 0) {
            w->err = injected ? injected : errno;
            doing = "syncing the new file to disk: ";
        }
    }
    int injected = w->in_place ? 0 : ebb_file_fault_point();
    if ((close(w->fd) != 0 || injected) && !w->err && (injected || errno != EINTR)) {
        w->err = injected ? injected : errno;
        doing = "closing the new file: ";
    }
    w->fd = -1;
    char vb[PATH_MAX + 32];
    ebb_status s = EBB_OK;
    if (w->err) {
        s = ebb_error_set(EBB_ERR_IO, "%s: cannot write '%s'%s: %s%s", w->who, w->path,
                          via(&w->t, w->path, vb, sizeof vb), doing, strerror(w->err));
    } else if (!w->in_place) {
        injected = ebb_file_fault_point();
        if (injected || rename(w->tmp, w->t.path) != 0)
            s = ebb_error_set(EBB_ERR_IO,
                              "%s: cannot write '%s'%s: renaming the new file onto it: %s", w->who,
                              w->path, via(&w->t, w->path, vb, sizeof vb),
                              strerror(injected ? injected : errno));
        else {
            ebb_file_untrack(w->slot); /* renamed: nothing to remove */
            w->slot = -1;
            free(w->tmp);
            w->tmp = NULL;
            int err = sync_dir(w->t.path);
            if (err) {
                char dir[PATH_MAX];
                dir_of(w->t.path, dir, sizeof dir);
                s = ebb_error_set(EBB_ERR_IO,
                                  "%s: wrote '%s'%s, but syncing its directory '%s' failed: %s; "
                                  "the new file is in place, but a crash now could lose it",
                                  w->who, w->path, via(&w->t, w->path, vb, sizeof vb), dir,
                                  strerror(err));
            }
        }
    }
    ebb_file_abort(w);
    return s;
}

ebb_status ebb_file_write_all(const char *path, const void *data, size_t len, const char *who) {
    ebb_file_out *w = NULL;
    ebb_status s = ebb_file_begin(&w, path, who);
    if (s != EBB_OK)
        return s;
    if (len)
        fwrite(data, 1, len, ebb_file_stream(w));
    return ebb_file_commit(w);
}
