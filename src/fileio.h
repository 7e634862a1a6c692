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
 *   target's directory, synced and renamed over the target, so a failure at
 *   any point leaves the old file as it was; the new file keeps the old one's
 *   mode (and owner, where the process may set it);
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
/* Flushes, syncs and renames the temporary file over the target. Any error
 * on the way ("WHO: cannot write 'PATH': No space left on device") leaves
 * the target as it was (except a stream target) and removes the temporary
 * file. Frees w. */
ebb_status ebb_file_commit(ebb_file_out *w);
/* Drops what was written: removes the temporary file; frees w (NULL is
 * allowed). */
void ebb_file_abort(ebb_file_out *w);

/* The whole of one buffer to `path`, through the writer. */
ebb_status ebb_file_write_all(const char *path, const void *data, size_t len, const char *who);

#ifdef __cplusplus
}
#endif
#endif /* EBB_FILEIO_H */
