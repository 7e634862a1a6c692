/* How ebb opens the files it reads and writes, so that no path can make it
 * hang, crash or clobber something that is not its file. Internal to the
 * library and the `ebb` command.
 *
 * Reading: ebb_file_open_read() refuses anything but a regular file before
 * a single blocking call (a FIFO would block open() until a writer comes).
 *
 * Writing: every file ebb writes goes through one writer:
 *
 *     ebb_file_out *w = NULL;
 *     if (ebb_file_begin(&w, path, "--trace") != EBB_OK) ... ebb_errmsg() ...
 *     fprintf(ebb_file_stream(w), ...);
 *     if (ebb_file_commit(w) != EBB_OK) ...   // commit or abort frees w
 *
 * - a regular file (or a new one) is written to a temporary file in the
 *   target's directory, TARGET.tmp.PID.XXXXXX, synced and renamed over the
 *   target, and the directory is synced after the rename, so a failure at
 *   any point leaves the old file as it was and no temporary file; the new
 *   file keeps the old one's mode (and owner, where the process may set it);
 * - a temporary of the same target left by a writer that was killed is
 *   removed when the target is next written: one whose PID is no live
 *   process's, which no process holds locked (the writer holds an flock on
 *   its temporary while it writes, which covers a writer whose PID means
 *   nothing here: another PID namespace, another machine over NFS), and
 *   which has not been modified for EBB_FILE_STALE_SECONDS. Temporaries of
 *   other names (older versions of ebb named them TARGET.tmp.XXXXXX) are
 *   left alone;
 * - a symbolic link is followed: the file it points to is replaced, the link
 *   stays;
 * - a character device (/dev/stdout, /dev/null, a terminal) or a pipe is
 *   written in place, as a stream: there is nothing to replace atomically;
 *   a FIFO that no process reads is an error, not a wait;
 * - anything else (a directory, a block device, a socket) is refused.
 */
#ifndef EBB_FILEIO_H
#define EBB_FILEIO_H

#include <stdint.h>
#include <stdio.h>

#include "ebb/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opens `path` read-only (close-on-exec) and fails unless it is a regular
 * file: "WHO: 'PATH' is a directory, not a regular file". Opening never
 * blocks. On success *fd is the descriptor (the caller closes it) and *size
 * the file's size. `who` starts every message. */
ebb_status ebb_file_open_read(int *fd, int64_t *size, const char *path, const char *who);

/* "a directory", "a FIFO", ... for a st_mode; "a regular file" for one. */
const char *ebb_file_kind_name(unsigned mode);

/* Checks, without creating anything, that ebb_file_begin(path) can start:
 * the target is a regular file, a new name, a character device or a pipe,
 * and its directory exists and accepts new files. For checking output paths
 * before a long run instead of after it. */
ebb_status ebb_file_check_writable(const char *path, const char *who);

typedef struct ebb_file_out ebb_file_out;

/* Starts writing `path` (see the file comment for what each kind of target
 * gets). On success *out is a writer to fill through its stream, then
 * commit or abort. */
ebb_status ebb_file_begin(ebb_file_out **out, const char *path, const char *who);
/* The stream to write into. Write errors are remembered and reported by
 * ebb_file_commit(), with their errno. */
FILE *ebb_file_stream(ebb_file_out *w);
/* The descriptor behind the stream, for a child process to write into (the
 * stream is flushed first). */
int ebb_file_fd(ebb_file_out *w);
/* Non-zero when the target is written in place (a device or a pipe), where a
 * failure cannot be undone. */
int ebb_file_in_place(const ebb_file_out *w);
/* Flushes, syncs and renames the temporary file over the target, then syncs
 * the directory. Any error up to the rename ("WHO: cannot write 'PATH': No
 * space left on device", "...: syncing the new file to disk: ...") leaves the
 * target as it was (except a stream target) and removes the temporary file.
 * An error syncing the directory comes after the rename: the new file is in
 * place, and the message says so and that a crash could still lose it.
 * Frees w. */
ebb_status ebb_file_commit(ebb_file_out *w);
/* Drops what was written: removes the temporary file; frees w (NULL is
 * allowed). */
void ebb_file_abort(ebb_file_out *w);

/* The whole of one buffer to `path`, through the writer. */
ebb_status ebb_file_write_all(const char *path, const void *data, size_t len, const char *who);

/* A temporary file unmodified for this long, whose writer is gone, is
 * stale (see the top of this file). */
#define EBB_FILE_STALE_SECONDS 2

/* ---- the writer's process-wide state -------------------------------------------
 * fileio.c is compiled into libebb and into the ebb command. What both copies
 * of the writer must share lives in src/fileio_state.c, in the library alone,
 * exported (EBB_API) for the command and the tests; it is not public API. */

/* Removes the temporary file of every write in flight in this process (begun,
 * neither committed nor aborted), so that a process about to die leaves none
 * behind. Async-signal-safe (lock-free atomics and unlink(2) only): call it
 * from a handler of a fatal signal before _exit(), or at exit. The writes it
 * interrupts fail at commit ("renaming the new file onto it: No such file or
 * directory") and leave their targets as they were. At most 64 writes in
 * flight at once are seen. */
EBB_API void ebb_file_remove_temporaries(void);

/* Testing (tests/test_faults.c): the n-th file operation of the writer from
 * now on (1: the next one) fails with errno `err` (0: EIO) instead of
 * running. The operations of one write of a regular file, in order: creating
 * the temporary file, each write(2), its fsync, its close, the rename, the
 * directory's fsync; of a stream target: opening it, each write(2). Only
 * that one fails; n <= 0 disarms. Either way the count below restarts. */
EBB_API void ebb_file_fail_nth(int64_t n, int err);
/* Non-zero once the failure armed by the last ebb_file_fail_nth() happened. */
EBB_API int ebb_file_fail_fired(void);
/* The writer's file operations since the last ebb_file_fail_nth(). */
EBB_API int64_t ebb_file_op_count(void);

/* For fileio.c: counts one file operation and returns the errno it is to fail
 * with, or 0 to run it. */
EBB_API int ebb_file_fault_point(void);
/* For fileio.c: registers the path of a temporary file in flight (the string
 * must live until ebb_file_untrack()); returns its slot, or -1 when all are
 * taken. */
EBB_API int ebb_file_track(char *tmp);
/* For fileio.c: unregisters slot (-1: nothing), before its path is freed. */
EBB_API void ebb_file_untrack(int slot);

#ifdef __cplusplus
}
#endif
#endif /* EBB_FILEIO_H */
